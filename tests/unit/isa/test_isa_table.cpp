// Invariants of the ISA table (isa/opcodes.def, alu_ops.def, act_funcs.def), semantics dispatch for
// every opcode (a verified smoke run per opcode), disassembly, and operand verification errors.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <optional>
#include <set>
#include <string>
#include <algorithm>
#include <vector>

#include "isa/isa.h"
#include "isa/semantics/semantics.h"
#include "sim/error.h"

using namespace nsim;
using namespace nsim::isa;

namespace {

constexpr int kNumAlu = 0
#define ALU(e, name, cls, red, arity) +1
#include "isa/alu_ops.def"
#undef ALU
    ;
constexpr int kNumAct = 0
#define ACT(e, name, ...) +1
#include "isa/act_funcs.def"
#undef ACT
    ;

Limits gen3() {
  Limits l;
  l.generation = 3;
  l.partitions = 128;
  l.sbuf_bytes_per_partition = 229376;
  l.psum_bytes_per_partition = 16384;
  l.psum_bank_bytes = 2048;
  l.hbm_bytes = int64_t{1} << 30;
  l.pe_rows = 128;
  l.pe_cols = 128;
  l.moving_fmax = 512;
  l.moving_fmax_bf16 = 512;
  return l;
}

/// The nsim::Error thrown by verify(), or nullopt.
std::optional<Error> verify_error(const Instr& in, const Limits& lim = gen3()) {
  try {
    verify(in, lim);
  } catch (const Error& e) {
    return e;
  }
  return std::nullopt;
}

std::optional<ErrorCode> verify_code(const Instr& in, const Limits& lim = gen3()) {
  auto e = verify_error(in, lim);
  if (!e) return std::nullopt;
  return e->code();
}

bool contains(const std::string& s, std::string_view sub) { return s.find(sub) != std::string::npos; }

Operand sb(uint32_t P, std::initializer_list<int64_t> free, DType dt = DType::kFloat32, int64_t off = 0) {
  return Operand::tile(Space::kSbuf, dt, off, 0, P, free);
}
Operand ps(uint32_t P, std::initializer_list<int64_t> free, DType dt = DType::kFloat32, int64_t off = 0) {
  return Operand::tile(Space::kPsum, dt, off, 0, P, free);
}

Instr make(Opcode op, std::initializer_list<Operand> ops) {
  Instr in;
  in.op = op;
  in.engine = op_info(op).default_engine;
  size_t i = 0;
  for (const Operand& o : ops) in.opnd[i++] = o;
  return in;
}

Limits gen4() {
  Limits l = gen3();
  l.generation = 4;
  l.mx_rate = 4;
  return l;
}

Instr valid_tensor_tensor() {
  Instr in = make(Opcode::kTensorTensor, {sb(128, {512}), sb(128, {512}, DType::kFloat32, 2048),
                                          sb(128, {512}, DType::kBFloat16, 4096)});
  in.alu0 = AluOp::kAdd;
  return in;
}

// ---- a small machine: local SBUF / PSUM / HBM byte arrays and views onto them ------------------

struct Machine {
  static constexpr uint32_t kParts = 32;  // quantize_mx needs a 32-partition quadrant
  static constexpr int64_t kPitch = 2048;
  std::vector<uint8_t> sbuf = std::vector<uint8_t>(kParts * kPitch, 0);
  std::vector<uint8_t> psum = std::vector<uint8_t>(kParts * kPitch, 0);
  std::vector<uint8_t> hbm = std::vector<uint8_t>(16384, 0);
  int64_t next_sbuf = 0, next_psum = 0, next_hbm = 0;
  ArchState st;

