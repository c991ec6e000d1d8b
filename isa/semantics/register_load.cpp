// register_load: a sequencer reads the one element of `src` (SBUF or HBM) into one of its 32-bit registers.
// No memory changes: the frontends evaluate registers while tracing (python/nsim/tracer.py VirtualRegister), so
// the instruction is there for its timing (it waits for src's producer; what uses the register waits for it:
// kernel.json "after") and for the checks of its read (an uninitialised src is the sanitizer's NSIM-W501).
#include "isa/semantics/internal.h"

namespace nsim::isa {

void exec_kRegisterLoad(const Instr& in, const Views& v, ArchState&) { sem::require(in, v[0], "src"); }

}  // namespace nsim::isa
