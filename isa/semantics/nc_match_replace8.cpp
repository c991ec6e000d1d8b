// nc_match_replace8: dst = data (via fp32); for i = 7 down to 0: the first j with dst[p, j] ==
// vals[p, i] (fp32 compare, on the partially replaced row) gets dst[p, j] = imm[0] and
// dst_idx[p, i] = j (spec nki-api.md 2.3). Not found (undefined on hardware; nsim policy): nothing
// replaced, dst_idx[p, i] = all ones.
#include "isa/semantics/internal.h"

namespace nsim::isa {

void exec_kNcMatchReplace8(const Instr& in, const Views& v, ArchState&) {
  using namespace sem;
  const TileView& dst = v[0];
  const TileView& data = v[1];
  const TileView& vals = v[2];
  const TileView& idx = v[3];
  require(in, dst, "dst");
  require(in, data, "data");
  require(in, vals, "vals");
  require_same_shape(in, dst, "dst", data, "data");
  require_same_partitions(in, dst, "dst", vals, "vals");
  if (vals.elems() != 8) fail(ErrorCode::kElementCountMismatch, in, "vals needs 8 elements per partition");
  if (idx.valid()) {
    require_same_partitions(in, dst, "dst", idx, "dst_idx");
    if (idx.elems() != 8) fail(ErrorCode::kElementCountMismatch, in, "dst_idx needs 8 elements per partition");
  }
  const int64_t n = data.elems();
  float* x = fscratch(0, n);
  float* w = fscratch(1, 8);
  int64_t out[8];
  for (uint32_t p = 0; p < dst.partitions; ++p) {
    read_row(data, p, x);
    read_row(vals, p, w);
    for (int i = 7; i >= 0; --i) {
      out[i] = -1;
      for (int64_t j = 0; j < n; ++j)
        if (x[j] == w[i]) {
          x[j] = in.imm[0];
          out[i] = j;
          break;
        }
    }
    write_row(dst, p, x);
    if (idx.valid()) write_row_int(idx, p, out);
  }
}

}  // namespace nsim::isa
