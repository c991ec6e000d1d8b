// Memory: the first-fit range allocator, HBM tensors (alignment, sentinel fill, errors), on-chip
// allocation limits, operand resolution and bounds checks; Operand access-pattern helpers.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "isa/isa.h"
#include "memory/memory.h"
#include "sim/error.h"

namespace {

using nsim::DType;
using nsim::Error;
using nsim::ErrorCode;
using nsim::isa::Operand;
using nsim::isa::Space;
using nsim::memory::HbmTensor;
using nsim::memory::Memory;
using nsim::memory::MemoryConfig;
using nsim::memory::RangeAllocator;

constexpr int64_t kSbufPP = 192 * 1024;  // 196608
constexpr int64_t kPsumPP = 8 * 2048;    // 16384

MemoryConfig cfg() {
  MemoryConfig c;
  c.partitions = 128;
  c.sbuf_bytes_per_partition = kSbufPP;
  c.psum_partitions = 128;
  c.psum_banks = 8;
  c.psum_bank_bytes = 2048;
  c.hbm_bytes = int64_t{1} << 30;
  return c;
}

/// The code of the nsim::Error thrown by f, or nullopt if nothing (or something else) was thrown.
template <class F>
std::optional<ErrorCode> code_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.code();
  } catch (...) {
    return std::nullopt;
  }
  return std::nullopt;
}

Operand pattern(Space sp, DType dt, int64_t offset, std::vector<int64_t> sizes, std::vector<int64_t> strides) {
  Operand o;
  o.space = sp;
  o.dtype = dt;
  o.offset = offset;
  o.num_partitions = 1;
  o.nfree = static_cast<uint8_t>(sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) {
    o.size[i] = sizes[i];
    o.stride[i] = strides[i];
  }
  return o;
}

}  // namespace

// ------------------------------------------------------------------------------------------------
// RangeAllocator

TEST_CASE("RangeAllocator: first fit with alignment", "[memory][alloc]") {
  RangeAllocator a(1024, 64);
  CHECK(a.capacity() == 1024);
  CHECK(a.used() == 0);
  CHECK(a.alloc(10) == std::optional<int64_t>(0));     // rounded to 64
  CHECK(a.alloc(100) == std::optional<int64_t>(64));   // rounded to 128: [64, 192)
  CHECK(a.alloc(1) == std::optional<int64_t>(192));
  CHECK(a.used() == 64 + 128 + 64);
  CHECK(a.peak() == 256);
  // Every offset is aligned.
  for (int i = 0; i < 3; ++i) {
    auto o = a.alloc(7 + i * 50);
    REQUIRE(o);
    CHECK(*o % 64 == 0);
  }
}

TEST_CASE("RangeAllocator: free and reuse of the first gap", "[memory][alloc]") {
  RangeAllocator a(1024, 64);
  REQUIRE(a.alloc(64) == std::optional<int64_t>(0));
  REQUIRE(a.alloc(128) == std::optional<int64_t>(64));
  REQUIRE(a.alloc(64) == std::optional<int64_t>(192));
  a.free(64);
  CHECK(a.used() == 128);
  CHECK(a.peak() == 256);                              // peak remembers the high-water mark
  CHECK(a.alloc(192) == std::optional<int64_t>(256));  // does not fit the 128-byte gap: after the end
  CHECK(a.alloc(64) == std::optional<int64_t>(64));    // first fit: into the gap
  CHECK(a.alloc(64) == std::optional<int64_t>(128));   // the rest of the gap
  CHECK(a.alloc(64) == std::optional<int64_t>(448));
  CHECK(a.used() == 64 + 64 + 64 + 64 + 192 + 64);
  CHECK(a.peak() == a.used());
  a.free(12345);  // unknown offset: no effect
  CHECK(a.used() == 512);
  a.free(0);
  a.free(0);  // double free: no effect
  CHECK(a.used() == 448);
}

TEST_CASE("RangeAllocator: nullopt when full or fragmented and the peak", "[memory][alloc]") {
  RangeAllocator a(256, 64);
  CHECK(a.alloc(64) == std::optional<int64_t>(0));
  CHECK(a.alloc(64) == std::optional<int64_t>(64));
  CHECK(a.alloc(64) == std::optional<int64_t>(128));
  CHECK(a.alloc(64) == std::optional<int64_t>(192));
  CHECK_FALSE(a.alloc(1).has_value());
  CHECK(a.used() == 256);
  CHECK(a.peak() == 256);
  a.free(0);
  a.free(128);
  CHECK(a.used() == 128);
  CHECK_FALSE(a.alloc(128).has_value());  // 128 bytes free, but in two 64-byte gaps
  CHECK(a.alloc(64) == std::optional<int64_t>(0));
  CHECK(a.peak() == 256);

  RangeAllocator b(100, 4);
  CHECK(b.alloc(100) == std::optional<int64_t>(0));  // exactly the capacity
  CHECK_FALSE(b.alloc(1).has_value());
  RangeAllocator c(100, 4);
  CHECK_FALSE(c.alloc(101).has_value());
  CHECK(c.alloc(0) == std::optional<int64_t>(0));  // zero-size allocations still get a distinct slot
  CHECK(c.alloc(0) == std::optional<int64_t>(4));
  CHECK(c.used() == 8);
}

