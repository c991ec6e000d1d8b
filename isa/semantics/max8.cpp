// max8: per partition the 8 largest values of the flattened src (compared in fp32), in descending
// order, duplicates kept (spec nki-api.md 2.3). NaN ranks above every number (nsim policy; the
// ordering stays a strict weak order). dst (P, 8) = cast of those values.
#include <algorithm>
#include <cmath>

#include "isa/semantics/internal.h"

namespace nsim::isa {

void exec_kMax8(const Instr& in, const Views& v, ArchState&) {
  using namespace sem;
  const TileView& dst = v[0];
  const TileView& src = v[1];
  require(in, dst, "dst");
  require(in, src, "src");
  require_same_partitions(in, dst, "dst", src, "src");
  const int64_t n = src.elems();
  if (dst.elems() != 8 || n < 8)
    fail(ErrorCode::kElementCountMismatch, in, "dst needs 8 elements per partition and src at least 8");
  float* x = fscratch(0, n);
  auto greater = [](float a, float b) { return std::isnan(a) ? !std::isnan(b) : a > b; };
  for (uint32_t p = 0; p < dst.partitions; ++p) {
    read_row(src, p, x);
    std::partial_sort(x, x + 8, x + n, greater);
    write_row(dst, p, x);
  }
}

}  // namespace nsim::isa
