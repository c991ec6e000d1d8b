"""Attention: single-head flash attention (online softmax, causal), its grouped-query (GQA) multi-head
version, and a naive single-head version whose score matrix is materialised in HBM.

Layout (port of examples/gen_examples.py:flash_attention): Q^T and K^T [d, S] (d <= 128 on the
partitions) so scores S_ij = Q_i K_j^T come from nc_matmul(stationary=Q_i^T [d, q], moving=K_j^T [d, k]);
P V needs P^T [k, q] (contraction over k on the partitions): one TensorE transpose of P per block.
"""
from __future__ import annotations

import math

import numpy as np

from nsim import nki
import nsim.nki.language as nl
import nsim.nki.isa as nisa

from ._common import P, PSUM_FMAX, BF16, f32

#: Value written into masked (future) scores before the exp: exp(scale * (MASK - max)) == 0.
MASK_VALUE = -30000.0


def _load_transposed(dst, src_hbm, dtype, d):
    """dst [d, 128] = src_hbm[128, d]^T (DMA + TensorE transpose + eviction)."""
    t = nl.ndarray((P, d), dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=src_hbm)
    tp = nl.ndarray((d, P), dtype, buffer=nl.psum)
    nisa.nc_transpose(dst=tp, data=t)
    nisa.tensor_copy(dst=dst, src=tp)


def _causal_mask(s_sb):
    """In place on a diagonal [128 q, 128 k] score block (SBUF): keep where q - k = p - col >= 0."""
    s_m = nl.ndarray((P, P), nl.float32, buffer=nl.sbuf)
    nisa.affine_select(dst=s_m, pattern=[[-1, P]], channel_multiplier=1, offset=0, on_true_tile=s_sb,
                       on_false_value=MASK_VALUE, cmp_op=nl.greater_equal)
    return s_m


def _load_kv(k, v, d, nb):
    """Resident K^T [d, S] and V [128, nb, d] in SBUF from one head's HBM views k, v [S, d]."""
    s = nb * P
    k_t = nl.ndarray((d, s), k.dtype, buffer=nl.sbuf)
    v_sb = nl.ndarray((P, nb, d), v.dtype, buffer=nl.sbuf)
    for j in nl.affine_range(nb):
        _load_transposed(k_t[:, j * P:(j + 1) * P], k[j * P:(j + 1) * P, :], k.dtype, d)
        nisa.dma_copy(dst=v_sb[:, j, :], src=v[j * P:(j + 1) * P, :])
    return k_t, v_sb


