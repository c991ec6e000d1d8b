#pragma once
/// Performance analysis of one simulation: the report a performance engineer would write.
///
///   * bounds: the kernel time if only one resource counted (each engine's busy time, the busiest
///     DMA engine, HBM traffic without reloads, the dependency chain with unlimited engines);
///   * idle-time attribution: for each engine, how long it waited and on which engine or DMA queue;
///   * the critical path of the schedule, by engine/queue and by kernel source line;
///   * findings (inefficient DMA sizes, redundant HBM loads, HBM round trips, single-buffered loads,
///     reductions in a separate pass, PE under-fill, fp32 matmuls, PE transposes, partition broadcasts
///     on the PE array, engine bottlenecks, serialisation), ranked by estimated time saved, each
///     naming the kernel lines to change.
///
/// Attach an Analyzer to a Simulator created with SimOptions::dependency_bound before the first
/// instruction; call report() after Simulator::finish(). Thresholds come from the `analysis.*`
/// config keys. docs/profiling.md explains every number.
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engines/simulator.h"

namespace nsim::engines {

/// A kernel source line and what it contributed to a finding or a ranking.
struct LineRef {
  SourceLoc loc;
  uint64_t count = 0;  ///< instructions (or transfers) of this line involved
  double ns = 0;       ///< their time (meaning depends on the list; see the finding)
  std::string note;    ///< e.g. "128 B/partition, 64 transfers"
};

struct Finding {
  std::string kind;       ///< stable id: dma_efficiency, redundant_dma, hbm_roundtrip, single_buffer,
                          ///< split_reduce, act_table_switch, recomputed_value, psum_accumulation, pe_underfill, fp32_matmul,
                          ///< pe_transpose, pe_broadcast, fold_into_activation,
                          ///< engine_bound, serialization (lnc_imbalance: frontend/analyze.cpp)
  std::string title;      ///< one line
  std::string detail;     ///< what was measured, why it costs time, what to change
  double saving_ns = 0;   ///< estimated kernel time saved by the fix
  std::string method;     ///< how saving_ns was estimated: "bound", or "re-simulated (...)" (frontend/analyze.cpp)
  std::vector<LineRef> lines;
  std::vector<std::pair<std::string, double>> metrics;  ///< kind-specific numbers (e.g. times_loaded)
  /// The engine whose time the fix frees when the kind does not say (recomputed_value, psum_accumulation: the engine
  /// of most of the recomputations or adds); empty otherwise (finding_engine).
  std::string engine;
};

struct Bound {
  std::string name;  ///< e.g. "vector", "dma", "hbm", "dependencies"
  double ns = 0;
  std::string what;
};

struct EngineIdle {
  std::string engine;
  double busy_ns = 0;   ///< sum of issue intervals
  double wait_ns = 0;   ///< engine free, operands not ready (semaphore waits)
  double other_wait_ns = 0;  ///< operands ready, engine blocked by a pipe, a shared port or throttling
  double tail_ns = 0;   ///< after its last instruction until the kernel ended
  std::vector<std::pair<std::string, double>> waited_on;  ///< producer track -> ns, largest first
};

struct AnalysisReport {
  std::string kernel, config;
  double total_ns = 0;
  uint64_t instructions = 0;
  std::vector<Bound> bounds;  ///< largest first
  std::string bottleneck;     ///< the bound verdict (engines/bounds.h): a resource or "latency"
  double top_share_percent = 0;  ///< the largest resource bound as a share of the kernel time
  /// TensorE's useful work: the model FLOPs at the PE array's peak (MX matmuls at the MX peak), in ns;
  /// its busy time above this is what PE-array advice can save.
  double tensor_useful_ns = 0;
  double tensor_full_percent = 90;  ///< analysis.tensor_full_percent
  std::vector<EngineIdle> idle;
  bool critical_path = false;  ///< false when the kernel had more instructions than recorded
  std::vector<std::pair<std::string, double>> critical_path_by_track;  ///< largest first; sums to total_ns
  std::vector<LineRef> critical_path_lines;                             ///< largest first
  std::vector<Finding> findings;                                        ///< largest saving first

  std::string to_text(size_t max_lines = 5) const;
  std::string to_json() const;
};

/// The engine whose busy time a finding of this kind removes ("tensor", "vector"), or "" (frontend
/// re-simulations and engine_bound use it).
std::string finding_engine(const std::string& kind);
/// finding_engine of `f`'s kind, or its own engine (Finding::engine) when it names one.
std::string finding_engine(const Finding& f);
/// Settle `engine_bound` against the defect findings on its engine, drop findings saving less than
/// `min_saving_ns`, rank the rest (largest saving first, `serialization` last). Analyzer::report()
/// ends with it; call it again after changing savings (frontend/analyze.cpp's re-simulations).
void rank_findings(AnalysisReport& r, double min_saving_ns);

class Analyzer {
 public:
  /// Registers itself as an instruction listener of `sim` (which must outlive it).
  explicit Analyzer(Simulator& sim);
  /// The report (after sim.finish()).
  AnalysisReport report(const std::string& kernel_name = "") const;

 private:
  struct State;
  std::shared_ptr<State> s_;  ///< shared with the listener, which may outlive the Analyzer
};

}  // namespace nsim::engines
