// aotpack's decode attention: a few query rows per key/value head against a cache that streams from
// memory once.
//
// A decode step's attention multiplies R = G * T query rows of each key/value head (G query heads a KV
// head, T tokens a row: 1, a verify step's k + 1, a chunk's C) into the S cached keys and values of that
// head. It is bound by reading the cache: R * S * D multiply-adds over 2 * S * D values. ATen's CPU flash
// kernel, which the `grouped` candidate calls, runs each (row, head) through MKL's sgemm, which copies
// (packs) every key and value block before multiplying it: 2,048 slots, 8 rows of Gemma 3 270M, a layer
// took 570-770 us (22-29 GB/s) where its weights stream at 50-60 GB/s; and one row of one KV head is one
// task, so at batch 1 a single thread read the whole cache.
// Here each task is a (row, KV head, range of keys): every key is read once and multiplied into the R
// query rows from L1, its softmax weights computed for the range, and every value is read once and added
// into R accumulators. A task reads only the keys its row's tokens see, first to last (plan), so a short row
// stepped beside a long one reads its own keys. With fewer (row, head) pairs than twice the threads, the keys
// are split into ranges whose partial results (each row's max, sum and weighted values) are combined after,
// as flash decoding does. Sums are fp32 whatever the cache's dtype; a query row that sees no key (all
// masked) gets zeros, and a masked slot's key and value never reach the output, whatever they hold (a stale
// NaN included).
#include "quant_common.h"
#include "shim_common.h"

#include <omp.h>

#include <cmath>
#include <limits>

namespace aotpack {
namespace {

constexpr int64_t MIN_RANGE = 128;  // keys a split range holds at least: fewer, and combining costs more than it saves
// keys a range holds at most: a task keeps R scores a key of its range (thread_local, kept between calls), so
// this bounds a thread's scores at R * MAX_RANGE floats whatever the cache (a 16-token chunk of 4 query heads
// a KV head: 512 KB), and a range's scores stay in L2 between the keys' pass and the values'
constexpr int64_t MAX_RANGE = 2048;

struct Strided {  // a (B, KV, S, D) or (B, 1, T, S) tensor's element strides (a mask's: b, t, s; sd unused)
  const void* data;
  int32_t kind;
  int64_t sb, sh, ss, sd = 1;
};

// The widest float vector this build has: 16 lanes with AVX-512, 8 with AVX2, else 1 (plain floats).
#if defined(__AVX512F__) && defined(AOTPACK_AVX2)
using vec = __m512;
constexpr int64_t L = 16;
inline vec vload(const float* p) { return _mm512_loadu_ps(p); }
inline void vstore(float* p, vec v) { _mm512_storeu_ps(p, v); }
inline vec vset(float x) { return _mm512_set1_ps(x); }
inline vec vzero() { return _mm512_setzero_ps(); }
inline vec vfma(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
inline __m256 halves(vec v) {  // the sum of v's two 256-bit halves
  return _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
}
inline float vsum(vec v) { return hsum(halves(v)); }  // GCC 12's _mm512_reduce_add_ps warns of an uninitialized value
inline __m256 narrow(vec v) { return halves(v); }
#elif defined(AOTPACK_AVX2)
using vec = __m256;
constexpr int64_t L = 8;
inline vec vload(const float* p) { return _mm256_loadu_ps(p); }
inline void vstore(float* p, vec v) { _mm256_storeu_ps(p, v); }
inline vec vset(float x) { return _mm256_set1_ps(x); }
inline vec vzero() { return _mm256_setzero_ps(); }
inline vec vfma(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }
inline float vsum(vec v) { return hsum(v); }
inline __m256 narrow(vec v) { return v; }
#else
using vec = float;
constexpr int64_t L = 1;
inline vec vload(const float* p) { return *p; }
inline void vstore(float* p, vec v) { *p = v; }
inline vec vset(float x) { return x; }
inline vec vzero() { return 0.0f; }
inline vec vfma(vec a, vec b, vec c) { return a * b + c; }
inline float vsum(vec v) { return v; }
#endif

// e^(x[i] - m) in place; returns their sum. 0 where x[i] is -inf (a masked score).
#if defined(AOTPACK_AVX2)
// e^x for 8 lanes (Cephes' expf: range reduction by ln 2 in two parts, a degree-5 polynomial, 2^n from the
// exponent bits), about 2 ulp; 0 below -87.3, where e^x is under FLT_MIN; NaN stays NaN (max and min
// return their second operand when either is NaN).
inline __m256 exp8(__m256 x) {
  const __m256 low = _mm256_set1_ps(-87.3f);
  const __m256 under = _mm256_cmp_ps(x, low, _CMP_LT_OQ);
  x = _mm256_min_ps(_mm256_set1_ps(88.3f), _mm256_max_ps(low, x));
  __m256 fx = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
  const __m256i n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(fx), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(under, _mm256_mul_ps(y, _mm256_castsi256_ps(n)));
}

inline float exp_shifted(float* x, int64_t n, float m) {
  const __m256 mv = _mm256_set1_ps(m);
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), mv));
    _mm256_storeu_ps(x + i, e);
    acc = _mm256_add_ps(acc, e);
  }
  float s = hsum(acc);
  for (; i < n; i++) s += (x[i] = std::exp(x[i] - m));
  return s;
}
#else
inline float exp_shifted(float* x, int64_t n, float m) {
  float s = 0.0f;
  for (int64_t i = 0; i < n; i++) s += (x[i] = std::exp(x[i] - m));
  return s;
}
#endif

