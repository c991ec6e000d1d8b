// The sanitizer (engines/check/checker.h) on hand-built instruction streams: each check fires once on
// the buggy stream with the slot and element range, and not on the fixed one.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <vector>

#include "engines/check/race.h"
#include "kernel_builder.h"

using namespace nsim;
using namespace nsim::test;

namespace {

std::unique_ptr<Simulator> checked_sim(bool check = true) {
  SimOptions o;
  o.numerics = true;
  o.check = check;
  return Simulator::from_preset("trn2", {}, o);
}

Instr add(const Operand& dst, const Operand& a, const Operand& b) {
  Instr in = instr(Opcode::kTensorTensor, Engine::kVector, {dst, a, b});
  in.alu0 = isa::AluOp::kAdd;
  return in;
}

Instr memset0(const Operand& dst) {
  Instr in = instr(Opcode::kMemset, Engine::kVector, {dst});
  in.imm[0] = 0.0f;
  return in;
}

}  // namespace

TEST_CASE("checker reports the first read of never-written SBUF with its slot and element range", "[check]") {
  auto s = checked_sim();
  const Operand a = s->alloc_tile(Space::kSbuf, 128, {64}, DType::kFloat32);
  const Operand b = s->alloc_tile(Space::kSbuf, 128, {64}, DType::kFloat32);
  s->submit(memset0(a));
  s->submit(add(b, a, a));
  CHECK(s->check_reports().empty());  // everything read was written
  Operand c = s->alloc_tile(Space::kSbuf, 128, {32}, DType::kFloat32);
  Operand fresh = s->alloc_tile(Space::kSbuf, 128, {32}, DType::kFloat32);
  s->submit(add(c, c, fresh));  // c and fresh never written
  s->submit(add(c, c, fresh));  // fresh again (c was written by the first): counted, not described twice
  s->finish();
  REQUIRE(s->check_reports().size() == 1);
  const engines::CheckReport& r = s->check_reports()[0];
  CHECK(r.kind == engines::CheckKind::kUninitializedRead);
  CHECK(r.info().code == std::string("NSIM-W501"));
  CHECK(r.op == "tensor_tensor");
  CHECK(r.slot == 1);  // data1 is reported first
  CHECK(r.count == 3);
  CHECK(r.detail.find("reads 4096 sbuf never-written elements of data1") != std::string::npos);
  CHECK(r.detail.find("last at partition 127 element 31") != std::string::npos);
}

TEST_CASE("checker reports accumulation into never-written PSUM", "[check]") {
  auto s = checked_sim();
  const Operand st = s->alloc_tile(Space::kSbuf, 128, {128}, DType::kFloat32);
  const Operand mv = s->alloc_tile(Space::kSbuf, 128, {64}, DType::kFloat32);
  const Operand ps = s->alloc_tile(Space::kPsum, 128, {64}, DType::kFloat32);
  s->submit(memset0(st));
  s->submit(memset0(mv));
  s->submit(instr(Opcode::kLoadStationary, Engine::kTensor, {st}));
  Instr mm = instr(Opcode::kMultiplyMoving, Engine::kTensor, {ps, mv});
  mm.flags = isa::kAccumulate;
  s->submit(mm);
  s->submit(mm);  // now ps was written: no new report
  REQUIRE(s->check_reports().size() == 1);
  CHECK(s->check_reports()[0].kind == engines::CheckKind::kPsumAccumulateUninitialized);
  CHECK(s->check_reports()[0].slot == 0);
  CHECK(s->check_reports()[0].count == 1);
}

