#pragma once
// Small helpers to build instruction streams against a Simulator in tests.
#include <catch2/catch.hpp>

#include <memory>
#include <string>
#include <vector>

#include "engines/simulator.h"

namespace nsim::test {

using isa::AluOp;
using isa::Engine;
using isa::Instr;
using isa::Opcode;
using isa::Operand;
using isa::Space;

inline std::unique_ptr<Simulator> make_sim(const std::string& preset, std::vector<std::string> overrides = {},
                                           bool numerics = false) {
  SimOptions o;
  o.numerics = numerics;
  return Simulator::from_preset(preset, overrides, o);
}

inline Instr instr(Opcode op, Engine eng, std::initializer_list<Operand> ops) { return isa::make_instr(op, eng, ops); }

/// [rows, cols] view of an HBM tensor starting at row0.
inline Operand hbm_rows(const memory::HbmTensor& t, int64_t row0, uint32_t rows) {
  Operand o = t.whole();
  o.offset = t.addr + row0 * o.partition_step * dtype_bytes(t.dtype);
  o.num_partitions = rows;
  return o;
}

/// Nanoseconds of a Ps duration.
inline double ns(sim::Ps t) { return sim::ps_to_ns(t); }

}  // namespace nsim::test
