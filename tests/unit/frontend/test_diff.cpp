// Profile comparison (frontend/diff.h): deltas, line matching and sorting, text/JSON output, errors.
#include <catch2/catch.hpp>

#include <fmt/format.h>

#include <cmath>
#include <string>
#include <vector>

#include "frontend/diff.h"
#include "frontend/json.h"
#include "sim/error.h"

using namespace nsim;
using namespace nsim::frontend;

namespace {

struct Line {
  std::string src;
  int instructions;
  double time_ns;
};

std::string leaf(double v, const char* unit) { return fmt::format(R"({{"value": {}, "unit": "{}", "description": ""}})", v, unit); }

// A stats JSON in the format of `nsim run --stats`: total time, vector active time and instruction
// count, the busiest DMA engine, HBM bytes read, and some source lines. Other engines are idle.
std::string stats_json(double total, double vector_active, int vector_instrs, double dma_active, double hbm_read,
                       const std::vector<Line>& lines, const std::string& config = "trn2") {
  std::string engines;
  for (const char* e : {"tensor", "vector", "scalar", "gpsimd", "sync"}) {
    const bool v = std::string(e) == "vector";
    engines += fmt::format(R"({}"{}": {{"active_time": {}, "instruction_count": {}}})", engines.empty() ? "" : ", ", e,
                           leaf(v ? vector_active : 0, "ns"), leaf(v ? vector_instrs : 0, "count"));
  }
  std::string ls;
  for (const auto& l : lines)
    ls += fmt::format(R"({}{{"src": "{}", "instructions": {}, "instruction_time_ns": {}}})", ls.empty() ? "" : ", ", l.src,
                      l.instructions, l.time_ns);
  return fmt::format(
      R"({{"kernel": "k", "config": "{}", "timing_only": true, "instructions": {}, "lines": [{}],
"stats": {{"total_time": {}, "engine": {{{}}},
 "dma": {{"transfer_count": {}, "max_engine_active_time": {}}},
 "memory": {{"hbm_read_bytes": {}, "hbm_write_bytes": {}}},
 "flops": {{"hardware": {}, "mfu_estimated_percent": {}}}}}}})",
      config, vector_instrs, ls, leaf(total, "ns"), engines, leaf(2, "count"), leaf(dma_active, "ns"),
      leaf(hbm_read, "bytes"), leaf(hbm_read, "bytes"), leaf(0, "flops"), leaf(0, "%"));
}

const EngineDiff& engine(const ProfileDiff& d, const std::string& name) {
  for (const auto& e : d.engines)
    if (e.name == name) return e;
  FAIL("no engine row " << name);
  return d.engines.front();
}

ErrorCode diff_error(const std::string& a, const std::string& b) {
  try {
    diff_profiles(a, b, "a.json", "b.json");
  } catch (const Error& e) {
    return e.code();
  }
  FAIL("expected an nsim::Error");
  return ErrorCode::kInternal;
}

}  // namespace

TEST_CASE("diff: totals, engines and headline stats", "[diff]") {
  const std::string a = stats_json(1000, 400, 4, 300, 65536, {{"k.py:3", 2, 300}, {"k.py:4", 4, 400}});
  const std::string b = stats_json(1250, 600, 8, 300, 131072, {{"k.py:3", 2, 300}, {"k.py:4", 8, 600}});
  const ProfileDiff d = diff_profiles(a, b, "v1.json", "v2.json");
  CHECK(d.a.label == "v1.json");
  CHECK(d.b.config == "trn2");
  CHECK(d.a.instructions == 4);
  CHECK(d.total_time_ns.a == 1000);
  CHECK(d.total_time_ns.b == 1250);
  CHECK(d.total_time_ns.delta() == 250);
  CHECK(d.total_time_ns.ratio() == Approx(1.25));
  CHECK(d.total_time_ns.percent() == Approx(25));

  REQUIRE(d.engines.size() == 6);  // five engines and the busiest DMA engine
  CHECK(d.engines.front().name == "tensor");
  CHECK(d.engines.back().name == "dma");
  const EngineDiff& v = engine(d, "vector");
  CHECK(v.active_time_ns.delta() == 200);
  CHECK(v.instructions.a == 4);
  CHECK(v.instructions.b == 8);
  CHECK(engine(d, "dma").active_time_ns.delta() == 0);
  CHECK(engine(d, "dma").instructions.b == 2);
  CHECK(engine(d, "tensor").active_time_ns.ratio() == 1.0);  // 0 -> 0 is unchanged, not undefined

  bool seen_hbm = false;
  for (const auto& s : d.stats)
    if (s.name == "memory.hbm_read_bytes") {
      seen_hbm = true;
      CHECK(s.unit == "bytes");
      CHECK(s.value.delta() == 65536);
    }
  CHECK(seen_hbm);
  // dma.transfer_total_bytes is absent on both sides: no row.
  for (const auto& s : d.stats) CHECK(s.name != "dma.transfer_total_bytes");
}

