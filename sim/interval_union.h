#pragma once
/// IntervalUnion: the total length of the union of half-open time intervals [s, e) that arrive in
/// any order, kept in bounded memory thanks to a watermark.
///
/// The simulator produces intervals (instructions on five engines, DMA packets on 16 engines) that
/// are not sorted by start, but it knows a watermark: no interval added later starts before it (the
/// earliest next issue of any engine, Simulator::watermark()). An interval that ends by the watermark
/// can therefore never merge with a future one: fold(watermark) adds its length to the total and
/// forgets it. Only what can still merge stays pending, as a sorted vector of disjoint intervals.
/// Usually a new interval extends or follows the last pending one (inline, O(1)); otherwise a short
/// scan from the end finds where it merges. No allocation after construction: twice the bound below
/// is reserved up front and folded intervals are dropped from the front.
///
/// Memory bound: when `max_pending` (1024 by default, 32 KiB reserved) disjoint intervals are pending
/// and another one comes (the watermark is stuck: an engine that never issues keeps it at 0, and the
/// union has gaps), the earliest one is folded early. Everything folded sets a floor (its end, or the
/// watermark when forwarding, see forward_to): the part of a later interval before the floor is
/// dropped and counted in clipped(), an upper bound of the time the union may then miss (0 as long as
/// the watermark promise holds and the bound is not reached). Nothing is ever counted twice.
///
///   IntervalUnion u;
///   u.add(10, 20); u.add(0, 5); u.add(15, 30);   // any order
///   u.fold(8);                                   // [0, 5) is final
///   u.close();  u.total() == 25
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "sim/time.h"

namespace nsim::sim {

class IntervalUnion {
 public:
  static constexpr size_t kDefaultMaxPending = 1024;

  /// Twice the bound is reserved up front (16 bytes per interval), so adding never allocates and
  /// the folded intervals at the front are moved out at most once per `max_pending` adds.
  explicit IntervalUnion(size_t max_pending = kDefaultMaxPending) : max_(std::max<size_t>(1, max_pending)) {
    iv_.reserve(2 * max_ + 1);
  }

  /// Add [s, e); empty or reversed intervals are ignored. Inline fast path: [s, e) starts inside
  /// (or touching the end of) the last pending interval.
  void add(Ps s, Ps e) {
    if (s >= floor_ && e > s && head_ != iv_.size()) {
      auto& last = iv_.back();
      if (s >= last.first && s <= last.second) {
        if (e > last.second) last.second = e;
        return;
      }
    }
    add_slow(s, e);
  }

  /// No interval added from now on starts before `watermark`: finalise the intervals that end by
  /// then. With a forward target, also the part before the watermark of one that straddles it.
  void fold(Ps watermark) {
    if (head_ == iv_.size() || iv_[head_].first >= watermark ||
        (!fwd_ && iv_[head_].second > watermark))
      return;  // nothing to do (the common case: inline)
    fold_slow(watermark);
  }

  /// Also add every finalised part of this union to `target` (nullptr: none), which then holds the
  /// union of both. What is forwarded at fold(w) lies before w and starts at or after the previous
  /// fold's watermark, so `target` may be folded at w right after this one (not before: it would
  /// then clip what this one forwards). Used to feed DMA packets, mostly in the future, into the
  /// union over all engines only once the watermark reaches them.
  void forward_to(IntervalUnion* target) { fwd_ = target; }

  /// Count `d` more of union length without intervals (a loop's iterations the lowering skipped,
  /// SimOptions::fast_forward: their share of the union, measured over iterations simulated).
  void add_length(Ps d) { done_ += d; }

  /// Fold everything (end of the run); what is added afterwards is clipped.
  void close() { fold(INT64_MAX); }

  /// Length of the union so far: folded plus pending intervals.
  Ps total() const {
    Ps t = done_;
    for (size_t i = head_; i < iv_.size(); ++i) t += iv_[i].second - iv_[i].first;
    return t;
  }
  /// Disjoint intervals still pending (not yet folded).
  size_t pending() const { return iv_.size() - head_; }
  /// Time dropped because an interval started before the floor (0 when the watermark held and the
  /// pending bound was never reached): an upper bound of what total() misses.
  Ps clipped() const { return clipped_; }

 private:
  using Iv = std::pair<Ps, Ps>;
  static constexpr int kScanSteps = 8;  ///< linear steps of merge()'s searches before a binary search

  [[gnu::noinline]] void fold_slow(Ps watermark) {
    if (!fwd_) {
      while (head_ < iv_.size() && iv_[head_].second <= watermark) drop_front();
      compact();
      return;
    }
    while (head_ < iv_.size() && iv_[head_].second <= watermark) drop_front();
    if (head_ < iv_.size() && iv_[head_].first < watermark) {  // straddles: keep [watermark, end)
      fwd_->add(iv_[head_].first, watermark);
      done_ += watermark - iv_[head_].first;
      iv_[head_].first = watermark;
    }
    floor_ = std::max(floor_, watermark);
    compact();
  }

