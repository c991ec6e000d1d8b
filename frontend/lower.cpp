// Lowering of a frontend::Kernel to isa::Instr, one instruction at a time (see lower.h).
//
// Engine and queue choices for DMA:
//  * Trigger engine, unless the op names one: loads (HBM -> on-chip), SBUF -> SBUF and HBM -> HBM
//    copies are triggered from Sync; stores (on-chip -> HBM) from GpSimd (software DGE). A store
//    waits for the compute that produced its data; were it on Sync, every later load would queue
//    behind it in Sync's in-order stream and the prefetch of tile i+1 could not overlap the compute
//    of tile i. With stores on GpSimd, Sync only ever waits for buffer reuse (write-after-read).
//  * Queue, unless the op names one: the trigger engine's queue (rotating buffer index) % 4 in the
//    compiler's layout (engines::trigger_queue: qSyncIO0-3 for loads, qGpSimdIO0-3 for stores), so
//    consecutive tiles use different queues and loads never share a queue with stores.
//  These are the program-order choices (compiler.schedule: program_order); the list scheduler
//  (frontend/compiler/scheduler.h) re-places engine-free ops and spreads automatic DMAs itself.
#include "frontend/lower.h"

#include "frontend/compiler/scheduler.h"

#include "frontend/compiler/allocate.h"
#include "isa/semantics/parallel.h"
#include "sim/trace.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

#include <unistd.h>

namespace nsim::frontend {

using isa::Engine;
using isa::Instr;
using isa::Opcode;
using isa::Operand;
using isa::Space;

namespace {

constexpr int kMaxRank = 8;       // HBM tensors; tiles have at most 1 + 4 dims
constexpr int kMaxLoopDepth = 64;  // nesting guard (verify_kernel reports E411 beyond it)

int64_t round_up(int64_t v, int64_t a) { return a <= 1 ? v : (v + a - 1) / a * a; }

bool on_chip(Space s) { return s == Space::kSbuf || s == Space::kPsum; }

}  // namespace

// ------------------------------------------------------------------ shared building blocks

int Lowering::opcode_of(const std::string& name) {
  const isa::OpInfo* macro = isa::macro_from_name(name);
  if (macro == &isa::macro_info(isa::Macro::kNcMatmul) || macro == &isa::macro_info(isa::Macro::kNcMatmulMx))
    return kNcMatmul;
  if (auto op = isa::opcode_from_name(name)) return static_cast<int>(*op);
  return kUnknownOp;
}

std::vector<TilePlacement> Lowering::plan_tiles(const Kernel& k, const engines::CoreParams& p, int64_t sbuf_avail,
                                                int64_t psum_avail) {
  return allocate_tiles(k, p, sbuf_avail, psum_avail).tiles;
}

Operand Lowering::access_operand(const Tensor& t, const Access& a, const std::vector<int64_t>& vars, int64_t base,
                                 bool keep_dims) {
  const std::vector<int64_t>& shape = access_shape(t, a);  // (a re-dimensioned view indexes its own shape)
  const int rank = static_cast<int>(shape.size());
  const int64_t eb = access_elem_bytes(t, a);  // (a reinterpreting view of another size counts its own elements)
  const bool chip = on_chip(t.space);
  if (rank < 1 || rank > kMaxRank)
    throw Error(ErrorCode::kShapeMismatch, fmt::format("tensor '{}' has rank {}, expected 1..{}", t.name, rank, kMaxRank));
  if (!a.dims.empty() && static_cast<int>(a.dims.size()) != rank)
    throw Error(ErrorCode::kBadIndex, fmt::format("access to tensor '{}' has {} dims, the tensor has {}", t.name,
                                                  a.dims.size(), rank));
  // Row-major strides in elements (on-chip: over the free dims only).
  int64_t st[kMaxRank];
  int64_t s = 1;
  for (int d = rank - 1; d >= 0; --d) {
    st[d] = a.strides.empty() ? s : a.strides[static_cast<size_t>(d)];  // (a strided view gives its own)
    s *= shape[static_cast<size_t>(d)];
  }

  Operand o;
  o.space = t.space;
  o.dtype = a.dtype.value_or(t.dtype);  // a reinterpreting view reads the bytes as its dtype
  int64_t off = 0;  // elements
  int nf = 0;
  auto push = [&](int64_t size, int64_t stride) {
    if (!keep_dims) {
      if (size == 1) return;
      if (nf > 0 && o.stride[static_cast<size_t>(nf - 1)] == size * stride) {  // contiguous with the outer dim
        o.size[static_cast<size_t>(nf - 1)] *= size;
        o.stride[static_cast<size_t>(nf - 1)] = stride;
        return;
      }
    }
    if (nf >= isa::kMaxFreeDims)
      throw Error(ErrorCode::kShapeMismatch,
                  fmt::format("access to tensor '{}' needs more than {} free dims after merging contiguous dims",
                              t.name, isa::kMaxFreeDims));
    o.size[static_cast<size_t>(nf)] = size;
    o.stride[static_cast<size_t>(nf)] = stride;
    ++nf;
  };

  if (!a.order.empty() && static_cast<int>(a.order.size()) != rank)
    throw Error(ErrorCode::kBadIndex, fmt::format("access to tensor '{}' has an order of {} dims, the tensor has {}",
                                                  t.name, a.order.size(), rank));
  for (int i = 0; i < rank; ++i) {
    const int d = a.order.empty() ? i : a.order[static_cast<size_t>(i)];  // the dims in visiting order
    int64_t start = 0, size = shape[static_cast<size_t>(d)], step = 1;
    bool bc = false;
    if (!a.dims.empty()) {
      const DimAccess& da = a.dims[static_cast<size_t>(d)];
      start = da.start.eval(vars);
      size = da.size;
      step = da.step;
      bc = da.broadcast;
    }
    if (i == 0) {  // the partition dim (on chip: dim 0) / the rows of an HBM access (its first visited dim)
      o.num_partitions = static_cast<uint32_t>(size);
      if (chip) {
        o.start_partition = static_cast<uint16_t>(start);
      } else {
        off += start * st[d];
        o.partition_step = bc ? 0 : step * st[d];
      }
      continue;
    }
    off += start * st[d];
    push(size, bc ? 0 : step * st[d]);
  }
  if (nf == 0) {  // one element per partition
    o.size[0] = 1;
    o.stride[0] = 1;
    nf = 1;
  }
  o.nfree = static_cast<uint8_t>(nf);
  o.offset = base + off * eb;
  return o;
}

void Lowering::transposed_hbm_rows(Operand& o, int64_t cols, int64_t middle) {
  // An HBM side indexed by integers before its 2-D part (the flash attention sample's
  // nl.load_transpose2d(v[b, h][:, cols])) is one row holding both dims: its first free dim is the row
  // dim the transpose swaps. (The same elements and bytes: only the split into rows changes.) The 3-D / 4-D
  // forms (`middle` = iimm[0] > 1: [a, m, c] <-> [c, m, a]) likewise (hidden[b, rows, :].reshape((rows, KT, 128)),
  // a = rows), but only where rows of m x cols elements are what the split leaves: a real leading dim of
  // one ([1, m, c]) keeps its one row.
  if (!o.present() || o.space != Space::kHbm || o.num_partitions != 1) return;
  const int64_t row = cols * std::max<int64_t>(middle, 1);  // elements of one row (cols x the middle dims)
  if (o.nfree == 1 && cols > 0 && o.size[0] > row && o.size[0] % row == 0) {
    // ... and when the 2-D part is contiguous (k_cache[b, h, rows, :]) its two dims were merged into one free
    // dim: the other side's partitions are this side's columns (a 2-D transpose pairs [a, c] with [c, a]).
    o.num_partitions = static_cast<uint32_t>(o.size[0] / row);
    o.partition_step = o.stride[0] * row;
    o.size[0] = row;
    return;
  }
  if (o.nfree < 2) return;
  if (middle > 1) {  // the 3-D / 4-D forms: only when the dims after the first make one row
    int64_t rest = 1;
    for (size_t d = 1; d < o.nfree; ++d) rest *= o.size[d];
    if (cols <= 0 || rest != row) return;
  }
  o.num_partitions = static_cast<uint32_t>(o.size[0]);
  o.partition_step = o.stride[0];
  for (size_t d = 1; d < o.nfree; ++d) {
    o.size[d - 1] = o.size[d];
    o.stride[d - 1] = o.stride[d];
  }
  --o.nfree;
}

int Lowering::assemble(const Op& op, int opcode, const std::array<Operand, isa::kMaxSlots>& opnd, int buf,
                       Instr out[2]) {
  Instr in;
  in.alu0 = op.alu0;
  in.alu1 = op.alu1;
  in.act = op.act;
  in.reduce_cmd = op.reduce_cmd;
  in.flags = op.flags;
  in.imm = op.imm;
  for (size_t i = 0; i < in.iimm.size(); ++i) in.iimm[i] = op.iimm[i];
  in.shuffle = op.shuffle;
  in.axis_count = op.axis_count;
  if (opcode == kNcMatmul) {
    const Engine e = op.engine.value_or(isa::macro_info(isa::Macro::kNcMatmul).default_engine);
    out[0] = in;
    out[0].op = Opcode::kLoadStationary;
    out[0].engine = e;
    out[0].flags = static_cast<uint16_t>(op.flags & ~isa::kAccumulate);
    out[0].opnd[0] = opnd[1];
    out[0].opnd[1] = opnd[3];  // stationary_scale (MX)
    out[1] = in;
    out[1].op = Opcode::kMultiplyMoving;
    out[1].engine = e;
    out[1].opnd[0] = opnd[0];
    out[1].opnd[1] = opnd[2];
    out[1].opnd[2] = opnd[4];  // moving_scale (MX)
    return 2;
  }
  in.op = static_cast<Opcode>(opcode);
  in.opnd = opnd;
  if (in.op == Opcode::kDmaTranspose) {  // (iimm[0] = middle elements: 0 or 1 the 2-D form)
    // each side's columns: the other side's partitions, when it is on chip
    const int64_t cols[2] = {in.opnd[1].space != Space::kHbm ? in.opnd[1].num_partitions : 0,
                             in.opnd[0].space != Space::kHbm ? in.opnd[0].num_partitions : 0};
    for (size_t i = 0; i < in.opnd.size(); ++i) transposed_hbm_rows(in.opnd[i], i < 2 ? cols[i] : 0, op.iimm[0]);
  }
  if (isa::is_dma(in.op)) {
    const bool store = opnd[0].space == Space::kHbm && opnd[1].present() && opnd[1].space != Space::kHbm;
    in.engine = op.engine.value_or(store ? Engine::kGpsimd : Engine::kSync);
    in.dma_queue = static_cast<uint8_t>(op.dma_queue ? *op.dma_queue : (store ? 4 : 0) + buf % 4);
  } else {
    in.engine = op.engine ? *op.engine : isa::default_engine(in);
  }
  out[0] = in;
  return 1;
}

void Lowering::apply_iimm_exprs(const Op& op, const std::vector<int64_t>& vars, Instr& out) {
  for (const auto& [j, e] : op.iimm_expr) {
    const int64_t v = e.eval(vars);
    if (v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max())
      throw Error(ErrorCode::kBadArgument,
                  fmt::format("{}: iimm[{}] = {} in this iteration, outside the int32 an immediate holds", op.name, j, v),
                  op.loc);
    out.iimm[j] = static_cast<int32_t>(v);
  }
}

// ------------------------------------------------------------------ Lowering

void Lowering::allocate_hbm(const Kernel& k, Simulator& sim) {
  for (const Tensor& t : k.tensors) {
    if (t.space != Space::kHbm) continue;
    if (sim.memory().has_hbm_tensor(t.name)) {
      const memory::HbmTensor& h = sim.memory().hbm_tensor(t.name);
      if (h.shape != t.shape || h.dtype != t.dtype)
        throw Error(ErrorCode::kBadInput,
                    fmt::format("HBM tensor '{}' exists as {} {}, but the kernel declares {} {}", t.name,
                                shape_str(h.shape), dtype_name(h.dtype), shape_str(t.shape), dtype_name(t.dtype)),
                    t.loc);
      continue;
    }
    sim.alloc_hbm(t.name, t.shape, t.dtype);
  }
}

namespace {
// Set while a placement candidate is timed: the Lowering of that run takes its plan as given (no search of its own).
thread_local bool g_timing_candidate = false;
}  // namespace

namespace {
/// A host thread of its own for the placement search's runs: they run two at a time (choose_placement). Made once
/// per process (again in a forked child, which has none of its parent's threads) and never stopped, so that the
/// memory its runs allocate stays mapped for the next search (a new thread per search faulted in ~750 fresh pages
/// per run, ~1.3 ms). Serves one search at a time: try_start() says no while it is busy (another host thread's
/// search), and that search's runs run on its own thread alone.
class SearchHelper {
 public:
  /// The process's helper; nullptr when no thread can be had.
  static SearchHelper* get() {
    static std::mutex m;
    static SearchHelper* h = nullptr;  // (never destroyed: its thread waits for jobs until the process ends)
    std::lock_guard<std::mutex> lock(m);
    if (h && h->pid_ == getpid()) return h;
    try {
      h = new SearchHelper;  // (a forked child's copy of the parent's is left: its thread is not there)
    } catch (...) {
      h = nullptr;
    }
    return h;
  }
  /// Runs job() on the helper; false (and nothing run) when it is busy.
  bool try_start(std::function<void()> job) {
    std::lock_guard<std::mutex> lock(mu_);
    if (busy_) return false;
    busy_ = true;
    job_ = std::move(job);
    cv_.notify_one();
    return true;
  }
  /// Returns when the job started last has returned.
  void wait() {
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, [this] { return !busy_; });
  }

