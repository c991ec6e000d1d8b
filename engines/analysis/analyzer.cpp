#include "engines/analysis/analyzer.h"

#include "engines/analysis/pe_results.h"
#include "engines/bounds.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <cmath>
#include <map>
#include <memory>
#include <unordered_map>

#include "sim/json_out.h"

namespace nsim::engines {

using isa::AluOp;
using isa::Engine;
using isa::Instr;
using isa::Opcode;
using isa::Operand;
using isa::Space;
using sim::Ps;

namespace {

constexpr int kQueueTrack0 = isa::kNumEngines;  // record tracks: engines, then DMA queues

/// One step of the fingerprints' hash (a multiply-xor over 64-bit words: equal inputs give equal values, and
/// unequal ones collide with probability ~2^-64 for the structured words hashed here).
uint64_t mix(uint64_t h, uint64_t v) {
  h = (h ^ v) * 0x9e3779b97f4a7c15ULL;
  return h ^ (h >> 29);
}

/// The access pattern of `o` without its address (dtype, partitions, free sizes and strides).
uint64_t pattern_hash(const Operand& o) {
  uint64_t h = mix((static_cast<uint64_t>(o.space) << 56) | (static_cast<uint64_t>(o.dtype) << 48) |
                       (static_cast<uint64_t>(o.nfree) << 40) | o.num_partitions,
                   static_cast<uint64_t>(o.partition_step));
  for (int d = 0; d < o.nfree; ++d)
    h = mix(h, static_cast<uint64_t>(o.size[static_cast<size_t>(d)]) * 0x100000001b3ULL ^
                   static_cast<uint64_t>(o.stride[static_cast<size_t>(d)]));
  return h;
}

/// What an instruction computes, apart from its operands' values and addresses: its op, function, ALU ops,
/// flags and immediates (the operands' patterns are added by the caller, which has them).
uint64_t op_hash(const Instr& in) {
  uint64_t h = mix((static_cast<uint64_t>(in.op) << 48) | (static_cast<uint64_t>(in.act) << 40) |
                       (static_cast<uint64_t>(in.alu0) << 32) | (static_cast<uint64_t>(in.alu1) << 24) |
                       (static_cast<uint64_t>(in.reduce_cmd) << 16) | in.flags,
                   in.axis_count);
  h = mix(h, (static_cast<uint64_t>(std::bit_cast<uint32_t>(in.imm[0])) << 32) | std::bit_cast<uint32_t>(in.imm[1]));
  h = mix(h, (static_cast<uint64_t>(std::bit_cast<uint32_t>(in.imm[2])) << 32) | std::bit_cast<uint32_t>(in.imm[3]));
  for (size_t i = 0; i < in.iimm.size(); i += 2)
    h = mix(h, (static_cast<uint64_t>(static_cast<uint32_t>(in.iimm[i])) << 32) | static_cast<uint32_t>(in.iimm[i + 1]));
  if (in.op == Opcode::kNcStreamShuffle)
    for (size_t i = 0; i < in.shuffle.size(); i += 8) {
      uint64_t w;
      std::memcpy(&w, in.shuffle.data() + i, 8);
      h = mix(h, w);
    }
  return h;
}

/// The values held on chip, by the regions instructions wrote: each region's value fingerprint (a hash of how it
/// was computed from which values). A read inside one region gets a fingerprint derived from the region's and its
/// place in it; any other read is unknown. A write replaces the regions it overlaps.
class ValueMap {
 public:
  using Extent = std::pair<int64_t, int64_t>;
  /// `o` read (`ext`: its byte_extent, `pattern`: its pattern_hash).
  std::optional<uint64_t> read(const Operand& o, Extent ext, uint64_t pattern) const {
    const auto [lo, hi] = ext;
    const int32_t p0 = o.start_partition, p1 = p0 + static_cast<int32_t>(std::max<uint32_t>(o.num_partitions, 1));
    for (auto it = m_.lower_bound({lo - max_len_, INT32_MIN}); it != m_.end() && it->first.first <= lo; ++it) {
      const Val& v = it->second;
      if (hi <= v.hi && it->first.second <= p0 && p1 <= v.p1)
        return mix(mix(v.fp, static_cast<uint64_t>(lo - it->first.first) << 20 ^ static_cast<uint64_t>(p0 - it->first.second)),
                   pattern);
    }
    return std::nullopt;
  }
  void write(const Operand& o, Extent ext, std::optional<uint64_t> fp) {
    const auto [lo, hi] = ext;
    const int32_t p0 = o.start_partition, p1 = p0 + static_cast<int32_t>(std::max<uint32_t>(o.num_partitions, 1));
    // The common case: a region written again whole (a tile of a loop body, its buffers rotating). Held, it is the
    // only region meeting its bytes: its write erased the others, and a later write meeting it would have erased it.
    const auto same = m_.find({lo, p0});
    if (same != m_.end() && same->second.hi == hi && same->second.p1 == p1) {
      if (fp) same->second.fp = *fp;
      else m_.erase(same);
      return;
    }
    for (auto it = m_.lower_bound({lo - max_len_, INT32_MIN}); it != m_.end() && it->first.first < hi;) {
      const Val& v = it->second;
      if (v.hi > lo && it->first.second < p1 && p0 < v.p1) it = m_.erase(it);
      else ++it;
    }
    if (!fp) return;
    m_[{lo, p0}] = Val{hi, p1, *fp};
    max_len_ = std::max(max_len_, hi - lo);
  }

 private:
  struct Val {
    int64_t hi;
    int32_t p1;
    uint64_t fp;
  };
  std::map<std::pair<int64_t, int32_t>, Val> m_;  ///< (first byte, first partition) -> the region's value
  int64_t max_len_ = 0;
};
constexpr double kPsPerNs = 1000.0;

double ns(Ps t) { return sim::ps_to_ns(t); }

std::string track_name(const engines::CoreParams& p, int track) {
  if (track < kQueueTrack0) return std::string(isa::engine_name(static_cast<Engine>(track)));
  return engines::queue_name(p, track - kQueueTrack0);
}

/// Per source line: what the findings need.
struct LineAgg {
  // DMA
  uint64_t dma_count = 0, dma_small = 0;
  double dma_bytes = 0, dma_small_bytes = 0;
  Ps dma_engine_time = 0, dma_small_engine_time = 0;  ///< summed piece durations
  double dma_engines_used = 0;                        ///< summed DMA engines (pieces with bytes) per transfer
  double dma_small_ideal_ps = 0;                      ///< the small transfers' bytes at full engine bandwidth
  Ps dma_queue_time = 0;                              ///< summed trigger-to-completion times of its transfers
  Ps dma_small_queue_time = 0;                        ///< the same, of the small transfers
  double dma_small_partitions = 0;                    ///< summed on-chip partitions of the small transfers
  int64_t dma_min_bpp = INT64_MAX;
  uint64_t dma_strided = 0;     ///< small transfers by their contiguous runs (enough bytes per partition)
  /// Small transfers by their partitions (enough bytes per partition and long runs): a quarter of the DMA engines
  /// or fewer move them (engine e serves partitions [8e, 8e + 8)), as rows loaded one DMA at a time.
  uint64_t dma_narrow = 0;
  int64_t dma_max_narrow_parts = 0;
  uint64_t dma_narrow_engines = 0;  ///< DMA engines the narrow transfers moved bytes on (bit per engine)
  Ps dma_narrow_engine_time = 0;    ///< their summed piece durations
  uint64_t dma_queues_mask = 0;  ///< bit q % 64: its transfers used DMA queue q
  double dma_min_run = 1e300;   ///< the smallest average contiguous run (bytes per descriptor) of those
  double hbm_read = 0, hbm_reload = 0;
  double hbm_roundtrip = 0;  ///< HBM bytes read back that this kernel wrote earlier (a spill)
  int max_loads = 0;
  uint64_t reuse_waits = 0;  ///< loads into the buffer of this line's previous load that waited for compute
  Ps reuse_wait = 0;         ///< how long they waited for it
  isa::Operand last_load;    ///< the on-chip destination of this line's previous load
  uint64_t psum_reuse_waits = 0;  ///< matmuls opening a group in the PSUM tile of this line's previous group that
                                  ///< waited for its evacuation
  Ps psum_reuse_wait = 0;         ///< how long they waited for it
  uint64_t out_reuse_waits = 0;   ///< compute instructions writing the very SBUF tile of this line's previous one that
                                  ///< waited for a store still reading it out
  Ps out_reuse_wait = 0;          ///< how long they waited for it
  isa::Operand last_out;          ///< the SBUF destination of this line's previous compute instruction
  isa::Operand last_psum;         ///< the PSUM destination of this line's previous group-opening matmul
  /// The line's groups open in more than one PSUM tile (its tile rotates over buffers, or the tracer made one per
  /// iteration): a wait for the same tile then came from the list scheduler's order, and the finding's advice
  /// (allocate the tile in the loop) does not apply to the line.
  bool psum_rotates = false;
  /// ScalarE busy time of plain arithmetic and copies (no activation function: tensor_scalar, tensor_copy, an
  /// activation with `copy`): work another engine could do or the producing activation could fold in.
  Ps scalar_plain = 0;
  /// Passes an activation could do itself (PeResults::foldable_pass): made on this line, and of those, read by a
  /// plain activation and by nothing else (folded), their busy time and engines.
  uint64_t fold_passes = 0, folded = 0;
  bool fold_spoiled = false;  ///< a pass's output was read by something else: the line is not reported, not followed
  Ps folded_busy = 0;
  std::array<Ps, isa::kNumEngines> folded_by_engine{};
  uint64_t recomputed = 0;   ///< instructions computing again what the line's previous one computed, from the same values
  Ps recomputed_busy = 0;
  std::array<Ps, isa::kNumEngines> recomputed_by_engine{};
  std::optional<uint64_t> last_value;  ///< the fingerprint of the line's previous instruction's result
  uint64_t table_loads = 0;  ///< ScalarE activation table loads its activations began with (InstrTiming::table_load)
  Ps table_load_time = 0;
  uint32_t table_sets = 0;   ///< bit k: a load of table set k (scalar.act_table_sets)
  // TensorE
  uint64_t mm_count = 0, underfill = 0, fp32 = 0, transposes = 0, broadcasts = 0;
  uint64_t onchip_transposes = 0;  ///< PE transposes of tiles computed on chip (not counted in `transposes`)
  uint64_t narrow = 0;  ///< under-filled matmuls whose moving free size is below tensor.mm_min_ii_cycles
  Ps underfill_busy = 0, fp32_busy = 0, transpose_busy = 0, broadcast_busy = 0;
  // a sum over the output of an activation, in a separate pass (activation could accumulate it)
  uint64_t split_reduces = 0;
  Ps split_reduce_busy = 0;
  /// tensor_tensor adds of a PSUM tile into an SBUF accumulator in place (matmul partial products summed on a
  /// compute engine), the accumulators they started (a new one when the line's accumulator changes), their busy
  /// time per engine, and the last accumulator
  uint64_t psum_adds = 0, psum_add_groups = 0;
  std::array<Ps, isa::kNumEngines> psum_add_busy{};
  Operand psum_acc;
  uint64_t evictions = 0;  ///< copies of a PE transpose's PSUM result (to SBUF)
  Ps eviction_busy = 0;
  uint64_t broadcast_copies = 0;  ///< copies of a partition broadcast's PSUM result (to SBUF)
  Ps broadcast_copy_busy = 0;
  double underfill_lost_ps = 0, fp32_lost_ps = 0;
  int64_t min_k = INT64_MAX, min_m = INT64_MAX, min_n = INT64_MAX;
  // every engine
  std::array<Ps, isa::kNumEngines> busy{};
  Ps trigger_busy = 0;  ///< of busy: DMA triggers (on the engine the line's dma_copy runs on)
  std::array<uint64_t, isa::kNumEngines> count{};
  std::array<Ps, isa::kNumEngines> waited_by{};  ///< how long each engine waited for this line's results
  Ps critical = 0;  ///< time of this line's instructions on the critical path
  /// Its busy time on every engine, in ns.
  double busy_ns() const {
    double t = 0;
    for (Ps b : busy) t += ns(b);
    return t;
  }
};

bool same_view(const Operand& a, const Operand& b) { return PeResults::same_view(a, b); }

/// One instruction, for the critical-path walk.
struct Rec {
  Ps start, end;
  int64_t pred;  ///< the instruction that bound its start (-1: none)
  uint32_t loc;
  uint16_t track;
};

/// The critical-path records of every instruction, 20 bytes each (issue 12: `nsim analyze` of a
/// 10 M-instruction kernel within 300 MB), in blocks of 64 Ki records so growing never copies (a
/// doubling vector of 32-byte records peaked at 512 MB at 10 M instructions). A duration of 2^32 ps
/// (4.3 ms) or more goes to a side table.
class RecStore {
 public:
  size_t size() const { return n_; }
  bool empty() const { return n_ == 0; }
  /// Stores `r` as record size(); false (nothing stored) when its fields do not fit the packed form.
  bool push(const Rec& r) {
    if (r.loc >= (1u << 24) || r.track >= 256 || r.pred >= static_cast<int64_t>(UINT32_MAX) - 1 ||
        n_ >= static_cast<size_t>(UINT32_MAX) - 1)
      return false;
    if (n_ % kBlock == 0) blocks_.push_back(std::make_unique_for_overwrite<Packed[]>(kBlock));  // (each record is written before it is read)
    Packed& p = blocks_.back()[n_ % kBlock];
    const Ps dur = r.end - r.start;
    p.start = r.start;
    p.dur = dur >= 0 && dur < kLongDur ? static_cast<uint32_t>(dur) : kLongDur;
    if (p.dur == kLongDur) long_durs_[n_] = dur;
    p.pred1 = static_cast<uint32_t>(r.pred + 1);
    p.loc_track = r.loc << 8 | r.track;
    ++n_;
    return true;
  }
  /// Record i's source line and track (operator[]'s loc and track, without its times).
  std::pair<uint32_t, int> loc_track(size_t i) const {
    const uint32_t lt = blocks_[i / kBlock][i % kBlock].loc_track;
    return {lt >> 8, static_cast<int>(lt & 0xff)};
  }
  Rec operator[](size_t i) const {
    const Packed& p = blocks_[i / kBlock][i % kBlock];
    const Ps dur = p.dur == kLongDur ? long_durs_.at(i) : static_cast<Ps>(p.dur);
    return {p.start, p.start + dur, static_cast<int64_t>(p.pred1) - 1, p.loc_track >> 8,
            static_cast<uint16_t>(p.loc_track & 0xff)};
  }

 private:
#pragma pack(push, 4)
  struct Packed {
    Ps start;
    uint32_t dur;        ///< end - start, or kLongDur (see long_durs_)
    uint32_t pred1;      ///< pred + 1 (0: none)
    uint32_t loc_track;  ///< loc << 8 | track
  };
#pragma pack(pop)
  static_assert(sizeof(Packed) == 20);
  static constexpr size_t kBlock = size_t{1} << 16;
  static constexpr uint32_t kLongDur = UINT32_MAX;
  std::vector<std::unique_ptr<Packed[]>> blocks_;
  std::unordered_map<size_t, Ps> long_durs_;
  size_t n_ = 0;
};

}  // namespace

struct Analyzer::State {
  Simulator* sim = nullptr;
  const CoreParams* p = nullptr;
  int64_t dma_eff_bpp = 2048, mm_eff_n = 512, chunk = 64, max_records = 0;
  double transpose_share = 10, min_saving = 1, tensor_full_percent = 90;

