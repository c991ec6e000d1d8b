// The sanitizer (engines/check/checker.h) on hand-built instruction streams: each check fires once on
// the buggy stream with the slot and element range, and not on the fixed one.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <vector>

#include <fmt/format.h>

#include "engines/check/race.h"
#include "kernel_builder.h"

using namespace nsim;
using namespace nsim::test;

namespace {

std::unique_ptr<Simulator> checked_sim(bool check = true, const std::string& preset = "trn2") {
  SimOptions o;
  o.numerics = true;
  o.check = check;
  return Simulator::from_preset(preset, {}, o);
}

Instr add(const Operand& dst, const Operand& a, const Operand& b) {
  Instr in = instr(Opcode::kTensorTensor, Engine::kVector, {dst, a, b});
  in.alu0 = isa::AluOp::kAdd;
  return in;
}

/// A DMA between on-chip tiles: it reports what it reads never written (or computed from never-written data),
/// where an element-wise op such as add() only carries the taint on (Checker: propagates_taint).
Instr dma(const Operand& dst, const Operand& src) { return instr(Opcode::kDmaCopy, Engine::kSync, {dst, src}); }

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
  // (Since taint propagation, an element-wise tensor_tensor reading them reports nothing: the report moved
  // to the instruction that moves the data on, here a DMA.)
  s->submit(dma(c, fresh));  // fresh never written
  s->submit(dma(c, fresh));  // again: counted, not described twice
  s->finish();
  REQUIRE(s->check_reports().size() == 1);
  const engines::CheckReport& r = s->check_reports()[0];
  CHECK(r.kind == engines::CheckKind::kUninitializedRead);
  CHECK(r.info().code == std::string("NSIM-W501"));
  CHECK(r.op == "dma_copy");
  CHECK(r.slot == 1);
  CHECK(r.count == 2);
  CHECK(r.detail.find("reads 4096 sbuf never-written elements of src") != std::string::npos);
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
  // second reads what the first wrote before writing it itself. (The reads are DMAs, which report: an
  // element-wise reader would only taint its output since taint propagation.)
  auto s = checked_sim();
  const Operand t = s->alloc_tile(Space::kSbuf, 128, {64}, DType::kFloat32);
  const Operand o = s->alloc_tile(Space::kSbuf, 128, {64}, DType::kFloat32);
  const uint8_t first = engines::slot_tag(3, 1), second = engines::slot_tag(3, 2), out = engines::slot_tag(4, 1);
  REQUIRE(first != second);  // (the hash of these two differs; in general 1/254 collide)
  engines::SlotTags w{first}, r_first{out, first, first}, r_second{out, second, second}, r_unknown{};
  s->set_slot_tags(&w);
  s->submit(memset0(t));
  s->set_slot_tags(&r_first);
  s->submit(dma(o, t));  // the writer's own allocation reads: fine
  s->set_slot_tags(&r_unknown);
  s->submit(dma(o, t));  // untagged operands only need written bytes: fine
  CHECK(s->check_reports().empty());
  s->set_slot_tags(&r_second);
  s->submit(dma(o, t));  // the next allocation of that storage reads before writing: stale
  s->finish();
  REQUIRE(s->check_reports().size() == 1);
  CHECK(s->check_reports()[0].kind == engines::CheckKind::kUninitializedRead);
  CHECK(s->check_reports()[0].detail.find("reads 8192 sbuf never-written elements of src") != std::string::npos);
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
  s->submit(dma(o, t));  // allocation b reads what a wrote: every element stale, the 16 columns too
  s->finish();
  REQUIRE(s->check_reports().size() == 1);
  CHECK(s->check_reports()[0].kind == engines::CheckKind::kUninitializedRead);
  CHECK(s->check_reports()[0].detail.find("reads 8192 sbuf never-written elements of src") != std::string::npos);
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
  const Operand rows = Operand::tile(Space::kSbuf, DType::kFloat32, t.offset, 32, 8, {64});
  engines::SlotTags wa{a}, wb{b}, wany{}, ra{out, a, a};
  // written in two halves by allocation a, then read whole (a region the read itself verifies)
  s->set_slot_tags(&wa);
  s->submit(memset0(lo));
  s->submit(memset0(hi));
  s->set_slot_tags(&ra);
  s->submit(dma(o, t));
  s->submit(dma(o, t));
  // a write through an operand of unknown tag keeps the bytes readable by a
  s->set_slot_tags(&wany);
  s->submit(memset0(rows));
  s->set_slot_tags(&ra);
  s->submit(dma(o, t));
  CHECK(s->check_reports().empty());
  // allocation b writes 8 partitions of the upper half: a's next read of the whole tile is stale there
  const Operand part = Operand::tile(Space::kSbuf, DType::kFloat32, t.offset + 32 * 4, 96, 8, {32});
  s->set_slot_tags(&wb);
  s->submit(memset0(part));
  s->set_slot_tags(&ra);
  s->submit(dma(o, t));
  s->finish();
  REQUIRE(s->check_reports().size() == 1);
  CHECK(s->check_reports()[0].kind == engines::CheckKind::kUninitializedRead);
  INFO(s->check_reports()[0].detail);
  CHECK(s->check_reports()[0].detail.find("reads 256 sbuf never-written elements of src (of 8192), first at "
                                          "partition 96 element 32, last at partition 103 element 63") !=
        std::string::npos);
}

