// Shared pieces of the functional semantics: tile views, row access, the ALU, activation functions.
//
// Numerics decisions (nsim policy where the spec is silent):
//  - maximum/minimum: NaN if either operand is NaN (no IEEE fmax "ignore NaN"); on equal values
//    (incl. +0/-0) the first operand is returned.
//  - abs_max/abs_min: operand with the larger/smaller magnitude, tie -> y; NaN if either is NaN.
//  - comparisons give 1.0/0.0 (IEEE: NaN compares false, not_equal true); logical ops use x != 0
//    (NaN counts as true).
//  - divide/reciprocal IEEE (x/0 -> +-inf, 0/0 -> NaN); power = powf; mod = Python % (sign of y,
//    via fmod + correction; y == 0 -> NaN); fmod = C fmod.
//  - relu(NaN) = NaN; rsqrt(0) = +inf.
//  - bit-vector ops in the fp32 ALU: operands truncated to integers, computed by alu_apply_int.
//  - average (tensor_partition_reduce only) behaves as add here; the caller divides by the count.
//  - Activation functions are evaluated in double from the fp32 input and rounded once to fp32
//    (the "exact function in fp32"); copy passes the value through bit-exactly.
#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include <fmt/format.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define NSIM_FOLD_AVX2 1
#endif

#include "isa/semantics/exp_row.h"
#include "isa/semantics/internal.h"

