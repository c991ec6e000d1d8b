// kernel.json reader/writer (frontend/kernel_json.cpp, docs/kernel-json.md): the documented example,
// round trips, and one test per error code the reader raises.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <optional>
#include <string>

#include "frontend/ir.h"
#include "frontend/json.h"
#include "sim/error.h"

using namespace nsim;
using namespace nsim::frontend;

namespace {

// The example of docs/kernel-json.md, verbatim.
const char* const kDocExample = R"({
  "nsim_kernel": 1,
  "name": "row_softmax",
  "tensors": [
    {"name": "x", "buffer": "hbm", "kind": "input", "dtype": "float32", "shape": [256, 512]},
    {"name": "y", "buffer": "hbm", "kind": "output", "dtype": "float32", "shape": [256, 512]}
  ],
  "body": [
    {"loop": {"var": "i", "stop": 2, "body": [
      {"alloc": {"name": "xt", "buffer": "sbuf", "dtype": "float32", "shape": [128, 512], "bufs": 2}},
      {"alloc": {"name": "mx", "buffer": "sbuf", "dtype": "float32", "shape": [128, 1]}},
      {"alloc": {"name": "sum", "buffer": "sbuf", "dtype": "float32", "shape": [128, 1]}},
      {"op": "dma_copy", "dst": "xt", "src": {"tensor": "x", "index": [{"start": "128*i", "size": 128}]},
       "loc": {"file": "softmax.py", "line": 12, "function": "softmax"}},
      {"op": "tensor_reduce", "dst": "mx", "data": "xt", "alu0": "maximum",
       "loc": {"file": "softmax.py", "line": 13, "function": "softmax"}},
      {"op": "tensor_tensor", "dst": "xt", "data1": "xt",
       "data2": {"tensor": "mx", "index": [{"size": 128}, {"broadcast": 512}]}, "alu0": "subtract",
       "loc": {"file": "softmax.py", "line": 14, "function": "softmax"}},
      {"op": "activation", "dst": "xt", "data": "xt", "reduce_res": "sum", "act": "exp", "alu1": "add",
       "reduce_cmd": "reset_reduce",
       "loc": {"file": "softmax.py", "line": 15, "function": "softmax"}},
      {"op": "reciprocal", "dst": "sum", "data": "sum",
       "loc": {"file": "softmax.py", "line": 16, "function": "softmax"}},
      {"op": "tensor_scalar", "dst": "xt", "data": "xt", "operand0": "sum", "alu0": "multiply",
       "loc": {"file": "softmax.py", "line": 17, "function": "softmax"}},
      {"op": "dma_copy", "dst": {"tensor": "y", "index": [{"start": "128*i", "size": 128}]}, "src": "xt",
       "loc": {"file": "softmax.py", "line": 18, "function": "softmax"}}
    ]}}
  ]
})";

// Nested loops, every loop field, broadcast / stepped / point dims, negative coefficients.
const char* const kNested = R"({
  "nsim_kernel": 1,
  "name": "nested",
  "tensors": [
    {"name": "a", "buffer": "hbm", "kind": "input", "dtype": "bfloat16", "shape": [4, 256, 64]},
    {"name": "o", "buffer": "hbm", "kind": "output", "dtype": "bfloat16", "shape": [4, 256, 64]},
    {"name": "scratch", "buffer": "hbm", "dtype": "int32", "shape": [16], "loc": {"file": "n.py", "line": 3}}
  ],
  "body": [
    {"alloc": {"name": "bias", "buffer": "sbuf", "dtype": "float32", "shape": [128, 1]}},
    {"loop": {"var": "b", "start": 0, "stop": 4, "kind": "sequential", "loc": {"file": "n.py", "line": 5, "function": "f"}, "body": [
      {"loop": {"var": "h", "start": 1, "stop": -1, "step": -2, "kind": "static", "body": [
        {"alloc": {"name": "t", "buffer": "sbuf", "dtype": "bfloat16", "shape": [128, 2, 32], "bufs": 3, "site_count": 2,
                   "loc": {"file": "n.py", "line": 7, "function": "f"}}},
        {"op": "dma_copy", "engine": "scalar", "dma_queue": 3,
         "dst": {"tensor": "t", "index": [{"size": 128}, {"start": 0, "size": 2}, {"start": 0, "size": 32, "step": 1}]},
         "src": {"tensor": "a", "index": ["b", {"start": "128*h", "size": 128}, {"start": 0, "size": 64}]}},
        {"op": "tensor_scalar", "dst": "t", "data": "t", "operand0": "bias", "alu0": "add",
         "loc": {"file": "n.py", "line": 9, "function": "f"}},
        {"op": "tensor_copy", "dst": {"tensor": "t", "index": [{"size": 128}, 0, {"start": 31, "size": 16, "step": -2}]},
         "src": {"tensor": "bias", "index": [{"size": 128}, {"broadcast": 16}]}},
        {"op": "dma_copy", "dst": {"tensor": "o", "index": ["b", {"start": "-(h) + 2*b*1 - 3*b + b + 128*h - h + h", "size": 128}]},
         "src": "t", "flags": ["accumulate"]}
      ]}}
    ]}},
    {"loop": {"var": "h", "stop": 1, "body": []}}
  ]
})";

// Every immediate, nc_matmul and psum.
const char* const kImmediates = R"({
  "nsim_kernel": 1,
  "tensors": [{"name": "w", "buffer": "hbm", "kind": "input", "dtype": "float32", "shape": [128, 128]}],
  "body": [
    {"alloc": {"name": "s", "buffer": "sbuf", "dtype": "float32", "shape": [128, 128]}},
    {"alloc": {"name": "p", "buffer": "psum", "dtype": "float32", "shape": [128, 512]}},
    {"op": "nc_matmul", "dst": "p", "stationary": "s", "moving": {"tensor": "s", "index": [{"size": 128}, {"start": 0, "size": 128}]},
     "flags": ["accumulate", "is_transpose", "reverse0", "reverse1", "negate", "reverse_pred", "double_row", "onezero",
               "has_imm0", "has_imm1", "dynamic_addr"], "loc": {"file": "mm.py", "line": 40}},
    {"op": "activation", "engine": "scalar", "dst": "s", "data": "s", "act": "gelu_apprx_tanh", "alu0": "add", "alu1": "maximum",
     "reduce_cmd": "reset_reduce", "imm": [1.5, -0.25, 0.1, "-inf"], "iimm": [1, -2, 3, 4, 5, 6, 7, 8, 9, 2147483647],
     "axis_count": 2},
    {"op": "nc_stream_shuffle", "dst": "s", "src": "s",
     "shuffle": [31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 255]},
    {"op": "memset", "dst": "s", "imm": [3], "iimm": [7]},
    {"op": "iota", "dst": "s", "iimm": [0, 1, 1, 128]},
    {"op": "activation", "dst": "s", "data": "s", "imm": ["nan", "inf", 0.3333333432674408]},
    {"op": "dma_copy", "dst": "s", "src": "w", "flags": [2048, "negate"]}
  ]
})";

