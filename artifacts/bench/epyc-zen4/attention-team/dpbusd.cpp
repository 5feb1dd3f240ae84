// How many zmm `vpdpbusd` a core issues a cycle: independent accumulator chains, each a dependent chain of
// dot products (latency 4 on AMD EPYC Zen 4). 1 chain runs at the latency; 4 chains reach the throughput.
// Zen 4, 2026-12-07: 1 chain 0.92, 2 chains 1.84, 4 chains 3.67 G a second (a core at ~3.7 GHz: one a cycle).
//   g++ -O2 -march=native dpbusd.cpp -o dpbusd && ./dpbusd
#include <immintrin.h>

#include <chrono>
#include <cstdio>

template <int C> double rate() {
  __m512i acc[C];
  for (int i = 0; i < C; i++) acc[i] = _mm512_set1_epi32(i);
  const __m512i w = _mm512_set1_epi8(3), x = _mm512_set1_epi8(5);
  const long n = 240000000 / C;
  const auto start = std::chrono::steady_clock::now();
  for (long k = 0; k < n; k++) {
#pragma GCC unroll 16
    for (int i = 0; i < C; i++) {
      acc[i] = _mm512_dpbusd_epi32(acc[i], w, x);
      __asm__ volatile("" : "+v"(acc[i]));  // kept in its register, not folded into one chain
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  int sum = 0;
  for (int i = 0; i < C; i++) sum += _mm512_cvtsi512_si32(acc[i]);
  return n * C / seconds / 1e9 + sum * 0;
}

int main() {
  std::printf("zmm vpdpbusd, G a second: 1 chain %.2f, 2 chains %.2f, 4 chains %.2f\n", rate<1>(), rate<2>(), rate<4>());
}
