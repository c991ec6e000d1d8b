// select_reduce: pred = (predicate != 0) != kReversePred; out = pred ? on_true : on_false (imm[0]
// with kHasImm0, else views[3][p, 0]); dst = cast(out). VectorE registers, reduce op alu1 (bypass =
// maximum, the default of the API) on the fp32 out values: reset / reset_reduce -> identity (-inf
// for maximum); reduce / reset_reduce / load_reduce -> acc = op(acc, fold(out)); reduce_res
// (views[4]) [p, 0] = acc.
#include <fmt/format.h>

#include "isa/semantics/internal.h"

namespace nsim::isa {

void exec_kSelectReduce(const Instr& in, const Views& v, ArchState& st) {
  using namespace sem;
  const TileView& dst = v[0];
  const TileView& pred = v[1];
  const TileView& on_true = v[2];
  const TileView& on_false = v[3];
  const TileView& rres = v[4];
  require(in, dst, "dst");
  require(in, pred, "predicate");
  require(in, on_true, "on_true");
  require_same_shape(in, dst, "dst", pred, "predicate");
  require_same_shape(in, dst, "dst", on_true, "on_true");
  const bool imm0 = (in.flags & kHasImm0) != 0;
  if (!imm0) {
    require(in, on_false, "on_false");
    require_vector(in, on_false, "on_false", dst);
  }
  if (rres.valid()) require_vector(in, rres, "reduce_res", dst);
  if (dst.partitions > st.vector_acc.size())
    fail(ErrorCode::kTooManyPartitions, in, fmt::format("{} partitions exceed the 128 registers", dst.partitions));
  const AluOp rop = in.alu1 == AluOp::kBypass ? AluOp::kMaximum : in.alu1;
  const ReduceCmd cmd = in.reduce_cmd;
  const bool reset = cmd == ReduceCmd::kReset || cmd == ReduceCmd::kResetReduce;
  const bool reduce = cmd == ReduceCmd::kReduce || cmd == ReduceCmd::kResetReduce || cmd == ReduceCmd::kLoadReduce;
  const bool rev = (in.flags & kReversePred) != 0;
  const int64_t n = dst.elems();
  float* x = fscratch(0, n);
  float* c = fscratch(1, n);
  for (uint32_t p = 0; p < dst.partitions; ++p) {
    const float f = imm0 ? in.imm[0] : scalar_f32(on_false, p);
    read_row(on_true, p, x);
    read_row(pred, p, c);
    for (int64_t j = 0; j < n; ++j)
      if ((c[j] != 0.0f) == rev) x[j] = f;
    write_row(dst, p, x);
    float& acc = st.vector_acc[p];
    if (reset) acc = alu_identity(rop);
    if (reduce) acc = alu_apply(rop, acc, reduce_fold(rop, x, n));
    if (rres.valid()) store_f32(rres.dtype, rres.at(p, 0), acc);
  }
}

}  // namespace nsim::isa
