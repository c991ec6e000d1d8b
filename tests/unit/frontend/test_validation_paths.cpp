// One validation path (issue 16, item 2): `nsim check` (verify_kernel), `nsim run --timing-only`
// (lowering into a Simulator without numerics) and a full `nsim run` (numerics on) accept exactly the
// same kernels and reject a bad one with the same error code, located at the op's source line and
// naming the op. Each case is an operand rule the semantics need (isa/semantics) that isa::verify
// states too, so it also holds when no numerics run.
#include <catch2/catch.hpp>

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "engines/simulator.h"
#include "frontend/ir.h"
#include "frontend/lower.h"

#include "kernel_builder.h"

using namespace nsim;
using frontend::Lowering;
using frontend::verify_kernel;
using isa::AluOp;

namespace {

constexpr int kOpLine = 20;  // the line of the op under test

struct Outcome {
  std::optional<ErrorCode> code;  ///< empty: accepted
  int line = 0;
  std::string what;
};

Outcome outcome_of(const std::function<void()>& f) {
  Outcome o;
  try {
    f();
  } catch (const Error& e) {
    o.code = e.code();
    o.line = e.loc().line;
    o.what = e.what();
  }
  return o;
}

struct Paths {
  Outcome check, timing, full;
};

/// The three commands on one kernel.
Paths run_paths(const Kernel& k) {
  Paths p;
  p.check = outcome_of([&] {
    auto s = Simulator::from_preset("trn2", {}, SimOptions{false, ""});
    verify_kernel(k, s->params());
  });
  // The run paths without verify_kernel first: the instructions themselves must be refused.
  p.timing = outcome_of([&] {
    auto s = Simulator::from_preset("trn2", {}, SimOptions{false, ""});
    Lowering l(k, *s);
    l.run();
    s->finish();
  });
  p.full = outcome_of([&] {
    auto s = Simulator::from_preset("trn2", {}, SimOptions{true, ""});
    Lowering l(k, *s);
    l.run();
    s->finish();
  });
  return p;
}

/// In a one-trip loop: x [128, 64] -> tile t; the op under test (line 20) writes tile `u` (shape
/// `ushape`) from t; u goes to output y.
Kernel kernel_with(const std::function<void(KB&, int t, int u)>& add_op, std::vector<int64_t> ushape = {128, 64}) {
  KB b;
  const int x = b.input("x", {128, 64});
  const int y = b.output("y", ushape);
  const int i = b.loop("i", 0, 1, 1, frontend::LoopKind::kSequential, 5);
  const int t = b.tile("t", {128, 64});
  const int u = b.tile("u", ushape);
  b.op("dma_copy", {W(t), X(x, {D(A(i, 128), 128), D(0, 64)})}, 10);
  add_op(b, t, u);
  b.op("dma_copy", {W(y), W(u)}, 30);
  b.end();
  return b.k;
}

void check_rejected_alike(const Kernel& k, ErrorCode code, const std::string& mnemonic) {
  const Paths p = run_paths(k);
  INFO("check: " << p.check.what);
  INFO("timing-only: " << p.timing.what);
  INFO("full run: " << p.full.what);
  REQUIRE(p.full.code.has_value());
  CHECK(*p.full.code == code);
  CHECK(p.check.code == p.full.code);
  CHECK(p.timing.code == p.full.code);
  CHECK(p.check.line == kOpLine);
  CHECK(p.timing.line == kOpLine);
  CHECK(p.full.line == kOpLine);
  for (const Outcome* o : {&p.check, &p.timing, &p.full}) CHECK(o->what.find(mnemonic) != std::string::npos);
}

}  // namespace

