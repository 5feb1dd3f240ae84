// aotpack's int4 scheme with integer dot products: y (M, N) = x (M, K) @ W^T, W = q * scale + min per
// group of columns (32, 64 or 128), q an unsigned nibble.
//
// Layout (runtime.quant.int4_dot): rows in tiles of four (quant_common.h, TILE). codes (N, K / 2) uint8,
// a tile's rows block by block: a tile's block of 32 columns is 64 bytes, rows 0 and 1 in the low and high
// nibbles of the first 32 (byte i holds column i of both), rows 2 and 3 in the next 32, so one load and a
// mask or a shift give a row's 32 values in column order. scales and mins (N, K / group) bf16, a tile's
// group by group, the four rows' values together. A lone row past the last whole tile is stored as it is:
// 16 bytes a block (column i in the low nibble of byte i, column i + 16 in its high one, llama.cpp's Q4
// order), its scales and mins in a row.
// With the activations quantized per block of 32 (quant_common.h; block sums s):
//   y[m, n] = sum_b d[m, b] * scale[n, g(b)] * (sum_i q_x[m, 32b + i] * q[n, 32b + i])
//           + sum_g min[n, g] * U[m, g],    U[m, g] = sum_{b in g} d[m, b] * s[m, b].
// The nibbles are the unsigned operand and x the signed one: no sign trick, and no int16 pair can overflow.
#include "quant_common.h"
#include "shim_common.h"

namespace aotpack {
namespace {

struct Weights4 {
  const uint8_t* codes;
  const uint16_t* scales;
  const uint16_t* mins;
  int64_t K, G, per_group;  // G groups a row, per_group blocks a group
};

// Block b of rows n0 .. n0 + NR: a whole tile's 64 bytes, or a lone row's 16.
template <int NR> inline const uint8_t* block_at(const Weights4& w, int64_t n0, int64_t b) {
  return w.codes + n0 * (w.K / 2) + b * (NR * BLOCK / 2);
}

#if defined(AOTPACK_AVX2)
// A block's 32 values of each of the NR rows, in column order: a tile's rows two to a 32-byte load (a mask
// and a shift each), a lone row's 16 bytes split into its two halves.
template <int NR> inline void nibbles(const uint8_t* p, __m256i* wv) {
  const __m256i mask = _mm256_set1_epi8(0x0f);
  if constexpr (NR == TILE) {
    for (int pair = 0; pair < TILE / 2; pair++) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 * pair));
      wv[2 * pair] = _mm256_and_si256(v, mask);
      wv[2 * pair + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);
    }
  } else {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)), low = _mm_set1_epi8(0x0f);
    wv[0] = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), low), _mm_and_si128(v, low));
  }
}

inline __m128 bf16x4(const uint16_t* p) {  // four bf16 -> fp32
  const __m128i v = _mm_cvtepu16_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  return _mm_castsi128_ps(_mm_slli_epi32(v, 16));
}

// One group of a tile: its scales and mins for the four rows in a vector each (the mins' term for all four
// rows in one FMA), then its blocks. Groups outermost, so a block's group is a counter, not a division.
inline void tile_group(const Activations& a, const Weights4& w, int64_t n0, int64_t m, int64_t g, const float* U,
                       __m256* acc, __m128* mins) {
  alignas(16) float s[TILE];
  _mm_store_ps(s, bf16x4(w.scales + n0 * w.G + g * TILE));
  *mins = _mm_fmadd_ps(bf16x4(w.mins + n0 * w.G + g * TILE), _mm_set1_ps(U[g]), *mins);
  const int8_t* x = a.row(m);
  const float* d = a.d.data() + m * a.nb;
  for (int64_t b = g * w.per_group; b < (g + 1) * w.per_group; b++) {
    const uint8_t* src = block_at<TILE>(w, n0, b);
    _mm_prefetch(reinterpret_cast<const char*>(src) + TILE * w.K / 2, _MM_HINT_T0);
    __m256i wv[TILE];
    nibbles<TILE>(src, wv);
    const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + b * BLOCK));
    const __m256 dv = _mm256_set1_ps(d[b]);
    for (int n = 0; n < TILE; n++) {
      const __m256i p = dot_u8s8(_mm256_setzero_si256(), wv[n], xv);
      acc[n] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(p), dv), _mm256_broadcast_ss(s + n), acc[n]);
    }
  }
}

void tile(const Activations& a, const Weights4& w, const float* U, int64_t n0, int64_t m, float out[TILE]) {
  __m256 acc[TILE];
  for (int n = 0; n < TILE; n++) acc[n] = _mm256_setzero_ps();
  __m128 mins = _mm_setzero_ps();
  for (int64_t g = 0; g < w.G; g++) tile_group(a, w, n0, m, g, U, acc, &mins);
  alignas(16) float m4[TILE];
  _mm_store_ps(m4, mins);
  for (int n = 0; n < TILE; n++) out[n] = hsum(acc[n]) + m4[n];
}

