"""Row-wise kernels: scaled softmax, RMSNorm, LayerNorm (one row per partition, fp32 statistics)."""
from __future__ import annotations

import numpy as np

from nsim import nki
import nsim.nki.language as nl
import nsim.nki.isa as nisa

from ._common import BN_FMAX, BF16, cdiv, f32, broadcast_row, row_blocks


# --------------------------------------------------------------------------------------------------
# softmax
# --------------------------------------------------------------------------------------------------


def _softmax_rows(x, y, b, r0, rows, h, scale):
    """softmax(scale * x[b, r0:r0+rows, :]) -> y[...]: one row per partition, fp32 inside."""
    xt = nl.ndarray((rows, h), x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=xt, src=x[b, r0:r0 + rows, :])
    # max_j(scale * x) = scale * max_j x (scale > 0) or scale * min_j x (scale < 0)
    mx = nl.ndarray((rows, 1), nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=mx, op=nl.maximum if scale >= 0 else nl.minimum, data=xt, axis=1)
    nb = nl.ndarray((rows, 1), nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=nb, data=mx, op0=nl.multiply, operand0=-float(scale))
    # e = exp(scale * x - scale * max), row sums accumulated on ScalarE
    e = nl.ndarray((rows, h), nl.float32, buffer=nl.sbuf)
    s = nl.ndarray((rows, 1), nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=e, op=nl.exp, data=xt, bias=nb, scale=float(scale), reduce_op=nl.add, reduce_res=s,
                    reduce_cmd=nisa.reduce_cmd.reset_reduce)
    r = nl.ndarray((rows, 1), nl.float32, buffer=nl.sbuf)
    nisa.reciprocal(dst=r, data=s)
    yt = nl.ndarray((rows, h), y.dtype, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=yt, data=e, op0=nl.multiply, operand0=r)
    nisa.dma_copy(dst=y[b, r0:r0 + rows, :], src=yt)


@nki.jit
def softmax(x, scale=1.0):
    """y = softmax(scale * x) over the last dim of x [batch, seq, hidden]; seq may be ragged (not a
    multiple of 128: the tail is a block of fewer partitions)."""
    bsz, seq, h = x.shape
    y = nl.ndarray((bsz, seq, h), x.dtype, buffer=nl.shared_hbm)
    for b in nl.affine_range(bsz):
        for r0, rows in row_blocks(seq):
            _softmax_rows(x, y, b, r0, rows, h, scale)
    return y


def softmax_ref(x, scale=1.0):
    z = f32(x) * np.float32(scale)
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True, dtype=np.float32)


def softmax_inputs(seed=0, shape=(2, 300, 768), scale=0.25):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape).astype(BF16), scale)


# --------------------------------------------------------------------------------------------------
# RMSNorm
# --------------------------------------------------------------------------------------------------


def _rstd(dst, var_like, rows, eps, mul=1.0):
    """dst = 1 / sqrt(mul * var_like + eps), all [rows, 1] fp32."""
    t = nl.ndarray((rows, 1), nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=t, data=var_like, op0=nl.multiply, operand0=float(mul), op1=nl.add,
                       operand1=float(eps))
    sq = nl.ndarray((rows, 1), nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=sq, op=nl.sqrt, data=t)
    nisa.reciprocal(dst=dst, data=sq)


@nki.jit
def rmsnorm(x, w, eps=1e-6):
    """y = x / sqrt(mean(x^2, -1) + eps) * w for x [N, D], w [D]."""
    n, d = x.shape
    y = nl.ndarray((n, d), x.dtype, buffer=nl.shared_hbm)
    w_b = broadcast_row(w, d)  # [128, D] fp32, w on every partition
    for r0, rows in row_blocks(n):
        xt = nl.ndarray((rows, d), x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=xt, src=x[r0:r0 + rows, :])
        sq = nl.ndarray((rows, d), nl.float32, buffer=nl.sbuf)
        ss = nl.ndarray((rows, 1), nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=sq, op=nl.square, data=xt, reduce_op=nl.add, reduce_res=ss,
                        reduce_cmd=nisa.reduce_cmd.reset_reduce)
        rstd = nl.ndarray((rows, 1), nl.float32, buffer=nl.sbuf)
        _rstd(rstd, ss, rows, eps, mul=1.0 / d)
        yt = nl.ndarray((rows, d), x.dtype, buffer=nl.sbuf)
        nisa.scalar_tensor_tensor(dst=yt, data=xt, op0=nl.multiply, operand0=rstd, op1=nl.multiply,
                                  operand1=w_b[0:rows, :])
        nisa.dma_copy(dst=y[r0:r0 + rows, :], src=yt)
    return y


