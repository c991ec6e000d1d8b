#include "engines/run_stats.h"

#include <algorithm>
#include <type_traits>

namespace nsim {

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

namespace engines {

RunStats::RunStats(const CoreParams& p) : p_(p) {
  c_.dma_active.forward_to(&c_.any_active);
  per_loc_.resize(1);  // source id 0: no location
}

void RunStats::on_instr(const Instr& in, const InstrTiming& t, const Detail& d) {
  const bool is_dma = isa::is_dma(in.op);
  if (is_dma) {
    dma(in, t, d);
  } else {
    engine_slot(in.engine, t.start, t.end, d.busy, t.flops);
    if (in.engine == Engine::kTensor && in.op != Opcode::kLoadStationary) {
      if (in.op == Opcode::kMultiplyMoving && !(in.flags & isa::kIsTranspose)) {
        c_.matmul_flops += t.flops;
        c_.adjusted_matmul_flops += d.adjusted_flops;
        if (dtype_is_mx_x4(in.slot(1).dtype)) c_.mx_matmul_flops += t.flops;
        ++c_.matmul_instructions;
      } else {  // a transpose through the PE array (MultiplyMoving with is_transpose, or nc_transpose)
        c_.transpose_flops += t.flops;
        c_.adjusted_transpose_flops += d.adjusted_flops;
      }
    }
  }
  if (t.table_load) {
    ++c_.act_table_loads;
    c_.act_table_load_time += t.table_load;
  }
  account_bytes(d.bytes ? *d.bytes : bytes_of(in));
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
}

inline void RunStats::engine_slot(Engine e, Ps start, Ps end, Ps busy, double flops) {
  TrackCounters& tc = c_.engine[static_cast<size_t>(e)];
  ++tc.instructions;
  tc.busy += busy;
  tc.busy_union += std::max<Ps>(0, start + busy - std::max(start, tc.busy_cursor));  // starts are monotone
  tc.busy_cursor = std::max(tc.busy_cursor, start + busy);
  tc.instr_time += end - start;
  tc.add_interval(start, end);
  note_active(start, end);
  tc.flops += flops;
}

void RunStats::dma(const Instr& in, const InstrTiming& t, const Detail& d) {
  // The trigger occupies its engine; the data moves on the DMA engines.
  engine_slot(in.engine, t.start, t.start + d.busy, d.busy, 0);
  ++c_.dma_transfers;
  const size_t q = in.dma_queue < p_.dma_queues ? in.dma_queue : static_cast<size_t>(in.dma_queue % p_.dma_queues);
  if (!c_.dma_queue_used[q]) {
    c_.dma_queue_used[q] = true;
    ++c_.dma_queues_used;
  }
  if (!d.split || !d.transfer) return;
  const memory::DmaSplit& split = *d.split;
  const DmaEngines::Transfer& tr = *d.transfer;
  sim::IntervalUnion& by_class = c_.dma_class_active[static_cast<size_t>(
      in.engine == Engine::kScalar ? DmaClass::kHardwareDynamic
                                   : in.engine == Engine::kGpsimd ? DmaClass::kSoftwareDynamic : DmaClass::kStatic)];
  // Equal pieces at equal times on every engine: one update of the shared counter (lockstep), which
  // starts when the engines' interval states are equal and ends at the first transfer that differs.
  // (Every engine has a piece, all pieces alike, all moved over one interval.)
  const int n = p_.dma_engines;
  const uint32_t all = n >= 32 ? ~0u : (1u << n) - 1;
  const bool uniform = split.uniform && split.engines == n && n > 0 && split.used == all && tr.same_times;
  if (uniform && !lk_on_ && dma_states_equal()) {
    lk_ = TrackCounters{};
    lk_.cur_lo = c_.dma[0].cur_lo;
    lk_.cur_hi = c_.dma[0].cur_hi;
    lk_.last_end = c_.dma[0].last_end;
    lk_on_ = true;
  }
  if (lk_on_ && !uniform) {
    flush_lockstep();
    lk_on_ = false;
  }
  if (lk_on_) {
    const Ps s = tr.piece_start[0], e = tr.piece_end[0];
    ++lk_.instructions;
    lk_.busy += e - s;
    lk_.instr_time += e - s;
    if (s < lk_.cur_lo) lk_.active += e - s;
    else lk_.add_interval(s, e);
    lk_.bytes += static_cast<uint64_t>(split.piece[0].bytes);
    c_.dma_descriptors += static_cast<uint64_t>(split.piece[0].descriptors) * static_cast<uint64_t>(n);
    c_.dma_active.add(s, e);
    by_class.add(s, e);
    return;
  }
  // The transfer's packets merged where they overlap or touch (the engines of one transfer usually
  // move at the same time): one add to each union per merged interval instead of one per engine.
  std::array<std::pair<Ps, Ps>, memory::kMaxDmaEngines> merged;
  size_t nm = 0;
  for (int k = 0; k < split.engines; ++k) {
    const auto ki = static_cast<size_t>(k);
    if (split.piece[ki].bytes <= 0) continue;
    TrackCounters& tc = c_.dma[ki];
    ++tc.instructions;
    tc.busy += tr.piece_end[ki] - tr.piece_start[ki];
    tc.instr_time += tr.piece_end[ki] - tr.piece_start[ki];
    // A packet may fill an idle gap before the engine's latest one (a later transfer that was ready
    // earlier, on another queue): packets never overlap on one DMA engine, so it adds its duration.
    if (tr.piece_start[ki] < tc.cur_lo) tc.active += tr.piece_end[ki] - tr.piece_start[ki];
    else tc.add_interval(tr.piece_start[ki], tr.piece_end[ki]);
    if (nm && tr.piece_start[ki] <= merged[nm - 1].second && tr.piece_end[ki] >= merged[nm - 1].first) {
      merged[nm - 1].first = std::min(merged[nm - 1].first, tr.piece_start[ki]);
      merged[nm - 1].second = std::max(merged[nm - 1].second, tr.piece_end[ki]);
    } else {
      merged[nm++] = {tr.piece_start[ki], tr.piece_end[ki]};
    }
    tc.bytes += static_cast<uint64_t>(split.piece[ki].bytes);
    c_.dma_descriptors += static_cast<uint64_t>(split.piece[ki].descriptors);
  }
  for (size_t i = 0; i < nm; ++i) {  // any_active gets them from dma_active as the watermark passes
    c_.dma_active.add(merged[i].first, merged[i].second);
    by_class.add(merged[i].first, merged[i].second);
  }
}

bool RunStats::dma_states_equal() const {
  for (size_t k = 1; k < static_cast<size_t>(p_.dma_engines); ++k)
    if (c_.dma[k].cur_lo != c_.dma[0].cur_lo || c_.dma[k].cur_hi != c_.dma[0].cur_hi ||
        c_.dma[k].last_end != c_.dma[0].last_end)
      return false;
  return true;
}

void RunStats::flush_lockstep() const {
  for (size_t k = 0; k < static_cast<size_t>(p_.dma_engines); ++k) {
    TrackCounters& tc = c_.dma[k];
    tc.instructions += lk_.instructions;
    tc.busy += lk_.busy;
    tc.instr_time += lk_.instr_time;
    tc.active += lk_.active;
    tc.bytes += lk_.bytes;
    tc.cur_lo = lk_.cur_lo;
    tc.cur_hi = lk_.cur_hi;
    tc.last_end = lk_.last_end;
  }
  lk_.instructions = 0;
  lk_.busy = lk_.instr_time = lk_.active = 0;
  lk_.bytes = 0;
}

RunStats::Bytes RunStats::bytes_of(const Instr& in) {
  Bytes b;
  // A barrier names its tensor, moves no bytes; a register_load's 4-byte read is the sequencer's, not an engine's
  // or a DMA's traffic (the profiler's byte counters count those).
  if (in.op == Opcode::kCoreBarrier || in.op == Opcode::kRegisterLoad) return b;
  const isa::OpInfo& info = isa::op_info(in.op);
  // An accumulating DMA (dst += src: a scatter-add, dma_compute) reads its destination as well as writing it.
  const bool rmw = in.op == Opcode::kDmaCopy && (in.flags & isa::kAccumulate) != 0;
  for (int i = 0; i < info.num_slots; ++i) {
    const Operand& o = in.slot(i);
    if (!o.present()) continue;
    const bool written = info.slots[static_cast<size_t>(i)].written;
    const auto bytes = static_cast<uint64_t>(o.total_elems() * dtype_bytes(o.dtype));
    for (const bool w : {written, false}) {
      switch (o.space) {
        case Space::kHbm: (w ? b.hbm_write : b.hbm_read) += bytes; break;
        case Space::kSbuf: (w ? b.sbuf_write : b.sbuf_read) += bytes; break;
        case Space::kPsum: (w ? b.psum_write : b.psum_read) += bytes; break;
        case Space::kNone: break;
      }
      if (!(written && rmw)) break;  // (the read of an accumulating DMA's destination: a second pass)
    }
  }
  return b;
}

void RunStats::account_bytes(const Bytes& b) {
  c_.hbm_read += b.hbm_read;
  c_.hbm_write += b.hbm_write;
  c_.sbuf_read += b.sbuf_read;
  c_.sbuf_write += b.sbuf_write;
  c_.psum_read += b.psum_read;
  c_.psum_write += b.psum_write;
}

void RunStats::note_active(Ps s, Ps e) {
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

void RunStats::fold_active(Ps w) {
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

void RunStats::fold(Ps w, bool is_dma, uint64_t seq) {
  if (is_dma)
    for (auto& u : c_.dma_class_active) u.fold(w);
  if ((seq % kFoldEvery) == 0) fold_active(w);
}

void RunStats::sample(Sample& out) const {
  if (lk_on_) flush_lockstep();
  // The counters without the unions (a copy of those would forward into this object's any_active).
  const auto& src = c_;
  auto& dst = out.c;
  dst.engine = src.engine;
  dst.dma = src.dma;
  dst.opcode_count = src.opcode_count;
  dst.opcode_time = src.opcode_time;
  dst.engine_opcode_count = src.engine_opcode_count;
  dst.engine_opcode_time = src.engine_opcode_time;
  dst.dma_transfers = src.dma_transfers;
  dst.dma_descriptors = src.dma_descriptors;
  dst.hbm_read = src.hbm_read, dst.hbm_write = src.hbm_write, dst.sbuf_read = src.sbuf_read;
  dst.sbuf_write = src.sbuf_write, dst.psum_read = src.psum_read, dst.psum_write = src.psum_write;
  dst.matmul_flops = src.matmul_flops, dst.transpose_flops = src.transpose_flops;
  dst.adjusted_matmul_flops = src.adjusted_matmul_flops, dst.adjusted_transpose_flops = src.adjusted_transpose_flops;
  dst.mx_matmul_flops = src.mx_matmul_flops;
  dst.matmul_instructions = src.matmul_instructions;
  dst.act_table_loads = src.act_table_loads, dst.act_table_load_time = src.act_table_load_time;
  out.dma_active = c_.dma_active.total();
  out.any_active = c_.any_active.total() + (stage_hi_ >= 0 ? stage_hi_ - stage_lo_ : 0);
  for (size_t i = 0; i < out.dma_class_active.size(); ++i) out.dma_class_active[i] = c_.dma_class_active[i].total();
  out.per_loc = per_loc_;
}

void RunStats::add_repeats(const Sample& a, const Sample& b, uint64_t k, Ps dt) {
  if (lk_on_) flush_lockstep();
  const auto n = static_cast<int64_t>(k);
  // Each additive field x: x += k (b.x - a.x).
  auto rep = [n](auto& x, auto xa, auto xb) { x += static_cast<std::remove_reference_t<decltype(x)>>(n) * (xb - xa); };
  auto track = [&](TrackCounters& t, const TrackCounters& ta, const TrackCounters& tb) {
    rep(t.instructions, ta.instructions, tb.instructions);
    rep(t.busy, ta.busy, tb.busy);
    rep(t.busy_union, ta.busy_union, tb.busy_union);
    rep(t.instr_time, ta.instr_time, tb.instr_time);
    rep(t.active, ta.active_so_far(), tb.active_so_far());
    rep(t.flops, ta.flops, tb.flops);
    rep(t.bytes, ta.bytes, tb.bytes);
  };
  for (size_t e = 0; e < c_.engine.size(); ++e) track(c_.engine[e], a.c.engine[e], b.c.engine[e]);
  for (size_t e = 0; e < c_.dma.size(); ++e) track(c_.dma[e], a.c.dma[e], b.c.dma[e]);
  for (size_t o = 0; o < c_.opcode_count.size(); ++o) {
    rep(c_.opcode_count[o], a.c.opcode_count[o], b.c.opcode_count[o]);
    rep(c_.opcode_time[o], a.c.opcode_time[o], b.c.opcode_time[o]);
    for (size_t e = 0; e < c_.engine_opcode_count.size(); ++e) {
      rep(c_.engine_opcode_count[e][o], a.c.engine_opcode_count[e][o], b.c.engine_opcode_count[e][o]);
      rep(c_.engine_opcode_time[e][o], a.c.engine_opcode_time[e][o], b.c.engine_opcode_time[e][o]);
    }
  }
  rep(c_.dma_transfers, a.c.dma_transfers, b.c.dma_transfers);
  rep(c_.dma_descriptors, a.c.dma_descriptors, b.c.dma_descriptors);
  rep(c_.hbm_read, a.c.hbm_read, b.c.hbm_read);
  rep(c_.hbm_write, a.c.hbm_write, b.c.hbm_write);
  rep(c_.sbuf_read, a.c.sbuf_read, b.c.sbuf_read);
  rep(c_.sbuf_write, a.c.sbuf_write, b.c.sbuf_write);
  rep(c_.psum_read, a.c.psum_read, b.c.psum_read);
  rep(c_.psum_write, a.c.psum_write, b.c.psum_write);
  rep(c_.matmul_flops, a.c.matmul_flops, b.c.matmul_flops);
  rep(c_.transpose_flops, a.c.transpose_flops, b.c.transpose_flops);
  rep(c_.adjusted_matmul_flops, a.c.adjusted_matmul_flops, b.c.adjusted_matmul_flops);
  rep(c_.adjusted_transpose_flops, a.c.adjusted_transpose_flops, b.c.adjusted_transpose_flops);
  rep(c_.mx_matmul_flops, a.c.mx_matmul_flops, b.c.mx_matmul_flops);
  rep(c_.matmul_instructions, a.c.matmul_instructions, b.c.matmul_instructions);
  rep(c_.act_table_loads, a.c.act_table_loads, b.c.act_table_loads);
  rep(c_.act_table_load_time, a.c.act_table_load_time, b.c.act_table_load_time);
  c_.dma_active.add_length(n * (b.dma_active - a.dma_active));
  c_.any_active.add_length(n * (b.any_active - a.any_active));
  for (size_t i = 0; i < c_.dma_class_active.size(); ++i)
    c_.dma_class_active[i].add_length(n * (b.dma_class_active[i] - a.dma_class_active[i]));
  for (size_t i = 0; i < per_loc_.size() && i < a.per_loc.size() && i < b.per_loc.size(); ++i) {
    rep(per_loc_[i].first, a.per_loc[i].first, b.per_loc[i].first);
    rep(per_loc_[i].second, a.per_loc[i].second, b.per_loc[i].second);
  }
  skipped_time_ += dt;
}

bool RunStats::repeats_fit(const Sample& a, const Sample& b, uint64_t k, Ps dt) {
  constexpr double kLimit = 72057594037927936.0;  // 2^56
  const auto bytes = [](const RunCounters& c) {
    return static_cast<double>(c.hbm_read + c.hbm_write + c.sbuf_read + c.sbuf_write + c.psum_read + c.psum_write);
  };
  const double n = static_cast<double>(k);
  const double grow = std::max({static_cast<double>(dt), bytes(b.c) - bytes(a.c),
                                static_cast<double>(b.c.dma_descriptors - a.c.dma_descriptors)});
  return dt >= 0 && n * grow < kLimit && bytes(b.c) + n * (bytes(b.c) - bytes(a.c)) < kLimit;
}

void RunStats::finish() {
  for (auto& t : c_.engine) t.close();
  if (lk_on_) flush_lockstep();
  lk_on_ = false;
  for (auto& t : c_.dma) t.close();
  fold_active(INT64_MAX);  // DMA time, then the staged engine interval, into any_active
  c_.dma_active.close();
  for (auto& u : c_.dma_class_active) u.close();
  c_.any_active.close();
  c_.end += skipped_time_;
  skipped_time_ = 0;
}

}  // namespace engines
}  // namespace nsim
