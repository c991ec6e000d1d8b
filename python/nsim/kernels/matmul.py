"""Matrix multiplication and transpose on TensorE.

out[M, N] = a[M, K] @ b[K, N]: TensorE contracts over the partition dim (stationary [K<=128, M<=128],
moving [K, N<=512] -> PSUM fp32 [M, N] = stationary.T @ moving), so A tiles are transposed to A^T
tiles with nc_transpose (SBUF -> PSUM -> SBUF) and K is tiled by 128 with PSUM accumulation.
"""
from __future__ import annotations

import numpy as np

from nsim import nki
import nsim.nki.language as nl
import nsim.nki.isa as nisa

from ._common import P, PSUM_FMAX, BF16, cdiv, f32

#: SBUF bytes per partition the blocked matmul may keep resident (A^T and B)
_RESIDENT_BYTES = 96 * 1024


def _check_mm(a, b):
    m, k = a.shape
    k2, n = b.shape
    assert k == k2, "matmul: inner dims differ ({} vs {})".format(k, k2)
    assert m % P == 0 and k % P == 0, "matmul: M and K must be multiples of 128, got M={} K={}".format(m, k)
    return m, k, n


def _transpose_tile(dst, src):
    """dst[f, p] = src[p, f] for one <= 128x128 SBUF tile, via TensorE into PSUM and a VectorE eviction."""
    p, f = src.shape
    tp = nl.ndarray((f, p), src.dtype, buffer=nl.psum)
    nisa.nc_transpose(dst=tp, data=src)
    nisa.tensor_copy(dst=dst, src=tp)


@nki.jit
def matmul_naive(a, b):
    """out = a @ b (fp32). Every (m, n, k) tile is loaded (and A transposed) again: simple, DMA bound."""
    m, k, n = _check_mm(a, b)
    out = nl.ndarray((m, n), nl.float32, buffer=nl.shared_hbm)
    for mi in nl.affine_range(m // P):
        for ni in nl.affine_range(cdiv(n, PSUM_FMAX)):
            n0 = ni * PSUM_FMAX
            nsz = min(PSUM_FMAX, n - n0)
            ps = nl.ndarray((P, nsz), nl.float32, buffer=nl.psum)
            for ki in nl.sequential_range(k // P):
                at = nl.ndarray((P, P), a.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=at, src=a[mi * P:(mi + 1) * P, ki * P:(ki + 1) * P])
                a_t = nl.ndarray((P, P), a.dtype, buffer=nl.sbuf)
                _transpose_tile(a_t, at)
                bt = nl.ndarray((P, nsz), b.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=bt, src=b[ki * P:(ki + 1) * P, n0:n0 + nsz])
                nisa.nc_matmul(dst=ps, stationary=a_t, moving=bt, accumulate=ki > 0)
            res = nl.ndarray((P, nsz), nl.float32, buffer=nl.sbuf)
            nisa.tensor_copy(dst=res, src=ps)
            nisa.dma_copy(dst=out[mi * P:(mi + 1) * P, n0:n0 + nsz], src=res)
    return out


@nki.jit
def matmul_blocked(a, b):
    """out = a @ b (fp32). A^T (all of it) and B are made resident in SBUF once -- each A tile is loaded
    and transposed once, each B tile loaded once -- then every [128, <=512] output block is K-accumulated
    in PSUM from the resident tiles."""
    m, k, n = _check_mm(a, b)
    nk, nm = k // P, m // P
    isz = np.dtype(a.dtype).itemsize
    assert nk * (m + n) * isz <= _RESIDENT_BYTES, "matmul_blocked: A^T + B need {} B per partition (> {})".format(
        nk * (m + n) * isz, _RESIDENT_BYTES)
    out = nl.ndarray((m, n), nl.float32, buffer=nl.shared_hbm)
    a_t = nl.ndarray((P, nk, m), a.dtype, buffer=nl.sbuf)   # A^T: k rows 128*ki + p, all m columns
    b_sb = nl.ndarray((P, nk, n), b.dtype, buffer=nl.sbuf)  # B: k rows 128*ki + p
    for ki in nl.affine_range(nk):
        nisa.dma_copy(dst=b_sb[:, ki, :], src=b[ki * P:(ki + 1) * P, :])
    for mi in nl.affine_range(nm):
        a_row = nl.ndarray((P, k), a.dtype, buffer=nl.sbuf)  # one 128-row stripe of A, one DMA
        nisa.dma_copy(dst=a_row, src=a[mi * P:(mi + 1) * P, :])
        for ki in nl.affine_range(nk):
            _transpose_tile(a_t[:, ki, mi * P:(mi + 1) * P], a_row[:, ki * P:(ki + 1) * P])
    for mi in nl.affine_range(nm):
        for ni in nl.affine_range(cdiv(n, PSUM_FMAX)):
            n0 = ni * PSUM_FMAX
            nsz = min(PSUM_FMAX, n - n0)
            ps = nl.ndarray((P, nsz), nl.float32, buffer=nl.psum)
            for ki in nl.sequential_range(nk):
                nisa.nc_matmul(dst=ps, stationary=a_t[:, ki, mi * P:(mi + 1) * P], moving=b_sb[:, ki, n0:n0 + nsz],
                               accumulate=ki > 0)
            res = nl.ndarray((P, nsz), nl.float32, buffer=nl.sbuf)
            nisa.tensor_copy(dst=res, src=ps)
            nisa.dma_copy(dst=out[mi * P:(mi + 1) * P, n0:n0 + nsz], src=res)
    return out


def matmul_ref(a, b):
    return f32(a) @ f32(b)


matmul_naive_ref = matmul_ref
matmul_blocked_ref = matmul_ref


def matmul_inputs(seed=0, m=256, k=384, n=640):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((m, k)).astype(BF16), rng.standard_normal((k, n)).astype(BF16))


# --------------------------------------------------------------------------------------------------
# transpose
# --------------------------------------------------------------------------------------------------


@nki.jit
def transpose(x):
    """out = x.T for x [128 * m, 128 * n], by 128x128 TensorE transposes."""
    r, c = x.shape
    assert r % P == 0 and c % P == 0, "transpose: both dims must be multiples of 128, got {}".format(x.shape)
    out = nl.ndarray((c, r), x.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(r // P):
        row = nl.ndarray((P, c), x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=row, src=x[i * P:(i + 1) * P, :])
        for j in nl.affine_range(c // P):
            ot = nl.ndarray((P, P), x.dtype, buffer=nl.sbuf)
            _transpose_tile(ot, row[:, j * P:(j + 1) * P])
            nisa.dma_copy(dst=out[j * P:(j + 1) * P, i * P:(i + 1) * P], src=ot)
    return out


def transpose_ref(x):
    return f32(x).T


def transpose_inputs(seed=0, shape=(256, 384), dtype=None):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape).astype(dtype or BF16),)
