#pragma once
/// Simulated time: integer picoseconds, and clock domains that convert engine cycles to time.
#include <cmath>
#include <cstdint>

namespace nsim::sim {

using Ps = int64_t;  ///< picoseconds
inline constexpr Ps kPsPerNs = 1000;

/// One clock domain (an engine's clock). Conversions round to the nearest picosecond.
class ClockDomain {
 public:
  ClockDomain() = default;
  explicit ClockDomain(double ghz) : ghz_(ghz), period_ps_(1000.0 / ghz) {}
  double ghz() const { return ghz_; }
  double period_ps() const { return period_ps_; }
  /// Cycles are non-negative, so adding 0.5 and truncating rounds to nearest (cheaper than llround).
  Ps cycles_to_ps(double cycles) const { return static_cast<Ps>(cycles * period_ps_ + 0.5); }
  double ps_to_cycles(Ps t) const { return static_cast<double>(t) / period_ps_; }

 private:
  double ghz_ = 1.0;
  double period_ps_ = 1000.0;
};

/// std::llround for a non-negative x (a duration in picoseconds), without the library call: the same
/// integer for every x in [0, 2^62) (halves round up, as llround's away from zero does); anything else
/// goes to std::llround. (i = trunc(x) exactly, and x - i is exact: i = 0, or i <= x < 2i.)
inline int64_t round_nonneg(double x) {
  if (!(x >= 0.0 && x < 0x1p62)) return std::llround(x);
  const auto i = static_cast<int64_t>(x);
  return i + (x - static_cast<double>(i) >= 0.5 ? 1 : 0);
}

inline double ps_to_ns(Ps t) { return static_cast<double>(t) / 1000.0; }
/// Nanoseconds (non-negative) to picoseconds, rounded to nearest.
inline Ps ns_to_ps(double ns) { return static_cast<Ps>(ns * 1000.0 + 0.5); }

}  // namespace nsim::sim
