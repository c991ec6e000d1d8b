// The `nsim` command-line program: run, check and disassemble kernel.json files, show configs.
// Exit status: 0 success, 2 user error (coded message on stderr), 1 internal error.
#include <fmt/format.h>

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engines/params.h"
#include "engines/bounds.h"
#include "engines/simulator.h"
#include "frontend/analyze.h"
#include "frontend/disasm.h"
#include "frontend/diff.h"
#include "frontend/inputs.h"
#include "frontend/ir.h"
#include "frontend/json.h"
#include "frontend/lower.h"
#include "frontend/multicore.h"
#include "frontend/npy.h"
#include "frontend/tables.h"

#ifndef NSIM_VERSION
#define NSIM_VERSION "dev"
#endif

extern char** environ;

namespace fs = std::filesystem;
using namespace nsim;

namespace {

constexpr const char* kMainHelp = R"(nsim — cycle-approximate NeuronCore simulator

usage: nsim <command> [options]

commands:
  run      simulate a kernel.json: outputs, timing summary, stats, trace
  check    verify a kernel.json without running it
  disasm   print the compiled instruction stream (issue order, engines, queues) with source lines
  analyze  bottleneck report: bounds, idle time, critical path, findings tied to source lines
  diff     compare two runs (kernel versions or configs): engines and source lines faster/slower
  config   print the effective configuration of a preset
  plot     roofline and engine-utilisation PNGs of a kernel.json (runs python3 -m nsim.plot)
  sweep    what-if grid of config values x kernels, in parallel: CSV/Parquet table and plot (nsim.sweep)

Run 'nsim <command> --help' for the options of a command. 'nsim --version' prints the version.
Exit status: 0 on success, 2 on a user error (the message starts with its code, NSIM-Exxx),
128 + N when signal N (SIGINT, SIGTERM) stopped 'nsim run' (error E417, Interrupted; trace and stats are completed).
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
  --trace-limit N      with --trace: write only the N earliest slices (by start time); 0 = all
                       [default: 1000000, about 150 MB of JSON; the run says so when it cut the trace].
                       Memory use does not grow with the kernel's instruction count when N > 0
  --trace-window START_NS:END_NS
                       with --trace: write only slices overlapping [START_NS, END_NS) (kept whole);
                       either side may be empty, e.g. 5000: or :20000. A trace cut by either
                       option ends with an instant event giving the number of slices dropped
  --stats FILE         write stats as JSON; the effective config goes to FILE.config.yaml
  --stats-table        after the summary, print every stat as a table grouped by engine / dma /
                       memory / flops: value, unit, description (docs/profiling.md, "Stats")
  --timing-only        skip numerics (same timing, no outputs)
  --check              the sanitizer: report reads of never-written SBUF/PSUM, accumulation into
                       never-written PSUM and the first NaN/Inf made from finite inputs, with the
                       instruction, tensor and source line, as warnings on stderr (docs/debugging.md)
  --max-instructions N stop with error E416 (ResourceLimit) after N instructions [default: 0 = no limit]
  --max-sim-time T     stop with error E416 once the simulated time passes T (a number of ns, or with a
                       unit: 500ns, 20us, 3ms, 1s) [default: 0 = no limit]. A run stopped by a limit,
                       SIGINT or SIGTERM still finishes its trace (valid JSON), --stats and tables and
                       prints the partial summary; exit status 2 (a limit) or 128 + signal number
  --lnc N              the launch's LNC degree: 2 runs a multi-core kernel.json ("cores": 2, written by
                       kernel[2].to_json) on two physical cores sharing one HBM stack (trn2, trn3;
                       docs/lnc.md); a kernel.json declares its own degree, --lnc checks it [default: its own]
  --quiet, -q          no progress line on stderr (shown once a run takes over 2 s)
  --instructions FILE  write one CSV row per instruction: times, bytes, source line, semaphore wait
                       (queryable with SQL, e.g. DuckDB; docs/profiling.md)
  --dma FILE           write one CSV row per DMA packet (a transfer's piece on one DMA engine): times,
                       bytes, descriptors, throughput, queue, memory spaces, source line
)";

constexpr const char* kCheckHelp = R"(usage: nsim check kernel.json [--config NAME|FILE] [-p KEY=VALUE ...]

Parse and verify the kernel for the given generation without running it.
)";

constexpr const char* kDisasmHelp = R"(usage: nsim disasm kernel.json [--config NAME|FILE] [-p KEY=VALUE ...] [--limit N]

Print the compiled instruction stream: the tiles' SBUF/PSUM placements, then one instruction per line
in the order the compiler model issues them (-p compiler.schedule=program_order: the kernel's order),
with the engine and DMA queue it chose, its start time and its source location.
--limit N stops after N instructions [default: all].
)";

constexpr const char* kAnalyzeHelp = R"(usage: nsim analyze kernel.json [--config NAME|FILE] [-p KEY=VALUE ...] [--json FILE] [--lines N]

