#pragma once
/// The modelled ISA, derived from isa/opcodes.def, isa/alu_ops.def, isa/act_funcs.def and isa/flags.def.
#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "isa/dtype.h"
#include "sim/error.h"

namespace nsim::isa {

/// Engines of one NeuronCore. DMA queues are not an Engine: DMA opcodes name their trigger engine.
enum class Engine : uint8_t { kTensor, kVector, kScalar, kGpsimd, kSync };
inline constexpr int kNumEngines = 5;
std::string_view engine_name(Engine e);  ///< "tensor", "vector", ...
std::optional<Engine> engine_from_name(std::string_view s);

/// Engine set bitmask used by the table.
inline constexpr uint8_t T = 1u << 0, V = 1u << 1, S = 1u << 2, G = 1u << 3, Y = 1u << 4;
inline constexpr uint8_t engine_bit(Engine e) { return static_cast<uint8_t>(1u << static_cast<int>(e)); }

/// Memory spaces; bitmask constants for slot legality.
enum class Space : uint8_t { kNone, kHbm, kSbuf, kPsum };
inline constexpr uint8_t HBM = 1u << 0, SBUF = 1u << 1, PSUM = 1u << 2;
inline constexpr uint8_t space_bit(Space s) { return s == Space::kNone ? 0 : static_cast<uint8_t>(1u << (static_cast<int>(s) - 1)); }
std::string_view space_name(Space s);  ///< "hbm", "sbuf", "psum"

/// Dtype classes a slot accepts.
enum class DtypeClass : uint8_t { kAny, kFloat, kInt, kF32, kMmIn, kMmOut };
bool dtype_class_accepts(DtypeClass c, DType t);
std::string_view dtype_class_name(DtypeClass c);

/// How an opcode's duration is computed: the cost functions (engines/*_cost.cpp, tensor_engine.cpp, the DMA
/// model) switch on the class of isa/opcodes.def, never on the opcode. kStream: max(MIN_II, passes * N).
enum class CostClass : uint8_t {
  kDma,             ///< DMA queues (memory/dma)
  kDmaTranspose,    ///< DMA with the transpose throughput factors
  kStream,          ///< plain streaming: max(MIN_II, passes * N) on any streaming engine
  kElementwise,     ///< tensor_copy / tensor_scalar: VectorE/ScalarE perf modes, GpSimd rsqrt factor
  kStreamReduce,    ///< VectorE: stream + MIN_II for the register reduction
  kTensorTensor,    ///< VectorE: two inputs, 2x mode for 16-bit SBUF inputs
  kScalarTensorTensor,  ///< VectorE: one pass at 2 cycles per element (1 in the bf16 subtract-multiply case)
  kScan,            ///< VectorE: 2 cycles per element, one pass
  kTensorReduce,    ///< VectorE: half the cycles for bf16 add/max
  kReciprocal,      ///< VectorE: vector.reciprocal_factor cycles per element
  kMemset,          ///< VectorE: half the cycles for a 16-bit zero fill
  kBnAggr,          ///< VectorE: vector.bn_aggr_factor cycles per element
  kActivation,      ///< ScalarE activation pipeline (+ MIN_II when it reduces)
  kActivationReduce,  ///< ScalarE activation that always reduces
  kStartOverhead,   ///< GpSimd: start overhead + N (iota, affine_select)
  kLoadStationary,  ///< TensorE
  kMultiplyMoving,  ///< TensorE
  kTranspose,       ///< TensorE PE transpose (VectorE: kStream)
  kBarrier,         ///< core_barrier: the cross-core rendezvous (engines/multicore)
  kRegisterLoad,    ///< register_load: a sequencer reads one 32-bit value from SBUF or HBM (sync.register_load_*)
  kQuantizeMx,      ///< VectorE: vector.quantize_mx_factor cycles per src element (quantize_mx, gen4)
  kExponential,     ///< VectorE: vector.exponential_factor cycles per element (exponential, gen4)
  kRand2,           ///< VectorE: vector.rand2_factor cycles per output element (rand2, gen4); GpSimd: kStream
  kTopk,            ///< GpSimd: gpsimd.topk_factor cycles per element of the n-vector, + K (topk)
};

enum class Opcode : uint8_t {
#define OP(e, mn, eng, dflt, cost, slots) e,
#include "isa/opcodes.def"
#undef OP
};
inline constexpr int kNumOpcodes = 0
#define OP(e, mn, eng, dflt, cost, slots) +1
#include "isa/opcodes.def"
#undef OP
    ;
/// Frontend ops (MACRO rows of isa/opcodes.def: nc_matmul), lowered to several instructions.
enum class Macro : uint8_t {
#define MACRO(e, mn, eng, dflt, slots) e,
#include "isa/opcodes.def"
#undef MACRO
};
inline constexpr int kNumMacros = 0
#define MACRO(e, mn, eng, dflt, slots) +1
#include "isa/opcodes.def"
#undef MACRO
    ;

enum class AluOp : uint8_t {
#define ALU(e, name, cls, red, arity) e,
#include "isa/alu_ops.def"
#undef ALU
};
inline constexpr int kNumAluOps = 0
#define ALU(e, name, cls, red, arity) +1
#include "isa/alu_ops.def"
#undef ALU
    ;
enum class AluClass : uint8_t { kArith, kBitVec, kUnary, kCompare, kLogical, kSpecial };
std::string_view alu_class_name(AluClass c);  ///< "arith", "bitvec", "unary", "compare", "logical", "special"
std::string_view alu_name(AluOp op);
std::optional<AluOp> alu_from_name(std::string_view s);
AluClass alu_class(AluOp op);
bool alu_reduce_legal(AluOp op);
/// 1: the op ignores its second operand (unary ops, bypass); 2: binary.
int alu_arity(AluOp op);
inline constexpr uint64_t alu_bit(AluOp op) { return uint64_t{1} << static_cast<int>(op); }
static_assert(kNumAluOps <= 64, "ALU sets are 64-bit masks");

/// ALU operators an instruction argument accepts (isa/alu_sets.def).
enum class AluSet : uint8_t {
#define ALU_SET(e, name, members) e,
#include "isa/alu_sets.def"
#undef ALU_SET
};
inline constexpr int kNumAluSets = 0
#define ALU_SET(e, name, members) +1
#include "isa/alu_sets.def"
#undef ALU_SET
    ;
uint64_t alu_set_mask(AluSet s);
inline bool alu_in_set(AluOp op, AluSet s) { return (alu_set_mask(s) & alu_bit(op)) != 0; }
std::string_view alu_set_name(AluSet s);  ///< "tensor_partition_reduce.op", ...
std::string alu_set_members(AluSet s);    ///< "add, average, maximum, ..." (for messages)

enum class ActFunc : uint8_t {
#define ACT(e, name, ...) e,
#include "isa/act_funcs.def"
#undef ACT
};
inline constexpr int kNumActFuncs = 0
#define ACT(e, name, ...) +1
#include "isa/act_funcs.def"
#undef ACT
    ;
std::string_view act_name(ActFunc f);
std::optional<ActFunc> act_from_name(std::string_view s);
/// The input range over which the hardware's activation function is valid (isa/act_funcs.def, spec 3.5):
/// [lo, hi], of |x| when `magnitude`; infinite bounds for a function valid everywhere.
struct ActRange {
  double lo, hi;
  bool magnitude;
};
ActRange act_valid_range(ActFunc f);

/// reduce_cmd of the accumulator registers (spec 2.0).
enum class ReduceCmd : uint8_t { kIdle = 0, kReset = 1, kReduce = 2, kResetReduce = 3, kLoadReduce = 4 };

inline constexpr int kMaxSlots = 5;
inline constexpr int kMaxFreeDims = 4;

/// Slot roles of isa/opcodes.def.
enum class SlotRole : uint8_t { kIn, kOut, kVecIn, kVecOut };
std::string_view slot_role_name(SlotRole r);  ///< "in", "out", "vec_in", "vec_out"

/// One operand slot of an opcode.
struct SlotInfo {
  const char* name;
  uint8_t buffers;  ///< bitmask of HBM/SBUF/PSUM
  DtypeClass dtypes;
  bool required;
  SlotRole role = SlotRole::kIn;
  bool written = false;  ///< role Out / VecOut: the instruction writes the slot
  bool vector = false;   ///< role VecIn / VecOut: a (P, 1) per-partition operand (operand0, bias, reduce_res...)
};

/// One row of the table.
struct OpInfo {
  Opcode op;
  const char* mnemonic;
  uint8_t engines;  ///< bitmask of T/V/S/G/Y
  Engine default_engine;
  CostClass cost;
  uint8_t num_slots;
  std::array<SlotInfo, kMaxSlots> slots;
};

extern const OpInfo kOpTable[kNumOpcodes];
inline const OpInfo& op_info(Opcode op) { return kOpTable[static_cast<size_t>(op)]; }
std::span<const OpInfo> op_table();
std::optional<Opcode> opcode_from_name(std::string_view mnemonic);
/// The MACRO rows (frontend ops such as nc_matmul); their `op` field is meaningless, `cost` unused.
std::span<const OpInfo> macro_table();
const OpInfo& macro_info(Macro m);
/// The MACRO row named `mnemonic`, nullptr when none.
const OpInfo* macro_from_name(std::string_view mnemonic);
/// Cost class kDma / kDmaTranspose.
inline bool is_dma(Opcode op) {
  const CostClass c = op_info(op).cost;
  return c == CostClass::kDma || c == CostClass::kDmaTranspose;
}

/// An access pattern: which bytes an operand touches. On-chip (SBUF/PSUM): partitions
/// [start_partition, start_partition + num_partitions), each with the same free pattern starting at
/// byte `offset` within the partition. HBM: dim 0 has `num_partitions` rows `partition_step`
/// elements apart starting at byte address `offset`. Free dims: sizes and strides in elements
/// (stride 0 = broadcast), outermost first. nfree = 0 means one element per partition.
struct Operand {
  Space space = Space::kNone;
  DType dtype = DType::kFloat32;
  uint8_t nfree = 0;
  uint16_t start_partition = 0;
  uint32_t num_partitions = 0;
  int64_t offset = 0;
  int64_t partition_step = 0;
  std::array<int64_t, kMaxFreeDims> size{};
  std::array<int64_t, kMaxFreeDims> stride{};

