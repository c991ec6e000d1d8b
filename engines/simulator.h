#pragma once
/// nsim::Simulator: the C++ façade over one NeuronCore. Build it from a config, allocate tensors,
/// submit instructions in program order, then read outputs, stats and the trace.
///
/// Timing: every engine is an in-order queue. Instructions are scheduled in program order; an
/// instruction starts when its engine may issue again (previous start + II) and every earlier
/// instruction it depends on (RAW/WAR/WAW on overlapping memory) has finished, plus the semaphore
/// hand-off latency when the producer ran elsewhere. Because each instruction depends only on
/// earlier ones, its start and end are final when it is scheduled (docs/timing-model.md).
///
/// Structure: each engine is a component with its own issue state (engines::StreamEngines for
/// VectorE, ScalarE, GpSimd and Sync; engines::TensorEngine; engines::DmaEngines); the façade
/// computes an instruction's operand readiness (engines::DepTracker), asks the engine for its slot,
/// records the result and hands it to the listeners of the schedule: the run's counters
/// (engines::RunStats), the trace recorder, any added with add_instr_listener (instruction tables) and those
/// added with add_event_listener (the analyzer), which run beside the simulation (engines/event_pipe.h).
#include <array>
#include <csignal>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engines/analysis/pe_results.h"
#include "engines/check/checker.h"
#include "engines/deps.h"
#include "engines/dma/dma_engine.h"
#include "engines/event_pipe.h"
#include "engines/fast_forward.h"
#include "engines/params.h"
#include "engines/run_stats.h"
#include "engines/sig_cache.h"
#include "engines/stream_engines.h"
#include "engines/tensor/tensor_engine.h"
#include "isa/semantics/semantics.h"
#include "memory/memory.h"
#include "sim/config.h"
#include "sim/interval_union.h"
#include "sim/stats.h"

namespace nsim {
namespace sim {
class TraceSink;  // sim/trace.h (kept out of this header: it brings in nlohmann/json)
}
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
  /// Resource limits (0 = none): submit() refuses the next instruction with E416 once this many
  /// instructions ran, or once the simulated time passed max_sim_time_ns.
  uint64_t max_instructions = 0;
  double max_sim_time_ns = 0;
  /// Set asynchronously (a signal handler) to stop the run: the next submit() or check_stop() throws
  /// E417; the simulator stays consistent, so finish() and stats() give the partial run.
  const volatile std::sig_atomic_t* stop = nullptr;
  /// The sanitizer (engines/check/checker.h): reads of never-written SBUF/PSUM, accumulation into
  /// never-written PSUM, the first NaN/Inf from finite inputs. Needs numerics; reports, never throws.
  /// (Last, so aggregate initialisers written before it keep their meaning.)
  bool check = false;
  /// LNC=2: this simulator's physical core index (-1: a single-core run); names the trace process.
  int core_index = -1;
  /// Work out verification, operand extents, costs and byte counts once per instruction signature
  /// (engines/sig_cache.h). Off: once per instruction, with the same results (for tests).
  bool signature_cache = true;
  /// multiply_moving's product may run on host threads behind the next instructions (not with the
  /// sanitizer, which reads its results at once), and a moving tile multiplied again unwritten is not
  /// converted again (isa::sem::AsyncGemm; numerics on). The same outputs either way
  /// (tests/unit/engines/test_async_product.cpp).
  bool async_product = true;
  /// Timing-only runs: once a loop's iterations repeat (the engines and DMA queues at the same times
  /// relative to the run's end, each iteration adding the same time), skip the iterations in the
  /// middle and count them as repeats of those measured (docs/timing-model.md, "Fast-forward").
  /// An approximation, off by default; ignored with numerics, a trace, the analyzer, an instruction
  /// listener, the sanitizer or LNC=2.
  bool fast_forward = false;
  /// `nsim analyze`'s what-if runs (frontend/analyze.cpp; docs/profiling.md "How the savings are estimated"):
  /// the PE-array helpers of these kinds (bits of engines::PeResults::Kind: transposes, partition
  /// broadcasts with the load_stationary of their one-row weights) and the copies of their PSUM results,
  /// and (kSplitReduce) the reductions of an activation's output in a pass of their own, take no engine
  /// time: each is done when its operands are ready. Timing-only; 0 = off.
  uint8_t free_pe_helpers = 0;
  /// `nsim analyze`'s what-if run for fold_into_activation: the passes an activation could fold
  /// (engines::PeResults::foldable_pass) made on these source lines (file, line and function) take no engine time.
  std::vector<SourceLoc> free_folds;
  /// The event listeners (add_event_listener: the analyzer) and the dependency-bound schedule run on a host thread
  /// of their own, beside the simulation, when the process has two (isa::sem::host_threads(), NSIM_NUM_THREADS);
  /// the same results either way (engines/event_pipe.h); so is a protobuf trace's compression
  /// (sim::PerfettoTraceWriter::compress_beside: the same file). Off: on the simulating thread.
  bool listener_thread = true;
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
  /// The memory, with every instruction submitted so far complete (a product running behind, see
  /// numerics_done(), is waited for).
  memory::Memory& memory() {
    numerics_done();
    return mem_;
  }
  /// Wait for the numerics still running behind the instructions submitted (multiply_moving's product
  /// on host threads, isa::sem::AsyncGemm). submit() waits by itself for an instruction that touches the
  /// memory the product writes; the accessors here (memory(), arch_state(), reading HBM, finish()) wait,
  /// and make the product forget the moving tiles it kept converted (their caller may write memory).
  void numerics_done() const;
  bool numerics() const { return opts_.numerics; }

