// The analyzer's accounting: wait attribution in InstrTiming, the dependency bound, the identities
// of the idle-time decomposition and of the critical path, and redundant-load counting.
#include <catch2/catch.hpp>

#include <numeric>
#include <random>

#include "engines/analysis/analyzer.h"
#include "engines/deps.h"
#include "kernel_builder.h"

using namespace nsim;
using namespace nsim::test;

namespace {

std::unique_ptr<Simulator> analysed_sim() {
  SimOptions o;
  o.numerics = false;
  o.dependency_bound = true;
  return Simulator::from_preset("trn2", {}, o);
}

Instr vec_scale(const Operand& dst, const Operand& src) {
  Instr v = instr(Opcode::kTensorScalar, Engine::kVector, {dst, src});
  v.alu0 = AluOp::kMultiply;
  v.flags = isa::kHasImm0;
  return v;
}

}  // namespace

TEST_CASE("dependency tags carry the producer's class and index", "[analysis][deps]") {
  using engines::DepTracker;
  for (uint64_t id : {uint64_t{0}, uint64_t{7}, uint64_t{1} << 28, (uint64_t{1} << 29) - 1}) {
    const uint32_t t = DepTracker::tag(engines::kClassDma, id);
    CHECK(DepTracker::tag_class(t) == engines::kClassDma);
    CHECK(DepTracker::tag_index(t, id + 5) == id);
  }
  // Beyond 2^29 instructions the index wraps in the tag, and is recovered relative to `now`.
  const uint64_t far = (uint64_t{1} << 29) * 3 + 12;
  CHECK(DepTracker::tag_index(DepTracker::tag(2, far), far + 100) == far);
}

TEST_CASE("InstrTiming names the producer an instruction waited for", "[analysis]") {
  auto s = analysed_sim();
  const auto& h = s->alloc_hbm("x", {128, 512}, DType::kFloat32);
  Operand t0 = s->alloc_tile(Space::kSbuf, 128, {512}, DType::kFloat32);
  Operand t1 = s->alloc_tile(Space::kSbuf, 128, {512}, DType::kFloat32);
  Operand t2 = s->alloc_tile(Space::kSbuf, 128, {512}, DType::kFloat32);
  const InstrTiming d = s->submit(instr(Opcode::kDmaCopy, Engine::kSync, {t0, hbm_rows(h, 0, 128)}));
  const InstrTiming v = s->submit(vec_scale(t1, t0));
  Instr a = instr(Opcode::kActivation, Engine::kScalar, {t2, t1});
  a.act = isa::ActFunc::kCopy;
  const InstrTiming sc = s->submit(a);
  CHECK(d.index == 0);
  CHECK(d.waited_for == -1);
  CHECK(v.index == 1);
  CHECK(v.waited_for == 0);
  CHECK(v.waited_class == engines::kClassDma);
  CHECK(v.free == 0);
  CHECK(v.ready == v.start);  // VectorE was idle: it started when the data arrived
  CHECK(sc.waited_for == 1);
  CHECK(sc.waited_class == static_cast<uint8_t>(Engine::kVector));
  // A chain: the dependency bound is the whole kernel, since nothing could overlap.
  s->finish();
  CHECK(s->dependency_bound() == s->total_time());
}

