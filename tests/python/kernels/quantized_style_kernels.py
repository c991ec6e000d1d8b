"""Quantized / low-precision matmul kernels written in the style of aws-neuron/nki-library (new NKI dialect) and of
the quantized MLP kernels of NxDI: module-level constants, ``kernel_assert``-style checks, weights brought into SBUF
with one DMA through an explicit access pattern (``.ap``) that puts the contraction dim on the partitions, the
low-precision weight fed to the PE as it is (``nc_matmul`` takes fp8 inputs) and the dequantization scale applied to
the PSUM result as it is evicted to SBUF.

- ``fp8_weight_matmul``: per-output-channel fp8 (float8_e4m3) weight, bf16 activations; the token tile transposed on
  the PE; the [N] fp32 scale broadcast over the partitions by a stride-0 DMA and applied with ``tensor_tensor``.
- ``quantize_fp8_per_row``: dynamic per-row activation quantization (absmax on ScalarE + VectorE, scale =
  absmax / 240, q = x / scale written as float8_e4m3 by ScalarE's ``activation(scale=1/scale)``).
- ``blockwise_fp8_matmul``: a weight quantized in blocks of ``block_k`` rows along K with one fp32 scale per
  (K block, output column): each block's partial product accumulates in its own PSUM tile, is scaled on eviction and
  summed into an fp32 SBUF accumulator.
- ``int8_weight_matmul_tkg``: a decode-shaped (at most 128 tokens) int8-weight projection: the weight dequantized to
  bf16 by a cast copy, used as the stationary operand (output channels on the PSUM partitions), so the per-channel
  scale is a per-partition ``activation`` scale; the [N, M] result stored transposed into out [M, N].
- ``fp8_scaled_matmul``: both operands fp8 with a per-row scale for the left and a per-column scale for the right
  (the dynamic-quantization matmul); K consumed in chunks of 256 rows laid out [128, 2, ...] so that one
  ``perf_mode=double_row`` matmul (gen3+) replaces two plain ones; both scales applied by one
  ``scalar_tensor_tensor`` on eviction.

Written for nsim's tests from memory of those libraries' idioms; it is not a copy of any file. No nsim imports.
"""
import nki
import nki.isa as nisa
import nki.language as nl

P_MAX = 128  # partitions; the contraction tile of nc_matmul and the stationary free size
PSUM_FMAX = 512  # fp32 elements of one PSUM bank per partition = the largest moving free size (gen2/gen3)
FP8_E4M3_MAX = 240.0  # largest float8_e4m3 value the gen2/gen3 kernels quantize to
MIN_ABSMAX = 1e-6  # floor of a row's absmax, so an all-zero row gets a finite scale
DOUBLE_ROW_K = 2 * P_MAX  # contraction rows consumed by one double_row matmul


def kernel_assert(condition, message):
    """nki-library's kernel_assert: an assert whose message reaches the user."""
    if not condition:
        raise AssertionError("[quantized_matmul] " + message)


def div_ceil(n, d):
    return (n + d - 1) // d


def load_weight_k_major(w, num_k_tiles, n):
    """w [K, N] in HBM -> SBUF [128, K/128, N] with w_sb[p, k, :] = w[k * 128 + p, :] (one DMA, dtype kept)."""
    w_sb = nl.ndarray((P_MAX, num_k_tiles, n), dtype=w.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=w_sb, src=w.ap(pattern=[[n, P_MAX], [P_MAX * n, num_k_tiles], [1, n]], offset=0))
    return w_sb


def load_row_broadcast(v, n, dtype=nl.float32):
    """v [n] in HBM -> SBUF [128, n], every partition a copy (partition step 0)."""
    v_sb = nl.ndarray((P_MAX, n), dtype=dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=v_sb, src=v.ap(pattern=[[0, P_MAX], [1, n]], offset=0))
    return v_sb


def transpose_rows(x_sb, rows, num_k_tiles):
    """x_sb [rows, K] (tokens on partitions) -> xT [128 (k within tile), K/128, tokens] through PSUM."""
    xT = nl.ndarray((P_MAX, num_k_tiles, P_MAX), dtype=x_sb.dtype, buffer=nl.sbuf)
    for k in nl.affine_range(num_k_tiles):
        xT_ps = nl.ndarray((P_MAX, P_MAX), dtype=x_sb.dtype, buffer=nl.psum)
        nisa.nc_transpose(dst=xT_ps[:, :rows], data=x_sb[:rows, nl.ds(k * P_MAX, P_MAX)])
        nisa.tensor_copy(dst=xT[:, k, :rows], src=xT_ps[:, :rows])
    return xT


