// DMA transfers in closed form (engines/dma): engines with equal calendars share one lane and a
// transfer books each lane once. Every start and end must be those of booking each engine on its own
// calendars: checked against the per-engine model written out here (the code before the closed form)
// and against DmaEngines with the closed form switched off, on random transfer streams.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "engines/dma/dma_engine.h"
#include "engines/simulator.h"
#include "memory/dma.h"

namespace {

using nsim::DType;
using nsim::engines::Calendar;
using nsim::engines::CoreParams;
using nsim::engines::DmaEngines;
using nsim::isa::Operand;
using nsim::isa::Space;
using nsim::memory::DmaSplit;
using nsim::memory::kMaxDmaEngines;
using nsim::sim::Ps;

// The per-engine model: one data and one HBM calendar per engine, every piece booked on its engine's.
struct PerEngine {
  const CoreParams& p;
  std::vector<Ps> setup_free;
  std::array<Calendar, kMaxDmaEngines> engine{}, hbm{};
  const PerEngine* peer = nullptr;
  explicit PerEngine(const CoreParams& q) : p(q), setup_free(static_cast<size_t>(q.dma_queues), 0) {}

  int hbm_active_at(Ps t) const {
    int n = 0;
    for (int e = 0; e < p.dma_engines; ++e) n += hbm[static_cast<size_t>(e)].busy_at(t);
    return n;
  }
  void prune(Ps t, Ps t_hbm) {
    for (int e = 0; e < p.dma_engines; ++e) {
      engine[static_cast<size_t>(e)].prune(t);
      hbm[static_cast<size_t>(e)].prune(t_hbm);
    }
  }
  DmaEngines::Transfer transfer(int queue, Ps trigger, const DmaSplit& split, double eff, bool store) {
    DmaEngines::Transfer t;
    Ps& qfree = setup_free[static_cast<size_t>(queue % p.dma_queues)];
    t.setup_start = std::max(trigger, qfree);
    const Ps setup_end = t.setup_start + p.dma_setup;
    qfree = setup_end + p.dma_transfer_gap;
    int active = 0;
    if (split.touches_hbm)
      for (int e = 0; e < p.dma_engines; ++e)
        active += split.piece[static_cast<size_t>(e)].bytes > 0 || hbm[static_cast<size_t>(e)].busy_at(setup_end);
    const double engine_bw = p.dma_engine_bw * (store ? p.dma_store_bw_factor : 1.0);
    double bw = split.touches_hbm ? std::min(engine_bw, p.hbm_bw / std::max(1, active)) : engine_bw;
    if (split.touches_hbm && peer)
      bw = std::min(bw, p.hbm_stack_bw / std::max(1, active + peer->hbm_active_at(setup_end)));
    t.data_start = INT64_MAX;
    t.done = setup_end;
    for (int e = 0; e < split.engines; ++e) {
      const auto ei = static_cast<size_t>(e);
      const auto& pc = split.piece[ei];
      if (pc.bytes <= 0) continue;
      const double desc = static_cast<double>(std::max<int64_t>(1, pc.descriptors));
      const double per = std::max(static_cast<double>(pc.bytes) / desc / (bw * eff), nsim::sim::ps_to_ns(p.dma_desc_min));
      const Ps dur = static_cast<Ps>(std::llround(desc * per * 1000.0));
      const Ps start = engine[ei].earliest(setup_end, dur + p.dma_transfer_gap);
      engine[ei].reserve(start, start + dur + p.dma_transfer_gap);
      if (split.touches_hbm) hbm[ei].reserve(start, start + dur);
      t.piece_start[ei] = start;
      t.piece_end[ei] = start + dur;
      t.data_start = std::min(t.data_start, start);
      t.done = std::max(t.done, start + dur);
    }
    if (t.data_start == INT64_MAX) t.data_start = setup_end;
    return t;
  }
};

// a: the per-engine reference; b: DmaEngines' answer, whose same_times must say whether every engine with
// a piece (split.used) moved it over one interval.
void check_same(const DmaEngines::Transfer& a, const DmaEngines::Transfer& b, const DmaSplit& split) {
  bool same_times = true;
  for (int e = 0; e < split.engines; ++e)
    if (split.used & (1u << e))
      same_times = same_times && a.piece_start[static_cast<size_t>(e)] == a.data_start && a.piece_end[static_cast<size_t>(e)] == a.done;
  CHECK(b.same_times == same_times);
  CHECK(a.setup_start == b.setup_start);
  CHECK(a.data_start == b.data_start);
  CHECK(a.done == b.done);
  for (int e = 0; e < kMaxDmaEngines; ++e) {
    INFO("engine " << e);
    CHECK(a.piece_start[static_cast<size_t>(e)] == b.piece_start[static_cast<size_t>(e)]);
    CHECK(a.piece_end[static_cast<size_t>(e)] == b.piece_end[static_cast<size_t>(e)]);
  }
}

// A random transfer: mostly full 128-partition tiles (uniform pieces), some with fewer or an odd number
// of partitions, a partition offset (pieces of different sizes), SBUF<->SBUF, HBM->HBM.
std::pair<Operand, Operand> random_transfer(std::mt19937& rng) {
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); };
  const int64_t cols = int64_t{16} << pick(7);  // 16 .. 1024 elements per partition
  const DType dt = pick(2) ? DType::kBFloat16 : DType::kFloat32;
  uint32_t parts = 128, first = 0;
  switch (pick(6)) {
    case 0: parts = static_cast<uint32_t>(1 + pick(128)); break;
    case 1: first = static_cast<uint32_t>(pick(64)), parts = static_cast<uint32_t>(1 + pick(64)); break;
    default: break;
  }
  const Operand chip = Operand::tile(Space::kSbuf, dt, 0, first, parts, {cols});
  const Operand hbm = Operand::tile(Space::kHbm, dt, 4096 * pick(8), 0, parts, {cols});
  switch (pick(8)) {
    case 0: return {chip, Operand::tile(Space::kSbuf, dt, 0, 0, parts, {cols})};  // SBUF -> SBUF
    case 1: return {hbm, Operand::tile(Space::kHbm, dt, 1 << 20, 0, parts, {cols})};  // HBM -> HBM
    case 2: return {hbm, chip};  // store
    default: return {chip, hbm};  // load
  }
}