// ------------------------------------------------------------------------------------------------
// HBM tensors

TEST_CASE("Memory::alloc_hbm: 64-byte aligned, non-overlapping tensors", "[memory][hbm]") {
  Memory m(cfg(), true);
  CHECK(m.has_storage());
  const HbmTensor& a = m.alloc_hbm("a", {3, 5}, DType::kFloat32);  // 60 bytes
  CHECK(a.name == "a");
  CHECK(a.addr == 0);
  CHECK(a.bytes == 60);
  CHECK(a.shape == std::vector<int64_t>{3, 5});
  const HbmTensor b = m.alloc_hbm("b", {7}, DType::kBFloat16);  // 14 bytes
  CHECK(b.addr == 64);
  CHECK(b.bytes == 14);
  const HbmTensor c = m.alloc_hbm("c", {2, 2, 2}, DType::kInt8);
  CHECK(c.addr == 128);
  const HbmTensor d = m.alloc_hbm("d", {1000}, DType::kFloat32);
  CHECK(d.addr == 192);

  std::vector<HbmTensor> all{m.hbm_tensor("a"), b, c, d};
  for (size_t i = 0; i < all.size(); ++i) {
    CHECK(all[i].addr % 64 == 0);
    for (size_t j = i + 1; j < all.size(); ++j)
      CHECK((all[i].addr + all[i].bytes <= all[j].addr || all[j].addr + all[j].bytes <= all[i].addr));
  }
  CHECK(m.has_hbm_tensor("c"));
  CHECK_FALSE(m.has_hbm_tensor("z"));
  CHECK(m.hbm_tensor_names() == std::vector<std::string>{"a", "b", "c", "d"});
  CHECK(m.hbm_tensor("d").dtype == DType::kFloat32);
  CHECK(m.hbm_data("a") != nullptr);
  CHECK(m.hbm_data("a") != m.hbm_data("b"));
}

TEST_CASE("Memory::alloc_hbm fills the sentinel", "[memory][hbm]") {
  Memory m(cfg(), true);
  m.alloc_hbm("f", {4, 8}, DType::kFloat32);
  m.alloc_hbm("h", {5}, DType::kBFloat16);
  m.alloc_hbm("i", {3, 3}, DType::kInt32);
  m.alloc_hbm("u", {6}, DType::kUInt8);
  const uint8_t* f = m.hbm_data("f");
  REQUIRE(f);
  for (int k = 0; k < 32; ++k) CHECK(std::isnan(nsim::load_f32(DType::kFloat32, f + 4 * k)));
  const uint8_t* h = m.hbm_data("h");
  for (int k = 0; k < 5; ++k) CHECK(std::isnan(nsim::load_f32(DType::kBFloat16, h + 2 * k)));
  const uint8_t* iv = m.hbm_data("i");
  for (int k = 0; k < 9; ++k) CHECK(nsim::load_int(DType::kInt32, iv + 4 * k) == 4);
  const uint8_t* u = m.hbm_data("u");
  for (int k = 0; k < 6; ++k) CHECK(u[k] == 4);

  // fill_sentinel directly, incl. a partial trailing element that must stay untouched.
  uint8_t buf[10];
  std::memset(buf, 0xAB, sizeof buf);
  nsim::memory::fill_sentinel(buf, 10, DType::kInt32);
  CHECK(nsim::load_int(DType::kInt32, buf) == 4);
  CHECK(nsim::load_int(DType::kInt32, buf + 4) == 4);
  CHECK(buf[8] == 0xAB);
  CHECK(buf[9] == 0xAB);
}

TEST_CASE("Memory: on-chip storage reads NaN before it is written", "[memory][hbm]") {
  Memory m(cfg(), true);
  auto v = m.resolve(Operand::tile(Space::kSbuf, DType::kFloat32, 0, 5, 2, {4}));
  CHECK(std::isnan(nsim::load_f32(DType::kFloat32, v.at(1, 3))));
  auto p = m.resolve(Operand::tile(Space::kPsum, DType::kFloat32, 2044, 127, 1, {1}));
  CHECK(std::isnan(nsim::load_f32(DType::kFloat32, p.at(0, 0))));
}

TEST_CASE("Memory HBM errors: duplicate, unknown, overflow", "[memory][hbm]") {
  Memory m(cfg(), true);
  m.alloc_hbm("x", {16}, DType::kFloat32);
  CHECK_THROWS_AS(m.alloc_hbm("x", {16}, DType::kFloat32), Error);
  CHECK_THROWS_AS(m.alloc_hbm("x", {1}, DType::kInt8), Error);
  CHECK(m.hbm_tensor_names().size() == 1);
  CHECK(code_of([&] { (void)m.hbm_tensor("nope"); }) == ErrorCode::kUnknownTensor);
  CHECK(code_of([&] { (void)m.hbm_data("nope"); }) == ErrorCode::kUnknownTensor);
  try {
    (void)m.hbm_tensor("missing_tensor");
    FAIL("expected nsim::Error");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("missing_tensor") != std::string::npos);
    CHECK(e.code_str() == "NSIM-E208");
  }

  // Overflow without storage (no real gigabyte allocations).
  Memory big(cfg(), false);
  CHECK_FALSE(big.has_storage());
  big.alloc_hbm("half", {int64_t{1} << 27}, DType::kFloat32);  // 512 MiB
  CHECK(code_of([&] { big.alloc_hbm("too_big", {int64_t{1} << 27, 2}, DType::kFloat32); }) == ErrorCode::kHbmOverflow);
  CHECK_FALSE(big.has_hbm_tensor("too_big"));
  const HbmTensor& rest = big.alloc_hbm("rest", {int64_t{1} << 28}, DType::kBFloat16);  // exactly the other 512 MiB
  CHECK(rest.addr == int64_t{1} << 29);
  CHECK(big.hbm_data("rest") == nullptr);  // no storage
  CHECK(code_of([&] { big.alloc_hbm("one_more", {1}, DType::kInt8); }) == ErrorCode::kHbmOverflow);
  CHECK(code_of([&] { big.alloc_hbm("huge", {int64_t{1} << 40, int64_t{1} << 40}, DType::kFloat32); }) ==
        ErrorCode::kHbmOverflow);
}

