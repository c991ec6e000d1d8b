// Stats in the profiler's vocabulary (neuroncore.md 5.1): each value of a hand-built stream is checked
// against a number derived in a comment from the definitions and the preset values; and
// sim::IntervalUnion, the watermark-folded interval union behind total/DMA active time, on its own.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "kernel_builder.h"
#include "sim/interval_union.h"

using namespace nsim;
using namespace nsim::test;
using sim::IntervalUnion;
using sim::Ps;

namespace {

double stat(const Simulator& s, const std::string& name) { return s.stats().get(name); }

// Every DMA packet of the last DMA instruction, through the listener (start, end) per DMA engine.
struct Packets {
  std::vector<std::pair<Ps, Ps>> all;
  Ps sum() const {
    Ps t = 0;
    for (auto [s, e] : all) t += e - s;
    return t;
  }
};

void record_packets(Simulator& s, Packets& into) {
  s.add_instr_listener([&s, &into](const isa::Instr& in, const InstrTiming&) {
    if (!isa::is_dma(in.op)) return;
    const auto& sp = s.last_dma_split();
    const auto& tr = s.last_dma_transfer();
    for (int k = 0; k < sp.engines; ++k)
      if (sp.piece[static_cast<size_t>(k)].bytes > 0)
        into.all.emplace_back(tr.piece_start[static_cast<size_t>(k)], tr.piece_end[static_cast<size_t>(k)]);
  });
}

// Brute-force union length of a set of intervals.
Ps brute_union(std::vector<std::pair<Ps, Ps>> v) {
  std::sort(v.begin(), v.end());
  Ps total = 0, lo = 0, hi = -1;
  for (auto [s, e] : v) {
    if (e <= s) continue;
    if (hi < 0 || s > hi) {
      if (hi >= 0) total += hi - lo;
      lo = s;
      hi = e;
    } else {
      hi = std::max(hi, e);
    }
  }
  if (hi >= 0) total += hi - lo;
  return total;
}

}  // namespace

// ------------------------------------------------------------------------------------------------
// IntervalUnion
// ------------------------------------------------------------------------------------------------

TEST_CASE("IntervalUnion: out-of-order intervals merge into their union", "[stats][interval]") {
  IntervalUnion u;
  u.add(10, 20);
  u.add(0, 5);
  u.add(30, 40);
  u.add(4, 12);  // bridges [0,5) and [10,20): [0,20)
  CHECK(u.pending() == 2);
  CHECK(u.total() == 20 + 10);
  u.add(1, 2);  // inside
  u.add(40, 45);  // touching the last one: [30,45)
  CHECK(u.pending() == 2);
  CHECK(u.total() == 20 + 15);
  u.add(7, 7);   // empty
  u.add(9, 3);   // reversed
  CHECK(u.total() == 35);
  // One interval spanning several pending ones collapses them.
  IntervalUnion v;
  for (Ps s = 0; s < 10; s += 2) v.add(s, s + 1);  // [0,1) [2,3) ... [8,9)
  CHECK(v.pending() == 5);
  v.add(1, 8);  // [0, 9)
  CHECK(v.pending() == 1);
  CHECK(v.total() == 9);
  v.close();
  CHECK(v.pending() == 0);
  CHECK(v.total() == 9);
  CHECK(v.clipped() == 0);
}

TEST_CASE("IntervalUnion: folding at the watermark finalises what cannot merge any more", "[stats][interval]") {
  IntervalUnion u;
  u.add(0, 5);
  u.add(10, 20);
  u.fold(7);  // [0,5) ends before 7: final; [10,20) may still merge
  CHECK(u.pending() == 1);
  CHECK(u.total() == 15);
  u.add(7, 12);  // starts at the watermark, merges: [7,20)
  CHECK(u.pending() == 1);
  CHECK(u.total() == 5 + 13);
  u.fold(20);  // an interval ending exactly at the watermark is final too (a touching one adds the same)
  CHECK(u.pending() == 0);
  u.add(20, 25);
  CHECK(u.total() == 5 + 13 + 5);
  CHECK(u.clipped() == 0);
  // A broken promise (an interval starting before a folded one's end) is clipped, never counted twice.
  u.add(22, 30);  // pending [20,30)
  u.fold(30);
  u.add(27, 32);  // [27,30) was folded already: only [30,32) counts
  CHECK(u.clipped() == 3);
  CHECK(u.total() == 5 + 13 + 10 + 2);
}

TEST_CASE("IntervalUnion: forwarding feeds the finalised part of one union into another", "[stats][interval]") {
  // d (DMA packets, ahead of time) forwards into a (everything): a ends up with the union of both.
  IntervalUnion a, d;
  d.forward_to(&a);
  a.add(0, 10);   // an engine
  d.add(5, 20);   // packets scheduled ahead
  d.add(30, 40);
  d.fold(12);     // [5, 12) is final in d: forwarded, [12, 20) stays pending
  CHECK(d.pending() == 2);
  a.fold(12);     // after d: a holds [0, 12)
  CHECK(a.total() == 12);
  CHECK(a.pending() == 0);
  d.fold(25);     // [12, 20) forwarded whole
  a.fold(25);
  CHECK(a.total() == 20);
  a.add(28, 33);  // overlaps d's [30, 40), still pending in d
  d.close();
  a.close();
  CHECK(d.total() == 15 + 10);
  CHECK(a.total() == 20 + 12);  // [0, 20) and [28, 40)
  CHECK(a.clipped() == 0);
  CHECK(d.clipped() == 0);
}

