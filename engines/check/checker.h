#pragma once
/// The sanitizer (`nsim run --check`, Python `options(check=True)`): cheap checks on the numerics of a
/// run that report bugs hardware would hide. It watches every instruction executed with numerics:
///  * uninitialized-read: an instruction reads SBUF/PSUM bytes that nothing has written (they read as
///    the NaN / 4 sentinel: silent garbage on hardware). A per-partition instruction (element-wise and
///    free-axis ops: propagates_taint() in checker.cpp), a transpose (nc_transpose, a matmul with
///    is_transpose) and a matmul report nothing: they *taint* the output elements computed from the bad
///    ones (as valgrind's memcheck does), element by element; a DMA or other partition-mixing
///    instruction that reads never-written or tainted bytes reports;
///  * psum-accumulate-uninitialized: an accumulating matmul (or accumulating DMA) adds into PSUM/SBUF
///    bytes that nothing has written (an accumulation group that was never opened);
///  * nan-produced: the first instruction whose result holds NaN/Inf although all its inputs are finite;
///  * cast-out-of-range: the first instruction that narrows values out of their destination dtype's
///    range (an integer saturates, NaN becomes 0, an fp8/fp16 value overflows to inf/NaN);
///  * dma-race (LNC=2 only, engines/check/race.h): the two cores' DMAs touch the same shared-HBM bytes,
///    one of them writing, with no sendrecv/core_barrier between them.
/// Reports are diagnostics, not errors: the first one of each check is kept with its instruction, the
/// operand slot and the element range; later ones are counted. The check codes are in one table
/// (kChecks below) so they can move into the error-code table unchanged.
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "isa/isa.h"
#include "isa/semantics/semantics.h"
#include "memory/memory.h"
#include "sim/error.h"

namespace nsim::engines {

/// One kind of check.
/// kAffineWriteConflict is checked by the Python tracer (affine_range loops are unrolled while traced);
/// its code and fix live here with the others (_nsim.check_table()).
enum class CheckKind : uint8_t {
  kUninitializedRead,
  kPsumAccumulateUninitialized,
  kNanProduced,
  kAffineWriteConflict,
  kCastOutOfRange,
  kDmaRace,
  kActivationOutOfRange,
  kDuplicateIndices,
  kStartPartition,
  kCount
};

struct CheckInfo {
  const char* code;  ///< stable diagnostic code
  const char* name;  ///< the check's name, as options and reports spell it
  const char* fix;   ///< what usually fixes it
};

/// The table of checks, by CheckKind.
inline constexpr std::array<CheckInfo, static_cast<size_t>(CheckKind::kCount)> kChecks{{
    {"NSIM-W501", "uninitialized-read",
     "write the tile before reading it (nisa.memset / a load), or read only the part that was written "
     "(element-wise ops, transposes and matmuls may compute on the unwritten rows of a ragged tile, but mask "
     "the store to the rows and columns computed from written data)"},
    {"NSIM-W502", "psum-accumulate-uninitialized",
     "start the accumulation group with accumulate=False (or None), or zero the PSUM tile first with nisa.memset"},
    {"NSIM-W503", "nan-produced",
     "check the op's inputs for values out of the function's domain (log/rsqrt of <= 0, division by 0, overflow)"},
    {"NSIM-W504", "affine-write-conflict",
     "give each iteration its own tile or slice (allocate the tile inside the loop), or use nl.sequential_range "
     "when iterations depend on each other (the compiler's err_unexpected_output_dependencies)"},
    {"NSIM-W505", "cast-out-of-range",
     "bring the values into the destination dtype's range first (scale before an fp8 cast, clamp before an "
     "integer cast), or write a wider dtype"},
    {"NSIM-W506", "dma-race",
     "order the two cores' accesses with nisa.core_barrier on the shared tensor (or a sendrecv) between the "
     "write and the other core's access, or give each core its own part of the tensor"},
    {"NSIM-W507", "activation-out-of-range",
     "bring the function's input (data * scale + bias) into its valid range first: reduce angles to [-pi, pi] before "
     "sin (nl.sin does: x mod 2pi, then a bias of -pi), clamp before log / sqrt / rsqrt / reciprocal"},
    {"NSIM-W508", "duplicate-indices",
     "make the scatter's row indices unique (combine the rows of one index on chip first, e.g. by a one-hot matmul), "
     "or use an atomic scatter-add that applies repeats (Beta 1 nl.atomic_rmw)"},
    {"NSIM-W509", "start-partition",
     "start a view of more than 64 partitions at partition 0, of 33 to 64 at 0 or 64, of 32 or fewer at a multiple of "
     "32 (slice the tile at such a start, or move the rows to partition 0 with a DMA first)"},
}};

/// One report of the sanitizer.
struct CheckReport {
  CheckKind kind = CheckKind::kUninitializedRead;
  uint64_t instruction = 0;  ///< program-order index of the instruction
  int slot = -1;             ///< operand slot of the instruction it concerns (-1: none)
  std::string op;            ///< the instruction's mnemonic
  std::string detail;        ///< what was found (element range, values)
  std::string tensor;        ///< the tensor (tile) of that slot, when the caller knows it
  SourceLoc loc;
  uint32_t loc_id = 0;       ///< the instruction's source id (Instr::loc): which op of the kernel it came from
  uint64_t count = 1;        ///< occurrences of this check in the run (the first one is described)

