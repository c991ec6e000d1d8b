// VectorE cost (neuroncore.md 3.2, per-API table and performance modes).
#include <algorithm>

#include "engines/cost.h"

namespace nsim::engines {

using isa::AluOp;
using isa::CostClass;
using isa::Opcode;
using isa::Space;

StreamCost vector_cost(const CoreParams& p, const isa::Instr& in) {
  const StreamShape s = stream_shape(p, in, p.vector_perf_mode_fp8);
  StreamCost c;
  c.latency = p.vector_fixed_latency;
  const double mi = p.vector_min_ii;
  double factor = 1.0, extra = 0.0;
  int rate = 1;
  StreamShape sh = s;
  switch (isa::op_info(in.op).cost) {  // the cost class column of isa/opcodes.def
    case CostClass::kElementwise: {  // tensor_copy, tensor_scalar
      if (p.vector_perf_modes && s.all_16bit) {
        if (s.all_sbuf && s.contiguous) rate = 4;
        else if (!s.all_sbuf || !s.contiguous) rate = 2;
      } else if (p.vector_perf_modes && p.vector_fp32_perf_mode && s.all_sbuf && s.contiguous) {
        rate = 2;
      }
      if (isa::dynamic_copy(in)) {
        c.busy = std::max(p.vector_dynamic_copy, static_cast<double>(s.n));
        c.perf_mode = 1;
        return c;
      }
      break;
    }
    case CostClass::kTensorTensor: {
      // Two SBUF inputs take two passes, unless the 16-bit 2x mode applies: both inputs in SBUF, every tensor
      // 16-bit, add / subtract / multiply, contiguous (the per-API table of spec 3.2; its performance-mode
      // paragraph names neither the ops nor contiguity: the table's narrower rule is kept, docs/timing-model.md).
      const bool op2x = in.alu0 == AluOp::kAdd || in.alu0 == AluOp::kSubtract || in.alu0 == AluOp::kMultiply;
      if (p.vector_perf_modes && s.all_16bit && s.passes == 2 && s.all_sbuf && s.contiguous && op2x) rate = 2;
      break;
    }
    case CostClass::kScalarTensorTensor: {
      const bool fast = in.slot(1).dtype == DType::kBFloat16 && in.slot(3).dtype == DType::kBFloat16 &&
                        in.alu0 == AluOp::kSubtract && in.alu1 == AluOp::kMultiply && s.n % 2 == 0;
      sh.passes = 1;
      factor = fast ? 1.0 : 2.0;
      break;
    }
    case CostClass::kScan: sh.passes = 1; factor = 2.0; break;
    case CostClass::kTensorReduce: {
      const bool half = in.slot(0).dtype == DType::kBFloat16 && in.slot(1).dtype == DType::kBFloat16 &&
                        (in.alu0 == AluOp::kAdd || in.alu0 == AluOp::kMaximum);
      factor = half ? 0.5 : 1.0;
      break;
    }
    case CostClass::kReciprocal: factor = p.vector_reciprocal_factor; break;
    case CostClass::kMemset: factor = memset_factor(in); break;
    case CostClass::kBnAggr: factor = p.vector_bn_aggr_factor; break;
    case CostClass::kStreamReduce: extra = mi; break;
    case CostClass::kQuantizeMx:  // src streams once (dst_scale is an output): max(MIN_II, N * factor)
      sh.passes = 1;
      sh.n = in.slot(1).elems_per_partition();
      factor = p.vector_quantize_mx_factor;
      break;
    case CostClass::kExponential: sh.passes = 1; factor = p.vector_exponential_factor; break;  // src once
    case CostClass::kRand2:  // no input: the output's elements
      sh.passes = 1;
      sh.n = in.slot(0).elems_per_partition();
      factor = p.vector_rand2_factor;
      break;
    // kStream (bn_stats, nc_stream_shuffle, range_select, tensor_copy_predicated: N when src and predicate
    // sit in different SRAMs, 2N when both are in SBUF ...) and nc_transpose: max(MIN_II, passes * N).
    default: break;
  }
  c.perf_mode = rate;
  c.busy = stream_busy(sh, mi, factor, rate) + extra;
  return c;
}

}  // namespace nsim::engines
