// Lowering of the tile IR: instructions, operands, rotating buffers, numerics end to end, DMA/compute
// overlap and lazy generation.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engines/simulator.h"
#include "frontend/ir.h"
#include "frontend/lower.h"

#include "kernel_builder.h"

using namespace nsim;
using frontend::Lowering;
using frontend::verify_kernel;
using isa::AluOp;
using isa::Engine;
using isa::Instr;
using isa::Opcode;
using isa::Space;

namespace {

std::unique_ptr<Simulator> make_sim(bool numerics, const std::string& preset = "trn2") {
  return Simulator::from_preset(preset, {}, SimOptions{numerics, ""});
}

std::vector<Instr> drain(Lowering& l) {
  std::vector<Instr> v;
  Instr in;
  while (l.next(in)) v.push_back(in);
  return v;
}

// The instructions of a verified kernel, lowered for a timing-only simulator.
std::vector<Instr> lowered(const frontend::Kernel& k) {
  auto s = make_sim(false);
  verify_kernel(k, s->params());
  frontend::Lowering::allocate_hbm(k, *s);
  Lowering l(k, *s);
  return drain(l);
}

}  // namespace

TEST_CASE("lowering: loads, compute and stores become the expected instructions", "[lower]") {
  KB b;
  const int x = b.input("x", {256, 64});
  const int y = b.output("y", {128, 64});
  const int t = b.tile("t", {128, 64}, DType::kFloat32, 1);
  b.op("dma_copy", {W(t), X(x, {D(128, 128), D(0, 64)})}, 10);
  b.ts(W(t), W(t), AluOp::kAdd, 1.0f, 11);
  b.op("dma_copy", {W(y), W(t)}, 12);
  auto s = make_sim(false);
  verify_kernel(b.k, s->params());
  Lowering l(b.k, *s);
  const auto& hx = s->memory().hbm_tensor("x");
  const auto& hy = s->memory().hbm_tensor("y");
  const int64_t toff = l.placements()[static_cast<size_t>(t)].offset;
  const auto v = drain(l);
  REQUIRE(v.size() == 3);
  CHECK(l.instructions() == 3);

  CHECK(v[0].op == Opcode::kDmaCopy);
  CHECK(v[0].engine == Engine::kSync);  // loads triggered from Sync
  CHECK(v[0].dma_queue == 0);
  CHECK(v[0].slot(0).space == Space::kSbuf);
  CHECK(v[0].slot(0).offset == toff);
  CHECK(v[0].slot(0).start_partition == 0);
  CHECK(v[0].slot(0).num_partitions == 128);
  CHECK(v[0].slot(0).nfree == 1);
  CHECK(v[0].slot(0).size[0] == 64);
  CHECK(v[0].slot(0).stride[0] == 1);
  CHECK(v[0].slot(1).space == Space::kHbm);
  CHECK(v[0].slot(1).offset == hx.addr + 128 * 64 * 4);
  CHECK(v[0].slot(1).num_partitions == 128);
  CHECK(v[0].slot(1).partition_step == 64);
  CHECK(v[0].slot(1).size[0] == 64);

  CHECK(v[1].op == Opcode::kTensorScalar);
  CHECK(v[1].engine == Engine::kVector);
  CHECK(v[1].alu0 == AluOp::kAdd);
  CHECK(v[1].flags == isa::kHasImm0);
  CHECK(v[1].imm[0] == 1.0f);
  CHECK(v[1].slot(0).offset == toff);
  CHECK(!v[1].slot(2).present());

  CHECK(v[2].op == Opcode::kDmaCopy);
  CHECK(v[2].engine == Engine::kGpsimd);  // stores triggered from GpSimd (swdge)
  CHECK(v[2].dma_queue == engines::trigger_queue(s->params(), Engine::kGpsimd, 0));  // qGpSimdIO0
  CHECK(v[2].slot(0).offset == hy.addr);
  CHECK(v[2].slot(0).partition_step == 64);
  // Every instruction carries its op's source line.
  CHECK(s->source(v[0].loc).line == 10);
  CHECK(s->source(v[1].loc).line == 11);
  CHECK(s->source(v[2].loc).line == 12);
}