  uint64_t n = 0;
  std::vector<LineAgg> lines;  ///< by source id
  RecStore recs;
  bool recs_complete = true;
  std::array<int64_t, isa::kNumEngines> last_on_engine{-1, -1, -1, -1, -1};
  std::array<Ps, isa::kNumEngines> cursor{}, busy_union{};  ///< per engine: end of the last issue interval, union of them
  // idle attribution: waiter engine -> producer track -> ps; (waiter, producer line) -> ps
  std::array<std::vector<Ps>, isa::kNumEngines> waited_on;  ///< [waiter engine][producer track]
  std::array<Ps, isa::kNumEngines> wait{}, other_wait{};
  /// VectorE's busy time in instructions at 1x on SBUF operands one of which is fp32 (16-bit operands would enable
  /// its 2x/4x modes for tensor_scalar, tensor_copy and tensor_tensor add / subtract / multiply)
  Ps vector_fp32_busy = 0;
  // HBM loads, per `chunk` bytes of HBM: how many transfers loaded the chunk since it was last written,
  // which of its bytes they loaded (bit i: bytes [i*g, (i+1)*g), g = ceil(chunk / 64)), and the last
  // transfer that touched it. A transfer's reloads are the bytes an *earlier* transfer loaded: two
  // transfers loading the two halves of a chunk, or one transfer reading a chunk in several runs (a
  // 1-D tensor read as one-element rows, a partition broadcast), reload nothing.
  std::vector<uint8_t> loads;
  std::vector<uint64_t> loaded_bits;
  std::vector<uint32_t> stamp;
  std::vector<uint8_t> written;  ///< per chunk: this kernel wrote it (reading it back is a round trip)
  /// Whether the latest writes of every byte of `o` were DMAs (a tile loaded as stored), as the simulator's
  /// dependency tracker saw them: a PE transpose of a loaded tile could have been a transposed load; one of a tile
  /// computed on chip (the probabilities of attention) could not.
  bool loaded_from_hbm(const Operand& o) const {
    return o.space == Space::kSbuf && event->src_writers == (1u << kClassDma);
  }
  const InstrEvent* event = nullptr;  ///< the instruction on_instr() is taking in
  uint32_t transfer = 0;
  // The chunks in blocks of kBlock (256): uni[b] set means every chunk of block b holds the loads, loaded_bits
  // and written of its first chunk (the others' entries are stale), so a transfer covering whole blocks
  // costs one update per block instead of one per chunk (a 128 KiB load is 2,048 chunks of 64 B, 8
  // blocks). A block is spelled out chunk by chunk (spell) before any access to part of it. Stamps are
  // left as they are: a stale one names an earlier transfer, never the one reading the chunk.
  static constexpr int kBlockShift = 8;
  static constexpr size_t kBlock = size_t{1} << kBlockShift;
  std::vector<uint8_t> uni;
  void spell(size_t b) {
    if (!uni[b]) return;
    uni[b] = 0;
    const size_t f = b << kBlockShift;
    std::fill_n(loads.begin() + static_cast<std::ptrdiff_t>(f + 1), kBlock - 1, loads[f]);
    std::fill_n(loaded_bits.begin() + static_cast<std::ptrdiff_t>(f + 1), kBlock - 1, loaded_bits[f]);
    std::fill_n(written.begin() + static_cast<std::ptrdiff_t>(f + 1), kBlock - 1, written[f]);
  }
  // The outputs of the latest PE transposes and partition broadcasts, and of the latest activations without an
  // accumulated reduction (PeResults).
  PeResults pe;
  /// The outputs of the latest passes an activation could fold (track_folds): who reads each.
  struct FoldOut {
    Operand out;
    std::pair<int64_t, int64_t> ext;
    uint32_t line = 0;
    Ps busy = 0;
    size_t engine = 0;
    bool consumed = false;  ///< read by a plain activation as its data (read by anything else: forgotten)
  };
  std::array<FoldOut, 8> fold_out{};
  uint8_t fold_live = 0;  ///< bit i: fold_out[i] holds an output
  size_t fold_next = 0;
  void track_folds(const Instr& in, const InstrTiming& t, uint32_t loc);
  std::vector<uint64_t> store_bits;  ///< bit i: instruction i is a DMA store (an on-chip source, HBM destination)
  // Values (recomputed_value): SBUF and PSUM regions' fingerprints, HBM writes per 64 KiB block, TensorE's weights.
  std::array<ValueMap, 2> values;
  std::unordered_map<int64_t, uint64_t> hbm_writes;
  std::optional<uint64_t> pe_weights;
  void track_values(const Instr& in, const InstrTiming& t, LineAgg& la);
  uint32_t act_sets_used = 0;  ///< bit k: some activation used function table set k (scalar.act_table_sets)
  uint64_t act_table_loads = 0;
  std::vector<std::string> act_set_names;  ///< scalar.act_table_sets, by set
  std::vector<std::pair<size_t, uint64_t>> pending;  ///< this transfer's bits, committed at its end
  double hbm_read = 0, hbm_reload = 0, hbm_write = 0;
  // stationary of the next matmuls
  int64_t stat_k = 0, stat_m = 0;
  bool stat_fp32 = false;

  // Several source ids may name the same kernel line (one per op): findings are per line.
  std::vector<uint32_t> canon_ids;  ///< source id -> first source id with the same location, + 1
  std::map<std::string, uint32_t> by_loc;
  uint32_t canon(uint32_t id) {
    if (id >= canon_ids.size()) canon_ids.resize(id + 1, 0);
    if (!canon_ids[id]) {
      const SourceLoc& l = sim->source(id);
      canon_ids[id] = by_loc.emplace(fmt::format("{}:{}:{}", l.file, l.line, l.function), id).first->second + 1;
    }
    return canon_ids[id] - 1;
  }
  LineAgg& line(uint32_t loc) {
    if (loc >= lines.size()) lines.resize(loc + 1);
    return lines[loc];
  }
  void on_instr(const InstrEvent& ev);
  void on_dma(const Instr& in, const InstrTiming& t, LineAgg& la);
  void on_tensor(const Instr& in, const InstrTiming& t, LineAgg& la);
  void on_elementwise(const Instr& in, const InstrTiming& t, LineAgg& la);
  /// A compute instruction writing the very SBUF tile of its line's previous one that waited for a store reading it.
  void out_wait(const Instr& in, const InstrTiming& t, LineAgg& la);
  bool is_store(int64_t i) const {
    return i >= 0 && static_cast<uint64_t>(i) / 64 < store_bits.size() &&
           (store_bits[static_cast<size_t>(i) / 64] >> (static_cast<uint64_t>(i) % 64) & 1u);
  }
  void forget_overwritten(const Instr& in);
  void count_hbm(const Operand& o, bool write, LineAgg& la);
  /// The source line (0: unknown) and track of the producer `t` waited for.
  std::pair<uint32_t, int> producer(const InstrTiming& t) const;
};

Analyzer::Analyzer(Simulator& sim) : s_(std::make_shared<State>()) {
  State& s = *s_;
  s.sim = &sim;
  s.p = &sim.params();
  const sim::Config& c = sim.config();
  s.dma_eff_bpp = c.bytes("analysis.dma_efficient_bytes_per_partition");
  s.mm_eff_n = c.get_int("analysis.mm_efficient_moving_free");
  s.chunk = std::max<int64_t>(1, c.bytes("analysis.reload_chunk_bytes"));
  s.transpose_share = c.get_real("analysis.transpose_share_percent");
  s.min_saving = c.get_real("analysis.min_saving_percent");
  s.tensor_full_percent = c.get_real("analysis.tensor_full_percent");
  s.max_records = std::max<int64_t>(0, c.get_int("analysis.max_recorded_instructions"));
  s.act_set_names = c.get_list("scalar.act_table_sets");
  std::shared_ptr<State> keep = s_;
  // (On a host thread of its own when there is one: it reads only the events and its own state.)
  sim.add_event_listener([keep](const InstrEvent& ev) { keep->on_instr(ev); });
}

std::pair<uint32_t, int> Analyzer::State::producer(const InstrTiming& t) const {
  if (t.waited_for >= 0 && static_cast<uint64_t>(t.waited_for) < recs.size())
    return recs.loc_track(static_cast<size_t>(t.waited_for));
  return {0, t.waited_class == kClassDma ? kQueueTrack0 : t.waited_class};  // beyond the records: the class only
}

void Analyzer::State::on_instr(const InstrEvent& ev) {
  const Instr& in = ev.in;
  const InstrTiming& t = ev.t;
  event = &ev;
  ++n;
  const auto e = static_cast<size_t>(in.engine);
  const uint32_t loc = canon(in.loc);
  LineAgg& la = line(loc);
  const Ps busy = t.issue - t.start;
  la.busy[e] += busy;
  if (isa::is_dma(in.op)) la.trigger_busy += busy;
  ++la.count[e];

  // Idle attribution along the engine's timeline: `cursor` is when its issue slots were last busy.
  // A gap before this instruction's start is a semaphore wait (on the producer) up to the time its
  // operands were ready, and time blocked by something else after that (a pipe, a shared port,
  // throttling). TensorE's LoadStationary pipe may issue under a matmul: only the part of an issue
  // interval after the cursor counts as busy, so busy + waits + blocked + tail = total exactly.
  Ps& cur = cursor[e];
  if (t.start > cur) {
    const Ps data_wait = std::max<Ps>(0, std::min(t.ready, t.start) - cur);
    if (data_wait > 0 && t.waited_for >= 0) {
      wait[e] += data_wait;
      const auto [pl, ptrack] = producer(t);
      const auto track = static_cast<size_t>(ptrack);
      if (track >= waited_on[e].size()) waited_on[e].resize(track + 1, 0);
      waited_on[e][track] += data_wait;
      // The producer's line was seen before (no resize here: `la` stays valid).
      if (pl < lines.size()) lines[pl].waited_by[e] += data_wait;
      other_wait[e] += t.start - cur - data_wait;
    } else {
      other_wait[e] += t.start - cur;
    }
  }
  busy_union[e] += std::max<Ps>(0, t.issue - std::max(t.start, cur));
  cur = std::max(cur, t.issue);

  track_values(in, t, la);
  track_folds(in, t, loc);
  if (isa::is_dma(in.op)) {
    if (in.slot(0).space == Space::kHbm && in.slot(1).space != Space::kHbm) {
      if (store_bits.size() <= t.index / 64) store_bits.resize(t.index / 64 + 1, 0);
      store_bits[t.index / 64] |= uint64_t{1} << (t.index % 64);
    }
    on_dma(in, t, la);
    forget_overwritten(in);
  } else {
    out_wait(in, t, la);
    if (in.engine == Engine::kTensor) on_tensor(in, t, la);
    else on_elementwise(in, t, la);
  }

  // Critical-path record: what bound the start, the operands or the engine's previous instruction.
  const int64_t prev = last_on_engine[e];
  last_on_engine[e] = static_cast<int64_t>(t.index);
  if (recs_complete && static_cast<int64_t>(recs.size()) < max_records && recs.size() == t.index) {
    const bool data_bound = t.waited_for >= 0 && t.ready > t.free;
    const int track = isa::is_dma(in.op) ? kQueueTrack0 + in.dma_queue : static_cast<int>(e);
    if (!recs.push({t.start, t.end, data_bound ? t.waited_for : prev, loc, static_cast<uint16_t>(track)}))
      recs_complete = false;
  } else {
    recs_complete = false;
  }
}

namespace {
// The whole chunks [0, n) of one read, each touched once by its transfer (every mask bit `full`, g bytes
// per bit, `chunk` bytes each): how many the kernel wrote, how many bytes were loaded before (a chunk
// with every bit loaded counts whole, one with some bits min(chunk, bits * g), as for a partial chunk);
// then every bit is marked loaded and each chunk's load count goes up by one (saturating). In passes
// the compiler vectorises (a partly loaded chunk, rare, costs a scalar pass).
struct WholeChunks {
  int64_t written = 0, reload = 0;
  int max_loads = 0;
};
__attribute__((target_clones("avx2", "default"))) WholeChunks read_whole(const uint8_t* written, uint64_t* bits,
                                                                       uint8_t* loads, size_t n, uint64_t full,
                                                                       int64_t chunk, int64_t g) {
  WholeChunks r;
  int64_t w = 0, nf = 0;
  uint64_t part = 0;
  for (size_t i = 0; i < n; ++i) w += written[i] != 0;
  for (size_t i = 0; i < n; ++i) {
    const uint64_t a = bits[i] & full;
    nf += a == full;
    part |= static_cast<uint64_t>(a != 0) & static_cast<uint64_t>(a != full);
  }
  r.written = w;
  r.reload = nf * chunk;
  if (part)
    for (size_t i = 0; i < n; ++i)
      if (const uint64_t a = bits[i] & full; a && a != full) r.reload += std::min<int64_t>(chunk, std::popcount(a) * g);
  for (size_t i = 0; i < n; ++i) bits[i] |= full;
  uint8_t mx = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint8_t l = static_cast<uint8_t>(loads[i] + (loads[i] != UINT8_MAX));
    loads[i] = l;
    mx = std::max(mx, l);
  }
  r.max_loads = mx;
  return r;
}
}  // namespace