def rmsnorm_ref(x, w, eps=1e-6):
    x = f32(x)
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + np.float32(eps)) * f32(w).reshape(1, -1)


def rmsnorm_inputs(seed=0, n=300, d=512, dtype=None, eps=1e-6):
    dtype = dtype or BF16
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, d)).astype(dtype), (1.0 + 0.1 * rng.standard_normal(d)).astype(dtype), eps)


# --------------------------------------------------------------------------------------------------
# LayerNorm
# --------------------------------------------------------------------------------------------------


def _mean_var(xt, rows, d):
    """[rows, 2] fp32 tile (mean, population variance) of the rows of xt [rows, d]."""
    mv = nl.ndarray((rows, 2), nl.float32, buffer=nl.sbuf)
    if hasattr(nisa, "bn_stats") and hasattr(nisa, "bn_aggr"):
        nch = cdiv(d, BN_FMAX)
        st = nl.ndarray((rows, nch * 6), nl.float32, buffer=nl.sbuf)
        for c in nl.affine_range(nch):
            c0 = c * BN_FMAX
            nisa.bn_stats(dst=st[:, c * 6:(c + 1) * 6], data=xt[:, c0:min(d, c0 + BN_FMAX)])
        nisa.bn_aggr(dst=mv, data=st)
        return mv
    # fallback (Tier 1): sum and sum of squares on ScalarE
    junk = nl.ndarray((rows, d), nl.float32, buffer=nl.sbuf)
    s1 = nl.ndarray((rows, 1), nl.float32, buffer=nl.sbuf)
    s2 = nl.ndarray((rows, 1), nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=junk, op=nl.copy, data=xt, reduce_op=nl.add, reduce_res=s1,
                    reduce_cmd=nisa.reduce_cmd.reset_reduce)
    nisa.activation(dst=junk, op=nl.square, data=xt, reduce_op=nl.add, reduce_res=s2,
                    reduce_cmd=nisa.reduce_cmd.reset_reduce)
    nisa.tensor_scalar(dst=mv[:, 0:1], data=s1, op0=nl.multiply, operand0=1.0 / d)
    m2 = nl.ndarray((rows, 1), nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=m2, data1=mv[:, 0:1], data2=mv[:, 0:1], op=nl.multiply)
    # var = s2 / d - mean^2
    nisa.scalar_tensor_tensor(dst=mv[:, 1:2], data=s2, op0=nl.multiply, operand0=1.0 / d, op1=nl.subtract,
                              operand1=m2)
    return mv


@nki.jit
def layernorm(x, gamma, beta, eps=1e-5):
    """y = (x - mean) / sqrt(var + eps) * gamma + beta over the last dim of x [N, D]."""
    n, d = x.shape
    y = nl.ndarray((n, d), x.dtype, buffer=nl.shared_hbm)
    g_b = broadcast_row(gamma, d)
    b_b = broadcast_row(beta, d)
    for r0, rows in row_blocks(n):
        xt = nl.ndarray((rows, d), x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=xt, src=x[r0:r0 + rows, :])
        mv = _mean_var(xt, rows, d)
        rstd = nl.ndarray((rows, 1), nl.float32, buffer=nl.sbuf)
        _rstd(rstd, mv[:, 1:2], rows, eps)
        t = nl.ndarray((rows, d), nl.float32, buffer=nl.sbuf)
        # t = (x - mean) * gamma; y = t * rstd + beta
        nisa.scalar_tensor_tensor(dst=t, data=xt, op0=nl.subtract, operand0=mv[:, 0:1], op1=nl.multiply,
                                  operand1=g_b[0:rows, :])
        yt = nl.ndarray((rows, d), x.dtype, buffer=nl.sbuf)
        nisa.scalar_tensor_tensor(dst=yt, data=t, op0=nl.multiply, operand0=rstd, op1=nl.add,
                                  operand1=b_b[0:rows, :])
        nisa.dma_copy(dst=y[r0:r0 + rows, :], src=yt)
    return y


def layernorm_ref(x, gamma, beta, eps=1e-5):
    x = f32(x)
    m = x.mean(axis=-1, keepdims=True)
    v = ((x - m) ** 2).mean(axis=-1, keepdims=True)
    return (x - m) / np.sqrt(v + np.float32(eps)) * f32(gamma).reshape(1, -1) + f32(beta).reshape(1, -1)


def layernorm_inputs(seed=0, n=300, d=768, dtype=None, eps=1e-5):
    dtype = dtype or BF16
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((n, d)) * 2 + 0.5).astype(dtype)
    return (x, (1.0 + 0.1 * rng.standard_normal(d)).astype(dtype), (0.1 * rng.standard_normal(d)).astype(dtype), eps)
