#pragma once
/// DMA timing (neuroncore.md 3.3): per-queue serial setup that overlaps the previous transfer's
/// data phase, per-engine FIFO data pieces at the engine bandwidth, each descriptor costing at least
/// dma.desc_min, a per-transfer gap, and HBM bandwidth shared by the engines that touch HBM at once.
#include <array>
#include <vector>

#include "engines/params.h"
#include "memory/dma.h"
#include "sim/time.h"

namespace nsim::engines {

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

  sim::Ps engine_free(int e) const { return free_[static_cast<size_t>(e)]; }

 private:
  const CoreParams& p_;
  std::vector<sim::Ps> setup_free_;                      // per queue
  std::array<sim::Ps, memory::kMaxDmaEngines> free_{};   // per engine: end of its last piece
  std::array<sim::Ps, memory::kMaxDmaEngines> hbm_busy_{};
};

}  // namespace nsim::engines
