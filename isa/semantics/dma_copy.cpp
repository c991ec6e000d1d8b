// dma_copy: dst = cast(src), elements paired by flat index over the whole view (partition-major,
// then row-major over the free dims). Same dtype -> byte copy; else via fp32. kAccumulate: dst += src
// in fp32. All of src is read before dst is written (overlapping views behave like a copy).
#include <fmt/format.h>

#include "isa/semantics/internal.h"

namespace nsim::isa {

void exec_kDmaCopy(const Instr& in, const Views& v, ArchState&) {
  using namespace sem;
  const TileView& dst = v[0];
  const TileView& src = v[1];
  require(in, dst, "dst");
  require(in, src, "src");
  const int64_t se = src.elems(), de = dst.elems();
  const int64_t total = se * src.partitions;
  if (total != de * dst.partitions)
    fail(ErrorCode::kElementCountMismatch, in,
         fmt::format("src has {} elements but dst has {}", total, de * dst.partitions));
  if (total == 0) return;

  const int ses = esz(src);
  uint8_t* raw = bscratch(0, total * ses);
  for (uint32_t p = 0; p < src.partitions; ++p) gather_bytes(src, p, raw + static_cast<int64_t>(p) * se * ses);

  const bool accumulate = (in.flags & kAccumulate) != 0;
  if (!accumulate && src.dtype == dst.dtype) {
    for (uint32_t p = 0; p < dst.partitions; ++p) scatter_bytes(dst, p, raw + static_cast<int64_t>(p) * de * ses);
    return;
  }
  float* val = fscratch(0, total);
  load_f32_n(src.dtype, raw, val, total);
  float* row = fscratch(1, de);
  for (uint32_t p = 0; p < dst.partitions; ++p) {
    const float* s = val + static_cast<int64_t>(p) * de;
    if (accumulate) {
      read_row(dst, p, row);
      for (int64_t j = 0; j < de; ++j) row[j] = row[j] + s[j];
      write_row(dst, p, row);
    } else {
      write_row(dst, p, s);
    }
  }
}

}  // namespace nsim::isa
