#include "memory/memory.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace nsim::memory {

using isa::Operand;
using isa::Space;

isa::Operand HbmTensor::whole() const {
  Operand o;
  o.space = Space::kHbm;
  o.dtype = dtype;
  o.offset = addr;
  int64_t rows = shape.empty() ? 1 : shape[0];
  int64_t rest = 1;
  for (size_t i = 1; i < shape.size(); ++i) rest *= shape[i];
  o.num_partitions = static_cast<uint32_t>(rows);
  o.partition_step = rest;
  o.nfree = 1;
  o.size[0] = rest;
  o.stride[0] = 1;
  return o;
}

std::optional<int64_t> RangeAllocator::alloc(int64_t bytes) {
  if (bytes <= 0) bytes = 1;
  const int64_t need = (bytes + align_ - 1) / align_ * align_;
  int64_t cursor = 0;
  for (const auto& [off, len] : blocks_) {
    if (off - cursor >= need) break;
    cursor = (off + len + align_ - 1) / align_ * align_;
  }
  if (cursor + need > capacity_) return std::nullopt;
  blocks_[cursor] = need;
  used_ += need;
  peak_ = std::max(peak_, used_);
  return cursor;
}

void RangeAllocator::free(int64_t offset) {
  auto it = blocks_.find(offset);
  if (it == blocks_.end()) return;
  used_ -= it->second;
  blocks_.erase(it);
}

void fill_sentinel(uint8_t* p, int64_t bytes, DType dt) {
  const int eb = dtype_bytes(dt);
  const int64_t whole = bytes / eb * eb;  // a trailing partial element is left alone
  if (whole <= 0) return;
  if (dtype_is_float(dt))
    store_f32(dt, p, std::numeric_limits<float>::quiet_NaN());
  else
    store_int(dt, p, 4);
  // Double the filled prefix up to a block that stays in L1 (a few copies instead of one call per element:
  // filling the 24 MiB SBUF element by element took ~80 ms of every numerics run), then copy that block on:
  // doubling all the way read the prefix back from L2 or L3 in copies of megabytes, twice the memory traffic.
  constexpr int64_t kBlock = 4096;
  const int64_t block = std::min(whole, kBlock / eb * eb);
  for (int64_t done = eb; done < block; done *= 2)
    std::memcpy(p + done, p, static_cast<size_t>(std::min(done, block - done)));
  for (int64_t done = block; done < whole; done += block)
    std::memcpy(p + done, p, static_cast<size_t>(std::min(block, whole - done)));
}

Memory::Memory(const MemoryConfig& cfg, bool with_storage, int64_t align)
    : cfg_(cfg),
      with_storage_(with_storage),
      sbuf_alloc_(cfg.sbuf_bytes_per_partition, align),
      psum_alloc_(cfg.psum_bytes_per_partition(), align) {
  if (with_storage_) {
    sbuf_ = Buffer(static_cast<size_t>(cfg.partitions) * static_cast<size_t>(cfg.host_pitch(false)));
    psum_ = Buffer(static_cast<size_t>(cfg.psum_partitions) * static_cast<size_t>(cfg.host_pitch(true)));
    // Unwritten on-chip memory reads as NaN (fp32 sentinel, the whole buffer one fp32 array) so use of
    // uninitialised data is visible. Filled lazily: resolve() fills every partition up to the furthest
    // byte an operand has reached (filling all 26 MB of trn2's SBUF and PSUM up front was ~15 % of a
    // 1024^3 matmul's numerics run, and most kernels use a fraction of it).
  }
}

