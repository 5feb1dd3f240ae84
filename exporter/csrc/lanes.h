// aotpack's integer kernels: a tile's 16 weight rows as the 16 lanes of a vector, on each instruction path.
//
// Owns the loop over a weight's tiles (gemm), and the vectors the int8, int4 and int5 kernels compute a
// tile with, with the few operations they need:
//   IntLanes: 16 int32 lanes, each one row's exact integer dot product with one activation block;
//   FloatLanes: 16 float lanes, each one row's sum so far;
//   ByteLanes: one group of 4 columns of the tile's 16 rows (64 bytes: a lane's 4 bytes together).
// Paths: AVX-512 with VNNI (one zmm, `dpbusd`, MR = 4 activation rows a pass, against up to 8 tiles: see
// tiles_a_pass; int8 calls of up to 16 rows 8 a pass: WIDE_MR), AVX2 with AVX-VNNI (two ymm halves,
// `dpbusd`, MR = 2), AVX2 (two ymm halves, `maddubs` + `madd`, MR = 2), plain C++ (MR = 1). A block's
// integer sums are exact on every path, and each lane then rounds the same IEEE operations (convert, fma,
// multiply) in the same order, so a bundle's numbers do not depend on the path its kernels.so was compiled
// for, nor on how many rows a pass takes, and a lone row's scalar code computes what a tile's lane does.
#pragma once

#include <omp.h>

#include <utility>

#include "quant_common.h"

