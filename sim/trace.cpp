#include "sim/trace.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <string_view>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "sim/error.h"

namespace nsim::sim {

namespace {
/// Chrome trace timestamps are microseconds; ps precision is kept with fractional values.
/// As a JSON number: an integer when whole (printed without a fraction, and faster).
constexpr Ps kPsPerUs = 1000000;
bool whole_us(Ps t) { return t % kPsPerUs == 0; }
double fractional_us(Ps t) { return static_cast<double>(t) / 1e6; }
Json us(Ps t) {
  if (whole_us(t)) return t / kPsPerUs;
  return fractional_us(t);
}

/// The double x = t / 10^k (t in ps, k = 6: microseconds, fractional_us; k = 3: nanoseconds, ps_to_ns) as the
/// decimal t / 10^k without its trailing zeros, into b[0..24), when that is certainly the text nlohmann's serializer
/// writes for x (the shortest that reads back, by Grisu2, in fixed notation, "0.000123" down to 10^-4: below, an
/// exponent); its length, else 0. For 10^-4 <= x < 10^9, x lies within half an ulp (at most 2^-23) of that decimal
/// d, and any other decimal with no more digits is at least 10^-k away from d: d is the only shortest text that
/// reads back as x. Grisu2 finds the shortest text inside x's rounding interval narrowed by a few units of 2^-64 of
/// x (a few thousandths of an ulp): d is taken when it lies within 3/4 of half an ulp of x (exact integer
/// arithmetic), not for a power of two (its interval is narrower below); nearer the interval's ends the serializer's
/// formatter decides. (Of 10 M random times in us, the direct text differed from the serializer's only for d beyond
/// 0.998 of half an ulp; with this rule, none of 20 M.)
__extension__ typedef __int128 Int128;  // (GCC and Clang; no standard type holds m 10^k or t 2^66)
size_t fixed_decimal(Ps t, int k, char* b) {
  int64_t scale = 1;
  for (int i = 0; i < k; ++i) scale *= 10;
  if (t < std::max<int64_t>(1, scale / 10'000) || t >= 1'000'000'000 * scale || t % scale == 0) return 0;
  const double x = static_cast<double>(t) / static_cast<double>(scale);
  int e = 0;
  const auto m = static_cast<int64_t>(std::ldexp(std::frexp(x, &e), 53));  // x = m 2^(e - 53), exactly
  // (x - d) 10^k 2^(53 - e) = m 10^k - t 2^(53 - e), an integer (e >= -13: under 2^117); an ulp of x is 10^k here
  const Int128 diff = static_cast<Int128>(m) * scale - (static_cast<Int128>(t) << (53 - e));
  if (diff > scale * 3 / 8 || diff < -scale * 3 / 8 || m == int64_t{1} << 52) return 0;
  char* p = std::to_chars(b, b + 24, t / scale).ptr;
  *p++ = '.';
  int64_t frac = t % scale;
  int digits = k;
  for (; frac % 10 == 0; frac /= 10) --digits;
  for (int i = digits - 1; i >= 0; --i, frac /= 10) p[i] = static_cast<char>('0' + frac % 10);
  return static_cast<size_t>(p + digits - b);
}

Json metadata(int tid, const char* name, Json args) {
  return Json{{"ph", "M"}, {"pid", 1}, {"tid", tid}, {"name", name}, {"args", std::move(args)}};
}
}  // namespace

void append_us(std::string& out, Ps t) {
  char b[64];
  if (whole_us(t)) {
    out.append(b, static_cast<size_t>(std::to_chars(b, b + sizeof b, t / kPsPerUs).ptr - b));
  } else if (const size_t n = fixed_decimal(t, 6, b)) {
    out.append(b, n);
  } else {
    out.append(b, static_cast<size_t>(nlohmann::detail::to_chars(b, b + sizeof b, fractional_us(t)) - b));
  }
}

void append_real(std::string& out, double v) {
  if (!std::isfinite(v)) {
    out += "null";
    return;
  }
  char b[64];
  // A time in ns made from ps (ps_to_ns: the slices' *_ns arguments): its decimal directly where certain.
  if (v > 0 && v < 1e9) {
    const auto t = static_cast<Ps>(std::llround(v * 1000));
    if (ps_to_ns(t) == v) {
      if (const size_t n = fixed_decimal(t, 3, b)) {
        out.append(b, n);
        return;
      }
    }
  }
  out.append(b, static_cast<size_t>(nlohmann::detail::to_chars(b, b + sizeof b, v) - b));
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

namespace {
/// Whether `v` is printable ASCII without quotes or backslashes: written as it is in a JSON string.
bool plain(std::string_view v) {
  size_t i = 0;
  bool special = false;
#if defined(__SSE2__)
  // 16 bytes at a time (SSE2 is in every x86-64): a signed compare below 0x20 also catches the bytes >= 0x80.
  const __m128i space = _mm_set1_epi8(0x20), del = _mm_set1_epi8(0x7f), quote = _mm_set1_epi8('"'),
                backslash = _mm_set1_epi8('\\');
  for (; i + 16 <= v.size(); i += 16) {
    const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(v.data() + i));
    const __m128i bad = _mm_or_si128(_mm_or_si128(_mm_cmplt_epi8(x, space), _mm_cmpeq_epi8(x, del)),
                                     _mm_or_si128(_mm_cmpeq_epi8(x, quote), _mm_cmpeq_epi8(x, backslash)));
    special |= _mm_movemask_epi8(bad) != 0;
  }
#endif
  static const std::array<bool, 256> kSpecial = [] {
    std::array<bool, 256> t{};
    for (int c = 0; c < 256; ++c) t[static_cast<size_t>(c)] = c < 0x20 || c >= 0x7f || c == '"' || c == '\\';
    return t;
  }();
  for (; i < v.size(); ++i) special |= kSpecial[static_cast<unsigned char>(v[i])];
  return !special;
}
}  // namespace

/// One nlohmann serializer for every event of the trace, writing straight into the file. (Json::dump()
/// would build a serializer, its 512-byte indent string and a result string per call: for millions of
/// events that is most of the trace's cost.)
struct ChromeTraceWriter::EventOut {
  std::string text;  ///< one serialized event (capacity reused), written with one fwrite
  nlohmann::detail::serializer<Json> serializer{nlohmann::detail::output_adapter<char>(text), ' ',
                                                Json::error_handler_t::replace};

