// Functional semantics of every opcode, checked against straightforward double-precision references.
#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "isa/semantics/parallel.h"
#include "isa/semantics/semantics.h"

using namespace nsim;
using namespace nsim::isa;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

/// A tile over its own byte buffer. Not copyable (the view points into the buffer).
struct Tile {
  std::vector<uint8_t> buf;
  TileView v;

  Tile() = default;
  Tile(const Tile&) = delete;
  Tile& operator=(const Tile&) = delete;
  Tile(Tile&&) = default;
  Tile& operator=(Tile&&) = default;

  uint32_t P() const { return v.partitions; }
  int64_t n() const { return v.elems(); }
  float f(uint32_t p, int64_t j) const { return load_f32(v.dtype, v.at(p, j)); }
  int64_t i(uint32_t p, int64_t j) const { return load_int(v.dtype, v.at(p, j)); }
  uint32_t bits(uint32_t p, int64_t j) const {
    uint32_t b = 0;
    std::memcpy(&b, v.at(p, j), static_cast<size_t>(dtype_bytes(v.dtype)));
    return b;
  }
  void setf(uint32_t p, int64_t j, float x) { store_f32(v.dtype, v.at(p, j), x); }
  void seti(uint32_t p, int64_t j, int64_t x) { store_int(v.dtype, v.at(p, j), x); }
  void setbits(uint32_t p, int64_t j, uint32_t b) {
    std::memcpy(v.at(p, j), &b, static_cast<size_t>(dtype_bytes(v.dtype)));
  }
  template <class F>
  void fill(F fn) {
    for (uint32_t p = 0; p < P(); ++p)
      for (int64_t j = 0; j < n(); ++j) setf(p, j, fn(p, j));
  }
  template <class F>
  void filli(F fn) {
    for (uint32_t p = 0; p < P(); ++p)
      for (int64_t j = 0; j < n(); ++j) seti(p, j, fn(p, j));
  }
};

/// General pattern: free sizes/strides (elements), partition stride in elements. The buffer is
/// filled with the sentinel byte 0xEE.
Tile tile_ap(DType dt, uint32_t P, std::vector<int64_t> sizes, std::vector<int64_t> strides, int64_t pstride) {
  Tile t;
  const int64_t es = dtype_bytes(dt);
  int64_t extent = (P > 0 ? (P - 1) * pstride : 0) + 1;
  for (size_t d = 0; d < sizes.size(); ++d) extent += (sizes[d] - 1) * strides[d];
  t.buf.assign(static_cast<size_t>(extent * es + 16), 0xEE);
  t.v.base = t.buf.data();
  t.v.dtype = dt;
  t.v.partitions = P;
  t.v.partition_stride_bytes = pstride * es;
  t.v.nfree = static_cast<uint8_t>(sizes.size());
  for (size_t d = 0; d < sizes.size(); ++d) {
    t.v.size[d] = sizes[d];
    t.v.stride[d] = strides[d];
  }
  return t;
}

/// Contiguous row-major tile [P, sizes...] with `pad` spare elements after each partition's row.
Tile tile(DType dt, uint32_t P, std::vector<int64_t> sizes, int64_t pad = 0) {
  std::vector<int64_t> strides(sizes.size());
  int64_t s = 1;
  for (size_t d = sizes.size(); d-- > 0;) {
    strides[d] = s;
    s *= sizes[d];
  }
  return tile_ap(dt, P, sizes, strides, s + pad);
}

/// A (P,1) vector operand with the given values.
Tile vec(DType dt, std::vector<float> vals) {
  Tile t = tile(dt, static_cast<uint32_t>(vals.size()), {1});
  for (uint32_t p = 0; p < vals.size(); ++p) t.setf(p, 0, vals[p]);
  return t;
}

Instr mk(Opcode op, Engine e = Engine::kVector) {
  Instr in;
  in.op = op;
  in.engine = e;
  return in;
}

bool close(double got, double ref, double rel, double abs_tol = 1e-6) {
  if (std::isnan(ref)) return std::isnan(got);
  if (std::isinf(ref)) return got == ref;
  return std::fabs(got - ref) <= rel * std::fabs(ref) + abs_tol;
}

float bf16_round(float x) { return bf16_bits_to_f32(f32_to_bf16_bits(x)); }

std::mt19937 rng(12345);
float urand(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(rng); }

ErrorCode code_of(const Instr& in, const Views& vs, ArchState& st) {
  try {
    execute(in, vs, st);
  } catch (const Error& e) {
    return e.code();
  }
  return ErrorCode::kInternal;
}

}  // namespace

// -------------------------------------------------------------------------------------------------

TEST_CASE("TileView elems/at and row access over strided views", "[semantics]") {
  // [P=3, 2, 3] with inner stride 2 and outer stride 8, partition stride 20 elements.
  Tile t = tile_ap(DType::kFloat32, 3, {2, 3}, {8, 2}, 20);
  CHECK(t.v.elems() == 6);
  CHECK(t.v.at(1, 4) == t.buf.data() + (20 + 1 * 8 + 1 * 2) * 4);
  t.fill([](uint32_t p, int64_t j) { return static_cast<float>(p * 10 + j); });
  std::vector<float> row(6);
  read_row(t.v, 2, row.data());
  for (int j = 0; j < 6; ++j) CHECK(row[static_cast<size_t>(j)] == 20.0f + static_cast<float>(j));
  // A gap element (offset 1) keeps the sentinel.
  CHECK(t.buf[4] == 0xEE);

  Tile b = tile_ap(DType::kBFloat16, 2, {4}, {3}, 16);
  const float in[4] = {1.0f, 1.00390625f /* tie -> even 1.0 */, 3.3f, -2.5f};
  write_row(b.v, 1, in);
  CHECK(b.f(1, 0) == 1.0f);
  CHECK(b.f(1, 1) == 1.0f);
  CHECK(b.f(1, 2) == bf16_round(3.3f));
  CHECK(b.f(1, 3) == -2.5f);

  Tile scalar = tile_ap(DType::kInt16, 4, {}, {}, 3);  // nfree == 0: one element per partition
  CHECK(scalar.v.elems() == 1);
  const int64_t vals[1] = {-7};
  write_row_int(scalar.v, 3, vals);
  int64_t back = 0;
  read_row_int(scalar.v, 3, &back);
  CHECK(back == -7);
}

TEST_CASE("dma_copy pairs elements by flat index, casts, accumulates", "[semantics]") {
  ArchState st;
  SECTION("reshape [4,6] -> [2,3,4] fp32 and cast to bf16") {
    Tile src = tile(DType::kFloat32, 4, {6});
    src.fill([](uint32_t p, int64_t j) { return static_cast<float>(p * 6 + j) + 0.3f; });
    Tile dst = tile(DType::kFloat32, 2, {3, 4});
    Instr in = mk(Opcode::kDmaCopy, Engine::kSync);
    Views vs{};
    vs[0] = dst.v;
    vs[1] = src.v;
    execute(in, vs, st);
    for (uint32_t p = 0; p < 2; ++p)
      for (int64_t j = 0; j < 12; ++j) CHECK(dst.f(p, j) == static_cast<float>(p * 12 + j) + 0.3f);

    Tile dbf = tile(DType::kBFloat16, 24, {1});
    vs[0] = dbf.v;
    execute(in, vs, st);
    for (uint32_t p = 0; p < 24; ++p) CHECK(dbf.f(p, 0) == bf16_round(static_cast<float>(p) + 0.3f));
  }
  SECTION("stride-0 broadcast source and accumulate") {
    Tile src = tile_ap(DType::kFloat32, 2, {5}, {0}, 1);  // each partition: one value broadcast x5
    src.setf(0, 0, 1.5f);
    src.setf(1, 0, -2.0f);
    Tile dst = tile(DType::kFloat32, 2, {5}, 3);
    dst.fill([](uint32_t p, int64_t j) { return static_cast<float>(p + j); });
    Instr in = mk(Opcode::kDmaCopy, Engine::kSync);
    in.flags = kAccumulate;
    Views vs{};
    vs[0] = dst.v;
    vs[1] = src.v;
    execute(in, vs, st);
    for (uint32_t p = 0; p < 2; ++p)
      for (int64_t j = 0; j < 5; ++j)
        CHECK(dst.f(p, j) == static_cast<float>(p + j) + (p == 0 ? 1.5f : -2.0f));
    CHECK(dst.buf[5 * 4] == 0xEE);  // padding untouched
  }
  SECTION("same dtype is a byte copy (NaN payload kept); count mismatch throws") {
    Tile src = tile(DType::kBFloat16, 1, {3});
    src.setbits(0, 0, 0x7f81);
    src.setbits(0, 1, 0xff80);
    src.setbits(0, 2, 0x8000);
    Tile dst = tile(DType::kBFloat16, 3, {1});
    Views vs{};
    vs[0] = dst.v;
    vs[1] = src.v;
    execute(mk(Opcode::kDmaCopy, Engine::kSync), vs, st);
    CHECK(dst.bits(0, 0) == 0x7f81);
    CHECK(dst.bits(1, 0) == 0xff80);
    CHECK(dst.bits(2, 0) == 0x8000);
    Tile bad = tile(DType::kBFloat16, 2, {1});
    vs[0] = bad.v;
    CHECK(code_of(mk(Opcode::kDmaCopy, Engine::kSync), vs, st) == ErrorCode::kElementCountMismatch);
  }
}

