// verify_kernel: static checks of a frontend::Kernel before anything runs (see lower.h).
//
// Index ranges are checked exactly for every iteration without enumerating them: loop bounds are
// constants, so the iteration space is a box and an affine start c + sum(k * v) reaches its minimum
// and maximum at corners (interval arithmetic per term). Everything that does not depend on the
// iteration (dtypes, buffers, shapes, element counts, matmul limits, free-dim counts) is checked by
// isa::verify on the instructions lowered for the first iteration, with the placements the
// lowering will use. Errors name the op (index and name), the operand slot, what was expected and
// what was found, and carry the op's source location.
#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <unordered_map>

#include "frontend/compiler/allocate.h"
#include "frontend/compiler/scheduler.h"
#include "frontend/lower.h"

namespace nsim::frontend {

using isa::Instr;
using isa::Opcode;
using isa::Operand;
using isa::Space;

namespace {

constexpr int kMaxLoopDepth = 64;
constexpr int64_t kMaxTrip = int64_t{1} << 40;   // "absurd" trip counts
constexpr int64_t kMaxBound = int64_t{1} << 53;  // loop bounds beyond this are absurd too
constexpr int kMaxRank = 8;

bool on_chip(Space s) { return s == Space::kSbuf || s == Space::kPsum; }

class Verifier {
 public:
  Verifier(const Kernel& k, const engines::CoreParams& p) : k_(k), p_(p), lim_(p.limits()) {}

  void run(AllocationPlan* plan_out) {
    check_tensors();
    check_structure();
    {
      AllocationPlan plan = allocate_tiles(k_, p_);
      placements_ = plan.tiles;
      if (plan_out) *plan_out = std::move(plan);
    }
    hbm_addresses();
    const size_t nl = k_.loops.size(), nt = k_.tensors.size();
    lo_.assign(nl, 0);
    hi_.assign(nl, 0);
    first_.assign(nl, 0);
    active_.assign(nl, 0);
    alloc_depth_.assign(nt, -1);
    written_.assign(nt, 0);
    walk(k_.body, true);
    for (size_t t = 0; t < nt; ++t) {
      const Tensor& ten = k_.tensors[t];
      if (ten.kind == TensorKind::kOutput && !written_[t])
        throw Error(ErrorCode::kOutputNotWritten,
                    fmt::format("output tensor '{}' {} is never written: no op has it as its destination (slot 0)",
                                ten.name, shape_str(ten.shape)),
                    ten.loc);
    }
  }

 private:
  // ---------------------------------------------------------------- tensors and structure

  void check_tensors() {
    std::unordered_map<std::string_view, size_t> first;  // name -> its first tensor (a pairwise scan was quadratic)
    first.reserve(k_.tensors.size());
    for (size_t t = 0; t < k_.tensors.size(); ++t) {
      const Tensor& ten = k_.tensors[t];
      auto fail = [&](ErrorCode c, const std::string& msg) {
        throw Error(c, fmt::format("tensor #{} '{}': {}", t, ten.name, msg), ten.loc);
      };
      if (const auto [it, fresh] = first.emplace(ten.name, t); !fresh)
        fail(ErrorCode::kDuplicateName, fmt::format("name also used by tensor #{}", it->second));
      if (ten.space == Space::kNone) fail(ErrorCode::kWrongType, "has no memory space (expected hbm, sbuf or psum)");
      if (dtype_bytes(ten.dtype) <= 0) fail(ErrorCode::kWrongType, "has an invalid dtype");
      if (ten.shape.empty()) fail(ErrorCode::kShapeMismatch, "has an empty shape, expected at least one dim");
      for (int64_t d : ten.shape)
        if (d <= 0) fail(ErrorCode::kBadAccessPattern, fmt::format("shape {} has a dim <= 0", shape_str(ten.shape)));
      if (ten.bufs < 0) fail(ErrorCode::kWrongType, fmt::format("bufs = {}, expected >= 0 (0 = automatic)", ten.bufs));
      if (on_chip(ten.space)) {
        const int parts = ten.space == Space::kPsum ? p_.mem.psum_partitions : p_.mem.partitions;
        if (ten.shape[0] > parts)
          fail(ErrorCode::kTooManyPartitions, fmt::format("a {} tile of {} partitions, expected at most {}",
                                                          isa::space_name(ten.space), ten.shape[0], parts));
        if (ten.shape.size() > 1 + static_cast<size_t>(isa::kMaxFreeDims))
          fail(ErrorCode::kBadAccessPattern, fmt::format("shape {} has {} free dims, expected at most {}",
                                                         shape_str(ten.shape), ten.shape.size() - 1, isa::kMaxFreeDims));
      } else if (ten.shape.size() > static_cast<size_t>(kMaxRank)) {
        fail(ErrorCode::kShapeMismatch, fmt::format("rank {}, expected at most {}", ten.shape.size(), kMaxRank));
      }
    }
  }