TEST_CASE("checker reports the first NaN or Inf made from finite inputs only", "[check]") {
  auto s = checked_sim();
  const Operand x = s->alloc_tile(Space::kSbuf, 128, {16}, DType::kFloat32);
  const Operand y = s->alloc_tile(Space::kSbuf, 128, {16}, DType::kFloat32);
  s->submit(memset0(x));
  Instr lg = instr(Opcode::kActivation, Engine::kScalar, {y, x});
  lg.act = isa::ActFunc::kLog;
  s->submit(lg);  // log(0) = -inf from finite zeros
  Instr again = instr(Opcode::kActivation, Engine::kScalar, {x, y});
  again.act = isa::ActFunc::kLog;
  s->submit(again);  // non-finite input: not a new finding
  REQUIRE(s->check_reports().size() == 1);
  const engines::CheckReport& r = s->check_reports()[0];
  CHECK(r.kind == engines::CheckKind::kNanProduced);
  CHECK(r.op == "activation");
  CHECK(r.detail.find("-inf") != std::string::npos);
  CHECK(r.str().find("NSIM-W503 nan-produced") == 0);
}

TEST_CASE("checker reports a matmul overflowing from finite inputs, not the accumulations after it", "[check]") {
  // [128, 128] x [128, 512] fp32 products (large enough to run behind the next instructions, sem::AsyncGemm): the
  // first, starting its accumulation group, overflows to inf from finite 1e30 inputs (128 x 1e60); the sanitizer
  // reads its results once complete. The accumulating matmuls after it add into that inf: their destination is
  // their input, so nothing is "produced" (Checker::reads_results), and the simulator does not wait for their
  // products before the next instruction; what reads their PSUM tile does, and sees the values.
  auto s = checked_sim();
  const Operand st = s->alloc_tile(Space::kSbuf, 128, {128}, DType::kFloat32);
  const Operand mv = s->alloc_tile(Space::kSbuf, 128, {512}, DType::kFloat32);
  const Operand ps = s->alloc_tile(Space::kPsum, 128, {512}, DType::kFloat32);
  const Operand out = s->alloc_tile(Space::kSbuf, 128, {512}, DType::kFloat32);
  for (const Operand& o : {st, mv}) {
    Instr big = instr(Opcode::kMemset, Engine::kVector, {o});
    big.imm[0] = 1e30f;
    s->submit(big);
  }
  s->submit(instr(Opcode::kLoadStationary, Engine::kTensor, {st}));
  const Instr first = instr(Opcode::kMultiplyMoving, Engine::kTensor, {ps, mv});
  Instr acc = first;
  acc.flags = isa::kAccumulate;
  CHECK(engines::Checker::reads_results(first));
  CHECK_FALSE(engines::Checker::reads_results(acc));
  s->submit(first);
  for (int i = 0; i < 3; ++i) s->submit(acc);
  s->submit(instr(Opcode::kTensorCopy, Engine::kVector, {out, ps}));
  s->finish();
  REQUIRE(s->check_reports().size() == 1);
  const engines::CheckReport& r = s->check_reports()[0];
  CHECK(r.kind == engines::CheckKind::kNanProduced);
  CHECK(r.op == "multiply_moving");
  CHECK(r.instruction == 3);  // the first matmul (after the two memsets and the load_stationary)
  CHECK(r.detail.find("inf") != std::string::npos);
  // the copy read the complete products: inf everywhere
  std::vector<float> got(512);
  isa::read_row(s->memory().resolve(out), 127, got.data());
  for (float x : got) CHECK(std::isinf(x));
}

TEST_CASE("checker: a matmul whose stationary weights hold inf did not produce its inf", "[check]") {
  // The weights were loaded by an earlier load_stationary; an inf among them reaches the output, which is
  // then not "produced from finite inputs" (before, only the moving operand was looked at).
  auto s = checked_sim();
  const Operand st = s->alloc_tile(Space::kSbuf, 128, {128}, DType::kFloat32);
  const Operand mv = s->alloc_tile(Space::kSbuf, 128, {64}, DType::kFloat32);
  const Operand ps = s->alloc_tile(Space::kPsum, 128, {64}, DType::kFloat32);
  Instr inf = instr(Opcode::kMemset, Engine::kVector, {st});
  inf.imm[0] = std::numeric_limits<float>::infinity();
  s->submit(inf);  // (an infinite immediate is intended: no report)
  Instr one = instr(Opcode::kMemset, Engine::kVector, {mv});
  one.imm[0] = 1.0f;
  s->submit(one);
  s->submit(instr(Opcode::kLoadStationary, Engine::kTensor, {st}));
  s->submit(instr(Opcode::kMultiplyMoving, Engine::kTensor, {ps, mv}));
  s->finish();
  CHECK(s->check_reports().empty());
}

