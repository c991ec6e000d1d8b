#pragma once
/// Verification and lowering of a frontend::Kernel onto a Simulator.
///
/// Lowering walks the statement tree with an explicit stack, one instruction at a time (a
/// generator: kernels of millions of instructions never sit in memory). Tiles get SBUF/PSUM
/// addresses when lowering starts, by liveness (frontend/compiler/allocate.h: tiles with disjoint
/// lifetimes share storage) within one region per space taken from the Simulator's allocator; a tile
/// allocated inside a loop gets `bufs` rotating copies (automatic: 2 inside loops, 1 outside, fewer
/// if capacity is short), so the DMA of iteration i+1 can overlap the compute of iteration i while
/// reuse of a buffer creates the write-after-read dependency it would on hardware. nc_matmul becomes load_stationary +
/// multiply_moving. DMA transfers are split into descriptors by the DMA model (memory/dma.h).
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "engines/simulator.h"
#include "frontend/ir.h"

namespace nsim::frontend {

/// Check the kernel before anything runs, for every loop iteration (affine index ranges are checked
/// with interval arithmetic, so this is exact and does not enumerate iterations): names, shapes and
/// dtypes per operand, buffer legality per slot, partitions <= limit, matmul and PSUM limits of the
/// generation, SBUF/PSUM capacity of the tiles (with their rotating buffers), index ranges in bounds,
/// outputs written, affine_range iterations writing one location. Throws nsim::Error with the op,
/// operand, expected vs found and the op's source line.
/// `plan`: where to keep the tile allocation the check works out, for a Lowering of the same kernel on a
/// simulator with these parameters and nothing allocated yet (it then need not work it out again).
struct AllocationPlan;
void verify_kernel(const Kernel& k, const engines::CoreParams& p, AllocationPlan* plan = nullptr);

/// Where a tile was placed.
struct TilePlacement {
  int tensor = -1;
  int64_t offset = 0;     ///< byte offset of buffer 0 within each partition
  int64_t stride = 0;     ///< bytes between rotating buffers
  int bufs = 1;
};

/// Lowers a verified kernel onto `sim` (which must have the kernel's HBM tensors allocated under
/// their names, or lets Lowering allocate them: see allocate_hbm).
class Lowering {
 public:
  /// `plan`: the allocation verify_kernel() worked out for `k` on these parameters (nullptr: work it out);
  /// used only while nothing is allocated on chip (it assumed the whole memory).
  Lowering(const Kernel& k, Simulator& sim, const AllocationPlan* plan = nullptr);
  /// The placement to use instead of the allocator's `plan` (nullopt: the allocator's), chosen by timing
  /// (compiler.placement_search): when plan.psum_depth_candidate, the plan with one buffer per PSUM loop tile
  /// (allocated within `sbuf_avail` / `psum_avail`, as `plan` was), then each of the better one's psum_swaps; each
  /// simulated timing-only, the fastest kept when it beats the one before by more than 0.1 %.
  static std::optional<AllocationPlan> choose_placement(const Kernel& k, const Simulator& sim,
                                                        const AllocationPlan& plan, int64_t sbuf_avail,
                                                        int64_t psum_avail);
  /// Allocate every HBM tensor of the kernel in `sim` (inputs and outputs), if not already there.
  static void allocate_hbm(const Kernel& k, Simulator& sim);

  /// Produce the next instruction; false when the kernel is done.
  bool next(isa::Instr& out);
  /// Lower and submit every instruction to the simulator.
  void run();

