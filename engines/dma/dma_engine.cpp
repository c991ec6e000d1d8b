#include "engines/dma/dma_engine.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace nsim::engines {

using sim::Ps;

Ps Calendar::earliest(Ps t, Ps dur) const {
  Ps s = std::max(t, floor_);
  if (n_ == 0 || at(n_ - 1).second <= s) return s;  // the usual case: free from s on
  // Intervals are disjoint and sorted, so their ends are sorted too: skip (binary search) those that
  // end by s; they cannot hold [s, s + dur). Bookings mostly land near the end.
  int lo = 0, hi = n_;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (at(mid).second <= s) lo = mid + 1;
    else hi = mid;
  }
  for (int i = lo; i < n_; ++i) {
    const auto [b, e] = at(i);
    if (s + dur <= b) return s;  // fits in the gap before interval i
    s = std::max(s, e);
  }
  return s;
}

void Calendar::reserve(Ps start, Ps end) {
  if (n_ == kCapacity) {  // full: forget the oldest, and never book before its end again
    floor_ = std::max(floor_, at(0).second);
    head_ = (head_ + 1) & (kCapacity - 1);
    --n_;
  }
  int i = n_;
  while (i > 0 && at(i - 1).first > start) {
    at(i) = at(i - 1);
    --i;
  }
  at(i) = {start, end};
  ++n_;
}

bool Calendar::busy_at(Ps t) const {
  for (int i = 0; i < n_; ++i) {
    const auto [b, e] = at(i);
    if (b <= t && t < e) return true;
    if (b > t) break;
  }
  return false;
}

void Calendar::prune(Ps t) {
  while (n_ > 0 && at(0).second <= t) {
    head_ = (head_ + 1) & (kCapacity - 1);
    --n_;
  }
}

namespace {
constexpr isa::Engine kTriggerOrder[] = {isa::Engine::kSync, isa::Engine::kScalar, isa::Engine::kGpsimd, isa::Engine::kVector};
constexpr const char* kTriggerNames[] = {"Sync", "Scalar", "GpSimd", "Vector"};
}  // namespace

int trigger_queue(const CoreParams& p, isa::Engine e, int k) {
  int slot = 0;
  for (int i = 0; i < 4; ++i)
    if (kTriggerOrder[i] == e) slot = i;
  const int per = std::max(1, p.dma_queues_per_trigger);
  return (slot * per + k % per) % std::max(1, p.dma_queues);
}

std::string queue_name(const CoreParams& p, int queue) {
  const int per = std::max(1, p.dma_queues_per_trigger);
  return fmt::format("q{}IO{}", kTriggerNames[(queue / per) % 4], queue % per);
}

DmaEngines::DmaEngines(const CoreParams& p) : p_(p), setup_free_(static_cast<size_t>(p.dma_queues), 0) {}

void DmaEngines::prune(Ps t, Ps t_hbm) {
  for (int e = 0; e < p_.dma_engines; ++e) {
    engine_[static_cast<size_t>(e)].prune(t);
    hbm_[static_cast<size_t>(e)].prune(t_hbm);
  }
}

int DmaEngines::hbm_active_at(Ps t) const {
  int n = 0;
  for (int e = 0; e < p_.dma_engines; ++e) n += hbm_[static_cast<size_t>(e)].busy_at(t);
  return n;
}

DmaEngines::Transfer DmaEngines::transfer(int queue, Ps trigger_start, const memory::DmaSplit& split,
                                          double efficiency) {
  Transfer t;
  Ps& qfree = setup_free_[static_cast<size_t>(queue % p_.dma_queues)];
  t.setup_start = std::max(trigger_start, qfree);
  const Ps setup_end = t.setup_start + p_.dma_setup;
  // Back-to-back transfers on one queue have period max(setup, data) + gap (neuroncore.md 3.3).
  qfree = setup_end + p_.dma_transfer_gap;

  // HBM share: this transfer's engines that move bytes, plus other engines still moving HBM data
  // when its data phase begins, split hbm.bw equally.
  int active = 0;
  if (split.touches_hbm)
    for (int e = 0; e < p_.dma_engines; ++e) {
      const auto ei = static_cast<size_t>(e);
      active += split.piece[ei].bytes > 0 || hbm_[ei].busy_at(setup_end);
    }
  double hbm_bw = split.touches_hbm ? std::min(p_.dma_engine_bw, p_.hbm_bw / std::max(1, active))
                                    : p_.dma_engine_bw;
  // LNC=2: both cores' engines moving HBM data share one stack (hbm.stack_bw).
  if (split.touches_hbm && peer_)
    hbm_bw = std::min(hbm_bw, p_.hbm_stack_bw / std::max(1, active + peer_->hbm_active_at(setup_end)));

  t.data_start = INT64_MAX;
  t.done = setup_end;
  // The pieces of a transfer mostly have the same size: their duration is computed once per size.
  int64_t last_bytes = -1, last_desc = -1;
  Ps dur = 0;
  for (int e = 0; e < split.engines; ++e) {
    const auto ei = static_cast<size_t>(e);
    const memory::DmaPiece& pc = split.piece[ei];
    if (pc.bytes <= 0) continue;
    if (pc.bytes != last_bytes || pc.descriptors != last_desc) {
      last_bytes = pc.bytes;
      last_desc = pc.descriptors;
      const double desc = static_cast<double>(std::max<int64_t>(1, pc.descriptors));
      const double bw = hbm_bw * efficiency;
      const double per_desc_ns = std::max(static_cast<double>(pc.bytes) / desc / bw, sim::ps_to_ns(p_.dma_desc_min));
      dur = static_cast<Ps>(std::llround(desc * per_desc_ns * 1000.0));
    }
    const Ps start = engine_[ei].earliest(setup_end, dur + p_.dma_transfer_gap);
    // The packet moves data for `dur`; the engine then idles dma.transfer_gap before its next packet.
    const Ps end = start + dur;
    engine_[ei].reserve(start, end + p_.dma_transfer_gap);
    if (split.touches_hbm) hbm_[ei].reserve(start, end);
    t.piece_start[ei] = start;
    t.piece_end[ei] = end;
    t.data_start = std::min(t.data_start, start);
    t.done = std::max(t.done, end);
  }
  if (t.data_start == INT64_MAX) t.data_start = setup_end;
  return t;
}

}  // namespace nsim::engines