TEST_CASE("lowering: partition ranges, strides, merged dims and broadcasts", "[lower]") {
  KB b;
  const int h = b.input("h", {4, 8, 16});
  const int t = b.tile("t", {128, 4, 16}, DType::kFloat32, 1);
  const int v = b.tile("v", {128, 1}, DType::kFloat32, 1);
  const int u = b.tile("u", {128, 64}, DType::kBFloat16, 1);
  // h[0:4, 2:4, 0:16] -> rows of 128 elements, dims 1 and 2 merge into one contiguous run of 32.
  b.op("dma_copy", {X(t, {D(0, 4), D(0, 2), D(0, 16)}), X(h, {D(0, 4), D(2, 2), D(0, 16)})});
  // t[32:96, 1, 0:16:2]: size-1 dim dropped, step 2.
  b.op("tensor_copy", {X(u, {D(32, 64), D(0, 8)}), X(t, {D(32, 64), D(1, 1), D(0, 8, 2)})});
  // v broadcast along 64 columns.
  b.op("tensor_tensor", {X(u, {D(0, 128), D(0, 64)}), W(u), X(v, {D(0, 128), B(0, 64)})});
  auto s = make_sim(false);
  Lowering l(b.k, *s);
  const auto& pl = l.placements();
  const auto& hh = s->memory().hbm_tensor("h");
  const auto in = drain(l);
  REQUIRE(in.size() == 3);

  const isa::Operand& src = in[0].slot(1);
  CHECK(src.offset == hh.addr + 2 * 16 * 4);
  CHECK(src.num_partitions == 4);
  CHECK(src.partition_step == 128);
  CHECK(src.nfree == 1);
  CHECK(src.size[0] == 32);
  CHECK(src.stride[0] == 1);
  const isa::Operand& dst = in[0].slot(0);
  CHECK(dst.num_partitions == 4);
  CHECK(dst.nfree == 1);
  CHECK(dst.size[0] == 32);

  const isa::Operand& c = in[1].slot(1);
  CHECK(c.start_partition == 32);
  CHECK(c.num_partitions == 64);
  CHECK(c.offset == pl[static_cast<size_t>(t)].offset + 16 * 4);
  CHECK(c.nfree == 1);
  CHECK(c.size[0] == 8);
  CHECK(c.stride[0] == 2);
  CHECK(in[1].slot(0).start_partition == 32);
  CHECK(in[1].slot(0).dtype == DType::kBFloat16);

  const isa::Operand& bc = in[2].slot(2);
  CHECK(bc.offset == pl[static_cast<size_t>(v)].offset);
  CHECK(bc.nfree == 1);
  CHECK(bc.size[0] == 64);
  CHECK(bc.stride[0] == 0);
}

TEST_CASE("lowering: nc_matmul becomes load_stationary + multiply_moving", "[lower][matmul]") {
  KB b;
  const int a = b.tile("a", {128, 128}, DType::kBFloat16, 1);
  const int m = b.tile("m", {128, 512}, DType::kBFloat16, 1);
  const int p = b.psum("p", {128, 512}, 1);
  const int mm = b.op("nc_matmul", {W(p), W(a), W(m)}, 20);
  b.o(mm).flags = isa::kAccumulate;
  auto s = make_sim(false);
  Lowering l(b.k, *s);
  const auto v = drain(l);
  REQUIRE(v.size() == 2);
  CHECK(l.instructions() == 2);
  CHECK(v[0].op == Opcode::kLoadStationary);
  CHECK(v[0].engine == Engine::kTensor);
  CHECK(v[0].slot(0).offset == l.placements()[static_cast<size_t>(a)].offset);
  CHECK(v[0].slot(0).size[0] == 128);
  CHECK((v[0].flags & isa::kAccumulate) == 0);
  CHECK(v[1].op == Opcode::kMultiplyMoving);
  CHECK(v[1].slot(0).space == Space::kPsum);
  CHECK(v[1].slot(0).offset == l.placements()[static_cast<size_t>(p)].offset);
  CHECK(v[1].slot(1).offset == l.placements()[static_cast<size_t>(m)].offset);
  CHECK((v[1].flags & isa::kAccumulate) != 0);
  CHECK(v[0].loc == v[1].loc);
  CHECK(s->source(v[1].loc).line == 20);
}

