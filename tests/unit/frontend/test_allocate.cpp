// Liveness-based SBUF/PSUM allocation (frontend/compiler/allocate.h): lifetimes, storage shared by
// tiles with disjoint lifetimes, rotating-buffer fallback, manual bufs, PSUM banks, the overflow
// error naming the live tiles, the static switch, and numerics unchanged by reuse.
#include <catch2/catch.hpp>

#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engines/params.h"
#include "engines/simulator.h"
#include "frontend/compiler/allocate.h"
#include "frontend/ir.h"
#include "frontend/lower.h"
#include "isa/semantics/parallel.h"

#include "kernel_builder.h"

using namespace nsim;
using frontend::allocate_tiles;
using frontend::Lowering;
using frontend::TilePlacement;
using frontend::verify_kernel;
using isa::AluOp;
using isa::Space;

namespace {

engines::CoreParams params(const std::string& preset, const std::vector<std::string>& overrides = {}) {
  return engines::CoreParams::from_config(engines::load_config(preset, overrides));
}
engines::CoreParams static_params(const std::string& preset) { return params(preset, {"compiler.allocation=static"}); }

std::unique_ptr<Simulator> make_sim(bool numerics, const std::vector<std::string>& overrides = {}) {
  return Simulator::from_preset("trn2", overrides, SimOptions{numerics, ""});
}

/// Total time of kernel `k` simulated timing-only on trn2 with `overrides`, placed by `plan` (nullptr: the lowering's
/// own allocation).
sim::Ps time_of(const frontend::Kernel& k, const frontend::AllocationPlan* plan,
                const std::vector<std::string>& overrides = {}) {
  auto s = make_sim(false, overrides);
  Lowering l(k, *s, plan);
  l.run();
  s->finish();
  return s->total_time();
}

/// "t" + n (spelled out: GCC 12 warns falsely about operator+ on a literal and a temporary).
std::string nm(const char* base, int n) {
  std::string s = base;
  s += std::to_string(n);
  return s;
}

/// Byte ranges [offset, offset + stride * bufs) of two placements intersect.
bool overlap(const TilePlacement& a, const TilePlacement& b) {
  return a.offset < b.offset + b.stride * b.bufs && b.offset < a.offset + a.stride * a.bufs;
}

/// load x[i-th 128 rows] into a tile of `cols` fp32 columns, add 1, store to y: one loop, 2 tiles.
void add_one_loop(KB& b, int x, int y, int64_t cols, int trips, int tag, int line) {
  const int i = b.loop(nm("i", tag), 0, trips, 1, LoopKind::kAffine, line);
  const int a = b.tile(nm("a", tag), {128, cols}, DType::kFloat32, 0, line + 1);
  const int u = b.tile(nm("u", tag), {128, cols}, DType::kFloat32, 0, line + 2);
  b.op("dma_copy", {W(a), X(x, {D(A(i, 128), 128), D(0, cols)})}, line + 3);
  b.ts(W(u), W(a), AluOp::kAdd, 1.0f, line + 4);
  b.op("dma_copy", {X(y, {D(A(i, 128), 128), D(0, cols)}), W(u)}, line + 5);
  b.end();
}

}  // namespace

TEST_CASE("allocate: lifetimes follow accesses, loops and scoping", "[allocate]") {
  KB b;
  const int x = b.input("x", {256, 64});
  const int y = b.output("y", {256, 64});
  const int top = b.tile("top", {128, 64});        // statement 0; used inside loop i -> covers it
  const int idle = b.tile("idle", {128, 64});      // 1, never used
  const int i = b.loop("i", 0, 2);                 // 2 .. 7
  const int t = b.tile("t", {128, 64});            // 3
  b.op("dma_copy", {W(t), X(x, {D(A(i, 128), 128), D(0, 64)})});  // 4
  const int j = b.loop("j", 0, 3);                 // 5 .. 6
  b.ts(W(top), X(t, {D(0, 128), B(0, 64)}), AluOp::kAdd, 1.0f);  // 6: t used in a deeper loop -> covers j
  b.end();
  b.op("dma_copy", {X(y, {D(A(i, 128), 128), D(0, 64)}), W(top)});  // 7
  b.end();
  (void)j;
  const auto lt = frontend::tile_lifetimes(b.k);
  REQUIRE(lt.size() == 5);
  CHECK(lt[static_cast<size_t>(x)].first == -1);  // HBM: no alloc statement
  CHECK(lt[static_cast<size_t>(top)].first == 2);
  CHECK(lt[static_cast<size_t>(top)].last == 7);
  CHECK_FALSE(lt[static_cast<size_t>(top)].in_loop);
  CHECK(lt[static_cast<size_t>(idle)].first == 1);
  CHECK(lt[static_cast<size_t>(idle)].last == 1);
  CHECK(lt[static_cast<size_t>(t)].first == 4);
  CHECK(lt[static_cast<size_t>(t)].last == 6);
  CHECK(lt[static_cast<size_t>(t)].in_loop);

  SECTION("a use after the allocating loop (the last iteration's tile) covers the loop") {
    KB c;
    const int in = c.input("x", {128, 8});
    const int out = c.output("y", {128, 8});
    c.loop("k", 0, 4);                 // 0 .. 2
    const int v = c.tile("v", {128, 8});  // 1
    c.op("dma_copy", {W(v), W(in)});   // 2
    c.end();
    c.op("dma_copy", {W(out), W(v)});  // 3
    const auto l2 = frontend::tile_lifetimes(c.k);
    CHECK(l2[static_cast<size_t>(v)].first == 0);
    CHECK(l2[static_cast<size_t>(v)].last == 3);
  }
}

TEST_CASE("allocate: tiles of two sequential loops share storage", "[allocate]") {
  // Each loop's body tile needs 60% of trn2's SBUF (137600 of 229376 B): together they would not fit.
  KB b;
  const int x = b.input("x", {256, 34400});
  const int y = b.output("y", {256, 34400});
  const int z = b.output("z", {256, 34400});
  int tiles[2];
  for (int r = 0; r < 2; ++r) {
    const int i = b.loop(nm("i", r), 0, 2, 1, LoopKind::kAffine, 10 * r + 10);
    const int t = tiles[r] = b.tile(nm("t", r), {128, 34400}, DType::kFloat32, 0, 10 * r + 11);
    b.op("dma_copy", {W(t), X(x, {D(A(i, 128), 128), D(0, 34400)})}, 10 * r + 12);
    b.ts(W(t), W(t), AluOp::kAdd, 1.0f, 10 * r + 13);
    b.op("dma_copy", {X(r ? z : y, {D(A(i, 128), 128), D(0, 34400)}), W(t)}, 10 * r + 14);
    b.end();
  }
  const auto p = params("trn2");
  REQUIRE_NOTHROW(verify_kernel(b.k, p));
  const auto plan = allocate_tiles(b.k, p);
  const TilePlacement& p0 = plan.tiles[static_cast<size_t>(tiles[0])];
  const TilePlacement& p1 = plan.tiles[static_cast<size_t>(tiles[1])];
  for (const TilePlacement* q : {&p0, &p1}) {
    CHECK(q->bufs == 1);  // two buffers of 60% do not fit
    CHECK(q->stride == 137600);
  }
  CHECK(overlap(p0, p1));  // the second loop reuses the first's bytes
  CHECK(plan.sbuf_peak == 137600);
  CHECK(plan.sbuf_extent == 137600);

  // Static allocation: every tile its own region, which does not fit.
  try {
    allocate_tiles(b.k, static_params("trn2"));
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kSbufOverflow);
    CHECK_THAT(e.message(), Catch::Contains("compiler.allocation: static"));
    CHECK_THAT(e.message(), Catch::Contains("need 275200 bytes"));
  }

  // Lowering places both in one region and runs.
  auto s = make_sim(false);
  Lowering l(b.k, *s);
  CHECK(overlap(l.placements()[static_cast<size_t>(tiles[0])], l.placements()[static_cast<size_t>(tiles[1])]));
  l.run();
  s->finish();
  CHECK(l.instructions() == 12);
  CHECK(s->stats().get("memory.sbuf_peak_bytes_per_partition") == 137600);
}

TEST_CASE("allocate: the verifier's plan goes to the lowering only while nothing is allocated", "[allocate]") {
  // One loop whose body tile takes 30% of trn2's SBUF (68800 of 229376 B per buffer). verify_kernel works
  // the allocation out once, for the whole of SBUF: three buffers (90%; compiler.loop_buffers = 4 would take
  // 120%). The lowering of a fresh simulator takes that plan as is (same placements, same run). With 50% of
  // SBUF already taken the plan no longer holds: the lowering works the allocation out again and gives the
  // tile one buffer, which fits (with the plan's three buffers the region would not fit: E204).
  KB b;
  const int x = b.input("x", {512, 17200});
  const int y = b.output("y", {512, 17200});
  const int i = b.loop("i", 0, 4, 1, LoopKind::kAffine, 10);
  const int t = b.tile("t", {128, 17200}, DType::kFloat32, 0, 11);
  b.op("dma_copy", {W(t), X(x, {D(A(i, 128), 128), D(0, 17200)})}, 12);
  b.ts(W(t), W(t), AluOp::kAdd, 1.0f, 13);
  b.op("dma_copy", {X(y, {D(A(i, 128), 128), D(0, 17200)}), W(t)}, 14);
  b.end();
  const auto ti = static_cast<size_t>(t);

  auto s = make_sim(false);
  frontend::AllocationPlan plan;
  verify_kernel(b.k, s->params(), &plan);
  CHECK(plan.tiles[ti].stride == 68800);
  CHECK(plan.tiles[ti].bufs == 3);
  Lowering with(b.k, *s, &plan);
  CHECK(with.placements()[ti].bufs == 3);
  with.run();
  s->finish();
  auto s2 = make_sim(false);
  Lowering without(b.k, *s2);
  without.run();
  s2->finish();
  CHECK(s->total_time() == s2->total_time());

  auto s3 = make_sim(false);
  s3->alloc_tile(Space::kSbuf, 128, {229376 / 2 / 4}, DType::kFloat32);  // half of a partition
  Lowering half(b.k, *s3, &plan);
  CHECK(half.placements()[ti].bufs == 1);
  half.run();
  s3->finish();
  CHECK(half.instructions() == 12);
}

TEST_CASE("allocate: loop-body tiles totalling 4x SBUF, never more than half live, simulate", "[allocate]") {
  // 8 sequential loops, each with two double-buffered [128, 7168] fp32 tiles: 4 x 57344 = 229376 B
  // (all of trn2's SBUF / 2 ... x 8 loops = 4x SBUF over the run), at most 114688 B live at once.
  KB b;
  const int x = b.input("x", {256, 7168});
  const int y = b.output("y", {256, 7168});
  for (int r = 0; r < 8; ++r) add_one_loop(b, x, y, 7168, 2, r, 10 * (r + 1));
  auto s = make_sim(false);
  verify_kernel(b.k, s->params());
  Lowering l(b.k, *s);
  int64_t total = 0;
  for (const TilePlacement& pl : l.placements())
    if (pl.tensor >= 0) {
      CHECK(pl.bufs == 2);
      total += pl.stride * pl.bufs;
    }
  CHECK(total == 4 * s->params().mem.sbuf_bytes_per_partition);
  l.run();
  s->finish();
  CHECK(l.instructions() == 8 * 2 * 3);
  const auto st = s->stats();
  CHECK(st.get("memory.sbuf_peak_bytes_per_partition") == 2 * 2 * 7168 * 4);
  CHECK(st.get("memory.sbuf_peak_bytes_per_partition") <= s->params().mem.sbuf_bytes_per_partition / 2);

  // With compiler.allocation=static the same kernel overflows.
  auto s2 = make_sim(false, {"compiler.allocation=static"});
  try {
    Lowering l2(b.k, *s2);
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kSbufOverflow);
  }
}

