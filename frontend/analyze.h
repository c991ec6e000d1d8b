#pragma once
/// `nsim analyze` / `Profile.analyze()`: simulate a kernel timing-only with the analyzer attached.
#include "engines/analysis/analyzer.h"
#include "frontend/ir.h"
#include "sim/config.h"

namespace nsim::frontend {

/// Verify, lower and simulate `k` (no numerics) on `cfg`, and return the analysis report.
engines::AnalysisReport analyze_kernel(const Kernel& k, const sim::Config& cfg);

}  // namespace nsim::frontend