TEST_CASE("IntervalUnion: the pending bound folds the earliest interval early", "[stats][interval]") {
  IntervalUnion u(2);
  u.add(0, 1);
  u.add(2, 3);
  u.add(4, 5);  // a third disjoint interval: [0,1) is folded and becomes the floor
  CHECK(u.pending() == 2);
  CHECK(u.total() == 3);
  u.add(0, 10);  // [0,1) is before the floor (clipped, here already counted); [1,10) merges the rest
  CHECK(u.clipped() == 1);
  CHECK(u.pending() == 1);
  CHECK(u.total() == 10);  // exact here: the clipped part was covered
  // At the bound, an interval landing before every pending one is itself the one folded early.
  IntervalUnion v(2);
  v.add(20, 21);
  v.add(30, 31);
  v.add(12, 13);  // the earliest: folded at once, nothing else is
  CHECK(v.pending() == 2);
  CHECK(v.total() == 3);
  v.add(25, 26);  // between the two: [20, 21) is folded early to make room
  CHECK(v.pending() == 2);
  CHECK(v.total() == 4);
  v.add(20, 40);  // [20, 21) is before the floor (21, the end of what was folded): [21, 40) absorbs the rest
  CHECK(v.clipped() == 1);
  CHECK(v.total() == 1 + 1 + 19);
  CHECK(v.pending() == 1);
}

TEST_CASE("IntervalUnion: random intervals under a watermark match a brute-force union", "[stats][interval]") {
  std::mt19937_64 rng(12345);
  for (int round = 0; round < 20; ++round) {
    IntervalUnion u;
    std::vector<std::pair<Ps, Ps>> all;
    Ps wm = 0;
    size_t max_pending = 0;
    for (int i = 0; i < 2000; ++i) {
      const Ps s = wm + static_cast<Ps>(rng() % 500);
      const Ps e = s + static_cast<Ps>(rng() % 120);
      u.add(s, e);
      all.emplace_back(s, e);
      if (rng() % 4 == 0) {
        wm += static_cast<Ps>(rng() % 60);
        u.fold(wm);
      }
      max_pending = std::max(max_pending, u.pending());
      if (i % 500 == 0) CHECK(u.total() == brute_union(all));
    }
    u.close();
    CHECK(u.total() == brute_union(all));
    CHECK(u.clipped() == 0);
    CHECK(max_pending < 100);  // only what can still merge stays
  }
}

TEST_CASE("IntervalUnion: intervals landing deep in a long pending list match a brute-force union", "[stats][interval]") {
  // Far-future intervals (DMA packets scheduled ahead) keep hundreds pending; the searches of merge()
  // then go past their few linear steps into a binary search. Some intervals span many pending ones.
  std::mt19937_64 rng(777);
  for (int round = 0; round < 10; ++round) {
    IntervalUnion u;
    std::vector<std::pair<Ps, Ps>> all;
    Ps wm = 0;
    size_t max_pending = 0;
    for (int i = 0; i < 4000; ++i) {
      const Ps s = wm + static_cast<Ps>(rng() % 100000);
      const Ps e = s + static_cast<Ps>(rng() % 10 == 0 ? rng() % 3000 : rng() % 40);
      u.add(s, e);
      all.emplace_back(s, e);
      if (rng() % 8 == 0) {
        wm += static_cast<Ps>(rng() % 100);
        u.fold(wm);
      }
      max_pending = std::max(max_pending, u.pending());
      if (i % 400 == 0) CHECK(u.total() == brute_union(all));
    }
    u.close();
    CHECK(u.total() == brute_union(all));
    CHECK(u.clipped() == 0);
    CHECK(max_pending > 150);  // the long lists this case is about
  }
}

// ------------------------------------------------------------------------------------------------
// DMA active time: the union over DMA engines
// ------------------------------------------------------------------------------------------------