@nki.jit
def fp8_weight_matmul(x, w_q, w_scale):
    """x [M, K] bf16, w_q [K, N] float8_e4m3, w_scale [N] fp32 -> out [M, N] (x's dtype) = x @ (w_q * w_scale)."""
    M, K = x.shape
    kernel_assert(tuple(w_q.shape[:1]) == (K,), "w_q must be [{}, N], got {}".format(K, w_q.shape))
    N = w_q.shape[1]
    kernel_assert(K % P_MAX == 0, "K={} must be a multiple of {}".format(K, P_MAX))
    kernel_assert(tuple(w_scale.shape) == (N,), "w_scale must be [{}], got {}".format(N, w_scale.shape))
    num_k = K // P_MAX
    n_tile = min(N, PSUM_FMAX)
    out = nl.ndarray((M, N), dtype=x.dtype, buffer=nl.shared_hbm)

    w_sb = load_weight_k_major(w_q, num_k, N)  # stays fp8: the PE reads it as it is
    scale_sb = load_row_broadcast(w_scale, N)

    for m in nl.affine_range(div_ceil(M, P_MAX)):
        rows = min(P_MAX, M - m * P_MAX)
        x_sb = nl.ndarray((P_MAX, K), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=x_sb[:rows, :], src=x[nl.ds(m * P_MAX, rows), :])
        xT = transpose_rows(x_sb, rows, num_k)
        for n in nl.affine_range(div_ceil(N, n_tile)):
            cols = min(n_tile, N - n * n_tile)
            res_ps = nl.ndarray((P_MAX, n_tile), dtype=nl.float32, buffer=nl.psum)
            for k in nl.affine_range(num_k):
                nisa.nc_matmul(dst=res_ps[:rows, :cols], stationary=xT[:, k, :rows],
                               moving=w_sb[:, k, nl.ds(n * n_tile, cols)])
            # dequantize on the way out of PSUM: one scale per output column, the same on every partition
            out_sb = nl.ndarray((P_MAX, n_tile), dtype=x.dtype, buffer=nl.sbuf)
            nisa.tensor_tensor(dst=out_sb[:rows, :cols], data1=res_ps[:rows, :cols],
                               data2=scale_sb[:rows, nl.ds(n * n_tile, cols)], op=nl.multiply)
            nisa.dma_copy(dst=out[nl.ds(m * P_MAX, rows), nl.ds(n * n_tile, cols)], src=out_sb[:rows, :cols])
    return out


@nki.jit
def quantize_fp8_per_row(x):
    """x [M, H] -> (q [M, H] float8_e4m3, scales [M, 1] fp32) with q * scales ~= x; scale = absmax / 240 per row."""
    M, H = x.shape
    q = nl.ndarray((M, H), dtype=nl.float8_e4m3, buffer=nl.shared_hbm)
    scales = nl.ndarray((M, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    for t in nl.affine_range(div_ceil(M, P_MAX)):
        rows = min(P_MAX, M - t * P_MAX)
        x_sb = nl.ndarray((P_MAX, H), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=x_sb[:rows, :], src=x[nl.ds(t * P_MAX, rows), :])
        # |x| on ScalarE, its row max on VectorE
        abs_sb = nl.ndarray((P_MAX, H), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=abs_sb[:rows, :], op=nl.abs, data=x_sb[:rows, :])
        absmax = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=absmax[:rows, :], op=nl.maximum, data=abs_sb[:rows, :], axis=1, keepdims=True)
        # scale = max(absmax, MIN_ABSMAX) / FP8_E4M3_MAX; q = x * (1 / scale), cast to fp8 on the write
        scale = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=scale[:rows, :], data=absmax[:rows, :], op0=nl.maximum, operand0=MIN_ABSMAX,
                           op1=nl.multiply, operand1=1.0 / FP8_E4M3_MAX)
        inv_scale = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.reciprocal(dst=inv_scale[:rows, :], data=scale[:rows, :])
        q_sb = nl.ndarray((P_MAX, H), dtype=nl.float8_e4m3, buffer=nl.sbuf)
        nisa.activation(dst=q_sb[:rows, :], op=nl.copy, data=x_sb[:rows, :], scale=inv_scale[:rows, :])
        nisa.dma_copy(dst=q[nl.ds(t * P_MAX, rows), :], src=q_sb[:rows, :])
        nisa.dma_copy(dst=scales[nl.ds(t * P_MAX, rows), :], src=scale[:rows, :])
    return q, scales


