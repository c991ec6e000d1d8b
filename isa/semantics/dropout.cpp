// dropout: dst = 0 where u < prob else data (no rescaling), prob = imm[0] (kHasImm0) or
// views[2][p, 0]; u uniform in [0, 1) drawn from the executing engine's PRNG stream (st.rng),
// partition by partition in row-major element order (nsim policy: deterministic and seeded by
// set_rng_seed / rand_set_state, not bit-compatible with hardware).
#include "isa/semantics/internal.h"

namespace nsim::isa {

void exec_kDropout(const Instr& in, const Views& v, ArchState& st) {
  using namespace sem;
  const TileView& dst = v[0];
  const TileView& data = v[1];
  const TileView& prob = v[2];
  require(in, dst, "dst");
  require(in, data, "data");
  require_same_shape(in, dst, "dst", data, "data");
  const bool imm0 = (in.flags & kHasImm0) != 0;
  if (!imm0) {
    require(in, prob, "operand0");
    require_vector(in, prob, "operand0", dst);
  }
  uint64_t& s = st.rng[static_cast<size_t>(in.engine)];
  const int64_t n = dst.elems();
  float* x = fscratch(0, n);
  for (uint32_t p = 0; p < dst.partitions; ++p) {
    const float pr = imm0 ? in.imm[0] : scalar_f32(prob, p);
    read_row(data, p, x);
    for (int64_t j = 0; j < n; ++j)
      if (rng_uniform(s) < pr) x[j] = 0.0f;
    write_row(dst, p, x);
  }
}

}  // namespace nsim::isa
