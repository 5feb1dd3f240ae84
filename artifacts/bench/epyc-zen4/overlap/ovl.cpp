// Streaming + dpbusd overlap probe: 2 threads each stream half of a 512 MB buffer; per 64-byte line, W dpbusd
// (W accumulators, activation broadcasts from L1). Prefetch schemes: t0 at +A bytes, t1 at +B bytes.
#include <immintrin.h>
#include <omp.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cstdint>

template <int W>
__attribute__((noinline)) int64_t pass(const uint8_t* p, int64_t bytes, const int32_t* x, int64_t a, int64_t b, int mode) {
  __m512i acc[W];
  for (int i = 0; i < W; i++) acc[i] = _mm512_setzero_si512();
  for (int64_t off = 0; off < bytes; off += 64) {
    if (mode & 1) asm volatile("prefetcht0 %0" : : "m"(*(p + off + a)));
    if (mode & 2) asm volatile("prefetcht1 %0" : : "m"(*(p + off + b)));
    if (mode & 4) asm volatile("prefetchnta %0" : : "m"(*(p + off + a)));
    if (mode & 8) asm volatile("prefetcht2 %0" : : "m"(*(p + off + b)));
    const __m512i w = _mm512_loadu_si512(p + off);
#pragma GCC unroll 16
    for (int i = 0; i < W; i++) acc[i] = _mm512_dpbusd_epi32(acc[i], w, _mm512_set1_epi32(x[(off >> 4 & 31) + i]));
  }
  __m512i s = acc[0];
  for (int i = 1; i < W; i++) s = _mm512_add_epi32(s, acc[i]);
  return _mm512_reduce_add_epi32(s);
}

int main(int argc, char** argv) {
  const int64_t total = 512ll << 20;
  uint8_t* buf = static_cast<uint8_t*>(aligned_alloc(4096, total));
  memset(buf, 3, total);
  alignas(64) int32_t x[64];
  for (int i = 0; i < 64; i++) x[i] = i * 77;
  struct Cfg { const char* name; int mode; int64_t a, b; };
  Cfg cfgs[] = {{"none", 0, 0, 0}, {"t0+10K", 1, 10240, 0}, {"t0+2K", 1, 2048, 0}, {"t0+4K", 1, 4096, 0},
                {"t1+40K", 2, 0, 40960}, {"t1+128K", 2, 0, 131072}, {"t0+10K,t1+40K", 3, 10240, 40960},
                {"t0+2K,t1+64K", 3, 2048, 65536}, {"t0+2K,t1+16K", 3, 2048, 16384}, {"nta+4K", 4, 4096, 0},
                {"t0+2K,t2+64K", 9, 2048, 65536}};
  const int ws[] = {1, 8};
  for (int round = 0; round < 3; round++)
    for (int w : ws)
      for (const Cfg& c : cfgs) {
        int64_t sink = 0;
        const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(2) reduction(+ : sink)
        {
          const int t = omp_get_thread_num();
          const uint8_t* p = buf + t * (total / 2);
          sink += w == 1 ? pass<1>(p, total / 2 - 262144, x, c.a, c.b, c.mode) : pass<8>(p, total / 2 - 262144, x, c.a, c.b, c.mode);
        }
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        printf("round %d W%d %-16s %6.1f GB/s  (%lld)\n", round, w, c.name, total / s / 1e9, (long long)(sink & 1));
      }
}
