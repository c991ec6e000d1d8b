#pragma once
/// Verification and lowering of a frontend::Kernel onto a Simulator.
///
/// Lowering walks the statement tree with an explicit stack, one instruction at a time (a
/// generator: kernels of millions of instructions never sit in memory). Tiles get SBUF/PSUM
/// addresses from the Simulator's allocator when lowering starts; a tile allocated inside a loop gets
/// `bufs` rotating copies (automatic: 2 inside loops, 1 outside, fewer if capacity is short), so the
/// DMA of iteration i+1 can overlap the compute of iteration i while reuse of a buffer creates the
/// write-after-read dependency it would on hardware. nc_matmul becomes load_stationary +
/// multiply_moving. DMA transfers are split into descriptors by the DMA model (memory/dma.h).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engines/simulator.h"
#include "frontend/ir.h"

namespace nsim::frontend {

/// Check the kernel before anything runs, for every loop iteration (affine index ranges are checked
/// with interval arithmetic, so this is exact and does not enumerate iterations): names, shapes and
/// dtypes per operand, buffer legality per slot, partitions <= limit, matmul and PSUM limits of the
/// generation, SBUF/PSUM capacity of the tiles (with their rotating buffers), index ranges in bounds,
/// outputs written, affine_range iterations writing one location. Throws nsim::Error with the op,
/// operand, expected vs found and the op's source line.
void verify_kernel(const Kernel& k, const engines::CoreParams& p);

/// Where a tile was placed.
struct TilePlacement {
  int tensor = -1;
  int64_t offset = 0;     ///< byte offset of buffer 0 within each partition
  int64_t stride = 0;     ///< bytes between rotating buffers
  int bufs = 1;
};

/// Lowers a verified kernel onto `sim` (which must have the kernel's HBM tensors allocated under
/// their names, or lets Lowering allocate them: see allocate_hbm).
class Lowering {
 public:
  Lowering(const Kernel& k, Simulator& sim);
  /// Allocate every HBM tensor of the kernel in `sim` (inputs and outputs), if not already there.
  static void allocate_hbm(const Kernel& k, Simulator& sim);

  /// Produce the next instruction; false when the kernel is done.
  bool next(isa::Instr& out);
  /// Lower and submit every instruction to the simulator.
  void run();

  const std::vector<TilePlacement>& placements() const { return placements_; }
  uint64_t instructions() const { return emitted_; }

 private:
  struct Frame {
    const std::vector<Stmt>* body;
    size_t pc;
    int loop;  ///< loop id whose body this is, -1 at top level
  };
  bool lower_op(const Op& op, isa::Instr& out);
  isa::Operand operand(const Access& a) const;

  const Kernel& k_;
  Simulator& sim_;
  std::vector<TilePlacement> placements_;  ///< by tensor id (tensor -1 for non-tiles)
  std::vector<int64_t> alloc_count_;       ///< per tensor: executions of its alloc (buffer rotation)
  std::vector<int64_t> vars_;              ///< loop variable values by loop id
  std::vector<uint32_t> op_loc_;           ///< source-location id per op
  std::vector<Frame> stack_;
  isa::Instr pending_{};                   ///< second half of an nc_matmul
  bool has_pending_ = false;
  uint64_t emitted_ = 0;
};

}  // namespace nsim::frontend
