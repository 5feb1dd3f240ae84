// How many 512-bit vdpbf16ps (32 bf16 products) and vfmadd231ps (16 fp32 products) a core issues a second: 8
// independent chains held in named registers. (../dpbf16/peak.cpp kept its 24 chains in an array that GCC left
// in memory: it timed stores and reloads, 1.66 G a second for both.)
//   g++ -O2 -march=native peak.cpp -o peak && (taskset -c 0 ./peak & taskset -c 1 ./peak; wait)
#include <immintrin.h>

#include <chrono>
#include <cstdio>

template <class Step> double rate(Step step) {
  const long n = 100000000;
  const auto start = std::chrono::steady_clock::now();
  const float sink = step(n);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return n * 8 / s / 1e9 + sink * 0;
}

int main() {
  const double bf16 = rate([](long n) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    const __m512bh x = (__m512bh)_mm512_set1_epi16(0x3f80), y = (__m512bh)_mm512_set1_epi16(0x3000);
    for (long k = 0; k < n; k++) {
      a0 = _mm512_dpbf16_ps(a0, x, y), a1 = _mm512_dpbf16_ps(a1, x, y), a2 = _mm512_dpbf16_ps(a2, x, y);
      a3 = _mm512_dpbf16_ps(a3, x, y), a4 = _mm512_dpbf16_ps(a4, x, y), a5 = _mm512_dpbf16_ps(a5, x, y);
      a6 = _mm512_dpbf16_ps(a6, x, y), a7 = _mm512_dpbf16_ps(a7, x, y);
      __asm__ volatile("" : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4), "+v"(a5), "+v"(a6), "+v"(a7));
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                                              _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7))));
  });
  const double fma = rate([](long n) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    const __m512 x = _mm512_set1_ps(1e-9f), y = _mm512_set1_ps(1.0f);
    for (long k = 0; k < n; k++) {
      a0 = _mm512_fmadd_ps(x, y, a0), a1 = _mm512_fmadd_ps(x, y, a1), a2 = _mm512_fmadd_ps(x, y, a2);
      a3 = _mm512_fmadd_ps(x, y, a3), a4 = _mm512_fmadd_ps(x, y, a4), a5 = _mm512_fmadd_ps(x, y, a5);
      a6 = _mm512_fmadd_ps(x, y, a6), a7 = _mm512_fmadd_ps(x, y, a7);
      __asm__ volatile("" : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4), "+v"(a5), "+v"(a6), "+v"(a7));
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                                              _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7))));
  });
  std::printf("zmm vdpbf16ps %.2f G a second (%.0f G bf16 products), zmm vfmadd231ps %.2f G (%.0f G fp32 products)\n",
              bf16, bf16 * 32, fma, fma * 16);
}