void Analyzer::State::count_hbm(const Operand& o, bool write, LineAgg& la) {
  // Walk the contiguous byte runs of an HBM access pattern: rows, then the free dims outside the
  // innermost contiguous run.
  const int64_t eb = dtype_bytes(o.dtype);
  int64_t run = 1;
  int inner = o.nfree;
  for (int d = o.nfree - 1; d >= 0; --d) {
    const auto i = static_cast<size_t>(d);
    if (o.size[i] != 1 && o.stride[i] != run) break;
    run *= o.size[i];
    inner = d;
  }
  const int64_t run_bytes = run * eb;
  const int64_t g = (chunk + 63) / 64;  // bytes per mask bit
  if (!write) {
    ++transfer;
    pending.clear();
  }
  auto bits_of = [&](int64_t lo, int64_t hi, size_t c) {  // mask of [lo, hi) within chunk c
    const int64_t base = static_cast<int64_t>(c) * chunk;
    const int64_t b0 = (lo - base) / g, b1 = (hi - 1 - base) / g;
    return (b1 - b0 >= 63 ? ~uint64_t{0} : ((uint64_t{1} << (b1 - b0 + 1)) - 1)) << b0;
  };
  // Bytes counted in this call, added to the (integer-valued) double totals once at the end: the same
  // sums, since every partial sum is an integer far below 2^53.
  int64_t roundtrip = 0, reload = 0;
  int max_loads = la.max_loads;
  const int64_t full_bits = (chunk - 1) / g + 1;  // mask bits of a whole chunk (bits_of(base, base + chunk))
  const uint64_t full = full_bits >= 64 ? ~uint64_t{0} : (uint64_t{1} << full_bits) - 1;
  // `once`: this transfer touches no chunk of [lo, lo + len) again, so its bits are committed at once
  // instead of through `pending`.
  auto touch = [&](int64_t lo, int64_t len, bool once) {
    const int64_t hi = lo + len;
    if (lo < 0 || hi <= lo) return;
    const auto c0 = static_cast<size_t>(lo / chunk), c1 = static_cast<size_t>((hi - 1) / chunk);
    if (c1 >= loads.size()) {  // whole blocks of zeros (a zero block is uniform)
      const size_t n = ((c1 >> kBlockShift) + 1) << kBlockShift;
      loads.resize(n, 0);
      loaded_bits.resize(n, 0);
      stamp.resize(n, 0);
      written.resize(n, 0);
      uni.resize(n >> kBlockShift, 1);
    }
    if (write) {  // new data: reading it later is not a reload
      for (size_t b = c0 >> kBlockShift; b <= c1 >> kBlockShift; ++b) {
        const size_t f = b << kBlockShift, a = std::max(c0, f), z = std::min(c1, f + kBlock - 1);
        if (a == f && z == f + kBlock - 1) {  // the whole block: its first chunk speaks for it
          uni[b] = 1;
          loads[f] = 0;
          loaded_bits[f] = 0;
          written[f] = 1;
          continue;
        }
        spell(b);
        std::fill(loads.begin() + static_cast<std::ptrdiff_t>(a), loads.begin() + static_cast<std::ptrdiff_t>(z) + 1, 0);
        std::fill(loaded_bits.begin() + static_cast<std::ptrdiff_t>(a), loaded_bits.begin() + static_cast<std::ptrdiff_t>(z) + 1, 0);
        std::fill(written.begin() + static_cast<std::ptrdiff_t>(a), written.begin() + static_cast<std::ptrdiff_t>(z) + 1, 1);
      }
      return;
    }
    // A chunk of this read: round trip, reload and load counts. `once`: no other touch of this transfer
    // reaches the chunk, so its stamp (which counts a chunk once per transfer) is not needed: a later
    // transfer has a new number.
    auto read_chunk = [&](size_t c, int64_t clo, int64_t chi) {
      spell(c >> kBlockShift);
      if (written[c]) roundtrip += chi - clo;
      const uint64_t bits = bits_of(clo, chi, c);
      if (const uint64_t again = loaded_bits[c] & bits)  // bytes an earlier transfer loaded
        reload += std::min<int64_t>(chi - clo, std::popcount(again) * g);
      if (once) loaded_bits[c] |= bits;
      else pending.emplace_back(c, bits);
      if (!once) {
        if (stamp[c] == transfer) return;
        stamp[c] = transfer;
      }
      if (loads[c] < UINT8_MAX) ++loads[c];
      max_loads = std::max<int>(max_loads, loads[c]);
    };
    auto span = [&](size_t c) {
      const int64_t base = static_cast<int64_t>(c) * chunk;
      return std::pair<int64_t, int64_t>{std::max<int64_t>(lo, base), std::min<int64_t>(hi, base + chunk)};
    };
    if (!once) {
      for (size_t c = c0; c <= c1; ++c) read_chunk(c, span(c).first, span(c).second);
      return;
    }
    // Once: the partial chunks at the ends as above, the whole chunks between them in a tight loop
    // (all mask bits set: a reload of every loaded bit counts min(chunk, bits * g) = the chunk when
    // every bit was loaded).
    auto m0 = static_cast<int64_t>(c0), m1 = static_cast<int64_t>(c1);
    if (const auto [a, b] = span(c0); b - a < chunk) read_chunk(c0, a, b), ++m0;
    if (m1 >= m0)
      if (const auto [a, b] = span(c1); b - a < chunk) read_chunk(c1, a, b), --m1;
    if (m1 >= m0) {
      // Chunk by chunk in runs (read_whole), but a uniform block taken whole as one chunk times kBlock.
      const auto w0 = static_cast<size_t>(m0), w1 = static_cast<size_t>(m1);
      size_t run0 = w0;  // the chunk-by-chunk run [run0, c) not yet read
      auto flush = [&](size_t end) {
        if (end <= run0) return;
        const WholeChunks w = read_whole(written.data() + run0, loaded_bits.data() + run0, loads.data() + run0,
                                         end - run0, full, chunk, g);
        roundtrip += w.written * chunk;
        reload += w.reload;
        max_loads = std::max<int>(max_loads, w.max_loads);
      };
      for (size_t b = w0 >> kBlockShift; b <= w1 >> kBlockShift; ++b) {
        const size_t f = b << kBlockShift, a = std::max(w0, f), z = std::min(w1, f + kBlock - 1);
        if (!(uni[b] && a == f && z == f + kBlock - 1)) {
          spell(b);
          continue;  // part of the run
        }
        flush(f);
        run0 = f + kBlock;
        const auto k = static_cast<int64_t>(kBlock);
        if (written[f]) roundtrip += k * chunk;
        if (const uint64_t x = loaded_bits[f] & full) reload += k * (x == full ? chunk : std::min<int64_t>(chunk, std::popcount(x) * g));
        loaded_bits[f] |= full;
        loads[f] = static_cast<uint8_t>(loads[f] + (loads[f] != UINT8_MAX));
        max_loads = std::max<int>(max_loads, loads[f]);
      }
      flush(w1 + 1);
    }
  };
  auto done = [&] {
    for (const auto& [c, b] : pending) loaded_bits[c] |= b;  // this transfer's bytes are now "loaded before"
    pending.clear();
    la.hbm_roundtrip += static_cast<double>(roundtrip);
    la.hbm_reload += static_cast<double>(reload);
    hbm_reload += static_cast<double>(reload);
    la.max_loads = max_loads;
  };
  // Rows back to back, each one contiguous run, with row borders on mask bits (g): one run of all rows
  // touches the same chunks with the same bits, and counts the same bytes (each row's share of a chunk
  // is whole bits, so the per-row reload sums equal the merged popcount).
  const uint32_t rows = std::max<uint32_t>(o.num_partitions, 1);
  if (inner == 0 && rows > 1 && o.offset >= 0 && o.partition_step * eb == run_bytes && chunk % g == 0 && o.offset % g == 0 &&
      run_bytes % g == 0) {
    touch(o.offset, run_bytes * rows, true);
    done();
    return;
  }
  std::array<int64_t, isa::kMaxFreeDims> idx{};
  for (uint32_t r = 0; r < rows; ++r) {
    const int64_t row = o.offset + static_cast<int64_t>(r) * o.partition_step * eb;
    idx.fill(0);
    while (true) {
      int64_t off = row;
      for (int d = 0; d < inner; ++d) off += idx[static_cast<size_t>(d)] * o.stride[static_cast<size_t>(d)] * eb;
      touch(off, run_bytes, rows == 1 && inner == 0);  // a single run: each chunk once
      int d = inner - 1;
      for (; d >= 0; --d) {
        const auto i = static_cast<size_t>(d);
        if (++idx[i] < o.size[i]) break;
        idx[i] = 0;
      }
      if (d < 0) break;
    }
  }
  done();
}

void Analyzer::State::on_dma(const Instr& in, const InstrTiming& t, LineAgg& la) {
  const Operand& dst = in.slot(0);
  const Operand& src = in.slot(1);
  const int indirect = isa::indirect_slot(in);
  const memory::DmaSplit& split = event->split;
  const DmaEngines::Transfer& tr = event->transfer;
  Ps engine_time = 0;
  int engines_used = 0;
  uint64_t engines_mask = 0;
  for (int k = 0; k < split.engines; ++k)
    if (split.piece[static_cast<size_t>(k)].bytes > 0) {
      engine_time += tr.piece_end[static_cast<size_t>(k)] - tr.piece_start[static_cast<size_t>(k)];
      ++engines_used;
      engines_mask |= uint64_t{1} << (k & 63);
    }
  la.dma_engines_used += engines_used;
  la.dma_queues_mask |= uint64_t{1} << (in.dma_queue & 63u);
  const auto bytes = static_cast<double>(split.total_bytes);
  ++la.dma_count;
  la.dma_bytes += bytes;
  la.dma_engine_time += engine_time;
  la.dma_queue_time += t.end - t.start;
  const Operand* chip = dst.space != Space::kHbm ? &dst : (src.space != Space::kHbm ? &src : nullptr);
  // A DMA transpose (nisa.dma_transpose, or a 2-D transposed load lowered to one) moves its bytes at the transpose
  // rate (dma.transpose_eff_*), whatever its size: merging several into one transfer would make a strided copy,
  // descriptor-bound (a two-layer MLP reading h^T back in 128 x 128 blocks: 16.6 -> 173.0 us when merged as the
  // dma_efficiency advice said). Not counted as small.
  const bool transposing = isa::op_info(in.op).cost == isa::CostClass::kDmaTranspose;
  if (chip && chip->num_partitions > 0 && !transposing) {
    const int64_t bpp = split.total_bytes / chip->num_partitions;
    // A strided side (a transposed load, x[:, k].T) moves one descriptor per contiguous run: runs shorter than
    // what an engine moves in dma.desc_min are descriptor-bound however many bytes the transfer has.
    int64_t desc = 0;
    for (int k = 0; k < split.engines; ++k) desc += split.piece[static_cast<size_t>(k)].descriptors;
    const double run = desc > 0 ? bytes / static_cast<double>(desc) : bytes;
    const bool short_runs = run < sim::ps_to_ns(p->dma_desc_min) * p->dma_engine_bw;
    if (bpp >= dma_eff_bpp && short_runs) {
      ++la.dma_strided;
      la.dma_min_run = std::min(la.dma_min_run, run);
    }
    const bool narrow = bpp >= dma_eff_bpp && !short_runs && engines_used <= std::max(1, p->dma_engines / 4);
    if (narrow) {
      ++la.dma_narrow;
      la.dma_max_narrow_parts = std::max<int64_t>(la.dma_max_narrow_parts, chip->num_partitions);
      la.dma_narrow_engines |= engines_mask;
      la.dma_narrow_engine_time += engine_time;
    }
    if (bpp < dma_eff_bpp || short_runs || narrow) {
      ++la.dma_small;
      la.dma_small_bytes += bytes;
      la.dma_small_engine_time += engine_time;
      la.dma_small_ideal_ps +=
          bytes / (p->dma_engine_bw * (memory::is_store(dst, src) ? p->dma_store_bw_factor : 1.0)) * kPsPerNs;
      la.dma_small_queue_time += t.end - t.start;
      la.dma_small_partitions += chip->num_partitions;
      la.dma_min_bpp = std::min(la.dma_min_bpp, bpp);
    }
  }
  // A load into on-chip memory reads HBM, which no compute engine writes: when its operands were last
  // ready after a compute instruction, that instruction was a reader (or writer) of its destination,
  // and the load could not start before it finished with the buffer (one buffer: no overlap of this
  // load with that compute). Counted when the load started within that instruction's duration of the
  // release (directly, or held behind it in its in-order trigger queue); the load lost the part of
  // that instruction's run before the load's start.
  // Only a load into the very buffer of this line's previous load counts: with rotating buffers
  // (allocated in the loop body) consecutive loads of a line land in different buffers, and a load
  // that waits for the buffer of the load before last is the normal limit of the rotation depth.
  const bool same_buffer = la.last_load.present() && same_view(la.last_load, dst);
  if (src.space == Space::kHbm && dst.space != Space::kHbm) la.last_load = dst;
  if (same_buffer && src.space == Space::kHbm && t.waited_for >= 0 && t.waited_class != kClassDma &&
      static_cast<uint64_t>(t.waited_for) < recs.size()) {
    const Rec reader = recs[static_cast<size_t>(t.waited_for)];
    const Ps dur = reader.end - reader.start;
    if (dur > 0 && t.start <= t.ready + dur) {
      ++la.reuse_waits;
      la.reuse_wait += std::clamp<Ps>(std::min(t.ready, t.start) - reader.start, 0, dur);
    }
  }
  if (src.space == Space::kHbm) {
    const double b = static_cast<double>(src.total_elems() * dtype_bytes(src.dtype));
    la.hbm_read += b;
    hbm_read += b;
    // The rows of an indirect (gather) side are known only at run time: no reload accounting.
    if (indirect != 1) count_hbm(src, false, la);
  }
  if (dst.space == Space::kHbm) {
    hbm_write += static_cast<double>(dst.total_elems() * dtype_bytes(dst.dtype));
    if (indirect != 0) count_hbm(dst, true, la);
  }
}

void Analyzer::State::track_values(const Instr& in, const InstrTiming& t, LineAgg& la) {
  // The fingerprint of each value on chip: a load's is its HBM bytes' (their address, pattern and how often that part
  // of HBM was written); a computed one's is the instruction's op_hash with its inputs' fingerprints. An instruction
  // computing the value its line's previous one computed recomputes it: a loop-invariant result made again in every
  // iteration (the same inputs, unchanged), which computing once before the loop saves. Unknown inputs (a part of a
  // region, values from registers, the PRNG, runtime addresses) give unknown results, never recomputed ones.
  constexpr int64_t kBlock = int64_t{1} << 16;
  auto space_of = [&](const Operand& o) -> ValueMap* {
    return o.space == Space::kSbuf ? &values[0] : o.space == Space::kPsum ? &values[1] : nullptr;
  };
  auto hbm_version = [&](const Operand& o) {
    const Footprints::Footprint f = Footprints::of(o);
    uint64_t h = 0;
    for (int64_t b = f.lo / kBlock; b <= (std::max(f.hi, f.lo + 1) - 1) / kBlock; ++b) {
      const auto it = hbm_writes.find(b);
      h = mix(h, it == hbm_writes.end() ? 0 : it->second);
    }
    return h;
  };
  const isa::OpInfo& info = isa::op_info(in.op);
  std::array<ValueMap::Extent, isa::kMaxSlots> ext{};
  for (int i = 0; i < info.num_slots; ++i)
    if (in.slot(i).present() && in.slot(i).space != Space::kHbm) ext[static_cast<size_t>(i)] = in.slot(i).byte_extent();
  const bool unknown = isa::indirect_slot(in) >= 0 || isa::dynamic_copy(in) || isa::uses_rng(in.op) ||
                       in.op == Opcode::kRegisterLoad || in.op == Opcode::kCoreBarrier ||
                       (isa::uses_accumulators(in) && in.reduce_cmd != isa::ReduceCmd::kReset &&
                        in.reduce_cmd != isa::ReduceCmd::kResetReduce && in.reduce_cmd != isa::ReduceCmd::kLoadReduce);
  std::optional<uint64_t> fp = op_hash(in);
  if (unknown) fp.reset();
  for (int i = 0; i < info.num_slots && fp; ++i) {
    const Operand& o = in.slot(i);
    const bool written = info.slots[static_cast<size_t>(i)].written;
    if (!o.present()) continue;
    const uint64_t pattern = pattern_hash(o);
    fp = mix(*fp, pattern);
    if (o.space == Space::kHbm) {
      if (!written) fp = mix(mix(*fp, static_cast<uint64_t>(o.offset)), hbm_version(o));
      continue;
    }
    // An input, or an output the instruction adds to (an accumulating matmul, an accumulating DMA).
    const bool reads = !written || (in.op == Opcode::kMultiplyMoving && (in.flags & isa::kAccumulate)) ||
                       (isa::is_dma(in.op) && (in.flags & isa::kAccumulate));
    if (!reads) continue;
    const std::optional<uint64_t> v = space_of(o)->read(o, ext[static_cast<size_t>(i)], pattern);
    if (!v) fp.reset();
    else fp = mix(*fp, *v);
  }
  if (fp && in.op == Opcode::kMultiplyMoving) fp = pe_weights ? std::optional<uint64_t>(mix(*fp, *pe_weights)) : std::nullopt;
  if (in.op == Opcode::kLoadStationary) {
    pe_weights = fp;
    return;
  }
  // Record the results (HBM: a new version of its blocks).
  for (int i = 0; i < info.num_slots; ++i) {
    const Operand& o = in.slot(i);
    if (!o.present() || !info.slots[static_cast<size_t>(i)].written) continue;
    if (o.space == Space::kHbm) {
      const Footprints::Footprint f = Footprints::of_slot(in, i);
      for (int64_t b = f.lo / kBlock; b <= (std::max(f.hi, f.lo + 1) - 1) / kBlock; ++b) ++hbm_writes[b];
      continue;
    }
    space_of(o)->write(o, ext[static_cast<size_t>(i)], fp ? std::optional<uint64_t>(mix(*fp, static_cast<uint64_t>(i))) : std::nullopt);
  }
  // A recomputation: compute work only (a reload is redundant_dma's; a memset refills a constant, as an
  // accumulator's reset does every iteration). An iota is counted: it makes indices or a mask's pattern, not a
  // reset, and an iota made again in every iteration was a quarter to a half of a GpSimd-bound masked loop
  // (an audit's causal mask built by iota + tensor_scalar per row tile, 2026-12-06: the tensor_scalar alone
  // was named, 10.4 us estimated where building the mask once saves 23.0 us).
  if (isa::is_dma(in.op) || in.op == Opcode::kMemset || info.cost == isa::CostClass::kBarrier ||
      info.cost == isa::CostClass::kRegisterLoad)
    return;
  if (fp && la.last_value && *la.last_value == *fp) {
    ++la.recomputed;
    la.recomputed_busy += t.issue - t.start;
    la.recomputed_by_engine[static_cast<size_t>(in.engine)] += t.issue - t.start;
  }
  la.last_value = fp;
}

