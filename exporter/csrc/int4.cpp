// aotpack's int4 scheme with integer dot products: y (M, N) = x (M, K) @ W^T, W = q * scale + min per
// group of columns (32, 64 or 128), q an unsigned nibble.
//
// Layout (runtime.quant.int4_dot, runtime.quant.tiles): codes (N, K / 2) uint8. Each row's block of 32
// columns is 16 bytes, byte 4p + j holding column 8p + j in its low nibble and column 8p + 4 + j in its
// high one (p = 0..3, j = 0..3). Rows go in tiles of 16 (quant_common.h, TILE), one row to a vector lane:
// within a tile, each block's bytes go 4 at a time, the 16 rows' 4 bytes one after another, so one 64-byte
// load and a mask or a shift give two groups of 4 columns for all 16 rows. scales and mins (N, K / group)
// bf16, a tile's group by group, its 16 rows' values together. Rows past the last whole tile are stored
// as they are. With the activations quantized per block of 32 (quant_common.h: q, step d, sum s):
//   y[m, n] = the fma chain over groups g of  S_g * scale[n, g]  and then  min[n, g] * U[m, g],
//   S_g = the fma chain over blocks b of g of  dot_b * d[m, b],   dot_b = sum_i q[m, 32b + i] * q_w[n, 32b + i]
//   (exact, in integers),   U[m, g] = sum_{b in g} d[m, b] * s[m, b].
// The nibbles are the unsigned operand and x the signed one (no offset, and no int16 pair can overflow).
#include "lanes.h"
#include "shim_common.h"

namespace aotpack {
namespace {

constexpr int64_t BLOCK_BYTES = BLOCK / 2;  // a row's block of 32 nibbles

struct Int4 {
  const uint8_t* codes;
  const uint16_t* scales;
  const uint16_t* mins;
  int64_t K, G, per_group;  // G groups a row, per_group blocks a group
  const float* U;           // (M, G): each group's sum of d * s, the min term's activation side
  // Dot chains a pass keeps going (lanes.h, tiles_a_pass): a pass holds three sums a row and tile (block,
  // group, row), so more tiles at once spilled registers; two tiles at one row measured best.
  static constexpr int CHAINS = 2;
  static constexpr int WIDE = MR;  // its three sums a row and tile spill at WIDE_MR rows a pass

  // Block b of rows m .. m + R against the T tiles whose block starts at wb, `span` bytes apart: dots[t * R
  // + r], each row's 16 exact sums of tile t. With `Fetch`, the next T tiles' same block is prefetched, a
  // line a step (int8.cpp says why).
  template <int R, int T, bool Fetch>
  static void block_dots(const Activations& a, const uint8_t* wb, int64_t span, int64_t m, int64_t b,
                         IntLanes* dots) {
    for (int i = 0; i < T * R; i++) dots[i] = int_lanes(0);
    for (int p = 0; p < BLOCK_BYTES / GROUP; p++) {
      for (int t = 0; t < T; t++) {
        if constexpr (Fetch) prefetch(wb + (T + t) * span + p * TILE * GROUP);
        ByteLanes low, high;
        nibbles(wb + t * span + p * TILE * GROUP, &low, &high);
        for (int r = 0; r < R; r++) {
          dots[t * R + r] = dot(dots[t * R + r], low, x4(a, m + r, b, 2 * p));
          dots[t * R + r] = dot(dots[t * R + r], high, x4(a, m + r, b, 2 * p + 1));
        }
      }
    }
  }

  // Rows m .. m + R against the T tiles from row n0: out[t * R + r], each row's 16 lanes of tile t.
  template <int R, int T, bool Fetch> void pass(const Activations& a, int64_t n0, int64_t m, FloatLanes* out) const {
    const int64_t span = TILE * K / 2;
    const uint8_t* tiles = codes + n0 * (K / 2);
    FloatLanes acc[T * R];
    for (int i = 0; i < T * R; i++) acc[i] = zero_lanes();
    for (int64_t g = 0; g < G; g++) {
      FloatLanes sums[T * R];
      for (int i = 0; i < T * R; i++) sums[i] = zero_lanes();
      for (int64_t b = g * per_group; b < (g + 1) * per_group; b++) {
        IntLanes dots[T * R];
        block_dots<R, T, Fetch>(a, tiles + b * TILE * BLOCK_BYTES, span, m, b, dots);
        for (int i = 0; i < T * R; i++) sums[i] = fma_int(dots[i], a.d[(m + i % R) * a.nb + b], sums[i]);
      }
      for (int t = 0; t < T; t++) {
        const int64_t at = (n0 + t * TILE) * G + g * TILE;
        const FloatLanes scale = bf16_lanes(scales + at), least = bf16_lanes(mins + at);
        for (int r = 0; r < R; r++) acc[t * R + r] = fma(least, U[(m + r) * G + g], fma(sums[t * R + r], scale, acc[t * R + r]));
      }
    }
    for (int i = 0; i < T * R; i++) out[i] = acc[i];
  }

