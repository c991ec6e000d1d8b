// The sanitizer (engines/check/checker.h) on hand-built instruction streams: each check fires once on
// the buggy stream with the slot and element range, and not on the fixed one.
#include <catch2/catch.hpp>

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

TEST_CASE("checker is off unless asked for and needs numerics", "[check]") {
  auto s = checked_sim(false);
  const Operand a = s->alloc_tile(Space::kSbuf, 128, {64}, DType::kFloat32);
  s->submit(add(a, a, a));
  CHECK(s->check_reports().empty());
  CHECK(s->mutable_check_reports() == nullptr);
}
