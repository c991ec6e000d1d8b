// PerfettoTraceWriter: Perfetto's protobuf trace format (perfetto/protos/perfetto/trace/trace.proto),
// encoded by hand (no protobuf library): a Trace is a sequence of `packet` (field 1) TracePackets.
// Field numbers used (TracePacket / TrackEvent / TrackDescriptor / DebugAnnotation / InternedData):
//   TracePacket: timestamp 8, trusted_packet_sequence_id 10, track_event 11, interned_data 12,
//                sequence_flags 13 (1 = incremental state cleared, 2 = needs incremental state),
//                track_descriptor 60
//   TrackDescriptor: uuid 1, name 2, process 3 {pid 1, process_name 6}, thread 4 {pid 1, tid 2,
//                thread_name 5}, parent_uuid 5, counter 8 {}
//   TrackEvent: debug_annotations 4, type 9 (1 begin, 2 end, 3 instant, 4 counter), name_iid 10,
//                track_uuid 11, name 23, double_counter_value 44, flow_ids 47, terminating_flow_ids 48
//   DebugAnnotation: name_iid 1, int_value 4, double_value 5, string_value_iid 17
//   InternedData: event_names 2 {iid 1, name 2}, debug_annotation_names 3 {iid 1, name 2},
//                debug_annotation_string_values 29 {iid 1, str 2}
#include <fmt/format.h>

#include <cstdio>
#include <cstring>
#include <string_view>
#include <unordered_map>

#include "sim/error.h"
#include "sim/trace.h"

namespace nsim::sim {

namespace {

/// A protobuf message being encoded.
struct Pb {
  std::string b;
  void varint(uint64_t v) {
    while (v >= 0x80) {
      b.push_back(static_cast<char>((v & 0x7f) | 0x80));
      v >>= 7;
    }
    b.push_back(static_cast<char>(v));
  }
  void tag(int field, int wire) { varint((static_cast<uint64_t>(field) << 3) | static_cast<uint64_t>(wire)); }
  void u64(int f, uint64_t v) {
    tag(f, 0);
    varint(v);
  }
  void i64(int f, int64_t v) {
    tag(f, 0);
    varint(static_cast<uint64_t>(v));
  }
  void fixed64(int f, uint64_t v) {
    tag(f, 1);
    char x[8];
    std::memcpy(x, &v, 8);  // little-endian hosts only (x86-64, aarch64)
    b.append(x, 8);
  }
  void dbl(int f, double v) {
    uint64_t u;
    std::memcpy(&u, &v, 8);
    fixed64(f, u);
  }
  void str(int f, std::string_view s) {
    tag(f, 2);
    varint(s.size());
    b.append(s.data(), s.size());
  }
  void msg(int f, const Pb& m) { str(f, m.b); }
  void clear() { b.clear(); }
};

/// Hash of strings that also looks up string_views (no std::string built per lookup).
struct TextHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using InternTable = std::unordered_map<std::string, uint64_t, TextHash, std::equal_to<>>;

uint64_t ns(Ps t) { return static_cast<uint64_t>(std::max<Ps>(0, (t + 500) / 1000)); }

}  // namespace

bool is_protobuf_trace_path(const std::string& path) {
  auto ends = [&](std::string_view e) { return path.size() >= e.size() && path.compare(path.size() - e.size(), e.size(), e) == 0; };
  return ends(".pftrace") || ends(".perfetto-trace");
}

struct PerfettoTraceWriter::Impl {
  std::FILE* f = nullptr;
  uint32_t seq = 1;         ///< trusted_packet_sequence_id (one per writer: interning is per sequence)
  uint64_t process = 0;     ///< uuid of the process track
  int pid = 1;
  std::unordered_map<int, uint64_t> tracks;           ///< track -> uuid
  std::unordered_map<std::string, uint64_t> counters;  ///< counter name -> uuid
  InternTable names, arg_names, strings;  ///< interned -> iid
  Pb packet, event, interned, tmp, ann, out;  ///< reused: no allocation per event once warm

  /// Track uuids: small numbers (varints of 1-2 bytes on every event), distinct per process (core).
  uint64_t uuid(uint64_t local) const { return static_cast<uint64_t>(pid) * kUuidsPerProcess + local; }
  static constexpr uint64_t kUuidsPerProcess = 4096;
  /// iid of `s` in `table`, adding it to the packet's interned data (`field` of InternedData) when new.
  uint64_t intern(InternTable& table, int field, std::string_view s) {
    if (auto it = table.find(s); it != table.end()) return it->second;
    const uint64_t iid = table.size() + 1;
    table.emplace(std::string(s), iid);
    tmp.clear();
    tmp.u64(1, iid);
    tmp.str(2, s);
    interned.msg(field, tmp);
    return iid;
  }
  /// Writes `packet` (+ `interned`, sequence fields) as one Trace.packet.
  void flush(bool first = false) {
    packet.u64(10, seq);
    if (!interned.b.empty()) packet.msg(12, interned);
    packet.u64(13, first ? 1 : 2);
    out.clear();
    out.msg(1, packet);
    std::fwrite(out.b.data(), 1, out.b.size(), f);
    packet.clear();
    interned.clear();
  }
  void track_event(uint64_t t_ns) {
    packet.u64(8, t_ns);
    packet.msg(11, event);
    event.clear();
    flush();
  }
  uint64_t track_uuid(int track) {
    auto it = tracks.find(track);
    return it != tracks.end() ? it->second : uuid(static_cast<uint64_t>(track) + 1);
  }
};

PerfettoTraceWriter::PerfettoTraceWriter(const std::string& path, std::string process_name, TraceFilter filter, int pid)
    : OrderedTraceSink(filter), impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.f = std::fopen(path.c_str(), "wb");
  if (!m.f) throw Error(ErrorCode::kCannotWrite, fmt::format("cannot open trace file '{}' for writing", path));
  m.pid = pid;
  m.seq = static_cast<uint32_t>(pid);
  m.process = m.uuid(0);
  Pb proc, td;
  proc.u64(1, static_cast<uint64_t>(pid));
  proc.str(6, process_name);
  td.u64(1, m.process);
  td.msg(3, proc);
  m.packet.msg(60, td);
  m.flush(true);
}

