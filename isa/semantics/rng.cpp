// rng: every element of dst gets 32 random bits of the executing engine's PRNG stream (st.rng),
// truncated to dst's integer width; partition by partition in row-major element order.
#include "isa/semantics/internal.h"

namespace nsim::isa {

void exec_kRng(const Instr& in, const Views& v, ArchState& st) {
  using namespace sem;
  const TileView& dst = v[0];
  require(in, dst, "dst");
  uint64_t& s = st.rng[static_cast<size_t>(in.engine)];
  const int64_t n = dst.elems();
  int64_t* x = iscratch(0, n);
  for (uint32_t p = 0; p < dst.partitions; ++p) {
    for (int64_t j = 0; j < n; ++j) x[j] = static_cast<int64_t>(rng_next(s) >> 32);
    write_row_int(dst, p, x);
  }
}

}  // namespace nsim::isa