// ---- taint: per-partition instructions, transposes and matmuls carry never-written data on; DMAs report it

namespace {

/// Partitions [p0, p0 + n) of tile t (its free shape {f}).
Operand rows_of(const Operand& t, uint32_t p0, uint32_t n, int64_t f) {
  return Operand::tile(t.space, t.dtype, t.offset, p0, n, {f});
}

Instr scale(const Operand& dst, const Operand& src, float k) {
  Instr in = instr(Opcode::kTensorScalar, Engine::kVector, {dst, src});
  in.alu0 = isa::AluOp::kMultiply;
  in.imm[0] = k;
  in.flags = isa::kHasImm0;
  return in;
}

}  // namespace

TEST_CASE("checker: element-wise ops over a half-written tile report nothing, nor does a store of the written rows",
          "[check]") {
  // The ragged-last-tile pattern: a masked load writes rows 0..63, element-wise ops run over all 128, the
  // masked store writes rows 0..63 back. The garbage rows never leave the chip.
  auto s = checked_sim();
  const auto& x = s->alloc_hbm("x", {128, 64}, DType::kFloat32);
  const auto& out = s->alloc_hbm("out", {128, 64}, DType::kFloat32);
  const Operand t = s->alloc_tile(Space::kSbuf, 128, {64}, DType::kFloat32);
  const Operand u = s->alloc_tile(Space::kSbuf, 128, {64}, DType::kFloat32);
  const Operand v = s->alloc_tile(Space::kSbuf, 128, {64}, DType::kFloat32);
  s->submit(dma(rows_of(t, 0, 64, 64), hbm_rows(x, 0, 64)));
  s->submit(scale(u, t, 2.0f));
  s->submit(add(v, u, t));
  Instr ex = instr(Opcode::kActivation, Engine::kScalar, {u, v});
  ex.act = isa::ActFunc::kExp;
  s->submit(ex);
  s->submit(dma(hbm_rows(out, 0, 64), rows_of(u, 0, 64, 64)));
  s->finish();
  CHECK(s->check_reports().empty());
}

TEST_CASE("checker: a store of rows computed from never-written data reports once, at the store", "[check]") {
  auto s = checked_sim();
  const auto& x = s->alloc_hbm("x", {128, 64}, DType::kFloat32);
  const auto& out = s->alloc_hbm("out", {128, 64}, DType::kFloat32);
  const Operand t = s->alloc_tile(Space::kSbuf, 128, {64}, DType::kFloat32);
  const Operand u = s->alloc_tile(Space::kSbuf, 128, {64}, DType::kFloat32);
  const Operand v = s->alloc_tile(Space::kSbuf, 128, {64}, DType::kFloat32);
  s->submit(dma(rows_of(t, 0, 64, 64), hbm_rows(x, 0, 64)));
  s->submit(scale(u, t, 2.0f));
  s->submit(add(v, u, t));
  CHECK(s->check_reports().empty());
  s->submit(dma(hbm_rows(out, 0, 128), v));  // instruction 3: rows 64..127 are garbage
  s->finish();
  REQUIRE(s->check_reports().size() == 1);
  const engines::CheckReport& r = s->check_reports()[0];
  INFO(r.detail);
  CHECK(r.kind == engines::CheckKind::kUninitializedRead);
  CHECK(r.op == "dma_copy");
  CHECK(r.instruction == 3);
  CHECK(r.slot == 1);
  CHECK(r.count == 1);
  CHECK(r.detail.find("stores 4096 sbuf elements of src that were never written or computed from never-written "
                      "data (of 8192), first at partition 64 element 0, last at partition 127 element 63") !=
        std::string::npos);
  // where the garbage began: the scale (instruction 1) read t's never-written rows (no source lines here)
  CHECK(r.detail.find("; the never-written data was first read by tensor_scalar (data) at an unknown line") !=
        std::string::npos);
}