def _flash_head(out, q, k_t, v_sb, causal, d, nb):
    """One head of flash attention: out [S, d] (HBM view) = softmax(q K^T / sqrt(d) [+ mask]) V for the HBM
    view q [S, d] and the resident k_t [d, S], v_sb [128, nb, d] of _load_kv."""
    scale = 1.0 / math.sqrt(d)
    for i in nl.affine_range(nb):
        q_t = nl.ndarray((d, P), q.dtype, buffer=nl.sbuf)
        _load_transposed(q_t, q[i * P:(i + 1) * P, :], q.dtype, d)
        m = nl.ndarray((P, 1), nl.float32, buffer=nl.sbuf)      # running max of raw scores
        l = nl.ndarray((P, 1), nl.float32, buffer=nl.sbuf)      # running sum of exp
        o = nl.ndarray((P, d), nl.float32, buffer=nl.sbuf)      # unnormalised output
        for j in nl.sequential_range(i + 1 if causal else nb):
            s_ps = nl.ndarray((P, P), nl.float32, buffer=nl.psum)
            nisa.nc_matmul(dst=s_ps, stationary=q_t, moving=k_t[:, j * P:(j + 1) * P])
            if causal and j == i:
                s_sb = nl.ndarray((P, P), nl.float32, buffer=nl.sbuf)
                nisa.tensor_copy(dst=s_sb, src=s_ps)  # GpSimd (affine_select) cannot read PSUM
                scores = _causal_mask(s_sb)
            else:
                scores = s_ps
            nbias = nl.ndarray((P, 1), nl.float32, buffer=nl.sbuf)
            p_t = nl.ndarray((P, P), q.dtype, buffer=nl.sbuf)
            if j == 0:
                # first block of the row: m = rowmax, p = exp(scale * (s - m)), l = rowsum(p)
                nisa.tensor_reduce(dst=m, op=nl.maximum, data=scores, axis=1)
                nisa.tensor_scalar(dst=nbias, data=m, op0=nl.multiply, operand0=-scale)
                nisa.activation(dst=p_t, op=nl.exp, data=scores, bias=nbias, scale=scale, reduce_op=nl.add,
                                reduce_res=l, reduce_cmd=nisa.reduce_cmd.reset_reduce)
            else:
                # m_new = max(m, rowmax); alpha = exp(scale * (m - m_new)); l = l * alpha + rowsum(p)
                bmax = nl.ndarray((P, 1), nl.float32, buffer=nl.sbuf)
                nisa.tensor_reduce(dst=bmax, op=nl.maximum, data=scores, axis=1)
                m_new = nl.ndarray((P, 1), nl.float32, buffer=nl.sbuf)
                nisa.tensor_tensor(dst=m_new, data1=m, data2=bmax, op=nl.maximum)
                nisa.tensor_scalar(dst=nbias, data=m_new, op0=nl.multiply, operand0=-scale)
                alpha = nl.ndarray((P, 1), nl.float32, buffer=nl.sbuf)
                nisa.activation(dst=alpha, op=nl.exp, data=m, bias=nbias, scale=scale)
                nisa.tensor_copy(dst=m, src=m_new)
                bsum = nl.ndarray((P, 1), nl.float32, buffer=nl.sbuf)
                nisa.activation(dst=p_t, op=nl.exp, data=scores, bias=nbias, scale=scale, reduce_op=nl.add,
                                reduce_res=bsum, reduce_cmd=nisa.reduce_cmd.reset_reduce)
                nisa.scalar_tensor_tensor(dst=l, data=l, op0=nl.multiply, operand0=alpha, op1=nl.add,
                                          operand1=bsum)
            # P^T [k, q], then P V [q, d]
            pt_ps = nl.ndarray((P, P), q.dtype, buffer=nl.psum)
            nisa.nc_transpose(dst=pt_ps, data=p_t)
            pT = nl.ndarray((P, P), q.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=pT, src=pt_ps)
            pv = nl.ndarray((P, d), nl.float32, buffer=nl.psum)
            nisa.nc_matmul(dst=pv, stationary=pT, moving=v_sb[:, j, :])
            if j == 0:
                nisa.tensor_copy(dst=o, src=pv)
            else:
                nisa.scalar_tensor_tensor(dst=o, data=o, op0=nl.multiply, operand0=alpha, op1=nl.add, operand1=pv)
        rl = nl.ndarray((P, 1), nl.float32, buffer=nl.sbuf)
        nisa.reciprocal(dst=rl, data=l)
        o_t = nl.ndarray((P, d), q.dtype, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=o_t, data=o, op0=nl.multiply, operand0=rl)
        nisa.dma_copy(dst=out[i * P:(i + 1) * P, :], src=o_t)


@nki.jit
def flash_attention(q, k, v, causal=True):
    """out = softmax(Q K^T / sqrt(d) [+ causal mask]) V for q, k, v [S, d]; S multiple of 128, d <= 128."""
    s, d = q.shape
    assert s % P == 0 and d <= P, "flash_attention: S must be a multiple of 128 and d <= 128, got {}".format(q.shape)
    nb = s // P
    out = nl.ndarray((s, d), q.dtype, buffer=nl.shared_hbm)
    k_t, v_sb = _load_kv(k, v, d, nb)  # resident K^T [d, S] and V [128, nb, d]
    _flash_head(out, q, k_t, v_sb, causal, d, nb)
    return out


