// tensor_tensor: dst = op(data1, data2) element-wise (flat per partition).
// Bit-vector ops: integer path on raw values. GpSimd with dst/data1/data2 all int32/uint32: exact
// integer arithmetic with two's-complement wrap. Otherwise fp32.
#include "isa/semantics/internal.h"

namespace nsim::isa {

namespace {
bool is_i32(DType t) { return t == DType::kInt32 || t == DType::kUInt32; }
}  // namespace

void exec_kTensorTensor(const Instr& in, const Views& v, ArchState&) {
  using namespace sem;
  const TileView& dst = v[0];
  const TileView& a = v[1];
  const TileView& b = v[2];
  require(in, dst, "dst");
  require(in, a, "data1");
  require(in, b, "data2");
  require_same_shape(in, dst, "dst", a, "data1");
  require_same_shape(in, dst, "dst", b, "data2");
  const int64_t n = dst.elems();
  const AluOp op = in.alu0;
  const bool int_path =
      is_bitvec(op) || (in.engine == Engine::kGpsimd && is_i32(dst.dtype) && is_i32(a.dtype) && is_i32(b.dtype));
  if (int_path) {
    int64_t* x = iscratch(0, n);
    int64_t* y = iscratch(1, n);
    for (uint32_t p = 0; p < dst.partitions; ++p) {
      read_row_int(a, p, x);
      read_row_int(b, p, y);
      if (op == AluOp::kRightShift)  // (a narrow dtype's bit pattern: a logical shift)
        for (int64_t j = 0; j < n; ++j) x[j] = shift_pattern(a.dtype, x[j]);
      for (int64_t j = 0; j < n; ++j) x[j] = alu_apply_int(op, x[j], y[j]);
      write_row_int(dst, p, x);
    }
    return;
  }
  float* x = fscratch(0, n);
  float* y = fscratch(1, n);
  for (uint32_t p = 0; p < dst.partitions; ++p) {
    read_row(a, p, x);
    alu_apply_row(op, x, row_f32(b, p, y), 0.0f, n);
    write_row(dst, p, x);
  }
}

}  // namespace nsim::isa