TEST_CASE("allocate: E204 names the tiles live at the point of peak use", "[allocate][capacity]") {
  KB b;
  const int x = b.input("x", {128, 21000});
  const int ya = b.output("ya", {128, 21000});
  const int yb = b.output("yb", {128, 21000});
  const int yc = b.output("yc", {128, 21000});
  const int dead = b.tile("dead", {128, 20000}, DType::kFloat32, 0, 50);  // live before the others only
  const int ta = b.tile("ta", {128, 20000}, DType::kFloat32, 0, 51);      // 80000 B
  const int tb = b.tile("tb", {128, 20000}, DType::kFloat32, 0, 52);      // 80000 B
  const int tc = b.tile("tc", {128, 21000}, DType::kFloat32, 0, 53);      // 84032 B: 244032 B live together
  b.op("dma_copy", {W(dead), X(x, {D(0, 128), D(0, 20000)})}, 60);
  b.op("dma_copy", {X(ya, {D(0, 128), D(0, 20000)}), W(dead)}, 61);
  b.op("dma_copy", {W(ta), X(x, {D(0, 128), D(0, 20000)})}, 62);
  b.op("dma_copy", {W(tb), X(x, {D(0, 128), D(0, 20000)})}, 63);
  b.op("dma_copy", {W(tc), W(x)}, 64);
  b.op("dma_copy", {X(ya, {D(0, 128), D(0, 20000)}), W(ta)}, 65);
  b.op("dma_copy", {X(yb, {D(0, 128), D(0, 20000)}), W(tb)}, 66);
  b.op("dma_copy", {W(yc), W(tc)}, 67);
  try {
    verify_kernel(b.k, params("trn2"));
    FAIL("no error");
  } catch (const Error& e) {
    INFO(e.message());
    CHECK(e.code() == ErrorCode::kSbufOverflow);
    CHECK(e.loc().line == 53);  // the largest live tile
    CHECK_THAT(e.message(), Catch::Contains("need 244032 bytes per partition"));
    CHECK_THAT(e.message(), Catch::Contains("but 229376 are available"));
    CHECK_THAT(e.message(), Catch::Contains("'tc' [128, 21000] float32 x 1 buffer = 84032 bytes (kernel.py:53)"));
    CHECK_THAT(e.message(), Catch::Contains("'ta' [128, 20000] float32 x 1 buffer = 80000 bytes (kernel.py:51)"));
    CHECK_THAT(e.message(), Catch::Contains("'tb' [128, 20000] float32 x 1 buffer = 80000 bytes (kernel.py:52)"));
    CHECK_THAT(e.message(), Catch::Contains("(at kernel.py:64)"));  // the point of peak use
    CHECK_THAT(e.message(), !Catch::Contains("'dead'"));
    // Largest first.
    CHECK(e.message().find("'tc'") < e.message().find("'ta'"));
  }
  // The same tiles fit on trn3 (256 KiB).
  CHECK_NOTHROW(verify_kernel(b.k, params("trn3")));

  SECTION("long lists are cut at 8 tiles") {
    KB c;
    const int in = c.input("x", {128, 6000});
    const int out = c.output("y", {128, 6000});
    std::vector<int> ts;
    for (int n = 0; n < 10; ++n) ts.push_back(c.tile(nm("t", n), {128, 6000}, DType::kFloat32, 0, 70 + n));
    for (int t : ts) c.op("dma_copy", {W(t), W(in)});
    for (int t : ts) c.op("dma_copy", {W(out), W(t)});
    try {
      allocate_tiles(c.k, params("trn2"));
      FAIL("no error");
    } catch (const Error& e) {
      CHECK(e.code() == ErrorCode::kSbufOverflow);
      CHECK_THAT(e.message(), Catch::Contains("need 240000 bytes"));
      CHECK_THAT(e.message(), Catch::Contains(", and 2 more"));
      CHECK(e.loc().line == 70);
    }
  }
}

TEST_CASE("allocate: manual bufs are honoured, automatic ones fall back first", "[allocate][bufs]") {
  KB b;
  const int x = b.input("x", {512, 12500});
  const int y = b.output("y", {512, 12500});
  const int once = b.tile("once", {128, 16}, DType::kFloat32, 2, 5);  // top level, manual 2
  const int i = b.loop("i", 0, 4, 1, LoopKind::kSequential);  // 'once' is written every iteration
  const int m = b.tile("m", {128, 12500}, DType::kFloat32, 3, 6);     // 50000 B x 3 (manual)
  const int a = b.tile("a", {128, 12500}, DType::kFloat32, 0, 7);     // 50000 B x 2 (automatic)
  b.op("dma_copy", {W(m), X(x, {D(A(i, 128), 128), D(0, 12500)})});
  b.ts(W(a), W(m), AluOp::kAdd, 1.0f);
  b.ts(W(once), X(a, {D(0, 128), D(0, 16)}), AluOp::kAdd, 1.0f);
  b.op("dma_copy", {X(y, {D(A(i, 128), 128), D(0, 12500)}), W(a)});
  b.end();
  const auto p = params("trn2");
  REQUIRE_NOTHROW(verify_kernel(b.k, p));
  const auto plan = allocate_tiles(b.k, p);
  const auto& pl = plan.tiles;
  CHECK(pl[static_cast<size_t>(once)].bufs == 2);
  CHECK(pl[static_cast<size_t>(m)].bufs == 3);
  CHECK(pl[static_cast<size_t>(a)].bufs == 1);  // 3 x 50048 + 2 x 50048 > 229376: the automatic one yields
  CHECK_FALSE(overlap(pl[static_cast<size_t>(m)], pl[static_cast<size_t>(a)]));
  CHECK_FALSE(overlap(pl[static_cast<size_t>(once)], pl[static_cast<size_t>(a)]));
  // With room, the automatic tile keeps 2 buffers (trn3: 256 KiB).
  CHECK(allocate_tiles(b.k, params("trn3")).tiles[static_cast<size_t>(a)].bufs == 2);

  // The lowering rotates m over its 3 buffers.
  auto s = make_sim(false);
  Lowering l(b.k, *s);
  const TilePlacement mp = l.placements()[static_cast<size_t>(m)];
  std::vector<isa::Instr> v;
  isa::Instr in;
  while (l.next(in)) v.push_back(in);
  REQUIRE(v.size() == 16);
  for (size_t it = 0; it < 4; ++it) CHECK(v[4 * it].slot(0).offset == mp.offset + static_cast<int64_t>(it % 3) * mp.stride);
}

TEST_CASE("allocate: PSUM tiles take whole banks and never straddle them", "[allocate][psum]") {
  KB b;
  const int a = b.input("a", {128, 128}, DType::kBFloat16);
  const int bm = b.input("b", {128, 512}, DType::kBFloat16);
  const int c = b.output("c", {128, 1536});
  const int at = b.tile("at", {128, 128}, DType::kBFloat16);
  const int bt = b.tile("bt", {128, 512}, DType::kBFloat16);
  b.op("dma_copy", {W(at), W(a)});
  b.op("dma_copy", {W(bt), W(bm)});
  // Loop 1: a 400 B PSUM tile (one bank) per iteration; loop 2: a 4 KiB one (two banks).
  const int i = b.loop("i", 0, 3);
  const int p1 = b.psum("p1", {128, 100});
  const int s1 = b.tile("s1", {128, 100});
  b.op("nc_matmul", {W(p1), W(at), X(bt, {D(0, 128), D(0, 100)})});
  b.op("tensor_copy", {W(s1), W(p1)});
  b.op("dma_copy", {X(c, {D(0, 128), D(A(i, 100), 100)}), W(s1)});
  b.end();
  const int j = b.loop("j", 0, 2);
  const int p2 = b.psum("p2", {128, 1024});
  const int s2 = b.tile("s2", {128, 512});
  b.op("nc_matmul", {X(p2, {D(0, 128), D(0, 512)}), W(at), W(bt)});
  b.op("tensor_copy", {W(s2), X(p2, {D(0, 128), D(0, 512)})});
  b.op("dma_copy", {X(c, {D(0, 128), D(A(j, 512, 512), 512)}), W(s2)});
  b.end();
  // compiler.psum_loop_buffers = 4: as many buffers as the loops' trips (3 and 2).
  const std::vector<std::string> four = {"compiler.psum_loop_buffers=4"};
  const auto p = params("trn2", four);
  REQUIRE_NOTHROW(verify_kernel(b.k, p));
  // With 4 banks available the loops' tiles (3 x 1 bank: one buffer per trip of loop i, then 2 x 2 banks) must
  // share banks.
  const auto plan = allocate_tiles(b.k, p, -1, 8192);
  const TilePlacement& q1 = plan.tiles[static_cast<size_t>(p1)];
  const TilePlacement& q2 = plan.tiles[static_cast<size_t>(p2)];
  CHECK(q1.stride == 2048);
  CHECK(q1.bufs == 3);
  CHECK(q2.stride == 4096);
  CHECK(q2.bufs == 2);
  for (const TilePlacement* q : {&q1, &q2}) CHECK(q->offset % 2048 == 0);
  CHECK(overlap(q1, q2));  // disjoint lifetimes share banks
  CHECK(plan.psum_peak == 8192);
  // With all 8 banks, loop j's tiles take banks loop i never used (no write-after-read wait on p1's
  // last eviction): 3 + 4 banks (compiler.psum_loop_buffers = 4: p1 gets one buffer per trip, 3; p2 two, its
  // trips), the peak stays 8192 (one loop at a time).
  const auto roomy = allocate_tiles(b.k, p);
  CHECK_FALSE(overlap(roomy.tiles[static_cast<size_t>(p1)], roomy.tiles[static_cast<size_t>(p2)]));
  CHECK(roomy.tiles[static_cast<size_t>(p1)].bufs == 3);
  CHECK(roomy.psum_extent == 7 * 2048);
  CHECK(roomy.psum_peak == 8192);

  // On a simulator whose PSUM already holds 100 bytes, the region still starts on a bank, and the plan has the
  // banks after it: 7, where the 7 banks of the plan above would need 8 with the one the region starts after (the
  // loops then fall back to 2 buffers each: 2 + 4 banks). (The placement search off: it would also time one buffer
  // per PSUM loop tile, the fallen-back tiles sharing banks, and keep that when faster.)
  auto s = make_sim(false, {"compiler.psum_loop_buffers=4", "compiler.placement_search=0"});
  s->alloc_tile(Space::kPsum, 128, {25}, DType::kFloat32);
  const int64_t used = s->memory().allocator(Space::kPsum).used();
  Lowering l(b.k, *s);
  for (int t : {p1, p2}) {
    const TilePlacement& q = l.placements()[static_cast<size_t>(t)];
    CHECK(q.offset % 2048 == 0);
    CHECK(q.offset >= 2048);
  }
  l.run();
  s->finish();
  CHECK(s->stats().get("memory.psum_peak_bytes_per_partition") == static_cast<double>(used + 8192));
}

