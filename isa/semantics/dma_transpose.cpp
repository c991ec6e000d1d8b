// dma_transpose: src viewed as [a rows (partitions), b elements per row]; dst as [b, a]:
// dst[j][i] = src[i][j]. Same dtype -> byte-exact; otherwise (rejected by verify) via fp32.
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
  const int64_t a = src.partitions, b = src.elems();
  if (dst.partitions != b || dst.elems() != a)
    fail(ErrorCode::kShapeMismatch, in,
         fmt::format("src is [{}, {}] so dst must be [{}, {}], got [{}, {}]", a, b, b, a, dst.partitions, dst.elems()));
  if (a == 0 || b == 0) return;
  const int ses = esz(src);
  uint8_t* raw = bscratch(0, a * b * ses);
  for (int64_t i = 0; i < a; ++i) gather_bytes(src, static_cast<uint32_t>(i), raw + i * b * ses);
  if (src.dtype == dst.dtype) {
    uint8_t* row = bscratch(1, a * ses);
    for (int64_t j = 0; j < b; ++j) {
      for (int64_t i = 0; i < a; ++i) std::memcpy(row + i * ses, raw + (i * b + j) * ses, static_cast<size_t>(ses));
      scatter_bytes(dst, static_cast<uint32_t>(j), row);
    }
    return;
  }
  float* row = fscratch(0, a);
  for (int64_t j = 0; j < b; ++j) {
    for (int64_t i = 0; i < a; ++i) row[i] = load_f32(src.dtype, raw + (i * b + j) * ses);
    write_row(dst, static_cast<uint32_t>(j), row);
  }
}

}  // namespace nsim::isa