// The larger of a and b, NaN if either is (std::max keeps a when b is NaN): a NaN score (a NaN in q or in
// a key seen) makes its row NaN, as SDPA's would be, on every instruction path.
inline float nan_max(float a, float b) { return (b > a || b != b) ? b : a; }

// The largest of x[0 .. n), NaN if any is (nan_max's), -inf for none; 8 at a time where the build has AVX2
// (one after another, the compare-and-select chain took 6 % of SmolLM2's attention at 1,500 keys).
inline float row_max(const float* x, int64_t n) {
  float top = -std::numeric_limits<float>::infinity();
  int64_t i = 0;
#if defined(AOTPACK_AVX2)
  if (n >= 8) {
    __m256 most = _mm256_set1_ps(top), nan = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) {
      const __m256 v = _mm256_loadu_ps(x + i);
      most = _mm256_max_ps(most, v);
      nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    }
    if (_mm256_movemask_ps(nan)) return std::numeric_limits<float>::quiet_NaN();
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, most);
    for (float v : lanes) top = nan_max(top, v);
  }
#endif
  for (; i < n; i++) top = nan_max(top, x[i]);
  return top;
}

// y (D) += p * x (D)
inline void axpy(float p, const float* x, float* y, int64_t D) {
  const vec pv = vset(p);
  int64_t d = 0;
  for (; d + L <= D; d += L) vstore(y + d, vfma(pv, vload(x + d), vload(y + d)));
  for (; d < D; d++) y[d] += p * x[d];
}

// n contiguous half-precision values (bf16 or fp16) from `x` widened to fp32 into y: exact, so every path
// gets the same floats; a vector at a time where the build has one (element by element, a bf16 cache made
// the kernel 2-2.7x slower than ATen's flash kernel on an Intel Xeon).
template <int Q> inline void widen(const uint16_t* x, int64_t n, float* y) {
  int64_t d = 0;
#if defined(__AVX512F__) && defined(AOTPACK_AVX2)
  for (; d + 16 <= n; d += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + d));
    if constexpr (Q == BF16) _mm512_storeu_ps(y + d, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)));
    else _mm512_storeu_ps(y + d, _mm512_cvtph_ps(h));
  }
#elif defined(AOTPACK_AVX2)
  for (; d + 8 <= n; d += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + d));
    if constexpr (Q == BF16) _mm256_storeu_ps(y + d, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)));
    else _mm256_storeu_ps(y + d, _mm256_cvtph_ps(h));
  }
#endif
  for (; d < n; d++) y[d] = load_as_f32<Q>(x, d);
}

// Row `s` of head (b, h) of a cache view as fp32: in place for contiguous fp32, else converted into `buffer`.
inline const float* cached_row(const Strided& t, int64_t b, int64_t h, int64_t s, int64_t D, float* buffer) {
  const int64_t at = b * t.sb + h * t.sh + s * t.ss;
  if (t.sd == 1) {
    if (t.kind == F32) return static_cast<const float*>(t.data) + at;
    const uint16_t* x = static_cast<const uint16_t*>(t.data) + at;
    if (t.kind == BF16) widen<BF16>(x, D, buffer);
    else widen<F16>(x, D, buffer);
    return buffer;
  }
  for (int64_t d = 0; d < D; d++) {
    const int64_t i = at + d * t.sd;
    buffer[d] = t.kind == F32 ? load_as_f32<F32>(t.data, i) : t.kind == BF16 ? load_as_f32<BF16>(t.data, i) : load_as_f32<F16>(t.data, i);
  }
  return buffer;
}

