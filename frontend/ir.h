#pragma once
/// The tile IR of nsim (frontend::Kernel): named tensors (HBM inputs/outputs, SBUF/PSUM tiles), loops
/// with affine index expressions over loop variables, and tile ops mirroring nki.isa, each with its
/// source location. Read from / written to kernel.json (docs/kernel-json.md), checked by
/// verify_kernel(), lowered lazily to isa::Instr by Lowering.
#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "isa/isa.h"
#include "sim/error.h"

namespace nsim::frontend {

inline constexpr int kKernelSchemaVersion = 1;

/// c + sum(coef * var): an affine expression over loop variables (by loop id, see Kernel::loops).
struct Affine {
  int64_t c = 0;
  std::vector<std::pair<int, int64_t>> terms;  ///< (loop id, coefficient), coefficients != 0
  /// Value for the current loop variable values (indexed by loop id).
  int64_t eval(const std::vector<int64_t>& vars) const {
    int64_t v = c;
    for (auto [id, k] : terms) v += k * vars[static_cast<size_t>(id)];
    return v;
  }
  bool is_const() const { return terms.empty(); }
  bool operator==(const Affine&) const = default;
};

/// One dimension of a tensor access: elements [start, start + size*step) with stride `step`, or
/// (broadcast) `size` copies of one element (stride 0; sources only).
struct DimAccess {
  Affine start;
  int64_t size = 1;
  int64_t step = 1;
  bool broadcast = false;
  bool operator==(const DimAccess&) const = default;
};

/// A slice of a tensor. An empty `dims` means the whole tensor. On-chip tensors: dims[0] is the
/// partition dim (step must be 1). The slice may have fewer dims than the tensor only when empty.
struct Access {
  int tensor = -1;  ///< index into Kernel::tensors
  std::vector<DimAccess> dims;
  /// A reinterpreting view (`t.view(dtype)`, `.ap(dtype=)`): the tensor's bytes read or written as this dtype;
  /// nullopt = the tensor's dtype. Of another element size, the access indexes the tensor with its last dim
  /// scaled by the ratio of the sizes (a [128, 512] bf16 tile as float32 is [128, 256], as uint8 [128, 1024]):
  /// kernel.json reading sets `shape` to that (or checks the given one against it; access_base_shape).
  std::optional<DType> dtype;
  /// The order in which the access visits the dims (a permutation of 0..rank-1; on chip order[0] == 0):
  /// the operand's rows (HBM) / free dims follow it. Empty = row-major (0, 1, ...). A permuted view
  /// (permute, .T, rearrange) pairs its elements in this order.
  std::vector<int> order;
  /// A re-dimensioned view (kernel.json `"shape"`): the tensor's elements taken row-major with this shape
  /// (the same element count; on chip the same partition dim first), which `dims` and `order` then index.
  /// It splits a dim in two where an access visits it with two strides (the NKI tutorial's transpose
  /// `out[i_p, i_x * ny + i_y] = in[i_p, i_y * nx + i_x]`). Empty = the tensor's shape.
  std::vector<int64_t> shape;
  /// A strided view (kernel.json `"strides"`, with `"shape"`): the element strides of the dims of `shape`
  /// over the tensor's elements (on chip: strides[0] is the partition step, the tile's free element count), in
  /// place of the row-major strides of `shape`. It expresses a read whose dims overlap, such as the 3x3 /
  /// stride-2 windows `t[i_p, 2 * i_h + i_kh, 2 * i_w + i_kw]` of a max pool; sources only. Empty = row-major.
  std::vector<int64_t> strides;
  bool operator==(const Access&) const = default;
};

enum class TensorKind : uint8_t { kInput, kOutput, kInternal };

/// A tensor. HBM inputs/outputs are declared at kernel level; SBUF/PSUM tiles by an alloc statement
/// (their storage is valid from there on; inside a loop each execution of the alloc may get the next
/// of `bufs` rotating buffers).
struct Tensor {
  std::string name;
  isa::Space space = isa::Space::kSbuf;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;  ///< on-chip: shape[0] = partitions, at most 4 free dims
  TensorKind kind = TensorKind::kInternal;
  int bufs = 0;                ///< rotating buffers for tiles allocated in loops; 0 = automatic
  /// Allocations of this tile's site (its source line and call path, the tracer's) in the loop body that makes
  /// it (kernel.json "site_count"; 0 or 1: alone): an automatic depth is shared between them, ceil(depth / n) each.
  int site_count = 0;
  SourceLoc loc;
  /// Manual placement (`address=` on nl.ndarray): byte offset of buffer 0 within each partition of
  /// the kernel's on-chip region; -1 = placed by the allocator. (After `loc`: aggregate initialisers
  /// written before it keep their meaning.)
  int64_t address = -1;
  /// An HBM tensor's initial contents (kernel.json `"init"`): those of the input tensor of this name, copied
  /// before the kernel starts and not simulated (a kernel argument written in place: on hardware the
  /// argument's own storage). Empty = none.
  std::string init;
  bool operator==(const Tensor&) const = default;
};

/// A shape as text, "[128, 512]" (error messages).
inline std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

/// The shape access `a` of tensor `t` indexes: its re-dimensioned shape, or the tensor's.
inline const std::vector<int64_t>& access_shape(const Tensor& t, const Access& a) {
  return a.shape.empty() ? t.shape : a.shape;
}

/// Bytes of one element of access `a` of tensor `t`: of its reinterpreting dtype, else of the tensor's. The
/// access's index, shape and strides count elements of this size.
inline int64_t access_elem_bytes(const Tensor& t, const Access& a) { return dtype_bytes(a.dtype.value_or(t.dtype)); }

/// The shape of tensor `t` as access `a` sees it before any re-dimensioning: the tensor's, or through a
/// reinterpreting dtype of another element size the tensor's bytes as elements of that size (its last dim scaled
/// by the ratio; 0 when that dim's bytes are not a whole number of elements). An access of another element size
/// carries this (or a re-dimensioning of it) as its `shape`.
inline std::vector<int64_t> access_base_shape(const Tensor& t, const Access& a) {
  std::vector<int64_t> s = t.shape;
  const int64_t tb = dtype_bytes(t.dtype), vb = access_elem_bytes(t, a);
  if (tb != vb && !s.empty() && vb > 0) s.back() = (s.back() * tb) % vb ? 0 : s.back() * tb / vb;
  return s;
}

/// A tile op: an nki.isa instruction (an OP row of isa/opcodes.def), or a frontend op (a MACRO row:
/// nc_matmul, lowered to load_stationary + multiply_moving).
struct Op {
  std::string name;  ///< mnemonic of an OP or MACRO row of isa/opcodes.def
  std::optional<isa::Engine> engine;  ///< none = the opcode's default engine
  /// Operands by slot of the row (nc_matmul: dst, stationary, moving).
  std::array<std::optional<Access>, isa::kMaxSlots> operands;
  // Immediates, with the meanings of isa::Instr (docs/isa.md).
  isa::AluOp alu0 = isa::AluOp::kBypass;
  isa::AluOp alu1 = isa::AluOp::kBypass;
  isa::ActFunc act = isa::ActFunc::kCopy;
  isa::ReduceCmd reduce_cmd = isa::ReduceCmd::kIdle;
  uint16_t flags = 0;
  std::array<float, 4> imm = isa::kImmDefault;
  std::array<int32_t, 10> iimm = isa::kIimmDefault;
  /// iimm entries given as index expressions over loop variables (iota / affine_select: the pattern's offset
  /// moving with a loop), evaluated per instance (Lowering::apply_iimm); iimm holds 0 there.
  std::vector<std::pair<uint8_t, Affine>> iimm_expr;
  std::array<uint8_t, 32> shuffle{};
  uint8_t axis_count = 0;
  std::optional<int> dma_queue;
  /// The instruction's name (nisa `name=`), referenced by Kernel::schedule edges; empty = none.
  std::string label;
  /// Ops of one `no_reorder` block share a group id (> 0): the scheduler keeps them in program
  /// order. 0 = free to reorder.
  int order_group = 0;
  /// Labels of ops this op waits for: each instance starts no earlier than the end of the nearest earlier
  /// instance of each (a with_schedule edge of this op alone; the Python tracer's register_load -> the ops
  /// using the register). Empty = none.
  std::vector<std::string> after;
  SourceLoc loc;
  bool operator==(const Op&) const = default;
};

enum class LoopKind : uint8_t { kAffine, kSequential, kStatic };

struct Stmt;
/// A loop: var in range(start, stop, step).
struct Loop {
  std::string var;
  int64_t start = 0, stop = 0, step = 1;
  LoopKind kind = LoopKind::kAffine;
  std::vector<Stmt> body;
  SourceLoc loc;
  int64_t trip_count() const {
    if (step > 0) return stop > start ? (stop - start + step - 1) / step : 0;
    if (step < 0) return start > stop ? (start - stop - step - 1) / (-step) : 0;
    return 0;
  }
  bool operator==(const Loop&) const;
};

/// A statement: an op, a loop (by id into Kernel::loops), or a tile allocation (tensor id).
struct Stmt {
  enum class Kind : uint8_t { kOp, kLoop, kAlloc } kind = Kind::kOp;
  int index = -1;  ///< into Kernel::ops, Kernel::loops or Kernel::tensors
  bool operator==(const Stmt&) const = default;
};

inline bool Loop::operator==(const Loop& o) const {
  return var == o.var && start == o.start && stop == o.stop && step == o.step && kind == o.kind && body == o.body &&
         loc == o.loc;
}

/// A `with_schedule` edge: every instruction of the op labelled `after` runs after the nearest
/// earlier instruction of each op labelled in `before` (docs/timing-model.md).
struct ScheduleEdge {
  std::string after;
  std::vector<std::string> before;
  bool operator==(const ScheduleEdge&) const = default;
};

struct Kernel {
  std::string name;
  std::vector<ScheduleEdge> schedule;  ///< kernel.with_schedule([...]) edges
  std::vector<Tensor> tensors;
  std::vector<Op> ops;
  std::vector<Loop> loops;  ///< loop id = index; nested loops are referenced from their parent body
  std::vector<Stmt> body;   ///< top-level statements
  /// A multi-core (LNC=2) launch (docs/lnc.md): one program per physical core; this kernel's own
  /// `tensors` are then the union of their HBM tensors and its body is empty. Empty: one core.
  std::vector<Kernel> core_programs;
  bool operator==(const Kernel&) const = default;

