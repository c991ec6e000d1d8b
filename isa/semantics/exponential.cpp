// exponential (gen4): dst = exp(src - max_value) in fp32, max_value = imm[0] (kHasImm0) or
// views[2][p, 0] (0 when neither). VectorE registers st.vector_acc, a running sum of the fp32 results:
// reset / reset_reduce -> 0; load_reduce -> views[4][p, 0] if present else imm[1]; reduce /
// reset_reduce / load_reduce -> acc += sum(row); reduce_res (views[3]) [p, 0] = acc.
#include <cmath>

#include <fmt/format.h>

#include "isa/semantics/exp_row.h"
#include "isa/semantics/internal.h"

namespace nsim::isa {

void exec_kExponential(const Instr& in, const Views& v, ArchState& st) {
  using namespace sem;
  const TileView& dst = v[0];
  const TileView& src = v[1];
  const TileView& mx = v[2];
  const TileView& rres = v[3];
  const TileView& rinit = v[4];
  require(in, dst, "dst");
  require(in, src, "src");
  require_same_shape(in, dst, "dst", src, "src");
  if (mx.valid()) require_vector(in, mx, "operand0", dst);
  if (rres.valid()) require_vector(in, rres, "reduce_res", dst);
  if (rinit.valid()) require_vector(in, rinit, "reduce_init", dst);
  if (dst.partitions > st.vector_acc.size())
    fail(ErrorCode::kTooManyPartitions, in, fmt::format("{} partitions exceed the 128 registers", dst.partitions));
  const bool imm0 = (in.flags & kHasImm0) != 0;
  const ReduceCmd cmd = in.reduce_cmd;
  const int64_t n = dst.elems();
  float* x = fscratch(0, n);
  for (uint32_t p = 0; p < dst.partitions; ++p) {
    const float m = imm0 ? in.imm[0] : mx.valid() ? scalar_f32(mx, p) : 0.0f;
    read_row(src, p, x);
    for (int64_t j = 0; j < n; ++j) x[j] = x[j] - m;
    exp_row(x, n);
    write_row(dst, p, x);
    float& acc = st.vector_acc[p];
    switch (cmd) {
      case ReduceCmd::kReset:
      case ReduceCmd::kResetReduce: acc = 0.0f; break;
      case ReduceCmd::kLoadReduce: acc = rinit.valid() ? scalar_f32(rinit, p) : in.imm[1]; break;
      default: break;
    }
    if (cmd == ReduceCmd::kReduce || cmd == ReduceCmd::kResetReduce || cmd == ReduceCmd::kLoadReduce)
      acc += reduce_fold(AluOp::kAdd, x, n);
    if (rres.valid()) store_f32(rres.dtype, rres.at(p, 0), acc);
  }
}

}  // namespace nsim::isa