namespace aotpack {

// For the plain C++ that must compute exact integer sums (lone rows, short blocks): GCC 12 vectorizes such
// a loop into VNNI's dpbusd for a VNNI target and gets the sum wrong (seen on int8's offset bytes).
#if defined(__GNUC__) && !defined(__clang__)
#define AOTPACK_NO_VECTORIZE __attribute__((optimize("no-tree-vectorize")))
#else
#define AOTPACK_NO_VECTORIZE
#endif

// Prefetch the line at p where the code issues it: GCC schedules __builtin_prefetch freely, and once it
// hoisted a block's eight (one a group of 4 columns) to the block's start, where they stalled on the CPU's
// fill buffers (the AVX-VNNI int8 kernel ran 0.9x at 2 to 8 rows); a volatile asm stays in its place.
inline void prefetch(const void* p) {
#if defined(__x86_64__) || defined(__i386__)
  asm volatile("prefetcht0 %0" : : "m"(*static_cast<const char*>(p)));
#else
  __builtin_prefetch(p);
#endif
}

// -128 * s, wrapping as the vector sums do: a block holding a NaN has a meaningless sum s (and a NaN step,
// which makes its row NaN), and signed overflow would be undefined behaviour.
inline int32_t minus_128_times(int32_t s) { return int32_t(0u - 128u * uint32_t(s)); }
inline int32_t minus_16_times(int32_t s) { return int32_t(0u - 16u * uint32_t(s)); }  // int5's offset, alike

// An activation row's 4 signed bytes of group g of block b: what every lane multiplies its 4 bytes with.
inline int32_t x4(const Activations& a, int64_t m, int64_t b, int64_t g) {
  int32_t v;
  std::memcpy(&v, a.row(m) + b * BLOCK + g * GROUP, 4);
  return v;
}

#if defined(AOTPACK_AVX2) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
constexpr int MR = 4;
// Rows a pass of a scheme with one integer sum a row and tile (int8) takes while a call has few rows (gemm_team):
// 8 rows against one tile fill the 8 chains and the 32 registers, and read each weight vector once for
// all 8, where two passes of 4 rows read it again from L2. Gemma 3's int8 `lm_head` at 8 rows: 5.6 ms
// against 7.9 (AMD EPYC, AVX-512 VNNI, 2 threads; 1 row 4.7). At 40 rows and more 4-row passes, which
// broadcast each activation group once for two tiles, were 5 % faster; int4 (three sums) spills at 8.
constexpr int WIDE_MR = 8;
struct IntLanes { __m512i v; };
struct FloatLanes { __m512 v; };
struct ByteLanes { __m512i v; };
inline IntLanes int_lanes(int32_t c) { return {_mm512_set1_epi32(c)}; }
inline IntLanes int_lanes_load(const int32_t* p) { return {_mm512_loadu_si512(p)}; }
inline FloatLanes zero_lanes() { return {_mm512_setzero_ps()}; }
inline FloatLanes float_lanes_load(const float* p) { return {_mm512_loadu_ps(p)}; }
inline FloatLanes bf16_lanes(const uint16_t* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return {_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))};
}
inline void store_floats(FloatLanes v, float* p) { _mm512_storeu_ps(p, v.v); }
inline FloatLanes fma_int(IntLanes i, float d, FloatLanes acc) {
  return {_mm512_fmadd_ps(_mm512_cvtepi32_ps(i.v), _mm512_set1_ps(d), acc.v)};
}
inline FloatLanes fma(FloatLanes a, FloatLanes b, FloatLanes acc) { return {_mm512_fmadd_ps(a.v, b.v, acc.v)}; }
inline FloatLanes fma(FloatLanes a, float b, FloatLanes acc) {
  return {_mm512_fmadd_ps(a.v, _mm512_set1_ps(b), acc.v)};
}
inline FloatLanes mul(FloatLanes a, FloatLanes b) { return {_mm512_mul_ps(a.v, b.v)}; }
inline ByteLanes byte_lanes(const uint8_t* p) { return {_mm512_loadu_si512(p)}; }
inline void nibbles(const uint8_t* p, ByteLanes* low, ByteLanes* high) {
  const __m512i v = _mm512_loadu_si512(p), mask = _mm512_set1_epi8(0x0f);
  low->v = _mm512_and_si512(v, mask);
  high->v = _mm512_and_si512(_mm512_srli_epi16(v, 4), mask);
}
// acc + each lane's 4 unsigned weight bytes times x's 4 signed bytes
inline IntLanes dot(IntLanes acc, ByteLanes w, int32_t x) {
  return {_mm512_dpbusd_epi32(acc.v, w.v, _mm512_set1_epi32(x))};
}
inline FloatLanes half_lanes(const uint16_t* p) {
  return {_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)))};
}
// w's byte i plus 16 where bit i of the 64 bits at p is set (int5's fifth bits: a mask register's load)
inline ByteLanes fifth_bits(ByteLanes w, const uint8_t* p) {
  uint64_t bits;
  std::memcpy(&bits, p, 8);
  return {_mm512_mask_add_epi8(w.v, _cvtu64_mask64(bits), w.v, _mm512_set1_epi8(16))};
}

