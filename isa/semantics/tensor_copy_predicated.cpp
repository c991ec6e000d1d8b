// tensor_copy_predicated: where (predicate != 0) != kReversePred: dst = src (views[1], or the constant
// imm[0] with kHasImm0: fp32, or for an integer dst int_immediate(in, 0)); elsewhere dst is unchanged. Equal src/dst dtypes copy bytes
// exactly; else via fp32. Predicate: any dtype, nonzero (NaN included) = true.
#include <cstring>

#include "isa/semantics/internal.h"

namespace nsim::isa {

void exec_kTensorCopyPredicated(const Instr& in, const Views& v, ArchState&) {
  using namespace sem;
  const TileView& dst = v[0];
  const TileView& src = v[1];
  const TileView& pred = v[2];
  const bool imm = (in.flags & kHasImm0) != 0;
  require(in, dst, "dst");
  require(in, pred, "predicate");
  require_same_shape(in, dst, "dst", pred, "predicate");
  if (!imm) {
    require(in, src, "src");
    require_same_shape(in, dst, "dst", src, "src");
  }
  const bool rev = (in.flags & kReversePred) != 0;
  const int64_t n = dst.elems();
  const int es = esz(dst);
  float* pr = fscratch(0, n);
  uint8_t* drow = bscratch(0, n * es);
  if (imm || src.dtype == dst.dtype) {
    uint8_t fill[8] = {};
    if (imm && dtype_is_int(dst.dtype)) store_int(dst.dtype, fill, int_immediate(in, 0));  // (exact)
    else if (imm) store_f32(dst.dtype, fill, in.imm[0]);
    uint8_t* srow = imm ? nullptr : bscratch(1, n * es);
    for (uint32_t p = 0; p < dst.partitions; ++p) {
      read_row(pred, p, pr);
      gather_bytes(dst, p, drow);
      if (!imm) gather_bytes(src, p, srow);
      for (int64_t j = 0; j < n; ++j)
        if ((pr[j] != 0.0f) != rev)
          std::memcpy(drow + j * es, imm ? fill : srow + j * es, static_cast<size_t>(es));
      scatter_bytes(dst, p, drow);
    }
    return;
  }
  float* s = fscratch(1, n);
  for (uint32_t p = 0; p < dst.partitions; ++p) {
    read_row(pred, p, pr);
    read_row(src, p, s);
    gather_bytes(dst, p, drow);
    for (int64_t j = 0; j < n; ++j)
      if ((pr[j] != 0.0f) != rev) store_f32(dst.dtype, drow + j * es, s[j]);
    scatter_bytes(dst, p, drow);
  }
}

}  // namespace nsim::isa
