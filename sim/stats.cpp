#include "sim/stats.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>

#include "sim/error.h"
#include "sim/json_out.h"

namespace nsim::sim {

void StatsRegistry::add(std::string name, double value, std::string unit, std::string description) {
  entries_.push_back({std::move(name), value, std::move(unit), std::move(description)});
}

bool StatsRegistry::has(const std::string& name) const {
  return std::any_of(entries_.begin(), entries_.end(), [&](const StatEntry& e) { return e.name == name; });
}

double StatsRegistry::get(const std::string& name) const {
  for (const auto& e : entries_)
    if (e.name == name) return e.value;
  throw Error(ErrorCode::kInternal, fmt::format("no stat named '{}'", name));
}

Json StatsRegistry::json(bool with_descriptions) const {
  // Dotted names become nested objects in order of first appearance; a leaf is {"value", "unit"[,
  // "description"]}. A name that is also the prefix of another keeps its leaf (the longer name is dropped).
  auto is_leaf = [](const Json& j) { return j.is_object() && j.contains("unit") && j["unit"].is_string(); };
  Json root = Json::object();
  for (const auto& e : entries_) {
    Json* n = &root;
    size_t pos = 0;
    bool dropped = false;
    for (size_t dot = e.name.find('.'); dot != std::string::npos; pos = dot + 1, dot = e.name.find('.', pos)) {
      n = &(*n)[e.name.substr(pos, dot - pos)];
      if (is_leaf(*n)) {
        dropped = true;
        break;
      }
    }
    if (dropped) continue;
    Json leaf = Json::object();
    leaf["value"] = json_number(e.value);
    leaf["unit"] = e.unit;
    if (with_descriptions) leaf["description"] = e.description;
    (*n)[e.name.substr(pos)] = std::move(leaf);
  }
  return root;
}

std::string StatsRegistry::to_json(bool with_descriptions) const { return dump_json(json(with_descriptions), 2) + "\n"; }

std::string StatsRegistry::to_text() const {
  size_t w = 0;
  for (const auto& e : entries_) w = std::max(w, e.name.size());
  std::string out;
  for (const auto& e : entries_) out += fmt::format("{:<{}}  {:>14.6g} {}\n", e.name, w, e.value, e.unit);
  return out;
}

namespace {
// "1234567" -> "1,234,567" (digits of an integer, optionally signed).
std::string group_thousands(const std::string& digits) {
  const size_t first = (!digits.empty() && digits[0] == '-') ? 1 : 0;
  std::string out = digits.substr(0, first);
  const size_t n = digits.size() - first;
  for (size_t i = 0; i < n; ++i) {
    if (i && (n - i) % 3 == 0) out += ',';
    out += digits[first + i];
  }
  return out;
}

// Table group of a stat: "summary" for top-level names, "engine.<e>" for per-engine stats, else the
// first component.
std::string group_of(const std::string& name) {
  const size_t dot = name.find('.');
  if (dot == std::string::npos) return "summary";
  if (name.compare(0, dot, "engine") == 0) {
    const size_t dot2 = name.find('.', dot + 1);
    if (dot2 != std::string::npos) return name.substr(0, dot2);
  }
  return name.substr(0, dot);
}
}  // namespace

std::string StatsRegistry::format_value(double v, const std::string& unit) {
  if (!std::isfinite(v)) return "-";
  const bool integral = v == std::floor(v) && std::fabs(v) < 9e15;
  if (unit == "ns") return fmt::format("{:.3f}", v);
  if (unit == "%") return fmt::format("{:.2f}", v);
  if (unit == "count" || unit == "bytes") {
    if (integral) return group_thousands(fmt::format("{}", static_cast<int64_t>(v)));
    return fmt::format("{:.2f}", v);
  }
  if (unit == "cycles") return integral ? group_thousands(fmt::format("{}", static_cast<int64_t>(v))) : fmt::format("{:.1f}", v);
  if (unit == "flops" || unit == "flops/s") {
    if (integral && std::fabs(v) < 1e6) return fmt::format("{}", static_cast<int64_t>(v));
    return fmt::format("{:.4e}", v);
  }
  if (unit == "flops/byte") return fmt::format("{:.3f}", v);
  return fmt::format("{:.6g}", v);
}

std::string StatsRegistry::to_table() const {
  std::vector<std::string> groups;
  std::map<std::string, std::vector<size_t>> members;
  for (size_t i = 0; i < entries_.size(); ++i) {
    const std::string g = group_of(entries_[i].name);
    auto it = members.find(g);
    if (it == members.end()) {
      groups.push_back(g);
      it = members.emplace(g, std::vector<size_t>{}).first;
    }
    it->second.push_back(i);
  }
  std::vector<std::string> values(entries_.size());
  size_t wn = 4, wv = 5, wu = 4;
  for (size_t i = 0; i < entries_.size(); ++i) {
    values[i] = format_value(entries_[i].value, entries_[i].unit);
    wn = std::max(wn, entries_[i].name.size() + 2);
    wv = std::max(wv, values[i].size());
    wu = std::max(wu, entries_[i].unit.size());
  }
  std::string out = fmt::format("{:<{}}  {:>{}}  {:<{}}  {}\n", "stat", wn, "value", wv, "unit", wu, "description");
  out += std::string(wn + wv + wu + 6 + 11, '-') + "\n";
  for (const std::string& g : groups) {
    out += g + "\n";
    for (size_t i : members[g]) {
      const StatEntry& e = entries_[i];
      std::string row = fmt::format("  {:<{}}  {:>{}}  {:<{}}  {}", e.name, wn - 2, values[i], wv, e.unit, wu, e.description);
      while (!row.empty() && row.back() == ' ') row.pop_back();
      out += row + "\n";
    }
  }
  return out;
}

}  // namespace nsim::sim
