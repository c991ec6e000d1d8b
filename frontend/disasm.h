#pragma once
/// `nsim disasm` / `nsim.disasm_json`: the instruction stream the compiler model produces for a kernel.
#include <cstdint>
#include <string>
#include <vector>

#include "frontend/ir.h"
#include "sim/config.h"

namespace nsim::frontend {

struct Disassembly {
  /// One line per SBUF/PSUM tile: name, byte offset, rotating buffers, stride.
  std::vector<std::string> tiles;
  /// One line per instruction in issue order (compiler.schedule: list reorders, places engine-free ops
  /// and picks DMA queues): the instruction with its engine and queue, its start time, its source line.
  std::vector<std::string> instructions;
};

/// Verify `k`, then lower and schedule it timing-only on `cfg`; stop after `limit` instructions (< 0: all).
Disassembly disassemble_kernel(const Kernel& k, const sim::Config& cfg, int64_t limit = -1);

}  // namespace nsim::frontend
