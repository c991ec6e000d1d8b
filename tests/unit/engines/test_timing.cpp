// Cycle-level timing tests. Each expected value is derived in a comment from the cost formulas of
// shared/spec/neuroncore.md (section 3) and the preset values in configs/ and asserted tightly;
// calibration points (C#) are also checked against the published figure within its tolerance.
#include <algorithm>
#include <catch2/catch.hpp>

#include "kernel_builder.h"

using namespace nsim;
using namespace nsim::test;

namespace {

// A chain of `n` matmuls with the stationary loaded once; returns the MM start times.
std::vector<InstrTiming> matmul_chain(Simulator& s, DType dt, int64_t m, int64_t n_moving, int count,
                                      bool reload_stationary = false) {
  Operand st = s.alloc_tile(Space::kSbuf, 128, {m}, dt);
  Operand mv = s.alloc_tile(Space::kSbuf, 128, {n_moving}, dt);
  Operand ps = s.alloc_tile(Space::kPsum, static_cast<uint32_t>(m), {n_moving}, DType::kFloat32);
  std::vector<InstrTiming> out;
  s.submit(instr(Opcode::kLoadStationary, Engine::kTensor, {st}));
  for (int i = 0; i < count; ++i) {
    if (reload_stationary && i > 0) s.submit(instr(Opcode::kLoadStationary, Engine::kTensor, {st}));
    Instr mm = instr(Opcode::kMultiplyMoving, Engine::kTensor, {ps, mv});
    mm.flags = isa::kAccumulate;
    out.push_back(s.submit(mm));
  }
  s.finish();
  return out;
}

}  // namespace

TEST_CASE("C13/C12: back-to-back bf16 matmuls issue every 512 cycles and reach PE peak", "[timing][tensor]") {
  // ii_mm = f_dt * max(mm_min_ii, N) = 1 * max(64, 512) = 512 tensor cycles.
  // trn1: 512 / 2.8 GHz = 182.857 ns; trn2 (throttle off): 512 / 2.4 GHz = 213.333 ns.
  {
    auto s = make_sim("trn1");
    auto t = matmul_chain(*s, DType::kBFloat16, 128, 512, 200);
    CHECK(ns(t[100].start - t[99].start) == Approx(182.857).margin(0.01));
    // C12: peak = 2*128*128*2.8e9 = 91.75 TFLOPS; 200 MMs of 2*128*128*512 FLOPs over the chain.
    const double flops = 200 * 2.0 * 128 * 128 * 512;
    const double secs = static_cast<double>(t.back().start + (t[1].start - t[0].start) - t[0].start) * 1e-12;
    CHECK(flops / secs / 1e12 == Approx(91.75).epsilon(0.005));
  }
  {
    auto s = make_sim("trn2", {"tensor.throttle.enabled=false"});
    auto t = matmul_chain(*s, DType::kBFloat16, 128, 512, 50);
    CHECK(ns(t[10].start - t[9].start) == Approx(213.333).margin(0.01));
  }
}

TEST_CASE("C14: fp32 matmul is 4x slower than bf16", "[timing][tensor]") {
  // f_dt = tensor.fp32_factor = 4: ii = 4 * 512 = 2048 cycles = 731.43 ns on trn1.
  auto s = make_sim("trn1");
  auto t = matmul_chain(*s, DType::kFloat32, 128, 512, 10);
  CHECK(ns(t[5].start - t[4].start) == Approx(2048 / 2.8).margin(0.01));
}

TEST_CASE("C15/C16: short moving and short stationary tiles", "[timing][tensor]") {
  {  // C15: N = 1 -> ii_mm = max(64, 1) = 64 cycles; reloading [128,128] each time: ii_ls = ceil(128/4) = 32 < 64.
    auto s = make_sim("trn1");
    auto t = matmul_chain(*s, DType::kBFloat16, 128, 1, 20, /*reload=*/true);
    CHECK(ns(t[10].start - t[9].start) == Approx(64 / 2.8).margin(0.01));
  }
  {  // C16: stationary free 1, N = 128 -> ii = max(64, 128) = 128 cycles.
    auto s = make_sim("trn1");
    auto t = matmul_chain(*s, DType::kBFloat16, 1, 128, 20, /*reload=*/true);
    CHECK(ns(t[10].start - t[9].start) == Approx(128 / 2.8).margin(0.01));
  }
}

TEST_CASE("C27: a 3-column fp16 matmul lasts II + latency = 148 ns on trn1", "[timing][tensor]") {
  // duration = max(64, 3) + tensor.mm_latency_cycles (350) = 414 cycles / 2.8 GHz = 147.86 ns.
  auto s = make_sim("trn1");
  auto t = matmul_chain(*s, DType::kFloat16, 128, 3, 1);
  CHECK(ns(t[0].end - t[0].start) == Approx(148).epsilon(0.30));
  CHECK(ns(t[0].end - t[0].start) == Approx(414 / 2.8).margin(0.01));
}

TEST_CASE("C17: back-to-back PE transposes of [128,128] bf16 take 128 cycles", "[timing][tensor]") {
  // ii = f_tr * max(P, min(64, F)) = 1 * max(128, 64) = 128 cycles = 45.71 ns on trn1.
  auto s = make_sim("trn1");
  Operand in = s->alloc_tile(Space::kSbuf, 128, {128}, DType::kBFloat16);
  Operand out = s->alloc_tile(Space::kPsum, 128, {128}, DType::kBFloat16);
  std::vector<InstrTiming> t;
  for (int i = 0; i < 10; ++i) t.push_back(s->submit(instr(Opcode::kNcTranspose, Engine::kTensor, {out, in})));
  CHECK(ns(t[5].start - t[4].start) == Approx(128 / 2.8).margin(0.01));
}

