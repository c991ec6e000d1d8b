// SimOptions::fast_forward (frontend/lower.h, Lowering::fast_forward_at): a timing-only run skips the
// middle iterations of a loop whose iterations repeat and counts them as repeats of those measured.
// What a user relies on: the same stats as the full simulation where the loop is steady (here: every
// stat and per-line counter equal), nothing skipped where a skip would lose a dependency (a recurrence
// through HBM) or where every instruction is needed (numerics, short loops, an instruction listener).
#include <catch2/catch.hpp>

#include <fmt/format.h>

#include <cmath>
#include <map>
#include <string>

#include "engines/simulator.h"
#include "frontend/ir.h"
#include "frontend/lower.h"

using namespace nsim;
using namespace nsim::frontend;

namespace {

/// A row softmax over `n` sequential iterations of [128, 512] bf16 (examples/softmax_2x128x512.json's
/// body). `load` / `store`: the HBM index expressions of the load and the store (b: the loop variable); the
/// load reads x when its index is "b" or "0" (unless `from_y`), else y.
std::string softmax_kernel(int n, const std::string& load = "b", const std::string& store = "b", int rows = -1,
                           bool from_y = false) {
  const int r = rows > 0 ? rows : n;
  return fmt::format(R"({{"nsim_kernel": 1, "name": "softmax_loop", "tensors": [
 {{"name": "x", "buffer": "hbm", "kind": "input", "dtype": "bfloat16", "shape": [{r}, 128, 512]}},
 {{"name": "y", "buffer": "hbm", "kind": "output", "dtype": "bfloat16", "shape": [{r}, 128, 512]}}],
 "body": [{{"loop": {{"var": "b", "start": 0, "stop": {n}, "step": 1, "kind": "sequential", "body": [
  {{"alloc": {{"name": "x_t", "buffer": "sbuf", "dtype": "bfloat16", "shape": [128, 512]}}}},
  {{"alloc": {{"name": "row_max", "buffer": "sbuf", "dtype": "float32", "shape": [128, 1]}}}},
  {{"alloc": {{"name": "neg_max", "buffer": "sbuf", "dtype": "float32", "shape": [128, 1]}}}},
  {{"alloc": {{"name": "exp_t", "buffer": "sbuf", "dtype": "float32", "shape": [128, 512]}}}},
  {{"alloc": {{"name": "row_sum", "buffer": "sbuf", "dtype": "float32", "shape": [128, 1]}}}},
  {{"alloc": {{"name": "inv_sum", "buffer": "sbuf", "dtype": "float32", "shape": [128, 1]}}}},
  {{"alloc": {{"name": "y_t", "buffer": "sbuf", "dtype": "bfloat16", "shape": [128, 512]}}}},
  {{"op": "dma_copy", "dst": "x_t", "src": {{"tensor": "{src}", "index": ["{load}", {{"start": 0, "size": 128}}, {{"start": 0, "size": 512}}]}}, "loc": {{"file": "k.py", "line": 1}}}},
  {{"op": "tensor_reduce", "dst": "row_max", "data": "x_t", "alu0": "maximum", "axis_count": 0, "loc": {{"file": "k.py", "line": 2}}}},
  {{"op": "tensor_scalar", "dst": "neg_max", "data": "row_max", "alu0": "multiply", "flags": ["has_imm0"], "imm": [-1.0, 0.0, 1.0, 0.0], "loc": {{"file": "k.py", "line": 3}}}},
  {{"op": "activation", "dst": "exp_t", "data": "x_t", "bias": "neg_max", "reduce_res": "row_sum", "act": "exp", "alu1": "add", "reduce_cmd": "reset_reduce", "loc": {{"file": "k.py", "line": 4}}}},
  {{"op": "reciprocal", "dst": "inv_sum", "data": "row_sum", "loc": {{"file": "k.py", "line": 5}}}},
  {{"op": "tensor_scalar", "dst": "y_t", "data": "exp_t", "operand0": "inv_sum", "alu0": "multiply", "loc": {{"file": "k.py", "line": 6}}}},
  {{"op": "dma_copy", "dst": {{"tensor": "y", "index": ["{store}", {{"start": 0, "size": 128}}, {{"start": 0, "size": 512}}]}}, "src": "y_t", "loc": {{"file": "k.py", "line": 7}}}}
 ]}}}}]}})",
                     fmt::arg("n", n), fmt::arg("r", r), fmt::arg("load", load), fmt::arg("store", store),
                     fmt::arg("src", (load == "b" || load == "0") && !from_y ? "x" : "y"));
}

struct Result {
  std::map<std::string, double> stats;
  std::vector<Simulator::LineStats> lines;
  uint64_t instructions = 0;
  uint64_t lowered = 0;
  std::vector<Simulator::FfLoop> ff_loops;  ///< what fast-forward made of each loop
};

/// `listener`: 1 an instruction listener, 2 an event listener (the analyzer's kind, engines/event_pipe.h).
Result run(const std::string& json, bool fast_forward, bool numerics = false, int listener = 0,
           const std::vector<std::string>& overrides = {}, const std::string& preset = "trn2") {
  const Kernel k = parse_kernel_json(json);
  SimOptions o;
  o.numerics = numerics;
  o.fast_forward = fast_forward;
  auto sim = Simulator::from_preset(preset, overrides, o);
  verify_kernel(k, sim->params());
  if (listener == 1) sim->add_instr_listener([](const isa::Instr&, const InstrTiming&) {});
  if (listener == 2) sim->add_event_listener([](const engines::InstrEvent&) {});
  Lowering low(k, *sim);
  low.run();
  sim->finish();
  Result r;
  const sim::StatsRegistry st = sim->stats();
  for (const auto& s : st.entries()) r.stats[s.name] = s.value;
  r.lines = sim->line_stats();
  r.instructions = sim->instructions();
  r.lowered = low.instructions();
  r.ff_loops = sim->fast_forward_loops();
  return r;
}

/// The instances of one fast-forward outcome (the stat fast_forward.loops.<name>).
double outcome(const Result& r, engines::FfOutcome o) {
  return r.stats.at(std::string("fast_forward.loops.") + engines::ff_outcome(o).name);
}

/// Every stat of the full run `full` equal in `ff` (but fast_forward.*, which counts what was skipped).
void check_same_stats(const Result& full, const Result& ff) {
  for (const auto& [name, v] : full.stats) {
    if (name.rfind("fast_forward.", 0) == 0) continue;
    INFO(name);
    CHECK(ff.stats.at(name) == v);
  }
}

}  // namespace