Error kernel_error(const std::string& text) {
  try {
    parse_kernel_json(text, "k.json");
  } catch (const Error& e) {
    return e;
  }
  FAIL("expected an nsim::Error for:\n" << text);
  return Error(ErrorCode::kInternal, "unreachable");
}

/// A minimal kernel around `body` (with tensor x [256, 512] and a tile t [128, 512]).
std::string wrap(const std::string& body) {
  return R"({"nsim_kernel": 1, "tensors": [{"name": "x", "buffer": "hbm", "kind": "input", "dtype": "float32", "shape": [256, 512]}],
"body": [{"alloc": {"name": "t", "buffer": "sbuf", "dtype": "float32", "shape": [128, 512]}}, )" +
         body + "]}";
}

void check_round_trip(const Kernel& k) {
  const std::string text = write_kernel_json(k);
  INFO(text);
  const Kernel back = parse_kernel_json(text);
  CHECK(back == k);
  CHECK(write_kernel_json(back) == text);  // stable
}

}  // namespace

TEST_CASE("kernel_json: the documented example", "[kernel_json]") {
  const Kernel k = parse_kernel_json(kDocExample, "softmax.json");
  CHECK(k.name == "row_softmax");
  REQUIRE(k.tensors.size() == 5);
  CHECK(k.tensors[0].name == "x");
  CHECK(k.tensors[0].space == isa::Space::kHbm);
  CHECK(k.tensors[0].kind == TensorKind::kInput);
  CHECK(k.tensors[0].shape == std::vector<int64_t>{256, 512});
  CHECK(k.tensors[1].kind == TensorKind::kOutput);
  CHECK(k.tensors[2].name == "xt");
  CHECK(k.tensors[2].space == isa::Space::kSbuf);
  CHECK(k.tensors[2].kind == TensorKind::kInternal);
  CHECK(k.tensors[2].bufs == 2);
  CHECK(k.tensors[3].shape == std::vector<int64_t>{128, 1});
  CHECK(k.find_tensor("sum") == 4);
  CHECK(k.find_tensor("nope") == -1);

  REQUIRE(k.body.size() == 1);
  CHECK(k.body[0] == Stmt{Stmt::Kind::kLoop, 0});
  REQUIRE(k.loops.size() == 1);
  const Loop& l = k.loops[0];
  CHECK(l.var == "i");
  CHECK(l.start == 0);
  CHECK(l.stop == 2);
  CHECK(l.step == 1);
  CHECK(l.kind == LoopKind::kAffine);
  CHECK(l.trip_count() == 2);
  REQUIRE(l.body.size() == 10);
  CHECK(l.body[0] == Stmt{Stmt::Kind::kAlloc, 2});
  CHECK(l.body[3] == Stmt{Stmt::Kind::kOp, 0});
  CHECK(l.body[9] == Stmt{Stmt::Kind::kOp, 6});

  REQUIRE(k.ops.size() == 7);
  const Op& load = k.ops[0];
  CHECK(load.name == "dma_copy");
  CHECK_FALSE(load.engine.has_value());
  CHECK(load.loc == SourceLoc{"softmax.py", 12, "softmax"});
  REQUIRE(load.operands[0].has_value());
  CHECK(load.operands[0]->tensor == 2);
  CHECK(load.operands[0]->dims.empty());
  REQUIRE(load.operands[1].has_value());
  const Access& src = *load.operands[1];
  CHECK(src.tensor == 0);
  REQUIRE(src.dims.size() == 2);
  CHECK(src.dims[0].start == Affine{0, {{0, 128}}});
  CHECK(src.dims[0].size == 128);
  CHECK(src.dims[1] == DimAccess{Affine{}, 512, 1, false});  // missing trailing dim = whole dim
  CHECK(src.dims[0].start.eval({1}) == 128);

  CHECK(k.ops[1].alu0 == isa::AluOp::kMaximum);
  const Access& bc = *k.ops[2].operands[2];
  REQUIRE(bc.dims.size() == 2);
  CHECK(bc.dims[1].broadcast);
  CHECK(bc.dims[1].size == 512);
  CHECK(bc.dims[1].start.is_const());
  CHECK(k.ops[2].alu0 == isa::AluOp::kSubtract);
  CHECK(k.ops[3].act == isa::ActFunc::kExp);
  CHECK(k.ops[3].alu1 == isa::AluOp::kAdd);
  CHECK(k.ops[3].operands[4]->tensor == 4);  // activation slot 4 = reduce_res
  CHECK_FALSE(k.ops[3].operands[2].has_value());
  CHECK(k.ops[5].operands[2]->tensor == 4);  // tensor_scalar operand0
  CHECK(k.ops[6].loc.line == 18);

  check_round_trip(k);
}

TEST_CASE("kernel_json: nested loops and dims", "[kernel_json]") {
  const Kernel k = parse_kernel_json(kNested);
  REQUIRE(k.loops.size() == 3);
  CHECK(k.loops[0].var == "b");
  CHECK(k.loops[0].kind == LoopKind::kSequential);
  CHECK(k.loops[0].loc.line == 5);
  CHECK(k.loops[1].var == "h");
  CHECK(k.loops[1].start == 1);
  CHECK(k.loops[1].stop == -1);
  CHECK(k.loops[1].step == -2);
  CHECK(k.loops[1].kind == LoopKind::kStatic);
  CHECK(k.loops[1].trip_count() == 1);
  CHECK(k.loops[2].var == "h");  // a sibling may reuse the name
  CHECK(k.loops[2].body.empty());
  CHECK(k.tensors[2].kind == TensorKind::kInternal);
  CHECK(k.tensors[2].loc.line == 3);
  CHECK(k.tensors[4].name == "t");
  CHECK(k.tensors[4].bufs == 3);
  REQUIRE(k.ops.size() == 4);
  CHECK(k.ops[0].engine == isa::Engine::kScalar);
  CHECK(k.ops[0].dma_queue == 3);
  const Access& src = *k.ops[0].operands[1];
  CHECK(src.dims[0] == DimAccess{Affine{0, {{0, 1}}}, 1, 1, false});
  CHECK(src.dims[1].start == Affine{0, {{1, 128}}});
  const Access& rev = *k.ops[2].operands[0];
  CHECK(rev.dims[1] == DimAccess{Affine{}, 1, 1, false});
  CHECK(rev.dims[2] == DimAccess{Affine{31}, 16, -2, false});
  // "-(h) + 2*b*1 - 3*b + b + 128*h - h + h": b cancels out, h first appears first.
  const Access& out = *k.ops[3].operands[0];
  CHECK(out.dims[1].start == Affine{0, {{1, 127}}});
  CHECK(k.ops[3].flags == isa::kAccumulate);
  check_round_trip(k);
}