  // The events that come once per slice, flow arrow or counter sample are written by hand, as the serializer
  // writes them (compact, members in order, the same numbers and escapes): the serializer checks every byte of
  // every string for UTF-8 and escapes, ~70 % of a JSON trace's cost. Strings of printable ASCII without
  // quotes or backslashes (nearly all) are copied; any other goes through the serializer.
  void str(std::string_view v) {
    if (!plain(v)) {
      serializer.dump(Json(std::string(v)), false, false, 0);
      return;
    }
    text += '"';
    text.append(v.data(), v.size());
    text += '"';
  }
  void integer(int64_t v) {
    char b[24];
    text.append(b, static_cast<size_t>(std::to_chars(b, b + sizeof b, v).ptr - b));
  }
  /// A double as the serializer writes one (non-finite: null; the shortest text that reads back, its to_chars).
  void real(double v) { append_real(text, v); }
  /// As json_number(v) writes it.
  void number(double v) {
    if (json_integral(v)) integer(static_cast<int64_t>(v));
    else real(v);
  }
  /// As us(t) writes it.
  void time(Ps t) { append_us(text, t); }
  /// `open` (the event's first members), then "tid" and "ts".
  void head(const char* open, int tid, Ps ts) {
    text += open;
    key("tid");
    integer(tid);
    key("ts");
    time(ts);
  }
  /// `,"key":` (`key` a plain literal).
  void key(const char* k) {
    text += ",\"";
    text += k;
    text += "\":";
  }
};

ChromeTraceWriter::ChromeTraceWriter(const std::string& path, std::string process_name, TraceFilter filter)
    : OrderedTraceSink(filter) {
  f_ = std::fopen(path.c_str(), "w");
  if (!f_) throw Error(ErrorCode::kCannotWrite, fmt::format("cannot open trace file '{}' for writing", path));
  // The frame around the streamed events; each event is a JSON object of its own (emit()).
  out_ = std::make_unique<EventOut>();
  std::fputs("{\"displayTimeUnit\": \"ns\", \"traceEvents\": [", f_);
  emit(metadata(0, "process_name", Json{{"name", std::move(process_name)}}));
}

void ChromeTraceWriter::emit(const Json& event) {
  begin_event();
  out_->serializer.dump(event, false, false, 0);
  end_event();
}

void ChromeTraceWriter::begin_event() { out_->text.assign(first_ ? "\n" : ",\n"); }

void ChromeTraceWriter::end_event() {
  std::fwrite(out_->text.data(), 1, out_->text.size(), f_);
  first_ = false;
}

ChromeTraceWriter::~ChromeTraceWriter() {
  if (!finished_) finish();
}

void ChromeTraceWriter::emit_track(int track, const std::string& name) {
  emit(metadata(track, "thread_name", Json{{"name", name}}));
  emit(metadata(track, "thread_sort_index", Json{{"sort_index", track}}));
}

bool OrderedTraceSink::drops(Ps start, Ps dur) {
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

void OrderedTraceSink::slice(TraceSlice s) {
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

void OrderedTraceSink::write_earliest(size_t n) {
  for (; n > 0 && !order_.empty(); --n) {
    uint32_t idx = order_.pop().payload;
    if (pending_[idx].start < last_written_start_) ++out_of_order_;
    last_written_start_ = std::max(last_written_start_, pending_[idx].start);
    write(pending_[idx]);
    pending_[idx] = TraceSlice{};
    free_.push_back(idx);
  }
}

void OrderedTraceSink::watermark(Ps t) {
  while (!order_.empty() && order_.top().time < t) write_earliest(1);
}

void OrderedTraceSink::counter(const std::string& name, Ps t, double value) {
  if (filter_.has_window() && !filter_.in_window(t, 0)) return;
  emit_counter(name, t, value);
}

void ChromeTraceWriter::emit_counter(const std::string& name, Ps t, double value) {
  EventOut& o = *out_;  // {"ph":"C","pid":1,"ts","name","args":{"bytes"}}
  begin_event();
  o.text += "{\"ph\":\"C\",\"pid\":1";
  o.key("ts");
  o.time(t);
  o.key("name");
  o.str(name);
  o.text += ",\"args\":{\"bytes\":";
  o.number(std::round(value));
  o.text += "}}";
  end_event();
}

void OrderedTraceSink::drop_by_limit(Ps start) {
  ++dropped_limit_;
  if (first_dropped_ < 0 || start < first_dropped_) first_dropped_ = start;
}

void OrderedTraceSink::write(const TraceSlice& s) {
  if (limit_reached()) {
    drop_by_limit(s.start);
    return;
  }
  emit_slice(s);
  ++written_;
}

void ChromeTraceWriter::emit_slice(const TraceSlice& s) {
  EventOut& o = *out_;  // {"ph":"X","pid":1,"tid","ts","dur","name","args":{...}}
  begin_event();
  o.head("{\"ph\":\"X\",\"pid\":1", s.track, s.start);
  o.key("dur");
  o.time(s.dur);
  o.key("name");
  o.str(s.name);
  o.text += ",\"args\":{";
  for (size_t i = 0; i < s.args.size(); ++i) {
    const TraceArg& a = s.args[i];
    o.text += i > 0 ? ",\"" : "\"";  // (keys are identifiers: TraceArg)
    o.text += a.key;
    o.text += "\":";
    if (a.kind == TraceArg::Kind::kText) o.str(a.text);
    else if (a.kind == TraceArg::Kind::kInt) o.integer(a.i);
    else o.number(a.d);
  }
  o.text += "}}";
  end_event();
  // Flow arrow from the producer's slice: written already (it starts earlier), unless it started before
  // the window (then it may have been dropped, and the arrow is left out).
  if (s.flow_id >= 0 && (!filter_.has_window() || s.flow_ts >= filter_.window_start)) {
    // {"ph":"s","pid":1,"tid","ts","id","name":"wait","cat":"dependency"}, then "f" with "bp":"e"
    auto flow = [&](const char* open, int track, Ps ts) {
      begin_event();
      o.head(open, track, ts);
      o.key("id");
      o.integer(s.flow_id);
      o.text += ",\"name\":\"wait\",\"cat\":\"dependency\"}";
      end_event();
    };
    flow("{\"ph\":\"s\",\"pid\":1", s.flow_track, s.flow_ts);
    flow("{\"ph\":\"f\",\"bp\":\"e\",\"pid\":1", s.track, s.start);
  }
}

void OrderedTraceSink::finish() {
  if (finished_) return;
  watermark(INT64_MAX);
  if (filter_.active()) {
    // A marker (a global instant event in JSON) at the first slice missing because of the limit, else
    // at the window start.
    const uint64_t dropped = slices_dropped();
    const Ps at = first_dropped_ >= 0 ? first_dropped_ : filter_.window_start;
    emit_summary(at, dropped ? fmt::format("partial trace: {} slices dropped ({} by limit, {} by window)", dropped,
                                           dropped_limit_, dropped_window_)
                             : std::string("trace filter: no slices dropped"));
  }
  close();
  finished_ = true;
}

void ChromeTraceWriter::emit_summary(Ps at, const std::string& name) {
  emit(Json{{"ph", "i"},
            {"s", "g"},
            {"pid", 1},
            {"tid", 0},
            {"ts", us(at)},
            {"name", name},
            {"args",
             {{"slices_written", written_},
              {"slices_dropped", slices_dropped()},
              {"dropped_by_limit", dropped_limit_},
              {"dropped_by_window", dropped_window_},
              {"max_slices", filter_.max_slices},
              {"window_start_ns", static_cast<double>(filter_.window_start) / 1e3},
              {"window_end_ns", filter_.window_end > 0 ? Json(static_cast<double>(filter_.window_end) / 1e3) : Json()}}}});
}

void ChromeTraceWriter::close() {
  std::fputs("\n]}\n", f_);
  out_.reset();
  std::fclose(f_);
  f_ = nullptr;
}

}  // namespace nsim::sim
