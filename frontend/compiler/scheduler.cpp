// The compiler's list scheduler, engine placement and DMA queue assignment (see scheduler.h).
#include "frontend/compiler/scheduler.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <unordered_map>

namespace nsim::frontend {

using isa::Engine;
using isa::Instr;
using isa::Opcode;
using isa::Operand;
using isa::Space;
using sim::Ps;

namespace {

/// Window-local conflict tracking on storage. Coarser than the simulator's (partitions ignored; on
/// chip the simulator's chunk, sim.dep_chunk_bytes, which is also the tile alignment; 64 KiB in HBM):
/// a false edge only keeps two instructions in order, while the times come from the simulator's
/// exact tracking, so coarseness costs schedule quality, never correctness.
struct Chunk {
  static constexpr int kReaders = 6;
  uint64_t writer = 0;  ///< seq + 1 of the last writer admitted (that orders every later access); 0 = none
  std::array<uint64_t, kReaders> readers{};  ///< seqs of the readers admitted since
  uint8_t nr = 0;
  /// The table entries [own0, own1] this state was made for (Scheduler::Impl::touch_run). While all of them
  /// still refer to it, nothing else does: the state was only ever given to them.
  uint32_t *own0 = nullptr, *own1 = nullptr;
  /// Table entries referring to this state (kept for the states made by touch_run): while it equals
  /// own1 - own0 + 1, every entry of [own0, own1] holds the state, and no other entry does.
  int64_t refs = 0;
};

/// The state of HBM chunks: also the writers admitted since `writer` whose bytes are known
/// (Scheduler::Impl::Node::hw). Each orders only the later accesses that may meet its bytes (the column blocks
/// of one tensor do not), so it leaves the readers in place; when kWriters of them are live, the next writer is
/// a `writer` again. (Apart from Chunk: the on-chip states stay small.)
struct HbmChunk : Chunk {
  static constexpr int kWriters = 6;
  std::array<uint64_t, kWriters> writers{};
  uint8_t nw = 0;
  uint8_t rbar = 0;  ///< bit i: readers[i] orders every later writer (it was ordered after a full list of readers)
};

/// The states of some chunk tables (Scheduler::Impl::touch_run), with compact()'s buffers.
template <class C>
struct StateSet {
  std::vector<C> v{C{}};  ///< v[0]: no writer, no readers
  size_t limit = 0;       ///< compact when `v` grows past this
  /// compact()'s buffers, kept between calls (their capacity too: a fresh multi-MB vector per call cost a page
  /// fault per 4 KiB touched).
  std::vector<uint32_t> map;
  std::vector<C> kept;
};

constexpr int64_t kHbmChunk = 65536;
using Footprint = engines::Footprints::Footprint;
static_assert((kHbmChunk & (kHbmChunk - 1)) == 0, "HbmRange::shift divides by it");

/// More than one bit of m set (without a popcount, a library call on a baseline x86-64 build).
bool several(uint8_t m) { return (m & (m - 1)) != 0; }

}  // namespace

struct Scheduler::Impl {
  /// A window instruction as commit(), compute_heights() and the conflict tables read it, for every instruction
  /// in the window: kept apart from its instructions (Body, ~1.7 KB each) and from the dependency regions worked out
  /// once it is ready (ReadyInfo). The window holds compiler.window of them (1024 by default); spread over the ~3 MB
  /// the nodes took with their instructions and regions, these reads missed the caches (sampled with perf:
  /// commit()'s successor loop and choose()'s candidate loop waited on memory, not on work).
  struct alignas(64) Node {  // (one cache line)
    uint64_t seq = 0;
    Ps not_before = 0;
    Ps height = 0;
    Ps min_cost = 0;  ///< the least of Body::cost over the candidate engines
    int npred = 0;
    uint8_t engines = 0;    ///< candidate engines (one bit when fixed)
    uint8_t free_uses = 0;  ///< in[0]'s StreamEngines::uses(): what its engine's free time depends on
    Engine home = Engine::kVector;  ///< in[0].engine as lowered: the default engine (ties go to it)
    std::vector<uint64_t> succ;  ///< order edges
  };
  static_assert(sizeof(Node) == 64, "a Node fills one cache line");
  /// A ready node as choose() reads it, in the `ready` list itself: the list is scanned at every issue, and a
  /// node's own entry in the window was by then usually out of the first-level cache. Once a node is ready its
  /// operands' times, costs and not_before no longer change; its height does (compute_heights() copies it here).
  struct Cand {
    /// No earlier start, nor earlier bound of the scheduling front, on any of its engines: the least of
    /// ready_at[e] (a pair: pair_front). choose() passes over a node with lb above the best start found so far.
    Ps lb = INT64_MAX;
    uint64_t seq = 0;
    Ps height = 0;
    /// The PSUM offset its MultiplyMoving accumulates into (an open accumulation group continues there), or -1.
    int64_t acc_psum = -1;
    /// A pair: when its LoadStationary may start, max(in[0]'s operands ready on TensorE, not_before). (A single
    /// instruction's is ready_at[e].)
    Ps pair_front = 0;
    uint8_t engines = 0, free_uses = 0;
    Engine home = Engine::kVector;
    bool pair = false;  ///< an nc_matmul's LoadStationary + MultiplyMoving (Body::n == 2)
    std::array<Ps, isa::kNumEngines> ready_at{};  ///< operands ready (and not_before) per candidate engine
    std::array<Ps, isa::kNumEngines> cost{};      ///< duration estimate per candidate engine
  };
  /// What make_ready() works out for commit() to hand to the simulator: in `infos`, an entry per ready node
  /// (reused: the entries stay in the caches, unlike the bodies of a large window).
  struct ReadyInfo {
    std::array<engines::DepTracker::Ready, isa::kNumEngines> rd0{};  ///< in[0]'s, per candidate engine
    engines::DepTracker::Ready rd1{};                                 ///< in[1]'s (a pair runs on TensorE)
    engines::DepTracker::Regions rg0, rg1;  ///< in[0]'s and in[1]'s dependency regions
    uint64_t rg_epoch = 0;                  ///< sim.regions_epoch() when they were computed
  };
  /// The rest of a window instruction, read when it is admitted, made ready and issued.
  struct Body {
    std::array<Instr, 2> in;  ///< an nc_matmul's LoadStationary + MultiplyMoving issue as one unit
    std::array<Lowering::Extents, 2> ext;  ///< their operands' byte extents (Lowering::last_extents)
    int n = 1;
    int op = -1;
    bool auto_queue = false;
    int64_t acc_psum = -1;  ///< Cand::acc_psum
    std::array<Ps, isa::kNumEngines> cost{};  ///< duration estimate per candidate engine
    std::vector<uint64_t> tsucc;  ///< with_schedule edges (also time edges; in Node::succ too)
    uint32_t ready_info = 0;      ///< once ready: its entry of ReadyInfo in `infos`
    Lowering::TileUses uses{};  ///< with a trace: the tiles it touches (occupancy track)
    /// The bytes its instruction reads (hr) and writes (hw) in HBM (engines::Footprints), when has_hr /
    /// has_hw: a Chunk's footprint writers and readers order only the accesses that may meet them.
    Footprint hr, hw;
    bool has_hr = false, has_hw = false;
  };