 private:
  SearchHelper() : pid_(getpid()) { std::thread([this] { loop(); }).detach(); }
  void loop() {
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return static_cast<bool>(job_); });
        job = std::move(job_);
        job_ = nullptr;
      }
      job();  // (time_with catches everything)
      {
        std::lock_guard<std::mutex> lock(mu_);
        busy_ = false;
      }
      done_.notify_all();
    }
  }
  const pid_t pid_;
  std::mutex mu_;
  std::condition_variable cv_, done_;
  bool busy_ = false;
  std::function<void()> job_;
};
}  // namespace

std::optional<AllocationPlan> Lowering::choose_placement(const Kernel& k, const Simulator& sim,
                                                         const AllocationPlan& plan, int64_t sbuf_avail,
                                                         int64_t psum_avail) {
  if (g_timing_candidate ||
      (plan.psum_swaps.empty() && !plan.psum_depth_candidate && plan.psum_deepen.empty() && plan.sbuf_deepen.empty()))
    return std::nullopt;
  // A run costs its instructions plus the simulator's set-up, counted as kRunCost instructions.
  constexpr double kRunCost = 1000;
  const auto budget = static_cast<double>(sim.params().placement_search);
  const double cost = plan.executed_ops + kRunCost;
  if (budget <= 0 || cost > budget) return std::nullopt;
  // One timing-only run of the kernel per placement: plan `p`, with swap `swap` of its psum_swaps made (-1: none).
  const auto time_with = [&](const AllocationPlan& p, int swap) -> std::optional<sim::Ps> {
    AllocationPlan v = p;
    v.psum_swaps.clear();
    v.psum_depth_candidate = false;
    v.psum_deepen.clear();
    v.sbuf_deepen.clear();
    v.warnings.clear();
    if (swap >= 0) {
      const auto [a, b] = p.psum_swaps[static_cast<size_t>(swap)];
      std::swap(v.tiles[static_cast<size_t>(a)].offset, v.tiles[static_cast<size_t>(b)].offset);
    }
    struct Guard {
      Guard() { g_timing_candidate = true; }
      ~Guard() { g_timing_candidate = false; }
    } guard;
    try {
      // The run's own options (its limits, stop flag and what-if settings), timing-only, without its outputs.
      SimOptions o = sim.options();
      o.numerics = false;
      o.check = false;
      o.dependency_bound = false;
      o.trace_path.clear();
      o.core_index = -1;
      Simulator s(sim.config(), o);
      Lowering low(k, s, &v);
      low.run();
      s.finish();
      return s.total_time();
    } catch (...) {  // (on a helper thread too: nothing may escape)
      return std::nullopt;
    }
  };
  // Candidates: the allocator's plan and each of its swaps; then the plan with one buffer per PSUM loop tile (more
  // tiles spread over the banks) and each of its swaps. A group is timed when its runs fit in the budget with the
  // runs before it; the fastest candidate is kept when it beats the allocator's plan by more than 0.1 %.
  // The runs of a group are independent: they run two at a time, on this thread and on the search's own
  // (SearchHelper; one at a time with NSIM_NUM_THREADS=1 or while another search has it), and their times are then
  // taken in order, as one after the other would (the same choice; a run that failed stops the group
  // there). When neither swaps nor the shallow plan are timed, the first deepening round (below) starts from the
  // allocator's plan whatever its time: its candidates are timed with it. (The library's flash attention at S=2048
  // times its plan and the shallow one: 3.1 of the 5.5 ms of its timing-only run, one after the other.)
  using Candidate = std::pair<const AllocationPlan*, int>;  // a plan, and the swap made in it (-1: none)
  const auto time_all = [&](const std::vector<Candidate>& c) {
    std::vector<std::optional<sim::Ps>> t(c.size());
    std::atomic<size_t> next{0};
    const auto work = [&] {
      for (size_t i; (i = next.fetch_add(1)) < c.size();) t[i] = time_with(*c[i].first, c[i].second);
    };
    SearchHelper* h = c.size() > 1 && isa::sem::host_threads() > 1 ? SearchHelper::get() : nullptr;
    const bool shared = h && h->try_start(work);
    work();
    if (shared) h->wait();
    return t;
  };
  double runs = 0;
  const auto affordable = [&](double n) { return cost * (runs + n) <= budget; };
  const auto nswaps = static_cast<double>(plan.psum_swaps.size());
  const bool swaps = nswaps > 0 && affordable(1 + nswaps);
  if (!swaps &&
      !((plan.psum_depth_candidate || !plan.psum_deepen.empty() || !plan.sbuf_deepen.empty()) && affordable(2)))
    return std::nullopt;
  // Deepening: two buffers for one PSUM loop tile left with one while banks stay unused, or for one SBUF loop tile
  // the fallback left with one (the fallback then takes buffers from the others), each such tile in turn (its alloc
  // given a manual depth of 2; a candidate that does not fit is skipped).
  const auto deepen = [&](const AllocationPlan& p) {
    std::vector<int> tiles;
    if (sim.params().psum_loop_buffers > 1) tiles = p.psum_deepen;
    if (sim.params().loop_buffers > 1) tiles.insert(tiles.end(), p.sbuf_deepen.begin(), p.sbuf_deepen.end());
    return tiles;
  };
  std::optional<Kernel> kd;              // the kernel with the depths chosen so far
  std::vector<int> round_tiles;          // a round's candidates: their tiles
  std::vector<AllocationPlan> round;     // and plans
  // The candidates of a round from plan `from`, while they fit in the budget with `promised` runs not counted yet.
  const auto make_round = [&](const AllocationPlan& from, const engines::CoreParams& params, double promised) {
    round_tiles.clear();
    round.clear();
    if (!kd) kd = k;
    for (const int t : deepen(from)) {
      if (!affordable(promised + 1 + static_cast<double>(round.size()))) break;
      auto& ten = kd->tensors[static_cast<size_t>(t)];
      ten.bufs = 2;
      std::optional<AllocationPlan> c;
      try {
        c = allocate_tiles(*kd, params, sbuf_avail, psum_avail);
      } catch (const Error&) {
        c.reset();
      }
      ten.bufs = 0;
      if (!c) continue;
      round_tiles.push_back(t);
      round.push_back(std::move(*c));
    }
  };
  // The first runs, timed at once: the allocator's plan, its swaps when they are timed, then the shallow plan and its
  // swaps when timed (the plan with one buffer per PSUM loop tile: its candidates do not depend on the times before
  // them), or else the first deepening round's candidates.
  const double first_runs = 1 + (swaps ? nswaps : 0);
  std::optional<AllocationPlan> shallow;
  engines::CoreParams q = sim.params();  // the parameters of the shallow plan
  q.psum_loop_buffers = 1;
  if (plan.psum_depth_candidate && affordable(first_runs + 1)) {
    try {
      shallow = allocate_tiles(k, q, sbuf_avail, psum_avail);
    } catch (const Error&) {
      shallow.reset();
    }
    // (its swaps too when they fit, else the plan alone)
    if (shallow && !affordable(first_runs + 1 + static_cast<double>(shallow->psum_swaps.size())))
      shallow->psum_swaps.clear();
  }
  std::vector<Candidate> first{{&plan, -1}};
  for (int i = 0; swaps && i < static_cast<int>(plan.psum_swaps.size()); ++i) first.emplace_back(&plan, i);
  const size_t shallow_at = first.size();
  if (shallow) {
    first.emplace_back(&*shallow, -1);
    for (int i = 0; i < static_cast<int>(shallow->psum_swaps.size()); ++i) first.emplace_back(&*shallow, i);
  }
  const size_t round_at = first.size();
  const bool early = !swaps && !plan.psum_depth_candidate && !deepen(plan).empty() && affordable(2);
  if (early) {
    make_round(plan, sim.params(), 1);
    for (const AllocationPlan& c : round) first.emplace_back(&c, -1);
  }
  const std::vector<std::optional<sim::Ps>> first_t = time_all(first);
  const std::optional<sim::Ps> base = first_t[0];
  if (!base) return std::nullopt;
  runs = 1;
  const AllocationPlan* best = &plan;
  int pick = -1;
  sim::Ps bar = *base - *base / 1000;
  // Takes the times `t` of candidates `c` [from, to) in order; false at a run that failed.
  const auto fold = [&](const std::vector<Candidate>& c, const std::vector<std::optional<sim::Ps>>& t, size_t from,
                        size_t to) {
    for (size_t i = from; i < to; ++i) {
      runs += 1;
      if (!t[i]) return false;
      if (*t[i] < bar) {
        bar = *t[i];
        best = c[i].first;
        pick = c[i].second;
      }
    }
    return true;
  };
  // a swap that cannot run: the allocator's placement
  if (swaps && !fold(first, first_t, 1, shallow_at)) return std::nullopt;
  if (shallow) {
    const AllocationPlan* before = best;
    const int before_pick = pick;
    const sim::Ps before_bar = bar;
    if (!fold(first, first_t, shallow_at, round_at)) {
      best = before;
      pick = before_pick;
      bar = before_bar;
    }
  }
  // Deepening rounds from the plan chosen so far: the fastest candidate kept, and again from it while a round gains
  // and the budget lasts.
  std::optional<AllocationPlan> deeper;
  const engines::CoreParams& from_params = shallow && best == &*shallow ? q : sim.params();
  if (early || (!deepen(*best).empty() && affordable(1))) {
    for (bool gained = true, timed = early; gained && affordable(1); timed = false) {
      gained = false;
      std::vector<std::optional<sim::Ps>> times;
      if (timed) {
        times.assign(first_t.begin() + static_cast<std::ptrdiff_t>(round_at), first_t.end());
      } else {
        make_round(*best, from_params, 0);
        std::vector<Candidate> c;
        for (const AllocationPlan& r : round) c.emplace_back(&r, -1);
        times = time_all(c);
      }
      int chosen = -1;
      for (size_t i = 0; i < round.size(); ++i) {
        runs += 1;
        if (times[i] && *times[i] < bar) {
          bar = *times[i];
          chosen = static_cast<int>(i);
        }
      }
      if (chosen >= 0) {
        deeper = std::move(round[static_cast<size_t>(chosen)]);
        best = &*deeper;
        pick = -1;
        kd->tensors[static_cast<size_t>(round_tiles[static_cast<size_t>(chosen)])].bufs = 2;
        gained = true;
      }
    }
  }
  if (best == &plan && pick < 0) return std::nullopt;
  AllocationPlan out = *best;
  if (pick >= 0) {
    const auto [a, b] = best->psum_swaps[static_cast<size_t>(pick)];
    std::swap(out.tiles[static_cast<size_t>(a)].offset, out.tiles[static_cast<size_t>(b)].offset);
  }
  return out;
}

