// The compiler model's scheduler (frontend/compiler/scheduler.h): list scheduling vs program order,
// no_reorder groups, with_schedule edges, engine placement and DMA queue spreading.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <set>

#include "engines/simulator.h"
#include "frontend/compiler/scheduler.h"
#include "frontend/kernel_builder.h"
#include "frontend/lower.h"

using namespace nsim;
using namespace nsim::frontend;
using nsim::isa::Engine;
using nsim::isa::Space;

namespace {

struct Run {
  double total_ns = 0;
  sim::StatsRegistry stats;
  std::map<int, std::vector<InstrTiming>> by_line;  ///< timings of each source line's instructions
  std::map<int, std::vector<Engine>> engines;       ///< engine of each source line's instructions
  std::map<int, std::vector<int>> queues;           ///< DMA queue of each source line's instructions
};

Run simulate(const Kernel& k, std::vector<std::string> overrides, const std::string& preset = "trn2") {
  SimOptions o;
  o.numerics = false;
  auto sim = Simulator::from_preset(preset, overrides, o);
  verify_kernel(k, sim->params());
  Lowering low(k, *sim);
  Run r;
  sim->add_instr_listener([&](const isa::Instr& in, const InstrTiming& t) {
    const int line = sim->source(in.loc).line;
    r.by_line[line].push_back(t);
    r.engines[line].push_back(in.engine);
    if (isa::is_dma(in.op)) r.queues[line].push_back(in.dma_queue);
  });
  low.run();
  sim->finish();
  r.total_ns = sim::ps_to_ns(sim->total_time());
  r.stats = sim->stats();
  return r;
}

/// Double-buffered loop: iteration i loads a [128, F] bf16 tile, exponentiates it on ScalarE and
/// stores it. `compute`: include the activation; `dma`: include the load and store.
Kernel stream_kernel(int iters, int64_t f, bool compute = true, bool dma = true, int bufs = 0) {
  KB b;
  const int x = dma ? b.input("x", {128 * iters, f}, DType::kBFloat16) : -1;
  const int y = dma ? b.output("y", {128 * iters, f}, DType::kBFloat16) : -1;
  const int i = b.loop("i", 0, iters);
  const int t = b.tile("t", {128, f}, DType::kBFloat16, bufs, 20);
  if (dma) b.op("dma_copy", {W(t), X(x, {D(A(i, 128), 128), D(0, f)})}, 21);
  if (compute) {
    const int a = b.op("activation", {W(t), W(t)}, 22);
    b.o(a).act = isa::ActFunc::kExp;
  }
  if (dma) b.op("dma_copy", {X(y, {D(A(i, 128), 128), D(0, f)}), W(t)}, 23);
  b.end();
  return b.k;
}

}  // namespace

TEST_CASE("schedule: a double-buffered loop runs at about the larger of DMA and compute and under no_reorder at about their sum") {
  // 8 iterations of [128, 4096] bf16 (1 MiB in, 1 MiB out per iteration). trn2: the 16 DMA engines
  // move 23 B/ns each, so one iteration's 2 MiB take ~2 MiB / 368 B/ns = 5.7 us of DMA time, 46 us in
  // all (measured below with the compute removed, setup and gaps included); exp on ScalarE is
  // ~4096 / 0.96 GHz ~ 3.5-4.3 us per iteration (C10), 28-34 us in all (measured with the DMAs removed).
  // List scheduling lets the load of tile i+1 start while tile i is exponentiated and stored, so
  // the kernel takes about the DMA time plus one iteration's compute. With the automatic 2 rotating
  // buffers the load of tile i+2 still waits for the store of tile i (write-after-read on the
  // buffer): load + exp + store + 3 hand-offs ~ 2.9 + 0.8 + 3.6 + 0.8 + 2.9 + 0.9 ~ 12 us per 2
  // iterations, about the DMA period, so the pipeline runs within 25% of max(DMA, compute); with 3
  // buffers (load, compute, store in flight) it runs at the DMA time plus one iteration's compute.
  // `no_reorder` keeps program order, so with stores and loads on the same trigger engine each
  // iteration waits for the last: about DMA + compute.
  constexpr int kIters = 8;
  constexpr int64_t kF = 4096;
  const double dma_only = simulate(stream_kernel(kIters, kF, false, true), {}).total_ns;
  const double compute_only = simulate(stream_kernel(kIters, kF, true, false), {}).total_ns;
  const double per_iter_compute = compute_only / kIters;
  REQUIRE(dma_only > 30000);
  REQUIRE(compute_only > 20000);

  const Kernel k = stream_kernel(kIters, kF);
  const double listed = simulate(k, {}).total_ns;
  INFO("dma only " << dma_only << " ns, compute only " << compute_only << " ns, list " << listed << " ns");
  CHECK(listed <= 1.25 * std::max(dma_only, compute_only));
  CHECK(listed >= std::max(dma_only, compute_only));
  const double three = simulate(stream_kernel(kIters, kF, true, true, 3), {}).total_ns;
  CHECK(three <= std::max(dma_only, compute_only) + 1.5 * per_iter_compute);

  Kernel ordered = k;
  for (Op& op : ordered.ops) op.order_group = 1;  // the whole loop inside one no_reorder block
  const double in_order = simulate(ordered, {}).total_ns;
  INFO("no_reorder " << in_order << " ns");
  CHECK(in_order >= 0.9 * (dma_only + compute_only));
  CHECK(in_order > 1.3 * listed);
}