  const Kernel& k;
  Lowering& low;
  Simulator& sim;
  const engines::CoreParams& p;
  ScheduleStats& st;
  uint64_t cap;  ///< ring capacity (a power of two; doubled by grow() up to max_cap as the window fills)
  uint64_t max_cap;  ///< the least power of two >= window
  std::vector<Node> ring;
  std::vector<Body> bodies;  ///< by ring slot, as `ring`
  /// By ring slot, as `ring`: whether the node there was issued. Apart from the nodes: live() asks it for every
  /// predecessor the conflict tables hold, and a byte per slot stays in the first-level cache.
  std::vector<uint8_t> done;
  std::vector<ReadyInfo> infos;      ///< of the ready nodes (Body::ready_info), and free ones
  std::vector<uint32_t> free_infos;  ///< entries of `infos` not in use (the latest freed last)
  uint64_t base = 0, next = 0;  ///< window = seqs [base, next); every seq < base is issued
  std::vector<Cand> ready;
  bool lowering_done = false;
  bool has_held = false;
  Instr held{};
  Lowering::Extents held_ext{};
  int held_op = -1;
  uint64_t since_heights = 0;
  /// The scheduling front: the earliest start of any ready instruction at the last issue. Every
  /// instruction issued later starts at or after it (see issue_one), so the simulator may use it as
  /// its watermark.
  Ps floor = 0;
  std::vector<uint64_t> preds_scratch;
  bool hr_seen = false, hw_seen = false;  ///< admit(): an HBM side read / written by the node so far

  // Conflict tables: SBUF, PSUM (per-partition byte chunks), HBM (written tensors only). A chunk holds
  // the index of its state in its StateSet (on chip: chip_states; HBM: hbm_states): the chunks of one tile, accessed together, share one state, so
  // an access touches each distinct state once and the rest of its chunks move to the result by index
  // (touch_run). States are copied on write; unreferenced ones are dropped by compact().
  int64_t chip_chunk = 64;
  int chip_shift = -1;  ///< log2(chip_chunk) when a power of two (a shift, not a division, per access)
  /// By engine: engines::trigger_queue(p, engine, q) for q < dma.queues_per_trigger (at least one).
  std::array<std::vector<int>, isa::kNumEngines> trigger_queues;
  StateSet<Chunk> chip_states;   ///< of sbuf and psum
  StateSet<HbmChunk> hbm_states;  ///< of hbm
  std::vector<uint32_t> sbuf, psum;
  std::vector<uint32_t> hbm;  ///< chunks of the written HBM tensors, each range from its `first`
  /// While the lowering follows a loop for fast-forward: the on-chip chunk stretches accessed since the last
  /// ff_schedule_digest() (first and last table entry).
  std::vector<std::pair<const uint32_t*, const uint32_t*>> ff_touched;
  std::vector<std::pair<const uint32_t*, const uint32_t*>> ff_touched_hbm;  ///< the same in HBM
  struct HbmRange {
    int64_t lo, hi;
    bool written;
    int64_t chunk = kHbmChunk;  ///< bytes per chunk (grows for huge tensors: at most ~1M chunks each)
    int shift = 0;              ///< log2(chunk): offsets into the tensor are >= 0, so a shift divides
    size_t first = 0;           ///< index of its first chunk in `hbm`
  };
  std::vector<HbmRange> hbm_ranges;  ///< sorted by lo

  // Per op: candidate engines (computed at its first instruction), accumulator use, order group.
  /// What admit() needs of an op's instruction (or pair) that is the same for each of its instructions: worked
  /// out at its first (n = 0: not yet; else the instruction count it was worked out for).
  struct OpFacts {
    int n = 0;
    uint8_t engines = 0, free_uses = 0;
    bool acc = false, rng = false, auto_queue = false;
    Ps min_cost = 0;
    std::array<Ps, isa::kNumEngines> cost{};
  };
  std::vector<OpFacts> op_facts;
  std::array<uint64_t, isa::kNumEngines> last_acc{};  ///< seq + 1 of the last accumulator user per engine
  std::array<uint64_t, isa::kNumEngines> fence{};  ///< seq + 1 of the last core_barrier per engine
  uint64_t last_rng = 0;  ///< seq + 1 of the last PRNG-state user (any engine: set_rng_seed seeds two)
  uint64_t last_stationary = 0;                        ///< seq + 1 of the last raw load_stationary/multiply_moving
  std::unordered_map<int, uint64_t> last_in_group;     ///< order group -> seq + 1 of its last instruction
  // with_schedule: op -> the ops it runs after; op -> seq + 1 of its latest instruction.
  std::vector<std::vector<int>> runs_after;
  std::vector<uint64_t> last_of_op;
  std::vector<Ps> end_of_op;  ///< op -> the end of its latest instance once issued (last_of_op's)
  std::vector<std::vector<uint64_t>> waiting_for;  ///< op -> instructions waiting for its next instance
  uint64_t n_waiting = 0;

  Impl(const Kernel& kk, Lowering& l, Simulator& s, ScheduleStats& stats)
      : k(kk), low(l), sim(s), p(s.params()), st(stats) {
    max_cap = 1;
    while (max_cap < static_cast<uint64_t>(std::max(2, p.schedule_window))) max_cap <<= 1;
    // (The ring starts small and grows with the window: a whole one, ~1.7 KB per slot, took a small kernel's run
    // longer to build than to schedule.)
    cap = std::min<uint64_t>(max_cap, kFirstCap);
    // (Reserved whole, made as the ring grows: untouched pages cost nothing, and growing moves no slot whose
    // instruction keeps its place.)
    ring.reserve(max_cap);
    bodies.reserve(max_cap);
    done.reserve(max_cap);
    ring.resize(cap);
    bodies.resize(cap);
    done.resize(cap);
    chip_chunk = std::max<int64_t>(4, p.dep_chunk_bytes);
    for (int s2 = 0; s2 < 62; ++s2)
      if (chip_chunk == int64_t{1} << s2) chip_shift = s2;
    for (int e = 0; e < isa::kNumEngines; ++e)
      for (int q = 0; q < std::max(1, p.dma_queues_per_trigger); ++q)
        trigger_queues[static_cast<size_t>(e)].push_back(engines::trigger_queue(p, static_cast<Engine>(e), q));
    sbuf.resize(static_cast<size_t>(p.mem.sbuf_bytes_per_partition / chip_chunk + 1));
    psum.resize(static_cast<size_t>(p.mem.psum_bytes_per_partition() / chip_chunk + 1));
    // HBM tensors the kernel writes; reads of the others never conflict.
    std::vector<char> written(k.tensors.size(), 0);
    for (const Op& op : k.ops) {
      const int opc = Lowering::opcode_of(op.name);
      if (opc == Lowering::kUnknownOp) continue;
      for (size_t s2 = 0; s2 < isa::kMaxSlots; ++s2) {
        if (!op.operands[s2]) continue;
        const int t = op.operands[s2]->tensor;
        if (t < 0 || static_cast<size_t>(t) >= k.tensors.size()) continue;
        const isa::OpInfo& info = Lowering::info_of(opc);
        const bool w = s2 < static_cast<size_t>(info.num_slots) && info.slots[s2].written;
        if (w) written[static_cast<size_t>(t)] = 1;
      }
    }
    for (size_t t = 0; t < k.tensors.size(); ++t) {
      if (k.tensors[t].space != Space::kHbm || !sim.memory().has_hbm_tensor(k.tensors[t].name)) continue;
      const memory::HbmTensor& h = sim.memory().hbm_tensor(k.tensors[t].name);
      hbm_ranges.push_back({h.addr, h.addr + h.bytes, written[t] != 0});
    }
    std::sort(hbm_ranges.begin(), hbm_ranges.end(), [](const HbmRange& a, const HbmRange& b) { return a.lo < b.lo; });
    size_t nchunks = 0;
    for (HbmRange& r : hbm_ranges) {
      if (!r.written) continue;
      while ((r.hi - r.lo) / r.chunk > (int64_t{1} << 20)) r.chunk *= 2;
      while ((int64_t{1} << r.shift) < r.chunk) ++r.shift;
      r.first = nchunks;
      nchunks += static_cast<size_t>((r.hi - r.lo + r.chunk - 1) / r.chunk);
    }
    hbm.resize(nchunks);
    chip_states.limit = std::max<size_t>(size_t{1} << 16, (sbuf.size() + psum.size()) / 4);
    hbm_states.limit = std::max<size_t>(size_t{1} << 16, hbm.size() / 4);
    op_facts.assign(k.ops.size(), OpFacts{});
    last_of_op.assign(k.ops.size(), 0);
    end_of_op.assign(k.ops.size(), 0);
    waiting_for.resize(k.ops.size());
    runs_after = schedule_edges(k);
    preds_scratch.reserve(64);
  }