TEST_CASE("validation paths: a good kernel passes check, timing-only and the full run", "[verify][paths]") {
  const Kernel k = kernel_with([](KB& b, int t, int u) {
    b.ts(W(u), W(t), AluOp::kMultiply, 2.0f, kOpLine);
    const int r = b.tile("r", {128, 1});
    const int tr = b.op("tensor_reduce", {W(r), W(t)}, 21);
    b.o(tr).alu0 = AluOp::kAdd;
    const int st = b.tile("st", {128, 6});
    b.op("bn_stats", {W(st), W(t)}, 22);
    const int ag = b.tile("ag", {128, 2});
    b.op("bn_aggr", {W(ag), W(st)}, 23);
    const int sel = b.tile("sel", {128, 64});
    const int as = b.op("affine_select", {W(sel), W(t)}, 24);
    b.o(as).alu0 = AluOp::kGreaterEqual;
    b.o(as).iimm = {0, 1, 1, 64, 0, 1, 0, 1, 0, 1};
    const int io = b.tile("io", {128, 64});
    const int it = b.op("iota", {W(io)}, 25);
    b.o(it).iimm = {0, 64, 1, 64, 0, 1, 0, 1, 0, 1};
    const int un = b.op("tensor_scalar", {W(sel), W(sel)}, 26);  // a unary op needs no operand
    b.o(un).alu0 = AluOp::kAbs;
  });
  const Paths p = run_paths(k);
  INFO(p.check.what << " | " << p.timing.what << " | " << p.full.what);
  CHECK_FALSE(p.check.code.has_value());
  CHECK_FALSE(p.timing.code.has_value());
  CHECK_FALSE(p.full.code.has_value());
}

TEST_CASE("validation paths: a missing scalar operand is E305 on every path", "[verify][paths]") {
  SECTION("tensor_scalar without has_imm0 and without operand0 (issue 16)") {
    check_rejected_alike(kernel_with([](KB& b, int t, int u) {
                           const int i = b.op("tensor_scalar", {W(u), W(t)}, kOpLine);
                           b.o(i).alu0 = AluOp::kAdd;
                         }),
                         ErrorCode::kMissingOperand, "tensor_scalar");
  }
  SECTION("tensor_scalar with op1 but without has_imm1 and operand1") {
    check_rejected_alike(kernel_with([](KB& b, int t, int u) {
                           const int i = b.ts(W(u), W(t), AluOp::kAdd, 1.0f, kOpLine);
                           b.o(i).alu1 = AluOp::kMultiply;
                         }),
                         ErrorCode::kMissingOperand, "tensor_scalar");
  }
  SECTION("scalar_tensor_tensor without has_imm0 and operand0") {
    check_rejected_alike(kernel_with([](KB& b, int t, int u) {
                           const int i = b.op("scalar_tensor_tensor", {W(u), W(t), std::nullopt, W(t)}, kOpLine);
                           b.o(i).alu0 = AluOp::kAdd;
                           b.o(i).alu1 = AluOp::kAdd;
                         }),
                         ErrorCode::kMissingOperand, "scalar_tensor_tensor");
  }
  SECTION("tensor_scalar_reduce without has_imm0 and operand0") {
    check_rejected_alike(kernel_with([](KB& b, int t, int u) {
                           const int i = b.op("tensor_scalar_reduce", {W(u), W(t)}, kOpLine);
                           b.o(i).alu0 = AluOp::kMultiply;
                         }),
                         ErrorCode::kMissingOperand, "tensor_scalar_reduce");
  }
  SECTION("tensor_copy_predicated without src and without has_imm0") {
    check_rejected_alike(kernel_with([](KB& b, int t, int u) {
                           b.op("tensor_copy_predicated", {W(u), std::nullopt, W(t)}, kOpLine);
                         }),
                         ErrorCode::kMissingOperand, "tensor_copy_predicated");
  }
}

