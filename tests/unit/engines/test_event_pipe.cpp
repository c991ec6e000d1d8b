// The event pipe (engines/event_pipe.h): the analyzer and the dependency-bound schedule beside the simulation, on a
// host thread of their own. Every event reaches the consumer once, in order, whatever the two threads' speeds; an
// exception of the consumer comes back at sync(); and `nsim analyze`'s report is the same with the pipe threaded as
// with the consumer called in place.
#include <catch2/catch.hpp>

#include <chrono>
#include <random>
#include <stdexcept>
#include <thread>

#include "engines/analysis/analyzer.h"
#include "engines/event_pipe.h"
#include "isa/semantics/parallel.h"
#include "kernel_builder.h"

using namespace nsim;
using namespace nsim::test;

namespace {

/// Restores the host-thread count of the process (isa::sem::host_threads) when a test ends.
struct HostThreads {
  explicit HostThreads(int n) { isa::sem::set_host_threads_for_testing(n); }
  ~HostThreads() { isa::sem::set_host_threads_for_testing(0); }
};

}  // namespace

TEST_CASE("the event pipe hands every event to the consumer once, in order", "[events]") {
  for (const bool threaded : {true, false}) {
    // The consumer sometimes stalls (the ring fills: the producer waits, then sleeps) and the producer sometimes
    // pauses (the ring empties: the consumer sleeps, and sync() must wake it with fewer than half the ring waiting).
    uint64_t seen = 0, wrong = 0;
    engines::EventPipe pipe(
        [&](const engines::InstrEvent& ev) {
          if (ev.t.index != seen || ev.in.loc != static_cast<uint32_t>(seen % 1000)) ++wrong;
          ++seen;
          if (seen % 5000 == 0) std::this_thread::sleep_for(std::chrono::microseconds(300));
        },
        threaded);
    CHECK(pipe.threaded() == threaded);
    const uint64_t n = 40000;
    for (uint64_t i = 0; i < n; ++i) {
      engines::InstrEvent& ev = pipe.slot();
      ev.t.index = i;
      ev.in.loc = static_cast<uint32_t>(i % 1000);
      pipe.publish();
      if (i % 7919 == 0) std::this_thread::sleep_for(std::chrono::microseconds(500));
      if (i == 123 || i == 20001) {  // a few events waiting, the consumer possibly asleep
        pipe.sync();
        CHECK(seen == i + 1);
      }
    }
    pipe.sync();
    CHECK(seen == n);
    CHECK(wrong == 0);
  }
}

TEST_CASE("an exception of the event consumer comes back at the next sync, once", "[events]") {
  for (const bool threaded : {true, false}) {
    uint64_t seen = 0;
    engines::EventPipe pipe(
        [&](const engines::InstrEvent& ev) {
          ++seen;
          if (ev.t.index == 100) throw std::runtime_error("consumer failed");
        },
        threaded);
    bool thrown = false;
    try {
      for (uint64_t i = 0; i < 300; ++i) {
        pipe.slot().t.index = i;
        pipe.publish();  // (in place: the consumer's exception leaves here)
      }
      pipe.sync();
    } catch (const std::runtime_error& e) {
      thrown = std::string(e.what()) == "consumer failed";
    }
    CHECK(thrown);
    // Threaded, the events after the failing one are dropped; in place the loop stopped at it.
    CHECK(seen == 101);
    CHECK_NOTHROW(pipe.sync());
  }
}