  // ---- tensors
  const memory::HbmTensor& alloc_hbm(const std::string& name, const std::vector<int64_t>& shape, DType dt);
  void write_hbm(const std::string& name, const void* data, size_t bytes);
  /// A copy of HBM tensor `name` once the run is over (zeros without storage); throws HostMemory
  /// (sim/errors.def) when the host lacks the memory for that copy.
  std::vector<uint8_t> read_hbm(const std::string& name) const;
  /// The bytes of HBM tensor `name` (memory::HbmTensor::bytes of them) as they are once the run is over,
  /// in place (the CLI writes its --outputs files from them); nullptr without storage.
  const uint8_t* hbm_bytes(const std::string& name) const;
  /// The storage of HBM tensor `name`, moved out once the run is over (the Python module hands outputs
  /// to numpy this way, without a copy): the tensor has none afterwards. Empty without numerics.
  memory::Buffer take_hbm(const std::string& name);
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
  /// `known_regions`: the dependency regions of `in` left by operands_ready_multi / operands_ready_tag
  /// (with known_ready), valid while regions_epoch() has not changed since.
  InstrTiming submit(const isa::Instr& in, sim::Ps not_before = 0,
                     const engines::DepTracker::Ready* known_ready = nullptr,
                     const engines::DepTracker::Regions* known_regions = nullptr);

