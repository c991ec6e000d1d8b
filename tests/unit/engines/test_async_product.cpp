// multiply_moving's product behind the next instructions, and its moving tiles kept converted
// (SimOptions::async_product, isa::sem::AsyncGemm): the same memory, bit for bit, as computing every
// product in place, for random streams that read a pending product's PSUM, overwrite moving tiles whole
// and in part, and multiply them again; and isa::may_overlap against a byte-by-byte answer.
#include <catch2/catch.hpp>

#include <cstring>
#include <random>
#include <set>
#include <vector>

#include "isa/semantics/parallel.h"
#include "kernel_builder.h"

using namespace nsim;
using namespace nsim::test;

namespace {

struct Threads {  // the products go behind only with a helper thread (one is started on any machine)
  explicit Threads(int n) { isa::sem::set_host_threads_for_testing(n); }
  ~Threads() { isa::sem::set_host_threads_for_testing(0); }
};

constexpr int64_t kSlot = 1024;  // SBUF bytes per partition of a tile slot ([128, 512] bf16)
constexpr int kSlots = 8;
constexpr int64_t kBank = 2048;  // PSUM bank bytes per partition on trn2
constexpr int kBanks = 4;

Operand sbuf(DType dt, int64_t offset, uint32_t p0, uint32_t parts, int64_t n) {
  return Operand::tile(Space::kSbuf, dt, offset, p0, parts, {n});
}
Operand psum(int64_t offset, int64_t n) { return Operand::tile(Space::kPsum, DType::kFloat32, offset, 0, 128, {n}); }

// Every byte of the SBUF slots and PSUM banks the streams use, after the run.
std::vector<uint8_t> memory_of(Simulator& s) {
  std::vector<uint8_t> out;
  for (const Operand& o : {Operand::tile(Space::kSbuf, DType::kUInt8, 0, 0, 128, {kSlot * kSlots}),
                           Operand::tile(Space::kPsum, DType::kUInt8, 0, 0, 128, {kBank * kBanks})}) {
    const isa::TileView v = s.memory().resolve(o);
    for (uint32_t p = 0; p < v.partitions; ++p) {
      const uint8_t* row = v.base + static_cast<int64_t>(p) * v.partition_stride_bytes;
      out.insert(out.end(), row, row + v.elems());
    }
  }
  return out;
}

// A random stream: DMA loads into the slots, partial overwrites of them, stationary loads, products of
// 128 to 512 columns (>= 2^21 multiply-adds: run by host threads), PSUM read back and overwritten.
std::vector<uint8_t> run_stream(bool async, uint32_t seed, int steps, bool check = false) {
  SimOptions o;
  o.async_product = async;
  o.check = check;  // the sanitizer: products complete at once, moving tiles still kept converted
  auto s = Simulator::from_preset("trn2", {}, o);
  const auto& x = s->alloc_hbm("x", {128, 4096}, DType::kBFloat16);
  std::mt19937 rng(seed);
  {
    std::vector<uint16_t> bits(128 * 4096);
    std::uniform_real_distribution<float> u(-2.0f, 2.0f);
    for (auto& b : bits) {
      const float f = u(rng);
      uint32_t w;
      std::memcpy(&w, &f, 4);
      b = static_cast<uint16_t>(w >> 16);
    }
    s->write_hbm("x", bits.data(), bits.size() * 2);
  }
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<uint32_t>(n)); };
  const int64_t widths[3] = {128, 256, 512};
  for (int slot = 0; slot < kSlots; ++slot) {  // every slot written once first
    Operand src = x.whole();
    src.size[0] = 512;
    src.offset = x.addr + slot * 512 * 2;
    s->submit(instr(Opcode::kDmaCopy, Engine::kSync, {sbuf(DType::kBFloat16, slot * kSlot, 0, 128, 512), src}));
  }
  s->submit(instr(Opcode::kLoadStationary, Engine::kTensor, {sbuf(DType::kBFloat16, 0, 0, 128, 128)}));
  for (int i = 0; i < steps; ++i) {
    switch (pick(7)) {
      case 0: {  // a whole slot reloaded from HBM
        Operand src = x.whole();
        src.size[0] = 512;
        src.offset = x.addr + pick(8) * 512 * 2;
        s->submit(instr(Opcode::kDmaCopy, Engine::kSync, {sbuf(DType::kBFloat16, pick(kSlots) * kSlot, 0, 128, 512), src}));
        break;
      }
      case 1: {  // part of a slot: a few partitions, a few columns
        const uint32_t p0 = static_cast<uint32_t>(pick(128));
        const uint32_t np = 1 + static_cast<uint32_t>(pick(static_cast<int>(128 - p0)));
        const int64_t col = pick(500), n = 1 + pick(12);
        const Operand t = sbuf(DType::kBFloat16, pick(kSlots) * kSlot + col * 2, p0, np, n);
        Instr in = instr(Opcode::kTensorScalar, Engine::kVector, {t, t});
        in.alu0 = AluOp::kMultiply;
        in.flags = isa::kHasImm0;
        in.imm[0] = -0.5f;
        s->submit(in);
        break;
      }
      case 2:
        s->submit(instr(Opcode::kLoadStationary, Engine::kTensor,
                        {sbuf(DType::kBFloat16, pick(kSlots) * kSlot + pick(4) * 256, 0, 128, 128)}));
        break;
      case 3:
      case 4: {  // a product, often accumulating, of a slot's first n columns
        const int64_t n = widths[pick(3)];
        Instr mm = instr(Opcode::kMultiplyMoving, Engine::kTensor,
                         {psum(pick(kBanks) * kBank, n), sbuf(DType::kBFloat16, pick(kSlots) * kSlot, 0, 128, n)});
        if (pick(3) != 0) mm.flags = isa::kAccumulate;
        s->submit(mm);
        break;
      }
      case 5: {  // PSUM read back into a slot (bf16), maybe of the pending product
        const int64_t n = widths[pick(3)] / 2;
        s->submit(instr(Opcode::kTensorCopy, Engine::kVector,
                        {sbuf(DType::kBFloat16, pick(kSlots) * kSlot + pick(2) * 256, 0, 128, n),
                         psum(pick(kBanks) * kBank + pick(4) * 4, n)}));
        break;
      }
      default: {  // PSUM scaled in place, part of a bank
        const Operand t = Operand::tile(Space::kPsum, DType::kFloat32, pick(kBanks) * kBank + pick(64) * 4, 0,
                                        static_cast<uint32_t>(1 + pick(128)), {1 + pick(64)});
        Instr in = instr(Opcode::kTensorScalar, Engine::kVector, {t, t});
        in.alu0 = AluOp::kMultiply;
        in.flags = isa::kHasImm0;
        in.imm[0] = 0.25f;
        s->submit(in);
        break;
      }
    }
  }
  return memory_of(*s);
}

}  // namespace

