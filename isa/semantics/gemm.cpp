// The multiply_moving matrix product: see gemm.h. (Compiled with -ffp-contract=off: a fused
// multiply-add would change the bits and differ between machines.)
#include "isa/semantics/gemm.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <limits>
#include <mutex>
#include <type_traits>
#include <utility>
#include <vector>

#include "isa/semantics/parallel.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define NSIM_GEMM_AVX2 1
#endif

namespace nsim::isa::sem {

void gemm_tn_portable(const float* a, int64_t k, int64_t m, const float* b, int64_t n, float* c, int64_t ldc,
                      bool accumulate) {
  thread_local std::vector<float> sum;  // (kept: no allocation per call)
  sum.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < m; ++i) {
    std::fill(sum.begin(), sum.end(), 0.0f);
    for (int64_t p = 0; p < k; ++p) {
      const float x = a[p * m + i];  // A(p, i)
      const float* brow = b + p * n;
      for (int64_t j = 0; j < n; ++j) sum[static_cast<size_t>(j)] = sum[static_cast<size_t>(j)] + x * brow[j];
    }
    float* row = c + i * ldc;
    for (int64_t j = 0; j < n; ++j) row[j] = accumulate ? row[j] + sum[static_cast<size_t>(j)] : sum[static_cast<size_t>(j)];
  }
}

void gemm_tn_portable(const float* a, int64_t k, int64_t m, const float* b, int64_t n, float* c) {
  gemm_tn_portable(a, k, m, b, n, c, n, false);
}

namespace {
struct Range {
  uint32_t low = 0;            // OR of the 12 low significand bits of every value
  uint32_t max = 0;            // the largest |x| as bits (>= 0x7F800000: an Inf or a NaN)
  uint32_t min1 = 0xFFFFFFFFu; // the smallest nonzero |x| as bits, minus 1 (0xFFFFFFFF: all zero)
};

// |x| - 1 as bits wraps a zero to 0xFFFFFFFF, so the least of them is the least nonzero |x|, less one.
// (Inlined into each target below, where the loop vectorizes for that target.)
inline __attribute__((always_inline)) Range range_body(const float* x, int64_t n) {
  Range r;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, x + i, sizeof u);
    const uint32_t e = u & 0x7FFFFFFFu;
    r.low |= u;
    r.max = std::max(r.max, e);
    r.min1 = std::min(r.min1, e - 1u);
  }
  r.low &= 0xFFFu;
  return r;
}

Range range_portable(const float* x, int64_t n) { return range_body(x, n); }
#ifdef NSIM_GEMM_AVX2
__attribute__((target("avx2"))) Range range_avx2(const float* x, int64_t n) { return range_body(x, n); }
#endif

Range range_of(const float* x, int64_t n) {
#ifdef NSIM_GEMM_AVX2
  if (gemm_tn_vectorized()) return range_avx2(x, n);
#endif
  return range_portable(x, n);
}

float as_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
}  // namespace

namespace {
bool products_exact(const Range& ra, const Range& rb) {
  if ((ra.low | rb.low) != 0) return false;             // a value with more than 12 significant bits
  if (ra.max >= 0x7F800000u || rb.max >= 0x7F800000u) return false;  // Inf or NaN
  if (ra.min1 == 0xFFFFFFFFu || rb.min1 == 0xFFFFFFFFu) return true;  // one side all zeros: products are +-0
  // <= 12 + 12 significant bits fit fp32's 24; the exponent must stay in the normal range (in double,
  // where these products are exact)
  const double hi = static_cast<double>(as_float(ra.max)) * as_float(rb.max);
  const double lo = static_cast<double>(as_float(ra.min1 + 1)) * as_float(rb.min1 + 1);
  return hi < 0x1p127 && lo >= 0x1p-126;
}
}  // namespace

bool gemm_products_exact(const float* a, int64_t na, const float* b, int64_t nb) {
  return products_exact(range_of(a, na), range_of(b, nb));
}

