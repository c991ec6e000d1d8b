// tensor_scalar_cumulative: a scan through the VectorE registers st.vector_acc (spec nki-api.md 2.4).
// Register init by reduce_cmd: reset / reset_reduce -> identity of op1 (alu1: 0 add/subtract,
// 1 multiply, -inf maximum, +inf minimum); load_reduce -> views[3][p, 0] if present else imm[1];
// reduce / idle keep it. Then for each flat i: reg = op1(op0(src[i], imm0), reg) with imm0 = imm[0]
// (kHasImm0) or views[2][p, 0] (reverse0 swaps op0's operands); dst[i] = reg. The register keeps
// the last value.
#include <fmt/format.h>

#include "isa/semantics/internal.h"

namespace nsim::isa {

void exec_kTensorScalarCumulative(const Instr& in, const Views& v, ArchState& st) {
  using namespace sem;
  const TileView& dst = v[0];
  const TileView& src = v[1];
  const TileView& init = v[3];
  require(in, dst, "dst");
  require(in, src, "src");
  require_same_shape(in, dst, "dst", src, "src");
  const bool imm0 = (in.flags & kHasImm0) != 0, rev0 = (in.flags & kReverse0) != 0;
  const bool need0 = !ignores_operand(in.alu0);
  if (need0 && !imm0) {
    require(in, v[2], "operand0");
    require_vector(in, v[2], "operand0", dst);
  }
  if (init.valid()) require_vector(in, init, "reduce_init", dst);
  if (dst.partitions > st.vector_acc.size())
    fail(ErrorCode::kTooManyPartitions, in, fmt::format("{} partitions exceed the 128 registers", dst.partitions));
  const AluOp op1 = in.alu1;
  const int64_t n = dst.elems();
  float* x = fscratch(0, n);
  for (uint32_t p = 0; p < dst.partitions; ++p) {
    const float o0 = !need0 ? 0.0f : imm0 ? in.imm[0] : scalar_f32(v[2], p);
    float& reg = st.vector_acc[p];
    switch (in.reduce_cmd) {
      case ReduceCmd::kReset:
      case ReduceCmd::kResetReduce: reg = alu_identity(op1); break;
      case ReduceCmd::kLoadReduce: reg = init.valid() ? scalar_f32(init, p) : in.imm[1]; break;
      default: break;
    }
    read_row(src, p, x);
    for (int64_t i = 0; i < n; ++i) {
      reg = alu_apply(op1, apply_rev(in.alu0, x[i], o0, rev0), reg);
      x[i] = reg;
    }
    write_row(dst, p, x);
  }
}

}  // namespace nsim::isa