TEST_CASE("row_f32 points into contiguous fp32 rows and converts every other row", "[semantics]") {
  Tile f = tile(DType::kFloat32, 3, {2, 4});  // contiguous rows: no copy
  f.fill([](uint32_t p, int64_t j) { return static_cast<float>(p * 100 + j) + 0.5f; });
  std::vector<float> scratch(8, -1.0f);
  for (uint32_t p = 0; p < 3; ++p) {
    const float* r = row_f32(f.v, p, scratch.data());
    CHECK(reinterpret_cast<const uint8_t*>(r) == f.v.at(p, 0));
    for (int64_t j = 0; j < 8; ++j) CHECK(r[j] == f.f(p, j));
  }
  CHECK(scratch[0] == -1.0f);
  Tile s = tile_ap(DType::kFloat32, 2, {4}, {2}, 8);  // every other element: converted into scratch
  s.fill([](uint32_t p, int64_t j) { return static_cast<float>(p * 10 + j); });
  Tile b = tile(DType::kBFloat16, 2, {4});  // bf16: widened into scratch
  b.fill([](uint32_t p, int64_t j) { return static_cast<float>(p * 10 + j); });
  for (const Tile* t : {&s, &b})
    for (uint32_t p = 0; p < 2; ++p) {
      const float* r = row_f32(t->v, p, scratch.data());
      CHECK(r == scratch.data());
      for (int64_t j = 0; j < 4; ++j) CHECK(r[j] == static_cast<float>(p * 10 + j));
    }
}

TEST_CASE("dma_copy between overlapping views reads all of the source first, apart row by row", "[semantics]") {
  ArchState st;
  // one buffer of 3 partitions x 8 fp32 (pitch 8); src = columns 0..5, dst = columns 1..6 of the same rows
  Tile whole = tile(DType::kFloat32, 3, {8});
  whole.fill([](uint32_t p, int64_t j) { return static_cast<float>(p * 10 + j); });
  TileView src = whole.v, dst = whole.v;
  src.size[0] = dst.size[0] = 6;
  dst.base += 4;
  Views vs{};
  vs[0] = dst;
  vs[1] = src;
  execute(mk(Opcode::kDmaCopy, Engine::kSync), vs, st);
  for (uint32_t p = 0; p < 3; ++p) {
    CHECK(whole.f(p, 0) == static_cast<float>(p * 10));
    for (int64_t j = 1; j <= 6; ++j) CHECK(whole.f(p, j) == static_cast<float>(p * 10 + j - 1));  // not smeared
    CHECK(whole.f(p, 7) == static_cast<float>(p * 10 + 7));
  }
  // dst's partition 0 overlaps src's partition 1 (dst one partition down): still a copy of the old values
  Tile w2 = tile(DType::kFloat32, 4, {4});
  w2.fill([](uint32_t p, int64_t j) { return static_cast<float>(p * 10 + j); });
  TileView s2 = w2.v, d2 = w2.v;
  s2.partitions = d2.partitions = 3;
  d2.base += w2.v.partition_stride_bytes;
  vs[0] = d2;
  vs[1] = s2;
  execute(mk(Opcode::kDmaCopy, Engine::kSync), vs, st);
  for (uint32_t p = 1; p < 4; ++p)
    for (int64_t j = 0; j < 4; ++j) CHECK(w2.f(p, j) == static_cast<float>((p - 1) * 10 + j));
  // apart, with a strided destination (every other element), bits kept
  Tile a = tile(DType::kBFloat16, 2, {3});
  a.filli([](uint32_t, int64_t) { return 0; });
  a.setbits(0, 0, 0x7f81);
  a.setbits(1, 2, 0x3f80);
  Tile b = tile_ap(DType::kBFloat16, 2, {3}, {2}, 8);
  vs[0] = b.v;
  vs[1] = a.v;
  execute(mk(Opcode::kDmaCopy, Engine::kSync), vs, st);
  CHECK(b.bits(0, 0) == 0x7f81);
  CHECK(b.bits(1, 2) == 0x3f80);
  CHECK(b.buf[2] == 0xEE);  // between the strided elements: untouched
}

TEST_CASE("dma_transpose is a byte-exact 2-D transpose", "[semantics]") {
  ArchState st;
  Tile src = tile(DType::kBFloat16, 3, {5});
  for (uint32_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 5; ++j) src.setbits(i, j, 0x3f00u + i * 16 + static_cast<uint32_t>(j));
  src.setbits(1, 2, 0x7f85);  // NaN with payload
  Tile dst = tile(DType::kBFloat16, 5, {3}, 2);
  Views vs{};
  vs[0] = dst.v;
  vs[1] = src.v;
  execute(mk(Opcode::kDmaTranspose, Engine::kSync), vs, st);
  for (uint32_t j = 0; j < 5; ++j)
    for (int64_t i = 0; i < 3; ++i) CHECK(dst.bits(j, i) == src.bits(static_cast<uint32_t>(i), j));
  Tile bad = tile(DType::kBFloat16, 3, {5});
  vs[0] = bad.v;
  CHECK(code_of(mk(Opcode::kDmaTranspose, Engine::kSync), vs, st) == ErrorCode::kShapeMismatch);
}

TEST_CASE("dma_transpose with middle dims (iimm[0]): the 3-D / 4-D forms swap the first and last dims", "[semantics]") {
  // src [a = 3, m = 2, c = 4] (free elements k c + j), dst [c = 4, m = 2, a = 3] (free elements k a + i):
  // dst[j][k a + i] = src[i][k c + j], numpy's src.transpose(2, 1, 0) (the 4-D (3, 1, 2, 0) form is the same with
  // m the product of its two middle dims).
  ArchState st;
  Tile src = tile(DType::kBFloat16, 3, {8});
  for (uint32_t i = 0; i < 3; ++i)
    for (int64_t e = 0; e < 8; ++e) src.setbits(i, e, 0x3f00u + i * 16 + static_cast<uint32_t>(e));
  Tile dst = tile(DType::kBFloat16, 4, {6}, 2);
  Views vs{};
  vs[0] = dst.v;
  vs[1] = src.v;
  Instr in = mk(Opcode::kDmaTranspose, Engine::kSync);
  in.iimm[0] = 2;
  execute(in, vs, st);
  for (uint32_t j = 0; j < 4; ++j)
    for (int64_t k = 0; k < 2; ++k)
      for (int64_t i = 0; i < 3; ++i) CHECK(dst.bits(j, k * 3 + i) == src.bits(static_cast<uint32_t>(i), k * 4 + j));
  // the 2-D reading of the same operands (dst [8, 3]) does not fit dst [4, 6]: the middle count decides the shape
  in.iimm[0] = 0;
  CHECK(code_of(in, vs, st) == ErrorCode::kShapeMismatch);
  in.iimm[0] = 3;  // 8 elements are not 3 x c
  CHECK(code_of(in, vs, st) == ErrorCode::kShapeMismatch);
}

TEST_CASE("tensor_copy: bit-exact same dtype, fp32 path on Scalar, casts", "[semantics]") {
  ArchState st;
  Tile src = tile(DType::kInt32, 2, {3});
  src.filli([](uint32_t p, int64_t j) { return 16777217 + static_cast<int64_t>(p * 3 + j) * 2; });
  Tile dst = tile_ap(DType::kInt32, 2, {3}, {2}, 8);  // strided dst
  Views vs{};
  vs[0] = dst.v;
  vs[1] = src.v;
  execute(mk(Opcode::kTensorCopy, Engine::kVector), vs, st);
  for (uint32_t p = 0; p < 2; ++p)
    for (int64_t j = 0; j < 3; ++j) CHECK(dst.i(p, j) == src.i(p, j));
  // Scalar engine goes through fp32: 16777217 is not representable.
  execute(mk(Opcode::kTensorCopy, Engine::kScalar), vs, st);
  CHECK(dst.i(0, 0) == 16777216);

  Tile f = tile(DType::kFloat32, 2, {4});
  f.fill([](uint32_t p, int64_t j) { return 1.0f + static_cast<float>(p * 4 + j) * 0.001f; });
  f.setbits(1, 3, 0x7fc01234u);  // NaN payload
  Tile f2 = tile(DType::kFloat32, 2, {2, 2});
  vs[0] = f2.v;
  vs[1] = f.v;
  execute(mk(Opcode::kTensorCopy, Engine::kGpsimd), vs, st);
  CHECK(f2.bits(1, 3) == 0x7fc01234u);
  CHECK(f2.f(0, 2) == f.f(0, 2));
  Tile b = tile(DType::kBFloat16, 2, {4});
  vs[0] = b.v;
  execute(mk(Opcode::kTensorCopy, Engine::kVector), vs, st);
  for (int64_t j = 0; j < 3; ++j) CHECK(b.f(1, j) == bf16_round(f.f(1, j)));
  Tile bad = tile(DType::kBFloat16, 2, {5});
  vs[0] = bad.v;
  CHECK(code_of(mk(Opcode::kTensorCopy), vs, st) == ErrorCode::kElementCountMismatch);
}

