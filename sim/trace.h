#pragma once
/// Trace sinks. A sink receives tracks and slices; ChromeTraceWriter streams Chrome/Perfetto JSON
/// ("traceEvents", one thread per track) sorted by start time through a bounded reorder buffer,
/// optionally keeping only the earliest N slices and/or the slices overlapping a time window.
/// With no sink attached the simulator formats nothing.
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "sim/event_queue.h"
#include "sim/json_out.h"
#include "sim/time.h"

namespace nsim::sim {

/// One member of a slice's "args" object: a number or a string under a key that is a string literal of
/// identifier characters (written as it is; the writers tell keys apart by the literal's address).
/// Kept typed until the slice is written: no JSON value is built or destroyed per slice.
struct TraceArg {
  enum class Kind : uint8_t { kInt, kReal, kText };
  const char* key = "";
  Kind kind = Kind::kInt;
  int64_t i = 0;
  double d = 0;
  std::string text;
  static TraceArg integer(const char* k, int64_t v) { return {k, Kind::kInt, v, 0, {}}; }
  static TraceArg real(const char* k, double v) { return {k, Kind::kReal, 0, v, {}}; }
  static TraceArg string(const char* k, std::string v) { return {k, Kind::kText, 0, 0, std::move(v)}; }
};

struct TraceSlice {
  int track = 0;
  Ps start = 0;
  Ps dur = 0;
  std::string name;
  std::vector<TraceArg> args;  ///< the event's "args" object, members in this order
  /// A flow arrow into this slice from the slice that starts at (flow_track, flow_ts) — the
  /// instruction it waited for. flow_id < 0: none. Ids must be unique per trace.
  int64_t flow_id = -1;
  int flow_track = 0;
  Ps flow_ts = 0;
};

class TraceSink {
 public:
  virtual ~TraceSink() = default;
  virtual void declare_track(int track, const std::string& name) = 0;
  virtual void slice(TraceSlice s) = 0;
  /// True when a slice [start, start + dur) would not be written (outside the window, past the
  /// limit): it is then counted as dropped, and the caller skips formatting it and calling slice().
  virtual bool drops(Ps /*start*/, Ps /*dur*/) { return false; }
  /// True when the sink keeps only some slices (a limit or a window): callers then keep bounded state.
  virtual bool bounded() const { return false; }
  /// Whether a slice [start, start + dur) would be kept now (nothing counted): callers that keep
  /// per-slice state (the occupancy counter tracks) skip what the trace will not show.
  virtual bool keeps(Ps /*start*/, Ps /*dur*/) const { return true; }
  /// Whether instruction slices should carry the disassembly (the `instr` argument): the protobuf
  /// trace leaves it out (unique per instruction, nothing to intern), so callers skip formatting it.
  virtual bool wants_disassembly() const { return true; }
  /// Every future slice starts at or after `t`: earlier buffered slices may be written out.
  virtual void watermark(Ps t) = 0;
  /// A counter track `name` (e.g. SBUF bytes in use) takes `value` from time `t` on. Counter
  /// samples are not slices: not ordered with them, not limited, kept if `t` lies in the window.
  virtual void counter(const std::string& name, Ps t, double value) = 0;
  virtual void finish() = 0;
  /// Whether no slice starting at or after `t` can be written any more (a bounded sink: past the window's end,
  /// or the limit reached and a slice dropped by it): fast-forward may then skip iterations
  /// (Simulator::fast_forward_allowed), the trace the same.
  virtual bool closed_from(Ps /*t*/) const { return false; }
  /// `n` slices of iterations skipped when closed_from(t): counted as dropped, by the window or by the limit as
  /// the run simulating them would drop them.
  virtual void skipped(Ps /*t*/, uint64_t /*n*/) {}
};

/// Which slices a ChromeTraceWriter keeps (default: all). Dropped slices are still counted, and the
/// trace then ends with a global instant event that reports the counts, so a partial trace says so.
struct TraceFilter {
  uint64_t max_slices = 0;  ///< keep the earliest N slices in start-time order; 0 = unlimited
  Ps window_start = 0;      ///< keep slices overlapping [window_start, window_end) ...
  Ps window_end = 0;        ///< ... (kept whole, not clipped); 0 = no end
  /// From nanoseconds (as in SimOptions / the CLI); end_ns <= 0 = no end.
  static TraceFilter from_ns(uint64_t max_slices, double start_ns, double end_ns);
  bool has_window() const { return window_start > 0 || window_end > 0; }
  bool active() const { return max_slices > 0 || has_window(); }
  /// [start, start + dur) overlaps the window; a zero-length slice overlaps when it lies inside.
  bool in_window(Ps start, Ps dur) const;
};

/// The part every file-writing sink shares: the filter (limit, window, their counts) and a bounded
/// reorder buffer that hands slices to the format in start-time order. A format implements the emit_*
/// hooks; its destructor calls finish().
class OrderedTraceSink : public TraceSink {
 public:
  explicit OrderedTraceSink(TraceFilter filter) : filter_(filter) {}
  void declare_track(int track, const std::string& name) override { emit_track(track, name); }
  void slice(TraceSlice s) override;
  bool drops(Ps start, Ps dur) override;
  bool bounded() const override { return filter_.active(); }
  bool keeps(Ps start, Ps dur) const override { return filter_.in_window(start, dur) && !limit_reached(); }
  void watermark(Ps t) override;
  void counter(const std::string& name, Ps t, double value) override;
  void finish() override;
  bool closed_from(Ps t) const override {
    // Past the window's end every slice is dropped by it; with the limit reached (a slice dropped by it, so every later
    // one is too) and no window end, every slice from the window's start on is dropped by the limit, and one starting
    // at or after the earliest dropped leaves the summary's position (first_dropped_) as it is.
    return after_window(t) || (filter_.window_end == 0 && limit_reached() && first_dropped_ >= 0 && t >= first_dropped_ &&
                               t >= filter_.window_start);
  }
  void skipped(Ps t, uint64_t n) override { (after_window(t) ? dropped_window_ : dropped_limit_) += n; }
  /// The reorder buffer's bound: when more slices wait than this (the simulator's watermark stays
  /// low while an engine has issued nothing), the earliest half is written anyway, so memory stays
  /// bounded; a slice that later arrives earlier than written ones is written out of order (Perfetto
  /// and chrome://tracing sort on load).
  static constexpr size_t kMaxPending = size_t{1} << 16;
  uint64_t slices_written() const { return written_; }
  /// Slices written after a slice that starts later (only when the reorder buffer overflowed).
  uint64_t slices_out_of_order() const { return out_of_order_; }
  /// Slices not written: beyond max_slices, or outside the window (final after finish()).
  uint64_t slices_dropped() const { return dropped_limit_ + dropped_window_; }
  uint64_t slices_dropped_by_limit() const { return dropped_limit_; }
  uint64_t slices_dropped_by_window() const { return dropped_window_; }
  const TraceFilter& filter() const { return filter_; }

