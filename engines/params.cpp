#include "engines/params.h"

#include <fmt/format.h>

#include <string>
#include <tuple>
#include <type_traits>

namespace nsim::engines {

namespace {
constexpr sim::ParamDecl kSchema[] = {
#define PARAM(k, kind, lo, hi, reader, d) {k, sim::ParamKind::kind, d, lo, hi},
#include "engines/params.def"
#undef PARAM
};
/// One F(field) row of engines/params.def: the value of `key` in its kind's unit, converted to the field's type.
template <class T>
void read_param(const sim::Config& c, std::string_view key, sim::ParamKind kind, T& out) {
  using K = sim::ParamKind;
  if constexpr (std::is_same_v<T, std::string>) {
    out = c.get_string(key);
  } else {
    switch (kind) {
      case K::kInt: out = static_cast<T>(c.get_int(key)); return;
      case K::kReal: out = static_cast<T>(c.get_real(key)); return;
      case K::kBool: out = static_cast<T>(c.get_bool(key)); return;
      case K::kFrequency: out = static_cast<T>(c.freq_ghz(key)); return;
      case K::kBytes: out = static_cast<T>(c.bytes(key)); return;
      case K::kBandwidth: out = static_cast<T>(c.bw_bytes_per_ns(key)); return;
      case K::kTime: out = static_cast<T>(c.time_ps(key)); return;
      case K::kCycles: out = static_cast<T>(c.cycles(key)); return;
      case K::kString:
      case K::kStringList: break;
    }
    throw Error(ErrorCode::kInternal, fmt::format("engines/params.def: {} has no numeric reader", key));
  }
}

}  // namespace

std::span<const sim::ParamDecl> param_schema() { return kSchema; }

sim::Config load_config(std::string_view preset_or_path, const std::vector<std::string>& overrides) {
  return sim::Config::load(preset_or_path, param_schema(), overrides);
}

CoreParams CoreParams::from_config(const sim::Config& c) {
  CoreParams p;
  // Every F(field) row of engines/params.def, generated; the CUSTOM rows follow by hand.
#define F(...) read_param(c, key, kind, p.__VA_ARGS__);
#define CUSTOM
#define OTHER
#define PARAM(k, knd, lo, hi, reader, d)         \
  {                                              \
    [[maybe_unused]] constexpr std::string_view key = k;       \
    [[maybe_unused]] constexpr auto kind = sim::ParamKind::knd; \
    reader                                       \
  }
#include "engines/params.def"
#undef PARAM
#undef OTHER
#undef CUSTOM
#undef F

  using isa::Engine;
  p.clock[static_cast<size_t>(Engine::kTensor)] = sim::ClockDomain(c.freq_ghz("clock.tensor"));
  p.clock[static_cast<size_t>(Engine::kVector)] = sim::ClockDomain(c.freq_ghz("clock.vector"));
  p.clock[static_cast<size_t>(Engine::kScalar)] = sim::ClockDomain(c.freq_ghz("clock.scalar"));
  p.clock[static_cast<size_t>(Engine::kGpsimd)] = sim::ClockDomain(c.freq_ghz("clock.gpsimd"));
  p.clock[static_cast<size_t>(Engine::kSync)] = sim::ClockDomain(c.freq_ghz("clock.sync"));

  const std::string formula = c.get_string("tensor.cost_formula");
  if (formula != "arch" && formula != "isa")
    throw Error(ErrorCode::kConfigBadValue,
                fmt::format("tensor.cost_formula: expected 'arch' or 'isa', found '{}'", formula));
  p.cost_formula_isa = formula == "isa";
  const double adj_fp32 = c.get_real("tensor.adjusted_flops_fp32"), adj_fp8 = c.get_real("tensor.adjusted_flops_fp8");
  const double adj_mx = c.get_real("tensor.adjusted_flops_mx");
  if (!(adj_fp32 > 0) || !(adj_fp8 > 0) || !(adj_mx > 0))
    throw Error(ErrorCode::kConfigBadValue, "tensor.adjusted_flops_fp32 / _fp8 / _mx: expected a positive multiplier");
  p.adjusted_flops.fill(1.0);
  p.adjusted_flops[static_cast<size_t>(DType::kFloat32)] = adj_fp32;
  for (DType t : {DType::kFloat8E4M3, DType::kFloat8E4M3FN, DType::kFloat8E5M2})
    p.adjusted_flops[static_cast<size_t>(t)] = adj_fp8;
  for (int t = 0; t < kNumDTypes; ++t)
    if (dtype_is_mx_x4(static_cast<DType>(t))) p.adjusted_flops[static_cast<size_t>(t)] = adj_mx;

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

  if (p.dma_engines < 1 || p.dma_engines > memory::kMaxDmaEngines)
    throw Error(ErrorCode::kConfigBadValue,
                fmt::format("dma.engines: expected 1..{}, found {}", memory::kMaxDmaEngines, p.dma_engines));
  // Engine e moves partitions [e x ppe, (e + 1) x ppe) (modulo the engines): engines past the partitions would get
  // no data while the bounds counted their bandwidth (an architect's audit: dma.engines=32 changed nothing).
  if (static_cast<int64_t>(p.dma_engines - 1) * p.partitions_per_engine >= p.mem.partitions)
    throw Error(ErrorCode::kConfigBadValue,
                fmt::format("dma.engines: {} engines x dma.partitions_per_engine {} cover {} partitions, more than the "
                            "{} of sbuf.partitions: engines {}.. would move no data. Lower dma.partitions_per_engine "
                            "too (to {} for {} engines)",
                            p.dma_engines, p.partitions_per_engine, p.dma_engines * p.partitions_per_engine,
                            p.mem.partitions, (p.mem.partitions + p.partitions_per_engine - 1) / p.partitions_per_engine,
                            std::max(1, p.mem.partitions / p.dma_engines), p.dma_engines));

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
    const int q = p.dma_queues_per_trigger;
    if (q < 1 || q > p.dma_queues)
      throw Error(ErrorCode::kConfigBadValue,
                  fmt::format("compiler.dma_queues_per_trigger: expected 1..{} (at most dma.queues_per_engine, {}), found "
                              "{}: with fewer queues per DMA engine, lower compiler.dma_queues_per_trigger too",
                              p.dma_queues, p.dma_queues, q));
  }
  // PE tiling: tile sizes are the smallest tile x 2^k up to the array (TensorEngine keeps one state per cell of
  // the smallest tiles: at most kMaxPeTiles a side).
  for (const auto& [key, min, all] : {std::tuple{"tensor.row_tile_min", p.row_tile_min, p.pe_rows},
                                      std::tuple{"tensor.col_tile_min", p.col_tile_min, p.pe_cols}}) {
    const int n = min > 0 && all % min == 0 ? all / min : 0;
    if (n < 1 || n > kMaxPeTiles || (n & (n - 1)) != 0)
      throw Error(ErrorCode::kConfigBadValue,
                  fmt::format("{}: expected the PE array's {} divided by a power of two up to {}, found {}", key, all,
                              kMaxPeTiles, min));
  }
  {
    const std::string alloc = c.get_string("compiler.allocation");
    if (alloc != "liveness" && alloc != "static")
      throw Error(ErrorCode::kConfigBadValue,
                  fmt::format("compiler.allocation: expected 'liveness' or 'static', found '{}'", alloc));
    p.static_allocation = alloc == "static";
  }

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
  l.row_tile_min = row_tile_min;
  l.col_tile_min = col_tile_min;
  l.moving_fmax = moving_fmax;
  l.moving_fmax_bf16 = moving_fmax_bf16;
  l.dst_bf16 = dst_bf16;
  l.fp8_double_row = fp8_double_row;
  l.mx_rate = mx_rate;
  return l;
}

}  // namespace nsim::engines