  // ---- compiler hooks (frontend/compiler): the schedule an instruction would get now, nothing committed
  /// When the operands of `in` are ready for engine `e` (every overlapping earlier access finished,
  /// plus the hand-off latency to `e`).
  sim::Ps operands_ready(const isa::Instr& in, isa::Engine e) const { return operands_ready_tag(in, e).time; }
  /// The same with the tag of the access that sets it (pass to submit() as known_ready).
  engines::DepTracker::Ready operands_ready_tag(const isa::Instr& in, isa::Engine e) const;
  /// The same, leaving the operands' dependency regions in `rg` (for submit()'s known_regions).
  /// `ext`: the operands' isa::slot_extent by slot when the caller has them (the lowering does), else nullptr.
  using Extent = std::pair<int64_t, int64_t>;
  engines::DepTracker::Ready operands_ready_tag(const isa::Instr& in, isa::Engine e, engines::DepTracker::Regions& rg,
                                                const Extent* ext = nullptr) const {
    regions_into(in, deps_, rg, ext);
    engines::DepTracker::DmaSides dw;
    return deps_.ready(static_cast<uint8_t>(e), rg, dma_sides(in, dw));
  }
  /// operands_ready_tag() for every engine in the bitmask `engines`, in one pass (out by engine); the
  /// regions are left in `rg`.
  void operands_ready_multi(const isa::Instr& in, uint8_t engines,
                            std::array<engines::DepTracker::Ready, engines::kNumClasses>& out,
                            engines::DepTracker::Regions& rg, const Extent* ext = nullptr) const {
    regions_into(in, deps_, rg, ext);
    engines::DepTracker::DmaSides dw;
    const engines::DepTracker::DmaSides* w = dma_sides(in, dw);
    if (engines & (engines - 1)) return deps_.ready_multi(engines, rg, out, w);
    out.fill(engines::DepTracker::Ready{});  // one engine: the cheaper single-class scan
    if (engines)
      out[static_cast<size_t>(__builtin_ctz(engines))] = deps_.ready(static_cast<uint8_t>(__builtin_ctz(engines)), rg, w);
  }
  /// Changes when regions computed before may no longer be used (HBM tracking grew).
  uint64_t regions_epoch() const { return regions_epoch_; }
  /// When engine `e` may issue `in`, ignoring its operands (its previous issue, shared ports).
  sim::Ps engine_free(const isa::Instr& in, isa::Engine e) const {
    return engine_free(stream_.uses(in), e);
  }
  /// What engine_free() needs of `in` (StreamEngines::uses()).
  uint8_t engine_uses(const isa::Instr& in) const { return stream_.uses(in); }
  /// The same for an instruction with StreamEngines::uses() `u` (the list scheduler keeps it per instruction).
  sim::Ps engine_free(uint8_t u, isa::Engine e) const {
    return e == isa::Engine::kTensor && !(u & engines::StreamEngines::kUsesDma) ? tensor_.next_issue() : stream_.free(u, e);
  }
  /// engine_free(u, e) of `in` itself: on TensorE with PE tiles in use, when `in`'s tile can issue.
  sim::Ps engine_free(const isa::Instr& in, uint8_t u, isa::Engine e) const {
    return e == isa::Engine::kTensor && tensor_.tiled() && !(u & engines::StreamEngines::kUsesDma) ? tensor_.next_issue(in)
                                                                                                    : engine_free(u, e);
  }
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
  // ---- LNC=2 (frontend/multicore.h): two Simulators, one per physical core
  /// Make this simulator the second physical core of `owner`'s launch: it uses owner's HBM (tensors
  /// and storage; call before allocating HBM here) and both cores' DMA engines share one HBM stack
  /// (hbm.stack_bw). Each keeps its own engines, SBUF, PSUM, DMA queues and dependency tracker.
  void attach_peer(Simulator& owner);
  /// After HBM tensors were allocated through the other core: let the dependency tracker cover them.
  void reserve_hbm_deps();
  /// Earliest time any engine of this core may issue next (and the promised start floor).
  sim::Ps next_issue_floor() const { return watermark(); }
  /// Pull instructions from `next` until it returns false (a generator: nothing is materialised).
  void run(const std::function<bool(isa::Instr&)>& next);
  /// E417 if SimOptions::stop is set (also called by the lowering while it iterates loops that emit
  /// nothing, so that an interrupt is seen there too).
  void check_stop() const {
    if (opts_.stop && *opts_.stop) throw_interrupted();
  }
  /// Close the trace and the counters. Safe to call more than once.
  void finish();
  /// Called after each instruction is scheduled (instruction tables, analysis); none = no cost.
  /// During the call of a DMA instruction, last_dma_split() / last_dma_transfer() describe it.
  using InstrListener = std::function<void(const isa::Instr&, const InstrTiming&)>;
  void add_instr_listener(InstrListener fn) { listeners_.push_back(std::move(fn)); }
  /// A listener of the events of the instructions scheduled from now on (engines::InstrEvent: the instruction,
  /// its timing, a DMA's split and transfer), called in program order, on a host thread of its own when there is
  /// one (SimOptions::listener_thread): it must not call the Simulator meanwhile but for what does not change
  /// while instructions are submitted (params(), config(), source()). sync_events(), finish() and the accessors
  /// of what it may read wait for it.
  using EventListener = std::function<void(const engines::InstrEvent&)>;
  void add_event_listener(EventListener fn);
  /// Wait until the event listeners have taken every instruction scheduled; rethrows what one threw.
  void sync_events() const {
    if (events_) events_->sync();
  }
  /// SimOptions::free_pe_helpers: whether `in`, submitted now, would take no engine time (one of the helpers
  /// to free, or a copy of one's result); the list scheduler then neither waits for its engine nor costs it.
  bool would_free(const isa::Instr& in) const { return pe_free_ && frees(in); }
  const memory::DmaSplit& last_dma_split() const { return last_split_; }
  const engines::DmaEngines::Transfer& last_dma_transfer() const { return last_transfer_; }

