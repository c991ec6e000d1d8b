// The multiply_moving matrix product: see gemm.h. (Compiled with -ffp-contract=off: a fused
// multiply-add would change the bits and differ between machines.)
#include "isa/semantics/gemm.h"

#include <algorithm>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define NSIM_GEMM_AVX2 1
#endif

namespace nsim::isa::sem {

void gemm_tn_portable(const float* a, int64_t k, int64_t m, const float* b, int64_t n, float* c) {
  for (int64_t i = 0; i < m; ++i) {
    float* row = c + i * n;
    std::fill(row, row + n, 0.0f);
    const float* col = a + i * k;  // column i of A: A(0..k-1, i)
    for (int64_t p = 0; p < k; ++p) {
      const float x = col[p];
      const float* brow = b + p * n;
      for (int64_t j = 0; j < n; ++j) row[j] = row[j] + x * brow[j];
    }
  }
}

#ifdef NSIM_GEMM_AVX2
namespace {

// R rows of C x 16 columns, accumulated in registers over all k (the same per-element order as the
// portable loop: acc = acc + a * b, k ascending).
template <int R>
__attribute__((target("avx2"))) void block16(const float* a, int64_t k, const float* b, int64_t n, float* c,
                                             int64_t i0, int64_t j0) {
  __m256 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (int64_t p = 0; p < k; ++p) {
    const __m256 b0 = _mm256_loadu_ps(b + p * n + j0);
    const __m256 b1 = _mm256_loadu_ps(b + p * n + j0 + 8);
    for (int r = 0; r < R; ++r) {
      const __m256 x = _mm256_broadcast_ss(a + (i0 + r) * k + p);
      acc[r][0] = _mm256_add_ps(acc[r][0], _mm256_mul_ps(x, b0));
      acc[r][1] = _mm256_add_ps(acc[r][1], _mm256_mul_ps(x, b1));
    }
  }
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_ps(c + (i0 + r) * n + j0, acc[r][0]);
    _mm256_storeu_ps(c + (i0 + r) * n + j0 + 8, acc[r][1]);
  }
}

// One row of C, columns [j0, n) (fewer than 16), 8 at a time then one by one.
__attribute__((target("avx2"))) void row_tail(const float* a, int64_t k, const float* b, int64_t n, float* c,
                                               int64_t i, int64_t j0) {
  int64_t j = j0;
  for (; j + 8 <= n; j += 8) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t p = 0; p < k; ++p)
      acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_broadcast_ss(a + i * k + p), _mm256_loadu_ps(b + p * n + j)));
    _mm256_storeu_ps(c + i * n + j, acc);
  }
  for (; j < n; ++j) {
    float acc = 0.0f;
    for (int64_t p = 0; p < k; ++p) acc = acc + a[i * k + p] * b[p * n + j];
    c[i * n + j] = acc;
  }
}

__attribute__((target("avx2"))) void gemm_avx2(const float* a, int64_t k, int64_t m, const float* b, int64_t n,
                                                float* c) {
  const int64_t n16 = n / 16 * 16;
  // Column blocks of 16 outermost: the 16 columns of B (k x 64 bytes) stay in L1 for every row block.
  for (int64_t j = 0; j < n16; j += 16) {
    int64_t i = 0;
    for (; i + 4 <= m; i += 4) block16<4>(a, k, b, n, c, i, j);
    for (; i < m; ++i) block16<1>(a, k, b, n, c, i, j);
  }
  if (n16 < n)
    for (int64_t i = 0; i < m; ++i) row_tail(a, k, b, n, c, i, n16);
}

// The same with 512-bit vectors: R rows x 32 columns.
template <int R>
__attribute__((target("avx512f"))) void block32(const float* a, int64_t k, const float* b, int64_t n, float* c,
                                                int64_t i0, int64_t j0) {
  __m512 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  for (int64_t p = 0; p < k; ++p) {
    const __m512 b0 = _mm512_loadu_ps(b + p * n + j0);
    const __m512 b1 = _mm512_loadu_ps(b + p * n + j0 + 16);
    for (int r = 0; r < R; ++r) {
      const __m512 x = _mm512_set1_ps(a[(i0 + r) * k + p]);
      acc[r][0] = _mm512_add_ps(acc[r][0], _mm512_mul_ps(x, b0));
      acc[r][1] = _mm512_add_ps(acc[r][1], _mm512_mul_ps(x, b1));
    }
  }
  for (int r = 0; r < R; ++r) {
    _mm512_storeu_ps(c + (i0 + r) * n + j0, acc[r][0]);
    _mm512_storeu_ps(c + (i0 + r) * n + j0 + 16, acc[r][1]);
  }
}

bool has_avx512() {
  static const bool ok = __builtin_cpu_supports("avx512f");
  return ok;
}

__attribute__((target("avx512f"))) void gemm_avx512(const float* a, int64_t k, int64_t m, const float* b, int64_t n,
                                                     float* c) {
  const int64_t n32 = n / 32 * 32;
  for (int64_t j = 0; j < n32; j += 32) {
    int64_t i = 0;
    for (; i + 4 <= m; i += 4) block32<4>(a, k, b, n, c, i, j);
    for (; i < m; ++i) block32<1>(a, k, b, n, c, i, j);
  }
  // the remaining columns (fewer than 32), 8 then 1 at a time (block16 stays called from gemm_avx2
  // alone, where it is inlined: called from here too it was not, and the AVX2 path got 30% slower)
  if (n32 < n)
    for (int64_t i = 0; i < m; ++i) row_tail(a, k, b, n, c, i, n32);
}

}  // namespace
#endif

bool gemm_tn_vectorized() {
#ifdef NSIM_GEMM_AVX2
  static const bool avx2 = __builtin_cpu_supports("avx2");
  return avx2;
#else
  return false;
#endif
}

void gemm_tn(const float* a, int64_t k, int64_t m, const float* b, int64_t n, float* c) {
#ifdef NSIM_GEMM_AVX2
  if (gemm_tn_vectorized()) {
    if (has_avx512()) {
      gemm_avx512(a, k, m, b, n, c);
      return;
    }
    gemm_avx2(a, k, m, b, n, c);
    return;
  }
#endif
  gemm_tn_portable(a, k, m, b, n, c);
}

}  // namespace nsim::isa::sem
