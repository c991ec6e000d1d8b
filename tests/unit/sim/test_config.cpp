// Config: unit parsing, presets and inheritance, overrides, every error code, to_yaml round trip, and
// agreement between engines/params.def, configs/*.yaml and configs/README.md.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "sim/config.h"
#include "sim/error.h"

namespace {

using nsim::Error;
using nsim::ErrorCode;
using nsim::sim::Config;
using nsim::sim::ParamDecl;
using nsim::sim::ParamKind;
namespace fs = std::filesystem;

static const nsim::sim::ParamDecl kSchema[] = {
#define PARAM(k, kind, lo, hi, reader, d) {k, nsim::sim::ParamKind::kind, d, lo, hi},
#include "engines/params.def"
#undef PARAM
};

// A small schema with one key of every kind.
static const ParamDecl kSmall[] = {
    {"name", ParamKind::kString, ""},        {"a.int", ParamKind::kInt, ""},
    {"a.real", ParamKind::kReal, ""},        {"a.bool", ParamKind::kBool, ""},
    {"a.freq", ParamKind::kFrequency, ""},   {"a.bytes", ParamKind::kBytes, ""},
    {"a.bw", ParamKind::kBandwidth, ""},     {"a.time", ParamKind::kTime, ""},
    {"a.cycles", ParamKind::kCycles, ""},    {"a.list", ParamKind::kStringList, ""},
};

const char* const kSmallYaml = R"(
name: small
a:
  int: -3
  real: 0.25
  bool: true
  freq: 960MHz
  bytes: 2KiB
  bw: 410GB/s
  time: 3us
  cycles: 64cycles
  list: [x, y+z]
)";

// Runs f, which must throw nsim::Error; returns it (or fails the test).
Error error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e;
  }
  FAIL("expected an nsim::Error");
  return Error(ErrorCode::kInternal, "unreachable");
}

ErrorCode code_of(const std::function<void()>& f) { return error_of(f).code(); }