Lowering::Lowering(const Kernel& k, Simulator& sim, const AllocationPlan* given) : k_(k), sim_(sim) {
  allocate_hbm(k, sim);
  const size_t nt = k.tensors.size();
  hbm_addr_.assign(nt, 0);
  for (size_t t = 0; t < nt; ++t)
    if (k.tensors[t].space == Space::kHbm) hbm_addr_[t] = sim.memory().hbm_tensor(k.tensors[t].name).addr;

  const memory::RangeAllocator& sa = sim.memory().allocator(Space::kSbuf);
  const memory::RangeAllocator& pa = sim.memory().allocator(Space::kPsum);
  {
    // The plan places tiles (tiles with disjoint lifetimes may share bytes) within one region per
    // space, allocated here; placements are offsets into it. PSUM regions start on a bank boundary.
    const int64_t sbuf_used = sa.used(), psum_used = pa.used();
    // verify_kernel's plan assumed the whole of each memory: usable while nothing is allocated yet.
    const memory::MemoryConfig& mem = sim.params().mem;
    const bool whole = sbuf_used == 0 && psum_used == 0 && sa.capacity() == mem.sbuf_bytes_per_partition &&
                       pa.capacity() == mem.psum_bytes_per_partition();
    const int64_t bank = std::max<int64_t>(std::max<int64_t>(4, sim.params().dep_chunk_bytes),
                                           sim.params().mem.psum_bank_bytes);
    // A PSUM region after bytes already in use starts on the next bank: its plan has a bank less (the slack below).
    const int64_t psum_slack = psum_used > 0 ? bank : 0;
    AllocationPlan own;
    if (!given || !whole)
      own = allocate_tiles(k, sim.params(), sa.capacity() - sbuf_used, pa.capacity() - psum_used - psum_slack);
    const AllocationPlan& first = given && whole ? *given : own;
    const std::optional<AllocationPlan> chosen =
        choose_placement(k, sim, first, sa.capacity() - sbuf_used, pa.capacity() - psum_used - psum_slack);
    const AllocationPlan& plan = chosen ? *chosen : first;
    placements_ = plan.tiles;
    warnings_ = plan.warnings;
    for (const std::string& w : warnings_) fmt::print(stderr, "nsim: warning: {}\n", w);
    for (Space sp : {Space::kSbuf, Space::kPsum}) {
      const bool psum = sp == Space::kPsum;
      const int64_t extent = psum ? plan.psum_extent : plan.sbuf_extent;
      if (extent <= 0) continue;
      int64_t parts = 1;
      for (const TilePlacement& pl : placements_)
        if (pl.tensor >= 0 && k.tensors[static_cast<size_t>(pl.tensor)].space == sp)
          parts = std::max(parts, k.tensors[static_cast<size_t>(pl.tensor)].shape.empty()
                                      ? int64_t{1}
                                      : k.tensors[static_cast<size_t>(pl.tensor)].shape[0]);
      const int64_t slack = psum ? psum_slack : 0;  // fresh PSUM: the region starts at 0
      const Operand o = sim.alloc_tile(sp, static_cast<uint32_t>(parts), {extent + slack}, DType::kUInt8);
      const int64_t base = psum ? round_up(o.offset, bank) : o.offset;
      for (TilePlacement& pl : placements_)
        if (pl.tensor >= 0 && k.tensors[static_cast<size_t>(pl.tensor)].space == sp) pl.offset += base;
    }
    sim.set_onchip_peak(sbuf_used + plan.sbuf_peak, psum_used + plan.psum_peak);
  }

  // Per op, everything but the operands is fixed: assemble it once (operands with only their space
  // set, which decides the DMA trigger engine) and fill in operands per iteration.
  opcode_.resize(k.ops.size());
  op_loc_.resize(k.ops.size());
  tmpl_.resize(2 * k.ops.size());
  form_base_.resize(k.ops.size());
  size_t nforms = 0;
  for (size_t i = 0; i < k.ops.size(); ++i) {
    form_base_[i] = static_cast<uint32_t>(nforms);
    for (const auto& a : k.ops[i].operands) nforms += a ? 1 : 0;
  }
  if (nforms > UINT32_MAX) throw Error(ErrorCode::kResourceLimit, fmt::format("{} operands: more than a kernel may have", nforms));
  forms_.resize(nforms);
  queue_base_.assign(k.ops.size(), -1);
  for (size_t i = 0; i < k.ops.size(); ++i) {
    const Op& op = k.ops[i];
    opcode_[i] = opcode_of(op.name);
    if (opcode_[i] == kUnknownOp)
      throw Error(ErrorCode::kUnknownOp, fmt::format("op #{}: unknown op '{}'", i, op.name), op.loc);
    op_loc_[i] = sim.add_source(op.loc);
    std::array<Operand, isa::kMaxSlots> spaces{};
    for (size_t s = 0; s < isa::kMaxSlots; ++s)
      if (op.operands[s] && op.operands[s]->tensor >= 0 && static_cast<size_t>(op.operands[s]->tensor) < nt) {
        const Tensor& ten = k.tensors[static_cast<size_t>(op.operands[s]->tensor)];
        spaces[s].space = ten.space;  // (and the dtype: isa::default_engine reads both)
        spaces[s].dtype = op.operands[s]->dtype.value_or(ten.dtype);
      }
    Instr t[2];
    assemble(op, opcode_[i], spaces, 0, t);
    for (int j = 0; j < 2; ++j) {
      t[j].loc = op_loc_[i];
      tmpl_[2 * i + static_cast<size_t>(j)].set(t[j]);
    }
    if (opcode_[i] >= 0 && isa::is_dma(static_cast<Opcode>(opcode_[i])) && !op.dma_queue)
      queue_base_[i] = static_cast<int8_t>(t[0].dma_queue);
  }
  alloc_count_.assign(nt, 0);
  buf_.assign(nt, 0);
  base_.assign(nt, 0);
  for (size_t t = 0; t < nt; ++t) rotate(t);
  vars_.assign(k.loops.size(), 0);
  stack_.reserve(16);
  stack_.push_back(Frame{&k.body, 0, -1});
}

