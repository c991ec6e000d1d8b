// Scalar helpers of the semantics: fp32 ALU, integer ALU, reduction identities, activation functions.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <algorithm>

#include "isa/semantics/semantics.h"

using namespace nsim;
using namespace nsim::isa;

namespace {

bool rel_close(double got, double ref, double rel, double abs_tol = 1e-30) {
  if (std::isnan(ref)) return std::isnan(got);
  if (std::isinf(ref)) return got == ref;
  return std::fabs(got - ref) <= rel * std::fabs(ref) + abs_tol;
}

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

}  // namespace

TEST_CASE("alu_apply arithmetic and comparisons", "[semantics]") {
  CHECK(alu_apply(AluOp::kBypass, 3.5f, 9.0f) == 3.5f);
  CHECK(alu_apply(AluOp::kAdd, 1.5f, 2.25f) == 3.75f);
  CHECK(alu_apply(AluOp::kSubtract, 1.5f, 2.25f) == -0.75f);
  CHECK(alu_apply(AluOp::kMultiply, 1.5f, -2.0f) == -3.0f);
  CHECK(alu_apply(AluOp::kDivide, 1.0f, 3.0f) == 1.0f / 3.0f);
  CHECK(alu_apply(AluOp::kDivide, 1.0f, 0.0f) == kInf);
  CHECK(alu_apply(AluOp::kDivide, -1.0f, 0.0f) == -kInf);
  CHECK(std::isnan(alu_apply(AluOp::kDivide, 0.0f, 0.0f)));
  CHECK(alu_apply(AluOp::kPower, 2.0f, 10.0f) == 1024.0f);
  CHECK(rel_close(alu_apply(AluOp::kPower, 3.0f, 0.5f), std::sqrt(3.0), 1e-6));
  CHECK(alu_apply(AluOp::kMaximum, -1.0f, 2.0f) == 2.0f);
  CHECK(alu_apply(AluOp::kMinimum, -1.0f, 2.0f) == -1.0f);
  CHECK(std::isnan(alu_apply(AluOp::kMaximum, kNaN, 2.0f)));
  CHECK(std::isnan(alu_apply(AluOp::kMaximum, 2.0f, kNaN)));
  CHECK(std::isnan(alu_apply(AluOp::kMinimum, kNaN, 2.0f)));
  CHECK(alu_apply(AluOp::kEqual, 2.0f, 2.0f) == 1.0f);
  CHECK(alu_apply(AluOp::kEqual, 2.0f, 3.0f) == 0.0f);
  CHECK(alu_apply(AluOp::kNotEqual, 2.0f, 3.0f) == 1.0f);
  CHECK(alu_apply(AluOp::kNotEqual, kNaN, kNaN) == 1.0f);
  CHECK(alu_apply(AluOp::kEqual, kNaN, kNaN) == 0.0f);
  CHECK(alu_apply(AluOp::kGreater, 3.0f, 2.0f) == 1.0f);
  CHECK(alu_apply(AluOp::kGreater, 2.0f, 2.0f) == 0.0f);
  CHECK(alu_apply(AluOp::kGreaterEqual, 2.0f, 2.0f) == 1.0f);
  CHECK(alu_apply(AluOp::kLess, 1.0f, 2.0f) == 1.0f);
  CHECK(alu_apply(AluOp::kLess, 2.0f, 2.0f) == 0.0f);
  CHECK(alu_apply(AluOp::kLessEqual, 2.0f, 2.0f) == 1.0f);
  CHECK(alu_apply(AluOp::kLessEqual, 3.0f, 2.0f) == 0.0f);
}