  static int64_t bump(int64_t& next, int64_t bytes) {
    const int64_t at = next;
    next += (bytes + 63) / 64 * 64;
    return at;
  }
  /// A fresh fp32 (or dt) SBUF tile [P, free...], filled with value(p, j) = 10p + j + 1.
  Operand sbuf_tile(uint32_t P, std::initializer_list<int64_t> free, DType dt = DType::kFloat32) {
    Operand o = Operand::tile(Space::kSbuf, dt, 0, 0, P, free);
    o.offset = bump(next_sbuf, o.elems_per_partition() * dtype_bytes(dt));
    REQUIRE(o.byte_extent().second <= kPitch);
    fill(o);
    return o;
  }
  Operand psum_tile(uint32_t P, std::initializer_list<int64_t> free) {
    Operand o = Operand::tile(Space::kPsum, DType::kFloat32, 0, 0, P, free);
    o.offset = bump(next_psum, o.elems_per_partition() * 4);
    REQUIRE(o.byte_extent().second <= kPitch);
    fill(o);
    return o;
  }
  Operand hbm_tile(uint32_t rows, int64_t cols) {
    Operand o = Operand::tile(Space::kHbm, DType::kFloat32, 0, 0, rows, {cols});
    o.offset = bump(next_hbm, rows * cols * 4);
    REQUIRE(o.byte_extent().second <= static_cast<int64_t>(hbm.size()));
    fill(o);
    return o;
  }
  TileView view(const Operand& o) {
    TileView v;
    if (!o.present()) return v;
    v.dtype = o.dtype;
    v.nfree = o.nfree;
    v.size = o.size;
    v.stride = o.stride;
    v.partitions = o.num_partitions;
    if (o.space == Space::kHbm) {
      v.base = hbm.data() + o.offset;
      v.partition_stride_bytes = o.partition_step * dtype_bytes(o.dtype);
    } else {
      auto& store = o.space == Space::kPsum ? psum : sbuf;
      v.base = store.data() + o.start_partition * kPitch + o.offset;
      v.partition_stride_bytes = kPitch;
    }
    return v;
  }
  Views views(const Instr& in) {
    Views vs;
    for (int i = 0; i < kMaxSlots; ++i) vs[static_cast<size_t>(i)] = view(in.slot(i));
    return vs;
  }
  float get(const Operand& o, uint32_t p, int64_t j) { return load_f32(o.dtype, view(o).at(p, j)); }
  void set(const Operand& o, uint32_t p, int64_t j, float x) { store_f32(o.dtype, view(o).at(p, j), x); }
  void fill(const Operand& o) {
    for (uint32_t p = 0; p < o.num_partitions; ++p)
      for (int64_t j = 0; j < o.elems_per_partition(); ++j) set(o, p, j, static_cast<float>(10 * p + j + 1));
  }
  /// verify() must accept, then execute() runs.
  void run(const Instr& in, const Limits& lim = gen3()) {
    INFO(disassemble(in));
    REQUIRE_NOTHROW(verify(in, lim));
    REQUIRE_NOTHROW(execute(in, views(in), st));
  }
};

float val(uint32_t p, int64_t j) { return static_cast<float>(10 * p + j + 1); }

/// Smoke-run one opcode on [4, 8] fp32 tiles and check its result. Returns false if the opcode has
/// no smoke test here (the switch has no default, so -Wswitch flags a new opcode).
bool smoke(Opcode op) {
  Machine m;
  constexpr uint32_t P = 4;
  constexpr int64_t F = 8;
  switch (op) {
    case Opcode::kDmaCopy: {
      const Operand src = m.hbm_tile(P, F);
      const Operand dst = m.sbuf_tile(P, {F});
      m.set(src, 2, 5, -3.25f);
      m.run(make(op, {dst, src}));
      CHECK(m.get(dst, 2, 5) == -3.25f);
      CHECK(m.get(dst, 3, 7) == val(3, 7));
      return true;
    }
    case Opcode::kDmaTranspose: {
      const Operand src = m.hbm_tile(P, F);                 // [4, 8]
      const Operand dst = m.sbuf_tile(static_cast<uint32_t>(F), {P});  // [8, 4]
      m.run(make(op, {dst, src}));
      for (uint32_t j = 0; j < F; ++j)
        for (uint32_t i = 0; i < P; ++i) CHECK(m.get(dst, j, i) == val(i, j));
      return true;
    }
    case Opcode::kTensorCopy: {
      const Operand src = m.sbuf_tile(P, {2, 4});
      const Operand dst = m.sbuf_tile(P, {F});
      m.set(dst, 1, 1, 0.0f);
      m.run(make(op, {dst, src}));
      CHECK(m.get(dst, 1, 1) == val(1, 1));
      CHECK(m.get(dst, 3, 6) == val(3, 6));
      return true;
    }
    case Opcode::kTensorTensor: {
      const Operand a = m.sbuf_tile(P, {F});
      const Operand b = m.sbuf_tile(P, {F});
      const Operand d = m.sbuf_tile(P, {F});
      m.set(b, 0, 0, 100.0f);
      Instr in = make(op, {d, a, b});
      in.alu0 = AluOp::kMultiply;
      m.run(in);
      CHECK(m.get(d, 0, 0) == 100.0f);
      CHECK(m.get(d, 2, 3) == val(2, 3) * val(2, 3));
      return true;
    }
    case Opcode::kMemset: {
      const Operand d = m.sbuf_tile(P, {F});
      Instr in = make(op, {d});
      in.imm[0] = 3.5f;
      m.run(in);
      for (uint32_t p = 0; p < P; ++p)
        for (int64_t j = 0; j < F; ++j) CHECK(m.get(d, p, j) == 3.5f);
      return true;
    }
    case Opcode::kTensorScalar: {
      const Operand data = m.sbuf_tile(P, {F});
      const Operand o0 = m.sbuf_tile(P, {1});  // (P, 1) vector: 10p + 1
      const Operand d = m.sbuf_tile(P, {F});
      Instr in = make(op, {d, data, o0});
      in.alu0 = AluOp::kMultiply;
      in.alu1 = AluOp::kAdd;
      in.flags = kHasImm1;
      in.imm[1] = 0.5f;
      m.run(in);
      CHECK(m.get(d, 3, 2) == val(3, 2) * val(3, 0) + 0.5f);
      CHECK(m.get(d, 0, 7) == val(0, 7) * val(0, 0) + 0.5f);
      return true;
    }
    case Opcode::kLoadStationary: {
      const Operand s = m.sbuf_tile(P, {2});  // K = 4, M = 2
      m.run(make(op, {s}));
      REQUIRE(m.st.stationary.rows() == 4);
      REQUIRE(m.st.stationary.cols() == 2);
      CHECK(m.st.stationary(3, 1) == val(3, 1));
      CHECK(m.st.stationary_dtype == DType::kFloat32);
      return true;
    }
    case Opcode::kMultiplyMoving: {
      const Operand s = m.sbuf_tile(P, {2});  // stationary K = 4, M = 2
      const Operand mv = m.sbuf_tile(P, {F});  // moving K = 4, N = 8
      const Operand d = m.psum_tile(2, {F});   // M x N
      m.run(make(Opcode::kLoadStationary, {s}));
      m.run(make(op, {d, mv}));
      for (uint32_t mm = 0; mm < 2; ++mm)
        for (int64_t n = 0; n < F; ++n) {
          double ref = 0;
          for (uint32_t k = 0; k < P; ++k) ref += static_cast<double>(val(k, mm)) * val(k, n);
          CHECK(m.get(d, mm, n) == Approx(ref));
        }
      return true;
    }
    case Opcode::kActivation: {
      const Operand data = m.sbuf_tile(P, {F});
      const Operand d = m.sbuf_tile(P, {F});
      Instr in = make(op, {d, data});
      in.act = ActFunc::kCopy;
      in.imm[2] = 2.0f;  // scale
      in.imm[3] = 1.0f;  // bias
      m.run(in);
      CHECK(m.get(d, 1, 4) == 2.0f * val(1, 4) + 1.0f);
      return true;
    }
    case Opcode::kActivationReduce: {
      const Operand data = m.sbuf_tile(P, {F});
      const Operand d = m.sbuf_tile(P, {F});
      const Operand rr = m.sbuf_tile(P, {1});
      Instr in = make(op, {d, data, Operand{}, Operand{}, rr});
      in.act = ActFunc::kRelu;
      in.imm[2] = -1.0f;  // relu(-x) = 0 for x > 0 ...
      in.imm[3] = 20.0f;  // ... relu(20 - x)
      m.run(in);
      for (uint32_t p = 0; p < P; ++p) {
        double sum = 0;
        for (int64_t j = 0; j < F; ++j) {
          const float y = std::max(0.0f, 20.0f - val(p, j));
          CHECK(m.get(d, p, j) == y);
          sum += y;
        }
        CHECK(m.get(rr, p, 0) == Approx(sum));
      }
      return true;
    }
    case Opcode::kNcTranspose: {
      const Operand data = m.sbuf_tile(P, {F});
      const Operand d = m.psum_tile(static_cast<uint32_t>(F), {P});
      m.run(make(op, {d, data}));  // default engine: Tensor (PSUM dst)
      for (uint32_t f = 0; f < F; ++f)
        for (uint32_t p = 0; p < P; ++p) CHECK(m.get(d, f, p) == val(p, f));
      return true;
    }
    case Opcode::kTensorReduce: {
      const Operand data = m.sbuf_tile(P, {2, 4});
      const Operand d = m.sbuf_tile(P, {2});
      Instr in = make(op, {d, data});
      in.alu0 = AluOp::kAdd;
      in.axis_count = 1;  // reduce the inner dim of [2, 4]
      m.run(in);
      for (uint32_t p = 0; p < P; ++p) {
        CHECK(m.get(d, p, 0) == val(p, 0) + val(p, 1) + val(p, 2) + val(p, 3));
        CHECK(m.get(d, p, 1) == val(p, 4) + val(p, 5) + val(p, 6) + val(p, 7));
      }
      return true;
    }
    case Opcode::kIota: {
      const Operand d = m.sbuf_tile(P, {F});
      Instr in = make(op, {d});
      in.iimm = {100, 10, 0, 1, 0, 1, 0, 1, 2, static_cast<int32_t>(F)};
      m.run(in);
      for (uint32_t p = 0; p < P; ++p)
        for (int64_t j = 0; j < F; ++j) CHECK(m.get(d, p, j) == static_cast<float>(100 + 10 * p + 2 * j));
      return true;
    }
    case Opcode::kScalarTensorTensor: {
      const Operand data = m.sbuf_tile(P, {F});
      const Operand o0 = m.sbuf_tile(P, {1});
      const Operand o1 = m.sbuf_tile(P, {F});
      const Operand d = m.sbuf_tile(P, {F});
      Instr in = make(op, {d, data, o0, o1});
      in.alu0 = AluOp::kSubtract;
      in.alu1 = AluOp::kMultiply;
      m.run(in);
      CHECK(m.get(d, 2, 6) == (val(2, 6) - val(2, 0)) * val(2, 6));
      return true;
    }
    case Opcode::kReciprocal: {
      const Operand data = m.sbuf_tile(P, {F});
      const Operand d = m.sbuf_tile(P, {F});
      m.run(make(op, {d, data}));
      CHECK(m.get(d, 1, 3) == 1.0f / val(1, 3));
      return true;
    }
    case Opcode::kAffineSelect: {
      const Operand on_true = m.sbuf_tile(P, {F});
      const Operand d = m.sbuf_tile(P, {F});
      Instr in = make(op, {d, on_true});
      in.alu0 = AluOp::kGreaterEqual;  // keep where j - 3 >= 0
      in.iimm = {-3, 0, 0, 1, 0, 1, 0, 1, 1, static_cast<int32_t>(F)};
      in.imm[0] = -1.0f;
      m.run(in);
      for (uint32_t p = 0; p < P; ++p)
        for (int64_t j = 0; j < F; ++j) CHECK(m.get(d, p, j) == (j >= 3 ? val(p, j) : -1.0f));
      return true;
    }
    case Opcode::kNcStreamShuffle: {
      const Operand src = m.sbuf_tile(P, {F});
      const Operand d = m.sbuf_tile(P, {F});
      Instr in = make(op, {d, src});
      in.shuffle.fill(255);
      for (int i = 0; i < 4; ++i) in.shuffle[static_cast<size_t>(i)] = static_cast<uint8_t>(3 - i);
      m.run(in);
      for (uint32_t p = 0; p < P; ++p) CHECK(m.get(d, p, 5) == val(3 - p, 5));
      return true;
    }
    case Opcode::kTensorTensorScan: {
      const Operand d0 = m.sbuf_tile(P, {F});
      const Operand d1 = m.sbuf_tile(P, {F});
      const Operand d = m.sbuf_tile(P, {F});
      Instr in = make(op, {d, d0, d1});
      in.alu0 = AluOp::kAdd;       // t = data0 + s
      in.alu1 = AluOp::kSubtract;  // s = t - data1  => s stays 0 (data0 == data1)
      in.imm[0] = 5.0f;            // initial
      m.set(d0, 0, 0, 7.0f);       // s = 5 + 7 - 1 = 11, then unchanged
      m.run(in);
      CHECK(m.get(d, 0, 0) == 11.0f);
      CHECK(m.get(d, 0, 7) == 11.0f);
      CHECK(m.get(d, 3, 4) == 5.0f);
      return true;
    }
    case Opcode::kTensorScalarReduce: {
      const Operand data = m.sbuf_tile(P, {F});
      const Operand d = m.sbuf_tile(P, {F});
      const Operand rr = m.sbuf_tile(P, {1});
      Instr in = make(op, {d, data, Operand{}, rr});
      in.alu0 = AluOp::kMultiply;
      in.alu1 = AluOp::kAdd;
      in.flags = kHasImm0;
      in.imm[0] = 2.0f;
      in.reduce_cmd = ReduceCmd::kResetReduce;
      m.run(in);
      for (uint32_t p = 0; p < P; ++p) {
        double sum = 0;
        for (int64_t j = 0; j < F; ++j) sum += 2.0 * val(p, j);
        CHECK(m.get(d, p, 1) == 2.0f * val(p, 1));
        CHECK(m.get(rr, p, 0) == Approx(sum));
      }
      return true;
    }
    case Opcode::kBnStats:
    case Opcode::kBnAggr: {
      const Operand data = m.sbuf_tile(P, {F});
      const Operand stats = m.sbuf_tile(P, {6});
      const Operand d = m.sbuf_tile(P, {2});
      m.run(make(Opcode::kBnStats, {stats, data}));
      // even positions j = 0, 2, 4, 6: mean 10p + 4, M2 = 9 + 1 + 1 + 9 = 20; odd: mean 10p + 5.
      CHECK(m.get(stats, 1, 0) == 4.0f);
      CHECK(m.get(stats, 1, 1) == 14.0f);
      CHECK(m.get(stats, 1, 2) == 20.0f);
      CHECK(m.get(stats, 1, 4) == 15.0f);
      if (op == Opcode::kBnAggr) {
        m.run(make(Opcode::kBnAggr, {d, stats}));
        // 1..8 shifted by 10p: mean 10p + 4.5, population variance 5.25.
        CHECK(m.get(d, 2, 0) == Approx(24.5));
        CHECK(m.get(d, 2, 1) == Approx(5.25));
      }
      return true;
    }
    case Opcode::kTensorCopyPredicated: {
      const Operand src = m.sbuf_tile(P, {F});
      const Operand pred = m.sbuf_tile(P, {F});
      const Operand d = m.sbuf_tile(P, {F});
      for (uint32_t p = 0; p < P; ++p)
        for (int64_t j = 0; j < F; ++j) {
          m.set(pred, p, j, static_cast<float>(j % 2));
          m.set(d, p, j, -7.0f);
        }
      m.run(make(op, {d, src, pred}));
      CHECK(m.get(d, 2, 1) == val(2, 1));
      CHECK(m.get(d, 2, 2) == -7.0f);
      return true;
    }
    case Opcode::kRangeSelect: {
      const Operand on_true = m.sbuf_tile(P, {F});
      const Operand b0 = m.sbuf_tile(P, {1});
      const Operand b1 = m.sbuf_tile(P, {1});
      const Operand rr = m.sbuf_tile(P, {1});
      const Operand d = m.sbuf_tile(P, {F});
      for (uint32_t p = 0; p < P; ++p) {
        m.set(b0, p, 0, 2.0f);
        m.set(b1, p, 0, 5.0f);
      }
      Instr in = make(op, {d, on_true, b0, b1, rr});
      in.alu0 = AluOp::kGreaterEqual;  // idx >= 2
      in.alu1 = AluOp::kLess;          // idx < 5
      in.imm[0] = 0.0f;
      in.imm[1] = -9.0f;
      in.reduce_cmd = ReduceCmd::kResetReduce;
      Limits gen2 = gen3();
      gen2.generation = 2;
      CHECK(verify_code(in, gen2) == ErrorCode::kNotOnGeneration);  // spec 2.2: Vector (gen3+)
      m.run(in);
      for (uint32_t p = 0; p < P; ++p) {
        for (int64_t j = 0; j < F; ++j) CHECK(m.get(d, p, j) == (j >= 2 && j < 5 ? val(p, j) : -9.0f));
        CHECK(m.get(rr, p, 0) == val(p, 4));
      }
      return true;
    }
    case Opcode::kMax8: {
      const Operand src = m.sbuf_tile(P, {2, F});
      const Operand d = m.sbuf_tile(P, {8});
      m.set(src, 1, 3, 1000.0f);
      m.set(src, 1, 4, 1000.0f);  // duplicates kept
      m.run(make(op, {d, src}));
      CHECK(m.get(d, 1, 0) == 1000.0f);
      CHECK(m.get(d, 1, 1) == 1000.0f);
      CHECK(m.get(d, 1, 2) == val(1, 15));
      CHECK(m.get(d, 1, 7) == val(1, 10));
      CHECK(m.get(d, 0, 0) == val(0, 15));
      CHECK(m.get(d, 0, 7) == val(0, 8));
      return true;
    }
    case Opcode::kNcFindIndex8: {
      const Operand data = m.sbuf_tile(P, {F});
      const Operand vals = m.sbuf_tile(P, {8});
      const Operand d = m.sbuf_tile(P, {8}, DType::kUInt32);
      m.set(data, 2, 6, 7.5f);
      m.set(data, 2, 1, 7.5f);
      m.set(vals, 2, 0, 7.5f);
      m.set(vals, 2, 1, 7.5f);   // second 7.5 pairs with the next match
      m.set(vals, 2, 2, 7.5f);   // a third: not found
      m.set(vals, 2, 3, val(2, 0));
      m.run(make(op, {d, data, vals}));
      const auto u = [&](uint32_t p, int64_t j) { return load_int(DType::kUInt32, m.view(d).at(p, j)); };
      CHECK(u(2, 0) == 1);
      CHECK(u(2, 1) == 6);
      CHECK(u(2, 2) == 0xFFFFFFFFll);
      CHECK(u(2, 3) == 0);
      CHECK(u(3, 5) == 5);  // vals == data row: identity
      return true;
    }
    case Opcode::kNcMatchReplace8: {
      const Operand data = m.sbuf_tile(P, {F});
      const Operand vals = m.sbuf_tile(P, {8});
      const Operand d = m.sbuf_tile(P, {F});
      const Operand idx = m.sbuf_tile(P, {8}, DType::kUInt32);
      m.set(data, 1, 2, 5.0f);
      m.set(data, 1, 5, 5.0f);
      m.set(vals, 1, 0, 5.0f);
      m.set(vals, 1, 7, 5.0f);
      m.set(vals, 1, 3, -1.0f);  // absent
      Instr in = make(op, {d, data, vals, idx});
      in.imm[0] = -100.0f;
      m.run(in);
      const auto u = [&](uint32_t p, int64_t j) { return load_int(DType::kUInt32, m.view(idx).at(p, j)); };
      CHECK(u(1, 7) == 2);  // i = 7 first takes the first match
      CHECK(u(1, 0) == 5);
      CHECK(u(1, 3) == 0xFFFFFFFFll);
      CHECK(m.get(d, 1, 2) == -100.0f);
      CHECK(m.get(d, 1, 5) == -100.0f);
      CHECK(m.get(d, 1, 0) == val(1, 0));
      return true;
    }
    case Opcode::kTensorPartitionReduce: {
      const Operand data = m.sbuf_tile(P, {F});
      const Operand d = m.sbuf_tile(1, {F});
      Instr in = make(op, {d, data});
      in.alu0 = AluOp::kAdd;
      m.run(in);
      CHECK(m.get(d, 0, 2) == val(0, 2) + val(1, 2) + val(2, 2) + val(3, 2));
      in.alu0 = AluOp::kAverage;
      m.run(in);
      CHECK(m.get(d, 0, 3) == Approx((val(0, 3) + val(1, 3) + val(2, 3) + val(3, 3)) / 4));
      in.alu0 = AluOp::kMaximum;
      m.run(in);
      CHECK(m.get(d, 0, 1) == val(3, 1));
      return true;
    }
    case Opcode::kSelectReduce: {
      const Operand pred = m.sbuf_tile(P, {F}, DType::kUInt8);
      const Operand on_true = m.sbuf_tile(P, {F});
      const Operand rr = m.sbuf_tile(P, {1});
      const Operand d = m.sbuf_tile(P, {F});
      for (uint32_t p = 0; p < P; ++p)
        for (int64_t j = 0; j < F; ++j) m.set(pred, p, j, static_cast<float>(j < 3));
      Instr in = make(op, {d, pred, on_true, Operand{}, rr});
      in.flags = kHasImm0;
      in.imm[0] = -5.0f;
      in.reduce_cmd = ReduceCmd::kResetReduce;
      m.run(in);
      CHECK(m.get(d, 2, 1) == val(2, 1));
      CHECK(m.get(d, 2, 4) == -5.0f);
      CHECK(m.get(rr, 2, 0) == val(2, 2));
      in.flags = kHasImm0 | kReversePred;
      m.run(in);
      CHECK(m.get(d, 2, 1) == -5.0f);
      CHECK(m.get(rr, 2, 0) == val(2, 7));
      return true;
    }
    case Opcode::kTensorScalarCumulative: {
      const Operand src = m.sbuf_tile(P, {F});
      const Operand d = m.sbuf_tile(P, {F});
      Instr in = make(op, {d, src});
      in.alu0 = AluOp::kMultiply;
      in.alu1 = AluOp::kAdd;
      in.flags = kHasImm0;
      in.imm[0] = 2.0f;
      in.reduce_cmd = ReduceCmd::kResetReduce;
      m.run(in);
      CHECK(m.get(d, 1, 0) == 2.0f * val(1, 0));
      CHECK(m.get(d, 1, 2) == 2.0f * (val(1, 0) + val(1, 1) + val(1, 2)));
      in.reduce_cmd = ReduceCmd::kReduce;  // continues from the register
      m.run(in);
      float s = 0;
      for (int64_t j = 0; j < F; ++j) s += 2.0f * val(1, j);
      CHECK(m.get(d, 1, 0) == s + 2.0f * val(1, 0));
      return true;
    }
    case Opcode::kSequenceBounds: {
      const Operand ids = m.sbuf_tile(1, {6}, DType::kInt32);
      const Operand d = m.sbuf_tile(1, {2, 6}, DType::kInt32);
      const float seg[6] = {1, 1, 2, 2, 2, 0};
      for (int64_t j = 0; j < 6; ++j) m.set(ids, 0, j, seg[j]);
      m.run(make(op, {d, ids}));
      const float st[6] = {0, 0, 2, 2, 2, 6}, en[6] = {2, 2, 5, 5, 5, -1};
      for (int64_t j = 0; j < 6; ++j) {
        CHECK(m.get(d, 0, j) == st[j]);
        CHECK(m.get(d, 0, 6 + j) == en[j]);
      }
      return true;
    }
    case Opcode::kNcNGather: {
      const Operand data = m.sbuf_tile(P, {F});
      const Operand ix = m.sbuf_tile(P, {3}, DType::kUInt32);
      const Operand d = m.sbuf_tile(P, {3});
      for (uint32_t p = 0; p < P; ++p) {
        m.set(ix, p, 0, 7.0f);
        m.set(ix, p, 1, static_cast<float>(p));
        m.set(ix, p, 2, 0.0f);
      }
      m.run(make(op, {d, data, ix}));
      CHECK(m.get(d, 2, 0) == val(2, 7));
      CHECK(m.get(d, 2, 1) == val(2, 2));
      CHECK(m.get(d, 3, 2) == val(3, 0));
      return true;
    }
    case Opcode::kLocalGather: {
      const Operand src = m.sbuf_tile(16, {F});
      const Operand ix = m.sbuf_tile(16, {1}, DType::kUInt16);
      const Operand d = m.sbuf_tile(16, {3 * 2});
      for (uint32_t p = 0; p < 16; ++p) m.set(ix, p, 0, static_cast<float>((p * 3) % 7));
      Instr in = make(op, {d, src, ix});
      in.iimm[0] = 2;  // E
      in.iimm[1] = 3;  // V: ids 0, 3, 6
      m.run(in);
      for (uint32_t p = 0; p < 16; ++p) {
        CHECK(m.get(d, p, 0) == val(p, 0));
        CHECK(m.get(d, p, 1) == val(p, 1));
        CHECK(m.get(d, p, 2) == val(p, 3));
        CHECK(m.get(d, p, 5) == val(p, 7));
      }
      return true;
    }
    case Opcode::kTopk: {
      // one group of 16 partitions, n = 100 elements in snake order (e at partition e % 16, column e / 16),
      // distinct values (37 e) mod 101; K = 5 largest, ascending, with their element indices
      const Operand src = m.sbuf_tile(16, {F}, DType::kBFloat16);
      const Operand d = m.sbuf_tile(16, {5}, DType::kBFloat16);
      const Operand di = m.sbuf_tile(16, {5}, DType::kUInt32);
      for (int64_t e = 0; e < 100; ++e) m.set(src, static_cast<uint32_t>(e % 16), e / 16, static_cast<float>(37 * e % 101));
      m.set(d, 1, 0, 77.0f);
      Instr in = make(op, {d, di, src});
      in.iimm[0] = 100;
      m.run(in);
      std::vector<std::pair<float, int64_t>> all;
      for (int64_t e = 0; e < 100; ++e) all.emplace_back(static_cast<float>(37 * e % 101), e);
      std::sort(all.begin(), all.end());
      for (int64_t j = 0; j < 5; ++j) {
        CHECK(m.get(d, 0, j) == all[static_cast<size_t>(95 + j)].first);
        CHECK(m.get(di, 0, j) == static_cast<float>(all[static_cast<size_t>(95 + j)].second));
      }
      CHECK(m.get(d, 1, 0) == 77.0f);  // only partition 0 of the group is written
      return true;
    }
    case Opcode::kNonzeroWithCount: {
      const Operand src = m.sbuf_tile(16, {F});
      const Operand d = m.sbuf_tile(16, {F + 1}, DType::kInt32);
      for (uint32_t p = 0; p < 16; ++p)
        for (int64_t j = 0; j < F; ++j) m.set(src, p, j, j % 3 == 1 ? 0.0f : 1.0f);
      m.set(d, 1, 0, 77.0f);
      Instr in = make(op, {d, src});
      in.iimm[0] = 100;  // index_offset
      in.iimm[1] = -1;   // padding_val
      m.run(in);
      const float want[F + 1] = {100, 102, 103, 105, 106, -1, -1, -1, 5};  // nonzero at j = 0, 2, 3, 5, 6
      for (int64_t j = 0; j <= F; ++j) CHECK(m.get(d, 0, j) == want[j]);
      CHECK(m.get(d, 1, 0) == 77.0f);  // partitions other than 0, 16, ... untouched
      return true;
    }
    case Opcode::kExponential: {
      const Operand src = m.sbuf_tile(P, {F});
      const Operand mx = m.sbuf_tile(P, {1});
      const Operand rr = m.sbuf_tile(P, {1});
      const Operand d = m.sbuf_tile(P, {F});
      Instr in = make(op, {d, src, mx, rr});
      in.reduce_cmd = ReduceCmd::kResetReduce;
      CHECK(verify_code(in) == ErrorCode::kNotOnGeneration);  // gen4 only
      m.run(in, gen4());
      double sum = 0;
      for (int64_t j = 0; j < F; ++j) sum += std::exp(static_cast<double>(val(2, j) - val(2, 0)));
      CHECK(m.get(d, 2, 3) == Approx(std::exp(3.0)));
      CHECK(m.get(rr, 2, 0) == Approx(sum));
      in.reduce_cmd = ReduceCmd::kLoadReduce;  // init from imm[1], max_value from imm[0]
      in.opnd[2] = Operand{};
      in.flags = kHasImm0;
      in.imm = {1.0f, 10.0f, 1.0f, 0.0f};
      m.run(in, gen4());
      double sum2 = 10;
      for (int64_t j = 0; j < F; ++j) sum2 += std::exp(static_cast<double>(val(1, j) - 1.0));
      CHECK(m.get(rr, 1, 0) == Approx(sum2));
      return true;
    }
    case Opcode::kQuantizeMx: {
      // src bf16 [32, 8] = val(p, j); group 0 / column 0 (rows 0..7, elements 0..3) has amax val(7, 3) = 74,
      // floor(log2 74) = 6, so X = 2^(6 - 7) = 0.5 (e4m3fn, Emax 8), scale byte 126; row 0 = 1, 2, 3, 4 -> 2, 4,
      // 6, 8 = e4m3fn 0x40, 0x48, 0x4C, 0x50, packed 0x504C4840. Group 1 / column 0: amax val(15, 3) = 154, X = 1,
      // byte 127 on scale row 1. Then an MX matmul of the result with itself (K = 32 packed rows, M = N = 2).
      const Operand src = m.sbuf_tile(32, {8}, DType::kBFloat16);
      const Operand q = m.sbuf_tile(32, {2}, DType::kFloat8E4M3FNX4);
      const Operand sc = m.sbuf_tile(32, {2}, DType::kUInt8);
      const Instr in = make(op, {q, src, sc});
      CHECK(verify_code(in) == ErrorCode::kNotOnGeneration);  // gen4 only
      m.run(in, gen4());
      uint32_t w = 0;
      std::memcpy(&w, m.view(q).at(0, 0), 4);
      CHECK(w == 0x504C4840u);
      CHECK(*m.view(sc).at(0, 0) == 126);
      CHECK(*m.view(sc).at(1, 0) == 127);
      const Operand d = m.psum_tile(2, {2});
      m.run(make(Opcode::kLoadStationary, {q, sc}), gen4());
      m.run(make(Opcode::kMultiplyMoving, {d, q, sc}), gen4());
      for (uint32_t i = 0; i < 2; ++i)
        for (uint32_t j = 0; j < 2; ++j) {
          double ref = 0;  // decode the packed bytes and scales independently of the semantics
          for (uint32_t k = 0; k < 32; ++k)
            for (int v = 0; v < 4; ++v) {
              const double xs = std::ldexp(1.0, *m.view(sc).at((k / 8 / 4) * 32 + k / 8 % 4, i) - 127);
              const double ys = std::ldexp(1.0, *m.view(sc).at((k / 8 / 4) * 32 + k / 8 % 4, j) - 127);
              ref += f8e4m3fn_bits_to_f32(m.view(q).at(k, i)[v]) * xs * f8e4m3fn_bits_to_f32(m.view(q).at(k, j)[v]) * ys;
            }
          CHECK(m.get(d, i, j) == Approx(ref).epsilon(1e-6));
        }
      // x4 data outside the MX ops: no cast path
      CHECK(verify_code(make(Opcode::kTensorCopy, {m.sbuf_tile(32, {2}), q}), gen4()) == ErrorCode::kMxNoCast);
      return true;
    }
    case Opcode::kActivate2: {
      const Operand data = m.sbuf_tile(P, {F});
      const Operand o1 = m.sbuf_tile(P, {1});
      const Operand rr = m.sbuf_tile(P, {1});
      const Operand d = m.sbuf_tile(P, {F});
      Instr in = make(op, {d, data, Operand{}, o1, rr});
      in.alu0 = AluOp::kMultiply;  // v = data * 0.5 - o1 (reverse1 off)
      in.alu1 = AluOp::kSubtract;
      in.flags = kHasImm0;
      in.imm[0] = 0.5f;
      in.act = ActFunc::kCopy;
      in.iimm[0] = static_cast<int32_t>(AluOp::kMaximum);
      in.reduce_cmd = ReduceCmd::kResetReduce;
      CHECK(verify_code(in) == ErrorCode::kNotOnGeneration);  // gen4 only
      m.run(in, gen4());
      CHECK(m.get(d, 2, 3) == 0.5f * val(2, 3) - val(2, 0));
      CHECK(m.get(rr, 2, 0) == 0.5f * val(2, 7) - val(2, 0));
      in.flags = kHasImm0 | kReverse1;  // v = o1 - data * 0.5
      in.iimm[0] = static_cast<int32_t>(AluOp::kAdd);
      m.run(in, gen4());
      CHECK(m.get(d, 1, 2) == val(1, 0) - 0.5f * val(1, 2));
      in.alu1 = AluOp::kMultiply;  // (multiply, multiply) is not a supported pair
      CHECK(verify_code(in, gen4()) == ErrorCode::kBadImmediate);
      return true;
    }
    case Opcode::kSendrecv: {  // LNC=2: the data moves between cores (frontend/multicore.cpp), not here
      const Operand src = m.sbuf_tile(P, {F});
      const Operand dst = m.sbuf_tile(P, {F});
      m.set(dst, 1, 1, -7.0f);
      m.run(make(op, {dst, src}));
      CHECK(m.get(dst, 1, 1) == -7.0f);
      CHECK(verify_code(make(op, {m.sbuf_tile(P, {4}), src})) == ErrorCode::kShapeMismatch);
      return true;
    }
    case Opcode::kCoreBarrier: {  // LNC=2 rendezvous: no data changes
      const Operand data = m.hbm_tile(P, F);
      m.run(make(op, {data}));
      CHECK(m.get(data, 3, 7) == val(3, 7));
      return true;
    }
    case Opcode::kRegisterLoad: {  // a sequencer register read: no memory changes; one element only
      const Operand one = m.sbuf_tile(1, {1});
      m.set(one, 0, 0, 7.0f);
      m.run(make(op, {one}));
      CHECK(m.get(one, 0, 0) == 7.0f);
      CHECK(verify_code(make(op, {m.sbuf_tile(P, {1})})) == ErrorCode::kShapeMismatch);
      CHECK(verify_code(make(op, {m.hbm_tile(1, 2)})) == ErrorCode::kShapeMismatch);
      return true;
    }
    case Opcode::kRand2: {
      const Operand d = m.sbuf_tile(P, {64});
      Instr in = make(op, {d});
      in.imm[0] = -2.0f;
      in.imm[1] = 3.0f;
      CHECK(verify_code(in) == ErrorCode::kNotOnGeneration);  // gen4 only
      m.run(in, gen4());
      double mean = 0;
      for (uint32_t p = 0; p < P; ++p)
        for (int64_t j = 0; j < 64; ++j) {
          const float y = m.get(d, p, j);
          CHECK((y >= -2.0f && y < 3.0f));
          mean += y / (64.0 * P);
        }
      CHECK(mean == Approx(0.5).margin(0.3));
      return true;
    }
    case Opcode::kDropout: {
      const Operand data = m.sbuf_tile(P, {64});
      const Operand d = m.sbuf_tile(P, {64});
      Instr in = make(op, {d, data});
      in.flags = kHasImm0;
      in.imm[0] = 0.0f;  // keep everything
      m.run(in);
      CHECK(m.get(d, 3, 40) == val(3, 40));
      in.imm[0] = 1.0f;  // drop everything
      m.run(in);
      CHECK(m.get(d, 3, 40) == 0.0f);
      in.imm[0] = 0.5f;
      m.run(in);
      int zeros = 0;
      for (uint32_t p = 0; p < P; ++p)
        for (int64_t j = 0; j < 64; ++j) {
          const float y = m.get(d, p, j);
          CHECK((y == 0.0f || y == val(p, j)));
          zeros += y == 0.0f;
        }
      CHECK(zeros > 64);   // ~128 of 256
      CHECK(zeros < 192);
      return true;
    }
    case Opcode::kRng:
    case Opcode::kSetRngSeed:
    case Opcode::kRandSetState:
    case Opcode::kRandGetState: {
      const Operand seed = m.sbuf_tile(1, {2}, DType::kUInt32);
      const Operand a = m.sbuf_tile(P, {F}, DType::kUInt32);
      const Operand b = m.sbuf_tile(P, {F}, DType::kUInt32);
      const Operand state = m.sbuf_tile(P, {2}, DType::kUInt32);
      const auto u = [&](const Operand& o, uint32_t p, int64_t j) { return load_int(DType::kUInt32, m.view(o).at(p, j)); };
      Instr seed_in = make(Opcode::kSetRngSeed, {seed});
      Instr get = make(Opcode::kRandGetState, {state});
      Instr set = make(Opcode::kRandSetState, {state});
      get.engine = set.engine = Engine::kVector;
      m.run(seed_in);
      m.run(get);  // save the Vector state
      m.run(make(Opcode::kRng, {a}));
      m.run(set);  // restore it: the same numbers again
      m.run(make(Opcode::kRng, {b}));
      bool differ = false;
      for (uint32_t p = 0; p < P; ++p)
        for (int64_t j = 0; j < F; ++j) {
          CHECK(u(a, p, j) == u(b, p, j));
          differ = differ || u(a, p, j) != u(a, 0, 0);
        }
      CHECK(differ);
      m.run(seed_in);  // reseeding with the same seeds restarts the stream
      m.run(make(Opcode::kRng, {b}));
      CHECK(u(b, 2, 3) == u(a, 2, 3));
      return true;
    }
  }
  return false;
}

}  // namespace