#elif defined(AOTPACK_AVX2)
constexpr int MR = 2;
constexpr int WIDE_MR = MR;
struct IntLanes { __m256i lo, hi; };
struct FloatLanes { __m256 lo, hi; };
struct ByteLanes { __m256i lo, hi; };
inline IntLanes int_lanes(int32_t c) { return {_mm256_set1_epi32(c), _mm256_set1_epi32(c)}; }
inline IntLanes int_lanes_load(const int32_t* p) {
  const __m256i* v = reinterpret_cast<const __m256i*>(p);
  return {_mm256_loadu_si256(v), _mm256_loadu_si256(v + 1)};
}
inline FloatLanes zero_lanes() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline FloatLanes float_lanes_load(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
inline __m256 bf16x8(const uint16_t* p) {
  const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}
inline FloatLanes bf16_lanes(const uint16_t* p) { return {bf16x8(p), bf16x8(p + 8)}; }
inline void store_floats(FloatLanes v, float* p) { _mm256_storeu_ps(p, v.lo); _mm256_storeu_ps(p + 8, v.hi); }
inline FloatLanes fma_int(IntLanes i, float d, FloatLanes acc) {
  const __m256 dv = _mm256_set1_ps(d);
  return {_mm256_fmadd_ps(_mm256_cvtepi32_ps(i.lo), dv, acc.lo), _mm256_fmadd_ps(_mm256_cvtepi32_ps(i.hi), dv, acc.hi)};
}
inline FloatLanes fma(FloatLanes a, FloatLanes b, FloatLanes acc) {
  return {_mm256_fmadd_ps(a.lo, b.lo, acc.lo), _mm256_fmadd_ps(a.hi, b.hi, acc.hi)};
}
inline FloatLanes fma(FloatLanes a, float b, FloatLanes acc) {
  const __m256 bv = _mm256_set1_ps(b);
  return {_mm256_fmadd_ps(a.lo, bv, acc.lo), _mm256_fmadd_ps(a.hi, bv, acc.hi)};
}
inline FloatLanes mul(FloatLanes a, FloatLanes b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
inline ByteLanes byte_lanes(const uint8_t* p) {
  const __m256i* v = reinterpret_cast<const __m256i*>(p);
  return {_mm256_loadu_si256(v), _mm256_loadu_si256(v + 1)};
}
inline void nibbles(const uint8_t* p, ByteLanes* low, ByteLanes* high) {
  const __m256i mask = _mm256_set1_epi8(0x0f);
  const ByteLanes v = byte_lanes(p);
  *low = {_mm256_and_si256(v.lo, mask), _mm256_and_si256(v.hi, mask)};
  *high = {_mm256_and_si256(_mm256_srli_epi16(v.lo, 4), mask), _mm256_and_si256(_mm256_srli_epi16(v.hi, 4), mask)};
}
inline FloatLanes half_lanes(const uint16_t* p) {
  const __m128i* v = reinterpret_cast<const __m128i*>(p);
  return {_mm256_cvtph_ps(_mm_loadu_si128(v)), _mm256_cvtph_ps(_mm_loadu_si128(v + 1))};
}
// 16 where bit i of the 32 bits at p is set, else 0, in byte i (llama.cpp's bytes_from_bits_32: each byte
// picks its bit's byte of the word, every other bit of it set, and compares with all ones)
inline __m256i sixteen_where_set(const uint8_t* p) {
  uint32_t bits;
  std::memcpy(&bits, p, 4);
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(int32_t(bits)),
      _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0x0000000000000000));
  const __m256i set = _mm256_cmpeq_epi8(_mm256_or_si256(spread, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe)),
                                        _mm256_set1_epi64x(-1));
  return _mm256_and_si256(set, _mm256_set1_epi8(16));
}
// w's byte i plus 16 where bit i of the 64 bits at p is set (int5's fifth bits; lanes 0-7 are the low half)
inline ByteLanes fifth_bits(ByteLanes w, const uint8_t* p) {
  return {_mm256_or_si256(w.lo, sixteen_where_set(p)), _mm256_or_si256(w.hi, sixteen_where_set(p + 4))};
}
#if defined(__AVXVNNI__) || (defined(__AVX512VNNI__) && defined(__AVX512VL__))
inline __m256i dpbusd(__m256i acc, __m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(acc, u, s);
#else
  return _mm256_dpbusd_avx_epi32(acc, u, s);
#endif
}
inline IntLanes dot(IntLanes acc, ByteLanes w, int32_t x) {
  const __m256i xv = _mm256_set1_epi32(x);
  return {dpbusd(acc.lo, w.lo, xv), dpbusd(acc.hi, w.hi, xv)};
}
#else
// maddubs sums pairs of unsigned * signed bytes into int16: at most 2 * 15 * 128 for int4's nibbles and
// 2 * 31 * 128 for int5's five bits, so no pair saturates.
inline IntLanes dot(IntLanes acc, ByteLanes w, int32_t x) {
  const __m256i xv = _mm256_set1_epi32(x), one = _mm256_set1_epi16(1);
  return {_mm256_add_epi32(acc.lo, _mm256_madd_epi16(_mm256_maddubs_epi16(w.lo, xv), one)),
          _mm256_add_epi32(acc.hi, _mm256_madd_epi16(_mm256_maddubs_epi16(w.hi, xv), one))};
}
#define AOTPACK_SIGNED_OFFSET 1
// int8's weights plus 128 would saturate maddubs' pairs (255 * 127 * 2): flipped back to signed once per
// load (shared by the MR rows), they take x's signs and multiply |x|, as llama.cpp's Q8_0 dot does
// (|w|, |x| <= 127: a pair is at most 2 * 127 * 127).
inline ByteLanes offset_weights(ByteLanes w) {
  const __m256i flip = _mm256_set1_epi8(char(0x80));
  return {_mm256_xor_si256(w.lo, flip), _mm256_xor_si256(w.hi, flip)};
}
inline IntLanes offset_start(int32_t) { return int_lanes(0); }
inline IntLanes dot_offset(IntLanes acc, ByteLanes w, int32_t x) {
  const __m256i xv = _mm256_set1_epi32(x), ax = _mm256_sign_epi8(xv, xv), one = _mm256_set1_epi16(1);
  const __m256i lo = _mm256_maddubs_epi16(ax, _mm256_sign_epi8(w.lo, xv));
  const __m256i hi = _mm256_maddubs_epi16(ax, _mm256_sign_epi8(w.hi, xv));
  return {_mm256_add_epi32(acc.lo, _mm256_madd_epi16(lo, one)), _mm256_add_epi32(acc.hi, _mm256_madd_epi16(hi, one))};
}
#endif