  /// Ids of statements, loop sanity, nesting and sharing of loops, duplicate allocs.
  void check_structure() {
    std::vector<char> loop_seen(k_.loops.size(), 0), alloc_seen(k_.tensors.size(), 0);
    struct Rec {
      const Verifier& v;
      std::vector<char>& loop_seen;
      std::vector<char>& alloc_seen;
      void body(const std::vector<Stmt>& b, int depth, const SourceLoc& where) {
        const Kernel& k = v.k_;
        for (const Stmt& s : b) {
          switch (s.kind) {
            case Stmt::Kind::kOp:
              if (s.index < 0 || static_cast<size_t>(s.index) >= k.ops.size())
                throw Error(ErrorCode::kUnknownName, fmt::format("statement refers to op #{}, the kernel has {} ops",
                                                                 s.index, k.ops.size()), where);
              break;
            case Stmt::Kind::kAlloc: {
              if (s.index < 0 || static_cast<size_t>(s.index) >= k.tensors.size())
                throw Error(ErrorCode::kUnknownName,
                            fmt::format("alloc of tensor #{}, the kernel has {} tensors", s.index, k.tensors.size()),
                            where);
              const Tensor& t = k.tensors[static_cast<size_t>(s.index)];
              if (!on_chip(t.space))
                throw Error(ErrorCode::kWrongType,
                            fmt::format("alloc of tensor '{}' in {}: only sbuf/psum tiles are allocated", t.name,
                                        isa::space_name(t.space)), t.loc);
              if (alloc_seen[static_cast<size_t>(s.index)]++)
                throw Error(ErrorCode::kDuplicateName, fmt::format("tile '{}' has more than one alloc statement", t.name),
                            t.loc);
              break;
            }
            case Stmt::Kind::kLoop: {
              if (s.index < 0 || static_cast<size_t>(s.index) >= k.loops.size())
                throw Error(ErrorCode::kBadLoop, fmt::format("statement refers to loop #{}, the kernel has {} loops",
                                                             s.index, k.loops.size()), where);
              const Loop& l = k.loops[static_cast<size_t>(s.index)];
              if (loop_seen[static_cast<size_t>(s.index)]++)
                throw Error(ErrorCode::kBadLoop,
                            fmt::format("loop #{} '{}' appears more than once in the statement tree", s.index, l.var),
                            l.loc);
              if (depth >= kMaxLoopDepth)
                throw Error(ErrorCode::kBadLoop, fmt::format("loop '{}' nests deeper than {}", l.var, kMaxLoopDepth),
                            l.loc);
              if (l.step == 0)
                throw Error(ErrorCode::kBadLoop, fmt::format("loop '{}' has step 0", l.var), l.loc);
              // (Not std::abs: |INT64_MIN| is not an int64, and std::abs of it came out negative, accepting the bound.)
              const auto absurd = [](int64_t v) { return v < -kMaxBound || v > kMaxBound; };
              if (absurd(l.start) || absurd(l.stop) || absurd(l.step))
                throw Error(ErrorCode::kBadLoop,
                            fmt::format("loop '{}' range({}, {}, {}) has absurd bounds (|bound| <= 2^53 expected)",
                                        l.var, l.start, l.stop, l.step), l.loc);
              if (l.trip_count() > kMaxTrip)
                throw Error(ErrorCode::kBadLoop,
                            fmt::format("loop '{}' range({}, {}, {}) has {} iterations, expected at most 2^40", l.var,
                                        l.start, l.stop, l.step, l.trip_count()), l.loc);
              body(l.body, depth + 1, l.loc);
              break;
            }
          }
        }
      }
    } rec{*this, loop_seen, alloc_seen};
    rec.body(k_.body, 0, SourceLoc{});
  }

  /// Virtual HBM addresses as Memory::alloc_hbm assigns them (64-byte aligned, in tensor order).
  void hbm_addresses() {
    hbm_addr_.assign(k_.tensors.size(), 0);
    int64_t next = 0;
    for (size_t t = 0; t < k_.tensors.size(); ++t) {
      const Tensor& ten = k_.tensors[t];
      if (ten.space != Space::kHbm) continue;
      int64_t bytes = dtype_bytes(ten.dtype);
      for (int64_t d : ten.shape) {
        if (bytes > p_.mem.hbm_bytes / d) {
          bytes = p_.mem.hbm_bytes + 1;
          break;
        }
        bytes *= d;
      }
      const int64_t addr = (next + 63) / 64 * 64;
      if (bytes > p_.mem.hbm_bytes - addr)
        throw Error(ErrorCode::kHbmOverflow,
                    fmt::format("HBM tensor '{}' {} {} does not fit in the {} bytes of HBM", ten.name,
                                shape_str(ten.shape), dtype_name(ten.dtype), p_.mem.hbm_bytes),
                    ten.loc);
      hbm_addr_[t] = addr;
      next = addr + bytes;
    }
  }

