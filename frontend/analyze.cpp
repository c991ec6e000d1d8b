#include "frontend/analyze.h"

#include <fmt/format.h>

#include <algorithm>
#include <memory>

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

}  // namespace

engines::AnalysisReport analyze_kernel(const Kernel& k, const sim::Config& cfg) {
  SimOptions opts;
  opts.numerics = false;  // timing does not depend on the data
  opts.dependency_bound = true;
  if (!k.core_programs.empty()) return analyze_multicore(k, cfg, opts);
  Simulator sim(cfg, opts);
  verify_kernel(k, sim.params());
  Lowering::allocate_hbm(k, sim);
  engines::Analyzer analyzer(sim);
  Lowering low(k, sim);
  low.run();
  sim.finish();
  return analyzer.report(k.name);
}

}  // namespace nsim::frontend
