#include "frontend/disasm.h"

#include <fmt/format.h>

#include "frontend/lower.h"

namespace nsim::frontend {

namespace {
struct Enough {};  // thrown by the listener once `limit` instructions are listed
}  // namespace

Disassembly disassemble_kernel(const Kernel& k, const sim::Config& cfg, int64_t limit) {
  SimOptions opts;
  opts.numerics = false;
  Simulator sim(cfg, opts);
  verify_kernel(k, sim.params());
  Lowering::allocate_hbm(k, sim);
  Lowering low(k, sim);
  Disassembly d;
  for (const auto& pl : low.placements())
    if (pl.tensor >= 0)
      d.tiles.push_back(fmt::format("tile {:<16} {} offset {:>7} bufs {} (stride {})",
                                    k.tensors[static_cast<size_t>(pl.tensor)].name,
                                    isa::space_name(k.tensors[static_cast<size_t>(pl.tensor)].space), pl.offset, pl.bufs,
                                    pl.stride));
  if (limit == 0) return d;
  sim.add_instr_listener([&](const isa::Instr& in, const InstrTiming& t) {
    const std::string loc = sim.source(in.loc).str();
    const std::string names = low.operand_names(low.op_of_source(in.loc));  // the kernel's tensor names
    d.instructions.push_back(fmt::format("{}   @ {:.1f} ns{}{}", isa::disassemble(in), sim::ps_to_ns(t.start),
                                         loc.empty() ? "" : "   ; " + loc, names.empty() ? "" : "   [" + names + "]"));
    if (limit > 0 && static_cast<int64_t>(d.instructions.size()) >= limit) throw Enough{};
  });
  try {
    low.run();
  } catch (const Enough&) {
  }
  return d;
}

}  // namespace nsim::frontend