TEST_CASE("idle time and the critical path add up to the kernel time", "[analysis]") {
  // Two tiles, each loaded, scaled on VectorE, activated on ScalarE and stored.
  auto s = analysed_sim();
  engines::Analyzer an(*s);
  const auto& x = s->alloc_hbm("x", {256, 1024}, DType::kFloat32);
  const auto& y = s->alloc_hbm("y", {256, 1024}, DType::kFloat32);
  for (int i = 0; i < 2; ++i) {
    Operand a = s->alloc_tile(Space::kSbuf, 128, {1024}, DType::kFloat32);
    Operand b = s->alloc_tile(Space::kSbuf, 128, {1024}, DType::kFloat32);
    Operand c = s->alloc_tile(Space::kSbuf, 128, {1024}, DType::kFloat32);
    s->submit(instr(Opcode::kDmaCopy, Engine::kSync, {a, hbm_rows(x, 128 * i, 128)}));
    s->submit(vec_scale(b, a));
    Instr act = instr(Opcode::kActivation, Engine::kScalar, {c, b});
    act.act = isa::ActFunc::kExp;
    s->submit(act);
    s->submit(instr(Opcode::kDmaCopy, Engine::kGpsimd, {hbm_rows(y, 128 * i, 128), c}));
  }
  s->finish();
  const engines::AnalysisReport r = an.report("two_tiles");
  const double total = ns(s->total_time());
  REQUIRE(r.total_ns == Approx(total));
  CHECK(r.instructions == 8);
  // Per engine: busy + waits + blocked + idle at the end = total (in-order issue).
  for (const auto& e : r.idle) {
    INFO(e.engine);
    CHECK(e.busy_ns + e.wait_ns + e.other_wait_ns + e.tail_ns == Approx(total).epsilon(1e-9));
    double on = 0;
    for (const auto& [who, t] : e.waited_on) on += t;
    CHECK(on == Approx(e.wait_ns));
  }
  // VectorE waited only for the loads (DMA queue of the sync engine), ScalarE only for VectorE.
  for (const auto& e : r.idle) {
    if (e.engine == "vector") {
      REQUIRE(e.waited_on.size() == 1);
      CHECK(e.waited_on[0].first.rfind("q", 0) == 0);  // a DMA queue: qSyncIO0, ...
    }
    if (e.engine == "scalar") {
      REQUIRE(e.waited_on.size() == 1);
      CHECK(e.waited_on[0].first == "vector");
    }
  }
  // The critical path's pieces sum to the kernel time.
  REQUIRE(r.critical_path);
  double cp = 0;
  for (const auto& [k, v] : r.critical_path_by_track) cp += v;
  CHECK(cp == Approx(total).epsilon(1e-9));
  // Bounds are lower bounds, largest first, and the report names the largest.
  for (const auto& b : r.bounds) CHECK(b.ns <= total * (1 + 1e-9));
  CHECK(std::is_sorted(r.bounds.begin(), r.bounds.end(), [](const auto& a, const auto& b) { return a.ns > b.ns; }));
  // The verdict (engines/bounds.h): the largest resource bound, or latency when it is busy under
  // analysis.latency_bound_percent (50%) of the kernel time.
  const engines::Bound* top = nullptr;
  for (const auto& b : r.bounds)
    if (b.name != "dependencies" && !top) top = &b;
  REQUIRE(top != nullptr);
  CHECK(r.top_share_percent == Approx(100.0 * top->ns / total));
  CHECK(r.bottleneck == (r.top_share_percent < 50 ? std::string("latency") : top->name));
  // Nothing is loaded twice.
  for (const auto& f : r.findings) CHECK(f.kind != "redundant_dma");
}

TEST_CASE("the critical path keeps instructions longer than 2^32 ps", "[analysis]") {
  // The analyzer packs each instruction's duration in 32 bits of ps and keeps longer ones aside. A
  // 512 KiB load at hbm.bw = 0.05 GB/s takes 524288 B / 0.05 B/ns ~ 10.5 ms = 1.05e10 ps > 2^32 ps
  // (4.29e9): the path (load -> scale -> store, one chain) must still add up to the kernel time, and
  // the load's queue must hold most of it.
  SimOptions o;
  o.numerics = false;
  o.dependency_bound = true;
  auto s = Simulator::from_preset("trn2", {"hbm.bw=0.05GB/s"}, o);
  engines::Analyzer an(*s);
  const auto& x = s->alloc_hbm("x", {128, 1024}, DType::kFloat32);
  const auto& y = s->alloc_hbm("y", {128, 1024}, DType::kFloat32);
  Operand a = s->alloc_tile(Space::kSbuf, 128, {1024}, DType::kFloat32);
  Operand b = s->alloc_tile(Space::kSbuf, 128, {1024}, DType::kFloat32);
  const InstrTiming ld = s->submit(instr(Opcode::kDmaCopy, Engine::kSync, {a, hbm_rows(x, 0, 128)}));
  CHECK(ld.end - ld.start > (sim::Ps{1} << 32));
  s->submit(vec_scale(b, a));
  s->submit(instr(Opcode::kDmaCopy, Engine::kSync, {hbm_rows(y, 0, 128), b}));
  s->finish();
  const engines::AnalysisReport r = an.report("slow_load");
  const double total = ns(s->total_time());
  REQUIRE(r.critical_path);
  double cp = 0, longest = 0;
  for (const auto& [k, v] : r.critical_path_by_track) {
    cp += v;
    longest = std::max(longest, v);
  }
  CHECK(cp == Approx(total).epsilon(1e-9));
  CHECK(longest >= ns(ld.end - ld.start) * 0.99);
}

TEST_CASE("reloaded HBM bytes are counted exactly for back-to-back and strided rows", "[analysis]") {
  // Rows back to back are counted as one run, strided rows one by one: both must count the bytes a
  // transfer loads again. w: [256, 40] fp32 (160 B rows: not a multiple of the 64 B reload chunk, so
  // rows share chunks). Loads: rows [0, 128) (one run), rows [64, 192) (one run: rows 64..127 again),
  // then every other row of [0, 256) (strided: rows 0, 2, ..., 190 were loaded, 192..254 were not).
  auto s = analysed_sim();
  engines::Analyzer an(*s);
  const auto& w = s->alloc_hbm("w", {256, 40}, DType::kFloat32);
  const uint32_t line = s->add_source(SourceLoc{"k.py", 7, "kernel"});
  Operand t = s->alloc_tile(Space::kSbuf, 128, {40}, DType::kFloat32);
  Operand every_other = hbm_rows(w, 0, 128);
  every_other.partition_step *= 2;
  for (const Operand& src : {hbm_rows(w, 0, 128), hbm_rows(w, 64, 128), every_other}) {
    Instr ld = instr(Opcode::kDmaCopy, Engine::kSync, {t, src});
    ld.loc = line;
    s->submit(ld);
  }
  s->finish();
  const engines::AnalysisReport r = an.report();
  const engines::Finding* f = nullptr;
  for (const auto& x : r.findings)
    if (x.kind == "redundant_dma") f = &x;
  INFO(r.to_text());
  REQUIRE(f != nullptr);
  double bytes = -1;
  for (const auto& [k, v] : f->metrics)
    if (k == "reload_bytes") bytes = v;
  // second load: rows 64..127 (64 rows); third: rows 0, 2, ..., 190 (96 rows); 160 B each
  CHECK(bytes == (64.0 + 96.0) * 160.0);
}