TEST_CASE("kernel_json: loop bodies are read statement by statement, as the whole document reads them", "[kernel_json]") {
  // A kernel.json text's body, and each loop's body in it, is read one statement at a time (no DOM of a
  // whole loop body: the launch grid of a public kernel makes it one top-level loop): the same kernel, and
  // the same errors where they are reported, as the whole-document DOM gives.
  const Kernel dom = parse_kernel_value(json::parse(kNested, "k.json"), "k.json");
  CHECK(parse_kernel_json(kNested, "k.json") == dom);
  CHECK(parse_kernel_json(kDocExample) == parse_kernel_value(json::parse(kDocExample), "kernel.json"));
  const std::string inner = R"({"loop": {"var": "j", "stop": 2, "body": [
  {"op": "memset", "dst": "t"},
  BAD]}})";
  const auto nested = [&](const std::string& bad) {
    std::string b = inner;
    b.replace(b.find("BAD"), 3, bad);
    return wrap(R"({"loop": {"var": "i", "stop": 2, "body": [)" + b + "]}}");
  };
  // an unknown op two loops deep: its path and line (4: the text's fourth line)
  const Error unknown = kernel_error(nested(R"({"op": "no_such_op"})"));
  CHECK(unknown.code() == ErrorCode::kUnknownOp);
  CHECK_THAT(unknown.message(), Catch::Contains("body[1].loop.body[0].loop.body[1]"));
  CHECK_THAT(unknown.message(), Catch::Contains("k.json:4:"));
  // a syntax error there: json::parse's message
  for (const std::string& bad : {std::string(R"({"op": "memset", "dst": "t",})"), std::string(R"({"op" "memset"})"),
                                 std::string(R"({"op": "memset", "op": "memset"})")}) {
    INFO(bad);
    const std::string text = nested(bad);
    std::string want;
    try {
      json::parse(text, "k.json");
    } catch (const Error& e) {
      want = e.message();
    }
    REQUIRE_FALSE(want.empty());
    const Error e = kernel_error(text);
    CHECK(e.code() == ErrorCode::kJsonSyntax);
    CHECK(e.message() == want);
  }
  // Read in turn: a syntax error in a loop's body after an unknown op there is reported after it (the order
  // docs/kernel-json.md states; a loop statement parsed whole would report the syntax error first).
  const Error first = kernel_error(nested(R"({"op": "no_such_op"}, {"op": "memset", "dst": "t",})"));
  CHECK(first.code() == ErrorCode::kUnknownOp);
  CHECK_THAT(first.message(), Catch::Contains("body[1].loop.body[0].loop.body[1]"));
  // loop statements the statement reader leaves to the whole parse: another member, a duplicate loop field, a
  // body that is not an array, a loop without a body: the errors the DOM gives
  for (const std::string& odd :
       {std::string(R"({"loop": {"var": "j", "stop": 2, "body": []}, "op": "memset"})"),
        std::string(R"({"loop": {"var": "j", "var": "k", "stop": 2, "body": []}})"),
        std::string(R"({"loop": {"var": "j", "stop": 2, "body": {"op": "memset", "dst": "t"}}})"),
        std::string(R"({"loop": {"var": "j", "stop": 2}})"), std::string(R"({"loop": {"var": "j", "stop": -1, "body": [
          {"op": "no_such_op"}]}})")}) {
    INFO(odd);
    const std::string text = wrap(R"({"loop": {"var": "i", "stop": 2, "body": [)" + odd + "]}}");
    std::optional<Error> want;
    try {
      parse_kernel_value(json::parse(text, "k.json"), "k.json");
    } catch (const Error& e) {
      want = e;
    }
    if (!want) {
      CHECK(parse_kernel_json(text, "k.json") == parse_kernel_value(json::parse(text, "k.json"), "k.json"));
      continue;
    }
    const Error e = kernel_error(text);
    CHECK(e.code() == want->code());
  }
}

TEST_CASE("kernel_json: all immediates and nc_matmul", "[kernel_json]") {
  const Kernel k = parse_kernel_json(kImmediates);
  REQUIRE(k.ops.size() == 7);
  const Op& mm = k.ops[0];
  CHECK(mm.name == "nc_matmul");
  CHECK(mm.operands[0]->tensor == 2);
  CHECK(mm.operands[1]->tensor == 1);
  CHECK(mm.operands[2]->dims.size() == 2);
  CHECK(mm.flags == 0x7FF);
  CHECK(mm.loc.line == 40);
  const Op& act = k.ops[1];
  CHECK(act.act == isa::ActFunc::kGeluApprxTanh);
  CHECK(act.alu0 == isa::AluOp::kAdd);
  CHECK(act.alu1 == isa::AluOp::kMaximum);
  CHECK(act.reduce_cmd == isa::ReduceCmd::kResetReduce);
  CHECK(act.imm[0] == 1.5f);
  CHECK(act.imm[1] == -0.25f);
  CHECK(act.imm[2] == 0.1f);
  CHECK(std::isinf(act.imm[3]));
  CHECK(act.imm[3] < 0);
  CHECK(act.iimm[1] == -2);
  CHECK(act.iimm[9] == 2147483647);
  CHECK(act.axis_count == 2);
  CHECK(k.ops[2].shuffle[0] == 31);
  CHECK(k.ops[2].shuffle[31] == 255);
  CHECK(k.ops[3].imm == std::array<float, 4>{3.0f, 0.0f, 1.0f, 0.0f});
  CHECK(k.ops[3].iimm[0] == 7);
  CHECK(k.ops[3].iimm[3] == 1);  // defaults kept
  CHECK(std::isnan(k.ops[5].imm[0]));
  CHECK(k.ops[5].imm[2] == 0.33333334f);
  CHECK(k.ops[6].flags == (2048 | isa::kNegate));

  // NaN != NaN: compare everything else, then the round trip without the NaN op.
  Kernel no_nan = k;
  no_nan.ops[5].imm[0] = 0.0f;
  check_round_trip(no_nan);
  const std::string text = write_kernel_json(k);
  CHECK_THAT(text, Catch::Contains("\"nan\""));
  CHECK_THAT(text, Catch::Contains("\"-inf\""));
  CHECK(std::isnan(parse_kernel_json(text).ops[5].imm[0]));
}

