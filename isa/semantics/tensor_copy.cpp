// tensor_copy: per partition flat copy with cast. Vector/GpSimd: bit-exact for equal dtypes;
// Scalar: always through fp32.
// With `offsets` (tensor_copy_dynamic_src/dst, nki-api.md 2.4; docs/isa.md): one runtime index
// idx = offsets[0] (kIndirectScalar) moves the src view (the dst view with kIndirectDst) by
// idx x iimm[1] elements within every partition. An idx outside [0, iimm[0]) is an error, or with
// kOobSkip leaves dst unchanged. verify() checked that every in-range idx stays inside the buffer.
#include <cstring>

#include <fmt/format.h>

#include "isa/semantics/internal.h"

namespace nsim::isa {

namespace {

void copy(const Instr& in, const TileView& dst, const TileView& src) {
  using namespace sem;
  const int64_t n = dst.elems();
  if (src.dtype == dst.dtype && in.engine != Engine::kScalar) {
    if (src.contiguous() && dst.contiguous()) {  // each row one block of bytes on both sides: moved in place
      // (memmove: a row read whole before it is written, as through the buffer below, partition by partition)
      const auto bytes = static_cast<size_t>(n * esz(src));
      for (uint32_t p = 0; p < dst.partitions; ++p)
        std::memmove(dst.base + static_cast<int64_t>(p) * dst.partition_stride_bytes,
                     src.base + static_cast<int64_t>(p) * src.partition_stride_bytes, bytes);
      return;
    }
    uint8_t* raw = bscratch(0, n * esz(src));
    for (uint32_t p = 0; p < dst.partitions; ++p) {
      gather_bytes(src, p, raw);
      scatter_bytes(dst, p, raw);
    }
    return;
  }
  float* row = fscratch(0, n);
  for (uint32_t p = 0; p < dst.partitions; ++p) {
    read_row(src, p, row);
    write_row(dst, p, row);
  }
}

}  // namespace

void exec_kTensorCopy(const Instr& in, const Views& v, ArchState&) {
  using namespace sem;
  const TileView& dst = v[0];
  const TileView& src = v[1];
  require(in, dst, "dst");
  require(in, src, "src");
  require_same_shape(in, dst, "dst", src, "src");
  if (!v[2].valid()) return copy(in, dst, src);
  int64_t idx = 0;
  read_row_int(v[2], 0, &idx);
  if (idx < 0 || idx >= in.iimm[0]) {
    if (in.flags & kOobSkip) return;
    fail(ErrorCode::kIndexOutOfBounds, in,
         fmt::format("runtime offset {} of the {} is outside [0, {}) (err_tensor_access_out_of_bound)", idx,
                     (in.flags & kIndirectDst) ? "dst" : "src", in.iimm[0]));
  }
  const bool to_dst = (in.flags & kIndirectDst) != 0;
  TileView moved = to_dst ? dst : src;
  moved.base += idx * static_cast<int64_t>(in.iimm[1]) * esz(moved);
  if (to_dst) copy(in, moved, src);
  else copy(in, dst, moved);
}

}  // namespace nsim::isa
