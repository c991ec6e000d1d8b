// nsim_fuzz: the in-process fuzz driver (docs/reliability.md, "The C++ fuzz driver").
//
// Generates mutated inputs (kernel.json text mutated on its JSON tree with the ISA's own vocabulary and on
// its bytes; -p overrides; a mutated YAML configuration; other presets) from the seed corpus
// tests/fuzz/corpus/, deterministically from (--seed, input index), and runs each through the three entry
// points of the CLI, in one process and with the library calls frontend/cli/main.cpp makes:
//   check        parse_kernel_json, load_config, verify_kernel                       (`nsim check`)
//   timing       + Simulator without numerics, allocate_hbm, Lowering::run, finish   (`nsim run --timing-only`)
//   full         + numerics, write_inputs, reading the outputs back                  (`nsim run`)
// and sometimes disassemble_kernel (`nsim disasm`) and a trace with a limit (`--trace`, checked to be valid
// JSON). Runs have --max-instructions / --max-sim-time limits; workers have an address-space cap.
//
// Outcomes: ok, user_error (a coded error other than E9xx), and the findings internal (E901 or
// std::bad_alloc), uncoded (an exception without a code), disagree (the three entry points do not give the
// same verdict: issue 16 item 2), crash (the worker died: a signal, or a sanitizer report in an ASan build)
// and hang (more than --timeout seconds of CPU time on one input, or 10 x --timeout of wall time: the
// worker is killed). The workers are forked from a
// parent that watches them (a fork server): a crash or hang costs one respawn, not the campaign. Every
// finding is written to --out as a case file in tests/fuzz/fuzz.py's format, so that it can be replayed by
// this driver (`nsim_fuzz replay`) and, once fixed, kept in tests/fuzz/regressions/.
#include <fcntl.h>
#include <malloc.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <new>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <typeinfo>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "engines/params.h"
#include "engines/simulator.h"
#include "frontend/disasm.h"
#include "frontend/inputs.h"
#include "frontend/ir.h"
#include "frontend/npy.h"
#include "frontend/lower.h"
#include "frontend/multicore.h"
#include "sim/config.h"
#include "sim/error.h"

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;
using namespace nsim;

#if defined(__SANITIZE_ADDRESS__)
#define NSIM_FUZZ_ASAN 1
#else
#define NSIM_FUZZ_ASAN 0
#endif

namespace {

// The limits every run gets (the Python harness uses the same): no input can run long.
constexpr uint64_t kMaxInstructions = 200000;
constexpr double kMaxSimTimeNs = 1e9;

// ------------------------------------------------------------------------------------------------
// Vocabulary: from the ISA tables (isa/*.def) and the seed corpus; nothing listed twice.
// ------------------------------------------------------------------------------------------------

struct Vocabulary {
  std::map<std::string, std::vector<std::string>> by_key;  ///< string values a key takes
  std::vector<std::string> keys;                           ///< every object key seen or known
  std::vector<std::string> strings;                        ///< every string value
  std::vector<std::string> config_keys;                    ///< the effective configuration's keys
  std::map<std::string, std::string> config_values;        ///< trn2's raw values
  std::string trn2_yaml;

  void add(const std::string& key, const std::string& v) {
    auto& vec = by_key[key];
    if (std::find(vec.begin(), vec.end(), v) == vec.end()) vec.push_back(v);
    if (std::find(strings.begin(), strings.end(), v) == strings.end()) strings.push_back(v);
  }
  void add_key(const std::string& k) {
    if (std::find(keys.begin(), keys.end(), k) == keys.end()) keys.push_back(k);
  }
};

void collect(const Json& j, const std::string& key, Vocabulary& v) {
  if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it) {
      v.add_key(it.key());
      collect(it.value(), it.key(), v);
    }
  } else if (j.is_array()) {
    for (const auto& e : j) collect(e, key, v);
  } else if (j.is_string()) {
    v.add(key, j.get<std::string>());
  }
}

Vocabulary make_vocabulary(const std::vector<Json>& seeds) {
  Vocabulary v;
#define OP(e, name, ...) v.add("op", name);
#define MACRO(e, name, ...) v.add("op", name);
#include "isa/opcodes.def"
#undef OP
#undef MACRO
#define DTYPE(e, name, ...) v.add("dtype", name);
#include "isa/dtypes.def"
#undef DTYPE
#define ALU(e, name, ...) v.add("alu0", name), v.add("alu1", name);
#include "isa/alu_ops.def"
#undef ALU
#define ACT(e, name, ...) v.add("act", name);
#include "isa/act_funcs.def"
#undef ACT
#define FLAG(e, name, desc) v.add("flags", name);
#include "isa/flags.def"
#undef FLAG
  for (int e = 0; e < isa::kNumEngines; ++e) v.add("engine", std::string(isa::engine_name(static_cast<isa::Engine>(e))));
  for (const char* b : {"hbm", "sbuf", "psum"}) v.add("buffer", b);
  // The kernel.json reader's enumerations and keys that no seed uses (docs/kernel-json.md).
  for (const char* k : {"input", "output", "internal", "sequential", "static", "affine"}) v.add("kind", k);
  for (const char* c : {"idle", "reset", "reduce", "reset_reduce", "load_reduce"}) v.add("reduce_cmd", c);
  for (const char* k : {"address", "schedule", "after", "before", "label", "order_group", "cores", "core_programs",
                        "flag", "iimm", "shuffle", "axis_count", "dma_queue", "offsets", "broadcast", "bufs"})
    v.add_key(k);
  for (const Json& s : seeds) collect(s, "", v);
  // Index expressions: affine and not.
  for (const char* e : {"i", "128*i", "128*i + 1", "i*j", "-i", "i - 1", "2*i+j", "(i)", "i +", "1e3", "i/2", "x",
                        "9223372036854775807*i", "-9223372036854775808", "n*128+", "0"})
    v.add("index_expr", e);
  const sim::Config cfg = engines::load_config("trn2");
  for (const auto& [k, val] : cfg.raw()) {
    v.config_keys.push_back(k);
    v.config_values[k] = val;
  }
  v.trn2_yaml = cfg.to_yaml();
  return v;
}

// ------------------------------------------------------------------------------------------------
// A case: one input (tests/fuzz/fuzz.py's case format).
// ------------------------------------------------------------------------------------------------

struct Case {
  std::string kernel;                  ///< kernel.json text
  std::string config = "trn2";         ///< a preset name ("c.yaml" when `yaml` is set)
  std::string yaml;                    ///< the YAML configuration file's text; empty = a preset
  std::vector<std::string> overrides;  ///< -p KEY=VALUE
  uint64_t data_seed = 0;              ///< --seed of the random inputs
  bool disasm = false;
  bool trace = false;
  uint64_t trace_limit = 0;

