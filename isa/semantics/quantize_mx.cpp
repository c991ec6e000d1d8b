// quantize_mx (gen4, nki-api.md 2.3): src [P, F] fp16/bf16 -> dst [P, F/4] float8_e5m2_x4 / float8_e4m3fn_x4
// and dst_scale (uint8 / float8_e8m0fnu). A group is 8 partitions x 4 consecutive free elements (row-major
// over src's free dims): amax = max |v| over its 32 values; X = 2^(floor(log2 amax) - (Emax - 1)), Emax = 8
// (e4m3fn) / 15 (e5m2), X = 2^-127 when amax = 0; each value v becomes RNE(v / X) in the fp8 type, clipped to
// +-max finite first (nsim policy); the four values of one group row are packed little-endian into one x4
// element (value 0 in the low byte). The group's scale byte log2(X) + 127 goes to row (g / 4) * 32 + g % 4
// of the dst_scale view, column j (sem::mx_scale_row). nsim policy where the spec is silent: the exponent
// of X is clamped to [-127, 127] (scale bytes 0..254); a group holding Inf or NaN gets scale byte 255 (the
// e8m0 NaN) and all its values the fp8 NaN with the value's sign (e4m3fn 0x7f / 0xff, e5m2 0x7e / 0xfe).
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "isa/semantics/internal.h"

namespace nsim::isa {

namespace {
constexpr int kEmaxE4M3FN = 8, kEmaxE5M2 = 15;
constexpr float kMaxE4M3FN = 448.0f, kMaxE5M2 = 57344.0f;
constexpr int kScaleMinExp = -127, kScaleMaxExp = 127, kScaleBias = 127;
constexpr uint8_t kScaleNaN = 0xff;
}  // namespace

void exec_kQuantizeMx(const Instr& in, const Views& v, ArchState&) {
  using namespace sem;
  const TileView& dst = v[0];
  const TileView& src = v[1];
  const TileView& scale = v[2];
  require(in, dst, "dst");
  require(in, src, "src");
  require(in, scale, "dst_scale");
  const int64_t P = src.partitions, F = src.elems(), C = F / 4;
  if (P % 32 != 0 || F % 4 != 0 || dst.partitions != P || dst.elems() != C || scale.elems() != C ||
      (P > 0 && mx_scale_row((P - 1) / 8) >= scale.partitions))
    fail(ErrorCode::kShapeMismatch, in,
         fmt::format("src [{}, {}], dst [{}, {}] and dst_scale [{}, {}] do not fit the MX layout", P, F, dst.partitions,
                     dst.elems(), scale.partitions, scale.elems()));
  const bool e4m3 = dst.dtype == DType::kFloat8E4M3FNX4;
  const int emax = e4m3 ? kEmaxE4M3FN : kEmaxE5M2;
  const float fmax = e4m3 ? kMaxE4M3FN : kMaxE5M2;
  float* rows = fscratch(0, 8 * F);
  uint8_t* packed = bscratch(0, 8 * F);  // 8 rows x C elements x 4 bytes
  uint8_t* sc = bscratch(1, C);
  for (int64_t g = 0; g < P / 8; ++g) {
    for (int64_t r = 0; r < 8; ++r) read_row(src, static_cast<uint32_t>(g * 8 + r), rows + r * F);
    for (int64_t c = 0; c < C; ++c) {
      float amax = 0.0f;
      bool special = false;
      for (int64_t r = 0; r < 8; ++r)
        for (int64_t q = 0; q < 4; ++q) {
          const float x = rows[r * F + 4 * c + q];
          if (!std::isfinite(x)) special = true;
          else amax = std::max(amax, std::fabs(x));
        }
      int e = kScaleMinExp;
      if (!special && amax > 0.0f) {
        int ex = 0;
        std::frexp(amax, &ex);  // amax = m * 2^ex, m in [0.5, 1): floor(log2 amax) = ex - 1
        e = std::clamp(ex - 1 - (emax - 1), kScaleMinExp, kScaleMaxExp);
      }
      sc[c] = special ? kScaleNaN : static_cast<uint8_t>(e + kScaleBias);
      for (int64_t r = 0; r < 8; ++r)
        for (int64_t q = 0; q < 4; ++q) {
          const float x = rows[r * F + 4 * c + q];
          const float y = special ? std::copysign(std::numeric_limits<float>::quiet_NaN(), x)
                                  : std::clamp(static_cast<float>(std::ldexp(static_cast<double>(x), -e)), -fmax, fmax);
          packed[(r * C + c) * 4 + q] = e4m3 ? f32_to_f8e4m3fn_bits(y) : f32_to_f8e5m2_bits(y);
        }
    }
    for (int64_t r = 0; r < 8; ++r) scatter_bytes(dst, static_cast<uint32_t>(g * 8 + r), packed + r * C * 4);
    scatter_bytes(scale, mx_scale_row(g), sc);
  }
}

}  // namespace nsim::isa