TEST_CASE("a chunk loaded in part, then whole inside a longer transfer, counts the part again", "[analysis]") {
  // w: [256, 40] fp32, 160 B rows. Load 1: row 0 (bytes [0, 160): 64 B chunks 0 and 1 whole, chunk 2's
  // first 32 B). Load 2: rows [0, 4) (bytes [0, 640): chunks 0..9 whole, chunk 2 among them). Reloaded:
  // chunks 0 and 1 (128 B) and the 32 B of chunk 2, the first row's 160 B; not chunk 2's 64 B.
  auto s = analysed_sim();
  engines::Analyzer an(*s);
  const auto& w = s->alloc_hbm("w", {256, 40}, DType::kFloat32);
  const uint32_t line = s->add_source(SourceLoc{"k.py", 9, "kernel"});
  for (uint32_t rows : {1u, 4u}) {
    Operand t = s->alloc_tile(Space::kSbuf, 4, {40}, DType::kFloat32);
    t.num_partitions = rows;
    Instr ld = instr(Opcode::kDmaCopy, Engine::kSync, {t, hbm_rows(w, 0, rows)});
    ld.loc = line;
    s->submit(ld);
  }
  s->finish();
  const engines::AnalysisReport r = an.report();
  INFO(r.to_text());
  double bytes = -1;
  for (const auto& x : r.findings)
    if (x.kind == "redundant_dma")
      for (const auto& [k, v] : x.metrics)
        if (k == "reload_bytes") bytes = v;
  CHECK(bytes == 160.0);
}

TEST_CASE("loading the same HBM rows three times is one redundant-DMA finding", "[analysis]") {
  auto s = analysed_sim();
  engines::Analyzer an(*s);
  const auto& w = s->alloc_hbm("w", {128, 2048}, DType::kFloat32);
  const uint32_t line = s->add_source(SourceLoc{"k.py", 42, "kernel"});
  const uint32_t other = s->add_source(SourceLoc{"k.py", 50, "kernel"});
  Operand acc = s->alloc_tile(Space::kSbuf, 128, {2048}, DType::kFloat32);
  for (int i = 0; i < 3; ++i) {
    Operand t = s->alloc_tile(Space::kSbuf, 128, {2048}, DType::kFloat32);
    Instr ld = instr(Opcode::kDmaCopy, Engine::kSync, {t, hbm_rows(w, 0, 128)});
    ld.loc = line;
    s->submit(ld);
    Instr add = instr(Opcode::kTensorTensor, Engine::kVector, {acc, acc, t});
    add.alu0 = AluOp::kAdd;
    add.loc = other;
    s->submit(add);
  }
  s->finish();
  const engines::AnalysisReport r = an.report();
  const engines::Finding* f = nullptr;
  for (const auto& x : r.findings)
    if (x.kind == "redundant_dma") f = &x;
  INFO(r.to_text());
  REQUIRE(f != nullptr);
  REQUIRE(f->lines.size() == 1);
  CHECK(f->lines[0].loc.line == 42);
  CHECK(f->lines[0].count == 3);
  bool times = false, bytes = false;
  for (const auto& [k, v] : f->metrics) {
    if (k == "times_loaded") times = v == 3;
    if (k == "reload_bytes") bytes = v == 2.0 * 128 * 2048 * 4;  // two of the three loads
  }
  CHECK(times);
  CHECK(bytes);
  // The HBM bound is the kernel's traffic as written (three loads of the weights) at the bandwidth the
  // DMA engines reach: min(hbm.bw, dma.engines x dma.engine_bw).
  const double roof = std::min(s->params().hbm_bw, s->params().dma_engines * s->params().dma_engine_bw);
  for (const auto& b : r.bounds)
    if (b.name == "hbm") CHECK(b.ns == Approx(3.0 * 128 * 2048 * 4 / roof));
  // The JSON form carries the same finding.
  CHECK(r.to_json().find("\"kind\": \"redundant_dma\"") != std::string::npos);
}

