// Liveness-based SBUF/PSUM allocation of a kernel's tiles (see allocate.h).
//
// A tile with more than one rotating buffer holds them across the whole loop it rotates over (see
// below); with one buffer its lifetime is first access .. last access. Placement packs
// (offset range x lifetime) rectangles: each tile, in turn, goes to a gap below,
// between or above the tiles already placed whose lifetimes overlap its own. Two orders are tried —
// largest first into the smallest gap that fits (best fit), and earliest lifetime first into the
// lowest gap (first fit) — and the one spanning fewer bytes wins (ties: the first). Before packing,
// the peak live bytes (a sweep over lifetimes) is a lower bound: while it exceeds the memory,
// automatic buffer depths of the tiles live at the peak fall back (compiler.loop_buffers down to 2, one
// buffer at a time, then to 1), largest tiles first; when the packing itself overflows (fragmentation),
// the largest remaining automatic depth falls back.
// When that still overflows, everything is retried with value-level live ranges (value_ranges()).
#include "frontend/compiler/allocate.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <map>
#include <optional>
#include <tuple>
#include <utility>

namespace nsim::frontend {

using isa::Space;

namespace {

constexpr int kMaxLoopDepth = 64;                // as Lowering (deeper nesting is E411 in verify_kernel)
constexpr int kMaxAutoDepth = 8;                 // the largest compiler.loop_buffers / psum_loop_buffers (params.def)
constexpr int64_t kHuge = int64_t{1} << 50;      // saturation of one tile's bytes
constexpr int64_t kSumCap = int64_t{1} << 52;    // saturation of sums of tile bytes
constexpr size_t kListedTiles = 8;               // tiles named in an overflow message

int64_t round_up(int64_t v, int64_t a) { return a <= 1 ? v : (v + a - 1) / a * a; }

bool on_chip(Space s) { return s == Space::kSbuf || s == Space::kPsum; }

/// Bytes per partition of one buffer of an on-chip tensor (saturates far beyond any memory).
int64_t tile_bytes(const Tensor& t) {
  int64_t n = std::max(1, dtype_bytes(t.dtype));
  for (size_t i = 1; i < t.shape.size(); ++i) {
    const int64_t d = std::max<int64_t>(1, t.shape[i]);
    if (n > kHuge / d) return kHuge;
    n *= d;
  }
  return n;
}

/// stride * bufs, saturated.
int64_t region_bytes(const TilePlacement& pl) {
  if (pl.bufs > 0 && pl.stride > kHuge / pl.bufs) return kHuge;
  return pl.stride * std::max(1, pl.bufs);
}

std::string loc_str(const SourceLoc& l) {
  if (l.file.empty() && l.line <= 0) return "unknown line";
  return fmt::format("{}:{}", l.file.empty() ? "?" : l.file, l.line);
}

/// One preorder walk: numbers statements; records loop spans and nesting, the first alloc of every
/// tile and every on-chip operand access.
struct Walk {
  struct Use {
    int tensor;
    int loop;  ///< innermost loop around the op, -1 at top level
    int64_t pos;
    int op;    ///< index into Kernel::ops
    int slot;  ///< operand slot
  };

  const Kernel& k;
  int64_t pos = 0;
  std::vector<int> parent, depth;  ///< per loop (depth: 1 at top level)
  std::vector<int64_t> lo, hi;     ///< per loop: its statement number .. the last number in its body
  std::vector<char> seen;          ///< per loop: walked (a malformed kernel may reference a loop twice)
  std::vector<int64_t> alloc_pos;  ///< per tensor: position of its (first) alloc, -1 none
  std::vector<int> alloc_loop;     ///< per tensor: innermost loop around the alloc
  std::vector<char> in_loop;       ///< per tensor: alloc inside a loop with trip count > 1
  std::vector<Use> uses;
  std::vector<const SourceLoc*> where;  ///< per position: the statement's source location, if any
  std::vector<int> op_at;               ///< per position: the op there (-1: not an op)
  std::vector<int> loop_at;             ///< per position: the innermost loop around the statement (-1: none)

  explicit Walk(const Kernel& kernel) : k(kernel) {
    const size_t nl = k.loops.size(), nt = k.tensors.size();
    parent.assign(nl, -1);
    depth.assign(nl, 0);
    lo.assign(nl, 0);
    hi.assign(nl, -1);
    seen.assign(nl, 0);
    alloc_pos.assign(nt, -1);
    alloc_loop.assign(nt, -1);
    in_loop.assign(nt, 0);
    body(k.body, -1, false, 0);
  }

  void body(const std::vector<Stmt>& b, int loop, bool looped, int d) {
    if (d > kMaxLoopDepth) return;
    for (const Stmt& s : b) {
      const int64_t here = pos++;
      where.push_back(nullptr);
      op_at.push_back(s.kind == Stmt::Kind::kOp ? s.index : -1);
      loop_at.push_back(loop);
      const auto i = static_cast<size_t>(s.index);
      switch (s.kind) {
        case Stmt::Kind::kAlloc: {
          if (s.index < 0 || i >= k.tensors.size()) break;
          const Tensor& t = k.tensors[i];
          where.back() = &t.loc;
          if (!on_chip(t.space)) break;
          if (alloc_pos[i] < 0) {
            alloc_pos[i] = here;
            alloc_loop[i] = loop;
          }
          in_loop[i] = static_cast<char>(in_loop[i] | looped);
          break;
        }
        case Stmt::Kind::kLoop: {
          if (s.index < 0 || i >= k.loops.size() || seen[i]) break;
          seen[i] = 1;
          const Loop& l = k.loops[i];
          where.back() = &l.loc;
          parent[i] = loop;
          depth[i] = loop < 0 ? 1 : depth[static_cast<size_t>(loop)] + 1;
          lo[i] = here;
          body(l.body, s.index, looped || l.trip_count() > 1, d + 1);
          hi[i] = pos - 1;
          break;
        }
        case Stmt::Kind::kOp: {
          if (s.index < 0 || i >= k.ops.size()) break;
          const Op& op = k.ops[i];
          where.back() = &op.loc;
          for (size_t sl = 0; sl < op.operands.size(); ++sl) {
            const auto& a = op.operands[sl];
            if (a && a->tensor >= 0 && static_cast<size_t>(a->tensor) < k.tensors.size() &&
                on_chip(k.tensors[static_cast<size_t>(a->tensor)].space))
              uses.push_back(Use{a->tensor, loop, here, s.index, static_cast<int>(sl)});
          }
          break;
        }
      }
    }
  }

  int depth_of(int l) const { return l < 0 ? 0 : depth[static_cast<size_t>(l)]; }
  int up(int l) const { return l < 0 ? -1 : parent[static_cast<size_t>(l)]; }
  /// Innermost loop containing both (-1: top level).
  int common(int a, int b) const {
    while (depth_of(a) > depth_of(b)) a = up(a);
    while (depth_of(b) > depth_of(a)) b = up(b);
    while (a != b) {
      a = up(a);
      b = up(b);
    }
    return a;
  }
  /// The loop directly inside `anc` on the way to `l` (l must be nested inside anc).
  int child_of(int l, int anc) const {
    while (up(l) != anc) l = up(l);
    return l;
  }