TEST_CASE("dma.active_time is the union of packets over DMA engines, not their sum", "[stats][dma]") {
  // trn2: a [8, 1024] fp32 load (32 KiB) into SBUF partitions 0-7 is one packet on DMA engine 0;
  // into partitions 8-15, one packet on engine 1 (dma.partitions_per_engine = 8). Each engine moves at min(dma.engine_bw 23 B/ns, hbm.bw 362.5 / 2 engines) = 23 B/ns:
  // packet d = 32768 / 23 = 1424.696 ns. dma.setup = 800 ns after the trigger starts.
  const double d = 32768 / 23.0;
  auto s = make_sim("trn2");
  const auto& h = s->alloc_hbm("x", {128, 1024}, DType::kFloat32);
  Operand a = s->alloc_tile(Space::kSbuf, 8, {1024}, DType::kFloat32);
  Operand b = s->alloc_tile(Space::kSbuf, 16, {1024}, DType::kFloat32);
  b.start_partition = 8;
  b.num_partitions = 8;
  Instr la = instr(Opcode::kDmaCopy, Engine::kSync, {a, hbm_rows(h, 0, 8)});
  Instr lb = instr(Opcode::kDmaCopy, Engine::kSync, {b, hbm_rows(h, 8, 8)});
  lb.dma_queue = 1;

  SECTION("two Sync triggers 80 ns apart") {
    // A: trigger [0, 80) on Sync, packet [800, 800 + d) on engine 0.
    // B: trigger [80, 160) (sync.trigger_instr = 80 ns), setup on queue 1 from 80: packet [880, 880 + d) on engine 1.
    // Union of packets = [800, 880 + d) = 80 + d = 1504.696 ns; the sum would be 2 d = 2849.4 ns.
    s->submit(la);
    s->submit(lb);
    s->finish();
    CHECK(stat(*s, "dma.engine0.active_time") == Approx(d).margin(0.01));
    CHECK(stat(*s, "dma.engine1.active_time") == Approx(d).margin(0.01));
    CHECK(stat(*s, "dma.max_engine_active_time") == Approx(d).margin(0.01));
    CHECK(stat(*s, "dma.active_time") == Approx(80 + d).margin(0.01));
    // total_time = end of B = 880 + d; total_active_time = triggers [0, 160) + packets [800, 880 + d).
    const double total = 880 + d;
    CHECK(stat(*s, "total_time") == Approx(total).margin(0.01));
    CHECK(stat(*s, "dma.active_time_percent") == Approx(100 * (80 + d) / total).margin(1e-3));
    CHECK(stat(*s, "total_active_time") == Approx(160 + 80 + d).margin(0.01));
    CHECK(stat(*s, "total_active_time_percent") == Approx(100 * (240 + d) / total).margin(1e-3));
    CHECK(stat(*s, "total_exec_time") == Approx(total).margin(0.01));  // the first instruction starts at 0
    // Both are static (Sync-triggered) transfers on two queues.
    CHECK(stat(*s, "dma.static_active_time") == Approx(80 + d).margin(0.01));
    CHECK(stat(*s, "dma.hardware_dynamic_active_time") == 0);
    CHECK(stat(*s, "dma.software_dynamic_active_time") == 0);
    CHECK(stat(*s, "dma.dma_queue_count") == 2);
    // Bytes: 2 x 32768 read from HBM; average transfer 32768 B.
    CHECK(stat(*s, "memory.hbm_read_bytes") == 65536);
    CHECK(stat(*s, "dma.transfer_average_bytes") == 32768);
    // MBU = HBM bytes / total_time / hbm.bw = 65536 / 2304.696 ns / 362.5 B/ns = 7.84%.
    CHECK(stat(*s, "memory.mbu_estimated_percent") == Approx(100.0 * 65536 / total / 362.5).margin(1e-3));
  }
  SECTION("a Sync and a Scalar trigger: fully overlapping packets count once") {
    // B on ScalarE: trigger [0, 600) (dma.hwdge_instr), setup from 0 -> packet [800, 800 + d) on engine 1,
    // exactly over A's packet on engine 0 (engine 0 is busy then, so 2 engines share HBM: still 23 B/ns).
    s->submit(la);
    lb.engine = Engine::kScalar;
    s->submit(lb);
    s->finish();
    CHECK(stat(*s, "dma.active_time") == Approx(d).margin(0.01));
    CHECK(stat(*s, "dma.static_active_time") == Approx(d).margin(0.01));
    CHECK(stat(*s, "dma.hardware_dynamic_active_time") == Approx(d).margin(0.01));
    CHECK(stat(*s, "dma.software_dynamic_active_time") == 0);
    // Engines: Sync [0, 80), Scalar [0, 600); packets [800, 800 + d): 600 + d.
    CHECK(stat(*s, "total_active_time") == Approx(600 + d).margin(0.01));
    CHECK(stat(*s, "total_time") == Approx(800 + d).margin(0.01));
  }
}

TEST_CASE("an accumulating DMA (a scatter-add) counts its destination's bytes as read and written", "[stats][dma]") {
  // A store SBUF -> HBM of [8, 1024] fp32 (32 KiB): 32768 B read from SBUF, written to HBM. The same store
  // accumulating (dst += src: nisa.dma_compute, dst_rmw_op) also reads the 32 KiB of HBM it adds to.
  auto s = make_sim("trn2");
  const auto& h = s->alloc_hbm("y", {128, 1024}, DType::kFloat32);
  Operand t = s->alloc_tile(Space::kSbuf, 8, {1024}, DType::kFloat32);
  Instr st = instr(Opcode::kDmaCopy, Engine::kSync, {hbm_rows(h, 0, 8), t});
  s->submit(st);
  Instr acc = instr(Opcode::kDmaCopy, Engine::kSync, {hbm_rows(h, 8, 8), t});
  acc.flags = isa::kAccumulate;
  s->submit(acc);
  s->finish();
  CHECK(stat(*s, "memory.sbuf_read_bytes") == 2 * 32768);
  CHECK(stat(*s, "memory.hbm_write_bytes") == 2 * 32768);
  CHECK(stat(*s, "memory.hbm_read_bytes") == 32768);  // the accumulating store's read of its destination
}