TEST_CASE("v4 background transpose lane: independent PE transposes run two at a time on trn3", "[timing][tensor]") {
  // neuroncore.md 1.1 / 3.1: v4 TensorE has a second lane usable only by transposes (tensor.background_transpose).
  // ii = 128 cycles at 2.4 GHz = 53.33 ns. Eight independent [128,128] bf16 transposes into their own PSUM tiles:
  // trn2 issues one every ii (the 8th starts 7 ii = 373.3 ns after the first), trn3 two at a time on the two
  // lanes (the 8th starts 3 ii = 160 ns after the first; starts stay in issue order). Power throttling off (C26:
  // it starts TensorE at half rate on both).
  for (const char* cfg : {"trn2", "trn3"}) {
    auto s = make_sim(cfg, {"tensor.throttle.enabled=false"});
    Operand in = s->alloc_tile(Space::kSbuf, 128, {128}, DType::kBFloat16);
    std::vector<InstrTiming> t;
    for (int i = 0; i < 8; ++i) {
      Operand out = s->alloc_tile(Space::kPsum, 128, {128}, DType::kBFloat16);
      t.push_back(s->submit(instr(Opcode::kNcTranspose, Engine::kTensor, {out, in})));
    }
    for (int i = 1; i < 8; ++i) CHECK(t[static_cast<size_t>(i)].start >= t[static_cast<size_t>(i) - 1].start);
    const double ii = 128 / 2.4;
    CHECK(ns(t[7].start - t[0].start) == Approx((std::string(cfg) == "trn3" ? 3 : 7) * ii).margin(0.01));
    // a matmul after them waits for the main lane (trn3: its 4th transpose) and never starts before the last one
    Operand st = s->alloc_tile(Space::kSbuf, 128, {128}, DType::kBFloat16);
    const InstrTiming ls = s->submit(instr(Opcode::kLoadStationary, Engine::kTensor, {st}));
    CHECK(ls.start >= t[7].start);
  }
}

TEST_CASE("C9: dependent 1-element activations on trn1 issue every 264 cycles (189 ns)", "[timing][scalar]") {
  // busy = max(MIN_II 64, 1) = 64; duration = 64 + scalar.fixed_latency_cycles (200) = 264 cycles.
  // Same-engine RAW: next start = previous end -> period 264 / 1.4 GHz = 188.57 ns.
  auto s = make_sim("trn1");
  Operand a = s->alloc_tile(Space::kSbuf, 128, {1}, DType::kFloat32);
  std::vector<InstrTiming> t;
  for (int i = 0; i < 10; ++i) {
    Instr in = instr(Opcode::kActivation, Engine::kScalar, {a, a});
    in.act = isa::ActFunc::kCopy;
    in.imm[2] = 1.0f;
    t.push_back(s->submit(in));
  }
  CHECK(ns(t[5].start - t[4].start) == Approx(189).epsilon(0.10));
  CHECK(ns(t[5].start - t[4].start) == Approx(264 / 1.4).margin(0.01));
}

TEST_CASE("C10/C11: exp on ScalarE (trn2) = N + 350 cycles, first one loads its table", "[timing][scalar]") {
  // N = 4096: (4096 + 350) / 1.2 GHz = 3705 ns (fig ~3.71 us); N = 128: 478 / 1.2 = 398.3 ns (~0.40 us).
  // The first exp also pays scalar.act_table_load = 1330 ns (C11, ~1.33 us).
  auto s = make_sim("trn2");
  Operand big = s->alloc_tile(Space::kSbuf, 128, {4096}, DType::kBFloat16);
  Operand small = s->alloc_tile(Space::kSbuf, 128, {128}, DType::kBFloat16);
  auto exp = [&](Operand o) {
    Instr in = instr(Opcode::kActivation, Engine::kScalar, {o, o});
    in.act = isa::ActFunc::kExp;
    in.imm[2] = 1.0f;
    return s->submit(in);
  };
  InstrTiming first = exp(small);
  CHECK(ns(first.end - first.start) == Approx(1330 + 398.33).margin(0.01));
  InstrTiming b = exp(big);
  CHECK(ns(b.end - b.start) == Approx(3710).epsilon(0.15));
  CHECK(ns(b.end - b.start) == Approx(4446 / 1.2).margin(0.01));
  InstrTiming sm = exp(small);
  CHECK(ns(sm.end - sm.start) == Approx(400).epsilon(0.15));
}

TEST_CASE("C18: activation with a reduction costs MIN_II (64) more", "[timing][scalar]") {
  auto s = make_sim("trn1");
  Operand a = s->alloc_tile(Space::kSbuf, 128, {512}, DType::kFloat32);
  Operand b = s->alloc_tile(Space::kSbuf, 128, {512}, DType::kFloat32);
  Operand r = s->alloc_tile(Space::kSbuf, 128, {1}, DType::kFloat32);
  Instr plain = instr(Opcode::kActivation, Engine::kScalar, {b, a});
  plain.act = isa::ActFunc::kCopy;
  Instr red = instr(Opcode::kActivationReduce, Engine::kScalar, {b, a, Operand{}, Operand{}, r});
  red.act = isa::ActFunc::kCopy;
  red.alu1 = isa::AluOp::kAdd;
  InstrTiming t1 = s->submit(plain);
  InstrTiming t2 = s->submit(red);
  // (512 + 64 + 200) - (512 + 200) = 64 cycles at 1.4 GHz.
  CHECK(ns((t2.end - t2.start) - (t1.end - t1.start)) == Approx(64 / 1.4).margin(0.01));
}

