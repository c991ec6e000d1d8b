#pragma once
/// What a run counts, kept by a listener of the schedule: the Simulator hands RunStats each
/// scheduled instruction with its timing (and, for a DMA, how it was split and when each piece
/// ran); Simulator::stats() (engines/sim_stats.cpp) names the counters in the profiler's vocabulary.
#include <array>
#include <climits>
#include <cstdint>
#include <utility>
#include <vector>

#include "engines/dma/dma_engine.h"
#include "engines/params.h"
#include "isa/isa.h"
#include "memory/dma.h"
#include "sim/interval_union.h"
#include "sim/time.h"

namespace nsim {

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
  /// ScalarE: the activation function table load the instruction begins with, [start, start + table_load) (the
  /// profiler's separate ACT_TABLE_LOAD; part of [start, issue)); 0 without one.
  sim::Ps table_load = 0;
};

/// Plain counters kept by the hot loop (no strings, no maps).
struct TrackCounters {
  uint64_t instructions = 0;
  sim::Ps busy = 0;         ///< sum of issue intervals (II)
  sim::Ps busy_union = 0;   ///< union of issue intervals [start, start + II) (TensorE's pipes overlap)
  sim::Ps busy_cursor = 0;  ///< end of the latest issue interval
  sim::Ps instr_time = 0;   ///< sum of durations (overlaps counted twice)
  sim::Ps active = 0;       ///< union of [start, end) intervals
  sim::Ps cur_lo = -1, cur_hi = -1;
  sim::Ps last_end = 0;
  double flops = 0;
  uint64_t bytes = 0;
  void add_interval(sim::Ps s, sim::Ps e);
  void close();
  /// active with the interval still open: the union so far.
  sim::Ps active_so_far() const { return active + (cur_hi >= 0 ? cur_hi - cur_lo : 0); }
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
  double mx_matmul_flops = 0;  ///< the part of matmul_flops done by MX matmuls (x4-packed inputs, nc_matmul_mx)
  uint64_t matmul_instructions = 0;  ///< multiply_moving that is not a transpose
  uint64_t act_table_loads = 0;      ///< ScalarE activation table loads (InstrTiming::table_load)
  sim::Ps act_table_load_time = 0;
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

namespace engines {

/// The counters of one run, fed one scheduled instruction at a time (no allocation per instruction).
class RunStats {
 public:
  explicit RunStats(const CoreParams& p);
  RunStats(const RunStats&) = delete;  // dma_active forwards into any_active of this object
  RunStats& operator=(const RunStats&) = delete;

  /// Bytes an instruction reads and writes per memory space (a function of its signature: the
  /// simulator works it out once per signature, engines/sig_cache.h).
  struct Bytes {
    uint64_t hbm_read = 0, hbm_write = 0, sbuf_read = 0, sbuf_write = 0, psum_read = 0, psum_write = 0;
  };
  static Bytes bytes_of(const isa::Instr& in);
  /// Extra facts about a scheduled instruction the timing does not carry.
  struct Detail {
    sim::Ps busy = 0;                 ///< time its engine was busy (II; a DMA: its trigger)
    double adjusted_flops = 0;        ///< TensorE: bf16-equivalent FLOPs
    const memory::DmaSplit* split = nullptr;               ///< DMA: the pieces per DMA engine
    const DmaEngines::Transfer* transfer = nullptr;        ///< DMA: when each piece ran
    const Bytes* bytes = nullptr;     ///< bytes_of(in) when known (else worked out here)
  };
  /// One instruction, scheduled at `t` (t.index is its program-order index).
  void on_instr(const isa::Instr& in, const InstrTiming& t, const Detail& d);
  /// No later instruction or DMA packet starts before w: fold the unions up to it. `dma`: the
  /// instruction just recorded was a DMA (the DMA unions fold after every one).
  void fold(sim::Ps w, bool dma, uint64_t seq);
  /// Whether fold() has work after instruction `seq` (a DMA, or every kFoldEvery instructions).
  static bool fold_due(bool dma, uint64_t seq) { return dma || (seq % kFoldEvery) == 0; }
  /// Instructions between two folds of the active-time unions (samples this many instructions apart
  /// are taken at the same phase of the folding).
  static constexpr uint64_t fold_every() { return kFoldEvery; }
  /// Close every counter (idempotent use is the caller's: call once).
  void finish();

