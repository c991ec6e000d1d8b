#pragma once
/// Trace sinks. A sink receives tracks and slices; ChromeTraceWriter streams Chrome/Perfetto JSON
/// ("traceEvents", one thread per track) sorted by start time through a bounded reorder buffer.
/// With no sink attached the simulator formats nothing.
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "sim/event_queue.h"
#include "sim/time.h"

namespace nsim::sim {

struct TraceSlice {
  int track = 0;
  Ps start = 0;
  Ps dur = 0;
  std::string name;
  std::string args_json;  ///< body of the args object without braces, e.g. "\"src\": \"a.py:3\""
};

class TraceSink {
 public:
  virtual ~TraceSink() = default;
  virtual void declare_track(int track, const std::string& name) = 0;
  virtual void slice(TraceSlice s) = 0;
  /// Every future slice starts at or after `t`: earlier buffered slices may be written out.
  virtual void watermark(Ps t) = 0;
  virtual void finish() = 0;
};

/// Streams Chrome trace-event JSON (loads in ui.perfetto.dev and chrome://tracing).
class ChromeTraceWriter : public TraceSink {
 public:
  /// Throws nsim::Error(kInternal) if the file cannot be opened.
  explicit ChromeTraceWriter(const std::string& path, std::string process_name = "NeuronCore");
  ~ChromeTraceWriter() override;
  void declare_track(int track, const std::string& name) override;
  void slice(TraceSlice s) override;
  void watermark(Ps t) override;
  void finish() override;
  uint64_t slices_written() const { return written_; }

 private:
  void write(const TraceSlice& s);
  std::FILE* f_ = nullptr;
  bool first_ = true;
  bool finished_ = false;
  uint64_t written_ = 0;
  EventQueue<uint32_t> order_;            // (start, track) -> index into pending_
  std::vector<TraceSlice> pending_;
  std::vector<uint32_t> free_;
};

/// Escape a string for a JSON string literal body.
std::string json_escape(const std::string& s);

}  // namespace nsim::sim
