// scalar_tensor_tensor: t = op0(data, operand0) (reverse0 swaps; operand0 = imm[0] with kHasImm0,
// else the (P,1) vector views[2]); dst = op1(t, operand1) with operand1 the full tile views[3]
// (reverse1: op1(operand1, t)). fp32; bit-vector ops take the integer path.
#include "isa/semantics/internal.h"

namespace nsim::isa {

void exec_kScalarTensorTensor(const Instr& in, const Views& v, ArchState&) {
  using namespace sem;
  const TileView& dst = v[0];
  const TileView& data = v[1];
  const TileView& o1 = v[3];
  require(in, dst, "dst");
  require(in, data, "data");
  require(in, o1, "operand1");
  require_same_shape(in, dst, "dst", data, "data");
  require_same_shape(in, dst, "dst", o1, "operand1");
  const bool imm0 = (in.flags & kHasImm0) != 0;
  const bool rev0 = (in.flags & kReverse0) != 0, rev1 = (in.flags & kReverse1) != 0;
  const bool need0 = !ignores_operand(in.alu0);
  if (need0 && !imm0) {
    require(in, v[2], "operand0");
    require_vector(in, v[2], "operand0", dst);
  }
  const int64_t n = dst.elems();
  if (is_bitvec(in.alu0) || is_bitvec(in.alu1)) {
    int64_t* x = iscratch(0, n);
    int64_t* y = iscratch(1, n);
    for (uint32_t p = 0; p < dst.partitions; ++p) {
      const int64_t s = !need0 ? 0 : imm0 ? imm_to_int(in.imm[0]) : scalar_int(v[2], p);
      read_row_int(data, p, x);
      read_row_int(o1, p, y);
      for (int64_t j = 0; j < n; ++j) x[j] = apply_rev_int(in.alu1, apply_rev_int(in.alu0, x[j], s, rev0), y[j], rev1);
      write_row_int(dst, p, x);
    }
    return;
  }
  float* x = fscratch(0, n);
  float* y = fscratch(1, n);
  for (uint32_t p = 0; p < dst.partitions; ++p) {
    const float s = !need0 ? 0.0f : imm0 ? in.imm[0] : scalar_f32(v[2], p);
    read_row(data, p, x);
    const float* yr = row_f32(o1, p, y);
    alu_apply_row(in.alu0, x, nullptr, s, n, rev0);  // element-wise: two passes = op1(op0(x, s), y)
    alu_apply_row(in.alu1, x, yr, 0.0f, n, rev1);
    write_row(dst, p, x);
  }
}

}  // namespace nsim::isa