namespace {
const engines::Finding* find_kind(const engines::AnalysisReport& r, const std::string& kind) {
  for (const auto& f : r.findings)
    if (f.kind == kind) return &f;
  return nullptr;
}
double metric(const engines::Finding& f, const std::string& key) {
  for (const auto& [k, v] : f.metrics)
    if (k == key) return v;
  return -1;
}
}  // namespace

TEST_CASE("a stored intermediate loaded back is an hbm_roundtrip finding on the loading line", "[analysis]") {
  // Pass 1 stores a tile to HBM scratch, pass 2 loads it back: 128 x 2048 fp32 = 1 MiB makes the trip.
  auto s = analysed_sim();
  engines::Analyzer an(*s);
  const auto& x = s->alloc_hbm("x", {128, 2048}, DType::kFloat32);
  const auto& tmp = s->alloc_hbm("tmp", {128, 2048}, DType::kFloat32);
  const uint32_t store = s->add_source(SourceLoc{"k.py", 10, "kernel"});
  const uint32_t load = s->add_source(SourceLoc{"k.py", 20, "kernel"});
  Operand a = s->alloc_tile(Space::kSbuf, 128, {2048}, DType::kFloat32);
  Operand b = s->alloc_tile(Space::kSbuf, 128, {2048}, DType::kFloat32);
  s->submit(instr(Opcode::kDmaCopy, Engine::kSync, {a, hbm_rows(x, 0, 128)}));  // an input: not a round trip
  Instr st = instr(Opcode::kDmaCopy, Engine::kSync, {hbm_rows(tmp, 0, 128), a});
  st.loc = store;
  s->submit(st);
  Instr ld = instr(Opcode::kDmaCopy, Engine::kSync, {b, hbm_rows(tmp, 0, 128)});
  ld.loc = load;
  s->submit(ld);
  s->finish();
  const engines::AnalysisReport r = an.report();
  INFO(r.to_text());
  const engines::Finding* f = find_kind(r, "hbm_roundtrip");
  REQUIRE(f != nullptr);
  REQUIRE(f->lines.size() == 1);
  CHECK(f->lines[0].loc.line == 20);
  const double bytes = 128.0 * 2048 * 4;
  CHECK(metric(*f, "roundtrip_bytes") == bytes);
  // The bound: written once and read once at min(hbm.bw, dma.engines x dma.engine_bw).
  const double roof = std::min(s->params().hbm_bw, s->params().dma_engines * s->params().dma_engine_bw);
  CHECK(f->saving_ns == Approx(std::min(2 * bytes / roof, r.total_ns)));
}

TEST_CASE("a load into a tile compute still reads is a single_buffer finding", "[analysis]") {
  // One SBUF tile for two row blocks: the second load must wait for the first exp to finish reading it.
  auto s = analysed_sim();
  engines::Analyzer an(*s);
  const auto& x = s->alloc_hbm("x", {256, 2048}, DType::kBFloat16);
  const uint32_t line = s->add_source(SourceLoc{"k.py", 7, "kernel"});
  Operand t = s->alloc_tile(Space::kSbuf, 128, {2048}, DType::kBFloat16);
  for (int i = 0; i < 2; ++i) {
    Operand y = s->alloc_tile(Space::kSbuf, 128, {2048}, DType::kBFloat16);
    Instr ld = instr(Opcode::kDmaCopy, Engine::kSync, {t, hbm_rows(x, 128 * i, 128)});
    ld.loc = line;
    s->submit(ld);
    Instr act = instr(Opcode::kActivation, Engine::kScalar, {y, t});
    act.act = isa::ActFunc::kExp;
    s->submit(act);
  }
  s->finish();
  const engines::AnalysisReport r = an.report();
  INFO(r.to_text());
  const engines::Finding* f = find_kind(r, "single_buffer");
  REQUIRE(f != nullptr);
  REQUIRE(f->lines.size() == 1);
  CHECK(f->lines[0].loc.line == 7);
  CHECK(f->lines[0].count == 1);  // the second load; the first waited for nothing
  CHECK(f->lines[0].ns > 0);
  // At most the kernel time above its largest resource bound (the dependency chain is not a resource).
  double resource = 0;
  for (const auto& b : r.bounds)
    if (b.name != "dependencies") resource = std::max(resource, b.ns);
  CHECK(f->saving_ns <= r.total_ns - resource + 1e-9);
  // The loss: the part of the exp's run before the second load could start (it read the buffer).
  CHECK(f->saving_ns == Approx(f->lines[0].ns));
}

