// The dependency tracker's run-length encoding answers exactly as a plain array of chunks does:
// random reads and writes over SBUF, PSUM and HBM (partial quadrants, ranges across page borders,
// HBM that grows), checked after every access against a reference that keeps one entry per chunk
// (the tracker's representation before issue 12), including which producer is reported on a tie.
#include <catch2/catch.hpp>

#include <random>
#include <vector>

#include "engines/deps.h"

using namespace nsim;
using engines::DepTracker;
using isa::Operand;
using isa::Space;

namespace {

constexpr int kQuadrant = 32;

// One entry per chunk, scanned chunk by chunk: the semantics the tracker must keep.
class FlatTracker {
 public:
  FlatTracker(const DepTracker::Config& c, const DepTracker::LatencyTable& lat) : c_(c), lat_(lat) {
    sbuf_row_ = (c.sbuf_bytes + c.chunk_bytes - 1) / c.chunk_bytes;
    psum_row_ = (c.psum_bytes + c.chunk_bytes - 1) / c.chunk_bytes;
    sbuf_.resize(static_cast<size_t>(sbuf_row_ * ((c.partitions + kQuadrant - 1) / kQuadrant)));
    psum_.resize(static_cast<size_t>(psum_row_ * ((c.psum_partitions + kQuadrant - 1) / kQuadrant)));
  }
  void reserve_hbm(int64_t bytes) {
    const auto n = static_cast<size_t>((bytes + c_.hbm_chunk_bytes - 1) / c_.hbm_chunk_bytes);
    if (n > hbm_.size()) hbm_.resize(n);
  }
  struct Acc {
    Operand o;
    std::pair<int64_t, int64_t> ext;
    bool written;
  };
  // The chunks of an access, in the order the tracker visits them.
  std::vector<DepTracker::Entry*> chunks(const Acc& a) {
    std::vector<DepTracker::Entry*> v;
    auto [lo, hi] = a.ext;
    if (hi <= lo) hi = lo + 1;
    if (a.o.space == Space::kHbm) {
      const auto n = static_cast<int64_t>(hbm_.size());
      if (n == 0) return v;
      const int64_t c0 = std::clamp<int64_t>(lo / c_.hbm_chunk_bytes, 0, n - 1);
      const int64_t c1 = std::clamp<int64_t>((hi - 1) / c_.hbm_chunk_bytes, 0, n - 1);
      for (int64_t c = c0; c <= c1; ++c) v.push_back(&hbm_[static_cast<size_t>(c)]);
      return v;
    }
    const bool psum = a.o.space == Space::kPsum;
    const int64_t row = psum ? psum_row_ : sbuf_row_;
    const int parts = psum ? c_.psum_partitions : c_.partitions;
    const int64_t q0 = a.o.start_partition / kQuadrant;
    const int64_t q1 = (std::min<int64_t>(a.o.start_partition + std::max<uint32_t>(a.o.num_partitions, 1), parts) - 1) / kQuadrant;
    const int64_t c0 = std::clamp<int64_t>(lo / c_.chunk_bytes, 0, row - 1);
    const int64_t c1 = std::clamp<int64_t>((hi - 1) / c_.chunk_bytes, 0, row - 1);
    auto& base = psum ? psum_ : sbuf_;
    for (int64_t q = q0; q <= q1; ++q)
      for (int64_t c = c0; c <= c1; ++c) v.push_back(&base[static_cast<size_t>(q * row + c)]);
    return v;
  }
  DepTracker::Ready ready(uint8_t cls, const std::vector<Acc>& acc) {
    DepTracker::Ready t;
    auto consider = [&t](sim::Ps at, uint32_t tag) {
      if (at > t.time) t = {at, tag};
    };
    for (int pass = 0; pass < 2; ++pass)
      for (const Acc& a : acc) {
        if (a.written != (pass == 1)) continue;
        for (DepTracker::Entry* e : chunks(a)) {
          const uint8_t wc = DepTracker::tag_class(e->w_tag), rc = DepTracker::tag_class(e->r_tag);
          if (!a.written) {
            if (e->w_end) consider(e->w_end + lat_[wc][cls], e->w_tag);
          } else {
            if (e->w_end && wc != cls) consider(e->w_end + lat_[wc][cls], e->w_tag);
            if (e->r_end && rc != cls) consider(e->r_end + lat_[rc][cls], e->r_tag);
          }
        }
      }
    return t;
  }
  void record(uint8_t cls, uint64_t id, const std::vector<Acc>& acc, sim::Ps read_end, sim::Ps write_end) {
    const uint32_t t = DepTracker::tag(cls, id);
    for (int pass = 0; pass < 2; ++pass)
      for (const Acc& a : acc) {
        if (a.written != (pass == 1)) continue;
        for (DepTracker::Entry* e : chunks(a)) {
          if (!a.written && read_end >= e->r_end) e->r_end = read_end, e->r_tag = t;
          if (a.written && write_end >= e->w_end) e->w_end = write_end, e->w_tag = t;
        }
      }
  }

