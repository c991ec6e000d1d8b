#pragma once
/// TensorE timing: a LoadStationary pipe that loads the next weights in the background, a
/// MultiplyMoving pipe, and power throttling (neuroncore.md 3.1, 3.4).
#include <algorithm>
#include <array>
#include <vector>

#include "engines/cost.h"
#include "engines/params.h"
#include "sim/time.h"

namespace nsim::engines {

/// TensorE's two pipes, per cell of the PE array (PE tiling, neuroncore.md 2.4 and 3.1: matmuls on disjoint tiles
/// run side by side). The array is a grid of cells of the smallest tile (tensor.row_tile_min x col_tile_min); an
/// instruction occupies the cells of its tile (all of them untiled) and starts when all of them can. Until a tiled
/// instruction comes every cell holds the same state, kept once (`whole_`): an untiled kernel is timed as before.
class TensorPipes {
 public:
  explicit TensorPipes(const CoreParams& p)
      : p_(p), clk_(p.clk(isa::Engine::kTensor)), rows_(p.pe_rows / std::max(1, p.row_tile_min)),
        cols_(p.pe_cols / std::max(1, p.col_tile_min)) {}

  /// The cells [r0, r1) x [c0, c1) of the grid an instruction occupies; `all`: every cell.
  struct Tile {
    int r0 = 0, r1 = 0, c0 = 0, c1 = 0;
    bool all = true;
  };
  /// The tile of a load_stationary / multiply_moving (iimm[0..3], nki-api.md 2.1); the whole array when untiled
  /// (iimm[2] = 0) and for every other instruction (a PE transpose).
  Tile tile_of(const isa::Instr& in) const { return in.iimm[2] <= 0 ? Tile{0, rows_, 0, cols_, true} : tile_in(in); }
  int cells() const { return rows_ * cols_; }

  struct Slot {
    sim::Ps start = 0;
    sim::Ps ii = 0;   ///< time until the pipe may issue again (after throttling)
    sim::Ps end = 0;  ///< start + ii + latency
    double limit = 1; ///< throttle utilisation limit applied
  };
  /// LoadStationary of `ii_cycles` on tile `t`, ready at `ready`: waits for the previous MM to take the weights.
  /// kWhole: an untiled instruction while no tile was ever used (the one state; `t` unused).
  template <bool kWhole>
  Slot load_stationary(sim::Ps ready, double ii_cycles, const Tile& t);
  /// MultiplyMoving / PE transpose of `ii_cycles`, ready at `ready`, using the last loaded weights.
  /// `needs_ls_pipe` (transposes) also waits for the LS pipe, since the data goes in as weights.
  template <bool kWhole>
  Slot multiply(sim::Ps ready, double ii_cycles, bool needs_ls_pipe, const Tile& t);
  /// A PE transpose: multiply() with the LS pipe, or, with tensor.background_transpose (gen4) and the array
  /// untiled, on the background lane when that one can start it first (still in issue order).
  template <bool kWhole>
  Slot transpose(sim::Ps ready, double ii_cycles, const Tile& t);
  bool tiled() const { return tiled_; }  ///< some instruction used a tile (the cells hold the state since)
  /// Earliest time the next Tensor instruction could start (for trace watermarks): on the cell that frees first.
  sim::Ps next_issue() const {
    const sim::Ps t = tiled_ ? next_issue_of_cells() : std::min(whole_.ls_free, whole_.mm_free);
    return bg_used_ ? std::min(t, bg_.mm_free) : t;
  }
  /// The same for an instruction on tile `t` (the list scheduler's estimate): once tiles are in use, when the MM
  /// pipes of all its cells are free, and not before the last TensorE instruction started (the engine issues in
  /// order: a matmul on a free tile overlaps the ones still streaming on others, it does not pass them).
  sim::Ps next_issue(const Tile& t) const;
  sim::Ps throttled_time() const { return throttled_; }
  /// The pipes' state (fast-forward, Simulator::timing_digest): when each pipe frees up and the weights are
  /// ready, passed to `time` (absolute times); the power throttle's state as later matmuls will see it, to `raw`
  /// relative to `base`. No later matmul starts before the watermark `w`, so its trailing window starts at
  /// w - window or later: the busy intervals that window can still see (the part of one straddling w - window
  /// that it cannot see left out: a window clips the oldest interval), and where the ramp stands unless it ended
  /// (w - ramp start >= max(ramp, window): the limit is then 1 and the window always checked, whatever the start).
  /// Each interval itself: their count, summed length and the two ends leave out how the others lie, which
  /// decides what a later window clips; intervals the window can no longer see are left out (they only wait to
  /// be dropped), and so is where a ramp that has ended started.
  template <class Time, class Raw>
  void state(sim::Ps base, sim::Ps w, Time&& time, Raw&& raw) const {
    for (sim::Ps t : {whole_.ls_free, whole_.mm_free, whole_.mm_last_start, whole_.weights_ready}) time(t);
    raw(tiled_);
    raw(bg_used_);
    if (bg_used_) time(bg_.mm_free), time(last_start_);
    for (const Cell& c : cells_)
      for (sim::Ps t : {c.ls_free, c.mm_free, c.mm_last_start, c.weights_ready}) time(t);
    if (!p_.throttle.enabled) return;
    const sim::Ps far = std::max(p_.throttle.ramp, p_.throttle.window);
    raw(!started_ ? -1 : w - ramp_start_ >= far ? -2 : base - ramp_start_);
    time(busy_end_);  // (a later interval starts at it or after)
    const sim::Ps lo = w - p_.throttle.window;
    int seen = 0;
    for (int i = 0; i < count_; ++i) {
      const auto& [s, e] = ring_[static_cast<size_t>((head_ + i) % kRing)];
      if (e <= lo) continue;
      raw(std::max(s, lo) - base);
      raw(e - base);
      ++seen;
    }
    raw(seen);
  }