TEST_CASE("lowering: a tile allocated in a loop rotates over its buffers", "[lower][bufs]") {
  auto build = [](int bufs) {
    KB b;
    const int x = b.input("x", {512, 64});
    const int y = b.output("y", {512, 64});
    const int i = b.loop("i", 0, 4);
    const int t = b.tile("t", {128, 64}, DType::kFloat32, bufs);
    b.op("dma_copy", {W(t), X(x, {D(A(i, 128), 128), D(0, 64)})});
    b.op("dma_copy", {X(y, {D(A(i, 128), 128), D(0, 64)}), W(t)});
    b.end();
    return b.k;
  };
  SECTION("automatic depth") {
    const Kernel k = build(0);
    auto s = make_sim(false);
    verify_kernel(k, s->params());
    Lowering l(k, *s);
    const auto& pl = l.placements()[2];
    CHECK(pl.bufs == s->params().loop_buffers);  // 4 on trn2, one per iteration of the loop here
    CHECK(pl.stride >= 64 * 4);
    const auto v = drain(l);
    REQUIRE(v.size() == 8);
    for (size_t it = 0; it < 4; ++it) {
      const int64_t expect = pl.offset + static_cast<int64_t>(it % 4) * pl.stride;
      CHECK(v[2 * it].slot(0).offset == expect);      // load into buffer it % 4
      CHECK(v[2 * it + 1].slot(1).offset == expect);  // store from the same buffer
      CHECK(v[2 * it].dma_queue == engines::trigger_queue(s->params(), Engine::kSync, static_cast<int>(it % 4)));
      CHECK(v[2 * it + 1].dma_queue == engines::trigger_queue(s->params(), Engine::kGpsimd, static_cast<int>(it % 4)));
      CHECK(v[2 * it].slot(1).offset == s->memory().hbm_tensor("x").addr + static_cast<int64_t>(it) * 128 * 64 * 4);
    }
  }
  SECTION("bufs = 1 keeps one buffer") {
    const Kernel k = build(1);
    auto s = make_sim(false);
    Lowering l(k, *s);
    CHECK(l.placements()[2].bufs == 1);
    const auto v = drain(l);
    for (size_t it = 0; it < 4; ++it) CHECK(v[2 * it].slot(0).offset == l.placements()[2].offset);
  }
  SECTION("bufs = 3") {
    const Kernel k = build(3);
    auto s = make_sim(false);
    Lowering l(k, *s);
    const auto& pl = l.placements()[2];
    const auto v = drain(l);
    CHECK(v[0].slot(0).offset == pl.offset);
    CHECK(v[2].slot(0).offset == pl.offset + pl.stride);
    CHECK(v[4].slot(0).offset == pl.offset + 2 * pl.stride);
    CHECK(v[6].slot(0).offset == pl.offset);
  }
}

TEST_CASE("lowering: automatic double buffering falls back to one buffer when SBUF is short", "[lower][bufs]") {
  KB b;
  const int x = b.input("x", {256, 40000});
  const int y = b.output("y", {256, 40000});
  const int i = b.loop("i", 0, 2);
  const int t = b.tile("t", {128, 40000});  // 160000 B per partition: two buffers do not fit
  b.op("dma_copy", {W(t), X(x, {D(A(i, 128), 128), D(0, 40000)})});
  b.op("dma_copy", {X(y, {D(A(i, 128), 128), D(0, 40000)}), W(t)});
  b.end();
  auto s = make_sim(false);
  verify_kernel(b.k, s->params());
  Lowering l(b.k, *s);
  CHECK(l.placements()[static_cast<size_t>(t)].bufs == 1);
  l.run();
  CHECK(l.instructions() == 4);
}

TEST_CASE("lowering numerics: y = x + 1 over two tiles matches exactly", "[lower][numerics]") {
  KB b;
  const int x = b.input("x", {256, 64});
  const int y = b.output("y", {256, 64});
  const int i = b.loop("i", 0, 2);
  const int t = b.tile("t", {128, 64});
  const int u = b.tile("u", {128, 64});
  b.op("dma_copy", {W(t), X(x, {D(A(i, 128), 128), D(0, 64)})});
  b.ts(W(u), W(t), AluOp::kAdd, 1.0f);
  b.op("dma_copy", {X(y, {D(A(i, 128), 128), D(0, 64)}), W(u)});
  b.end();

  auto s = make_sim(true);
  verify_kernel(b.k, s->params());
  Lowering::allocate_hbm(b.k, *s);
  std::vector<float> xv(256 * 64);
  for (size_t j = 0; j < xv.size(); ++j) xv[j] = static_cast<float>(j) * 0.37f - 1000.0f;
  s->write_hbm("x", xv.data(), xv.size() * sizeof(float));
  Lowering l(b.k, *s);
  l.run();
  s->finish();
  CHECK(l.instructions() == 6);
  const auto raw = s->read_hbm("y");
  REQUIRE(raw.size() == xv.size() * sizeof(float));
  std::vector<float> yv(xv.size());
  std::memcpy(yv.data(), raw.data(), raw.size());
  size_t bad = 0;
  for (size_t j = 0; j < xv.size(); ++j) bad += yv[j] != xv[j] + 1.0f;
  CHECK(bad == 0);
}

