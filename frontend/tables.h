#pragma once
/// Queryable tables of a run, written as CSV while the simulator schedules (docs/profiling.md,
/// "Instruction and DMA tables"): one row per instruction and/or one row per DMA packet (each piece
/// of a transfer served by one DMA engine). Used by `nsim run --instructions/--dma` and by the
/// Python `nsim.export.write_tables` (through _nsim.write_tables).
///
///   Simulator sim(cfg, opts);
///   frontend::TableWriter tables(sim, "instrs.csv", "dma.csv");   // attach before submitting
///   ... submit / Lowering::run ...; sim.finish();
///   tables.close();                                               // flush (the destructor does too)
///
/// Columns, in this order (times in ns with 3 decimals, i.e. exact picoseconds):
///   instructions: index, opcode, engine, start_ns, end_ns, duration_ns, dma_queue, bytes, src_file,
///                 src_line, wait_ns, waited_for, ready_ns, waited_on
///   dma:          transfer, engine_idx, queue, trigger_engine, start_ns, end_ns, duration_ns, bytes,
///                 descriptors, throughput_gbps, src_space, dst_space, src_file, src_line
/// Text fields are quoted as RFC 4180 wants when they hold a comma, quote or line break.
#include <cstdint>
#include <memory>
#include <string>

namespace nsim {
class Simulator;
}

namespace nsim::frontend {

/// Header lines (without the newline) of the two tables.
extern const char* const kInstructionTableHeader;
extern const char* const kDmaTableHeader;

class TableWriter {
 public:
  /// Open the files (an empty path = that table is not written) and attach to `sim` as an
  /// instruction listener. Throws kCannotWrite when a file cannot be written. The listener stays
  /// registered with the simulator but does nothing once this writer is closed or destroyed.
  TableWriter(Simulator& sim, const std::string& instructions_path, const std::string& dma_path);
  ~TableWriter();
  TableWriter(const TableWriter&) = delete;
  TableWriter& operator=(const TableWriter&) = delete;

  /// Flush and close both files (idempotent). Throws kCannotWrite when a write failed (disk full, ...).
  void close();
  uint64_t instruction_rows() const;
  uint64_t dma_rows() const;

  struct State;

 private:
  std::shared_ptr<State> st_;
};

}  // namespace nsim::frontend