TEST_CASE("checker: a matmul whose operands have never-written K rows taints every output element", "[check]") {
  // The contraction mixes the K partitions: every output element holds garbage. Since element-granular taint
  // (2026-12-05) the matmul itself reports nothing (its output may still be dropped); the store of any
  // element of it reports, naming the instruction that read the never-written K rows.
  for (const bool bad_stationary : {false, true}) {
    auto s = checked_sim();
    const auto& out = s->alloc_hbm("out", {128, 64}, DType::kFloat32);
    const Operand st = s->alloc_tile(Space::kSbuf, 128, {128}, DType::kFloat32);
    const Operand mv = s->alloc_tile(Space::kSbuf, 128, {64}, DType::kFloat32);
    const Operand ps = s->alloc_tile(Space::kPsum, 128, {64}, DType::kFloat32);
    const Operand& half = bad_stationary ? st : mv;
    s->submit(memset0(bad_stationary ? mv : st));
    s->submit(memset0(rows_of(half, 0, 96, half.size[0])));  // K rows 96..127 never written
    s->submit(instr(Opcode::kLoadStationary, Engine::kTensor, {st}));
    s->submit(instr(Opcode::kMultiplyMoving, Engine::kTensor, {ps, mv}));
    INFO("bad stationary " << bad_stationary);
    CHECK(s->check_reports().empty());
    s->submit(dma(hbm_rows(out, 5, 1), rows_of(ps, 5, 1, 64)));  // any output row
    s->finish();
    REQUIRE(s->check_reports().size() == 1);
    const engines::CheckReport& r = s->check_reports()[0];
    INFO(r.detail);
    CHECK(r.kind == engines::CheckKind::kUninitializedRead);
    CHECK(r.op == "dma_copy");
    CHECK(r.detail.find("stores 64 psum elements of src that were never written or computed from never-written data "
                        "(of 64), first at partition 5 element 0") != std::string::npos);
    CHECK(r.detail.find(bad_stationary ? "first read by load_stationary (stationary)"
                                       : "first read by multiply_moving (moving)") != std::string::npos);
  }
}

TEST_CASE("checker: a matmul of a tainted moving tile taints its output, the store reports naming the taint", "[check]") {
  // (Before element-granular taint the matmul reported; now its output carries the taint to the store.)
  auto s = checked_sim();
  const auto& out = s->alloc_hbm("out", {128, 64}, DType::kFloat32);
  const Operand st = s->alloc_tile(Space::kSbuf, 128, {128}, DType::kFloat32);
  const Operand mv = s->alloc_tile(Space::kSbuf, 128, {64}, DType::kFloat32);
  const Operand m2 = s->alloc_tile(Space::kSbuf, 128, {64}, DType::kFloat32);
  const Operand ps = s->alloc_tile(Space::kPsum, 128, {64}, DType::kFloat32);
  s->submit(memset0(st));
  s->submit(memset0(rows_of(mv, 0, 100, 64)));
  s->submit(scale(m2, mv, 0.5f));  // rows 100..127 of m2 tainted: no report
  s->submit(instr(Opcode::kLoadStationary, Engine::kTensor, {st}));
  s->submit(instr(Opcode::kMultiplyMoving, Engine::kTensor, {ps, m2}));  // K rows tainted: all of ps
  CHECK(s->check_reports().empty());
  s->submit(dma(hbm_rows(out, 0, 128), ps));
  s->finish();
  REQUIRE(s->check_reports().size() == 1);
  INFO(s->check_reports()[0].detail);
  CHECK(s->check_reports()[0].op == "dma_copy");
  CHECK(s->check_reports()[0].detail.find("stores 8192 psum elements of src that were never written or computed "
                                          "from never-written data (of 8192), first at partition 0 element 0") !=
        std::string::npos);
  CHECK(s->check_reports()[0].detail.find("first read by tensor_scalar (data)") != std::string::npos);
}