TEST_CASE("fast-forward: a steady loop gives every stat of the full simulation", "[fast_forward]") {
  // 8,000 iterations of 7 instructions. The list scheduler's window (compiler.window = 1024
  // instructions) fills over the first ~146 iterations; the steps repeat with period 2 (rotating
  // buffers); sample a after 2 x 1024 / 7 = 293 repeating iterations, sample b a whole number of the
  // scheduler's cycles later (kReaders = 6 reads, critical-path refresh every 512 admissions: 1,536
  // iterations), and the iterations between b and the last 293 are skipped.
  for (const char* idx : {"b", "0"}) {  // distinct HBM rows per iteration, and one row for all
    INFO("HBM index " << idx);
    const std::string k = softmax_kernel(8000, idx, idx);
    const Result full = run(k, false), ff = run(k, true);
    CHECK(full.stats.at("fast_forward.skipped_instructions") == 0);
    const double skipped = ff.stats.at("fast_forward.skipped_instructions");
    CHECK(skipped >= 30000);  // most of the 56,000
    CHECK(ff.instructions == full.instructions);
    CHECK(ff.lowered == full.lowered);
    CHECK(ff.instructions == 56000);
    check_same_stats(full, ff);
    // One loop, one instance, skipped; the full run notes nothing.
    CHECK(outcome(ff, engines::FfOutcome::kSkipped) == 1);
    CHECK(outcome(full, engines::FfOutcome::kSkipped) == 0);
    CHECK(full.ff_loops.empty());
    REQUIRE(ff.ff_loops.size() == 1);
    CHECK(ff.ff_loops[0].loop == 0);
    CHECK(ff.ff_loops[0].n[static_cast<size_t>(engines::FfOutcome::kSkipped)] == 1);
    REQUIRE(ff.lines.size() == full.lines.size());
    for (size_t i = 0; i < full.lines.size(); ++i) {
      CHECK(ff.lines[i].loc.line == full.lines[i].loc.line);
      CHECK(ff.lines[i].instructions == full.lines[i].instructions);
      CHECK(ff.lines[i].instr_time == full.lines[i].instr_time);
    }
  }
}

TEST_CASE("fast-forward: a recurrence through HBM is simulated whole, an in-place loop is skipped", "[fast_forward]") {
  // Iteration b reads row b of y, which iteration b - 1 wrote (the load's index "b", the store's "b + 1"): the
  // iterations a skip jumps over would hold the write the next simulated iteration waits for, and the
  // dependency tracker would not learn it (the run came out up to one iteration short). Such a loop, one that
  // reads and writes an HBM tensor through different accesses, is not followed: every stat is the full
  // run's, nothing skipped.
  {
    const std::string k = softmax_kernel(8000, "b", "b + 1", 8001, true);
    const Result full = run(k, false), ff = run(k, true);
    CHECK(ff.stats.at("fast_forward.skipped_instructions") == 0);
    CHECK(outcome(ff, engines::FfOutcome::kRecurrence) == 1);  // (what the CLI's summary names)
    check_same_stats(full, ff);
  }
  // In place (y[b] = f(y[b]): one access read and written): each iteration reads only the row it writes
  // itself, so a skip misses nothing: skipped, and the same stats.
  for (const char* idx : {"b", "0"}) {
    INFO("HBM index " << idx);
    const std::string k = softmax_kernel(8000, idx, idx, -1, true);
    const Result full = run(k, false), ff = run(k, true);
    CHECK(ff.stats.at("fast_forward.skipped_instructions") >= 30000);
    CHECK(outcome(ff, engines::FfOutcome::kSkipped) == 1);
    CHECK(outcome(ff, engines::FfOutcome::kRecurrence) == 0);
    check_same_stats(full, ff);
  }
}

TEST_CASE("fast-forward: a loop scattering into the HBM rows it reads is simulated whole", "[fast_forward]") {
  // Iteration b reads row b of y (broadcast to 128 partitions) and scatters it back through the same access
  // moved by runtime offsets (rows b .. b + 3): the scatter may reach rows later iterations read, whatever its
  // static access says, so the loop is not followed.
  const int n = 8000;
  const std::string k = fmt::format(R"({{"nsim_kernel": 1, "name": "scatter_loop",
    "tensors": [{{"name": "idx", "buffer": "hbm", "kind": "input", "dtype": "int32", "shape": [128, 1]}},
                {{"name": "y", "buffer": "hbm", "kind": "output", "dtype": "float32", "shape": [{rows}, 64]}}],
    "body": [{{"alloc": {{"name": "it", "buffer": "sbuf", "dtype": "int32", "shape": [128, 1]}}}},
             {{"op": "dma_copy", "dst": "it", "src": "idx"}},
             {{"loop": {{"var": "b", "start": 0, "stop": {n}, "step": 1, "kind": "sequential", "body": [
      {{"alloc": {{"name": "t0", "buffer": "sbuf", "dtype": "float32", "shape": [128, 64]}}}},
      {{"op": "dma_copy", "dst": "t0", "src": {{"tensor": "y", "index": [{{"start": "b", "broadcast": 128}}, {{"start": 0, "size": 64}}]}},
        "loc": {{"file": "k.py", "line": 1}}}},
      {{"op": "dma_copy", "engine": "gpsimd", "dst": {{"tensor": "y", "index": [{{"start": "b", "broadcast": 128}}, {{"start": 0, "size": 64}}]}},
        "src": "t0", "flags": ["accumulate", "indirect_dst", "oob_skip"], "offsets": "it", "iimm": [4, 64],
        "loc": {{"file": "k.py", "line": 2}}}}]}}}}]}})",
                                    fmt::arg("n", n), fmt::arg("rows", n + 4));
  const Result full = run(k, false), ff = run(k, true);
  CHECK(ff.stats.at("fast_forward.skipped_instructions") == 0);
  CHECK(outcome(ff, engines::FfOutcome::kRecurrence) == 1);
  CHECK(ff.instructions == full.instructions);
  check_same_stats(full, ff);
}

