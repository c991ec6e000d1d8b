// dma_copy: dst = cast(src), elements paired by flat index over the whole view (partition-major,
// then row-major over the free dims). Same dtype -> byte copy; else via fp32. kAccumulate: dst += src
// in fp32. All of src is read before dst is written (overlapping views behave like a copy).
// With `offsets` (indirect gather/scatter, nki-api.md 3.9) the HBM side moves by idx * iimm[1]
// elements: kIndirectScalar shifts the whole view by idx = offsets[0]; otherwise the elements split
// into one chunk per offset (flat order, as the pairing) and chunk p of the HBM side shifts by
// idx = offsets[p] (duplicate scatter indices all apply, in row order). An
// idx outside [0, iimm[0]) is an error, or with kOobSkip leaves the destination (row) unchanged. The
// simulator checked that every in-range idx stays inside the HBM tensor before execution.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>

#include <fmt/format.h>

#include "isa/semantics/internal.h"

namespace nsim::isa {

namespace {

/// Whether runtime index `i` (of row `row`) is usable; throws unless oob_mode is skip.
bool index_ok(const Instr& in, int64_t i, uint32_t row) {
  if (i >= 0 && i < in.iimm[0]) return true;
  if (in.flags & kOobSkip) return false;
  sem::fail(ErrorCode::kIndexOutOfBounds, in,
            fmt::format("indirect index {} of row {} is outside [0, {}) (oob_mode=error; oob_mode=skip skips the row)",
                        i, row, in.iimm[0]));
}

TileView shifted(const TileView& v, int64_t idx, const Instr& in) {
  TileView t = v;
  t.base += idx * static_cast<int64_t>(in.iimm[1]) * sem::esz(v);
  return t;
}

/// The bytes a view can touch, [lo, hi) as addresses.
std::pair<uintptr_t, uintptr_t> span(const TileView& v) {
  const int64_t es = sem::esz(v);
  int64_t lo = 0, hi = 0;
  const auto reach = [&](int64_t n, int64_t step_bytes) {
    if (n > 1) (step_bytes < 0 ? lo : hi) += (n - 1) * step_bytes;
  };
  reach(v.partitions, v.partition_stride_bytes);
  for (int d = 0; d < v.nfree; ++d) reach(v.size[static_cast<size_t>(d)], v.stride[static_cast<size_t>(d)] * es);
  const auto b = reinterpret_cast<uintptr_t>(v.base);
  return {b + static_cast<uintptr_t>(lo), b + static_cast<uintptr_t>(hi + es)};  // lo <= 0: wraps back
}

void copy(const Instr& in, const TileView& dst, const TileView& src) {
  using namespace sem;
  const int64_t se = src.elems(), de = dst.elems();
  const int64_t total = se * src.partitions;
  const int ses = esz(src);
  const bool accumulate = (in.flags & kAccumulate) != 0;
  if (!accumulate && src.dtype == dst.dtype && src.partitions == dst.partitions && se == de) {
    const auto [slo, shi] = span(src);
    const auto [dlo, dhi] = span(dst);
    if (shi <= dlo || dhi <= slo) {  // apart (e.g. HBM and SBUF): row by row
      if (src.contiguous() && dst.contiguous()) {  // each row one block of bytes on both sides
        for (uint32_t p = 0; p < src.partitions; ++p)
          std::memcpy(dst.base + static_cast<int64_t>(p) * dst.partition_stride_bytes,
                      src.base + static_cast<int64_t>(p) * src.partition_stride_bytes, static_cast<size_t>(se * ses));
        return;
      }
      uint8_t* row = bscratch(0, se * ses);  // through a small buffer
      for (uint32_t p = 0; p < src.partitions; ++p) {
        gather_bytes(src, p, row);
        scatter_bytes(dst, p, row);
      }
      return;
    }
  }
  uint8_t* raw = bscratch(0, total * ses);
  for (uint32_t p = 0; p < src.partitions; ++p) gather_bytes(src, p, raw + static_cast<int64_t>(p) * se * ses);

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

/// Vector offsets: the elements (flat order) split into one equal chunk per offset; chunk p of the HBM
/// side moves by offsets[p] x iimm[1] elements and pairs with chunk p of the other side. Element by
/// element, so that duplicate scatter indices accumulate.
void gather_scatter(const Instr& in, const Views& v) {
  using namespace sem;
  const bool to_dst = (in.flags & kIndirectDst) != 0;
  const TileView& dst = v[0];
  const TileView& src = v[1];
  const uint32_t rows = v[2].partitions;
  const int64_t per_row = src.elems() * src.partitions / rows;  // verified: divides
  const int64_t se = src.elems(), de = dst.elems();
  const int64_t step = static_cast<int64_t>(in.iimm[1]) * esz(to_dst ? dst : src);
  const bool raw = !(in.flags & kAccumulate) && src.dtype == dst.dtype;
  for (uint32_t p = 0; p < rows; ++p) {
    const int64_t i = scalar_int(v[2], p);
    if (!index_ok(in, i, p)) continue;
    const int64_t shift = i * step;
    for (int64_t j = static_cast<int64_t>(p) * per_row, end = j + per_row; j < end; ++j) {
      const uint8_t* s = src.at(static_cast<uint32_t>(j / se), j % se) + (to_dst ? 0 : shift);
      uint8_t* d = dst.at(static_cast<uint32_t>(j / de), j % de) + (to_dst ? shift : 0);
      if (raw) {
        std::copy_n(s, esz(src), d);
        continue;
      }
      float x = load_f32(src.dtype, s);
      if (in.flags & kAccumulate) x += load_f32(dst.dtype, d);
      store_f32(dst.dtype, d, x);
    }
  }
}

}  // namespace

void exec_kDmaCopy(const Instr& in, const Views& v, ArchState&) {
  using namespace sem;
  const TileView& dst = v[0];
  const TileView& src = v[1];
  require(in, dst, "dst");
  require(in, src, "src");
  const int64_t total = src.elems() * src.partitions;
  if (total != dst.elems() * dst.partitions)
    fail(ErrorCode::kElementCountMismatch, in,
         fmt::format("src has {} elements but dst has {}", total, dst.elems() * dst.partitions));
  if (total == 0) return;
  if (!v[2].valid()) return copy(in, dst, src);
  if (!(in.flags & kIndirectScalar)) return gather_scatter(in, v);
  int64_t idx = 0;
  read_row_int(v[2], 0, &idx);
  if (!index_ok(in, idx, 0)) return;
  if (in.flags & kIndirectDst) copy(in, shifted(dst, idx, in), src);
  else copy(in, dst, shifted(src, idx, in));
}

}  // namespace nsim::isa
