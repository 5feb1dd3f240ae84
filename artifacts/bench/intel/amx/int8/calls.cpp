// Alternate calls of aotpack_linear_int8 from several kernels.so builds in one process; min and median ms a
// call over `rounds` rounds (fp32 activations, random weights cycled through 300 MB or one copy if larger).
// Built and run for calls.txt (Intel Xeon, AVX-512 VNNI + AMX, 2 threads), the builds from
// exporter.kernels.build(isa_override="avx512-vnni" / "amx", serve=False).path:
//   g++ -O2 calls.cpp -o calls -ldl
//   LD_LIBRARY_PATH=<torch>/lib OMP_NUM_THREADS=2 ./calls M N K 15 <avx512-vnni .so> <amx .so>
#include <dlfcn.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <vector>
typedef int32_t (*F)(const void*, int32_t, int64_t, int64_t, const uint8_t*, const float*, int64_t, void*);
int main(int argc, char** argv) {
  const int64_t M = atoi(argv[1]), N = atoi(argv[2]), K = atoi(argv[3]); const int reps = atoi(argv[4]);
  std::vector<F> fs;
  for (int i = 5; i < argc; i++) { void* h = dlopen(argv[i], RTLD_NOW | RTLD_LOCAL); if (!h) { printf("%s\n", dlerror()); return 1; } fs.push_back((F)dlsym(h, "aotpack_linear_int8")); }
  const int64_t copies = std::max<int64_t>(1, (300LL << 20) / (N * K));
  std::vector<std::vector<uint8_t>> codes(copies, std::vector<uint8_t>(N * K));
  for (auto& c : codes) for (auto& v : c) v = rand() & 255;
  std::vector<float> sc(N, 0.01f), x(M * K), y(M * N);
  for (auto& v : x) v = (rand() % 1000) / 500.0f - 1;
  std::vector<std::vector<double>> t(fs.size());
  int64_t i = 0;
  for (int r = 0; r < reps; r++)
    for (size_t f = 0; f < fs.size(); f++) {
      const int calls = std::max<int64_t>(1, copies);
      auto t0 = std::chrono::steady_clock::now();
      for (int c = 0; c < calls; c++, i++) fs[f](x.data(), 0, M, K, codes[i % copies].data(), sc.data(), N, y.data());
      t[f].push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / calls);
    }
  printf("M %3ld %6ldx%-5ld", M, N, K);
  for (auto& v : t) { std::sort(v.begin(), v.end()); printf("  min %.4f med %.4f", v[0], v[v.size() / 2]); }
  printf("\n");
}
