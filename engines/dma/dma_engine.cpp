#include "engines/dma/dma_engine.h"

#include <algorithm>
#include <cmath>

namespace nsim::engines {

using sim::Ps;

DmaEngines::DmaEngines(const CoreParams& p) : p_(p), setup_free_(static_cast<size_t>(p.dma_queues), 0) {}

DmaEngines::Transfer DmaEngines::transfer(int queue, Ps trigger_start, const memory::DmaSplit& split,
                                          double efficiency) {
  Transfer t;
  Ps& qfree = setup_free_[static_cast<size_t>(queue % p_.dma_queues)];
  t.setup_start = std::max(trigger_start, qfree);
  const Ps setup_end = t.setup_start + p_.dma_setup;
  qfree = setup_end;

  // Engines of this transfer that move HBM bytes count towards the HBM share from the start.
  int own_hbm = 0;
  for (int e = 0; e < split.engines; ++e) own_hbm += (split.touches_hbm && split.piece[static_cast<size_t>(e)].bytes > 0);

  t.data_start = INT64_MAX;
  t.done = setup_end;
  for (int e = 0; e < split.engines; ++e) {
    const auto ei = static_cast<size_t>(e);
    const memory::DmaPiece& pc = split.piece[ei];
    if (pc.bytes <= 0) continue;
    const Ps start = std::max(setup_end, free_[ei]);
    double bw = p_.dma_engine_bw;
    if (split.touches_hbm) {
      int active = own_hbm;
      for (int o = 0; o < p_.dma_engines; ++o)
        if (split.piece[static_cast<size_t>(o)].bytes <= 0 && hbm_busy_[static_cast<size_t>(o)] > start) ++active;
      bw = std::min(bw, p_.hbm_bw / std::max(1, active));
    }
    bw *= efficiency;
    const double desc = static_cast<double>(std::max<int64_t>(1, pc.descriptors));
    const double per_desc_ns = std::max(static_cast<double>(pc.bytes) / desc / bw, sim::ps_to_ns(p_.dma_desc_min));
    // The packet moves data for `dur`; the engine then idles dma.transfer_gap before its next packet.
    const Ps dur = static_cast<Ps>(std::llround(desc * per_desc_ns * 1000.0));
    const Ps end = start + dur;
    free_[ei] = end + p_.dma_transfer_gap;
    if (split.touches_hbm) hbm_busy_[ei] = end;
    t.piece_start[ei] = start;
    t.piece_end[ei] = end;
    t.data_start = std::min(t.data_start, start);
    t.done = std::max(t.done, end);
  }
  if (t.data_start == INT64_MAX) t.data_start = setup_end;
  return t;
}

}  // namespace nsim::engines
