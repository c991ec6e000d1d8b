// PE tiling (nc_matmul tile_position / tile_size; load_stationary / multiply_moving iimm = [row, col, rows, cols]):
// matmuls on disjoint tiles of the PE array run side by side (neuroncore.md 2.4, 3.1 "inferred"), tiles that
// share a cell wait for each other, an untiled matmul waits for every tile; verify() checks the tiles.
#include <catch2/catch.hpp>
#include <optional>

#include "kernel_builder.h"

using namespace nsim;
using namespace nsim::test;

namespace {

void set_tile(Instr& in, int row, int col, int rows, int cols) {
  in.iimm[0] = row;
  in.iimm[1] = col;
  in.iimm[2] = rows;
  in.iimm[3] = cols;
}

// One load_stationary + multiply_moving on the tile (rows 0: untiled) of K contraction rows starting at partition
// `row`: stationary [K, 128], moving [K, 512] bf16 into its own PSUM bank `bank`. Returns the MM's timing.
InstrTiming matmul_on(Simulator& s, const Operand& st, const Operand& mv, const Operand& ps, int row, int rows,
                      int k) {
  Operand a = st, b = mv;
  a.start_partition = b.start_partition = static_cast<uint16_t>(row);
  a.num_partitions = b.num_partitions = static_cast<uint32_t>(k);
  Instr ls = instr(Opcode::kLoadStationary, Engine::kTensor, {a});
  Instr mm = instr(Opcode::kMultiplyMoving, Engine::kTensor, {ps, b});
  if (rows > 0) {
    set_tile(ls, row, 0, rows, 128);
    set_tile(mm, row, 0, rows, 128);
  }
  s.submit(ls);
  return s.submit(mm);
}

struct Tiles {
  Operand st, mv;
  std::vector<Operand> ps;
};

Tiles alloc(Simulator& s, int banks) {
  Tiles t{s.alloc_tile(Space::kSbuf, 128, {128}, DType::kBFloat16), s.alloc_tile(Space::kSbuf, 128, {512}, DType::kBFloat16),
          {}};
  for (int b = 0; b < banks; ++b) t.ps.push_back(s.alloc_tile(Space::kPsum, 128, {512}, DType::kFloat32));
  return t;
}

}  // namespace

TEST_CASE("PE tiling: matmuls on the four 32-row tiles of trn2 run side by side", "[timing][tensor][pe_tiling]") {
  // Throttle off. Each MM: ii_mm = max(64, N = 512) = 512 cycles / 2.4 GHz = 213.333 ns; its LS of M = 128 rows,
  // ii_ls = ceil(128 / 4) = 32 cycles = 13.333 ns, loads in the background.
  // Untiled (K = 32 each): the four MMs issue one after the other, 213.333 ns apart.
  // Tiled (rows 0, 32, 64, 96, 32 rows each): TensorE still issues in order, so tile q's LS starts when the previous
  // instruction (tile q-1's MM) started and its MM 13.333 ns later: MMs at 13.333, 26.667, 40, 53.333 ns, the four
  // streaming side by side. A fifth, untiled matmul: its LS waits for the last MM to start (53.333; the shadow
  // weights) and its MM for every cell's pipe: tile 3's MM frees it at 53.333 + 213.333 = 266.667 ns.
  {
    auto s = make_sim("trn2", {"tensor.throttle.enabled=false"});
    Tiles t = alloc(*s, 4);
    std::vector<double> starts;
    for (int q = 0; q < 4; ++q) starts.push_back(ns(matmul_on(*s, t.st, t.mv, t.ps[q], 32 * q, 0, 32).start));
    for (int q = 1; q < 4; ++q) CHECK(starts[q] - starts[q - 1] == Approx(213.333).margin(0.01));
  }
  {
    auto s = make_sim("trn2", {"tensor.throttle.enabled=false"});
    Tiles t = alloc(*s, 5);
    for (int q = 0; q < 4; ++q)
      CHECK(ns(matmul_on(*s, t.st, t.mv, t.ps[q], 32 * q, 32, 32).start) == Approx(13.333 * (q + 1)).margin(0.01));
    CHECK(ns(matmul_on(*s, t.st, t.mv, t.ps[4], 0, 0, 128).start) == Approx(266.667).margin(0.01));
  }
}