namespace nsim::isa {

// ---------------------------------------------------------------------------------------------
// TileView

int64_t TileView::elems() const {
  int64_t n = 1;
  for (int d = 0; d < nfree; ++d) n *= size[static_cast<size_t>(d)];
  return n;
}

bool TileView::contiguous() const {
  int64_t expect = 1;
  for (int d = nfree - 1; d >= 0; --d) {
    const auto du = static_cast<size_t>(d);
    if (size[du] > 1 && stride[du] != expect) return false;
    expect *= size[du];
  }
  return true;
}

uint8_t* TileView::at(uint32_t p, int64_t flat) const {
  int64_t off = 0;  // elements
  for (int d = nfree - 1; d >= 0; --d) {
    const auto du = static_cast<size_t>(d);
    const int64_t s = size[du];
    if (s <= 0) break;
    off += (flat % s) * stride[du];
    flat /= s;
  }
  return base + static_cast<int64_t>(p) * partition_stride_bytes + off * dtype_bytes(dtype);
}

std::pair<const uint8_t*, const uint8_t*> TileView::host_span() const {
  if (partitions == 0) return {base, base};
  const int64_t es = dtype_bytes(dtype);
  int64_t lo = 0, hi = 0;  // bytes from base
  for (int d = 0; d < nfree; ++d) {
    const auto du = static_cast<size_t>(d);
    if (size[du] <= 0) return {base, base};
    const int64_t reach = (size[du] - 1) * stride[du] * es;
    (reach < 0 ? lo : hi) += reach;
  }
  (partition_stride_bytes < 0 ? lo : hi) += static_cast<int64_t>(partitions - 1) * partition_stride_bytes;
  return {base + lo, base + hi + es};
}

bool TileView::same_as(const TileView& o) const {
  if (base != o.base || dtype != o.dtype || partitions != o.partitions ||
      partition_stride_bytes != o.partition_stride_bytes || nfree != o.nfree)
    return false;
  for (int d = 0; d < nfree; ++d)
    if (size[static_cast<size_t>(d)] != o.size[static_cast<size_t>(d)] ||
        stride[static_cast<size_t>(d)] != o.stride[static_cast<size_t>(d)])
      return false;
  return true;
}

bool may_overlap(const TileView& a, const TileView& b) {
  if (!a.valid() || !b.valid()) return false;
  const auto [alo, ahi] = a.host_span();
  const auto [blo, bhi] = b.host_span();
  if (alo >= ahi || blo >= bhi || ahi <= blo || bhi <= alo) return false;
  const int64_t pitch = a.partition_stride_bytes;
  if (pitch <= 0 || b.partition_stride_bytes != pitch) return true;
  // Partition q of a view starting at lo holds bytes [lo + q * pitch, lo + q * pitch + len) with len its
  // span less the other partitions. Measured from a's first byte: rows of `pitch` bytes, b's partitions
  // from row r0 at column `first` (when a partition's bytes reach past its row, the next row's too).
  const int64_t alen = (ahi - alo) - static_cast<int64_t>(a.partitions - 1) * pitch;
  const int64_t blen = (bhi - blo) - static_cast<int64_t>(b.partitions - 1) * pitch;
  if (alen > pitch || blen > pitch) return true;
  const int64_t from = blo - alo;
  const int64_t r0 = from >= 0 ? from / pitch : -((-from + pitch - 1) / pitch);
  const int64_t first = from - r0 * pitch;  // [0, pitch)
  // b's bytes in a row: [first, first + blen), then [0, first + blen - pitch) in the next row.
  const int64_t an = a.partitions;
  const auto rows_meet = [&](int64_t r) { return r < an && r + static_cast<int64_t>(b.partitions) > 0; };
  if (rows_meet(r0) && first < alen) return true;
  return first + blen > pitch && rows_meet(r0 + 1);
}

namespace {

/// Call f(ptr, n, stride_bytes, flat0) for every innermost run of partition p, in row-major order.
template <class F>
void for_each_run(const TileView& v, uint32_t p, F&& f) {
  const int64_t es = dtype_bytes(v.dtype);
  uint8_t* row = v.base + static_cast<int64_t>(p) * v.partition_stride_bytes;
  if (v.nfree == 0) {
    f(row, int64_t{1}, es, int64_t{0});
    return;
  }
  const int nf = v.nfree;
  for (int d = 0; d < nf; ++d)
    if (v.size[static_cast<size_t>(d)] <= 0) return;
  const auto inner = static_cast<size_t>(nf - 1);
  const int64_t n = v.size[inner];
  const int64_t sb = v.stride[inner] * es;
  std::array<int64_t, kMaxFreeDims> idx{};
  int64_t flat = 0;
  while (true) {
    int64_t off = 0;
    for (int d = 0; d < nf - 1; ++d) off += idx[static_cast<size_t>(d)] * v.stride[static_cast<size_t>(d)];
    f(row + off * es, n, sb, flat);
    flat += n;
    int d = nf - 2;
    for (; d >= 0; --d) {
      const auto du = static_cast<size_t>(d);
      if (++idx[du] < v.size[du]) break;
      idx[du] = 0;
    }
    if (d < 0) return;
  }
}

}  // namespace

void read_row(const TileView& v, uint32_t p, float* out) {
  const DType t = v.dtype;
  const int64_t es = dtype_bytes(t);
  for_each_run(v, p, [&](uint8_t* ptr, int64_t n, int64_t sb, int64_t flat0) {
    if (sb == es) {
      load_f32_n(t, ptr, out + flat0, n);
    } else {
      for (int64_t i = 0; i < n; ++i) out[flat0 + i] = load_f32(t, ptr + i * sb);
    }
  });
}

const float* row_f32(const TileView& v, uint32_t p, float* scratch) {
  if (v.dtype == DType::kFloat32 && v.contiguous()) {
    const uint8_t* row = v.base + static_cast<int64_t>(p) * v.partition_stride_bytes;
    if (reinterpret_cast<uintptr_t>(row) % alignof(float) == 0) return reinterpret_cast<const float*>(row);
  }
  read_row(v, p, scratch);
  return scratch;
}

void write_row(const TileView& v, uint32_t p, const float* in) {
  const DType t = v.dtype;
  const int64_t es = dtype_bytes(t);
  for_each_run(v, p, [&](uint8_t* ptr, int64_t n, int64_t sb, int64_t flat0) {
    if (sb == es) {
      store_f32_n(t, ptr, in + flat0, n);
    } else {
      for (int64_t i = 0; i < n; ++i) store_f32(t, ptr + i * sb, in[flat0 + i]);
    }
  });
}

void read_row_int(const TileView& v, uint32_t p, int64_t* out) {
  const DType t = v.dtype;
  for_each_run(v, p, [&](uint8_t* ptr, int64_t n, int64_t sb, int64_t flat0) {
    for (int64_t i = 0; i < n; ++i) out[flat0 + i] = load_int(t, ptr + i * sb);
  });
}

void write_row_int(const TileView& v, uint32_t p, const int64_t* in) {
  const DType t = v.dtype;
  for_each_run(v, p, [&](uint8_t* ptr, int64_t n, int64_t sb, int64_t flat0) {
    for (int64_t i = 0; i < n; ++i) store_int(t, ptr + i * sb, in[flat0 + i]);
  });
}

// ---------------------------------------------------------------------------------------------
// ALU

namespace {
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();
inline float b2f(bool b) { return b ? 1.0f : 0.0f; }
}  // namespace

float alu_apply(AluOp op, float x, float y) {
  switch (op) {
    case AluOp::kBypass: return x;
    case AluOp::kAdd: return x + y;
    case AluOp::kSubtract: return x - y;
    case AluOp::kMultiply: return x * y;
    case AluOp::kMaximum:
      if (std::isnan(x) || std::isnan(y)) return kNaN;
      return x < y ? y : x;
    case AluOp::kMinimum:
      if (std::isnan(x) || std::isnan(y)) return kNaN;
      return y < x ? y : x;
    case AluOp::kDivide: return x / y;
    case AluOp::kPower: return std::pow(x, y);
    case AluOp::kEqual: return b2f(x == y);
    case AluOp::kNotEqual: return b2f(x != y);
    case AluOp::kGreater: return b2f(x > y);
    case AluOp::kGreaterEqual: return b2f(x >= y);
    case AluOp::kLess: return b2f(x < y);
    case AluOp::kLessEqual: return b2f(x <= y);
    case AluOp::kLogicalAnd: return b2f((x != 0.0f) && (y != 0.0f));
    case AluOp::kLogicalOr: return b2f((x != 0.0f) || (y != 0.0f));
    case AluOp::kLogicalXor: return b2f((x != 0.0f) != (y != 0.0f));
    case AluOp::kLogicalNot: return b2f(x == 0.0f);
    case AluOp::kAbsMax:
      if (std::isnan(x) || std::isnan(y)) return kNaN;
      return std::fabs(x) > std::fabs(y) ? x : y;
    case AluOp::kAbsMin:
      if (std::isnan(x) || std::isnan(y)) return kNaN;
      return std::fabs(x) < std::fabs(y) ? x : y;
    case AluOp::kMod: {
      float r = std::fmod(x, y);
      if (r != 0.0f && ((r < 0.0f) != (y < 0.0f))) r += y;
      return r;
    }
    case AluOp::kFmod: return std::fmod(x, y);
    case AluOp::kAbs: return std::fabs(x);
    case AluOp::kSquare: return x * x;
    case AluOp::kRelu: return std::isnan(x) ? x : (x > 0.0f ? x : 0.0f);
    case AluOp::kRsqrt: return 1.0f / std::sqrt(x);
    case AluOp::kReciprocal: return 1.0f / x;
    case AluOp::kNegative: return -x;
    case AluOp::kInvert:
    case AluOp::kBitwiseAnd:
    case AluOp::kBitwiseOr:
    case AluOp::kBitwiseXor:
    case AluOp::kLeftShift:
    case AluOp::kRightShift:
      return static_cast<float>(alu_apply_int(op, sem::imm_to_int(x), sem::imm_to_int(y)));
    case AluOp::kAverage: return x + y;
  }
  return x;
}

namespace {

template <bool kVector, bool kReverse, typename F>
void map_row(float* x, const float* y, float s, int64_t n, F f) {
  for (int64_t j = 0; j < n; ++j) {
    const float b = kVector ? y[j] : s;
    x[j] = kReverse ? f(b, x[j]) : f(x[j], b);
  }
}

template <typename F>
void map_row(float* x, const float* y, float s, int64_t n, bool reverse, F f) {
  if (y) {
    reverse ? map_row<true, true>(x, y, s, n, f) : map_row<true, false>(x, y, s, n, f);
  } else {
    reverse ? map_row<false, true>(x, y, s, n, f) : map_row<false, false>(x, y, s, n, f);
  }
}

}  // namespace

void alu_apply_row(AluOp op, float* x, const float* y, float s, int64_t n, bool reverse) {
  // The common ops as loops the compiler can vectorise (the same IEEE operations as alu_apply, so the
  // same bits); the rest call alu_apply per element.
  if (sem::ignores_operand(op)) reverse = false;
  switch (op) {
    case AluOp::kBypass: return;
    case AluOp::kAdd: return map_row(x, y, s, n, reverse, [](float a, float b) { return a + b; });
    case AluOp::kSubtract: return map_row(x, y, s, n, reverse, [](float a, float b) { return a - b; });
    case AluOp::kMultiply: return map_row(x, y, s, n, reverse, [](float a, float b) { return a * b; });
    case AluOp::kDivide: return map_row(x, y, s, n, reverse, [](float a, float b) { return a / b; });
    case AluOp::kMaximum:
      return map_row(x, y, s, n, reverse, [](float a, float b) {
        return (std::isnan(a) || std::isnan(b)) ? kNaN : (a < b ? b : a);
      });
    case AluOp::kMinimum:
      return map_row(x, y, s, n, reverse, [](float a, float b) {
        return (std::isnan(a) || std::isnan(b)) ? kNaN : (b < a ? b : a);
      });
    default: return map_row(x, y, s, n, reverse, [op](float a, float b) { return alu_apply(op, a, b); });
  }
}

namespace {

#ifdef NSIM_FOLD_AVX2
// fold_extremum's loop in AVX2: maxps(v, m) = v > m ? v : m and minps(v, m) = v < m ? v : m are the
// portable loop's selections; the NaN test is an unordered compare of v with itself.
template <bool kMax>
__attribute__((target("avx2"))) int64_t extremum_avx2(float r, const float* y, int64_t n, float* best,
                                                      int32_t* any_nan) {
  __m256 m0 = _mm256_set1_ps(r), m1 = m0, nan = _mm256_setzero_ps();
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    const __m256 v0 = _mm256_loadu_ps(y + j), v1 = _mm256_loadu_ps(y + j + 8);
    nan = _mm256_or_ps(nan, _mm256_or_ps(_mm256_cmp_ps(v0, v0, _CMP_UNORD_Q), _mm256_cmp_ps(v1, v1, _CMP_UNORD_Q)));
    m0 = kMax ? _mm256_max_ps(v0, m0) : _mm256_min_ps(v0, m0);
    m1 = kMax ? _mm256_max_ps(v1, m1) : _mm256_min_ps(v1, m1);
  }
  alignas(32) float a[8], b[8];
  _mm256_store_ps(a, m0);
  _mm256_store_ps(b, m1);
  float m = r;
  for (int q = 0; q < 8; ++q) {
    m = kMax ? (m < a[q] ? a[q] : m) : (a[q] < m ? a[q] : m);
    m = kMax ? (m < b[q] ? b[q] : m) : (b[q] < m ? b[q] : m);
  }
  *best = m;
  *any_nan = _mm256_movemask_ps(nan) != 0;
  return j;
}

bool has_avx2() {
  static const bool ok = __builtin_cpu_supports("avx2");
  return ok;
}
#endif

/// max (kMax) or min of r and y[0..n) when the sequential fold's bits do not depend on the order: no
/// NaN (the fold gives kNaN then) and a nonzero result (equal nonzero floats have the same bits; only
/// +0 and -0 compare equal with different bits, and the fold keeps the first one). AVX2 where the CPU has
/// it, else eight lanes the compiler vectorises. Returns false when the caller must fold sequentially.
template <bool kMax>
bool fold_extremum(float r, const float* y, int64_t n, float* out) {
  if (n < 16 || std::isnan(r)) return false;
  float best = r;
  int32_t any_nan = 0;
  int64_t j = 0;
  bool lanes_done = false;
#ifdef NSIM_FOLD_AVX2
  if (has_avx2()) j = extremum_avx2<kMax>(r, y, n, &best, &any_nan), lanes_done = true;
#endif
  if (!lanes_done) {
    std::array<float, 8> m;
    std::array<int32_t, 8> nan{};
    m.fill(r);
    for (; j + 8 <= n; j += 8)
      for (size_t q = 0; q < 8; ++q) {
        const float v = y[j + static_cast<int64_t>(q)];
        nan[q] |= static_cast<int32_t>(v != v);
        m[q] = kMax ? (m[q] < v ? v : m[q]) : (v < m[q] ? v : m[q]);
      }
    for (size_t q = 0; q < 8; ++q) {
      any_nan |= nan[q];
      best = kMax ? (best < m[q] ? m[q] : best) : (m[q] < best ? m[q] : best);
    }
  }
  for (; j < n; ++j) {  // the rest after the lanes
    const float v = y[j];
    any_nan |= static_cast<int32_t>(v != v);
    best = kMax ? (best < v ? v : best) : (v < best ? v : best);
  }
  if (any_nan) {
    *out = kNaN;
    return true;
  }
  if (best == 0.0f) return false;
  *out = best;
  return true;
}

}  // namespace