TEST_CASE("alu_apply logical, abs_max/min, mod, unary", "[semantics]") {
  CHECK(alu_apply(AluOp::kLogicalAnd, 2.0f, -3.0f) == 1.0f);
  CHECK(alu_apply(AluOp::kLogicalAnd, 2.0f, 0.0f) == 0.0f);
  CHECK(alu_apply(AluOp::kLogicalOr, 0.0f, -0.0f) == 0.0f);
  CHECK(alu_apply(AluOp::kLogicalOr, 0.0f, 0.5f) == 1.0f);
  CHECK(alu_apply(AluOp::kLogicalXor, 1.0f, 5.0f) == 0.0f);
  CHECK(alu_apply(AluOp::kLogicalXor, 1.0f, 0.0f) == 1.0f);
  CHECK(alu_apply(AluOp::kLogicalNot, 0.0f, 7.0f) == 1.0f);
  CHECK(alu_apply(AluOp::kLogicalNot, 3.0f, 0.0f) == 0.0f);

  CHECK(alu_apply(AluOp::kAbsMax, -5.0f, 3.0f) == -5.0f);
  CHECK(alu_apply(AluOp::kAbsMax, 2.0f, -3.0f) == -3.0f);
  CHECK(alu_apply(AluOp::kAbsMax, 3.0f, -3.0f) == -3.0f);  // tie -> y
  CHECK(alu_apply(AluOp::kAbsMin, -5.0f, 3.0f) == 3.0f);
  CHECK(alu_apply(AluOp::kAbsMin, -2.0f, 3.0f) == -2.0f);
  CHECK(alu_apply(AluOp::kAbsMin, -3.0f, 3.0f) == 3.0f);  // tie -> y

  // mod follows the sign of y (Python %), fmod the sign of x (C fmod).
  CHECK(alu_apply(AluOp::kMod, 7.0f, 3.0f) == 1.0f);
  CHECK(alu_apply(AluOp::kMod, -7.0f, 3.0f) == 2.0f);
  CHECK(alu_apply(AluOp::kMod, 7.0f, -3.0f) == -2.0f);
  CHECK(alu_apply(AluOp::kMod, -7.0f, -3.0f) == -1.0f);
  CHECK(alu_apply(AluOp::kMod, 6.0f, 3.0f) == 0.0f);
  CHECK(alu_apply(AluOp::kFmod, -7.0f, 3.0f) == -1.0f);
  CHECK(alu_apply(AluOp::kFmod, 7.0f, -3.0f) == 1.0f);
  CHECK(alu_apply(AluOp::kMod, 5.5f, 2.0f) == 1.5f);

  // Unary ops ignore y.
  CHECK(alu_apply(AluOp::kAbs, -2.5f, 100.0f) == 2.5f);
  CHECK(alu_apply(AluOp::kSquare, -3.0f, 100.0f) == 9.0f);
  CHECK(alu_apply(AluOp::kRelu, -3.0f, 100.0f) == 0.0f);
  CHECK(alu_apply(AluOp::kRelu, 3.0f, -100.0f) == 3.0f);
  CHECK(alu_apply(AluOp::kRsqrt, 4.0f, 100.0f) == 0.5f);
  CHECK(alu_apply(AluOp::kRsqrt, 0.0f, 100.0f) == kInf);
  CHECK(alu_apply(AluOp::kReciprocal, 4.0f, 100.0f) == 0.25f);
  CHECK(alu_apply(AluOp::kNegative, 4.0f, 100.0f) == -4.0f);
}

TEST_CASE("alu_apply_int bit-vector and exact arithmetic", "[semantics]") {
  CHECK(alu_apply_int(AluOp::kBitwiseAnd, 0xF0F0, 0x0FF0) == 0x00F0);
  CHECK(alu_apply_int(AluOp::kBitwiseOr, 0xF000, 0x000F) == 0xF00F);
  CHECK(alu_apply_int(AluOp::kBitwiseXor, 0xFF, 0x0F) == 0xF0);
  CHECK(alu_apply_int(AluOp::kInvert, 0, 123) == -1);
  CHECK(alu_apply_int(AluOp::kLeftShift, 3, 4) == 48);
  CHECK(alu_apply_int(AluOp::kRightShift, 48, 4) == 3);
  // Logical right shift of the 32-bit pattern: -1 >> 28 = 0xF.
  CHECK(alu_apply_int(AluOp::kRightShift, -1, 28) == 0xF);
  CHECK(alu_apply_int(AluOp::kRightShift, 0x80000000ll, 31) == 1);
  CHECK(alu_apply_int(AluOp::kAdd, 16777217, 1) == 16777218);
  CHECK(alu_apply_int(AluOp::kSubtract, 5, 7) == -2);
  CHECK(alu_apply_int(AluOp::kMultiply, 100003, 100019) == 100003ll * 100019ll);
  CHECK(alu_apply_int(AluOp::kMaximum, -5, 3) == 3);
  CHECK(alu_apply_int(AluOp::kMinimum, -5, 3) == -5);
  CHECK(alu_apply_int(AluOp::kEqual, 16777217, 16777216) == 0);
  CHECK(alu_apply_int(AluOp::kGreaterEqual, 0, 0) == 1);
  // The fp32 ALU routes bit-vector ops through the integer ALU.
  CHECK(alu_apply(AluOp::kBitwiseAnd, 12.0f, 10.0f) == 8.0f);
}

TEST_CASE("alu_identity", "[semantics]") {
  CHECK(alu_identity(AluOp::kAdd) == 0.0f);
  CHECK(alu_identity(AluOp::kMultiply) == 1.0f);
  CHECK(alu_identity(AluOp::kMaximum) == -kInf);
  CHECK(alu_identity(AluOp::kMinimum) == kInf);
  CHECK(alu_identity(AluOp::kBitwiseOr) == 0.0f);
  CHECK(alu_identity(AluOp::kBitwiseXor) == 0.0f);
  CHECK(alu_identity(AluOp::kBitwiseAnd) == -1.0f);
  CHECK(alu_identity(AluOp::kLogicalAnd) == 1.0f);
  CHECK(alu_identity(AluOp::kLogicalOr) == 0.0f);
}

