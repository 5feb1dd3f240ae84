// aotpack's float GEMM for small batches: y (M, N) = x (M, K) @ W^T, W (N, K) fp32, bf16 or fp16 as the
// checkpoint stores it (no repacked copy: the eager prefill reads the same tensor through torch).
//
// The decode step multiplies a few activation rows (1-8, or 5-40 in a verify graph) into every weight, so
// the weights must stream from memory once whatever M is, and each loaded, converted weight vector must
// feed several rows. Inductor's fused reductions did that for 1 row but spilled at 8 (a Gemma 3 step over
// 8 rows cost 1.6-1.9x one row), and ATen's mm at small M runs a GEMV per row in bf16 and was 3x slower
// at M = 2 than at M = 1 in fp32. Here a micro-tile of NR = 3 weight rows and MR = 4 activation rows
// (8 where AVX512VL gives 32 vector registers) keeps 12 (24) accumulators (vectors of 8 lanes along K) in
// registers: per 8 columns, 3 weight loads and 4 (8) activation loads feed 12 (24) FMAs. With AVX-512's
// 512-bit FMAs two activation rows share a vector (micro2): 12 FMAs for 8 rows. A tile's weight rows are
// read from memory for the first group of activation rows and from cache for the others.
// Threads split the weight rows; in a decode step's calls a micro-tile's rows come from NR runs read side
// by side (Rows). A step's worth of Gemma 3 270M's linears (AMD EPYC, AVX-512, 2 threads), ms: at 8 rows
// fp32 64 (4 adjacent rows a micro-tile), 58 (8 rows), 42 (8 rows, runs); bf16 52, 33, 29; at one row
// fp32 44 -> 25 and bf16 26 -> 13 with runs (50 GB/s, as Inductor's fused reduction reads). On an AMD
// EPYC Zen 5 (two 512-bit FMA pipes) two rows a 512-bit vector took the 8-row fp32 `lm_head` from 25-31 to
// 16-23 ms, and at 40 rows bf16 from 113-119 to 97 ms.
//
// Each output's sum runs in one order whatever M, the tile or the thread (8 lanes over K in steps of 8,
// the lanes summed by hsum, then the K % 8 tail in order), so a row's result does not depend on the batch.
//
// The same file holds the `tiles` lowering (linear_tiles): bf16 against bf16 on AMX tiles, in a build for
// a CPU that has them (AOTPACK_AMX); see gemm_bf16_amx. And the `dpbf16` lowering (linear_dpbf16): bf16
// against bf16 with AVX512-BF16's `vdpbf16ps`, in a 512-bit build for a CPU that has it; see micro_dpbf16.
#include "quant_common.h"
#include "shim_common.h"

#include <omp.h>

#include <sys/syscall.h>
#include <unistd.h>

#include <climits>
#include <type_traits>
#include <utility>

namespace aotpack {
namespace {

constexpr int NR = 3;  // weight rows per micro-tile
// activation rows per micro-tile: NR x MR accumulators, NR weight vectors and one activation vector fill
// AVX2's 16 registers at 4 rows and AVX-512's 32 (ymm16-31, with AVX512VL) at 8
#if defined(__AVX512VL__)
constexpr int MR = 8;
#else
constexpr int MR = 4;
#endif
// two activation rows a 512-bit vector (micro2): AVX-512 with DQ's 256-bit halves. Its micro-tile takes up
// to PAIR_ROWS rows: 8 pairs' 24 accumulators, 3 weight vectors and one activation vector in 32 registers.
// bf16 and fp16 weights take all 16 (converted in the tile once for 16 rows, not into a buffer read by two
// passes of 8: Gemma 3 270M's linears at 16 rows 41 -> 30 ms on the Zen 5 EPYC); fp32 weights take 8 (16
// were 5-7 % slower there).
#if defined(AOTPACK_AVX2) && defined(__AVX512F__) && defined(__AVX512DQ__) && defined(__AVX512VL__)
#define AOTPACK_PAIRS 1
constexpr int PAIR_ROWS = 16;
#else
constexpr int PAIR_ROWS = 0;
#endif
template <int W> constexpr int64_t pair_rows() { return W == F32 ? MR : PAIR_ROWS; }
constexpr int OUT_ROWS = MR > PAIR_ROWS ? MR : PAIR_ROWS;  // a micro-tile's outputs, either path

template <int W> inline float weight_at(const void* w, int64_t i) { return load_as_f32<W>(w, i); }

// A micro-tile's C weight rows: first, first + apart, first + 2 * apart, ... A thread cuts its share of
// the rows into NR runs and a micro-tile takes the same row of each run, so that each run is read front to
// back: NR long sequential streams, which the hardware prefetcher follows. Adjacent rows (apart = 1) made
// a stream of 3 rows' lengths (7.5 KB at K = 640) that jumped every 2.5 KB, and fp32 read at ~25 GB/s
// where one row at a time read ~47 (Gemma 3's `lm_head`, AMD EPYC, 2 threads). Calls of more than
// RUNS_UP_TO activation rows (verify graphs, prefill) take adjacent rows: they are bound by arithmetic,
// and a micro-tile's outputs then share cache lines (at 40 rows the `lm_head` took 105 ms in runs, 87
// adjacent).
constexpr int64_t RUNS_UP_TO = 16;
struct Rows {
  int64_t first, apart;
  int64_t at(int c) const { return first + c * apart; }
  Rows next(int C) const { return {first + (apart == 1 ? C : 1), apart}; }  // the micro-tile after this one
};

// Rows a pass of `passes` (and tile()'s threshold for converting into a buffer first).
template <int W> int64_t rows_a_pass(const float* pairs) { return pairs != nullptr ? pair_rows<W>() : MR; }

// s, the sum of a row's first `body` products, plus the K % 8 tail's in order: every path ends a sum so.
template <int W>
inline float with_tail(float s, const float* xr, const void* w, int64_t row, int64_t body, int64_t K) {
  for (int64_t k = body; k < K; k++) s += xr[k] * weight_at<W>(w, row + k);
  return s;
}

#if defined(AOTPACK_AVX2)
template <int W> inline __m256 load8(const void* w, int64_t i) {
  if constexpr (W == F32) return _mm256_loadu_ps(static_cast<const float*>(w) + i);
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(w) + i));
  if constexpr (W == BF16) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  else return _mm256_cvtph_ps(h);
}

