#include "engines/tensor/tensor_engine.h"

#include <algorithm>
#include <cmath>

namespace nsim::engines {

using sim::Ps;

TensorPipes::Slot TensorPipes::load_stationary(Ps ready, double ii_cycles) {
  Slot s;
  // Background load: the shadow weight buffer is free once the previous MM started using its weights.
  s.start = std::max({ready, ls_free_, mm_last_start_});
  s.ii = clk_.cycles_to_ps(ii_cycles);
  s.end = s.start + s.ii;
  ls_free_ = s.end;
  weights_ready_ = s.end;
  return s;
}

TensorPipes::Slot TensorPipes::multiply(Ps ready, double ii_cycles, bool needs_ls_pipe) {
  Slot s;
  s.start = std::max({ready, mm_free_, weights_ready_});
  if (needs_ls_pipe) s.start = std::max(s.start, ls_free_);
  s.limit = throttle_limit(s.start);
  const Ps ii_full = clk_.cycles_to_ps(ii_cycles);
  s.ii = sim::round_nonneg(static_cast<double>(ii_full) / s.limit);
  throttled_ += s.ii - ii_full;
  s.end = s.start + s.ii + clk_.cycles_to_ps(p_.mm_latency);
  mm_free_ = s.start + s.ii;
  mm_last_start_ = s.start;
  if (needs_ls_pipe) ls_free_ = std::max(ls_free_, mm_free_);
  note_busy(s.start, s.start + s.ii);
  return s;
}

void TensorPipes::note_busy(Ps s, Ps e) {
  if (!p_.throttle.enabled) return;
  if (count_ == kRing) {  // full: drop the oldest
    auto [os, oe] = ring_[static_cast<size_t>(head_)];
    ring_sum_ -= oe - os;
    head_ = (head_ + 1) % kRing;
    --count_;
  }
  ring_[static_cast<size_t>((head_ + count_) % kRing)] = {s, e};
  ++count_;
  ring_sum_ += e - s;
}

double TensorPipes::throttle_limit(Ps t) {
  const ThrottleParams& th = p_.throttle;
  if (!th.enabled) return 1.0;
  if (!started_) {
    started_ = true;
    ramp_start_ = t;
  } else if (t - ramp_start_ >= th.window) {
    // Utilisation over the trailing window; intervals older than the window are dropped.
    const Ps w0 = t - th.window;
    while (count_ > 0 && ring_[static_cast<size_t>(head_)].second <= w0) {
      auto [os, oe] = ring_[static_cast<size_t>(head_)];
      ring_sum_ -= oe - os;
      head_ = (head_ + 1) % kRing;
      --count_;
    }
    // Intervals end no later than t (the MM pipe is in order); clip the oldest at the window start.
    Ps busy = ring_sum_;
    if (count_ > 0) busy -= std::max<Ps>(0, w0 - ring_[static_cast<size_t>(head_)].first);
    if (static_cast<double>(busy) < th.reengage_util * static_cast<double>(th.window)) ramp_start_ = t;
  }
  if (th.ramp <= 0) return 1.0;
  const double frac = std::min(1.0, static_cast<double>(t - ramp_start_) / static_cast<double>(th.ramp));
  return th.start_util + (1.0 - th.start_util) * frac;
}

TensorEngine::Issue TensorEngine::issue(const isa::Instr& in, Ps ready) {
  using isa::CostClass;
  Issue r;
  const CostClass cls = isa::op_info(in.op).cost;  // the cost class column of isa/opcodes.def
  if (cls == CostClass::kLoadStationary) {
    r.slot = pipes_.load_stationary(ready, load_stationary_ii(p_, in));
    stationary_dtype_ = in.slot(0).dtype;
    stationary_m_ = in.slot(0).elems_per_partition() / ((in.flags & isa::kDoubleRow) ? 2 : 1);
  } else if (cls == CostClass::kMultiplyMoving) {
    r.slot = pipes_.multiply(ready, multiply_moving_ii(p_, in, stationary_dtype_, stationary_m_), false);
    r.flops = instr_flops(in, stationary_m_);
    // bf16-equivalent: the larger multiplier of the two inputs (fp32 x bf16 = fp32, fp8 x bf16 = 1).
    r.adjusted_flops = r.flops * std::max(p_.adjusted_flops[static_cast<size_t>(in.slot(1).dtype)],
                                          p_.adjusted_flops[static_cast<size_t>(stationary_dtype_)]);
  } else {  // PE transpose: the data goes in as the weights, against an identity of its dtype
    r.slot = pipes_.multiply(ready, pe_transpose_ii(p_, in), true);
    r.flops = instr_flops(in, 0);
    r.adjusted_flops = r.flops * p_.adjusted_flops[static_cast<size_t>(in.slot(1).dtype)];
  }
  return r;
}

Ps TensorEngine::busy_estimate(const isa::Instr& in) const {
  using isa::CostClass;
  const sim::ClockDomain& clk = p_.clk(isa::Engine::kTensor);
  const CostClass cls = isa::op_info(in.op).cost;
  if (cls == CostClass::kLoadStationary) return clk.cycles_to_ps(load_stationary_ii(p_, in));
  if (cls == CostClass::kMultiplyMoving)
    return clk.cycles_to_ps(multiply_moving_ii(p_, in, stationary_dtype_, stationary_m_));
  return clk.cycles_to_ps(pe_transpose_ii(p_, in));
}

Ps TensorEngine::duration_estimate(const isa::Instr& in) const {
  return busy_estimate(in) + p_.clk(isa::Engine::kTensor).cycles_to_ps(p_.mm_latency);
}

}  // namespace nsim::engines
