// topk (GpSimd, spec nki-api.md 2.4): src holds, per group of 16 partitions, a vector of n = iimm[0]
// elements in "snake" order (element e at partition 16 g + e % 16, column e / 16). For each group the
// K largest elements (K = dst's elements per partition) are written, in ascending order, to partition
// 16 g of dst (values, in dst's dtype) and of dst_idx (their element indices e); the other partitions
// of dst and dst_idx are left untouched (as nonzero_with_count does). Decisions (the spec is silent):
// NaN counts as larger than every number; among equal values the lower index is selected first and,
// in the ascending output, comes first.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "isa/semantics/internal.h"

namespace nsim::isa {

void exec_kTopk(const Instr& in, const Views& v, ArchState&) {
  using namespace sem;
  const TileView& dst = v[0];
  const TileView& idx = v[1];
  const TileView& src = v[2];
  require(in, dst, "dst");
  require(in, idx, "dst_idx");
  require(in, src, "src");
  require_same_partitions(in, dst, "dst", src, "src");
  require_same_partitions(in, idx, "dst_idx", src, "src");
  const int64_t n = in.iimm[0], k = dst.elems(), f = src.elems();
  if (src.partitions % kTopkGroup != 0 || n < 1 || n > kTopkGroup * f || k < 1 || k > n || idx.elems() != k)
    fail(ErrorCode::kShapeMismatch, in, "topk: operands do not fit n (isa::verify checks them first)");
  thread_local std::vector<float> vals;
  thread_local std::vector<int64_t> order;
  float* row = fscratch(0, f);
  float* out_v = fscratch(1, k);
  int64_t* out_i = iscratch(0, k);
  vals.resize(static_cast<size_t>(n));
  for (uint32_t g = 0; g < src.partitions; g += kTopkGroup) {
    for (uint32_t lane = 0; lane < kTopkGroup; ++lane) {
      read_row(src, g + lane, row);
      for (int64_t e = lane; e < n; e += kTopkGroup) vals[static_cast<size_t>(e)] = row[e / kTopkGroup];
    }
    // "a before b" = a is larger (NaN largest), ties by lower index
    auto larger = [&](int64_t a, int64_t b) {
      const float x = vals[static_cast<size_t>(a)], y = vals[static_cast<size_t>(b)];
      const bool xn = std::isnan(x), yn = std::isnan(y);
      if (xn != yn) return xn;
      if (!xn && x != y) return x > y;
      return a < b;
    };
    order.resize(static_cast<size_t>(n));
    std::iota(order.begin(), order.end(), int64_t{0});
    std::partial_sort(order.begin(), order.begin() + k, order.end(), larger);
    // ascending: the selected ones from smallest to largest (equal values: lower index first)
    std::sort(order.begin(), order.begin() + k, [&](int64_t a, int64_t b) {
      const float x = vals[static_cast<size_t>(a)], y = vals[static_cast<size_t>(b)];
      const bool xn = std::isnan(x), yn = std::isnan(y);
      if (xn != yn) return yn;
      if (!xn && x != y) return x < y;
      return a < b;
    });
    for (int64_t j = 0; j < k; ++j) {
      out_v[j] = vals[static_cast<size_t>(order[static_cast<size_t>(j)])];
      out_i[j] = order[static_cast<size_t>(j)];
    }
    write_row(dst, g, out_v);
    write_row_int(idx, g, out_i);
  }
}

}  // namespace nsim::isa
