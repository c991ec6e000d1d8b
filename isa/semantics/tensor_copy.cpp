// tensor_copy: per partition flat copy with cast. Vector/GpSimd: bit-exact for equal dtypes;
// Scalar: always through fp32.
#include "isa/semantics/internal.h"

namespace nsim::isa {

void exec_kTensorCopy(const Instr& in, const Views& v, ArchState&) {
  using namespace sem;
  const TileView& dst = v[0];
  const TileView& src = v[1];
  require(in, dst, "dst");
  require(in, src, "src");
  require_same_shape(in, dst, "dst", src, "src");
  const int64_t n = dst.elems();
  if (src.dtype == dst.dtype && in.engine != Engine::kScalar) {
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

}  // namespace nsim::isa
