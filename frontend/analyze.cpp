#include "frontend/analyze.h"

#include "frontend/lower.h"

namespace nsim::frontend {

engines::AnalysisReport analyze_kernel(const Kernel& k, const sim::Config& cfg) {
  SimOptions opts;
  opts.numerics = false;  // timing does not depend on the data
  opts.dependency_bound = true;
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
