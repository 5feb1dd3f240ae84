// aotpack's int8 scheme with integer dot products: y (M, N) = x (M, K) @ W^T, W = codes * scale per row.
//
// Layout (runtime.quant.int8_dot): codes (N, K) int8 bytes, one fp32 scale per row. Rows go in tiles of
// four (quant_common.h, TILE): within a tile, each block of 32 columns holds the four rows' 32 bytes one
// after another (then K % 32 columns of each row), so a tile streams from memory in one sequential run; rows
// past the last whole tile are stored as they are. The activations are quantized per block of 32, and
//   y[m, n] = scale[n] * sum_b d[m, b] * (sum_i q[m, 32b + i] * codes[n, 32b + i])
// sums each block's 32 products in integers. AVX2 multiplies unsigned by signed bytes, so x's signs move
// onto the weights (|x| times sign(x) * w, as llama.cpp's Q8_0 dot does). Each weight block is loaded once
// for every activation row: at batch 8 the weights are read from memory once, not eight times.
#include "quant_common.h"
#include "shim_common.h"

namespace aotpack {
namespace {

// The bytes of rows n0 .. n0 + NR, block b: a whole tile's (NR = TILE) sit together, a lone row's alone.
template <int NR> inline const int8_t* block_at(const int8_t* codes, int64_t K, int64_t n0, int64_t b) {
  return NR == TILE ? codes + n0 * K + b * BLOCK * TILE : codes + n0 * K + b * BLOCK;
}

#if defined(AOTPACK_AVX2)
// One block of 32 columns into the NR accumulators. Kept free of calls: any call in the loop makes the
// compiler spill every vector register around it (they are all caller-saved), accumulators included.
template <int NR>
inline void accumulate(const __m256i* wv, const int8_t* x, float d, __m256* acc) {
  const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
  const __m256i ax = _mm256_sign_epi8(xv, xv);
  const __m256 dv = _mm256_set1_ps(d);
  for (int n = 0; n < NR; n++) {
    const __m256i p = dot_u8s8(_mm256_setzero_si256(), ax, _mm256_sign_epi8(wv[n], xv));
    acc[n] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), dv, acc[n]);
  }
}

template <int NR>
void tile(const Activations& a, const int8_t* codes, int64_t n0, int64_t m, float out[NR]) {
  const int64_t K = a.K, full = K / BLOCK;
  const int8_t* x = a.row(m);
  const float* d = a.d.data() + m * a.nb;
  __m256 acc[NR];
  for (int n = 0; n < NR; n++) acc[n] = _mm256_setzero_ps();
  for (int64_t b = 0; b < full; b++) {
    const int8_t* src = block_at<NR>(codes, K, n0, b);
    for (int line = 0; line < NR * BLOCK; line += 64)  // every cache line of the block, ahead
      _mm_prefetch(reinterpret_cast<const char*>(src) + NR * K + line, _MM_HINT_T0);
    __m256i wv[NR];
    for (int n = 0; n < NR; n++) wv[n] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + n * BLOCK));
    accumulate<NR>(wv, x + b * BLOCK, d[b], acc);
  }
  if (full < a.nb) {  // the last K % 32 columns: copied out, so nothing is read past a row
    const int64_t kept = K - full * BLOCK;
    const int8_t* src = block_at<NR>(codes, K, n0, full);
    alignas(32) int8_t tail[NR][BLOCK] = {};
    __m256i wv[NR];
    for (int n = 0; n < NR; n++) {
      std::memcpy(tail[n], src + n * kept, size_t(kept));
      wv[n] = _mm256_load_si256(reinterpret_cast<const __m256i*>(tail[n]));
    }
    accumulate<NR>(wv, x + full * BLOCK, d[full], acc);
  }
  for (int n = 0; n < NR; n++) out[n] = hsum(acc[n]);
}
#else
template <int NR>
void tile(const Activations& a, const int8_t* codes, int64_t n0, int64_t m, float out[NR]) {
  for (int n = 0; n < NR; n++) {
    float acc = 0.0f;
    for (int64_t b = 0; b < a.nb; b++) {
      const int64_t kept = std::min(BLOCK, a.K - b * BLOCK);
      const int8_t* w = block_at<NR>(codes, a.K, n0, b) + n * kept;
      const int8_t* x = a.row(m) + b * BLOCK;
      int32_t sum = 0;
      for (int64_t i = 0; i < kept; i++) sum += int32_t(x[i]) * int32_t(w[i]);
      acc += float(sum) * a.d[m * a.nb + b];
    }
    out[n] = acc;
  }
}
#endif

struct Int8 {
  const int8_t* codes;
  const float* scales;
  template <int D, int NR> void rows(const Activations& a, int64_t n0, int64_t m, int64_t N, void* y) const {
    float out[NR];
    tile<NR>(a, codes, n0, m, out);
    for (int n = 0; n < NR; n++) store_from_f32<D>(y, m * N + n0 + n, out[n] * scales[n0 + n]);
  }
};

}  // namespace

int32_t linear_int8(const void* x, int32_t dtype, int64_t M, int64_t K, int64_t ldx, const int8_t* codes,
                    const float* scales, int64_t N, void* y) {
  if (M < 0 || K < 1 || N < 0 || ldx < K) return BAD_SHAPE;
  if (M == 0 || N == 0) return OK;
  Activations& a = scratch();
  if (!quantize(x, dtype, M, K, ldx, a)) return BAD_DTYPE;
  return gemm(Int8{codes, scales}, a, dtype, N, y);
}

}  // namespace aotpack

extern "C" {

int32_t aotpack_linear_int8(const void* x, int32_t dtype, int64_t M, int64_t K, const int8_t* codes,
                            const float* scales, int64_t N, void* y) {
  return aotpack::linear_int8(x, dtype, M, K, K, codes, scales, N, y);
}

// What AOTInductor calls for aotpack::dot_linear_int8 (runtime.quant.int8_dot): no dispatcher, no boxing.
AOTITorchError aoti_torch_cpu_dot_linear_int8(AtenTensorHandle x, AtenTensorHandle codes, AtenTensorHandle scales,
                                              AtenTensorHandle* ret0) {
  aotpack::Operand xo, co, so;
  if (!aotpack::operand(x, &xo) || !aotpack::operand(codes, &co) || !aotpack::operand(scales, &so))
    return AOTI_TORCH_FAILURE;
  const int64_t N = co.rows, K = co.cols;
  if (co.dtype != aoti_torch_dtype_int8() || so.dtype != aoti_torch_dtype_float32() || xo.cols != K ||
      so.numel != N || !co.dense || !so.dense)
    return AOTI_TORCH_FAILURE;
  return aotpack::run_shim(x, xo, N, ret0, [&](void* out) {
    return aotpack::linear_int8(xo.data, xo.kind, xo.rows, K, xo.ld, static_cast<const int8_t*>(co.data),
                                static_cast<const float*>(so.data), N, out);
  });
}

}  // extern "C"
