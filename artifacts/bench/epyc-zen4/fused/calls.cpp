// SmolLM2-135M's int8 linears of one decode step in C, in order, each its own random weight (streamed from
// memory, as in a step): 211 calls (q, k, v, o, gate, up, down a layer, and the lm_head) against 121 (q, k
// and v as one weight, gate and up as one), the two interleaved over 200 rounds: the per-call cost that
// exporter/siblings.py removes, before the cat kernels existed.
// g++ -O2 -o calls calls.cpp -ldl; LD_LIBRARY_PATH=<torch/lib> ./calls BUNDLE/kernels.so ROWS
#include <dlfcn.h>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <vector>
#include <algorithm>
typedef int32_t (*Fn)(const void*, int32_t, int64_t, int64_t, const uint8_t*, const float*, int64_t, void*);
struct S { int64_t N, K; };
int main(int argc, char** argv) {
  void* h = dlopen(argv[1], RTLD_NOW);
  if (!h) { printf("%s\n", dlerror()); return 1; }
  Fn f = (Fn)dlsym(h, "aotpack_linear_int8");
  const int M = argc > 2 ? atoi(argv[2]) : 1;
  std::vector<S> sep = {{576, 576}, {192, 576}, {192, 576}, {576, 576}, {1536, 576}, {1536, 576}, {576, 1536}};
  std::vector<S> fus = {{960, 576}, {576, 576}, {3072, 576}, {576, 1536}};
  std::vector<S> tiny = {{16, 32}, {16, 32}, {16, 32}, {16, 32}, {16, 32}, {16, 32}, {16, 32}};
  struct Run { const char* name; std::vector<S> calls; std::vector<std::vector<uint8_t>> w; std::vector<std::vector<float>> sc; size_t total = 0; std::vector<double> ts; };
  std::vector<Run> runs;
  for (auto* layer : {&sep, &fus}) {
    std::vector<S> calls;
    for (int l = 0; l < 30; l++) for (auto s : *layer) calls.push_back(s);
    if (layer != &tiny) calls.push_back({49152, 576});
    std::vector<std::vector<uint8_t>> w;
    std::vector<std::vector<float>> sc;
    size_t total = 0;
    for (auto s : calls) { w.emplace_back(s.N * s.K, 128); sc.emplace_back(s.N, 0.01f); total += s.N * s.K; }
    for (auto& c : w) for (auto& b : c) b = uint8_t(rand());
    runs.push_back({layer == &sep ? "separate" : "fused", calls, std::move(w), std::move(sc), total, {}});
  }
  std::vector<float> x(M * 1536), y(M * 49152);
  for (auto& v : x) v = float(rand() % 200 - 100) / 37.0f;
  for (int rep = 0; rep < 200; rep++)
    for (auto& r : runs) {
      auto t0 = std::chrono::steady_clock::now();
      for (size_t i = 0; i < r.calls.size(); i++) f(x.data(), 0, M, r.calls[i].K, r.w[i].data(), r.sc[i].data(), r.calls[i].N, y.data());
      r.ts.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
  for (auto& r : runs) {
    auto ts = r.ts; std::sort(ts.begin(), ts.end());
    printf("%-9s M=%d %zu calls median %7.3f ms (p10 %.3f)  %.1f GB/s\n", r.name, M, r.calls.size(), ts[100] * 1e3, ts[20] * 1e3, r.total / ts[100] / 1e9);
  }
}