TEST_CASE("lowering numerics: a K-tiled matmul matches a reference", "[lower][numerics][matmul]") {
  // c[128, 512] = a[256, 128]^T @ b[256, 512], K tiled by 128 and accumulated in PSUM.
  KB b;
  const int a = b.input("a", {256, 128});
  const int bm = b.input("b", {256, 512});
  const int c = b.output("c", {128, 512});
  const int p = b.psum("p", {128, 512});
  const int ms = b.op("memset", {W(p)});
  b.o(ms).imm[0] = 0.0f;
  const int kk = b.loop("k", 0, 2, 1, LoopKind::kSequential);
  const int at = b.tile("at", {128, 128});
  const int bt = b.tile("bt", {128, 512});
  b.op("dma_copy", {W(at), X(a, {D(A(kk, 128), 128), D(0, 128)})});
  b.op("dma_copy", {W(bt), X(bm, {D(A(kk, 128), 128), D(0, 512)})});
  const int mm = b.op("nc_matmul", {W(p), W(at), W(bt)});
  b.o(mm).flags = isa::kAccumulate;
  b.end();
  const int ct = b.tile("ct", {128, 512});
  b.op("tensor_copy", {W(ct), W(p)});
  b.op("dma_copy", {W(c), W(ct)});

  auto s = make_sim(true);
  verify_kernel(b.k, s->params());
  Lowering::allocate_hbm(b.k, *s);
  std::vector<float> av(256 * 128), bv(256 * 512);
  for (size_t j = 0; j < av.size(); ++j) av[j] = static_cast<float>((j * 7919) % 201) / 100.0f - 1.0f;
  for (size_t j = 0; j < bv.size(); ++j) bv[j] = static_cast<float>((j * 104729) % 301) / 150.0f - 1.0f;
  s->write_hbm("a", av.data(), av.size() * 4);
  s->write_hbm("b", bv.data(), bv.size() * 4);
  Lowering l(b.k, *s);
  l.run();
  s->finish();
  CHECK(l.instructions() == 1 + 2 * 4 + 2);
  const auto raw = s->read_hbm("c");
  std::vector<float> cv(128 * 512);
  std::memcpy(cv.data(), raw.data(), raw.size());
  double worst = 0;
  for (int m = 0; m < 128; ++m)
    for (int n = 0; n < 512; ++n) {
      double ref = 0;
      for (int k = 0; k < 256; ++k)
        ref += static_cast<double>(av[static_cast<size_t>(k * 128 + m)]) * bv[static_cast<size_t>(k * 512 + n)];
      worst = std::max(worst, std::abs(ref - cv[static_cast<size_t>(m * 512 + n)]) / (1.0 + std::abs(ref)));
    }
  CHECK(worst < 1e-5);
}

namespace {

/// Loop over 8 tiles of [128, 2048] fp32: load, y = x * 2 + 1, store. Returns (total, serial sum).
std::pair<sim::Ps, sim::Ps> pipeline(int bufs) {
  KB b;
  const int x = b.input("x", {1024, 2048});
  const int y = b.output("y", {1024, 2048});
  const int i = b.loop("i", 0, 8);
  const int t = b.tile("t", {128, 2048}, DType::kFloat32, bufs);
  const int u = b.tile("u", {128, 2048}, DType::kFloat32, bufs);
  b.op("dma_copy", {W(t), X(x, {D(A(i, 128), 128), D(0, 2048)})});
  const int c = b.ts(W(u), W(t), AluOp::kMultiply, 2.0f);
  b.o(c).alu1 = AluOp::kAdd;
  b.o(c).imm[1] = 1.0f;
  b.o(c).flags = isa::kHasImm0 | isa::kHasImm1;
  b.op("dma_copy", {X(y, {D(A(i, 128), 128), D(0, 2048)}), W(u)});
  b.end();
  auto s = make_sim(false);
  verify_kernel(b.k, s->params());
  Lowering l(b.k, *s);
  l.run();
  s->finish();
  sim::Ps serial = 0;
  for (sim::Ps d : s->counters().opcode_time) serial += d;
  return {s->total_time(), serial};
}

}  // namespace

