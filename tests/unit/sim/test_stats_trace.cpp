// StatsRegistry (add/get/has, JSON tree, text table) and ChromeTraceWriter (metadata, reorder buffer
// with watermarks, microsecond timestamps, escaping, errors). JSON validity is checked by a small
// hand-written parser (no Python or third-party JSON library).
#include <unistd.h>

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <cctype>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "sim/error.h"
#include "sim/json_out.h"
#include "sim/stats.h"
#include "sim/trace.h"

namespace {

using nsim::Error;
using nsim::ErrorCode;
using nsim::sim::ChromeTraceWriter;
using nsim::sim::dump_json;
using nsim::sim::Json;
using nsim::sim::StatsRegistry;
using nsim::sim::TraceSlice;
namespace fs = std::filesystem;

// ---- a minimal strict JSON validator (RFC 8259 grammar, no extensions) -------------------------
class JsonCheck {
 public:
  explicit JsonCheck(const std::string& s) : s_(s) {}
  bool valid() {
    ws();
    if (!value()) return false;
    ws();
    return i_ == s_.size();
  }

 private:
  const std::string& s_;
  size_t i_ = 0;
  bool eof() const { return i_ >= s_.size(); }
  char peek() const { return eof() ? '\0' : s_[i_]; }
  void ws() {
    while (!eof() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\r' || s_[i_] == '\t')) ++i_;
  }
  bool lit(const char* w) {
    const std::string t(w);
    if (s_.compare(i_, t.size(), t) != 0) return false;
    i_ += t.size();
    return true;
  }
  bool value() {
    switch (peek()) {
      case '{': return object();
      case '[': return array();
      case '"': return string();
      case 't': return lit("true");
      case 'f': return lit("false");
      case 'n': return lit("null");
      default: return number();
    }
  }
  bool object() {
    ++i_;
    ws();
    if (peek() == '}') {
      ++i_;
      return true;
    }
    while (true) {
      ws();
      if (!string()) return false;
      ws();
      if (peek() != ':') return false;
      ++i_;
      ws();
      if (!value()) return false;
      ws();
      if (peek() == ',') {
        ++i_;
        continue;
      }
      if (peek() == '}') {
        ++i_;
        return true;
      }
      return false;
    }
  }
  bool array() {
    ++i_;
    ws();
    if (peek() == ']') {
      ++i_;
      return true;
    }
    while (true) {
      ws();
      if (!value()) return false;
      ws();
      if (peek() == ',') {
        ++i_;
        continue;
      }
      if (peek() == ']') {
        ++i_;
        return true;
      }
      return false;
    }
  }
  bool string() {
    if (peek() != '"') return false;
    ++i_;
    while (!eof()) {
      const auto c = static_cast<unsigned char>(s_[i_++]);
      if (c == '"') return true;
      if (c < 0x20) return false;
      if (c == '\\') {
        if (eof()) return false;
        const char e = s_[i_++];
        if (e == 'u') {
          for (int k = 0; k < 4; ++k)
            if (eof() || !std::isxdigit(static_cast<unsigned char>(s_[i_++]))) return false;
        } else if (std::string("\"\\/bfnrt").find(e) == std::string::npos) {
          return false;
        }
      }
    }
    return false;
  }
  bool digits() {
    const size_t b = i_;
    while (!eof() && std::isdigit(static_cast<unsigned char>(s_[i_]))) ++i_;
    return i_ > b;
  }
  bool number() {
    if (peek() == '-') ++i_;
    if (peek() == '0') {
      ++i_;
    } else if (!digits()) {
      return false;
    }
    if (peek() == '.') {
      ++i_;
      if (!digits()) return false;
    }
    if (peek() == 'e' || peek() == 'E') {
      ++i_;
      if (peek() == '+' || peek() == '-') ++i_;
      if (!digits()) return false;
    }
    return true;
  }
};

bool valid_json(const std::string& s) { return JsonCheck(s).valid(); }

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

/// A trace file's text with a space after every ':' and ',' outside strings (the writer's output is
/// compact), so that the checks below can look for `"key": value` pairs.
std::string read_trace(const fs::path& p) {
  const std::string text = read_file(p);
  std::string out;
  bool in_string = false, escaped = false;
  for (char c : text) {
    out += c;
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == ':' || c == ',') {
      out += ' ';
    }
  }
  return out;
}

/// A unique temp file path, removed on destruction.
struct TempFile {
  fs::path path;
  explicit TempFile(const std::string& tag) {
    static int counter = 0;
    path = fs::temp_directory_path() /
           ("nsim_test_" + tag + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++) + ".json");
    fs::remove(path);
  }
  ~TempFile() {
    std::error_code ec;
    fs::remove(path, ec);
  }
};

/// Values of `"key": <value>` (ts and dur with 6 decimals) in order of appearance, for lines that contain `"ph": "X"`.
std::vector<std::string> x_field(const std::string& text, const std::string& key) {
  std::vector<std::string> out;
  std::istringstream in(text);
  std::string line;
  const std::string k = "\"" + key + "\": ";
  while (std::getline(in, line)) {
    if (line.find("\"ph\": \"X\"") == std::string::npos) continue;
    const size_t p = line.find(k);
    if (p == std::string::npos) {
      out.push_back("<missing>");
      continue;
    }
    size_t e = p + k.size();
    if (line[e] == '"') {
      const size_t q = line.find('"', e + 1);
      out.push_back(line.substr(e + 1, q - e - 1));
    } else {
      size_t f = e;
      while (f < line.size() && line[f] != ',' && line[f] != '}') ++f;
      const std::string num = line.substr(e, f - e);  // times as the microseconds they are, to the ps
      out.push_back(key == "ts" || key == "dur" ? fmt::format("{:.6f}", std::stod(num)) : num);
    }
  }
  return out;
}