TEST_CASE("checker is off unless asked for and needs numerics", "[check]") {
  auto s = checked_sim(false);
  const Operand a = s->alloc_tile(Space::kSbuf, 128, {64}, DType::kFloat32);
  s->submit(add(a, a, a));
  CHECK(s->check_reports().empty());
  CHECK(s->mutable_check_reports() == nullptr);
}

TEST_CASE("checker with allocation tags reports a read of bytes another allocation wrote", "[check]") {
  // Two allocations sharing one tile's storage (as the compiler model's liveness allocation does): the
  // second reads what the first wrote before writing it itself.
  auto s = checked_sim();
  const Operand t = s->alloc_tile(Space::kSbuf, 128, {64}, DType::kFloat32);
  const Operand o = s->alloc_tile(Space::kSbuf, 128, {64}, DType::kFloat32);
  const uint8_t first = engines::slot_tag(3, 1), second = engines::slot_tag(3, 2), out = engines::slot_tag(4, 1);
  REQUIRE(first != second);  // (the hash of these two differs; in general 1/254 collide)
  engines::SlotTags w{first}, r_first{out, first, first}, r_second{out, second, second}, r_unknown{};
  s->set_slot_tags(&w);
  s->submit(memset0(t));
  s->set_slot_tags(&r_first);
  s->submit(add(o, t, t));  // the writer's own allocation reads: fine
  s->set_slot_tags(&r_unknown);
  s->submit(add(o, t, t));  // untagged operands only need written bytes: fine
  CHECK(s->check_reports().empty());
  s->set_slot_tags(&r_second);
  s->submit(add(o, t, t));  // the next allocation of that storage reads before writing: stale
  s->finish();
  REQUIRE(s->check_reports().size() == 1);
  CHECK(s->check_reports()[0].kind == engines::CheckKind::kUninitializedRead);
  CHECK(s->check_reports()[0].detail.find("reads 8192 sbuf never-written elements of data1") != std::string::npos);
}

TEST_CASE("checker: a write that repeats its tag over bytes already holding it marks nothing, unless an untagged write came between", "[check]") {
  // After a write of tag a, the shadow bytes of that extent hold a (an exact region, Checker::verified_exact):
  // writing them again with a changes nothing and is skipped (an accumulating matmul's PSUM tile). A write
  // through an untagged operand into part of them leaves kTagAny bytes, which every reader accepts: the next
  // write of a must mark them a again, or a reader of another allocation would pass there.
  auto s = checked_sim();
  const Operand t = s->alloc_tile(Space::kSbuf, 128, {64}, DType::kFloat32);
  const Operand o = s->alloc_tile(Space::kSbuf, 128, {64}, DType::kFloat32);
  const Operand part = Operand::tile(Space::kSbuf, DType::kFloat32, t.offset, 0, 128, {16});
  const uint8_t a = engines::slot_tag(7, 1), b = engines::slot_tag(7, 2), out = engines::slot_tag(8, 1);
  REQUIRE(a != b);
  engines::SlotTags wa{a}, wany{}, rb{out, b, b};
  s->set_slot_tags(&wa);
  s->submit(memset0(t));
  s->set_slot_tags(&wa);
  s->submit(memset0(t));  // the same tag again: skipped
  s->set_slot_tags(&wany);
  s->submit(memset0(part));  // 16 columns now kTagAny
  s->set_slot_tags(&wa);
  s->submit(memset0(t));  // must mark all 64 columns a again
  s->set_slot_tags(&rb);
  s->submit(add(o, t, t));  // allocation b reads what a wrote: every element stale, the 16 columns too
  s->finish();
  REQUIRE(s->check_reports().size() == 1);
  CHECK(s->check_reports()[0].kind == engines::CheckKind::kUninitializedRead);
  CHECK(s->check_reports()[0].detail.find("reads 8192 sbuf never-written elements of data1") != std::string::npos);
}

