// Reusable byte blocks: see buffer.h.
#include "memory/buffer.h"

#include <cstdlib>
#include <mutex>
#include <new>
#include <utility>
#include <vector>

namespace nsim::memory {

namespace {

struct Pool {
  std::mutex mu;
  std::vector<std::pair<size_t, uint8_t*>> free;  ///< (size, block), oldest first
  size_t bytes = 0;
};

Pool& pool() {
  static Pool* p = new Pool;  // never destroyed: Buffers may be released during static destruction
  return *p;
}

}  // namespace

Buffer::Buffer(size_t bytes) : n_(bytes) {
  if (bytes == 0) return;
  {
    Pool& pl = pool();
    std::lock_guard<std::mutex> lock(pl.mu);
    for (size_t i = pl.free.size(); i-- > 0;)
      if (pl.free[i].first == bytes) {
        p_ = pl.free[i].second;
        pl.free.erase(pl.free.begin() + static_cast<std::ptrdiff_t>(i));
        pl.bytes -= bytes;
        return;
      }
  }
  p_ = static_cast<uint8_t*>(std::malloc(bytes));
  if (!p_) throw std::bad_alloc();
}

void Buffer::release() {
  if (!p_) return;
  uint8_t* p = std::exchange(p_, nullptr);
  const size_t n = std::exchange(n_, 0);
  if (n <= kPoolBytes) {
    Pool& pl = pool();
    std::lock_guard<std::mutex> lock(pl.mu);
    pl.free.emplace_back(n, p);
    pl.bytes += n;
    while (pl.bytes > kPoolBytes) {  // drop the oldest
      pl.bytes -= pl.free.front().first;
      std::free(pl.free.front().second);
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
