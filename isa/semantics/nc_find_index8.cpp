// nc_find_index8: for i = 0..7 in order, dst[p, i] = index of the first element of the flattened
// data[p] equal (in fp32) to vals[p, i] that no earlier i took (duplicate vals pair with successive
// matches in ascending order); not found -> all ones in dst's width (0xFFFFFFFF / 0xFFFF).
#include <algorithm>

#include "isa/semantics/internal.h"

namespace nsim::isa {

void exec_kNcFindIndex8(const Instr& in, const Views& v, ArchState&) {
  using namespace sem;
  const TileView& dst = v[0];
  const TileView& data = v[1];
  const TileView& vals = v[2];
  require(in, dst, "dst");
  require(in, data, "data");
  require(in, vals, "vals");
  require_same_partitions(in, dst, "dst", data, "data");
  require_same_partitions(in, dst, "dst", vals, "vals");
  if (dst.elems() != 8 || vals.elems() != 8)
    fail(ErrorCode::kElementCountMismatch, in, "dst and vals need 8 elements per partition");
  const int64_t n = data.elems();
  float* x = fscratch(0, n);
  float* w = fscratch(1, 8);
  uint8_t* taken = bscratch(0, n);
  int64_t out[8];
  for (uint32_t p = 0; p < dst.partitions; ++p) {
    read_row(data, p, x);
    read_row(vals, p, w);
    std::fill(taken, taken + n, uint8_t{0});
    for (int i = 0; i < 8; ++i) {
      out[i] = -1;  // all ones once stored in the unsigned dst
      for (int64_t j = 0; j < n; ++j)
        if (!taken[j] && x[j] == w[i]) {
          taken[j] = 1;
          out[i] = j;
          break;
        }
    }
    write_row_int(dst, p, out);
  }
}

}  // namespace nsim::isa
