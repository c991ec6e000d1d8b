// The `nsim` command-line program: run, check and disassemble kernel.json files, show configs.
// Exit status: 0 success, 2 user error (coded message on stderr), 1 internal error.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engines/params.h"
#include "engines/bounds.h"
#include "engines/simulator.h"
#include "frontend/compiler/allocate.h"
#include "frontend/analyze.h"
#include "frontend/disasm.h"
#include "frontend/diff.h"
#include "frontend/gzip.h"
#include "frontend/inputs.h"
#include "frontend/ir.h"
#include "frontend/json.h"
#include "frontend/lower.h"
#include "frontend/multicore.h"
#include "frontend/npy.h"
#include "frontend/progress.h"
#include "frontend/tables.h"
#include "sim/json_out.h"
#include "sim/text.h"
#include "sim/trace.h"

#ifndef NSIM_VERSION
#define NSIM_VERSION "dev"
#endif

extern char** environ;

namespace fs = std::filesystem;
using namespace nsim;

namespace {

/// Trace slices written by default (--trace-limit): bounds the file (~150 B per slice) and the memory.
constexpr uint64_t kDefaultTraceLimit = 1000000;

[[noreturn]] void usage_error(const std::string& msg, const std::string& command = "") {
  throw Error(ErrorCode::kUsage, fmt::format("{} (see 'nsim {}--help')", msg, command.empty() ? "" : command + " "));
}

// ---- Option values. Each command has its own struct; the CLI11 declarations in build_cli() fill them.

/// What every kernel command takes: the file, the configuration and its overrides.
struct KernelArgs {
  std::string command, kernel, config = "trn2";
  std::vector<std::string> overrides;
};

struct RunArgs : KernelArgs {
  std::string inputs, outputs, trace, stats, instructions, dma;
  uint64_t seed = 0;
  bool timing_only = false, raw_outputs = false;
  bool fast_forward = false, no_fast_forward = false;  ///< --fast-forward (asked for) / --no-fast-forward
  bool stats_table = false;  ///< --stats-table
  bool quiet = false;        ///< --quiet: no progress line
  bool check = false;        ///< --check: the sanitizer
  uint64_t trace_limit = kDefaultTraceLimit;                  ///< --trace-limit (0 = all)
  bool trace_limit_given = false;
  double trace_window_start_ns = 0, trace_window_end_ns = 0;  ///< --trace-window (end 0 = no end)
  uint64_t lnc = 0;                                           ///< --lnc: the LNC degree the kernel must declare (0 = its own)
  uint64_t max_instructions = 0;                              ///< --max-instructions (0 = none)
  double max_sim_time_ns = 0;                                 ///< --max-sim-time (0 = none)
};

struct DisasmArgs : KernelArgs {
  int64_t limit = -1;  ///< --limit (-1 = all)
};

struct AnalyzeArgs : KernelArgs {
  std::string json;    ///< --json FILE ('-' = stdout)
  int64_t lines = -1;  ///< --lines (-1 = the default)
};

struct DiffArgs : AnalyzeArgs {
  std::string kernel_b, config_b;        ///< the second file, --config-b (empty = --config)
  std::vector<std::string> overrides_b;  ///< -P: overrides of side B only (after -p)
  bool no_fast_forward = false;          ///< --no-fast-forward: the kernel.json sides simulate every instruction
};

// ---- Value parsers of the options whose syntax is nsim's own (a usage error names the option).

/// A non-negative decimal integer (no sign, no base prefix).
uint64_t parse_count(const std::string& opt, const std::string& v, const std::string& command) {
  uint64_t n = 0;
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
  if (v.empty() || ec != std::errc() || end != v.data() + v.size())
    usage_error(fmt::format("{} expects a non-negative integer, found '{}'", opt, v), command);
  return n;
}

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
    usage_error(fmt::format("{} expects a duration such as 5000 (ns), 20us, 3ms or 1s, at most 1e15 ns, found '{}'", opt, v),
                "run");
  return ns;
}