TEST_CASE("a tensor_reduce over an activation's output is a split_reduce finding", "[analysis]") {
  auto s = analysed_sim();
  engines::Analyzer an(*s);
  const uint32_t line = s->add_source(SourceLoc{"k.py", 30, "kernel"});
  Operand x = s->alloc_tile(Space::kSbuf, 128, {2048}, DType::kFloat32);
  Operand e = s->alloc_tile(Space::kSbuf, 128, {2048}, DType::kFloat32);
  Operand sum = s->alloc_tile(Space::kSbuf, 128, {1}, DType::kFloat32);
  Operand other = s->alloc_tile(Space::kSbuf, 128, {2048}, DType::kFloat32);
  Instr act = instr(Opcode::kActivation, Engine::kScalar, {e, x});
  act.act = isa::ActFunc::kExp;
  s->submit(act);
  Instr red = instr(Opcode::kTensorReduce, Engine::kVector, {sum, e});
  red.alu0 = AluOp::kAdd;
  red.loc = line;
  s->submit(red);
  Instr red2 = instr(Opcode::kTensorReduce, Engine::kVector, {sum, other});  // not an activation's output
  red2.alu0 = AluOp::kAdd;
  s->submit(red2);
  s->finish();
  const engines::AnalysisReport r = an.report();
  INFO(r.to_text());
  const engines::Finding* f = find_kind(r, "split_reduce");
  REQUIRE(f != nullptr);
  REQUIRE(f->lines.size() == 1);
  CHECK(f->lines[0].loc.line == 30);
  CHECK(f->lines[0].count == 1);
  CHECK(metric(*f, "reductions") == 1);
}

TEST_CASE("a one-row matmul is a pe_broadcast finding, not an under-fill", "[analysis]") {
  // ones[1, 128]^T @ row[1, 512]: row on every partition. Ten of them keep TensorE busy.
  auto s = analysed_sim();
  engines::Analyzer an(*s);
  const uint32_t line = s->add_source(SourceLoc{"k.py", 5, "kernel"});
  Operand ones = s->alloc_tile(Space::kSbuf, 1, {128}, DType::kBFloat16);
  Operand row = s->alloc_tile(Space::kSbuf, 1, {512}, DType::kBFloat16);
  Operand ps = s->alloc_tile(Space::kPsum, 128, {512}, DType::kFloat32);
  for (int i = 0; i < 10; ++i) {
    Instr ls = instr(Opcode::kLoadStationary, Engine::kTensor, {ones});
    ls.loc = line;
    s->submit(ls);
    Instr mm = instr(Opcode::kMultiplyMoving, Engine::kTensor, {ps, row});
    mm.loc = line;
    s->submit(mm);
  }
  s->finish();
  const engines::AnalysisReport r = an.report();
  INFO(r.to_text());
  const engines::Finding* f = find_kind(r, "pe_broadcast");
  REQUIRE(f != nullptr);
  CHECK(f->lines[0].loc.line == 5);
  CHECK(metric(*f, "matmuls") == 10);
  CHECK(find_kind(r, "pe_underfill") == nullptr);
}

/// The tiles of the PE-helper tests: a broadcast's one-row weights and row, a matmul's operands, a PSUM tile
/// and an SBUF tile to copy it to.
struct PeTiles {
  Operand ones, row, x, y, ps, sb;
  static PeTiles on(Simulator& s) {
    return {s.alloc_tile(Space::kSbuf, 1, {128}, DType::kBFloat16), s.alloc_tile(Space::kSbuf, 1, {512}, DType::kBFloat16),
            s.alloc_tile(Space::kSbuf, 128, {128}, DType::kBFloat16), s.alloc_tile(Space::kSbuf, 128, {512}, DType::kBFloat16),
            s.alloc_tile(Space::kPsum, 128, {512}, DType::kFloat32), s.alloc_tile(Space::kSbuf, 128, {512}, DType::kFloat32)};
  }
};