TEST_CASE("C19: tensor_tensor fp32 N=512 on trn1: 1024 cycles from two SBUF inputs, 512 with one in PSUM",
          "[timing][vector]") {
  // passes = 2 (both SBUF) -> 2 * 512 = 1024 cycles = 914.3 ns @ 1.12 GHz; SBUF + PSUM -> 512 = 457.1 ns.
  auto s = make_sim("trn1");
  Operand a = s->alloc_tile(Space::kSbuf, 128, {512}, DType::kFloat32);
  Operand b = s->alloc_tile(Space::kSbuf, 128, {512}, DType::kFloat32);
  Operand c = s->alloc_tile(Space::kSbuf, 128, {512}, DType::kFloat32);
  Operand p = s->alloc_tile(Space::kPsum, 128, {512}, DType::kFloat32);
  Instr tt = instr(Opcode::kTensorTensor, Engine::kVector, {c, a, b});
  tt.alu0 = AluOp::kAdd;
  InstrTiming t1 = s->submit(tt);
  CHECK(ns(t1.issue - t1.start) == Approx(914.29).margin(0.01));
  tt.opnd[2] = p;
  InstrTiming t2 = s->submit(tt);
  CHECK(ns(t2.issue - t2.start) == Approx(457.14).margin(0.01));
}

TEST_CASE("C20: trn2 tensor_copy bf16 contiguous runs in 4x mode, non-contiguous 2x", "[timing][vector]") {
  // N = 4096: 4x -> 1024 cycles = 1066.7 ns @ 0.96 GHz; stride 2 -> 2x -> 2048 cycles = 2133.3 ns.
  auto s = make_sim("trn2");
  Operand a = s->alloc_tile(Space::kSbuf, 128, {8192}, DType::kBFloat16);
  Operand b = s->alloc_tile(Space::kSbuf, 128, {4096}, DType::kBFloat16);
  Operand src = a;
  src.size[0] = 4096;
  InstrTiming t1 = s->submit(instr(Opcode::kTensorCopy, Engine::kVector, {b, src}));
  CHECK(ns(t1.issue - t1.start) == Approx(1066.67).margin(0.01));
  src.stride[0] = 2;
  InstrTiming t2 = s->submit(instr(Opcode::kTensorCopy, Engine::kVector, {b, src}));
  CHECK(ns(t2.issue - t2.start) == Approx(2133.33).margin(0.01));
  // trn1 has no performance modes: 4096 cycles at 1.12 GHz.
  auto s1 = make_sim("trn1");
  Operand a1 = s1->alloc_tile(Space::kSbuf, 128, {4096}, DType::kBFloat16);
  Operand b1 = s1->alloc_tile(Space::kSbuf, 128, {4096}, DType::kBFloat16);
  InstrTiming t3 = s1->submit(instr(Opcode::kTensorCopy, Engine::kVector, {b1, a1}));
  CHECK(ns(t3.issue - t3.start) == Approx(4096 / 1.12).margin(0.01));
}

TEST_CASE("3.2 rules: tensor_tensor 2x only for add/subtract/multiply, GpSimd memset of a 16-bit zero N/2, "
          "trn3 ScalarE 2x for fp8", "[timing][vector]") {
  // trn2 VectorE 0.96 GHz, N = 512 bf16, both inputs in SBUF (passes = 2). add: 2x mode -> 2 * 512 / 2 = 512
  // cycles = 533.3 ns; maximum / divide: no 2x mode (spec 3.2 per-API table) -> 2 * 512 = 1024 cycles = 1066.7 ns.
  auto s = make_sim("trn2");
  Operand a = s->alloc_tile(Space::kSbuf, 128, {512}, DType::kBFloat16);
  Operand b = s->alloc_tile(Space::kSbuf, 128, {512}, DType::kBFloat16);
  Operand c = s->alloc_tile(Space::kSbuf, 128, {512}, DType::kBFloat16);
  Instr tt = instr(Opcode::kTensorTensor, Engine::kVector, {c, a, b});
  for (AluOp op : {AluOp::kAdd, AluOp::kSubtract, AluOp::kMultiply, AluOp::kMaximum, AluOp::kDivide}) {
    tt.alu0 = op;
    const InstrTiming t = s->submit(tt);
    const bool fast = op == AluOp::kAdd || op == AluOp::kSubtract || op == AluOp::kMultiply;
    CHECK(ns(t.issue - t.start) == Approx((fast ? 512 : 1024) / 0.96).margin(0.01));
    CHECK(t.perf_mode == (fast ? 2 : 1));
  }
  // GpSimd memset of 0 into bf16 [128, 512]: max(64, 512 / 2) = 256 cycles = 213.3 ns @ 1.2 GHz; of 1.0: 512
  // cycles = 426.7 ns (as VectorE's memset).
  Instr ms = instr(Opcode::kMemset, Engine::kGpsimd, {c});
  ms.imm[0] = 0.0f;
  InstrTiming t0 = s->submit(ms);
  CHECK(ns(t0.issue - t0.start) == Approx(256 / 1.2).margin(0.01));
  ms.imm[0] = 1.0f;
  InstrTiming t1 = s->submit(ms);
  CHECK(ns(t1.issue - t1.start) == Approx(512 / 1.2).margin(0.01));
  // trn3 ScalarE (1.2 GHz) 2x mode counts fp8 as 16-bit (spec 1.1 scalar.elems_per_cycle "256 (fp8 too)"):
  // tensor_copy of [128, 1024] fp8 -> 1024 / 2 = 512 cycles = 426.7 ns; trn2 has no ScalarE 2x mode: 1024 cycles.
  for (const char* preset : {"trn3", "trn2"}) {
    auto s3 = make_sim(preset);
    Operand x = s3->alloc_tile(Space::kSbuf, 128, {1024}, DType::kFloat8E4M3);
    Operand y = s3->alloc_tile(Space::kSbuf, 128, {1024}, DType::kFloat8E4M3);
    const InstrTiming tc = s3->submit(instr(Opcode::kTensorCopy, Engine::kScalar, {y, x}));
    CHECK(ns(tc.issue - tc.start) == Approx((std::string(preset) == "trn3" ? 512 : 1024) / 1.2).margin(0.01));
  }
}

