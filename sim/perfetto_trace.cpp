// PerfettoTraceWriter: Perfetto's protobuf trace format (perfetto/protos/perfetto/trace/trace.proto),
// encoded by hand (no protobuf library): a Trace is a sequence of `packet` (field 1) TracePackets.
// Field numbers used (TracePacket / TrackEvent / TrackDescriptor / DebugAnnotation / InternedData):
//   TracePacket: clock_snapshot 6, timestamp 8, trusted_packet_sequence_id 10, track_event 11,
//                interned_data 12, sequence_flags 13 (1 = incremental state cleared, 2 = needs incremental
//                state), compressed_packets 50 (a zlib stream of packets), timestamp_clock_id 58,
//                trace_packet_defaults 59 {timestamp_clock_id 58}, track_descriptor 60
//   ClockSnapshot: clocks 1 {clock_id 1, timestamp 2, is_incremental 3, unit_multiplier_ns 4};
//                BUILTIN_CLOCK_BOOTTIME = 6 (the
//                trace's clock); 64-127: clocks of one packet sequence
//   TrackDescriptor: uuid 1, name 2, process 3 {pid 1, process_name 6}, thread 4 {pid 1, tid 2,
//                thread_name 5}, parent_uuid 5, counter 8 {}
//   TrackEvent: debug_annotations 4, type 9 (1 begin, 2 end, 3 instant, 4 counter), name_iid 10,
//                track_uuid 11, name 23, double_counter_value 44, flow_ids 47, terminating_flow_ids 48
//   DebugAnnotation: name_iid 1, int_value 4, double_value 5, string_value_iid 17
//   InternedData: event_names 2 {iid 1, name 2}, debug_annotation_names 3 {iid 1, name 2},
//                debug_annotation_string_values 29 {iid 1, str 2}
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>
#include <queue>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "sim/error.h"
#include "sim/trace.h"

namespace nsim::sim {

namespace {

/// A protobuf message being encoded: bytes [0, n) of `buf`, which grows (zero-filled) by doubling. Each field is
/// written through a pointer into room made for it once (a std::string's push_back per byte checked its capacity
/// and wrote its terminator at every byte: ~15 % of the CPU instructions of a trace of every slice).
struct Pb {
  std::vector<char> buf;
  size_t n = 0;
  /// Room for `k` more bytes: where they go. (The fields' writers are inlined into the trace's emitters; growing
  /// is not.)
  [[gnu::always_inline]] char* room(size_t k) {
    if (__builtin_expect(buf.size() - n < k, 0)) grow(k);
    return buf.data() + n;
  }
  [[gnu::noinline]] void grow(size_t k) { buf.resize(std::max(2 * buf.size(), n + k + 64)); }
  /// `v` as a varint into x[0..10); its length.
  [[gnu::always_inline]] static size_t encode(uint64_t v, char* x) {
    if (v < 0x80) {  // (tags and most values)
      x[0] = static_cast<char>(v);
      return 1;
    }
    size_t k = 0;
    while (v >= 0x80) {
      x[k++] = static_cast<char>((v & 0x7f) | 0x80);
      v >>= 7;
    }
    x[k++] = static_cast<char>(v);
    return k;
  }
  static uint64_t key(int field, int wire) { return (static_cast<uint64_t>(field) << 3) | static_cast<uint64_t>(wire); }
  void varint(uint64_t v) { n += encode(v, room(10)); }
  void tag(int field, int wire) { varint(key(field, wire)); }
  [[gnu::always_inline]] void u64(int f, uint64_t v) {
    char* x = room(20);
    const size_t k = encode(key(f, 0), x);
    n += k + encode(v, x + k);
  }
  void i64(int f, int64_t v) { u64(f, static_cast<uint64_t>(v)); }
  void fixed64(int f, uint64_t v) {
    char* x = room(18);
    const size_t k = encode(key(f, 1), x);
    std::memcpy(x + k, &v, 8);  // little-endian hosts only (x86-64, aarch64)
    n += k + 8;
  }
  void dbl(int f, double v) {
    uint64_t u;
    std::memcpy(&u, &v, 8);
    fixed64(f, u);
  }
  void str(int f, std::string_view s) {
    char* x = room(20 + s.size());
    size_t k = encode(key(f, 2), x);
    k += encode(s.size(), x + k);
    if (!s.empty()) std::memcpy(x + k, s.data(), s.size());  // (an empty message's view may be null)
    n += k + s.size();
  }
  void msg(int f, const Pb& m) { str(f, m.view()); }
  void append(std::string_view s) {
    if (s.empty()) return;
    std::memcpy(room(s.size()), s.data(), s.size());
    n += s.size();
  }
  /// A message field `f` written in place, as msg(f, m) writes it: open() writes its tag and reserves one byte for its
  /// length and returns where its content starts; close() writes the length there once the content is written
  /// (moving the content when the length takes more than one byte: a message of 128 bytes or more, rare here).
  size_t open(int f) {
    tag(f, 2);
    *room(1) = 0;
    return ++n;
  }
  void close(size_t start) {
    const size_t len = n - start;
    if (len < 0x80) {
      buf[start - 1] = static_cast<char>(len);
      return;
    }
    char x[10];
    const size_t k = encode(len, x);
    room(k - 1);
    std::memmove(buf.data() + start + k - 1, buf.data() + start, len);
    std::memcpy(buf.data() + start - 1, x, k);
    n += k - 1;
  }
  std::string_view view() const { return {buf.data(), n}; }
  size_t size() const { return n; }
  bool empty() const { return n == 0; }
  void clear() { n = 0; }
  void swap(Pb& o) {
    buf.swap(o.buf);
    std::swap(n, o.n);
  }
};

// ---------------------------------------------------------------------------------------------------
// zlib stream (RFC 1950) of DEFLATE (RFC 1951): LZ77 over hash chains with one-step lazy matching, one
// block of dynamic Huffman codes per kBlockSymbols symbols. Perfetto's `compressed_packets` holds such a
// stream (what its tracing service writes with compression_type DEFLATE); written by hand, as the
// rest of the format is, so nsim links no compression library.

class BitWriter {
 public:
  explicit BitWriter(std::string& out) : out_(out) {}
  /// `len` (<= 32) bits of `bits`, least significant first (DEFLATE's order).
  void put(uint32_t bits, int len) {
    acc_ |= static_cast<uint64_t>(bits) << n_;
    n_ += len;
    while (n_ >= 8) {
      out_.push_back(static_cast<char>(acc_ & 0xff));
      acc_ >>= 8;
      n_ -= 8;
    }
  }
  void align() {
    if (n_ > 0) put(0, 8 - n_);
  }

