// load_stationary: stationary [K partitions, M elements] -> st.stationary (K x M, fp32 values).
// kDoubleRow: stationary is [K, 2, M]; stored as (2K) x M with row r*K + k holding st[k, r, :]
// (multiply_moving lays out the moving [K, 2, N] the same way).
// MX (an x4-packed stationary, nc_matmul_mx): stored as (4K) x M, row 4k + q holding value q of st[k, :] times
// its group scale from views[1] (sem::mx_decode; multiply_moving decodes the moving the same way).
#include <fmt/format.h>

#include "isa/semantics/internal.h"

namespace nsim::isa {

void exec_kLoadStationary(const Instr& in, const Views& v, ArchState& st) {
  using namespace sem;
  const TileView& s = v[0];
  require(in, s, "stationary");
  const int64_t K = s.partitions, F = s.elems();
  if (dtype_is_mx_x4(s.dtype)) {
    float* vals = fscratch(1, 4 * K * F);
    mx_decode(in, s, v[1], vals);
    st.stationary.resize(static_cast<Eigen::Index>(4 * K), static_cast<Eigen::Index>(F));
    for (int64_t r = 0; r < 4 * K; ++r)
      for (int64_t m = 0; m < F; ++m) st.stationary(r, m) = vals[r * F + m];
    st.stationary_dtype = s.dtype;
    return;
  }
  const bool dbl = (in.flags & kDoubleRow) != 0;
  if (dbl && F % 2 != 0)
    fail(ErrorCode::kShapeMismatch, in, fmt::format("double_row stationary needs [K, 2, M], got {} elements", F));
  const int64_t M = dbl ? F / 2 : F;
  const int64_t R = dbl ? 2 * K : K;
  st.stationary.resize(static_cast<Eigen::Index>(R), static_cast<Eigen::Index>(M));
  if (!dbl) {  // rows straight into the row-major weights
    for (int64_t k = 0; k < K; ++k) read_row(s, static_cast<uint32_t>(k), st.stationary.data() + k * M);
    st.stationary_dtype = s.dtype;
    return;
  }
  float* row = fscratch(0, F);
  for (int64_t k = 0; k < K; ++k) {
    read_row(s, static_cast<uint32_t>(k), row);
    for (int64_t r = 0; r < (dbl ? 2 : 1); ++r)
      for (int64_t m = 0; m < M; ++m) st.stationary(r * K + k, m) = row[r * M + m];
  }
  st.stationary_dtype = s.dtype;
}

}  // namespace nsim::isa