#else
constexpr int MR = 1;
constexpr int WIDE_MR = MR;
struct IntLanes { int32_t v[TILE]; };
struct FloatLanes { float v[TILE]; };
struct ByteLanes { uint8_t v[TILE * GROUP]; };
inline IntLanes int_lanes(int32_t c) { IntLanes r; for (int32_t& e : r.v) e = c; return r; }
inline IntLanes int_lanes_load(const int32_t* p) { IntLanes r; std::memcpy(r.v, p, sizeof r.v); return r; }
inline FloatLanes zero_lanes() { FloatLanes r = {}; return r; }
inline FloatLanes float_lanes_load(const float* p) { FloatLanes r; std::memcpy(r.v, p, sizeof r.v); return r; }
inline FloatLanes bf16_lanes(const uint16_t* p) {
  FloatLanes r;
  for (int l = 0; l < TILE; l++) r.v[l] = bf16_to_f32(p[l]);
  return r;
}
inline void store_floats(FloatLanes v, float* p) { std::memcpy(p, v.v, sizeof v.v); }
inline FloatLanes fma_int(IntLanes i, float d, FloatLanes acc) {
  for (int l = 0; l < TILE; l++) acc.v[l] = std::fma(float(i.v[l]), d, acc.v[l]);
  return acc;
}
inline FloatLanes fma(FloatLanes a, FloatLanes b, FloatLanes acc) {
  for (int l = 0; l < TILE; l++) acc.v[l] = std::fma(a.v[l], b.v[l], acc.v[l]);
  return acc;
}
inline FloatLanes fma(FloatLanes a, float b, FloatLanes acc) {
  for (int l = 0; l < TILE; l++) acc.v[l] = std::fma(a.v[l], b, acc.v[l]);
  return acc;
}
inline FloatLanes mul(FloatLanes a, FloatLanes b) { for (int l = 0; l < TILE; l++) a.v[l] *= b.v[l]; return a; }
inline ByteLanes byte_lanes(const uint8_t* p) { ByteLanes r; std::memcpy(r.v, p, sizeof r.v); return r; }
inline void nibbles(const uint8_t* p, ByteLanes* low, ByteLanes* high) {
  for (int i = 0; i < TILE * GROUP; i++) low->v[i] = p[i] & 15, high->v[i] = p[i] >> 4;
}
inline FloatLanes half_lanes(const uint16_t* p) {
  FloatLanes r;
  for (int l = 0; l < TILE; l++) r.v[l] = f16_to_f32(p[l]);
  return r;
}
inline ByteLanes fifth_bits(ByteLanes w, const uint8_t* p) {
  for (int i = 0; i < TILE * GROUP; i++) w.v[i] |= uint8_t(((p[i >> 3] >> (i & 7)) & 1) << 4);
  return w;
}
inline IntLanes dot(IntLanes acc, ByteLanes w, int32_t x) {
  int8_t xb[GROUP];
  std::memcpy(xb, &x, GROUP);
  for (int l = 0; l < TILE; l++)
    for (int j = 0; j < GROUP; j++) acc.v[l] += int32_t(w.v[l * GROUP + j]) * xb[j];
  return acc;
}
#endif