TEST_CASE("checker: a transposed half-written tile is tainted by columns, its good columns store cleanly", "[check]") {
  // [128, 64] with rows 0..71 written -> nc_transpose -> [64, 128] whose columns 72..127 are garbage. The good
  // columns, copied out element-wise and stored, report nothing; the bad ones report at the store.
  for (const bool vector : {false, true}) {
    auto s = checked_sim();
    const auto& out = s->alloc_hbm("out", {128, 128}, DType::kFloat32);
    const int64_t P = vector ? 32 : 128, F = vector ? 16 : 64, good = vector ? 20 : 72;
    const Operand t = s->alloc_tile(Space::kSbuf, static_cast<uint32_t>(P), {F}, DType::kFloat32);
    const Operand tt = s->alloc_tile(vector ? Space::kSbuf : Space::kPsum, static_cast<uint32_t>(F), {P}, DType::kFloat32);
    const Operand u = s->alloc_tile(Space::kSbuf, 128, {128}, DType::kFloat32);
    s->submit(memset0(rows_of(t, 0, static_cast<uint32_t>(good), F)));
    s->submit(instr(Opcode::kNcTranspose, vector ? Engine::kVector : Engine::kTensor, {tt, t}));
    const auto cols = [&](const Operand& o, int64_t c0, int64_t n) {
      return Operand::tile(o.space, o.dtype, o.offset + c0 * 4, 0, static_cast<uint32_t>(F), {n});
    };
    s->submit(instr(Opcode::kTensorCopy, Engine::kVector, {cols(u, 0, good), cols(tt, 0, good)}));
    Operand store_good = hbm_rows(out, 0, static_cast<uint32_t>(F));
    store_good.size[0] = good;
    s->submit(dma(store_good, cols(u, 0, good)));
    INFO("vector " << vector);
    CHECK(s->check_reports().empty());
    s->submit(instr(Opcode::kTensorCopy, Engine::kVector, {cols(u, good, P - good), cols(tt, good, P - good)}));
    Operand store_bad = store_good;
    store_bad.size[0] = P - good;
    s->submit(dma(store_bad, cols(u, good, P - good)));
    s->finish();
    REQUIRE(s->check_reports().size() == 1);
    const engines::CheckReport& r = s->check_reports()[0];
    INFO(r.detail);
    CHECK(r.op == "dma_copy");
    CHECK(r.instruction == 5);
    CHECK(r.detail.find(fmt::format("stores {0} sbuf elements of src that were never written or computed from "
                                    "never-written data (of {0}), first at partition 0 element 0",
                                    F * (P - good))) != std::string::npos);
    CHECK(r.detail.find("first read by nc_transpose (data)") != std::string::npos);
  }
}

TEST_CASE("checker: on gen2 a TensorE transpose's garbage taints whole output rows, as its NaN spreads", "[check]") {
  // trn1 computes a TensorE nc_transpose as an fp32 matmul with the identity (isa/semantics/nc_transpose.cpp):
  // the NaN of the never-written rows 72..127 of a [128, 64] tile spreads along every output row, so even the
  // "good" columns 0..71 of the [64, 128] result are NaN, and their store is the report (on trn2 it is clean:
  // the test above).
  auto s = checked_sim(true, "trn1");
  const auto& out = s->alloc_hbm("out", {64, 128}, DType::kFloat32);
  const Operand t = s->alloc_tile(Space::kSbuf, 128, {64}, DType::kFloat32);
  const Operand tt = s->alloc_tile(Space::kPsum, 64, {128}, DType::kFloat32);
  const Operand u = s->alloc_tile(Space::kSbuf, 64, {72}, DType::kFloat32);
  s->submit(memset0(rows_of(t, 0, 72, 64)));
  s->submit(instr(Opcode::kNcTranspose, Engine::kTensor, {tt, t}));
  s->submit(instr(Opcode::kTensorCopy, Engine::kVector, {u, Operand::tile(Space::kPsum, DType::kFloat32, tt.offset, 0, 64, {72})}));
  Operand store = hbm_rows(out, 0, 64);
  store.size[0] = 72;
  s->submit(dma(store, u));
  s->finish();
  REQUIRE(s->check_reports().size() == 1);
  const engines::CheckReport& r = s->check_reports()[0];
  INFO(r.detail);
  CHECK(r.kind == engines::CheckKind::kUninitializedRead);
  CHECK(r.op == "dma_copy");
  CHECK(r.detail.find("stores 4608 sbuf elements of src that were never written or computed from never-written data") !=
        std::string::npos);
}

