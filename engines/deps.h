#pragma once
/// Dependency tracking on memory regions. Memory is cut into chunks (per 32-partition quadrant on
/// chip, flat in HBM); each chunk remembers when its last writer finishes and when its readers
/// finish reading it (the simulator records a compute reader's last read, start + busy: docs/timing-model.md),
/// and on which engine class. An instruction may start once every overlapping earlier write (RAW, WAW) and
/// read (WAR) has finished, plus the hand-off latency between classes.
/// Since instructions are scheduled in program order, end times are known when they are recorded.
///
/// Storage: run-length encoded. Neighbouring chunks that hold the same entries (the chunks of one tile,
/// written and read by the same instructions) form one segment, so an access costs the segments it
/// overlaps, not its chunks. A space (SBUF or PSUM, all quadrants side by side; HBM) is cut into pages
/// of kPageChunks chunks, each a sorted list of segments, which bounds what one split or merge moves.
/// Chunks are visited in the order of a chunk-by-chunk scan (quadrant by quadrant, then by address),
/// so every answer, including which producer is reported on a tie, is the one that scan gives.
#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

#include "isa/isa.h"
#include "sim/time.h"

namespace nsim::engines {

/// Producer/consumer class: the five engines, and the DMA queues as one class.
inline constexpr uint8_t kClassDma = isa::kNumEngines;
inline constexpr int kNumClasses = isa::kNumEngines + 1;

/// The bytes recent instructions read (or wrote: one instance each) in HBM, or recent DMAs wrote on chip, by
/// instruction index (a ring), so that a DMA waits only for earlier accesses of the same bytes. DepTracker compares
/// chunks of byte extents (on chip, per quadrant of 32 partitions): the rows of one column block of a row-major
/// tensor (out[:, j w:(j + 1) w], a head's columns of [S, H d], the next chunk of columns an in-place update loads
/// while it stores the previous one) span every other block's extent, small rows share a chunk, and rows loaded one
/// DMA at a time into one tile (t[r:r + 1, :]) share their quadrant's chunks; a compiler orders only accesses of the
/// same bytes (decisions in docs/timing-model.md "Dependencies"). Every instruction accessing HBM is noted (a side
/// addressed at run time by its whole reach); on chip, the DMAs' writes not addressed at run time.
class Footprints {
 public:
  /// A DMA side: in HBM (p1 = 0) its byte extent [lo, hi) and, when `rows`, its bytes lie in [first + k step,
  /// first + k step + len) for k = 0 .. (hi - first - len) / step (its partitions, each within a span of len bytes);
  /// `dense`: every byte of those spans (a row-major free pattern without gaps). On chip (p1 > 0): partitions
  /// [p0, p1) of `space`, each within bytes [lo, hi).
  struct Footprint {
    int64_t lo = 0, hi = 0, first = 0, len = 0, step = 0;
    uint64_t id = ~uint64_t{0};
    int32_t p0 = 0, p1 = 0;
    uint8_t space = 0;
    bool rows = false, dense = false;
  };
  static Footprint of(const isa::Operand& o);
  /// Slot `slot` of `in` (in HBM): of(), or for a side addressed at run time the extent of every row it may reach.
  static Footprint of_slot(const isa::Instr& in, int slot);
  /// Whether the bytes of `a` and `b` are certainly disjoint (false when unsure).
  static bool disjoint(const Footprint& a, const Footprint& b);
  /// Whether HBM side `a` certainly accesses every byte `b` does (false when unsure): `a` every byte of [lo, hi).
  static bool covers(const Footprint& a, const Footprint& b) {
    return a.p1 == 0 && b.p1 == 0 && a.rows && a.dense && (a.step == 0 || a.step == a.len) && a.lo <= b.lo &&
           b.hi <= a.hi;
  }
  /// A remembered access: its bytes (f.id: the instruction), its end, and when it was ready to start (its operands
  /// and, on chip, its predecessors not remembered here: what a DMA skipping it still waits for).
  struct Access {
    Footprint f;
    sim::Ps end = 0;
    sim::Ps floor = 0;
    uint8_t cls = 0;
  };
  /// Remember that instruction `id` of dependency class `cls` (id later than every id noted before) accessed `f`
  /// until `end`, ready from `floor`.
  void note(uint64_t id, uint8_t cls, const Footprint& f, sim::Ps end, sim::Ps floor = 0);
  /// What instruction `id` accessed, if still remembered.
  const Access* find(uint64_t id) const;
  /// Among the last kScan accesses remembered, the one ending latest whose bytes may meet `f`'s (end 0 when
  /// none): a DMA that skipped its chunks' latest access (disjoint) still waits for an earlier one of its bytes.
  struct Latest {
    sim::Ps end = 0;
    uint64_t id = 0;
    uint8_t cls = 0;
  };
  /// Accesses of class `skip_cls` are not considered (a DMA's WAW and WAR on its own trigger engine's class need
  /// no wait, as DepTracker::ready() skips them; kNoClass: none skipped).
  Latest latest_overlap(const Footprint& f, uint8_t skip_cls) const;
  static constexpr uint8_t kNoClass = 0xFF;

