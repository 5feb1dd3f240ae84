// vpdpbusd's rate on this CPU with its activation operand broadcast from memory for each instruction (MODE 0, as
// aotpack's 8-row int8 pass does), held in registers (1), or folded into the instruction as {1to16} (2).
// g++ -O3 -march=native broadcast.cpp -o broadcast && ./broadcast
#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <cstring>
alignas(64) uint8_t W[64 * 64];
alignas(64) int8_t X[8][4096];
template <int MODE> double run(long iters) {
  __m512i d[8];
  for (int i = 0; i < 8; i++) d[i] = _mm512_setzero_si512();
  __m512i xr[8];
  for (int r = 0; r < 8; r++) { int32_t v; memcpy(&v, X[r], 4); xr[r] = _mm512_set1_epi32(v); }
  auto t0 = std::chrono::steady_clock::now();
  for (long n = 0; n < iters; n++) {
    for (int g = 0; g < 64; g++) {
      const __m512i w = _mm512_load_si512(W + g * 64);
      for (int r = 0; r < 8; r++) {
        __m512i x;
        if constexpr (MODE == 0) { int32_t v; memcpy(&v, X[r] + 4 * g, 4); x = _mm512_set1_epi32(v); }
        else if constexpr (MODE == 1) x = xr[r];
        if constexpr (MODE == 2) asm("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(d[r]) : "v"(w), "m"(*(const int32_t*)(X[r] + 4 * g)));
        else d[r] = _mm512_dpbusd_epi32(d[r], w, x);
      }
    }
    asm volatile("" ::: "memory");
  }
  auto t1 = std::chrono::steady_clock::now();
  __m512i s = d[0];
  for (int i = 1; i < 8; i++) s = _mm512_add_epi32(s, d[i]);
  volatile int sink = _mm512_reduce_add_epi32(s); (void)sink;
  return iters * 64.0 * 8 / std::chrono::duration<double>(t1 - t0).count() / 1e9;
}
int main() {
  for (int i = 0; i < 3; i++) printf("bcast-mem %.2f  reg %.2f  embedded %.2f G dpbusd/s\n", run<0>(200000), run<1>(200000), run<2>(200000));
}
