#pragma once
/// Deterministic event queue: events ordered by (time, priority, sequence). Equal-time events run
/// in priority order, then in the order they were scheduled, so every run is reproducible.
#include <cstdint>
#include <queue>
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

  void schedule(Ps time, int32_t priority, const T& payload) { heap_.push(Event{time, priority, seq_++, payload}); }
  bool empty() const { return heap_.empty(); }
  size_t size() const { return heap_.size(); }
  const Event& top() const { return heap_.top(); }
  Event pop() {
    Event e = heap_.top();
    heap_.pop();
    now_ = e.time;
    return e;
  }
  Ps now() const { return now_; }
  /// Pre-size the heap so steady-state scheduling never allocates.
  void reserve(size_t n) {
    std::vector<Event> v;
    v.reserve(n);
    heap_ = Heap(Later{}, std::move(v));
  }

 private:
  struct Later {
    bool operator()(const Event& a, const Event& b) const {
      if (a.time != b.time) return a.time > b.time;
      if (a.priority != b.priority) return a.priority > b.priority;
      return a.seq > b.seq;
    }
  };
  using Heap = std::priority_queue<Event, std::vector<Event>, Later>;
  Heap heap_;
  uint64_t seq_ = 0;
  Ps now_ = 0;
};

}  // namespace nsim::sim