// Run `n` random transfers through the per-engine model and both DmaEngines modes, on one core or on
// two peers (LNC=2) whose trigger clocks advance independently; prune now and then as the simulator
// does: a core at its own watermark, the HBM calendars (read by the peer) at the lower of the two.
// Returns the most lanes the closed form used.
int run_stream(const CoreParams& p, uint32_t seed, int n, bool peer) {
  std::mt19937 rng(seed);
  std::array<PerEngine, 2> ref{PerEngine(p), PerEngine(p)};
  std::array<DmaEngines, 2> fast{DmaEngines(p), DmaEngines(p)}, slow{DmaEngines(p), DmaEngines(p)};
  for (auto& d : slow) d.set_closed_form(false);
  if (peer) {
    ref[0].peer = &ref[1], ref[1].peer = &ref[0];
    fast[0].set_peer(&fast[1]), fast[1].set_peer(&fast[0]);
    slow[0].set_peer(&slow[1]), slow[1].set_peer(&slow[0]);
  }
  std::array<Ps, 2> trigger{0, 0};
  int most_lanes = 1;
  for (int i = 0; i < n; ++i) {
    INFO("seed " << seed << " transfer " << i);
    const auto [dst, src] = random_transfer(rng);
    const DmaSplit split = nsim::memory::split_transfer(dst, src, p.dma_engines, p.partitions_per_engine);
    const int queue = static_cast<int>(rng() % 8);
    const double eff = rng() % 5 == 0 ? p.dma_transpose_eff_sbuf2sbuf : 1.0;
    const size_t c = peer ? rng() % 2 : 0;  // the core that moves it
    trigger[c] += static_cast<Ps>(rng() % 3 == 0 ? 0 : rng() % 400000);  // bursts and gaps
    const bool store = nsim::memory::is_store(dst, src);
    const auto want = ref[c].transfer(queue, trigger[c], split, eff, store);
    check_same(want, fast[c].transfer(queue, trigger[c], split, eff, store), split);
    check_same(want, slow[c].transfer(queue, trigger[c], split, eff, store), split);
    most_lanes = std::max(most_lanes, fast[c].lanes());
    CHECK(slow[c].lanes() == p.dma_engines);
    if (rng() % 4 == 0) {  // no later trigger on core c before trigger[c]
      const Ps t_hbm = peer ? std::min(trigger[0], trigger[1]) : trigger[c];
      ref[c].prune(trigger[c], t_hbm);
      fast[c].prune(trigger[c], t_hbm);
      slow[c].prune(trigger[c], t_hbm);
    }
  }
  return most_lanes;
}

