#pragma once
/// DMA timing (neuroncore.md 3.3): per-queue serial setup that overlaps the previous transfer's
/// data phase, per-engine data pieces at the engine bandwidth, each descriptor costing at least
/// dma.desc_min, a gap after each piece, and HBM bandwidth shared by the engines that touch HBM at
/// once. Each DMA engine keeps a calendar of busy intervals, so a transfer scheduled later in
/// program order but ready earlier (another queue) takes an earlier idle gap, as the engines'
/// round-robin over queues would.
#include <array>
#include <string>
#include <vector>

#include "engines/params.h"
#include "memory/dma.h"
#include "sim/time.h"

namespace nsim::engines {

/// Busy intervals of one resource, sorted, bounded (no allocation after construction). A ring
/// buffer: bookings mostly arrive in time order, so appending and forgetting the oldest are O(1).
class Calendar {
 public:
  static constexpr int kCapacity = 64;  ///< a power of two (ring index mask)
  static_assert((kCapacity & (kCapacity - 1)) == 0);
  /// Earliest start >= t at which [start, start + dur) is free.
  sim::Ps earliest(sim::Ps t, sim::Ps dur) const;
  void reserve(sim::Ps start, sim::Ps end);
  bool busy_at(sim::Ps t) const;
  /// Forget intervals that end at or before t (no future request starts before t); true if any went.
  bool prune(sim::Ps t);
  /// The same bookings and floor: every future request gets the same answer from both.
  bool same(const Calendar& o) const;
  /// What a request at or after `w` can meet (fast-forward, Simulator::timing_digest): the floor and each booking
  /// that ends after w, to `time` (absolute times, which the digest clamps at w), then their number to `raw`.
  /// Every booking, not only the last end: a transfer ready before the last end takes an earlier idle gap.
  template <class Time, class Raw>
  void state(sim::Ps w, Time&& time, Raw&& raw) const {
    time(floor_);
    int64_t seen = 0;
    for (int i = 0; i < n_; ++i) {
      const auto& [s, e] = at(i);
      if (e <= w) continue;  // (waits to be pruned: no request meets it)
      time(s);
      time(e);
      ++seen;
    }
    raw(seen);
  }

 private:
  std::pair<sim::Ps, sim::Ps>& at(int i) { return iv_[static_cast<size_t>((head_ + i) & (kCapacity - 1))]; }
  const std::pair<sim::Ps, sim::Ps>& at(int i) const { return iv_[static_cast<size_t>((head_ + i) & (kCapacity - 1))]; }
  std::array<std::pair<sim::Ps, sim::Ps>, kCapacity> iv_{};
  int head_ = 0;  ///< ring index of the oldest interval
  int n_ = 0;
  sim::Ps floor_ = 0;  ///< nothing may be booked before this (end of intervals dropped when full)
};

/// The compiler's DMA queue layout (compiler.md 3): each trigger engine owns
/// compiler.dma_queues_per_trigger consecutive queue ids (Sync first, then Scalar, GpSimd, Vector),
/// wrapping around dma.queues_per_engine. Queue id of trigger engine `e`'s k-th queue:
int trigger_queue(const CoreParams& p, isa::Engine e, int k);
/// Profiler-style name of a queue id: "qSyncIO0", "qScalarIO1", "qGpSimdIO0", ...
std::string queue_name(const CoreParams& p, int queue);

/// The DMA engines of one core.
///
/// Closed form: engines whose calendars are equal (the same bookings, data and HBM) share one *lane*,
/// a single pair of calendars, and a transfer whose pieces on a lane's engines all take the same time
/// books that lane once instead of once per engine: equal calendars asked the same question give the
/// same answer, so the times are those of booking every engine. A transfer whose pieces differ within a
/// lane (fewer partitions than engines, uneven pieces) splits the lane by piece duration, copying its
/// calendars; lanes whose calendars become equal again (their differing bookings pruned) merge at
/// prune(). A full 128-partition transfer on a core whose engines all moved the same transfers costs one
/// calendar lookup and booking instead of dma.engines.
class DmaEngines {
 public:
  explicit DmaEngines(const CoreParams& p);
  /// The split of a transfer on this core (memory::split_transfer with the core's engines and
  /// partitions per engine), cached by shape; valid until the next call.
  const memory::DmaSplit& split(const isa::Operand& dst, const isa::Operand& src) { return splits_.get(dst, src); }
  /// Off: every engine on its own calendars, booked one by one (the reference the closed form is tested
  /// against). On by default. Either way the times are the same.
  void set_closed_form(bool on);
  /// Lanes in use (1 when every engine has the same calendars; dma.engines with the closed form off).
  int lanes() const;