float alu_fold(AluOp op, float r, const float* y, int64_t n) {
  // Sequential left folds (the order fixes the rounding): the common ops without a call per element.
  float fast = 0.0f;
  switch (op) {
    case AluOp::kBypass: return r;
    case AluOp::kAdd:
      for (int64_t j = 0; j < n; ++j) r = r + y[j];
      return r;
    case AluOp::kMultiply:
      for (int64_t j = 0; j < n; ++j) r = r * y[j];
      return r;
    case AluOp::kMaximum:
      if (fold_extremum<true>(r, y, n, &fast)) return fast;
      for (int64_t j = 0; j < n; ++j) r = (std::isnan(r) || std::isnan(y[j])) ? kNaN : (r < y[j] ? y[j] : r);
      return r;
    case AluOp::kMinimum:
      if (fold_extremum<false>(r, y, n, &fast)) return fast;
      for (int64_t j = 0; j < n; ++j) r = (std::isnan(r) || std::isnan(y[j])) ? kNaN : (y[j] < r ? y[j] : r);
      return r;
    default:
      for (int64_t j = 0; j < n; ++j) r = alu_apply(op, r, y[j]);
      return r;
  }
}

int64_t alu_apply_int(AluOp op, int64_t x, int64_t y) {
  const auto ux = static_cast<uint64_t>(x);
  const auto uy = static_cast<uint64_t>(y);
  switch (op) {
    case AluOp::kBypass: return x;
    case AluOp::kAdd: return static_cast<int64_t>(ux + uy);
    case AluOp::kSubtract: return static_cast<int64_t>(ux - uy);
    case AluOp::kMultiply: return static_cast<int64_t>(ux * uy);
    case AluOp::kMaximum: return std::max(x, y);
    case AluOp::kMinimum: return std::min(x, y);
    case AluOp::kEqual: return x == y;
    case AluOp::kNotEqual: return x != y;
    case AluOp::kGreater: return x > y;
    case AluOp::kGreaterEqual: return x >= y;
    case AluOp::kLess: return x < y;
    case AluOp::kLessEqual: return x <= y;
    case AluOp::kLogicalAnd: return (x != 0) && (y != 0);
    case AluOp::kLogicalOr: return (x != 0) || (y != 0);
    case AluOp::kLogicalXor: return (x != 0) != (y != 0);
    case AluOp::kLogicalNot: return x == 0;
    case AluOp::kAbs: return x < 0 ? static_cast<int64_t>(0 - ux) : x;
    case AluOp::kNegative: return static_cast<int64_t>(0 - ux);
    case AluOp::kSquare: return static_cast<int64_t>(ux * ux);
    case AluOp::kRelu: return x > 0 ? x : 0;
    case AluOp::kAbsMax: {
      const uint64_t ax = x < 0 ? 0 - ux : ux, ay = y < 0 ? 0 - uy : uy;
      return ax > ay ? x : y;
    }
    case AluOp::kAbsMin: {
      const uint64_t ax = x < 0 ? 0 - ux : ux, ay = y < 0 ? 0 - uy : uy;
      return ax < ay ? x : y;
    }
    case AluOp::kInvert: return static_cast<int64_t>(~ux);
    case AluOp::kBitwiseAnd: return static_cast<int64_t>(ux & uy);
    case AluOp::kBitwiseOr: return static_cast<int64_t>(ux | uy);
    case AluOp::kBitwiseXor: return static_cast<int64_t>(ux ^ uy);
    case AluOp::kLeftShift:
      // Shift counts outside [0, 32) give 0 (32-bit ALU; the store wraps to the dst width).
      if (y < 0 || y >= 32) return 0;
      return static_cast<int64_t>(ux << y);
    case AluOp::kRightShift:
      // Logical shift of the 32-bit pattern (the widest integer dtype); counts outside [0, 32) -> 0.
      if (y < 0 || y >= 32) return 0;
      return static_cast<int64_t>((ux & 0xffffffffull) >> y);
    case AluOp::kAverage: return static_cast<int64_t>(ux + uy);
    case AluOp::kDivide:
    case AluOp::kPower:
    case AluOp::kMod:
    case AluOp::kFmod:
    case AluOp::kRsqrt:
    case AluOp::kReciprocal: {
      // No exact integer form: evaluate in double, truncate toward zero (saturating; NaN -> 0).
      double r;
      const double dx = static_cast<double>(x), dy = static_cast<double>(y);
      switch (op) {
        case AluOp::kDivide: r = dx / dy; break;
        case AluOp::kPower: r = std::pow(dx, dy); break;
        case AluOp::kMod: {
          r = std::fmod(dx, dy);
          if (r != 0.0 && ((r < 0.0) != (dy < 0.0))) r += dy;
          break;
        }
        case AluOp::kFmod: r = std::fmod(dx, dy); break;
        case AluOp::kRsqrt: r = 1.0 / std::sqrt(dx); break;
        default: r = 1.0 / dx; break;
      }
      if (std::isnan(r)) return 0;
      if (r >= 9.2233720368547758e18) return std::numeric_limits<int64_t>::max();
      if (r <= -9.2233720368547758e18) return std::numeric_limits<int64_t>::min();
      return static_cast<int64_t>(r);
    }
  }
  return x;
}