TEST_CASE("validation paths: reduction and statistics shapes are E304 on every path", "[verify][paths]") {
  SECTION("tensor_reduce changed to bn_aggr (issue 16)") {
    check_rejected_alike(kernel_with(
                             [](KB& b, int t, int u) {
                               const int i = b.op("bn_aggr", {W(u), W(t)}, kOpLine);
                               b.o(i).alu0 = AluOp::kAdd;
                             },
                             {128, 1}),
                         ErrorCode::kElementCountMismatch, "bn_aggr");
  }
  SECTION("bn_aggr data that is not (count, mean, M2) triples") {
    check_rejected_alike(kernel_with([](KB& b, int t, int u) { b.op("bn_aggr", {W(u), W(t)}, kOpLine); }, {128, 2}),
                         ErrorCode::kElementCountMismatch, "bn_aggr");
  }
  SECTION("bn_stats with a dst of 4 elements") {
    check_rejected_alike(kernel_with([](KB& b, int t, int u) { b.op("bn_stats", {W(u), W(t)}, kOpLine); }, {128, 4}),
                         ErrorCode::kElementCountMismatch, "bn_stats");
  }
  SECTION("tensor_reduce of everything into 2 elements") {
    check_rejected_alike(kernel_with(
                             [](KB& b, int t, int u) {
                               const int i = b.op("tensor_reduce", {W(u), W(t)}, kOpLine);
                               b.o(i).alu0 = AluOp::kAdd;
                             },
                             {128, 2}),
                         ErrorCode::kElementCountMismatch, "tensor_reduce");
  }
}

TEST_CASE("validation paths: patterns and masks are E310 on every path", "[verify][paths]") {
  SECTION("affine_select with a negative pattern (issue 16)") {
    check_rejected_alike(kernel_with([](KB& b, int t, int u) {
                           const int i = b.op("affine_select", {W(u), W(t)}, kOpLine);
                           b.o(i).alu0 = AluOp::kGreaterEqual;
                           b.o(i).iimm = {0, 1, 1, -64, 0, 1, 0, 1, 0, 1};
                         }),
                         ErrorCode::kShapeMismatch, "affine_select");
  }
  SECTION("affine_select whose pattern covers fewer elements than dst") {
    check_rejected_alike(kernel_with([](KB& b, int t, int u) {
                           const int i = b.op("affine_select", {W(u), W(t)}, kOpLine);
                           b.o(i).iimm = {0, 1, 1, 32, 0, 1, 0, 1, 0, 1};
                         }),
                         ErrorCode::kShapeMismatch, "affine_select");
  }
  SECTION("iota whose pattern covers more elements than dst (a huge product does not overflow)") {
    check_rejected_alike(kernel_with([](KB& b, int, int u) {
                           const int i = b.op("iota", {W(u)}, kOpLine);
                           b.o(i).iimm = {0, 1, 1, 1 << 30, 1, 1 << 30, 1, 1 << 30, 1, 1 << 30};
                         }),
                         ErrorCode::kShapeMismatch, "iota");
  }
  SECTION("tensor_reduce of more free dims than the data has") {
    check_rejected_alike(kernel_with(
                             [](KB& b, int t, int u) {
                               const int i = b.op("tensor_reduce", {W(u), W(t)}, kOpLine);
                               b.o(i).alu0 = AluOp::kAdd;
                               b.o(i).axis_count = 3;
                             },
                             {128, 1}),
                         ErrorCode::kShapeMismatch, "tensor_reduce");
  }
  SECTION("nc_stream_shuffle whose mask reads a source row beyond src") {
    check_rejected_alike(kernel_with([](KB& b, int t, int u) {
                           b.op("nc_stream_shuffle", {W(u), X(t, {D(0, 32), D(0, 64)})}, kOpLine);
                         }),
                         ErrorCode::kShapeMismatch, "nc_stream_shuffle");
  }
}

