#pragma once
/// The results of the latest PE-array helpers still unchanged in PSUM: transposes, and partition broadcasts
/// (a matmul contracting over one row, `ones^T @ row`, that starts its accumulation group). A copy of one of
/// them (a tensor_copy or copy activation whose input is exactly that PSUM view) is part of the helper's cost:
/// the fixes `nsim analyze` suggests (a transposed load or layout; a stride-0 DMA of the row) need neither the
/// helper nor the copy. One definition for the Analyzer (the pe_transpose / pe_broadcast findings and their copy lines)
/// and for the simulator's what-if run that frees them (SimOptions::free_pe_helpers: those findings'
/// re-simulated estimates), so both see the same instructions. Likewise the reductions of an activation's output in
/// a pass of their own (split_reduce(): the split_reduce finding and its what-if run).
#include <array>
#include <cstdint>
#include <string_view>
#include <utility>

#include "isa/isa.h"

namespace nsim::engines {

class PeResults {
 public:
  /// Kinds of helper (bits, as SimOptions::free_pe_helpers takes them). kSplitReduce is no PE-array helper but is
  /// found the same way: a reduction of an activation's output (split_reduce()).
  enum Kind : uint8_t { kNone = 0, kTranspose = 1, kBroadcast = 2, kSplitReduce = 4 };

  /// What a TensorE instruction other than load_stationary is: a transpose on the PE array (any TensorE op
  /// but multiply_moving, or one in transpose mode), a contraction over one row (K = 1), or a matmul (kNone).
  static Kind helper_kind(const isa::Instr& in) {
    if (in.engine != isa::Engine::kTensor || isa::is_dma(in.op) || in.op == isa::Opcode::kLoadStationary) return kNone;
    if (in.op != isa::Opcode::kMultiplyMoving || (in.flags & isa::kIsTranspose)) return kTranspose;
    return in.slot(1).num_partitions == 1 ? kBroadcast : kNone;
  }
  /// A load_stationary of a one-row stationary: the weights of a partition broadcast.
  static bool broadcast_weights(const isa::Instr& in) {
    return in.op == isa::Opcode::kLoadStationary && in.slot(0).num_partitions == 1;
  }

  /// The kind of helper result `in` copies out of PSUM (a tensor_copy or a copy activation whose input is
  /// exactly one of the remembered results), else kNone: work done on the result (an exp of transposed
  /// scores) is still needed after the fix. Ask before note(in).
  Kind copy_of(const isa::Instr& in) const {
    if (!live_ || (in.op != isa::Opcode::kTensorCopy && (in.op != isa::Opcode::kActivation || in.act != isa::ActFunc::kCopy)))
      return kNone;
    const isa::Operand& src = in.slot(1);
    if (src.space != isa::Space::kPsum) return kNone;
    for (unsigned m = live_; m; m &= m - 1) {
      const auto i = static_cast<size_t>(__builtin_ctz(m));
      if (same_view(out_[i], src)) return kind_[i];
    }
    return kNone;
  }

  /// An element-wise pass an activation reading its output could do itself (activation computes f(data x scale +
  /// bias) with one value per partition for each): a tensor_scalar adding, subtracting (data - c) or multiplying by
  /// one value per partition (an immediate or a [P, 1] tile), with no second ALU stage. The fold_into_activation
  /// finding's instructions, and what its what-if run frees on the lines the analysis found folded.
  static bool foldable_pass(const isa::Instr& in) {
    static const int operand0 = slot_of(isa::Opcode::kTensorScalar, "operand0"),
                     operand1 = slot_of(isa::Opcode::kTensorScalar, "operand1");
    if (in.op != isa::Opcode::kTensorScalar || in.alu1 != isa::AluOp::kBypass || in.slot(operand1).present() ||
        in.slot(0).space != isa::Space::kSbuf)
      return false;
    const bool sub = in.alu0 == isa::AluOp::kSubtract && !(in.flags & isa::kReverse0);
    if (!sub && in.alu0 != isa::AluOp::kAdd && in.alu0 != isa::AluOp::kMultiply) return false;
    const isa::Operand& c = in.slot(operand0);
    return (in.flags & isa::kHasImm0) || (c.present() && c.elems_per_partition() == 1);
  }
  /// An activation with neither scale nor bias (as tiles, or as the immediates imm[2] = 1 and imm[3] = 0 that
  /// stand for them: isa/semantics/activation.cpp), which a foldable_pass before it could give them.
  static bool plain_activation(const isa::Instr& in) {
    static const int bias = slot_of(isa::Opcode::kActivation, "bias"), scale = slot_of(isa::Opcode::kActivation, "scale");
    return in.op == isa::Opcode::kActivation && !in.slot(bias).present() && !in.slot(scale).present() &&
           in.imm[2] == 1.0f && in.imm[3] == 0.0f;
  }

