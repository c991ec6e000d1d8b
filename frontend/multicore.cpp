// MultiCoreRun: see multicore.h.
#include "frontend/multicore.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <unordered_map>

#include "frontend/compiler/scheduler.h"
#include "frontend/inputs.h"
#include "frontend/lower.h"
#include "isa/semantics/semantics.h"
#include "sim/trace.h"

namespace nsim::frontend {

using isa::Opcode;
using sim::Ps;

/// One core: its lowering and the step interface of its schedule (the list scheduler, or program
/// order with compiler.schedule: program_order).
struct MultiCoreRun::Core {
  const Kernel& k;
  Simulator& sim;
  Lowering low;
  std::unique_ptr<Scheduler> sch;
  // program order
  isa::Instr pending{};
  int pending_op = -1;
  bool has_pending = false;
  Ps pending_start = 0;
  // state of the driver
  bool done = false;
  bool waiting = false;  ///< its next instruction is a rendezvous the peer has not reached
  Ps arrive = 0;
  int last_op = -1;      ///< op of the last instruction issued (for messages)

  Core(const Kernel& kk, Simulator& s) : k(kk), sim(s), low(kk, s) {
    if (s.params().list_schedule) sch = std::make_unique<Scheduler>(kk, low, s);
  }
  bool prepare() {
    if (sch) return sch->prepare();
    if (has_pending) return true;
    if (!low.next(pending)) return false;
    pending_op = low.last_op();
    has_pending = true;
    // Only this core's own instructions change it, and none issues before this one: computed once.
    pending_start = std::max(sim.operands_ready(pending, pending.engine), sim.engine_free(pending, pending.engine));
    return true;
  }
  Ps next_start() const { return sch ? sch->next_start() : pending_start; }
  const isa::Instr& next_instr() const { return sch ? sch->next_instr() : pending; }
  int next_op() const { return sch ? sch->next_op() : pending_op; }
  InstrTiming commit(Ps not_before) {
    last_op = next_op();
    if (sch) return sch->commit(not_before);
    has_pending = false;
    return sim.submit(pending, not_before);
  }
  SourceLoc loc(int op) const { return op >= 0 && static_cast<size_t>(op) < k.ops.size() ? k.ops[static_cast<size_t>(op)].loc : SourceLoc{}; }
  std::string where(int op) const {
    const std::string s = loc(op).str();
    return s.empty() ? std::string("an unknown location") : s;
  }
};

namespace {

bool is_rendezvous(Opcode op) { return op == Opcode::kSendrecv || op == Opcode::kCoreBarrier; }

std::string core_trace_path(const std::string& path, int c) {
  return fmt::format("{}.core{}.tmp{}", path, c, sim::is_protobuf_trace_path(path) ? ".pftrace" : "");
}

}  // namespace

MultiCoreRun::MultiCoreRun(const Kernel& launch, const sim::Config& cfg, const SimOptions& opts)
    : launch_(launch), opts_(opts) {
  const int n = static_cast<int>(launch.core_programs.size());
  if (n < 1 || n > 2)
    throw Error(ErrorCode::kMultiCoreLaunch, fmt::format("a launch has 1 or 2 core programs, this one has {}", n));
  for (int c = 0; c < n; ++c) {
    SimOptions o = opts;
    o.core_index = c;
    if (!opts.trace_path.empty()) o.trace_path = core_trace_path(opts.trace_path, c);
    sims_.push_back(std::make_unique<Simulator>(cfg, o));
  }
  const engines::CoreParams& p = sims_[0]->params();
  if (n > p.cores_per_stack)
    throw Error(ErrorCode::kLncNotSupported,
                fmt::format("kernel '{}' is an LNC={} launch, but a logical core of {} (generation {}) is {} physical "
                            "core{} (hbm.cores_per_stack): run it on trn2 or trn3, or launch it with kernel[1]",
                            launch.name, n, p.name, p.generation, p.cores_per_stack, p.cores_per_stack == 1 ? "" : "s"));
  for (int c = 0; c < n; ++c) verify_kernel(launch.core_programs[static_cast<size_t>(c)], sims_[static_cast<size_t>(c)]->params());
  for (int c = 1; c < n; ++c) sims_[static_cast<size_t>(c)]->attach_peer(*sims_[0]);
  // HBM: the launch's tensors (the union of the programs') once, in core 0's storage, in order.
  Lowering::allocate_hbm(launch, *sims_[0]);
  for (int c = 0; c < n; ++c) {
    Lowering::allocate_hbm(launch.core_programs[static_cast<size_t>(c)], *sims_[0]);  // private ones
    sims_[static_cast<size_t>(c)]->reserve_hbm_deps();
  }
  for (int c = 1; c < n; ++c) sims_[static_cast<size_t>(c)]->reserve_hbm_deps();
  if (opts.check && n > 1) {
    const memory::Memory& hbm = sims_[0]->memory();
    race_ = std::make_unique<engines::RaceChecker>(
        [&hbm](int64_t addr) {
          for (const std::string& name : hbm.hbm_tensor_names()) {
            const memory::HbmTensor& t = hbm.hbm_tensor(name);
            if (addr >= t.addr && addr < t.addr + t.bytes) return std::make_pair(name, t.addr);
          }
          return std::make_pair(std::string(), int64_t{0});
        },
        [this](int core, uint32_t loc) { return sims_[static_cast<size_t>(core)]->source(loc); });
  }
}

MultiCoreRun::~MultiCoreRun() = default;

void MultiCoreRun::write_inputs(const InputViews& given, uint64_t seed) {
  frontend::write_inputs(launch_, *sims_[0], given, seed);
}

namespace {

// A contiguous copy of a view's elements (partition-major), as a view onto `buf`.
isa::TileView snapshot(const isa::TileView& src, std::vector<uint8_t>& buf, isa::ArchState& st) {
  isa::TileView t;
  t.dtype = src.dtype;
  t.partitions = src.partitions;
  t.nfree = src.nfree;
  t.size = src.size;
  int64_t stride = 1;
  for (int d = t.nfree - 1; d >= 0; --d) {
    t.stride[static_cast<size_t>(d)] = stride;
    stride *= t.size[static_cast<size_t>(d)];
  }
  const int64_t eb = dtype_bytes(src.dtype);
  t.partition_stride_bytes = src.elems() * eb;
  buf.assign(static_cast<size_t>(t.partition_stride_bytes * src.partitions), 0);
  t.base = buf.data();
  isa::Instr cp{};
  cp.op = Opcode::kDmaCopy;
  isa::Views v{};
  v[0] = t;
  v[1] = src;
  isa::execute(cp, v, st);
  return t;
}

}  // namespace

void MultiCoreRun::meet() {
  // Both cores wait at a rendezvous: check that the calls match, move sendrecv data, issue both at
  // the later arrival.
  Core& a = *cs_[0];
  Core& b = *cs_[1];
  const isa::Instr& ia = a.next_instr();
  const isa::Instr& ib = b.next_instr();
  const int oa = a.next_op(), ob = b.next_op();
  auto mismatch = [&](const std::string& why) {
    throw Error(ErrorCode::kPeerMismatch,
                fmt::format("LNC=2 rendezvous mismatch: core 0 is at {} ({}) and core 1 at {} ({}): {}", isa::op_info(ia.op).mnemonic,
                            a.where(oa), isa::op_info(ib.op).mnemonic, b.where(ob), why),
                a.loc(oa));
  };
  if (ia.op != ib.op) mismatch("one core calls sendrecv while the other calls core_barrier");
  if (ia.op == Opcode::kSendrecv) {
    if (ia.iimm[0] != ib.iimm[0]) mismatch(fmt::format("pipe_id {} vs {}", ia.iimm[0], ib.iimm[0]));
    if (ia.iimm[1] != 1 || ia.iimm[2] != 1 || ib.iimm[1] != 0 || ib.iimm[2] != 0)
      mismatch(fmt::format("core 0 sends to rank {} and receives from rank {}, core 1 sends to rank {} and receives "
                           "from rank {}: each core exchanges with the other (ranks 1 and 0)",
                           ia.iimm[1], ia.iimm[2], ib.iimm[1], ib.iimm[2]));
    const isa::Operand &da = ia.slot(0), &sa = ia.slot(1), &db = ib.slot(0), &sb = ib.slot(1);
    if (da.dtype != sb.dtype || db.dtype != sa.dtype || da.num_partitions != sb.num_partitions ||
        db.num_partitions != sa.num_partitions || da.elems_per_partition() != sb.elems_per_partition() ||
        db.elems_per_partition() != sa.elems_per_partition())
      mismatch(fmt::format("core 0 sends [{}, {}] {} into core 1's [{}, {}] {} (and the reverse must match too)",
                           sa.num_partitions, sa.elems_per_partition(), dtype_name(sa.dtype), db.num_partitions,
                           db.elems_per_partition(), dtype_name(db.dtype)));
    if (a.sim.numerics() && b.sim.numerics()) {
      std::vector<uint8_t> buf_a, buf_b;
      const isa::TileView snap_a = snapshot(a.sim.memory().resolve(sa), buf_a, a.sim.arch_state());
      const isa::TileView snap_b = snapshot(b.sim.memory().resolve(sb), buf_b, b.sim.arch_state());
      isa::Instr cp{};
      cp.op = Opcode::kDmaCopy;
      isa::Views v{};
      v[0] = a.sim.memory().resolve(da);
      v[1] = snap_b;
      isa::execute(cp, v, a.sim.arch_state());
      v[0] = b.sim.memory().resolve(db);
      v[1] = snap_a;
      isa::execute(cp, v, b.sim.arch_state());
    }
  }
  const Ps t = std::max(a.arrive, b.arrive);
  a.commit(t);
  b.commit(t);
  if (race_) race_->rendezvous(t);
  a.waiting = b.waiting = false;
  ++rendezvous_;
}

void MultiCoreRun::run() {
  if (ran_) throw Error(ErrorCode::kInternal, "MultiCoreRun::run() called twice");
  ran_ = true;
  try {
    step_all();
  } catch (...) {
    // A limit (E416), a signal (E417) or a kernel error: the cores' traces still become one valid file.
    try {
      finish();
    } catch (...) {
    }
    throw;
  }
  finish();
}

void MultiCoreRun::finish() {
  if (finished_) return;
  finished_ = true;
  const int n = cores();
  for (auto& s : sims_) s->finish();
  if (!opts_.trace_path.empty()) {
    std::vector<std::string> parts;
    for (int c = 0; c < n; ++c) parts.push_back(core_trace_path(opts_.trace_path, c));
    merge_core_traces(opts_.trace_path, parts);
  }
}

void MultiCoreRun::step_all() {
  const int n = cores();
  for (int c = 0; c < n; ++c)
    cs_.push_back(std::make_unique<Core>(launch_.core_programs[static_cast<size_t>(c)], *sims_[static_cast<size_t>(c)]));
  for (;;) {
    int best = -1;
    Ps bt = 0;
    for (int c = 0; c < n; ++c) {
      Core& k = *cs_[static_cast<size_t>(c)];
      if (k.done || k.waiting) continue;
      if (!k.prepare()) {
        k.done = true;
        continue;
      }
      const Ps t = k.next_start();
      if (best < 0 || t < bt) best = c, bt = t;
    }
    if (best < 0) {
      // Nobody can issue: every core finished, or one waits for a peer that finished.
      for (int c = 0; c < n; ++c) {
        Core& w = *cs_[static_cast<size_t>(c)];
        if (!w.waiting) continue;
        const Core& o = *cs_[static_cast<size_t>(1 - c)];
        throw Error(ErrorCode::kPeerMissing,
                    fmt::format("LNC=2 deadlock: core {} waits at {} ({}) for core {}, which finished its program "
                                "(last instruction from {}) without reaching a matching {}",
                                c, isa::op_info(w.next_instr().op).mnemonic, w.where(w.next_op()), 1 - c,
                                o.where(o.last_op), isa::op_info(w.next_instr().op).mnemonic),
                    w.loc(w.next_op()));
      }
      break;
    }
    Core& k = *cs_[static_cast<size_t>(best)];
    if (n > 1 && is_rendezvous(k.next_instr().op)) {
      k.waiting = true;
      k.arrive = bt;
      if (cs_[0]->waiting && cs_[1]->waiting) meet();
      continue;
    }
    if (race_ && isa::is_dma(k.next_instr().op)) {
      const isa::Instr in = k.next_instr();  // the scheduler's copy is gone after commit
      const InstrTiming t = k.commit(0);
      race_->issued(in, best, t.start, t.end, t.index);
      continue;
    }
    k.commit(0);
  }
}

Ps MultiCoreRun::total_time() const {
  Ps t = 0;
  for (const auto& s : sims_) t = std::max(t, s->total_time());
  return t;
}

sim::StatsRegistry MultiCoreRun::stats() const {
  const int n = cores();
  std::vector<sim::StatsRegistry> per;
  int last = 0;
  for (int c = 0; c < n; ++c) {
    per.push_back(sims_[static_cast<size_t>(c)]->stats());
    if (sims_[static_cast<size_t>(c)]->total_time() > sims_[static_cast<size_t>(last)]->total_time()) last = c;
  }
  sim::StatsRegistry r;
  for (const sim::StatEntry& e : per[static_cast<size_t>(last)].entries()) {
    double v = e.value;
    if (e.unit == "count" || e.unit == "bytes" || e.unit == "flops") {
      v = 0;
      for (const auto& pc : per) v += pc.has(e.name) ? pc.get(e.name) : 0.0;
    }
    r.add(e.name, v, e.unit, e.description);
  }
  const double t0 = sim::ps_to_ns(sims_[0]->total_time());
  const double t1 = n > 1 ? sim::ps_to_ns(sims_[1]->total_time()) : t0;
  const double tmax = std::max(t0, t1);
  r.add("lnc.cores", n, "count", "physical cores of the launch (the LNC degree)");
  r.add("lnc.critical_core", last, "count", "the core that finishes last (its time is the launch's total_time)");
  r.add("lnc.imbalance_percent", tmax > 0 ? 100.0 * (tmax - std::min(t0, t1)) / tmax : 0.0, "%",
        "load imbalance: (later core's time - earlier core's time) / later core's time");
  r.add("lnc.rendezvous", static_cast<double>(rendezvous_), "count", "sendrecv / core_barrier rendezvous completed");
  for (int c = 0; c < n; ++c)
    for (const sim::StatEntry& e : per[static_cast<size_t>(c)].entries())
      r.add(fmt::format("core{}.{}", c, e.name), e.value, e.unit, e.description);
  return r;
}

std::vector<Simulator::LineStats> MultiCoreRun::line_stats() const {
  std::vector<Simulator::LineStats> v;
  std::unordered_map<std::string, size_t> at;
  for (const auto& s : sims_)
    for (const Simulator::LineStats& l : s->line_stats()) {
      auto [it, fresh] = at.try_emplace(fmt::format("{}\n{}\n{}", l.loc.file, l.loc.line, l.loc.function), v.size());
      if (fresh) {
        v.push_back(l);
      } else {
        v[it->second].instructions += l.instructions;
        v[it->second].instr_time += l.instr_time;
      }
    }
  std::stable_sort(v.begin(), v.end(), [](const Simulator::LineStats& a, const Simulator::LineStats& b) {
    return a.instr_time > b.instr_time;
  });
  return v;
}

std::vector<engines::CheckReport> MultiCoreRun::check_reports() const {
  std::vector<engines::CheckReport> v;
  for (const auto& s : sims_) v.insert(v.end(), s->check_reports().begin(), s->check_reports().end());
  if (race_) v.insert(v.end(), race_->reports().begin(), race_->reports().end());
  return v;
}

void merge_core_traces(const std::string& path, const std::vector<std::string>& core_paths) {
  if (sim::is_protobuf_trace_path(path)) {
    // A protobuf Trace is a sequence of packets: the cores' files (processes 1 and 2, their own packet
    // sequences and track uuids) concatenate into one trace.
    std::string out;
    for (const std::string& p : core_paths) {
      std::ifstream in(p, std::ios::binary);
      std::stringstream ss;
      ss << in.rdbuf();
      out += ss.str();
      std::remove(p.c_str());
    }
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (!f) throw Error(ErrorCode::kCannotWrite, fmt::format("cannot open trace file '{}' for writing", path));
    const bool ok = std::fwrite(out.data(), 1, out.size(), f) == out.size();
    if (std::fclose(f) != 0 || !ok) throw Error(ErrorCode::kCannotWrite, fmt::format("cannot write trace file '{}'", path));
    return;
  }
  // Each part: {"displayTimeUnit": "ns", "traceEvents": [\n<events>\n]}\n with pid 1; core c gets pid c + 1.
  std::string out;
  for (size_t c = 0; c < core_paths.size(); ++c) {
    std::ifstream in(core_paths[c], std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    std::string s = ss.str();
    const size_t open = s.find("[\n");
    const size_t close = s.rfind("\n]");
    if (open == std::string::npos || close == std::string::npos || close < open)
      throw Error(ErrorCode::kInternal, fmt::format("trace part '{}' is malformed", core_paths[c]));
    std::string events = s.substr(open + 2, close - open - 2);
    if (c > 0) {
      // Events are compact one-line objects (ChromeTraceWriter, nlohmann/json): "pid":1 in each.
      const std::string from = "\"pid\":1,", to = fmt::format("\"pid\":{},", c + 1);
      for (size_t i = events.find(from); i != std::string::npos; i = events.find(from, i + to.size()))
        events.replace(i, from.size(), to);
      out += ",\n";
    } else {
      out = s.substr(0, open + 2);
    }
    out += events;
    std::remove(core_paths[c].c_str());
  }
  out += "\n]}\n";
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) throw Error(ErrorCode::kCannotWrite, fmt::format("cannot open trace file '{}' for writing", path));
  const bool ok = std::fwrite(out.data(), 1, out.size(), f) == out.size();
  if (std::fclose(f) != 0 || !ok) throw Error(ErrorCode::kCannotWrite, fmt::format("cannot write trace file '{}'", path));
}

}  // namespace nsim::frontend