#ifdef NSIM_GEMM_AVX2
namespace {

// The vector kernels compute R rows of C x 2 vectors of columns, accumulated in registers over all k
// in k order, as the portable loop does. Their B operand is a column block of B copied to a contiguous
// k x 2-vector buffer first: read in place, its rows lie n floats apart, and at n = 512 (2 KB) the k rows
// of a block fall into a few L1 sets and evict each other.
//
// Fused (Fma = true) only for inputs whose products are all exact in fp32 (gemm_products_exact): then
// round(acc + round(a * b)) == round(acc + a * b), so a fused multiply-add gives the same bits as the
// separate multiply and add, at twice the rate.
//
// The accumulators are two arrays with every loop over them unrolled: GCC 12 kept a single `acc[R][2]`
// array in memory and stored 10 of its 12 registers to the stack on every k step, which held the AVX2
// kernel to ~40 % of the FMA rate (BM_NumericsMatmul 617 -> 300 us on a Zen 3 without AVX-512).
template <int R, bool Fma>
__attribute__((target("avx2,fma"))) void block16(const float* ap, int64_t k, const float* bp, float* c, int64_t ldc,
                                                 bool accumulate, int64_t i0, int64_t j0) {
  __m256 lo[R], hi[R];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) lo[r] = hi[r] = _mm256_setzero_ps();
  for (int64_t p = 0; p < k; ++p) {
    const __m256 b0 = _mm256_loadu_ps(bp + p * 16);
    const __m256 b1 = _mm256_loadu_ps(bp + p * 16 + 8);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m256 x = _mm256_broadcast_ss(ap + p * R + r);
      if constexpr (Fma) {
        lo[r] = _mm256_fmadd_ps(x, b0, lo[r]);
        hi[r] = _mm256_fmadd_ps(x, b1, hi[r]);
      } else {
        lo[r] = _mm256_add_ps(lo[r], _mm256_mul_ps(x, b0));
        hi[r] = _mm256_add_ps(hi[r], _mm256_mul_ps(x, b1));
      }
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    float* out = c + (i0 + r) * ldc + j0;
    if (accumulate) {  // c + sum (the sum complete first, as the portable loop)
      lo[r] = _mm256_add_ps(_mm256_loadu_ps(out), lo[r]);
      hi[r] = _mm256_add_ps(_mm256_loadu_ps(out + 8), hi[r]);
    }
    _mm256_storeu_ps(out, lo[r]);
    _mm256_storeu_ps(out + 8, hi[r]);
  }
}

template <int R, bool Fma>
__attribute__((target("avx512f"))) void block32(const float* ap, int64_t k, const float* bp, float* c, int64_t ldc,
                                                bool accumulate, int64_t i0, int64_t j0) {
  __m512 lo[R], hi[R];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) lo[r] = hi[r] = _mm512_setzero_ps();
  for (int64_t p = 0; p < k; ++p) {
    const __m512 b0 = _mm512_loadu_ps(bp + p * 32);
    const __m512 b1 = _mm512_loadu_ps(bp + p * 32 + 16);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512 x = _mm512_set1_ps(ap[p * R + r]);
      if constexpr (Fma) {
        lo[r] = _mm512_fmadd_ps(x, b0, lo[r]);
        hi[r] = _mm512_fmadd_ps(x, b1, hi[r]);
      } else {
        lo[r] = _mm512_add_ps(lo[r], _mm512_mul_ps(x, b0));
        hi[r] = _mm512_add_ps(hi[r], _mm512_mul_ps(x, b1));
      }
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    float* out = c + (i0 + r) * ldc + j0;
    if (accumulate) {
      lo[r] = _mm512_add_ps(_mm512_loadu_ps(out), lo[r]);
      hi[r] = _mm512_add_ps(_mm512_loadu_ps(out + 16), hi[r]);
    }
    _mm512_storeu_ps(out, lo[r]);
    _mm512_storeu_ps(out + 16, hi[r]);
  }
}