// ------------------------------------------------------------------------------------------------
// table invariants

TEST_CASE("ISA table: rows are in enum order, mnemonics unique and non-empty", "[isa][table]") {
  const auto table = op_table();
  REQUIRE(static_cast<int>(table.size()) == kNumOpcodes);
  std::set<std::string> names;
  for (int i = 0; i < kNumOpcodes; ++i) {
    const OpInfo& info = table[static_cast<size_t>(i)];
    INFO("opcode #" << i);
    CHECK(static_cast<int>(info.op) == i);
    CHECK(&op_info(static_cast<Opcode>(i)) == &info);
    REQUIRE(info.mnemonic != nullptr);
    CHECK(std::string(info.mnemonic).size() > 0);
    CHECK(names.insert(info.mnemonic).second);
  }
  CHECK(static_cast<int>(names.size()) == kNumOpcodes);
}

TEST_CASE("ISA table: engines", "[isa][table]") {
  for (const OpInfo& info : op_table()) {
    INFO(info.mnemonic);
    CHECK(info.engines != 0);
    CHECK((info.engines & ~(T | V | S | G | Y)) == 0);
    CHECK(static_cast<int>(info.default_engine) < kNumEngines);
    CHECK((info.engines & engine_bit(info.default_engine)) != 0);
  }
  for (int e = 0; e < kNumEngines; ++e) {
    const auto eng = static_cast<Engine>(e);
    CHECK(engine_from_name(engine_name(eng)) == eng);
  }
  CHECK(engine_bit(Engine::kTensor) == T);
  CHECK(engine_bit(Engine::kSync) == Y);
  CHECK_FALSE(engine_from_name("pe").has_value());
}