TEST_CASE("PE tiling: tiles that share cells wait for each other, trn1 has two 64-row tiles", "[timing][tensor][pe_tiling]") {
  {  // trn2: a 64-row tile at 0 and a 32-row tile at 32 share cell row 1: the second MM waits for the first's II
    // (13.333 + 213.333 = 226.667 ns; its LS loaded the shadow weights once the first MM started).
    auto s = make_sim("trn2", {"tensor.throttle.enabled=false"});
    Tiles t = alloc(*s, 3);
    CHECK(ns(matmul_on(*s, t.st, t.mv, t.ps[0], 0, 64, 64).start) == Approx(13.333).margin(0.01));
    CHECK(ns(matmul_on(*s, t.st, t.mv, t.ps[1], 32, 32, 32).start) == Approx(13.333 + 213.333).margin(0.01));
    // A tile at 64 shares no cell with either, but TensorE issues in order: its LS starts with the waiting MM
    // (226.667), its MM 13.333 ns later, 240 ns.
    CHECK(ns(matmul_on(*s, t.st, t.mv, t.ps[2], 64, 64, 64).start) == Approx(240).margin(0.01));
  }
  {  // trn1 (2.8 GHz, throttle off by preset): tiles of 64 rows; ii_ls = 32 cycles = 11.429 ns. The second tile's LS
    // starts with the first MM (11.429), its MM at 22.857, while the first still streams (512 cycles = 182.9 ns).
    auto s = make_sim("trn1");
    Tiles t = alloc(*s, 2);
    CHECK(ns(matmul_on(*s, t.st, t.mv, t.ps[0], 0, 64, 64).start) == Approx(11.429).margin(0.01));
    CHECK(ns(matmul_on(*s, t.st, t.mv, t.ps[1], 64, 64, 64).start) == Approx(22.857).margin(0.01));
  }
}

TEST_CASE("PE tiling: each tile keeps its own weights (a MM's cost follows its tile's stationary)", "[timing][tensor][pe_tiling]") {
  // isa cost formula: ii_mm = max(min(64, M), N). Tile 0 holds a stationary of M = 1, tile 1 one of M = 128; MMs of
  // N = 32 then take max(min(64, 1), 32) = 32 cycles on tile 0 and max(64, 32) = 64 cycles on tile 1 (trn2:
  // 13.333 ns and 26.667 ns): the second MM on each tile starts that long after the first.
  auto s = make_sim("trn2", {"tensor.throttle.enabled=false", "tensor.cost_formula=isa"});
  const Operand narrow = s->alloc_tile(Space::kSbuf, 128, {1}, DType::kBFloat16);
  const Operand wide = s->alloc_tile(Space::kSbuf, 128, {128}, DType::kBFloat16);
  Operand mv = s->alloc_tile(Space::kSbuf, 128, {32}, DType::kBFloat16);
  const Operand ps0 = s->alloc_tile(Space::kPsum, 1, {32}, DType::kFloat32);
  const Operand ps1 = s->alloc_tile(Space::kPsum, 128, {32}, DType::kFloat32);
  auto on_tile = [&](const Operand& st, const Operand& ps, int row, bool load) {
    Operand a = st, b = mv;
    a.start_partition = b.start_partition = static_cast<uint16_t>(row);
    a.num_partitions = b.num_partitions = 32;
    if (load) {
      Instr ls = instr(Opcode::kLoadStationary, Engine::kTensor, {a});
      set_tile(ls, row, 0, 32, 128);
      s->submit(ls);
    }
    Instr mm = instr(Opcode::kMultiplyMoving, Engine::kTensor, {ps, b});
    mm.flags = isa::kAccumulate;
    set_tile(mm, row, 0, 32, 128);
    return ns(s->submit(mm).start);
  };
  const double a0 = on_tile(narrow, ps0, 0, true), b0 = on_tile(wide, ps1, 32, true);
  CHECK(on_tile(narrow, ps0, 0, false) - a0 == Approx(13.333).margin(0.01));
  CHECK(on_tile(wide, ps1, 32, false) - b0 == Approx(26.667).margin(0.01));
}

