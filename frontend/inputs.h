#pragma once
/// Filling a kernel's HBM inputs before a run (shared by the CLI and the Python module).
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "engines/simulator.h"
#include "frontend/ir.h"

namespace nsim::frontend {

/// The bytes of one given input, already in its tensor's dtype and size, owned by the caller (the CLI's
/// converted .npy data; the Python module's numpy array itself, so that a large input is not held twice).
struct InputBytes {
  const uint8_t* data = nullptr;
  size_t size = 0;
};
using InputViews = std::map<std::string, InputBytes>;

/// Views of byte vectors (the vectors must outlive the views).
InputViews views_of(const std::map<std::string, std::vector<uint8_t>>& bytes);

/// Write every input tensor of `k` into `sim`: the bytes in `given` where present, else seeded random
/// values — floats of mean 0 and variance 1 (bell-shaped, within +-3.46), small integers in [-8, 8] ([0, 8]
/// unsigned), 0/1 for bool — each element a function of `seed`, the tensor's position in k.tensors and its index
/// (the same values on any number of host threads, whichever other inputs are given).
void write_inputs(const Kernel& k, Simulator& sim, const InputViews& given, uint64_t seed);

}  // namespace nsim::frontend
