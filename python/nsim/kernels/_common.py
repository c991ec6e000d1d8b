"""Shared helpers of the nsim.kernels library (used inside @nki.jit kernels while tracing)."""
from __future__ import annotations

import numpy as np

import nsim.nki.language as nl
import nsim.nki.isa as nisa

P = 128  #: partitions per tile
PSUM_FMAX = 512  #: fp32 elements of one PSUM bank per partition (nc_matmul moving free limit)
BN_FMAX = 512  #: bn_stats free-size limit

try:  # bf16 numpy dtype (references / input makers)
    import ml_dtypes as _ml

    BF16 = np.dtype(_ml.bfloat16)
except Exception:  # pragma: no cover
    BF16 = None


def cdiv(a, b):
    return -(-a // b)


def f32(a):
    return np.asarray(a).astype(np.float32)


def bf16_round(a):
    return np.asarray(a, dtype=np.float32).astype(BF16).astype(np.float32)


def broadcast_row(row_hbm, d, dtype=nl.float32):
    """A [P, d] fp32 SBUF tile whose every partition holds the 1-D HBM vector ``row_hbm`` ([d] or [1, d]).

    Partition broadcast on TensorE: ones[1, P] (stationary, K = 1) x row[1, d] (moving) -> PSUM [P, d],
    in <= 512-column chunks, evicted to SBUF (exact: 1 * w in fp32)."""
    row = nl.ndarray((1, d), row_hbm.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=row, src=row_hbm)
    ones = nl.ndarray((1, P), row_hbm.dtype, buffer=nl.sbuf)
    nisa.memset(dst=ones, value=1.0)
    out = nl.ndarray((P, d), dtype, buffer=nl.sbuf)
    for c in nl.affine_range(cdiv(d, PSUM_FMAX)):
        c0 = c * PSUM_FMAX
        n = min(PSUM_FMAX, d - c0)
        ps = nl.ndarray((P, n), nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=ps, stationary=ones, moving=row[:, c0:c0 + n])
        nisa.tensor_copy(dst=out[:, c0:c0 + n], src=ps)
    return out


def row_blocks(n):
    """(start, rows) of the <= 128-row blocks covering n rows (the last one may be ragged), as an
    nl.affine_range loop: the tracer keeps it as a kernel-IR loop (its first and last blocks peeled when the
    last one is ragged)."""
    for b in nl.affine_range(cdiv(n, P)):
        r0 = b * P
        yield r0, min(P, n - r0)