// "--trace-window" value: "START:END" in ns, either side may be empty (not both); numbers in [0, 1e15], START < END.
void parse_trace_window(const std::string& v, RunArgs& a) {
  auto bad = [&]() {
    usage_error(fmt::format("--trace-window expects START_NS:END_NS (e.g. 5000:20000, 5000: or :20000), found '{}'", v),
                "run");
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
}

// ---- Help layout: "usage: nsim CMD ...", the description, the arguments and options CLI11 generates from
// the declarations (name, value text, description), then the footer.
class HelpFormatter : public CLI::Formatter {
 public:
  HelpFormatter() {
    column_width(28);
    label("Usage", "usage");
    label("OPTIONS", "options");
    label("SUBCOMMAND", "command");
    label("Positionals", "arguments");
    label("Subcommands", "commands");
    label("REQUIRED", "");
  }
  /// The text under a command's usage line (its description is the one-line summary in 'nsim --help').
  void about(const CLI::App* app, std::string text) { about_[app] = std::move(text); }
  std::string make_help(const CLI::App* app, std::string name, CLI::AppFormatMode mode) const override {
    std::string out = make_usage(app, name);
    const auto it = about_.find(app);
    const std::string& about = it != about_.end() ? it->second : app->get_description();
    if (!about.empty()) out += "\n" + about + "\n";
    out += make_positionals(app) + make_groups(app, mode) + make_subcommands(app, mode);
    if (!app->get_footer().empty()) out += "\n" + app->get_footer() + "\n";
    return out;
  }

 private:
  std::map<const CLI::App*, std::string> about_;
};

/// A repeatable KEY=VALUE option (-p, -P): one value per occurrence, so `-p k=v kernel.json` leaves the
/// kernel alone; the occurrences accumulate in order.
void add_overrides(CLI::App* cmd, const std::string& names, std::vector<std::string>& out, const std::string& desc) {
  cmd->add_option(names, out, desc)
      ->option_text("KEY=VALUE")
      ->expected(1)
      ->allow_extra_args(false)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
}

/// Adds the options every kernel command shares (the file `positional`, --config, -p) to `cmd`.
void add_kernel_options(CLI::App* cmd, KernelArgs& a, const char* positional = "kernel.json",
                        const char* what = "the kernel to read", bool required = true) {
  a.command = cmd->get_name();
  cmd->add_option(positional, a.kernel, what)->required(required)->type_name("");
  cmd->add_option("-c,--config", a.config, "preset (trn1, trn2, trn3, inf2 = trn1) or a YAML file [default: trn2]")
      ->option_text("NAME|FILE");
  add_overrides(cmd, "-p,--param", a.overrides, "override one config key (repeatable), e.g. -p hbm.bw=725GB/s");
}

/// A count option (non-negative decimal integer) stored into `out` by parse_count().
template <class T>
CLI::Option* add_count(CLI::App* cmd, const std::string& names, T& out, const std::string& desc, bool* given = nullptr) {
  const std::string command = cmd->get_name();
  const std::string shown = names.substr(names.rfind(',') == std::string::npos ? 0 : names.rfind(',') + 1);
  return cmd
      ->add_option_function<std::string>(
          names,
          [&out, given, command, shown](const std::string& v) {
            out = static_cast<T>(parse_count(shown, v, command));
            if (given) *given = true;
          },
          desc)
      ->option_text("N");
}

/// A command: `summary` is its line in 'nsim --help', `about` the text under its usage line.
CLI::App* command(CLI::App& app, HelpFormatter& help, const std::string& name, const std::string& summary,
                  std::string about) {
  CLI::App* c = app.add_subcommand(name, summary);
  help.about(c, std::move(about));
  return c;
}

/// All option values, one struct per command.
struct Parsed {
  RunArgs run;
  KernelArgs check, config;
  DisasmArgs disasm;
  AnalyzeArgs analyze;
  DiffArgs diff;
};

/// The command line: each command's options, value syntax and help, declared once.
void build_cli(CLI::App& app, Parsed& p) {
  const auto help = std::make_shared<HelpFormatter>();
  app.formatter(help);
  app.option_defaults()->group("options")->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.set_help_flag("-h,--help", "print this help and exit");
  app.set_version_flag("--version", fmt::format("nsim {}", NSIM_VERSION), "print the version and exit");
  app.require_subcommand(1);
  app.description("nsim — cycle-approximate NeuronCore simulator");

  // -- run
  RunArgs& r = p.run;
  CLI::App* run = command(app, *help, "run",
      "simulate a kernel.json: outputs, timing summary, stats, trace",
      "Simulate the kernel: run its numerics and its timing on one NeuronCore, print a summary.");
  add_kernel_options(run, r);
  run->add_option("--inputs", r.inputs,
                  "input arrays: a directory of <tensor>.npy files or an .npz (np.savez);\n"
                  "inputs not given are filled with seeded random data")
      ->option_text("DIR|FILE");
  add_count(run, "--seed", r.seed, "seed of the random inputs [default: 0]");
  run->add_option("--outputs", r.outputs, "write every output tensor as DIR/<tensor>.npy (bf16/fp8 widened to float32)")
      ->option_text("DIR");
  run->add_flag("--raw-outputs", r.raw_outputs, "write bf16/fp8 outputs as raw bits (|V2, |V1) instead");
  run->add_option("--trace", r.trace, "write a trace for ui.perfetto.dev: Chrome JSON, or Perfetto protobuf when FILE ends in .pftrace (compressed, ~17x smaller)")->option_text("FILE");
  add_count(run, "--trace-limit", r.trace_limit,
            "with --trace: write only the N earliest slices (by start time); 0 = all\n"
            "[default: 1000000, about 150 MB of JSON; the run says so when it cut the trace].\n"
            "Memory use does not grow with the kernel's instruction count when N > 0",
            &r.trace_limit_given);
  run->add_option_function<std::string>(
         "--trace-window", [&r](const std::string& v) { parse_trace_window(v, r); },
         "with --trace: write only slices overlapping [START_NS, END_NS) (kept whole);\n"
         "either side may be empty, e.g. 5000: or :20000. A trace cut by either\n"
         "option ends with an instant event giving the number of slices dropped")
      ->option_text("START_NS:END_NS");
  run->add_option("--stats", r.stats, "write stats as JSON; the effective config goes to FILE.config.yaml")
      ->option_text("FILE");
  run->add_flag("--stats-table", r.stats_table,
                "after the summary, print every stat as a table grouped by engine / dma /\n"
                "memory / flops: value, unit, description (docs/profiling.md, \"Stats\")");
  run->add_flag("--timing-only", r.timing_only, "skip numerics (same timing, no outputs)");
  run->add_flag("--fast-forward", r.fast_forward,
                "the default with --timing-only (and no --instructions, --dma or --trace of every\n"
                "slice; with --trace-limit / --trace-window only past the limit or the window's end):\n"
                "once a loop's iterations repeat exactly, count its middle iterations as repeats of\n"
                "those simulated instead of simulating them (docs/timing-model.md, \"Fast-forward\");\n"
                "given, it is an error where it cannot apply");
  run->add_flag("--no-fast-forward", r.no_fast_forward,
                "simulate every instruction of a --timing-only run (the reference fast-forward is\n"
                "checked against)");
  run->add_flag("--check", r.check,
                "the sanitizer: report reads of never-written SBUF/PSUM, accumulation into\n"
                "never-written PSUM, the first NaN/Inf made from finite inputs and values clipped\n"
                "by a narrowing cast, with the instruction, tensor and source line, as warnings on\n"
                "stderr (docs/debugging.md)");
  add_count(run, "--max-instructions", r.max_instructions,
            "stop with error E416 (ResourceLimit) after N instructions [default: 0 = no limit]");
  run->add_option_function<std::string>(
         "--max-sim-time", [&r](const std::string& v) { r.max_sim_time_ns = parse_duration_ns("--max-sim-time", v); },
         "stop with error E416 once the simulated time passes T (a number of ns, or with a\n"
         "unit: 500ns, 20us, 3ms, 1s) [default: 0 = no limit]. A run stopped by a limit,\n"
         "SIGINT or SIGTERM still finishes its trace (valid JSON), --stats and tables and\n"
         "prints the partial summary; exit status 2 (a limit) or 128 + signal number")
      ->option_text("T");
  add_count(run, "--lnc", r.lnc,
            "the launch's LNC degree: 2 runs a multi-core kernel.json (\"cores\": 2, written by\n"
            "kernel[2].to_json) on two physical cores sharing one HBM stack (trn2, trn3;\n"
            "docs/lnc.md); a kernel.json declares its own degree, --lnc checks it [default: its own]");
  run->add_flag("-q,--quiet", r.quiet, "no progress line on stderr (shown once a run takes over 2 s)");
  run->add_option("--instructions", r.instructions,
                  "write one CSV row per instruction: times, bytes, source line, semaphore wait\n"
                  "(queryable with SQL, e.g. DuckDB; docs/profiling.md)")
      ->option_text("FILE");
  run->add_option("--dma", r.dma,
                  "write one CSV row per DMA packet (a transfer's piece on one DMA engine): times,\n"
                  "bytes, descriptors, throughput, queue, memory spaces, source line")
      ->option_text("FILE");

  // -- check
  CLI::App* check = command(app, *help, "check",
      "verify a kernel.json without running it",
      "Parse and verify the kernel for the given generation without running it.");
  add_kernel_options(check, p.check);

  // -- disasm
  CLI::App* disasm = command(app, *help, "disasm",
      "print the compiled instruction stream (issue order, engines, queues) with source lines",
      "Print the compiled instruction stream: the tiles' SBUF/PSUM placements, then one instruction per line\n"
      "in the order the compiler model issues them (-p compiler.schedule=program_order: the kernel's order),\n"
      "with the engine and DMA queue it chose, its start time and its source location.");
  add_kernel_options(disasm, p.disasm);
  add_count(disasm, "--limit", p.disasm.limit, "stop after N instructions [default: all]");

  // -- analyze
  AnalyzeArgs& an = p.analyze;
  CLI::App* analyze = command(app, *help, "analyze",
      "bottleneck report: bounds, idle time, critical path, findings tied to source lines",
      "Simulate the kernel timing-only and print the report a performance engineer would write: the bounds\n"
      "(each engine's busy time, the busiest DMA engine, HBM traffic, the dependency chain) and the bound verdict\n"
      "that `nsim run` prints too (a resource, or latency when none is busy analysis.latency_bound_percent of the "
      "time),\nthe critical path, each engine's idle time and what it waited on, and findings (small DMA transfers,\n"
      "redundant HBM loads, PE under-fill, fp32 matmuls, PE transposes, engine bottleneck, serialisation)\n"
      "ranked by estimated time saved, with the kernel source lines to change (docs/profiling.md).");
  add_kernel_options(analyze, an);
  analyze->add_option("--json", an.json, "also write the report as JSON ('-' = stdout instead of the text)")
      ->option_text("FILE");
  add_count(analyze, "--lines", an.lines, "source lines shown per finding [default: 5]");

  // -- diff
  DiffArgs& d = p.diff;
  CLI::App* diff = command(app, *help, "diff",
      "compare two runs (kernel versions or configs): engines and source lines faster/slower",
      "Compare two runs: total time, each engine's active time and instructions, HBM bytes, DMA transfers,\n"
      "FLOPs and MFU, and every kernel source line (matched by file:line) that got faster or slower. A and B\n"
      "are each a stats JSON ('nsim run --stats') or a kernel.json, which is simulated timing-only.");
  add_kernel_options(diff, d, "A", "side A: a stats JSON or a kernel.json");
  diff->get_option("--config")->description("configuration of both kernel.json sides [default: trn2]");
  diff->get_option("--param")->description("override for both sides (repeatable)");
  diff->add_option("B", d.kernel_b, "side B")->required()->type_name("");
  diff->add_option("--config-b", d.config_b, "configuration of side B instead (e.g. --config trn1 --config-b trn2)")
      ->option_text("NAME|FILE");
  add_overrides(diff, "-P,--param-b", d.overrides_b, "override for side B only, after -p (a what-if: -P hbm.bw=725GB/s)");
  add_count(diff, "--lines", d.lines, "source lines shown, largest change first [default: 20]");
  diff->add_option("--json", d.json, "also write the comparison as JSON ('-' = stdout instead of the text)")
      ->option_text("FILE");
  diff->add_flag("--no-fast-forward", d.no_fast_forward,
                 "simulate every instruction of the kernel.json sides (by default, as 'nsim run --timing-only',\n"
                 "the repeating iterations of long loops are counted: docs/timing-model.md, \"Fast-forward\")");
  diff->footer(
      "Deltas are B - A; \"slower\" means B takes longer. Example: nsim diff k.json k.json --config-b trn3\n"
      "When the two sides ran with different configurations, the keys whose values differ are listed after it.");

  // -- config
  CLI::App* config = command(app, *help, "config",
      "print the effective configuration of a preset",
      "Print the effective configuration (after preset inheritance and overrides) as YAML.");
  add_kernel_options(config, p.config, "preset", "preset name or YAML file (instead of --config)", false);

  for (CLI::App* c : app.get_subcommands({})) {
    c->group("commands");
    c->set_help_flag("-h,--help", "print this help and exit");
  }
  app.footer(  // after the commands: they would inherit it
      "Run 'nsim <command> --help' for the options of a command. 'nsim --version' prints the version.\n"
      "Exit status: 0 on success, 2 on a user error (the message starts with its code, NSIM-Exxx),\n"
      "128 + N when signal N (SIGINT, SIGTERM) stopped 'nsim run' (error E417, Interrupted; trace and stats are "
      "completed).");

  // -- plot, sweep: their arguments (and --help) belong to the Python modules nsim.plot and nsim.sweep,
  // whose argparse declarations are the only statement of them; nsim hands them over unparsed.
  for (const auto& [name, what] : {std::pair{"plot", "roofline and engine-utilisation PNGs of a kernel.json (runs python3 -m nsim.plot)"},
                                   std::pair{"sweep", "what-if grid of config values x kernels, in parallel: CSV/Parquet table "
                                                      "and plot (nsim.sweep)"}}) {
    CLI::App* py = app.add_subcommand(name, what);
    py->group("commands");
    py->set_help_flag();
    py->prefix_command();
    py->allow_extras();
  }
}

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(ErrorCode::kBadInput, fmt::format("cannot open '{}'", path));
  std::ostringstream text;  // one bulk read (istreambuf_iterator went char by char: 3% of a small run)
  text << f.rdbuf();
  return std::move(text).str();
}

