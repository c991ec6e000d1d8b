#pragma once
/// Deterministic event queue: events ordered by (time, priority, sequence). Equal-time events run
/// in priority order, then in the order they were scheduled, so every run is reproducible.
#include <cstdint>
#include <algorithm>
#include <vector>

#include "sim/time.h"

namespace nsim::sim {

/// An event payload is a plain value of type T (no virtual dispatch, no allocation per event
/// beyond the heap's amortised growth).
template <typename T>
class EventQueue {
 public:
  struct Event {
    Ps time;
    int32_t priority;  ///< lower runs first at equal time
    uint64_t seq;
    T payload;
  };

  void schedule(Ps time, int32_t priority, const T& payload) {
    heap_.push_back(Event{time, priority, seq_++, payload});
    std::push_heap(heap_.begin(), heap_.end(), Later{});
  }
  bool empty() const { return heap_.empty(); }
  size_t size() const { return heap_.size(); }
  const Event& top() const { return heap_.front(); }
  Event pop() {
    std::pop_heap(heap_.begin(), heap_.end(), Later{});
    Event e = heap_.back();
    heap_.pop_back();
    now_ = e.time;
    return e;
  }
  Ps now() const { return now_; }
  /// Pre-size the heap so steady-state scheduling never allocates (keeps queued events).
  void reserve(size_t n) { heap_.reserve(n); }

 private:
  struct Later {  // "a runs after b": a max-heap on this order pops the earliest event first
    bool operator()(const Event& a, const Event& b) const {
      if (a.time != b.time) return a.time > b.time;
      if (a.priority != b.priority) return a.priority > b.priority;
      return a.seq > b.seq;
    }
  };
  std::vector<Event> heap_;
  uint64_t seq_ = 0;
  Ps now_ = 0;
};

}  // namespace nsim::sim
