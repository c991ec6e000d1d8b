// bn_aggr: data per partition = (count, mean, M2) triples; N = sum c, mean = sum c*m / N,
// var = sum (M2 + c*(m - mean)^2) / N (population); dst = [mean, var]. Triples with count 0 are
// ignored; N == 0 gives [0, 0] (nsim policy). Accumulated in double, rounded to fp32 once.
#include <fmt/format.h>

#include "isa/semantics/internal.h"

namespace nsim::isa {

void exec_kBnAggr(const Instr& in, const Views& v, ArchState&) {
  using namespace sem;
  const TileView& dst = v[0];
  const TileView& data = v[1];
  require(in, dst, "dst");
  require(in, data, "data");
  require_same_partitions(in, dst, "dst", data, "data");
  if (dst.elems() != 2)
    fail(ErrorCode::kElementCountMismatch, in, fmt::format("dst needs 2 elements per partition, got {}", dst.elems()));
  const int64_t n = data.elems();
  if (n % 3 != 0)
    fail(ErrorCode::kElementCountMismatch, in,
         fmt::format("data needs (count, mean, M2) triples, got {} elements per partition", n));
  float* x = fscratch(0, n);
  float out[2];
  for (uint32_t p = 0; p < dst.partitions; ++p) {
    read_row(data, p, x);
    double N = 0.0, s = 0.0;
    for (int64_t t = 0; t < n; t += 3) {
      if (x[t] == 0.0f) continue;
      N += x[t];
      s += static_cast<double>(x[t]) * x[t + 1];
    }
    double mean = 0.0, var = 0.0;
    if (N != 0.0) {
      mean = s / N;
      double acc = 0.0;
      for (int64_t t = 0; t < n; t += 3) {
        if (x[t] == 0.0f) continue;
        const double d = static_cast<double>(x[t + 1]) - mean;
        acc += static_cast<double>(x[t + 2]) + static_cast<double>(x[t]) * d * d;
      }
      var = acc / N;
    }
    out[0] = static_cast<float>(mean);
    out[1] = static_cast<float>(var);
    write_row(dst, p, out);
  }
}

}  // namespace nsim::isa
