// The cross-core race check: see race.h.
#include "engines/check/race.h"

#include <fmt/format.h>

#include <algorithm>

namespace nsim::engines {

using isa::Instr;
using isa::Operand;
using isa::Space;

namespace {

/// Calls fn(lo, hi) for every maximal contiguous byte run [lo, hi) of an HBM access pattern, in order
/// of the pattern (adjacent runs merged).
template <class F>
void for_each_hbm_run(const Operand& o, F&& fn) {
  const int64_t eb = dtype_bytes(o.dtype);
  const int nf = o.nfree;
  // Merge the innermost dims while contiguous (size-1 dims never break contiguity).
  int64_t run = 1;  // elements per contiguous run
  int inner = nf;   // dims [inner, nf) form the run
  while (inner > 0) {
    const auto d = static_cast<size_t>(inner - 1);
    if (o.size[d] == 1 || o.stride[d] == run) {
      run *= o.size[d];
      --inner;
    } else {
      break;
    }
  }
  int64_t outer = 1;
  for (int d = 0; d < inner; ++d) outer *= o.size[static_cast<size_t>(d)];
  int64_t cur_lo = 0, cur_hi = -1;  // pending merged run
  for (uint32_t p = 0; p < std::max<uint32_t>(1, o.num_partitions); ++p) {
    for (int64_t r = 0; r < outer; ++r) {
      int64_t rem = r, off = static_cast<int64_t>(p) * o.partition_step;
      for (int d = inner - 1; d >= 0; --d) {
        const int64_t i = rem % o.size[static_cast<size_t>(d)];
        rem /= o.size[static_cast<size_t>(d)];
        off += i * o.stride[static_cast<size_t>(d)];
      }
      const int64_t lo = o.offset + off * eb, hi = lo + run * eb;
      if (lo == cur_hi) {
        cur_hi = hi;
      } else {
        if (cur_hi > cur_lo) fn(cur_lo, cur_hi);
        cur_lo = lo;
        cur_hi = hi;
      }
    }
  }
  if (cur_hi > cur_lo) fn(cur_lo, cur_hi);
}

}  // namespace

bool RaceChecker::ordered(const Access& earlier, const Access& later) const {
  // A rendezvous R with earlier.end <= R <= later.start.
  auto it = std::lower_bound(rendezvous_.begin(), rendezvous_.end(), earlier.end);
  return it != rendezvous_.end() && *it <= later.start;
}

std::map<int64_t, RaceChecker::Seg>::iterator RaceChecker::split(int64_t at) {
  // The segment starting at `at`, splitting the one that contains it (end() when none starts there).
  auto it = segs_.upper_bound(at);
  if (it == segs_.begin()) return segs_.find(at);
  auto prev = std::prev(it);
  if (prev->first == at) return prev;
  if (prev->second.hi <= at) return it;
  Seg right = prev->second;
  prev->second.hi = at;
  return segs_.emplace_hint(it, at, right);
}

void RaceChecker::conflict(const Access& prev, bool prev_write, const Access& cur, bool cur_write, int64_t lo,
                           int64_t hi) {
  if (prev.accumulate && cur.accumulate) return;  // a reduction of read-modify-write DMAs
  const bool first_ordered = ordered(prev, cur), second_ordered = ordered(cur, prev);
  if (first_ordered || second_ordered) return;
  for (CheckReport& r : reports_)
    if (r.kind == CheckKind::kDmaRace) {
      ++r.count;
      return;
    }
  CheckReport r;
  r.kind = CheckKind::kDmaRace;
  r.instruction = cur.index;
  r.slot = 0;
  r.op = fmt::format("{} on core {}", isa::op_info(cur.op).mnemonic, cur.core);
  const auto [tensor, base] = namer_(lo);
  r.tensor = tensor;
  r.loc = locator_(cur.core, cur.loc);
  r.loc_id = cur.loc;
  const SourceLoc other = locator_(prev.core, prev.loc);
  const bool overlap = cur.start < prev.end && prev.start < cur.end;
  r.detail = fmt::format(
      "{} bytes [{}, {}) that {} on core {} {} (at {}), running {:.1f}-{:.1f} ns while this one runs {:.1f}-{:.1f} ns{}; "
      "no sendrecv/core_barrier orders the two",
      cur_write ? "writes" : "reads", lo - base, hi - base, isa::op_info(prev.op).mnemonic, prev.core, prev_write ? "writes" : "reads",
      other.str().empty() ? std::string("an unknown location") : other.str(), sim::ps_to_ns(prev.start),
      sim::ps_to_ns(prev.end), sim::ps_to_ns(cur.start), sim::ps_to_ns(cur.end),
      overlap ? " (they overlap in time)" : "");
  reports_.push_back(std::move(r));
}

void RaceChecker::touch(int64_t lo, int64_t hi, int access, bool write) {
  const Access& cur = acc_[static_cast<size_t>(access)];
  const int me = cur.core, other = 1 - cur.core;
  // Make [lo, hi) a sequence of whole segments, filling gaps with fresh ones.
  split(hi);
  auto it = split(lo);
  int64_t at = lo;
  while (at < hi) {
    if (it == segs_.end() || it->first > at) {
      const int64_t gap_end = it == segs_.end() ? hi : std::min(hi, it->first);
      Seg fresh;
      fresh.hi = gap_end;
      it = segs_.emplace_hint(it, at, fresh);
    }
    Seg& s = it->second;
    // (the report names this access's whole run)
    if (s.writer[other] >= 0) conflict(acc_[static_cast<size_t>(s.writer[other])], true, cur, write, lo, hi);
    if (write && s.reader[other] >= 0) conflict(acc_[static_cast<size_t>(s.reader[other])], false, cur, write, lo, hi);
    (write ? s.writer : s.reader)[me] = access;
    at = s.hi;
    ++it;
  }
}

void RaceChecker::issued(const Instr& in, int core, sim::Ps start, sim::Ps end, uint64_t index) {
  if (!isa::is_dma(in.op) || isa::op_info(in.op).cost == isa::CostClass::kBarrier) return;
  const isa::OpInfo& info = isa::op_info(in.op);
  const int indirect = isa::indirect_slot(in);
  bool any = false;
  for (int i = 0; i < info.num_slots; ++i)
    any = any || (in.slot(i).space == Space::kHbm && i != indirect);
  if (!any) return;
  Access a;
  a.start = start;
  a.end = end;
  a.index = index;
  a.loc = in.loc;
  a.op = in.op;
  a.core = static_cast<uint8_t>(core);
  a.accumulate = (in.flags & isa::kAccumulate) != 0;
  acc_.push_back(a);
  const int id = static_cast<int>(acc_.size() - 1);
  for (int i = 0; i < info.num_slots; ++i) {
    const Operand& o = in.slot(i);
    if (o.space != Space::kHbm || i == indirect) continue;
    const bool write = info.slots[static_cast<size_t>(i)].written;
    for_each_hbm_run(o, [&](int64_t lo, int64_t hi) { touch(lo, hi, id, write); });
  }
}

}  // namespace nsim::engines
