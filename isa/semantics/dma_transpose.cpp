// dma_transpose: src viewed as [a rows (partitions), m, c] (m = iimm[0], the middle elements of a 3-D / 4-D
// transpose; 0 or 1 for the 2-D form), dst as [c, m, a]: dst[j][k a + i] = src[i][k c + j] (the first and last dims
// swapped, the middle kept: nki-api.md 2.1 axes (1, 0), (2, 1, 0), (3, 1, 2, 0)). Same dtype -> byte-exact; otherwise
// (rejected by verify) via fp32.
#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "isa/semantics/internal.h"

namespace nsim::isa {

void exec_kDmaTranspose(const Instr& in, const Views& v, ArchState&) {
  using namespace sem;
  const TileView& dst = v[0];
  const TileView& src = v[1];
  require(in, dst, "dst");
  require(in, src, "src");
  const int64_t m = std::max<int64_t>(in.iimm[0], 1), a = src.partitions, f = src.elems(), c = f / m;
  if (f % m != 0 || dst.partitions != c || dst.elems() != m * a)
    fail(ErrorCode::kShapeMismatch, in,
         fmt::format("src is [{}, {}] with {} middle elements so dst must be [{}, {}], got [{}, {}]", a, f, m, c, m * a,
                     dst.partitions, dst.elems()));
  if (a == 0 || f == 0) return;
  const int ses = esz(src);
  uint8_t* raw = bscratch(0, a * f * ses);
  for (int64_t i = 0; i < a; ++i) gather_bytes(src, static_cast<uint32_t>(i), raw + i * f * ses);
  // dst row j, element k a + i = src row i, element k c + j
  const auto at = [&](int64_t j, int64_t e) { return raw + ((e % a) * f + (e / a) * c + j) * ses; };
  if (src.dtype == dst.dtype) {
    uint8_t* row = bscratch(1, m * a * ses);
    for (int64_t j = 0; j < c; ++j) {
      for (int64_t e = 0; e < m * a; ++e) std::memcpy(row + e * ses, at(j, e), static_cast<size_t>(ses));
      scatter_bytes(dst, static_cast<uint32_t>(j), row);
    }
    return;
  }
  float* row = fscratch(0, m * a);
  for (int64_t j = 0; j < c; ++j) {
    for (int64_t e = 0; e < m * a; ++e) row[e] = load_f32(src.dtype, at(j, e));
    write_row(dst, static_cast<uint32_t>(j), row);
  }
}

}  // namespace nsim::isa