  std::vector<TileLifetime> lifetimes() const {
    std::vector<TileLifetime> lt(k.tensors.size());
    for (size_t t = 0; t < lt.size(); ++t)
      if (alloc_pos[t] >= 0) lt[t] = TileLifetime{alloc_pos[t], alloc_pos[t], in_loop[t] != 0};
    std::vector<char> used(k.tensors.size(), 0);
    for (const Use& u : uses) {
      const auto t = static_cast<size_t>(u.tensor);
      if (alloc_pos[t] < 0) continue;
      int64_t a = u.pos, b = u.pos;
      const int c = common(u.loop, alloc_loop[t]);
      for (int l : {u.loop, alloc_loop[t]}) {
        // A loop around the use but not the alloc: the tile is live across all its iterations. A loop
        // around the alloc but not the use (the use reads the last iteration's tile): the same.
        if (l == c) continue;
        const auto x = static_cast<size_t>(child_of(l, c));
        a = std::min(a, lo[x]);
        b = std::max(b, hi[x]);
      }
      if (!used[t]) {
        lt[t].first = a;
        lt[t].last = b;
        used[t] = 1;
      } else {
        lt[t].first = std::min(lt[t].first, a);
        lt[t].last = std::max(lt[t].last, b);
      }
    }
    return lt;
  }
};

using Ivs = std::vector<std::pair<int64_t, int64_t>>;  // sorted, disjoint [lo, hi] statement intervals

bool meets(const Ivs& a, const Ivs& b) {
  if (a.empty() || b.empty() || a.back().second < b.front().first || b.back().second < a.front().first) return false;
  // Each interval of the shorter list against the intervals of the longer one from the first ending at or
  // after its start, found by binary search (a tile reused for many values in unrolled code has thousands
  // of intervals: a merge walk over both lists was most of the allocation of large unrolled kernels).
  const Ivs& s = a.size() <= b.size() ? a : b;
  const Ivs& l = a.size() <= b.size() ? b : a;
  auto from = l.begin();
  for (auto [lo, hi] : s) {
    from = std::lower_bound(from, l.end(), lo, [](const std::pair<int64_t, int64_t>& x, int64_t v) { return x.second < v; });
    if (from == l.end()) return false;
    if (from->first <= hi) return true;
  }
  return false;
}

bool contains(const Ivs& a, int64_t x) {
  for (auto [l, h] : a)
    if (l <= x && x <= h) return true;
  return false;
}

/// The placed tiles whose lifetimes may meet a given one: placed tiles filed by the span of their lifetime
/// (first start to last end) in buckets of statements, so pack() looks only at the tiles whose spans
/// overlap the new tile's, not at every tile placed so far (an unrolled kernel has 10^5 tiles: the
/// flash attention sample's 16 heads at seq 16384 spent 69 % of its run in pack()). A tile spanning many
/// buckets is kept in one list visited every time instead.
class SpanIndex {
 public:
  SpanIndex(const std::vector<size_t>& order, const std::vector<Ivs>& iv) : iv_(iv), seen_(iv.size(), 0) {
    int64_t tmax = 0;
    for (size_t i : order)
      if (!iv[i].empty()) tmax = std::max(tmax, iv[i].back().second);
    const int64_t nb = std::clamp<int64_t>(static_cast<int64_t>(order.size()), 1, kMaxBuckets);
    width_ = tmax / nb + 1;
    bucket_.resize(static_cast<size_t>(tmax / width_ + 1));
  }
  void add(size_t j) {
    if (iv_[j].empty()) return;
    const int64_t b0 = iv_[j].front().first / width_, b1 = iv_[j].back().second / width_;
    if (b1 - b0 >= kLongBuckets) {
      long_.push_back(j);
      return;
    }
    for (int64_t b = b0; b <= b1; ++b) bucket_[static_cast<size_t>(b)].push_back(j);
  }
  /// Calls f(j) once for every added tile j whose span overlaps tile i's (a superset of those i meets).
  template <class F>
  void candidates(size_t i, F&& f) {
    if (iv_[i].empty()) return;
    ++stamp_;
    const auto visit = [&](size_t j) {
      if (seen_[j] == stamp_) return;
      seen_[j] = stamp_;
      f(j);
    };
    for (size_t j : long_) visit(j);
    const int64_t b0 = iv_[i].front().first / width_,
                  b1 = std::min<int64_t>(iv_[i].back().second / width_, static_cast<int64_t>(bucket_.size()) - 1);
    for (int64_t b = b0; b <= b1; ++b)
      for (size_t j : bucket_[static_cast<size_t>(b)]) visit(j);
  }

 private:
  static constexpr int64_t kMaxBuckets = int64_t{1} << 16, kLongBuckets = 64;
  const std::vector<Ivs>& iv_;
  std::vector<uint64_t> seen_;
  uint64_t stamp_ = 0;
  int64_t width_ = 1;
  std::vector<std::vector<size_t>> bucket_;
  std::vector<size_t> long_;
};

/// Greedy packing of (bytes x lifetime) rectangles in `order`; returns the extent. Tiles with a
/// manual address (`fixed` >= 0) keep it and are placed first; the others go around them.
int64_t pack(const std::vector<size_t>& order, const std::vector<int64_t>& size, const std::vector<Ivs>& iv,
             int64_t unit, bool best_fit, const std::vector<int64_t>& fixed, std::vector<int64_t>& off) {
  SpanIndex placed(order, iv);
  std::vector<std::pair<int64_t, int64_t>> busy;
  int64_t extent = 0;
  for (size_t i : order)
    if (fixed[i] >= 0) {
      off[i] = fixed[i];
      extent = std::max(extent, std::min(kSumCap, fixed[i] + size[i]));
      placed.add(i);
    }
  for (size_t i : order) {
    if (fixed[i] >= 0) continue;
    busy.clear();
    placed.candidates(i, [&](size_t j) {
      if (meets(iv[i], iv[j])) busy.emplace_back(off[j], std::min(kSumCap, off[j] + size[j]));
    });
    std::sort(busy.begin(), busy.end());
    int64_t cursor = 0, best = -1, best_gap = std::numeric_limits<int64_t>::max();
    for (auto [o, e] : busy) {
      if (o >= cursor && o - cursor >= size[i]) {
        const int64_t gap = o - cursor;
        if (!best_fit) {
          best = cursor;
          break;
        }
        if (gap < best_gap) {
          best_gap = gap;
          best = cursor;
        }
      }
      cursor = std::max(cursor, round_up(e, unit));
    }
    if (best < 0) best = cursor;
    off[i] = best;
    extent = std::max(extent, std::min(kSumCap, best + size[i]));
    placed.add(i);
  }
  return extent;
}

/// Where one tile's allocation site last handed out storage, for spread()'s rotation pass.
struct SiteInfo {
  std::vector<int> site;          ///< per tile: allocation site (alloc line, shape, dtype), -1 none
  std::vector<int64_t> recent_lo;  ///< per tile: bytes (from its offset) of the buffer its last instance uses
  std::vector<int64_t> recent_hi;
};

/// Among the windows of `n` consecutive units, the one whose worst unit (lowest `score`) scores highest, when it beats
/// `floor`: (its first unit, that score), the first such on ties, stopping at the first window scoring `stop` or
/// more; (-1, floor) when none beats `floor`. `dq`: scratch of score.size() entries (a sliding-window minimum).
std::pair<int64_t, int64_t> best_window(const std::vector<int64_t>& score, int64_t n, int64_t floor, int64_t stop,
                                        std::vector<int64_t>& dq) {
  int64_t best = -1, best_score = floor;
  size_t head = 0, tail = 0;
  const auto units = static_cast<int64_t>(score.size());
  for (int64_t u = 0; u < units; ++u) {
    while (tail > head && score[static_cast<size_t>(dq[tail - 1])] >= score[static_cast<size_t>(u)]) --tail;
    dq[tail++] = u;
    if (dq[head] <= u - n) ++head;
    if (u + 1 < n) continue;
    const int64_t sc = score[static_cast<size_t>(dq[head])];  // the window's worst unit
    if (sc > best_score) {
      best = u + 1 - n;
      best_score = sc;
      if (sc >= stop) break;
    }
  }
  return {best, best_score};
}

/// Pipelining-aware placement, tried after a packing has shown that the tiles fit: tiles in order of
/// lifetime start, each at the aligned offset (within `avail`) whose bytes were last used longest ago —
/// memory never used first, lowest offset on ties. Tight packing hands a dead tile's bytes to the very
/// next tile, and the write of that tile must then wait for the last read of the dead one (a
/// write-after-read edge between neighbours that are otherwise independent: consecutive chunks of a
/// flash-attention row sharing one PSUM bank cannot overlap); the Neuron compiler avoids such reuse
/// while capacity allows (compiler.md 4, inferred; docs/timing-model.md "Memory allocation").
///
/// A window some tile meeting the new one's lifetime holds is not free; otherwise its score is the
/// smallest reuse distance (statements from a dead tile's end to the new tile's start) over the tiles
/// placed on its bytes, never used being the best. `sites` (the rotation pass, when the first pass had
/// to reuse bytes): a dead tile of the new tile's own allocation site is better still, except the buffer
/// of that site's latest tile — the site's tiles rotate over at least two storages, as the tracer's
/// unrolled trace and the compiler's rotating buffers do — so the tiles that must share are those of
/// one site, not a tile at a loop's start and one at its end. One interval per tile and no sites: by each
/// byte's latest end, O(tiles x avail / unit); otherwise pairwise, O(tiles x their bytes / unit), given up
/// (-1) beyond kSpreadWork. Tiles placed by hand (`fixed` >= 0) keep their offsets and hold their bytes from the
/// start; the others go around them (a reuse distance then also counts from a tile's end to a manual tile's later
/// start). Returns the extent, or -1 when some tile finds no free window (the packed offsets are then kept);
/// `shared`: set when some tile took bytes used before.
int64_t spread(const std::vector<size_t>& ids, const std::vector<int64_t>& size, const std::vector<Ivs>& iv,
               int64_t unit, int64_t avail, const SiteInfo* sites, const std::vector<int64_t>& fixed,
               const std::vector<Ivs>& loops, std::vector<int64_t>& off, bool* shared) {
  constexpr int64_t kSpreadWork = int64_t{1} << 26;  // (tile, placed tile's unit) visits of the pairwise pass
  const int64_t units = unit > 0 ? avail / unit : 0;
  if (units <= 0 || units > (int64_t{1} << 24)) return -1;
  bool multi = false, manual = false;
  for (size_t t : ids) {
    if (iv[t].empty()) return -1;
    multi |= iv[t].size() != 1 || !loops[t].empty();
    manual |= fixed[t] >= 0;
  }
  // Pairwise only where the latest end per byte is not enough: several intervals, sites, or tiles placed by hand
  // (they hold their bytes from the start, whenever their lifetimes begin).
  const bool pairwise = multi || sites || manual;
  if (pairwise) {
    int64_t units_placed = 0;  // sum over tiles of their units: each tile visits at most all of them
    for (size_t t : ids) units_placed += std::max<int64_t>(1, (size[t] + unit - 1) / unit);
    if (units_placed > kSpreadWork / std::max<int64_t>(1, static_cast<int64_t>(ids.size()))) return -1;
  }
  std::vector<size_t> order, placed;
  for (size_t t : ids) {
    if (fixed[t] < 0) order.push_back(t);
    else if (fixed[t] + size[t] > units * unit) return -1;
    else off[t] = fixed[t], placed.push_back(t);
  }
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return iv[a].front().first != iv[b].front().first ? iv[a].front().first < iv[b].front().first : size[a] > size[b];
  });
  // Scores, higher is better: a reuse distance d (< kFree), never used, a dead tile of the same site.
  constexpr int64_t kBlocked = -1, kFree = int64_t{1} << 56, kSite = int64_t{1} << 57;
  std::vector<int64_t> last(static_cast<size_t>(units), -1);  // per unit: latest end of its tiles
  std::vector<int64_t> score(static_cast<size_t>(units));     // per unit, for the tile being placed
  std::vector<int64_t> dq(static_cast<size_t>(units));         // sliding-window minimum (indices)
  std::vector<std::ptrdiff_t> site_latest;  // per site: the placed tile that is its latest instance
  int64_t extent = 0;
  for (size_t t : placed) extent = std::max(extent, off[t] + size[t]);
  if (shared) *shared = false;
  for (size_t t : order) {
    const int64_t n = std::max<int64_t>(1, (size[t] + unit - 1) / unit), start = iv[t].front().first;
    if (n > units) return -1;
    const int st = sites ? sites->site[t] : -1;
    if (!pairwise) {
      for (int64_t u = 0; u < units; ++u) {
        const int64_t l = last[static_cast<size_t>(u)];
        score[static_cast<size_t>(u)] = l < 0 ? kFree : l < start ? start - l : kBlocked;
      }
    } else {
      std::fill(score.begin(), score.end(), kFree);
      const std::ptrdiff_t latest = st >= 0 && static_cast<size_t>(st) < site_latest.size() ? site_latest[static_cast<size_t>(st)] : -1;
      for (size_t j : placed) {
        int64_t d = kBlocked;
        if (!meets(iv[t], iv[j])) {
          // The statements from j's latest use of these bytes before t starts (j placed earlier started first: it
          // has one) to t's start; a tile placed by hand may instead start after t: from t's end to its start.
          int64_t end_j = -1;
          for (auto [l, h] : iv[j])
            if (h < start) end_j = std::max(end_j, h);
          // A tile of a multi-trip loop that ended before t starts uses its bytes until the loop's last iteration.
          if (end_j >= 0)
            for (auto [lo, hi] : loops[j])
              if (hi < start) end_j = std::max(end_j, hi);
          d = end_j >= 0 ? start - end_j : std::max<int64_t>(1, iv[j].front().first - iv[t].back().second);
          if (st >= 0 && sites->site[j] == st) d += kSite;
        }
        const int64_t b = off[j] / unit, e = std::min(units, b + std::max<int64_t>(1, (size[j] + unit - 1) / unit));
        for (int64_t u = b; u < e; ++u) {
          int64_t du = d;
          if (du >= kSite && static_cast<std::ptrdiff_t>(j) == latest) {  // the site's latest buffer: not rotated onto
            const int64_t lo = off[j] + sites->recent_lo[j], hi = off[j] + sites->recent_hi[j];
            if (u * unit < hi && lo < (u + 1) * unit) du -= kSite;
          }
          int64_t& sc = score[static_cast<size_t>(u)];
          // a unit's score is its worst occupant's; a site unit used by another tile too is that tile's
          if (sc == kFree) sc = du;
          else if (du < kSite || sc < kSite) sc = std::min(sc >= kSite ? sc - kSite : sc, du >= kSite ? du - kSite : du);
          else sc = std::min(sc, du);
        }
      }
    }
    // (never used: the lowest such window, unless sites rank some used bytes higher)
    const auto [best, best_score] = best_window(score, n, kBlocked, sites ? kSite + kFree : kFree, dq);
    if (best < 0) return -1;
    if (shared && best_score != kFree) *shared = true;
    off[t] = best * unit;
    for (int64_t u = best; u < best + n; ++u)
      last[static_cast<size_t>(u)] = std::max(last[static_cast<size_t>(u)], iv[t].back().second);
    extent = std::max(extent, (best + n) * unit);
    if (st >= 0) {
      if (site_latest.size() <= static_cast<size_t>(st)) site_latest.resize(static_cast<size_t>(st) + 1, -1);
      site_latest[static_cast<size_t>(st)] = static_cast<std::ptrdiff_t>(t);
    }
    placed.push_back(t);
  }
  return extent;
}

