// FMA peak and the 4x3 micro-tile's rate with data in L1 (one thread).
#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <vector>
int main() {
  const int64_t N = 200000000;
  __m256 a[12];
  for (int i = 0; i < 12; i++) a[i] = _mm256_set1_ps(i * 0.001f);
  __m256 b = _mm256_set1_ps(0.9999f), c = _mm256_set1_ps(0.0001f);
  auto t0 = std::chrono::steady_clock::now();
  for (int64_t n = 0; n < N; n++) {
    asm("" : "+x"(b), "+x"(c));
    for (int i = 0; i < 12; i++) a[i] = _mm256_fmadd_ps(a[i], b, c);
  }
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  float out = 0; for (int i = 0; i < 12; i++) out += a[i][0];
  printf("peak: %.2f G FMA/s (%g)\n", 12.0 * N / s / 1e9, out);
  // 4 rows x 3 weight rows of K=640 bf16 in L1, as micro<BF16,4,3>
  const int K = 640; std::vector<uint16_t> w(3 * K, 0x3f80); std::vector<float> x(4 * K, 1.0f);
  const int64_t T = 400000; float sink = 0;
  t0 = std::chrono::steady_clock::now();
  for (int64_t t = 0; t < T; t++) {
    __m256 acc[4][3];
    for (int r = 0; r < 4; r++) for (int q = 0; q < 3; q++) acc[r][q] = _mm256_setzero_ps();
    for (int k = 0; k < K; k += 8) {
      __m256 wv[3];
      for (int q = 0; q < 3; q++) {
        __m128i h = _mm_loadu_si128((const __m128i*)(w.data() + q * K + k));
        wv[q] = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
      }
      for (int r = 0; r < 4; r++) {
        __m256 xv = _mm256_loadu_ps(x.data() + r * K + k);
        asm("" : "+x"(xv));
        for (int q = 0; q < 3; q++) acc[r][q] = _mm256_fmadd_ps(xv, wv[q], acc[r][q]);
      }
    }
    for (int r = 0; r < 4; r++) for (int q = 0; q < 3; q++) sink += acc[r][q][0];
  }
  s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  printf("bf16 4x3 in L1: %.2f G FMA/s (%g)\n", 12.0 * K / 8 * T / s / 1e9, sink);
}