 private:
  DepTracker::Config c_;
  DepTracker::LatencyTable lat_;
  int64_t sbuf_row_, psum_row_;
  std::vector<DepTracker::Entry> sbuf_, psum_, hbm_;
};

}  // namespace

namespace {
DepTracker::Config flat_test_config() {
  DepTracker::Config c;
  c.partitions = 128;
  c.sbuf_bytes = 24 * 1024;  // 384 chunks per quadrant: two pages, the second partial
  c.psum_partitions = 128;
  c.psum_bytes = 2048;
  c.chunk_bytes = 64;
  c.hbm_chunk_bytes = 256;
  return c;
}

/// 3,000 random instructions of 1-4 accesses each through DepTracker and FlatTracker: every class's ready
/// time and producer must agree. `access(pick, limit, a)` draws access a's partitions and byte extent in a
/// space of `limit` bytes. Returns the segments the tracker holds at the end and the HBM bytes it tracks.
template <class Access>
std::pair<size_t, int64_t> check_against_flat(uint32_t seed, Access&& access) {
  const DepTracker::Config c = flat_test_config();
  DepTracker::LatencyTable lat{};
  for (int p = 0; p < engines::kNumClasses; ++p)
    for (int q = 0; q < engines::kNumClasses; ++q)
      lat[static_cast<size_t>(p)][static_cast<size_t>(q)] = p == engines::kClassDma ? 7 : (p != q ? 3 : 0);
  DepTracker d(c, lat);
  FlatTracker f(c, lat);
  std::mt19937 rng(seed);
  auto pick = [&rng](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  int64_t hbm_bytes = 0;
  for (uint64_t id = 0; id < 3000; ++id) {
    if (id % 500 == 0) {  // HBM grows between accesses (tensors allocated as the kernel runs)
      hbm_bytes += pick(1, 40) * 100 + 17;
      d.reserve_hbm(hbm_bytes);
      f.reserve_hbm(hbm_bytes);
    }
    std::vector<FlatTracker::Acc> acc;
    DepTracker::Regions rg;
    const int n = static_cast<int>(pick(1, 4));
    for (int i = 0; i < n; ++i) {
      FlatTracker::Acc a;
      const int sp = static_cast<int>(pick(0, 2));
      a.o.space = sp == 0 ? Space::kSbuf : sp == 1 ? Space::kPsum : Space::kHbm;
      access(pick, sp == 0 ? c.sbuf_bytes + 100 : sp == 1 ? c.psum_bytes : hbm_bytes + 300, a);
      a.written = i == 0 || pick(0, 3) == 0;
      acc.push_back(a);
      auto& slot = a.written ? rg.writes[static_cast<size_t>(rg.nw++)] : rg.reads[static_cast<size_t>(rg.nr++)];
      slot = d.range_of(a.o, a.ext);
    }
    const auto cls = static_cast<uint8_t>(pick(0, engines::kNumClasses - 1));
    std::array<DepTracker::Ready, engines::kNumClasses> multi;
    d.ready_multi(0x3F, rg, multi);
    for (uint8_t k = 0; k < engines::kNumClasses; ++k) {
      const DepTracker::Ready want = f.ready(k, acc), got = d.ready(k, rg);
      INFO("seed " << seed << " instruction " << id << " class " << int(k));
      REQUIRE(got.time == want.time);
      REQUIRE(got.tag == want.tag);
      REQUIRE(multi[k].time == want.time);
      REQUIRE(multi[k].tag == want.tag);
    }
    // Ends mostly increase (program order) but not always (a DMA finishing before an earlier one).
    const sim::Ps end = static_cast<sim::Ps>(id) * 10 + pick(0, 40);
    const sim::Ps read_end = pick(0, 3) == 0 ? end - pick(0, 30) : end;
    d.record(cls, id, rg, read_end, end);
    f.record(cls, id, acc, read_end, end);
  }
  return {d.segments(), hbm_bytes};
}
}  // namespace

TEST_CASE("dependency tracking: the run-length encoding answers as one entry per chunk does", "[deps]") {
  const DepTracker::Config c = flat_test_config();
  for (uint32_t seed : {1u, 2u, 3u}) {
    // Boundaries drawn from a few tile edges, so that accesses share edges (as tiles do) and also split them.
    const auto [segments, hbm_bytes] = check_against_flat(seed, [](auto& pick, int64_t limit, FlatTracker::Acc& a) {
      auto edge = [&](int64_t lim) { return pick(0, 1) ? pick(0, 12) * (lim / 12) : pick(0, lim); };
      a.o.start_partition = static_cast<uint16_t>(pick(0, 1) ? 0 : pick(0, 127));
      a.o.num_partitions = static_cast<uint32_t>(pick(0, 1) ? 128 - a.o.start_partition : pick(1, 128 - a.o.start_partition));
      int64_t lo = edge(limit), hi = edge(limit);
      if (lo > hi) std::swap(lo, hi);
      a.ext = {lo, hi};
    });
    // Far fewer segments than chunks: neighbouring chunks accessed together stay one segment.
    CHECK(segments < static_cast<size_t>(4 * (c.sbuf_bytes / 64 + c.psum_bytes / 64) + hbm_bytes / 256));
  }
}

TEST_CASE("dependency tracking: whole tiles, then parts of them, answer as one entry per chunk does", "[deps]") {
  // Mostly whole tiles across every partition (DepTracker updates such a segment in place, all quadrants at
  // once), sometimes a few partitions or a part of a tile, which must then see every quadrant's entry.
  for (uint32_t seed : {4u, 5u, 6u}) {
    check_against_flat(seed, [](auto& pick, int64_t limit, FlatTracker::Acc& a) {
      const int64_t tile = std::max<int64_t>(64, limit / 16 / 64 * 64);  // 16 tiles of whole chunks
      const int64_t k = pick(0, limit / tile - 1);
      const bool whole = pick(0, 3) != 0;
      a.o.start_partition = static_cast<uint16_t>(whole || pick(0, 1) ? 0 : pick(0, 127));
      a.o.num_partitions = static_cast<uint32_t>(whole || pick(0, 1) ? 128 - a.o.start_partition : pick(1, 128 - a.o.start_partition));
      a.ext = {k * tile, (k + 1) * tile};
      if (!whole && pick(0, 1)) a.ext = {k * tile + pick(0, tile / 2), (k + 1) * tile - pick(0, tile / 2 - 1)};
    });
  }
}

TEST_CASE("dependency tracking: whole-tile accesses keep one segment per tile", "[deps]") {
  // Four [128, 512] fp32 tiles (2 KiB per partition = 32 chunks each) written and read whole, over and
  // over: the page holds the four tiles and the rest of the row, whatever the count of accesses.
  DepTracker::Config c;
  c.partitions = 128;
  c.sbuf_bytes = 16 * 1024;  // 256 chunks: one page per quadrant
  c.psum_partitions = 128;
  c.psum_bytes = 2048;
  c.chunk_bytes = 64;
  c.hbm_chunk_bytes = 4096;
  DepTracker d(c, DepTracker::LatencyTable{});
  const size_t before = d.segments();
  for (uint64_t id = 0; id < 400; ++id) {
    DepTracker::Regions rg;
    Operand src, dst;
    src.space = dst.space = Space::kSbuf;
    src.num_partitions = dst.num_partitions = 128;
    const int64_t s = static_cast<int64_t>(id % 4) * 2048, t = static_cast<int64_t>((id + 1) % 4) * 2048;
    rg.reads[0] = d.range_of(src, {s, s + 2048});
    rg.writes[0] = d.range_of(dst, {t, t + 2048});
    rg.nr = rg.nw = 1;
    d.record(static_cast<uint8_t>(id % 3), id, rg, static_cast<sim::Ps>(id + 1), static_cast<sim::Ps>(id + 1));
  }
  // The four tiles and the untouched rest of the page (quadrants share segment borders; PSUM unchanged).
  CHECK(d.segments() == before + 4);
}