  // ---------------------------------------------------------------- the walk

  void walk(const std::vector<Stmt>& body, bool reachable) {
    std::vector<int> allocated_here;
    for (const Stmt& s : body) {
      switch (s.kind) {
        case Stmt::Kind::kAlloc:
          alloc_depth_[static_cast<size_t>(s.index)] = static_cast<int>(stack_.size());
          allocated_here.push_back(s.index);
          break;
        case Stmt::Kind::kLoop: {
          const auto id = static_cast<size_t>(s.index);
          const Loop& l = k_.loops[id];
          const int64_t trip = l.trip_count();
          const int64_t last = trip > 0 ? l.start + (trip - 1) * l.step : l.start;
          lo_[id] = std::min(l.start, last);
          hi_[id] = std::max(l.start, last);
          first_[id] = l.start;
          active_[id] = 1;
          stack_.push_back(s.index);
          walk(l.body, reachable && trip > 0);
          stack_.pop_back();
          active_[id] = 0;
          break;
        }
        case Stmt::Kind::kOp: check_op(s.index, reachable); break;
      }
    }
    for (int t : allocated_here) alloc_depth_[static_cast<size_t>(t)] = -1;  // out of scope
  }

  // ---------------------------------------------------------------- one op

  [[noreturn]] void fail(ErrorCode c, const std::string& msg) const {
    throw Error(c, fmt::format("op #{} '{}': {}", op_idx_, op_->name, msg), op_->loc);
  }

  std::string slot_name(int i) const {
    const isa::OpInfo& info = Lowering::info_of(opcode_);
    return i < info.num_slots ? info.slots[static_cast<size_t>(i)].name : fmt::format("#{}", i);
  }

  std::string loop_name(int id) const {
    const Loop& l = k_.loops[static_cast<size_t>(id)];
    return fmt::format("'{}' (range({}, {}, {}){})", l.var, l.start, l.stop, l.step,
                       l.loc.line ? fmt::format(", line {}", l.loc.line) : "");
  }

  /// [min, max] of an affine expression over every iteration of the enclosing loops.
  void range(const Affine& a, int slot, int dim, int64_t& mn, int64_t& mx) const {
    mn = mx = a.c;
    for (auto [id, coef] : a.terms) {
      if (id < 0 || static_cast<size_t>(id) >= k_.loops.size() || !active_[static_cast<size_t>(id)])
        fail(ErrorCode::kUnknownName,
             fmt::format("operand '{}' dim {} uses loop variable #{}, which is not an enclosing loop", slot_name(slot),
                         dim, id));
      int64_t a1 = 0, a2 = 0;
      bool ovf = __builtin_mul_overflow(coef, lo_[static_cast<size_t>(id)], &a1);
      ovf |= __builtin_mul_overflow(coef, hi_[static_cast<size_t>(id)], &a2);
      ovf |= __builtin_add_overflow(mn, std::min(a1, a2), &mn);
      ovf |= __builtin_add_overflow(mx, std::max(a1, a2), &mx);
      if (ovf) fail(ErrorCode::kIndexOutOfBounds, fmt::format("operand '{}' dim {}: index overflows", slot_name(slot), dim));
    }
  }

  /// Which iteration reaches the extreme: "i = 7, j = 0" (vars at the corner that maximises/minimises).
  std::string corner(const Affine& a, bool maximise) const {
    std::string s;
    for (auto [id, coef] : a.terms) {
      const auto i = static_cast<size_t>(id);
      const int64_t v = (coef > 0) == maximise ? hi_[i] : lo_[i];
      s += fmt::format("{}{} = {}", s.empty() ? "" : ", ", k_.loops[i].var, v);
    }
    return s.empty() ? "every iteration" : s;
  }