TEST_CASE("a DMA packet that fills an earlier gap of its DMA engine counts in the engine's active time",
          "[stats][dma]") {
  // One DMA engine (partitions 0-7), three 2 KiB loads (packet d = 2048 / 23 = 89 ns). T1 (Sync,
  // queue 0) triggers at 0: setup 800 ns, packet [800, 800 + d), then the engine idles
  // dma.transfer_gap = 60 ns. T2 (Sync, queue 0) waits for queue 0's setup (800 + 60 = 860 ns):
  // packet at 860 + 800 = 1660 ns. T3 (Scalar, queue 1) triggers at 0: setup ends at 800 ns, engine 0
  // is free from 800 + d + 60 = 949 ns, and T3's packet fits in the idle gap before T2's: it starts
  // before a packet scheduled earlier in program order. Every packet counts: the engine's active time
  // = the sum of its packets (they never overlap on one engine); dma.active_time = their union = the same.
  auto s = make_sim("trn2");
  Packets pk;
  record_packets(*s, pk);
  const auto& h = s->alloc_hbm("x", {128, 64}, DType::kFloat32);
  Operand t[3];
  for (auto& x : t) x = s->alloc_tile(Space::kSbuf, 8, {64}, DType::kFloat32);
  Instr t1 = instr(Opcode::kDmaCopy, Engine::kSync, {t[0], hbm_rows(h, 0, 8)});
  Instr t2 = instr(Opcode::kDmaCopy, Engine::kSync, {t[1], hbm_rows(h, 0, 8)});
  Instr t3 = instr(Opcode::kDmaCopy, Engine::kScalar, {t[2], hbm_rows(h, 0, 8)});
  t3.dma_queue = 1;
  s->submit(t1);
  s->submit(t2);
  s->submit(t3);
  s->finish();
  REQUIRE(pk.all.size() == 3);
  CHECK(pk.all[0].first == 800'000);
  CHECK(pk.all[1].first == 1'660'000);
  CHECK(pk.all[2].first == pk.all[0].second + 60'000);  // scheduled third, starts second
  CHECK(pk.all[2].second <= pk.all[1].first);
  CHECK(stat(*s, "dma.engine0.active_time") == Approx(ns(pk.sum())).margin(1e-3));
  CHECK(stat(*s, "dma.active_time") == Approx(ns(pk.sum())).margin(1e-3));
  CHECK(stat(*s, "dma.max_engine_active_time") == Approx(ns(pk.sum())).margin(1e-3));
}

// ------------------------------------------------------------------------------------------------
// FLOPs: hardware / model / transpose, adjusted, HFU / MFU, intensity, MBU
// ------------------------------------------------------------------------------------------------

TEST_CASE("FLOP stats of a bf16 matmul, a PE transpose and an fp32 matmul", "[stats][flops]") {
  // trn2 without throttling. HBM: load the bf16 moving tile [128, 512] (131072 B read); TensorE: bf16
  // matmul K=128, M=128, N=512 -> 2*128*128*512 = 16777216 FLOPs; PE transpose of [128,128] bf16 ->
  // 2*128*128*128 = 4194304 FLOPs; fp32 matmul of the same shape -> 16777216 FLOPs; store its fp32
  // [128, 512] PSUM result to HBM (262144 B written).
  auto s = make_sim("trn2", {"tensor.throttle.enabled=false"});
  const auto& hx = s->alloc_hbm("x", {128, 512}, DType::kBFloat16);
  const auto& hy = s->alloc_hbm("y", {128, 512}, DType::kFloat32);
  Operand st = s->alloc_tile(Space::kSbuf, 128, {128}, DType::kBFloat16);
  Operand mv = s->alloc_tile(Space::kSbuf, 128, {512}, DType::kBFloat16);
  Operand st32 = s->alloc_tile(Space::kSbuf, 128, {128}, DType::kFloat32);
  Operand mv32 = s->alloc_tile(Space::kSbuf, 128, {512}, DType::kFloat32);
  Operand ps = s->alloc_tile(Space::kPsum, 128, {512}, DType::kFloat32);
  Operand ps2 = s->alloc_tile(Space::kPsum, 128, {512}, DType::kFloat32);
  Operand pt = s->alloc_tile(Space::kPsum, 128, {128}, DType::kBFloat16);
  s->submit(instr(Opcode::kDmaCopy, Engine::kSync, {mv, hx.whole()}));
  s->submit(instr(Opcode::kLoadStationary, Engine::kTensor, {st}));
  s->submit(instr(Opcode::kMultiplyMoving, Engine::kTensor, {ps, mv}));
  s->submit(instr(Opcode::kNcTranspose, Engine::kTensor, {pt, st}));
  s->submit(instr(Opcode::kLoadStationary, Engine::kTensor, {st32}));
  s->submit(instr(Opcode::kMultiplyMoving, Engine::kTensor, {ps2, mv32}));
  s->submit(instr(Opcode::kDmaCopy, Engine::kSync, {hy.whole(), ps2}));
  s->finish();

  const double mm = 16777216, tr = 4194304;
  CHECK(stat(*s, "flops.hardware") == 2 * mm + tr);
  CHECK(stat(*s, "flops.transpose") == tr);
  CHECK(stat(*s, "flops.model") == 2 * mm);
  CHECK(stat(*s, "engine.matmul_instruction_count") == 2);
  CHECK(stat(*s, "engine.tensor.instruction_count") == 5);
  // Adjusted (bf16 equivalents): bf16 x1, the bf16 transpose x1, the fp32 matmul x4 (tensor.adjusted_flops_fp32).
  CHECK(stat(*s, "flops.adjusted_hardware") == mm + tr + 4 * mm);
  CHECK(stat(*s, "flops.adjusted_transpose") == tr);

  // Peak = 2 x 128 x 128 x 2.4 GHz = 78.6432 TFLOP/s; HBM 362.5 GB/s -> ridge 216.946 FLOP/B.
  const double peak = 2.0 * 128 * 128 * 2.4e9, bw = 362.5e9;
  const double total_s = stat(*s, "total_time") * 1e-9;
  CHECK(stat(*s, "flops.peak_flops_bandwidth_ratio") == Approx(peak / bw).epsilon(1e-9));
  CHECK(stat(*s, "flops.peak_flops_bandwidth_ratio") == Approx(216.946).margin(1e-3));
  // HFU counts the transpose, MFU does not.
  CHECK(stat(*s, "flops.hfu_estimated_percent") == Approx(100 * (2 * mm + tr) / (peak * total_s)).epsilon(1e-9));
  CHECK(stat(*s, "flops.mfu_estimated_percent") == Approx(100 * (2 * mm) / (peak * total_s)).epsilon(1e-9));
  CHECK(stat(*s, "flops.hfu_estimated_percent") > stat(*s, "flops.mfu_estimated_percent"));
  // Intensity = (hardware - transpose) / HBM bytes = 33554432 / (131072 + 262144) = 85.333 FLOP/B.
  const double hbm = 131072 + 262144;
  CHECK(stat(*s, "memory.hbm_read_bytes") == 131072);
  CHECK(stat(*s, "memory.hbm_write_bytes") == 262144);
  CHECK(stat(*s, "flops.mm_arithmetic_intensity") == Approx(2 * mm / hbm).epsilon(1e-12));
  CHECK(stat(*s, "flops.mm_arithmetic_intensity") == Approx(85.333).margin(1e-3));
  // MFU the traffic allows = intensity / ridge = 85.333 / 216.946 = 39.33%.
  CHECK(stat(*s, "flops.mfu_max_achievable_estimated_percent") == Approx(100 * (2 * mm / hbm) / (peak / bw)).epsilon(1e-9));
  CHECK(stat(*s, "flops.mfu_max_achievable_estimated_percent") == Approx(39.334).margin(1e-3));
  // MBU = HBM bytes / total_time / hbm.bw.
  CHECK(stat(*s, "memory.mbu_estimated_percent") == Approx(100 * hbm / total_s / bw).epsilon(1e-9));
  // Per (engine, opcode).
  CHECK(stat(*s, "engine.tensor.opcode.multiply_moving.count") == 2);
  CHECK(stat(*s, "engine.tensor.opcode.load_stationary.count") == 2);
  CHECK(stat(*s, "engine.tensor.opcode.nc_transpose.count") == 1);
  CHECK(stat(*s, "engine.sync.opcode.dma_copy.count") == 2);
  CHECK_FALSE(s->stats().has("engine.vector.opcode.dma_copy.count"));
}

TEST_CASE("adjusted FLOPs take the multiplier of the matmul's input dtypes from the config", "[stats][flops]") {
  // One K=128, M=128, N=512 matmul = 16777216 FLOPs with the given stationary and moving dtypes.
  auto adjusted = [](const std::string& preset, DType stat_dt, DType mov_dt, std::vector<std::string> ov = {}) {
    auto s = make_sim(preset, ov);
    Operand st = s->alloc_tile(Space::kSbuf, 128, {128}, stat_dt);
    Operand mv = s->alloc_tile(Space::kSbuf, 128, {512}, mov_dt);
    Operand ps = s->alloc_tile(Space::kPsum, 128, {512}, DType::kFloat32);
    s->submit(instr(Opcode::kLoadStationary, Engine::kTensor, {st}));
    s->submit(instr(Opcode::kMultiplyMoving, Engine::kTensor, {ps, mv}));
    s->finish();
    CHECK(stat(*s, "flops.hardware") == 16777216);
    return stat(*s, "flops.adjusted_hardware") / 16777216;
  };
  const DType f8 = DType::kFloat8E4M3, bf = DType::kBFloat16, f32 = DType::kFloat32;
  CHECK(adjusted("trn2", f32, f32) == 4);  // fp32 x4 (tensor.adjusted_flops_fp32)
  CHECK(adjusted("trn2", bf, f32) == 4);   // either input fp32: the fp32 rate
  CHECK(adjusted("trn2", f8, f8) == 0.5);  // fp8 x0.5 on trn2 (tensor.adjusted_flops_fp8)
  CHECK(adjusted("trn3", f8, f8) == 0.5);
  CHECK(adjusted("trn1", f8, f8) == 1);    // fp8 x1 on trn1
  CHECK(adjusted("trn2", f8, bf) == 1);    // fp8 x bf16 counts 1
  CHECK(adjusted("trn2", bf, f8) == 1);
  CHECK(adjusted("trn2", DType::kFloat16, DType::kFloat16) == 1);
  CHECK(adjusted("trn2", f8, f8, {"tensor.adjusted_flops_fp8=0.25"}) == 0.25);
}

// ------------------------------------------------------------------------------------------------
// Engines: activation counts, union over engines
// ------------------------------------------------------------------------------------------------

TEST_CASE("activation counts and times, per (engine, opcode) counts, union over engines", "[stats][engines]") {
  auto s = make_sim("trn2");
  Operand a = s->alloc_tile(Space::kSbuf, 128, {512}, DType::kFloat32);
  Operand b = s->alloc_tile(Space::kSbuf, 128, {512}, DType::kFloat32);
  Operand c = s->alloc_tile(Space::kSbuf, 128, {512}, DType::kFloat32);
  Operand d = s->alloc_tile(Space::kSbuf, 128, {512}, DType::kFloat32);
  // VectorE and ScalarE each start at 0 on independent tiles.
  Instr v = instr(Opcode::kTensorScalar, Engine::kVector, {b, a});
  v.alu0 = AluOp::kAdd;
  v.flags = isa::kHasImm0;
  const InstrTiming tv = s->submit(v);
  Instr act = instr(Opcode::kActivation, Engine::kScalar, {d, c});
  act.act = isa::ActFunc::kCopy;
  const InstrTiming ta1 = s->submit(act);
  const InstrTiming ta2 = s->submit(act);  // WAW on d: after the first
  Instr ts = instr(Opcode::kTensorScalar, Engine::kScalar, {c, c});
  ts.alu0 = AluOp::kAdd;
  ts.flags = isa::kHasImm0;
  const InstrTiming ts1 = s->submit(ts);
  s->finish();
  REQUIRE(tv.start == 0);
  REQUIRE(ta1.start == 0);
  CHECK(stat(*s, "engine.scalar.activate_instruction_count") == 2);
  CHECK(stat(*s, "engine.scalar.activate_instruction_time") == Approx(ns((ta1.end - ta1.start) + (ta2.end - ta2.start))).margin(1e-6));
  CHECK(stat(*s, "engine.scalar.opcode.activation.count") == 2);
  CHECK(stat(*s, "engine.scalar.opcode.tensor_scalar.count") == 1);
  CHECK(stat(*s, "engine.vector.opcode.tensor_scalar.count") == 1);
  CHECK(stat(*s, "opcode.tensor_scalar.count") == 2);  // the existing per-opcode total stays
  CHECK(stat(*s, "engine.scalar.opcode.tensor_scalar.time") == Approx(ns(ts1.end - ts1.start)).margin(1e-6));
  CHECK(stat(*s, "engine.matmul_instruction_count") == 0);
  // Union over engines: both start at 0, so it is the later end of the two engines' busy spans
  // (each engine's instructions here are back to back or overlap: its active time is one span).
  const double vec = stat(*s, "engine.vector.active_time"), sca = stat(*s, "engine.scalar.active_time");
  const Ps last = std::max({tv.end, ta1.end, ta2.end, ts1.end});
  CHECK(stat(*s, "total_active_time") == Approx(ns(last)).margin(1e-6));
  CHECK(stat(*s, "total_active_time") >= std::max(vec, sca));
  CHECK(stat(*s, "total_active_time") <= vec + sca);
  CHECK(stat(*s, "total_time") == Approx(ns(last)).margin(1e-6));
  CHECK(stat(*s, "total_active_time_percent") == Approx(100).margin(1e-9));
  CHECK(stat(*s, "dma.active_time") == 0);
  CHECK(stat(*s, "dma.dma_queue_count") == 0);
  // No HBM traffic: intensity and MBU are 0, not inf/nan.
  CHECK(stat(*s, "flops.mm_arithmetic_intensity") == 0);
  CHECK(stat(*s, "memory.mbu_estimated_percent") == 0);
  CHECK(stat(*s, "flops.mfu_max_achievable_estimated_percent") == 0);
}

TEST_CASE("total_active_time excludes time when every engine and DMA idles", "[stats][engines]") {
  // A VectorE op, then a dependent ScalarE op on another engine: the semaphore hand-off
  // (sync.engine_sem_latency = 30 ns on trn2) is idle time on every engine.
  auto s = make_sim("trn2");
  Operand a = s->alloc_tile(Space::kSbuf, 128, {64}, DType::kFloat32);
  Operand b = s->alloc_tile(Space::kSbuf, 128, {64}, DType::kFloat32);
  Instr v = instr(Opcode::kTensorScalar, Engine::kVector, {b, a});
  v.alu0 = AluOp::kAdd;
  v.flags = isa::kHasImm0;
  const InstrTiming t1 = s->submit(v);
  Instr act = instr(Opcode::kActivation, Engine::kScalar, {a, b});
  act.act = isa::ActFunc::kCopy;
  const InstrTiming t2 = s->submit(act);
  s->finish();
  CHECK(t2.start - t1.end == 30'000);
  CHECK(stat(*s, "total_active_time") == Approx(ns((t1.end - t1.start) + (t2.end - t2.start))).margin(1e-6));
  CHECK(stat(*s, "total_time") - stat(*s, "total_active_time") == Approx(30).margin(1e-6));
}

TEST_CASE("active-time unions of a mixed stream equal brute-force unions of every interval", "[stats][interval]") {
  // Random instructions on every engine and DMAs triggered on Sync, Scalar and GpSimd over 8 queues
  // (packets of later transfers fill idle gaps of earlier ones, pieces run out of order): the
  // watermark-folded unions must equal the union of all intervals computed at the end.
  auto s = make_sim("trn2");
  std::vector<std::pair<Ps, Ps>> any, dma;
  std::array<std::vector<std::pair<Ps, Ps>>, 16> per_dma{};
  s->add_instr_listener([&](const isa::Instr& in, const InstrTiming& t) {
    if (!isa::is_dma(in.op)) {
      any.emplace_back(t.start, t.end);
      return;
    }
    any.emplace_back(t.start, t.issue);  // the trigger on its engine
    const auto& sp = s->last_dma_split();
    const auto& tr = s->last_dma_transfer();
    for (size_t k = 0; k < static_cast<size_t>(sp.engines); ++k)
      if (sp.piece[k].bytes > 0) {
        any.emplace_back(tr.piece_start[k], tr.piece_end[k]);
        dma.emplace_back(tr.piece_start[k], tr.piece_end[k]);
        per_dma[k].emplace_back(tr.piece_start[k], tr.piece_end[k]);
      }
  });
  const auto& h = s->alloc_hbm("x", {128, 2048}, DType::kFloat32);
  Operand tiles[12];
  for (auto& t : tiles) t = s->alloc_tile(Space::kSbuf, 128, {256}, DType::kFloat32);
  Operand st = s->alloc_tile(Space::kSbuf, 128, {128}, DType::kBFloat16);
  Operand mv = s->alloc_tile(Space::kSbuf, 128, {256}, DType::kBFloat16);
  Operand ps = s->alloc_tile(Space::kPsum, 128, {256}, DType::kFloat32);
  std::mt19937 rng(7);
  const Engine dma_engines[3] = {Engine::kSync, Engine::kScalar, Engine::kGpsimd};
  for (int i = 0; i < 3000; ++i) {
    Operand& a = tiles[rng() % 12];
    Operand& b = tiles[rng() % 12];
    switch (rng() % 6) {
      case 0: {  // a DMA of 1..128 partitions x 16..1024 B per partition
        Operand dst = a;
        dst.start_partition = static_cast<uint16_t>(rng() % 128);
        dst.num_partitions = 1 + rng() % (128 - dst.start_partition);
        dst.size[0] = 4 + rng() % 253;
        Operand src = hbm_rows(h, rng() % (128 - dst.num_partitions + 1), dst.num_partitions);
        src.nfree = 1;
        src.size[0] = dst.size[0];
        src.stride[0] = 1;
        Instr d = instr(Opcode::kDmaCopy, dma_engines[rng() % 3], {dst, src});
        d.dma_queue = static_cast<uint8_t>(rng() % 8);
        s->submit(d);
        break;
      }
      case 1: {
        s->submit(instr(Opcode::kLoadStationary, Engine::kTensor, {st}));
        s->submit(instr(Opcode::kMultiplyMoving, Engine::kTensor, {ps, mv}));
        break;
      }
      default: {
        const Engine e = std::array{Engine::kVector, Engine::kScalar, Engine::kGpsimd}[rng() % 3];
        Instr v = instr(Opcode::kTensorScalar, e, {a, b});
        v.alu0 = AluOp::kAdd;
        v.flags = isa::kHasImm0;
        s->submit(v);
      }
    }
  }
  s->finish();
  const RunCounters& c = s->counters();
  CHECK(c.any_active.clipped() == 0);
  CHECK(c.dma_active.clipped() == 0);
  CHECK(c.any_active.total() == brute_union(any));
  CHECK(c.dma_active.total() == brute_union(dma));
  Ps classes = 0;
  for (const auto& u : c.dma_class_active) {
    CHECK(u.clipped() == 0);
    classes += u.total();
  }
  CHECK(classes >= c.dma_active.total());
  int out_of_order = 0;  // the stream does exercise packets that start before earlier-scheduled ones
  for (size_t k = 0; k < 16; ++k) {
    INFO("DMA engine " << k);
    CHECK(c.dma[k].active == brute_union(per_dma[k]));
    for (size_t i = 1; i < per_dma[k].size(); ++i) out_of_order += per_dma[k][i].first < per_dma[k][i - 1].first;
  }
  CHECK(out_of_order > 0);
}

TEST_CASE("a long single-engine stream keeps the active-time unions small", "[stats][interval]") {
  // Only VectorE issues, so the watermark (earliest next issue of any engine) stays at 0 and nothing
  // can be folded; back-to-back instructions still merge into one interval (staged by the simulator).
  auto s = make_sim("trn2");
  Operand a = s->alloc_tile(Space::kSbuf, 128, {4}, DType::kFloat32);
  Operand b = s->alloc_tile(Space::kSbuf, 128, {4}, DType::kFloat32);
  Instr v = instr(Opcode::kTensorScalar, Engine::kVector, {b, a});
  v.alu0 = AluOp::kAdd;
  v.flags = isa::kHasImm0;
  for (int i = 0; i < 10000; ++i) s->submit(v);
  CHECK(s->counters().any_active.pending() <= 1);
  s->finish();
  CHECK(stat(*s, "total_active_time") == Approx(stat(*s, "engine.vector.active_time")).margin(1e-6));
  CHECK(s->counters().any_active.clipped() == 0);
}

// ------------------------------------------------------------------------------------------------
// The readable table
// ------------------------------------------------------------------------------------------------

TEST_CASE("stats table: grouped rows with formatted values, units and descriptions", "[stats][table]") {
  using sim::StatsRegistry;
  CHECK(StatsRegistry::format_value(1048576, "bytes") == "1,048,576");
  CHECK(StatsRegistry::format_value(-1234, "count") == "-1,234");
  CHECK(StatsRegistry::format_value(999, "count") == "999");
  CHECK(StatsRegistry::format_value(87381.5, "bytes") == "87381.50");
  CHECK(StatsRegistry::format_value(9818.7416666, "ns") == "9818.742");
  CHECK(StatsRegistry::format_value(29.5049, "%") == "29.50");
  CHECK(StatsRegistry::format_value(2.181e8, "flops") == "2.1810e+08");
  CHECK(StatsRegistry::format_value(85.33333, "flops/byte") == "85.333");
  CHECK(StatsRegistry::format_value(std::numeric_limits<double>::quiet_NaN(), "ns") == "-");

  auto s = make_sim("trn2");
  const auto& h = s->alloc_hbm("x", {128, 512}, DType::kBFloat16);
  Operand t = s->alloc_tile(Space::kSbuf, 128, {512}, DType::kBFloat16);
  s->submit(instr(Opcode::kDmaCopy, Engine::kSync, {t, h.whole()}));
  s->finish();
  const sim::StatsRegistry st = s->stats();
  const std::string tab = st.to_table();
  // Header, then the groups in order: summary first, one group per engine, dma, memory, flops.
  CHECK(tab.rfind("stat ", 0) == 0);
  const auto at = [&](const std::string& x) { return tab.find(x); };
  CHECK(at("\nsummary\n") < at("\nengine.tensor\n"));
  CHECK(at("\nengine.tensor\n") < at("\nengine.sync\n"));
  CHECK(at("\nengine.sync\n") < at("\ndma\n"));
  CHECK(at("\ndma\n") < at("\nmemory\n"));
  CHECK(at("\nmemory\n") < at("\nflops\n"));
  // Every stat is a row with its full name, formatted value, unit and description.
  for (const auto& e : st.entries()) {
    INFO(e.name);
    std::string key = "  ";
    key += e.name;
    key += ' ';
    const size_t row = tab.find(key);
    REQUIRE(row != std::string::npos);
    const std::string line = tab.substr(row, tab.find('\n', row) - row);
    std::string value = " ";
    value += sim::StatsRegistry::format_value(e.value, e.unit);
    value += "  ";
    CHECK(line.find(value) != std::string::npos);
    CHECK(line.find(e.description) != std::string::npos);
  }
  // memory.mbu_estimated_percent is registered after flops.* but listed with memory.
  CHECK(at("memory.mbu_estimated_percent") < at("\nflops\n"));
  CHECK(at("  memory.hbm_read_bytes ") != std::string::npos);
  CHECK(tab.find("131,072") != std::string::npos);
}