// One row of C, columns [j0, n) (fewer than one block), 8 at a time then one by one (unfused: these are
// few).
__attribute__((target("avx2"))) void row_tail(const float* a, int64_t k, int64_t m, const float* b, int64_t n,
                                               float* c, int64_t ldc, bool accumulate, int64_t i, int64_t j0) {
  int64_t j = j0;
  float* out = c + i * ldc;
  for (; j + 8 <= n; j += 8) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t p = 0; p < k; ++p)
      acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_broadcast_ss(a + p * m + i), _mm256_loadu_ps(b + p * n + j)));
    if (accumulate) acc = _mm256_add_ps(_mm256_loadu_ps(out + j), acc);
    _mm256_storeu_ps(out + j, acc);
  }
  for (; j < n; ++j) {
    float acc = 0.0f;
    for (int64_t p = 0; p < k; ++p) acc = acc + a[p * m + i] * b[p * n + j];
    out[j] = accumulate ? out[j] + acc : acc;
  }
}

// Columns of B [j0, j0 + W) into a contiguous k x W buffer.
template <int W>
const float* pack_b(const float* b, int64_t k, int64_t n, int64_t j0) {
  thread_local std::vector<float> buf;
  buf.resize(static_cast<size_t>(k * W));
  for (int64_t p = 0; p < k; ++p) std::memcpy(buf.data() + p * W, b + p * n + j0, W * sizeof(float));
  return buf.data();
}

// B's whole blocks of W columns, each packed as pack_b does, one after the other: block j / W at j * k.
template <int W>
void pack_blocks(const float* b, int64_t k, int64_t n, std::vector<float>& out) {
  const int64_t nw = n / W * W;
  out.resize(static_cast<size_t>(k * nw));
  for (int64_t j = 0; j < nw; j += W)
    for (int64_t p = 0; p < k; ++p) std::memcpy(out.data() + j * k + p * W, b + p * n + j, W * sizeof(float));
}

// A's columns in the blocks the kernels take them (R columns from column i, for rows i.. of C: R = Big
// while they last, then 4, then 1), each interleaved as ap[i * k + p * R + r] = A(p, i + r): the R values
// a step of the kernel broadcasts lie together.
template <int Big>
const float* pack_a(const float* a, int64_t k, int64_t m, std::vector<float>& buf) {
  buf.resize(static_cast<size_t>(k * m));
  // Block by block (each written in order), its R-column piece of every row of A (R a constant: one fixed-size
  // copy each). (Row by row of A instead, each row's pieces written k R floats apart, 4 KB at k = 128: BM_NumericsMatmul
  // 273 GFLOP/s against 280. Not packing at all, the kernels reading A in place m floats apart per step: 251.)
  const int64_t big = m / Big * Big, four = big + (m - big) / 4 * 4;
  float* out = buf.data();
  int64_t i = 0;
  for (; i < big; i += Big)
    for (int64_t p = 0; p < k; ++p, out += Big) std::memcpy(out, a + p * m + i, Big * sizeof(float));
  for (; i < four; i += 4)
    for (int64_t p = 0; p < k; ++p, out += 4) std::memcpy(out, a + p * m + i, 4 * sizeof(float));
  for (; i < m; ++i)
    for (int64_t p = 0; p < k; ++p) *out++ = a[p * m + i];
  return buf.data();
}
template <int Big>
const float* pack_a(const float* a, int64_t k, int64_t m) {
  thread_local std::vector<float> buf;
  return pack_a<Big>(a, k, m, buf);
}

// Products of at least this many multiply-adds are shared between host threads by column blocks
// (sem::parallel_for): below it, waking a helper costs about what it saves. Each block's columns are
// computed the same way by whichever thread takes it.
constexpr int64_t kParallelMacs = int64_t{1} << 21;

// The two kernels' shapes: W columns per block (two vectors), Big rows per block (the most accumulators
// the registers hold), and the R x W block.
struct Avx2Kernel {
  static constexpr int W = 16, Big = 6;  // 12 accumulators, of 16 registers
  template <int R, bool Fma>
  static void block(const float* ap, int64_t k, const float* bp, float* c, int64_t ldc, bool acc, int64_t i, int64_t j) {
    block16<R, Fma>(ap, k, bp, c, ldc, acc, i, j);
  }
};
struct Avx512Kernel {
  static constexpr int W = 32, Big = 8;  // 16 accumulators
  template <int R, bool Fma>
  static void block(const float* ap, int64_t k, const float* bp, float* c, int64_t ldc, bool acc, int64_t i, int64_t j) {
    block32<R, Fma>(ap, k, bp, c, ldc, acc, i, j);
  }
};