  static constexpr uint64_t kFirstCap = 32;

  /// Double the ring (the window holds cap instructions and may hold more), within the capacity reserved (nothing
  /// reallocates): an instruction of the window whose seq has the bit `cap` set moves from slot s to s + cap, the
  /// others keep theirs (slot s is then free: the window never held two seqs equal modulo cap). Only admit() calls
  /// it, before it takes a reference to a slot. (prepare() fills the window before anything issues, so the ring
  /// reaches max_cap before it wraps and nothing moves today: checked on every example and library kernel at four
  /// windows; the loop keeps grow() right if the window ever grows after issuing.)
  void grow() {
    const uint64_t ncap = cap * 2;
    ring.resize(ncap);
    bodies.resize(ncap);
    done.resize(ncap);
    for (uint64_t q = base; q < next; ++q) {
      const uint64_t from = q & (cap - 1), to = q & (ncap - 1);
      if (from == to) continue;
      ring[to] = std::move(ring[from]);
      bodies[to] = std::move(bodies[from]);
      done[to] = done[from];
    }
    cap = ncap;
  }

  Node& node(uint64_t seq) { return ring[seq & (cap - 1)]; }
  Body& body(uint64_t seq) { return bodies[seq & (cap - 1)]; }
  bool live(uint64_t seq) { return seq >= base && seq < next && !done[seq & (cap - 1)]; }

  void add_edge(uint64_t from, Node& x) {
    if (from == x.seq || !live(from)) return;
    for (uint64_t q : preds_scratch)
      if (q == from) return;
    preds_scratch.push_back(from);
    node(from).succ.push_back(x.seq);
    ++x.npred;
  }

  /// Whether live instruction q's HBM write (q_writes) or read may meet the bytes `fx` (nullptr: any bytes).
  bool meets(uint64_t q, bool q_writes, const Footprint* fx) {
    if (!fx) return true;
    const Body& n = body(q);
    if (q_writes ? !n.has_hw : !n.has_hr) return true;
    return !engines::Footprints::disjoint(q_writes ? n.hw : n.hr, *fx);
  }

  /// Whether live instruction q's HBM write (q_writes) or read accesses only bytes `fx` covers.
  bool covered(uint64_t q, bool q_writes, const Footprint& fx) {
    const Body& n = body(q);
    return (q_writes ? n.has_hw : n.has_hr) && engines::Footprints::covers(fx, q_writes ? n.hw : n.hr);
  }

  /// x's access of the chunks holding state c (on chip: every access may meet every other).
  void touch(Chunk& c, Node& x, bool write, const Footprint*) {
    if (c.writer) add_edge(c.writer - 1, x);
    if (write) {
      for (int i = 0; i < c.nr; ++i) add_edge(c.readers[static_cast<size_t>(i)], x);
      c.nr = 0;
      c.writer = x.seq + 1;
      return;
    }
    if (c.nr == Chunk::kReaders) {  // drop issued readers; if all still wait, order x after them
      int m = 0;
      for (int i = 0; i < c.nr; ++i)
        if (live(c.readers[static_cast<size_t>(i)])) c.readers[static_cast<size_t>(m++)] = c.readers[static_cast<size_t>(i)];
      c.nr = static_cast<uint8_t>(m);
      if (m == Chunk::kReaders) {
        for (int i = 0; i < m; ++i) add_edge(c.readers[static_cast<size_t>(i)], x);
        c.nr = 0;
      }
    }
    c.readers[c.nr++] = x.seq;
  }

  /// touch() in HBM, `fx` the bytes x accesses (nullptr: any bytes): footprint writers and barrier readers.
  void touch(HbmChunk& c, Node& x, bool write, const Footprint* fx) {
    if (c.writer) add_edge(c.writer - 1, x);
    if (c.nw) {  // the footprint writers still waiting: ordered before x where their bytes may meet
      int m = 0;
      for (int i = 0; i < c.nw; ++i) {
        const uint64_t w = c.writers[static_cast<size_t>(i)];
        if (!live(w)) continue;  // issued: nothing left to order
        if (meets(w, true, fx)) {
          add_edge(w, x);
          if (write && fx && covered(w, true, *fx)) continue;  // what meets w's bytes meets x's: x orders it
        }
        c.writers[static_cast<size_t>(m++)] = w;
      }
      c.nw = static_cast<uint8_t>(m);
    }
    if (write) {
      if (fx && c.nw < HbmChunk::kWriters) {  // a footprint writer: after the readers of its bytes, which stay
        int m = 0;
        uint8_t bar = 0;
        for (int i = 0; i < c.nr; ++i) {
          const uint64_t r = c.readers[static_cast<size_t>(i)];
          const bool b = (c.rbar >> i) & 1;
          if (!live(r)) continue;
          if (b || meets(r, false, fx)) {
            add_edge(r, x);
            if (!b && covered(r, false, *fx)) continue;  // (a barrier reader stays: it orders its predecessors)
          }
          if (b) bar = static_cast<uint8_t>(bar | (1u << m));
          c.readers[static_cast<size_t>(m++)] = r;
        }
        c.nr = static_cast<uint8_t>(m);
        c.rbar = bar;
        c.writers[c.nw++] = x.seq;
        return;
      }
      for (int i = 0; i < c.nr; ++i) add_edge(c.readers[static_cast<size_t>(i)], x);
      for (int i = 0; i < c.nw; ++i) add_edge(c.writers[static_cast<size_t>(i)], x);
      c.nr = c.nw = 0;
      c.rbar = 0;
      c.writer = x.seq + 1;
      return;
    }
    bool barrier = false;
    if (c.nr == Chunk::kReaders) {  // drop issued readers; if all still wait, order x after them
      int m = 0;
      uint8_t bar = 0;
      for (int i = 0; i < c.nr; ++i)
        if (live(c.readers[static_cast<size_t>(i)])) {
          if ((c.rbar >> i) & 1) bar = static_cast<uint8_t>(bar | (1u << m));
          c.readers[static_cast<size_t>(m++)] = c.readers[static_cast<size_t>(i)];
        }
      c.nr = static_cast<uint8_t>(m);
      c.rbar = bar;
      if (m == Chunk::kReaders) {
        for (int i = 0; i < m; ++i) add_edge(c.readers[static_cast<size_t>(i)], x);
        c.nr = 0;
        c.rbar = 0;
        barrier = true;  // every later writer, whatever its bytes, waits for x (and so for them)
      }
    }
    if (barrier) c.rbar = static_cast<uint8_t>(c.rbar | (1u << c.nr));
    c.readers[c.nr++] = x.seq;
  }

