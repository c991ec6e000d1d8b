// PerfettoTraceWriter (sim/perfetto_trace.cpp) read back: nsim's inflater (frontend/gzip.h, which
// tests/unit/frontend/test_gzip.cpp checks against gzip's own output) and a protobuf reader undo the compressed packets, the incremental clock, the held-back
// slice ends and the lanes, and every slice must come back on its track with its start and end. Synthetic
// slices exercise what the examples do not: overlaps deeper than two, several compressed chunks, a chunk
// that does not compress (written as plain packets), equal timestamps. (tests/python/test_trace_protobuf.py
// checks real kernels' traces against their JSON traces.)
#include <unistd.h>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "frontend/gzip.h"
#include "sim/trace.h"

namespace {

using nsim::sim::PerfettoTraceWriter;
using nsim::sim::Ps;
using nsim::sim::TraceArg;
using nsim::sim::TraceSlice;
namespace fs = std::filesystem;

// ---- protobuf --------------------------------------------------------------------------------------
struct Field {
  int num = 0, wire = 0;
  uint64_t v = 0;        ///< varint or fixed64
  std::string_view b;    ///< length-delimited
};

uint64_t varint(std::string_view s, size_t& i) {
  uint64_t v = 0;
  for (int shift = 0;; shift += 7) {
    if (i >= s.size() || shift > 63) throw std::runtime_error("bad varint");
    const auto c = static_cast<unsigned char>(s[i++]);
    v |= static_cast<uint64_t>(c & 0x7f) << shift;
    if (!(c & 0x80)) return v;
  }
}

std::vector<Field> fields(std::string_view s) {
  std::vector<Field> out;
  for (size_t i = 0; i < s.size();) {
    const uint64_t key = varint(s, i);
    Field f{static_cast<int>(key >> 3), static_cast<int>(key & 7), 0, {}};
    if (f.wire == 0) {
      f.v = varint(s, i);
    } else if (f.wire == 1) {
      if (i + 8 > s.size()) throw std::runtime_error("short fixed64");
      std::memcpy(&f.v, s.data() + i, 8);
      i += 8;
    } else if (f.wire == 2) {
      const uint64_t n = varint(s, i);
      if (n > s.size() - i) throw std::runtime_error("short field");
      f.b = s.substr(i, n);
      i += n;
    } else {
      throw std::runtime_error("unexpected wire type");
    }
    out.push_back(f);
  }
  return out;
}

const Field* find(const std::vector<Field>& fs, int num) {
  for (const Field& f : fs)
    if (f.num == num) return &f;
  return nullptr;
}

/// A slice as read back: (track name, name, start ns, end ns).
using Slice = std::tuple<std::string, std::string, uint64_t, uint64_t>;

struct Decoded {
  std::vector<Slice> slices;
  int compressed_chunks = 0;
  int plain_packets = 0;  ///< packets outside compressed_packets
};

/// Reads a .pftrace as trace_processor does: packets (compressed ones inflated), each sequence's interned
/// names and incremental clock, then the events in time order with a stack of open slices per track.
Decoded decode(const std::string& data) {
  Decoded d;
  std::vector<std::string> inflated;  // keeps the string_views into unpacked chunks valid
  std::vector<std::string_view> packets;
  for (const Field& f : fields(data)) {
    REQUIRE(f.num == 1);
    const auto fs = fields(f.b);
    if (const Field* z = find(fs, 50)) {
      ++d.compressed_chunks;
      inflated.push_back(nsim::frontend::zlib_inflate(z->b, "compressed_packets"));
      for (const Field& g : fields(inflated.back())) packets.push_back(g.b);
    } else {
      ++d.plain_packets;
      packets.push_back(f.b);
    }
  }
  std::map<uint64_t, std::string> track_name;
  std::map<uint64_t, uint64_t> clock;                      // sequence -> incremental clock value
  std::map<std::pair<uint64_t, uint64_t>, std::string> names;  // (sequence, iid) -> event name
  struct Event {
    uint64_t t, order;
    int type;
    uint64_t track;
    std::string name;
  };
  std::vector<Event> events;
  for (std::string_view p : packets) {
    const auto fs = fields(p);
    const uint64_t seq = find(fs, 10)->v;
    if (const Field* snap = find(fs, 6)) {  // the sequence's clock snapshot: clock 64 is 0 at BOOTTIME 0
      for (const Field& c : fields(snap->b)) {
        const auto cf = fields(c.b);
        if (find(cf, 1)->v == 64) {
          REQUIRE(find(cf, 3) != nullptr);  // incremental
          clock[seq] = find(cf, 2)->v;
        }
      }
    }
    if (const Field* in = find(fs, 12))
      for (const Field& e : fields(in->b))
        if (e.num == 2) names[{seq, find(fields(e.b), 1)->v}] = std::string(find(fields(e.b), 2)->b);
    if (const Field* td = find(fs, 60)) {
      const auto tf = fields(td->b);
      std::string name(find(tf, 2) ? find(tf, 2)->b : std::string_view());
      if (const Field* th = find(tf, 4)) name = std::string(find(fields(th->b), 5)->b);
      track_name[find(tf, 1)->v] = name;
    }
    if (const Field* te = find(fs, 11)) {
      const auto ef = fields(te->b);
      uint64_t t = find(fs, 8)->v;
      if (const Field* c = find(fs, 58)) REQUIRE(c->v == 6);  // an absolute time on BOOTTIME
      else t = clock.at(seq) += t;                            // a delta on the sequence's clock
      const Field* name = find(ef, 10);
      events.push_back({t, events.size(), static_cast<int>(find(ef, 9)->v), find(ef, 11)->v,
                        name ? names.at({seq, name->v}) : std::string()});
    }
  }
  std::stable_sort(events.begin(), events.end(), [](const Event& a, const Event& b) { return a.t < b.t; });
  std::map<uint64_t, std::vector<std::pair<std::string, uint64_t>>> open;  // track -> stack of (name, start)
  for (const Event& e : events) {
    if (e.type == 1) {
      open[e.track].push_back({e.name, e.t});
    } else if (e.type == 2) {
      REQUIRE(!open[e.track].empty());
      d.slices.emplace_back(track_name.at(e.track), open[e.track].back().first, open[e.track].back().second, e.t);
      open[e.track].pop_back();
    }
  }
  for (const auto& [track, stack] : open) REQUIRE(stack.empty());
  std::sort(d.slices.begin(), d.slices.end());
  return d;
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct TempTrace {
  fs::path path;
  TempTrace() {
    static int counter = 0;
    path = fs::temp_directory_path() /
           ("nsim_test_pf_" + std::to_string(::getpid()) + "_" + std::to_string(counter++) + ".pftrace");
  }
  ~TempTrace() {
    std::error_code ec;
    fs::remove(path, ec);
  }
};

uint64_t ns(Ps t) { return static_cast<uint64_t>((t + 500) / 1000); }

}  // namespace

TEST_CASE("PerfettoTraceWriter: overlapping slices over several compressed chunks read back exactly", "[sim][trace]") {
  // 3 tracks, 30000 slices whose starts and lengths are random, so up to ~6 overlap on a track (lanes),
  // many share a start; arguments give ~1 MB of packets (several 256 KiB chunks). Compressed in place and on the
  // writer's own thread (compress_beside(): each chunk compressed and written while the next is encoded): the same
  // bytes.
  std::string files[2];
  for (const bool beside : {false, true}) {
    TempTrace tmp;
    std::mt19937_64 rng(7);
    std::vector<Slice> want;
    {
      PerfettoTraceWriter w(tmp.path.string(), "NeuronCore (test)");
      if (beside) w.compress_beside();
      const char* track_names[3] = {"vector", "scalar", "dma.e0"};
      for (int k = 0; k < 3; ++k) w.declare_track(k, track_names[k]);
      Ps t = 0;
      for (int i = 0; i < 30000; ++i) {
        t += static_cast<Ps>(rng() % 4) * 250;  // ps; equal starts are common
        const int track = static_cast<int>(rng() % 3);
        const Ps dur = static_cast<Ps>(rng() % 3000);
        TraceSlice s{track, t, dur, "op" + std::to_string(rng() % 5), {}};
        s.args.push_back(TraceArg::integer("index", i));
        s.args.push_back(TraceArg::real("ready_ns", static_cast<double>(t) / 1000));
        s.args.push_back(TraceArg::string("src", "k.py:" + std::to_string(rng() % 40)));
        want.emplace_back(track_names[track], s.name, ns(t), ns(t + dur));
        w.slice(std::move(s));
        if (i % 64 == 0) w.watermark(t);
        if (i % 16 == 0) w.counter("sbuf bytes/partition in use", t, static_cast<double>(i));
      }
    }
    std::sort(want.begin(), want.end());
    files[beside] = read_file(tmp.path);
    const Decoded d = decode(files[beside]);
    CHECK(d.compressed_chunks >= 3);
    CHECK(d.slices == want);
  }
  CHECK(files[0] == files[1]);
}

TEST_CASE("PerfettoTraceWriter: packets that do not compress are written as they are", "[sim][trace]") {
  // Arguments of 30000 random bytes (each string new, so interned once: nothing repeats) make a chunk
  // that DEFLATE cannot shrink: its Huffman tables cost more than the packets' few framing bytes save.
  for (const bool beside : {false, true}) {
    INFO("compressed beside: " << beside);
    TempTrace tmp;
    std::mt19937_64 rng(11);
    std::vector<Slice> want;
    {
      PerfettoTraceWriter w(tmp.path.string(), "NeuronCore (test)");
      if (beside) w.compress_beside();
      w.declare_track(0, "vector");
      for (int i = 0; i < 3; ++i) {
        std::string noise(30000, '\0');
        for (char& c : noise) c = static_cast<char>(rng());
        TraceSlice s{0, Ps{1000} * i, 500, "op", {TraceArg::string("src", noise)}};
        want.emplace_back("vector", "op", ns(s.start), ns(s.start + s.dur));
        w.slice(std::move(s));
      }
    }
    const Decoded d = decode(read_file(tmp.path));
    CHECK(d.compressed_chunks == 0);
    CHECK(d.plain_packets == 3 + 3 * 2);  // clock, process, track; a begin and an end per slice
    CHECK(d.slices == want);
  }
}

TEST_CASE("PerfettoTraceWriter: a trace with no slices reads back", "[sim][trace]") {
  // Its few packets (clock, process and track descriptors) are smaller than a zlib stream of them.
  TempTrace tmp;
  {
    PerfettoTraceWriter w(tmp.path.string(), "NeuronCore (test)");
    w.declare_track(0, "vector");
  }
  const Decoded d = decode(read_file(tmp.path));
  CHECK(d.slices.empty());
  CHECK(d.compressed_chunks == 0);
  CHECK(d.plain_packets == 3);
}

TEST_CASE("PerfettoTraceWriter: each slice's arguments read back, in events and packets of every length", "[sim][trace]") {
  // Messages are written in place with a one-byte length that is widened once the message is 128 bytes or more
  // (PerfettoTraceWriter: Pb::open / close). Slices with no argument, a few, 24 (an event over 128 bytes), a long
  // string (interned: its packet over 128 bytes) and a 20,000-byte one (a three-byte length): every argument must
  // come back with its name and value, every slice with its times.
  for (const bool beside : {false, true}) {
    INFO("compressed beside: " << beside);
    TempTrace tmp;
    using Args = std::vector<std::pair<std::string, std::string>>;  // (name, value as text)
    std::vector<std::pair<uint64_t, Args>> want;                    // (start ns, args)
    {
      PerfettoTraceWriter w(tmp.path.string(), "NeuronCore (test)");
      if (beside) w.compress_beside();
      w.declare_track(0, "vector");
      static const char* kKeys[24] = {"a0", "a1", "a2", "a3", "a4", "a5", "a6", "a7", "a8", "a9", "a10", "a11",
                                      "a12", "a13", "a14", "a15", "a16", "a17", "a18", "a19", "a20", "a21", "a22", "a23"};
      for (int i = 0; i < 40; ++i) {
        TraceSlice s{0, Ps{1'000'000} * i, 500'000, "op", {}};
        Args a;
        const int kind = i % 5;
        if (kind == 1) {
          s.args.push_back(TraceArg::integer("index", -i));
          s.args.push_back(TraceArg::real("ready_ns", 0.5 * i));
          s.args.push_back(TraceArg::string("src", "k.py:" + std::to_string(i)));
          a = {{"index", std::to_string(-i)}, {"ready_ns", std::to_string(0.5 * i)}, {"src", "k.py:" + std::to_string(i)}};
        } else if (kind == 2) {
          for (int k = 0; k < 24; ++k) {
            s.args.push_back(TraceArg::integer(kKeys[k], int64_t{1} << (2 * k + i % 3)));
            a.push_back({kKeys[k], std::to_string(int64_t{1} << (2 * k + i % 3))});
          }
        } else if (kind == 3 || kind == 4) {
          const std::string text(kind == 3 ? 200 + i : 20'000 + i, static_cast<char>('a' + i % 26));
          s.args.push_back(TraceArg::string("src", text));
          a = {{"src", text}};
        }
        want.push_back({ns(s.start), a});
        w.slice(std::move(s));
      }
    }
    // The begin events' annotations, resolved through each sequence's interned names and strings.
    const std::string data = read_file(tmp.path);
    std::vector<std::string> inflated;
    std::vector<std::string_view> packets;
    for (const Field& f : fields(data)) {
      const auto fs = fields(f.b);
      if (const Field* z = find(fs, 50)) {
        inflated.push_back(nsim::frontend::zlib_inflate(z->b, "compressed_packets"));
        for (const Field& g : fields(inflated.back())) packets.push_back(g.b);
      } else {
        packets.push_back(f.b);
      }
    }
    std::map<uint64_t, std::string> arg_names, strings;
    std::vector<std::pair<uint64_t, Args>> got;
    uint64_t clock = 0;
    for (std::string_view p : packets) {
      const auto fs = fields(p);
      if (const Field* in = find(fs, 12))
        for (const Field& e : fields(in->b)) {
          const auto ef = fields(e.b);
          if (e.num == 3) arg_names[find(ef, 1)->v] = std::string(find(ef, 2)->b);
          if (e.num == 29) strings[find(ef, 1)->v] = std::string(find(ef, 2)->b);
        }
      const Field* te = find(fs, 11);
      if (!te || find(fs, 58)) continue;  // (every event here is on the incremental clock)
      clock += find(fs, 8)->v;
      const auto ef = fields(te->b);
      if (find(ef, 9)->v != 1) continue;  // slice begins only
      Args a;
      for (const Field& an : ef) {
        if (an.num != 4) continue;
        const auto af = fields(an.b);
        const std::string name = arg_names.at(find(af, 1)->v);
        if (const Field* x = find(af, 4)) a.push_back({name, std::to_string(static_cast<int64_t>(x->v))});
        if (const Field* x = find(af, 5)) {
          double d;
          std::memcpy(&d, &x->v, sizeof d);
          a.push_back({name, std::to_string(d)});
        }
        if (const Field* x = find(af, 17)) a.push_back({name, strings.at(x->v)});
      }
      got.push_back({clock, a});
    }
    CHECK(got == want);
  }
}
