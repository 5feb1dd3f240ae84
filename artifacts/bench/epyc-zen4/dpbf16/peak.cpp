// vdpbf16ps and vfmadd231ps on 512-bit registers, 24 independent chains a loop: instructions a second on one core.
// g++ -O2 -march=native peak.cpp -o peak && ./peak
#include <immintrin.h>
#include <chrono>
#include <cstdio>
// throughput of vdpbf16ps zmm / ymm and vfmadd zmm with 24 independent chains
template <int N> __attribute__((noinline)) float run_bf(long iters) {
  __m512 acc[N]; for (int i = 0; i < N; i++) acc[i] = _mm512_setzero_ps();
  __m512i a = _mm512_set1_epi16(0x3f80), b = _mm512_set1_epi16(0x3f80);
  for (long it = 0; it < iters; it++) {
    asm("" : "+v"(a), "+v"(b));
    for (int i = 0; i < N; i++) acc[i] = _mm512_dpbf16_ps(acc[i], (__m512bh)a, (__m512bh)b);
  }
  float s = 0; for (int i = 0; i < N; i++) s += _mm512_reduce_add_ps(acc[i]); return s;
}
template <int N> __attribute__((noinline)) float run_fma(long iters) {
  __m512 acc[N]; for (int i = 0; i < N; i++) acc[i] = _mm512_setzero_ps();
  __m512 a = _mm512_set1_ps(1e-9f), b = _mm512_set1_ps(1.0f);
  for (long it = 0; it < iters; it++) {
    asm("" : "+v"(a), "+v"(b));
    for (int i = 0; i < N; i++) acc[i] = _mm512_fmadd_ps(a, b, acc[i]);
  }
  float s = 0; for (int i = 0; i < N; i++) s += _mm512_reduce_add_ps(acc[i]); return s;
}
int main() {
  long iters = 100000000;
  for (int rep = 0; rep < 2; rep++) {
    auto t0 = std::chrono::steady_clock::now();
    float s1 = run_bf<24>(iters);
    auto t1 = std::chrono::steady_clock::now();
    float s2 = run_fma<24>(iters);
    auto t2 = std::chrono::steady_clock::now();
    double d1 = std::chrono::duration<double>(t1 - t0).count(), d2 = std::chrono::duration<double>(t2 - t1).count();
    printf("dpbf16 zmm: %.2f G instr/s (%.1f GMAC/s)  fma zmm: %.2f G instr/s (%.1f GMAC/s) %g %g\n",
           24 * iters / d1 / 1e9, 24 * iters * 32 / d1 / 1e9, 24 * iters / d2 / 1e9, 24 * iters * 16 / d2 / 1e9, s1, s2);
  }
}