TEST_CASE("tensor_copy: overlapping rows of one tile read whole before written, either direction", "[semantics]") {
  ArchState st;
  for (const int shift : {1, -1}) {
    Tile t = tile(DType::kFloat32, 3, {10});
    t.fill([](uint32_t p, int64_t j) { return static_cast<float>(p * 100 + j); });
    TileView src = t.v, dst = t.v;
    src.size[0] = dst.size[0] = 8;  // both contiguous: the rows are moved in place (memmove)
    (shift > 0 ? dst : src).base += 4;  // shift 1: element j + 1 = element j (j < 8); -1: element j = element j + 1
    Views vs{};
    vs[0] = dst;
    vs[1] = src;
    execute(mk(Opcode::kTensorCopy, Engine::kVector), vs, st);
    for (uint32_t p = 0; p < 3; ++p)
      for (int64_t j = 0; j < 10; ++j) {
        const int64_t from = shift > 0 ? (j >= 1 && j <= 8 ? j - 1 : j) : (j <= 7 ? j + 1 : j);
        INFO("shift " << shift << " partition " << p << " element " << j);
        CHECK(t.f(p, j) == static_cast<float>(p * 100 + from));
      }
  }
}

TEST_CASE("tensor_tensor fp32 ops vs double reference, strided and broadcast views", "[semantics]") {
  ArchState st;
  const uint32_t P = 4;
  Tile a = tile_ap(DType::kFloat32, P, {2, 4}, {9, 2}, 24);      // strided
  Tile b = tile_ap(DType::kFloat32, P, {8}, {0}, 1);            // stride-0 broadcast of one value
  Tile bb = tile(DType::kBFloat16, P, {8});
  a.fill([](uint32_t, int64_t) { return urand(-4.0f, 4.0f); });
  for (uint32_t p = 0; p < P; ++p) b.setf(p, 0, urand(0.5f, 3.0f));
  bb.fill([](uint32_t, int64_t) { return urand(-3.0f, 3.0f); });
  struct Case {
    AluOp op;
    double (*ref)(double, double);
  };
  const Case cases[] = {
      {AluOp::kAdd, [](double x, double y) { return x + y; }},
      {AluOp::kSubtract, [](double x, double y) { return x - y; }},
      {AluOp::kMultiply, [](double x, double y) { return x * y; }},
      {AluOp::kDivide, [](double x, double y) { return x / y; }},
      {AluOp::kMaximum, [](double x, double y) { return std::max(x, y); }},
      {AluOp::kMinimum, [](double x, double y) { return std::min(x, y); }},
      {AluOp::kGreater, [](double x, double y) { return x > y ? 1.0 : 0.0; }},
      {AluOp::kLessEqual, [](double x, double y) { return x <= y ? 1.0 : 0.0; }},
      {AluOp::kPower, [](double x, double y) { return std::pow(std::fabs(x), y); }},
  };
  for (const Case& c : cases) {
    INFO("op " << static_cast<int>(c.op));
    Tile d = tile(DType::kFloat32, P, {8});
    Tile dbf = tile(DType::kBFloat16, P, {4, 2});
    Instr in = mk(Opcode::kTensorTensor);
    in.alu0 = c.op;
    Views vs{};
    vs[0] = d.v;
    vs[2] = b.v;
    Tile absa = tile(DType::kFloat32, P, {8});
    absa.fill([&](uint32_t p, int64_t j) { return std::fabs(a.f(p, j)); });
    vs[1] = c.op == AluOp::kPower ? absa.v : a.v;
    execute(in, vs, st);
    vs[0] = dbf.v;
    vs[2] = bb.v;
    execute(in, vs, st);
    for (uint32_t p = 0; p < P; ++p)
      for (int64_t j = 0; j < 8; ++j) {
        const double x = a.f(p, j);
        CHECK(close(d.f(p, j), c.ref(x, b.f(p, 0)), 1e-5));
        CHECK(close(dbf.f(p, j), c.ref(x, bb.f(p, j)), 1e-2, 1e-2));
      }
  }
}

TEST_CASE("tensor_tensor integer paths: GpSimd exact int32, bit-vector ops", "[semantics]") {
  ArchState st;
  Tile a = tile(DType::kInt32, 2, {3});
  Tile b = tile(DType::kInt32, 2, {3});
  Tile d = tile(DType::kInt32, 2, {3});
  a.filli([](uint32_t p, int64_t j) { return 16777217 + static_cast<int64_t>(p * 3 + j); });
  b.filli([](uint32_t p, int64_t j) { return 2 * static_cast<int64_t>(p + j) + 1; });
  a.seti(1, 2, 2147483647);  // wraps
  b.seti(1, 2, 1);
  Instr in = mk(Opcode::kTensorTensor, Engine::kGpsimd);
  in.alu0 = AluOp::kAdd;
  Views vs{};
  vs[0] = d.v;
  vs[1] = a.v;
  vs[2] = b.v;
  execute(in, vs, st);
  for (uint32_t p = 0; p < 2; ++p)
    for (int64_t j = 0; j < 3; ++j) {
      if (p == 1 && j == 2) continue;
      CHECK(d.i(p, j) == a.i(p, j) + b.i(p, j));
    }
  CHECK(d.i(1, 2) == -2147483647 - 1);
  in.alu0 = AluOp::kMultiply;
  execute(in, vs, st);
  CHECK(d.i(0, 1) == 16777218ll * 3);
  CHECK(d.i(1, 1) == static_cast<int32_t>(static_cast<uint32_t>(16777221ll * 5)));
  // Vector engine: fp32 path loses the low bit above 2^24.
  in.engine = Engine::kVector;
  in.alu0 = AluOp::kAdd;
  execute(in, vs, st);
  CHECK(d.i(0, 1) == static_cast<int64_t>(static_cast<float>(16777218) + 3.0f));
  CHECK(d.i(0, 1) != 16777221);

  SECTION("bitwise and shifts on raw values") {
    Tile x = tile(DType::kUInt32, 1, {4});
    Tile y = tile(DType::kUInt32, 1, {4});
    Tile z = tile(DType::kUInt32, 1, {4});
    const uint32_t xv[4] = {0xF0F0F0F0u, 0x12345678u, 0xFFFFFFFFu, 0x80000001u};
    const uint32_t yv[4] = {0x0FF00FF0u, 4, 28, 31};
    for (int j = 0; j < 4; ++j) {
      x.seti(0, j, xv[j]);
      y.seti(0, j, yv[j]);
    }
    Instr bi = mk(Opcode::kTensorTensor);
    Views w{};
    w[0] = z.v;
    w[1] = x.v;
    w[2] = y.v;
    bi.alu0 = AluOp::kBitwiseAnd;
    execute(bi, w, st);
    for (int j = 0; j < 4; ++j) CHECK(static_cast<uint32_t>(z.i(0, j)) == (xv[j] & yv[j]));
    bi.alu0 = AluOp::kBitwiseXor;
    execute(bi, w, st);
    for (int j = 0; j < 4; ++j) CHECK(static_cast<uint32_t>(z.i(0, j)) == (xv[j] ^ yv[j]));
    bi.alu0 = AluOp::kBitwiseOr;
    execute(bi, w, st);
    for (int j = 0; j < 4; ++j) CHECK(static_cast<uint32_t>(z.i(0, j)) == (xv[j] | yv[j]));
    bi.alu0 = AluOp::kRightShift;
    execute(bi, w, st);
    for (int j = 1; j < 4; ++j) CHECK(static_cast<uint32_t>(z.i(0, j)) == (xv[j] >> yv[j]));
    bi.alu0 = AluOp::kLeftShift;
    execute(bi, w, st);
    for (int j = 1; j < 4; ++j) CHECK(static_cast<uint32_t>(z.i(0, j)) == static_cast<uint32_t>(xv[j] << yv[j]));
    // int32 logical right shift: -1 >> 28 = 15.
    Tile s = tile(DType::kInt32, 1, {1});
    Tile sh = tile(DType::kInt32, 1, {1});
    Tile o = tile(DType::kInt32, 1, {1});
    s.seti(0, 0, -1);
    sh.seti(0, 0, 28);
    w[0] = o.v;
    w[1] = s.v;
    w[2] = sh.v;
    bi.alu0 = AluOp::kRightShift;
    execute(bi, w, st);
    CHECK(o.i(0, 0) == 15);
  }
}

TEST_CASE("memset writes the immediate cast to dst dtype", "[semantics]") {
  ArchState st;
  Tile di = tile_ap(DType::kInt32, 3, {4}, {2}, 9);
  Instr in = mk(Opcode::kMemset);
  in.iimm[0] = 16777217;
  in.imm[0] = 5.0f;
  Views vs{};
  vs[0] = di.v;
  execute(in, vs, st);
  for (uint32_t p = 0; p < 3; ++p)
    for (int64_t j = 0; j < 4; ++j) CHECK(di.i(p, j) == 16777217);
  CHECK(di.buf[4] == 0xEE);
  Tile db = tile(DType::kBFloat16, 2, {3});
  in.imm[0] = 3.3f;
  vs[0] = db.v;
  execute(in, vs, st);
  for (uint32_t p = 0; p < 2; ++p)
    for (int64_t j = 0; j < 3; ++j) CHECK(db.f(p, j) == bf16_round(3.3f));
  Tile dn = tile(DType::kFloat32, 1, {2});
  in.imm[0] = -kInf;
  vs[0] = dn.v;
  execute(in, vs, st);
  CHECK(dn.f(0, 1) == -kInf);
}