// Column blocks [b0, b1) of W columns (the packed block stays in L1 for every row block), rows Big at a
// time, then 4, then 1 (the blocks pack_a laid out in ap). (No target attribute of its own: the blocks
// carry theirs.)
// With Packed, b holds B's whole blocks already packed, one after the other (pack_blocks).
template <class Kernel, bool Fma, bool Packed = false>
void column_blocks(const float* ap, int64_t k, int64_t m, const float* b, int64_t n, float* c, int64_t ldc,
                   bool accumulate, int64_t b0, int64_t b1) {
  constexpr int W = Kernel::W, Big = Kernel::Big;
  for (int64_t j = b0 * W; j < b1 * W; j += W) {
    const float* bp = Packed ? b + j * k : pack_b<W>(b, k, n, j);
    int64_t i = 0;
    for (; i + Big <= m; i += Big) Kernel::template block<Big, Fma>(ap + i * k, k, bp, c, ldc, accumulate, i, j);
    for (; i + 4 <= m; i += 4) Kernel::template block<4, Fma>(ap + i * k, k, bp, c, ldc, accumulate, i, j);
    for (; i < m; ++i) Kernel::template block<1, Fma>(ap + i * k, k, bp, c, ldc, accumulate, i, j);
  }
}

// The whole blocks shared between host threads, then the columns past the last whole block.
template <class Kernel, bool Fma>
void gemm_vector(const float* a, int64_t k, int64_t m, const float* b, int64_t n, float* c, int64_t ldc,
                 bool accumulate) {
  constexpr int W = Kernel::W;
  const int64_t nw = n / W * W;
  const float* ap = nw > 0 ? pack_a<Kernel::Big>(a, k, m) : nullptr;
  parallel_for(nw / W, 1, k * m * n >= kParallelMacs, [&](int64_t b0, int64_t b1) {
    column_blocks<Kernel, Fma>(ap, k, m, b, n, c, ldc, accumulate, b0, b1);
  });
  if (nw < n)
    for (int64_t i = 0; i < m; ++i) row_tail(a, k, m, b, n, c, ldc, accumulate, i, nw);
}

bool has_fma() {
  static const bool ok = __builtin_cpu_supports("fma");
  return ok;
}

bool has_avx512() {
  static const bool ok = __builtin_cpu_supports("avx512f");
  return ok;
}

}  // namespace
#endif

bool gemm_tn_vectorized() {
#ifdef NSIM_GEMM_AVX2
  static const bool avx2 = __builtin_cpu_supports("avx2");
  return avx2;
#else
  return false;
#endif
}

void gemm_tn(const float* a, int64_t k, int64_t m, const float* b, int64_t n, float* c, int64_t ldc, bool accumulate) {
#ifdef NSIM_GEMM_AVX2
  if (gemm_tn_vectorized()) {
    const bool fused = has_fma() && gemm_products_exact(a, k * m, b, k * n);
    if (has_avx512())
      fused ? gemm_vector<Avx512Kernel, true>(a, k, m, b, n, c, ldc, accumulate)
            : gemm_vector<Avx512Kernel, false>(a, k, m, b, n, c, ldc, accumulate);
    else
      fused ? gemm_vector<Avx2Kernel, true>(a, k, m, b, n, c, ldc, accumulate)
            : gemm_vector<Avx2Kernel, false>(a, k, m, b, n, c, ldc, accumulate);
    return;
  }
#endif
  gemm_tn_portable(a, k, m, b, n, c, ldc, accumulate);
}

void gemm_tn(const float* a, int64_t k, int64_t m, const float* b, int64_t n, float* c) {
  gemm_tn(a, k, m, b, n, c, n, false);
}

// ---------------------------------------------------------------- AsyncGemm