TEST_CASE("fast-forward: nothing is skipped where every instruction is needed", "[fast_forward]") {
  const std::string k = softmax_kernel(8000, "0", "0", 1);  // one HBM row (numerics allocate HBM)
  SECTION("numerics on") {
    // A 64-instruction window makes 600 iterations enough to skip in a timing-only run; with numerics none is.
    const std::string short_k = softmax_kernel(600, "0", "0", 1);
    const std::vector<std::string> small{"compiler.window=64"};
    CHECK(run(short_k, true, false, 0, small).stats.at("fast_forward.skipped_instructions") > 0);
    const Result r = run(short_k, true, /*numerics=*/true, 0, small);
    CHECK(r.stats.at("fast_forward.skipped_instructions") == 0);
  }
  SECTION("an instruction listener (instruction tables, analysis)") {
    const Result r = run(k, true, false, /*listener=*/1);
    CHECK(r.stats.at("fast_forward.skipped_instructions") == 0);
  }
  SECTION("an event listener (the analyzer, beside the simulation)") {
    const Result r = run(k, true, false, /*listener=*/2);
    CHECK(r.stats.at("fast_forward.skipped_instructions") == 0);
  }
  SECTION("a loop too short to repeat over two windows") {
    // Followed (200 >= FastForward::kMinLoop iterations), but sampling needs 2 x 1024 / 7 = 293 repeating
    // iterations and as many left after them.
    const Result full = run(softmax_kernel(200), false), ff = run(softmax_kernel(200), true);
    CHECK(ff.stats.at("fast_forward.skipped_instructions") == 0);
    CHECK(ff.stats.at("total_time") == full.stats.at("total_time"));
    CHECK(outcome(ff, engines::FfOutcome::kTooFewLeft) == 1);
  }
  SECTION("a loop too short to follow") {
    const Result ff = run(softmax_kernel(40), true);  // under FastForward::kMinLoop = 64 iterations
    CHECK(outcome(ff, engines::FfOutcome::kShort) == 1);
    CHECK(outcome(ff, engines::FfOutcome::kSkipped) == 0);
  }
}

namespace {

/// A random loop kernel (seeded): `n` iterations of a load of x[b] (or of one row), 1 to 5 element-wise ops
/// on VectorE / ScalarE / GpSimd tiles of [128, f], sometimes an inner loop of 2, and a store of y[b]. No
/// iteration reads what another wrote, so fast-forward is exact.
std::string random_loop_kernel(uint32_t seed, int n) {
  uint32_t s = seed * 2654435761u + 1;
  auto rnd = [&s](uint32_t m) {
    s = s * 1664525u + 1013904223u;
    return (s >> 8) % m;
  };
  const int f = std::array<int, 3>{64, 256, 512}[rnd(3)];
  const bool fixed = rnd(2) == 0;
  const std::string dt = rnd(2) ? "bfloat16" : "float32";
  const std::string idx = fixed ? "0" : "b";
  std::string body = fmt::format(
      R"({{"alloc": {{"name": "t0", "buffer": "sbuf", "dtype": "{dt}", "shape": [128, {f}]}}}},
  {{"op": "dma_copy", "dst": "t0", "src": {{"tensor": "x", "index": ["{idx}", {{"start": 0, "size": 128}}, {{"start": 0, "size": {f}}}]}}, "loc": {{"file": "r.py", "line": 1}}}})",
      fmt::arg("dt", dt), fmt::arg("f", f), fmt::arg("idx", idx));
  const int ops = 1 + static_cast<int>(rnd(5));
  std::string prev = "t0";
  for (int i = 1; i <= ops; ++i) {
    const std::string t = fmt::format("t{}", i);
    body += fmt::format(R"(,
  {{"alloc": {{"name": "{t}", "buffer": "sbuf", "dtype": "float32", "shape": [128, {f}]}}}})",
                        fmt::arg("t", t), fmt::arg("f", f));
    std::string op;
    switch (rnd(4)) {
      case 0: op = fmt::format(R"({{"op": "activation", "dst": "{t}", "data": "{p}", "act": "exp")", fmt::arg("t", t), fmt::arg("p", prev)); break;
      case 1:
        op = fmt::format(R"({{"op": "tensor_scalar", "dst": "{t}", "data": "{p}", "alu0": "multiply", "flags": ["has_imm0"], "imm": [0.5, 0.0, 1.0, 0.0])",
                         fmt::arg("t", t), fmt::arg("p", prev));
        break;
      case 2: op = fmt::format(R"({{"op": "tensor_tensor", "dst": "{t}", "data1": "{p}", "data2": "t0", "alu0": "add")", fmt::arg("t", t), fmt::arg("p", prev)); break;
      default:
        op = fmt::format(R"({{"op": "tensor_copy", "dst": "{t}", "src": "{p}", "engine": "{e}")", fmt::arg("t", t), fmt::arg("p", prev),
                         fmt::arg("e", rnd(2) ? "gpsimd" : "vector"));
        break;
    }
    body += ",\n  " + op + fmt::format(R"(, "loc": {{"file": "r.py", "line": {}}}}})", 10 + i);
    prev = t;
  }
  if (rnd(3) == 0) {  // an inner loop of 2: one more op per inner iteration, into a slice of the last tile
    body += fmt::format(R"(,
  {{"loop": {{"var": "j", "start": 0, "stop": 2, "step": 1, "kind": "affine", "body": [
    {{"op": "tensor_scalar", "dst": {{"tensor": "{p}", "index": [{{"start": 0, "size": 128}}, {{"start": "{h}*j", "size": {h}}}]}}, "data": {{"tensor": "{p}", "index": [{{"start": 0, "size": 128}}, {{"start": "{h}*j", "size": {h}}}]}}, "alu0": "add", "flags": ["has_imm0"], "imm": [1.0, 0.0, 1.0, 0.0], "loc": {{"file": "r.py", "line": 30}}}}]}}}})",
                        fmt::arg("p", prev), fmt::arg("h", f / 2));
  }
  body += fmt::format(R"(,
  {{"alloc": {{"name": "yt", "buffer": "sbuf", "dtype": "{dt}", "shape": [128, {f}]}}}},
  {{"op": "tensor_copy", "dst": "yt", "src": "{p}", "loc": {{"file": "r.py", "line": 40}}}},
  {{"op": "dma_copy", "dst": {{"tensor": "y", "index": ["{idx}", {{"start": 0, "size": 128}}, {{"start": 0, "size": {f}}}]}}, "src": "yt", "loc": {{"file": "r.py", "line": 41}}}})",
                      fmt::arg("dt", dt), fmt::arg("p", prev), fmt::arg("f", f), fmt::arg("idx", idx));
  return fmt::format(R"({{"nsim_kernel": 1, "name": "random_loop", "tensors": [
 {{"name": "x", "buffer": "hbm", "kind": "input", "dtype": "{dt}", "shape": [{n}, 128, {f}]}},
 {{"name": "y", "buffer": "hbm", "kind": "output", "dtype": "{dt}", "shape": [{n}, 128, {f}]}}],
 "body": [{{"loop": {{"var": "b", "start": 0, "stop": {n}, "step": 1, "kind": "{kind}", "body": [
  {body}]}}}}]}})",
                     fmt::arg("dt", dt), fmt::arg("n", n), fmt::arg("f", f), fmt::arg("body", body),
                     fmt::arg("kind", fixed || rnd(2) ? "sequential" : "affine"));  // one row: E410 in an affine loop
}

}  // namespace

