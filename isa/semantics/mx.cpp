// MX (microscaling, nki-api.md 2.3): decoding x4-packed data with its group scales, shared by the MX halves
// of nc_matmul_mx (load_stationary, multiply_moving).
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "isa/semantics/internal.h"

namespace nsim::isa::sem {

void mx_decode(const Instr& in, const TileView& data, const TileView& scale, float* out) {
  require(in, scale, "scale");
  const int64_t K = data.partitions, C = data.elems();
  const int eb = dtype_bytes(data.dtype);
  if (scale.elems() != C || (K > 0 && mx_scale_row((K - 1) / 8) >= scale.partitions))
    fail(ErrorCode::kShapeMismatch, in,
         fmt::format("the scale view [{}, {}] does not cover the scales of x4 data [{}, {}]", scale.partitions,
                     scale.elems(), K, C));
  uint8_t* raw = bscratch(0, C * eb);
  uint8_t* sc = bscratch(1, C);
  for (int64_t k = 0; k < K; ++k) {
    gather_bytes(data, static_cast<uint32_t>(k), raw);
    if (k % 8 == 0) gather_bytes(scale, mx_scale_row(k / 8), sc);
    for (int64_t c = 0; c < C; ++c) {
      const float f = sc[c] == 0xff ? std::numeric_limits<float>::quiet_NaN()
                                    : std::ldexp(1.0f, static_cast<int>(sc[c]) - 127);
      for (int q = 0; q < 4; ++q) out[(4 * k + q) * C + c] = mx_x4_value(data.dtype, raw + c * eb, q) * f;
    }
  }
}

}  // namespace nsim::isa::sem