void Lowering::rotate(size_t t) {
  const TilePlacement& pl = placements_[t];
  if (pl.tensor < 0) {
    buf_[t] = 0;
    base_[t] = hbm_addr_[t];
    return;
  }
  buf_[t] = alloc_count_[t] <= 0 ? 0 : static_cast<int>((alloc_count_[t] - 1) % pl.bufs);
  base_[t] = pl.offset + buf_[t] * pl.stride;
}

namespace {
/// f += k * g (terms merged by loop id); false when a coefficient leaves int64.
bool add_scaled(Affine& f, const Affine& g, int64_t k) {
  int64_t v = 0;
  if (__builtin_mul_overflow(g.c, k, &v) || __builtin_add_overflow(f.c, v, &f.c)) return false;
  for (auto [id, coef] : g.terms) {
    if (__builtin_mul_overflow(coef, k, &v)) return false;
    auto it = std::find_if(f.terms.begin(), f.terms.end(), [id = id](const auto& t) { return t.first == id; });
    if (it == f.terms.end()) f.terms.emplace_back(id, v);
    else if (__builtin_add_overflow(it->second, v, &it->second)) return false;
  }
  f.terms.erase(std::remove_if(f.terms.begin(), f.terms.end(), [](const auto& t) { return t.second == 0; }), f.terms.end());
  return true;
}

/// f at `vars`, when it fits int64 (else false: the caller takes access_operand's own arithmetic).
bool eval_exact(const Affine& f, const std::vector<int64_t>& vars, int64_t& out) {
  int64_t v = f.c, p = 0;
  for (auto [id, k] : f.terms)
    if (__builtin_mul_overflow(k, vars[static_cast<size_t>(id)], &p) || __builtin_add_overflow(v, p, &v)) return false;
  out = v;
  return true;
}
}  // namespace

int64_t Lowering::transpose_cols(size_t oi, const Access& a) const {
  // The partitions of the other side (dst: slot 0, src: slot 1) of the dma_transpose op `oi` whose
  // access `a` is: the number of columns of `a`'s side. 0 when it is not known (then nothing is split).
  const Op& op = k_.ops[oi];
  for (size_t s = 0; s < 2; ++s) {
    const auto& other = op.operands[1 - s];
    if (!op.operands[s] || &*op.operands[s] != &a || !other || other->tensor < 0 ||
        static_cast<size_t>(other->tensor) >= k_.tensors.size())
      continue;
    const Tensor& t = k_.tensors[static_cast<size_t>(other->tensor)];
    if (t.space == Space::kHbm) return 0;
    return static_cast<int64_t>(access_operand(t, *other, vars_, 0).num_partitions);
  }
  return 0;
}

void Lowering::operand_into(size_t oi, OperandForm& f, const Access& a, Operand& out, std::pair<int64_t, int64_t>& ext,
                            bool keep_dims) {
  const Tensor& t = k_.tensors[static_cast<size_t>(a.tensor)];
  if (!f.ready || f.keep != keep_dims) {
    // access_operand checks the access and gives the shape; the offset and start partition follow its
    // arithmetic: the visited dims' starts times their row-major strides (on chip the first is the
    // partition).
    Operand o = access_operand(t, a, vars_, 0, keep_dims);
    f.offset = Affine{};
    f.partition = Affine{};
    f.exact = true;
    if (!a.dims.empty()) {
      const std::vector<int64_t>& shape = access_shape(t, a);
      const int rank = static_cast<int>(shape.size());
      std::array<int64_t, kMaxRank> st{};
      int64_t sz = 1;
      for (int d = rank - 1; d >= 0 && f.exact; --d) {
        st[static_cast<size_t>(d)] = a.strides.empty() ? sz : a.strides[static_cast<size_t>(d)];
        f.exact = !__builtin_mul_overflow(sz, shape[static_cast<size_t>(d)], &sz) || d == 0;
      }
      const int64_t eb = access_elem_bytes(t, a);
      for (int i = 0; i < rank && f.exact; ++i) {
        const int d = a.order.empty() ? i : a.order[static_cast<size_t>(i)];
        const Affine& start = a.dims[static_cast<size_t>(d)].start;
        int64_t k = 0;
        if (i == 0 && on_chip(t.space)) f.partition = start;
        else f.exact = !__builtin_mul_overflow(st[static_cast<size_t>(d)], eb, &k) && add_scaled(f.offset, start, k);
      }
    }
    if (opcode_[oi] == static_cast<int>(Opcode::kDmaTranspose))
      transposed_hbm_rows(o, transpose_cols(oi, a), k_.ops[oi].iimm[0]);
    o.offset = 0;
    o.start_partition = 0;
    f.shape = o;
    f.extent = o.byte_extent();
    f.keep = keep_dims;
    f.ready = true;
  }
  int64_t off = 0;
  if (!f.exact || !eval_exact(f.offset, vars_, off) || __builtin_add_overflow(off, base_of(a.tensor), &off)) {
    out = access_operand(t, a, vars_, base_of(a.tensor), keep_dims);
    if (opcode_[oi] == static_cast<int>(Opcode::kDmaTranspose))
      transposed_hbm_rows(out, transpose_cols(oi, a), k_.ops[oi].iimm[0]);
    ext = out.byte_extent();
    return;
  }
  out = f.shape;
  out.offset = off;
  if (on_chip(t.space)) out.start_partition = static_cast<uint16_t>(f.partition.eval(vars_));
  // byte_extent() of out: the shape's extent moved by the offset (its offsets are verified to stay in memory).
  ext = {off + f.extent.first, off + f.extent.second};
}

