// DMA transfer decomposition (spec neuroncore.md 3.3): engine e serves SBUF partitions [8e, 8e+8);
// HBM->HBM splits bytes evenly; descriptors follow the contiguous runs. Calibration points C1, C2, C28.
#include <catch2/catch.hpp>

#include <cstdint>
#include <numeric>

#include "isa/isa.h"
#include "memory/dma.h"

namespace {

using nsim::DType;
using nsim::isa::Operand;
using nsim::isa::Space;
using nsim::memory::DmaSplit;
using nsim::memory::kMaxDmaEngines;
using nsim::memory::split_transfer;

constexpr int kEngines = 16;
constexpr int kPpe = 8;

int64_t sum_bytes(const DmaSplit& s) {
  int64_t t = 0;
  for (int e = 0; e < kMaxDmaEngines; ++e) t += s.piece[static_cast<size_t>(e)].bytes;
  return t;
}

Operand hbm_rows(DType dt, int64_t addr, uint32_t rows, int64_t cols) {
  return Operand::tile(Space::kHbm, dt, addr, 0, rows, {cols});
}

}  // namespace

TEST_CASE("DMA split C1: bf16 [4, 4096] HBM->SBUF uses engine 0 only", "[memory][dma]") {
  const Operand dst = Operand::tile(Space::kSbuf, DType::kBFloat16, 0, 0, 4, {4096});
  const Operand src = hbm_rows(DType::kBFloat16, 0, 4, 4096);
  const DmaSplit s = split_transfer(dst, src, kEngines, kPpe);
  CHECK(s.engines == 16);
  CHECK(s.touches_hbm);
  CHECK(s.total_bytes == 32768);
  CHECK(s.piece[0].bytes == 32768);
  CHECK(s.piece[0].descriptors == 4);  // one contiguous 8 KiB buffer per partition
  for (int e = 1; e < kEngines; ++e) {
    INFO("engine " << e);
    CHECK(s.piece[static_cast<size_t>(e)].bytes == 0);
    CHECK(s.piece[static_cast<size_t>(e)].descriptors == 0);
  }
  CHECK(sum_bytes(s) == s.total_bytes);
}

TEST_CASE("DMA split C2: bf16 [128, 128] HBM->SBUF: 16 engines x 2 KiB", "[memory][dma]") {
  const Operand dst = Operand::tile(Space::kSbuf, DType::kBFloat16, 1024, 0, 128, {128});
  const Operand src = hbm_rows(DType::kBFloat16, 4096, 128, 128);
  const DmaSplit s = split_transfer(dst, src, kEngines, kPpe);
  CHECK(s.total_bytes == 128 * 128 * 2);
  CHECK(s.touches_hbm);
  for (int e = 0; e < kEngines; ++e) {
    INFO("engine " << e);
    CHECK(s.piece[static_cast<size_t>(e)].bytes == 2048);       // 8 partitions x 256 B
    CHECK(s.piece[static_cast<size_t>(e)].descriptors == 8);
  }
  for (int e = kEngines; e < kMaxDmaEngines; ++e) CHECK(s.piece[static_cast<size_t>(e)].bytes == 0);
  CHECK(sum_bytes(s) == s.total_bytes);

  // SBUF->HBM (a store) splits the same way.
  const DmaSplit st = split_transfer(src, dst, kEngines, kPpe);
  CHECK(st.touches_hbm);
  for (int e = 0; e < kEngines; ++e) CHECK(st.piece[static_cast<size_t>(e)].bytes == 2048);
}

TEST_CASE("DMA split C28: trn1 fp32 [128, 1024] load: 16 x 32 KiB", "[memory][dma]") {
  const Operand dst = Operand::tile(Space::kSbuf, DType::kFloat32, 0, 0, 128, {1024});
  const Operand src = hbm_rows(DType::kFloat32, 0, 128, 1024);
  const DmaSplit s = split_transfer(dst, src, kEngines, kPpe);
  CHECK(s.total_bytes == 128 * 4096);
  for (int e = 0; e < kEngines; ++e) {
    INFO("engine " << e);
    CHECK(s.piece[static_cast<size_t>(e)].bytes == 32768);      // 8 partitions x 4 KiB
    CHECK(s.piece[static_cast<size_t>(e)].descriptors == 8);
  }
}