void Memory::fill_onchip_to(Space space, int64_t hi) const {
  auto* self = const_cast<Memory*>(this);
  const bool psum = space == Space::kPsum;
  int64_t& filled = psum ? self->psum_filled_ : self->sbuf_filled_;
  if (hi <= filled) return;
  Buffer& store = psum ? self->psum_ : self->sbuf_;
  const int64_t bytes = psum ? cfg_.psum_bytes_per_partition() : cfg_.sbuf_bytes_per_partition;
  const int64_t pitch = cfg_.host_pitch(psum);
  // Up to `hi` rounded up to 1 KiB, and at least a quarter further than before: few calls per run however the
  // kernel's tiles climb (about 20 from 1 KiB to all of SBUF). (In 16 KiB steps a small kernel's run filled 2 MB of
  // SBUF for the 6 KB per partition its tiles used: its tracer.run() 0.94 of the time now, docs/performance.md
  // thirty-first session. Doubling filled up to twice what the tiles reached: 72 KiB per partition for the 40 KiB
  // flash attention's tiles use at S=2048, 68 for a 1024^3 matmul's 48.) (`hi` may be past the partition: resolve()
  // checks the bounds after.)
  constexpr int64_t kStep = 1 << 10;
  const int64_t reach = hi >= bytes ? bytes : (hi + kStep - 1) / kStep * kStep;  // (no overflow for a wild `hi`)
  const int64_t to = std::min(bytes, std::max(reach, filled + filled / 4));
  uint8_t pat[4];
  store_f32(DType::kFloat32, pat, std::numeric_limits<float>::quiet_NaN());
  // Bytes [filled, to) of partition 0, byte i holding pat[i % 4] as a whole-buffer fill would, then the same
  // bytes copied into every other partition (rows `pitch` bytes apart, a multiple of 4: the same pattern).
  uint8_t* row0 = store.data();
  int64_t a = filled;
  for (; a < to && a % 4 != 0; ++a) row0[a] = pat[a % 4];
  const int64_t mid = (to - a) / 4 * 4;
  if (mid > 0) fill_sentinel(row0 + a, mid, DType::kFloat32);
  for (a += mid; a < to; ++a) row0[a] = pat[a % 4];
  const int64_t parts = static_cast<int64_t>(store.size()) / pitch;
  for (int64_t p = 1; p < parts; ++p)
    std::memcpy(row0 + p * pitch + filled, row0 + filled, static_cast<size_t>(to - filled));
  filled = to;
}

const HbmTensor& Memory::alloc_hbm(const std::string& name, const std::vector<int64_t>& shape, DType dt) {
  if (hbm_->by_name.count(name))
    throw Error(ErrorCode::kBadAccessPattern, fmt::format("HBM tensor '{}' already exists", name));
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d <= 0) throw Error(ErrorCode::kBadAccessPattern, fmt::format("HBM tensor '{}' has a dimension of size {}", name, d));
    if (n > std::numeric_limits<int64_t>::max() / d)
      throw Error(ErrorCode::kHbmOverflow, fmt::format("HBM tensor '{}' is too large", name));
    n *= d;
  }
  const int64_t bytes = n * dtype_bytes(dt);
  const int64_t addr = (hbm_->next + 63) / 64 * 64;
  if (addr + bytes > cfg_.hbm_bytes)
    throw Error(ErrorCode::kHbmOverflow, fmt::format("HBM tensor '{}' needs {} bytes at address {}, but HBM holds {} bytes",
                                                     name, bytes, addr, cfg_.hbm_bytes));
  hbm_->next = addr + bytes;
  HbmBlock blk{name, bytes, {}, dt};
  if (with_storage_) {
    blk.data = Buffer(static_cast<size_t>(bytes));
    // The sentinel is written when the tensor is first read: the inputs, overwritten whole before the run
    // (hbm_data_to_overwrite), never hold it (their fill was 4 of the ~47 MB a 1024^3 matmul's run moved).
    blk.unfilled = true;
  }
  hbm_->blocks.emplace(addr, std::move(blk));
  HbmTensor t{name, addr, bytes, dt, shape};
  return hbm_->by_name.emplace(name, std::move(t)).first->second;
}

const HbmTensor& Memory::hbm_tensor(const std::string& name) const {
  auto it = hbm_->by_name.find(name);
  if (it == hbm_->by_name.end()) throw Error(ErrorCode::kUnknownTensor, fmt::format("no HBM tensor named '{}'", name));
  return it->second;
}

std::vector<std::string> Memory::hbm_tensor_names() const {
  std::vector<std::string> v;
  for (const auto& [n, t] : hbm_->by_name) v.push_back(n);
  return v;
}

uint8_t* Memory::filled(HbmBlock& b) {
  if (b.unfilled) {
    fill_sentinel(b.data.data(), b.bytes, b.dtype);
    b.unfilled = false;
  }
  return b.data.empty() ? nullptr : b.data.data();
}

uint8_t* Memory::hbm_data(const std::string& name) { return filled(hbm_->blocks.at(hbm_tensor(name).addr)); }
const uint8_t* Memory::hbm_data(const std::string& name) const { return const_cast<Memory*>(this)->hbm_data(name); }

uint8_t* Memory::hbm_data_to_overwrite(const std::string& name) {
  HbmBlock& b = hbm_->blocks.at(hbm_tensor(name).addr);
  b.unfilled = false;
  return b.data.empty() ? nullptr : b.data.data();
}

