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

bool Calendar::prune(Ps t) {
  const int n0 = n_;
  while (n_ > 0 && at(0).second <= t) {
    head_ = (head_ + 1) & (kCapacity - 1);
    --n_;
  }
  return n_ != n0;
}

bool Calendar::same(const Calendar& o) const {
  if (n_ != o.n_ || floor_ != o.floor_) return false;
  for (int i = n_ - 1; i >= 0; --i)  // the latest bookings differ first
    if (at(i) != o.at(i)) return false;
  return true;
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

DmaEngines::DmaEngines(const CoreParams& p)
    : p_(p), desc_min_ns_(sim::ps_to_ns(p.dma_desc_min)), setup_free_(static_cast<size_t>(p.dma_queues), 0), splits_(p.dma_engines, p.partitions_per_engine) {
  const int n = std::clamp(p.dma_engines, 1, memory::kMaxDmaEngines);
  all_ = n == 32 ? ~0u : (1u << n) - 1;
  reset_lanes(true);
}

namespace {
inline int low_bit(uint32_t m) { return __builtin_ctz(m); }
inline int bits(uint32_t m) {
#ifdef __POPCNT__
  return __builtin_popcount(m);
#else  // a baseline x86-64 build calls libgcc for __builtin_popcount: the same count inline
  m -= (m >> 1) & 0x55555555u;
  m = (m & 0x33333333u) + ((m >> 2) & 0x33333333u);
  return static_cast<int>((((m + (m >> 4)) & 0x0F0F0F0Fu) * 0x01010101u) >> 24);
#endif
}
}  // namespace

void DmaEngines::reset_lanes(bool shared) {
  // Only at construction (calendars empty) or from set_closed_form (calendars copied per engine).
  std::array<Lane, memory::kMaxDmaEngines> by_engine;
  for (uint32_t m = all_; m; m &= m - 1) {
    const int e = low_bit(m);
    by_engine[static_cast<size_t>(e)] = lane_[lane_of_[static_cast<size_t>(e)]];
  }
  live_ = 0;
  for (auto& l : lane_) l = Lane{};
  if (shared) {
    // Engines with equal calendars share a lane (all of them on a fresh core).
    for (uint32_t m = all_; m; m &= m - 1) {
      const int e = low_bit(m);
      const auto ei = static_cast<size_t>(e);
      int l = -1;
      for (uint32_t lv = live_; lv && l < 0; lv &= lv - 1) {
        const auto li = static_cast<size_t>(low_bit(lv));
        if (lane_[li].data.same(by_engine[ei].data) && lane_[li].hbm.same(by_engine[ei].hbm)) l = low_bit(lv);
      }
      if (l < 0) {
        l = e;
        lane_[ei] = by_engine[ei];
        lane_[ei].members = 0;
        live_ |= 1u << e;
      }
      lane_[static_cast<size_t>(l)].members |= 1u << e;
      lane_of_[ei] = static_cast<uint8_t>(l);
    }
  } else {
    for (uint32_t m = all_; m; m &= m - 1) {
      const int e = low_bit(m);
      const auto ei = static_cast<size_t>(e);
      lane_[ei] = by_engine[ei];
      lane_[ei].members = 1u << e;
      lane_of_[ei] = static_cast<uint8_t>(e);
      live_ |= 1u << e;
    }
  }
}

void DmaEngines::set_closed_form(bool on) {
  closed_form_ = on;
  reset_lanes(on);
}

int DmaEngines::lanes() const { return bits(live_); }

int DmaEngines::new_lane(int from, uint32_t members) {
  // A copy of lane `from`'s calendars for `members` (taken out of it). There are never more lanes than
  // engines, so a free one exists.
  const int l = low_bit(~live_);
  Lane& nl = lane_[static_cast<size_t>(l)];
  Lane& ol = lane_[static_cast<size_t>(from)];
  nl.data = ol.data;
  nl.hbm = ol.hbm;
  nl.members = members;
  ol.members &= ~members;
  live_ |= 1u << l;
  for (uint32_t m = members; m; m &= m - 1) lane_of_[static_cast<size_t>(low_bit(m))] = static_cast<uint8_t>(l);
  return l;
}

void DmaEngines::merge_lanes() {
  // Lanes with equal calendars become one (the lowest index keeps them).
  for (uint32_t a = live_; a; a &= a - 1) {
    const int i = low_bit(a);
    if (!(live_ & (1u << i))) continue;  // merged into an earlier lane
    Lane& li = lane_[static_cast<size_t>(i)];
    for (uint32_t b = live_ & ~((2u << i) - 1); b; b &= b - 1) {
      const int j = low_bit(b);
      Lane& lj = lane_[static_cast<size_t>(j)];
      if (!li.data.same(lj.data) || !li.hbm.same(lj.hbm)) continue;
      for (uint32_t m = lj.members; m; m &= m - 1) lane_of_[static_cast<size_t>(low_bit(m))] = static_cast<uint8_t>(i);
      li.members |= lj.members;
      lj.members = 0;
      live_ &= ~(1u << j);
    }
  }
}

void DmaEngines::prune(Ps t, Ps t_hbm) {
  bool gone = false;
  for (uint32_t lv = live_; lv; lv &= lv - 1) {
    Lane& l = lane_[static_cast<size_t>(low_bit(lv))];
    gone |= l.data.prune(t);
    gone |= l.hbm.prune(t_hbm);
  }
  if (gone && closed_form_ && (live_ & (live_ - 1))) merge_lanes();
}

int DmaEngines::hbm_active_at(Ps t) const {
  int n = 0;
  for (uint32_t lv = live_; lv; lv &= lv - 1) {
    const Lane& l = lane_[static_cast<size_t>(low_bit(lv))];
    if (l.hbm.busy_at(t)) n += bits(l.members);
  }
  return n;
}

DmaEngines::Transfer DmaEngines::transfer(int queue, Ps trigger_start, const memory::DmaSplit& split,
                                          double efficiency, bool store) {
  Transfer t;
  Ps& qfree = setup_free_[queue_index(queue)];
  t.setup_start = std::max(trigger_start, qfree);
  const Ps setup_end = t.setup_start + p_.dma_setup;
  // Back-to-back transfers on one queue have period max(setup, data) + gap (neuroncore.md 3.3).
  qfree = setup_end + p_.dma_transfer_gap;

  // The engines that move bytes (a split of another engine count keeps only this core's engines).
  const uint32_t used = split.used & all_;
  // HBM share: this transfer's engines that move bytes, plus other engines still moving HBM data
  // when its data phase begins, split hbm.bw equally.
  int active = 0;
  if (split.touches_hbm) {
    active = bits(used);
    const uint32_t idle = all_ & ~used;
    for (uint32_t lv = live_; lv && idle; lv &= lv - 1) {
      const Lane& l = lane_[static_cast<size_t>(low_bit(lv))];
      if ((l.members & idle) && l.hbm.busy_at(setup_end)) active += bits(l.members & idle);
    }
  }
  const double engine_bw = store ? p_.dma_engine_bw * p_.dma_store_bw_factor : p_.dma_engine_bw;
  double hbm_bw = split.touches_hbm ? std::min(engine_bw, p_.hbm_bw / std::max(1, active)) : engine_bw;
  // LNC=2: both cores' engines moving HBM data share one stack (hbm.stack_bw).
  if (split.touches_hbm && peer_)
    hbm_bw = std::min(hbm_bw, p_.hbm_stack_bw / std::max(1, active + peer_->hbm_active_at(setup_end)));

  const double bw = hbm_bw * efficiency;
  // A piece of `bytes` in `desc` contiguous buffers takes desc * max(bytes / desc / bw, dma.desc_min).
  auto duration = [&](const memory::DmaPiece& pc) {
    const double desc = static_cast<double>(std::max<int64_t>(1, pc.descriptors));
    const double per_desc_ns = std::max(static_cast<double>(pc.bytes) / desc / bw, desc_min_ns_);
    return sim::round_nonneg(desc * per_desc_ns * 1000.0);
  };
  t.data_start = INT64_MAX;
  t.same_times = true;  // until two pieces differ (book)
  t.done = setup_end;
  // Book `members` (engines of lane l, all with pieces of duration dur) once on the lane's calendars:
  // the packet moves data for `dur`; the engine then idles dma.transfer_gap before its next packet.
  auto book = [&](int l, uint32_t members, Ps dur) {
    Lane& ln = lane_[static_cast<size_t>(l)];
    const Ps start = ln.data.earliest(setup_end, dur + p_.dma_transfer_gap);
    const Ps end = start + dur;
    ln.data.reserve(start, end + p_.dma_transfer_gap);
    if (split.touches_hbm) ln.hbm.reserve(start, end);
    for (uint32_t m = members; m; m &= m - 1) {
      const auto ei = static_cast<size_t>(low_bit(m));
      t.piece_start[ei] = start;
      t.piece_end[ei] = end;
    }
    if (t.data_start != INT64_MAX && (start != t.data_start || end != t.done)) t.same_times = false;
    t.data_start = std::min(t.data_start, start);
    t.done = std::max(t.done, end);
  };

  if (split.uniform) {
    // Every piece takes the same time: a lane whose engines all have a piece is booked once; a lane
    // with engines both with and without a piece splits in two.
    const Ps dur = used ? duration(split.piece[static_cast<size_t>(low_bit(used))]) : 0;
    for (uint32_t lv = live_; lv; lv &= lv - 1) {
      const int l = low_bit(lv);
      const uint32_t mem = lane_[static_cast<size_t>(l)].members;
      const uint32_t with = mem & used;
      if (!with) continue;
      book(with == mem ? l : new_lane(l, with), with, dur);
    }
  } else {
    // Pieces of different sizes: group each lane's engines by piece duration.
    std::array<Ps, memory::kMaxDmaEngines> dur{};
    int64_t last_bytes = -1, last_desc = -1;
    Ps d = 0;
    for (uint32_t m = used; m; m &= m - 1) {
      const auto ei = static_cast<size_t>(low_bit(m));
      const memory::DmaPiece& pc = split.piece[ei];
      if (pc.bytes != last_bytes || pc.descriptors != last_desc) {
        last_bytes = pc.bytes;
        last_desc = pc.descriptors;
        d = duration(pc);
      }
      dur[ei] = d;
    }
    for (uint32_t lv = live_; lv; lv &= lv - 1) {
      const int l = low_bit(lv);
      uint32_t rest = lane_[static_cast<size_t>(l)].members & used;
      while (rest) {
        const Ps dl = dur[static_cast<size_t>(low_bit(rest))];
        uint32_t same = 0;
        for (uint32_t m = rest; m; m &= m - 1)
          if (dur[static_cast<size_t>(low_bit(m))] == dl) same |= 1u << low_bit(m);
        rest &= ~same;
        book(same == lane_[static_cast<size_t>(l)].members ? l : new_lane(l, same), same, dl);
      }
    }
  }
  if (t.data_start == INT64_MAX) t.data_start = setup_end;
  return t;
}

}  // namespace nsim::engines
