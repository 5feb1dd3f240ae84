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
// In a build for AMX, calls of 5 to 32 activation rows into 1,024 outputs or more multiply on tiles instead
// (tiles_team), to the same bits.
#include "lanes.h"
#include "shim_common.h"

namespace aotpack {
namespace {

struct Int8 {
  const uint8_t* codes;
  const float* scales;
  int64_t K;
  static constexpr int CHAINS = 8;  // independent dot chains a pass keeps going (lanes.h, tiles_a_pass)
  static constexpr int WIDE = WIDE_MR;  // rows a pass at few rows (lanes.h, gemm_team)

  // Rows m .. m + R of the activations against the T tiles from row n0 (R <= MR): out[t * R + r], each
  // row's 16 lanes of tile t.
  template <int R, int T, bool Fetch> void pass(const Activations& a, int64_t n0, int64_t m, FloatLanes* out) const {
    const int64_t full = K / BLOCK, nb = a.nb, span = TILE * K;  // span: a tile's bytes
    const uint8_t* tiles = codes + n0 * K;
    FloatLanes acc[T * R];
    for (int i = 0; i < T * R; i++) acc[i] = zero_lanes();
    for (int64_t b = 0; b < full; b++) {
      const uint8_t* wb = tiles + b * TILE * BLOCK;
      IntLanes dots[T * R];
      for (int i = 0; i < T * R; i++) dots[i] = offset_start(a.s[(m + i % R) * nb + b]);
      // unrolled: GCC 12 kept the loop's 8 chains in other registers at each turn than at its end, and
      // copied them there (17 zmm moves and a spill a group at 8 rows; Gemma 3's int8 `lm_head` at 8 rows,
      // AMD EPYC Zen 4: 5.32 -> 5.12 ms, one row unchanged)
#pragma GCC unroll 8
      for (int g = 0; g < BLOCK / GROUP; g++) {
        for (int t = 0; t < T; t++) {
          // the next tiles' same line, ahead (a row of a few hundred bytes is too short for the hardware
          // prefetcher), one line a group: issued eight at once, they stalled on the CPU's fill buffers.
          // One pass ahead does not hide the memory's latency: the line 4 passes ahead is fetched into L2
          // too (AMD EPYC Zen 4, Gemma 3 270M int8, in the decode graph at 8 rows: `lm_head` 6.6 -> 5.6 ms,
          // the layers' calls 33 -> 29 us). At 2 and 4 rows, 4 and 2 tiles a pass, it was left out, measured
          // as gaining nothing; streamed, that `lm_head` took 6.4 / 6.9 ms there against 5.3 / 5.4 with it
          // (9 interleaved rounds; the one-tile build, AOTPACK_ONE_TILE, the same either way:
          // artifacts/bench/epyc-zen4/short/fetch.txt). AVX-512 builds only: AVX2's were not measured.
          if constexpr (Fetch) {
            if constexpr (WIDE_MR >= 8) prefetch_l2(wb + (4 * T + t) * span + g * TILE * GROUP);
            prefetch(wb + (T + t) * span + g * TILE * GROUP);
          }
          const ByteLanes w = offset_weights(byte_lanes(wb + t * span + g * TILE * GROUP));
          for (int r = 0; r < R; r++) dots[t * R + r] = dot_offset(dots[t * R + r], w, x4(a, m + r, b, g));
        }
      }
      for (int i = 0; i < T * R; i++) acc[i] = fma_int(dots[i], a.d[(m + i % R) * nb + b], acc[i]);
    }
    for (int t = 0; t < T; t++)
      for (int r = 0; r < R; r++) out[t * R + r] = finish(a, n0 + t * TILE, full, m + r, acc[t * R + r]);
  }