Buffer Memory::take_hbm_data(const std::string& name) {
  HbmBlock& b = hbm_->blocks.at(hbm_tensor(name).addr);
  filled(b);
  return std::move(b.data);
}

int64_t Memory::alloc_onchip(Space space, int64_t bytes_per_partition) {
  RangeAllocator& a = space == Space::kPsum ? psum_alloc_ : sbuf_alloc_;
  auto off = a.alloc(bytes_per_partition);
  if (!off) {
    const bool psum = space == Space::kPsum;
    throw Error(psum ? ErrorCode::kPsumOverflow : ErrorCode::kSbufOverflow,
                fmt::format("{} overflow: a tile of {} bytes per partition does not fit ({} of {} bytes per partition in use)",
                            psum ? "PSUM" : "SBUF", bytes_per_partition, a.used(), a.capacity()));
  }
  return *off;
}

void Memory::free_onchip(Space space, int64_t offset) { (space == Space::kPsum ? psum_alloc_ : sbuf_alloc_).free(offset); }

const RangeAllocator& Memory::allocator(Space space) const { return space == Space::kPsum ? psum_alloc_ : sbuf_alloc_; }

void Memory::check_bounds(const Operand& o, const char* what, int64_t reach) const {
  auto [lo, hi] = o.byte_extent();
  if (o.space == Space::kHbm) {
    hi += reach;
    auto it = hbm_->blocks.upper_bound(lo);
    if (it == hbm_->blocks.begin() || lo < 0)
      throw Error(ErrorCode::kOutOfBounds, fmt::format("{}: HBM bytes [{}, {}) are not inside any tensor", what, lo, hi));
    --it;
    if (hi > it->first + it->second.bytes)
      throw Error(ErrorCode::kOutOfBounds,
                  fmt::format("{}: HBM bytes [{}, {}) run past the end of tensor '{}' [{}, {})", what, lo, hi,
                              it->second.name, it->first, it->first + it->second.bytes));
    return;
  }
  const int parts = o.space == Space::kPsum ? cfg_.psum_partitions : cfg_.partitions;
  const int64_t cap = o.space == Space::kPsum ? cfg_.psum_bytes_per_partition() : cfg_.sbuf_bytes_per_partition;
  if (o.num_partitions > static_cast<uint32_t>(parts))
    throw Error(ErrorCode::kTooManyPartitions,
                fmt::format("{}: {} partitions requested, {} has {}", what, o.num_partitions, isa::space_name(o.space), parts));
  if (o.start_partition + o.num_partitions > static_cast<uint32_t>(parts) || lo < 0 || hi > cap)
    throw Error(ErrorCode::kOutOfBounds,
                fmt::format("{}: partitions [{}, {}) bytes [{}, {}) are outside {} ({} partitions x {} bytes)", what,
                            o.start_partition, o.start_partition + o.num_partitions, lo, hi, isa::space_name(o.space),
                            parts, cap));
}

isa::TileView Memory::resolve(const Operand& o) const {
  isa::TileView v;
  if (!o.present()) return v;
  check_bounds(o, "operand");
  v.dtype = o.dtype;
  v.nfree = o.nfree;
  v.size = o.size;
  v.stride = o.stride;
  v.partitions = o.num_partitions;
  if (!with_storage_) return v;
  const int64_t eb = dtype_bytes(o.dtype);
  auto* self = const_cast<Memory*>(this);
  if (o.space == Space::kHbm) {
    auto it = self->hbm_->blocks.upper_bound(o.offset);
    --it;
    v.base = filled(it->second) + (o.offset - it->first);
    v.partition_stride_bytes = o.partition_step * eb;
  } else {
    fill_onchip_to(o.space, o.byte_extent().second);  // an indirect side's reach: resolve_slot()
    auto& store = o.space == Space::kPsum ? self->psum_ : self->sbuf_;
    const int64_t pitch = cfg_.host_pitch(o.space == Space::kPsum);
    v.base = store.data() + o.start_partition * pitch + o.offset;
    v.partition_stride_bytes = pitch;
  }
  return v;
}

isa::TileView Memory::resolve_slot(const isa::Instr& in, int slot) const {
  const Operand& o = in.slot(slot);
  if (with_storage_ && o.present() && o.space != Space::kHbm) fill_onchip_to(o.space, isa::slot_extent(in, slot).second);
  return resolve(o);
}

}  // namespace nsim::memory