TEST_CASE("products behind the next instructions leave the same memory as products in place", "[async]") {
  // (With the sanitizer on too: products then complete at once, but moving tiles stay converted.)
  Threads two(2);
  for (uint32_t seed = 1; seed <= 12; ++seed) {
    INFO("seed " << seed);
    for (bool check : {false, true}) {
      INFO("check " << check);
      const std::vector<uint8_t> in_place = run_stream(false, seed, 120, check);
      const std::vector<uint8_t> behind = run_stream(true, seed, 120, check);
      REQUIRE(behind.size() == in_place.size());
      size_t first = 0;  // the first byte that differs (size() = none)
      while (first < behind.size() && behind[first] == in_place[first]) ++first;
      CHECK(first == behind.size());
    }
  }
}

TEST_CASE("a moving tile multiplied again after a write to one of its elements uses the new value", "[async]") {
  // mm(slot 0); one bf16 element of slot 0 (partition 77, column 300) overwritten; mm(slot 0) again into
  // another bank: the second product must differ from the first in column 300 alone.
  Threads two(2);
  for (bool async : {false, true}) {
    SimOptions o;
    o.async_product = async;
    auto s = Simulator::from_preset("trn2", {}, o);
    Instr set = instr(Opcode::kMemset, Engine::kVector, {sbuf(DType::kBFloat16, 0, 0, 128, 512)});
    set.imm[0] = 1.0f;  // every product 128, then 127 + 1000 in column 300
    s->submit(set);
    Instr ones = instr(Opcode::kMemset, Engine::kVector, {sbuf(DType::kBFloat16, kSlot, 0, 128, 128)});
    ones.imm[0] = 1.0f;
    s->submit(ones);
    s->submit(instr(Opcode::kLoadStationary, Engine::kTensor, {sbuf(DType::kBFloat16, kSlot, 0, 128, 128)}));
    s->submit(instr(Opcode::kMultiplyMoving, Engine::kTensor, {psum(0, 512), sbuf(DType::kBFloat16, 0, 0, 128, 512)}));
    Instr poke = instr(Opcode::kMemset, Engine::kVector, {sbuf(DType::kBFloat16, 300 * 2, 77, 1, 1)});
    poke.imm[0] = 1000.0f;
    s->submit(poke);
    s->submit(instr(Opcode::kMultiplyMoving, Engine::kTensor, {psum(kBank, 512), sbuf(DType::kBFloat16, 0, 0, 128, 512)}));
    const isa::TileView a = s->memory().resolve(psum(0, 512));
    const isa::TileView b = s->memory().resolve(psum(kBank, 512));
    std::set<int64_t> differ;
    for (int64_t j = 0; j < 512; ++j)
      for (uint32_t p = 0; p < 128; ++p) {
        float fa, fb;
        std::memcpy(&fa, a.at(p, j), 4);
        std::memcpy(&fb, b.at(p, j), 4);
        if (fa != fb) differ.insert(j);
      }
    INFO("async " << async);
    CHECK(differ == std::set<int64_t>{300});
  }
}