/// When spread() finds no free window for some tile (its greedy placement fragmented the memory), the packed
/// placement improved instead: each tile not placed by hand, in order of lifetime start, moves to the aligned
/// window (within `avail`) no tile meeting its lifetime holds whose bytes' nearest use by another tile, before or
/// after its own, is furthest away (bytes no other tile uses best), when that beats where it is. Every step keeps
/// the placement valid. Pairwise, O(tiles x their bytes / unit) a pass; nothing is moved beyond kSpreadWork.
void improve(const std::vector<size_t>& ids, const std::vector<int64_t>& size, const std::vector<Ivs>& iv,
             int64_t unit, int64_t avail, const std::vector<int64_t>& fixed, std::vector<int64_t>& off) {
  constexpr int64_t kSpreadWork = int64_t{1} << 26;
  const int64_t units = unit > 0 ? avail / unit : 0;
  if (units <= 0 || units > (int64_t{1} << 24)) return;
  int64_t work = 0, intervals = 0;
  for (size_t t : ids) {
    if (iv[t].empty() || off[t] < 0 || off[t] % unit != 0 || off[t] + size[t] > units * unit) return;
    work += std::max<int64_t>(1, (size[t] + unit - 1) / unit);
    intervals += static_cast<int64_t>(iv[t].size());
  }
  if (work > kSpreadWork / std::max<int64_t>(1, static_cast<int64_t>(ids.size())) ||
      intervals > kSpreadWork / std::max<int64_t>(1, static_cast<int64_t>(ids.size())))
    return;
  std::vector<size_t> order;
  for (size_t t : ids)
    if (fixed[t] < 0) order.push_back(t);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return iv[a].front().first != iv[b].front().first ? iv[a].front().first < iv[b].front().first : size[a] > size[b];
  });
  constexpr int64_t kBlocked = -1, kFree = int64_t{1} << 56;
  // Statements between two tiles' uses when their lifetimes do not meet: the smallest gap between their intervals.
  const auto gap = [&](size_t a, size_t b) {
    int64_t g = kFree - 1;
    for (auto [l, h] : iv[a])
      for (auto [l2, h2] : iv[b]) g = std::min(g, h < l2 ? l2 - h : h2 < l ? l - h2 : int64_t{1});
    return g;
  };
  std::vector<int64_t> score(static_cast<size_t>(units)), dq(static_cast<size_t>(units));
  for (size_t t : order) {
    const int64_t n = std::max<int64_t>(1, (size[t] + unit - 1) / unit);
    if (n > units) continue;
    std::fill(score.begin(), score.end(), kFree);
    for (size_t j : ids) {
      if (j == t) continue;
      const int64_t d = meets(iv[t], iv[j]) ? kBlocked : gap(t, j);
      const int64_t b = off[j] / unit, e = std::min(units, b + std::max<int64_t>(1, (size[j] + unit - 1) / unit));
      for (int64_t u = b; u < e; ++u) score[static_cast<size_t>(u)] = std::min(score[static_cast<size_t>(u)], d);
    }
    const int64_t here = off[t] / unit;
    int64_t now = kFree;  // where it is
    for (int64_t u = here; u < here + n; ++u) now = std::min(now, score[static_cast<size_t>(u)]);
    const int64_t best = best_window(score, n, now, kFree + 1, dq).first;
    if (best >= 0) off[t] = best * unit;
  }
}

/// The most PSUM tiles a kernel may have for the Lowering's placement search (AllocationPlan::psum_swaps,
/// psum_deepen): more is an unrolled kernel, with no loop body to place. Also the most SBUF tiles sbuf_deepen names.
constexpr size_t kMaxTiles = 48;