TEST_CASE("HbmTensor::whole covers the tensor", "[memory][hbm]") {
  Memory m(cfg(), true);
  m.alloc_hbm("pad", {3}, DType::kFloat32);
  const HbmTensor& t = m.alloc_hbm("t", {4, 3, 5}, DType::kBFloat16);
  const Operand o = t.whole();
  CHECK(o.space == Space::kHbm);
  CHECK(o.dtype == DType::kBFloat16);
  CHECK(o.offset == 64);
  CHECK(o.num_partitions == 4);
  CHECK(o.partition_step == 15);
  CHECK(o.elems_per_partition() == 15);
  CHECK(o.total_elems() == 60);
  CHECK(o.byte_extent() == std::make_pair(int64_t{64}, int64_t{64 + 120}));
  CHECK_NOTHROW(m.check_bounds(o, "whole"));
}

// ------------------------------------------------------------------------------------------------
// On-chip allocation

TEST_CASE("Memory::alloc_onchip: SBUF and PSUM overflow", "[memory][onchip]") {
  Memory m(cfg(), false);
  CHECK(m.alloc_onchip(Space::kSbuf, 1000) == 0);
  CHECK(m.alloc_onchip(Space::kSbuf, 1000) == 1000);  // default alignment 4
  CHECK(m.allocator(Space::kSbuf).used() == 2000);
  CHECK(m.allocator(Space::kSbuf).capacity() == kSbufPP);
  CHECK(code_of([&] { m.alloc_onchip(Space::kSbuf, kSbufPP - 1999); }) == ErrorCode::kSbufOverflow);
  CHECK(m.alloc_onchip(Space::kSbuf, kSbufPP - 2000) == 2000);  // exactly fills
  CHECK(code_of([&] { m.alloc_onchip(Space::kSbuf, 1); }) == ErrorCode::kSbufOverflow);
  m.free_onchip(Space::kSbuf, 1000);
  CHECK(m.alloc_onchip(Space::kSbuf, 1000) == 1000);

  CHECK(m.allocator(Space::kPsum).capacity() == kPsumPP);
  CHECK(m.alloc_onchip(Space::kPsum, 2048) == 0);
  CHECK(code_of([&] { m.alloc_onchip(Space::kPsum, kPsumPP); }) == ErrorCode::kPsumOverflow);
  CHECK(m.alloc_onchip(Space::kPsum, kPsumPP - 2048) == 2048);
  CHECK(code_of([&] { m.alloc_onchip(Space::kPsum, 4); }) == ErrorCode::kPsumOverflow);
  CHECK(m.allocator(Space::kPsum).peak() == kPsumPP);
  // The SBUF allocator is independent of PSUM.
  CHECK(m.allocator(Space::kSbuf).used() == kSbufPP);

  Memory aligned(cfg(), false, 64);
  CHECK(aligned.alloc_onchip(Space::kSbuf, 3) == 0);
  CHECK(aligned.alloc_onchip(Space::kSbuf, 3) == 64);
}

// ------------------------------------------------------------------------------------------------
// resolve / check_bounds

