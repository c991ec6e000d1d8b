#include "memory/dma.h"

#include <algorithm>

namespace nsim::memory {

using isa::Operand;
using isa::Space;

namespace {
void split_pieces(DmaSplit& s, const Operand& dst, const Operand& src, int engines, int partitions_per_engine);
void summarize(DmaSplit& s);
}  // namespace

DmaSplit split_transfer(const Operand& dst, const Operand& src, int engines, int partitions_per_engine) {
  DmaSplit s;
  split_pieces(s, dst, src, engines, partitions_per_engine);
  summarize(s);
  return s;
}

namespace {
void split_pieces(DmaSplit& s, const Operand& dst, const Operand& src, int engines, int partitions_per_engine) {
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
    return;
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
}

// The summary of a split's pieces that DMA timing groups engines by.
void summarize(DmaSplit& s) {
  s.used = 0;
  s.uniform = true;
  const DmaPiece* first = nullptr;
  for (int e = 0; e < s.engines; ++e) {
    const DmaPiece& p = s.piece[static_cast<size_t>(e)];
    if (p.bytes <= 0) continue;
    s.used |= 1u << e;
    if (!first) first = &p;
    else if (p.bytes != first->bytes || p.descriptors != first->descriptors) s.uniform = false;
  }
}
}  // namespace

bool same_dma_shape(const Operand& a, const Operand& b) {
  if (a.space != b.space || a.dtype != b.dtype || a.nfree != b.nfree || a.start_partition != b.start_partition ||
      a.num_partitions != b.num_partitions || a.partition_step != b.partition_step)
    return false;
  for (int d = 0; d < a.nfree; ++d) {
    const auto i = static_cast<size_t>(d);
    if (a.size[i] != b.size[i] || a.stride[i] != b.stride[i]) return false;
  }
  return true;
}

const DmaSplit& DmaSplitCache::get(const Operand& dst, const Operand& src) {
  for (int k = 0, i = last_; k < n_; ++k, i = i + 1 < n_ ? i + 1 : 0) {  // entries [0, n_) are filled
    const Entry& en = e_[static_cast<size_t>(i)];
    if (same_dma_shape(en.dst, dst) && same_dma_shape(en.src, src)) {
      last_ = i;
      return en.split;
    }
  }
  Entry& en = e_[static_cast<size_t>(next_)];
  en.dst = dst;
  en.src = src;
  en.split = split_transfer(dst, src, engines_, ppe_);
  last_ = next_;
  next_ = (next_ + 1) % kEntries;
  n_ = std::min(n_ + 1, kEntries);
  return en.split;
}

}  // namespace nsim::memory
