// aotpack's int5 scheme with integer dot products: y (M, N) = x (M, K) @ W^T, W = (q - 16) * scale per group
// of columns (32, 64 or 128), q in 0..31: llama.cpp's Q5_0 (symmetric, an fp16 step per group).
//
// Layout (runtime.quant.int5_dot): q's low four bits as int4's codes (int4.cpp: (N, K / 2) uint8, tiled),
// its fifth bits apart, `highs` (N, K / 8) uint8. In a tile, each block of 32 columns has 64 bytes of fifth
// bits: for each of the block's four 64-byte code loads (p = 0..3), 8 bytes for the low nibbles' vector,
// then 8 for the high nibbles', bit i of those 64 bits the fifth bit of that vector's byte i (lane i / 4,
// column 8p + i % 4, plus 4 for the high nibbles). A row past the last whole tile holds its K bits in
// column order (bit c % 8 of byte c / 8). scales (N, K / group) fp16, tiled as int4's. With the activations
// quantized per block of 32 (quant_common.h: q, step d, sum s):
//   y[m, n] = the fma chain over groups g of  S_g * scale[n, g],
//   S_g = the fma chain over blocks b of g of  (dot_b - 16 s[m, b]) * d[m, b],
//   dot_b = sum_i q[m, 32b + i] * q_w[n, 32b + i]   (exact, in integers: the block starts at -16 s).
// q_w is the unsigned operand (at most 2 * 31 * 127 a pair on AVX2's maddubs: no saturation).
#include "lanes.h"
#include "shim_common.h"

namespace aotpack {
namespace {

constexpr int64_t BLOCK_BYTES = BLOCK / 2;  // a row's block of 32 nibbles
constexpr int64_t HIGH_BYTES = BLOCK / 8;   // ...and of 32 fifth bits

struct Int5 {
  const uint8_t* codes;
  const uint8_t* highs;
  const uint16_t* scales;
  int64_t K, G, per_group;  // G groups a row, per_group blocks a group
  // Two sums a row and tile (block, group) and the result: as int4's three, two tiles at one row
  static constexpr int CHAINS = 2;
  static constexpr int WIDE = MR;

  // Block b of rows m .. m + R against the T tiles whose codes start at wb and fifth bits at hb (tiles
  // `span` and `high_span` bytes apart): dots[t * R + r], each row's 16 exact sums of tile t.
  template <int R, int T, bool Fetch>
  static void block_dots(const Activations& a, const uint8_t* wb, const uint8_t* hb, int64_t span,
                         int64_t high_span, int64_t m, int64_t b, IntLanes* dots) {
    for (int i = 0; i < T * R; i++) dots[i] = int_lanes(minus_16_times(a.s[(m + i % R) * a.nb + b]));
    for (int p = 0; p < BLOCK_BYTES / GROUP; p++) {
      for (int t = 0; t < T; t++) {
        if constexpr (Fetch) {
          prefetch(wb + (T + t) * span + p * TILE * GROUP);
          if (p == 0) prefetch(hb + (T + t) * high_span);
        }
        ByteLanes low, high;
        nibbles(wb + t * span + p * TILE * GROUP, &low, &high);
        low = fifth_bits(low, hb + t * high_span + 16 * p);
        high = fifth_bits(high, hb + t * high_span + 16 * p + 8);
        for (int r = 0; r < R; r++) {
          dots[t * R + r] = dot(dots[t * R + r], low, x4(a, m + r, b, 2 * p));
          dots[t * R + r] = dot(dots[t * R + r], high, x4(a, m + r, b, 2 * p + 1));
        }
      }
    }
  }

  // Rows m .. m + R against the T tiles from row n0: out[t * R + r], each row's 16 lanes of tile t.
  template <int R, int T, bool Fetch> void pass(const Activations& a, int64_t n0, int64_t m, FloatLanes* out) const {
    const int64_t span = TILE * K / 2, high_span = TILE * K / 8;
    const uint8_t* tiles = codes + n0 * (K / 2);
    const uint8_t* bits = highs + n0 * (K / 8);
    FloatLanes acc[T * R];
    for (int i = 0; i < T * R; i++) acc[i] = zero_lanes();
    for (int64_t g = 0; g < G; g++) {
      FloatLanes sums[T * R];
      for (int i = 0; i < T * R; i++) sums[i] = zero_lanes();
      for (int64_t b = g * per_group; b < (g + 1) * per_group; b++) {
        IntLanes dots[T * R];
        block_dots<R, T, Fetch>(a, tiles + b * TILE * BLOCK_BYTES, bits + b * TILE * HIGH_BYTES, span, high_span,
                                m, b, dots);
        for (int i = 0; i < T * R; i++) sums[i] = fma_int(dots[i], a.d[(m + i % R) * a.nb + b], sums[i]);
      }
      for (int t = 0; t < T; t++) {
        const FloatLanes scale = half_lanes(scales + (n0 + t * TILE) * G + g * TILE);
        for (int r = 0; r < R; r++) acc[t * R + r] = fma(sums[t * R + r], scale, acc[t * R + r]);
      }
    }
    for (int i = 0; i < T * R; i++) out[i] = acc[i];
  }