  void check_access(int slot, const Access& a, bool reachable) {
    if (a.tensor < 0 || static_cast<size_t>(a.tensor) >= k_.tensors.size())
      fail(ErrorCode::kUnknownName,
           fmt::format("operand '{}' refers to tensor #{}, the kernel has {} tensors", slot_name(slot), a.tensor,
                       k_.tensors.size()));
    const Tensor& t = k_.tensors[static_cast<size_t>(a.tensor)];
    const bool chip = on_chip(t.space);
    if (chip && alloc_depth_[static_cast<size_t>(a.tensor)] < 0)
      fail(ErrorCode::kUnknownName,
           fmt::format("operand '{}' uses tile '{}' outside the scope of its alloc statement (before it, or after "
                       "the loop body that allocates it)", slot_name(slot), t.name));
    // A reinterpreting view of another element size indexes the tensor's bytes as its own elements (its shape
    // set from the tensor's, the last dim scaled, when kernel.json is read).
    const std::vector<int64_t> base = access_base_shape(t, a);
    if (base != t.shape && (a.shape.empty() || base.back() == 0))
      fail(ErrorCode::kBadDtype,
           fmt::format("operand '{}' views tensor '{}' ({} {}) as {}: {}", slot_name(slot), t.name,
                       dtype_name(t.dtype), shape_str(t.shape), dtype_name(a.dtype.value_or(t.dtype)),
                       base.back() == 0 ? "the last dim's bytes are not a whole number of its elements"
                                        : "a view of another element size needs its shape"));
    if (!a.shape.empty()) {  // a re-dimensioned view: the same elements, the partition dim kept
      int64_t n = 1, m = 1;
      bool over = false;
      for (int64_t d : a.shape) over |= d < 1 || __builtin_mul_overflow(n, d, &n);
      for (int64_t d : base) m *= d;
      if (!a.strides.empty()) {  // a strided view (its bounds are checked on the elements it reaches, below)
        if (a.strides.size() != a.shape.size() || (chip && (a.shape[0] != t.shape[0] || a.strides[0] != m / t.shape[0])))
          fail(ErrorCode::kBadReshape,
               fmt::format("operand '{}' views tensor '{}' {} as shape {} with {} strides: one stride per dim{}",
                           slot_name(slot), t.name, shape_str(t.shape), shape_str(a.shape), a.strides.size(),
                           chip ? ", the partition dim kept, strides[0] the partition step" : ""));
        if (slot == 0 && strided_may_overlap(a, chip))
          fail(ErrorCode::kBadIndex,
               fmt::format("operand '{}' writes tensor '{}' {} through a strided view (shape {}) whose elements may "
                           "overlap, so it can only be read", slot_name(slot), t.name, shape_str(t.shape),
                           shape_str(a.shape)));
      } else if (over || n != m || (chip && a.shape[0] != t.shape[0]))
        fail(ErrorCode::kBadReshape,
             fmt::format("operand '{}' views tensor '{}' {} as shape {}: a re-dimensioned view keeps the element "
                         "count{}", slot_name(slot), t.name, shape_str(t.shape), shape_str(a.shape),
                         chip ? " and the partition dim" : ""));
    }
    const std::vector<int64_t>& shape = access_shape(t, a);
    if (a.dims.empty() && !a.strides.empty())
      fail(ErrorCode::kBadIndex, fmt::format("operand '{}' is a strided view of tensor '{}' without an index",
                                             slot_name(slot), t.name));
    if (a.dims.empty()) return;
    if (a.dims.size() != shape.size())
      fail(ErrorCode::kBadIndex, fmt::format("operand '{}' indexes tensor '{}' {} with {} dims, expected {}",
                                             slot_name(slot), t.name, shape_str(shape), a.dims.size(),
                                             shape.size()));
    // A strided view: each dim's indices stay >= 0, the elements reached within the tensor (per partition
    // on chip; the partition dim checked as a dim).
    const bool strided = !a.strides.empty();
    int64_t reach = 0, numel = 1;
    for (size_t d = chip ? 1 : 0; strided && d < base.size(); ++d) numel *= base[d];
    for (size_t d = 0; d < a.dims.size(); ++d) {
      const DimAccess& da = a.dims[d];
      const int di = static_cast<int>(d);
      if (da.size < 1)
        fail(ErrorCode::kBadIndex, fmt::format("operand '{}' dim {} of tensor '{}' has size {}, expected >= 1",
                                               slot_name(slot), d, t.name, da.size));
      if (da.step == 0 && !da.broadcast)
        fail(ErrorCode::kBadIndex,
             fmt::format("operand '{}' dim {} of tensor '{}' has step 0 (use a broadcast)", slot_name(slot), d, t.name));
      // An indirect dst (scatter) repeats its static row: the rows come from the offsets at run time. The row
      // dim is the first one of more than one element (a scatter into rows of a reshape, vLLM's
      // [blocks * block_size, heads * d] view of a 4-D cache, has size-1 dims before it).
      const bool scatter_rows = slot == 0 && opcode_ == static_cast<int>(Opcode::kDmaCopy) && op_->operands[2] &&
                                (op_->flags & isa::kIndirectDst) &&
                                std::all_of(a.dims.begin(), a.dims.begin() + di,
                                            [](const DimAccess& p) { return p.size == 1; });
      if (da.broadcast && slot == 0 && !scatter_rows)
        fail(ErrorCode::kBadIndex, fmt::format("operand '{}' dim {} of tensor '{}' broadcasts, but a destination "
                                               "cannot", slot_name(slot), d, t.name));
      if (chip && d == 0 && (da.step != 1 || da.broadcast))
        fail(ErrorCode::kBadIndex,
             fmt::format("operand '{}' partition dim of tile '{}' has step {}{}, expected step 1", slot_name(slot),
                         t.name, da.step, da.broadcast ? " (broadcast)" : ""));
      int64_t mn = 0, mx = 0;
      range(da.start, slot, di, mn, mx);
      if (!reachable) continue;  // the op never runs: no bounds to check
      int64_t span = 0;
      if (!da.broadcast && __builtin_mul_overflow(da.size - 1, da.step, &span))
        fail(ErrorCode::kIndexOutOfBounds, fmt::format("operand '{}' dim {}: index overflows", slot_name(slot), d));
      const int64_t dim = shape[d];
      int64_t lo = 0, hi = 0;
      if (__builtin_add_overflow(mn, std::min<int64_t>(0, span), &lo) ||
          __builtin_add_overflow(mx, std::max<int64_t>(0, span), &hi))
        fail(ErrorCode::kIndexOutOfBounds, fmt::format("operand '{}' dim {}: index overflows", slot_name(slot), d));
      if (strided && !(chip && d == 0)) {
        int64_t r = 0;
        if (lo < 0 || __builtin_mul_overflow(hi, a.strides[d], &r) || __builtin_add_overflow(reach, r, &reach) ||
            reach >= numel)
          fail(ErrorCode::kIndexOutOfBounds,
               fmt::format("operand '{}' dim {} of a strided view (shape {}, strides {}) of tensor '{}' {}: indices "
                           "[{}, {}] reach element {}{}, expected within [0, {})", slot_name(slot), d,
                           shape_str(shape), shape_str(a.strides), t.name, shape_str(t.shape), lo, hi, reach,
                           chip ? " of a partition" : "", numel));
        continue;
      }
      if (lo < 0 || hi >= dim) {
        const bool high = hi >= dim;
        fail(ErrorCode::kIndexOutOfBounds,
             fmt::format("operand '{}' dim {} of tensor '{}' {}: indices [{}, {}] over all iterations, expected "
                         "within [0, {}) (start {}, size {}, step {}; {} at {})",
                         slot_name(slot), d, t.name, shape_str(shape), lo, hi, dim, high ? mx : mn, da.size,
                         da.broadcast ? 0 : da.step, high ? "highest" : "lowest", corner(da.start, high)));
      }
    }
  }

