#pragma once
/// The hardware model's parameters, read once from the config (engines/params.def is the schema).
/// Engine code takes every constant from here; nothing is hard-coded. The fields have no defaults of their
/// own (zero / false): CoreParams::from_config sets every one from the config.
#include <array>
#include <span>
#include <string>
#include <vector>

#include "isa/isa.h"
#include "memory/dma.h"
#include "memory/memory.h"
#include "sim/config.h"
#include "sim/time.h"

namespace nsim::engines {

/// The schema of every key (engines/params.def), for sim::Config::load.
std::span<const sim::ParamDecl> param_schema();

/// Load a preset or YAML path with overrides against the schema.
sim::Config load_config(std::string_view preset_or_path, const std::vector<std::string>& overrides = {});

struct ThrottleParams {
  bool enabled = false;
  double start_util = 0;
  sim::Ps ramp = 0;
  sim::Ps window = 0;
  double reengage_util = 0;
};

/// PE tiling: the most tiles of the smallest size along either side of the PE array (tensor.row_tile_min / col_tile_min).
inline constexpr int kMaxPeTiles = 8;

struct CoreParams {
  std::string name;
  int generation = 0;
  std::array<sim::ClockDomain, isa::kNumEngines> clock;  ///< indexed by isa::Engine

  // TensorE
  int pe_rows = 0, pe_cols = 0;
  int row_tile_min = 0, col_tile_min = 0;  ///< PE tiling: the smallest row / column tile
  int64_t moving_fmax = 0, moving_fmax_bf16 = 0;
  double mm_min_ii = 0;
  int ls_speedup = 0;
  double fp32_factor = 0, fp32_onezero_factor = 0, transpose_fp32_factor = 0;
  bool fp8_double_row = false, dst_bf16 = false, background_transpose = false;
  int mx_rate = 0;  ///< tensor.mx_rate: MX contraction values per PE row per cycle (0: no MX)
  double mm_latency = 0;
  bool cost_formula_isa = false;
  ThrottleParams throttle;
  /// bf16-equivalent FLOPs multiplier per input dtype (tensor.adjusted_flops_fp32 / _fp8 / _mx, else 1);
  /// a matmul takes the largest of its two inputs' (fp8 x bf16 counts 1).
  std::array<double, kNumDTypes> adjusted_flops{};

  // Vector / Scalar / GpSimd
  double vector_min_ii = 0, vector_fixed_latency = 0;
  bool vector_perf_modes = false, vector_perf_mode_fp8 = false, vector_fp32_perf_mode = false;
  double vector_reciprocal_factor = 0, vector_bn_aggr_factor = 0, vector_dynamic_copy = 0;
  double vector_quantize_mx_factor = 0, vector_exponential_factor = 0, vector_rand2_factor = 0;
  double gpsimd_topk_factor = 0;
  double scalar_min_ii = 0, scalar_fixed_latency = 0;
  sim::Ps scalar_act_table_load = 0;
  std::array<int, isa::kNumActFuncs> act_table_set{};  ///< table set per ActFunc; -1 = needs no table
  bool scalar_perf_mode_2x = false, scalar_perf_mode_fp8 = false, scalar_tensor_ops = false;
  double gpsimd_min_ii = 0, gpsimd_start_overhead = 0, gpsimd_fixed_latency = 0, gpsimd_rsqrt_factor = 0;
  int64_t stride_penalty_bytes = 0;

  // Sync / DMA / HBM
  sim::Ps sem_latency = 0, trigger_instr = 0, register_load_sbuf = 0, register_load_hbm = 0;
  int dma_engines = 0, dma_queues = 0, partitions_per_engine = 0;
  double dma_engine_bw = 0;  ///< bytes per ns
  double dma_store_bw_factor = 1;  ///< a store's engine bandwidth / dma_engine_bw
  sim::Ps hwdge_instr = 0, swdge_instr = 0, dma_setup = 0, dma_transfer_gap = 0, dma_desc_min = 0,
          dma_completion_to_waiter = 0;
  double dma_transpose_eff_hbm2sbuf = 0, dma_transpose_eff_sbuf2sbuf = 0;
  double dma_compute_eff = 0, dma_compute_eff_sbuf = 0;  ///< an accumulating transfer's throughput / a copy's (into HBM / SBUF)
  double hbm_bw = 0;  ///< bytes per ns available to this core
  double hbm_stack_bw = 0;  ///< bytes per ns of one HBM stack, shared by the cores of an LNC=2 launch
  int cores_per_stack = 0;  ///< physical cores on one HBM stack = the largest LNC degree

  bool vector_gpsimd_sbuf_exclusive = false, vector_scalar_psum_exclusive = false, vector_perf_gpsimd_sbuf_shared = false;
  int64_t dep_chunk_bytes = 0, hbm_dep_chunk_bytes = 0;

  // The compiler model (frontend/compiler, docs/timing-model.md)
  bool list_schedule = false;     ///< compiler.schedule: list; false = program_order
  int schedule_window = 0;    ///< compiler.window
  bool auto_placement = false;    ///< compiler.engine_placement: auto
  int dma_queues_per_trigger = 0;
  int loop_buffers = 0;       ///< compiler.loop_buffers: rotating buffers of a loop-body SBUF tile when capacity allows
  int psum_loop_buffers = 0;  ///< compiler.psum_loop_buffers: the same for PSUM tiles
  double latency_bound_percent = 0;  ///< analysis.latency_bound_percent (engines/bounds.h)
  bool strict_allocation = false;  ///< compiler.strict: a manual placement over a live tile is an error
  int placement_search = 0;  ///< compiler.placement_search: instructions simulated to choose PSUM sharing (0: off)
  bool static_allocation = false;  ///< compiler.allocation: static (every tile its own region); false = liveness

  memory::MemoryConfig mem;

  /// Build from a validated config.
  static CoreParams from_config(const sim::Config& cfg);
  /// Limits for isa::verify.
  isa::Limits limits() const;
  const sim::ClockDomain& clk(isa::Engine e) const { return clock[static_cast<size_t>(e)]; }
};

}  // namespace nsim::engines