  // Row m's lanes of the tile from weight row n0, whose blocks before b0 summed to acc: the blocks from b0
  // (the tiles' pass leaves an odd last one), the last K % 32 columns, then the rows' scales.
  FloatLanes finish(const Activations& a, int64_t n0, int64_t b0, int64_t m, FloatLanes acc) const {
    const int64_t full = K / BLOCK, nb = a.nb;
    const uint8_t* tile = codes + n0 * K;
    for (int64_t b = b0; b < full; b++) {
      IntLanes dots = offset_start(a.s[m * nb + b]);
      for (int g = 0; g < BLOCK / GROUP; g++)
        dots = dot_offset(dots, offset_weights(byte_lanes(tile + b * TILE * BLOCK + g * TILE * GROUP)), x4(a, m, b, g));
      acc = fma_int(dots, a.d[m * nb + b], acc);
    }
    if (full < nb) {
      const int64_t kept = K - full * BLOCK;
      const uint8_t* w = tile + full * TILE * BLOCK;
      alignas(64) int32_t dots[TILE];
      for (int l = 0; l < TILE; l++) dots[l] = tail_dot(w + l * kept, a.row(m) + full * BLOCK, kept);
      acc = fma_int(int_lanes_load(dots), a.d[m * nb + full], acc);
    }
    return mul(acc, float_lanes_load(scales + n0));
  }

  // Not vectorized: for a VNNI target GCC 12 turns this loop into dpbusd and computes a wrong sum.
  AOTPACK_NO_VECTORIZE static int32_t tail_dot(const uint8_t* w, const int8_t* x, int64_t n) {
    int32_t sum = 0;
    for (int64_t i = 0; i < n; i++) sum += (int32_t(w[i]) - 128) * x[i];
    return sum;
  }

  // A row past the last whole tile, in plain C++: the same integer sums and float steps as a lane's.
  template <int D> void lone(const Activations& a, int64_t n, int64_t m, Out o) const {
    float acc = 0.0f;
    for (int64_t b = 0; b < a.nb; b++) {
      const int64_t kept = std::min(BLOCK, K - b * BLOCK);
      acc = std::fma(float(tail_dot(codes + n * K + b * BLOCK, a.row(m) + b * BLOCK, kept)), a.d[m * a.nb + b], acc);
    }
    store_from_f32<D>(o.y, o.at(m, n), acc * scales[n]);
  }
};

#if defined(AOTPACK_AMX)
// int8 on AMX tiles, in a build for a CPU that has them and a process Linux granted them. `tdpbsud`
// multiplies signed activation bytes (tile A) by the unsigned weight bytes (tile B) and sums each 4; a
// tile's two blocks side by side in the lanes layout (1 KB) are already a B tile of 16 rows of 64 bytes, 4
// columns of each of the 16 weight rows a row. A holds each activation row twice (Pairs): once with the
// first block's 32 bytes and zeros, once with zeros and the second's. So one instruction gives the exact
// integer dot products of both blocks for up to 8 activation rows and the 16 weight rows (C: row 2m the
// first block's, 2m + 1 the second's), where the VNNI path takes 16 `dpbusd` an activation row. Each
// block's sums then take the lanes' steps (the -128 offset, conversion, fma with the block's step) in the
// lanes' order, and finish() the rest, so the bits are the lanes' and the scalar path's.
// A pass takes 2 weight tiles sharing A; even pairs of blocks go to C tiles 0 and 1 (A in tile 4), odd
// ones to 2 and 3 (A in tile 5), so that one pair's products run while the last pair's sums are stored
// and taken (tiles are not renamed: with one set, each pair waited for the last one's store). Weights in
// tiles 6 and 7, fetched into L2 a pass ahead and into L1 a pair ahead (tile loads wait for their lines:
// without the prefetches Gemma 3's int8 `lm_head` read at 29 GB/s, with them 38-42). One block a product
// (tile A as the activations are, 32 bytes a row) cost 5.0 ms an 8-row `lm_head` where pairs cost 4.7.
constexpr int AMX_TILES = 2;  // weight tiles a pass
constexpr int AMX_ROWS = 8;   // activation rows a pass: two tile rows each

// The activations as tile A for each pair of blocks: rows m0 .. m0 + 8 of the call, chunk by chunk, each
// pair's 16 rows of 64 bytes (zero past the chunk's rows).
struct Pairs {
  int64_t pairs = 0;  // whole pairs of blocks in K
  std::vector<int8_t> bytes;
  const int8_t* at(int64_t m0, int64_t p) const { return bytes.data() + ((m0 / AMX_ROWS) * pairs + p) * 1024; }

  // For M rows of K columns. Each row's zero halves are never written, so they stay zero from one call to
  // the next of the same K; rows past M in the last chunk may hold an earlier call's bytes, whose products
  // land in C rows nothing reads.
  void size(int64_t M, int64_t K) {
    const size_t used = size_t((M + AMX_ROWS - 1) / AMX_ROWS * (K / BLOCK / 2) * 1024);
    if (K / BLOCK / 2 != pairs) bytes.clear();
    pairs = K / BLOCK / 2;
    if (bytes.size() < used) bytes.resize(used, 0);
  }

