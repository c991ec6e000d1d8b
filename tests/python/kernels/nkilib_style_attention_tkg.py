"""A token-generation (decode) grouped-query attention kernel written in the style of the aws-neuron/nki-library
kernels (``nkilib/core/attention`` TKG): new NKI dialect, module-level constants, a ``nl.NKIObject`` dataclass,
helper sub-functions, ``kernel_assert``-style checks, the query of a KV-head group loaded already transposed by
a strided DMA access pattern (``.ap``), the K cache transposed on the PE (``nisa.nc_transpose``), Q.K^T in PSUM
chunks of one bank, softmax with ``nisa.tensor_reduce`` (max), ``nisa.tensor_scalar`` (negate) and
``nisa.activation(op=nl.exp, bias=, reduce_op=, reduce_res=, reduce_cmd=)`` (exp and row sums in one pass), the
probabilities transposed on the PE and P.V accumulated over the sequence tiles in PSUM, normalised by
``nisa.reciprocal`` on the way out. The (batch, KV head) work items are dealt round-robin to the programs of an
LNC=2 launch (``nl.program_id(0)``).

Written for nsim's tests from memory of that library's idioms; it is not a copy of any nki-library file.
No nsim imports.

    q [B, Hq, D] (one new token per sequence), k, v [B, Hkv, S, D], Hq = G * Hkv
    out[b, h] = softmax(q[b, h] . k[b, h // G]^T / sqrt(D)) . v[b, h // G]
"""
import math
from dataclasses import dataclass

import numpy as np

import nki
import nki.isa as nisa
import nki.language as nl

P_MAX = 128
PSUM_FMAX = 512  # fp32 scores per PSUM bank per partition: the Q.K^T chunk
MAX_SEQ = 4096  # scores row kept in SBUF (fp32: 16 KiB per partition)


def kernel_assert(condition, message):
    if not condition:
        raise AssertionError("[attention_tkg] " + message)


@dataclass
class AttnTKGConfig(nl.NKIObject):
    batch: int
    q_heads: int
    kv_heads: int
    group: int
    seq: int
    d_head: int
    num_s_tiles: int
    s_chunk: int
    num_s_chunks: int
    scale: float


def load_q_transposed(q, b, h, cfg):
    """q[b, h*G:(h+1)*G, :] [G, D] in HBM -> qT [D, G] in SBUF: partition d reads q's column d (step 1 between
    partitions, step D between the G heads)."""
    qT = nl.ndarray((cfg.d_head, cfg.group), dtype=q.dtype, buffer=nl.sbuf)
    base = (b * cfg.q_heads + h * cfg.group) * cfg.d_head
    nisa.dma_copy(dst=qT, src=q.ap(pattern=[[1, cfg.d_head], [cfg.d_head, cfg.group]], offset=base))
    return qT


def load_k_transposed(k, b, h, cfg):
    """k[b, h] [S, D] -> kT [D, S] in SBUF, 128 sequence positions per PE transpose."""
    kT = nl.ndarray((cfg.d_head, cfg.seq), dtype=k.dtype, buffer=nl.sbuf)
    for s in nl.affine_range(cfg.num_s_tiles):
        k_sb = nl.ndarray((P_MAX, cfg.d_head), dtype=k.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=k_sb, src=k[b, h, nl.ds(s * P_MAX, P_MAX), :])
        kT_ps = nl.ndarray((cfg.d_head, P_MAX), dtype=k.dtype, buffer=nl.psum)
        nisa.nc_transpose(dst=kT_ps, data=k_sb)
        nisa.tensor_copy(dst=kT[:, nl.ds(s * P_MAX, P_MAX)], src=kT_ps)
    return kT


