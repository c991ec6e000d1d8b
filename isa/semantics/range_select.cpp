// range_select: idx = imm[0] + j (fp32); keep = op0(idx, bound0[p,0]) && op1(idx, bound1[p,0]);
// out = keep ? on_true : imm[1]; dst = cast(out). VectorE registers, reduce op maximum on the fp32
// out values: reset / reset_reduce -> -inf; reduce / reset_reduce / load_reduce (no init operand:
// acts as reduce) -> acc = max(acc, max_j out); reduce_res (views[4]) [p,0] = acc.
#include <limits>

#include <fmt/format.h>

#include "isa/semantics/internal.h"

namespace nsim::isa {

void exec_kRangeSelect(const Instr& in, const Views& v, ArchState& st) {
  using namespace sem;
  const TileView& dst = v[0];
  const TileView& on_true = v[1];
  const TileView& b0 = v[2];
  const TileView& b1 = v[3];
  const TileView& rres = v[4];
  require(in, dst, "dst");
  require(in, on_true, "on_true");
  require(in, b0, "bound0");
  require(in, b1, "bound1");
  require_same_shape(in, dst, "dst", on_true, "on_true");
  require_vector(in, b0, "bound0", dst);
  require_vector(in, b1, "bound1", dst);
  if (rres.valid()) require_vector(in, rres, "reduce_res", dst);
  if (dst.partitions > st.vector_acc.size())
    fail(ErrorCode::kTooManyPartitions, in, fmt::format("{} partitions exceed the 128 registers", dst.partitions));
  const ReduceCmd cmd = in.reduce_cmd;
  const bool reset = cmd == ReduceCmd::kReset || cmd == ReduceCmd::kResetReduce;
  const bool reduce = cmd == ReduceCmd::kReduce || cmd == ReduceCmd::kResetReduce || cmd == ReduceCmd::kLoadReduce;
  const int64_t n = dst.elems();
  float* x = fscratch(0, n);
  for (uint32_t p = 0; p < dst.partitions; ++p) {
    const float lo = scalar_f32(b0, p), hi = scalar_f32(b1, p);
    read_row(on_true, p, x);
    for (int64_t j = 0; j < n; ++j) {
      const float idx = in.imm[0] + static_cast<float>(j);
      const bool keep = alu_apply(in.alu0, idx, lo) != 0.0f && alu_apply(in.alu1, idx, hi) != 0.0f;
      if (!keep) x[j] = in.imm[1];
    }
    write_row(dst, p, x);
    float& acc = st.vector_acc[p];
    if (reset) acc = -std::numeric_limits<float>::infinity();
    if (reduce) acc = alu_apply(AluOp::kMaximum, acc, reduce_fold(AluOp::kMaximum, x, n));
    if (rres.valid()) store_f32(rres.dtype, rres.at(p, 0), acc);
  }
}

}  // namespace nsim::isa
