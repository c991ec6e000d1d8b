// The per-signature cache of the simulator (engines/sig_cache.h) changes no result: the same random
// instruction streams, with offsets inside and outside their buffers, give the same timings, the same
// errors (code and message) and the same counters with SimOptions::signature_cache on and off; and
// isa::Placement::fits agrees with isa::verify on every offset.
#include <catch2/catch.hpp>

#include <random>
#include <string>
#include <vector>

#include "kernel_builder.h"

using namespace nsim;
using namespace nsim::test;

namespace {

// Instruction shapes of a small kernel (each a signature, up to its offsets), on trn2.
std::vector<Instr> templates(bool hbm_ok, const Operand& hbm) {
  std::vector<Instr> v;
  auto sb = [](DType dt, uint32_t parts, std::initializer_list<int64_t> free) {
    return Operand::tile(Space::kSbuf, dt, 0, 0, parts, free);
  };
  for (Engine e : {Engine::kVector, Engine::kScalar, Engine::kGpsimd}) {
    Instr a = instr(Opcode::kTensorScalar, e, {sb(DType::kFloat32, 128, {4}), sb(DType::kFloat32, 128, {4})});
    a.alu0 = AluOp::kMultiply;
    a.flags = isa::kHasImm0;
    v.push_back(a);
    Instr b = instr(Opcode::kTensorScalar, e, {sb(DType::kBFloat16, 64, {2, 64}), sb(DType::kBFloat16, 64, {2, 64})});
    b.alu0 = AluOp::kMultiply;  // (multiply, add): a pair ScalarE runs (nki-api.md 2.1)
    b.alu1 = AluOp::kAdd;
    b.flags = isa::kHasImm0 | isa::kHasImm1;
    b.opnd[1].stride = {128, 2};  // strided source
    v.push_back(b);
  }
  Instr act = instr(Opcode::kActivation, Engine::kScalar, {sb(DType::kBFloat16, 128, {512}), sb(DType::kFloat32, 128, {512})});
  act.act = isa::ActFunc::kExp;
  v.push_back(act);
  Instr tt = instr(Opcode::kTensorTensor, Engine::kVector,
                   {sb(DType::kFloat32, 128, {256}), sb(DType::kFloat32, 128, {256}),
                    Operand::tile(Space::kPsum, DType::kFloat32, 0, 0, 128, {256})});
  tt.alu0 = AluOp::kAdd;
  v.push_back(tt);
  v.push_back(instr(Opcode::kTensorCopy, Engine::kVector,
                    {sb(DType::kBFloat16, 128, {512}), Operand::tile(Space::kPsum, DType::kFloat32, 0, 0, 128, {512})}));
  v.push_back(instr(Opcode::kMemset, Engine::kGpsimd, {sb(DType::kBFloat16, 32, {1024})}));
  v.push_back(instr(Opcode::kLoadStationary, Engine::kTensor, {sb(DType::kBFloat16, 128, {128})}));
  // A matmul writes within one 2 KiB PSUM bank on trn2: [128, 256] fp32 is 1 KiB, so offsets decide.
  v.push_back(instr(Opcode::kMultiplyMoving, Engine::kTensor,
                    {Operand::tile(Space::kPsum, DType::kFloat32, 0, 0, 128, {256}), sb(DType::kBFloat16, 128, {256})}));
  if (hbm_ok) {
    Operand h = hbm;
    h.num_partitions = 64;
    h.size[0] = 128;
    v.push_back(instr(Opcode::kDmaCopy, Engine::kSync, {sb(DType::kFloat32, 64, {128}), h}));
    Instr st = instr(Opcode::kDmaCopy, Engine::kScalar, {h, sb(DType::kFloat32, 64, {128})});
    st.dma_queue = 3;
    v.push_back(st);
  }
  return v;
}

// An offset for operand `o` of a template: mostly inside its buffer, sometimes just past either end.
int64_t random_offset(std::mt19937_64& rng, const Operand& o, int64_t hbm_bytes) {
  const int64_t cap = o.space == Space::kSbuf ? 192 * 1024 : o.space == Space::kPsum ? 16 * 1024 : hbm_bytes;
  std::uniform_int_distribution<int> pick(0, 19);
  const int k = pick(rng);
  if (k == 0) return -static_cast<int64_t>(dtype_bytes(o.dtype)) * (1 + static_cast<int64_t>(rng() % 8));
  if (k == 1) return cap - static_cast<int64_t>(rng() % 4096);  // often past the end
  const int64_t step = o.space == Space::kPsum ? 512 : 64;
  return step * static_cast<int64_t>(rng() % static_cast<uint64_t>(std::max<int64_t>(1, cap / step / 2)));
}

struct Outcome {
  std::string what;  // the error, or the timing
};

}  // namespace