  const std::vector<TilePlacement>& placements() const { return placements_; }
  /// Allocation warnings (manual address= placements overlapping while live), also printed to stderr.
  const std::vector<std::string>& warnings() const { return warnings_; }
  /// Called every 65,536 instructions lowered with the count so far and the simulated time reached
  /// (the CLI's progress line); none = no cost. Instructions fast-forward skipped count: the first
  /// call after a skip comes with the count reached, past the multiples of 65,536 it jumped over.
  using Progress = std::function<void(uint64_t instructions, sim::Ps simulated)>;
  void set_progress(Progress fn) {
    progress_ = std::move(fn);
    progress_at_ = progress_ ? (emitted_ | kProgressMask) : ~uint64_t{0};
  }
  /// Fast-forward skips a multiple of `iterations` iterations (with the periods it measures and the
  /// rotating-buffer depths) over which the list scheduler admitted a multiple of `admissions` window
  /// entries (`*admitted`: its count of them; an nc_matmul's load_stationary + multiply_moving is one): state
  /// of the list scheduler that cycles with the count of reads of a chunk or of entries admitted
  /// (frontend/compiler/scheduler.cpp) keeps its phase.
  void set_fast_forward_align(int iterations, int admissions, const uint64_t* admitted) {
    ff_align_ = std::max(1, iterations);
    ff_admit_align_ = std::max(1, admissions);
    ff_admitted_ = admitted;
  }
  /// The list scheduler's HBM conflict chunks, for fast-forward over a loop whose consecutive iterations touch one
  /// chunk at different bytes (rows smaller than a chunk; fast_forward_at): a skip moves the chunk states the last
  /// iterations left to where the iterations after the skip find them in the full run.
  struct HbmChunks {
    /// The chunk of HBM byte `addr` (an index over every tracked tensor) and log2 of its size in bytes, or
    /// {-1, 0} where the scheduler tracks nothing (a tensor nothing writes).
    std::function<std::pair<int64_t, int>(int64_t)> chunk_of;
    /// Whether chunk `to` of each (from, to) can take a copy of chunk `from`'s state: in from's tensor, no live
    /// access in it, one `from` per `to`; with `apply`, make the copies (of the states before any copy).
    std::function<bool(const std::vector<std::pair<int64_t, int64_t>>& moves, bool apply)> move;
  };
  void set_fast_forward_hbm_chunks(HbmChunks c) { ff_hbm_ = std::move(c); }
  /// The list scheduler's on-chip conflict state, for fast-forward's step digest: a hash of the chunk states the
  /// last iteration's accesses left (their readers' and writer's ages in admissions, or "issued"), which decide
  /// the ordering edges later accesses get. The reader lists of a tile the loop reads and never writes (a weight)
  /// carry their phase across iterations: a skip must keep it as the full run has it.
  void set_fast_forward_schedule_digest(std::function<uint64_t()> d) { ff_sched_digest_ = std::move(d); }
  /// A loop is being followed for fast-forward (the scheduler then notes the chunks accessed for its digest).
  bool fast_forward_following() const { return ff_.depth != 0; }
  /// Index (into Kernel::ops) of the op the last instruction from next() belongs to.
  int last_op() const { return last_op_; }
  /// The byte extents of the last instruction from next(), by slot (isa::slot_extent of each present
  /// operand; absent slots hold nothing): worked out from the op's operand forms, so the compiler's
  /// conflict tracking and the dependency regions (Simulator::operands_ready_multi) need not recompute them.
  using Extents = std::array<std::pair<int64_t, int64_t>, isa::kMaxSlots>;
  const Extents& last_extents() const { return *last_ext_; }
  /// Index (into Kernel::ops) of the op whose instructions carry source id `loc` (Instr::loc); -1 if none.
  int op_of_source(uint32_t loc) const;
  /// "dst=ct data1=at data2=bt": the tensors of op `op` by slot, in the kernel's names.
  std::string operand_names(int op) const;

  // ---- occupancy (a trace counter track of SBUF/PSUM bytes per partition held by live tiles)
  /// An on-chip tile an instruction touches: tensor id and which allocation of it (its alloc
  /// statement's execution count), taken when the instruction is lowered.
  struct TileUse {
    int tensor = -1;
    int64_t instance = 0;
    int64_t offset = 0;  ///< byte offset of the buffer in use (tiles may share storage)
  };
  using TileUses = std::array<TileUse, isa::kMaxSlots>;
  /// True when the simulator writes a trace: only then are tile uses recorded.
  bool recording_occupancy() const { return record_; }
  /// True when tile uses are needed: for the occupancy track, or for the sanitizer's allocation tags.
  bool recording_uses() const { return record_ || sim_.checking(); }
  /// The sanitizer's allocation tags (engines::SlotTags) of instruction `in` of op `op`, whose tile uses
  /// were `u`: slots of the op mapped onto the instruction's (nc_matmul: load_stationary gets the
  /// stationary, multiply_moving dst and moving); tag 0 for HBM, manually placed tiles and slots it
  /// cannot map.
  void slot_tags(int op, const TileUses& u, const isa::Instr& in, engines::SlotTags& out) const;
  /// The tiles op `op`'s instruction touches, at this point of the lowering.
  void tile_uses(int op, TileUses& out) const;
  /// They were used over [start, end): a tile holds its storage from its first use to its last.
  void note_tile_uses(const TileUses& u, sim::Ps start, sim::Ps end);
  /// Write the counter tracks "sbuf bytes/partition in use" and "psum bytes/partition in use".
  void write_occupancy();
  uint64_t instructions() const { return emitted_; }

