// nc_n_gather: dst[p, j] = data_flat[p, indices[p, j]] (raw bytes, dst dtype == data dtype);
// indices (unsigned) must lie in [0, elements per partition of data): out of range is an error
// (kOutOfBounds, nsim policy).
#include <cstring>

#include <fmt/format.h>

#include "isa/semantics/internal.h"

namespace nsim::isa {

void exec_kNcNGather(const Instr& in, const Views& v, ArchState&) {
  using namespace sem;
  const TileView& dst = v[0];
  const TileView& data = v[1];
  const TileView& idx = v[2];
  require(in, dst, "dst");
  require(in, data, "data");
  require(in, idx, "indices");
  require_same_shape(in, dst, "dst", idx, "indices");
  require_same_partitions(in, dst, "dst", data, "data");
  if (dst.dtype != data.dtype) fail(ErrorCode::kBadDtype, in, "dst must have the dtype of data");
  const int64_t n = dst.elems(), m = data.elems();
  const int es = esz(dst);
  uint8_t* src = bscratch(0, m * es);
  uint8_t* out = bscratch(1, n * es);
  int64_t* ix = iscratch(0, n);
  for (uint32_t p = 0; p < dst.partitions; ++p) {
    gather_bytes(data, p, src);
    read_row_int(idx, p, ix);
    for (int64_t j = 0; j < n; ++j) {
      if (ix[j] < 0 || ix[j] >= m)
        fail(ErrorCode::kOutOfBounds, in,
             fmt::format("indices[{}, {}] = {} is outside the {} elements per partition of data", p, j, ix[j], m));
      std::memcpy(out + j * es, src + ix[j] * es, static_cast<size_t>(es));
    }
    scatter_bytes(dst, p, out);
  }
}

}  // namespace nsim::isa
