// The gzip reader of compressed kernel.json files (frontend/gzip.h): stored and fixed-Huffman blocks
// against zlib's output, every truncation and corruption a coded error (never a crash: the sanitizer
// build runs these too). Dynamic-Huffman blocks and multi-member files: tests/python/test_compressed_kernel.py.
#include <catch2/catch.hpp>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "frontend/gzip.h"
#include "sim/error.h"

using nsim::Error;
using nsim::ErrorCode;
using nsim::frontend::gunzip;
using nsim::frontend::is_gzip;
using nsim::frontend::kernel_text;

namespace {

std::string text() {
  std::string t;
  for (int i = 0; i < 3; ++i) t += R"({"nsim_kernel": 1, "name": "tiny", "tensors": [], "body": []})" "\n";
  for (int r = 0; r < 4; ++r)
    for (int c = 32; c < 127; ++c) t.push_back(static_cast<char>(c));
  return t;
}

// gzip of text(), fixed Huffman codes (zlib, Z_FIXED), written by Python's zlib
const std::vector<uint8_t> kFixed = {
    0x1f, 0x8b, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x03, 0xab, 0x56, 0xca, 0x2b, 0xce, 0xcc, 0x8d,
    0xcf, 0x4e, 0x2d, 0xca, 0x4b, 0xcd, 0x51, 0xb2, 0x52, 0x30, 0xd4, 0x51, 0x50, 0xca, 0x4b, 0xcc, 0x4d,
    0x05, 0x32, 0x95, 0x4a, 0x32, 0xf3, 0x2a, 0x95, 0x80, 0xfc, 0x92, 0xd4, 0xbc, 0xe2, 0xfc, 0xa2, 0x62,
    0xa0, 0x50, 0x74, 0x2c, 0x90, 0x9b, 0x94, 0x9f, 0x52, 0x09, 0x66, 0xd7, 0x72, 0x55, 0x0f, 0xa0, 0x6e,
    0x05, 0x45, 0x25, 0x65, 0x15, 0x55, 0x35, 0x75, 0x0d, 0x4d, 0x2d, 0x6d, 0x1d, 0x5d, 0x3d, 0x7d, 0x03,
    0x43, 0x23, 0x63, 0x13, 0x53, 0x33, 0x73, 0x0b, 0x4b, 0x2b, 0x6b, 0x1b, 0x5b, 0x3b, 0x7b, 0x07, 0x47,
    0x27, 0x67, 0x17, 0x57, 0x37, 0x77, 0x0f, 0x4f, 0x2f, 0x6f, 0x1f, 0x5f, 0x3f, 0xff, 0x80, 0xc0, 0xa0,
    0xe0, 0x90, 0xd0, 0xb0, 0xf0, 0x88, 0xc8, 0xa8, 0xe8, 0x98, 0xd8, 0xb8, 0xf8, 0x84, 0xc4, 0xa4, 0xe4,
    0x94, 0xd4, 0xb4, 0xf4, 0x8c, 0xcc, 0xac, 0xec, 0x9c, 0xdc, 0xbc, 0xfc, 0x82, 0xc2, 0xa2, 0xe2, 0x92,
    0xd2, 0xb2, 0xf2, 0x8a, 0xca, 0xaa, 0xea, 0x9a, 0xda, 0xba, 0x51, 0xe3, 0xf1, 0x18, 0x0f, 0x00, 0x16,
    0xa8, 0x8e, 0xe9, 0x36, 0x02, 0x00, 0x00
};
// gzip of text().substr(0, 40), one stored block (zlib level 0), written by Python's zlib
const std::vector<uint8_t> kStored = {
    0x1f, 0x8b, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x03, 0x01, 0x28, 0x00, 0xd7, 0xff, 0x7b, 0x22,
    0x6e, 0x73, 0x69, 0x6d, 0x5f, 0x6b, 0x65, 0x72, 0x6e, 0x65, 0x6c, 0x22, 0x3a, 0x20, 0x31, 0x2c, 0x20,
    0x22, 0x6e, 0x61, 0x6d, 0x65, 0x22, 0x3a, 0x20, 0x22, 0x74, 0x69, 0x6e, 0x79, 0x22, 0x2c, 0x20, 0x22,
    0x74, 0x65, 0x6e, 0x73, 0x6a, 0xe3, 0x4e, 0xad, 0x28, 0x00, 0x00, 0x00
};

std::string str(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }

/// "ok", or the code of the Error thrown (any other exception fails the test).
std::string outcome(const std::string& data) {
  try {
    gunzip(data, "t.json.gz");
  } catch (const Error& e) {
    return e.code_str();
  }
  return "ok";
}

}  // namespace

TEST_CASE("gunzip reads zlib's stored and fixed-Huffman blocks", "[gzip]") {
  CHECK(gunzip(str(kFixed), "t") == text());
  CHECK(gunzip(str(kStored), "t") == text().substr(0, 40));
  CHECK(gunzip(str(kStored) + str(kFixed), "t") == text().substr(0, 40) + text());  // two members
  CHECK(is_gzip(str(kFixed)));
  CHECK(!is_gzip(text()));
  CHECK(kernel_text(text(), "t") == text());  // not gzip: as it is
  CHECK(kernel_text(str(kFixed), "t") == text());
}

TEST_CASE("truncated or corrupt gzip data is a BadCompression error", "[gzip]") {
  const std::string bad = Error(ErrorCode::kBadCompression, "").code_str();
  for (const auto* blob : {&kFixed, &kStored}) {
    const std::string data = str(*blob);
    for (size_t n = 0; n < data.size(); ++n) CHECK(outcome(data.substr(0, n)) == bad);
    CHECK(outcome(data + "x") == bad);
    std::string method = data;
    method[2] = 9;
    CHECK(outcome(method) == bad);
    std::string crc = data;
    crc[data.size() - 8] ^= 1;
    CHECK(outcome(crc) == bad);
    std::string len = data;
    len[data.size() - 1] ^= 1;
    CHECK(outcome(len) == bad);
  }
  try {
    gunzip(str(kFixed).substr(0, 50), "dir/t.json.gz");
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kBadCompression);
    CHECK_THAT(e.what(), Catch::Contains("dir/t.json.gz: gzip: ") && Catch::Contains("truncated"));
  }
  // Random corruption of the compressed data: an error or (where a flipped bit only changes an
  // unchecked header field) the same text, never anything else.
  std::mt19937 rng(7);
  const std::string data = str(kFixed);
  for (int i = 0; i < 3000; ++i) {
    std::string m = data;
    const size_t at = 2 + rng() % (m.size() - 2);
    const int flips = 1 + static_cast<int>(rng() % 3);
    for (int f = 0; f < flips; ++f) m[2 + rng() % (m.size() - 2)] ^= static_cast<char>(1u << (rng() % 8));
    m[at] ^= static_cast<char>(1u << (rng() % 8));
    const std::string o = outcome(m);
    if (o == "ok") CHECK(gunzip(m, "t") == text());
    else CHECK(o == bad);
  }
}
