#pragma once
/// Functional meaning of every opcode, on resolved tile views. One file per opcode in this folder
/// (isa/semantics/<mnemonic>.cpp defines exec_<Enum>); dispatch is generated from isa/opcodes.def.
/// Engines compute in fp32: inputs are widened with load_f32, results narrowed with store_f32 (RNE).
#include <Eigen/Dense>
#include <array>
#include <utility>
#include <cstdint>

#include "isa/isa.h"

namespace nsim::isa {

/// A resolved operand: raw memory plus the pattern. For HBM operands `partitions` counts dim-0 rows
/// and `partition_stride_bytes` is the row step; on-chip it is the physical partition pitch.
struct TileView {
  uint8_t* base = nullptr;  ///< address of element (partition 0, free index 0)
  DType dtype = DType::kFloat32;
  uint32_t partitions = 0;
  int64_t partition_stride_bytes = 0;
  uint8_t nfree = 0;
  std::array<int64_t, kMaxFreeDims> size{};
  std::array<int64_t, kMaxFreeDims> stride{};  ///< elements

  bool valid() const { return base != nullptr; }
  int64_t elems() const;  ///< elements per partition (product of free sizes; 1 when nfree == 0)
  /// True when a partition's elements lie back to back in row-major order (dims of size 1 any stride).
  bool contiguous() const;
  /// Address of element `flat` (row-major over the free dims) of partition p.
  uint8_t* at(uint32_t p, int64_t flat) const;
  /// Host bytes [first, last) that hold the view's elements (the span from its lowest to its highest
  /// element address, gaps included).
  std::pair<const uint8_t*, const uint8_t*> host_span() const;
  /// Identical views (same memory, dtype and access pattern).
  bool same_as(const TileView& o) const;
};

/// False when no byte of a's elements can be a byte of b's: compared partition by partition (each one's
/// span) when both views' partitions are the same distance apart, else by host_span(). May say true for
/// views that only interleave.
bool may_overlap(const TileView& a, const TileView& b);

/// Read partition p's elements (row-major over free dims) widened to fp32 into out[0..elems()).
void read_row(const TileView& v, uint32_t p, float* out);
/// Partition p's elements as fp32, read only: a pointer into v's memory when they are contiguous,
/// aligned fp32 (nothing copied: PSUM rows), else read_row into `scratch` (elems() floats) and `scratch`.
/// Valid until v's memory is written.
const float* row_f32(const TileView& v, uint32_t p, float* scratch);
/// Write out[0..elems()) narrowed to v.dtype into partition p.
void write_row(const TileView& v, uint32_t p, const float* in);
/// Same as read_row/write_row but raw integers (bit-vector ops; no fp32 path).
void read_row_int(const TileView& v, uint32_t p, int64_t* out);
void write_row_int(const TileView& v, uint32_t p, const int64_t* in);

namespace sem {
class AsyncGemm;
}

/// Architectural state the semantics read and write besides memory.
struct ArchState {
  int generation = 3;
  std::array<float, 128> scalar_acc{};  ///< ScalarE reduce registers (activation*)
  std::array<float, 128> vector_acc{};  ///< VectorE reduce registers (tensor_scalar_reduce, range_select)
  /// PE array weights, K x M, loaded by load_stationary (row-major: a partition's row is a row)
  Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> stationary;
  DType stationary_dtype = DType::kBFloat16;
  uint64_t rng_state = 0x9E3779B97F4A7C15ull;
  /// PRNG state of each engine (rng, dropout, set_rng_seed, rand_set_state / rand_get_state; indexed by
  /// Engine). A counter-based splitmix64 stream: deterministic, not bit-compatible with hardware XORWOW.
  std::array<uint64_t, kNumEngines> rng{0x9E3779B97F4A7C15ull, 0x9E3779B97F4A7C15ull, 0x9E3779B97F4A7C15ull,
                                        0x9E3779B97F4A7C15ull, 0x9E3779B97F4A7C15ull};
  /// Where multiply_moving's product may run behind the next instructions (sem::AsyncGemm; its owner
  /// waits for it before anything but execute() reads what it writes): nullptr = computed in place.
  sem::AsyncGemm* async_gemm = nullptr;
};

/// Views indexed like the opcode's slots (absent optional slots have base == nullptr).
using Views = std::array<TileView, kMaxSlots>;
using SemFn = void (*)(const Instr&, const Views&, ArchState&);

/// Run the functional semantics of `in`. Throws nsim::Error on operands that do not fit the op
/// (e.g. element counts) — verification normally catches these first.
void execute(const Instr& in, const Views& views, ArchState& st);

/// fp32 ALU, as VectorE/ScalarE/GpSimd compute it (comparisons give 1.0/0.0). Unary ops ignore y.
float alu_apply(AluOp op, float x, float y);
/// x[j] = op(x[j], y[j]) for j < n, or op(x[j], s) when y is null; `reverse` swaps the two operands
/// (unless the op ignores its operand). The same bits as alu_apply per element, faster.
void alu_apply_row(AluOp op, float* x, const float* y, float s, int64_t n, bool reverse = false);
/// r = op(r, y[j]) for j = 0 .. n-1 in order (a reduction's left fold; the same bits as alu_apply).
float alu_fold(AluOp op, float r, const float* y, int64_t n);
/// Integer ALU for bit-vector ops on raw values.
int64_t alu_apply_int(AluOp op, int64_t x, int64_t y);
/// Identity element of a reduction (add 0, multiply 1, max -inf, min +inf, and/or/xor ...).
float alu_identity(AluOp op);
/// Activation function f(x) in fp32 (prelu uses alpha).
float act_apply(ActFunc f, float x, float alpha = 0.0f);
/// y[j] = act_apply(f, y[j], alpha) for j < n (the same bits; exp vectorised, isa/semantics/exp_row.h).
void act_apply_row(ActFunc f, float* y, int64_t n, float alpha = 0.0f);

// Declarations of every opcode's semantics (defined one per file).
#define OP(e, mn, eng, dflt, cost, slots) void exec_##e(const Instr&, const Views&, ArchState&);
#include "isa/opcodes.def"
#undef OP

}  // namespace nsim::isa
