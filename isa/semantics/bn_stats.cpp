// bn_stats: per partition over the flattened free elements, E = even positions, O = odd positions;
// dst (6 elements) = count(E), mean(E), M2(E), count(O), mean(O), M2(O) with M2 = sum of squared
// deviations (count * population variance). Empty set: 0, 0, 0. Inputs are widened to fp32; the
// sums are accumulated in double (two passes) and the results rounded to fp32 once (nsim policy:
// closest to the np.mean / np.var golden).
#include <fmt/format.h>

#include "isa/semantics/internal.h"

namespace nsim::isa {

void exec_kBnStats(const Instr& in, const Views& v, ArchState&) {
  using namespace sem;
  const TileView& dst = v[0];
  const TileView& data = v[1];
  require(in, dst, "dst");
  require(in, data, "data");
  require_same_partitions(in, dst, "dst", data, "data");
  if (dst.elems() != 6)
    fail(ErrorCode::kElementCountMismatch, in, fmt::format("dst needs 6 elements per partition, got {}", dst.elems()));
  const int64_t n = data.elems();
  float* x = fscratch(0, n);
  float out[6];
  for (uint32_t p = 0; p < dst.partitions; ++p) {
    read_row(data, p, x);
    for (int64_t par = 0; par < 2; ++par) {
      const int64_t cnt = n > par ? (n - par + 1) / 2 : 0;
      double mean = 0.0, m2 = 0.0;
      if (cnt > 0) {
        double sum = 0.0;
        for (int64_t j = par; j < n; j += 2) sum += x[j];
        mean = sum / static_cast<double>(cnt);
        for (int64_t j = par; j < n; j += 2) {
          const double d = x[j] - mean;
          m2 += d * d;
        }
      }
      out[par * 3 + 0] = static_cast<float>(cnt);
      out[par * 3 + 1] = static_cast<float>(mean);
      out[par * 3 + 2] = static_cast<float>(m2);
    }
    write_row(dst, p, out);
  }
}

}  // namespace nsim::isa
