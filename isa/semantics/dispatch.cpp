// Dispatch of the functional semantics: one table entry per opcode, generated from isa/opcodes.def.
#include <fmt/format.h>

#include "isa/semantics/semantics.h"

namespace nsim::isa {

namespace {
constexpr SemFn kSemTable[] = {
#define OP(e, ...) &exec_##e,
#include "isa/opcodes.def"
#undef OP
};
static_assert(sizeof(kSemTable) / sizeof(kSemTable[0]) == static_cast<size_t>(kNumOpcodes));
}  // namespace

void execute(const Instr& in, const Views& views, ArchState& st) {
  const auto i = static_cast<size_t>(in.op);
  if (i >= static_cast<size_t>(kNumOpcodes))
    throw Error(ErrorCode::kUnknownOpcode, fmt::format("unknown opcode {}", i));
  kSemTable[i](in, views, st);
}

}  // namespace nsim::isa