  Json to_json() const {
    Json j;
    j["kind"] = "kernel";
    j["kernel"] = kernel;
    j["config"] = yaml.empty() ? config : "c.yaml";
    if (!yaml.empty()) j["files"] = Json{{"c.yaml", yaml}};
    if (!overrides.empty()) j["overrides"] = overrides;
    j["seed"] = data_seed;
    j["mode"] = "run";
    j["timing_only"] = false;
    if (trace) j["trace"] = true, j["trace_limit"] = trace_limit;
    j["driver"] = Json{{"disasm", disasm}};
    return j;
  }
  static Case from_json(const Json& j) {
    Case c;
    c.kernel = j.at("kernel").get<std::string>();
    c.config = j.value("config", std::string("trn2"));
    if (j.contains("files") && j["files"].contains(c.config)) c.yaml = j["files"][c.config].get<std::string>();
    if (j.contains("overrides")) c.overrides = j["overrides"].get<std::vector<std::string>>();
    c.data_seed = j.value("seed", uint64_t{0});
    c.trace = j.value("trace", false);
    c.trace_limit = j.value("trace_limit", uint64_t{0});
    if (j.contains("driver")) c.disasm = j["driver"].value("disasm", false);
    return c;
  }
};

// ------------------------------------------------------------------------------------------------
// Generation: deterministic per (seed, index).
// ------------------------------------------------------------------------------------------------

uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

const int64_t kInts[] = {0, 1, -1, 2, 3, 4, 7, 8, 15, 16, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 256, 511, 512, 513,
                         1024, 2047, 2048, 2049, 4096, 8192, 16384, 65535, 65536, 1 << 20, 2147483647, -2147483648LL,
                         2147483648LL, 4294967295LL, 4294967296LL, 1LL << 40, 1LL << 53, 1LL << 62,
                         std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::min()};
const double kReals[] = {0.5, -0.5, 1e-300, -1e-300, 1e300, -1e300, 1e39, 3.4e38, 65504.0, 1e-45, -0.0, 0.1, 1e18, 2.5};
const char* const kTokens[] = {",", "]", "}", "{", "[", "\"", "\\", ":", "\x01", "\xff", "\xc3\xa9", "null", "true",
                               "1e999999", "-", "0x10", "NaN", "Infinity", "\"\\ud800\"", "\"\\u0000\"", "[[[[[[[[[[",
                               "{\"op\": \"memset\"}", "\"nsim_kernel\": 2,", "18446744073709551616"};

class Generator {
 public:
  Generator(const std::vector<Json>& seeds, const Vocabulary& v, uint64_t seed, uint64_t index)
      : seeds_(seeds), v_(v), rng_(splitmix(seed ^ splitmix(index + 1))) {}

  Case make() {
    Case c;
    const size_t s = below(seeds_.size());
    Json j = seeds_[s];
    const int n = 1 + static_cast<int>(below(4)) + (chance(0.2) ? static_cast<int>(below(6)) : 0);
    for (int i = 0; i < n; ++i) mutate(j);
    // (a mutation may cut a string inside a UTF-8 sequence: such bytes become U+FFFD instead of an
    // exception that would end the campaign)
    c.kernel = j.dump(chance(0.5) ? -1 : 1, ' ', false, Json::error_handler_t::replace);
    if (chance(0.12)) {
      const int m = 1 + static_cast<int>(below(4));
      for (int i = 0; i < m; ++i) mutate_bytes(c.kernel);
    }
    const double r = uniform();
    if (r < 0.08) {
      static const char* const kPresets[] = {"trn1", "trn3", "inf2", "trn9", "", "../x", "trn2.yaml"};
      c.config = kPresets[below(std::size(kPresets))];
    } else if (r < 0.20) {
      const int m = 1 + static_cast<int>(below(3));
      for (int i = 0; i < m; ++i) c.overrides.push_back(override_text());
    } else if (r < 0.23) {
      c.yaml = mutate_yaml();
    }
    c.data_seed = below(4);
    c.disasm = chance(0.05);
    if (chance(0.03)) {
      static const uint64_t kLimits[] = {0, 1, 10, 1000};
      c.trace = true;
      c.trace_limit = kLimits[below(4)];
    }
    return c;
  }

 private:
  const std::vector<Json>& seeds_;
  const Vocabulary& v_;
  std::mt19937_64 rng_;

  size_t below(size_t n) { return n == 0 ? 0 : static_cast<size_t>(rng_() % n); }
  double uniform() { return std::uniform_real_distribution<double>(0, 1)(rng_); }
  bool chance(double p) { return uniform() < p; }
  template <class V>
  const typename V::value_type& pick(const V& v) { return v[below(v.size())]; }

  struct Node {
    Json* node;
    std::string key;  ///< the object key it is under (array elements: the array's key)
  };

  static void nodes(Json& j, const std::string& key, std::vector<Node>& out) {
    out.push_back({&j, key});
    if (j.is_object()) {
      for (auto it = j.begin(); it != j.end(); ++it) nodes(it.value(), it.key(), out);
    } else if (j.is_array()) {
      for (auto& e : j) nodes(e, key, out);
    }
  }
  /// Nodes satisfying `pred`.
  template <class P>
  std::vector<Node> select(Json& root, P pred) {
    std::vector<Node> all, out;
    nodes(root, "", all);
    for (const Node& n : all)
      if (pred(n)) out.push_back(n);
    return out;
  }

  Json a_number() {
    if (chance(0.8)) {
      int64_t x = kInts[below(std::size(kInts))];
      if (chance(0.2) && x > std::numeric_limits<int64_t>::min() + 2 && x < std::numeric_limits<int64_t>::max() - 2)
        x += static_cast<int64_t>(below(5)) - 2;
      return x;
    }
    if (chance(0.1)) return std::numeric_limits<uint64_t>::max();
    return kReals[below(std::size(kReals))];
  }
  std::string a_string(const std::string& key) {
    const auto it = v_.by_key.find(key);
    if (it != v_.by_key.end() && chance(0.75)) return pick(it->second);
    if (chance(0.3)) return pick(v_.by_key.at("index_expr"));
    if (chance(0.1)) return std::string(1 + below(3), static_cast<char>('a' + below(26)));
    return pick(v_.strings);
  }
  Json a_value(const std::string& key) {
    switch (below(8)) {
      case 0: return nullptr;
      case 1: return chance(0.5);
      case 2: return Json::array({a_number(), a_number()});
      case 3: return Json::object();
      case 4:
      case 5: return a_string(key);
      default: return a_number();
    }
  }
  /// A random node of a random other seed (a subtree to splice in).
  Json donor(const std::function<bool(const Node&)>& pred) {
    Json s = pick(seeds_);
    std::vector<Node> c = select(s, pred);
    if (c.empty()) return a_value("");
    return *pick(c).node;
  }