TEST_CASE("PE tiling: verify rejects tiles that are misaligned, too small or too narrow for the matmul", "[pe_tiling][verify]") {
  auto s = make_sim("trn2");
  const isa::Limits lim = s->params().limits();
  const Operand st = s->alloc_tile(Space::kSbuf, 32, {64}, DType::kBFloat16);
  const Operand mv = s->alloc_tile(Space::kSbuf, 32, {512}, DType::kBFloat16);
  const Operand ps = s->alloc_tile(Space::kPsum, 64, {512}, DType::kFloat32);
  auto ls_on = [&](int row, int col, int rows, int cols) {
    Instr in = instr(Opcode::kLoadStationary, Engine::kTensor, {st});
    set_tile(in, row, col, rows, cols);
    return in;
  };
  auto code_of = [&](const Instr& in) -> std::optional<ErrorCode> {  // nullopt: accepted
    try {
      isa::verify(in, lim);
    } catch (const Error& e) {
      return e.code();
    }
    return std::nullopt;
  };
  CHECK(code_of(ls_on(0, 0, 0, 0)) == std::nullopt);        // untiled
  CHECK(code_of(ls_on(96, 64, 32, 64)) == std::nullopt);    // K = 32 <= 32 rows, M = 64 <= 64 columns
  CHECK(code_of(ls_on(16, 0, 32, 128)) == ErrorCode::kBadArgument);  // position not a multiple of the size
  CHECK(code_of(ls_on(0, 0, 48, 128)) == ErrorCode::kBadArgument);   // 48 is not 32 x 2^k
  CHECK(code_of(ls_on(0, 0, 16, 128)) == ErrorCode::kBadArgument);   // below row_tile_min
  CHECK(code_of(ls_on(64, 0, 128, 128)) == ErrorCode::kBadArgument); // past the array
  CHECK(code_of(ls_on(0, 96, 32, 32)) == ErrorCode::kMatmulLimit);    // M = 64 > 32 columns
  Instr mm = instr(Opcode::kMultiplyMoving, Engine::kTensor, {ps, mv});
  set_tile(mm, 0, 0, 32, 64);
  CHECK(code_of(mm) == std::nullopt);
  set_tile(mm, 0, 0, 32, 32);  // dst partitions (M = 64) exceed the 32 columns
  CHECK(code_of(mm) == ErrorCode::kMatmulLimit);
  // trn1: row tiles of 64 and 128 only.
  auto s1 = make_sim("trn1");
  CHECK_THROWS_WITH(isa::verify(ls_on(0, 0, 32, 128), s1->params().limits()), Catch::Contains("PE tile rows"));
}

TEST_CASE("PE tiling: the disassembly names the tile", "[pe_tiling][disasm]") {
  auto s = make_sim("trn2");
  Instr mm = instr(Opcode::kMultiplyMoving, Engine::kTensor,
                   {s->alloc_tile(Space::kPsum, 128, {512}, DType::kFloat32), s->alloc_tile(Space::kSbuf, 32, {512}, DType::kBFloat16)});
  CHECK_THAT(isa::disassemble(mm), !Catch::Contains("tile="));
  set_tile(mm, 32, 0, 32, 128);
  CHECK_THAT(isa::disassemble(mm), Catch::Contains("tile=[32:64, 0:128]"));
}

TEST_CASE("PE tiling: a smallest tile that does not divide the array by a power of two is a config error", "[pe_tiling][config]") {
  for (const char* bad : {"tensor.row_tile_min=48", "tensor.col_tile_min=3", "tensor.row_tile_min=8"}) {
    try {
      make_sim("trn2", {bad});
      FAIL(bad);
    } catch (const Error& e) {
      CHECK(e.code() == ErrorCode::kConfigBadValue);
      CHECK_THAT(e.message(), Catch::Contains("_tile_min"));
    }
  }
  CHECK_NOTHROW(make_sim("trn2", {"tensor.row_tile_min=128", "tensor.col_tile_min=128"}));  // no tiling
}