// A pass's share of fetching the next micro-tile's C rows (same columns; the tiles_ahead-th one's where
// that is more than 1) while it computes this one's: `phase` of `phases` (>= 1; 0 phases: no prefetching),
// every phases-th cache line from line `phase`, so the passes over a tile spread the next one's fetches
// evenly. at(k) as the pass reaches column k.
// `L2`: fetch into L2 only (_MM_HINT_T1), for passes of L2_ROWS activation rows or more. Fetched into L1,
// the next tile's lines crowded out the pass's own while a pass of several rows worked through them:
// Gemma 3 270M's fp32 linears (lm_head and 18 layers) at 8 rows took 42.4-44.2 ms fetching into L1 and
// 33.2-33.7 into L2, at 4 rows 38.3-40.3 and 33.3-34.4, at 3 rows 36.4 and 33.3; at 1 and 2 rows, whose
// passes leave each line soon after reading it, L2 was 1-5 % slower (AMD EPYC Zen 4, 2 threads, weights
// held as a bundle's, interleaved; artifacts/bench/epyc-zen4/held/fetch.txt: the pairs path, micro2; the
// AVX2 path's passes, micro, follow it unmeasured). bf16 weights through the FMA path (half the lines)
// were alike; through `dpbf16` at 8 rows 21.2-21.3 -> 19.7-19.8 ms, at 4 rows 18.0-18.3 -> 17.0-17.4.
constexpr int L2_ROWS = 3;
template <int W, int C, bool L2 = false> struct Prefetch {
  static constexpr int64_t SIZE = W == F32 ? 4 : 2, LINE = 64 / SIZE;  // elements per cache line
  const char* base;
  Rows ahead;
  int64_t K, phases, fetch;  // fetch: the next column whose line this pass fetches
  Prefetch(const void* w, Rows n, int64_t K, int64_t phase, int64_t phases, int tiles_ahead = 1)
      : base(static_cast<const char*>(w)), ahead(n.next(C)), K(K), phases(phases),
        fetch(phases ? phase * LINE : INT64_MAX) {
    for (int t = 1; t < tiles_ahead; t++) ahead = ahead.next(C);
  }
  void at(int64_t k) {
    if (k != fetch) return;
    for (int c = 0; c < C; c++)  // never faults
      _mm_prefetch(base + (ahead.at(c) * K + k) * SIZE, L2 ? _MM_HINT_T1 : _MM_HINT_T0);
    fetch += phases * LINE;
  }
};

// y[m0 .. m0 + R, those C columns] for R <= MR activation rows (fp32, ldx apart) and C <= NR weight rows,
// prefetching a share of the next micro-tile (Prefetch).
template <int W, int R, int C>
inline void micro(const float* x, int64_t ldx, const void* w, int64_t K, Rows n, float out[OUT_ROWS][NR],
                  int64_t phase, int64_t phases) {
  Prefetch<W, C, (R >= L2_ROWS)> prefetch(w, n, K, phase, phases);
  __m256 acc[R][C];
  for (int r = 0; r < R; r++)
    for (int c = 0; c < C; c++) acc[r][c] = _mm256_setzero_ps();
  const int64_t body = K / 8 * 8;
  for (int64_t k = 0; k < body; k += 8) {
    prefetch.at(k);
    __m256 wv[C];
    for (int c = 0; c < C; c++) wv[c] = load8<W>(w, n.at(c) * K + k);
    for (int r = 0; r < R; r++) {
      __m256 xv = _mm256_loadu_ps(x + r * ldx + k);
      // Kept in a register for its C uses: GCC otherwise folds the load into each FMA, and with 2 loads a
      // cycle those loads bounded the loop (a verify graph's 40 rows: 108 ms of GEMVs, 84 ms kept).
      asm("" : "+x"(xv));
      for (int c = 0; c < C; c++) acc[r][c] = _mm256_fmadd_ps(xv, wv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < R; r++)
    for (int c = 0; c < C; c++) out[r][c] = with_tail<W>(hsum(acc[r][c]), x + r * ldx, w, n.at(c) * K, body, K);
}

#if defined(AOTPACK_PAIRS)
// 8 weights in both halves of a 512-bit vector: the same vector as load8, once for each row of a pair.
template <int W> inline __m512 load8x2(const void* w, int64_t i) {
  if constexpr (W == F32) return _mm512_broadcast_f32x8(_mm256_loadu_ps(static_cast<const float*>(w) + i));
  const __m256i h = _mm256_broadcastsi128_si256(
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(w) + i)));
  if constexpr (W == BF16) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  else return _mm512_cvtph_ps(h);
}

// micro's sums for R <= 2P activation rows, two rows a 512-bit vector: each FMA computes rows 2p and
// 2p + 1 of a pair as the 256-bit path computes each (lane l of the low half is row 2p's lane l), so the
// bits are the same, with half the FMA instructions (the CPUs with two 512-bit FMA pipes, AMD Zen 5 and
// Intel Xeon, run them at twice the 256-bit rate; at 8 rows a micro-tile was bound by its FMAs).
// `pairs`: the rows' first `body` columns, pair p's 8-column blocks side by side (see paired()).
template <int W, int P, int C>
inline void micro2(const float* x, int64_t ldx, const float* pairs, const void* w, int64_t K, Rows n,
                   float out[OUT_ROWS][NR], int64_t phase, int64_t phases, int R) {
  Prefetch<W, C, (2 * P >= L2_ROWS)> prefetch(w, n, K, phase, phases);  // P pairs: 2P - 1 or 2P rows
  const int64_t body = K / 8 * 8;
  __m512 acc[P][C];
  for (int p = 0; p < P; p++)
    for (int c = 0; c < C; c++) acc[p][c] = _mm512_setzero_ps();
  for (int64_t k = 0; k < body; k += 8) {
    prefetch.at(k);
    __m512 wv[C];
    for (int c = 0; c < C; c++) wv[c] = load8x2<W>(w, n.at(c) * K + k);
    for (int p = 0; p < P; p++) {
      __m512 xv = _mm512_loadu_ps(pairs + p * 2 * body + 2 * k);  // (row 2p, row 2p + 1) x 8 columns
      asm("" : "+v"(xv));  // as in micro: one load for its C uses
      for (int c = 0; c < C; c++) acc[p][c] = _mm512_fmadd_ps(xv, wv[c], acc[p][c]);
    }
  }
  for (int r = 0; r < R; r++)
    for (int c = 0; c < C; c++) {
      const __m512 a = acc[r / 2][c];
      const float s = hsum(r % 2 ? _mm512_extractf32x8_ps(a, 1) : _mm512_castps512_ps256(a));
      out[r][c] = with_tail<W>(s, x + r * ldx, w, n.at(c) * K, body, K);
    }
}
#endif

