// The 8-row int8 pass's instructions alone (one tile, 8 rows, a broadcast per dpbusd, the block's float step), over
// weights of 10 KB to 64 MB (tiles of 16 rows x 640 columns), with and without the next tile's prefetch, one core.
//   g++ -O3 -march=native bc4.cpp -o bc4 && ./bc4
#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <algorithm>
constexpr int NB = 20;
alignas(64) int8_t X[8][NB * 32];
alignas(64) float D[8][NB];
template <bool PF> double run(const uint8_t* W, long tiles, long iters) {
  __m512 acc[8];
  for (int i = 0; i < 8; i++) acc[i] = _mm512_setzero_ps();
  auto t0 = std::chrono::steady_clock::now();
  for (long n = 0; n < iters; n++) {
    for (long tile = 0; tile < tiles; tile++) {
      const uint8_t* wt = W + tile * NB * 512;
      for (int b = 0; b < NB; b++) {
        __m512i dots[8];
        for (int i = 0; i < 8; i++) dots[i] = _mm512_setzero_si512();
        for (int g = 0; g < 8; g++) {
          if (PF) asm volatile("prefetcht0 %0" : : "m"(*(wt + NB * 512 + (b * 8 + g) * 64)));
          const __m512i w = _mm512_load_si512(wt + (b * 8 + g) * 64);
          for (int r = 0; r < 8; r++) {
            int32_t v; memcpy(&v, X[r] + 32 * b + 4 * g, 4);
            dots[r] = _mm512_dpbusd_epi32(dots[r], w, _mm512_set1_epi32(v));
          }
        }
        for (int i = 0; i < 8; i++) acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dots[i]), _mm512_set1_ps(D[i][b]), acc[i]);
      }
      for (int i = 0; i < 8; i++) { acc[i] = _mm512_mul_ps(acc[i], acc[i]); }
    }
    asm volatile("" ::: "memory");
  }
  auto t1 = std::chrono::steady_clock::now();
  __m512 s = acc[0];
  for (int i = 1; i < 8; i++) s = _mm512_add_ps(s, acc[i]);
  volatile float sink = _mm512_reduce_add_ps(s); (void)sink;
  return iters * tiles * NB * 64.0 / std::chrono::duration<double>(t1 - t0).count() / 1e9;
}
int main(int argc, char** argv) {
  for (long kb : {10L, 160L, 640L, 4096L, 65536L}) {
    long tiles = kb * 1024 / (NB * 512);
    uint8_t* W = (uint8_t*)aligned_alloc(64, (tiles + 2) * NB * 512);
    memset(W, 3, (tiles + 2) * NB * 512);
    long iters = std::max(1L, 20000L / tiles);
    printf("%6ld KB: no-pf %.2f  pf %.2f G dpbusd/s\n", kb, run<false>(W, tiles, iters), run<true>(W, tiles, iters));
    free(W);
  }
}
