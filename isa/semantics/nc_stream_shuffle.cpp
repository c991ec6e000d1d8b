// nc_stream_shuffle: A = ceil(max(P_src, P_dst)/32)*32; for quadrant q < A/32 and i < 32: mask[i]
// == 255 keeps dst[q*32+i]; else dst[q*32+i,:] = src[q*32+mask[i],:] (rows beyond P_dst skipped; a
// source row beyond P_src throws kShapeMismatch before anything is written). All sources are read
// first, so dst may alias src. Equal dtypes copy bytes; else via fp32.
#include <algorithm>
#include <vector>

#include <fmt/format.h>

#include "isa/semantics/internal.h"

namespace nsim::isa {

void exec_kNcStreamShuffle(const Instr& in, const Views& v, ArchState&) {
  using namespace sem;
  const TileView& dst = v[0];
  const TileView& src = v[1];
  require(in, dst, "dst");
  require(in, src, "src");
  require_same_elems(in, dst, "dst", src, "src");
  const int64_t n = dst.elems();
  const int64_t ps = src.partitions, pd = dst.partitions;
  const int64_t A = (std::max(ps, pd) + 31) / 32 * 32;

  // Validate the whole mask first.
  for (int64_t q = 0; q < A / 32; ++q)
    for (int64_t i = 0; i < 32; ++i) {
      const int m = in.shuffle[static_cast<size_t>(i)];
      if (m == 255 || q * 32 + i >= pd) continue;
      if (q * 32 + m >= ps)
        fail(ErrorCode::kShapeMismatch, in,
             fmt::format("shuffle_mask[{}] = {} reads source row {} but src has {} partitions", i, m, q * 32 + m, ps));
    }

  const bool same = src.dtype == dst.dtype;
  const int ses = esz(src);
  uint8_t* raw = bscratch(0, ps * n * ses);
  for (int64_t p = 0; p < ps; ++p) gather_bytes(src, static_cast<uint32_t>(p), raw + p * n * ses);
  float* row = same ? nullptr : fscratch(0, n);
  for (int64_t q = 0; q < A / 32; ++q)
    for (int64_t i = 0; i < 32; ++i) {
      const int m = in.shuffle[static_cast<size_t>(i)];
      const int64_t r = q * 32 + i;
      if (m == 255 || r >= pd) continue;
      const uint8_t* s = raw + (q * 32 + m) * n * ses;
      if (same) {
        scatter_bytes(dst, static_cast<uint32_t>(r), s);
      } else {
        load_f32_n(src.dtype, s, row, n);
        write_row(dst, static_cast<uint32_t>(r), row);
      }
    }
}

}  // namespace nsim::isa
