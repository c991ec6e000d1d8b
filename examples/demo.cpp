// nsim demo: a tiled softmax followed by a projection matmul, built with the C++ API and run on a
// preset (default trn2). Prints the outputs' error against a CPU reference and the run's stats.
//
//   y[r, :] = softmax(x[r, :]) for x [1024, 512] bf16, in 8 tiles of 128 rows (double-buffered)
//   z_tile = W^T (128x128) @ y_tile (128x512), accumulated in PSUM and stored as fp32
#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "engines/simulator.h"

using namespace nsim;
using isa::Engine;
using isa::Instr;
using isa::Opcode;
using isa::Operand;
using isa::Space;

namespace {

Operand hbm_rows(const memory::HbmTensor& t, int64_t row0, uint32_t rows, int64_t cols) {
  Operand o = t.whole();
  o.offset = t.addr + row0 * cols * dtype_bytes(t.dtype);
  o.num_partitions = rows;
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  std::string preset = "trn2";
  std::string trace;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--config" && i + 1 < argc) preset = argv[++i];
    else if (a == "--trace" && i + 1 < argc) trace = argv[++i];
    else {
      fmt::print(stderr, "usage: nsim_demo [--config trn1|trn2|trn3|file.yaml] [--trace trace.json]\n");
      return 2;
    }
  }
  try {
    constexpr int kRows = 1024, kCols = 512, kTiles = kRows / 128;
    SimOptions opts;
    opts.trace_path = trace;
    auto sim = Simulator::from_preset(preset, {}, opts);

    // Inputs: x ~ N(0, 1) in bf16, W ~ U(-0.1, 0.1) in bf16.
    std::mt19937 rng(7);
    std::normal_distribution<float> nd(0.f, 1.f);
    std::uniform_real_distribution<float> ud(-0.1f, 0.1f);
    std::vector<uint16_t> xb(kRows * kCols), wb(128 * 128);
    for (auto& v : xb) v = f32_to_bf16_bits(nd(rng));
    for (auto& v : wb) v = f32_to_bf16_bits(ud(rng));
    const auto& x = sim->alloc_hbm("x", {kRows, kCols}, DType::kBFloat16);
    const auto& w = sim->alloc_hbm("w", {128, 128}, DType::kBFloat16);
    const auto& z = sim->alloc_hbm("z", {kRows, kCols}, DType::kFloat32);
    sim->write_hbm("x", xb.data(), xb.size() * 2);
    sim->write_hbm("w", wb.data(), wb.size() * 2);

    const uint32_t l_load = sim->add_source({"demo.cpp", 1, "load"});
    const uint32_t l_max = sim->add_source({"demo.cpp", 2, "row max"});
    const uint32_t l_exp = sim->add_source({"demo.cpp", 3, "exp"});
    const uint32_t l_norm = sim->add_source({"demo.cpp", 4, "normalise"});
    const uint32_t l_mm = sim->add_source({"demo.cpp", 5, "matmul"});
    const uint32_t l_store = sim->add_source({"demo.cpp", 6, "store"});

    Operand wt = sim->alloc_tile(Space::kSbuf, 128, {128}, DType::kBFloat16);
    sim->submit(isa::make_instr(Opcode::kDmaCopy, Engine::kSync, {wt, hbm_rows(w, 0, 128, 128)}, l_load));
    Operand xt[2], et[2], yt[2], zt[2], mx[2], nmx[2], sm[2], rc[2], ps[2];
    for (int b = 0; b < 2; ++b) {
      xt[b] = sim->alloc_tile(Space::kSbuf, 128, {kCols}, DType::kBFloat16);
      et[b] = sim->alloc_tile(Space::kSbuf, 128, {kCols}, DType::kFloat32);
      yt[b] = sim->alloc_tile(Space::kSbuf, 128, {kCols}, DType::kBFloat16);
      zt[b] = sim->alloc_tile(Space::kSbuf, 128, {kCols}, DType::kFloat32);
      mx[b] = sim->alloc_tile(Space::kSbuf, 128, {1}, DType::kFloat32);
      nmx[b] = sim->alloc_tile(Space::kSbuf, 128, {1}, DType::kFloat32);
      sm[b] = sim->alloc_tile(Space::kSbuf, 128, {1}, DType::kFloat32);
      rc[b] = sim->alloc_tile(Space::kSbuf, 128, {1}, DType::kFloat32);
      ps[b] = sim->alloc_tile(Space::kPsum, 128, {kCols}, DType::kFloat32);
    }
    // Software pipelining: the load of tile t+1 is issued before the compute of tile t, so the
    // in-order Sync queue never waits behind a store.
    auto load = [&](int t) {
      Instr ld = isa::make_instr(Opcode::kDmaCopy, Engine::kSync, {xt[t % 2], hbm_rows(x, t * 128, 128, kCols)}, l_load);
      ld.dma_queue = static_cast<uint8_t>(t % 2);
      sim->submit(ld);
    };
    load(0);
    for (int t = 0; t < kTiles; ++t) {
      const int b = t % 2;
      if (t + 1 < kTiles) load(t + 1);
      Instr red = isa::make_instr(Opcode::kTensorReduce, Engine::kVector, {mx[b], xt[b]}, l_max);
      red.alu0 = isa::AluOp::kMaximum;
      sim->submit(red);
      Instr neg = isa::make_instr(Opcode::kTensorScalar, Engine::kVector, {nmx[b], mx[b]}, l_max);
      neg.alu0 = isa::AluOp::kMultiply;
      neg.imm[0] = -1.0f;
      neg.flags = isa::kHasImm0;
      sim->submit(neg);
      Instr ex = isa::make_instr(Opcode::kActivation, Engine::kScalar, {et[b], xt[b], nmx[b], Operand{}, sm[b]}, l_exp);
      ex.act = isa::ActFunc::kExp;
      ex.imm[2] = 1.0f;
      ex.alu1 = isa::AluOp::kAdd;
      ex.reduce_cmd = isa::ReduceCmd::kResetReduce;
      sim->submit(ex);
      sim->submit(isa::make_instr(Opcode::kReciprocal, Engine::kVector, {rc[b], sm[b]}, l_norm));
      Instr nrm = isa::make_instr(Opcode::kTensorScalar, Engine::kVector, {yt[b], et[b], rc[b]}, l_norm);
      nrm.alu0 = isa::AluOp::kMultiply;
      sim->submit(nrm);
      sim->submit(isa::make_instr(Opcode::kLoadStationary, Engine::kTensor, {wt}, l_mm));
      sim->submit(isa::make_instr(Opcode::kMultiplyMoving, Engine::kTensor, {ps[b], yt[b]}, l_mm));
      sim->submit(isa::make_instr(Opcode::kTensorCopy, Engine::kVector, {zt[b], ps[b]}, l_store));
      Instr st = isa::make_instr(Opcode::kDmaCopy, Engine::kGpsimd, {hbm_rows(z, t * 128, 128, kCols), zt[b]}, l_store);
      st.dma_queue = static_cast<uint8_t>(2 + b);
      sim->submit(st);
    }
    sim->finish();

    // CPU reference in double from the same bf16 inputs.
    std::vector<float> zf(kRows * kCols);
    auto out = sim->read_hbm("z");
    std::memcpy(zf.data(), out.data(), out.size());
    double max_err = 0, max_ref = 0;
    // Full reference: softmax rows first, then the per-tile projection.
    std::vector<double> ysm(kRows * kCols);
    for (int r = 0; r < kRows; ++r) {
      double m = -1e30, s = 0;
      for (int c = 0; c < kCols; ++c) m = std::max(m, double(bf16_bits_to_f32(xb[r * kCols + c])));
      for (int c = 0; c < kCols; ++c) s += std::exp(double(bf16_bits_to_f32(xb[r * kCols + c])) - m);
      for (int c = 0; c < kCols; ++c)
        ysm[r * kCols + c] = std::exp(double(bf16_bits_to_f32(xb[r * kCols + c])) - m) / s;
    }
    for (int t = 0; t < kTiles; ++t)
      for (int mi = 0; mi < 128; ++mi)
        for (int c = 0; c < kCols; ++c) {
          double acc = 0;
          for (int k = 0; k < 128; ++k)
            acc += double(bf16_bits_to_f32(wb[k * 128 + mi])) * ysm[(t * 128 + k) * kCols + c];
          const double got = zf[(t * 128 + mi) * kCols + c];
          max_err = std::max(max_err, std::fabs(got - acc));
          max_ref = std::max(max_ref, std::fabs(acc));
        }

    fmt::print("nsim demo: softmax [{}x{}] bf16 + projection matmul, preset {}\n", kRows, kCols, sim->params().name);
    fmt::print("numerics: max |error| vs CPU reference = {:.3g} (max |ref| = {:.3g})\n", max_err, max_ref);
    fmt::print("{}", sim->stats().to_text());
    fmt::print("\neffective config ({}):\n{}", sim->config().name(), sim->config().to_yaml());
    return max_err <= 1e-2 * max_ref ? 0 : 1;  // bf16 tolerance
  } catch (const Error& e) {
    fmt::print(stderr, "{}\n", e.what());
    return 2;
  }
}