bool Lowering::lower_op(const Op& op, Instr& out) {
  const auto oi = static_cast<size_t>(&op - k_.ops.data());
  last_op_ = static_cast<int>(oi);
  const int opc = opcode_[oi];
  const Head* t = &tmpl_[2 * oi];
  OperandForm* f = &forms_[form_base_[oi]];  // one per operand the op has, in slot order
  last_ext_ = &ext_;
  if (opc == kNcMatmul) {  // (dst, stationary, moving) -> load_stationary, multiply_moving
    // (dst, stationary and moving are always there (verify_kernel): their forms are f[0..2], then the
    // scales' in slot order.)
    t[0].into(out);
    out.opnd = {};
    t[1].into(pending_);
    pending_.opnd = {};
    OperandForm* scale = f + 3;
    operand_into(oi, f[1], *op.operands[1], out.opnd[0], ext_[0]);
    if (op.operands[3]) operand_into(oi, *scale++, *op.operands[3], out.opnd[1], ext_[1]);  // MX scales (nc_matmul_mx)
    operand_into(oi, f[0], *op.operands[0], pending_.opnd[0], pending_ext_[0]);
    operand_into(oi, f[2], *op.operands[2], pending_.opnd[1], pending_ext_[1]);
    if (op.operands[4]) operand_into(oi, *scale, *op.operands[4], pending_.opnd[2], pending_ext_[2]);
    apply_iimm(op, vars_, out);  // the PE tile (iimm) of both halves may move with a loop
    apply_iimm(op, vars_, pending_);
    has_pending_ = true;
    return true;
  }
  // The template's fields before the operands and its source location; no operand where the op has none,
  // the others written in place (an Instr is ~600 bytes, an operand 96).
  static_assert(offsetof(Instr, loc) == offsetof(Instr, opnd) + sizeof(Instr::opnd), "opnd is followed by loc only");
  t[0].into(out);
  apply_iimm(op, vars_, out);
  const bool keep = opc == static_cast<int>(Opcode::kTensorReduce) && op.axis_count != 0;
  for (size_t i = 0; i < isa::kMaxSlots; ++i) {
    if (!op.operands[i]) {
      out.opnd[i] = Operand{};
      continue;
    }
    operand_into(oi, *f++, *op.operands[i], out.opnd[i], ext_[i], keep && i == 1);
  }
  const int side = isa::indirect_slot(out);
  if (side >= 0) ext_[static_cast<size_t>(side)] = isa::slot_extent(out, side);  // the rows an index may reach
  if (side >= 0 && on_chip(out.opnd[static_cast<size_t>(side)].space)) {
    // A dynamic tensor_copy: every in-range runtime index keeps the moving side inside its tile's row (as
    // verify_kernel's check_indirect_reach; the buffer bound alone would let it read a neighbouring tile).
    const int ti = op.operands[static_cast<size_t>(side)]->tensor;
    const Tensor& t = k_.tensors[static_cast<size_t>(ti)];
    int64_t row = dtype_bytes(t.dtype);
    for (size_t d = 1; d < t.shape.size(); ++d) row *= t.shape[d];
    const int64_t end = ext_[static_cast<size_t>(side)].second;
    if (end > base_of(ti) + row)
      throw Error(ErrorCode::kOutOfBounds,
                  fmt::format("{}: operand '{}' of tile '{}': an index up to iimm[0] - 1 = {} moves it to bytes [.., {}) "
                              "per partition, past the tile's {} bytes at {}",
                              isa::op_info(out.op).mnemonic, isa::op_info(out.op).slots[static_cast<size_t>(side)].name,
                              t.name, out.iimm[0] - 1, end, row, base_of(ti)),
                  op.loc);
  }
  if (queue_base_[oi] >= 0) {  // automatic queue: by the rotating buffer of the on-chip side
    int buf = 0;
    if (on_chip(out.opnd[0].space)) buf = buffer_of(op.operands[0]->tensor);
    else if (on_chip(out.opnd[1].space)) buf = buffer_of(op.operands[1]->tensor);
    out.dma_queue = static_cast<uint8_t>(engines::trigger_queue(sim_.params(), out.engine, buf));
  }
  return true;
}

bool Lowering::next(Instr& out) {
  if (emitted_ >= progress_at_) {  // (emitted_ & 0xFFFF) == 0xFFFF, or a skip jumped past it
    progress_at_ = (emitted_ + 1) | kProgressMask;
    progress_(emitted_ + 1, sim_.total_time());
  }
  if (has_pending_) {
    out = pending_;
    last_ext_ = &pending_ext_;
    has_pending_ = false;
    ++emitted_;
    if (ff_.depth) ff_note_hbm(out, *last_ext_);
    return true;
  }
  while (!stack_.empty()) {
    Frame& f = stack_.back();
    if (f.pc >= f.body->size()) {
      if (f.loop >= 0) {  // next iteration of the loop, or leave it
        const Loop& l = k_.loops[static_cast<size_t>(f.loop)];
        int64_t& v = vars_[static_cast<size_t>(f.loop)];
        v += l.step;
        if (l.step > 0 ? v < l.stop : v > l.stop) {
          sim_.check_stop();  // a loop that emits nothing still sees an interrupt
          if (emitted_ != idle_since_) {
            idle_since_ = emitted_, idle_iterations_ = 0;
          } else if (const uint64_t lim = sim_.options().max_instructions; lim > 0 && ++idle_iterations_ > lim) {
            throw Error(ErrorCode::kResourceLimit,
                        fmt::format("instruction limit reached: loop '{}' ran more than {} iterations in a row without "
                                    "an instruction (max_instructions, 'nsim run --max-instructions'); raise the "
                                    "limit, or set it to 0 for none",
                                    l.var, lim),
                        l.loc);
          }
          if (ff_.on != 0) fast_forward_at(l, v);
          f.pc = 0;
          continue;
        }
      }
      if (ff_.depth == stack_.size()) ff_.depth = 0;  // the instance followed ends
      stack_.pop_back();
      continue;
    }
    const Stmt& s = (*f.body)[f.pc++];
    switch (s.kind) {
      case Stmt::Kind::kAlloc:
        ++alloc_count_[static_cast<size_t>(s.index)];
        rotate(static_cast<size_t>(s.index));
        break;
      case Stmt::Kind::kLoop: {
        const Loop& l = k_.loops[static_cast<size_t>(s.index)];
        if (l.trip_count() <= 0) break;
        if (!loop_has_ops(s.index)) {  // nothing to lower in any iteration: only its allocations to count
          skip_loop(s.index);
          break;
        }
        if (stack_.size() > static_cast<size_t>(kMaxLoopDepth))
          throw Error(ErrorCode::kBadLoop, fmt::format("loop '{}' nests deeper than {}", l.var, kMaxLoopDepth), l.loc);
        vars_[static_cast<size_t>(s.index)] = l.start;
        stack_.push_back(Frame{&l.body, 0, s.index});  // f is not used after this
        break;
      }
      case Stmt::Kind::kOp:
        if (lower_op(k_.ops[static_cast<size_t>(s.index)], out)) {
          ++emitted_;
          if (ff_.depth) ff_note_hbm(out, *last_ext_);
          return true;
        }
        break;
    }
  }
  return false;
}

void Lowering::run() {
  record_ = sim_.trace_sink() != nullptr;
  if (sim_.params().list_schedule) {  // as neuronxcc orders it (frontend/compiler/scheduler.h)
    Scheduler sch(k_, *this, sim_);
    sch.run();
  } else {
    Instr in;
    TileUses u;
    engines::SlotTags tags{};
    const bool check = sim_.checking();
    // with_schedule edges (and ops' "after" labels) hold in program order too: an op starts after the latest
    // instance of each op it runs after that came earlier (one later in program order cannot be waited for
    // without reordering: docs/timing-model.md "Program order").
    const std::vector<std::vector<int>> after = schedule_edges(k_);
    const bool edges = std::any_of(after.begin(), after.end(), [](const std::vector<int>& v) { return !v.empty(); });
    std::vector<sim::Ps> op_end(edges ? k_.ops.size() : 0, 0);
    while (next(in)) {
      if (record_ || check) tile_uses(last_op_, u);
      if (check) {
        slot_tags(last_op_, u, in, tags);
        sim_.set_slot_tags(&tags);
      }
      sim::Ps not_before = 0;
      if (edges && last_op_ >= 0)
        for (int b : after[static_cast<size_t>(last_op_)])
          if (b < last_op_) not_before = std::max(not_before, op_end[static_cast<size_t>(b)]);
      const InstrTiming t = sim_.submit(in, not_before);
      if (edges && last_op_ >= 0) op_end[static_cast<size_t>(last_op_)] = std::max(op_end[static_cast<size_t>(last_op_)], t.end);
      if (record_) note_tile_uses(u, t.start, t.end);
    }
  }
  if (record_) write_occupancy();
  name_check_reports();
}

bool Lowering::loop_has_ops(int loop) {
  if (loop_ops_.empty()) loop_ops_.assign(k_.loops.size(), -1);
  int8_t& known = loop_ops_[static_cast<size_t>(loop)];
  if (known < 0) known = body_runs_ops(k_, k_.loops[static_cast<size_t>(loop)].body) ? 1 : 0;
  return known > 0;
}

bool Lowering::count_allocs(int loop, int64_t times, std::vector<size_t>& touched) {
  for (const Stmt& s : k_.loops[static_cast<size_t>(loop)].body) {
    if (s.kind == Stmt::Kind::kAlloc) {
      const auto t = static_cast<size_t>(s.index);
      if (__builtin_add_overflow(alloc_count_[t], times, &alloc_count_[t])) return false;
      touched.push_back(t);
    } else if (s.kind == Stmt::Kind::kLoop) {
      const int64_t trips = k_.loops[static_cast<size_t>(s.index)].trip_count();
      int64_t n = 0;
      if (trips <= 0) continue;
      if (__builtin_mul_overflow(times, trips, &n) || !count_allocs(s.index, n, touched)) return false;
    }
  }
  return true;
}

void Lowering::skip_loop(int loop) {
  const Loop& l = k_.loops[static_cast<size_t>(loop)];
  std::vector<size_t> touched;
  if (!count_allocs(loop, l.trip_count(), touched))
    throw Error(ErrorCode::kResourceLimit,
                fmt::format("resource limit: loop '{}' allocates its tiles more than 2^63 times", l.var), l.loc);
  for (size_t t : touched) rotate(t);
  sim_.check_stop();  // (as each iteration would)
}

namespace {
int64_t iterations_left(const Loop& l, int64_t v) {  // v: the value of the iteration about to begin
  if (l.step > 0) return v < l.stop ? (l.stop - v + l.step - 1) / l.step : 0;
  return v > l.stop ? (v - l.stop - l.step - 1) / -l.step : 0;
}
}  // namespace