/// For AllocationPlan::psum_swaps: when two PSUM tiles of one loop body with more than one trip share bytes (the
/// next iteration's earlier tile then waits for this iteration's later one), the pairs of equal-sized tiles whose
/// offsets may be swapped without either meeting a tile it would share bytes with. Empty otherwise, with manual
/// placements, or beyond kMaxTiles tiles (an unrolled kernel: no loop to wrap around).
/// `shared`: set when two tiles of one multi-trip loop share bytes (with at most kMaxTiles tiles, none manual).
std::vector<std::pair<int, int>> sharing_swaps(const Walk& w, const Kernel& k, const std::vector<size_t>& ids,
                                               const std::vector<int64_t>& size, const std::vector<Ivs>& iv,
                                               const std::vector<int64_t>& off, const std::vector<int64_t>& fixed,
                                               bool& shared) {
  std::vector<std::pair<int, int>> out;
  shared = false;
  if (ids.size() < 2 || ids.size() > kMaxTiles) return out;
  for (size_t t : ids)
    if (fixed[t] >= 0) return out;
  const auto overlap = [&](size_t a, int64_t oa, size_t b, int64_t ob) { return oa < ob + size[b] && ob < oa + size[a]; };
  for (size_t i = 0; i < ids.size() && !shared; ++i)
    for (size_t j = i + 1; j < ids.size() && !shared; ++j) {
      const size_t a = ids[i], b = ids[j];
      if (!overlap(a, off[a], b, off[b])) continue;
      for (int l = w.common(w.alloc_loop[a], w.alloc_loop[b]); l >= 0 && !shared; l = w.up(l))
        shared = k.loops[static_cast<size_t>(l)].trip_count() > 1;
    }
  if (!shared || ids.size() < 3) return out;  // (two tiles: a swap only renames the banks)
  const auto fits = [&](size_t a, int64_t o, size_t b, int64_t ob) {
    for (size_t c : ids) {
      if (c == a) continue;
      if (overlap(a, o, c, c == b ? ob : off[c]) && meets(iv[a], iv[c])) return false;
    }
    return true;
  };
  for (size_t i = 0; i < ids.size(); ++i)
    for (size_t j = i + 1; j < ids.size(); ++j) {
      const size_t a = ids[i], b = ids[j];
      if (size[a] != size[b] || off[a] == off[b]) continue;
      if (fits(a, off[b], b, off[a]) && fits(b, off[a], a, off[b]))
        out.emplace_back(static_cast<int>(a), static_cast<int>(b));
    }
  return out;
}

/// Whether intervals `v` lie within positions [0, positions) (what PeakTree and PickIndex hold).
bool within(const Ivs& v, int64_t positions) {
  for (auto [l, h] : v)
    if (l < 0 || h >= positions || h < l) return false;
  return true;
}

/// peak_of() kept up to date while tiles change one at a time (the fallback from multi-buffering below
/// drops one tile's rotating buffers per step: recomputing the peak from scratch each step was quadratic,
/// 5 s of the nki-samples flash_attn_bwd at seq 16384, 6,000 steps over 6,000 PSUM tiles). Live bytes per
/// position in a segment tree with range add: a tile's intervals added or removed in O(log positions),
/// the peak and its first position read at the root. The same answers as peak_of() for intervals within its
/// positions and sums below kSumCap.
class PeakTree {
 public:
  explicit PeakTree(int64_t positions) : n_(std::max<int64_t>(1, positions)) {
    mx_.assign(static_cast<size_t>(4 * n_), 0);
    lz_.assign(static_cast<size_t>(4 * n_), 0);
  }
  void add(const Ivs& v, int64_t bytes) {
    for (auto [l, h] : v) update(1, 0, n_ - 1, l, h, bytes);
  }
  /// peak_of(): the most bytes live at one position, and the first position holding them.
  std::pair<int64_t, int64_t> peak() const {
    int64_t target = mx_[1];
    size_t node = 1;
    int64_t lo = 0, hi = n_ - 1;
    while (lo < hi) {
      target -= lz_[node];
      const int64_t mid = lo + (hi - lo) / 2;
      if (mx_[2 * node] == target) {
        node = 2 * node;
        hi = mid;
      } else {
        node = 2 * node + 1;
        lo = mid + 1;
      }
    }
    return {mx_[1], lo};
  }

 private:
  void update(size_t node, int64_t lo, int64_t hi, int64_t l, int64_t h, int64_t v) {
    if (h < lo || hi < l) return;
    if (l <= lo && hi <= h) {
      mx_[node] += v;
      lz_[node] += v;
      return;
    }
    const int64_t mid = lo + (hi - lo) / 2;
    update(2 * node, lo, mid, l, h, v);
    update(2 * node + 1, mid + 1, hi, l, h, v);
    mx_[node] = std::max(mx_[2 * node], mx_[2 * node + 1]) + lz_[node];
  }
  int64_t n_;
  std::vector<int64_t> mx_, lz_;  ///< by node: the most live bytes in its range; the add pending on it
};

/// The fallback's choice below, kept indexed: among tiles still multi-buffered, the one of largest stride
/// (the first in tile order on ties) live at a position, or anywhere. The tiles' intervals (fixed while they
/// keep their buffers) are filed in the nodes of a segment tree over positions, each node's tiles in order
/// of preference; a tile that lost its buffers is skipped (a cursor per node, moved past it once). A query
/// visits the nodes on one root-to-leaf path: O(log positions) amortised instead of a pass over every tile
/// per step (24,000 steps over 24,790 PSUM tiles in the flash_attn_bwd sample at seq 32768).
class PickIndex {
 public:
  /// `cand`: the tiles that may be picked; `alive(t)`: whether tile t still may be.
  PickIndex(int64_t positions, std::vector<size_t> cand, const std::vector<Ivs>& iv,
            const std::vector<TilePlacement>& tiles)
      : n_(std::max<int64_t>(1, positions)), node_(static_cast<size_t>(4 * n_)), cur_(node_.size(), 0) {
    std::stable_sort(cand.begin(), cand.end(), [&](size_t a, size_t b) { return tiles[a].stride > tiles[b].stride; });
    all_ = cand;  // in order of preference: the node lists built in this order stay sorted
    for (size_t t : cand)
      for (auto [l, h] : iv[t]) file(1, 0, n_ - 1, l, h, t);
  }
  /// The preferred live tile whose intervals hold position x (-1: none).
  template <class Alive>
  int at(int64_t x, Alive&& alive) {
    int best = -1;
    size_t node = 1;
    int64_t lo = 0, hi = n_ - 1;
    if (x < 0 || x >= n_) return -1;
    for (;;) {
      const int c = front(node, alive);
      if (c >= 0 && (best < 0 || rank(c) < rank(best))) best = c;
      if (lo == hi) break;
      const int64_t mid = lo + (hi - lo) / 2;
      if (x <= mid) node = 2 * node, hi = mid;
      else node = 2 * node + 1, lo = mid + 1;
    }
    return best;
  }
  /// The preferred live tile anywhere (-1: none).
  template <class Alive>
  int any(Alive&& alive) {
    while (any_ < all_.size() && !alive(all_[any_])) ++any_;
    return any_ < all_.size() ? static_cast<int>(all_[any_]) : -1;
  }

 private:
  void file(size_t node, int64_t lo, int64_t hi, int64_t l, int64_t h, size_t t) {
    if (h < lo || hi < l) return;
    if (l <= lo && hi <= h) {
      node_[node].push_back(t);
      return;
    }
    const int64_t mid = lo + (hi - lo) / 2;
    file(2 * node, lo, mid, l, h, t);
    file(2 * node + 1, mid + 1, hi, l, h, t);
  }
  template <class Alive>
  int front(size_t node, Alive&& alive) {
    auto& v = node_[node];
    size_t& c = cur_[node];
    while (c < v.size() && !alive(v[c])) ++c;
    return c < v.size() ? static_cast<int>(v[c]) : -1;
  }
  size_t rank(int t) {
    if (rank_.empty()) {
      rank_.assign(all_.empty() ? 0 : *std::max_element(all_.begin(), all_.end()) + 1, 0);
      for (size_t r = 0; r < all_.size(); ++r) rank_[all_[r]] = r;
    }
    return rank_[static_cast<size_t>(t)];
  }
  int64_t n_;
  std::vector<std::vector<size_t>> node_;
  std::vector<size_t> cur_, all_, rank_;
  size_t any_ = 0;
};