// Rows [s, s + n) of head (b, h) of a cache view, each of their lines fetched into L2 ahead of the pass that reads
// them: a task's keys and values stream from memory in runs of a few KB, which the hardware prefetcher alone
// read at 15-16 GB/s where the weights stream at 30-55 (Gemma 3's shapes, 2,000 keys, AMD EPYC Zen 4, 2
// threads: 8 rows' attention 2.14 -> 1.80 ms, one row's 275 -> 200 us; into L1, in bursts, no faster).
// Contiguous rows only (a row of any other view is a scatter of values, not lines).
inline void fetch_rows(const Strided& t, int64_t b, int64_t h, int64_t s, int64_t n, int64_t D) {
  if (t.sd != 1) return;
  const int64_t size = t.kind == F32 ? 4 : 2;
  for (int64_t i = 0; i < n; i++) {
    const char* row = static_cast<const char*>(t.data) + (b * t.sb + h * t.sh + (s + i) * t.ss) * size;
    for (int64_t at = 0; at < D * size; at += 64) prefetch_l2(row + at);
  }
}

struct Shape {
  int64_t B, KV, R, T, S, D;
};

constexpr int64_t KEYS = 4;  // keys a query row's vector load feeds (4 independent FMA chains)
constexpr int64_t KEYS_AHEAD = 32;  // how far ahead of the keys' pass their rows are fetched (fetch_rows)
constexpr int64_t TILE_KEYS = 32;  // values a tile holds: fp32 rows of Gemma's D = 256, 32 KB, stay in L1 across rows
constexpr int64_t EARLY_VALUES = 256 << 10;  // bytes of a range's values fetched during its keys' pass, at most
constexpr int64_t BLOCK_VECS = 4;  // vectors of one output row a value tile is added into, in registers

// The sums of the KEYS vectors acc, into out: one reduction for the four (a key's sum alone took as many
// shuffles and adds as its 64-wide dot's multiplies: SmolLM2's D = 64; with both changes here, its 1,536
// keys at one row 160 -> 147 us a call, Gemma 3's at 8 rows 1,474 -> 1,385, AMD EPYC Zen 4, cold).
inline void vsums(const vec* acc, float* out) {
#if defined(AOTPACK_AVX2)
  static_assert(KEYS == 4, "one _mm256_hadd_ps tree sums four keys");
  const __m256 ab = _mm256_hadd_ps(narrow(acc[0]), narrow(acc[1])), cd = _mm256_hadd_ps(narrow(acc[2]), narrow(acc[3]));
  const __m256 all = _mm256_hadd_ps(ab, cd);  // lanes: a, b, c, d of the low 128 bits, then of the high
  _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(all), _mm256_extractf128_ps(all, 1)));
#else
  for (int64_t i = 0; i < KEYS; i++) out[i] = vsum(acc[i]);
#endif
}

// scores (n <= KEYS keys) of query row qr (D) against keys[0 .. n), each scaled
inline void dots(const float* qr, const float* const* keys, int64_t n, int64_t D, float scale, float* out) {
  vec acc[KEYS];
  for (int64_t i = 0; i < KEYS; i++) acc[i] = vzero();
  int64_t d = 0;
  if (n == KEYS) {  // a whole group, its count fixed: with n a variable GCC tested it at every key of every
    // vector (three compares and branches a vector; Gemma 3's 8 rows of 1,536 keys in cache 705 -> 652 us a
    // call, cold 1-5 % faster; AMD EPYC Zen 4, 2 threads; same bits)
    static_assert(KEYS == 4, "four named keys");
    const float *k0 = keys[0], *k1 = keys[1], *k2 = keys[2], *k3 = keys[3];
    for (; d + L <= D; d += L) {
      const vec qv = vload(qr + d);
      acc[0] = vfma(qv, vload(k0 + d), acc[0]);
      acc[1] = vfma(qv, vload(k1 + d), acc[1]);
      acc[2] = vfma(qv, vload(k2 + d), acc[2]);
      acc[3] = vfma(qv, vload(k3 + d), acc[3]);
    }
  } else {
    for (; d + L <= D; d += L) {
      const vec qv = vload(qr + d);
      for (int64_t i = 0; i < n; i++) acc[i] = vfma(qv, vload(keys[i] + d), acc[i]);
    }
  }
  float sums[KEYS];
  vsums(acc, sums);
  for (int64_t i = 0; i < n; i++) {
    float s = sums[i];
    for (int64_t e = d; e < D; e++) s += qr[e] * keys[i][e];
    out[i] = s * scale;
  }
}