  void mutate(Json& root) {
    switch (below(10)) {
      case 0:
      case 1:
      case 2: return mutate_any(root);
      case 3: return mutate_op(root);
      case 4: return mutate_operand(root);
      case 5: return mutate_shape(root);
      case 6: return mutate_loop(root);
      case 7: return mutate_flags_imms(root);
      case 8: return splice_statement(root);
      default: return mutate_dtype_buffer(root);
    }
  }

  void mutate_any(Json& root) {
    std::vector<Node> all;
    nodes(root, "", all);
    Node n = pick(all);
    Json& j = *n.node;
    if (chance(0.07)) {  // a value of another type
      j = a_value(n.key);
      return;
    }
    if (j.is_number()) {
      j = a_number();
    } else if (j.is_string()) {
      j = a_string(n.key);
    } else if (j.is_boolean()) {
      j = !j.get<bool>();
    } else if (j.is_null()) {
      j = a_number();
    } else if (j.is_array()) {
      mutate_array(j, n.key);
    } else if (j.is_object()) {
      mutate_object(j, n.key);
    }
  }

  void mutate_array(Json& a, const std::string& key) {
    const size_t n = a.size();
    switch (below(6)) {
      case 0:
        if (n) a.erase(a.begin() + static_cast<std::ptrdiff_t>(below(n)));
        break;
      case 1:
        if (n) a.insert(a.begin() + static_cast<std::ptrdiff_t>(below(n + 1)), Json(a[below(n)]));
        break;
      case 2:
        if (n >= 2) std::swap(a[below(n)], a[below(n)]);
        break;
      case 3: a.insert(a.begin() + static_cast<std::ptrdiff_t>(below(n + 1)), a_value(key)); break;
      case 4: a = Json::array(); break;
      default:
        if (n) a.erase(a.begin() + static_cast<std::ptrdiff_t>(below(n)), a.end());
        break;
    }
  }

  void mutate_object(Json& o, const std::string& key) {
    switch (below(4)) {
      case 0:
        if (!o.empty()) {
          auto it = o.begin();
          std::advance(it, static_cast<std::ptrdiff_t>(below(o.size())));
          o.erase(it.key());
        }
        break;
      case 1: {
        const std::string k = pick(v_.keys);
        o[k] = chance(0.5) ? a_value(k) : donor([&](const Node& d) { return d.key == k; });
        break;
      }
      case 2:
        if (!o.empty()) {  // rename a key
          auto it = o.begin();
          std::advance(it, static_cast<std::ptrdiff_t>(below(o.size())));
          Json val = it.value();
          const std::string old = it.key();
          o.erase(old);
          o[pick(v_.keys)] = std::move(val);
        }
        break;
      default: o[pick(v_.keys)] = a_value(key); break;
    }
  }

  void mutate_op(Json& root) {
    std::vector<Node> ops = select(root, [](const Node& n) { return n.node->is_object() && n.node->contains("op"); });
    if (ops.empty()) return mutate_any(root);
    Json& op = *pick(ops).node;
    switch (below(4)) {
      case 0:
      case 1: op["op"] = pick(v_.by_key.at("op")); break;  // the same operands under another opcode
      case 2: op["engine"] = chance(0.9) ? Json(pick(v_.by_key.at("engine"))) : a_value("engine"); break;
      default: {  // drop or add an operand slot
        static const char* const kSlots[] = {"dst", "src", "data", "data1", "data2", "operand0", "operand1", "bias",
                                             "scale", "reduce_res", "stationary", "moving", "on_true", "offsets"};
        const std::string slot = kSlots[below(std::size(kSlots))];
        if (op.contains(slot) && chance(0.5)) op.erase(slot);
        else op[slot] = a_operand(root);
      }
    }
  }

  /// An operand: a tensor name or an access with an index.
  Json a_operand(Json& root) {
    std::vector<std::string> names;
    for (const Node& n : select(root, [](const Node& n) { return n.key == "name" && n.node->is_string(); }))
      names.push_back(n.node->get<std::string>());
    const std::string t = names.empty() ? "x" : pick(names);
    if (chance(0.5)) return t;
    Json idx = Json::array();
    const size_t rank = below(4);
    for (size_t d = 0; d < rank; ++d) {
      if (chance(0.3)) idx.push_back(a_string("index_expr"));
      else if (chance(0.2)) idx.push_back(a_number());
      else {
        Json s = {{"start", chance(0.5) ? Json(a_number()) : Json(a_string("index_expr"))}, {"size", a_number()}};
        if (chance(0.2)) s["step"] = a_number();
        if (chance(0.1)) s = {{"broadcast", a_number()}};
        idx.push_back(s);
      }
    }
    return Json{{"tensor", t}, {"index", idx}};
  }

  void mutate_operand(Json& root) {
    static const std::set<std::string> kSlots = {"dst", "src", "data", "data1", "data2", "operand0", "operand1", "bias",
                                                 "scale", "reduce_res", "stationary", "moving", "on_true", "offsets"};
    std::vector<Node> c = select(root, [](const Node& n) { return kSlots.count(n.key) > 0; });
    if (c.empty()) return mutate_any(root);
    Json& o = *pick(c).node;
    if (o.is_object() && o.contains("index") && o["index"].is_array() && chance(0.6)) {
      Json& idx = o["index"];
      if (!idx.empty() && chance(0.7)) {
        Json& d = idx[below(idx.size())];
        if (d.is_object()) {
          static const char* const kF[] = {"start", "size", "step", "broadcast"};
          const std::string f = kF[below(4)];
          d[f] = chance(0.6) ? Json(a_number()) : Json(a_string("index_expr"));
        } else {
          d = chance(0.5) ? Json(a_number()) : Json(a_string("index_expr"));
        }
      } else {
        mutate_array(idx, "index");
      }
      return;
    }
    o = a_operand(root);
  }

  void mutate_shape(Json& root) {
    // A tensor's or a view's shape, or a strided view's strides (kernel.json "strides").
    std::vector<Node> c = select(root, [](const Node& n) {
      return (n.key == "shape" || n.key == "strides") && n.node->is_array();
    });
    if (c.empty()) return mutate_any(root);
    const Node& picked = pick(c);
    Json& s = *picked.node;
    if (chance(0.25) || s.empty()) return mutate_array(s, picked.key);
    Json& d = s[below(s.size())];
    if (chance(0.5) && d.is_number_integer()) {  // e.g. 128 -> 256; wraps (in unsigned arithmetic: no UB)
      const uint64_t k = chance(0.5) ? 2 : 3;
      d = static_cast<int64_t>(static_cast<uint64_t>(d.get<int64_t>()) * k);
    }
    else d = a_number();
  }