StatsRegistry three_entries() {
  StatsRegistry r;
  r.add("engine.vector.active_time", 1500, "ns", "VectorE active");
  r.add("engine.scalar.busy", 2.5, "%", "ScalarE busy");
  r.add("total_time", 42, "ns", "end to end");
  return r;
}

}  // namespace

// ------------------------------------------------------------------------------------------------
// the validator itself (so that the checks below can fail)

TEST_CASE("test JSON validator accepts valid and rejects invalid JSON", "[sim][stats]") {
  CHECK(valid_json("{}"));
  CHECK(valid_json("{\"a\": [1, -2.5e3, true, false, null, \"x\\\"y\\u0001\"]}"));
  CHECK_FALSE(valid_json("{\"a\": 1,}"));
  CHECK_FALSE(valid_json("{\"a\" 1}"));
  CHECK_FALSE(valid_json("[1, 2"));
  CHECK_FALSE(valid_json("{\"a\": nan}"));
  CHECK_FALSE(valid_json("{\"a\": \"tab\there\"}"));
  CHECK_FALSE(valid_json("{\"a\": 01}"));
  CHECK_FALSE(valid_json("{} {}"));
}

// ------------------------------------------------------------------------------------------------
// StatsRegistry

TEST_CASE("StatsRegistry add / get / has", "[sim][stats]") {
  StatsRegistry r = three_entries();
  REQUIRE(r.entries().size() == 3);
  CHECK(r.entries()[0].name == "engine.vector.active_time");
  CHECK(r.entries()[1].unit == "%");
  CHECK(r.entries()[2].description == "end to end");
  CHECK(r.has("engine.vector.active_time"));
  CHECK(r.has("total_time"));
  CHECK_FALSE(r.has("engine.vector"));  // a prefix is not a stat
  CHECK_FALSE(r.has("nope"));
  CHECK(r.get("engine.vector.active_time") == 1500.0);
  CHECK(r.get("engine.scalar.busy") == 2.5);
  CHECK(r.get("total_time") == 42.0);
}

TEST_CASE("StatsRegistry::get of an unknown name throws kInternal", "[sim][stats]") {
  StatsRegistry r = three_entries();
  try {
    (void)r.get("engine.vector");
    FAIL("expected nsim::Error");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kInternal);
    CHECK(e.code_str() == "NSIM-E901");
    CHECK(std::string(e.what()).find("engine.vector") != std::string::npos);
  }
  StatsRegistry empty;
  CHECK_THROWS_AS(empty.get("x"), Error);
}

TEST_CASE("StatsRegistry::to_json nests dotted names", "[sim][stats]") {
  const StatsRegistry r = three_entries();
  const std::string j = r.to_json();
  CHECK(valid_json(j));
  CHECK(j.back() == '\n');
  CHECK(j.find("\"engine.vector") == std::string::npos);  // no flat dotted keys
  const Json d = Json::parse(j);
  // Members in order of first appearance; leaves are {"value", "unit", "description"}.
  const auto keys = [](const Json& o) {
    std::vector<std::string> k;
    for (const auto& [key, v] : o.items()) k.push_back(key);
    return k;
  };
  CHECK(keys(d) == std::vector<std::string>{"engine", "total_time"});
  CHECK(keys(d["engine"]) == std::vector<std::string>{"vector", "scalar"});
  CHECK(keys(d["engine"]["vector"]["active_time"]) == std::vector<std::string>{"value", "unit", "description"});
  CHECK(d["engine"]["vector"]["active_time"] == Json{{"value", 1500}, {"unit", "ns"}, {"description", "VectorE active"}});
  CHECK(d["engine"]["scalar"]["busy"]["value"] == 2.5);
  CHECK(d["total_time"] == Json{{"value", 42}, {"unit", "ns"}, {"description", "end to end"}});
  CHECK(j.find("\"value\": 1500,") != std::string::npos);  // integral values print as integers
}

TEST_CASE("StatsRegistry::to_json without descriptions, escaping, non-finite values", "[sim][stats]") {
  StatsRegistry r;
  r.add("a.b", 0.125, "bytes", "desc \"quoted\"");
  r.add("a.c", std::numeric_limits<double>::quiet_NaN(), "ns", "not a number");
  r.add("a.d", -7, "count", "back\\slash\nnewline");
  r.add("e", 1e20, "flops", "");
  r.add("a.b.inner", 1, "count", "under a leaf: dropped, the leaf is kept");
  const std::string with = r.to_json(true);
  CHECK(valid_json(with));
  CHECK(with.find("desc \\\"quoted\\\"") != std::string::npos);
  const Json d = Json::parse(with);
  CHECK(d["a"]["b"]["description"] == "desc \"quoted\"");
  CHECK(d["a"]["c"]["value"].is_null());
  CHECK(d["a"]["d"]["value"] == -7);
  CHECK(d["a"]["d"]["value"].is_number_integer());
  CHECK(d["a"]["d"]["description"] == "back\\slash\nnewline");
  CHECK(d["a"]["b"]["value"] == 0.125);
  CHECK(d["e"]["value"] == 1e20);
  CHECK_FALSE(d["a"]["b"].contains("inner"));

  const std::string without = r.to_json(false);
  CHECK(valid_json(without));
  CHECK(without.find("description") == std::string::npos);
  CHECK(Json::parse(without)["a"]["b"] == Json{{"value", 0.125}, {"unit", "bytes"}});

  StatsRegistry empty;
  CHECK(valid_json(empty.to_json()));
}

