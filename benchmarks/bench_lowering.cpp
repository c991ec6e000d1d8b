// Lowering + simulation speed and memory: a tile-IR kernel of ~10.5 million instructions (nested
// loops over small DMA / tensor_scalar / nc_matmul / tensor_copy ops), lowered lazily by
// frontend::Lowering and simulated in timing-only mode without tracing. Reports instructions per
// second and the peak resident set (VmHWM; the issue requires < 300 MB).
//   build/bench_lowering
// Links nsim_frontend (CMake: target_link_libraries(bench_lowering PRIVATE nsim_frontend)).
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "engines/simulator.h"
#include "frontend/lower.h"

using namespace nsim;
using namespace nsim::frontend;

namespace {

/// Peak resident set size of this process in MiB (VmHWM of /proc/self/status), -1 if unknown.
double peak_rss_mib() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return -1;
  char line[256];
  double kib = -1;
  while (std::fgets(line, sizeof line, f))
    if (std::strncmp(line, "VmHWM:", 6) == 0) {
      kib = std::strtod(line + 6, nullptr);
      break;
    }
  std::fclose(f);
  return kib < 0 ? -1 : kib / 1024.0;
}

Affine aff(int64_t c, int loop = -1, int64_t coef = 0) {
  Affine a{c, {}};
  if (loop >= 0) a.terms.push_back({loop, coef});
  return a;
}

/// outer (sequential) x inner (affine) iterations of: load x[:, 4j:4j+4], u = t * 2 (Vector),
/// p = w^T @ u (load_stationary + multiply_moving), v = copy(p) (Scalar), store y[:, 4j:4j+4].
/// 6 instructions per inner iteration, plus the weight load.
Kernel make_kernel(int64_t outer, int64_t inner) {
  Kernel k;
  k.name = "bench";
  auto tensor = [&](const char* name, isa::Space sp, DType dt, std::vector<int64_t> shape, TensorKind kind) {
    Tensor t;
    t.name = name;
    t.space = sp;
    t.dtype = dt;
    t.shape = std::move(shape);
    t.kind = kind;
    t.loc = SourceLoc{"bench.py", static_cast<int>(k.tensors.size()) + 1, "bench"};
    k.tensors.push_back(t);
    return static_cast<int>(k.tensors.size() - 1);
  };
  auto op = [&](std::vector<Stmt>& body, const char* name, std::vector<Access> opnd) {
    Op o;
    o.name = name;
    for (size_t i = 0; i < opnd.size(); ++i) o.operands[i] = opnd[i];
    o.loc = SourceLoc{"bench.py", 100 + static_cast<int>(k.ops.size()), "bench"};
    k.ops.push_back(o);
    body.push_back(Stmt{Stmt::Kind::kOp, static_cast<int>(k.ops.size() - 1)});
    return static_cast<int>(k.ops.size() - 1);
  };
  const int64_t cols = 4 * inner;
  const int x = tensor("x", isa::Space::kHbm, DType::kFloat32, {128, cols}, TensorKind::kInput);
  const int wh = tensor("w", isa::Space::kHbm, DType::kBFloat16, {128, 128}, TensorKind::kInput);
  const int y = tensor("y", isa::Space::kHbm, DType::kFloat32, {128, cols}, TensorKind::kOutput);
  const int w = tensor("w_sb", isa::Space::kSbuf, DType::kBFloat16, {128, 128}, TensorKind::kInternal);
  const int t = tensor("t", isa::Space::kSbuf, DType::kFloat32, {128, 4}, TensorKind::kInternal);
  const int u = tensor("u", isa::Space::kSbuf, DType::kFloat32, {128, 4}, TensorKind::kInternal);
  const int p = tensor("p", isa::Space::kPsum, DType::kFloat32, {128, 4}, TensorKind::kInternal);
  const int v = tensor("v", isa::Space::kSbuf, DType::kFloat32, {128, 4}, TensorKind::kInternal);

  k.body.push_back(Stmt{Stmt::Kind::kAlloc, w});
  op(k.body, "dma_copy", {Access{w, {}}, Access{wh, {}}});
  Loop lo;
  lo.var = "i";
  lo.start = 0;
  lo.stop = outer;
  lo.kind = LoopKind::kSequential;
  k.loops.push_back(lo);
  Loop li;
  li.var = "j";
  li.start = 0;
  li.stop = inner;
  li.kind = LoopKind::kAffine;
  k.loops.push_back(li);
  k.body.push_back(Stmt{Stmt::Kind::kLoop, 0});
  k.loops[0].body.push_back(Stmt{Stmt::Kind::kLoop, 1});
  std::vector<Stmt> body;
  for (int tile : {t, u, p, v}) body.push_back(Stmt{Stmt::Kind::kAlloc, tile});
  const Access cols_j{x, {DimAccess{aff(0), 128, 1, false}, DimAccess{aff(0, 1, 4), 4, 1, false}}};
  Access out_j = cols_j;
  out_j.tensor = y;
  op(body, "dma_copy", {Access{t, {}}, cols_j});
  const int ts = op(body, "tensor_scalar", {Access{u, {}}, Access{t, {}}});
  k.ops[static_cast<size_t>(ts)].alu0 = isa::AluOp::kMultiply;
  k.ops[static_cast<size_t>(ts)].imm[0] = 2.0f;
  k.ops[static_cast<size_t>(ts)].flags = isa::kHasImm0;
  op(body, "nc_matmul", {Access{p, {}}, Access{w, {}}, Access{u, {}}});
  const int cp = op(body, "tensor_copy", {Access{v, {}}, Access{p, {}}});
  k.ops[static_cast<size_t>(cp)].engine = isa::Engine::kScalar;
  op(body, "dma_copy", {out_j, Access{v, {}}});
  k.loops[1].body = std::move(body);
  return k;
}

