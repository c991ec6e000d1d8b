// activate2 (gen4, ScalarE): v = op1(op0(data, imm0), imm1) with op0 = alu0, op1 = alu1 (bypass
// skips a stage), imm0 = imm[0] (kHasImm0) or views[2][p, 0], imm1 = imm[1] (kHasImm1) or
// views[3][p, 0], kReverse0/1 swap each stage's operands; dst = act(v) (prelu alpha = imm[3]).
// ScalarE registers st.scalar_acc, reduce op = AluOp iimm[0] (bypass = add): reset / reset_reduce
// -> identity; reduce / reset_reduce / load_reduce -> acc = op(acc, fold(row)); reduce_res
// (views[4]) [p, 0] = acc.
#include <fmt/format.h>

#include "isa/semantics/internal.h"

namespace nsim::isa {

void exec_kActivate2(const Instr& in, const Views& v, ArchState& st) {
  using namespace sem;
  const TileView& dst = v[0];
  const TileView& data = v[1];
  const TileView& o0 = v[2];
  const TileView& o1 = v[3];
  const TileView& rres = v[4];
  require(in, dst, "dst");
  require(in, data, "data");
  require_same_shape(in, dst, "dst", data, "data");
  const bool imm0 = (in.flags & kHasImm0) != 0, imm1 = (in.flags & kHasImm1) != 0;
  const bool need0 = !ignores_operand(in.alu0), need1 = !ignores_operand(in.alu1);
  if (need0 && !imm0) {
    require(in, o0, "operand0");
    require_vector(in, o0, "operand0", dst);
  }
  if (need1 && !imm1) {
    require(in, o1, "operand1");
    require_vector(in, o1, "operand1", dst);
  }
  if (rres.valid()) require_vector(in, rres, "reduce_res", dst);
  if (dst.partitions > st.scalar_acc.size())
    fail(ErrorCode::kTooManyPartitions, in, fmt::format("{} partitions exceed the 128 registers", dst.partitions));
  const AluOp rop = reduce_op_or_add(static_cast<AluOp>(in.iimm[0]));
  const ReduceCmd cmd = in.reduce_cmd;
  const bool reset = cmd == ReduceCmd::kReset || cmd == ReduceCmd::kResetReduce;
  const bool reduce = cmd == ReduceCmd::kReduce || cmd == ReduceCmd::kResetReduce || cmd == ReduceCmd::kLoadReduce;
  const bool rev0 = (in.flags & kReverse0) != 0, rev1 = (in.flags & kReverse1) != 0;
  const int64_t n = dst.elems();
  float* y = fscratch(0, n);
  for (uint32_t p = 0; p < dst.partitions; ++p) {
    const float a = !need0 ? 0.0f : imm0 ? in.imm[0] : scalar_f32(o0, p);
    const float b = !need1 ? 0.0f : imm1 ? in.imm[1] : scalar_f32(o1, p);
    read_row(data, p, y);
    alu_apply_row(in.alu0, y, nullptr, a, n, rev0);
    alu_apply_row(in.alu1, y, nullptr, b, n, rev1);
    act_apply_row(in.act, y, n, in.imm[3]);
    write_row(dst, p, y);
    float& acc = st.scalar_acc[p];
    if (reset) acc = alu_identity(rop);
    if (reduce) acc = alu_apply(rop, acc, reduce_fold(rop, y, n));
    if (rres.valid()) store_f32(rres.dtype, rres.at(p, 0), acc);
  }
}

}  // namespace nsim::isa