namespace {

/// unit_scatter_add of the fuzz corpus with the scatter (line 20) given `iimm` and the dst's first
/// (broadcast) dim starting at `start`, optionally inside a loop j in range(2) (start may use j).
Kernel indirect_scatter(const std::string& iimm, const std::string& start, bool loop,
                        const std::string& flags = R"J("accumulate", "indirect_dst", "oob_skip")J") {
  const std::string scatter = R"J({"op": "dma_copy", "engine": "gpsimd",
      "dst": {"tensor": "out", "index": [{"start": START, "broadcast": 128}, {"start": 0, "size": 64}]},
      "src": "t0", "flags": [FLAGS], "offsets": "it", "iimm": IIMM,
      "loc": {"file": "k.py", "line": 20}})J";
  std::string op = scatter;
  op.replace(op.find("FLAGS"), 5, flags);
  op.replace(op.find("START"), 5, start);
  op.replace(op.find("IIMM"), 4, iimm);
  if (loop) op = R"J({"loop": {"var": "j", "stop": 2, "kind": "sequential", "body": [)J" + op + "]}}";
  const std::string text = R"J({"nsim_kernel": 1, "name": "scatter",
    "tensors": [{"name": "table", "buffer": "hbm", "kind": "input", "dtype": "float32", "shape": [128, 64]},
                {"name": "idx", "buffer": "hbm", "kind": "input", "dtype": "int32", "shape": [128, 1]},
                {"name": "out", "buffer": "hbm", "kind": "output", "dtype": "float32", "shape": [128, 64]}],
    "body": [{"alloc": {"name": "t0", "buffer": "sbuf", "dtype": "float32", "shape": [128, 64]}},
             {"op": "dma_copy", "dst": "t0", "src": "table"},
             {"op": "dma_copy", "dst": "out", "src": "t0"},
             {"alloc": {"name": "it", "buffer": "sbuf", "dtype": "int32", "shape": [128, 1]}},
             {"op": "dma_copy", "dst": "it", "src": "idx"},
             )J" + op + "]}";
  return frontend::parse_kernel_json(text, "k.json");
}

}  // namespace

// Found by the fuzz driver (tests/fuzz/regressions/driver-indirect-reach.json): `nsim check` accepted
// an indirect dma_copy whose rows, moved by an index up to iimm[0] - 1 times iimm[1] elements, leave
// the HBM tensor, which both runs refuse with E201.
TEST_CASE("validation paths: an indirect dma_copy reaching past its HBM tensor is E201 on every path", "[verify][paths]") {
  SECTION("the largest index reaches the tensor's last element: accepted") {
    // out is [128, 64] = 8192 elements; the static row is elements [0, 64); an index up to 127
    // moves it by 127 x 64 = 8128 elements: the last element reached is 63 + 8128 = 8191.
    const Paths p = run_paths(indirect_scatter("[128, 64]", "0", false));
    INFO(p.check.what << " | " << p.timing.what << " | " << p.full.what);
    CHECK_FALSE(p.check.code.has_value());
    CHECK_FALSE(p.timing.code.has_value());
    CHECK_FALSE(p.full.code.has_value());
  }
  SECTION("one index more (bound 129): element 63 + 128 x 64 = 8255 is outside") {
    const Paths p = run_paths(indirect_scatter("[129, 64]", "0", false));
    INFO(p.check.what << " | " << p.timing.what << " | " << p.full.what);
    REQUIRE(p.check.code.has_value());
    CHECK(*p.check.code == ErrorCode::kOutOfBounds);
    CHECK(p.check.line == kOpLine);
    CHECK(p.check.what.find("'out'") != std::string::npos);
    CHECK(p.timing.code == p.check.code);
    CHECK(p.full.code == p.check.code);
  }
  SECTION("in a loop, only the second iteration (static row 1) reaches past: 64 + 63 + 8128 = 8255") {
    const Paths p = run_paths(indirect_scatter("[128, 64]", "\"j\"", true));
    INFO(p.check.what << " | " << p.timing.what << " | " << p.full.what);
    REQUIRE(p.check.code.has_value());
    CHECK(*p.check.code == ErrorCode::kOutOfBounds);
    CHECK(p.timing.code == p.check.code);
    CHECK(p.full.code == p.check.code);
  }
}

