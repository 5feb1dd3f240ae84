// aotpack's integer decode kernels: what the int8, int4 and int5 schemes share.
//
// Owns: the activation format (each row of x cut into blocks of 32 columns, each block quantized to int8
// with its own fp32 step, as llama.cpp's Q8_0), conversion to and from the activation dtypes, and the
// plumbing of the C shims AOTInductor calls. lanes.h has the vectors a tile of 16 weight rows is computed
// with on each instruction path, and the loop over a weight's tiles.
//
// Every output element is computed by the same sequence of floating-point operations whichever tile, thread
// count, batch or instruction path computed it, so the eager prefill (which calls these kernels through
// ctypes) and the compiled decode (which calls them through the C shims) agree bit for bit on the same inputs.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define AOTPACK_AVX2 1
#endif
// dense.cpp's bf16 tiles and int8.cpp's int8 tiles: only in the build isa() names "amx", whose CPU check
// covers them
#if defined(AOTPACK_AVX2) && defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AMX_INT8__) && \
    defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define AOTPACK_AMX 1
#endif

namespace aotpack {

constexpr int64_t BLOCK = 32;  // activation columns per int8 step
constexpr int TILE = 16;  // weight rows a tile holds: one lane each of a 16-lane vector (runtime.quant.tiles)
constexpr int GROUP = 4;  // columns a lane holds together in a tile's block: what one dpbusd lane sums
constexpr int64_t MAX_PARTS = 8;  // weights one call multiplies the same activations by (lanes.h, Part)
constexpr int32_t ABI = 1;     // runtime.quant.native checks it: bump when any exported signature changes

enum Dtype : int32_t { F32 = 0, BF16 = 1, F16 = 2 };
enum Status : int32_t { OK = 0, BAD_DTYPE = 1, BAD_SHAPE = 2, BAD_LAYOUT = 3, NO_MEMORY = 4, NO_TILES = 5 };

// The line at p fetched into L2 only (prefetcht1), where the code issues it (a volatile asm: GCC hoists
// __builtin_prefetch freely): the AMX int8 pass's next tiles a pass ahead, the 8-row int8 pass's tiles four
// ahead (int8.cpp), the decode attention's keys and values (attention.cpp). Into L1 the AMX pass read Gemma 3's
// int8 `lm_head` at 38 GB/s, into L2 at 42 (tile loads, 2 rows, Intel Xeon, 2 threads).
inline void prefetch_l2(const void* p) {
#if defined(__x86_64__) || defined(__i386__)
  asm volatile("prefetcht1 %0" : : "m"(*static_cast<const char*>(p)));
#else
  __builtin_prefetch(p, 0, 2);
#endif
}

inline int64_t blocks(int64_t k) { return (k + BLOCK - 1) / BLOCK; }

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t f32_to_bf16(float f) {  // round to nearest even, as torch's .to(torch.bfloat16)
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // NaN stays NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

#if defined(AOTPACK_AVX2)
inline float f16_to_f32(uint16_t h) { return _cvtsh_ss(h); }
inline uint16_t f32_to_f16(float f) { return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT); }
#elif defined(__aarch64__)
inline float f16_to_f32(uint16_t h) { __fp16 v; std::memcpy(&v, &h, 2); return float(v); }
inline uint16_t f32_to_f16(float f) { __fp16 v = __fp16(f); uint16_t h; std::memcpy(&h, &v, 2); return h; }
#else
float f16_to_f32(uint16_t h);  // quant_common.cpp: IEEE half by hand where the CPU has no conversion
uint16_t f32_to_f16(float f);
#endif

template <int D> inline float load_as_f32(const void* x, int64_t i) {
  if constexpr (D == F32) return static_cast<const float*>(x)[i];
  else if constexpr (D == BF16) return bf16_to_f32(static_cast<const uint16_t*>(x)[i]);
  else return f16_to_f32(static_cast<const uint16_t*>(x)[i]);
}

template <int D> inline void store_from_f32(void* y, int64_t i, float v) {
  if constexpr (D == F32) static_cast<float*>(y)[i] = v;
  else if constexpr (D == BF16) static_cast<uint16_t*>(y)[i] = f32_to_bf16(v);
  else static_cast<uint16_t*>(y)[i] = f32_to_f16(v);
}

// Activations quantized per block of 32: q (M, blocks * 32) int8, zero past K; d (M, blocks) the steps,
// NaN where the block held a NaN or an infinity, so the output is NaN as a float kernel's would be;
// s (M, blocks) each block's sum of q (int8's and int5's offsets and int4's min term need it).
struct Activations {
  int64_t M = 0, K = 0, nb = 0;
  std::vector<int8_t> q;
  std::vector<float> d;
  std::vector<int32_t> s;
  const int8_t* row(int64_t m) const { return q.data() + m * nb * BLOCK; }
};

// Where a kernel writes y[m, n]: y's rows `ld` elements apart, the weight's outputs from column `col` (a call
// of several weights puts their outputs side by side: lanes.h, Part).
struct Out {
  void* y;
  int64_t ld, col;
  int64_t at(int64_t m, int64_t n) const { return m * ld + col + n; }
};

// Fills `a` from x (M, K) of dtype `dtype`, rows `ldx` elements apart. False for an unknown dtype.
bool quantize(const void* x, int32_t dtype, int64_t M, int64_t K, int64_t ldx, Activations& a);
// f(m) for each row m < M: every row by the calling thread where `all`; otherwise, inside an OpenMP team,
// each thread a share of them (an orphaned `omp for`, which ends when all are done), and outside one the
// calling thread all of them.
template <class F> void each_row(int64_t M, bool all, F f) {
  if (all) {
    for (int64_t m = 0; m < M; m++) f(m);
    return;
  }
#pragma omp for schedule(static)
  for (int64_t m = 0; m < M; m++) f(m);
}

// The same in two steps: `prepare` sizes `a` for (M, K) (false for an unknown dtype); `quantize_rows`
// then fills it, its rows as each_row shares them (`all`: each thread of a team fills its own `a`).
bool prepare(int32_t dtype, int64_t M, int64_t K, Activations& a);
void quantize_rows(const void* x, int32_t dtype, int64_t ldx, Activations& a, bool all);

// f(std::integral_constant<int, D>{}) for activation dtype D (one of F32, BF16, F16).
template <class F> void with_dtype(int32_t dtype, F f) {
  if (dtype == F32) f(std::integral_constant<int, F32>{});
  else if (dtype == BF16) f(std::integral_constant<int, BF16>{});
  else f(std::integral_constant<int, F16>{});
}

// A scratch Activations per calling thread: the decode step calls each kernel ~130 times a token, and
// reusing the vectors keeps the allocator out of it.
Activations& scratch();

#if defined(AOTPACK_AVX2)
inline float hsum(__m256 v) {  // one fixed order, so every caller rounds alike
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  x = _mm_add_ss(x, _mm_movehdup_ps(x));
  return _mm_cvtss_f32(x);
}
#endif

// Whether this build can compute on AMX tiles in this process: it has the AMX path, and Linux granted the
// tiles' state on request (arch_prctl; once a process). dense.cpp.
bool tiles_ready();

#if defined(AOTPACK_AMX)
struct TileConfig {  // the layout ldtilecfg reads (palette 1)
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
#endif

// Which instruction path this build compiled: the manifest records it, and the runtime checks the CPU.
const char* isa();

}  // namespace aotpack
