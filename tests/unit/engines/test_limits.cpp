// Resource limits of a run (issue 16): SimOptions::max_instructions and max_sim_time_ns stop a run
// with E416, SimOptions::stop (set by a signal handler) with E417, between two instructions, and the
// simulator stays usable: finish() and stats() describe the partial run. HBM tensors that the host
// cannot hold are refused with E210 naming the tensor.
#include <catch2/catch.hpp>

#include <csignal>
#include <functional>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "kernel_builder.h"

using namespace nsim;
using namespace nsim::test;

namespace {

std::unique_ptr<Simulator> sim_with(SimOptions o) {
  o.numerics = false;
  return Simulator::from_preset("trn2", {}, o);
}

Instr add(Simulator& s) {
  const Operand a = s.alloc_tile(Space::kSbuf, 128, {512}, DType::kFloat32);
  const Operand b = s.alloc_tile(Space::kSbuf, 128, {512}, DType::kFloat32);
  const Operand c = s.alloc_tile(Space::kSbuf, 128, {512}, DType::kFloat32);
  Instr tt = instr(Opcode::kTensorTensor, Engine::kVector, {c, a, b});
  tt.alu0 = AluOp::kAdd;
  return tt;
}

ErrorCode code_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.code();
  }
  return ErrorCode::kInternal;
}

}  // namespace

TEST_CASE("limits: max_instructions stops the run with E416 and keeps the partial stats", "[limits]") {
  SimOptions o;
  o.max_instructions = 10;
  auto s = sim_with(o);
  const Instr tt = add(*s);
  for (int i = 0; i < 10; ++i) s->submit(tt);
  try {
    s->submit(tt);
    FAIL("the 11th instruction was accepted");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kResourceLimit);
    CHECK(std::string(e.what()).find("--max-instructions") != std::string::npos);
  }
  s->finish();
  CHECK(s->instructions() == 10);
  CHECK(s->stats().get("engine.vector.instruction_count") == 10);
}

TEST_CASE("limits: max_sim_time_ns stops the run once the simulated time passed it", "[limits]") {
  SimOptions o;
  o.max_sim_time_ns = 1000;
  auto s = sim_with(o);
  const Instr tt = add(*s);
  CHECK(code_of([&] {
          for (int i = 0; i < 100000; ++i) s->submit(tt);
        }) == ErrorCode::kResourceLimit);
  CHECK(sim::ps_to_ns(s->total_time()) > 1000);
  CHECK(s->instructions() < 100000);
  s->finish();
}

TEST_CASE("limits: no limit by default", "[limits]") {
  auto s = sim_with({});
  const Instr tt = add(*s);
  for (int i = 0; i < 1000; ++i) s->submit(tt);
  s->finish();
  CHECK(s->instructions() == 1000);
}

TEST_CASE("limits: the stop flag (a signal) stops the run with E417 and the trace stays valid JSON", "[limits]") {
  volatile std::sig_atomic_t stop = 0;
  const std::string path = "test_limits_trace.json";
  SimOptions o;
  o.stop = &stop;
  o.trace_path = path;
  {
    auto s = sim_with(o);
    const Instr tt = add(*s);
    for (int i = 0; i < 5; ++i) s->submit(tt);
    stop = SIGINT;
    CHECK(code_of([&] { s->submit(tt); }) == ErrorCode::kInterrupted);
    CHECK(code_of([&] { s->check_stop(); }) == ErrorCode::kInterrupted);
    s->finish();
    CHECK(s->instructions() == 5);
  }
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string t = ss.str();
  REQUIRE(t.size() > 2);
  CHECK(t.find("\"traceEvents\"") != std::string::npos);
  CHECK(t[t.find_last_not_of(" \n")] == '}');  // closed, not cut off
  std::remove(path.c_str());
}

TEST_CASE("limits: an HBM tensor the host cannot hold is E210 naming the tensor and the bytes", "[limits]") {
  // 2^40 bytes (1 TiB) of fp32 data: more than any test machine has, within an enlarged HBM capacity.
  SimOptions o;
  o.numerics = true;
  auto s = Simulator::from_preset("trn2", {"hbm.capacity=1e15"}, o);
  try {
    s->alloc_hbm("huge", {1 << 20, 1 << 18}, DType::kFloat32);
    FAIL("a 1 TiB tensor was allocated");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kHostMemory);
    const std::string m = e.what();
    CHECK(m.find("'huge'") != std::string::npos);
    CHECK(m.find("1099511627776") != std::string::npos);
  }
  // Timing-only keeps no data: the same tensor costs only dependency tracking.
  auto t = Simulator::from_preset("trn2", {"hbm.capacity=1e15", "sim.hbm_dep_chunk_bytes=1e9"}, SimOptions{false});
  CHECK(t->alloc_hbm("huge", {1 << 20, 1 << 18}, DType::kFloat32).bytes == int64_t{1} << 40);
}