std::string config_name(const std::string& c) { return c == "inf2" ? "trn1" : c; }

frontend::Kernel load_kernel(const KernelArgs& a) {
  if (a.kernel.empty()) usage_error(fmt::format("'nsim {}' needs a kernel.json path", a.command));
  if (fs::path(a.kernel).extension() == ".py")
    usage_error(fmt::format(
        "'nsim {}' takes a kernel.json, not a Python script ('{}'): run an NKI script unchanged with "
        "'python -m nsim run {}', or write its kernel.json with kernel.to_json(*args) (docs/kernel-json.md) "
        "and pass that; from Python, kernel.simulate(*args) and Profile.analyze() do the same as this command",
        a.command, a.kernel, a.kernel));
  return frontend::parse_kernel_json(frontend::kernel_text(read_text(a.kernel), a.kernel), a.kernel);
}

// Fill HBM inputs: from files where given, else seeded random values.
void load_inputs(const RunArgs& a, const frontend::Kernel& k, Simulator& sim) {
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
  frontend::write_inputs(k, sim, frontend::views_of(bytes), a.seed);
}

// The config a run used, as the summary names it: the preset or the YAML file's stem (a custom file inheriting a
// preset without a `name:` was shown as its parent), and the overrides given.
std::string config_label(const sim::Config& cfg, const std::vector<std::string>& overrides) {
  if (overrides.empty()) return cfg.name();
  return fmt::format("{} with {} override{} ({})", cfg.name(), overrides.size(), overrides.size() == 1 ? "" : "s",
                     fmt::join(overrides, ", "));
}