Simulate the kernel timing-only and print the report a performance engineer would write: the bounds
(each engine's busy time, the busiest DMA engine, HBM traffic, the dependency chain) and the bound verdict
that `nsim run` prints too (a resource, or latency when none is busy analysis.latency_bound_percent of the time),
the critical path, each engine's idle time and what it waited on, and findings (small DMA transfers,
redundant HBM loads, PE under-fill, fp32 matmuls, PE transposes, engine bottleneck, serialisation)
ranked by estimated time saved, with the kernel source lines to change (docs/profiling.md).
  --json FILE   also write the report as JSON ('-' = stdout instead of the text)
  --lines N     source lines shown per finding [default: 5]
)";

constexpr const char* kDiffHelp = R"(usage: nsim diff A B [--config NAME|FILE] [-p KEY=VALUE ...]
                 [--config-b NAME|FILE] [-P KEY=VALUE ...] [--lines N] [--json FILE]

Compare two runs: total time, each engine's active time and instructions, HBM bytes, DMA transfers,
FLOPs and MFU, and every kernel source line (matched by file:line) that got faster or slower. A and B
are each a stats JSON ('nsim run --stats') or a kernel.json, which is simulated timing-only.
  --config NAME|FILE  configuration of both kernel.json sides [default: trn2]
  -p KEY=VALUE        override for both sides (repeatable)
  --config-b NAME     configuration of side B instead (e.g. --config trn1 --config-b trn2)
  -P KEY=VALUE        override for side B only, after -p (a what-if: -P hbm.bw=725GB/s)
  --lines N           source lines shown, largest change first [default: 20]
  --json FILE         also write the comparison as JSON ('-' = stdout instead of the text)
Deltas are B - A; "slower" means B takes longer. Example: nsim diff k.json k.json --config-b trn3
When the two sides ran with different configurations, the keys whose values differ are listed after it.
)";

constexpr const char* kPlotHelp = R"(usage: nsim plot kernel.json [kernel.json ...] [--config NAME|FILE] [--out DIR] [--bins N]

Simulate each kernel timing-only and write <name>_roofline.png and <name>_utilisation.png, with a
one-line roofline and utilisation summary per kernel (docs/profiling.md, "Plots").
  --config NAME|FILE  preset or YAML file [default: trn2]
  --out DIR           output directory, created if missing [default: .]
  --bins N            time bins of the utilisation plot [default: 200]
This runs 'python3 -m nsim.plot' with the same arguments and exits with its status. It needs python3
with numpy and matplotlib, and the nsim Python package with its _nsim module: in a build tree they
are found next to this program (<source>/python and <build>/python are put first on PYTHONPATH),
otherwise on PYTHONPATH or installed by 'pip install .'. NSIM_PYTHON=/path/to/python picks another
interpreter.
)";

constexpr const char* kSweepHelp = R"(usage: nsim sweep kernel.json [kernel.json ...] -g KEY=V1,V2,... [-g ...] [--config NAME|FILE]
                  [--out FILE.csv|FILE.parquet] [--plot FILE.png] [-j N] [--ray] [-q]

Simulate each kernel timing-only at every point of the grid (the product of the -g keys' values: any
configuration keys, e.g. -g hbm.bw=181.25GB/s,362.5GB/s,725GB/s -g sbuf.bytes_per_partition=96KiB,192KiB),
in parallel worker processes, and write one row per (kernel, point): the values, status (ok, or the
error code of a kernel that does not fit), the bound verdict, the time and the bound stats
(docs/profiling.md, "What-if sweeps").
  -g, --grid KEY=V1,V2,...  a configuration key and its values (repeat for more keys)
  --config NAME|FILE        preset or YAML file [default: trn2]
  --out FILE                .csv, or .parquet (needs pyarrow) [default: sweep.csv]
  --plot FILE.png           also plot kernel time against the first grid key
  -j, --jobs N              worker processes [default: the CPU count]
  --ray                     run the points on Ray (pip install ray; a running cluster is used)
  -q, --quiet               no progress bar
This runs 'python3 -m nsim.sweep' with the same arguments (as 'nsim plot' runs nsim.plot: the same
PYTHONPATH and NSIM_PYTHON rules). Kernel parameters can be swept from Python: nsim.sweep.sweep().
)";

constexpr const char* kConfigHelp = R"(usage: nsim config [NAME|FILE] [-p KEY=VALUE ...]

Print the effective configuration (after preset inheritance and overrides) as YAML.
)";

/// Trace slices written by default (--trace-limit): bounds the file (~150 B per slice) and the memory.
constexpr uint64_t kDefaultTraceLimit = 1000000;