TEST_CASE("diff: lines matched by src, sorted by |delta|, added and removed", "[diff]") {
  const std::string a =
      stats_json(1000, 0, 0, 0, 0, {{"k.py:3", 2, 300}, {"k.py:4", 4, 400}, {"k.py:5", 1, 50}, {"k.py:9", 1, 10}});
  const std::string b =
      stats_json(900, 0, 0, 0, 0, {{"k.py:3", 2, 300}, {"k.py:4", 4, 380}, {"k.py:6", 3, 120}, {"k.py:9", 1, 10}});
  const ProfileDiff d = diff_profiles(a, b);
  REQUIRE(d.lines.size() == 5);
  // |delta|: k.py:6 added 120, k.py:5 removed 50, k.py:4 -20, then the unchanged lines by time.
  CHECK(d.lines[0].src == "k.py:6");
  CHECK(d.lines[0].status == LineStatus::kAdded);
  CHECK(d.lines[0].time_ns.a == 0);
  CHECK(d.lines[0].time_ns.delta() == 120);
  CHECK(d.lines[0].instructions.b == 3);
  CHECK(d.lines[1].src == "k.py:5");
  CHECK(d.lines[1].status == LineStatus::kRemoved);
  CHECK(d.lines[1].time_ns.delta() == -50);
  CHECK(d.lines[2].src == "k.py:4");
  CHECK(d.lines[2].status == LineStatus::kChanged);
  CHECK(d.lines[2].time_ns.delta() == -20);
  CHECK(d.lines[2].time_ns.percent() == Approx(-5));
  CHECK(d.lines[3].src == "k.py:3");
  CHECK(d.lines[3].status == LineStatus::kSame);
  CHECK(d.lines[4].src == "k.py:9");
  CHECK(std::string(line_status_name(d.lines[4].status)) == "same");
}

TEST_CASE("diff: text report words and line limit", "[diff]") {
  const std::string a = stats_json(1000, 400, 4, 300, 65536, {{"k.py:3", 2, 300}, {"k.py:4", 4, 400}});
  const std::string b = stats_json(800, 200, 2, 300, 65536, {{"k.py:3", 2, 300}, {"k.py:7", 2, 200}});
  const ProfileDiff d = diff_profiles(a, b, "v1.json", "v2.json");
  const std::string t = to_text(d, 1);
  INFO(t);
  CHECK(t.find("A: v1.json  (kernel k, trn2, 4 instructions)") != std::string::npos);
  CHECK(t.find("total time  1000.0 ns -> 800.0 ns  -200.0 ns  -20.0% faster  (B/A = 0.800x)") != std::string::npos);
  CHECK(t.find("-50.0% faster") != std::string::npos);  // vector 400 -> 200
  CHECK(t.find("(1 of 3)") != std::string::npos);
  CHECK(t.find("k.py:4") != std::string::npos);  // removed, the largest change
  CHECK(t.find("removed") != std::string::npos);
  CHECK(t.find("k.py:7") == std::string::npos);  // beyond max_lines
  const std::string all = to_text(d, -1);
  CHECK(all.find("k.py:7") != std::string::npos);
  CHECK(all.find("added") != std::string::npos);
  CHECK(to_text(diff_profiles(b, a), 0).find("+25.0% slower") != std::string::npos);
}