namespace {
double sigm(double x) { return 1.0 / (1.0 + std::exp(-x)); }
double ref_act(ActFunc f, double x, double alpha) {
  const double pi = 3.14159265358979323846;
  switch (f) {
    case ActFunc::kCopy: return x;
    case ActFunc::kSquare: return x * x;
    case ActFunc::kSigmoid: return sigm(x);
    case ActFunc::kRelu: return std::max(x, 0.0);
    case ActFunc::kPrelu: return x >= 0 ? x : alpha * x;
    case ActFunc::kGelu: return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
    case ActFunc::kGeluDx:
      return 0.5 * (1.0 + std::erf(x / std::sqrt(2.0))) + x * std::exp(-x * x / 2.0) / std::sqrt(2.0 * pi);
    case ActFunc::kGeluApprxTanh:
      return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / pi) * (x + 0.044715 * std::pow(x, 3))));
    case ActFunc::kGeluApprxSigmoid: return x * sigm(1.702 * x);
    case ActFunc::kGeluApprxSigmoidDx: return sigm(1.702 * x) * (1.0 + 1.702 * x * (1.0 - sigm(1.702 * x)));
    case ActFunc::kSilu: return x * sigm(x);
    case ActFunc::kSiluDx: return sigm(x) * (1.0 + x * (1.0 - sigm(x)));
    case ActFunc::kTanh: return std::tanh(x);
    case ActFunc::kSoftplus: return std::log(1.0 + std::exp(x));
    case ActFunc::kMish: return x * std::tanh(std::log(1.0 + std::exp(x)));
    case ActFunc::kErf: return std::erf(x);
    case ActFunc::kErfDx: return 2.0 / std::sqrt(pi) * std::exp(-x * x);
    case ActFunc::kExp: return std::exp(x);
    case ActFunc::kLog: return std::log(x);
    case ActFunc::kSin: return std::sin(x);
    case ActFunc::kArctan: return std::atan(x);
    case ActFunc::kSqrt: return std::sqrt(x);
    case ActFunc::kRsqrt: return 1.0 / std::sqrt(x);
    case ActFunc::kReciprocal: return 1.0 / x;
    case ActFunc::kSign: return x > 0 ? 1.0 : (x < 0 ? -1.0 : 0.0);
    case ActFunc::kAbs: return std::fabs(x);
  }
  return 0.0;
}
}  // namespace

TEST_CASE("act_apply: every activation function matches std:: math in double", "[semantics]") {
  const ActFunc all[] = {
#define ACT(e, name, ...) ActFunc::e,
#include "isa/act_funcs.def"
#undef ACT
  };
  const float xs[] = {-3.0f, -1.25f, -0.5f, 0.0f, 0.3f, 1.0f, 2.5f};
  const float pos[] = {0.0625f, 0.3f, 1.0f, 2.5f, 17.0f};
  for (ActFunc f : all) {
    const bool positive_only = f == ActFunc::kLog || f == ActFunc::kSqrt || f == ActFunc::kRsqrt;
    for (float x : positive_only ? std::span<const float>(pos) : std::span<const float>(xs)) {
      if (f == ActFunc::kReciprocal && x == 0.0f) continue;
      const double ref = ref_act(f, x, 0.125);
      const float got = act_apply(f, x, 0.125f);
      INFO("act " << static_cast<int>(f) << " x=" << x << " got=" << got << " ref=" << ref);
      CHECK(rel_close(got, ref, 2e-6, 1e-7));
    }
  }
  // Special points.
  CHECK(act_apply(ActFunc::kSign, 0.0f) == 0.0f);
  CHECK(act_apply(ActFunc::kSign, -0.0f) == 0.0f);
  CHECK(act_apply(ActFunc::kSign, -7.0f) == -1.0f);
  CHECK(act_apply(ActFunc::kPrelu, -2.0f, 0.25f) == -0.5f);
  CHECK(act_apply(ActFunc::kPrelu, 2.0f, 0.25f) == 2.0f);
  CHECK(act_apply(ActFunc::kReciprocal, 0.0f) == kInf);
  CHECK(act_apply(ActFunc::kLog, 0.0f) == -kInf);
  CHECK(std::isnan(act_apply(ActFunc::kLog, -1.0f)));
  CHECK(act_apply(ActFunc::kSoftplus, 100.0f) == 100.0f);  // no overflow
  CHECK(act_apply(ActFunc::kSigmoid, -200.0f) == 0.0f);
  CHECK(act_apply(ActFunc::kExp, 100.0f) == kInf);  // overflows fp32
  CHECK(rel_close(act_apply(ActFunc::kGelu, 10.0f), 10.0, 1e-7));
}