 protected:
  virtual void emit_track(int track, const std::string& name) = 0;
  /// One slice (and its flow arrow, if any), in start-time order.
  virtual void emit_slice(const TraceSlice& s) = 0;
  virtual void emit_counter(const std::string& name, Ps t, double value) = 0;
  /// With a filter: a marker at `at` saying what was dropped (`name`), then close the file.
  virtual void emit_summary(Ps at, const std::string& name) = 0;
  virtual void close() = 0;
  bool finished_ = false;
  TraceFilter filter_;
  uint64_t written_ = 0;
  uint64_t dropped_limit_ = 0, dropped_window_ = 0;

 private:
  bool limit_reached() const { return filter_.max_slices > 0 && written_ >= filter_.max_slices; }
  /// Every slice starting at or after t ends after it: past the window's end, every one is dropped by it.
  bool after_window(Ps t) const { return filter_.window_end > 0 && t >= filter_.window_end; }
  void drop_by_limit(Ps start);
  void write(const TraceSlice& s);
  void write_earliest(size_t n);
  Ps first_dropped_ = -1;  ///< earliest start of a slice dropped by the limit (-1 = none)
  Ps last_written_start_ = 0;
  uint64_t out_of_order_ = 0;
  EventQueue<uint32_t> order_;            // (start, track) -> index into pending_
  std::vector<TraceSlice> pending_;
  std::vector<uint32_t> free_;
};

/// Appends time `t` (ps) in microseconds as the JSON trace writes it, the text nlohmann's serializer gives for it:
/// an integer when whole, else the shortest decimal that reads back as t / 10^6 (written directly where that is
/// certainly the decimal t / 10^6 itself, else by the serializer's own formatter).
void append_us(std::string& out, Ps t);
/// Appends `v` as the JSON trace writes a double, the text nlohmann's serializer gives for it (null when not finite; a
/// time in ns made from ps, sim::ps_to_ns, written directly where that is certainly its text).
void append_real(std::string& out, double v);

/// Streams Chrome trace-event JSON (loads in ui.perfetto.dev and chrome://tracing): the frame
/// {"displayTimeUnit": "ns", "traceEvents": [...]} is written around the events, and each event is one
/// JSON object on its own line as it leaves the reorder buffer, so memory does not grow with the number of
/// events: serialized by nlohmann/json, or (slices, flow arrows, counter samples) written by hand in exactly
/// its form (the same bytes; strings that need escaping go through it).
class ChromeTraceWriter : public OrderedTraceSink {
 public:
  /// Throws nsim::Error(kCannotWrite) if the file cannot be opened.
  explicit ChromeTraceWriter(const std::string& path, std::string process_name = "NeuronCore",
                             TraceFilter filter = {});
  ~ChromeTraceWriter() override;