  const CheckInfo& info() const { return kChecks[static_cast<size_t>(kind)]; }
  /// "NSIM-W501 uninitialized-read: tensor_tensor reads ... [at file:line (fn)]. Fix: ..."
  std::string str() const;
};

/// Which tile allocation each on-chip operand of an instruction is (by slot): the shadow remembers,
/// per byte, the allocation that wrote it, so a tile that reuses a dead tile's storage (liveness
/// allocation, rotating buffers) reads as never written until it writes it itself. A tag is a hash of
/// (tensor, execution of its alloc) into [1, kTagAny); 0 = unknown (HBM, a manual placement, an
/// instruction whose slots the caller cannot map): such an operand only needs bytes something wrote.
using SlotTags = std::array<uint8_t, isa::kMaxSlots>;
inline constexpr uint8_t kTagAny = 127;  ///< shadow byte written through an operand of unknown tag
/// Shadow bit over a tag (or kTagAny): the byte was written by that allocation, but computed from
/// never-written data (a per-partition instruction read garbage there: the taint it carries on).
inline constexpr uint8_t kTainted = 0x80;
/// Tag of allocation `instance` of tile `tensor` (in [1, kTagAny): never 0, kTagAny or with kTainted set).
/// Two allocations sharing storage get the same tag with probability 1/126: a stale read then goes
/// unreported, never the reverse.
inline uint8_t slot_tag(int tensor, int64_t instance) {
  uint64_t h = (static_cast<uint64_t>(static_cast<uint32_t>(tensor)) << 40) ^ static_cast<uint64_t>(instance);
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdULL;  // a 64-bit finaliser (MurmurHash3's)
  h ^= h >> 33;
  return static_cast<uint8_t>(1 + h % (kTagAny - 1));
}

class Checker {
 public:
  /// `generation`: the NeuronCore generation (a gen2 TensorE transpose is a matmul: its NaN spread, below).
  Checker(const memory::MemoryConfig& m, int generation);
  /// Clears the shadow bytes it wrote (columns [dirty_lo, dirty_hi) of every partition) and hands the
  /// shadows back zero, so the next Checker takes them without clearing 24 MiB.
  ~Checker();
  Checker(const Checker&) = delete;
  Checker& operator=(const Checker&) = delete;
  /// Before `in` executes over `views`: reads of never-written on-chip bytes (by `tags`, when given:
  /// bytes this allocation has not written). `index`: its program-order index.
  void before(const isa::Instr& in, const isa::Views& views, uint64_t index, const SourceLoc& where,
              const SlotTags* tags = nullptr);
  /// Whether after(in) reads the values `in` wrote (else it only marks the bytes written, and an
  /// asynchronous product need not be complete first). False for a multiply_moving accumulating into an
  /// fp32 PSUM tile: its destination is also its input, so a NaN there was never produced from finite
  /// inputs by it (the NaN check below could not report it), and no narrowing cast can happen.
  static bool reads_results(const isa::Instr& in) {
    return !(in.op == isa::Opcode::kMultiplyMoving && (in.flags & isa::kAccumulate) && in.slot(0).dtype == DType::kFloat32);
  }
  /// After it executed: marks its written on-chip bytes and looks for the first NaN/Inf produced.
  void after(const isa::Instr& in, const isa::Views& views, uint64_t index, const SourceLoc& where,
             const SlotTags* tags = nullptr);
  /// Reports so far, first of each kind, in the order found.
  const std::vector<CheckReport>& reports() const { return reports_; }
  std::vector<CheckReport>& reports() { return reports_; }
  /// Index into reports() of the reports the last before()/after() added, from this position.
  size_t size() const { return reports_.size(); }