float alu_identity(AluOp op) {
  switch (op) {
    case AluOp::kMultiply:
    case AluOp::kLogicalAnd: return 1.0f;
    case AluOp::kMaximum: return -kInf;
    case AluOp::kMinimum:
    case AluOp::kAbsMin: return kInf;
    case AluOp::kBitwiseAnd: return -1.0f;  // all ones once converted to an integer
    default: return 0.0f;                   // add, subtract, or, xor, logical_or/xor, abs_max, average
  }
}

// ---------------------------------------------------------------------------------------------
// Activation functions

namespace {
inline double sigmoid_d(double x) { return 1.0 / (1.0 + std::exp(-x)); }
inline double softplus_d(double x) { return x > 0.0 ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x)); }
constexpr double kSqrt2 = 1.41421356237309504880;
constexpr double kInvSqrt2Pi = 0.39894228040143267794;   // 1/sqrt(2*pi)
constexpr double kSqrt2OverPi = 0.79788456080286535588;  // sqrt(2/pi)
constexpr double kTwoOverSqrtPi = 1.12837916709551257390;
}  // namespace

float act_apply(ActFunc f, float xf, float alpha) {
  const double x = xf;
  double r;
  switch (f) {
    case ActFunc::kCopy: return xf;
    case ActFunc::kSquare: r = x * x; break;
    case ActFunc::kSigmoid: r = sigmoid_d(x); break;
    case ActFunc::kRelu: return std::isnan(xf) ? xf : (xf > 0.0f ? xf : 0.0f);
    case ActFunc::kPrelu: r = x >= 0.0 ? x : static_cast<double>(alpha) * x; break;
    // (1 + erf(x / sqrt2)) / 2 as erfc(-x / sqrt2) / 2 and (1 + tanh(z)) / 2 as sigmoid(2z): no cancellation in the
    // negative tail (gelu(-9) is -1.0e-18, not -0)
    case ActFunc::kGelu: r = 0.5 * x * std::erfc(-x / kSqrt2); break;
    case ActFunc::kGeluDx: r = 0.5 * std::erfc(-x / kSqrt2) + x * std::exp(-0.5 * x * x) * kInvSqrt2Pi; break;
    case ActFunc::kGeluApprxTanh: r = x * sigmoid_d(2.0 * kSqrt2OverPi * (x + 0.044715 * x * x * x)); break;
    case ActFunc::kGeluApprxSigmoid: r = x * sigmoid_d(1.702 * x); break;
    case ActFunc::kGeluApprxSigmoidDx: {
      const double s = sigmoid_d(1.702 * x);
      r = s * (1.0 + 1.702 * x * (1.0 - s));
      break;
    }
    case ActFunc::kSilu: r = x * sigmoid_d(x); break;
    case ActFunc::kSiluDx: {
      const double s = sigmoid_d(x);
      r = s * (1.0 + x * (1.0 - s));
      break;
    }
    case ActFunc::kTanh: r = std::tanh(x); break;
    case ActFunc::kSoftplus: r = softplus_d(x); break;
    case ActFunc::kMish: r = x * std::tanh(softplus_d(x)); break;
    case ActFunc::kErf: r = std::erf(x); break;
    case ActFunc::kErfDx: r = kTwoOverSqrtPi * std::exp(-x * x); break;
    case ActFunc::kExp: r = std::exp(x); break;
    case ActFunc::kLog: r = std::log(x); break;
    case ActFunc::kSin: r = std::sin(x); break;
    case ActFunc::kArctan: r = std::atan(x); break;
    case ActFunc::kSqrt: r = std::sqrt(x); break;
    case ActFunc::kRsqrt: r = 1.0 / std::sqrt(x); break;
    case ActFunc::kReciprocal: r = 1.0 / x; break;
    case ActFunc::kSign:
      if (std::isnan(xf)) return xf;
      return xf > 0.0f ? 1.0f : (xf < 0.0f ? -1.0f : 0.0f);
    case ActFunc::kAbs: return std::fabs(xf);
    default: r = x; break;
  }
  return static_cast<float>(r);
}