 private:
  std::string& out_;
  uint64_t acc_ = 0;
  int n_ = 0;
};

/// Code lengths (at most `max_len`) of a Huffman code for the symbol frequencies `freq` (0: unused).
/// At least two symbols get a code, so the code is complete (zlib's inflate rejects incomplete ones).
/// A code too deep is rebuilt from halved frequencies until it fits.
std::vector<uint8_t> huffman_lengths(std::vector<uint32_t> freq, int max_len) {
  int used = 0;
  for (uint32_t f : freq) used += f > 0;
  for (size_t i = 0; used < 2 && i < freq.size(); ++i)
    if (freq[i] == 0) {
      freq[i] = 1;
      ++used;
    }
  std::vector<uint8_t> len(freq.size(), 0);
  struct Node {
    uint64_t w;
    int left, right;  // children (node indices); a leaf: left = -1, right = its symbol
  };
  for (;;) {
    std::vector<Node> nodes;
    using Item = std::pair<uint64_t, int>;  // (weight, node): ties by node index, so deterministic
    std::priority_queue<Item, std::vector<Item>, std::greater<>> q;
    for (size_t i = 0; i < freq.size(); ++i)
      if (freq[i] > 0) {
        q.push({freq[i], static_cast<int>(nodes.size())});
        nodes.push_back({freq[i], -1, static_cast<int>(i)});
      }
    while (q.size() > 1) {
      const Item a = q.top();
      q.pop();
      const Item b = q.top();
      q.pop();
      q.push({a.first + b.first, static_cast<int>(nodes.size())});
      nodes.push_back({a.first + b.first, a.second, b.second});
    }
    int deepest = 0;
    std::vector<std::pair<int, int>> stack{{static_cast<int>(nodes.size()) - 1, 0}};  // (node, depth)
    while (!stack.empty()) {
      const auto [n, d] = stack.back();
      stack.pop_back();
      if (nodes[static_cast<size_t>(n)].left < 0) {
        len[static_cast<size_t>(nodes[static_cast<size_t>(n)].right)] = static_cast<uint8_t>(d);
        deepest = std::max(deepest, d);
      } else {
        stack.push_back({nodes[static_cast<size_t>(n)].left, d + 1});
        stack.push_back({nodes[static_cast<size_t>(n)].right, d + 1});
      }
    }
    if (deepest <= max_len) return len;
    for (uint32_t& f : freq)
      if (f > 0) f = (f + 1) / 2;
  }
}

/// Canonical codes for `len` (RFC 1951 3.2.2), bit-reversed: BitWriter sends the least significant bit
/// first, Huffman codes go most significant bit first.
std::vector<uint16_t> canonical_codes(const std::vector<uint8_t>& len) {
  int count[16] = {}, next[16] = {};
  for (uint8_t l : len) ++count[l];
  count[0] = 0;
  for (int bits = 1, code = 0; bits < 16; ++bits) {
    code = (code + count[bits - 1]) << 1;
    next[bits] = code;
  }
  std::vector<uint16_t> codes(len.size(), 0);
  for (size_t i = 0; i < len.size(); ++i) {
    if (len[i] == 0) continue;
    uint32_t c = static_cast<uint32_t>(next[len[i]]++), r = 0;
    for (int b = 0; b < len[i]; ++b, c >>= 1) r = (r << 1) | (c & 1);
    codes[i] = static_cast<uint16_t>(r);
  }
  return codes;
}

/// The DEFLATE tables: base value and extra bits of length codes 257..285 and distance codes 0..29.
constexpr uint16_t kLenBase[29] = {3,  4,  5,  6,  7,  8,  9,  10, 11,  13,  15,  17,  19,  23, 27,
                                   31, 35, 43, 51, 59, 67, 83, 99, 115, 131, 163, 195, 227, 258};
constexpr uint8_t kLenExtra[29] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0};
constexpr uint16_t kDistBase[30] = {1,   2,   3,   4,   5,   7,    9,    13,   17,   25,   33,   49,   65,    97,    129,
                                    193, 257, 385, 513, 769, 1025, 1537, 2049, 3073, 4097, 6145, 8193, 12289, 16385, 24577};
constexpr uint8_t kDistExtra[30] = {0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13};
/// DEFLATE's longest match.
constexpr int kMaxMatchLength = 258;
/// The order code-length code lengths are sent in.
constexpr uint8_t kClOrder[19] = {16, 17, 18, 0, 8, 7, 9, 6, 10, 5, 11, 4, 12, 3, 13, 2, 14, 1, 15};

/// Index of the last entry of `base` that is <= v.
template <size_t N>
constexpr int code_of(const uint16_t (&base)[N], uint32_t v) {
  return static_cast<int>(std::upper_bound(base, base + N, v) - base) - 1;
}

/// code_of as tables (two lookups per match instead of two binary searches): the length code of each length
/// 3..258, and the distance code of distance d by d - 1 below 256, else by 256 + ((d - 1) >> 7) (every distance
/// code above 256 starts at 1 + a multiple of 128: zlib's _dist_code). Built by the compiler: a table made at
/// start-up cost every process that loads nsim ~2.5 M CPU instructions (a binary search per distance).
struct CodeTables {
  uint8_t len[kMaxMatchLength + 1] = {};
  uint8_t dist[512] = {};
  constexpr CodeTables() {
    for (int l = 3; l <= kMaxMatchLength; ++l) len[l] = static_cast<uint8_t>(code_of(kLenBase, static_cast<uint32_t>(l)));
    for (uint32_t d = 1; d <= 32768; ++d)
      dist[d <= 256 ? d - 1 : 256 + ((d - 1) >> 7)] = static_cast<uint8_t>(code_of(kDistBase, d));
  }
  constexpr int len_code(uint32_t l) const { return len[l]; }
  constexpr int dist_code(uint32_t d) const { return dist[d <= 256 ? d - 1 : 256 + ((d - 1) >> 7)]; }
};
constexpr CodeTables kCodes;
static_assert(kCodes.len_code(3) == 0 && kCodes.len_code(258) == 28 && kCodes.dist_code(1) == 0 &&
              kCodes.dist_code(257) == 16 && kCodes.dist_code(24577) == 29 && kCodes.dist_code(32768) == 29);

class Deflater {
 public:
  /// `in` as a zlib stream, appended to `out`.
  void compress(std::string_view in, std::string& out) {
    out.push_back(static_cast<char>(0x78));  // CMF: deflate, 32 KiB window
    out.push_back(static_cast<char>(0x9c));  // FLG: (CMF * 256 + FLG) % 31 == 0
    BitWriter bw(out);
    parse(in);
    for (size_t i = 0; i < syms_.size() || i == 0; i += kBlockSymbols) {
      const size_t end = std::min(syms_.size(), i + kBlockSymbols);
      block(bw, i, end, end == syms_.size());
    }
    bw.align();
    uint32_t a = 1, b = 0;  // Adler-32, big-endian: sums reduced every 5552 bytes (zlib's NMAX: b stays below 2^32)
    for (size_t i = 0; i < in.size();) {
      for (const size_t end = std::min(in.size(), i + 5552); i < end; ++i) {
        a += static_cast<unsigned char>(in[i]);
        b += a;
      }
      a %= 65521;
      b %= 65521;
    }
    const uint32_t adler = (b << 16) | a;
    for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<char>((adler >> s) & 0xff));
  }