  /// The index in `hbm` of the chunk holding HBM byte `addr` and log2 of its size, or {-1, 0} (no written tensor
  /// holds it: not tracked).
  std::pair<int64_t, int> hbm_chunk_of(int64_t addr) const {
    auto it = std::upper_bound(hbm_ranges.begin(), hbm_ranges.end(), addr,
                               [](int64_t v, const HbmRange& r) { return v < r.lo; });
    if (it == hbm_ranges.begin()) return {-1, 0};
    const HbmRange& r = *std::prev(it);
    if (!r.written || addr >= r.hi) return {-1, 0};
    return {static_cast<int64_t>(r.first) + ((addr - r.lo) >> r.shift), r.shift};
  }

  /// The written HBM tensor whose chunks hold `hbm[i]` (its index in hbm_ranges), or -1.
  int64_t hbm_range_of_chunk(int64_t i) const {
    for (size_t j = 0; j < hbm_ranges.size(); ++j) {
      const HbmRange& r = hbm_ranges[j];
      const auto n = (r.hi - r.lo + r.chunk - 1) / r.chunk;
      if (r.written && i >= static_cast<int64_t>(r.first) && i < static_cast<int64_t>(r.first) + n)
        return static_cast<int64_t>(j);
    }
    return -1;
  }

  /// Fast-forward's skip over a loop whose iterations share HBM chunks (Lowering::HbmChunks::move): chunk `to` of
  /// each (from, to) takes a copy of chunk `from`'s state, as the iterations skipped would have left it. Possible
  /// where each `to` lies in from's tensor, holds no live access (what an earlier access left there has issued:
  /// it orders nothing, so only live entries matter) and has one `from`.
  bool move_hbm_states(std::vector<std::pair<int64_t, int64_t>> moves, bool apply) {
    std::sort(moves.begin(), moves.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
    for (size_t i = 0; i < moves.size(); ++i) {
      const auto [from, to] = moves[i];
      if (i > 0 && moves[i - 1].second == to) {
        if (moves[i - 1].first != from) return false;
        continue;
      }
      const int64_t r = hbm_range_of_chunk(from);
      if (r < 0 || hbm_range_of_chunk(to) != r) return false;
      const HbmChunk& c = hbm_states.v[hbm[static_cast<size_t>(to)]];
      bool quiet = c.writer == 0 || !live(c.writer - 1);
      for (int j = 0; j < c.nr; ++j) quiet &= !live(c.readers[static_cast<size_t>(j)]);
      for (int j = 0; j < c.nw; ++j) quiet &= !live(c.writers[static_cast<size_t>(j)]);
      if (!quiet) return false;
    }
    if (!apply) return true;
    moves.erase(std::unique(moves.begin(), moves.end()), moves.end());
    if (hbm_states.v.size() + moves.size() >= hbm_states.limit) compact(hbm_states);
    std::vector<HbmChunk> copies;  // the states before any move (a `to` may be another move's `from`)
    copies.reserve(moves.size());
    for (const auto& [from, to] : moves) copies.push_back(hbm_states.v[hbm[static_cast<size_t>(from)]]);
    for (size_t i = 0; i < moves.size(); ++i) {
      uint32_t& e = hbm[static_cast<size_t>(moves[i].second)];
      if (e != 0) --hbm_states.v[e].refs;  // (states[0]'s count is not kept)
      HbmChunk& c = hbm_states.v.emplace_back(copies[i]);
      c.own0 = c.own1 = &e;
      c.refs = 1;
      e = static_cast<uint32_t>(hbm_states.v.size() - 1);
    }
    return true;
  }

  void access(const Instr& in, const Lowering::Extents& ext, int slot, Node& x, bool write) {
    const Operand& o = in.slot(slot);
    if (!o.present()) return;
    const auto [lo, hi] = ext[static_cast<size_t>(slot)];  // isa::slot_extent(in, slot)
    if (hi <= lo) return;
    if (o.space == Space::kHbm) {  // operands stay inside one tensor (bounds are checked first)
      auto it = std::upper_bound(hbm_ranges.begin(), hbm_ranges.end(), lo,
                                 [](int64_t v, const HbmRange& r) { return v < r.lo; });
      if (it == hbm_ranges.begin()) return;
      const HbmRange& r = *std::prev(it);
      if (!r.written || hi > r.hi) return;  // a read-only tensor never conflicts
      // Its bytes, for the footprint writers (one HBM side per direction; a second one: unknown, any bytes).
      Body& xb = body(x.seq);
      Footprint& f = write ? xb.hw : xb.hr;
      bool& has = write ? xb.has_hw : xb.has_hr;
      const bool first_side = !(write ? hw_seen : hr_seen);
      (write ? hw_seen : hr_seen) = true;
      has = first_side;
      if (first_side) f = engines::Footprints::of_slot(in, slot);
      uint32_t* const c0 = hbm.data() + r.first + ((lo - r.lo) >> r.shift);
      uint32_t* const c1 = hbm.data() + r.first + ((hi - 1 - r.lo) >> r.shift);
      touch_run(hbm_states, c0, c1, x, write, has ? &f : nullptr);
      if (low.fast_forward_following()) ff_touched_hbm.emplace_back(c0, c1);
      return;
    }
    std::vector<uint32_t>& tab = o.space == Space::kPsum ? psum : sbuf;
    // (A shift where the division gives the same: a non-negative offset and a power-of-two chunk.)
    const auto chunk_of = [&](int64_t b) { return b >= 0 && chip_shift >= 0 ? b >> chip_shift : b / chip_chunk; };
    const int64_t first = std::max<int64_t>(0, chunk_of(lo));  // (a negative offset fails verify() at submit)
    const int64_t last = std::min<int64_t>(chunk_of(hi - 1), static_cast<int64_t>(tab.size()) - 1);
    if (first <= last) {
      touch_run(chip_states, tab.data() + first, tab.data() + last, x, write, nullptr);
      if (low.fast_forward_following()) ff_touched.emplace_back(tab.data() + first, tab.data() + last);
    }
  }

  /// Fast-forward's part of the list scheduler (Lowering::set_fast_forward_schedule_digest): a hash of the states
  /// the chunks accessed since the last call hold now. What decides the edges later accesses get: the last
  /// writer and each reader of the list, by age in admissions while they wait, or as issued (they then order
  /// nothing, but an issued reader still fills the list until it is next pruned, so the count stays). A reader
  /// list of a tile read in every iteration and never written (a weight read by five matmuls per iteration)
  /// prunes its issued readers every kReaders reads and orders the next read after the ones still waiting:
  /// which ones wait depends on the schedule, so its state has a period of its own, which a skip must keep (a
  /// random kernel with a tiled matmul after such a loop came out with TensorE times a few ns off).
  uint64_t ff_schedule_digest() {
    uint64_t h = 0x2545F4914F6CDD1Dull;
    auto raw = [&h](uint64_t v) { h ^= v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2); };
    const auto age = [this](uint64_t seq) { return live(seq) ? next - seq : ~uint64_t{0}; };
    auto chunk = [&](const Chunk& st) {
      raw(st.writer && live(st.writer - 1) ? next - (st.writer - 1) : 0);
      raw(st.nr);
      for (int i = 0; i < st.nr; ++i) raw(age(st.readers[static_cast<size_t>(i)]));
    };
    auto stretches = [&](auto& touched, const auto& states, auto&& more) {
      for (const auto& [c, e] : touched) {
        uint32_t prev = UINT32_MAX;
        for (const uint32_t* q = c; q <= e; ++q) {
          if (*q == prev) continue;  // (a stretch of chunks holding one state: once)
          prev = *q;
          chunk(states.v[*q]);
          more(states.v[*q]);
        }
        raw(static_cast<uint64_t>(e - c));
      }
      touched.clear();
    };
    stretches(ff_touched, chip_states, [](const Chunk&) {});
    // In HBM also the footprint writers and which readers order every later writer.
    stretches(ff_touched_hbm, hbm_states, [&](const HbmChunk& st) {
      raw(st.nw);
      for (int i = 0; i < st.nw; ++i) raw(age(st.writers[static_cast<size_t>(i)]));
      raw(st.rbar);
    });
    return h;
  }

