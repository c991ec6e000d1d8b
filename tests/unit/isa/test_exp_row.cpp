// exp over a row (isa/semantics/exp_row.h): the vectorised path gives the bits of std::exp in double
// rounded once to fp32, on every input class (the whole fp32 range was checked once, docs/performance.md).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "isa/semantics/exp_row.h"

using namespace nsim::isa::sem;

namespace {
uint32_t bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}
float from_bits(uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}
/// Number of elements where exp_row and the policy's scalar formula differ (first one in `first`).
int64_t mismatches(const std::vector<float>& in, uint32_t* first) {
  std::vector<float> got = in;
  exp_row(got.data(), static_cast<int64_t>(got.size()));
  int64_t bad = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    const float want = static_cast<float>(std::exp(static_cast<double>(in[i])));
    if (bits(want) != bits(got[i]) && bad++ == 0) *first = bits(in[i]);
  }
  return bad;
}
}  // namespace

TEST_CASE("exp_row gives the bits of std::exp in double rounded to fp32", "[exp]") {
  INFO("vectorized=" << exp_row_vectorized());
  std::vector<float> in;
  // every 4099th fp32 bit pattern (both signs, NaN, inf, subnormals), ~1 M values
  for (uint64_t u = 0; u < (uint64_t{1} << 32); u += 4099) in.push_back(from_bits(static_cast<uint32_t>(u)));
  // dense around the range limits of the fast path and where fp32 results become subnormal / overflow
  for (float c : {-87.0f, 88.5f, -87.33654f, 88.72284f, -103.97208f, -104.0f, 0.0f, 1.0f, -1.0f})
    for (int d = -2000; d <= 2000; ++d) in.push_back(from_bits(static_cast<uint32_t>(static_cast<int64_t>(bits(c)) + d)));
  const float special[] = {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(),
                           std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(), -0.0f,
                           std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::max(),
                           std::numeric_limits<float>::lowest()};
  in.insert(in.end(), std::begin(special), std::end(special));
  in.push_back(0.5f);  // a length that leaves a remainder after the groups of four
  uint32_t first = 0;
  const int64_t bad = mismatches(in, &first);
  INFO("first mismatch at input bits 0x" << std::hex << first);
  CHECK(bad == 0);
}

TEST_CASE("exp_row agrees with the portable loop on softmax-like rows of every length", "[exp]") {
  for (int64_t n = 0; n <= 37; ++n) {
    std::vector<float> a(static_cast<size_t>(n)), b;
    for (int64_t i = 0; i < n; ++i) a[static_cast<size_t>(i)] = -0.37f * static_cast<float>(i) + 0.011f * static_cast<float>(i * i % 7);
    b = a;
    exp_row(a.data(), n);
    exp_row_portable(b.data(), n);
    INFO("n=" << n);
    // (memcmp of an empty vector's data(), which may be null, is undefined: UBSan)
    CHECK((n == 0 || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0));
  }
}
