// GpSimd cost (neuroncore.md 3.2): iota/affine_select = start overhead + N; others max(MIN_II, N).
#include <algorithm>

#include "engines/cost.h"

namespace nsim::engines {

using isa::CostClass;

StreamCost gpsimd_cost(const CoreParams& p, const isa::Instr& in) {
  StreamShape s = stream_shape(p, in, false);
  StreamCost c;
  c.latency = p.gpsimd_fixed_latency;
  switch (isa::op_info(in.op).cost) {  // the cost class column of isa/opcodes.def
    case CostClass::kStartOverhead:  // iota, affine_select
      c.busy = p.gpsimd_start_overhead + static_cast<double>(s.n);
      return c;
    case CostClass::kElementwise: {  // tensor_copy (alu0 bypass), tensor_scalar
      const bool rsqrt = in.alu0 == isa::AluOp::kRsqrt || in.alu1 == isa::AluOp::kRsqrt;
      c.busy = stream_busy(s, p.gpsimd_min_ii, rsqrt ? p.gpsimd_rsqrt_factor : 1.0, 1.0);
      if (isa::dynamic_copy(in)) c.busy = std::max(p.vector_dynamic_copy, static_cast<double>(s.n));  // spec 3.2
      return c;
    }
    case CostClass::kMemset:  // V, G: N/2 for a 16-bit zero (spec 3.2)
      c.busy = stream_busy(s, p.gpsimd_min_ii, memset_factor(in), 1.0);
      return c;
    case CostClass::kTopk:  // factor x n (the vector's elements, iimm[0]) + K (the results per partition)
      c.busy = p.gpsimd_topk_factor * static_cast<double>(in.iimm[0]) + static_cast<double>(in.slot(0).elems_per_partition());
      return c;
    default: c.busy = stream_busy(s, p.gpsimd_min_ii, 1.0, 1.0); return c;
  }
}

}  // namespace nsim::engines