TEST_CASE("ISA table: slots", "[isa][table]") {
  for (const OpInfo& info : op_table()) {
    INFO(info.mnemonic);
    REQUIRE(info.num_slots >= 1);
    REQUIRE(info.num_slots <= kMaxSlots);
    const std::string slot0 = info.slots[0].name;
    if (info.op == Opcode::kLoadStationary)
      CHECK(slot0 == "stationary");
    else if (info.op == Opcode::kSetRngSeed || info.op == Opcode::kRandSetState)
      CHECK(slot0 == "src_seeds");  // state-setting ops read their only operand
    else if (info.op == Opcode::kRegisterLoad)
      CHECK(slot0 == "src");  // a sequencer register is its destination
    else
      CHECK(slot0 == "dst");
    CHECK(info.slots[0].written == (slot0 == "dst"));
    CHECK(info.slots[0].required);  // the written (or loaded) operand is never optional
    std::set<std::string> seen;
    for (int i = 0; i < info.num_slots; ++i) {
      const SlotInfo& s = info.slots[static_cast<size_t>(i)];
      INFO("slot " << i);
      REQUIRE(s.name != nullptr);
      CHECK(std::string(s.name).size() > 0);
      CHECK(seen.insert(s.name).second);
      CHECK(s.buffers != 0);
      CHECK((s.buffers & ~(HBM | SBUF | PSUM)) == 0);
    }
    for (int i = info.num_slots; i < kMaxSlots; ++i) CHECK(info.slots[static_cast<size_t>(i)].name == nullptr);
  }
  CHECK(space_bit(Space::kHbm) == HBM);
  CHECK(space_bit(Space::kSbuf) == SBUF);
  CHECK(space_bit(Space::kPsum) == PSUM);
  CHECK(space_bit(Space::kNone) == 0);
}

