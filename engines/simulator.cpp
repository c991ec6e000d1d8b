#include "engines/simulator.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <unordered_map>

#include "engines/cost.h"
#include "engines/trace_recorder.h"

namespace nsim {

using engines::kClassDma;
using isa::Engine;
using isa::Instr;
using isa::Opcode;
using isa::Operand;
using isa::Space;
using sim::Ps;

void TrackCounters::add_interval(Ps s, Ps e) {
  if (e < s) e = s;
  if (cur_hi < 0) {
    cur_lo = s;
    cur_hi = e;
  } else if (s > cur_hi) {  // starts on a track are monotone, so the union closes here
    active += cur_hi - cur_lo;
    cur_lo = s;
    cur_hi = e;
  } else {
    cur_hi = std::max(cur_hi, e);
  }
  last_end = std::max(last_end, e);
}

void TrackCounters::close() {
  if (cur_hi >= 0) active += cur_hi - cur_lo;
  cur_lo = cur_hi = -1;
}

namespace {

engines::DepTracker::Config dep_config(const engines::CoreParams& p, const sim::Config& cfg) {
  engines::DepTracker::Config d;
  d.partitions = p.mem.partitions;
  d.sbuf_bytes = p.mem.sbuf_bytes_per_partition;
  d.psum_partitions = p.mem.psum_partitions;
  d.psum_bytes = p.mem.psum_bytes_per_partition();
  d.chunk_bytes = p.dep_chunk_bytes;
  d.hbm_chunk_bytes = std::max<int64_t>(1, cfg.bytes("sim.hbm_dep_chunk_bytes"));
  return d;
}

engines::DepTracker::LatencyTable latency_table(const engines::CoreParams& p) {
  engines::DepTracker::LatencyTable t{};
  for (int prod = 0; prod < engines::kNumClasses; ++prod)
    for (int cons = 0; cons < engines::kNumClasses; ++cons) {
      Ps l = 0;
      if (prod == kClassDma) l = p.dma_completion_to_waiter;  // DMA completion -> any waiter
      else if (prod != cons) l = p.sem_latency;               // semaphore hand-off between engines
      t[static_cast<size_t>(prod)][static_cast<size_t>(cons)] = l;
    }
  return t;
}

constexpr int kFirstDmaTrack = isa::kNumEngines;

}  // namespace

Simulator::Simulator(const sim::Config& cfg, SimOptions opts)
    : cfg_(cfg),
      p_(engines::CoreParams::from_config(cfg)),
      opts_(std::move(opts)),
      limits_(p_.limits()),
      mem_(p_.mem, opts_.numerics, std::max<int64_t>(4, p_.dep_chunk_bytes)),
      deps_(dep_config(p_, cfg), latency_table(p_)),
      tensor_(p_),
      dma_(p_) {
  st_.generation = p_.generation;
  c_.dma_active.forward_to(&c_.any_active);
  sources_.push_back(SourceLoc{});
  per_loc_.resize(1);
  if (opts_.dependency_bound) asap_ = std::make_unique<engines::DepTracker>(dep_config(p_, cfg), latency_table(p_));
  if (!opts_.trace_path.empty()) {
    trace_ = std::make_unique<sim::ChromeTraceWriter>(
        opts_.trace_path, fmt::format("NeuronCore ({})", p_.name),
        sim::TraceFilter::from_ns(opts_.trace_limit, opts_.trace_window_start_ns, opts_.trace_window_end_ns));
    recorder_ = std::make_unique<engines::TraceRecorder>(*this, *trace_);
    add_instr_listener([r = recorder_.get()](const Instr& in, const InstrTiming& t) { r->on_instr(in, t); });
  }
}

std::unique_ptr<Simulator> Simulator::from_preset(const std::string& preset, const std::vector<std::string>& overrides,
                                                  SimOptions opts) {
  return std::make_unique<Simulator>(engines::load_config(preset, overrides), std::move(opts));
}

Simulator::~Simulator() {
  try {
    finish();
  } catch (...) {  // a destructor never throws; finish() errors surface when called explicitly
  }
}

const memory::HbmTensor& Simulator::alloc_hbm(const std::string& name, const std::vector<int64_t>& shape, DType dt) {
  const memory::HbmTensor& t = mem_.alloc_hbm(name, shape, dt);
  deps_.reserve_hbm(t.addr + t.bytes);
  if (asap_) asap_->reserve_hbm(t.addr + t.bytes);
  return t;
}

void Simulator::write_hbm(const std::string& name, const void* data, size_t bytes) {
  const memory::HbmTensor& t = mem_.hbm_tensor(name);
  if (static_cast<int64_t>(bytes) != t.bytes)
    throw Error(ErrorCode::kShapeMismatch,
                fmt::format("HBM tensor '{}' holds {} bytes, {} were given", name, t.bytes, bytes));
  if (uint8_t* d = mem_.hbm_data(name)) std::memcpy(d, data, bytes);
}

std::vector<uint8_t> Simulator::read_hbm(const std::string& name) const {
  const memory::HbmTensor& t = mem_.hbm_tensor(name);
  const uint8_t* d = mem_.hbm_data(name);
  if (!d) return std::vector<uint8_t>(static_cast<size_t>(t.bytes), 0);
  return std::vector<uint8_t>(d, d + t.bytes);
}

Operand Simulator::alloc_tile(Space space, uint32_t partitions, const std::vector<int64_t>& free_shape, DType dt) {
  const int limit = space == Space::kPsum ? p_.mem.psum_partitions : p_.mem.partitions;
  if (space != Space::kSbuf && space != Space::kPsum)
    throw Error(ErrorCode::kBadBuffer, "alloc_tile: tiles live in sbuf or psum");
  if (partitions == 0 || partitions > static_cast<uint32_t>(limit))
    throw Error(ErrorCode::kTooManyPartitions,
                fmt::format("a tile of {} partitions was requested; {} has {}", partitions, isa::space_name(space), limit));
  if (free_shape.size() > static_cast<size_t>(isa::kMaxFreeDims))
    throw Error(ErrorCode::kBadAccessPattern, fmt::format("a tile has at most 4 free dims, got {}", free_shape.size()));
  int64_t elems = 1;
  for (int64_t d : free_shape) {
    if (d <= 0) throw Error(ErrorCode::kBadAccessPattern, fmt::format("tile free dim of size {}", d));
    if (elems > (int64_t{1} << 40) / d) throw Error(ErrorCode::kSbufOverflow, "tile is far larger than any memory");
    elems *= d;
  }
  const int64_t bytes = elems * dtype_bytes(dt);
  const int64_t off = mem_.alloc_onchip(space, bytes);
  Operand o;
  o.space = space;
  o.dtype = dt;
  o.offset = off;
  o.num_partitions = partitions;
  o.nfree = static_cast<uint8_t>(free_shape.size());
  int64_t st = 1;
  for (int d = o.nfree - 1; d >= 0; --d) {
    o.size[static_cast<size_t>(d)] = free_shape[static_cast<size_t>(d)];
    o.stride[static_cast<size_t>(d)] = st;
    st *= free_shape[static_cast<size_t>(d)];
  }
  return o;
}

void Simulator::set_onchip_peak(int64_t sbuf, int64_t psum) {
  onchip_peak_[0] = std::max(onchip_peak_[0], sbuf);
  onchip_peak_[1] = std::max(onchip_peak_[1], psum);
}

void Simulator::free_tile(const Operand& tile) { mem_.free_onchip(tile.space, tile.offset); }

uint32_t Simulator::add_source(const SourceLoc& loc) {
  sources_.push_back(loc);
  per_loc_.emplace_back(0, 0);
  return static_cast<uint32_t>(sources_.size() - 1);
}

InstrTiming Simulator::submit(const Instr& in, Ps not_before, const engines::DepTracker::Ready* known_ready) {
  if (finished_) throw Error(ErrorCode::kInternal, "submit() after finish()");
  const SourceLoc& where = source(in.loc);
  isa::verify(in, limits_, where);
  const isa::OpInfo& info = isa::op_info(in.op);
  if (isa::is_dma(in.op)) {
    for (int i = 0; i < info.num_slots; ++i)
      if (in.slot(i).space == Space::kHbm) {
        try {
          mem_.check_bounds(in.slot(i), info.slots[static_cast<size_t>(i)].name);
        } catch (const Error& e) {
          throw Error(e.code(), fmt::format("{}: {}", info.mnemonic, e.message()), where);
        }
      }
  }
  if (opts_.numerics) {
    isa::Views v{};
    for (int i = 0; i < info.num_slots; ++i) v[static_cast<size_t>(i)] = mem_.resolve(in.slot(i));
    try {
      isa::execute(in, v, st_);
    } catch (const Error& e) {
      throw Error(e.code(), e.message(), where);
    }
  }
  not_before_ = not_before;
  known_ready_ = known_ready;
  InstrTiming t = schedule(in);
  not_before_ = 0;
  known_ready_ = nullptr;
  return t;
}

// ------------------------------------------------------------------ compiler hooks

engines::DepTracker::Ready Simulator::operands_ready_tag(const Instr& in, Engine e) const {
  return deps_.ready(static_cast<uint8_t>(e), regions(in));
}

Ps Simulator::engine_free(const Instr& in, Engine e) const {
  Ps t = next_issue_[static_cast<size_t>(e)];
  if (isa::is_dma(in.op) || e == Engine::kTensor) return t;
  bool sbuf = false, psum = false;
  for (int i = 0; i < isa::kMaxSlots; ++i) {
    sbuf |= in.slot(i).space == Space::kSbuf;
    psum |= in.slot(i).space == Space::kPsum;
  }
  if (p_.vector_gpsimd_sbuf_exclusive && sbuf && (e == Engine::kVector || e == Engine::kGpsimd))
    t = std::max(t, excl_sbuf_free_);
  if (p_.vector_scalar_psum_exclusive && psum && (e == Engine::kVector || e == Engine::kScalar))
    t = std::max(t, excl_psum_free_);
  return t;
}

Ps Simulator::busy_estimate(const Instr& in, Engine e) const {
  if (isa::is_dma(in.op)) return e == Engine::kScalar ? p_.hwdge_instr : e == Engine::kGpsimd ? p_.swdge_instr : p_.trigger_instr;
  Instr on = in;
  on.engine = e;
  const sim::ClockDomain& clk = p_.clk(e);
  switch (e) {
    case Engine::kTensor:
      if (in.op == Opcode::kLoadStationary) return clk.cycles_to_ps(engines::load_stationary_ii(p_, on));
      if (in.op == Opcode::kMultiplyMoving)
        return clk.cycles_to_ps(engines::multiply_moving_ii(p_, on, stationary_dtype_, stationary_m_));
      return clk.cycles_to_ps(engines::pe_transpose_ii(p_, on));
    case Engine::kScalar: return clk.cycles_to_ps(engines::scalar_cost(p_, on).busy);
    case Engine::kGpsimd: return clk.cycles_to_ps(engines::gpsimd_cost(p_, on).busy);
    default: return clk.cycles_to_ps(engines::vector_cost(p_, on).busy);
  }
}

Ps Simulator::duration_estimate(const Instr& in, Engine e) const {
  if (isa::is_dma(in.op)) {
    const Operand& o = in.slot(0);
    const double bytes = static_cast<double>(o.total_elems() * dtype_bytes(o.dtype));
    const double bw = p_.dma_engine_bw * std::max(1, std::min<int>(p_.dma_engines, static_cast<int>(o.num_partitions)));
    return busy_estimate(in, e) + p_.dma_setup + sim::ns_to_ps(bytes / std::min(bw, p_.hbm_bw));
  }
  Instr on = in;
  on.engine = e;
  const sim::ClockDomain& clk = p_.clk(e);
  switch (e) {
    case Engine::kTensor: return busy_estimate(in, e) + clk.cycles_to_ps(p_.mm_latency);
    case Engine::kScalar: {
      const engines::StreamCost c = engines::scalar_cost(p_, on);
      return clk.cycles_to_ps(c.busy + c.latency);
    }
    case Engine::kGpsimd: {
      const engines::StreamCost c = engines::gpsimd_cost(p_, on);
      return clk.cycles_to_ps(c.busy + c.latency);
    }
    default: {
      const engines::StreamCost c = engines::vector_cost(p_, on);
      return clk.cycles_to_ps(c.busy + c.latency);
    }
  }
}

void Simulator::run(const std::function<bool(Instr&)>& next) {
  Instr in;
  while (next(in)) submit(in);
}

InstrTiming Simulator::schedule(const Instr& in) {
  InstrTiming t;
  if (isa::is_dma(in.op)) t = schedule_dma(in);
  else if (in.engine == Engine::kTensor) t = schedule_tensor(in);
  else t = schedule_stream(in);
  t.index = seq_;
  account_bytes(in);
  const auto oi = static_cast<size_t>(in.op);
  const auto ei = static_cast<size_t>(in.engine);
  ++c_.opcode_count[oi];
  c_.opcode_time[oi] += t.end - t.start;
  ++c_.engine_opcode_count[ei][oi];
  c_.engine_opcode_time[ei][oi] += t.end - t.start;
  if (in.loc < per_loc_.size()) {
    ++per_loc_[in.loc].first;
    per_loc_[in.loc].second += t.end - t.start;
  }
  c_.start = std::min(c_.start, t.start);
  c_.end = std::max(c_.end, t.end);
  // No later instruction or DMA packet starts before the watermark: prune and fold up to it (the
  // active-time unions every kFoldEvery instructions: they only grow a little meanwhile).
  const bool dma = isa::is_dma(in.op);
  if (dma || trace_ || (seq_ % kFoldEvery) == 0) {
    const Ps w = watermark();
    if (dma) {
      dma_.prune(w);
      for (auto& u : c_.dma_class_active) u.fold(w);
    }
    if ((seq_ % kFoldEvery) == 0) fold_active(w);
    if (trace_) trace_->watermark(w);
  }
  for (const auto& fn : listeners_) fn(in, t);
  ++seq_;
  return t;
}

engines::DepTracker::Regions Simulator::regions(const Instr& in, const engines::DepTracker& on) const {
  // Split an instruction's operands into the regions it reads and writes (table-derived roles).
  engines::DepTracker::Regions r;
  const isa::OpInfo& info = isa::op_info(in.op);
  for (int i = 0; i < info.num_slots; ++i) {
    const Operand& o = in.slot(i);
    if (!o.present()) continue;
    if (info.slots[static_cast<size_t>(i)].written) r.writes[static_cast<size_t>(r.nw++)] = on.range_of(o);
    else r.reads[static_cast<size_t>(r.nr++)] = on.range_of(o);
  }
  return r;
}

void Simulator::note_active(Ps s, Ps e) {
  // Engine activity: grow the staged interval while intervals overlap or touch it (the engines
  // mostly run back to back), hand it to any_active when a disjoint one comes.
  if (s <= stage_hi_ && e >= stage_lo_) {
    stage_lo_ = std::min(stage_lo_, s);
    stage_hi_ = std::max(stage_hi_, e);
    return;
  }
  if (stage_hi_ >= 0) c_.any_active.add(stage_lo_, stage_hi_);
  stage_lo_ = s;
  stage_hi_ = e;
}

void Simulator::fold_active(Ps w) {
  // The DMA union forwards its time before w into any_active: fold it first. The staged interval
  // goes in too if it starts before w (whatever is added later starts at or after w).
  c_.dma_active.fold(w);
  if (stage_hi_ >= 0 && stage_lo_ < w) {
    c_.any_active.add(stage_lo_, stage_hi_);
    stage_lo_ = 0;
    stage_hi_ = -1;
  }
  c_.any_active.fold(w);
}

void Simulator::schedule_asap(const Instr& in, uint8_t cls, Ps dur) {
  const auto rg = regions(in, *asap_);
  const Ps end = asap_->ready(cls, rg).time + dur;
  asap_->record(cls, seq_, rg, end, end);
  asap_end_ = std::max(asap_end_, end);
}

namespace {
// The ready time and producer of an instruction, as reported in InstrTiming.
void set_wait(InstrTiming& t, const engines::DepTracker::Ready& r, Ps free, uint64_t now) {
  t.free = free;
  t.ready = r.time;
  if (r.time > 0) {
    t.waited_for = static_cast<int64_t>(engines::DepTracker::tag_index(r.tag, now));
    t.waited_class = engines::DepTracker::tag_class(r.tag);
  }
}
}  // namespace

InstrTiming Simulator::schedule_stream(const Instr& in) {
  const auto e = static_cast<size_t>(in.engine);
  const sim::ClockDomain& clk = p_.clk(in.engine);
  engines::StreamCost cost;
  Ps extra = 0;
  switch (in.engine) {
    case Engine::kVector: cost = engines::vector_cost(p_, in); break;
    case Engine::kScalar: {
      cost = engines::scalar_cost(p_, in);
      if (in.op == Opcode::kActivation || in.op == Opcode::kActivationReduce) {
        const int set = p_.act_table_set[static_cast<size_t>(in.act)];
        if (set >= 0 && set != scalar_table_set_) {  // a different function table set must be loaded
          extra = p_.scalar_act_table_load;
          scalar_table_set_ = set;
        }
      }
      break;
    }
    case Engine::kGpsimd: cost = engines::gpsimd_cost(p_, in); break;
    default: cost = engines::vector_cost(p_, in); break;
  }
  const Ps busy = clk.cycles_to_ps(cost.busy) + extra;
  const Ps lat = clk.cycles_to_ps(cost.latency);
  const auto rg = regions(in);
  const auto cls = static_cast<uint8_t>(in.engine);
  const engines::DepTracker::Ready rd = known_ready_ ? *known_ready_ : deps_.ready(cls, rg);
  const Ps ready = std::max(rd.time, not_before_), free = next_issue_[e];
  Ps start = std::max(free, ready);
  // Gen2 port conflicts: VectorE/GpSimd share SBUF access, VectorE/ScalarE share PSUM access.
  bool sbuf = false, psum = false;
  for (int i = 0; i < isa::kMaxSlots; ++i) {
    sbuf |= in.slot(i).space == Space::kSbuf;
    psum |= in.slot(i).space == Space::kPsum;
  }
  const bool use_sbuf_port = p_.vector_gpsimd_sbuf_exclusive && sbuf &&
                             (in.engine == Engine::kVector || in.engine == Engine::kGpsimd);
  const bool use_psum_port = p_.vector_scalar_psum_exclusive && psum &&
                             (in.engine == Engine::kVector || in.engine == Engine::kScalar);
  if (use_sbuf_port) start = std::max(start, excl_sbuf_free_);
  if (use_psum_port) start = std::max(start, excl_psum_free_);
  if (use_sbuf_port) excl_sbuf_free_ = start + busy;
  if (use_psum_port) excl_psum_free_ = start + busy;
  const Ps end = start + busy + lat;
  next_issue_[e] = start + busy;
  deps_.record(cls, seq_, rg, end, end);
  if (asap_) schedule_asap(in, cls, end - start);
  TrackCounters& tc = c_.engine[e];
  ++tc.instructions;
  tc.busy += busy;
  tc.instr_time += end - start;
  tc.add_interval(start, end);
  note_active(start, end);
  tc.flops += engines::instr_flops(in, 0);
  InstrTiming t{start, end, start + busy};
  set_wait(t, rd, free, seq_);
  t.flops = engines::instr_flops(in, 0);
  t.perf_mode = static_cast<uint8_t>(cost.perf_mode);
  return t;
}

InstrTiming Simulator::schedule_tensor(const Instr& in) {
  const auto rg = regions(in);
  const auto cls = static_cast<uint8_t>(Engine::kTensor);
  const engines::DepTracker::Ready rd = known_ready_ ? *known_ready_ : deps_.ready(cls, rg);
  const Ps ready = std::max(rd.time, not_before_), free = next_issue_[static_cast<size_t>(Engine::kTensor)];
  engines::TensorPipes::Slot s;
  double flops = 0;
  if (in.op == Opcode::kLoadStationary) {
    s = tensor_.load_stationary(ready, engines::load_stationary_ii(p_, in));
    stationary_dtype_ = in.slot(0).dtype;
    stationary_m_ = in.slot(0).elems_per_partition() / ((in.flags & isa::kDoubleRow) ? 2 : 1);
  } else if (in.op == Opcode::kMultiplyMoving) {
    s = tensor_.multiply(ready, engines::multiply_moving_ii(p_, in, stationary_dtype_, stationary_m_), false);
    flops = engines::instr_flops(in, stationary_m_);
    // bf16-equivalent: the larger multiplier of the two inputs (fp32 x bf16 = fp32, fp8 x bf16 = 1).
    const double adj = flops * std::max(p_.adjusted_flops[static_cast<size_t>(in.slot(1).dtype)],
                                        p_.adjusted_flops[static_cast<size_t>(stationary_dtype_)]);
    if (in.flags & isa::kIsTranspose) {
      c_.transpose_flops += flops;
      c_.adjusted_transpose_flops += adj;
    } else {
      c_.matmul_flops += flops;
      c_.adjusted_matmul_flops += adj;
      ++c_.matmul_instructions;
    }
  } else {  // PE transpose: the data goes in as the weights, against an identity of its dtype
    s = tensor_.multiply(ready, engines::pe_transpose_ii(p_, in), true);
    flops = engines::instr_flops(in, 0);
    c_.transpose_flops += flops;
    c_.adjusted_transpose_flops += flops * p_.adjusted_flops[static_cast<size_t>(in.slot(1).dtype)];
  }
  deps_.record(cls, seq_, rg, s.end, s.end);
  if (asap_) schedule_asap(in, cls, s.end - s.start);
  TrackCounters& tc = c_.engine[static_cast<size_t>(Engine::kTensor)];
  ++tc.instructions;
  tc.busy += s.ii;
  tc.instr_time += s.end - s.start;
  tc.add_interval(s.start, s.end);
  note_active(s.start, s.end);
  tc.flops += flops;
  next_issue_[static_cast<size_t>(Engine::kTensor)] = tensor_.next_issue();
  InstrTiming t{s.start, s.end, s.start + s.ii};
  set_wait(t, rd, free, seq_);
  t.flops = flops;
  return t;
}

InstrTiming Simulator::schedule_dma(const Instr& in) {
  const auto e = static_cast<size_t>(in.engine);
  const Operand& dst = in.slot(0);
  const Operand& src = in.slot(1);
  const auto rg = regions(in);
  // The trigger engine waits on the semaphores of the data's producers, then issues the trigger.
  const engines::DepTracker::Ready rd =
      known_ready_ ? *known_ready_ : deps_.ready(static_cast<uint8_t>(in.engine), rg);
  const Ps ready = std::max(rd.time, not_before_), free = next_issue_[e];
  const Ps trig_start = std::max(free, ready);
  Ps trig = p_.trigger_instr;
  if (in.engine == Engine::kScalar) trig = p_.hwdge_instr;
  if (in.engine == Engine::kGpsimd) trig = p_.swdge_instr;
  next_issue_[e] = trig_start + trig;
  const memory::DmaSplit split = memory::split_transfer(dst, src, p_.dma_engines, p_.partitions_per_engine);
  double eff = 1.0;
  if (in.op == Opcode::kDmaTranspose)
    eff = src.space == Space::kHbm ? p_.dma_transpose_eff_hbm2sbuf : p_.dma_transpose_eff_sbuf2sbuf;
  const engines::DmaEngines::Transfer tr = dma_.transfer(in.dma_queue, trig_start, split, eff);
  deps_.record(kClassDma, seq_, rg, tr.done, tr.done);
  if (asap_) {  // its own time, without queueing behind other transfers: setup (from the trigger), longest piece
    Ps piece = 0;
    for (int k = 0; k < split.engines; ++k)
      piece = std::max(piece, tr.piece_end[static_cast<size_t>(k)] - tr.piece_start[static_cast<size_t>(k)]);
    schedule_asap(in, kClassDma, p_.dma_setup + piece);
  }
  if (!listeners_.empty()) last_split_ = split, last_transfer_ = tr;

  TrackCounters& tc = c_.engine[e];
  ++tc.instructions;
  tc.busy += trig;
  tc.instr_time += trig;
  tc.add_interval(trig_start, trig_start + trig);
  note_active(trig_start, trig_start + trig);
  ++c_.dma_transfers;
  const size_t q = static_cast<size_t>(in.dma_queue % p_.dma_queues);
  if (!c_.dma_queue_used[q]) {
    c_.dma_queue_used[q] = true;
    ++c_.dma_queues_used;
  }
  sim::IntervalUnion& by_class = c_.dma_class_active[static_cast<size_t>(
      in.engine == Engine::kScalar ? DmaClass::kHardwareDynamic
                                   : in.engine == Engine::kGpsimd ? DmaClass::kSoftwareDynamic : DmaClass::kStatic)];
  // The transfer's packets merged where they overlap or touch (the engines of one transfer usually
  // move at the same time): one add to each union per merged interval instead of one per engine.
  std::array<std::pair<Ps, Ps>, memory::kMaxDmaEngines> merged;
  size_t nm = 0;
  for (int k = 0; k < split.engines; ++k) {
    const auto ki = static_cast<size_t>(k);
    if (split.piece[ki].bytes <= 0) continue;
    TrackCounters& d = c_.dma[ki];
    ++d.instructions;
    d.busy += tr.piece_end[ki] - tr.piece_start[ki];
    d.instr_time += tr.piece_end[ki] - tr.piece_start[ki];
    // A packet may fill an idle gap before the engine's latest one (a later transfer that was ready
    // earlier, on another queue): packets never overlap on one DMA engine, so it adds its duration.
    if (tr.piece_start[ki] < d.cur_lo) d.active += tr.piece_end[ki] - tr.piece_start[ki];
    else d.add_interval(tr.piece_start[ki], tr.piece_end[ki]);
    if (nm && tr.piece_start[ki] <= merged[nm - 1].second && tr.piece_end[ki] >= merged[nm - 1].first) {
      merged[nm - 1].first = std::min(merged[nm - 1].first, tr.piece_start[ki]);
      merged[nm - 1].second = std::max(merged[nm - 1].second, tr.piece_end[ki]);
    } else {
      merged[nm++] = {tr.piece_start[ki], tr.piece_end[ki]};
    }
    d.bytes += static_cast<uint64_t>(split.piece[ki].bytes);
    c_.dma_descriptors += static_cast<uint64_t>(split.piece[ki].descriptors);
  }
  for (size_t i = 0; i < nm; ++i) {  // any_active gets them from dma_active as the watermark passes
    c_.dma_active.add(merged[i].first, merged[i].second);
    by_class.add(merged[i].first, merged[i].second);
  }
  InstrTiming t{trig_start, tr.done, trig_start + trig};
  set_wait(t, rd, free, seq_);
  t.setup_start = tr.setup_start;
  t.data_start = tr.data_start;
  return t;
}

void Simulator::account_bytes(const Instr& in) {
  const isa::OpInfo& info = isa::op_info(in.op);
  for (int i = 0; i < info.num_slots; ++i) {
    const Operand& o = in.slot(i);
    if (!o.present()) continue;
    const bool written = info.slots[static_cast<size_t>(i)].written;
    const auto bytes = static_cast<uint64_t>(o.total_elems() * dtype_bytes(o.dtype));
    switch (o.space) {
      case Space::kHbm: (written ? c_.hbm_write : c_.hbm_read) += bytes; break;
      case Space::kSbuf: (written ? c_.sbuf_write : c_.sbuf_read) += bytes; break;
      case Space::kPsum: (written ? c_.psum_write : c_.psum_read) += bytes; break;
      case Space::kNone: break;
    }
  }
}

Ps Simulator::watermark() const {
  // Every later instruction starts no earlier than the earliest next issue of any engine, nor than
  // the floor the caller promised (an engine that never issues keeps the first at 0).
  Ps w = INT64_MAX;
  for (Ps t : next_issue_) w = std::min(w, t);
  return std::max(w, start_floor_);
}

void Simulator::finish() {
  if (finished_) return;
  finished_ = true;
  for (auto& t : c_.engine) t.close();
  for (auto& t : c_.dma) t.close();
  fold_active(INT64_MAX);  // DMA time, then the staged engine interval, into any_active
  c_.dma_active.close();
  for (auto& u : c_.dma_class_active) u.close();
  c_.any_active.close();
  if (trace_) trace_->finish();
}

std::vector<Simulator::LineStats> Simulator::line_stats() const {
  // One entry per source line: several ops on one line (and each op registers its location) add up.
  std::vector<LineStats> v;
  std::unordered_map<std::string, size_t> at;
  for (size_t i = 1; i < per_loc_.size(); ++i) {
    if (!per_loc_[i].first) continue;
    const SourceLoc& l = sources_[i];
    auto [it, fresh] = at.try_emplace(fmt::format("{}\n{}\n{}", l.file, l.line, l.function), v.size());
    if (fresh) {
      v.push_back({l, per_loc_[i].first, per_loc_[i].second});
    } else {
      v[it->second].instructions += per_loc_[i].first;
      v[it->second].instr_time += per_loc_[i].second;
    }
  }
  std::stable_sort(v.begin(), v.end(), [](const LineStats& a, const LineStats& b) { return a.instr_time > b.instr_time; });
  return v;
}

}  // namespace nsim
