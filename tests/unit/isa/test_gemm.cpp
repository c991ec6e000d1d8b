// The multiply_moving product (isa/semantics/gemm.h): the vectorized kernel and the portable loop give
// the same bits, in the PE array's accumulation order.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "isa/semantics/gemm.h"

using namespace nsim::isa::sem;

TEST_CASE("gemm_tn gives the same bits as the portable loop, remainders included", "[gemm]") {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int64_t shapes[][3] = {{128, 128, 512}, {13, 5, 37}, {1, 1, 1}, {256, 128, 24}, {7, 130, 16}, {64, 3, 9}};
  for (const auto& s : shapes) {
    const int64_t k = s[0], m = s[1], n = s[2];
    std::vector<float> a(static_cast<size_t>(k * m)), b(static_cast<size_t>(k * n));
    for (float& x : a) x = nd(rng);
    for (float& x : b) x = nd(rng);
    std::vector<float> c(static_cast<size_t>(m * n), -1.0f), d(static_cast<size_t>(m * n), -2.0f);
    gemm_tn(a.data(), k, m, b.data(), n, c.data());
    gemm_tn_portable(a.data(), k, m, b.data(), n, d.data());
    INFO("k=" << k << " m=" << m << " n=" << n << " vectorized=" << gemm_tn_vectorized());
    CHECK(std::memcmp(c.data(), d.data(), c.size() * sizeof(float)) == 0);
    // and it is the product: C[i, j] = sum_p A(p, i) B(p, j), A row-major
    double worst = 0;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double ref = 0;
        for (int64_t p = 0; p < k; ++p) ref += static_cast<double>(a[static_cast<size_t>(p * m + i)]) * b[static_cast<size_t>(p * n + j)];
        worst = std::max(worst, std::abs(ref - c[static_cast<size_t>(i * n + j)]));
      }
    CHECK(worst < 1e-3);
  }
}

TEST_CASE("gemm_tn accumulates in k order with a rounding after each multiply and add", "[gemm]") {
  // 1 + 2^-24 is lost when added to 1 alone: (1 + 2^-24) + 2^-24 in order gives 1, not 1 + 2^-23, and a
  // fused multiply-add would keep the product's low bits. k order: 1*1, then 2^-24 * 1, then 2^-24 * 1.
  const float e = std::ldexp(1.0f, -24);
  const std::vector<float> a = {1.0f, e, e}, b = {1.0f, 1.0f, 1.0f};
  float c = 0;
  gemm_tn(a.data(), 3, 1, b.data(), 1, &c);
  CHECK(c == 1.0f);
  // a product that is not exact in fp32 is rounded before the add: (1 + 2^-12)^2 = 1 + 2^-11 + 2^-24
  const float x = 1.0f + std::ldexp(1.0f, -12);
  const std::vector<float> a2(16, x), b2(16, x);  // 16 columns: the vectorized block
  std::vector<float> c2(16);
  gemm_tn(a2.data(), 1, 1, b2.data(), 16, c2.data());
  for (float v : c2) CHECK(v == x * x);
}

namespace {
// x rounded to bf16 (truncated: any value with 8 significant bits will do)
float to_bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  u &= 0xFFFF0000u;
  std::memcpy(&x, &u, sizeof u);
  return x;
}
}  // namespace

TEST_CASE("gemm_tn on bf16 values (the fused path) gives the portable loop's bits", "[gemm]") {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int64_t shapes[][3] = {{128, 128, 512}, {128, 13, 70}, {3, 9, 33}, {256, 128, 64}, {128, 7, 16}, {1, 130, 32}};
  for (const auto& s : shapes) {
    const int64_t k = s[0], m = s[1], n = s[2];
    std::vector<float> a(static_cast<size_t>(k * m)), b(static_cast<size_t>(k * n));
    for (float& x : a) x = to_bf16(nd(rng));
    for (float& x : b) x = to_bf16(nd(rng) * 8.0f);
    REQUIRE(gemm_products_exact(a.data(), k * m, b.data(), k * n));
    std::vector<float> c(static_cast<size_t>(m * n), -1.0f), d(static_cast<size_t>(m * n), -2.0f);
    gemm_tn(a.data(), k, m, b.data(), n, c.data());
    gemm_tn_portable(a.data(), k, m, b.data(), n, d.data());
    INFO("k=" << k << " m=" << m << " n=" << n);
    CHECK(std::memcmp(c.data(), d.data(), c.size() * sizeof(float)) == 0);
  }
}