  // ---- fast-forward (SimOptions::fast_forward; the lowering decides what to skip, frontend/lower.h)
  /// Whether iterations may be skipped in this run (the option set and nothing that needs every
  /// instruction: numerics, a trace of every slice, analyzer, listeners, sanitizer, a second core). A trace with
  /// a window or a limit allows it: iterations are skipped once it keeps no more slices (trace_closed).
  bool fast_forward_allowed() const;
  /// Whether iterations may be skipped now as far as the trace goes: none, or it will write no more slices (past its
  /// window's end, or its limit reached), so a skipped iteration's slices are ones it would drop.
  bool trace_closed() const;
  /// The time skipped so far: the simulated instructions run that much earlier than in the run simulating every one
  /// (the trace recorder adds it to their times).
  sim::Ps skipped_time() const { return stats_.skipped_time(); }
  /// The timing state that decides what later instructions do, relative to the run's end so far:
  /// each engine's next issue and each DMA queue's next setup, hashed.
  uint64_t timing_digest() const;
  /// The end of the instructions simulated so far, without skipped time.
  sim::Ps local_time() const { return stats_.local_end(); }
  void sample_stats(engines::RunStats::Sample& out) const;
  /// Count `k` repeats of what ran from sample `a` to sample `b` (`instructions` instructions) as if
  /// simulated: counters, per-line stats, instruction indexes, and `dt` more time at the end.
  void add_repeats(const engines::RunStats::Sample& a, const engines::RunStats::Sample& b, uint64_t k,
                   uint64_t instructions, sim::Ps dt);
  /// Instructions counted by add_repeats (not simulated one by one).
  uint64_t skipped_instructions() const { return skipped_instructions_; }
  /// What fast-forward made of an instance of loop `loop` (an index into the kernel's loops) at `loc`.
  void note_fast_forward(int loop, const SourceLoc& loc, engines::FfOutcome o);
  /// Per loop source line that fast-forward met (the loops recorded in pieces on one line together; a loop
  /// without a location alone), in the order met: the first loop's index, the location and the instances of
  /// each outcome.
  struct FfLoop {
    int loop = -1;
    SourceLoc loc;
    engines::FfCounts n{};
  };
  const std::vector<FfLoop>& fast_forward_loops() const { return ff_loops_; }

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
  sim::Ps total_time() const { return stats_.end(); }
  /// Instructions accepted by submit() so far.
  uint64_t instructions() const { return seq_; }
  /// Length of the longest dependency chain with unlimited engines (SimOptions::dependency_bound;
  /// -1 when not computed). Each instruction keeps the duration it had in the real schedule.
  sim::Ps dependency_bound() const {
    sync_events();
    return asap_ ? asap_end_ : -1;
  }
  const SimOptions& options() const { return opts_; }
  /// The trace being written (nullptr without --trace): for callers adding their own tracks.
  sim::TraceSink* trace_sink() { return trace_.get(); }
  const RunCounters& counters() const { return stats_.counters(); }
  /// Stats with names, units and descriptions (call after finish()).
  sim::StatsRegistry stats() const;
  isa::ArchState& arch_state() {
    numerics_done();
    return st_;
  }
  /// The sanitizer's reports (empty without SimOptions::check).
  const std::vector<engines::CheckReport>& check_reports() const;
  /// The same, to annotate (names of the tensors): nullptr without the sanitizer.
  std::vector<engines::CheckReport>* mutable_check_reports() { return checker_ ? &checker_->reports() : nullptr; }
  /// The dependency classes (bit c: engine c, or engines::kClassDma) of the latest writers of `o`'s bytes as the
  /// dependency tracker keeps them (per chunk; 0: never written). The analyzer tells loaded tiles by it.
  uint32_t writer_classes(const isa::Operand& o) const { return deps_.writer_classes(deps_.range_of(o)); }
  /// True when the sanitizer runs (SimOptions::check with numerics).
  bool checking() const { return checker_ != nullptr; }
  /// The sanitizer's allocation tags of the next submit()'s operands (engines::SlotTags; the caller
  /// keeps them alive until it returns). Without them reads only need bytes something wrote.
  void set_slot_tags(const engines::SlotTags* tags) { slot_tags_ = tags; }

