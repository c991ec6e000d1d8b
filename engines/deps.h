#pragma once
/// Dependency tracking on memory regions. Memory is cut into chunks (per 32-partition quadrant on
/// chip, flat in HBM); each chunk remembers when its last writer finishes and when its readers
/// finish, and on which engine class. An instruction may start once every overlapping earlier
/// write (RAW, WAW) and read (WAR) has finished, plus the hand-off latency between classes.
/// Since instructions are scheduled in program order, end times are known when they are recorded.
#include <array>
#include <cstdint>
#include <vector>

#include "isa/isa.h"
#include "sim/time.h"

namespace nsim::engines {

/// Producer/consumer class: the five engines, and the DMA queues as one class.
inline constexpr uint8_t kClassDma = isa::kNumEngines;
inline constexpr int kNumClasses = isa::kNumEngines + 1;

class DepTracker {
 public:
  /// Filled from CoreParams (engines/simulator.cpp dep_config); no defaults of its own.
  struct Config {
    int partitions = 0;
    int64_t sbuf_bytes = 0;
    int psum_partitions = 0;
    int64_t psum_bytes = 0;
    int64_t chunk_bytes = 0;
    int64_t hbm_chunk_bytes = 0;
  };
  /// Latency a consumer of class c sees after a producer of class p finishes.
  using LatencyTable = std::array<std::array<sim::Ps, kNumClasses>, kNumClasses>;

  DepTracker(const Config& cfg, const LatencyTable& lat);

  /// Make HBM bytes [0, bytes) trackable (called when HBM tensors are allocated; not in the hot loop).
  void reserve_hbm(int64_t bytes);
  /// Host bytes reserve_hbm(bytes) would add (0 when [0, bytes) is already trackable).
  int64_t reserve_hbm_cost(int64_t bytes) const;

  /// Who last wrote / read a chunk: class in the low 3 bits, the instruction's program-order index
  /// (modulo 2^29) above them, so an Entry stays 24 bytes. The index is only used to attribute waits.
  static constexpr uint32_t kClassBits = 3;
  static uint32_t tag(uint8_t cls, uint64_t id) { return static_cast<uint32_t>(id << kClassBits) | cls; }
  static uint8_t tag_class(uint32_t t) { return static_cast<uint8_t>(t & ((1u << kClassBits) - 1)); }
  /// The full index of the producer tagged `t`, seen from instruction `now` (> producer).
  static uint64_t tag_index(uint32_t t, uint64_t now) {
    constexpr uint64_t kMod = uint64_t{1} << (32 - kClassBits);
    return now - ((now - (t >> kClassBits)) & (kMod - 1));
  }
  struct Entry {
    sim::Ps w_end = 0;
    sim::Ps r_end = 0;
    uint32_t w_tag = 0;
    uint32_t r_tag = 0;
  };
  static_assert(kNumClasses <= (1 << kClassBits));
  /// The chunks one operand covers: quadrants [q0,q1] x chunks [c0,c1]; computed once per operand.
  /// Trivially constructible on purpose: Regions are built per instruction without zeroing.
  struct Range {
    Entry* base;
    int64_t q0, q1, c0, c1, row;
  };
  /// The operands an instruction reads and writes, resolved to chunk ranges (first nr / nw valid).
  struct Regions {
    std::array<Range, isa::kMaxSlots> reads, writes;
    int nr = 0, nw = 0;
  };
  Range range_of(const isa::Operand& o) const { return range_of(o, o.byte_extent()); }
  /// The chunks of `o`'s space covering the byte extent `ext` (a widened extent: isa::slot_extent).
  Range range_of(const isa::Operand& o, std::pair<int64_t, int64_t> ext) const;

  /// Earliest start for an instruction of class `cls` with these regions, and the tag of the access
  /// that sets it (0 with time 0 when nothing constrains it).
  /// Same-class WAR and WAW need no wait (engines write in order); RAW always waits.
  struct Ready {
    sim::Ps time = 0;
    uint32_t tag = 0;
  };
  Ready ready(uint8_t cls, const Regions& r) const;
  /// ready() for every class in `classes` (bit c = class c) in one pass over the chunks (the
  /// scheduler's engine placement; ready() stays the cheaper single-class scan of the hot path).
  void ready_multi(uint8_t classes, const Regions& r, std::array<Ready, kNumClasses>& out) const;
  /// Record that instruction `id` of class `cls` reads its read regions until `read_end` and writes
  /// its write regions, done at `write_end`.
  void record(uint8_t cls, uint64_t id, const Regions& r, sim::Ps read_end, sim::Ps write_end);

 private:

  Config cfg_;
  LatencyTable lat_;
  int64_t sbuf_row_, psum_row_;
  mutable std::vector<Entry> sbuf_, psum_, hbm_;
};

}  // namespace nsim::engines