  // A row past the last whole tile, in plain C++: the same integer sums and float steps as a lane's.
  template <int D>
  AOTPACK_NO_VECTORIZE void lone(const Activations& a, int64_t n, int64_t m, Out o) const {
    const uint8_t* row = codes + n * (K / 2);
    const uint8_t* bits = highs + n * (K / 8);
    const int8_t* x = a.row(m);
    float acc = 0.0f;
    for (int64_t g = 0; g < G; g++) {
      float sum = 0.0f;
      for (int64_t b = g * per_group; b < (g + 1) * per_group; b++) {
        // sum (q - 16) x: the lanes' -16 s + sum q x for a block of finite values (|sum| <= 32 * 16 * 128),
        // and no overflow where a NaN made s meaningless (the row is NaN then either way)
        int32_t dot = 0;
        for (int i = 0; i < BLOCK; i++) {  // nibbles as int4.cpp's lone row; the fifth bit in column order
          const int64_t c = b * BLOCK + i;
          const uint8_t byte = row[b * BLOCK_BYTES + 4 * (i / 8) + i % 4];
          const int32_t q = ((i % 8 < 4 ? byte : byte >> 4) & 15) | (((bits[c >> 3] >> (c & 7)) & 1) << 4);
          dot += (q - 16) * x[c];
        }
        sum = std::fma(float(dot), a.d[m * a.nb + b], sum);
      }
      acc = std::fma(sum, f16_to_f32(scales[n * G + g]), acc);
    }
    store_from_f32<D>(o.y, o.at(m, n), acc);
  }
};

}  // namespace

// y (M, ld) = x (M, K) times each of `count` weights (codes[p], highs[p], scales[p]: N[p] rows, one group
// size), their outputs side by side (ld, the sum of N).
int32_t linear_int5(const void* x, int32_t dtype, int64_t M, int64_t K, int64_t ldx, int64_t count,
                    const void* const* codes, const void* const* highs, const void* const* scales, int64_t group,
                    const int64_t* N, void* y) {
  if (M < 0 || group < BLOCK || group % BLOCK || K < group || K % group || ldx < K || count < 1 || count > MAX_PARTS)
    return BAD_SHAPE;
  Part<Int5> parts[MAX_PARTS];
  int64_t ld = 0;
  for (int64_t p = 0; p < count; ld += N[p], p++) {
    if (N[p] < 0) return BAD_SHAPE;
    const Int5 s{static_cast<const uint8_t*>(codes[p]), static_cast<const uint8_t*>(highs[p]),
                 static_cast<const uint16_t*>(scales[p]), K, K / group, group / BLOCK};
    parts[p] = Part<Int5>{s, N[p], ld};
  }
  if (M == 0 || ld == 0) return OK;
  return quantized_team(x, dtype, M, K, ldx, true, [&](const Activations& a, bool) {
    with_dtype(dtype, [&](auto d) { gemm_team<decltype(d)::value>(parts, count, a, y, ld); });
  });
}

}  // namespace aotpack

extern "C" {

int32_t aotpack_linear_int5(const void* x, int32_t dtype, int64_t M, int64_t K, const uint8_t* codes,
                            const uint8_t* highs, const uint16_t* scales, int64_t group, int64_t N, void* y) {
  const void *c = codes, *h = highs, *s = scales;
  return aotpack::linear_int5(x, dtype, M, K, K, 1, &c, &h, &s, group, &N, y);
}

int32_t aotpack_linear_int5_parts(const void* x, int32_t dtype, int64_t M, int64_t K, int64_t count,
                                  const void* const* codes, const void* const* highs, const void* const* scales,
                                  int64_t group, const int64_t* N, void* y) {
  return aotpack::linear_int5(x, dtype, M, K, K, count, codes, highs, scales, group, N, y);
}

// What AOTInductor calls for aotpack::dot_linear_int5_cat (runtime.quant.int5_dot): x times each weight, the
// outputs side by side.
AOTITorchError aoti_torch_cpu_dot_linear_int5_cat(AtenTensorHandle x, const AtenTensorHandle* codes,
                                                  int64_t codes_len_, const AtenTensorHandle* highs,
                                                  int64_t highs_len_, const AtenTensorHandle* scales,
                                                  int64_t scales_len_, int64_t group_size, AtenTensorHandle* ret0) {
  using namespace aotpack;
  Operand xo;
  const void* data[3][MAX_PARTS];
  int64_t N[MAX_PARTS], total = 0;
  const int32_t u8 = aoti_torch_dtype_uint8();
  const Rule rules[3] = {{u8, 2}, {u8, 8}, {aoti_torch_dtype_float16(), 0}};
  if (!operand(x, &xo) || group_size < BLOCK || xo.cols % group_size ||
      !cat_operands<3>(xo, {codes, highs, scales}, {codes_len_, highs_len_, scales_len_}, rules, group_size, data, N,
                       &total))
    return AOTI_TORCH_FAILURE;
  return run_shim(x, xo, total, ret0, [&](void* out) {
    return linear_int5(xo.data, xo.kind, xo.rows, xo.cols, xo.ld, codes_len_, data[0], data[1], data[2], group_size,
                       N, out);
  });
}

// What AOTInductor calls for aotpack::dot_linear_int5: the one weight's call of the above.
AOTITorchError aoti_torch_cpu_dot_linear_int5(AtenTensorHandle x, AtenTensorHandle codes, AtenTensorHandle highs,
                                              AtenTensorHandle scales, int64_t group_size, AtenTensorHandle* ret0) {
  return aoti_torch_cpu_dot_linear_int5_cat(x, &codes, 1, &highs, 1, &scales, 1, group_size, ret0);
}

}  // extern "C"