 private:
  static constexpr int kWindow = 32768, kMinMatch = 3, kMaxMatch = kMaxMatchLength;
  /// Search effort (between zlib's levels 5 and 6): links followed, lengths that end the search or skip the
  /// lazy look (32 links: files 1-3% larger than with 64, a sixth fewer instructions compressing).
  static constexpr int kHashBits = 15, kMaxChain = 32, kNiceMatch = 128, kMaxLazy = 32, kGoodMatch = 16;
  static constexpr size_t kBlockSymbols = 1 << 15;
  struct Sym {
    uint16_t len;   ///< 0: a literal
    uint16_t val;   ///< the literal, or the distance
  };
  std::vector<Sym> syms_;
  std::vector<int32_t> head_, prev_;

  static uint32_t hash(const unsigned char* p) {
    return ((static_cast<uint32_t>(p[0]) << 10) ^ (static_cast<uint32_t>(p[1]) << 5) ^ p[2]) & ((1u << kHashBits) - 1);
  }
  /// The longest earlier match of the bytes at `i` in the window, following at most `chain` links:
  /// (length, distance); length 0 if none.
  std::pair<int, int> longest(const unsigned char* s, size_t n, size_t i, int chain) const {
    int best = 0, dist = 0;
    if (i + kMinMatch > n) return {0, 0};
    const int limit = static_cast<int>(std::min<size_t>(kMaxMatch, n - i));
    for (int32_t j = head_[hash(s + i)]; j >= 0 && chain-- > 0; j = prev_[static_cast<size_t>(j)]) {
      if (i - static_cast<size_t>(j) > kWindow) break;
      const unsigned char* a = s + i;
      const unsigned char* b = s + j;
      if (b[best] != a[best] || b[0] != a[0]) continue;
      int l = 0;
      while (l + 8 <= limit) {  // 8 bytes at a time
        uint64_t x, y;
        std::memcpy(&x, a + l, 8);
        std::memcpy(&y, b + l, 8);
        if (x != y) {
          l += __builtin_ctzll(x ^ y) / 8;  // little-endian: the first differing byte
          goto measured;
        }
        l += 8;
      }
      while (l < limit && a[l] == b[l]) ++l;
    measured:
      if (l > best) {
        best = l;
        dist = static_cast<int>(i - static_cast<size_t>(j));
        if (l >= kNiceMatch || l == limit) break;
      }
    }
    return best >= kMinMatch ? std::pair<int, int>{best, dist} : std::pair<int, int>{0, 0};
  }
  void insert(const unsigned char* s, size_t n, size_t i) {
    if (i + kMinMatch > n) return;
    const uint32_t h = hash(s + i);
    prev_[i] = head_[h];
    head_[h] = static_cast<int32_t>(i);
  }
  /// LZ77: `in` as literals and (length, distance) pairs.
  void parse(std::string_view in) {
    const auto* s = reinterpret_cast<const unsigned char*>(in.data());
    const size_t n = in.size();
    syms_.clear();
    head_.assign(size_t{1} << kHashBits, -1);
    prev_.assign(n, -1);
    size_t i = 0;
    std::pair<int, int> next{-1, 0};  // the match at i when already found (by the lazy look ahead)
    while (i < n) {
      const auto [len, dist] = next.first >= 0 ? next : longest(s, n, i, kMaxChain);
      next = {-1, 0};
      insert(s, n, i);
      // Lazy: a longer match one byte on wins over this one (the byte goes as a literal); a long
      // enough match is taken as it is, and a good one shortens the search.
      if (len > 0 && len < kMaxLazy) {
        next = longest(s, n, i + 1, len >= kGoodMatch ? kMaxChain / 4 : kMaxChain);
        if (next.first <= len) next = {-1, 0};
      }
      if (len == 0 || next.first >= 0) {
        syms_.push_back({0, s[i]});
        ++i;
        continue;
      }
      syms_.push_back({static_cast<uint16_t>(len), static_cast<uint16_t>(dist)});
      for (size_t k = i + 1; k < i + static_cast<size_t>(len); ++k) insert(s, n, k);
      i += static_cast<size_t>(len);
    }
  }
  /// Symbols [from, to) as one block with dynamic Huffman codes.
  void block(BitWriter& bw, size_t from, size_t to, bool last) {
    std::vector<uint32_t> lf(286, 0), df(30, 0);
    for (size_t k = from; k < to; ++k) {
      const Sym& y = syms_[k];
      if (y.len == 0) {
        ++lf[y.val];
      } else {
        ++lf[static_cast<size_t>(257 + kCodes.len_code(y.len))];
        ++df[static_cast<size_t>(kCodes.dist_code(y.val))];
      }
    }
    lf[256] = 1;  // end of block
    const std::vector<uint8_t> ll = huffman_lengths(lf, 15), dl = huffman_lengths(df, 15);
    const std::vector<uint16_t> lc = canonical_codes(ll), dc = canonical_codes(dl);
    size_t hlit = 286, hdist = 30;
    while (hlit > 257 && ll[hlit - 1] == 0) --hlit;
    while (hdist > 1 && dl[hdist - 1] == 0) --hdist;
    // The code lengths, run-length coded: 16 = repeat the previous 3-6 times, 17 = 3-10 zeros, 18 = 11-138 zeros.
    std::vector<uint8_t> lens(ll.begin(), ll.begin() + static_cast<std::ptrdiff_t>(hlit));
    lens.insert(lens.end(), dl.begin(), dl.begin() + static_cast<std::ptrdiff_t>(hdist));
    struct Cl {
      uint8_t sym, extra;
    };
    std::vector<Cl> cls;
    for (size_t i = 0; i < lens.size();) {
      size_t run = 1;
      while (i + run < lens.size() && lens[i + run] == lens[i]) ++run;
      if (lens[i] == 0) {
        for (size_t left = run; left > 0;) {
          if (left >= 11) {
            const size_t r = std::min<size_t>(left, 138);
            cls.push_back({18, static_cast<uint8_t>(r - 11)});
            left -= r;
          } else if (left >= 3) {
            cls.push_back({17, static_cast<uint8_t>(left - 3)});
            left = 0;
          } else {
            cls.push_back({0, 0});
            --left;
          }
        }
      } else {
        cls.push_back({lens[i], 0});
        for (size_t left = run - 1; left > 0;) {
          if (left >= 3) {
            const size_t r = std::min<size_t>(left, 6);
            cls.push_back({16, static_cast<uint8_t>(r - 3)});
            left -= r;
          } else {
            cls.push_back({lens[i], 0});
            --left;
          }
        }
      }
      i += run;
    }
    std::vector<uint32_t> cf(19, 0);
    for (const Cl& c : cls) ++cf[c.sym];
    const std::vector<uint8_t> cl = huffman_lengths(cf, 7);
    const std::vector<uint16_t> cc = canonical_codes(cl);
    size_t hclen = 19;
    while (hclen > 4 && cl[kClOrder[hclen - 1]] == 0) --hclen;
    bw.put(last ? 1 : 0, 1);
    bw.put(2, 2);  // dynamic Huffman codes
    bw.put(static_cast<uint32_t>(hlit - 257), 5);
    bw.put(static_cast<uint32_t>(hdist - 1), 5);
    bw.put(static_cast<uint32_t>(hclen - 4), 4);
    for (size_t k = 0; k < hclen; ++k) bw.put(cl[kClOrder[k]], 3);
    for (const Cl& c : cls) {
      bw.put(cc[c.sym], cl[c.sym]);
      if (c.sym == 16) bw.put(c.extra, 2);
      else if (c.sym == 17) bw.put(c.extra, 3);
      else if (c.sym == 18) bw.put(c.extra, 7);
    }
    for (size_t k = from; k < to; ++k) {
      const Sym& y = syms_[k];
      if (y.len == 0) {
        bw.put(lc[y.val], ll[y.val]);
        continue;
      }
      const int l = kCodes.len_code(y.len), d = kCodes.dist_code(y.val);
      bw.put(lc[static_cast<size_t>(257 + l)], ll[static_cast<size_t>(257 + l)]);
      bw.put(static_cast<uint32_t>(y.len - kLenBase[l]), kLenExtra[l]);
      bw.put(dc[static_cast<size_t>(d)], dl[static_cast<size_t>(d)]);
      bw.put(static_cast<uint32_t>(y.val - kDistBase[d]), kDistExtra[d]);
    }
    bw.put(lc[256], ll[256]);
  }
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
  /// A track and its lanes. Perfetto ends the last slice begun on a track, so slices that overlap
  /// without nesting (pipelined instructions, concurrent transfers on a queue) cannot share one: a slice
  /// goes on the first lane free at its start, lane 0 being the track itself and the others child
  /// tracks of it with the same name, made as needed.
  struct Track {
    uint64_t uuid = 0;
    std::string name;
    std::vector<std::pair<uint64_t, uint64_t>> lanes;  ///< (end of its last slice, ns; uuid)
  };
  std::unordered_map<int, Track> tracks;
  uint64_t lanes_made = 0;
  static constexpr uint64_t kFirstLane = 1024, kMaxLanes = 2048;  ///< lane uuids: uuid(kFirstLane + n)
  /// Lanes of slices not on lane 0, by (track, start): a flow arrow from such a slice starts on its lane.
  /// The last kLaneMemory of them (older producers' arrows start on lane 0).
  struct KeyHash {
    size_t operator()(const std::pair<int, Ps>& k) const {
      return std::hash<uint64_t>{}(static_cast<uint64_t>(k.second) * 31 + static_cast<uint64_t>(k.first));
    }
  };
  std::unordered_map<std::pair<int, Ps>, uint64_t, KeyHash> lane_of;
  std::queue<std::pair<int, Ps>> lane_order;
  static constexpr size_t kLaneMemory = size_t{1} << 16;
  std::unordered_map<std::string, uint64_t> counters;  ///< counter name -> uuid
  InternTable names, arg_names, strings;  ///< interned -> iid
  /// reused: no allocation per packet once warm. `interned`: the interned data of the event being written (empty
  /// between events: intern() is called only between begin_event() and end_event()).
  Pb packet, interned, tmp;
  /// Packets not yet compressed (whole Trace.packet fields); compressed into one packet of
  /// `compressed_packets` when they pass kChunkBytes, and at the end. Track events are written straight into it
  /// (begin_event ... end_event), the rare descriptor packets through `packet` (flush).
  Pb chunk;
  static constexpr size_t kChunkBytes = size_t{256} << 10;
  Deflater deflater;

