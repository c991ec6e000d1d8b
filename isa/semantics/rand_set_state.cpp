// rand_set_state: the executing engine's PRNG state (st.rng, 64 bits) = src_seeds[0, 0] (low 32 bits)
// | src_seeds[0, 1] << 32 (0 when src_seeds has one element per partition). The inverse of
// rand_get_state (nsim policy: the hardware's per-lane XORWOW state is not modelled).
#include "isa/semantics/internal.h"

namespace nsim::isa {

void exec_kRandSetState(const Instr& in, const Views& v, ArchState& st) {
  using namespace sem;
  const TileView& src = v[0];
  require(in, src, "src_seeds");
  const auto lo = static_cast<uint64_t>(load_int(src.dtype, src.at(0, 0))) & 0xFFFFFFFFull;
  const uint64_t hi = src.elems() > 1 ? static_cast<uint64_t>(load_int(src.dtype, src.at(0, 1))) & 0xFFFFFFFFull : 0;
  st.rng[static_cast<size_t>(in.engine)] = lo | (hi << 32);
}

}  // namespace nsim::isa