TEST_CASE("may_overlap agrees with the bytes two views touch", "[async]") {
  // Views of one 16-partition buffer of 64-byte rows: random partitions, offsets, sizes and strides
  // (some negative); may_overlap is false only when no byte is shared (it may be true for views that
  // only interleave).
  std::vector<uint8_t> buf(16 * 64);
  std::mt19937 rng(7);
  auto view = [&]() {
    isa::TileView v;
    for (;;) {
    v.dtype = rng() % 2 ? DType::kFloat32 : DType::kBFloat16;
    const int64_t es = dtype_bytes(v.dtype);
    v.partitions = 1 + rng() % 6;
    const uint32_t p0 = rng() % (17 - v.partitions);
    v.partition_stride_bytes = 64;
    v.nfree = static_cast<uint8_t>(1 + rng() % 2);
    int64_t lo = 0, hi = 0;
    for (int d = 0; d < v.nfree; ++d) {
      v.size[static_cast<size_t>(d)] = 1 + rng() % 4;
      v.stride[static_cast<size_t>(d)] = static_cast<int64_t>(rng() % 7) - 2;
      const int64_t r = (v.size[static_cast<size_t>(d)] - 1) * v.stride[static_cast<size_t>(d)] * es;
      (r < 0 ? lo : hi) += r;
    }
    const int64_t room = 64 - (hi - lo) - es;
    if (room < 0) continue;  // a partition's elements must fit its row
    v.base = buf.data() + p0 * 64 - lo + static_cast<int64_t>(rng() % static_cast<uint32_t>(room + 1)) / es * es;
    return v;
    }
  };
  auto bytes = [&](const isa::TileView& v) {
    std::set<const uint8_t*> s;
    for (uint32_t p = 0; p < v.partitions; ++p)
      for (int64_t f = 0; f < v.elems(); ++f)
        for (int64_t b = 0; b < dtype_bytes(v.dtype); ++b) s.insert(v.at(p, f) + b);
    return s;
  };
  int shared = 0, apart = 0;
  for (int i = 0; i < 4000; ++i) {
    const isa::TileView a = view(), b = view();
    const auto sa = bytes(a), sb = bytes(b);
    bool common = false;
    for (const uint8_t* p : sa) common = common || sb.count(p) != 0;
    if (common) {
      ++shared;
      REQUIRE(isa::may_overlap(a, b));
      REQUIRE(isa::may_overlap(b, a));
    } else if (!isa::may_overlap(a, b)) {
      ++apart;
    }
  }
  CHECK(shared > 400);
  CHECK(apart > 400);  // and it does tell most disjoint views apart
}