  /// Timestamps are deltas on an incremental clock of the sequence (kClock: every packet's timestamp is
  /// the time since the previous one's), so most take one byte. A packet earlier than `clock` (a flow
  /// arrow's start, a slice out of order) gives its time on the trace clock (BOOTTIME) instead.
  static constexpr uint64_t kClock = 64, kTraceClock = 6;
  uint64_t clock = 0;  ///< the incremental clock's value: the latest timestamp written, ns
  /// Packets held back until the output reaches their time, so timestamps stay in order: slice ends
  /// (a slice's end is known with its begin) and counter samples (they come ahead of the slices).
  struct Later {
    uint64_t t;      ///< ns
    uint64_t order;  ///< arrival: ties keep it
    uint64_t track;  ///< track uuid
    double value;    ///< a counter's value
    bool counter;
    bool operator>(const Later& o) const { return t != o.t ? t > o.t : order > o.order; }
  };
  std::priority_queue<Later, std::vector<Later>, std::greater<>> later;
  uint64_t arrivals = 0;
  /// Held-back packets at most (then the earliest is written out: memory stays bounded when counter
  /// samples come with no slices, e.g. past --trace-limit).
  static constexpr size_t kMaxLater = size_t{1} << 16;

  /// Track uuids: small numbers (varints of 1-2 bytes on every event), distinct per process (core).
  uint64_t uuid(uint64_t local) const { return static_cast<uint64_t>(pid) * kUuidsPerProcess + local; }
  static constexpr uint64_t kUuidsPerProcess = 4096;
  /// iid of an argument name by the address of its string literal (TraceArg keys are literals, as the JSON writer
  /// also relies on), so most slices hash no argument name; the name's text decides on a miss.
  struct KeyIid {
    const char* key = nullptr;
    uint64_t iid = 0;
  };
  std::array<KeyIid, 64> key_iids{};
  uint64_t intern_key(const char* key) {
    KeyIid& k = key_iids[(reinterpret_cast<uintptr_t>(key) >> 3) % key_iids.size()];
    if (k.key != key) k = {key, intern(arg_names, 3, key)};
    return k.iid;
  }
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
    if (!interned.empty()) packet.msg(12, interned);
    packet.u64(13, first ? 1 : 2);
    chunk.msg(1, packet);
    packet.clear();
    interned.clear();
    if (chunk.size() >= kChunkBytes) compress();
  }
  /// The pending packets as one packet of compressed_packets, written to the file: here, or handed to the
  /// compressing thread (compress_beside()) once it has written the previous chunk.
  void compress() {
    if (chunk.empty()) return;
    if (!beside) {
      write_compressed(chunk.view(), zbuf, zframe);
      chunk.clear();
      return;
    }
    std::unique_lock<std::mutex> lk(mu);
    cv.wait(lk, [&] { return !busy; });
    chunk.swap(handed);  // (the thread emptied `handed`: its capacity comes back for the next chunk)
    busy = true;
    cv.notify_all();
  }
  /// `in` as one packet of compressed_packets (as it is if that is not smaller), appended to the file. Uses only
  /// its arguments, the deflater and the file: the compressing thread's while there is one.
  void write_compressed(std::string_view in, std::string& z, Pb& frame) {
    z.clear();
    deflater.compress(in, z);
    if (z.size() + 16 >= in.size()) {
      std::fwrite(in.data(), 1, in.size(), f);
      return;
    }
    frame.clear();
    frame.tag(1, 2);
    Pb len;
    len.tag(50, 2);
    len.varint(z.size());
    frame.varint(len.size() + z.size());
    frame.append(len.view());
    std::fwrite(frame.buf.data(), 1, frame.size(), f);
    std::fwrite(z.data(), 1, z.size(), f);
  }
  std::string zbuf;
  Pb zframe;  ///< write_compressed's buffers (the compressing thread's while there is one)

  // ---- compress_beside(): a thread compresses and writes each chunk while the next one is encoded
  bool beside = false;
  std::mutex mu;
  std::condition_variable cv;
  Pb handed;  ///< the chunk the thread has, while `busy`
  bool busy = false, stop = false;
  std::exception_ptr error;  ///< the first the thread threw (what follows is not written)
  std::thread thread;
  void compress_loop() {
    std::unique_lock<std::mutex> lk(mu);
    for (;;) {
      cv.wait(lk, [&] { return busy || stop; });
      if (!busy) return;
      lk.unlock();
      if (!error) {
        try {
          write_compressed(handed.view(), zbuf, zframe);
        } catch (...) {
          error = std::current_exception();
        }
      }
      handed.clear();
      lk.lock();
      busy = false;
      cv.notify_all();
    }
  }
  /// Compress what is left, wait for the thread and stop it; rethrow what it threw.
  void drain() {
    compress();
    if (!beside) return;
    {
      std::unique_lock<std::mutex> lk(mu);
      cv.wait(lk, [&] { return !busy; });
      stop = true;
      cv.notify_all();
    }
    thread.join();
    beside = false;
    if (error) std::rethrow_exception(std::exchange(error, nullptr));
  }
  ~Impl() {
    if (thread.joinable()) {  // (a throw before close(): stop without writing more)
      {
        std::lock_guard<std::mutex> lk(mu);
        stop = true;
        busy = false;
      }
      cv.notify_all();
      thread.join();
    }
  }
  /// A TrackEvent packet at `t` ns, written into `chunk`: begin_packet() writes the packet's timestamp (a delta on
  /// the incremental clock, or, earlier than the clock, the time on the trace clock) and opens the event, whose
  /// fields the caller then writes into `chunk`; end_event() closes it and writes the sequence fields and the
  /// interned data the event's fields added. (Straight into the chunk: the event, the packet and its framing
  /// were each a buffer copied into the next, for every slice.)
  size_t packet_at = 0, event_at = 0;
  void begin_packet(uint64_t t) {
    packet_at = chunk.open(1);
    if (t >= clock) {
      chunk.u64(8, t - clock);
      clock = t;
    } else {
      chunk.u64(58, kTraceClock);
      chunk.u64(8, t);
    }
    event_at = chunk.open(11);
  }
  /// begin_packet() after the held-back packets due by `t` (their times come first).
  void begin_event(uint64_t t) {
    while (!later.empty() && later.top().t <= t) pop_later();
    begin_packet(t);
  }
  void end_event() {
    chunk.close(event_at);
    chunk.u64(10, seq);
    if (!interned.empty()) chunk.msg(12, interned);
    chunk.u64(13, 2);
    chunk.close(packet_at);
    interned.clear();
    if (chunk.size() >= kChunkBytes) compress();
  }
  void pop_later() {
    const Later l = later.top();
    later.pop();
    begin_packet(l.t);
    if (l.counter) {
      chunk.u64(9, 4);
      chunk.u64(11, l.track);
      chunk.dbl(44, l.value);
    } else {
      chunk.u64(9, 2);
      chunk.u64(11, l.track);
    }
    end_event();
  }
  void hold(uint64_t t, uint64_t track, bool counter, double value = 0) {
    later.push({t, arrivals++, track, value, counter});
    if (later.size() > kMaxLater) pop_later();
  }
  Track& track_of(int track) {
    auto [it, fresh] = tracks.try_emplace(track);
    if (fresh) it->second.uuid = uuid(static_cast<uint64_t>(track) + 1);
    return it->second;
  }
  /// The lane (track uuid) of a slice [s, e] ns that starts at `start` on `track`.
  uint64_t place(int track, Ps start, uint64_t s, uint64_t e) {
    Track& t = track_of(track);
    if (t.lanes.empty()) t.lanes.push_back({0, t.uuid});
    auto free = std::find_if(t.lanes.begin(), t.lanes.end(), [&](const auto& l) { return l.first <= s; });
    if (free == t.lanes.end() && lanes_made < kMaxLanes) {
      Pb td;
      td.u64(1, uuid(kFirstLane + lanes_made++));
      td.str(2, t.name);
      td.u64(5, t.uuid);
      packet.msg(60, td);
      flush();
      t.lanes.push_back({0, uuid(kFirstLane + lanes_made - 1)});
      free = t.lanes.end() - 1;
    }
    if (free == t.lanes.end())  // out of lanes: the one free soonest (Perfetto may then pair ends wrongly)
      free = std::min_element(t.lanes.begin(), t.lanes.end());
    free->first = std::max(free->first, e);
    if (free != t.lanes.begin()) {
      lane_of[{track, start}] = free->second;
      lane_order.push({track, start});
      if (lane_order.size() > kLaneMemory) {
        lane_of.erase(lane_order.front());
        lane_order.pop();
      }
    }
    return free->second;
  }
  /// The lane of the slice at (`track`, `start`), for a flow arrow from it.
  uint64_t lane_at(int track, Ps start) {
    auto it = lane_of.find({track, start});
    return it != lane_of.end() ? it->second : track_of(track).uuid;
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
  // The sequence's start (as Perfetto's SDK writes it): incremental state cleared, timestamps on the
  // incremental clock by default, and a snapshot that puts its 0 at the trace clock's 0.
  Pb defaults, snapshot, clock;
  defaults.u64(58, Impl::kClock);
  m.packet.msg(59, defaults);
  for (const uint64_t id : {Impl::kTraceClock, Impl::kClock}) {
    clock.clear();
    clock.u64(1, id);
    clock.u64(2, 0);
    if (id == Impl::kClock) clock.u64(3, 1);  // is_incremental
    clock.u64(4, 1);                          // unit_multiplier_ns (said, not left to a default)
    snapshot.msg(1, clock);
  }
  m.packet.msg(6, snapshot);
  m.flush(true);
  Pb proc, td;
  proc.u64(1, static_cast<uint64_t>(pid));
  proc.str(6, process_name);
  td.u64(1, m.process);
  td.msg(3, proc);
  m.packet.msg(60, td);
  m.flush();
}

