// ScalarE cost (neuroncore.md 3.2): activation = max(MIN_II, N), + MIN_II with a reduction.
#include <algorithm>

#include "engines/cost.h"

namespace nsim::engines {

using isa::CostClass;
using isa::ReduceCmd;

StreamCost scalar_cost(const CoreParams& p, const isa::Instr& in) {
  StreamShape s = stream_shape(p, in, p.scalar_perf_mode_fp8);
  StreamCost c;
  c.latency = p.scalar_fixed_latency;
  const double mi = p.scalar_min_ii;
  s.passes = 1;  // ScalarE reads one tensor input per instruction
  const CostClass cls = isa::op_info(in.op).cost;  // the cost class column of isa/opcodes.def
  switch (cls) {
    case CostClass::kActivation:
    case CostClass::kActivationReduce: {  // one activation pass, + MIN_II with a reduction (reduce_res is slot 4)
      const bool reduces = cls == CostClass::kActivationReduce || in.slot(4).present() ||
                           in.reduce_cmd == ReduceCmd::kReduce || in.reduce_cmd == ReduceCmd::kResetReduce;
      c.busy = stream_busy(s, mi, 1.0, 1.0) + (reduces ? mi : 0.0);
      return c;
    }
    case CostClass::kElementwise: {
      const int rate = (p.scalar_perf_mode_2x && s.all_16bit) ? 2 : 1;
      c.perf_mode = rate;
      c.busy = stream_busy(s, mi, 1.0, rate);
      if (isa::dynamic_copy(in)) c.busy = std::max(p.vector_dynamic_copy, static_cast<double>(s.n));  // spec 3.2
      return c;
    }
    default: c.busy = stream_busy(s, mi, 1.0, 1.0); return c;
  }
}

}  // namespace nsim::engines
