// The `nsim` command-line program: run, check and disassemble kernel.json files, show configs.
// Exit status: 0 success, 2 user error (coded message on stderr), 1 internal error.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "engines/params.h"
#include "engines/simulator.h"
#include "frontend/inputs.h"
#include "frontend/ir.h"
#include "frontend/lower.h"
#include "frontend/npy.h"

#ifndef NSIM_VERSION
#define NSIM_VERSION "dev"
#endif

namespace fs = std::filesystem;
using namespace nsim;

namespace {

constexpr const char* kMainHelp = R"(nsim — cycle-approximate NeuronCore simulator

usage: nsim <command> [options]

commands:
  run      simulate a kernel.json: outputs, timing summary, stats, trace
  check    verify a kernel.json without running it
  disasm   print the lowered instruction stream with source lines
  config   print the effective configuration of a preset

Run 'nsim <command> --help' for the options of a command. 'nsim --version' prints the version.
Exit status: 0 on success, 2 on a user error (the message starts with its code, NSIM-Exxx).
)";

constexpr const char* kRunHelp = R"(usage: nsim run kernel.json [options]

Simulate the kernel: run its numerics and its timing on one NeuronCore, print a summary.

options:
  --config NAME|FILE   preset (trn1, trn2, trn3, inf2 = trn1) or a YAML file [default: trn2]
  -p KEY=VALUE         override one config key (repeatable), e.g. -p hbm.bw=725GB/s
  --inputs DIR|FILE    input arrays: a directory of <tensor>.npy files or an .npz (np.savez);
                       inputs not given are filled with seeded random data
  --seed N             seed of the random inputs [default: 0]
  --outputs DIR        write every output tensor as DIR/<tensor>.npy (bf16/fp8 widened to float32)
  --raw-outputs        write bf16/fp8 outputs as raw bits (|V2, |V1) instead
  --trace FILE         write a Chrome/Perfetto trace (open in ui.perfetto.dev)
  --stats FILE         write stats as JSON; the effective config goes to FILE.config.yaml
  --timing-only        skip numerics (same timing, no outputs)
  --instructions FILE  write one CSV row per instruction (queryable, e.g. with DuckDB; docs/profiling.md)
)";

constexpr const char* kCheckHelp = R"(usage: nsim check kernel.json [--config NAME|FILE] [-p KEY=VALUE ...]

Parse and verify the kernel for the given generation without running it.
)";

constexpr const char* kDisasmHelp = R"(usage: nsim disasm kernel.json [--config NAME|FILE] [-p KEY=VALUE ...] [--limit N]

Print the lowered instruction stream, one instruction per line with its source location.
--limit N stops after N instructions [default: all].
)";

constexpr const char* kConfigHelp = R"(usage: nsim config [NAME|FILE] [-p KEY=VALUE ...]

Print the effective configuration (after preset inheritance and overrides) as YAML.
)";

struct Args {
  std::string command, kernel, config = "trn2", inputs, outputs, trace, stats, instructions;
  std::vector<std::string> overrides;
  uint64_t seed = 0;
  bool timing_only = false, raw_outputs = false, help = false;
  int64_t limit = -1;
};

[[noreturn]] void usage_error(const std::string& msg) { throw Error(ErrorCode::kUsage, msg + " (see 'nsim --help')"); }