#if defined(AOTPACK_PAIRS) && defined(__AVX512BF16__)
#define AOTPACK_DPBF16 1
// The `dpbf16` lowering: bf16 activations against a bf16 weight with AVX512-BF16's `vdpbf16ps`, which
// multiplies 16 pairs of adjacent bf16 columns and adds each pair's two products into one fp32 lane: 32
// products an instruction from the weight as stored, where the FMA path above converts each weight to
// fp32 and does 8 (16 with micro2's pairs of rows). At 8 rows the FMA path was bound by its FMAs and
// conversions (Gemma 3 270M's bf16 step over 8 rows cost 2.2x one row on the AMD EPYC Zen 4).
// A micro-tile is NR weight rows by up to MR activation rows, as micro's, the activations packed by
// dpbf16_steps; the weights' K % 32 tail is loaded masked (zeros add nothing, as the packing's). Each
// output is one lane-wise chain over K, then one fixed 16-lane sum, the same adds in the same order whatever
// M, the tile or the thread (hsum's, or sums16's, which adds hsum's pairs): a row's bits do not depend on the
// batch (they differ from the FMA path's: another order, and the instruction flushes denormals).
// The columns of the 32-column step at k that lie before K, as a load mask: all of them but in a last,
// partial step (K - k < 32).
inline __mmask32 step_columns(int64_t k, int64_t K) {
  return K - k >= 32 ? ~__mmask32(0) : __mmask32((1u << (K - k)) - 1);
}

template <int R, int C>
inline void dpbf16_step(__m512 (&acc)[R][C], const uint16_t* xk, const __m512bh (&wv)[C]) {
  for (int r = 0; r < R; r++) {
    __m512i xv = _mm512_loadu_si512(xk + r * 32);
    asm("" : "+v"(xv));  // as in micro: one load for its C uses
    for (int c = 0; c < C; c++) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], __m512bh(xv), wv[c]);
  }
}

// Sixteen of a pass's sums at once, each in hsum's order: the 256-bit halves, then lanes i and i + 4, then
// (0 + 2, 1 + 3), then the two. Each add pairs what hsum's pairs, in hsum's operand order, so the bits are
// hsum's; one function a level, each instruction working on 4 (then 8, 16) sums at once. Lane 4b + j of the
// result holds v[4j + b]'s sum.
inline __m512 halves(__m512 a, __m512 b) {  // a's 256-bit halves' sum, then b's
  return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
}
inline __m512 quarters(__m512 a, __m512 b) {  // a 128-bit block a vector: lanes i + (i + 4)
  return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x88), _mm512_shuffle_f32x4(a, b, 0xDD));
}
inline __m512 pairs(__m512 a, __m512 b) {  // each block's (0 + 2, 1 + 3), a's then b's
  return _mm512_add_ps(_mm512_shuffle_ps(a, b, 0x44), _mm512_shuffle_ps(a, b, 0xEE));
}
inline __m512 sums16(__m512 v0, __m512 v1, __m512 v2, __m512 v3, __m512 v4, __m512 v5, __m512 v6, __m512 v7,
                     __m512 v8, __m512 v9, __m512 v10, __m512 v11, __m512 v12, __m512 v13, __m512 v14, __m512 v15) {
  const __m512 a = pairs(quarters(halves(v0, v1), halves(v2, v3)), quarters(halves(v4, v5), halves(v6, v7)));
  const __m512 b = pairs(quarters(halves(v8, v9), halves(v10, v11)), quarters(halves(v12, v13), halves(v14, v15)));
  return _mm512_add_ps(_mm512_shuffle_ps(a, b, 0x88), _mm512_shuffle_ps(a, b, 0xDD));  // lanes 0 + 1
}

// f32_to_bf16 on 16 lanes: round to nearest even, a NaN stays NaN.
inline __m256i bf16_lanes(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff))), 16);
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                _mm512_set1_epi32(0x7f800000));
  const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  return _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(rounded, nan, quiet));
}

// One accumulator's sum (hsum over its halves' sum), rounded to bf16.
inline uint16_t bf16_sum(__m512 a) {
  return f32_to_bf16(hsum(_mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1))));
}

// A pass's accumulator I (row-major, R x C), or zeros past the last.
template <int I, int R, int C> inline __m512 pick(const __m512 (&acc)[R][C]) {
  if constexpr (I < R * C) return acc[I / C][I % C];
  else return _mm512_setzero_ps();
}

// A pass's sums 16G .. 16G + 15 (those it has), rounded into y: rows m .., columns n.
template <int G, int R, int C, size_t... J>
inline void store16(const __m512 (&acc)[R][C], uint16_t* y, int64_t m, Rows n, int64_t N, std::index_sequence<J...>) {
  alignas(32) uint16_t lanes[16];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), bf16_lanes(sums16(pick<16 * G + int(J)>(acc)...)));
  constexpr int S = R * C;
  ((16 * G + int(J) < S ? void(y[(m + (16 * G + J) / C) * N + n.at((16 * G + J) % C)] = lanes[4 * (J % 4) + J / 4])
                        : void()),
   ...);
}

// A pass's R x C sums, rounded into y (bf16): sixteen at a time (store16, the last group padded with zeros
// where 8 or more are left), the rest by hsum, one at a time.
template <int R, int C> inline void dpbf16_store(const __m512 (&acc)[R][C], uint16_t* y, int64_t m, Rows n, int64_t N) {
  constexpr int S = R * C, GROUPS = (S + 8) / 16;
  static_assert(GROUPS <= 2, "MR x NR is 24 sums at most");
  if constexpr (GROUPS > 0) store16<0>(acc, y, m, n, N, std::make_index_sequence<16>());
  if constexpr (GROUPS > 1) store16<1>(acc, y, m, n, N, std::make_index_sequence<16>());
#pragma GCC unroll 8
  for (int i = 16 * GROUPS; i < S; i++) y[(m + i / C) * N + n.at(i % C)] = bf16_sum(acc[i / C][i % C]);
}

// Passes of L2_ROWS rows or more fetch the micro-tile two ahead, not the next: a pass of 8 rows spends ~24
// cycles a 32-column step, so at K = 640 one tile ahead is ~130 ns, about the memory's latency under load.
// Gemma 3 270M's bf16 linears as a step calls them at 8 rows, weights streamed (lm_head / 18 layers, ms):
// 12.86 / 8.78 -> 11.72 / 8.55 and 13.01 / 8.93 -> 11.64 / 8.93 (three ahead: 11.92 / 8.37, 12.10 / 8.82);
// the real 8-row graph 21.65 -> 19.86 and 22.50 -> 19.65 ms (AMD EPYC Zen 4, 2 threads, slow memory phase,
// interleaved; artifacts/bench/epyc-zen4/ahead/).
constexpr int DPBF16_AHEAD = 2;

