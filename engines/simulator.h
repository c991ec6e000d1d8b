#pragma once
/// nsim::Simulator: the C++ façade over one NeuronCore. Build it from a config, allocate tensors,
/// submit instructions in program order, then read outputs, stats and the trace.
///
/// Timing: every engine is an in-order queue. Instructions are scheduled in program order; an
/// instruction starts when its engine may issue again (previous start + II) and every earlier
/// instruction it depends on (RAW/WAR/WAW on overlapping memory) has finished, plus the semaphore
/// hand-off latency when the producer ran elsewhere. Because each instruction depends only on
/// earlier ones, its start and end are final when it is scheduled (docs/timing-model.md).
#include <array>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engines/deps.h"
#include "engines/dma/dma_engine.h"
#include "engines/params.h"
#include "engines/tensor/tensor_engine.h"
#include "isa/semantics/semantics.h"
#include "memory/memory.h"
#include "sim/config.h"
#include "sim/interval_union.h"
#include "sim/stats.h"
#include "sim/trace.h"

namespace nsim {
namespace engines {
class TraceRecorder;
}

/// Options of one run.
struct SimOptions {
  bool numerics = true;    ///< false = timing-only: no storage, no semantics
  std::string trace_path;  ///< Chrome/Perfetto JSON trace; empty = no tracing (costs nothing)
  /// Also schedule every instruction as soon as its operands allow, with unlimited engines, to give
  /// the dependency bound (critical path length) of the kernel. Costs a second dependency tracker.
  bool dependency_bound = false;
  /// Write at most this many trace slices, the earliest by start time (0 = unlimited); the rest
  /// are counted and reported by an instant event at the end of the trace.
  uint64_t trace_limit = 0;
  /// Write only slices overlapping [trace_window_start_ns, trace_window_end_ns) (kept whole, not
  /// clipped); end 0 = no end. Both 0 = the whole run.
  double trace_window_start_ns = 0, trace_window_end_ns = 0;
};

/// When one instruction ran, and what it waited for.
struct InstrTiming {
  sim::Ps start = 0;
  sim::Ps end = 0;     ///< when dependants may consume its results (before hand-off latency)
  sim::Ps issue = 0;   ///< when its engine may issue the next independent instruction
  uint64_t index = 0;  ///< program-order index of the instruction (0, 1, 2, ...)
  sim::Ps free = 0;    ///< when its engine could have issued it (the previous instruction's issue)
  sim::Ps ready = 0;   ///< when its operands were ready: producers' end + semaphore hand-off
  int64_t waited_for = -1;  ///< index of the producer (or earlier reader, for WAR) that set `ready`; -1: none
  uint8_t waited_class = 0; ///< that producer's class: an engine, or engines::kClassDma
  // DMA only: the queue's setup start and the first packet's start (done = end).
  sim::Ps setup_start = 0, data_start = 0;
  double flops = 0;       ///< floating-point operations (MAC = 2 on TensorE)
  uint8_t perf_mode = 1;  ///< VectorE/ScalarE performance mode (1, 2 or 4)
};

/// Plain counters kept by the hot loop (no strings, no maps).
struct TrackCounters {
  uint64_t instructions = 0;
  sim::Ps busy = 0;         ///< sum of issue intervals (II)
  sim::Ps instr_time = 0;   ///< sum of durations (overlaps counted twice)
  sim::Ps active = 0;       ///< union of [start, end) intervals
  sim::Ps cur_lo = -1, cur_hi = -1;
  sim::Ps last_end = 0;
  double flops = 0;
  uint64_t bytes = 0;
  void add_interval(sim::Ps s, sim::Ps e);
  void close();
};

/// DMA trigger classes (which engine generated the descriptors): Sync = static (dge none),
/// Scalar = hardware DGE, GpSimd = software DGE (the profiler's static_ / hardware_dynamic_ /
/// software_dynamic_ DMA stats).
enum class DmaClass : uint8_t { kStatic, kHardwareDynamic, kSoftwareDynamic };
inline constexpr int kNumDmaClasses = 3;

struct RunCounters {
  std::array<TrackCounters, isa::kNumEngines> engine;
  std::array<TrackCounters, memory::kMaxDmaEngines> dma;
  std::array<uint64_t, isa::kNumOpcodes> opcode_count{};
  std::array<sim::Ps, isa::kNumOpcodes> opcode_time{};
  /// Per (executing engine, opcode): count and summed durations (a DMA counts on its trigger engine).
  std::array<std::array<uint64_t, isa::kNumOpcodes>, isa::kNumEngines> engine_opcode_count{};
  std::array<std::array<sim::Ps, isa::kNumOpcodes>, isa::kNumEngines> engine_opcode_time{};
  uint64_t dma_transfers = 0, dma_descriptors = 0;
  uint64_t hbm_read = 0, hbm_write = 0, sbuf_read = 0, sbuf_write = 0, psum_read = 0, psum_write = 0;
  double matmul_flops = 0, transpose_flops = 0;
  /// bf16-equivalent FLOPs (CoreParams::adjusted_flops of the matmul's input dtypes).
  double adjusted_matmul_flops = 0, adjusted_transpose_flops = 0;
  uint64_t matmul_instructions = 0;  ///< multiply_moving that is not a transpose
  sim::Ps start = INT64_MAX;         ///< earliest instruction start (total_exec_time)
  sim::Ps end = 0;
  /// Unions over time: >= 1 DMA packet moving (all engines; per trigger class), and any engine or
  /// DMA packet active. Folded at the simulator's watermark, closed by finish(). Engine intervals go
  /// to any_active (merged while they overlap); DMA packets (mostly in the future) to dma_active,
  /// which forwards them into any_active as the watermark passes (the Simulator sets this link: do
  /// not copy these two).
  sim::IntervalUnion dma_active, any_active;
  std::array<sim::IntervalUnion, kNumDmaClasses> dma_class_active;
  std::array<bool, 256> dma_queue_used{};  ///< by queue id (modulo dma.queues_per_engine)
  uint64_t dma_queues_used = 0;
};

class Simulator {
 public:
  explicit Simulator(const sim::Config& cfg, SimOptions opts = {});
  /// Load a preset ("trn2") or YAML path with overrides ("tensor.pe_rows=64").
  static std::unique_ptr<Simulator> from_preset(const std::string& preset,
                                                const std::vector<std::string>& overrides = {},
                                                SimOptions opts = {});
  ~Simulator();