PerfettoTraceWriter::~PerfettoTraceWriter() {
  if (!finished_) finish();
}

void PerfettoTraceWriter::emit_track(int track, const std::string& name) {
  Impl& m = *impl_;
  const uint64_t u = m.uuid(static_cast<uint64_t>(track) + 1);
  m.tracks[track] = u;
  Pb thread, td;
  thread.u64(1, static_cast<uint64_t>(m.pid));
  thread.u64(2, static_cast<uint64_t>(track) + 1);  // tid: tracks sort by it
  thread.str(5, name);
  td.u64(1, u);
  td.u64(5, m.process);
  td.msg(4, thread);
  m.packet.msg(60, td);
  m.flush();
}

void PerfettoTraceWriter::emit_slice(const TraceSlice& s) {
  Impl& m = *impl_;
  const uint64_t tu = m.track_uuid(s.track);
  // Flow arrow: from an instant at the producer slice's start (its slice is written already) to this one.
  const bool flow = s.flow_id >= 0 && (!filter_.has_window() || s.flow_ts >= filter_.window_start);
  if (flow) {
    m.event.u64(9, 3);
    m.event.u64(11, m.track_uuid(s.flow_track));
    m.event.u64(10, m.intern(m.names, 2, "wait"));
    m.event.fixed64(47, static_cast<uint64_t>(s.flow_id));
    m.track_event(ns(s.flow_ts));
  }
  m.event.u64(9, 1);
  m.event.u64(11, tu);
  m.event.u64(10, m.intern(m.names, 2, s.name));
  for (const TraceArg& a : s.args) {
    // The disassembly is unique per instruction (nothing to intern): the protobuf trace leaves it out
    // (`nsim disasm` and the --instructions table have it, by index).
    // `opcode` repeats the slice's name.
    if (a.kind == TraceArg::Kind::kText && (std::strcmp(a.key, "instr") == 0 ||
                                            (std::strcmp(a.key, "opcode") == 0 && a.text == s.name)))
      continue;
    m.ann.clear();
    m.ann.u64(1, m.intern(m.arg_names, 3, a.key));
    if (a.kind == TraceArg::Kind::kInt) m.ann.i64(4, a.i);
    else if (a.kind == TraceArg::Kind::kReal) m.ann.dbl(5, a.d);
    else m.ann.u64(17, m.intern(m.strings, 29, a.text));
    m.event.msg(4, m.ann);
  }
  if (flow) m.event.fixed64(48, static_cast<uint64_t>(s.flow_id));
  m.track_event(ns(s.start));
  m.event.u64(9, 2);
  m.event.u64(11, tu);
  m.track_event(ns(s.start + s.dur));
}

void PerfettoTraceWriter::emit_counter(const std::string& name, Ps t, double value) {
  Impl& m = *impl_;
  auto [it, fresh] = m.counters.try_emplace(name, m.uuid(Impl::kUuidsPerProcess - 1 - m.counters.size()));
  if (fresh) {
    Pb td, counter;
    td.u64(1, it->second);
    td.u64(5, m.process);
    td.str(2, name);
    td.msg(8, counter);
    m.packet.msg(60, td);
    m.flush();
  }
  m.event.u64(9, 4);
  m.event.u64(11, it->second);
  m.event.dbl(44, value);
  m.track_event(ns(t));
}

void PerfettoTraceWriter::emit_summary(Ps at, const std::string& name) {
  // An instant on the process track, with the counts as arguments.
  Impl& m = *impl_;
  m.event.u64(9, 3);
  m.event.u64(11, m.process);
  m.event.str(23, name);
  auto arg = [&](const char* key, int64_t v) {
    m.ann.clear();
    m.ann.u64(1, m.intern(m.arg_names, 3, key));
    m.ann.i64(4, v);
    m.event.msg(4, m.ann);
  };
  arg("slices_written", static_cast<int64_t>(written_));
  arg("slices_dropped", static_cast<int64_t>(slices_dropped()));
  arg("dropped_by_limit", static_cast<int64_t>(dropped_limit_));
  arg("dropped_by_window", static_cast<int64_t>(dropped_window_));
  arg("max_slices", static_cast<int64_t>(filter_.max_slices));
  m.track_event(ns(at));
}

void PerfettoTraceWriter::close() {
  std::fclose(impl_->f);
  impl_->f = nullptr;
}

}  // namespace nsim::sim