// o (D) += sum over the tile's n values of p[s] * values[s] (D), BLOCK_VECS vectors of o in registers at a time
inline void weighted(const float* p, const float* const* values, int64_t n, int64_t D, float* o) {
  int64_t d = 0;
  for (; d + BLOCK_VECS * L <= D; d += BLOCK_VECS * L) {
    vec acc[BLOCK_VECS];
    for (int64_t j = 0; j < BLOCK_VECS; j++) acc[j] = vload(o + d + j * L);
    for (int64_t s = 0; s < n; s++) {
      if (p[s] == 0.0f) continue;  // masked: its value (possibly stale, never trusted) is not read
      const vec pv = vset(p[s]);
      for (int64_t j = 0; j < BLOCK_VECS; j++) acc[j] = vfma(pv, vload(values[s] + d + j * L), acc[j]);
    }
    for (int64_t j = 0; j < BLOCK_VECS; j++) vstore(o + d + j * L, acc[j]);
  }
  for (int64_t s = 0; s < n; s++)
    if (p[s] != 0.0f)
      for (int64_t e = d; e < D; e++) o[e] += p[s] * values[s][e];
}

// Rows [s0, s0 + n) of head (b, h) of a cache view as fp32 row pointers: in place for fp32, else
// converted into `buffer` (n, D).
inline void cached_rows(const Strided& t, int64_t b, int64_t h, int64_t s0, int64_t n, int64_t D,
                        std::vector<float>& buffer, const float** rows) {
  if (t.kind != F32 || t.sd != 1) buffer.resize(size_t(n * D));
  for (int64_t i = 0; i < n; i++) rows[i] = cached_row(t, b, h, s0 + i, D, buffer.data() + i * D);
}

// One task: query rows q (R, D) fp32 of head (b, h) against keys [s0, s1). Writes each row's max score
// m (R), its sum of e^(score - m) l (R) and the weighted values o (R, D) (unnormalised).
void attend_range(const float* q, const Strided& k, const Strided& v, const Strided& mask, const Shape& n,
                  int64_t b, int64_t h, int64_t s0, int64_t s1, float scale, float* m, float* l, float* o) {
  const int64_t len = s1 - s0, R = n.R, D = n.D;
  const float minus_inf = -std::numeric_limits<float>::infinity();
  thread_local std::vector<float> scores, converted;
  scores.resize(size_t(R * len));
  const uint8_t* allowed = static_cast<const uint8_t*>(mask.data) + b * mask.sb;
  const float* rows[TILE_KEYS];
  float got[KEYS];
  // the first keys and values, which the passes' own fetches (KEYS_AHEAD, TILE_KEYS ahead) never reach: at a
  // short context they are most of a task's (Gemma 3's shapes at 8 rows, 64 keys, cold: 92 -> 82 us a call;
  // 128 keys 166 -> 155; AMD EPYC Zen 4, 2 threads; artifacts/bench/epyc-zen4/short/)
  // A range whose values fit in L2 with room to spare fetches them during the keys' pass, a few rows a
  // group of keys, so that they arrive while the keys are multiplied: fetched as the values' own pass
  // began, they came in as it waited (AMD EPYC Zen 4, cold, 9 interleaved rounds: SmolLM2-135M's 1,536
  // keys at one row, two ranges of 768, 133 -> 119 us a call; Gemma 3's 8 rows at 64 keys 78 -> 72 us;
  // artifacts/bench/epyc-zen4/attention-team/). Longer ranges' values would leave L2 before their pass.
  const bool early = len * D * (v.kind == F32 ? 4 : 2) <= EARLY_VALUES;
  fetch_rows(k, b, h, s0, std::min(KEYS_AHEAD, len), D);
  if (!early) fetch_rows(v, b, h, s0, std::min(TILE_KEYS, len), D);
  for (int64_t s = 0; s < len; s += KEYS) {
    const int64_t c = std::min(KEYS, len - s);
    cached_rows(k, b, h, s0 + s, c, D, converted, rows);
    if (s + KEYS_AHEAD < len) fetch_rows(k, b, h, s0 + s + KEYS_AHEAD, std::min(c, len - s - KEYS_AHEAD), D);
    if (early) fetch_rows(v, b, h, s0 + s, c, D);
    for (int64_t r = 0; r < R; r++) {
      dots(q + r * D, rows, c, D, scale, got);
      const uint8_t* seen = allowed + (r % n.T) * mask.sh + (s0 + s) * mask.ss;
      for (int64_t i = 0; i < c; i++) scores[size_t(r * len + s + i)] = seen[i * mask.ss] ? got[i] : minus_inf;
    }
  }
  for (int64_t r = 0; r < R; r++) {
    float* sr = scores.data() + r * len;
    const float top = row_max(sr, len);
    m[r] = top;
    l[r] = top == minus_inf ? 0.0f : exp_shifted(sr, len, top);
    if (top == minus_inf) std::fill(sr, sr + len, 0.0f);
  }
  std::fill(o, o + R * D, 0.0f);
  for (int64_t s = 0; s < len; s += TILE_KEYS) {
    const int64_t c = std::min(TILE_KEYS, len - s);
    cached_rows(v, b, h, s0 + s, c, D, converted, rows);
    if (!early && s + TILE_KEYS < len) fetch_rows(v, b, h, s0 + s + TILE_KEYS, std::min(TILE_KEYS, len - s - TILE_KEYS), D);
    for (int64_t r = 0; r < R; r++) weighted(scores.data() + r * len + s, rows, c, D, o + r * D);
  }
}

