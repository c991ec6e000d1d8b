// Reusable byte blocks: see buffer.h.
#include "memory/buffer.h"

#include <cstdlib>
#include <mutex>
#include <new>
#include <utility>
#include <vector>

namespace nsim::memory {

namespace {

struct Block {
  size_t size;
  uint8_t* p;
  bool zero;  ///< all bytes zero
};

struct Pool {
  std::mutex mu;
  std::vector<Block> free;  ///< oldest first
  size_t bytes = 0;

  /// A block of `size` bytes (zero ones when `zero`; else preferably not zero ones), nullptr if none.
  uint8_t* take(size_t size, bool zero) {
    std::lock_guard<std::mutex> lock(mu);
    size_t best = free.size();
    for (size_t i = free.size(); i-- > 0;) {
      if (free[i].size != size || (zero && !free[i].zero)) continue;
      if (best == free.size() || free[best].zero) best = i;
    }
    if (best == free.size()) return nullptr;
    uint8_t* p = free[best].p;
    free.erase(free.begin() + static_cast<std::ptrdiff_t>(best));
    bytes -= size;
    return p;
  }
};

Pool& pool() {
  static Pool* p = new Pool;  // never destroyed: Buffers may be released during static destruction
  return *p;
}

}  // namespace

Buffer::Buffer(size_t bytes) : n_(bytes) {
  if (bytes == 0) return;
  p_ = pool().take(bytes, false);
  if (p_) return;
  p_ = static_cast<uint8_t*>(std::malloc(bytes));
  if (!p_) throw std::bad_alloc();
}

Buffer::Buffer(size_t bytes, Zeroed) : n_(bytes) {
  if (bytes == 0) return;
  p_ = pool().take(bytes, true);
  if (p_) return;
  p_ = static_cast<uint8_t*>(std::calloc(bytes, 1));
  if (!p_) throw std::bad_alloc();
}

void Buffer::release() {
  if (!p_) return;
  uint8_t* p = std::exchange(p_, nullptr);
  const size_t n = std::exchange(n_, 0);
  const bool zero = std::exchange(zero_, false);
  if (n <= kPoolBytes) {
    Pool& pl = pool();
    std::lock_guard<std::mutex> lock(pl.mu);
    pl.free.push_back(Block{n, p, zero});
    pl.bytes += n;
    while (pl.bytes > kPoolBytes) {  // drop the oldest
      pl.bytes -= pl.free.front().size;
      std::free(pl.free.front().p);
      pl.free.erase(pl.free.begin());
    }
    return;
  }
  std::free(p);
}

size_t Buffer::pooled_bytes() {
  Pool& pl = pool();
  std::lock_guard<std::mutex> lock(pl.mu);
  return pl.bytes;
}

}  // namespace nsim::memory