TEST_CASE("kernel_json: a reinterpreting access (dtype) reads and round-trips", "[kernel_json]") {
  // x is float32 (4 bytes): a view as uint32 or float8_e4m3fn_x4 keeps the size (and the tensor's shape)
  const Kernel k = parse_kernel_json(wrap(
      R"({"op": "dma_copy", "dst": "t", "src": {"tensor": "x", "index": [{"size": 128}], "dtype": "uint32"}},
         {"op": "dma_copy", "dst": {"tensor": "t", "dtype": "float8_e4m3fn_x4"}, "src": {"tensor": "x", "index": [{"size": 128}], "dtype": "float8_e4m3fn_x4"}})"));
  REQUIRE(k.ops.size() == 2);
  REQUIRE(k.ops[0].operands[1]->dtype.has_value());
  CHECK(*k.ops[0].operands[1]->dtype == DType::kUInt32);
  CHECK_FALSE(k.ops[0].operands[0]->dtype.has_value());
  CHECK(k.ops[1].operands[0]->dims.empty());
  CHECK(*k.ops[1].operands[0]->dtype == DType::kFloat8E4M3FNX4);
  check_round_trip(k);
  CHECK_THAT(write_kernel_json(k), Catch::Contains(R"({"tensor": "t", "dtype": "float8_e4m3fn_x4"})"));
  CHECK(kernel_error(wrap(R"({"op": "dma_copy", "dst": "t", "src": {"tensor": "x", "dtype": "float9"}})")).code() ==
        ErrorCode::kUnknownName);
}

TEST_CASE("kernel_json: a reinterpreting access of another element size indexes the tensor's bytes as its elements",
          "[kernel_json]") {
  // spec 3.9 view(dtype): the last dim scaled by the ratio of the sizes. x float32 [256, 512] as bfloat16 is
  // [256, 1024] (the access's shape, set when read); t float32 [128, 512] as uint8 is [128, 2048], of which the
  // access takes bytes 8 .. 519 of each partition.
  const Kernel k = parse_kernel_json(wrap(
      R"({"op": "dma_copy", "dst": {"tensor": "t", "dtype": "bfloat16", "index": [{"size": 128}, {"size": 1024}]},
          "src": {"tensor": "x", "index": [{"start": 128, "size": 128}], "dtype": "bfloat16"}},
         {"op": "tensor_copy", "dst": {"tensor": "t", "dtype": "uint8", "index": [{"size": 128}, {"start": 8, "size": 512}]},
          "src": {"tensor": "t", "dtype": "uint8", "shape": [128, 4, 512], "index": [{"size": 128}, {"start": 1, "size": 1}, {"size": 512}]}})"));
  REQUIRE(k.ops.size() == 2);
  const Access& src = *k.ops[0].operands[1];
  CHECK(src.shape == std::vector<int64_t>{256, 1024});
  CHECK(src.dims[1].size == 1024);  // the index's missing dims cover the scaled shape
  CHECK(k.ops[0].operands[0]->shape == std::vector<int64_t>{128, 1024});
  CHECK(k.ops[1].operands[0]->shape == std::vector<int64_t>{128, 2048});
  CHECK(k.ops[1].operands[1]->shape == std::vector<int64_t>{128, 4, 512});  // a re-dimensioning of the bytes
  check_round_trip(k);
  // A re-dimensioning keeps the count of the new elements; the last dim's bytes must divide. (An index past the
  // scaled shape is verify()'s E408: tests/python/test_view_dtype.py.)
  CHECK(kernel_error(wrap(R"({"op": "dma_copy", "dst": "t", "src": {"tensor": "x", "dtype": "bfloat16", "shape": [256, 512], "index": [{"size": 128}]}})"))
            .code() == ErrorCode::kBadReshape);
  const std::string odd = R"({"nsim_kernel": 1, "tensors": [{"name": "x", "buffer": "hbm", "kind": "input", "dtype": "bfloat16", "shape": [128, 3]}],
"body": [{"alloc": {"name": "t", "buffer": "sbuf", "dtype": "float32", "shape": [128, 3]}},
         {"op": "dma_copy", "dst": "t", "src": {"tensor": "x", "dtype": "float32"}}]})";
  const Error e = kernel_error(odd);
  CHECK(e.code() == ErrorCode::kBadDtype);
  CHECK_THAT(e.what(), Catch::Contains("6 bytes are not a whole number of 4-byte elements"));
  const std::string one_dim = R"({"nsim_kernel": 1, "tensors": [{"name": "x", "buffer": "hbm", "kind": "input", "dtype": "float32", "shape": [128]}],
"body": [{"alloc": {"name": "u", "buffer": "sbuf", "dtype": "bfloat16", "shape": [128]}},
         {"op": "dma_copy", "dst": "x", "src": {"tensor": "u", "dtype": "float32"}}]})";
  CHECK_THAT(kernel_error(one_dim).what(), Catch::Contains("has no free dim"));
}

TEST_CASE("kernel_json: a re-dimensioned access (shape) reads, round-trips and keeps elements and partitions", "[kernel_json]") {
  // t [128, 512] as [128, 8, 64], visited dim 2 before dim 1 (the NKI transpose tutorial's destination); x
  // [256, 512] as [256, 2, 256] (any dims in HBM); index and order refer to the access's shape.
  const Kernel k = parse_kernel_json(wrap(
      R"({"op": "dma_copy", "dst": {"tensor": "t", "shape": [128, 8, 64], "index": [{"size": 128}, {"size": 8}, {"size": 64}], "order": [0, 2, 1]},
          "src": {"tensor": "x", "shape": [256, 2, 256], "index": [{"start": 128, "size": 128}, {"size": 2}, {"size": 256}]}},
         {"op": "dma_copy", "dst": "t", "src": {"tensor": "x", "shape": [256, 512], "index": [{"size": 128}]}})"));
  REQUIRE(k.ops.size() == 2);
  const Access& d = *k.ops[0].operands[0];
  CHECK(d.shape == std::vector<int64_t>{128, 8, 64});
  CHECK(d.order == std::vector<int>{0, 2, 1});
  REQUIRE(d.dims.size() == 3);
  CHECK(d.dims[2].size == 64);
  CHECK(k.ops[0].operands[1]->dims[0].start.c == 128);
  CHECK(k.ops[1].operands[1]->shape.empty());  // the tensor's own shape is no re-dimensioning
  check_round_trip(k);
  CHECK_THAT(write_kernel_json(k), Catch::Contains(R"("shape": [128, 8, 64],)"));
  // The element count changes, the partition dim changes (on chip), too many dims on chip, a dim of 0. (An
  // index past the access's dims is verify()'s E408: tests/python/test_nki_rearrange.py.)
  CHECK(kernel_error(wrap(R"({"op": "dma_copy", "dst": "t", "src": {"tensor": "x", "shape": [256, 2, 255], "index": [{"size": 128}]}})"))
            .code() == ErrorCode::kBadReshape);
  CHECK(kernel_error(wrap(R"({"op": "dma_copy", "dst": {"tensor": "t", "shape": [64, 1024]}, "src": {"tensor": "x", "index": [{"size": 128}]}})"))
            .code() == ErrorCode::kBadReshape);
  CHECK(kernel_error(wrap(R"({"op": "dma_copy", "dst": {"tensor": "t", "shape": [128, 2, 2, 2, 2, 32]}, "src": {"tensor": "x", "index": [{"size": 128}]}})"))
            .code() == ErrorCode::kWrongType);
  CHECK(kernel_error(wrap(R"({"op": "dma_copy", "dst": {"tensor": "t", "shape": [128, 0, 64]}, "src": {"tensor": "x", "index": [{"size": 128}]}})"))
            .code() == ErrorCode::kWrongType);
}