  bool present() const { return space != Space::kNone; }
  int64_t elems_per_partition() const {
    int64_t n = 1;
    for (int d = 0; d < nfree; ++d) n *= size[static_cast<size_t>(d)];
    return n;
  }
  int64_t total_elems() const { return elems_per_partition() * num_partitions; }
  /// Byte span [lo, hi) touched within one partition (on-chip) or overall (HBM); lo <= hi.
  std::pair<int64_t, int64_t> byte_extent() const;
  /// Innermost free stride in bytes (0 when nfree == 0).
  int64_t inner_stride_bytes() const;
  /// Number of maximal contiguous runs per partition (DMA descriptors).
  int64_t contiguous_runs_per_partition() const;
  std::string str() const;  ///< "bf16@sbuf[p0:128]+256 [64,1][8,128]"

  /// Contiguous [P, F0, F1...] pattern helper.
  static Operand tile(Space space, DType dt, int64_t offset, uint32_t start_partition, uint32_t num_partitions,
                      std::initializer_list<int64_t> free_sizes);
};

/// Instruction flags (isa/flags.def): bit i of Instr::flags is row i.
namespace flag_bit {
enum : int {
#define FLAG(e, name, meaning) e,
#include "isa/flags.def"
#undef FLAG
  kCount
};
}  // namespace flag_bit
enum InstrFlag : uint16_t {
#define FLAG(e, name, meaning) e = 1u << flag_bit::e,
#include "isa/flags.def"
#undef FLAG
};
inline constexpr int kNumFlags = flag_bit::kCount;
static_assert(kNumFlags <= 16, "Instr::flags is 16 bits");
/// Name of flag bit i (isa/flags.def), for kernel.json and disassembly.
std::string_view flag_name(int bit);

/// Default immediates of an op (frontend::Op, Instr::imm; kernel.json omits values equal to these): imm[2] is
/// the activation scale (1); iimm holds offset, channel_multiplier and four [step, num] pattern pairs with num 1.
inline constexpr std::array<float, 4> kImmDefault{0.0f, 0.0f, 1.0f, 0.0f};
inline constexpr std::array<int32_t, 10> kIimmDefault{0, 0, 0, 1, 0, 1, 0, 1, 0, 1};
/// The ops (kernel.json names) whose iimm entries may be index expressions of the enclosing loops, evaluated per
/// instance: the pattern of iota / affine_select (offset moving with a loop), and a matmul's PE tile
/// (iimm = [row, column, rows, columns], the position moving with a loop). Others take integers only.
inline constexpr std::array<std::string_view, 6> kIimmExprOps{"iota",      "affine_select",   "nc_matmul",
                                                              "nc_matmul_mx", "load_stationary", "multiply_moving"};
inline bool iimm_takes_exprs(std::string_view op) {
  for (std::string_view n : kIimmExprOps)
    if (n == op) return true;
  return false;
}

/// One instruction of the stream. Plain data, fixed size: the hot loop never allocates.
struct Instr {
  Opcode op = Opcode::kMemset;
  Engine engine = Engine::kVector;  ///< executing engine (trigger engine for DMA)
  uint16_t flags = 0;
  AluOp alu0 = AluOp::kBypass;      ///< op / op0 / reduce op of tensor_reduce / cmp_op of affine_select
  AluOp alu1 = AluOp::kBypass;      ///< op1 / reduce_op / comp_op1
  ActFunc act = ActFunc::kCopy;
  ReduceCmd reduce_cmd = ReduceCmd::kIdle;
  uint8_t dma_queue = 0;            ///< DMA queue id on every engine
  uint8_t axis_count = 0;           ///< tensor_reduce: number of trailing free dims reduced
  /// Scalars: [0] operand0 / value / on_false / initial / range_start, [1] operand1 / alpha /
  /// on_false / reduce_init, [2] activation scale (default 1), [3] activation bias (default 0).
  std::array<float, 4> imm = kImmDefault;
  /// iota/affine_select: offset, channel_multiplier, 4x[step, num]; dma_copy / tensor_copy with `offsets`:
  /// [0] index bound (valid indices are [0, bound)), [1] elements of the indirect side per index unit.
  std::array<int32_t, 10> iimm{};
  std::array<uint8_t, 32> shuffle{};///< nc_stream_shuffle mask (255 = keep)
  std::array<Operand, kMaxSlots> opnd{};
  uint32_t loc = 0;                 ///< index into the run's source-location table (0 = unknown)