TEST_CASE("StatsRegistry::to_text prints aligned lines", "[sim][stats]") {
  const StatsRegistry r = three_entries();
  const std::string t = r.to_text();
  std::vector<std::string> lines;
  std::istringstream in(t);
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  REQUIRE(lines.size() == 3);
  // name column = longest name (25) + 2 spaces, then a 14-wide right-aligned value, a space, the unit.
  CHECK(lines[0] == "engine.vector.active_time            1500 ns");
  CHECK(lines[1] == "engine.scalar.busy                    2.5 %");
  CHECK(lines[2] == "total_time                             42 ns");
  const size_t col = std::string("engine.vector.active_time").size() + 2 + 14;
  for (const auto& l : lines) {
    INFO(l);
    REQUIRE(l.size() > col);
    CHECK(l[col] == ' ');
    CHECK(l[col - 1] != ' ');  // every value ends in the same column
  }
  CHECK(t.back() == '\n');
}

// ------------------------------------------------------------------------------------------------
// dump_json (every JSON output goes through it or nlohmann's serializer)

TEST_CASE("dump_json escapes quotes, backslashes and control characters and replaces invalid UTF-8", "[sim][trace]") {
  auto str = [](const std::string& s) { return dump_json(Json(s)); };
  CHECK(str("plain text") == "\"plain text\"");
  CHECK(str("a\"b") == "\"a\\\"b\"");
  CHECK(str("a\\b") == "\"a\\\\b\"");
  CHECK(str("l1\nl2") == "\"l1\\nl2\"");
  CHECK(str(std::string("nul\0x", 5)) == "\"nul\\u0000x\"");
  CHECK(str("caf\xc3\xa9") == "\"caf\xc3\xa9\"");  // UTF-8 passes through
  CHECK(str("bad \xff byte") == "\"bad \xef\xbf\xbd byte\"");  // U+FFFD instead of an exception
  CHECK(valid_json(str("q\" b\\ c\n d\x02 \xc3\xa9")));
  CHECK(dump_json(Json{{"b", 1}, {"a", nsim::sim::json_number(2.5)}}) == "{\"b\":1,\"a\":2.5}");  // insertion order
  CHECK(nsim::sim::json_number(std::nan("")).is_null());
  CHECK(nsim::sim::json_number(3.0).is_number_integer());
  CHECK(dump_json(nsim::sim::json_ns(1.23456789)) == "1.235");
}

// ------------------------------------------------------------------------------------------------
// ChromeTraceWriter