TEST_CASE("kernel_json: a strided access (shape + strides) reads and round-trips", "[kernel_json]") {
  // t [128, 512] read as the overlapping windows [128, 7, 3, 7, 3] of a 16 x 32 image per partition (width 3,
  // stride 2 in both dims: strides 64, 32, 2, 1; strides[0] = 512, the partition step); any element count.
  const Kernel k = parse_kernel_json(wrap(
      R"({"alloc": {"name": "w", "buffer": "sbuf", "dtype": "float32", "shape": [128, 7, 3, 7, 3]}},
         {"op": "tensor_copy", "dst": "w", "src": {"tensor": "t", "shape": [128, 7, 3, 7, 3], "strides": [512, 64, 32, 2, 1], "index": [{"size": 128}, {"size": 7}, {"size": 3}, {"size": 7}, {"size": 3}]}})"));
  REQUIRE(k.ops.size() == 1);
  const Access& a = *k.ops[0].operands[1];
  CHECK(a.shape == std::vector<int64_t>{128, 7, 3, 7, 3});
  CHECK(a.strides == std::vector<int64_t>{512, 64, 32, 2, 1});
  check_round_trip(k);
  CHECK_THAT(write_kernel_json(k), Catch::Contains(R"("strides": [512, 64, 32, 2, 1],)"));
  // without shape, one stride per dim, the partition step, positive strides
  CHECK(kernel_error(wrap(R"({"op": "dma_copy", "dst": "t", "src": {"tensor": "x", "strides": [512, 1], "index": [{"size": 128}]}})"))
            .code() == ErrorCode::kWrongType);
  CHECK(kernel_error(wrap(R"({"op": "dma_copy", "dst": "t", "src": {"tensor": "x", "shape": [128, 512], "strides": [1], "index": [{"size": 128}]}})"))
            .code() == ErrorCode::kWrongType);
  CHECK(kernel_error(wrap(R"({"op": "dma_copy", "dst": "x", "src": {"tensor": "t", "shape": [128, 256], "strides": [256, 2], "index": [{"size": 128}]}})"))
            .code() == ErrorCode::kBadReshape);
  CHECK(kernel_error(wrap(R"({"op": "dma_copy", "dst": "t", "src": {"tensor": "x", "shape": [128, 512], "strides": [512, 0], "index": [{"size": 128}]}})"))
            .code() == ErrorCode::kWrongType);
}

TEST_CASE("kernel_json: writer omits defaults and writes expressions", "[kernel_json]") {
  Kernel k;
  k.name = "built";
  k.tensors.push_back(Tensor{"in", isa::Space::kHbm, DType::kBFloat16, {64, 64}, TensorKind::kInput, 0, {}});
  k.tensors.push_back(Tensor{"tile", isa::Space::kSbuf, DType::kFloat32, {64, 64}, TensorKind::kInternal, 0, {}});
  Loop outer;
  outer.var = "i";
  outer.stop = 8;
  Loop inner;
  inner.var = "j";
  inner.start = 2;
  inner.stop = 10;
  inner.step = 4;
  k.loops = {outer, inner};
  Op op;
  op.name = "dma_copy";
  op.operands[0] = Access{1, {}};
  op.operands[1] = Access{0, {DimAccess{Affine{-5, {{1, 2}, {0, -1}}}, 1, 1, false}, DimAccess{Affine{64 - 1, {}}, 64, -1, false}}};
  op.imm[1] = 0.1f;
  op.loc = SourceLoc{"b.py", 77, ""};
  k.ops.push_back(op);
  k.loops[1].body = {Stmt{Stmt::Kind::kAlloc, 1}, Stmt{Stmt::Kind::kOp, 0}};
  k.loops[0].body = {Stmt{Stmt::Kind::kLoop, 1}};
  k.body = {Stmt{Stmt::Kind::kLoop, 0}};
  const std::string text = write_kernel_json(k);
  INFO(text);
  CHECK_THAT(text, Catch::Contains("\"2*j - i - 5\""));
  CHECK_THAT(text, Catch::Contains("{\"start\": 63, \"size\": 64, \"step\": -1}"));
  CHECK_THAT(text, Catch::Contains("\"imm\": [0, 0.1]"));
  CHECK_THAT(text, Catch::Contains("\"start\": 2"));
  CHECK_THAT(text, Catch::Contains("\"step\": 4"));
  CHECK_THAT(text, !Catch::Contains("\"bufs\""));
  CHECK_THAT(text, !Catch::Contains("\"kind\": \"affine\""));
  CHECK_THAT(text, !Catch::Contains("alu0"));
  check_round_trip(k);

  // Structural problems of a hand-built kernel are reported, not crashed on.
  Kernel cyc = k;
  cyc.loops[1].body.push_back(Stmt{Stmt::Kind::kLoop, 0});
  CHECK_THROWS_AS(write_kernel_json(cyc), Error);
  Kernel oob = k;
  oob.body.push_back(Stmt{Stmt::Kind::kOp, 9});
  CHECK_THROWS_AS(write_kernel_json(oob), Error);
}

TEST_CASE("kernel_json: call stacks are interned in a stacks table and round-trip", "[kernel_json]") {
  Kernel k;
  k.name = "stacked";
  k.tensors.push_back(Tensor{"t", isa::Space::kSbuf, DType::kFloat32, {128, 4}, TensorKind::kInternal, 0, {}});
  const std::string st = "kern (k.py:3) > helper (k.py:9)";
  for (int i = 0; i < 3; ++i) {
    Op op;
    op.name = "memset";
    op.operands[0] = Access{0, {}};
    op.loc = SourceLoc{"k.py", 20 + i, "inner", i < 2 ? st : std::string()};
    k.ops.push_back(op);
  }
  k.body = {Stmt{Stmt::Kind::kAlloc, 0}, Stmt{Stmt::Kind::kOp, 0}, Stmt{Stmt::Kind::kOp, 1}, Stmt{Stmt::Kind::kOp, 2}};
  const std::string text = write_kernel_json(k);
  INFO(text);
  const json::Value v = json::parse(text);
  REQUIRE(v.find("stacks") != nullptr);
  CHECK(v.find("stacks")->size() == 1);  // written once, referenced twice
  CHECK_THAT(text, Catch::Contains("\"stack\": 0"));
  const Kernel back = parse_kernel_json(text);
  REQUIRE(back.ops.size() == 3);
  CHECK(back.ops[0].loc.stack == st);
  CHECK(back.ops[1].loc.stack == st);
  CHECK(back.ops[2].loc.stack.empty());
  check_round_trip(k);
  // An index outside the table, or without one, is an error naming the path.
  const std::string no_table = std::string(R"j({"nsim_kernel": 1, "body": [
    {"alloc": {"name": "t", "buffer": "sbuf", "dtype": "float32", "shape": [128, 4]}},
    {"op": "memset", "dst": "t", "loc": {"file": "k.py", "line": 1, "stack": 0}}]})j");
  CHECK_THROWS_AS(parse_kernel_json(no_table), Error);
  const std::string beyond = std::string(R"j({"nsim_kernel": 1, "stacks": ["a (k.py:1)"], "body": [
    {"alloc": {"name": "t", "buffer": "sbuf", "dtype": "float32", "shape": [128, 4]}},
    {"op": "memset", "dst": "t", "loc": {"file": "k.py", "line": 1, "stack": 1}}]})j");
  try {
    parse_kernel_json(beyond);
    FAIL("a stack index beyond the table was accepted");
  } catch (const Error& e) {
    CHECK_THAT(e.message(), Catch::Contains("loc.stack"));
  }
}

