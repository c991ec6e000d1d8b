// The event pipe of the listeners beside the simulation: see event_pipe.h.
#include "engines/event_pipe.h"

#include <chrono>
#include <cstddef>

#include "isa/semantics/parallel.h"

namespace nsim::engines {

namespace {

// How long a side polls the other's counter before it sleeps: longer than the slower side takes for a batch of
// events, so that the faster side does not sleep (a system call on each side, and the time the sleeper takes to
// run again, tens of microseconds on a virtual machine) whenever it runs ahead; short enough that an idle pipe
// gives its CPU back.
constexpr auto kPoll = std::chrono::microseconds(100);

/// Poll until done() or kPoll has passed; done()'s last value.
template <class F>
bool poll(F&& done) {
  if (done()) return true;
  const auto until = std::chrono::steady_clock::now() + kPoll;
  while (true) {
    for (int i = 0; i < 64; ++i) {
      isa::sem::cpu_relax();
      if (done()) return true;
    }
    if (std::chrono::steady_clock::now() >= until) return done();
  }
}

/// Wake the side sleeping on `counter` (std::atomic::wait) whose flag `asleep` is set, clearing it (one wake per
/// sleep); `force`: whether or not the flag is set.
void wake(std::atomic<bool>& asleep, std::atomic<uint32_t>& counter, bool force = false) {
  if (asleep.exchange(false, std::memory_order_seq_cst) || force) {
    counter.fetch_add(1, std::memory_order_seq_cst);
    counter.notify_one();
  }
}

}  // namespace

EventPipe::EventPipe(Consumer consume, bool threaded) : consume_(std::move(consume)), ring_(threaded ? kSlots : 1) {
  if (threaded) worker_ = std::thread([this] { run(); });
}

EventPipe::~EventPipe() {
  if (!threaded()) return;
  flush(true);
  stop_.store(true, std::memory_order_seq_cst);
  wake(consumer_asleep_, consumer_wake_, true);
  worker_.join();
}

void EventPipe::flush(bool urgent) {
  if (published_ != head_) {
    published_ = head_;
    head_pub_.store(head_, std::memory_order_seq_cst);
  }
  // (seq_cst store of head_pub_, then seq_cst load of the flag: the consumer sets the flag, then reads head_pub_
  // again before it sleeps, so one of the two sees the other.)
  if (consumer_asleep_.load(std::memory_order_seq_cst) &&
      (urgent || head_ - tail_.load(std::memory_order_relaxed) >= kHalf))
    wake(consumer_asleep_, consumer_wake_);
}

void EventPipe::wait_for_room() {
  flush(true);  // (the consumer must see what it is to release)
  wait_released(head_ - kHalf);
}

void EventPipe::wait_released(uint64_t upto) {
  uint64_t t = 0;
  poll([&] { return (t = tail_.load(std::memory_order_acquire)) >= upto; });
  while (t < upto) {
    const uint32_t w = producer_wake_.load(std::memory_order_seq_cst);
    producer_wants_.store(upto, std::memory_order_relaxed);
    producer_asleep_.store(true, std::memory_order_seq_cst);
    wake(consumer_asleep_, consumer_wake_);  // (asleep with less than half the ring waiting: it must release these)
    t = tail_.load(std::memory_order_seq_cst);
    if (t < upto) producer_wake_.wait(w, std::memory_order_seq_cst);
    producer_asleep_.store(false, std::memory_order_relaxed);
    t = tail_.load(std::memory_order_acquire);
  }
  tail_seen_ = t;
}

void EventPipe::sync() {
  if (threaded()) {
    flush(true);
    wait_released(head_);
  }
  if (error_) {
    std::exception_ptr e = error_;
    error_ = nullptr;
    std::rethrow_exception(e);
  }
}

void EventPipe::run() {
  uint64_t tail = 0;
  const auto release = [&] {
    tail_.store(tail, std::memory_order_seq_cst);
    if (producer_asleep_.load(std::memory_order_seq_cst) && tail >= producer_wants_.load(std::memory_order_relaxed))
      wake(producer_asleep_, producer_wake_);
  };
  while (true) {
    uint64_t h = 0;
    poll([&] { return (h = head_pub_.load(std::memory_order_acquire)) != tail; });
    if (h == tail) {  // asleep until the producer has half the ring waiting, needs it all taken, or stops
      const uint32_t w = consumer_wake_.load(std::memory_order_seq_cst);
      consumer_asleep_.store(true, std::memory_order_seq_cst);
      h = head_pub_.load(std::memory_order_seq_cst);
      if (h == tail) {
        if (stop_.load(std::memory_order_seq_cst)) return;  // (the destructor flushed first: nothing is left)
        consumer_wake_.wait(w, std::memory_order_seq_cst);
      }
      consumer_asleep_.store(false, std::memory_order_relaxed);
      continue;
    }
    while (tail < h) {
      // The next event's common part, on its way from the simulating thread's core while this one is taken in
      // (it was written there: read cold, its 18 cache lines cost more than the work on it).
      if (tail + 1 < h) {
        const char* next = reinterpret_cast<const char*>(&ring_[(tail + 1) & kMask]);
        for (size_t b = 0; b < offsetof(InstrEvent, split); b += 64) __builtin_prefetch(next + b);
      }
      if (!error_) {
        try {
          consume_(ring_[tail & kMask]);
        } catch (...) {  // kept for sync(); later events are dropped
          error_ = std::current_exception();
        }
      }
      ++tail;
      if ((tail & (kBatch - 1)) == 0) release();
    }
    release();
  }
}

}  // namespace nsim::engines
