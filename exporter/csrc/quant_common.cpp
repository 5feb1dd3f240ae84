// aotpack's integer decode kernels: activation quantization and the ISA name (see quant_common.h).
#include "quant_common.h"

#include <algorithm>
#include <limits>

namespace aotpack {

#if !defined(AOTPACK_AVX2) && !defined(__aarch64__)
float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  uint32_t u;
  if (exp == 0x1fu) u = sign | 0x7f800000u | (man << 13);  // Inf, NaN
  else if (exp != 0) u = sign | ((exp + 112u) << 23) | (man << 13);
  else if (man == 0) u = sign;
  else {  // subnormal half: normalise
    int e = -1;
    uint32_t m = man;
    do { m <<= 1; ++e; } while (!(m & 0x400u));
    u = sign | (uint32_t(112 - e) << 23) | ((m & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t f32_to_f16(float f) {  // round to nearest even
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  u &= 0x7fffffffu;
  if (u > 0x7f800000u) return sign | 0x7e00u;
  if (u >= 0x477ff000u) return sign | 0x7c00u;  // rounds to infinity
  if (u < 0x38800000u) {                        // subnormal or zero half
    float a;
    std::memcpy(&a, &u, 4);
    return sign | uint16_t(std::nearbyint(a * 16777216.0f));  // a / 2^-24, ties to even
  }
  const uint32_t rounded = u + 0xfffu + ((u >> 13) & 1u);
  return sign | uint16_t((rounded - 0x38000000u) >> 13);
}
#endif

namespace {

// One block of n <= 32 values, already fp32: its step, its int8 values (zero past n) and their sum.
// Scalar and vector paths do the same IEEE operations (|x| max, one division for each of d and 1/d,
// x * (1/d) rounded to nearest even), so they agree exactly.
inline void quantize_block(const float* v, int64_t n, int8_t* q, float* d, int32_t* s) {
  float amax = 0.0f, probe = 0.0f;
  for (int64_t i = 0; i < n; i++) {
    amax = std::max(amax, std::fabs(v[i]));
    probe += v[i] * 0.0f;  // NaN if any value is NaN or infinite
  }
  int32_t sum = 0;
  const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
  for (int64_t i = 0; i < BLOCK; i++) {
    const int32_t qi = i < n ? int32_t(std::nearbyint(std::min(127.0f, std::max(-127.0f, v[i] * id)))) : 0;
    q[i] = int8_t(qi);
    sum += qi;
  }
  *d = probe == 0.0f ? amax / 127.0f : std::numeric_limits<float>::quiet_NaN();
  *s = sum;
}

#if defined(AOTPACK_AVX2)
// A full block of 32 fp32 values: the same arithmetic as quantize_block, 8 lanes at a time.
inline void quantize_block_avx2(const float* v, int8_t* q, float* d, int32_t* s) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 x[4], amax = _mm256_setzero_ps(), probe = _mm256_setzero_ps();
  for (int j = 0; j < 4; j++) {
    x[j] = _mm256_loadu_ps(v + 8 * j);
    amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, x[j]));
    probe = _mm256_add_ps(probe, _mm256_mul_ps(x[j], _mm256_setzero_ps()));
  }
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  const float top = _mm_cvtss_f32(m);
  alignas(32) float p[8];
  _mm256_store_ps(p, probe);
  bool finite = true;
  for (float value : p) finite &= value == 0.0f;
  const __m256 id = _mm256_set1_ps(top > 0.0f ? 127.0f / top : 0.0f);
  const __m256 lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
  __m256i i32[4];
  for (int j = 0; j < 4; j++)  // cvtps rounds to nearest even, as nearbyint does
    i32[j] = _mm256_cvtps_epi32(_mm256_min_ps(hi, _mm256_max_ps(lo, _mm256_mul_ps(x[j], id))));
  const __m256i total = _mm256_add_epi32(_mm256_add_epi32(i32[0], i32[1]), _mm256_add_epi32(i32[2], i32[3]));
  __m128i t = _mm_add_epi32(_mm256_castsi256_si128(total), _mm256_extracti128_si256(total, 1));
  t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4e));
  t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xb1));
  // int32 -> int8 in column order: packs interleave 128-bit halves, the permute puts them back
  const __m256i a = _mm256_packs_epi32(i32[0], i32[1]), b = _mm256_packs_epi32(i32[2], i32[3]);
  const __m256i bytes = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(a, b), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), bytes);
  *d = finite ? top / 127.0f : std::numeric_limits<float>::quiet_NaN();
  *s = _mm_cvtsi128_si32(t);
}
#endif

