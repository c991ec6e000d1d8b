"""Manual placement (compiler.md 4): ``ncc.sbuf/psum.mod_alloc``, ``.alloc(func)``, ``.auto_alloc()`` given
as ``buffer=`` are honoured — the tensor sits at the given address, and blocks the allocator maps to one
physical tile share its storage, overwrites included, as on hardware; ``compiler.strict`` turns an
overlap of live manual tiles from a warning into NSIM-E209."""
import sys

import numpy as np
import pytest

from conftest import require_core  # noqa: E402

_core, _ = require_core()

from nsim import compat  # noqa: E402

_PREFIXES = ("nki", "neuronxcc")


@pytest.fixture(scope="module")
def b1():
    """compat installed; yields (nki, nl, nisa, ncc); restores sys.modules afterwards."""
    was = compat.installed()
    before = {n for n in sys.modules if n.split(".", 1)[0] in _PREFIXES}
    compat.install()
    import neuronxcc.nki as nki
    import neuronxcc.nki.compiler as ncc
    import neuronxcc.nki.isa as nisa
    import neuronxcc.nki.language as nl

    yield nki, nl, nisa, ncc
    if not was:
        compat.uninstall()
        for n in [n for n in sys.modules if n.split(".", 1)[0] in _PREFIXES and n not in before]:
            sys.modules.pop(n, None)


def _allocs(kernel, *args):
    return [s["alloc"] for s in kernel.to_json(*args)["body"] if "alloc" in s]


