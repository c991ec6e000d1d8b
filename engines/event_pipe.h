#pragma once
/// Instruction events for the listeners that run beside the simulation (Simulator::add_event_listener: the
/// analyzer, and the dependency-bound schedule of SimOptions::dependency_bound): the simulating thread fills an
/// event per instruction into a ring and goes on; a host thread of the pipe's own takes them in program order and
/// hands each to the consumer. Nothing the consumer computes feeds back into the schedule, so the results are those
/// of a run that calls it in place, only the simulating thread no longer waits for it (docs/performance.md,
/// "`nsim analyze` beside the simulation").
///
/// Without a second host thread (isa::sem::host_threads(): NSIM_NUM_THREADS=1, or one CPU) the consumer runs at
/// publish(), on the simulating thread.
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <thread>
#include <vector>

#include "engines/dma/dma_engine.h"
#include "engines/run_stats.h"
#include "engines/sig_cache.h"
#include "isa/isa.h"
#include "memory/dma.h"

namespace nsim::engines {

/// One instruction as the event listeners see it, copied when it was scheduled.
struct InstrEvent {
  isa::Instr in;
  InstrTiming t;
  /// A PE-array transpose (PeResults::kTranspose): the dependency classes of the latest writers of its source
  /// (Simulator::writer_classes(in.slot(1))) when it was scheduled; 0 for other instructions.
  uint32_t src_writers = 0;
  /// With SimOptions::dependency_bound: the instruction's part of the dependency-bound schedule (its dependency
  /// class, its duration and the time it reads its operands in, < 0: until its end; Simulator::schedule_asap) and
  /// its operands' extents, from its signature (only the first nr / nw entries are set).
  bool asap = false;
  uint8_t asap_cls = 0;
  sim::Ps asap_dur = 0, asap_read = -1;
  SigAccesses acc;
  // (Last: the fields above are what every event is read for, contiguous; EventPipe::run prefetches them.)
  /// A DMA's split over the DMA engines and its transfer (what Simulator::last_dma_split() / last_dma_transfer()
  /// tell the listeners called in place); not set for other instructions.
  memory::DmaSplit split;
  DmaEngines::Transfer transfer;
};

class EventPipe {
 public:
  using Consumer = std::function<void(const InstrEvent&)>;
  /// `threaded`: `consume` runs on a thread of the pipe's own; else in publish().
  EventPipe(Consumer consume, bool threaded);
  ~EventPipe();
  EventPipe(const EventPipe&) = delete;
  EventPipe& operator=(const EventPipe&) = delete;

  bool threaded() const { return worker_.joinable(); }
  /// The event to fill next; publish() hands it over.
  InstrEvent& slot() { return ring_[head_ & kMask]; }
  void publish() {
    if (!threaded()) {
      consume_(ring_[0]);
      return;
    }
    ++head_;
    if (head_ - published_ >= kBatch) flush(false);
    if (head_ - tail_seen_ >= kSlots) wait_for_room();
    // The next event's common part, taken for writing while the next instruction is simulated (the consumer's core
    // read it last: a write would wait for each of its 18 cache lines).
    const char* next = reinterpret_cast<const char*>(&ring_[head_ & kMask]);
    for (size_t b = 0; b < offsetof(InstrEvent, split); b += 64) prefetch_for_write(next + b);
  }
  /// Return once the consumer has taken every event published; an exception it threw is rethrown here (once).
  void sync();

 private:
  // Events in the ring (2.2 KB each: 1.1 MB), a power of two. The side that runs ahead sleeps until the other
  // has caught up half of it (a wake, a system call and the time the sleeper takes to run again, per 256 events;
  // a sleeping side is woken at once by sync() and the destructor).
  static constexpr uint64_t kSlots = 512;
  static constexpr uint64_t kMask = kSlots - 1;
  static constexpr uint64_t kHalf = kSlots / 2;
  // Events published (and, by the consumer, released) together: one shared write per batch, not per event.
  static constexpr uint64_t kBatch = 16;

  static void prefetch_for_write(const char* p) {
#if defined(__x86_64__)
    asm volatile("prefetchw %0" : : "m"(*p));  // (a NOP on the x86-64 CPUs without it; the baseline ISA lacks the flag)
#else
    __builtin_prefetch(p, 1);
#endif
  }
  /// Hand over the events filled; wake the consumer if it sleeps and half the ring waits (or `urgent`).
  void flush(bool urgent);
  void wait_for_room();
  /// Wait (polling, then asleep) until the consumer has released every event up to `upto`.
  void wait_released(uint64_t upto);
  void run();

  Consumer consume_;
  std::vector<InstrEvent> ring_;
  // The simulating thread's own: events filled (head_), handed over (published_), the last release it read.
  uint64_t head_ = 0, published_ = 0, tail_seen_ = 0;
  // Shared, each group on its own cache line: the events handed over; the events the consumer released; and for
  // each side a counter it sleeps on (std::atomic::wait) with a flag saying it does (the side that wakes it
  // clears the flag: one wake per sleep), and what the producer waits for.
  alignas(64) std::atomic<uint64_t> head_pub_{0};
  alignas(64) std::atomic<uint64_t> tail_{0};
  alignas(64) std::atomic<uint32_t> consumer_wake_{0};
  std::atomic<bool> consumer_asleep_{false};
  std::atomic<bool> stop_{false};
  alignas(64) std::atomic<uint32_t> producer_wake_{0};
  std::atomic<bool> producer_asleep_{false};
  std::atomic<uint64_t> producer_wants_{0};
  std::exception_ptr error_;  ///< the consumer's first exception (read after a release: sync())
  std::thread worker_;
};

}  // namespace nsim::engines