void print_fast_forward_loops(const frontend::Kernel& k, const Simulator& sim) {
  using engines::FfOutcome;
  constexpr size_t kShown = 5;
  std::vector<const Simulator::FfLoop*> shown;
  uint64_t short_loops = 0, short_instances = 0;
  for (const Simulator::FfLoop& fl : sim.fast_forward_loops()) {
    if (engines::ff_main_outcome(fl.n) != FfOutcome::kShort) shown.push_back(&fl);
    else ++short_loops, short_instances += fl.n[static_cast<size_t>(FfOutcome::kShort)];
  }
  std::stable_sort(shown.begin(), shown.end(), [](const Simulator::FfLoop* a, const Simulator::FfLoop* b) {
    return a->n[static_cast<size_t>(FfOutcome::kSkipped)] > b->n[static_cast<size_t>(FfOutcome::kSkipped)];
  });
  for (size_t j = 0; j < shown.size() && j < kShown; ++j) {
    const Simulator::FfLoop& fl = *shown[j];
    std::string what;
    for (size_t i = 0; i < fl.n.size(); ++i)
      if (fl.n[i]) what += fmt::format("{}{} {}", what.empty() ? "" : ", ", fl.n[i], engines::kFfOutcomes[i].name);
    if (fl.loc.file.empty())  // a kernel.json loop without "loc": its index and variable
      fmt::print("fast-forward    loop {}{}: instances {}\n", fl.loop,
                 fl.loop >= 0 && static_cast<size_t>(fl.loop) < k.loops.size()
                     ? fmt::format(" ({})", k.loops[static_cast<size_t>(fl.loop)].var)
                     : std::string(),
                 what);
    else fmt::print("fast-forward    loop at {}:{}: instances {}\n", fl.loc.file, fl.loc.line, what);
    const FfOutcome main = engines::ff_main_outcome(fl.n);
    if (main != FfOutcome::kSkipped) fmt::print("                {}\n", engines::ff_outcome(main).what);
  }
  if (shown.size() > kShown) fmt::print("fast-forward    ... and {} more loops\n", shown.size() - kShown);
  if (short_loops)
    fmt::print("fast-forward    {} loop{} ({} instance{}) {}\n", short_loops, short_loops == 1 ? "" : "s", short_instances,
               short_instances == 1 ? "" : "s", engines::ff_outcome(FfOutcome::kShort).what);
}