  /// touch() every chunk of [first, last]: each stretch of chunks holding one state once, into a new state
  /// the stretch's chunks take (add_edge keeps each predecessor once, so a state's edges are the same
  /// whichever of its chunks is touched). A state that only this stretch refers to (the tile's own, made
  /// by its previous access) is touched in place instead.
  template <class C>
  void touch_run(StateSet<C>& S, uint32_t* first, uint32_t* last, Node& x, bool write, const Footprint* fx) {
    if (S.v.size() >= S.limit) compact(S);
    std::vector<C>& states = S.v;
    for (uint32_t* c = first; c <= last;) {
      const uint32_t before = *c;
      uint32_t* e = c;
      C& st = states[before];
      // The stretch holding `before` from c: all of [own0, own1] when it still holds the state whole (then
      // nothing past it does), else found chunk by chunk.
      if (before != 0 && st.own0 == c && st.own1 <= last && st.refs == st.own1 - st.own0 + 1) e = st.own1;
      else
        while (e < last && e[1] == before) ++e;
      if (before != 0 && st.own0 == c && st.own1 == e) {
        touch(st, x, write, fx);
      } else {
        st.refs -= e - c + 1;  // (states[0]'s count is not kept)
        const uint32_t after = touched(states, before, x, write, fx);
        states[after].own0 = c;
        states[after].own1 = e;
        states[after].refs = e - c + 1;
        std::fill(c, e + 1, after);
      }
      c = e + 1;
    }
  }

  /// A copy of state `i` touched by x, as a new state.
  template <class C>
  uint32_t touched(std::vector<C>& states, uint32_t i, Node& x, bool write, const Footprint* fx) {
    states.push_back(states[i]);  // (push_back copies its argument before it reallocates)
    touch(states.back(), x, write, fx);
    return static_cast<uint32_t>(states.size() - 1);
  }

  /// The tables whose chunks hold states of S.
  std::array<std::vector<uint32_t>*, 2> tables(StateSet<Chunk>&) { return {&sbuf, &psum}; }
  std::array<std::vector<uint32_t>*, 2> tables(StateSet<HbmChunk>&) { return {&hbm, nullptr}; }

  /// Drop the states of S no chunk refers to (renumbering the others in order of first reference).
  template <class C>
  void compact(StateSet<C>& S) {
    std::vector<uint32_t>& map = S.map;
    std::vector<C>& kept = S.kept;
    map.assign(S.v.size(), UINT32_MAX);
    kept.clear();
    kept.push_back(S.v[0]);
    map[0] = 0;
    for (std::vector<uint32_t>* tab : tables(S)) {
      if (!tab) continue;
      for (uint32_t& i : *tab) {
        if (map[i] == UINT32_MAX) {
          map[i] = static_cast<uint32_t>(kept.size());
          kept.push_back(S.v[i]);
        }
        i = map[i];
      }
    }
    S.v.swap(kept);
    // Room for as many new states as the chunks could refer to, at least as many as are live.
    S.limit = std::max(S.limit, 2 * S.v.size());
  }

  /// Engines an instruction of op `oi` may be placed on (bitmask), checked once per op.
  uint8_t candidates(int oi, const Instr& in) {
    const uint8_t fixed = isa::engine_bit(in.engine);
    if (oi < 0 || !p.auto_placement || k.ops[static_cast<size_t>(oi)].engine || in.op == Opcode::kCoreBarrier)
      return fixed;  // a core_barrier blocks the engine it names (its default: GpSimd)
    uint8_t m = fixed;
    const isa::OpInfo& info = isa::op_info(in.op);
    if (isa::is_dma(in.op)) {
      // Automatic transfers are triggered from Sync (static descriptors) or, with hardware DGE (gen3+), Scalar.
      m = isa::engine_bit(Engine::kSync);
      if (p.generation >= 3 && (info.engines & isa::engine_bit(Engine::kScalar))) m |= isa::engine_bit(Engine::kScalar);
    } else if (in.engine != Engine::kTensor && in.reduce_cmd == isa::ReduceCmd::kIdle) {
      bool psum_opnd = false, floats = true;
      for (int i = 0; i < info.num_slots; ++i) {
        const Operand& o = in.slot(i);
        if (!o.present()) continue;
        psum_opnd |= o.space == Space::kPsum;
        floats &= dtype_is_float(o.dtype);
      }
      // Only where every allowed engine computes the same values: float operands (integer copies and
      // int32 tensor_tensor differ between engines); GpSimd has no PSUM access; ScalarE runs
      // tensor_copy/tensor_scalar only where scalar.tensor_ops says so.
      if (floats) {
        for (Engine e : {Engine::kVector, Engine::kScalar, Engine::kGpsimd}) {
          if (!(info.engines & isa::engine_bit(e))) continue;
          if (e == Engine::kGpsimd && psum_opnd) continue;
          if (e == Engine::kScalar && !p.scalar_tensor_ops) continue;
          Instr t = in;
          t.engine = e;
          try {
            isa::verify(t, sim.params().limits());
          } catch (const Error&) {
            continue;
          }
          m |= isa::engine_bit(e);
        }
      }
    }
    return m;
  }


  bool pull(Instr& in, Lowering::Extents& ext, int& oi) {
    if (has_held) {
      in = held;
      ext = held_ext;
      oi = held_op;
      has_held = false;
      return true;
    }
    if (lowering_done) return false;
    if (!low.next(in)) {
      lowering_done = true;
      return false;
    }
    ext = low.last_extents();
    oi = low.last_op();
    return true;
  }

