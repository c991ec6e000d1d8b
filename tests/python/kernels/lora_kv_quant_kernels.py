"""Multi-LoRA serving and quantized KV-cache decode kernels written the way the punica / vLLM ports to Trainium
write them (new NKI dialect): module-level constants, ``kernel_assert`` checks, runtime adapter indices read from
an int32 HBM tensor and used as DMA offsets (``.ap(vector_offset=...)`` gathers one adapter row per token), stride-0
``.ap`` views to broadcast along a free dim, PSUM accumulation groups shared by several matmuls.

- ``bgmv_lora``: punica's BGMV for a batch of decode tokens, each with its own adapter ``indices[b]``: the token's
  LoRA A ``[r, H]`` and B ``[O, r]`` gathered into its partition by one indirect DMA each, shrink
  ``v = x A^T`` and expand ``y = y_in + scale * v B^T`` as per-partition multiply + reduce on the VectorE.
- ``bgmv_lora_pe``: the per-token PE form: each token's A^T and B^T read transposed from HBM by
  ``.ap(pattern, scalar_offset=idx[0:1, b:b+1], indirect_dim=0)`` and ``lora_b.select(0, idx[0:1, b:b+1]).T``,
  shrink and expand as matmuls.
- ``base_projection``: ``y = x W`` (W ``[H, O]``, x ``[T, H]`` with T <= 128 tokens), the token tile transposed on
  the PE.
- ``multi_lora_delta``: the separate LoRA kernel a two-kernel pipeline runs after ``base_projection``:
  ``y = y_base + scale * sum_l onehot(idx == l) (x A_l^T) B_l^T`` with every adapter's A and B stacked along the
  rank (``L * r <= 128``) so that one shrink and one expand matmul serve all adapters; an index < 0 (vLLM's
  "no LoRA") selects none.
- ``fused_lora_projection``: the same sum computed in one kernel, the stacked expand matmul accumulated into the
  base projection's PSUM tile before its single eviction.
- ``fp8_kv_decode_attention``: GQA decode attention over a KV cache stored as float8_e4m3 (K cache transposed,
  ``[B, Hkv, D, S]``, V ``[B, Hkv, S, D]``) with a per-KV-head dequantization scale: the K scale folded into the
  scores' activation scale, the V scale into the output's normalization; online softmax over key blocks (running
  max / sum, output rescaled per block). The fp8 cache goes to the PE as it is (bf16 x fp8 matmuls). Works for a
  bf16 cache too (scales 1), for comparing the bytes moved.

Written for nsim's tests from memory of those projects' idioms; not a copy of any file. No nsim imports.
"""
import math

import nki
import nki.isa as nisa
import nki.language as nl

P_MAX = 128
PSUM_FMAX = 512  # fp32 elements of one PSUM bank per partition
EXPAND_CHUNK = 512  # output columns per expand step of bgmv_lora
SHRINK_CHUNK = 4  # rank columns per shrink step of bgmv_lora
NEG_INF = -30000.0  # initial running max (finite: exp(NEG_INF - m) underflows to 0)


def kernel_assert(condition, message):
    if not condition:
        raise AssertionError("[lora_kv_quant] " + message)


def div_ceil(n, d):
    return (n + d - 1) // d


# --------------------------------------------------------------------------------------------------
# 1. punica BGMV (decode): one adapter per token, gathered by an indirect DMA
# --------------------------------------------------------------------------------------------------

