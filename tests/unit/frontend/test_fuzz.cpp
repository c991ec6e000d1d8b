// Seeded mutation fuzzing of the kernel.json reader: every mutant must either parse or throw an
// nsim::Error with an E4xx code (no other exception, no crash). Parsed mutants also go through
// verify_kernel, which may only throw nsim::Error.
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <cctype>
#include <cstdint>
#include <iterator>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "engines/params.h"
#include "frontend/ir.h"
#include "frontend/json.h"
#include "frontend/lower.h"
#include "sim/error.h"

using namespace nsim;
using namespace nsim::frontend;

namespace {

const char* const kSeeds[] = {
    // 1: tiled elementwise with broadcast, nested loops.
    R"({
  "nsim_kernel": 1,
  "name": "add_bias",
  "tensors": [
    {"name": "x", "buffer": "hbm", "kind": "input", "dtype": "bfloat16", "shape": [2, 256, 512]},
    {"name": "b", "buffer": "hbm", "kind": "input", "dtype": "float32", "shape": [128, 1]},
    {"name": "y", "buffer": "hbm", "kind": "output", "dtype": "bfloat16", "shape": [2, 256, 512]}
  ],
  "body": [
    {"alloc": {"name": "bt", "buffer": "sbuf", "dtype": "float32", "shape": [128, 1]}},
    {"op": "dma_copy", "dst": "bt", "src": "b", "loc": {"file": "k.py", "line": 3, "function": "k"}},
    {"loop": {"var": "n", "stop": 2, "kind": "sequential", "body": [
      {"loop": {"var": "i", "start": 0, "stop": 2, "step": 1, "body": [
        {"alloc": {"name": "xt", "buffer": "sbuf", "dtype": "bfloat16", "shape": [128, 512], "bufs": 2}},
        {"op": "dma_copy", "dst": "xt", "src": {"tensor": "x", "index": ["n", {"start": "128*i", "size": 128}]},
         "loc": {"file": "k.py", "line": 6, "function": "k"}},
        {"op": "tensor_tensor", "engine": "vector", "dst": "xt", "data1": "xt",
         "data2": {"tensor": "bt", "index": [{"size": 128}, {"broadcast": 512}]}, "alu0": "add",
         "loc": {"file": "k.py", "line": 7, "function": "k"}},
        {"op": "dma_copy", "dst": {"tensor": "y", "index": ["n", {"start": "128*i", "size": 128}]}, "src": "xt",
         "loc": {"file": "k.py", "line": 8, "function": "k"}}
      ]}}
    ]}}
  ]
})",
    // 2: matmul with PSUM accumulation.
    R"({
  "nsim_kernel": 1,
  "name": "mm",
  "tensors": [
    {"name": "a", "buffer": "hbm", "kind": "input", "dtype": "bfloat16", "shape": [256, 128]},
    {"name": "w", "buffer": "hbm", "kind": "input", "dtype": "bfloat16", "shape": [256, 512]},
    {"name": "c", "buffer": "hbm", "kind": "output", "dtype": "float32", "shape": [128, 512]}
  ],
  "body": [
    {"alloc": {"name": "acc", "buffer": "psum", "dtype": "float32", "shape": [128, 512]}},
    {"loop": {"var": "k", "stop": 2, "kind": "sequential", "body": [
      {"alloc": {"name": "at", "buffer": "sbuf", "dtype": "bfloat16", "shape": [128, 128]}},
      {"alloc": {"name": "wt", "buffer": "sbuf", "dtype": "bfloat16", "shape": [128, 512]}},
      {"op": "dma_copy", "dst": "at", "src": {"tensor": "a", "index": [{"start": "128*k", "size": 128}]}},
      {"op": "dma_copy", "engine": "scalar", "dma_queue": 1, "dst": "wt", "src": {"tensor": "w", "index": [{"start": "128*k", "size": 128}, {"start": 0, "size": 512}]}},
      {"op": "nc_matmul", "dst": "acc", "stationary": "at", "moving": "wt", "flags": ["accumulate"],
       "loc": {"file": "mm.py", "line": 21, "function": "mm"}}
    ]}},
    {"alloc": {"name": "ct", "buffer": "sbuf", "dtype": "float32", "shape": [128, 512]}},
    {"op": "tensor_copy", "dst": "ct", "src": "acc"},
    {"op": "dma_copy", "dst": "c", "src": "ct"}
  ]
})",
    // 3: immediates of every kind.
    R"({
  "nsim_kernel": 1,
  "name": "imms",
  "tensors": [{"name": "o", "buffer": "hbm", "kind": "output", "dtype": "float32", "shape": [128, 64]}],
  "body": [
    {"alloc": {"name": "t", "buffer": "sbuf", "dtype": "float32", "shape": [128, 64]}},
    {"alloc": {"name": "r", "buffer": "sbuf", "dtype": "float32", "shape": [128, 1]}},
    {"op": "iota", "dst": "t", "iimm": [0, 1, 1, 64]},
    {"op": "activation", "dst": "t", "data": "t", "act": "exp", "imm": [0, 0, 0.5, -1.25], "reduce_res": "r",
     "alu1": "add", "reduce_cmd": "reset_reduce", "loc": {"file": "i.py", "line": 2}},
    {"op": "tensor_reduce", "dst": "r", "data": "t", "alu0": "maximum", "axis_count": 1, "flags": ["negate"]},
    {"op": "nc_stream_shuffle", "dst": "t", "src": "t",
     "shuffle": [1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14, 17, 16, 19, 18, 21, 20, 23, 22, 25, 24, 27, 26, 29, 28, 31, 30]},
    {"op": "memset", "dst": "r", "imm": ["-inf"]},
    {"loop": {"var": "j", "stop": 4, "step": 2, "kind": "static", "body": [
      {"op": "tensor_scalar", "dst": {"tensor": "t", "index": [{"size": 128}, {"start": "16*j", "size": 16}]},
       "data": {"tensor": "t", "index": [{"size": 128}, {"start": "16*j + 8", "size": 16, "step": 1}]},
       "alu0": "multiply", "imm": [2], "flags": ["has_imm0"]}
    ]}},
    {"op": "dma_copy", "dst": "o", "src": "t"}
  ]
})",
};