TEST_CASE("2.4: VectorE and GpSimd on SBUF: serialised on gen2, and on gen3+ while VectorE runs a performance mode",
          "[timing][vector]") {
  // Two independent copies submitted at once: VectorE x -> y, then GpSimd u -> w, all SBUF [128, 4096].
  // trn2 bf16: VectorE's 4x mode (4096 / 4 = 1024 cycles = 1066.7 ns @ 0.96 GHz) holds the SBUF bus GpSimd shares
  // (conc.vector_perf_gpsimd_sbuf_shared): GpSimd starts at 1066.7 ns. trn2 fp32: no performance mode, both at 0.
  // trn1 (conc.vector_gpsimd_sbuf_exclusive): GpSimd waits for VectorE whatever the dtype, 4096 cycles = 3657.1 ns
  // @ 1.12 GHz.
  struct Case {
    const char* preset;
    DType dt;
    double g_start_ns;
  };
  for (const Case c : {Case{"trn2", DType::kBFloat16, 1066.67}, Case{"trn2", DType::kFloat32, 0.0},
                       Case{"trn1", DType::kFloat32, 4096 / 1.12}, Case{"trn3", DType::kBFloat16, 4096 / 4 / 1.2}}) {
    INFO(c.preset << " " << dtype_name(c.dt));
    auto s = make_sim(c.preset);
    Operand x = s->alloc_tile(Space::kSbuf, 128, {4096}, c.dt), y = s->alloc_tile(Space::kSbuf, 128, {4096}, c.dt);
    Operand u = s->alloc_tile(Space::kSbuf, 128, {4096}, c.dt), w = s->alloc_tile(Space::kSbuf, 128, {4096}, c.dt);
    const InstrTiming tv = s->submit(instr(Opcode::kTensorCopy, Engine::kVector, {y, x}));
    const InstrTiming tg = s->submit(instr(Opcode::kTensorCopy, Engine::kGpsimd, {w, u}));
    CHECK(tv.start == 0);
    CHECK(ns(tg.start) == Approx(c.g_start_ns).margin(0.01));
  }
  // The scheduler's estimate agrees: on trn2 a bf16 copy's GpSimd free time is VectorE's perf-mode end.
  auto s = make_sim("trn2");
  Operand x = s->alloc_tile(Space::kSbuf, 128, {4096}, DType::kBFloat16), y = s->alloc_tile(Space::kSbuf, 128, {4096}, DType::kBFloat16);
  s->submit(instr(Opcode::kTensorCopy, Engine::kVector, {y, x}));
  const Instr g = instr(Opcode::kTensorCopy, Engine::kGpsimd, {x, y});
  CHECK(ns(s->engine_free(g, Engine::kGpsimd)) == Approx(1066.67).margin(0.01));
}

TEST_CASE("dma.engines past the partitions they can serve is a config error, and with fewer partitions each more engines "
          "move a load faster", "[timing][dma]") {
  // Engine e moves partitions [8e, 8e + 8) (dma.partitions_per_engine = 8): 16 engines serve the 128 partitions, and
  // engines 16..31 of dma.engines=32 would move nothing (an architect's sweep saw no change while the bounds counted
  // them). With partitions_per_engine 4, 32 engines each move 4 partitions: a [128, 8192] fp32 load (4 MiB) with HBM
  // out of the way (hbm.bw 2900 GB/s) moves its data in half the time of 16 engines (23 B/ns each, trn2).
  try {
    Simulator::from_preset("trn2", {"dma.engines=32"});
    FAIL("expected a config error");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kConfigBadValue);
    CHECK(std::string(e.what()).find("dma.partitions_per_engine") != std::string::npos);
  }
  auto data_ns = [](std::vector<std::string> ov) {
    ov.push_back("hbm.bw=2900GB/s");
    auto s = make_sim("trn2", ov);
    Operand t = s->alloc_tile(Space::kSbuf, 128, {8192}, DType::kFloat32);
    const auto& h = s->alloc_hbm("x", {128, 8192}, DType::kFloat32);
    const InstrTiming r = s->submit(instr(Opcode::kDmaCopy, Engine::kSync, {t, h.whole()}));
    return ns(r.end - r.data_start);
  };
  const double d16 = data_ns({}), d32 = data_ns({"dma.engines=32", "dma.partitions_per_engine=4"});
  CHECK(d32 == Approx(d16 / 2).epsilon(0.05));
}

TEST_CASE("C21: VectorE reciprocal costs 8N, ScalarE reciprocal N", "[timing][vector]") {
  auto s = make_sim("trn1");
  Operand a = s->alloc_tile(Space::kSbuf, 128, {256}, DType::kFloat32);
  Operand b = s->alloc_tile(Space::kSbuf, 128, {256}, DType::kFloat32);
  InstrTiming v = s->submit(instr(Opcode::kReciprocal, Engine::kVector, {b, a}));
  Instr act = instr(Opcode::kActivation, Engine::kScalar, {b, a});
  act.act = isa::ActFunc::kReciprocal;
  InstrTiming sc = s->submit(act);
  // 8 * 256 = 2048 VectorE cycles @ 1.12 GHz; 256 ScalarE cycles @ 1.4 GHz (busy, table load excluded).
  CHECK(ns(v.issue - v.start) == Approx(2048 / 1.12).margin(0.01));
  CHECK(ns(sc.issue - sc.start) - 1330 == Approx(256 / 1.4).margin(0.01));
}