 private:
  using Sig = engines::SigInfo;
  /// Verify `in` (the checks of its offsets only, when its signature passed before) and return what its
  /// signature determines (engines/sig_cache.h); valid until the next call.
  const Sig& signature(const isa::Instr& in, const SourceLoc& where);
  /// Wait for the pending product when an operand of `in` (views v) overlaps what it writes.
  void wait_for_product(const isa::Instr& in, const isa::Views& v);
  /// Tell st_.async_gemm which memory `in` (views v) writes.
  void forget_written(const isa::Instr& in, const isa::Views& v);
  void fill_signature(Sig& e, const isa::Instr& in, uint64_t h);
  InstrTiming schedule(const isa::Instr& in, const Sig& sig);
  [[noreturn]] void throw_interrupted() const;
  /// E416/E417 before an instruction is accepted (inline: it runs for every instruction; the errors out of line).
  void check_limits() const {
    check_stop();
    if ((opts_.max_instructions > 0 && seq_ >= opts_.max_instructions) ||
        (opts_.max_sim_time_ns > 0 && sim::ps_to_ns(total_time()) > opts_.max_sim_time_ns))
      throw_limit();
  }
  void throw_limit() const;  ///< the E416 of the limit reached
  InstrTiming schedule_dma(const isa::Instr& in, const Sig& sig);
  InstrTiming schedule_tensor(const isa::Instr& in, const Sig& sig);
  InstrTiming schedule_stream(const isa::Instr& in, const Sig& sig);
  InstrTiming schedule_barrier(const isa::Instr& in, const Sig& sig);
  /// A sequencer instruction (core_barrier, register_load): timed by schedule_barrier, not an engine's datapath.
  static bool sequencer_op(const isa::OpInfo& info) {
    return info.cost == isa::CostClass::kBarrier || info.cost == isa::CostClass::kRegisterLoad;
  }
  static bool sequencer_op(const isa::Instr& in) { return sequencer_op(isa::op_info(in.op)); }
  bool frees(const isa::Instr& in) const;
  InstrTiming schedule_free(const isa::Instr& in, const Sig& sig);
  /// schedule() with SimOptions::free_pe_helpers: schedule_free() or schedule_on_engine(), then the ring.
  InstrTiming schedule_what_if(const isa::Instr& in, const Sig& sig);
  /// The instruction on its engine (or DMA queue): stream, barrier, DMA or TensorE.
  InstrTiming schedule_on_engine(const isa::Instr& in, const Sig& sig, bool dma);
  sim::Ps watermark() const;
  engines::DepTracker::Regions regions(const isa::Instr& in, const engines::DepTracker& on) const {
    engines::DepTracker::Regions r;
    regions_into(in, on, r);
    return r;
  }
  engines::DepTracker::Regions regions(const isa::Instr& in) const { return regions(in, deps_); }
  /// regions() written into `r` (no copy of the whole struct).
  void regions_into(const isa::Instr& in, const engines::DepTracker& on, engines::DepTracker::Regions& r,
                    const Extent* ext = nullptr) const;
  /// regions() from the operand extents of `in`'s signature, written into `r`.
  static void sig_regions(const isa::Instr& in, const engines::SigAccesses& acc, const engines::DepTracker& on,
                          engines::DepTracker::Regions& r);
  /// The regions of `in` on deps_: submit()'s known_regions when given, else computed into `scratch`.
  const engines::DepTracker::Regions& regions_for(const isa::Instr& in, const Sig& sig,
                                                  engines::DepTracker::Regions& scratch) const {
    if (known_regions_) return *known_regions_;
    sig_regions(in, sig.acc, deps_, scratch);  // (in place: a Regions is ~700 bytes)
    return scratch;
  }
  /// The operands' ready time for `in` on its engine (submit()'s known_ready when given).
  /// (not a DMA: ready_for_dma)
  engines::DepTracker::Ready ready_for(const isa::Instr& in, const engines::DepTracker::Regions& rg) const {
    return known_ready_ ? *known_ready_ : deps_.ready(static_cast<uint8_t>(in.engine), rg);
  }
  engines::DepTracker::Ready ready_for_dma(const isa::Instr& in, const engines::Footprints::Footprint (&fp)[2],
                                           const engines::DepTracker::Regions& rg) const;
  /// engines::Footprints::of_slot(in, k) of a DMA's dst (0) or src (1), from its signature's when it has one.
  static engines::Footprints::Footprint dma_footprint(const isa::Instr& in, const Sig& sig, int k);
  /// For a DMA: `dw` filled to let it skip the waits on earlier accesses of other bytes in its chunks
  /// (engines::Footprints); else nullptr.
  const engines::DepTracker::DmaSides* dma_sides(const isa::Instr& in, engines::DepTracker::DmaSides& dw) const {
    if (!isa::is_dma(in.op)) return nullptr;
    const int indirect = isa::indirect_slot(in);
    dw.dst_hbm = in.slot(0).space == isa::Space::kHbm;
    dw.src_hbm = in.slot(1).space == isa::Space::kHbm;
    dw.dst_known = dw.dst_hbm || indirect != 0;  // (on chip, a side addressed at run time is not remembered)
    dw.src_known = dw.src_hbm || indirect != 1;
    dw.hbm_writes = &hbm_writes_;
    dw.hbm_reads = &hbm_reads_;
    dw.chip_writes = &chip_writes_;
    dw.in = &in;
    dw.now = seq_;
    return &dw;
  }
  /// Note the HBM sides of `in` (instruction seq_, of dependency class `cls`, done at `end`) in hbm_writes_ /
  /// hbm_reads_.
  void note_hbm(const isa::Instr& in, uint8_t cls, sim::Ps end);
  /// Dependency-bound schedule of one instruction of class `cls` that took `dur` (SimOptions::dependency_bound) and
  /// read its operands in its first `read` (< 0: until its end), as deps_ records it: noted in its event, for
  /// take_event().
  void schedule_asap(const Sig& sig, uint8_t cls, sim::Ps dur, sim::Ps read = -1);

