// The 8-row dpbf16 step loop alone (3 weight rows, 8 packed activation rows, 24 chains), weights looped from L1,
// L2 or L3, adjacent rows or runs, with or without prefetcht1: G vdpbf16ps a second.  g++ -O3 -march=native mb.cpp
#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
// R x C accumulators; per step C weight loads (stride K) + R x loads (packed), all from buffers of given sizes
template <int R, int C, bool PF, bool RUNS = false>
__attribute__((noinline)) float run(const uint16_t* w, const uint16_t* xs, int64_t K, int64_t tiles, int64_t wrap) {
  __m512 tot = _mm512_setzero_ps();
  for (int64_t t = 0; t < tiles; t++) {
    const uint16_t* wt = RUNS ? w + (t % wrap) * K : w + (t % wrap) * C * K;
    const int64_t apart = RUNS ? wrap * K : K;
    __m512 acc[R][C];
    for (int r = 0; r < R; r++) for (int c = 0; c < C; c++) acc[r][c] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k += 32) {
      if (PF) for (int c = 0; c < C; c++) _mm_prefetch((const char*)(wt + (RUNS ? K : C * K) + c * apart + k), _MM_HINT_T1);
      __m512bh wv[C];
      for (int c = 0; c < C; c++) wv[c] = __m512bh(_mm512_loadu_si512(wt + c * apart + k));
      for (int r = 0; r < R; r++) {
        __m512i xv = _mm512_loadu_si512(xs + k * R + r * 32);
        asm("" : "+v"(xv));
        for (int c = 0; c < C; c++) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], __m512bh(xv), wv[c]);
      }
    }
    for (int r = 0; r < R; r++) for (int c = 0; c < C; c++) tot = _mm512_add_ps(tot, acc[r][c]);
  }
  return _mm512_reduce_add_ps(tot);
}
template <int R, int C, bool PF = false, bool RUNS = false> void bench(const char* name, int64_t wrap) {
  const int64_t K = 640;
  uint16_t* w = (uint16_t*)aligned_alloc(64, wrap * C * K * 2); for (int64_t i = 0; i < wrap * C * K; i++) w[i] = 0x3f80 + (rand() & 63);
  uint16_t* xs = (uint16_t*)aligned_alloc(64, R * K * 2); for (int64_t i = 0; i < R * K; i++) xs[i] = 0x3f80 + (rand() & 63);
  const int64_t tiles = 200000;
  run<R, C, PF, RUNS>(w, xs, K, 1000, wrap);
  auto t0 = std::chrono::steady_clock::now();
  float s = run<R, C, PF, RUNS>(w, xs, K, tiles, wrap);
  double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  printf("%s wrap %ld (%ld KB): %.2f G dpbf16/s %g\n", name, wrap, wrap * C * K * 2 / 1024, tiles * R * C * (K / 32) / dt / 1e9, s);
}
int main() {
  for (int64_t wrap : {64, 256, 1024}) {
    bench<8, 3>("R8C3", wrap);
    bench<8, 3, true>("R8C3pf", wrap);
    bench<8, 3, false, true>("R8C3runs", wrap);
    bench<8, 3, true, true>("R8C3runspf", wrap);
  }
}