/// Most bytes live at one position, and that position (the first such).
std::pair<int64_t, int64_t> peak_of(const std::vector<size_t>& ids, const std::vector<int64_t>& size,
                                    const std::vector<Ivs>& iv) {
  std::vector<std::pair<int64_t, int64_t>> ev;  // (position, +-bytes)
  for (size_t i : ids)
    for (auto [l, h] : iv[i]) {
      ev.emplace_back(l, size[i]);
      ev.emplace_back(h + 1, -size[i]);
    }
  std::sort(ev.begin(), ev.end());
  int64_t live = 0, peak = 0, at = ev.empty() ? 0 : ev.front().first;
  for (size_t e = 0; e < ev.size(); ++e) {
    live = std::min(kSumCap, live + ev[e].second);
    if ((e + 1 == ev.size() || ev[e + 1].first != ev[e].first) && live > peak) {
      peak = live;
      at = ev[e].first;
    }
  }
  return {std::min(peak, kSumCap), at};
}

/// Value-level live ranges of tile `t` (the fallback when whole-tile lifetimes do not fit). Kernels
/// traced with loops unrolled reuse one tile for many values (the tracer hands a dead tile's storage
/// to the next tile of the same shape), so a tile's first..last access spans values that are never
/// live together. A backward liveness pass over the tile's elements finds the points where nothing
/// it holds is read again before being overwritten; the tile is dead across them. Only for tiles
/// whose accesses all sit at their alloc's loop level with constant indices. Each element's live
/// partitions are kept as one range (the hull of the reads after it); a write (slot 0, without accumulate)
/// kills an element when its contiguous partition range covers that range, so the masked reads and writes
/// of a ragged last tile (rows 0..43 of 128) end the previous value as a whole-tile write does. Accesses in a
/// loop inside the alloc's loop (a peeled loop's paired iterations, an accumulation over an inner loop) count
/// once; when a value is live into the loop's body the tile stays live across the whole loop. Empty = not split.
Ivs value_ranges(const Kernel& k, const Walk& w, size_t t, const std::vector<size_t>& uses, int64_t& budget) {
  const Tensor& ten = k.tensors[t];
  if (uses.size() < 2 || ten.shape.size() < 2) return {};
  const size_t rank = ten.shape.size();
  std::vector<int64_t> st(rank, 1);
  for (size_t d = rank - 1; d >= 1; --d)
    if (__builtin_mul_overflow(st[d], ten.shape[d], &st[d - 1])) return {};
  const int64_t elems = st[0];  // free elements per partition
  if (elems > (int64_t{1} << 24) || elems > budget) return {};
  for (size_t ui : uses) {
    const auto& u = w.uses[ui];
    // A use in a loop nested in the alloc's (the tracer's peeled loop recorded two iterations per pass allocates
    // its tiles before the loop): its positions stand for every iteration, valid while no value of the tile is
    // live into the loop's body (checked where the backward pass below leaves the loop).
    int ul = u.loop;
    while (w.depth_of(ul) > w.depth_of(w.alloc_loop[t])) ul = w.up(ul);
    if (ul != w.alloc_loop[t]) return {};
    const Op& uop = k.ops[static_cast<size_t>(u.op)];
    // A runtime-addressed side (a dynamic tensor_copy, an indirect dma_copy: the `offsets` slot) touches
    // elements only known at run time: no value ranges for this tile.
    if (uop.operands[2] && (uop.name == "tensor_copy" || uop.name == "dma_copy") &&
        u.slot == ((uop.flags & isa::kIndirectDst) ? 0 : 1))
      return {};
    const Access& a = *uop.operands[static_cast<size_t>(u.slot)];
    if (!a.shape.empty()) return {};  // a re-dimensioned view: its dims are not the tile's
    if (!a.dims.empty() && a.dims.size() != rank) return {};
    for (size_t d = 0; d < a.dims.size(); ++d) {
      const DimAccess& da = a.dims[d];
      if (!da.start.is_const() || da.size < 1) return {};
      if (da.start.c < 0 || da.start.c >= ten.shape[d]) return {};
      int64_t last = da.start.c, span = 0;  // hostile sizes and steps must not overflow (verify reports them)
      if (!da.broadcast &&
          (__builtin_mul_overflow(da.size - 1, da.step, &span) || __builtin_add_overflow(last, span, &last)))
        return {};
      if (last < 0 || last >= ten.shape[d]) return {};
    }
  }
  // Visit the free elements of an access; false when over budget.
  auto visit = [&](const Access& a, auto&& f) {
    if (a.dims.empty()) {
      budget -= elems;
      if (budget < 0) return false;
      for (int64_t e = 0; e < elems; ++e) f(e);
      return true;
    }
    int64_t n = 1;
    for (size_t d = 1; d < rank; ++d)
      if (!a.dims[d].broadcast && __builtin_mul_overflow(n, a.dims[d].size, &n)) return false;
    budget -= n;
    if (budget < 0) return false;
    std::vector<int64_t> idx(rank, 0);
    for (;;) {
      int64_t e = 0;
      for (size_t d = 1; d < rank; ++d) {
        const DimAccess& da = a.dims[d];
        e += (da.broadcast ? da.start.c : da.start.c + idx[d] * da.step) * st[d];
      }
      f(e);
      size_t d = rank - 1;
      for (; d >= 1; --d) {
        const int64_t sz = a.dims[d].broadcast ? 1 : a.dims[d].size;
        if (++idx[d] < sz) break;
        idx[d] = 0;
      }
      if (d == 0) break;
    }
    return true;
  };
  // Live partitions [lo, hi) of each free element (lo >= hi: dead).
  std::vector<int16_t> lo(static_cast<size_t>(elems), 0), hi(static_cast<size_t>(elems), 0);
  std::vector<uint32_t> killed(static_cast<size_t>(elems), 0);  // == stamp: killed by the current op's write
  uint32_t stamp = 0;
  int64_t nlive = 0;
  // Positions (ascending) and whether nothing is live just before each.
  std::vector<int64_t> pos;
  std::vector<char> dead_before;
  for (size_t end = uses.size(); end > 0;) {
    const int64_t here = w.uses[uses[end - 1]].pos;
    size_t first = end - 1;  // the uses of one op (one position): [first, end)
    while (first > 0 && w.uses[uses[first - 1]].pos == here) --first;
    ++stamp;
    for (int pass = 0; pass < 2; ++pass)  // writes, then reads (an op reads its sources before writing)
      for (size_t i = first; i < end; ++i) {
        const auto& u = w.uses[uses[i]];
        const Op& op = k.ops[static_cast<size_t>(u.op)];
        const Access& a = *op.operands[static_cast<size_t>(u.slot)];
        // The partitions accessed, [p0, p1) (a strided or broadcast access: its hull, and a write that kills nothing).
        const DimAccess* pd = a.dims.empty() ? nullptr : &a.dims[0];
        const bool contiguous = !pd || (pd->step == 1 && !pd->broadcast);
        const int64_t p0 = pd ? pd->start.c : 0;
        const int64_t p1 = !pd ? ten.shape[0] : pd->broadcast ? p0 + 1 : p0 + (pd->size - 1) * pd->step + 1;
        const bool full_parts = contiguous && p0 == 0 && p1 >= ten.shape[0];
        const bool kill = u.slot == 0 && !(op.flags & isa::kAccumulate) && contiguous;
        if (pass == 0 && kill) {
          if (!visit(a, [&](int64_t e) {
                const auto i = static_cast<size_t>(e);
                if (lo[i] < hi[i] && p0 <= lo[i] && hi[i] <= p1) {
                  lo[i] = hi[i] = 0;
                  killed[i] = stamp;
                  --nlive;
                }
              }))
            return {};
        } else if (pass == 1 && !(kill && full_parts)) {
          // A read, or a write that does not cover every partition: live over the hull of what was live
          // and what it accesses (a write's elements it killed above stay dead).
          if (!visit(a, [&](int64_t e) {
                const auto i = static_cast<size_t>(e);
                if (kill && killed[i] == stamp) return;
                if (lo[i] >= hi[i]) {
                  lo[i] = static_cast<int16_t>(p0);
                  hi[i] = static_cast<int16_t>(p1);
                  ++nlive;
                } else {
                  lo[i] = static_cast<int16_t>(std::min<int64_t>(lo[i], p0));
                  hi[i] = static_cast<int16_t>(std::max<int64_t>(hi[i], p1));
                }
              }))
            return {};
        }
      }
    // Leaving (backwards) a loop around this op but not the alloc: a value live here is live into the loop's body,
    // carried from an earlier iteration or from before the loop (an accumulation `acc += ...` over the loop): the
    // tile is then live across the whole loop, no dead point inside it.
    const int64_t before = first > 0 ? w.uses[uses[first - 1]].pos : -1;
    for (int l = w.uses[uses[first]].loop; l != w.alloc_loop[t] && l >= 0; l = w.up(l))
      if (before < w.lo[static_cast<size_t>(l)] && nlive != 0)
        for (size_t j = pos.size(); j > 0 && pos[j - 1] <= w.hi[static_cast<size_t>(l)]; --j) dead_before[j - 1] = 0;
    pos.push_back(here);
    dead_before.push_back(nlive == 0);
    end = first;
  }
  std::reverse(pos.begin(), pos.end());
  std::reverse(dead_before.begin(), dead_before.end());
  Ivs r;
  int64_t start = pos[0];
  for (size_t i = 1; i < pos.size(); ++i)
    if (dead_before[i]) {
      r.emplace_back(start, pos[i - 1]);
      start = pos[i];
    }
  r.emplace_back(start, pos.back());
  if (r.size() < 2) return {};
  return r;
}

}  // namespace