  void check_op(int idx, bool reachable) {
    op_idx_ = idx;
    op_ = &k_.ops[static_cast<size_t>(idx)];
    const Op& op = *op_;
    opcode_ = Lowering::opcode_of(op.name);
    if (opcode_ == Lowering::kUnknownOp) {
      opcode_ = Lowering::kNcMatmul;  // slot names only
      fail(ErrorCode::kUnknownOp, fmt::format("'{}' is not an ISA op (isa/opcodes.def) nor nc_matmul", op.name));
    }
    const bool mm = opcode_ == Lowering::kNcMatmul;
    const isa::OpInfo& info = Lowering::info_of(opcode_);
    const int nslots = info.num_slots;
    for (int i = 0; i < isa::kMaxSlots; ++i) {
      const auto& a = op.operands[static_cast<size_t>(i)];
      if (!a) {  // an ISA op's required slots are checked on its lowered instructions (isa::verify)
        if (mm && i < nslots && info.slots[static_cast<size_t>(i)].required)
          fail(ErrorCode::kMissingOperand, fmt::format("operand '{}' is required", slot_name(i)));
        continue;
      }
      if (i >= nslots) fail(ErrorCode::kBadImmediate, fmt::format("unexpected operand #{} (the op has {} slots)", i, nslots));
      check_access(i, *a, reachable);
    }
    if (op.dma_queue && (*op.dma_queue < 0 || *op.dma_queue >= p_.dma_queues))
      fail(ErrorCode::kBadArgument, fmt::format("dma_queue {}, expected 0..{}", *op.dma_queue, p_.dma_queues - 1));

    // Destination bookkeeping: outputs written, affine_range write conflicts.
    const bool dst_written = info.slots[0].written;
    if (dst_written && op.operands[0]) {
      const Access& d = *op.operands[0];
      const Tensor& t = k_.tensors[static_cast<size_t>(d.tensor)];
      written_[static_cast<size_t>(d.tensor)] = 1;
      // `t += x` (tensor_tensor dst = data1 with a reduction operator) gives the same result in any iteration
      // order: the spec's associative accumulation, allowed in an affine_range like the accumulate flag.
      const bool inplace = opcode_ == static_cast<int>(Opcode::kTensorTensor) && op.operands[1] && *op.operands[1] == d &&
                           isa::alu_reduce_legal(op.alu0);
      const bool accumulate = (op.flags & isa::kAccumulate) != 0 || inplace;
      for (size_t j = 0; j < stack_.size() && !accumulate; ++j) {
        const int lid = stack_[j];
        const Loop& l = k_.loops[static_cast<size_t>(lid)];
        if (l.kind != LoopKind::kAffine || l.trip_count() <= 1) continue;
        if (on_chip(t.space) && alloc_depth_[static_cast<size_t>(d.tensor)] > static_cast<int>(j))
          continue;  // a fresh (rotating) tile per iteration of l
        bool depends = false;
        for (const DimAccess& da : d.dims)
          for (auto [id, coef] : da.start.terms) depends |= id == lid && coef != 0;
        if (!depends)
          fail(ErrorCode::kAffineWriteConflict,
               fmt::format("operand '{}' writes the same location of {} '{}' in every iteration of affine_range loop "
                           "{}; index it with '{}', allocate the tile inside the loop, accumulate, or use "
                           "sequential_range", slot_name(0), on_chip(t.space) ? "tile" : "tensor", t.name,
                           loop_name(lid), l.var));
      }
    }
    if (!reachable) return;

    // The instruction(s) of the first iteration through isa::verify.
    // (One vector for every op, its enclosing loops' entries set here and cleared on leaving: a fresh one per
    // op cost a pass over every loop of the kernel, quadratic in a kernel of many loops.)
    std::vector<int64_t>& vars = vars_;
    vars.resize(k_.loops.size(), 0);
    for (int lid : stack_) vars[static_cast<size_t>(lid)] = first_[static_cast<size_t>(lid)];
    struct Clear {
      std::vector<int64_t>& v;
      const std::vector<int>& ids;
      ~Clear() {
        for (int lid : ids) v[static_cast<size_t>(lid)] = 0;
      }
    } clear{vars, stack_};
    std::array<Operand, isa::kMaxSlots> o{};
    const bool keep = opcode_ == static_cast<int>(Opcode::kTensorReduce) && op.axis_count != 0;
    for (int i = 0; i < isa::kMaxSlots; ++i) {
      const auto& a = op.operands[static_cast<size_t>(i)];
      if (!a) continue;
      const auto ti = static_cast<size_t>(a->tensor);
      const int64_t base = placements_[ti].tensor >= 0 ? placements_[ti].offset : hbm_addr_[ti];
      try {
        o[static_cast<size_t>(i)] = Lowering::access_operand(k_.tensors[ti], *a, vars, base, keep && i == 1);
      } catch (const Error& e) {
        fail(e.code(), fmt::format("operand '{}': {}", slot_name(i), e.message()));
      }
    }
    if (mm) {  // cross-instruction shape rules of a matmul
      const Operand &dst = o[0], &st = o[1], &mv = o[2];
      if (st.num_partitions != mv.num_partitions)
        fail(ErrorCode::kShapeMismatch,
             fmt::format("stationary [K={}, M={}] and moving [K={}, N={}] must have the same contraction size K",
                         st.num_partitions, st.elems_per_partition(), mv.num_partitions, mv.elems_per_partition()));
      const bool mx_op = op.name == "nc_matmul_mx";
      if (mx_op != dtype_is_mx_x4(st.dtype) || mx_op != dtype_is_mx_x4(mv.dtype))
        fail(ErrorCode::kBadDtype,
             fmt::format("{} takes {} stationary and moving, got {} and {}", op.name,
                         mx_op ? "MX x4-packed (float8_e5m2_x4, float8_e4m3fn_x4, float4_e2m1fn_x4)" : "unpacked (not MX x4)",
                         dtype_name(st.dtype), dtype_name(mv.dtype)));
      if (!mx_op)
        if (auto r = isa::matmul_dtype_rule(st.dtype, mv.dtype, lim_, op.flags & isa::kDoubleRow,
                                            op.flags & isa::kIsTranspose))
          fail(r->code, r->message);
      const int64_t m = st.elems_per_partition() / ((op.flags & isa::kDoubleRow) ? 2 : 1);
      if (dst.num_partitions != m)
        fail(ErrorCode::kShapeMismatch, fmt::format("dst must have M = {} partitions (the stationary free size), got {}",
                                                    m, dst.num_partitions));
    }
    Instr in[2];
    const int n = Lowering::assemble(op, opcode_, o, 0, in);
    for (int i = 0; i < n; ++i) {
      try {
        isa::verify(in[i], lim_, op.loc);
      } catch (const Error& e) {
        fail(e.code(), e.message());
      }
    }
    if (mm) check_psum_banks(*op.operands[0], o[0]);
    if ((opcode_ == static_cast<int>(Opcode::kDmaCopy) || opcode_ == static_cast<int>(Opcode::kTensorCopy)) &&
        op.operands[2])
      check_indirect_reach(op);
  }

