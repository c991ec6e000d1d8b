// Simulator speed: simulated instructions per second in timing-only mode on a long stream of small
// instructions, heap allocations per instruction, and numerics throughput.
//   build/bench_simulator --benchmark_min_time=1
#include <benchmark/benchmark.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <vector>

#include "engines/analysis/analyzer.h"
#include "engines/simulator.h"

// Count every heap allocation so the benchmark can report allocations per instruction.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
static std::atomic<uint64_t> g_allocs{0};
void* operator new(std::size_t n) {
  g_allocs.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

using namespace nsim;
using isa::Engine;
using isa::Instr;
using isa::Opcode;
using isa::Operand;
using isa::Space;

namespace {

// A mix of small instructions over all engines: Vector/GpSimd/Scalar element-wise ops on [128, 4]
// tiles, a matmul pair, and a small DMA. Rotating tiles keep some dependencies, some independence.
std::vector<Instr> small_mix(Simulator& s) {
  std::vector<Instr> v;
  Operand t[8];
  for (auto& x : t) x = s.alloc_tile(Space::kSbuf, 128, {4}, DType::kFloat32);
  Operand st = s.alloc_tile(Space::kSbuf, 128, {128}, DType::kBFloat16);
  Operand mv = s.alloc_tile(Space::kSbuf, 128, {64}, DType::kBFloat16);
  Operand ps = s.alloc_tile(Space::kPsum, 128, {64}, DType::kFloat32);
  const auto& h = s.alloc_hbm("h", {128, 4}, DType::kFloat32);
  for (int i = 0; i < 8; ++i) {
    Instr a = isa::make_instr(Opcode::kTensorScalar, Engine::kVector, {t[(i + 1) % 8], t[i]});
    a.alu0 = isa::AluOp::kAdd;
    a.flags = isa::kHasImm0;
    v.push_back(a);
    Instr b = isa::make_instr(Opcode::kActivation, Engine::kScalar, {t[(i + 3) % 8], t[(i + 2) % 8]});
    b.act = isa::ActFunc::kCopy;
    v.push_back(b);
    Instr c = isa::make_instr(Opcode::kTensorTensor, Engine::kGpsimd, {t[(i + 5) % 8], t[(i + 4) % 8], t[(i + 6) % 8]});
    c.alu0 = isa::AluOp::kMultiply;
    v.push_back(c);
  }
  v.push_back(isa::make_instr(Opcode::kLoadStationary, Engine::kTensor, {st}));
  v.push_back(isa::make_instr(Opcode::kMultiplyMoving, Engine::kTensor, {ps, mv}));
  v.push_back(isa::make_instr(Opcode::kTensorCopy, Engine::kVector, {t[0], Operand::tile(Space::kPsum, DType::kFloat32, ps.offset, 0, 128, {4})}));
  v.push_back(isa::make_instr(Opcode::kDmaCopy, Engine::kSync, {t[7], h.whole()}));
  return v;
}

void BM_TimingOnlySmallInstructions(benchmark::State& state) {
  SimOptions o;
  o.numerics = false;
  auto sim = Simulator::from_preset("trn2", {}, o);
  const std::vector<Instr> mix = small_mix(*sim);
  uint64_t n = 0;
  const uint64_t allocs0 = g_allocs.load();
  for (auto _ : state) {
    for (const Instr& in : mix) benchmark::DoNotOptimize(sim->submit(in));
    n += mix.size();
  }
  const uint64_t allocs = g_allocs.load() - allocs0;
  state.SetItemsProcessed(static_cast<int64_t>(n));
  state.counters["allocs_per_instr"] = static_cast<double>(allocs) / static_cast<double>(n);
  state.counters["simulated_us"] = sim::ps_to_ns(sim->total_time()) / 1000.0;
}
BENCHMARK(BM_TimingOnlySmallInstructions)->Unit(benchmark::kMillisecond);

void BM_AnalyzedSmallInstructions(benchmark::State& state) {
  // The same mix with `nsim analyze`'s machinery on: the dependency-bound tracker and the Analyzer
  // (per-line aggregates, HBM reload counters, one critical-path record per instruction).
  SimOptions o;
  o.numerics = false;
  o.dependency_bound = true;
  auto sim = Simulator::from_preset("trn2", {}, o);
  engines::Analyzer an(*sim);
  const std::vector<Instr> mix = small_mix(*sim);
  uint64_t n = 0;
  for (auto _ : state) {
    for (const Instr& in : mix) benchmark::DoNotOptimize(sim->submit(in));
    n += mix.size();
  }
  sim->sync_events();  // (the analysis runs beside the simulation, on a host thread of its own when there is one)
  state.SetItemsProcessed(static_cast<int64_t>(n));
  sim->finish();
  benchmark::DoNotOptimize(an.report().findings.size());
}
// Wall time: with two host threads the analysis runs on the second (SimOptions::listener_thread), which a CPU
// time of the benchmark's thread alone would leave out.
BENCHMARK(BM_AnalyzedSmallInstructions)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_TimingOnlyElementwiseStream(benchmark::State& state) {
  // The smallest useful instructions: [128, 4] fp32 tensor_scalar ops over 8 rotating tiles, on
  // VectorE, ScalarE and GpSimd in turn (a dependency chain every third instruction).
  SimOptions o;
  o.numerics = false;
  auto sim = Simulator::from_preset("trn2", {}, o);
  Operand t[8];
  for (auto& x : t) x = sim->alloc_tile(Space::kSbuf, 128, {4}, DType::kFloat32);
  std::vector<Instr> mix;
  const Engine engines[3] = {Engine::kVector, Engine::kScalar, Engine::kGpsimd};
  for (int i = 0; i < 24; ++i) {
    Instr a = isa::make_instr(Opcode::kTensorScalar, engines[i % 3], {t[(i + 1) % 8], t[i % 8]});
    a.alu0 = isa::AluOp::kMultiply;
    a.alu1 = isa::AluOp::kAdd;
    a.flags = isa::kHasImm0 | isa::kHasImm1;
    mix.push_back(a);
  }
  uint64_t n = 0;
  for (auto _ : state) {
    for (const Instr& in : mix) benchmark::DoNotOptimize(sim->submit(in));
    n += mix.size();
  }
  state.SetItemsProcessed(static_cast<int64_t>(n));
}
BENCHMARK(BM_TimingOnlyElementwiseStream)->Unit(benchmark::kMillisecond);

void BM_TimingOnlyDmaAndMatmul(benchmark::State& state) {
  // Larger instructions: [128, 512] loads on 4 queues, matmuls, evictions, stores.
  SimOptions o;
  o.numerics = false;
  auto sim = Simulator::from_preset("trn2", {}, o);
  const auto& x = sim->alloc_hbm("x", {128, 512}, DType::kBFloat16);
  Operand buf[4], sb = sim->alloc_tile(Space::kSbuf, 128, {512}, DType::kFloat32);
  for (auto& b : buf) b = sim->alloc_tile(Space::kSbuf, 128, {512}, DType::kBFloat16);
  Operand st = sim->alloc_tile(Space::kSbuf, 128, {128}, DType::kBFloat16);
  Operand ps = sim->alloc_tile(Space::kPsum, 128, {512}, DType::kFloat32);
  std::vector<Instr> mix;
  for (int i = 0; i < 4; ++i) {
    Instr ld = isa::make_instr(Opcode::kDmaCopy, Engine::kSync, {buf[i], x.whole()});
    ld.dma_queue = static_cast<uint8_t>(i);
    mix.push_back(ld);
    mix.push_back(isa::make_instr(Opcode::kLoadStationary, Engine::kTensor, {st}));
    mix.push_back(isa::make_instr(Opcode::kMultiplyMoving, Engine::kTensor, {ps, buf[i]}));
    mix.push_back(isa::make_instr(Opcode::kTensorCopy, Engine::kVector, {sb, ps}));
  }
  uint64_t n = 0;
  for (auto _ : state) {
    for (const Instr& in : mix) benchmark::DoNotOptimize(sim->submit(in));
    n += mix.size();
  }
  state.SetItemsProcessed(static_cast<int64_t>(n));
}
BENCHMARK(BM_TimingOnlyDmaAndMatmul)->Unit(benchmark::kMillisecond);

void BM_NumericsTensorTensor(benchmark::State& state) {
  // fp32 [128, 512] add with numerics on: elements computed per second.
  auto sim = Simulator::from_preset("trn2");
  Operand a = sim->alloc_tile(Space::kSbuf, 128, {512}, DType::kFloat32);
  Operand b = sim->alloc_tile(Space::kSbuf, 128, {512}, DType::kFloat32);
  Operand c = sim->alloc_tile(Space::kSbuf, 128, {512}, DType::kFloat32);
  Instr in = isa::make_instr(Opcode::kTensorTensor, Engine::kVector, {c, a, b});
  in.alu0 = isa::AluOp::kAdd;
  for (auto _ : state) benchmark::DoNotOptimize(sim->submit(in));
  state.SetItemsProcessed(state.iterations() * 128 * 512);
}
BENCHMARK(BM_NumericsTensorTensor)->Unit(benchmark::kMicrosecond);

void BM_NumericsMatmul(benchmark::State& state) {
  // bf16 [128,128] x [128,512] matmul with numerics: FLOPs computed per second.
  auto sim = Simulator::from_preset("trn2");
  Operand st = sim->alloc_tile(Space::kSbuf, 128, {128}, DType::kBFloat16);
  Operand mv = sim->alloc_tile(Space::kSbuf, 128, {512}, DType::kBFloat16);
  Operand ps = sim->alloc_tile(Space::kPsum, 128, {512}, DType::kFloat32);
  sim->submit(isa::make_instr(Opcode::kMemset, Engine::kVector, {st}));
  sim->submit(isa::make_instr(Opcode::kMemset, Engine::kVector, {mv}));
  const Instr ls = isa::make_instr(Opcode::kLoadStationary, Engine::kTensor, {st});
  const Instr mm = isa::make_instr(Opcode::kMultiplyMoving, Engine::kTensor, {ps, mv});
  for (auto _ : state) {
    sim->submit(ls);
    sim->submit(mm);
  }
  state.SetItemsProcessed(state.iterations() * 2 * 128 * 128 * 512);
}
BENCHMARK(BM_NumericsMatmul)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
