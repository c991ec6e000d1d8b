#pragma once
/// What fast-forward (SimOptions::fast_forward, docs/timing-model.md "Fast-forward") made of each loop instance it
/// met (frontend::Lowering::fast_forward_at): the stats `fast_forward.loops.<name>` count the instances of each
/// outcome, and the CLI's summary says per loop what kept it from being skipped.
#include <array>
#include <cstdint>

namespace nsim::engines {

enum class FfOutcome : uint8_t {
  kSkipped,
  kShort,
  kRecurrence,
  kAlign,
  kRowsShared,
  kEmpty,
  kNoPeriod,
  kTooFewLeft,
  kOverflow,
  kLimit,
  kTraced,
  kCount
};

struct FfOutcomeInfo {
  const char* name;         ///< the stat fast_forward.loops.<name>
  /// What the instances counted are, after "loop instances " (the stat's description; the CLI's reason).
  const char* what;
};

inline constexpr std::array<FfOutcomeInfo, static_cast<size_t>(FfOutcome::kCount)> kFfOutcomes{{
    {"skipped", "whose middle iterations were counted as repeats"},
    {"short", "too short to follow (fewer iterations left than FastForward::kMinLoop)"},
    {"recurrence",
     "not followed: the body reads and writes an HBM tensor through different accesses (a recurrence "
     "such as y[b + 1] = f(y[b]), or a gather / scatter), which a skip would lose"},
    {"align", "not followed: the rotating buffers of the body's tiles cycle too slowly"},
    {"rows_shared",
     "not skipped: consecutive iterations share the list scheduler's HBM chunks, and an access moves "
     "without a constant forward stride, two accesses meet across iterations, or rows share a 4 KiB chunk of "
     "dependency tracking"},
    {"empty", "not skipped: an iteration lowered no instruction"},
    {"no_period", "not skipped: the iterations' timing did not repeat within the follower's limit"},
    {"too_few_left", "not skipped: too few iterations were left once their timing repeated"},
    {"overflow", "not skipped: the repeats would overflow the counters"},
    {"limit",
     "not skipped: the run's instruction or simulated-time limit (max_instructions, max_sim_time_ns) came within "
     "a span"},
    {"traced",
     "not skipped: the run's trace still kept slices when too few iterations were left (iterations are skipped only "
     "past the end of its window or once its limit is reached)"},
}};

inline const FfOutcomeInfo& ff_outcome(FfOutcome o) { return kFfOutcomes[static_cast<size_t>(o)]; }

using FfCounts = std::array<uint64_t, static_cast<size_t>(FfOutcome::kCount)>;

/// What a loop's instances `n` come to: skipped if any was; else the reason of the most instances, "short" only
/// where no instance got further.
inline FfOutcome ff_main_outcome(const FfCounts& n) {
  if (n[static_cast<size_t>(FfOutcome::kSkipped)]) return FfOutcome::kSkipped;
  size_t top = static_cast<size_t>(FfOutcome::kShort);
  for (size_t i = 0; i < n.size(); ++i)
    if (i != static_cast<size_t>(FfOutcome::kShort) && n[i] > 0 && (top == static_cast<size_t>(FfOutcome::kShort) || n[i] > n[top]))
      top = i;
  return static_cast<FfOutcome>(top);
}

}  // namespace nsim::engines
