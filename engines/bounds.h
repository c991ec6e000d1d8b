#pragma once
/// The kernel's bound: one verdict that `nsim run`, `nsim analyze`, the Python Profile and the roofline
/// plot all report. Each resource's bound is the time the kernel would take if only that resource
/// counted — an engine's busy time (the union of its issue intervals), the busiest DMA engine's busy
/// time, the HBM traffic at the bandwidth the DMA engines can reach — kept in the stats as
/// `bound.<resource>.time`. The verdict is the resource with the largest bound, or "latency" when even
/// that one is busy for less than `analysis.latency_bound_percent` of the kernel time (the engines
/// mostly wait on each other: dependencies and fixed latencies, not throughput, set the time).
#include <functional>
#include <string>
#include <vector>

#include "engines/params.h"
#include "sim/stats.h"

namespace nsim::engines {

struct ResourceBound {
  std::string name;  ///< "tensor", "vector", "scalar", "gpsimd", "sync", "dma", "hbm"
  double ns = 0;
  std::string what;  ///< how it is measured
};

struct BoundVerdict {
  std::vector<ResourceBound> bounds;  ///< largest first
  std::string verdict;                ///< a resource name, or "latency"
  double top_share_percent = 0;       ///< the largest bound as a share of the kernel time
  double latency_threshold_percent = 0;
};

/// The resources, in stats order, with how each bound is measured.
const std::vector<std::pair<std::string, std::string>>& bound_resources();

/// The least time (ns) to move `read` bytes from HBM and `write` bytes to it: HBM carries both at hbm.bw, and the
/// DMA engines read at dma.engines x dma.engine_bw and write x dma.store_bw_factor faster -- the larger of the two.
/// (With the read rate alone for the writes, trn2 at hbm.bw=725GB/s reported a bound above the kernel's time.)
double hbm_time_ns(const CoreParams& p, double read, double write);

/// The verdict from a run's stats (any source that answers stat(name) for the `bound.*` stats and
/// `total_time`): the one implementation every tool calls.
BoundVerdict bound_verdict(const std::function<double(const std::string&)>& stat);
inline BoundVerdict bound_verdict(const sim::StatsRegistry& st) {
  return bound_verdict([&](const std::string& n) { return st.get(n); });
}

}  // namespace nsim::engines