TEST_CASE("kernel_json: labels, order groups and an op's \"after\" labels read and round-trip", "[kernel_json]") {
  // "after" is a label or a list of labels (the Python tracer writes a list: the register_loads an op waits for).
  const Kernel k = parse_kernel_json(wrap(R"({"alloc": {"name": "r", "buffer": "sbuf", "dtype": "int32", "shape": [1, 1]}},
    {"op": "register_load", "src": "r", "label": "register_load#1"},
    {"op": "memset", "dst": "t", "order_group": 2, "after": ["register_load#1"]},
    {"op": "memset", "dst": "t", "after": "register_load#1"})"));
  REQUIRE(k.ops.size() == 3);
  CHECK(k.ops[0].name == "register_load");
  CHECK(k.ops[0].label == "register_load#1");
  CHECK(k.ops[1].order_group == 2);
  CHECK(k.ops[1].after == std::vector<std::string>{"register_load#1"});
  CHECK(k.ops[2].after == std::vector<std::string>{"register_load#1"});
  check_round_trip(k);
  CHECK(kernel_error(wrap(R"({"op": "memset", "dst": "t", "after": 5})")).code() == ErrorCode::kWrongType);
  CHECK(kernel_error(wrap(R"({"op": "memset", "dst": "t", "after": [1]})")).code() == ErrorCode::kWrongType);
}

TEST_CASE("kernel_json: the writer's own output of every test kernel re-reads", "[kernel_json]") {
  for (const char* text : {kDocExample, kNested}) {
    const Kernel k = parse_kernel_json(text);
    const std::string w = write_kernel_json(k);
    CHECK(json::parse(w) == json::parse(write_kernel_json(parse_kernel_json(w))));
  }
}

// ---------------------------------------------------------------- errors, one per code

TEST_CASE("kernel_json: E401 JSON syntax", "[kernel_json][errors]") {
  const Error e = kernel_error("{\"nsim_kernel\": 1,\n \"body\": [,]}");
  CHECK(e.code() == ErrorCode::kJsonSyntax);
  CHECK_THAT(e.message(), Catch::StartsWith("k.json:2:11:"));
}

TEST_CASE("kernel_json: E402 schema version", "[kernel_json][errors]") {
  for (const char* v : {"2", "0", "\"1\"", "1.5", "null"}) {
    const Error e = kernel_error(std::string("{\"nsim_kernel\": ") + v + ", \"body\": []}");
    CHECK(e.code() == ErrorCode::kSchemaVersion);
    CHECK_THAT(e.message(), Catch::Contains("nsim_kernel"));
  }
  // A newer version is reported as such even with fields this version does not know.
  CHECK(kernel_error(R"({"nsim_kernel": 2, "future": 1})").code() == ErrorCode::kSchemaVersion);
}

TEST_CASE("kernel_json: E403 missing field", "[kernel_json][errors]") {
  Error e = kernel_error(R"({"body": []})");
  CHECK(e.code() == ErrorCode::kMissingField);
  CHECK_THAT(e.message(), Catch::Contains("'nsim_kernel'"));
  e = kernel_error(R"({"nsim_kernel": 1})");
  CHECK(e.code() == ErrorCode::kMissingField);
  CHECK_THAT(e.message(), Catch::Contains("'body'"));
  e = kernel_error(R"({"nsim_kernel": 1, "tensors": [{"name": "x", "buffer": "hbm", "dtype": "float32"}], "body": []})");
  CHECK(e.code() == ErrorCode::kMissingField);
  CHECK_THAT(e.message(), Catch::Contains("tensors[0] \"x\": missing required field 'shape'"));
  e = kernel_error(wrap(R"({"loop": {"var": "i", "body": []}})"));
  CHECK(e.code() == ErrorCode::kMissingField);
  CHECK_THAT(e.message(), Catch::Contains("body[1].loop: missing required field 'stop'"));
  e = kernel_error(wrap(R"({"loop": {"var": "i", "stop": 2, "body": [{"engine": "vector"}]}})"));
  CHECK(e.code() == ErrorCode::kMissingField);
  CHECK_THAT(e.message(), Catch::Contains("body[1].loop.body[0]:"));
  e = kernel_error(wrap(R"({"op": "tensor_copy", "dst": {"index": [0]}, "src": "t", "loc": {"line": 4}})"));
  CHECK(e.code() == ErrorCode::kMissingField);
  CHECK_THAT(e.message(), Catch::Contains("body[1].op \"tensor_copy\".dst: missing required field 'tensor'"));
  CHECK(e.loc().line == 4);
}

TEST_CASE("kernel_json: E404 wrong type or invalid value", "[kernel_json][errors]") {
  // The op error of the brief: an unknown slot of tensor_tensor, inside a loop, with the op's loc.
  Error e = kernel_error(wrap(R"({"loop": {"var": "i", "stop": 2, "body": [
    {"op": "tensor_tensor", "dst": "t", "data1": "t", "data3": "t", "loc": {"file": "k.py", "line": 12, "function": "k"}}]}})"));
  CHECK(e.code() == ErrorCode::kWrongType);
  CHECK_THAT(e.message(), Catch::Contains("body[1].loop.body[0].op \"tensor_tensor\": field 'data3'"));
  CHECK_THAT(e.message(), Catch::Contains("allowed: dst, data1, data2"));
  CHECK(e.loc().line == 12);
  CHECK(e.loc().file == "k.py");
  CHECK_THAT(std::string(e.what()), Catch::EndsWith("[at k.py:12 (k)]"));

  const auto code_of = [](const std::string& t) { return kernel_error(t).code(); };
  // Shapes.
  CHECK(code_of(R"({"nsim_kernel": 1, "tensors": [{"name": "x", "buffer": "hbm", "dtype": "float32", "shape": [0]}], "body": []})") == ErrorCode::kWrongType);
  CHECK(code_of(R"({"nsim_kernel": 1, "tensors": [{"name": "x", "buffer": "hbm", "dtype": "float32", "shape": [2.5]}], "body": []})") == ErrorCode::kWrongType);
  CHECK(code_of(R"({"nsim_kernel": 1, "tensors": [{"name": "x", "buffer": "hbm", "dtype": "float32", "shape": "4"}], "body": []})") == ErrorCode::kWrongType);
  CHECK(code_of(R"({"nsim_kernel": 1, "tensors": [{"name": "x", "buffer": "hbm", "dtype": "float32", "shape": []}], "body": []})") == ErrorCode::kWrongType);
  e = kernel_error(R"({"nsim_kernel": 1, "tensors": [{"name": "x", "buffer": "hbm", "dtype": "float32", "shape": [4294967296, 4294967296]}], "body": []})");
  CHECK(e.code() == ErrorCode::kWrongType);
  CHECK_THAT(e.message(), Catch::Contains("overflows"));
  e = kernel_error(wrap(R"({"alloc": {"name": "u", "buffer": "sbuf", "dtype": "float32", "shape": [128, 1, 1, 1, 1, 1]}})"));
  CHECK(e.code() == ErrorCode::kWrongType);
  CHECK_THAT(e.message(), Catch::Contains("body[1].alloc \"u\".shape"));
  // Buffers in the wrong place.
  CHECK(code_of(R"({"nsim_kernel": 1, "tensors": [{"name": "x", "buffer": "sbuf", "dtype": "float32", "shape": [4]}], "body": []})") == ErrorCode::kWrongType);
  CHECK(code_of(wrap(R"({"alloc": {"name": "u", "buffer": "hbm", "dtype": "float32", "shape": [4]}})")) == ErrorCode::kWrongType);
  // loc.line not an integer.
  e = kernel_error(wrap(R"({"op": "memset", "dst": "t", "loc": {"line": "12"}})"));
  CHECK(e.code() == ErrorCode::kWrongType);
  CHECK_THAT(e.message(), Catch::Contains("body[1].loc.line"));
  // Others.
  CHECK(code_of(R"([])") == ErrorCode::kWrongType);
  CHECK(code_of(R"({"nsim_kernel": 1, "body": {}})") == ErrorCode::kWrongType);
  CHECK(code_of(R"({"nsim_kernel": 1, "body": [], "extra": 1})") == ErrorCode::kWrongType);
  CHECK(code_of(wrap(R"({"op": "memset", "loop": {}})")) == ErrorCode::kWrongType);
  CHECK(code_of(wrap(R"({"op": "memset", "dst": "t", "imm": [1, 2, 3, 4, 5]})")) == ErrorCode::kWrongType);
  CHECK(code_of(wrap(R"({"op": "memset", "dst": "t", "imm": [1e39]})")) == ErrorCode::kWrongType);
  CHECK(code_of(wrap(R"({"op": "memset", "dst": "t", "iimm": [2147483648]})")) == ErrorCode::kWrongType);
  CHECK(code_of(wrap(R"({"op": "memset", "dst": "t", "shuffle": [1, 2]})")) == ErrorCode::kWrongType);
  CHECK(code_of(wrap(R"({"op": "memset", "dst": "t", "dma_queue": -1})")) == ErrorCode::kWrongType);
  CHECK(code_of(wrap(R"({"op": "memset", "dst": {"tensor": "t", "index": [0, 0, 0]}})")) == ErrorCode::kWrongType);
  CHECK(code_of(wrap(R"({"op": "memset", "dst": {"tensor": "t", "index": [{"size": 0}]}})")) == ErrorCode::kWrongType);
  CHECK(code_of(wrap(R"({"op": "memset", "dst": {"tensor": "t", "index": [{"start": 0, "step": 0}]}})")) == ErrorCode::kWrongType);
  CHECK(code_of(wrap(R"({"op": "memset", "dst": {"tensor": "t", "index": [1.5]}})")) == ErrorCode::kWrongType);
  CHECK(code_of(wrap(R"({"op": "memset", "dst": 3})")) == ErrorCode::kWrongType);
  CHECK(code_of(wrap(R"({"loop": {"var": "1i", "stop": 2}})")) == ErrorCode::kWrongType);
}