TEST_CASE("allocate: E206 when simultaneously live PSUM tiles exceed 8 banks", "[allocate][psum][capacity]") {
  auto build = [](int n) {
    KB b;
    const int a = b.input("a", {128, 128}, DType::kBFloat16);
    const int c = b.output("c", {128, 128});
    const int at = b.tile("at", {128, 128}, DType::kBFloat16);
    b.op("dma_copy", {W(at), W(a)});
    std::vector<int> ps;
    for (int j = 0; j < n; ++j) ps.push_back(b.psum(nm("p", j), {128, 128}, 0, 80 + j));
    for (int t : ps) b.op("nc_matmul", {W(t), W(at), W(at)});  // all live until read below
    const int ct = b.tile("ct", {128, 128});
    for (int t : ps) b.op("tensor_copy", {W(ct), W(t)});
    b.op("dma_copy", {W(c), W(ct)});
    return b.k;
  };
  try {
    allocate_tiles(build(9), params("trn2"));
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kPsumOverflow);
    CHECK(e.loc().line == 80);
    CHECK_THAT(e.message(), Catch::Contains("need 18432 bytes per partition"));
    CHECK_THAT(e.message(), Catch::Contains("whole 2 KiB banks"));
    CHECK_THAT(e.message(), Catch::Contains("x 1 buffer = 2048 bytes (kernel.py:80)"));
    CHECK_THAT(e.message(), Catch::Contains(", and 1 more"));
  }
  // Eight fit, one bank each.
  const auto plan = allocate_tiles(build(8), params("trn2"));
  CHECK(plan.psum_peak == 16384);
  CHECK(plan.psum_extent == 16384);
}

TEST_CASE("allocate numerics: tiles reusing other tiles' storage compute what static allocation does",
          "[allocate][numerics]") {
  // Loop i: a = x[i]; u = a + 1 -> y[i] (double-buffered). Loop j (one buffer each): b = x2[j];
  // v = b * 3; w = v + 2 -> z[j]. Loop j's tiles may take loop i's bytes, and w may take b's (b is
  // dead once v is computed).
  KB b;
  const int x = b.input("x", {256, 512});
  const int x2 = b.input("x2", {256, 512});
  const int y = b.output("y", {256, 512});
  const int z = b.output("z", {256, 512});
  const int i = b.loop("i", 0, 2);
  const int ta = b.tile("a", {128, 512});
  const int tu = b.tile("u", {128, 512});
  b.op("dma_copy", {W(ta), X(x, {D(A(i, 128), 128), D(0, 512)})});
  b.ts(W(tu), W(ta), AluOp::kAdd, 1.0f);
  b.op("dma_copy", {X(y, {D(A(i, 128), 128), D(0, 512)}), W(tu)});
  b.end();
  const int j = b.loop("j", 0, 2);
  const int tb = b.tile("b", {128, 512}, DType::kFloat32, 1);
  const int tv = b.tile("v", {128, 512}, DType::kFloat32, 1);
  const int tw = b.tile("w", {128, 512}, DType::kFloat32, 1);
  b.op("dma_copy", {W(tb), X(x2, {D(A(j, 128), 128), D(0, 512)})});
  b.ts(W(tv), W(tb), AluOp::kMultiply, 3.0f);
  b.ts(W(tw), W(tv), AluOp::kAdd, 2.0f);
  b.op("dma_copy", {X(z, {D(A(j, 128), 128), D(0, 512)}), W(tw)});
  b.end();

  std::vector<float> xv(256 * 512), x2v(256 * 512);
  for (size_t n = 0; n < xv.size(); ++n) {
    xv[n] = static_cast<float>(n % 977) * 0.25f - 100.0f;
    x2v[n] = static_cast<float>((n * 31) % 1013) * 0.5f - 200.0f;
  }
  auto run = [&](const std::vector<std::string>& overrides, std::vector<TilePlacement>& pl) {
    auto s = make_sim(true, overrides);
    verify_kernel(b.k, s->params());
    Lowering::allocate_hbm(b.k, *s);
    s->write_hbm("x", xv.data(), xv.size() * 4);
    s->write_hbm("x2", x2v.data(), x2v.size() * 4);
    Lowering l(b.k, *s);
    pl = l.placements();
    l.run();
    s->finish();
    return std::make_pair(s->read_hbm("y"), s->read_hbm("z"));
  };
  std::vector<TilePlacement> live_pl, static_pl;
  // SBUF of 4 KiB per partition: loop i's tiles fall back to one buffer each (2 x 2 KiB at its peak)
  // and loop j must reuse their bytes. (With room, tiles take bytes unused so far: no sharing.)
  const auto live = run({"sbuf.bytes_per_partition=4KiB"}, live_pl);
  const auto stat = run({"compiler.allocation=static"}, static_pl);
  const auto pl = [](const std::vector<TilePlacement>& p, int t) { return p[static_cast<size_t>(t)]; };
  // Reuse happened with liveness allocation, not with static.
  CHECK(overlap(pl(live_pl, tw), pl(live_pl, tb)));
  CHECK((overlap(pl(live_pl, tb), pl(live_pl, ta)) || overlap(pl(live_pl, tb), pl(live_pl, tu))));
  CHECK_FALSE(overlap(pl(live_pl, ta), pl(live_pl, tu)));
  CHECK_FALSE(overlap(pl(live_pl, tb), pl(live_pl, tv)));
  CHECK_FALSE(overlap(pl(live_pl, tv), pl(live_pl, tw)));
  const int all[] = {ta, tu, tb, tv, tw};
  for (int p : all)
    for (int q : all)
      if (p < q) CHECK_FALSE(overlap(pl(static_pl, p), pl(static_pl, q)));
  CHECK(live.first == stat.first);
  CHECK(live.second == stat.second);
  std::vector<float> yv(xv.size()), zv(xv.size());
  REQUIRE(live.first.size() == yv.size() * 4);
  REQUIRE(live.second.size() == zv.size() * 4);
  std::memcpy(yv.data(), live.first.data(), live.first.size());
  std::memcpy(zv.data(), live.second.data(), live.second.size());
  size_t bad = 0;
  for (size_t n = 0; n < xv.size(); ++n) bad += (yv[n] != xv[n] + 1.0f) + (zv[n] != x2v[n] * 3.0f + 2.0f);
  CHECK(bad == 0);
}

TEST_CASE("allocate: unrolled code reusing one tile for many values splits its lifetime when short",
          "[allocate][values]") {
  // What the tracer emits for an unrolled loop: tiles A and B alternate (A holds the values of even
  // iterations, B of odd ones), each written whole, then read. Whole-tile lifetimes overlap (A and B
  // both span the kernel); value-level ranges do not, so when A + B do not fit, they share storage.
  auto build = [](int64_t cols, bool half_write) {
    KB b;
    const int x = b.input("x", {128, 4 * cols});
    const int y = b.output("y", {128, 4 * cols});
    const int ta = b.tile("A", {128, cols}, DType::kFloat32, 0, 90);
    const int tb = b.tile("B", {128, cols}, DType::kFloat32, 0, 91);
    for (int it = 0; it < 4; ++it) {
      const int t = it % 2 ? tb : ta;
      if (half_write && it == 2) {  // a write of half the partitions does not end the previous value
        b.op("dma_copy", {X(t, {D(0, 64), D(0, cols)}), X(x, {D(0, 64), D(it * cols, cols)})}, 100 + it);
        b.op("dma_copy", {X(t, {D(64, 64), D(0, cols)}), X(x, {D(64, 64), D(it * cols, cols)})}, 100 + it);
      } else {
        b.op("dma_copy", {W(t), X(x, {D(0, 128), D(it * cols, cols)})}, 100 + it);
      }
      b.ts(W(t), W(t), AluOp::kAdd, static_cast<float>(it + 1), 110 + it);
      b.op("dma_copy", {X(y, {D(0, 128), D(it * cols, cols)}), W(t)}, 120 + it);
    }
    return b.k;
  };
  const Kernel k = build(34400, false);  // 137600 B each: 60% of trn2's SBUF
  const auto plan = allocate_tiles(k, params("trn2"));
  CHECK(overlap(plan.tiles[2], plan.tiles[3]));
  CHECK(plan.sbuf_peak == 137600);
  // With room, the tiles keep their own storage (the tracer's double buffering).
  const auto roomy = allocate_tiles(build(1024, false), params("trn2"));
  CHECK_FALSE(overlap(roomy.tiles[2], roomy.tiles[3]));
  // A value not ended by a whole write keeps the tiles live together.
  try {
    allocate_tiles(build(34400, true), params("trn2"));
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kSbufOverflow);
    CHECK_THAT(e.message(), Catch::Contains("'A'"));
    CHECK_THAT(e.message(), Catch::Contains("'B'"));
  }

  // Numerics: on a 12 KiB SBUF two 8 KiB tiles must share; results match a roomy static allocation.
  const Kernel small = build(2048, false);
  std::vector<float> xv(128 * 4 * 2048);
  for (size_t n = 0; n < xv.size(); ++n) xv[n] = static_cast<float>(n % 1531) * 0.125f - 50.0f;
  auto run = [&](const std::vector<std::string>& overrides, std::vector<TilePlacement>& pl) {
    auto s = make_sim(true, overrides);
    verify_kernel(small, s->params());
    Lowering::allocate_hbm(small, *s);
    s->write_hbm("x", xv.data(), xv.size() * 4);
    Lowering l(small, *s);
    pl = l.placements();
    l.run();
    s->finish();
    return s->read_hbm("y");
  };
  std::vector<TilePlacement> tight_pl, static_pl;
  const auto tight = run({"sbuf.bytes_per_partition=12KiB"}, tight_pl);
  const auto roomy_static = run({"compiler.allocation=static"}, static_pl);
  CHECK(overlap(tight_pl[2], tight_pl[3]));
  CHECK_FALSE(overlap(static_pl[2], static_pl[3]));
  CHECK(tight == roomy_static);
  std::vector<float> yv(xv.size());
  REQUIRE(tight.size() == yv.size() * 4);
  std::memcpy(yv.data(), tight.data(), tight.size());
  size_t bad = 0;
  for (size_t n = 0; n < yv.size(); ++n) {
    const size_t it = (n % (4 * 2048)) / 2048;
    bad += yv[n] != xv[n] + static_cast<float>(it + 1);
  }
  CHECK(bad == 0);
}

