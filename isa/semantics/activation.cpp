// activation: y = f(data * scale + bias) in fp32; dst = cast(y). scale = views[3][p,0] if present
// else imm[2]; bias = views[2][p,0] if present else imm[3]; prelu alpha = imm[1].
// ScalarE registers st.scalar_acc (indexed by the partition within the view), reduce op alu1
// (bypass = add): reset / reset_reduce -> identity; reduce / reset_reduce -> acc = op(acc, fold(y));
// (load_reduce acts as reduce: no init operand); reduce_res (views[4]) [p,0] = acc after the update. activation_reduce shares this with
// reduce_cmd forced to reset_reduce.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "isa/semantics/internal.h"

namespace nsim::isa {

namespace sem {

void activation_impl(const Instr& in, const Views& v, ArchState& st, ReduceCmd cmd) {
  const TileView& dst = v[0];
  const TileView& data = v[1];
  const TileView& bias = v[2];
  const TileView& scale = v[3];
  const TileView& rres = v[4];
  require(in, dst, "dst");
  require(in, data, "data");
  require_same_shape(in, dst, "dst", data, "data");
  if (bias.valid()) require_vector(in, bias, "bias", dst);
  if (scale.valid()) require_vector(in, scale, "scale", dst);
  if (rres.valid()) require_vector(in, rres, "reduce_res", dst);
  if (dst.partitions > st.scalar_acc.size())
    fail(ErrorCode::kTooManyPartitions, in, fmt::format("{} partitions exceed the 128 registers", dst.partitions));
  const int64_t n = dst.elems();
  const AluOp rop = reduce_op_or_add(in.alu1);
  const bool reset = cmd == ReduceCmd::kReset || cmd == ReduceCmd::kResetReduce;
  const bool reduce = cmd == ReduceCmd::kReduce || cmd == ReduceCmd::kResetReduce || cmd == ReduceCmd::kLoadReduce;
  float* y = fscratch(0, n);
  for (uint32_t p = 0; p < dst.partitions; ++p) {
    const float sc = scale.valid() ? scalar_f32(scale, p) : in.imm[2];
    // A zero bias adds -0 (x + -0 is x, -0 included); with scale 1 too the input passes through as it is (nl.copy is
    // the identity: -0 and signalling NaNs keep their bits).
    const float bi = bias.valid() ? scalar_f32(bias, p) : in.imm[3] == 0.0f ? -0.0f : in.imm[3];
    const float* x = row_f32(data, p, y);  // (y itself when the row had to be converted)
    if (sc == 1.0f && bi == 0.0f && std::signbit(bi)) {
      if (x != y) std::copy(x, x + n, y);
    } else {
      for (int64_t j = 0; j < n; ++j) {
        const float prod = x[j] * sc;  // two roundings (no fused multiply-add)
        y[j] = prod + bi;
      }
    }
    act_apply_row(in.act, y, n, in.imm[1]);
    write_row(dst, p, y);
    float& acc = st.scalar_acc[p];
    if (reset) acc = alu_identity(rop);
    if (reduce) acc = alu_apply(rop, acc, reduce_fold(rop, y, n));
    if (rres.valid()) store_f32(rres.dtype, rres.at(p, 0), acc);
  }
}

}  // namespace sem

void exec_kActivation(const Instr& in, const Views& v, ArchState& st) { sem::activation_impl(in, v, st, in.reduce_cmd); }

}  // namespace nsim::isa
