// Simulator::stats(): the run's counters as named stats in the profiler's vocabulary
// (docs/profiling.md, "Stats"). Kept apart from the scheduling code in simulator.cpp.
#include <fmt/format.h>

#include <algorithm>

#include "engines/bounds.h"
#include "engines/simulator.h"

namespace nsim {

using isa::Engine;
using isa::Opcode;
using isa::Space;
using sim::Ps;

sim::StatsRegistry Simulator::stats() const {
  sim::StatsRegistry r;
  const RunCounters& c_ = stats_.counters();
  const double total_ns = sim::ps_to_ns(c_.end);
  const sim::ClockDomain& base = p_.clk(Engine::kSync);
  r.add("total_time", total_ns, "ns", "kernel start to the end of its last instruction or DMA");
  r.add("neuroncore_cycle_count", base.ps_to_cycles(c_.end), "cycles", "total_time at the profiler base clock (clock.sync)");
  // Share of total_time; 0 for an empty run.
  auto pct = [&](Ps t) { return c_.end ? 100.0 * static_cast<double>(t) / static_cast<double>(c_.end) : 0.0; };
  r.add("fast_forward.skipped_instructions", static_cast<double>(skipped_instructions_), "count",
        "instructions of loop iterations counted as repeats, not simulated (SimOptions::fast_forward)");
  for (size_t i = 0; i < engines::kFfOutcomes.size(); ++i)
    r.add(std::string("fast_forward.loops.") + engines::kFfOutcomes[i].name, static_cast<double>(ff_outcomes_[i]), "count",
          std::string("loop instances ") + engines::kFfOutcomes[i].what);
  r.add("total_exec_time", c_.end > c_.start ? sim::ps_to_ns(c_.end - c_.start) : 0.0, "ns",
        "first instruction start to the end of the last instruction or DMA packet");
  const Ps any_active = c_.any_active.total();
  r.add("total_active_time", sim::ps_to_ns(any_active), "ns",
        "union over time of every engine's instructions and every DMA packet");
  r.add("total_active_time_percent", pct(any_active), "%", "total_active_time / total_time");
  for (int e = 0; e < isa::kNumEngines; ++e) {
    const TrackCounters& t = c_.engine[static_cast<size_t>(e)];
    const std::string pre = fmt::format("engine.{}.", isa::engine_name(static_cast<Engine>(e)));
    const sim::ClockDomain& clk = p_.clk(static_cast<Engine>(e));
    r.add(pre + "instruction_count", static_cast<double>(t.instructions), "count", "instructions issued");
    r.add(pre + "busy_time", sim::ps_to_ns(t.busy), "ns", "sum of issue intervals (II)");
    r.add(pre + "busy_cycles", clk.ps_to_cycles(t.busy), "cycles", "busy_time in this engine's cycles");
    r.add(pre + "instruction_time", sim::ps_to_ns(t.instr_time), "ns", "sum of instruction durations (overlaps counted twice)");
    r.add(pre + "active_time", sim::ps_to_ns(t.active), "ns", "union of instruction intervals");
    r.add(pre + "active_time_percent", c_.end ? 100.0 * static_cast<double>(t.active) / static_cast<double>(c_.end) : 0,
          "%", "active_time / total_time");
    r.add(pre + "flops", t.flops, "flops", "floating-point operations (MAC = 2 on TensorE)");
    if (static_cast<Engine>(e) == Engine::kScalar) {
      const auto act = static_cast<size_t>(Opcode::kActivation), act_r = static_cast<size_t>(Opcode::kActivationReduce);
      const auto& cnt = c_.engine_opcode_count[static_cast<size_t>(e)];
      const auto& tm = c_.engine_opcode_time[static_cast<size_t>(e)];
      r.add(pre + "activate_instruction_count", static_cast<double>(cnt[act] + cnt[act_r]), "count",
            "activation and activation_reduce instructions (ACTIVATE, ACTIVATE_QUANTIZE)");
      r.add(pre + "activate_instruction_time", sim::ps_to_ns(tm[act] + tm[act_r]), "ns",
            "summed durations of the activation instructions");
      r.add(pre + "act_table_load_count", static_cast<double>(c_.act_table_loads), "count",
            "activation function table loads (ACT_TABLE_LOAD: an activation of another table set than the loaded one)");
      r.add(pre + "act_table_load_time", sim::ps_to_ns(c_.act_table_load_time), "ns",
            "ScalarE time spent loading activation tables (scalar.act_table_load each; inside the activations' busy time)");
    }
    for (int o = 0; o < isa::kNumOpcodes; ++o) {
      const auto oi = static_cast<size_t>(o);
      const uint64_t n = c_.engine_opcode_count[static_cast<size_t>(e)][oi];
      if (!n) continue;
      const std::string op = fmt::format("{}opcode.{}.", pre, isa::op_info(static_cast<Opcode>(o)).mnemonic);
      r.add(op + "count", static_cast<double>(n), "count", "instructions of this opcode on this engine");
      r.add(op + "time", sim::ps_to_ns(c_.engine_opcode_time[static_cast<size_t>(e)][oi]), "ns",
            "summed durations on this engine (a DMA: trigger to completion)");
    }
  }
  r.add("engine.matmul_instruction_count", static_cast<double>(c_.matmul_instructions), "count",
        "TensorE matmuls (multiply_moving that is not a transpose)");
  Ps dma_active = 0;
  uint64_t dma_bytes = 0;
  for (int e = 0; e < p_.dma_engines; ++e) {
    const TrackCounters& t = c_.dma[static_cast<size_t>(e)];
    dma_active = std::max(dma_active, t.active);
    dma_bytes += t.bytes;
    const std::string pre = fmt::format("dma.engine{}.", e);
    r.add(pre + "active_time", sim::ps_to_ns(t.active), "ns", "union of this DMA engine's packet intervals");
    r.add(pre + "bytes", static_cast<double>(t.bytes), "bytes", "bytes moved by this DMA engine");
    r.add(pre + "packets", static_cast<double>(t.instructions), "count", "per-transfer pieces served");
  }
  r.add("dma.transfer_count", static_cast<double>(c_.dma_transfers), "count", "DMA instructions (transfers)");
  r.add("dma.descriptor_count", static_cast<double>(c_.dma_descriptors), "count", "contiguous DMA buffers");
  r.add("dma.transfer_total_bytes", static_cast<double>(dma_bytes), "bytes", "bytes moved by all DMA engines");
  r.add("dma.transfer_average_bytes",
        c_.dma_transfers ? static_cast<double>(dma_bytes) / static_cast<double>(c_.dma_transfers) : 0, "bytes",
        "bytes per DMA transfer");
  r.add("dma.max_engine_active_time", sim::ps_to_ns(dma_active), "ns", "active time of the busiest DMA engine");
  const Ps dma_union = c_.dma_active.total();
  r.add("dma.active_time", sim::ps_to_ns(dma_union), "ns", "time with at least one DMA packet moving (union over DMA engines)");
  r.add("dma.active_time_percent", pct(dma_union), "%", "dma.active_time / total_time");
  static constexpr std::array<std::pair<const char*, const char*>, kNumDmaClasses> kDmaClass = {{
      {"static", "triggered on Sync (static descriptors, dge none)"},
      {"hardware_dynamic", "triggered on Scalar (hardware DGE)"},
      {"software_dynamic", "triggered on GpSimd (software DGE)"},
  }};
  for (size_t k = 0; k < kDmaClass.size(); ++k) {
    const Ps u = c_.dma_class_active[k].total();
    const std::string pre = fmt::format("dma.{}_", kDmaClass[k].first);
    r.add(pre + "active_time", sim::ps_to_ns(u), "ns", fmt::format("dma.active_time of transfers {}", kDmaClass[k].second));
    r.add(pre + "active_time_percent", pct(u), "%", fmt::format("{}active_time / total_time", pre));
  }
  r.add("dma.dma_queue_count", static_cast<double>(c_.dma_queues_used), "count", "DMA queues used");
  r.add("memory.hbm_read_bytes", static_cast<double>(c_.hbm_read), "bytes", "HBM bytes read by DMA");
  r.add("memory.hbm_write_bytes", static_cast<double>(c_.hbm_write), "bytes", "HBM bytes written by DMA");
  r.add("memory.sbuf_read_bytes", static_cast<double>(c_.sbuf_read), "bytes", "SBUF bytes read (DMA and engines)");
  r.add("memory.sbuf_write_bytes", static_cast<double>(c_.sbuf_write), "bytes", "SBUF bytes written (DMA and engines)");
  r.add("memory.psum_read_bytes", static_cast<double>(c_.psum_read), "bytes", "PSUM bytes read");
  r.add("memory.psum_write_bytes", static_cast<double>(c_.psum_write), "bytes", "PSUM bytes written");
  r.add("memory.sbuf_peak_bytes_per_partition",
        static_cast<double>(onchip_peak_[0] >= 0 ? onchip_peak_[0] : mem_.allocator(Space::kSbuf).peak()), "bytes",
        "peak SBUF bytes per partition in use at once (tiles live at the same time)");
  r.add("memory.psum_peak_bytes_per_partition",
        static_cast<double>(onchip_peak_[1] >= 0 ? onchip_peak_[1] : mem_.allocator(Space::kPsum).peak()), "bytes",
        "peak PSUM bytes per partition in use at once (tiles live at the same time)");
  const double hw = c_.matmul_flops + c_.transpose_flops;
  const double max_ops = 2.0 * p_.pe_rows * p_.pe_cols * p_.clk(Engine::kTensor).ghz() * 1e9;
  r.add("flops.hardware", hw, "flops", "all TensorE FLOPs (MAC = 2)");
  r.add("flops.transpose", c_.transpose_flops, "flops", "TensorE FLOPs of transposes");
  r.add("flops.model", c_.matmul_flops, "flops", "useful matmul FLOPs (hardware - transpose)");
  r.add("flops.tensor_peak_per_s", max_ops, "flops/s", "2 x pe_rows x pe_cols x tensor clock");
  r.add("flops.tensor_peak_mx_per_s", max_ops * p_.mx_rate, "flops/s",
        "MX (nc_matmul_mx) peak: tensor_peak_per_s x tensor.mx_rate (0 without MX)");
  r.add("flops.mx", c_.mx_matmul_flops, "flops", "the part of flops.model done by MX matmuls (nc_matmul_mx)");
  r.add("flops.mfu_estimated_percent", c_.end ? 100.0 * c_.matmul_flops / (max_ops * static_cast<double>(c_.end) * 1e-12) : 0,
        "%", "model_flops / (peak x total_time)");
  const double hbm_bytes = static_cast<double>(c_.hbm_read + c_.hbm_write);
  const double hbm_bw = p_.hbm_bw * 1e9;  // bytes/s (hbm.bw is bytes/ns)
  r.add("flops.hfu_estimated_percent", c_.end ? 100.0 * hw / (max_ops * static_cast<double>(c_.end) * 1e-12) : 0, "%",
        "hardware_flops / (peak x total_time)");
  r.add("flops.adjusted_hardware", c_.adjusted_matmul_flops + c_.adjusted_transpose_flops, "flops",
        "hardware FLOPs in bf16 equivalents (x tensor.adjusted_flops_fp32 / _fp8 by input dtype)");
  r.add("flops.adjusted_transpose", c_.adjusted_transpose_flops, "flops", "transpose FLOPs in bf16 equivalents");
  // Roofline: FLOP per HBM byte of the kernel vs the ridge point of the core.
  const double ridge = max_ops / hbm_bw;
  r.add("flops.peak_flops_bandwidth_ratio", ridge, "flops/byte",
        "tensor_peak_per_s / hbm.bw: below it a kernel is memory bound");
  r.add("flops.mm_arithmetic_intensity", hbm_bytes > 0 ? (hw - c_.transpose_flops) / hbm_bytes : 0, "flops/byte",
        "(hardware - transpose) / (HBM read + write bytes); 0 without HBM traffic");
  double mfu_max = 0;
  if (c_.matmul_flops > 0) mfu_max = hbm_bytes > 0 ? std::min(100.0, 100.0 * (c_.matmul_flops / hbm_bytes) / ridge) : 100.0;
  r.add("flops.mfu_max_achievable_estimated_percent", mfu_max, "%",
        "(model_flops / HBM bytes) / peak_flops_bandwidth_ratio, at most 100: MFU the HBM traffic allows");
  r.add("memory.mbu_estimated_percent",
        c_.end ? 100.0 * hbm_bytes / (static_cast<double>(c_.end) * 1e-12) / hbm_bw : 0, "%",
        "(HBM read + write bytes) / total_time / hbm.bw (hbm.bw stands for the profiler's one HBM stack)");
  // Resource bounds (engines/bounds.h): the inputs of the one bound verdict every tool reports.
  for (const auto& [name, what] : engines::bound_resources()) {
    double ns = 0;
    if (name == "dma") {
      Ps b = 0;
      for (int e = 0; e < p_.dma_engines; ++e) b = std::max(b, c_.dma[static_cast<size_t>(e)].busy);
      ns = sim::ps_to_ns(b);
    } else if (name == "hbm") {
      ns = engines::hbm_time_ns(p_, static_cast<double>(c_.hbm_read), static_cast<double>(c_.hbm_write));
    } else {
      for (int e = 0; e < isa::kNumEngines; ++e)
        if (name == isa::engine_name(static_cast<Engine>(e))) ns = sim::ps_to_ns(c_.engine[static_cast<size_t>(e)].busy_union);
    }
    r.add("bound." + name + ".time", ns, "ns", "bound: " + what);
  }
  r.add("bound.latency_threshold_percent", p_.latency_bound_percent, "%",
        "analysis.latency_bound_percent: below this share of the time busy, the kernel is latency-bound");
  r.add("tensor.throttled_time", sim::ps_to_ns(tensor_.throttled_time() + skipped_throttled_), "ns", "TensorE time lost to power throttling");
  for (int o = 0; o < isa::kNumOpcodes; ++o) {
    const auto oi = static_cast<size_t>(o);
    if (!c_.opcode_count[oi]) continue;
    const std::string pre = fmt::format("opcode.{}.", isa::op_info(static_cast<Opcode>(o)).mnemonic);
    r.add(pre + "count", static_cast<double>(c_.opcode_count[oi]), "count", "instructions with this opcode");
    r.add(pre + "time", sim::ps_to_ns(c_.opcode_time[oi]), "ns", "summed durations of this opcode");
  }
  return r;
}

}  // namespace nsim
