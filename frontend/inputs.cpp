#include "frontend/inputs.h"

#include <random>

namespace nsim::frontend {

void write_inputs(const Kernel& k, Simulator& sim, const std::map<std::string, std::vector<uint8_t>>& given,
                  uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (const auto& t : k.tensors) {
    if (t.space != isa::Space::kHbm || t.kind != TensorKind::kInput) continue;
    if (auto it = given.find(t.name); it != given.end()) {
      sim.write_hbm(t.name, it->second.data(), it->second.size());
      continue;
    }
    const memory::HbmTensor& h = sim.memory().hbm_tensor(t.name);
    std::vector<uint8_t> bytes(static_cast<size_t>(h.bytes));
    const int eb = dtype_bytes(t.dtype);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::uniform_int_distribution<int> ud(dtype_is_signed(t.dtype) ? -8 : 0, 8);
    for (size_t i = 0; i < bytes.size(); i += static_cast<size_t>(eb)) {
      if (t.dtype == DType::kBool) store_int(t.dtype, &bytes[i], ud(rng) & 1);
      else if (dtype_is_float(t.dtype)) store_f32(t.dtype, &bytes[i], nd(rng));
      else store_int(t.dtype, &bytes[i], ud(rng));
    }
    sim.write_hbm(t.name, bytes.data(), bytes.size());
  }
}

}  // namespace nsim::frontend