// Keys a range holds at least where splitting further shares few tasks evenly among the threads.
constexpr int64_t EVEN_RANGE = TILE_KEYS;

// Ranges a pair's `len` seen keys are cut into, `total` keys being seen over all pairs: its share of twice
// the threads' tasks, none shorter than MIN_RANGE keys, none longer than MAX_RANGE.
int64_t splits_of(int64_t len, int64_t total, int64_t threads) {
  const int64_t wanted = total > 0 ? (2 * threads * len + total - 1) / total : 1;
  return std::max<int64_t>({1, (len + MAX_RANGE - 1) / MAX_RANGE, std::min(wanted, len / MIN_RANGE)});
}

// Ranges for `pairs` pairs of `len` keys each (splits_of's). Fewer tasks than 4 a thread that the threads
// cannot share evenly are split further where ranges of EVEN_RANGE keys or more make them even: a short
// context's 3 key/value heads on 2 threads left one thread 2 and the other 1 (SmolLM2-135M at one row: its
// attention took the calling thread twice the other's time).
int64_t even_splits(int64_t pairs, int64_t len, int64_t threads) {
  const int64_t splits = splits_of(len, pairs * len, threads);
  if (pairs * splits % threads == 0 || pairs * splits >= 4 * threads) return splits;
  for (int64_t s = splits + 1; s <= splits * threads && s * EVEN_RANGE <= len; s++)
    if (pairs * s % threads == 0 && (s - 1) * ((len + s - 1) / s) < len) return s;  // no range left empty
  return splits;
}

// The first slot of a mask row (S slots, stride ss) that is set, S for none; 8 slots a load where contiguous.
inline int64_t first_seen(const uint8_t* m, int64_t ss, int64_t S) {
  int64_t s = 0;
  for (uint64_t word; ss == 1 && s + 8 <= S; s += 8) {
    std::memcpy(&word, m + s, 8);
    if (word) break;
  }
  for (; s < S; s++)
    if (m[s * ss]) return s;
  return S;
}

// One past the last slot of a mask row that is set, 0 for none (first_seen's, from the end).
inline int64_t end_seen(const uint8_t* m, int64_t ss, int64_t S) {
  int64_t s = S;
  for (uint64_t word; ss == 1 && s >= 8; s -= 8) {
    std::memcpy(&word, m + s - 8, 8);
    if (word) break;
  }
  for (; s > 0; s--)
    if (m[(s - 1) * ss]) return s;
  return 0;
}

struct Task {  // keys [s0, s1) of one (row, KV head) pair
  int64_t pair, s0, s1;
};