  /// Whether two elements of strided access `a` (Access::strides) may be the same tensor element: unless its dims
  /// (size > 1), sorted by their element step |stride x step|, each step past the span of the smaller ones (a
  /// transposed window, `out[i_f, i_g, i_p]`: a destination then). On chip, partitions never meet.
  static bool strided_may_overlap(const Access& a, bool chip) {
    if (a.dims.size() != a.strides.size()) return true;
    std::vector<std::pair<int64_t, int64_t>> steps;  // (|stride x step|, size)
    for (size_t d = chip ? 1 : 0; d < a.dims.size(); ++d) {
      const DimAccess& x = a.dims[d];
      if (x.size <= 1) continue;
      int64_t e = 0;
      if (x.broadcast || __builtin_mul_overflow(a.strides[d], x.step, &e) || e == 0) return true;
      steps.emplace_back(e < 0 ? -e : e, x.size);
    }
    std::sort(steps.begin(), steps.end());
    int64_t span = 0;  // the largest element offset of the dims so far
    for (const auto& [e, n] : steps) {
      int64_t reach = 0;
      if (e <= span || __builtin_mul_overflow(e, n - 1, &reach) || __builtin_add_overflow(span, reach, &span)) return true;
    }
    return false;
  }

  /// An indirect dma_copy or a dynamic tensor_copy (`offsets`): in every iteration, every element an
  /// in-range runtime index (in [0, iimm[0])) may reach, iimm[1] elements per index unit past the static
  /// access, stays inside the HBM tensor, or inside each partition's row of the tile (the run checks the
  /// same with isa::slot_extent against the whole buffer; E201 there and here).
  void check_indirect_reach(const Op& op) {
    const int slot = (op.flags & isa::kIndirectDst) ? 0 : 1;
    const auto& a = op.operands[static_cast<size_t>(slot)];
    if (!a) return;
    const Tensor& t = k_.tensors[static_cast<size_t>(a->tensor)];
    const bool chip = t.space != Space::kHbm;
    if (chip && opcode_ == static_cast<int>(Opcode::kDmaCopy)) return;  // isa::verify refused it
    if (!chip && opcode_ != static_cast<int>(Opcode::kDmaCopy)) return;  // isa::verify refuses it
    // On chip the partition dim is not addressed by the offset: the flat index runs over the free dims.
    const size_t first = chip ? 1 : 0;
    // (a re-dimensioned access, an .ap pattern that splits a dim, indexes its own shape: same elements)
    const std::vector<int64_t>& shape = access_shape(t, *a);
    int64_t numel = 1;
    for (size_t d = first; d < shape.size(); ++d)
      if (__builtin_mul_overflow(numel, shape[d], &numel)) return;  // the tensor's own checks refuse it
    // The last element the static access touches, over all iterations: an affine function of the loop
    // variables (sum of each dim's start x its stride) plus each dim's positive span.
    int64_t last = numel - 1;
    if (!a->dims.empty()) {
      Affine flat;
      int64_t spans = 0, stride = 1;
      bool ovf = false;
      for (size_t d = a->dims.size(); d-- > first;) {
        const DimAccess& da = a->dims[d];
        int64_t c = 0, span = 0;
        ovf |= __builtin_mul_overflow(da.start.c, stride, &c);
        ovf |= __builtin_add_overflow(flat.c, c, &flat.c);
        for (auto [id, coef] : da.start.terms) {
          int64_t k = 0;
          ovf |= __builtin_mul_overflow(coef, stride, &k);
          auto it = std::find_if(flat.terms.begin(), flat.terms.end(), [&](const auto& e) { return e.first == id; });
          if (it == flat.terms.end()) flat.terms.emplace_back(id, k);
          else ovf |= __builtin_add_overflow(it->second, k, &it->second);
        }
        if (!da.broadcast && da.step > 0) {
          ovf |= __builtin_mul_overflow(da.size - 1, da.step, &span);
          ovf |= __builtin_mul_overflow(span, stride, &span);
          ovf |= __builtin_add_overflow(spans, span, &spans);
        }
        ovf |= __builtin_mul_overflow(stride, shape[d], &stride);
      }
      int64_t mn = 0, mx = 0;
      if (!ovf) range(flat, slot, 0, mn, mx);
      if (ovf || __builtin_add_overflow(mx, spans, &last))
        fail(ErrorCode::kIndexOutOfBounds, fmt::format("operand '{}': index overflows", slot_name(slot)));
    }
    const int64_t bound = std::max<int64_t>(op.iimm[0] - 1, 0), unit = std::max<int64_t>(op.iimm[1], 0);
    int64_t reach = 0, end = 0;
    if (__builtin_mul_overflow(bound, unit, &reach) || __builtin_add_overflow(last, reach, &end) || end >= numel)
      fail(ErrorCode::kOutOfBounds,
           fmt::format("operand '{}' is the indirect side of tensor '{}' {}: an index up to iimm[0] - 1 = {} moves its "
                       "rows by up to {} x iimm[1] = {} elements, reaching element {}, past the tensor's {} elements{}",
                       slot_name(slot), t.name, shape_str(t.shape), bound, bound, unit, end, numel,
                       chip ? " per partition" : ""));
  }