TEST_CASE("allocate: value-level live ranges are spread over the free banks, not packed into one",
          "[allocate][values][psum]") {
  // Nine PSUM tiles of one bank each, used in turn twice (what the tracer emits when it reuses a line's
  // tiles across unrolled iterations): whole-tile lifetimes all overlap (9 banks > 8), so the allocator
  // falls back to value-level ranges, which never overlap. Packed tightly every tile would take bank 0,
  // and each matmul would wait for the previous tile's eviction (a false write-after-read edge); placed
  // where the bytes were used longest ago, consecutive tiles take different banks, as with whole lifetimes.
  KB b;
  const int a = b.input("a", {128, 128}, DType::kBFloat16);
  const int y = b.output("y", {128, 18 * 128});
  const int at = b.tile("at", {128, 128}, DType::kBFloat16);
  const int sb = b.tile("sb", {128, 18 * 128});
  b.op("dma_copy", {W(at), W(a)});
  std::vector<int> ps;
  for (int t = 0; t < 9; ++t) ps.push_back(b.psum(nm("p", t), {128, 128}, 0, 10 + t));
  for (int it = 0; it < 18; ++it) {
    const int p = ps[static_cast<size_t>(it % 9)];
    b.op("nc_matmul", {W(p), W(at), W(at)}, 30 + it);
    b.op("tensor_copy", {X(sb, {D(0, 128), D(it * 128, 128)}), W(p)}, 50 + it);
  }
  b.op("dma_copy", {W(y), W(sb)}, 70);
  const auto p = params("trn2");
  REQUIRE_NOTHROW(verify_kernel(b.k, p));
  const auto plan = allocate_tiles(b.k, p);
  CHECK(plan.psum_peak == 2048);  // one value live at a time
  std::vector<int64_t> banks;
  for (int t : ps) banks.push_back(plan.tiles[static_cast<size_t>(t)].offset / 2048);
  // p0..p7 take the 8 banks in turn; p8 the one used longest ago (p0's, free again: its value ended).
  for (size_t t = 0; t < 8; ++t) CHECK(banks[t] == static_cast<int64_t>(t));
  CHECK(banks[8] == banks[0]);
  CHECK(plan.psum_extent == 8 * 2048);
  // On 2 banks the tiles alternate: each one's neighbour in program order is in the other bank.
  const auto two = allocate_tiles(b.k, p, -1, 4096);
  for (size_t t = 0; t + 1 < ps.size(); ++t)
    CHECK(two.tiles[static_cast<size_t>(ps[t])].offset != two.tiles[static_cast<size_t>(ps[t + 1])].offset);
}

TEST_CASE("allocate: value-level ranges of tiles accumulated over an inner loop", "[allocate][values][psum]") {
  // The same nine PSUM tiles used in turn twice, each value zeroed, accumulated by the matmuls of an inner loop kt
  // (2 trips, kept: its one op stands for both iterations) and evicted: what a ragged, unrolled Beta-1 tile loop
  // with `acc = nl.zeros(..., buffer=nl.psum)` and `acc += nc_matmul(...)` over an affine_range emits. The value is
  // live into kt's body (carried across its iterations): the tile is live across the whole loop, and dead again
  // after its eviction. Regression: value_ranges gave up on such a tile, and the kernel was a false NSIM-E206.
  KB b;
  const int a = b.input("a", {128, 128}, DType::kBFloat16);
  const int y = b.output("y", {128, 18 * 128});
  const int at = b.tile("at", {128, 128}, DType::kBFloat16);
  const int sb = b.tile("sb", {128, 18 * 128});
  b.op("dma_copy", {W(at), W(a)});
  std::vector<int> ps;
  for (int t = 0; t < 9; ++t) ps.push_back(b.psum(nm("p", t), {128, 128}, 0, 10 + t));
  for (int it = 0; it < 18; ++it) {
    const int p = ps[static_cast<size_t>(it % 9)];
    b.op("memset", {W(p)}, 30 + it);
    b.loop(nm("kt", it), 0, 2, 1, LoopKind::kAffine, 50 + it);
    const int mm = b.op("nc_matmul", {W(p), W(at), W(at)}, 70 + it);
    b.o(mm).flags = isa::kAccumulate;
    b.end();
    b.op("tensor_copy", {X(sb, {D(0, 128), D(it * 128, 128)}), W(p)}, 90 + it);
  }
  b.op("dma_copy", {W(y), W(sb)}, 120);
  const auto p = params("trn2");
  REQUIRE_NOTHROW(verify_kernel(b.k, p));
  const auto plan = allocate_tiles(b.k, p);
  CHECK(plan.psum_peak == 2048);  // one value live at a time
  // p1 .. p7's values each start after p0's ended; p8 is never live with p0's second value either.
  for (size_t t = 0; t + 1 < ps.size(); ++t)
    CHECK(plan.tiles[static_cast<size_t>(ps[t])].offset != plan.tiles[static_cast<size_t>(ps[t + 1])].offset);
}

TEST_CASE("allocate: when PSUM is short, tiles of one allocation site rotate over that site's banks",
          "[allocate][psum][sites]") {
  // A kept loop g (2 trips) whose body starts with a loop j (4 trips) of one-bank PSUM tiles (site line 28,
  // 2 rotating buffers), then two more tiles of line 28 (the tracer's peeled or unrolled instances), four
  // tiles of other lines and a loop i (2 trips) of rotating tiles: 2 + 2 + 4 + 2 = 10 banks, 8 available.
  // Spread over never-used banks first, loop i's tiles would have to take the banks of the tile used
  // longest ago — loop j's, which the next iteration of g needs first (its K loads would wait for the
  // previous head's last matmuls). Instead line 28's later tiles rotate over loop j's two buffers (the
  // first one first: the loop's last iteration, j = 3, used buffer 1), as the unrolled trace's tiles of
  // one line do, and every other tile keeps a bank of its own.
  KB b;
  const int a = b.input("a", {128, 128}, DType::kBFloat16);
  const int y = b.output("y", {128, 128});
  const int at = b.tile("at", {128, 128}, DType::kBFloat16, 0, 5);
  const int sb = b.tile("sb", {128, 128}, DType::kFloat32, 0, 6);
  b.op("dma_copy", {W(at), W(a)}, 7);
  auto mm = [&](int ps, int line) {
    b.op("nc_matmul", {W(ps), W(at), W(at)}, line);
    b.op("tensor_copy", {W(sb), W(ps)}, line + 1);
  };
  b.loop("g", 0, 2, 1, LoopKind::kSequential, 20);  // sequential: every iteration writes `sb`
  b.loop("j", 0, 4, 1, LoopKind::kSequential, 27);
  const int pj = b.psum("pj", {128, 128}, 0, 28);
  mm(pj, 29);
  b.end();
  const int a1 = b.psum("a1", {128, 128}, 1, 28);
  mm(a1, 31);
  const int a2 = b.psum("a2", {128, 128}, 1, 28);
  mm(a2, 33);
  std::vector<int> others;
  for (int t = 0; t < 4; ++t) {
    others.push_back(b.psum(nm("o", t), {128, 128}, 1, 40 + 2 * t));
    mm(others.back(), 41 + 2 * t);
  }
  b.loop("i", 0, 2, 1, LoopKind::kSequential, 50);
  const int pi = b.psum("pi", {128, 128}, 0, 51);
  mm(pi, 52);
  b.end();
  b.op("dma_copy", {W(y), W(sb)}, 60);
  b.end();
  // (With compiler.psum_loop_buffers = 4, loop j's tiles hold 4 banks across loop j alone and everything fits
  // without sharing: the case is two buffers per loop tile, the presets'.)
  const auto p = params("trn2", {"compiler.psum_loop_buffers=2"});
  REQUIRE_NOTHROW(verify_kernel(b.k, p));
  const auto plan = allocate_tiles(b.k, p);
  auto tile = [&](int t) { return plan.tiles[static_cast<size_t>(t)]; };
  REQUIRE(tile(pj).bufs == 2);
  REQUIRE(tile(pi).bufs == 2);
  CHECK(tile(a1).offset == tile(pj).offset);         // buffer 0 of loop j's tile
  CHECK(tile(a2).offset == tile(pj).offset + 2048);  // then buffer 1 (a1 is now the line's latest)
  for (int t : others) {
    CHECK_FALSE(overlap(tile(t), tile(pj)));
    CHECK_FALSE(overlap(tile(t), tile(pi)));
  }
  CHECK_FALSE(overlap(tile(pi), tile(pj)));
  for (size_t u = 0; u < others.size(); ++u)
    for (size_t v = u + 1; v < others.size(); ++v) CHECK_FALSE(overlap(tile(others[u]), tile(others[v])));
  CHECK(plan.psum_extent == 8 * 2048);
}

TEST_CASE("allocate: which PSUM tiles of a kept loop share a bank is chosen by timing", "[allocate][psum][search]") {
  // A head loop g (4 trips) shaped as the library's flash attention's: a loop j of one-bank PSUM tiles (2 rotating
  // buffers), then a loop i whose body fills four PSUM tiles in turn (2 buffers each): 10 banks wanted, 8 there, at
  // most 8 live at once (loop i's), so one of loop i's tiles shares loop j's banks, and the next head's first
  // matmuls wait for that tile's last use in this head. The allocator alone gives them to the last tile placed; the
  // lowering simulates each swap of two equal-sized PSUM tiles' banks (AllocationPlan::psum_swaps) and keeps the
  // fastest placement (compiler.placement_search), or the allocator's when none beats it. Loop i's body is a chain
  // (each matmul takes the previous copy's result), so a head's tail is latency-bound and the next head's matmuls
  // could fill it: 12,080.5 ns with the allocator's placement (the chain's last tile on loop j's banks), 8,193.0 ns
  // with the fastest swap (the first tile of the chain there).
  KB b;
  const int a = b.input("a", {4 * 128, 128}, DType::kBFloat16);
  const int y1 = b.output("y1", {4 * 2 * 128, 128});
  const int y2 = b.output("y2", {4 * 2 * 128, 128});
  const int g = b.loop("g", 0, 4, 1, LoopKind::kAffine, 10);
  const int at = b.tile("at", {128, 128}, DType::kBFloat16, 0, 11);
  b.op("dma_copy", {W(at), X(a, {D(A(g, 128), 128), D(0, 128)})}, 12);
  const int j = b.loop("j", 0, 2, 1, LoopKind::kAffine, 20);
  const int pj = b.psum("pj", {128, 128}, 0, 21);
  b.op("nc_matmul", {W(pj), W(at), W(at)}, 22);
  const int sj = b.tile("sj", {128, 128}, DType::kFloat32, 0, 23);
  b.op("tensor_copy", {W(sj), W(pj)}, 24);
  b.op("dma_copy", {X(y1, {D(Affine{0, {{g, 256}, {j, 128}}}, 128), D(0, 128)}), W(sj)}, 25);
  b.end();
  const int i = b.loop("i", 0, 2, 1, LoopKind::kAffine, 30);
  int prev = at;  // a chain: each matmul takes the previous one's result (PE and a copy engine in turn)
  for (int t = 0; t < 4; ++t) {
    const int pt = b.psum(nm("p", t), {128, 128}, 0, 31 + 4 * t);
    b.op("nc_matmul", {W(pt), W(prev), W(at)}, 32 + 4 * t);
    const int st = b.tile(nm("s", t), {128, 128}, t < 3 ? DType::kBFloat16 : DType::kFloat32, 0, 33 + 4 * t);
    b.op("tensor_copy", {W(st), W(pt)}, 34 + 4 * t);
    prev = st;
  }
  b.op("dma_copy", {X(y2, {D(Affine{0, {{g, 256}, {i, 128}}}, 128), D(0, 128)}), W(prev)}, 50);
  b.end();
  b.end();
  const auto p = params("trn2", {"compiler.psum_loop_buffers=2"});
  frontend::AllocationPlan plan;
  REQUIRE_NOTHROW(verify_kernel(b.k, p, &plan));
  REQUIRE_FALSE(plan.psum_swaps.empty());
  // The kernel's time with a given plan, the search off (the plan as it is).
  const std::vector<std::string> off = {"compiler.psum_loop_buffers=2", "compiler.placement_search=0"};
  const sim::Ps allocator = time_of(b.k, &plan, off);
  sim::Ps best = allocator;
  for (const auto& [x, y] : plan.psum_swaps) {
    frontend::AllocationPlan v = plan;
    std::swap(v.tiles[static_cast<size_t>(x)].offset, v.tiles[static_cast<size_t>(y)].offset);
    best = std::min(best, time_of(b.k, &v, off));
  }
  CHECK(time_of(b.k, &plan, {"compiler.psum_loop_buffers=2"}) == best);
  // (the plan and its swaps timed at once on two host threads, one after the other on one: the same choice)
  nsim::isa::sem::set_host_threads_for_testing(1);
  CHECK(time_of(b.k, &plan, {"compiler.psum_loop_buffers=2"}) == best);
  nsim::isa::sem::set_host_threads_for_testing(2);
  CHECK(time_of(b.k, &plan, {"compiler.psum_loop_buffers=2"}) == best);
  nsim::isa::sem::set_host_threads_for_testing(0);
  INFO("allocator " << allocator << " best " << best);
  CHECK(best < allocator * 9 / 10);  // here the choice matters: the heads overlap
  // The same outputs either way (numerics on: every tile keeps its bytes while live).
  auto outputs = [&](const std::vector<std::string>& ov) {
    auto sn = make_sim(true, ov);
    Lowering::allocate_hbm(b.k, *sn);
    const uint16_t vals[] = {0x3F80, 0x3F00, 0xBF00, 0x3E80, 0xBF80, 0x0000, 0x3FC0};  // bf16 1, .5, -.5, .25, -1, 0, 1.5
    std::vector<uint16_t> in(4 * 128 * 128);
    for (size_t e = 0; e < in.size(); ++e) in[e] = vals[(e * 5) % 7];
    sn->write_hbm("a", in.data(), in.size() * 2);
    Lowering ln(b.k, *sn, &plan);
    ln.run();
    sn->finish();
    return std::make_pair(sn->read_hbm("y1"), sn->read_hbm("y2"));
  };
  CHECK(outputs({"compiler.psum_loop_buffers=2"}) == outputs({"compiler.psum_loop_buffers=2", "compiler.placement_search=0"}));
}

