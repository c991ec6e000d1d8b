#pragma once
/// The compiler's back end between lowering and the engines (shared/spec/compiler.md, docs/timing-model.md
/// "The compiler model"): the hardware runs what neuronxcc makes of a kernel, not its program order.
///
/// List scheduling over a bounded window: instructions enter the window in program order; each gets
/// edges from the earlier window instructions it conflicts with (RAW/WAR/WAW on the storage its
/// operands occupy after allocation; PSUM accumulation groups are RAW/WAW on their bank), from the
/// previous instruction of its `no_reorder` group, from engine-internal state it shares
/// (LoadStationary -> MultiplyMoving pairs are one unit; accumulator-register chains keep their
/// order) and from `with_schedule` edges. Among the instructions whose predecessors are all issued,
/// the one that can start first issues next (its engine's free time vs its operands' ready time,
/// both from the simulator), ties broken by the longest path to the end of the window (critical
/// path), then by program order. Since every engine is an in-order queue, the issue order is each
/// engine's instruction stream.
///
/// Engine placement: an op without `engine=` (and value-returning nl.* ops) may run on any engine
/// the ISA table allows for it whose semantics agree for its dtypes; it goes to the one on which it
/// would finish first. DMA queues: automatic transfers are spread over their trigger engine's
/// queues (compiler.dma_queues_per_trigger), each to the queue that frees up first.
#include <cstdint>
#include <string>
#include <vector>

#include "frontend/lower.h"

namespace nsim::frontend {

/// What the scheduler did, for stats and tests.
struct ScheduleStats {
  uint64_t instructions = 0;
  uint64_t reordered = 0;     ///< instructions issued before an older one still waiting
  uint64_t placed = 0;        ///< engine-free instructions placed on an engine other than the opcode's default
  uint64_t window_peak = 0;   ///< most instructions in the window at once
};

/// The `with_schedule` edges and the ops' own "after" labels, by op index: the ops each op runs after
/// (UnknownName for a name no op carries). Used by the list scheduler and by the program-order path.
std::vector<std::vector<int>> schedule_edges(const Kernel& k);

class Scheduler {
 public:
  /// `low` must have been built for `k` and `sim`.
  Scheduler(const Kernel& k, Lowering& low, Simulator& sim);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;
  /// Lower every instruction and submit it to the simulator in scheduled order.
  void run();
  const ScheduleStats& stats() const { return stats_; }

  // ---- step API (LNC=2: frontend/multicore.h advances the core whose next issue is earliest)
  /// Fill the window and choose the next instruction to issue; false when the kernel is done.
  bool prepare();
  /// After prepare(): when the chosen instruction can start, the instruction (an nc_matmul pair: its
  /// LoadStationary; engine as placed by the kernel) and the index of its op in Kernel::ops (-1: none).
  sim::Ps next_start() const;
  const isa::Instr& next_instr() const;
  int next_op() const;
  /// Issue the chosen instruction, starting no earlier than `not_before`; its (first) timing.
  InstrTiming commit(sim::Ps not_before = 0);

 private:
  struct Impl;
  Impl* impl_;
  ScheduleStats stats_;
};

}  // namespace nsim::frontend
