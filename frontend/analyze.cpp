#include "frontend/analyze.h"

#include <fmt/format.h>

#include <algorithm>
#include <memory>

#include "engines/params.h"
#include "frontend/compiler/allocate.h"
#include "frontend/lower.h"
#include "frontend/multicore.h"

namespace nsim::frontend {

namespace {

// An LNC=2 launch: the report of the core that finishes last (it sets the launch's time), plus a finding
// "lnc_imbalance" with both cores' times and what balancing them would save.
engines::AnalysisReport analyze_multicore(const Kernel& k, const sim::Config& cfg, const SimOptions& opts) {
  MultiCoreRun mc(k, cfg, opts);
  std::vector<std::unique_ptr<engines::Analyzer>> an;
  for (int c = 0; c < mc.cores(); ++c) an.push_back(std::make_unique<engines::Analyzer>(mc.core(c)));
  mc.run();
  int last = 0;
  std::vector<double> ns;
  for (int c = 0; c < mc.cores(); ++c) {
    ns.push_back(sim::ps_to_ns(mc.core(c).total_time()));
    if (ns.back() > ns[static_cast<size_t>(last)]) last = c;
  }
  engines::AnalysisReport r = an[static_cast<size_t>(last)]->report(k.name);
  const double tmax = *std::max_element(ns.begin(), ns.end()), tmin = *std::min_element(ns.begin(), ns.end());
  engines::Finding f;
  f.kind = "lnc_imbalance";
  f.title = fmt::format("load imbalance between the {} cores: {:.1f} %", mc.cores(), tmax > 0 ? 100.0 * (tmax - tmin) / tmax : 0.0);
  std::string per;
  for (size_t c = 0; c < ns.size(); ++c) per += fmt::format("{}core {} {:.1f} ns", c ? ", " : "", c, ns[c]);
  f.detail = fmt::format("LNC={} launch: {}; the launch ends with core {} (this report is core {}'s). Moving work "
                         "(rows, heads: nl.program_id(0)) from the later core to the earlier one could save up to half "
                         "the difference.",
                         mc.cores(), per, last, last);
  f.saving_ns = (tmax - tmin) / 2;
  for (size_t c = 0; c < ns.size(); ++c) f.metrics.emplace_back(fmt::format("core{}_ns", c), ns[c]);
  f.metrics.emplace_back("imbalance_percent", tmax > 0 ? 100.0 * (tmax - tmin) / tmax : 0.0);
  // Ranked by saving among the others (always reported, even when small); `serialization` stays last.
  auto at = std::find_if(r.findings.begin(), r.findings.end(), [&](const engines::Finding& g) {
    return g.saving_ns < f.saving_ns || g.kind == "serialization";
  });
  r.findings.insert(at, std::move(f));
  return r;
}

// The kernel time (ns; the last core's on a multi-core launch) on `cfg` with `overrides` applied, the PE
// helpers of `free_pe` (SimOptions::free_pe_helpers) and the foldable passes of the lines `folds`
// (SimOptions::free_folds) taking no time.
double simulated_ns(const Kernel& k, const sim::Config& cfg, const std::vector<std::string>& overrides,
                    uint8_t free_pe, const std::vector<SourceLoc>& folds = {}) {
  const sim::Config c = sim::Config::from_yaml(cfg.to_yaml(), engines::param_schema(), overrides);
  SimOptions opts;
  opts.numerics = false;
  opts.free_pe_helpers = free_pe;
  opts.free_folds = folds;
  if (!k.core_programs.empty()) {
    MultiCoreRun mc(k, c, opts);
    mc.run();
    double t = 0;
    for (int i = 0; i < mc.cores(); ++i) t = std::max(t, sim::ps_to_ns(mc.core(i).total_time()));
    return t;
  }
  Simulator sim(c, opts);
  Lowering::allocate_hbm(k, sim);
  Lowering low(k, sim);
  low.run();
  sim.finish();
  return sim::ps_to_ns(sim.total_time());
}

// Findings whose defect a configuration change, or freeing the instructions it names, removes from the
// cost model, and nothing else: the saving is then measured by simulating the kernel again with the change
// (docs/profiling.md, "How the savings are estimated"). Each is re-simulated on its own (the findings stay
// independent).
struct WhatIf {
  const char* kind;
  std::vector<std::string> overrides;
  const char* what;
  const char* needs = nullptr;  ///< a metric of the finding that must be > 0 (the part the change models)
  uint8_t free_pe = 0;          ///< SimOptions::free_pe_helpers
  const char* needs_zero = nullptr;  ///< a metric of the finding that must be 0 (a part the change would free too)
  bool folds = false;  ///< SimOptions::free_folds: the foldable passes of the finding's lines
};
const std::vector<WhatIf>& what_ifs() {
  static const std::vector<WhatIf> w = {
      {"fp32_matmul", {"tensor.fp32_factor=1", "tensor.fp32_onezero_factor=1"}, "fp32 matmul inputs costed as bf16"},
      {"pe_underfill", {"tensor.mm_min_ii_cycles=1"}, "narrow matmuls costed by their moving columns, as full ones",
       "narrow_matmuls"},
      {"pe_transpose", {}, "the PE-array transposes and the copies of their PSUM results taking no time", nullptr,
       engines::PeResults::kTranspose, "onchip_transposes"},
      {"pe_broadcast", {},
       "the partition broadcasts on the PE array (one-row weights, one-row matmuls, the copies of their PSUM "
       "results) taking no time",
       nullptr, engines::PeResults::kBroadcast},
      {"split_reduce", {}, "the reductions of activations' outputs in passes of their own taking no time", nullptr,
       engines::PeResults::kSplitReduce},
      {"fold_into_activation", {}, "the passes on those lines that only an activation reads taking no time", nullptr,
       0, nullptr, true},
  };
  return w;
}

void resimulate(const Kernel& k, const sim::Config& cfg, engines::AnalysisReport& r) {
  bool changed = false;
  for (engines::Finding& f : r.findings) {
    f.method = "bound";
    for (const WhatIf& w : what_ifs()) {
      if (f.kind != w.kind) continue;
      if (w.needs) {
        const auto m = std::find_if(f.metrics.begin(), f.metrics.end(), [&](const auto& kv) { return kv.first == w.needs; });
        if (m == f.metrics.end() || m->second <= 0) continue;
      }
      // (The re-simulation frees every transpose, those of tiles computed on chip too: then the bound stays.)
      if (w.needs_zero) {
        const auto m =
            std::find_if(f.metrics.begin(), f.metrics.end(), [&](const auto& kv) { return kv.first == w.needs_zero; });
        if (m != f.metrics.end() && m->second > 0) continue;
      }
      std::vector<SourceLoc> folds;
      if (w.folds)
        for (const engines::LineRef& l : f.lines) folds.push_back(l.loc);
      const double t = simulated_ns(k, cfg, w.overrides, w.free_pe, folds);
      std::string o;
      for (const auto& s : w.overrides) o += (o.empty() ? "" : " ") + s;
      const std::string how = o.empty() ? fmt::format("re-simulated ({}): {:.1f} ns", w.what, t)
                                        : fmt::format("re-simulated ({}: {}): {:.1f} ns", w.what, o, t);
      // Freeing PE helpers reorders the rest: a list schedule can come out no faster (or slower) without
      // them, where the fix, which also changes the data flow (a stride-0 or transposing DMA instead), measures a
      // gain. The bound then stays. A split reduction's fix is what the re-simulation runs (the activation
      // accumulates the sum at no cost of its own): no gain there is none in the fix either (the softmax
      // tutorial's nl kernel, DMA-bound: 0.0 us re-simulated, 0.0 us saved, 4.6 us the bound).
      if ((w.free_pe & (engines::PeResults::kTranspose | engines::PeResults::kBroadcast)) && t >= r.total_ns) {
        f.method = fmt::format("bound; {} saves only {:.1f} ns", how, std::max(0.0, r.total_ns - t));
        continue;
      }
      f.saving_ns = std::max(0.0, r.total_ns - t);
      f.method = how;
      f.metrics.emplace_back("resimulated_ns", t);
      changed = true;
    }
  }
  if (changed) engines::rank_findings(r, r.total_ns * cfg.get_real("analysis.min_saving_percent") / 100.0);
}

// The single_buffer finding's advice, a tile allocated in the loop body for rotating buffers, does not help a tile
// that is there already and got one buffer because SBUF cannot hold two of every loop tile (the allocator's
// fallback, AllocationPlan::sbuf_deepen non-empty). The detail then says so and names the automatic SBUF loop tiles
// the run kept with one buffer (Lowering::placements: after the placement search). The softmax tutorial's nl kernel
// at 1024 x 8192 fp32 (four [128, 8192] fp32 tiles in its loop body) was told to allocate them in the loop body.
void note_sbuf_room(const Kernel& k, const AllocationPlan& plan, const std::vector<TilePlacement>& placed,
                    const engines::CoreParams& p, engines::AnalysisReport& r) {
  if (plan.sbuf_deepen.empty()) return;
  std::vector<std::string> names;
  for (const TilePlacement& tp : placed) {
    if (tp.tensor < 0 || static_cast<size_t>(tp.tensor) >= k.tensors.size() || tp.bufs != 1) continue;
    const Tensor& t = k.tensors[static_cast<size_t>(tp.tensor)];
    const auto id = static_cast<size_t>(tp.tensor);
    if (t.space == isa::Space::kSbuf && t.bufs == 0 && t.address < 0 && id < plan.lifetimes.size() &&
        plan.lifetimes[id].in_loop)
      names.push_back("'" + t.name + "'");
  }
  if (names.empty()) return;
  constexpr size_t kShown = 6;
  const auto shown = static_cast<std::ptrdiff_t>(std::min(kShown, names.size()));
  const std::string listed =
      fmt::format("{}{}", fmt::join(names.begin(), names.begin() + shown, ", "),
                  names.size() > kShown ? fmt::format(" and {} more", names.size() - kShown) : std::string());
  for (engines::Finding& f : r.findings) {
    if (f.kind != "single_buffer") continue;
    f.detail += fmt::format(
        " SBUF cannot hold two buffers of every tile allocated in a loop body here (peak use {} of {} bytes per "
        "partition): the compiler model gave {} one buffer ({}). For those, allocating in the loop body is not "
        "enough: make room first -- fewer columns per tile, bf16 intermediates, or fewer intermediate tiles (a "
        "subtraction or scaling folded into an activation's bias= / scale=, a sum into its reduce_res=).",
        plan.sbuf_peak, p.mem.sbuf_bytes_per_partition,
        names.size() == 1 ? std::string("one loop tile") : fmt::format("{} loop tiles", names.size()), listed);
    f.metrics.emplace_back("one_buffer_loop_tiles", static_cast<double>(names.size()));
  }
}

}  // namespace

engines::AnalysisReport analyze_kernel(const Kernel& k, const sim::Config& cfg) {
  SimOptions opts;
  opts.numerics = false;  // timing does not depend on the data
  opts.dependency_bound = true;
  engines::AnalysisReport r;
  if (!k.core_programs.empty()) {
    r = analyze_multicore(k, cfg, opts);
  } else {
    Simulator sim(cfg, opts);
    AllocationPlan plan;
    verify_kernel(k, sim.params(), &plan);
    Lowering::allocate_hbm(k, sim);
    engines::Analyzer analyzer(sim);
    Lowering low(k, sim, &plan);
    low.run();
    sim.finish();
    r = analyzer.report(k.name);
    note_sbuf_room(k, plan, low.placements(), sim.params(), r);
  }
  resimulate(k, cfg, r);
  return r;
}

}  // namespace nsim::frontend