TEST_CASE("allocate: when the spread placement fragments PSUM, the packed one is improved tile by tile",
          "[allocate][psum]") {
  // PSUM tiles (banks, lifetimes in statements): A 1 [1,2], B 1 [3,12], C 1 [4,13], D 2 [5,9], E 2 [6,10], F 2 [7,8],
  // Y 2 [11,14], G 2 [15,16]; B..F fill the 8 banks at once. Placed in order of lifetime start where their bytes
  // were used longest ago, A, B, C, D, E take banks 0..6 and F finds no two free banks in a row (0 and 7 are): that
  // placement is given up. Packed largest first, Y and then G take D's banks, and G's first write waits for Y's last
  // read, the statement before it (sgmv_lora_prefill's next segment's transposes waited so for this segment's
  // accumulator, tests/python/kernels/lora_kv_quant_kernels_beta1.py: 28,789.8 ns kept against 20,198.6 unrolled).
  // The packed placement is then improved: each tile in turn moves to the free window whose bytes other tiles use
  // furthest from its own lifetime.
  KB b;
  const auto ps = [&](const char* n, int banks) { return b.psum(n, {128, 512 * banks}, 1, 5); };
  const int ta = ps("A", 1), tb = ps("B", 1), tc = ps("C", 1), td = ps("D", 2), te = ps("E", 2), tf = ps("F", 2),
            ty = ps("Y", 2), tg = ps("G", 2);
  const int sb = b.tile("sb", {128, 1024}, DType::kFloat32, 1, 6);
  const auto set = [&](int t) { b.op("memset", {W(t)}, 10); };
  const auto get = [&](int t) { b.op("tensor_copy", {X(sb, {D(0, 128), D(0, b.k.tensors[static_cast<size_t>(t)].shape[1])}), W(t)}, 11); };
  set(ta), get(ta), set(tb), set(tc), set(td), set(te), set(tf), get(tf), get(td), get(te), set(ty), get(tb), get(tc), get(ty),
      set(tg), get(tg);
  const auto plan = allocate_tiles(b.k, params("trn2"));
  const auto& pl = plan.tiles;
  const auto at = [&](int t) { return pl[static_cast<size_t>(t)]; };
  CHECK(!overlap(at(tg), at(ty)));
  // Still valid: tiles live at the same time hold different bytes.
  const std::vector<std::pair<int, int>> live = {{tb, tc}, {tb, td}, {tb, te}, {tb, tf}, {tc, td}, {tc, te}, {tc, tf},
                                                 {td, te}, {td, tf}, {te, tf}, {tb, ty}, {tc, ty}};
  for (auto [x, y] : live) CHECK(!overlap(at(x), at(y)));
  CHECK(plan.psum_extent <= 8 * 2048);
}

TEST_CASE("allocate: a tile no instruction accesses takes no storage from the others", "[allocate][psum]") {
  // The tracer's result tile of an nc_matmul written into its `+=` target instead (`acc[j] += nc_matmul(...)`,
  // the decode GEMV of tests/python/kernels/gemm_epilogue_kernels.py): allocated, never accessed. In a loop nb of
  // two trips, acc [128, 4 x 512] fp32 (four banks) gets two rotating buffers, all eight banks; the unused tiles
  // allocated in the body counted as live at their alloc, inside acc's span, so acc fell back to one buffer and the
  // second iteration's matmuls waited for the first's copy out (the GEMV: 25,225.4 ns kept against 17,859.2 ns
  // unrolled, now 18,588.2 kept). An unused tile still has to fit on its own.
  auto build = [](bool unused, int64_t unused_cols) {
    KB b;
    const int w = b.input("w", {128, 2 * 2048}, DType::kBFloat16);
    const int y = b.output("y", {128, 2 * 2048});
    const int st = b.tile("st", {128, 128}, DType::kBFloat16, 0, 5);
    b.op("dma_copy", {W(st), X(w, {D(0, 128), D(0, 128)})}, 6);
    const int nb = b.loop("nb", 0, 2, 1, LoopKind::kAffine, 10);
    const int acc = b.psum("acc", {128, 2048}, 0, 11);
    const int mv = b.tile("mv", {128, 2048}, DType::kBFloat16, 0, 12);
    b.op("dma_copy", {W(mv), X(w, {D(0, 128), D(A(nb, 2048), 2048)})}, 13);
    for (int j = 0; j < 4; ++j) {
      if (unused) b.psum(nm("unused", j), {128, unused_cols}, 0, 14);
      b.op("nc_matmul", {X(acc, {D(0, 128), D(512 * j, 512)}), W(st), X(mv, {D(0, 128), D(512 * j, 512)})}, 15);
    }
    const int sb = b.tile("sb", {128, 2048}, DType::kFloat32, 0, 16);
    b.op("tensor_copy", {W(sb), W(acc)}, 17);
    b.op("dma_copy", {X(y, {D(0, 128), D(A(nb, 2048), 2048)}), W(sb)}, 18);
    b.end();
    return b.k;
  };
  const auto p = params("trn2");
  const frontend::Kernel with = build(true, 512), without = build(false, 0);
  REQUIRE_NOTHROW(verify_kernel(with, p));
  const auto plan = allocate_tiles(with, p);
  CHECK(plan.tiles[static_cast<size_t>(with.find_tensor("acc"))].bufs == 2);
  CHECK(plan.tiles[static_cast<size_t>(with.find_tensor("unused0"))].bufs == 1);
  CHECK(time_of(with, nullptr) == time_of(without, nullptr));
  // With the static allocation every tile keeps its storage, used or not: acc has one buffer.
  CHECK(allocate_tiles(with, static_params("trn2")).tiles[static_cast<size_t>(with.find_tensor("acc"))].bufs == 1);
  // An unused tile larger than PSUM (4,097 fp32 columns: 16,388 bytes) is still an overflow, on its line.
  try {
    verify_kernel(build(true, 4097), p);
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kPsumOverflow);
    CHECK(e.loc().line == 14);
    CHECK_THAT(e.message(), Catch::Contains("'unused0'"));
  }
}

TEST_CASE("allocate: one buffer per PSUM loop tile is a candidate of the placement search", "[allocate][psum][search]") {
  // A head loop h (4 trips) whose body holds three spans written out by Python, as a sliding-window decode's
  // (tests/python/kernels/serving_attention_kernels.py): each a chain of four one-bank PSUM tiles (matmul, copy out,
  // the next matmul takes the copy), the last added into an accumulator. Spans 0 and 1 allocate at the same lines
  // (the tracer's site_count 2: one buffer each), span 2 at lines of its own (two buffers wanted). Taken back tile by
  // tile, span 2's tiles keep two buffers across the whole body (six banks) and the nine others crowd into the two
  // banks left. With one buffer per PSUM loop tile the allocator spreads all twelve over the 8 banks. The search
  // times the allocator's plan and its swaps, then the one-buffer plan and its swaps, and keeps the fastest.
  KB b;
  const int a = b.input("a", {4 * 128, 128}, DType::kBFloat16);
  const int y = b.output("y", {4 * 128, 128});
  const int h = b.loop("h", 0, 4, 1, LoopKind::kAffine, 10);
  const int at = b.tile("at", {128, 128}, DType::kBFloat16, 0, 11);
  b.op("dma_copy", {W(at), X(a, {D(A(h, 128), 128), D(0, 128)})}, 12);
  const int acc = b.tile("acc", {128, 128}, DType::kFloat32, 0, 13);
  b.op("memset", {W(acc)}, 14);
  for (int c = 0; c < 3; ++c) {  // three spans, each a chain of four, added into one accumulator
    int prev = at;
    for (int t = 4 * c; t < 4 * c + 4; ++t) {
      // spans 0 and 1 allocate at the same lines (the tracer's site_count 2: one buffer each), span 2 at its own
      const int pt = b.psum(nm("p", t), {128, 128}, 0, c < 2 ? 20 + t % 4 : 30 + t % 4);
      if (c < 2) b.k.tensors[static_cast<size_t>(pt)].site_count = 2;
      b.op("nc_matmul", {W(pt), W(prev), W(at)}, 40 + 3 * t);
      if (t == 4 * c + 3) {
        b.op("tensor_tensor", {W(acc), W(acc), W(pt)}, 41 + 3 * t);
        b.k.ops.back().alu0 = AluOp::kAdd;
        break;
      }
      const int st = b.tile(nm("s", t), {128, 128}, DType::kBFloat16, 0, 41 + 3 * t);
      b.op("tensor_copy", {W(st), W(pt)}, 42 + 3 * t);
      prev = st;
    }
  }
  b.op("dma_copy", {X(y, {D(A(h, 128), 128), D(0, 128)}), W(acc)}, 80);
  b.end();
  const auto p = params("trn2");
  frontend::AllocationPlan plan;
  REQUIRE_NOTHROW(verify_kernel(b.k, p, &plan));
  REQUIRE(plan.psum_depth_candidate);
  const auto timed = [&](const frontend::AllocationPlan& v) { return time_of(b.k, &v, {"compiler.placement_search=0"}); };
  // Every candidate: the allocator's plan and its swaps, the one-buffer plan and its swaps.
  const auto shallow = allocate_tiles(b.k, params("trn2", {"compiler.psum_loop_buffers=1"}));
  auto fastest = [&](const frontend::AllocationPlan& q) {
    sim::Ps t = timed(q);
    for (const auto& [x, z] : q.psum_swaps) {
      frontend::AllocationPlan v = q;
      std::swap(v.tiles[static_cast<size_t>(x)].offset, v.tiles[static_cast<size_t>(z)].offset);
      t = std::min(t, timed(v));
    }
    return t;
  };
  const sim::Ps allocator = timed(plan), by_swaps = fastest(plan), with_one = fastest(shallow);
  const sim::Ps searched = time_of(b.k, &plan);
  INFO("allocator " << allocator << ", its fastest swap " << by_swaps << ", one buffer and its swaps " << with_one
                    << ", searched " << searched);
  CHECK(searched == std::min(by_swaps, with_one));
  CHECK(searched < allocator * 9 / 10);
  // Here a swap of the allocator's plan wins (18,434.1 ns the allocator's plan, 17,423.3 ns one buffer per tile,
  // 14,949.6 ns the fastest swap of the allocator's plan); the sliding-window decode, where the one-buffer plan
  // wins, is tests/python/test_serving_attention_kernels.py test_sink_window_kept_loop_times_as_unrolled.
  CHECK(timed(shallow) < allocator);
}