float lone(const Activations& a, const Weights4& w, const float* U, int64_t n0, int64_t m) {
  const int8_t* x = a.row(m);
  const float* d = a.d.data() + m * a.nb;
  __m256 acc = _mm256_setzero_ps();
  float mins = 0.0f;
  for (int64_t g = 0; g < w.G; g++) {
    const __m256 s = _mm256_set1_ps(bf16_to_f32(w.scales[n0 * w.G + g]));
    mins = std::fma(bf16_to_f32(w.mins[n0 * w.G + g]), U[g], mins);
    for (int64_t b = g * w.per_group; b < (g + 1) * w.per_group; b++) {
      __m256i wv[1];
      nibbles<1>(block_at<1>(w, n0, b), wv);
      const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + b * BLOCK));
      const __m256i p = dot_u8s8(_mm256_setzero_si256(), wv[0], xv);
      acc = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(d[b])), s, acc);
    }
  }
  return hsum(acc) + mins;
}
#else
// Row n of rows n0 .. n0 + NR (NR = TILE: a tile), as plain C++.
template <int NR> float row(const Activations& a, const Weights4& w, const float* U, int64_t n0, int n, int64_t m) {
  const int8_t* x = a.row(m);
  float acc = 0.0f, mins = 0.0f;
  for (int64_t g = 0; g < w.G; g++) {
    const int64_t at = NR == TILE ? n0 * w.G + g * TILE + n : n0 * w.G + g;  // this row's scale and min
    mins = std::fma(bf16_to_f32(w.mins[at]), U[g], mins);
    for (int64_t b = g * w.per_group; b < (g + 1) * w.per_group; b++) {
      const uint8_t* q = block_at<NR>(w, n0, b);
      int32_t sum = 0;
      for (int i = 0; i < BLOCK; i++) {
        const int value = NR == TILE ? (q[32 * (n / 2) + i] >> (4 * (n % 2))) & 15 : (q[i % 16] >> (4 * (i / 16))) & 15;
        sum += int32_t(x[b * BLOCK + i]) * value;
      }
      acc += float(sum) * a.d[m * a.nb + b] * bf16_to_f32(w.scales[at]);
    }
  }
  return acc + mins;
}

void tile(const Activations& a, const Weights4& w, const float* U, int64_t n0, int64_t m, float out[TILE]) {
  for (int n = 0; n < TILE; n++) out[n] = row<TILE>(a, w, U, n0, n, m);
}

float lone(const Activations& a, const Weights4& w, const float* U, int64_t n0, int64_t m) {
  return row<1>(a, w, U, n0, 0, m);
}
#endif

struct Int4 {
  Weights4 w;
  const float* U;  // (M, G): each group's sum of d * s, the min term's activation side

  template <int D, int NR> void rows(const Activations& a, int64_t n0, int64_t m, int64_t N, void* y) const {
    if constexpr (NR == TILE) {
      float out[TILE];
      tile(a, w, U + m * w.G, n0, m, out);
      for (int n = 0; n < TILE; n++) store_from_f32<D>(y, m * N + n0 + n, out[n]);
    } else {
      store_from_f32<D>(y, m * N + n0, lone(a, w, U + m * w.G, n0, m));
    }
  }
};

}  // namespace

int32_t linear_int4(const void* x, int32_t dtype, int64_t M, int64_t K, int64_t ldx, const uint8_t* codes,
                    const uint16_t* scales, const uint16_t* mins, int64_t group, int64_t N, void* y) {
  if (M < 0 || N < 0 || group < BLOCK || group % BLOCK || K < group || K % group || ldx < K) return BAD_SHAPE;
  if (M == 0 || N == 0) return OK;
  Activations& a = scratch();
  if (!quantize(x, dtype, M, K, ldx, a)) return BAD_DTYPE;
  const Weights4 w{codes, scales, mins, K, K / group, group / BLOCK};
  thread_local std::vector<float> U;  // (M, G)
  U.assign(size_t(M * w.G), 0.0f);
  for (int64_t m = 0; m < M; m++)
    for (int64_t b = 0; b < a.nb; b++) U[size_t(m * w.G + b / w.per_group)] += a.d[m * a.nb + b] * float(a.s[m * a.nb + b]);
  return gemm(Int4{w, U.data()}, a, dtype, N, y);
}

}  // namespace aotpack

extern "C" {

int32_t aotpack_linear_int4(const void* x, int32_t dtype, int64_t M, int64_t K, const uint8_t* codes,
                            const uint16_t* scales, const uint16_t* mins, int64_t group, int64_t N, void* y) {
  return aotpack::linear_int4(x, dtype, M, K, K, codes, scales, mins, group, N, y);
}

// What AOTInductor calls for aotpack::dot_linear_int4 (runtime.quant.int4_dot).
AOTITorchError aoti_torch_cpu_dot_linear_int4(AtenTensorHandle x, AtenTensorHandle codes, AtenTensorHandle scales,
                                              AtenTensorHandle mins, int64_t group_size, AtenTensorHandle* ret0) {
  aotpack::Operand xo, co, so, mo;
  if (!aotpack::operand(x, &xo) || !aotpack::operand(codes, &co) || !aotpack::operand(scales, &so) ||
      !aotpack::operand(mins, &mo))
    return AOTI_TORCH_FAILURE;
  const int64_t N = co.rows, K = 2 * co.cols;
  if (group_size < aotpack::BLOCK || K % group_size) return AOTI_TORCH_FAILURE;
  const int64_t G = K / group_size;
  const int32_t bf16 = aoti_torch_dtype_bfloat16();
  if (co.dtype != aoti_torch_dtype_uint8() || so.dtype != bf16 || mo.dtype != bf16 || xo.cols != K ||
      so.rows != N || so.cols != G || mo.rows != N || mo.cols != G || !co.dense || !so.dense || !mo.dense)
    return AOTI_TORCH_FAILURE;
  return aotpack::run_shim(x, xo, N, ret0, [&](void* out) {
    return aotpack::linear_int4(xo.data, xo.kind, xo.rows, K, xo.ld, static_cast<const uint8_t*>(co.data),
                                static_cast<const uint16_t*>(so.data), static_cast<const uint16_t*>(mo.data),
                                group_size, N, out);
  });
}

}  // extern "C"
