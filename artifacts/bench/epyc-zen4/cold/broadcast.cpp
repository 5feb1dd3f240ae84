// vpdpbusd at 8 activation rows against one weight vector a group of 4 columns, K = 640 (160 groups), 16 tiles'
// weights cycled: each row's 4 bytes broadcast from memory (MODE 0, as aotpack's 8-row int8 pass does, rows
// 640 bytes apart as its activations are) or a replicated 64-byte activation vector as the memory operand
// (MODE 1: 80 KB of them, from L2). g++ -O3 -march=native broadcast.cpp -o broadcast && ./broadcast
// AMD EPYC Zen 4: broadcast 3.64-3.65 G dpbusd/s a core (the rate ../broadcast.cpp reads with the broadcasts
// held in registers), replicated 1.61. ../broadcast.cpp's 1.86 for broadcasts from memory came from its rows
// 4,096 bytes apart: all 8 loads in one L1 set. The 8-row pass is not bound by its broadcasts.
#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <vector>
constexpr int G = 160, R = 8;
alignas(64) uint8_t W[G * 64 * 16];       // 16 tiles' weights
alignas(64) int8_t X[R][G * 4];
alignas(64) int8_t XR[G][R][64];           // replicated, group-major: a group's 8 rows together
template <int MODE> double run(long iters) {
  __m512i d[R];
  for (int i = 0; i < R; i++) d[i] = _mm512_setzero_si512();
  auto t0 = std::chrono::steady_clock::now();
  for (long n = 0; n < iters; n++) {
    const uint8_t* wt = W + (n % 16) * G * 64;
    for (int g = 0; g < G; g++) {
      const __m512i w = _mm512_load_si512(wt + g * 64);
      for (int r = 0; r < R; r++) {
        __m512i x;
        if constexpr (MODE == 0) { int32_t v; memcpy(&v, X[r] + 4 * g, 4); x = _mm512_set1_epi32(v); }
        else x = _mm512_load_si512(XR[g][r]);
        d[r] = _mm512_dpbusd_epi32(d[r], w, x);
      }
    }
    asm volatile("" ::: "memory");
  }
  auto t1 = std::chrono::steady_clock::now();
  __m512i s = d[0];
  for (int i = 1; i < R; i++) s = _mm512_add_epi32(s, d[i]);
  volatile int sink = _mm512_reduce_add_epi32(s); (void)sink;
  return iters * double(G) * R / std::chrono::duration<double>(t1 - t0).count() / 1e9;
}
int main() {
  memset(W, 1, sizeof W); memset(X, 1, sizeof X); memset(XR, 1, sizeof XR);
  for (int i = 0; i < 3; i++) printf("bcast-mem %.2f  replicated %.2f G dpbusd/s\n", run<0>(100000), run<1>(100000));
}
