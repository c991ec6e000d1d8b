// reciprocal: dst = 1 / data in fp32 (IEEE: 1/0 -> +-inf).
#include "isa/semantics/internal.h"

namespace nsim::isa {

void exec_kReciprocal(const Instr& in, const Views& v, ArchState&) {
  using namespace sem;
  const TileView& dst = v[0];
  const TileView& data = v[1];
  require(in, dst, "dst");
  require(in, data, "data");
  require_same_shape(in, dst, "dst", data, "data");
  const int64_t n = dst.elems();
  float* x = fscratch(0, n);
  for (uint32_t p = 0; p < dst.partitions; ++p) {
    read_row(data, p, x);
    for (int64_t j = 0; j < n; ++j) x[j] = 1.0f / x[j];
    write_row(dst, p, x);
  }
}

}  // namespace nsim::isa