TEST_CASE("gemm_products_exact: 12 significant bits and products in fp32's normal range", "[gemm]") {
  const float one[] = {1.0f, -0.5f, 3.0f};
  CHECK(gemm_products_exact(one, 3, one, 3));
  const float bits12[] = {1.0f + std::ldexp(1.0f, -11)};  // 12 significant bits: exact
  const float bits13[] = {1.0f + std::ldexp(1.0f, -12)};  // 13
  CHECK(gemm_products_exact(bits12, 1, bits12, 1));
  CHECK_FALSE(gemm_products_exact(bits13, 1, one, 3));
  CHECK_FALSE(gemm_products_exact(one, 3, bits13, 1));
  const float inf[] = {1.0f, std::numeric_limits<float>::infinity()}, nan[] = {std::nanf("")};
  CHECK_FALSE(gemm_products_exact(inf, 2, one, 3));
  CHECK_FALSE(gemm_products_exact(one, 3, nan, 1));
  // 2^64 * 2^63 = 2^127: the largest power of two fp32 holds, but not below the bound this asks
  const float big[] = {std::ldexp(1.0f, 64)}, big2[] = {std::ldexp(1.0f, 62)}, big3[] = {std::ldexp(1.0f, 63)};
  CHECK(gemm_products_exact(big, 1, big2, 1));
  CHECK_FALSE(gemm_products_exact(big, 1, big3, 1));
  // 2^-63 * 2^-63 = 2^-126 (the least normal) is exact; 2^-64 * 2^-63 is not
  const float tiny[] = {std::ldexp(1.0f, -63)}, tinier[] = {std::ldexp(1.0f, -64)};
  CHECK(gemm_products_exact(tiny, 1, tiny, 1));
  CHECK_FALSE(gemm_products_exact(tinier, 1, tiny, 1));
  const float zeros[] = {0.0f, -0.0f};  // all products +-0 whatever the other side holds (if finite)
  CHECK(gemm_products_exact(zeros, 2, big, 1));
  CHECK(gemm_products_exact(tinier, 1, zeros, 2));
}

TEST_CASE("gemm_tn where a fused multiply-add would round differently keeps the separate roundings", "[gemm]") {
  // Overflow: 2^100 * 2^30 rounds to +inf before the add of -FLT_MAX (inf), where a fused multiply-add
  // would give 2^130 - FLT_MAX, finite. Underflow: 2^-75 * 2^-75 = 2^-150 rounds to 0 (a tie, to even)
  // before it is added to 2^-149, where a fused multiply-add would round 1.5 x 2^-149 up to 2^-148.
  const float fmax = std::numeric_limits<float>::max();
  for (int over = 0; over < 2; ++over) {
    const int64_t k = 2, m = 1, n = 32;  // one 32-column block
    const std::vector<float> a = over ? std::vector<float>{1.0f, std::ldexp(1.0f, 100)}
                                      : std::vector<float>{std::ldexp(1.0f, -149), std::ldexp(1.0f, -75)};
    std::vector<float> b(static_cast<size_t>(k * n));
    for (int64_t j = 0; j < n; ++j) {
      b[static_cast<size_t>(j)] = over ? -fmax : 1.0f;
      b[static_cast<size_t>(n + j)] = over ? std::ldexp(1.0f, 30) : std::ldexp(1.0f, -75);
    }
    std::vector<float> c(static_cast<size_t>(n)), d(static_cast<size_t>(n));
    gemm_tn(a.data(), k, m, b.data(), n, c.data());
    gemm_tn_portable(a.data(), k, m, b.data(), n, d.data());
    CHECK(std::memcmp(c.data(), d.data(), c.size() * sizeof(float)) == 0);
    CHECK(c[0] == (over ? std::numeric_limits<float>::infinity() : std::ldexp(1.0f, -149)));
  }
}

TEST_CASE("gemm_tn into strided rows, accumulating: C + (A^T B), the product summed first", "[gemm]") {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int exact = 0; exact < 2; ++exact) {
    const int64_t k = 128, m = 20, n = 72, ldc = 100;  // 72: two 32-column blocks and a tail
    std::vector<float> a(static_cast<size_t>(k * m)), b(static_cast<size_t>(k * n));
    for (float& x : a) x = exact ? to_bf16(nd(rng)) : nd(rng);
    for (float& x : b) x = exact ? to_bf16(nd(rng)) : nd(rng);
    std::vector<float> c0(static_cast<size_t>(m * ldc));
    for (float& x : c0) x = nd(rng) * 100.0f;
    std::vector<float> prod(static_cast<size_t>(m * n));
    gemm_tn_portable(a.data(), k, m, b.data(), n, prod.data());
    for (int acc = 0; acc < 2; ++acc) {
      std::vector<float> c = c0, d = c0;
      gemm_tn(a.data(), k, m, b.data(), n, c.data(), ldc, acc != 0);
      gemm_tn_portable(a.data(), k, m, b.data(), n, d.data(), ldc, acc != 0);
      INFO("exact=" << exact << " accumulate=" << acc);
      CHECK(std::memcmp(c.data(), d.data(), c.size() * sizeof(float)) == 0);
      bool same = true;
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < ldc; ++j) {
          const size_t at = static_cast<size_t>(i * ldc + j);
          const float want = j >= n ? c0[at] : acc ? c0[at] + prod[static_cast<size_t>(i * n + j)] : prod[static_cast<size_t>(i * n + j)];
          same = same && std::memcmp(&c[at], &want, sizeof want) == 0;
        }
      CHECK(same);  // and the columns past n, between the rows, untouched
    }
  }
}