TEST_CASE("ISA table: only the DMA opcodes touch HBM", "[isa][table]") {
  // LNC=2 (docs/lnc.md): sendrecv is a DMA between the two cores' SBUFs; core_barrier names the HBM tensor
  // both cores wrote but moves no data. register_load: a sequencer reads a register's value from SBUF or HBM.
  for (const OpInfo& info : op_table()) {
    INFO(info.mnemonic);
    bool any_hbm = false;
    for (int i = 0; i < info.num_slots; ++i) any_hbm = any_hbm || (info.slots[static_cast<size_t>(i)].buffers & HBM);
    if (info.op == Opcode::kSendrecv) CHECK((is_dma(info.op) && !any_hbm));
    else if (info.op == Opcode::kCoreBarrier || info.op == Opcode::kRegisterLoad) CHECK((!is_dma(info.op) && any_hbm));
    else CHECK(any_hbm == is_dma(info.op));
  }
}

TEST_CASE("ISA table: name lookups round-trip", "[isa][table]") {
  for (const OpInfo& info : op_table()) {
    INFO(info.mnemonic);
    CHECK(opcode_from_name(info.mnemonic) == info.op);
  }
  CHECK_FALSE(opcode_from_name("").has_value());
  CHECK_FALSE(opcode_from_name("no_such_op").has_value());
  CHECK_FALSE(opcode_from_name("DMA_COPY").has_value());
  CHECK(opcode_from_name("tensor_tensor") == Opcode::kTensorTensor);

  REQUIRE(kNumAlu > 0);
  std::set<std::string> alus;
  for (int i = 0; i < kNumAlu; ++i) {
    const auto op = static_cast<AluOp>(i);
    const std::string nm(alu_name(op));
    INFO(nm);
    CHECK(!nm.empty());
    CHECK(alus.insert(nm).second);
    CHECK(alu_from_name(nm) == op);
  }
  CHECK(alu_from_name("add") == AluOp::kAdd);
  CHECK(alu_from_name("bypass") == AluOp::kBypass);
  CHECK_FALSE(alu_from_name("plus").has_value());
  CHECK(alu_class(AluOp::kBitwiseAnd) == AluClass::kBitVec);
  CHECK(alu_reduce_legal(AluOp::kMaximum));
  CHECK_FALSE(alu_reduce_legal(AluOp::kDivide));

  REQUIRE(kNumAct > 0);
  std::set<std::string> acts;
  for (int i = 0; i < kNumAct; ++i) {
    const auto f = static_cast<ActFunc>(i);
    const std::string nm(act_name(f));
    INFO(nm);
    CHECK(!nm.empty());
    CHECK(acts.insert(nm).second);
    CHECK(act_from_name(nm) == f);
  }
  CHECK(act_from_name("exp") == ActFunc::kExp);
  CHECK_FALSE(act_from_name("softmax").has_value());
}

TEST_CASE("ISA table: is_dma only for dma_copy, dma_transpose and sendrecv", "[isa][table]") {
  for (const OpInfo& info : op_table()) {
    INFO(info.mnemonic);
    const bool expect = info.op == Opcode::kDmaCopy || info.op == Opcode::kDmaTranspose || info.op == Opcode::kSendrecv;
    CHECK(is_dma(info.op) == expect);
  }
}

// ------------------------------------------------------------------------------------------------
// semantics dispatch

TEST_CASE("execute: an out-of-range opcode throws kUnknownOpcode", "[isa][dispatch]") {
  Instr in;
  in.op = static_cast<Opcode>(kNumOpcodes);
  Views vs{};
  ArchState st;
  try {
    execute(in, vs, st);
    FAIL("expected nsim::Error");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kUnknownOpcode);
  }
  in.op = static_cast<Opcode>(255);
  try {
    execute(in, vs, st);
    FAIL("expected nsim::Error");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kUnknownOpcode);
  }
  CHECK(verify_code(in) == ErrorCode::kUnknownOpcode);
}