TEST_CASE("ChromeTraceWriter writes sorted slices with metadata in microseconds", "[sim][trace]") {
  TempFile tf("trace");
  {
    ChromeTraceWriter w(tf.path.string(), "Core \"0\"");
    w.declare_track(0, "vector");
    w.declare_track(3, "dma \"q0\"");
    w.slice(TraceSlice{0, 3'000'000, 500'000, "c", {}});
    w.slice(TraceSlice{3, 1'500'000, 250'000, "b", {nsim::sim::TraceArg::string("src", "a.py:3")}});
    w.slice(TraceSlice{0, 1'000'000, 1, "a", {}});
    CHECK(w.slices_written() == 0);  // nothing flushed before a watermark
    w.watermark(2'000'000);
    CHECK(w.slices_written() == 2);  // a and b start before 2 us
    // A later slice that starts before the buffered one must still come out in order.
    w.slice(TraceSlice{3, 2'500'000, 1'000, "d \"x\"", {}});
    w.watermark(2'000'000);  // repeated watermark: nothing new
    CHECK(w.slices_written() == 2);
    w.finish();
    CHECK(w.slices_written() == 4);
    w.finish();  // idempotent
    CHECK(w.slices_written() == 4);
  }
  const std::string text = read_trace(tf.path);
  INFO(text);
  REQUIRE_FALSE(text.empty());
  CHECK(text.rfind("{\"displayTimeUnit\"", 0) == 0);
  CHECK(valid_json(text));
  CHECK(text.find("\"name\": \"process_name\", \"args\": {\"name\": \"Core \\\"0\\\"\"}") != std::string::npos);
  CHECK(text.find("\"tid\": 0, \"name\": \"thread_name\", \"args\": {\"name\": \"vector\"}") != std::string::npos);
  CHECK(text.find("\"tid\": 3, \"name\": \"thread_name\", \"args\": {\"name\": \"dma \\\"q0\\\"\"}") != std::string::npos);
  CHECK(text.find("\"tid\": 3, \"name\": \"thread_sort_index\"") != std::string::npos);

  CHECK(x_field(text, "name") == std::vector<std::string>{"a", "b", "d \\", "c"});
  CHECK(x_field(text, "ts") == std::vector<std::string>{"1.000000", "1.500000", "2.500000", "3.000000"});
  CHECK(x_field(text, "dur") == std::vector<std::string>{"0.000001", "0.250000", "0.001000", "0.500000"});
  CHECK(x_field(text, "tid") == std::vector<std::string>{"0", "3", "3", "0"});
  CHECK(text.find("\"ts\": 1.5,") != std::string::npos);
  CHECK(text.find("\"args\": {\"src\": \"a.py:3\"}") != std::string::npos);
  CHECK(text.find("\"name\": \"d \\\"x\\\"\"") != std::string::npos);
  // Every metadata record precedes the first slice.
  CHECK(text.rfind("\"ph\": \"M\"") < text.find("\"ph\": \"X\""));
}

TEST_CASE("append_us writes each time as nlohmann's serializer writes it in microseconds", "[sim][trace]") {
  // Fractional microseconds from 1 us to 10^9 us are written as the decimal t / 10^6 directly when it certainly is
  // the serializer's shortest text (sim/trace.cpp fixed_us), the others by its own formatter: every time must come
  // out as dump_json of the JSON number us(t) -- an integer when whole, else the double t / 10^6. Times of every
  // scale (log-uniform), the ends of the direct range, and runs of consecutive picoseconds.
  auto want = [](int64_t t) {
    return dump_json(t % 1000000 == 0 ? Json(t / 1000000) : Json(static_cast<double>(t) / 1e6));
  };
  std::vector<int64_t> ts = {0, 1, 999'999, 1'000'000, 1'000'001, 1'234'567, 999'999'999'999'999,
                             1'000'000'000'000'000, 1'000'000'000'000'001, (int64_t{1} << 53) - 1, int64_t{1} << 53,
                             (int64_t{1} << 62), std::numeric_limits<int64_t>::max()};
  std::mt19937_64 rng(5);
  for (int i = 0; i < 300'000; ++i) {
    const int digits = static_cast<int>(rng() % 19);  // 10^0 .. 10^18 ps
    int64_t scale = 1;
    for (int d = 0; d < digits; ++d) scale *= 10;
    ts.push_back(static_cast<int64_t>(rng() % static_cast<uint64_t>(scale)) + scale / 10);
  }
  for (int64_t base : {int64_t{1'000'000}, int64_t{123'456'789'012}, int64_t{999'999'000'000'000}})
    for (int64_t k = -2000; k < 2000; ++k) ts.push_back(base + k);
  size_t bad = 0;
  for (const int64_t t : ts) {
    std::string got;
    nsim::sim::append_us(got, t);
    if (got != want(t) && bad++ < 5) FAIL_CHECK("t = " << t << " ps: " << got << " against " << want(t));
  }
  CHECK(bad == 0);
}

TEST_CASE("append_real writes each double as nlohmann's serializer writes it", "[sim][trace]") {
  // Times in ns made from ps (ps_to_ns: the slices' ready_ns, wait_ns, ... arguments) are written directly where
  // their decimal is certainly the serializer's text (sim/trace.cpp fixed_decimal), any other double by its own
  // formatter: each must come out as dump_json of the double. Times of every scale, runs of consecutive ps, and
  // doubles of random bits (NaN and infinities: null).
  std::vector<double> vs = {0.0, -0.0, 0.001, 0.1, 2.5, 1e9, 1e9 - 0.001, 999'999'999.999, 123456.789, 1e-7, 1e21,
                            std::numeric_limits<double>::infinity(), std::nan("")};
  std::mt19937_64 rng(9);
  for (int i = 0; i < 200'000; ++i) {
    const int digits = static_cast<int>(rng() % 16);  // 10^0 .. 10^15 ps
    int64_t scale = 1;
    for (int d = 0; d < digits; ++d) scale *= 10;
    vs.push_back(nsim::sim::ps_to_ns(static_cast<int64_t>(rng() % static_cast<uint64_t>(scale)) + scale / 10));
    const uint64_t bits = rng();
    double r;
    std::memcpy(&r, &bits, sizeof r);
    vs.push_back(r);
  }
  for (int64_t base : {int64_t{1}, int64_t{987'654'321}, int64_t{999'999'999'000}})
    for (int64_t k = 0; k < 3000; ++k) vs.push_back(nsim::sim::ps_to_ns(base + k));
  size_t bad = 0;
  for (const double v : vs) {
    std::string got;
    nsim::sim::append_real(got, v);
    const std::string want = dump_json(Json(v));
    if (got != want && bad++ < 5) FAIL_CHECK("v = " << v << ": " << got << " against " << want);
  }
  CHECK(bad == 0);
}

TEST_CASE("ChromeTraceWriter writes slices, flow arrows and counters as nlohmann's serializer would", "[sim][trace]") {
  // Those events are written by hand (the serializer's UTF-8 check and escaping of every byte was most of a JSON
  // trace's cost): each line must be what dump_json() gives for the event built as a JSON object, with strings
  // that need escaping or replacing, numbers of every shape and times in whole and fractional microseconds.
  using nsim::sim::TraceArg;
  using nsim::sim::json_number;
  const std::vector<std::string> texts = {"plain", "", "q\"uote", "back\\slash", "tab\tnew\nline", std::string("nul\0x", 5),
                                          "caf\xc3\xa9", "bad \xff byte", "del\x7f", "k.py:12 (kernel)"};
  const std::vector<double> reals = {2.5, 0.1, 1e-7, 1e21, 3.0, -0.0, -2.25, 1e300, std::nan(""),
                                     std::numeric_limits<double>::infinity(), 123456.789, 0x1p53, 5e-324};
  auto us = [](int64_t t) { return t % 1000000 == 0 ? Json(t / 1000000) : Json(static_cast<double>(t) / 1e6); };
  TempFile tf("trace");
  std::vector<std::string> want;
  {
    ChromeTraceWriter w(tf.path.string(), "Core");
    int64_t t = 0;
    for (size_t i = 0; i < 40; ++i) {
      t += i % 3 == 0 ? 1'000'000 : 1'234'567;  // whole and fractional microseconds
      const std::string& text = texts[i % texts.size()];
      const double r = reals[i % reals.size()];
      const int64_t n = i % 4 == 0 ? std::numeric_limits<int64_t>::min() : i % 4 == 1 ? std::numeric_limits<int64_t>::max()
                                                                                      : static_cast<int64_t>(i) - 7;
      TraceSlice sl{static_cast<int>(i % 5), t, static_cast<int64_t>(i) * 250'000, texts[(i + 3) % texts.size()],
                    {TraceArg::string("opcode", text), TraceArg::integer("index", n), TraceArg::real("ready_ns", r)}};
      if (i % 7 == 0) sl.args.clear();
      Json args = Json::object();
      for (const TraceArg& a : sl.args)
        args[a.key] = a.kind == TraceArg::Kind::kText ? Json(a.text) : a.kind == TraceArg::Kind::kInt ? Json(a.i) : json_number(a.d);
      want.push_back(dump_json(Json{{"ph", "X"}, {"pid", 1}, {"tid", sl.track}, {"ts", us(sl.start)}, {"dur", us(sl.dur)},
                                    {"name", sl.name}, {"args", args}}));
      if (i % 3 == 1) {  // a flow arrow from a slice that started earlier
        sl.flow_id = static_cast<int64_t>(i);
        sl.flow_track = 2;
        sl.flow_ts = t - 500'000;
        want.push_back(dump_json(Json{{"ph", "s"}, {"pid", 1}, {"tid", 2}, {"ts", us(sl.flow_ts)}, {"id", sl.flow_id},
                                      {"name", "wait"}, {"cat", "dependency"}}));
        want.push_back(dump_json(Json{{"ph", "f"}, {"bp", "e"}, {"pid", 1}, {"tid", sl.track}, {"ts", us(t)},
                                      {"id", sl.flow_id}, {"name", "wait"}, {"cat", "dependency"}}));
      }
      w.slice(std::move(sl));
      w.watermark(t + 1);  // written now: the lines come in this order
      if (i % 4 == 2) {
        w.counter(texts[i % texts.size()], t, r * 1000);
        want.push_back(dump_json(Json{{"ph", "C"}, {"pid", 1}, {"ts", us(t)}, {"name", texts[i % texts.size()]},
                                      {"args", {{"bytes", json_number(std::round(r * 1000))}}}}));
      }
    }
  }
  const std::string text = read_file(tf.path);
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) {
    if (!l.empty() && l.back() == ',') l.pop_back();
    if (l.rfind("{\"ph\":\"X\"", 0) == 0 || l.rfind("{\"ph\":\"s\"", 0) == 0 || l.rfind("{\"ph\":\"f\"", 0) == 0 ||
        l.rfind("{\"ph\":\"C\"", 0) == 0)
      lines.push_back(l);
  }
  CHECK(lines == want);
  CHECK(valid_json(text));
}

TEST_CASE("ChromeTraceWriter orders equal starts by track and flushes on destruction", "[sim][trace]") {
  TempFile tf("trace_dtor");
  {
    ChromeTraceWriter w(tf.path.string());
    w.declare_track(1, "scalar");
    w.declare_track(2, "gpsimd");
    w.slice(TraceSlice{2, 5'000, 10, "g", {}});
    w.slice(TraceSlice{1, 5'000, 10, "s", {}});
    w.slice(TraceSlice{1, 4'000, 10, "s0", {}});
    // no finish(): the destructor must close the document
  }
  const std::string text = read_trace(tf.path);
  INFO(text);
  CHECK(valid_json(text));
  CHECK(x_field(text, "name") == std::vector<std::string>{"s0", "s", "g"});
  CHECK(x_field(text, "ts") == std::vector<std::string>{"0.004000", "0.005000", "0.005000"});
  CHECK(text.find("\"args\": {\"name\": \"NeuronCore\"}") != std::string::npos);
}

TEST_CASE("ChromeTraceWriter: 1000 shuffled slices come out sorted", "[sim][trace]") {
  TempFile tf("trace_many");
  {
    ChromeTraceWriter w(tf.path.string());
    w.declare_track(0, "t");
    // Slices arrive in blocks of 10, each block reversed; the watermark trails one block behind.
    for (int blk = 0; blk < 100; ++blk) {
      for (int k = 9; k >= 0; --k) w.slice(TraceSlice{0, (blk * 10 + k) * 1'000'000LL, 1'000, "s", {}});
      w.watermark(blk * 10 * 1'000'000LL);
    }
    w.finish();
    CHECK(w.slices_written() == 1000);
  }
  const std::string text = read_trace(tf.path);
  CHECK(valid_json(text));
  const auto ts = x_field(text, "ts");
  REQUIRE(ts.size() == 1000);
  bool sorted = true;
  for (size_t i = 0; i < ts.size(); ++i) sorted = sorted && std::stod(ts[i]) == Approx(static_cast<double>(i));
  CHECK(sorted);
}

TEST_CASE("ChromeTraceWriter bounds its reorder buffer when no watermark comes", "[sim][trace]") {
  // An engine that issues nothing keeps the simulator's watermark at 0. The writer must still stream:
  // past kMaxPending waiting slices it writes the earliest half, in order.
  TempFile tf("trace_bounded");
  const auto n = static_cast<int64_t>(ChromeTraceWriter::kMaxPending) + 10;
  {
    ChromeTraceWriter w(tf.path.string());
    w.declare_track(0, "t");
    for (int64_t i = 0; i < n; ++i) w.slice(TraceSlice{0, i * 1'000, 500, "s", {}});
    CHECK(w.slices_written() == ChromeTraceWriter::kMaxPending / 2);  // written before finish()
    CHECK(w.slices_out_of_order() == 0);
    // A slice earlier than the ones written: written out of order, and counted.
    w.slice(TraceSlice{0, 0, 1, "late", {}});
    w.finish();
    CHECK(w.slices_written() == static_cast<uint64_t>(n) + 1);
    CHECK(w.slices_out_of_order() == 1);
  }
  CHECK(valid_json(read_file(tf.path)));
}

TEST_CASE("ChromeTraceWriter on an unwritable path throws nsim::Error", "[sim][trace]") {
  const std::string bad = "/nonexistent_nsim_dir_4242/sub/trace.json";
  try {
    ChromeTraceWriter w(bad);
    FAIL("expected nsim::Error");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kCannotWrite);
    CHECK(std::string(e.what()).find(bad) != std::string::npos);
  }
}

// ------------------------------------------------------------------------------------------------
// ChromeTraceWriter with a TraceFilter (max_slices, time window)

namespace {

using nsim::sim::TraceFilter;

/// The text of the (single) instant event line, or "" when there is none.
std::string instant_line(const std::string& text) {
  std::istringstream in(text);
  std::string line, found;
  int n = 0;
  while (std::getline(in, line))
    if (line.find("\"ph\": \"i\"") != std::string::npos) {
      found = line;
      ++n;
    }
  return n == 1 ? found : (n ? "<several>" : "");
}

/// "s<k>" (built with append: GCC 12 warns falsely (-Wrestrict) on "s" + std::to_string(k)).
std::string sname(int k) {
  std::string s = "s";
  s.append(std::to_string(k));
  return s;
}

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("TraceFilter::from_ns and the overlap rule", "[sim][trace]") {
  const TraceFilter none = TraceFilter::from_ns(0, 0, 0);
  CHECK_FALSE(none.active());
  CHECK_FALSE(none.has_window());
  CHECK(none.in_window(0, 0));
  CHECK(none.in_window(INT64_MAX / 2, 5));

  const TraceFilter f = TraceFilter::from_ns(7, 10.5, 30);
  CHECK(f.max_slices == 7);
  CHECK(f.window_start == 10'500);
  CHECK(f.window_end == 30'000);
  CHECK(f.active());
  CHECK_FALSE(f.in_window(0, 10'500));     // ends exactly at the window start
  CHECK(f.in_window(0, 10'501));           // overlaps by 1 ps
  CHECK(f.in_window(10'500, 0));           // zero-length at the start: inside
  CHECK_FALSE(f.in_window(10'499, 0));     // zero-length just before
  CHECK(f.in_window(29'999, 100'000));     // starts inside, ends after
  CHECK_FALSE(f.in_window(30'000, 1));     // starts at the (exclusive) end
  CHECK(f.in_window(0, 100'000));          // covers the whole window

  const TraceFilter open_end = TraceFilter::from_ns(0, 5, 0);
  CHECK(open_end.window_end == 0);
  CHECK(open_end.has_window());
  CHECK(open_end.in_window(INT64_MAX / 2, 1));
  CHECK_FALSE(open_end.in_window(0, 5'000));
  const TraceFilter open_start = TraceFilter::from_ns(0, 0, 5);
  CHECK(open_start.in_window(0, 0));
  CHECK_FALSE(open_start.in_window(5'000, 1));
  CHECK(TraceFilter::from_ns(0, -3, 1e30).window_start == 0);  // negative = 0, huge clamps
  CHECK(TraceFilter::from_ns(0, -3, 1e30).window_end > 0);
}

TEST_CASE("ChromeTraceWriter max_slices keeps the earliest slices in time order", "[sim][trace]") {
  TempFile tf("trace_limit");
  {
    TraceFilter f;
    f.max_slices = 4;
    ChromeTraceWriter w(tf.path.string(), "NeuronCore", f);
    w.declare_track(0, "vector");
    w.declare_track(1, "scalar");
    // Out of order within the reorder buffer: the limit applies after sorting.
    w.slice(TraceSlice{1, 3'000, 10, "s3", {}});
    w.slice(TraceSlice{0, 5'000, 10, "s5", {}});
    w.slice(TraceSlice{0, 1'000, 10, "s1", {}});
    w.slice(TraceSlice{1, 2'000, 10, "s2", {}});
    w.watermark(2'500);  // writes s1, s2
    CHECK(w.slices_written() == 2);
    w.slice(TraceSlice{0, 2'600, 10, "s2b", {}});  // later than the watermark but before s3
    w.slice(TraceSlice{1, 9'000, 10, "s9", {}});
    w.watermark(4'000);  // writes s2b, s3: the limit is reached
    CHECK(w.slices_written() == 4);
    CHECK(w.slices_dropped() == 0);
    for (int k = 0; k < 5; ++k) w.slice(TraceSlice{k % 2, 10'000 + k, 10, "late", {}});  // dropped at once
    CHECK(w.slices_dropped_by_limit() == 5);
    w.finish();
    CHECK(w.slices_written() == 4);
    CHECK(w.slices_dropped_by_limit() == 7);  // + s5, s9 from the buffer
    CHECK(w.slices_dropped_by_window() == 0);
    CHECK(w.slices_dropped() == 7);
  }
  const std::string text = read_trace(tf.path);
  INFO(text);
  CHECK(valid_json(text));
  CHECK(x_field(text, "name") == std::vector<std::string>{"s1", "s2", "s2b", "s3"});
  CHECK(x_field(text, "ts") == std::vector<std::string>{"0.001000", "0.002000", "0.002600", "0.003000"});
  const std::string inst = instant_line(text);
  REQUIRE_FALSE(inst.empty());
  CHECK(inst.find("\"s\": \"g\"") != std::string::npos);
  CHECK(inst.find("\"name\": \"partial trace: 7 slices dropped (7 by limit, 0 by window)\"") != std::string::npos);
  CHECK(inst.find("\"slices_written\": 4") != std::string::npos);
  CHECK(inst.find("\"slices_dropped\": 7") != std::string::npos);
  CHECK(inst.find("\"dropped_by_limit\": 7") != std::string::npos);
  CHECK(inst.find("\"dropped_by_window\": 0") != std::string::npos);
  CHECK(inst.find("\"max_slices\": 4") != std::string::npos);
  CHECK(inst.find("\"window_end_ns\": null") != std::string::npos);
  CHECK(inst.find("\"ts\": 0.005,") != std::string::npos);  // the first slice missing (s5)
  CHECK(text.rfind("\"ph\": \"i\"") > text.rfind("\"ph\": \"X\""));  // reported at the end
}

TEST_CASE("ChromeTraceWriter max_slices without watermarks, and equal to the slice count", "[sim][trace]") {
  for (uint64_t limit : {1u, 3u, 10u, 11u}) {
    TempFile tf("trace_limit_nowm");
    TraceFilter f;
    f.max_slices = limit;
    {
      ChromeTraceWriter w(tf.path.string(), "NeuronCore", f);
      w.declare_track(0, "t");
      for (int k = 9; k >= 0; --k) w.slice(TraceSlice{0, k * 1'000'000LL, 5, sname(k), {}});
      w.finish();
      CHECK(w.slices_written() == std::min<uint64_t>(limit, 10));
      CHECK(w.slices_dropped() == 10 - std::min<uint64_t>(limit, 10));
    }
    const std::string text = read_trace(tf.path);
    INFO(text);
    CHECK(valid_json(text));
    const auto names = x_field(text, "name");
    REQUIRE(names.size() == std::min<uint64_t>(limit, 10));
    for (size_t i = 0; i < names.size(); ++i) CHECK(names[i] == sname(static_cast<int>(i)));
    // The filter is reported even when it dropped nothing.
    const std::string inst = instant_line(text);
    REQUIRE_FALSE(inst.empty());
    if (limit >= 10) CHECK(inst.find("\"name\": \"trace filter: no slices dropped\"") != std::string::npos);
    else CHECK(inst.find("\"name\": \"partial trace: ") != std::string::npos);
  }
}

TEST_CASE("ChromeTraceWriter time window keeps overlapping slices whole", "[sim][trace]") {
  TempFile tf("trace_window");
  {
    ChromeTraceWriter w(tf.path.string(), "NeuronCore", TraceFilter::from_ns(0, 10, 30));
    w.declare_track(0, "a");
    w.declare_track(1, "b");
    w.slice(TraceSlice{0, 0, 10'000, "before_touching", {}});  // [0, 10) ns ends at the start: dropped
    w.slice(TraceSlice{1, 5'000, 10'000, "straddles_start", {}});  // [5, 15): kept whole
    w.slice(TraceSlice{0, 10'000, 10'000, "inside", {}});
    w.slice(TraceSlice{1, 10'000, 0, "zero_at_start", {}});
    w.watermark(12'000);
    w.slice(TraceSlice{0, 25'000, 50'000, "straddles_end", {}});  // [25, 75): kept whole
    w.slice(TraceSlice{1, 30'000, 1'000, "at_end", {}});         // starts at the exclusive end: dropped
    w.slice(TraceSlice{1, 30'000, 0, "zero_at_end", {}});        // dropped
    w.slice(TraceSlice{0, 40'000, 1'000, "after", {}});          // dropped
    w.finish();
    CHECK(w.slices_written() == 4);
    CHECK(w.slices_dropped_by_window() == 4);
    CHECK(w.slices_dropped_by_limit() == 0);
    CHECK(w.slices_dropped() == 4);
  }
  const std::string text = read_trace(tf.path);
  INFO(text);
  CHECK(valid_json(text));
  CHECK(x_field(text, "name") == std::vector<std::string>{"straddles_start", "inside", "zero_at_start", "straddles_end"});
  CHECK(x_field(text, "ts") == std::vector<std::string>{"0.005000", "0.010000", "0.010000", "0.025000"});
  CHECK(x_field(text, "dur") == std::vector<std::string>{"0.010000", "0.010000", "0.000000", "0.050000"});
  const std::string inst = instant_line(text);
  REQUIRE_FALSE(inst.empty());
  CHECK(inst.find("\"name\": \"partial trace: 4 slices dropped (0 by limit, 4 by window)\"") != std::string::npos);
  CHECK(inst.find("\"window_start_ns\": 10") != std::string::npos);
  CHECK(inst.find("\"window_end_ns\": 30") != std::string::npos);
  CHECK(inst.find("\"ts\": 0.01,") != std::string::npos);  // at the window start
}

TEST_CASE("ChromeTraceWriter window and limit together count separately", "[sim][trace]") {
  TempFile tf("trace_window_limit");
  {
    TraceFilter f = TraceFilter::from_ns(3, 100, 0);  // from 100 ns on, at most 3 slices
    ChromeTraceWriter w(tf.path.string(), "NeuronCore", f);
    w.declare_track(0, "t");
    for (int k = 0; k < 20; ++k) w.slice(TraceSlice{0, k * 10'000LL, 10'000, sname(k), {}});
    w.finish();
    CHECK(w.slices_written() == 3);
    CHECK(w.slices_dropped_by_window() == 10);  // s0..s9 end at or before 100 ns
    CHECK(w.slices_dropped_by_limit() == 7);    // s13..s19
  }
  const std::string text = read_trace(tf.path);
  INFO(text);
  CHECK(valid_json(text));
  CHECK(x_field(text, "name") == std::vector<std::string>{"s10", "s11", "s12"});
  CHECK(instant_line(text).find("(7 by limit, 10 by window)") != std::string::npos);
}

TEST_CASE("ChromeTraceWriter says when it keeps no more slices and counts skipped ones as dropped", "[sim][trace]") {
  // Fast-forward skips iterations only once a trace keeps no slice starting at or after the watermark
  // (Simulator::trace_closed); the skipped iterations' slices are then counted as the run simulating them drops them.
  TempFile tf("trace_closed");
  SECTION("past the window's end, by the window") {
    ChromeTraceWriter w(tf.path.string(), "NeuronCore", TraceFilter::from_ns(0, 10, 50));
    CHECK_FALSE(w.closed_from(49'999));  // (ps) a slice starting before 50 ns may overlap the window
    CHECK(w.closed_from(50'000));
    w.skipped(50'000, 12);
    w.finish();
    CHECK(w.slices_dropped_by_window() == 12);
    CHECK(w.slices_dropped_by_limit() == 0);
  }
  SECTION("the limit reached: once a slice was dropped by it, and from the window's start on") {
    ChromeTraceWriter w(tf.path.string(), "NeuronCore", TraceFilter::from_ns(2, 5, 0));
    w.declare_track(0, "t");
    for (int k = 0; k < 3; ++k) w.slice(TraceSlice{0, 10'000LL + k * 1'000, 500, sname(k), {}});
    CHECK_FALSE(w.closed_from(20'000));  // buffered, none written yet: the limit not reached
    w.watermark(12'000);                 // s0, s1 written (the limit); s2 (at 12 ns) still buffered
    CHECK(w.slices_written() == 2);
    CHECK_FALSE(w.closed_from(20'000));  // nothing dropped by the limit yet
    w.watermark(12'001);                 // s2 dropped by it
    CHECK(w.closed_from(20'000));
    CHECK_FALSE(w.closed_from(11'999));  // a slice starting before s2 would become the first dropped (the marker's place)
    CHECK_FALSE(w.closed_from(4'000));   // before the window's start: dropped by the window, not counted here
    w.skipped(20'000, 5);
    w.finish();
    CHECK(w.slices_dropped_by_limit() == 6);
    CHECK(w.slices_dropped_by_window() == 0);
  }
  SECTION("a window without an end and no limit never closes; no filter neither") {
    ChromeTraceWriter w(tf.path.string(), "NeuronCore", TraceFilter::from_ns(0, 10, 0));
    CHECK_FALSE(w.closed_from(INT64_MAX / 2));
    ChromeTraceWriter all((tf.path.string() + "2"), "NeuronCore");
    CHECK_FALSE(all.closed_from(INT64_MAX / 2));
    all.finish();
    std::filesystem::remove(tf.path.string() + "2");
  }
}

TEST_CASE("ChromeTraceWriter with zero slices writes valid JSON", "[sim][trace]") {
  SECTION("no filter, no slices") {
    TempFile tf("trace_empty");
    {
      ChromeTraceWriter w(tf.path.string());
      w.declare_track(0, "t");
      w.finish();
      CHECK(w.slices_written() == 0);
      CHECK(w.slices_dropped() == 0);
    }
    const std::string text = read_trace(tf.path);
    INFO(text);
    CHECK(valid_json(text));
    CHECK(x_field(text, "name").empty());
    CHECK(instant_line(text).empty());  // unfiltered traces carry no filter report
  }
  SECTION("no tracks, destructor only") {
    TempFile tf("trace_empty_dtor");
    { ChromeTraceWriter w(tf.path.string(), "x", TraceFilter::from_ns(5, 0, 0)); }
    const std::string text = read_trace(tf.path);
    INFO(text);
    CHECK(valid_json(text));
    CHECK(instant_line(text).find("\"slices_written\": 0, \"slices_dropped\": 0") != std::string::npos);
  }
  SECTION("every slice outside the window") {
    TempFile tf("trace_all_dropped");
    {
      ChromeTraceWriter w(tf.path.string(), "NeuronCore", TraceFilter::from_ns(0, 1e6, 2e6));
      w.declare_track(0, "t");
      for (int k = 0; k < 50; ++k) w.slice(TraceSlice{0, k * 1'000LL, 1'000, "s", {nsim::sim::TraceArg::string("src", "k.py:1")}});
      w.finish();
      CHECK(w.slices_written() == 0);
      CHECK(w.slices_dropped_by_window() == 50);
    }
    const std::string text = read_trace(tf.path);
    INFO(text);
    CHECK(valid_json(text));
    CHECK(count_of(text, "\"ph\": \"X\"") == 0);
    CHECK(count_of(text, "\"ph\": \"M\"") == 3);  // process_name, thread_name, thread_sort_index
    CHECK(instant_line(text).find("\"name\": \"partial trace: 50 slices dropped (0 by limit, 50 by window)\"") !=
          std::string::npos);
  }
}