TEST_CASE("Memory::resolve of in-bounds operands", "[memory][resolve]") {
  Memory m(cfg(), true);
  const auto origin = m.resolve(Operand::tile(Space::kSbuf, DType::kFloat32, 0, 0, 1, {1}));
  REQUIRE(origin.valid());
  const auto v = m.resolve(Operand::tile(Space::kSbuf, DType::kBFloat16, 256, 3, 4, {2, 8}));
  REQUIRE(v.valid());
  // Partitions lie kHostPad bytes further apart on the host than their size (MemoryConfig::host_pitch).
  const int64_t sp = kSbufPP + MemoryConfig::kHostPad, pp = kPsumPP + MemoryConfig::kHostPad;
  CHECK(cfg().host_pitch(false) == sp);
  CHECK(cfg().host_pitch(true) == pp);
  CHECK(sp % 4096 != 0);
  CHECK(v.base - origin.base == 3 * sp + 256);
  CHECK(v.partition_stride_bytes == sp);
  CHECK(v.partitions == 4);
  CHECK(v.dtype == DType::kBFloat16);
  CHECK(v.nfree == 2);
  CHECK(v.size[0] == 2);
  CHECK(v.size[1] == 8);
  CHECK(v.stride[0] == 8);
  CHECK(v.stride[1] == 1);
  CHECK(v.at(2, 9) - origin.base == 5 * sp + 256 + 9 * 2);

  // The last byte of the last partition is addressable.
  const auto last = m.resolve(Operand::tile(Space::kSbuf, DType::kFloat32, kSbufPP - 4, 127, 1, {1}));
  CHECK(last.base - origin.base == 127 * sp + kSbufPP - 4);

  const auto p0 = m.resolve(Operand::tile(Space::kPsum, DType::kFloat32, 0, 0, 1, {1}));
  const auto p = m.resolve(Operand::tile(Space::kPsum, DType::kFloat32, 2048, 10, 8, {512}));
  CHECK(p.base - p0.base == 10 * pp + 2048);
  CHECK(p.partition_stride_bytes == pp);

  // Writes through a view land where a second view of the same bytes reads them.
  nsim::store_f32(DType::kFloat32, m.resolve(Operand::tile(Space::kSbuf, DType::kFloat32, 64, 7, 1, {4})).at(0, 2), 6.5f);
  CHECK(nsim::load_f32(DType::kFloat32, m.resolve(Operand::tile(Space::kSbuf, DType::kFloat32, 72, 7, 1, {1})).base) == 6.5f);

  // Absent operand: empty view.
  CHECK_FALSE(m.resolve(Operand{}).valid());

  // Without storage: a view with the pattern but no memory.
  Memory nostore(cfg(), false);
  const auto ns = nostore.resolve(Operand::tile(Space::kSbuf, DType::kFloat32, 0, 0, 128, {16}));
  CHECK_FALSE(ns.valid());
  CHECK(ns.partitions == 128);
  CHECK(ns.elems() == 16);
}

TEST_CASE("Memory::resolve of HBM operands", "[memory][resolve]") {
  Memory m(cfg(), true);
  m.alloc_hbm("a", {3}, DType::kFloat32);
  const HbmTensor& t = m.alloc_hbm("t", {4, 16}, DType::kFloat32);
  REQUIRE(t.addr == 64);
  Operand o = t.whole();
  o.offset += 8;  // start at column 2
  o.nfree = 1;
  o.size[0] = 4;
  const auto v = m.resolve(o);
  REQUIRE(v.valid());
  CHECK(v.base == m.hbm_data("t") + 8);
  CHECK(v.partition_stride_bytes == 16 * 4);
  CHECK(v.partitions == 4);
  nsim::store_f32(DType::kFloat32, v.at(3, 1), 1.25f);
  CHECK(nsim::load_f32(DType::kFloat32, m.hbm_data("t") + (3 * 16 + 3) * 4) == 1.25f);
}

TEST_CASE("Memory bounds errors", "[memory][resolve]") {
  Memory m(cfg(), true);
  m.alloc_hbm("a", {15}, DType::kFloat32);  // [0, 60)
  const HbmTensor& t = m.alloc_hbm("t", {4, 8}, DType::kFloat32);  // [64, 192)

  // SBUF: bytes past the capacity of a partition.
  CHECK(code_of([&] { m.resolve(Operand::tile(Space::kSbuf, DType::kFloat32, kSbufPP - 16, 0, 128, {8})); }) ==
        ErrorCode::kOutOfBounds);
  CHECK(code_of([&] { m.resolve(Operand::tile(Space::kSbuf, DType::kFloat32, kSbufPP, 0, 1, {1})); }) ==
        ErrorCode::kOutOfBounds);
  CHECK_NOTHROW(m.resolve(Operand::tile(Space::kSbuf, DType::kFloat32, kSbufPP - 32, 0, 128, {8})));
  // Negative start (negative offset, or a negative stride running below 0).
  CHECK(code_of([&] { m.resolve(Operand::tile(Space::kSbuf, DType::kFloat32, -4, 0, 1, {1})); }) ==
        ErrorCode::kOutOfBounds);
  {
    Operand neg = pattern(Space::kSbuf, DType::kFloat32, 8, {4}, {-1});  // elements 2, 1, 0, -1
    CHECK(code_of([&] { m.resolve(neg); }) == ErrorCode::kOutOfBounds);
    neg.offset = 12;
    CHECK_NOTHROW(m.resolve(neg));
  }
  // PSUM capacity is 16 KiB per partition.
  CHECK(code_of([&] { m.resolve(Operand::tile(Space::kPsum, DType::kFloat32, 16384 - 4, 0, 1, {2})); }) ==
        ErrorCode::kOutOfBounds);
  // Partitions beyond 128 through start_partition.
  CHECK(code_of([&] { m.resolve(Operand::tile(Space::kSbuf, DType::kFloat32, 0, 100, 29, {1})); }) ==
        ErrorCode::kOutOfBounds);
  CHECK(code_of([&] { m.resolve(Operand::tile(Space::kPsum, DType::kFloat32, 0, 127, 2, {1})); }) ==
        ErrorCode::kOutOfBounds);
  CHECK_NOTHROW(m.resolve(Operand::tile(Space::kSbuf, DType::kFloat32, 0, 100, 28, {1})));
  // More than 128 partitions.
  CHECK(code_of([&] { m.resolve(Operand::tile(Space::kSbuf, DType::kFloat32, 0, 0, 129, {1})); }) ==
        ErrorCode::kTooManyPartitions);
  CHECK(code_of([&] { m.check_bounds(Operand::tile(Space::kPsum, DType::kFloat32, 0, 0, 256, {1}), "x"); }) ==
        ErrorCode::kTooManyPartitions);

  // HBM view running past the end of its tensor.
  {
    Operand o = t.whole();
    CHECK_NOTHROW(m.resolve(o));
    o.offset += 4;
    CHECK(code_of([&] { m.resolve(o); }) == ErrorCode::kOutOfBounds);
    o = t.whole();
    o.num_partitions = 5;
    CHECK(code_of([&] { m.resolve(o); }) == ErrorCode::kOutOfBounds);
  }
  // HBM view in no tensor: in the alignment gap, after the last tensor, before address 0.
  CHECK(code_of([&] { m.resolve(Operand::tile(Space::kHbm, DType::kFloat32, 60, 0, 1, {1})); }) ==
        ErrorCode::kOutOfBounds);
  CHECK(code_of([&] { m.resolve(Operand::tile(Space::kHbm, DType::kFloat32, 4096, 0, 1, {1})); }) ==
        ErrorCode::kOutOfBounds);
  CHECK(code_of([&] { m.resolve(Operand::tile(Space::kHbm, DType::kFloat32, -64, 0, 1, {4})); }) ==
        ErrorCode::kOutOfBounds);
  // A view spanning two tensors is not inside one tensor.
  CHECK(code_of([&] { m.resolve(Operand::tile(Space::kHbm, DType::kFloat32, 0, 0, 1, {40})); }) ==
        ErrorCode::kOutOfBounds);

  // The error message names the caller's context.
  try {
    m.check_bounds(Operand::tile(Space::kSbuf, DType::kFloat32, kSbufPP, 0, 1, {1}), "my_operand");
    FAIL("expected nsim::Error");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kOutOfBounds);
    CHECK(e.message().find("my_operand") != std::string::npos);
  }
}