TEST_CASE("execute: every opcode dispatches to its semantics", "[isa][dispatch]") {
  // With no operands, each opcode's semantics complain about a missing operand -- not about an
  // unknown opcode -- and name the opcode.
  for (const OpInfo& info : op_table()) {
    INFO(info.mnemonic);
    Instr in;
    in.op = info.op;
    in.engine = info.default_engine;
    Views vs{};
    ArchState st;
    try {
      execute(in, vs, st);
      FAIL("expected nsim::Error");
    } catch (const Error& e) {
      CHECK(e.code() != ErrorCode::kUnknownOpcode);
      CHECK(e.code() == ErrorCode::kMissingOperand);
      CHECK(contains(e.message(), info.mnemonic));
    }
  }
}

TEST_CASE("execute: verified smoke run of every opcode", "[isa][dispatch]") {
  for (const OpInfo& info : op_table()) {
    INFO(info.mnemonic);
    CHECK(smoke(info.op));
  }
}

// ------------------------------------------------------------------------------------------------
// disassembly

TEST_CASE("disassemble names the opcode, engine and operands", "[isa][disasm]") {
  for (const OpInfo& info : op_table()) {
    Instr in;
    in.op = info.op;
    in.engine = info.default_engine;
    const std::string s = disassemble(in);
    INFO(s);
    const std::string head = std::string(info.mnemonic) + "." + std::string(engine_name(info.default_engine));
    CHECK(s.rfind(head, 0) == 0);
  }
  const Instr tt = valid_tensor_tensor();
  const std::string s = disassemble(tt);
  INFO(s);
  CHECK(s.rfind("tensor_tensor.vector", 0) == 0);
  CHECK(contains(s, "op0=add"));
  CHECK(contains(s, "dst=float32@sbuf[0:128]+0"));
  CHECK(contains(s, "data1=float32@sbuf[0:128]+2048"));
  CHECK(contains(s, "data2=bfloat16@sbuf[0:128]+4096"));

  Instr dma = make(Opcode::kDmaCopy, {sb(4, {8}), Operand::tile(Space::kHbm, DType::kFloat32, 0, 0, 4, {8})});
  dma.engine = Engine::kScalar;
  dma.dma_queue = 3;
  const std::string d = disassemble(dma);
  CHECK(d.rfind("dma_copy.scalar", 0) == 0);
  CHECK(contains(d, "queue=3"));
  CHECK(contains(d, "src=float32@hbm"));

  Instr act = make(Opcode::kActivation, {sb(4, {8}), sb(4, {8})});
  act.act = ActFunc::kGelu;
  CHECK(contains(disassemble(act), "func=gelu"));
}

// ------------------------------------------------------------------------------------------------
// verification

TEST_CASE("verify accepts a valid tensor_tensor", "[isa][verify]") {
  const Instr in = valid_tensor_tensor();
  CHECK_NOTHROW(verify(in, gen3()));
  Instr g = in;
  g.engine = Engine::kGpsimd;
  CHECK_NOTHROW(verify(g, gen3()));
  Instr one_psum = in;
  one_psum.opnd[1] = ps(128, {512});
  CHECK_NOTHROW(verify(one_psum, gen3()));
}

TEST_CASE("verify rejects an engine outside the mask", "[isa][verify]") {
  Instr in = valid_tensor_tensor();
  in.engine = Engine::kTensor;
  auto e = verify_error(in);
  REQUIRE(e);
  CHECK(e->code() == ErrorCode::kBadEngine);
  CHECK(contains(e->message(), "tensor_tensor"));
  CHECK(contains(e->message(), "vector"));  // lists the allowed engines
  in.engine = static_cast<Engine>(7);
  CHECK(verify_code(in) == ErrorCode::kBadEngine);

  Instr mm = make(Opcode::kLoadStationary, {sb(128, {128}, DType::kBFloat16)});
  mm.engine = Engine::kVector;
  CHECK(verify_code(mm) == ErrorCode::kBadEngine);
  mm.engine = Engine::kTensor;
  CHECK_FALSE(verify_code(mm).has_value());
}

TEST_CASE("verify rejects an operand in the wrong buffer", "[isa][verify]") {
  Instr in = make(Opcode::kMultiplyMoving, {sb(128, {512}), sb(128, {512}, DType::kBFloat16)});
  auto e = verify_error(in);
  REQUIRE(e);
  CHECK(e->code() == ErrorCode::kBadBuffer);
  CHECK(contains(e->message(), "multiply_moving"));
  CHECK(contains(e->message(), "'dst'"));
  CHECK(contains(e->message(), "psum"));

  // Fixed: dst in PSUM.
  in.opnd[0] = ps(128, {512});
  CHECK_FALSE(verify_code(in).has_value());

  // HBM is only for DMA.
  Instr tc = make(Opcode::kTensorCopy, {sb(4, {8}), Operand::tile(Space::kHbm, DType::kFloat32, 0, 0, 4, {8})});
  auto e2 = verify_error(tc);
  REQUIRE(e2);
  CHECK(e2->code() == ErrorCode::kBadBuffer);
  CHECK(contains(e2->message(), "'src'"));

  // Both tensor_tensor inputs in PSUM.
  Instr tt = valid_tensor_tensor();
  tt.opnd[1] = ps(128, {512});
  tt.opnd[2] = ps(128, {512}, DType::kFloat32, 2048);
  CHECK(verify_code(tt) == ErrorCode::kBadBuffer);
}

TEST_CASE("verify rejects a dtype outside the slot's class", "[isa][verify]") {
  Instr in = make(Opcode::kMultiplyMoving, {ps(128, {512}), sb(128, {512}, DType::kInt32)});
  auto e = verify_error(in);
  REQUIRE(e);
  CHECK(e->code() == ErrorCode::kBadDtype);
  CHECK(contains(e->message(), "multiply_moving"));
  CHECK(contains(e->message(), "'moving'"));
  CHECK(contains(e->message(), "int32"));

  Instr bn = make(Opcode::kBnAggr, {sb(4, {2}, DType::kInt16), sb(4, {6})});
  CHECK(verify_code(bn) == ErrorCode::kBadDtype);
  // bf16 PSUM output needs gen4 (dst_bf16): before, E313 NotOnGeneration (as float8_e4m3fn); fp32 is fine, int32 never.
  Instr mm = make(Opcode::kMultiplyMoving, {ps(128, {512}, DType::kBFloat16), sb(128, {512}, DType::kBFloat16)});
  CHECK(verify_code(mm) == ErrorCode::kNotOnGeneration);
  Instr mi = make(Opcode::kMultiplyMoving, {ps(128, {512}, DType::kInt32), sb(128, {512}, DType::kBFloat16)});
  CHECK(verify_code(mi) == ErrorCode::kBadDtype);
  Limits l4 = gen3();
  l4.generation = 4;
  l4.dst_bf16 = true;
  CHECK_FALSE(verify_code(mm, l4).has_value());
}

TEST_CASE("verify rejects a missing required operand", "[isa][verify]") {
  Instr in = valid_tensor_tensor();
  in.opnd[2] = Operand{};
  auto e = verify_error(in);
  REQUIRE(e);
  CHECK(e->code() == ErrorCode::kMissingOperand);
  CHECK(contains(e->message(), "tensor_tensor"));
  CHECK(contains(e->message(), "'data2'"));

  Instr mem = make(Opcode::kMemset, {});
  CHECK(verify_code(mem) == ErrorCode::kMissingOperand);
  // Optional slots may be absent.
  Instr ts = make(Opcode::kTensorScalar, {sb(128, {64}), sb(128, {64}, DType::kFloat32, 256)});
  ts.flags = kHasImm0;
  CHECK_FALSE(verify_code(ts).has_value());
}

TEST_CASE("verify rejects more than 128 partitions", "[isa][verify]") {
  Instr in = valid_tensor_tensor();
  in.opnd[0].num_partitions = 129;
  auto e = verify_error(in);
  REQUIRE(e);
  CHECK(e->code() == ErrorCode::kTooManyPartitions);
  CHECK(contains(e->message(), "'dst'"));
  CHECK(contains(e->message(), "129"));
}

TEST_CASE("verify rejects mismatched partitions and element counts", "[isa][verify]") {
  Instr in = valid_tensor_tensor();
  in.opnd[1].num_partitions = 64;
  auto e = verify_error(in);
  REQUIRE(e);
  CHECK(e->code() == ErrorCode::kPartitionMismatch);
  CHECK(contains(e->message(), "tensor_tensor"));
  CHECK(contains(e->message(), "'data1'"));

  Instr in2 = valid_tensor_tensor();
  in2.opnd[2] = sb(128, {256}, DType::kBFloat16, 4096);
  auto e2 = verify_error(in2);
  REQUIRE(e2);
  CHECK(e2->code() == ErrorCode::kElementCountMismatch);
  CHECK(contains(e2->message(), "'data2'"));
  CHECK(contains(e2->message(), "256"));
  CHECK(contains(e2->message(), "512"));

  // Same count, different shape: allowed (element-wise ops pair flat indices).
  Instr in3 = valid_tensor_tensor();
  in3.opnd[2] = sb(128, {4, 128}, DType::kBFloat16, 4096);
  CHECK_FALSE(verify_code(in3).has_value());

  // dma_copy compares total elements.
  Instr dma = make(Opcode::kDmaCopy, {sb(4, {8}), Operand::tile(Space::kHbm, DType::kFloat32, 0, 0, 4, {9})});
  CHECK(verify_code(dma) == ErrorCode::kElementCountMismatch);
  dma.opnd[1] = Operand::tile(Space::kHbm, DType::kFloat32, 0, 0, 2, {16});
  CHECK_FALSE(verify_code(dma).has_value());
}