// `xs`: R activation rows packed (dpbf16_steps). Whole steps load everything unmasked: with each row's own
// masked load from x (a pointer a row, kept on the stack, and a mask), Gemma 3's calls took 8-14 % more time at
// 8 rows, 4-17 % at one (weights in cache; AMD EPYC Zen 4, 2 threads; artifacts/bench/epyc-zen4/overlap/).
// Passes of L2_ROWS rows or more sum 16 outputs at once (where a pass has 8 or more; fewer go by hsum) and
// round them in vectors (dpbf16_store): the 24 hsum calls and scalar roundings of an 8-row tile had taken
// ~29 % of its time (perf, weights in cache). Their steps load the weights masked, every one (the mask whole
// but in a last, partial step): with a separate tail step GCC kept the 24 accumulators in memory across the
// sums. One or two rows keep hsum, whose few sums cost little, and unmasked steps (masked, one row's calls
// took 25 % more time).
template <int R, int C>
[[gnu::always_inline]] inline void micro_dpbf16(const uint16_t* xs, const uint16_t* w, int64_t K, Rows n, uint16_t* y,
                                               int64_t m, int64_t N, int64_t phase, int64_t phases) {
  Prefetch<BF16, C, (R >= L2_ROWS)> prefetch(w, n, K, phase, phases, R >= L2_ROWS ? DPBF16_AHEAD : 1);
  __m512 acc[R][C];
  for (int r = 0; r < R; r++)
    for (int c = 0; c < C; c++) acc[r][c] = _mm512_setzero_ps();
  const uint16_t* wc[C];
  for (int c = 0; c < C; c++) wc[c] = w + n.at(c) * K;
  __m512bh wv[C];
  if constexpr (R >= L2_ROWS) {
    for (int64_t k = 0; k < K; k += 32) {
      prefetch.at(k);
      const __mmask32 take = step_columns(k, K);
      for (int c = 0; c < C; c++) wv[c] = __m512bh(_mm512_maskz_loadu_epi16(take, wc[c] + k));
      dpbf16_step<R, C>(acc, xs + k * R, wv);
    }
  } else {
    const int64_t body = K / 32 * 32;
    for (int64_t k = 0; k < body; k += 32) {
      prefetch.at(k);
      for (int c = 0; c < C; c++) wv[c] = __m512bh(_mm512_loadu_si512(wc[c] + k));
      dpbf16_step<R, C>(acc, xs + k * R, wv);
    }
    if (body < K) {
      const __mmask32 take = step_columns(body, K);
      prefetch.at(body);
      for (int c = 0; c < C; c++) wv[c] = __m512bh(_mm512_maskz_loadu_epi16(take, wc[c] + body));
      dpbf16_step<R, C>(acc, xs + body * R, wv);
    }
  }
  dpbf16_store<R, C>(acc, y, m, n, N);  // one or two rows: fewer than 8 sums, each by hsum
}

// micro_dpbf16 as a call of its own: dpbf16_tile's passes, in calls of other than MR rows (see linear_dpbf16).
template <int R, int C>
[[gnu::noinline]] void micro_dpbf16_call(const uint16_t* xs, const uint16_t* w, int64_t K, Rows n, uint16_t* y,
                                         int64_t m, int64_t N, int64_t phase, int64_t phases) {
  micro_dpbf16<R, C>(xs, w, K, n, y, m, N, phase, phases);
}
#endif
#else
template <int W, int R, int C>
inline void micro(const float* x, int64_t ldx, const void* w, int64_t K, Rows n, float out[OUT_ROWS][NR], int64_t,
                  int64_t) {
  for (int r = 0; r < R; r++)
    for (int c = 0; c < C; c++) {
      float lanes[8] = {};
      const int64_t body = K / 8 * 8;
      for (int64_t k = 0; k < body; k += 8)
        for (int l = 0; l < 8; l++) lanes[l] += x[r * ldx + k + l] * weight_at<W>(w, n.at(c) * K + k + l);
      // hsum's order: lanes (0+4, 1+5, 2+6, 3+7), then (a+c, b+d), then the two
      const float a = lanes[0] + lanes[4], b = lanes[1] + lanes[5], c2 = lanes[2] + lanes[6], d = lanes[3] + lanes[7];
      out[r][c] = with_tail<W>((a + c2) + (b + d), x + r * ldx, w, n.at(c) * K, body, K);
    }
}
#endif

// micro as a call of its own, for passes of 2 rows or more. Inlined into gemm_dense's parallel region, GCC
// spilled one of the 4 x 3 tile's converted weight vectors and the activation rows' pointers to the stack
// (11 stack operands an iteration, and perf put 45 % of the samples on the FMA after the reloaded vector); as a
// function of its own the loop holds all in registers. Gemma 3 270M's linears, a step's worth streamed (AMD
// EPYC Zen 3, AVX2, 2 threads, interleaved, ms): bf16 at 4 rows 42.7 -> 33.9, 8 rows 76.9 -> 61.3, fp32 at 8
// rows 103.1 -> 83.4 (artifacts/bench/epyc-zen3/). One row stays inlined: as a call it was ~5 % slower.
template <int W, int R, int C>
[[gnu::noinline]] void micro_call(const float* x, int64_t ldx, const void* w, int64_t K, Rows n,
                                  float out[OUT_ROWS][NR], int64_t phase, int64_t phases) {
  micro<W, R, C>(x, ldx, w, K, n, out, phase, phases);
}

#if defined(AOTPACK_AMX)
// bf16 activations against bf16 weights on AMX tiles: `tdpbf16ps` multiplies a tile of 16 weight rows by
// 32 columns (the weight as stored: rows K apart) into up to 16 activation rows at once, the products of 16
// 512-bit FMAs in one instruction. At 8 rows the FMA path above was bound by its FMAs and conversions
// (Gemma 3 270M's bf16 step over 8 rows cost 1.8x one row on the Intel Xeon); here a call costs about
// what reading its weights costs, whatever M up to 16. The activations are repacked once a call into the
// tile's pair layout (amx_activations); the weights are read as they are. Each thread cuts its rows into
// 16 runs read front to back, a tile taking the same row of each (as Rows does above). The N % 16 rows
// past the last tile and the K % 32 columns past the last step are summed in fp32, in order.
// Each output is its own dot product in a tile, computed by the same instructions whatever M, the tile or
// the thread: a row's bits do not depend on the batch (they differ from the FMA path's). More than 16
// rows (verify graphs) take one pass over the weights per 16.
constexpr int AMX_ROWS = 16;    // weight rows a tile (its rows), and activation rows a tile (its columns)
constexpr int AMX_COLS = 32;    // bf16 columns a step: a tile row's 64 bytes

