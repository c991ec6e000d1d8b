// core_barrier (LNC=2): a rendezvous of the two cores on one engine; no data changes. Its timing
// (both cores leave at the later arrival) is the multi-core driver's (frontend/multicore.cpp).
#include "isa/semantics/internal.h"

namespace nsim::isa {

void exec_kCoreBarrier(const Instr& in, const Views& v, ArchState&) { sem::require(in, v[0], "dst"); }

}  // namespace nsim::isa