  void fill_share(const Activations& a) {  // from the quantized rows: a share of them each (omp for)
#pragma omp for schedule(static)
    for (int64_t m = 0; m < a.M; m++)
      for (int64_t p = 0; p < pairs; p++) {
        int8_t* rows = bytes.data() + ((m / AMX_ROWS) * pairs + p) * 1024 + (m % AMX_ROWS) * 128;
        std::memcpy(rows, a.row(m) + 2 * p * BLOCK, BLOCK);
        std::memcpy(rows + 64 + BLOCK, a.row(m) + (2 * p + 1) * BLOCK, BLOCK);
      }
  }
};

void configure_tiles(int64_t mc) {
  TileConfig cfg;
  for (int t = 0; t < 8; t++) cfg.rows[t] = uint8_t(t >= 6 ? TILE : 2 * mc), cfg.colsb[t] = 64;
  _tile_loadconfig(&cfg);
}

// Pair products into C tiles c0 (and c1 where T = 2): A from x into tile xt, the T weight tiles' pair at w
// (span bytes apart). Macros: the tile intrinsics paste their tile numbers into the instruction.
#define AOTPACK_PRODUCTS(c0, c1, xt, x, w)     \
  do {                                        \
    const uint8_t* pair_w = (w);              \
    _tile_loadd(xt, x, 64);                   \
    _tile_zero(c0);                           \
    _tile_loadd(6, pair_w, 64);               \
    _tile_dpbsud(c0, xt, 6);                  \
    if constexpr (T > 1) {                    \
      _tile_zero(c1);                         \
      _tile_loadd(7, pair_w + span, 64);      \
      _tile_dpbsud(c1, xt, 7);                \
    }                                         \
  } while (0)
#define AOTPACK_STORE(c0, c1)                                   \
  do {                                                          \
    _tile_stored(c0, sums[0], 64);                              \
    if constexpr (T > 1) _tile_stored(c1, sums[1], 64);         \
  } while (0)

// y[m0 .. m0 + mc, the T tiles from weight row n0] (tiles configured for mc <= 8 rows). `fetch`: prefetch
// the T tiles that follow.
template <int D, int T>
__attribute__((noinline)) void tiles_pass(const Int8& s, const Activations& a, const Pairs& x, int64_t n0,
                                          int64_t m0, int64_t mc, Out o, bool fetch) {
  const int64_t nb = a.nb, span = TILE * s.K, pairs = x.pairs;
  const uint8_t* tiles = s.codes + n0 * s.K;
  alignas(64) int32_t sums[AMX_TILES][2 * AMX_ROWS * TILE];  // (weight tile)(activation row, block, lane)
  FloatLanes acc[AMX_TILES * AMX_ROWS];
  for (int i = 0; i < T * mc; i++) acc[i] = zero_lanes();
  auto w = [&](int64_t p) {  // pair p's weights, fetching the next T tiles' same pair, and the next pair
    const uint8_t* wp = tiles + p * 2 * TILE * BLOCK;
    for (int t = 0; t < T; t++)
      for (int line = 0; line < 2 * TILE * BLOCK / 64; line++) {
        if (fetch) prefetch_l2(wp + (T + t) * span + line * 64);
        prefetch(wp + t * span + 2 * TILE * BLOCK + line * 64);
      }
    return wp;
  };
  auto take = [&](int64_t b) {  // blocks b, b + 1's sums (in `sums`) into the rows' float sums, in order
    for (int64_t m = 0; m < mc; m++)
      for (int j = 0; j < 2; j++) {
        const __m512i offset = _mm512_set1_epi32(minus_128_times(a.s[(m0 + m) * nb + b + j]));
        const float d = a.d[(m0 + m) * nb + b + j];
        for (int t = 0; t < T; t++) {
          const __m512i dot = _mm512_add_epi32(_mm512_load_si512(sums[t] + (2 * m + j) * TILE), offset);
          acc[t * mc + m] = fma_int(IntLanes{dot}, d, acc[t * mc + m]);
        }
      }
  };
  int64_t p = 0;
  for (; p + 1 < pairs; p += 2) {
    AOTPACK_PRODUCTS(0, 1, 4, x.at(m0, p), w(p));
    if (p > 0) {
      AOTPACK_STORE(2, 3);
      take(2 * (p - 1));
    }
    AOTPACK_PRODUCTS(2, 3, 5, x.at(m0, p + 1), w(p + 1));
    AOTPACK_STORE(0, 1);
    take(2 * p);
  }
  if (p > 0) {
    AOTPACK_STORE(2, 3);
    take(2 * (p - 1));
  }
  if (p < pairs) {
    AOTPACK_PRODUCTS(0, 1, 4, x.at(m0, p), w(p));
    AOTPACK_STORE(0, 1);
    take(2 * p);
  }
  for (int t = 0; t < T; t++)
    for (int64_t m = 0; m < mc; m++)
      store_lanes<D>(s.finish(a, n0 + t * TILE, 2 * pairs, m0 + m, acc[t * mc + m]), o.y,
                     o.at(m0 + m, n0 + t * TILE));
}
#undef AOTPACK_PRODUCTS
#undef AOTPACK_STORE

// This thread's share of the weight's N outputs (at `o`) on tiles, inside the team, `pairs` filled: an even
// share of the weight tiles, 2 at a time, each against the activation rows 8 at a time (the 2 tiles stay in
// cache while further rows pass); then the lone rows.
template <int D> void tiles_team(const Int8& s, const Activations& a, const Pairs& pairs, int64_t N, Out o) {
  const int64_t M = a.M, tiles = N / TILE;
  const auto [first, last] = my_share(tiles);
  // tiles for a whole chunk of 8 rows once M > 8 (a short last chunk's rows past M hold zeros or stale
  // bytes whose sums are not read), not reset between chunks of two sizes each pass
  const int64_t configured = std::min<int64_t>(M, AMX_ROWS);
  bool ready = false;
  for (int64_t t0 = first; t0 < last;) {
    const int64_t T = std::min<int64_t>(AMX_TILES, last - t0);
    if (!ready) configure_tiles(configured), ready = true;
    for (int64_t m0 = 0; m0 < M; m0 += AMX_ROWS) {
      const int64_t mc = std::min<int64_t>(AMX_ROWS, M - m0);
      const bool fetch = m0 == 0;
      if (T == 2) tiles_pass<D, 2>(s, a, pairs, t0 * TILE, m0, mc, o, fetch);
      else tiles_pass<D, 1>(s, a, pairs, t0 * TILE, m0, mc, o, fetch);
    }
    t0 += T;
  }
  if (ready) _tile_release();
  lone_rows<D>(s, a, tiles * TILE, N, o);
}

Pairs& pairs_scratch() {  // the calling thread's, as scratch() (the team shares it by reference)
  thread_local Pairs p;
  return p;
}
#endif

// Calls of this many activation rows go on tiles where the build and process can. Gemma 3's int8 `lm_head`
// (Intel Xeon, 2 threads), ms, VNNI path / tiles (artifacts/bench/intel/amx/int8/calls.txt): 5 rows 5.6 /
// 5.1, 8 rows 6.7 / 5.8, 16 rows 10.9 / 9.8, 32 rows 23.6 / 19.2; with the bounds widened while building
// it, 4 rows were even and 64 rows 41 / 48 (storing and taking each pair's sums cost more than the VNNI
// path's 16 `dpbusd` a row): a long prompt's prefill stays on the VNNI path. So do weights of fewer than
// 1,024 rows: a few passes a thread do not pay for setting the tiles up (8 rows, 256 x 640: 0.016 against
// 0.013 ms).
constexpr int64_t TILES_FROM_ROWS = 5, TILES_TO_ROWS = 32, TILES_FROM_N = 1024;

// Whether an int8 call of M activation rows into N outputs runs on AMX tiles in this process.
bool int8_tiles(int64_t M, int64_t N) {
#if defined(AOTPACK_AMX)
  return M >= TILES_FROM_ROWS && M <= TILES_TO_ROWS && N >= TILES_FROM_N && tiles_ready();
#else
  (void)M, (void)N;
  return false;
#endif
}

}  // namespace

// y (M, ld) = x (M, K) times each of `count` weights (codes[p], scales[p]: N[p] rows), their outputs side by
// side (ld, the sum of N): one call of a decode step's q, k and v projections, or of one weight.
int32_t linear_int8(const void* x, int32_t dtype, int64_t M, int64_t K, int64_t ldx, int64_t count,
                    const void* const* codes, const void* const* scales, const int64_t* N, void* y) {
  if (M < 0 || K < 1 || ldx < K || count < 1 || count > MAX_PARTS) return BAD_SHAPE;
  Part<Int8> vectors[MAX_PARTS], tiled[MAX_PARTS];  // the parts the VNNI path computes, those on AMX tiles
  int64_t nv = 0, nt = 0, ld = 0;
  for (int64_t p = 0; p < count; p++) {
    if (N[p] < 0) return BAD_SHAPE;
    const Int8 s{static_cast<const uint8_t*>(codes[p]), static_cast<const float*>(scales[p]), K};
    (int8_tiles(M, N[p]) ? tiled[nt++] : vectors[nv++]) = Part<Int8>{s, N[p], ld};
    ld += N[p];
  }
  if (M == 0 || ld == 0) return OK;
#if defined(AOTPACK_AMX)
  Pairs& pairs = pairs_scratch();
  if (nt) pairs.size(M, K);
#endif
  // tiled parts share one A (Pairs) that the team fills from the calling thread's activations
  return quantized_team(x, dtype, M, K, ldx, nt == 0, [&](const Activations& a, bool) {
    with_dtype(dtype, [&](auto d) {
      if (nv) gemm_team<decltype(d)::value>(vectors, nv, a, y, ld);
#if defined(AOTPACK_AMX)
      if (nt) pairs.fill_share(a);  // once, for every tiled part (its `omp for` ends when all are filled)
      for (int64_t p = 0; p < nt; p++)
        tiles_team<decltype(d)::value>(tiled[p].s, a, pairs, tiled[p].N, Out{y, ld, tiled[p].col});
#endif
    });
  });
}

}  // namespace aotpack