struct AsyncGemm::Impl {
  // A moving view's values as fp32 (k x n, row-major) and their Range (for the fused kernels).
  struct Moving {
    TileView view;
    std::vector<float> values;
    std::vector<float> packed;  // values' whole blocks of `packed_w` columns (pack_blocks); 0: not yet
    int packed_w = 0;
    Range range;
    bool valid = false;
    uint64_t used = 0;  // last use (least recently used is replaced)
  };
  std::array<Moving, kKeptMoving> mov;
  int kept = 0;          // entries valid (forget() on every written operand: nothing to do while 0)
  int next_mov = -1;     // moving() of the next run
  int pending_mov = -1;  // read by the pending product
  uint64_t clock = 0;
  // Packed A: the pending product's (slot `cur`) and the next one's.
  std::vector<float> a[2];
  int cur = 0;
  SharedJob job;
  // The product started last (read by the threads running it).
  std::atomic<int64_t> next{0};
  int64_t blocks = 0, k = 0, m = 0, n = 0, ldc = 0;
  const float* ap = nullptr;
  const float* bp = nullptr;
  float* c = nullptr;
  bool accumulate = false;
  void (*body)(const Impl&, int64_t, int64_t) = nullptr;
  TileView out;  // C as a view, while the job is started

  static void run_blocks(void* ctx) {
    Impl& j = *static_cast<Impl*>(ctx);
    for (int64_t r; (r = j.next.fetch_add(1, std::memory_order_relaxed)) < j.blocks;) j.body(j, r, r + 1);
  }
#ifdef NSIM_GEMM_AVX2
  template <class Kernel, bool Fma>
  static void blocks_of(const Impl& j, int64_t b0, int64_t b1) {
    column_blocks<Kernel, Fma, true>(j.ap, j.k, j.m, j.bp, j.n, j.c, j.ldc, j.accumulate, b0, b1);
  }
  template <class Kernel>
  void start(const float* a_in, Moving& b_in, int64_t k_in, int64_t m_in, int64_t n_in, float* c_in,
             int64_t ldc_in, bool acc, bool fused) {
    constexpr int W = Kernel::W;
    const int64_t nw = n_in / W * W;
    const float* packed = nw > 0 ? pack_a<Kernel::Big>(a_in, k_in, m_in, a[cur ^ 1]) : nullptr;
    if (b_in.packed_w != W) {  // (never the pending product's B: that one is packed)
      pack_blocks<W>(b_in.values.data(), k_in, n_in, b_in.packed);
      b_in.packed_w = W;
    }
    wait();  // the pending product reads this struct and its buffers until now
    cur ^= 1;
    pending_mov = next_mov;
    ap = packed, bp = b_in.packed.data(), c = c_in;
    k = k_in, m = m_in, n = n_in, ldc = ldc_in, accumulate = acc;
    body = fused ? &blocks_of<Kernel, true> : &blocks_of<Kernel, false>;
    if (nw < n)  // the columns past the last whole block, here and now
      for (int64_t i = 0; i < m; ++i) row_tail(a_in, k, m, b_in.values.data(), n, c, ldc, accumulate, i, nw);
    blocks = nw / W;
    next.store(0, std::memory_order_relaxed);
    if (blocks >= 2 && k * m * n >= kParallelMacs && job.start(&run_blocks, this)) {
      out = TileView{};
      out.base = reinterpret_cast<uint8_t*>(c);
      out.dtype = DType::kFloat32;
      out.partitions = static_cast<uint32_t>(m);
      out.partition_stride_bytes = ldc * static_cast<int64_t>(sizeof(float));
      out.nfree = 1;
      out.size[0] = n;
      out.stride[0] = 1;
      return;
    }
    run_blocks(this);  // on this thread alone, as gemm_tn's parallel_for would
  }
#endif
  void wait() {
    job.finish();
    pending_mov = -1;
  }
};

namespace {
// The buffers of a finished AsyncGemm (its moving views' values and packed blocks, the packed A), kept for the next
// one: a run's are up to a few megabytes, and fresh ones each run were faulted in and zeroed again (~1,700 page
// faults and 5 ms of system time per numerics run of the library's flash attention at S=2048). One set is kept
// (a simulator owns one AsyncGemm; runs on several host threads at once keep the first set returned).
struct Spare {
  std::array<std::vector<float>, AsyncGemm::kKeptMoving> values, packed;
  std::array<std::vector<float>, 2> a;
};
std::mutex g_spare_mu;
Spare* g_spare = nullptr;  // (never freed at exit: an AsyncGemm may be destroyed during static destruction)
}  // namespace