void print_summary(const frontend::Kernel& k, const Simulator& sim, const sim::StatsRegistry& st, uint64_t instrs,
                   const std::vector<std::string>& overrides, bool fast_forward_asked) {
  const double total = st.get("total_time");
  fmt::print("kernel {} on {}: {} instructions\n", k.name, config_label(sim.config(), overrides), instrs);
  if (const uint64_t skipped = sim.skipped_instructions())
    fmt::print("fast-forward    {} of them counted as repeats of loop iterations simulated, not simulated one by one "
               "(--no-fast-forward simulates each)\n",
               skipped);
  // Per loop fast-forward met (when it skipped, or --fast-forward was given), by source line: what it made of the
  // loop's instances and, for one never skipped, why. Loops only too short to follow (inner loops, mostly) are
  // counted on one line.
  if (fast_forward_asked || sim.skipped_instructions()) print_fast_forward_loops(k, sim);
  fmt::print("total time      {:.1f} ns  ({:.0f} cycles at {:.2f} GHz)\n", total, st.get("neuroncore_cycle_count"),
             sim.params().clk(isa::Engine::kSync).ghz());
  // active: from each instruction's start to its end (pipeline latency included); busy: the time spent issuing
  // them, the measure of the engine's bound (engines/bounds.h) and of the `bound` line below.
  const auto pct = [&](double ns) { return total > 0 ? 100.0 * ns / total : 0.0; };
  fmt::print("engine          active %    busy %   instructions\n");
  for (int e = 0; e < isa::kNumEngines; ++e) {
    const std::string n(isa::engine_name(static_cast<isa::Engine>(e)));
    fmt::print("  {:<12} {:>8.1f}  {:>8.1f}   {:>12.0f}\n", n, st.get("engine." + n + ".active_time_percent"),
               pct(st.get("bound." + n + ".time")), st.get("engine." + n + ".instruction_count"));
  }
  fmt::print("  {:<12} {:>8.1f}  {:>8.1f}   {:>12.0f} transfers\n", "dma (busiest)", pct(st.get("dma.max_engine_active_time")),
             pct(st.get("bound.dma.time")), st.get("dma.transfer_count"));
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
  const double store_bw = dma_bw * p.dma_store_bw_factor;
  if (p.hbm_bw > std::max(dma_bw, store_bw))
    fmt::print("note            hbm.bw ({:.1f} B/ns) is above what the {} DMA engines move ({} x dma.engine_bw {:.1f} = {:.1f} "
               "B/ns{}): HBM traffic is capped by the DMA engines, raising hbm.bw further changes nothing\n",
               p.hbm_bw, p.dma_engines, p.dma_engines, p.dma_engine_bw, dma_bw,
               store_bw > dma_bw ? fmt::format(", stores {:.1f} B/ns", store_bw) : std::string());
  else if (p.hbm_bw > dma_bw)
    fmt::print("note            hbm.bw ({:.1f} B/ns) is above what the {} DMA engines load ({} x dma.engine_bw {:.1f} = {:.1f} "
               "B/ns): raising hbm.bw speeds up only stores (x dma.store_bw_factor {:.2f}: up to {:.1f} B/ns)\n",
               p.hbm_bw, p.dma_engines, p.dma_engines, p.dma_engine_bw, dma_bw, p.dma_store_bw_factor, store_bw);
  const auto lines = sim.line_stats();
  if (!lines.empty()) fmt::print("busiest source lines (summed instruction time):\n");
  for (size_t i = 0; i < lines.size() && i < 5; ++i)
    fmt::print("  {:>12.1f} ns  {:>8} instr  {}\n", sim::ps_to_ns(lines[i].instr_time), lines[i].instructions,
               lines[i].loc.str());
}