#if !defined(AOTPACK_SIGNED_OFFSET)
// int8's weights are stored plus 128 (unsigned, dpbusd's operand, and the plain C++ does the same): a
// block's dot starts at -128 * sum(x) and multiplies the stored bytes as they are.
inline ByteLanes offset_weights(ByteLanes w) { return w; }
inline IntLanes offset_start(int32_t block_sum) { return int_lanes(minus_128_times(block_sum)); }
inline IntLanes dot_offset(IntLanes acc, ByteLanes w, int32_t x) { return dot(acc, w, x); }
#endif

// A tile's 16 lanes of activation row m into y[m, n0 .. n0 + TILE], in y's dtype.
template <int D> inline void store_lanes(FloatLanes v, void* y, int64_t at) {
  if constexpr (D == F32) return store_floats(v, static_cast<float*>(y) + at);  // 16 scalar stores cost
  alignas(64) float out[TILE];                                                  // 0.3 ms an 8-row `lm_head`
  store_floats(v, out);
  for (int l = 0; l < TILE; l++) store_from_f32<D>(y, at + l, out[l]);
}

// Tiles a pass computes against R activation rows: enough independent dot chains (R * T, up to the scheme's
// `chains`) to cover the integer dot's latency. On AVX-512 VNNI `dpbusd` takes 5 cycles and two issue a
// cycle, so one tile against four rows (four chains) left it latency-bound at half its throughput or less;
// eight chains fit in the 32 zmm registers with their float sums (int8: 5-20 % faster at 1 to 8 rows).
// AVX2's 16 ymm registers hold two tiles' chains at one row only.
constexpr int tiles_a_pass(int R, int chains) {
#if defined(AOTPACK_AVX2) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
  return R >= chains ? 1 : chains / R;
#elif defined(AOTPACK_AVX2)
  return R == 1 ? 2 : 1;
#else
  return 1;
#endif
}

// y[m .. m + R, tiles n0 .. n0 + count]: T tiles a pass (the scheme's pass<R, T, Fetch>), the rest fewer at a
// time. `Fetch`: passes prefetch the tiles that follow theirs. Not inlined: a function per (R, T, Fetch) keeps
// GCC's register allocation to one pass's loops (inlined into the thread's loop, the AVX2 paths spilled their
// sums to the stack and ran up to 0.8x the one-tile kernels at 2 to 8 rows). Fetch is a template argument for
// the same reason: one function holding both a prefetching and a plain copy of a pass's loops kept the 8-row
// int8 pass's float sums on the stack, stored every block (AMD EPYC Zen 4, Gemma 3 270M int8, 8 rows: the
// `lm_head` 5.6 -> 5.0 ms, the layers' calls 4 % faster; one row unchanged).
template <int D, int R, int T, bool Fetch, class S>
__attribute__((noinline)) void row_group(const S& s, const Activations& a, int64_t n0, int64_t count, int64_t m,
                                         Out o) {
  FloatLanes out[R * T];
  int64_t t = 0;
  for (; t + T <= count; t += T) {
    s.template pass<R, T, Fetch>(a, n0 + t * TILE, m, out);
    for (int j = 0; j < T; j++)
      for (int r = 0; r < R; r++) store_lanes<D>(out[j * R + r], o.y, o.at(m + r, n0 + (t + j) * TILE));
  }
  if constexpr (T > 1) {
    if (t < count) row_group<D, R, T / 2, Fetch>(s, a, n0 + t * TILE, count - t, m, o);
  }
}

