// Host threads for the numerics: see parallel.h.
#include "isa/semantics/parallel.h"

#include <pthread.h>
#include <sched.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <utility>


namespace nsim::isa::sem {

namespace {

// How long an idle helper keeps polling for the next job before it sleeps: a multiply_moving takes tens
// of microseconds, and the instructions between two of them about as long, so a helper woken once stays
// awake through a matmul loop. It sleeps sooner when it loses its CPU for kSlowLost meanwhile (another
// thread wants that CPU).
constexpr auto kHelperSpin = std::chrono::microseconds(200);
// The caller polls this many times for helpers still inside the job before it yields its CPU.
constexpr int kCallerSpins = 4096;
// A slow job makes the jobs of the next `penalty` run on the caller alone. A job is slow when its helpers
// kept the caller waiting longer than kSlowWait after its own share (a helper lost its CPU mid-run), or
// when the caller was off its CPU for more than kSlowLost and 1/kLostShare of the job (counted from the
// last job's end when the helpers polled since): more threads want to run than there are CPUs, ours
// included (another busy process, or OpenBLAS's threads, which poll for ~0.2 s after each call).
// The penalty doubles with each slow job, from kMinPenalty up to kMaxPenalty, and halves with each fast
// one: a slow job costs up to a scheduler time slice (milliseconds), a job on the caller alone only
// what the helpers would have saved of it (tens of microseconds).
constexpr auto kSlowWait = std::chrono::microseconds(100);
constexpr auto kSlowLost = std::chrono::microseconds(50);
constexpr int64_t kLostShare = 5;
constexpr int64_t kSlowLostNs = std::chrono::duration_cast<std::chrono::nanoseconds>(kSlowLost).count();
constexpr std::chrono::steady_clock::duration kMinPenalty = std::chrono::milliseconds(5),
                                               kMaxPenalty = std::chrono::milliseconds(40);

int64_t thread_cpu_ns() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

int threads_from_env() {
  if (const char* v = std::getenv(kThreadsEnv); v != nullptr && *v != '\0') {
    char* end = nullptr;
    const long n = std::strtol(v, &end, 10);
    if (end != v && *end == '\0' && n >= 1) return static_cast<int>(std::min<long>(n, kMaxThreads));
  }
  cpu_set_t set;
  CPU_ZERO(&set);
  const int cpus = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set)
                                                                : static_cast<int>(std::thread::hardware_concurrency());
  return std::clamp(cpus, 1, kMaxThreads);
}

std::atomic<int> g_threads_override{0};
std::atomic<bool> g_forget_slow{false};  // set_host_threads_for_testing: clear the penalty

// The helpers of one process. Never destroyed: the helper threads are detached and may still wait on
// its condition variable while the process exits.
//
// A job is open from when the caller posts it until the caller's own f returns: helpers enter it only
// while it is open, and the caller then waits only for those inside. gate_ holds the job's generation
// (high 32 bits), whether it is closed (bit 31) and how many helpers are inside (low 31 bits).
class Team {
 public:
  // Whether this caller may use the team (false while another caller does: it then works alone).
  bool try_acquire() { return !busy_.test_and_set(std::memory_order_acquire); }
  void release() { busy_.clear(std::memory_order_release); }

  // Run f(ctx) here and on the helpers that join, on a team acquired by the caller.
  void run(int threads, void (*f)(void*), void* ctx) {
    if (!open(threads, f, ctx)) {
      f(ctx);
      return;
    }
    close(f, ctx);
  }

  // Post f(ctx) to the helpers (which join while it is open) and return true; false, posting nothing,
  // while a slow job's penalty lasts.
  bool open(int threads, void (*f)(void*), void* ctx) {
    if (g_forget_slow.exchange(false, std::memory_order_relaxed)) {
      penalty_ = {};
      serial_until_ = {};
    }
    if (std::chrono::steady_clock::now() < serial_until_) return false;
    while (helpers_ < threads - 1) {  // start helpers on first need (no job is open)
      ++helpers_;
      const uint64_t now = posted_.load(std::memory_order_relaxed);
      std::thread([this, h = helpers_, now] { loop(h, now); }).detach();
    }
    // The CPU time the caller loses is counted from the job's start, or from the last job's end when
    // that is recent: the helpers then polled in between, taking CPU time too.
    wall0_ = std::chrono::steady_clock::now();
    cpu0_ = thread_cpu_ns();
    if (wall0_ - last_end_ < kHelperSpin) {
      wall0_ = last_end_;
      cpu0_ = last_end_cpu_;
    }
    f_ = f;
    ctx_ = ctx;
    joiners_.store(threads - 1, std::memory_order_relaxed);
    const uint64_t gen = posted_.load(std::memory_order_relaxed) + 1;
    gate_.store((gen & 0xFFFFFFFFu) << 32, std::memory_order_release);
    {
      std::lock_guard<std::mutex> lk(m_);  // a helper checks `posted_` under the lock before it sleeps
      posted_.store(gen, std::memory_order_release);
    }
    cv_.notify_all();
    return true;
  }