TEST_CASE("checker: a stream shuffle's kept partitions (mask 255) are not a NaN it produced", "[check]") {
  // nc_stream_shuffle with mask [255, 0, 1, ..., 30]: partition 0 of each quadrant of dst is left as it was (spec
  // nki-api.md 2.2), here a fresh tile's never-written (NaN) bytes; the shuffle wrote no NaN (W503 said it did).
  auto s = checked_sim();
  const Operand src = s->alloc_tile(Space::kSbuf, 128, {8}, DType::kFloat32);
  const Operand dst = s->alloc_tile(Space::kSbuf, 128, {8}, DType::kFloat32);
  s->submit(memset0(src));
  Instr sh = instr(Opcode::kNcStreamShuffle, Engine::kVector, {dst, src});
  sh.shuffle[0] = 255;
  for (int i = 1; i < 32; ++i) sh.shuffle[static_cast<size_t>(i)] = static_cast<uint8_t>(i - 1);
  s->submit(sh);
  s->finish();
  CHECK(s->check_reports().empty());
}

TEST_CASE("checker: a matmul transpose (is_transpose) then a matmul taint the output rows of the garbage tokens",
          "[check]") {
  // The nki-samples RMSNorm + QKV pattern: a ragged token tile [128 tokens, 128 features] (tokens 72..127 never
  // written) is transposed on the PE (stationary = data, moving = identity), copied back, and used as the next
  // matmul's stationary [K features, M tokens]: output rows m >= 72 are garbage; a store of rows < 72 is clean,
  // a store of all rows reports.
  auto s = checked_sim();
  const auto& out = s->alloc_hbm("out", {128, 64}, DType::kFloat32);
  const Operand x = s->alloc_tile(Space::kSbuf, 128, {128}, DType::kFloat32);
  const Operand eye = s->alloc_tile(Space::kSbuf, 128, {128}, DType::kFloat32);
  const Operand xt_ps = s->alloc_tile(Space::kPsum, 128, {128}, DType::kFloat32);
  const Operand xt = s->alloc_tile(Space::kSbuf, 128, {128}, DType::kFloat32);
  const Operand w = s->alloc_tile(Space::kSbuf, 128, {64}, DType::kFloat32);
  const Operand ps = s->alloc_tile(Space::kPsum, 128, {64}, DType::kFloat32);
  const Operand y = s->alloc_tile(Space::kSbuf, 128, {64}, DType::kFloat32);
  s->submit(memset0(rows_of(x, 0, 72, 128)));
  s->submit(memset0(eye));
  for (uint32_t p = 0; p < 128; ++p) {  // the identity (one memset per partition: W509 at most starts, not counted)
    Instr one = instr(Opcode::kMemset, Engine::kVector, {Operand::tile(Space::kSbuf, DType::kFloat32, eye.offset + p * 4, p, 1, {1})});
    one.imm[0] = 1.0f;
    s->submit(one);
  }
  s->submit(memset0(w));
  s->submit(instr(Opcode::kLoadStationary, Engine::kTensor, {x}));
  Instr tr = instr(Opcode::kMultiplyMoving, Engine::kTensor, {xt_ps, eye});
  tr.flags = isa::kIsTranspose;
  s->submit(tr);  // xt_ps[f, token]: columns 72..127 tainted
  s->submit(instr(Opcode::kTensorCopy, Engine::kVector, {xt, xt_ps}));
  s->submit(instr(Opcode::kLoadStationary, Engine::kTensor, {xt}));  // [K features, M tokens]: columns >= 72 bad
  s->submit(instr(Opcode::kMultiplyMoving, Engine::kTensor, {ps, w}));
  s->submit(instr(Opcode::kTensorCopy, Engine::kVector, {y, ps}));
  s->submit(dma(hbm_rows(out, 0, 72), rows_of(y, 0, 72, 64)));
  const auto others = [&] {  // the reports other than the identity's start-partition one
    std::vector<engines::CheckReport> v;
    for (const auto& r : s->check_reports())
      if (r.kind != engines::CheckKind::kStartPartition) v.push_back(r);
    return v;
  };
  CHECK(others().empty());
  s->submit(dma(hbm_rows(out, 0, 128), y));
  s->finish();
  REQUIRE(others().size() == 1);
  const engines::CheckReport r = others()[0];
  INFO(r.detail);
  CHECK(r.op == "dma_copy");
  CHECK(r.detail.find("stores 3584 sbuf elements of src that were never written or computed from never-written data "
                      "(of 8192), first at partition 72 element 0, last at partition 127 element 63") != std::string::npos);
  CHECK(r.detail.find("first read by load_stationary (stationary)") != std::string::npos);
}