@nki.jit
def flash_attention_gqa(q, k, v, causal=True):
    """Grouped-query flash attention: q [Hq, S, d], k, v [Hkv, S, d], Hq a multiple of Hkv; query head h
    attends with kv head h // (Hq // Hkv). out [Hq, S, d]. Each kv head's K^T / V is loaded into SBUF once
    and reused by its Hq // Hkv query heads. S multiple of 128, d <= 128."""
    hq, s, d = q.shape
    hkv = k.shape[0]
    assert tuple(k.shape) == (hkv, s, d) and tuple(v.shape) == (hkv, s, d), \
        "flash_attention_gqa: k, v must be [Hkv, S, d] = [{}, {}, {}], got {}, {}".format(hkv, s, d, k.shape, v.shape)
    assert hkv >= 1 and hq % hkv == 0, "flash_attention_gqa: Hq={} is not a multiple of Hkv={}".format(hq, hkv)
    assert s % P == 0 and d <= P, "flash_attention_gqa: S must be a multiple of 128 and d <= 128, got {}".format(
        q.shape)
    nb = s // P
    group = hq // hkv
    out = nl.ndarray((hq, s, d), q.dtype, buffer=nl.shared_hbm)
    for g in nl.affine_range(hkv):
        k_t, v_sb = _load_kv(k[g], v[g], d, nb)
        for r in nl.affine_range(group):
            h = g * group + r
            _flash_head(out[h], q[h], k_t, v_sb, causal, d, nb)
    return out


def attention_ref(q, k, v, causal=False):
    q, k, v = (f32(a) for a in (q, k, v))
    s = (q @ k.T) * np.float32(1.0 / math.sqrt(q.shape[1]))
    if causal:
        s = np.where(np.tril(np.ones(s.shape, dtype=bool)), s, -np.inf)
    s = s - s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    p = p / p.sum(axis=-1, keepdims=True)
    return p @ v


def flash_attention_ref(q, k, v, causal=True):
    return attention_ref(q, k, v, causal=causal)


def attention_inputs(seed=0, s=512, d=128, causal=None):
    rng = np.random.default_rng(seed)
    qkv = tuple(rng.standard_normal((s, d)).astype(BF16) for _ in range(3))
    return qkv if causal is None else qkv + (causal,)


def flash_attention_inputs(seed=0, s=512, d=128, causal=True):
    return attention_inputs(seed, s, d, causal)


