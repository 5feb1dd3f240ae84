// Tried, not kept (see results.txt): 8x3 dpbf16 tiles over K = 640 (runs, masked loads, fetch two tiles ahead), their
// accumulators 512-bit with the 16-lane sums (Z) against 256-bit, 16 columns a step, with 8-lane sums (Y).
// g++ -O3 -march=native -std=c++17 ymm.cpp -o ymm && ./ymm   (G 512-bit vdpbf16ps equivalents a second, one core)
#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
constexpr int R = 8, C = 3, K = 640;
inline __m512 halves(__m512 a, __m512 b) { return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE)); }
inline __m512 quarters(__m512 a, __m512 b) { return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x88), _mm512_shuffle_f32x4(a, b, 0xDD)); }
inline __m512 pairs(__m512 a, __m512 b) { return _mm512_add_ps(_mm512_shuffle_ps(a, b, 0x44), _mm512_shuffle_ps(a, b, 0xEE)); }
inline __m512 fin(__m512 a, __m512 b) { return _mm512_add_ps(_mm512_shuffle_ps(a, b, 0x88), _mm512_shuffle_ps(a, b, 0xDD)); }
inline __m512 sums16(const __m512* v) {
  const __m512 a = pairs(quarters(halves(v[0], v[1]), halves(v[2], v[3])), quarters(halves(v[4], v[5]), halves(v[6], v[7])));
  const __m512 b = pairs(quarters(halves(v[8], v[9]), halves(v[10], v[11])), quarters(halves(v[12], v[13]), halves(v[14], v[15])));
  return fin(a, b);
}
// 8 ymm -> 8 sums: (lo128 + hi128), then (0+2, 1+3), then (0+1)
inline __m256 q8(__m256 a, __m256 b) { return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31)); }
inline __m256 p8(__m256 a, __m256 b) { return _mm256_add_ps(_mm256_shuffle_ps(a, b, 0x44), _mm256_shuffle_ps(a, b, 0xEE)); }
inline __m256 f8(__m256 a, __m256 b) { return _mm256_add_ps(_mm256_shuffle_ps(a, b, 0x88), _mm256_shuffle_ps(a, b, 0xDD)); }
inline __m256 sums8(const __m256* v) {
  return f8(p8(q8(v[0], v[1]), q8(v[2], v[3])), p8(q8(v[4], v[5]), q8(v[6], v[7])));
}
inline __m128i round8(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff))), 16);
  return _mm256_cvtepi32_epi16(r);
}
inline __m256i round16(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff))), 16);
  return _mm512_cvtepi32_epi16(r);
}
template <bool Y>
__attribute__((noinline)) void run(const uint16_t* w, const uint16_t* xs, int64_t tiles, uint16_t* y, int64_t N) {
  for (int64_t t = 0; t < tiles; t++) {
    const uint16_t* wc[C]; for (int c = 0; c < C; c++) wc[c] = w + (t + c * tiles) * K;
    if constexpr (!Y) {
      __m512 acc[R][C];
#pragma GCC unroll 8
      for (int r = 0; r < R; r++)
#pragma GCC unroll 3
        for (int c = 0; c < C; c++) acc[r][c] = _mm512_setzero_ps();
      for (int64_t k = 0; k < K; k += 32) {
        for (int c = 0; c < C; c++) _mm_prefetch((const char*)(wc[c] + 2 * K + k), _MM_HINT_T1);
        const __mmask32 take = K - k >= 32 ? ~__mmask32(0) : __mmask32((1u << (K - k)) - 1);
        __m512bh wv[C];
        for (int c = 0; c < C; c++) wv[c] = __m512bh(_mm512_maskz_loadu_epi16(take, wc[c] + k));
        for (int r = 0; r < R; r++) {
          __m512i xv = _mm512_loadu_si512(xs + k * R + r * 32);
          asm("" : "+v"(xv));
          for (int c = 0; c < C; c++) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], __m512bh(xv), wv[c]);
        }
      }
      __m512 v[32];
#pragma GCC unroll 24
      for (int i = 0; i < 24; i++) v[i] = acc[i / C][i % C];
#pragma GCC unroll 8
      for (int i = 24; i < 32; i++) v[i] = _mm512_setzero_ps();
      alignas(32) uint16_t lanes[32];
      _mm256_store_si256((__m256i*)lanes, round16(sums16(v)));
      _mm256_store_si256((__m256i*)(lanes + 16), round16(sums16(v + 16)));
#pragma GCC unroll 24
      for (int i = 0; i < 24; i++) y[(i / C) * N + t + (i % C) * tiles] = lanes[i];
    } else {
      __m256 acc[R][C];
#pragma GCC unroll 8
      for (int r = 0; r < R; r++)
#pragma GCC unroll 3
        for (int c = 0; c < C; c++) acc[r][c] = _mm256_setzero_ps();
      for (int64_t k = 0; k < K; k += 16) {
        if ((k & 31) == 0) for (int c = 0; c < C; c++) _mm_prefetch((const char*)(wc[c] + 2 * K + k), _MM_HINT_T1);
        const __mmask16 take = K - k >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (K - k)) - 1);
        __m256bh wv[C];
        for (int c = 0; c < C; c++) wv[c] = __m256bh(_mm256_maskz_loadu_epi16(take, wc[c] + k));
        for (int r = 0; r < R; r++) {
          __m256i xv = _mm256_loadu_si256((const __m256i*)(xs + k * R + r * 16));
          asm("" : "+v"(xv));
          for (int c = 0; c < C; c++) acc[r][c] = _mm256_dpbf16_ps(acc[r][c], __m256bh(xv), wv[c]);
        }
      }
      __m256 v[24];
#pragma GCC unroll 24
      for (int i = 0; i < 24; i++) v[i] = acc[i / C][i % C];
      alignas(16) uint16_t lanes[24];
      _mm_store_si128((__m128i*)lanes, round8(sums8(v)));
      _mm_store_si128((__m128i*)(lanes + 8), round8(sums8(v + 8)));
      _mm_store_si128((__m128i*)(lanes + 16), round8(sums8(v + 16)));
#pragma GCC unroll 24
      for (int i = 0; i < 24; i++) y[(i / C) * N + t + (i % C) * tiles] = lanes[i];
    }
  }
}
template <bool Y> void bench(const char* name, int64_t tiles) {
  const int64_t N = 3 * tiles;
  uint16_t* w = (uint16_t*)aligned_alloc(64, N * K * 2); for (int64_t i = 0; i < N * K; i++) w[i] = 0x3f80 + (rand() & 63);
  uint16_t* xs = (uint16_t*)aligned_alloc(64, R * K * 2); for (int64_t i = 0; i < R * K; i++) xs[i] = 0x3f80 + (rand() & 63);
  uint16_t* y = (uint16_t*)aligned_alloc(64, R * N * 2);
  int reps = 300000 / tiles;
  run<Y>(w, xs, tiles, y, N);
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; i++) run<Y>(w, xs, tiles, y, N);
  double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  printf("%s tiles %ld (%ld KB): %.3f G zmm-dpbf16/s  y %d\n", name, tiles, N * K * 2 / 1024, reps * tiles * R * C * (K / 32) / dt / 1e9, y[5]);
}
int main() {
  for (int rep = 0; rep < 2; rep++)
    for (int64_t tiles : {16, 256, 1024}) { bench<false>("Z zmm", tiles); bench<true>("Y ymm", tiles); }
}
