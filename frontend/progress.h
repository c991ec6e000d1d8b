#pragma once
/// When to show the progress of a long run (issue 12 item 6): the CLI's line on stderr and the Python
/// `progress=` callback. Lowering::set_progress calls its hook every 65,536 instructions; the hook asks
/// ProgressClock::due(), which reads the clock, so progress costs one clock read per 65,536 instructions.
#include <chrono>
#include <cstdlib>

namespace nsim::frontend {

class ProgressClock {
 public:
  /// Nothing is shown before the run took kDelay seconds, then at most once per kPeriod seconds.
  static constexpr double kDelay = 2.0, kPeriod = 1.0;
  /// The environment variable that replaces both (seconds; "0" = at every hook call), for tests.
  static constexpr const char* kEnv = "NSIM_PROGRESS_INTERVAL";

  ProgressClock() : t0_(std::chrono::steady_clock::now()) {
    if (const char* v = std::getenv(kEnv); v && *v) {
      char* end = nullptr;
      const double s = std::strtod(v, &end);
      if (end != v && s >= 0) delay_ = period_ = s;
    }
  }
  /// Seconds since construction.
  double elapsed() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count(); }
  /// Whether to report now; true at most once per period, after the delay.
  bool due() {
    const double el = elapsed();
    if (el < delay_ || (shown_ && el - last_ < period_)) return false;
    last_ = el;
    shown_ = true;
    return true;
  }
  /// Whether due() ever returned true.
  bool shown() const { return shown_; }

 private:
  std::chrono::steady_clock::time_point t0_;
  double delay_ = kDelay, period_ = kPeriod, last_ = 0;
  bool shown_ = false;
};

}  // namespace nsim::frontend