TEST_CASE("allocate: a rotating PSUM tile's banks shared with a later tile make one buffer per loop tile a candidate",
          "[allocate][psum][search]") {
  // A loop i (4 trips) with a one-bank PSUM tile pa (two rotating buffers, held across the loop), then seven
  // one-bank PSUM tiles written out after it: six take the banks nothing used, the seventh the bytes used longest
  // ago, pa's. No two tiles of one multi-trip loop share a bank (no swap to try), but a later tile waits for the
  // rotating tile's last reads: the placement with one buffer per PSUM loop tile is timed too (the nki-samples
  // style MQA of tests/python/kernels/serving_attention_kernels.py, its query-tile loop written out: 76,000.2 ns
  // kept against 62,181.6 ns unrolled, 61,715.0 ns with this candidate).
  KB b;
  const int a = b.input("a", {128, 128}, DType::kBFloat16);
  const int y = b.output("y", {12 * 128, 128});
  const int at = b.tile("at", {128, 128}, DType::kBFloat16, 0, 5);
  b.op("dma_copy", {W(at), W(a)}, 6);
  const int i = b.loop("i", 0, 4, 1, LoopKind::kAffine, 10);
  const int pa = b.psum("pa", {128, 128}, 0, 11);
  b.op("nc_matmul", {W(pa), W(at), W(at)}, 12);
  const int sa = b.tile("sa", {128, 128}, DType::kFloat32, 0, 13);
  b.op("tensor_copy", {W(sa), W(pa)}, 14);
  b.op("dma_copy", {X(y, {D(A(i, 128), 128), D(0, 128)}), W(sa)}, 15);
  b.end();
  for (int t = 0; t < 7; ++t) {
    const int q = b.psum(nm("q", t), {128, 128}, 0, 20 + t);
    b.op("nc_matmul", {W(q), W(at), W(at)}, 30 + t);
    const int sq = b.tile(nm("sq", t), {128, 128}, DType::kFloat32, 0, 40 + t);
    b.op("tensor_copy", {W(sq), W(q)}, 50 + t);
    b.op("dma_copy", {X(y, {D((4 + t) * 128, 128), D(0, 128)}), W(sq)}, 60 + t);
  }
  const auto p = params("trn2");
  frontend::AllocationPlan plan;
  REQUIRE_NOTHROW(verify_kernel(b.k, p, &plan));
  REQUIRE(plan.tiles[static_cast<size_t>(pa)].bufs == 2);
  CHECK(plan.psum_swaps.empty());
  CHECK(plan.psum_depth_candidate);
  const sim::Ps allocator = time_of(b.k, &plan, {"compiler.placement_search=0"});
  const auto shallow = allocate_tiles(b.k, params("trn2", {"compiler.psum_loop_buffers=1"}));
  CHECK(shallow.tiles[static_cast<size_t>(pa)].bufs == 1);
  const sim::Ps one = time_of(b.k, &shallow, {"compiler.placement_search=0"});
  const sim::Ps searched = time_of(b.k, &plan);
  INFO("allocator " << allocator << ", one buffer " << one << ", searched " << searched);
  CHECK(searched <= allocator);
  CHECK(searched <= one);
}

TEST_CASE("allocate: a PSUM loop tile left with one buffer while banks stay unused gets a second one by timing",
          "[allocate][psum][search]") {
  // A head loop h (4 trips) whose body holds two spans written out by Python, as the speculative-decoding verify
  // attention's key blocks (tests/python/kernels/spec_decode_kernels_new.py): each span a chain scores -> P^T -> P V
  // of one-bank PSUM tiles, the spans' tiles allocated at the same lines (the tracer's site_count 2: one buffer
  // each, the site rotating over two banks). Six banks used, two unused, no tile sharing: the next head's first
  // matmul waits for this head's copy out of its bank. The search gives one tile at a time a second buffer (its
  // alloc a manual depth of 2), keeps the fastest, and goes on from it while a round gains (the library kernel
  // verify_attention, tests/python/test_spec_decode_kernels.py: 22,067.7 ns kept against 15,940.8 ns unrolled
  // before, 16,682.4 ns kept now).
  KB b;
  const int a = b.input("a", {4 * 128, 128}, DType::kBFloat16);
  const int m = b.input("m", {128, 512}, DType::kBFloat16);
  const int y = b.output("y", {4 * 128, 512});
  const int mv = b.tile("mv", {128, 512}, DType::kBFloat16, 0, 8);
  b.op("dma_copy", {W(mv), W(m)}, 9);
  const int h = b.loop("h", 0, 4, 1, LoopKind::kAffine, 10);
  const int at = b.tile("at", {128, 128}, DType::kBFloat16, 0, 11);
  b.op("dma_copy", {W(at), X(a, {D(A(h, 128), 128), D(0, 128)})}, 12);
  const int acc = b.tile("acc", {128, 512}, DType::kFloat32, 0, 13);
  b.op("memset", {W(acc)}, 14);
  for (int c = 0; c < 2; ++c) {
    Access prev = W(at);
    for (int t = 0; t < 3; ++t) {
      const int pt = b.psum(nm(c ? "q" : "p", t), {128, 512}, 0, 20 + 3 * t);
      b.k.tensors[static_cast<size_t>(pt)].site_count = 2;
      b.op("nc_matmul", {W(pt), prev, W(mv)}, 21 + 3 * t);
      if (t == 2) {
        b.op("tensor_tensor", {W(acc), W(acc), W(pt)}, 22 + 3 * t);
        b.k.ops.back().alu0 = AluOp::kAdd;
        break;
      }
      const int st = b.tile(nm(c ? "r" : "s", t), {128, 512}, DType::kBFloat16, 0, 22 + 3 * t);
      b.op("tensor_copy", {W(st), W(pt)}, 22 + 3 * t);
      prev = X(st, {D(0, 128), D(0, 128)});
    }
  }
  b.op("dma_copy", {X(y, {D(A(h, 128), 128), D(0, 512)}), W(acc)}, 40);
  b.end();
  const auto p = params("trn2");
  frontend::AllocationPlan plan;
  REQUIRE_NOTHROW(verify_kernel(b.k, p, &plan));
  REQUIRE(plan.psum_swaps.empty());  // no two tiles share a bank: no swap to try
  REQUIRE_FALSE(plan.psum_depth_candidate);
  REQUIRE(plan.psum_deepen.size() == 6);
  auto run = [&](const std::vector<std::string>& ov) {
    auto s = make_sim(false, ov);
    Lowering l(b.k, *s, &plan);
    l.run();
    s->finish();
    int deep = 0;
    for (const int t : plan.psum_deepen) deep += l.placements()[static_cast<size_t>(t)].bufs > 1;
    return std::make_pair(s->total_time(), deep);
  };
  const auto [allocator, none] = run({"compiler.placement_search=0"});
  const auto [searched, deep] = run({});
  INFO("allocator " << allocator << ", searched " << searched << " with " << deep << " tiles given two buffers");
  // A round's six candidates are timed two at a time on two host threads (choose_placement): the same choice as
  // one after the other on one.
  nsim::isa::sem::set_host_threads_for_testing(1);
  const auto one_thread = run({});
  nsim::isa::sem::set_host_threads_for_testing(2);
  const auto two_threads = run({});
  nsim::isa::sem::set_host_threads_for_testing(0);
  CHECK(one_thread == std::make_pair(searched, deep));
  CHECK(two_threads == std::make_pair(searched, deep));
  CHECK(none == 0);
  CHECK(deep >= 1);
  CHECK(searched < allocator);  // here 15,928.2 -> 15,712.2 ns (a head's chains are latency-bound either way)
  // One tile deepened by hand, the fastest such: the first round's choice; the search is at least as fast.
  sim::Ps one = allocator;
  for (const int t : plan.psum_deepen) {
    frontend::Kernel kd = b.k;
    kd.tensors[static_cast<size_t>(t)].bufs = 2;
    one = std::min(one, time_of(kd, nullptr, {"compiler.placement_search=0"}));
  }
  CHECK(searched <= one);
  CHECK(one < allocator);
}

TEST_CASE("allocate: which SBUF loop tile keeps a second buffer when SBUF is short is chosen by timing",
          "[allocate][bufs][search]") {
  // A row loop i (4 trips): load a [128, 12288] fp32 row block (48 KiB per partition), an activation of it on
  // ScalarE, the product of both on VectorE, store. Three 48 KiB tiles live at the product: 144 KiB with one buffer
  // each, 192 with two for one of them, 240 for two: SBUF holds one second buffer, and the fallback (largest tiles
  // at the peak first, from compiler.loop_buffers down) leaves it to the product's tile, where it overlaps nothing:
  // 268,512.6 ns. The search (compiler.placement_search) gives each one-buffer tile in turn a manual depth of 2, the
  // fallback taking buffers from the others, and keeps the fastest: the loaded tile's, the next row's load then runs
  // under this row's compute, 184,580.4 ns.
  KB b;
  const int x = b.input("x", {4 * 128, 12288});
  const int y = b.output("y", {4 * 128, 12288});
  const int i = b.loop("i", 0, 4, 1, LoopKind::kAffine, 10);
  const int t0 = b.tile("t0", {128, 12288}, DType::kFloat32, 0, 11);
  b.op("dma_copy", {W(t0), X(x, {D(A(i, 128), 128), D(0, 12288)})}, 12);
  const int t1 = b.tile("t1", {128, 12288}, DType::kFloat32, 0, 13);
  b.op("activation", {W(t1), W(t0)}, 14);
  const int t2 = b.tile("t2", {128, 12288}, DType::kFloat32, 0, 15);
  b.op("tensor_tensor", {W(t2), W(t1), W(t0)}, 16);
  b.k.ops.back().alu0 = AluOp::kMultiply;
  b.op("dma_copy", {X(y, {D(A(i, 128), 128), D(0, 12288)}), W(t2)}, 17);
  b.end();
  const auto p = params("trn2");
  frontend::AllocationPlan plan;
  REQUIRE_NOTHROW(verify_kernel(b.k, p, &plan));
  int two = 0;
  for (const int t : {t0, t1, t2}) two += plan.tiles[static_cast<size_t>(t)].bufs == 2;
  INFO("sbuf_deepen " << plan.sbuf_deepen.size() << " two " << two);
  CHECK(plan.sbuf_deepen.size() + two == 3);
  const sim::Ps allocator = time_of(b.k, &plan, {"compiler.placement_search=0"});
  const sim::Ps searched = time_of(b.k, &plan);
  sim::Ps one = allocator;
  for (const int t : plan.sbuf_deepen) {
    frontend::Kernel kd = b.k;
    kd.tensors[static_cast<size_t>(t)].bufs = 2;
    const sim::Ps tt = time_of(kd, nullptr, {"compiler.placement_search=0"});
    UNSCOPED_INFO("tile " << b.k.tensors[static_cast<size_t>(t)].name << " deepened: " << tt);
    one = std::min(one, tt);
  }
  INFO("allocator " << allocator << ", searched " << searched << ", best single " << one);
  CHECK(searched <= one);
  CHECK(one < allocator);
}

