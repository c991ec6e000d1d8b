#pragma once
// A small builder of frontend::Kernel for tests (the kernel.json schema maps 1:1 onto these calls).
#include <optional>
#include <string>
#include <vector>

#include "frontend/ir.h"

namespace {

using nsim::frontend::Access;
using nsim::frontend::Affine;
using nsim::frontend::DimAccess;
using nsim::frontend::Kernel;
using nsim::frontend::Loop;
using nsim::frontend::LoopKind;
using nsim::frontend::Op;
using nsim::frontend::Stmt;
using nsim::frontend::Tensor;
using nsim::frontend::TensorKind;

/// Affine start: c + coef * var(loop).
Affine A(int64_t c) { return Affine{c, {}}; }
Affine A(int loop, int64_t coef, int64_t c = 0) { return Affine{c, {{loop, coef}}}; }
/// One dim of an access.
DimAccess D(Affine start, int64_t size, int64_t step = 1) { return DimAccess{std::move(start), size, step, false}; }
DimAccess D(int64_t start, int64_t size, int64_t step = 1) { return D(A(start), size, step); }
[[maybe_unused]] DimAccess B(int64_t start, int64_t size) { return DimAccess{A(start), size, 1, true}; }

struct KB {
  Kernel k;
  std::vector<int> open;  // loop ids being built

  std::vector<Stmt>& cur() { return open.empty() ? k.body : k.loops[static_cast<size_t>(open.back())].body; }
  static nsim::SourceLoc at(int line) { return nsim::SourceLoc{"kernel.py", line, "kern"}; }

  int tensor(const std::string& name, nsim::isa::Space sp, nsim::DType dt, std::vector<int64_t> shape,
             TensorKind kind, int bufs, int line) {
    Tensor t;
    t.name = name;
    t.space = sp;
    t.dtype = dt;
    t.shape = std::move(shape);
    t.kind = kind;
    t.bufs = bufs;
    t.loc = at(line);
    k.tensors.push_back(t);
    return static_cast<int>(k.tensors.size() - 1);
  }
  int input(const std::string& n, std::vector<int64_t> s, nsim::DType dt = nsim::DType::kFloat32, int line = 1) {
    return tensor(n, nsim::isa::Space::kHbm, dt, std::move(s), TensorKind::kInput, 0, line);
  }
  int output(const std::string& n, std::vector<int64_t> s, nsim::DType dt = nsim::DType::kFloat32, int line = 2) {
    return tensor(n, nsim::isa::Space::kHbm, dt, std::move(s), TensorKind::kOutput, 0, line);
  }
  /// A tile plus its alloc statement at the current position.
  int tile(const std::string& n, std::vector<int64_t> s, nsim::DType dt = nsim::DType::kFloat32, int bufs = 0,
           int line = 3, nsim::isa::Space sp = nsim::isa::Space::kSbuf) {
    const int t = tensor(n, sp, dt, std::move(s), TensorKind::kInternal, bufs, line);
    cur().push_back(Stmt{Stmt::Kind::kAlloc, t});
    return t;
  }
  int psum(const std::string& n, std::vector<int64_t> s, int bufs = 0, int line = 3) {
    return tile(n, std::move(s), nsim::DType::kFloat32, bufs, line, nsim::isa::Space::kPsum);
  }
  int loop(const std::string& var, int64_t start, int64_t stop, int64_t step = 1, LoopKind kind = LoopKind::kAffine,
           int line = 4) {
    Loop l;
    l.var = var;
    l.start = start;
    l.stop = stop;
    l.step = step;
    l.kind = kind;
    l.loc = at(line);
    k.loops.push_back(l);
    const int id = static_cast<int>(k.loops.size() - 1);
    cur().push_back(Stmt{Stmt::Kind::kLoop, id});
    open.push_back(id);
    return id;
  }
  void end() { open.pop_back(); }
  /// An op with operands by slot (empty optional = absent); returns its index.
  int op(const std::string& name, std::vector<std::optional<Access>> operands, int line = 10) {
    Op o;
    o.name = name;
    for (size_t i = 0; i < operands.size(); ++i) o.operands[i] = operands[i];
    o.loc = at(line);
    k.ops.push_back(o);
    const int id = static_cast<int>(k.ops.size() - 1);
    cur().push_back(Stmt{Stmt::Kind::kOp, id});
    return id;
  }
  Op& o(int i) { return k.ops[static_cast<size_t>(i)]; }
  /// tensor_scalar dst = data op0 imm
  int ts(Access dst, Access data, nsim::isa::AluOp op0, float imm, int line = 11) {
    const int i = op("tensor_scalar", {dst, data}, line);
    o(i).alu0 = op0;
    o(i).imm[0] = imm;
    o(i).flags = nsim::isa::kHasImm0;
    return i;
  }
};

Access W(int t) { return Access{t, {}}; }
Access X(int t, std::vector<DimAccess> d) { return Access{t, std::move(d)}; }

}  // namespace