TEST_CASE("tensor_scalar: immediates, (P,1) vectors, reverse flags, two ops", "[semantics]") {
  ArchState st;
  const uint32_t P = 3;
  Tile data = tile(DType::kFloat32, P, {2, 3});
  data.fill([](uint32_t, int64_t) { return urand(-2.0f, 2.0f); });
  Tile v0 = vec(DType::kFloat32, {2.0f, -1.0f, 0.5f});
  Tile v1 = vec(DType::kBFloat16, {3.0f, 4.0f, -5.0f});
  Tile dst = tile(DType::kFloat32, P, {6});
  Views vs{};
  vs[0] = dst.v;
  vs[1] = data.v;

  SECTION("imm subtract reversed, then multiply by vector") {
    Instr in = mk(Opcode::kTensorScalar);
    in.alu0 = AluOp::kSubtract;
    in.alu1 = AluOp::kMultiply;
    in.flags = kHasImm0 | kReverse0;
    in.imm[0] = 10.0f;
    vs[3] = v1.v;
    execute(in, vs, st);
    for (uint32_t p = 0; p < P; ++p)
      for (int64_t j = 0; j < 6; ++j) CHECK(close(dst.f(p, j), (10.0 - data.f(p, j)) * v1.f(p, 0), 1e-6));
  }
  SECTION("vector divide, reversed imm subtract as op1") {
    Instr in = mk(Opcode::kTensorScalar);
    in.alu0 = AluOp::kDivide;
    in.alu1 = AluOp::kSubtract;
    in.flags = kHasImm1 | kReverse1;
    in.imm[1] = 1.0f;
    vs[2] = v0.v;
    execute(in, vs, st);
    for (uint32_t p = 0; p < P; ++p)
      for (int64_t j = 0; j < 6; ++j) CHECK(close(dst.f(p, j), 1.0 - data.f(p, j) / v0.f(p, 0), 1e-6));
  }
  SECTION("single op, unary op ignores the operand") {
    Instr in = mk(Opcode::kTensorScalar);
    in.alu0 = AluOp::kAbs;
    in.flags = kHasImm0 | kReverse0;
    in.imm[0] = 0.0f;
    execute(in, vs, st);
    for (uint32_t p = 0; p < P; ++p)
      for (int64_t j = 0; j < 6; ++j) CHECK(dst.f(p, j) == std::fabs(data.f(p, j)));
  }
  SECTION("bit-vector ops on integers with immediates") {
    Tile di = tile(DType::kInt32, 2, {3});
    di.filli([](uint32_t p, int64_t j) { return static_cast<int64_t>(0x1234567 + p * 100 + static_cast<uint32_t>(j)); });
    Tile oi = tile(DType::kInt32, 2, {3});
    Instr in = mk(Opcode::kTensorScalar);
    in.alu0 = AluOp::kBitwiseAnd;
    in.alu1 = AluOp::kLeftShift;
    in.flags = kHasImm0 | kHasImm1;
    in.imm[0] = 255.0f;
    in.imm[1] = 4.0f;
    Views w{};
    w[0] = oi.v;
    w[1] = di.v;
    execute(in, w, st);
    for (uint32_t p = 0; p < 2; ++p)
      for (int64_t j = 0; j < 3; ++j) CHECK(oi.i(p, j) == ((di.i(p, j) & 255) << 4));
  }
}

TEST_CASE("load_stationary + multiply_moving: fp32 matmul, accumulate, bf16 dst", "[semantics]") {
  ArchState st;
  const uint32_t K = 8, M = 5, N = 7;
  Tile s = tile(DType::kBFloat16, K, {M});
  Tile m = tile_ap(DType::kBFloat16, K, {N}, {2}, 16);  // strided moving
  s.fill([](uint32_t, int64_t) { return urand(-1.0f, 1.0f); });
  m.fill([](uint32_t, int64_t) { return urand(-1.0f, 1.0f); });
  Tile d = tile(DType::kFloat32, M, {N});
  Views vs{};
  vs[0] = s.v;
  execute(mk(Opcode::kLoadStationary, Engine::kTensor), vs, st);
  CHECK(st.stationary.rows() == K);
  CHECK(st.stationary.cols() == M);
  CHECK(st.stationary_dtype == DType::kBFloat16);
  vs[0] = d.v;
  vs[1] = m.v;
  Instr mm = mk(Opcode::kMultiplyMoving, Engine::kTensor);
  execute(mm, vs, st);
  auto ref = [&](uint32_t i, int64_t n) {
    double acc = 0, mag = 0;
    for (uint32_t k = 0; k < K; ++k) {
      acc += static_cast<double>(s.f(k, i)) * m.f(k, n);
      mag += std::fabs(static_cast<double>(s.f(k, i)) * m.f(k, n));
    }
    return std::pair<double, double>{acc, mag};
  };
  for (uint32_t i = 0; i < M; ++i)
    for (int64_t n = 0; n < N; ++n) {
      auto [r, mag] = ref(i, n);
      CHECK(close(d.f(i, n), r, 1e-5, 1e-6 * mag));
    }
  mm.flags = kAccumulate;
  execute(mm, vs, st);
  for (uint32_t i = 0; i < M; ++i)
    for (int64_t n = 0; n < N; ++n) {
      auto [r, mag] = ref(i, n);
      CHECK(close(d.f(i, n), 2 * r, 1e-5, 2e-6 * mag));
    }
  // bf16 PSUM dst: accumulate rounds RNE each write.
  Tile db = tile(DType::kBFloat16, M, {N});
  db.fill([](uint32_t, int64_t) { return 1.0f; });
  vs[0] = db.v;
  execute(mm, vs, st);
  for (uint32_t i = 0; i < M; ++i)
    for (int64_t n = 0; n < N; ++n) CHECK(close(db.f(i, n), 1.0 + ref(i, n).first, 1e-2, 1e-2));

  SECTION("K mismatch throws kShapeMismatch") {
    Tile m2 = tile(DType::kBFloat16, K - 1, {N});
    vs[0] = d.v;
    vs[1] = m2.v;
    CHECK(code_of(mk(Opcode::kMultiplyMoving, Engine::kTensor), vs, st) == ErrorCode::kShapeMismatch);
  }
}

TEST_CASE("multiply_moving gives the same bits on 1, 2 and 4 host threads", "[semantics][parallel]") {
  // [128, 128] x [128, 520] bf16: big enough that the moving tile's conversion (>= 2^15 elements) and the
  // product (>= 2^21 multiply-adds) are shared between threads (isa/semantics/parallel.h); a strided
  // moving view, and a column tail past the last 32-column block; into fp32 and into bf16 PSUM, accumulating.
  const uint32_t K = 128, M = 128, N = 520;
  Tile s = tile(DType::kBFloat16, K, {M});
  Tile m = tile_ap(DType::kBFloat16, K, {N}, {1}, N + 8);
  s.fill([](uint32_t, int64_t) { return urand(-1.0f, 1.0f); });
  m.fill([](uint32_t, int64_t) { return urand(-4.0f, 4.0f); });
  // Another moving tile of the same shape, multiplied on one thread before each run: the conversion's
  // buffer then holds its values, so a row the run did not convert shows.
  Tile other = tile_ap(DType::kBFloat16, K, {N}, {1}, N + 8);
  other.fill([](uint32_t, int64_t) { return urand(-4.0f, 4.0f); });
  std::vector<std::vector<uint8_t>> results;
  for (int threads : {1, 2, 4}) {
    for (DType dt : {DType::kFloat32, DType::kBFloat16}) {
      sem::set_host_threads_for_testing(1);
      ArchState st;
      Views vs{};
      vs[0] = s.v;
      execute(mk(Opcode::kLoadStationary, Engine::kTensor), vs, st);
      Tile scratch = tile(DType::kFloat32, M, {N});
      vs[0] = scratch.v;
      vs[1] = other.v;
      Instr mm = mk(Opcode::kMultiplyMoving, Engine::kTensor);
      execute(mm, vs, st);
      sem::set_host_threads_for_testing(threads);
      Tile d = tile(dt, M, {N});
      d.fill([](uint32_t p, int64_t j) { return static_cast<float>((p + j) % 7); });
      vs[0] = d.v;
      vs[1] = m.v;
      mm.flags = kAccumulate;
      execute(mm, vs, st);
      results.push_back(d.buf);
    }
  }
  sem::set_host_threads_for_testing(0);
  for (size_t i = 2; i < results.size(); ++i) CHECK(results[i] == results[i % 2]);  // same dst dtype
}

