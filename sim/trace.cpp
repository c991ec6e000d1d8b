#include "sim/trace.h"

#include <fmt/format.h>

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

ChromeTraceWriter::ChromeTraceWriter(const std::string& path, std::string process_name) {
  f_ = std::fopen(path.c_str(), "w");
  if (!f_) throw Error(ErrorCode::kInternal, fmt::format("cannot open trace file '{}' for writing", path));
  fmt::print(f_, "{{\"displayTimeUnit\": \"ns\", \"traceEvents\": [\n");
  fmt::print(f_, "{{\"ph\": \"M\", \"pid\": 1, \"name\": \"process_name\", \"args\": {{\"name\": \"{}\"}}}}",
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

void ChromeTraceWriter::slice(TraceSlice s) {
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
}

void ChromeTraceWriter::watermark(Ps t) {
  while (!order_.empty() && order_.top().time < t) {
    uint32_t idx = order_.pop().payload;
    write(pending_[idx]);
    pending_[idx] = TraceSlice{};
    free_.push_back(idx);
  }
}

void ChromeTraceWriter::write(const TraceSlice& s) {
  // Chrome trace timestamps are microseconds; keep ps precision with fractional values.
  fmt::print(f_, ",\n{{\"ph\": \"X\", \"pid\": 1, \"tid\": {}, \"ts\": {:.6f}, \"dur\": {:.6f}, \"name\": \"{}\", \"args\": {{{}}}}}",
             s.track, static_cast<double>(s.start) / 1e6, static_cast<double>(s.dur) / 1e6, json_escape(s.name),
             s.args_json);
  ++written_;
}

void ChromeTraceWriter::finish() {
  if (finished_) return;
  watermark(INT64_MAX);
  fmt::print(f_, "\n]}}\n");
  std::fclose(f_);
  f_ = nullptr;
  finished_ = true;
}

}  // namespace nsim::sim