  sim::Config cfg_;
  engines::CoreParams p_;
  SimOptions opts_;
  isa::Limits limits_;
  memory::Memory mem_;
  engines::DepTracker deps_;
  engines::Footprints hbm_writes_, hbm_reads_;  ///< what recent instructions wrote and read in HBM (dma_sides)
  engines::Footprints chip_writes_;             ///< what recent DMAs wrote on chip (dma_sides)
  // The engines, each its own component holding its issue state; the Simulator asks them for slots,
  // records dependencies and hands the result to the listeners (stats_, the trace, the analyzer).
  engines::StreamEngines stream_;  ///< VectorE, ScalarE, GpSimd, Sync (and DMA triggers on them)
  engines::TensorEngine tensor_;
  engines::DmaEngines dma_;
  isa::ArchState st_;
  /// multiply_moving's product behind the next instructions (numerics on): st_.async_gemm.
  /// (After mem_ and st_: destroyed first, waiting for the product.)
  std::unique_ptr<isa::sem::AsyncGemm> gemm_async_;
  engines::RunStats stats_;
  std::vector<SourceLoc> sources_;
  std::unique_ptr<sim::TraceSink> trace_;
  std::unique_ptr<engines::TraceRecorder> recorder_;  ///< formats the trace: a listener of the schedule
  bool finished_ = false;
  std::vector<InstrListener> listeners_;
  uint64_t seq_ = 0;  ///< program-order index of the next instruction
  uint64_t skipped_instructions_ = 0;  ///< add_repeats
  std::vector<FfLoop> ff_loops_;       ///< note_fast_forward
  std::vector<int> ff_loop_at_;        ///< loop index -> its entry in ff_loops_ (-1: none yet)
  engines::FfCounts ff_outcomes_{};  ///< summed over ff_loops_
  sim::Ps skipped_throttled_ = 0;      ///< add_repeats: TensorE throttled time of the repeats
  std::array<int64_t, 2> onchip_peak_{-1, -1};  ///< set_onchip_peak (SBUF, PSUM); -1 = not set
  std::unique_ptr<engines::DepTracker> asap_;
  std::unique_ptr<engines::Checker> checker_;  ///< SimOptions::check with numerics
  std::unique_ptr<engines::PeResults> pe_free_;  ///< SimOptions::free_pe_helpers / free_folds: the helpers' results
  /// SimOptions::free_folds, by source id: -1 not yet looked up, 0 no, 1 a line whose foldable passes are free.
  mutable std::vector<int8_t> fold_line_;
  bool fold_line(uint32_t loc) const;
  sim::Ps start_floor_ = 0;  ///< set_start_floor()
  sim::Ps not_before_ = 0;  ///< submit()'s extra constraint for the instruction being scheduled
  const engines::DepTracker::Ready* known_ready_ = nullptr;  ///< submit()'s known_ready, during schedule()
  const engines::DepTracker::Regions* known_regions_ = nullptr;  ///< submit()'s known_regions, during schedule()
  uint64_t regions_epoch_ = 0;
  const engines::SlotTags* slot_tags_ = nullptr;  ///< set_slot_tags(): for the next submit() only
  sim::Ps asap_end_ = 0;
  Simulator* peer_ = nullptr;  ///< LNC=2: the other physical core (attach_peer)
  memory::DmaSplit last_split_{};
  engines::DmaEngines::Transfer last_transfer_{};
  engines::SigCache sigs_;
  /// By source id x slot (hint_slot: the engine, or for a transfer its DMA queue modulo 4): the entries the
  /// last two signatures of that line on that engine (or queue) used, the latest first (a matmul line
  /// alternates a load_stationary and a multiply_moving on TensorE). The instructions of one op share its
  /// signature; checked with same_signature before use, which skips the hash and the set lookup. Entries
  /// may have been overwritten since, or be another engine's (slots are shared modulo kHintSlots): the
  /// check catches it. (kHintSlots per line, not one per engine and queue: a kernel with its loops
  /// unrolled has a line per op, hundreds of thousands.)
  struct SigHint {
    Sig* latest = nullptr;
    Sig* other = nullptr;
  };
  std::vector<SigHint> sig_hint_;
  static constexpr size_t kHintSlots = 8;
  /// Compute instructions by engine (slots 0-3; a non-transfer on Sync shares TensorE's), transfers by queue
  /// (slots 4-7: a line's transfers rotate over their engine's queues, which the signature includes).
  static size_t hint_slot(const isa::Instr& in) {
    return isa::is_dma(in.op) ? 4 + (in.dma_queue & 3u) : static_cast<size_t>(in.engine) & 3u;
  }
  std::unique_ptr<Sig> sig_scratch_;  ///< the entry of every instruction without SimOptions::signature_cache
  std::vector<EventListener> event_listeners_;
  /// The events of event_listeners_ and of asap_ (created with the first of them; last: its thread stops, taking
  /// what is left, before the members it uses go).
  std::unique_ptr<engines::EventPipe> events_;
  /// Create events_ (once).
  void start_events();
  /// Fill the event of `in` (scheduled now, `t`) and hand it over.
  void post_event(const isa::Instr& in, const InstrTiming& t);
  /// What the pipe's consumer does with one event: the dependency-bound schedule, then the event listeners.
  void take_event(const engines::InstrEvent& ev);
};

}  // namespace nsim