 private:
  double throttle_limit(sim::Ps t);
  void note_busy(sim::Ps s, sim::Ps e);

  /// One cell's pipes: when each pipe frees up, when its last MultiplyMoving started, when its weights are loaded.
  struct Cell {
    sim::Ps ls_free = 0, mm_free = 0, mm_last_start = 0, weights_ready = 0;
  };
  Slot load_stationary_on(Cell& c, sim::Ps ready, double ii_cycles);
  Slot multiply_on(Cell& c, sim::Ps ready, double ii_cycles, bool needs_ls_pipe);
  /// The state of a tile (the latest of its cells' times; the first tiled instruction makes the cells) and, after
  /// the instruction, its cells set to `c`.
  Cell gather_cells(const Tile& t);
  void scatter_cells(const Tile& t, const Cell& c);
  Tile tile_in(const isa::Instr& in) const;  ///< tile_of a tiled matmul half
  sim::Ps next_issue_of_cells() const;

  const CoreParams& p_;
  sim::ClockDomain clk_;
  int rows_, cols_;  ///< cells of the grid along each side
  Cell whole_;       ///< every cell's state while tiled_ is false; afterwards unused
  Cell bg_;          ///< the background transpose lane (tensor.background_transpose)
  bool bg_used_ = false;  ///< a transpose ran on it: untiled instructions then also wait for last_start_ (in order)
  bool tiled_ = false;
  std::vector<Cell> cells_;  ///< by row * cols_ + column, made at the first tiled instruction (out of the hot object)
  sim::Ps busy_end_ = 0;  ///< the end of the last busy interval noted (tiles overlap: the throttle sees their union)
  sim::Ps last_start_ = 0;  ///< the start of the last instruction issued (in-order issue across tiles)
  // Throttle state: ramp start and a ring of recent MM busy intervals (bounded: no allocation).
  bool started_ = false;
  sim::Ps ramp_start_ = 0;
  static constexpr int kRing = 1024;
  std::array<std::pair<sim::Ps, sim::Ps>, kRing> ring_{};
  int head_ = 0, count_ = 0;
  sim::Ps ring_sum_ = 0;
  sim::Ps throttled_ = 0;
};

/// TensorE as one in-order engine: its pipes and the weights it holds (their dtype and rows, which
/// the next MultiplyMoving's cost and FLOPs depend on).
class TensorEngine {
 public:
  explicit TensorEngine(const CoreParams& p) : p_(p), pipes_(p), cols_(p.pe_cols / std::max(1, p.col_tile_min)) {}