TEST_CASE("the copies of a partition broadcast's PSUM result belong to the pe_broadcast finding", "[analysis]") {
  // nl.broadcast_to of a [1, 512] SBUF row: ones^T @ row into PSUM (line 5), copied to SBUF (line 6). A
  // stride-0 DMA, the fix, needs neither. A one-row matmul accumulated into a matmul's PSUM tile (a bias
  // added on the PE array, line 7) is a broadcast too, but its copy (line 8) copies the matmul's result. An exp
  // of a broadcast row read from PSUM (line 9) is work the fix still needs, not a copy.
  auto s = analysed_sim();
  engines::Analyzer an(*s);
  const uint32_t l5 = s->add_source(SourceLoc{"k.py", 5, "kernel"});
  const uint32_t l6 = s->add_source(SourceLoc{"k.py", 6, "kernel"});
  const uint32_t l7 = s->add_source(SourceLoc{"k.py", 7, "kernel"});
  const uint32_t l8 = s->add_source(SourceLoc{"k.py", 8, "kernel"});
  const uint32_t l9 = s->add_source(SourceLoc{"k.py", 9, "kernel"});
  const auto [ones, row, x, y, ps, sb] = PeTiles::on(*s);
  auto at = [](Instr in, uint32_t loc) {
    in.loc = loc;
    return in;
  };
  for (int i = 0; i < 6; ++i) {
    s->submit(at(instr(Opcode::kLoadStationary, Engine::kTensor, {ones}), l5));
    s->submit(at(instr(Opcode::kMultiplyMoving, Engine::kTensor, {ps, row}), l5));
    s->submit(at(instr(Opcode::kTensorCopy, Engine::kVector, {sb, ps}), l6));
  }
  for (int i = 0; i < 4; ++i) {
    s->submit(at(instr(Opcode::kLoadStationary, Engine::kTensor, {x}), l7));
    s->submit(at(instr(Opcode::kMultiplyMoving, Engine::kTensor, {ps, y}), l7));
    s->submit(at(instr(Opcode::kLoadStationary, Engine::kTensor, {ones}), l7));
    Instr bias = at(instr(Opcode::kMultiplyMoving, Engine::kTensor, {ps, row}), l7);
    bias.flags |= isa::kAccumulate;
    s->submit(bias);
    s->submit(at(instr(Opcode::kTensorCopy, Engine::kVector, {sb, ps}), l8));
  }
  s->submit(at(instr(Opcode::kLoadStationary, Engine::kTensor, {ones}), l5));
  s->submit(at(instr(Opcode::kMultiplyMoving, Engine::kTensor, {ps, row}), l5));
  Instr e = at(instr(Opcode::kActivation, Engine::kScalar, {sb, ps}), l9);
  e.act = isa::ActFunc::kExp;
  s->submit(e);
  s->finish();
  const engines::AnalysisReport r = an.report();
  INFO(r.to_text());
  const engines::Finding* f = find_kind(r, "pe_broadcast");
  REQUIRE(f != nullptr);
  CHECK(metric(*f, "matmuls") == 11);
  CHECK(metric(*f, "copies") == 6);
  REQUIRE(f->lines.size() == 3);  // the broadcasting lines, then the copying line
  CHECK(f->lines[2].loc.line == 6);
  CHECK(f->lines[2].count == 6);
  for (const auto& l : f->lines) CHECK((l.loc.line != 8 && l.loc.line != 9));
}

TEST_CASE("free_pe_helpers: broadcasts, their weights and copies take no engine time, nothing else changes",
          "[analysis][what-if]") {
  // nsim analyze's what-if run for pe_broadcast (SimOptions::free_pe_helpers, frontend/analyze.cpp). The same
  // stream on two simulators: a broadcast (weights, one-row matmul, PSUM copy), a transpose and a matmul. With
  // TensorE's power throttle off: with it, TensorE is colder after a freed broadcast, so the transpose and the
  // matmul take longer (checked last). (This test never ran under ctest before 2026-12-05: the ';' its name had
  // cut the name ctest passed to Catch, which then ran nothing and passed; CMakeLists.txt now adds --warn NoTests.)
  auto run = [](uint8_t free, bool throttle = false) {
    SimOptions o;
    o.numerics = false;
    o.free_pe_helpers = free;
    auto s = Simulator::from_preset("trn2", {throttle ? "tensor.throttle.enabled=true" : "tensor.throttle.enabled=false"}, o);
    const auto [ones, row, x, y, ps, sb] = PeTiles::on(*s);
    Operand pt = s->alloc_tile(Space::kPsum, 128, {128}, DType::kBFloat16);
    Operand xt = s->alloc_tile(Space::kSbuf, 128, {128}, DType::kBFloat16);
    Operand out = s->alloc_tile(Space::kSbuf, 128, {512}, DType::kFloat32);
    std::vector<InstrTiming> t;
    t.push_back(s->submit(instr(Opcode::kLoadStationary, Engine::kTensor, {ones})));  // 0
    t.push_back(s->submit(instr(Opcode::kMultiplyMoving, Engine::kTensor, {ps, row})));
    t.push_back(s->submit(instr(Opcode::kTensorCopy, Engine::kVector, {sb, ps})));  // 2: the broadcast's copy
    t.push_back(s->submit(vec_scale(out, sb)));                                    // 3: reads the broadcast row
    t.push_back(s->submit(instr(Opcode::kNcTranspose, Engine::kTensor, {pt, x})));  // 4
    t.push_back(s->submit(instr(Opcode::kTensorCopy, Engine::kVector, {xt, pt})));  // 5: the transpose's copy
    t.push_back(s->submit(instr(Opcode::kLoadStationary, Engine::kTensor, {x})));   // 6: a matmul
    t.push_back(s->submit(instr(Opcode::kMultiplyMoving, Engine::kTensor, {ps, y})));
    s->finish();
    return t;
  };
  const std::vector<InstrTiming> full = run(0), bc = run(engines::PeResults::kBroadcast),
                                 both = run(engines::PeResults::kBroadcast | engines::PeResults::kTranspose);
  for (int i : {0, 1, 2}) {  // freed: done when their operands are (none written here: at once)
    CHECK(full[static_cast<size_t>(i)].end > full[static_cast<size_t>(i)].start);
    CHECK(bc[static_cast<size_t>(i)].start == bc[static_cast<size_t>(i)].end);
    CHECK(bc[static_cast<size_t>(i)].end == 0);
  }
  // The scale still waits for the (freed) copy's result and takes its own time.
  CHECK(bc[3].end - bc[3].start == full[3].end - full[3].start);
  CHECK(bc[3].start < full[3].start);
  // The transpose and its copy keep their cost unless transposes are freed too.
  CHECK(bc[4].end - bc[4].start == full[4].end - full[4].start);
  CHECK(bc[5].end > bc[5].start);
  CHECK(both[4].start == both[4].end);
  CHECK(both[5].start == both[5].end);
  // The matmul keeps its cost; TensorE is free for it earlier.
  CHECK(bc[7].end - bc[7].start == full[7].end - full[7].start);
  CHECK(bc[7].start < full[7].start);
  // Throttled (the trn2 preset): the freed broadcast leaves TensorE idle, so the transpose and the matmul run
  // under a lower utilisation limit (spec 3.4): longer, never shorter.
  const std::vector<InstrTiming> tf = run(0, true), tb = run(engines::PeResults::kBroadcast, true);
  CHECK(tb[4].end - tb[4].start > tf[4].end - tf[4].start);
  CHECK(tb[7].end - tb[7].start >= tf[7].end - tf[7].start);
}