TEST_CASE("schedule: program_order keeps the kernel's order, the list scheduler reorders it") {
  const Kernel k = stream_kernel(8, 2048);
  const Run po = simulate(k, {"compiler.schedule=program_order"});
  const Run ls = simulate(k, {});
  CHECK(po.total_ns > 0);
  CHECK(ls.total_ns <= po.total_ns);
  // In program order every load (line 21) is issued before the next iteration's; instructions of
  // each line keep their relative order in both modes.
  for (const Run* r : {&po, &ls}) {
    const auto& loads = r->by_line.at(21);
    for (size_t i = 1; i < loads.size(); ++i) CHECK(loads[i].index > loads[i - 1].index);
  }
}

TEST_CASE("schedule: with_schedule edges order named instructions") {
  // Two independent VectorE ops, a (line 30) then b (line 31). with_schedule [("a", "b")]: a runs
  // after b, so b's instruction issues first and a starts no earlier than b's end.
  KB b;
  const int t1 = b.tile("t1", {128, 512}, DType::kFloat32, 0, 5);
  const int t2 = b.tile("t2", {128, 512}, DType::kFloat32, 0, 6);
  const int oa = b.op("memset", {W(t1)}, 30);
  const int ob = b.op("memset", {W(t2)}, 31);
  b.o(oa).engine = Engine::kVector;
  b.o(ob).engine = Engine::kVector;
  b.o(oa).label = std::string("a");  // (a move: GCC 12 reports a false -Wrestrict on assigning a literal)
  b.o(ob).label = std::string("b");
  const int sum = b.op("tensor_tensor", {W(t1), W(t1), W(t2)}, 32);  // both live until here
  b.o(sum).alu0 = isa::AluOp::kAdd;
  const Run plain = simulate(b.k, {});
  CHECK(plain.by_line.at(30)[0].index < plain.by_line.at(31)[0].index);
  b.k.schedule.push_back(ScheduleEdge{"a", {"b"}});
  const Run edged = simulate(b.k, {});
  const InstrTiming& ta = edged.by_line.at(30)[0];
  const InstrTiming& tb = edged.by_line.at(31)[0];
  CHECK(tb.index < ta.index);
  CHECK(ta.start >= tb.end);
  // An edge against a data dependency (the sum reads a's result: a cannot run after it) is a cycle.
  b.o(sum).label = std::string("s");
  b.k.schedule.push_back(ScheduleEdge{"a", {"s"}});
  try {
    simulate(b.k, {});
    FAIL("expected a cycle error");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kScheduleCycle);
  }
  b.k.schedule.pop_back();
  // An edge naming an instruction that does not exist is the user's error.
  b.k.schedule.push_back(ScheduleEdge{"a", {"nope"}});
  try {
    simulate(b.k, {});
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kUnknownName);
    CHECK(std::string(e.what()).find("nope") != std::string::npos);
  }
}