TEST_CASE("lowering overlaps DMA and compute across rotating buffers", "[lower][timing][overlap]") {
  const auto [t2, serial2] = pipeline(0);  // automatic: 2 buffers
  const auto [t1, serial1] = pipeline(1);
  INFO("double-buffered " << sim::ps_to_ns(t2) << " ns, serial sum " << sim::ps_to_ns(serial2) << " ns, bufs=1 "
                          << sim::ps_to_ns(t1) << " ns");
  CHECK(static_cast<double>(t2) < 0.75 * static_cast<double>(serial2));
  CHECK(static_cast<double>(t2) < 0.9 * static_cast<double>(t1));
}

TEST_CASE("lowering is lazy: a million iterations stream one instruction at a time", "[lower][lazy]") {
  KB b;
  const int t = b.tile("t", {128, 4});
  const int i = b.loop("i", 0, 1000, 1, LoopKind::kSequential);
  const int j = b.loop("j", 0, 1000, 1, LoopKind::kSequential);
  b.ts(X(t, {D(0, 128), D(0, 4)}), W(t), AluOp::kAdd, 1.0f);
  b.end();
  b.end();
  (void)i;
  (void)j;
  auto s = make_sim(false);
  verify_kernel(b.k, s->params());
  Lowering l(b.k, *s);
  Instr in;
  uint64_t n = 0;
  while (l.next(in)) {
    ++n;
    if (n == 1) CHECK(l.instructions() == 1);  // produced on demand, not ahead
  }
  CHECK(n == 1000000);
  CHECK(l.instructions() == 1000000);
  CHECK(!l.next(in));

  auto s2 = make_sim(false);
  Lowering l2(b.k, *s2);
  l2.run();
  s2->finish();
  CHECK(s2->counters().opcode_count[static_cast<size_t>(Opcode::kTensorScalar)] == 1000000);
}

TEST_CASE("lowering: loops with negative steps and empty loops", "[lower]") {
  KB b;
  const int x = b.input("x", {512, 8});
  const int t = b.tile("t", {128, 8}, DType::kFloat32, 1);
  const int i = b.loop("i", 3, -1, -1, LoopKind::kSequential);
  b.op("dma_copy", {W(t), X(x, {D(A(i, 128), 128), D(0, 8)})});
  b.end();
  b.loop("e", 0, 0);
  b.op("dma_copy", {W(t), X(x, {D(0, 128), D(0, 8)})});
  b.end();
  auto s = make_sim(false);
  verify_kernel(b.k, s->params());
  Lowering l(b.k, *s);
  const auto v = drain(l);
  REQUIRE(v.size() == 4);
  const int64_t addr = s->memory().hbm_tensor("x").addr;
  for (size_t it = 0; it < 4; ++it) CHECK(v[it].slot(1).offset == addr + static_cast<int64_t>(3 - it) * 128 * 8 * 4);
}

TEST_CASE("lowering: explicit engines and queues are kept and HBM tensors are reused", "[lower]") {
  KB b;
  const int x = b.input("x", {128, 8});
  const int y = b.output("y", {128, 8});
  const int t = b.tile("t", {128, 8}, DType::kFloat32, 1);
  const int ld = b.op("dma_copy", {W(t), W(x)});
  b.o(ld).engine = Engine::kScalar;
  b.o(ld).dma_queue = 9;
  const int c = b.ts(W(t), W(t), AluOp::kMultiply, 3.0f);
  b.o(c).engine = Engine::kGpsimd;
  const int st = b.op("dma_copy", {W(y), W(t)});
  b.o(st).engine = Engine::kSync;
  auto s = make_sim(false);
  s->alloc_hbm("x", {128, 8}, DType::kFloat32);
  Lowering l(b.k, *s);
  const auto v = drain(l);
  REQUIRE(v.size() == 3);
  CHECK(v[0].engine == Engine::kScalar);
  CHECK(v[0].dma_queue == 9);
  CHECK(v[1].engine == Engine::kGpsimd);
  CHECK(v[2].engine == Engine::kSync);

  auto s2 = make_sim(false);
  s2->alloc_hbm("x", {64, 8}, DType::kFloat32);
  bool thrown = false;
  try {
    Lowering bad(b.k, *s2);
  } catch (const Error& e) {
    thrown = true;
    CHECK(e.code() == ErrorCode::kBadInput);
  }
  CHECK(thrown);
}