TEST_CASE("fast-forward: random loop kernels without cross-iteration dependencies give the full run's stats",
          "[fast_forward]") {
  int skipped_some = 0;
  for (uint32_t seed = 1; seed <= 12; ++seed) {
    const std::string k = random_loop_kernel(seed, 6000);
    // the list scheduler's window sets how long the repetition must last: 1024 (trn2), 64 and 4096
    // and the rotating buffers: with 4 (trn2) a loop that reaches its DMA bandwidth may not repeat exactly within
    // kMaxPeriod iterations (the 16 DMA engines' packets drift): then it is simulated in full, as checked below
    const std::vector<std::string> window{fmt::format("compiler.window={}", std::array<int, 3>{1024, 64, 4096}[seed % 3]),
                                          fmt::format("compiler.loop_buffers={}", seed % 2 ? 4 : 2)};
    INFO("seed " << seed << " " << window[0] << "\n" << k);
    const Result full = run(k, false, false, 0, window), ff = run(k, true, false, 0, window);
    CHECK(ff.instructions == full.instructions);
    if (ff.stats.at("fast_forward.skipped_instructions") > 0) ++skipped_some;
    check_same_stats(full, ff);
  }
  CHECK(skipped_some >= 6);  // most of them repeat (iterations of 4 to 10 instructions; a 4096 window needs more)
}

TEST_CASE("fast-forward: a matmul loop under TensorE's power throttle gives the full run's stats", "[fast_forward]") {
  // Each iteration: load a [128, 128] bf16 tile, two accumulating matmuls into one PSUM bank, evict, store.
  // The throttle's state (ramp, trailing-window busy time) is part of the timing digest, and its throttled
  // time is counted for the repeats (it is TensorE's counter, not RunStats').
  const int n = 12000;
  const std::string k = fmt::format(R"({{"nsim_kernel": 1, "name": "mm_loop", "tensors": [
 {{"name": "x", "buffer": "hbm", "kind": "input", "dtype": "bfloat16", "shape": [{n}, 128, 128]}},
 {{"name": "w", "buffer": "hbm", "kind": "input", "dtype": "bfloat16", "shape": [128, 512]}},
 {{"name": "y", "buffer": "hbm", "kind": "output", "dtype": "float32", "shape": [{n}, 128, 512]}}],
 "body": [{{"alloc": {{"name": "wt", "buffer": "sbuf", "dtype": "bfloat16", "shape": [128, 512]}}}},
  {{"op": "dma_copy", "dst": "wt", "src": "w"}},
  {{"loop": {{"var": "b", "start": 0, "stop": {n}, "step": 1, "kind": "affine", "body": [
   {{"alloc": {{"name": "a", "buffer": "sbuf", "dtype": "bfloat16", "shape": [128, 128]}}}},
   {{"op": "dma_copy", "dst": "a", "src": {{"tensor": "x", "index": ["b", {{"start": 0, "size": 128}}, {{"start": 0, "size": 128}}]}}}},
   {{"alloc": {{"name": "p", "buffer": "psum", "dtype": "float32", "shape": [128, 512]}}}},
   {{"loop": {{"var": "k", "start": 0, "stop": 2, "step": 1, "kind": "affine", "body": [
     {{"op": "nc_matmul", "dst": "p", "stationary": "a", "moving": "wt", "flags": ["accumulate"]}}]}}}},
   {{"alloc": {{"name": "o", "buffer": "sbuf", "dtype": "float32", "shape": [128, 512]}}}},
   {{"op": "tensor_copy", "dst": "o", "src": "p"}},
   {{"op": "dma_copy", "dst": {{"tensor": "y", "index": ["b", {{"start": 0, "size": 128}}, {{"start": 0, "size": 512}}]}}, "src": "o"}}]}}}}]}})",
                                    fmt::arg("n", n));
  // Two rotating buffers: the loop is then latency-bound and repeats exactly (with trn2's 4 it reaches the DMA
  // bandwidth, whose packet schedule does not repeat within FastForward::kMaxPeriod iterations: simulated in full).
  const std::vector<std::string> two{"compiler.loop_buffers=2"};
  const Result full = run(k, false, false, 0, two), ff = run(k, true, false, 0, two);
  CHECK(full.stats.at("tensor.throttled_time") > 0);  // the throttle is at work
  CHECK(ff.stats.at("fast_forward.skipped_instructions") > 50000);  // of 84,001
  check_same_stats(full, ff);
}

TEST_CASE("fast-forward: a loop switching ScalarE's activation tables counts the repeats' table loads",
          "[fast_forward]") {
  // Each iteration: tanh then exp, functions of two table sets (scalar.act_table_sets): ScalarE loads a table
  // when the function's set is not the one it holds (the list scheduler runs pairs of iterations' tanh, then
  // their exp: 3,000 loads in the full run). The skipped iterations' loads are counted as repeats
  // (a sample that left the load counters out once counted none: engine.scalar.act_table_load_count 2,174
  // against 15,998 in the full run of a random kernel of benchmarks/check_fast_forward.py).
  const int n = 6000;
  const std::string k = fmt::format(R"({{"nsim_kernel": 1, "name": "act_loop", "tensors": [
 {{"name": "x", "buffer": "hbm", "kind": "input", "dtype": "float32", "shape": [{n}, 128, 128]}},
 {{"name": "y", "buffer": "hbm", "kind": "output", "dtype": "float32", "shape": [{n}, 128, 128]}}],
 "body": [{{"loop": {{"var": "b", "start": 0, "stop": {n}, "step": 1, "kind": "affine", "body": [
   {{"alloc": {{"name": "a", "buffer": "sbuf", "dtype": "float32", "shape": [128, 128]}}}},
   {{"op": "dma_copy", "dst": "a", "src": {{"tensor": "x", "index": ["b", {{"start": 0, "size": 128}}, {{"start": 0, "size": 128}}]}}}},
   {{"alloc": {{"name": "t", "buffer": "sbuf", "dtype": "float32", "shape": [128, 128]}}}},
   {{"op": "activation", "dst": "t", "data": "a", "act": "tanh"}},
   {{"alloc": {{"name": "e", "buffer": "sbuf", "dtype": "float32", "shape": [128, 128]}}}},
   {{"op": "activation", "dst": "e", "data": "t", "act": "exp"}},
   {{"op": "dma_copy", "dst": {{"tensor": "y", "index": ["b", {{"start": 0, "size": 128}}, {{"start": 0, "size": 128}}]}}, "src": "e"}}]}}}}]}})",
                                    fmt::arg("n", n));
  const Result full = run(k, false), ff = run(k, true);
  CHECK(full.stats.at("engine.scalar.act_table_load_count") == n / 2);
  CHECK(ff.stats.at("fast_forward.skipped_instructions") > 10000);  // of 30,000
  check_same_stats(full, ff);
}