  // A row past the last whole tile, in plain C++: the same integer sums and float steps as a lane's.
  template <int D>
  AOTPACK_NO_VECTORIZE void lone(const Activations& a, int64_t n, int64_t m, Out o) const {
    const uint8_t* row = codes + n * (K / 2);
    const int8_t* x = a.row(m);
    float acc = 0.0f;
    for (int64_t g = 0; g < G; g++) {
      float sum = 0.0f;
      for (int64_t b = g * per_group; b < (g + 1) * per_group; b++) {
        int32_t dot = 0;
        for (int i = 0; i < BLOCK; i++) {  // column i: byte 4 (i / 8) + i % 4, the high nibble when i % 8 >= 4
          const uint8_t byte = row[b * BLOCK_BYTES + 4 * (i / 8) + i % 4];
          dot += int32_t((i % 8 < 4 ? byte : byte >> 4) & 15) * x[b * BLOCK + i];
        }
        sum = std::fma(float(dot), a.d[m * a.nb + b], sum);
      }
      acc = std::fma(sum, bf16_to_f32(scales[n * G + g]), acc);
      acc = std::fma(bf16_to_f32(mins[n * G + g]), U[m * G + g], acc);
    }
    store_from_f32<D>(o.y, o.at(m, n), acc);
  }
};

}  // namespace

// y (M, ld) = x (M, K) times each of `count` weights (codes[p], scales[p], mins[p]: N[p] rows, one group size),
// their outputs side by side (ld, the sum of N).
int32_t linear_int4(const void* x, int32_t dtype, int64_t M, int64_t K, int64_t ldx, int64_t count,
                    const void* const* codes, const void* const* scales, const void* const* mins, int64_t group,
                    const int64_t* N, void* y) {
  if (M < 0 || group < BLOCK || group % BLOCK || K < group || K % group || ldx < K || count < 1 || count > MAX_PARTS)
    return BAD_SHAPE;
  const int64_t G = K / group, per_group = group / BLOCK;
  // (M, G) group sums: the calling thread's, which the team shares when it shares the activations, or each
  // thread's own beside its own activations (lanes.h, quantized_team)
  thread_local std::vector<float> U;
  U.assign(size_t(M * G), 0.0f);
  float* const shared = U.data();
  Part<Int4> parts[MAX_PARTS];
  int64_t ld = 0;
  for (int64_t p = 0; p < count; ld += N[p], p++) {
    if (N[p] < 0) return BAD_SHAPE;
    const Int4 s{static_cast<const uint8_t*>(codes[p]), static_cast<const uint16_t*>(scales[p]),
                 static_cast<const uint16_t*>(mins[p]), K, G, per_group, nullptr};  // U: the team's below
    parts[p] = Part<Int4>{s, N[p], ld};
  }
  if (M == 0 || ld == 0) return OK;
  return quantized_team(x, dtype, M, K, ldx, true, [&](const Activations& a, bool own) {
    if (own) U.assign(size_t(M * G), 0.0f);  // this thread's U
    float* const u = own ? U.data() : shared;
    each_row(M, own, [&](int64_t m) {
      for (int64_t b = 0; b < a.nb; b++) u[m * G + b / per_group] += a.d[m * a.nb + b] * float(a.s[m * a.nb + b]);
    });
    Part<Int4> mine[MAX_PARTS];
    for (int64_t p = 0; p < count; p++) mine[p] = parts[p], mine[p].s.U = u;
    with_dtype(dtype, [&](auto d) { gemm_team<decltype(d)::value>(mine, count, a, y, ld); });
  });
}

}  // namespace aotpack

extern "C" {

int32_t aotpack_linear_int4(const void* x, int32_t dtype, int64_t M, int64_t K, const uint8_t* codes,
                            const uint16_t* scales, const uint16_t* mins, int64_t group, int64_t N, void* y) {
  const void *c = codes, *s = scales, *m = mins;
  return aotpack::linear_int4(x, dtype, M, K, K, 1, &c, &s, &m, group, &N, y);
}

int32_t aotpack_linear_int4_parts(const void* x, int32_t dtype, int64_t M, int64_t K, int64_t count,
                                  const void* const* codes, const void* const* scales, const void* const* mins,
                                  int64_t group, const int64_t* N, void* y) {
  return aotpack::linear_int4(x, dtype, M, K, K, count, codes, scales, mins, group, N, y);
}

// What AOTInductor calls for aotpack::dot_linear_int4_cat (runtime.quant.int4_dot): x times each weight, the
// outputs side by side.
AOTITorchError aoti_torch_cpu_dot_linear_int4_cat(AtenTensorHandle x, const AtenTensorHandle* codes,
                                                  int64_t codes_len_, const AtenTensorHandle* scales,
                                                  int64_t scales_len_, const AtenTensorHandle* mins,
                                                  int64_t mins_len_, int64_t group_size, AtenTensorHandle* ret0) {
  using namespace aotpack;
  Operand xo;
  const void* data[3][MAX_PARTS];
  int64_t N[MAX_PARTS], total = 0;
  const int32_t bf16 = aoti_torch_dtype_bfloat16();
  const Rule rules[3] = {{aoti_torch_dtype_uint8(), 2}, {bf16, 0}, {bf16, 0}};
  if (!operand(x, &xo) || group_size < BLOCK || xo.cols % group_size ||
      !cat_operands<3>(xo, {codes, scales, mins}, {codes_len_, scales_len_, mins_len_}, rules, group_size, data, N,
                       &total))
    return AOTI_TORCH_FAILURE;
  return run_shim(x, xo, total, ret0, [&](void* out) {
    return linear_int4(xo.data, xo.kind, xo.rows, xo.cols, xo.ld, codes_len_, data[0], data[1], data[2], group_size,
                       N, out);
  });
}

// What AOTInductor calls for aotpack::dot_linear_int4: the one weight's call of the above.
AOTITorchError aoti_torch_cpu_dot_linear_int4(AtenTensorHandle x, AtenTensorHandle codes, AtenTensorHandle scales,
                                              AtenTensorHandle mins, int64_t group_size, AtenTensorHandle* ret0) {
  return aoti_torch_cpu_dot_linear_int4_cat(x, &codes, 1, &scales, 1, &mins, 1, group_size, ret0);
}

}  // extern "C"
