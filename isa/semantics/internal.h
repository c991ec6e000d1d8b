#pragma once
/// Helpers shared by the per-opcode semantics files (not part of the public semantics API).
#include <cstdint>
#include <cstring>
#include <string>

#include "isa/semantics/semantics.h"

namespace nsim::isa::sem {

// ---- op properties, derived from the .def tables (no second list) ---------------------------

inline constexpr AluClass kAluClassTable[] = {
#define ALU(e, name, cls, red, arity) AluClass::k##cls,
#include "isa/alu_ops.def"
#undef ALU
};
inline constexpr uint8_t kAluArityTable[] = {
#define ALU(e, name, cls, red, arity) arity,
#include "isa/alu_ops.def"
#undef ALU
};
inline constexpr const char* kAluNameTable[] = {
#define ALU(e, name, cls, red, arity) name,
#include "isa/alu_ops.def"
#undef ALU
};
inline constexpr const char* kMnemonicTable[] = {
#define OP(e, mn, ...) mn,
#include "isa/opcodes.def"
#undef OP
};

inline AluClass cls_of(AluOp op) { return kAluClassTable[static_cast<size_t>(op)]; }
inline bool is_bitvec(AluOp op) { return cls_of(op) == AluClass::kBitVec; }
/// Ops of arity 1 (unary arithmetic, invert, logical_not, bypass): they ignore the second operand and
/// always apply to the tensor data, even when a reverse flag is set.
inline bool ignores_operand(AluOp op) { return kAluArityTable[static_cast<size_t>(op)] == 1; }
inline const char* alu_str(AluOp op) { return kAluNameTable[static_cast<size_t>(op)]; }
inline const char* mnemonic(const Instr& in) { return kMnemonicTable[static_cast<size_t>(in.op)]; }

/// op(data, operand), or op(operand, data) when `reverse` (unless the op ignores its operand).
inline float apply_rev(AluOp op, float data, float operand, bool reverse) {
  return (reverse && !ignores_operand(op)) ? alu_apply(op, operand, data) : alu_apply(op, data, operand);
}
inline int64_t apply_rev_int(AluOp op, int64_t data, int64_t operand, bool reverse) {
  return (reverse && !ignores_operand(op)) ? alu_apply_int(op, operand, data) : alu_apply_int(op, data, operand);
}
/// The bit pattern of an element of a narrow integer dtype read as int64 (read_row_int sign-extends int8 / int16):
/// what a logical right shift moves (nki-api.md 3.5 "right_shift | logical x >> y", 2.0 "operate on bit patterns
/// without casting": int8 -16 >> 1 is 120, not -8). Other dtypes as they are (int32 / uint32 are 32-bit patterns
/// already for alu_apply_int's 32-bit shift).
inline int64_t shift_pattern(DType t, int64_t x) {
  const int bytes = dtype_bytes(t);
  return dtype_is_int(t) && bytes < 4 ? static_cast<int64_t>(static_cast<uint64_t>(x) & ((uint64_t{1} << (8 * bytes)) - 1))
                                      : x;
}

/// Reduce op used by the accumulator registers: bypass (reduce_op not given) means add.
inline AluOp reduce_op_or_add(AluOp op) { return op == AluOp::kBypass ? AluOp::kAdd : op; }

/// Combine a row of fp32 values into one for the accumulator registers: sequential left fold from
/// y[0] (identity when n == 0); for subtract the row is summed, so acc = acc - sum(y) after
/// `acc = alu_apply(op, acc, reduce_fold(op, y, n))`.
float reduce_fold(AluOp op, const float* y, int64_t n);

/// fp32 immediate -> int64 for the bit-vector path (truncate toward zero; NaN -> 0; saturate).
int64_t imm_to_int(float v);

/// Immediate i of `in` as an integer, exactly: iimm[i] (an int32 bit pattern, which the frontends write for an
/// integer immediate of a bit-vector op or of an integer destination) when it rounds to imm[i] in float32 (as
/// int32 or as uint32), else imm_to_int(imm[i]) (a kernel.json that gives only imm; docs/kernel-json.md `iimm`).
int64_t int_immediate(const Instr& in, int i);

// ---- thread-local scratch (slot i is distinct storage; a later call with the same slot may
// reallocate and invalidate earlier pointers of that slot) -------------------------------------
float* fscratch(int slot, int64_t n);
int64_t* iscratch(int slot, int64_t n);
uint8_t* bscratch(int slot, int64_t n);

// ---- raw row access ------------------------------------------------------------------------
/// Copy partition p's elements (row-major over free dims) as raw bytes into out (elems*esz bytes).
void gather_bytes(const TileView& v, uint32_t p, uint8_t* out);
/// Write raw bytes (elems*esz) into partition p's elements.
void scatter_bytes(const TileView& v, uint32_t p, const uint8_t* in);
/// Element 0 of partition p widened to fp32 (the "(P,1) vector operand" read).
inline float scalar_f32(const TileView& v, uint32_t p) { return load_f32(v.dtype, v.at(p, 0)); }
inline int64_t scalar_int(const TileView& v, uint32_t p) { return load_int(v.dtype, v.at(p, 0)); }
inline int esz(const TileView& v) { return dtype_bytes(v.dtype); }

/// Narrow an fp32 value that was produced by widening an element of type t back to t preserving
/// NaN payloads where the format can represent them (bf16, fp16, fp32); else store_f32.
void store_exact(DType t, uint8_t* p, float v);

// ---- operand checks (throw nsim::Error) ----------------------------------------------------
[[noreturn]] void fail(ErrorCode code, const Instr& in, const std::string& msg);
void require(const Instr& in, const TileView& v, const char* name);
void require_same_partitions(const Instr& in, const TileView& a, const char* an, const TileView& b, const char* bn);
void require_same_elems(const Instr& in, const TileView& a, const char* an, const TileView& b, const char* bn);
/// Both checks.
inline void require_same_shape(const Instr& in, const TileView& a, const char* an, const TileView& b, const char* bn) {
  require_same_partitions(in, a, an, b, bn);
  require_same_elems(in, a, an, b, bn);
}
/// A "(P,1)" vector operand: at least the partitions of `ref`.
void require_vector(const Instr& in, const TileView& v, const char* name, const TileView& ref);

// ---- iota / affine_select pattern ----------------------------------------------------------
/// Fill out[0..elems) with iota values of partition p (int32 wrap, widened to int64).
/// Throws kShapeMismatch unless the pattern's product of nums equals `elems`.
void iota_row(const Instr& in, uint32_t p, int64_t elems, int64_t* out);

// ---- PRNG (rng, dropout, set_rng_seed, rand_set_state, rand_get_state) -----------------------
/// Next 64 random bits of an engine's stream (splitmix64 of a Weyl counter).
inline uint64_t rng_next(uint64_t& s) {
  s += 0x9E3779B97F4A7C15ull;
  uint64_t z = s;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
/// Uniform float in [0, 1) from the top 24 bits.
inline float rng_uniform(uint64_t& s) { return static_cast<float>(rng_next(s) >> 40) * (1.0f / 16777216.0f); }

// ---- MX (quantize_mx, the MX halves of nc_matmul_mx; isa/semantics/mx.cpp) -------------------
/// Row of the scale view that holds the scale of 8-row group g (its source quadrant's rows 0..3, isa::verify).
inline uint32_t mx_scale_row(int64_t group) { return static_cast<uint32_t>((group / 4) * 32 + group % 4); }
/// Decode an x4 tile data [K, C] with its scale view into out, row-major (4K) x C: out[(4k + q) * C + c] =
/// value q of data[k, c] x 2^(scale[row of group k / 8], c] - 127) (scale byte 255 = NaN).
void mx_decode(const Instr& in, const TileView& data, const TileView& scale, float* out);

// ---- ScalarE activation shared by activation and activation_reduce --------------------------
void activation_impl(const Instr& in, const Views& v, ArchState& st, ReduceCmd cmd);

}  // namespace nsim::isa::sem