TEST_CASE("fast-forward: a skip spans whole refreshes of the scheduler's heights in admissions, not instructions",
          "[fast_forward]") {
  // A random kernel of benchmarks/check_fast_forward.py (--kind rich, seed 1195): 14 instructions per iteration in
  // 13 window entries (the nc_matmul's load_stationary + multiply_moving are one). With compiler.window=64 the
  // critical-path heights are refreshed every 32 admissions and ties between equal starts go by them. A skip of
  // whole refreshes counted in instructions (14 x 16 iterations = 224 = 7 x 32) is 208 admissions, half a refresh
  // off: after it two instructions starting together issued the other way round, and the run came out 203 ns
  // of 12.3 ms long. Counted in admissions the skip keeps the refresh's phase.
  const std::string k = R"({"nsim_kernel": 1, "name": "mm_loop", "tensors": [
 {"name": "x", "buffer": "hbm", "kind": "input", "dtype": "bfloat16", "shape": [12000, 128, 512]},
 {"name": "y", "buffer": "hbm", "kind": "output", "dtype": "bfloat16", "shape": [12000, 128, 512]},
 {"name": "w", "buffer": "hbm", "kind": "input", "dtype": "bfloat16", "shape": [128, 128]}],
 "body": [
  {"alloc": {"name": "wt", "buffer": "sbuf", "dtype": "bfloat16", "shape": [128, 128]}},
  {"op": "dma_copy", "dst": "wt", "src": "w"},
  {"alloc": {"name": "acc", "buffer": "sbuf", "dtype": "float32", "shape": [128, 512]}},
  {"op": "memset", "engine": "gpsimd", "dst": "acc", "imm": [0.0]},
  {"loop": {"var": "b", "start": 0, "stop": 6000, "step": 1, "kind": "sequential", "body": [
   {"alloc": {"name": "t1", "buffer": "sbuf", "dtype": "bfloat16", "shape": [128, 512]}},
   {"op": "dma_copy", "dst": "t1", "src": {"tensor": "x", "index": ["2 * b", {"start": 0, "size": 128}, {"start": 0, "size": 512}]}, "engine": "sync"},
   {"alloc": {"name": "t2", "buffer": "psum", "dtype": "float32", "shape": [128, 128]}},
   {"op": "nc_transpose", "dst": "t2", "data": {"tensor": "t1", "index": [{"start": 0, "size": 128}, {"start": 0, "size": 128}]}, "engine": "tensor"},
   {"alloc": {"name": "t3", "buffer": "sbuf", "dtype": "float32", "shape": [128, 128]}},
   {"op": "tensor_copy", "dst": "t3", "src": "t2"},
   {"alloc": {"name": "t4", "buffer": "sbuf", "dtype": "float32", "shape": [128, 512]}},
   {"op": "tensor_tensor", "dst": "t4", "data1": "t1", "data2": "t1", "alu0": "add"},
   {"alloc": {"name": "t5", "buffer": "sbuf", "dtype": "float32", "shape": [128, 512], "bufs": 1}},
   {"op": "tensor_scalar", "dst": "t5", "data": "t4", "alu0": "multiply", "flags": ["has_imm0"], "imm": [0.5, 0, 1, 0], "engine": "gpsimd"},
   {"alloc": {"name": "t6", "buffer": "sbuf", "dtype": "float32", "shape": [128, 1]}},
   {"alloc": {"name": "t7", "buffer": "sbuf", "dtype": "float32", "shape": [128, 512]}},
   {"op": "tensor_reduce", "dst": "t6", "data": "t5", "alu0": "maximum"},
   {"op": "tensor_scalar", "dst": "t7", "data": "t5", "operand0": "t6", "alu0": "subtract"},
   {"alloc": {"name": "t8", "buffer": "sbuf", "dtype": "bfloat16", "shape": [128, 512]}},
   {"op": "tensor_copy", "dst": "t8", "src": "t7"},
   {"alloc": {"name": "t9", "buffer": "psum", "dtype": "float32", "shape": [128, 512], "bufs": 2}},
   {"op": "nc_matmul", "dst": "t9", "stationary": "wt", "moving": "t8"},
   {"alloc": {"name": "t10", "buffer": "sbuf", "dtype": "float32", "shape": [128, 512]}},
   {"op": "tensor_copy", "dst": "t10", "src": "t9", "engine": "vector"},
   {"op": "tensor_scalar", "dst": {"tensor": "t10", "index": [{"start": 0, "size": 128}, {"start": 256, "size": 256}]}, "data": {"tensor": "t10", "index": [{"start": 0, "size": 128}, {"start": 0, "size": 256}]}, "alu0": "add", "flags": ["has_imm0"], "imm": [1.0, 0, 1, 0]},
   {"alloc": {"name": "t11", "buffer": "sbuf", "dtype": "bfloat16", "shape": [128, 512]}},
   {"op": "tensor_copy", "dst": "t11", "src": {"tensor": "t10", "index": [{"start": 0, "size": 128}, {"start": 0, "size": 512}]}},
   {"op": "dma_copy", "dst": {"tensor": "y", "index": ["b", {"start": 0, "size": 128}, {"start": 0, "size": 512}]}, "src": "t11", "engine": "gpsimd"}
  ]}}]})";
  const std::vector<std::string> window{"compiler.window=64"};
  const Result full = run(k, false, false, 0, window, "trn3"), ff = run(k, true, false, 0, window, "trn3");
  CHECK(ff.stats.at("fast_forward.skipped_instructions") > 60000);  // of 84,003
  check_same_stats(full, ff);
}