Args parse_args(int argc, char** argv) {
  Args a;
  if (argc < 2) usage_error("missing command");
  a.command = argv[1];
  auto value = [&](int& i, const std::string& opt) -> std::string {
    if (i + 1 >= argc) usage_error(fmt::format("option {} needs a value", opt));
    return argv[++i];
  };
  for (int i = 2; i < argc; ++i) {
    const std::string s = argv[i];
    if (s == "--help" || s == "-h") a.help = true;
    else if (s == "--config" || s == "-c") a.config = value(i, s);
    else if (s == "-p" || s == "--param") a.overrides.push_back(value(i, s));
    else if (s == "--inputs") a.inputs = value(i, s);
    else if (s == "--outputs") a.outputs = value(i, s);
    else if (s == "--trace") a.trace = value(i, s);
    else if (s == "--stats") a.stats = value(i, s);
    else if (s == "--instructions") a.instructions = value(i, s);
    else if (s == "--timing-only") a.timing_only = true;
    else if (s == "--raw-outputs") a.raw_outputs = true;
    else if (s == "--seed" || s == "--limit") {
      const std::string v = value(i, s);
      try {
        size_t used = 0;
        const long long n = std::stoll(v, &used);
        if (used != v.size() || n < 0) throw std::invalid_argument(v);
        if (s == "--seed") a.seed = static_cast<uint64_t>(n);
        else a.limit = n;
      } catch (const std::exception&) {
        usage_error(fmt::format("{} expects a non-negative integer, found '{}'", s, v));
      }
    } else if (!s.empty() && s[0] == '-') {
      usage_error(fmt::format("unknown option '{}'", s));
    } else if (a.kernel.empty()) {
      a.kernel = s;
    } else {
      usage_error(fmt::format("unexpected argument '{}'", s));
    }
  }
  return a;
}

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(ErrorCode::kBadInput, fmt::format("cannot open '{}'", path));
  return std::string(std::istreambuf_iterator<char>(f), {});
}

std::string config_name(const std::string& c) { return c == "inf2" ? "trn1" : c; }

frontend::Kernel load_kernel(const Args& a) {
  if (a.kernel.empty()) usage_error(fmt::format("'nsim {}' needs a kernel.json path", a.command));
  return frontend::parse_kernel_json(read_text(a.kernel), a.kernel);
}

// Fill HBM inputs: from files where given, else seeded random values.
void load_inputs(const Args& a, const frontend::Kernel& k, Simulator& sim) {
  std::map<std::string, frontend::NpyArray> given;
  if (!a.inputs.empty()) {
    if (fs::is_directory(a.inputs)) {
      for (const auto& t : k.tensors)
        if (t.space == isa::Space::kHbm && t.kind == frontend::TensorKind::kInput) {
          const fs::path p = fs::path(a.inputs) / (t.name + ".npy");
          if (fs::exists(p)) given[t.name] = frontend::read_npy(p.string());
        }
    } else if (fs::exists(a.inputs)) {
      given = frontend::read_npz(a.inputs);
    } else {
      throw Error(ErrorCode::kBadInput, fmt::format("--inputs '{}' does not exist", a.inputs));
    }
    for (const auto& [name, arr] : given) {
      const int id = k.find_tensor(name);
      if (id < 0 || k.tensors[static_cast<size_t>(id)].kind != frontend::TensorKind::kInput)
        throw Error(ErrorCode::kBadInput, fmt::format("input '{}' is not an input tensor of kernel '{}'", name, k.name));
    }
  }
  std::map<std::string, std::vector<uint8_t>> bytes;
  for (const auto& [name, arr] : given) {
    const auto& t = k.tensors[static_cast<size_t>(k.find_tensor(name))];
    bytes[name] = frontend::to_dtype(arr, t.dtype, t.shape, fmt::format("input '{}'", t.name));
  }
  frontend::write_inputs(k, sim, bytes, a.seed);
}