std::vector<TileLifetime> tile_lifetimes(const Kernel& k) { return Walk(k).lifetimes(); }

AllocationPlan allocate_tiles(const Kernel& k, const engines::CoreParams& p, int64_t sbuf_avail, int64_t psum_avail) {
  const Walk w(k);
  AllocationPlan plan;
  plan.lifetimes = w.lifetimes();
  for (size_t pos = 0; pos < w.op_at.size(); ++pos) {
    if (w.op_at[pos] < 0) continue;
    double n = 1;
    for (int l = w.loop_at[pos]; l >= 0; l = w.up(l))
      n *= static_cast<double>(std::max<int64_t>(1, k.loops[static_cast<size_t>(l)].trip_count()));
    plan.executed_ops += n;
  }
  plan.statements = w.pos;
  const size_t nt = k.tensors.size();
  const bool stat = p.static_allocation;

  // The Simulator aligns on-chip allocations to the dependency chunk (at least 4 bytes); PSUM tiles
  // take whole banks so that a bank-sized tile never straddles two.
  const int64_t align = std::max<int64_t>(4, p.dep_chunk_bytes);
  const int64_t bank = std::max<int64_t>(align, p.mem.psum_bank_bytes);
  plan.tiles.assign(nt, TilePlacement{});
  std::vector<char> automatic(nt, 0);
  std::vector<int> init_bufs(nt, 1);
  // A tile no instruction accesses (the tracer's result tile of an nc_matmul written into its `+=` target
  // instead) holds nothing: one automatic buffer, and no bytes shared with other tiles (it is placed at its
  // region's start, over them); it only has to fit on its own. With compiler.allocation=static every tile keeps
  // its storage, used or not.
  std::vector<char> accessed(nt, static_cast<char>(stat));
  for (const Walk::Use& u : w.uses) accessed[static_cast<size_t>(u.tensor)] = 1;
  for (size_t t = 0; t < nt; ++t) {
    if (plan.lifetimes[t].first < 0) continue;
    const Tensor& ten = k.tensors[t];
    TilePlacement& pl = plan.tiles[t];
    pl.tensor = static_cast<int>(t);
    pl.stride = round_up(tile_bytes(ten), ten.space == Space::kPsum ? bank : align);
    // A tile placed by address= keeps that address in every iteration: no rotating buffers of the allocator's.
    automatic[t] = ten.bufs <= 0 && ten.address < 0;
    pl.bufs = init_bufs[t] = ten.bufs > 0 ? ten.bufs : (plan.lifetimes[t].in_loop && ten.address < 0 && accessed[t] ? (ten.space == Space::kPsum ? p.psum_loop_buffers : p.loop_buffers) : 1);
  }

  // A tile with rotating buffers overlaps consecutive iterations of the loop it rotates over (the
  // innermost loop around its alloc with more than one trip): the buffers of iterations i and i+1
  // are live at the same time, so while it has more than one buffer it holds them across that
  // loop's whole span, and no other tile of the loop body shares them (sharing would serialise the
  // iterations). With one buffer it is live from its first access to its last.
  std::vector<int64_t> rot_lo(nt, -1), rot_hi(nt, -1);
  std::vector<int> rot_loop(nt, -1);
  std::vector<int> inst_cap(nt, kMaxAutoDepth);  ///< the instances of a rotating tile, at most kMaxAutoDepth
  // A site allocated n times in one loop body (an inner loop the tracer unrolled, a loop it recorded a group of
  // iterations per pass: Tensor::site_count, the tracer's) rotates over the depth's storages in all, as the
  // unrolled trace's tiles of that site do: ceil(depth / n) automatic buffers each.
  for (size_t t = 0; t < nt; ++t) {
    const int n = k.tensors[t].site_count;
    if (plan.tiles[t].tensor >= 0 && automatic[t] && init_bufs[t] > 1 && n > 1)
      plan.tiles[t].bufs = init_bufs[t] = std::max(1, (init_bufs[t] + n - 1) / n);
  }
  for (size_t t = 0; t < nt; ++t) {
    if (plan.tiles[t].tensor < 0 || !accessed[t]) continue;
    int l = w.alloc_loop[t];
    while (l >= 0 && k.loops[static_cast<size_t>(l)].trip_count() <= 1) l = w.up(l);
    if (l < 0) continue;
    rot_loop[t] = l;
    rot_lo[t] = std::min(plan.lifetimes[t].first, w.lo[static_cast<size_t>(l)]);
    rot_hi[t] = std::max(plan.lifetimes[t].last, w.hi[static_cast<size_t>(l)]);
    // An automatic depth needs no more buffers than the tile has instances (the trips of the loops around it).
    if (automatic[t] && init_bufs[t] > 1) {
      int64_t instances = 1;
      for (int m = l; m >= 0 && instances < kMaxAutoDepth; m = w.up(m))
        instances *= std::max<int64_t>(1, k.loops[static_cast<size_t>(m)].trip_count());
      inst_cap[t] = static_cast<int>(std::min<int64_t>(instances, kMaxAutoDepth));
      plan.tiles[t].bufs = init_bufs[t] = std::min(init_bufs[t], inst_cap[t]);
    }
  }
  // The automatic depth of PSUM loop tile t when compiler.psum_loop_buffers is `d` (0: t has none: not automatic,
  // not in a loop, or in PSUM with a manual depth), as worked out above.
  const auto psum_depth = [&](size_t t, int d) {
    const Tensor& ten = k.tensors[t];
    if (!automatic[t] || ten.space != Space::kPsum || !plan.lifetimes[t].in_loop || init_bufs[t] <= 1) return 0;
    const int n = ten.site_count;
    int b = n > 1 && d > 1 ? std::max(1, (d + n - 1) / n) : d;
    if (rot_loop[t] >= 0 && b > 1) b = std::min(b, inst_cap[t]);
    return b;
  };

  // Value-level live ranges, computed on demand (the fallback when whole-tile lifetimes do not fit).
  std::vector<Ivs> values(nt);
  bool values_done = false;
  auto compute_values = [&] {
    if (values_done) return;
    values_done = true;
    std::vector<std::vector<size_t>> by_tensor(nt);
    for (size_t i = 0; i < w.uses.size(); ++i) by_tensor[static_cast<size_t>(w.uses[i].tensor)].push_back(i);
    int64_t budget = int64_t{1} << 27;  // element visits
    for (size_t t = 0; t < nt; ++t)
      if (plan.tiles[t].tensor >= 0 && w.alloc_pos[t] >= 0) values[t] = value_ranges(k, w, t, by_tensor[t], budget);
  };

  // Per tile (by tensor id): bytes, lifetime used for packing, offset, manual address (-1: none).
  std::vector<int64_t> size(nt, 0), off(nt, 0), off2(nt, 0), fixed(nt, -1);
  // Manual placements (address=) are kept, but a tile whose bytes overlap an earlier manual tile's
  // while both are live is placed by the allocator instead (as AWS's simulator, every tensor keeps its
  // own storage; nki-api.md 3.1), with a warning (compiler.md 4: overlapping live tiles are an error
  // on hardware).
  // The bytes a manual tile covers: its buffers, the last one only its own bytes, not the allocator's rounding (an
  // address= need not be a multiple of the alignment: the nki-samples rmsnorm_qkv packs a 4-byte tile at 256 and
  // the next tile at 260).
  auto manual_bytes = [&](size_t t) {
    const TilePlacement& pl = plan.tiles[t];
    const int64_t r = region_bytes(pl);
    return r >= kHuge ? r : r - (pl.stride - std::min(pl.stride, tile_bytes(k.tensors[t])));
  };
  for (size_t t = 0; t < nt; ++t) {
    if (plan.tiles[t].tensor < 0 || k.tensors[t].address < 0 || !accessed[t]) continue;
    const int64_t lo = k.tensors[t].address, hi = lo + manual_bytes(t);
    const int64_t first = rot_lo[t] >= 0 && init_bufs[t] > 1 ? rot_lo[t] : plan.lifetimes[t].first;
    const int64_t last = rot_lo[t] >= 0 && init_bufs[t] > 1 ? rot_hi[t] : plan.lifetimes[t].last;
    bool clash = false;
    for (size_t u = 0; u < t && !clash; ++u) {
      if (fixed[u] < 0 || k.tensors[u].space != k.tensors[t].space) continue;
      const int64_t ufirst = rot_lo[u] >= 0 && init_bufs[u] > 1 ? rot_lo[u] : plan.lifetimes[u].first;
      const int64_t ulast = rot_lo[u] >= 0 && init_bufs[u] > 1 ? rot_hi[u] : plan.lifetimes[u].last;
      const bool live = first <= ulast && ufirst <= last;
      const bool bytes = lo < fixed[u] + manual_bytes(u) && fixed[u] < hi;
      if (!live || !bytes) continue;
      clash = true;
      if (p.strict_allocation)
        throw Error(ErrorCode::kManualOverlap,
                    fmt::format("tile '{}' ({}) is placed by address= at {} bytes [{}, {}), over tile '{}' ({}) which is "
                                "live at the same time: on hardware they would overwrite each other (compiler.strict; "
                                "move one of them or shorten a lifetime)",
                                k.tensors[t].name, loc_str(k.tensors[t].loc), isa::space_name(k.tensors[t].space), lo,
                                hi, k.tensors[u].name, loc_str(k.tensors[u].loc)),
                    k.tensors[t].loc);
      plan.warnings.push_back(fmt::format(
          "tile '{}' ({}) is placed by address= at {} bytes [{}, {}), over tile '{}' ({}) which is live at the same "
          "time: on hardware they would overwrite each other; nsim places '{}' elsewhere",
          k.tensors[t].name, loc_str(k.tensors[t].loc), isa::space_name(k.tensors[t].space), lo, hi, k.tensors[u].name,
          loc_str(k.tensors[u].loc), k.tensors[t].name));
    }
    if (!clash) fixed[t] = lo;
  }
  std::vector<Ivs> iv(nt);
  // Per tile, the spans (statement positions) of the multi-trip loops around its alloc: a tile of such a loop uses
  // its bytes until the loop's last iteration, whatever its positions in one pass of the body (spread()'s reuse
  // distances to the tiles after the loop).
  std::vector<Ivs> spans(nt);
  for (size_t t = 0; t < nt; ++t)
    if (plan.tiles[t].tensor >= 0)
      for (int l = w.alloc_loop[t]; l >= 0; l = w.up(l))
        if (k.loops[static_cast<size_t>(l)].trip_count() > 1)
          spans[t].emplace_back(w.lo[static_cast<size_t>(l)], w.hi[static_cast<size_t>(l)]);
  // Allocation sites (alloc line, shape, dtype: the tracer's pool key) and, per tile, the buffer its
  // last instance uses (rotating tiles: buffer (trips - 1) mod bufs), for spread()'s rotation pass.
  SiteInfo sites;
  bool sites_done = false;
  auto site_info = [&]() -> const SiteInfo& {
    if (sites_done) return sites;
    sites_done = true;
    sites.site.assign(nt, -1);
    sites.recent_lo.assign(nt, 0);
    sites.recent_hi.assign(nt, 0);
    std::map<std::tuple<std::string, int, std::vector<int64_t>, int, int>, int> ids;
    for (size_t t = 0; t < nt; ++t) {
      if (plan.tiles[t].tensor < 0) continue;
      const Tensor& ten = k.tensors[t];
      const TilePlacement& pl = plan.tiles[t];
      sites.recent_hi[t] = region_bytes(pl);
      if (pl.bufs > 1 && rot_loop[t] >= 0) {
        const int64_t trips = k.loops[static_cast<size_t>(rot_loop[t])].trip_count();
        const int64_t b = (std::max<int64_t>(1, trips) - 1) % pl.bufs;
        sites.recent_lo[t] = b * pl.stride;
        sites.recent_hi[t] = (b + 1) * pl.stride;
      }
      if (ten.loc.line <= 0 || ten.address >= 0) continue;  // no site, or placed by hand
      const auto key = std::make_tuple(ten.loc.file, ten.loc.line, ten.shape, static_cast<int>(ten.dtype),
                                       static_cast<int>(ten.space));
      sites.site[t] = ids.emplace(key, static_cast<int>(ids.size())).first->second;
    }
    return sites;
  };

  for (Space sp : {Space::kSbuf, Space::kPsum}) {
    const bool psum = sp == Space::kPsum;
    const int64_t unit = psum ? bank : align;
    int64_t avail = psum ? psum_avail : sbuf_avail;
    if (avail < 0) avail = psum ? p.mem.psum_bytes_per_partition() : p.mem.sbuf_bytes_per_partition;
    std::vector<size_t> ids;
    for (size_t t = 0; t < nt; ++t) {
      if (plan.tiles[t].tensor < 0 || k.tensors[t].space != sp) continue;
      if (accessed[t]) {
        ids.push_back(t);
        continue;
      }
      const Tensor& ten = k.tensors[t];
      const int bufs = plan.tiles[t].bufs;
      if (const int64_t bytes = region_bytes(plan.tiles[t]); bytes > avail)
        throw Error(psum ? ErrorCode::kPsumOverflow : ErrorCode::kSbufOverflow,
                    fmt::format("{} overflow: tile '{}' {} {} x {} buffer{} = {} bytes per partition ({}) does not fit "
                                "in the {} bytes per partition available{}",
                                psum ? "PSUM" : "SBUF", ten.name, shape_str(ten.shape), dtype_name(ten.dtype), bufs,
                                bufs == 1 ? "" : "s", bytes, loc_str(ten.loc), avail,
                                psum ? " (whole 2 KiB banks)" : ""),
                    ten.loc);
    }
    if (ids.empty()) continue;

    int64_t extent = 0, peak = 0, peak_at = 0;
    // One attempt: whole-tile lifetimes, or value-level ones (`split`). Returns the overflow error.
    // `fallback`: whether automatic depths may fall back when the tiles do not fit (else the attempt fails).
    auto attempt = [&](bool split, bool fallback) -> std::optional<Error> {
      for (size_t t : ids) plan.tiles[t].bufs = init_bufs[t];
      // A tile's bytes and lifetime intervals: a function of its own placement only.
      const auto lay_out = [&](size_t t) {
        size[t] = region_bytes(plan.tiles[t]);
        const bool rotating = plan.tiles[t].bufs > 1 && rot_lo[t] >= 0;
        if (stat) iv[t] = {{0, std::max<int64_t>(0, plan.statements - 1)}};
        else if (rotating) iv[t] = {{rot_lo[t], rot_hi[t]}};
        else if (split && !values[t].empty()) iv[t] = values[t];
        else iv[t] = {{plan.lifetimes[t].first, plan.lifetimes[t].last}};
      };
      for (size_t t : ids) lay_out(t);
      // The fallback below changes one tile per step: from its first step on, the peak is kept by a PeakTree
      // (peak_of()'s answers) and the tile to take found by a PickIndex. Both are built only then (a kernel
      // whose tiles fit at once pays nothing for them), and not when some interval falls outside their
      // positions or the bytes could saturate (then peak_of() and a pass over the tiles, as without them).
      std::optional<PeakTree> tree;
      std::optional<PickIndex> picks, deep_picks;  // tiles with more than one buffer / more than two
      bool indexed = false;
      const auto index = [&] {
        indexed = true;
        const int64_t positions = plan.statements + 1;
        int64_t sum = 0;
        bool ok = plan.statements > 0;
        std::vector<size_t> cand, deep_cand;
        for (size_t t : ids) {
          sum = std::min(kSumCap, sum + size[t]);
          ok = ok && within(iv[t], positions);
          if (automatic[t] && plan.tiles[t].bufs > 1) cand.push_back(t);
          if (automatic[t] && plan.tiles[t].bufs > 2) deep_cand.push_back(t);
        }
        if (!ok || sum >= kSumCap) return;
        tree.emplace(positions);
        for (size_t t : ids) tree->add(iv[t], size[t]);
        picks.emplace(positions, std::move(cand), iv, plan.tiles);
        if (!deep_cand.empty()) deep_picks.emplace(positions, std::move(deep_cand), iv, plan.tiles);
      };
      const auto alive = [&](size_t t) { return plan.tiles[t].bufs > 1; };
      const auto deep = [&](size_t t) { return plan.tiles[t].bufs > 2; };
      for (;;) {
        std::tie(peak, peak_at) = tree && tree->peak().first > 0 ? tree->peak() : peak_of(ids, size, iv);
        bool packed = false;
        if (peak <= avail) {
          if (stat) {  // every tile its own region, in tensor-id order
            extent = pack(ids, size, iv, unit, false, fixed, off);
          } else {
            std::vector<size_t> by_size = ids, by_start = ids;
            std::stable_sort(by_size.begin(), by_size.end(), [&](size_t a, size_t b) {
              return size[a] != size[b] ? size[a] > size[b] : iv[a].front().first < iv[b].front().first;
            });
            std::stable_sort(by_start.begin(), by_start.end(), [&](size_t a, size_t b) {
              return iv[a].front().first != iv[b].front().first ? iv[a].front().first < iv[b].front().first
                                                                : size[a] > size[b];
            });
            extent = pack(by_size, size, iv, unit, true, fixed, off);
            const int64_t e2 = pack(by_start, size, iv, unit, false, fixed, off2);
            if (e2 < extent) {
              extent = e2;
              for (size_t t : ids) off[t] = off2[t];
            }
          }
          if (extent <= avail) {
            if (!stat) {
              bool shared = false;
              int64_t e3 = spread(ids, size, iv, unit, avail, nullptr, fixed, spans, off2, &shared);
              if (e3 >= 0 && shared) {  // some tile had to take used bytes: rotate them within sites
                std::vector<int64_t> off3 = off2;
                const int64_t e4 = spread(ids, size, iv, unit, avail, &site_info(), fixed, spans, off3, nullptr);
                if (e4 >= 0) {
                  e3 = e4;
                  off2.swap(off3);
                }
              }
              if (e3 >= 0) {
                extent = e3;
                for (size_t t : ids) off[t] = off2[t];
              } else {  // no free window for some tile that way: the packed placement, improved tile by tile
                improve(ids, size, iv, unit, avail, fixed, off);
                extent = 0;
                for (size_t t : ids) extent = std::max(extent, std::min(kSumCap, off[t] + size[t]));
              }
            }
            return std::nullopt;
          }
          packed = true;
        }
        if (!fallback) return Error(psum ? ErrorCode::kPsumOverflow : ErrorCode::kSbufOverflow, "(a deeper uniform depth)");
        // Fall back from automatic multi-buffering, one buffer at a time down to two, then to one buffer; largest
        // tiles first: those live at the peak while the peak does not fit, any while only the packing does not.
        // (Every tile at the peak keeps two buffers before any goes down to one: double buffering first.)
        int pick = -1;
        if (!indexed) index();
        if (picks) {
          if (deep_picks) pick = packed ? deep_picks->any(deep) : deep_picks->at(peak_at, deep);
          if (pick < 0) pick = packed ? picks->any(alive) : picks->at(peak_at, alive);
        } else {
          for (size_t t : ids) {
            const TilePlacement& pl = plan.tiles[t];
            if (!automatic[t] || pl.bufs <= 1 || (!packed && !contains(iv[t], peak_at))) continue;
            if (pick < 0) {
              pick = static_cast<int>(t);
              continue;
            }
            const TilePlacement& best = plan.tiles[static_cast<size_t>(pick)];
            if ((pl.bufs > 2) != (best.bufs > 2) ? pl.bufs > 2 : pl.stride > best.stride) pick = static_cast<int>(t);
          }
        }
        if (pick >= 0) {
          const auto t = static_cast<size_t>(pick);
          if (tree) tree->add(iv[t], -size[t]);
          plan.tiles[t].bufs = plan.tiles[t].bufs > 2 ? plan.tiles[t].bufs - 1 : 1;
          lay_out(t);
          if (tree) {
            if (within(iv[t], plan.statements + 1)) tree->add(iv[t], size[t]);
            else tree.reset();
          }
          continue;
        }

        // Overflow: name the tiles live at the point of peak use, largest first.
        std::vector<size_t> live;
        for (size_t t : ids)
          if (contains(iv[t], peak_at)) live.push_back(t);
        std::stable_sort(live.begin(), live.end(), [&](size_t a, size_t b) { return size[a] > size[b]; });
        std::string list;
        for (size_t i = 0; i < live.size() && i < kListedTiles; ++i) {
          const Tensor& t = k.tensors[live[i]];
          const int bufs = plan.tiles[live[i]].bufs;
          list += fmt::format("{}'{}' {} {} x {} buffer{} = {} bytes ({})", i ? ", " : "", t.name,
                              shape_str(t.shape), dtype_name(t.dtype), bufs, bufs == 1 ? "" : "s", size[live[i]],
                              loc_str(t.loc));
        }
        if (live.size() > kListedTiles) list += fmt::format(", and {} more", live.size() - kListedTiles);
        const SourceLoc* at =
            peak_at >= 0 && static_cast<size_t>(peak_at) < w.where.size() ? w.where[static_cast<size_t>(peak_at)]
                                                                           : nullptr;
        const std::string point =
            stat ? std::string(" (compiler.allocation: static, every tile keeps its storage for the whole kernel)")
            : at && (at->line > 0 || !at->file.empty()) ? fmt::format(" (at {})", loc_str(*at))
                                                        : std::string();
        const char* mem = psum ? "PSUM" : "SBUF";
        const char* banks = psum ? " (whole 2 KiB banks)" : "";
        std::string msg =
            packed ? fmt::format("{} overflow: the tiles do not pack into the {} bytes per partition available: "
                                 "their placement needs {} bytes per partition with their rotating buffers{}, at "
                                 "most {} of them live at once; tiles live at the point of peak use{}, largest "
                                 "first: {}",
                                 mem, avail, extent, banks, peak, point, list)
                   : fmt::format("{} overflow: the tiles live at the point of peak use{} need {} bytes per "
                                 "partition with their rotating buffers{}, but {} are available; live tiles, "
                                 "largest first: {}",
                                 mem, point, peak, banks, avail, list);
        return Error(psum ? ErrorCode::kPsumOverflow : ErrorCode::kSbufOverflow, std::move(msg),
                     live.empty() ? SourceLoc{} : k.tensors[live[0]].loc);
      }
    };

    // PSUM: one depth for every automatic loop tile, the deepest that fits as it is, from
    // compiler.psum_loop_buffers down to 2, before the fallback tile by tile (from 2 down to 1, as SBUF's goes
    // below 2). Its 8 banks hold a few loop tiles: taken back tile by tile from a deeper depth, the tiles at the
    // peak lost theirs first and the others kept theirs, and the one-buffer tiles then shared the banks left
    // (the library's multi-head flash attention at 4: 11.3 -> 21.6 us; docs/timing-model.md "Buffers").
    std::optional<Error> err;
    const bool uniform = psum && !stat && p.psum_loop_buffers > 2 && std::any_of(ids.begin(), ids.end(), [&](size_t t) {
                           return psum_depth(t, 2) != psum_depth(t, p.psum_loop_buffers);
                         });
    if (uniform) {
      for (int d = p.psum_loop_buffers;; --d) {
        for (size_t t : ids)
          if (const int b = psum_depth(t, d)) init_bufs[t] = b;
        if (d <= 2) break;  // the fallback below, from 2
        err = attempt(false, false);
        if (!err) break;
      }
    }
    if (!uniform || err) {
      err = attempt(false, true);
      if (err && !stat) {
        compute_values();
        bool any = false;
        for (size_t t : ids) any |= !values[t].empty();
        if (any) err = attempt(true, true);
      }
    }
    if (err) throw *err;
    for (size_t t : ids) plan.tiles[t].offset = off[t];
    if (psum && !stat) {
      bool shared = false;
      plan.psum_swaps = sharing_swaps(w, k, ids, size, iv, off, fixed, shared);
      const bool manual = std::any_of(ids.begin(), ids.end(), [&](size_t t) { return fixed[t] >= 0; });
      // Or an automatic PSUM tile's rotating buffers share banks with another tile (tiles of loops written out one
      // after another: the later ones wait for the rotating tile's last reads).
      bool rotating_shared = false;
      if (!manual && ids.size() <= kMaxTiles)
        for (size_t a : ids)
          for (size_t b : ids)
            rotating_shared |= a != b && automatic[a] && plan.tiles[a].bufs > 1 && off[a] < off[b] + size[b] &&
                               off[b] < off[a] + size[a];
      plan.psum_depth_candidate =
          (shared || rotating_shared) && p.psum_loop_buffers > 1 &&
          std::any_of(ids.begin(), ids.end(), [&](size_t t) { return automatic[t] && plan.tiles[t].bufs > 1; });
      if (!manual && ids.size() <= kMaxTiles)
        for (size_t t : ids)
          if (automatic[t] && rot_loop[t] >= 0 && plan.tiles[t].bufs == 1 && inst_cap[t] > 1 &&
              extent + plan.tiles[t].stride <= avail)
            plan.psum_deepen.push_back(static_cast<int>(t));
    }
    if (!psum && !stat)
      for (size_t t : ids)
        if (automatic[t] && rot_loop[t] >= 0 && init_bufs[t] > 1 && plan.tiles[t].bufs == 1 &&
            plan.sbuf_deepen.size() < kMaxTiles)
          plan.sbuf_deepen.push_back(static_cast<int>(t));
    (psum ? plan.psum_extent : plan.sbuf_extent) = extent;
    (psum ? plan.psum_peak : plan.sbuf_peak) = peak;
  }
  return plan;
}

}  // namespace nsim::frontend
