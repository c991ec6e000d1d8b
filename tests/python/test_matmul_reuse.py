"""Matmuls that reuse a moving tile across stationaries, rewrite it (whole, or one element) between
products, and read PSUM right after a product: the results match numpy. (The simulator runs large
products behind the next instructions on a helper thread and keeps moving tiles converted while they
are unwritten: docs/isa.md, Numerics. These kernels are written to catch a stale tile or an early read.)"""
import numpy as np
import pytest

from conftest import require_core

_core, ml_dtypes = require_core()

from nsim import nki  # noqa: E402
import nsim.nki.isa as nisa  # noqa: E402
import nsim.nki.language as nl  # noqa: E402

BF16 = ml_dtypes.bfloat16
P = 128


@nki.jit
def reuse_then_rewrite(w, x, y):
    """out[i] = w[i].T @ (x for i < 2, y after, with y's element (5, 300) set to 100 for i = 3)."""
    out = nl.ndarray((4, P, 512), nl.float32, buffer=nl.shared_hbm)
    mv = nl.ndarray((P, 512), x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=mv, src=x)
    for i in nl.sequential_range(4):
        if i == 2:
            nisa.dma_copy(dst=mv, src=y)  # the whole moving tile rewritten
        if i == 3:
            nisa.memset(dst=mv[5:6, 300:301], value=100.0)  # one element of it
        st = nl.ndarray((P, P), w.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=st, src=w[i])
        ps = nl.ndarray((P, 512), nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=ps, stationary=st, moving=mv)
        res = nl.ndarray((P, 512), nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=res, src=ps)  # PSUM read right after the product
        nisa.dma_copy(dst=out[i], src=res)
    return out


@pytest.mark.filterwarnings("ignore:NSIM-W509")  # partition starts the hardware does not allow
@pytest.mark.parametrize("check", [False, True])  # the sanitizer on: products complete at once
def test_moving_tile_reused_and_rewritten_matches_numpy(check):
    rng = np.random.default_rng(3)
    w = rng.standard_normal((4, P, P)).astype(BF16)
    x = rng.standard_normal((P, 512)).astype(BF16)
    y = rng.standard_normal((P, 512)).astype(BF16)
    got = reuse_then_rewrite.options(check=check)(w, x, y)
    f = lambda a: a.astype(np.float32)  # noqa: E731
    y3 = f(y).copy()
    y3[5, 300] = 100.0
    want = np.stack([f(w[0]).T @ f(x), f(w[1]).T @ f(x), f(w[2]).T @ f(y), f(w[3]).T @ y3])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    # the single element changed column 300 of the last product alone
    d = np.abs(got[3] - f(w[3]).T @ f(y)) > 1e-3
    assert d[:, 300].any() and not np.delete(d, 300, axis=1).any()


@pytest.mark.parametrize("n", [512, 500])
@pytest.mark.parametrize("check", [False, True])
def test_accumulating_chain_matches_numpy(n, check):
    # 8 accumulating products into one PSUM tile from 8 moving tiles (each multiplied twice, by two
    # stationaries), with and without a column tail past the last 32-column block.
    @nki.jit
    def chain(a_t, b):
        out = nl.ndarray((2, P, n), nl.float32, buffer=nl.shared_hbm)
        bs = nl.ndarray((P, 8, n), b.dtype, buffer=nl.sbuf)
        for k in nl.affine_range(8):
            nisa.dma_copy(dst=bs[:, k, :], src=b[k * P:(k + 1) * P, :])
        for m in nl.affine_range(2):
            ps = nl.ndarray((P, n), nl.float32, buffer=nl.psum)
            for k in nl.sequential_range(8):
                st = nl.ndarray((P, P), a_t.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=st, src=a_t[k * P:(k + 1) * P, m * P:(m + 1) * P])
                nisa.nc_matmul(dst=ps, stationary=st, moving=bs[:, k, :], accumulate=k > 0)
            res = nl.ndarray((P, n), nl.float32, buffer=nl.sbuf)
            nisa.tensor_copy(dst=res, src=ps)
            nisa.dma_copy(dst=out[m], src=res)
        return out

    rng = np.random.default_rng(4)
    a_t = rng.standard_normal((8 * P, 2 * P)).astype(BF16)
    b = rng.standard_normal((8 * P, n)).astype(BF16)
    got = chain.options(check=check)(a_t, b)
    want = a_t.astype(np.float32).T @ b.astype(np.float32)
    np.testing.assert_allclose(got.reshape(2 * P, n), want, rtol=1e-4, atol=1e-3)
