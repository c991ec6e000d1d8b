"""Dependencies through HBM between DMAs of other bytes (docs/timing-model.md "DMA accesses of other bytes in HBM"
and "List scheduling"), end to end from a Beta-1 kernel written the way public in-place kernels are (an optimizer
step or a KV-cache update over a ``[128, N]`` view, one column block at a time):

- the load of block c + 1 neither waits for the store of block c to finish (the simulator's RAW on other bytes of
  the same 4 KiB dependency chunks) nor is ordered after it by the list scheduler (the same 64 KiB chunks of its
  window): the in-place loop prefetches like the out-of-place one and takes about its time;
- a real dependency through HBM between blocks (block c reads what block c - 1 stored) is kept: the results are
  numpy's, and each block waits for the previous store.
"""
import numpy as np
import pytest

from conftest import require_core, run_clean  # noqa: E402

_core, ml_dtypes = require_core()


@pytest.fixture(scope="module")
def kernels(b1):
    nki, nl, _ = b1
    W = 512

    @nki.jit
    def scale_inplace(x):
        i_p = nl.arange(128)[:, None]
        i_f = nl.arange(W)[None, :]
        for c in nl.affine_range(x.shape[1] // W):
            t = nl.load(x[i_p, c * W + i_f])
            nl.store(x[i_p, c * W + i_f], value=nl.multiply(t, 2.0))
        return x

    @nki.jit
    def scale_out_of_place(x):
        y = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        i_p = nl.arange(128)[:, None]
        i_f = nl.arange(W)[None, :]
        for c in nl.affine_range(x.shape[1] // W):
            t = nl.load(x[i_p, c * W + i_f])
            nl.store(y[i_p, c * W + i_f], value=nl.multiply(t, 2.0))
        return y

    @nki.jit
    def running_blocks(x):
        """x[:, c] += x[:, c - 1] in place, block after block: block c reads what block c - 1 stored."""
        i_p = nl.arange(128)[:, None]
        i_f = nl.arange(W)[None, :]
        for c in nl.sequential_range(1, x.shape[1] // W):
            prev = nl.load(x[i_p, (c - 1) * W + i_f])
            cur = nl.load(x[i_p, c * W + i_f])
            nl.store(x[i_p, c * W + i_f], value=nl.add(cur, prev))
        return x

    return scale_inplace, scale_out_of_place, running_blocks


@pytest.mark.parametrize("blocks", [8, 32])
def test_in_place_column_blocks_prefetch_like_out_of_place(kernels, blocks):
    """[128, 512 blocks] fp32, x * 2 in place against out of place: the same values, and the in-place loop within
    15 % of the out-of-place one (both DMA-bound: 2 x 256 KiB per block on the DMA engines). Before the two rules
    the in-place loop took 2.2x (8 blocks: 32,524 against 14,698 ns): each load waited for the previous block's
    store to finish, and could not be issued before it."""
    inplace, outplace, _ = kernels
    x = np.random.default_rng(blocks).standard_normal((128, 512 * blocks)).astype(np.float32)
    got = run_clean(inplace, x.copy())
    np.testing.assert_array_equal(got, x * 2)
    np.testing.assert_array_equal(run_clean(outplace, x), x * 2)
    t_in = inplace.last_profile.total_time_ns
    t_out = outplace.last_profile.total_time_ns
    assert t_in < 1.15 * t_out, (t_in, t_out)
    # the same HBM traffic either way: every block read once and written once
    for k in (inplace, outplace):
        assert k.last_profile.stat("memory.hbm_read_bytes") == x.nbytes
        assert k.last_profile.stat("memory.hbm_write_bytes") == x.nbytes


def test_a_dependency_between_blocks_through_hbm_is_kept(kernels):
    """x[:, c] += x[:, c - 1]: a prefix sum over the blocks, each block loading the previous block's stored result.
    The values are numpy's cumulative sum (the list scheduler keeps the store of block c - 1 before the load of it),
    and the chain makes it slower than the independent in-place loop of the same size (each step waits for a store
    to finish, then loads)."""
    inplace, _, running = kernels
    blocks = 8
    x = np.random.default_rng(7).standard_normal((128, 512 * blocks)).astype(np.float32)
    got = run_clean(running, x.copy())
    want = np.cumsum(x.reshape(128, blocks, 512).astype(np.float64), axis=1).reshape(128, -1)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    run_clean(inplace, x.copy())
    assert running.last_profile.total_time_ns > 1.5 * inplace.last_profile.total_time_ns
