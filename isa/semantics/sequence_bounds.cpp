// sequence_bounds: segment_ids (1, n) -> dst (1, 2, n): dst[0, 0, i] = start index of the run of
// equal ids containing i, dst[0, 1, i] = its end index (exclusive); id 0 is padding: start n, end -1
// (spec nki-api.md 2.4). ids compared in fp32; results written via fp32 (exact below 2^24).
#include "isa/semantics/internal.h"

namespace nsim::isa {

void exec_kSequenceBounds(const Instr& in, const Views& v, ArchState&) {
  using namespace sem;
  const TileView& dst = v[0];
  const TileView& ids = v[1];
  require(in, dst, "dst");
  require(in, ids, "segment_ids");
  require_same_partitions(in, dst, "dst", ids, "segment_ids");
  const int64_t n = ids.elems();
  if (dst.partitions != 1 || dst.elems() != 2 * n)
    fail(ErrorCode::kShapeMismatch, in, "dst must be (1, 2, n) for segment_ids (1, n)");
  float* x = fscratch(0, n);
  float* out = fscratch(1, 2 * n);
  read_row(ids, 0, x);
  int64_t i = 0;
  while (i < n) {
    int64_t e = i + 1;
    while (e < n && x[e] == x[i]) ++e;
    const bool pad = x[i] == 0.0f;
    for (int64_t k = i; k < e; ++k) {
      out[k] = pad ? static_cast<float>(n) : static_cast<float>(i);
      out[n + k] = pad ? -1.0f : static_cast<float>(e);
    }
    i = e;
  }
  write_row(dst, 0, out);
}

}  // namespace nsim::isa