TEST_CASE("verify: PSUM bank crossing on gen3", "[isa][verify]") {
  // 512 fp32 = 2048 bytes from byte 1024: [1024, 3072) crosses the 2 KiB bank boundary.
  Instr in = make(Opcode::kMultiplyMoving,
                  {ps(128, {512}, DType::kFloat32, 1024), sb(128, {512}, DType::kBFloat16)});
  auto e = verify_error(in);
  REQUIRE(e);
  CHECK(e->code() == ErrorCode::kPsumBankOverflow);
  CHECK(contains(e->message(), "multiply_moving"));
  // Bank-aligned: fine.
  in.opnd[0].offset = 2048;
  CHECK_FALSE(verify_code(in).has_value());
  // Fits in the second half of a bank.
  Instr small = make(Opcode::kMultiplyMoving,
                     {ps(128, {256}, DType::kFloat32, 1024), sb(128, {256}, DType::kBFloat16)});
  CHECK_FALSE(verify_code(small).has_value());
  // Gen4 has no such rule.
  Limits l4 = gen3();
  l4.generation = 4;
  in.opnd[0].offset = 1024;
  CHECK_FALSE(verify_code(in, l4).has_value());
}

TEST_CASE("verify: matmul moving free size above 512", "[isa][verify]") {
  Instr in = make(Opcode::kMultiplyMoving, {ps(128, {513}), sb(128, {513}, DType::kBFloat16)});
  auto e = verify_error(in);
  REQUIRE(e);
  CHECK(e->code() == ErrorCode::kMatmulLimit);
  CHECK(contains(e->message(), "multiply_moving"));
  CHECK(contains(e->message(), "513"));

  Instr ls = make(Opcode::kLoadStationary, {sb(128, {129}, DType::kBFloat16)});
  CHECK(verify_code(ls) == ErrorCode::kMatmulLimit);
}

TEST_CASE("verify: GpSimd cannot access PSUM", "[isa][verify]") {
  Instr in = valid_tensor_tensor();
  in.engine = Engine::kGpsimd;
  in.opnd[1] = ps(128, {512});
  auto e = verify_error(in);
  REQUIRE(e);
  CHECK(e->code() == ErrorCode::kBadBuffer);
  CHECK(contains(e->message(), "tensor_tensor"));
  CHECK(contains(e->message(), "'data1'"));
  // The same instruction on VectorE is fine.
  in.engine = Engine::kVector;
  CHECK_FALSE(verify_code(in).has_value());
}

TEST_CASE("verify: out-of-bounds access patterns", "[isa][verify]") {
  Instr in = valid_tensor_tensor();
  in.opnd[0].offset = 229376 - 2044;  // 512 fp32 = 2048 bytes: 4 bytes past the end
  auto e = verify_error(in);
  REQUIRE(e);
  CHECK(e->code() == ErrorCode::kOutOfBounds);
  CHECK(contains(e->message(), "'dst'"));
  in.opnd[0].offset = 229376 - 2048;
  CHECK_FALSE(verify_code(in).has_value());

  Instr neg = valid_tensor_tensor();
  neg.opnd[1].offset = -4;
  CHECK(verify_code(neg) == ErrorCode::kOutOfBounds);

  Instr parts = valid_tensor_tensor();
  for (int i = 0; i < 3; ++i) {
    parts.opnd[static_cast<size_t>(i)].start_partition = 64;
    parts.opnd[static_cast<size_t>(i)].num_partitions = 65;
  }
  CHECK(verify_code(parts) == ErrorCode::kOutOfBounds);

  Instr psum = make(Opcode::kMultiplyMoving, {ps(128, {512}, DType::kFloat32, 16384 - 1024), sb(128, {512}, DType::kBFloat16)});
  CHECK(verify_code(psum) == ErrorCode::kOutOfBounds);

  Instr dma = make(Opcode::kDmaCopy, {sb(4, {8}), Operand::tile(Space::kHbm, DType::kFloat32, (int64_t{1} << 30) - 64, 0, 4, {8})});
  CHECK(verify_code(dma) == ErrorCode::kOutOfBounds);
}

TEST_CASE("verify attaches the source location", "[isa][verify]") {
  Instr in = valid_tensor_tensor();
  in.engine = Engine::kScalar;
  SourceLoc loc{"kernel.py", 42, "my_kernel"};
  try {
    verify(in, gen3(), loc);
    FAIL("expected nsim::Error");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kBadEngine);
    CHECK(e.loc().line == 42);
    CHECK(contains(e.what(), "kernel.py:42"));
    CHECK(contains(e.what(), "NSIM-E306"));
  }
}

TEST_CASE("verify: operand rules of the Tier-3 ops", "[isa][verify][tier3]") {
  // max8: dst exactly 8 per partition, src 8..16384
  CHECK(verify_code(make(Opcode::kMax8, {sb(128, {8}), sb(128, {64}, DType::kFloat32, 64)})) == std::nullopt);
  CHECK(verify_code(make(Opcode::kMax8, {sb(128, {7}), sb(128, {64}, DType::kFloat32, 64)})) ==
        ErrorCode::kElementCountMismatch);
  CHECK(verify_code(make(Opcode::kMax8, {sb(128, {8}), sb(128, {7}, DType::kFloat32, 64)})) ==
        ErrorCode::kElementCountMismatch);
  CHECK(verify_code(make(Opcode::kMax8, {sb(128, {8}), sb(128, {16385}, DType::kBFloat16, 64)})) ==
        ErrorCode::kElementCountMismatch);
  // nc_find_index8: integer dst, vals of 8
  CHECK(verify_code(make(Opcode::kNcFindIndex8, {sb(64, {8}), sb(64, {32}, DType::kFloat32, 64),
                                                 sb(64, {8}, DType::kFloat32, 256)})) == ErrorCode::kBadDtype);
  CHECK(verify_code(make(Opcode::kNcFindIndex8, {sb(64, {8}, DType::kUInt32), sb(64, {32}, DType::kFloat32, 64),
                                                 sb(64, {4}, DType::kFloat32, 256)})) ==
        ErrorCode::kElementCountMismatch);
  // tensor_partition_reduce: one dst partition, a legal op
  Instr tpr = make(Opcode::kTensorPartitionReduce, {sb(1, {16}), sb(64, {16}, DType::kFloat32, 64)});
  tpr.alu0 = AluOp::kAdd;
  CHECK(verify_code(tpr) == std::nullopt);
  tpr.alu0 = AluOp::kDivide;
  CHECK(verify_code(tpr) == ErrorCode::kBadImmediate);
  tpr.alu0 = AluOp::kBitwiseOr;  // float operands
  CHECK(verify_code(tpr) == ErrorCode::kBadDtype);
  tpr.alu0 = AluOp::kAdd;
  tpr.opnd[0] = sb(2, {16});
  CHECK(verify_code(tpr) == ErrorCode::kPartitionMismatch);
  // select_reduce: on_false needed unless has_imm0; integer predicate
  Instr sr = make(Opcode::kSelectReduce, {sb(32, {16}), sb(32, {16}, DType::kUInt8, 64), sb(32, {16}, DType::kFloat32, 128)});
  CHECK(verify_code(sr) == ErrorCode::kMissingOperand);
  sr.flags = kHasImm0;
  CHECK(verify_code(sr) == std::nullopt);
  sr.opnd[1] = sb(32, {16}, DType::kFloat32, 64);
  CHECK(verify_code(sr) == ErrorCode::kBadDtype);
  // tensor_scalar_cumulative: no int32, op1 a reduce op
  Instr cu = make(Opcode::kTensorScalarCumulative, {sb(32, {16}), sb(32, {16}, DType::kFloat32, 64)});
  cu.alu0 = AluOp::kAdd;
  cu.alu1 = AluOp::kAdd;
  cu.flags = kHasImm0;
  CHECK(verify_code(cu) == std::nullopt);
  cu.alu1 = AluOp::kDivide;
  CHECK(verify_code(cu) == ErrorCode::kBadImmediate);
  cu.alu1 = AluOp::kAdd;
  cu.opnd[1] = sb(32, {16}, DType::kInt32, 64);
  CHECK(verify_code(cu) == ErrorCode::kBadDtype);
  // sequence_bounds: (1, n) -> (1, 2n)
  CHECK(verify_code(make(Opcode::kSequenceBounds, {sb(1, {2, 10}), sb(1, {10}, DType::kFloat32, 128)})) ==
        std::nullopt);
  CHECK(verify_code(make(Opcode::kSequenceBounds, {sb(1, {2, 9}), sb(1, {10}, DType::kFloat32, 128)})) ==
        ErrorCode::kElementCountMismatch);
  CHECK(verify_code(make(Opcode::kSequenceBounds, {sb(2, {2, 10}), sb(2, {10}, DType::kFloat32, 128)})) ==
        ErrorCode::kShapeMismatch);
  // nc_n_gather: dst dtype == data dtype, dst elements == indices elements
  CHECK(verify_code(make(Opcode::kNcNGather, {sb(8, {4}, DType::kBFloat16), sb(8, {16}, DType::kFloat32, 64),
                                              sb(8, {4}, DType::kUInt32, 256)})) == ErrorCode::kBadDtype);
  CHECK(verify_code(make(Opcode::kNcNGather, {sb(8, {5}), sb(8, {16}, DType::kFloat32, 64),
                                              sb(8, {4}, DType::kUInt32, 256)})) == ErrorCode::kElementCountMismatch);
  // local_gather: E in {1, 2, 4, ..., 32}, P multiple of 16, dst = V x E
  Instr lg = make(Opcode::kLocalGather, {sb(32, {64}), sb(32, {64}, DType::kFloat32, 512), sb(32, {2}, DType::kUInt16, 1024)});
  lg.iimm[0] = 2;
  CHECK(verify_code(lg) == std::nullopt);  // 32 ids x 2
  lg.iimm[0] = 3;
  CHECK(verify_code(lg) == ErrorCode::kBadImmediate);
  lg.iimm[0] = 2;
  lg.iimm[1] = 33;
  CHECK(verify_code(lg) == ErrorCode::kBadImmediate);
  lg.iimm[1] = 0;
  lg.opnd = {sb(8, {64}), sb(8, {64}, DType::kFloat32, 512), sb(8, {2}, DType::kUInt16, 1024)};
  CHECK(verify_code(lg) == ErrorCode::kShapeMismatch);
  // nonzero_with_count: int32 dst with T + 1 elements; GpSimd only
  CHECK(verify_code(make(Opcode::kNonzeroWithCount, {sb(128, {33}, DType::kInt32), sb(128, {32}, DType::kFloat32, 256)})) ==
        std::nullopt);
  CHECK(verify_code(make(Opcode::kNonzeroWithCount, {sb(128, {32}, DType::kInt32), sb(128, {32}, DType::kFloat32, 256)})) ==
        ErrorCode::kElementCountMismatch);
  CHECK(verify_code(make(Opcode::kNonzeroWithCount, {sb(128, {33}, DType::kFloat32), sb(128, {32}, DType::kFloat32, 256)})) ==
        ErrorCode::kBadDtype);
  // dropout: prob as an immediate or a (P, 1) operand
  CHECK(verify_code(make(Opcode::kDropout, {sb(16, {8}), sb(16, {8}, DType::kFloat32, 64)})) ==
        ErrorCode::kMissingOperand);
  CHECK(verify_code(make(Opcode::kDropout, {sb(16, {8}), sb(16, {8}, DType::kFloat32, 64), sb(16, {2}, DType::kFloat32, 128)})) ==
        ErrorCode::kShapeMismatch);
}

