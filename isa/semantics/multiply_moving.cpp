// multiply_moving: dst[M, N] (PSUM) = stationary^T (M x K) * moving (K x N), fp32 accumulation
// in k order (isa/semantics/gemm.h). kAccumulate: dst = dst + result (read as fp32, add, store with dst dtype, RNE for bf16).
// kDoubleRow: moving [K, 2, N] -> (2K) x N, rows r*K + k (same order as load_stationary).
// kIsTranspose: when every column of moving has at most one nonzero entry and it is 1 (a 0/1
// permutation / selection matrix), the result copies stationary values exactly (NaN/Inf kept,
// payloads too where the dst format can hold them); an fp8 stationary into a 16-bit dst gives the
// raw fp8 byte zero-extended. Otherwise the ordinary fp32 matmul is computed.
// MX (x4-packed moving, nc_matmul_mx): moving [K, N] x4 -> (4K) x N decoded with its group scales from
// views[2] (sem::mx_decode, the layout of load_stationary's MX stationary); both inputs must be MX.
#include <cstdint>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "isa/semantics/gemm.h"
#include "isa/semantics/internal.h"
#include "isa/semantics/parallel.h"

namespace nsim::isa {

namespace {
using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

/// A moving operand of at least kParallelConvert elements is converted to fp32 by host threads, runs of
/// kConvertRows rows each: below that, waking a helper costs about what it saves.
constexpr int64_t kParallelConvert = int64_t{1} << 15, kConvertRows = 16;

/// Whether v's partitions are rows of contiguous, aligned fp32 a whole number of floats apart (the
/// product can then be written in place).
bool fp32_rows(const TileView& v) {
  if (v.dtype != DType::kFloat32 || !v.contiguous()) return false;
  if (reinterpret_cast<uintptr_t>(v.base) % alignof(float) != 0 || v.partition_stride_bytes % sizeof(float) != 0)
    return false;
  return v.partition_stride_bytes >= v.elems() * static_cast<int64_t>(sizeof(float)) || v.partitions <= 1;
}

/// For a selection matrix return true and fill sel[n] = row of the 1 in column n (-1: zero column).
bool selection_rows(const RowMat& mv, std::vector<int64_t>& sel) {
  const Eigen::Index K = mv.rows(), N = mv.cols();
  sel.assign(static_cast<size_t>(N), -1);
  for (Eigen::Index k = 0; k < K; ++k)
    for (Eigen::Index n = 0; n < N; ++n) {
      const float x = mv(k, n);
      if (x == 0.0f) continue;
      if (x != 1.0f || sel[static_cast<size_t>(n)] >= 0) return false;
      sel[static_cast<size_t>(n)] = k;
    }
  return true;
}
}  // namespace

void exec_kMultiplyMoving(const Instr& in, const Views& v, ArchState& st) {
  using namespace sem;
  const TileView& dst = v[0];
  const TileView& mov = v[1];
  require(in, dst, "dst");
  require(in, mov, "moving");
  const bool dbl = (in.flags & kDoubleRow) != 0;
  const bool mx = dtype_is_mx_x4(mov.dtype);
  if (mx != dtype_is_mx_x4(st.stationary_dtype))
    fail(ErrorCode::kBadDtype, in,
         fmt::format("moving is {} but the loaded stationary is {}: an MX matmul needs both inputs x4-packed",
                     dtype_name(mov.dtype), dtype_name(st.stationary_dtype)));
  const int64_t K = mov.partitions, F = mov.elems();
  if (dbl && F % 2 != 0)
    fail(ErrorCode::kShapeMismatch, in, fmt::format("double_row moving needs [K, 2, N], got {} elements", F));
  const int64_t N = dbl ? F / 2 : F;
  const int64_t R = mx ? 4 * K : dbl ? 2 * K : K;
  if (st.stationary.rows() != R)
    fail(ErrorCode::kShapeMismatch, in,
         fmt::format("moving has K = {} rows{} but the loaded stationary has {}", R, dbl ? " (double_row)" : "",
                     st.stationary.rows()));
  const int64_t M = st.stationary.cols();
  if (dst.partitions != M || dst.elems() != N)
    fail(ErrorCode::kShapeMismatch, in,
         fmt::format("dst must be [{}, {}] (M x N), got [{}, {}]", M, N, dst.partitions, dst.elems()));

  // The common case may run its product behind the next instructions (st.async_gemm): the moving tile
  // is converted into the AsyncGemm's buffer while a pending product still runs. Every other case
  // writes dst here and now, after the pending product.
  AsyncGemm* async = st.async_gemm;
  const bool behind = async != nullptr && !mx && !dbl && (in.flags & kIsTranspose) == 0 && fp32_rows(dst);
  if (async != nullptr && !behind) async->wait();

  thread_local RowMat mv, res;
  if (!behind) mv.resize(static_cast<Eigen::Index>(R), static_cast<Eigen::Index>(N));
  if (mx) {
    float* vals = fscratch(0, R * N);
    mx_decode(in, mov, v[2], vals);
    for (int64_t r = 0; r < R; ++r)
      for (int64_t n = 0; n < N; ++n) mv(r, n) = vals[r * N + n];
  } else if (!dbl) {  // large operands converted by host threads, a run of rows each (sem::parallel_for)
    bool converted = false;  // (behind: kept from an earlier product of the same, unwritten, view)
    float* rows = behind ? async->moving(mov, K * N, converted) : mv.data();  // (mv is thread_local)
    if (!converted)
      parallel_for(K, kConvertRows, K * N >= kParallelConvert, [&](int64_t k0, int64_t k1) {
        for (int64_t k = k0; k < k1; ++k) read_row(mov, static_cast<uint32_t>(k), rows + k * N);
      });
  } else {
    float* row = fscratch(0, F);
    for (int64_t k = 0; k < K; ++k) {
      read_row(mov, static_cast<uint32_t>(k), row);
      for (int64_t r = 0; r < (dbl ? 2 : 1); ++r)
        for (int64_t n = 0; n < N; ++n) mv(r * K + k, n) = row[r * N + n];
    }
  }
  const bool accumulate = (in.flags & kAccumulate) != 0;

  if ((in.flags & kIsTranspose) != 0 && !dbl) {
    thread_local std::vector<int64_t> sel;
    if (selection_rows(mv, sel)) {
      const int des = esz(dst);
      const bool raw_fp8 = dtype_bytes(st.stationary_dtype) == 1 && des == 2 && dtype_is_float(st.stationary_dtype);
      float* acc = fscratch(1, N);
      uint8_t* out = bscratch(0, N * des);
      for (int64_t m = 0; m < M; ++m) {
        if (accumulate) {
          read_row(dst, static_cast<uint32_t>(m), acc);
          for (int64_t n = 0; n < N; ++n) {
            const int64_t k = sel[static_cast<size_t>(n)];
            acc[n] = acc[n] + (k >= 0 ? st.stationary(k, m) : 0.0f);
          }
          write_row(dst, static_cast<uint32_t>(m), acc);
          continue;
        }
        for (int64_t n = 0; n < N; ++n) {
          const int64_t k = sel[static_cast<size_t>(n)];
          const float x = k >= 0 ? st.stationary(k, m) : 0.0f;
          uint8_t* o = out + n * des;
          if (raw_fp8) {
            uint8_t b = 0;
            store_f32(st.stationary_dtype, &b, x);
            const uint16_t w = b;
            std::memcpy(o, &w, 2);
          } else {
            store_exact(dst.dtype, o, x);
          }
        }
        scatter_bytes(dst, static_cast<uint32_t>(m), out);
      }
      return;
    }
  }

  if (behind) {  // straight into PSUM, C = A^T B or C = C + A^T B, maybe still running on return
    async->run(st.stationary.data(), R, M, N, reinterpret_cast<float*>(dst.base),
               dst.partition_stride_bytes / static_cast<int64_t>(sizeof(float)), accumulate);
    return;
  }
  if (fp32_rows(dst)) {  // straight into PSUM: C = A^T B, or C = C + A^T B
    gemm_tn(st.stationary.data(), R, M, mv.data(), N, reinterpret_cast<float*>(dst.base),
            dst.partition_stride_bytes / static_cast<int64_t>(sizeof(float)), accumulate);
    return;
  }
  res.resize(static_cast<Eigen::Index>(M), static_cast<Eigen::Index>(N));
  gemm_tn(st.stationary.data(), R, M, mv.data(), N, res.data());  // stationary: R x M, row-major
  float* acc = fscratch(1, N);
  for (int64_t m = 0; m < M; ++m) {
    const float* r = res.data() + m * N;
    if (accumulate) {
      read_row(dst, static_cast<uint32_t>(m), acc);
      for (int64_t n = 0; n < N; ++n) acc[n] = acc[n] + r[n];
      write_row(dst, static_cast<uint32_t>(m), acc);
    } else {
      write_row(dst, static_cast<uint32_t>(m), r);
    }
  }
}

}  // namespace nsim::isa