@nki.jit
def bgmv_lora(x, y_in, lora_a, lora_b, indices, scale):
    """x [B, H], y_in [B, O], lora_a [L, r, H], lora_b [L, O, r] (one dtype), indices [B] int32 in [0, L)
    -> y [B, O] (y_in's dtype) = y_in + scale * (x A[idx]^T) B[idx]^T, per token."""
    B, H = x.shape
    L, r, _ = lora_a.shape
    O = lora_b.shape[1]
    kernel_assert(B <= P_MAX, "batch {} > {}".format(B, P_MAX))
    kernel_assert(tuple(lora_a.shape) == (L, r, H) and tuple(lora_b.shape) == (L, O, r), "adapter shapes")
    kernel_assert(r % SHRINK_CHUNK == 0 and O % EXPAND_CHUNK == 0, "rank / output size not tileable")
    out = nl.ndarray((B, O), dtype=y_in.dtype, buffer=nl.shared_hbm)

    idx = nl.ndarray((B, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=idx, src=indices.reshape((B, 1)))
    x_sb = nl.ndarray((B, H), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=x_sb, src=x)

    # gather: partition b <- lora_a[idx[b]] (r * H elements) and lora_b[idx[b]] (O * r elements)
    a_sb = nl.ndarray((B, r, H), dtype=lora_a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=a_sb, src=lora_a.ap(pattern=[[r * H, B], [1, r * H]], vector_offset=idx, indirect_dim=0))
    b_sb = nl.ndarray((B, O, r), dtype=lora_b.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=b_sb, src=lora_b.ap(pattern=[[O * r, B], [1, O * r]], vector_offset=idx, indirect_dim=0))

    # shrink: v[b, j] = sum_h x[b, h] * A[b, j, h], SHRINK_CHUNK rank rows per multiply (x repeated by stride 0)
    v = nl.ndarray((B, r), dtype=nl.float32, buffer=nl.sbuf)
    for j in nl.affine_range(r // SHRINK_CHUNK):
        prod = nl.ndarray((B, SHRINK_CHUNK, H), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=prod, data1=x_sb.ap(pattern=[[H, B], [0, SHRINK_CHUNK], [1, H]]),
                           data2=a_sb[:, nl.ds(j * SHRINK_CHUNK, SHRINK_CHUNK), :], op=nl.multiply)
        nisa.tensor_reduce(dst=v[:, nl.ds(j * SHRINK_CHUNK, SHRINK_CHUNK)], op=nl.add, data=prod, axis=2)

    # expand: y[b, o] = y_in[b, o] + scale * sum_j v[b, j] * B[b, o, j]
    for c in nl.affine_range(O // EXPAND_CHUNK):
        cols = nl.ds(c * EXPAND_CHUNK, EXPAND_CHUNK)
        prod = nl.ndarray((B, EXPAND_CHUNK, r), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=prod, data1=v.ap(pattern=[[r, B], [0, EXPAND_CHUNK], [1, r]]),
                           data2=b_sb[:, cols, :], op=nl.multiply)
        delta = nl.ndarray((B, EXPAND_CHUNK), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=delta, op=nl.add, data=prod, axis=2)
        y_sb = nl.ndarray((B, EXPAND_CHUNK), dtype=y_in.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=y_sb, src=y_in[:, cols])
        y_out = nl.ndarray((B, EXPAND_CHUNK), dtype=y_in.dtype, buffer=nl.sbuf)
        nisa.scalar_tensor_tensor(dst=y_out, data=delta, op0=nl.multiply, operand0=scale, op1=nl.add, operand1=y_sb)
        nisa.dma_copy(dst=out[:, cols], src=y_out)
    return out


@nki.jit
def bgmv_lora_pe(x, lora_a, lora_b, indices, scale):
    """The per-token PE form of BGMV: x [B, H], lora_a [L, r, H], lora_b [L, O, r], indices [B] int32 ->
    y [B, O] = scale * (x A[idx]^T) B[idx]^T. Token b's A^T [128, H/128, r] is read straight from HBM transposed
    by ``.ap(pattern, scalar_offset=idx[0:1, b:b+1], indirect_dim=0)`` (the adapter dim moved by the token's index
    at run time), its B^T [r, O] by ``lora_b.select(0, idx[0:1, b:b+1]).T``; shrink v^T [r, 1] and expand y [1, O]
    on the PE."""
    B, H = x.shape
    L, r, _ = lora_a.shape
    O = lora_b.shape[1]
    KT = H // P_MAX
    kernel_assert(H % P_MAX == 0 and r <= P_MAX and O <= PSUM_FMAX, "H must be a multiple of 128, r <= 128, O <= 512")
    out = nl.ndarray((B, O), dtype=x.dtype, buffer=nl.shared_hbm)
    idx = nl.ndarray((1, B), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=idx, src=indices.reshape((1, B)))
    for b in nl.affine_range(B):
        xT = nl.ndarray((P_MAX, KT), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=xT, src=x.ap(pattern=[[1, P_MAX], [P_MAX, KT]], offset=b * H))
        aT = nl.ndarray((P_MAX, KT, r), dtype=lora_a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=aT, src=lora_a.ap(pattern=[[1, P_MAX], [P_MAX, KT], [H, r]], offset=0,
                                            scalar_offset=idx[0:1, b:b + 1], indirect_dim=0))
        bT = nl.ndarray((r, O), dtype=lora_b.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=bT, src=lora_b.select(0, idx[0:1, b:b + 1]).T)  # B[idx[b]]^T: a runtime select
        vT_ps = nl.ndarray((r, 1), dtype=nl.float32, buffer=nl.psum)
        for k in nl.affine_range(KT):
            nisa.nc_matmul(dst=vT_ps, stationary=aT[:, k, :], moving=xT[:, k:k + 1])
        vT = nl.ndarray((r, 1), dtype=x.dtype, buffer=nl.sbuf)
        nisa.activation(dst=vT, op=nl.copy, data=vT_ps, scale=scale)
        y_ps = nl.ndarray((1, O), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=y_ps, stationary=vT, moving=bT)
        y = nl.ndarray((1, O), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=y, src=y_ps)
        nisa.dma_copy(dst=out[b:b + 1, :], src=y)
    return out


# --------------------------------------------------------------------------------------------------
# 2. base projection, separate LoRA kernel, and the fused kernel
# --------------------------------------------------------------------------------------------------

def load_x_transposed(x, T, H):
    """x [T, H] -> xT [128, H/128, T] (hidden on the partitions), through PE transposes."""
    KT = H // P_MAX
    x_sb = nl.ndarray((T, H), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=x_sb, src=x)
    xT = nl.ndarray((P_MAX, KT, T), dtype=x.dtype, buffer=nl.sbuf)
    for k in nl.affine_range(KT):
        xT_ps = nl.ndarray((P_MAX, T), dtype=x.dtype, buffer=nl.psum)
        nisa.nc_transpose(dst=xT_ps, data=x_sb[:, nl.ds(k * P_MAX, P_MAX)])
        nisa.tensor_copy(dst=xT[:, k, :], src=xT_ps)
    return xT


def lora_shrink_stacked(xT, lora_a, lora_b, indices, scale, T, H, out_dtype):
    """vT [L*r, T] (out_dtype) = (onehot(idx) * scale * (x A_all^T))^T, and bT [L*r, O] = B_all^T in SBUF."""
    L, r, _ = lora_a.shape
    O = lora_b.shape[1]
    LR = L * r
    KT = H // P_MAX
    # A_all [L*r, H] (contiguous rows), transposed on the PE: aT[p, k, l*r + j] = lora_a[l, j, k*128 + p]
    a_sb = nl.ndarray((LR, H), dtype=lora_a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=a_sb, src=lora_a.reshape((LR, H)))
    aT = nl.ndarray((P_MAX, KT, LR), dtype=lora_a.dtype, buffer=nl.sbuf)
    for k in nl.affine_range(KT):
        aT_ps = nl.ndarray((P_MAX, LR), dtype=lora_a.dtype, buffer=nl.psum)
        nisa.nc_transpose(dst=aT_ps, data=a_sb[:, nl.ds(k * P_MAX, P_MAX)])
        nisa.tensor_copy(dst=aT[:, k, :], src=aT_ps)
    # B_all^T [L*r, O]: 128 output rows of every adapter per DMA ([128, L, r], runs of r elements), PE transpose
    bT = nl.ndarray((LR, O), dtype=lora_b.dtype, buffer=nl.sbuf)
    for o in nl.affine_range(O // P_MAX):
        b_sb = nl.ndarray((P_MAX, L, r), dtype=lora_b.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=b_sb, src=lora_b.ap(pattern=[[r, P_MAX], [O * r, L], [1, r]], offset=o * P_MAX * r))
        bT_ps = nl.ndarray((LR, P_MAX), dtype=lora_b.dtype, buffer=nl.psum)
        nisa.nc_transpose(dst=bT_ps, data=b_sb)
        nisa.tensor_copy(dst=bT[:, nl.ds(o * P_MAX, P_MAX)], src=bT_ps)

    v_ps = nl.ndarray((T, LR), dtype=nl.float32, buffer=nl.psum)
    for k in nl.affine_range(KT):
        nisa.nc_matmul(dst=v_ps, stationary=xT[:, k, :], moving=aT[:, k, :])

    # onehot[t, l] = scale if idx[t] == l else 0
    idx_i = nl.ndarray((T, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=idx_i, src=indices.reshape((T, 1)))
    idx_f = nl.ndarray((T, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=idx_f, src=idx_i)
    lid = nl.ndarray((T, L), dtype=nl.float32, buffer=nl.sbuf)
    nisa.iota(dst=lid, pattern=[[1, L]], offset=0)
    onehot = nl.ndarray((T, L), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=onehot, data=lid, op0=nl.equal, operand0=idx_f, op1=nl.multiply, operand1=scale)

    v_sb = nl.ndarray((T, L, r), dtype=out_dtype, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=v_sb, data1=v_ps, data2=onehot.ap(pattern=[[L, T], [1, L], [0, r]]), op=nl.multiply)
    vT_ps = nl.ndarray((LR, T), dtype=out_dtype, buffer=nl.psum)
    nisa.nc_transpose(dst=vT_ps, data=v_sb)
    vT = nl.ndarray((LR, T), dtype=out_dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=vT, src=vT_ps)
    return vT, bT


def check_projection(x, w, lora_a=None, lora_b=None):
    T, H = x.shape
    O = w.shape[1]
    kernel_assert(T <= P_MAX, "at most {} tokens, got {}".format(P_MAX, T))
    kernel_assert(H % P_MAX == 0 and tuple(w.shape) == (H, O), "w must be [H, O] with H a multiple of 128")
    kernel_assert(O % PSUM_FMAX == 0, "O={} must be a multiple of {}".format(O, PSUM_FMAX))
    if lora_a is not None:
        L, r, _ = lora_a.shape
        kernel_assert(L * r <= P_MAX, "stacked rank {} > {}".format(L * r, P_MAX))
        kernel_assert(tuple(lora_b.shape) == (L, O, r), "lora_b must be [L, O, r]")
    return T, H, O


@nki.jit
def base_projection(x, w):
    """x [T, H], w [H, O] -> y [T, O] = x @ w (x's dtype)."""
    T, H, O = check_projection(x, w)
    KT = H // P_MAX
    out = nl.ndarray((T, O), dtype=x.dtype, buffer=nl.shared_hbm)
    xT = load_x_transposed(x, T, H)
    for c in nl.affine_range(O // PSUM_FMAX):
        cols = nl.ds(c * PSUM_FMAX, PSUM_FMAX)
        w_sb = nl.ndarray((P_MAX, KT, PSUM_FMAX), dtype=w.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=w_sb, src=w.ap(pattern=[[O, P_MAX], [P_MAX * O, KT], [1, PSUM_FMAX]],
                                         offset=c * PSUM_FMAX))
        y_ps = nl.ndarray((T, PSUM_FMAX), dtype=nl.float32, buffer=nl.psum)
        for k in nl.affine_range(KT):
            nisa.nc_matmul(dst=y_ps, stationary=xT[:, k, :], moving=w_sb[:, k, :])
        y_sb = nl.ndarray((T, PSUM_FMAX), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=y_sb, src=y_ps)
        nisa.dma_copy(dst=out[:, cols], src=y_sb)
    return out


@nki.jit
def multi_lora_delta(x, y_base, lora_a, lora_b, indices, scale):
    """The second kernel of the unfused pipeline: y = y_base + scale * LoRA_{idx[t]}(x[t]) per token."""
    T, H = x.shape
    O = y_base.shape[1]
    L, r, _ = lora_a.shape
    kernel_assert(L * r <= P_MAX and O % PSUM_FMAX == 0 and T <= P_MAX, "shapes")
    out = nl.ndarray((T, O), dtype=y_base.dtype, buffer=nl.shared_hbm)
    xT = load_x_transposed(x, T, H)
    vT, bT = lora_shrink_stacked(xT, lora_a, lora_b, indices, scale, T, H, x.dtype)
    for c in nl.affine_range(O // PSUM_FMAX):
        cols = nl.ds(c * PSUM_FMAX, PSUM_FMAX)
        d_ps = nl.ndarray((T, PSUM_FMAX), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=d_ps, stationary=vT, moving=bT[:, cols])
        yb = nl.ndarray((T, PSUM_FMAX), dtype=y_base.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=yb, src=y_base[:, cols])
        y_sb = nl.ndarray((T, PSUM_FMAX), dtype=y_base.dtype, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=y_sb, data1=d_ps, data2=yb, op=nl.add)
        nisa.dma_copy(dst=out[:, cols], src=y_sb)
    return out


@nki.jit
def fused_lora_projection(x, w, lora_a, lora_b, indices, scale):
    """x [T, H], w [H, O], lora_a [L, r, H], lora_b [L, O, r], indices [T] int32 (< 0: no adapter)
    -> y [T, O] = x @ w + scale * (x A_{idx}^T) B_{idx}^T, base and adapter in one PSUM group per output tile."""
    T, H, O = check_projection(x, w, lora_a, lora_b)
    KT = H // P_MAX
    out = nl.ndarray((T, O), dtype=x.dtype, buffer=nl.shared_hbm)
    xT = load_x_transposed(x, T, H)
    vT, bT = lora_shrink_stacked(xT, lora_a, lora_b, indices, scale, T, H, x.dtype)
    for c in nl.affine_range(O // PSUM_FMAX):
        cols = nl.ds(c * PSUM_FMAX, PSUM_FMAX)
        w_sb = nl.ndarray((P_MAX, KT, PSUM_FMAX), dtype=w.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=w_sb, src=w.ap(pattern=[[O, P_MAX], [P_MAX * O, KT], [1, PSUM_FMAX]],
                                         offset=c * PSUM_FMAX))
        y_ps = nl.ndarray((T, PSUM_FMAX), dtype=nl.float32, buffer=nl.psum)
        for k in nl.affine_range(KT):
            nisa.nc_matmul(dst=y_ps, stationary=xT[:, k, :], moving=w_sb[:, k, :])
        nisa.nc_matmul(dst=y_ps, stationary=vT, moving=bT[:, cols])  # LoRA into the same accumulation group
        y_sb = nl.ndarray((T, PSUM_FMAX), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=y_sb, src=y_ps)
        nisa.dma_copy(dst=out[:, cols], src=y_sb)
    return out


# --------------------------------------------------------------------------------------------------
# 3. decode attention over an fp8 KV cache, per-KV-head scales, online softmax over key blocks
# --------------------------------------------------------------------------------------------------

@nki.jit
def fp8_kv_decode_attention(q, k_cache, v_cache, k_scale, v_scale, block=512):
    """q [B, Hq, D] bf16; k_cache [B, Hkv, D, S], v_cache [B, Hkv, S, D] (float8_e4m3 or bf16);
    k_scale, v_scale [Hkv] fp32 (cache value * scale = the real K / V) -> out [B, Hq, D] (q's dtype).

    All Hq = Hkv * G query heads of a sequence share the partitions of one scores tile [Hq, block]: KV head h's
    matmul uses a stationary that is q^T on the G columns of its group and zero elsewhere, so the Hkv matmuls of
    a block accumulate into one PSUM tile and the softmax work per key is paid once for all heads."""
    B, Hq, D = q.shape
    _, Hkv, _, S = k_cache.shape
    G = Hq // Hkv
    kernel_assert(Hq % Hkv == 0 and D <= P_MAX and Hq <= P_MAX, "Hq must be a multiple of Hkv, D, Hq <= 128")
    kernel_assert(tuple(v_cache.shape) == (B, Hkv, S, D), "v_cache must be [B, Hkv, S, D]")
    kernel_assert(block % P_MAX == 0 and block <= PSUM_FMAX and S % block == 0, "block / S not tileable")
    n_blocks = S // block
    n_sub = block // P_MAX
    sm_scale = 1.0 / math.sqrt(D)
    out = nl.ndarray((B, Hq, D), dtype=q.dtype, buffer=nl.shared_hbm)

    # per query row c: k_scale[c // G] / sqrt(D) and v_scale[c // G] (G partitions per head, partition step 0)
    ks = nl.ndarray((Hq, 1), dtype=nl.float32, buffer=nl.sbuf)
    vs = nl.ndarray((Hq, 1), dtype=nl.float32, buffer=nl.sbuf)
    for h in nl.affine_range(Hkv):
        nisa.dma_copy(dst=ks[nl.ds(h * G, G), :], src=k_scale.ap(pattern=[[0, G], [1, 1]], offset=h))
        nisa.dma_copy(dst=vs[nl.ds(h * G, G), :], src=v_scale.ap(pattern=[[0, G], [1, 1]], offset=h))
    ks_sm = nl.ndarray((Hq, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=ks_sm, data=ks, op0=nl.multiply, operand0=sm_scale)

    for b in nl.affine_range(B):
        # qz[:, h, :] = q[b]^T on the columns of group h, 0 elsewhere
        qz = nl.ndarray((D, Hkv, Hq), dtype=q.dtype, buffer=nl.sbuf)
        nisa.memset(dst=qz, value=0.0)
        for h in nl.affine_range(Hkv):
            nisa.dma_copy(dst=qz[:, h, nl.ds(h * G, G)], src=q.ap(pattern=[[1, D], [D, G]], offset=(b * Hq + h * G) * D))
        pz = nl.ndarray((P_MAX, n_sub, Hkv, Hq), dtype=q.dtype, buffer=nl.sbuf)  # p^T per tile and head, zeros as qz
        nisa.memset(dst=pz, value=0.0)
        m_run = nl.ndarray((Hq, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=m_run, value=NEG_INF)
        l_run = nl.ndarray((Hq, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=l_run, value=0.0)
        acc = nl.ndarray((Hq, D), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=acc, value=0.0)
        for s in nl.sequential_range(n_blocks):
            # kT[d, h, j] = k_cache[b, h, d, s*block + j]; v_sb[p, t, h, :] = v_cache[b, h, s*block + t*128 + p, :]
            kT = nl.ndarray((D, Hkv, block), dtype=k_cache.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=kT, src=k_cache.ap(pattern=[[S, D], [D * S, Hkv], [1, block]],
                                                 offset=b * Hkv * D * S + s * block))
            v_sb = nl.ndarray((P_MAX, n_sub, Hkv, D), dtype=v_cache.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=v_sb, src=v_cache.ap(pattern=[[D, P_MAX], [P_MAX * D, n_sub], [S * D, Hkv], [1, D]],
                                                   offset=(b * Hkv * S + s * block) * D))
            s_ps = nl.ndarray((Hq, block), dtype=nl.float32, buffer=nl.psum)
            for h in nl.affine_range(Hkv):
                nisa.nc_matmul(dst=s_ps, stationary=qz[:, h, :], moving=kT[:, h, :])
            # scores = raw * k_scale[head] / sqrt(D)
            sc = nl.ndarray((Hq, block), dtype=nl.float32, buffer=nl.sbuf)
            nisa.activation(dst=sc, op=nl.copy, data=s_ps, scale=ks_sm)
            bmax = nl.ndarray((Hq, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_reduce(dst=bmax, op=nl.maximum, data=sc, axis=1)
            m_new = nl.ndarray((Hq, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_tensor(dst=m_new, data1=m_run, data2=bmax, op=nl.maximum)
            neg_m = nl.ndarray((Hq, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_scalar(dst=neg_m, data=m_new, op0=nl.multiply, operand0=-1.0)
            alpha = nl.ndarray((Hq, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.activation(dst=alpha, op=nl.exp, data=m_run, bias=neg_m)
            p = nl.ndarray((Hq, block), dtype=q.dtype, buffer=nl.sbuf)
            p_sum = nl.ndarray((Hq, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.activation(dst=p, op=nl.exp, data=sc, bias=neg_m, reduce_op=nl.add, reduce_res=p_sum,
                            reduce_cmd=nisa.reduce_cmd.reset_reduce)
            # l = l * alpha + rowsum(p); m = m_new
            nisa.scalar_tensor_tensor(dst=l_run, data=l_run, op0=nl.multiply, operand0=alpha, op1=nl.add,
                                      operand1=p_sum)
            nisa.tensor_copy(dst=m_run, src=m_new)
            # pv = p @ V: per 128-key tile and KV head, the group's columns of p^T against V of that head
            pv_ps = nl.ndarray((Hq, D), dtype=nl.float32, buffer=nl.psum)
            for t in nl.affine_range(n_sub):
                pT_ps = nl.ndarray((P_MAX, Hq), dtype=q.dtype, buffer=nl.psum)
                nisa.nc_transpose(dst=pT_ps, data=p[:, nl.ds(t * P_MAX, P_MAX)])
                for h in nl.affine_range(Hkv):
                    nisa.tensor_copy(dst=pz[:, t, h, nl.ds(h * G, G)], src=pT_ps[:, nl.ds(h * G, G)])
                    nisa.nc_matmul(dst=pv_ps, stationary=pz[:, t, h, :], moving=v_sb[:, t, h, :])
            # acc = acc * alpha + pv
            nisa.scalar_tensor_tensor(dst=acc, data=acc, op0=nl.multiply, operand0=alpha, op1=nl.add,
                                      operand1=pv_ps)
        # out = acc * v_scale[head] / l
        inv_l = nl.ndarray((Hq, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.reciprocal(dst=inv_l, data=l_run)
        o_sb = nl.ndarray((Hq, D), dtype=q.dtype, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=o_sb, data=acc, op0=nl.multiply, operand0=inv_l, op1=nl.multiply, operand1=vs)
        nisa.dma_copy(dst=out[b], src=o_sb)
    return out