extern "C" {

int32_t aotpack_int8_tiles(int64_t M, int64_t N) { return aotpack::int8_tiles(M, N); }

int32_t aotpack_linear_int8(const void* x, int32_t dtype, int64_t M, int64_t K, const uint8_t* codes,
                            const float* scales, int64_t N, void* y) {
  const void *c = codes, *s = scales;
  return aotpack::linear_int8(x, dtype, M, K, K, 1, &c, &s, &N, y);
}

int32_t aotpack_linear_int8_parts(const void* x, int32_t dtype, int64_t M, int64_t K, int64_t count,
                                  const void* const* codes, const void* const* scales, const int64_t* N, void* y) {
  return aotpack::linear_int8(x, dtype, M, K, K, count, codes, scales, N, y);
}

// What AOTInductor calls for aotpack::dot_linear_int8_cat (runtime.quant.int8_dot): x times each weight
// (codes[p], scales[p]), the outputs side by side; no dispatcher, no boxing.
AOTITorchError aoti_torch_cpu_dot_linear_int8_cat(AtenTensorHandle x, const AtenTensorHandle* codes,
                                                  int64_t codes_len_, const AtenTensorHandle* scales,
                                                  int64_t scales_len_, AtenTensorHandle* ret0) {
  using namespace aotpack;
  Operand xo;
  const void* data[2][MAX_PARTS];
  int64_t N[MAX_PARTS], total = 0;
  const Rule rules[2] = {{aoti_torch_dtype_uint8(), 1}, {aoti_torch_dtype_float32(), -1}};
  if (!operand(x, &xo) || !cat_operands<2>(xo, {codes, scales}, {codes_len_, scales_len_}, rules, 1, data, N, &total))
    return AOTI_TORCH_FAILURE;
  return run_shim(x, xo, total, ret0, [&](void* out) {
    return linear_int8(xo.data, xo.kind, xo.rows, xo.cols, xo.ld, codes_len_, data[0], data[1], N, out);
  });
}

// What AOTInductor calls for aotpack::dot_linear_int8: the one weight's call of the above.
AOTITorchError aoti_torch_cpu_dot_linear_int8(AtenTensorHandle x, AtenTensorHandle codes, AtenTensorHandle scales,
                                              AtenTensorHandle* ret0) {
  return aoti_torch_cpu_dot_linear_int8_cat(x, &codes, 1, &scales, 1, ret0);
}

}  // extern "C"
