// local_gather: per group g of 16 partitions, ids = index[16g : 16g + 16] flattened in column-major
// order (ids[k] = index[16g + k % 16, k / 16]), first V = iimm[1] of them (0 = all); for every
// partition p of the group and j < V: dst[p, j*E : (j+1)*E] = src_flat[p, ids[j] : ids[j] + E] with
// E = iimm[0] (num_elem_per_idx). Raw bytes (dst dtype == src dtype). An id whose run leaves the
// partition's data is an error (undefined on hardware; nsim policy, kOutOfBounds).
#include <cstring>

#include <fmt/format.h>

#include "isa/semantics/internal.h"

namespace nsim::isa {

void exec_kLocalGather(const Instr& in, const Views& v, ArchState&) {
  using namespace sem;
  const TileView& dst = v[0];
  const TileView& src = v[1];
  const TileView& index = v[2];
  require(in, dst, "dst");
  require(in, src, "src_buffer");
  require(in, index, "index");
  require_same_partitions(in, dst, "dst", src, "src_buffer");
  require_same_partitions(in, dst, "dst", index, "index");
  if (dst.dtype != src.dtype) fail(ErrorCode::kBadDtype, in, "dst must have the dtype of src_buffer");
  if (dst.partitions % 16 != 0) fail(ErrorCode::kShapeMismatch, in, "partitions must be a multiple of 16");
  const int64_t e = in.iimm[0];
  const int64_t fi = index.elems();
  const int64_t nv = in.iimm[1] == 0 ? 16 * fi : in.iimm[1];
  if (e < 1 || nv < 1 || nv > 16 * fi || dst.elems() != nv * e)
    fail(ErrorCode::kShapeMismatch, in,
         fmt::format("dst needs num_valid_indices x num_elem_per_idx = {} x {} elements per partition, got {}", nv, e,
                     dst.elems()));
  const int64_t m = src.elems();
  const int es = esz(dst);
  int64_t* ids = iscratch(0, 16 * fi);
  int64_t* row = iscratch(1, fi);
  uint8_t* s = bscratch(0, m * es);
  uint8_t* out = bscratch(1, nv * e * es);
  for (uint32_t g = 0; g < dst.partitions / 16; ++g) {
    for (uint32_t r = 0; r < 16; ++r) {
      read_row_int(index, 16 * g + r, row);
      for (int64_t c = 0; c < fi; ++c) ids[c * 16 + r] = row[c];
    }
    for (int64_t j = 0; j < nv; ++j)
      if (ids[j] < 0 || ids[j] + e > m)
        fail(ErrorCode::kOutOfBounds, in,
             fmt::format("index {} (+{} elements) is outside the {} elements per partition of src_buffer", ids[j], e, m));
    for (uint32_t r = 0; r < 16; ++r) {
      const uint32_t p = 16 * g + r;
      gather_bytes(src, p, s);
      for (int64_t j = 0; j < nv; ++j)
        std::memcpy(out + j * e * es, s + ids[j] * es, static_cast<size_t>(e * es));
      scatter_bytes(dst, p, out);
    }
  }
}

}  // namespace nsim::isa