// x's rows m0 .. m0 + mc (mc <= 16) in B-tile layout: for each step s of 32 columns, 16 rows (column pairs)
// of mc x 2 bf16: row i holds (x[m, 32s + 2i], x[m, 32s + 2i + 1]) for each m.
std::vector<uint16_t> amx_activations(const uint16_t* x, int64_t ldx, int64_t m0, int64_t mc, int64_t steps) {
  std::vector<uint16_t> b(size_t(steps * AMX_COLS * mc));
  for (int64_t st = 0; st < steps; st++)
    for (int64_t i = 0; i < AMX_COLS / 2; i++)
      for (int64_t m = 0; m < mc; m++)
        for (int64_t j = 0; j < 2; j++)
          b[size_t(((st * 16 + i) * mc + m) * 2 + j)] = x[(m0 + m) * ldx + st * AMX_COLS + 2 * i + j];
  return b;
}

// One tile of 16 weight rows, rows `apart` apart from `first` (one from each of a thread's 16 runs), times
// the activations `b` over all `steps` steps: the even steps into tile 0, the odd into tile 1, two chains
// of tile products that do not wait for each other, summed at the end (out: 16 rows of mc floats).
// Each run's next lines are fetched AHEAD bytes ahead: with 16 runs a thread the hardware prefetcher
// fell behind (Gemma 3's `lm_head` at one row 12.1 -> 10.9 ms, Intel Xeon, 2 threads).
constexpr int64_t AHEAD = 512;
void amx_tile(const uint16_t* w, int64_t K, int64_t first, int64_t apart, const uint16_t* b, int64_t mc,
              int64_t steps, float* out) {
  const int64_t wstride = apart * K * 2, bstride = mc * 4;
  const uint16_t* row = w + first * K;
  _tile_zero(0);
  _tile_zero(1);
  int64_t st = 0;
  for (; st + 1 < steps; st += 2) {
    for (int r = 0; r < AMX_ROWS; r++) {
      const char* line = reinterpret_cast<const char*>(row + r * apart * K + st * AMX_COLS) + AHEAD;
      _mm_prefetch(line, _MM_HINT_T0);
      _mm_prefetch(line + 64, _MM_HINT_T0);
    }
    _tile_loadd(4, row + st * AMX_COLS, wstride);
    _tile_loadd(6, b + st * AMX_COLS * mc, bstride);
    _tile_dpbf16ps(0, 4, 6);
    _tile_loadd(5, row + (st + 1) * AMX_COLS, wstride);
    _tile_loadd(7, b + (st + 1) * AMX_COLS * mc, bstride);
    _tile_dpbf16ps(1, 5, 7);
  }
  if (st < steps) {
    _tile_loadd(4, row + st * AMX_COLS, wstride);
    _tile_loadd(6, b + st * AMX_COLS * mc, bstride);
    _tile_dpbf16ps(0, 4, 6);
  }
  alignas(64) float odd[AMX_ROWS * AMX_ROWS];
  _tile_stored(0, out, bstride);
  _tile_stored(1, odd, bstride);
  for (int64_t i = 0; i < AMX_ROWS * mc; i++) out[i] += odd[i];
}

// A row's dot product over columns [k0, K) in fp32, in order, added to s: the K % 32 tail, and the rows
// past the last tile (from k0 = 0).
inline float dot_from(float s, const uint16_t* x, const uint16_t* w, int64_t k0, int64_t K) {
  for (int64_t k = k0; k < K; k++) s += bf16_to_f32(x[k]) * bf16_to_f32(w[k]);
  return s;
}

// 16 floats to bf16 as f32_to_bf16 rounds each (to nearest even; a NaN stays a NaN).
inline __m256i bf16x16(__m512 v) {
  const __m512i u = _mm512_castps_si512(v), one = _mm512_set1_epi32(1);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), one);
  const __m512i half = _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff));
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, half), 16);
  const __m512i magnitude = _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff));
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(magnitude, _mm512_set1_epi32(0x7f800000));
  const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  return _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(rounded, nan, quiet));
}

// Up to 16 tiles' sums, kept until they can go out together: y's rows are N apart and a tile's weight
// rows `apart` apart, both multiples of 4 KB in Gemma 3's `lm_head`, so a tile's own outputs all fall in
// one L1 set; stored one at a time they missed L1 each (the 16-row call 10 -> 17 ms). Kept here per
// (weight row, activation row) for 16 consecutive tiles, they go out 16 bf16 at a time.
struct TileOutputs {
  alignas(64) float sums[AMX_ROWS * AMX_ROWS * AMX_ROWS];  // [r * mc + m][tile % 16]
  int64_t count = 0, first = 0;  // tiles held, and the weight row of the first one's row 0

  void add(const float* out, int64_t mc, int64_t tile_first) {
    if (count == 0) first = tile_first;
    for (int64_t j = 0; j < AMX_ROWS * mc; j++) sums[j * AMX_ROWS + count] = out[j];
    count++;
  }
  // Into y (rows N apart) as bf16, weight row first + r * apart + t for tile t.
  void flush(int64_t mc, uint16_t* y, int64_t N, int64_t apart) {
    const __mmask16 held = __mmask16((1u << count) - 1);
    for (int64_t r = 0; r < AMX_ROWS; r++)
      for (int64_t m = 0; m < mc; m++) {
        const __m256i out = bf16x16(_mm512_load_ps(sums + (r * mc + m) * AMX_ROWS));  // lanes past `count`: unused
        _mm256_mask_storeu_epi16(y + m * N + first + r * apart, held, out);
      }
    count = 0;
  }
};

void gemm_bf16_amx(const uint16_t* x, int64_t ldx, int64_t M, int64_t K, const uint16_t* w, int64_t N, void* y) {
  const int64_t steps = K / AMX_COLS, body = steps * AMX_COLS, tiles = N / AMX_ROWS;
  uint16_t* y16 = static_cast<uint16_t*>(y);
  for (int64_t m0 = 0; m0 < M; m0 += AMX_ROWS) {
    const int64_t mc = std::min<int64_t>(AMX_ROWS, M - m0);
    const std::vector<uint16_t> b = amx_activations(x, ldx, m0, mc, steps);
#pragma omp parallel
    {
      TileConfig cfg;
      for (int t = 0; t < 8; t++) cfg.rows[t] = AMX_ROWS, cfg.colsb[t] = t == 4 || t == 5 ? 64 : uint16_t(mc * 4);
      _tile_loadconfig(&cfg);
      // this thread's tiles [b0, b1) as 16 runs of `apart` rows each, read front to back: 16 sequential
      // streams (tiles of 16 adjacent rows, each a line at a time, read Gemma 3's `lm_head` at 26 GB/s)
      const int64_t team = omp_get_num_threads(), p = omp_get_thread_num();
      const int64_t b0 = tiles * p / team, b1 = tiles * (p + 1) / team, apart = b1 - b0;
      alignas(64) float out[AMX_ROWS * AMX_ROWS];
      TileOutputs held;
      for (int64_t i = 0; i < apart; i++) {
        const int64_t first = b0 * AMX_ROWS + i;
        if (steps > 0) amx_tile(w, K, first, apart, b.data(), mc, steps, out);
        else std::fill(out, out + AMX_ROWS * mc, 0.0f);
        if (body < K)  // the K % 32 tail, in order after the tiles' sum
          for (int64_t r = 0; r < AMX_ROWS; r++)
            for (int64_t m = 0; m < mc; m++)
              out[r * mc + m] = dot_from(out[r * mc + m], x + (m0 + m) * ldx, w + (first + r * apart) * K, body, K);
        held.add(out, mc, first);
        if (held.count == AMX_ROWS || i + 1 == apart) held.flush(mc, y16 + m0 * N, N, apart);
      }
      _tile_release();
#pragma omp for
      for (int64_t n = tiles * AMX_ROWS; n < N; n++)
        for (int64_t m = 0; m < mc; m++)
          store_from_f32<BF16>(y, (m0 + m) * N + n, dot_from(0.0f, x + (m0 + m) * ldx, w + n * K, 0, K));
    }
  }
}
#endif

