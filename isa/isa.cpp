#include "isa/isa.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <initializer_list>
#include <iterator>
#include <limits>
#include <type_traits>

namespace nsim::isa {
namespace {

constexpr SlotInfo make_slot(const char* name, uint8_t buffers, DtypeClass dtypes, bool required, SlotRole role) {
  SlotInfo s{name, buffers, dtypes, required, role};
  s.written = role == SlotRole::kOut || role == SlotRole::kVecOut;
  s.vector = role == SlotRole::kVecIn || role == SlotRole::kVecOut;
  return s;
}

constexpr OpInfo make_op(Opcode op, const char* mnemonic, uint8_t engines, Engine dflt, CostClass cost,
                         std::initializer_list<SlotInfo> slots) {
  OpInfo info{op, mnemonic, engines, dflt, cost, static_cast<uint8_t>(slots.size()), {}};
  size_t i = 0;
  for (SlotInfo s : slots) info.slots[i++] = s;
  return info;
}

struct AluRow {
  const char* name;
  AluClass cls;
  bool reduce;
  int arity;
};
constexpr AluRow kAlu[] = {
#define ALU(e, name, cls, red, arity) {name, AluClass::k##cls, (red) != 0, arity},
#include "isa/alu_ops.def"
#undef ALU
};
#define A(e) alu_bit(AluOp::e)
constexpr uint64_t kAluSetMask[] = {
#define ALU_SET(e, name, members) members,
#include "isa/alu_sets.def"
#undef ALU_SET
};
#undef A
constexpr const char* kAluSetName[] = {
#define ALU_SET(e, name, members) name,
#include "isa/alu_sets.def"
#undef ALU_SET
};
constexpr const char* kFlagNames[] = {
#define FLAG(e, name, meaning) name,
#include "isa/flags.def"
#undef FLAG
};
constexpr const char* kAct[] = {
#define ACT(e, name, ...) name,
#include "isa/act_funcs.def"
#undef ACT
};
constexpr double kAnyInput = std::numeric_limits<double>::infinity();
constexpr ActRange kActRange[] = {
#define ACT(e, name, lo, hi, magnitude) {lo, hi, (magnitude) != 0},
#include "isa/act_funcs.def"
#undef ACT
};
constexpr const char* kEngineNames[] = {"tensor", "vector", "scalar", "gpsimd", "sync"};

}  // namespace

#define SLOTS(...) __VA_ARGS__
#define SLOT(nm, bufs, dt, req, role) \
  make_slot(#nm, static_cast<uint8_t>(bufs), DtypeClass::k##dt, (req) != 0, SlotRole::k##role)
constexpr OpInfo kOpTable[kNumOpcodes] = {
#define OP(e, mn, eng, dflt, cost, slots) \
  make_op(Opcode::e, mn, static_cast<uint8_t>(eng), Engine::k##dflt, CostClass::cost, {slots}),
#include "isa/opcodes.def"
#undef OP
};
namespace {
constexpr OpInfo kMacroTable[kNumMacros] = {
#define MACRO(e, mn, eng, dflt, slots) \
  make_op(static_cast<Opcode>(0xff), mn, static_cast<uint8_t>(eng), Engine::k##dflt, CostClass::kStream, {slots}),
#include "isa/opcodes.def"
#undef MACRO
};
}  // namespace
#undef SLOT
#undef SLOTS

std::string_view engine_name(Engine e) { return kEngineNames[static_cast<int>(e)]; }
std::optional<Engine> engine_from_name(std::string_view s) {
  for (int i = 0; i < kNumEngines; ++i)
    if (s == kEngineNames[i]) return static_cast<Engine>(i);
  return std::nullopt;
}

std::string_view space_name(Space s) {
  switch (s) {
    case Space::kHbm: return "hbm";
    case Space::kSbuf: return "sbuf";
    case Space::kPsum: return "psum";
    case Space::kNone: break;
  }
  return "none";
}

bool dtype_class_accepts(DtypeClass c, DType t) {
  switch (c) {
    case DtypeClass::kAny: return true;
    case DtypeClass::kFloat: return dtype_is_float(t);
    case DtypeClass::kInt: return dtype_is_int(t);
    case DtypeClass::kF32: return t == DType::kFloat32;
    case DtypeClass::kMmIn:
      return t == DType::kFloat32 || t == DType::kTFloat32 || t == DType::kBFloat16 || t == DType::kFloat16 ||
             t == DType::kFloat8E4M3 || t == DType::kFloat8E4M3FN || t == DType::kFloat8E5M2 || dtype_is_mx_x4(t);
    case DtypeClass::kMmOut:
      // bf16 PSUM needs gen4 (checked by verify with Limits); 16-bit outputs also come from transpose mode.
      return t == DType::kFloat32 || t == DType::kBFloat16 || t == DType::kFloat16 || t == DType::kFloat8E4M3 ||
             t == DType::kFloat8E4M3FN || t == DType::kFloat8E5M2;
  }
  return false;
}

std::string_view dtype_class_name(DtypeClass c) {
  switch (c) {
    case DtypeClass::kAny: return "any dtype";
    case DtypeClass::kFloat: return "a float dtype";
    case DtypeClass::kInt: return "an integer dtype";
    case DtypeClass::kF32: return "float32";
    case DtypeClass::kMmIn: return "a matmul input dtype (fp32, tf32, bf16, fp16, fp8, MX x4)";
    case DtypeClass::kMmOut: return "a PSUM matmul output dtype";
  }
  return "?";
}

std::string_view alu_name(AluOp op) { return kAlu[static_cast<int>(op)].name; }
AluClass alu_class(AluOp op) { return kAlu[static_cast<int>(op)].cls; }
bool alu_reduce_legal(AluOp op) { return kAlu[static_cast<int>(op)].reduce; }
int alu_arity(AluOp op) { return kAlu[static_cast<int>(op)].arity; }
std::string_view alu_class_name(AluClass c) {
  switch (c) {
    case AluClass::kArith: return "arith";
    case AluClass::kBitVec: return "bitvec";
    case AluClass::kUnary: return "unary";
    case AluClass::kCompare: return "compare";
    case AluClass::kLogical: return "logical";
    case AluClass::kSpecial: return "special";
  }
  return "?";
}
std::string_view slot_role_name(SlotRole r) {
  switch (r) {
    case SlotRole::kIn: return "in";
    case SlotRole::kOut: return "out";
    case SlotRole::kVecIn: return "vec_in";
    case SlotRole::kVecOut: return "vec_out";
  }
  return "?";
}
uint64_t alu_set_mask(AluSet s) { return kAluSetMask[static_cast<size_t>(s)]; }
std::string_view alu_set_name(AluSet s) { return kAluSetName[static_cast<size_t>(s)]; }
std::string alu_set_members(AluSet s) {
  std::string out;
  for (int i = 0; i < kNumAluOps; ++i)
    if (alu_in_set(static_cast<AluOp>(i), s)) {
      if (!out.empty()) out += ", ";
      out += alu_name(static_cast<AluOp>(i));
    }
  return out;
}
std::string_view flag_name(int bit) { return bit >= 0 && bit < kNumFlags ? kFlagNames[bit] : "?"; }
std::optional<AluOp> alu_from_name(std::string_view s) {
  for (size_t i = 0; i < std::size(kAlu); ++i)
    if (s == kAlu[i].name) return static_cast<AluOp>(i);
  return std::nullopt;
}
ActRange act_valid_range(ActFunc f) { return kActRange[static_cast<size_t>(f)]; }

std::string_view act_name(ActFunc f) { return kAct[static_cast<int>(f)]; }
std::optional<ActFunc> act_from_name(std::string_view s) {
  for (size_t i = 0; i < std::size(kAct); ++i)
    if (s == kAct[i]) return static_cast<ActFunc>(i);
  return std::nullopt;
}

std::span<const OpInfo> op_table() { return kOpTable; }
std::span<const OpInfo> macro_table() { return kMacroTable; }
const OpInfo& macro_info(Macro m) { return kMacroTable[static_cast<size_t>(m)]; }
const OpInfo* macro_from_name(std::string_view mnemonic) {
  for (const OpInfo& i : kMacroTable)
    if (mnemonic == i.mnemonic) return &i;
  return nullptr;
}
std::optional<Opcode> opcode_from_name(std::string_view mnemonic) {
  for (const OpInfo& i : kOpTable)
    if (mnemonic == i.mnemonic) return i.op;
  return std::nullopt;
}

// ---------------------------------------------------------------- Operand

std::pair<int64_t, int64_t> Operand::byte_extent() const {
  const int64_t eb = dtype_bytes(dtype);
  int64_t lo = 0, hi = 0;  // element offsets relative to `offset`
  for (int d = 0; d < nfree; ++d) {
    const auto i = static_cast<size_t>(d);
    if (size[i] <= 0) return {offset, offset};
    const int64_t span = stride[i] * (size[i] - 1);
    if (span < 0) lo += span; else hi += span;
  }
  if (space == Space::kHbm && num_partitions > 0) {
    const int64_t span = partition_step * (static_cast<int64_t>(num_partitions) - 1);
    if (span < 0) lo += span; else hi += span;
  }
  return {offset + lo * eb, offset + (hi + 1) * eb};
}

int64_t Operand::inner_stride_bytes() const {
  if (nfree == 0) return 0;
  return stride[static_cast<size_t>(nfree - 1)] * dtype_bytes(dtype);
}

int64_t Operand::contiguous_runs_per_partition() const {
  // Merge free dims from the innermost outwards while they stay contiguous; size-1 dims never break
  // contiguity whatever their stride.
  int64_t run = 1;  // elements in one contiguous run
  for (int d = nfree - 1; d >= 0; --d) {
    const auto i = static_cast<size_t>(d);
    if (size[i] == 1) continue;
    if (stride[i] != run) break;
    run *= size[i];
  }
  return std::max<int64_t>(1, elems_per_partition() / run);
}

namespace {
// Operand::str() appended to `out` (disassemble() writes every operand into one buffer).
void operand_to(const Operand& o, fmt::memory_buffer& out) {
  if (!o.present()) {
    out.push_back('-');
    return;
  }
  auto it = std::back_inserter(out);
  fmt::format_to(it, "{}@{}[{}:{}]+{}", dtype_name(o.dtype), space_name(o.space), o.start_partition,
                 o.start_partition + o.num_partitions, o.offset);
  if (o.space == Space::kHbm) fmt::format_to(it, " pstep={}", o.partition_step);
  out.append(std::string_view(" ["));
  for (int d = 0; d < o.nfree; ++d) fmt::format_to(it, "{}{}", d ? "," : "", o.size[static_cast<size_t>(d)]);
  out.append(std::string_view("]["));
  for (int d = 0; d < o.nfree; ++d) fmt::format_to(it, "{}{}", d ? "," : "", o.stride[static_cast<size_t>(d)]);
  out.push_back(']');
}
}  // namespace

std::string Operand::str() const {
  fmt::memory_buffer b;
  operand_to(*this, b);
  return fmt::to_string(b);
}

Operand Operand::tile(Space space, DType dt, int64_t offset, uint32_t start_partition, uint32_t num_partitions,
                      std::initializer_list<int64_t> free_sizes) {
  Operand o;
  o.space = space;
  o.dtype = dt;
  o.offset = offset;
  o.start_partition = static_cast<uint16_t>(start_partition);
  o.num_partitions = num_partitions;
  o.nfree = static_cast<uint8_t>(std::min<size_t>(free_sizes.size(), kMaxFreeDims));
  size_t i = 0;
  for (int64_t s : free_sizes) {
    if (i >= kMaxFreeDims) break;
    o.size[i++] = s;
  }
  int64_t st = 1;
  for (int d = o.nfree - 1; d >= 0; --d) {
    o.stride[static_cast<size_t>(d)] = st;
    st *= o.size[static_cast<size_t>(d)];
  }
  if (space == Space::kHbm) o.partition_step = st;
  return o;
}

std::pair<int64_t, int64_t> slot_extent(const Instr& in, int slot) {
  const Operand& o = in.slot(slot);
  auto ext = o.byte_extent();
  if (slot == indirect_slot(in)) {
    const int64_t shift = static_cast<int64_t>(std::max(in.iimm[0] - 1, 0)) * std::max(in.iimm[1], 0);
    ext.second += shift * dtype_bytes(o.dtype);
  }
  return ext;
}

Instr make_instr(Opcode op, Engine engine, std::initializer_list<Operand> operands, uint32_t loc) {
  Instr in;
  in.op = op;
  in.engine = engine;
  in.loc = loc;
  size_t i = 0;
  for (const Operand& o : operands) {
    if (i >= in.opnd.size()) break;
    in.opnd[i++] = o;
  }
  return in;
}

// ---------------------------------------------------------------- disassembly

std::string disassemble(const Instr& in) {
  // One buffer for the whole text (the trace formats one per instruction).
  const OpInfo& info = op_info(in.op);
  fmt::memory_buffer b;
  auto it = std::back_inserter(b);
  fmt::format_to(it, "{}.{}", info.mnemonic, engine_name(in.engine));
  switch (info.cost) {
    case CostClass::kActivation:
    case CostClass::kActivationReduce: fmt::format_to(it, " func={}", act_name(in.act)); break;
    case CostClass::kDma:
    case CostClass::kDmaTranspose: fmt::format_to(it, " queue={}", in.dma_queue); break;
    default:
      if (in.alu0 != AluOp::kBypass) fmt::format_to(it, " op0={}", alu_name(in.alu0));
      if (in.alu1 != AluOp::kBypass) fmt::format_to(it, " op1={}", alu_name(in.alu1));
  }
  if (in.flags & kAccumulate) b.append(std::string_view(" acc"));
  if ((in.op == Opcode::kLoadStationary || in.op == Opcode::kMultiplyMoving) && in.iimm[2] > 0)  // PE tiling
    fmt::format_to(it, " tile=[{}:{}, {}:{}]", in.iimm[0], in.iimm[0] + in.iimm[2], in.iimm[1], in.iimm[1] + in.iimm[3]);
  for (int i = 0; i < info.num_slots; ++i) {
    const Operand& o = in.slot(i);
    if (!o.present()) continue;
    fmt::format_to(it, " {}=", info.slots[static_cast<size_t>(i)].name);
    operand_to(o, b);
  }
  return fmt::to_string(b);
}

// ---------------------------------------------------------------- verification

namespace {

[[noreturn]] void fail(ErrorCode code, const Instr& in, const SourceLoc& where, const std::string& msg) {
  throw Error(code, fmt::format("{}: {}", op_info(in.op).mnemonic, msg), where);
}

int64_t capacity_of(Space s, const Limits& lim) {
  switch (s) {
    case Space::kSbuf: return lim.sbuf_bytes_per_partition;
    case Space::kPsum: return lim.psum_bytes_per_partition;
    case Space::kHbm: return lim.hbm_bytes;
    case Space::kNone: break;
  }
  return 0;
}

void verify_operand(const Instr& in, const SlotInfo& slot, const Operand& o, const Limits& lim,
                    const SourceLoc& where) {
  const char* nm = slot.name;
  if (!(slot.buffers & space_bit(o.space))) {
    std::string allowed;
    for (Space s : {Space::kHbm, Space::kSbuf, Space::kPsum})
      if (slot.buffers & space_bit(s)) allowed += fmt::format("{}{}", allowed.empty() ? "" : "/", space_name(s));
    fail(ErrorCode::kBadBuffer, in, where,
         fmt::format("operand '{}' must be in {}, but got a tile in {}", nm, allowed, space_name(o.space)));
  }
  if (!dtype_class_accepts(slot.dtypes, o.dtype))
    fail(ErrorCode::kBadDtype, in, where,
         fmt::format("operand '{}' must have {}, but got {}", nm, dtype_class_name(slot.dtypes), dtype_name(o.dtype)));
  if (o.nfree > kMaxFreeDims)
    fail(ErrorCode::kBadAccessPattern, in, where, fmt::format("operand '{}' has {} free dims, at most 4", nm, o.nfree));
  for (int d = 0; d < o.nfree; ++d)
    if (o.size[static_cast<size_t>(d)] <= 0)
      fail(ErrorCode::kBadAccessPattern, in, where,
           fmt::format("operand '{}' free dim {} has size {}, expected >= 1", nm, d, o.size[static_cast<size_t>(d)]));
  if (o.num_partitions == 0)
    fail(ErrorCode::kBadAccessPattern, in, where, fmt::format("operand '{}' has 0 partitions", nm));
  if (o.space != Space::kHbm) {
    const int64_t pend = static_cast<int64_t>(o.start_partition) + o.num_partitions;
    if (o.num_partitions > static_cast<uint32_t>(lim.partitions))
      fail(ErrorCode::kTooManyPartitions, in, where,
           fmt::format("operand '{}' spans {} partitions, the limit is {}", nm, o.num_partitions, lim.partitions));
    if (pend > lim.partitions)
      fail(ErrorCode::kOutOfBounds, in, where,
           fmt::format("operand '{}' partitions [{}, {}) exceed the {} partitions of {}", nm, o.start_partition, pend,
                       lim.partitions, space_name(o.space)));
  }
  // One of the three checks that depend on an operand's offset: placement_of() mirrors them.
  auto [lo, hi] = o.byte_extent();
  const int64_t cap = capacity_of(o.space, lim);
  if (lo < 0 || hi > cap)
    fail(ErrorCode::kOutOfBounds, in, where,
         fmt::format("operand '{}' touches bytes [{}, {}) {}, outside the {} bytes of {}", nm, lo, hi,
                     o.space == Space::kHbm ? "of HBM" : "per partition", cap, space_name(o.space)));
}

// max8 / nc_find_index8 / nc_match_replace8 input sizes and the local_gather index count (spec 2.0, 2.3).
constexpr int64_t kTop8MinElems = 8;
constexpr int64_t kTop8MaxElems = 16384;
constexpr int64_t kLocalGatherMaxIndices = 4096;

/// MX (nki-api.md 2.3 quantize_mx / nc_matmul_mx): a scale belongs to a group of kMxGroupRows partitions
/// (x kMxValues packed values = 32 contraction values); group i sits on scale row (i / 4) * 32 + i % 4 of the
/// scale view (its source quadrant), whose start partition may be a quadrant start plus 0, 4, 8 or 12.
constexpr int64_t kMxGroupRows = 8;
constexpr int64_t kMxValues = 4;
constexpr int64_t kMxQuadrant = 32;
constexpr int64_t kMxGroupsPerQuadrant = kMxQuadrant / kMxGroupRows;

int64_t mx_scale_rows(int64_t data_rows) {
  const int64_t groups = data_rows / kMxGroupRows;
  return groups == 0 ? 0 : (groups - 1) / kMxGroupsPerQuadrant * kMxQuadrant + (groups - 1) % kMxGroupsPerQuadrant + 1;
}

/// dtype_is_mx_x4 as an inline table lookup from isa/dtypes.def: verify_mx asks it of every operand of every
/// instruction (the call was ~100 CPU instructions per simulated instruction).
constexpr bool kIsX4[] = {
#define DTYPE(e, name, bytes, is_float, is_signed, values) (values) == 4,
#include "isa/dtypes.def"
#undef DTYPE
};
inline bool is_x4(DType t) {
  const auto i = static_cast<size_t>(t);
  return i < std::size(kIsX4) && kIsX4[i];
}

/// The x4 dtype rules of every instruction and the shape rules of quantize_mx and of the MX matmul halves.
void verify_mx(const Instr& in, const Limits& lim, const SourceLoc& where) {
  const OpInfo& info = op_info(in.op);
  const bool quant = in.op == Opcode::kQuantizeMx;
  const bool ls = in.op == Opcode::kLoadStationary, mm = in.op == Opcode::kMultiplyMoving;
  const Operand& data = in.slot(ls ? 0 : 1);  // the x4 operand of a matmul half
  const bool mx_mm = (ls || mm) && data.present() && is_x4(data.dtype);
  // 1. No cast path: an x4 operand only where the MX ops take one, or in a copy to the same dtype.
  for (int i = 0; i < info.num_slots; ++i) {
    const Operand& o = in.slot(i);
    if (!o.present() || !is_x4(o.dtype)) continue;
    if ((quant && i == 0) || (ls && i == 0) || (mm && i == 1)) continue;
    if (is_dma(in.op) || in.op == Opcode::kSendrecv) {
      const Operand& other = in.slot(i == 0 ? 1 : 0);
      if (i < 2 && other.present() && other.dtype == o.dtype) continue;
      fail(ErrorCode::kMxNoCast, in, where,
           fmt::format("a copy between {} and {}: an MX x4 dtype has no cast path, copy it into the same dtype",
                       dtype_name(in.slot(0).dtype), dtype_name(in.slot(1).dtype)));
    }
    fail(ErrorCode::kMxNoCast, in, where,
         fmt::format("operand '{}' is {}: MX x4-packed data has no cast path (only quantize_mx writes it, "
                     "nc_matmul_mx reads it)", info.slots[static_cast<size_t>(i)].name, dtype_name(o.dtype)));
  }
  if ((is_dma(in.op) || in.op == Opcode::kSendrecv) && in.slot(1).present() && is_x4(in.slot(1).dtype) &&
      in.slot(0).dtype != in.slot(1).dtype)
    fail(ErrorCode::kMxNoCast, in, where,
         fmt::format("a copy from {} to {}: an MX x4 dtype has no cast path", dtype_name(in.slot(1).dtype),
                     dtype_name(in.slot(0).dtype)));
  if (!quant && !ls && !mm) return;
  const int scale_slot = quant ? 2 : ls ? 1 : 2;
  const Operand& scale = in.slot(scale_slot);
  const char* scale_name = info.slots[static_cast<size_t>(scale_slot)].name;
  if (!quant && !mx_mm) {
    if (scale.present())
      fail(ErrorCode::kBadDtype, in, where,
           fmt::format("operand '{}' is only for MX x4 inputs (nc_matmul_mx), but {} is {}", scale_name,
                       ls ? "stationary" : "moving", dtype_name(data.dtype)));
    return;
  }
  if (lim.generation < 4 || lim.mx_rate <= 0)
    fail(ErrorCode::kNotOnGeneration, in, where,
         fmt::format("MX (quantize_mx / nc_matmul_mx) needs gen4 (NeuronCore-v4, trn3), the config is gen{}",
                     lim.generation));
  if (mx_mm && (in.flags & (kDoubleRow | kIsTranspose)))
    fail(ErrorCode::kBadImmediate, in, where, "an MX matmul takes no double_row or transpose flag");
  // The data operand whose rows the scales cover: quantize_mx's src, the matmul's x4 input.
  const Operand& rows_of = quant ? in.slot(1) : data;
  const int64_t P = rows_of.num_partitions;
  if (quant) {
    const Operand& src = in.slot(1);
    const Operand& dst = in.slot(0);
    if (src.dtype != DType::kFloat16 && src.dtype != DType::kBFloat16)
      fail(ErrorCode::kBadDtype, in, where, fmt::format("src must be float16 or bfloat16, got {}", dtype_name(src.dtype)));
    if (dst.dtype != DType::kFloat8E5M2X4 && dst.dtype != DType::kFloat8E4M3FNX4)
      fail(ErrorCode::kBadDtype, in, where,
           fmt::format("dst must be float8_e5m2_x4 or float8_e4m3fn_x4, got {}", dtype_name(dst.dtype)));
    if (P % kMxQuadrant != 0)
      fail(ErrorCode::kShapeMismatch, in, where,
           fmt::format("src must have a multiple of {} partitions, got {}", kMxQuadrant, P));
    const int64_t F = src.elems_per_partition();
    if (F % kMxValues != 0)
      fail(ErrorCode::kShapeMismatch, in, where,
           fmt::format("src must have a multiple of {} elements per partition, got {}", kMxValues, F));
    if (dst.num_partitions != src.num_partitions || dst.elems_per_partition() != F / kMxValues)
      fail(ErrorCode::kShapeMismatch, in, where,
           fmt::format("dst must be [{}, {}] (src [{}, {}] packed 4 per element), got [{}, {}]", P, F / kMxValues, P, F,
                       dst.num_partitions, dst.elems_per_partition()));
  } else {
    if (P % kMxQuadrant != 0)
      fail(ErrorCode::kShapeMismatch, in, where,
           fmt::format("{} must have a multiple of {} partitions (K, packed rows), got {}", ls ? "stationary" : "moving",
                       kMxQuadrant, P));
    if (ls && data.elems_per_partition() % 2 != 0)
      fail(ErrorCode::kShapeMismatch, in, where,
           fmt::format("stationary free size M must be even, got {}", data.elems_per_partition()));
    if (!scale.present())
      fail(ErrorCode::kMissingOperand, in, where, fmt::format("operand '{}' is required with MX x4 input {}", scale_name,
                                                              dtype_name(data.dtype)));
  }
  // The scale view: uint8 / float8_e8m0fnu, one column per packed column, the rows of the placement rule.
  if (scale.dtype != DType::kUInt8 && scale.dtype != DType::kFloat8E8M0FNU)
    fail(ErrorCode::kBadDtype, in, where,
         fmt::format("operand '{}' must be float8_e8m0fnu or uint8, got {}", scale_name, dtype_name(scale.dtype)));
  const int64_t cols = quant ? in.slot(0).elems_per_partition() : data.elems_per_partition();
  if (scale.elems_per_partition() != cols)
    fail(ErrorCode::kShapeMismatch, in, where,
         fmt::format("operand '{}' needs {} elements per partition (one scale per packed column), got {}", scale_name,
                     cols, scale.elems_per_partition()));
  const int64_t need = mx_scale_rows(P);
  if (scale.num_partitions < need)
    fail(ErrorCode::kShapeMismatch, in, where,
         fmt::format("operand '{}' needs at least {} partitions: the scale of 8-row group i sits on row (i // 4) * 32 + "
                     "i % 4 of the view, and {} rows make {} groups; got {}", scale_name, need, P, P / kMxGroupRows,
                     scale.num_partitions));
  const int64_t off = scale.start_partition % kMxQuadrant;
  if (off % kMxGroupsPerQuadrant != 0 || off / kMxGroupsPerQuadrant >= kMxGroupsPerQuadrant)
    fail(ErrorCode::kShapeMismatch, in, where,
         fmt::format("operand '{}' starts at partition {}: a scale view starts at a quadrant start (0, 32, 64, 96) plus "
                     "0, 4, 8 or 12", scale_name, scale.start_partition));
}

/// Ops that take one input (unary arithmetic, invert, bypass) ignore their scalar operand, so it
/// may be absent (the semantics' ignores_operand).
bool ignores_operand(AluOp op) { return alu_arity(op) == 1; }

/// PE tiling of a load_stationary / multiply_moving (iimm = [row, col, rows, cols]; rows 0 = the whole array): tile
/// sizes are the smallest tile (Limits::row_tile_min / col_tile_min) x 2^k up to the array, positions multiples of
/// the size inside it, and the matmul's contraction K and stationary width M fit the tile (nki-api.md 2.1).
void verify_pe_tile(const Instr& in, const Limits& lim, const SourceLoc& where, int64_t k, int64_t m) {
  const int64_t row = in.iimm[0], col = in.iimm[1], rows = in.iimm[2], cols = in.iimm[3];
  if (rows == 0) return;
  const auto bad = [&](const char* what, int64_t pos, int64_t size, int64_t min, int64_t all) {
    bool ok = size >= min && min > 0 && all % size == 0 && size % min == 0 && pos >= 0 && pos % size == 0 &&
              pos + size <= all;
    for (int64_t v = size / std::max<int64_t>(min, 1); ok && v > 1; v /= 2) ok = v % 2 == 0;  // min x 2^k
    if (!ok)
      fail(ErrorCode::kBadArgument, in, where,
           fmt::format("PE tile {}: size {} at {} must be {} x 2^k up to {} at a multiple of the size inside the "
                       "array (tile_position / tile_size, iimm[0..3])", what, size, pos, min, all));
  };
  bad("rows", row, rows, lim.row_tile_min, lim.pe_rows);
  bad("columns", col, cols, lim.col_tile_min, lim.pe_cols);
  if (k > rows || m > cols)
    fail(ErrorCode::kMatmulLimit, in, where,
         fmt::format("a [{}, {}] (K x M) matmul does not fit its {} x {} PE tile", k, m, rows, cols));
  if ((in.flags & kDoubleRow) && cols < lim.pe_cols)
    fail(ErrorCode::kBadArgument, in, where, "double_row cannot use column tiling (a PE tile narrower than the array)");
}

/// Operand rules that depend on the op's flags and immediates (which operands it reads, the shape a
/// reduction or pattern implies): the rules the semantics (isa/semantics) need, stated here so that
/// timing-only runs and `nsim check` reject exactly what a numerics run rejects, with the same code.
void verify_operand_rules(const Instr& in, const SourceLoc& where) {
  const Operand& d = in.slot(0);
  auto need_operand = [&](int slot, bool needed, uint16_t imm_flag, const char* flag_name, AluOp op) {
    if (!needed || (in.flags & imm_flag) || in.slot(slot).present()) return;
    const char* nm = op_info(in.op).slots[static_cast<size_t>(slot)].name;
    fail(ErrorCode::kMissingOperand, in, where,
         op == AluOp::kBypass
             ? fmt::format("operand '{}' is required unless the {} flag gives an immediate", nm, flag_name)
             : fmt::format("operand '{}' is required by op '{}' unless the {} flag gives an immediate", nm,
                           alu_name(op), flag_name));
  };
  auto double_row_even = [&](const Operand& o, const char* what) {
    if ((in.flags & kDoubleRow) && o.elems_per_partition() % 2 != 0)
      fail(ErrorCode::kShapeMismatch, in, where,
           fmt::format("double_row {} needs [K, 2, {}], got {} elements per partition", what,
                       in.op == Opcode::kLoadStationary ? "M" : "N", o.elems_per_partition()));
  };
  // iota / affine_select: the pattern (iimm[2..9] = 4 x [step, num]) covers dst's elements.
  auto pattern_covers_dst = [&] {
    for (size_t k = 0; k < 4; ++k)
      if (in.iimm[3 + 2 * k] < 0)
        fail(ErrorCode::kShapeMismatch, in, where,
             fmt::format("pattern dim {} has negative num {}", k, in.iimm[3 + 2 * k]));
    int64_t total = 1;
    bool over = false;  // product beyond dst's elements (kept from overflowing)
    for (size_t k = 0; k < 4; ++k) {
      const int64_t num = in.iimm[3 + 2 * k];
      if (num == 0) { total = 0; over = false; break; }
      if (!over && total > d.elems_per_partition() / num) over = true;
      if (!over) total *= num;
    }
    if (over || total != d.elems_per_partition())
      fail(ErrorCode::kShapeMismatch, in, where,
           over ? fmt::format("pattern covers more than the {} elements per partition of dst", d.elems_per_partition())
                : fmt::format("pattern covers {} elements but dst has {} per partition", total,
                              d.elems_per_partition()));
  };
  // Element count of slot i must be n / in [lo, hi].
  auto elems_is = [&](int i, const char* nm, int64_t n) {
    if (in.slot(i).elems_per_partition() != n)
      fail(ErrorCode::kElementCountMismatch, in, where,
           fmt::format("{} needs {} elements per partition, got {}", nm, n, in.slot(i).elems_per_partition()));
  };
  auto elems_in = [&](int i, const char* nm, int64_t lo, int64_t hi) {
    const int64_t n = in.slot(i).elems_per_partition();
    if (n < lo || n > hi)
      fail(ErrorCode::kElementCountMismatch, in, where,
           fmt::format("{} needs {} to {} elements per partition, got {}", nm, lo, hi, n));
  };
  // The ScalarE/VectorE accumulator registers: one per partition, 128 of them.
  auto fits_registers = [&] {
    if (d.num_partitions > 128)
      fail(ErrorCode::kTooManyPartitions, in, where,
           fmt::format("{} partitions exceed the 128 registers", d.num_partitions));
  };

  // Bit-vector ops (bitwise, shifts) work on the bit patterns of integers: a float input is an error (nki-api.md 2.0
  // "Bit-vector ops (bitwise/shift) require integer dtypes", 4.3 "bit-vector ops on floats").
  auto bitvec_inputs_int = [&](std::initializer_list<int> inputs) {
    for (const AluOp op : {in.alu0, in.alu1}) {
      if (alu_class(op) != AluClass::kBitVec) continue;
      for (const int i : inputs)
        if (in.slot(i).present() && !dtype_is_int(in.slot(i).dtype))
          fail(ErrorCode::kBadDtype, in, where,
               fmt::format("op {} works on integer bit patterns: operand '{}' is {} (bit-vector ops need integer "
                           "dtypes; view the bits with an integer dtype)",
                           alu_name(op), op_info(in.op).slots[static_cast<size_t>(i)].name, dtype_name(in.slot(i).dtype)));
    }
  };

  switch (in.op) {
    case Opcode::kTensorScalar: {
      const bool has_op1 = in.alu1 != AluOp::kBypass;
      need_operand(2, !ignores_operand(in.alu0), kHasImm0, "has_imm0", in.alu0);
      need_operand(3, has_op1 && !ignores_operand(in.alu1), kHasImm1, "has_imm1", in.alu1);
      // nki-api.md 2.1: "op0 and op1 must both be arithmetic or both bit-vector"
      if (has_op1 && (alu_class(in.alu0) == AluClass::kBitVec) != (alu_class(in.alu1) == AluClass::kBitVec))
        fail(ErrorCode::kBadImmediate, in, where,
             fmt::format("op0 ({}) and op1 ({}) must both be arithmetic or both bit-vector ops", alu_name(in.alu0),
                         alu_name(in.alu1)));
      bitvec_inputs_int({1, 2, 3});
      break;
    }
    case Opcode::kTensorTensor:
      bitvec_inputs_int({1, 2});
      break;
    case Opcode::kScalarTensorTensor:
    case Opcode::kTensorScalarReduce:
      need_operand(2, !ignores_operand(in.alu0), kHasImm0, "has_imm0", in.alu0);
      if (in.op == Opcode::kTensorScalarReduce) fits_registers();
      break;
    case Opcode::kTensorCopyPredicated:
      need_operand(1, true, kHasImm0, "has_imm0", AluOp::kBypass);
      break;
    case Opcode::kActivation:
    case Opcode::kActivationReduce:
    case Opcode::kRangeSelect: fits_registers(); break;
    // ---- Tier 3 / section 2.4 ops (spec nki-api.md 2.3, 2.4)
    case Opcode::kMax8:
      elems_is(0, "dst", 8);
      elems_in(1, "src", kTop8MinElems, kTop8MaxElems);
      break;
    case Opcode::kNcFindIndex8:
      elems_is(0, "dst", 8);
      elems_in(1, "data", kTop8MinElems, kTop8MaxElems);
      elems_is(2, "vals", 8);
      break;
    case Opcode::kNcMatchReplace8:
      elems_in(1, "data", 1, kTop8MaxElems);
      elems_is(0, "dst", in.slot(1).elems_per_partition());
      elems_is(2, "vals", 8);
      if (in.slot(3).present()) elems_is(3, "dst_idx", 8);
      break;
    case Opcode::kTensorPartitionReduce: {
      const AluOp op = in.alu0;
      if (!alu_in_set(op, AluSet::kPartitionReduceOp))
        fail(ErrorCode::kBadImmediate, in, where,
             fmt::format("op must be one of {}, got {}", alu_set_members(AluSet::kPartitionReduceOp), alu_name(op)));
      if (alu_class(op) == AluClass::kBitVec && (!dtype_is_int(d.dtype) || !dtype_is_int(in.slot(1).dtype)))
        fail(ErrorCode::kBadDtype, in, where, fmt::format("op {} needs integer dtypes", alu_name(op)));
      break;
    }
    case Opcode::kSelectReduce: {
      fits_registers();
      need_operand(3, true, kHasImm0, "has_imm0", AluOp::kBypass);
      if (in.slot(1).space == Space::kPsum && in.slot(2).space == Space::kPsum)
        fail(ErrorCode::kBadBuffer, in, where, "predicate and on_true may not both be in psum");
      const AluOp rop = in.alu1;
      if (rop != AluOp::kBypass && !alu_in_set(rop, AluSet::kSelectReduceOp))
        fail(ErrorCode::kBadImmediate, in, where,
             fmt::format("reduce_op must be one of {}, got {}", alu_set_members(AluSet::kSelectReduceOp), alu_name(rop)));
      const DType t = in.slot(2).dtype;
      if (t == DType::kTFloat32 || t == DType::kInt32 || t == DType::kUInt32)
        fail(ErrorCode::kBadDtype, in, where, fmt::format("on_true may not be {}", dtype_name(t)));
      break;
    }
    case Opcode::kTensorScalarCumulative: {
      fits_registers();
      need_operand(2, !ignores_operand(in.alu0), kHasImm0, "has_imm0", in.alu0);
      const AluOp op1 = in.alu1;
      if (!alu_in_set(op1, AluSet::kCumulativeOp1))
        fail(ErrorCode::kBadImmediate, in, where,
             fmt::format("op1 must be one of {}, got {}", alu_set_members(AluSet::kCumulativeOp1), alu_name(op1)));
      for (int i = 0; i < 2; ++i) {
        const DType t = in.slot(i).dtype;
        if (t == DType::kInt32 || t == DType::kUInt32)
          fail(ErrorCode::kBadDtype, in, where,
               fmt::format("operand '{}' may not be {}", op_info(in.op).slots[static_cast<size_t>(i)].name,
                           dtype_name(t)));
      }
      break;
    }
    case Opcode::kSequenceBounds:
      if (d.num_partitions != 1 || in.slot(1).num_partitions != 1)
        fail(ErrorCode::kShapeMismatch, in, where,
             fmt::format("segment_ids and dst must have 1 partition, got {} and {}", in.slot(1).num_partitions,
                         d.num_partitions));
      elems_is(0, "dst", 2 * in.slot(1).elems_per_partition());
      break;
    case Opcode::kNcNGather:
      elems_is(0, "dst", in.slot(2).elems_per_partition());
      if (d.dtype != in.slot(1).dtype)
        fail(ErrorCode::kBadDtype, in, where,
             fmt::format("dst ({}) must have the dtype of data ({})", dtype_name(d.dtype), dtype_name(in.slot(1).dtype)));
      break;
    case Opcode::kTopk: {
      const Operand& src = in.slot(2);
      const int64_t n = in.iimm[0], k = d.elems_per_partition();
      if (src.num_partitions % kTopkGroup != 0)
        fail(ErrorCode::kShapeMismatch, in, where,
             fmt::format("src must have a multiple of {} partitions (one vector per group of {}), got {}", kTopkGroup,
                         kTopkGroup, src.num_partitions));
      if (d.dtype != DType::kBFloat16 || src.dtype != DType::kBFloat16)
        fail(ErrorCode::kBadDtype, in, where,
             fmt::format("src and dst must be bfloat16, got {} and {}", dtype_name(src.dtype), dtype_name(d.dtype)));
      if (in.slot(1).dtype != DType::kUInt32)
        fail(ErrorCode::kBadDtype, in, where, fmt::format("dst_idx must be uint32, got {}", dtype_name(in.slot(1).dtype)));
      if (n < kTopkMinN || n > kTopkMaxN)
        fail(ErrorCode::kShapeMismatch, in, where, fmt::format("n must be in [{}, {}], got {}", kTopkMinN, kTopkMaxN, n));
      if (n > static_cast<int64_t>(kTopkGroup) * src.elems_per_partition())
        fail(ErrorCode::kShapeMismatch, in, where,
             fmt::format("n = {} elements do not fit src: {} partitions x {} columns hold {} per group", n, kTopkGroup,
                         src.elems_per_partition(), kTopkGroup * src.elems_per_partition()));
      if (k < 1 || k > kTopkMaxK || k > n)
        fail(ErrorCode::kShapeMismatch, in, where,
             fmt::format("K (dst's elements per partition) must be in [1, min({}, n = {})], got {}", kTopkMaxK, n, k));
      elems_is(1, "dst_idx", k);
      break;
    }
    case Opcode::kNonzeroWithCount:
      elems_is(0, "dst", in.slot(1).elems_per_partition() + 1);
      if (d.dtype != DType::kInt32)
        fail(ErrorCode::kBadDtype, in, where, fmt::format("dst must be int32, got {}", dtype_name(d.dtype)));
      if (in.slot(1).dtype != DType::kInt32 && in.slot(1).dtype != DType::kFloat32)
        fail(ErrorCode::kBadDtype, in, where,
             fmt::format("src must be float32 or int32, got {}", dtype_name(in.slot(1).dtype)));
      break;
    case Opcode::kExponential:
      fits_registers();
      break;
    case Opcode::kActivate2: {
      fits_registers();
      need_operand(2, !ignores_operand(in.alu0), kHasImm0, "has_imm0", in.alu0);
      need_operand(3, !ignores_operand(in.alu1), kHasImm1, "has_imm1", in.alu1);
      // (op0, op1): (multiply, any of kActivate2MulOp1) or (any of kActivate2AddOp0, bypass) (spec nki-api.md 2.4)
      const AluOp a = in.alu0, b = in.alu1;
      const bool ok = (a == AluOp::kMultiply && alu_in_set(b, AluSet::kActivate2MulOp1)) ||
                      (alu_in_set(a, AluSet::kActivate2AddOp0) && b == AluOp::kBypass);
      if (!ok)
        fail(ErrorCode::kBadImmediate, in, where,
             fmt::format("(op0, op1) = ({}, {}) is not a supported pair", alu_name(a), alu_name(b)));
      const int r = in.iimm[0];
      const AluOp rop = static_cast<AluOp>(r);
      if (r < 0 || r >= kNumAluOps || (rop != AluOp::kBypass && !alu_in_set(rop, AluSet::kActivate2ReduceOp)))
        fail(ErrorCode::kBadImmediate, in, where,
             fmt::format("reduce op (iimm[0] = {}) must be one of {}", r, alu_set_members(AluSet::kActivate2ReduceOp)));
      break;
    }
    case Opcode::kDropout:
      need_operand(2, true, kHasImm0, "has_imm0", AluOp::kBypass);
      break;
    case Opcode::kLocalGather: {
      const int64_t e = in.iimm[0];
      if (e != 1 && e != 2 && e != 4 && e != 8 && e != 16 && e != 32)
        fail(ErrorCode::kBadImmediate, in, where, fmt::format("num_elem_per_idx must be 1, 2, 4, 8, 16 or 32, got {}", e));
      if (d.num_partitions % 16 != 0)
        fail(ErrorCode::kShapeMismatch, in, where,
             fmt::format("partitions must be a multiple of 16, got {}", d.num_partitions));
      const int64_t all = 16 * in.slot(2).elems_per_partition();
      const int64_t nv = in.iimm[1] == 0 ? all : in.iimm[1];
      if (nv < 1 || nv > all || nv > kLocalGatherMaxIndices)
        fail(ErrorCode::kBadImmediate, in, where,
             fmt::format("num_valid_indices {} must be in [1, {}] (16 x index elements per partition, at most {})", nv,
                         std::min(all, kLocalGatherMaxIndices), kLocalGatherMaxIndices));
      elems_is(0, "dst", nv * e);
      if (d.dtype != in.slot(1).dtype)
        fail(ErrorCode::kBadDtype, in, where,
             fmt::format("dst ({}) must have the dtype of src_buffer ({})", dtype_name(d.dtype),
                         dtype_name(in.slot(1).dtype)));
      break;
    }
    case Opcode::kTensorReduce: {
      const Operand& data = in.slot(1);
      const int nf = data.nfree;
      if (!alu_reduce_legal(in.alu0))  // nki-api.md 2.1 tensor_reduce "Legal ops" (isa/alu_ops.def reduce_legal)
        fail(ErrorCode::kBadImmediate, in, where, fmt::format("op {} is not a reduction operator", alu_name(in.alu0)));
      bitvec_inputs_int({1});
      const int k = in.axis_count == 0 ? nf : in.axis_count;
      if (k > nf)
        fail(ErrorCode::kShapeMismatch, in, where, fmt::format("cannot reduce {} free dims of a view with {}", k, nf));
      int64_t groups = 1;
      for (int i = 0; i < nf - k; ++i) groups *= data.size[static_cast<size_t>(i)];
      if (d.elems_per_partition() != groups)
        fail(ErrorCode::kElementCountMismatch, in, where,
             fmt::format("dst has {} elements per partition, the reduction leaves {}", d.elems_per_partition(), groups));
      break;
    }
    case Opcode::kBnStats:
      if (d.elems_per_partition() != 6)
        fail(ErrorCode::kElementCountMismatch, in, where,
             fmt::format("dst needs 6 elements per partition, got {}", d.elems_per_partition()));
      break;
    case Opcode::kBnAggr:
      if (d.elems_per_partition() != 2)
        fail(ErrorCode::kElementCountMismatch, in, where,
             fmt::format("dst needs 2 elements per partition, got {}", d.elems_per_partition()));
      if (in.slot(1).elems_per_partition() % 3 != 0)
        fail(ErrorCode::kElementCountMismatch, in, where,
             fmt::format("data needs (count, mean, M2) triples, got {} elements per partition",
                         in.slot(1).elems_per_partition()));
      break;
    case Opcode::kIota:
    case Opcode::kAffineSelect: pattern_covers_dst(); break;
    case Opcode::kLoadStationary: double_row_even(d, "stationary"); break;
    case Opcode::kMultiplyMoving: double_row_even(in.slot(1), "moving"); break;
    case Opcode::kNcStreamShuffle: {
      const int64_t ps = in.slot(1).num_partitions, pd = d.num_partitions;
      const int64_t quads = (std::max(ps, pd) + 31) / 32;
      for (int64_t q = 0; q < quads; ++q)
        for (int64_t i = 0; i < 32; ++i) {
          const int m = in.shuffle[static_cast<size_t>(i)];
          if (m == 255 || q * 32 + i >= pd) continue;
          if (q * 32 + m >= ps)
            fail(ErrorCode::kShapeMismatch, in, where,
                 fmt::format("shuffle_mask[{}] = {} reads source row {} but src has {} partitions", i, m, q * 32 + m,
                             ps));
        }
      break;
    }
    default: break;
  }
}

/// The runtime offsets (slot 2) of an indirect dma_copy or a dynamic tensor_copy: int32/uint32, one (1, 1)
/// value (kIndirectScalar) or one per equal row of the indirect side, an index bound iimm[0] >= 1 and a stride
/// iimm[1] >= 0, and every in-range index keeps the indirect side inside its buffer (slot_extent). Without
/// offsets, none of the indirect flags.
void verify_offsets(const Instr& in, const Limits& lim, const SourceLoc& where) {
  const int side = indirect_slot(in);
  if (side < 0) {
    if (in.flags & (kIndirectDst | kIndirectScalar | kOobSkip | kUniqueIdx))
      fail(ErrorCode::kMissingOperand, in, where, "indirect flags need the 'offsets' operand");
    return;
  }
  if ((in.flags & kUniqueIdx) && (in.op != Opcode::kDmaCopy || side != 0 || !(in.flags & kAccumulate)))
    fail(ErrorCode::kBadArgument, in, where,
         "the unique_indices flag belongs to a dma_copy accumulating into its indirect dst (a scatter-add)");
  const Operand& ind = in.slot(side);
  const Operand& off = in.slot(2);
  if (off.dtype != DType::kInt32 && off.dtype != DType::kUInt32)
    fail(ErrorCode::kBadDtype, in, where, fmt::format("offsets must be int32 or uint32, got {}", dtype_name(off.dtype)));
  const bool scalar = (in.flags & kIndirectScalar) != 0;
  if (scalar ? off.total_elems() != 1
             : (off.elems_per_partition() != 1 || off.num_partitions == 0 || ind.total_elems() % off.num_partitions))
    fail(ErrorCode::kShapeMismatch, in, where,
         scalar ? fmt::format("a scalar offset must be one (1, 1) element, got [{}, {}]", off.num_partitions,
                              off.elems_per_partition())
                : fmt::format("offsets must be (R, 1), one row index per equal row of the {} elements of the "
                              "indirect side, got [{}, {}]",
                              ind.total_elems(), off.num_partitions, off.elems_per_partition()));
  if (in.iimm[0] < 1 || in.iimm[1] < 0)
    fail(ErrorCode::kBadImmediate, in, where,
         fmt::format("an indirect access needs iimm[0] (index bound) >= 1 and iimm[1] (index stride) >= 0, "
                     "got {} and {}", in.iimm[0], in.iimm[1]));
  const auto [lo, hi] = slot_extent(in, side);  // offset-dependent: placement_of() mirrors this check
  const int64_t cap = capacity_of(ind.space, lim);
  if (ind.space != Space::kHbm && hi > cap)  // HBM: the simulator checks the tensor's own bounds (E201)
    fail(ErrorCode::kOutOfBounds, in, where,
         fmt::format("operand '{}': an index up to iimm[0] - 1 = {} moves it by up to {} elements, to bytes [{}, {}) "
                     "per partition, outside the {} bytes of {}",
                     op_info(in.op).slots[static_cast<size_t>(side)].name, in.iimm[0] - 1,
                     static_cast<int64_t>(in.iimm[0] - 1) * in.iimm[1], lo, hi, cap, space_name(ind.space)));
}

}  // namespace

Engine default_engine(const Instr& in) {
  if (in.op == Opcode::kTensorTensor) {
    bool ints = true;
    for (int i = 0; i < 3; ++i) {
      const Operand& o = in.slot(i);
      ints &= o.present() && (o.dtype == DType::kInt32 || o.dtype == DType::kUInt32) && o.space != Space::kPsum;
    }
    if (ints || in.alu0 == AluOp::kPower) return Engine::kGpsimd;  // (power: GpSimd only, nki-api.md 3.5)
  }
  return op_info(in.op).default_engine;
}

std::optional<RuleBreak> matmul_input_rule(DType t, std::string_view what, const Limits& lim, bool double_row,
                                           bool transpose) {
  if (!transpose && t == DType::kFloat8E4M3FN && lim.generation < 4)
    return RuleBreak{ErrorCode::kNotOnGeneration,
                     fmt::format("float8_e4m3fn matmul inputs need gen4 (trn3), this core is nc_version {}; use "
                                 "float8_e4m3 (max 240) on gen2/gen3", lim.generation)};
  if (!double_row) return std::nullopt;
  if (!lim.fp8_double_row)
    return RuleBreak{ErrorCode::kNotOnGeneration,
                     fmt::format("perf_mode=double_row needs the fp8 double-row mode of gen3 and later (trn2, trn3; "
                                 "tensor.fp8_double_row), which this core (nc_version {}) does not have; use "
                                 "perf_mode=none (two matmuls of K = 128)", lim.generation)};
  if (t != DType::kFloat8E4M3 && t != DType::kFloat8E5M2 && t != DType::kFloat8E4M3FN)
    return RuleBreak{ErrorCode::kBadDtype,
                     fmt::format("perf_mode=double_row takes fp8 inputs (float8_e4m3, float8_e5m2; float8_e4m3fn on "
                                 "gen4), {} is {}; quantize it to fp8 or use perf_mode=none", what, dtype_name(t))};
  return std::nullopt;
}

std::optional<RuleBreak> matmul_dtype_rule(DType stationary, DType moving, const Limits& lim, bool double_row,
                                           bool transpose) {
  if (!transpose) {
    const auto wide = [](DType t) { return t == DType::kFloat32 || t == DType::kTFloat32; };
    if (wide(stationary) != wide(moving))
      return RuleBreak{ErrorCode::kBadDtype,
                       fmt::format("stationary is {} and moving is {}: an fp32/tf32 input needs an fp32/tf32 partner; "
                                   "cast the other operand to float32, or this one to bfloat16",
                                   dtype_name(stationary), dtype_name(moving))};
    const auto e4m3 = [](DType a, DType b) { return a == DType::kFloat8E4M3 && b == DType::kFloat8E4M3FN; };
    if (lim.generation >= 4 && (e4m3(stationary, moving) || e4m3(moving, stationary)))
      return RuleBreak{ErrorCode::kBadDtype,
                       fmt::format("stationary is {} and moving is {}: float8_e4m3 and float8_e4m3fn cannot be mixed in "
                                   "one matmul", dtype_name(stationary), dtype_name(moving))};
  }
  if (auto r = matmul_input_rule(stationary, "stationary", lim, double_row, transpose)) return r;
  return matmul_input_rule(moving, "moving", lim, double_row, transpose);
}

void verify(const Instr& in, const Limits& lim, const SourceLoc& where) {
  if (static_cast<int>(in.op) >= kNumOpcodes)
    throw Error(ErrorCode::kUnknownOpcode, fmt::format("unknown opcode {}", static_cast<int>(in.op)), where);
  const OpInfo& info = op_info(in.op);
  if (static_cast<int>(in.engine) >= kNumEngines || !(info.engines & engine_bit(in.engine))) {
    std::string allowed;
    for (int e = 0; e < kNumEngines; ++e)
      if (info.engines & (1u << e))
        allowed += fmt::format("{}{}", allowed.empty() ? "" : "/", engine_name(static_cast<Engine>(e)));
    fail(ErrorCode::kBadEngine, in, where,
         fmt::format("cannot run on engine {}, allowed: {}",
                     static_cast<int>(in.engine) < kNumEngines ? engine_name(in.engine) : "?", allowed));
  }
  for (int i = 0; i < info.num_slots; ++i) {
    const SlotInfo& slot = info.slots[static_cast<size_t>(i)];
    const Operand& o = in.slot(i);
    if (!o.present()) {
      if (slot.required) fail(ErrorCode::kMissingOperand, in, where, fmt::format("operand '{}' is required", slot.name));
      continue;
    }
    verify_operand(in, slot, o, lim, where);
  }
  for (int i = info.num_slots; i < kMaxSlots; ++i)
    if (in.slot(i).present()) fail(ErrorCode::kBadImmediate, in, where, fmt::format("unexpected operand #{}", i));

  verify_mx(in, lim, where);
  // gen4-only instructions (spec nki-api.md 2.4).
  if ((in.op == Opcode::kExponential || in.op == Opcode::kRand2 || in.op == Opcode::kActivate2) && lim.generation < 4)
    fail(ErrorCode::kNotOnGeneration, in, where, fmt::format("needs gen4 (NeuronCore-v4), the config is gen{}", lim.generation));
  if (in.op == Opcode::kRangeSelect && lim.generation < 3)  // spec nki-api.md 2.2: "range_select - Vector (gen3+)"
    fail(ErrorCode::kNotOnGeneration, in, where,
         fmt::format("needs gen3+ (trn2, trn3), the config is gen{}; mask with affine_select or an iota comparison",
                     lim.generation));
  if ((in.op == Opcode::kSendrecv || in.op == Opcode::kCoreBarrier) && lim.generation < 3)
    fail(ErrorCode::kNotOnGeneration, in, where,
         fmt::format("needs gen3+ (an LNC=2 launch on trn2 or trn3), the config is gen{}", lim.generation));

  // Engine restrictions of ALU ops (nki-api.md 2.1 tensor_scalar: "Scalar supports only (multiply, add),
  // (multiply, None), (add, None)"; 3.5: power on GpSimd only). The compiler model's placement asks verify() of
  // each candidate engine, so it honours them too; default_engine() puts power on GpSimd.
  if (in.op == Opcode::kTensorScalar && in.engine == Engine::kScalar) {
    const bool ok = (in.alu0 == AluOp::kMultiply && (in.alu1 == AluOp::kAdd || in.alu1 == AluOp::kBypass)) ||
                    (in.alu0 == AluOp::kAdd && in.alu1 == AluOp::kBypass);
    if (!ok)
      fail(ErrorCode::kBadEngine, in, where,
           fmt::format("ScalarE runs tensor_scalar as (multiply, add), (multiply, None) or (add, None) only, got ({}, "
                       "{}); use the vector engine",
                       alu_name(in.alu0), in.alu1 == AluOp::kBypass ? "None" : alu_name(in.alu1)));
  }
  if (in.op == Opcode::kTensorTensor && in.alu0 == AluOp::kPower && in.engine != Engine::kGpsimd)
    fail(ErrorCode::kBadEngine, in, where, "power runs on GpSimd only (nki-api.md 3.5); leave engine unset");

  // GpSimd has no PSUM access on any generation.
  if (in.engine == Engine::kGpsimd && !is_dma(in.op))
    for (int i = 0; i < info.num_slots; ++i)
      if (in.slot(i).space == Space::kPsum)
        fail(ErrorCode::kBadBuffer, in, where,
             fmt::format("operand '{}' is in psum, which GpSimd cannot access", info.slots[static_cast<size_t>(i)].name));

  const Operand& d = in.slot(0);
  auto require_same_partitions = [&](int i) {
    const Operand& o = in.slot(i);
    if (o.present() && o.num_partitions != d.num_partitions)
      fail(ErrorCode::kPartitionMismatch, in, where,
           fmt::format("operand '{}' has {} partitions but '{}' has {}", info.slots[static_cast<size_t>(i)].name,
                       o.num_partitions, info.slots[0].name, d.num_partitions));
  };
  auto require_same_elems = [&](int i) {
    const Operand& o = in.slot(i);
    if (o.present() && o.elems_per_partition() != d.elems_per_partition())
      fail(ErrorCode::kElementCountMismatch, in, where,
           fmt::format("operand '{}' has {} elements per partition but '{}' has {}",
                       info.slots[static_cast<size_t>(i)].name, o.elems_per_partition(), info.slots[0].name,
                       d.elems_per_partition()));
  };
  auto require_vector = [&](int i) {
    const Operand& o = in.slot(i);
    if (o.present() && o.elems_per_partition() != 1)
      fail(ErrorCode::kShapeMismatch, in, where,
           fmt::format("operand '{}' must be a (P, 1) vector, got {} elements per partition",
                       info.slots[static_cast<size_t>(i)].name, o.elems_per_partition()));
  };

  switch (in.op) {
    case Opcode::kRegisterLoad:  // a 32-bit register takes one element (spec nki-api.md 2.3)
      if (in.slot(0).total_elems() != 1)
        fail(ErrorCode::kShapeMismatch, in, where,
             fmt::format("register_load: src must be one element ([1] or [1, 1]), got {}", in.slot(0).total_elems()));
      break;
    case Opcode::kSendrecv:
      if (in.slot(0).dtype != in.slot(1).dtype || in.slot(0).num_partitions != in.slot(1).num_partitions ||
          in.slot(0).elems_per_partition() != in.slot(1).elems_per_partition())
        fail(ErrorCode::kShapeMismatch, in, where,
             fmt::format("sendrecv: dst [{}, {}] {} and src [{}, {}] {} must have the same shape and dtype",
                         in.slot(0).num_partitions, in.slot(0).elems_per_partition(), dtype_name(in.slot(0).dtype),
                         in.slot(1).num_partitions, in.slot(1).elems_per_partition(), dtype_name(in.slot(1).dtype)));
      break;
    case Opcode::kDmaCopy:
      if (in.slot(0).total_elems() != in.slot(1).total_elems())
        fail(ErrorCode::kElementCountMismatch, in, where,
             fmt::format("dst has {} elements but src has {}", in.slot(0).total_elems(), in.slot(1).total_elems()));
      if (in.slot(2).present()) {  // indirect (gather/scatter): row p of the HBM side moves by offsets x iimm[1]
        const Operand& ind = in.slot((in.flags & kIndirectDst) ? 0 : 1);
        if (ind.space != Space::kHbm)
          fail(ErrorCode::kBadBuffer, in, where,
               fmt::format("the indirect side ({}) must be in hbm, got {}", (in.flags & kIndirectDst) ? "dst" : "src",
                           space_name(ind.space)));
      }
      verify_offsets(in, lim, where);
      break;
    case Opcode::kTensorCopy:  // slot 2 (offsets): the runtime offset of tensor_copy_dynamic_src/dst, not a stream
      require_same_partitions(1);
      if (in.slot(2).present() && !(in.flags & kIndirectScalar))
        fail(ErrorCode::kShapeMismatch, in, where,
             "a dynamic tensor_copy takes one runtime offset for all partitions (the indirect_scalar flag)");
      verify_offsets(in, lim, where);
      break;
    case Opcode::kDmaTranspose: {
      // src [a, f] with f = m x c (iimm[0] = m, the middle elements of a 3-D / 4-D transpose; 0 or 1: 2-D) -> dst
      // [c, m x a] (isa/semantics/dma_transpose.cpp)
      const int64_t m = in.iimm[0], a = in.slot(1).num_partitions, f = in.slot(1).elems_per_partition();
      if (m < 0)
        fail(ErrorCode::kBadArgument, in, where, fmt::format("iimm[0] (middle elements) must be >= 0, got {}", m));
      const int64_t mm = std::max<int64_t>(m, 1);
      if (f % mm != 0 || in.slot(0).num_partitions != f / mm || in.slot(0).elems_per_partition() != mm * a)
        fail(ErrorCode::kShapeMismatch, in, where,
             mm == 1 ? fmt::format("dst must be the transpose of src [{}, {}], got [{}, {}]", a, f,
                                   in.slot(0).num_partitions, in.slot(0).elems_per_partition())
                     : fmt::format("dst must be the transpose of src [{}, {}, {}] (middle dims {} kept), [{}, {}, {}], "
                                   "got [{}, {}] per partition",
                                   a, mm, f / mm, mm, f / mm, mm, a, in.slot(0).num_partitions,
                                   in.slot(0).elems_per_partition()));
    }
      if (in.slot(0).dtype != in.slot(1).dtype)
        fail(ErrorCode::kBadDtype, in, where, "src and dst dtypes must be equal");
      break;
    case Opcode::kLoadStationary: {
      const Operand& s = in.slot(0);
      const int64_t k_max = static_cast<int64_t>(lim.pe_rows);
      const int64_t m = (in.flags & kDoubleRow) ? s.elems_per_partition() / 2 : s.elems_per_partition();
      if (s.num_partitions > k_max || m > lim.pe_cols)
        fail(ErrorCode::kMatmulLimit, in, where,
             fmt::format("stationary [{}, {}] exceeds the PE array ({} x {})", s.num_partitions, m, k_max, lim.pe_cols));
      verify_pe_tile(in, lim, where, s.num_partitions, m);
      if (!is_x4(s.dtype))
        if (auto r = matmul_input_rule(s.dtype, "stationary", lim, in.flags & kDoubleRow,
                                       in.flags & kIsTranspose))
          fail(r->code, in, where, r->message);
      break;
    }
    case Opcode::kMultiplyMoving: {
      const Operand& mv = in.slot(1);
      const int64_t n = (in.flags & kDoubleRow) ? mv.elems_per_partition() / 2 : mv.elems_per_partition();
      const bool bf16 = d.dtype == DType::kBFloat16 && !(in.flags & kIsTranspose);
      const int64_t nmax = bf16 ? lim.moving_fmax_bf16 : lim.moving_fmax;
      if (mv.num_partitions > static_cast<uint32_t>(lim.pe_rows))
        fail(ErrorCode::kMatmulLimit, in, where,
             fmt::format("moving has {} partitions (contraction), the PE array has {} rows", mv.num_partitions, lim.pe_rows));
      if (n > nmax)
        fail(ErrorCode::kMatmulLimit, in, where, fmt::format("moving free size {} exceeds {}", n, nmax));
      verify_pe_tile(in, lim, where, mv.num_partitions, d.num_partitions);
      if (!is_x4(mv.dtype))
        if (auto r = matmul_input_rule(mv.dtype, "moving", lim, in.flags & kDoubleRow,
                                       in.flags & kIsTranspose))
          fail(r->code, in, where, r->message);
      if (d.elems_per_partition() != n)
        fail(ErrorCode::kElementCountMismatch, in, where,
             fmt::format("dst has {} elements per partition, moving has {}", d.elems_per_partition(), n));
      if (d.dtype == DType::kBFloat16 && !(in.flags & kIsTranspose) && !lim.dst_bf16)  // tensor.dst_dtypes (spec 1.1)
        fail(ErrorCode::kNotOnGeneration, in, where,
             fmt::format("a bf16 PSUM dst needs gen4 (NeuronCore-v4), the config is gen{}; write float32", lim.generation));
      if (d.dtype != DType::kFloat32 && !(in.flags & kIsTranspose) && !(lim.dst_bf16 && d.dtype == DType::kBFloat16))
        fail(ErrorCode::kBadDtype, in, where, fmt::format("PSUM dst must be float32 on gen{}, got {}", lim.generation,
                                                          dtype_name(d.dtype)));
      if (lim.generation < 4) {  // one matmul writes within one 2 KiB bank (offset-dependent: placement_of)
        auto [lo, hi] = d.byte_extent();
        if (lim.psum_bank_bytes > 0 && lo / lim.psum_bank_bytes != (hi - 1) / lim.psum_bank_bytes)
          fail(ErrorCode::kPsumBankOverflow, in, where,
               fmt::format("dst bytes [{}, {}) cross a {}-byte PSUM bank boundary", lo, hi, lim.psum_bank_bytes));
      }
      break;
    }
    case Opcode::kNcTranspose: {
      const Operand& s = in.slot(1);
      const int64_t lim_dim = in.engine == Engine::kVector ? 32 : lim.pe_rows;
      if (s.num_partitions > lim_dim || s.elems_per_partition() > lim_dim)
        fail(ErrorCode::kShapeMismatch, in, where,
             fmt::format("transpose input [{}, {}] exceeds {} x {} on {}", s.num_partitions, s.elems_per_partition(),
                         lim_dim, lim_dim, engine_name(in.engine)));
      if (d.num_partitions != s.elems_per_partition() || d.elems_per_partition() != s.num_partitions)
        fail(ErrorCode::kShapeMismatch, in, where,
             fmt::format("dst must be [{}, {}], got [{}, {}]", s.elems_per_partition(), s.num_partitions,
                         d.num_partitions, d.elems_per_partition()));
      if (in.engine == Engine::kTensor && d.space != Space::kPsum)
        fail(ErrorCode::kBadBuffer, in, where, "dst of a TensorE transpose must be in psum");
      if (in.engine == Engine::kTensor && s.space != Space::kSbuf)
        fail(ErrorCode::kBadBuffer, in, where, "data of a TensorE transpose must be in sbuf");
      break;
    }
    case Opcode::kTensorReduce:
    case Opcode::kBnStats:
    case Opcode::kBnAggr:
    case Opcode::kIota:
    case Opcode::kMemset:
    case Opcode::kNcStreamShuffle:
      for (int i = 1; i < info.num_slots; ++i) {
        if (in.op != Opcode::kNcStreamShuffle) require_same_partitions(i);
      }
      if (in.op == Opcode::kNcStreamShuffle) require_same_elems(1);
      break;
    case Opcode::kQuantizeMx:  // shapes checked by verify_mx (the scale view has its own partitions)
      break;
    case Opcode::kTensorPartitionReduce:  // a reduction across partitions: dst is one row
      if (d.num_partitions != 1)
        fail(ErrorCode::kPartitionMismatch, in, where,
             fmt::format("dst must have 1 partition (the reduction across partitions), got {}", d.num_partitions));
      require_same_elems(1);
      break;
    default:
      for (int i = 1; i < info.num_slots; ++i) require_same_partitions(i);
      break;
  }

  // Element-count and vector-operand rules of the element-wise ops.
  switch (in.op) {
    case Opcode::kTensorCopy: require_same_elems(1); break;  // slot 2: the (1, 1) runtime offset
    case Opcode::kTensorTensor:
    case Opcode::kReciprocal:
    case Opcode::kTensorTensorScan:
    case Opcode::kScalarTensorTensor:
    case Opcode::kTensorCopyPredicated:
    case Opcode::kRangeSelect:
    case Opcode::kAffineSelect:
    case Opcode::kSelectReduce:
    case Opcode::kTensorScalarCumulative:
    case Opcode::kDropout:
      for (int i = 1; i < info.num_slots; ++i) {
        if (info.slots[static_cast<size_t>(i)].vector) require_vector(i);
        else require_same_elems(i);
      }
      break;
    case Opcode::kTensorScalar:
      require_same_elems(1);
      require_vector(2);
      require_vector(3);
      break;
    case Opcode::kActivation:
    case Opcode::kActivationReduce:
    case Opcode::kActivate2:
      require_same_elems(1);
      require_vector(2);
      require_vector(3);
      require_vector(4);
      break;
    case Opcode::kTensorScalarReduce:
    case Opcode::kExponential:
      require_same_elems(1);
      for (int i = 2; i < 5; ++i) require_vector(i);
      break;
    default: break;
  }
  // Two tensor inputs of a Vector instruction: at most one in PSUM (nki-api.md 2.0, 2.2: tensor_tensor, scalar_tensor_tensor,
  // tensor_tensor_scan, tensor_copy_predicated "not both in PSUM").
  {
    int a = -1, b = -1;
    switch (in.op) {
      case Opcode::kTensorTensor: a = 1, b = 2; break;
      case Opcode::kScalarTensorTensor: a = 1, b = 3; break;
      case Opcode::kTensorTensorScan: a = 1, b = 2; break;
      case Opcode::kTensorCopyPredicated: a = 1, b = 2; break;
      default: break;
    }
    if (a >= 0 && in.slot(a).space == Space::kPsum && in.slot(b).space == Space::kPsum)
      fail(ErrorCode::kBadBuffer, in, where,
           fmt::format("at most one of {}/{} may be in psum", info.slots[static_cast<size_t>(a)].name,
                       info.slots[static_cast<size_t>(b)].name));
  }
  // Copies that move bits: src and dst of one dtype (nki-api.md 2.2 tensor_copy_predicated, 2.3 nc_stream_shuffle).
  if ((in.op == Opcode::kTensorCopyPredicated || in.op == Opcode::kNcStreamShuffle) && in.slot(1).present() &&
      in.slot(1).dtype != d.dtype)
    fail(ErrorCode::kBadDtype, in, where,
         fmt::format("src ({}) and dst ({}) must have one dtype", dtype_name(in.slot(1).dtype), dtype_name(d.dtype)));
  // gen2 ScalarE (nki-api.md 2.1 activation, 2.2 activation_reduce, 3.5): a bias is a vector, none with reciprocal;
  // activation_reduce reduces by add only.
  if ((in.op == Opcode::kActivation || in.op == Opcode::kActivationReduce) && lim.generation < 3) {
    if (!in.slot(2).present() && in.imm[3] != 0.0f)
      fail(ErrorCode::kNotOnGeneration, in, where,
           "a scalar bias needs gen3+ (trn2, trn3); on gen2 give bias as a (P, 1) vector");
    if (in.act == ActFunc::kReciprocal && (in.slot(2).present() || in.imm[3] != 0.0f))
      fail(ErrorCode::kNotOnGeneration, in, where, "reciprocal takes no bias on gen2 (trn1)");
    if (in.op == Opcode::kActivationReduce && in.alu1 != AluOp::kAdd && in.alu1 != AluOp::kBypass)
      fail(ErrorCode::kNotOnGeneration, in, where,
           fmt::format("activation_reduce reduces by add only on gen2 (trn1), got {}", alu_name(in.alu1)));
  }
  verify_operand_rules(in, where);
}

// ---------------------------------------------------------------- signatures

namespace {
// A signature is compared as 64-bit words of the Instr under a mask of the bytes of its fields: no padding
// bytes (their values are unspecified), no operand offsets, no source location. One branch-free pass
// over the words (vectorised by the compiler) is much cheaper than field-by-field compares.
static_assert(std::is_trivially_copyable_v<Instr> && sizeof(Instr) % 8 == 0);
constexpr size_t kWords = sizeof(Instr) / 8;
using WordMask = std::array<uint64_t, kWords>;

constexpr void set_bytes(WordMask& m, size_t at, size_t n) {
  for (size_t b = at; b < at + n; ++b) m[b / 8] |= uint64_t{0xff} << (8 * (b % 8));
}

constexpr WordMask make_sig_mask() {
  WordMask m{};
#define NSIM_SIG_FIELD(f) set_bytes(m, offsetof(Instr, f), sizeof(Instr::f))
  NSIM_SIG_FIELD(op);
  NSIM_SIG_FIELD(engine);
  NSIM_SIG_FIELD(flags);
  NSIM_SIG_FIELD(alu0);
  NSIM_SIG_FIELD(alu1);
  NSIM_SIG_FIELD(act);
  NSIM_SIG_FIELD(reduce_cmd);
  NSIM_SIG_FIELD(dma_queue);
  NSIM_SIG_FIELD(axis_count);
  NSIM_SIG_FIELD(imm);
  NSIM_SIG_FIELD(iimm);
  NSIM_SIG_FIELD(shuffle);
#undef NSIM_SIG_FIELD
  for (size_t k = 0; k < static_cast<size_t>(kMaxSlots); ++k) {
    const size_t o = offsetof(Instr, opnd) + k * sizeof(Operand);
#define NSIM_SIG_OPERAND(f) set_bytes(m, o + offsetof(Operand, f), sizeof(Operand::f))
    NSIM_SIG_OPERAND(space);
    NSIM_SIG_OPERAND(dtype);
    NSIM_SIG_OPERAND(nfree);
    NSIM_SIG_OPERAND(start_partition);
    NSIM_SIG_OPERAND(num_partitions);
    NSIM_SIG_OPERAND(partition_step);
    NSIM_SIG_OPERAND(size);
    NSIM_SIG_OPERAND(stride);  // not offset
#undef NSIM_SIG_OPERAND
  }
  return m;  // not loc
}
constexpr WordMask kSigMask = make_sig_mask();
// Fields every operand of Instr::opnd has at these words (relative to the operand): space..num_partitions
// and size[0]: what signature_hash mixes in.
constexpr size_t kOperandWords = sizeof(Operand) / 8;
static_assert(sizeof(Operand) % 8 == 0 && offsetof(Instr, opnd) % 8 == 0 && offsetof(Operand, offset) == 16);
constexpr size_t kSize0Word = offsetof(Operand, size) / 8;

inline uint64_t word(const Instr& in, size_t i) {
  uint64_t v;
  std::memcpy(&v, reinterpret_cast<const unsigned char*>(&in) + 8 * i, 8);
  return v;
}
}  // namespace

// The compare runs on every instruction: 32-byte vectors where the CPU has them (chosen at load time).
// Four words per step, the steps unrolled (a loop counter cost as much as the compare in each step).
bool uses_accumulators(const Instr& in) {
  // The reduce_res slot of each opcode (-1: none), looked up once.
  static const std::array<int8_t, kNumOpcodes> reduce_res = [] {
    std::array<int8_t, kNumOpcodes> a{};
    for (int o = 0; o < kNumOpcodes; ++o) {
      a[static_cast<size_t>(o)] = -1;
      const OpInfo& info = op_info(static_cast<Opcode>(o));
      for (int i = 0; i < info.num_slots; ++i)
        if (std::string_view(info.slots[static_cast<size_t>(i)].name) == "reduce_res") a[static_cast<size_t>(o)] = static_cast<int8_t>(i);
    }
    return a;
  }();
  const int rr = reduce_res[static_cast<size_t>(in.op)];
  return in.reduce_cmd != ReduceCmd::kIdle || in.op == Opcode::kTensorScalarCumulative || (rr >= 0 && in.slot(rr).present());
}

__attribute__((target_clones("avx2", "default"))) bool same_signature(const Instr& a, const Instr& b) {
  using V = uint64_t __attribute__((vector_size(32)));
  constexpr size_t kSteps = kWords / 4;
  const auto* pa = reinterpret_cast<const unsigned char*>(&a);
  const auto* pb = reinterpret_cast<const unsigned char*>(&b);
  V diff{};
#pragma GCC unroll 32
  for (size_t i = 0; i < kSteps; ++i) {
    V x, y, m;
    std::memcpy(&x, pa + 32 * i, 32);
    std::memcpy(&y, pb + 32 * i, 32);
    std::memcpy(&m, &kSigMask[4 * i], 32);
    diff |= (x ^ y) & m;
  }
  uint64_t d = diff[0] | diff[1] | diff[2] | diff[3];
  for (size_t i = 4 * kSteps; i < kWords; ++i) d |= (word(a, i) ^ word(b, i)) & kSigMask[i];
  return d == 0;
}

uint64_t signature_hash(const Instr& in) {
  // A few words that tell apart the instructions of one kernel (op, engine, flags, ALU ops; the DMA queue,
  // reduced axes and immediates; each operand's space, dtype, partitions and first free size);
  // same_signature decides. (Without the queue, a kernel spreading its loads over four queues gave four
  // signatures of one hash, which evicted each other from their two-way set on every load.)
  constexpr uint64_t kMul = 0x9e3779b97f4a7c15ULL;
  static_assert(offsetof(Instr, dma_queue) / 8 == 1 && offsetof(Instr, imm) + sizeof(Instr::imm) <= 4 * 8);
  uint64_t h = word(in, 0) & kSigMask[0];
  for (size_t w = 1; w < 4; ++w) h = (h ^ (word(in, w) & kSigMask[w])) * kMul;
  for (size_t k = 0; k < static_cast<size_t>(kMaxSlots); ++k) {
    const size_t w = offsetof(Instr, opnd) / 8 + k * kOperandWords;
    h = (h ^ (word(in, w) & kSigMask[w])) * kMul;
    h = (h ^ (word(in, w + 1) & kSigMask[w + 1]) ^ (word(in, w + kSize0Word) << 32)) * kMul;
  }
  return h ^ (h >> 29);
}

Placement placement_of(const Instr& in, const Limits& lim) {
  // The three offset-dependent checks of verify(): verify_operand's bounds, the matmul bank rule and
  // verify_offsets' reach of an on-chip indirect side, as extents relative to the offsets.
  Placement p;
  const OpInfo& info = op_info(in.op);
  for (int i = 0; i < info.num_slots; ++i) {
    const Operand& o = in.slot(i);
    if (!o.present()) continue;
    Operand at0 = o;
    at0.offset = 0;
    const auto [lo, hi] = at0.byte_extent();
    p.slot[static_cast<size_t>(i)] = {lo, hi, capacity_of(o.space, lim)};
    p.present = static_cast<uint8_t>(p.present | (1u << i));
  }
  if (in.op == Opcode::kMultiplyMoving && lim.generation < 4 && lim.psum_bank_bytes > 0) p.bank = lim.psum_bank_bytes;
  if ((in.op == Opcode::kDmaCopy || in.op == Opcode::kTensorCopy)) {
    const int side = indirect_slot(in);
    if (side >= 0 && in.slot(side).space != Space::kHbm) {
      Instr at0 = in;
      at0.opnd[static_cast<size_t>(side)].offset = 0;
      p.indirect = side;
      p.indirect_hi = slot_extent(at0, side).second;
      p.indirect_cap = capacity_of(in.slot(side).space, lim);
    }
  }
  return p;
}

}  // namespace nsim::isa
