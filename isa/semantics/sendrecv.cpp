// sendrecv (LNC=2): this core's dst receives the peer core's src. The data moves between the two
// cores' SBUFs, so the multi-core driver (frontend/multicore.cpp) copies it when both cores have
// arrived; the instruction itself changes nothing in this core's memory.
#include "isa/semantics/internal.h"

namespace nsim::isa {

void exec_kSendrecv(const Instr& in, const Views& v, ArchState&) {
  sem::require(in, v[0], "dst");
  sem::require(in, v[1], "src");
}

}  // namespace nsim::isa