TEST_CASE("v4: VectorE exponential and rand2 cost max(MIN_II, N/4), GpSimd topk 4n + K (trn3)", "[timing][vector]") {
  // neuroncore.md 3.2: exponential and rand2 (v4) max(MIN_II, N/4) (vector.exponential_factor, vector.rand2_factor
  // = 0.25), topk 4n + K (gpsimd.topk_factor = 4); trn3 VectorE and GpSimd at 1.2 GHz.
  auto s = make_sim("trn3");
  Operand x = s->alloc_tile(Space::kSbuf, 128, {2048}, DType::kFloat32);
  Operand e = s->alloc_tile(Space::kSbuf, 128, {2048}, DType::kFloat32);
  InstrTiming te = s->submit(instr(Opcode::kExponential, Engine::kVector, {e, x}));
  CHECK(ns(te.issue - te.start) == Approx(2048 / 4 / 1.2).margin(0.01));  // 512 cycles = 426.7 ns (was 2048)
  Operand r = s->alloc_tile(Space::kSbuf, 128, {1024}, DType::kFloat32);
  InstrTiming tr = s->submit(instr(Opcode::kRand2, Engine::kVector, {r}));
  CHECK(ns(tr.issue - tr.start) == Approx(1024 / 4 / 1.2).margin(0.01));  // 256 cycles = 213.3 ns
  Operand small = s->alloc_tile(Space::kSbuf, 128, {128}, DType::kFloat32);
  InstrTiming ts = s->submit(instr(Opcode::kRand2, Engine::kVector, {small}));
  CHECK(ns(ts.issue - ts.start) == Approx(64 / 1.2).margin(0.01));  // 128 / 4 = 32 < MIN_II = 64 cycles
  Operand src = s->alloc_tile(Space::kSbuf, 128, {256}, DType::kBFloat16);
  Operand val = s->alloc_tile(Space::kSbuf, 128, {64}, DType::kBFloat16);
  Operand idx = s->alloc_tile(Space::kSbuf, 128, {64}, DType::kUInt32);
  Instr tk = instr(Opcode::kTopk, Engine::kGpsimd, {val, idx, src});
  tk.iimm[0] = 4096;  // n: 16 partitions x 256 columns of each group's snake
  InstrTiming tt = s->submit(tk);
  CHECK(ns(tt.issue - tt.start) == Approx((4 * 4096 + 64) / 1.2).margin(0.01));  // 16,448 cycles = 13,706.7 ns
}

TEST_CASE("C22: iota N=512 on trn1 is 150 + N = 662 cycles (473 ns)", "[timing][gpsimd]") {
  auto s = make_sim("trn1");
  Operand a = s->alloc_tile(Space::kSbuf, 128, {512}, DType::kInt32);
  Instr in = instr(Opcode::kIota, Engine::kGpsimd, {a});
  in.iimm = {0, 0, 1, 512, 0, 1, 0, 1, 0, 1};
  InstrTiming t = s->submit(in);
  CHECK(ns(t.issue - t.start) == Approx(473).epsilon(0.15));
  CHECK(ns(t.issue - t.start) == Approx(662 / 1.4).margin(0.01));
}

TEST_CASE("C23: tiny instructions: II = MIN_II independent, + fixed latency dependent", "[timing][vector]") {
  // Independent: 64 cycles apart. Dependent (same tile): 64 + 100 = 164 cycles apart.
  auto s = make_sim("trn1");
  Operand a = s->alloc_tile(Space::kSbuf, 128, {1}, DType::kFloat32);
  Operand b = s->alloc_tile(Space::kSbuf, 128, {1}, DType::kFloat32);
  Operand c = s->alloc_tile(Space::kSbuf, 128, {1}, DType::kFloat32);
  auto ts = [&](Operand d, Operand x) {
    Instr in = instr(Opcode::kTensorScalar, Engine::kVector, {d, x});
    in.alu0 = AluOp::kAdd;
    in.flags = isa::kHasImm0;
    return s->submit(in);
  };
  InstrTiming i1 = ts(b, a);
  InstrTiming i2 = ts(c, a);  // independent of i1
  CHECK(ns(i2.start - i1.start) == Approx(64 / 1.12).margin(0.01));
  InstrTiming i3 = ts(a, c);  // depends on i2
  CHECK(ns(i3.start - i2.start) == Approx(164 / 1.12).margin(0.01));
}

TEST_CASE("dma_compute: an accumulating DMA moves at dma.compute_eff x a copy's rate (0.5 on trn2)", "[timing][dma]") {
  // neuroncore.md 3.3: dma_compute at 0.5 of copy throughput on v2/v3. One engine (partitions 0-3) stores
  // 4 x 4096 x 2 = 32768 B into HBM: a copy's packet at 23 x 1.16 (dma.store_bw_factor) = 26.68 B/ns takes
  // 1228.2 ns, an accumulating one at half that rate 2456.4 ns; trigger -> completion adds dma.setup (800 ns).
  auto s = make_sim("trn2");
  const engines::CoreParams& p = s->params();
  const auto& h = s->alloc_hbm("x", {4, 4096}, DType::kBFloat16);
  Operand src = s->alloc_tile(Space::kSbuf, 4, {4096}, DType::kBFloat16);
  const double packet_ns = 32768.0 / p.dma_engine_bw;
  CHECK(p.dma_compute_eff == 0.5);
  InstrTiming copy = s->submit(instr(Opcode::kDmaCopy, Engine::kSync, {hbm_rows(h, 0, 4), src}));
  Instr acc = instr(Opcode::kDmaCopy, Engine::kSync, {hbm_rows(h, 0, 4), src});
  acc.flags = isa::kAccumulate;
  acc.dma_queue = 1;
  InstrTiming add = s->submit(acc);
  CHECK(ns(copy.end - copy.start) == Approx(ns(p.dma_setup) + packet_ns / p.dma_store_bw_factor).margin(0.01));
  CHECK(ns(copy.end - copy.data_start) == Approx(1228.2).margin(0.1));
  CHECK(ns(add.end - add.data_start) == Approx(2 * ns(copy.end - copy.data_start)).margin(0.01));
}

