"""Attention: single-head flash attention (online softmax, causal), its grouped-query (GQA) multi-head
version, and a naive version (single-head or GQA) whose score matrix is materialised in HBM.

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


def _load_kv(k, v, d, nb):
    """Resident K^T [d, S] and V [128, nb, d] in SBUF from one head's HBM views k, v [S, d]."""
    s = nb * P
    k_t = nl.ndarray((d, s), k.dtype, buffer=nl.sbuf)
    v_sb = nl.ndarray((P, nb, d), v.dtype, buffer=nl.sbuf)
    for j in nl.affine_range(nb):
        _load_transposed(k_t[:, j * P:(j + 1) * P], k[j * P:(j + 1) * P, :], k.dtype, d)
        nisa.dma_copy(dst=v_sb[:, j, :], src=v[j * P:(j + 1) * P, :])
    return k_t, v_sb


#: Key-chunk width of flash attention: the scores of one q block against up to 512 keys fill one PSUM bank
#: (fp32), so the softmax bookkeeping (row max, rescale, row sums) runs once per 512 keys.
FLASH_KEY_CHUNK = PSUM_FMAX


def _flash_head(out, q, k_t, v_sb, causal, d, nb):
    """One head of flash attention: out [S, d] (HBM view) = softmax(q K^T / sqrt(d) [+ mask]) V for the HBM
    view q [S, d] and the resident k_t [d, S], v_sb [128, nb, d] of _load_kv.

    Per q block i (128 rows) the keys it attends to (all S, or the first 128 (i + 1) when causal) are taken
    in chunks of up to 512: scores [128, n] = one nc_matmul into one PSUM bank, online-softmax update once
    per chunk, P^T by n / 128 TensorE transposes into one PSUM tile (one eviction), and P V by n / 128
    accumulating matmuls. Only the last chunk of a causal row block holds the diagonal and is masked."""
    scale = 1.0 / math.sqrt(d)
    for i in nl.affine_range(nb):
        q_t = nl.ndarray((d, P), q.dtype, buffer=nl.sbuf)
        _load_transposed(q_t, q[i * P:(i + 1) * P, :], q.dtype, d)
        m = nl.ndarray((P, 1), nl.float32, buffer=nl.sbuf)      # running max of raw scores
        l = nl.ndarray((P, 1), nl.float32, buffer=nl.sbuf)      # running sum of exp
        o = nl.ndarray((P, d), nl.float32, buffer=nl.sbuf)      # unnormalised output
        kend = (i + 1) * P if causal else nb * P               # keys this q block attends to
        nchunks = -(-kend // FLASH_KEY_CHUNK)
        for c in nl.sequential_range(nchunks):
            c0 = c * FLASH_KEY_CHUNK
            n = min(FLASH_KEY_CHUNK, kend - c0)
            nt = n // P
            # tiles are allocated at the full chunk shape and used through [:, :n] views (a ragged last chunk
            # reuses the same buffers)
            s_ps = nl.ndarray((P, FLASH_KEY_CHUNK), nl.float32, buffer=nl.psum)[:, :n]
            nisa.nc_matmul(dst=s_ps, stationary=q_t, moving=k_t[:, c0:c0 + n])
            if causal and c == nchunks - 1:
                # the chunk ends with the diagonal block: keep where key <= query, (128 i + p) - (c0 + col) >= 0
                s_sb = nl.ndarray((P, FLASH_KEY_CHUNK), nl.float32, buffer=nl.sbuf)[:, :n]
                nisa.tensor_copy(dst=s_sb, src=s_ps)  # GpSimd (affine_select) cannot read PSUM
                scores = nl.ndarray((P, FLASH_KEY_CHUNK), nl.float32, buffer=nl.sbuf)[:, :n]
                nisa.affine_select(dst=scores, pattern=[[-1, n]], channel_multiplier=1, offset=i * P - c0,
                                   on_true_tile=s_sb, on_false_value=MASK_VALUE, cmp_op=nl.greater_equal)
            else:
                scores = s_ps
            nbias = nl.ndarray((P, 1), nl.float32, buffer=nl.sbuf)
            p_t = nl.ndarray((P, FLASH_KEY_CHUNK), q.dtype, buffer=nl.sbuf)[:, :n]
            if c == 0:
                # first chunk of the row: m = rowmax, p = exp(scale * (s - m)), l = rowsum(p)
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
            # P^T [k, q] block by block into one PSUM tile (one eviction), then P V [q, d] accumulated
            pt_ps = nl.ndarray((P, FLASH_KEY_CHUNK // P, P), q.dtype, buffer=nl.psum)[:, :nt, :]
            for j in nl.affine_range(nt):
                nisa.nc_transpose(dst=pt_ps[:, j, :], data=p_t[:, j * P:(j + 1) * P])
            pT = nl.ndarray((P, FLASH_KEY_CHUNK // P, P), q.dtype, buffer=nl.sbuf)[:, :nt, :]
            nisa.tensor_copy(dst=pT, src=pt_ps)
            pv = nl.ndarray((P, d), nl.float32, buffer=nl.psum)
            for j in nl.sequential_range(nt):
                nisa.nc_matmul(dst=pv, stationary=pT[:, j, :], moving=v_sb[:, c0 // P + j, :], accumulate=j > 0)
            if c == 0:
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

#: Key-chunk width of the naive kernel's score pass: one PSUM bank of fp32 scores per nc_matmul.
NAIVE_KEY_CHUNK = PSUM_FMAX
#: Longest sequence the naive kernel's softmax pass keeps as whole [128, S] rows in SBUF (fp32 scores, fp32
#: exp, bf16 probabilities: 10 B per key per partition, 80 KiB at S = 8192).
NAIVE_MAX_SEQ = 8192


def _naive_head(out, q, k_t, v_sb, scores, probs, causal, d, nb):
    """One query head of naive attention in three passes over HBM. q [S, d] and out [S, d] are HBM views;
    k_t [d, S] and v_sb [128, nb, d] the resident K^T / V of the head's kv head; scores [S, S] fp32 and
    probs [S, S] (q's dtype) HBM scratch views of this head."""
    s = nb * P
    scale = 1.0 / math.sqrt(d)

    # pass 1: scores = scale * Q K^T (+ causal mask) -> HBM, key dim tiled by one PSUM bank (512 columns).
    # Every score of the row is computed and stored, masked ones included (as the naive baseline does).
    for i in nl.affine_range(nb):
        q_t = nl.ndarray((d, P), q.dtype, buffer=nl.sbuf)
        _load_transposed(q_t, q[i * P:(i + 1) * P, :], q.dtype, d)
        for c in nl.affine_range(-(-s // NAIVE_KEY_CHUNK)):
            c0 = c * NAIVE_KEY_CHUNK
            n = min(NAIVE_KEY_CHUNK, s - c0)
            # full-chunk tiles used through [:, :n] views (a ragged last chunk reuses the same buffers)
            s_ps = nl.ndarray((P, NAIVE_KEY_CHUNK), nl.float32, buffer=nl.psum)[:, :n]
            nisa.nc_matmul(dst=s_ps, stationary=q_t, moving=k_t[:, c0:c0 + n])
            s_sb = nl.ndarray((P, NAIVE_KEY_CHUNK), nl.float32, buffer=nl.sbuf)[:, :n]
            nisa.activation(dst=s_sb, op=nl.copy, data=s_ps, scale=scale)
            if causal and c0 + n - 1 > i * P:  # the chunk reaches above the diagonal
                # keep where key <= query: (128 i + p) - (c0 + col) >= 0
                s_m = nl.ndarray((P, NAIVE_KEY_CHUNK), nl.float32, buffer=nl.sbuf)[:, :n]
                nisa.affine_select(dst=s_m, pattern=[[-1, n]], channel_multiplier=1, offset=i * P - c0,
                                   on_true_tile=s_sb, on_false_value=MASK_VALUE, cmp_op=nl.greater_equal)
                s_sb = s_m
            nisa.dma_copy(dst=scores[i * P:(i + 1) * P, c0:c0 + n], src=s_sb)

    # pass 2: probs = softmax(scores) by rows: read back whole [128, S] rows, write probabilities -> HBM
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
        pt = nl.ndarray((P, s), probs.dtype, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=pt, data=e, op0=nl.multiply, operand0=r)
        nisa.dma_copy(dst=probs[i * P:(i + 1) * P, :], src=pt)

    # pass 3: out = probs @ V: read the probabilities back; contraction over keys needs P^T blocks as the
    # stationary operand (TensorE transpose of each [128, 128] block), accumulated in one PSUM tile.
    for i in nl.affine_range(nb):
        pr = nl.ndarray((P, s), probs.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=pr, src=probs[i * P:(i + 1) * P, :])
        o_ps = nl.ndarray((P, d), nl.float32, buffer=nl.psum)
        for j in nl.sequential_range(nb):
            tp = nl.ndarray((P, P), probs.dtype, buffer=nl.psum)
            nisa.nc_transpose(dst=tp, data=pr[:, j * P:(j + 1) * P])
            p_t = nl.ndarray((P, P), probs.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=p_t, src=tp)
            nisa.nc_matmul(dst=o_ps, stationary=p_t, moving=v_sb[:, j, :], accumulate=j > 0)
        o_t = nl.ndarray((P, d), out.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=o_t, src=o_ps)
        nisa.dma_copy(dst=out[i * P:(i + 1) * P, :], src=o_t)


@nki.jit
def attention_naive(q, k, v, causal=False):
    """out = softmax(Q K^T / sqrt(d) [+ causal mask]) V in three passes over HBM: scaled scores fp32 to an
    HBM scratch tensor (key dim tiled by 512), row softmax of the scores read back, probabilities (q's
    dtype) to a second HBM scratch tensor, then P V from the probabilities read back.

    Single head: q, k, v [S, d] -> out [S, d], scratch [S, S]. Grouped-query (GQA): q [Hq, S, d],
    k, v [Hkv, S, d] with Hq a multiple of Hkv -> out [Hq, S, d], scratch [Hq, S, S]; query head h attends
    with kv head h // (Hq // Hkv), whose K^T / V are loaded into SBUF once for the group.
    S multiple of 128, S <= NAIVE_MAX_SEQ, d <= 128."""
    if len(q.shape) == 2:
        s, d = q.shape
        hq = hkv = 0
        assert tuple(k.shape) == (s, d) and tuple(v.shape) == (s, d), \
            "attention_naive: k, v must be [S, d] = [{}, {}], got {}, {}".format(s, d, k.shape, v.shape)
    else:
        hq, s, d = q.shape
        hkv = k.shape[0]
        assert tuple(k.shape) == (hkv, s, d) and tuple(v.shape) == (hkv, s, d), \
            "attention_naive: k, v must be [Hkv, S, d] = [{}, {}, {}], got {}, {}".format(hkv, s, d, k.shape, v.shape)
        assert hkv >= 1 and hq % hkv == 0, "attention_naive: Hq={} is not a multiple of Hkv={}".format(hq, hkv)
    assert s % P == 0 and s <= NAIVE_MAX_SEQ and d <= P, \
        "attention_naive: S must be a multiple of 128 and <= {}, d <= 128, got {}".format(NAIVE_MAX_SEQ, q.shape)
    nb = s // P
    out = nl.ndarray(tuple(q.shape), q.dtype, buffer=nl.shared_hbm)
    if hq == 0:
        scores = nl.ndarray((s, s), nl.float32, buffer=nl.shared_hbm)
        probs = nl.ndarray((s, s), q.dtype, buffer=nl.shared_hbm)
        k_t, v_sb = _load_kv(k, v, d, nb)
        _naive_head(out, q, k_t, v_sb, scores, probs, causal, d, nb)
        return out
    group = hq // hkv
    scores = nl.ndarray((hq, s, s), nl.float32, buffer=nl.shared_hbm)
    probs = nl.ndarray((hq, s, s), q.dtype, buffer=nl.shared_hbm)
    for g in nl.affine_range(hkv):
        k_t, v_sb = _load_kv(k[g], v[g], d, nb)
        for r in nl.affine_range(group):
            h = g * group + r
            _naive_head(out[h], q[h], k_t, v_sb, scores[h], probs[h], causal, d, nb)
    return out


def attention_naive_ref(q, k, v, causal=False):
    """fp32 reference of attention_naive: single head [S, d], or GQA q [Hq, S, d], k, v [Hkv, S, d]."""
    if np.ndim(q) == 2:
        return attention_ref(q, k, v, causal=causal)
    return flash_attention_gqa_ref(q, k, v, causal=causal)


def attention_naive_inputs(seed=0, s=256, d=64, causal=False):
    return attention_inputs(seed, s, d, causal)


# --------------------------------------------------------------------------------------------------
# Qwen3-0.6B attention shapes (naive vs flash, examples/attention/)
# --------------------------------------------------------------------------------------------------

#: Qwen3-0.6B attention: 16 query heads, 8 kv heads, head dim 128 (bf16, causal).
QWEN3_HEADS, QWEN3_KV_HEADS, QWEN3_HEAD_DIM = 16, 8, 128


def gqa_attention_inputs(seed=0, s=512, hq=QWEN3_HEADS, hkv=QWEN3_KV_HEADS, d=QWEN3_HEAD_DIM, causal=True):
    """(q [Hq, S, d], k [Hkv, S, d], v [Hkv, S, d], causal) bf16, N(0, 1): the arguments of both
    attention_naive and flash_attention_gqa (defaults: the Qwen3-0.6B shapes at S = 512)."""
    return flash_attention_gqa_inputs(seed, hq=hq, hkv=hkv, s=s, d=d, causal=causal)


# --------------------------------------------------------------------------------------------------
# multi-head flash attention, heads split over the programs of an LNC=2 launch (docs/lnc.md)
# --------------------------------------------------------------------------------------------------


@nki.jit
def flash_attention_mh(q, k, v, causal=True):
    """Multi-head flash attention with the heads split over the launch's programs: q, k, v [H, S, d] ->
    out [H, S, d]. ``flash_attention_mh(q, k, v)`` runs every head on one core; ``flash_attention_mh[2]``
    (LNC=2, exported as ``flash_attention_lnc2``) gives program ``nl.program_id(0)`` = core c the heads
    [c * H/2, (c + 1) * H/2) (docs/lnc.md). S multiple of 128, d <= 128."""
    h, s, d = q.shape
    assert tuple(k.shape) == (h, s, d) and tuple(v.shape) == (h, s, d), \
        "flash_attention_mh: q, k, v must all be [H, S, d], got {}, {}, {}".format(q.shape, k.shape, v.shape)
    assert s % P == 0 and d <= P, "flash_attention_mh: S must be a multiple of 128 and d <= 128, got {}".format(
        q.shape)
    nb = s // P
    out = nl.ndarray((h, s, d), q.dtype, buffer=nl.shared_hbm)
    n, pid = nl.num_programs(0), nl.program_id(0)
    per = (h + n - 1) // n
    for hh in nl.affine_range(min(h, pid * per), min(h, (pid + 1) * per)):
        k_t, v_sb = _load_kv(k[hh], v[hh], d, nb)
        _flash_head(out[hh], q[hh], k_t, v_sb, causal, d, nb)
    return out


#: flash_attention_mh as an LNC=2 launch: the heads split over the two physical cores (trn2, trn3).
flash_attention_lnc2 = flash_attention_mh[2]


def flash_attention_mh_ref(q, k, v, causal=True):
    """fp32 reference of flash_attention_mh / flash_attention_lnc2."""
    return np.stack([attention_ref(q[h], k[h], v[h], causal=causal) for h in range(q.shape[0])])


def flash_attention_mh_inputs(seed=0, h=4, s=256, d=64, causal=True):
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((h, s, d)).astype(BF16) for _ in range(3))
    return q, k, v, causal