TEST_CASE("checker: a matmul whose stationary has garbage columns taints only those output rows", "[check]") {
  // stationary [K = 128, M = 128] with every K row written but columns m >= 72 never written (written
  // element-wise by rows: all 128 partitions, 72 columns): output rows m >= 72 tainted, the others clean.
  // An element-wise op over the column-tainted stationary tile keeps the column taint.
  auto s = checked_sim();
  const auto& out = s->alloc_hbm("out", {128, 64}, DType::kFloat32);
  const Operand st0 = s->alloc_tile(Space::kSbuf, 128, {128}, DType::kFloat32);
  const Operand st = s->alloc_tile(Space::kSbuf, 128, {128}, DType::kFloat32);
  const Operand mv = s->alloc_tile(Space::kSbuf, 128, {64}, DType::kFloat32);
  const Operand ps = s->alloc_tile(Space::kPsum, 128, {64}, DType::kFloat32);
  s->submit(memset0(Operand::tile(Space::kSbuf, DType::kFloat32, st0.offset, 0, 128, {72})));
  s->submit(scale(st, st0, 2.0f));  // columns 72..127 of st tainted, in every partition
  // (d) the columns of st: its good columns store cleanly, a bad one does not
  s->submit(dma(hbm_rows(out, 0, 128), Operand::tile(Space::kSbuf, DType::kFloat32, st.offset, 0, 128, {64})));
  CHECK(s->check_reports().empty());
  s->submit(memset0(mv));
  s->submit(instr(Opcode::kLoadStationary, Engine::kTensor, {st}));
  s->submit(instr(Opcode::kMultiplyMoving, Engine::kTensor, {ps, mv}));
  CHECK(s->check_reports().empty());
  s->submit(dma(hbm_rows(out, 0, 72), rows_of(ps, 0, 72, 64)));
  // an accumulation keeps the taint it adds into, and adds its own (here none: a clean stationary)
  const Operand st2 = s->alloc_tile(Space::kSbuf, 128, {128}, DType::kFloat32);
  s->submit(memset0(st2));
  s->submit(instr(Opcode::kLoadStationary, Engine::kTensor, {st2}));
  Instr acc = instr(Opcode::kMultiplyMoving, Engine::kTensor, {ps, mv});
  acc.flags = isa::kAccumulate;
  s->submit(acc);
  s->submit(dma(hbm_rows(out, 0, 72), rows_of(ps, 0, 72, 64)));
  CHECK(s->check_reports().empty());
  s->submit(dma(hbm_rows(out, 0, 128), ps));
  s->finish();
  REQUIRE(s->check_reports().size() == 1);
  const engines::CheckReport& r = s->check_reports()[0];
  INFO(r.detail);
  CHECK(r.op == "dma_copy");
  CHECK(r.detail.find("stores 3584 psum elements of src that were never written or computed from never-written data "
                      "(of 8192), first at partition 72 element 0, last at partition 127 element 63") != std::string::npos);
  CHECK(r.detail.find("first read by tensor_scalar (data)") != std::string::npos);
}