AsyncGemm::AsyncGemm() : impl_(std::make_unique<Impl>()) {
  std::lock_guard<std::mutex> lock(g_spare_mu);
  if (!g_spare) return;
  for (size_t i = 0; i < kKeptMoving; ++i) {
    impl_->mov[i].values = std::move(g_spare->values[i]);
    impl_->mov[i].packed = std::move(g_spare->packed[i]);
  }
  for (size_t i = 0; i < 2; ++i) impl_->a[i] = std::move(g_spare->a[i]);
  delete std::exchange(g_spare, nullptr);
}

AsyncGemm::~AsyncGemm() {
  impl_->wait();
  std::lock_guard<std::mutex> lock(g_spare_mu);
  if (g_spare) return;
  try {
    auto* sp = new Spare;
    for (size_t i = 0; i < kKeptMoving; ++i) {
      sp->values[i] = std::move(impl_->mov[i].values);
      sp->packed[i] = std::move(impl_->mov[i].packed);
    }
    for (size_t i = 0; i < 2; ++i) sp->a[i] = std::move(impl_->a[i]);
    g_spare = sp;
  } catch (...) {  // (no memory for the struct: the buffers go)
  }
}

float* AsyncGemm::moving(const TileView& mov, int64_t elems, bool& converted) {
  Impl& j = *impl_;
  int pick = -1;
  for (int i = 0; i < kKeptMoving; ++i) {
    Impl::Moving& e = j.mov[static_cast<size_t>(i)];
    if (e.valid && e.view.same_as(mov) && static_cast<int64_t>(e.values.size()) == elems) {
      pick = i;
      break;
    }
  }
  converted = pick >= 0;
  if (pick < 0) {  // the least recently used entry the pending product does not read
    for (int i = 0; i < kKeptMoving; ++i) {
      if (i == j.pending_mov) continue;
      if (pick < 0 || j.mov[static_cast<size_t>(i)].used < j.mov[static_cast<size_t>(pick)].used) pick = i;
    }
    Impl::Moving& e = j.mov[static_cast<size_t>(pick)];
    e.view = mov;
    e.values.resize(static_cast<size_t>(elems));
    e.packed_w = 0;
    j.kept -= e.valid;
    e.valid = false;  // until run() (which sets its range)
  }
  Impl::Moving& e = j.mov[static_cast<size_t>(pick)];
  e.used = ++j.clock;
  j.next_mov = pick;
  return e.values.data();
}

void AsyncGemm::run(const float* a, int64_t k, int64_t m, int64_t n, float* c, int64_t ldc, bool accumulate) {
  Impl& j = *impl_;
  Impl::Moving& mv = j.mov[static_cast<size_t>(j.next_mov)];
  const float* b = mv.values.data();
  if (!mv.valid) {
    mv.range = range_of(b, k * n);
    mv.valid = true;
    ++j.kept;
  }
#ifdef NSIM_GEMM_AVX2
  if (gemm_tn_vectorized()) {
    const bool fused = has_fma() && products_exact(range_of(a, k * m), mv.range);  // (before waiting)
    if (has_avx512()) j.start<Avx512Kernel>(a, mv, k, m, n, c, ldc, accumulate, fused);
    else j.start<Avx2Kernel>(a, mv, k, m, n, c, ldc, accumulate, fused);
    return;
  }
#endif
  j.wait();
  gemm_tn_portable(a, k, m, b, n, c, ldc, accumulate);
}

void AsyncGemm::wait() { impl_->wait(); }

bool AsyncGemm::pending() const { return impl_->job.started(); }

bool AsyncGemm::writes(const TileView& v) const { return impl_->job.started() && may_overlap(impl_->out, v); }

void AsyncGemm::forget(const TileView& v) {
  Impl& j = *impl_;
  if (j.kept == 0) return;
  for (Impl::Moving& e : j.mov)
    if (e.valid && may_overlap(e.view, v)) {
      e.valid = false;
      --j.kept;
    }
}

void AsyncGemm::forget_all() {
  Impl& j = *impl_;
  if (j.kept == 0) return;
  for (Impl::Moving& e : j.mov) e.valid = false;
  j.kept = 0;
}

}  // namespace nsim::isa::sem