  void mutate_loop(Json& root) {
    std::vector<Node> c = select(root, [](const Node& n) { return n.key == "loop" && n.node->is_object(); });
    if (c.empty()) return mutate_any(root);
    Json& l = *pick(c).node;
    switch (below(6)) {
      case 0: l["start"] = a_number(); break;
      case 1: l["stop"] = a_number(); break;
      case 2: l["step"] = a_number(); break;
      case 3: l["kind"] = chance(0.9) ? Json(pick(v_.by_key.at("kind"))) : a_value("kind"); break;
      case 4: l["var"] = a_string("var"); break;
      default:
        if (l.contains("body") && l["body"].is_array()) mutate_array(l["body"], "body");
    }
  }

  void mutate_flags_imms(Json& root) {
    std::vector<Node> ops = select(root, [](const Node& n) { return n.node->is_object() && n.node->contains("op"); });
    if (ops.empty()) return mutate_any(root);
    Json& op = *pick(ops).node;
    switch (below(7)) {
      case 0: {
        Json f = op.contains("flags") && op["flags"].is_array() ? op["flags"] : Json::array();
        if (!f.empty() && chance(0.4)) f.erase(f.begin() + static_cast<std::ptrdiff_t>(below(f.size())));
        else f.push_back(chance(0.9) ? Json(pick(v_.by_key.at("flags"))) : a_value("flags"));
        op["flags"] = f;
        break;
      }
      case 1: {
        Json imm = Json::array();
        const size_t n = below(6);
        for (size_t i = 0; i < n; ++i) {
          if (chance(0.15)) imm.push_back(chance(0.5) ? "nan" : chance(0.5) ? "inf" : "-inf");
          else imm.push_back(a_number());
        }
        op["imm"] = imm;
        break;
      }
      case 2: {
        Json iimm = Json::array();
        const size_t n = below(12);
        for (size_t i = 0; i < n; ++i) iimm.push_back(a_number());
        op["iimm"] = iimm;
        break;
      }
      case 3: op[chance(0.5) ? "alu0" : "alu1"] = pick(v_.by_key.at("alu0")); break;
      case 4: op["act"] = pick(v_.by_key.at("act")); break;
      case 5: op["reduce_cmd"] = pick(v_.by_key.at("reduce_cmd")); break;
      default: op[chance(0.5) ? "axis_count" : "dma_queue"] = a_number(); break;
    }
  }

  void splice_statement(Json& root) {
    std::vector<Node> bodies = select(root, [](const Node& n) { return n.key == "body" && n.node->is_array(); });
    if (bodies.empty()) return mutate_any(root);
    Json& b = *pick(bodies).node;
    Json st = donor([](const Node& n) {
      return n.node->is_object() && (n.node->contains("op") || n.node->contains("alloc") || n.node->contains("loop"));
    });
    const size_t at = below(b.size() + 1);
    if (chance(0.3) && !b.empty()) b[std::min(at, b.size() - 1)] = st;
    else b.insert(b.begin() + static_cast<std::ptrdiff_t>(at), st);
  }

  void mutate_dtype_buffer(Json& root) {
    std::vector<Node> c = select(root, [](const Node& n) {
      return (n.key == "dtype" || n.key == "buffer" || n.key == "kind" || n.key == "bufs" || n.key == "address") &&
             !n.node->is_object();
    });
    if (c.empty()) return mutate_any(root);
    Node n = pick(c);
    if (n.key == "bufs" || n.key == "address") *n.node = a_number();
    else *n.node = chance(0.9) ? Json(a_string(n.key)) : a_value(n.key);
  }

  void mutate_bytes(std::string& s) {
    if (s.empty()) {
      s = "{";
      return;
    }
    const size_t at = below(s.size());
    switch (below(6)) {
      case 0: s.erase(at, 1 + below(16)); break;
      case 1: s.insert(at, kTokens[below(std::size(kTokens))]); break;
      case 2: s[at] = static_cast<char>(below(256)); break;
      case 3: s.insert(at, s.substr(at, 1 + below(64))); break;
      case 4: s.resize(at); break;
      default: s.insert(at, std::string(1 + below(3000), chance(0.5) ? '[' : '{')); break;
    }
  }

  /// A config value: a number with the key's unit, a boundary value, or the wrong type.
  std::string config_value(const std::string& key) {
    const auto it = v_.config_values.find(key);
    const std::string cur = it == v_.config_values.end() ? "1" : it->second;
    size_t end = 0;
    while (end < cur.size() && (std::isdigit(static_cast<unsigned char>(cur[end])) || cur[end] == '.' || cur[end] == '-' ||
                                cur[end] == '+' || cur[end] == 'e' || cur[end] == 'E'))
      ++end;
    std::string unit = cur.substr(end);
    static const char* const kNums[] = {"0", "-1", "1", "1e-300", "1e300", "nan", "inf", "-inf", "0.5", "9223372036854775807",
                                        "9223372036854775808", "4294967296", "2147483648", "-0", "1e-12", "65536", "3"};
    static const char* const kUnits[] = {"", "GHz", "GB/s", "B/ns", "ns", "us", "ps", "KiB", "MiB", "B", "cycles", "%"};
    static const char* const kJunk[] = {"", "abc", "true", "[1, 2]", "{a: 1}", "null", "~", "0x10", "1,5", "\"", "- x"};
    if (chance(0.1)) return kJunk[below(std::size(kJunk))];
    if (chance(0.15)) unit = kUnits[below(std::size(kUnits))];
    if (chance(0.2) && end > 0) {  // a nearby value
      const double x = std::strtod(cur.substr(0, end).c_str(), nullptr);
      const double f[] = {0.5, 2.0, 10.0, 0.1, 1e6, 1e-6};
      return fmt::format("{}{}", x * f[below(6)], unit);
    }
    return std::string(kNums[below(std::size(kNums))]) + unit;
  }

  std::string override_text() {
    std::string key = v_.config_keys.empty() ? "x" : pick(v_.config_keys);
    if (chance(0.04)) key = chance(0.5) ? key + "x" : std::string("nope.") + key;
    if (chance(0.03)) return chance(0.5) ? key : "=" + config_value(key);
    return key + "=" + config_value(key);
  }

  std::string mutate_yaml() {
    std::vector<std::string> lines;
    std::istringstream in(v_.trn2_yaml);
    for (std::string l; std::getline(in, l);) lines.push_back(l);
    const int n = 1 + static_cast<int>(below(3));
    for (int i = 0; i < n && !lines.empty(); ++i) {
      const size_t at = below(lines.size());
      std::string& l = lines[at];
      const size_t colon = l.find(':');
      switch (below(6)) {
        case 0:
        case 1:
          if (colon != std::string::npos && colon + 2 <= l.size()) {  // a value changed
            l = l.substr(0, colon) + ": " + config_value(pick(v_.config_keys));
          }
          break;
        case 2: lines.erase(lines.begin() + static_cast<std::ptrdiff_t>(at)); break;
        case 3: lines.insert(lines.begin() + static_cast<std::ptrdiff_t>(at), l); break;  // a repeated key
        case 4: {
          static const char* const kLines[] = {"preset: trn1", "preset: c", "preset: trn9", "- 1", ": x", "\t x: 1",
                                               "  unknown_key: 3", "[", "a: &x 1", "b: *y", "%YAML 9.9"};
          lines.insert(lines.begin() + static_cast<std::ptrdiff_t>(at), kLines[below(std::size(kLines))]);
          break;
        }
        default: l = std::string(below(4), ' ') + l; break;  // indentation broken
      }
    }
    std::string out;
    for (const auto& l : lines) out += l + "\n";
    return out;
  }
};