TEST_CASE("multiply_moving transpose mode is bit-exact and double_row", "[semantics]") {
  ArchState st;
  const uint32_t K = 4, M = 3;
  Tile s = tile(DType::kBFloat16, K, {M});
  for (uint32_t k = 0; k < K; ++k)
    for (int64_t i = 0; i < M; ++i) s.setbits(k, i, 0x3f80u + k * 7 + static_cast<uint32_t>(i) * 3);
  s.setbits(1, 1, 0x7f81);  // NaN with payload
  s.setbits(2, 0, 0xff80);  // -inf
  s.setbits(3, 2, 0x8000);  // -0
  Views vs{};
  vs[0] = s.v;
  execute(mk(Opcode::kLoadStationary, Engine::kTensor), vs, st);
  // Permutation moving: column n takes row perm[n].
  const uint32_t perm[K] = {2, 0, 3, 1};
  Tile mv = tile(DType::kBFloat16, K, {K});
  mv.fill([&](uint32_t k, int64_t n) { return perm[n] == k ? 1.0f : 0.0f; });
  Tile d = tile(DType::kBFloat16, M, {K});
  vs[0] = d.v;
  vs[1] = mv.v;
  Instr in = mk(Opcode::kMultiplyMoving, Engine::kTensor);
  in.flags = kIsTranspose;
  execute(in, vs, st);
  for (uint32_t i = 0; i < M; ++i)
    for (int64_t n = 0; n < K; ++n) CHECK(d.bits(i, n) == s.bits(perm[n], i));
  // Without transpose mode NaN * 0 spreads through the fp32 matmul.
  in.flags = 0;
  execute(in, vs, st);
  CHECK(std::isnan(d.f(1, 0)));
  CHECK(std::isnan(d.f(1, 3)));

  SECTION("fp8 stationary into a 16-bit dst gives the raw byte") {
    Tile s8 = tile(DType::kFloat8E4M3, 2, {2});
    s8.fill([](uint32_t k, int64_t i) { return 1.5f + static_cast<float>(k * 2 + i); });
    Views w{};
    w[0] = s8.v;
    execute(mk(Opcode::kLoadStationary, Engine::kTensor), w, st);
    Tile id = tile(DType::kFloat8E4M3, 2, {2});
    id.fill([](uint32_t k, int64_t n) { return k == n ? 1.0f : 0.0f; });
    Tile o = tile(DType::kBFloat16, 2, {2});
    w[0] = o.v;
    w[1] = id.v;
    Instr t = mk(Opcode::kMultiplyMoving, Engine::kTensor);
    t.flags = kIsTranspose;
    execute(t, w, st);
    for (uint32_t i = 0; i < 2; ++i)
      for (int64_t k = 0; k < 2; ++k) CHECK(o.bits(i, k) == s8.bits(static_cast<uint32_t>(k), i));
  }
  SECTION("double_row: result = sum_k sum_r st[k,r,m] mv[k,r,n]") {
    const uint32_t K2 = 3, M2 = 2, N2 = 4;
    Tile s8 = tile(DType::kFloat8E4M3, K2, {2, M2});
    Tile m8 = tile(DType::kFloat8E4M3, K2, {2, N2});
    s8.fill([](uint32_t k, int64_t j) { return static_cast<float>((static_cast<int64_t>(k) * 3 + j) % 5) - 2.0f; });
    m8.fill([](uint32_t k, int64_t j) { return 0.5f * static_cast<float>((static_cast<int64_t>(k) + j) % 4); });
    Views w{};
    w[0] = s8.v;
    Instr ls = mk(Opcode::kLoadStationary, Engine::kTensor);
    ls.flags = kDoubleRow;
    execute(ls, w, st);
    Tile o = tile(DType::kFloat32, M2, {N2});
    w[0] = o.v;
    w[1] = m8.v;
    Instr mm = mk(Opcode::kMultiplyMoving, Engine::kTensor);
    mm.flags = kDoubleRow;
    execute(mm, w, st);
    for (uint32_t i = 0; i < M2; ++i)
      for (int64_t n = 0; n < N2; ++n) {
        double r = 0;
        for (uint32_t k = 0; k < K2; ++k)
          for (int64_t rr = 0; rr < 2; ++rr) r += static_cast<double>(s8.f(k, rr * M2 + i)) * m8.f(k, rr * N2 + n);
        CHECK(o.f(i, n) == static_cast<float>(r));
      }
  }
}

TEST_CASE("activation: f(data*scale + bias) with vectors and immediates", "[semantics]") {
  ArchState st;
  const uint32_t P = 3;
  Tile data = tile(DType::kFloat32, P, {2, 3});
  data.fill([](uint32_t, int64_t) { return urand(-1.5f, 1.5f); });
  Tile bias = vec(DType::kBFloat16, {0.5f, -0.25f, 1.0f});
  Tile scale = vec(DType::kFloat32, {2.0f, 0.5f, -1.0f});
  const ActFunc funcs[] = {ActFunc::kGelu, ActFunc::kSilu, ActFunc::kExp, ActFunc::kTanh, ActFunc::kPrelu};
  for (ActFunc f : funcs) {
    Tile dst = tile(DType::kFloat32, P, {6});
    Instr in = mk(Opcode::kActivation, Engine::kScalar);
    in.act = f;
    in.imm[1] = 0.1f;  // prelu alpha
    Views vs{};
    vs[0] = dst.v;
    vs[1] = data.v;
    vs[2] = bias.v;
    vs[3] = scale.v;
    execute(in, vs, st);
    for (uint32_t p = 0; p < P; ++p)
      for (int64_t j = 0; j < 6; ++j) {
        const double x = static_cast<double>(data.f(p, j)) * scale.f(p, 0) + bias.f(p, 0);
        double r = 0;
        switch (f) {
          case ActFunc::kGelu: r = 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); break;
          case ActFunc::kSilu: r = x / (1 + std::exp(-x)); break;
          case ActFunc::kExp: r = std::exp(x); break;
          case ActFunc::kTanh: r = std::tanh(x); break;
          default: r = x >= 0 ? x : 0.1 * x; break;
        }
        CHECK(close(dst.f(p, j), r, 1e-5));
      }
  }
  // Immediate scale/bias (imm[2], imm[3]) and a bf16 dst.
  Tile dst = tile(DType::kBFloat16, P, {6});
  Instr in = mk(Opcode::kActivation, Engine::kScalar);
  in.act = ActFunc::kSigmoid;
  in.imm[2] = 3.0f;
  in.imm[3] = -0.5f;
  Views vs{};
  vs[0] = dst.v;
  vs[1] = data.v;
  execute(in, vs, st);
  for (uint32_t p = 0; p < P; ++p)
    for (int64_t j = 0; j < 6; ++j)
      CHECK(close(dst.f(p, j), 1 / (1 + std::exp(-(3.0 * data.f(p, j) - 0.5))), 1e-2));
}

TEST_CASE("activation every function through the instruction", "[semantics]") {
  ArchState st;
  const ActFunc all[] = {
#define ACT(e, name, ...) ActFunc::e,
#include "isa/act_funcs.def"
#undef ACT
  };
  Tile data = tile(DType::kFloat32, 2, {4});
  const float xs[2][4] = {{0.25f, 0.5f, 1.0f, 2.0f}, {0.75f, 1.5f, 3.0f, 0.125f}};
  data.fill([&](uint32_t p, int64_t j) { return xs[p][j]; });
  for (ActFunc f : all) {
    Tile dst = tile(DType::kFloat32, 2, {4});
    Instr in = mk(Opcode::kActivation, Engine::kScalar);
    in.act = f;
    in.imm[2] = 1.0f;
    Views vs{};
    vs[0] = dst.v;
    vs[1] = data.v;
    execute(in, vs, st);
    for (uint32_t p = 0; p < 2; ++p)
      for (int64_t j = 0; j < 4; ++j) CHECK(dst.f(p, j) == act_apply(f, xs[p][j]));
  }
}