void Lowering::fast_forward_start(const Loop& l) {
  if (!ff_.samples) ff_.samples = std::make_unique<std::array<engines::RunStats::Sample, 2>>();
  ff_.depth = stack_.size();
  if (ff_sched_digest_) (void)ff_sched_digest_();  // (what a loop followed before left: dropped)
  ff_.iters = 0;
  ff_.period = 0;
  ff_.traced = false;
  ff_.periods.clear();
  for (int p = 1; p <= FastForward::kMaxPeriod; ++p) ff_.periods.push_back(p);
  ff_.run.assign(ff_.periods.size(), 0);
  ff_.ring.assign(static_cast<size_t>(FastForward::kMaxPeriod), {});
  ff_.last = {emitted_, sim_.instructions(), ff_admitted_ ? *ff_admitted_ : emitted_, sim_.local_time(), 0};
  ff_.hbm_cur.clear();
  ff_.hbm_hist.resize(static_cast<size_t>(FastForward::kHbmHistory));
  for (std::vector<FastForward::HbmTouch>& h : ff_.hbm_hist) h.clear();
  ff_.hbm_stride.clear();
  ff_.hbm_shared = ff_.hbm_dep_shared = false;
  ff_.hbm_steady = true;
  ff_.hbm_align = 1;
  // Tiles allocated in the body: how often per iteration (their rotating buffer advances that much).
  ff_.allocs.clear();
  ff_.align = ff_align_;
  // Also the HBM tensors the body accesses: one it both reads and writes through different accesses (its
  // index expressions differ: y[b + 1] = f(y[b])) may carry a dependency from one iteration to a later one at
  // another address, which the iterations skipped would hold and the dependency tracker would not learn. Such
  // a loop is not followed (distance_dep). Reads and writes through one access touch, in each iteration, the
  // rows that iteration writes (private to it, or the same rows in every iteration): nothing is missed.
  struct HbmUse {
    const Access* first = nullptr;
    bool read = false, written = false, same = true;
  };
  struct Walk {
    const Kernel& k;
    const std::vector<int>& opcode;
    std::vector<std::pair<size_t, int64_t>>& out;
    std::vector<HbmUse> hbm;
    void body(const std::vector<Stmt>& b, int64_t times) {
      for (const Stmt& s : b) {
        if (s.kind == Stmt::Kind::kAlloc) out.emplace_back(static_cast<size_t>(s.index), times);
        if (s.kind == Stmt::Kind::kOp) op(static_cast<size_t>(s.index));
        if (s.kind == Stmt::Kind::kLoop) {
          const Loop& inner = k.loops[static_cast<size_t>(s.index)];
          body(inner.body, times * std::max<int64_t>(0, inner.trip_count()));
        }
      }
    }
    void op(size_t oi) {
      const int opc = opcode[oi];
      if (opc == kUnknownOp) return;
      const isa::OpInfo& info = info_of(opc);
      const Op& o = k.ops[oi];
      // A gather / scatter (runtime offsets in slot 2) may reach any row of its HBM side whatever its access says.
      const bool indirect = (opc == static_cast<int>(Opcode::kDmaCopy) || opc == static_cast<int>(Opcode::kTensorCopy)) &&
                            o.operands[2].has_value();
      for (size_t i = 0; i < isa::kMaxSlots; ++i) {
        if (!o.operands[i]) continue;
        const Access& a = *o.operands[i];
        if (a.tensor < 0 || static_cast<size_t>(a.tensor) >= k.tensors.size() ||
            k.tensors[static_cast<size_t>(a.tensor)].space != isa::Space::kHbm)
          continue;
        if (hbm.size() < k.tensors.size()) hbm.resize(k.tensors.size());
        HbmUse& u = hbm[static_cast<size_t>(a.tensor)];
        const bool w = i < static_cast<size_t>(info.num_slots) && info.slots[i].written;
        (w ? u.written : u.read) = true;
        if (!u.first) u.first = &a;
        else if (!(*u.first == a)) u.same = false;
        if (indirect) u.same = false;
      }
    }
  } walk{k_, opcode_, ff_.allocs, {}};
  walk.body(l.body, 1);
  ff_.distance_dep = false;
  for (const HbmUse& u : walk.hbm) ff_.distance_dep |= u.read && u.written && !u.same;
  for (const auto& [t, n] : ff_.allocs) {
    const int bufs = std::max(1, placements_[t].bufs);
    ff_.align = std::lcm(ff_.align, static_cast<int64_t>(bufs));
  }
}

void Lowering::ff_long_periods(const FastForward::Step& step, int64_t left) {
  // A skip spans a whole number of `cycle` iterations: of the rotating buffers and the scheduler's reader lists
  // (align), of its critical-path refreshes (every ff_admit_align_ admissions) and of the active-time unions'
  // folds (every fold_every() instructions), for a body of step.admitted admissions and step.emitted
  // instructions. The refreshes reorder ties, so the steps of a loop can repeat every few iterations between
  // them and only every `cycle` iterations across them (the NKI tutorial's RMSNorm: 4 between refreshes, 1,536
  // across them): those periods are looked for too, where `left` iterations leave room to see one twice, then
  // sample one and skip one (a loop instance too short for them keeps the short ring).
  auto every = [](int64_t unit, int64_t per_iter) { return per_iter > 0 ? unit / std::gcd(unit, per_iter) : 1; };
  const auto fold = static_cast<int64_t>(engines::RunStats::fold_every());
  const int64_t cycle = std::lcm(std::lcm(ff_.align, every(ff_admit_align_, static_cast<int64_t>(step.admitted))),
                                 every(fold, static_cast<int64_t>(step.emitted)));
  for (int64_t q = 1; q <= FastForward::kMaxPeriod && cycle <= FastForward::kMaxLongPeriod; ++q) {
    const int64_t p = std::lcm(q, cycle);
    if (p > FastForward::kMaxPeriod && p <= FastForward::kMaxLongPeriod && 4 * p <= left &&
        std::find(ff_.periods.begin(), ff_.periods.end(), p) == ff_.periods.end())
      ff_.periods.push_back(p);
  }
  std::sort(ff_.periods.begin(), ff_.periods.end());
  ff_.run.assign(ff_.periods.size(), 0);
  ff_.ring.assign(static_cast<size_t>(ff_.periods.back()), {});
}

void Lowering::ff_note_hbm(const Instr& in, const Extents& ext) {
  if (!ff_hbm_.chunk_of || ff_.hbm_cur.size() > FastForward::kMaxHbmTouches) return;
  const isa::OpInfo& info = isa::op_info(in.op);
  for (int i = 0; i < info.num_slots; ++i) {
    const auto [lo, hi] = ext[static_cast<size_t>(i)];
    if (!in.slot(i).present() || in.slot(i).space != isa::Space::kHbm || hi <= lo) continue;
    const auto [c0, shift] = ff_hbm_.chunk_of(lo);
    if (c0 < 0) continue;  // a tensor the scheduler does not track (read-only)
    ff_.hbm_cur.push_back({c0, ff_hbm_.chunk_of(hi - 1).first, lo, hi, shift});
  }
  if (ff_.hbm_cur.size() > FastForward::kMaxHbmTouches)  // (too many to compare: not skipped)
    ff_.hbm_shared = true, ff_.hbm_steady = false;
}

void Lowering::ff_hbm_step() {
  using Touch = FastForward::HbmTouch;
  const auto hist = [&](int64_t it) -> std::vector<Touch>& {
    return ff_.hbm_hist[static_cast<size_t>(it % FastForward::kHbmHistory)];
  };
  if (ff_.iters >= 2) {
    const std::vector<Touch>& cur = ff_.hbm_cur;
    const std::vector<Touch>& prev = hist(ff_.iters - 1);
    const int64_t dep = std::max<int64_t>(1, sim_.params().hbm_dep_chunk_bytes);
    for (size_t i = 0; i < cur.size(); ++i)
      for (size_t j = 0; j < prev.size(); ++j) {
        const Touch &a = cur[i], &b = prev[j];
        if (a.lo == b.lo && a.hi == b.hi) {
          // The same bytes in both: fine for an access that stays put; through two accesses, one of which must
          // move, the scheduler would order them by their footprints, which a move of the states does not shift.
          if (i != j) ff_.hbm_steady = false;
          continue;
        }
        if (a.lo < b.hi && b.lo < a.hi) ff_.hbm_steady = false;  // overlapping bytes (as above)
        if (a.c0 <= b.c1 && b.c0 <= a.c1) ff_.hbm_shared = true;
        ff_.hbm_dep_shared |= a.lo / dep <= (b.hi - 1) / dep && b.lo / dep <= (a.hi - 1) / dep;
      }
    // Two iterations in one chunk of the simulator's dependency tracker (4 KiB) as well: a skip moves no tracker
    // state, so the scheduler's chunk states are not moved for them.
    if (ff_.hbm_shared && ff_.hbm_dep_shared) ff_.hbm_steady = false;
    if (cur.size() != prev.size()) ff_.hbm_steady = false;
    const bool first = ff_.hbm_stride.empty();
    if (ff_.hbm_steady) ff_.hbm_stride.resize(cur.size());
    for (size_t i = 0; ff_.hbm_steady && i < cur.size(); ++i) {
      const Touch &a = cur[i], &b = prev[i];
      const int64_t stride = a.lo - b.lo;
      // A constant stride, forwards, each access past the bytes of its previous one (a skip moves whole chunks).
      if (a.hi - b.hi != stride || a.shift != b.shift || stride < 0 || (stride > 0 && stride < a.hi - a.lo) ||
          (!first && ff_.hbm_stride[i] != stride)) {
        ff_.hbm_steady = false;
        break;
      }
      ff_.hbm_stride[i] = stride;
      const int64_t chunk = int64_t{1} << a.shift;
      if (stride > 0) ff_.hbm_align = std::lcm(ff_.hbm_align, chunk / std::gcd(chunk, stride));
    }
    if (ff_.hbm_align > FastForward::kMaxAlign) ff_.hbm_steady = false;
  }
  hist(ff_.iters).swap(ff_.hbm_cur);
  ff_.hbm_cur.clear();
}

