#pragma once
/// Host threads for the numerics' largest pieces of work (multiply_moving's product and its moving-operand
/// conversion). The simulation stays single-threaded: one instruction's work is split between the calling
/// thread and helper threads, which return before the instruction does, and every part computes its own
/// output elements exactly as a single thread would, so the bits never depend on the number of threads.
///
/// How many: NSIM_NUM_THREADS when set (1 = no helper), else the CPUs this process may run on, at most
/// kMaxThreads. Helpers start on first use, wait on a condition variable when idle, and are never joined
/// (they hold no resources at exit). A forked child starts its own on first use.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <type_traits>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace nsim::isa::sem {

inline constexpr int kMaxThreads = 8;

/// One step of a thread polling a value another thread sets (a pause: the polling core yields to its sibling
/// and leaves the memory pipeline alone).
inline void cpu_relax() {
#if defined(__x86_64__)
  _mm_pause();
#endif
}
/// The environment variable that sets the number of host threads.
inline constexpr const char* kThreadsEnv = "NSIM_NUM_THREADS";

/// The threads parallel_for may use (the caller included): 1..kMaxThreads.
int host_threads();

/// Run f(ctx) on the calling thread and, at the same time, on each helper that wakes before that call
/// returns; return when every call started has returned. f must share its work out dynamically (a helper
/// may join late or not at all) and must not throw. Everything runs on the caller alone when there is no
/// helper, when the helpers are busy with another caller (a second host thread simulating, or a nested
/// call), and for a while after a job that found the CPUs taken: the caller waited for a helper, or lost
/// its own CPU (then sharing costs more than it saves; parallel.cpp).
void run_shared(void (*f)(void* ctx), void* ctx);

/// A job run_shared would run, split in two: start() hands f(ctx) to the helpers and returns at once, so
/// the caller can go on with other work while they run it; finish() then runs f(ctx) on the caller too
/// and returns when every call started has returned. While a job is started, the helpers serve no other
/// caller (run_shared then runs on its caller alone). f has run_shared's contract (shared out dynamically:
/// the helpers may do all of it, some of it, or none, and finish() the rest).
class SharedJob {
 public:
  SharedJob() = default;
  SharedJob(const SharedJob&) = delete;
  SharedJob& operator=(const SharedJob&) = delete;
  ~SharedJob() { finish(); }
  /// Start f(ctx) on the helpers and return true; false, starting nothing, when run_shared would run it on
  /// the caller alone (no helper, the helpers busy or backing off) or a job is already started here.
  bool start(void (*f)(void* ctx), void* ctx);
  /// Complete the started job, if any (the caller takes what the helpers have not).
  void finish();
  bool started() const { return team_ != nullptr; }

 private:
  void* team_ = nullptr;
  void (*f_)(void*) = nullptr;
  void* ctx_ = nullptr;
};

/// body(b, e) over [0, count) in runs of `grain` items ([b, e), the last run may be shorter), shared
/// between host threads where `worth_it`: each thread takes the next run while there is one. Where not
/// worth it, with fewer than two runs, or with one host thread: body(0, count) here.
template <class F>
void parallel_for(int64_t count, int64_t grain, bool worth_it, F&& body) {
  const int64_t runs = grain > 0 ? (count + grain - 1) / grain : 0;
  if (!worth_it || runs < 2 || host_threads() < 2) {
    body(int64_t{0}, count);
    return;
  }
  struct Job {
    std::atomic<int64_t> next{0};
    int64_t runs, grain, count;
    std::remove_reference_t<F>* body;
  } job{{}, runs, grain, count, &body};
  run_shared(
      [](void* c) {
        Job& j = *static_cast<Job*>(c);
        for (int64_t r; (r = j.next.fetch_add(1, std::memory_order_relaxed)) < j.runs;)
          (*j.body)(r * j.grain, std::min(j.count, (r + 1) * j.grain));
      },
      &job);
}

/// For tests: replace host_threads() (0 = back to the environment / CPU count), and forget any slow job
/// (the next job may use the helpers again).
void set_host_threads_for_testing(int n);

}  // namespace nsim::isa::sem