// The stats JSON of `run --stats`, read back by `nsim diff` (frontend/diff.h documents the format).
std::string stats_json(const frontend::Kernel& k, const sim::Config& cfg, bool timing_only, uint64_t instructions,
                       const std::vector<Simulator::LineStats>& line_stats, const sim::StatsRegistry& st) {
  sim::Json lines = sim::Json::array();
  for (const auto& l : line_stats)
    lines.push_back(sim::Json{{"src", l.loc.str()},
                              {"instructions", l.instructions},
                              {"instruction_time_ns", sim::json_ns(sim::ps_to_ns(l.instr_time))}});
  const sim::Json doc{{"kernel", k.name},     {"config", cfg.name()}, {"timing_only", timing_only},
                      {"instructions", instructions}, {"lines", std::move(lines)}, {"stats", st.json()}};
  return sim::dump_json(doc, 2) + "\n";
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
int cmd_run_multicore(const RunArgs& a, const frontend::Kernel& k, const sim::Config& cfg, const SimOptions& opts) {
  frontend::MultiCoreRun mc(k, cfg, opts);
  if (!a.timing_only) load_inputs(a, k, mc.core(0));
  mc.run();
  for (const engines::CheckReport& r : mc.check_reports()) fmt::print(stderr, "nsim: warning: {}\n", r.str());
  const sim::StatsRegistry st = mc.stats();
  uint64_t instrs = 0;
  for (int c = 0; c < mc.cores(); ++c) instrs += mc.core(c).instructions();
  fmt::print("kernel {} on {} (LNC={}): {} instructions\n", k.name, config_label(mc.core(0).config(), a.overrides),
             mc.cores(), instrs);
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
        frontend::write_npy((fs::path(a.outputs) / (t.name + ".npy")).string(), mc.core(0).hbm_bytes(t.name),
                            static_cast<size_t>(mc.core(0).memory().hbm_tensor(t.name).bytes), t.dtype, t.shape,
                            a.raw_outputs);
  }
  if (!a.stats.empty()) {
    std::ofstream f(a.stats);
    if (!f) throw Error(ErrorCode::kCannotWrite, fmt::format("cannot write '{}'", a.stats));
    f << stats_json(k, cfg, a.timing_only, instrs, mc.line_stats(), st);
    std::ofstream c(a.stats + ".config.yaml");
    c << cfg.to_yaml();
  }
  return 0;
}

