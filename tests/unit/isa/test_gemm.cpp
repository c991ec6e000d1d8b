// The multiply_moving product (isa/semantics/gemm.h): the vectorized kernel and the portable loop give
// the same bits, in the PE array's accumulation order.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
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
    // and it is the product: C[i, j] = sum_p A(p, i) B(p, j), A column-major
    double worst = 0;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double ref = 0;
        for (int64_t p = 0; p < k; ++p) ref += static_cast<double>(a[static_cast<size_t>(i * k + p)]) * b[static_cast<size_t>(p * n + j)];
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