 protected:
  void emit_track(int track, const std::string& name) override;
  void emit_slice(const TraceSlice& s) override;
  void emit_counter(const std::string& name, Ps t, double value) override;
  void emit_summary(Ps at, const std::string& name) override;
  void close() override;

 private:
  void emit(const Json& event);  ///< one event, after a ",\n" separator
  std::FILE* f_ = nullptr;
  bool first_ = true;
  /// An event written by hand into EventOut's text (slices, flow arrows, counter samples): begin_event() starts
  /// it with the separator, end_event() writes it.
  void begin_event();
  void end_event();
  struct EventOut;    ///< nlohmann's serializer, kept for the whole trace, writing into f_
  std::unique_ptr<EventOut> out_;
};

/// Streams Perfetto's native protobuf trace format (a `.pftrace` file: ui.perfetto.dev and
/// trace_processor read it; docs/profiling.md): the same tracks, slices, flow arrows and counters as
/// the JSON trace, with event names, argument names and strings interned, timestamps incremental and
/// the packets zlib-compressed, so a slice costs ~13-21 bytes instead of ~300-600. Timestamps are
/// Perfetto's integer nanoseconds (the JSON trace keeps picoseconds): start and end are each rounded
/// to the nearest ns. Slices that overlap on a track without nesting go on child tracks (lanes).
class PerfettoTraceWriter : public OrderedTraceSink {
 public:
  /// `pid`: the process of this trace (one per core of an LNC=2 launch; their files concatenate).
  PerfettoTraceWriter(const std::string& path, std::string process_name, TraceFilter filter = {}, int pid = 1);
  ~PerfettoTraceWriter() override;
  /// The disassembly is unique per instruction: `nsim disasm` and the --instructions table have it, by index.
  bool wants_disassembly() const override { return false; }
  /// From now on each chunk of packets (256 KB) is compressed and written on a host thread of the writer's own
  /// while the next one is encoded (the same file; compressing is ~30 % of a large trace's cost). finish() waits
  /// for it and rethrows what it threw.
  void compress_beside();

 protected:
  void emit_track(int track, const std::string& name) override;
  void emit_slice(const TraceSlice& s) override;
  void emit_counter(const std::string& name, Ps t, double value) override;
  void emit_summary(Ps at, const std::string& name) override;
  void close() override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// True when a trace path asks for the protobuf format (ends in .pftrace or .perfetto-trace).
bool is_protobuf_trace_path(const std::string& path);

}  // namespace nsim::sim