  /// Before gen4 one matmul writes within one PSUM bank, in every iteration: the dst's byte offset
  /// moves with the loop variables (affine), so enumerate the values of the loops it depends on
  /// (up to 2^16 combinations; beyond that only the first iteration was checked, by isa::verify).
  void check_psum_banks(const Access& a, const Operand& first) {
    const int64_t bank = lim_.psum_bank_bytes;
    if (lim_.generation >= 4 || bank <= 0 || first.space != Space::kPsum || a.dims.empty()) return;
    const Tensor& t = k_.tensors[static_cast<size_t>(a.tensor)];
    const std::vector<int64_t>& shape = access_shape(t, a);
    const int64_t eb = access_elem_bytes(t, a);
    std::vector<std::pair<int, int64_t>> coef;  // (loop id, bytes per unit of its variable)
    int64_t stride = 1;
    for (size_t d = shape.size(); d-- > 1;) {
      for (auto [id, c] : a.dims[d].start.terms) {
        auto it = std::find_if(coef.begin(), coef.end(), [&](const auto& e) { return e.first == id; });
        if (it == coef.end()) coef.emplace_back(id, c * stride * eb);
        else it->second += c * stride * eb;
      }
      stride *= shape[d];
    }
    int64_t combos = 1;
    for (const auto& [id, c] : coef) {
      combos *= std::max<int64_t>(1, k_.loops[static_cast<size_t>(id)].trip_count());
      if (combos > (int64_t{1} << 16)) return;
    }
    const auto [lo0, hi0] = first.byte_extent();
    std::vector<int64_t> n(coef.size(), 0);  // iteration index per loop
    while (true) {
      int64_t delta = 0;
      for (size_t i = 0; i < coef.size(); ++i)
        delta += coef[i].second * n[i] * k_.loops[static_cast<size_t>(coef[i].first)].step;
      const int64_t lo = lo0 + delta, hi = hi0 + delta;
      if (lo / bank != (hi - 1) / bank) {
        std::string at;
        for (size_t i = 0; i < coef.size(); ++i) {
          const Loop& l = k_.loops[static_cast<size_t>(coef[i].first)];
          at += fmt::format("{}{} = {}", at.empty() ? "" : ", ", l.var, l.start + n[i] * l.step);
        }
        fail(ErrorCode::kPsumBankOverflow,
             fmt::format("multiply_moving: dst bytes [{}, {}) cross a {}-byte PSUM bank boundary at {}", lo, hi, bank,
                         at));
      }
      size_t i = 0;
      for (; i < coef.size(); ++i) {
        if (++n[i] < k_.loops[static_cast<size_t>(coef[i].first)].trip_count()) break;
        n[i] = 0;
      }
      if (i == coef.size()) break;
    }
  }