TEST_CASE("C1/C2/C3: trn2 DMA of 32 KiB", "[timing][dma]") {
  auto s = make_sim("trn2");
  const engines::CoreParams& p = s->params();
  const auto& h = s->alloc_hbm("x", {128, 4096}, DType::kBFloat16);
  const double setup_ns = ns(p.dma_setup);  // 800 ns
  SECTION("[4,4096] bf16 uses one engine at 23 B/ns") {
    // One engine (partitions 0-3 -> engine 0) moves 4 x 4096 x 2 = 32768 B at dma.engine_bw:
    // 32768 / 23 = 1424.7 ns (C1: published 1416 ns, +-10%).
    constexpr uint32_t kRows = 4, kCols = 4096;
    const uint64_t bytes = uint64_t{kRows} * kCols * static_cast<uint64_t>(dtype_bytes(DType::kBFloat16));
    const double packet_ns = static_cast<double>(bytes) / p.dma_engine_bw;
    Operand dst = s->alloc_tile(Space::kSbuf, kRows, {kCols}, DType::kBFloat16);
    InstrTiming t = s->submit(instr(Opcode::kDmaCopy, Engine::kSync, {dst, hbm_rows(h, 0, kRows)}));
    s->finish();
    const auto& c = s->counters();
    CHECK(c.dma[0].bytes == bytes);
    for (int e = 1; e < p.dma_engines; ++e) CHECK(c.dma[static_cast<size_t>(e)].bytes == 0);
    CHECK(ns(c.dma[0].active) == Approx(packet_ns).margin(0.01));
    CHECK(ns(c.dma[0].active) == Approx(1416).epsilon(0.10));
    // C3: trigger -> completion = dma.setup + packet = 800 + 1424.7 = 2224.7 ns (published ~2.43 us, +-30%).
    CHECK(ns(t.end - t.start) == Approx(setup_ns + packet_ns).margin(0.01));
    CHECK(ns(t.end - t.start) == Approx(2430).epsilon(0.30));
  }
  SECTION("[128,128] bf16 spreads 2 KiB over each of 16 engines") {
    // 16 engines x 8 partitions x 256 B; the HBM share caps each engine at hbm.bw / dma.engines =
    // 362.5 / 16 = 22.66 B/ns < 23: packet = 2048 / 22.66 = 90.4 ns (C2: published 97 ns, +-25%);
    // trigger -> completion = 800 + 90.4 = 890.4 ns (C3: published ~1.21 us, +-30%).
    constexpr uint32_t kRows = 128, kCols = 128;
    const uint64_t bytes_per_engine =
        uint64_t{kRows} / static_cast<uint64_t>(p.dma_engines) * kCols * static_cast<uint64_t>(dtype_bytes(DType::kBFloat16));
    const double engine_bw = std::min(p.dma_engine_bw, p.hbm_bw / p.dma_engines);
    const double packet_ns = static_cast<double>(bytes_per_engine) / engine_bw;
    Operand dst = s->alloc_tile(Space::kSbuf, kRows, {kCols}, DType::kBFloat16);
    Operand src = hbm_rows(h, 0, kRows);
    src.size[0] = kCols;
    InstrTiming t = s->submit(instr(Opcode::kDmaCopy, Engine::kSync, {dst, src}));
    s->finish();
    for (int e = 0; e < p.dma_engines; ++e) {
      CHECK(s->counters().dma[static_cast<size_t>(e)].bytes == bytes_per_engine);
      CHECK(ns(s->counters().dma[static_cast<size_t>(e)].active) == Approx(packet_ns).margin(0.01));
      CHECK(ns(s->counters().dma[static_cast<size_t>(e)].active) == Approx(97).epsilon(0.25));
    }
    CHECK(ns(t.end - t.start) == Approx(setup_ns + packet_ns).margin(0.01));
    CHECK(ns(t.end - t.start) == Approx(1210).epsilon(0.30));
  }
}

TEST_CASE("C5: a trn2 store of 4 x 8 KiB from one engine moves at dma.engine_bw x dma.store_bw_factor", "[timing][dma]") {
  auto s = make_sim("trn2");
  const engines::CoreParams& p = s->params();
  const auto& h = s->alloc_hbm("y", {4, 4096}, DType::kBFloat16);
  // Partitions 0-3 -> engine 0 writes 4 x 4096 x 2 = 32768 B to HBM at 23 x 1.16 = 26.68 B/ns (the HBM
  // share, 362.5 B/ns for one engine, does not cap it): packet 32768 / 26.68 = 1228.2 ns (C5: published
  // ~1.22 us, +-15%; the load of the same bytes, C1, takes 1424.7 ns).
  constexpr uint32_t kRows = 4, kCols = 4096;
  const uint64_t bytes = uint64_t{kRows} * kCols * static_cast<uint64_t>(dtype_bytes(DType::kBFloat16));
  const double packet_ns = static_cast<double>(bytes) / (p.dma_engine_bw * p.dma_store_bw_factor);
  Operand src = s->alloc_tile(Space::kSbuf, kRows, {kCols}, DType::kBFloat16);
  InstrTiming t = s->submit(instr(Opcode::kDmaCopy, Engine::kSync, {hbm_rows(h, 0, kRows), src}));
  s->finish();
  const auto& c = s->counters();
  CHECK(c.dma[0].bytes == bytes);
  CHECK(ns(c.dma[0].active) == Approx(packet_ns).margin(0.01));
  CHECK(ns(c.dma[0].active) == Approx(1220).epsilon(0.15));
  CHECK(ns(t.end - t.start) == Approx(ns(p.dma_setup) + packet_ns).margin(0.01));
  SECTION("trn1 and trn3 keep the spec's symmetric default") {
    for (const char* preset : {"trn1", "trn3"}) {
      auto q = make_sim(preset);
      const auto& hq = q->alloc_hbm("y", {4, 4096}, DType::kBFloat16);
      Operand sq = q->alloc_tile(Space::kSbuf, kRows, {kCols}, DType::kBFloat16);
      q->submit(instr(Opcode::kDmaCopy, Engine::kSync, {hbm_rows(hq, 0, kRows), sq}));
      q->finish();
      CHECK(ns(q->counters().dma[0].active) == Approx(static_cast<double>(bytes) / q->params().dma_engine_bw).margin(0.01));
    }
  }
}

