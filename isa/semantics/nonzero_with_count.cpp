// nonzero_with_count: only partitions 0, 16, ..., 112 of the views are read and written (the others
// stay untouched): dst[p, :T] = the indices (+ iimm[0] = index_offset) of the nonzero elements of
// src[p, :] in order, then iimm[1] = padding_val; dst[p, T] = their count (T = src elements per
// partition, dst has T + 1). Nonzero is tested on the fp32 value (NaN counts as nonzero).
#include "isa/semantics/internal.h"

namespace nsim::isa {

void exec_kNonzeroWithCount(const Instr& in, const Views& v, ArchState&) {
  using namespace sem;
  const TileView& dst = v[0];
  const TileView& src = v[1];
  require(in, dst, "dst");
  require(in, src, "src");
  require_same_partitions(in, dst, "dst", src, "src");
  const int64_t t = src.elems();
  if (dst.elems() != t + 1) fail(ErrorCode::kElementCountMismatch, in, "dst needs src's elements per partition + 1");
  float* x = fscratch(0, t);
  int64_t* out = iscratch(0, t + 1);
  for (uint32_t p = 0; p < dst.partitions; p += 16) {
    read_row(src, p, x);
    int64_t c = 0;
    for (int64_t j = 0; j < t; ++j)
      if (x[j] != 0.0f) out[c++] = j + in.iimm[0];
    for (int64_t j = c; j < t; ++j) out[j] = in.iimm[1];
    out[t] = c;
    write_row_int(dst, p, out);
  }
}

}  // namespace nsim::isa
