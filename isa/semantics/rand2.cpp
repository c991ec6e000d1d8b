// rand2 (gen4): dst = imm[0] + (imm[1] - imm[0]) * u with u uniform in [0, 1) from the executing
// engine's PRNG stream (st.rng), partition by partition in row-major element order (nsim policy:
// deterministic, seeded by set_rng_seed / rand_set_state, not bit-compatible with hardware).
#include "isa/semantics/internal.h"

namespace nsim::isa {

void exec_kRand2(const Instr& in, const Views& v, ArchState& st) {
  using namespace sem;
  const TileView& dst = v[0];
  require(in, dst, "dst");
  uint64_t& s = st.rng[static_cast<size_t>(in.engine)];
  const float lo = in.imm[0], span = in.imm[1] - in.imm[0];
  const int64_t n = dst.elems();
  float* x = fscratch(0, n);
  for (uint32_t p = 0; p < dst.partitions; ++p) {
    for (int64_t j = 0; j < n; ++j) x[j] = lo + span * rng_uniform(s);
    write_row(dst, p, x);
  }
}

}  // namespace nsim::isa