TEST_CASE("C6: a DMA's waiter on ScalarE starts 300 ns after completion", "[timing][dma]") {
  auto s = make_sim("trn2");
  const auto& h = s->alloc_hbm("x", {128, 128}, DType::kFloat32);
  Operand dst = s->alloc_tile(Space::kSbuf, 128, {128}, DType::kFloat32);
  Operand out = s->alloc_tile(Space::kSbuf, 128, {128}, DType::kFloat32);
  InstrTiming d = s->submit(instr(Opcode::kDmaCopy, Engine::kSync, {dst, hbm_rows(h, 0, 128)}));
  Instr act = instr(Opcode::kActivation, Engine::kScalar, {out, dst});
  act.act = isa::ActFunc::kCopy;
  InstrTiming a = s->submit(act);
  // The waiter starts dma.completion_to_waiter = 300 ns after the DMA completes (C6: published 290-310 ns).
  CHECK(ns(a.start - d.end) == Approx(ns(s->params().dma_completion_to_waiter)).margin(0.01));
  CHECK(ns(a.start - d.end) == Approx(300).margin(10));
}

TEST_CASE("C24: relative DMA throughput vs bytes per partition follows the published curve", "[timing][dma]") {
  // Back-to-back 128-partition loads on one queue; throughput relative to 32 KiB/partition.
  const std::vector<std::pair<int64_t, double>> curve = {{32, 0.014},   {64, 0.026},   {128, 0.050}, {256, 0.103},
                                                         {512, 0.209},  {1024, 0.424}, {2048, 0.813}, {4096, 0.966},
                                                         {8192, 0.983}, {16384, 0.990}, {32768, 1.0}};
  auto rate = [](int64_t bpp) {
    auto s = make_sim("trn2");
    const int64_t elems = bpp / 4;
    const auto& h = s->alloc_hbm("x", {128, elems}, DType::kFloat32);
    // Rotate over 3 destinations so no transfer waits for the previous one (WAW).
    Operand dst[3];
    for (auto& d : dst) d = s->alloc_tile(Space::kSbuf, 128, {elems}, DType::kFloat32);
    const int n = 20;
    sim::Ps first = 0, last = 0;
    for (int i = 0; i < n; ++i) {
      InstrTiming t = s->submit(instr(Opcode::kDmaCopy, Engine::kSync, {dst[i % 3], hbm_rows(h, 0, 128)}));
      if (i == 5) first = t.end;
      last = t.end;
    }
    return static_cast<double>(bpp) * (n - 6) / static_cast<double>(last - first);
  };
  const double ref = rate(32768);
  for (auto [bpp, expected] : curve) {
    INFO("bytes/partition " << bpp);
    CHECK(rate(bpp) / ref == Approx(expected).margin(0.05));
  }
}

TEST_CASE("C26: TensorE on trn2 starts throttled at 50% and reaches full rate after ~3 us", "[timing][tensor]") {
  auto s = make_sim("trn2");
  auto t = matmul_chain(*s, DType::kBFloat16, 128, 512, 60);
  // First MM: limit 0.5 -> II = 512 / 0.5 = 1024 cycles = 426.7 ns.
  CHECK(ns(t[1].start - t[0].start) == Approx(426.67).epsilon(0.01));
  // Well after 3 us the limit is 1: 213.3 ns.
  CHECK(t[40].start - t[0].start > 3'000'000);
  CHECK(ns(t[41].start - t[40].start) == Approx(213.33).epsilon(0.01));
  // After 3 us of idle (utilisation < 50% over the window), throttling starts again.
  Operand st = s->alloc_tile(Space::kSbuf, 128, {128}, DType::kBFloat16);
  (void)st;
}

TEST_CASE("C28: trn1 fp32 [128,1024] load is 16 packets of 32 KiB", "[timing][dma]") {
  auto s = make_sim("trn1");
  const auto& h = s->alloc_hbm("x", {128, 1024}, DType::kFloat32);
  Operand dst = s->alloc_tile(Space::kSbuf, 128, {1024}, DType::kFloat32);
  s->submit(instr(Opcode::kDmaCopy, Engine::kSync, {dst, hbm_rows(h, 0, 128)}));
  s->finish();
  for (int e = 0; e < 16; ++e) {
    CHECK(s->counters().dma[static_cast<size_t>(e)].instructions == 1);
    CHECK(s->counters().dma[static_cast<size_t>(e)].bytes == 32768);
  }
}

