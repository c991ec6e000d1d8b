// RunStats keeps the DMA engines' counters in one shared counter while every transfer moves equal
// pieces at equal times on all engines (lockstep). The per-engine counters a user reads (stats JSON,
// the analyzer) must be those of updating every engine one by one: checked against that loop, written
// out here, on random streams mixing uniform transfers, partial ones and idle engines, with the
// counters read (flushed) at random points.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <random>

#include "engines/run_stats.h"
#include "engines/simulator.h"
#include "memory/dma.h"

namespace {

using nsim::InstrTiming;
using nsim::TrackCounters;
using nsim::engines::CoreParams;
using nsim::engines::DmaEngines;
using nsim::engines::RunStats;
using nsim::isa::Instr;
using nsim::memory::DmaSplit;
using nsim::memory::kMaxDmaEngines;
using nsim::sim::Ps;

const CoreParams& trn2() {
  static const auto sim = nsim::Simulator::from_preset("trn2");
  return sim->params();
}

// The per-engine update RunStats made before lockstep (engines/run_stats.cpp, RunStats::dma).
void reference(std::array<TrackCounters, kMaxDmaEngines>& dma, const DmaSplit& split, const DmaEngines::Transfer& tr) {
  for (int k = 0; k < split.engines; ++k) {
    const auto ki = static_cast<size_t>(k);
    if (split.piece[ki].bytes <= 0) continue;
    TrackCounters& tc = dma[ki];
    ++tc.instructions;
    tc.busy += tr.piece_end[ki] - tr.piece_start[ki];
    tc.instr_time += tr.piece_end[ki] - tr.piece_start[ki];
    if (tr.piece_start[ki] < tc.cur_lo) tc.active += tr.piece_end[ki] - tr.piece_start[ki];
    else tc.add_interval(tr.piece_start[ki], tr.piece_end[ki]);
    tc.bytes += static_cast<uint64_t>(split.piece[ki].bytes);
  }
}

void same(const TrackCounters& a, const TrackCounters& b) {
  CHECK(a.instructions == b.instructions);
  CHECK(a.busy == b.busy);
  CHECK(a.instr_time == b.instr_time);
  CHECK(a.active == b.active);
  CHECK(a.bytes == b.bytes);
  CHECK(a.cur_lo == b.cur_lo);
  CHECK(a.cur_hi == b.cur_hi);
  CHECK(a.last_end == b.last_end);
}

}  // namespace

TEST_CASE("lockstep DMA counters equal the per-engine updates", "[stats][dma]") {
  const CoreParams& p = trn2();
  const int n = p.dma_engines;
  REQUIRE(n > 1);
  for (uint32_t seed = 1; seed <= 40; ++seed) {
    std::mt19937 rng(seed);
    RunStats stats(p);
    std::array<TrackCounters, kMaxDmaEngines> ref{};
    uint64_t descriptors = 0;
    Ps t = 0;
    Instr in{};
    in.op = nsim::isa::Opcode::kDmaCopy;
    in.engine = nsim::isa::Engine::kSync;
    for (int i = 0; i < 300; ++i) {
      DmaSplit split;
      split.engines = n;
      DmaEngines::Transfer tr;
      const int kind = static_cast<int>(rng() % 10);  // 0-5 uniform, 6-7 partial, 8 uneven times, 9 gap-filler
      const int64_t bytes = 512 * (1 + static_cast<int64_t>(rng() % 8));
      const Ps dur = 1000 * (1 + static_cast<Ps>(rng() % 50));
      t += static_cast<Ps>(rng() % 3000);
      for (int k = 0; k < n; ++k) {
        const auto ki = static_cast<size_t>(k);
        const bool used = kind != 6 && kind != 7 ? true : k < 1 + static_cast<int>(rng() % static_cast<uint32_t>(n));
        split.piece[ki].bytes = used ? bytes : 0;
        split.piece[ki].descriptors = used ? 4 : 0;
        if (used) split.used |= 1u << k;
        Ps s = t;
        if (kind == 8) s += static_cast<Ps>(rng() % 2000);
        if (kind == 9) s = std::max<Ps>(0, t - 20000);  // before the engines' latest packet
        tr.piece_start[ki] = s;
        tr.piece_end[ki] = s + dur;
        if (used) descriptors += 4;
      }
      split.uniform = kind != 6 && kind != 7;
      tr.same_times = kind != 8;  // as DmaEngines::transfer reports it: one interval for every piece
      InstrTiming it{t, t + dur, t + 100};
      RunStats::Detail d;
      d.busy = 100;
      d.split = &split;
      d.transfer = &tr;
      stats.on_instr(in, it, d);
      reference(ref, split, tr);
      if (rng() % 17 == 0) {  // a mid-run read flushes the shared counter
        const auto& c = stats.counters();
        for (int k = 0; k < n; ++k) same(c.dma[static_cast<size_t>(k)], ref[static_cast<size_t>(k)]);
      }
    }
    const auto& c = stats.counters();
    CHECK(c.dma_descriptors == descriptors);
    for (int k = 0; k < n; ++k) same(c.dma[static_cast<size_t>(k)], ref[static_cast<size_t>(k)]);
    stats.finish();
    for (auto& r : ref) r.close();
    for (int k = 0; k < n; ++k) same(stats.counters().dma[static_cast<size_t>(k)], ref[static_cast<size_t>(k)]);
  }
}