 private:
  /// An instruction that reads its engine's accumulator registers (reduce_cmd reduce, or idle with a reduce_res)
  /// where no instruction reset or loaded them yet reads what an earlier kernel left: what it writes from them
  /// (reduce_res; a scan's dst) is tainted (reg_taint_slot_), reported where the garbage is used (W501).
  void check_registers(const isa::Instr& in, const SourceLoc& where);
  /// NSIM-W507: an activation's function input outside the function's valid range (isa::act_valid_range).
  void check_activation_range(const isa::Instr& in, const isa::Views& views, uint64_t index, const SourceLoc& where);
  /// NSIM-W508: a scatter-add promised unique indices (isa::kUniqueIdx) whose index tile repeats a row.
  void check_unique_indices(const isa::Instr& in, const isa::Views& views, uint64_t index, const SourceLoc& where);
  /// NSIM-W509: a compute instruction's on-chip operand whose first partition the hardware does not allow for its
  /// partition count (nki-api.md 2.0: n > 64 at 0; 32 < n <= 64 at 0 or 64; n <= 32 at 0, 32, 64 or 96).
  void check_start_partition(const isa::Instr& in, uint64_t index, const SourceLoc& where);
  /// Registers set (reset or loaded) so far, ScalarE's and VectorE's, by partition.
  std::array<std::array<bool, 128>, 2> regs_set_{};
  int reg_taint_slot_ = -1;  ///< before() -> after(): the slot written from never-set registers (-1: none)
  memory::Buffer& shadow(isa::Space s) { return s == isa::Space::kPsum ? psum_ : sbuf_; }
  int64_t pitch(isa::Space s) const { return s == isa::Space::kPsum ? psum_pitch_ : sbuf_pitch_; }
  void report(CheckKind k, const isa::Instr& in, int slot, uint64_t index, const SourceLoc& where, std::string detail);
  void verified_drop_all(const isa::Operand& o);

