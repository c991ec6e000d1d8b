#pragma once
/// Large byte blocks (SBUF / PSUM / HBM storage, the sanitizer's shadow bytes) kept for reuse within
/// the process. A numerics run allocates ~50 MB of them on trn2 (SBUF and the sanitizer's copy of it,
/// 24 MiB each); fresh pages cost a page fault each (~13,000 per run), which made a small kernel's
/// numerics from Python take tens of milliseconds, most of it in the kernel (docs/performance.md,
/// "Numerics: fixed costs of a run"). A Buffer released goes back to a process-wide pool (bounded by
/// kPoolBytes) and the next Buffer of the same size takes it, already mapped.
///
/// The bytes of a new Buffer are unspecified (the owners fill them: the sentinel, zeros, the inputs).
#include <cstddef>
#include <cstdint>

namespace nsim::memory {

class Buffer {
 public:
  /// Bytes the pool keeps at most (released buffers beyond it are freed).
  static constexpr size_t kPoolBytes = size_t{256} << 20;

  Buffer() = default;
  /// `bytes` uninitialised bytes.
  explicit Buffer(size_t bytes);
  struct Zeroed {};
  /// `bytes` zero bytes: a pooled block its last owner declared zero (set_zero), else fresh pages
  /// from calloc (mapped lazily: untouched pages cost nothing).
  Buffer(size_t bytes, Zeroed);
  ~Buffer() { release(); }
  Buffer(Buffer&& o) noexcept : p_(o.p_), n_(o.n_), zero_(o.zero_) { o.p_ = nullptr, o.n_ = 0, o.zero_ = false; }
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      release();
      p_ = o.p_, n_ = o.n_, zero_ = o.zero_;
      o.p_ = nullptr, o.n_ = 0, o.zero_ = false;
    }
    return *this;
  }
  /// The owner promises every byte is zero now (and writes none before the Buffer is released), so
  /// the next Buffer(bytes, Zeroed{}) can take it without clearing it.
  void set_zero() { zero_ = true; }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  uint8_t* data() { return p_; }
  const uint8_t* data() const { return p_; }
  size_t size() const { return n_; }
  bool empty() const { return n_ == 0; }

  /// Bytes held by the pool now (tests).
  static size_t pooled_bytes();

 private:
  void release();
  uint8_t* p_ = nullptr;
  size_t n_ = 0;
  bool zero_ = false;
};

}  // namespace nsim::memory
