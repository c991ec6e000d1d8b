// alu_fold's max / min (the reductions of tensor_reduce, activation, ...): the vectorised path gives the
// bits of the sequential left fold, NaN and signed zeros included.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "isa/semantics/semantics.h"

using nsim::isa::AluOp;
using nsim::isa::alu_fold;

namespace {
float seq_fold(AluOp op, float r, const std::vector<float>& y) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (float v : y) {
    if (std::isnan(r) || std::isnan(v)) r = nan;
    else if (op == AluOp::kMaximum) r = r < v ? v : r;
    else r = v < r ? v : r;
  }
  return r;
}
uint32_t bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}
}  // namespace

TEST_CASE("alu_fold max and min give the sequential fold's bits", "[semantics][fold]") {
  std::mt19937 rng(11);
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  int cases = 0;
  for (int n : {0, 1, 7, 15, 16, 17, 31, 64, 100, 1000}) {
    for (int kind = 0; kind < 7; ++kind) {
      std::vector<float> y(static_cast<size_t>(n));
      std::uniform_int_distribution<int> pick(0, 5);
      std::normal_distribution<float> nd(0.0f, 3.0f);
      for (float& v : y) {
        switch (kind) {
          case 0: v = nd(rng); break;                                    // plain values
          case 1: v = pick(rng) < 3 ? 0.0f : -0.0f; break;               // only signed zeros
          case 2: v = pick(rng) == 0 ? -0.0f : -std::fabs(nd(rng)); break;  // max is a zero (-0 first?)
          case 3: v = pick(rng) == 0 ? nan : nd(rng); break;             // NaNs
          case 4: v = pick(rng) == 0 ? -inf : (pick(rng) == 0 ? inf : nd(rng)); break;
          case 5: v = static_cast<float>(pick(rng)); break;              // many ties
          default: v = pick(rng) == 0 ? 0.0f : std::fabs(nd(rng)); break;  // min is a zero
        }
      }
      for (AluOp op : {AluOp::kMaximum, AluOp::kMinimum})
        for (float r0 : {-inf, inf, 0.0f, -0.0f, 1.5f, nan}) {
          const float want = seq_fold(op, r0, y), got = alu_fold(op, r0, y.data(), n);
          INFO("n=" << n << " kind=" << kind << " max=" << (op == AluOp::kMaximum) << " r0=" << r0);
          CHECK(bits(want) == bits(got));
          ++cases;
        }
    }
  }
  CHECK(cases == 10 * 7 * 2 * 6);
}
