// LNC=2 launches (frontend/multicore.h, docs/lnc.md): the multi-core kernel.json form, two cores sharing
// one HBM (storage and stack bandwidth), the deterministic interleaving and the rendezvous errors.
#include <catch2/catch.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <string>

#include "engines/params.h"
#include "frontend/ir.h"
#include "frontend/lower.h"
#include "frontend/multicore.h"

using namespace nsim;
using namespace nsim::frontend;

namespace {

// One core's program: copy rows [r0, r0 + 128 * n) of x [rows, cols] fp32 to y through SBUF, 128 rows at a
// time; `extra`: statements appended at the end.
std::string copy_program(int r0, int n, int rows, int cols, const std::string& extra = "") {
  return fmt::format(
      R"J({{"tensors": [
    {{"name": "x", "buffer": "hbm", "kind": "input", "dtype": "float32", "shape": [{rows}, {cols}]}},
    {{"name": "y", "buffer": "hbm", "kind": "output", "dtype": "float32", "shape": [{rows}, {cols}]}}],
  "body": [
    {{"loop": {{"var": "i", "stop": {n}, "body": [
      {{"alloc": {{"name": "t", "buffer": "sbuf", "dtype": "float32", "shape": [128, {cols}]}}}},
      {{"op": "dma_copy", "dst": "t", "src": {{"tensor": "x", "index": [{{"start": "128*i + {r0}", "size": 128}}]}},
       "loc": {{"file": "k.py", "line": 10, "function": "k"}}}},
      {{"op": "dma_copy", "dst": {{"tensor": "y", "index": [{{"start": "128*i + {r0}", "size": 128}}]}}, "src": "t",
       "loc": {{"file": "k.py", "line": 11, "function": "k"}}}}]}}}}{extra}]}})J",
      fmt::arg("rows", rows), fmt::arg("cols", cols), fmt::arg("n", n), fmt::arg("r0", r0), fmt::arg("extra", extra));
}

std::string launch(const std::string& p0, const std::string& p1, int cores = 2) {
  return fmt::format(R"J({{"nsim_kernel": 1, "name": "copy", "cores": {}, "core_programs": [{}, {}]}})J", cores, p0, p1);
}

std::string single(const std::string& p) {
  return std::string(R"J({"nsim_kernel": 1, "name": "copy", )J") + p.substr(1);
}

double run_ns(const Kernel& k, const std::string& preset, const std::vector<std::string>& ov = {}) {
  SimOptions o;
  o.numerics = false;
  MultiCoreRun mc(k, engines::load_config(preset, ov), o);
  mc.run();
  return sim::ps_to_ns(mc.total_time());
}

const std::string kBarrier =
    R"J(, {"op": "core_barrier", "engine": "sync", "dst": "y", "loc": {"file": "k.py", "line": 20, "function": "k"}})J";

}  // namespace

TEST_CASE("multi-core kernel.json parses to one program per core and the union of HBM tensors", "[lnc]") {
  const Kernel k = parse_kernel_json(launch(copy_program(0, 1, 256, 64), copy_program(128, 1, 256, 64)));
  REQUIRE(k.core_programs.size() == 2);
  REQUIRE(k.tensors.size() == 2);  // x, y: shared by name
  CHECK(k.tensors[1].kind == TensorKind::kOutput);
  CHECK(k.body.empty());
  SECTION("cores must match the programs") {
    try {
      parse_kernel_json(launch(copy_program(0, 1, 256, 64), copy_program(128, 1, 256, 64), 1));
      FAIL("no error");
    } catch (const Error& e) {
      CHECK(e.code() == ErrorCode::kMultiCoreLaunch);
    }
  }
  SECTION("shared tensors must agree") {
    try {
      parse_kernel_json(launch(copy_program(0, 1, 256, 64), copy_program(0, 1, 256, 32)));
      FAIL("no error");
    } catch (const Error& e) {
      CHECK(e.code() == ErrorCode::kMultiCoreLaunch);
      CHECK(std::string(e.what()).find("'x'") != std::string::npos);
    }
  }
  SECTION("one-core tools refuse it") {
    const engines::CoreParams p = engines::CoreParams::from_config(engines::load_config("trn2"));
    CHECK_THROWS_AS(verify_kernel(k, p), Error);
  }
}