TEST_CASE("signature cache: random streams give the same timings, errors and counters with it off", "[sigcache]") {
  for (bool numerics : {false, true}) {
    for (uint64_t seed = 1; seed <= 3; ++seed) {
      SimOptions on, off;
      on.numerics = off.numerics = numerics;
      off.signature_cache = false;
      on.dependency_bound = off.dependency_bound = true;
      auto a = Simulator::from_preset("trn2", {}, on);
      auto b = Simulator::from_preset("trn2", {}, off);
      const auto& ha = a->alloc_hbm("h", {512, 512}, DType::kFloat32);
      b->alloc_hbm("h", {512, 512}, DType::kFloat32);
      const std::vector<Instr> tmpl = templates(true, ha.whole());
      std::mt19937_64 rng(seed);
      int errors = 0, ok = 0;
      for (int n = 0; n < 3000; ++n) {
        Instr in = tmpl[rng() % tmpl.size()];
        for (int i = 0; i < isa::kMaxSlots; ++i) {
          Operand& o = in.opnd[static_cast<size_t>(i)];
          if (!o.present()) continue;
          o.offset = o.space == Space::kHbm ? ha.addr + random_offset(rng, o, ha.bytes) : random_offset(rng, o, 0);
        }
        std::string ra, rb;
        try {
          const InstrTiming t = a->submit(in);
          ra = std::to_string(t.start) + " " + std::to_string(t.end) + " " + std::to_string(t.issue) + " " +
               std::to_string(t.ready) + " " + std::to_string(t.waited_for) + " " + std::to_string(t.flops);
          ++ok;
        } catch (const Error& e) {
          ra = e.what();
          ++errors;
        }
        try {
          const InstrTiming t = b->submit(in);
          rb = std::to_string(t.start) + " " + std::to_string(t.end) + " " + std::to_string(t.issue) + " " +
               std::to_string(t.ready) + " " + std::to_string(t.waited_for) + " " + std::to_string(t.flops);
        } catch (const Error& e) {
          rb = e.what();
        }
        INFO("seed " << seed << " instruction " << n << ": " << isa::disassemble(in));
        REQUIRE(ra == rb);
      }
      // Both kinds of outcome occur (the stream tests the checks of the offsets, and the timings).
      CHECK(errors > 100);
      CHECK(ok > 1000);
      a->finish();
      b->finish();
      CHECK(a->total_time() == b->total_time());
      CHECK(a->dependency_bound() == b->dependency_bound());
      const RunCounters& ca = a->counters();
      const RunCounters& cb = b->counters();
      CHECK(ca.sbuf_read == cb.sbuf_read);
      CHECK(ca.sbuf_write == cb.sbuf_write);
      CHECK(ca.psum_read == cb.psum_read);
      CHECK(ca.psum_write == cb.psum_write);
      CHECK(ca.hbm_read == cb.hbm_read);
      CHECK(ca.hbm_write == cb.hbm_write);
      CHECK(ca.opcode_count == cb.opcode_count);
      CHECK(ca.opcode_time == cb.opcode_time);
      for (size_t e = 0; e < ca.engine.size(); ++e) {
        CHECK(ca.engine[e].busy == cb.engine[e].busy);
        CHECK(ca.engine[e].active == cb.engine[e].active);
        CHECK(ca.engine[e].flops == cb.engine[e].flops);
      }
    }
  }
}

TEST_CASE("signature cache: Placement::fits agrees with verify on every offset", "[sigcache]") {
  for (const char* preset : {"trn2", "trn3"}) {
    auto s = make_sim(preset);
    const isa::Limits lim = s->params().limits();
    std::mt19937_64 rng(7);
    for (const Instr& t : templates(false, Operand{})) {
      Instr base = t;
      isa::verify(base, lim);  // the template passes at offset 0
      const isa::Placement pl = isa::placement_of(base, lim);
      int fits = 0, not_fits = 0;
      for (int n = 0; n < 2000; ++n) {
        Instr in = base;
        for (Operand& o : in.opnd)
          if (o.present()) o.offset = random_offset(rng, o, 0);
        REQUIRE(isa::same_signature(in, base));
        REQUIRE(isa::signature_hash(in) == isa::signature_hash(base));
        bool passes = true;
        try {
          isa::verify(in, lim);
        } catch (const Error&) {
          passes = false;
        }
        INFO(preset << ": " << isa::disassemble(in));
        REQUIRE(pl.fits(in) == passes);
        (passes ? fits : not_fits)++;
      }
      CHECK(fits > 100);
      CHECK(not_fits > 10);
    }
  }
}

