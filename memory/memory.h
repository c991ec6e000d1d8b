#pragma once
/// On-chip and device memory of one NeuronCore: HBM (sparse, tensors by name), SBUF and PSUM
/// (partitions x bytes), their allocators with capacity checks, and resolution of access patterns
/// into tile views with bounds checks.
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "isa/isa.h"
#include "isa/semantics/semantics.h"
#include "memory/buffer.h"

namespace nsim::memory {

/// Sizes of the memories, from config.
/// Filled from the config by engines::CoreParams::from_config (CoreParams::mem); no defaults of its own.
struct MemoryConfig {
  int partitions = 0;
  int64_t sbuf_bytes_per_partition = 0;
  int psum_partitions = 0;
  int psum_banks = 0;
  int64_t psum_bank_bytes = 0;
  int64_t hbm_bytes = 0;
  int64_t psum_bytes_per_partition() const { return psum_banks * psum_bank_bytes; }
  /// Host bytes from one partition's storage to the next (SBUF or PSUM; also the sanitizer's shadow): the
  /// partition's bytes plus kHostPad. At an exact multiple of 4 KiB (trn2's 192 KiB SBUF partitions,
  /// 16 KiB PSUM ones) the same column of every partition fell into one L1 / L2 cache set, so a tile's
  /// rows evicted each other between the instruction that wrote them and the one reading them. Only
  /// the host layout: what a kernel addresses is unchanged.
  int64_t host_pitch(bool psum) const { return (psum ? psum_bytes_per_partition() : sbuf_bytes_per_partition) + kHostPad; }
  /// 17 cache lines (a multiple of 4 bytes, so the NaN sentinel's byte pattern is where it was): when a
  /// partition's bytes are a multiple of a cache's set span, as trn2's are, partition p's rows start
  /// 17 p lines apart modulo it, an odd stride that reaches every set.
  static constexpr int64_t kHostPad = 17 * 64;
};

/// A named HBM tensor.
struct HbmTensor {
  std::string name;
  int64_t addr = 0;
  int64_t bytes = 0;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  /// Access pattern over the whole tensor: dim 0 as rows, the rest flattened into up to 4 free dims.
  isa::Operand whole() const;
};

/// First-fit allocator of per-partition byte ranges (the same range on every partition).
class RangeAllocator {
 public:
  RangeAllocator() = default;
  RangeAllocator(int64_t capacity, int64_t align) : capacity_(capacity), align_(align) {}
  /// Returns the offset, or nullopt when no gap of `bytes` is free.
  std::optional<int64_t> alloc(int64_t bytes);
  void free(int64_t offset);
  int64_t used() const { return used_; }
  int64_t peak() const { return peak_; }
  int64_t capacity() const { return capacity_; }

 private:
  int64_t capacity_ = 0;
  int64_t align_ = 1;
  int64_t used_ = 0;
  int64_t peak_ = 0;
  std::map<int64_t, int64_t> blocks_;  // offset -> bytes
};

/// Storage of HBM, SBUF and PSUM. Storage for on-chip memories is only created when numerics are on.
class Memory {
 public:
  /// `align`: alignment of on-chip allocations in bytes per partition.
  Memory(const MemoryConfig& cfg, bool with_storage, int64_t align = 4);

  const MemoryConfig& config() const { return cfg_; }

  /// Allocate a named HBM tensor, holding the sentinel (fill_sentinel: NaN for floats, 4 for ints) when first
  /// read: the fill waits for the first hbm_data(), take_hbm_data() or resolve(), so a tensor the caller then
  /// overwrites whole (hbm_data_to_overwrite: the inputs) is never filled.
  const HbmTensor& alloc_hbm(const std::string& name, const std::vector<int64_t>& shape, DType dt);
  const HbmTensor& hbm_tensor(const std::string& name) const;  ///< E208 if unknown
  bool has_hbm_tensor(const std::string& name) const { return hbm_->by_name.count(name) != 0; }
  std::vector<std::string> hbm_tensor_names() const;
  /// End of the HBM tensors allocated so far (bytes; the next one starts at or after it).
  int64_t hbm_end() const { return hbm_->next; }
  /// Use `owner`'s HBM (tensors, storage, allocation) from now on: the physical cores of an LNC=2
  /// launch share one HBM. Call before allocating any HBM tensor here.
  void share_hbm(const Memory& owner) { hbm_ = owner.hbm_; }
  uint8_t* hbm_data(const std::string& name);
  const uint8_t* hbm_data(const std::string& name) const;
  /// hbm_data() for a caller about to write every byte of the tensor (the inputs, a copy of one): the
  /// sentinel is not written first. nullptr without storage.
  uint8_t* hbm_data_to_overwrite(const std::string& name);
  /// Move the storage of HBM tensor `name` out (empty without storage): the tensor has none afterwards.
  /// For handing a finished run's outputs to the caller without copying them.
  Buffer take_hbm_data(const std::string& name);

  /// Allocate a tile of `bytes_per_partition` on `num_partitions` partitions starting at 0.
  /// E204 (SBUF) / E206 (PSUM) when it does not fit. Returns the byte offset within each partition.
  int64_t alloc_onchip(isa::Space space, int64_t bytes_per_partition);
  void free_onchip(isa::Space space, int64_t offset);
  const RangeAllocator& allocator(isa::Space space) const;

  /// Bounds-check `o` and return a view onto storage. E201 when out of bounds, E202 over partitions.
  isa::TileView resolve(const isa::Operand& o) const;
  /// resolve(in.slot(slot)), where on-chip storage reached by an indirect side's rows (isa::slot_extent)
  /// holds the sentinel too.
  isa::TileView resolve_slot(const isa::Instr& in, int slot) const;
  /// Bounds check only (no storage needed).
  /// `reach`: extra bytes past the operand's extent that must lie in the same HBM tensor (the rows an
  /// indirect access may reach, isa::slot_extent).
  void check_bounds(const isa::Operand& o, const char* what, int64_t reach = 0) const;

  bool has_storage() const { return with_storage_; }

 private:
  struct HbmBlock {
    std::string name;
    int64_t bytes;
    Buffer data;  ///< empty without storage
    DType dtype;
    bool unfilled = false;  ///< `data` does not hold the sentinel yet (alloc_hbm): filled when first read
  };
  /// The block's storage, with the sentinel written first if it is still unfilled.
  static uint8_t* filled(HbmBlock& b);
  MemoryConfig cfg_;
  bool with_storage_;
  Buffer sbuf_, psum_;  ///< pooled (memory/buffer.h); filled with the sentinel as operands reach them
  int64_t sbuf_filled_ = 0, psum_filled_ = 0;  ///< bytes of every partition holding the sentinel so far
  /// Fill every partition of SBUF or PSUM with the sentinel up to at least byte `hi` of the partition.
  void fill_onchip_to(isa::Space space, int64_t hi) const;
  struct HbmStore {
    std::map<int64_t, HbmBlock> blocks;  // addr -> block
    std::map<std::string, HbmTensor> by_name;
    int64_t next = 0;
  };
  std::shared_ptr<HbmStore> hbm_ = std::make_shared<HbmStore>();  ///< shared by the cores of an LNC=2 launch
  RangeAllocator sbuf_alloc_, psum_alloc_;
};

/// Fill pattern of fresh, unwritten memory (spec 1.3: NaN for float dtypes, 4 for integer dtypes).
void fill_sentinel(uint8_t* p, int64_t bytes, DType dt);

}  // namespace nsim::memory