TEST_CASE("kernel_json: E405 unknown op", "[kernel_json][errors]") {
  const Error e = kernel_error(wrap(R"({"op": "tensor_tensr", "dst": "t", "loc": {"file": "k.py", "line": 31}})"));
  CHECK(e.code() == ErrorCode::kUnknownOp);
  CHECK_THAT(e.message(), Catch::Contains("body[1].op"));
  CHECK_THAT(e.message(), Catch::Contains("did you mean 'tensor_tensor'"));
  CHECK(e.loc().line == 31);
  const Error far = kernel_error(wrap(R"({"op": "zzzzzzzzzzzzzzzzzzzz"})"));
  CHECK(far.code() == ErrorCode::kUnknownOp);
  CHECK_THAT(far.message(), Catch::Contains("nc_matmul"));  // lists the known ops
}

TEST_CASE("kernel_json: E406 unknown name", "[kernel_json][errors]") {
  Error e = kernel_error(wrap(R"({"op": "tensor_copy", "dst": "t", "src": "xx", "loc": {"line": 8}})"));
  CHECK(e.code() == ErrorCode::kUnknownName);
  CHECK_THAT(e.message(), Catch::Contains("body[1].op \"tensor_copy\".src: unknown tensor 'xx'"));
  CHECK_THAT(e.message(), Catch::Contains("did you mean 'x'"));
  CHECK(e.loc().line == 8);
  // A tile used before its alloc.
  e = kernel_error(wrap(R"({"op": "tensor_copy", "dst": "t", "src": "late"}, {"alloc": {"name": "late", "buffer": "sbuf", "dtype": "float32", "shape": [1]}})"));
  CHECK(e.code() == ErrorCode::kUnknownName);
  // Unknown loop variable.
  e = kernel_error(wrap(R"({"loop": {"var": "i", "stop": 2, "body": [{"op": "memset", "dst": {"tensor": "t", "index": ["j"]}}]}})"));
  CHECK(e.code() == ErrorCode::kUnknownName);
  CHECK_THAT(e.message(), Catch::Contains("body[1].loop.body[0].op \"memset\".dst.index[0]"));
  CHECK_THAT(e.message(), Catch::Contains("in scope: i"));
  // Enum words.
  const auto code_of = [](const std::string& t) { return kernel_error(t).code(); };
  CHECK(code_of(wrap(R"({"op": "memset", "dst": "t", "engine": "vectr"})")) == ErrorCode::kUnknownName);
  CHECK(code_of(wrap(R"({"op": "memset", "dst": "t", "alu0": "plus"})")) == ErrorCode::kUnknownName);
  CHECK(code_of(wrap(R"({"op": "memset", "dst": "t", "act": "expo"})")) == ErrorCode::kUnknownName);
  CHECK(code_of(wrap(R"({"op": "memset", "dst": "t", "reduce_cmd": "go"})")) == ErrorCode::kUnknownName);
  CHECK(code_of(wrap(R"({"op": "memset", "dst": "t", "flags": ["fast"]})")) == ErrorCode::kUnknownName);
  CHECK(code_of(wrap(R"({"alloc": {"name": "u", "buffer": "sbuff", "dtype": "float32", "shape": [4]}})")) == ErrorCode::kUnknownName);
  CHECK(code_of(wrap(R"({"alloc": {"name": "u", "buffer": "sbuf", "dtype": "float33", "shape": [4]}})")) == ErrorCode::kUnknownName);
  CHECK(code_of(wrap(R"({"loop": {"var": "i", "stop": 2, "kind": "parallel"}})")) == ErrorCode::kUnknownName);
  CHECK(code_of(R"({"nsim_kernel": 1, "tensors": [{"name": "x", "buffer": "hbm", "kind": "in", "dtype": "float32", "shape": [4]}], "body": []})") == ErrorCode::kUnknownName);
}