  [[gnu::noinline]] void add_slow(Ps s, Ps e) {
    if (s < floor_) {
      if (e > s) clipped_ += std::min(e, floor_) - s;
      s = floor_;
    }
    if (e <= s) return;
    if (head_ == iv_.size()) return push(s, e);
    auto& last = iv_.back();
    if (s > last.second) return push(s, e);  // after every pending interval (touching merges)
    if (s >= last.first) {                   // starts inside the last one
      last.second = std::max(last.second, e);
      return;
    }
    auto& first = iv_[head_];  // inside the first one, before the second: extends the first
    if (s >= first.first && s <= first.second && e < iv_[head_ + 1].first) {
      first.second = std::max(first.second, e);
      return;
    }
    merge(s, e);
  }

  void push(Ps s, Ps e) {
    if (iv_.size() - head_ == max_) drop_front();  // at the bound: fold the earliest one early
    make_room();
    iv_.emplace_back(s, e);
  }

  // [s, e) starts before the last pending interval: merge it with every pending interval it
  // overlaps or touches (ends are sorted too, since the intervals are disjoint and sorted). New
  // intervals usually land near the end: a few steps back from there, then a binary search (DMA
  // packets forwarded into the union over all engines land near the front of up to `max_pending`).
  void merge(Ps s, Ps e) {
    const auto base = iv_.begin();
    size_t j = iv_.size();  // first interval starting after e
    for (int k = 0; k < kScanSteps && j > head_ && iv_[j - 1].first > e; ++k) --j;
    if (j > head_ && iv_[j - 1].first > e)
      j = static_cast<size_t>(std::upper_bound(base + static_cast<std::ptrdiff_t>(head_), base + static_cast<std::ptrdiff_t>(j), e,
                                               [](Ps v, const Iv& x) { return v < x.first; }) - base);
    size_t i = j;  // first interval of [i, j) ending at or after s
    for (int k = 0; k < kScanSteps && i > head_ && iv_[i - 1].second >= s; ++k) --i;
    if (i > head_ && iv_[i - 1].second >= s)
      i = static_cast<size_t>(std::lower_bound(base + static_cast<std::ptrdiff_t>(head_), base + static_cast<std::ptrdiff_t>(i), s,
                                               [](const Iv& x, Ps v) { return x.second < v; }) - base);
    if (i == j) {
      if (iv_.size() - head_ == max_) {  // at the bound: fold the earliest one early
        if (i == head_) {                 // that is [s, e) itself
          done_ += e - s;
          floor_ = std::max(floor_, e);
          if (fwd_) fwd_->add(s, e);
          return;
        }
        drop_front();
      }
      const size_t moved = make_room();
      iv_.insert(iv_.begin() + static_cast<std::ptrdiff_t>(i - moved), Iv{s, e});
      return;
    }
    iv_[i].first = std::min(iv_[i].first, s);
    iv_[i].second = std::max(e, iv_[j - 1].second);
    if (j > i + 1)
      iv_.erase(iv_.begin() + static_cast<std::ptrdiff_t>(i + 1), iv_.begin() + static_cast<std::ptrdiff_t>(j));
  }

  void drop_front() {
    const Iv f = iv_[head_++];
    done_ += f.second - f.first;
    floor_ = std::max(floor_, f.second);
    if (fwd_) fwd_->add(f.first, f.second);
  }

  // Before growing, reuse the room of the folded intervals at the front (no allocation while the
  // pending intervals fit in the reserved capacity). Returns by how many places they moved down.
  size_t make_room() {
    if (iv_.size() < iv_.capacity() || head_ == 0) return 0;
    const size_t moved = head_;
    iv_.erase(iv_.begin(), iv_.begin() + static_cast<std::ptrdiff_t>(head_));
    head_ = 0;
    return moved;
  }

  void compact() {
    if (head_ == iv_.size()) {
      iv_.clear();
      head_ = 0;
    } else if (head_ >= 64 && 2 * head_ >= iv_.size()) {
      iv_.erase(iv_.begin(), iv_.begin() + static_cast<std::ptrdiff_t>(head_));
      head_ = 0;
    }
  }

  std::vector<Iv> iv_;  ///< [head_, size): pending, sorted by start, disjoint and not touching
  size_t head_ = 0;
  size_t max_;
  Ps done_ = 0;    ///< length of the folded intervals
  Ps floor_ = INT64_MIN;  ///< last watermark or early-folded end: nothing before it is added again
  Ps clipped_ = 0;
  IntervalUnion* fwd_ = nullptr;
};

}  // namespace nsim::sim