TEST_CASE("schedule: a with_schedule target issued before the waiting op enters the window, and program order") {
  // a (line 30): a long ScalarE exp of [128, 8192] fp32 (~8.2 us); 40 short VectorE memsets of another tile (line
  // 31); b (line 32): a GpSimd memset of a third tile, independent of a. with_schedule [("b", "a")]: b starts no
  // earlier than a's end, also when a was issued before b came into the window (compiler.window = 8: a leaves
  // the window long before b is admitted; the edge was dropped then), and with compiler.schedule =
  // program_order (which ignored the edges: b started at 0).
  KB b;
  const int t = b.tile("t", {128, 8192}, DType::kFloat32, 0, 5);
  const int f = b.tile("f", {128, 64}, DType::kFloat32, 0, 6);
  const int v = b.tile("v", {128, 64}, DType::kFloat32, 0, 7);
  const int oa = b.op("activation", {W(t), W(t)}, 30);
  b.o(oa).act = isa::ActFunc::kExp;
  b.o(oa).label = std::string("a");
  for (int i = 0; i < 40; ++i) {
    const int m = b.op("memset", {W(f)}, 31);
    b.o(m).engine = Engine::kVector;
  }
  const int ob = b.op("memset", {W(v)}, 32);
  b.o(ob).engine = Engine::kGpsimd;
  b.o(ob).label = std::string("b");
  const Run free_b = simulate(b.k, {"compiler.window=8"});
  CHECK(free_b.by_line.at(32)[0].start < free_b.by_line.at(30)[0].end);  // without the edge b runs under a
  b.k.schedule.push_back(ScheduleEdge{"b", {"a"}});
  for (const auto& ov : {std::vector<std::string>{}, std::vector<std::string>{"compiler.window=8"},
                         std::vector<std::string>{"compiler.schedule=program_order"}}) {
    const Run r = simulate(b.k, ov);
    INFO((ov.empty() ? std::string("default") : ov[0]));
    CHECK(r.by_line.at(32)[0].start >= r.by_line.at(30)[0].end);
  }
}

TEST_CASE("schedule: register_load and the ops waiting for it (op \"after\")") {
  // A [1, 1] int32 tile t loaded from HBM n (line 20, Sync queue), register_load of t on Sync (line 21, labelled
  // "r"), and a VectorE memset of an unrelated tile u (line 22): independent of both, it starts at once, before
  // the load ends. With "after": ["r"] (what the Python tracer writes for an op using the register) it starts
  // no earlier than the register_load's end. The register_load itself waits for t's producer (a RAW on t) and
  // keeps its engine sync.trigger_instr + sync.register_load_sbuf = 80 + 100 = 180 ns on trn2; from HBM,
  // sync.trigger_instr + sync.register_load_hbm = 80 + 600 = 680 ns.
  KB b;
  const int n = b.input("n", {1, 1}, DType::kInt32);
  const int t = b.tile("t", {1, 1}, DType::kInt32, 0, 5);
  const int u = b.tile("u", {128, 512}, DType::kFloat32, 0, 6);
  b.op("dma_copy", {W(t), W(n)}, 20);
  const int rl = b.op("register_load", {W(t)}, 21);
  b.o(rl).engine = Engine::kSync;
  b.o(rl).label = std::string("r");
  const int ms = b.op("memset", {W(u)}, 22);
  b.o(ms).engine = Engine::kVector;
  const Run plain = simulate(b.k, {});
  const InstrTiming& load = plain.by_line.at(20)[0];
  const InstrTiming& reg = plain.by_line.at(21)[0];
  CHECK(reg.start >= load.end);
  CHECK(sim::ps_to_ns(reg.end - reg.start) == Approx(180.0));
  CHECK(plain.by_line.at(22)[0].start < load.end);
  b.o(ms).after = {std::string("r")};
  const Run edged = simulate(b.k, {});
  CHECK(edged.by_line.at(22)[0].start >= edged.by_line.at(21)[0].end);
  // An overridden latency is what the sequencer waits.
  const Run slow = simulate(b.k, {"sync.register_load_sbuf=1us"});
  CHECK(sim::ps_to_ns(slow.by_line.at(21)[0].end - slow.by_line.at(21)[0].start) == Approx(1080.0));
  // From HBM: the longer read.
  b.k.ops[static_cast<size_t>(rl)].operands[0] = W(n);
  const Run hbm = simulate(b.k, {});
  CHECK(sim::ps_to_ns(hbm.by_line.at(21)[0].end - hbm.by_line.at(21)[0].start) == Approx(680.0));
  CHECK(hbm.by_line.at(22)[0].start >= hbm.by_line.at(21)[0].end);
  // "after" naming no labelled op: the user's error, at the op's line.
  b.o(ms).after = {std::string("nope")};
  try {
    simulate(b.k, {});
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kUnknownName);
    CHECK(std::string(e.what()).find("nope") != std::string::npos);
    CHECK(e.loc().line == 22);
  }
}