bool Lowering::ff_hbm_moves(int64_t skip, std::vector<std::pair<int64_t, int64_t>>& moves) const {
  // Iteration i + skip of the full run finds in its chunks what iteration i left in the same chunks moved by
  // skip x stride bytes (a whole number of chunks: hbm_align). The last iterations whose chunks the iterations
  // after the skip still reach - chunk / stride + 1 of them per access - have their chunks' states moved there.
  // A chunk also reached by an access of another stride (one that stays put, or walks at another pace) would move
  // with only part of its history: then no skip.
  moves.clear();
  const std::vector<FastForward::HbmTouch>& last =
      ff_.hbm_hist[static_cast<size_t>(ff_.iters % FastForward::kHbmHistory)];
  if (ff_.hbm_stride.size() != last.size()) return false;
  int64_t reach = 1;  // iterations back whose chunks move
  for (size_t i = 0; i < last.size(); ++i)
    if (ff_.hbm_stride[i] > 0) {
      const int64_t chunk = int64_t{1} << last[i].shift;
      reach = std::max(reach, (chunk + ff_.hbm_stride[i] - 1) / ff_.hbm_stride[i] + 1);
    }
  if (reach >= FastForward::kHbmHistory || reach > ff_.iters) return false;
  std::map<int64_t, int64_t> stride_of;  // chunk -> the stride of the accesses reaching it
  for (int64_t j = 0; j < reach; ++j) {
    const std::vector<FastForward::HbmTouch>& h =
        ff_.hbm_hist[static_cast<size_t>((ff_.iters - j) % FastForward::kHbmHistory)];
    if (h.size() != last.size()) return false;
    for (size_t i = 0; i < h.size(); ++i) {
      const int64_t stride = ff_.hbm_stride[i];
      for (int64_t c = h[i].c0; c <= h[i].c1; ++c)
        if (stride_of.emplace(c, stride).first->second != stride) return false;
      if (stride == 0) continue;
      const int64_t bytes = skip * stride, chunk = int64_t{1} << h[i].shift;
      if (bytes % chunk != 0) return false;
      for (int64_t c = h[i].c0; c <= h[i].c1; ++c) moves.emplace_back(c, c + bytes / chunk);
    }
  }
  return true;
}

void Lowering::fast_forward_at(const Loop& l, int64_t& v) {
  if (ff_.on < 0) ff_.on = sim_.fast_forward_allowed() ? 1 : 0;
  if (ff_.on == 0) return;
  const size_t d = stack_.size();
  Frame& f = stack_.back();
  if (ff_.depth && ff_.depth < d) return;  // a loop inside the one followed
  if (f.ff_done) return;
  const int loop = static_cast<int>(&l - k_.loops.data());
  if (!ff_.depth) {
    if (iterations_left(l, v) < FastForward::kMinLoop) {
      sim_.note_fast_forward(loop, l.loc, engines::FfOutcome::kShort);
      f.ff_done = true;
      return;
    }
    fast_forward_start(l);
    if (ff_.align > FastForward::kMaxAlign || ff_.distance_dep) {
      sim_.note_fast_forward(loop, l.loc, ff_.distance_dep ? engines::FfOutcome::kRecurrence : engines::FfOutcome::kAlign);
      f.ff_done = true, ff_.depth = 0;
    }
    return;
  }
  FastForward::Step now{emitted_, sim_.instructions(), ff_admitted_ ? *ff_admitted_ : emitted_, sim_.local_time(),
                        sim_.timing_digest() ^ (ff_sched_digest_ ? ff_sched_digest_() : 0)};
  const FastForward::Step step{now.emitted - ff_.last.emitted, now.committed - ff_.last.committed,
                               now.admitted - ff_.last.admitted, now.time - ff_.last.time, now.digest};
  ff_.last = now;
  ++ff_.iters;
  auto stop_following = [&](engines::FfOutcome o) {
    if (o == engines::FfOutcome::kTooFewLeft && ff_.traced) o = engines::FfOutcome::kTraced;  // (the trace's doing)
    sim_.note_fast_forward(loop, l.loc, o);
    f.ff_done = true;
    ff_.depth = 0;
  };
  // The iteration just lowered against the one before it: one list scheduler chunk at different bytes, strides.
  ff_hbm_step();
  if (ff_.hbm_shared && !ff_.hbm_steady) return stop_following(engines::FfOutcome::kRowsShared);
  if (step.emitted == 0) return stop_following(engines::FfOutcome::kEmpty);
  if (ff_.iters == 1) ff_long_periods(step, iterations_left(l, v));
  const auto ring = static_cast<int64_t>(ff_.ring.size());
  for (size_t i = 0; i < ff_.periods.size(); ++i) {
    const int64_t p = ff_.periods[i];
    ff_.run[i] = ff_.iters > p && ff_.ring[static_cast<size_t>((ff_.iters - p) % ring)] == step ? ff_.run[i] + 1 : 0;
  }
  ff_.ring[static_cast<size_t>(ff_.iters % ring)] = step;
  // Repeating steps over `need` iterations, enough for the scheduler's window to turn over kWindowTurns times,
  // before each sample; `need` iterations are also left to simulate at the end.
  const int64_t window = std::max<int64_t>(1, sim_.params().schedule_window);
  const auto per_iter = static_cast<int64_t>(step.emitted);
  const int64_t need =
      std::max(FastForward::kMinNeed, (FastForward::kWindowTurns * window + per_iter - 1) / per_iter);
  const int64_t left = iterations_left(l, v);
  if (left < 2 * need) return stop_following(engines::FfOutcome::kTooFewLeft);  // too few left to gain anything
  if (ff_.period == 0) {
    // Not periodic: give up on this instance (a long period needs two of its lengths to show itself).
    const int64_t longest = ff_.periods.back() > FastForward::kMaxPeriod ? ff_.periods.back() : 0;
    if (ff_.iters > FastForward::kGiveUp * need + 2 * longest) return stop_following(engines::FfOutcome::kNoPeriod);
    for (size_t i = 0; i < ff_.periods.size(); ++i) {
      // Repeating for `need` iterations and, for a long period, for a whole period (the steps seen twice).
      if (ff_.run[i] < std::max(need, ff_.periods[i])) continue;
      ff_.period = ff_.periods[i];
      ff_.period_at = i;
      ff_.at_a = ff_.iters;
      ff_.abs_a = now;
      sim_.sample_stats((*ff_.samples)[0]);
      break;
    }
    return;
  }
  const int64_t since = ff_.iters - ff_.at_a;
  if (ff_.run[ff_.period_at] < need + since) {  // the repetition broke: measure again
    ff_.period = 0;
    return;
  }
  const int64_t span = std::lcm(std::lcm(ff_.period, ff_.align), ff_.hbm_shared ? ff_.hbm_align : 1);
  // Whole cycles of counted state: the active-time unions' folds (every fold_every() instructions) and the
  // scheduler's refreshes (every ff_admit_align_ admissions; an nc_matmul's two instructions are one admission,
  // so a span of whole refreshes in instructions was not one in admissions: the ties after the skip went the
  // other way, a random kernel with a matmul per iteration came out 203 ns of 12.3 ms long).
  const auto fold = engines::RunStats::fold_every();
  if (since < need || since % span != 0 || (now.committed - ff_.abs_a.committed) % fold != 0 ||
      (now.emitted - ff_.abs_a.emitted) % fold != 0 ||
      (now.admitted - ff_.abs_a.admitted) % static_cast<uint64_t>(ff_admit_align_) != 0)
    return;
  // A trace keeps slices until past its window's end or its limit: no skip before (a skipped iteration's slices must
  // be ones it drops). The loop stays followed, sample a kept: the trace may close in a later iteration.
  if (!sim_.trace_closed()) {
    ff_.traced = true;
    return;
  }
  // Sample b: `since` iterations after a, the same state relative to the end. Skip k repeats of them,
  // keeping `need` iterations at the end to run as simulated (the loop's tail and what follows).
  const uint64_t instrs = now.committed - ff_.abs_a.committed;
  int64_t k = (left - need) / since;
  if (k < 1) return stop_following(engines::FfOutcome::kTooFewLeft);
  if (instrs != static_cast<uint64_t>(since) * step.emitted) return stop_following(engines::FfOutcome::kNoPeriod);
  const sim::Ps dt = now.time - ff_.abs_a.time;
  sim_.sample_stats((*ff_.samples)[1]);
  if (!engines::RunStats::repeats_fit((*ff_.samples)[0], (*ff_.samples)[1], static_cast<uint64_t>(k), dt))
    return stop_following(engines::FfOutcome::kOverflow);  // a loop of ~2^40 iterations: simulate it
  // A run limit (max_instructions, max_sim_time_ns) inside the span: skip only up to it, so that the run stops at
  // the instruction the full run stops at, with its stats (a skip past it stopped the run at the loop's end).
  k = ff_limit_repeats(k, instrs, dt);
  if (k < 1) return stop_following(engines::FfOutcome::kLimit);
  const int64_t skip = k * since;
  if (ff_.hbm_shared) {  // the chunk states the last iterations left, moved to where the full run has them
    std::vector<std::pair<int64_t, int64_t>> moves;
    if (!ff_hbm_moves(skip, moves) || !ff_hbm_.move(moves, false)) return stop_following(engines::FfOutcome::kRowsShared);
    ff_hbm_.move(moves, true);
  }
  sim_.add_repeats((*ff_.samples)[0], (*ff_.samples)[1], static_cast<uint64_t>(k), instrs, k * dt);
  v += skip * l.step;
  for (const auto& [t, n] : ff_.allocs) {
    alloc_count_[t] += skip * n;
    rotate(t);
  }
  emitted_ += static_cast<uint64_t>(skip) * step.emitted;
  idle_since_ = emitted_;
  stop_following(engines::FfOutcome::kSkipped);
}

