#include "engines/simulator.h"

#include <fmt/format.h>

#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <unordered_map>

#include "engines/cost.h"
#include "engines/trace_recorder.h"
#include "isa/semantics/gemm.h"
#include "isa/semantics/parallel.h"
#include "sim/host_memory.h"
#include "sim/trace.h"

namespace nsim {

using engines::kClassDma;
using isa::Engine;
using isa::Instr;
using isa::Opcode;
using isa::Operand;
using isa::Space;
using sim::Ps;

namespace {

engines::DepTracker::Config dep_config(const engines::CoreParams& p) {
  engines::DepTracker::Config d;
  d.partitions = p.mem.partitions;
  d.sbuf_bytes = p.mem.sbuf_bytes_per_partition;
  d.psum_partitions = p.mem.psum_partitions;
  d.psum_bytes = p.mem.psum_bytes_per_partition();
  d.chunk_bytes = p.dep_chunk_bytes;
  d.hbm_chunk_bytes = p.hbm_dep_chunk_bytes;
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

}  // namespace

Simulator::Simulator(const sim::Config& cfg, SimOptions opts)
    : cfg_(cfg),
      p_(engines::CoreParams::from_config(cfg)),
      opts_(std::move(opts)),
      limits_(p_.limits()),
      mem_(p_.mem, opts_.numerics, std::max<int64_t>(4, p_.dep_chunk_bytes)),
      deps_(dep_config(p_), latency_table(p_)),
      stream_(p_),
      tensor_(p_),
      dma_(p_),
      stats_(p_) {
  st_.generation = p_.generation;
  sources_.push_back(SourceLoc{});
  if (opts_.check && opts_.numerics) checker_ = std::make_unique<engines::Checker>(p_.mem, p_.generation);
  if (opts_.numerics && opts_.async_product) {
    gemm_async_ = std::make_unique<isa::sem::AsyncGemm>();
    st_.async_gemm = gemm_async_.get();
  }
  if (opts_.dependency_bound) {
    asap_ = std::make_unique<engines::DepTracker>(dep_config(p_), latency_table(p_));
    start_events();
  }
  if (opts_.free_pe_helpers || !opts_.free_folds.empty()) pe_free_ = std::make_unique<engines::PeResults>();
  if (!opts_.trace_path.empty()) {
    const std::string process = opts_.core_index >= 0 ? fmt::format("NeuronCore {} ({}, LNC=2)", opts_.core_index, p_.name)
                                                      : fmt::format("NeuronCore ({})", p_.name);
    const sim::TraceFilter filter =
        sim::TraceFilter::from_ns(opts_.trace_limit, opts_.trace_window_start_ns, opts_.trace_window_end_ns);
    if (sim::is_protobuf_trace_path(opts_.trace_path)) {  // (core c of an LNC=2 launch: process c + 1)
      auto w = std::make_unique<sim::PerfettoTraceWriter>(opts_.trace_path, process, filter,
                                                          std::max(0, opts_.core_index) + 1);
      // Compressed on a host thread of its own when there is a second one (the same file).
      if (opts_.listener_thread && isa::sem::host_threads() >= 2) w->compress_beside();
      trace_ = std::move(w);
    } else {
      trace_ = std::make_unique<sim::ChromeTraceWriter>(opts_.trace_path, process, filter);
    }
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
  // Host memory this tensor costs: its storage (numerics only) and the dependency tracker's chunks up
  // to its end (twice with the dependency bound). Refused up front, naming the tensor, rather than
  // failing inside the allocator (std::bad_alloc) or being killed by the OOM killer.
  int64_t elems = 1;
  bool sized = true;
  for (int64_t d : shape) {
    if (d <= 0 || elems > std::numeric_limits<int64_t>::max() / d / 16) {
      sized = false;  // mem_ reports these (E207, E205)
      break;
    }
    elems *= d;
  }
  if (sized && !mem_.has_hbm_tensor(name)) {
    const int64_t bytes = elems * dtype_bytes(dt);
    const int64_t end = mem_.hbm_end() + bytes + 64;
    if (end <= p_.mem.hbm_bytes) {  // else E205 from mem_
      const int64_t deps = deps_.reserve_hbm_cost(end) * (asap_ ? 2 : 1);
      const int64_t need = (opts_.numerics ? bytes : 0) + deps;
      const int64_t avail = sim::host_memory_available();
      if (avail >= 0 && need > avail)
        throw Error(ErrorCode::kHostMemory,
                    fmt::format("HBM tensor '{}' {} {} needs {} bytes ({:.2f} GiB) of host memory to simulate ({} of "
                                "data, {} of dependency tracking), but only {} bytes ({:.2f} GiB) are available; use a "
                                "smaller shape{}",
                                name, fmt::format("[{}]", fmt::join(shape, ", ")), dtype_name(dt), need, static_cast<double>(need) / (1 << 30),
                                opts_.numerics ? bytes : 0, deps, avail, static_cast<double>(avail) / (1 << 30),
                                opts_.numerics ? ", or run timing-only (no data storage)" : ""));
    }
  }
  const memory::HbmTensor& t = mem_.alloc_hbm(name, shape, dt);
  sync_events();  // (asap_ is the event pipe's while instructions run)
  deps_.reserve_hbm(t.addr + t.bytes);
  if (asap_) asap_->reserve_hbm(t.addr + t.bytes);
  ++regions_epoch_;
  return t;
}

void Simulator::attach_peer(Simulator& owner) {
  if (mem_.hbm_end() > 0) throw Error(ErrorCode::kInternal, "attach_peer() after HBM tensors were allocated");
  mem_.share_hbm(owner.mem_);
  peer_ = &owner;
  owner.peer_ = this;
  dma_.set_peer(&owner.dma_);
  owner.dma_.set_peer(&dma_);
  reserve_hbm_deps();
}

void Simulator::reserve_hbm_deps() {
  sync_events();
  deps_.reserve_hbm(mem_.hbm_end());
  if (asap_) asap_->reserve_hbm(mem_.hbm_end());
  ++regions_epoch_;
}

void Simulator::write_hbm(const std::string& name, const void* data, size_t bytes) {
  const memory::HbmTensor& t = mem_.hbm_tensor(name);
  if (static_cast<int64_t>(bytes) != t.bytes)
    throw Error(ErrorCode::kShapeMismatch,
                fmt::format("HBM tensor '{}' holds {} bytes, {} were given", name, t.bytes, bytes));
  if (uint8_t* d = mem_.hbm_data_to_overwrite(name)) std::memcpy(d, data, bytes);
}

const uint8_t* Simulator::hbm_bytes(const std::string& name) const {
  numerics_done();
  return mem_.hbm_data(name);
}

memory::Buffer Simulator::take_hbm(const std::string& name) {
  numerics_done();
  return mem_.take_hbm_data(name);
}

std::vector<uint8_t> Simulator::read_hbm(const std::string& name) const {
  const int64_t bytes = mem_.hbm_tensor(name).bytes;
  // The copy needs as much host memory again as the tensor's storage (found by the fuzz driver: a
  // 2 GiB output read back under a 3 GiB address-space limit ended in std::bad_alloc, E901).
  if (const int64_t avail = sim::host_memory_available(); avail >= 0 && bytes > avail)
    throw Error(ErrorCode::kHostMemory,
                fmt::format("reading HBM tensor '{}' back needs {} bytes ({:.2f} GiB) of host memory for its copy, but "
                            "only {} bytes ({:.2f} GiB) are available; use a smaller shape, or do not ask for its values",
                            name, bytes, static_cast<double>(bytes) / (1 << 30), avail,
                            static_cast<double>(avail) / (1 << 30)));
  const uint8_t* d = hbm_bytes(name);
  if (!d) return std::vector<uint8_t>(static_cast<size_t>(bytes), 0);
  return std::vector<uint8_t>(d, d + bytes);
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
  sync_events();  // (the event listeners read sources_)
  sources_.push_back(loc);
  stats_.add_source();
  return static_cast<uint32_t>(sources_.size() - 1);
}

void Simulator::throw_interrupted() const {
  throw Error(ErrorCode::kInterrupted, fmt::format("interrupted after {} instructions ({:.1f} ns simulated)", seq_,
                                                   sim::ps_to_ns(total_time())));
}

void Simulator::throw_limit() const {
  if (opts_.max_instructions > 0 && seq_ >= opts_.max_instructions)
    throw Error(ErrorCode::kResourceLimit,
                fmt::format("instruction limit reached: the kernel runs more than {} instructions (max_instructions, "
                            "'nsim run --max-instructions'); raise the limit, or set it to 0 for none",
                            opts_.max_instructions));
  if (opts_.max_sim_time_ns > 0 && sim::ps_to_ns(total_time()) > opts_.max_sim_time_ns)
    throw Error(ErrorCode::kResourceLimit,
                fmt::format("simulated-time limit reached: {:.1f} ns simulated after {} instructions, more than {} ns "
                            "(max_sim_time_ns, 'nsim run --max-sim-time'); raise the limit, or set it to 0 for none",
                            sim::ps_to_ns(total_time()), seq_, opts_.max_sim_time_ns));
}

InstrTiming Simulator::submit(const Instr& in, Ps not_before, const engines::DepTracker::Ready* known_ready,
                              const engines::DepTracker::Regions* known_regions) {
  const engines::SlotTags* tags = slot_tags_;  // for this instruction only
  slot_tags_ = nullptr;
  if (finished_) throw Error(ErrorCode::kInternal, "submit() after finish()");
  check_limits();
  const SourceLoc& where = source(in.loc);
  const Sig& sig = signature(in, where);
  const isa::OpInfo& info = isa::op_info(in.op);
  if (isa::is_dma(in.op) || sequencer_op(info)) {  // (the instructions with HBM slots, isa/opcodes.def)
    for (int i = 0; i < info.num_slots; ++i)
      if (in.slot(i).space == Space::kHbm) {
        try {
          // An indirect side: every row an in-range runtime index may reach stays inside the tensor.
          const int64_t reach = i == isa::indirect_slot(in) ? isa::slot_extent(in, i).second - in.slot(i).byte_extent().second : 0;
          mem_.check_bounds(in.slot(i), info.slots[static_cast<size_t>(i)].name, reach);
        } catch (const Error& e) {
          throw Error(e.code(), fmt::format("{}: {}", info.mnemonic, e.message()), where);
        }
      }
  }
  if (opts_.numerics) {
    isa::Views v{};
    for (int i = 0; i < info.num_slots; ++i) v[static_cast<size_t>(i)] = mem_.resolve_slot(in, i);
    if (gemm_async_) {
      if (gemm_async_->pending()) wait_for_product(in, v);
      forget_written(in, v);
    }
    if (checker_) checker_->before(in, v, seq_, where, tags);
    try {
      isa::execute(in, v, st_);
    } catch (const Error& e) {
      throw Error(e.code(), e.message(), where);
    }
    // The sanitizer reads an instruction's results right after it: a matmul's product is complete first
    // (unless it only marks the bytes written: an accumulating matmul into fp32 PSUM). Any other instruction
    // waited above for a product whose bytes it reads or writes; a product still running then is such an
    // accumulation elsewhere (no value the sanitizer reads, no narrowing cast it counts), so it runs on.
    if (checker_ && gemm_async_ && in.op == Opcode::kMultiplyMoving && engines::Checker::reads_results(in))
      gemm_async_->wait();
    if (checker_) checker_->after(in, v, seq_, where, tags);
  }
  not_before_ = not_before;
  known_ready_ = known_ready;
  known_regions_ = known_regions;
  InstrTiming t = schedule(in, sig);
  not_before_ = 0;
  known_ready_ = nullptr;
  known_regions_ = nullptr;
  return t;
}

void Simulator::wait_for_product(const Instr& in, const isa::Views& v) {
  // An operand in the bytes the pending product writes: it must be complete first. (multiply_moving's dst
  // excepted: its exec waits before writing it, after converting its moving operand meanwhile.) A side
  // addressed at run time may reach past its view: then always.
  if (isa::indirect_slot(in) >= 0) {
    gemm_async_->wait();
    return;
  }
  for (int i = in.op == Opcode::kMultiplyMoving ? 1 : 0; i < isa::kMaxSlots; ++i) {
    if (gemm_async_->writes(v[static_cast<size_t>(i)])) {
      gemm_async_->wait();
      return;
    }
  }
}

void Simulator::forget_written(const Instr& in, const isa::Views& v) {
  // The moving tiles kept converted (isa::sem::AsyncGemm) that `in` may write. A side addressed at run
  // time may reach past its view: then all.
  const isa::OpInfo& info = isa::op_info(in.op);
  const int indirect = isa::indirect_slot(in);
  for (int i = 0; i < info.num_slots; ++i) {
    if (!info.slots[static_cast<size_t>(i)].written) continue;
    if (i == indirect) gemm_async_->forget_all();
    else gemm_async_->forget(v[static_cast<size_t>(i)]);
  }
}

const Simulator::Sig& Simulator::signature(const Instr& in, const SourceLoc& where) {
  if (!opts_.signature_cache) {
    isa::verify(in, limits_, where);
    if (!sig_scratch_) sig_scratch_ = std::make_unique<Sig>();
    fill_signature(*sig_scratch_, in, 0);
    return *sig_scratch_;
  }
  const size_t loc = in.loc < sources_.size() ? in.loc : 0;  // (an unknown id reads as no location, as source() does)
  const size_t hi = loc * kHintSlots + hint_slot(in);
  if (hi >= sig_hint_.size()) sig_hint_.resize(std::max(hi + 1, sources_.size() * kHintSlots));
  SigHint& hint = sig_hint_[hi];
  // The signature passed verify(): only the checks of the offsets remain. When one fails, verify()
  // throws the error a run without the cache gives.
  const auto matches = [&](const Sig* e) {
    return e && e->valid && e->key.op == in.op && e->key.dma_queue == in.dma_queue && isa::same_signature(e->key, in);
  };
  if (matches(hint.latest) || (matches(hint.other) && (std::swap(hint.latest, hint.other), true))) {
    Sig* e = hint.latest;
    sigs_.touch(e);
    if (!e->place.fits(in)) isa::verify(in, limits_, where);
    return *e;
  }
  const auto remember = [&hint](Sig* e) {
    hint.other = hint.latest;
    hint.latest = e;
  };
  const uint64_t h = isa::signature_hash(in);
  if (Sig* e = sigs_.find(in, h)) {
    if (!e->place.fits(in)) isa::verify(in, limits_, where);
    remember(e);
    return *e;
  }
  isa::verify(in, limits_, where);
  Sig& e = sigs_.victim(h);
  fill_signature(e, in, h);
  remember(&e);
  return e;
}

void Simulator::fill_signature(Sig& e, const Instr& in, uint64_t h) {
  e.key = in;
  e.hash = h;
  e.valid = true;
  e.place = isa::placement_of(in, limits_);
  // Operand extents relative to the offsets, split into reads and writes as regions() does.
  const isa::OpInfo& info = isa::op_info(in.op);
  const int indirect = isa::indirect_slot(in);
  Instr at0 = in;
  for (Operand& o : at0.opnd) o.offset = 0;
  e.acc.nr = e.acc.nw = 0;
  for (int i = 0; i < info.num_slots; ++i) {
    const Operand& o = at0.slot(i);
    if (!o.present()) continue;
    const auto ext = i == indirect ? isa::slot_extent(at0, i) : o.byte_extent();
    const auto [q0, q1] = o.space == Space::kHbm ? std::pair<int64_t, int64_t>{0, 0} : deps_.quadrants(o);
    const engines::SigAccesses::Access a{ext.first, ext.second, q0, q1, static_cast<uint8_t>(i), o.space};
    if (info.slots[static_cast<size_t>(i)].written) e.acc.writes[e.acc.nw++] = a;
    else e.acc.reads[e.acc.nr++] = a;
  }
  e.stream = !sequencer_op(in) && !isa::is_dma(in.op) && in.engine != Engine::kTensor;
  if (e.stream) {
    e.plan = stream_.plan(in);
    e.flops = engines::instr_flops(in, 0);
  }
  e.bytes = engines::RunStats::bytes_of(in);
  e.dma_fp_ok = {false, false};
  if (isa::is_dma(in.op))
    for (int k = 0; k < 2; ++k)
      if (k != indirect) {
        e.dma_fp[static_cast<size_t>(k)] = engines::Footprints::of(at0.slot(k));
        e.dma_fp_ok[static_cast<size_t>(k)] = true;
      }
}

// ------------------------------------------------------------------ compiler hooks

engines::DepTracker::Ready Simulator::operands_ready_tag(const Instr& in, Engine e) const {
  engines::DepTracker::DmaSides dw;
  return deps_.ready(static_cast<uint8_t>(e), regions(in), dma_sides(in, dw));
}

Ps Simulator::busy_estimate(const Instr& in, Engine e) const {
  if (sequencer_op(in)) return stream_.sequencer_cost(in, e);
  if (e == Engine::kTensor && !isa::is_dma(in.op)) return tensor_.busy_estimate(in);
  return stream_.busy_estimate(in, e);
}

Ps Simulator::duration_estimate(const Instr& in, Engine e) const {
  if (sequencer_op(in)) return stream_.sequencer_cost(in, e);
  if (isa::is_dma(in.op)) {
    const Operand& o = in.slot(0);
    const double bytes = static_cast<double>(o.total_elems() * dtype_bytes(o.dtype));
    const double bw = p_.dma_engine_bw * (memory::is_store(o, in.slot(1)) ? p_.dma_store_bw_factor : 1.0) *
                      std::max(1, std::min<int>(p_.dma_engines, static_cast<int>(o.num_partitions)));
    return stream_.busy_estimate(in, e) + p_.dma_setup + sim::ns_to_ps(bytes / std::min(bw, p_.hbm_bw));
  }
  if (e == Engine::kTensor) return tensor_.duration_estimate(in);
  return stream_.duration_estimate(in, e);
}

const std::vector<engines::CheckReport>& Simulator::check_reports() const {
  static const std::vector<engines::CheckReport> kNone;
  return checker_ ? checker_->reports() : kNone;
}

void Simulator::run(const std::function<bool(Instr&)>& next) {
  Instr in;
  while (next(in)) submit(in);
}

inline InstrTiming Simulator::schedule_on_engine(const Instr& in, const Sig& sig, bool dma) {
  return sig.stream                                           ? schedule_stream(in, sig)
         : sequencer_op(in)                                     ? schedule_barrier(in, sig)
         : dma                                                  ? schedule_dma(in, sig)
                                                                : schedule_tensor(in, sig);
}

InstrTiming Simulator::schedule_what_if(const Instr& in, const Sig& sig) {
  InstrTiming t = frees(in) ? schedule_free(in, sig) : schedule_on_engine(in, sig, isa::is_dma(in.op));
  pe_free_->note(in);
  return t;
}

InstrTiming Simulator::schedule(const Instr& in, const Sig& sig) {
  const bool dma = isa::is_dma(in.op);
  // (One expression: the result is built in place, not zeroed and then copied.)
  InstrTiming t = pe_free_ ? schedule_what_if(in, sig) : schedule_on_engine(in, sig, dma);
  // No later instruction or DMA packet starts before the watermark: prune and fold up to it.
  if (engines::RunStats::fold_due(dma, seq_) || trace_) {
    const Ps w = watermark();
    // The HBM calendars are also read by the peer core (LNC=2): prune them below both watermarks.
    if (dma) dma_.prune(w, peer_ ? std::min(w, peer_->watermark()) : w);
    stats_.fold(w, dma, seq_);
    if (trace_) trace_->watermark(w + stats_.skipped_time());  // (in the trace's time: skipped_time())
  }
  for (const auto& fn : listeners_) fn(in, t);
  if (events_) post_event(in, t);
  ++seq_;
  return t;
}

void Simulator::add_event_listener(EventListener fn) {
  sync_events();
  event_listeners_.push_back(std::move(fn));
  start_events();
}

void Simulator::start_events() {
  if (!events_)
    events_ = std::make_unique<engines::EventPipe>([this](const engines::InstrEvent& ev) { take_event(ev); },
                                                   opts_.listener_thread && isa::sem::host_threads() >= 2);
}

void Simulator::post_event(const Instr& in, const InstrTiming& t) {
  engines::InstrEvent& ev = events_->slot();  // (a DMA's split and transfer are in it: schedule_dma)
  ev.in = in;
  ev.t = t;
  ev.src_writers = engines::PeResults::helper_kind(in) == engines::PeResults::kTranspose
                       ? deps_.writer_classes(deps_.range_of(in.slot(1)))
                       : 0;
  events_->publish();
}

void Simulator::take_event(const engines::InstrEvent& ev) {
  if (ev.asap) {  // schedule_asap's work, from the signature's extents as sig_regions() works them out
    engines::DepTracker::Regions rg;
    sig_regions(ev.in, ev.acc, *asap_, rg);
    const Ps start = asap_->ready(ev.asap_cls, rg).time, end = start + ev.asap_dur;
    asap_->record(ev.asap_cls, ev.t.index, rg, ev.asap_read < 0 ? end : start + ev.asap_read, end);
    asap_end_ = std::max(asap_end_, end);
  }
  for (const auto& fn : event_listeners_) fn(ev);
}

void Simulator::regions_into(const Instr& in, const engines::DepTracker& on, engines::DepTracker::Regions& r,
                             const Extent* ext) const {
  // Split an instruction's operands into the regions it reads and writes (table-derived roles).
  r.nr = r.nw = 0;
  const isa::OpInfo& info = isa::op_info(in.op);
  const int indirect = ext ? -1 : isa::indirect_slot(in);
  for (int i = 0; i < info.num_slots; ++i) {
    const Operand& o = in.slot(i);
    if (!o.present()) continue;
    // An indirect side's rows are runtime values: it depends on every row they may reach.
    const engines::DepTracker::Range rr = ext ? on.range_of(o, ext[i])
                                          : i == indirect ? on.range_of(o, isa::slot_extent(in, i)) : on.range_of(o);
    if (info.slots[static_cast<size_t>(i)].written) r.writes[static_cast<size_t>(r.nw++)] = rr;
    else r.reads[static_cast<size_t>(r.nr++)] = rr;
  }
}

void Simulator::sig_regions(const Instr& in, const engines::SigAccesses& acc, const engines::DepTracker& on,
                            engines::DepTracker::Regions& r) {
  auto range = [&](const engines::SigAccesses::Access& a) {
    const std::pair<int64_t, int64_t> ext{in.opnd[a.slot].offset + a.lo, in.opnd[a.slot].offset + a.hi};
    return a.space == Space::kHbm ? on.range_of(in.opnd[a.slot], ext)
                                  : on.onchip_range(a.space == Space::kPsum, a.q0, a.q1, ext);
  };
  for (int i = 0; i < acc.nr; ++i) r.reads[static_cast<size_t>(i)] = range(acc.reads[static_cast<size_t>(i)]);
  for (int i = 0; i < acc.nw; ++i) r.writes[static_cast<size_t>(i)] = range(acc.writes[static_cast<size_t>(i)]);
  r.nr = acc.nr;
  r.nw = acc.nw;
}

engines::DepTracker::Ready Simulator::ready_for_dma(const Instr& in, const engines::Footprints::Footprint (&fp)[2],
                                                    const engines::DepTracker::Regions& rg) const {
  if (known_ready_) return *known_ready_;
  engines::DepTracker::DmaSides dw;
  const engines::DepTracker::DmaSides* d = dma_sides(in, dw);
  if (d) dw.set(0, &fp[0]), dw.set(1, &fp[1]);
  return deps_.ready(static_cast<uint8_t>(in.engine), rg, d);
}

engines::Footprints::Footprint Simulator::dma_footprint(const Instr& in, const Sig& sig, int k) {
  if (!sig.dma_fp_ok[static_cast<size_t>(k)]) return engines::Footprints::of_slot(in, k);
  engines::Footprints::Footprint f = sig.dma_fp[static_cast<size_t>(k)];
  const int64_t off = in.slot(k).offset;
  f.lo += off;
  f.hi += off;
  f.first += off;
  return f;
}

void Simulator::schedule_asap(const Sig& sig, uint8_t cls, Ps dur, Ps read) {
  // Worked out by the event pipe's consumer (take_event), from the operands' extents of the signature.
  engines::InstrEvent& ev = events_->slot();
  ev.asap = true;
  ev.asap_cls = cls;
  ev.asap_dur = dur;
  ev.asap_read = read;
  ev.acc.nr = sig.acc.nr;
  ev.acc.nw = sig.acc.nw;
  std::copy_n(sig.acc.reads.begin(), sig.acc.nr, ev.acc.reads.begin());
  std::copy_n(sig.acc.writes.begin(), sig.acc.nw, ev.acc.writes.begin());
}

namespace {
// The ready time and producer of an instruction, as reported in InstrTiming.
void set_wait(InstrTiming& t, const engines::DepTracker::Ready& r, Ps free, uint64_t now) {
  t.index = now;
  t.free = free;
  t.ready = r.time;
  if (r.time > 0) {
    t.waited_for = static_cast<int64_t>(engines::DepTracker::tag_index(r.tag, now));
    t.waited_class = engines::DepTracker::tag_class(r.tag);
  }
}
}  // namespace

InstrTiming Simulator::schedule_stream(const Instr& in, const Sig& sig) {
  engines::DepTracker::Regions scratch;
  const engines::DepTracker::Regions& rg = regions_for(in, sig, scratch);
  const auto cls = static_cast<uint8_t>(in.engine);
  const engines::DepTracker::Ready rd = ready_for(in, rg);
  const Ps free = stream_.next_issue(in.engine);
  const engines::StreamEngines::Issue is = stream_.issue(sig.plan, in.engine, std::max(rd.time, not_before_));
  const Ps end = is.start + is.busy + is.latency;
  deps_.record(cls, seq_, rg, is.start + is.busy, end);
  if (asap_) schedule_asap(sig, cls, end - is.start, is.busy);
  InstrTiming t{is.start, end, is.start + is.busy};
  set_wait(t, rd, free, seq_);
  t.flops = sig.flops;
  t.perf_mode = is.perf_mode;
  t.table_load = is.table_load;
  engines::RunStats::Detail d;
  d.busy = is.busy;
  d.bytes = &sig.bytes;
  stats_.on_instr(in, t, d);
  return t;
}

InstrTiming Simulator::schedule_barrier(const Instr& in, const Sig& sig) {
  // core_barrier: a semaphore wait in the named engine's sequencer (a trigger-sized instruction). The
  // multi-core driver passes the later of both cores' arrivals as not_before; the barrier writes its
  // `data` tensor so that this core's later accesses to it wait for the barrier.
  // register_load: the sequencer reads its src (after src's producer) and waits for the value
  // (StreamEngines::sequencer_cost); what uses the register waits for its end (kernel.json "after").
  engines::DepTracker::Regions scratch;
  const engines::DepTracker::Regions& rg = regions_for(in, sig, scratch);
  const auto cls = static_cast<uint8_t>(in.engine);
  const engines::DepTracker::Ready rd = ready_for(in, rg);
  const Ps free = stream_.next_issue(in.engine);
  const engines::StreamEngines::Issue is = stream_.trigger(in, std::max(rd.time, not_before_));
  const Ps end = is.start + is.busy;
  deps_.record(cls, seq_, rg, end, end);
  note_hbm(in, cls, end);
  if (asap_) schedule_asap(sig, cls, end - is.start);
  InstrTiming t{is.start, end, end};
  set_wait(t, rd, free, seq_);
  engines::RunStats::Detail d;
  d.busy = is.busy;
  d.bytes = &sig.bytes;
  stats_.on_instr(in, t, d);
  return t;
}

void Simulator::note_hbm(const Instr& in, uint8_t cls, Ps end) {
  const isa::OpInfo& info = isa::op_info(in.op);
  for (int i = 0; i < info.num_slots; ++i)
    if (in.slot(i).space == Space::kHbm)
      (info.slots[static_cast<size_t>(i)].written ? hbm_writes_ : hbm_reads_)
          .note(seq_, cls, engines::Footprints::of_slot(in, i), end);
}

bool Simulator::frees(const Instr& in) const {
  using P = engines::PeResults;
  const uint8_t f = opts_.free_pe_helpers;
  if ((f & P::kBroadcast) && P::broadcast_weights(in)) return true;
  if ((f & P::kSplitReduce) && pe_free_->split_reduce(in)) return true;
  if (!opts_.free_folds.empty() && P::foldable_pass(in) && fold_line(in.loc)) return true;
  const P::Kind k = P::helper_kind(in);
  if (k != P::kNone) return (f & k) != 0;
  return (f & pe_free_->copy_of(in)) != 0;
}

bool Simulator::fold_line(uint32_t loc) const {
  if (loc >= fold_line_.size()) fold_line_.resize(loc + 1, -1);
  int8_t& v = fold_line_[loc];
  if (v < 0) {
    const SourceLoc& l = source(loc);
    v = std::any_of(opts_.free_folds.begin(), opts_.free_folds.end(), [&](const SourceLoc& f) {
      return f.line == l.line && f.file == l.file && f.function == l.function;
    });
  }
  return v > 0;
}

InstrTiming Simulator::schedule_free(const Instr& in, const Sig& sig) {
  // A what-if of `nsim analyze` (SimOptions::free_pe_helpers): no engine time; the instruction's results are
  // there when its operands are, so what reads them waits for what it read.
  engines::DepTracker::Regions scratch;
  const engines::DepTracker::Regions& rg = regions_for(in, sig, scratch);
  const auto cls = static_cast<uint8_t>(in.engine);
  const engines::DepTracker::Ready rd = ready_for(in, rg);
  const Ps at = std::max(rd.time, not_before_);
  deps_.record(cls, seq_, rg, at, at);
  if (asap_) schedule_asap(sig, cls, 0);
  InstrTiming t{at, at, at};
  set_wait(t, rd, at, seq_);
  engines::RunStats::Detail d;
  d.bytes = &sig.bytes;
  stats_.on_instr(in, t, d);
  return t;
}

InstrTiming Simulator::schedule_tensor(const Instr& in, const Sig& sig) {
  engines::DepTracker::Regions scratch;
  const engines::DepTracker::Regions& rg = regions_for(in, sig, scratch);
  const auto cls = static_cast<uint8_t>(Engine::kTensor);
  const engines::DepTracker::Ready rd = ready_for(in, rg);
  const Ps free = tensor_.next_issue();
  const engines::TensorEngine::Issue is = tensor_.issue(in, std::max(rd.time, not_before_));
  const engines::TensorPipes::Slot& s = is.slot;
  deps_.record(cls, seq_, rg, s.start + s.ii, s.end);
  if (asap_) schedule_asap(sig, cls, s.end - s.start, s.ii);
  InstrTiming t{s.start, s.end, s.start + s.ii};
  set_wait(t, rd, free, seq_);
  t.flops = is.flops;
  engines::RunStats::Detail d;
  d.busy = s.ii;
  d.adjusted_flops = is.adjusted_flops;
  d.bytes = &sig.bytes;
  stats_.on_instr(in, t, d);
  return t;
}

InstrTiming Simulator::schedule_dma(const Instr& in, const Sig& sig) {
  const Operand& dst = in.slot(0);
  const Operand& src = in.slot(1);
  engines::DepTracker::Regions scratch;
  const engines::DepTracker::Regions& rg = regions_for(in, sig, scratch);
  // The trigger engine waits on the semaphores of the data's producers, then issues the trigger.
  const engines::Footprints::Footprint fp[2] = {dma_footprint(in, sig, 0), dma_footprint(in, sig, 1)};
  const engines::DepTracker::Ready rd = ready_for_dma(in, fp, rg);
  const Ps free = stream_.next_issue(in.engine);
  const engines::StreamEngines::Issue trig = stream_.trigger(in, std::max(rd.time, not_before_));
  const memory::DmaSplit& split = dma_.split(dst, src);  // cached by shape
  double eff = 1.0;
  if (isa::op_info(in.op).cost == isa::CostClass::kDmaTranspose)
    eff = src.space == Space::kHbm ? p_.dma_transpose_eff_hbm2sbuf : p_.dma_transpose_eff_sbuf2sbuf;
  if (in.flags & isa::kAccumulate)  // dma_compute's add (spec 3.3; v4 adds into SBUF at the copy's rate)
    eff *= dst.space == Space::kHbm ? p_.dma_compute_eff : p_.dma_compute_eff_sbuf;
  const engines::DmaEngines::Transfer tr = dma_.transfer(in.dma_queue, trig.start, split, eff, memory::is_store(dst, src));
  deps_.record(kClassDma, seq_, rg, tr.done, tr.done);
  if (dst.space == Space::kHbm) hbm_writes_.note(seq_, kClassDma, fp[0], tr.done);
  else if (sig.dma_fp_ok[0]) chip_writes_.note(seq_, kClassDma, fp[0], tr.done, rd.time);
  if (src.space == Space::kHbm) hbm_reads_.note(seq_, kClassDma, fp[1], tr.done);
  if (asap_) {  // its own time, without queueing behind other transfers: setup (from the trigger), longest piece
    Ps piece = 0;
    for (int k = 0; k < split.engines; ++k)
      piece = std::max(piece, tr.piece_end[static_cast<size_t>(k)] - tr.piece_start[static_cast<size_t>(k)]);
    schedule_asap(sig, kClassDma, p_.dma_setup + piece);
  }
  if (!listeners_.empty()) last_split_ = split, last_transfer_ = tr;
  if (events_) {
    engines::InstrEvent& ev = events_->slot();
    ev.split = split;
    ev.transfer = tr;
  }
  InstrTiming t{trig.start, tr.done, trig.start + trig.busy};
  set_wait(t, rd, free, seq_);
  t.setup_start = tr.setup_start;
  t.data_start = tr.data_start;
  engines::RunStats::Detail d;
  d.busy = trig.busy;
  d.split = &split;
  d.transfer = &tr;
  d.bytes = &sig.bytes;
  stats_.on_instr(in, t, d);
  return t;
}

Ps Simulator::watermark() const {
  // Every later instruction starts no earlier than the earliest next issue of any engine, nor than
  // the floor the caller promised (an engine that never issues keeps the first at 0).
  Ps w = tensor_.next_issue();
  for (int e = 0; e < isa::kNumEngines; ++e)
    if (static_cast<Engine>(e) != Engine::kTensor) w = std::min(w, stream_.next_issue(static_cast<Engine>(e)));
  return std::max(w, start_floor_);
}

void Simulator::numerics_done() const {
  if (!gemm_async_) return;
  gemm_async_->wait();
  gemm_async_->forget_all();  // the caller may write any memory
}

uint64_t Simulator::timing_digest() const {
  // Times before the watermark all act alike (nothing later starts before it): they count as it.
  const Ps base = stats_.local_end(), w = watermark();
  uint64_t h = 0x9E3779B97F4A7C15ull;
  auto mix = [&h, base, w](Ps t) {
    h ^= static_cast<uint64_t>(std::max(t, w) - base) + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
  };
  mix(w);
  for (int e = 0; e < isa::kNumEngines; ++e) mix(stream_.next_issue(static_cast<isa::Engine>(e)));
  mix(tensor_.next_issue());
  for (int q = 0; q < p_.dma_queues; ++q) mix(dma_.queue_free(q));
  // Values taken as they are (relative already, or not times).
  auto raw = [&h](int64_t v) { h ^= static_cast<uint64_t>(v) + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2); };
  dma_.state(w, mix, raw);                // each DMA engine's data and HBM bookings
  stream_.shared_state(mix, raw);         // shared SBUF/PSUM ports, ScalarE's activation table
  tensor_.pipes().state(base, w, mix, raw);  // TensorE's pipes and power throttle
  tensor_.weights_state(raw);             // the weights TensorE holds
  return h;
}

bool Simulator::fast_forward_allowed() const {
  return opts_.fast_forward && !opts_.numerics && (!trace_ || trace_->bounded()) && !asap_ &&
         listeners_.size() == (recorder_ ? 1u : 0u) && !events_ && !checker_ && opts_.core_index < 0 && !peer_;
}

bool Simulator::trace_closed() const { return !trace_ || trace_->closed_from(watermark() + stats_.skipped_time()); }

void Simulator::sample_stats(engines::RunStats::Sample& out) const {
  stats_.sample(out);
  out.throttled = tensor_.throttled_time();
  out.trace_slices = recorder_ ? recorder_->slices() : 0;
}

void Simulator::add_repeats(const engines::RunStats::Sample& a, const engines::RunStats::Sample& b, uint64_t k,
                            uint64_t instructions, Ps dt) {
  // (Only once the trace is closed, trace_closed(): the repeats' slices are ones the full run drops, counted so.)
  if (trace_) trace_->skipped(watermark() + stats_.skipped_time(), k * (b.trace_slices - a.trace_slices));
  stats_.add_repeats(a, b, k, dt);
  skipped_throttled_ += static_cast<Ps>(k) * (b.throttled - a.throttled);
  seq_ += k * instructions;
  skipped_instructions_ += k * instructions;
}

void Simulator::note_fast_forward(int loop, const SourceLoc& loc, engines::FfOutcome o) {
  const auto i = static_cast<size_t>(o);
  ++ff_outcomes_[i];
  if (loop < 0) return;
  const auto l = static_cast<size_t>(loop);
  if (l >= ff_loop_at_.size()) ff_loop_at_.resize(l + 1, -1);
  if (ff_loop_at_[l] < 0) {  // a loop met first: the entry of its source line, or a new one
    const auto same = [&](const FfLoop& e) {
      return !loc.file.empty() && e.loc.file == loc.file && e.loc.line == loc.line && e.loc.function == loc.function;
    };
    const auto it = std::find_if(ff_loops_.begin(), ff_loops_.end(), same);
    ff_loop_at_[l] = static_cast<int>(it - ff_loops_.begin());
    if (it == ff_loops_.end()) ff_loops_.push_back({loop, loc, {}});
  }
  ++ff_loops_[static_cast<size_t>(ff_loop_at_[l])].n[i];
}

void Simulator::finish() {
  numerics_done();
  sync_events();
  if (finished_) return;
  finished_ = true;
  stats_.finish();
  if (trace_) trace_->finish();
}

std::vector<Simulator::LineStats> Simulator::line_stats() const {
  // One entry per source line: several ops on one line (and each op registers its location) add up.
  std::vector<LineStats> v;
  std::unordered_map<std::string, size_t> at;
  const auto& per_loc = stats_.per_loc();
  for (size_t i = 1; i < per_loc.size(); ++i) {
    if (!per_loc[i].first) continue;
    const SourceLoc& l = sources_[i];
    auto [it, fresh] = at.try_emplace(fmt::format("{}\n{}\n{}", l.file, l.line, l.function), v.size());
    if (fresh) {
      v.push_back({l, per_loc[i].first, per_loc[i].second});
    } else {
      v[it->second].instructions += per_loc[i].first;
      v[it->second].instr_time += per_loc[i].second;
    }
  }
  std::stable_sort(v.begin(), v.end(), [](const LineStats& a, const LineStats& b) { return a.instr_time > b.instr_time; });
  return v;
}

}  // namespace nsim
