// exp over a row: see exp_row.h. The fused multiply-adds below are allowed: every lane whose rounding
// to fp32 they could change is recomputed with std::exp.
#include "isa/semantics/exp_row.h"

#include <cmath>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define NSIM_EXP_AVX2 1
#endif

namespace nsim::isa::sem {

namespace {
inline float exact_exp(float x) { return static_cast<float>(std::exp(static_cast<double>(x))); }

#ifdef NSIM_EXP_AVX2
__attribute__((target("avx2,fma"))) void exp_row_avx2(float* y, int64_t n) {
  // Inputs whose fp32 result is normal and finite: exp(-87) > 2^-126, exp(88.5) < FLT_MAX.
  const __m256d lo = _mm256_set1_pd(-87.0), hi = _mm256_set1_pd(88.5);
  // Below -104 (and -inf: masked scores) the result is +0: exp(-104) < 2^-150, half the least fp32
  // subnormal. Those lanes are set here rather than recomputed with std::exp (whose underflow path is slow).
  const __m256d zero_below = _mm256_set1_pd(-104.0);
  const __m256d inv_ln2 = _mm256_set1_pd(1.4426950408889634);
  const __m256d shifter = _mm256_set1_pd(6755399441055744.0);  // 1.5 * 2^52: round to an integer
  // ln2 = ln2_hi + ln2_lo, ln2_hi with 21 trailing zero bits (k * ln2_hi exact for |k| < 2^21)
  const __m256d ln2_hi = _mm256_set1_pd(6.93147180369123816490e-01);
  const __m256d ln2_lo = _mm256_set1_pd(1.90821492927058770002e-10);
  const __m256d c11 = _mm256_set1_pd(1.0 / 39916800.0), c10 = _mm256_set1_pd(1.0 / 3628800.0),
                c9 = _mm256_set1_pd(1.0 / 362880.0), c8 = _mm256_set1_pd(1.0 / 40320.0),
                c7 = _mm256_set1_pd(1.0 / 5040.0), c6 = _mm256_set1_pd(1.0 / 720.0),
                c5 = _mm256_set1_pd(1.0 / 120.0), c4 = _mm256_set1_pd(1.0 / 24.0), c3 = _mm256_set1_pd(1.0 / 6.0),
                c2 = _mm256_set1_pd(0.5), one = _mm256_set1_pd(1.0);
  const __m256i bias = _mm256_set1_epi64x(1023), shifter_bits = _mm256_castpd_si256(shifter);
  // The 29 low mantissa bits of a double are what rounding to fp32 drops; 2^28 there is the midpoint.
  const __m256i low_mask = _mm256_set1_epi64x(0x1fffffff), mid = _mm256_set1_epi64x(0x10000000);
  constexpr int64_t kGuard = 1024;  // double ulps; the polynomial's error is under 2^-45 (256 ulps)
  const __m256i gm = _mm256_set1_epi64x(-kGuard - 1), gp = _mm256_set1_epi64x(kGuard + 1);
  const __m256d all = _mm256_castsi256_pd(_mm256_set1_epi64x(-1));
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) {
    const __m128 xf = _mm_loadu_ps(y + j);
    const __m256d x = _mm256_cvtps_pd(xf);
    const __m256d in = _mm256_and_pd(_mm256_cmp_pd(x, lo, _CMP_GT_OQ), _mm256_cmp_pd(x, hi, _CMP_LT_OQ));
    const __m256d t = _mm256_fmadd_pd(x, inv_ln2, shifter);
    const __m256d k = _mm256_sub_pd(t, shifter);
    __m256d r = _mm256_fnmadd_pd(k, ln2_hi, x);
    r = _mm256_fnmadd_pd(k, ln2_lo, r);
    __m256d p = _mm256_fmadd_pd(c11, r, c10);
    p = _mm256_fmadd_pd(p, r, c9);
    p = _mm256_fmadd_pd(p, r, c8);
    p = _mm256_fmadd_pd(p, r, c7);
    p = _mm256_fmadd_pd(p, r, c6);
    p = _mm256_fmadd_pd(p, r, c5);
    p = _mm256_fmadd_pd(p, r, c4);
    p = _mm256_fmadd_pd(p, r, c3);
    p = _mm256_fmadd_pd(p, r, c2);
    p = _mm256_fmadd_pd(p, r, one);
    p = _mm256_fmadd_pd(p, r, one);
    const __m256i ki = _mm256_sub_epi64(_mm256_castpd_si256(t), shifter_bits);  // k as an integer
    const __m256d scale = _mm256_castsi256_pd(_mm256_slli_epi64(_mm256_add_epi64(ki, bias), 52));  // 2^k
    // lanes out of range: 0 (NaN for -inf, cleared below), redone below unless their result is +0
    const __m256d zero = _mm256_cmp_pd(x, zero_below, _CMP_LT_OQ);
    const __m256d e = _mm256_andnot_pd(zero, _mm256_mul_pd(p, _mm256_and_pd(scale, in)));
    const __m256i d = _mm256_sub_epi64(_mm256_and_si256(_mm256_castpd_si256(e), low_mask), mid);
    const __m256i near = _mm256_and_si256(_mm256_cmpgt_epi64(d, gm), _mm256_cmpgt_epi64(gp, d));
    const __m256d redo = _mm256_or_pd(_mm256_castsi256_pd(near), _mm256_andnot_pd(zero, _mm256_xor_pd(in, all)));
    _mm_storeu_ps(y + j, _mm256_cvtpd_ps(e));  // round to nearest even, as static_cast<float>
    if (const int m = _mm256_movemask_pd(redo)) {
      alignas(16) float xs[4];
      _mm_store_ps(xs, xf);
      for (int l = 0; l < 4; ++l)
        if (m & (1 << l)) y[j + l] = exact_exp(xs[l]);
    }
  }
  for (; j < n; ++j) y[j] = exact_exp(y[j]);
}
#endif

}  // namespace

void exp_row_portable(float* y, int64_t n) {
  for (int64_t j = 0; j < n; ++j) y[j] = exact_exp(y[j]);
}

bool exp_row_vectorized() {
#ifdef NSIM_EXP_AVX2
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return ok;
#else
  return false;
#endif
}

void exp_row(float* y, int64_t n) {
#ifdef NSIM_EXP_AVX2
  if (exp_row_vectorized()) {
    exp_row_avx2(y, n);
    return;
  }
#endif
  exp_row_portable(y, n);
}

}  // namespace nsim::isa::sem