TEST_CASE("free_pe_helpers kSplitReduce: the reductions of an activation's output take no engine time, nothing else",
          "[analysis][what-if]") {
  // nsim analyze's what-if run for split_reduce (frontend/analyze.cpp): a reduction of an activation's output is
  // done when the activation is; a reduction of another tile, one over an output overwritten since, and one
  // writing over the output it reduces keep their cost, and what reads a freed reduction's result waits for it.
  auto run = [](uint8_t free) {
    SimOptions o;
    o.numerics = false;
    o.free_pe_helpers = free;
    auto s = Simulator::from_preset("trn2", {}, o);
    Operand x = s->alloc_tile(Space::kSbuf, 128, {2048}, DType::kFloat32);
    Operand e = s->alloc_tile(Space::kSbuf, 128, {2048}, DType::kFloat32);
    Operand sum = s->alloc_tile(Space::kSbuf, 128, {1}, DType::kFloat32);
    Operand other = s->alloc_tile(Space::kSbuf, 128, {2048}, DType::kFloat32);
    Operand scaled = s->alloc_tile(Space::kSbuf, 128, {1}, DType::kFloat32);
    auto reduce = [](Operand dst, Operand src) {
      Instr r = instr(Opcode::kTensorReduce, Engine::kVector, {dst, src});
      r.alu0 = AluOp::kAdd;
      return r;
    };
    Instr act = instr(Opcode::kActivation, Engine::kScalar, {e, x});
    act.act = isa::ActFunc::kExp;
    std::vector<InstrTiming> t;
    t.push_back(s->submit(act));                        // 0
    t.push_back(s->submit(reduce(sum, e)));             // 1: the activation's output: freed
    t.push_back(s->submit(vec_scale(scaled, sum)));     // 2: reads the sum
    t.push_back(s->submit(reduce(sum, other)));         // 3: not an activation's output
    t.push_back(s->submit(vec_scale(e, other)));        // 4: overwrites the activation's output
    t.push_back(s->submit(reduce(sum, e)));             // 5: no longer the activation's
    t.push_back(s->submit(act));                        // 6
    Operand e0 = e;  // e's first column
    e0.size = {1};
    e0.stride = {1};
    t.push_back(s->submit(reduce(e0, e)));              // 7: writes over the output it reduces
    s->finish();
    return t;
  };
  const std::vector<InstrTiming> full = run(0), fr = run(engines::PeResults::kSplitReduce);
  CHECK(full[1].end > full[1].start);
  CHECK(fr[1].start == fr[1].end);
  CHECK(fr[1].end >= fr[0].end);  // done when the activation's output is there (with the hand-off to VectorE)
  CHECK(fr[1].end < full[1].end);
  CHECK(fr[2].start >= fr[1].end);
  CHECK(fr[2].end - fr[2].start == full[2].end - full[2].start);
  for (size_t i : {0, 3, 5, 7}) CHECK(fr[i].end - fr[i].start == full[i].end - full[i].start);
  // Nothing else is freed by the other kinds' bits.
  const std::vector<InstrTiming> pe = run(engines::PeResults::kBroadcast | engines::PeResults::kTranspose);
  for (size_t i = 0; i < full.size(); ++i) CHECK(pe[i].end - pe[i].start == full[i].end - full[i].start);
}

