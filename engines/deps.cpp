#include "engines/deps.h"

#include <algorithm>

namespace nsim::engines {

using isa::Operand;
using isa::Space;

namespace {
constexpr int kQuadrant = 32;  // partitions per quadrant: the hardware's partition-group size
}

DepTracker::DepTracker(const Config& cfg, const LatencyTable& lat) : cfg_(cfg), lat_(lat) {
  sbuf_row_ = (cfg.sbuf_bytes + cfg.chunk_bytes - 1) / cfg.chunk_bytes;
  psum_row_ = (cfg.psum_bytes + cfg.chunk_bytes - 1) / cfg.chunk_bytes;
  sbuf_.resize(static_cast<size_t>(sbuf_row_ * ((cfg.partitions + kQuadrant - 1) / kQuadrant)));
  psum_.resize(static_cast<size_t>(psum_row_ * ((cfg.psum_partitions + kQuadrant - 1) / kQuadrant)));
}

void DepTracker::reserve_hbm(int64_t bytes) {
  const auto n = static_cast<size_t>((bytes + cfg_.hbm_chunk_bytes - 1) / cfg_.hbm_chunk_bytes);
  if (n > hbm_.size()) hbm_.resize(n);
}

int64_t DepTracker::reserve_hbm_cost(int64_t bytes) const {
  const int64_t n = bytes / cfg_.hbm_chunk_bytes + 1;
  const auto have = static_cast<int64_t>(hbm_.size());
  return n > have ? (n - have) * static_cast<int64_t>(sizeof(Entry)) : 0;
}

DepTracker::Range DepTracker::range_of(const Operand& o, std::pair<int64_t, int64_t> ext) const {
  auto [lo, hi] = ext;
  if (hi <= lo) hi = lo + 1;
  if (o.space == Space::kHbm) {
    const int64_t n = static_cast<int64_t>(hbm_.size());
    if (n == 0) return {hbm_.data(), 0, -1, 0, -1, 0};  // no HBM tensors: nothing to track
    const int64_t c0 = std::clamp<int64_t>(lo / cfg_.hbm_chunk_bytes, 0, n - 1);
    const int64_t c1 = std::clamp<int64_t>((hi - 1) / cfg_.hbm_chunk_bytes, 0, n - 1);
    return {hbm_.data(), 0, 0, c0, c1, n};
  }
  const bool psum = o.space == Space::kPsum;
  const int64_t row = psum ? psum_row_ : sbuf_row_;
  const int parts = psum ? cfg_.psum_partitions : cfg_.partitions;
  const int64_t q0 = o.start_partition / kQuadrant;
  const int64_t q1 = (std::min<int64_t>(o.start_partition + std::max<uint32_t>(o.num_partitions, 1), parts) - 1) / kQuadrant;
  const int64_t c0 = std::clamp<int64_t>(lo / cfg_.chunk_bytes, 0, row - 1);
  const int64_t c1 = std::clamp<int64_t>((hi - 1) / cfg_.chunk_bytes, 0, row - 1);
  Entry* base = psum ? psum_.data() : sbuf_.data();
  return {base, q0, q1, c0, c1, row};
}

DepTracker::Ready DepTracker::ready(uint8_t cls, const Regions& rg) const {
  Ready t;
  const auto& lat = lat_;
  auto consider = [&t](sim::Ps at, uint32_t tag) {
    if (at > t.time) t = {at, tag};
  };
  for (int i = 0; i < rg.nr; ++i) {
    const Range& r = rg.reads[static_cast<size_t>(i)];
    for (int64_t q = r.q0; q <= r.q1; ++q)
      for (const Entry *e = r.base + q * r.row + r.c0, *end = r.base + q * r.row + r.c1; e <= end; ++e)
        if (e->w_end) consider(e->w_end + lat[tag_class(e->w_tag)][cls], e->w_tag);
  }
  for (int i = 0; i < rg.nw; ++i) {
    const Range& r = rg.writes[static_cast<size_t>(i)];
    for (int64_t q = r.q0; q <= r.q1; ++q)
      for (const Entry *e = r.base + q * r.row + r.c0, *end = r.base + q * r.row + r.c1; e <= end; ++e) {
        if (e->w_end && tag_class(e->w_tag) != cls) consider(e->w_end + lat[tag_class(e->w_tag)][cls], e->w_tag);
        if (e->r_end && tag_class(e->r_tag) != cls) consider(e->r_end + lat[tag_class(e->r_tag)][cls], e->r_tag);
      }
  }
  return t;
}

void DepTracker::ready_multi(uint8_t classes, const Regions& rg, std::array<Ready, kNumClasses>& out) const {
  // One pass keeping, per producer class, the latest end (and its tag) of: writers of what is read,
  // writers of what is written, readers of what is written. Then each consumer class takes the max
  // over producer classes with its hand-off latency (same-class WAR/WAW need no wait).
  std::array<Ready, kNumClasses> raw{}, waw{}, war{};
  auto keep = [](Ready& m, sim::Ps at, uint32_t tag) {
    if (at > m.time) m = {at, tag};
  };
  for (int i = 0; i < rg.nr; ++i) {
    const Range& r = rg.reads[static_cast<size_t>(i)];
    for (int64_t q = r.q0; q <= r.q1; ++q)
      for (const Entry *e = r.base + q * r.row + r.c0, *end = r.base + q * r.row + r.c1; e <= end; ++e)
        if (e->w_end) keep(raw[tag_class(e->w_tag)], e->w_end, e->w_tag);
  }
  for (int i = 0; i < rg.nw; ++i) {
    const Range& r = rg.writes[static_cast<size_t>(i)];
    for (int64_t q = r.q0; q <= r.q1; ++q)
      for (const Entry *e = r.base + q * r.row + r.c0, *end = r.base + q * r.row + r.c1; e <= end; ++e) {
        if (e->w_end) keep(waw[tag_class(e->w_tag)], e->w_end, e->w_tag);
        if (e->r_end) keep(war[tag_class(e->r_tag)], e->r_end, e->r_tag);
      }
  }
  for (int c = 0; c < kNumClasses; ++c) {
    Ready& t = out[static_cast<size_t>(c)];
    t = Ready{};
    if (!(classes & (1u << c))) continue;
    for (int p = 0; p < kNumClasses; ++p) {
      const sim::Ps l = lat_[static_cast<size_t>(p)][static_cast<size_t>(c)];
      const auto pi = static_cast<size_t>(p);
      if (raw[pi].time) keep(t, raw[pi].time + l, raw[pi].tag);
      if (p == c) continue;
      if (waw[pi].time) keep(t, waw[pi].time + l, waw[pi].tag);
      if (war[pi].time) keep(t, war[pi].time + l, war[pi].tag);
    }
  }
}

void DepTracker::record(uint8_t cls, uint64_t id, const Regions& rg, sim::Ps read_end, sim::Ps write_end) {
  const uint32_t t = tag(cls, id);
  for (int i = 0; i < rg.nr; ++i) {
    const Range& r = rg.reads[static_cast<size_t>(i)];
    for (int64_t q = r.q0; q <= r.q1; ++q)
      for (Entry *e = r.base + q * r.row + r.c0, *end = r.base + q * r.row + r.c1; e <= end; ++e)
        if (read_end >= e->r_end) {
          e->r_end = read_end;
          e->r_tag = t;
        }
  }
  for (int i = 0; i < rg.nw; ++i) {
    const Range& r = rg.writes[static_cast<size_t>(i)];
    for (int64_t q = r.q0; q <= r.q1; ++q)
      for (Entry *e = r.base + q * r.row + r.c0, *end = r.base + q * r.row + r.c1; e <= end; ++e)
        if (write_end >= e->w_end) {
          e->w_end = write_end;
          e->w_tag = t;
        }
  }
}

}  // namespace nsim::engines
