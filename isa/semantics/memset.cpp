// memset: every element of dst = value cast to dst.dtype. Integer/bool dst: store_int(iimm[0]);
// float dst: store_f32(imm[0]).
#include <cstring>

#include "isa/semantics/internal.h"

namespace nsim::isa {

void exec_kMemset(const Instr& in, const Views& v, ArchState&) {
  using namespace sem;
  const TileView& dst = v[0];
  require(in, dst, "dst");
  const int64_t n = dst.elems();
  const int es = esz(dst);
  uint8_t one[8] = {};
  if (dtype_is_int(dst.dtype)) {
    store_int(dst.dtype, one, in.iimm[0]);
  } else {
    store_f32(dst.dtype, one, in.imm[0]);
  }
  uint8_t* row = bscratch(0, n * es);
  for (int64_t j = 0; j < n; ++j) std::memcpy(row + j * es, one, static_cast<size_t>(es));
  for (uint32_t p = 0; p < dst.partitions; ++p) scatter_bytes(dst, p, row);
}

}  // namespace nsim::isa
