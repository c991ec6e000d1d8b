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
  uint32_t used = 0;     ///< bit e: piece[e] moves bytes (e < engines)
  bool uniform = false;  ///< every used piece has the same bytes and descriptors
};

/// Split a transfer from `src` to `dst`. The SBUF/PSUM side decides the engines: engine e serves
/// partitions [e*ppe, (e+1)*ppe). HBM<->HBM splits bytes evenly. Descriptors per partition are the
/// larger count of contiguous runs of the two sides.
DmaSplit split_transfer(const isa::Operand& dst, const isa::Operand& src, int engines, int partitions_per_engine);

/// A store: a transfer writing HBM from SBUF or PSUM (its engines move at dma.store_bw_factor x dma.engine_bw).
inline bool is_store(const isa::Operand& dst, const isa::Operand& src) {
  return dst.space == isa::Space::kHbm && src.space != isa::Space::kHbm;
}

/// True when split_transfer gives the same split for (a, a2) as for (b, b2) whatever the offsets: every
/// field it reads but the offset (space, dtype, partitions, partition step, free sizes and strides).
bool same_dma_shape(const isa::Operand& a, const isa::Operand& b);

/// The splits of recent transfer shapes: a loop's DMAs move the same access pattern at another offset
/// each iteration, and their split does not depend on the offset. Fixed size, no allocation.
class DmaSplitCache {
 public:
  static constexpr int kEntries = 8;
  DmaSplitCache(int engines, int partitions_per_engine) : engines_(engines), ppe_(partitions_per_engine) {}
  /// split_transfer(dst, src, engines, partitions_per_engine); valid until the next call.
  const DmaSplit& get(const isa::Operand& dst, const isa::Operand& src);

 private:
  struct Entry {
    isa::Operand dst, src;
    DmaSplit split;
  };
  std::array<Entry, kEntries> e_{};
  int n_ = 0;     ///< entries filled
  int next_ = 0;  ///< the entry a miss replaces (round robin)
  int last_ = 0;  ///< the entry of the last hit, looked at first
  int engines_, ppe_;
};

}  // namespace nsim::memory
