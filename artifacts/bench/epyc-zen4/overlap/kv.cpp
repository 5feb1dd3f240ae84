// KV-like streaming: L layers, each 8 rows x (K, V) of S keys x 256 fp32 (row r's K at its own place); 2 threads,
// 4 rows each; per row its K stream then its V stream (like the attention's tasks), summed with zmm loads.
// Modes: 0 plain; 1 t1 prefetch 32 KB ahead (a line per line read); 2 4 rows' streams in lockstep.
#include <immintrin.h>
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

int main(int argc, char** argv) {
  const long S = atol(argv[1]), D = 256, layers = (512l << 20) / (16 * S * D * 4) + 1;
  const long row = S * D;  // floats
  std::vector<float*> kv(layers * 16);
  for (auto& p : kv) { p = static_cast<float*>(aligned_alloc(64, row * 4)); memset(p, 1, row * 4); }
  for (int mode = 0; mode < 3; mode++) {
    double best = 1e9;
    for (int rep = 0; rep < 3; rep++) {
      const auto t0 = std::chrono::steady_clock::now();
      float sink = 0;
      for (long l = 0; l < layers; l++) {
#pragma omp parallel num_threads(2) reduction(+ : sink)
        {
          const int t = omp_get_thread_num();
          __m512 acc = _mm512_setzero_ps();
          if (mode < 2) {
            for (int r = 4 * t; r < 4 * t + 4; r++)
              for (int which = 0; which < 2; which++) {
                const float* p = kv[l * 16 + 2 * r + which];
                for (long i = 0; i < row; i += 16) {
                  if (mode == 1 && (i & 15) == 0) asm volatile("prefetcht1 %0" : : "m"(*(p + i + 8192)));
                  acc = _mm512_add_ps(acc, _mm512_load_ps(p + i));
                }
              }
          } else {
            for (int which = 0; which < 2; which++)
              for (long i = 0; i < row; i += 16)
                for (int r = 4 * t; r < 4 * t + 4; r++) acc = _mm512_add_ps(acc, _mm512_load_ps(kv[l * 16 + 2 * r + which] + i));
          }
          sink += _mm512_reduce_add_ps(acc);
        }
      }
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      best = std::min(best, s);
      if (sink == 1) printf("-");
    }
    printf("S %ld mode %d: %.1f GB/s\n", S, mode, layers * 16.0 * row * 4 / best / 1e9);
  }
}