/// Lower, verify and simulate; range(1): 1 = the compiler model's list scheduler (default), 0 =
/// program order (compiler.schedule=program_order, the path before the scheduler existed).
void BM_LowerAndSimulate(benchmark::State& state) {
  const int64_t outer = state.range(0), inner = 1024;
  const Kernel k = make_kernel(outer, inner);
  uint64_t instrs = 0;
  double sim_ns = 0;
  const std::vector<std::string> mode = {state.range(1) ? "compiler.schedule=list" : "compiler.schedule=program_order"};
  for (auto _ : state) {
    auto sim = Simulator::from_preset("trn2", mode, SimOptions{false, ""});
    verify_kernel(k, sim->params());
    Lowering low(k, *sim);
    low.run();
    sim->finish();
    instrs += low.instructions();
    sim_ns = sim::ps_to_ns(sim->total_time());
    benchmark::DoNotOptimize(sim_ns);
  }
  state.counters["instructions"] = static_cast<double>(instrs) / static_cast<double>(state.iterations());
  state.counters["instr_per_s"] = benchmark::Counter(static_cast<double>(instrs), benchmark::Counter::kIsRate);
  state.counters["peak_rss_MiB"] = peak_rss_mib();
  state.counters["simulated_ms"] = sim_ns * 1e-6;
}

/// The lowering alone: instructions produced by Lowering::next() without simulating them.
void BM_LowerOnly(benchmark::State& state) {
  const Kernel k = make_kernel(state.range(0), 1024);
  uint64_t instrs = 0;
  for (auto _ : state) {
    auto sim = Simulator::from_preset("trn2", {}, SimOptions{false, ""});
    Lowering low(k, *sim);
    isa::Instr in;
    while (low.next(in)) benchmark::DoNotOptimize(in);
    instrs += low.instructions();
  }
  state.counters["instructions"] = static_cast<double>(instrs) / static_cast<double>(state.iterations());
  state.counters["instr_per_s"] = benchmark::Counter(static_cast<double>(instrs), benchmark::Counter::kIsRate);
  state.counters["peak_rss_MiB"] = peak_rss_mib();
}

}  // namespace

// 1700 x 1024 x 6 + 1 = 10,444,801 instructions per run.
BENCHMARK(BM_LowerAndSimulate)->Args({1700, 0})->Args({1700, 1})->Iterations(1)->Unit(benchmark::kSecond)->UseRealTime();
// A tenth of it (1 M instructions): small enough for `valgrind --tool=callgrind`, whose instruction
// counts compare the two modes independently of the machine's load.
BENCHMARK(BM_LowerAndSimulate)->Args({170, 0})->Args({170, 1})->Iterations(1)->Unit(benchmark::kSecond)->UseRealTime();

BENCHMARK(BM_LowerOnly)->Arg(1700)->Iterations(1)->Unit(benchmark::kSecond)->UseRealTime();

BENCHMARK_MAIN();
