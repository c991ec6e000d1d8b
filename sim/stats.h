#pragma once
/// Stats registry: named, described values with units, dumped as a tree (JSON) or a table (text).
/// Filled once at the end of a run from the engines' plain counters; never touched in the hot loop.
#include <nlohmann/json_fwd.hpp>

#include <string>
#include <vector>

namespace nsim::sim {

struct StatEntry {
  std::string name;  ///< dotted path, e.g. "engine.vector.active_time"
  double value = 0;
  std::string unit;  ///< "ns", "cycles", "bytes", "flops", "%", "count"
  std::string description;
};

class StatsRegistry {
 public:
  void add(std::string name, double value, std::string unit, std::string description);
  const std::vector<StatEntry>& entries() const { return entries_; }
  /// Value by exact name; throws nsim::Error(kInternal) if absent.
  double get(const std::string& name) const;
  bool has(const std::string& name) const;
  /// Nested JSON object: {"engine": {"vector": {"active_time": {"value":..,"unit":..,"description":..}}}},
  /// members in order of first appearance; values as sim::json_number() (integers exact, NaN/inf null).
  nlohmann::ordered_json json(bool with_descriptions = true) const;
  /// json() as text, indented by 2, with a final newline.
  std::string to_json(bool with_descriptions = true) const;
  /// Flat, aligned "name  value unit" table.
  std::string to_text() const;
  /// Readable table grouped by name prefix (the leaf-less names under "summary", "engine.<e>" per
  /// engine, otherwise the first component: dma, memory, flops, ...), groups in order of first
  /// appearance: one row per stat with its full name, the value formatted for its unit (ns with 3
  /// decimals, % with 2, counts and bytes as integers with thousands separators, FLOPs in 4
  /// significant digits), the unit and the description. Non-finite values show as "-".
  std::string to_table() const;
  /// The value as to_table() prints it.
  static std::string format_value(double value, const std::string& unit);

 private:
  std::vector<StatEntry> entries_;
};

}  // namespace nsim::sim