  // ---- Building blocks shared with verify_kernel(), which must agree exactly with the lowering on
  //      buffer depths, placements and operands (it checks the instructions of the first iteration).

  /// Marker returned by opcode_of() for the MACRO row isa::Macro::kNcMatmul ("nc_matmul");
  /// opcode_of() returns kUnknownOp for names of neither table.
  static constexpr int kNcMatmul = -1;
  static constexpr int kUnknownOp = -2;
  /// Opcode (as int) of an op name, kNcMatmul or kUnknownOp.
  static int opcode_of(const std::string& name);
  /// The table row (isa/opcodes.def OP or MACRO) of an opcode_of() result other than kUnknownOp.
  static const isa::OpInfo& info_of(int opc) {
    return opc == kNcMatmul ? isa::macro_info(isa::Macro::kNcMatmul) : isa::op_info(static_cast<isa::Opcode>(opc));
  }

  /// Buffer depth and placement of every tile (by tensor id; tensor -1 for tensors without an alloc
  /// statement). Depth: Tensor::bufs if > 0, else 2 when the alloc sits inside a loop with a trip
  /// count > 1, 1 otherwise; when the tiles do not fit, automatic depths fall back to 1 (largest
  /// tiles live at the peak first) before E204/E206 is thrown naming the tiles live at the point of
  /// peak use. Buffer strides are rounded to the dependency-chunk alignment (SBUF) or to whole 2 KiB
  /// PSUM banks (PSUM), so that rotating buffers never share a dependency chunk and a bank-sized PSUM
  /// tile never straddles two banks.
  /// Offsets (from 0) come from the liveness allocator, allocate_tiles() (frontend/compiler/allocate.h),
  /// or with `compiler.allocation: static` follow one another in tensor-id order. `sbuf_avail` /
  /// `psum_avail`: bytes per partition available (-1 = the whole memory).
  static std::vector<TilePlacement> plan_tiles(const Kernel& k, const engines::CoreParams& p,
                                               int64_t sbuf_avail = -1, int64_t psum_avail = -1);

  /// The operand of access `a` to tensor `t` for loop-variable values `vars`. `base`: the tensor's
  /// byte address (HBM) or the byte offset of the tile buffer in use (on-chip). Size-1 dims are
  /// dropped and contiguous dims merged unless `keep_dims`; E310 with more than 4 free dims left.
  /// A dma_transpose's HBM side given as one row (integer indices before its 2-D part): its first free dim
  /// becomes the rows. When its 2-D part was merged into one free dim (contiguous rows), `cols` (> 0: the other
  /// side's partitions) splits it. The 3-D / 4-D forms (`middle` = iimm[0] > 1, the middle elements) split rows of
  /// `middle` x `cols` elements, and only then (a leading dim of one, [1, m, c], stays one row).
  static void transposed_hbm_rows(isa::Operand& o, int64_t cols, int64_t middle);
  /// The columns of the side `a` of the dma_transpose op `oi` (the other side's partitions; 0: unknown).
  int64_t transpose_cols(size_t oi, const Access& a) const;
  static isa::Operand access_operand(const Tensor& t, const Access& a, const std::vector<int64_t>& vars,
                                     int64_t base, bool keep_dims = false);

  /// The instruction(s) of op `op` (opcode from opcode_of) over operands `opnd` (by slot): one, or
  /// two for nc_matmul (load_stationary, multiply_moving). `buf`: rotating-buffer index of the
  /// on-chip side of a DMA, for the automatic queue. Returns the number of instructions.
  static int assemble(const Op& op, int opcode, const std::array<isa::Operand, isa::kMaxSlots>& opnd, int buf,
                      isa::Instr out[2]);
  /// The iimm entries op `op` gives as index expressions (Op::iimm_expr), for loop variable values `vars`,
  /// into `out` (an int32 each, else E312 BadArgument).
  static void apply_iimm(const Op& op, const std::vector<int64_t>& vars, isa::Instr& out) {
    if (!op.iimm_expr.empty()) apply_iimm_exprs(op, vars, out);
  }
  static void apply_iimm_exprs(const Op& op, const std::vector<int64_t>& vars, isa::Instr& out);

