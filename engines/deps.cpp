#include "engines/deps.h"

#include <algorithm>
#include <tuple>

namespace nsim::engines {

using isa::Operand;
using isa::Space;

namespace {
// Index of the segment of page `pg` holding chunk c.
size_t find_seg(const DepTracker::Page& pg, int64_t c) {
  return pg.seg[static_cast<size_t>(c & (DepTracker::kPageChunks - 1))];
}

// Refresh pg.seg for the chunks of segments [from, end) after segments were split or merged (the
// last segment also owns the chunks of a partial page past the row's end: HBM may grow into them).
void index_segs(DepTracker::Page& pg, size_t from) {
  const int64_t first = pg.beg[0];
  for (size_t i = from; i < pg.beg.size(); ++i) {
    const int64_t e = i + 1 < pg.beg.size() ? pg.beg[i + 1] : first + DepTracker::kPageChunks;
    std::fill(pg.seg.begin() + (pg.beg[i] - first), pg.seg.begin() + (e - first), static_cast<uint8_t>(i));
  }
}
}  // namespace

std::vector<DepTracker::Page> DepTracker::make_pages(int64_t nq, int64_t row) {
  std::vector<Page> v(static_cast<size_t>((row + kPageChunks - 1) / kPageChunks));
  for (size_t p = 0; p < v.size(); ++p) {
    // On chip (a few pages): room for every segment a page can hold, so that no access allocates.
    v[p].beg.reserve(static_cast<size_t>(kPageChunks));
    v[p].ent.reserve(static_cast<size_t>(kPageChunks * nq));
    v[p].uni.reserve(static_cast<size_t>(kPageChunks));
    v[p].beg.push_back(static_cast<int64_t>(p) << kPageShift);
    v[p].ent.resize(static_cast<size_t>(nq));
    v[p].uni.push_back(1);
  }
  return v;
}

DepTracker::DepTracker(const Config& cfg, const LatencyTable& lat) : cfg_(cfg), lat_(lat) {
  sbuf_row_ = (cfg.sbuf_bytes + cfg.chunk_bytes - 1) / cfg.chunk_bytes;
  psum_row_ = (cfg.psum_bytes + cfg.chunk_bytes - 1) / cfg.chunk_bytes;
  sbuf_nq_ = (cfg.partitions + kQuadrant - 1) / kQuadrant;
  psum_nq_ = (cfg.psum_partitions + kQuadrant - 1) / kQuadrant;
  sbuf_ = make_pages(sbuf_nq_, sbuf_row_);
  psum_ = make_pages(psum_nq_, psum_row_);
  // The page vectors never change size: range_of keeps their data pointers.
  sbuf_sp_ = {sbuf_.data(), sbuf_row_, (sbuf_row_ + kPageChunks - 1) / kPageChunks, sbuf_nq_, cfg.partitions};
  psum_sp_ = {psum_.data(), psum_row_, (psum_row_ + kPageChunks - 1) / kPageChunks, psum_nq_, cfg.psum_partitions};
  for (int k = 0; k < 62; ++k) {
    if (cfg.chunk_bytes == int64_t{1} << k) chunk_shift_ = k;
    if (cfg.hbm_chunk_bytes == int64_t{1} << k) hbm_chunk_shift_ = k;
  }
}

void DepTracker::reserve_hbm(int64_t bytes) {
  const int64_t n = (bytes + cfg_.hbm_chunk_bytes - 1) / cfg_.hbm_chunk_bytes;
  if (n <= hbm_row_) return;
  // The last page may hold fewer than kPageChunks chunks: its last segment ends at the old row end,
  // so the new chunks (never accessed) get a zero segment of their own.
  if (hbm_row_ % kPageChunks != 0 && hbm_.back().ent.back() != Entry{}) {
    Page& last = hbm_.back();
    last.beg.push_back(hbm_row_);
    last.ent.emplace_back();
    last.uni.push_back(1);
    index_segs(last, last.beg.size() - 1);
  }
  const int64_t pages = (n + kPageChunks - 1) / kPageChunks;
  for (auto p = static_cast<int64_t>(hbm_.size()); p < pages; ++p) {
    hbm_.emplace_back();
    hbm_.back().beg.push_back(p << kPageShift);
    hbm_.back().ent.emplace_back();
    hbm_.back().uni.push_back(1);
  }
  hbm_row_ = n;
}

int64_t DepTracker::reserve_hbm_cost(int64_t bytes) const {
  const int64_t pages = (bytes / cfg_.hbm_chunk_bytes + 1 + kPageChunks - 1) / kPageChunks;
  const auto have = static_cast<int64_t>(hbm_.size());
  return pages > have ? (pages - have) * static_cast<int64_t>(sizeof(Page) + sizeof(int64_t) + sizeof(Entry)) : 0;
}

DepTracker::Range DepTracker::hbm_range(std::pair<int64_t, int64_t> ext) const {
  auto [lo, hi] = ext;
  if (hi <= lo) hi = lo + 1;
  const int64_t n = hbm_row_;
  const auto pages = static_cast<int64_t>(hbm_.size());
  if (n == 0) return {hbm_.data(), 0, -1, 0, -1, 0, 0, 1};  // no HBM tensors: nothing to track
  // (A shift floors where the division truncates: they differ for negative offsets only, which clamp to chunk 0.)
  const int sh = hbm_chunk_shift_;
  const int64_t c0 = std::clamp<int64_t>(sh >= 0 ? lo >> sh : lo / cfg_.hbm_chunk_bytes, 0, n - 1);
  const int64_t c1 = std::clamp<int64_t>(sh >= 0 ? (hi - 1) >> sh : (hi - 1) / cfg_.hbm_chunk_bytes, 0, n - 1);
  return {hbm_.data(), 0, 0, c0, c1, n, pages, 1};
}

template <class F>
inline void DepTracker::scan(const Range& r, F&& f) {
  if (r.q1 < r.q0) return;
  const int64_t p0 = r.c0 >> kPageShift, p1 = r.c1 >> kPageShift;
  const auto nq = static_cast<size_t>(r.nq);
  const size_t i0 = find_seg(r.base[p0], r.c0), i1 = find_seg(r.base[p1], r.c1);
  // A segment whose quadrants hold one entry (Page::uni) is visited in the first quadrant only: its
  // later visits would repeat an entry already seen, which changes no answer.
  if (p0 == p1) {  // the common case: one page, segments [i0, i1]
    const Page& pg = r.base[p0];
    const Entry* e = pg.ent.data();
    if (i0 == i1) {  // one segment (a tile accessed whole): its quadrants' entries follow each other
      const Entry* x = e + i0 * nq + static_cast<size_t>(r.q0);
      if (pg.uni[i0]) {
        f(*x);
        return;
      }
      for (const Entry* end = e + i0 * nq + static_cast<size_t>(r.q1) + 1; x != end; ++x) f(*x);
      return;
    }
    for (auto q = static_cast<size_t>(r.q0); q <= static_cast<size_t>(r.q1); ++q)
      for (size_t i = i0; i <= i1; ++i)
        if (q == static_cast<size_t>(r.q0) || !pg.uni[i]) f(e[i * nq + q]);
    return;
  }
  for (auto q = static_cast<size_t>(r.q0); q <= static_cast<size_t>(r.q1); ++q)
    for (int64_t p = p0; p <= p1; ++p) {
      const Page& pg = r.base[p];
      const Entry* e = pg.ent.data() + q;
      for (size_t i = p == p0 ? i0 : 0, last = p == p1 ? i1 : pg.beg.size() - 1; i <= last; ++i)
        if (q == static_cast<size_t>(r.q0) || !pg.uni[i]) f(e[i * nq]);
    }
}

template <class F>
void DepTracker::apply(const Range& r, F&& f) {
  if (r.q1 < r.q0) return;
  const auto nq = static_cast<size_t>(r.nq);
  const auto q0 = static_cast<size_t>(r.q0), q1 = static_cast<size_t>(r.q1);
  const bool all_q = q0 == 0 && q1 + 1 == nq;  // every quadrant: a uniform segment stays uniform
  for (int64_t p = r.c0 >> kPageShift, p1 = r.c1 >> kPageShift; p <= p1; ++p) {
    Page& pg = r.base[p];
    std::vector<int64_t>& beg = pg.beg;
    std::vector<Entry>& ent = pg.ent;
    std::vector<uint8_t>& uni = pg.uni;
    const int64_t lo = std::max(r.c0, p << kPageShift);
    const int64_t hi = std::min(r.c1, ((p + 1) << kPageShift) - 1);
    const int64_t page_end = std::min(r.row, (p + 1) << kPageShift);
    auto at = [&](size_t i) { return ent.begin() + static_cast<std::ptrdiff_t>(i * nq); };
    auto same = [&](size_t i, size_t j) {  // two uniform segments: their first entries decide
      return uni[i] && uni[j] ? ent[i * nq] == ent[j * nq]
                              : std::equal(at(i), at(i) + static_cast<std::ptrdiff_t>(nq), at(j));
    };
    auto dup = [&](size_t i, int64_t b) {  // segment i split at chunk b: a copy of it starts at b
      beg.insert(beg.begin() + static_cast<std::ptrdiff_t>(i + 1), b);
      ent.insert(at(i + 1), nq, Entry{});
      std::copy(at(i), at(i) + static_cast<std::ptrdiff_t>(nq), at(i + 1));
      uni.insert(uni.begin() + static_cast<std::ptrdiff_t>(i + 1), uni[i]);
    };
    auto drop = [&](size_t i, size_t keep) {  // segment i, equal to its neighbour `keep`, goes
      uni[keep] = static_cast<uint8_t>(uni[keep] | uni[i]);
      beg.erase(beg.begin() + static_cast<std::ptrdiff_t>(i));
      ent.erase(at(i), at(i) + static_cast<std::ptrdiff_t>(nq));
      uni.erase(uni.begin() + static_cast<std::ptrdiff_t>(i));
    };
    // f on segment i's quadrants [q0, q1]: once for a uniform segment taken whole (copied to the other
    // quadrants), else on each, the segment then uniform only if it was and f saw every quadrant.
    auto update = [&](size_t i) {
      if (uni[i] && all_q) {
        Entry& e0 = ent[i * nq];
        if (!f(e0)) return false;
        if (nq == 4) {  // four quadrants (SBUF and PSUM on every preset): three stores, not a loop
          Entry* q = &e0;
          q[1] = q[2] = q[3] = e0;
        } else {
          std::fill(at(i) + 1, at(i) + static_cast<std::ptrdiff_t>(nq), e0);
        }
        return true;
      }
      bool changed = false;
      for (size_t q = q0; q <= q1; ++q) changed |= f(ent[i * nq + q]);
      if (changed && !all_q) uni[i] = 0;
      return changed;
    };
    size_t moved = beg.size();  // the first segment whose index changed (split or merge)
    if (const size_t i = find_seg(pg, lo); beg[i] == lo && (i + 1 < beg.size() ? beg[i + 1] : page_end) == hi + 1) {
      // The common case: the range is exactly one segment (a tile accessed whole): no split.
      if (!update(i)) continue;
      bool merged = false;
      if (i + 1 < beg.size() && same(i, i + 1)) drop(i + 1, i), merged = true;
      size_t j = i;
      if (j > 0 && same(j - 1, j)) drop(j, j - 1), --j, merged = true;
      if (merged) index_segs(pg, j);
      continue;
    }
    for (size_t i = find_seg(pg, lo); i < beg.size() && beg[i] <= hi; ++i) {
      bool changed = false;
      for (size_t q = q0; q <= q1 && !changed; ++q) {
        Entry ne = ent[i * nq + q];
        changed = f(ne);
      }
      if (!changed) continue;
      const int64_t end = i + 1 < beg.size() ? beg[i + 1] : page_end;
      // Chunks of this segment outside [lo, hi] keep their entries: split them off.
      if (end > hi + 1) {
        dup(i, hi + 1);
        moved = std::min(moved, i + 1);
      }
      if (beg[i] < lo) {
        dup(i, lo);
        ++i;
        moved = std::min(moved, i);
      }
      update(i);
      if (i > 0 && same(i - 1, i)) {  // merge into the left neighbour
        drop(i, i - 1);
        --i;
        moved = std::min(moved, i);
      }
      // Merge the right neighbour when equal (inside [lo, hi] it would map to itself: f is idempotent).
      if (i + 1 < beg.size() && same(i, i + 1)) {
        drop(i + 1, i);
        moved = std::min(moved, i);
      }
    }
    if (moved < beg.size()) index_segs(pg, moved);
  }
}

Footprints::Footprint Footprints::of(const isa::Operand& o) {
  // Operand::byte_extent() worked out once for a row and the whole side (per DMA: no copy of the operand).
  Footprint f;
  const int64_t eb = dtype_bytes(o.dtype);
  int64_t lo = 0, hi = 0;  // a row's element offsets relative to `offset`
  for (int d = 0; d < o.nfree; ++d) {
    const auto i = static_cast<size_t>(d);
    if (o.size[i] <= 0) {
      f.lo = f.hi = o.offset;
      return f;
    }
    const int64_t span = o.stride[i] * (o.size[i] - 1);
    if (span < 0) lo += span;
    else hi += span;
  }
  const int64_t pspan = o.space == isa::Space::kHbm && o.num_partitions > 0
                             ? o.partition_step * (static_cast<int64_t>(o.num_partitions) - 1)
                             : 0;
  f.lo = o.offset + (lo + std::min<int64_t>(pspan, 0)) * eb;
  f.hi = o.offset + (hi + std::max<int64_t>(pspan, 0) + 1) * eb;
  if (o.space != isa::Space::kHbm) {  // on chip: the partitions, each within [lo, hi)
    f.p0 = o.start_partition;
    f.p1 = static_cast<int32_t>(o.start_partition + std::max<uint32_t>(o.num_partitions, 1));
    f.space = static_cast<uint8_t>(o.space);
    return f;
  }
  // Rows: the partitions, partition_step elements apart, each the span of the free dims (all non-negative
  // strides, so that the span starts at the row's first byte).
  if (lo == 0 && o.partition_step >= 0 && o.num_partitions >= 1) {
    f.first = o.offset;
    f.len = (hi + 1) * eb;
    f.step = o.num_partitions > 1 ? o.partition_step * eb : 0;
    f.rows = f.step == 0 ? f.hi - f.lo == f.len : f.len <= f.step;
    // Dense rows: the free dims row-major without gaps (each stride the product of the sizes inside it).
    int64_t expect = 1;
    f.dense = true;
    for (int d = o.nfree - 1; d >= 0 && f.dense; --d) {
      const auto i = static_cast<size_t>(d);
      if (o.size[i] == 1) continue;
      f.dense = o.stride[i] == expect;
      expect *= o.size[i];
    }
  }
  return f;
}

Footprints::Footprint Footprints::of_slot(const isa::Instr& in, int slot) {
  if (slot != isa::indirect_slot(in)) return of(in.slot(slot));
  Footprint f;  // its rows are runtime values: every row an in-range index may reach
  std::tie(f.lo, f.hi) = isa::slot_extent(in, slot);
  return f;
}

bool Footprints::disjoint(const Footprint& a, const Footprint& b) {
  if (a.hi <= b.lo || b.hi <= a.lo) return true;  // the extents do not meet
  if (a.p1 || b.p1)  // on chip: other partitions (or another space) are other bytes
    return a.space != b.space || a.p1 <= b.p0 || b.p1 <= a.p0;
  if (!a.rows || !b.rows) return false;
  // Rows of one pitch (one row each counts as any pitch): disjoint when their spans, taken modulo the pitch,
  // do not meet (the column blocks of one tensor).
  const int64_t step = a.step ? a.step : b.step;
  if (step == 0 || (a.step && b.step && a.step != b.step) || a.len > step || b.len > step) return false;
  const int64_t ra = ((a.first % step) + step) % step, rb = ((b.first % step) + step) % step;
  for (const int64_t shift : {-step, int64_t{0}, step})
    if (ra < rb + shift + b.len && rb + shift < ra + a.len) return false;
  return true;
}

void Footprints::note(uint64_t id, uint8_t cls, const Footprint& f, sim::Ps end, sim::Ps floor) {
  // The ring grows with the accesses noted up to kRing entries (~400 KB; made whole at the first note, they were
  // most of what a small kernel's run did: one ring each for HBM reads, HBM writes and on-chip DMA writes).
  if (n_ < kRing) ring_.emplace_back();
  Access& w = ring_[n_++ % kRing];
  w.f = f;
  w.f.id = id;
  w.end = end;
  w.cls = cls;
  w.floor = floor;
}

const Footprints::Access* Footprints::find(uint64_t id) const {
  // The ids increase with n. Galloping back from the newest (the access looked up is usually recent, its entry
  // in cache), then a binary search in the bracket found.
  const size_t oldest = n_ > kRing ? n_ - kRing : 0;
  size_t hi = n_, step = 1;
  while (hi > oldest) {
    const size_t probe = hi - std::min(step, hi - oldest);  // entry n = probe
    const uint64_t m = ring_[probe % kRing].f.id;
    if (m == id) return &ring_[probe % kRing];
    if (m < id) {
      size_t lo = probe + 1;
      while (lo < hi) {
        const size_t mid = lo + (hi - lo) / 2;
        const uint64_t v = ring_[mid % kRing].f.id;
        if (v == id) return &ring_[mid % kRing];
        if (v < id) lo = mid + 1;
        else hi = mid;
      }
      return nullptr;
    }
    hi = probe;
    step *= 2;
  }
  return nullptr;
}

Footprints::Latest Footprints::latest_overlap(const Footprint& f, uint8_t skip_cls) const {
  Latest best;
  for (size_t k = 0; k < std::min({kScan, n_, kRing}); ++k) {
    const Access& w = ring_[(n_ - 1 - k) % kRing];
    if (w.end > best.end && w.cls != skip_cls && !disjoint(w.f, f)) best = {w.end, w.f.id, w.cls};
  }
  return best;
}

template <bool kDma>
DepTracker::Ready DepTracker::ready_impl(uint8_t cls, const Regions& rg, const DmaSides* dw) const {
  Ready t;
  std::array<sim::Ps, 1u << kClassBits> lat{};  // by producer class, for consumer class cls
  for (size_t p = 0; p < lat_.size(); ++p) lat[p] = lat_[p][cls];
  auto consider = [&t](sim::Ps at, uint32_t tag) {
    if (at > t.time) t = {at, tag};
  };
  // (kDma: an access of dw's chunks that its side there (src: reads[0], dst: writes[0]) certainly does not meet is
  // skipped; the latest earlier access of its bytes is then waited for instead, below.)
  [[maybe_unused]] bool skip_raw = false, skip_waw = false, skip_war = false;
  for (int i = 0; i < rg.nr; ++i) {
    const Range& r = rg.reads[static_cast<size_t>(i)];
    [[maybe_unused]] const Footprints* ring = nullptr;
    if constexpr (kDma) ring = i == 0 ? dw->src_ring() : nullptr;
    scan(r, [&](const Entry& e) {
      if (!e.w_end) return;
      if constexpr (kDma) {
        if (ring) {
          if (const Footprints::Access* a = disjoint_access(*ring, e.w_tag, dw->src(), dw->now)) {
            skip_raw = true;
            if (!dw->src_hbm) consider(a->floor, e.w_tag);
            return;
          }
        }
      }
      consider(e.w_end + lat[tag_class(e.w_tag)], e.w_tag);
    });
  }
  for (int i = 0; i < rg.nw; ++i) {
    const Range& r = rg.writes[static_cast<size_t>(i)];
    [[maybe_unused]] const Footprints* wring = nullptr;
    [[maybe_unused]] const Footprints* rring = nullptr;
    if constexpr (kDma) {
      wring = i == 0 ? dw->dst_writes_ring() : nullptr;
      rring = i == 0 ? dw->dst_reads_ring() : nullptr;
    }
    scan(r, [&](const Entry& e) {
      if (e.w_end && tag_class(e.w_tag) != cls) {
        const Footprints::Access* a = nullptr;
        if constexpr (kDma) a = wring ? disjoint_access(*wring, e.w_tag, dw->dst(), dw->now) : nullptr;
        if (a) {
          skip_waw = true;
          if (!dw->dst_hbm) consider(a->floor, e.w_tag);
        } else {
          consider(e.w_end + lat[tag_class(e.w_tag)], e.w_tag);
        }
      }
      if (e.r_end && tag_class(e.r_tag) != cls) {
        bool skip = false;
        if constexpr (kDma) skip = rring && disjoint_access(*rring, e.r_tag, dw->dst(), dw->now);
        if (skip) skip_war = true;
        else consider(e.r_end + lat[tag_class(e.r_tag)], e.r_tag);
      }
    });
  }
  if constexpr (kDma) {
    auto wait_for = [&](const Footprints& fp, const Footprints::Footprint& mine, uint8_t skip_cls) {
      const Footprints::Latest l = fp.latest_overlap(mine, skip_cls);
      if (l.end) consider(l.end + lat[l.cls], tag(l.cls, l.id));
    };
    if (skip_raw) wait_for(*dw->src_ring(), dw->src(), Footprints::kNoClass);
    if (skip_waw) wait_for(*dw->dst_writes_ring(), dw->dst(), cls);
    if (skip_war) wait_for(*dw->dst_reads_ring(), dw->dst(), cls);
  }
  return t;
}

DepTracker::Ready DepTracker::ready(uint8_t cls, const Regions& rg) const { return ready_impl<false>(cls, rg, nullptr); }

DepTracker::Ready DepTracker::ready(uint8_t cls, const Regions& rg, const DmaSides* dw) const {
  return dw ? ready_impl<true>(cls, rg, dw) : ready_impl<false>(cls, rg, nullptr);
}

const Footprints::Access* DepTracker::disjoint_access(const Footprints& fp, uint32_t t,
                                                      const Footprints::Footprint& mine, uint64_t now) {
  const Footprints::Access* a = fp.find(tag_index(t, now));
  return a && Footprints::disjoint(a->f, mine) ? a : nullptr;
}

void DepTracker::ready_multi(uint8_t classes, const Regions& rg, std::array<Ready, kNumClasses>& out,
                             const DmaSides* dw) const {
  // One pass collecting what ready() considers, in its order: the writers of what is read (RAW), then per
  // entry of what is written its writer (WAW) and its readers (WAR). Each class then takes the first of the
  // latest (end + hand-off latency), skipping same-class WAW and WAR, as ready()'s scan would: the same time
  // and the same producer. (Usually a few entries: a region of one uniform segment is one entry.)
  struct Cand {
    sim::Ps end;
    uint32_t tag;
    bool raw;
  };
  std::array<Cand, 32> cand;
  size_t n = 0;
  bool more = false;  // past the array: ready() per class instead
  auto add = [&](sim::Ps end, uint32_t tag, bool raw) {
    if (n < cand.size()) cand[n++] = {end, tag, raw};
    else more = true;
  };
  // A DMA that skips an access of its HBM chunks (ready()'s kDma case) waits for the latest earlier access of its
  // bytes of another class than its own: ready() per class then (rare: the skip is found in this pass).
  for (int i = 0; i < rg.nr; ++i) {
    const Range& r = rg.reads[static_cast<size_t>(i)];
    const Footprints* ring = dw && i == 0 ? dw->src_ring() : nullptr;  // (as ready())
    scan(r, [&](const Entry& e) {
      if (!e.w_end) return;
      if (ring && disjoint_access(*ring, e.w_tag, dw->src(), dw->now)) more = true;
      else add(e.w_end, e.w_tag, true);
    });
  }
  for (int i = 0; i < rg.nw; ++i) {
    const Range& r = rg.writes[static_cast<size_t>(i)];
    const Footprints* wring = dw && i == 0 ? dw->dst_writes_ring() : nullptr;
    const Footprints* rring = dw && i == 0 ? dw->dst_reads_ring() : nullptr;
    scan(r, [&](const Entry& e) {
      if (e.w_end) {
        if (wring && disjoint_access(*wring, e.w_tag, dw->dst(), dw->now)) more = true;
        else add(e.w_end, e.w_tag, false);
      }
      if (e.r_end) {
        if (rring && disjoint_access(*rring, e.r_tag, dw->dst(), dw->now)) more = true;
        else add(e.r_end, e.r_tag, false);
      }
    });
  }
  out.fill(Ready{});
  for (unsigned cm = classes & ((1u << kNumClasses) - 1); cm; cm &= cm - 1) {
    const auto c = static_cast<size_t>(__builtin_ctz(cm));
    if (more) {
      out[c] = ready(static_cast<uint8_t>(c), rg, dw);
      continue;
    }
    Ready t;
    for (size_t k = 0; k < n; ++k) {
      const auto pc = static_cast<size_t>(tag_class(cand[k].tag));
      if (!cand[k].raw && pc == c) continue;  // same-class WAW and WAR need no wait
      const sim::Ps at = cand[k].end + lat_[pc][c];
      if (at > t.time) t = {at, cand[k].tag};
    }
    out[c] = t;
  }
}

template <class F>
bool DepTracker::apply_whole(const Range& r, F&& f) {
  // One page, the range exactly one uniform segment across every quadrant, and the updated entry equal to
  // neither neighbour (which would merge): the entry is updated in place, as apply() would.
  if (r.q1 < r.q0 || (r.c0 >> kPageShift) != (r.c1 >> kPageShift) || r.q0 != 0 || r.q1 + 1 != r.nq) return false;
  const int64_t p = r.c0 >> kPageShift;
  Page& pg = r.base[p];
  const size_t i = find_seg(pg, r.c0), n = pg.beg.size();
  if (pg.beg[i] != r.c0 || !pg.uni[i]) return false;
  if ((i + 1 < n ? pg.beg[i + 1] : std::min(r.row, (p + 1) << kPageShift)) != r.c1 + 1) return false;
  const auto nq = static_cast<size_t>(r.nq);
  Entry* e0 = pg.ent.data() + i * nq;
  Entry ne = *e0;
  if (!f(ne)) return true;  // nothing changes
  if (i + 1 < n && (!pg.uni[i + 1] || e0[nq] == ne)) return false;
  if (i > 0 && (!pg.uni[i - 1] || *(e0 - nq) == ne)) return false;
  if (nq == 4) {  // four quadrants (SBUF and PSUM on every preset): four stores, not a loop
    e0[0] = e0[1] = e0[2] = e0[3] = ne;
  } else {
    std::fill_n(e0, nq, ne);
  }
  return true;
}

void DepTracker::record(uint8_t cls, uint64_t id, const Regions& rg, sim::Ps read_end, sim::Ps write_end) {
  const uint32_t t = tag(cls, id);
  auto rd = [&](Entry& e) {
    if (read_end < e.r_end || (read_end == e.r_end && e.r_tag == t)) return false;
    e.r_end = read_end;
    e.r_tag = t;
    return true;
  };
  auto wr = [&](Entry& e) {
    if (write_end < e.w_end || (write_end == e.w_end && e.w_tag == t)) return false;
    e.w_end = write_end;
    e.w_tag = t;
    return true;
  };
  for (int i = 0; i < rg.nr; ++i)
    if (!apply_whole(rg.reads[static_cast<size_t>(i)], rd)) apply(rg.reads[static_cast<size_t>(i)], rd);
  for (int i = 0; i < rg.nw; ++i)
    if (!apply_whole(rg.writes[static_cast<size_t>(i)], wr)) apply(rg.writes[static_cast<size_t>(i)], wr);
}

uint32_t DepTracker::writer_classes(const Range& r) const {
  uint32_t m = 0;
  scan(r, [&](const Entry& e) {
    if (e.w_end) m |= 1u << tag_class(e.w_tag);
  });
  return m;
}

size_t DepTracker::segments() const {
  size_t n = 0;
  for (const auto* v : {&sbuf_, &psum_, &hbm_})
    for (const Page& p : *v) n += p.beg.size();
  return n;
}

}  // namespace nsim::engines