void Analyzer::State::out_wait(const Instr& in, const InstrTiming& t, LineAgg& la) {
  // A compute instruction reads and writes SBUF / PSUM only, and a store writes HBM: when its operands were last
  // ready after a store, that store was reading its destination (a write-after-read), and the instruction could not
  // start before the store finished with the buffer (one buffer for the output of every iteration: a tile allocated
  // before the loop). As for loads (on_dma): only into the very tile of the line's previous instruction, counted when
  // it started within the store's duration of the release; it lost the part of the store's run before its start.
  const Operand& out = in.slot(0);
  if (out.space != Space::kSbuf) return;
  const bool same_buffer = la.last_out.present() && same_view(la.last_out, out);
  la.last_out = out;
  if (!same_buffer || t.waited_for < 0 || t.waited_class != kClassDma || !is_store(t.waited_for) ||
      static_cast<uint64_t>(t.waited_for) >= recs.size())
    return;
  const Rec store = recs[static_cast<size_t>(t.waited_for)];
  const Ps dur = store.end - store.start;
  if (dur > 0 && t.start <= t.ready + dur) {
    ++la.out_reuse_waits;
    la.out_reuse_wait += std::clamp<Ps>(std::min(t.ready, t.start) - store.start, 0, dur);
  }
}

void Analyzer::State::on_tensor(const Instr& in, const InstrTiming& t, LineAgg& la) {
  const Ps busy = t.issue - t.start;
  if (in.op == Opcode::kLoadStationary) {
    const Operand& st = in.slot(0);
    stat_k = st.num_partitions;
    stat_m = st.elems_per_partition() / ((in.flags & isa::kDoubleRow) ? 2 : 1);
    stat_fp32 = st.dtype == DType::kFloat32;
    return;
  }
  forget_overwritten(in);  // its PSUM output (a transpose's or a broadcast's is remembered)
  // A matmul opening an accumulation group (or a PE transpose) in the very PSUM tile of this line's previous one,
  // which waited for an engine reading that tile out: one PSUM buffer for every iteration (a tile allocated
  // before the loop), so this group could not fill while the previous one was evacuated. As for loads
  // (on_dma): counted when it started within the evacuation's duration of the release; it lost the part of
  // the evacuation before its start.
  const Operand& out = in.slot(0);
  if (out.space == Space::kPsum && !(in.flags & isa::kAccumulate)) {
    const bool same_buffer = la.last_psum.present() && same_view(la.last_psum, out);
    if (la.last_psum.present() && !same_buffer) la.psum_rotates = true;
    la.last_psum = out;
    if (same_buffer && t.waited_for >= 0 && t.waited_class != static_cast<uint8_t>(Engine::kTensor) &&
        t.waited_class != kClassDma && static_cast<uint64_t>(t.waited_for) < recs.size()) {
      const Rec reader = recs[static_cast<size_t>(t.waited_for)];
      const Ps dur = reader.end - reader.start;
      if (dur > 0 && t.start <= t.ready + dur) {
        ++la.psum_reuse_waits;
        la.psum_reuse_wait += std::clamp<Ps>(std::min(t.ready, t.start) - reader.start, 0, dur);
      }
    }
  }
  const PeResults::Kind helper = PeResults::helper_kind(in);
  if (helper == PeResults::kTranspose) {  // a transpose on the PE array
    // Of a tile loaded from HBM as stored: a transposed load would do. Of a tile computed on chip: the PE array is
    // how its layout changes (its PSUM result is not remembered: its copy out is needed work, not the helper's).
    if (!loaded_from_hbm(in.slot(1))) {
      ++la.onchip_transposes;
      pe.forget_result(in);
      return;
    }
    ++la.transposes;
    la.transpose_busy += busy;
    return;
  }
  const Operand& mv = in.slot(1);
  const int64_t k = mv.num_partitions, m = stat_m, nfree = mv.elems_per_partition();
  if (helper == PeResults::kBroadcast) {  // a contraction over one row: ones^T @ row puts the row on every output partition
    ++la.broadcasts;
    la.broadcast_busy += busy;
    return;
  }
  ++la.mm_count;
  la.min_k = std::min(la.min_k, k);
  la.min_m = std::min(la.min_m, m);
  la.min_n = std::min(la.min_n, nfree);
  // Ideal: the same FLOPs on the full array at one column per cycle. A matmul on a PE tile (iimm[0..3]) has its
  // tile's rows and columns: the other tiles' matmuls run beside it, so only the tile it leaves unused is lost.
  const int64_t rows = in.iimm[2] > 0 ? in.iimm[2] : p->pe_rows, cols = in.iimm[2] > 0 ? in.iimm[3] : p->pe_cols;
  const double peak_per_ps = 2.0 * static_cast<double>(rows * cols) * p->clk(Engine::kTensor).ghz() / kPsPerNs;
  const double ideal = 2.0 * static_cast<double>(k * m * nfree) / peak_per_ps;
  const double lost = std::max(0.0, static_cast<double>(busy) - ideal);
  if (stat_fp32 || mv.dtype == DType::kFloat32) {
    ++la.fp32;
    la.fp32_busy += busy;
    la.fp32_lost_ps += static_cast<double>(busy) * (1.0 - 1.0 / p->fp32_factor);
  } else if (k < rows || m < cols || nfree < mm_eff_n) {
    ++la.underfill;
    if (static_cast<double>(nfree) < p->mm_min_ii) ++la.narrow;
    la.underfill_busy += busy;
    la.underfill_lost_ps += lost;
  }
}


void Analyzer::State::track_folds(const Instr& in, const InstrTiming& t, uint32_t loc) {
  // Every read of a remembered pass's output: by a plain activation as its data, a fold (counted for the pass's line
  // while nothing else reads it); by anything else, the pass stays (its fold uncounted).
  if (!fold_live && in.op != Opcode::kTensorScalar) return;  // (most instructions: nothing to look at)
  const isa::OpInfo& info = isa::op_info(in.op);
  if (fold_live) {
    const bool act = PeResults::plain_activation(in);
    for (int k = 0; k < info.num_slots; ++k) {
      const Operand& o = in.slot(k);
      if (info.slots[static_cast<size_t>(k)].written || !o.present() || o.space == Space::kHbm) continue;
      std::pair<int64_t, int64_t> ext{0, -1};  // (worked out for the first entry in its space)
      for (unsigned m = fold_live; m; m &= m - 1) {
        const auto i = static_cast<size_t>(__builtin_ctz(m));
        FoldOut& f = fold_out[i];
        if (f.out.space != o.space) continue;
        if (ext.second < ext.first) ext = o.byte_extent();
        if (!PeResults::overlaps(f.out, f.ext, o, ext)) continue;
        LineAgg& pl = lines[f.line];
        if (act && k == 1 && same_view(f.out, o)) {
          if (!f.consumed) {
            f.consumed = true;
            ++pl.folded;
            pl.folded_busy += f.busy;
            pl.folded_by_engine[f.engine] += f.busy;
          }
          continue;
        }
        // Read by something else: the pass stays (its fold, if counted, taken back), and it is forgotten, as are the
        // line's later passes (the finding takes a line whose every pass folds).
        pl.fold_spoiled = true;
        if (f.consumed) {
          --pl.folded;
          pl.folded_busy -= f.busy;
          pl.folded_by_engine[f.engine] -= f.busy;
        }
        fold_live = static_cast<uint8_t>(fold_live & ~(1u << i));
      }
    }
    // An output overwritten is no longer the pass's.
    const Operand& dst = in.slot(0);
    if (info.num_slots > 0 && info.slots[0].written && dst.present() && dst.space != Space::kHbm) {
      const auto ext = dst.byte_extent();
      for (unsigned m = fold_live; m; m &= m - 1) {
        const auto i = static_cast<size_t>(__builtin_ctz(m));
        if (PeResults::overlaps(fold_out[i].out, fold_out[i].ext, dst, ext))
          fold_live = static_cast<uint8_t>(fold_live & ~(1u << i));
      }
    }
  }
  // (A pass over one element per partition, a bias or a scale itself, saves nothing worth a finding when folded.)
  if (PeResults::foldable_pass(in) && in.slot(0).elems_per_partition() > 1) {
    LineAgg& la = line(loc);
    ++la.fold_passes;
    if (la.fold_spoiled) return;
    fold_out[fold_next] = {in.slot(0), in.slot(0).byte_extent(), loc, t.issue - t.start,
                           static_cast<size_t>(in.engine), false};
    fold_live = static_cast<uint8_t>(fold_live | (1u << fold_next));
    fold_next = (fold_next + 1) % fold_out.size();
  }
}

void Analyzer::State::forget_overwritten(const Instr& in) {
  // An output overwritten (by anything) is no longer the activation's, the transpose's or the broadcast's
  // result; a transpose's, a broadcast's or an activation's own output is remembered (PeResults::note).
  pe.note(in);
}

void Analyzer::State::on_elementwise(const Instr& in, const InstrTiming& t, LineAgg& la) {
  if (in.engine == Engine::kVector && t.perf_mode <= 1) {
    bool sbuf = true, fp32 = false;
    for (int i = 0; i < isa::op_info(in.op).num_slots; ++i)
      if (const Operand& o = in.slot(i); o.present()) {
        sbuf &= o.space == Space::kSbuf;
        fp32 |= o.dtype == DType::kFloat32;
      }
    if (sbuf && fp32) vector_fp32_busy += t.issue - t.start;
  }
  if (in.engine == Engine::kScalar) {
    const isa::CostClass cls = isa::op_info(in.op).cost;
    const bool function = (cls == isa::CostClass::kActivation || cls == isa::CostClass::kActivationReduce) &&
                          in.act != isa::ActFunc::kCopy;
    if (!function) la.scalar_plain += t.issue - t.start;
    const int set = function ? p->act_table_set[static_cast<size_t>(in.act)] : -1;
    if (set >= 0 && set < 32) {
      act_sets_used |= 1u << set;
      if (t.table_load > 0) {
        ++la.table_loads;
        la.table_load_time += t.table_load;
        la.table_sets |= 1u << set;
        ++act_table_loads;
      }
    }
  }
  // A copy out of a PE transpose's or a partition broadcast's PSUM result: part of the helper's cost (the
  // fixes, a transposed load or a stride-0 DMA, need neither).
  // A reduction an activation could have accumulated while writing its output (reduce_op=, reduce_res=).
  if (pe.split_reduce(in)) {
    ++la.split_reduces;
    la.split_reduce_busy += t.issue - t.start;
  }
  switch (pe.copy_of(in)) {
    case PeResults::kTranspose:
      ++la.evictions;
      la.eviction_busy += t.issue - t.start;
      break;
    case PeResults::kBroadcast:
      ++la.broadcast_copies;
      la.broadcast_copy_busy += t.issue - t.start;
      break;
    default:
      break;
  }
  forget_overwritten(in);
  // A partial product (a PSUM tile) added into an SBUF accumulator, acc = acc + psum: the matmuls could have
  // accumulated in PSUM themselves.
  if (in.op == Opcode::kTensorTensor && in.alu0 == AluOp::kAdd && in.slot(0).space == Space::kSbuf) {
    const Operand &a = in.slot(1), &b = in.slot(2);
    const Operand* psum = a.space == Space::kPsum ? &a : b.space == Space::kPsum ? &b : nullptr;
    const Operand* acc = psum == &a ? &b : &a;
    if (psum && acc->space == Space::kSbuf && same_view(*acc, in.slot(0))) {
      ++la.psum_adds;
      if (!la.psum_acc.present() || !same_view(la.psum_acc, *acc)) ++la.psum_add_groups;
      la.psum_acc = *acc;
      la.psum_add_busy[static_cast<size_t>(in.engine)] += t.issue - t.start;
    }
  }
}

// ------------------------------------------------------------------------------------------------
// Report
// ------------------------------------------------------------------------------------------------

namespace {
// What to change when engine `e` is the bottleneck, naming the knobs of both NKI dialects.
std::string engine_advice(const std::string& e) {
  if (e == "tensor")
    return "Make each pass through the PE array count: bf16 or fp8 inputs (fp32 takes tensor.fp32_factor passes), "
           "full tiles (K = 128 contraction rows, 128 stationary columns, N = 512 moving columns per matmul), "
           "transposes by dma_transpose or a transposed load instead of nc_transpose on TensorE, and partition "
           "broadcasts by a stride-0 DMA from HBM instead of broadcast_to of an SBUF tile (a ones-row matmul).";
  if (e == "vector")
    return "Move element-wise work off VectorE: leave engine= unset on tensor_tensor/tensor_scalar/tensor_copy "
           "so the compiler model places each op on the engine that finishes first, or pin some tensor_tensor / "
           "tensor_copy to GpSimd (engine=nisa.engine.gpsimd; Beta 1: nisa.gpsimd_engine; a GpSimd tensor_scalar "
           "runs rsqrt only); fold exp/scale/bias/copy and a running sum into one ScalarE activation "
           "(activation with bias=, scale=, reduce_res=); fuse passes over the same data; 16-bit operands enable "
           "VectorE's 2x/4x modes.";
  if (e == "scalar")
    return "Take plain arithmetic off ScalarE (tensor_scalar / tensor_copy with engine=nisa.engine.vector, "
           "tensor_copy with nisa.engine.gpsimd, or engine unset); fuse scale and bias into the activation itself; group activations "
           "that use the same function table (each switch costs scalar.act_table_load).";
  if (e == "gpsimd")
    return "GpSimd streams slowest: fuse passes over the same data (two ALU ops in one tensor_scalar, op0 and "
           "op1, rather than nl.subtract then nl.multiply; a sum along the free axis as one tensor_reduce, not a "
           "chain of tensor_tensor adds); move element-wise ops on 16-bit data to VectorE (its 2x/4x modes) or "
           "ScalarE (engine=nisa.engine.vector / nisa.engine.scalar; Beta 1: nisa.vector_engine / "
           "nisa.scalar_engine; nl.* calls go where the compiler model finishes them first when they issue) -- an "
           "fp32 tensor_tensor takes as many cycles per element on either engine (only their clocks differ); a sum "
           "over the partitions (tensor_partition_reduce with add) is one TensorE matmul per 128 rows against a "
           "ones vector (nc_matmul with a ones [128, 1] stationary and the rows moving, accumulated in PSUM), which "
           "contracts the partitions for free; keep GpSimd for iota, affine_select and the shuffles only it does.";
  if (e == "sync")
    return "Sync spends its time triggering DMAs: make transfers bigger (>= 2 KiB per partition), or trigger some "
           "from ScalarE/GpSimd (dma_copy engine=nisa.engine.scalar / nisa.engine.gpsimd).";
  return "Move work to an idle engine and fuse passes over the same data.";
}
}  // namespace