TEST_CASE("DMA split: start_partition 64 with 8 partitions uses engine 8 only", "[memory][dma]") {
  const Operand dst = Operand::tile(Space::kSbuf, DType::kFloat32, 0, 64, 8, {256});
  const Operand src = hbm_rows(DType::kFloat32, 0, 8, 256);
  const DmaSplit s = split_transfer(dst, src, kEngines, kPpe);
  for (int e = 0; e < kEngines; ++e) {
    INFO("engine " << e);
    CHECK(s.piece[static_cast<size_t>(e)].bytes == (e == 8 ? 8 * 1024 : 0));
    CHECK(s.piece[static_cast<size_t>(e)].descriptors == (e == 8 ? 8 : 0));
  }
  // Partitions 60..67 straddle engines 7 and 8.
  const Operand dst2 = Operand::tile(Space::kSbuf, DType::kFloat32, 0, 60, 8, {256});
  const DmaSplit s2 = split_transfer(dst2, src, kEngines, kPpe);
  CHECK(s2.piece[7].bytes == 4 * 1024);
  CHECK(s2.piece[8].bytes == 4 * 1024);
  CHECK(s2.piece[6].bytes == 0);
  CHECK(s2.piece[9].bytes == 0);
  // The SBUF side decides even when it is the source.
  const DmaSplit s3 = split_transfer(src, dst, kEngines, kPpe);
  CHECK(s3.piece[8].bytes == 8 * 1024);
  CHECK(s3.piece[0].bytes == 0);
}

TEST_CASE("DMA split: HBM->HBM spreads bytes evenly with the remainder on the first engines",
          "[memory][dma]") {
  // 1001 bf16 = 2002 bytes = 16 * 125 + 2.
  const Operand dst = hbm_rows(DType::kBFloat16, 0, 1, 1001);
  const Operand src = hbm_rows(DType::kBFloat16, 4096, 1, 1001);
  const DmaSplit s = split_transfer(dst, src, kEngines, kPpe);
  CHECK(s.touches_hbm);
  CHECK(s.total_bytes == 2002);
  CHECK(s.piece[0].bytes == 126);
  CHECK(s.piece[1].bytes == 126);
  for (int e = 2; e < kEngines; ++e) CHECK(s.piece[static_cast<size_t>(e)].bytes == 125);
  CHECK(sum_bytes(s) == 2002);
  for (int e = 0; e < kEngines; ++e) CHECK(s.piece[static_cast<size_t>(e)].descriptors >= 1);

  // Exactly divisible: all equal.
  const DmaSplit even = split_transfer(hbm_rows(DType::kFloat32, 0, 64, 64), hbm_rows(DType::kFloat32, 1 << 20, 64, 64),
                                       kEngines, kPpe);
  for (int e = 0; e < kEngines; ++e) CHECK(even.piece[static_cast<size_t>(e)].bytes == 1024);
  for (int e = 0; e < kEngines; ++e) CHECK(even.piece[static_cast<size_t>(e)].descriptors >= 1);

  // Fewer bytes than engines: only the first engines get work.
  const DmaSplit tiny = split_transfer(hbm_rows(DType::kInt8, 0, 1, 5), hbm_rows(DType::kInt8, 64, 1, 5), kEngines, kPpe);
  CHECK(sum_bytes(tiny) == 5);
  for (int e = 0; e < kEngines; ++e) {
    CHECK(tiny.piece[static_cast<size_t>(e)].bytes == (e < 5 ? 1 : 0));
    CHECK(tiny.piece[static_cast<size_t>(e)].descriptors == (e < 5 ? 1 : 0));
  }
}

