"""SwiGLU MLP: out = (silu(x @ W_gate) * (x @ W_up)) @ W_down (bf16 operands, fp32 PSUM accumulation).

Port of examples/gen_examples.py:swiglu. The contraction runs over partitions, so x is transposed once
to x^T [D, T] and the hidden activation is produced directly transposed, h^T [F, T] (stored bf16), which
is the stationary operand of the down projection (no transpose before W_down).
"""
from __future__ import annotations

import numpy as np

from nsim import nki
import nsim.nki.language as nl
import nsim.nki.isa as nisa

from ._common import P, PSUM_FMAX, BF16, cdiv, f32, bf16_round


@nki.jit
def swiglu(x, w_gate, w_up, w_down):
    """x [T, D], w_gate / w_up [D, F], w_down [F, D] -> out [T, D] (x.dtype). T, D, F multiples of 128,
    T <= 512."""
    t, d = x.shape
    f = w_gate.shape[1]
    assert t % P == 0 and d % P == 0 and f % P == 0 and t <= PSUM_FMAX, "swiglu: bad shapes {} {}".format(
        x.shape, w_gate.shape)
    nt, nd, nf = t // P, d // P, f // P
    out = nl.ndarray((t, d), x.dtype, buffer=nl.shared_hbm)

    wg = nl.ndarray((P, nd, f), w_gate.dtype, buffer=nl.sbuf)  # W_gate rows 128*c + p
    wu = nl.ndarray((P, nd, f), w_up.dtype, buffer=nl.sbuf)
    wd = nl.ndarray((P, nf, d), w_down.dtype, buffer=nl.sbuf)  # W_down rows 128*g + p
    for c in nl.affine_range(nd):
        nisa.dma_copy(dst=wg[:, c, :], src=w_gate[c * P:(c + 1) * P, :])
        nisa.dma_copy(dst=wu[:, c, :], src=w_up[c * P:(c + 1) * P, :])
    for g in nl.affine_range(nf):
        nisa.dma_copy(dst=wd[:, g, :], src=w_down[g * P:(g + 1) * P, :])

    # x^T [D, T] by 128x128 TensorE transposes
    x_t = nl.ndarray((P, nd, t), x.dtype, buffer=nl.sbuf)  # x^T rows (d) 128*c + p
    for ti in nl.affine_range(nt):
        xr = nl.ndarray((P, d), x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=xr, src=x[ti * P:(ti + 1) * P, :])
        for c in nl.affine_range(nd):
            tp = nl.ndarray((P, P), x.dtype, buffer=nl.psum)
            nisa.nc_transpose(dst=tp, data=xr[:, c * P:(c + 1) * P])
            nisa.tensor_copy(dst=x_t[:, c, ti * P:(ti + 1) * P], src=tp)

    # gate^T / up^T [128 f, T] = W[:, f-block]^T @ x^T (K = D tiled); h^T = silu(gate^T) * up^T (bf16)
    h_t = nl.ndarray((P, nf, t), x.dtype, buffer=nl.sbuf)
    for g in nl.affine_range(nf):
        gate = nl.ndarray((P, t), nl.float32, buffer=nl.psum)
        up = nl.ndarray((P, t), nl.float32, buffer=nl.psum)
        for c in nl.sequential_range(nd):
            nisa.nc_matmul(dst=gate, stationary=wg[:, c, g * P:(g + 1) * P], moving=x_t[:, c, :],
                           accumulate=c > 0)
            nisa.nc_matmul(dst=up, stationary=wu[:, c, g * P:(g + 1) * P], moving=x_t[:, c, :],
                           accumulate=c > 0)
        sg = nl.ndarray((P, t), nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=sg, op=nl.silu, data=gate)
        nisa.tensor_tensor(dst=h_t[:, g, :], data1=sg, data2=up, op=nl.multiply)

    # out [128 t, D] = h[t-block, :] @ W_down (K = F tiled), D in <= 512 chunks
    for ti in nl.affine_range(nt):
        o_t = nl.ndarray((P, d), x.dtype, buffer=nl.sbuf)
        for dc in nl.affine_range(cdiv(d, PSUM_FMAX)):
            d0 = dc * PSUM_FMAX
            dsz = min(PSUM_FMAX, d - d0)
            po = nl.ndarray((P, dsz), nl.float32, buffer=nl.psum)
            for g in nl.sequential_range(nf):
                nisa.nc_matmul(dst=po, stationary=h_t[:, g, ti * P:(ti + 1) * P], moving=wd[:, g, d0:d0 + dsz],
                               accumulate=g > 0)
            nisa.tensor_copy(dst=o_t[:, d0:d0 + dsz], src=po)
        nisa.dma_copy(dst=out[ti * P:(ti + 1) * P, :], src=o_t)
    return out


def _silu(x):
    return x / (np.float32(1) + np.exp(-x))


def swiglu_ref(x, w_gate, w_up, w_down):
    x, wg, wu, wd = (f32(a) for a in (x, w_gate, w_up, w_down))
    h = bf16_round(_silu(x @ wg) * (x @ wu))  # the kernel keeps h in bf16 (the down-projection operand)
    return h @ wd


def swiglu_inputs(seed=0, t=256, d=256, f=512):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((t, d)).astype(BF16)
    wg = (rng.standard_normal((d, f)) / np.sqrt(d)).astype(BF16)
    wu = (rng.standard_normal((d, f)) / np.sqrt(d)).astype(BF16)
    wd = (rng.standard_normal((f, d)) / np.sqrt(f)).astype(BF16)
    return (x, wg, wu, wd)
