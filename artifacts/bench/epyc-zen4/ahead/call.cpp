// One library's aotpack_linear_dpbf16 called from C: call LIB.so N M BF16_CODE (K = 640), us a call.
// g++ -O2 call.cpp -o call -ldl; LD_LIBRARY_PATH=<torch/lib> OMP_NUM_THREADS=1 ./call LIB N 8 1
#include <dlfcn.h>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <vector>
typedef int32_t (*F)(const void*, int32_t, int64_t, int64_t, const void*, int32_t, int64_t, void*);
int main(int argc, char** argv) {
  void* h = dlopen(argv[1], RTLD_NOW); if (!h) { printf("%s\n", dlerror()); return 1; }
  F f = (F)dlsym(h, "aotpack_linear_dpbf16");
  int64_t N = atol(argv[2]), K = 640, M = atol(argv[3]); int BF = atoi(argv[4]);
  std::vector<uint16_t> w(N * K), x(M * K), y(M * N);
  for (auto& v : w) v = 0x3f80 + (rand() & 63);
  for (auto& v : x) v = 0x3f80 + (rand() & 63);
  for (int i = 0; i < 100; i++) f(x.data(), BF, M, K, w.data(), BF, N, y.data());
  int reps = int(3e7 / N);
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; i++) f(x.data(), BF, M, K, w.data(), BF, N, y.data());
  double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  printf("N %ld M %ld: %.2f us a call, %.2f G dpbf16/s\n", N, M, dt / reps * 1e6, N * K * M / 32.0 * reps / dt / 1e9);
}