// "--max-sim-time" value: a number of ns, or a number with one of the units ns, us, ms, s.
double parse_duration_ns(const std::string& opt, const std::string& v) {
  static const std::pair<const char*, double> kUnits[] = {{"ns", 1.0}, {"us", 1e3}, {"ms", 1e6}, {"s", 1e9}};
  double scale = 1.0;
  std::string num = v;
  for (const auto& [u, f] : kUnits) {
    const std::string unit(u);
    if (num.size() > unit.size() && num.compare(num.size() - unit.size(), unit.size(), unit) == 0) {
      num = num.substr(0, num.size() - unit.size());
      scale = f;
      break;
    }
  }
  double x = -1;
  size_t used = 0;
  try {
    x = std::stod(num, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  const double ns = x * scale;
  if (used == 0 || used != num.size() || !(ns >= 0) || ns > 1e15)  // also nan, inf; 1e15 ns keeps ps in int64
    throw Error(ErrorCode::kUsage, fmt::format("{} expects a duration such as 5000 (ns), 20us, 3ms or 1s, at most 1e15 "
                                               "ns, found '{}' (see 'nsim --help')",
                                               opt, v));
  return ns;
}

struct Args {
  std::string command, kernel, config = "trn2", inputs, outputs, trace, stats, instructions, dma;
  std::vector<std::string> overrides;
  uint64_t seed = 0;
  bool timing_only = false, raw_outputs = false, help = false;
  bool stats_table = false;  ///< run --stats-table
  bool quiet = false;        ///< run --quiet: no progress line
  bool check = false;        ///< run --check: the sanitizer
  int64_t lnc = 0;           ///< run --lnc: the LNC degree the kernel must declare (0 = its own)
  int64_t limit = -1;
  uint64_t trace_limit = kDefaultTraceLimit;                ///< --trace-limit (0 = all)
  bool trace_limit_given = false;
  uint64_t max_instructions = 0;                            ///< --max-instructions (0 = none)
  double max_sim_time_ns = 0;                               ///< --max-sim-time (0 = none)
  std::string json;                                         ///< analyze, diff --json
  int64_t lines = -1;                                       ///< analyze, diff --lines
  double trace_window_start_ns = 0, trace_window_end_ns = 0;  ///< --trace-window (end 0 = no end)
  std::string kernel_b, config_b;        ///< diff: second file, --config-b (empty = --config)
  std::vector<std::string> overrides_b;  ///< diff: -P, overrides of side B only (after -p)
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
    else if (s == "--dma" && a.command == "run") a.dma = value(i, s);
    else if (s == "--timing-only") a.timing_only = true;
    else if (s == "--max-sim-time" && a.command == "run") a.max_sim_time_ns = parse_duration_ns(s, value(i, s));
    else if (s == "--stats-table" && a.command == "run") a.stats_table = true;
    else if ((s == "--quiet" || s == "-q") && a.command == "run") a.quiet = true;
    else if (s == "--check" && a.command == "run") a.check = true;
    else if (s == "--raw-outputs") a.raw_outputs = true;
    else if (s == "--json" && a.command == "analyze") a.json = value(i, s);
    else if (s == "--json" && a.command == "diff") a.json = value(i, s);
    else if (s == "--config-b" && a.command == "diff") a.config_b = value(i, s);
    else if ((s == "-P" || s == "--param-b") && a.command == "diff") a.overrides_b.push_back(value(i, s));
    else if (s == "--trace-window") {
      const std::string v = value(i, s);
      // "START:END" in ns, either side may be empty (not both); numbers in [0, 1e15], START < END.
      auto bad = [&]() {
        usage_error(fmt::format("--trace-window expects START_NS:END_NS (e.g. 5000:20000, 5000: or :20000), found '{}'", v));
      };
      auto number = [&](const std::string& t) -> double {
        if (t.empty()) return 0;
        double x = 0;
        size_t used = 0;
        try {
          x = std::stod(t, &used);
        } catch (const std::exception&) {
          bad();
        }
        if (used != t.size() || !(x >= 0) || x > 1e15) bad();  // also rejects nan, inf (and overflow in ps)
        return x;
      };
      const size_t colon = v.find(':');
      if (colon == std::string::npos || v.find(':', colon + 1) != std::string::npos || v.size() == 1) bad();
      a.trace_window_start_ns = number(v.substr(0, colon));
      a.trace_window_end_ns = number(v.substr(colon + 1));
      if (colon + 1 < v.size() && a.trace_window_end_ns <= a.trace_window_start_ns) bad();
    } else if (s == "--seed" || s == "--limit" || s == "--trace-limit" || s == "--lines" ||
               (s == "--max-instructions" && a.command == "run") || (s == "--lnc" && a.command == "run")) {
      const std::string v = value(i, s);
      try {
        size_t used = 0;
        const long long n = std::stoll(v, &used);
        if (used != v.size() || n < 0) throw std::invalid_argument(v);
        if (s == "--seed") a.seed = static_cast<uint64_t>(n);
        else if (s == "--trace-limit") a.trace_limit = static_cast<uint64_t>(n), a.trace_limit_given = true;
        else if (s == "--max-instructions") a.max_instructions = static_cast<uint64_t>(n);
        else if (s == "--lines") a.lines = n;
        else if (s == "--lnc") a.lnc = n;
        else a.limit = n;
      } catch (const std::exception&) {
        usage_error(fmt::format("{} expects a non-negative integer, found '{}'", s, v));
      }
    } else if (!s.empty() && s[0] == '-') {
      usage_error(fmt::format("unknown option '{}'", s));
    } else if (a.kernel.empty()) {
      a.kernel = s;
    } else if (a.command == "diff" && a.kernel_b.empty()) {
      a.kernel_b = s;
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
  if (fs::path(a.kernel).extension() == ".py")
    usage_error(fmt::format(
        "'nsim {}' takes a kernel.json, not a Python script ('{}'): run an NKI script unchanged with "
        "'python -m nsim run {}', or write its kernel.json with kernel.to_json(*args) (docs/kernel-json.md) "
        "and pass that; from Python, kernel.simulate(*args) and Profile.analyze() do the same as this command",
        a.command, a.kernel, a.kernel));
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
  fmt::print("engine          active %   instructions\n");
  for (int e = 0; e < isa::kNumEngines; ++e) {
    const std::string n(isa::engine_name(static_cast<isa::Engine>(e)));
    fmt::print("  {:<12} {:>8.1f}   {:>12.0f}\n", n, st.get("engine." + n + ".active_time_percent"),
               st.get("engine." + n + ".instruction_count"));
  }
  fmt::print("  {:<12} {:>8.1f}   {:>12.0f} transfers\n", "dma (busiest)", total > 0 ? 100.0 * st.get("dma.max_engine_active_time") / total : 0.0,
             st.get("dma.transfer_count"));
  fmt::print("bytes           HBM read {:.0f}, HBM write {:.0f}, SBUF read {:.0f}, SBUF write {:.0f}\n",
             st.get("memory.hbm_read_bytes"), st.get("memory.hbm_write_bytes"), st.get("memory.sbuf_read_bytes"),
             st.get("memory.sbuf_write_bytes"));
  fmt::print("flops           {:.4g} on TensorE (MFU {:.1f}%), {:.4g} on other engines\n", st.get("flops.hardware"),
             st.get("flops.mfu_estimated_percent"),
             st.get("engine.vector.flops") + st.get("engine.scalar.flops") + st.get("engine.gpsimd.flops"));
  const engines::BoundVerdict v = engines::bound_verdict(st);
  if (v.verdict == "latency")
    fmt::print("bound           latency (the busiest resource, {}, is busy {:.1f}% of the time, under "
               "analysis.latency_bound_percent = {:.0f}%: engines wait on each other)\n",
               v.bounds.front().name, v.top_share_percent, v.latency_threshold_percent);
  else
    fmt::print("bound           {} (busy {:.1f}% of the time)\n", v.verdict, v.top_share_percent);
  // A resource capped by another: what-if runs that raise it change nothing.
  const engines::CoreParams& p = sim.params();
  const double dma_bw = p.dma_engines * p.dma_engine_bw;
  if (p.hbm_bw > dma_bw)
    fmt::print("note            hbm.bw ({:.1f} B/ns) is above what the {} DMA engines move ({} x dma.engine_bw {:.1f} = {:.1f} "
               "B/ns): HBM traffic is capped by the DMA engines, raising hbm.bw further changes nothing\n",
               p.hbm_bw, p.dma_engines, p.dma_engines, p.dma_engine_bw, dma_bw);
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

// The stats JSON of `run --stats`, read back by `nsim diff` (frontend/diff.h documents the format).
std::string stats_json(const frontend::Kernel& k, const sim::Config& cfg, bool timing_only, uint64_t instructions,
                       const Simulator& sim, const sim::StatsRegistry& st) {
  return fmt::format(
      "{{\"kernel\": \"{}\", \"config\": \"{}\", \"timing_only\": {}, \"instructions\": {},\n\"lines\": {},\n\"stats\": {}}}\n",
      sim::json_escape(k.name), sim::json_escape(cfg.name()), timing_only ? "true" : "false", instructions,
      lines_json(sim), st.to_json());
}

// SIGINT / SIGTERM during `nsim run`: the handler only records the signal; the simulator sees it at its
// next instruction (SimOptions::stop) and the run ends like one stopped by a limit. A second signal
// kills the process (SA_RESETHAND).
volatile std::sig_atomic_t g_stop_signal = 0;

extern "C" void on_stop_signal(int sig) { g_stop_signal = sig; }

void install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESETHAND;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

// `nsim run` of a multi-core (LNC=2) kernel.json: both cores in one schedule (frontend/multicore.h).
int cmd_run_multicore(const Args& a, const frontend::Kernel& k, const sim::Config& cfg, const SimOptions& opts) {
  frontend::MultiCoreRun mc(k, cfg, opts);
  if (!a.timing_only) load_inputs(a, k, mc.core(0));
  mc.run();
  for (const engines::CheckReport& r : mc.check_reports()) fmt::print(stderr, "nsim: warning: {}\n", r.str());
  const sim::StatsRegistry st = mc.stats();
  uint64_t instrs = 0;
  for (int c = 0; c < mc.cores(); ++c) instrs += mc.core(c).instructions();
  fmt::print("kernel {} on {} (LNC={}): {} instructions\n", k.name, mc.core(0).params().name, mc.cores(), instrs);
  fmt::print("total time      {:.1f} ns  (the later core's)\n", st.get("total_time"));
  for (int c = 0; c < mc.cores(); ++c)
    fmt::print("  core {}        {:.1f} ns  {} instructions\n", c, sim::ps_to_ns(mc.core(c).total_time()),
               mc.core(c).instructions());
  fmt::print("load imbalance  {:.1f} %  (rendezvous: {})\n", st.get("lnc.imbalance_percent"), mc.rendezvous());
  if (a.stats_table) fmt::print("\n{}", st.to_table());
  if (!a.outputs.empty() && !a.timing_only) {
    fs::create_directories(a.outputs);
    for (const auto& t : k.tensors)
      if (t.space == isa::Space::kHbm && t.kind == frontend::TensorKind::kOutput)
        frontend::write_npy((fs::path(a.outputs) / (t.name + ".npy")).string(), mc.core(0).read_hbm(t.name), t.dtype,
                            t.shape, a.raw_outputs);
  }
  if (!a.stats.empty()) {
    std::string lines = "[";
    bool first = true;
    for (const auto& l : mc.line_stats()) {
      lines += fmt::format("{}\n  {{\"src\": \"{}\", \"instructions\": {}, \"instruction_time_ns\": {:.3f}}}",
                           first ? "" : ",", sim::json_escape(l.loc.str()), l.instructions, sim::ps_to_ns(l.instr_time));
      first = false;
    }
    lines += "]";
    std::ofstream f(a.stats);
    if (!f) throw Error(ErrorCode::kCannotWrite, fmt::format("cannot write '{}'", a.stats));
    f << fmt::format(
        "{{\"kernel\": \"{}\", \"config\": \"{}\", \"timing_only\": {}, \"instructions\": {},\n\"lines\": {},\n\"stats\": "
        "{}}}\n",
        sim::json_escape(k.name), sim::json_escape(cfg.name()), a.timing_only ? "true" : "false", instrs, lines,
        st.to_json());
    std::ofstream c(a.stats + ".config.yaml");
    c << cfg.to_yaml();
  }
  return 0;
}

int cmd_run(const Args& a) {
  const frontend::Kernel k = load_kernel(a);
  const sim::Config cfg = engines::load_config(config_name(a.config), a.overrides);
  const int64_t declared = k.core_programs.empty() ? 1 : static_cast<int64_t>(k.core_programs.size());
  if (a.lnc != 0 && a.lnc != declared)
    throw Error(ErrorCode::kMultiCoreLaunch,
                fmt::format("--lnc {}: '{}' is a {}-core launch (kernel.json \"cores\"); write the kernel.json of an "
                            "LNC={} launch with kernel[{}].to_json(...) (docs/lnc.md)",
                            a.lnc, a.kernel, declared, a.lnc, a.lnc));
  SimOptions opts;
  opts.numerics = !a.timing_only;
  opts.check = a.check && !a.timing_only;
  opts.trace_path = a.trace;
  opts.trace_limit = a.trace_limit;
  opts.trace_window_start_ns = a.trace_window_start_ns, opts.trace_window_end_ns = a.trace_window_end_ns;
  opts.max_instructions = a.max_instructions;
  opts.max_sim_time_ns = a.max_sim_time_ns;
  opts.stop = &g_stop_signal;
  install_stop_handlers();
  if (!k.core_programs.empty()) return cmd_run_multicore(a, k, cfg, opts);
  Simulator sim(cfg, opts);
  frontend::verify_kernel(k, sim.params());
  frontend::Lowering::allocate_hbm(k, sim);
  if (!a.timing_only) load_inputs(a, k, sim);
  // --instructions / --dma: CSV tables written while the simulation runs (frontend/tables.h).
  frontend::TableWriter tables(sim, a.instructions, a.dma);
  frontend::Lowering low(k, sim);
  // Progress on stderr once the run takes over 2 s: instructions, simulated time, rate (about once a second).
  const auto t0 = std::chrono::steady_clock::now();
  double last_shown = 0;
  bool shown = false;
  if (!a.quiet)
    low.set_progress([&](uint64_t n, sim::Ps simulated) {
      const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (el < 2.0 || el - last_shown < 1.0) return;
      last_shown = el;
      shown = true;
      fmt::print(stderr, "\rnsim: {:.2f} M instructions, {:.1f} us simulated, {:.2f} M instructions/s   ",
                 static_cast<double>(n) * 1e-6, sim::ps_to_ns(simulated) * 1e-3, static_cast<double>(n) * 1e-6 / el);
      std::fflush(stderr);
    });
  // A limit (E416) or a signal (E417) stops the run between two instructions: the trace, the tables and
  // --stats are still finished (valid files) and the summary of the partial run printed, then the error.
  std::optional<Error> stopped;
  try {
    low.run();
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kResourceLimit && e.code() != ErrorCode::kInterrupted) throw;
    stopped = e;
    if (low.recording_occupancy()) low.write_occupancy();  // the counter tracks of the partial run
  }
  if (shown) fmt::print(stderr, "\n");
  sim.finish();
  tables.close();
  for (const engines::CheckReport& r : sim.check_reports()) fmt::print(stderr, "nsim: warning: {}\n", r.str());
  const sim::StatsRegistry st = sim.stats();
  if (stopped) fmt::print("partial run (stopped by {}): the numbers below cover the instructions simulated\n",
                          stopped->code() == ErrorCode::kInterrupted ? "a signal" : "a limit");
  print_summary(k, sim, st, stopped ? sim.instructions() : low.instructions());
  if (a.stats_table) fmt::print("\n{}", st.to_table());
  if (const auto* w = dynamic_cast<const sim::ChromeTraceWriter*>(sim.trace_sink());
      w && !a.trace_limit_given && w->slices_dropped_by_limit() > 0)
    fmt::print("note: the trace holds the earliest {} slices ({} more were dropped); --trace-limit N changes the "
               "cap, --trace-limit 0 writes them all\n",
               w->slices_written(), w->slices_dropped_by_limit());
  if (stopped) {
    if (!a.stats.empty()) {
      std::ofstream f(a.stats);
      if (f) f << stats_json(k, cfg, a.timing_only, sim.instructions(), sim, st);
    }
    if (stopped->code() == ErrorCode::kInterrupted) {
      const int sig = g_stop_signal;
      fmt::print(stderr, "{}: interrupted by {} after {} instructions ({:.1f} ns simulated); the trace, tables and "
                         "stats cover the partial run\n",
                 stopped->code_str(), sig == SIGTERM ? "SIGTERM" : "SIGINT", sim.instructions(),
                 sim::ps_to_ns(sim.total_time()));
      return 128 + (sig ? sig : SIGINT);
    }
    fmt::print(stderr, "{}\n", stopped->what());
    return 2;
  }
  if (!a.outputs.empty() && !a.timing_only) {
    fs::create_directories(a.outputs);
    for (const auto& t : k.tensors)
      if (t.space == isa::Space::kHbm && t.kind == frontend::TensorKind::kOutput)
        frontend::write_npy((fs::path(a.outputs) / (t.name + ".npy")).string(), sim.read_hbm(t.name), t.dtype, t.shape,
                            a.raw_outputs);
  }
  if (!a.stats.empty()) {
    std::ofstream f(a.stats);
    if (!f) throw Error(ErrorCode::kCannotWrite, fmt::format("cannot write '{}'", a.stats));
    f << stats_json(k, cfg, a.timing_only, low.instructions(), sim, st);
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
  const frontend::Disassembly d =
      frontend::disassemble_kernel(k, engines::load_config(config_name(a.config), a.overrides), a.limit);
  for (const std::string& t : d.tiles) fmt::print("# {}\n", t);
  for (size_t i = 0; i < d.instructions.size(); ++i) fmt::print("{:>8}  {}\n", i, d.instructions[i]);
  return 0;
}

int cmd_analyze(const Args& a) {
  const frontend::Kernel k = load_kernel(a);
  const sim::Config cfg = engines::load_config(config_name(a.config), a.overrides);
  const engines::AnalysisReport r = frontend::analyze_kernel(k, cfg);
  if (a.json == "-") {
    fmt::print("{}", r.to_json());
    return 0;
  }
  fmt::print("{}", r.to_text(a.lines >= 0 ? static_cast<size_t>(a.lines) : 5));
  if (!a.json.empty()) {
    std::ofstream f(a.json);
    if (!f) throw Error(ErrorCode::kCannotWrite, fmt::format("cannot write '{}'", a.json));
    f << r.to_json();
  }
  return 0;
}

// Stats JSON text of one side of `nsim diff`: a stats file as is, or a kernel.json simulated timing-only
// (then `simulated` is set).
std::string diff_side(const std::string& path, const std::string& config, const std::vector<std::string>& overrides,
                      bool& simulated) {
  const std::string text = read_text(path);
  const frontend::json::Value v = frontend::json::parse(text, path);
  simulated = false;
  if (v.find("stats")) return text;  // diff_profiles checks the rest
  if (!v.find("nsim_kernel"))
    throw Error(ErrorCode::kBadStatsFile,
                fmt::format("{}: neither a stats JSON (no \"stats\" member; see 'nsim run --stats') nor a kernel.json "
                            "(no \"nsim_kernel\" member)",
                            path));
  const frontend::Kernel k = frontend::parse_kernel_json(text, path);
  const sim::Config cfg = engines::load_config(config_name(config), overrides);
  SimOptions opts;
  opts.numerics = false;  // timing does not depend on the data
  Simulator sim(cfg, opts);
  frontend::verify_kernel(k, sim.params());
  frontend::Lowering::allocate_hbm(k, sim);
  frontend::Lowering low(k, sim);
  low.run();
  sim.finish();
  simulated = true;
  return stats_json(k, cfg, true, low.instructions(), sim, sim.stats());
}

int cmd_diff(const Args& a) {
  if (a.kernel.empty() || a.kernel_b.empty()) usage_error("'nsim diff' needs two files: A and B");
  constexpr int64_t kDefaultLines = 20;
  const std::string config_b = a.config_b.empty() ? a.config : a.config_b;
  std::vector<std::string> overrides_b = a.overrides;
  overrides_b.insert(overrides_b.end(), a.overrides_b.begin(), a.overrides_b.end());
  bool sim_a = false, sim_b = false;
  const std::string text_a = diff_side(a.kernel, a.config, a.overrides, sim_a);
  const std::string text_b = diff_side(a.kernel_b, config_b, overrides_b, sim_b);
  // The labels are the paths; when the two sides were simulated with different settings they also
  // say which is which (needed when one kernel.json is compared with itself under two configurations).
  auto settings = [](const std::string& cfg, const std::vector<std::string>& ov) {
    return fmt::format("{}{}{}", cfg, ov.empty() ? "" : " ", fmt::join(ov, " "));
  };
  const std::string set_a = settings(a.config, a.overrides), set_b = settings(config_b, overrides_b);
  const bool tag = set_a != set_b;
  const frontend::ProfileDiff d =
      frontend::diff_profiles(text_a, text_b, tag && sim_a ? fmt::format("{} [{}]", a.kernel, set_a) : a.kernel,
                              tag && sim_b ? fmt::format("{} [{}]", a.kernel_b, set_b) : a.kernel_b);
  if (a.json == "-") {
    fmt::print("{}", frontend::to_json(d));
    return 0;
  }
  const int64_t lines = a.lines >= 0 ? std::min<int64_t>(a.lines, std::numeric_limits<int>::max()) : kDefaultLines;
  fmt::print("{}", frontend::to_text(d, static_cast<int>(lines)));
  if (tag && (sim_a || sim_b)) {  // what differs between the two configurations, key by key
    const sim::Config ca = engines::load_config(config_name(a.config), a.overrides);
    const sim::Config cb = engines::load_config(config_name(config_b), overrides_b);
    std::string rows;
    int n = 0;
    for (const auto& [key, va] : ca.raw()) {
      auto it = cb.raw().find(key);
      if (it == cb.raw().end() || it->second == va) continue;
      rows += fmt::format("  {:<40} {:>14} -> {}\n", key, va, it->second);
      ++n;
    }
    fmt::print("\nConfiguration differences (A -> B), {} key{}:\n{}", n, n == 1 ? "" : "s",
               n ? rows : std::string("  none (the same effective configuration)\n"));
  }
  if (!a.json.empty()) {
    std::ofstream f(a.json);
    if (!f) throw Error(ErrorCode::kCannotWrite, fmt::format("cannot write '{}'", a.json));
    f << frontend::to_json(d);
  }
  return 0;
}

// ---- nsim plot / nsim sweep: python3 -m nsim.plot / nsim.sweep, with clear messages when Python or a
// package is missing.

// Run by the interpreter as `python3 -c kPythonBootstrap COMMAND ARGS...`: nsim.COMMAND.main(ARGS) after
// checking that nsim, its _nsim module and matplotlib import (exit 2 with a coded message if not). A fmt
// format string: {} is the code of E414 (usage).
constexpr const char* kPythonBootstrap = R"PY(import sys, importlib
cmd = sys.argv[1]
def _missing(what, err):
    sys.stderr.write("{}: 'nsim %s' needs %s (%s)\n" % (cmd, what, err))
    sys.exit(2)
try:
    import nsim
    mod = importlib.import_module("nsim." + cmd)
except ImportError as e:
    _missing("the nsim Python package: put <source>/python on PYTHONPATH or 'pip install .'", e)
if not getattr(nsim, "core_available", False):
    _missing("the _nsim module: build it (cmake --build build) and put build/python on PYTHONPATH",
             getattr(nsim, "_core_import_error", "not built"))
try:
    import matplotlib
except ImportError as e:
    _missing("matplotlib: pip install 'nsim[plot]' (or pip install '.[plot]' in the source tree)", e)
sys.exit(mod.main(sys.argv[2:]))
)PY";

// Directories to put on the child's PYTHONPATH so that the nsim package and the _nsim module that
// belong to this executable are imported: in a build tree <build>/python holds _nsim*.so and the
// source tree's python/ holds the package (found via <build>/CMakeCache.txt, else <build>/..).
std::vector<std::string> plot_python_dirs(const char* argv0) {
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec || exe.empty()) {
    ec.clear();
    exe = fs::weakly_canonical(fs::path(argv0), ec);
    if (ec) return {};
  }
  const fs::path dir = exe.parent_path();
  std::vector<fs::path> pkg_roots;
  if (std::ifstream cache(dir / "CMakeCache.txt"); cache) {
    const std::string key = "CMAKE_HOME_DIRECTORY:INTERNAL=";
    for (std::string line; std::getline(cache, line);)
      if (line.rfind(key, 0) == 0) pkg_roots.push_back(fs::path(line.substr(key.size())) / "python");
  }
  pkg_roots.push_back(dir.parent_path() / "python");
  std::vector<std::string> out;
  for (const fs::path& p : pkg_roots)
    if (fs::exists(p / "nsim" / "plot.py", ec)) {
      out.push_back(p.string());
      break;
    }
  if (fs::is_directory(dir / "python", ec))
    for (const auto& e : fs::directory_iterator(dir / "python", ec))
      if (e.path().filename().string().rfind("_nsim", 0) == 0) {
        out.push_back((dir / "python").string());
        break;
      }
  return out;
}

/// `nsim plot|sweep ARGS...`: `python3 -m nsim.<command> ARGS...` with this build's package and module.
int cmd_python(int argc, char** argv, const char* help) {
  const std::string command = argv[1];
  for (int i = 2; i < argc; ++i)
    if (std::string(argv[i]) == "--help" || std::string(argv[i]) == "-h") return fmt::print("{}", help), 0;
  const char* py_env = std::getenv("NSIM_PYTHON");
  const std::string python = py_env && *py_env ? py_env : "python3";
  std::vector<std::string> args = {python, "-c",
                                   fmt::format(fmt::runtime(kPythonBootstrap), error_code_str(ErrorCode::kUsage)), command};
  for (int i = 2; i < argc; ++i) args.emplace_back(argv[i]);
  std::vector<std::string> env;
  for (char** e = environ; e && *e; ++e)
    if (std::strncmp(*e, "PYTHONPATH=", 11) != 0) env.emplace_back(*e);
  std::vector<std::string> path = plot_python_dirs(argv[0]);
  if (const char* old = std::getenv("PYTHONPATH"); old && *old) path.emplace_back(old);  // kept, after ours
  if (!path.empty()) env.push_back(fmt::format("PYTHONPATH={}", fmt::join(path, ":")));
  auto c_array = [](std::vector<std::string>& v) {
    std::vector<char*> p;
    for (auto& s : v) p.push_back(s.data());
    p.push_back(nullptr);
    return p;
  };
  std::vector<char*> cargs = c_array(args), cenv = c_array(env);
  std::fflush(stdout);
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, python.c_str(), nullptr, nullptr, cargs.data(), cenv.data());
  if (rc != 0)
    throw Error(ErrorCode::kUsage,
                fmt::format("'nsim {}' runs '{} -m nsim.{}', but '{}' cannot be started: {}{}", command, python,
                            command, python, std::strerror(rc),
                            py_env && *py_env ? "" : " (install python3 or set NSIM_PYTHON)"));
  int status = 0;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) throw Error(ErrorCode::kInternal, fmt::format("waitpid: {}", std::strerror(errno)));
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : 1;
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
    if (std::string(argv[1]) == "plot") return cmd_python(argc, argv, kPlotHelp);  // its options are nsim.plot's
    if (std::string(argv[1]) == "sweep") return cmd_python(argc, argv, kSweepHelp);  // nsim.sweep's
    const Args a = parse_args(argc, argv);
    if (a.command == "run") return a.help ? (fmt::print("{}", kRunHelp), 0) : cmd_run(a);
    if (a.command == "check") return a.help ? (fmt::print("{}", kCheckHelp), 0) : cmd_check(a);
    if (a.command == "disasm") return a.help ? (fmt::print("{}", kDisasmHelp), 0) : cmd_disasm(a);
    if (a.command == "analyze") return a.help ? (fmt::print("{}", kAnalyzeHelp), 0) : cmd_analyze(a);
    if (a.command == "diff") return a.help ? (fmt::print("{}", kDiffHelp), 0) : cmd_diff(a);
    if (a.command == "config") return a.help ? (fmt::print("{}", kConfigHelp), 0) : cmd_config(a);
    usage_error(fmt::format("unknown command '{}'", a.command));
  } catch (const Error& e) {
    fmt::print(stderr, "{}\n", e.what());
    return 2;
  } catch (const std::bad_alloc&) {
    fmt::print(stderr, "{}: out of memory\n", error_code_str(ErrorCode::kInternal));
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "{}: internal error: {}\n", error_code_str(ErrorCode::kInternal), e.what());
    return 1;
  }
}