  /// Bring the next instruction (or LoadStationary + MultiplyMoving pair) into the window.
  bool admit() {
    int oi = -1;
    if (next - base >= cap && cap < max_cap) grow();
    Node& x = node(next);
    Body& xb = body(next);  // lowered straight into its window slot (an Instr is ~600 bytes)
    if (!pull(xb.in[0], xb.ext[0], oi)) return false;
    const Instr& a = xb.in[0];
    xb.n = 1;
    x.seq = next;
    xb.op = oi;
    // Tile uses as of this op's lowering (before pulling another op's instruction below, whose allocs
    // would move the instance counts on).
    if (low.recording_uses()) low.tile_uses(oi, xb.uses);
    done[next & (cap - 1)] = 0;
    x.npred = 0;
    x.succ.clear();
    xb.tsucc.clear();
    x.height = 0;
    x.not_before = floor;  // enters the window at the current scheduling front, never before it
    bool raw_stationary = a.op == Opcode::kLoadStationary || a.op == Opcode::kMultiplyMoving;
    if (a.op == Opcode::kLoadStationary) {
      Instr& b = xb.in[1];
      int ob = -1;
      if (pull(b, xb.ext[1], ob)) {
        if (b.op == Opcode::kMultiplyMoving && ob == oi) {
          xb.n = 2;
          raw_stationary = false;  // an nc_matmul: the pair issues together
        } else {
          held = b;
          held_ext = xb.ext[1];
          held_op = ob;
          has_held = true;
        }
      }
    }
    ++next;
    st.window_peak = std::max(st.window_peak, next - base);
    preds_scratch.clear();
    xb.has_hr = xb.has_hw = hr_seen = hw_seen = false;
    for (int j = 0; j < xb.n; ++j) {
      const Instr& in = xb.in[static_cast<size_t>(j)];
      const Lowering::Extents& ext = xb.ext[static_cast<size_t>(j)];
      const isa::OpInfo& info = isa::op_info(in.op);
      for (int i = 0; i < info.num_slots; ++i)
        if (!info.slots[static_cast<size_t>(i)].written) access(in, ext, i, x, false);
      for (int i = 0; i < info.num_slots; ++i)
        if (info.slots[static_cast<size_t>(i)].written) access(in, ext, i, x, true);
    }
    if (raw_stationary) {  // LoadStationary/MultiplyMoving written as separate ops share the PE weights
      if (last_stationary) add_edge(last_stationary - 1, x);
      last_stationary = x.seq + 1;
    }
    const Instr& head = xb.in[static_cast<size_t>(xb.n - 1)];
    OpFacts scratch;
    const OpFacts& f = facts_of(oi, xb, scratch);
    if (f.acc) {  // accumulator registers: keep their users' order on each engine
      uint64_t& l = last_acc[static_cast<size_t>(head.engine)];
      if (l) add_edge(l - 1, x);
      l = x.seq + 1;
    }
    if (f.rng) {  // the PRNG state: its users stay in program order
      if (last_rng) add_edge(last_rng - 1, x);
      last_rng = x.seq + 1;
    }
    if (oi >= 0) {
      const Op& op = k.ops[static_cast<size_t>(oi)];
      if (op.order_group > 0) {  // no_reorder: program order within the block
        uint64_t& l = last_in_group[op.order_group];
        if (l) add_edge(l - 1, x);
        l = x.seq + 1;
      }
      // with_schedule "x after b": after b's latest instance when b comes earlier in the kernel, else
      // after b's next instance (x waits in the window for it; released if the window stalls).
      for (int b : runs_after[static_cast<size_t>(oi)]) {
        if (b > oi) {
          ++x.npred;
          waiting_for[static_cast<size_t>(b)].push_back(x.seq);
          ++n_waiting;
          continue;
        }
        const uint64_t l = last_of_op[static_cast<size_t>(b)];
        if (l && live(l - 1)) {
          add_edge(l - 1, x);
          body(l - 1).tsucc.push_back(x.seq);
        } else if (l) {  // issued already (perhaps long before x came into the window): after its end
          x.not_before = std::max(x.not_before, end_of_op[static_cast<size_t>(b)]);
        }
      }
      for (uint64_t w : waiting_for[static_cast<size_t>(oi)]) {  // earlier instructions waiting for this op
        --n_waiting;
        if (!live(w)) continue;
        x.succ.push_back(w);  // takes over the placeholder count added when w was admitted
        xb.tsucc.push_back(w);
      }
      waiting_for[static_cast<size_t>(oi)].clear();
      last_of_op[static_cast<size_t>(oi)] = x.seq + 1;
    }
    xb.auto_queue = f.auto_queue;
    x.home = a.engine;
    const Instr* mv = moving_of(xb);
    xb.acc_psum = mv != nullptr && (mv->flags & isa::kAccumulate) ? mv->opnd[0].offset : -1;
    x.engines = f.engines;
    x.free_uses = f.free_uses;
    // core_barrier blocks its engine (LNC=2): after every earlier instruction that may run there,
    // before every later one.
    if (head.op == Opcode::kCoreBarrier) {
      const uint8_t bit = isa::engine_bit(head.engine);
      for (uint64_t q = base; q < x.seq; ++q)
        if (live(q) && (node(q).engines & bit)) add_edge(q, x);
      fence[static_cast<size_t>(head.engine)] = x.seq + 1;
    } else {
      for (int e = 0; e < isa::kNumEngines; ++e)
        if ((x.engines & (1u << e)) && fence[static_cast<size_t>(e)]) add_edge(fence[static_cast<size_t>(e)] - 1, x);
    }
    xb.cost = f.cost;
    x.min_cost = f.min_cost;
    if (x.npred == 0) make_ready(x);
    return true;
  }

  /// The OpFacts of node x (just pulled, of op oi): op_facts[oi], worked out at the op's first instruction
  /// (into `scratch` without an op).
  const OpFacts& facts_of(int oi, const Body& x, OpFacts& scratch) {
    OpFacts& f = oi >= 0 ? op_facts[static_cast<size_t>(oi)] : scratch;
    if (f.n == x.n) return f;
    const Instr& a = x.in[0];
    const Instr& head = x.in[static_cast<size_t>(x.n - 1)];
    f.n = x.n;
    f.acc = isa::uses_accumulators(head);
    f.rng = isa::uses_rng(head.op);
    f.auto_queue = oi >= 0 && isa::is_dma(a.op) && !k.ops[static_cast<size_t>(oi)].dma_queue;  // (one queue per trigger too: its engine may change)
    f.engines = x.n == 2 ? isa::engine_bit(Engine::kTensor) : candidates(oi, a);
    f.free_uses = sim.engine_uses(a);
    // Durations depend on the op's shapes and dtypes, the same for each of its instructions.
    f.cost.fill(0);
    for (int e = 0; e < isa::kNumEngines; ++e) {
      if (!(f.engines & (1u << e))) continue;
      for (int j = 0; j < x.n; ++j)
        f.cost[static_cast<size_t>(e)] += sim.duration_estimate(x.in[static_cast<size_t>(j)], static_cast<Engine>(e));
    }
    f.min_cost = INT64_MAX;
    for (int e = 0; e < isa::kNumEngines; ++e)
      if (f.engines & (1u << e)) f.min_cost = std::min(f.min_cost, f.cost[static_cast<size_t>(e)]);
    if (f.min_cost == INT64_MAX) f.min_cost = 0;
    return f;
  }