TEST_CASE("diff: JSON output", "[diff]") {
  const std::string a = stats_json(1000, 400, 4, 300, 65536, {{"k.py:3", 2, 300}});
  const std::string b = stats_json(1100, 0, 0, 300, 65536, {{"k.py:4", 1, 100}}, "trn1");
  const json::Value j = json::parse(to_json(diff_profiles(a, b, "x", "y")));
  CHECK(j.find("a")->find("label")->as_string() == "x");
  CHECK(j.find("b")->find("config")->as_string() == "trn1");
  CHECK(j.find("total_time_ns")->find("delta")->as_double() == 100);
  CHECK(j.find("total_time_ns")->find("ratio")->as_double() == Approx(1.1));
  const json::Value* vec = j.find("engines")->find("vector");
  REQUIRE(vec);
  CHECK(vec->find("active_time_ns")->find("delta")->as_double() == -400);
  CHECK(vec->find("instructions")->find("b")->as_double() == 0);
  // 0 -> 0 is a ratio of 1; 0 -> x (an added line) has none: null
  CHECK(j.find("engines")->find("tensor")->find("active_time_ns")->find("ratio")->as_double() == 1.0);
  const json::Value* hbm = j.find("stats")->find("memory.hbm_read_bytes");
  REQUIRE(hbm);
  CHECK(hbm->find("unit")->as_string() == "bytes");
  const json::Value& lines = *j.find("lines");
  REQUIRE(lines.size() == 2);
  CHECK(lines[0].find("src")->as_string() == "k.py:3");  // removed 300 > added 100
  CHECK(lines[0].find("status")->as_string() == "removed");
  CHECK(lines[1].find("status")->as_string() == "added");
  CHECK(lines[1].find("instruction_time_ns")->find("ratio")->is_null());
}

TEST_CASE("diff: a stat missing on one side has no delta", "[diff]") {
  const std::string a = R"({"stats": {"total_time": {"value": 10}}})";
  const std::string b = R"({"stats": {"total_time": {"value": 12}, "engine": {"vector": {"active_time": {"value": 5}}}}})";
  const ProfileDiff d = diff_profiles(a, b);
  CHECK(d.total_time_ns.delta() == 2);
  CHECK(d.lines.empty());
  REQUIRE(d.engines.size() == 1);
  CHECK(d.engines[0].name == "vector");
  CHECK_FALSE(d.engines[0].active_time_ns.has_a());
  CHECK(std::isnan(d.engines[0].active_time_ns.delta()));
  CHECK(to_text(d, 20).find("none recorded") != std::string::npos);
  CHECK(json::parse(to_json(d)).find("engines")->find("vector")->find("active_time_ns")->find("delta")->is_null());
}

TEST_CASE("diff: malformed input raises coded errors naming the side", "[diff]") {
  const std::string ok = stats_json(1000, 0, 0, 0, 0, {});
  CHECK(diff_error("{", ok) == ErrorCode::kJsonSyntax);
  CHECK(diff_error(ok, "not json") == ErrorCode::kJsonSyntax);
  CHECK(diff_error("[1, 2]", ok) == ErrorCode::kBadStatsFile);
  CHECK(diff_error(R"({"nsim_kernel": 1, "tensors": []})", ok) == ErrorCode::kBadStatsFile);  // a kernel, not stats
  CHECK(diff_error(R"({"stats": 3})", ok) == ErrorCode::kBadStatsFile);
  CHECK(diff_error(R"({"stats": {}})", ok) == ErrorCode::kBadStatsFile);  // no total_time
  CHECK(diff_error(R"({"stats": {"total_time": {"value": "fast"}}})", ok) == ErrorCode::kBadStatsFile);
  CHECK(diff_error(R"({"stats": {"total_time": 5}})", ok) == ErrorCode::kBadStatsFile);
  const std::string t = R"("stats": {"total_time": {"value": 5}})";
  CHECK(diff_error("{" + t + R"(, "lines": {}})", ok) == ErrorCode::kBadStatsFile);
  CHECK(diff_error("{" + t + R"(, "lines": [{"src": "k.py:1", "instructions": 1}]})", ok) == ErrorCode::kBadStatsFile);
  CHECK(diff_error("{" + t + R"(, "lines": [{"src": 1, "instructions": 1, "instruction_time_ns": 2}]})", ok) ==
        ErrorCode::kBadStatsFile);
  CHECK(diff_error("{" + t + R"(, "kernel": 7})", ok) == ErrorCode::kBadStatsFile);
  try {
    diff_profiles(ok, R"({"stats": {}})", "old.json", "new.json");
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find(error_code_str(ErrorCode::kBadStatsFile) + ": new.json:1:") == 0);
    CHECK(e.message().find("total_time") != std::string::npos);
  }
}