TEST_CASE("activation reduce registers persist across calls", "[semantics]") {
  ArchState st;
  const uint32_t P = 2;
  Tile a = tile(DType::kFloat32, P, {5});
  Tile b = tile(DType::kFloat32, P, {5});
  a.fill([](uint32_t, int64_t) { return urand(-1.0f, 1.0f); });
  b.fill([](uint32_t, int64_t) { return urand(-1.0f, 1.0f); });
  Tile dst = tile(DType::kFloat32, P, {5});
  Tile rr = tile(DType::kFloat32, P, {1});
  auto sum_exp = [](const Tile& t, uint32_t p) {
    double s = 0;
    for (int64_t j = 0; j < t.n(); ++j) s += std::exp(static_cast<double>(t.f(p, j)));
    return s;
  };
  Instr in = mk(Opcode::kActivation, Engine::kScalar);
  in.act = ActFunc::kExp;
  in.imm[2] = 1.0f;
  in.alu1 = AluOp::kAdd;
  in.reduce_cmd = ReduceCmd::kResetReduce;
  Views vs{};
  vs[0] = dst.v;
  vs[1] = a.v;
  vs[4] = rr.v;
  st.scalar_acc[0] = st.scalar_acc[1] = 100.0f;
  execute(in, vs, st);
  for (uint32_t p = 0; p < P; ++p) CHECK(close(rr.f(p, 0), sum_exp(a, p), 1e-5));
  in.reduce_cmd = ReduceCmd::kReduce;
  vs[1] = b.v;
  execute(in, vs, st);
  for (uint32_t p = 0; p < P; ++p) {
    CHECK(close(rr.f(p, 0), sum_exp(a, p) + sum_exp(b, p), 1e-5));
    CHECK(st.scalar_acc[p] == rr.f(p, 0));
  }
  // idle: registers untouched but still reported.
  in.reduce_cmd = ReduceCmd::kIdle;
  execute(in, vs, st);
  CHECK(close(rr.f(0, 0), sum_exp(a, 0) + sum_exp(b, 0), 1e-5));
  in.reduce_cmd = ReduceCmd::kReset;
  execute(in, vs, st);
  CHECK(rr.f(1, 0) == 0.0f);

  SECTION("activation_reduce forces reset_reduce; maximum reduce op") {
    Instr ar = mk(Opcode::kActivationReduce, Engine::kScalar);
    ar.act = ActFunc::kCopy;
    ar.imm[2] = 2.0f;
    ar.alu1 = AluOp::kMaximum;
    ar.reduce_cmd = ReduceCmd::kIdle;  // ignored
    st.scalar_acc[0] = st.scalar_acc[1] = 1e9f;
    Views w{};
    w[0] = dst.v;
    w[1] = a.v;
    w[4] = rr.v;
    execute(ar, w, st);
    for (uint32_t p = 0; p < P; ++p) {
      float mx = -kInf;
      for (int64_t j = 0; j < 5; ++j) mx = std::max(mx, 2.0f * a.f(p, j));
      CHECK(rr.f(p, 0) == mx);
    }
    ar.alu1 = AluOp::kAdd;
    execute(ar, w, st);
    for (uint32_t p = 0; p < P; ++p) {
      double s = 0;
      for (int64_t j = 0; j < 5; ++j) s += 2.0 * a.f(p, j);
      CHECK(close(rr.f(p, 0), s, 1e-5, 1e-6));
    }
  }
}

TEST_CASE("nc_transpose: exact, cast, gen2 TensorE NaN spreading", "[semantics]") {
  ArchState st;
  Tile data = tile(DType::kBFloat16, 3, {2, 2});
  data.fill([](uint32_t p, int64_t j) { return static_cast<float>(p * 4 + j) + 0.5f; });
  data.setbits(1, 2, 0x7f81);
  Tile dst = tile(DType::kBFloat16, 4, {3});
  Views vs{};
  vs[0] = dst.v;
  vs[1] = data.v;
  execute(mk(Opcode::kNcTranspose, Engine::kTensor), vs, st);
  for (uint32_t f = 0; f < 4; ++f)
    for (int64_t p = 0; p < 3; ++p) CHECK(dst.bits(f, p) == data.bits(static_cast<uint32_t>(p), f));
  Tile d32 = tile(DType::kFloat32, 4, {3});
  vs[0] = d32.v;
  execute(mk(Opcode::kNcTranspose, Engine::kVector), vs, st);
  CHECK(d32.f(3, 2) == 11.5f);
  CHECK(std::isnan(d32.f(2, 1)));
  CHECK(d32.f(2, 0) == 2.5f);
  // gen2 TensorE: NaN at data[1][2] spreads over dst row 2.
  st.generation = 2;
  execute(mk(Opcode::kNcTranspose, Engine::kTensor), vs, st);
  CHECK(std::isnan(d32.f(2, 0)));
  CHECK(std::isnan(d32.f(2, 2)));
  CHECK(d32.f(3, 2) == 11.5f);
}

TEST_CASE("tensor_reduce over trailing axes, negate, bit-vector", "[semantics]") {
  ArchState st;
  const uint32_t P = 3;
  Tile data = tile_ap(DType::kFloat32, P, {2, 3, 4}, {16, 5, 1}, 40);
  data.fill([](uint32_t, int64_t) { return urand(-2.0f, 2.0f); });
  SECTION("add over the last axis") {
    Tile dst = tile(DType::kFloat32, P, {2, 3});
    Instr in = mk(Opcode::kTensorReduce);
    in.alu0 = AluOp::kAdd;
    in.axis_count = 1;
    Views vs{};
    vs[0] = dst.v;
    vs[1] = data.v;
    execute(in, vs, st);
    for (uint32_t p = 0; p < P; ++p)
      for (int64_t g = 0; g < 6; ++g) {
        double s = 0;
        for (int64_t j = 0; j < 4; ++j) s += data.f(p, g * 4 + j);
        CHECK(close(dst.f(p, g), s, 1e-5, 1e-6));
      }
  }
  SECTION("max over all, negated; subtract left fold over last two axes") {
    Tile dst = tile(DType::kFloat32, P, {1});
    Instr in = mk(Opcode::kTensorReduce);
    in.alu0 = AluOp::kMaximum;
    in.axis_count = 0;
    in.flags = kNegate;
    Views vs{};
    vs[0] = dst.v;
    vs[1] = data.v;
    execute(in, vs, st);
    for (uint32_t p = 0; p < P; ++p) {
      float m = -kInf;
      for (int64_t j = 0; j < 24; ++j) m = std::max(m, data.f(p, j));
      CHECK(dst.f(p, 0) == -m);
    }
    Tile d2 = tile(DType::kFloat32, P, {2});
    in.alu0 = AluOp::kSubtract;
    in.axis_count = 2;
    in.flags = 0;
    vs[0] = d2.v;
    execute(in, vs, st);
    for (uint32_t p = 0; p < P; ++p)
      for (int64_t g = 0; g < 2; ++g) {
        double s = data.f(p, g * 12);
        for (int64_t j = 1; j < 12; ++j) s -= data.f(p, g * 12 + j);
        CHECK(close(d2.f(p, g), s, 1e-5, 1e-5));
      }
    Tile bad = tile(DType::kFloat32, P, {3});
    vs[0] = bad.v;
    CHECK(code_of(in, vs, st) == ErrorCode::kElementCountMismatch);
  }
  SECTION("bitwise_or / xor on raw integers") {
    Tile di = tile(DType::kUInt32, 2, {4});
    di.filli([](uint32_t p, int64_t j) { return static_cast<int64_t>(1u << (p * 8 + static_cast<uint32_t>(j) * 3)) | 0x80000000ll; });
    Tile o = tile(DType::kUInt32, 2, {1});
    Instr in = mk(Opcode::kTensorReduce);
    in.alu0 = AluOp::kBitwiseOr;
    Views vs{};
    vs[0] = o.v;
    vs[1] = di.v;
    execute(in, vs, st);
    for (uint32_t p = 0; p < 2; ++p) {
      int64_t r = 0;
      for (int64_t j = 0; j < 4; ++j) r |= di.i(p, j);
      CHECK(o.i(p, 0) == r);
    }
    in.alu0 = AluOp::kBitwiseXor;
    execute(in, vs, st);
    CHECK(o.i(0, 0) == ((1 | 8 | 64 | 512)));
  }
}

TEST_CASE("iota and affine_select causal mask", "[semantics]") {
  ArchState st;
  SECTION("iota int32 and fp32") {
    Tile d = tile(DType::kInt32, 4, {2, 3});
    Instr in = mk(Opcode::kIota, Engine::kGpsimd);
    in.iimm = {7, 100, 10, 2, 1, 3, 0, 1, 0, 1};  // offset 7, channel 100, [[10,2],[1,3]]
    Views vs{};
    vs[0] = d.v;
    execute(in, vs, st);
    for (uint32_t p = 0; p < 4; ++p)
      for (int64_t a = 0; a < 2; ++a)
        for (int64_t b = 0; b < 3; ++b) CHECK(d.i(p, a * 3 + b) == 7 + 100 * p + 10 * a + b);
    Tile f = tile(DType::kFloat32, 2, {4});
    in.iimm = {16777217, -1, 1, 4, 0, 1, 0, 1, 0, 1};
    vs[0] = f.v;
    execute(in, vs, st);
    CHECK(f.f(0, 0) == 16777216.0f);  // int32 value rounded to fp32
    CHECK(f.f(1, 3) == 16777220.0f);
    CHECK(f.f(0, 1) == 16777218.0f);
    Tile bad = tile(DType::kFloat32, 2, {5});
    vs[0] = bad.v;
    CHECK(code_of(in, vs, st) == ErrorCode::kShapeMismatch);
  }
  SECTION("affine_select: keep where p - j >= 0") {
    const uint32_t P = 6;
    const int64_t N = 6;
    Tile on_true = tile(DType::kBFloat16, P, {N});
    on_true.fill([](uint32_t p, int64_t j) { return static_cast<float>(p * 10 + j) + 0.25f; });
    Tile d = tile(DType::kBFloat16, P, {N});
    Instr in = mk(Opcode::kAffineSelect, Engine::kGpsimd);
    in.iimm = {0, 1, -1, static_cast<int32_t>(N), 0, 1, 0, 1, 0, 1};
    in.alu0 = AluOp::kGreaterEqual;
    in.imm[0] = -9984.0f;
    Views vs{};
    vs[0] = d.v;
    vs[1] = on_true.v;
    execute(in, vs, st);
    for (uint32_t p = 0; p < P; ++p)
      for (int64_t j = 0; j < N; ++j) CHECK(d.f(p, j) == (j <= p ? on_true.f(p, j) : -9984.0f));
    // fp32 dst with a bf16 on_true: cast path, -inf fill.
    Tile d32 = tile(DType::kFloat32, P, {N});
    in.imm[0] = -kInf;
    in.alu0 = AluOp::kGreater;  // strict: diagonal masked too
    vs[0] = d32.v;
    execute(in, vs, st);
    for (uint32_t p = 0; p < P; ++p)
      for (int64_t j = 0; j < N; ++j) CHECK(d32.f(p, j) == (j < p ? on_true.f(p, j) : -kInf));
  }
}