TEST_CASE("checker: a region found written is scanned again after another allocation writes into it", "[check]") {
  // The checker skips the shadow scan of a read inside a region it knows is written with the reader's tag
  // (Checker::verified_); a write with another tag into part of that region must end that.
  auto s = checked_sim();
  const Operand t = s->alloc_tile(Space::kSbuf, 128, {64}, DType::kFloat32);
  const Operand o = s->alloc_tile(Space::kSbuf, 128, {64}, DType::kFloat32);
  const uint8_t a = engines::slot_tag(5, 1), b = engines::slot_tag(5, 2), out = engines::slot_tag(6, 1);
  REQUIRE(a != b);
  const Operand lo = Operand::tile(Space::kSbuf, DType::kFloat32, t.offset, 0, 128, {32});
  const Operand hi = Operand::tile(Space::kSbuf, DType::kFloat32, t.offset + 32 * 4, 0, 128, {32});
  const Operand rows = Operand::tile(Space::kSbuf, DType::kFloat32, t.offset, 40, 8, {64});
  engines::SlotTags wa{a}, wb{b}, wany{}, ra{out, a, a};
  // written in two halves by allocation a, then read whole (a region the read itself verifies)
  s->set_slot_tags(&wa);
  s->submit(memset0(lo));
  s->submit(memset0(hi));
  s->set_slot_tags(&ra);
  s->submit(add(o, t, t));
  s->submit(add(o, t, t));
  // a write through an operand of unknown tag keeps the bytes readable by a
  s->set_slot_tags(&wany);
  s->submit(memset0(rows));
  s->set_slot_tags(&ra);
  s->submit(add(o, t, t));
  CHECK(s->check_reports().empty());
  // allocation b writes 8 partitions of the upper half: a's next read of the whole tile is stale there
  const Operand part = Operand::tile(Space::kSbuf, DType::kFloat32, t.offset + 32 * 4, 100, 8, {32});
  s->set_slot_tags(&wb);
  s->submit(memset0(part));
  s->set_slot_tags(&ra);
  s->submit(add(o, t, t));
  s->finish();
  REQUIRE(s->check_reports().size() == 1);
  CHECK(s->check_reports()[0].kind == engines::CheckKind::kUninitializedRead);
  INFO(s->check_reports()[0].detail);
  CHECK(s->check_reports()[0].detail.find("reads 256 sbuf never-written elements of data1 (of 8192), first at "
                                          "partition 100 element 32, last at partition 107 element 63") !=
        std::string::npos);
}

// ---- the cross-core dma-race check (engines/check/race.h), driven directly with issue times

namespace {

engines::RaceChecker race_checker() {
  return engines::RaceChecker([](int64_t) { return std::make_pair(std::string("out"), int64_t{0}); },
                              [](int, uint32_t) { return SourceLoc{}; });
}

// A DMA HBM[rows r0.., cols c0..c0+nc) of a 128 x 64 fp32 tensor at 0 <- SBUF (a store) or the reverse.
Instr hbm_dma(bool store, int64_t r0, int64_t nr, int64_t c0, int64_t nc) {
  Operand h;
  h.space = isa::Space::kHbm;
  h.dtype = DType::kFloat32;
  h.num_partitions = static_cast<uint32_t>(nr);
  h.partition_step = 64;
  h.offset = (r0 * 64 + c0) * 4;
  h.nfree = 1;
  h.size[0] = nc;
  h.stride[0] = 1;
  const Operand s = Operand::tile(isa::Space::kSbuf, DType::kFloat32, 0, 0, static_cast<uint32_t>(nr), {nc});
  return store ? instr(Opcode::kDmaCopy, Engine::kSync, {h, s}) : instr(Opcode::kDmaCopy, Engine::kSync, {s, h});
}

}  // namespace