TEST_CASE("schedule: engine-free element-wise ops are spread over VectorE and GpSimd") {
  // 1,000 independent tensor_tensor ops on [128, 32] fp32 SBUF tiles, no engine=: each costs about
  // the engines' minimum II, so VectorE alone is busy for all of them; placed by earliest finish
  // both engines take a share and the kernel is about twice as fast.
  KB b;
  constexpr int kN = 1000;
  const int a = b.tile("a", {128, 32}, DType::kFloat32, 0, 5);
  const int c = b.tile("c", {128, 32}, DType::kFloat32, 0, 6);
  const int out = b.tile("out", {128, kN * 32}, DType::kFloat32, 0, 7);
  b.op("memset", {W(a)}, 8);
  b.op("memset", {W(c)}, 9);
  const int i = b.loop("i", 0, kN);
  const int tt = b.op("tensor_tensor", {X(out, {D(0, 128), D(A(i, 32), 32)}), W(a), W(c)}, 40);
  b.o(tt).alu0 = isa::AluOp::kAdd;
  b.end();
  const Run placed = simulate(b.k, {});
  const Run fixed = simulate(b.k, {"compiler.engine_placement=default"});
  const double vec = placed.stats.get("engine.vector.instruction_count");
  const double gps = placed.stats.get("engine.gpsimd.instruction_count");
  INFO("vector " << vec << ", gpsimd " << gps << ", placed " << placed.total_ns << " ns, vector only " << fixed.total_ns
                 << " ns, vector busy " << fixed.stats.get("engine.vector.busy_time") / kN << " ns/op, gpsimd busy "
                 << placed.stats.get("engine.gpsimd.busy_time") / gps << " ns/op");
  CHECK(vec >= 300);
  CHECK(gps >= 300);
  CHECK(fixed.stats.get("engine.gpsimd.instruction_count") == 0);
  CHECK(placed.total_ns < 0.75 * fixed.total_ns);
  // An explicit engine= is honoured.
  b.o(tt).engine = Engine::kVector;
  const Run pinned = simulate(b.k, {});
  for (Engine e : pinned.engines.at(40)) CHECK(e == Engine::kVector);
}

TEST_CASE("schedule: automatic DMAs are spread over their trigger engine's queues") {
  const Kernel k = stream_kernel(8, 1024, false, true);
  const Run r = simulate(k, {});
  std::set<int> used;
  for (int q : r.queues.at(21)) used.insert(q);
  CHECK(used.size() >= 2);
  const Run one = simulate(k, {"compiler.dma_queues_per_trigger=1"});
  std::set<int> used1;
  for (int q : one.queues.at(21)) used1.insert(q);
  CHECK(used1.size() == 1);
  CHECK(r.total_ns <= one.total_ns);
  // 16 independent [128, 64] fp32 loads on trn2: with one queue per trigger engine, a load the scheduler moves
  // from Sync to another trigger engine goes to that engine's queue (it kept Sync's queue 0 before).
  KB b;
  const int x = b.input("x", {128, 16 * 64});
  const int t = b.tile("t", {128, 16 * 64}, DType::kFloat32, 0, 5);
  for (int i = 0; i < 16; ++i) b.op("dma_copy", {X(t, {D(0, 128), D(i * 64, 64)}), X(x, {D(0, 128), D(i * 64, 64)})}, 21);
  const Run r1 = simulate(b.k, {"compiler.dma_queues_per_trigger=1"});
  const auto sim1 = Simulator::from_preset("trn2", {"compiler.dma_queues_per_trigger=1"});
  REQUIRE(r1.queues.at(21).size() == 16);
  for (size_t i = 0; i < 16; ++i)
    CHECK(r1.queues.at(21)[i] == engines::trigger_queue(sim1->params(), r1.engines.at(21)[i], 0));
}

TEST_CASE("schedule: bad compiler keys are config errors") {
  for (const char* bad : {"compiler.schedule=fast", "compiler.engine_placement=random", "compiler.window=0",
                          "compiler.dma_queues_per_trigger=0"}) {
    try {
      Simulator::from_preset("trn2", {bad});
      FAIL(bad);
    } catch (const Error& e) {
      CHECK(e.code() == ErrorCode::kConfigBadValue);
    }
  }
}