template <int C>
void store(const float out[OUT_ROWS][NR], int R, int64_t m, Rows n, int32_t dtype, int64_t N, void* y) {
  for (int r = 0; r < R; r++)
    for (int c = 0; c < C; c++) {
      const int64_t i = (m + r) * N + n.at(c);
      if (dtype == F32) store_from_f32<F32>(y, i, out[r][c]);
      else if (dtype == BF16) store_from_f32<BF16>(y, i, out[r][c]);
      else store_from_f32<F16>(y, i, out[r][c]);
    }
}

// Every activation row against weight rows `n` of w (each K long), MR at a time (pair_rows<W>() with `pairs`),
// into y's columns `cols`.
// The first pass reads the rows from memory (fetched ahead), later ones from cache; with `prefetch` the
// passes together fetch the next micro-tile's rows, each a share, so that memory streams while they compute.
// `pairs`: x paired for micro2 (see paired()), or null.
template <int W, int C>
void passes(const float* x, const float* pairs, int64_t M, int64_t K, const void* w, Rows n, bool prefetch,
            int32_t dtype, Rows cols, int64_t N, void* y) {
  float out[OUT_ROWS][NR];
  const int64_t step = rows_a_pass<W>(pairs), phases = prefetch ? (M + step - 1) / step : 0;
  for (int64_t m = 0; m < M; m += step) {
    const int64_t rows = std::min<int64_t>(step, M - m), phase = m / step;
    static_assert(MR == 4 || MR == 8, "the cases below cover 1 .. MR rows");
#if defined(AOTPACK_PAIRS)
    if (pairs != nullptr && rows > 1) {
      const float* pm = pairs + m * (K / 8 * 8);  // pair m / 2, each 2 * body long
      static_assert(PAIR_ROWS == 16, "the cases below cover 1 .. 8 pairs");
      switch ((rows + 1) / 2) {
        case 8: micro2<W, 8, C>(x + m * K, K, pm, w, K, n, out, phase, phases, int(rows)); break;
        case 7: micro2<W, 7, C>(x + m * K, K, pm, w, K, n, out, phase, phases, int(rows)); break;
        case 6: micro2<W, 6, C>(x + m * K, K, pm, w, K, n, out, phase, phases, int(rows)); break;
        case 5: micro2<W, 5, C>(x + m * K, K, pm, w, K, n, out, phase, phases, int(rows)); break;
        case 4: micro2<W, 4, C>(x + m * K, K, pm, w, K, n, out, phase, phases, int(rows)); break;
        case 3: micro2<W, 3, C>(x + m * K, K, pm, w, K, n, out, phase, phases, int(rows)); break;
        case 2: micro2<W, 2, C>(x + m * K, K, pm, w, K, n, out, phase, phases, int(rows)); break;
        default: micro2<W, 1, C>(x + m * K, K, pm, w, K, n, out, phase, phases, int(rows));
      }
      store<C>(out, int(rows), m, cols, dtype, N, y);
      continue;
    }
#endif
    switch (rows) {
#if defined(__AVX512VL__)
      case 8: micro_call<W, 8, C>(x + m * K, K, w, K, n, out, phase, phases); break;
      case 7: micro_call<W, 7, C>(x + m * K, K, w, K, n, out, phase, phases); break;
      case 6: micro_call<W, 6, C>(x + m * K, K, w, K, n, out, phase, phases); break;
      case 5: micro_call<W, 5, C>(x + m * K, K, w, K, n, out, phase, phases); break;
#endif
      case 4: micro_call<W, 4, C>(x + m * K, K, w, K, n, out, phase, phases); break;
      case 3: micro_call<W, 3, C>(x + m * K, K, w, K, n, out, phase, phases); break;
      case 2: micro_call<W, 2, C>(x + m * K, K, w, K, n, out, phase, phases); break;
      default: micro<W, 1, C>(x + m * K, K, w, K, n, out, phase, phases);
    }
    store<C>(out, int(rows), m, cols, dtype, N, y);
  }
}

// On the pairs path a bf16 or fp16 tile used by more than one pass (calls of more than PAIR_ROWS rows) is
// converted to fp32 once (a per-thread buffer of C * K floats, in L1 or L2), not once a pass: on the AVX-512
// CPU it was first measured on, at 8 rows a pass the conversions had cost as much as the FMAs. On the AVX2
// path (4 rows a pass) each pass converts for itself: the buffer was slower at every row count there.
// Gemma 3 270M's bf16 linears, a step's worth streamed (AMD EPYC Zen 3, AVX2, 2 threads, interleaved, ms):
// 5 rows 89 -> 51, 8 rows 112 -> 61, 16 rows 199 -> 127, 40 rows 422 -> 301; 1-4 rows do not convert
// (artifacts/bench/epyc-zen3/). The products and sums are the same either way.
constexpr bool CONVERT_ONCE = PAIR_ROWS > 0;
template <int W, int C>
void tile(const float* x, const float* pairs, int64_t M, int64_t K, const void* w, Rows n, int32_t dtype, int64_t N,
          void* y, float* converted) {
  if (W == F32 || !CONVERT_ONCE || M <= rows_a_pass<W>(pairs))
    return passes<W, C>(x, pairs, M, K, w, n, true, dtype, n, N, y);
  constexpr int64_t LINE = 32;  // 2-byte elements per cache line
  const char* base = static_cast<const char*>(w);
  const Rows ahead = n.next(C);
  for (int c = 0; c < C; c++) {
    const int64_t row = n.at(c) * K, next = ahead.at(c) * K;
    int64_t i = 0;
#if defined(AOTPACK_AVX2)
    for (; i + 8 <= K; i += 8) {
      if (i % LINE == 0) _mm_prefetch(base + (next + i) * 2, _MM_HINT_T0);
      _mm256_storeu_ps(converted + c * K + i, load8<W>(w, row + i));
    }
#endif
    for (; i < K; i++) converted[c * K + i] = weight_at<W>(w, row + i);
  }
  passes<F32, C>(x, pairs, M, K, converted, Rows{0, 1}, false, dtype, n, N, y);
}