TEST_CASE("dma-race reports a store and a load of the same bytes on two cores with no rendezvous between", "[check]") {
  auto rc = race_checker();
  rc.issued(hbm_dma(true, 0, 128, 0, 64), 0, 0, 1000, 3);
  rc.issued(hbm_dma(false, 0, 128, 0, 64), 1, 500, 1500, 7);
  REQUIRE(rc.reports().size() == 1);
  const engines::CheckReport& r = rc.reports()[0];
  CHECK(r.info().code == std::string("NSIM-W506"));
  CHECK(r.instruction == 7);
  CHECK(r.op == "dma_copy on core 1");
  CHECK(r.tensor == "out");
  CHECK(r.detail.find("reads bytes [0, 32768)") != std::string::npos);  // 128 rows x 64 fp32
  CHECK(r.detail.find("overlap in time") != std::string::npos);
  rc.issued(hbm_dma(false, 0, 1, 0, 64), 1, 2000, 2100, 9);  // not overlapping in time, still unordered
  REQUIRE(rc.reports().size() == 1);
  CHECK(rc.reports()[0].count == 2);
}

TEST_CASE("dma-race accepts accesses separated by a rendezvous and disjoint interleaved columns", "[check]") {
  auto rc = race_checker();
  rc.issued(hbm_dma(true, 0, 128, 0, 16), 0, 0, 1000, 1);
  rc.issued(hbm_dma(true, 0, 128, 16, 16), 1, 0, 1000, 1);   // other columns of the same rows
  rc.issued(hbm_dma(true, 0, 128, 32, 16), 0, 1000, 2000, 2);
  rc.issued(hbm_dma(false, 0, 128, 48, 16), 1, 1000, 2000, 2);
  CHECK(rc.reports().empty());
  rc.rendezvous(2000);                                       // both earlier writes end by 2000
  rc.issued(hbm_dma(false, 0, 128, 0, 16), 1, 2000, 3000, 3);  // reads what core 0 wrote
  rc.issued(hbm_dma(false, 0, 128, 32, 16), 1, 2000, 3000, 3);
  rc.issued(hbm_dma(true, 0, 128, 16, 16), 0, 2500, 3500, 4);  // overwrites what core 1 wrote before
  CHECK(rc.reports().empty());
  // a rendezvous before the earlier access ends does not order it: core 0's store runs 3600-5000
  rc.rendezvous(3500);  // (after core 1's reads, which its store overwrites)
  rc.issued(hbm_dma(true, 0, 2, 0, 64), 0, 3600, 5000, 5);
  rc.rendezvous(4000);
  rc.issued(hbm_dma(false, 1, 1, 0, 64), 1, 4100, 4500, 6);
  REQUIRE(rc.reports().size() == 1);
  CHECK(rc.reports()[0].instruction == 6);
  CAPTURE(rc.reports()[0].detail);
  CHECK(rc.reports()[0].detail.find("reads bytes [256, 512)") != std::string::npos);
}

TEST_CASE("checker: a simulator after a checked one starts with every on-chip byte never written", "[check]") {
  // The shadow bytes come from the buffer pool (memory/buffer.h): the second run must not see the
  // first run's writes.
  for (int round = 0; round < 2; ++round) {
    auto s = checked_sim();
    const Operand a = s->alloc_tile(Space::kSbuf, 128, {64}, DType::kFloat32);
    const Operand b = s->alloc_tile(Space::kSbuf, 128, {64}, DType::kFloat32);
    s->submit(add(b, a, a));  // a never written in this run, although the last run wrote these bytes
    s->submit(memset0(a));
    s->finish();
    INFO("round " << round);
    REQUIRE(s->check_reports().size() == 1);
    CHECK(s->check_reports()[0].kind == engines::CheckKind::kUninitializedRead);
  }
}