void print_summary(const frontend::Kernel& k, const Simulator& sim, const sim::StatsRegistry& st, uint64_t instrs) {
  const double total = st.get("total_time");
  fmt::print("kernel {} on {}: {} instructions\n", k.name, sim.params().name, instrs);
  fmt::print("total time      {:.1f} ns  ({:.0f} cycles at {:.2f} GHz)\n", total, st.get("neuroncore_cycle_count"),
             sim.params().clk(isa::Engine::kSync).ghz());
  std::string bound = "dma";
  double best = st.get("dma.max_engine_active_time");
  fmt::print("engine          active %   instructions\n");
  for (int e = 0; e < isa::kNumEngines; ++e) {
    const std::string n(isa::engine_name(static_cast<isa::Engine>(e)));
    const double act = st.get("engine." + n + ".active_time");
    fmt::print("  {:<12} {:>8.1f}   {:>12.0f}\n", n, st.get("engine." + n + ".active_time_percent"),
               st.get("engine." + n + ".instruction_count"));
    if (act > best && n != "sync") best = act, bound = n;
  }
  fmt::print("  {:<12} {:>8.1f}   {:>12.0f} transfers\n", "dma (busiest)", total > 0 ? 100.0 * st.get("dma.max_engine_active_time") / total : 0.0,
             st.get("dma.transfer_count"));
  fmt::print("bytes           HBM read {:.0f}, HBM write {:.0f}, SBUF read {:.0f}, SBUF write {:.0f}\n",
             st.get("memory.hbm_read_bytes"), st.get("memory.hbm_write_bytes"), st.get("memory.sbuf_read_bytes"),
             st.get("memory.sbuf_write_bytes"));
  fmt::print("flops           {:.4g} on TensorE (MFU {:.1f}%), {:.4g} on other engines\n", st.get("flops.hardware"),
             st.get("flops.mfu_estimated_percent"),
             st.get("engine.vector.flops") + st.get("engine.scalar.flops") + st.get("engine.gpsimd.flops"));
  fmt::print("bound           {} ({:.1f}% of the time busy)\n", bound, total > 0 ? 100.0 * best / total : 0.0);
  const auto lines = sim.line_stats();
  if (!lines.empty()) fmt::print("busiest source lines (summed instruction time):\n");
  for (size_t i = 0; i < lines.size() && i < 5; ++i)
    fmt::print("  {:>12.1f} ns  {:>8} instr  {}\n", sim::ps_to_ns(lines[i].instr_time), lines[i].instructions,
               lines[i].loc.str());
}

std::string lines_json(const Simulator& sim) {
  std::string out = "[";
  bool first = true;
  for (const auto& l : sim.line_stats()) {
    out += fmt::format("{}\n  {{\"src\": \"{}\", \"instructions\": {}, \"instruction_time_ns\": {:.3f}}}", first ? "" : ",",
                       sim::json_escape(l.loc.str()), l.instructions, sim::ps_to_ns(l.instr_time));
    first = false;
  }
  return out + "]";
}

int cmd_run(const Args& a) {
  const frontend::Kernel k = load_kernel(a);
  const sim::Config cfg = engines::load_config(config_name(a.config), a.overrides);
  SimOptions opts;
  opts.numerics = !a.timing_only;
  opts.trace_path = a.trace;
  Simulator sim(cfg, opts);
  frontend::verify_kernel(k, sim.params());
  frontend::Lowering::allocate_hbm(k, sim);
  if (!a.timing_only) load_inputs(a, k, sim);
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> csv(nullptr, &std::fclose);
  if (!a.instructions.empty()) {
    csv.reset(std::fopen(a.instructions.c_str(), "w"));
    if (!csv) throw Error(ErrorCode::kBadInput, fmt::format("cannot write '{}'", a.instructions));
    fmt::print(csv.get(), "index,opcode,engine,start_ns,end_ns,duration_ns,dma_queue,bytes,src_file,src_line\n");
    uint64_t index = 0;
    sim.set_instr_listener([&](const isa::Instr& in, const InstrTiming& t) {
      uint64_t bytes = 0;
      if (isa::is_dma(in.op)) bytes = static_cast<uint64_t>(in.slot(0).total_elems() * dtype_bytes(in.slot(0).dtype));
      const SourceLoc& loc = sim.source(in.loc);
      std::string file = loc.file;
      for (char& c : file)
        if (c == ',' || c == '"' || c == '\n') c = '_';
      fmt::print(csv.get(), "{},{},{},{:.3f},{:.3f},{:.3f},{},{},{},{}\n", index++, isa::op_info(in.op).mnemonic,
                 isa::engine_name(in.engine), sim::ps_to_ns(t.start), sim::ps_to_ns(t.end),
                 sim::ps_to_ns(t.end - t.start), isa::is_dma(in.op) ? std::to_string(in.dma_queue) : "", bytes, file,
                 loc.line);
    });
  }
  frontend::Lowering low(k, sim);
  low.run();
  sim.finish();
  csv.reset();
  const sim::StatsRegistry st = sim.stats();
  print_summary(k, sim, st, low.instructions());
  if (!a.outputs.empty() && !a.timing_only) {
    fs::create_directories(a.outputs);
    for (const auto& t : k.tensors)
      if (t.space == isa::Space::kHbm && t.kind == frontend::TensorKind::kOutput)
        frontend::write_npy((fs::path(a.outputs) / (t.name + ".npy")).string(), sim.read_hbm(t.name), t.dtype, t.shape,
                            a.raw_outputs);
  }
  if (!a.stats.empty()) {
    std::ofstream f(a.stats);
    if (!f) throw Error(ErrorCode::kBadInput, fmt::format("cannot write '{}'", a.stats));
    f << fmt::format(
        "{{\"kernel\": \"{}\", \"config\": \"{}\", \"timing_only\": {}, \"instructions\": {},\n\"lines\": {},\n\"stats\": {}}}\n",
        sim::json_escape(k.name), sim::json_escape(cfg.name()), a.timing_only ? "true" : "false", low.instructions(),
        lines_json(sim), st.to_json());
    std::ofstream c(a.stats + ".config.yaml");
    c << cfg.to_yaml();
  }
  return 0;
}

