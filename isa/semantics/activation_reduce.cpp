// activation_reduce: exactly activation with reduce_cmd = reset_reduce (see activation.cpp).
#include "isa/semantics/internal.h"

namespace nsim::isa {

void exec_kActivationReduce(const Instr& in, const Views& v, ArchState& st) {
  sem::activation_impl(in, v, st, ReduceCmd::kResetReduce);
}

}  // namespace nsim::isa