const char* const kNumbers[] = {"1e18",  "-1", "0",    "9223372036854775808", "1.5",  "-9223372036854775808", "1e400",
                                "4294967296", "2147483648", "-0", "1e-400", "129", "65", "99999999999999999999999", "3"};
const char* const kStrings[] = {"\"nope\"",    "\"tensor_tensr\"", "\"i*j\"",   "\"\"",       "\"x\"",      "\"hbm\"",
                                "\"psum\"",    "\"sbuf\"",         "\"float64\"", "\"k\"",    "\"n*128+\"", "\"(((i)\"",
                                "\"gpsimd\"",  "\"bypass\"",       "\"i\"",     "\"\\ud800\"", "\"\\u0000\"", "\"acc\"",
                                "\"nc_matmul\"", "\"reset\"",      "\"sequential\"", "\"-i - -i\"", "\"128*i - 1\""};
const char* const kInserts[] = {"\"step\": 0, ", "\"stop\": 1e18, ", "\"start\": -5, ", "\"bufs\": -1, ", "\"kind\": \"x\", ",
                                "\"loc\": 5, ", "\"imm\": [1e39], ", "\"index\": [0, 0, 0, 0, 0, 0], ", "\"broadcast\": 0, ",
                                "\"flags\": [65536], ", "\"data3\": \"t\", ", ",", "]", "}", "{", "[", "\"", "\\", "\x01", "\xff",
                                "\xc3\xa9", "null, ", "{\"loop\": {\"var\": \"n\", \"stop\": 2}}, "};

