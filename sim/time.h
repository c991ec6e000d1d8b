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

inline double ps_to_ns(Ps t) { return static_cast<double>(t) / 1000.0; }
/// Nanoseconds (non-negative) to picoseconds, rounded to nearest.
inline Ps ns_to_ps(double ns) { return static_cast<Ps>(ns * 1000.0 + 0.5); }

}  // namespace nsim::sim