PerfettoTraceWriter::~PerfettoTraceWriter() {
  if (!finished_) finish();
}

void PerfettoTraceWriter::emit_track(int track, const std::string& name) {
  Impl& m = *impl_;
  Impl::Track& t = m.track_of(track);
  t.name = name;
  const uint64_t u = t.uuid;
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
  // Flow arrow: from an instant at the producer slice's start (its slice is written already) to this one.
  const bool flow = s.flow_id >= 0 && (!filter_.has_window() || s.flow_ts >= filter_.window_start);
  Pb& ev = m.chunk;
  if (flow) {
    m.begin_event(ns(s.flow_ts));
    ev.u64(9, 3);
    ev.u64(11, m.lane_at(s.flow_track, s.flow_ts));
    ev.u64(10, m.intern(m.names, 2, "wait"));
    ev.fixed64(47, static_cast<uint64_t>(s.flow_id));
    m.end_event();
  }
  const uint64_t begin = ns(s.start), end = ns(s.start + s.dur);
  const uint64_t tu = m.place(s.track, s.start, begin, end);
  m.begin_event(begin);
  ev.u64(9, 1);
  ev.u64(11, tu);
  ev.u64(10, m.intern(m.names, 2, s.name));
  for (const TraceArg& a : s.args) {
    // `opcode` repeats the slice's name. (The disassembly is not asked for: wants_disassembly.)
    if (a.kind == TraceArg::Kind::kText && std::strcmp(a.key, "opcode") == 0 && a.text == s.name) continue;
    const size_t at = ev.open(4);
    ev.u64(1, m.intern_key(a.key));
    if (a.kind == TraceArg::Kind::kInt) ev.i64(4, a.i);
    else if (a.kind == TraceArg::Kind::kReal) ev.dbl(5, a.d);
    else ev.u64(17, m.intern(m.strings, 29, a.text));
    ev.close(at);
  }
  if (flow) ev.fixed64(48, static_cast<uint64_t>(s.flow_id));
  m.end_event();
  m.hold(end, tu, false);  // its end, once the output gets there
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
  m.hold(ns(t), it->second, true, value);  // counter samples come ahead of the slices
}