  int find_tensor(const std::string& name) const;  ///< -1 if absent
};

/// Whether `body` (of kernel k) holds an op that runs: at any depth, not counting loops of no iterations. A loop whose
/// body holds none does nothing in any iteration, and is not iterated (frontend::Lowering::skip_loop, EagerSession).
inline bool body_runs_ops(const Kernel& k, const std::vector<Stmt>& body) {
  for (const Stmt& s : body) {
    if (s.kind == Stmt::Kind::kOp) return true;
    if (s.kind == Stmt::Kind::kLoop) {
      const Loop& l = k.loops[static_cast<size_t>(s.index)];
      if (l.trip_count() > 0 && body_runs_ops(k, l.body)) return true;
    }
  }
  return false;
}

/// Parse kernel.json text. Throws nsim::Error E401..E412 with the JSON path ("body[2].op") and,
/// where known, the op's source location. `filename` appears in messages.
Kernel parse_kernel_json(std::string_view text, const std::string& filename = "kernel.json");
namespace json {
class Value;
}
/// The same from a JSON value built in memory (the Python binding converts a kernel dict without
/// writing its text); messages then carry the JSON path without a line and column.
Kernel parse_kernel_value(const json::Value& root, const std::string& filename);
/// A kernel's "body" given statement by statement: calls fn(i, statement) for each, in order, and returns true;
/// or, when the body is not an array, returns false with it in `whole` (read_body's error is reported).
using BodySource = std::function<bool(const std::function<void(size_t, json::Value)>& fn, json::Value& whole)>;
/// Bodies given statement by statement (BodySource), by token: token 0 is the kernel's "body"; a loop whose
/// "body" value is an empty array at position (line -1, column t) takes body t.
using BodySources =
    std::function<bool(int token, const std::function<void(size_t, json::Value)>& fn, json::Value& whole)>;
/// parse_kernel_value of a top level without "body", whose statements come from `bodies` one at a time, and
/// so do the bodies of loops marked with a token (no DOM of a whole body is held: a Python kernel dict of
/// millions of statements, as a kernel.json text is read). A multi-core launch is not read this way.
Kernel parse_kernel_value(const json::Value& root, const BodySources& bodies, const std::string& filename);
/// Write kernel.json (stable key order; parse(write(k)) == k).
std::string write_kernel_json(const Kernel& k);

}  // namespace nsim::frontend