AnalysisReport Analyzer::report(const std::string& kernel_name) const {
  const State& s = *s_;
  s.sim->sync_events();  // (finish() did, unless it was not called)
  const Simulator& sim = *s.sim;
  const CoreParams& p = *s.p;
  const RunCounters& c = sim.counters();
  AnalysisReport r;
  r.kernel = kernel_name;
  r.config = p.name;
  r.total_ns = ns(sim.total_time());
  r.instructions = s.n;
  const double total = r.total_ns;
  auto loc_of = [&](uint32_t id) { return sim.source(id); };

  // ---- bounds: the resource bounds and verdict every tool shares (engines/bounds.h), then the
  // dependency chain, which explains a latency verdict
  const sim::StatsRegistry stats = sim.stats();
  const BoundVerdict verdict = bound_verdict(stats);
  for (const ResourceBound& b : verdict.bounds) r.bounds.push_back({b.name, b.ns, b.what});
  const double hbm_bound = hbm_time_ns(p, s.hbm_read - s.hbm_reload, s.hbm_write);  // nothing loaded twice
  // The busiest compute engine: no change to the DMA transfers alone makes the kernel faster than it
  // (Sync, which only triggers DMAs, excepted).
  double compute_bound = 0;
  for (int e = 0; e < isa::kNumEngines; ++e)
    if (static_cast<isa::Engine>(e) != isa::Engine::kSync)
      compute_bound = std::max(compute_bound, ns(c.engine[static_cast<size_t>(e)].busy_union));
  Ps dma_busy = 0;  // the busiest DMA engine
  for (int k = 0; k < p.dma_engines; ++k) dma_busy = std::max(dma_busy, c.dma[static_cast<size_t>(k)].busy);
  if (sim.dependency_bound() >= 0)
    r.bounds.push_back({"dependencies", ns(sim.dependency_bound()),
                        "longest dependency chain with unlimited engines (each instruction keeps its duration)"});
  std::stable_sort(r.bounds.begin(), r.bounds.end(), [](const Bound& a, const Bound& b) { return a.ns > b.ns; });
  r.bottleneck = verdict.verdict;
  r.top_share_percent = verdict.top_share_percent;
  {
    // TensorE's useful work: the model FLOPs at the PE array's peak (MX matmuls at theirs).
    const double peak = stats.get("flops.tensor_peak_per_s"), mx = stats.get("flops.mx");
    const double mx_peak = stats.get("flops.tensor_peak_mx_per_s");
    r.tensor_useful_ns =
        peak > 0 ? 1e9 * ((stats.get("flops.model") - mx) / peak + (mx > 0 && mx_peak > 0 ? mx / mx_peak : 0.0)) : 0.0;
    r.tensor_full_percent = s.tensor_full_percent;
  }
  const double max_bound = r.bounds.front().ns;

  // ---- idle attribution
  for (int e = 0; e < isa::kNumEngines; ++e) {
    const auto ei = static_cast<size_t>(e);
    if (!c.engine[ei].instructions) continue;
    EngineIdle id;
    id.engine = std::string(isa::engine_name(static_cast<Engine>(e)));
    id.busy_ns = ns(s.busy_union[ei]);
    id.wait_ns = ns(s.wait[ei]);
    id.other_wait_ns = ns(s.other_wait[ei]);
    id.tail_ns = std::max(0.0, total - ns(s.cursor[ei]));
    for (size_t k = 0; k < s.waited_on[ei].size(); ++k)
      if (s.waited_on[ei][k] > 0) id.waited_on.emplace_back(track_name(*s.p, static_cast<int>(k)), ns(s.waited_on[ei][k]));
    std::stable_sort(id.waited_on.begin(), id.waited_on.end(), [](auto& a, auto& b) { return a.second > b.second; });
    r.idle.push_back(std::move(id));
  }

  // ---- critical path: walk back from the instruction that ends last
  std::vector<Ps> crit_by_line(s.lines.size(), 0);
  r.critical_path = s.recs_complete && !s.recs.empty();
  if (r.critical_path) {
    // By track index while walking (a name per record cost a string each), by name at the end.
    std::vector<Ps> own_by_track;
    Ps waits = 0;
    bool any_wait = false;
    int64_t cur = 0;
    for (size_t i = 1; i < s.recs.size(); ++i)
      if (s.recs[i].end > s.recs[static_cast<size_t>(cur)].end) cur = static_cast<int64_t>(i);
    Ps bound_at = s.recs[static_cast<size_t>(cur)].end;  // when the successor needed this one
    while (cur >= 0) {
      const Rec rc = s.recs[static_cast<size_t>(cur)];
      const Ps own = std::max<Ps>(0, std::min(bound_at, rc.end) - rc.start);
      const Ps gap = std::max<Ps>(0, bound_at - std::max(rc.start, std::min(bound_at, rc.end)));
      if (rc.track >= own_by_track.size()) own_by_track.resize(rc.track + size_t{1}, -1);
      Ps& o = own_by_track[rc.track];
      o = std::max<Ps>(o, 0) + own;
      if (gap) waits += gap, any_wait = true;
      if (rc.loc < crit_by_line.size()) crit_by_line[rc.loc] += own;
      bound_at = rc.start;
      if (rc.pred >= cur) break;  // never loops (producers precede their consumers)
      cur = rc.pred;
    }
    std::map<std::string, Ps> by_track;
    for (size_t k = 0; k < own_by_track.size(); ++k)
      if (own_by_track[k] >= 0) by_track[track_name(*s.p, static_cast<int>(k))] += own_by_track[k];
    if (any_wait) by_track["waits (hand-off, pipes, ports)"] += waits;
    if (bound_at > 0) by_track["start (nothing to run)"] += bound_at;
    for (const auto& [k, v] : by_track) r.critical_path_by_track.emplace_back(k, ns(v));
    std::stable_sort(r.critical_path_by_track.begin(), r.critical_path_by_track.end(),
                     [](auto& a, auto& b) { return a.second > b.second; });
    for (size_t i = 1; i < crit_by_line.size(); ++i)
      if (crit_by_line[i] > 0) r.critical_path_lines.push_back({loc_of(static_cast<uint32_t>(i)), 0, ns(crit_by_line[i]), ""});
    std::stable_sort(r.critical_path_lines.begin(), r.critical_path_lines.end(),
                     [](const LineRef& a, const LineRef& b) { return a.ns > b.ns; });
  }
  // Time a line could save: its loss, but no more than its time on the critical path (a line off the
  // critical path saves nothing until it becomes critical). Without the path, the loss spread over
  // `parallel` units is used.
  auto saving_of = [&](size_t line, double lost_ns, double line_time_ns, double parallel) {
    if (lost_ns <= 0) return 0.0;
    if (r.critical_path) {
      const double frac = line_time_ns > 0 ? std::min(1.0, lost_ns / line_time_ns) : 0.0;
      return frac * ns(line < crit_by_line.size() ? crit_by_line[line] : 0);
    }
    return lost_ns / std::max(1.0, parallel);
  };
  const double min_saving_ns = total * s.min_saving / 100.0;
  // DMA transfers also wait for each other inside the queues and engines, which the critical path
  // (data dependencies and in-order engines) does not see: for DMA losses take at least the lost
  // DMA-engine time spread over the engines, weighted by how busy the busiest DMA engine was.
  const double dma_pressure = total > 0 ? std::min(1.0, ns(dma_busy) / total) : 0.0;
  auto dma_saving_of = [&](size_t line, double lost_engine_ns, double line_engine_ns) {
    return std::max(saving_of(line, lost_engine_ns, line_engine_ns, p.dma_engines),
                    lost_engine_ns / p.dma_engines * dma_pressure);
  };

  // ---- DMA efficiency
  {
    Finding f;
    f.kind = "dma_efficiency";
    uint64_t small = 0, strided = 0, narrow = 0;
    int64_t narrow_parts = 0;  // the most partitions of a narrow transfer
    double small_bytes = 0;
    for (size_t i = 1; i < s.lines.size(); ++i) {
      const LineAgg& la = s.lines[i];
      if (!la.dma_small) continue;
      // Two losses: DMA-engine time above the bytes at full bandwidth (descriptor minimums, gaps), and
      // the fixed setup of each transfer, serial on its queue, paid by n_small transfers where
      // n_eff transfers of the efficient size would have moved the same bytes.
      const double engine_lost = std::max(0.0, static_cast<double>(la.dma_small_engine_time) - la.dma_small_ideal_ps) / kPsPerNs;
      // (Narrow transfers merge into ones over every partition: rows loaded one DMA at a time, one tile's worth.)
      const double parts = la.dma_narrow == la.dma_small ? static_cast<double>(p.partitions_per_engine * p.dma_engines)
                                                         : la.dma_small_partitions / static_cast<double>(la.dma_small);
      const double n_eff = std::ceil(la.dma_small_bytes / (static_cast<double>(s.dma_eff_bpp) * std::max(1.0, parts)));
      const double setup_lost = std::max(0.0, static_cast<double>(la.dma_small) - n_eff) * ns(p.dma_setup);
      double save = std::max(saving_of(i, setup_lost + engine_lost / p.dma_engines, ns(la.dma_small_queue_time), 1),
                             dma_saving_of(i, engine_lost, ns(la.dma_engine_time)));
      if (la.dma_narrow == la.dma_small) {
        // Rows one DMA at a time: their queues' setups and their triggers, serial per queue, are the kernel's time
        // (the critical path sees queue waits, not this line): the setups and triggers of the transfers merged away,
        // spread over the queues the line used.
        const double per = ns(p.dma_setup) + ns(la.trigger_busy) / static_cast<double>(std::max<uint64_t>(1, la.dma_count));
        const auto queues = static_cast<double>(std::max(1, __builtin_popcountll(la.dma_queues_mask)));
        save = std::max(save, std::max(0.0, static_cast<double>(la.dma_small) - n_eff) * per / queues);
        // Transfers that all land on the same few DMA engines (tiles of 32 of the 128 partitions: 4 of the 16
        // engines, whatever the tile) queue their bytes there while the other engines stay idle: the engines' time
        // above what all of them would take. (Rows of other partitions spread over the engines: no loss here.) An
        // audit's [32, 2048] tiles, 89.5 -> 24.8 us as [128, 512]: estimated 7.0 us before this term.
        const int confined = __builtin_popcountll(la.dma_narrow_engines);
        if (confined > 0 && confined < p.dma_engines)
          save = std::max(save, ns(la.dma_narrow_engine_time) * (1.0 / confined - 1.0 / p.dma_engines));
      }
      f.saving_ns += save;
      small += la.dma_small;
      small_bytes += la.dma_small_bytes;
      const double above = la.dma_small_ideal_ps > 0
                               ? 100.0 * (static_cast<double>(la.dma_small_engine_time) / la.dma_small_ideal_ps - 1)
                               : 0.0;
      if (la.dma_narrow == la.dma_small)  // every one by its partitions
        f.lines.push_back({loc_of(static_cast<uint32_t>(i)), la.dma_small, save,
                           fmt::format("{} transfers over {} partitions or fewer (a DMA engine serves {} partitions: "
                                       "{} of the {} move each); {:.0f} transfer{} over all partitions would move the "
                                       "same bytes ({:.0f} fewer setups of {:.0f} ns)",
                                       la.dma_small, la.dma_max_narrow_parts, p.partitions_per_engine,
                                       std::max<int64_t>(1, (la.dma_max_narrow_parts + p.partitions_per_engine - 1) /
                                                                p.partitions_per_engine),
                                       p.dma_engines, n_eff, n_eff == 1 ? "" : "s", std::max(0.0, static_cast<double>(la.dma_small) - n_eff),
                                       ns(p.dma_setup))});
      else if (la.dma_strided == la.dma_small)  // every one by its contiguous runs: a strided access, not a small one
        f.lines.push_back({loc_of(static_cast<uint32_t>(i)), la.dma_small, save,
                           fmt::format("{} transfers whose contiguous runs average {:.0f} B or less (one descriptor each, "
                                       "at least {:.0f} ns); DMA-engine time {:.0f} ns, {:.0f}% above the bytes at full "
                                       "bandwidth",
                                       la.dma_small, la.dma_min_run, ns(p.dma_desc_min), ns(la.dma_small_engine_time),
                                       above)});
      else
        f.lines.push_back({loc_of(static_cast<uint32_t>(i)), la.dma_small, save,
                           fmt::format("{} transfers of {} B/partition or less{}; {:.0f} transfer{} of up to {} B/partition "
                                       "would move the same bytes ({:.0f} fewer setups of {:.0f} ns); DMA-engine time {:.0f} ns, "
                                       "{:.0f}% above the bytes at full bandwidth",
                                       la.dma_small, la.dma_min_bpp,
                                       la.dma_strided ? fmt::format(" ({} more by contiguous runs of {:.0f} B or less)",
                                                                    la.dma_strided, la.dma_min_run)
                                                      : std::string(),
                                       n_eff, n_eff == 1 ? "" : "s", s.dma_eff_bpp,
                                       std::max(0.0, static_cast<double>(la.dma_small) - n_eff), ns(p.dma_setup),
                                       ns(la.dma_small_engine_time), above)});
      strided += la.dma_strided;
      narrow += la.dma_narrow;
      if (la.dma_narrow) narrow_parts = std::max<int64_t>(narrow_parts, la.dma_max_narrow_parts);
    }
    if (small) {
      // However efficient the transfers, the HBM traffic remains.
      f.saving_ns = std::min(f.saving_ns, std::max(0.0, total - std::max(hbm_bound, compute_bound)));
      const double run_bytes = ns(p.dma_desc_min) * p.dma_engine_bw;  // what an engine moves in dma.desc_min
      const std::string strided_advice = fmt::format(
          "A transfer whose HBM side is strided (a transposed load such as x[:, k].T, a column) moves one descriptor "
          "per contiguous run, each at least dma.desc_min: keep the innermost dimension contiguous in HBM (runs of "
          "{:.0f} B or more), and transpose with nisa.dma_transpose or on chip (nisa.nc_transpose) instead.",
          run_bytes);
      const std::string narrow_advice =
          "A transfer over a few partitions (a row loaded or stored one DMA at a time, t[r:r + 1, :]) keeps all but "
          "one or two of the DMA engines idle and pays a queue setup per row: move the rows of a tile in one "
          "transfer (nl.load(x[r0:r0 + 128, :]) into a [128, n] tile), or gather them with one indirect DMA "
          "(nl.load(x[idx_tile[i_p, 0], i_f])).";
      if (narrow == small) {
        f.title = narrow_parts <= 1 ? fmt::format("{} DMA transfers each move one partition (one row at a time)", small)
                                    : fmt::format("{} DMA transfers each move {} partitions or fewer of {}", small,
                                                  narrow_parts, p.mem.partitions);
        f.detail = fmt::format("{:.0f} bytes move in narrow transfers. {}", small_bytes, narrow_advice);
      } else if (strided == small) {
        f.title = fmt::format("{} DMA transfers move contiguous runs under {:.0f} B (strided accesses)", small, run_bytes);
        f.detail = fmt::format("{:.0f} bytes move in descriptor-bound transfers. {}", small_bytes, strided_advice);
      } else {
        f.title = fmt::format("{} DMA transfers move less than {} B per partition", small - strided - narrow,
                              s.dma_eff_bpp);
        if (strided) f.title += fmt::format(", {} in contiguous runs under {:.0f} B", strided, run_bytes);
        if (narrow) f.title += fmt::format(", {} over a few partitions", narrow);
        f.detail = fmt::format(
            "Each transfer pays a fixed setup on its queue (dma.setup) and each descriptor at least dma.desc_min, so "
            "many small transfers waste time ({:.0f} bytes in small transfers). Load bigger tiles: make the free size of "
            "each partition's row at least {} B (e.g. 512 fp32 / 1024 bf16 elements), or merge several small loads into "
            "one.{}",
            small_bytes, s.dma_eff_bpp, strided ? " " + strided_advice : std::string());
        if (narrow) f.detail += " " + narrow_advice;
      }
      f.metrics = {{"transfers", static_cast<double>(small)}, {"bytes", small_bytes},
                   {"efficient_bytes_per_partition", static_cast<double>(s.dma_eff_bpp)},
                   {"strided_transfers", static_cast<double>(strided)}, {"narrow_transfers", static_cast<double>(narrow)}};
      r.findings.push_back(std::move(f));
    }
  }
  // ---- redundant DMA
  {
    Finding f;
    f.kind = "redundant_dma";
    int times = 0;
    for (size_t i = 1; i < s.lines.size(); ++i) {
      const LineAgg& la = s.lines[i];
      if (la.hbm_reload <= 0) continue;
      // The reloads' share of this line's transfers.
      const double frac = la.hbm_reload / std::max(1.0, la.dma_bytes);
      // Bound: the reloads' DMA-engine time, spread over the engines each transfer uses (a one-partition
      // reload occupies one engine, which the next full-width transfer then waits for), weighted by the
      // DMA pressure. Not their queue time: a reload queued behind other transfers mostly waits for
      // them, and that wait is not saved by removing it.
      const double lost = frac * ns(la.dma_engine_time);
      const double par = std::max(1.0, la.dma_engines_used / std::max<double>(1.0, static_cast<double>(la.dma_count)));
      const double save = std::max(saving_of(i, lost, ns(la.dma_engine_time), par), lost / par * dma_pressure);
      f.saving_ns += save;
      times = std::max(times, la.max_loads);
      f.lines.push_back({loc_of(static_cast<uint32_t>(i)), la.dma_count, save,
                         fmt::format("{:.0f} of its {:.0f} HBM bytes were already loaded; the same bytes are loaded up to "
                                     "{} times",
                                     la.hbm_reload, la.hbm_read, la.max_loads)});
    }
    if (!f.lines.empty()) {
      // Without the reloads the HBM traffic and the compute engines' work remain.
      f.saving_ns = std::min(f.saving_ns, std::max(0.0, total - std::max(hbm_bound, compute_bound)));
      f.title = fmt::format("the same HBM bytes are loaded up to {} times ({:.0f} redundant bytes, {:.0f}% of HBM reads)",
                            times, s.hbm_reload, 100.0 * s.hbm_reload / std::max(1.0, s.hbm_read));
      f.detail =
          "These lines load HBM data that an earlier load already brought on chip (and nothing wrote in between). "
          "Hoist the load out of the loop, or keep the tile in SBUF (a larger pool / buffer) and reuse it.";
      f.metrics = {{"times_loaded", static_cast<double>(times)}, {"reload_bytes", s.hbm_reload},
                   {"hbm_read_bytes", s.hbm_read}};
      r.findings.push_back(std::move(f));
    }
  }
  // ---- HBM round trips: data the kernel wrote to HBM and read back (an intermediate spilled to HBM)
  {
    Finding f;
    f.kind = "hbm_roundtrip";
    double bytes = 0;
    for (size_t i = 1; i < s.lines.size(); ++i) {
      const LineAgg& la = s.lines[i];
      if (la.hbm_roundtrip <= 0) continue;
      // Bound: the traffic kept on chip is written once and read back once, at the DMA/HBM roof.
      const double save = hbm_time_ns(p, la.hbm_roundtrip, la.hbm_roundtrip);
      bytes += la.hbm_roundtrip;
      f.saving_ns += save;
      f.lines.push_back({loc_of(static_cast<uint32_t>(i)), la.dma_count, save,
                         fmt::format("reads back {:.0f} bytes this kernel wrote to HBM earlier", la.hbm_roundtrip)});
    }
    if (!f.lines.empty()) {
      // The compute remains: keeping the intermediate on chip makes the kernel no faster than its busiest compute
      // engine (an audit: naive attention at S = 2048, 138.8 us estimated without this, 57.0 us saved by the fix,
      // ScalarE's 83 us of work left).
      f.saving_ns = std::min(f.saving_ns, std::max(0.0, total - compute_bound));
      f.title = fmt::format("{:.0f} bytes are written to HBM and read back by the kernel ({:.0f}% of HBM reads)", bytes,
                            100.0 * bytes / std::max(1.0, s.hbm_read));
      f.detail = "An intermediate result makes a round trip through HBM: written by one pass, loaded again by the "
                 "next. Keep it on chip: fuse the passes so each tile is consumed while it is in SBUF/PSUM (e.g. "
                 "flash attention's online softmax instead of materialising the score matrix), tiling the work so the "
                 "intermediate fits.";
      f.metrics = {{"roundtrip_bytes", bytes}};
      r.findings.push_back(std::move(f));
    }
  }
  // ---- loads that wait for the previous user of their buffer (no double buffering)
  {
    Finding f;
    f.kind = "single_buffer";
    uint64_t n = 0;
    uint64_t n_psum = 0;
    uint64_t n_out = 0;
    // A line's waits of one kind: counted into `total`, its line with `what` ("{} loads waited {} ns ...").
    const auto add = [&](size_t i, uint64_t waits, Ps wait, uint64_t& total, const char* what) {
      if (!waits) return;
      const double save = ns(wait);
      total += waits;
      f.saving_ns += save;
      f.lines.push_back({loc_of(static_cast<uint32_t>(i)), waits, save,
                         fmt::format(fmt::runtime(what), waits, save)});
    };
    for (size_t i = 1; i < s.lines.size(); ++i) {
      const LineAgg& la = s.lines[i];
      add(i, la.reuse_waits, la.reuse_wait, n,
          "{} loads waited {:.0f} ns for compute instructions to finish with their destination buffer");
      if (!la.psum_rotates)
        add(i, la.psum_reuse_waits, la.psum_reuse_wait, n_psum,
            "{} TensorE instructions waited {:.0f} ns for the previous result in their PSUM tile to be read out");
      add(i, la.out_reuse_waits, la.out_reuse_wait, n_out,
          "{} instructions waited {:.0f} ns for a store to finish reading their output tile");
    }
    if (n || n_psum || n_out) {
      std::stable_sort(f.lines.begin(), f.lines.end(),
                       [](const LineRef& a, const LineRef& b) { return a.ns > b.ns; });
      // Overlapping the loads with compute cannot make the kernel faster than its busiest resource.
      f.saving_ns = std::min(f.saving_ns, std::max(0.0, total - verdict.bounds.front().ns));
      std::vector<std::string> parts;
      if (n) parts.push_back(fmt::format("{} loads", n));
      if (n_psum) parts.push_back(fmt::format("{} matmuls", n_psum));
      if (n_out) parts.push_back(fmt::format("{} instructions writing an output tile", n_out));
      f.title = parts.size() > 1
                    ? fmt::format("{} wait for their buffer to be released (no double buffering)", fmt::join(parts, ", "))
                : n ? fmt::format("{} loads wait for compute to release their buffer (no double buffering)", n)
                : n_psum ? fmt::format("{} matmuls wait for their PSUM tile to be read out (no double buffering)", n_psum)
                         : fmt::format("{} instructions wait for a store to read out their output tile (no double "
                                       "buffering)", n_out);
      f.detail = n ? "Each of these loads overwrites a tile that compute instructions are still reading, so the next "
                     "tile's load cannot overlap this tile's compute. Give the tile more than one buffer: allocate it "
                     "inside the loop body (nl.ndarray in the loop; the compiler model rotates loop-body tiles over "
                     "buffers when SBUF allows; kernel.json `bufs` sets the depth; Beta 1: allocate with nl.ndarray "
                     "inside the loop too) instead of once before the loop."
                   : std::string();
      if (n_psum)
        f.detail += std::string(n ? " " : "") +
                    "Each of these matmuls (or PE transposes) starts a new result in the PSUM tile whose previous "
                    "result an engine is still reading out, so TensorE cannot fill the next tile while this one is "
                    "evacuated. Allocate the PSUM tile inside the loop body (nl.ndarray(..., buffer=nl.psum) in the "
                    "loop: the compiler model gives it compiler.psum_loop_buffers rotating banks) instead of once "
                    "before the loop.";
      if (n_out)
        f.detail += std::string(n || n_psum ? " " : "") +
                    "Each of these instructions overwrites an output tile that a store to HBM is still reading, so the "
                    "next tile's compute cannot overlap this tile's store. Allocate the output tile inside the loop body "
                    "(nl.ndarray in the loop: rotating buffers) instead of once before the loop.";
      f.metrics = {{"loads", static_cast<double>(n)}, {"matmuls", static_cast<double>(n_psum)},
                   {"outputs", static_cast<double>(n_out)}};
      r.findings.push_back(std::move(f));
    }
  }
  // ---- activation table switches: more table loads than the function tables used need
  {
    const int sets = __builtin_popcount(s.act_sets_used);
    const uint64_t avoidable = s.act_table_loads > static_cast<uint64_t>(sets) ? s.act_table_loads - sets : 0;
    if (avoidable > 0) {
      Finding f;
      f.kind = "act_table_switch";
      const double share = static_cast<double>(avoidable) / static_cast<double>(s.act_table_loads);
      const auto scalar = static_cast<size_t>(Engine::kScalar);
      double load_ns = 0;
      for (size_t i = 1; i < s.lines.size(); ++i) {
        const LineAgg& la = s.lines[i];
        if (!la.table_loads) continue;
        load_ns += ns(la.table_load_time);
        // The avoidable share of the line's loads, on the critical path as far as the line is.
        const double save = saving_of(i, share * ns(la.table_load_time), ns(la.busy[scalar]), 1);
        f.saving_ns += save;
        std::string tables;
        for (int k = 0; k < 32; ++k)
          if (la.table_sets & (1u << k))
            tables += (tables.empty() ? "" : ", ") +
                      (static_cast<size_t>(k) < s.act_set_names.size() ? s.act_set_names[static_cast<size_t>(k)]
                                                                      : fmt::format("set {}", k));
        f.lines.push_back({loc_of(static_cast<uint32_t>(i)), la.table_loads, save,
                           fmt::format("{} table load{} ({}), {:.0f} ns", la.table_loads, la.table_loads == 1 ? "" : "s",
                                       tables, ns(la.table_load_time))});
      }
      f.title = fmt::format("{} activation table loads ({:.0f} ns of ScalarE) where {} would do: activations of {} "
                            "function tables alternate",
                            s.act_table_loads, load_ns, sets, sets);
      f.detail = "ScalarE holds one set of activation function tables at a time (scalar.act_table_sets); an "
                 "activation of another set first reloads it (scalar.act_table_load each, the profiler's "
                 "ACT_TABLE_LOAD). Group the activations by table: in a loop that applies two functions of "
                 "different tables to every tile (exp then log, gelu then exp), apply the first to all tiles, then "
                 "the second (two loops over the tiles, or one tile holding them all), or use functions of one "
                 "table set (a copy, a multiply by scale=, or the tensor_scalar / tensor_tensor ALU ops need none).";
      f.metrics = {{"table_loads", static_cast<double>(s.act_table_loads)},
                   {"avoidable_loads", static_cast<double>(avoidable)},
                   {"tables", static_cast<double>(sets)}};
      r.findings.push_back(std::move(f));
    }
  }
  // The engine with the most of a finding's busy time (by engine): the one its fix frees (Finding::engine).
  auto busiest = [](const std::array<Ps, isa::kNumEngines>& by_engine) {
    return std::string(isa::engine_name(
        static_cast<Engine>(std::max_element(by_engine.begin(), by_engine.end()) - by_engine.begin())));
  };
  // ---- matmul partial products summed on a compute engine instead of accumulated in PSUM
  {
    Finding f;
    f.kind = "psum_accumulation";
    uint64_t n = 0;
    std::array<Ps, isa::kNumEngines> by_engine{};
    for (size_t i = 1; i < s.lines.size(); ++i) {
      const LineAgg& la = s.lines[i];
      if (la.psum_adds < 2 || la.psum_adds == la.psum_add_groups) continue;
      // Accumulated in PSUM, each accumulator still needs one copy out, which costs about what one add does.
      Ps busy = 0;
      for (size_t e = 0; e < by_engine.size(); ++e) by_engine[e] += la.psum_add_busy[e], busy += la.psum_add_busy[e];
      const double lost = ns(busy) * static_cast<double>(la.psum_adds - la.psum_add_groups) / static_cast<double>(la.psum_adds);
      const double save = saving_of(i, lost, la.busy_ns(), 1);
      n += la.psum_adds;
      f.saving_ns += save;
      f.lines.push_back({loc_of(static_cast<uint32_t>(i)), la.psum_adds, save,
                         fmt::format("{} adds of a PSUM tile into {} SBUF accumulator{}, {:.0f} ns busy", la.psum_adds,
                                     la.psum_add_groups, la.psum_add_groups == 1 ? "" : "s", ns(busy))});
    }
    if (n) {
      f.engine = busiest(by_engine);
      f.title = fmt::format("{} tensor_tensor adds sum matmul results from PSUM into SBUF accumulators on {}", n, f.engine);
      f.detail = "TensorE accumulates into PSUM for free: issue the matmuls of one output tile into the same PSUM tile "
                 "(nc_matmul with the same dst over the contraction tiles; Beta 1: psum_tile[...] += nisa.nc_matmul(...)), "
                 "then copy it out once, instead of adding each partial product to an SBUF tile.";
      f.metrics = {{"adds", static_cast<double>(n)}};
      r.findings.push_back(std::move(f));
    }
  }
  // ---- values computed again from the same inputs (a loop-invariant result made in every iteration)
  {
    Finding f;
    f.kind = "recomputed_value";
    uint64_t n = 0;
    std::array<Ps, isa::kNumEngines> by_engine{};
    for (size_t i = 1; i < s.lines.size(); ++i) {
      const LineAgg& la = s.lines[i];
      if (!la.recomputed) continue;
      const double save = saving_of(i, ns(la.recomputed_busy), la.busy_ns(), 1);
      n += la.recomputed;
      for (size_t e = 0; e < by_engine.size(); ++e) by_engine[e] += la.recomputed_by_engine[e];
      f.saving_ns += save;
      f.lines.push_back({loc_of(static_cast<uint32_t>(i)), la.recomputed, save,
                         fmt::format("{} recomputations of its previous result from the same inputs, {:.0f} ns busy",
                                     la.recomputed, ns(la.recomputed_busy))});
    }
    if (n) {
      f.engine = busiest(by_engine);
      f.title = fmt::format("{} instructions compute again what they computed before, from the same input values", n);
      f.detail = "Each of these instructions repeats the computation its line's previous instruction did, on input "
                 "values that have not changed since (a loop-invariant result -- a function of weights, a bias, a "
                 "mask or a transpose of a constant tile -- made again in every iteration). Compute it once before "
                 "the loop into a tile allocated there, and read that tile in the loop.";
      f.metrics = {{"instructions", static_cast<double>(n)}};
      r.findings.push_back(std::move(f));
    }
  }
  // ---- reductions in a separate pass over an activation's output
  {
    Finding f;
    f.kind = "split_reduce";
    uint64_t n = 0;
    for (size_t i = 1; i < s.lines.size(); ++i) {
      const LineAgg& la = s.lines[i];
      if (!la.split_reduces) continue;
      const double save = saving_of(i, ns(la.split_reduce_busy), la.busy_ns(), 1);
      n += la.split_reduces;
      f.saving_ns += save;
      f.lines.push_back({loc_of(static_cast<uint32_t>(i)), la.split_reduces, save,
                         fmt::format("{} reductions of an activation's output, {:.0f} ns busy", la.split_reduces,
                                     ns(la.split_reduce_busy))});
    }
    if (n) {
      f.title = fmt::format("{} reductions read an activation's output again in a separate pass", n);
      f.detail = "ScalarE can reduce (add, max, min) along the free dim while it writes an activation's output: "
                 "activation(..., reduce_op=nl.add, reduce_res=s, reduce_cmd=reset_reduce) (Beta 1: "
                 "nisa.activation_reduce) gives the row sums (or maxima) of its output in the same pass -- the sums of "
                 "exp of a softmax, of squares of a norm -- saving the tensor_reduce and its read of the whole tile.";
      f.metrics = {{"reductions", static_cast<double>(n)}};
      r.findings.push_back(std::move(f));
    }
  }
  // ---- element-wise passes an activation reading their output could do itself (bias=, scale=)
  {
    Finding f;
    f.kind = "fold_into_activation";
    uint64_t n = 0;
    std::array<Ps, isa::kNumEngines> by_engine{};
    for (size_t i = 1; i < s.lines.size(); ++i) {
      const LineAgg& la = s.lines[i];
      // Every pass of the line folds (the what-if frees the line's passes: frontend/analyze.cpp).
      if (!la.folded || la.folded != la.fold_passes) continue;
      const double save = saving_of(i, ns(la.folded_busy), la.busy_ns(), 1);
      n += la.folded;
      for (size_t e = 0; e < by_engine.size(); ++e) by_engine[e] += la.folded_by_engine[e];
      f.saving_ns += save;
      f.lines.push_back({loc_of(static_cast<uint32_t>(i)), la.folded, save,
                         fmt::format("{} passes over a tile only an activation reads, {:.0f} ns busy", la.folded,
                                     ns(la.folded_busy))});
    }
    if (n) {
      f.engine = busiest(by_engine);
      f.title = fmt::format("{} element-wise passes could be folded into the activation that reads them", n);
      f.detail = "An activation computes f(data * scale + bias) in one pass, with a scale and a bias per partition: "
                 "a subtraction, addition or multiplication by one value per partition whose result only an "
                 "activation reads is a pass over the whole tile, and a tile, that the activation's bias= or scale= "
                 "makes unnecessary. E.g. exp(x - max): nisa.activation(op=nl.exp, data=x, bias=neg_max) with "
                 "neg_max = nisa.tensor_reduce(op=nl.max, data=x, axis=(1,), negate=True, keepdims=True) (new dialect: "
                 "nisa.activation(dst=e, op=nl.exp, data=x, bias=neg_max)); x * s: scale=s.";
      f.metrics = {{"passes", static_cast<double>(n)}};
      r.findings.push_back(std::move(f));
    }
  }
  // ---- matmul efficiency
  const double tensor_busy = ns(c.engine[static_cast<size_t>(Engine::kTensor)].busy);
  {
    Finding under, f32, tr, bc;
    // The copies of a PE helper's results out of PSUM (a transpose's, a broadcast's) are part of its cost: their
    // lines are listed after the helper's own (which the fix changes; the same line when one call made both),
    // each part sorted by saving. Returns the number of copies.
    auto add_copies = [&](Finding& f, uint64_t LineAgg::*count, Ps LineAgg::*busy, const char* what) {
      std::stable_sort(f.lines.begin(), f.lines.end(), [](const LineRef& a, const LineRef& b) { return a.ns > b.ns; });
      const size_t first = f.lines.size();
      uint64_t n = 0;
      for (size_t i = 1; i < s.lines.size(); ++i) {
        const LineAgg& la = s.lines[i];
        if (!(la.*count)) continue;
        n += la.*count;
        const double save = saving_of(i, ns(la.*busy), la.busy_ns(), 1);
        f.saving_ns += save;
        f.lines.push_back({loc_of(static_cast<uint32_t>(i)), la.*count, save,
                           fmt::format("{} copies of {} out of PSUM, {:.0f} ns busy", la.*count, what, ns(la.*busy))});
      }
      std::stable_sort(f.lines.begin() + static_cast<std::ptrdiff_t>(first), f.lines.end(),
                       [](const LineRef& a, const LineRef& b) { return a.ns > b.ns; });
      return n;
    };
    under.kind = "pe_underfill";
    f32.kind = "fp32_matmul";
    tr.kind = "pe_transpose";
    bc.kind = "pe_broadcast";
    uint64_t nu = 0, nf = 0, nt = 0, nb = 0, nn = 0, nto = 0;
    double tbusy = 0, under_lost = 0;
    for (size_t i = 1; i < s.lines.size(); ++i) {
      const LineAgg& la = s.lines[i];
      const double lbusy = ns(la.busy[static_cast<size_t>(Engine::kTensor)]);
      // Each matmul finding: the line, its instruction count, its saving, a note.
      auto add = [&](Finding& f, uint64_t count, double lost_ns, std::string note) {
        const double save = saving_of(i, lost_ns, lbusy, 1);
        f.saving_ns += save;
        f.lines.push_back({loc_of(static_cast<uint32_t>(i)), count, save, std::move(note)});
      };
      if (la.underfill) {
        nu += la.underfill;
        nn += la.narrow;
        under_lost += la.underfill_lost_ps / kPsPerNs;
        add(under, la.underfill, la.underfill_lost_ps / kPsPerNs,
            fmt::format("{} matmuls, smallest K={} (rows), M={} (stationary cols), N={} (moving free); "
                        "{:.0f} ns busy, {:.0f} ns above the full-array time",
                        la.underfill, la.min_k, la.min_m, la.min_n, ns(la.underfill_busy), la.underfill_lost_ps / kPsPerNs));
      }
      if (la.fp32) {
        nf += la.fp32;
        add(f32, la.fp32, la.fp32_lost_ps / kPsPerNs, fmt::format("{} fp32 matmuls, {:.0f} ns busy", la.fp32, ns(la.fp32_busy)));
      }
      if (la.broadcasts) {
        nb += la.broadcasts;
        add(bc, la.broadcasts, ns(la.broadcast_busy),
            fmt::format("{} one-row matmuls, {:.0f} ns of TensorE time", la.broadcasts, ns(la.broadcast_busy)));
      }
      nto += la.onchip_transposes;
      if (la.transposes) {
        nt += la.transposes;
        tbusy += ns(la.transpose_busy);
        add(tr, la.transposes, ns(la.transpose_busy),
            fmt::format("{} transposes, {:.0f} ns of TensorE time", la.transposes, ns(la.transpose_busy)));
      }
    }
    if (nu && verdict.bounds.front().name == isa::engine_name(Engine::kTensor)) {
      // TensorE is the bottleneck: its time above the full-array time comes off the kernel until the next
      // resource bound limits it, whether or not each matmul's own line is on the critical path (where
      // TensorE's pipe is the critical path, each matmul waits for the previous one's issue interval:
      // pipe waits, not the line's time).
      const double next = verdict.bounds.size() > 1 ? verdict.bounds[1].ns : 0.0;
      under.saving_ns = std::max(under.saving_ns, std::min(under_lost, verdict.bounds.front().ns - next));
    }
    if (nu) {
      under.title = fmt::format("{} matmuls under-fill the {}x{} PE array or use a moving tile narrower than {}", nu,
                                p.pe_rows, p.pe_cols, s.mm_eff_n);
      under.detail = fmt::format(
          "A matmul costs at least tensor.mm_min_ii cycles and one cycle per moving column whatever its size: "
          "contract over all {} partitions (K), use {} stationary columns (M) and a moving free size (N) of {} "
          "(one PSUM bank of fp32) so each instruction does the most work. Independent matmuls with a small K (or "
          "M) can instead share the array: nc_matmul(..., tile_position=(row, col), tile_size=(rows, cols)) puts "
          "each on a tile of {} x 2^k rows (and {} x 2^k columns), and matmuls on disjoint tiles run side by side: issue "
          "them alternately, one step of every tile's accumulation after another (TensorE issues its instructions in "
          "order, so a tile's matmuls written one after the other keep the other tiles waiting).",
          p.pe_rows, p.pe_cols, s.mm_eff_n, p.row_tile_min, p.col_tile_min);
      under.metrics = {{"matmuls", static_cast<double>(nu)}, {"narrow_matmuls", static_cast<double>(nn)}};
      r.findings.push_back(std::move(under));
    }
    if (nf) {
      f32.title = fmt::format("{} matmuls take fp32 inputs ({}x slower than bf16)", nf, p.fp32_factor);
      f32.detail = "fp32 matmul inputs take tensor.fp32_factor passes through the PE array. Cast the operands to "
                   "bf16 (accumulation in PSUM stays fp32) where the precision allows.";
      f32.metrics = {{"matmuls", static_cast<double>(nf)}};
      r.findings.push_back(std::move(f32));
    }
    if (nb) {
      bc.title = fmt::format("{} matmuls contract over one row: a partition broadcast on the PE array", nb);
      bc.detail = "A matmul with a one-row stationary (ones^T @ row) copies a row onto every partition using "
                  "TensorE time that matmuls could use, and the row's copy out of PSUM takes an element-wise "
                  "engine's time. Load the row onto every partition with one stride-0 DMA "
                  "instead (new dialect: nisa.dma_copy(dst=t, src=b.broadcast(0, 128)); Beta 1: "
                  "nl.load(b.broadcast_to((128, n)))), once before the loop, and add it while evacuating PSUM "
                  "(tensor_tensor, or activation bias=).";
      bc.metrics = {{"matmuls", static_cast<double>(nb)}};
      bc.metrics.emplace_back("copies", static_cast<double>(add_copies(bc, &LineAgg::broadcast_copies,
                                                                       &LineAgg::broadcast_copy_busy, "broadcast rows")));
      r.findings.push_back(std::move(bc));
    }
    add_copies(tr, &LineAgg::evictions, &LineAgg::eviction_busy, "transposed tiles");
    const double share = tensor_busy > 0 ? 100.0 * tbusy / tensor_busy : 0.0;
    if (nt && share > s.transpose_share) {
      tr.title = fmt::format("PE-array transposes of loaded tiles take {:.0f}% of TensorE time ({} transposes)", share,
                             nt);
      tr.detail = "Transposes on the PE array of tiles loaded from HBM as stored use TensorE time that matmuls could "
                  "use. Load the data already transposed (dma_transpose, or a transposed access pattern), or lay "
                  "the data out in HBM so the contraction dimension is the partition dimension.";
      if (nto)
        tr.detail += fmt::format(" ({} transposes of tiles computed on chip are not counted: the PE array is how "
                                 "their layout changes.)",
                                 nto);
      tr.metrics = {{"transposes", static_cast<double>(nt)}, {"share_percent", share},
                    {"onchip_transposes", static_cast<double>(nto)}};
      r.findings.push_back(std::move(tr));
    }
  }
  // ---- engine bottleneck
  {
    const ResourceBound& top = verdict.bounds.front();
    const double next = verdict.bounds.size() > 1 ? verdict.bounds[1].ns : 0.0;
    int engine = -1;
    for (int e = 0; e < isa::kNumEngines; ++e)
      if (top.name == isa::engine_name(static_cast<Engine>(e))) engine = e;
    if (engine >= 0 && top.ns > 0) {
      Finding f;
      f.kind = "engine_bound";
      const auto ei = static_cast<size_t>(engine);
      f.title = fmt::format("{} engine is the bottleneck: busy {:.0f} ns = {:.0f}% of the kernel time", top.name, top.ns,
                            total > 0 ? 100.0 * top.ns / total : 0.0);
      f.saving_ns = std::max(0.0, top.ns - next);
      std::string useful;
      if (static_cast<Engine>(engine) == Engine::kTensor) {
        // Only TensorE's busy time above its useful work (partial tiles, fp32 passes, transposes,
        // broadcasts, throttling) can be saved by the advice; a kernel whose matmuls fill the array is at
        // the hardware's limit.
        const double ideal_ns = r.tensor_useful_ns;
        const double share = 100.0 * std::min(1.0, ideal_ns / top.ns);
        f.saving_ns = std::min(f.saving_ns, std::max(0.0, top.ns - ideal_ns));
        useful = fmt::format(" Its useful work, the model FLOPs at the PE array's peak, takes {:.0f} ns ({:.0f}% of its "
                             "busy time){}",
                             ideal_ns, share,
                             share >= s.tensor_full_percent
                                 ? ": the matmuls already fill the array; only fewer FLOPs or faster inputs (fp8 double_row, "
                                   "MX) make them faster."
                                 : ".");
        f.metrics.push_back({"useful_ns", ideal_ns});
      }
      // The longest dependency chain longer than the engine's busy time: the chain, not the engine's
      // throughput, sets the kernel time. Moving work to other engines shortens it only where they run
      // the work faster (the flash attention backward sample's PSUM copies moved from VectorE to ScalarE:
      // 69.2 -> 71.0 us); faster or fewer instructions on it, or independent work overlapping it, help.
      const double chain = ns(sim.dependency_bound());
      const bool chain_bound = sim.dependency_bound() >= 0 && chain > top.ns &&
                               static_cast<Engine>(engine) != Engine::kTensor;
      const std::string advice =
          chain_bound
              ? fmt::format("The longest dependency chain ({:.0f} ns) is longer than this engine's busy time and runs "
                            "through its instructions: the kernel waits on the chain, not on the engine, so moving work "
                            "to another engine helps only where that engine runs it faster (engine= unset lets the "
                            "compiler model pick the one that finishes first). Shorten the chain: fewer or faster "
                            "instructions on it (fuse passes over the same data: two ALU ops in one tensor_scalar, a "
                            "scale, bias or copy folded into the activation that produces the data; 16-bit operands "
                            "enable VectorE's 2x/4x modes), or give the engines independent work to overlap with it "
                            "(another tile or head in flight).",
                            chain)
              : engine_advice(top.name);
      // Many instructions near the engine's minimum cost each (MIN_II): the work is in their count, not their size
      // (an analyzer audit's scan, one [128, 1] op per position, GpSimd-bound: fusing ALU ops saved a third of
      // what one tensor_tensor_scan per row saved).
      std::string small_advice;
      {
        uint64_t n_instr = 0;
        for (size_t i = 1; i < s.lines.size(); ++i) n_instr += s.lines[i].count[ei];
        const auto eng = static_cast<Engine>(engine);
        const double min_ii = eng == Engine::kVector   ? p.vector_min_ii
                              : eng == Engine::kGpsimd ? p.gpsimd_min_ii
                              : eng == Engine::kScalar ? p.scalar_min_ii
                                                       : 0.0;
        const double floor_ns = min_ii > 0 ? ns(p.clk(eng).cycles_to_ps(min_ii)) : 0.0;
        const double avg = n_instr > 0 ? top.ns / static_cast<double>(n_instr) : 0.0;
        if (floor_ns > 0 && n_instr > 0 && avg <= 2.0 * floor_ns) {
          small_advice = fmt::format(
              " Its {} instructions average {:.0f} ns each, about its minimum per instruction ({:.0f} ns, "
              "{}.min_ii_cycles): the time is in their number. A recurrence computed one column at a time "
              "(x[:, t] = a[:, t] * x[:, t - 1] + b[:, t]) is one nisa.tensor_tensor_scan over the row; small ops "
              "over the same data fuse into fewer, wider ones.",
              n_instr, avg, floor_ns, top.name);
          f.metrics.push_back({"average_instruction_ns", avg});
        }
      }
      if (chain_bound) {
        f.metrics.push_back({"dependency_chain_ns", chain});
        f.title = fmt::format("{} engine is the busiest: busy {:.0f} ns = {:.0f}% of the kernel time, on a dependency "
                              "chain of {:.0f} ns",
                              top.name, top.ns, total > 0 ? 100.0 * top.ns / total : 0.0, chain);
      }
      // Busy time on a compute engine that is DMA triggers (dma_copy pinned to it: engine=, or dge_mode=hwdge on
      // ScalarE), when they are its largest part: the advice above is about compute. (Sync's advice is triggers.)
      Ps triggers = 0;
      Ps line_max = 0, trigger_line_max = 0;
      for (size_t i = 1; i < s.lines.size(); ++i) {
        const Ps tb = s.lines[i].busy[ei] > 0 ? std::min(s.lines[i].trigger_busy, s.lines[i].busy[ei]) : 0;
        triggers += tb;
        line_max = std::max(line_max, s.lines[i].busy[ei]);
        if (tb == s.lines[i].busy[ei]) trigger_line_max = std::max(trigger_line_max, tb);
      }
      std::string trigger_advice;
      if (top.name != "sync" && triggers > 0 && trigger_line_max == line_max) {
        trigger_advice = fmt::format(
            " {:.0f} ns of its busy time ({:.0f}%) triggers DMAs, its busiest lines among them: each dma_copy issued "
            "from {} costs it a trigger instruction. Leave dma_copy's dge_mode (and the new dialect's engine=) unset "
            "(dge_mode=hwdge triggers from ScalarE or Sync) so the compiler model spreads the triggers over the queues' "
            "engines, or pin them to an idle one (engine=nisa.engine.sync or nisa.engine.gpsimd); fewer, bigger "
            "transfers need fewer triggers.",
            ns(triggers), top.ns > 0 ? 100.0 * ns(triggers) / top.ns : 0.0, top.name);
        f.metrics.push_back({"dma_trigger_ns", ns(triggers)});
      }
      // VectorE's time mostly at 1x on fp32 SBUF operands: 16-bit operands, the cheapest fix, come first (an audit's
      // fp32 intermediates: the advice led with moving work off VectorE, where bf16 tiles saved 58 % of the kernel).
      std::string dtype_advice;
      if (static_cast<Engine>(engine) == Engine::kVector && !chain_bound && ns(s.vector_fp32_busy) >= 0.5 * top.ns) {
        dtype_advice = fmt::format(
            " {:.0f} ns of its busy time ({:.0f}%) is instructions on fp32 SBUF operands at one element per cycle: with "
            "bf16 (16-bit) tiles, tensor_scalar, tensor_copy and tensor_tensor add / subtract / multiply run in "
            "VectorE's 2x/4x modes (keep fp32 where precision needs it: PSUM accumulation, a running sum).",
            ns(s.vector_fp32_busy), top.ns > 0 ? 100.0 * ns(s.vector_fp32_busy) / top.ns : 0.0);
        f.metrics.push_back({"fp32_1x_ns", ns(s.vector_fp32_busy)});
      }
      f.detail = fmt::format("No other resource needs more than {:.0f} ns ({}).{}{} {}{}{} Its busiest lines:", next,
                             verdict.bounds.size() > 1 ? verdict.bounds[1].name : "-", useful, dtype_advice, advice,
                             small_advice, trigger_advice);
      // On ScalarE, the lines whose work is plain arithmetic or copies (what the advice moves off it or folds into an
      // activation) come first, by that time; then the others by busy time (an exp needs ScalarE: its line, busier,
      // came first and the copy the advice is about second).
      std::vector<std::pair<Ps, size_t>> order;
      const bool scalar = static_cast<Engine>(engine) == Engine::kScalar;
      for (size_t i = 1; i < s.lines.size(); ++i)
        if (s.lines[i].busy[ei] > 0) order.emplace_back(scalar ? s.lines[i].scalar_plain : 0, i);
      std::stable_sort(order.begin(), order.end(), [&](const auto& a, const auto& b) {
        return a.first != b.first ? a.first > b.first : s.lines[a.second].busy[ei] > s.lines[b.second].busy[ei];
      });
      for (const auto& [plain, i] : order)
        f.lines.push_back({loc_of(static_cast<uint32_t>(i)), s.lines[i].count[ei], ns(s.lines[i].busy[ei]),
                           plain > 0 ? fmt::format("{} instructions, {:.0f} ns busy ({:.0f} ns of plain arithmetic or "
                                                   "copies)",
                                                   s.lines[i].count[ei], ns(s.lines[i].busy[ei]), ns(plain))
                                     : fmt::format("{} instructions, {:.0f} ns busy", s.lines[i].count[ei],
                                                   ns(s.lines[i].busy[ei]))});
      f.metrics.insert(f.metrics.begin(), {{"busy_ns", top.ns}, {"next_bound_ns", next}});
      r.findings.push_back(std::move(f));
    }
  }
  // ---- serialisation: the kernel takes longer than every bound
  if (total - max_bound > 0) {
    Finding f;
    f.kind = "serialization";
    f.saving_ns = total - max_bound;
    std::vector<std::pair<Ps, std::pair<int, uint32_t>>> waits;  // (time, (waiter engine, producer line))
    for (size_t i = 0; i < s.lines.size(); ++i)
      for (int e = 0; e < isa::kNumEngines; ++e)
        if (const Ps t = s.lines[i].waited_by[static_cast<size_t>(e)]; t > 0) waits.push_back({t, {e, static_cast<uint32_t>(i)}});
    std::stable_sort(waits.begin(), waits.end(), [](auto& a, auto& b) { return a.first > b.first; });
    for (const auto& [t, key] : waits)
      f.lines.push_back({loc_of(key.second), 0, ns(t),
                         fmt::format("{} waited {:.0f} ns for the results of this line",
                                     isa::engine_name(static_cast<Engine>(key.first)), ns(t))});
    f.title = fmt::format("engines wait on each other: the kernel takes {:.0f} ns more than its largest bound ({}, {:.0f} ns)",
                          f.saving_ns, r.bounds.front().name, max_bound);
    f.detail = "Instructions wait for their operands (semaphores) while their engines are idle. Let the next "
               "tile's loads overlap this tile's compute: allocate the tile inside the loop body (nl.ndarray in "
               "the loop; the compiler model gives loop-body tiles rotating buffers when SBUF allows; kernel.json "
               "`bufs` sets the depth) rather than once before the loop; leave dma_copy's engine= unset so transfers "
               "spread over the trigger engine's queues (compiler.dma_queues_per_trigger), or trigger some from "
               "another engine (engine=nisa.engine.scalar / nisa.engine.gpsimd); put independent work (another tile, "
               "another head) between a producer and its consumer. Producers waited on most:";
    f.metrics = {{"largest_bound_ns", max_bound}};
    r.findings.push_back(std::move(f));
  }
  // A fix that only takes work off one engine (TensorE for the PE findings, VectorE for split_reduce)
  // can make the kernel no faster than its other resources allow: cap those findings at total -
  // max(every other resource bound, the engine's bound less the saving) (a PE under-fill hidden under
  // DMA saves little; so does a second pass over an activation's output in a DMA-bound kernel), that
  // bound (only the engine's own part when another resource is the largest, below) scaled, when a resource bounds the kernel more than its dependency chain, by how far above that
  // bound the kernel runs (total / largest bound: the waits between the engines remain; the softmax pair of
  // examples/defects/pairs.py, 1.53x its VectorE bound, was estimated 8.6 us where fusing the sum saves 3.9
  // us: now 3.6 us). A kernel whose dependency chain is its largest bound is left unscaled: the fix shortens
  // that chain when its instructions are on it. So are the TensorE findings, which `nsim analyze` re-simulates
  // (frontend/analyze.cpp): the re-simulation measures the waits, and a bound scaled to nothing here would drop
  // the finding before it (a broadcast's fix also takes its PSUM copies off VectorE / GpSimd).
  double largest = 0;
  for (const ResourceBound& b : verdict.bounds) largest = std::max(largest, b.ns);
  const double chain = ns(sim.dependency_bound());  // (< 0: not tracked, then unscaled)
  const double above = largest > 0 && chain >= 0 && chain < largest ? std::max(1.0, total / largest) : 1.0;
  for (auto& f : r.findings) {
    const std::string engine = finding_engine(f);
    if (engine.empty()) continue;
    double others = 0, own = 0;
    for (const ResourceBound& b : verdict.bounds) {
      if (b.name == engine) own = b.ns;
      else others = std::max(others, b.ns);
    }
    // When the finding's engine is not the largest bound, the scale applies to what stays of that engine only:
    // its work sat between the bottleneck's steps, and the fix removes those waits with it. (Scaling the other
    // resources too made the cap total - above * largest = 0 whenever another resource was the largest bound, and
    // the finding vanished: a loop-invariant mask built by memset + affine_select in every iteration of an
    // HBM-bound loop running 1.83x that bound, whose fix saves 16.2 us of 42.4 (1.13x the bound after it), got only
    // `serialization`; an audit, 2026-12-06. When the engine is the bottleneck, the waits are the kernel's own
    // dependencies and remain: the softmax pair above.)
    const double scale = engine == "tensor" ? 1.0 : above;
    const bool bottleneck = own >= others;
    const double after = bottleneck ? scale * std::max(others, own - f.saving_ns) : std::max(others, scale * (own - f.saving_ns));
    f.saving_ns = std::min(f.saving_ns, std::max(0.0, total - std::min(total, after)));
  }
  // Rank, drop the negligible ones, order each finding's lines by time.
  for (auto& f : r.findings) {
    if (f.kind != "engine_bound" && f.kind != "serialization" && f.kind != "pe_transpose" &&
        f.kind != "pe_broadcast")  // (ordered above)
      std::stable_sort(f.lines.begin(), f.lines.end(), [](const LineRef& a, const LineRef& b) { return a.ns > b.ns; });
  }
  rank_findings(r, min_saving_ns);
  return r;
}

