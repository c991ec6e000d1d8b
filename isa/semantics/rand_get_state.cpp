// rand_get_state: every partition of dst gets the executing engine's PRNG state (st.rng): element 0
// = low 32 bits, element 1 = high 32 bits, the rest 0 (truncated to dst's integer width). See
// rand_set_state.
#include "isa/semantics/internal.h"

namespace nsim::isa {

void exec_kRandGetState(const Instr& in, const Views& v, ArchState& st) {
  using namespace sem;
  const TileView& dst = v[0];
  require(in, dst, "dst");
  const uint64_t s = st.rng[static_cast<size_t>(in.engine)];
  const int64_t n = dst.elems();
  int64_t* x = iscratch(0, n);
  for (int64_t j = 0; j < n; ++j) x[j] = j == 0 ? static_cast<int64_t>(s & 0xFFFFFFFFull) : j == 1 ? static_cast<int64_t>(s >> 32) : 0;
  for (uint32_t p = 0; p < dst.partitions; ++p) write_row_int(dst, p, x);
}

}  // namespace nsim::isa