const CoreParams& trn2() {
  static const auto sim = nsim::Simulator::from_preset("trn2");
  return sim->params();
}

// trn2 with HBM scarce: a core's hbm.bw shared by its 16 engines, and the stack's by both cores' 32, is
// below dma.engine_bw, so every transfer's bandwidth depends on the engines moving HBM data when its
// data phase starts (the HBM calendars, the peer's included).
const CoreParams& hbm_bound() {
  static const CoreParams p = [] {
    CoreParams q = trn2();
    q.hbm_bw = q.dma_engine_bw * 6;        // 16 engines: 6/16 of dma.engine_bw each
    q.hbm_stack_bw = q.dma_engine_bw * 7;  // both cores' engines: down to 7/32 (any peer engine counts)
    return q;
  }();
  return p;
}

}  // namespace

TEST_CASE("DMA closed form: random transfers get the per-engine times, one core", "[engines][dma]") {
  int most = 1;
  for (uint32_t seed = 1; seed <= 20; ++seed) most = std::max(most, run_stream(trn2(), seed, 400, false));
  CHECK(most > 1);  // the streams did split lanes (uneven transfers), so both paths were exercised
}

TEST_CASE("DMA closed form: random transfers get the per-engine times, LNC=2 peers", "[engines][dma]") {
  for (uint32_t seed = 100; seed < 110; ++seed) run_stream(trn2(), seed, 400, true);
}

TEST_CASE("DMA closed form: random transfers get the per-engine times, HBM-bound, LNC=1 and 2", "[engines][dma]") {
  for (uint32_t seed = 200; seed < 210; ++seed) run_stream(hbm_bound(), seed, 400, false);
  for (uint32_t seed = 300; seed < 320; ++seed) run_stream(hbm_bound(), seed, 400, true);
}

TEST_CASE("DMA closed form: one lane for full tiles, split and merged again for a partial one", "[engines][dma]") {
  const CoreParams& p = trn2();
  DmaEngines d(p);
  const Operand full = Operand::tile(Space::kSbuf, DType::kBFloat16, 0, 0, 128, {512});
  const Operand half = Operand::tile(Space::kSbuf, DType::kBFloat16, 0, 0, 64, {512});
  const Operand x = Operand::tile(Space::kHbm, DType::kBFloat16, 0, 0, 128, {512});
  const Operand xh = Operand::tile(Space::kHbm, DType::kBFloat16, 0, 0, 64, {512});
  CHECK(d.lanes() == 1);
  const auto a = d.transfer(0, 0, d.split(full, x), 1.0, false);
  CHECK(d.lanes() == 1);  // every engine moved the same piece
  // 64 partitions: engines 0-7 get a piece, 8-15 none: two lanes.
  const auto b = d.transfer(1, 0, d.split(half, xh), 1.0, false);
  CHECK(d.lanes() == 2);
  CHECK(b.piece_start[0] > 0);
  CHECK(b.piece_end[8] == 0);  // no piece on engine 8
  // Once the watermark passes both transfers, the calendars are empty again: one lane.
  d.prune(std::max(a.done, b.done) + p.dma_transfer_gap);
  CHECK(d.lanes() == 1);
}

TEST_CASE("DMA split cache: the same split as split_transfer whatever the offsets", "[memory][dma]") {
  const CoreParams& p = trn2();
  nsim::memory::DmaSplitCache cache(p.dma_engines, p.partitions_per_engine);
  std::mt19937 rng(7);
  for (int i = 0; i < 2000; ++i) {
    INFO("transfer " << i);
    auto [dst, src] = random_transfer(rng);
    dst.offset += static_cast<int64_t>(rng() % 4096) * 4;  // the same shapes come back at other offsets
    src.offset += static_cast<int64_t>(rng() % 4096) * 4;
    const DmaSplit& got = cache.get(dst, src);
    const DmaSplit want = nsim::memory::split_transfer(dst, src, p.dma_engines, p.partitions_per_engine);
    CHECK(got.engines == want.engines);
    CHECK(got.touches_hbm == want.touches_hbm);
    CHECK(got.total_bytes == want.total_bytes);
    CHECK(got.used == want.used);
    CHECK(got.uniform == want.uniform);
    for (int e = 0; e < kMaxDmaEngines; ++e) {
      CHECK(got.piece[static_cast<size_t>(e)].bytes == want.piece[static_cast<size_t>(e)].bytes);
      CHECK(got.piece[static_cast<size_t>(e)].descriptors == want.piece[static_cast<size_t>(e)].descriptors);
    }
  }
}