TEST_CASE("allocate: manual address= placements are kept and a live overlap is placed elsewhere with a warning",
          "[allocate][manual]") {
  // x -> a (manual at 8192) -> u (automatic) -> y, one iteration: a and u live together.
  KB b;
  const int x = b.input("x", {128, 64});
  const int y = b.output("y", {128, 64});
  const int a = b.tile("a", {128, 64}, DType::kFloat32, 0, 5);
  const int u = b.tile("u", {128, 64}, DType::kFloat32, 0, 6);
  b.k.tensors[static_cast<size_t>(a)].address = 8192;
  b.op("dma_copy", {W(a), W(x)}, 7);
  b.ts(W(u), W(a), AluOp::kAdd, 1.0f, 8);
  b.op("dma_copy", {W(y), W(u)}, 9);
  {
    const auto plan = allocate_tiles(b.k, params("trn2"));
    CHECK(plan.tiles[static_cast<size_t>(a)].offset == 8192);
    CHECK(!overlap(plan.tiles[static_cast<size_t>(a)], plan.tiles[static_cast<size_t>(u)]));
    CHECK(plan.warnings.empty());
  }
  // u asks for a's bytes while a is live: u keeps its own storage (values stay right), with a warning
  // naming both tiles and lines.
  b.k.tensors[static_cast<size_t>(u)].address = 8192 + 128;
  {
    const auto plan = allocate_tiles(b.k, params("trn2"));
    CHECK(plan.tiles[static_cast<size_t>(a)].offset == 8192);
    CHECK(!overlap(plan.tiles[static_cast<size_t>(a)], plan.tiles[static_cast<size_t>(u)]));
    REQUIRE(plan.warnings.size() == 1);
    CHECK(plan.warnings[0].find("'u' (kernel.py:6)") != std::string::npos);
    CHECK(plan.warnings[0].find("'a' (kernel.py:5)") != std::string::npos);
  }
  // Numerics: y = x + 1 with the manual placement.
  b.k.tensors[static_cast<size_t>(u)].address = 0;
  auto sim = make_sim(true);
  verify_kernel(b.k, sim->params());
  Lowering low(b.k, *sim);
  std::vector<float> in(128 * 64);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i % 97);
  sim->write_hbm("x", in.data(), in.size() * sizeof(float));
  low.run();
  sim->finish();
  const auto out = sim->read_hbm("y");
  std::vector<float> got(in.size());
  std::memcpy(got.data(), out.data(), out.size());
  for (size_t i = 0; i < in.size(); ++i) CHECK(got[i] == in[i] + 1.0f);
  // An address beyond the memory is a capacity error naming the tile.
  b.k.tensors[static_cast<size_t>(a)].address = 229376;
  try {
    allocate_tiles(b.k, params("trn2"));
    FAIL("expected E204");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kSbufOverflow);
    CHECK(std::string(e.what()).find("'a'") != std::string::npos);
  }
}

TEST_CASE("allocate: automatic tiles keep clear of a manual tile's bytes while capacity allows", "[allocate][manual][psum]") {
  // A head loop g (4 trips) whose body fills a PSUM tile placed by hand (address 0: bank 0), copies it out, then
  // fills an automatic one-buffer PSUM tile u from that copy: within one iteration their lifetimes are disjoint,
  // so packing alone gives u bank 0 too, and the next head's first matmul must wait for this head's last read of u
  // (a write-after-read edge between iterations that are otherwise independent). Seven banks are free: as without
  // manual tiles, u takes bytes nothing used (the pipelining-aware placement, docs/timing-model.md "Memory
  // allocation"), and the heads overlap.
  KB b;
  const int a = b.input("a", {4 * 128, 128}, DType::kBFloat16);
  const int y = b.output("y", {4 * 128, 128});
  const int g = b.loop("g", 0, 4, 1, LoopKind::kAffine, 10);
  const int at = b.tile("at", {128, 128}, DType::kBFloat16, 0, 11);
  b.op("dma_copy", {W(at), X(a, {D(A(g, 128), 128), D(0, 128)})}, 12);
  const int m = b.psum("m", {128, 128}, 1, 13);
  b.k.tensors[static_cast<size_t>(m)].address = 0;
  b.op("nc_matmul", {W(m), W(at), W(at)}, 14);
  const int sm = b.tile("sm", {128, 128}, DType::kBFloat16, 0, 15);
  b.op("tensor_copy", {W(sm), W(m)}, 16);
  const int u = b.psum("u", {128, 128}, 1, 17);
  b.op("nc_matmul", {W(u), W(sm), W(at)}, 18);
  const int su = b.tile("su", {128, 128}, DType::kFloat32, 0, 19);
  b.op("tensor_copy", {W(su), W(u)}, 20);
  b.op("dma_copy", {X(y, {D(A(g, 128), 128), D(0, 128)}), W(su)}, 21);
  b.end();
  const auto p = params("trn2");
  frontend::AllocationPlan plan;
  REQUIRE_NOTHROW(verify_kernel(b.k, p, &plan));
  CHECK(plan.tiles[static_cast<size_t>(m)].offset == 0);
  CHECK(!overlap(plan.tiles[static_cast<size_t>(m)], plan.tiles[static_cast<size_t>(u)]));
  frontend::AllocationPlan packed = plan;  // u on the manual tile's bank, as packing alone placed it
  packed.tiles[static_cast<size_t>(u)].offset = 0;
  const sim::Ps apart = time_of(b.k, &plan), shared = time_of(b.k, &packed);
  INFO("apart " << apart << " shared " << shared);
  CHECK(apart < shared);
}

TEST_CASE("allocate: automatic depths step down to double buffering before any tile gets one buffer", "[allocate][bufs]") {
  // `n` tiles of 50000 B per partition (fp32 [128, 12500]) loaded, added and stored in a loop of 8 trips, trn2
  // (229376 B): compiler.loop_buffers = 4 asks 200,000 B per tile. Falling back one buffer at a time, largest
  // first (equal here: the first tile first), every tile reaches two buffers before any goes to one, so a kernel
  // that fits double-buffered keeps double buffering:
  //   1 tile: 4 x 50048 = 200,192 fits.
  //   2 tiles: 4 + 4 -> 3 + 4 -> 2 + 4 -> 2 + 3 (250,240 > 229,376) -> 2 + 2 (200,192) fits.
  //   3 tiles: 2 + 2 + 2 (300,288) does not fit: then to one buffer, first tile first: 1 + 2 + 2 (250,240) ->
  //   1 + 1 + 2 (200,192), as with two buffers to start from.
  auto kernel = [](int n) {
    KB b;
    const int x = b.input("x", {1024, 12500});
    const int y = b.output("y", {1024, 12500});
    const int i = b.loop("i", 0, 8, 1, LoopKind::kAffine, 5);
    std::vector<int> t;
    for (int j = 0; j < n; ++j) t.push_back(b.tile(nm("t", static_cast<char>('a' + j)), {128, 12500}, DType::kFloat32, 0, 6 + j));
    for (int j = 0; j < n; ++j) {
      b.op("dma_copy", {W(t[static_cast<size_t>(j)]), X(x, {D(A(i, 128), 128), D(0, 12500)})}, 20 + j);
      b.ts(W(t[static_cast<size_t>(j)]), W(t[static_cast<size_t>(j)]), AluOp::kAdd, 1.0f, 30 + j);
      b.op("dma_copy", {X(y, {D(A(i, 128), 128), D(0, 12500)}), W(t[static_cast<size_t>(j)])}, 40 + j);
    }
    b.end();
    return std::make_pair(b.k, t);
  };
  const auto p = params("trn2");
  REQUIRE(p.loop_buffers == 4);
  auto depths = [&](int n) {
    const auto [k, t] = kernel(n);
    REQUIRE_NOTHROW(verify_kernel(k, p));
    const auto plan = allocate_tiles(k, p);
    std::vector<int> v;
    for (int id : t) v.push_back(plan.tiles[static_cast<size_t>(id)].bufs);
    return v;
  };
  CHECK(depths(1) == std::vector<int>{4});
  CHECK(depths(2) == std::vector<int>{2, 2});
  CHECK(depths(3) == std::vector<int>{1, 1, 2});
}

TEST_CASE("allocate: PSUM loop tiles share one depth, the deepest that fits, before any falls back alone",
          "[allocate][bufs][psum]") {
  // `n` one-bank PSUM tiles (fp32 [128, 512]) written by a matmul and evacuated in a loop of 8 trips, trn2 with
  // compiler.psum_loop_buffers = 4 (8 banks). Every loop tile gets the same depth, the deepest of 4, 3, 2 at
  // which they all fit as they are:
  //   1 tile: 4 banks; 2 tiles: 4 + 4 = 8 banks: both at 4.
  //   3 tiles: 4 x 3 = 12 and 3 x 3 = 9 banks do not fit, 2 x 3 = 6 do: 2, 2, 2. (Taken back tile by tile from 4,
  //   the tiles would end at 2, 2, 4: the last one deeper than the others, which at 4 tiles and more left the
  //   one-buffer tiles sharing the banks the deeper ones left: docs/timing-model.md "Buffers".)
  //   5 tiles: 2 x 5 = 10 banks do not fit: from 2 the tile-by-tile fallback, first tiles first: 1, 1, 2, 2, 2.
  auto depths = [](int n, const std::vector<std::string>& overrides) {
    KB b;
    const int a = b.input("a", {128, 512}, DType::kBFloat16);
    const int y = b.output("y", {128, 512});
    const int at = b.tile("at", {128, 512}, DType::kBFloat16, 0, 5);
    const int sb = b.tile("sb", {128, 512}, DType::kFloat32, 0, 6);
    b.op("dma_copy", {W(at), W(a)}, 7);
    b.loop("i", 0, 8, 1, LoopKind::kSequential, 8);
    std::vector<int> t;
    for (int j = 0; j < n; ++j) {
      t.push_back(b.psum(nm("p", static_cast<char>('a' + j)), {128, 512}, 0, 10 + 3 * j));
      b.op("nc_matmul", {W(t.back()), X(at, {D(0, 128), D(0, 128)}), W(at)}, 11 + 3 * j);
      b.op("tensor_copy", {W(sb), W(t.back())}, 12 + 3 * j);
    }
    b.end();
    b.op("dma_copy", {W(y), W(sb)}, 60);
    const auto p = params("trn2", overrides);
    REQUIRE_NOTHROW(verify_kernel(b.k, p));
    const auto plan = allocate_tiles(b.k, p);
    std::vector<int> v;
    for (int id : t) v.push_back(plan.tiles[static_cast<size_t>(id)].bufs);
    return v;
  };
  const std::vector<std::string> four = {"compiler.psum_loop_buffers=4"};
  CHECK(depths(1, four) == std::vector<int>{4});
  CHECK(depths(2, four) == std::vector<int>{4, 4});
  CHECK(depths(3, four) == std::vector<int>{2, 2, 2});
  CHECK(depths(5, four) == std::vector<int>{1, 1, 2, 2, 2});
  // The presets' 2: every tile double-buffered while 8 banks allow.
  REQUIRE(params("trn2").psum_loop_buffers == 2);
  CHECK(depths(3, {}) == std::vector<int>{2, 2, 2});
  CHECK(depths(5, {}) == std::vector<int>{1, 1, 2, 2, 2});
  // compiler.psum_loop_buffers = 3: 3 tiles at 3 = 9 banks do not fit either; 2 tiles at 3 do.
  CHECK(depths(2, {"compiler.psum_loop_buffers=3"}) == std::vector<int>{3, 3});
  CHECK(depths(3, {"compiler.psum_loop_buffers=3"}) == std::vector<int>{2, 2, 2});
}