// ------------------------------------------------------------------------------------------------
// Operand helpers

TEST_CASE("Operand::byte_extent", "[memory][operand]") {
  // Contiguous.
  CHECK(Operand::tile(Space::kSbuf, DType::kFloat32, 100, 0, 128, {4, 128}).byte_extent() ==
        std::make_pair(int64_t{100}, int64_t{100 + 512 * 4}));
  // Strided: last element at 3*16 + 7*2 = 62.
  CHECK(pattern(Space::kSbuf, DType::kFloat32, 100, {4, 8}, {16, 2}).byte_extent() ==
        std::make_pair(int64_t{100}, int64_t{100 + 63 * 4}));
  // Negative stride: elements 0, -1, ..., -7 relative to offset.
  CHECK(pattern(Space::kSbuf, DType::kFloat32, 100, {8}, {-1}).byte_extent() ==
        std::make_pair(int64_t{100 - 28}, int64_t{104}));
  // Mixed signs: outer -8 (3 steps: -24), inner +1 (7): [offset-24, offset+8) elements.
  CHECK(pattern(Space::kSbuf, DType::kBFloat16, 1000, {4, 8}, {-8, 1}).byte_extent() ==
        std::make_pair(int64_t{1000 - 48}, int64_t{1000 + 16}));
  // Stride 0 (broadcast): one element.
  CHECK(pattern(Space::kSbuf, DType::kFloat32, 64, {128}, {0}).byte_extent() ==
        std::make_pair(int64_t{64}, int64_t{68}));
  CHECK(pattern(Space::kSbuf, DType::kBFloat16, 64, {16, 32}, {0, 1}).byte_extent() ==
        std::make_pair(int64_t{64}, int64_t{128}));
  // No free dims: one element.
  CHECK(pattern(Space::kSbuf, DType::kInt8, 7, {}, {}).byte_extent() == std::make_pair(int64_t{7}, int64_t{8}));
  // HBM rows count: 4 rows of 8, 16 elements apart.
  {
    Operand o = pattern(Space::kHbm, DType::kFloat32, 256, {8}, {1});
    o.num_partitions = 4;
    o.partition_step = 16;
    CHECK(o.byte_extent() == std::make_pair(int64_t{256}, int64_t{256 + (3 * 16 + 8) * 4}));
    o.partition_step = -16;  // rows going down
    CHECK(o.byte_extent() == std::make_pair(int64_t{256 - 48 * 4}, int64_t{256 + 32}));
  }
  // On-chip partitions do not add to the per-partition extent.
  {
    Operand o = Operand::tile(Space::kSbuf, DType::kFloat32, 0, 0, 128, {8});
    o.partition_step = 1000;  // ignored on-chip
    CHECK(o.byte_extent() == std::make_pair(int64_t{0}, int64_t{32}));
  }
}

TEST_CASE("Operand::elems_per_partition and total_elems", "[memory][operand]") {
  CHECK(Operand::tile(Space::kSbuf, DType::kFloat32, 0, 0, 128, {2, 3, 4}).elems_per_partition() == 24);
  CHECK(Operand::tile(Space::kSbuf, DType::kFloat32, 0, 0, 128, {2, 3, 4}).total_elems() == 128 * 24);
  CHECK(pattern(Space::kSbuf, DType::kFloat32, 0, {}, {}).elems_per_partition() == 1);
  CHECK(pattern(Space::kSbuf, DType::kFloat32, 0, {5, 1, 7}, {0, 0, 0}).elems_per_partition() == 35);
}

