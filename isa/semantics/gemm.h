#pragma once
/// The PE array's matrix product for multiply_moving: C (M x N, row-major) = A^T B, A (K x M, row-major:
/// the stationary as load_stationary keeps it), B (K x N, row-major: the moving tile).
/// Each element accumulates in fp32 in the order the array does, k = 0, 1, ..., K-1, one rounded
/// multiply and one rounded add per step, so the result is the same bits on every machine: an AVX-512 or
/// AVX2 kernel where the CPU has it, a portable loop otherwise. Where every product is exact in fp32
/// (gemm_products_exact: bf16, fp16, fp8 inputs) the vector kernels use fused multiply-adds, which then
/// round the same way.
#include <cstdint>
#include <memory>

#include "isa/semantics/semantics.h"

namespace nsim::isa::sem {

void gemm_tn(const float* a, int64_t k, int64_t m, const float* b, int64_t n, float* c);
/// The same into rows `ldc` floats apart; with `accumulate`, C = C + A^T B (the product summed in k order
/// first, then added to C: multiply_moving's accumulate into PSUM).
void gemm_tn(const float* a, int64_t k, int64_t m, const float* b, int64_t n, float* c, int64_t ldc, bool accumulate);
/// The portable loop alone (tests compare the two paths bit for bit).
void gemm_tn_portable(const float* a, int64_t k, int64_t m, const float* b, int64_t n, float* c);
void gemm_tn_portable(const float* a, int64_t k, int64_t m, const float* b, int64_t n, float* c, int64_t ldc,
                      bool accumulate);
/// True when gemm_tn uses a vector kernel (AVX2, or AVX-512 where present) on this machine.
bool gemm_tn_vectorized();
/// True when every product a[i] * b[j] is exact in fp32: every value finite with at most 12 significant
/// bits (bf16, fp16, fp8 and integers below 4096 all are), and every nonzero product within fp32's normal
/// range. gemm_tn then uses fused multiply-adds where the CPU has them: with exact products they give the
/// same bits as the separate multiply and add.
bool gemm_products_exact(const float* a, int64_t na, const float* b, int64_t nb);

/// gemm_tn(a, k, m, b, n, c, ldc, accumulate) that may still be running on host threads when it returns
/// (sem::SharedJob), so the caller goes on with the next instructions meanwhile: multiply_moving's
/// product behind the work up to the next instruction that needs its result. Until wait(), the product
/// writes C's rows (writes()), and reads its own copies of A (packed) and B (moving()), never the caller's.
/// The bits are gemm_tn's: every column is computed by the same code, whichever thread does it.
///
/// B is kept converted per moving view: a view multiplied again while none of its bytes was written
/// since (forget(): the owner reports every write) is not converted again (matmul loops reuse their
/// moving tiles across the stationary ones).
class AsyncGemm {
 public:
  AsyncGemm();
  ~AsyncGemm();  ///< waits
  AsyncGemm(const AsyncGemm&) = delete;
  AsyncGemm& operator=(const AsyncGemm&) = delete;
  /// The next run()'s B (k x n = `elems` floats, row-major) for moving view `mov`: when `converted` comes
  /// back true it holds mov's values already, else the caller writes them. Not read by the pending product.
  float* moving(const TileView& mov, int64_t elems, bool& converted);
  /// Start C (+)= A^T B with B from the last moving() (after the pending product, which it waits for).
  /// `a` is only read before run() returns.
  void run(const float* a, int64_t k, int64_t m, int64_t n, float* c, int64_t ldc, bool accumulate);
  /// Return when the pending product, if any, is complete (this thread takes the blocks left).
  void wait();
  bool pending() const;
  /// Whether the pending product may write bytes of `v`'s elements (may_overlap with C).
  bool writes(const TileView& v) const;
  /// Bytes of `v` were written: drop the conversions of the moving views they may overlap.
  void forget(const TileView& v);
  /// Any memory may have been written: drop every conversion.
  void forget_all();

  /// Moving views kept converted at most (the least recently used one is replaced).
  static constexpr int kKeptMoving = 32;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace nsim::isa::sem
