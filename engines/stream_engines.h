#pragma once
/// The in-order instruction queues of VectorE, ScalarE, GpSimd and Sync (neuroncore.md 3.2, 3.3): when
/// each may issue, the SBUF/PSUM ports two of them share on some generations, and ScalarE's loaded
/// activation table. DMA triggers issue on these queues too (Sync, or Scalar/GpSimd with DGE). TensorE
/// (engines/tensor/tensor_engine.h) and the DMA engines (engines/dma/dma_engine.h) are components of
/// their own; the Simulator asks each for an instruction's slot and records the dependencies.
#include <algorithm>
#include <array>

#include "engines/cost.h"
#include "engines/params.h"
#include "sim/time.h"

namespace nsim::engines {

class StreamEngines {
 public:
  explicit StreamEngines(const CoreParams& p) : p_(p) {
    for (uint8_t u = 0; u < kUsesCombos; ++u)
      for (int e = 0; e < isa::kNumEngines; ++e) {
        const auto [sbuf, psum] = ports_rule(u, static_cast<isa::Engine>(e));
        port_bits_[u][static_cast<size_t>(e)] = static_cast<uint8_t>((sbuf ? 1 : 0) | (psum ? 2 : 0));
      }
  }

  /// Where an instruction went: start, issue interval and fixed latency (end = start + busy + latency).
  struct Issue {
    sim::Ps start = 0;
    sim::Ps busy = 0;
    sim::Ps latency = 0;
    uint8_t perf_mode = 1;
    sim::Ps table_load = 0;  ///< ScalarE: the activation table load it begins with (part of busy)
  };
  /// What issuing compute instruction `in` on in.engine takes, whatever the engines' state: a function
  /// of its signature (isa::same_signature), which the simulator caches (engines/sig_cache.h).
  struct Plan {
    sim::Ps busy = 0;     ///< II, before an activation table load
    sim::Ps latency = 0;
    uint8_t perf_mode = 1;
    bool sbuf_port = false, psum_port = false;  ///< the shared ports it needs (ports())
    int act_set = -1;     ///< ScalarE activation: the function table set it needs (-1: none)
  };
  Plan plan(const isa::Instr& in) const;
  /// Issue compute instruction `in` on in.engine once its operands are ready at `ready`.
  Issue issue(const isa::Instr& in, sim::Ps ready) { return issue(plan(in), in.engine, ready); }
  /// The same with its plan worked out before.
  Issue issue(const Plan& pl, isa::Engine e, sim::Ps ready);
  /// Issue the trigger of DMA `in` on in.engine (Sync, Scalar with hardware DGE, GpSimd with software DGE).
  Issue trigger(const isa::Instr& in, sim::Ps ready);

  /// What free() needs of an instruction, as bits: kUsesDma (a DMA trigger), kUsesSbuf, kUsesPsum (an
  /// operand in that space), kUsesVectorPerf (on VectorE it would run in a 2x/4x performance mode, which holds
  /// the SBUF bus it shares with GpSimd: conc.vector_perf_gpsimd_sbuf_shared). The list scheduler keeps it per
  /// instruction and asks free() by it.
  static constexpr uint8_t kUsesDma = 1, kUsesSbuf = 2, kUsesPsum = 4, kUsesVectorPerf = 8, kUsesCombos = 16;
  uint8_t uses(const isa::Instr& in) const;
  /// When engine `e` may issue `in`, ignoring its operands (its previous issue, shared ports).
  sim::Ps free(const isa::Instr& in, isa::Engine e) const { return free(uses(in), e); }
  /// The same for an instruction with uses() `u`.
  sim::Ps free(uint8_t u, isa::Engine e) const {
    sim::Ps t = next_issue_[static_cast<size_t>(e)];
    if (u & kUsesDma) return t;
    const uint8_t b = port_bits_[u][static_cast<size_t>(e)];
    if (b & 1) t = std::max(t, excl_sbuf_free_);
    if (b & 2) t = std::max(t, excl_psum_free_);
    return t;
  }
  /// Time `in` would keep engine `e` busy (its II; for a DMA, the trigger), and its start-to-end duration.
  sim::Ps busy_estimate(const isa::Instr& in, isa::Engine e) const;
  sim::Ps duration_estimate(const isa::Instr& in, isa::Engine e) const;
  /// The shared ports' next free times (to `time`) and the activation table set ScalarE holds (to `raw`):
  /// fast-forward, Simulator::timing_digest.
  template <class Time, class Raw>
  void shared_state(Time&& time, Raw&& raw) const {
    time(excl_sbuf_free_);
    time(excl_psum_free_);
    raw(scalar_table_set_);
  }
  /// When engine `e` may issue its next instruction.
  sim::Ps next_issue(isa::Engine e) const { return next_issue_[static_cast<size_t>(e)]; }

 public:
  /// Time a DMA trigger (or a core_barrier's semaphore wait) occupies engine `e`.
  sim::Ps trigger_cost(isa::Engine e) const;
  /// Time a sequencer instruction (core_barrier, register_load) occupies engine `e`: a core_barrier the engine's
  /// trigger time; a register_load sync.trigger_instr and the wait for its value (sync.register_load_sbuf / _hbm
  /// by src's memory) on any engine.
  sim::Ps sequencer_cost(const isa::Instr& in, isa::Engine e) const;

 private:
  StreamCost cost(const isa::Instr& in, isa::Engine e) const;
  /// Which shared ports `in` needs on `e` (gen2: VectorE/GpSimd share SBUF access, VectorE/ScalarE PSUM access;
  /// gen3+: VectorE in a performance mode and GpSimd share the SBUF bus).
  std::pair<bool, bool> ports(uint8_t uses, isa::Engine e) const {
    const uint8_t b = port_bits_[uses][static_cast<size_t>(e)];
    return {(b & 1) != 0, (b & 2) != 0};
  }
  /// ports() worked out from the parameters (once per uses() value and engine, into port_bits_).
  std::pair<bool, bool> ports_rule(uint8_t uses, isa::Engine e) const {
    const bool v = e == isa::Engine::kVector, g = e == isa::Engine::kGpsimd;
    const bool sbuf = (uses & kUsesSbuf) && (v || g) &&
                      (p_.vector_gpsimd_sbuf_exclusive || (p_.vector_perf_gpsimd_sbuf_shared && (g || (uses & kUsesVectorPerf))));
    return {sbuf, p_.vector_scalar_psum_exclusive && (uses & kUsesPsum) && (v || e == isa::Engine::kScalar)};
  }

  const CoreParams& p_;
  /// ports() per uses() value and engine: bit 0 the SBUF port, bit 1 the PSUM port (free() is on the list
  /// scheduler's per-candidate path).
  std::array<std::array<uint8_t, isa::kNumEngines>, kUsesCombos> port_bits_{};
  std::array<sim::Ps, isa::kNumEngines> next_issue_{};
  sim::Ps excl_sbuf_free_ = 0, excl_psum_free_ = 0;
  int scalar_table_set_ = -1;  ///< the activation function table set ScalarE holds (-1: none)
};

}  // namespace nsim::engines
