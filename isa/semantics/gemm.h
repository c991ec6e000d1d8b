#pragma once
/// The PE array's matrix product for multiply_moving: C (M x N, row-major) = A^T B, A (K x M, row-major:
/// the stationary as load_stationary keeps it), B (K x N, row-major: the moving tile).
/// Each element accumulates in fp32 in the order the array does, k = 0, 1, ..., K-1, one rounded
/// multiply and one rounded add per step, so the result is the same bits on every machine: an AVX-512 or
/// AVX2 kernel where the CPU has it, a portable loop otherwise. Where every product is exact in fp32
/// (gemm_products_exact: bf16, fp16, fp8 inputs) the vector kernels use fused multiply-adds, which then
/// round the same way.
#include <cstdint>

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

}  // namespace nsim::isa::sem
