// tensor_tensor_scan: per partition, fp32 state s = initial (views[3][p,0] if present else imm[0]);
// for each flat i: t = op0(data0[i], s) (reverse0: op0(s, data0[i])); s = op1(t, data1[i])
// (reverse1: op1(data1[i], t)); dst[i] = s.
#include "isa/semantics/internal.h"

namespace nsim::isa {

void exec_kTensorTensorScan(const Instr& in, const Views& v, ArchState&) {
  using namespace sem;
  const TileView& dst = v[0];
  const TileView& d0 = v[1];
  const TileView& d1 = v[2];
  const TileView& init = v[3];
  require(in, dst, "dst");
  require(in, d0, "data0");
  require(in, d1, "data1");
  require_same_shape(in, dst, "dst", d0, "data0");
  require_same_shape(in, dst, "dst", d1, "data1");
  if (init.valid()) require_vector(in, init, "initial", dst);
  const bool rev0 = (in.flags & kReverse0) != 0, rev1 = (in.flags & kReverse1) != 0;
  const int64_t n = dst.elems();
  float* x = fscratch(0, n);
  float* y = fscratch(1, n);
  for (uint32_t p = 0; p < dst.partitions; ++p) {
    float s = init.valid() ? scalar_f32(init, p) : in.imm[0];
    read_row(d0, p, x);
    read_row(d1, p, y);
    for (int64_t i = 0; i < n; ++i) {
      const float t = apply_rev(in.alu0, x[i], s, rev0);
      s = apply_rev(in.alu1, t, y[i], rev1);
      x[i] = s;
    }
    write_row(dst, p, x);
  }
}

}  // namespace nsim::isa
