// Scheduling behaviour: overlap of independent engines, serialisation of dependency chains,
// preset switching, and bad input through the Simulator.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "kernel_builder.h"

using namespace nsim;
using namespace nsim::test;

TEST_CASE("a DMA-bound and a compute-bound stream overlap: total ~ the longer one", "[timing][overlap]") {
  // Stream A: 16 independent loads of [128, 2048] fp32 (8 KiB/partition) into rotating buffers.
  // Stream B: 40 independent fp32 tensor_tensor ops on other tiles.
  auto run = [](bool dma, bool compute) {
    auto s = make_sim("trn2");
    const auto& h = s->alloc_hbm("x", {128, 2048}, DType::kFloat32);
    Operand buf[2] = {s->alloc_tile(Space::kSbuf, 128, {2048}, DType::kFloat32),
                      s->alloc_tile(Space::kSbuf, 128, {2048}, DType::kFloat32)};
    Operand a = s->alloc_tile(Space::kSbuf, 128, {2048}, DType::kFloat32);
    Operand b = s->alloc_tile(Space::kSbuf, 128, {2048}, DType::kFloat32);
    Operand c = s->alloc_tile(Space::kSbuf, 128, {2048}, DType::kFloat32);
    for (int i = 0; i < 40; ++i) {
      if (dma && i < 16) {
        Instr ld = instr(Opcode::kDmaCopy, Engine::kSync, {buf[i % 2], hbm_rows(h, 0, 128)});
        ld.dma_queue = static_cast<uint8_t>(i % 4);
        s->submit(ld);
      }
      if (compute) {
        Instr tt = instr(Opcode::kTensorTensor, Engine::kVector, {c, a, b});
        tt.alu0 = AluOp::kAdd;
        s->submit(tt);
      }
    }
    s->finish();
    return s->total_time();
  };
  const sim::Ps t_dma = run(true, false), t_cmp = run(false, true), t_both = run(true, true);
  INFO("dma " << ns(t_dma) << " ns, compute " << ns(t_cmp) << " ns, both " << ns(t_both) << " ns");
  CHECK(t_both < t_dma + t_cmp);
  CHECK(static_cast<double>(t_both) <= 1.05 * static_cast<double>(std::max(t_dma, t_cmp)));
}