  const sim::Config& config() const { return cfg_; }
  const engines::CoreParams& params() const { return p_; }
  memory::Memory& memory() { return mem_; }
  bool numerics() const { return opts_.numerics; }

  // ---- tensors
  const memory::HbmTensor& alloc_hbm(const std::string& name, const std::vector<int64_t>& shape, DType dt);
  void write_hbm(const std::string& name, const void* data, size_t bytes);
  std::vector<uint8_t> read_hbm(const std::string& name) const;
  /// A contiguous tile [partitions, free...] in SBUF or PSUM (E204/E206 when full, E202 over 128).
  isa::Operand alloc_tile(isa::Space space, uint32_t partitions, const std::vector<int64_t>& free_shape, DType dt);
  void free_tile(const isa::Operand& tile);
  /// Peak SBUF / PSUM bytes per partition live at once, as the tile allocator planned them
  /// (frontend/compiler/allocate.h): stats() reports these (the largest set) instead of the
  /// allocator's peak, which counts a kernel's shared region as one block.
  void set_onchip_peak(int64_t sbuf, int64_t psum);

  // ---- instructions
  /// Register a source location; the returned id goes into Instr::loc.
  uint32_t add_source(const SourceLoc& loc);
  const SourceLoc& source(uint32_t id) const { return sources_.at(id < sources_.size() ? id : 0); }
  /// Verify, execute (unless timing-only) and schedule one instruction. Errors carry its source line.
  /// `not_before`: an extra ordering constraint (a with_schedule edge): the instruction starts no
  /// earlier than this, on top of its operands and its engine.
  /// `known_ready`: operands_ready_tag(in, in.engine) computed earlier by the caller (the compiler's
  /// scheduler, which knows nothing it depends on ran since), so it is not looked up twice.
  InstrTiming submit(const isa::Instr& in, sim::Ps not_before = 0,
                     const engines::DepTracker::Ready* known_ready = nullptr);

  // ---- compiler hooks (frontend/compiler): the schedule an instruction would get now, nothing committed
  /// When the operands of `in` are ready for engine `e` (every overlapping earlier access finished,
  /// plus the hand-off latency to `e`).
  sim::Ps operands_ready(const isa::Instr& in, isa::Engine e) const { return operands_ready_tag(in, e).time; }
  /// The same with the tag of the access that sets it (pass to submit() as known_ready).
  engines::DepTracker::Ready operands_ready_tag(const isa::Instr& in, isa::Engine e) const;
  /// operands_ready_tag() for every engine in the bitmask `engines`, in one pass (out by engine).
  void operands_ready_multi(const isa::Instr& in, uint8_t engines,
                            std::array<engines::DepTracker::Ready, engines::kNumClasses>& out) const {
    deps_.ready_multi(engines, regions(in), out);
  }
  /// When engine `e` may issue `in`, ignoring its operands (its previous issue, shared ports).
  sim::Ps engine_free(const isa::Instr& in, isa::Engine e) const;
  /// Time `in` keeps engine `e` busy (its II; for a DMA, the trigger instruction).
  sim::Ps busy_estimate(const isa::Instr& in, isa::Engine e) const;
  /// Start to end of `in` on `e`, for priorities (a DMA: trigger, setup and its data at full rate).
  sim::Ps duration_estimate(const isa::Instr& in, isa::Engine e) const;
  /// Promise that no instruction submitted from now on starts before `t` (the compiler's scheduler
  /// issues in time order): lets the watermark (DMA calendars, active-time unions, the trace's
  /// reorder buffer) advance past engines that sit idle. Never lowered.
  void set_start_floor(sim::Ps t) { start_floor_ = std::max(start_floor_, t); }
  /// When DMA queue `q` may start its next transfer's setup.
  sim::Ps dma_queue_free(int q) const { return dma_.queue_free(q); }
  /// Pull instructions from `next` until it returns false (a generator: nothing is materialised).
  void run(const std::function<bool(isa::Instr&)>& next);
  /// Close the trace and the counters. Safe to call more than once.
  void finish();
  /// Called after each instruction is scheduled (instruction tables, analysis); none = no cost.
  /// During the call of a DMA instruction, last_dma_split() / last_dma_transfer() describe it.
  using InstrListener = std::function<void(const isa::Instr&, const InstrTiming&)>;
  void add_instr_listener(InstrListener fn) { listeners_.push_back(std::move(fn)); }
  const memory::DmaSplit& last_dma_split() const { return last_split_; }
  const engines::DmaEngines::Transfer& last_dma_transfer() const { return last_transfer_; }

