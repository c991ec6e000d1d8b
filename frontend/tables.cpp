#include "frontend/tables.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>

#include "engines/deps.h"
#include "engines/simulator.h"
#include "isa/isa.h"
#include "sim/error.h"

namespace nsim::frontend {

const char* const kInstructionTableHeader =
    "index,opcode,engine,start_ns,end_ns,duration_ns,dma_queue,bytes,src_file,src_line,wait_ns,waited_for,ready_ns,"
    "waited_on,src_stack,act_table_load_ns";
const char* const kDmaTableHeader =
    "transfer,engine_idx,queue,trigger_engine,start_ns,end_ns,duration_ns,bytes,descriptors,throughput_gbps,src_space,"
    "dst_space,src_file,src_line";

namespace {

using File = std::unique_ptr<std::FILE, int (*)(std::FILE*)>;

File open_csv(const std::string& path, const char* header) {
  File f(nullptr, &std::fclose);
  if (path.empty()) return f;
  f.reset(std::fopen(path.c_str(), "w"));
  if (!f) throw Error(ErrorCode::kCannotWrite, fmt::format("cannot write '{}'", path));
  std::setvbuf(f.get(), nullptr, _IOFBF, 1 << 20);
  fmt::print(f.get(), "{}\n", header);
  return f;
}

// A CSV text field: as is, or quoted (quotes doubled) when it holds a separator, quote or line break.
std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

}  // namespace

struct TableWriter::State {
  Simulator* sim = nullptr;
  File instr{nullptr, &std::fclose};
  File dma{nullptr, &std::fclose};
  std::string instr_path, dma_path;
  uint64_t instr_rows = 0, dma_rows = 0;
  bool open = false;

  void on_instr(const isa::Instr& in, const InstrTiming& t) {
    if (!open) return;
    const bool is_dma = isa::is_dma(in.op);
    const SourceLoc& loc = sim->source(in.loc);
    const std::string file = csv_field(loc.file);
    // Bytes of a DMA: what its DMA engines moved (the sum of the dma table's rows of the transfer).
    uint64_t bytes = 0;
    if (is_dma) {
      const memory::DmaSplit& split = sim->last_dma_split();
      for (int k = 0; k < split.engines; ++k) bytes += static_cast<uint64_t>(std::max<int64_t>(0, split.piece[static_cast<size_t>(k)].bytes));
    }
    if (instr) {
      // Semaphore wait: the engine could have issued the instruction (free) before its operands
      // were ready; waited_for names the producer that set `ready` (as the trace's wait_ns).
      const sim::Ps wait = std::max<sim::Ps>(0, std::min(t.ready, t.start) - t.free);
      const bool waited = wait > 0 && t.waited_for >= 0;
      std::string waited_on;
      if (waited)
        waited_on = t.waited_class == engines::kClassDma ? std::string("dma")
                                                         : std::string(isa::engine_name(static_cast<isa::Engine>(t.waited_class)));
      fmt::print(instr.get(), "{},{},{},{:.3f},{:.3f},{:.3f},{},{},{},{},{:.3f},{},{:.3f},{},{},{:.3f}\n", t.index,
                 isa::op_info(in.op).mnemonic, isa::engine_name(in.engine), sim::ps_to_ns(t.start),
                 sim::ps_to_ns(t.end), sim::ps_to_ns(t.end - t.start), is_dma ? std::to_string(in.dma_queue) : "",
                 bytes, file, loc.line, sim::ps_to_ns(wait), waited ? std::to_string(t.waited_for) : "",
                 sim::ps_to_ns(t.ready), waited_on, csv_field(loc.stack), sim::ps_to_ns(t.table_load));
      ++instr_rows;
    }
    if (dma && is_dma) {
      const memory::DmaSplit& split = sim->last_dma_split();
      const engines::DmaEngines::Transfer& tr = sim->last_dma_transfer();
      const std::string_view src_space = isa::space_name(in.slot(1).space), dst_space = isa::space_name(in.slot(0).space);
      const std::string_view trigger = isa::engine_name(in.engine);
      for (int k = 0; k < split.engines; ++k) {
        const auto ki = static_cast<size_t>(k);
        const memory::DmaPiece& p = split.piece[ki];
        if (p.bytes <= 0) continue;
        const sim::Ps dur = tr.piece_end[ki] - tr.piece_start[ki];
        // bytes per ns = GB/s; empty (NULL) for a zero-length packet
        const std::string gbps = dur > 0 ? fmt::format("{:.3f}", static_cast<double>(p.bytes) / sim::ps_to_ns(dur)) : "";
        fmt::print(dma.get(), "{},{},{},{},{:.3f},{:.3f},{:.3f},{},{},{},{},{},{},{}\n", t.index, k, in.dma_queue,
                   trigger, sim::ps_to_ns(tr.piece_start[ki]), sim::ps_to_ns(tr.piece_end[ki]), sim::ps_to_ns(dur),
                   p.bytes, p.descriptors, gbps, src_space, dst_space, file, loc.line);
        ++dma_rows;
      }
    }
  }

  void close() {
    if (!open) return;
    open = false;
    std::string failed;
    for (auto* f : {&instr, &dma}) {
      if (!*f) continue;
      const bool bad = std::ferror(f->get()) != 0;
      const int rc = std::fclose(f->release());
      if ((bad || rc != 0) && failed.empty()) failed = f == &instr ? instr_path : dma_path;
    }
    if (!failed.empty()) throw Error(ErrorCode::kCannotWrite, fmt::format("cannot write '{}'", failed));
  }
};

TableWriter::TableWriter(Simulator& sim, const std::string& instructions_path, const std::string& dma_path)
    : st_(std::make_shared<State>()) {
  st_->sim = &sim;
  st_->instr_path = instructions_path;
  st_->dma_path = dma_path;
  st_->instr = open_csv(instructions_path, kInstructionTableHeader);
  st_->dma = open_csv(dma_path, kDmaTableHeader);
  st_->open = st_->instr || st_->dma;
  if (!st_->open) return;
  // The simulator keeps the listener; it holds the state, so a destroyed writer leaves a no-op.
  std::shared_ptr<State> s = st_;
  sim.add_instr_listener([s](const isa::Instr& in, const InstrTiming& t) { s->on_instr(in, t); });
}

TableWriter::~TableWriter() {
  try {
    st_->close();
  } catch (const Error&) {  // a destructor must not throw; call close() to see write errors
  }
}

void TableWriter::close() { st_->close(); }
uint64_t TableWriter::instruction_rows() const { return st_->instr_rows; }
uint64_t TableWriter::dma_rows() const { return st_->dma_rows; }

}  // namespace nsim::frontend