  // Nothing x depends on can issue after this (its predecessors have, its successors wait for it),
  // so the operands' ready times are final: kept for issue_one() and handed to the simulator.
  void make_ready(Node& x) {
    Body& xb = body(x.seq);
    if (free_infos.empty()) {
      free_infos.push_back(static_cast<uint32_t>(infos.size()));
      infos.emplace_back();
    }
    xb.ready_info = free_infos.back();
    free_infos.pop_back();
    ReadyInfo& ri = infos[xb.ready_info];
    std::array<engines::DepTracker::Ready, engines::kNumClasses> rd;
    sim.operands_ready_multi(xb.in[0], x.engines, rd, ri.rg0, xb.ext[0].data());
    if (xb.n == 2) ri.rd1 = sim.operands_ready_tag(xb.in[1], Engine::kTensor, ri.rg1, xb.ext[1].data());
    ri.rg_epoch = sim.regions_epoch();
    Cand& c = ready.emplace_back();
    c.seq = x.seq;
    c.height = x.height;
    c.acc_psum = xb.acc_psum;
    c.engines = x.engines;
    c.free_uses = x.free_uses;
    c.home = x.home;
    c.pair = xb.n == 2;
    c.cost = xb.cost;
    for (int e = 0; e < isa::kNumEngines; ++e)
      if (x.engines & (1u << e)) {
        ri.rd0[static_cast<size_t>(e)] = rd[static_cast<size_t>(e)];
        Ps r = rd[static_cast<size_t>(e)].time;
        if (c.pair) {
          c.pair_front = std::max(r, x.not_before);  // (a pair has one engine, TensorE)
          r = std::max(r, ri.rd1.time);
        }
        c.ready_at[static_cast<size_t>(e)] = std::max(r, x.not_before);
        c.lb = std::min(c.lb, c.pair ? c.pair_front : c.ready_at[static_cast<size_t>(e)]);
      }
  }

  void release_waits() {
    for (auto& v : waiting_for) {
      for (uint64_t w : v)
        if (live(w) && --node(w).npred == 0) make_ready(node(w));
      v.clear();
    }
    n_waiting = 0;
  }

  /// Admissions between two refreshes of the critical-path heights.
  uint64_t height_refresh() const { return std::max<uint64_t>(16, static_cast<uint64_t>(p.schedule_window) / 2); }

  void compute_heights() {
    for (uint64_t s = next; s-- > base;) {
      Node& x = node(s);
      if (done[s & (cap - 1)]) continue;
      Ps h = 0;
      // A successor is in the window (admitted after x, or a with_schedule wait still >= base); an issued
      // one has height 0 (commit), which changes no maximum.
      for (uint64_t q : x.succ)
        if (q >= base) h = std::max(h, node(q).height);
      x.height = h + x.min_cost;
    }
    for (Cand& c : ready) c.height = node(c.seq).height;
    since_heights = 0;
  }

  // The choice of choose(), until commit() issues it.
  bool has_pick = false;
  size_t pick = 0;
  Ps pick_start = 0, pick_front = 0;
  Engine pick_engine = Engine::kVector;

  /// SimOptions::free_pe_helpers or free_folds is on: some instructions take no engine time (Simulator::would_free).
  const bool what_if = sim.options().free_pe_helpers != 0 || !sim.options().free_folds.empty();

  /// PSUM offset of the last matmul TensorE issued whose accumulation group may still be open (-1: none).
  int64_t pe_group = -1;

  /// The MultiplyMoving of node x, or nullptr.
  static const Instr* moving_of(const Body& x) {
    const Instr& m = x.in[static_cast<size_t>(x.n - 1)];
    return m.op == isa::Opcode::kMultiplyMoving ? &m : nullptr;
  }

  /// Node x is a matmul accumulating into the PSUM tile of TensorE's last matmul (its open group).
  bool continues_group(const Cand& x) const { return pe_group >= 0 && x.acc_psum == pe_group; }

  /// Choose the ready instruction that can start first (ties: the open accumulation group, the critical path,
  /// program order).
  void choose() {
    if (what_if) choose_among<true>();
    else choose_among<false>();
  }

  /// choose(); kWhatIf: SimOptions::free_pe_helpers is on (a separate instance: the test stays out of the loop).
  template <bool kWhatIf>
  void choose_among() {
    size_t best = 0;
    Ps best_start = INT64_MAX, best_height = -1;
    Ps front = INT64_MAX;  // the earliest any ready instruction could still start, on any of its engines
    uint64_t best_seq = UINT64_MAX;
    bool best_cont = false;
    Engine best_engine = Engine::kVector;
    for (size_t i = 0; i < ready.size(); ++i) {
      const Cand& x = ready[i];
      // It starts after the best so far (s_x >= lb > best_start: not better, and no tie) and bounds the front
      // no lower (what it would bound it by is >= lb > best_start >= front): as if scanned.
      if (x.lb > best_start) continue;
      Ps s_x = INT64_MAX, f_x = INT64_MAX;
      Engine e_x = x.home;
      if (kWhatIf && sim.would_free(body(x.seq).in[0])) {
        // nsim analyze's what-if runs: an instruction taking no engine time starts when its operands are ready.
        for (int e = 0; e < isa::kNumEngines; ++e) {
          if (!(x.engines & (1u << e))) continue;
          const Ps s = x.ready_at[static_cast<size_t>(e)];
          front = std::min(front, x.pair ? x.pair_front : s);
          if (s < s_x || (s == s_x && static_cast<Engine>(e) == x.home)) s_x = f_x = s, e_x = static_cast<Engine>(e);
        }
      } else
      for (uint32_t bits = x.engines; bits; bits &= bits - 1) {  // (most instructions have one engine)
        const int e = __builtin_ctz(bits);
        const auto ee = static_cast<Engine>(e);
        // (On TensorE a matmul's PE tile's, from its instruction.)
        const Ps free = ee == Engine::kTensor ? sim.engine_free(body(x.seq).in[0], x.free_uses, ee)
                                              : sim.engine_free(x.free_uses, ee);
        const Ps s = std::max(x.ready_at[static_cast<size_t>(e)], free);
        const Ps f = s + x.cost[static_cast<size_t>(e)];
        // A pair's LoadStationary may start before its matmul's operands are ready: bound by its own.
        front = std::min(front, x.pair ? std::max(x.pair_front, free) : s);
        if (f < f_x || (f == f_x && ee == x.home)) {
          f_x = f;
          s_x = s;
          e_x = ee;
        }
      }
      // Ties on the start time between TensorE instructions go to the matmul that continues TensorE's open
      // PSUM accumulation group; other ties to the longer critical path, then to program order
      // (docs/timing-model.md "List scheduling"). By critical path alone the matmuls of two accumulation
      // groups interleave whenever the later group has the longer path left: both PSUM tiles fill at once
      // and each group's eviction waits for the other's matmuls.
      const bool cont = continues_group(x);
      bool better = s_x < best_start;
      if (s_x == best_start) {
        if (e_x == Engine::kTensor && best_engine == Engine::kTensor && cont != best_cont)
          better = cont;
        else
          better = x.height > best_height || (x.height == best_height && x.seq < best_seq);
      }
      if (better) {
        best_cont = cont;
        best = i;
        best_start = s_x;
        best_height = x.height;
        best_seq = x.seq;
        best_engine = e_x;
      }
    }
    pick = best;
    pick_start = best_start;
    pick_front = front;
    pick_engine = best_engine;
    has_pick = true;
  }

