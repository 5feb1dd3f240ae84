// LD_PRELOAD shim: times aotpack's custom ops inside AOTInductor graphs by (op, rows, outputs); written to $SHIM_OUT at exit.
//   g++ -O2 -shared -fPIC ops.cpp -o ops.so -ldl
//   SHIM_OUT=ops.tsv LD_PRELOAD=./ops.so python steps.py BUNDLE 64 && python steps.py --report ops.tsv
#include <dlfcn.h>
#include <link.h>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
typedef void* H;
typedef int32_t E;
static void* kern = nullptr;
static char found[4096];
static int find(struct dl_phdr_info* info, size_t, void*) {
  const char* n = info->dlpi_name;
  size_t l = strlen(n);
  if (l >= 10 && strcmp(n + l - 10, "kernels.so") == 0) { strncpy(found, n, sizeof found - 1); return 1; }
  return 0;
}
static void* real(const char* name) {
  if (!kern) { dl_iterate_phdr(find, nullptr); kern = dlopen(found, RTLD_NOW | RTLD_NOLOAD); fprintf(stderr, "shim: %s -> %p\n", found, kern); }
  void* f = dlsym(kern, name);
  if (!f) fprintf(stderr, "shim: no %s\n", name);
  return f;
}
struct Acc { double s = 0; long n = 0; };
static std::map<std::string, Acc>* acc = new std::map<std::string, Acc>;
static std::mutex mu;
static void add(const std::string& k, double s) { std::lock_guard<std::mutex> g(mu); auto& a = (*acc)[k]; a.s += s; a.n++; }
static double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
static int64_t rows(H x) { static auto g = (E(*)(H, int64_t**))dlsym(dlopen("libtorch_cpu.so", RTLD_NOW | RTLD_NOLOAD), "aoti_torch_get_sizes"); int64_t* s; g(x, &s); return s[0]; }
extern "C" E aoti_torch_cpu_dot_linear_int8_cat(H x, const H* codes, int64_t cl, const H* scales, int64_t sl, H* ret) {
  static auto f = (E(*)(H, const H*, int64_t, const H*, int64_t, H*))real("aoti_torch_cpu_dot_linear_int8_cat");
  int64_t N = 0; for (int64_t i = 0; i < cl; i++) N += rows(codes[i]);
  double t = now(); E e = f(x, codes, cl, scales, sl, ret); t = now() - t;
  add("int8 M" + std::to_string(rows(x)) + " N" + std::to_string(N) + " parts" + std::to_string(cl), t);
  return e;
}
extern "C" E aoti_torch_cpu_dot_linear_int8(H x, H codes, H scales, H* ret) {
  return aoti_torch_cpu_dot_linear_int8_cat(x, &codes, 1, &scales, 1, ret);
}
extern "C" E aoti_torch_cpu_decode_attention(H q, H k, H v, H mask, double scale, H* ret) {
  static auto f = (E(*)(H, H, H, H, double, H*))real("aoti_torch_cpu_decode_attention");
  double t = now(); E e = f(q, k, v, mask, scale, ret); t = now() - t;
  add("attention B" + std::to_string(rows(q)), t);
  return e;
}
__attribute__((destructor)) static void dump() {
  const char* out = getenv("SHIM_OUT");
  FILE* fp = out ? fopen(out, "w") : stderr;
  for (auto& [k, a] : *acc) fprintf(fp, "%s\t%ld\t%.6f\n", k.c_str(), a.n, a.s);
  if (out) fclose(fp);
}