TEST_CASE("C4/C8: a DMA's trigger, its first packet, and the hwdge trigger on ScalarE", "[timing][dma]") {
  auto s = make_sim("trn2");
  const engines::CoreParams& p = s->params();
  const auto& h = s->alloc_hbm("x", {128, 512}, DType::kBFloat16);
  Operand a = s->alloc_tile(Space::kSbuf, 128, {512}, DType::kBFloat16);
  Operand b = s->alloc_tile(Space::kSbuf, 128, {512}, DType::kBFloat16);
  // C4: trigger start -> first packet = dma.setup (800 ns; published 0.62-1.0 us, Sync-triggered and swdge).
  const InstrTiming sync = s->submit(instr(Opcode::kDmaCopy, Engine::kSync, {a, hbm_rows(h, 0, 128)}));
  CHECK(ns(sync.data_start - sync.start) == Approx(ns(p.dma_setup)).margin(0.01));
  CHECK(ns(sync.data_start - sync.start) >= 620);
  CHECK(ns(sync.data_start - sync.start) <= 1000);
  // C8: a hwdge DMA (triggered from ScalarE's sequencer) holds its trigger engine dma.hwdge_instr = 600 ns
  // (published ~600 ns, +-20 %); a static-descriptor trigger on Sync sync.trigger_instr = 80 ns (spec 70-90 ns).
  Instr hw = instr(Opcode::kDmaCopy, Engine::kScalar, {b, hbm_rows(h, 0, 128)});
  hw.dma_queue = 1;
  const InstrTiming scalar = s->submit(hw);
  CHECK(ns(scalar.issue - scalar.start) == Approx(ns(p.hwdge_instr)).margin(0.01));
  CHECK(ns(scalar.issue - scalar.start) == Approx(600).epsilon(0.20));
  CHECK(ns(sync.issue - sync.start) == Approx(80).margin(10));
}

TEST_CASE("C7: a semaphore through a small DMA to the next compute engine takes ~1300 ns", "[timing][dma]") {
  // neuroncore.md C7 ("DMA semaphore-to-start latency, cross-engine ~1300 ns", doc, +-30 %) read as the fixed
  // latency a DMA puts between two compute engines (docs/timing-model.md, calibration table): VectorE writes a
  // [128, 4] fp32 tile, a Sync-triggered DMA copies it SBUF -> SBUF, ScalarE reads the copy.
  //   VectorE end -> trigger start      sync.engine_sem_latency    30 ns
  //   trigger start -> first packet     dma.setup                 800 ns
  //   packet (16 B per partition, 8 partitions per engine = 128 B in 8 descriptors): 8 x dma.desc_min = 80 ns
  //   last packet -> ScalarE start      dma.completion_to_waiter  300 ns
  // = 1210 ns (within 30 % of 1300).
  auto s = make_sim("trn2");
  const engines::CoreParams& p = s->params();
  Operand a = s->alloc_tile(Space::kSbuf, 128, {4}, DType::kFloat32);
  Operand b = s->alloc_tile(Space::kSbuf, 128, {4}, DType::kFloat32);
  Operand c = s->alloc_tile(Space::kSbuf, 128, {4}, DType::kFloat32);
  Instr w = instr(Opcode::kMemset, Engine::kVector, {a});
  const InstrTiming vec = s->submit(w);
  const InstrTiming dma = s->submit(instr(Opcode::kDmaCopy, Engine::kSync, {b, a}));
  Instr r = instr(Opcode::kActivation, Engine::kScalar, {c, b});
  r.act = isa::ActFunc::kCopy;
  const InstrTiming act = s->submit(r);
  CHECK(ns(dma.start - vec.end) == Approx(ns(p.sem_latency)).margin(0.01));
  CHECK(ns(dma.data_start - dma.start) == Approx(ns(p.dma_setup)).margin(0.01));
  CHECK(ns(dma.end - dma.data_start) == Approx(8 * ns(p.dma_desc_min)).margin(0.01));
  CHECK(ns(act.start - dma.end) == Approx(ns(p.dma_completion_to_waiter)).margin(0.01));
  CHECK(ns(act.start - vec.end) == Approx(1210).margin(0.01));
  CHECK(ns(act.start - vec.end) == Approx(1300).epsilon(0.30));
}

TEST_CASE("C25: dma_transpose moves data at <= 0.9 (HBM->SBUF) and <= 0.5 (SBUF->SBUF) of a copy's rate", "[timing][dma]") {
  // The same [128, 128] bf16 bytes (16 engines x 2 KiB): a copy's packet takes 2048 B / min(23, 362.5 / 16) B/ns
  // = 90.4 ns (C2); a transpose's the same bytes at dma.transpose_eff_* of that rate: 90.4 / 0.9 = 100.4 ns from
  // HBM, 2048 / 23 / 0.5 = 178.1 ns SBUF->SBUF (not HBM-capped).
  auto packet = [](Opcode op, bool from_hbm) {
    auto s = make_sim("trn2");
    const auto& h = s->alloc_hbm("x", {128, 128}, DType::kBFloat16);
    Operand dst = s->alloc_tile(Space::kSbuf, 128, {128}, DType::kBFloat16);
    Operand src = from_hbm ? hbm_rows(h, 0, 128) : s->alloc_tile(Space::kSbuf, 128, {128}, DType::kBFloat16);
    if (from_hbm) src.size[0] = 128;
    const InstrTiming t = s->submit(instr(op, Engine::kSync, {dst, src}));
    return ns(t.end - t.data_start);
  };
  const double copy_hbm = packet(Opcode::kDmaCopy, true), copy_sbuf = packet(Opcode::kDmaCopy, false);
  CHECK(copy_hbm == Approx(2048 / (362.5 / 16)).margin(0.05));
  CHECK(packet(Opcode::kDmaTranspose, true) == Approx(copy_hbm / 0.9).margin(0.05));
  CHECK(copy_sbuf == Approx(2048 / 23.0).margin(0.05));
  CHECK(packet(Opcode::kDmaTranspose, false) == Approx(copy_sbuf / 0.5).margin(0.05));
}
