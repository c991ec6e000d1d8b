// set_rng_seed: seeds the PRNG streams of VectorE and GpSimd (st.rng) from every element of
// src_seeds (raw integers, partition-major): state = h with h = splitmix64(h) ^ seed for each seed. Equal seeds
// give equal streams (nsim policy: not bit-compatible with hardware XORWOW).
#include "isa/semantics/internal.h"

namespace nsim::isa {

void exec_kSetRngSeed(const Instr& in, const Views& v, ArchState& st) {
  using namespace sem;
  const TileView& seeds = v[0];
  require(in, seeds, "src_seeds");
  const int64_t n = seeds.elems();
  int64_t* x = iscratch(0, n);
  uint64_t h = 0;
  for (uint32_t p = 0; p < seeds.partitions; ++p) {
    read_row_int(seeds, p, x);
    for (int64_t j = 0; j < n; ++j) {
      h = rng_next(h) ^ (static_cast<uint64_t>(x[j]) & 0xFFFFFFFFull);
    }
  }
  st.rng[static_cast<size_t>(Engine::kVector)] = h;
  st.rng[static_cast<size_t>(Engine::kGpsimd)] = h;
}

}  // namespace nsim::isa