TEST_CASE("Operand::contiguous_runs_per_partition", "[memory][operand]") {
  // [128, 4, 128] contiguous: one run.
  CHECK(Operand::tile(Space::kSbuf, DType::kFloat32, 0, 0, 128, {4, 128}).contiguous_runs_per_partition() == 1);
  CHECK(Operand::tile(Space::kSbuf, DType::kBFloat16, 0, 0, 128, {2, 3, 4, 5}).contiguous_runs_per_partition() == 1);
  // Inner stride 2: every element is its own run.
  CHECK(pattern(Space::kSbuf, DType::kFloat32, 0, {4, 128}, {256, 2}).contiguous_runs_per_partition() == 512);
  // Outer gap: one run per row.
  CHECK(pattern(Space::kSbuf, DType::kFloat32, 0, {4, 128}, {256, 1}).contiguous_runs_per_partition() == 4);
  // Gap only at the outermost of three dims.
  CHECK(pattern(Space::kSbuf, DType::kFloat32, 0, {2, 4, 8}, {64, 8, 1}).contiguous_runs_per_partition() == 2);
  // Gap in the middle.
  CHECK(pattern(Space::kSbuf, DType::kFloat32, 0, {2, 4, 8}, {32, 16, 1}).contiguous_runs_per_partition() == 8);
  // Broadcast inner dim: each element is a run; negative stride too.
  CHECK(pattern(Space::kSbuf, DType::kFloat32, 0, {16}, {0}).contiguous_runs_per_partition() == 16);
  CHECK(pattern(Space::kSbuf, DType::kFloat32, 64, {16}, {-1}).contiguous_runs_per_partition() == 16);
  // Size-1 outer dims with any stride do not split the run.
  CHECK(pattern(Space::kSbuf, DType::kFloat32, 0, {1, 8}, {999, 1}).contiguous_runs_per_partition() == 1);
  // No free dims: one element, one run.
  CHECK(pattern(Space::kSbuf, DType::kFloat32, 0, {}, {}).contiguous_runs_per_partition() == 1);
}

TEST_CASE("Operand::contiguous_runs_per_partition ignores the stride of a size-1 inner dim",
          "[memory][operand]") {
  // [4, 1] with strides {1, 7}: elements 0, 1, 2, 3 -- one contiguous run (the inner dim has one
  // element, so its stride never applies). Same bytes as [4] stride 1.
  CHECK(pattern(Space::kSbuf, DType::kFloat32, 0, {4}, {1}).contiguous_runs_per_partition() == 1);
  CHECK(pattern(Space::kSbuf, DType::kFloat32, 0, {4, 1}, {1, 7}).contiguous_runs_per_partition() == 1);
}

TEST_CASE("Operand::tile helper", "[memory][operand]") {
  const Operand o = Operand::tile(Space::kSbuf, DType::kBFloat16, 64, 2, 16, {3, 4, 5});
  CHECK(o.space == Space::kSbuf);
  CHECK(o.dtype == DType::kBFloat16);
  CHECK(o.offset == 64);
  CHECK(o.start_partition == 2);
  CHECK(o.num_partitions == 16);
  CHECK(o.nfree == 3);
  CHECK(o.size[0] == 3);
  CHECK(o.size[1] == 4);
  CHECK(o.size[2] == 5);
  CHECK(o.stride[0] == 20);
  CHECK(o.stride[1] == 5);
  CHECK(o.stride[2] == 1);
  CHECK(o.partition_step == 0);  // on-chip: unused
  CHECK(o.present());
  CHECK(o.inner_stride_bytes() == 2);

  const Operand h = Operand::tile(Space::kHbm, DType::kFloat32, 128, 0, 8, {6, 7});
  CHECK(h.partition_step == 42);  // rows are back to back
  CHECK(h.stride[0] == 7);
  CHECK(h.stride[1] == 1);
  CHECK(h.byte_extent() == std::make_pair(int64_t{128}, int64_t{128 + 8 * 42 * 4}));

  const Operand s = Operand::tile(Space::kPsum, DType::kFloat32, 0, 0, 128, {});
  CHECK(s.nfree == 0);
  CHECK(s.elems_per_partition() == 1);
  CHECK(s.inner_stride_bytes() == 0);

  CHECK_FALSE(Operand{}.present());
  CHECK(o.str() == "bfloat16@sbuf[2:18]+64 [3,4,5][20,5,1]");
}

// ------------------------------------------------------------------------------------------------
// Storage reused through the buffer pool (memory/buffer.h)

