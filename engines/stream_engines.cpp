#include "engines/stream_engines.h"

#include <algorithm>
#include <tuple>

namespace nsim::engines {

using isa::Engine;
using isa::Instr;
using isa::Opcode;
using isa::Space;
using sim::Ps;

StreamCost StreamEngines::cost(const Instr& in, Engine e) const {
  switch (e) {
    case Engine::kScalar: return scalar_cost(p_, in);
    case Engine::kGpsimd: return gpsimd_cost(p_, in);
    default: return vector_cost(p_, in);
  }
}

Ps StreamEngines::trigger_cost(Engine e) const {
  if (e == Engine::kScalar) return p_.hwdge_instr;
  if (e == Engine::kGpsimd) return p_.swdge_instr;
  return p_.trigger_instr;
}

Ps StreamEngines::sequencer_cost(const Instr& in, Engine e) const {
  if (in.op != isa::Opcode::kRegisterLoad) return trigger_cost(e);
  // (a register instruction, not a DMA trigger: the plain sequencer instruction time on every engine)
  return p_.trigger_instr + (in.slot(0).space == Space::kHbm ? p_.register_load_hbm : p_.register_load_sbuf);
}

uint8_t StreamEngines::uses(const Instr& in) const {
  uint8_t u = isa::is_dma(in.op) ? kUsesDma : 0;
  for (int i = 0; i < isa::kMaxSlots; ++i) {
    if (in.slot(i).space == Space::kSbuf) u |= kUsesSbuf;
    if (in.slot(i).space == Space::kPsum) u |= kUsesPsum;
  }
  if (p_.vector_perf_gpsimd_sbuf_shared && !(u & kUsesDma) && (u & kUsesSbuf) &&
      (isa::op_info(in.op).engines & isa::engine_bit(Engine::kVector)) && vector_cost(p_, in).perf_mode > 1)
    u |= kUsesVectorPerf;
  return u;
}

StreamEngines::Plan StreamEngines::plan(const Instr& in) const {
  const Engine e = in.engine;
  const sim::ClockDomain& clk = p_.clk(e);
  const StreamCost c = cost(in, e);
  Plan pl;
  const isa::CostClass cls = isa::op_info(in.op).cost;
  if (e == Engine::kScalar && (cls == isa::CostClass::kActivation || cls == isa::CostClass::kActivationReduce))
    pl.act_set = p_.act_table_set[static_cast<size_t>(in.act)];
  pl.busy = clk.cycles_to_ps(c.busy);
  pl.latency = clk.cycles_to_ps(c.latency);
  pl.perf_mode = static_cast<uint8_t>(c.perf_mode);
  std::tie(pl.sbuf_port, pl.psum_port) = ports(uses(in), e);
  return pl;
}

StreamEngines::Issue StreamEngines::issue(const Plan& pl, Engine e, Ps ready) {
  Ps extra = 0;
  if (pl.act_set >= 0 && pl.act_set != scalar_table_set_) {  // a different function table set must be loaded
    extra = p_.scalar_act_table_load;
    scalar_table_set_ = pl.act_set;
  }
  Issue r;
  r.table_load = extra;
  r.busy = pl.busy + extra;
  r.latency = pl.latency;
  r.perf_mode = pl.perf_mode;
  r.start = std::max(next_issue_[static_cast<size_t>(e)], ready);
  if (pl.sbuf_port) r.start = std::max(r.start, excl_sbuf_free_);
  if (pl.psum_port) r.start = std::max(r.start, excl_psum_free_);
  if (pl.sbuf_port) excl_sbuf_free_ = r.start + r.busy;
  if (pl.psum_port) excl_psum_free_ = r.start + r.busy;
  next_issue_[static_cast<size_t>(e)] = r.start + r.busy;
  return r;
}

StreamEngines::Issue StreamEngines::trigger(const Instr& in, Ps ready) {
  Issue r;
  r.start = std::max(next_issue_[static_cast<size_t>(in.engine)], ready);
  r.busy = isa::is_dma(in.op) ? trigger_cost(in.engine) : sequencer_cost(in, in.engine);
  next_issue_[static_cast<size_t>(in.engine)] = r.start + r.busy;
  return r;
}

Ps StreamEngines::busy_estimate(const Instr& in, Engine e) const {
  if (isa::is_dma(in.op)) return trigger_cost(e);
  Instr on = in;
  on.engine = e;
  return p_.clk(e).cycles_to_ps(cost(on, e).busy);
}

Ps StreamEngines::duration_estimate(const Instr& in, Engine e) const {
  Instr on = in;
  on.engine = e;
  const StreamCost c = cost(on, e);
  return p_.clk(e).cycles_to_ps(c.busy + c.latency);
}

}  // namespace nsim::engines