@nki.jit
def blockwise_fp8_matmul(x, w_q, w_scale, block_k=P_MAX):
    """x [M, K] bf16, w_q [K, N] float8_e4m3, w_scale [K / block_k, N] fp32 (block_k a multiple of 128) ->
    out [M, N] (x's dtype) = sum_b x[:, block b] @ (w_q[block b, :] * w_scale[b, :])."""
    M, K = x.shape
    N = w_q.shape[1]
    kernel_assert(block_k % P_MAX == 0, "block_k={} must be a multiple of {}".format(block_k, P_MAX))
    kernel_assert(K % block_k == 0, "K={} must be a multiple of block_k={}".format(K, block_k))
    num_blocks = K // block_k
    k_per_block = block_k // P_MAX
    num_k = K // P_MAX
    kernel_assert(tuple(w_scale.shape) == (num_blocks, N),
                  "w_scale must be [{}, {}], got {}".format(num_blocks, N, w_scale.shape))
    n_tile = min(N, PSUM_FMAX)
    out = nl.ndarray((M, N), dtype=x.dtype, buffer=nl.shared_hbm)

    w_sb = load_weight_k_major(w_q, num_k, N)
    # every block's scale row on every partition: scale_sb[p, b, n] = w_scale[b, n]
    scale_sb = nl.ndarray((P_MAX, num_blocks, N), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=scale_sb, src=w_scale.ap(pattern=[[0, P_MAX], [N, num_blocks], [1, N]], offset=0))

    for m in nl.affine_range(div_ceil(M, P_MAX)):
        rows = min(P_MAX, M - m * P_MAX)
        x_sb = nl.ndarray((P_MAX, K), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=x_sb[:rows, :], src=x[nl.ds(m * P_MAX, rows), :])
        xT = transpose_rows(x_sb, rows, num_k)
        for n in nl.affine_range(div_ceil(N, n_tile)):
            cols = min(n_tile, N - n * n_tile)
            acc = nl.ndarray((P_MAX, n_tile), dtype=nl.float32, buffer=nl.sbuf)
            nisa.memset(dst=acc[:rows, :cols], value=0.0)
            for b in nl.sequential_range(num_blocks):
                # one accumulation group per block: a fresh PSUM tile, the block's K tiles summed in it
                blk_ps = nl.ndarray((P_MAX, n_tile), dtype=nl.float32, buffer=nl.psum)
                for kk in nl.affine_range(k_per_block):
                    nisa.nc_matmul(dst=blk_ps[:rows, :cols], stationary=xT[:, b * k_per_block + kk, :rows],
                                   moving=w_sb[:, b * k_per_block + kk, nl.ds(n * n_tile, cols)])
                blk_sb = nl.ndarray((P_MAX, n_tile), dtype=nl.float32, buffer=nl.sbuf)
                nisa.tensor_tensor(dst=blk_sb[:rows, :cols], data1=blk_ps[:rows, :cols],
                                   data2=scale_sb[:rows, b, nl.ds(n * n_tile, cols)], op=nl.multiply)
                nisa.tensor_tensor(dst=acc[:rows, :cols], data1=acc[:rows, :cols], data2=blk_sb[:rows, :cols],
                                   op=nl.add)
            out_sb = nl.ndarray((P_MAX, n_tile), dtype=x.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=out_sb[:rows, :cols], src=acc[:rows, :cols])
            nisa.dma_copy(dst=out[nl.ds(m * P_MAX, rows), nl.ds(n * n_tile, cols)], src=out_sb[:rows, :cols])
    return out


@nki.jit
def int8_weight_matmul_tkg(x, w_i8, w_scale):
    """Decode projection: x [M <= 128, K] bf16, w_i8 [K, N] int8, w_scale [N] fp32 -> out [M, N] (x's dtype) =
    x @ (w_i8 * w_scale). Output channels go on the PSUM partitions, so the scale is per partition."""
    M, K = x.shape
    N = w_i8.shape[1]
    kernel_assert(M <= P_MAX, "token generation takes at most {} tokens, got {}".format(P_MAX, M))
    kernel_assert(K % P_MAX == 0, "K={} must be a multiple of {}".format(K, P_MAX))
    num_k = K // P_MAX
    out = nl.ndarray((M, N), dtype=x.dtype, buffer=nl.shared_hbm)

    # x transposed by the DMA's access pattern: xT[p, k, m] = x[m, k * 128 + p]
    xT = nl.ndarray((P_MAX, num_k, M), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=xT, src=x.ap(pattern=[[1, P_MAX], [P_MAX, num_k], [K, M]], offset=0))
    # dequantize: int8 -> bf16 is exact (|w| <= 128); the scale comes after the matmul
    w_i8_sb = load_weight_k_major(w_i8, num_k, N)
    w_sb = nl.ndarray((P_MAX, num_k, N), dtype=nl.bfloat16, buffer=nl.sbuf)
    nisa.tensor_copy(dst=w_sb, src=w_i8_sb)

    for n in nl.affine_range(div_ceil(N, P_MAX)):
        cols = min(P_MAX, N - n * P_MAX)
        scale_sb = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=scale_sb[:cols, :], src=w_scale[nl.ds(n * P_MAX, cols)])
        resT_ps = nl.ndarray((P_MAX, M), dtype=nl.float32, buffer=nl.psum)
        for k in nl.affine_range(num_k):
            nisa.nc_matmul(dst=resT_ps[:cols, :], stationary=w_sb[:, k, nl.ds(n * P_MAX, cols)], moving=xT[:, k, :])
        resT_sb = nl.ndarray((P_MAX, M), dtype=x.dtype, buffer=nl.sbuf)
        nisa.activation(dst=resT_sb[:cols, :], op=nl.copy, data=resT_ps[:cols, :], scale=scale_sb[:cols, :])
        # out[m, n * 128 + c] = resT[c, m]
        nisa.dma_copy(dst=out.ap(pattern=[[1, cols], [N, M]], offset=n * P_MAX), src=resT_sb[:cols, :])
    return out


