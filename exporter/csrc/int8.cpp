// aotpack's int8 scheme with integer dot products: y (M, N) = x (M, K) @ W^T, W = codes * scale per row.
//
// Layout (runtime.quant.int8_dot, runtime.quant.tiles): codes (N, K) uint8, each weight plus 128, one fp32
// scale per row. Rows go in tiles of 16 (quant_common.h, TILE), one row to a vector lane: within a tile,
// each block of 32 columns holds 8 groups of 4 columns, and a group holds the 16 rows' 4 bytes one after
// another (64 bytes: one vector). The last K % 32 columns of a tile follow row by row; rows past the last
// whole tile are stored as they are. The activations are quantized per block of 32 (q, step d, sum s), and
//   y[m, n] = scale[n] * (the fma chain over blocks b of  dot_b * d[m, b]),
//   dot_b = sum_i q[m, 32b + i] * w[n, 32b + i]   (exact, in integers),
// where VNNI's dpbusd multiplies the stored unsigned bytes with x's 4 signed bytes of a group, broadcast to
// every lane, and the block starts at -128 * s[m, b] to take the offset back out (lanes.h). One vector of a
// weight group serves MR activation rows; each block costs one conversion and one fma per 16 rows.
#include "lanes.h"
#include "shim_common.h"

namespace aotpack {
namespace {

struct Int8 {
  const uint8_t* codes;
  const float* scales;
  int64_t K;
  static constexpr int CHAINS = 8;  // independent dot chains a pass keeps going (lanes.h, tiles_a_pass)
  static constexpr int WIDE = WIDE_MR;  // rows a pass at few rows (lanes.h, gemm_as)

  // Rows m .. m + R of the activations against the T tiles from row n0 (R <= MR): out[t * R + r], each
  // row's 16 lanes of tile t.
  template <int R, int T> void pass(const Activations& a, int64_t n0, int64_t m, bool fetch, FloatLanes* out) const {
    const int64_t full = K / BLOCK, nb = a.nb, span = TILE * K;  // span: a tile's bytes
    const uint8_t* tiles = codes + n0 * K;
    FloatLanes acc[T * R];
    for (int i = 0; i < T * R; i++) acc[i] = zero_lanes();
    for (int64_t b = 0; b < full; b++) {
      const uint8_t* wb = tiles + b * TILE * BLOCK;
      IntLanes dots[T * R];
      for (int i = 0; i < T * R; i++) dots[i] = offset_start(a.s[(m + i % R) * nb + b]);
      for (int g = 0; g < BLOCK / GROUP; g++) {
        for (int t = 0; t < T; t++) {
          // the next tiles' same line, ahead (a row of a few hundred bytes is too short for the hardware
          // prefetcher), one line a group: issued eight at once, they stalled on the CPU's fill buffers
          if (fetch) prefetch(wb + (T + t) * span + g * TILE * GROUP);
          const ByteLanes w = offset_weights(byte_lanes(wb + t * span + g * TILE * GROUP));
          for (int r = 0; r < R; r++) dots[t * R + r] = dot_offset(dots[t * R + r], w, x4(a, m + r, b, g));
        }
      }
      for (int i = 0; i < T * R; i++) acc[i] = fma_int(dots[i], a.d[(m + i % R) * nb + b], acc[i]);
    }
    if (full < nb) {  // the last K % 32 columns, row by row after the blocks
      const int64_t kept = K - full * BLOCK;
      for (int t = 0; t < T; t++) {
        const uint8_t* w = tiles + t * span + full * TILE * BLOCK;
        for (int r = 0; r < R; r++) {
          alignas(64) int32_t dots[TILE];
          for (int l = 0; l < TILE; l++) dots[l] = tail_dot(w + l * kept, a.row(m + r) + full * BLOCK, kept);
          acc[t * R + r] = fma_int(int_lanes_load(dots), a.d[(m + r) * nb + full], acc[t * R + r]);
        }
      }
    }
    for (int t = 0; t < T; t++) {
      const FloatLanes scale = float_lanes_load(scales + n0 + t * TILE);
      for (int r = 0; r < R; r++) out[t * R + r] = mul(acc[t * R + r], scale);
    }
  }

  // Not vectorized: for a VNNI target GCC 12 turns this loop into dpbusd and computes a wrong sum.
  AOTPACK_NO_VECTORIZE static int32_t tail_dot(const uint8_t* w, const int8_t* x, int64_t n) {
    int32_t sum = 0;
    for (int64_t i = 0; i < n; i++) sum += (int32_t(w[i]) - 128) * x[i];
    return sum;
  }

  // A row past the last whole tile, in plain C++: the same integer sums and float steps as a lane's.
  template <int D> void lone(const Activations& a, int64_t n, int64_t m, int64_t N, void* y) const {
    float acc = 0.0f;
    for (int64_t b = 0; b < a.nb; b++) {
      const int64_t kept = std::min(BLOCK, K - b * BLOCK);
      acc = std::fma(float(tail_dot(codes + n * K + b * BLOCK, a.row(m) + b * BLOCK, kept)), a.d[m * a.nb + b], acc);
    }
    store_from_f32<D>(y, m * N + n, acc * scales[n]);
  }
};

}  // namespace

int32_t linear_int8(const void* x, int32_t dtype, int64_t M, int64_t K, int64_t ldx, const uint8_t* codes,
                    const float* scales, int64_t N, void* y) {
  if (M < 0 || K < 1 || N < 0 || ldx < K) return BAD_SHAPE;
  if (M == 0 || N == 0) return OK;
  Activations& a = scratch();
  if (!quantize(x, dtype, M, K, ldx, a)) return BAD_DTYPE;
  return gemm(Int8{codes, scales, K}, a, dtype, N, y);
}

}  // namespace aotpack

extern "C" {

int32_t aotpack_linear_int8(const void* x, int32_t dtype, int64_t M, int64_t K, const uint8_t* codes,
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
  if (co.dtype != aoti_torch_dtype_uint8() || so.dtype != aoti_torch_dtype_float32() || xo.cols != K ||
      so.numel != N || !co.dense || !so.dense)
    return AOTI_TORCH_FAILURE;
  return aotpack::run_shim(x, xo, N, ret0, [&](void* out) {
    return aotpack::linear_int8(xo.data, xo.kind, xo.rows, K, xo.ld, static_cast<const uint8_t*>(co.data),
                                static_cast<const float*>(so.data), N, out);
  });
}

}  // extern "C"