// A call's tasks, pair after pair, and where each pair's start (`first`, pairs + 1 entries). A pair's keys
// are the slots its row's tokens see, first to last (a masked slot inside still is scored -inf): a row at
// 100 tokens stepped beside one at 2,000 reads its 100 keys, not the step's span of 2,000 (the decode
// attention had read every slot of the span and masked those past a row's end), and a left-padded row
// skips its padding. Rows that all see as many keys keep the even split (rows that all see the whole span:
// the tasks, and so the bits, of the kernel before); others split in proportion to their keys, for a
// dynamic schedule to share. Returns whether the split is even.
bool plan(const Shape& n, const Strided& mask, std::vector<Task>& tasks, std::vector<int64_t>& first) {
  const int64_t pairs = n.B * n.KV, threads = omp_get_max_threads();
  thread_local std::vector<std::pair<int64_t, int64_t>> seen;  // each row's [lo, hi)
  seen.assign(size_t(n.B), {n.S, 0});
  int64_t total = 0;
  bool even = true;
  for (int64_t b = 0; b < n.B; b++) {
    auto& [lo, hi] = seen[size_t(b)];
    if (b > 0 && mask.sb == 0) seen[size_t(b)] = seen[0];  // one mask for every row
    else
      for (int64_t t = 0; t < n.T; t++) {
        const uint8_t* row = static_cast<const uint8_t*>(mask.data) + b * mask.sb + t * mask.sh;
        lo = std::min(lo, first_seen(row, mask.ss, n.S)), hi = std::max(hi, end_seen(row, mask.ss, n.S));
      }
    hi = std::max(lo, hi);
    total += (hi - lo) * n.KV;
    even = even && hi - lo == seen[0].second - seen[0].first;
  }
  tasks.clear();
  first.assign(size_t(pairs + 1), 0);
  for (int64_t pair = 0; pair < pairs; pair++) {
    const auto [lo, hi] = seen[size_t(pair / n.KV)];
    const int64_t splits = even ? even_splits(pairs, hi - lo, threads) : splits_of(hi - lo, total, threads);
    const int64_t width = (hi - lo + splits - 1) / splits;
    first[size_t(pair)] = int64_t(tasks.size());
    for (int64_t j = 0; j < splits; j++) tasks.push_back({pair, lo + j * width, std::min(hi, lo + (j + 1) * width)});
  }
  first[size_t(pairs)] = int64_t(tasks.size());
  return even;
}

// Pair `pair`'s R query rows of q (B, KV, R, D) with strides `qs` (any: Inductor lays a custom op's inputs out
// as it likes) as fp32, contiguous, into y (R, D).
template <int Q> void gather_pair(const void* q, const int64_t* qs, const Shape& n, int64_t pair, float* y) {
  const int64_t b = pair / n.KV, h = pair % n.KV;
  for (int64_t r = 0; r < n.R; r++, y += n.D) {
    const int64_t at = b * qs[0] + h * qs[1] + r * qs[2];
    if (Q == F32 && qs[3] == 1) std::memcpy(y, static_cast<const float*>(q) + at, size_t(n.D) * 4);
    else
      for (int64_t d = 0; d < n.D; d++) y[d] = load_as_f32<Q>(q, at + d * qs[3]);
  }
}

// The calling thread's scratch row of D floats. A thread_local declared here, where every thread of a team
// passes: one declared in decode_attention and named inside its parallel region would be constructed on
// the calling thread only, the workers' left unconstructed.
float* scratch_row(int64_t D) {
  thread_local std::vector<float> row;
  row.resize(size_t(D));
  return row.data();
}

// Query row r of pair `pair` from its ranges' results (parts[j], j in [j0, j1): each one's max m, sum l and
// weighted values o, `per` floats a range), on one scale: into y (D), fp32. No key seen: zeros.
void combine(const float* parts, int64_t per, int64_t j0, int64_t j1, int64_t R, int64_t D, int64_t r, float* y) {
  const float minus_inf = -std::numeric_limits<float>::infinity();
  float top = minus_inf, total = 0.0f;
  for (int64_t j = j0; j < j1; j++) top = nan_max(top, parts[j * per + r]);
  std::fill(y, y + D, 0.0f);
  if (top == minus_inf) return;
  for (int64_t j = j0; j < j1; j++) {
    const float* part = parts + j * per;
    const float w = part[r] == minus_inf ? 0.0f : std::exp(part[r] - top);
    total += w * part[R + r];
    if (w != 0.0f) axpy(w, part + 2 * R + r * D, y, D);
  }
  for (int64_t d = 0; d < D; d++) y[d] /= total;
}

}  // namespace