  // ---- results
  /// Work attributed to one kernel source location.
  struct LineStats {
    SourceLoc loc;
    uint64_t instructions = 0;
    sim::Ps instr_time = 0;  ///< summed durations of its instructions
  };
  /// Per source line (file, line, function) with at least one instruction, most time first; ops
  /// that share a line are added up.
  std::vector<LineStats> line_stats() const;
  sim::Ps total_time() const { return c_.end; }
  /// Length of the longest dependency chain with unlimited engines (SimOptions::dependency_bound;
  /// -1 when not computed). Each instruction keeps the duration it had in the real schedule.
  sim::Ps dependency_bound() const { return asap_ ? asap_end_ : -1; }
  const SimOptions& options() const { return opts_; }
  /// The trace being written (nullptr without --trace): for callers adding their own tracks.
  sim::TraceSink* trace_sink() { return trace_.get(); }
  const RunCounters& counters() const { return c_; }
  /// Stats with names, units and descriptions (call after finish()).
  sim::StatsRegistry stats() const;
  isa::ArchState& arch_state() { return st_; }

 private:
  InstrTiming schedule(const isa::Instr& in);
  InstrTiming schedule_dma(const isa::Instr& in);
  InstrTiming schedule_tensor(const isa::Instr& in);
  InstrTiming schedule_stream(const isa::Instr& in);
  void account_bytes(const isa::Instr& in);
  /// Engine activity [s, e) for total_active_time (staged, then added to RunCounters::any_active).
  void note_active(sim::Ps s, sim::Ps e);
  /// Fold the active-time unions at watermark w (every kFoldEvery instructions, and in finish()).
  void fold_active(sim::Ps w);
  static constexpr uint64_t kFoldEvery = 8;
  sim::Ps watermark() const;
  engines::DepTracker::Regions regions(const isa::Instr& in, const engines::DepTracker& on) const;
  engines::DepTracker::Regions regions(const isa::Instr& in) const { return regions(in, deps_); }
  /// Dependency-bound schedule of one instruction of class `cls` that took `dur` (SimOptions::dependency_bound).
  void schedule_asap(const isa::Instr& in, uint8_t cls, sim::Ps dur);

  sim::Config cfg_;
  engines::CoreParams p_;
  SimOptions opts_;
  isa::Limits limits_;
  memory::Memory mem_;
  engines::DepTracker deps_;
  engines::TensorPipes tensor_;
  engines::DmaEngines dma_;
  isa::ArchState st_;
  std::array<sim::Ps, isa::kNumEngines> next_issue_{};
  sim::Ps excl_sbuf_free_ = 0, excl_psum_free_ = 0;
  int scalar_table_set_ = -1;
  DType stationary_dtype_ = DType::kBFloat16;
  int64_t stationary_m_ = 0;
  RunCounters c_;
  sim::Ps stage_lo_ = 0, stage_hi_ = -1;  ///< staged engine activity, not yet in c_.any_active (empty: hi < 0)
  std::vector<SourceLoc> sources_;
  std::vector<std::pair<uint64_t, sim::Ps>> per_loc_;  ///< (instructions, time) by source id
  std::unique_ptr<sim::TraceSink> trace_;
  std::unique_ptr<engines::TraceRecorder> recorder_;  ///< formats the trace: a listener of the schedule
  bool finished_ = false;
  std::vector<InstrListener> listeners_;
  uint64_t seq_ = 0;  ///< program-order index of the next instruction
  std::array<int64_t, 2> onchip_peak_{-1, -1};  ///< set_onchip_peak (SBUF, PSUM); -1 = not set
  std::unique_ptr<engines::DepTracker> asap_;
  sim::Ps start_floor_ = 0;  ///< set_start_floor()
  sim::Ps not_before_ = 0;  ///< submit()'s extra constraint for the instruction being scheduled
  const engines::DepTracker::Ready* known_ready_ = nullptr;  ///< submit()'s known_ready, during schedule()
  sim::Ps asap_end_ = 0;
  memory::DmaSplit last_split_{};
  engines::DmaEngines::Transfer last_transfer_{};
};

}  // namespace nsim