std::vector<std::pair<size_t, size_t>> tokens(const std::string& s, bool strings) {
  // Byte ranges of JSON strings (with quotes) or of numbers, found by a simple scan.
  std::vector<std::pair<size_t, size_t>> out;
  size_t i = 0;
  while (i < s.size()) {
    if (s[i] == '"') {
      size_t j = i + 1;
      while (j < s.size() && s[j] != '"') j += (s[j] == '\\') ? 2 : 1;
      if (j >= s.size()) break;
      if (strings) out.emplace_back(i, j + 1 - i);
      i = j + 1;
    } else if (s[i] == '-' || (s[i] >= '0' && s[i] <= '9')) {
      size_t j = i + 1;
      while (j < s.size() && (std::isdigit(static_cast<unsigned char>(s[j])) || s[j] == '.' || s[j] == 'e' || s[j] == 'E' ||
                              s[j] == '+' || s[j] == '-'))
        ++j;
      if (!strings) out.emplace_back(i, j - i);
      i = j;
    } else {
      ++i;
    }
  }
  return out;
}

template <size_t N>
const char* pick(std::mt19937_64& rng, const char* const (&a)[N]) {
  return a[std::uniform_int_distribution<size_t>(0, N - 1)(rng)];
}

size_t uniform(std::mt19937_64& rng, size_t n) { return n == 0 ? 0 : std::uniform_int_distribution<size_t>(0, n - 1)(rng); }

void mutate_once(std::string& s, std::mt19937_64& rng) {
  if (s.empty()) {
    s.assign(1, '{');
    return;
  }
  switch (uniform(rng, 12)) {
    case 0:  // truncate
      s.resize(uniform(rng, s.size()));
      break;
    case 1: {  // delete a range
      const size_t at = uniform(rng, s.size());
      s.erase(at, 1 + uniform(rng, 8));
      break;
    }
    case 2: {  // duplicate a range
      const size_t at = uniform(rng, s.size());
      const size_t n = 1 + uniform(rng, 40);
      s.insert(at, s.substr(at, n));
      break;
    }
    case 3: {  // swap two bytes
      std::swap(s[uniform(rng, s.size())], s[uniform(rng, s.size())]);
      break;
    }
    case 4: {  // replace a number
      auto t = tokens(s, false);
      if (t.empty()) break;
      const auto [at, n] = t[uniform(rng, t.size())];
      s.replace(at, n, pick(rng, kNumbers));
      break;
    }
    case 5: {  // replace a string
      auto t = tokens(s, true);
      if (t.empty()) break;
      const auto [at, n] = t[uniform(rng, t.size())];
      s.replace(at, n, pick(rng, kStrings));
      break;
    }
    case 6: {  // change a type: number -> string, array <-> object, value -> null
      auto t = tokens(s, uniform(rng, 2) == 0);
      const int how = static_cast<int>(uniform(rng, 3));
      if (how == 0 && !t.empty()) {
        const auto [at, n] = t[uniform(rng, t.size())];
        s.replace(at, n, fmt::format("\"{}\"", s.substr(at, n)));  // fmt: GCC 12 false -Wrestrict on operator+
      } else if (how == 1) {
        const size_t at = uniform(rng, s.size());
        const size_t p = s.find_first_of("[]{}", at);
        if (p != std::string::npos) s[p] = s[p] == '[' ? '{' : s[p] == ']' ? '}' : s[p] == '{' ? '[' : ']';
      } else if (!t.empty()) {
        const auto [at, n] = t[uniform(rng, t.size())];
        s.replace(at, n, uniform(rng, 2) ? "[]" : "{}");
      }
      break;
    }
    case 7: {  // nest deeply around a value
      auto t = tokens(s, uniform(rng, 2) == 0);
      if (t.empty()) break;
      const auto [at, n] = t[uniform(rng, t.size())];
      const size_t depth = uniform(rng, 2) ? 250 + uniform(rng, 20) : 1 + uniform(rng, 5);
      s.replace(at, n, std::string(depth, '[') + s.substr(at, n) + std::string(depth, ']'));
      break;
    }
    case 8: {  // absurd loop bounds
      const char* keys[] = {"\"stop\": ", "\"step\": ", "\"start\": "};
      const std::string key = keys[uniform(rng, 3)];
      const size_t p = s.find(key, uniform(rng, s.size()));
      if (p == std::string::npos) break;
      const size_t v = p + key.size();
      const size_t e = s.find_first_of(",}", v);
      if (e == std::string::npos) break;
      const char* vals[] = {"0", "1e18", "-1e18", "-9223372036854775808", "9223372036854775807", "1099511627777", "-3", "\"i\""};
      s.replace(v, e - v, vals[uniform(rng, std::size(vals))]);
      break;
    }
    case 9: {  // insert a snippet after a '{' or anywhere
      size_t at = uniform(rng, s.size());
      if (uniform(rng, 2)) {
        const size_t p = s.find('{', at);
        if (p != std::string::npos) at = p + 1;
      }
      s.insert(at, pick(rng, kInserts));
      break;
    }
    case 10: {  // random bytes
      const size_t at = uniform(rng, s.size());
      s[at] = static_cast<char>(uniform(rng, 256));
      break;
    }
    default: {  // deep loop nesting in a body
      const size_t p = s.find("\"body\": [", uniform(rng, s.size()));
      if (p == std::string::npos) break;
      const int n = 60 + static_cast<int>(uniform(rng, 10));
      std::string nest;
      for (int d = 0; d < n; ++d) nest += R"({"loop": {"var": "z)" + std::to_string(d) + R"(", "stop": 3, "body": [)";
      for (int d = 0; d < n; ++d) nest += "]}}";
      s.insert(p + 9, nest + ", ");
      break;
    }
  }
}