TEST_CASE("Memory: storage taken from the pool is filled with the sentinel again", "[memory][buffer]") {
  const auto all_nan = [](const Memory& m, Space sp, int64_t bytes_pp, int parts) {
    Operand o = pattern(sp, DType::kFloat32, 0, {bytes_pp / 4}, {1});
    o.num_partitions = static_cast<uint32_t>(parts);
    const nsim::isa::TileView v = m.resolve(o);
    for (int p = 0; p < parts; ++p)
      for (int64_t i = 0; i < bytes_pp / 4; ++i) {
        float x;
        std::memcpy(&x, v.base + p * v.partition_stride_bytes + i * 4, 4);
        if (!std::isnan(x)) return false;
      }
    return true;
  };
  for (int round = 0; round < 3; ++round) {
    Memory m(cfg(), true);
    INFO("round " << round << ", pooled bytes before " << nsim::memory::Buffer::pooled_bytes());
    CHECK(all_nan(m, Space::kSbuf, kSbufPP, 128));
    CHECK(all_nan(m, Space::kPsum, kPsumPP, 128));
    const HbmTensor& t = m.alloc_hbm("x", {64, 32}, DType::kFloat32);
    float first;
    std::memcpy(&first, m.hbm_data("x"), 4);
    CHECK(std::isnan(first));
    CHECK(t.bytes == 64 * 32 * 4);
    // dirty every byte before the storage goes back to the pool
    Operand all = pattern(Space::kSbuf, DType::kUInt8, 0, {kSbufPP}, {1});
    all.num_partitions = 128;
    const nsim::isa::TileView v = m.resolve(all);
    std::memset(v.base, 0x11, static_cast<size_t>(128 * kSbufPP));
    Operand ps = pattern(Space::kPsum, DType::kUInt8, 0, {kPsumPP}, {1});
    ps.num_partitions = 128;
    std::memset(m.resolve(ps).base, 0x22, static_cast<size_t>(128 * kPsumPP));
    std::memset(m.hbm_data("x"), 0x33, 64 * 32 * 4);
  }
  CHECK(nsim::memory::Buffer::pooled_bytes() > 0);
  CHECK(nsim::memory::Buffer::pooled_bytes() <= nsim::memory::Buffer::kPoolBytes);
}

TEST_CASE("Memory: on-chip storage holds the sentinel as far as operands reach, written bytes kept", "[memory][buffer]") {
  const auto dirty = [] {  // a Memory whose SBUF goes back to the pool full of 0x11 bytes
    Memory m(cfg(), true);
    Operand all = pattern(Space::kSbuf, DType::kUInt8, 0, {kSbufPP}, {1});
    all.num_partitions = 128;
    std::memset(m.resolve(all).base, 0x11, static_cast<size_t>(128 * kSbufPP));
  };
  const auto nan_at = [](const nsim::isa::TileView& v, int64_t from_base, uint32_t p) {
    float x;
    std::memcpy(&x, v.base + p * v.partition_stride_bytes + from_base, 4);
    return std::isnan(x);
  };
  dirty();
  {
    Memory m(cfg(), true);  // takes the dirty block from the pool
    Operand a = pattern(Space::kSbuf, DType::kFloat32, 0, {16}, {1});
    a.num_partitions = 128;
    const nsim::isa::TileView va = m.resolve(a);
    CHECK(nan_at(va, 0, 0));
    CHECK(nan_at(va, 60, 127));
    std::memset(va.base + 5 * va.partition_stride_bytes, 0x11, 64);  // a kernel writes partition 5
    Operand far = pattern(Space::kSbuf, DType::kFloat32, 150000, {8}, {1});
    far.num_partitions = 128;
    const nsim::isa::TileView vf = m.resolve(far);
    for (uint32_t p : {0u, 5u, 127u}) CHECK((nan_at(vf, 0, p) && nan_at(vf, 28, p)));
    uint8_t kept[64];
    std::memcpy(kept, m.resolve(a).base + 5 * va.partition_stride_bytes, 64);
    CHECK(kept[0] == 0x11);  // filling further did not overwrite it
    CHECK(kept[63] == 0x11);
  }
  dirty();
  {
    // an on-chip indirect side (tensor_copy with a runtime source offset) may reach rows past its own
    // extent: 10 rows of 4096 fp32, so byte 9 * 16384 + 60 of the partition
    Memory m(cfg(), true);
    const Operand dst = pattern(Space::kSbuf, DType::kFloat32, 0, {16}, {1});
    const Operand src = pattern(Space::kSbuf, DType::kFloat32, 0, {16}, {1});
    const Operand offs = pattern(Space::kSbuf, DType::kInt32, 64, {1}, {1});
    nsim::isa::Instr in = nsim::isa::make_instr(nsim::isa::Opcode::kTensorCopy, nsim::isa::Engine::kVector,
                                                {dst, src, offs});
    in.iimm[0] = 10;
    in.iimm[1] = 4096;
    REQUIRE(nsim::isa::slot_extent(in, 1).second == 9 * 16384 + 64);
    const nsim::isa::TileView v = m.resolve_slot(in, 1);
    CHECK(nan_at(v, 9 * 16384 + 60, 0));
  }
}