// out (B, KV, R, D), contiguous in q's dtype = softmax(scale * q k^T, masked) v for q (B, KV, R, D)
// (strides qs), k and v (B, KV, S, D), mask (B or 1, 1, T, S) bool: query row r of a head
// is token r % T of its row. One team gathers q, runs the tasks and combines each query row's ranges into
// `out`: gathering and combining had run on the calling thread alone, while the other waited (Gemma 3's
// 8 rows, 4 query heads of 256: 8,192 values each way, a call's serial tail).
int32_t decode_attention(const void* q, int32_t qkind, const int64_t* qs, const Strided& k, const Strided& v,
                         const Strided& mask, const Shape& n, float scale, void* out) {
  if (n.B < 0 || n.KV < 1 || n.R < 1 || n.T < 1 || n.R % n.T || n.S < 1 || n.D < 1) return BAD_SHAPE;
  if (n.B == 0) return OK;  // nothing to compute (and no (row, head) pair to share the threads among)
  if (qkind < F32 || qkind > F16 || k.kind < F32 || k.kind > F16 || v.kind != k.kind) return BAD_DTYPE;
  thread_local std::vector<Task> tasks;
  thread_local std::vector<int64_t> first;
  const bool even = plan(n, mask, tasks, first);
  const int64_t count_tasks = int64_t(tasks.size()), per = n.R * (n.D + 2);  // a task's m (R), l (R), o (R, D)
  const int64_t pairs = n.B * n.KV, R = n.R, D = n.D;
  // the calling thread's buffers (a decode step calls this once a layer), reached through pointers: a
  // thread_local named inside the parallel region would be each worker's own, empty one
  thread_local std::vector<float> q_buffer, parts_buffer;
  q_buffer.resize(size_t(pairs * R * D));
  parts_buffer.resize(size_t(count_tasks * per));
  float *const qf = q_buffer.data(), *const parts = parts_buffer.data();
  const Task* const todo = tasks.data();
  const int64_t* const starts = first.data();
  const auto run = [&](int64_t t) {
    const Task& task = todo[t];
    const int64_t b = task.pair / n.KV, h = task.pair % n.KV;
    float* part = parts + t * per;
    if (task.s0 >= task.s1) {  // an empty range: nothing seen
      std::fill(part, part + R, -std::numeric_limits<float>::infinity());
      std::fill(part + R, part + per, 0.0f);
      return;
    }
    attend_range(qf + task.pair * R * D, k, v, mask, n, b, h, task.s0, task.s1, scale, part, part + R, part + 2 * R);
  };
  const auto gather = [&](int64_t pair) {
    if (qkind == F32) gather_pair<F32>(q, qs, n, pair, qf + pair * R * D);
    else if (qkind == BF16) gather_pair<BF16>(q, qs, n, pair, qf + pair * R * D);
    else gather_pair<F16>(q, qs, n, pair, qf + pair * R * D);
  };
  const auto finish = [&](int64_t i, float* row) {  // query row i: its ranges' results on one scale, into out
    float* y = qkind == F32 ? static_cast<float*>(out) + i * D : row;
    combine(parts, per, starts[i / R], starts[i / R + 1], R, D, i % R, y);
    if (qkind == BF16)
      for (int64_t d = 0; d < D; d++) store_from_f32<BF16>(out, i * D + d, y[d]);
    else if (qkind == F16)
      for (int64_t d = 0; d < D; d++) store_from_f32<F16>(out, i * D + d, y[d]);
  };
  // fewer pairs than twice the threads (one row of a model's few KV heads): gathered and combined here,
  // where sharing so little cost the team more than it saved (one row of Gemma 3 at 64 keys, cold, 2
  // threads: 23.1 against 21.7 us a call; not tuned at more threads)
  const bool shared = pairs >= 2 * omp_get_max_threads();
  if (!shared)
    for (int64_t pair = 0; pair < pairs; pair++) gather(pair);
#pragma omp parallel
  {
    if (shared) {
#pragma omp for schedule(static)
      for (int64_t pair = 0; pair < pairs; pair++) gather(pair);
    }
    if (even) {  // (each loop's end waits below, or is the team's end: one wait, not two)
#pragma omp for schedule(static) nowait
      for (int64_t t = 0; t < count_tasks; t++) run(t);
    } else {  // tasks of unequal lengths: each thread takes the next as it finishes one
#pragma omp for schedule(dynamic, 1) nowait
      for (int64_t t = 0; t < count_tasks; t++) run(t);
    }
    if (shared) {
#pragma omp barrier
      float* const row = scratch_row(D);  // this thread's, for a row in another dtype than fp32
#pragma omp for schedule(static) nowait
      for (int64_t i = 0; i < pairs * R; i++) finish(i, row);
    }
  }
  if (!shared) {
    float* const row = scratch_row(D);
    for (int64_t i = 0; i < pairs * R; i++) finish(i, row);
  }
  return OK;
}

struct Dims {  // a 4-D CPU tensor as the shim reads it
  void* data = nullptr;
  int32_t dtype = -1, kind = -1;
  int64_t size[4] = {}, stride[4] = {};
};

