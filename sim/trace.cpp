#include "sim/trace.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "sim/error.h"

namespace nsim::sim {

std::string json_escape(const std::string& s) {
  std::string o;
  o.reserve(s.size());
  for (char c : s) {
    if (c == '"' || c == '\\') {
      o += '\\';
      o += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      o += fmt::format("\\u{:04x}", static_cast<int>(c));
    } else {
      o += c;
    }
  }
  return o;
}

TraceFilter TraceFilter::from_ns(uint64_t max_slices, double start_ns, double end_ns) {
  TraceFilter f;
  f.max_slices = max_slices;
  auto ps = [](double ns) -> Ps {  // ns -> ps, clamped to [0, 2^62] (nan -> 0)
    if (!(ns > 0)) return 0;
    return ns * 1e3 >= 0x1p62 ? Ps{1} << 62 : static_cast<Ps>(std::llround(ns * 1e3));
  };
  f.window_start = ps(start_ns);
  f.window_end = ps(end_ns);
  return f;
}

bool TraceFilter::in_window(Ps start, Ps dur) const {
  if (window_end > 0 && start >= window_end) return false;
  return start + dur > window_start || start >= window_start;
}

ChromeTraceWriter::ChromeTraceWriter(const std::string& path, std::string process_name, TraceFilter filter)
    : filter_(filter) {
  f_ = std::fopen(path.c_str(), "w");
  if (!f_) throw Error(ErrorCode::kCannotWrite, fmt::format("cannot open trace file '{}' for writing", path));
  fmt::print(f_, "{{\"displayTimeUnit\": \"ns\", \"traceEvents\": [\n");
  fmt::print(f_, "{{\"ph\": \"M\", \"pid\": 1, \"tid\": 0, \"name\": \"process_name\", \"args\": {{\"name\": \"{}\"}}}}",
             json_escape(process_name));
  first_ = false;
}

ChromeTraceWriter::~ChromeTraceWriter() {
  if (!finished_) finish();
}

void ChromeTraceWriter::declare_track(int track, const std::string& name) {
  fmt::print(f_, ",\n{{\"ph\": \"M\", \"pid\": 1, \"tid\": {}, \"name\": \"thread_name\", \"args\": {{\"name\": \"{}\"}}}}",
             track, json_escape(name));
  fmt::print(f_, ",\n{{\"ph\": \"M\", \"pid\": 1, \"tid\": {}, \"name\": \"thread_sort_index\", \"args\": {{\"sort_index\": {}}}}}",
             track, track);
}

bool ChromeTraceWriter::drops(Ps start, Ps dur) {
  if (!filter_.in_window(start, dur)) {
    ++dropped_window_;
    return true;
  }
  // Written slices all start before the last watermark and this one starts after it, so once the
  // limit is reached every new slice is later in the output order: drop it without buffering.
  if (limit_reached()) {
    drop_by_limit(start);
    return true;
  }
  return false;
}

void ChromeTraceWriter::slice(TraceSlice s) {
  if (drops(s.start, s.dur)) return;
  uint32_t idx;
  if (!free_.empty()) {
    idx = free_.back();
    free_.pop_back();
    pending_[idx] = std::move(s);
  } else {
    idx = static_cast<uint32_t>(pending_.size());
    pending_.push_back(std::move(s));
  }
  order_.schedule(pending_[idx].start, pending_[idx].track, idx);
  if (order_.size() > kMaxPending) write_earliest(kMaxPending / 2);
}

void ChromeTraceWriter::write_earliest(size_t n) {
  for (; n > 0 && !order_.empty(); --n) {
    uint32_t idx = order_.pop().payload;
    if (pending_[idx].start < last_written_start_) ++out_of_order_;
    last_written_start_ = std::max(last_written_start_, pending_[idx].start);
    write(pending_[idx]);
    pending_[idx] = TraceSlice{};
    free_.push_back(idx);
  }
}

void ChromeTraceWriter::watermark(Ps t) {
  while (!order_.empty() && order_.top().time < t) write_earliest(1);
}

void ChromeTraceWriter::counter(const std::string& name, Ps t, double value) {
  if (filter_.has_window() && !filter_.in_window(t, 0)) return;
  fmt::print(f_, ",\n{{\"ph\": \"C\", \"pid\": 1, \"ts\": {:.6f}, \"name\": \"{}\", \"args\": {{\"bytes\": {:.0f}}}}}",
             static_cast<double>(t) / 1e6, json_escape(name), value);
}

void ChromeTraceWriter::drop_by_limit(Ps start) {
  ++dropped_limit_;
  if (first_dropped_ < 0 || start < first_dropped_) first_dropped_ = start;
}

void ChromeTraceWriter::write(const TraceSlice& s) {
  if (limit_reached()) {
    drop_by_limit(s.start);
    return;
  }
  // Chrome trace timestamps are microseconds; keep ps precision with fractional values.
  fmt::print(f_, ",\n{{\"ph\": \"X\", \"pid\": 1, \"tid\": {}, \"ts\": {:.6f}, \"dur\": {:.6f}, \"name\": \"{}\", \"args\": {{{}}}}}",
             s.track, static_cast<double>(s.start) / 1e6, static_cast<double>(s.dur) / 1e6, json_escape(s.name),
             s.args_json);
  // Flow arrow from the producer's slice: written already (it starts earlier), unless it started before
  // the window (then it may have been dropped, and the arrow is left out).
  if (s.flow_id >= 0 && (!filter_.has_window() || s.flow_ts >= filter_.window_start)) {
    fmt::print(f_, ",\n{{\"ph\": \"s\", \"pid\": 1, \"tid\": {}, \"ts\": {:.6f}, \"id\": {}, \"name\": \"wait\", \"cat\": \"dependency\"}}",
               s.flow_track, static_cast<double>(s.flow_ts) / 1e6, s.flow_id);
    fmt::print(f_, ",\n{{\"ph\": \"f\", \"bp\": \"e\", \"pid\": 1, \"tid\": {}, \"ts\": {:.6f}, \"id\": {}, \"name\": \"wait\", \"cat\": \"dependency\"}}",
               s.track, static_cast<double>(s.start) / 1e6, s.flow_id);
  }
  ++written_;
}

void ChromeTraceWriter::finish() {
  if (finished_) return;
  watermark(INT64_MAX);
  if (filter_.active()) {
    // A global instant event (shown on Perfetto's global track, args in its details panel) at the
    // first slice missing because of the limit, else at the window start.
    const uint64_t dropped = slices_dropped();
    const Ps at = first_dropped_ >= 0 ? first_dropped_ : filter_.window_start;
    const std::string name = dropped ? fmt::format("partial trace: {} slices dropped ({} by limit, {} by window)",
                                                   dropped, dropped_limit_, dropped_window_)
                                     : std::string("trace filter: no slices dropped");
    fmt::print(f_,
               ",\n{{\"ph\": \"i\", \"s\": \"g\", \"pid\": 1, \"tid\": 0, \"ts\": {:.6f}, \"name\": \"{}\", "
               "\"args\": {{\"slices_written\": {}, \"slices_dropped\": {}, \"dropped_by_limit\": {}, "
               "\"dropped_by_window\": {}, \"max_slices\": {}, \"window_start_ns\": {:.3f}, \"window_end_ns\": {}}}}}",
               static_cast<double>(at) / 1e6, name, written_, dropped, dropped_limit_, dropped_window_,
               filter_.max_slices, static_cast<double>(filter_.window_start) / 1e3,
               filter_.window_end > 0 ? fmt::format("{:.3f}", static_cast<double>(filter_.window_end) / 1e3)
                                      : std::string("null"));
  }
  fmt::print(f_, "\n]}}\n");
  std::fclose(f_);
  f_ = nullptr;
  finished_ = true;
}

}  // namespace nsim::sim