// Built with AOTPACK_ONE_TILE, a decode step's calls (at most WIDE_ROWS rows) take one tile a pass whatever
// their rows: one weight stream a thread, the out-of-order core overlapping a tile's blocks' chains. On an
// AMD EPYC Zen 5 the eight tiles' prefetches cost more than the chains gave (int8 Gemma 3 270M decoding
// at 1 to 4 rows 15-25 % faster); longer calls (prefill chunks) keep several tiles a pass, which share
// each activation chunk (one tile a pass made a 512-token prefill 1.15-1.5x slower there). The exporter
// times both builds on the target (exporter.quant_family) and keeps the faster; the bits are the same.
#if defined(AOTPACK_ONE_TILE)
constexpr bool ONE_TILE_DECODE = true;
#else
constexpr bool ONE_TILE_DECODE = false;
#endif

// y[m .. m1, tiles n0 .. n0 + count]: R rows a pass while R are left, then R / 2 (R a power of two), so
// every row group shares each weight vector loaded (`One`: one tile a pass). With `fetch`, the first group
// prefetches the tiles ahead.
template <int D, int R, bool One, class S>
void rows(const S& s, const Activations& a, int64_t n0, int64_t count, int64_t m, int64_t m1, Out o, bool fetch) {
  constexpr int T = One ? 1 : tiles_a_pass(R, S::CHAINS);
  for (; m + R <= m1; m += R, fetch = false) {
    if (fetch) row_group<D, R, T, true>(s, a, n0, count, m, o);
    else row_group<D, R, T, false>(s, a, n0, count, m, o);
  }
  if constexpr (R > 1) {
    if (m < m1) rows<D, R / 2, One>(s, a, n0, count, m, m1, o, fetch);
  }
}

// y (M, N) = the scheme's rows over the quantized activations. The tiles of 16 weight rows are cut into one
// even share per thread (then the rows past the last whole tile, one at a time); a share goes a few tiles
// at a time (tiles_a_pass), which meet the activation rows in chunks of 64, which stay in L2 while the
// weights stream past, and a chunk's rows a few at a time (the scheme's MR), which share each weight vector
// loaded (S::WIDE of them a pass in calls of up to WIDE_ROWS). `S` (int8.cpp, int4.cpp, int5.cpp) provides
// pass<R, T, Fetch>(a, n0, m, out): R activation rows' lanes against the T tiles from row n0 into
// out[t * R + r] (`Fetch`: prefetch the tiles that follow), and lone<D>(a, n, m, o): y[m, n] for a row past
// the last whole tile.
// Calls of at most this many activation rows go S::WIDE rows a pass (WIDE_MR), more go MR a pass.
constexpr int64_t WIDE_ROWS = 16;

// y[:, n0 .. N]: the rows past the last whole tile, one output at a time (S::lone), shared by the team.
template <int D, class S> void lone_rows(const S& s, const Activations& a, int64_t n0, int64_t N, Out o) {
  const int64_t M = a.M;
  if (n0 >= N) return;
#pragma omp for schedule(static) collapse(2)
  for (int64_t n = n0; n < N; n++)
    for (int64_t m = 0; m < M; m++) s.template lone<D>(a, n, m, o);
}

// This thread's even share [first, last) of `tiles`, inside an OpenMP team. The team's own size, not
// omp_get_max_threads(): a team may be smaller (nested, dynamic), and a thread taking two shares would
// double the step's time. Threads past the tiles get none.
inline std::pair<int64_t, int64_t> my_share(int64_t tiles) {
  const int64_t shares = std::max<int64_t>(1, std::min<int64_t>(omp_get_num_threads(), tiles));
  const int64_t p = std::min<int64_t>(omp_get_thread_num(), shares);
  return {tiles * p / shares, tiles * std::min(p + 1, shares) / shares};
}

