"""A LayerNorm context-encoding kernel written in the style of the aws-neuron/nki-library kernels
(``nkilib/core/layernorm``): new NKI dialect, module-level constants, a ``nl.NKIObject`` dataclass, helper
sub-functions, ``kernel_assert``-style checks, mean and variance from ``nisa.bn_stats`` over
``bn_stats_fmax``-sized chunks aggregated by ``nisa.bn_aggr``, the mean column broadcast along the free dim by a
stride-0 SBUF access pattern (``.ap([[P_stride, n], [0, d]])``), gamma broadcast onto every partition by a
stride-0 HBM access pattern and beta by ``nisa.nc_stream_shuffle`` of one row into each 32-partition quadrant,
and the row tiles dealt round-robin to the programs of an LNC=2 launch (``nl.program_id(0)``).

Written for nsim's tests from memory of that library's idioms; it is not a copy of any nki-library file.
No nsim imports.

    out[b, s, :] = (x - mean(x)) / sqrt(var(x) + eps) * gamma + beta,   x = hidden[b, s, :]
"""
from dataclasses import dataclass

import numpy as np

import nki
import nki.isa as nisa
import nki.language as nl

P_MAX = 128
SBUF_QUADRANT_SIZE = 32  # partitions one nc_stream_shuffle mask covers
BN_STATS_FMAX = 512  # elements per partition one bn_stats instruction takes
BN_STATS_DIM = 6  # bn_stats outputs per chunk: (count, mean, M2) of the even and of the odd elements
BN_AGGR_DIM = 2  # bn_aggr outputs: mean, variance


def kernel_assert(condition, message):
    if not condition:
        raise AssertionError("[layernorm_cte] " + message)


def div_ceil(n, d):
    return (n + d - 1) // d


@dataclass
class LayerNormConfig(nl.NKIObject):
    num_rows: int
    hidden: int
    bn_chunk: int
    num_bn_chunks: int
    num_row_tiles: int
    n_prgs: int
    prg_id: int
    eps: float


def broadcast_row_to_partitions(row_sb, hidden, dtype):
    """row_sb [1, H] -> [P_MAX, H]: one stream shuffle (mask of zeros) per 32-partition quadrant."""
    out = nl.ndarray((P_MAX, hidden), dtype=dtype, buffer=nl.sbuf)
    for q in nl.static_range(P_MAX // SBUF_QUADRANT_SIZE):
        nisa.nc_stream_shuffle(dst=out[nl.ds(q * SBUF_QUADRANT_SIZE, SBUF_QUADRANT_SIZE), :], src=row_sb[0:1, :],
                               shuffle_mask=[0] * SBUF_QUADRANT_SIZE)
    return out


def load_affine_params(gamma, beta, cfg):
    gamma_sb = nl.ndarray((P_MAX, cfg.hidden), dtype=gamma.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=gamma_sb, src=gamma.ap(pattern=[[0, P_MAX], [1, cfg.hidden]], offset=0))
    beta_row = nl.ndarray((1, cfg.hidden), dtype=beta.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=beta_row, src=beta.reshape((1, cfg.hidden)))
    beta_sb = broadcast_row_to_partitions(beta_row, cfg.hidden, beta.dtype)
    return gamma_sb, beta_sb


def mean_var(x_sb, rows, cfg):
    """[P, 2] fp32: per row (mean, variance) of x_sb[:rows, :H]."""
    stats = nl.ndarray((P_MAX, cfg.num_bn_chunks * BN_STATS_DIM), dtype=nl.float32, buffer=nl.sbuf)
    for c in nl.affine_range(cfg.num_bn_chunks):
        nisa.bn_stats(dst=stats[:rows, nl.ds(c * BN_STATS_DIM, BN_STATS_DIM)],
                      data=x_sb[:rows, nl.ds(c * cfg.bn_chunk, cfg.bn_chunk)])
    mv = nl.ndarray((P_MAX, BN_AGGR_DIM), dtype=nl.float32, buffer=nl.sbuf)
    nisa.bn_aggr(dst=mv[:rows, :], data=stats[:rows, :])
    return mv


@nki.jit
def layernorm_cte(hidden, gamma, beta, eps=1e-5):
    """hidden [B, S, H]; gamma, beta [H] -> out [B, S, H] in hidden's dtype."""
    kernel_assert(len(hidden.shape) == 3, "hidden must be [B, S, H]")
    B, S, H = hidden.shape
    kernel_assert(tuple(gamma.shape) == (H,) and tuple(beta.shape) == (H,), "gamma and beta must be [H]")
    bn_chunk = min(H, BN_STATS_FMAX)
    kernel_assert(H % bn_chunk == 0, "H={} must be a multiple of {}".format(H, bn_chunk))
    n_prgs = nl.num_programs(axes=0) if nl.program_ndim() != 0 else 1
    prg_id = nl.program_id(axis=0) if nl.program_ndim() != 0 else 0
    cfg = LayerNormConfig(num_rows=B * S, hidden=H, bn_chunk=bn_chunk, num_bn_chunks=H // bn_chunk,
                          num_row_tiles=div_ceil(B * S, P_MAX), n_prgs=n_prgs, prg_id=prg_id, eps=eps)

    out = nl.ndarray((B, S, H), dtype=hidden.dtype, buffer=nl.shared_hbm)
    x_2d = hidden.reshape((cfg.num_rows, H))
    out_2d = out.reshape((cfg.num_rows, H))
    gamma_sb, beta_sb = load_affine_params(gamma, beta, cfg)
    eps_sb = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=eps_sb, value=cfg.eps)

    # row tile t runs on program t % n_prgs
    for t in nl.affine_range(cfg.prg_id, cfg.num_row_tiles, cfg.n_prgs):
        r0 = t * P_MAX
        rows = min(P_MAX, cfg.num_rows - r0)
        x_sb = nl.ndarray((P_MAX, H), dtype=hidden.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=x_sb[:rows, :], src=x_2d[nl.ds(r0, rows), :])
        mv = mean_var(x_sb, rows, cfg)
        rstd = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=rstd[:rows, :], op=nl.rsqrt, data=mv[:rows, 1:2], bias=eps_sb[:rows, :])
        # x - mean: the mean column (element 0 of each partition of mv) repeated H times by a stride-0 pattern
        xc = nl.ndarray((P_MAX, H), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=xc[:rows, :], data1=x_sb[:rows, :],
                           data2=mv.ap(pattern=[[BN_AGGR_DIM, rows], [0, H]], offset=0), op=nl.subtract)
        xn = nl.ndarray((P_MAX, H), dtype=nl.float32, buffer=nl.sbuf)
        nisa.scalar_tensor_tensor(dst=xn[:rows, :], data=xc[:rows, :], op0=nl.multiply, operand0=rstd[:rows, :],
                                  op1=nl.multiply, operand1=gamma_sb[:rows, :])
        y = nl.ndarray((P_MAX, H), dtype=hidden.dtype, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=y[:rows, :], data1=xn[:rows, :], data2=beta_sb[:rows, :], op=nl.add)
        nisa.dma_copy(dst=out_2d[nl.ds(r0, rows), :], src=y[:rows, :])
    return out


def reference(hidden, gamma, beta, eps=1e-5):
    h = np.asarray(hidden, np.float64)
    mean = h.mean(axis=-1, keepdims=True)
    var = h.var(axis=-1, keepdims=True)
    y = (h - mean) / np.sqrt(var + eps) * np.asarray(gamma, np.float64) + np.asarray(beta, np.float64)
    return y.astype(hidden.dtype)