  struct Transfer {
    sim::Ps setup_start = 0;
    sim::Ps data_start = 0;  ///< first piece start
    sim::Ps done = 0;        ///< last piece end
    std::array<sim::Ps, memory::kMaxDmaEngines> piece_start{};
    std::array<sim::Ps, memory::kMaxDmaEngines> piece_end{};
    /// Every engine with a piece moves it over the same interval (all its piece_start / piece_end equal).
    bool same_times = false;
  };
  /// Time a transfer triggered at `trigger_start` on `queue`; `efficiency` scales the bandwidth
  /// (dma_transpose); a `store` (SBUF or PSUM to HBM) moves at dma.engine_bw x dma.store_bw_factor
  /// per engine before the HBM share. Updates engine and queue state. Pieces of engines at or beyond
  /// dma.engines are ignored (a split of this core has split.engines == dma.engines).
  Transfer transfer(int queue, sim::Ps trigger_start, const memory::DmaSplit& split, double efficiency, bool store);
  /// No future transfer is triggered before t; `t_hbm` (<= t): the same for the HBM calendars, which the
  /// peer core of an LNC=2 launch also reads (the minimum of both cores' watermarks).
  void prune(sim::Ps t, sim::Ps t_hbm);
  void prune(sim::Ps t) { prune(t, t); }
  /// LNC=2: the other physical core's DMA engines, which share this core's HBM stack (hbm.stack_bw):
  /// a transfer's HBM share also counts the peer's engines moving HBM data when it starts.
  void set_peer(const DmaEngines* peer) { peer_ = peer; }
  /// Engines of this core moving HBM data at t.
  int hbm_active_at(sim::Ps t) const;
  /// The engines' calendars (data and HBM) as requests at or after `w` meet them (Calendar::state), engine by
  /// engine; an engine sharing the lane of the one before it counts as that (a property of which engines share,
  /// not of the lanes' numbering).
  template <class Time, class Raw>
  void state(sim::Ps w, Time&& time, Raw&& raw) const {
    for (int e = 0; e < p_.dma_engines; ++e) {
      const auto l = lane_of_[static_cast<size_t>(e)];
      if (e > 0 && l == lane_of_[static_cast<size_t>(e - 1)]) {
        raw(-1);
        continue;
      }
      lane_[l].data.state(w, time, raw);
      lane_[l].hbm.state(w, time, raw);
    }
  }
  /// When `queue` may start the next setup.
  sim::Ps queue_free(int queue) const { return setup_free_[queue_index(queue)]; }
  /// The queue's index (queue ids wrap modulo dma.queues; a division only for an id past them).
  size_t queue_index(int queue) const {
    return static_cast<size_t>(queue >= 0 && queue < p_.dma_queues ? queue : queue % p_.dma_queues);
  }

 private:
  struct Lane {
    Calendar data;         // data pieces (+ gap)
    Calendar hbm;          // pieces that touch HBM
    uint32_t members = 0;  // bit e: engine e books here (0: lane free)
  };
  void reset_lanes(bool shared);
  int new_lane(int from, uint32_t members);
  void merge_lanes();

  const CoreParams& p_;
  double desc_min_ns_;  ///< dma.desc_min in ns (a division per transfer otherwise)
  std::vector<sim::Ps> setup_free_;                  // per queue
  std::array<Lane, memory::kMaxDmaEngines> lane_{};  // at most one lane per engine
  std::array<uint8_t, memory::kMaxDmaEngines> lane_of_{};
  uint32_t live_ = 0;        // bit l: lane l in use
  uint32_t all_ = 0;         // bits of engines [0, dma.engines)
  bool closed_form_ = true;
  bool prune_merge_ = false; // a pruned lane lost bookings: lanes may have become equal
  memory::DmaSplitCache splits_;
  const DmaEngines* peer_ = nullptr;  // LNC=2: the other core's engines
};

}  // namespace nsim::engines