  struct Issue {
    TensorPipes::Slot slot;
    double flops = 0;           ///< MAC = 2
    double adjusted_flops = 0;  ///< bf16-equivalent (CoreParams::adjusted_flops of the input dtypes)
  };
  /// Issue LoadStationary, MultiplyMoving or a PE transpose whose operands are ready at `ready`.
  Issue issue(const isa::Instr& in, sim::Ps ready) {
    // Untiled while no tile was ever used: the whole array's one state (as before PE tiling, at its cost).
    return in.iimm[2] <= 0 && !pipes_.tiled() ? issue_on<true>(in, ready) : issue_on<false>(in, ready);
  }
  /// Its II (before throttling) and start-to-end duration if `in` were issued now.
  sim::Ps busy_estimate(const isa::Instr& in) const;
  sim::Ps duration_estimate(const isa::Instr& in) const;
  sim::Ps next_issue() const { return pipes_.next_issue(); }
  /// next_issue() of `in` (its PE tile's cells once tiles are in use).
  sim::Ps next_issue(const isa::Instr& in) const { return pipes_.tiled() ? pipes_.next_issue(pipes_.tile_of(in)) : next_issue(); }
  bool tiled() const { return pipes_.tiled(); }
  sim::Ps throttled_time() const { return pipes_.throttled_time(); }
  const TensorPipes& pipes() const { return pipes_; }
  /// The weights held (their dtype and rows: the next MultiplyMoving's cost depends on them), passed to `raw`
  /// (fast-forward, Simulator::timing_digest): once, or per cell of the PE array once tiles hold their own.
  template <class Raw>
  void weights_state(Raw&& raw) const {
    raw(uniform_);
    raw(static_cast<int64_t>(whole_.dtype));
    raw(whole_.m);
    if (!uniform_)
      for (const Weights& w : cells_) {
        raw(static_cast<int64_t>(w.dtype));
        raw(w.m);
      }
  }

 private:
  struct Weights {
    DType dtype = DType::kBFloat16;
    int64_t m = 0;
  };
  const CoreParams& p_;
  TensorPipes pipes_;
  /// The weights of a tile (those of its first cell) and, at a LoadStationary, of each of its cells.
  const Weights& weights_of(const TensorPipes::Tile& t) const {
    return uniform_ ? whole_ : cells_[static_cast<size_t>(t.r0 * cols_ + t.c0)];
  }
  template <bool kWhole>
  Issue issue_on(const isa::Instr& in, sim::Ps ready);  ///< issue(); kWhole as TensorPipes'
  void load_weights(const TensorPipes::Tile& t, const Weights& w) {
    if (t.all) {
      whole_ = w;
      uniform_ = true;
    } else {
      load_tile_weights(t, w);
    }
  }
  void load_tile_weights(const TensorPipes::Tile& t, const Weights& w);
  Weights whole_;        ///< every cell's weights while uniform_
  bool uniform_ = true;  ///< every cell holds whole_ (no tiled LoadStationary yet, or a whole-array one since)
  std::vector<Weights> cells_;  ///< by cell, as TensorPipes numbers them (made at the first tiled LoadStationary)
  int cols_;  ///< cells per row of the grid
};

}  // namespace nsim::engines
