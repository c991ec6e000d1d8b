#include "frontend/diff.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <map>
#include <utility>

#include "frontend/json.h"
#include "sim/error.h"
#include "sim/json_out.h"

namespace nsim::frontend {

namespace {

using json::Value;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// The engines of Simulator::stats() in the order `nsim run` prints them.
constexpr std::array<const char*, 5> kEngines = {"tensor", "vector", "scalar", "gpsimd", "sync"};

// Headline stats: what usually explains a change of total time (traffic, work, efficiency, DMA count).
constexpr std::array<const char*, 6> kHeadline = {"memory.hbm_read_bytes", "memory.hbm_write_bytes",
                                                  "dma.transfer_count",    "dma.transfer_total_bytes",
                                                  "flops.hardware",        "flops.mfu_estimated_percent"};

// Column widths of the text report: numbers up to ~1e11 ns (100 s) with one decimal still align.
constexpr int kNumWidth = 14;
constexpr int kChangeWidth = 16;
constexpr int kCountWidth = 10;

// A stats file that is not what 'nsim run --stats' writes (E416).
[[noreturn]] void fail(const std::string& label, const Value& at, const std::string& msg) {
  throw Error(ErrorCode::kBadStatsFile, fmt::format("{}:{}:{}: {}", label, at.line(), at.column(), msg));
}

// The parsed stats JSON of one side plus its label, for lookups with good messages.
struct Side {
  std::string label;
  Value root;