TEST_CASE("DMA split: strided sides increase descriptor counts", "[memory][dma]") {
  const Operand src = hbm_rows(DType::kFloat32, 0, 128, 256);

  // SBUF side with an outer gap: [128, 4, 64] rows 128 elements apart -> 4 runs per partition.
  Operand gap = Operand::tile(Space::kSbuf, DType::kFloat32, 0, 0, 128, {4, 64});
  gap.stride[0] = 128;
  const DmaSplit a = split_transfer(gap, src, kEngines, kPpe);
  for (int e = 0; e < kEngines; ++e) {
    CHECK(a.piece[static_cast<size_t>(e)].bytes == 8 * 1024);
    CHECK(a.piece[static_cast<size_t>(e)].descriptors == 8 * 4);
  }

  // SBUF side with inner stride 2: every element a buffer -> 256 per partition.
  Operand inner = Operand::tile(Space::kSbuf, DType::kFloat32, 0, 0, 128, {256});
  inner.stride[0] = 2;
  const DmaSplit b = split_transfer(inner, src, kEngines, kPpe);
  for (int e = 0; e < kEngines; ++e) CHECK(b.piece[static_cast<size_t>(e)].descriptors == 8 * 256);

  // HBM side strided (column slice with stride 2): its runs are spread over the partitions.
  Operand hcol = hbm_rows(DType::kFloat32, 0, 128, 256);
  hcol.stride[0] = 2;
  hcol.partition_step = 512;
  const Operand chip = Operand::tile(Space::kSbuf, DType::kFloat32, 0, 0, 128, {256});
  const DmaSplit c = split_transfer(chip, hcol, kEngines, kPpe);
  for (int e = 0; e < kEngines; ++e) CHECK(c.piece[static_cast<size_t>(e)].descriptors == 8 * 256);

  // Contiguous reference: 1 per partition.
  const DmaSplit d = split_transfer(chip, src, kEngines, kPpe);
  for (int e = 0; e < kEngines; ++e) CHECK(d.piece[static_cast<size_t>(e)].descriptors == 8);
}

TEST_CASE("DMA split: on-chip to on-chip, flags and totals", "[memory][dma]") {
  const Operand sb = Operand::tile(Space::kSbuf, DType::kFloat32, 0, 0, 32, {64});
  const Operand ps = Operand::tile(Space::kPsum, DType::kFloat32, 0, 0, 32, {64});
  const DmaSplit s = split_transfer(sb, ps, kEngines, kPpe);
  CHECK_FALSE(s.touches_hbm);
  CHECK(s.total_bytes == 32 * 64 * 4);
  CHECK(sum_bytes(s) == s.total_bytes);
  for (int e = 0; e < kEngines; ++e) CHECK(s.piece[static_cast<size_t>(e)].bytes == (e < 4 ? 8 * 256 : 0));

  // Fewer engines than partition groups: groups wrap around the engines.
  const Operand full = Operand::tile(Space::kSbuf, DType::kFloat32, 0, 0, 128, {16});
  const DmaSplit w = split_transfer(full, hbm_rows(DType::kFloat32, 0, 128, 16), 4, kPpe);
  CHECK(w.engines == 4);
  for (int e = 0; e < 4; ++e) CHECK(w.piece[static_cast<size_t>(e)].bytes == 32 * 64);
  for (int e = 4; e < kMaxDmaEngines; ++e) CHECK(w.piece[static_cast<size_t>(e)].bytes == 0);

  // Engine count is clamped to [1, kMaxDmaEngines].
  CHECK(split_transfer(full, hbm_rows(DType::kFloat32, 0, 128, 16), 0, kPpe).engines == 1);
  CHECK(split_transfer(full, hbm_rows(DType::kFloat32, 0, 128, 16), 1000, kPpe).engines == kMaxDmaEngines);
}