namespace {

/// A dynamic tensor_copy (tensor_copy_dynamic_src): r = s[:, 0:4] moved at run time by offsets[0] columns,
/// with the index bound `bound` (s is [128, 512] fp32 in SBUF).
Kernel dynamic_copy(int bound) {
  const std::string text = R"J({"nsim_kernel": 1, "name": "dyn",
    "tensors": [{"name": "src", "buffer": "hbm", "kind": "input", "dtype": "float32", "shape": [128, 512]},
                {"name": "off", "buffer": "hbm", "kind": "input", "dtype": "int32", "shape": [1, 1]},
                {"name": "out", "buffer": "hbm", "kind": "output", "dtype": "float32", "shape": [128, 4]}],
    "body": [{"alloc": {"name": "s", "buffer": "sbuf", "dtype": "float32", "shape": [128, 512]}},
             {"alloc": {"name": "o", "buffer": "sbuf", "dtype": "int32", "shape": [1, 1]}},
             {"alloc": {"name": "r", "buffer": "sbuf", "dtype": "float32", "shape": [128, 4]}},
             {"op": "dma_copy", "dst": "s", "src": "src"},
             {"op": "dma_copy", "dst": "o", "src": "off"},
             {"op": "tensor_copy", "dst": "r", "src": {"tensor": "s", "index": [{"size": 128}, {"size": 4}]},
              "offsets": "o", "flags": ["indirect_scalar", "dynamic_addr"], "iimm": [BOUND, 1],
              "loc": {"file": "k.py", "line": 20}},
             {"op": "dma_copy", "dst": "out", "src": "r"}]})J";
  std::string t = text;
  t.replace(t.find("BOUND"), 5, std::to_string(bound));
  return frontend::parse_kernel_json(t, "k.json");
}

}  // namespace

TEST_CASE("validation paths: a dynamic tensor_copy reaching past its tile row is E201 when checked", "[verify][paths]") {
  SECTION("the largest index keeps the 4-column window inside the 512 columns: accepted") {
    // bound 509: an index up to 508 moves columns [0, 4) to [508, 512).
    const Paths p = run_paths(dynamic_copy(509));
    INFO(p.check.what << " | " << p.timing.what << " | " << p.full.what);
    CHECK_FALSE(p.check.code.has_value());
    CHECK_FALSE(p.timing.code.has_value());
    CHECK_FALSE(p.full.code.has_value());
  }
  SECTION("bound 510: index 509 would read column 512 of the tile") {
    const Paths p = run_paths(dynamic_copy(510));
    INFO(p.check.what << " | " << p.timing.what << " | " << p.full.what);
    REQUIRE(p.check.code.has_value());
    CHECK(*p.check.code == ErrorCode::kOutOfBounds);
    CHECK(p.check.line == kOpLine);
    CHECK(p.check.what.find("'s'") != std::string::npos);
    CHECK(p.timing.code == p.check.code);
    CHECK(p.full.code == p.check.code);
  }
}

namespace {
/// Lower `k` (timing-only) and check every instruction's Lowering::last_extents against isa::slot_extent
/// of each present operand (the list scheduler's conflict tables and dependency regions use the former).
/// Returns the instructions checked.
int check_extents(const frontend::Kernel& k) {
  auto s = Simulator::from_preset("trn2", {}, SimOptions{false, ""});
  Lowering::allocate_hbm(k, *s);
  Lowering l(k, *s);
  isa::Instr in;
  int n = 0;
  while (l.next(in)) {
    ++n;
    for (int i = 0; i < isa::op_info(in.op).num_slots; ++i) {
      if (!in.slot(i).present()) continue;
      INFO(isa::disassemble(in) << " slot " << i);
      CHECK(l.last_extents()[static_cast<size_t>(i)] == isa::slot_extent(in, i));
    }
  }
  return n;
}
}  // namespace