// x's rows two by two for micro2: pair p holds, for each 8 columns k of the first K / 8 * 8, row 2p's then
// row 2p + 1's (zeros after an odd M's last row). M x K floats, made once a call for every thread.
std::vector<float> paired(const float* x, int64_t M, int64_t K) {
  const int64_t body = K / 8 * 8;
  std::vector<float> pairs(size_t((M + 1) / 2 * 2 * body), 0.0f);
  for (int64_t m = 0; m < M; m++)
    for (int64_t k = 0; k < body; k++) pairs[size_t(m / 2 * 2 * body + k / 8 * 16 + m % 2 * 8 + k % 8)] = x[m * K + k];
  return pairs;
}

// Inside a parallel region: this thread's share of the N weight rows, `tile(rows, C)` for each micro-tile
// (C = NR, then single rows for the remainder, std::integral_constant). The team's own size (as lanes.h's
// gemm_team): rows [n0, n1), read in NR runs side by side for up to RUNS_UP_TO activation rows (Rows).
template <class Tile> void my_tiles(int64_t M, int64_t N, Tile&& tile) {
  const int64_t team = omp_get_num_threads(), p = omp_get_thread_num();
  const int64_t n0 = N * p / team, n1 = N * (p + 1) / team, tiles = (n1 - n0) / NR;
  const bool runs = M <= RUNS_UP_TO;
  for (int64_t i = 0; i < tiles; i++)
    tile(runs ? Rows{n0 + i, tiles} : Rows{n0 + i * NR, 1}, std::integral_constant<int, NR>{});
  for (int64_t n = n0 + NR * tiles; n < n1; n++) tile(Rows{n, 1}, std::integral_constant<int, 1>{});
}

template <int W>
void gemm_dense(const float* x, int64_t M, int64_t K, const void* w, int64_t N, int32_t dtype, void* y) {
#if defined(AOTPACK_PAIRS)
  const std::vector<float> paired_x = M > 1 ? paired(x, M, K) : std::vector<float>();
  const float* pairs = M > 1 ? paired_x.data() : nullptr;
#else
  const float* pairs = nullptr;
#endif
#pragma omp parallel
  {
    std::vector<float> converted(W == F32 || !CONVERT_ONCE ? 0 : size_t(NR * K));  // per thread, for tile()
    my_tiles(M, N, [&](Rows rows, auto C) { tile<W, C()>(x, pairs, M, K, w, rows, dtype, N, y, converted.data()); });
  }
}

// x as a dense fp32 (M, K) matrix: converted once per call into a per-thread scratch buffer.
const float* as_f32(const void* x, int32_t dtype, int64_t M, int64_t K, int64_t ldx) {
  thread_local std::vector<float> buffer;
  buffer.resize(size_t(M * K));
  for (int64_t m = 0; m < M; m++)
    for (int64_t k = 0; k < K; k++) {
      const int64_t i = m * ldx + k;
      buffer[size_t(m * K + k)] = dtype == F32 ? load_as_f32<F32>(x, i)
                                  : dtype == BF16 ? load_as_f32<BF16>(x, i)
                                                  : load_as_f32<F16>(x, i);
    }
  return buffer.data();
}

#if defined(AOTPACK_DPBF16)
// A packed activation row's length (dpbf16_steps): K rounded up to whole steps of 32 columns.
inline int64_t dpbf16_padded(int64_t K) { return (K + 31) / 32 * 32; }

// x (M, K), ldx apart, packed for micro_dpbf16 into `packed`: chunk by chunk of MR rows (each at m0 *
// dpbf16_padded(K)), each 32-column step's rows side by side (R rows of 32 bf16; zeros past K), so that a
// pass reads its rows from one pointer. One masked load and store a row a step, which writes every element
// (the tail's zeros too): a memcpy a row a step (GCC's `rep movs` for its variable size) and a zero fill of the
// whole buffer took ~2 % of an 8-row step's samples (perf, Gemma 3 270M, AMD EPYC Zen 4; ~1 % after).
void dpbf16_steps(const uint16_t* x, int64_t ldx, int64_t M, int64_t K, std::vector<uint16_t>& packed) {
  const int64_t padded = dpbf16_padded(K);
  packed.resize(size_t(M * padded));
  for (int64_t m0 = 0; m0 < M; m0 += MR) {
    const int64_t R = std::min<int64_t>(MR, M - m0);
    uint16_t* chunk = packed.data() + m0 * padded;
    for (int64_t k = 0; k < K; k += 32) {
      const __mmask32 take = step_columns(k, K);
      for (int64_t r = 0; r < R; r++)
        _mm512_storeu_si512(chunk + k * R + r * 32, _mm512_maskz_loadu_epi16(take, x + (m0 + r) * ldx + k));
    }
  }
}

// Each thread's micro-tiles (my_tiles), MR activation rows a pass from `packed` (dpbf16_steps): the first pass
// reads the weight rows from memory, the passes together fetching a micro-tile ahead (the next, or
// DPBF16_AHEAD-th), later ones from cache.
template <int C>
void dpbf16_tile(const uint16_t* packed, int64_t M, int64_t K, const uint16_t* w, Rows n, int64_t N, uint16_t* y) {
  const int64_t phases = (M + MR - 1) / MR, padded = dpbf16_padded(K);
  for (int64_t m = 0; m < M; m += MR) {
    const int64_t rows = std::min<int64_t>(MR, M - m), phase = m / MR;
    const uint16_t* xs = packed + m * padded;
    static_assert(MR == 8, "the cases below cover 1 .. 8 rows");
    switch (rows) {
      case 8: micro_dpbf16_call<8, C>(xs, w, K, n, y, m, N, phase, phases); break;
      case 7: micro_dpbf16_call<7, C>(xs, w, K, n, y, m, N, phase, phases); break;
      case 6: micro_dpbf16_call<6, C>(xs, w, K, n, y, m, N, phase, phases); break;
      case 5: micro_dpbf16_call<5, C>(xs, w, K, n, y, m, N, phase, phases); break;
      case 4: micro_dpbf16_call<4, C>(xs, w, K, n, y, m, N, phase, phases); break;
      case 3: micro_dpbf16_call<3, C>(xs, w, K, n, y, m, N, phase, phases); break;
      case 2: micro_dpbf16_call<2, C>(xs, w, K, n, y, m, N, phase, phases); break;
      default: micro_dpbf16_call<1, C>(xs, w, K, n, y, m, N, phase, phases);
    }
  }
}
#endif

}  // namespace

