#include "frontend/gzip.h"

#include <fmt/format.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <vector>

#include "sim/error.h"

namespace nsim::frontend {

namespace {

/// CRC-32 (IEEE 802.3, reflected, polynomial 0xEDB88320) as gzip stores it.
uint32_t crc32(const char* p, size_t n) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) c = table[(c ^ static_cast<uint8_t>(p[i])) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

/// One raw DEFLATE stream (RFC 1951) appended to `out`. Huffman codes of up to kFast bits are decoded by
/// one table lookup, longer ones bit by bit from the canonical code (as zlib's puff does).
class Inflater {
 public:
  Inflater(std::string_view in, size_t pos, std::string& out, const std::string& what, const char* format = "gzip")
      : in_(reinterpret_cast<const uint8_t*>(in.data())), n_(in.size()), pos_(pos), base_(out.size()), out_(out),
        what_(what), format_(format) {}

  /// Inflates the stream; returns the byte position just after it.
  size_t run() {
    for (bool last = false; !last;) {
      last = bits(1) != 0;
      switch (bits(2)) {
        case 0: stored(); break;
        case 1: fixed(); break;
        case 2: dynamic(); break;
        default: bad("reserved DEFLATE block type 3");
      }
    }
    const int partial = cnt_ & 7;  // the rest of the last byte, then bytes read ahead
    buf_ >>= partial;
    cnt_ -= partial;
    return pos_ - static_cast<size_t>(cnt_ / 8);
  }

 private:
  static constexpr int kFast = 9;
  struct Huff {
    std::array<uint16_t, 16> count{};
    std::vector<uint16_t> symbol;
    std::array<uint16_t, 1u << kFast> fast{};  ///< (symbol << 4) | length for codes of <= kFast bits; 0 = longer
  };

  const uint8_t* in_;
  size_t n_, pos_;
  size_t base_;  ///< where this stream's output starts in out_ (earlier members are not its window)
  std::string& out_;
  const std::string& what_;
  const char* format_;
  uint64_t buf_ = 0;
  int cnt_ = 0;

  [[noreturn]] void bad(const std::string& msg) const {
    throw Error(ErrorCode::kBadCompression, fmt::format("{}: {}: {}", what_, format_, msg));
  }
  void fill(int k) {  // at least k bits in the buffer, or all that the input has left
    while (cnt_ < k && pos_ < n_) {
      buf_ |= static_cast<uint64_t>(in_[pos_++]) << cnt_;
      cnt_ += 8;
    }
  }
  uint32_t bits(int k) {
    if (k == 0) return 0;
    fill(k);
    if (cnt_ < k) bad("the data ends early (truncated file)");
    const auto v = static_cast<uint32_t>(buf_ & ((uint64_t{1} << k) - 1));
    buf_ >>= k;
    cnt_ -= k;
    return v;
  }

  Huff build(const uint8_t* len, size_t n) const {
    Huff h;
    h.symbol.assign(n, 0);
    for (size_t s = 0; s < n; ++s) ++h.count[len[s]];
    h.count[0] = 0;
    int left = 1;  // over-subscribed codes are invalid; incomplete ones are allowed (their gaps fail to decode)
    for (size_t l = 1; l < 16; ++l) {
      left = left * 2 - h.count[l];
      if (left < 0) bad("an over-subscribed Huffman code");
    }
    std::array<uint16_t, 16> offs{};
    for (size_t l = 1; l < 15; ++l) offs[l + 1] = static_cast<uint16_t>(offs[l] + h.count[l]);
    for (size_t s = 0; s < n; ++s)
      if (len[s] != 0) h.symbol[offs[len[s]]++] = static_cast<uint16_t>(s);
    // The fast table: canonical codes (RFC 1951 3.2.2) are sent most significant bit first, so a code's
    // entries sit at its bit-reversed value plus every pattern of the bits that follow it.
    std::array<uint32_t, 16> next{};
    uint32_t code = 0;
    for (size_t l = 1; l < 16; ++l) {
      code = (code + h.count[l - 1]) << 1;
      next[l] = code;
    }
    for (size_t s = 0; s < n; ++s) {
      const int l = len[s];
      if (l == 0) continue;
      const uint32_t c = next[static_cast<size_t>(l)]++;
      if (l > kFast) continue;
      uint32_t r = 0;
      for (int b = 0; b < l; ++b) r |= ((c >> b) & 1u) << (l - 1 - b);
      for (uint32_t f = r; f < (1u << kFast); f += 1u << l) h.fast[f] = static_cast<uint16_t>((s << 4) | static_cast<size_t>(l));
    }
    return h;
  }

  int decode(const Huff& h) {
    fill(kFast);
    const uint16_t e = h.fast[buf_ & ((1u << kFast) - 1)];
    if (e != 0) {
      const int l = e & 15;
      if (cnt_ < l) bad("the data ends early (truncated file)");
      buf_ >>= l;
      cnt_ -= l;
      return e >> 4;
    }
    int code = 0, first = 0, index = 0;
    for (size_t l = 1; l < 16; ++l) {
      code |= static_cast<int>(bits(1));
      const int count = h.count[l];
      if (code - count < first) return h.symbol[static_cast<size_t>(index + (code - first))];
      index += count;
      first = (first + count) << 1;
      code <<= 1;
    }
    bad("a bit pattern that is no Huffman code");
  }

  void stored() {
    const int partial = cnt_ & 7;
    buf_ >>= partial;
    cnt_ -= partial;
    const uint32_t len = bits(16), nlen = bits(16);
    if ((len ^ 0xFFFFu) != nlen) bad("a stored block whose length and its complement disagree");
    uint32_t i = 0;
    for (; i < len && cnt_ >= 8; ++i) out_.push_back(static_cast<char>(bits(8)));
    const size_t rest = len - i;
    if (n_ - pos_ < rest) bad("the data ends early (truncated file)");
    out_.append(reinterpret_cast<const char*>(in_ + pos_), rest);
    pos_ += rest;
  }

  void codes(const Huff& lit, const Huff& dist) {
    static constexpr uint16_t kLen[29] = {3,  4,  5,  6,  7,  8,  9,  10, 11,  13,  15,  17,  19,  23, 27,
                                          31, 35, 43, 51, 59, 67, 83, 99, 115, 131, 163, 195, 227, 258};
    static constexpr uint8_t kLenX[29] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0};
    static constexpr uint16_t kDist[30] = {1,   2,   3,   4,   5,   7,    9,    13,   17,   25,   33,   49,   65,    97,    129,
                                           193, 257, 385, 513, 769, 1025, 1537, 2049, 3073, 4097, 6145, 8193, 12289, 16385, 24577};
    static constexpr uint8_t kDistX[30] = {0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13};
    for (;;) {
      int sym = decode(lit);
      if (sym < 256) {
        out_.push_back(static_cast<char>(sym));
        continue;
      }
      if (sym == 256) return;
      sym -= 257;
      if (sym >= 29) bad("an invalid length code");
      const size_t len = kLen[sym] + bits(kLenX[sym]);
      const int d = decode(dist);
      if (d >= 30) bad("an invalid distance code");
      const size_t back = kDist[d] + bits(kDistX[d]);
      if (back > out_.size() - base_) bad("a distance back before the start of the data");
      const size_t at = out_.size();
      out_.resize(at + len);
      char* dst = out_.data() + at;
      const char* src = dst - back;
      for (size_t i = 0; i < len; ++i) dst[i] = src[i];  // forward, byte by byte: the copy may overlap itself
    }
  }

  void fixed() {
    std::array<uint8_t, 288> l{};
    std::array<uint8_t, 30> d{};
    for (size_t i = 0; i < 288; ++i) l[i] = i < 144 ? 8 : i < 256 ? 9 : i < 280 ? 7 : 8;
    d.fill(5);
    codes(build(l.data(), l.size()), build(d.data(), d.size()));
  }

  void dynamic() {
    static constexpr uint8_t kOrder[19] = {16, 17, 18, 0, 8, 7, 9, 6, 10, 5, 11, 4, 12, 3, 13, 2, 14, 1, 15};
    const size_t nlen = bits(5) + 257, ndist = bits(5) + 1, ncode = bits(4) + 4;
    if (nlen > 286 || ndist > 30) bad("a dynamic block with too many length or distance codes");
    std::array<uint8_t, 19> cl{};
    for (size_t i = 0; i < ncode; ++i) cl[kOrder[i]] = static_cast<uint8_t>(bits(3));
    const Huff lencode = build(cl.data(), cl.size());
    std::array<uint8_t, 286 + 30> lens{};
    size_t have = 0;
    while (have < nlen + ndist) {
      const int sym = decode(lencode);
      if (sym < 16) {
        lens[have++] = static_cast<uint8_t>(sym);
        continue;
      }
      uint8_t v = 0;
      size_t rep = 0;
      if (sym == 16) {
        if (have == 0) bad("a repeated code length with no previous length");
        v = lens[have - 1];
        rep = 3 + bits(2);
      } else {
        rep = sym == 17 ? 3 + bits(3) : 11 + bits(7);
      }
      if (have + rep > nlen + ndist) bad("more code lengths than the block declares");
      for (size_t i = 0; i < rep; ++i) lens[have++] = v;
    }
    if (lens[256] == 0) bad("a dynamic block without an end-of-block code");
    codes(build(lens.data(), nlen), build(lens.data() + nlen, ndist));
  }
};

uint32_t le32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 | static_cast<uint32_t>(p[2]) << 16 |
         static_cast<uint32_t>(p[3]) << 24;
}

}  // namespace

