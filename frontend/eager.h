#pragma once
/// EagerSession: the numerics of a kernel executed instruction by instruction while it is traced, so a
/// kernel can look at tile values (print, numpy, a debugger) before it is finished. It runs the same
/// semantics as the Simulator (isa::verify, memory::Memory::resolve, isa::execute on one ArchState) —
/// there is no second numerics implementation — but no timing. Ops arrive in fragments of kernel.json
/// (the ops traced since the last fragment); tiles keep their storage across fragments.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "engines/params.h"
#include "isa/semantics/semantics.h"
#include "memory/memory.h"
#include "sim/config.h"

namespace nsim::frontend {

struct Tensor;

class EagerSession {
 public:
  explicit EagerSession(const sim::Config& cfg);

  /// Declare HBM tensor `name` with the `size` bytes at `data` as contents (none: the unwritten-memory sentinel).
  void add_hbm(const std::string& name, const std::vector<int64_t>& shape, DType dt, const uint8_t* data, size_t size);
  bool has_tensor(const std::string& name) const;
  /// Execute the ops of the kernel.json text `fragment`: its HBM tensors are declared if new (no
  /// contents), its alloc statements place tiles not seen before, its ops run in order. Returns the
  /// number of instructions executed.
  uint64_t run(const std::string& fragment);
  /// The bytes of a whole tensor (a tile: partitions x free bytes, row-major).
  std::vector<uint8_t> read(const std::string& name) const;
  uint64_t instructions() const { return executed_; }

 private:
  struct Tile {
    isa::Space space = isa::Space::kSbuf;
    DType dtype = DType::kFloat32;
    std::vector<int64_t> shape;
    int64_t offset = 0;
  };
  int64_t place(const Tensor& t, int64_t bytes);  ///< byte offset of a new tile in its space

  engines::CoreParams p_;
  isa::Limits limits_;
  memory::Memory mem_;
  isa::ArchState st_;
  std::map<std::string, Tile> tiles_;
  uint64_t executed_ = 0;
  int64_t sbuf_low_ = -1, psum_low_ = -1;            ///< place(): automatic tiles stack down from here (-1: top)
  int64_t sbuf_manual_hi_ = 0, psum_manual_hi_ = 0;  ///< place(): end of the highest manual (address=) tile
};

}  // namespace nsim::frontend