TEST_CASE("scalar_tensor_tensor and reciprocal", "[semantics]") {
  ArchState st;
  const uint32_t P = 3;
  Tile data = tile(DType::kFloat32, P, {4});
  Tile o1 = tile_ap(DType::kFloat32, P, {2, 2}, {0, 1}, 2);  // [2,2] with a broadcast outer dim
  data.fill([](uint32_t, int64_t) { return urand(-2.0f, 2.0f); });
  for (uint32_t p = 0; p < P; ++p)
    for (int64_t j = 0; j < 2; ++j) o1.setf(p, j, urand(-1.0f, 1.0f));
  Tile v0 = vec(DType::kFloat32, {1.5f, -2.0f, 0.25f});
  Tile dst = tile(DType::kFloat32, P, {4});
  Instr in = mk(Opcode::kScalarTensorTensor);
  in.alu0 = AluOp::kMultiply;
  in.alu1 = AluOp::kSubtract;
  in.flags = kReverse1;
  Views vs{};
  vs[0] = dst.v;
  vs[1] = data.v;
  vs[2] = v0.v;
  vs[3] = o1.v;
  execute(in, vs, st);
  for (uint32_t p = 0; p < P; ++p)
    for (int64_t j = 0; j < 4; ++j)
      CHECK(close(dst.f(p, j), o1.f(p, j % 2) - static_cast<double>(data.f(p, j)) * v0.f(p, 0), 1e-6));
  in.flags = kHasImm0 | kReverse0;
  in.alu0 = AluOp::kDivide;
  in.alu1 = AluOp::kAdd;
  in.imm[0] = 3.0f;
  execute(in, vs, st);
  for (uint32_t p = 0; p < P; ++p)
    for (int64_t j = 0; j < 4; ++j) CHECK(close(dst.f(p, j), 3.0 / data.f(p, j) + o1.f(p, j % 2), 1e-5));

  Tile r = tile(DType::kFloat32, P, {4});
  data.setf(0, 0, 0.0f);
  data.setf(0, 1, -0.0f);
  vs = Views{};
  vs[0] = r.v;
  vs[1] = data.v;
  execute(mk(Opcode::kReciprocal), vs, st);
  CHECK(r.f(0, 0) == kInf);
  CHECK(r.f(0, 1) == -kInf);
  for (uint32_t p = 0; p < P; ++p)
    for (int64_t j = (p == 0 ? 2 : 0); j < 4; ++j) CHECK(close(r.f(p, j), 1.0 / data.f(p, j), 1e-6));
}

TEST_CASE("nc_stream_shuffle: broadcast, permutation, keep, in-place, errors", "[semantics]") {
  ArchState st;
  SECTION("broadcast one row to 32") {
    Tile src = tile(DType::kFloat32, 1, {3});
    src.fill([](uint32_t, int64_t j) { return static_cast<float>(j) + 0.5f; });
    Tile dst = tile(DType::kFloat32, 32, {3});
    Instr in = mk(Opcode::kNcStreamShuffle);
    in.shuffle.fill(0);
    Views vs{};
    vs[0] = dst.v;
    vs[1] = src.v;
    execute(in, vs, st);
    for (uint32_t p = 0; p < 32; ++p)
      for (int64_t j = 0; j < 3; ++j) CHECK(dst.f(p, j) == static_cast<float>(j) + 0.5f);
  }
  SECTION("in-place reversal in every quadrant with keep entries") {
    Tile t = tile(DType::kBFloat16, 64, {2});
    t.fill([](uint32_t p, int64_t j) { return static_cast<float>(p * 2 + j); });
    Instr in = mk(Opcode::kNcStreamShuffle);
    for (int i = 0; i < 32; ++i) in.shuffle[static_cast<size_t>(i)] = static_cast<uint8_t>(31 - i);
    in.shuffle[5] = 255;
    Views vs{};
    vs[0] = t.v;
    vs[1] = t.v;
    execute(in, vs, st);
    for (uint32_t q = 0; q < 2; ++q)
      for (uint32_t i = 0; i < 32; ++i) {
        const uint32_t srow = i == 5 ? q * 32 + 5 : q * 32 + 31 - i;
        CHECK(t.f(q * 32 + i, 1) == static_cast<float>(srow * 2 + 1));
      }
  }
  SECTION("source row beyond P_src throws, dst untouched") {
    Tile src = tile(DType::kFloat32, 4, {1});
    Tile dst = tile(DType::kFloat32, 8, {1});
    dst.fill([](uint32_t, int64_t) { return 7.0f; });
    Instr in = mk(Opcode::kNcStreamShuffle);
    in.shuffle.fill(0);
    in.shuffle[6] = 5;
    Views vs{};
    vs[0] = dst.v;
    vs[1] = src.v;
    CHECK(code_of(in, vs, st) == ErrorCode::kShapeMismatch);
    CHECK(dst.f(0, 0) == 7.0f);
  }
}

TEST_CASE("tensor_tensor_scan: s = a*s + b and reverse flags", "[semantics]") {
  ArchState st;
  const uint32_t P = 3;
  const int64_t N = 9;
  Tile a = tile(DType::kFloat32, P, {N});
  Tile b = tile_ap(DType::kBFloat16, P, {3, 3}, {4, 1}, 13);
  a.fill([](uint32_t, int64_t) { return urand(0.5f, 1.0f); });
  b.fill([](uint32_t, int64_t) { return urand(-1.0f, 1.0f); });
  Tile init = vec(DType::kFloat32, {1.0f, -2.0f, 0.5f});
  Tile dst = tile(DType::kFloat32, P, {N});
  Instr in = mk(Opcode::kTensorTensorScan);
  in.alu0 = AluOp::kMultiply;
  in.alu1 = AluOp::kAdd;
  Views vs{};
  vs[0] = dst.v;
  vs[1] = a.v;
  vs[2] = b.v;
  vs[3] = init.v;
  execute(in, vs, st);
  for (uint32_t p = 0; p < P; ++p) {
    double s = init.f(p, 0);
    for (int64_t i = 0; i < N; ++i) {
      s = a.f(p, i) * s + b.f(p, i);
      CHECK(close(dst.f(p, i), s, 1e-5, 1e-6));
    }
  }
  // Immediate initial, subtract with both reverse flags: t = s - a; s = b - t.
  in.alu0 = AluOp::kSubtract;
  in.alu1 = AluOp::kSubtract;
  in.flags = kReverse0 | kReverse1;
  in.imm[0] = 4.0f;
  vs[3] = TileView{};
  execute(in, vs, st);
  for (uint32_t p = 0; p < P; ++p) {
    double s = 4.0;
    for (int64_t i = 0; i < N; ++i) {
      s = b.f(p, i) - (s - a.f(p, i));
      CHECK(close(dst.f(p, i), s, 1e-5, 1e-5));
    }
  }
}

TEST_CASE("tensor_scalar_reduce: reduce_cmd sequence, load_reduce, negate", "[semantics]") {
  ArchState st;
  const uint32_t P = 2;
  Tile data = tile(DType::kFloat32, P, {6});
  data.fill([](uint32_t, int64_t) { return urand(-1.0f, 1.0f); });
  Tile dst = tile(DType::kBFloat16, P, {6});
  Tile rr = tile(DType::kFloat32, P, {1});
  Tile rinit = vec(DType::kFloat32, {10.0f, 20.0f});
  Instr in = mk(Opcode::kTensorScalarReduce);
  in.alu0 = AluOp::kMultiply;
  in.alu1 = AluOp::kAdd;
  in.flags = kHasImm0;
  in.imm[0] = 2.0f;
  in.reduce_cmd = ReduceCmd::kResetReduce;
  Views vs{};
  vs[0] = dst.v;
  vs[1] = data.v;
  vs[3] = rr.v;
  auto rowsum = [&](uint32_t p) {
    double s = 0;
    for (int64_t j = 0; j < 6; ++j) s += 2.0 * data.f(p, j);
    return s;
  };
  st.vector_acc.fill(55.0f);
  execute(in, vs, st);
  for (uint32_t p = 0; p < P; ++p) {
    CHECK(close(rr.f(p, 0), rowsum(p), 1e-5, 1e-6));
    for (int64_t j = 0; j < 6; ++j) CHECK(dst.f(p, j) == bf16_round(2.0f * data.f(p, j)));
  }
  in.reduce_cmd = ReduceCmd::kReduce;
  execute(in, vs, st);
  for (uint32_t p = 0; p < P; ++p) CHECK(close(rr.f(p, 0), 2 * rowsum(p), 1e-5, 1e-6));
  in.reduce_cmd = ReduceCmd::kLoadReduce;
  in.flags = kHasImm0 | kNegate;
  vs[4] = rinit.v;
  execute(in, vs, st);
  for (uint32_t p = 0; p < P; ++p) {
    CHECK(close(rr.f(p, 0), -(rinit.f(p, 0) + rowsum(p)), 1e-5, 1e-6));
    CHECK(close(st.vector_acc[p], rinit.f(p, 0) + rowsum(p), 1e-5, 1e-6));
  }
  // load_reduce from the immediate imm[1], max reduce.
  in.flags = kHasImm0;
  in.alu1 = AluOp::kMaximum;
  in.imm[1] = 1.5f;
  vs[4] = TileView{};
  execute(in, vs, st);
  for (uint32_t p = 0; p < P; ++p) {
    float m = 1.5f;
    for (int64_t j = 0; j < 6; ++j) m = std::max(m, 2.0f * data.f(p, j));
    CHECK(rr.f(p, 0) == m);
  }
}

