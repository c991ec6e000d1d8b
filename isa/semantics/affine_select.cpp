// affine_select: v = iota value (offset, channel_multiplier, pattern from iimm) per element;
// dst = on_true (views[1]) where cmp_op(v, 0) (alu0, compared exactly on the int32 value) else the
// fp32 constant imm[0]. Equal dtypes copy the on_true element bit-exactly; else via fp32.
#include <cstring>

#include "isa/semantics/internal.h"

namespace nsim::isa {

void exec_kAffineSelect(const Instr& in, const Views& v, ArchState&) {
  using namespace sem;
  const TileView& dst = v[0];
  const TileView& on_true = v[1];
  require(in, dst, "dst");
  require(in, on_true, "on_true");
  require_same_shape(in, dst, "dst", on_true, "on_true");
  const int64_t n = dst.elems();
  int64_t* iv = iscratch(0, n);
  if (on_true.dtype == dst.dtype) {
    const int es = esz(dst);
    uint8_t fill[8] = {};
    store_f32(dst.dtype, fill, in.imm[0]);
    uint8_t* row = bscratch(0, n * es);
    for (uint32_t p = 0; p < dst.partitions; ++p) {
      iota_row(in, p, n, iv);
      gather_bytes(on_true, p, row);
      for (int64_t j = 0; j < n; ++j)
        if (alu_apply_int(in.alu0, iv[j], 0) == 0) std::memcpy(row + j * es, fill, static_cast<size_t>(es));
      scatter_bytes(dst, p, row);
    }
    return;
  }
  float* x = fscratch(0, n);
  for (uint32_t p = 0; p < dst.partitions; ++p) {
    iota_row(in, p, n, iv);
    read_row(on_true, p, x);
    for (int64_t j = 0; j < n; ++j)
      if (alu_apply_int(in.alu0, iv[j], 0) == 0) x[j] = in.imm[0];
    write_row(dst, p, x);
  }
}

}  // namespace nsim::isa
