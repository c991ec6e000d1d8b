#include "engines/params.h"

#include <fmt/format.h>

namespace nsim::engines {

namespace {
constexpr sim::ParamDecl kSchema[] = {
#define PARAM(k, kind, lo, hi, d) {k, sim::ParamKind::kind, d, lo, hi},
#include "engines/params.def"
#undef PARAM
};
}  // namespace

std::span<const sim::ParamDecl> param_schema() { return kSchema; }

sim::Config load_config(std::string_view preset_or_path, const std::vector<std::string>& overrides) {
  return sim::Config::load(preset_or_path, param_schema(), overrides);
}

CoreParams CoreParams::from_config(const sim::Config& c) {
  CoreParams p;
  p.name = c.get_string("name");
  p.generation = static_cast<int>(c.get_int("generation"));
  using isa::Engine;
  p.clock[static_cast<size_t>(Engine::kTensor)] = sim::ClockDomain(c.freq_ghz("clock.tensor"));
  p.clock[static_cast<size_t>(Engine::kVector)] = sim::ClockDomain(c.freq_ghz("clock.vector"));
  p.clock[static_cast<size_t>(Engine::kScalar)] = sim::ClockDomain(c.freq_ghz("clock.scalar"));
  p.clock[static_cast<size_t>(Engine::kGpsimd)] = sim::ClockDomain(c.freq_ghz("clock.gpsimd"));
  p.clock[static_cast<size_t>(Engine::kSync)] = sim::ClockDomain(c.freq_ghz("clock.sync"));

  p.pe_rows = static_cast<int>(c.get_int("tensor.pe_rows"));
  p.pe_cols = static_cast<int>(c.get_int("tensor.pe_cols"));
  p.moving_fmax = c.get_int("tensor.moving_fmax");
  p.moving_fmax_bf16 = c.get_int("tensor.moving_fmax_bf16");
  p.mm_min_ii = static_cast<double>(c.cycles("tensor.mm_min_ii_cycles"));
  p.ls_speedup = static_cast<int>(c.get_int("tensor.ls_speedup"));
  p.fp32_factor = static_cast<double>(c.get_int("tensor.fp32_factor"));
  p.fp32_onezero_factor = static_cast<double>(c.get_int("tensor.fp32_onezero_factor"));
  p.transpose_fp32_factor = static_cast<double>(c.get_int("tensor.transpose_fp32_factor"));
  p.fp8_double_row = c.get_bool("tensor.fp8_double_row");
  p.dst_bf16 = c.get_bool("tensor.dst_bf16");
  p.mm_latency = static_cast<double>(c.cycles("tensor.mm_latency_cycles"));
  const std::string formula = c.get_string("tensor.cost_formula");
  if (formula != "arch" && formula != "isa")
    throw Error(ErrorCode::kConfigBadValue,
                fmt::format("tensor.cost_formula: expected 'arch' or 'isa', found '{}'", formula));
  p.cost_formula_isa = formula == "isa";
  const double adj_fp32 = c.get_real("tensor.adjusted_flops_fp32"), adj_fp8 = c.get_real("tensor.adjusted_flops_fp8");
  if (!(adj_fp32 > 0) || !(adj_fp8 > 0))
    throw Error(ErrorCode::kConfigBadValue, "tensor.adjusted_flops_fp32 / _fp8: expected a positive multiplier");
  p.adjusted_flops.fill(1.0);
  p.adjusted_flops[static_cast<size_t>(DType::kFloat32)] = adj_fp32;
  for (DType t : {DType::kFloat8E4M3, DType::kFloat8E4M3FN, DType::kFloat8E5M2})
    p.adjusted_flops[static_cast<size_t>(t)] = adj_fp8;
  p.throttle.enabled = c.get_bool("tensor.throttle.enabled");
  p.throttle.start_util = c.get_real("tensor.throttle.start_util");
  p.throttle.ramp = c.time_ps("tensor.throttle.ramp");
  p.throttle.window = c.time_ps("tensor.throttle.window");
  p.throttle.reengage_util = c.get_real("tensor.throttle.reengage_util");

  p.vector_min_ii = static_cast<double>(c.cycles("vector.min_ii_cycles"));
  p.vector_fixed_latency = static_cast<double>(c.cycles("vector.fixed_latency_cycles"));
  p.vector_perf_modes = c.get_bool("vector.perf_modes");
  p.vector_perf_mode_fp8 = c.get_bool("vector.perf_mode_fp8");
  p.vector_fp32_perf_mode = c.get_bool("vector.fp32_perf_mode");
  p.vector_reciprocal_factor = static_cast<double>(c.get_int("vector.reciprocal_factor"));
  p.vector_bn_aggr_factor = c.get_real("vector.bn_aggr_factor");
  p.vector_dynamic_copy = static_cast<double>(c.cycles("vector.dynamic_copy_cycles"));
  p.scalar_min_ii = static_cast<double>(c.cycles("scalar.min_ii_cycles"));
  p.scalar_fixed_latency = static_cast<double>(c.cycles("scalar.fixed_latency_cycles"));
  p.scalar_act_table_load = c.time_ps("scalar.act_table_load");
  p.act_table_set.fill(-1);
  int set = 0;
  for (const std::string& entry : c.get_list("scalar.act_table_sets")) {
    size_t pos = 0;
    while (pos <= entry.size()) {
      size_t plus = entry.find('+', pos);
      if (plus == std::string::npos) plus = entry.size();
      const std::string fn = entry.substr(pos, plus - pos);
      auto f = isa::act_from_name(fn);
      if (!f)
        throw Error(ErrorCode::kConfigBadValue,
                    fmt::format("scalar.act_table_sets: '{}' is not an activation function", fn));
      p.act_table_set[static_cast<size_t>(*f)] = set;
      pos = plus + 1;
    }
    ++set;
  }
  p.scalar_perf_mode_2x = c.get_bool("scalar.perf_mode_2x");
  p.scalar_tensor_ops = c.get_bool("scalar.tensor_ops");
  p.gpsimd_min_ii = static_cast<double>(c.cycles("gpsimd.min_ii_cycles"));
  p.gpsimd_start_overhead = static_cast<double>(c.cycles("gpsimd.start_overhead_cycles"));
  p.gpsimd_fixed_latency = static_cast<double>(c.cycles("gpsimd.fixed_latency_cycles"));
  p.gpsimd_rsqrt_factor = static_cast<double>(c.get_int("gpsimd.rsqrt_factor"));
  p.stride_penalty_bytes = c.bytes("sbuf.stride_penalty_bytes");

  p.sem_latency = c.time_ps("sync.engine_sem_latency");
  p.trigger_instr = c.time_ps("sync.trigger_instr");
  p.dma_engines = static_cast<int>(c.get_int("dma.engines"));
  if (p.dma_engines < 1 || p.dma_engines > memory::kMaxDmaEngines)
    throw Error(ErrorCode::kConfigBadValue,
                fmt::format("dma.engines: expected 1..{}, found {}", memory::kMaxDmaEngines, p.dma_engines));
  p.dma_queues = static_cast<int>(c.get_int("dma.queues_per_engine"));
  p.partitions_per_engine = static_cast<int>(c.get_int("dma.partitions_per_engine"));
  p.dma_engine_bw = c.bw_bytes_per_ns("dma.engine_bw");
  p.hwdge_instr = c.time_ps("dma.hwdge_instr");
  p.swdge_instr = c.time_ps("dma.swdge_instr");
  p.dma_setup = c.time_ps("dma.setup");
  p.dma_transfer_gap = c.time_ps("dma.transfer_gap");
  p.dma_desc_min = c.time_ps("dma.desc_min");
  p.dma_completion_to_waiter = c.time_ps("dma.completion_to_waiter");
  p.dma_transpose_eff_hbm2sbuf = c.get_real("dma.transpose_eff_hbm2sbuf");
  p.dma_transpose_eff_sbuf2sbuf = c.get_real("dma.transpose_eff_sbuf2sbuf");
  p.hbm_bw = c.bw_bytes_per_ns("hbm.bw");
  p.hbm_stack_bw = c.bw_bytes_per_ns("hbm.stack_bw");
  p.cores_per_stack = static_cast<int>(c.get_int("hbm.cores_per_stack"));

  p.vector_gpsimd_sbuf_exclusive = c.get_bool("conc.vector_gpsimd_sbuf_exclusive");
  p.vector_scalar_psum_exclusive = c.get_bool("conc.vector_scalar_psum_exclusive");
  p.dep_chunk_bytes = c.bytes("sim.dep_chunk_bytes");
  p.hbm_dep_chunk_bytes = c.bytes("sim.hbm_dep_chunk_bytes");

  {
    const std::string sched = c.get_string("compiler.schedule");
    if (sched != "list" && sched != "program_order")
      throw Error(ErrorCode::kConfigBadValue,
                  fmt::format("compiler.schedule: expected 'list' or 'program_order', found '{}'", sched));
    p.list_schedule = sched == "list";
    const std::string place = c.get_string("compiler.engine_placement");
    if (place != "auto" && place != "default")
      throw Error(ErrorCode::kConfigBadValue,
                  fmt::format("compiler.engine_placement: expected 'auto' or 'default', found '{}'", place));
    p.auto_placement = place == "auto";
    p.schedule_window = static_cast<int>(c.get_int("compiler.window"));
    const int64_t q = c.get_int("compiler.dma_queues_per_trigger");
    if (q < 1 || q > p.dma_queues)
      throw Error(ErrorCode::kConfigBadValue,
                  fmt::format("compiler.dma_queues_per_trigger: expected 1..{} (dma.queues_per_engine), found {}",
                              p.dma_queues, q));
    p.dma_queues_per_trigger = static_cast<int>(q);
  }
  {
    const std::string alloc = c.get_string("compiler.allocation");
    if (alloc != "liveness" && alloc != "static")
      throw Error(ErrorCode::kConfigBadValue,
                  fmt::format("compiler.allocation: expected 'liveness' or 'static', found '{}'", alloc));
    p.static_allocation = alloc == "static";
  }
  p.strict_allocation = c.get_bool("compiler.strict");
  p.latency_bound_percent = c.get_real("analysis.latency_bound_percent");

  p.mem.partitions = static_cast<int>(c.get_int("sbuf.partitions"));
  p.mem.sbuf_bytes_per_partition = c.bytes("sbuf.bytes_per_partition");
  p.mem.psum_partitions = static_cast<int>(c.get_int("psum.partitions"));
  p.mem.psum_banks = static_cast<int>(c.get_int("psum.banks"));
  p.mem.psum_bank_bytes = c.bytes("psum.bank_bytes");
  p.mem.hbm_bytes = c.bytes("hbm.capacity");
  // Single-key ranges are the [min, max] columns of engines/params.def, checked by the loader; only
  // relations between keys and string choices are checked here.
  return p;
}

isa::Limits CoreParams::limits() const {
  isa::Limits l;
  l.generation = generation;
  l.partitions = mem.partitions;
  l.sbuf_bytes_per_partition = mem.sbuf_bytes_per_partition;
  l.psum_bytes_per_partition = mem.psum_bytes_per_partition();
  l.psum_bank_bytes = mem.psum_bank_bytes;
  l.hbm_bytes = mem.hbm_bytes;
  l.pe_rows = pe_rows;
  l.pe_cols = pe_cols;
  l.moving_fmax = moving_fmax;
  l.moving_fmax_bf16 = moving_fmax_bf16;
  l.dst_bf16 = dst_bf16;
  return l;
}

}  // namespace nsim::engines
