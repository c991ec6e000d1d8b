#pragma once
/// LNC=2: one kernel launch on two physical NeuronCores (docs/lnc.md).
///
/// Each core is its own Simulator (engines, SBUF, PSUM, DMA queues and engines, dependency tracker)
/// lowering and scheduling its own program (Kernel::core_programs). Core 1 uses core 0's HBM (one
/// storage, so shared_hbm tensors are one tensor) and both cores' DMA engines share one HBM stack
/// (hbm.stack_bw). The cores advance one instruction at a time, always the core whose next
/// instruction can start first (ties: core 0), so shared-HBM bookings arrive in time order and the
/// same inputs always give the same schedule.
///
/// sendrecv and core_barrier are rendezvous: a core whose next instruction is one waits (issues
/// nothing) until the other core reaches its matching call; both then issue it at the later of the
/// two arrival times. A core that finishes while the other waits is PeerMissing (E449), calls that
/// do not match are PeerMismatch (E448), both naming the call sites: never a hang.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engines/check/race.h"
#include "engines/simulator.h"
#include "frontend/inputs.h"
#include "frontend/ir.h"
#include "sim/config.h"
#include "sim/stats.h"

namespace nsim::frontend {

class MultiCoreRun {
 public:
  /// `launch`: a kernel with core_programs (parse_kernel_json of a multi-core kernel.json). Checks the
  /// LNC degree against hbm.cores_per_stack (LncNotSupported, E447) and verifies each program.
  MultiCoreRun(const Kernel& launch, const sim::Config& cfg, const SimOptions& opts);
  ~MultiCoreRun();
  MultiCoreRun(const MultiCoreRun&) = delete;
  MultiCoreRun& operator=(const MultiCoreRun&) = delete;

  /// Write the launch's inputs (write_inputs over Kernel::tensors, into the shared HBM).
  void write_inputs(const InputViews& given, uint64_t seed);
  /// Run both programs to the end; then finish every core and merge the trace files (also when the run
  /// stops with an error: a limit E416 (SimOptions limits apply per core), a signal E417, a rendezvous error).
  void run();

  int cores() const { return static_cast<int>(sims_.size()); }
  Simulator& core(int i) { return *sims_[static_cast<size_t>(i)]; }
  const Simulator& core(int i) const { return *sims_[static_cast<size_t>(i)]; }
  /// The launch's end: the later core's.
  sim::Ps total_time() const;
  /// Stats of the launch (after run()): additive stats (counts, bytes, FLOPs) summed over the cores,
  /// the others (times, percents, rates) those of the core that finishes last; `total_time` is the
  /// later core's; `lnc.*` (cores, per-core times, load imbalance) and every core's own stats under
  /// `core0.` / `core1.`.
  sim::StatsRegistry stats() const;
  /// Per source line over both cores (most time first).
  std::vector<Simulator::LineStats> line_stats() const;
  /// Both cores' sanitizer reports.
  std::vector<engines::CheckReport> check_reports() const;
  /// Rendezvous completed (sendrecv + core_barrier pairs).
  uint64_t rendezvous() const { return rendezvous_; }

 private:
  struct Core;
  void meet();
  void step_all();
  void finish();  ///< finish every core, merge the trace files (once)
  const Kernel& launch_;
  SimOptions opts_;
  std::vector<std::unique_ptr<Simulator>> sims_;
  std::vector<std::unique_ptr<Core>> cs_;
  uint64_t rendezvous_ = 0;
  /// The sanitizer's cross-core dma-race check (SimOptions::check with two cores), else null.
  std::unique_ptr<engines::RaceChecker> race_;
  bool ran_ = false;
  bool finished_ = false;
};

/// Merge per-core Chrome trace files (as written with SimOptions::core_index) into `path`: one
/// Perfetto process per core (pid = core + 1); the per-core files are removed.
void merge_core_traces(const std::string& path, const std::vector<std::string>& core_paths);

}  // namespace nsim::frontend
