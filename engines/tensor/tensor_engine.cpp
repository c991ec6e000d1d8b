#include "engines/tensor/tensor_engine.h"

#include <algorithm>
#include <cmath>

namespace nsim::engines {

using sim::Ps;

TensorPipes::Tile TensorPipes::tile_in(const isa::Instr& in) const {
  if (in.op != isa::Opcode::kLoadStationary && in.op != isa::Opcode::kMultiplyMoving) return {0, rows_, 0, cols_, true};
  // (verify() checked the tile: sizes the smallest tile x 2^k, positions multiples of the size inside the array)
  const int rt = std::max(1, p_.row_tile_min), ct = std::max(1, p_.col_tile_min);
  const int r0 = in.iimm[0] / rt, c0 = in.iimm[1] / ct;
  const int r1 = std::min(rows_, r0 + std::max(1, in.iimm[2] / rt)), c1 = std::min(cols_, c0 + std::max(1, in.iimm[3] / ct));
  return {r0, r1, c0, c1, r0 == 0 && r1 == rows_ && c0 == 0 && c1 == cols_};
}

TensorPipes::Cell TensorPipes::gather_cells(const Tile& t) {
  if (!tiled_) {
    tiled_ = true;  // the first tiled instruction: every cell starts from the common state
    cells_.assign(static_cast<size_t>(rows_ * cols_), whole_);
  }
  Cell c;
  for (int r = t.r0; r < t.r1; ++r)
    for (int k = t.c0; k < t.c1; ++k) {
      const Cell& x = cells_[static_cast<size_t>(r * cols_ + k)];
      c.ls_free = std::max(c.ls_free, x.ls_free);
      c.mm_free = std::max(c.mm_free, x.mm_free);
      c.mm_last_start = std::max(c.mm_last_start, x.mm_last_start);
      c.weights_ready = std::max(c.weights_ready, x.weights_ready);
    }
  return c;
}

void TensorPipes::scatter_cells(const Tile& t, const Cell& c) {
  for (int r = t.r0; r < t.r1; ++r)
    for (int k = t.c0; k < t.c1; ++k) cells_[static_cast<size_t>(r * cols_ + k)] = c;
}

Ps TensorPipes::next_issue_of_cells() const {
  Ps t = INT64_MAX;
  for (const Cell& c : cells_) t = std::min({t, c.ls_free, c.mm_free});
  return t;
}

// The two pipes' rules on one state: the whole array's (updated in place) or a tile's gathered from its cells.
[[gnu::always_inline]] inline TensorPipes::Slot TensorPipes::load_stationary_on(Cell& c, Ps ready, double ii_cycles) {
  Slot s;
  // Background load: the shadow weight buffer is free once the previous MM started using its weights.
  s.start = std::max({ready, c.ls_free, c.mm_last_start});
  s.ii = clk_.cycles_to_ps(ii_cycles);
  s.end = s.start + s.ii;
  c.ls_free = s.end;
  c.weights_ready = s.end;
  return s;
}

[[gnu::always_inline]] inline TensorPipes::Slot TensorPipes::multiply_on(Cell& c, Ps ready, double ii_cycles,
                                                                        bool needs_ls_pipe) {
  Slot s;
  s.start = std::max({ready, c.mm_free, c.weights_ready});
  if (needs_ls_pipe) s.start = std::max(s.start, c.ls_free);
  s.limit = throttle_limit(s.start);
  const Ps ii_full = clk_.cycles_to_ps(ii_cycles);
  s.ii = sim::round_nonneg(static_cast<double>(ii_full) / s.limit);
  throttled_ += s.ii - ii_full;
  s.end = s.start + s.ii + clk_.cycles_to_ps(p_.mm_latency);
  c.mm_free = s.start + s.ii;
  c.mm_last_start = s.start;
  if (needs_ls_pipe) c.ls_free = std::max(c.ls_free, c.mm_free);
  note_busy(s.start, s.start + s.ii);
  return s;
}

// Untiled, the starts never go back (each waits for the previous one's pipe), so last_start_ is only kept; on tiles
// an instruction also waits for it (in-order issue: a tile that is free does not let a later matmul pass an earlier
// one still waiting for its own tile).
template <bool kWhole>
TensorPipes::Slot TensorPipes::load_stationary(Ps ready, double ii_cycles, const Tile& t) {
  if (kWhole) {
    const Slot s = load_stationary_on(whole_, bg_used_ ? std::max(ready, last_start_) : ready, ii_cycles);
    last_start_ = s.start;
    return s;
  }
  Cell c = gather_cells(t);
  const Slot s = load_stationary_on(c, std::max(ready, last_start_), ii_cycles);
  scatter_cells(t, c);
  last_start_ = s.start;
  return s;
}

template <bool kWhole>
TensorPipes::Slot TensorPipes::multiply(Ps ready, double ii_cycles, bool needs_ls_pipe, const Tile& t) {
  if (kWhole) {
    const Slot s = multiply_on(whole_, bg_used_ ? std::max(ready, last_start_) : ready, ii_cycles, needs_ls_pipe);
    last_start_ = s.start;
    return s;
  }
  Cell c = gather_cells(t);
  const Slot s = multiply_on(c, std::max(ready, last_start_), ii_cycles, needs_ls_pipe);
  scatter_cells(t, c);
  last_start_ = s.start;
  return s;
}

template <bool kWhole>
TensorPipes::Slot TensorPipes::transpose(Ps ready, double ii_cycles, const Tile& t) {
  if (kWhole && p_.background_transpose) {
    // The main lane would start it once its MM and LS pipes are free and its weights loaded (multiply_on with the
    // LS pipe); the background lane once its own pipe is free. Both after the last instruction TensorE issued.
    const Ps r = std::max(ready, last_start_);
    const Ps main = std::max({r, whole_.mm_free, whole_.weights_ready, whole_.ls_free});
    if (std::max(r, bg_.mm_free) < main) {
      bg_used_ = true;
      const Slot s = multiply_on(bg_, r, ii_cycles, false);
      last_start_ = s.start;
      return s;
    }
  }
  return multiply<kWhole>(ready, ii_cycles, true, t);
}

template TensorPipes::Slot TensorPipes::transpose<true>(Ps ready, double ii_cycles, const Tile& t);
template TensorPipes::Slot TensorPipes::transpose<false>(Ps ready, double ii_cycles, const Tile& t);

Ps TensorPipes::next_issue(const Tile& t) const {
  if (!tiled_) return std::min(whole_.ls_free, whole_.mm_free);
  Ps f = last_start_;
  for (int r = t.r0; r < t.r1; ++r)
    for (int k = t.c0; k < t.c1; ++k) {
      const Cell& x = cells_[static_cast<size_t>(r * cols_ + k)];
      f = std::max(f, x.mm_free);  // (a matmul's LS loads in the background: the tile's MM pipe decides)
    }
  return f;
}

void TensorPipes::note_busy(Ps s, Ps e) {
  if (!p_.throttle.enabled) return;
  // Matmuls on PE tiles overlap: the array is busy over the union of their intervals (untiled, each starts
  // after the previous one's end and nothing is clipped).
  s = std::max(s, busy_end_);
  if (e <= s) return;
  busy_end_ = e;
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

void TensorEngine::load_tile_weights(const TensorPipes::Tile& t, const Weights& w) {
  if (uniform_) cells_.assign(static_cast<size_t>(pipes_.cells()), whole_);
  uniform_ = false;
  for (int r = t.r0; r < t.r1; ++r)
    for (int k = t.c0; k < t.c1; ++k) cells_[static_cast<size_t>(r * cols_ + k)] = w;
}

template <bool kWhole>
TensorEngine::Issue TensorEngine::issue_on(const isa::Instr& in, Ps ready) {
  using isa::CostClass;
  Issue r;
  const CostClass cls = isa::op_info(in.op).cost;  // the cost class column of isa/opcodes.def
  const TensorPipes::Tile t = kWhole ? TensorPipes::Tile{} : pipes_.tile_of(in);
  if (cls == CostClass::kLoadStationary) {
    r.slot = pipes_.load_stationary<kWhole>(ready, load_stationary_ii(p_, in), t);
    const Weights w{in.slot(0).dtype, in.slot(0).elems_per_partition() / ((in.flags & isa::kDoubleRow) ? 2 : 1)};
    if (kWhole) whole_ = w;  // (never tiled: the weights are uniform)
    else load_weights(t, w);
  } else if (cls == CostClass::kMultiplyMoving) {
    const Weights& w = kWhole ? whole_ : weights_of(t);
    r.slot = pipes_.multiply<kWhole>(ready, multiply_moving_ii(p_, in, w.dtype, w.m), false, t);
    r.flops = instr_flops(in, w.m);
    // bf16-equivalent: the larger multiplier of the two inputs (fp32 x bf16 = fp32, fp8 x bf16 = 1).
    r.adjusted_flops = r.flops * std::max(p_.adjusted_flops[static_cast<size_t>(in.slot(1).dtype)],
                                          p_.adjusted_flops[static_cast<size_t>(w.dtype)]);
  } else {  // PE transpose: the data goes in as the weights, against an identity of its dtype
    r.slot = pipes_.transpose<kWhole>(ready, pe_transpose_ii(p_, in), t);
    r.flops = instr_flops(in, 0);
    r.adjusted_flops = r.flops * p_.adjusted_flops[static_cast<size_t>(in.slot(1).dtype)];
  }
  return r;
}

template TensorEngine::Issue TensorEngine::issue_on<true>(const isa::Instr& in, Ps ready);
template TensorEngine::Issue TensorEngine::issue_on<false>(const isa::Instr& in, Ps ready);

Ps TensorEngine::busy_estimate(const isa::Instr& in) const {
  using isa::CostClass;
  const sim::ClockDomain& clk = p_.clk(isa::Engine::kTensor);
  const CostClass cls = isa::op_info(in.op).cost;
  if (cls == CostClass::kLoadStationary) return clk.cycles_to_ps(load_stationary_ii(p_, in));
  if (cls == CostClass::kMultiplyMoving) {
    const Weights& w = weights_of(pipes_.tile_of(in));
    return clk.cycles_to_ps(multiply_moving_ii(p_, in, w.dtype, w.m));
  }
  return clk.cycles_to_ps(pe_transpose_ii(p_, in));
}

Ps TensorEngine::duration_estimate(const isa::Instr& in) const {
  return busy_estimate(in) + p_.clk(isa::Engine::kTensor).cycles_to_ps(p_.mm_latency);
}

}  // namespace nsim::engines