  // Value of a dotted stat name ("engine.vector.active_time"); NaN when absent. The first unit found
  // is stored in *unit (when given and still empty).
  double stat(std::string_view name, std::string* unit = nullptr) const {
    const Value* n = root.find("stats");
    size_t pos = 0;
    while (n && pos <= name.size()) {
      size_t dot = name.find('.', pos);
      if (dot == std::string_view::npos) dot = name.size();
      n = n->find(name.substr(pos, dot - pos));
      pos = dot + 1;
    }
    if (!n) return kNaN;
    const Value* v = n->find("value");
    if (!n->is_object() || !v || !v->is_number())
      fail(label, *n,
           fmt::format("stats.{}: expected a stat {{\"value\": number, \"unit\": ..., \"description\": ...}}, found {}",
                       name, v ? fmt::format("\"value\" as {}", v->type_name()) : n->type_name()));
    const Value* u = n->find("unit");
    if (unit && unit->empty() && u && u->is_string()) *unit = u->as_string();
    return v->as_double();
  }
};

Side load_side(std::string_view text, const std::string& label, ProfileSide& out) {
  Side s{label, json::parse(text, label)};
  const Value& r = s.root;
  if (!r.is_object())
    fail(label, r,
         fmt::format("expected a stats JSON object (written by 'nsim run --stats'), found {}", r.type_name()));
  const Value* stats = r.find("stats");
  if (!stats)
    fail(label, r,
         "missing member 'stats': not a stats JSON (write one with 'nsim run kernel.json --stats FILE')");
  if (!stats->is_object())
    fail(label, *stats, fmt::format("'stats' must be an object, found {}", stats->type_name()));
  if (std::isnan(s.stat("total_time")))
    fail(label, *stats, "missing stat 'total_time' in 'stats'");
  out.label = label;
  for (auto [key, dst] : {std::pair{"kernel", &out.kernel}, std::pair{"config", &out.config}})
    if (const Value* v = r.find(key)) {
      if (!v->is_string()) fail(label, *v, fmt::format("'{}' must be a string", key));
      *dst = v->as_string();
    }
  if (const Value* v = r.find("instructions")) {
    if (!v->is_number()) fail(label, *v, "'instructions' must be a number");
    out.instructions = v->as_double();
    out.has_instructions = true;
  }
  return s;
}

struct LineTotals {
  double time_ns = 0, instructions = 0;
};

// src -> totals; lines with the same src (possible in hand-edited files) are summed.
std::map<std::string, LineTotals> load_lines(const Side& s) {
  std::map<std::string, LineTotals> out;
  const Value* lines = s.root.find("lines");
  if (!lines) return out;
  if (!lines->is_array())
    fail(s.label, *lines, fmt::format("'lines' must be an array, found {}", lines->type_name()));
  for (size_t i = 0; i < lines->size(); ++i) {
    const Value& l = (*lines)[i];
    if (!l.is_object()) fail(s.label, l, fmt::format("lines[{}] must be an object", i));
    const Value* src = l.find("src");
    const Value* t = l.find("instruction_time_ns");
    const Value* n = l.find("instructions");
    for (auto [key, v] : {std::pair{"src", src}, std::pair{"instruction_time_ns", t}, std::pair{"instructions", n}})
      if (!v) fail(s.label, l, fmt::format("lines[{}]: missing member '{}'", i, key));
    if (!src->is_string()) fail(s.label, *src, fmt::format("lines[{}].src must be a string", i));
    if (!t->is_number() || !n->is_number())
      fail(s.label, t->is_number() ? *n : *t,
           fmt::format("lines[{}]: 'instruction_time_ns' and 'instructions' must be numbers", i));
    LineTotals& acc = out[src->as_string()];
    acc.time_ns += t->as_double();
    acc.instructions += n->as_double();
  }
  return out;
}

// ---------------------------------------------------------------- text formatting

enum class Kind { kTime, kCount, kPercent, kOther };

Kind kind_of_unit(const std::string& unit) {
  if (unit == "ns") return Kind::kTime;
  if (unit == "count" || unit == "bytes") return Kind::kCount;
  if (unit == "%") return Kind::kPercent;
  return Kind::kOther;
}

std::string num(double v, Kind k, bool sign = false) {
  if (std::isnan(v)) return "-";
  const char* plus = sign && v > 0 ? "+" : "";
  switch (k) {
    case Kind::kTime: return fmt::format("{}{:.1f}", plus, v);
    case Kind::kCount: return fmt::format("{}{:.0f}", plus, v);
    case Kind::kPercent: return fmt::format("{}{:.2f}", plus, v);
    case Kind::kOther: break;
  }
  return fmt::format("{}{:.4g}", plus, v);
}

// "+21.5% slower", "-3.0% faster", "same", "new" (a = 0), "-" (a side missing).
std::string change(const DiffValue& v, Kind k) {
  if (!v.has_a() || !v.has_b()) return "-";
  const double d = v.delta();
  if (d == 0) return "same";
  const char* word = k == Kind::kTime ? (d < 0 ? "faster" : "slower") : (d < 0 ? "lower" : "higher");
  if (v.a == 0) return fmt::format("new, {}", word);
  // Small changes keep two significant digits rather than printing as "+0.0%".
  constexpr double kSmallPercent = 0.1;
  const double p = v.percent();
  return std::abs(p) >= kSmallPercent ? fmt::format("{:+.1f}% {}", p, word) : fmt::format("{:+.2g}% {}", p, word);
}

std::string side_line(char name, const ProfileSide& s) {
  std::string details;
  auto add = [&](const std::string& x) { details += (details.empty() ? "" : ", ") + x; };
  if (!s.kernel.empty()) add("kernel " + s.kernel);
  if (!s.config.empty()) add(s.config);
  if (s.has_instructions) add(fmt::format("{:.0f} instructions", s.instructions));
  return fmt::format("{}: {}{}\n", name, s.label, details.empty() ? "" : "  (" + details + ")");
}

// ---------------------------------------------------------------- JSON

using sim::Json;
using sim::json_number;  // NaN (a missing side) is null

Json diff_json(const DiffValue& v, bool with_ratio = true) {
  Json o{{"a", json_number(v.a)}, {"b", json_number(v.b)}, {"delta", json_number(v.delta())}};
  if (with_ratio) {
    o["ratio"] = json_number(v.ratio());
    o["percent"] = json_number(v.percent());
  }
  return o;
}

Json side_json(const ProfileSide& s) {
  return Json{{"label", s.label},
              {"kernel", s.kernel},
              {"config", s.config},
              {"instructions", s.has_instructions ? json_number(s.instructions) : Json()}};
}

}  // namespace

bool DiffValue::has_a() const { return !std::isnan(a); }
bool DiffValue::has_b() const { return !std::isnan(b); }

double DiffValue::ratio() const {
  if (!has_a() || !has_b()) return kNaN;
  if (a == 0) return b == 0 ? 1.0 : kNaN;  // 0 -> 0 is "unchanged"; 0 -> x has no finite ratio
  return b / a;
}

double DiffValue::percent() const {
  const double r = ratio();
  return std::isnan(r) ? kNaN : 100.0 * (r - 1.0);
}

const char* line_status_name(LineStatus s) {
  switch (s) {
    case LineStatus::kSame: return "same";
    case LineStatus::kChanged: return "changed";
    case LineStatus::kAdded: return "added";
    case LineStatus::kRemoved: return "removed";
  }
  return "?";
}

ProfileDiff diff_profiles(std::string_view stats_json_a, std::string_view stats_json_b, const std::string& label_a,
                          const std::string& label_b) {
  ProfileDiff d;
  const Side a = load_side(stats_json_a, label_a, d.a);
  const Side b = load_side(stats_json_b, label_b, d.b);
  d.total_time_ns = {a.stat("total_time"), b.stat("total_time")};

  auto both_missing = [](const DiffValue& v) { return !v.has_a() && !v.has_b(); };
  for (const char* e : kEngines) {
    const std::string pre = fmt::format("engine.{}.", e);
    EngineDiff ed{e,
                  {a.stat(pre + "active_time"), b.stat(pre + "active_time")},
                  {a.stat(pre + "instruction_count"), b.stat(pre + "instruction_count")}};
    if (!both_missing(ed.active_time_ns)) d.engines.push_back(std::move(ed));
  }
  // DMA work is spread over many queues and engines; the busiest engine bounds a DMA-bound kernel.
  EngineDiff dma{"dma",
                 {a.stat("dma.max_engine_active_time"), b.stat("dma.max_engine_active_time")},
                 {a.stat("dma.transfer_count"), b.stat("dma.transfer_count")}};
  if (!both_missing(dma.active_time_ns)) d.engines.push_back(std::move(dma));

  for (const char* name : kHeadline) {
    StatDiff sd{name, "", {}};
    sd.value = {a.stat(name, &sd.unit), b.stat(name, &sd.unit)};
    if (!both_missing(sd.value)) d.stats.push_back(std::move(sd));
  }

  const auto la = load_lines(a), lb = load_lines(b);
  std::map<std::string, LineDiff> merged;
  for (const auto& [src, t] : la) {
    LineDiff& l = merged[src];
    l.src = src;
    l.status = LineStatus::kRemoved;
    l.time_ns = {t.time_ns, 0};
    l.instructions = {t.instructions, 0};
  }
  for (const auto& [src, t] : lb) {
    LineDiff& l = merged[src];
    if (l.src.empty()) {
      l = {src, LineStatus::kAdded, {0, t.time_ns}, {0, t.instructions}};
    } else {
      l.time_ns.b = t.time_ns;
      l.instructions.b = t.instructions;
      const bool same = l.time_ns.delta() == 0 && l.instructions.delta() == 0;
      l.status = same ? LineStatus::kSame : LineStatus::kChanged;
    }
  }
  for (auto& [src, l] : merged) d.lines.push_back(std::move(l));
  // Largest change first; among equal changes the line with more time, then by name (deterministic).
  std::stable_sort(d.lines.begin(), d.lines.end(), [](const LineDiff& x, const LineDiff& y) {
    const double dx = std::abs(x.time_ns.delta()), dy = std::abs(y.time_ns.delta());
    if (dx != dy) return dx > dy;
    const double mx = std::max(x.time_ns.a, x.time_ns.b), my = std::max(y.time_ns.a, y.time_ns.b);
    if (mx != my) return mx > my;
    return x.src < y.src;
  });
  return d;
}

std::string to_text(const ProfileDiff& d, int max_lines) {
  std::string out = side_line('A', d.a) + side_line('B', d.b) + "\n";
  const DiffValue& t = d.total_time_ns;
  out += fmt::format("total time  {} ns -> {} ns  {} ns  {}", num(t.a, Kind::kTime), num(t.b, Kind::kTime),
                     num(t.delta(), Kind::kTime, true), change(t, Kind::kTime));
  if (const double r = t.ratio(); std::isfinite(r) && t.delta() != 0) out += fmt::format("  (B/A = {:.3f}x)", r);
  out += "\n\n";

  out += fmt::format("{:<16}{:>{w}}{:>{w}}{:>{w}}  {:<{cw}}{:>{nw}}{:>{nw}}\n", "engine active", "A ns", "B ns",
                     "delta ns", "change", "A instr", "B instr", fmt::arg("w", kNumWidth), fmt::arg("cw", kChangeWidth),
                     fmt::arg("nw", kCountWidth));
  for (const auto& e : d.engines) {
    const DiffValue& v = e.active_time_ns;
    // The dma row is the busiest DMA engine, and its "instructions" are the DMA transfers.
    out += fmt::format("  {:<14}{:>{w}}{:>{w}}{:>{w}}  {:<{cw}}{:>{nw}}{:>{nw}}{}\n",
                       e.name == "dma" ? "dma (busiest)" : e.name, num(v.a, Kind::kTime), num(v.b, Kind::kTime),
                       num(v.delta(), Kind::kTime, true), change(v, Kind::kTime), num(e.instructions.a, Kind::kCount),
                       num(e.instructions.b, Kind::kCount), e.name == "dma" ? " transfers" : "",
                       fmt::arg("w", kNumWidth), fmt::arg("cw", kChangeWidth), fmt::arg("nw", kCountWidth));
  }

  if (!d.stats.empty()) {
    size_t w = std::string_view("stat").size();
    for (const auto& s : d.stats) w = std::max(w, s.name.size() + 2);
    out += fmt::format("\n{:<{sw}}{:>{w}}{:>{w}}{:>{w}}  {}\n", "stat", "A", "B", "delta", "change", fmt::arg("sw", w),
                       fmt::arg("w", kNumWidth));
    for (const auto& s : d.stats) {
      const Kind k = kind_of_unit(s.unit);
      out += fmt::format("  {:<{sw}}{:>{w}}{:>{w}}{:>{w}}  {}\n", s.name, num(s.value.a, k), num(s.value.b, k),
                         num(s.value.delta(), k, true), change(s.value, k), fmt::arg("sw", w - 2),
                         fmt::arg("w", kNumWidth));
    }
  }

  const size_t shown =
      max_lines < 0 ? d.lines.size() : std::min(d.lines.size(), static_cast<size_t>(max_lines));
  if (d.lines.empty()) {
    out += "\nsource lines: none recorded\n";
  } else if (shown > 0) {
    out += fmt::format("\nsource lines, summed instruction time, largest change first ({} of {}):\n", shown,
                       d.lines.size());
    out += fmt::format("{:>{w}}{:>{w}}{:>{w}}  {:<{cw}}{:>{nw}}{:>{nw}}  {}\n", "A ns", "B ns", "delta ns", "change",
                       "A instr", "B instr", "line", fmt::arg("w", kNumWidth), fmt::arg("cw", kChangeWidth),
                       fmt::arg("nw", kCountWidth));
    for (size_t i = 0; i < shown; ++i) {
      const LineDiff& l = d.lines[i];
      const bool in_a = l.status != LineStatus::kAdded, in_b = l.status != LineStatus::kRemoved;
      // A line on one side only shows "-" there; its delta is its whole time.
      const std::string what = in_a && in_b ? change(l.time_ns, Kind::kTime) : line_status_name(l.status);
      out += fmt::format("{:>{w}}{:>{w}}{:>{w}}  {:<{cw}}{:>{nw}}{:>{nw}}  {}\n", in_a ? num(l.time_ns.a, Kind::kTime) : "-",
                         in_b ? num(l.time_ns.b, Kind::kTime) : "-", num(l.time_ns.delta(), Kind::kTime, true), what,
                         in_a ? num(l.instructions.a, Kind::kCount) : "-",
                         in_b ? num(l.instructions.b, Kind::kCount) : "-", l.src.empty() ? "(no source)" : l.src,
                         fmt::arg("w", kNumWidth), fmt::arg("cw", kChangeWidth), fmt::arg("nw", kCountWidth));
    }
  }
  return out;
}

std::string to_json(const ProfileDiff& d) {
  Json root{{"a", side_json(d.a)}, {"b", side_json(d.b)}, {"total_time_ns", diff_json(d.total_time_ns)}};
  Json& engines = root["engines"] = Json::object();
  for (const auto& e : d.engines)
    engines[e.name] = Json{{"active_time_ns", diff_json(e.active_time_ns)}, {"instructions", diff_json(e.instructions, false)}};
  Json& stats = root["stats"] = Json::object();
  for (const auto& s : d.stats) {
    Json o = diff_json(s.value);
    o["unit"] = s.unit;
    stats[s.name] = std::move(o);
  }
  Json& lines = root["lines"] = Json::array();
  for (const auto& l : d.lines)
    lines.push_back(Json{{"src", l.src},
                         {"status", line_status_name(l.status)},
                         {"instruction_time_ns", diff_json(l.time_ns)},
                         {"instructions", diff_json(l.instructions, false)}});
  return sim::dump_json(root, 2) + "\n";
}

}  // namespace nsim::frontend