void act_apply_row(ActFunc f, float* y, int64_t n, float alpha) {
  switch (f) {
    case ActFunc::kCopy: return;
    case ActFunc::kExp: sem::exp_row(y, n); return;
    default:
      for (int64_t j = 0; j < n; ++j) y[j] = act_apply(f, y[j], alpha);
  }
}

// ---------------------------------------------------------------------------------------------
// Internal helpers

namespace sem {

int64_t imm_to_int(float v) {
  if (std::isnan(v)) return 0;
  if (v >= 9.2233720368547758e18f) return std::numeric_limits<int64_t>::max();
  if (v <= -9.2233720368547758e18f) return std::numeric_limits<int64_t>::min();
  return static_cast<int64_t>(v);
}

int64_t int_immediate(const Instr& in, int i) {
  const auto u = static_cast<size_t>(i);
  const int32_t k = in.iimm[u];
  if (static_cast<float>(k) == in.imm[u] || static_cast<float>(static_cast<uint32_t>(k)) == in.imm[u]) return k;
  return imm_to_int(in.imm[u]);
}

namespace {
constexpr int kSlots = 8;
template <class T>
T* scratch(int slot, int64_t n) {
  thread_local std::array<std::vector<T>, kSlots> pool;
  auto& v = pool[static_cast<size_t>(slot)];
  const auto need = static_cast<size_t>(std::max<int64_t>(n, 1));
  if (v.size() < need) v.resize(need);
  return v.data();
}
}  // namespace

float* fscratch(int slot, int64_t n) { return scratch<float>(slot, n); }
int64_t* iscratch(int slot, int64_t n) { return scratch<int64_t>(slot, n); }
uint8_t* bscratch(int slot, int64_t n) { return scratch<uint8_t>(slot, n); }

float reduce_fold(AluOp op, const float* y, int64_t n) {
  if (n <= 0) return alu_identity(op);
  const AluOp inner = op == AluOp::kSubtract ? AluOp::kAdd : op;
  return alu_fold(inner, y[0], y + 1, n - 1);
}

void gather_bytes(const TileView& v, uint32_t p, uint8_t* out) {
  const int64_t es = dtype_bytes(v.dtype);
  for_each_run(v, p, [&](uint8_t* ptr, int64_t n, int64_t sb, int64_t flat0) {
    uint8_t* o = out + flat0 * es;
    if (sb == es) {
      std::memcpy(o, ptr, static_cast<size_t>(n * es));
    } else {
      for (int64_t i = 0; i < n; ++i) std::memcpy(o + i * es, ptr + i * sb, static_cast<size_t>(es));
    }
  });
}

void scatter_bytes(const TileView& v, uint32_t p, const uint8_t* in) {
  const int64_t es = dtype_bytes(v.dtype);
  for_each_run(v, p, [&](uint8_t* ptr, int64_t n, int64_t sb, int64_t flat0) {
    const uint8_t* s = in + flat0 * es;
    if (sb == es) {
      std::memmove(ptr, s, static_cast<size_t>(n * es));
    } else {
      for (int64_t i = 0; i < n; ++i) std::memmove(ptr + i * sb, s + i * es, static_cast<size_t>(es));
    }
  });
}

void store_exact(DType t, uint8_t* p, float v) {
  if (std::isnan(v)) {
    const uint32_t u = std::bit_cast<uint32_t>(v);
    if (t == DType::kFloat32) {
      std::memcpy(p, &u, 4);
      return;
    }
    if (t == DType::kBFloat16 && (u & 0xffffu) == 0) {
      const auto b = static_cast<uint16_t>(u >> 16);
      std::memcpy(p, &b, 2);
      return;
    }
    if (t == DType::kFloat16 && (u & 0x1fffu) == 0 && ((u >> 13) & 0x3ffu) != 0) {
      const auto b = static_cast<uint16_t>(((u >> 16) & 0x8000u) | 0x7c00u | ((u >> 13) & 0x3ffu));
      std::memcpy(p, &b, 2);
      return;
    }
  }
  store_f32(t, p, v);
}

void fail(ErrorCode code, const Instr& in, const std::string& msg) {
  throw Error(code, fmt::format("{}: {}", mnemonic(in), msg));
}

void require(const Instr& in, const TileView& v, const char* name) {
  if (!v.valid()) fail(ErrorCode::kMissingOperand, in, fmt::format("operand '{}' is required", name));
}

void require_same_partitions(const Instr& in, const TileView& a, const char* an, const TileView& b, const char* bn) {
  if (a.partitions != b.partitions)
    fail(ErrorCode::kPartitionMismatch, in,
         fmt::format("'{}' has {} partitions but '{}' has {}", an, a.partitions, bn, b.partitions));
}

void require_same_elems(const Instr& in, const TileView& a, const char* an, const TileView& b, const char* bn) {
  if (a.elems() != b.elems())
    fail(ErrorCode::kElementCountMismatch, in,
         fmt::format("'{}' has {} elements per partition but '{}' has {}", an, a.elems(), bn, b.elems()));
}

void require_vector(const Instr& in, const TileView& v, const char* name, const TileView& ref) {
  if (v.partitions < ref.partitions)
    fail(ErrorCode::kPartitionMismatch, in,
         fmt::format("vector operand '{}' has {} partitions, need {}", name, v.partitions, ref.partitions));
  if (v.elems() < 1)
    fail(ErrorCode::kElementCountMismatch, in, fmt::format("vector operand '{}' has no elements", name));
}

void iota_row(const Instr& in, uint32_t p, int64_t elems, int64_t* out) {
  std::array<int64_t, 4> num{}, step{};
  int64_t total = 1;
  for (size_t d = 0; d < 4; ++d) {
    step[d] = in.iimm[2 + 2 * d];
    num[d] = in.iimm[3 + 2 * d];
    if (num[d] < 0) fail(ErrorCode::kShapeMismatch, in, fmt::format("pattern dim {} has negative num {}", d, num[d]));
    total *= num[d];
  }
  if (total != elems)
    fail(ErrorCode::kShapeMismatch, in,
         fmt::format("pattern covers {} elements but dst has {} per partition", total, elems));
  if (total == 0) return;
  // int32 arithmetic with two's-complement wrap.
  const uint32_t base = static_cast<uint32_t>(in.iimm[0]) + static_cast<uint32_t>(p) * static_cast<uint32_t>(in.iimm[1]);
  int64_t k = 0;
  for (int64_t a = 0; a < num[0]; ++a)
    for (int64_t b = 0; b < num[1]; ++b)
      for (int64_t c = 0; c < num[2]; ++c)
        for (int64_t e = 0; e < num[3]; ++e) {
          const uint32_t v = base + static_cast<uint32_t>(a) * static_cast<uint32_t>(step[0]) +
                             static_cast<uint32_t>(b) * static_cast<uint32_t>(step[1]) +
                             static_cast<uint32_t>(c) * static_cast<uint32_t>(step[2]) +
                             static_cast<uint32_t>(e) * static_cast<uint32_t>(step[3]);
          out[k++] = static_cast<int32_t>(v);
        }
}

}  // namespace sem
}  // namespace nsim::isa