// ------------------------------------------------------------------------------------------------
// Execution: the three entry points, each guarded.
// ------------------------------------------------------------------------------------------------

enum Outcome { kOk, kUserError, kInternal, kUncoded, kDisagree, kCrash, kHang, kNumOutcomes };
const char* const kOutcomeNames[] = {"ok", "user_error", "internal", "uncoded", "disagree", "crash", "hang"};
bool is_finding(int o) { return o >= kInternal; }

struct Verdict {
  int outcome = kOk;  ///< kOk, kUserError, kInternal, kUncoded
  int code = 0;       ///< NSIM-E code number (0: none)
  std::string detail;
  /// For comparing the entry points: "accept" (ok, or a run stopped by a limit, E416), else "E<code>".
  std::string norm() const {
    if (outcome == kOk || code == static_cast<int>(ErrorCode::kResourceLimit)) return "accept";
    if (outcome == kUserError) return fmt::format("E{}", code);
    return kOutcomeNames[outcome];
  }
};

template <class F>
Verdict guarded(F&& f) {
  Verdict v;
  try {
    f();
  } catch (const Error& e) {
    v.code = static_cast<int>(e.code());
    v.outcome = v.code >= 900 ? kInternal : kUserError;
    v.detail = std::string(e.what()).substr(0, 600);
  } catch (const std::bad_alloc&) {
    v.outcome = kInternal;
    v.detail = "std::bad_alloc (the CLI reports E901 out of memory)";
  } catch (const std::exception& e) {
    v.outcome = kUncoded;
    v.detail = fmt::format("{}: {}", typeid(e).name(), e.what()).substr(0, 600);
  } catch (...) {
    v.outcome = kUncoded;
    v.detail = "an exception that is not a std::exception";
  }
  return v;
}

/// Configurations of presets without overrides are loaded once per process (the most frequent case).
const sim::Config& cached_config(const std::string& preset) {
  static std::map<std::string, std::unique_ptr<sim::Config>> cache;
  auto& slot = cache[preset];
  if (!slot) slot = std::make_unique<sim::Config>(engines::load_config(preset));
  return *slot;
}

/// The configuration as `nsim ... --config C -p ...` builds it (a YAML file is given as its text:
/// Config::from_yaml is what Config::load runs on the file's contents).
sim::Config make_config(const Case& c) {
  if (!c.yaml.empty()) return sim::Config::from_yaml(c.yaml, engines::param_schema(), c.overrides);
  const std::string preset = c.config == "inf2" ? "trn1" : c.config;  // the CLI's config_name()
  // Only the known presets are cached (a failing name must fail every time).
  if (c.overrides.empty() && (preset == "trn1" || preset == "trn2" || preset == "trn3")) return cached_config(preset);
  return engines::load_config(preset, c.overrides);
}

struct Result {
  Verdict check, timing, full, disasm;
  int outcome = kOk;
  int code = 0;
  std::string detail;
};

std::string g_tmpdir;  // per worker: trace files

void run_path(const Case& c, bool numerics, bool trace) {
  const frontend::Kernel k = frontend::parse_kernel_json(c.kernel, "fuzz.json");
  const sim::Config cfg = make_config(c);
  SimOptions o;
  o.numerics = numerics;
  // As `nsim run --timing-only`: on by default where it applies (with a trace limit: once the trace is full).
  o.fast_forward = !numerics && !(trace && c.trace_limit == 0);
  o.max_instructions = kMaxInstructions;
  o.max_sim_time_ns = kMaxSimTimeNs;
  if (trace) {
    o.trace_path = g_tmpdir + "/t.json";
    o.trace_limit = c.trace_limit;
    std::error_code ec;
    fs::remove(o.trace_path, ec);
  }
  if (!k.core_programs.empty()) {  // cmd_run_multicore
    frontend::MultiCoreRun mc(k, cfg, o);
    if (numerics) mc.write_inputs({}, c.data_seed);
    mc.run();
    (void)mc.stats();
    return;
  }
  Simulator sim(cfg, o);
  frontend::verify_kernel(k, sim.params());
  frontend::Lowering::allocate_hbm(k, sim);
  if (numerics) frontend::write_inputs(k, sim, {}, c.data_seed);
  frontend::Lowering low(k, sim);
  std::optional<Error> stopped;
  try {
    low.run();
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kResourceLimit) throw;
    stopped = e;
    if (low.recording_occupancy()) low.write_occupancy();
  }
  sim.finish();
  (void)sim.stats();
  (void)sim.line_stats();
  if (numerics && !stopped)
    for (const auto& t : k.tensors)
      if (t.space == isa::Space::kHbm && t.kind == frontend::TensorKind::kOutput)  // as `nsim run --outputs`
        frontend::write_npy("/dev/null", sim.hbm_bytes(t.name), static_cast<size_t>(sim.memory().hbm_tensor(t.name).bytes),
                            t.dtype, t.shape);
  if (stopped) throw *stopped;
}

/// Empty if the trace file (when one was written) is valid JSON.
std::string trace_problem() {
  const std::string p = g_tmpdir + "/t.json";
  std::ifstream f(p, std::ios::binary);
  if (!f) return "";
  const std::string text((std::istreambuf_iterator<char>(f)), {});
  if (!Json::accept(text)) return fmt::format("the trace file is not valid JSON ({} bytes)", text.size());
  return "";
}

// Disagreements that are not defects: a full run needs host memory for the tensors' data that a
// timing-only run does not (E210, HostMemory).
bool explained(const Verdict& a, const Verdict& b) {
  auto host = [](const Verdict& v) { return v.code == static_cast<int>(ErrorCode::kHostMemory); };
  return (host(a) && !host(b)) || (host(b) && !host(a));
}

// The one check that depends on the data: an indirect dma_copy's runtime index outside [0, iimm[0])
// without oob_skip (E408 in the full run only; `nsim check` and a timing-only run cannot see values).
bool data_dependent(const Verdict& timing, const Verdict& full) {
  return timing.norm() == "accept" && full.code == static_cast<int>(ErrorCode::kIndexOutOfBounds) &&
         full.detail.find("indirect index") != std::string::npos;
}