TEST_CASE("checker: a tainted tile overwritten by a good write stores without a report", "[check]") {
  auto s = checked_sim();
  const auto& out = s->alloc_hbm("out", {128, 64}, DType::kFloat32);
  const Operand t = s->alloc_tile(Space::kSbuf, 128, {64}, DType::kFloat32);
  const Operand u = s->alloc_tile(Space::kSbuf, 128, {64}, DType::kFloat32);
  s->submit(memset0(rows_of(t, 0, 32, 64)));
  s->submit(scale(u, t, 3.0f));  // u rows 32..127 tainted
  s->submit(memset0(t));         // t now all written
  s->submit(scale(u, t, 3.0f));  // overwrites u from good data: the taint is gone
  s->submit(dma(hbm_rows(out, 0, 128), u));
  // a tainted write into part of a region a good read verified (Checker::verified_) is seen again
  s->submit(memset0(rows_of(t, 0, 32, 64)));
  const Operand w = s->alloc_tile(Space::kSbuf, 128, {64}, DType::kFloat32);
  s->submit(scale(rows_of(u, 32, 8, 64), rows_of(w, 32, 8, 64), 1.0f));  // u rows 32..39 tainted again
  CHECK(s->check_reports().empty());
  s->submit(dma(hbm_rows(out, 0, 128), u));
  s->finish();
  REQUIRE(s->check_reports().size() == 1);
  INFO(s->check_reports()[0].detail);
  CHECK(s->check_reports()[0].detail.find("stores 512 sbuf elements of src that were never written or computed from "
                                          "never-written data (of 8192), first at partition 32 element 0, last at "
                                          "partition 39 element 63") != std::string::npos);
}

TEST_CASE("checker: taint follows tensor_copy through PSUM and partition offsets", "[check]") {
  // SBUF rows 16..31 never written -> tensor_copy into PSUM partitions 64..127 -> tensor_copy back into SBUF
  // partitions 0..63 -> DMA: the bad rows are 16..31 of the copies, relative to each operand's first partition.
  auto s = checked_sim();
  const auto& out = s->alloc_hbm("out", {128, 32}, DType::kFloat32);
  const Operand t = s->alloc_tile(Space::kSbuf, 128, {32}, DType::kFloat32);
  const Operand ps = s->alloc_tile(Space::kPsum, 128, {32}, DType::kFloat32);
  const Operand u = s->alloc_tile(Space::kSbuf, 128, {32}, DType::kFloat32);
  s->submit(memset0(rows_of(t, 0, 16, 32)));
  s->submit(memset0(rows_of(t, 32, 32, 32)));
  s->submit(instr(Opcode::kTensorCopy, Engine::kVector, {rows_of(ps, 64, 64, 32), rows_of(t, 0, 64, 32)}));
  s->submit(instr(Opcode::kTensorCopy, Engine::kVector, {rows_of(u, 0, 64, 32), rows_of(ps, 64, 64, 32)}));
  s->submit(dma(hbm_rows(out, 0, 16), rows_of(u, 0, 16, 32)));    // good rows
  s->submit(dma(hbm_rows(out, 32, 32), rows_of(u, 32, 32, 32)));  // good rows
  CHECK(s->check_reports().empty());
  // an accumulating matmul into the tainted PSUM rows keeps them tainted (no W502: they were written)
  const Operand st = s->alloc_tile(Space::kSbuf, 128, {128}, DType::kFloat32);
  const Operand mv = s->alloc_tile(Space::kSbuf, 128, {32}, DType::kFloat32);
  s->submit(memset0(st));
  s->submit(memset0(mv));
  s->submit(instr(Opcode::kLoadStationary, Engine::kTensor, {rows_of(st, 0, 128, 64)}));
  Instr mm = instr(Opcode::kMultiplyMoving, Engine::kTensor, {rows_of(ps, 64, 64, 32), mv});
  mm.flags = isa::kAccumulate;
  s->submit(mm);
  CHECK(s->check_reports().empty());
  s->submit(dma(hbm_rows(out, 0, 64), rows_of(ps, 64, 64, 32)));
  s->submit(dma(hbm_rows(out, 0, 64), rows_of(u, 0, 64, 32)));  // counted
  s->finish();
  REQUIRE(s->check_reports().size() == 1);
  const engines::CheckReport& r = s->check_reports()[0];
  INFO(r.detail);
  CHECK(r.count == 2);
  CHECK(r.detail.find("stores 512 psum elements of src that were never written or computed from never-written data "
                      "(of 2048), first at partition 80 element 0, last at partition 95 element 31") !=
        std::string::npos);
}