using json::Value;

size_t count_nodes(const Value& v) {
  size_t n = 1;
  for (const Value& c : v.items()) n += count_nodes(c);
  return n;
}

Value mutate_node(const Value& v, std::mt19937_64& rng) {
  const char* names[] = {"bogus", "dst", "src", "data", "index", "tensor", "start", "size", "step", "broadcast", "body", "var"};
  switch (uniform(rng, 10)) {
    case 0: {
      const int64_t vals[] = {-7, 0, 1, 129, 1099511627777, INT64_MAX, INT64_MIN};
      return Value::integer(vals[uniform(rng, std::size(vals))]);
    }
    case 1: {
      // kStrings entries are JSON literals; use their text without the quotes (escapes kept verbatim).
      const std::string lit = pick(rng, kStrings);
      return Value::string(lit.substr(1, lit.size() - 2));
    }
    case 2: return uniform(rng, 2) ? Value() : Value::boolean(true);
    case 3: return uniform(rng, 2) ? Value::array() : Value::object();
    case 4: return Value::number(v.as_double() * (uniform(rng, 2) ? -1.0 : 1e12) + (uniform(rng, 2) ? 0.5 : 0.0));
    default: break;
  }
  if (v.is_object() && v.size() > 0) {
    Value o = Value::object();
    const size_t victim = uniform(rng, v.size());
    const size_t how = uniform(rng, 3);
    for (size_t i = 0; i < v.size(); ++i) {
      if (i == victim && how == 0) continue;  // drop a member
      o.set(i == victim && how == 1 ? names[uniform(rng, std::size(names))] : v.key(i), v[i]);  // rename
      if (i == victim && how == 2) o.set("extra", v[i]);
    }
    return o;
  }
  if (v.is_array() && v.size() > 0) {
    Value a = Value::array();
    const size_t victim = uniform(rng, v.size());
    const bool drop = uniform(rng, 2) != 0;
    for (size_t i = 0; i < v.size(); ++i) {
      if (i == victim && drop) continue;
      a.push(v[i]);
      if (i == victim) a.push(v[i]);  // duplicate (an alloc twice, a dim more, ...)
    }
    return a;
  }
  return Value::integer(0);
}

/// Copy of `v` with the `target`-th node (pre-order) mutated.
Value rebuild(const Value& v, size_t& counter, size_t target, std::mt19937_64& rng) {
  if (counter++ == target) return mutate_node(v, rng);
  if (v.is_array()) {
    Value a = Value::array();
    for (const Value& c : v.items()) a.push(rebuild(c, counter, target, rng));
    return a;
  }
  if (v.is_object()) {
    Value o = Value::object();
    for (size_t i = 0; i < v.size(); ++i) o.set(v.key(i), rebuild(v[i], counter, target, rng));
    return o;
  }
  return v;
}

