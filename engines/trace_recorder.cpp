#include "engines/trace_recorder.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string_view>

#include "sim/trace.h"

namespace nsim::engines {

using isa::Engine;
using sim::Ps;

namespace {
constexpr int kFirstDmaTrack = isa::kNumEngines;  // tracks: engines, DMA engines, then DMA queues
}  // namespace

TraceRecorder::TraceRecorder(const Simulator& sim, sim::TraceSink& sink)
    : sim_(sim), sink_(sink), queue_declared_(static_cast<size_t>(sim.params().dma_queues), false),
      ring_(sink.bounded()) {
  if (ring_) slice_at_.resize(kFlowWindow);
  for (int e = 0; e < isa::kNumEngines; ++e) sink_.declare_track(e, std::string(isa::engine_name(static_cast<Engine>(e))));
  for (int e = 0; e < sim.params().dma_engines; ++e) sink_.declare_track(kFirstDmaTrack + e, fmt::format("dma.e{}", e));
}

TraceRecorder::SliceAt& TraceRecorder::slot(uint64_t index) {
  if (ring_) return slice_at_[index % kFlowWindow];
  if (slice_at_.size() <= index) slice_at_.resize(index + 1);
  return slice_at_[index];
}

const TraceRecorder::SliceAt* TraceRecorder::find(uint64_t index) const {
  const size_t i = ring_ ? index % kFlowWindow : index;
  if (i >= slice_at_.size() || slice_at_[i].index != index) return nullptr;
  return &slice_at_[i];
}

const std::string& TraceRecorder::src_text(uint32_t loc) {
  if (loc >= src_text_.size()) src_text_.resize(loc + 1);
  std::string& t = src_text_[loc];
  if (t.empty()) t = sim_.source(loc).str();
  return t;
}

void TraceRecorder::on_instr(const isa::Instr& in, const InstrTiming& t0) {
  // After iterations skipped by fast-forward (only once the sink keeps no more slices: Simulator::trace_closed), the
  // simulated instructions run earlier than in the run simulating every one by the time skipped: their slices, all
  // dropped, are checked at that run's times (and counted as it counts them).
  off_ = sim_.skipped_time();
  InstrTiming shifted;
  if (off_) {
    shifted = t0;
    for (Ps* p : {&shifted.start, &shifted.end, &shifted.issue, &shifted.setup_start, &shifted.data_start}) *p += off_;
  }
  const InstrTiming& t = off_ ? shifted : t0;
  if (isa::is_dma(in.op)) {
    instr_slice(in, static_cast<int>(in.engine), t, t.issue);  // the trigger on its engine
    dma_slices(in, t);
  } else if (t.table_load > 0) {  // ScalarE loads the function table first: the profiler's ACT_TABLE_LOAD slice
    ++slices_;
    if (!sink_.drops(t.start, t.table_load))
      // (not an instruction of its own in nsim's stats: "table_load_of" names the activation, whose "index" it is)
      sink_.slice({static_cast<int>(in.engine), t.start, t.table_load, "ACT_TABLE_LOAD",
                   {sim::TraceArg::string("src", src_text(in.loc)),
                    sim::TraceArg::integer("table_load_of", static_cast<int64_t>(t.index))}});
    InstrTiming after = t;
    after.start = t.start + t.table_load;
    instr_slice(in, static_cast<int>(in.engine), after, t.end);
  } else {
    instr_slice(in, static_cast<int>(in.engine), t, t.end);
  }
}

void TraceRecorder::instr_slice(const isa::Instr& in, int track, const InstrTiming& t, Ps end) {
  slot(t.index) = {t.index, track, t.start};  // a DMA's queue slice replaces it
  ++slices_;
  if (sink_.drops(t.start, end - t.start)) return;  // not formatted
  const SourceLoc& loc = sim_.source(in.loc);
  using sim::TraceArg;
  std::vector<TraceArg> args;
  args.reserve(12);
  args.push_back(TraceArg::string("opcode", isa::op_info(in.op).mnemonic));
  if (sink_.wants_disassembly()) args.push_back(TraceArg::string("instr", isa::disassemble(in)));
  args.push_back(TraceArg::string("src", src_text(in.loc)));
  if (!loc.stack.empty()) args.push_back(TraceArg::string("stack", loc.stack));  // kernel > helper > (src)
  args.push_back(TraceArg::integer("index", static_cast<int64_t>(t.index)));
  args.push_back(TraceArg::real("ready_ns", sim::ps_to_ns(t.ready)));
  // Semaphore wait: the engine was free before the operands were ready; name the producer.
  const bool waited = t.ready > t.free && t.waited_for >= 0;
  if (waited) {
    args.push_back(TraceArg::real("wait_ns", sim::ps_to_ns(std::min(t.ready, t.start) - t.free)));
    args.push_back(TraceArg::integer("waited_for", t.waited_for));
    args.push_back(TraceArg::string("waited_on", std::string(t.waited_class == kClassDma
                                                                 ? std::string_view("dma")
                                                                 : isa::engine_name(static_cast<Engine>(t.waited_class)))));
  }
  if (t.perf_mode > 1) args.push_back(TraceArg::string("performance_mode", fmt::format("{}x", t.perf_mode)));
  int64_t bytes = 0;  // operand bytes read and written
  for (int i = 0; i < isa::op_info(in.op).num_slots; ++i)
    if (in.slot(i).present()) bytes += in.slot(i).total_elems() * dtype_bytes(in.slot(i).dtype);
  args.push_back(TraceArg::integer("bytes", bytes));
  if (!isa::is_dma(in.op)) args.push_back(TraceArg::integer("flops", std::llround(t.flops)));
  sim::TraceSlice sl{track, t.start, end - t.start, std::string(isa::op_info(in.op).mnemonic), std::move(args)};
  if (const SliceAt* from = waited ? find(static_cast<uint64_t>(t.waited_for)) : nullptr) {
    sl.flow_id = static_cast<int64_t>(t.index);
    sl.flow_track = from->track;
    sl.flow_ts = from->start;
  }
  sink_.slice(std::move(sl));
}

void TraceRecorder::dma_slices(const isa::Instr& in, const InstrTiming& t) {
  const memory::DmaSplit& split = sim_.last_dma_split();
  const DmaEngines::Transfer& tr = sim_.last_dma_transfer();
  const CoreParams& p = sim_.params();
  const std::string name = isa::op_info(in.op).mnemonic;
  const std::string& src = src_text(in.loc);
  for (int k = 0; k < split.engines; ++k) {
    const auto ki = static_cast<size_t>(k);
    if (split.piece[ki].bytes <= 0) continue;
    ++slices_;
    const Ps start = tr.piece_start[ki] + off_;
    if (sink_.drops(start, tr.piece_end[ki] - tr.piece_start[ki])) continue;
    sink_.slice({kFirstDmaTrack + k, start, tr.piece_end[ki] - tr.piece_start[ki], name,
                 {sim::TraceArg::integer("bytes", split.piece[ki].bytes),
                  sim::TraceArg::integer("descriptors", split.piece[ki].descriptors),
                  sim::TraceArg::integer("queue", in.dma_queue), sim::TraceArg::string("src", src)}});
  }
  const int qt = kFirstDmaTrack + p.dma_engines + in.dma_queue;
  if (!queue_declared_[in.dma_queue % queue_declared_.size()]) {
    queue_declared_[in.dma_queue % queue_declared_.size()] = true;
    sink_.declare_track(qt, queue_name(p, in.dma_queue));
  }
  slot(t.index) = {t.index, qt, t.setup_start};  // waiters of a DMA wait for its data: arrows start at the queue slice
  ++slices_;
  if (sink_.drops(t.setup_start, t.end - t.setup_start)) return;
  sink_.slice({qt, t.setup_start, t.end - t.setup_start, name,
               {sim::TraceArg::integer("bytes", split.total_bytes),
                sim::TraceArg::real("setup_start_ns", sim::ps_to_ns(t.setup_start)),
                sim::TraceArg::real("data_start_ns", sim::ps_to_ns(t.data_start)), sim::TraceArg::string("src", src)}});
}

}  // namespace nsim::engines
