#pragma once
/// SBUF/PSUM storage of a kernel's tiles, as the Neuron compiler allocates it (spec compiler.md §4):
/// a tile's storage is needed only from its first access to its last; tiles whose lifetimes do not
/// overlap share storage; a tile allocated inside a loop body gets rotating buffers (compiler.loop_buffers
/// when capacity allows, at most one per instance, down to 1 when it does not; Tensor::bufs > 0 is a manual
/// count).
///
/// Lifetimes are positions in a preorder walk of the statement tree (every statement — alloc, loop,
/// op — gets the next number; a loop's span is its own number through the last number in its body).
/// A use inside a loop nested deeper than the tile's alloc statement covers that whole loop (the
/// tile is live across all its iterations); a use outside the loop that allocates the tile (Python
/// scoping: reading the last iteration's tile) covers that whole loop too. A tile without accesses
/// lives at its alloc statement only. Static lifetimes then overlap exactly when the tiles can be
/// live at the same time at run time, so tiles with disjoint lifetimes may share bytes. A tile with
/// more than one rotating buffer keeps them across the whole loop it rotates over (consecutive
/// iterations overlap: that is what the buffers are for), so tiles of the same loop body do not
/// share its bytes; with one buffer it shares from its last access on.
///
/// When the tiles do not fit even with one buffer each, a fallback splits tiles of straight-line code
/// (accesses at the alloc's loop level, constant indices) into value-level live ranges by a backward
/// liveness pass over their elements: kernels traced with loops unrolled reuse one tile for many
/// values, so whole-tile lifetimes overlap where the values never do (see allocate.cpp).
///
/// `compiler.allocation: static` (CoreParams::static_allocation) gives every tile its own region
/// for the whole kernel, in tensor-id order (nsim's behaviour before liveness allocation).
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "engines/params.h"
#include "frontend/ir.h"
#include "frontend/lower.h"

namespace nsim::frontend {

/// Statement positions (preorder, inclusive) over which a tile's storage is live.
struct TileLifetime {
  int64_t first = -1, last = -1;  ///< -1: the tensor has no alloc statement (not a tile)
  bool in_loop = false;           ///< its alloc sits inside a loop with a trip count > 1
};

/// The result of allocate_tiles().
struct AllocationPlan {
  std::vector<TilePlacement> tiles;     ///< by tensor id (tensor -1 for non-tiles); offsets from 0
  std::vector<TileLifetime> lifetimes;  ///< by tensor id
  /// Bytes per partition the placements of each space span (max over tiles of offset + stride * bufs):
  /// the region the kernel needs.
  int64_t sbuf_extent = 0, psum_extent = 0;
  /// Most bytes per partition (stride * bufs of each tile) live at one statement.
  int64_t sbuf_peak = 0, psum_peak = 0;
  int64_t statements = 0;  ///< statements numbered by the preorder walk
  /// Manual placements (`address=`) that overlap while both tiles are live, one message each.
  std::vector<std::string> warnings;
  /// PSUM tiles of a loop body sharing a bank across the loop's iterations: the pairs of equal-sized PSUM tiles
  /// (tensor ids) whose offsets may be swapped (neither then meets a tile it shares bytes with), for the Lowering's
  /// choice by timing (compiler.placement_search); empty when no two tiles of one multi-trip loop share a bank.
  std::vector<std::pair<int, int>> psum_swaps;
  /// Whether two PSUM tiles of one multi-trip loop's body share bytes (psum_swaps is filled only then) or an automatic
  /// PSUM tile's rotating buffers share banks with another tile (at most 48 PSUM tiles, none placed by hand), and
  /// some automatic PSUM loop tile has more than one buffer: the Lowering then also times the placement with one
  /// buffer per PSUM loop tile (compiler.psum_loop_buffers = 1).
  bool psum_depth_candidate = false;
  /// Automatic PSUM tiles of a multi-trip loop left with one buffer while banks stay unused (at most 48 PSUM tiles,
  /// none placed by hand): the Lowering also times the plan with two buffers for each of them in turn.
  std::vector<int> psum_deepen;
  /// Automatic SBUF tiles of a multi-trip loop that the fallback left with one buffer (SBUF too small for every
  /// loop tile's rotating buffers; at most 48, the first in tensor order): the Lowering also times the plan with
  /// two buffers for each of them in turn, the fallback then taking buffers from the others.
  std::vector<int> sbuf_deepen;
  /// Instructions the kernel executes, about (ops times the trips of the loops around them): the cost of a run.
  double executed_ops = 0;
};

/// Lifetime of every tile (by tensor id). Robust to malformed kernels (bad ids, shared loops).
std::vector<TileLifetime> tile_lifetimes(const Kernel& k);

/// Buffer depth and placement of every tile (see Lowering::plan_tiles for the rules they keep).
/// `sbuf_avail` / `psum_avail`: bytes per partition available (-1 = the whole memory). Throws E204 /
/// E206 naming the tiles live at the point of peak use when the tiles cannot fit even with one
/// buffer each for the automatic ones.
AllocationPlan allocate_tiles(const Kernel& k, const engines::CoreParams& p, int64_t sbuf_avail = -1,
                              int64_t psum_avail = -1);

}  // namespace nsim::frontend