 private:
  struct Frame {
    const std::vector<Stmt>* body;
    size_t pc;
    int loop;             ///< loop id whose body this is, -1 at top level
    bool ff_done = false; ///< fast-forward: this loop instance is not followed (again)
  };
  /// SimOptions::fast_forward, at the start of each iteration of a loop (after the first): follow one
  /// loop instance; once its iterations repeat, count the middle ones as repeats and jump over them.
  void fast_forward_at(const Loop& l, int64_t& v);
  void fast_forward_start(const Loop& l);
  /// The most repeats of a span (`instrs` instructions, `dt` of time), at most `k`, that keep the run within its
  /// limits.
  int64_t ff_limit_repeats(int64_t k, uint64_t instrs, sim::Ps dt) const;
  bool lower_op(const Op& op, isa::Instr& out);
  /// Name the tensors of the sanitizer's reports (by the op each instruction came from).
  void name_check_reports();
  /// access_operand() of slot `slot` of op `oi` for the current loop variables: the first call works out the
  /// operand's shape and its byte offset and start partition as affine forms of the loop variables; the
  /// later ones evaluate the two forms alone (the shape does not depend on the variables).
  /// It is written into `out`, its byte extent (isa::Operand::byte_extent) into `ext`.
  struct OperandForm;
  void operand_into(size_t oi, OperandForm& f, const Access& a, isa::Operand& out, std::pair<int64_t, int64_t>& ext,
                    bool keep_dims = false);
  /// HBM address, or byte offset of the tile buffer in use.
  int64_t base_of(int tensor) const { return base_[static_cast<size_t>(tensor)]; }
  /// Rotating-buffer index in use (0 for HBM tensors).
  int buffer_of(int tensor) const { return buf_[static_cast<size_t>(tensor)]; }
  /// Work out buf_ and base_ of tensor t from its alloc count (at its allocs: not a division per operand).
  void rotate(size_t t);
  /// Whether the body of loop `loop` holds an op at any depth (not counting loops of no iterations). One that holds
  /// none lowers no instruction in any iteration: next() does not iterate it (skip_loop).
  bool loop_has_ops(int loop);
  /// Every iteration of loop `loop` (a body without ops) at once: its tiles' allocations counted, as iterating
  /// it would count them (a loop of 2^40 empty iterations took hours).
  void skip_loop(int loop);
  /// alloc_count_ += times for each allocation in loop `loop`'s body (nested loops by their trip counts); the
  /// tensors changed are added to `touched`. False when a count would leave int64.
  bool count_allocs(int loop, int64_t times, std::vector<size_t>& touched);
  std::vector<int8_t> loop_ops_;  ///< by loop id: -1 not worked out yet, else loop_has_ops()