bool dims(AtenTensorHandle t, Dims* d) {
  int64_t dim = 0, *sizes = nullptr, *strides = nullptr;
  int32_t device = -1;
  if (aoti_torch_get_dim(t, &dim) || dim != 4 || aoti_torch_get_sizes(t, &sizes) || aoti_torch_get_strides(t, &strides) ||
      aoti_torch_get_dtype(t, &d->dtype) || aoti_torch_get_data_ptr(t, &d->data) ||
      aoti_torch_get_device_type(t, &device) || device != aoti_torch_device_type_cpu())
    return false;
  std::copy(sizes, sizes + 4, d->size);
  std::copy(strides, strides + 4, d->stride);
  if (d->dtype == aoti_torch_dtype_float32()) d->kind = F32;
  else if (d->dtype == aoti_torch_dtype_bfloat16()) d->kind = BF16;
  else if (d->dtype == aoti_torch_dtype_float16()) d->kind = F16;
  return true;
}

// q (B, KV, R, D); k, v (B, KV, S, D), in one float dtype; mask (B or 1, 1, T, S)
// bool with R a multiple of T.
bool attention_operands(const Dims& q, const Dims& k, const Dims& v, const Dims& m, const Shape& n) {
  const bool kv = k.kind >= 0 && v.kind == k.kind && std::equal(k.size, k.size + 4, v.size) && k.size[0] == n.B &&
                  k.size[1] == n.KV && k.size[3] == n.D;
  const bool mask = m.dtype == aoti_torch_dtype_bool() && (m.size[0] == n.B || m.size[0] == 1) && m.size[1] == 1 &&
                    m.size[3] == n.S && n.T >= 1 && n.R % n.T == 0;
  return q.kind >= 0 && kv && mask;
}

}  // namespace aotpack

extern "C" {

// strides in elements: q's, k's and v's (b, h, r or s, d), the mask's (b, t, s).
int32_t aotpack_decode_attention(const void* q, int32_t qkind, const int64_t* qstrides, const void* k, const void* v, int32_t kvkind,
                                 const int64_t* kstrides, const int64_t* vstrides, const void* mask,
                                 const int64_t* mstrides, int64_t B, int64_t KV, int64_t R, int64_t T, int64_t S,
                                 int64_t D, float scale, void* out) {
  const aotpack::Strided ks{k, kvkind, kstrides[0], kstrides[1], kstrides[2], kstrides[3]};
  const aotpack::Strided vs{v, kvkind, vstrides[0], vstrides[1], vstrides[2], vstrides[3]};
  const aotpack::Strided ms{mask, -1, mstrides[0], mstrides[1], mstrides[2]};
  return aotpack::decode_attention(q, qkind, qstrides, ks, vs, ms, aotpack::Shape{B, KV, R, T, S, D}, scale, out);
}

// What AOTInductor calls for aotpack::decode_attention (runtime.quant.attention): every shape, dtype and
// stride checked here, since AOTInductor checks nothing it passes.
AOTITorchError aoti_torch_cpu_decode_attention(AtenTensorHandle q, AtenTensorHandle k, AtenTensorHandle v,
                                               AtenTensorHandle mask, double scale, AtenTensorHandle* ret0) {
  aotpack::Dims qd, kd, vd, md;
  if (!aotpack::dims(q, &qd) || !aotpack::dims(k, &kd) || !aotpack::dims(v, &vd) || !aotpack::dims(mask, &md))
    return AOTI_TORCH_FAILURE;
  const aotpack::Shape n{qd.size[0], qd.size[1], qd.size[2], md.size[2], kd.size[2], qd.size[3]};
  if (!aotpack::attention_operands(qd, kd, vd, md, n)) return AOTI_TORCH_FAILURE;
  int64_t shape[4] = {n.B, n.KV, n.R, n.D}, strides[4] = {n.KV * n.R * n.D, n.R * n.D, n.D, 1};
  if (aoti_torch_empty_strided(4, shape, strides, qd.dtype, aoti_torch_device_type_cpu(), 0, ret0)) return AOTI_TORCH_FAILURE;
  void* out = nullptr;
  const aotpack::Strided ks{kd.data, kd.kind, kd.stride[0], kd.stride[1], kd.stride[2], kd.stride[3]};
  const aotpack::Strided vs{vd.data, vd.kind, vd.stride[0], vd.stride[1], vd.stride[2], vd.stride[3]};
  const aotpack::Strided ms{md.data, -1, md.size[0] > 1 ? md.stride[0] : 0, md.stride[2], md.stride[3]};
  if (aoti_torch_get_data_ptr(*ret0, &out) ||
      aotpack::decode_attention(qd.data, qd.kind, qd.stride, ks, vs, ms, n, float(scale), out) != aotpack::OK) {
    aoti_torch_delete_tensor_object(*ret0);
    return AOTI_TORCH_FAILURE;
  }
  return AOTI_TORCH_SUCCESS;
}

}  // extern "C"