TEST_CASE("reloads, round trips and load counts match a byte-by-byte reference on random transfers", "[analysis]") {
  // The analyzer counts per 64 B chunk (analysis.reload_chunk_bytes) in blocks of 256 chunks, a whole
  // uniform block at once. Random loads and stores of w ([96, 600] fp32: 2,400 B rows, 14 blocks) mix
  // whole-row runs of many blocks, column slices (strided rows), every other row and partition
  // broadcasts (one row loaded again by each partition, within one transfer). Reference, at 64 B chunks
  // (one mask bit per byte, so the counts are exact): a load's reload is the bytes it reads that an
  // earlier load loaded since the last store to their chunk (each time it reads them); its round trip,
  // the bytes it reads from chunks a store wrote; each chunk it reads counts one more load (up to 255).
  // A store clears its chunks whole.
  for (uint32_t seed : {1u, 2u, 3u, 4u, 5u, 6u}) {
    CAPTURE(seed);
    auto s = Simulator::from_preset("trn2", {"analysis.min_saving_percent=0", "analysis.reload_chunk_bytes=64B"},
                                    [] {
                                      SimOptions o;
                                      o.numerics = false;
                                      o.dependency_bound = true;
                                      return o;
                                    }());
    engines::Analyzer an(*s);
    const int64_t rows = 96, cols = 600, eb = 4;
    const auto& w = s->alloc_hbm("w", {rows, cols}, DType::kFloat32);
    const uint32_t load_line = s->add_source(SourceLoc{"k.py", 3, "kernel"});
    const uint32_t store_line = s->add_source(SourceLoc{"k.py", 4, "kernel"});
    const Operand tile = s->alloc_tile(Space::kSbuf, 128, {cols}, DType::kFloat32);
    const auto nchunks = static_cast<size_t>((w.addr + w.bytes) / 64 + 1);
    std::vector<uint8_t> loaded(static_cast<size_t>(w.addr + w.bytes), 0), loads(nchunks, 0), written(nchunks, 0);
    double reload = 0, roundtrip = 0;
    int times = 0;
    std::mt19937 rng(seed);
    auto pick = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
    for (int op = 0; op < 200; ++op) {
      const bool store = pick(0, 3) == 0;
      const int64_t kind = pick(0, 9);  // 0-6 step 1, 7-8 every other row, 9 broadcast (loads)
      const int64_t step = kind <= 6 ? 1 : kind <= 8 || store ? 2 : 0;
      const int64_t r0 = pick(0, rows - 1);
      const int64_t n = step == 0 ? pick(1, 128) : pick(1, step == 1 ? rows - r0 : (rows - 1 - r0) / 2 + 1);
      const bool whole = pick(0, 1) == 0;
      const int64_t c0 = whole ? 0 : pick(0, cols - 1), m = whole ? cols : pick(1, cols - c0);
      Operand h = w.whole();
      h.offset = w.addr + (r0 * cols + c0) * eb;
      h.num_partitions = static_cast<uint32_t>(n);
      h.partition_step = step * cols;
      h.size[0] = m;
      Operand t = Operand::tile(Space::kSbuf, DType::kFloat32, tile.offset, 0, static_cast<uint32_t>(n), {m});
      Instr d = instr(Opcode::kDmaCopy, Engine::kSync, {store ? h : t, store ? t : h});
      d.loc = store ? store_line : load_line;
      s->submit(d);
      // The reference.
      std::vector<char> touched(nchunks, 0);
      std::vector<size_t> bytes;
      for (int64_t r = 0; r < n; ++r)
        for (int64_t b = 0; b < m * eb; ++b) bytes.push_back(static_cast<size_t>(h.offset + r * step * cols * eb + b));
      if (store) {
        for (size_t b : bytes) touched[b / 64] = 1;
        for (size_t c = 0; c < nchunks; ++c)
          if (touched[c]) {
            loads[c] = 0;
            written[c] = 1;
            for (size_t b = c * 64; b < std::min(loaded.size(), c * 64 + 64); ++b) loaded[b] = 0;
          }
        continue;
      }
      for (size_t b : bytes) {
        reload += loaded[b];
        roundtrip += written[b / 64];
        touched[b / 64] = 1;
      }
      for (size_t c = 0; c < nchunks; ++c)
        if (touched[c]) {
          loads[c] = static_cast<uint8_t>(std::min(255, loads[c] + 1));
          times = std::max<int>(times, loads[c]);
        }
      for (size_t b : bytes) loaded[b] = 1;
    }
    s->finish();
    const engines::AnalysisReport r = an.report();
    double got_reload = 0, got_times = 0, got_roundtrip = 0;
    for (const auto& f : r.findings)
      for (const auto& [k, v] : f.metrics) {
        if (f.kind == "redundant_dma" && k == "reload_bytes") got_reload = v;
        if (f.kind == "redundant_dma" && k == "times_loaded") got_times = v;
        if (f.kind == "hbm_roundtrip" && k == "roundtrip_bytes") got_roundtrip = v;
      }
    REQUIRE(reload > 0);
    REQUIRE(roundtrip > 0);
    CHECK(got_reload == reload);
    CHECK(got_times == times);
    CHECK(got_roundtrip == roundtrip);
  }
}