bool is_gzip(std::string_view bytes) {
  return bytes.size() >= 2 && static_cast<uint8_t>(bytes[0]) == 0x1F && static_cast<uint8_t>(bytes[1]) == 0x8B;
}

std::string gunzip(std::string_view bytes, const std::string& what) {
  const auto* b = reinterpret_cast<const uint8_t*>(bytes.data());
  const size_t n = bytes.size();
  const auto bad = [&](const std::string& msg) {
    throw Error(ErrorCode::kBadCompression, fmt::format("{}: gzip: {}", what, msg));
  };
  std::string out;
  size_t pos = 0;
  int members = 0;
  while (pos < n) {  // RFC 1952 2.2: members follow each other; their contents are concatenated
    if (n - pos < 18) bad(members == 0 ? "the file is shorter than a gzip header and trailer"
                                       : "bytes after the last member that are not a gzip member");
    if (b[pos] != 0x1F || b[pos + 1] != 0x8B)
      bad(members == 0 ? "not gzip data (no 1f 8b magic number)" : "bytes after the last member that are not a gzip member");
    if (b[pos + 2] != 8) bad(fmt::format("compression method {} (only 8, DEFLATE, exists)", b[pos + 2]));
    const uint8_t flg = b[pos + 3];
    if (flg & 0xE0) bad("reserved header flags are set");
    size_t p = pos + 10;
    if (flg & 0x04) {  // FEXTRA
      if (n - p < 2) bad("the header ends early (truncated file)");
      const size_t xlen = static_cast<size_t>(b[p]) | static_cast<size_t>(b[p + 1]) << 8;
      if (n - p - 2 < xlen) bad("the header ends early (truncated file)");
      p += 2 + xlen;
    }
    for (const uint8_t bit : {uint8_t{0x08}, uint8_t{0x10}}) {  // FNAME, FCOMMENT: zero-terminated
      if (!(flg & bit)) continue;
      while (p < n && b[p] != 0) ++p;
      if (p >= n) bad("the header ends early (truncated file)");
      ++p;
    }
    if (flg & 0x02) {  // FHCRC: the low 16 bits of the header's CRC-32
      if (n - p < 2) bad("the header ends early (truncated file)");
      const uint32_t want = static_cast<uint32_t>(b[p]) | static_cast<uint32_t>(b[p + 1]) << 8;
      if ((crc32(bytes.data() + pos, p - pos) & 0xFFFFu) != want) bad("the header's CRC-16 does not match");
      p += 2;
    }
    const size_t start = out.size();
    p = Inflater(bytes, p, out, what).run();
    if (n - p < 8) bad("the data ends before its CRC-32 and length (truncated file)");
    if (crc32(out.data() + start, out.size() - start) != le32(b + p)) bad("the CRC-32 of the data does not match");
    if (static_cast<uint32_t>(out.size() - start) != le32(b + p + 4))
      bad("the length of the data does not match the length recorded");
    pos = p + 8;
    ++members;
  }
  if (members == 0) bad("the file is empty");
  return out;
}