  const Kernel& k_;
  Simulator& sim_;
  std::vector<TilePlacement> placements_;  ///< by tensor id (tensor -1 for non-tiles)
  std::vector<int64_t> alloc_count_;       ///< per tensor: executions of its alloc (buffer rotation)
  std::vector<int> buf_;                   ///< per tensor: (alloc_count_ - 1) mod its buffers (0 for HBM)
  std::vector<int64_t> base_;              ///< per tensor: its HBM address, or its buffer in use's offset
  std::vector<int64_t> vars_;              ///< loop variable values by loop id
  std::vector<uint32_t> op_loc_;           ///< source-location id per op
  std::vector<Frame> stack_;
  std::vector<int> opcode_;                ///< per op: opcode_of(name)
  /// An instruction's fields before its operands (isa::Instr up to `opnd`) and its source location: what an
  /// op's instruction holds but its operands (~110 bytes, not a ~600-byte Instr: a kernel with its loops
  /// unrolled has hundreds of thousands of ops).
  struct Head {
    std::array<unsigned char, offsetof(isa::Instr, opnd)> bytes;
    uint32_t loc = 0;
    void set(const isa::Instr& in) {
      std::memcpy(bytes.data(), &in, bytes.size());
      loc = in.loc;
    }
    /// `out` with these fields, its operands untouched.
    void into(isa::Instr& out) const {
      std::memcpy(static_cast<void*>(&out), bytes.data(), bytes.size());
      out.loc = loc;
    }
  };
  std::vector<Head> tmpl_;                 ///< per op: its instruction(s) without operands (2 per op)
  struct OperandForm {
    bool ready = false;
    bool keep = false;
    bool exact = true;   ///< the forms' coefficients fit int64 (else access_operand every time)
    isa::Operand shape;  ///< the operand at offset 0 and start partition 0
    std::pair<int64_t, int64_t> extent;  ///< shape.byte_extent(): the operand's extent from its offset
    Affine offset;       ///< bytes from the tensor's base
    Affine partition;    ///< on chip: the start partition
  };
  std::vector<OperandForm> forms_;         ///< per op, one per operand it has (in slot order): operand_into()
  std::vector<uint32_t> form_base_;        ///< per op: the index in forms_ of its first operand's form
  std::vector<int8_t> queue_base_;         ///< per op: automatic DMA queue base (0 loads, 4 stores), -1 fixed
  std::vector<int64_t> hbm_addr_;          ///< per tensor: byte address of HBM tensors
  isa::Instr pending_{};                   ///< second half of an nc_matmul
  Extents ext_{}, pending_ext_{};          ///< last_extents() of the instruction lowered last, of pending_
  const Extents* last_ext_ = &ext_;
  bool has_pending_ = false;
  uint64_t emitted_ = 0;
  uint64_t idle_since_ = 0;       ///< emitted_ when the current run of loop iterations without instructions began
  uint64_t idle_iterations_ = 0;  ///< loop iterations since then (bounded by SimOptions::max_instructions)
  int last_op_ = -1;
  bool record_ = false;
  Progress progress_;
  static constexpr uint64_t kProgressMask = 0xFFFF;  ///< progress every kProgressMask + 1 instructions
  uint64_t progress_at_ = ~uint64_t{0};              ///< emitted_ at the next progress call (none: never)
  std::vector<std::string> warnings_;
  struct LiveRange {
    sim::Ps first = -1, last = -1;  ///< first start, last end (-1: the instance was not seen)
    int64_t offset = 0;             ///< its storage
  };
  /// A tensor's instances seen by note_tile_uses, from instance `first` on (consecutive: a tile's instances
  /// are used about in turn), by tensor: indexed, not hashed (a lookup per operand of every traced instruction).
  struct LiveRanges {
    int64_t first = 0;
    std::vector<LiveRange> r;  ///< instance first + i
  };
  std::vector<LiveRanges> live_;