  /// Whether `in` reduces (tensor_reduce with add, max or min) exactly the output of one of the latest activations
  /// without an accumulated reduction, which the activation could have accumulated while writing it (reduce_op=,
  /// reduce_res=): the split_reduce finding's instructions, and what its what-if run frees. Ask before note(in).
  bool split_reduce(const isa::Instr& in) const {
    if (!act_live_ || in.op != isa::Opcode::kTensorReduce ||
        (in.alu0 != isa::AluOp::kAdd && in.alu0 != isa::AluOp::kMaximum && in.alu0 != isa::AluOp::kMinimum))
      return false;
    const isa::Operand &src = in.slot(1), &dst = in.slot(0);
    const auto dext = dst.byte_extent();
    for (unsigned m = act_live_; m; m &= m - 1) {
      const auto i = static_cast<size_t>(__builtin_ctz(m));
      // (an output `in` overwrites is no longer the activation's, as note(in) will find)
      if (same_view(act_out_[i], src) && !overlaps(act_out_[i], act_ext_[i], dst, dext)) return true;
    }
    return false;
  }

  /// Every instruction, in issue order: forget the results its output overwrites, then remember its own
  /// when it is a helper (a one-row contraction only when it starts its accumulation group: one accumulated
  /// into a matmul's PSUM tile is not a copy of the row alone) or an activation without an accumulated reduction.
  void note(const isa::Instr& in) {
    const isa::Operand& dst = in.slot(0);
    const isa::OpInfo& info = isa::op_info(in.op);
    const bool writes = info.num_slots > 0 && info.slots[0].written;  // (load_stationary's slot 0 is read)
    if ((live_ || act_live_) && writes && dst.present() && dst.space != isa::Space::kHbm) {
      const auto ext = dst.byte_extent();
      for (unsigned m = live_; m; m &= m - 1) {
        const auto i = static_cast<size_t>(__builtin_ctz(m));
        if (overlaps(out_[i], ext_[i], dst, ext)) live_ = static_cast<uint8_t>(live_ & ~(1u << i));
      }
      for (unsigned m = act_live_; m; m &= m - 1) {
        const auto i = static_cast<size_t>(__builtin_ctz(m));
        if (overlaps(act_out_[i], act_ext_[i], dst, ext)) act_live_ = static_cast<uint8_t>(act_live_ & ~(1u << i));
      }
    }
    static const int reduce_res = slot_of(isa::Opcode::kActivation, "reduce_res");
    if (in.op == isa::Opcode::kActivation && !in.slot(reduce_res).present()) {
      act_out_[act_next_] = dst;
      act_ext_[act_next_] = dst.byte_extent();
      act_live_ = static_cast<uint8_t>(act_live_ | (1u << act_next_));
      act_next_ = (act_next_ + 1) % kRing;
      return;
    }
    Kind k = helper_kind(in);
    if (k == kBroadcast && (in.flags & isa::kAccumulate)) k = kNone;
    if (k == kNone) return;
    out_[next_] = dst;
    ext_[next_] = dst.byte_extent();
    kind_[next_] = k;
    live_ = static_cast<uint8_t>(live_ | (1u << next_));
    next_ = (next_ + 1) % kRing;
  }

  /// Forget the result `in` (a helper noted by note()) wrote: its copies out of PSUM are no longer the helper's.
  void forget_result(const isa::Instr& in) {
    const isa::Operand& dst = in.slot(0);
    for (unsigned m = live_; m; m &= m - 1) {
      const auto i = static_cast<size_t>(__builtin_ctz(m));
      if (same_view(out_[i], dst)) live_ = static_cast<uint8_t>(live_ & ~(1u << i));
    }
  }

  /// Two operands viewing the same elements the same way.
  static bool same_view(const isa::Operand& a, const isa::Operand& b) {
    return a.space == b.space && a.dtype == b.dtype && a.nfree == b.nfree && a.start_partition == b.start_partition &&
           a.num_partitions == b.num_partitions && a.offset == b.offset && a.partition_step == b.partition_step &&
           a.size == b.size && a.stride == b.stride;
  }
  /// Whether operands a and b (of byte extents ae, be) may share a byte: same space, partitions and extents overlap.
  static bool overlaps(const isa::Operand& a, std::pair<int64_t, int64_t> ae, const isa::Operand& b,
                       std::pair<int64_t, int64_t> be) {
    if (a.space != b.space) return false;
    if (a.start_partition + a.num_partitions <= b.start_partition ||
        b.start_partition + b.num_partitions <= a.start_partition)
      return false;
    return ae.first < be.second && be.first < ae.second;
  }

 private:
  /// The slot of `op` named `name` in the ISA table (isa/opcodes.def; the names used here are there: 0, the output,
  /// would never match what they look for).
  static int slot_of(isa::Opcode op, std::string_view name) {
    const isa::OpInfo& info = isa::op_info(op);
    for (int i = 0; i < info.num_slots; ++i)
      if (std::string_view(info.slots[static_cast<size_t>(i)].name) == name) return i;
    return 0;
  }
  static constexpr size_t kRing = 8;  ///< the latest 8 results (a transposed block's copies follow within a few)
  std::array<isa::Operand, kRing> out_{};
  std::array<std::pair<int64_t, int64_t>, kRing> ext_{};
  std::array<Kind, kRing> kind_{};
  uint8_t live_ = 0;  ///< bit i: entry i holds a result
  size_t next_ = 0;
  // The outputs of the latest 8 activations without an accumulated reduction (their own ring: a helper's result
  // does not push one out).
  std::array<isa::Operand, kRing> act_out_{};
  std::array<std::pair<int64_t, int64_t>, kRing> act_ext_{};
  uint8_t act_live_ = 0;
  size_t act_next_ = 0;
};

}  // namespace nsim::engines