std::string finding_engine(const Finding& f) { return f.engine.empty() ? finding_engine(f.kind) : f.engine; }

std::string finding_engine(const std::string& kind) {
  if (kind == "pe_underfill" || kind == "fp32_matmul" || kind == "pe_transpose" || kind == "pe_broadcast") return "tensor";
  if (kind == "split_reduce") return "vector";  // tensor_reduce runs on VectorE
  if (kind == "act_table_switch") return "scalar";
  return "";
}

void rank_findings(AnalysisReport& r, double min_saving_ns) {
  // `engine_bound` is what relieving the bottleneck engine could gain (its busy time above the next
  // resource bound) beyond what the defect findings on that engine already claim: the two never
  // count the same engine time twice, and a bottleneck the named defects explain ranks after them.
  for (Finding& f : r.findings) {
    if (f.kind != "engine_bound") continue;
    double busy = 0, next = 0, causes = 0, useful = 0;
    for (const auto& [k, v] : f.metrics) {
      if (k == "busy_ns") busy = v;
      if (k == "next_bound_ns") next = v;
      if (k == "useful_ns") useful = v;  // TensorE: its model FLOPs at peak, which no advice removes
    }
    const std::string engine = f.title.substr(0, f.title.find(' '));
    for (const Finding& g : r.findings)
      if (finding_engine(g) == engine) causes += g.saving_ns;
    f.saving_ns = std::max(0.0, std::min(busy - next, busy - useful) - causes);
  }
  std::erase_if(r.findings, [&](const Finding& f) { return f.saving_ns < min_saving_ns || f.saving_ns <= 0; });
  // Largest saving first, but the defects (a change to the named lines removes them) before the
  // symptoms: `engine_bound` after the defects on its engine (which it is then the rest of), and
  // `serialization` (the engines waiting on each other, whatever the cause) last.
  std::string bottleneck;
  for (const Finding& f : r.findings)
    if (f.kind == "engine_bound") bottleneck = f.title.substr(0, f.title.find(' '));
  auto tier = [&](const Finding& f) {
    if (f.kind == "serialization") return 2;
    return !bottleneck.empty() && finding_engine(f) == bottleneck ? 0 : 1;
  };
  std::stable_sort(r.findings.begin(), r.findings.end(), [&](const Finding& a, const Finding& b) {
    const int ta = tier(a), tb = tier(b);
    return ta != tb ? ta < tb : a.saving_ns > b.saving_ns;
  });
}