TEST_CASE("schedule: TensorE keeps program order among matmuls ready at once") {
  // Two output tiles, each the sum of 8 bf16 [128, 128] x [128, 512] matmuls accumulated in its own PSUM tile
  // and evicted by a tensor_copy; the second tile is then scaled 12 times on VectorE, so its matmuls lie on
  // the longer path to the end. Every operand is resident: both groups' matmuls are ready from the start,
  // and TensorE starts one every ~0.4 us, so at each choice the next matmul of either group could start at
  // the same time. By critical path alone group 1's matmuls are taken whenever their path is the longer, and
  // the groups interleave (measured before the rule: group 1's first matmul started at 1.85 us, group 0's last
  // at 3.36 us): both PSUM tiles fill at once and group 0's eviction waits. Among TensorE ties program order
  // wins (docs/timing-model.md "List scheduling"): group 0's eight matmuls, then group 1's.
  KB b;
  const int st = b.tile("st", {128, 128}, DType::kBFloat16, 0, 5);
  const int mv = b.tile("mv", {128, 512}, DType::kBFloat16, 0, 6);
  const int out = b.tile("out", {128, 2 * 512}, DType::kFloat32, 0, 7);
  b.op("memset", {W(st)}, 8);
  b.op("memset", {W(mv)}, 9);
  for (int g = 0; g < 2; ++g) {
    const int ps = b.psum(g == 0 ? "ps0" : "ps1", {128, 512}, 0, 30 + g);
    for (int k = 0; k < 8; ++k) {
      const int mm = b.op("nc_matmul", {W(ps), W(st), W(mv)}, 40 + g);
      if (k > 0) b.o(mm).flags = isa::kAccumulate;
    }
    b.op("tensor_copy", {X(out, {D(0, 128), D(g * 512, 512)}), W(ps)}, 50 + g);
  }
  for (int j = 0; j < 12; ++j) b.ts(X(out, {D(0, 128), D(512, 512)}), X(out, {D(0, 128), D(512, 512)}),
                                    isa::AluOp::kMultiply, 1.5f, 60);
  // 32 scheduling nodes (2 memsets, 16 matmul pairs, 2 copies, 12 scalings) in a window of 32: the scheduler
  // computes critical paths every 16 admissions, so every node has its path at the first choice
  const Run r = simulate(b.k, {"compiler.window=32"});
  const std::vector<InstrTiming>& g0 = r.by_line.at(40);
  const std::vector<InstrTiming>& g1 = r.by_line.at(41);
  REQUIRE(g0.size() == 16);  // each nc_matmul: a LoadStationary and a MultiplyMoving
  REQUIRE(g1.size() == 16);
  sim::Ps g0_last = 0, g1_first = INT64_MAX;
  for (const InstrTiming& t : g0) g0_last = std::max(g0_last, t.start);
  for (const InstrTiming& t : g1) g1_first = std::min(g1_first, t.start);
  INFO("group 0's last TensorE instruction starts at " << g0_last << " ps, group 1's first at " << g1_first << " ps");
  // (a matmul's MultiplyMoving and the next one's LoadStationary start together)
  CHECK(g0_last <= g1_first);
  // group 0's eviction starts before group 1's matmuls are done
  sim::Ps g1_end = 0;
  for (const InstrTiming& t : g1) g1_end = std::max(g1_end, t.end);
  CHECK(r.by_line.at(50).at(0).start < g1_end);
}

TEST_CASE("schedule: writing part of a tile orders only the later accesses to that part") {
  // t ([128, 1024] fp32: 64 chunks of 64 B per partition) is loaded whole (line 50), which leaves its chunks
  // one conflict state. Line 52 then writes its first half from L, whose long load (line 51) it waits for;
  // line 53 reads t's second half. Line 53 depends on line 50 alone: the list scheduler issues it before
  // line 52, as soon as t is loaded. (The state of t's chunks is updated in place only when nothing but the
  // accessed chunks refers to it; touched in place here, the second half would take line 52 as its writer.)
  KB b;
  const int x = b.input("x", {128, 1024});
  const int t = b.tile("t", {128, 1024}, DType::kFloat32, 0, 40);
  const int l = b.tile("l", {128, 1024}, DType::kFloat32, 0, 41);
  const int u = b.tile("u", {128, 512}, DType::kFloat32, 0, 42);
  const int out = b.output("y", {128, 512});
  b.op("dma_copy", {W(t), W(x)}, 50);
  b.op("dma_copy", {W(l), W(x)}, 51);
  b.ts(X(t, {D(0, 128), D(0, 512)}), X(l, {D(0, 128), D(0, 512)}), isa::AluOp::kMultiply, 2.0f, 52);
  const int a = b.op("activation", {W(u), X(t, {D(0, 128), D(512, 512)})}, 53);
  b.o(a).act = isa::ActFunc::kExp;
  b.op("dma_copy", {W(out), W(u)}, 54);
  const Run r = simulate(b.k, {});
  const InstrTiming& half = r.by_line.at(52).at(0);
  const InstrTiming& other = r.by_line.at(53).at(0);
  INFO("line 52 starts at " << half.start << " ps, line 53 at " << other.start << " ps");
  CHECK(other.start < half.start);
  CHECK(other.start >= r.by_line.at(50).at(0).end);
}