@nki.jit
def fp8_scaled_matmul(lhsT_q, rhs_q, lhs_scale, rhs_scale, double_row=False):
    """lhsT_q [K, M] and rhs_q [K, N] float8_e4m3, lhs_scale [M, 1] and rhs_scale [N] fp32 -> out [M, N] bf16 =
    (lhsT_q.T * lhs_scale) @ (rhs_q * rhs_scale). K is consumed in chunks of 256 rows, row c * 256 + 2 * p + r
    at [p, c, r] in SBUF; ``double_row`` contracts a whole chunk per matmul (gen3+), else two matmuls of 128."""
    K, M = lhsT_q.shape
    N = rhs_q.shape[1]
    kernel_assert(K % DOUBLE_ROW_K == 0, "K={} must be a multiple of {}".format(K, DOUBLE_ROW_K))
    num_c = K // DOUBLE_ROW_K
    n_tile = min(N, PSUM_FMAX)
    out = nl.ndarray((M, N), dtype=nl.bfloat16, buffer=nl.shared_hbm)

    lhs_sb = nl.ndarray((P_MAX, num_c, 2, M), dtype=lhsT_q.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=lhs_sb, src=lhsT_q.ap(pattern=[[2 * M, P_MAX], [DOUBLE_ROW_K * M, num_c], [M, 2], [1, M]],
                                             offset=0))
    rhs_sb = nl.ndarray((P_MAX, num_c, 2, N), dtype=rhs_q.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=rhs_sb, src=rhs_q.ap(pattern=[[2 * N, P_MAX], [DOUBLE_ROW_K * N, num_c], [N, 2], [1, N]],
                                            offset=0))
    rhs_scale_sb = load_row_broadcast(rhs_scale, N)

    for m in nl.affine_range(div_ceil(M, P_MAX)):
        rows = min(P_MAX, M - m * P_MAX)
        lhs_scale_sb = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=lhs_scale_sb[:rows, :], src=lhs_scale[nl.ds(m * P_MAX, rows), :])
        for n in nl.affine_range(div_ceil(N, n_tile)):
            cols = min(n_tile, N - n * n_tile)
            res_ps = nl.ndarray((P_MAX, n_tile), dtype=nl.float32, buffer=nl.psum)
            for c in nl.affine_range(num_c):
                if double_row:
                    nisa.nc_matmul(dst=res_ps[:rows, :cols], stationary=lhs_sb[:, c, :, nl.ds(m * P_MAX, rows)],
                                   moving=rhs_sb[:, c, :, nl.ds(n * n_tile, cols)],
                                   perf_mode=nisa.matmul_perf_mode.double_row)
                else:
                    for r in nl.affine_range(2):
                        nisa.nc_matmul(dst=res_ps[:rows, :cols], stationary=lhs_sb[:, c, r, nl.ds(m * P_MAX, rows)],
                                       moving=rhs_sb[:, c, r, nl.ds(n * n_tile, cols)])
            # out = (res * lhs_scale[row]) * rhs_scale[col], one VectorE instruction on the way out of PSUM
            out_sb = nl.ndarray((P_MAX, n_tile), dtype=nl.bfloat16, buffer=nl.sbuf)
            nisa.scalar_tensor_tensor(dst=out_sb[:rows, :cols], data=res_ps[:rows, :cols], op0=nl.multiply,
                                      operand0=lhs_scale_sb[:rows, :], op1=nl.multiply,
                                      operand1=rhs_scale_sb[:rows, nl.ds(n * n_tile, cols)])
            nisa.dma_copy(dst=out[nl.ds(m * P_MAX, rows), nl.ds(n * n_tile, cols)], src=out_sb[:rows, :cols])
    return out