  /// One byte per byte of storage (pooled): 0 = never written, else its writer's tag (or kTagAny), with
  /// kTainted set when the value was computed from never-written data.
  memory::Buffer sbuf_, psum_;
  /// Taint (the slow path only: an instruction read bad bytes). taint_seen_: some byte has been written
  /// tainted (until then a read with no tag needs only nonzero shadow bytes: the memchr fast path).
  /// before() collects the elements of the instruction's output that after() writes tainted
  /// (taint_pending_): taint_mask_[p * taint_elems_ + el] != 0 for element el (row-major over the free dims)
  /// of partition p (relative to the output, slot 0, of taint_parts_ partitions x taint_elems_ elements);
  /// taint_all_: every element of every written operand. A written operand of taint_parts_ partitions but
  /// another element count (a reduction's result) gets whole partitions: taint_rows_ (any element of the row).
  bool taint_seen_ = false, taint_pending_ = false, taint_all_ = false;
  /// Where tainted data began: the instruction that first read the never-written bytes it came from (by the
  /// tag of the tainted bytes; the report of a tainted read names it).
  struct Origin {
    bool set = false;
    std::string op, slot;
    SourceLoc loc;
  };
  Origin reg_origin_;  ///< where the never-set registers were first read (with reg_taint_slot_)
  std::array<Origin, 2> reg_first_{};  ///< by register bank: the first read of its never-set registers
  std::array<Origin, kTagAny + 1> origin_{};
  Origin pending_origin_;  ///< before() -> after(): the origin of what this instruction taints
  uint32_t taint_parts_ = 0;
  int64_t taint_elems_ = 0;
  /// Scratch, reused (the slow path only): bad_mask_ the bad elements of the operand being scanned (its
  /// partitions x elements), cols_ the output columns a matmul's moving taints, sel_ a transpose's selection.
  std::vector<uint8_t> taint_mask_, taint_rows_, bad_mask_, cols_;
  std::vector<uint8_t> pred_sel_;  ///< a predicated copy's selected src elements (before())
  std::vector<float> pred_row_;    ///< (its predicate row)
  std::vector<int64_t> sel_;
  /// The loaded stationary's bad elements (load_stationary -> the multiply_moving after it): st_mask_ over
  /// its st_parts_ x st_elems_ elements when st_bad_; st_all_: all bad (a bad stationary_scale); st_origin_
  /// where their garbage began.
  bool st_bad_ = false, st_all_ = false;
  uint32_t st_parts_ = 0;
  int64_t st_elems_ = 0;
  std::vector<uint8_t> st_mask_;
  Origin st_origin_;
  /// Starts the pending taint of this instruction's output (slot 0's shape), once.
  void begin_taint(const isa::Instr& in);
  /// Taints output elements of a matmul (multiply_moving) from the loaded stationary's bad elements.
  void taint_from_stationary(const isa::Instr& in, const isa::Views& views);
  int64_t sbuf_pitch_ = 0, psum_pitch_ = 0;
  int generation_ = 0;
  /// Byte columns (offsets within a partition) after() may have written, per space: [lo, hi).
  int64_t sbuf_lo_ = INT64_MAX, sbuf_hi_ = 0, psum_lo_ = INT64_MAX, psum_hi_ = 0;
  std::vector<float> row_;           ///< scratch row (fp32) of the NaN scan
  bool stationary_finite_ = true;    ///< the last load_stationary loaded finite values
  uint64_t casts_before_ = 0;        ///< cast_overflows() when the instruction started
  std::array<int64_t, static_cast<size_t>(CheckKind::kCount)> first_{};  ///< index+1 in reports_, 0 = none yet
  std::vector<CheckReport> reports_;
  /// Regions known wholly written, so that a read of bytes inside one skips the scan of its shadow:
  /// partitions [p0, p1) x byte columns [lo, hi) of `space` whose every shadow byte is `key` or kTagAny
  /// (key 0: nonzero), none tainted. Added by a read that found its bytes good and by an untainted write
  /// (its tag); after() drops those a write of another tag overlaps (writes never write 0, so a key-0
  /// region stays good), and every one a tainted write overlaps. The most recent regions, replaced in turn.
  struct Verified {
    isa::Space space = isa::Space::kNone;
    uint8_t key = 0;
    bool exact = false;  ///< every shadow byte is `key` (added by a write of that tag; a kTagAny write clears it)
    int64_t p0 = 0, p1 = 0, lo = 0, hi = 0;
  };
  static constexpr size_t kVerified = 64;
  std::array<Verified, kVerified> verified_{};
  size_t verified_next_ = 0;
  bool verified_hit(const isa::Operand& o, uint8_t key) const;
  /// Every shadow byte of o's extent already holds `key` (a region an earlier write of that tag made exact):
  /// writing it again changes nothing (an accumulating matmul's PSUM tile, a tile rewritten in a loop).
  bool verified_exact(const isa::Operand& o, uint8_t key) const;
  void verified_add(const isa::Operand& o, uint8_t key, bool exact = false);
  void verified_drop(const isa::Operand& o, uint8_t key);
};

}  // namespace nsim::engines