int cmd_run(const RunArgs& a) {
  if (a.fast_forward && a.no_fast_forward) usage_error("--fast-forward and --no-fast-forward exclude each other", "run");
  // Fast-forward is on wherever it can apply: a timing-only run whose instructions are not all wanted one by one (a
  // trace with --trace-limit or --trace-window wants them until it keeps no more slices: Simulator::trace_closed).
  const bool whole_trace =
      !a.trace.empty() && a.trace_limit == 0 && a.trace_window_start_ns <= 0 && a.trace_window_end_ns <= 0;
  const bool each_instruction = whole_trace || !a.instructions.empty() || !a.dma.empty();
  if (a.fast_forward && (!a.timing_only || each_instruction))
    usage_error("--fast-forward needs --timing-only and cannot be used with --instructions, --dma or a --trace without "
                "--trace-limit or --trace-window (they need every instruction simulated)",
                "run");
  const frontend::Kernel k = load_kernel(a);
  const sim::Config cfg = engines::load_config(config_name(a.config), a.overrides);
  const uint64_t declared = k.core_programs.empty() ? 1 : k.core_programs.size();
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
  opts.fast_forward = a.timing_only && !each_instruction && !a.no_fast_forward;
  opts.stop = &g_stop_signal;
  install_stop_handlers();
  if (!k.core_programs.empty()) return cmd_run_multicore(a, k, cfg, opts);
  Simulator sim(cfg, opts);
  frontend::AllocationPlan plan;  // worked out once, by the verifier, for the lowering
  frontend::verify_kernel(k, sim.params(), &plan);
  frontend::Lowering::allocate_hbm(k, sim);
  if (!a.timing_only) load_inputs(a, k, sim);
  // --instructions / --dma: CSV tables written while the simulation runs (frontend/tables.h).
  frontend::TableWriter tables(sim, a.instructions, a.dma);
  frontend::Lowering low(k, sim, &plan);
  // Progress on stderr once the run takes over 2 s: instructions, simulated time, rate (about once a
  // second; frontend/progress.h).
  frontend::ProgressClock clock;
  if (!a.quiet)
    low.set_progress([&](uint64_t n, sim::Ps simulated) {
      if (!clock.due()) return;
      fmt::print(stderr, "\rnsim: {:.2f} M instructions, {:.1f} us simulated, {:.2f} M instructions/s   ",
                 static_cast<double>(n) * 1e-6, sim::ps_to_ns(simulated) * 1e-3,
                 static_cast<double>(n) * 1e-6 / std::max(clock.elapsed(), 1e-9));
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
  if (clock.shown()) fmt::print(stderr, "\n");
  sim.finish();
  tables.close();
  for (const engines::CheckReport& r : sim.check_reports()) fmt::print(stderr, "nsim: warning: {}\n", r.str());
  const sim::StatsRegistry st = sim.stats();
  if (stopped) fmt::print("partial run (stopped by {}): the numbers below cover the instructions simulated\n",
                          stopped->code() == ErrorCode::kInterrupted ? "a signal" : "a limit");
  print_summary(k, sim, st, stopped ? sim.instructions() : low.instructions(), a.overrides, a.fast_forward);
  if (a.stats_table) fmt::print("\n{}", st.to_table());
  if (const auto* w = dynamic_cast<const sim::OrderedTraceSink*>(sim.trace_sink());
      w && !a.trace_limit_given && w->slices_dropped_by_limit() > 0)
    fmt::print("note: the trace holds the earliest {} slices ({} more were dropped); --trace-limit N changes the "
               "cap, --trace-limit 0 writes them all\n",
               w->slices_written(), w->slices_dropped_by_limit());
  if (stopped) {
    if (!a.stats.empty()) {
      std::ofstream f(a.stats);
      if (f) f << stats_json(k, cfg, a.timing_only, sim.instructions(), sim.line_stats(), st);
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
        frontend::write_npy((fs::path(a.outputs) / (t.name + ".npy")).string(), sim.hbm_bytes(t.name),
                            static_cast<size_t>(sim.memory().hbm_tensor(t.name).bytes), t.dtype, t.shape,
                            a.raw_outputs);
  }
  if (!a.stats.empty()) {
    std::ofstream f(a.stats);
    if (!f) throw Error(ErrorCode::kCannotWrite, fmt::format("cannot write '{}'", a.stats));
    f << stats_json(k, cfg, a.timing_only, low.instructions(), sim.line_stats(), st);
    std::ofstream c(a.stats + ".config.yaml");
    c << cfg.to_yaml();
  }
  return 0;
}

int cmd_check(const KernelArgs& a) {
  const frontend::Kernel k = load_kernel(a);
  const sim::Config cfg = engines::load_config(config_name(a.config), a.overrides);
  frontend::verify_kernel(k, engines::CoreParams::from_config(cfg));
  fmt::print("{}: ok ({} tensors, {} ops, {} loops) for {}\n", a.kernel, k.tensors.size(), k.ops.size(), k.loops.size(),
             cfg.name());
  return 0;
}

int cmd_disasm(const DisasmArgs& a) {
  const frontend::Kernel k = load_kernel(a);
  const frontend::Disassembly d =
      frontend::disassemble_kernel(k, engines::load_config(config_name(a.config), a.overrides), a.limit);
  for (const std::string& t : d.tiles) fmt::print("# {}\n", t);
  for (size_t i = 0; i < d.instructions.size(); ++i) fmt::print("{:>8}  {}\n", i, d.instructions[i]);
  return 0;
}

int cmd_analyze(const AnalyzeArgs& a) {
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
                      bool fast_forward, bool& simulated) {
  const std::string text = frontend::kernel_text(read_text(path), path);
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
  opts.fast_forward = fast_forward;  // a timing-only run, as `nsim run --timing-only`
  Simulator sim(cfg, opts);
  frontend::AllocationPlan plan;
  frontend::verify_kernel(k, sim.params(), &plan);
  frontend::Lowering::allocate_hbm(k, sim);
  frontend::Lowering low(k, sim, &plan);
  low.run();
  sim.finish();
  simulated = true;
  return stats_json(k, cfg, true, low.instructions(), sim.line_stats(), sim.stats());
}

int cmd_diff(const DiffArgs& a) {
  if (a.kernel.empty() || a.kernel_b.empty()) usage_error("'nsim diff' needs two files: A and B");
  constexpr int64_t kDefaultLines = 20;
  const std::string config_b = a.config_b.empty() ? a.config : a.config_b;
  std::vector<std::string> overrides_b = a.overrides;
  overrides_b.insert(overrides_b.end(), a.overrides_b.begin(), a.overrides_b.end());
  bool sim_a = false, sim_b = false;
  const std::string text_a = diff_side(a.kernel, a.config, a.overrides, !a.no_fast_forward, sim_a);
  const std::string text_b = diff_side(a.kernel_b, config_b, overrides_b, !a.no_fast_forward, sim_b);
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
cmd, args = sys.argv[1], sys.argv[2:]
helping = "-h" in args or "--help" in args  # the module's argparse prints its options; nothing else is needed
def _missing(what, err):
    sys.stderr.write("{}: 'nsim %s' needs %s (%s)\n" % (cmd, what, err))
    sys.exit(2)
try:
    import nsim
    mod = importlib.import_module("nsim." + cmd)
except ImportError as e:
    _missing("the nsim Python package: put <source>/python on PYTHONPATH or 'pip install .'", e)
if not helping and not getattr(nsim, "core_available", False):
    _missing("the _nsim module: build it (cmake --build build) and put build/python on PYTHONPATH",
             getattr(nsim, "_core_import_error", "not built"))
if not helping:
    try:
        import matplotlib
    except ImportError as e:
        _missing("matplotlib: pip install 'nsim[plot]' (or pip install '.[plot]' in the source tree)", e)
sys.exit(mod.main(args, prog="nsim " + cmd))
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
int cmd_python(const std::string& command, const std::vector<std::string>& forwarded, const char* argv0) {
  const char* py_env = std::getenv("NSIM_PYTHON");
  const std::string python = py_env && *py_env ? py_env : "python3";
  std::vector<std::string> args = {python, "-c",
                                   fmt::format(fmt::runtime(kPythonBootstrap), error_code_str(ErrorCode::kUsage)), command};
  args.insert(args.end(), forwarded.begin(), forwarded.end());
  std::vector<std::string> env;
  for (char** e = environ; e && *e; ++e)
    if (std::strncmp(*e, "PYTHONPATH=", 11) != 0) env.emplace_back(*e);
  std::vector<std::string> path = plot_python_dirs(argv0);
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

int cmd_config(const KernelArgs& a) {
  const std::string preset = a.kernel.empty() ? a.config : a.kernel;
  fmt::print("{}", engines::load_config(config_name(preset), a.overrides).to_yaml());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    CLI::App app("", "nsim");
    Parsed p;
    build_cli(app, p);
    const std::string first = argc >= 2 ? argv[1] : "";
    if (argc < 2 || first == "help") {  // `nsim` alone is a usage error that shows the help
      fmt::print("{}", app.help());
      return argc < 2 ? 2 : 0;
    }
    if (first == "version") {
      fmt::print("nsim {}\n", NSIM_VERSION);
      return 0;
    }
    std::vector<std::string> names, close;
    for (const CLI::App* c : app.get_subcommands({})) {
      names.push_back(c->get_name());
      if (sim::edit_distance(first, c->get_name()) <= 2) close.push_back(fmt::format("'{}'", c->get_name()));
    }
    if (first[0] == '-' && first != "-h" && first != "--help" && first != "--version")
      usage_error(fmt::format("unknown option '{}': options follow the command, as in 'nsim run kernel.json {}' "
                              "(commands: {})",
                              first, first, sim::join(names)));
    if (first[0] != '-' && std::find(names.begin(), names.end(), first) == names.end()) {
      usage_error(fmt::format("unknown command '{}'{} (commands: {})", first,
                              close.empty() ? "" : "; did you mean " + sim::join(close, " or ") + "?", sim::join(names)));
    }
    try {
      app.parse(argc, argv);
    } catch (const CLI::Success& e) {  // --help, --version
      return app.exit(e);
    } catch (const CLI::ParseError& e) {
      const auto subs = app.get_subcommands();
      usage_error(e.what(), subs.empty() ? "" : subs.front()->get_name());
    }
    const CLI::App* cmd = app.get_subcommands().front();
    const std::string name = cmd->get_name();
    if (name == "run") return cmd_run(p.run);
    if (name == "check") return cmd_check(p.check);
    if (name == "disasm") return cmd_disasm(p.disasm);
    if (name == "analyze") return cmd_analyze(p.analyze);
    if (name == "diff") return cmd_diff(p.diff);
    if (name == "config") return cmd_config(p.config);
    return cmd_python(name, cmd->remaining(), argv[0]);  // plot, sweep
  } catch (const Error& e) {
    fmt::print(stderr, "{}\n", e.what());
    if (const std::string_view hint = error_info(e.code()).hint; !hint.empty()) fmt::print(stderr, "  fix: {}\n", hint);
    return 2;
  } catch (const std::bad_alloc&) {
    fmt::print(stderr, "{}: out of memory\n", error_code_str(ErrorCode::kInternal));
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "{}: internal error: {}\n", error_code_str(ErrorCode::kInternal), e.what());
    return 1;
  }
}