void PerfettoTraceWriter::emit_summary(Ps at, const std::string& name) {
  // An instant on the process track, with the counts as arguments.
  Impl& m = *impl_;
  Pb& ev = m.chunk;
  m.begin_event(ns(at));
  ev.u64(9, 3);
  ev.u64(11, m.process);
  ev.str(23, name);
  auto arg = [&](const char* key, int64_t v) {
    const size_t a = ev.open(4);
    ev.u64(1, m.intern(m.arg_names, 3, key));
    ev.i64(4, v);
    ev.close(a);
  };
  arg("slices_written", static_cast<int64_t>(written_));
  arg("slices_dropped", static_cast<int64_t>(slices_dropped()));
  arg("dropped_by_limit", static_cast<int64_t>(dropped_limit_));
  arg("dropped_by_window", static_cast<int64_t>(dropped_window_));
  arg("max_slices", static_cast<int64_t>(filter_.max_slices));
  m.end_event();
}

void PerfettoTraceWriter::close() {
  Impl& m = *impl_;
  while (!m.later.empty()) m.pop_later();
  try {
    m.drain();
  } catch (...) {
    std::fclose(m.f);
    m.f = nullptr;
    throw;
  }
  std::fclose(m.f);
  m.f = nullptr;
}

void PerfettoTraceWriter::compress_beside() {
  Impl& m = *impl_;
  if (m.beside || !m.f) return;
  m.beside = true;
  m.thread = std::thread([&m] { m.compress_loop(); });
}

}  // namespace nsim::sim
