#include "sim/json_out.h"

#include <cmath>
#include <cstdint>

namespace nsim::sim {

bool json_integral(double v) { return std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 0x1p53; }

Json json_number(double v) {
  if (!std::isfinite(v)) return nullptr;
  if (json_integral(v)) return static_cast<int64_t>(v);
  return v;
}

Json json_ns(double ns) { return std::isfinite(ns) ? json_number(std::round(ns * 1e3) / 1e3) : Json(); }

std::string dump_json(const Json& j, int indent) { return j.dump(indent, ' ', false, Json::error_handler_t::replace); }

}  // namespace nsim::sim
