#pragma once
/// TensorE timing: a LoadStationary pipe that loads the next weights in the background, a
/// MultiplyMoving pipe, and power throttling (neuroncore.md 3.1, 3.4).
#include <array>

#include "engines/cost.h"
#include "engines/params.h"
#include "sim/time.h"

namespace nsim::engines {

class TensorPipes {
 public:
  explicit TensorPipes(const CoreParams& p) : p_(p), clk_(p.clk(isa::Engine::kTensor)) {}

  struct Slot {
    sim::Ps start = 0;
    sim::Ps ii = 0;   ///< time until the pipe may issue again (after throttling)
    sim::Ps end = 0;  ///< start + ii + latency
    double limit = 1; ///< throttle utilisation limit applied
  };
  /// LoadStationary of `ii_cycles`, ready at `ready`: waits for the previous MM to take the weights.
  Slot load_stationary(sim::Ps ready, double ii_cycles);
  /// MultiplyMoving / PE transpose of `ii_cycles`, ready at `ready`, using the last loaded weights.
  /// `needs_ls_pipe` (transposes) also waits for the LS pipe, since the data goes in as weights.
  Slot multiply(sim::Ps ready, double ii_cycles, bool needs_ls_pipe);
  /// Earliest time the next Tensor instruction could start (for trace watermarks).
  sim::Ps next_issue() const { return std::min(ls_free_, mm_free_); }
  sim::Ps throttled_time() const { return throttled_; }
  /// The pipes' state (fast-forward, Simulator::timing_digest): when each pipe frees up and the weights are
  /// ready, passed to `time` (absolute times); how far the throttle's ramp has gone before `base` (clamped
  /// where it stops mattering) and the busy intervals kept for its trailing window (their number, summed
  /// length, how long before `base` the oldest starts and the newest ends, clamped at the window), to `raw`.
  template <class Time, class Raw>
  void state(sim::Ps base, Time&& time, Raw&& raw) const {
    for (sim::Ps t : {ls_free_, mm_free_, mm_last_start_, weights_ready_}) time(t);
    if (!p_.throttle.enabled) return;
    const sim::Ps far = std::max(p_.throttle.ramp, p_.throttle.window);
    raw(started_ ? std::min(base - ramp_start_, far) : -1);
    raw(count_);
    raw(ring_sum_);
    if (count_ > 0) {
      raw(std::min(base - ring_[static_cast<size_t>(head_)].first, far));
      raw(std::min(base - ring_[static_cast<size_t>((head_ + count_ - 1) % kRing)].second, far));
    }
  }

 private:
  double throttle_limit(sim::Ps t);
  void note_busy(sim::Ps s, sim::Ps e);

  const CoreParams& p_;
  sim::ClockDomain clk_;
  sim::Ps ls_free_ = 0, mm_free_ = 0, mm_last_start_ = 0, weights_ready_ = 0;
  // Throttle state: ramp start and a ring of recent MM busy intervals (bounded: no allocation).
  bool started_ = false;
  sim::Ps ramp_start_ = 0;
  static constexpr int kRing = 1024;
  std::array<std::pair<sim::Ps, sim::Ps>, kRing> ring_{};
  int head_ = 0, count_ = 0;
  sim::Ps ring_sum_ = 0;
  sim::Ps throttled_ = 0;
};

/// TensorE as one in-order engine: its pipes and the weights it holds (their dtype and rows, which
/// the next MultiplyMoving's cost and FLOPs depend on).
class TensorEngine {
 public:
  explicit TensorEngine(const CoreParams& p) : p_(p), pipes_(p) {}

  struct Issue {
    TensorPipes::Slot slot;
    double flops = 0;           ///< MAC = 2
    double adjusted_flops = 0;  ///< bf16-equivalent (CoreParams::adjusted_flops of the input dtypes)
  };
  /// Issue LoadStationary, MultiplyMoving or a PE transpose whose operands are ready at `ready`.
  Issue issue(const isa::Instr& in, sim::Ps ready);
  /// Its II (before throttling) and start-to-end duration if `in` were issued now.
  sim::Ps busy_estimate(const isa::Instr& in) const;
  sim::Ps duration_estimate(const isa::Instr& in) const;
  sim::Ps next_issue() const { return pipes_.next_issue(); }
  sim::Ps throttled_time() const { return pipes_.throttled_time(); }
  const TensorPipes& pipes() const { return pipes_; }
  /// The weights held (their dtype and rows: the next MultiplyMoving's cost depends on them).
  std::pair<int, int64_t> weights() const { return {static_cast<int>(stationary_dtype_), stationary_m_}; }

 private:
  const CoreParams& p_;
  TensorPipes pipes_;
  DType stationary_dtype_ = DType::kBFloat16;
  int64_t stationary_m_ = 0;
};

}  // namespace nsim::engines