Result execute(const Case& c) {
  Result r;
  r.check = guarded([&] {
    const frontend::Kernel k = frontend::parse_kernel_json(c.kernel, "fuzz.json");
    const sim::Config cfg = make_config(c);
    frontend::verify_kernel(k, engines::CoreParams::from_config(cfg));
  });
  r.timing = guarded([&] { run_path(c, false, c.trace); });
  if (c.trace && r.timing.outcome <= kUserError)
    if (std::string bad = trace_problem(); !bad.empty()) r.timing = Verdict{kInternal, 0, bad};
  r.full = guarded([&] { run_path(c, true, false); });
  if (c.disasm)
    r.disasm = guarded([&] {
      const frontend::Kernel k = frontend::parse_kernel_json(c.kernel, "fuzz.json");
      (void)frontend::disassemble_kernel(k, make_config(c), 1000);
    });
  // The worst of the paths.
  for (const Verdict* v : {&r.check, &r.timing, &r.full, &r.disasm})
    if (v->outcome > r.outcome) {
      r.outcome = v->outcome;
      r.code = v->code;
      r.detail = v->detail;
    }
  if (r.outcome == kUserError) r.code = r.check.code ? r.check.code : r.timing.code ? r.timing.code : r.full.code;
  if (!is_finding(r.outcome)) {
    const bool ct = r.check.norm() == r.timing.norm() || explained(r.check, r.timing);
    const bool tf = r.timing.norm() == r.full.norm() || explained(r.timing, r.full) || data_dependent(r.timing, r.full);
    if (!ct || !tf) {
      r.outcome = kDisagree;
      r.detail = fmt::format("check: {} | timing-only: {} | full: {}", r.check.norm(), r.timing.norm(), r.full.norm());
    }
  }
  return r;
}

Json verdict_json(const Verdict& v) { return Json{{"outcome", kOutcomeNames[v.outcome]}, {"detail", v.detail}}; }

// ------------------------------------------------------------------------------------------------
// The campaign: a parent that forks workers and watches them.
// ------------------------------------------------------------------------------------------------

constexpr int kMaxWorkers = 16;
constexpr int kMaxCodes = 1000;

struct Shared {
  std::atomic<uint64_t> next_index;
  std::atomic<int> stop;
  struct Worker {
    std::atomic<uint64_t> index;
    std::atomic<int64_t> started_ms;
    std::atomic<int> busy;
  } w[kMaxWorkers];
  std::atomic<uint64_t> outcomes[kNumOutcomes];
  std::atomic<uint64_t> codes[kMaxCodes];
  std::atomic<uint64_t> written;  ///< finding files written
  std::atomic<uint64_t> signatures[4096];  ///< finding files per signature hash bucket (at most kPerSignature)
};

constexpr uint64_t kPerSignature = 20;

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Options {
  uint64_t seed = 1;
  uint64_t first = 0;   ///< index of the first input (a campaign split into runs: --first N --inputs M)
  uint64_t inputs = 0;  ///< 0 = until --time
  double time_s = 0;    ///< 0 = until --inputs
  int jobs = 1;
  double timeout_s = 20;
  uint64_t mem_mb = 3072;
  std::string corpus = "tests/fuzz/corpus";
  std::string out = "fuzz-findings";
  std::string summary;
  double report_every = 60;
};

std::vector<Json> load_corpus(const std::string& dir) {
  std::vector<Json> seeds;
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".json") files.push_back(e.path());
  std::sort(files.begin(), files.end());  // deterministic order
  for (const auto& p : files) {
    std::ifstream f(p);
    seeds.push_back(Json::parse(f));
  }
  if (seeds.empty()) throw std::runtime_error("no seed kernels (*.json) in " + dir);
  return seeds;
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
}

Shared* g_sh = nullptr;

/// Writes a finding unless kPerSignature files of its kind were written already.
void write_finding(const Options& o, const Case& c, uint64_t index, int outcome, const std::string& detail,
                   const Result* r) {
  const std::string sig = fmt::format("{}|{}", kOutcomeNames[outcome],
                                      r ? fmt::format("{} {} {}", r->check.norm(), r->timing.norm(), r->full.norm())
                                        : detail.substr(0, 80));
  const size_t bucket = std::hash<std::string>{}(sig) % std::size(g_sh->signatures);
  if (g_sh->signatures[bucket].fetch_add(1) >= kPerSignature) return;
  g_sh->written.fetch_add(1);
  Json j = c.to_json();
  j["outcome"] = kOutcomeNames[outcome];
  j["detail"] = detail;
  j["driver"]["seed"] = o.seed;
  j["driver"]["index"] = index;
  if (r)
    j["driver"]["verdicts"] = Json{{"check", verdict_json(r->check)}, {"timing_only", verdict_json(r->timing)},
                                   {"full", verdict_json(r->full)}};
  write_file(fmt::format("{}/driver-{}-s{}-i{}.json", o.out, kOutcomeNames[outcome], o.seed, index),
             j.dump(1, ' ', false, Json::error_handler_t::replace) + "\n");
}

/// The host-memory cap of a worker (and of replay): RLIMIT_AS, which nsim's host-memory check (E210) reads.
/// Not in a sanitizer build: ASan reserves terabytes of address space for its shadow memory.
void cap_address_space(uint64_t mem_mb) {
#if !NSIM_FUZZ_ASAN
  rlimit rl{};
  getrlimit(RLIMIT_AS, &rl);
  rl.rlim_cur = static_cast<rlim_t>(mem_mb) << 20;
  if (rl.rlim_max != RLIM_INFINITY && rl.rlim_cur > rl.rlim_max) rl.rlim_cur = rl.rlim_max;
  setrlimit(RLIMIT_AS, &rl);
#else
  (void)mem_mb;
#endif
}

[[noreturn]] void worker_main(const Options& o, int w, const std::vector<Json>& seeds, const Vocabulary& v) {
  signal(SIGINT, SIG_IGN);
  signal(SIGTERM, SIG_DFL);
  cap_address_space(o.mem_mb);
  // Keep large blocks (a Simulator's 26 MiB of SBUF + PSUM) in the heap between inputs instead of
  // mapping fresh zeroed pages for every input.
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
  g_tmpdir = fmt::format("{}/.worker{}", o.out, w);
  fs::create_directories(g_tmpdir);
  Shared::Worker& me = g_sh->w[w];
  for (;;) {
    if (g_sh->stop.load()) break;
    const uint64_t i = g_sh->next_index.fetch_add(1);
    if (o.inputs && i >= o.first + o.inputs) break;
    me.index = i;
    me.started_ms = now_ms();
    me.busy = 1;
    // The hang watchdog counts CPU time, so that a loaded machine does not turn a slow input into a
    // hang: SIGPROF (default action: terminate) after --timeout CPU seconds on this input.
    itimerval cpu{};
    cpu.it_value.tv_sec = static_cast<time_t>(o.timeout_s);
    cpu.it_value.tv_usec = static_cast<suseconds_t>((o.timeout_s - std::floor(o.timeout_s)) * 1e6);
    setitimer(ITIMER_PROF, &cpu, nullptr);
    const Case c = Generator(seeds, v, o.seed, i).make();
    const Result r = execute(c);
    cpu = itimerval{};
    setitimer(ITIMER_PROF, &cpu, nullptr);
    g_sh->outcomes[r.outcome].fetch_add(1);
    if (r.code > 0 && r.code < kMaxCodes) g_sh->codes[r.code].fetch_add(1);
    if (is_finding(r.outcome)) write_finding(o, c, i, r.outcome, r.detail, &r);
    me.busy = 0;
  }
  std::fflush(nullptr);
  _exit(0);
}

