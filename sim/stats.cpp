#include "sim/stats.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>

#include "sim/error.h"
#include "sim/trace.h"

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

namespace {
std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  if (v == std::floor(v) && std::fabs(v) < 9e15) return fmt::format("{}", static_cast<int64_t>(v));
  return fmt::format("{:.12g}", v);  // enough digits for ps-resolution times in ns
}
struct Node {
  std::map<std::string, std::unique_ptr<Node>> kids;
  std::vector<std::string> order;
  const StatEntry* leaf = nullptr;
};
void emit(const Node& n, bool desc, std::string& out, int depth) {
  if (n.leaf) {
    out += fmt::format("{{\"value\": {}, \"unit\": \"{}\"", json_number(n.leaf->value), json_escape(n.leaf->unit));
    if (desc) out += fmt::format(", \"description\": \"{}\"", json_escape(n.leaf->description));
    out += "}";
    return;
  }
  out += "{";
  bool first = true;
  for (const auto& k : n.order) {
    out += fmt::format("{}\n{:{}}\"{}\": ", first ? "" : ",", "", (depth + 1) * 2, json_escape(k));
    emit(*n.kids.at(k), desc, out, depth + 1);
    first = false;
  }
  out += fmt::format("\n{:{}}}}", "", depth * 2);
}
}  // namespace

std::string StatsRegistry::to_json(bool with_descriptions) const {
  Node root;
  for (const auto& e : entries_) {
    Node* n = &root;
    size_t pos = 0;
    while (pos <= e.name.size()) {
      size_t dot = e.name.find('.', pos);
      if (dot == std::string::npos) dot = e.name.size();
      std::string part = e.name.substr(pos, dot - pos);
      auto it = n->kids.find(part);
      if (it == n->kids.end()) {
        n->order.push_back(part);
        it = n->kids.emplace(part, std::make_unique<Node>()).first;
      }
      n = it->second.get();
      pos = dot + 1;
    }
    n->leaf = &e;
  }
  std::string out;
  emit(root, with_descriptions, out, 0);
  return out + "\n";
}

std::string StatsRegistry::to_text() const {
  size_t w = 0;
  for (const auto& e : entries_) w = std::max(w, e.name.size());
  std::string out;
  for (const auto& e : entries_) out += fmt::format("{:<{}}  {:>14.6g} {}\n", e.name, w, e.value, e.unit);
  return out;
}

}  // namespace nsim::sim