// ------------------------------------------------------------------------------------------------
// Output
// ------------------------------------------------------------------------------------------------

namespace {

std::string pct(double part, double whole) { return whole > 0 ? fmt::format("{:.1f}%", 100.0 * part / whole) : "-"; }

sim::Json line_json(const LineRef& l) {
  return sim::Json{{"src", l.loc.str()}, {"file", l.loc.file}, {"line", l.loc.line}, {"function", l.loc.function},
                   {"stack", l.loc.stack}, {"count", l.count}, {"ns", sim::json_ns(l.ns)}, {"note", l.note}};
}

template <class T, class F>
sim::Json json_list(const std::vector<T>& v, F f) {
  sim::Json o = sim::Json::array();
  for (const T& x : v) o.push_back(f(x));
  return o;
}

sim::Json pairs_json(const std::vector<std::pair<std::string, double>>& v) {
  sim::Json o = sim::Json::object();
  for (const auto& [k, x] : v) o[k] = sim::json_number(x);
  return o;
}

std::string where(const SourceLoc& l) {
  if (l.file.empty() && !l.line) return "(no source line)";
  return l.stack.empty() ? l.str() : l.str() + " <- " + l.stack;
}

}  // namespace

std::string AnalysisReport::to_text(size_t max_lines) const {
  std::string o = fmt::format("nsim analysis: {} on {} — {:.1f} ns, {} instructions\n", kernel.empty() ? "kernel" : kernel,
                              config, total_ns, instructions);
  o += "\nBounds (the kernel time if only this counted):\n";
  for (const auto& b : bounds)
    o += fmt::format("  {:<13} {:>12.1f} ns  {:>6} of total{}  {}\n", b.name, b.ns, pct(b.ns, total_ns),
                     b.name == bottleneck || (bottleneck == "latency" && b.name == "dependencies")
                         ? "  <- bottleneck"
                         : "               ",
                     b.what);
  if (bottleneck == "latency")
    o += fmt::format("  verdict: latency-bound — the busiest resource is busy {:.1f}% of the time "
                     "(analysis.latency_bound_percent); the engines mostly wait on each other\n",
                     top_share_percent);
  else
    o += fmt::format("  verdict: {}-bound (busy {:.1f}% of the time)\n", bottleneck, top_share_percent);
  if (!bounds.empty() && bounds.front().ns > 0)
    o += fmt::format("  the kernel takes {:.2f}x its largest bound\n", total_ns / bounds.front().ns);
  if (bottleneck == "tensor" && !bounds.empty() && bounds.front().ns > 0) {
    const double share = 100.0 * std::min(1.0, tensor_useful_ns / bounds.front().ns);
    o += fmt::format("  TensorE's useful work (the model FLOPs at the PE array's peak) takes {:.1f} ns, {:.1f}% of its "
                     "busy time{}\n",
                     tensor_useful_ns, share,
                     share >= tensor_full_percent ? ": the matmuls fill the array, TensorE works at the hardware's limit" : "");
  }
  if (critical_path) {
    o += "\nCritical path (what the kernel time is made of):\n";
    for (const auto& [k, v] : critical_path_by_track) o += fmt::format("  {:<32} {:>12.1f} ns  {:>6}\n", k, v, pct(v, total_ns));
    for (size_t i = 0; i < critical_path_lines.size() && i < max_lines; ++i)
      o += fmt::format("    {:>12.1f} ns  {}\n", critical_path_lines[i].ns, where(critical_path_lines[i].loc));
  } else {
    o += "\nCritical path: not computed (more instructions than analysis.max_recorded_instructions)\n";
  }
  o += "\nIdle time per engine:\n";
  for (const auto& e : idle) {
    std::string on;
    for (size_t i = 0; i < e.waited_on.size() && i < 4; ++i)
      on += fmt::format("{}{} {:.0f} ns", i ? ", " : " (on ", e.waited_on[i].first, e.waited_on[i].second);
    if (!on.empty()) on += ")";
    o += fmt::format("  {:<7} busy {:>10.1f} ns, waited {:>10.1f} ns{}, blocked {:.1f} ns, idle at the end {:.1f} ns\n",
                     e.engine, e.busy_ns, e.wait_ns, on, e.other_wait_ns, e.tail_ns);
  }
  o += fmt::format("\nFindings ({}; by estimated saving, a bottleneck's causes before it, serialization last):\n",
                   findings.size());
  if (findings.empty()) o += "  none above analysis.min_saving_percent\n";
  for (size_t i = 0; i < findings.size(); ++i) {
    const Finding& f = findings[i];
    o += fmt::format("{:>3}. [{}] {}\n     saves ~{:.0f} ns ({}; {})\n     {}\n", i + 1, f.kind, f.title, f.saving_ns,
                     pct(f.saving_ns, total_ns), f.method.empty() ? std::string("bound") : f.method, f.detail);
    for (size_t j = 0; j < f.lines.size() && j < max_lines; ++j)
      o += fmt::format("       {}: {}\n", where(f.lines[j].loc), f.lines[j].note);
    if (f.lines.size() > max_lines) o += fmt::format("       ... {} more lines\n", f.lines.size() - max_lines);
  }
  return o;
}

