// tensor_reduce: reduce the last `axis_count` free dims of data (0 = all) with op alu0; dst holds
// the remaining elements per partition in row-major order. Arithmetic: sequential fp32 left fold
// starting from the first element of each group (empty group -> identity); kNegate multiplies the
// result by -1 (arithmetic ops only). Bit-vector ops fold raw integers.
#include <fmt/format.h>

#include "isa/semantics/internal.h"

namespace nsim::isa {

void exec_kTensorReduce(const Instr& in, const Views& v, ArchState&) {
  using namespace sem;
  const TileView& dst = v[0];
  const TileView& data = v[1];
  require(in, dst, "dst");
  require(in, data, "data");
  require_same_partitions(in, dst, "dst", data, "data");
  const int nf = data.nfree;
  const int k = in.axis_count == 0 ? nf : in.axis_count;
  if (k > nf)
    fail(ErrorCode::kShapeMismatch, in, fmt::format("cannot reduce {} free dims of a view with {}", k, nf));
  int64_t groups = 1, g = 1;
  for (int d = 0; d < nf; ++d) (d < nf - k ? groups : g) *= data.size[static_cast<size_t>(d)];
  if (dst.elems() != groups)
    fail(ErrorCode::kElementCountMismatch, in,
         fmt::format("dst has {} elements per partition, the reduction leaves {}", dst.elems(), groups));
  const int64_t n = data.elems();
  const AluOp op = in.alu0;

  if (is_bitvec(op)) {
    int64_t* x = iscratch(0, n);
    int64_t* out = iscratch(1, groups);
    for (uint32_t p = 0; p < dst.partitions; ++p) {
      read_row_int(data, p, x);
      for (int64_t i = 0; i < groups; ++i) {
        const int64_t* s = x + i * g;
        int64_t r = g > 0 ? s[0] : static_cast<int64_t>(alu_identity(op));
        for (int64_t j = 1; j < g; ++j) r = alu_apply_int(op, r, s[j]);
        out[i] = r;
      }
      write_row_int(dst, p, out);
    }
    return;
  }

  const bool negate = (in.flags & kNegate) != 0;
  float* xs = fscratch(0, n);
  float* out = fscratch(1, groups);
  for (uint32_t p = 0; p < dst.partitions; ++p) {
    const float* x = row_f32(data, p, xs);
    for (int64_t i = 0; i < groups; ++i) {
      const float* s = x + i * g;
      const float r = g > 0 ? alu_fold(op, s[0], s + 1, g - 1) : alu_identity(op);
      out[i] = negate ? -r : r;
    }
    write_row(dst, p, out);
  }
}

}  // namespace nsim::isa
