#pragma once
/// The Perfetto/Chrome trace of a run, written by a listener of the Simulator's schedule (as the
/// analyzer is): one slice per instruction on its engine's track (a DMA: its trigger), one per piece
/// of a transfer on its DMA engine's track, one per transfer on its queue's track, and a flow arrow
/// from each producer an instruction waited for. The Simulator owns the sink and its watermark; this
/// class only formats.
#include <cstdint>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "engines/simulator.h"

namespace nsim::engines {

class TraceRecorder {
 public:
  /// Declares the engine and DMA-engine tracks on `sink`.
  TraceRecorder(const Simulator& sim, sim::TraceSink& sink);
  /// The listener: called after each instruction is scheduled.
  void on_instr(const isa::Instr& in, const InstrTiming& t);
  /// Slices offered to the sink so far (written or dropped): fast-forward counts a skipped iteration's.
  uint64_t slices() const { return slices_; }

 private:
  void instr_slice(const isa::Instr& in, int track, const InstrTiming& t, sim::Ps end);
  void dma_slices(const isa::Instr& in, const InstrTiming& t);
  /// A source location's text (`file:line (function)`), formatted once per location.
  const std::string& src_text(uint32_t loc);
  std::vector<std::string> src_text_;
  uint64_t slices_ = 0;
  /// Simulator::skipped_time() for the instruction being recorded (0 unless fast-forward skipped iterations).
  sim::Ps off_ = 0;

  const Simulator& sim_;
  sim::TraceSink& sink_;
  std::vector<bool> queue_declared_;
  /// Where an instruction's slice starts (track, time): arrows from producers to waiters.
  struct SliceAt {
    uint64_t index = UINT64_MAX;  ///< the instruction it belongs to (UINT64_MAX: empty)
    int track = 0;
    sim::Ps start = 0;
  };
  /// By instruction index; with a bounded sink (--trace-limit, --trace-window) a ring of the last
  /// kFlowWindow instructions, so memory does not grow with the run (an arrow from an older producer
  /// is left out).
  std::vector<SliceAt> slice_at_;
  bool ring_ = false;
  static constexpr size_t kFlowWindow = size_t{1} << 16;
  SliceAt& slot(uint64_t index);
  const SliceAt* find(uint64_t index) const;
};

}  // namespace nsim::engines