TEST_CASE("signature cache: same_signature sees every field but the offsets and the location", "[sigcache]") {
  Instr a = instr(Opcode::kTensorScalar, Engine::kVector,
                  {Operand::tile(Space::kSbuf, DType::kFloat32, 0, 0, 128, {4}),
                   Operand::tile(Space::kSbuf, DType::kFloat32, 64, 0, 128, {4})});
  Instr b = a;
  b.opnd[0].offset = 4096;
  b.opnd[1].offset = 128;
  b.loc = 3;
  CHECK(isa::same_signature(a, b));
  auto differs = [&](auto&& change) {
    Instr c = a;
    change(c);
    return !isa::same_signature(a, c);
  };
  CHECK(differs([](Instr& c) { c.engine = Engine::kGpsimd; }));
  CHECK(differs([](Instr& c) { c.flags = isa::kHasImm0; }));
  CHECK(differs([](Instr& c) { c.alu1 = AluOp::kAdd; }));
  CHECK(differs([](Instr& c) { c.imm[3] = 1.0f; }));
  CHECK(differs([](Instr& c) { c.iimm[9] = 2; }));
  CHECK(differs([](Instr& c) { c.shuffle[31] = 1; }));
  CHECK(differs([](Instr& c) { c.dma_queue = 1; }));
  CHECK(differs([](Instr& c) { c.opnd[1].start_partition = 32; }));
  CHECK(differs([](Instr& c) { c.opnd[1].num_partitions = 64; }));
  CHECK(differs([](Instr& c) { c.opnd[1].stride[0] = 2; }));
  CHECK(differs([](Instr& c) { c.opnd[4].dtype = DType::kBFloat16; }));  // an absent operand's fields too
  CHECK(differs([](Instr& c) { c.opnd[2].space = Space::kSbuf; }));
}

TEST_CASE("signature cache: the hash tells apart what a kernel's loads and loops vary", "[sigcache]") {
  // The cache is two-way set-associative by signature_hash: signatures of one hash evict each other.
  // Loads spread over DMA queues (the compiler's round robin), reductions over different axes and
  // activations with a per-iteration scale must not share a hash, or every such instruction misses.
  Instr a = instr(Opcode::kDmaCopy, Engine::kSync,
                  {Operand::tile(Space::kSbuf, DType::kFloat32, 0, 0, 128, {4}),
                   Operand::tile(Space::kSbuf, DType::kFloat32, 64, 0, 128, {4})});
  auto hash_differs = [&](auto&& change) {
    Instr c = a;
    change(c);
    return isa::signature_hash(a) != isa::signature_hash(c);
  };
  for (uint8_t q = 1; q < 16; ++q) CHECK(hash_differs([q](Instr& c) { c.dma_queue = q; }));
  CHECK(hash_differs([](Instr& c) { c.axis_count = 2; }));
  CHECK(hash_differs([](Instr& c) { c.imm[0] = 0.5f; }));
  CHECK(hash_differs([](Instr& c) { c.imm[2] = 2.0f; }));
  CHECK(hash_differs([](Instr& c) { c.imm[3] = -1.0f; }));
  CHECK(hash_differs([](Instr& c) { c.op = Opcode::kTensorCopy; }));
  CHECK(hash_differs([](Instr& c) { c.opnd[1].num_partitions = 64; }));
  CHECK_FALSE(hash_differs([](Instr& c) { c.opnd[0].offset = 4096; }));  // offsets are not part of it
}

TEST_CASE("signature cache: a line's last entry, since given to another signature, is not taken for it", "[sigcache]") {
  // One op on one engine and line with 400 shapes in random order: more signatures than the table holds
  // (2 x 64 entries), so the entry each instruction's line remembers (Simulator::signature's hint) is often
  // overwritten by another shape of the same op before the line comes back. Timings as without the cache.
  SimOptions on, off;
  on.numerics = off.numerics = false;
  off.signature_cache = false;
  auto a = Simulator::from_preset("trn2", {}, on);
  auto b = Simulator::from_preset("trn2", {}, off);
  const uint32_t line = a->add_source(SourceLoc{"k.py", 7});
  b->add_source(SourceLoc{"k.py", 7});
  std::mt19937_64 rng(11);
  for (int n = 0; n < 4000; ++n) {
    const int64_t cols = 1 + static_cast<int64_t>(rng() % 400);
    Instr in = instr(Opcode::kTensorScalar, Engine::kVector,
                     {Operand::tile(Space::kSbuf, DType::kFloat32, 0, 0, 128, {cols}),
                      Operand::tile(Space::kSbuf, DType::kFloat32, 4096, 0, 128, {cols})});
    in.alu0 = AluOp::kMultiply;
    in.flags = isa::kHasImm0;
    in.loc = line;
    const InstrTiming ta = a->submit(in), tb = b->submit(in);
    INFO("instruction " << n << ": " << cols << " columns");
    REQUIRE(ta.start == tb.start);
    REQUIRE(ta.end == tb.end);
    REQUIRE(ta.issue == tb.issue);
  }
}