/// A fresh directory under the system temp dir, removed at scope exit.
struct TempDir {
  fs::path path;
  TempDir() {
    static int counter = 0;
    path = fs::temp_directory_path() / ("nsim_test_config_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string write(const std::string& rel, const std::string& text) const {
    const fs::path p = path / rel;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
    return p.string();
  }
};

std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

// ------------------------------------------------------------------------------------------------
// Unit parsing

TEST_CASE("frequency parsing normalises to GHz", "[config][units]") {
  using nsim::sim::parse_frequency_ghz;
  CHECK(parse_frequency_ghz("1.4GHz", "k") == Approx(1.4));
  CHECK(parse_frequency_ghz("960MHz", "k") == Approx(0.96));
  CHECK(parse_frequency_ghz("1e9Hz", "k") == Approx(1.0));
  CHECK(parse_frequency_ghz("2500kHz", "k") == Approx(0.0025));
  CHECK(parse_frequency_ghz(" 1.2 GHz ", "k") == Approx(1.2));
  for (const char* bad : {"1.4", "1.4ghz", "1.4 Ghz", "GHz", "fast", "", "-1GHz", "0GHz", "1.4GHzz", "nanGHz"}) {
    INFO(bad);
    CHECK(code_of([&] { parse_frequency_ghz(bad, "clock.x"); }) == ErrorCode::kConfigBadValue);
  }
  const Error e = error_of([] { parse_frequency_ghz("2.8Ghz", "clock.tensor"); });
  CHECK_THAT(e.message(), Catch::Contains("clock.tensor") && Catch::Contains("a frequency such as 1.4GHz") &&
                              Catch::Contains("'2.8Ghz'") && Catch::Contains("unknown unit 'Ghz'"));
  CHECK_THAT(std::string(e.what()), Catch::StartsWith("NSIM-E102"));
}

TEST_CASE("byte sizes parse to whole bytes", "[config][units]") {
  using nsim::sim::parse_bytes;
  CHECK(parse_bytes("192KiB", "k") == 196608);
  CHECK(parse_bytes("2KiB", "k") == 2048);
  CHECK(parse_bytes("16GiB", "k") == 17179869184LL);
  CHECK(parse_bytes("1MiB", "k") == 1048576);
  CHECK(parse_bytes("1TiB", "k") == 1099511627776LL);
  CHECK(parse_bytes("1KB", "k") == 1000);
  CHECK(parse_bytes("1kB", "k") == 1000);
  CHECK(parse_bytes("1.1KB", "k") == 1100);
  CHECK(parse_bytes("1.5KiB", "k") == 1536);
  CHECK(parse_bytes("2048", "k") == 2048);
  CHECK(parse_bytes("2048B", "k") == 2048);
  CHECK(parse_bytes("16 B", "k") == 16);
  CHECK(parse_bytes("0", "k") == 0);
  for (const char* bad : {"1.5B", "0.5", "-1KiB", "-2", "2kib", "2 KIB", "12XB", "abc", "", "KiB", "1e30TiB"}) {
    INFO(bad);
    CHECK(code_of([&] { parse_bytes(bad, "sbuf.x"); }) == ErrorCode::kConfigBadValue);
  }
  CHECK_THAT(error_of([] { parse_bytes("1.5B", "sbuf.x"); }).message(),
             Catch::Contains("sbuf.x") && Catch::Contains("whole number of bytes"));
}

TEST_CASE("bandwidths parse to bytes per ns", "[config][units]") {
  using nsim::sim::parse_bandwidth_bytes_per_ns;
  CHECK(parse_bandwidth_bytes_per_ns("23B/ns", "k") == Approx(23.0));
  CHECK(parse_bandwidth_bytes_per_ns("410GB/s", "k") == Approx(410.0));
  CHECK(parse_bandwidth_bytes_per_ns("362.5GB/s", "k") == Approx(362.5));
  CHECK(parse_bandwidth_bytes_per_ns("2.9TB/s", "k") == Approx(2900.0));
  CHECK(parse_bandwidth_bytes_per_ns("820MB/s", "k") == Approx(0.82));
  CHECK(parse_bandwidth_bytes_per_ns("27GiB/s", "k") == Approx(27.0 * 1.073741824));
  CHECK(parse_bandwidth_bytes_per_ns("1B/ps", "k") == Approx(1000.0));
  CHECK(parse_bandwidth_bytes_per_ns("64 KiB/us", "k") == Approx(65.536));
  for (const char* bad : {"23", "23B", "23B/min", "23b/ns", "23GB/S", "-1GB/s", "0B/ns", "/ns", "fastGB/s"}) {
    INFO(bad);
    CHECK(code_of([&] { parse_bandwidth_bytes_per_ns(bad, "dma.x"); }) == ErrorCode::kConfigBadValue);
  }
  CHECK_THAT(error_of([] { parse_bandwidth_bytes_per_ns("23", "dma.engine_bw"); }).message(),
             Catch::Contains("dma.engine_bw") && Catch::Contains("a bandwidth such as 23B/ns"));
}

TEST_CASE("times parse to picoseconds", "[config][units]") {
  using nsim::sim::parse_time_ps;
  CHECK(parse_time_ps("800ns", "k") == 800000);
  CHECK(parse_time_ps("3us", "k") == 3000000);
  CHECK(parse_time_ps("1.2ms", "k") == 1200000000LL);
  CHECK(parse_time_ps("500ps", "k") == 500);
  CHECK(parse_time_ps("1s", "k") == 1000000000000LL);
  CHECK(parse_time_ps("0ns", "k") == 0);
  CHECK(parse_time_ps("1.5ps", "k") == 2);  // rounded to nearest
  CHECK(parse_time_ps("0.0004ns", "k") == 0);
  CHECK(parse_time_ps("2.5 ns", "k") == 2500);
  for (const char* bad : {"800", "800 sec", "800NS", "-1ns", "1e30s", "ns", "", "soon"}) {
    INFO(bad);
    CHECK(code_of([&] { parse_time_ps(bad, "dma.x"); }) == ErrorCode::kConfigBadValue);
  }
  CHECK_THAT(error_of([] { parse_time_ps("800", "dma.setup"); }).message(),
             Catch::Contains("dma.setup") && Catch::Contains("a time such as 800ns") && Catch::Contains("'800'"));
}

TEST_CASE("every kind reads back through its getter", "[config][units]") {
  const Config c = Config::from_yaml(kSmallYaml, kSmall);
  CHECK(c.name() == "small");
  CHECK(c.get_string("name") == "small");
  CHECK(c.get_int("a.int") == -3);
  CHECK(c.get_real("a.real") == Approx(0.25));
  CHECK(c.get_real("a.int") == Approx(-3.0));  // ints widen
  CHECK(c.get_bool("a.bool"));
  CHECK(c.freq_ghz("a.freq") == Approx(0.96));
  CHECK(c.bytes("a.bytes") == 2048);
  CHECK(c.bw_bytes_per_ns("a.bw") == Approx(410.0));
  CHECK(c.time_ps("a.time") == 3000000);
  CHECK(c.time_ns("a.time") == Approx(3000.0));
  CHECK(c.cycles("a.cycles") == 64);
  CHECK(c.get_list("a.list") == std::vector<std::string>{"x", "y+z"});
  CHECK(c.get_string("a.freq") == "960MHz");  // get_string reads any kind as written
  CHECK(c.has("a.int"));
  CHECK_FALSE(c.has("a.nope"));
}

TEST_CASE("scalar kinds accept and reject values", "[config][units]") {
  const auto with = [](const std::string& ov) { return Config::from_yaml(kSmallYaml, kSmall, {ov}); };
  CHECK(with("a.cycles=128").cycles("a.cycles") == 128);
  CHECK(with("a.cycles=1 cycle").cycles("a.cycles") == 1);
  CHECK(with("a.bool=false").get_bool("a.bool") == false);
  CHECK(with("a.bool=yes").get_bool("a.bool") == true);
  CHECK(with("a.bool=Off").get_bool("a.bool") == false);
  CHECK(with("a.real=1e-3").get_real("a.real") == Approx(0.001));
  CHECK(with("a.real=7").get_real("a.real") == Approx(7.0));
  CHECK(with("name=any text: really").get_string("name") == "any text: really");
  for (const char* bad : {"a.int=1.5", "a.int=x", "a.int=", "a.int=64cycles", "a.real=half", "a.real=0.5s",
                          "a.bool=maybe", "a.bool=1", "a.bool=0", "a.cycles=-1", "a.cycles=1.5",
                          "a.cycles=64 ticks", "a.freq=1.4", "a.bytes=1.5B", "a.bw=3", "a.time=5"}) {
    INFO(bad);
    CHECK(code_of([&] { with(bad); }) == ErrorCode::kConfigBadValue);
  }
  // The message names the key and where the value came from.
  CHECK_THAT(error_of([&] { with("a.bool=maybe"); }).message(),
             Catch::Contains("a.bool") && Catch::Contains("true or false") && Catch::Contains("override"));
  // Bad values in a file name the file and line.
  const Error e = error_of([] { Config::from_yaml("name: n\na: {real: 1, bool: true, freq: 1GHz, bytes: 1, "
                                                  "bw: 1B/ns, time: 1ns, cycles: 1, list: []}\na.int: 2x\n",
                                                  kSmall); });
  CHECK(e.code() == ErrorCode::kConfigBadValue);
  CHECK_THAT(e.message(), Catch::Contains("a.int") && Catch::Contains("<yaml text>:3"));
}

TEST_CASE("values of the wrong shape are rejected", "[config][units]") {
  // A list where a scalar is expected, a null value, nested lists.
  const std::string base = "name: n\na: {real: 1, bool: true, freq: 1GHz, bytes: 1, bw: 1B/ns, time: 1ns, cycles: 1, ";
  CHECK(code_of([&] { Config::from_yaml(base + "list: [], int: [1, 2]}", kSmall); }) == ErrorCode::kConfigBadValue);
  CHECK(code_of([&] { Config::from_yaml(base + "list: [], int: }", kSmall); }) == ErrorCode::kConfigBadValue);
  CHECK(code_of([&] { Config::from_yaml(base + "list: [[1]], int: 1}", kSmall); }) == ErrorCode::kConfigBadValue);
  // A plain string for a list key in YAML is read like an override: comma-separated.
  const Config c = Config::from_yaml(base + "list: 'p, q', int: 1}", kSmall);
  CHECK(c.get_list("a.list") == std::vector<std::string>{"p", "q"});
}

TEST_CASE("getters check kind and presence", "[config]") {
  const Config c = Config::from_yaml(kSmallYaml, kSmall);
  CHECK(code_of([&] { c.get_int("a.nope"); }) == ErrorCode::kConfigMissingKey);
  CHECK(code_of([&] { c.freq_ghz("missing.key"); }) == ErrorCode::kConfigMissingKey);
  CHECK(code_of([&] { c.get_int("a.real"); }) == ErrorCode::kConfigBadValue);
  CHECK(code_of([&] { c.get_int("a.cycles"); }) == ErrorCode::kConfigBadValue);
  CHECK(code_of([&] { c.freq_ghz("a.time"); }) == ErrorCode::kConfigBadValue);
  CHECK(code_of([&] { c.time_ps("a.freq"); }) == ErrorCode::kConfigBadValue);
  CHECK(code_of([&] { c.bytes("a.bw"); }) == ErrorCode::kConfigBadValue);
  CHECK(code_of([&] { c.bw_bytes_per_ns("a.bytes"); }) == ErrorCode::kConfigBadValue);
  CHECK(code_of([&] { c.cycles("a.int"); }) == ErrorCode::kConfigBadValue);
  CHECK(code_of([&] { c.get_bool("a.int"); }) == ErrorCode::kConfigBadValue);
  CHECK(code_of([&] { c.get_list("name"); }) == ErrorCode::kConfigBadValue);
  CHECK(code_of([&] { c.get_real("a.bool"); }) == ErrorCode::kConfigBadValue);
}

// ------------------------------------------------------------------------------------------------
// Presets

TEST_CASE("trn1 preset loads with the spec values", "[config][presets]") {
  const Config c = Config::load("trn1", kSchema);
  CHECK(c.name() == "trn1");
  CHECK(c.get_string("name") == "trn1");
  CHECK(c.get_int("generation") == 2);
  CHECK(c.freq_ghz("clock.tensor") == Approx(2.8));
  CHECK(c.freq_ghz("clock.vector") == Approx(1.12));
  CHECK(c.freq_ghz("clock.sync") == Approx(1.4));
  CHECK(c.get_int("tensor.pe_rows") == 128);
  CHECK(c.cycles("tensor.mm_min_ii_cycles") == 64);
  CHECK(c.get_int("tensor.transpose_fp32_factor") == 4);
  CHECK(c.get_string("tensor.cost_formula") == "arch");
  CHECK_FALSE(c.get_bool("tensor.throttle.enabled"));
  CHECK(c.time_ps("tensor.throttle.ramp") == 3000000);
  CHECK(c.get_real("vector.bn_aggr_factor") == Approx(13.0 / 3.0).epsilon(1e-6));
  CHECK(c.cycles("scalar.fixed_latency_cycles") == 200);
  CHECK(c.time_ns("scalar.act_table_load") == Approx(1330.0));
  CHECK(c.get_list("scalar.act_table_sets").size() == 5);
  CHECK(c.get_list("scalar.act_table_sets")[0] == "exp");
  CHECK(c.bytes("sbuf.bytes_per_partition") == 196608);
  CHECK(c.bytes("sbuf.stride_penalty_bytes") == 16);
  CHECK(c.bytes("psum.bank_bytes") == 2048);
  CHECK(c.bw_bytes_per_ns("dma.engine_bw") == Approx(17.0));
  CHECK(c.time_ps("dma.setup") == 800000);
  CHECK(c.bw_bytes_per_ns("hbm.bw") == Approx(410.0));
  CHECK(c.bytes("hbm.capacity") == 16LL << 30);
  CHECK(c.get_bool("conc.vector_gpsimd_sbuf_exclusive"));
  CHECK(c.bytes("sim.dep_chunk_bytes") == 64);
  CHECK(c.bytes("sim.hbm_dep_chunk_bytes") == 4096);
}

TEST_CASE("trn2 preset inherits trn1 and overrides", "[config][presets]") {
  const Config c = Config::load("trn2", kSchema);
  CHECK(c.name() == "trn2");
  CHECK(c.get_int("generation") == 3);
  CHECK(c.freq_ghz("clock.tensor") == Approx(2.4));
  CHECK(c.freq_ghz("clock.vector") == Approx(0.96));
  CHECK(c.freq_ghz("clock.scalar") == Approx(1.2));
  CHECK(c.bw_bytes_per_ns("dma.engine_bw") == Approx(23.0));
  CHECK(c.bw_bytes_per_ns("hbm.bw") == Approx(362.5));
  CHECK(c.bytes("hbm.capacity") == 24LL << 30);
  CHECK(c.bytes("sbuf.bytes_per_partition") == 229376);
  CHECK(c.get_bool("tensor.throttle.enabled"));
  CHECK(c.get_bool("tensor.fp8_double_row"));
  CHECK(c.get_int("tensor.transpose_fp32_factor") == 2);
  CHECK(c.cycles("scalar.fixed_latency_cycles") == 350);
  CHECK_FALSE(c.get_bool("conc.vector_scalar_psum_exclusive"));
  CHECK(c.get_int("dma.engines") == 16);  // inherited
}

TEST_CASE("trn3 preset inherits through trn2 from trn1", "[config][presets]") {
  const Config c = Config::load("trn3", kSchema);
  CHECK(c.name() == "trn3");
  CHECK(c.get_int("generation") == 4);
  CHECK(c.freq_ghz("clock.vector") == Approx(1.2));
  CHECK(c.freq_ghz("clock.tensor") == Approx(2.4));  // from trn2
  CHECK(c.get_int("sbuf.partitions") == 128);       // from trn1
  CHECK(c.get_int("tensor.moving_fmax") == 4096);
  CHECK(c.get_int("tensor.moving_fmax_bf16") == 8192);
  CHECK(c.get_bool("tensor.dst_bf16"));
  CHECK(c.get_bool("scalar.perf_mode_2x"));
  CHECK(c.get_bool("vector.perf_mode_fp8"));
  CHECK(c.bytes("sbuf.bytes_per_partition") == 262144);
  CHECK(c.bw_bytes_per_ns("dma.engine_bw") == Approx(33.0));
  CHECK(c.bw_bytes_per_ns("hbm.bw") == Approx(612.5));
  CHECK(c.bytes("hbm.capacity") == 36LL << 30);
}

TEST_CASE("every preset value reads through its kind's getter", "[config][presets]") {
  for (const char* preset : {"trn1", "trn2", "trn3"}) {
    const Config c = Config::load(preset, kSchema);
    REQUIRE(c.raw().size() == std::size(kSchema));
    for (const ParamDecl& d : kSchema) {
      INFO(preset << " " << d.key);
      switch (d.kind) {
        case ParamKind::kInt: c.get_int(d.key); break;
        case ParamKind::kReal: c.get_real(d.key); break;
        case ParamKind::kBool: c.get_bool(d.key); break;
        case ParamKind::kString: CHECK_FALSE(c.get_string(d.key).empty()); break;
        case ParamKind::kFrequency: CHECK(c.freq_ghz(d.key) > 0); break;
        case ParamKind::kBytes: CHECK(c.bytes(d.key) > 0); break;
        case ParamKind::kBandwidth: CHECK(c.bw_bytes_per_ns(d.key) > 0); break;
        case ParamKind::kTime: CHECK(c.time_ps(d.key) > 0); break;
        case ParamKind::kCycles: CHECK(c.cycles(d.key) >= 0); break;
        case ParamKind::kStringList: CHECK_FALSE(c.get_list(d.key).empty()); break;
      }
    }
  }
}

namespace {
// Dotted keys -> scalar text of one YAML file, without following `preset:`.
void flatten(const YAML::Node& n, const std::string& prefix, std::map<std::string, std::string>& out) {
  for (const auto& kv : n) {
    const std::string key = prefix.empty() ? kv.first.Scalar() : prefix + "." + kv.first.Scalar();
    if (kv.second.IsMap()) {
      flatten(kv.second, key, out);
    } else if (kv.second.IsSequence()) {
      std::string joined;
      for (const auto& item : kv.second) joined += (joined.empty() ? "" : ",") + item.Scalar();
      out[key] = joined;
    } else {
      out[key] = kv.second.Scalar();
    }
  }
}
}  // namespace

TEST_CASE("trn2 and trn3 list only keys that differ from their parent", "[config][presets]") {
  const std::string dir = Config::default_configs_dir();
  for (const auto& [child, parent] : {std::pair{"trn2", "trn1"}, std::pair{"trn3", "trn2"}}) {
    std::map<std::string, std::string> own;
    flatten(YAML::LoadFile(dir + "/" + child + ".yaml"), "", own);
    REQUIRE(own["preset"] == parent);
    own.erase("preset");
    const Config base = Config::load(parent, kSchema);
    CHECK(own.size() < std::size(kSchema));
    for (const auto& [key, value] : own) {
      INFO(child << " " << key);
      CHECK(base.raw().at(key) != value);
    }
  }
}

// ------------------------------------------------------------------------------------------------
// Overrides

TEST_CASE("overrides replace preset values", "[config][overrides]") {
  const Config c = Config::load("trn2", kSchema,
                                {"tensor.pe_rows=64", "clock.tensor = 1GHz", "scalar.act_table_sets=exp, log,,",
                                 "dma.engine_bw=410GB/s", "tensor.pe_rows=32", "name=trn2-test"});
  CHECK(c.get_int("tensor.pe_rows") == 32);  // the later override wins
  CHECK(c.freq_ghz("clock.tensor") == Approx(1.0));
  CHECK(c.get_list("scalar.act_table_sets") == std::vector<std::string>{"exp", "log"});
  CHECK(c.bw_bytes_per_ns("dma.engine_bw") == Approx(410.0));
  CHECK(c.get_string("name") == "trn2-test");
  CHECK(c.name() == "trn2");  // the preset leaf, not the key
  CHECK(c.freq_ghz("clock.vector") == Approx(0.96));  // untouched
}

TEST_CASE("bad overrides", "[config][overrides][errors]") {
  CHECK(code_of([] { Config::load("trn1", kSchema, {"tensor.pe_rows"}); }) == ErrorCode::kConfigBadOverride);
  CHECK(code_of([] { Config::load("trn1", kSchema, {"=64"}); }) == ErrorCode::kConfigBadOverride);
  CHECK(code_of([] { Config::load("trn1", kSchema, {" =64"}); }) == ErrorCode::kConfigBadOverride);
  CHECK(code_of([] { Config::load("trn1", kSchema, {""}); }) == ErrorCode::kConfigBadOverride);
  CHECK(code_of([] { Config::load("trn1", kSchema, {"preset=trn2"}); }) == ErrorCode::kConfigUnknownKey);
  const Error e = error_of([] { Config::load("trn1", kSchema, {"tensor.pe_row=64"}); });
  CHECK(e.code() == ErrorCode::kConfigUnknownKey);
  CHECK_THAT(e.message(), Catch::Contains("'tensor.pe_row'") && Catch::Contains("did you mean 'tensor.pe_rows'"));
  CHECK(code_of([] { Config::load("trn1", kSchema, {"clock.tensor=2.8"}); }) == ErrorCode::kConfigBadValue);
  CHECK(code_of([] { Config::load("trn1", kSchema, {"sbuf.partitions=lots"}); }) == ErrorCode::kConfigBadValue);
}

// ------------------------------------------------------------------------------------------------
// File errors

TEST_CASE("unknown key in YAML is E101 with a suggestion", "[config][errors]") {
  const Error e = error_of([] { Config::from_yaml("preset: trn1\ntensor:\n  pe_row: 64\n", kSchema); });
  CHECK(e.code() == ErrorCode::kConfigUnknownKey);
  CHECK_THAT(e.message(), Catch::Contains("'tensor.pe_row'") && Catch::Contains("did you mean 'tensor.pe_rows'") &&
                              Catch::Contains("<yaml text>:3"));
  // A map where a value is expected flattens to an unknown key too.
  CHECK(code_of([] { Config::from_yaml("preset: trn1\ntensor:\n  pe_rows: {a: 1}\n", kSchema); }) ==
        ErrorCode::kConfigUnknownKey);
  // `preset` is only special at the top level.
  CHECK(code_of([] { Config::from_yaml("preset: trn1\ntensor:\n  preset: trn2\n", kSchema); }) ==
        ErrorCode::kConfigUnknownKey);
}

TEST_CASE("bad unit in YAML is E102", "[config][errors]") {
  const Error e = error_of([] { Config::from_yaml("preset: trn2\nclock:\n  tensor: 2.8Ghz\n", kSchema); });
  CHECK(e.code() == ErrorCode::kConfigBadValue);
  CHECK_THAT(e.message(), Catch::Contains("clock.tensor") && Catch::Contains("a frequency such as 1.4GHz") &&
                              Catch::Contains("'2.8Ghz'"));
  CHECK(code_of([] { Config::from_yaml("preset: trn2\nsbuf.bytes_per_partition: -4KiB\n", kSchema); }) ==
        ErrorCode::kConfigBadValue);
}

TEST_CASE("missing keys are E103 and all listed", "[config][errors]") {
  const Error e = error_of([] { Config::from_yaml("name: x\ngeneration: 2\n", kSchema); });
  CHECK(e.code() == ErrorCode::kConfigMissingKey);
  CHECK_THAT(e.message(), Catch::Contains("clock.tensor") && Catch::Contains("sim.dep_chunk_bytes") &&
                              !Catch::Contains("generation,"));
  // An override can supply a key the files lack.
  CHECK_NOTHROW(Config::from_yaml("name: n\na: {int: 1, real: 1, bool: true, freq: 1GHz, bytes: 1, bw: 1B/ns, "
                                  "time: 1ns, cycles: 1}\n",
                                  kSmall, {"a.list=x"}));
}

TEST_CASE("missing preset is E104", "[config][errors]") {
  const Error e = error_of([] { Config::load("trn9", kSchema); });
  CHECK(e.code() == ErrorCode::kConfigPresetNotFound);
  CHECK_THAT(e.message(), Catch::Contains("trn9") && Catch::Contains("trn1, trn2, trn3"));
  CHECK(code_of([] { Config::from_yaml("preset: nope\n", kSchema); }) == ErrorCode::kConfigPresetNotFound);
  CHECK(code_of([] { Config::load("/nonexistent/dir/x.yaml", kSchema); }) == ErrorCode::kConfigPresetNotFound);
  CHECK(code_of([] { Config::load("trn1", kSchema, {}, "/nonexistent/configs"); }) ==
        ErrorCode::kConfigPresetNotFound);
  TempDir tmp;
  const std::string f = tmp.write("child.yaml", "preset: ./missing.yaml\n");
  CHECK_THAT(error_of([&] { Config::load(f, kSchema); }).message(), Catch::Contains("child.yaml:1"));
}

TEST_CASE("cyclic presets are E107", "[config][errors]") {
  TempDir tmp;
  const std::string a = tmp.write("a.yaml", "preset: b.yaml\nname: a\n");
  tmp.write("b.yaml", "preset: a.yaml\nname: b\n");
  const Error e = error_of([&] { Config::load(a, kSchema); });
  CHECK(e.code() == ErrorCode::kConfigPresetCycle);
  CHECK_THAT(e.message(), Catch::Contains("a.yaml") && Catch::Contains("b.yaml"));
  // By name, in a configs dir; and a file that names itself.
  CHECK(code_of([&] { Config::load("a", kSchema, {}, tmp.path.string()); }) == ErrorCode::kConfigPresetCycle);
  const std::string self = tmp.write("self.yaml", "preset: ./self.yaml\n");
  CHECK(code_of([&] { Config::load(self, kSchema); }) == ErrorCode::kConfigPresetCycle);
  // A diamond is not a cycle: two files may inherit the same preset.
  tmp.write("x/base.yaml", "preset: trn1\n");
  const std::string leaf = tmp.write("x/leaf.yaml", "preset: mid.yaml\nname: leaf\n");
  tmp.write("x/mid.yaml", "preset: base.yaml\n");
  CHECK(Config::load(leaf, kSchema).get_string("name") == "leaf");
}

TEST_CASE("YAML syntax errors are E105 with file and line", "[config][errors]") {
  TempDir tmp;
  const std::string bad = tmp.write("bad.yaml", "preset: trn1\nclock:\n  tensor: [2.8GHz\n");
  const Error e = error_of([&] { Config::load(bad, kSchema); });
  CHECK(e.code() == ErrorCode::kConfigParse);
  CHECK_THAT(e.message(), Catch::Contains("bad.yaml") && Catch::Contains("line"));
  // The error in an inherited file names that file.
  const std::string child = tmp.write("child.yaml", "preset: bad.yaml\n");
  CHECK_THAT(error_of([&] { Config::load(child, kSchema); }).message(), Catch::Contains("bad.yaml"));
  // Other structural problems.
  CHECK(code_of([] { Config::from_yaml("a: b: c\n", kSchema); }) == ErrorCode::kConfigParse);
  CHECK(code_of([] { Config::from_yaml("- just\n- a list\n", kSchema); }) == ErrorCode::kConfigParse);
  CHECK(code_of([] { Config::from_yaml("preset: trn1\nsim:\n  dep_chunk_bytes: 1\nsim.dep_chunk_bytes: 2\n", kSchema); }) ==
        ErrorCode::kConfigParse);  // a key given twice
  const Error line = error_of([] { Config::from_yaml("name: x\nclock:\n  tensor: 1GHz\n   vector: 2GHz\n", kSchema); });
  CHECK(line.code() == ErrorCode::kConfigParse);
  CHECK_THAT(line.message(), Catch::Contains("<yaml text>") && Catch::Contains("line 4"));
}

// ------------------------------------------------------------------------------------------------
// Paths, names, configs dir

TEST_CASE("relative preset paths resolve against the including file", "[config]") {
  TempDir tmp;
  tmp.write("common/base.yaml", "preset: trn2\ndma:\n  engine_bw: 30B/ns\n");
  const std::string run = tmp.write("runs/fast.yaml", "preset: ../common/base.yaml\nclock.tensor: 3GHz\n");
  const Config c = Config::load(run, kSchema, {"sim.dep_chunk_bytes=128B"});
  CHECK(c.name() == "fast");
  CHECK(c.get_string("name") == "trn2");
  CHECK(c.bw_bytes_per_ns("dma.engine_bw") == Approx(30.0));
  CHECK(c.freq_ghz("clock.tensor") == Approx(3.0));
  CHECK(c.freq_ghz("clock.vector") == Approx(0.96));
  CHECK(c.bytes("sim.dep_chunk_bytes") == 128);
  // Presets by name come from the configs dir given.
  const Config d = Config::from_yaml("preset: trn3\n", kSchema, {}, Config::default_configs_dir());
  CHECK(d.name() == "trn3");
}

TEST_CASE("an edited config file is read again, not taken from the parse cache", "[config]") {
  // Config::load keeps parsed YAML documents per process, keyed by file name and text: loading the
  // same file again must see an edit, of the file itself and of the preset it inherits from, and a
  // syntax error introduced by the edit must still be reported.
  TempDir tmp;
  const std::string base = tmp.write("base.yaml", "preset: trn2\nclock.tensor: 2GHz\n");
  const std::string run = tmp.write("run.yaml", "preset: base.yaml\nclock.vector: 1GHz\n");
  for (int pass = 0; pass < 2; ++pass) {  // the second pass comes from the cache
    const Config c = Config::load(run, kSchema, {});
    CHECK(c.freq_ghz("clock.tensor") == Approx(2.0));
    CHECK(c.freq_ghz("clock.vector") == Approx(1.0));
  }
  tmp.write("base.yaml", "preset: trn2\nclock.tensor: 3GHz\n");
  CHECK(Config::load(run, kSchema, {}).freq_ghz("clock.tensor") == Approx(3.0));
  tmp.write("run.yaml", "preset: base.yaml\nclock.vector: 1.5GHz\n");
  CHECK(Config::load(run, kSchema, {}).freq_ghz("clock.vector") == Approx(1.5));
  tmp.write("run.yaml", "preset: base.yaml\nclock.vector: [1GHz\n");
  CHECK(code_of([&] { Config::load(run, kSchema, {}); }) == ErrorCode::kConfigParse);
}

TEST_CASE("a configuration loaded again equals a fresh load, per overrides, directory and file", "[config]") {
  // Config::load keeps validated configurations per (schema, configs dir, working directory, preset or
  // path, overrides) while the files they were read from are unchanged.
  const Config a = Config::load("trn2", kSchema, {"clock.tensor=1.5GHz"});
  const Config b = Config::load("trn2", kSchema, {"clock.tensor=1.5GHz"});
  CHECK(a.raw() == b.raw());
  CHECK(b.raw() == Config::from_yaml("preset: trn2\n", kSchema, {"clock.tensor=1.5GHz"}).raw());  // not cached
  CHECK(b.freq_ghz("clock.tensor") == Approx(1.5));
  CHECK(Config::load("trn2", kSchema, {"clock.tensor=1.25GHz"}).freq_ghz("clock.tensor") == Approx(1.25));
  CHECK(Config::load("trn2", kSchema, {}).raw() == Config::from_yaml("preset: trn2\n", kSchema).raw());
  CHECK(code_of([&] { Config::load("trn2", kSchema, {"clock.tensor=fast"}); }) == ErrorCode::kConfigBadValue);
  CHECK(code_of([&] { Config::load("trn2", kSchema, {"clock.tensor=fast"}); }) == ErrorCode::kConfigBadValue);
  // The same relative path from two working directories names two files.
  TempDir tmp;
  tmp.write("one/run.yaml", "preset: trn2\nclock.vector: 1GHz\n");
  tmp.write("two/run.yaml", "preset: trn2\nclock.vector: 2GHz\n");
  const fs::path cwd = fs::current_path();
  fs::current_path(tmp.path / "one");
  const double one = Config::load("run.yaml", kSchema, {}).freq_ghz("clock.vector");
  fs::current_path(tmp.path / "two");
  const double two = Config::load("run.yaml", kSchema, {}).freq_ghz("clock.vector");
  // A file removed after its load is not served from the cache.
  fs::remove(tmp.path / "two" / "run.yaml");
  const ErrorCode gone = code_of([&] { Config::load("run.yaml", kSchema, {}); });
  fs::current_path(cwd);
  CHECK(one == Approx(1.0));
  CHECK(two == Approx(2.0));
  CHECK(gone == ErrorCode::kConfigPresetNotFound);
}

TEST_CASE("default configs dir honours NSIM_CONFIGS_DIR", "[config]") {
  const std::string compiled = Config::default_configs_dir();
  CHECK(fs::exists(fs::path(compiled) / "trn1.yaml"));
  ::setenv("NSIM_CONFIGS_DIR", "/some/where", 1);
  CHECK(Config::default_configs_dir() == "/some/where");
  ::unsetenv("NSIM_CONFIGS_DIR");
  CHECK(Config::default_configs_dir() == compiled);
}

// ------------------------------------------------------------------------------------------------
// to_yaml

TEST_CASE("to_yaml round-trips", "[config][yaml]") {
  for (const char* preset : {"trn1", "trn2", "trn3"}) {
    INFO(preset);
    const Config c = Config::load(preset, kSchema, {"scalar.act_table_sets=exp,log+sin"});
    const std::string text = c.to_yaml();
    CHECK_THAT(text, Catch::Contains(std::string("name: ") + preset) && !Catch::Contains("#") &&
                         !Catch::Contains("preset"));
    const Config back = Config::from_yaml(text, kSchema);
    CHECK(back.raw() == c.raw());
    CHECK(back.get_list("scalar.act_table_sets") == c.get_list("scalar.act_table_sets"));
    CHECK(back.name() == preset);
    // Nested and sorted: "clock:" comes before "conc:", "tensor.throttle" is a nested map.
    CHECK(text.find("clock:\n") < text.find("conc:\n"));
    CHECK_THAT(text, Catch::Contains("throttle:\n    enabled:"));
  }
  // Awkward strings survive.
  const Config c = Config::from_yaml(kSmallYaml, kSmall, {"name=a: b #c", "a.list="});
  const Config back = Config::from_yaml(c.to_yaml(), kSmall);
  CHECK(back.raw() == c.raw());
  CHECK(back.get_string("name") == "a: b #c");
  CHECK(back.get_list("a.list").empty());
}

// ------------------------------------------------------------------------------------------------
// configs/README.md documents exactly the schema

TEST_CASE("README key table matches the schema and the presets", "[config][docs]") {
  const fs::path readme = fs::path(Config::default_configs_dir()) / "README.md";
  REQUIRE(fs::exists(readme));
  std::istringstream in(read_file(readme));

  const auto cells_of = [](const std::string& line) {
    std::vector<std::string> cells;
    std::string cell;
    for (size_t i = 1; i < line.size(); ++i) {
      if (line[i] == '|') {
        const size_t b = cell.find_first_not_of(' '), e = cell.find_last_not_of(' ');
        cells.push_back(b == std::string::npos ? "" : cell.substr(b, e - b + 1));
        cell.clear();
      } else {
        cell += line[i];
      }
    }
    return cells;
  };
  const auto unquote = [](std::string s) {
    if (s.size() >= 2 && s.front() == '`' && s.back() == '`') s = s.substr(1, s.size() - 2);
    return s;
  };

  // The key table: header "| key | kind (unit) | trn1 | trn2 | trn3 | meaning | source |".
  std::vector<std::vector<std::string>> rows;
  std::string line;
  bool in_table = false;
  int tables = 0;
  while (std::getline(in, line)) {
    if (line.rfind("|", 0) != 0) {
      in_table = false;
      continue;
    }
    const auto cells = cells_of(line);
    if (!in_table && cells.size() == 7 && cells[0] == "key" && cells[2] == "trn1") {
      in_table = true;
      ++tables;
      continue;
    }
    if (in_table && line.rfind("|---", 0) != 0) rows.push_back(cells);
  }
  REQUIRE(tables == 1);

  std::map<std::string, int> seen;
  for (const auto& r : rows) {
    REQUIRE(r.size() == 7);
    ++seen[unquote(r[0])];
  }
  for (const ParamDecl& d : kSchema) {
    INFO(d.key);
    CHECK(seen[std::string(d.key)] == 1);
  }
  std::set<std::string> declared;
  for (const ParamDecl& d : kSchema) declared.emplace(d.key);
  for (const auto& [key, n] : seen) {
    INFO(key);
    CHECK(declared.count(key) == 1);
  }
  CHECK(rows.size() == std::size(kSchema));

  // The value columns agree with the presets (lists are described in prose).
  const Config presets[] = {Config::load("trn1", kSchema), Config::load("trn2", kSchema),
                            Config::load("trn3", kSchema)};
  for (const auto& r : rows) {
    const std::string key = unquote(r[0]);
    if (!declared.count(key)) continue;
    bool is_list = false;
    for (const ParamDecl& d : kSchema)
      if (d.key == key) is_list = d.kind == ParamKind::kStringList;
    if (is_list) continue;
    for (int g = 0; g < 3; ++g) {
      INFO(key << " trn" << g + 1);
      CHECK(unquote(r[2 + g]) == presets[g].raw().at(key));
    }
  }
}

TEST_CASE("config: every key has a range and out-of-range values are E102 naming it", "[config][range]") {
  for (const ParamDecl& d : kSchema) {
    INFO(d.key);
    CHECK(d.min <= d.max);
  }
  // Values that used to be accepted and overflowed or inverted the integer-picosecond times
  // (reliability issue): tiny rates and clocks, zero or negative factors, absurd sizes.
  for (const char* bad : {"hbm.bw=1e-12GB/s", "dma.engine_bw=1e-300B/ns", "clock.vector=1e-300GHz",
                          "clock.tensor=1e-300GHz", "tensor.ls_speedup=0", "tensor.ls_speedup=-1",
                          "tensor.fp32_factor=0", "tensor.fp32_factor=-4", "tensor.pe_rows=0", "tensor.pe_rows=-128",
                          "generation=99", "dma.partitions_per_engine=0", "vector.bn_aggr_factor=-1",
                          "tensor.throttle.window=0ns", "analysis.max_recorded_instructions=-1", "psum.banks=-1",
                          "psum.banks=100000", "psum.banks=4294967296"}) {
    INFO(bad);
    try {
      (void)Config::load("trn2", kSchema, {bad});
      FAIL("accepted");
    } catch (const Error& e) {
      CHECK(e.code() == ErrorCode::kConfigBadValue);
      const std::string key(std::string_view(bad).substr(0, std::string_view(bad).find('=')));
      CHECK(std::string(e.what()).find("'" + key + "'") != std::string::npos);
    }
  }
  // The presets themselves are inside every range.
  for (const char* preset : {"trn1", "trn2", "trn3"}) CHECK_NOTHROW(Config::load(preset, kSchema));
}