TEST_CASE("checker: tainted bytes of one allocation are stale for the next one sharing the storage", "[check]") {
  // The allocation that wrote them tainted reads them as tainted; another allocation as never written.
  for (const bool own : {true, false}) {
    auto s = checked_sim();
    const Operand t = s->alloc_tile(Space::kSbuf, 128, {64}, DType::kFloat32);
    const Operand u = s->alloc_tile(Space::kSbuf, 128, {64}, DType::kFloat32);
    const Operand o = s->alloc_tile(Space::kSbuf, 128, {64}, DType::kFloat32);
    const uint8_t a = engines::slot_tag(9, 1), b = engines::slot_tag(9, 2), in_tag = engines::slot_tag(10, 1),
                  out = engines::slot_tag(11, 1);
    REQUIRE(a != b);
    CHECK(a < engines::kTagAny);
    CHECK((a & engines::kTainted) == 0);
    engines::SlotTags w_in{in_tag}, w_a{a, in_tag}, r_a{out, a}, r_b{out, b};
    s->set_slot_tags(&w_in);
    s->submit(memset0(rows_of(t, 0, 64, 64)));
    s->set_slot_tags(&w_a);
    s->submit(scale(u, t, 2.0f));  // u (allocation a) rows 64..127 tainted
    s->set_slot_tags(&r_a);
    s->submit(dma(rows_of(o, 0, 64, 64), rows_of(u, 0, 64, 64)));  // a's good rows: fine
    CHECK(s->check_reports().empty());
    s->set_slot_tags(own ? &r_a : &r_b);
    s->submit(dma(o, u));  // a: its tainted rows; b reads before writing: all stale, tainted rows included
    s->finish();
    INFO("own " << own);
    REQUIRE(s->check_reports().size() == 1);
    INFO(s->check_reports()[0].detail);
    CHECK(s->check_reports()[0].detail.find(
              own ? "reads 4096 sbuf elements of src that were never written or computed from never-written data "
                    "(of 8192), first at partition 64 element 0"
                  : "reads 8192 sbuf never-written elements of src") != std::string::npos);
  }
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
    s->submit(dma(b, a));  // a never written in this run, although the last run wrote these bytes (a DMA reports)
    s->submit(memset0(a));
    s->finish();
    INFO("round " << round);
    REQUIRE(s->check_reports().size() == 1);
    CHECK(s->check_reports()[0].kind == engines::CheckKind::kUninitializedRead);
  }
}

TEST_CASE("checker: a compute view must start where the hardware allows for its partition count (W509)", "[check]") {
  // nki-api.md 2.0: n > 64 partitions start at 0; 32 < n <= 64 at 0 or 64; n <= 32 at 0, 32, 64 or 96. A DMA may
  // start anywhere.
  auto s = checked_sim();
  const Operand t = s->alloc_tile(Space::kSbuf, 128, {16}, DType::kFloat32);
  const auto rows = [&](uint32_t p0, uint32_t n) {
    return Operand::tile(Space::kSbuf, DType::kFloat32, t.offset, p0, n, {16});
  };
  for (const auto& [p0, n] : std::vector<std::pair<uint32_t, uint32_t>>{{0, 128}, {0, 96}, {64, 64}, {0, 40},
                                                                         {96, 32}, {32, 1}, {64, 20}})
    s->submit(memset0(rows(p0, n)));
  const Operand u = s->alloc_tile(Space::kSbuf, 128, {16}, DType::kFloat32);
  s->submit(dma(Operand::tile(Space::kSbuf, DType::kFloat32, u.offset, 5, 3, {16}), rows(0, 3)));
  CHECK(s->check_reports().empty());
  s->submit(memset0(rows(16, 32)));  // 32 partitions at 16
  s->submit(memset0(rows(32, 96)));  // 96 at 32: counted with the first
  s->finish();
  REQUIRE(s->check_reports().size() == 1);
  const engines::CheckReport& r = s->check_reports()[0];
  CHECK(r.kind == engines::CheckKind::kStartPartition);
  CHECK(r.count == 2);
  CHECK(r.detail == "operand 'dst' covers 32 partitions starting at partition 16 (a view of 32 partitions must start "
                    "at 0, 32, 64 or 96)");
  CHECK(std::string(r.info().code) == "NSIM-W509");
}