 private:
  static constexpr size_t kRing = 4096;  ///< an older access is looked up as unknown: then the DMA waits for it
  static constexpr size_t kScan = 64;
  std::vector<Access> ring_;  ///< in the order noted (ids increasing): entry n % kRing for the n-th
  size_t n_ = 0;              ///< accesses noted
};

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
  DepTracker(const DepTracker&) = delete;  // range_of keeps pointers into its own pages
  DepTracker& operator=(const DepTracker&) = delete;

  /// Make HBM bytes [0, bytes) trackable (called when HBM tensors are allocated; not in the hot loop).
  void reserve_hbm(int64_t bytes);
  /// Host bytes reserve_hbm(bytes) would add up front (0 when [0, bytes) is already trackable): one
  /// page per kPageChunks chunks (the segments grow with the distinct accesses, not with the size).
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
    bool operator==(const Entry& o) const {
      return w_end == o.w_end && r_end == o.r_end && w_tag == o.w_tag && r_tag == o.r_tag;
    }
    bool operator!=(const Entry& o) const { return !(*this == o); }
  };
  static_assert(kNumClasses <= (1 << kClassBits));
  static constexpr int kPageShift = 8;  ///< kPageChunks = 256 chunks per page (a split moves at most one page)
  static constexpr int64_t kPageChunks = int64_t{1} << kPageShift;
  static_assert(kPageChunks <= 256, "Page::seg holds segment indices in a byte");
  /// A page's segments: segment i covers chunks [beg[i], beg[i + 1]) (the last up to the page's end) of
  /// every quadrant row, with the entry of quadrant q at ent[i * quadrants + q]. The quadrants of a
  /// space share segment borders, so an access spanning them looks its chunk up once.
  /// uni[i] set: segment i holds one entry in every quadrant (a tile accessed across all its quadrants
  /// by every instruction so far). A scan then visits one quadrant's entry: the others repeat it, and a
  /// repeated entry changes no answer (the earliest of equal times is kept). Set only when known (it may
  /// be clear for a segment whose quadrants happen to agree).
  struct Page {
    std::vector<int64_t> beg;  ///< sorted; beg[0] is the page's first chunk
    std::vector<Entry> ent;
    std::vector<uint8_t> uni;  ///< by segment
    std::array<uint8_t, kPageChunks> seg{};  ///< by chunk within the page: the index of its segment
  };
  /// The chunks one operand covers: quadrants [q0,q1] x chunks [c0,c1]; computed once per operand.
  /// `base`: the space's pages (`pages` of them, `nq` quadrants each); a row holds `row` chunks.
  /// Trivially constructible on purpose: Regions are built per instruction without zeroing.
  struct Range {
    Page* base;
    int64_t q0, q1, c0, c1, row, pages, nq;
  };
  /// The operands an instruction reads and writes, resolved to chunk ranges (first nr / nw valid).
  struct Regions {
    std::array<Range, isa::kMaxSlots> reads, writes;
    int nr = 0, nw = 0;
  };
  Range range_of(const isa::Operand& o) const { return range_of(o, o.byte_extent()); }
  /// The chunks of `o`'s space covering the byte extent `ext` (a widened extent: isa::slot_extent).
  Range range_of(const isa::Operand& o, std::pair<int64_t, int64_t> ext) const {
    if (o.space == isa::Space::kHbm) return hbm_range(ext);
    const auto [q0, q1] = quadrants(o);
    return onchip_range(o.space == isa::Space::kPsum, q0, q1, ext);
  }
  /// The quadrants [q0, q1] an on-chip operand covers (a function of its partitions: cached per signature).
  std::pair<int64_t, int64_t> quadrants(const isa::Operand& o) const {
    const int parts = o.space == isa::Space::kPsum ? psum_sp_.parts : sbuf_sp_.parts;
    return {o.start_partition / kQuadrant,
            (std::min<int64_t>(o.start_partition + std::max<uint32_t>(o.num_partitions, 1), parts) - 1) / kQuadrant};
  }
  /// range_of for an SBUF (or PSUM) operand of quadrants [q0, q1] and byte extent `ext`.
  Range onchip_range(bool psum, int64_t q0, int64_t q1, std::pair<int64_t, int64_t> ext) const {
    auto [lo, hi] = ext;
    if (hi <= lo) hi = lo + 1;
    const OnChip& sp = psum ? psum_sp_ : sbuf_sp_;
    // Chunk indices: a shift when the chunk size is a power of two (the same after the clamp: a negative
    // byte offset, which verify() rejects, clamps to chunk 0 either way).
    const int64_t c0 = std::clamp<int64_t>(chunk_shift_ >= 0 ? lo >> chunk_shift_ : lo / cfg_.chunk_bytes, 0, sp.row - 1);
    const int64_t c1 =
        std::clamp<int64_t>(chunk_shift_ >= 0 ? (hi - 1) >> chunk_shift_ : (hi - 1) / cfg_.chunk_bytes, 0, sp.row - 1);
    return {sp.base, q0, q1, c0, c1, sp.row, sp.pages, sp.nq};
  }
  static constexpr int kQuadrant = 32;  ///< partitions per quadrant: the hardware's partition-group size

  /// Earliest start for an instruction of class `cls` with these regions, and the tag of the access
  /// that sets it (0 with time 0 when nothing constrains it).
  /// Same-class WAR and WAW need no wait (engines write in order); RAW always waits.
  struct Ready {
    sim::Ps time = 0;
    uint32_t tag = 0;
  };
  /// A DMA (instruction `now`): it skips the wait on an earlier access of its chunks that the rings know to be
  /// disjoint from its side there -- RAW on src, WAW on dst; in HBM also WAR on dst -- then waits for the latest
  /// earlier access of its bytes they remember (Footprints) and, on chip, for when the skipped write was ready
  /// (the ring has only DMA writes: a compute instruction's write before it is then done).
  struct DmaSides {
    const Footprints* hbm_writes;
    const Footprints* hbm_reads;
    const Footprints* chip_writes;
    const isa::Instr* in;  ///< the DMA: its sides' footprints are worked out when first needed
    bool dst_hbm = false, src_hbm = false;
    bool dst_known = false, src_known = false;  ///< footprint usable (on chip: not addressed at run time)
    uint64_t now = 0;
    const Footprints::Footprint& dst() const { return given_[0] ? *given_[0] : side(0, dst_); }
    const Footprints::Footprint& src() const { return given_[1] ? *given_[1] : side(1, src_); }
    /// Give side `slot` (0 dst, 1 src) its footprint when the caller has it (else worked out when first needed);
    /// `f` must outlive this.
    void set(int slot, const Footprints::Footprint* f) { given_[slot] = f; }
    /// The rings to look a side's earlier accesses up in (nullptr: none; the wait is taken as the chunks say).
    const Footprints* src_ring() const { return !src_known ? nullptr : src_hbm ? hbm_writes : chip_writes; }
    const Footprints* dst_writes_ring() const { return !dst_known ? nullptr : dst_hbm ? hbm_writes : chip_writes; }
    const Footprints* dst_reads_ring() const { return dst_known && dst_hbm ? hbm_reads : nullptr; }

   private:
    mutable Footprints::Footprint dst_, src_;
    mutable bool known_[2] = {false, false};
    const Footprints::Footprint* given_[2] = {nullptr, nullptr};
    const Footprints::Footprint& side(int slot, Footprints::Footprint& f) const {
      if (!known_[slot]) f = Footprints::of_slot(*in, slot), known_[slot] = true;
      return f;
    }
  };
  Ready ready(uint8_t cls, const Regions& r) const;
  /// ready() of a DMA accessing HBM when `dw` is set (else ready(cls, r)).
  Ready ready(uint8_t cls, const Regions& r, const DmaSides* dw) const;
  /// ready() for every class in `classes` (bit c = class c) in one pass over the chunks (the
  /// scheduler's engine placement; ready() stays the cheaper single-class scan of the hot path): the
  /// same times and the same producers, ties included.
  void ready_multi(uint8_t classes, const Regions& r, std::array<Ready, kNumClasses>& out,
                   const DmaSides* dw = nullptr) const;
  /// Record that instruction `id` of class `cls` reads its read regions until `read_end` and writes
  /// its write regions, done at `write_end`.
  void record(uint8_t cls, uint64_t id, const Regions& r, sim::Ps read_end, sim::Ps write_end);
  /// The classes of the latest writers of r's chunks (bit c: class c; 0 when nothing wrote them).
  uint32_t writer_classes(const Range& r) const;
  /// Segments held (SBUF, PSUM and HBM pages together): what the run-length encoding keeps.
  size_t segments() const;

 private:
  template <bool kDma>
  Ready ready_impl(uint8_t cls, const Regions& r, const DmaSides* dw) const;
  /// The access tagged `t` when `fp` remembers it and it certainly does not meet `mine` (seen from instruction
  /// now), else nullptr.
  static const Footprints::Access* disjoint_access(const Footprints& fp, uint32_t t, const Footprints::Footprint& mine,
                                                   uint64_t now);
  /// After skipping such an access: the latest earlier one `fp` remembers that `mine` may meet, as (end, tag).
  /// Call f(entry) for each segment of r overlapping its chunks, in chunk order (quadrant by quadrant).
  template <class F>
  [[gnu::always_inline]] static inline void scan(const Range& r, F&& f);
  /// Update each chunk's entry in r with f(Entry&), which returns whether it changed the entry (f idempotent:
  /// a second call changes nothing), splitting and merging segments.
  template <class F>
  static void apply(const Range& r, F&& f);
  /// apply() for its common case, a whole tile: r one uniform segment of one page across every quadrant,
  /// which f changes into an entry equal to neither neighbour. False (nothing done) otherwise.
  template <class F>
  static bool apply_whole(const Range& r, F&& f);
  /// The pages of a row of `row` chunks with `nq` quadrants, each one zero segment.
  static std::vector<Page> make_pages(int64_t nq, int64_t row);

  Range hbm_range(std::pair<int64_t, int64_t> ext) const;
  /// What range_of needs of SBUF and PSUM.
  struct OnChip {
    Page* base = nullptr;
    int64_t row = 0, pages = 0, nq = 0;
    int parts = 0;
  };

  Config cfg_;
  OnChip sbuf_sp_, psum_sp_;
  int chunk_shift_ = -1;      ///< log2(chunk_bytes) when a power of two
  int hbm_chunk_shift_ = -1;  ///< log2(hbm_chunk_bytes) when a power of two (a shift, not a division, per access)
  LatencyTable lat_;
  int64_t sbuf_row_, psum_row_, hbm_row_ = 0;
  int64_t sbuf_nq_, psum_nq_;
  mutable std::vector<Page> sbuf_, psum_, hbm_;
};

}  // namespace nsim::engines
