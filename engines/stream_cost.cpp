#include <algorithm>
#include <cmath>

#include "engines/cost.h"

namespace nsim::engines {

using isa::Instr;
using isa::Operand;
using isa::Space;

StreamShape stream_shape(const CoreParams& p, const Instr& in, bool fp8_is_16bit) {
  StreamShape s;
  const isa::OpInfo& info = isa::op_info(in.op);
  int sbuf_inputs = 0, psum_inputs = 0;
  auto is16 = [&](DType t) {
    return t == DType::kBFloat16 || t == DType::kFloat16 ||
           (fp8_is_16bit && (t == DType::kFloat8E4M3 || t == DType::kFloat8E4M3FN || t == DType::kFloat8E5M2));
  };
  for (int i = 0; i < info.num_slots; ++i) {
    const Operand& o = in.slot(i);
    if (!o.present()) continue;
    if (i == 2 && isa::indirect_slot(in) >= 0)
      continue;  // the runtime offsets of a dynamic copy: read by the engine's sequencer, not streamed
    const bool vector_operand = i > 0 && o.elems_per_partition() == 1 && in.slot(0).elems_per_partition() > 1;
    if (vector_operand) continue;  // (P,1) operands are broadcast registers, not streams
    if (i > 0) {
      s.n = std::max(s.n, o.elems_per_partition());
      if (o.space == Space::kSbuf) ++sbuf_inputs;
      if (o.space == Space::kPsum) ++psum_inputs;
    }
    if (o.space == Space::kPsum) s.any_psum = true;
    if (o.space != Space::kSbuf) s.all_sbuf = false;
    if (!is16(o.dtype)) s.all_16bit = false;
    const int64_t inner = o.nfree ? o.stride[static_cast<size_t>(o.nfree - 1)] : 1;
    if (inner != 1 && o.nfree) s.contiguous = false;
    if (o.inner_stride_bytes() > p.stride_penalty_bytes) s.strided = true;
  }
  if (s.n == 0) s.n = in.slot(0).elems_per_partition();  // memset, iota: the destination streams
  s.passes = (sbuf_inputs >= 2 || psum_inputs >= 2) ? 2 : 1;
  return s;
}

double stream_busy(const StreamShape& s, double min_ii, double factor, double rate) {
  const double r = rate * (s.strided ? 0.5 : 1.0);
  return std::max(min_ii, std::ceil(static_cast<double>(s.passes) * static_cast<double>(s.n) * factor / r));
}

double instr_flops(const Instr& in, int64_t stationary_m) {
  using isa::Opcode;
  switch (in.op) {
    case Opcode::kMultiplyMoving: {
      const Operand& mv = in.slot(1);
      const double n = static_cast<double>(in.slot(0).elems_per_partition());
      // K contraction values per moving partition: 2 with double_row, 4 for MX x4-packed data.
      const double kvals = (in.flags & isa::kDoubleRow) ? 2.0 : static_cast<double>(dtype_values(mv.dtype));
      return 2.0 * static_cast<double>(mv.num_partitions) * kvals * static_cast<double>(stationary_m) * n;
    }
    case Opcode::kLoadStationary: return 0;
    case Opcode::kNcTranspose: {
      const Operand& d = in.slot(1);
      // A PE transpose is a matmul with an identity: K = P, M = P, N = F.
      if (in.engine == isa::Engine::kTensor)
        return 2.0 * d.num_partitions * static_cast<double>(d.num_partitions) * static_cast<double>(d.elems_per_partition());
      return 0;
    }
    case Opcode::kDmaCopy:
    case Opcode::kDmaTranspose:
    case Opcode::kTensorCopy:
    case Opcode::kMemset:
    case Opcode::kNcStreamShuffle: return 0;
    default: {
      const Operand& d = in.slot(0);
      const double elems = static_cast<double>(d.total_elems());
      const double stages = (in.alu1 != isa::AluOp::kBypass) ? 2.0 : 1.0;
      return elems * stages;
    }
  }
}

}  // namespace nsim::engines