TEST_CASE("kernel_json: E407 bad index expression", "[kernel_json][errors]") {
  const auto err = [](const std::string& expr) {
    return kernel_error(wrap(R"({"loop": {"var": "i", "stop": 2, "body": [{"loop": {"var": "j", "stop": 2, "body": [
      {"op": "memset", "dst": {"tensor": "t", "index": [)" + expr + "]}}]}}]}}"));
  };
  Error e = err("\"i*j\"");
  CHECK(e.code() == ErrorCode::kBadIndex);
  CHECK_THAT(e.message(), Catch::Contains("not affine"));
  CHECK_THAT(e.message(), Catch::Contains("body[1].loop.body[0].loop.body[0].op \"memset\".dst.index[0]"));
  for (const char* bad : {"\"(i+1)*(j-1)\"", "\"\"", "\"i +\"", "\"2i\"", "\"i / 2\"", "\"(i\"", "\"i)\"", "\"1.5\"",
                          "\"99999999999999999999\"", "\"4611686018427387904*4\"", "\"9223372036854775807 + 1\""}) {
    INFO(bad);
    CHECK(err(bad).code() == ErrorCode::kBadIndex);
  }
  // Deep parentheses are bounded.
  CHECK(err("\"" + std::string(100, '(') + "i" + std::string(100, ')') + "\"").code() == ErrorCode::kBadIndex);
  CHECK(err("\"" + std::string(1000, '-') + "i\"").code() == ErrorCode::kBadIndex);
}

TEST_CASE("kernel_json: E408 start outside the dim", "[kernel_json][errors]") {
  const Error e = kernel_error(wrap(R"({"op": "memset", "dst": {"tensor": "t", "index": [{"start": 128}]}})"));
  CHECK(e.code() == ErrorCode::kIndexOutOfBounds);
  CHECK_THAT(e.message(), Catch::Contains("body[1].op \"memset\".dst.index[0]"));
}

TEST_CASE("kernel_json: E411 bad loop", "[kernel_json][errors]") {
  Error e = kernel_error(wrap(R"({"loop": {"var": "i", "stop": 4, "step": 0, "loc": {"line": 3}}})"));
  CHECK(e.code() == ErrorCode::kBadLoop);
  CHECK_THAT(e.message(), Catch::Contains("body[1].loop.step"));
  CHECK(e.loc().line == 3);
  e = kernel_error(wrap(R"({"loop": {"var": "i", "stop": 1e18}})"));
  CHECK(e.code() == ErrorCode::kBadLoop);
  CHECK_THAT(e.message(), Catch::Contains("2^40"));
  CHECK(kernel_error(wrap(R"({"loop": {"var": "i", "start": -9223372036854775808, "stop": 9223372036854775807}})")).code() ==
        ErrorCode::kBadLoop);
  CHECK(kernel_error(wrap(R"({"loop": {"var": "i", "start": 5, "stop": 0}})")).code() == ErrorCode::kBadLoop);
  // 64 nested loops are fine, 65 are not.
  const auto nest = [](int n) {
    std::string s;
    for (int d = 0; d < n; ++d) s += R"({"loop": {"var": "v)" + std::to_string(d) + R"(", "stop": 1, "body": [)";
    for (int d = 0; d < n; ++d) s += "]}}";
    return s;
  };
  CHECK(parse_kernel_json(wrap(nest(64))).loops.size() == 64);
  e = kernel_error(wrap(nest(65)));
  CHECK(e.code() == ErrorCode::kBadLoop);
  CHECK_THAT(e.message(), Catch::Contains("deeper than 64"));
}

TEST_CASE("kernel_json: E412 duplicate names", "[kernel_json][errors]") {
  Error e = kernel_error(wrap(R"({"alloc": {"name": "x", "buffer": "sbuf", "dtype": "float32", "shape": [4]}})"));
  CHECK(e.code() == ErrorCode::kDuplicateName);
  CHECK_THAT(e.message(), Catch::Contains("body[1].alloc \"x\""));
  e = kernel_error(wrap(R"({"loop": {"var": "i", "stop": 2, "body": [{"loop": {"var": "i", "stop": 2}}]}})"));
  CHECK(e.code() == ErrorCode::kDuplicateName);
  CHECK_THAT(e.message(), Catch::Contains("body[1].loop.body[0].loop.var"));
  CHECK(kernel_error(R"({"nsim_kernel": 1, "tensors": [{"name": "x", "buffer": "hbm", "dtype": "float32", "shape": [4]},
      {"name": "x", "buffer": "hbm", "dtype": "float32", "shape": [4]}], "body": []})")
            .code() == ErrorCode::kDuplicateName);
}

TEST_CASE("kernel_json: iota / affine_select iimm entries may be index expressions", "[kernel_json]") {
  const std::string body = R"({"loop": {"var": "i", "stop": 4, "body": [
      {"op": "iota", "dst": "t", "iimm": ["128*i + 5", 1, 0, 1, 0, 1, 0, 1, -1, 512]},
      {"op": "affine_select", "dst": "t", "on_true": "t", "alu0": "greater_equal", "imm": [-9984], "iimm": ["-512*i", 1, 0, 1, 0, 1, 0, 1, -1, "512"]}]}})";
  const Kernel k = parse_kernel_json(wrap(body));
  REQUIRE(k.ops.size() == 2);
  REQUIRE(k.ops[0].iimm_expr.size() == 1);
  CHECK(k.ops[0].iimm_expr[0].first == 0);
  CHECK(k.ops[0].iimm_expr[0].second.c == 5);
  CHECK(k.ops[0].iimm_expr[0].second.terms == std::vector<std::pair<int, int64_t>>{{0, 128}});
  CHECK(k.ops[0].iimm[0] == 0);
  CHECK(k.ops[0].iimm[9] == 512);
  REQUIRE(k.ops[1].iimm_expr.size() == 1);  // "512" has no variable: an int
  CHECK(k.ops[1].iimm[9] == 512);
  check_round_trip(k);
  CHECK_THAT(write_kernel_json(k), Catch::Contains("\"128*i + 5\""));

  // only those ops (and the matmuls' PE tile, isa::kIimmExprOps) take expressions; the expression is checked as an
  // index is
  Error e = kernel_error(wrap(R"({"loop": {"var": "i", "stop": 4, "body": [{"op": "memset", "dst": "t", "iimm": ["i"]}]}})"));
  CHECK(e.code() == ErrorCode::kWrongType);
  CHECK_THAT(e.message(), Catch::Contains("for iota, affine_select, nc_matmul, nc_matmul_mx, load_stationary, "
                                          "multiply_moving only"));
  e = kernel_error(wrap(R"({"loop": {"var": "i", "stop": 4, "body": [{"op": "iota", "dst": "t", "iimm": ["2*j"]}]}})"));
  CHECK(e.code() == ErrorCode::kUnknownName);
  e = kernel_error(wrap(R"({"loop": {"var": "i", "stop": 4, "body": [{"op": "iota", "dst": "t", "iimm": ["2*i*i"]}]}})"));
  CHECK(e.code() == ErrorCode::kBadIndex);
  e = kernel_error(wrap(R"({"op": "iota", "dst": "t", "iimm": ["4294967296"]})"));
  CHECK(e.code() == ErrorCode::kWrongType);
}