TEST_CASE("a dependency chain across engines serialises with hand-off latencies", "[timing][deps]") {
  // DMA load -> Vector -> Scalar -> GpSimd -> Vector, each consuming the previous result.
  auto s = make_sim("trn2");
  const auto& h = s->alloc_hbm("x", {128, 512}, DType::kFloat32);
  Operand t0 = s->alloc_tile(Space::kSbuf, 128, {512}, DType::kFloat32);
  Operand t1 = s->alloc_tile(Space::kSbuf, 128, {512}, DType::kFloat32);
  Operand t2 = s->alloc_tile(Space::kSbuf, 128, {512}, DType::kFloat32);
  Operand t3 = s->alloc_tile(Space::kSbuf, 128, {512}, DType::kFloat32);
  InstrTiming d = s->submit(instr(Opcode::kDmaCopy, Engine::kSync, {t0, hbm_rows(h, 0, 128)}));
  Instr v = instr(Opcode::kTensorScalar, Engine::kVector, {t1, t0});
  v.alu0 = AluOp::kMultiply;
  v.flags = isa::kHasImm0;
  InstrTiming iv = s->submit(v);
  Instr a = instr(Opcode::kActivation, Engine::kScalar, {t2, t1});
  a.act = isa::ActFunc::kCopy;
  InstrTiming ia = s->submit(a);
  Instr g = instr(Opcode::kTensorScalar, Engine::kGpsimd, {t3, t2});
  g.alu0 = AluOp::kAdd;
  g.flags = isa::kHasImm0;
  InstrTiming ig = s->submit(g);
  Operand t4 = s->alloc_tile(Space::kSbuf, 128, {512}, DType::kFloat32);
  Instr v2 = v;
  v2.opnd[0] = t4;
  InstrTiming iv2 = s->submit(v2);  // reads t0 again: no wait on the chain, only on VectorE order
  v2.opnd[0] = t1;                  // overwrites t1, which ScalarE read: WAR waits for its last read
  InstrTiming iv3 = s->submit(v2);
  // Each consumer starts at its producer's end + latency: DMA -> 300 ns, engine -> engine 30 ns.
  CHECK(iv.start == d.end + 300'000);
  CHECK(ia.start == iv.end + 30'000);
  CHECK(ig.start == ia.end + 30'000);
  CHECK(iv2.start == iv.issue);
  // A write-after-read waits for the reader's last read, the end of its busy time (its pipeline's fixed latency
  // after that writes, not reads: neuroncore.md 2.2, a semaphore updated at read releases WAR early).
  CHECK(iv3.start == ia.issue + 30'000);
  CHECK(ia.issue < ia.end);
  // Vector fp32 N=512 on trn2: 512 cycles busy + 100 latency = 612 cycles @ 0.96 GHz = 637.5 ns.
  CHECK(ns(iv.end - iv.start) == Approx(637.5).margin(0.01));
}

TEST_CASE("WAR: a DMA overwriting a buffer waits for its last reader", "[timing][deps]") {
  auto s = make_sim("trn2");
  const auto& h = s->alloc_hbm("x", {128, 512}, DType::kFloat32);
  Operand t0 = s->alloc_tile(Space::kSbuf, 128, {512}, DType::kFloat32);
  Operand t1 = s->alloc_tile(Space::kSbuf, 128, {512}, DType::kFloat32);
  s->submit(instr(Opcode::kDmaCopy, Engine::kSync, {t0, hbm_rows(h, 0, 128)}));
  Instr v = instr(Opcode::kTensorScalar, Engine::kVector, {t1, t0});
  v.alu0 = AluOp::kMultiply;
  v.flags = isa::kHasImm0;
  InstrTiming iv = s->submit(v);
  InstrTiming d2 = s->submit(instr(Opcode::kDmaCopy, Engine::kSync, {t0, hbm_rows(h, 0, 128)}));
  // Vector -> Sync semaphore hand-off after VectorE's last read of t0: the end of its busy time (512 cycles), not of
  // its fixed latency (100 more cycles, the writes of t1).
  CHECK(d2.start == iv.issue + 30'000);
  CHECK(ns(iv.end - iv.issue) == Approx(100 / 0.96).margin(0.01));
}

TEST_CASE("WAR after a matmul: the moving tile is free once TensorE has streamed it in", "[timing][deps]") {
  // A matmul reads its moving tile during its II (N = 512 columns: 512 cycles at 2.4 GHz = 213.3 ns, trn2 with the
  // power throttle off); its fixed latency after that writes PSUM. A VectorE write of the moving tile waits for
  // start + II + 30 ns, not the matmul's end; a VectorE read of the PSUM result waits for the end (RAW).
  SimOptions o;
  o.numerics = false;
  o.dependency_bound = true;
  auto run = [&](bool read_back) {
    auto s = Simulator::from_preset("trn2", {"tensor.throttle.enabled=false"}, o);
    Operand st = s->alloc_tile(Space::kSbuf, 128, {128}, DType::kBFloat16);
    Operand mv = s->alloc_tile(Space::kSbuf, 128, {512}, DType::kBFloat16);
    Operand ps = s->alloc_tile(Space::kPsum, 128, {512}, DType::kFloat32);
    Operand sb = s->alloc_tile(Space::kSbuf, 128, {512}, DType::kFloat32);
    const InstrTiming ls = s->submit(instr(Opcode::kLoadStationary, Engine::kTensor, {st}));
    const InstrTiming mm = s->submit(instr(Opcode::kMultiplyMoving, Engine::kTensor, {ps, mv}));
    const InstrTiming wv = s->submit(instr(Opcode::kMemset, Engine::kVector, {mv}));
    CHECK(ns(mm.issue - mm.start) == Approx(512 / 2.4).margin(0.01));
    CHECK(mm.issue < mm.end);
    CHECK(wv.start == mm.issue + 30'000);
    if (read_back) {
      const InstrTiming rd = s->submit(instr(Opcode::kTensorCopy, Engine::kVector, {sb, ps}));
      CHECK(rd.start >= mm.end + 30'000);
    }
    s->finish();
    if (!read_back) {
      // The dependency bound (no engine queues, every instruction when its operands allow) takes the same rule:
      // the memset from the matmul's II + 30 ns, the matmul from 0 (the stationary load writes no memory).
      const sim::Ps want = std::max({ls.end - ls.start, mm.end - mm.start, (mm.issue - mm.start) + 30'000 + (wv.end - wv.start)});
      CHECK(s->dependency_bound() == want);
      CHECK(want < (mm.end - mm.start) + 30'000 + (wv.end - wv.start));
    }
  };
  run(false);
  run(true);
}

TEST_CASE("WAW in HBM: a DMA waits for an earlier DMA's write of the same bytes, not of other bytes", "[timing][deps]") {
  // Stores of [128, 32] fp32 column blocks of out [128, 1024] on four queues: each block's rows span every other
  // block's byte extent (and share its 4 KiB dependency chunks), but no byte is written twice: no store waits for
  // another's end (they still share the DMA engines). The same block stored again waits for its first store, though
  // the chunks' last writer is another block's store (engines::Footprints keeps the recent writes' footprints).
  auto s = make_sim("trn2");
  const auto& out = s->alloc_hbm("out", {128, 1024}, DType::kFloat32);
  const Operand t = s->alloc_tile(Space::kSbuf, 128, {32}, DType::kFloat32);
  const auto block = [&](int j) {
    Operand o = hbm_rows(out, 0, 128);
    o.offset += j * 32 * 4;
    o.size[0] = 32;
    return o;
  };
  std::vector<InstrTiming> st;
  for (int j = 0; j < 4; ++j) {
    Instr d = instr(Opcode::kDmaCopy, Engine::kSync, {block(j), t});
    d.dma_queue = static_cast<uint8_t>(j);
    st.push_back(s->submit(d));
  }
  for (int j = 1; j < 4; ++j) CHECK(st[static_cast<size_t>(j)].ready < st[0].end);  // no WAW wait
  Instr again = instr(Opcode::kDmaCopy, Engine::kSync, {block(2), t});
  again.dma_queue = 3;
  const InstrTiming t2 = s->submit(again);
  CHECK(t2.ready >= st[2].end);  // the same bytes: after the earlier store of them
  CHECK(t2.waited_for == 2);

  // Footprints::disjoint: extents apart; column blocks of one pitch; the same bytes; unequal pitches (unsure).
  using engines::Footprints;
  const Footprints::Footprint a = Footprints::of(block(0)), b = Footprints::of(block(1)), c = Footprints::of(block(0));
  CHECK(Footprints::disjoint(a, b));
  CHECK_FALSE(Footprints::disjoint(a, c));
  Operand rows_a = hbm_rows(out, 0, 1), rows_b = hbm_rows(out, 1, 1);
  CHECK(Footprints::disjoint(Footprints::of(rows_a), Footprints::of(rows_b)));  // extents apart
  Operand wide = block(0);
  wide.size[0] = 48;  // columns 0..47: meets block 1 (32..63)
  CHECK_FALSE(Footprints::disjoint(Footprints::of(wide), b));
  Operand other_pitch = block(1);
  other_pitch.partition_step = 512;
  other_pitch.num_partitions = 64;
  CHECK_FALSE(Footprints::disjoint(a, Footprints::of(other_pitch)));
}

TEST_CASE("RAW and WAR in HBM: a DMA waits for earlier DMAs of the same bytes, not of other bytes", "[timing][deps]") {
  // An in-place update of x [128, 1024] fp32 in column blocks of 32: the store of block 0 and the load of block 1
  // share every 4 KiB dependency chunk of x (each block's rows span the others'), but no byte. The load of block 1
  // does not wait for the store of block 0 (RAW on other bytes), and a store of block 1 issued while a load of
  // block 2 is in flight does not wait for that load (WAR on other bytes); the load of block 0 again and a store of
  // block 2 do wait (the same bytes), although another block's access is the chunks' latest.
  auto s = make_sim("trn2");
  const auto& x = s->alloc_hbm("x", {128, 1024}, DType::kFloat32);
  const Operand t0 = s->alloc_tile(Space::kSbuf, 128, {32}, DType::kFloat32);
  const Operand t1 = s->alloc_tile(Space::kSbuf, 128, {32}, DType::kFloat32);
  const Operand t2 = s->alloc_tile(Space::kSbuf, 128, {32}, DType::kFloat32);
  const auto block = [&](int j) {
    Operand o = hbm_rows(x, 0, 128);
    o.offset += j * 32 * 4;
    o.size[0] = 32;
    return o;
  };
  const auto dma = [&](Operand dst, Operand src, int q) {
    Instr d = instr(Opcode::kDmaCopy, Engine::kSync, {dst, src});
    d.dma_queue = static_cast<uint8_t>(q);
    return s->submit(d);
  };
  const InstrTiming st0 = dma(block(0), t0, 0);
  const InstrTiming ld1 = dma(t1, block(1), 1);
  CHECK(ld1.ready < st0.end);  // RAW on other bytes: no wait for the store
  const InstrTiming ld0 = dma(t2, block(0), 2);
  CHECK(ld0.ready >= st0.end);  // RAW on the same bytes (the chunks' latest write is block 0's: no skip needed)
  const InstrTiming ld2 = dma(t0, block(2), 3);
  const InstrTiming st1 = dma(block(1), t1, 0);
  CHECK(st1.ready < ld2.end);  // WAR on other bytes: the load of block 2 still in flight
  CHECK(st1.ready >= ld1.end);  // WAR on its own bytes: after the load of block 1 (and t1's producer)
  const InstrTiming st2 = dma(block(2), t2, 1);
  CHECK(st2.ready >= ld2.end);  // WAR on the same bytes: after the load of block 2, though block 1's store is later
  CHECK(st2.waited_for == 3);
}

TEST_CASE("WAW on chip: DMAs writing other partitions of one tile do not wait for each other", "[timing][deps]") {
  // Rows loaded one DMA at a time into t [128, 64] fp32 (t[r:r + 1, :] = x[r]): partitions 0..3 share their
  // quadrant's dependency chunks, but no byte. A memset of the whole tile comes first: each row load waits for it
  // (the tile's earlier writer, hidden behind the other rows' loads: the floor of the load it skips), not for
  // the previous row's load; a second load of row 1 waits for the first.
  auto s = make_sim("trn2");
  const auto& x = s->alloc_hbm("x", {128, 64}, DType::kFloat32);
  const Operand t = s->alloc_tile(Space::kSbuf, 128, {64}, DType::kFloat32);
  Instr ms = instr(Opcode::kMemset, Engine::kVector, {t});
  const InstrTiming m = s->submit(ms);
  const auto row = [&](int r) {
    Operand o = t;
    o.start_partition = static_cast<uint16_t>(r);
    o.num_partitions = 1;
    return o;
  };
  std::vector<InstrTiming> ld;
  for (int r = 0; r < 4; ++r) {
    Instr d = instr(Opcode::kDmaCopy, Engine::kSync, {row(r), hbm_rows(x, r, 1)});
    d.dma_queue = static_cast<uint8_t>(r);
    ld.push_back(s->submit(d));
  }
  for (int r = 0; r < 4; ++r) CHECK(ld[static_cast<size_t>(r)].ready >= m.end);  // after the memset
  for (int r = 1; r < 4; ++r) CHECK(ld[static_cast<size_t>(r)].ready < ld[0].end);  // not after row 0's load
  Instr again = instr(Opcode::kDmaCopy, Engine::kSync, {row(1), hbm_rows(x, 1, 1)});
  again.dma_queue = 1;
  const InstrTiming a = s->submit(again);
  CHECK(a.ready >= ld[1].end);  // the same bytes
  CHECK(a.waited_for == 2);
  // Footprints::disjoint on chip: other partitions, other bytes of a partition, another space.
  using engines::Footprints;
  CHECK(Footprints::disjoint(Footprints::of(row(0)), Footprints::of(row(1))));
  CHECK_FALSE(Footprints::disjoint(Footprints::of(row(1)), Footprints::of(t)));
  Operand left = t, right = t;
  left.size[0] = 32;
  right.size[0] = 32;
  right.offset += 32 * 4;
  CHECK(Footprints::disjoint(Footprints::of(left), Footprints::of(right)));
}

TEST_CASE("accumulating matmuls into one PSUM bank are pipelined, not serialised", "[timing][tensor]") {
  auto s = make_sim("trn1");
  Operand st = s->alloc_tile(Space::kSbuf, 128, {128}, DType::kBFloat16);
  Operand mv = s->alloc_tile(Space::kSbuf, 128, {512}, DType::kBFloat16);
  Operand ps = s->alloc_tile(Space::kPsum, 128, {512}, DType::kFloat32);
  s->submit(instr(Opcode::kLoadStationary, Engine::kTensor, {st}));
  Instr mm = instr(Opcode::kMultiplyMoving, Engine::kTensor, {ps, mv});
  InstrTiming a = s->submit(mm);
  mm.flags = isa::kAccumulate;
  InstrTiming b = s->submit(mm);
  CHECK(b.start == a.issue);  // II, not II + latency
  // An eviction by VectorE waits for the last matmul's end + 30 ns.
  Operand out = s->alloc_tile(Space::kSbuf, 128, {512}, DType::kFloat32);
  InstrTiming c = s->submit(instr(Opcode::kTensorCopy, Engine::kVector, {out, ps}));
  CHECK(c.start == b.end + 30'000);
}

TEST_CASE("switching preset changes timing as the spec says, from config alone", "[timing][presets]") {
  // One kernel: a 32 KiB single-engine load, then 10 back-to-back bf16 matmuls, then a bf16 copy.
  struct Result {
    double dma_packet_ns, mm_ii_ns, copy_ns;
  };
  auto run = [](const std::string& preset) {
    auto s = make_sim(preset, {"tensor.throttle.enabled=false"});
    const auto& h = s->alloc_hbm("x", {4, 4096}, DType::kBFloat16);
    Operand d = s->alloc_tile(Space::kSbuf, 4, {4096}, DType::kBFloat16);
    s->submit(instr(Opcode::kDmaCopy, Engine::kSync, {d, hbm_rows(h, 0, 4)}));
    Operand st = s->alloc_tile(Space::kSbuf, 128, {128}, DType::kBFloat16);
    Operand mv = s->alloc_tile(Space::kSbuf, 128, {512}, DType::kBFloat16);
    Operand ps = s->alloc_tile(Space::kPsum, 128, {512}, DType::kFloat32);
    s->submit(instr(Opcode::kLoadStationary, Engine::kTensor, {st}));
    std::vector<InstrTiming> mm;
    for (int i = 0; i < 10; ++i) mm.push_back(s->submit(instr(Opcode::kMultiplyMoving, Engine::kTensor, {ps, mv})));
    Operand a = s->alloc_tile(Space::kSbuf, 128, {2048}, DType::kBFloat16);
    Operand b = s->alloc_tile(Space::kSbuf, 128, {2048}, DType::kBFloat16);
    InstrTiming cp = s->submit(instr(Opcode::kTensorCopy, Engine::kVector, {b, a}));
    s->finish();
    return Result{ns(s->counters().dma[0].active), ns(mm[5].start - mm[4].start), ns(cp.issue - cp.start)};
  };
  const Result r1 = run("trn1"), r2 = run("trn2"), r3 = run("trn3");
  // DMA engine bandwidth 17 / 23 / 33 B/ns: 32768 B -> 1927.5 / 1424.7 / 993.0 ns.
  CHECK(r1.dma_packet_ns == Approx(32768 / 17.0).margin(0.01));
  CHECK(r2.dma_packet_ns == Approx(32768 / 23.0).margin(0.01));
  CHECK(r3.dma_packet_ns == Approx(32768 / 33.0).margin(0.01));
  // TensorE clock 2.8 / 2.4 / 2.4 GHz: 512 cycles -> 182.9 / 213.3 / 213.3 ns.
  CHECK(r1.mm_ii_ns == Approx(512 / 2.8).margin(0.01));
  CHECK(r2.mm_ii_ns == Approx(512 / 2.4).margin(0.01));
  CHECK(r3.mm_ii_ns == Approx(512 / 2.4).margin(0.01));
  // VectorE bf16 copy N=2048: trn1 no perf mode 2048 cycles @1.12; trn2 4x: 512 @0.96; trn3 4x: 512 @1.2.
  CHECK(r1.copy_ns == Approx(2048 / 1.12).margin(0.01));
  CHECK(r2.copy_ns == Approx(512 / 0.96).margin(0.01));
  CHECK(r3.copy_ns == Approx(512 / 1.2).margin(0.01));
}

TEST_CASE("an override changes the model: HBM twice as fast, PE clock higher", "[timing][presets]") {
  auto mm_ii = [](std::vector<std::string> ov) {
    ov.push_back("tensor.throttle.enabled=false");
    auto s = make_sim("trn2", ov);
    Operand st = s->alloc_tile(Space::kSbuf, 128, {128}, DType::kBFloat16);
    Operand mv = s->alloc_tile(Space::kSbuf, 128, {512}, DType::kBFloat16);
    Operand ps = s->alloc_tile(Space::kPsum, 128, {512}, DType::kFloat32);
    s->submit(instr(Opcode::kLoadStationary, Engine::kTensor, {st}));
    InstrTiming a = s->submit(instr(Opcode::kMultiplyMoving, Engine::kTensor, {ps, mv}));
    InstrTiming b = s->submit(instr(Opcode::kMultiplyMoving, Engine::kTensor, {ps, mv}));
    return ns(b.start - a.start);
  };
  CHECK(mm_ii({}) == Approx(213.333).margin(0.01));
  CHECK(mm_ii({"clock.tensor=3.2GHz"}) == Approx(160).margin(0.01));
  // HBM share: 16 engines at 23 B/ns exceed trn2's 362.5 GB/s; at 725 GB/s they do not.
  auto packet = [](std::vector<std::string> ov) {
    auto s = make_sim("trn2", ov);
    const auto& h = s->alloc_hbm("x", {128, 1024}, DType::kFloat32);
    Operand d = s->alloc_tile(Space::kSbuf, 128, {1024}, DType::kFloat32);
    s->submit(instr(Opcode::kDmaCopy, Engine::kSync, {d, hbm_rows(h, 0, 128)}));
    s->finish();
    return ns(s->counters().dma[3].active);
  };
  CHECK(packet({}) == Approx(32768 / (362.5 / 16)).margin(0.01));
  CHECK(packet({"hbm.bw=725GB/s"}) == Approx(32768 / 23.0).margin(0.01));
}

TEST_CASE("timing-only mode gives the same timing as a run with numerics", "[timing]") {
  auto run = [](bool numerics) {
    auto s = make_sim("trn2", {}, numerics);
    const auto& h = s->alloc_hbm("x", {128, 512}, DType::kBFloat16);
    Operand a = s->alloc_tile(Space::kSbuf, 128, {512}, DType::kBFloat16);
    Operand b = s->alloc_tile(Space::kSbuf, 128, {512}, DType::kFloat32);
    s->submit(instr(Opcode::kDmaCopy, Engine::kSync, {a, hbm_rows(h, 0, 128)}));
    Instr e = instr(Opcode::kActivation, Engine::kScalar, {b, a});
    e.act = isa::ActFunc::kExp;
    s->submit(e);
    s->submit(instr(Opcode::kDmaCopy, Engine::kSync, {hbm_rows(h, 0, 128), a}));
    s->finish();
    return s->total_time();
  };
  CHECK(run(true) == run(false));
}

TEST_CASE("bad input raises nsim::Error with a stable code and the source line", "[errors]") {
  auto s = make_sim("trn2", {}, true);
  const uint32_t loc = s->add_source({"kernel.py", 42, "my_kernel"});
  auto code_of = [&](Instr in) -> std::string {
    in.loc = loc;
    try {
      s->submit(in);
    } catch (const Error& e) {
      CHECK(e.loc().line == 42);
      CHECK(std::string(e.what()).find("kernel.py:42") != std::string::npos);
      return e.code_str();
    }
    return "no error";
  };
  Operand a = s->alloc_tile(Space::kSbuf, 128, {512}, DType::kFloat32);
  Operand b = s->alloc_tile(Space::kSbuf, 128, {512}, DType::kFloat32);
  SECTION("access pattern out of bounds (E201)") {
    Operand oob = a;
    oob.offset = s->params().mem.sbuf_bytes_per_partition - 100;
    CHECK(code_of(instr(Opcode::kTensorCopy, Engine::kVector, {b, oob})) == "NSIM-E201");
    const auto& h = s->alloc_hbm("h", {128, 512}, DType::kFloat32);
    Operand hv = hbm_rows(h, 64, 128);  // rows 64..191 of a 128-row tensor
    CHECK(code_of(instr(Opcode::kDmaCopy, Engine::kSync, {a, hv})) == "NSIM-E201");
  }
  SECTION("more than 128 partitions (E202)") {
    Operand wide = a;
    wide.num_partitions = 129;
    CHECK(code_of(instr(Opcode::kTensorCopy, Engine::kVector, {wide, wide})) == "NSIM-E202");
    CHECK_THROWS_AS(s->alloc_tile(Space::kSbuf, 129, {4}, DType::kFloat32), Error);
  }
  SECTION("PSUM bank overflow (E203)") {
    Operand st = s->alloc_tile(Space::kSbuf, 128, {128}, DType::kBFloat16);
    Operand mv = s->alloc_tile(Space::kSbuf, 128, {512}, DType::kBFloat16);
    Operand ps = s->alloc_tile(Space::kPsum, 128, {1024}, DType::kFloat32);
    ps.size[0] = 512;
    ps.offset += 1024;  // 512 fp32 from byte 1024 cross into the next 2 KiB bank
    s->submit(instr(Opcode::kLoadStationary, Engine::kTensor, {st}));
    CHECK(code_of(instr(Opcode::kMultiplyMoving, Engine::kTensor, {ps, mv})) == "NSIM-E203");
  }
  SECTION("SBUF capacity overflow (E204) and PSUM overflow (E206)") {
    try {
      s->alloc_tile(Space::kSbuf, 128, {60000}, DType::kFloat32);
      FAIL("expected an SBUF overflow");
    } catch (const Error& e) {
      CHECK(e.code_str() == "NSIM-E204");
    }
    try {
      s->alloc_tile(Space::kPsum, 128, {8192}, DType::kFloat32);
      FAIL("expected a PSUM overflow");
    } catch (const Error& e) {
      CHECK(e.code_str() == "NSIM-E206");
    }
  }
  SECTION("dtype not accepted by the slot (E302) and buffer not accepted (E301)") {
    Operand st = s->alloc_tile(Space::kSbuf, 128, {128}, DType::kInt32);
    CHECK(code_of(instr(Opcode::kLoadStationary, Engine::kTensor, {st})) == "NSIM-E302");
    CHECK(code_of(instr(Opcode::kMultiplyMoving, Engine::kTensor, {a, b})) == "NSIM-E301");
  }
  SECTION("engine not allowed (E306), shape mismatch (E304)") {
    CHECK(code_of(instr(Opcode::kTensorTensor, Engine::kScalar, {a, a, b})) == "NSIM-E306");
    Operand half = b;
    half.size[0] = 256;
    Instr tt = instr(Opcode::kTensorTensor, Engine::kVector, {a, a, half});
    CHECK(code_of(tt) == "NSIM-E304");
  }
  SECTION("bad access pattern (E207) and unexpected operand (E307)") {
    Operand empty = a;
    empty.size[0] = 0;
    CHECK(code_of(instr(Opcode::kTensorCopy, Engine::kVector, {b, empty})) == "NSIM-E207");
    CHECK(code_of(instr(Opcode::kMemset, Engine::kVector, {a, b})) == "NSIM-E307");
    CHECK_THROWS_AS(s->alloc_tile(Space::kSbuf, 128, {0}, DType::kFloat32), Error);
  }
  SECTION("nothing was corrupted: a valid instruction still runs after errors") {
    Operand oob = a;
    oob.offset = 1 << 30;
    CHECK(code_of(instr(Opcode::kTensorCopy, Engine::kVector, {b, oob})) == "NSIM-E201");
    CHECK_NOTHROW(s->submit(instr(Opcode::kTensorCopy, Engine::kVector, {b, a})));
  }
}

TEST_CASE("unknown config keys and bad units are errors", "[errors][config]") {
  try {
    make_sim("trn2", {"tensor.pe_rowz=64"});
    FAIL("expected E101");
  } catch (const Error& e) {
    CHECK(e.code_str() == "NSIM-E101");
    CHECK(std::string(e.what()).find("tensor.pe_rows") != std::string::npos);  // suggestion
  }
  try {
    make_sim("trn2", {"dma.engine_bw=fast"});
    FAIL("expected E102");
  } catch (const Error& e) {
    CHECK(e.code_str() == "NSIM-E102");
  }
}

TEST_CASE("the trace has one track per engine and DMA queue and slice durations sum to instruction time",
          "[trace]") {
  const std::string path = "nsim_test_trace.json";
  SimOptions o;
  o.numerics = false;
  o.trace_path = path;
  sim::StatsRegistry st;
  {
    auto s = Simulator::from_preset("trn2", {}, o);
    const uint32_t loc = s->add_source({"k.py", 7, "k"});
    const auto& h = s->alloc_hbm("x", {128, 512}, DType::kBFloat16);
    Operand a = s->alloc_tile(Space::kSbuf, 128, {512}, DType::kBFloat16);
    Operand b = s->alloc_tile(Space::kSbuf, 128, {512}, DType::kFloat32);
    Instr ld = instr(Opcode::kDmaCopy, Engine::kSync, {a, hbm_rows(h, 0, 128)});
    ld.loc = loc;
    ld.dma_queue = 3;
    s->submit(ld);
    for (int i = 0; i < 5; ++i) {
      Instr e = instr(Opcode::kActivation, Engine::kScalar, {b, a});
      e.act = isa::ActFunc::kExp;
      e.loc = loc;
      s->submit(e);
      Instr v = instr(Opcode::kTensorScalar, Engine::kVector, {a, b});
      v.alu0 = AluOp::kMultiply;
      v.flags = isa::kHasImm0;
      s->submit(v);
    }
    s->finish();
    st = s->stats();
  }
  std::ifstream f(path);
  REQUIRE(f.good());
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string text = ss.str();
  std::remove(path.c_str());
  CHECK(text.rfind("{\"displayTimeUnit\"", 0) == 0);
  for (const char* track : {"\"tensor\"", "\"vector\"", "\"scalar\"", "\"gpsimd\"", "\"sync\"", "\"dma.e0\"", "\"dma.e15\"",
                            "\"qSyncIO3\""})
    CHECK(text.find(track) != std::string::npos);
  const nlohmann::json events = nlohmann::json::parse(text)["traceEvents"];
  CHECK(std::any_of(events.begin(), events.end(), [](const nlohmann::json& e) {
    return e["ph"] == "X" && e["args"].value("src", "") == "k.py:7 (k)";
  }));
  // Sum "dur" of X events per tid (tid 1 = vector, 2 = scalar) and compare with the stats.
  auto sum_dur = [&](int tid) {
    double sum = 0;
    for (const auto& e : events)  // slices only: flow-arrow events carry a tid and a ts but no duration
      if (e["ph"] == "X" && e["tid"] == tid) sum += e["dur"].get<double>();
    return sum * 1000.0;  // us -> ns
  };
  CHECK(sum_dur(1) == Approx(st.get("engine.vector.instruction_time")).epsilon(1e-6));
  CHECK(sum_dur(2) == Approx(st.get("engine.scalar.instruction_time")).epsilon(1e-6));
  CHECK(st.get("engine.scalar.instruction_count") == 5);
}