std::string zlib_inflate(std::string_view bytes, const std::string& what) {
  const auto* b = reinterpret_cast<const uint8_t*>(bytes.data());
  const size_t n = bytes.size();
  const auto bad = [&](const std::string& msg) {
    throw Error(ErrorCode::kBadCompression, fmt::format("{}: zlib: {}", what, msg));
  };
  if (n < 6) bad("shorter than a zlib header and trailer");
  // RFC 1950 2.2: CM = 8 (DEFLATE), a window of at most 32 KiB, the check bits, no preset dictionary
  if ((b[0] & 0x0F) != 8 || (b[0] >> 4) > 7 || (b[0] * 256u + b[1]) % 31 != 0 || (b[1] & 0x20))
    bad("not a zlib header (DEFLATE, window <= 32 KiB, no preset dictionary)");
  std::string out;
  const size_t p = Inflater(bytes, 2, out, what, "zlib").run();
  if (n - p < 4) bad("the data ends before its Adler-32 (truncated)");
  uint32_t s1 = 1, s2 = 0;  // Adler-32 (RFC 1950 8.2), big-endian after the data
  for (const char c : out) {
    s1 = (s1 + static_cast<uint8_t>(c)) % 65521;
    s2 = (s2 + s1) % 65521;
  }
  const uint32_t want = static_cast<uint32_t>(b[p]) << 24 | static_cast<uint32_t>(b[p + 1]) << 16 |
                        static_cast<uint32_t>(b[p + 2]) << 8 | static_cast<uint32_t>(b[p + 3]);
  if ((s2 << 16 | s1) != want) bad("the Adler-32 of the data does not match");
  if (p + 4 != n) bad("bytes after the zlib stream");
  return out;
}

std::string kernel_text(std::string bytes, const std::string& what) {
  if (!is_gzip(bytes)) return bytes;
  return gunzip(bytes, what);
}

}  // namespace nsim::frontend