TEST_CASE("lowering: an nc_matmul's PE tile moving with a loop index reaches both halves", "[lower][pe_tiling]") {
  // Four K = 32 matmuls on the four 32-row tiles of trn2's PE array (iimm = [row, col, rows, cols]): the
  // load_stationary and the multiply_moving of iteration q both get row 32 q.
  const char* text = R"({"nsim_kernel": 1, "tensors": [{"name": "a", "buffer": "hbm", "kind": "input", "dtype": "bfloat16", "shape": [128, 128]}],
"body": [{"alloc": {"name": "s", "buffer": "sbuf", "dtype": "bfloat16", "shape": [128, 128]}},
  {"op": "dma_copy", "dst": "s", "src": "a"},
  {"loop": {"var": "q", "stop": 4, "body": [
  {"alloc": {"name": "p", "buffer": "psum", "dtype": "float32", "shape": [128, 128]}},
  {"op": "nc_matmul", "dst": "p", "stationary": {"tensor": "s", "index": [{"start": "32*q", "size": 32}, {"size": 128}]},
   "moving": {"tensor": "s", "index": [{"start": "32*q", "size": 32}, {"size": 128}]}, "iimm": ["32*q", 0, 32, 128]}]}}]})";
  const auto v = lowered(frontend::parse_kernel_json(text));
  REQUIRE(v.size() == 9);  // the load, then four (load_stationary, multiply_moving) pairs
  for (size_t q = 0; q < 4; ++q)
    for (size_t h = 0; h < 2; ++h) {
      const isa::Instr& in = v[1 + 2 * q + h];
      CHECK(in.op == (h == 0 ? isa::Opcode::kLoadStationary : isa::Opcode::kMultiplyMoving));
      CHECK(in.iimm[0] == static_cast<int32_t>(32 * q));
      CHECK(in.iimm[2] == 32);
      CHECK(in.iimm[3] == 128);
    }
}

TEST_CASE("lowering: an iimm index expression takes each iteration's value", "[lower]") {
  const char* text = R"({"nsim_kernel": 1, "tensors": [{"name": "y", "buffer": "hbm", "kind": "output", "dtype": "float32", "shape": [512, 4]}],
"body": [{"loop": {"var": "i", "stop": 4, "body": [
  {"alloc": {"name": "t", "buffer": "sbuf", "dtype": "float32", "shape": [128, 4]}},
  {"op": "iota", "dst": "t", "iimm": ["128*i", 1, 0, 1, 0, 1, 0, 1, 1000, 4]},
  {"op": "dma_copy", "dst": {"tensor": "y", "index": [{"start": "128*i", "size": 128}, {"size": 4}]}, "src": "t"}]}}]})";
  const frontend::Kernel k = frontend::parse_kernel_json(text);
  {
    const auto v = lowered(k);
    REQUIRE(v.size() == 8);
    for (size_t it = 0; it < 4; ++it) CHECK(v[2 * it].iimm[0] == static_cast<int32_t>(128 * it));
  }
  // y[r, c] = r + 1000 c: offset 128 i + partition p + 1000 c
  auto s = make_sim(true);
  frontend::Lowering::allocate_hbm(k, *s);
  Lowering l(k, *s);
  l.run();
  s->finish();
  const std::vector<uint8_t> bytes = s->read_hbm("y");
  REQUIRE(bytes.size() == 512 * 4 * sizeof(float));
  std::vector<float> y(512 * 4);
  std::memcpy(y.data(), bytes.data(), bytes.size());
  for (int r = 0; r < 512; ++r)
    for (int c = 0; c < 4; ++c) CHECK(y[static_cast<size_t>(r * 4 + c)] == static_cast<float>(r + 1000 * c));

  // a value past int32 in some iteration: E312 at that instance, with the op's source line
  const std::string big = std::string(text).replace(std::string(text).find("\"128*i\", 1,"), 7, "\"1000000000*i\"");
  const frontend::Kernel kb = frontend::parse_kernel_json(big);
  auto s2 = make_sim(false);
  frontend::Lowering::allocate_hbm(kb, *s2);
  Lowering l2(kb, *s2);
  try {
    drain(l2);
    FAIL("expected E312");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kBadArgument);
    CHECK_THAT(e.message(), Catch::Contains("iimm[0] = 3000000000"));
  }
}