std::string AnalysisReport::to_json() const {
  sim::Json o = sim::Json::object();
  o["kernel"] = kernel;
  o["config"] = config;
  o["total_time_ns"] = sim::json_ns(total_ns);
  o["instructions"] = instructions;
  o["bottleneck"] = bottleneck;
  o["top_share_percent"] = sim::json_number(top_share_percent);
  o["tensor_useful_ns"] = sim::json_ns(tensor_useful_ns);
  o["bounds"] = json_list(bounds, [](const Bound& b) { return sim::Json{{"name", b.name}, {"ns", sim::json_ns(b.ns)}, {"what", b.what}}; });
  o["idle"] = json_list(idle, [](const EngineIdle& e) {
    return sim::Json{{"engine", e.engine},   {"busy_ns", sim::json_ns(e.busy_ns)}, {"wait_ns", sim::json_ns(e.wait_ns)}, {"other_wait_ns", sim::json_ns(e.other_wait_ns)},
                     {"tail_ns", sim::json_ns(e.tail_ns)}, {"waited_on", pairs_json(e.waited_on)}};
  });
  o["critical_path"] = sim::Json{{"available", critical_path},
                                 {"by_track", pairs_json(critical_path_by_track)},
                                 {"lines", json_list(critical_path_lines, line_json)}};
  o["findings"] = json_list(findings, [](const Finding& f) {
    return sim::Json{{"kind", f.kind},           {"title", f.title},
                     {"detail", f.detail},       {"saving_ns", sim::json_ns(f.saving_ns)}, {"method", f.method.empty() ? std::string("bound") : f.method},
                     {"metrics", pairs_json(f.metrics)}, {"lines", json_list(f.lines, line_json)}};
  });
  return sim::dump_json(o, 2) + "\n";
}

}  // namespace nsim::engines
