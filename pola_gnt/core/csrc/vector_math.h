// Vectorisable float math shared by the C++ kernels (`attention/csrc/polarity_cpu.cpp`,
// `model/csrc/render_cpu.cpp`): the exponentials as polynomials the compiler can vectorise (std::exp and
// std::expm1 stay scalar calls), bf16 reads and writes, and, where the build has AVX2 and FMA, the same in
// 8-float vectors. `core/cpp_build.py` puts this header's digest into each build's name, so an edit here
// rebuilds both extensions.
#pragma once

#include <c10/util/BFloat16.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

namespace pola_gnt_math {

// expm1(min(z, clamp)) for z >= 0. Float: z = n ln2 + r with |r| <= ln2 / 2 (Cody-Waite split of ln2),
// expm1(r) by its Taylor polynomial to r^8 (truncation below 2e-10 relative), and
// expm1(z) = 2^n expm1(r) + (2^n - 1): exact for n = 0 (small z keeps all its digits), and for n >= 1
// the two terms do not cancel (expm1(r) > -0.3). 2^n is built from its exponent bits.
inline float expm1_clamped(float z, float clamp) {
  z = std::min(z, clamp);
  const int32_t n = static_cast<int32_t>(z * 1.44269504f + 0.5f);  // round(z / ln2), z >= 0
  const float nf = static_cast<float>(n);
  const float r = (z - nf * 0.693145751953125f) - nf * 1.428606765330187e-06f;
  float p = 1.0f / 40320.0f;
  p = p * r + 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r;
  const float scale = std::bit_cast<float>((n + 127) << 23);
  return scale * p + (scale - 1.0f);
}

// exp(max(x, -87)) for x <= 0 (softmax terms after subtracting the maximum), in a form the compiler
// vectorises (std::exp stays a scalar call): x = n ln2 + r with |r| <= ln2 / 2 (Cody-Waite split of ln2),
// e^r by its Taylor polynomial to r^8 (within 1e-7 relative of exp), 2^n from its exponent bits. Below
// -87 (where float's normal range ends) it gives exp(-87) = 1.6e-38 instead of less: against the
// maximum's term, 1, nothing a softmax can tell apart.
inline float exp_nonpositive(float x) {
  x = std::max(x, -87.0f);
  const int32_t n = static_cast<int32_t>(x * 1.44269504f - 0.5f);  // round(x / ln2), x <= 0
  const float nf = static_cast<float>(n);
  const float r = (x - nf * 0.693145751953125f) - nf * 1.428606765330187e-06f;
  float p = 1.0f / 40320.0f;
  p = p * r + 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  return std::bit_cast<float>((n + 127) << 23) * p;
}

// acos(x) for x in [-1, 1] in a form the compiler vectorises: Abramowitz and Stegun 4.4.46,
// sqrt(1 - |x|) times a degree-7 polynomial of |x| (absolute error at most 2e-8 in exact arithmetic;
// float's own rounding of 1 - |x| and the product stays within a few ulps), reflected for x < 0.
inline float arccos(float x) {
  const float a = std::abs(x);
  float p = -0.0012624911f;
  p = p * a + 0.0066700901f;
  p = p * a - 0.0170881256f;
  p = p * a + 0.0308918810f;
  p = p * a - 0.0501743046f;
  p = p * a + 0.0889789874f;
  p = p * a - 0.2145988016f;
  p = p * a + 1.5707963050f;
  const float r = std::sqrt(1.0f - a) * p;
  return x < 0.0f ? 3.14159265358979f - r : r;
}

// bf16 to float: exact (bf16 is float's upper half).
inline float bf16_to_float(c10::BFloat16 x) { return std::bit_cast<float>(static_cast<uint32_t>(x.x) << 16); }

#if defined(__AVX2__) && defined(__FMA__)
inline __m256 load_bf16x8(const c10::BFloat16* p) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
}

// Rounded to nearest even, as c10::BFloat16(float) rounds finite values.
inline void store_bf16x8(c10::BFloat16* p, __m256 x) {
  const __m256i bits = _mm256_castps_si256(x);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff))), 16);
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(rounded, rounded), 0x08);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
}

// expm1(min(z, clamp)) for z >= 0, lane by lane: `expm1_clamped` in vector form.
inline __m256 expm1_clamped_x8(__m256 z, float clamp) {
  z = _mm256_min_ps(z, _mm256_set1_ps(clamp));
  const __m256i n = _mm256_cvttps_epi32(_mm256_fmadd_ps(z, _mm256_set1_ps(1.44269504f), _mm256_set1_ps(0.5f)));
  const __m256 nf = _mm256_cvtepi32_ps(n);
  __m256 r = _mm256_fnmadd_ps(nf, _mm256_set1_ps(0.693145751953125f), z);
  r = _mm256_fnmadd_ps(nf, _mm256_set1_ps(1.428606765330187e-06f), r);
  __m256 p = _mm256_set1_ps(1.0f / 40320.0f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 5040.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_mul_ps(p, r);
  const __m256 scale = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n, _mm256_set1_epi32(127)), 23));
  return _mm256_fmadd_ps(scale, p, _mm256_sub_ps(scale, _mm256_set1_ps(1.0f)));
}

inline __m256 abs_x8(__m256 x) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x); }

// [sum a0, ..., sum a7] of eight 8-float vectors.
inline __m256 lane_sums_8(const __m256* a) {
  const __m256 t0 = _mm256_hadd_ps(a[0], a[1]), t1 = _mm256_hadd_ps(a[2], a[3]);
  const __m256 t2 = _mm256_hadd_ps(a[4], a[5]), t3 = _mm256_hadd_ps(a[6], a[7]);
  const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

// exp_nonpositive in vector form.
inline __m256 exp_nonpositive_x8(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
  const __m256i n = _mm256_cvttps_epi32(_mm256_fmsub_ps(x, _mm256_set1_ps(1.44269504f), _mm256_set1_ps(0.5f)));
  const __m256 nf = _mm256_cvtepi32_ps(n);
  __m256 r = _mm256_fnmadd_ps(nf, _mm256_set1_ps(0.693145751953125f), x);
  r = _mm256_fnmadd_ps(nf, _mm256_set1_ps(1.428606765330187e-06f), r);
  __m256 p = _mm256_set1_ps(1.0f / 40320.0f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 5040.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  return _mm256_mul_ps(_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n, _mm256_set1_epi32(127)), 23)), p);
}

// The largest and the sum of a vector's 8 lanes.
inline float horizontal_max(__m256 x) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}

inline float horizontal_sum(__m256 x) {
  __m128 m = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  m = _mm_add_ps(m, _mm_movehl_ps(m, m));
  m = _mm_add_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}
#endif

}  // namespace pola_gnt_math