  int ff_align_ = 1, ff_admit_align_ = 1;  ///< set_fast_forward_align
  const uint64_t* ff_admitted_ = nullptr;
  HbmChunks ff_hbm_;  ///< set_fast_forward_hbm_chunks
  std::function<uint64_t()> ff_sched_digest_;  ///< set_fast_forward_schedule_digest
  /// Note the HBM accesses of an instruction lowered while a loop is followed (FastForward::hbm).
  void ff_note_hbm(const isa::Instr& in, const Extents& ext);
  /// Fast-forward state (docs/timing-model.md, "Fast-forward"): the loop instance followed.
  struct FastForward {
    static constexpr int kMaxPeriod = 8;         ///< longest short period of the steps looked for (iterations)
    /// Longest long period looked for (iterations): lcm(q, cycle) for q <= kMaxPeriod, where `cycle` is the
    /// fewest iterations a skip may span (rotating buffers, the scheduler's refreshes, the unions' folds).
    static constexpr int64_t kMaxLongPeriod = 16384;
    static constexpr int64_t kMinLoop = 64;      ///< loop instances with fewer iterations left are not followed
    static constexpr int64_t kWindowTurns = 2;   ///< `need`: repeating steps over this many scheduler windows,
    static constexpr int64_t kMinNeed = 16;      ///< and at least this many iterations
    static constexpr int64_t kGiveUp = 8;        ///< not periodic within kGiveUp x need iterations: stop
    static constexpr int64_t kMaxAlign = 64;     ///< iteration alignment beyond this: not followed
    static constexpr size_t kMaxHbmTouches = 256;  ///< HBM accesses per iteration compared (more: not skipped)
    static constexpr int64_t kHbmHistory = 72;     ///< iterations whose HBM accesses are kept (> kMaxAlign + 1)
    int on = -1;            ///< -1: not decided yet (at the first boundary), 0 no, 1 yes
    size_t depth = 0;       ///< stack depth of the loop instance followed (0: none)
    int64_t iters = 0;      ///< boundaries of it seen since following began
    int64_t align = 1;      ///< iterations skipped are a multiple of this (rotating buffers)
    std::vector<std::pair<size_t, int64_t>> allocs;  ///< tensor, alloc executions per iteration
    /// The body reads and writes an HBM tensor through different accesses (fast_forward_start): not followed.
    bool traced = false;  ///< a skip waited for the trace to close (Simulator::trace_closed)
    bool distance_dep = false;
    /// The HBM accesses of an iteration in the list scheduler's chunks: (first chunk, last chunk, bytes lo, bytes
    /// hi, log2 of the chunk size). Consecutive iterations touching one chunk at different bytes (rows smaller
    /// than a chunk, a store to y[b] after y[b - 1]) leave state in that chunk that the iterations after a skip
    /// must find (its readers and writers order later accesses; found empty, the heights and the ties after the
    /// skip went otherwise). Such a loop is skipped only where every access moves by a constant stride (`steady`)
    /// and the skip moves those states along (ff_hbm_moves).
    struct HbmTouch {
      int64_t c0, c1, lo, hi;
      int shift;
    };
    std::vector<HbmTouch> hbm_cur;                ///< the iteration being lowered
    std::vector<std::vector<HbmTouch>> hbm_hist;  ///< the last kHbmHistory iterations', by iters % kHbmHistory
    std::vector<int64_t> hbm_stride;              ///< per access: the bytes it moves per iteration
    bool hbm_shared = false;                      ///< consecutive iterations touched one chunk at different bytes
    bool hbm_dep_shared = false;                  ///< ... one chunk of the simulator's dependency tracker
    /// Every access moves by a constant stride >= 0 (a moving one past its previous bytes), and no two iterations
    /// share a chunk of the simulator's HBM dependency tracker where they share a scheduler chunk; hbm_align
    /// iterations move each access by whole scheduler chunks.
    bool hbm_steady = true;
    int64_t hbm_align = 1;
    /// What one iteration did: instructions lowered and issued, time added, and the timing state after.
    struct Step {
      uint64_t emitted = 0, committed = 0, admitted = 0;
      sim::Ps time = 0;
      uint64_t digest = 0;
      bool operator==(const Step&) const = default;
    };
    Step last;                                 ///< absolute values at the previous boundary
    /// The periods looked for: 1 to kMaxPeriod, then (from the first step) the long ones, ascending.
    std::vector<int64_t> periods;
    std::vector<int64_t> run;                  ///< run[i]: steps in a row equal to the step periods[i] before
    std::vector<Step> ring;                    ///< the last steps, by iters % ring.size() (>= the longest period)
    int64_t period = 0;                        ///< 0: not periodic yet; else sample a is taken
    size_t period_at = 0;                      ///< its index in `periods`
    int64_t at_a = 0;
    Step abs_a;
    /// The counters at samples a and b, made when a loop is first followed (a sample is a copy of the
    /// run's counters, whose interval unions reserve ~160 KB: runs without fast-forward do not pay it).
    std::unique_ptr<std::array<engines::RunStats::Sample, 2>> samples;
  } ff_;
  /// At the first step of a loop instance followed, `left` iterations left: add the long periods to look for
  /// (FastForward::periods).
  void ff_long_periods(const FastForward::Step& step, int64_t left);
  /// At the end of an iteration: its HBM accesses against the previous iteration's (FastForward::hbm_shared,
  /// hbm_steady, hbm_stride, hbm_align); they join the history.
  void ff_hbm_step();
  /// The chunk-state moves of a skip of `skip` iterations (FastForward::HbmTouch), or false where they would not
  /// give the full run's states (a chunk reached by accesses of other strides, a move past its chunk grid).
  bool ff_hbm_moves(int64_t skip, std::vector<std::pair<int64_t, int64_t>>& moves) const;
};

}  // namespace nsim::frontend