def softmax_numerator(qT, kT, cfg, p_dtype):
    """(exp(scores - max) [G, S] in p_dtype, row sums [G, 1] fp32) with scores = q.k^T * scale."""
    G = cfg.group
    scores = nl.ndarray((G, cfg.seq), dtype=nl.float32, buffer=nl.sbuf)
    for c in nl.affine_range(cfg.num_s_chunks):
        cols = nl.ds(c * cfg.s_chunk, cfg.s_chunk)
        sc_ps = nl.ndarray((G, cfg.s_chunk), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=sc_ps, stationary=qT, moving=kT[:, cols])
        nisa.activation(dst=scores[:, cols], op=nl.copy, data=sc_ps, scale=cfg.scale)
    row_max = nl.ndarray((G, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=row_max, op=nl.maximum, data=scores, axis=1)
    neg_max = nl.ndarray((G, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=neg_max, data=row_max, op0=nl.multiply, operand0=-1.0)
    probs = nl.ndarray((G, cfg.seq), dtype=p_dtype, buffer=nl.sbuf)
    row_sum = nl.ndarray((G, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=probs, op=nl.exp, data=scores, bias=neg_max, reduce_op=nl.add, reduce_res=row_sum,
                    reduce_cmd=nisa.reduce_cmd.reset_reduce)
    return probs, row_sum


def probs_times_v(probs, v, b, h, cfg):
    """[G, D] PSUM = probs [G, S] . v[b, h] [S, D], accumulated over the sequence tiles."""
    G = cfg.group
    o_ps = nl.ndarray((G, cfg.d_head), dtype=nl.float32, buffer=nl.psum)
    for s in nl.affine_range(cfg.num_s_tiles):
        pT_ps = nl.ndarray((P_MAX, G), dtype=probs.dtype, buffer=nl.psum)
        nisa.nc_transpose(dst=pT_ps, data=probs[:, nl.ds(s * P_MAX, P_MAX)])
        pT = nl.ndarray((P_MAX, G), dtype=probs.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=pT, src=pT_ps)
        v_sb = nl.ndarray((P_MAX, cfg.d_head), dtype=v.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=v_sb, src=v[b, h, nl.ds(s * P_MAX, P_MAX), :])
        nisa.nc_matmul(dst=o_ps, stationary=pT, moving=v_sb)
    return o_ps


@nki.jit
def attention_tkg(q, k, v):
    """q [B, Hq, D]; k, v [B, Hkv, S, D], one dtype (bf16 or fp32) -> out [B, Hq, D] in that dtype."""
    kernel_assert(len(q.shape) == 3 and len(k.shape) == 4, "q must be [B, Hq, D], k and v [B, Hkv, S, D]")
    B, Hq, D = q.shape
    _, Hkv, S, _ = k.shape
    kernel_assert(tuple(k.shape) == (B, Hkv, S, D) and tuple(v.shape) == tuple(k.shape), "k/v shape mismatch")
    kernel_assert(Hq % Hkv == 0 and Hq // Hkv <= P_MAX, "Hq={} must be a multiple of Hkv={}".format(Hq, Hkv))
    kernel_assert(D <= P_MAX, "head dim {} > {}".format(D, P_MAX))
    kernel_assert(S % P_MAX == 0 and S <= MAX_SEQ, "S={} must be a multiple of {} and <= {}".format(S, P_MAX, MAX_SEQ))
    s_chunk = min(S, PSUM_FMAX)
    cfg = AttnTKGConfig(batch=B, q_heads=Hq, kv_heads=Hkv, group=Hq // Hkv, seq=S, d_head=D,
                        num_s_tiles=S // P_MAX, s_chunk=s_chunk, num_s_chunks=S // s_chunk,
                        scale=1.0 / math.sqrt(D))
    n_prgs = nl.num_programs(axes=0) if nl.program_ndim() != 0 else 1
    prg_id = nl.program_id(axis=0) if nl.program_ndim() != 0 else 0

    out = nl.ndarray((B, Hq, D), dtype=q.dtype, buffer=nl.shared_hbm)
    for item in nl.affine_range(prg_id, B * Hkv, n_prgs):
        b, h = item // Hkv, item % Hkv
        qT = load_q_transposed(q, b, h, cfg)
        kT = load_k_transposed(k, b, h, cfg)
        probs, row_sum = softmax_numerator(qT, kT, cfg, q.dtype)
        o_ps = probs_times_v(probs, v, b, h, cfg)
        inv_sum = nl.ndarray((cfg.group, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.reciprocal(dst=inv_sum, data=row_sum)
        o_sb = nl.ndarray((cfg.group, D), dtype=q.dtype, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=o_sb, data=o_ps, op0=nl.multiply, operand0=inv_sum)
        nisa.dma_copy(dst=out[b, nl.ds(h * cfg.group, cfg.group), :], src=o_sb)
    return out


def reference(q, k, v):
    """numpy in float64 with the kernel's one intermediate rounding (the unnormalised probabilities stored in
    q's dtype before P.V; the row sums from the unrounded values)."""
    B, Hq, D = q.shape
    Hkv = k.shape[1]
    G = Hq // Hkv
    qf = np.asarray(q, np.float64).reshape(B, Hkv, G, D)
    kf, vf = np.asarray(k, np.float64), np.asarray(v, np.float64)
    s = np.einsum("bhgd,bhsd->bhgs", qf, kf) / np.sqrt(D)
    e = np.exp(s - s.max(-1, keepdims=True))
    p = e.astype(q.dtype).astype(np.float64)
    o = np.einsum("bhgs,bhsd->bhgd", p, vf) / e.sum(-1, keepdims=True)
    return o.reshape(B, Hq, D).astype(q.dtype)
