"""Element-wise kernels."""
from __future__ import annotations

import numpy as np

from nsim import nki
import nsim.nki.language as nl
import nsim.nki.isa as nisa

from ._common import P, f32


@nki.jit
def tensor_add(a, b):
    """out = a + b for a, b of shape [N * 128, F] (same dtype)."""
    n, f = a.shape
    assert n % P == 0, "tensor_add: rows must be a multiple of 128, got {}".format(n)
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(n // P):
        at = nl.ndarray((P, f), a.dtype, buffer=nl.sbuf)
        bt = nl.ndarray((P, f), b.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=at, src=a[i * P:(i + 1) * P, :])
        nisa.dma_copy(dst=bt, src=b[i * P:(i + 1) * P, :])
        ct = nl.ndarray((P, f), a.dtype, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=ct, data1=at, data2=bt, op=nl.add)
        nisa.dma_copy(dst=out[i * P:(i + 1) * P, :], src=ct)
    return out


def tensor_add_ref(a, b):
    return f32(a) + f32(b)


def tensor_add_inputs(seed=0, shape=(256, 512), dtype=np.float32):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape).astype(dtype), rng.standard_normal(shape).astype(dtype))