TEST_CASE("execute: nc_n_gather and local_gather reject out-of-range indices", "[isa][tier3]") {
  Machine m;
  const Operand data = m.sbuf_tile(16, {8});
  const Operand ix = m.sbuf_tile(16, {2}, DType::kUInt32);
  const Operand d = m.sbuf_tile(16, {2});
  for (uint32_t p = 0; p < 16; ++p) {
    m.set(ix, p, 0, 1.0f);
    m.set(ix, p, 1, 8.0f);  // one past the end
  }
  const Instr in = make(Opcode::kNcNGather, {d, data, ix});
  REQUIRE_NOTHROW(verify(in, gen3()));
  try {
    execute(in, m.views(in), m.st);
    FAIL("expected nsim::Error");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kOutOfBounds);
  }
  const Operand idx16 = m.sbuf_tile(16, {1}, DType::kUInt16);
  const Operand d2 = m.sbuf_tile(16, {16 * 4});
  for (uint32_t p = 0; p < 16; ++p) m.set(idx16, p, 0, p == 5 ? 6.0f : 0.0f);  // 6 + 4 > 8
  Instr lg = make(Opcode::kLocalGather, {d2, data, idx16});
  lg.iimm[0] = 4;
  REQUIRE_NOTHROW(verify(lg, gen3()));
  try {
    execute(lg, m.views(lg), m.st);
    FAIL("expected nsim::Error");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kOutOfBounds);
  }
}

TEST_CASE("ISA table: MACRO rows, slot roles, flags and ALU arity", "[isa][table]") {
  // nc_matmul is a MACRO row: slots, engines and default engine from isa/opcodes.def, no Opcode.
  const OpInfo& mm = macro_info(Macro::kNcMatmul);
  CHECK(std::string(mm.mnemonic) == "nc_matmul");
  REQUIRE(mm.num_slots == 5);  // dst, stationary, moving and the optional MX scales
  CHECK(std::string(mm.slots[1].name) == "stationary");
  CHECK(std::string(mm.slots[3].name) == "stationary_scale");
  CHECK_FALSE(mm.slots[3].required);
  const OpInfo& mx = macro_info(Macro::kNcMatmulMx);  // nc_matmul_mx: the same slots, scales required
  CHECK(macro_from_name("nc_matmul_mx") == &mx);
  REQUIRE(mx.num_slots == 5);
  CHECK(mx.slots[3].required);
  CHECK(mx.slots[4].required);
  CHECK(mm.slots[0].written);
  CHECK_FALSE(mm.slots[1].written);
  CHECK_FALSE(mm.slots[2].written);
  CHECK(mm.default_engine == Engine::kTensor);
  CHECK(macro_from_name("nc_matmul") == &mm);
  CHECK(macro_from_name("tensor_copy") == nullptr);
  CHECK_FALSE(opcode_from_name("nc_matmul").has_value());
  CHECK(static_cast<int>(macro_table().size()) == kNumMacros);
  // written / vector are the role column, nothing else
  for (const OpInfo& info : op_table())
    for (int i = 0; i < info.num_slots; ++i) {
      const SlotInfo& s = info.slots[static_cast<size_t>(i)];
      INFO(info.mnemonic << " " << s.name);
      CHECK(s.written == (s.role == SlotRole::kOut || s.role == SlotRole::kVecOut));
      CHECK(s.vector == (s.role == SlotRole::kVecIn || s.role == SlotRole::kVecOut));
      if (std::string(s.name) == "reduce_res") CHECK(s.role == SlotRole::kVecOut);
    }
  // flags: bit i is row i of isa/flags.def
  CHECK(kReverse0 == 1u);
  CHECK(kDynamicAddr == (1u << 10));
  CHECK(flag_name(flag_bit::kHasImm0) == "has_imm0");
  std::set<std::string> names;
  for (int b = 0; b < kNumFlags; ++b) CHECK(names.insert(std::string(flag_name(b))).second);
  // arity 1: the ops that ignore their second operand
  std::set<std::string> unary;
  for (int i = 0; i < kNumAluOps; ++i)
    if (alu_arity(static_cast<AluOp>(i)) == 1) unary.insert(std::string(alu_name(static_cast<AluOp>(i))));
  CHECK(unary == std::set<std::string>{"bypass", "logical_not", "abs", "square", "relu", "rsqrt", "reciprocal",
                                       "negative", "invert"});
  CHECK(alu_class(AluOp::kEqual) == AluClass::kCompare);
  CHECK(alu_class(AluOp::kLogicalNot) == AluClass::kLogical);
}

TEST_CASE("ISA table: per-instruction ALU sets", "[isa][table]") {
  CHECK(alu_set_name(AluSet::kPartitionReduceOp) == "tensor_partition_reduce.op");
  // members in isa/alu_ops.def order
  CHECK(alu_set_members(AluSet::kPartitionReduceOp) == "add, maximum, minimum, bitwise_and, bitwise_or, average");
  CHECK(alu_in_set(AluOp::kAbsMax, AluSet::kActivate2ReduceOp));
  CHECK_FALSE(alu_in_set(AluOp::kMultiply, AluSet::kActivate2ReduceOp));
  CHECK(alu_in_set(AluOp::kBypass, AluSet::kActivate2MulOp1));
  for (int i = 0; i < kNumAluSets; ++i) CHECK(alu_set_mask(static_cast<AluSet>(i)) != 0);
}

TEST_CASE("default_engine: an all-int32 tensor_tensor runs on GpSimd", "[isa]") {
  // nki-api.md 2.1 / 3: VectorE's fp32 path rounds int32 above 2^24 (16777217 == 16777216), GpSimd computes integers.
  using nsim::isa::Engine;
  using nsim::isa::Opcode;
  using nsim::isa::Operand;
  using nsim::isa::Space;
  auto tt = [](DType a, DType b, Space s) {
    return nsim::isa::make_instr(Opcode::kTensorTensor, Engine::kVector,
                                 {Operand::tile(s, a, 0, 0, 128, {64}), Operand::tile(Space::kSbuf, a, 0, 0, 128, {64}),
                                  Operand::tile(Space::kSbuf, b, 0, 0, 128, {64})});
  };
  CHECK(nsim::isa::default_engine(tt(DType::kInt32, DType::kInt32, Space::kSbuf)) == Engine::kGpsimd);
  CHECK(nsim::isa::default_engine(tt(DType::kUInt32, DType::kUInt32, Space::kSbuf)) == Engine::kGpsimd);
  CHECK(nsim::isa::default_engine(tt(DType::kInt32, DType::kFloat32, Space::kSbuf)) == Engine::kVector);
  CHECK(nsim::isa::default_engine(tt(DType::kInt32, DType::kInt32, Space::kPsum)) == Engine::kVector);  // GpSimd: no PSUM
  CHECK(nsim::isa::default_engine(tt(DType::kFloat32, DType::kFloat32, Space::kSbuf)) == Engine::kVector);
}

TEST_CASE("act_valid_range: the valid input ranges of spec 3.5, from isa/act_funcs.def", "[isa]") {
  // Bounded: log [2^-64, 2^64], sin [-pi, pi], arctan [-pi/2, pi/2], sqrt [2^-116, 2^118], rsqrt [2^-87, 2^97],
  // reciprocal +-[2^-42, 2^42] (of |x|); every other function takes any input.
  const ActRange sin = act_valid_range(ActFunc::kSin);
  CHECK(sin.lo == Approx(-3.141592653589793));
  CHECK(sin.hi == Approx(3.141592653589793));
  CHECK_FALSE(sin.magnitude);
  CHECK(act_valid_range(ActFunc::kLog).lo == std::ldexp(1.0, -64));
  CHECK(act_valid_range(ActFunc::kRsqrt).hi == std::ldexp(1.0, 97));
  const ActRange rec = act_valid_range(ActFunc::kReciprocal);
  CHECK((rec.magnitude && rec.lo == std::ldexp(1.0, -42) && rec.hi == std::ldexp(1.0, 42)));
  int bounded = 0;
  for (int i = 0; i < kNumAct; ++i) {
    const ActRange r = act_valid_range(static_cast<ActFunc>(i));
    CHECK(r.lo < r.hi);
    bounded += !(std::isinf(r.lo) && std::isinf(r.hi));
  }
  CHECK(bounded == 6);
  CHECK(std::isinf(act_valid_range(ActFunc::kExp).hi));
}
