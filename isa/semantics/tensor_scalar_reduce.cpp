// tensor_scalar_reduce: y = op0(data, operand0) (imm[0] with kHasImm0 else views[2][p,0];
// reverse0 swaps); dst = cast(y). VectorE registers st.vector_acc (indexed by partition within the
// view), reduce op alu1 (bypass = add): reset / reset_reduce -> identity; load_reduce -> views[4][p,0]
// if present else imm[1]; then for reduce / reset_reduce / load_reduce: acc = op(acc, fold(y)).
// reduce_res (views[3]) [p,0] = kNegate ? -acc : acc (the register keeps acc).
#include <fmt/format.h>

#include "isa/semantics/internal.h"

namespace nsim::isa {

void exec_kTensorScalarReduce(const Instr& in, const Views& v, ArchState& st) {
  using namespace sem;
  const TileView& dst = v[0];
  const TileView& data = v[1];
  const TileView& rres = v[3];
  const TileView& rinit = v[4];
  require(in, dst, "dst");
  require(in, data, "data");
  require_same_shape(in, dst, "dst", data, "data");
  const bool imm0 = (in.flags & kHasImm0) != 0, rev0 = (in.flags & kReverse0) != 0;
  const bool need0 = !ignores_operand(in.alu0);
  if (need0 && !imm0) {
    require(in, v[2], "operand0");
    require_vector(in, v[2], "operand0", dst);
  }
  if (rres.valid()) require_vector(in, rres, "reduce_res", dst);
  if (rinit.valid()) require_vector(in, rinit, "reduce_init", dst);
  if (dst.partitions > st.vector_acc.size())
    fail(ErrorCode::kTooManyPartitions, in, fmt::format("{} partitions exceed the 128 registers", dst.partitions));
  const ReduceCmd cmd = in.reduce_cmd;
  const AluOp rop = reduce_op_or_add(in.alu1);
  const bool negate = (in.flags & kNegate) != 0;
  const int64_t n = dst.elems();
  float* y = fscratch(0, n);
  for (uint32_t p = 0; p < dst.partitions; ++p) {
    const float o0 = !need0 ? 0.0f : imm0 ? in.imm[0] : scalar_f32(v[2], p);
    const float init = cmd != ReduceCmd::kLoadReduce ? 0.0f : rinit.valid() ? scalar_f32(rinit, p) : in.imm[1];
    read_row(data, p, y);
    for (int64_t j = 0; j < n; ++j) y[j] = apply_rev(in.alu0, y[j], o0, rev0);
    write_row(dst, p, y);
    float& acc = st.vector_acc[p];
    switch (cmd) {
      case ReduceCmd::kReset:
      case ReduceCmd::kResetReduce: acc = alu_identity(rop); break;
      case ReduceCmd::kLoadReduce: acc = init; break;
      default: break;
    }
    if (cmd == ReduceCmd::kReduce || cmd == ReduceCmd::kResetReduce || cmd == ReduceCmd::kLoadReduce)
      acc = alu_apply(rop, acc, reduce_fold(rop, y, n));
    if (rres.valid()) store_f32(rres.dtype, rres.at(p, 0), negate ? -acc : acc);
  }
}

}  // namespace nsim::isa