  /// Issue the chosen instruction; `not_before`: an extra earliest start (an LNC=2 rendezvous).
  InstrTiming commit(Ps extra_not_before = 0) {
    has_pick = false;
    const size_t best = pick;
    const Ps front = pick_front;
    const Engine best_engine = pick_engine;
    const uint64_t seq = ready[best].seq;
    ready[best] = ready.back();
    ready.pop_back();
    // No ready instruction starts before `front`; the others in the window start no earlier than a
    // ready one they are ordered after (every edge also orders starts, below); new ones enter at the
    // front: a valid watermark.
    floor = std::max(floor, front);
    sim.set_start_floor(floor);
    Node& x = node(seq);
    Body& xb = body(seq);
    const ReadyInfo& ri = infos[xb.ready_info];
    free_infos.push_back(xb.ready_info);  // (read below, before another node takes it)
    if (seq != base) ++st.reordered;
    const isa::Engine default_engine = xb.in[0].engine;
    Ps end = 0, start = INT64_MAX;
    x.not_before = std::max(x.not_before, extra_not_before);
    InstrTiming first{};
    for (int j = 0; j < xb.n; ++j) {
      Instr& in = xb.in[static_cast<size_t>(j)];
      in.engine = best_engine;
      if (xb.auto_queue) {  // the trigger engine's queue that frees up first
        const std::vector<int>& qs = trigger_queues[static_cast<size_t>(best_engine)];
        int q_best = qs[0];
        for (size_t q = 1; q < qs.size(); ++q) {
          const int id = qs[q];
          if (sim.dma_queue_free(id) < sim.dma_queue_free(q_best)) q_best = id;
        }
        in.dma_queue = static_cast<uint8_t>(q_best);
      }
      engines::SlotTags tags;
      if (sim.checking()) {
        low.slot_tags(xb.op, xb.uses, in, tags);
        sim.set_slot_tags(&tags);
      }
      const engines::DepTracker::Regions* rg =
          ri.rg_epoch != sim.regions_epoch() ? nullptr : j == 0 ? &ri.rg0 : &ri.rg1;
      const InstrTiming t = sim.submit(in, x.not_before, j == 0 ? &ri.rd0[static_cast<size_t>(best_engine)] : &ri.rd1, rg);
      if (j == 0) first = t;
      end = std::max(end, t.end);
      start = std::min(start, t.start);
    }
    if (const Instr* m = moving_of(xb)) pe_group = m->opnd[0].offset;
    if (low.recording_occupancy()) low.note_tile_uses(xb.uses, start, end);
    if (best_engine != default_engine && several(x.engines)) ++st.placed;
    st.instructions += static_cast<uint64_t>(xb.n);
    done[seq & (cap - 1)] = 1;
    if (xb.op >= 0 && last_of_op[static_cast<size_t>(xb.op)] == x.seq + 1) end_of_op[static_cast<size_t>(xb.op)] = end;
    x.height = 0;  // compute_heights() reads issued successors as 0
    for (uint64_t q : xb.tsucc)
      if (live(q)) node(q).not_before = std::max(node(q).not_before, end);
    for (uint64_t q : x.succ) {  // an instruction ordered after x starts no earlier than x
      if (!live(q)) continue;
      Node& y = node(q);
      y.not_before = std::max(y.not_before, start);
      if (--y.npred == 0) make_ready(y);
    }
    while (base < next && done[base & (cap - 1)]) ++base;
    return first;
  }

  /// Fill the window and choose the next instruction (kept until commit()); false when done.
  bool prepare() {
    if (has_pick) return true;
    const uint64_t window = static_cast<uint64_t>(p.schedule_window);
    const uint64_t refresh = height_refresh();
    {
      while (next - base < window && admit())
        if (++since_heights >= refresh) compute_heights();
      if (ready.empty() && n_waiting) release_waits();  // a with_schedule target never came in reach
      if (ready.empty()) {
        if (base == next) return false;  // window drained and nothing left to lower
        // Edges only point forward in program order, but for with_schedule waits: a cycle is theirs.
        const Body& x = body(base);
        const SourceLoc where = x.op >= 0 ? k.ops[static_cast<size_t>(x.op)].loc : SourceLoc{};
        throw Error(ErrorCode::kScheduleCycle,
                    fmt::format("with_schedule: the edges make a cycle with the kernel's data dependencies at '{}' "
                                "({}): it cannot run after the instruction it waits for, which needs its result or "
                                "its storage first",
                                x.op >= 0 ? k.ops[static_cast<size_t>(x.op)].label : std::string("?"), where.str()),
                    where);
      }
      choose();
    }
    return true;
  }

  void run() {
    while (prepare()) commit();
  }
};

std::vector<std::vector<int>> schedule_edges(const Kernel& k) {
  std::vector<std::vector<int>> runs_after(k.ops.size());
  const bool op_edges = std::any_of(k.ops.begin(), k.ops.end(), [](const Op& o) { return !o.after.empty(); });
  if (!k.schedule.empty() || op_edges) {
    std::unordered_map<std::string, std::vector<int>> by_label;
    for (size_t i = 0; i < k.ops.size(); ++i)
      if (!k.ops[i].label.empty()) by_label[k.ops[i].label].push_back(static_cast<int>(i));
    for (size_t ai = 0; ai < k.ops.size(); ++ai)  // an op's own "after" labels: edges of that op alone
      for (const std::string& b : k.ops[ai].after) {
        auto bb = by_label.find(b);
        if (bb == by_label.end())
          throw Error(ErrorCode::kUnknownName,
                      fmt::format("{}: \"after\": no instruction is labelled '{}'", k.ops[ai].name, b), k.ops[ai].loc);
        for (int bi : bb->second) runs_after[ai].push_back(bi);
      }
    for (const ScheduleEdge& e : k.schedule) {
      auto a = by_label.find(e.after);
      if (a == by_label.end())
        throw Error(ErrorCode::kUnknownName, fmt::format("with_schedule: no instruction is named '{}'", e.after));
      for (const std::string& b : e.before) {
        auto bb = by_label.find(b);
        if (bb == by_label.end())
          throw Error(ErrorCode::kUnknownName, fmt::format("with_schedule: no instruction is named '{}'", b));
        for (int ai : a->second)
          for (int bi : bb->second) runs_after[static_cast<size_t>(ai)].push_back(bi);
      }
    }
  }
  return runs_after;
}

Scheduler::Scheduler(const Kernel& k, Lowering& low, Simulator& sim) : impl_(new Impl(k, low, sim, stats_)) {
  // A chunk read in every iteration cycles through its reader list every kReaders reads, adding edges at
  // the end of each cycle, and the critical-path heights are refreshed every height_refresh() admissions
  // (ties between equal starts go by them): fast-forward keeps both phases by skipping whole cycles.
  low.set_fast_forward_align(Chunk::kReaders, static_cast<int>(impl_->height_refresh()), &impl_->next);
  low.set_fast_forward_hbm_chunks(
      {[impl = impl_](int64_t addr) { return impl->hbm_chunk_of(addr); },
       [impl = impl_](const std::vector<std::pair<int64_t, int64_t>>& moves, bool apply) {
         return impl->move_hbm_states(moves, apply);
       }});
  low.set_fast_forward_schedule_digest([impl = impl_] { return impl->ff_schedule_digest(); });
}
Scheduler::~Scheduler() {
  impl_->low.set_fast_forward_align(1, 1, nullptr);  // (they point into this scheduler)
  impl_->low.set_fast_forward_hbm_chunks({});
  impl_->low.set_fast_forward_schedule_digest({});
  delete impl_;
}
void Scheduler::run() { impl_->run(); }
bool Scheduler::prepare() { return impl_->prepare(); }
sim::Ps Scheduler::next_start() const { return impl_->pick_start; }
const isa::Instr& Scheduler::next_instr() const { return impl_->body(impl_->ready[impl_->pick].seq).in[0]; }
int Scheduler::next_op() const { return impl_->body(impl_->ready[impl_->pick].seq).op; }
InstrTiming Scheduler::commit(sim::Ps not_before) { return impl_->commit(not_before); }

}  // namespace nsim::frontend