TEST_CASE("fast-forward: the reader lists of a tile the loop only reads keep their phase over a skip",
          "[fast_forward]") {
  // A random kernel of benchmarks/check_fast_forward.py (--kind wide, seed 30739), reduced: wt is loaded once and
  // read by five matmuls per iteration (four on PE tiles), never written in the loop. The list scheduler keeps a
  // list of up to kReaders = 6 readers per chunk; when it is full the issued ones are pruned and, if all six still
  // wait, the next read is ordered after them. Which readers wait depends on the schedule, so the lists' state
  // has a period of its own: the skip kept the count of reads a multiple of 6 but not that state, and a tiled
  // matmul after the loop, scheduled among the loop's last iterations (compiler.window=64), found other ordering
  // edges than in the full run: TensorE's busy and throttled times 34 ns off, its active time 219 ns (the total
  // time the same). The lists' states (readers by age while they wait, or issued) are now part of each step's
  // digest (Scheduler ff_schedule_digest), so the skip keeps them as the full run has them.
  const std::string k = R"({"nsim_kernel": 1, "name": "rich_loop", "tensors": [{"name": "x", "buffer": "hbm", "kind": "input", "dtype": "float32", "shape": [7000, 128, 64]}, {"name": "y", "buffer": "hbm", "kind": "output", "dtype": "float32", "shape": [3500, 128, 64]}, {"name": "w", "buffer": "hbm", "kind": "input", "dtype": "bfloat16", "shape": [128, 128]}], "body": [
  {"alloc": {"name": "wt", "buffer": "sbuf", "dtype": "bfloat16", "shape": [128, 128]}},
  {"op": "dma_copy", "dst": "wt", "src": "w"},
  {"loop": {"var": "b", "start": 0, "stop": 3500, "step": 1, "kind": "sequential", "body": [
   {"alloc": {"name": "t1", "buffer": "sbuf", "dtype": "float32", "shape": [128, 64]}},
   {"op": "dma_copy", "dst": "t1", "src": {"tensor": "x", "index": ["2 * b", {"start": 0, "size": 128}, {"start": 0, "size": 64}]}, "loc": {"file": "r.py", "line": 103}, "engine": "sync"},
   {"alloc": {"name": "t2", "buffer": "sbuf", "dtype": "bfloat16", "shape": [128, 64]}},
   {"op": "tensor_copy", "dst": "t2", "src": "t1", "loc": {"file": "r.py", "line": 104}},
   {"alloc": {"name": "t3", "buffer": "psum", "dtype": "float32", "shape": [128, 64]}},
   {"op": "nc_matmul", "dst": "t3", "stationary": "wt", "moving": "t2", "loc": {"file": "r.py", "line": 105}},
   {"alloc": {"name": "t4", "buffer": "sbuf", "dtype": "float32", "shape": [128, 64], "bufs": 4}},
   {"op": "tensor_copy", "dst": "t4", "src": "t3", "engine": "vector", "loc": {"file": "r.py", "line": 106}},
   {"alloc": {"name": "t5", "buffer": "sbuf", "dtype": "bfloat16", "shape": [128, 64]}},
   {"op": "tensor_copy", "dst": "t5", "src": "t4", "loc": {"file": "r.py", "line": 107}},
   {"alloc": {"name": "t6", "buffer": "psum", "dtype": "float32", "shape": [32, 64]}},
   {"op": "nc_matmul", "dst": "t6", "stationary": {"tensor": "wt", "index": [{"start": 0, "size": 32}, {"start": 0, "size": 32}]}, "moving": {"tensor": "t5", "index": [{"start": 0, "size": 32}, {"start": 0, "size": 64}]}, "iimm": [0, 0, 32, 32], "loc": {"file": "r.py", "line": 108}},
   {"op": "nc_matmul", "dst": "t6", "stationary": {"tensor": "wt", "index": [{"start": 32, "size": 32}, {"start": 0, "size": 32}]}, "moving": {"tensor": "t5", "index": [{"start": 32, "size": 32}, {"start": 0, "size": 64}]}, "iimm": [32, 0, 32, 32], "loc": {"file": "r.py", "line": 109}},
   {"op": "nc_matmul", "dst": "t6", "stationary": {"tensor": "wt", "index": [{"start": 64, "size": 32}, {"start": 0, "size": 32}]}, "moving": {"tensor": "t5", "index": [{"start": 64, "size": 32}, {"start": 0, "size": 64}]}, "iimm": [64, 0, 32, 32], "loc": {"file": "r.py", "line": 110}},
   {"op": "nc_matmul", "dst": "t6", "stationary": {"tensor": "wt", "index": [{"start": 96, "size": 32}, {"start": 0, "size": 32}]}, "moving": {"tensor": "t5", "index": [{"start": 96, "size": 32}, {"start": 0, "size": 64}]}, "iimm": [96, 0, 32, 32], "loc": {"file": "r.py", "line": 111}},
   {"alloc": {"name": "t7", "buffer": "sbuf", "dtype": "float32", "shape": [32, 64], "bufs": 3}},
   {"op": "tensor_copy", "dst": "t7", "src": "t6", "loc": {"file": "r.py", "line": 112}},
   {"alloc": {"name": "t8", "buffer": "sbuf", "dtype": "float32", "shape": [128, 64]}},
   {"op": "tensor_copy", "dst": "t8", "src": {"tensor": "t4", "index": [{"start": 0, "size": 128}, {"start": 0, "size": 64}]}, "loc": {"file": "r.py", "line": 113}},
   {"op": "dma_copy", "dst": {"tensor": "y", "index": ["b", {"start": 0, "size": 128}, {"start": 0, "size": 64}]}, "src": "t8", "loc": {"file": "r.py", "line": 114}, "engine": "sync", "dma_queue": 9}
  ]}},
  {"loop": {"var": "b", "start": 3500, "stop": 3510, "step": 1, "kind": "sequential", "body": [
   {"alloc": {"name": "u5", "buffer": "sbuf", "dtype": "bfloat16", "shape": [128, 64]}},
   {"op": "memset", "engine": "vector", "dst": "u5", "imm": [1.0]},
   {"alloc": {"name": "u6", "buffer": "psum", "dtype": "float32", "shape": [32, 64]}},
   {"op": "nc_matmul", "dst": "u6", "stationary": {"tensor": "wt", "index": [{"start": 96, "size": 32}, {"start": 0, "size": 32}]}, "moving": {"tensor": "u5", "index": [{"start": 96, "size": 32}, {"start": 0, "size": 64}]}, "iimm": [96, 0, 32, 32], "loc": {"file": "r.py", "line": 120}}
  ]}}]})";
  const std::vector<std::string> o{"compiler.window=64", "compiler.loop_buffers=3"};
  const Result full = run(k, false, false, 0, o, "trn3"), ff = run(k, true, false, 0, o, "trn3");
  CHECK(ff.stats.at("fast_forward.skipped_instructions") > 40000);  // of 59,531
  check_same_stats(full, ff);
  REQUIRE(ff.lines.size() == full.lines.size());
  for (size_t i = 0; i < full.lines.size(); ++i) CHECK(ff.lines[i].instr_time == full.lines[i].instr_time);
}