TEST_CASE("Memory: on-chip fills climbing a byte at a time reach every partition, written bytes kept",
          "[memory][buffer]") {
  // Operands reaching a little further each time (fill_onchip_to fills partition 0 and copies it into the others,
  // each time from where the last fill ended, at any byte alignment), over a pooled block left dirty.
  {
    Memory m(cfg(), true);
    Operand all = pattern(Space::kSbuf, DType::kUInt8, 0, {kSbufPP}, {1});
    all.num_partitions = 128;
    std::memset(m.resolve(all).base, 0x11, static_cast<size_t>(128 * kSbufPP));
  }
  Memory m(cfg(), true);
  Operand head = pattern(Space::kSbuf, DType::kUInt8, 0, {3}, {1});
  head.num_partitions = 128;
  const nsim::isa::TileView vh = m.resolve(head);
  vh.base[77 * vh.partition_stride_bytes + 1] = 0x5A;  // a kernel writes byte 1 of partition 77
  uint8_t nan_bytes[4];
  nsim::store_f32(DType::kFloat32, nan_bytes, std::numeric_limits<float>::quiet_NaN());
  int64_t reach = 3;
  for (int step = 0; step < 60; ++step) {
    reach = std::min<int64_t>(kSbufPP, reach + 1 + std::min<int64_t>(reach * 3 / 7, 9001));  // 5, 7, 11, ...
    Operand o = pattern(Space::kSbuf, DType::kUInt8, 0, {reach}, {1});
    o.num_partitions = 128;
    const nsim::isa::TileView v = m.resolve(o);
    for (uint32_t p : {0u, 1u, 77u, 127u})
      for (int64_t b : {int64_t{0}, reach / 2, reach - 2, reach - 1}) {
        INFO("step " << step << " reach " << reach << " partition " << p << " byte " << b);
        const uint8_t got = v.base[p * v.partition_stride_bytes + b];
        CHECK(got == (p == 77 && b == 1 ? 0x5A : nan_bytes[b % 4]));
      }
  }
  CHECK(reach == kSbufPP);
}

TEST_CASE("Memory: an HBM tensor holds the sentinel when first read, unless overwritten whole", "[memory][hbm]") {
  {
    Memory m(cfg(), true);  // two blocks go back to the pool full of 0x33 bytes
    std::memset(m.hbm_data_to_overwrite(m.alloc_hbm("a", {256, 64}, DType::kFloat32).name), 0x33, 256 * 64 * 4);
    std::memset(m.hbm_data_to_overwrite(m.alloc_hbm("b", {256, 64}, DType::kFloat32).name), 0x33, 256 * 64 * 4);
  }
  Memory m(cfg(), true);
  const HbmTensor& in = m.alloc_hbm("in", {256, 64}, DType::kFloat32);
  const HbmTensor& out = m.alloc_hbm("out", {256, 64}, DType::kFloat32);
  const HbmTensor& idx = m.alloc_hbm("idx", {16}, DType::kInt32);
  // an input: written whole through hbm_data_to_overwrite, the bytes read back are the written ones
  uint8_t* w = m.hbm_data_to_overwrite("in");
  REQUIRE(w);
  for (int64_t i = 0; i < in.bytes; ++i) w[i] = static_cast<uint8_t>(i * 7);
  const nsim::isa::TileView vi = m.resolve(in.whole());
  CHECK(vi.base[0] == 0);
  CHECK(vi.base[1001] == static_cast<uint8_t>(1001 * 7));
  // never written: NaN when an operand reaches it, and in the storage handed out at the end
  const nsim::isa::TileView vo = m.resolve(out.whole());
  float x;
  std::memcpy(&x, vo.base + 4 * 1000, 4);
  CHECK(std::isnan(x));
  const nsim::memory::Buffer taken = m.take_hbm_data("out");
  REQUIRE(taken.size() == static_cast<size_t>(out.bytes));
  std::memcpy(&x, taken.data() + out.bytes - 4, 4);
  CHECK(std::isnan(x));
  // an integer tensor first read through hbm_data: 4 in every element
  for (int k = 0; k < 16; ++k) CHECK(nsim::load_int(DType::kInt32, m.hbm_data("idx") + 4 * k) == 4);
  CHECK(idx.bytes == 64);
}

TEST_CASE("Buffer: moves keep one owner and the pool stays bounded", "[memory][buffer]") {
  using nsim::memory::Buffer;
  Buffer a(1000);
  uint8_t* p = a.data();
  Buffer b = std::move(a);
  CHECK(a.empty());
  CHECK(a.data() == nullptr);
  CHECK(b.data() == p);
  CHECK(b.size() == 1000);
  {
    Buffer big(Buffer::kPoolBytes + 1);  // larger than the pool: freed, never kept
    CHECK(big.size() == Buffer::kPoolBytes + 1);
  }
  CHECK(Buffer::pooled_bytes() <= Buffer::kPoolBytes);
  b = Buffer();
  CHECK(b.empty());
}

TEST_CASE("Buffer: a zeroed buffer is all zero, whatever the pool holds", "[memory][buffer]") {
  using nsim::memory::Buffer;
  const size_t n = 3 << 20;
  {
    Buffer dirty(n);  // released without set_zero: not to be taken as zero
    std::memset(dirty.data(), 0x5a, n);
  }
  {
    Buffer z(n, Buffer::Zeroed{});
    bool all_zero = true;
    for (size_t i = 0; i < n; ++i) all_zero &= z.data()[i] == 0;
    CHECK(all_zero);
    z.data()[7] = 1;
    z.data()[7] = 0;
    z.set_zero();  // the owner cleaned up: the next zeroed buffer may be this one
  }
  Buffer again(n, Buffer::Zeroed{});
  bool all_zero = true;
  for (size_t i = 0; i < n; ++i) all_zero &= again.data()[i] == 0;
  CHECK(all_zero);
}