def _blocks_kernel(nki, nl, buffer, load_all_first):
    """Four (128, 512) blocks of `a` through one block tensor, exp'd into `out`; either each block
    loaded and stored in turn, or all four loaded before any is stored."""

    @nki.jit
    def k(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        i_p, i_f = nl.mgrid[0:128, 0:512]
        t = nl.ndarray((4, nl.par_dim(128), 512), nl.float32, buffer=buffer)
        if load_all_first:
            for i in nl.sequential_range(4):
                t[i, i_p, i_f] = nl.load(a[i * 128 + i_p, i_f])
            for i in nl.sequential_range(4):
                nl.store(out[i * 128 + i_p, i_f], value=t[i, i_p, i_f])
        else:
            for i in nl.sequential_range(4):
                t[i, i_p, i_f] = nl.load(a[i * 128 + i_p, i_f])
                nl.store(out[i * 128 + i_p, i_f], value=nl.exp(t[i, i_p, i_f]))
        return out

    return k


def test_mod_alloc_places_and_rotates(b1):
    nki, nl, _, ncc = b1
    a = np.random.default_rng(0).standard_normal((512, 512)).astype(np.float32)
    k = _blocks_kernel(nki, nl, ncc.sbuf.mod_alloc(base_addr=4096, num_free_tiles=(2,)), False)
    # two physical (128, 512) fp32 tiles at byte 4096 of each partition, not four
    placed = [al for al in _allocs(k, a) if al.get("address") is not None]
    assert [(al["address"], al["shape"]) for al in placed] == [(4096, [128, 2, 512])]
    np.testing.assert_allclose(k(a), np.exp(a), rtol=1e-5)


def test_mod_alloc_shared_tiles_overwrite_like_hardware(b1):
    """Blocks 0 and 2 share a tile: loading all four before storing leaves blocks 2 and 3 in the first
    two output blocks, as on hardware; automatic placement keeps every block."""
    nki, nl, _, ncc = b1
    a = np.random.default_rng(1).standard_normal((512, 512)).astype(np.float32)
    shared = _blocks_kernel(nki, nl, ncc.sbuf.mod_alloc(base_addr=0, num_free_tiles=(2,)), True)(a)
    expect = np.concatenate([a[256:512], a[256:512]])
    np.testing.assert_array_equal(shared, expect)
    np.testing.assert_array_equal(_blocks_kernel(nki, nl, nl.sbuf, True)(a), a)
    np.testing.assert_array_equal(_blocks_kernel(nki, nl, ncc.sbuf.auto_alloc(), True)(a), a)


def test_alloc_function_gives_each_block_its_address(b1):
    nki, nl, _, ncc = b1
    a = np.random.default_rng(2).standard_normal((512, 512)).astype(np.float32)
    calls = []

    def place(idx, pdim_size, fdim_size):
        calls.append((idx, fdim_size))
        return 0, 8192 + (idx[0] % 2) * fdim_size  # (start partition, byte address): two tiles

    k = _blocks_kernel(nki, nl, ncc.sbuf.alloc(place), True)
    placed = [al for al in _allocs(k, a) if al.get("address") is not None]
    assert [(al["address"], al["shape"]) for al in placed] == [(8192, [128, 2, 512])]
    assert {c[0] for c in calls} == {(0,), (1,), (2,), (3,)} and {c[1] for c in calls} == {512 * 4}
    np.testing.assert_array_equal(k(a), np.concatenate([a[256:512], a[256:512]]))

    def uneven(idx, pdim_size, fdim_size):
        return 0, [0, 2048, 3072, 9000][idx[0]]

    with pytest.raises(ValueError, match="evenly spaced"):
        _blocks_kernel(nki, nl, ncc.sbuf.alloc(uneven), True).to_json(a)


def test_psum_mod_alloc_one_tile_per_bank(b1):
    """ncc.psum.mod_alloc(base_bank=2, num_bank_tiles=(2,)): (128, 128) fp32 tiles (512 B) each in its own
    2 KiB bank from bank 2: address 2 x 2048, slots padded to a bank."""
    nki, nl, nisa, ncc = b1

    @nki.jit
    def k(lhsT, rhs):
        out = nl.ndarray((4, 128, 128), nl.float32, buffer=nl.shared_hbm)
        ps = nl.ndarray((4, nl.par_dim(128), 128), nl.float32, buffer=ncc.psum.mod_alloc(base_bank=2,
                                                                                         num_bank_tiles=(2,)))
        lt = nl.load(lhsT)
        for i in nl.sequential_range(4):
            r = nl.load(rhs[i])
            ps[i] = nisa.nc_matmul(lt, r)
            nl.store(out[i], value=nl.copy(ps[i], dtype=nl.float32))
        return out

    rng = np.random.default_rng(3)
    lhsT = rng.standard_normal((128, 128)).astype(np.float32)
    rhs = rng.standard_normal((4, 128, 128)).astype(np.float32)
    placed = [al for al in _allocs(k, lhsT, rhs) if al.get("address") is not None]
    assert [(al["buffer"], al["address"], al["shape"]) for al in placed] == [("psum", 2 * 2048, [128, 2, 512])]
    got = k(lhsT, rhs)
    for i in range(4):
        np.testing.assert_allclose(got[i], lhsT.T @ rhs[i], rtol=1e-4, atol=1e-4)


def test_mod_alloc_fits_where_one_tile_per_block_does_not(b1):
    """16 blocks of (128, 8192) fp32 (32 KiB per partition each, 512 KiB in all) exceed SBUF (224 KiB per
    partition on trn2) when the blocks are all live; mod_alloc over 2 tiles uses 64 KiB."""
    import nsim
    nki, nl, _, ncc = b1

    def make(buffer):
        @nki.jit
        def k(a):
            out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
            t = nl.ndarray((16, nl.par_dim(128), 8192), nl.float32, buffer=buffer)
            for i in nl.sequential_range(16):
                t[i] = nl.load(a[i])
            for i in nl.sequential_range(16):
                nl.store(out[i], value=t[i])
            return out

        return k

    a = np.zeros((16, 128, 8192), np.float32)
    with pytest.raises(nsim.NsimError, match="NSIM-E204"):
        make(nl.sbuf)(a)
    _, prof = make(ncc.sbuf.mod_alloc(base_addr=0, num_free_tiles=(2,))).simulate(a)
    assert prof.stat("memory.sbuf_peak_bytes_per_partition") == 2 * 8192 * 4


def test_strict_turns_manual_overlap_into_an_error(capfd):
    """Two address= tiles on the same bytes, both live: a warning naming both (default), NSIM-E209 with
    compiler.strict."""
    import nsim
    from nsim import nki
    import nsim.nki.language as nl
    import nsim.nki.isa as nisa

    @nki.jit
    def k(x):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        a = nl.ndarray((128, 64), x.dtype, buffer=nl.sbuf, address=(0, 0))
        b = nl.ndarray((128, 64), x.dtype, buffer=nl.sbuf, address=(0, 128))
        nisa.dma_copy(dst=a, src=x)
        nisa.dma_copy(dst=b, src=x)
        nisa.tensor_tensor(dst=a, data1=a, data2=b, op=nl.add)
        nisa.dma_copy(dst=out, src=a)
        return out

    x = np.ones((128, 64), np.float32)
    np.testing.assert_allclose(k(x), 2 * x)  # nsim places the second tile elsewhere
    assert "over tile" in capfd.readouterr().err
    with pytest.raises(nsim.NsimError, match="NSIM-E209"):
        k.options(overrides={"compiler.strict": True})(x)
