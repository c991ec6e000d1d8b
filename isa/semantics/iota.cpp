// iota: value(p, idx) = offset + p*channel_multiplier + sum_d idx_d*step_d (int32, wrap), written
// to dst's free elements in row-major order; ints stored exactly, floats via fp32 (RNE).
// iimm = {offset, channel_multiplier, step0, num0, ..., step3, num3} (outermost first).
#include "isa/semantics/internal.h"

namespace nsim::isa {

void exec_kIota(const Instr& in, const Views& v, ArchState&) {
  using namespace sem;
  const TileView& dst = v[0];
  require(in, dst, "dst");
  const int64_t n = dst.elems();
  int64_t* x = iscratch(0, n);
  const bool is_int = dtype_is_int(dst.dtype);
  float* f = is_int ? nullptr : fscratch(0, n);
  for (uint32_t p = 0; p < dst.partitions; ++p) {
    iota_row(in, p, n, x);
    if (is_int) {
      write_row_int(dst, p, x);
    } else {
      for (int64_t j = 0; j < n; ++j) f[j] = static_cast<float>(x[j]);
      write_row(dst, p, f);
    }
  }
}

}  // namespace nsim::isa
