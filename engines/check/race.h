#pragma once
/// The sanitizer's cross-core check (dma-race, NSIM-W506): the two physical cores of an LNC=2 launch
/// share HBM and nothing orders their instructions but sendrecv / core_barrier rendezvous (docs/lnc.md).
/// A DMA of one core that touches shared-HBM bytes a DMA of the other core writes (or writes bytes
/// the other core reads) is a race unless a rendezvous separates them in the schedule: the earlier
/// access ends at or before the rendezvous and the later one starts at or after it. On hardware such a
/// pair gives whichever value the timing of the day lets through; in the simulation it works or not by
/// the modelled timing alone, so it is reported whether or not the two overlap in simulated time.
///
/// Accesses are recorded exactly (every contiguous run of bytes of an access pattern, not its extent),
/// so cores writing interleaved columns of one tensor are not reported. Two accumulating DMAs
/// (accumulate flag: dst_rmw_op, nl.atomic_rmw; read-modify-write in the DMA engine) to the same bytes are a reduction,
/// not a race. The runtime-indexed side of an indirect DMA is not checked (its rows are values).
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "engines/check/checker.h"
#include "isa/isa.h"
#include "sim/time.h"

namespace nsim::engines {

class RaceChecker {
 public:
  /// One access of a DMA to HBM, as the driver saw it issue.
  struct Access {
    sim::Ps start = 0, end = 0;
    uint64_t index = 0;  ///< program-order index on its core
    uint32_t loc = 0;    ///< source id on its core
    isa::Opcode op = isa::Opcode::kDmaCopy;
    uint8_t core = 0;
    bool accumulate = false;
  };
  /// The HBM tensor holding a byte address (name, first byte), and a core's source location (for reports).
  using Namer = std::function<std::pair<std::string, int64_t>(int64_t addr)>;
  using Locator = std::function<SourceLoc(int core, uint32_t loc)>;

  RaceChecker(Namer namer, Locator locator) : namer_(std::move(namer)), locator_(std::move(locator)) {}

  /// A rendezvous (sendrecv / core_barrier) released both cores at `t` (non-decreasing).
  void rendezvous(sim::Ps t) { rendezvous_.push_back(t); }
  /// Instruction `in` of core `core` was issued with this timing: record its HBM accesses and report
  /// the first unordered conflict with the other core (counting the rest).
  void issued(const isa::Instr& in, int core, sim::Ps start, sim::Ps end, uint64_t index);

  const std::vector<CheckReport>& reports() const { return reports_; }

 private:
  struct Seg {
    int64_t hi = 0;
    int writer[2] = {-1, -1};  ///< index into acc_ of each core's last write, -1: none
    int reader[2] = {-1, -1};  ///< each core's last read
  };
  void touch(int64_t lo, int64_t hi, int access, bool write);
  bool ordered(const Access& earlier, const Access& later) const;
  void conflict(const Access& prev, bool prev_write, const Access& cur, bool cur_write, int64_t lo, int64_t hi);
  std::map<int64_t, Seg>::iterator split(int64_t at);

  Namer namer_;
  Locator locator_;
  std::vector<sim::Ps> rendezvous_;
  std::vector<Access> acc_;          ///< every recorded access (referenced by segments)
  std::map<int64_t, Seg> segs_;      ///< disjoint byte ranges [key, hi) of shared HBM touched so far
  std::vector<CheckReport> reports_;
};

}  // namespace nsim::engines