def flash_attention_gqa_ref(q, k, v, causal=True):
    """fp32 reference of flash_attention_gqa: query head h uses kv head h // (Hq // Hkv)."""
    group = q.shape[0] // k.shape[0]
    return np.stack([attention_ref(q[h], k[h // group], v[h // group], causal=causal) for h in range(q.shape[0])])


def flash_attention_gqa_inputs(seed=0, hq=4, hkv=2, s=256, d=64, causal=True):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((hq, s, d)).astype(BF16)
    k = rng.standard_normal((hkv, s, d)).astype(BF16)
    v = rng.standard_normal((hkv, s, d)).astype(BF16)
    return q, k, v, causal


# --------------------------------------------------------------------------------------------------
# naive attention: scores materialised in HBM
# --------------------------------------------------------------------------------------------------


@nki.jit
def attention_naive(q, k, v, causal=False):
    """out = softmax(Q K^T / sqrt(d) [+ causal mask]) V in three passes over HBM: scaled scores [S, S]
    fp32 to HBM, row softmax of the scores back to HBM (bf16 probabilities), then P V.
    S multiple of 128, S <= 512, d <= 128."""
    s, d = q.shape
    assert s % P == 0 and s <= PSUM_FMAX and d <= P, "attention_naive: bad shape {}".format(q.shape)
    nb = s // P
    scale = 1.0 / math.sqrt(d)
    out = nl.ndarray((s, d), q.dtype, buffer=nl.shared_hbm)
    scores = nl.ndarray((s, s), nl.float32, buffer=nl.shared_hbm)
    probs = nl.ndarray((s, s), q.dtype, buffer=nl.shared_hbm)

    # pass 1: scores = scale * Q K^T (+ mask) -> HBM
    k_t = nl.ndarray((d, s), k.dtype, buffer=nl.sbuf)
    for j in nl.affine_range(nb):
        _load_transposed(k_t[:, j * P:(j + 1) * P], k[j * P:(j + 1) * P, :], k.dtype, d)
    for i in nl.affine_range(nb):
        q_t = nl.ndarray((d, P), q.dtype, buffer=nl.sbuf)
        _load_transposed(q_t, q[i * P:(i + 1) * P, :], q.dtype, d)
        s_ps = nl.ndarray((P, s), nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=s_ps, stationary=q_t, moving=k_t)
        s_sb = nl.ndarray((P, s), nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=s_sb, op=nl.copy, data=s_ps, scale=scale)
        if causal:  # keep where key <= query: 128*i + p - col >= 0
            s_m = nl.ndarray((P, s), nl.float32, buffer=nl.sbuf)
            nisa.affine_select(dst=s_m, pattern=[[-1, s]], channel_multiplier=1, offset=i * P, on_true_tile=s_sb,
                               on_false_value=MASK_VALUE, cmp_op=nl.greater_equal)
            s_sb = s_m
        nisa.dma_copy(dst=scores[i * P:(i + 1) * P, :], src=s_sb)

    # pass 2: probs = softmax(scores) rows -> HBM
    for i in nl.affine_range(nb):
        st = nl.ndarray((P, s), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=st, src=scores[i * P:(i + 1) * P, :])
        mx = nl.ndarray((P, 1), nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=mx, op=nl.maximum, data=st, axis=1, negate=True)
        e = nl.ndarray((P, s), nl.float32, buffer=nl.sbuf)
        sm = nl.ndarray((P, 1), nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=e, op=nl.exp, data=st, bias=mx, reduce_op=nl.add, reduce_res=sm,
                        reduce_cmd=nisa.reduce_cmd.reset_reduce)
        r = nl.ndarray((P, 1), nl.float32, buffer=nl.sbuf)
        nisa.reciprocal(dst=r, data=sm)
        pt = nl.ndarray((P, s), q.dtype, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=pt, data=e, op0=nl.multiply, operand0=r)
        nisa.dma_copy(dst=probs[i * P:(i + 1) * P, :], src=pt)

    # pass 3: out = probs @ V (contraction over keys: P^T blocks as stationary)
    v_sb = nl.ndarray((P, nb, d), v.dtype, buffer=nl.sbuf)
    for j in nl.affine_range(nb):
        nisa.dma_copy(dst=v_sb[:, j, :], src=v[j * P:(j + 1) * P, :])
    for i in nl.affine_range(nb):
        pr = nl.ndarray((P, s), q.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=pr, src=probs[i * P:(i + 1) * P, :])
        o_ps = nl.ndarray((P, d), nl.float32, buffer=nl.psum)
        for j in nl.sequential_range(nb):
            tp = nl.ndarray((P, P), q.dtype, buffer=nl.psum)
            nisa.nc_transpose(dst=tp, data=pr[:, j * P:(j + 1) * P])
            p_t = nl.ndarray((P, P), q.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=p_t, src=tp)
            nisa.nc_matmul(dst=o_ps, stationary=p_t, moving=v_sb[:, j, :], accumulate=j > 0)
        o_t = nl.ndarray((P, d), q.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=o_t, src=o_ps)
        nisa.dma_copy(dst=out[i * P:(i + 1) * P, :], src=o_t)
    return out


def attention_naive_ref(q, k, v, causal=False):
    return attention_ref(q, k, v, causal=causal)


def attention_naive_inputs(seed=0, s=256, d=64, causal=False):
    return attention_inputs(seed, s, d, causal)
