#pragma once
/// exp over a row of fp32 values with the numerics policy's bits (isa/semantics/common.cpp: evaluated
/// in double, rounded once to fp32): y[j] = (float)std::exp((double)y[j]).
///
/// Where the CPU has AVX2 and FMA, four lanes at a time: a polynomial exp in double with a relative
/// error under 2^-45 (Cody-Waite reduction to |r| <= ln2/2, Taylor to degree 11), accepted only when
/// the double result lies more than 1024 double ulps away from the midpoint between two floats (the
/// only place where that error, or the < 1 ulp of std::exp, can change the rounding to fp32).
/// Lanes near a midpoint (~4 in a million), outside [-87, 88.5] (subnormal or overflowing fp32
/// results) or NaN take std::exp itself, so every result is the bits std::exp gives. Checked over all
/// 2^32 fp32 inputs (docs/performance.md) and sampled in tests/unit/isa/test_exp_row.cpp.
#include <cstdint>

namespace nsim::isa::sem {

void exp_row(float* y, int64_t n);
/// The scalar loop alone (std::exp per element; tests compare the two paths bit for bit).
void exp_row_portable(float* y, int64_t n);
/// True when exp_row uses the AVX2 + FMA kernel on this machine.
bool exp_row_vectorized();

}  // namespace nsim::isa::sem