// Row m of x into `a`.
template <int D> void quantize_row(const void* x, int64_t m, int64_t K, int64_t ldx, Activations& a) {
  const int64_t nb = a.nb;
  float v[BLOCK];
  for (int64_t b = 0; b < nb; b++) {
    const int64_t n = std::min(BLOCK, K - b * BLOCK);
    for (int64_t i = 0; i < n; i++) v[i] = load_as_f32<D>(x, m * ldx + b * BLOCK + i);
    int8_t* q = a.q.data() + (m * nb + b) * BLOCK;
    float* d = a.d.data() + m * nb + b;
    int32_t* s = a.s.data() + m * nb + b;
#if defined(AOTPACK_AVX2)
    if (n == BLOCK) {
      quantize_block_avx2(v, q, d, s);
      continue;
    }
#endif
    quantize_block(v, n, q, d, s);
  }
}

}  // namespace

bool prepare(int32_t dtype, int64_t M, int64_t K, Activations& a) {
  if (dtype != F32 && dtype != BF16 && dtype != F16) return false;
  a.M = M, a.K = K, a.nb = blocks(K);
  a.q.resize(size_t(M * a.nb * BLOCK));
  a.d.resize(size_t(M * a.nb));
  a.s.resize(size_t(M * a.nb));
  return true;
}

void quantize_rows(const void* x, int32_t dtype, int64_t ldx, Activations& a, bool all) {
  with_dtype(dtype, [&](auto d) {
    each_row(a.M, all, [&](int64_t m) { quantize_row<decltype(d)::value>(x, m, a.K, ldx, a); });
  });
}

bool quantize(const void* x, int32_t dtype, int64_t M, int64_t K, int64_t ldx, Activations& a) {
  if (!prepare(dtype, M, K, a)) return false;
  quantize_rows(x, dtype, ldx, a, false);
  return true;
}

Activations& scratch() {
  thread_local Activations a;
  return a;
}

const char* isa() {
#if defined(AOTPACK_AMX)
  return "amx";  // avx512-vnni's, and AMX tiles: dense.cpp's bf16, int8.cpp's int8
#elif defined(__AVX512VNNI__) && defined(__AVX512VL__) && defined(AOTPACK_AVX2)
  return "avx512-vnni";
#elif defined(__AVXVNNI__) && defined(AOTPACK_AVX2)
  return "avx-vnni";
#elif defined(AOTPACK_AVX2)
  return "avx2";
#else
  return "scalar";
#endif
}

}  // namespace aotpack

extern "C" {

const char* aotpack_kernels_isa() { return aotpack::isa(); }
int32_t aotpack_kernels_abi() { return aotpack::ABI; }

// The activation format alone, for the tests: q (M, blocks * 32), d and s (M, blocks).
int32_t aotpack_quantize_activations(const void* x, int32_t dtype, int64_t M, int64_t K, int8_t* q, float* d,
                                     int32_t* s) {
  aotpack::Activations a;
  if (M < 0 || K < 1) return aotpack::BAD_SHAPE;
  if (!aotpack::quantize(x, dtype, M, K, K, a)) return aotpack::BAD_DTYPE;
  std::memcpy(q, a.q.data(), a.q.size());
  std::memcpy(d, a.d.data(), a.d.size() * sizeof(float));
  std::memcpy(s, a.s.data(), a.s.size() * sizeof(int32_t));
  return aotpack::OK;
}

}  // extern "C"
