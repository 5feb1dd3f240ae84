// Time aotpack_linear_int8 from a kernels.so in C, without Python between calls: Gemma 3 270M's shapes at 1 and 8
// rows, weights streamed (copies cycled over 128 MB) or hot (one copy, in L2).
//   g++ -O2 drv.cpp -o drv -ldl
//   LD_LIBRARY_PATH=$TORCH/lib OMP_NUM_THREADS=2 ./drv LIB [h|s] [N] [M]   (h: hot only, s: streamed only)
// MIN=1: the 5th percentile instead of the median; REPS: calls of the lm_head (default 20).
#include <dlfcn.h>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <algorithm>
typedef int32_t (*Fn)(const void*, int32_t, int64_t, int64_t, const uint8_t*, const float*, int64_t, void*);
int main(int argc, char** argv) {
  void* h = dlopen(argv[1], RTLD_NOW);
  if (!h) { printf("%s\n", dlerror()); return 1; }
  Fn f = (Fn)dlsym(h, "aotpack_linear_int8");
  const char* only = argc > 2 ? argv[2] : "";
  struct S { int64_t N, K; } shapes[] = {{262144, 640}, {2048, 640}, {640, 2048}, {1024, 640}, {256, 640}};
  for (auto s : shapes) {
    if (argc > 3 && s.N != atol(argv[3])) continue;
    const size_t bytes = size_t(s.N * s.K);
    const int copies = std::max<size_t>(1, (128u << 20) / bytes);
    std::vector<std::vector<uint8_t>> w(copies, std::vector<uint8_t>(bytes));
    for (auto& c : w) for (size_t i = 0; i < bytes; i++) c[i] = uint8_t(rand());
    std::vector<float> sc(s.N, 0.01f), x(8 * s.K), y(8 * s.N);
    for (auto& v : x) v = float(rand() % 200 - 100) / 37.0f;
    for (int M : {1, 8}) for (int hot = 0; hot < 2; hot++) {
      if (argc > 4 && M != atoi(argv[4])) continue;
      if (only[0] && (hot != (only[0] == 'h'))) continue;
      std::vector<double> ts;
      const int reps = s.N > 100000 ? (getenv("REPS") ? atoi(getenv("REPS")) : 20) : 600;
      for (int i = 0; i < reps; i++) {
        const uint8_t* c = w[hot ? 0 : i % copies].data();
        auto t0 = std::chrono::steady_clock::now();
        f(x.data(), 0, M, s.K, c, sc.data(), s.N, y.data());
        ts.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
      std::sort(ts.begin(), ts.end());
      const double med = getenv("MIN") ? ts[ts.size() / 20] : ts[ts.size() / 2];
      printf("%6ldx%-5ld M=%d %-6s %8.4f ms %6.1f GB/s %5.2f G dpbusd/s/core\n", (long)s.N, (long)s.K, M, hot ? "hot" : "stream",
             med * 1e3, bytes / med / 1e9, double(bytes) * M / 64 / med / 2 / 1e9);
    }
  }
}
