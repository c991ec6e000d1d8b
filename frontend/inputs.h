#pragma once
/// Filling a kernel's HBM inputs before a run (shared by the CLI and the Python module).
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "engines/simulator.h"
#include "frontend/ir.h"

namespace nsim::frontend {

/// Write every input tensor of `k` into `sim`: the bytes in `given` (already in the tensor's dtype
/// and size) where present, else seeded random values — N(0, 1) for floats, small integers in
/// [-8, 8] ([0, 8] unsigned), 0/1 for bool — drawn in tensor order from one generator seeded `seed`.
void write_inputs(const Kernel& k, Simulator& sim, const std::map<std::string, std::vector<uint8_t>>& given,
                  uint64_t seed);

}  // namespace nsim::frontend
