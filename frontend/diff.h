#pragma once
/// Comparison of two profiles (`nsim diff`, Python `Profile.compare`): which engines, headline stats
/// and source lines got faster or slower between two versions of a kernel or two configurations.
///
/// The input is the stats JSON that `nsim run --stats FILE` writes (and `Profile.to_stats_json()`):
///   {"kernel": ..., "config": ..., "timing_only": ..., "instructions": N,
///    "lines": [{"src": "file.py:42 (fn)", "instructions": n, "instruction_time_ns": t}, ...],
///    "stats": {<nested stats, leaves {"value", "unit", "description"}>}}
/// Only "stats" (with stats.total_time) is required; the other members are shown when present.
/// Malformed input raises nsim::Error: E401 (not JSON), E403 (a required member is missing),
/// E404 (a member has the wrong type). Messages start with the label of the offending side.
#include <string>
#include <string_view>
#include <vector>

namespace nsim::frontend {

/// One quantity on both sides. A side where the quantity does not exist is NaN (has_a()/has_b()
/// false); delta and ratio are then NaN too, except for source lines, where a line that exists on
/// one side only counts as 0 on the other (its whole time was added or removed).
struct DiffValue {
  double a = 0, b = 0;
  bool has_a() const;
  bool has_b() const;
  double delta() const { return b - a; }  ///< b - a (NaN when a side is missing)
  double ratio() const;                   ///< b / a; NaN when a side is missing or a == 0 (unless b == 0: 1)
  double percent() const;                 ///< 100 x (b - a) / a, NaN where ratio() is
};

/// Active time and instruction count of one engine; "dma" is the busiest DMA engine
/// (dma.max_engine_active_time) with dma.transfer_count as its instruction count.
struct EngineDiff {
  std::string name;  ///< tensor, vector, scalar, gpsimd, sync, dma
  DiffValue active_time_ns;
  DiffValue instructions;
};

/// A headline stat (HBM bytes, FLOPs, MFU, DMA transfers) by its dotted name.
struct StatDiff {
  std::string name;  ///< e.g. "memory.hbm_read_bytes"
  std::string unit;  ///< from the stats JSON (either side)
  DiffValue value;
};

enum class LineStatus { kSame, kChanged, kAdded, kRemoved };
const char* line_status_name(LineStatus s);  ///< "same", "changed", "added", "removed"

/// One kernel source line, matched by its "src" string ("file.py:42 (fn)").
struct LineDiff {
  std::string src;
  LineStatus status = LineStatus::kSame;
  DiffValue time_ns;       ///< summed instruction time (overlaps counted twice), 0 on a side without the line
  DiffValue instructions;  ///< 0 on a side without the line
};

/// What is known about one side.
struct ProfileSide {
  std::string label;   ///< what the user called it (file name, "a", ...)
  std::string kernel;  ///< "kernel" member, "" when absent
  std::string config;  ///< "config" member, "" when absent
  double instructions = 0;
  bool has_instructions = false;
};

struct ProfileDiff {
  ProfileSide a, b;
  DiffValue total_time_ns;
  std::vector<EngineDiff> engines;  ///< tensor, vector, scalar, gpsimd, sync, dma (rows missing on both sides dropped)
  std::vector<StatDiff> stats;      ///< headline stats (rows missing on both sides dropped)
  std::vector<LineDiff> lines;      ///< every line of either side, largest |time delta| first
};

/// Compare two stats-JSON texts. The labels name the sides in messages and output.
ProfileDiff diff_profiles(std::string_view stats_json_a, std::string_view stats_json_b, const std::string& label_a = "a",
                          const std::string& label_b = "b");

/// A readable, aligned report: total time, engines, headline stats, then at most `max_lines` source
/// lines (max_lines < 0: all of them). Times say "faster"/"slower", counts "more"/"fewer".
std::string to_text(const ProfileDiff& d, int max_lines = 20);

/// The whole comparison as JSON (every line, whatever max_lines): see docs/profiling.md.
/// Missing values and undefined ratios are null.
std::string to_json(const ProfileDiff& d);

}  // namespace nsim::frontend