  // The open job: run f(ctx) here too, close it and wait for the helpers inside.
  void close(void (*f)(void*), void* ctx) {
    f(ctx);
    uint64_t g = gate_.fetch_or(kClosed, std::memory_order_acq_rel) | kClosed;
    auto waited = std::chrono::steady_clock::duration::zero();
    if ((g & kInside) != 0) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int spins = 0; ((g = gate_.load(std::memory_order_acquire)) & kInside) != 0; ++spins) {
        if (spins < kCallerSpins)
          cpu_relax();
        else
          std::this_thread::yield();
      }
      waited = std::chrono::steady_clock::now() - t0;
    }
    // Slow: the caller waited for a helper, or lost its own CPU for a while (more threads want to run
    // than there are CPUs, ours included).
    last_end_ = std::chrono::steady_clock::now();
    last_end_cpu_ = thread_cpu_ns();
    const int64_t wall = std::chrono::duration_cast<std::chrono::nanoseconds>(last_end_ - wall0_).count();
    const int64_t lost = wall - (last_end_cpu_ - cpu0_);
    if (waited > kSlowWait || (lost > kSlowLostNs && lost * kLostShare > wall)) {
      penalty_ = std::clamp(penalty_ * 2, kMinPenalty, kMaxPenalty);
      serial_until_ = std::chrono::steady_clock::now() + penalty_;
    } else {
      penalty_ /= 2;
    }
  }

 private:
  static constexpr uint64_t kClosed = uint64_t{1} << 31, kInside = kClosed - 1;

  // Helper h (1, 2, ...): joins the jobs that take at least h helpers.
  void loop(int h, uint64_t seen) {
    for (;;) {
      uint64_t p = posted_.load(std::memory_order_acquire);
      if (p == seen) {  // poll a while (less if this thread loses its CPU meanwhile), then sleep
        const auto start = std::chrono::steady_clock::now();
        const int64_t cpu0 = thread_cpu_ns();
        for (int k = 0; (p = posted_.load(std::memory_order_acquire)) == seen; ++k) {
          cpu_relax();
          if ((k & 255) != 255) continue;
          const auto now = std::chrono::steady_clock::now();
          if (now - start > kHelperSpin) break;
          const int64_t wall = std::chrono::duration_cast<std::chrono::nanoseconds>(now - start).count();
          if (wall - (thread_cpu_ns() - cpu0) > kSlowLostNs) break;
        }
        if (p == seen) {
          std::unique_lock<std::mutex> lk(m_);
          cv_.wait(lk, [&] { return posted_.load(std::memory_order_acquire) != seen; });
          p = posted_.load(std::memory_order_acquire);
        }
      }
      seen = p;
      // Enter job p if it takes this helper and is still open (the caller writes the next job only once
      // none is inside; a stale joiners_ is only read for a job the gate then refuses).
      if (h > joiners_.load(std::memory_order_relaxed)) continue;
      const uint64_t job = p & 0xFFFFFFFFu;
      uint64_t g = gate_.load(std::memory_order_acquire);
      while ((g >> 32) == job && (g & kClosed) == 0 &&
             !gate_.compare_exchange_weak(g, g + 1, std::memory_order_acq_rel, std::memory_order_acquire)) {
      }
      if ((g >> 32) != job || (g & kClosed) != 0) continue;
      f_(ctx_);
      gate_.fetch_sub(1, std::memory_order_acq_rel);
    }
  }

  // Only the caller holding the team changes these.
  int helpers_ = 0;  // started so far
  std::chrono::steady_clock::duration penalty_{0};
  std::chrono::steady_clock::time_point serial_until_{}, last_end_{}, wall0_{};
  int64_t last_end_cpu_ = 0, cpu0_ = 0;
  std::atomic_flag busy_ = ATOMIC_FLAG_INIT;
  std::mutex m_;
  std::condition_variable cv_;
  std::atomic<uint64_t> posted_{0};  // the last job's generation
  std::atomic<uint64_t> gate_{0};
  // The job: written by the caller before it opens the gate (release), read by helpers that enter.
  void (*f_)(void*) = nullptr;
  void* ctx_ = nullptr;
  std::atomic<int> joiners_{0};  // how many helpers the job takes (host_threads() - 1 when posted)
};

std::atomic<Team*> g_team{nullptr};
Team* g_parents_team = nullptr;  // in a forked child: the parent's, kept reachable (never used)
std::once_flag g_atfork_once;

Team* team() {
  Team* t = g_team.load(std::memory_order_acquire);
  if (t != nullptr) return t;
  static std::mutex create;
  std::lock_guard<std::mutex> lk(create);
  t = g_team.load(std::memory_order_acquire);
  if (t == nullptr) {
    // A forked child has none of the parent's threads: it forgets the parent's team (left allocated: its
    // mutex may have been copied held) and starts its own on first use.
    std::call_once(g_atfork_once, [] {
      pthread_atfork(nullptr, nullptr, [] { g_parents_team = g_team.exchange(nullptr); });
    });
    t = new Team();
    g_team.store(t, std::memory_order_release);
  }
  return t;
}

}  // namespace

int host_threads() {
  if (const int o = g_threads_override.load(std::memory_order_relaxed); o > 0) return o;
  static const int n = threads_from_env();
  return n;
}

void set_host_threads_for_testing(int n) {
  g_threads_override.store(std::clamp(n, 0, kMaxThreads));
  g_forget_slow.store(true);
}

bool SharedJob::start(void (*f)(void*), void* ctx) {
  if (team_ != nullptr) return false;
  const int n = host_threads();
  Team* t = n > 1 ? team() : nullptr;
  if (t == nullptr || !t->try_acquire()) return false;
  if (!t->open(n, f, ctx)) {
    t->release();
    return false;
  }
  team_ = t;
  f_ = f;
  ctx_ = ctx;
  return true;
}

void SharedJob::finish() {
  if (team_ == nullptr) return;
  Team* t = static_cast<Team*>(std::exchange(team_, nullptr));
  t->close(f_, ctx_);
  t->release();
}

void run_shared(void (*f)(void*), void* ctx) {
  const int n = host_threads();
  Team* t = n > 1 ? team() : nullptr;
  if (t == nullptr || !t->try_acquire()) {
    f(ctx);
    return;
  }
  t->run(n, f, ctx);
  t->release();
}

}  // namespace nsim::isa::sem