bool tiles_ready() {  // quant_common.h
#if defined(AOTPACK_AMX)
  static const bool granted = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
  return granted;
#else
  return false;
#endif
}

int32_t linear_dense(const void* x, int32_t dtype, int64_t M, int64_t K, int64_t ldx, const void* w, int32_t wtype,
                     int64_t N, void* y) {
  if (M < 0 || K < 1 || N < 0 || ldx < K) return BAD_SHAPE;
  if (dtype < F32 || dtype > F16 || wtype < F32 || wtype > F16) return BAD_DTYPE;
  if (M == 0 || N == 0) return OK;
  const float* xf = (dtype == F32 && ldx == K) ? static_cast<const float*>(x) : as_f32(x, dtype, M, K, ldx);
  if (wtype == F32) gemm_dense<F32>(xf, M, K, w, N, dtype, y);
  else if (wtype == BF16) gemm_dense<BF16>(xf, M, K, w, N, dtype, y);
  else gemm_dense<F16>(xf, M, K, w, N, dtype, y);
  return OK;
}

// The `tiles` lowering: bf16 x against a bf16 weight on AMX tiles; NO_TILES where this build has no AMX
// path or the kernel (Linux) did not grant the tiles' state to this process.
int32_t linear_tiles(const void* x, int32_t dtype, int64_t M, int64_t K, int64_t ldx, const void* w, int32_t wtype,
                     int64_t N, void* y) {
  if (M < 0 || K < 1 || N < 0 || ldx < K) return BAD_SHAPE;
  if (dtype != BF16 || wtype != BF16) return BAD_DTYPE;
  if (!tiles_ready()) return NO_TILES;
  if (M == 0 || N == 0) return OK;
#if defined(AOTPACK_AMX)
  gemm_bf16_amx(static_cast<const uint16_t*>(x), ldx, M, K, static_cast<const uint16_t*>(w), N, y);
#endif
  return OK;
}

// The `dpbf16` lowering: bf16 x against a bf16 weight with AVX512-BF16's `vdpbf16ps`; NO_TILES where this
// build has no such path.
int32_t linear_dpbf16(const void* x, int32_t dtype, int64_t M, int64_t K, int64_t ldx, const void* w, int32_t wtype,
                     int64_t N, void* y) {
  if (M < 0 || K < 1 || N < 0 || ldx < K) return BAD_SHAPE;
  if (dtype != BF16 || wtype != BF16) return BAD_DTYPE;
#if defined(AOTPACK_DPBF16)
  if (M == 0 || N == 0) return OK;
  const auto* x16 = static_cast<const uint16_t*>(x);
  const auto* w16 = static_cast<const uint16_t*>(w);
  auto* y16 = static_cast<uint16_t*>(y);
#pragma omp parallel
  {
    // each thread packs every row for itself (a decode step's few rows: a few KB), none waiting for another
    thread_local std::vector<uint16_t> packed;
    dpbf16_steps(x16, ldx, M, K, packed);
    // MR rows (the 8-row graph's calls): one pass a tile, inlined into the loop over the tiles. A call a tile
    // cost 4-5 % of the pass's time when the weights are in cache (Gemma 3 270M's layers at 8 rows 5.31 / 5.86
    // -> 5.06 / 5.56 ms; 3072 x 640, one thread, 200.8 / 205.4 -> 195.9 / 191.7 us; AMD EPYC Zen 4,
    // interleaved; artifacts/bench/epyc-zen4/inline/). Other calls keep it: with every pass inlined, one to four
    // rows were slower in most runs.
    if (M == MR)
      my_tiles(M, N, [&](Rows rows, auto C) { micro_dpbf16<MR, C()>(packed.data(), w16, K, rows, y16, 0, N, 0, 1); });
    else
      my_tiles(M, N, [&](Rows rows, auto C) { dpbf16_tile<C()>(packed.data(), M, K, w16, rows, N, y16); });
  }
  return OK;
#else
  return NO_TILES;
#endif
}

// A C shim over float operands: x (M, K) rows ldx apart, a dense (N, K) weight; `kernel` as linear_dense.
template <class Kernel>
AOTITorchError float_shim(AtenTensorHandle x, AtenTensorHandle w, AtenTensorHandle* ret0, Kernel kernel) {
  Operand xo, wo;
  if (!operand(x, &xo) || !operand(w, &wo) || wo.kind < 0 || !wo.dense || xo.cols != wo.cols) return AOTI_TORCH_FAILURE;
  return run_shim(x, xo, wo.rows, ret0, [&](void* out) {
    return kernel(xo.data, xo.kind, xo.rows, wo.cols, xo.ld, wo.data, wo.kind, wo.rows, out);
  });
}

}  // namespace aotpack

extern "C" {

int32_t aotpack_tiles_ready() { return aotpack::tiles_ready(); }

int32_t aotpack_linear_tiles(const void* x, int32_t dtype, int64_t M, int64_t K, const void* w, int32_t wtype,
                             int64_t N, void* y) {
  return aotpack::linear_tiles(x, dtype, M, K, K, w, wtype, N, y);
}

int32_t aotpack_dpbf16_ready() {
#if defined(AOTPACK_DPBF16)
  return 1;
#else
  return 0;
#endif
}

int32_t aotpack_linear_dpbf16(const void* x, int32_t dtype, int64_t M, int64_t K, const void* w, int32_t wtype,
                             int64_t N, void* y) {
  return aotpack::linear_dpbf16(x, dtype, M, K, K, w, wtype, N, y);
}

int32_t aotpack_linear_dense(const void* x, int32_t dtype, int64_t M, int64_t K, const void* w, int32_t wtype,
                             int64_t N, void* y) {
  return aotpack::linear_dense(x, dtype, M, K, K, w, wtype, N, y);
}

// What AOTInductor calls for aotpack::dense_linear and aotpack::tiles_linear (runtime.quant.dense): no
// dispatcher, no boxing.
AOTITorchError aoti_torch_cpu_dense_linear(AtenTensorHandle x, AtenTensorHandle w, AtenTensorHandle* ret0) {
  return aotpack::float_shim(x, w, ret0, aotpack::linear_dense);
}

AOTITorchError aoti_torch_cpu_tiles_linear(AtenTensorHandle x, AtenTensorHandle w, AtenTensorHandle* ret0) {
  return aotpack::float_shim(x, w, ret0, aotpack::linear_tiles);
}

AOTITorchError aoti_torch_cpu_dpbf16_linear(AtenTensorHandle x, AtenTensorHandle w, AtenTensorHandle* ret0) {
  return aotpack::float_shim(x, w, ret0, aotpack::linear_dpbf16);
}

}  // extern "C"