TEST_CASE("bn_stats + bn_aggr reproduce mean and population variance", "[semantics]") {
  ArchState st;
  const uint32_t P = 3;
  const int64_t N = 21;  // odd: E has 11, O has 10 elements in the first chunk
  Tile data = tile(DType::kFloat32, P, {2, N});
  data.fill([](uint32_t p, int64_t) { return urand(-3.0f, 3.0f) + static_cast<float>(p); });
  // bn_stats per chunk of N elements, outputs side by side: [P, 12].
  Tile stats = tile(DType::kFloat32, P, {12});
  for (int64_t c = 0; c < 2; ++c) {
    Tile chunk = tile_ap(DType::kFloat32, P, {N}, {1}, 2 * N);
    chunk.v.base = data.v.at(0, c * N);
    TileView out = stats.v;
    out.base = stats.v.at(0, c * 6);
    out.size[0] = 6;
    Views vs{};
    vs[0] = out;
    vs[1] = chunk.v;
    execute(mk(Opcode::kBnStats), vs, st);
  }
  for (uint32_t p = 0; p < P; ++p) {
    CHECK(stats.f(p, 0) == 11.0f);
    CHECK(stats.f(p, 3) == 10.0f);
    double s = 0;
    for (int64_t j = 0; j < N; j += 2) s += data.f(p, j);
    CHECK(close(stats.f(p, 1), s / 11, 1e-5, 1e-6));
    double m2 = 0;
    const double mo = [&] {
      double t = 0;
      for (int64_t j = 1; j < N; j += 2) t += data.f(p, j);
      return t / 10;
    }();
    for (int64_t j = 1; j < N; j += 2) m2 += (data.f(p, j) - mo) * (data.f(p, j) - mo);
    CHECK(close(stats.f(p, 5), m2, 1e-5, 1e-6));
  }
  Tile agg = tile(DType::kFloat32, P, {2});
  Views vs{};
  vs[0] = agg.v;
  vs[1] = stats.v;
  execute(mk(Opcode::kBnAggr), vs, st);
  for (uint32_t p = 0; p < P; ++p) {
    double mean = 0;
    for (int64_t j = 0; j < 2 * N; ++j) mean += data.f(p, j);
    mean /= 2 * N;
    double var = 0;
    for (int64_t j = 0; j < 2 * N; ++j) var += (data.f(p, j) - mean) * (data.f(p, j) - mean);
    var /= 2 * N;
    CHECK(close(agg.f(p, 0), mean, 1e-5, 1e-6));
    CHECK(close(agg.f(p, 1), var, 1e-5, 1e-6));
  }
  SECTION("one element: odd set is empty (0, 0, 0) and ignored by bn_aggr") {
    Tile one = tile(DType::kFloat32, 1, {1});
    one.setf(0, 0, 4.5f);
    Tile s6 = tile(DType::kFloat32, 1, {6});
    Views w{};
    w[0] = s6.v;
    w[1] = one.v;
    execute(mk(Opcode::kBnStats), w, st);
    CHECK(s6.f(0, 0) == 1.0f);
    CHECK(s6.f(0, 1) == 4.5f);
    CHECK(s6.f(0, 2) == 0.0f);
    CHECK(s6.f(0, 3) == 0.0f);
    CHECK(s6.f(0, 4) == 0.0f);
    CHECK(s6.f(0, 5) == 0.0f);
    Tile a2 = tile(DType::kFloat32, 1, {2});
    w[0] = a2.v;
    w[1] = s6.v;
    execute(mk(Opcode::kBnAggr), w, st);
    CHECK(a2.f(0, 0) == 4.5f);
    CHECK(a2.f(0, 1) == 0.0f);
  }
}

TEST_CASE("tensor_copy_predicated", "[semantics]") {
  ArchState st;
  const uint32_t P = 2;
  Tile src = tile(DType::kFloat32, P, {5});
  src.fill([](uint32_t p, int64_t j) { return static_cast<float>(p * 5 + j) + 0.5f; });
  src.setbits(1, 3, 0x7fc0abcdu);
  Tile pred = tile(DType::kUInt8, P, {5});
  pred.filli([](uint32_t p, int64_t j) { return (p + static_cast<uint32_t>(j)) % 2 == 0 ? 3 : 0; });
  Tile dst = tile(DType::kFloat32, P, {5});
  dst.fill([](uint32_t, int64_t) { return -1.0f; });
  Instr in = mk(Opcode::kTensorCopyPredicated);
  Views vs{};
  vs[0] = dst.v;
  vs[1] = src.v;
  vs[2] = pred.v;
  execute(in, vs, st);
  for (uint32_t p = 0; p < P; ++p)
    for (int64_t j = 0; j < 5; ++j)
      if (pred.i(p, j) != 0) {
        CHECK(dst.bits(p, j) == src.bits(p, j));
      } else {
        CHECK(dst.f(p, j) == -1.0f);
      }
  CHECK(dst.bits(1, 3) == 0x7fc0abcdu);
  // Reverse predicate with an immediate.
  in.flags = kReversePred | kHasImm0;
  in.imm[0] = 9.0f;
  vs[1] = TileView{};
  execute(in, vs, st);
  for (uint32_t p = 0; p < P; ++p)
    for (int64_t j = 0; j < 5; ++j)
      if (pred.i(p, j) == 0) CHECK(dst.f(p, j) == 9.0f);
  CHECK(dst.bits(1, 3) == 0x7fc0abcdu);  // predicate true there: unchanged
}

TEST_CASE("range_select with max reduce across calls", "[semantics]") {
  ArchState st;
  const uint32_t P = 3;
  const int64_t N = 8;
  Tile on_true = tile(DType::kFloat32, P, {N});
  on_true.fill([](uint32_t, int64_t) { return urand(-5.0f, 5.0f); });
  Tile b0 = vec(DType::kFloat32, {2.0f, 0.0f, 6.0f});
  Tile b1 = vec(DType::kFloat32, {5.0f, 3.0f, 4.0f});  // partition 2: empty range
  Tile dst = tile(DType::kBFloat16, P, {N});
  Tile rr = tile(DType::kFloat32, P, {1});
  const float fmin = -3.4028235e38f;
  Instr in = mk(Opcode::kRangeSelect);
  in.alu0 = AluOp::kGreaterEqual;
  in.alu1 = AluOp::kLess;
  in.imm[0] = 1.0f;  // range_start
  in.imm[1] = fmin;
  in.reduce_cmd = ReduceCmd::kResetReduce;
  Views vs{};
  vs[0] = dst.v;
  vs[1] = on_true.v;
  vs[2] = b0.v;
  vs[3] = b1.v;
  vs[4] = rr.v;
  execute(in, vs, st);
  std::vector<float> mx(P, -kInf);
  for (uint32_t p = 0; p < P; ++p)
    for (int64_t j = 0; j < N; ++j) {
      const double idx = 1.0 + static_cast<double>(j);
      const bool keep = idx >= b0.f(p, 0) && idx < b1.f(p, 0);
      const float out = keep ? on_true.f(p, j) : fmin;
      CHECK(dst.f(p, j) == (keep ? bf16_round(out) : -kInf));  // FP32_MIN rounds to -inf in bf16
      mx[p] = std::max(mx[p], out);
    }
  for (uint32_t p = 0; p < P; ++p) CHECK(rr.f(p, 0) == mx[p]);
  CHECK(rr.f(2, 0) == fmin);
  // Second call accumulates the max.
  Tile t2 = tile(DType::kFloat32, P, {N});
  t2.fill([](uint32_t, int64_t) { return 100.0f; });
  vs[1] = t2.v;
  in.reduce_cmd = ReduceCmd::kReduce;
  execute(in, vs, st);
  CHECK(rr.f(0, 0) == 100.0f);
  CHECK(rr.f(2, 0) == fmin);
}

TEST_CASE("execute dispatches every opcode to its semantics", "[semantics]") {
  // An unknown opcode value is rejected.
  ArchState st;
  Instr in;
  in.op = static_cast<Opcode>(kNumOpcodes);
  Views vs{};
  CHECK(code_of(in, vs, st) == ErrorCode::kUnknownOpcode);
  // A missing required operand is reported, not dereferenced.
  in.op = Opcode::kTensorTensor;
  CHECK(code_of(in, vs, st) == ErrorCode::kMissingOperand);
}