TEST_CASE("fast-forward: a loop whose iterations share the scheduler's HBM chunks moves their states over a skip",
          "[fast_forward]") {
  // A random kernel of check_fast_forward.py (a variant of --kind wide, reduced): rows of [64, 64] bf16 (8 KiB),
  // 8 to a list-scheduler HBM chunk (64 KiB), so the store to y[b + 2] shares a chunk with the stores of the
  // iterations before it, whose writers order later accesses. A skip that left the chunk states where they were
  // had the first iterations after it find their chunk empty where the full run finds the iterations before them:
  // the critical-path heights came out 1.13 us shorter, two GpSimd instructions starting together issued the
  // other way round, and the per-line times differed (the total time the same). Such loops were then simulated
  // whole; now the skip (a multiple of 8 iterations: whole chunks) moves the states of the chunks the last
  // 64 KiB / 8 KiB + 1 = 9 iterations touched by the skip's bytes (Lowering::ff_hbm_moves).
  const std::string k = R"({"nsim_kernel": 1, "name": "rows_loop", "tensors": [
 {"name": "x", "buffer": "hbm", "kind": "input", "dtype": "bfloat16", "shape": [3004, 64, 64]},
 {"name": "y", "buffer": "hbm", "kind": "output", "dtype": "bfloat16", "shape": [3004, 64, 64]}],
 "body": [{"loop": {"var": "b", "start": 0, "stop": 3000, "step": 1, "kind": "affine", "body": [
  {"alloc": {"name": "t1", "buffer": "sbuf", "dtype": "bfloat16", "shape": [64, 64]}},
  {"op": "dma_copy", "dst": "t1", "src": {"tensor": "x", "index": ["b + 3", {"start": 0, "size": 64}, {"start": 0, "size": 64}]}, "engine": "sync", "loc": {"file": "r.py", "line": 1}},
  {"alloc": {"name": "t2", "buffer": "sbuf", "dtype": "float32", "shape": [64, 1]}},
  {"alloc": {"name": "t3", "buffer": "sbuf", "dtype": "float32", "shape": [64, 64]}},
  {"op": "tensor_reduce", "dst": "t2", "data": "t1", "alu0": "add", "loc": {"file": "r.py", "line": 2}},
  {"op": "activation", "dst": "t3", "data": "t1", "act": "exp", "bias": "t2", "loc": {"file": "r.py", "line": 3}},
  {"alloc": {"name": "t4", "buffer": "sbuf", "dtype": "float32", "shape": [64, 64]}},
  {"op": "affine_select", "dst": "t4", "on_true": "t3", "alu0": "greater_equal", "imm": [-9984], "iimm": [0, 1, 0, 1, 0, 1, 0, 1, -1, 64], "loc": {"file": "r.py", "line": 4}},
  {"alloc": {"name": "t5", "buffer": "sbuf", "dtype": "bfloat16", "shape": [64, 64]}},
  {"op": "tensor_copy", "dst": "t5", "src": "t4", "engine": "gpsimd", "loc": {"file": "r.py", "line": 5}},
  {"op": "dma_copy", "dst": {"tensor": "y", "index": ["b + 2", {"start": 0, "size": 64}, {"start": 0, "size": 64}]}, "src": "t5", "loc": {"file": "r.py", "line": 6}}]}}]})";
  const Result full = run(k, false), ff = run(k, true);
  CHECK(ff.stats.at("fast_forward.skipped_instructions") > 0);
  check_same_stats(full, ff);
  REQUIRE(ff.lines.size() == full.lines.size());
  for (size_t i = 0; i < full.lines.size(); ++i) CHECK(ff.lines[i].instr_time == full.lines[i].instr_time);
  // With a 1 KiB tensor first, x and y start 1 KiB off the 4 KiB chunks of the simulator's HBM dependency tracking
  // (HBM tensors are 64 B aligned), so consecutive rows share one of those too: the full run orders them there,
  // a skip moves no tracker state, and the loop is simulated whole (the outcome says why).
  std::string padded = k;
  padded.replace(padded.find("{\"name\": \"x\""), 0,
                 R"({"name": "pad", "buffer": "hbm", "kind": "input", "dtype": "float32", "shape": [256]},
 )");
  const Result full_p = run(padded, false), ff_p = run(padded, true);
  CHECK(ff_p.stats.at("fast_forward.skipped_instructions") == 0);
  CHECK(outcome(ff_p, engines::FfOutcome::kRowsShared) == 1);
  check_same_stats(full_p, ff_p);
}