  /// The counters at one point of the run (SimOptions::fast_forward: two samples a whole number of
  /// loop periods apart give what one period adds).
  struct Sample {
    RunCounters c;  ///< additive fields only are read (the unions' lengths are below)
    sim::Ps dma_active = 0, any_active = 0;
    std::array<sim::Ps, kNumDmaClasses> dma_class_active{};
    std::vector<std::pair<uint64_t, sim::Ps>> per_loc;
    sim::Ps throttled = 0;  ///< TensorE's throttled time (the Simulator's, not a RunStats counter)
    uint64_t trace_slices = 0;  ///< slices the trace recorder was given (the Simulator's; 0 without a trace)
  };
  void sample(Sample& out) const;
  /// Count `k` more times what the run added from `a` to `b` (a later sample): instructions, times,
  /// bytes, FLOPs, active-time unions, per-line counters; the run ends `dt` later than its simulated
  /// instructions do (end() includes it).
  void add_repeats(const Sample& a, const Sample& b, uint64_t k, sim::Ps dt);
  /// Whether k repeats of a..b (`dt` of time) keep every counter far from overflowing (below 2^56, which
  /// leaves room for the summed times of overlapping instructions).
  static bool repeats_fit(const Sample& a, const Sample& b, uint64_t k, sim::Ps dt);

  /// A new source location id (ids index the per-line counters).
  void add_source() { per_loc_.emplace_back(0, 0); }
  /// (instructions, summed durations) by source id.
  const std::vector<std::pair<uint64_t, sim::Ps>>& per_loc() const { return per_loc_; }
  const RunCounters& counters() const {
    if (lk_on_) flush_lockstep();
    return c_;
  }
  /// The latest instruction end so far (counters().end without the lockstep flush: read per
  /// instruction), plus the time of the iterations skipped (add_repeats) until finish() adds it to end.
  sim::Ps end() const { return c_.end + skipped_time_; }
  /// end() without the skipped time: the clock the simulated instructions run on.
  sim::Ps local_end() const { return c_.end; }
  /// The time of the iterations skipped so far (end() - local_end() until finish()).
  sim::Ps skipped_time() const { return skipped_time_; }

 private:
  void account_bytes(const Bytes& b);
  [[gnu::always_inline]] inline void engine_slot(isa::Engine e, sim::Ps start, sim::Ps end, sim::Ps busy, double flops);
  void dma(const isa::Instr& in, const InstrTiming& t, const Detail& d);
  /// Engine activity [s, e) for total_active_time (staged, then added to RunCounters::any_active).
  void note_active(sim::Ps s, sim::Ps e);
  /// Fold the active-time unions at watermark w (every kFoldEvery instructions, and in finish()).
  void fold_active(sim::Ps w);
  static constexpr uint64_t kFoldEvery = 8;

  /// DMA engines in lockstep: while every transfer moves equal pieces at the same times on all
  /// dma.engines engines, their counters stay equal, so one shared counter (lk_) takes each transfer
  /// instead of every engine's. lk_ holds the sums since the last flush and the engines' common interval
  /// state; flush_lockstep() adds the sums to every engine (counters() and finish() flush first).
  void flush_lockstep() const;
  /// Whether every DMA engine's interval state is equal (lockstep may start).
  bool dma_states_equal() const;

  const CoreParams& p_;
  mutable RunCounters c_;  // mutable: counters() flushes the lockstep sums into it
  mutable TrackCounters lk_;
  bool lk_on_ = false;
  sim::Ps stage_lo_ = 0, stage_hi_ = -1;  ///< staged engine activity, not yet in c_.any_active (empty: hi < 0)
  std::vector<std::pair<uint64_t, sim::Ps>> per_loc_;
  sim::Ps skipped_time_ = 0;  ///< add_repeats' dt, summed (in c_.end after finish())
};

}  // namespace engines
}  // namespace nsim