int cmd_check(const Args& a) {
  const frontend::Kernel k = load_kernel(a);
  const sim::Config cfg = engines::load_config(config_name(a.config), a.overrides);
  frontend::verify_kernel(k, engines::CoreParams::from_config(cfg));
  fmt::print("{}: ok ({} tensors, {} ops, {} loops) for {}\n", a.kernel, k.tensors.size(), k.ops.size(), k.loops.size(),
             cfg.name());
  return 0;
}

int cmd_disasm(const Args& a) {
  const frontend::Kernel k = load_kernel(a);
  SimOptions opts;
  opts.numerics = false;
  Simulator sim(engines::load_config(config_name(a.config), a.overrides), opts);
  frontend::verify_kernel(k, sim.params());
  frontend::Lowering::allocate_hbm(k, sim);
  frontend::Lowering low(k, sim);
  for (const auto& pl : low.placements())
    if (pl.tensor >= 0)
      fmt::print("# tile {:<16} offset {:>7} bufs {} (stride {})\n", k.tensors[static_cast<size_t>(pl.tensor)].name,
                 pl.offset, pl.bufs, pl.stride);
  isa::Instr in;
  int64_t n = 0;
  while ((a.limit < 0 || n < a.limit) && low.next(in)) {
    const std::string loc = sim.source(in.loc).str();
    fmt::print("{:>8}  {}{}\n", n++, isa::disassemble(in), loc.empty() ? "" : "   ; " + loc);
  }
  return 0;
}

int cmd_config(const Args& a) {
  const std::string preset = a.kernel.empty() ? a.config : a.kernel;
  fmt::print("{}", engines::load_config(config_name(preset), a.overrides).to_yaml());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc >= 2 && (std::string(argv[1]) == "--version" || std::string(argv[1]) == "version")) {
      fmt::print("nsim {}\n", NSIM_VERSION);
      return 0;
    }
    if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h" || std::string(argv[1]) == "help") {
      fmt::print("{}", kMainHelp);
      return argc < 2 ? 2 : 0;
    }
    const Args a = parse_args(argc, argv);
    if (a.command == "run") return a.help ? (fmt::print("{}", kRunHelp), 0) : cmd_run(a);
    if (a.command == "check") return a.help ? (fmt::print("{}", kCheckHelp), 0) : cmd_check(a);
    if (a.command == "disasm") return a.help ? (fmt::print("{}", kDisasmHelp), 0) : cmd_disasm(a);
    if (a.command == "config") return a.help ? (fmt::print("{}", kConfigHelp), 0) : cmd_config(a);
    usage_error(fmt::format("unknown command '{}'", a.command));
  } catch (const Error& e) {
    fmt::print(stderr, "{}\n", e.what());
    return 2;
  } catch (const std::bad_alloc&) {
    fmt::print(stderr, "NSIM-E901: out of memory\n");
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "NSIM-E901: internal error: {}\n", e.what());
    return 1;
  }
}