TEST_CASE("two cores halve a DMA-bound copy until the shared HBM stack caps it", "[lnc]") {
  // Each core copies R/2 rows of [R, C] fp32 through SBUF, 128 rows per transfer. A [128, C] transfer is split
  // over the core's dma.engines (16) engines, one piece of 8 partitions x C x 4 B each; an engine moves its
  // pieces one after another, each taking piece / bw_e + dma.transfer_gap, after one dma.setup. So a core's
  // time is  setup + pieces_per_engine * (piece / bw_e + gap)  with
  //   bw_e = min(dma.engine_bw, hbm.bw / 16, hbm.stack_bw / (engines of both cores moving HBM data)).
  // trn2: one core alone: bw_e = min(23, 362.5 / 16) = 22.66 B/ns, 2 * R/128 pieces per engine.
  //       two cores: bw_e = min(23, 362.5 / 16, 725 / 32) = 22.66, R/128 pieces each: half the time.
  //       hbm.stack_bw = 400 GB/s: bw_e = 400 / 32 = 12.5 B/ns: the stack caps the speedup at 400 / 362.5.
  const int rows = 4096, cols = 1024, blocks = rows / 128;
  const Kernel one = parse_kernel_json(single(copy_program(0, blocks, rows, cols)));
  const Kernel two = parse_kernel_json(launch(copy_program(0, blocks / 2, rows, cols),
                                              copy_program(rows / 2, blocks / 2, rows, cols)));
  const engines::CoreParams p = engines::CoreParams::from_config(engines::load_config("trn2"));
  const double piece = 128.0 / p.dma_engines * cols * 4;
  auto expect = [&](double pieces, double bw_e) {
    return sim::ps_to_ns(p.dma_setup) + pieces * (piece / bw_e + sim::ps_to_ns(p.dma_transfer_gap));
  };
  // the one-core time through the same driver (a launch of one program)
  Kernel one_launch;
  one_launch.name = "copy";
  one_launch.tensors = {one.tensors[0], one.tensors[1]};
  one_launch.core_programs.push_back(one);
  const double t1 = run_ns(one_launch, "trn2");
  const double t2 = run_ns(two, "trn2");
  const double t2c = run_ns(two, "trn2", {"hbm.stack_bw=400GB/s"});
  const double bw1 = std::min(p.dma_engine_bw, p.hbm_bw / p.dma_engines);
  const double bw2 = std::min(bw1, p.hbm_stack_bw / (2 * p.dma_engines));
  CHECK(t1 == Approx(expect(2 * blocks, bw1)).epsilon(0.01));
  CHECK(t2 == Approx(expect(blocks, bw2)).epsilon(0.01));
  CHECK(t1 / t2 == Approx(2.0).epsilon(0.02));
  CHECK(t2c == Approx(expect(blocks, 400.0 / (2 * p.dma_engines))).epsilon(0.01));
  SECTION("the same inputs give the same times") { CHECK(run_ns(two, "trn2") == t2); }
  SECTION("in program order too (compiler.schedule: program_order)") {
    const double t1p = run_ns(one_launch, "trn2", {"compiler.schedule=program_order"});
    const double t2p = run_ns(two, "trn2", {"compiler.schedule=program_order"});
    CHECK(t1p / t2p == Approx(2.0).epsilon(0.05));
  }
}

TEST_CASE("a core that finishes while the other waits at a barrier is PeerMissing", "[lnc]") {
  const Kernel k = parse_kernel_json(launch(copy_program(0, 1, 256, 64, kBarrier), copy_program(128, 1, 256, 64)));
  SimOptions o;
  o.numerics = false;
  MultiCoreRun mc(k, engines::load_config("trn2"), o);
  try {
    mc.run();
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kPeerMissing);
    CHECK(std::string(e.what()).find("k.py:20") != std::string::npos);
  }
}

TEST_CASE("matching barriers meet at the later arrival", "[lnc]") {
  // core 0 copies 4 blocks before its barrier, core 1 one block: both leave at core 0's arrival, so core 1's
  // end is after core 0's copies.
  const Kernel k = parse_kernel_json(launch(copy_program(0, 4, 1024, 256, kBarrier), copy_program(512, 1, 1024, 256, kBarrier)));
  SimOptions o;
  o.numerics = false;
  MultiCoreRun mc(k, engines::load_config("trn2"), o);
  mc.run();
  CHECK(mc.rendezvous() == 1);
  CHECK(mc.core(1).total_time() >= mc.core(0).total_time() - mc.core(0).params().trigger_instr);
  const sim::StatsRegistry st = mc.stats();
  CHECK(st.get("lnc.cores") == 2);
  CHECK(st.get("total_time") == Approx(std::max(st.get("core0.total_time"), st.get("core1.total_time"))));
}

TEST_CASE("LNC=2 on trn1 is LncNotSupported", "[lnc]") {
  const Kernel k = parse_kernel_json(launch(copy_program(0, 1, 256, 64), copy_program(128, 1, 256, 64)));
  SimOptions o;
  o.numerics = false;
  try {
    MultiCoreRun mc(k, engines::load_config("trn1"), o);
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kLncNotSupported);
  }
}