int64_t Lowering::ff_limit_repeats(int64_t k, uint64_t instrs, sim::Ps dt) const {
  const SimOptions& o = sim_.options();
  // The full run stops before an instruction once max_instructions were simulated, or once the simulated time
  // is past max_sim_time_ns (Simulator::check_limits): the state after k repeats must be one it reaches. (k x dt
  // fits: RunStats::repeats_fit.)
  if (o.max_instructions > 0 && instrs > 0) {
    const uint64_t room = (o.max_instructions - std::min(o.max_instructions, sim_.instructions())) / instrs;
    if (room < static_cast<uint64_t>(k)) k = static_cast<int64_t>(room);
  }
  if (o.max_sim_time_ns > 0 && dt > 0) {
    const sim::Ps t = sim_.total_time();
    const double room = std::floor((o.max_sim_time_ns - sim::ps_to_ns(t)) / sim::ps_to_ns(dt));
    if (room < static_cast<double>(k)) k = room > 0 ? static_cast<int64_t>(room) : 0;
    while (k > 0 && sim::ps_to_ns(t + k * dt) > o.max_sim_time_ns) --k;  // (the division's rounding)
  }
  return k;
}

int Lowering::op_of_source(uint32_t loc) const {
  const auto it = std::lower_bound(op_loc_.begin(), op_loc_.end(), loc);  // ids increase with the op index
  return it != op_loc_.end() && *it == loc ? static_cast<int>(it - op_loc_.begin()) : -1;
}

std::string Lowering::operand_names(int op) const {
  if (op < 0 || static_cast<size_t>(op) >= k_.ops.size()) return "";
  const Op& o = k_.ops[static_cast<size_t>(op)];
  const int opc = opcode_[static_cast<size_t>(op)];
  const isa::OpInfo& info = info_of(opc);
  std::string out;
  for (size_t i = 0; i < o.operands.size(); ++i) {
    if (!o.operands[i] || o.operands[i]->tensor < 0) continue;
    const char* slot = i < info.num_slots ? info.slots[i].name : "?";
    out += fmt::format("{}{}={}", out.empty() ? "" : " ", slot, k_.tensors[static_cast<size_t>(o.operands[i]->tensor)].name);
  }
  return out;
}

void Lowering::name_check_reports() {
  std::vector<engines::CheckReport>* reps = sim_.mutable_check_reports();
  if (!reps) return;
  for (engines::CheckReport& r : *reps) {
    if (r.slot < 0 || !r.tensor.empty()) continue;
    const int oi = op_of_source(r.loc_id);
    if (oi < 0) continue;
    const Op& op = k_.ops[static_cast<size_t>(oi)];
    int slot = r.slot;
    if (opcode_of(op.name) == kNcMatmul) {  // load_stationary(stationary), multiply_moving(dst, moving)
      slot = r.op == "load_stationary" ? (r.slot == 1 ? 3 : 1) : r.slot == 0 ? 0 : r.slot == 2 ? 4 : 2;
      r.op = op.name;  // the kernel's op, as the kernel wrote it
    }
    if (slot < 0 || static_cast<size_t>(slot) >= op.operands.size() || !op.operands[static_cast<size_t>(slot)]) continue;
    const int t = op.operands[static_cast<size_t>(slot)]->tensor;
    if (t >= 0 && static_cast<size_t>(t) < k_.tensors.size()) r.tensor = k_.tensors[static_cast<size_t>(t)].name;
  }
}

void Lowering::tile_uses(int op, TileUses& out) const {
  out.fill(TileUse{});
  if (op < 0) return;
  const Op& o = k_.ops[static_cast<size_t>(op)];
  for (size_t i = 0; i < isa::kMaxSlots; ++i) {
    if (!o.operands[i]) continue;
    const int t = o.operands[i]->tensor;
    if (t < 0 || placements_[static_cast<size_t>(t)].tensor < 0) continue;  // HBM
    out[i] = TileUse{t, alloc_count_[static_cast<size_t>(t)], base_of(t)};
  }
}

void Lowering::slot_tags(int op, const TileUses& u, const Instr& in, engines::SlotTags& out) const {
  out.fill(0);
  if (op < 0) return;
  auto tag = [&](size_t op_slot) -> uint8_t {
    const TileUse& x = u[op_slot];
    if (x.tensor < 0 || k_.tensors[static_cast<size_t>(x.tensor)].address >= 0) return 0;  // HBM, manual
    return engines::slot_tag(x.tensor, x.instance);
  };
  const int opc = opcode_[static_cast<size_t>(op)];
  if (opc == kNcMatmul) {  // ops: dst, stationary, moving, stationary_scale, moving_scale
    if (in.op == Opcode::kLoadStationary) out[0] = tag(1), out[1] = tag(3);
    if (in.op == Opcode::kMultiplyMoving) out[0] = tag(0), out[1] = tag(2), out[2] = tag(4);
    return;
  }
  if (opc != static_cast<int>(in.op)) return;  // an instruction of another layout
  for (size_t i = 0; i < isa::kMaxSlots; ++i) out[i] = tag(i);
}

void Lowering::note_tile_uses(const TileUses& u, sim::Ps start, sim::Ps end) {
  // With a trace limit or window, only instructions the trace keeps are recorded: the table then stays
  // bounded by the slices kept, not by the kernel's instruction count. (In the trace's time: after iterations
  // skipped, which happens only once it keeps nothing more, later than the instructions' own.)
  start += sim_.skipped_time(), end += sim_.skipped_time();
  if (const sim::TraceSink* tr = sim_.trace_sink(); tr && !tr->keeps(start, end - start)) return;
  for (const TileUse& x : u) {
    if (x.tensor < 0) continue;
    const auto t = static_cast<size_t>(x.tensor);
    if (t >= live_.size()) live_.resize(t + 1);
    LiveRanges& l = live_[t];
    if (l.r.empty()) l.first = x.instance;
    if (x.instance < l.first) {  // (an earlier instance seen late: the list scheduler reorders within its window)
      l.r.insert(l.r.begin(), static_cast<size_t>(l.first - x.instance), LiveRange{});
      l.first = x.instance;
    }
    const auto i = static_cast<size_t>(x.instance - l.first);
    if (i >= l.r.size()) l.r.resize(i + 1);
    LiveRange& r = l.r[i];
    if (r.first < 0) {
      r = {start, end, x.offset};
    } else {
      r.first = std::min(r.first, start);
      r.last = std::max(r.last, end);
    }
  }
}

void Lowering::write_occupancy() {
  // Bytes per partition covered by the storage of live tile allocations (each from its first use to
  // its last); storage shared by tiles is counted once, so the track never exceeds the memory.
  sim::TraceSink* tr = sim_.trace_sink();
  if (!tr) return;
  const int64_t chunk = std::max<int64_t>(4, sim_.params().dep_chunk_bytes);
  for (Space sp : {Space::kSbuf, Space::kPsum}) {
    struct Ev {
      sim::Ps at;
      int delta;
      int64_t lo, hi;  // chunk range
      bool operator<(const Ev& o) const { return at < o.at || (at == o.at && delta < o.delta); }
    };
    std::vector<Ev> ev;
    int64_t top = 0;
    for (size_t t = 0; t < live_.size(); ++t) {
      if (live_[t].r.empty() || k_.tensors[t].space != sp) continue;
      for (const LiveRange& r : live_[t].r) {
        if (r.first < 0) continue;
        const int64_t lo = r.offset / chunk, hi = (r.offset + placements_[t].stride + chunk - 1) / chunk;
        ev.push_back({r.first, +1, lo, hi});
        ev.push_back({r.last, -1, lo, hi});
        top = std::max(top, hi);
      }
    }
    std::sort(ev.begin(), ev.end());  // at one time, releases before acquisitions
    std::vector<int32_t> users(static_cast<size_t>(top), 0);
    const std::string name = sp == Space::kSbuf ? "sbuf bytes/partition in use" : "psum bytes/partition in use";
    tr->counter(name, 0, 0);
    int64_t covered = 0;  // chunks with at least one live user
    for (size_t i = 0; i < ev.size();) {
      const sim::Ps at = ev[i].at;
      for (; i < ev.size() && ev[i].at == at; ++i)
        for (int64_t c = ev[i].lo; c < ev[i].hi; ++c) {
          int32_t& u = users[static_cast<size_t>(c)];
          if (ev[i].delta > 0 && u++ == 0) ++covered;
          if (ev[i].delta < 0 && --u == 0) --covered;
        }
      tr->counter(name, at, static_cast<double>(covered * chunk));
    }
  }
  live_.clear();
}

}  // namespace nsim::frontend