TEST_CASE("allocate: a site allocated n times in one loop body shares the depth", "[allocate][bufs]") {
  // The tracer's kept loop with an inner loop unrolled in its body allocates one site (source line and call path)
  // n times in one body, marked "site_count": n: together they rotate over compiler.loop_buffers = 4 storages
  // (trn2), as the unrolled trace's tiles of the site do: ceil(4 / n) buffers each. Another tile keeps its 4.
  auto depths = [](int n) {
    KB b;
    const int x = b.input("x", {128, 64});
    const int y = b.output("y", {128, 64});
    b.loop("i", 0, 8, 1, LoopKind::kSequential, 5);
    std::vector<int> t;
    for (int j = 0; j < n; ++j) t.push_back(b.tile(nm("t", static_cast<char>('a' + j)), {128, 64}, DType::kFloat32, 0, 6));
    const int other = b.tile("o", {128, 64}, DType::kFloat32, 0, 7);
    for (int id : t) {
      b.op("dma_copy", {W(id), W(x)}, 8);
      b.op("dma_copy", {W(y), W(id)}, 9);
    }
    b.op("dma_copy", {W(other), W(x)}, 10);
    b.op("dma_copy", {W(y), W(other)}, 11);
    b.end();
    for (int id : t) b.k.tensors[static_cast<size_t>(id)].site_count = n;
    const auto p = params("trn2");
    REQUIRE_NOTHROW(verify_kernel(b.k, p));
    const auto plan = allocate_tiles(b.k, p);
    std::vector<int> v;
    for (int id : t) v.push_back(plan.tiles[static_cast<size_t>(id)].bufs);
    v.push_back(plan.tiles[static_cast<size_t>(other)].bufs);
    return v;
  };
  CHECK(depths(1) == std::vector<int>{4, 4});
  CHECK(depths(2) == std::vector<int>{2, 2, 4});
  CHECK(depths(3) == std::vector<int>{2, 2, 2, 4});
  CHECK(depths(4) == std::vector<int>{1, 1, 1, 1, 4});
}

TEST_CASE("allocate: an automatic depth is at most the tile's instances", "[allocate][bufs]") {
  // compiler.loop_buffers = 4 (trn2): a tile of a loop of 2 trips gets 2 buffers, one of a loop of 3 nested in a
  // loop of 2 (6 instances, rotating over both) 4, and one of a loop of 2 nested in a loop of 1 trip 2.
  KB b;
  const int x = b.input("x", {128, 64});
  const int y = b.output("y", {128, 64});
  const int i = b.loop("i", 0, 2, 1, LoopKind::kSequential, 5);
  const int a = b.tile("a", {128, 64}, DType::kFloat32, 0, 6);
  b.op("dma_copy", {W(a), W(x)}, 7);
  b.op("dma_copy", {W(y), W(a)}, 8);
  const int j = b.loop("j", 0, 3, 1, LoopKind::kSequential, 9);
  const int c = b.tile("c", {128, 64}, DType::kFloat32, 0, 10);
  b.op("dma_copy", {W(c), W(x)}, 11);
  b.op("dma_copy", {W(y), W(c)}, 12);
  b.end();
  b.end();
  const int o = b.loop("o", 0, 1, 1, LoopKind::kSequential, 13);
  const int k2 = b.loop("k", 0, 2, 1, LoopKind::kSequential, 14);
  const int d = b.tile("d", {128, 64}, DType::kFloat32, 0, 15);
  b.op("dma_copy", {W(d), W(x)}, 16);
  b.op("dma_copy", {W(y), W(d)}, 17);
  b.end();
  b.end();
  (void)i, (void)j, (void)o, (void)k2;
  const auto p = params("trn2");
  REQUIRE_NOTHROW(verify_kernel(b.k, p));
  const auto plan = allocate_tiles(b.k, p);
  CHECK(plan.tiles[static_cast<size_t>(a)].bufs == 2);
  CHECK(plan.tiles[static_cast<size_t>(c)].bufs == 4);
  CHECK(plan.tiles[static_cast<size_t>(d)].bufs == 2);
}

TEST_CASE("allocate: the multi-buffering fallback follows the peak as it moves between loops", "[allocate][bufs]") {
  // Three loops of one-bank PSUM tiles (8 banks of 2 KiB), all of a loop's tiles live together in its body,
  // each automatically double-buffered: loop A 5 tiles (10 banks), loop B 3 (6), loop C 6 (12). The
  // fallback drops one tile's second buffer at a time, the largest live at the peak's first position, the
  // earliest on ties: C0, C1 (C 12 -> 10 banks), then A0 (A and C tie at 10: A is first), C2, A1, C3: A and C
  // at 8 banks fit, B (never at the peak) keeps its buffers. Peaks kept up to date step by step
  // (allocate.cpp's PeakTree): a peak not updated after a step would drop every tile of A and C (and the
  // old recomputation from scratch took 5 s on 6,000 such steps).
  KB b;
  const int a = b.input("a", {128, 128}, DType::kBFloat16);
  const int y = b.output("y", {512, 128});
  const int at = b.tile("at", {128, 128}, DType::kBFloat16);
  b.op("dma_copy", {W(at), W(a)});
  std::map<char, std::vector<int>> tiles;
  int line = 10;
  for (const auto& [name, n] : std::vector<std::pair<char, int>>{{'A', 5}, {'B', 3}, {'C', 6}}) {
    const int l = b.loop(std::string(1, name), 0, 4, 1, LoopKind::kSequential, line++);
    const int s = b.tile(nm("s", name), {128, 128}, DType::kFloat32, 0, line++);
    for (int t = 0; t < n; ++t) {
      std::string tn(1, name);  // (appended, not operator+: GCC 12's false -Wrestrict, see nm above)
      tn += std::to_string(t);
      tiles[name].push_back(b.psum(tn, {128, 128}, 0, line++));
    }
    for (int t : tiles[name]) b.op("nc_matmul", {W(t), W(at), W(at)}, line++);
    for (int t : tiles[name]) b.o(b.op("tensor_tensor", {W(s), W(s), W(t)}, line++)).alu0 = AluOp::kAdd;
    b.op("dma_copy", {X(y, {D(A(l, 128), 128), D(0, 128)}), W(s)}, line++);
    b.end();
  }
  const auto p = params("trn2");
  REQUIRE_NOTHROW(verify_kernel(b.k, p));
  const auto plan = allocate_tiles(b.k, p);
  auto bufs = [&](char loop) {
    std::vector<int> v;
    for (int t : tiles[loop]) v.push_back(plan.tiles[static_cast<size_t>(t)].bufs);
    return v;
  };
  CHECK(bufs('A') == std::vector<int>{1, 1, 2, 2, 2});
  CHECK(bufs('B') == std::vector<int>{2, 2, 2});
  CHECK(bufs('C') == std::vector<int>{1, 1, 1, 1, 2, 2});
  CHECK(plan.psum_peak == 8 * 2048);
}

TEST_CASE("allocate: the multi-buffering fallback takes the largest tile live at the peak, over nested loops",
          "[allocate][bufs]") {
  // Outer loop O with PSUM tiles O0 (1 bank) and O1 (2 banks), inner loop I with I0 and I1 (1 bank each), all
  // double-buffered: 2 + 4 + 2 + 2 = 10 banks live inside I, 8 available. O's tiles rotate over O's
  // statements, I's over I's: different intervals. The fallback takes the largest stride live at the peak:
  // O1 (10 -> 8 banks), and the others keep their buffers (taking I0 first, the smaller tile of the inner
  // loop, would need two steps and leave I0 and I1 single-buffered).
  KB b;
  const int a = b.input("a", {128, 128}, DType::kBFloat16);
  const int bm = b.input("b", {128, 512}, DType::kBFloat16);
  const int y = b.output("y", {1024, 512});
  const int at = b.tile("at", {128, 128}, DType::kBFloat16);
  const int bt = b.tile("bt", {128, 512}, DType::kBFloat16);
  b.op("dma_copy", {W(at), W(a)});
  b.op("dma_copy", {W(bt), W(bm)});
  const int o = b.loop("o", 0, 2, 1, LoopKind::kSequential, 10);
  const int o0 = b.psum("O0", {128, 512}, 0, 11);
  const int o1 = b.psum("O1", {128, 1024}, 0, 12);
  b.op("nc_matmul", {W(o0), W(at), W(bt)}, 13);
  b.op("nc_matmul", {X(o1, {D(0, 128), D(0, 512)}), W(at), W(bt)}, 14);
  const int i = b.loop("i", 0, 2, 1, LoopKind::kSequential, 15);
  const int i0 = b.psum("I0", {128, 512}, 0, 16);
  const int i1 = b.psum("I1", {128, 512}, 0, 17);
  const int s = b.tile("s", {128, 512}, DType::kFloat32, 0, 18);
  b.op("nc_matmul", {W(i0), W(at), W(bt)}, 19);
  b.op("nc_matmul", {W(i1), W(at), W(bt)}, 20);
  b.o(b.op("tensor_tensor", {W(s), W(s), W(i0)}, 21)).alu0 = AluOp::kAdd;
  b.o(b.op("tensor_tensor", {W(s), W(s), W(i1)}, 21)).alu0 = AluOp::kAdd;
  b.o(b.op("tensor_tensor", {W(s), W(s), W(o0)}, 22)).alu0 = AluOp::kAdd;
  b.o(b.op("tensor_tensor", {W(s), W(s), X(o1, {D(0, 128), D(0, 512)})}, 23)).alu0 = AluOp::kAdd;
  b.op("dma_copy", {X(y, {D(Affine{0, {{o, 256}, {i, 128}}}, 128), D(0, 512)}), W(s)}, 24);
  b.end();
  b.end();
  const auto p = params("trn2");
  REQUIRE_NOTHROW(verify_kernel(b.k, p));
  const auto plan = allocate_tiles(b.k, p);
  auto bufs = [&](int t) { return plan.tiles[static_cast<size_t>(t)].bufs; };
  CHECK(plan.tiles[static_cast<size_t>(o1)].stride == 4096);
  CHECK(bufs(o0) == 2);
  CHECK(bufs(o1) == 1);
  CHECK(bufs(i0) == 2);
  CHECK(bufs(i1) == 2);
  CHECK(plan.psum_peak == 8 * 2048);
}