TEST_CASE("lowering: each instruction's extents are its operands' slot extents", "[lower]") {
  // An indirect scatter (its HBM side widened by the indices' reach) at a start moved by the loop variable.
  CHECK(check_extents(indirect_scatter("[64, 64]", "0", true)) == 5);
  // nc_matmul pairs (the second instruction's extents come with the pending half), a strided PSUM read, a
  // dst moved by the loop variable, and a reduce keeping its dims.
  KB b;
  const int a = b.input("a", {128, 128}, DType::kBFloat16);
  const int bm = b.input("b", {128, 512}, DType::kBFloat16);
  const int c = b.output("c", {128, 1536});
  const int r = b.output("r", {128, 3});
  const int at = b.tile("at", {128, 128}, DType::kBFloat16);
  const int bt = b.tile("bt", {128, 512}, DType::kBFloat16);
  const int rt = b.tile("rt", {128, 3});
  b.op("dma_copy", {W(at), W(a)});
  b.op("dma_copy", {W(bt), W(bm)});
  const int i = b.loop("i", 0, 3);
  const int p = b.psum("p", {128, 512});
  const int s1 = b.tile("s1", {128, 512});
  b.op("nc_matmul", {W(p), W(at), W(bt)});
  b.op("tensor_copy", {X(s1, {D(0, 128), D(0, 256)}), X(p, {D(0, 128), D(0, 256, 2)})});
  b.op("tensor_reduce", {X(rt, {D(0, 128), D(A(i, 1), 1)}), W(s1)});
  b.k.ops.back().alu0 = isa::AluOp::kAdd;  // (a reduction operator: bypass is none)
  b.op("dma_copy", {X(c, {D(0, 128), D(A(i, 512), 512)}), W(s1)});
  b.end();
  b.op("dma_copy", {W(r), W(rt)});
  REQUIRE_NOTHROW(verify_kernel(b.k, engines::CoreParams::from_config(engines::load_config("trn2"))));
  CHECK(check_extents(b.k) == 2 + 3 * 5 + 1);
}

// NSIM-W508 (engines/check/checker.cpp check_unique_indices): an accumulating scatter flagged unique_indices
// (nisa.dma_compute's scatter-add) whose index tile repeats a row. The kernel's idx input is the data a run
// generates for an input it is not given (deterministic; 128 indices under the bound 128 with repeats: its first
// two partitions name one row).
TEST_CASE("unique_indices: a repeated row of a promised-unique scatter-add is NSIM-W508, the flag elsewhere is E312",
          "[verify][paths][check]") {
  const auto reports = [](const Kernel& k) {
    SimOptions o{true, ""};
    o.check = true;
    auto s = Simulator::from_preset("trn2", {}, o);
    Lowering l(k, *s);
    l.run();
    s->finish();
    return s->check_reports();
  };
  const std::string unique = R"J("accumulate", "indirect_dst", "oob_skip", "unique_indices")J";
  const auto reps = reports(indirect_scatter("[128, 64]", "0", false, unique));
  REQUIRE(reps.size() == 1);
  CHECK(reps[0].kind == engines::CheckKind::kDuplicateIndices);
  CHECK(std::string(reps[0].info().code) == "NSIM-W508");
  CHECK(reps[0].loc.line == kOpLine);
  INFO(reps[0].detail);
  CHECK(reps[0].detail.find("partitions 0 and 1 of its index tile both name row ") != std::string::npos);
  // the same scatter without the promise (atomic_rmw's, a Beta-1 dma_copy with dst_rmw_op): nothing reported
  CHECK(reports(indirect_scatter("[128, 64]", "0", false)).empty());
  // the flag on a scatter that does not accumulate, or without offsets: refused on every path
  for (const std::string& bad : {std::string(R"J("indirect_dst", "unique_indices")J")}) {
    const Paths p = run_paths(indirect_scatter("[128, 64]", "0", false, bad));
    INFO(p.check.what << " | " << p.timing.what << " | " << p.full.what);
    REQUIRE(p.check.code.has_value());
    CHECK(*p.check.code == ErrorCode::kBadArgument);
    CHECK(p.check.line == kOpLine);
    CHECK(p.timing.code == p.check.code);
    CHECK(p.full.code == p.check.code);
  }
}
