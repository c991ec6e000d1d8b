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
  /// Forget intervals that end at or before t (no future request starts before t).
  void prune(sim::Ps t);
  sim::Ps last_end() const { return n_ ? at(n_ - 1).second : floor_; }

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

class DmaEngines {
 public:
  explicit DmaEngines(const CoreParams& p);

  struct Transfer {
    sim::Ps setup_start = 0;
    sim::Ps data_start = 0;  ///< first piece start
    sim::Ps done = 0;        ///< last piece end
    std::array<sim::Ps, memory::kMaxDmaEngines> piece_start{};
    std::array<sim::Ps, memory::kMaxDmaEngines> piece_end{};
  };
  /// Time a transfer triggered at `trigger_start` on `queue`; `efficiency` scales the bandwidth
  /// (dma_transpose). Updates engine and queue state.
  Transfer transfer(int queue, sim::Ps trigger_start, const memory::DmaSplit& split, double efficiency);
  /// No future transfer is triggered before t; `t_hbm` (<= t): the same for the HBM calendars, which the
  /// peer core of an LNC=2 launch also reads (the minimum of both cores' watermarks).
  void prune(sim::Ps t, sim::Ps t_hbm);
  void prune(sim::Ps t) { prune(t, t); }
  /// LNC=2: the other physical core's DMA engines, which share this core's HBM stack (hbm.stack_bw):
  /// a transfer's HBM share also counts the peer's engines moving HBM data when it starts.
  void set_peer(const DmaEngines* peer) { peer_ = peer; }
  /// Engines of this core moving HBM data at t.
  int hbm_active_at(sim::Ps t) const;
  /// When `queue` may start the next setup.
  sim::Ps queue_free(int queue) const { return setup_free_[static_cast<size_t>(queue % p_.dma_queues)]; }

 private:
  const CoreParams& p_;
  std::vector<sim::Ps> setup_free_;                         // per queue
  std::array<Calendar, memory::kMaxDmaEngines> engine_{};   // data pieces (+ gap)
  std::array<Calendar, memory::kMaxDmaEngines> hbm_{};      // pieces that touch HBM
  const DmaEngines* peer_ = nullptr;                        // LNC=2: the other core's engines
};

}  // namespace nsim::engines