  const Kernel& k_;
  const engines::CoreParams& p_;
  isa::Limits lim_;
  std::vector<TilePlacement> placements_;
  std::vector<int64_t> hbm_addr_;
  std::vector<int64_t> lo_, hi_, first_;  ///< per loop id: variable range and first value
  std::vector<int64_t> vars_;             ///< check_op: the enclosing loops' first values, 0 elsewhere
  std::vector<char> active_;               ///< per loop id: encloses the current statement
  std::vector<int> stack_;                 ///< enclosing loop ids, outermost first
  std::vector<int> alloc_depth_;           ///< per tile: loop depth of its alloc while in scope, else -1
  std::vector<char> written_;              ///< per tensor: dst of some op
  const Op* op_ = nullptr;
  int op_idx_ = -1;
  int opcode_ = 0;
};

}  // namespace

void verify_kernel(const Kernel& k, const engines::CoreParams& p, AllocationPlan* plan) {
  if (!k.core_programs.empty())
    throw Error(ErrorCode::kMultiCoreLaunch,
                fmt::format("kernel '{}' is a {}-core launch (\"cores\" in kernel.json): this tool runs one core; use "
                            "`nsim run` or nsim.simulate_json, which run every core",
                            k.name, k.core_programs.size()));
  Verifier(k, p).run(plan);
  // The ops' "after" labels and with_schedule's names name instructions of the kernel (UnknownName otherwise), as the
  // compiler checks them when the kernel runs: `nsim check` accepts no kernel that `nsim run` rejects for them.
  (void)schedule_edges(k);
}

}  // namespace nsim::frontend