/// A structural mutation: well-formed JSON, so the schema checks (not the JSON parser) get exercised.
void mutate_structure(std::string& s, std::mt19937_64& rng) {
  Value root;
  try {
    root = json::parse(s);
  } catch (const Error&) {
    mutate_once(s, rng);
    return;
  }
  size_t counter = 0;
  s = json::write(rebuild(root, counter, uniform(rng, count_nodes(root)), rng));
}

bool is_kernel_ir_error(ErrorCode c) {
  const int v = static_cast<int>(c);
  return v >= 401 && v <= 499;
}

}  // namespace

TEST_CASE("fuzz: the seeds are valid kernels", "[fuzz]") {
  const auto params = engines::CoreParams::from_config(engines::load_config("trn2"));
  for (const char* seed : kSeeds) {
    const Kernel k = parse_kernel_json(seed);
    CHECK(parse_kernel_json(write_kernel_json(k)) == k);
    CHECK_NOTHROW(verify_kernel(k, params));
  }
}

TEST_CASE("fuzz: mutated kernels parse or fail with an E4xx error", "[fuzz]") {
  const auto params = engines::CoreParams::from_config(engines::load_config("trn2"));
  std::mt19937_64 rng(0x6e73696d);  // fixed seed: reproducible
  constexpr int kMutants = 12000;
  int accepted = 0, rejected = 0, verified = 0, verify_rejected = 0;
  std::map<int, int> by_code;
  for (int n = 0; n < kMutants; ++n) {
    std::string text = kSeeds[n % std::size(kSeeds)];
    const int rounds = 1 + static_cast<int>(uniform(rng, 3));
    for (int r = 0; r < rounds; ++r) {
      if (uniform(rng, 2)) {
        mutate_structure(text, rng);
      } else {
        mutate_once(text, rng);
      }
    }
    Kernel k;
    bool ok = false;
    try {
      k = parse_kernel_json(text, "fuzz.json");
      ok = true;
    } catch (const Error& e) {
      ++rejected;
      ++by_code[static_cast<int>(e.code())];
      if (!is_kernel_ir_error(e.code())) {
        INFO("mutant #" << n << ":\n" << text << "\nerror: " << e.what());
        REQUIRE(is_kernel_ir_error(e.code()));
      }
      if (e.message().empty()) {
        INFO("mutant #" << n);
        REQUIRE_FALSE(e.message().empty());
      }
    }
    // Any other exception escapes and fails the test case.
    if (!ok) continue;
    ++accepted;
    // A parsed kernel writes and re-reads to itself (NaN immediates aside).
    const std::string w = write_kernel_json(k);
    const Kernel back = parse_kernel_json(w);
    if (!(back == k)) {
      bool has_nan = false;
      for (const Op& op : k.ops)
        for (float f : op.imm) has_nan = has_nan || f != f;
      if (!has_nan) {
        INFO("mutant #" << n << ":\n" << text << "\nwritten:\n" << w);
        REQUIRE(back == k);
      }
    }
    try {
      verify_kernel(k, params);
      ++verified;
    } catch (const Error&) {
      ++verify_rejected;
    }
  }
  std::string codes;
  for (auto [c, cnt] : by_code) codes += " E" + std::to_string(c) + ":" + std::to_string(cnt);
  WARN("fuzz: " << kMutants << " mutants, " << accepted << " parsed (" << verified << " verified, " << verify_rejected
                << " rejected by verify_kernel), " << rejected << " rejected by the reader:" << codes);
  CHECK(accepted + rejected == kMutants);
  CHECK(rejected > kMutants / 4);  // the mutations do bite
  CHECK(accepted > 100);           // and some survive to exercise the writer and verify_kernel
  CHECK(by_code.size() >= 8);      // many different error paths were reached
}
