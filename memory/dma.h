#pragma once
/// DMA transfer decomposition: how one DMA instruction (a transfer) splits into per-engine pieces
/// and descriptors (spec neuroncore.md 3.3). Timing of the pieces lives in engines/dma.
#include <array>
#include <cstdint>

#include "isa/isa.h"

namespace nsim::memory {

inline constexpr int kMaxDmaEngines = 32;

/// Work of one DMA engine in one transfer.
struct DmaPiece {
  int64_t bytes = 0;        ///< bytes moved by this engine
  int64_t descriptors = 0;  ///< contiguous buffers (each costs at least dma.desc_min)
};

/// A transfer split over the engines of one core.
struct DmaSplit {
  std::array<DmaPiece, kMaxDmaEngines> piece{};
  int engines = 0;      ///< number of engines of the core (pieces[0..engines))
  bool touches_hbm = false;
  int64_t total_bytes = 0;
};

/// Split a transfer from `src` to `dst`. The SBUF/PSUM side decides the engines: engine e serves
/// partitions [e*ppe, (e+1)*ppe). HBM<->HBM splits bytes evenly. Descriptors per partition are the
/// larger count of contiguous runs of the two sides.
DmaSplit split_transfer(const isa::Operand& dst, const isa::Operand& src, int engines, int partitions_per_engine);

}  // namespace nsim::memory