// One of the weights a call multiplies the same activations by: its scheme's operands, and its N outputs,
// which start at column `col` of y's rows. A decode step's q, k and v projections are one call of three
// parts, its gate and up projections one of two: one team, the activations quantized once, where separate
// calls paid a team's start and end, and the quantization, each (SmolLM2-135M's int8 linears at one row,
// in C on an AMD EPYC Zen 4: 4.6 ms a step against 5.2; artifacts/bench/epyc-zen4/fused/).
template <class S> struct Part {
  S s;
  int64_t N, col;
};

// This thread's share of y (M, ld) = the parts side by side: the parts' tiles, in order, cut into one even
// share per thread, each share's tiles of a part as above, then each part's rows past its last whole tile.
template <int D, class S>
void gemm_team(const Part<S>* parts, int64_t count, const Activations& a, void* y, int64_t ld) {
  const int64_t M = a.M, chunk = 64, step = tiles_a_pass(1, S::CHAINS);
  int64_t tiles = 0;
  for (int64_t p = 0; p < count; p++) tiles += parts[p].N / TILE;
  const auto [first, last] = my_share(tiles);
  for (int64_t p = 0, base = 0; p < count; base += parts[p].N / TILE, p++) {
    const S& s = parts[p].s;
    const Out o{y, ld, parts[p].col};
    const int64_t t1 = std::min(last - base, parts[p].N / TILE);
    for (int64_t t0 = std::max<int64_t>(first - base, 0); t0 < t1; t0 += step) {
      const int64_t span = std::min(step, t1 - t0);  // tiles
      if (M <= WIDE_ROWS)  // a decode step's rows: its weights read once for up to S::WIDE rows
        rows<D, S::WIDE, ONE_TILE_DECODE>(s, a, t0 * TILE, span, 0, M, o, true);
      else
        for (int64_t m0 = 0; m0 < M; m0 += chunk)
          rows<D, MR, false>(s, a, t0 * TILE, span, m0, std::min(M, m0 + chunk), o, m0 == 0);
    }
  }
  for (int64_t p = 0; p < count; p++)
    lone_rows<D>(parts[p].s, a, parts[p].N / TILE * TILE, parts[p].N, Out{y, ld, parts[p].col});
}

// Rows times blocks of 32 up to which each thread of a team quantizes every row into its own scratch: no
// thread then waits for another's share. In libgomp every barrier costs its last thread a futex wake (a
// system call); a SmolLM2-135M int4 step at one row made 176 teams and 162 barriers, 514 futex calls.
constexpr int64_t OWN_BLOCKS = 64;

// x (M, K) quantized, then `then(a, own)` with the activations `a`, in one OpenMP team. Few rows (OWN_BLOCKS;
// `own`: the caller's parts allow it): each thread quantizes them all into its own scratch(), the same
// bits. More: the threads quantize a share of the rows each into the calling thread's, then (all rows
// done) compute their shares of y. A decode step makes ~130 calls; quantized by the calling thread alone,
// the other waited (Gemma 3 270M int8 at 8 rows: about 1 ms a step).
template <class Then>
int32_t quantized_team(const void* x, int32_t dtype, int64_t M, int64_t K, int64_t ldx, bool own, Then then) {
  Activations& shared = scratch();
  if (!prepare(dtype, M, K, shared)) return BAD_DTYPE;
  own = own && M * shared.nb <= OWN_BLOCKS;
#pragma omp parallel
  {
    Activations& a = own ? scratch() : shared;
    if (own) prepare(dtype, M, K, a);
    quantize_rows(x, dtype, ldx, a, own);
    then(static_cast<const Activations&>(a), own);
  }
  return OK;
}

}  // namespace aotpack