volatile std::sig_atomic_t g_interrupted = 0;
extern "C" void on_interrupt(int) { g_interrupted = 1; }

std::string tail_of(const std::string& path, size_t n) {
  std::ifstream f(path, std::ios::binary);
  std::string s((std::istreambuf_iterator<char>(f)), {});
  return s.size() > n ? s.substr(s.size() - n) : s;
}

Json summary_json(const Options& o, double secs) {
  Json outcomes = Json::object(), codes = Json::object();
  uint64_t total = 0;
  for (int k = 0; k < kNumOutcomes; ++k) {
    outcomes[kOutcomeNames[k]] = g_sh->outcomes[k].load();
    total += g_sh->outcomes[k].load();
  }
  std::vector<std::pair<uint64_t, int>> by;
  for (int c = 0; c < kMaxCodes; ++c)
    if (g_sh->codes[c].load()) by.emplace_back(g_sh->codes[c].load(), c);
  std::sort(by.rbegin(), by.rend());
  for (const auto& [n, c] : by) codes[fmt::format("E{}", c)] = n;
  return Json{{"inputs", total},   {"seconds", std::round(secs * 10) / 10}, {"seed", o.seed}, {"first", o.first},
              {"next_index", g_sh->next_index.load()},
              {"jobs", o.jobs},    {"sanitizer_build", NSIM_FUZZ_ASAN == 1}, {"outcomes", outcomes},
              {"codes", codes},    {"finding_files", g_sh->written.load()}};
}

void print_progress(const Options& o, double secs) {
  const Json s = summary_json(o, secs);
  const uint64_t n = s["inputs"].get<uint64_t>();
  std::string parts;
  for (auto it = s["outcomes"].begin(); it != s["outcomes"].end(); ++it)
    parts += fmt::format(" {} {}", it.key(), it.value().get<uint64_t>());
  fmt::print("[{:>7.0f} s] {} inputs ({:.0f}/s):{}\n", secs, n, secs > 0 ? static_cast<double>(n) / secs : 0.0, parts);
  std::fflush(stdout);
}

int cmd_run(const Options& o) {
  const std::vector<Json> seeds = load_corpus(o.corpus);
  const Vocabulary vocab = make_vocabulary(seeds);
  fs::create_directories(o.out);
  (void)cached_config("trn2");  // loaded once, shared by the forked workers
  void* mem = mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) throw std::runtime_error("mmap failed");
  g_sh = new (mem) Shared();
  g_sh->next_index = o.first;
  signal(SIGINT, on_interrupt);
  signal(SIGTERM, on_interrupt);
  const int jobs = std::clamp(o.jobs, 1, kMaxWorkers);
  std::vector<pid_t> pids(static_cast<size_t>(jobs), 0);
  auto log_path = [&](int w) { return fmt::format("{}/.worker{}.log", o.out, w); };
  auto spawn = [&](int w) {
    g_sh->w[w].busy = 0;
    std::fflush(nullptr);
    const pid_t pid = fork();
    if (pid < 0) throw std::runtime_error("fork failed");
    if (pid == 0) {
      const int fd = open(log_path(w).c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) dup2(fd, 2), close(fd);
      worker_main(o, w, seeds, vocab);
    }
    pids[static_cast<size_t>(w)] = pid;
  };
  fmt::print("nsim_fuzz: seed {}, {} worker(s), {}{}, {} seed kernels, findings in {}/{}\n", o.seed, jobs,
             o.inputs ? fmt::format("{} inputs", o.inputs) : std::string("no input limit"),
             o.time_s > 0 ? fmt::format(", at most {} s", o.time_s) : std::string(""), seeds.size(), o.out,
             NSIM_FUZZ_ASAN ? " (ASan+UBSan build)" : "");
  const int64_t t0 = now_ms();
  for (int w = 0; w < jobs; ++w) spawn(w);
  int64_t last_report = t0;
  auto more_work = [&] { return !g_sh->stop.load() && (!o.inputs || g_sh->next_index.load() < o.first + o.inputs); };
  auto on_death = [&](int w, int outcome, const std::string& why) {
    Shared::Worker& me = g_sh->w[w];
    if (me.busy.load()) {
      const uint64_t i = me.index.load();
      g_sh->outcomes[outcome].fetch_add(1);
      const Case c = Generator(seeds, vocab, o.seed, i).make();
      write_finding(o, c, i, outcome, why + "\n" + tail_of(log_path(w), 4000), nullptr);
      fmt::print("nsim_fuzz: input {}: {} ({})\n", i, kOutcomeNames[outcome], why);
    } else {
      fmt::print("nsim_fuzz: worker {} died between inputs ({}): {}\n", w, why, tail_of(log_path(w), 2000));
      g_sh->outcomes[kCrash].fetch_add(1);
    }
    if (more_work()) spawn(w);
    else pids[static_cast<size_t>(w)] = 0;
  };
  for (;;) {
    usleep(20000);
    const int64_t now = now_ms();
    if (g_interrupted || (o.time_s > 0 && now - t0 >= static_cast<int64_t>(o.time_s * 1000))) g_sh->stop = 1;
    int alive = 0;
    for (int w = 0; w < jobs; ++w) {
      const pid_t pid = pids[static_cast<size_t>(w)];
      if (!pid) continue;
      int status = 0;
      const pid_t got = waitpid(pid, &status, WNOHANG);
      if (got == pid) {
        if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
          pids[static_cast<size_t>(w)] = 0;
          if (more_work()) spawn(w), ++alive;  // not expected: a worker leaves only when the work is done
          continue;
        }
        const std::string why = WIFSIGNALED(status) ? fmt::format("killed by signal {} ({})", WTERMSIG(status),
                                                                   strsignal(WTERMSIG(status)))
                                                     : fmt::format("exit status {}", WEXITSTATUS(status));
        if (WIFSIGNALED(status) && WTERMSIG(status) == SIGPROF)
          on_death(w, kHang, fmt::format("more than {} s of CPU time", o.timeout_s));
        else
          on_death(w, kCrash, why);
        if (pids[static_cast<size_t>(w)]) ++alive;
        continue;
      }
      const Shared::Worker& me = g_sh->w[w];
      if (me.busy.load() && now - me.started_ms.load() > static_cast<int64_t>(o.timeout_s * 10000)) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        on_death(w, kHang, fmt::format("no answer within {} s of wall time", o.timeout_s * 10));
        if (pids[static_cast<size_t>(w)]) ++alive;
        continue;
      }
      ++alive;
    }
    if (o.report_every > 0 && now - last_report >= static_cast<int64_t>(o.report_every * 1000)) {
      last_report = now;
      print_progress(o, static_cast<double>(now - t0) / 1000);
    }
    if (!alive) break;
  }
  const double secs = static_cast<double>(now_ms() - t0) / 1000;
  print_progress(o, secs);
  const Json s = summary_json(o, secs);
  fmt::print("codes: {}\n", s["codes"].dump());
  if (!o.summary.empty()) write_file(o.summary, s.dump(1, ' ', false, Json::error_handler_t::replace) + "\n");
  for (int w = 0; w < jobs; ++w) {
    std::error_code ec;
    if (fs::file_size(log_path(w), ec) == 0) fs::remove(log_path(w), ec);
    fs::remove_all(fmt::format("{}/.worker{}", o.out, w), ec);
  }
  uint64_t findings = 0;
  for (int k = kInternal; k < kNumOutcomes; ++k) findings += g_sh->outcomes[k].load();
  return findings ? 1 : 0;
}