namespace {

/// A random stream over every kind of instruction the analyzer looks at: loads (some of the same rows again),
/// stores, element-wise work on three engines (tensor_tensor on VectorE and GpSimd, activations), matmuls into PSUM and PE transposes of loaded tiles and of tiles
/// computed on chip, and copies out of PSUM.
void random_stream(Simulator& s, uint32_t seed) {
  std::mt19937 rng(seed);
  const auto& x = s.alloc_hbm("x", {1024, 512}, DType::kBFloat16);
  const auto& y = s.alloc_hbm("y", {1024, 512}, DType::kBFloat16);
  std::vector<Operand> sb;
  for (int i = 0; i < 6; ++i) sb.push_back(s.alloc_tile(Space::kSbuf, 128, {512}, DType::kBFloat16));
  const Operand st = s.alloc_tile(Space::kSbuf, 128, {128}, DType::kBFloat16);
  const Operand ps = s.alloc_tile(Space::kPsum, 128, {512}, DType::kFloat32);
  const Operand pt = s.alloc_tile(Space::kPsum, 128, {128}, DType::kBFloat16);
  std::vector<uint32_t> lines;
  for (int l = 0; l < 8; ++l) lines.push_back(s.add_source(SourceLoc{"k.py", 10 + l, "kernel"}));
  for (int i = 0; i < 3000; ++i) {
    const Operand& a = sb[rng() % sb.size()];
    const Operand& b = sb[rng() % sb.size()];
    const uint32_t line = lines[rng() % lines.size()];
    Instr in;
    switch (rng() % 8) {
      case 0:
      case 1:
        in = instr(Opcode::kDmaCopy, Engine::kSync, {a, hbm_rows(x, 128 * (rng() % 8), 128)});
        in.dma_queue = static_cast<uint8_t>(rng() % 4);
        break;
      case 2:
        in = instr(Opcode::kDmaCopy, Engine::kSync, {hbm_rows(y, 128 * (rng() % 8), 128), a});
        break;
      case 3:
        in = instr(Opcode::kTensorTensor, rng() % 2 ? Engine::kVector : Engine::kGpsimd, {a, b, sb[rng() % sb.size()]});
        in.alu0 = AluOp::kAdd;
        break;
      case 4:
        s.submit(instr(Opcode::kLoadStationary, Engine::kTensor, {st}));
        in = instr(Opcode::kMultiplyMoving, Engine::kTensor, {ps, a});
        break;
      case 5: {  // a PE transpose of a [128, 128] block (loaded, or computed on chip)
        Operand blk = a;
        blk.size[0] = 128;
        in = instr(Opcode::kMultiplyMoving, Engine::kTensor, {pt, blk});
        in.flags = isa::kIsTranspose;
        break;
      }
      case 6:
        in = instr(Opcode::kTensorCopy, Engine::kVector, {a, Operand::tile(Space::kPsum, DType::kFloat32, ps.offset, 0, 128, {512})});
        break;
      default: {
        in = instr(Opcode::kActivation, Engine::kScalar, {a, b});
        in.act = isa::ActFunc::kExp;
        break;
      }
    }
    in.loc = line;
    s.submit(in);
  }
}

std::string analysed(uint32_t seed, bool thread, sim::Ps& bound) {
  SimOptions o;
  o.numerics = false;
  o.dependency_bound = true;
  o.listener_thread = thread;
  // (Every transpose of a loaded tile reported, however small its share of TensorE's time.)
  auto s = Simulator::from_preset("trn2", {"analysis.transpose_share_percent=0"}, o);
  engines::Analyzer an(*s);
  random_stream(*s, seed);
  s->finish();
  bound = s->dependency_bound();
  return an.report("random").to_json();
}

}  // namespace

TEST_CASE("nsim analyze's report and dependency bound are the same beside the simulation as in place", "[events][analysis]") {
  const HostThreads two(2);  // (threaded even on a one-CPU machine)
  for (uint32_t seed : {1u, 2u, 3u}) {
    sim::Ps b_thread = 0, b_place = 0;
    const std::string with_thread = analysed(seed, true, b_thread);
    const std::string in_place = analysed(seed, false, b_place);
    INFO("seed " << seed);
    CHECK(b_thread == b_place);
    CHECK(b_thread > 0);
    CHECK(with_thread == in_place);
    // The stream has what the comparison is for: transposes of loaded tiles (the event's source writers), and
    // redundant loads (the events' DMA splits and transfers).
    CHECK(with_thread.find("\"pe_transpose\"") != std::string::npos);
    CHECK(with_thread.find("transposes of tiles computed on chip are not counted") != std::string::npos);
    CHECK(with_thread.find("\"redundant_dma\"") != std::string::npos);
  }
}
