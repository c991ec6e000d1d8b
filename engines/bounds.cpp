#include "engines/bounds.h"

#include <algorithm>

#include "isa/isa.h"

namespace nsim::engines {

const std::vector<std::pair<std::string, std::string>>& bound_resources() {
  static const std::vector<std::pair<std::string, std::string>> r = [] {
    std::vector<std::pair<std::string, std::string>> v;
    for (int e = 0; e < isa::kNumEngines; ++e)
      v.emplace_back(std::string(isa::engine_name(static_cast<isa::Engine>(e))),
                     "busy time of this engine (union of its instructions' issue intervals)");
    v.emplace_back("dma", "busy time of the busiest DMA engine");
    v.emplace_back("hbm", "HBM bytes read and written: at hbm.bw, and at least at what the DMA engines move "
                          "(dma.engines x dma.engine_bw, stores x dma.store_bw_factor)");
    return v;
  }();
  return r;
}

double hbm_time_ns(const CoreParams& p, double read, double write) {
  const double engines = p.dma_engine_bw * p.dma_engines;  // bytes per ns
  return std::max((read + write) / p.hbm_bw, read / engines + write / (engines * p.dma_store_bw_factor));
}

BoundVerdict bound_verdict(const std::function<double(const std::string&)>& stat) {
  BoundVerdict v;
  for (const auto& [name, what] : bound_resources()) v.bounds.push_back({name, stat("bound." + name + ".time"), what});
  std::stable_sort(v.bounds.begin(), v.bounds.end(),
                   [](const ResourceBound& a, const ResourceBound& b) { return a.ns > b.ns; });
  // DMA engines paced by HBM (hbm.bw below what they could move) are busy exactly as long as HBM needs: the two
  // bounds tie but for rounding, and HBM is the resource that sets the time (an architect's sweep was told "dma" at
  // a low hbm.bw, where more DMA engines change nothing).
  if (v.bounds.size() > 1 && v.bounds[0].name == "dma")
    for (size_t i = 1; i < v.bounds.size(); ++i)
      if (v.bounds[i].name == "hbm" && v.bounds[i].ns >= v.bounds[0].ns * (1 - 1e-6)) {
        std::rotate(v.bounds.begin(), v.bounds.begin() + static_cast<std::ptrdiff_t>(i),
                    v.bounds.begin() + static_cast<std::ptrdiff_t>(i) + 1);
        break;
      }
  const double total = stat("total_time");
  v.latency_threshold_percent = stat("bound.latency_threshold_percent");
  v.top_share_percent = total > 0 ? 100.0 * v.bounds.front().ns / total : 0.0;
  v.verdict = total > 0 && v.top_share_percent < v.latency_threshold_percent ? std::string("latency")
                                                                              : v.bounds.front().name;
  return v;
}

}  // namespace nsim::engines
