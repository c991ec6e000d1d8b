#pragma once
/// Cost model of each engine (shared/spec/neuroncore.md section 3), one implementation per engine
/// folder. Every constant comes from CoreParams (i.e. from the config).
#include "engines/params.h"
#include "isa/isa.h"

namespace nsim::engines {

/// Cost of one instruction on a streaming engine (Vector, Scalar, GpSimd), in that engine's cycles.
struct StreamCost {
  double busy = 0;     ///< II: cycles until the engine may issue the next independent instruction
  double latency = 0;  ///< fixed latency added to busy to give the duration seen by dependants
  int perf_mode = 1;   ///< 1, 2 or 4 (profiler `performance_mode`)
};

/// Shared by the streaming engines: N, passes and the stride penalty of spec 3.2.
struct StreamShape {
  int64_t n = 0;            ///< elements per partition of the streamed operand
  int passes = 1;           ///< 2 when two tensor inputs come from the same SRAM
  bool strided = false;     ///< some operand's innermost stride exceeds sbuf.stride_penalty_bytes
  bool all_sbuf = true;     ///< every tensor operand in SBUF
  bool any_psum = false;
  bool all_16bit = true;    ///< every tensor operand is a 16-bit float (or fp8 when counted as such)
  bool contiguous = true;   ///< innermost stride 1 on every tensor operand
};
StreamShape stream_shape(const CoreParams& p, const isa::Instr& in, bool fp8_is_16bit);
/// max(min_ii, ceil(passes * n * factor / rate)), rate halved when strided.
double stream_busy(const StreamShape& s, double min_ii, double factor, double rate);
/// memset's factor on VectorE and GpSimd (spec 3.2): 0.5 for a zero into a 16-bit float tile, else 1.
inline double memset_factor(const isa::Instr& in) {
  const DType t = in.slot(0).dtype;
  return in.imm[0] == 0.0f && (t == DType::kBFloat16 || t == DType::kFloat16) ? 0.5 : 1.0;
}

StreamCost vector_cost(const CoreParams& p, const isa::Instr& in);
StreamCost scalar_cost(const CoreParams& p, const isa::Instr& in);
StreamCost gpsimd_cost(const CoreParams& p, const isa::Instr& in);

/// TensorE initiation intervals in tensor cycles (before throttling).
double tensor_dtype_factor(const CoreParams& p, const isa::Instr& in, DType input_dtype);
double load_stationary_ii(const CoreParams& p, const isa::Instr& in);
double multiply_moving_ii(const CoreParams& p, const isa::Instr& in, DType stationary_dtype, int64_t stationary_m);
double pe_transpose_ii(const CoreParams& p, const isa::Instr& in);

/// FLOPs an instruction performs (MAC = 2 on TensorE; one per element and ALU stage elsewhere).
double instr_flops(const isa::Instr& in, int64_t stationary_m);

}  // namespace nsim::engines
