#pragma once
/// What the simulator works out once per instruction signature (isa::same_signature: instructions that
/// differ only in their operands' offsets and source location, such as the iterations of one op in a loop)
/// instead of once per instruction: that verify() passed (isa::Placement keeps the checks of the offsets,
/// done per instruction), the operands' byte extents relative to their offsets (the dependency regions), a
/// streaming engine's cost and ports (StreamEngines::Plan), the FLOPs and the bytes moved per memory space.
/// Every entry is a pure function of the signature and the configuration, so a run gives the same times,
/// stats and errors with or without the cache (SimOptions::signature_cache; tests/unit/engines/test_sig_cache.cpp).
#include <array>
#include <cstdint>
#include <memory>

#include "engines/deps.h"
#include "engines/run_stats.h"
#include "engines/stream_engines.h"
#include "isa/isa.h"

namespace nsim::engines {

/// The operands an instruction reads and writes, in slot order, as byte extents relative to their offsets: what its
/// dependency regions are worked out from (Simulator::sig_regions; the same for every instruction of a signature).
struct SigAccesses {
  /// An operand's byte extent relative to its offset (the indirect side widened as isa::slot_extent does).
  struct Access {
    int64_t lo = 0, hi = 0;
    int64_t q0 = 0, q1 = 0;  ///< on chip: the quadrants (DepTracker::quadrants)
    uint8_t slot = 0;
    isa::Space space = isa::Space::kNone;
  };
  std::array<Access, isa::kMaxSlots> reads{}, writes{};
  uint8_t nr = 0, nw = 0;
};

struct SigInfo {
  isa::Instr key;  ///< the instruction the entry was made from (its offsets are not part of the signature)
  uint64_t hash = 0;
  bool valid = false;
  isa::Placement place;
  SigAccesses acc;
  bool stream = false;           ///< an instruction of VectorE / ScalarE / GpSimd / Sync: plan and flops are set
  StreamEngines::Plan plan;
  double flops = 0;              ///< instr_flops(in, 0)
  RunStats::Bytes bytes;
  /// A DMA: its dst (0) and src (1) footprints (engines::Footprints::of) at offset 0, when not addressed at run
  /// time (dma_fp_ok): Simulator::footprint() shifts them by the instruction's offsets.
  std::array<Footprints::Footprint, 2> dma_fp{};
  std::array<bool, 2> dma_fp_ok{};
};

/// A two-way set-associative table of SigInfo (no allocation after the first use; a miss replaces the
/// entry of its set used least recently).
class SigCache {
 public:
  static constexpr int kSetBits = 6;
  static constexpr size_t kSets = size_t{1} << kSetBits;
  /// The entry of `in`'s signature (hash `h`, isa::signature_hash), or nullptr.
  SigInfo* find(const isa::Instr& in, uint64_t h) {
    if (!e_) return nullptr;
    const size_t s = set_of(h);
    for (size_t w = 0; w < 2; ++w) {
      SigInfo& e = e_[2 * s + w];
      if (e.valid && e.hash == h && isa::same_signature(e.key, in)) {
        mru_[s] = static_cast<uint8_t>(w);
        return &e;
      }
    }
    return nullptr;
  }
  /// Mark entry `e` (of this table) used, as find() does on a hit.
  void touch(const SigInfo* e) {
    const auto i = static_cast<size_t>(e - e_.get());
    mru_[i / 2] = static_cast<uint8_t>(i % 2);
  }
  /// The entry to overwrite for a new signature of hash `h` (the caller fills it).
  SigInfo& victim(uint64_t h) {
    if (!e_) {
      e_ = std::make_unique<SigInfo[]>(2 * kSets);
      mru_ = std::make_unique<uint8_t[]>(kSets);
    }
    const size_t s = set_of(h);
    const size_t w = mru_[s] ^ 1u;
    mru_[s] = static_cast<uint8_t>(w);
    return e_[2 * s + w];
  }

 private:
  static size_t set_of(uint64_t h) { return static_cast<size_t>((h * 0x9e3779b97f4a7c15ULL) >> (64 - kSetBits)); }
  std::unique_ptr<SigInfo[]> e_;
  std::unique_ptr<uint8_t[]> mru_;
};

}  // namespace nsim::engines