  const Operand& slot(int i) const { return opnd[static_cast<size_t>(i)]; }
};

/// topk (spec nki-api.md 2.4): src vectors are spread over groups of kTopkGroup partitions ("snake"
/// order); n in [kTopkMinN, kTopkMaxN], K in [1, kTopkMaxK] and K <= n.
inline constexpr uint32_t kTopkGroup = 16;
inline constexpr int64_t kTopkMinN = 8;
inline constexpr int64_t kTopkMaxN = 65535;
inline constexpr int64_t kTopkMaxK = 32767;

/// The instructions that read or write the PRNG state (the list scheduler keeps them in order; their results differ
/// from call to call).
inline bool uses_rng(Opcode op) {
  return op == Opcode::kDropout || op == Opcode::kRng || op == Opcode::kSetRngSeed || op == Opcode::kRandSetState ||
         op == Opcode::kRandGetState || op == Opcode::kRand2;
}
/// Whether `in` uses its engine's accumulator registers (a reduce_cmd, a reduce_res slot, or
/// tensor_scalar_cumulative, which scans through them whatever its reduce_cmd).
bool uses_accumulators(const Instr& in);

/// The slot of the runtime-addressed side of an indirect dma_copy (HBM: gather/scatter) or of a dynamic
/// tensor_copy (on-chip: tensor_copy_dynamic_src/dst): 0 (dst) or 1 (src); -1 for every other instruction.
/// Both carry the runtime offsets in slot 2 ("offsets").
inline int indirect_slot(const Instr& in) {
  if ((in.op != Opcode::kDmaCopy && in.op != Opcode::kTensorCopy) || !in.opnd[2].present()) return -1;
  return (in.flags & kIndirectDst) ? 0 : 1;
}
/// A tensor_copy with a runtime address (tensor_copy_dynamic_src/dst, or the cost-only kDynamicAddr flag):
/// its busy time has the dynamic-copy floor (neuroncore.md 3.2, vector.dynamic_copy_cycles on every engine).
inline bool dynamic_copy(const Instr& in) {
  return in.op == Opcode::kTensorCopy && ((in.flags & kDynamicAddr) || in.opnd[2].present());
}
/// Byte extent of operand `slot` of `in` (Operand::byte_extent); for the indirect side (indirect_slot),
/// widened to every row an in-range runtime index may reach (dependencies cannot see the values).
std::pair<int64_t, int64_t> slot_extent(const Instr& in, int slot);

/// The engine an instruction runs on when its op names none: the op's default engine (isa/opcodes.def), except
/// a tensor_tensor whose operands are all int32 / uint32 outside PSUM, which runs on GpSimd (nki-api.md 2.1 and 3:
/// exact integer arithmetic, where VectorE's fp32 path loses precision above 2^24).
Engine default_engine(const Instr& in);

/// An instruction with its operands in slot order and default immediates.
Instr make_instr(Opcode op, Engine engine, std::initializer_list<Operand> operands, uint32_t loc = 0);

/// One-line disassembly, e.g. "tensor_tensor.vector op=add dst=fp32@sbuf[0:128]+0 [512] ...".
std::string disassemble(const Instr& in);

/// Hardware limits that operand verification needs: engines::CoreParams::limits() derives them from the
/// config; no defaults of their own.
struct Limits {
  int generation = 0;
  int partitions = 0;
  int64_t sbuf_bytes_per_partition = 0;
  int64_t psum_bytes_per_partition = 0;
  int64_t psum_bank_bytes = 0;
  int64_t hbm_bytes = 0;
  int pe_rows = 0;
  int pe_cols = 0;
  int row_tile_min = 0;  ///< PE tiling (load_stationary / multiply_moving iimm[0..3]): smallest row tile
  int col_tile_min = 0;  ///< ... and column tile
  int64_t moving_fmax = 0;
  int64_t moving_fmax_bf16 = 0;
  bool dst_bf16 = false;
  bool fp8_double_row = false;  ///< nc_matmul perf_mode=double_row available (tensor.fp8_double_row)
  int mx_rate = 0;  ///< MX matmul available when > 0 (gen4)
};

/// Check an instruction against the table and the limits: engine allowed, required slots present,
/// buffers and dtypes per slot, partition counts <= limit and matching, element counts, bounds of
/// every access pattern in its buffer, PSUM bank rules, matmul limits. Throws nsim::Error with the
/// opcode, slot, expected vs found; `where` is attached as the source location.
void verify(const Instr& in, const Limits& lim, const SourceLoc& where = {});

/// A rule an operation breaks: its error code and message (without the op's name, which the caller adds).
struct RuleBreak {
  ErrorCode code;
  std::string message;
};
/// nc_matmul's input dtype rules (nki-api.md 2.1 "Dtypes" and perf_mode), one operand at a time on a core of
/// `lim.generation`: float8_e4m3fn is a gen4 input; perf_mode double_row needs the fp8 double-row mode
/// (`lim.fp8_double_row`, tensor.fp8_double_row: gen3 and later) and fp8 inputs. `what` names the operand
/// ("stationary", "moving"); a transpose (is_transpose) takes any input dtype. nullopt when `t` may be used.
std::optional<RuleBreak> matmul_input_rule(DType t, std::string_view what, const Limits& lim, bool double_row,
                                           bool transpose);
/// The same for the pair, first the pairing rules: an fp32 / tf32 input needs an fp32 / tf32 partner, and
/// float8_e4m3 does not mix with float8_e4m3fn; then each input's rules (matmul_input_rule). Checked by the
/// kernel verifier for nc_matmul ops, by verify() per half (load_stationary, multiply_moving) and by the
/// Python tracer at the call's line (_nsim.matmul_dtype_rule): the one statement of these rules.
std::optional<RuleBreak> matmul_dtype_rule(DType stationary, DType moving, const Limits& lim, bool double_row,
                                           bool transpose);

/// The signature of an instruction: every field but its operands' offsets and its source location. The
/// instructions of one op or loop body usually share one; verify() gives them the same answer except for
/// the checks of the offsets (Placement), and every cost formula the same cost, so the simulator works them
/// out once per signature (engines/sig_cache.h). same_signature compares the fields (not padding bytes);
/// equal signatures have equal hashes.
bool same_signature(const Instr& a, const Instr& b);
uint64_t signature_hash(const Instr& in);

/// The checks of verify() that depend on the operands' offsets, worked out once for a signature that passed
/// verify(): each present operand's byte extent inside its buffer, a gen2/3 matmul's PSUM destination inside
/// one bank, the widened reach of an on-chip indirect side (verify_offsets). For an instruction `in` with
/// that signature, fits(in) is true exactly when verify(in) passes; when it is false, verify(in) throws the
/// error (tests/unit/isa/test_signature.cpp checks both on random offsets).
struct Placement {
  struct Bound {
    int64_t lo = 0, hi = 0;  ///< byte extent relative to the operand's offset
    int64_t cap = 0;         ///< offset + lo >= 0 and offset + hi <= cap
  };
  std::array<Bound, kMaxSlots> slot{};
  uint8_t present = 0;      ///< bit i: slot i is present (checked)
  int64_t bank = 0;         ///< > 0: slot 0's bytes [offset + lo, offset + hi) stay in one bank of this many bytes
  int indirect = -1;        ///< an on-chip indirect side: offset + indirect_hi <= its capacity
  int64_t indirect_hi = 0, indirect_cap = 0;
  bool fits(const Instr& in) const {
    for (int i = 0; i < kMaxSlots; ++i) {
      if (!(present & (1u << i))) continue;
      const Bound& b = slot[static_cast<size_t>(i)];
      const int64_t off = in.opnd[static_cast<size_t>(i)].offset;
      if (off + b.lo < 0 || off + b.hi > b.cap) return false;
    }
    if (bank > 0) {
      const int64_t off = in.opnd[0].offset;
      if ((off + slot[0].lo) / bank != (off + slot[0].hi - 1) / bank) return false;
    }
    if (indirect >= 0 && in.opnd[static_cast<size_t>(indirect)].offset + indirect_hi > indirect_cap) return false;
    return true;
  }
};
/// The Placement of `in`'s signature (call after verify(in, lim) passed).
Placement placement_of(const Instr& in, const Limits& lim);

}  // namespace nsim::isa
