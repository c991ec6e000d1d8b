// tensor_scalar: t = op0(data, operand0) (reverse0: op0(operand0, data)); if op1 != bypass:
// out = op1(t, operand1) (reverse1 swaps). Operands are immediates (kHasImm0/1) or (P,1) vectors
// broadcast along the free dims. Bit-vector ops (either op) use the integer path, an immediate from iimm[i]
// (exact) when it rounds to imm[i], else imm[i] truncated to int64. Unary ops ignore their operand.
#include "isa/semantics/internal.h"

namespace nsim::isa {

void exec_kTensorScalar(const Instr& in, const Views& v, ArchState&) {
  using namespace sem;
  const TileView& dst = v[0];
  const TileView& data = v[1];
  require(in, dst, "dst");
  require(in, data, "data");
  require_same_shape(in, dst, "dst", data, "data");
  const bool imm0 = (in.flags & kHasImm0) != 0, imm1 = (in.flags & kHasImm1) != 0;
  const bool rev0 = (in.flags & kReverse0) != 0, rev1 = (in.flags & kReverse1) != 0;
  const bool has_op1 = in.alu1 != AluOp::kBypass;
  const bool need0 = !ignores_operand(in.alu0), need1 = has_op1 && !ignores_operand(in.alu1);
  if (need0 && !imm0) {
    require(in, v[2], "operand0");
    require_vector(in, v[2], "operand0", dst);
  }
  if (need1 && !imm1) {
    require(in, v[3], "operand1");
    require_vector(in, v[3], "operand1", dst);
  }
  const int64_t n = dst.elems();

  if (is_bitvec(in.alu0) || (has_op1 && is_bitvec(in.alu1))) {
    int64_t* x = iscratch(0, n);
    for (uint32_t p = 0; p < dst.partitions; ++p) {
      const int64_t o0 = !need0 ? 0 : imm0 ? int_immediate(in, 0) : scalar_int(v[2], p);
      const int64_t o1 = !need1 ? 0 : imm1 ? int_immediate(in, 1) : scalar_int(v[3], p);
      read_row_int(data, p, x);
      const auto rshift = [&](AluOp op, bool rev) { return op == AluOp::kRightShift && !rev; };
      for (int64_t j = 0; j < n; ++j) {
        int64_t t = apply_rev_int(in.alu0, rshift(in.alu0, rev0) ? shift_pattern(data.dtype, x[j]) : x[j], o0, rev0);
        if (has_op1) t = apply_rev_int(in.alu1, rshift(in.alu1, rev1) ? shift_pattern(data.dtype, t) : t, o1, rev1);
        x[j] = t;
      }
      write_row_int(dst, p, x);
    }
    return;
  }

  float* x = fscratch(0, n);
  for (uint32_t p = 0; p < dst.partitions; ++p) {
    const float o0 = !need0 ? 0.0f : imm0 ? in.imm[0] : scalar_f32(v[2], p);
    const float o1 = !need1 ? 0.0f : imm1 ? in.imm[1] : scalar_f32(v[3], p);
    read_row(data, p, x);
    alu_apply_row(in.alu0, x, nullptr, o0, n, rev0);  // element-wise: two passes = op1(op0(x))
    if (has_op1) alu_apply_row(in.alu1, x, nullptr, o1, n, rev1);
    write_row(dst, p, x);
  }
}

}  // namespace nsim::isa
