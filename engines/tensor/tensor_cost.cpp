// TensorE cost (neuroncore.md 3.1): LoadStationary + MultiplyMoving, PE transposes.
#include <algorithm>
#include <cmath>

#include "engines/cost.h"

namespace nsim::engines {

double tensor_dtype_factor(const CoreParams& p, const isa::Instr& in, DType t) {
  if (t == DType::kFloat32 || t == DType::kTFloat32)
    return (in.flags & isa::kOneZero) ? p.fp32_onezero_factor : p.fp32_factor;
  return 1.0;
}

double load_stationary_ii(const CoreParams& p, const isa::Instr& in) {
  const isa::Operand& st = in.slot(0);
  int64_t m = st.elems_per_partition();
  if (in.flags & isa::kDoubleRow) m /= 2;
  return tensor_dtype_factor(p, in, st.dtype) * std::ceil(static_cast<double>(m) / p.ls_speedup);
}

double multiply_moving_ii(const CoreParams& p, const isa::Instr& in, DType stationary_dtype, int64_t stationary_m) {
  const isa::Operand& mv = in.slot(1);
  int64_t n = mv.elems_per_partition();
  if (in.flags & isa::kDoubleRow) n /= 2;
  double f = std::max(tensor_dtype_factor(p, in, mv.dtype), tensor_dtype_factor(p, in, stationary_dtype));
  // MX (x4-packed, nc_matmul_mx): 4 contraction values per PE row at tensor.mx_rate values per cycle (spec 3.1:
  // K = 512 at the II of K = 128 bf16 on gen4, mx_rate 4).
  if (dtype_is_mx_x4(mv.dtype) && p.mx_rate > 0) f *= static_cast<double>(dtype_values(mv.dtype)) / p.mx_rate;
  const double nd = static_cast<double>(n);
  if (p.cost_formula_isa) return f * std::max(std::min(p.mm_min_ii, static_cast<double>(stationary_m)), nd);
  return f * std::max(p.mm_min_ii, nd);
}

double pe_transpose_ii(const CoreParams& p, const isa::Instr& in) {
  const isa::Operand& d = in.slot(1);
  const double f = (d.dtype == DType::kFloat32 || d.dtype == DType::kTFloat32) ? p.transpose_fp32_factor : 1.0;
  return f * std::max(static_cast<double>(d.num_partitions),
                      std::min(p.mm_min_ii, static_cast<double>(d.elems_per_partition())));
}

}  // namespace nsim::engines