TEST_CASE("fast-forward: a loop whose steps repeat only across the scheduler's refreshes is skipped",
          "[fast_forward]") {
  // The NKI tutorial's RMSNorm (Beta 1) as nsim's tracer writes it: 12 instructions per iteration in 11 window
  // entries, DMA-bound. Between two refreshes of the list scheduler's critical-path heights (every 512
  // admissions, ~46.5 iterations) its steps repeat every 4 iterations; each refresh reorders ties and the pattern
  // settles again some iterations later, so no period of 1 to 8 iterations holds for `need` (171) iterations and
  // before the long periods nothing was skipped. Across refreshes the steps repeat every lcm(6 (reader lists),
  // 512 / gcd(512, 11), 8 / gcd(8, 12)) = 1,536 iterations (measured: from iteration ~1,780 on); that period is
  // looked for too: it shows itself (two equal periods) by iteration ~4,850, sample b is one period later, and of
  // the ~1,600 iterations left one period is skipped (1,536 x 12 = 18,432 instructions), the rest simulated.
  const std::string k = R"({"nsim_kernel": 1, "name": "rmsnorm_kernel", "tensors": [
 {"name": "a_tensor", "buffer": "hbm", "kind": "input", "dtype": "bfloat16", "shape": [1024000, 512]},
 {"name": "g_tensor", "buffer": "hbm", "kind": "input", "dtype": "bfloat16", "shape": [512]},
 {"name": "out_tensor", "buffer": "hbm", "kind": "output", "dtype": "bfloat16", "shape": [1024000, 512]}],
 "body": [
  {"alloc": {"name": "g_tile", "buffer": "sbuf", "dtype": "bfloat16", "shape": [1, 512]}},
  {"op": "dma_copy", "dst": "g_tile", "src": "g_tensor", "loc": {"file": "rms.py", "line": 6}},
  {"loop": {"var": "i", "start": 0, "stop": 8000, "step": 1, "kind": "affine", "body": [
   {"alloc": {"name": "a_tile", "buffer": "sbuf", "dtype": "bfloat16", "shape": [128, 512]}},
   {"op": "dma_copy", "dst": "a_tile", "src": {"tensor": "a_tensor", "index": [{"start": "128*i", "size": 128}, {"start": 0, "size": 512}]}, "loc": {"file": "rms.py", "line": 8}},
   {"alloc": {"name": "sq", "buffer": "sbuf", "dtype": "bfloat16", "shape": [128, 512]}},
   {"op": "activation", "dst": "sq", "data": "a_tile", "act": "square", "loc": {"file": "rms.py", "line": 9}},
   {"alloc": {"name": "sq_sum", "buffer": "sbuf", "dtype": "bfloat16", "shape": [128, 1]}},
   {"op": "tensor_reduce", "dst": "sq_sum", "data": "sq", "alu0": "add", "loc": {"file": "rms.py", "line": 9}},
   {"alloc": {"name": "mean", "buffer": "sbuf", "dtype": "bfloat16", "shape": [128, 1]}},
   {"op": "tensor_scalar", "dst": "mean", "data": "sq_sum", "alu0": "divide", "flags": ["has_imm0"], "imm": [512.0, 0.0, 1.0, 0.0], "loc": {"file": "rms.py", "line": 10}},
   {"alloc": {"name": "rms_rec", "buffer": "sbuf", "dtype": "bfloat16", "shape": [128, 1]}},
   {"op": "activation", "dst": "rms_rec", "data": "mean", "act": "rsqrt", "loc": {"file": "rms.py", "line": 10}},
   {"alloc": {"name": "out_tile", "buffer": "sbuf", "dtype": "bfloat16", "shape": [128, 512]}},
   {"op": "tensor_scalar", "dst": "out_tile", "data": "a_tile", "operand0": "rms_rec", "alu0": "multiply", "loc": {"file": "rms.py", "line": 11}},
   {"alloc": {"name": "ones", "buffer": "sbuf", "dtype": "bfloat16", "shape": [1, 128]}},
   {"op": "memset", "dst": "ones", "imm": [1.0], "loc": {"file": "rms.py", "line": 12}},
   {"alloc": {"name": "g_bc", "buffer": "sbuf", "dtype": "bfloat16", "shape": [128, 512]}},
   {"alloc": {"name": "g_ps", "buffer": "psum", "dtype": "float32", "shape": [128, 512]}},
   {"op": "nc_matmul", "dst": "g_ps", "stationary": "ones", "moving": "g_tile", "loc": {"file": "rms.py", "line": 12}},
   {"op": "tensor_copy", "dst": "g_bc", "src": "g_ps", "loc": {"file": "rms.py", "line": 12}},
   {"op": "tensor_tensor", "dst": "out_tile", "data1": "out_tile", "data2": "g_bc", "alu0": "multiply", "loc": {"file": "rms.py", "line": 12}},
   {"op": "dma_copy", "dst": {"tensor": "out_tensor", "index": [{"start": "128*i", "size": 128}, {"start": 0, "size": 512}]}, "src": "out_tile", "loc": {"file": "rms.py", "line": 13}}
  ]}}]})";
  const Result full = run(k, false), ff = run(k, true);
  CHECK(full.instructions == 96001);  // 12 x 8,000 and the load of g
  CHECK(ff.stats.at("fast_forward.skipped_instructions") == 1536 * 12);
  check_same_stats(full, ff);
  REQUIRE(ff.lines.size() == full.lines.size());
  for (size_t i = 0; i < full.lines.size(); ++i) {
    CHECK(ff.lines[i].instructions == full.lines[i].instructions);
    CHECK(ff.lines[i].instr_time == full.lines[i].instr_time);
  }
}

TEST_CASE("fast-forward: a huge loop is counted while its counters fit, simulated beyond", "[fast_forward]") {
  // One [128, f] fp32 tensor_scalar per iteration on a tile allocated before the loop.
  auto kernel = [](int64_t n, int f = 64) {
    return fmt::format(R"({{"nsim_kernel": 1, "name": "huge", "tensors": [
 {{"name": "y", "buffer": "hbm", "kind": "output", "dtype": "float32", "shape": [128, {f}]}}],
 "body": [{{"alloc": {{"name": "t", "buffer": "sbuf", "dtype": "float32", "shape": [128, {f}]}}}},
  {{"op": "memset", "dst": "t", "imm": [0.0, 0.0, 0.0, 0.0]}},
  {{"loop": {{"var": "i", "start": 0, "stop": {n}, "step": 1, "kind": "sequential", "body": [
   {{"op": "tensor_scalar", "dst": "t", "data": "t", "alu0": "add", "flags": ["has_imm0"], "imm": [1.0, 0.0, 1.0, 0.0]}}]}}}},
  {{"op": "dma_copy", "dst": "y", "src": "t"}}]}})",
                       fmt::arg("n", n), fmt::arg("f", f));
  };
  SECTION("2^30 iterations: counted, in well under a second") {
    const Result r = run(kernel(int64_t{1} << 30), true);
    CHECK(r.instructions == (uint64_t{1} << 30) + 2);
    CHECK(r.stats.at("fast_forward.skipped_instructions") > 1e9);
    // every iteration adds the same time, so the total is about 2^30 times one iteration's
    const Result small = run(kernel(4096), false);
    const double per_iter = small.stats.at("engine.vector.busy_time") / 4096;
    CHECK(r.stats.at("engine.vector.busy_time") == Approx(per_iter * (1 << 30)).epsilon(1e-3));
  }
  SECTION("2^40 iterations of [128, 4096]: ~2^62 ps in all, so the loop is simulated (and stopped by a limit)") {
    const Kernel k = parse_kernel_json(kernel(int64_t{1} << 40, 4096));
    SimOptions o;
    o.numerics = false;
    o.fast_forward = true;
    o.max_instructions = 200000;
    auto sim = Simulator::from_preset("trn2", {}, o);
    verify_kernel(k, sim->params());
    Lowering low(k, *sim);
    CHECK_THROWS_WITH(low.run(), Catch::Contains("E416") || Catch::Contains("instruction limit"));
    CHECK(sim->skipped_instructions() == 0);
  }
}
