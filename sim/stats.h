#pragma once
/// Stats registry: named, described values with units, dumped as a tree (JSON) or a table (text).
/// Filled once at the end of a run from the engines' plain counters; never touched in the hot loop.
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
  /// Nested JSON object: {"engine": {"vector": {"active_time": {"value":..,"unit":..,"description":..}}}}.
  std::string to_json(bool with_descriptions = true) const;
  /// Flat, aligned "name  value unit" table.
  std::string to_text() const;

 private:
  std::vector<StatEntry> entries_;
};

}  // namespace nsim::sim