// ---- replay: each case file (or a plain kernel.json) through the three entry points, in this process.

int cmd_replay(const std::vector<std::string>& paths, bool verbose, uint64_t mem_mb) {
  cap_address_space(mem_mb);
  std::vector<fs::path> files;
  for (const auto& p : paths) {
    if (fs::is_directory(p)) {
      std::vector<fs::path> in;
      for (const auto& e : fs::directory_iterator(p))
        if (e.path().extension() == ".json") in.push_back(e.path());
      std::sort(in.begin(), in.end());
      files.insert(files.end(), in.begin(), in.end());
    } else {
      files.emplace_back(p);
    }
  }
  const std::string tmp = (fs::temp_directory_path() / fmt::format("nsim-fuzz-replay-{}", getpid())).string();
  fs::create_directories(tmp);
  g_tmpdir = tmp;
  int bad = 0, ran = 0, skipped = 0;
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    const std::string text((std::istreambuf_iterator<char>(in)), {});
    Json j = Json::parse(text, nullptr, false);
    Case c;
    std::string expect;
    if (!j.is_discarded() && j.is_object() && j.contains("nsim_kernel")) {
      c.kernel = text;  // a seed kernel
    } else if (!j.is_discarded() && j.is_object() && j.value("kind", "") == "kernel") {
      c = Case::from_json(j);
      expect = j.value("expect", "");
    } else {
      ++skipped;  // a CLI case (fuzz.py replays those through the binary)
      continue;
    }
    ++ran;
    const Result r = execute(c);
    bool fail = is_finding(r.outcome);
    if (!expect.empty() && !fail) {
      const std::string got = r.outcome == kOk ? "ok" : fmt::format("NSIM-E{}", r.code);
      if (expect == "ok" ? got != "ok" : got.find(expect) == std::string::npos && r.detail.find(expect) == std::string::npos) {
        fail = true;
      }
    }
    bad += fail;
    if (fail || verbose)
      fmt::print("{:<10} {}  check: {} | timing-only: {} | full: {}{}\n", fail ? "FAIL" : kOutcomeNames[r.outcome],
                 f.string(), r.check.norm(), r.timing.norm(), r.full.norm(),
                 fail ? fmt::format("\n           {}{}", r.detail.substr(0, 300),
                                    expect.empty() ? "" : " (expected " + expect + ")")
                      : "");
  }
  std::error_code ec;
  fs::remove_all(tmp, ec);
  fmt::print("nsim_fuzz replay: {} case(s), {} failed, {} CLI case(s) skipped\n", ran, bad, skipped);
  return bad ? 1 : 0;
}

const char* const kUsage =
    "usage: nsim_fuzz run [--seed N] [--first I] [--inputs N] [--time SECONDS] [-j N] [--timeout SECONDS] [--mem-mb N]\n"
    "                     [--corpus DIR] [--out DIR] [--summary FILE] [--report-every SECONDS]\n"
    "       nsim_fuzz replay [-v] FILE|DIR...\n"
    "       nsim_fuzz gen --seed N --index I [--corpus DIR]    (print input I of seed N as a case file)\n"
    "run: mutated kernel.json / config inputs through check, run --timing-only and run (docs/reliability.md);\n"
    "inputs are numbered from --first (default 0): a campaign can be split into runs of consecutive ranges.\n"
    "exit 1 if any input was a finding (internal, uncoded, disagree, crash, hang). Without --inputs and\n"
    "--time it runs 1000 inputs.\n";

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || std::find_if(args.begin(), args.end(), [](const std::string& a) { return a == "-h" || a == "--help"; }) != args.end()) {
    fmt::print("{}", kUsage);
    return args.empty() ? 2 : 0;
  }
  try {
    Options o;
    uint64_t index = 0;
    bool verbose = false;
    std::vector<std::string> rest;
    for (size_t i = 1; i < args.size(); ++i) {
      const std::string& a = args[i];
      auto val = [&]() -> std::string {
        if (i + 1 >= args.size()) throw std::runtime_error(a + " needs a value");
        return args[++i];
      };
      if (a == "--seed") o.seed = std::stoull(val());
      else if (a == "--inputs") o.inputs = std::stoull(val());
      else if (a == "--first") o.first = std::stoull(val());
      else if (a == "--time") o.time_s = std::stod(val());
      else if (a == "-j" || a == "--jobs") o.jobs = std::stoi(val());
      else if (a == "--timeout") o.timeout_s = std::stod(val());
      else if (a == "--mem-mb") o.mem_mb = std::stoull(val());
      else if (a == "--corpus") o.corpus = val();
      else if (a == "--out") o.out = val();
      else if (a == "--summary") o.summary = val();
      else if (a == "--report-every") o.report_every = std::stod(val());
      else if (a == "--index") index = std::stoull(val());
      else if (a == "-v") verbose = true;
      else if (!a.empty() && a[0] == '-') throw std::runtime_error("unknown option " + a);
      else rest.push_back(a);
    }
    if (args[0] == "run") {
      if (!o.inputs && o.time_s <= 0) o.inputs = 1000;
      return cmd_run(o);
    }
    if (args[0] == "replay") return cmd_replay(rest, verbose, o.mem_mb);
    if (args[0] == "gen") {
      const std::vector<Json> seeds = load_corpus(o.corpus);
      const Vocabulary vocab = make_vocabulary(seeds);
      fmt::print("{}\n", Generator(seeds, vocab, o.seed, index).make().to_json().dump(1));
      return 0;
    }
    fmt::print(stderr, "{}", kUsage);
    return 2;
  } catch (const std::exception& e) {
    fmt::print(stderr, "nsim_fuzz: {}\n", e.what());
    return 2;
  }
}
