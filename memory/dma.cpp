#include "memory/dma.h"

#include <algorithm>

namespace nsim::memory {

using isa::Operand;
using isa::Space;

DmaSplit split_transfer(const Operand& dst, const Operand& src, int engines, int partitions_per_engine) {
  DmaSplit s;
  s.engines = std::clamp(engines, 1, kMaxDmaEngines);
  s.touches_hbm = dst.space == Space::kHbm || src.space == Space::kHbm;
  const int64_t elems = dst.total_elems();
  const int64_t eb = std::max(dtype_bytes(dst.dtype), dtype_bytes(src.dtype));
  s.total_bytes = elems * eb;
  // Runs in the HBM side, counted over the whole view (a row of the HBM view is one "partition"): rows
  // that are each one run and follow each other in memory are one run (a 1-D tensor seen as N rows of
  // one element, or consecutive rows filling one partition, is one contiguous buffer, not N).
  auto runs_total = [](const Operand& o) -> int64_t {
    const int64_t rpp = o.contiguous_runs_per_partition();
    if (o.space == Space::kHbm && rpp == 1 && (o.num_partitions == 1 || o.partition_step == o.elems_per_partition()))
      return 1;
    return rpp * o.num_partitions;
  };

  const Operand* chip = dst.space != Space::kHbm ? &dst : (src.space != Space::kHbm ? &src : nullptr);
  if (!chip) {
    // HBM -> HBM: bytes evenly over all engines.
    const int64_t runs = std::max(runs_total(dst), runs_total(src));
    for (int e = 0; e < s.engines; ++e) {
      auto& p = s.piece[static_cast<size_t>(e)];
      p.bytes = s.total_bytes / s.engines + (e < s.total_bytes % s.engines ? 1 : 0);
      p.descriptors = std::max<int64_t>(p.bytes > 0 ? 1 : 0, runs / s.engines + (e < runs % s.engines ? 1 : 0));
    }
    return s;
  }
  const Operand* other = chip == &dst ? &src : &dst;
  const int64_t parts = chip->num_partitions;
  const int64_t bytes_pp = parts > 0 ? s.total_bytes / parts : 0;
  // Descriptors per partition: on-chip runs, or the other side's runs spread over the partitions.
  const int64_t other_runs_pp = parts > 0 ? (runs_total(*other) + parts - 1) / parts : 1;
  const int64_t desc_pp = std::max<int64_t>(1, std::max(chip->contiguous_runs_per_partition(), other_runs_pp));
  const int64_t ppe = std::max(1, partitions_per_engine);
  // Walk the partition range one engine block at a time: engine e serves [e*ppe, (e+1)*ppe).
  for (int64_t p = chip->start_partition, end = chip->start_partition + parts; p < end;) {
    const int64_t block_end = std::min(end, (p / ppe + 1) * ppe);
    auto& piece = s.piece[static_cast<size_t>((p / ppe) % s.engines)];
    piece.bytes += bytes_pp * (block_end - p);
    piece.descriptors += desc_pp * (block_end - p);
    p = block_end;
  }
  return s;
}

}  // namespace nsim::memory
