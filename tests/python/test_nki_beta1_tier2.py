"""Beta-1 (value-returning) forms of the Tier-2 ``nki.isa`` instructions (spec §2.2 "Beta 1" signatures),
written like Beta-1 kernels (``nsim.compat.install()``; ``import neuronxcc.nki``) and checked against numpy."""

import numpy as np
import pytest

from conftest import require_core  # noqa: E402

_core, ml_dtypes = require_core()


BF16 = ml_dtypes.bfloat16


from numeric_helpers import close as _close, rand as _rand  # noqa: E402


def test_dma_transpose(b1):
    nki, nl, nisa = b1

    @nki.jit
    def k(a):
        out = nl.ndarray((a.shape[1], a.shape[0]), a.dtype, buffer=nl.shared_hbm)
        out2 = nl.ndarray((a.shape[1], a.shape[0]), nl.float32, buffer=nl.shared_hbm)
        t = nisa.dma_transpose(a)  # HBM -> SBUF
        assert tuple(t.shape) == (a.shape[1], a.shape[0])
        nl.store(out, t)
        x = nl.load(a)
        nl.store(out2, nisa.dma_transpose(x, axes=(1, 0), dtype=nl.float32))
        return out, out2

    for dtype in (np.float32, BF16):
        a = _rand((64, 96), dtype, seed=1)
        o1, o2 = k(a)
        np.testing.assert_array_equal(np.asarray(o1, np.float32), np.asarray(a, np.float32).T)
        np.testing.assert_array_equal(o2, np.asarray(a, np.float32).T)


def test_dma_transpose_of_an_integer_indexed_hbm_view(b1):
    """The 2-D part of ``v[b, h]`` transposed (``nl.load_transpose2d(v[0, 1][:, cols])`` and
    ``nisa.dma_transpose(v[0, 1, :, cols])``): before, the view's rows were its leading integer-indexed dim
    (one row of 128 x 128) and NSIM-E310 refused it."""
    nki, nl, nisa = b1

    @nki.jit
    def k(v):
        out = nl.ndarray((2, 128, 64), v.dtype, buffer=nl.shared_hbm)
        vt = nl.load_transpose2d(v[0, 1][:, nl.ds(256, 128)])
        nl.store(out[0], vt[:, 0:64])
        nl.store(out[1], nisa.dma_transpose(v[0, 1, 0:64, nl.ds(128, 128)]))
        return out

    v = _rand((1, 2, 128, 512), np.float32, seed=3)
    for config in ("trn1", "trn2"):
        got = k.options(config=config)(v)
        np.testing.assert_array_equal(got[0], v[0, 1][:, 256:384].T[:, 0:64])
        np.testing.assert_array_equal(got[1], v[0, 1, 0:64, 128:256].T)


def test_iota_and_reciprocal(b1):
    nki, nl, nisa = b1

    @nki.jit
    def k(a):
        out = nl.ndarray((2, 128, 64), nl.float32, buffer=nl.shared_hbm)
        nl.store(out[0], nisa.iota(nl.arange(128)[:, None] * 3 + nl.arange(64)[None, :] * 2 + 5, nl.float32))
        nl.store(out[1], nisa.reciprocal(nl.load(a)))
        return out

    a = _rand((128, 64), seed=2, lo=0.5, hi=2.0)
    got = k(a)
    np.testing.assert_array_equal(got[0], np.add.outer(np.arange(128) * 3, np.arange(64) * 2 + 5))
    _close(got[1], 1.0 / a)


@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_scalar_tensor_tensor(b1, dtype):
    nki, nl, nisa = b1

    @nki.jit
    def k(x, y, v):
        out = nl.ndarray((2,) + x.shape, x.dtype, buffer=nl.shared_hbm)
        xt, yt, vt = nl.load(x), nl.load(y), nl.load(v)
        r = nisa.scalar_tensor_tensor(data=xt, op0=nl.multiply, operand0=2.5, op1=nl.add, operand1=yt)
        assert r.dtype == xt.dtype
        nl.store(out[0], r)
        nl.store(out[1], nisa.scalar_tensor_tensor(data=xt, op0=nl.subtract, operand0=vt, op1=nl.subtract,
                                                   operand1=yt, reverse0=True, reverse1=True))
        return out

    x, y, v = _rand((128, 64), dtype, 3), _rand((128, 64), dtype, 4), _rand((128, 1), dtype, 5)
    xf, yf, vf = (np.asarray(t, np.float32) for t in (x, y, v))
    got = k(x, y, v)
    _close(got[0], xf * 2.5 + yf, dtype)
    _close(got[1], yf - (vf - xf), dtype)


def test_activation_reduce(b1):
    nki, nl, nisa = b1

    @nki.jit
    def k(x, b):
        out = nl.ndarray(x.shape, nl.float32, buffer=nl.shared_hbm)
        sums = nl.ndarray((x.shape[0], 1), nl.float32, buffer=nl.shared_hbm)
        s = nl.ndarray((x.shape[0], 1), nl.float32, buffer=nl.sbuf)
        e = nisa.activation_reduce(nl.exp, nl.load(x), reduce_op=nl.add, reduce_res=s, bias=nl.load(b),
                                   scale=0.5)
        nl.store(out, e)
        nl.store(sums, s)
        return out, sums

    x, b = _rand((128, 200), seed=6), _rand((128, 1), seed=7)
    e, s = k(x, b)
    want = np.exp(x * 0.5 + b)
    _close(e, want)
    np.testing.assert_allclose(s, want.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-4)


def test_activation_reduce_masked(b1):
    nki, nl, nisa = b1

    @nki.jit
    def k(x):
        out = nl.ndarray(x.shape, nl.float32, buffer=nl.shared_hbm)
        sums = nl.ndarray((x.shape[0], 1), nl.float32, buffer=nl.shared_hbm)
        i_p = nl.arange(128)[:, None]
        s = nl.zeros((128, 1), nl.float32, buffer=nl.sbuf)
        e = nl.zeros((128, 64), nl.float32, buffer=nl.sbuf)
        e[...] = nisa.activation_reduce(nl.copy, nl.load(x), reduce_op=nl.add, reduce_res=s, mask=(i_p < 100))
        nl.store(out, e)
        nl.store(sums, s)
        return out, sums

    x = _rand((128, 64), seed=8)
    e, s = k(x)
    _close(e[:100], x[:100])
    np.testing.assert_allclose(s[:100, 0], x[:100].sum(axis=1), rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(s[100:], 0)


@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_affine_select_causal(b1, dtype):
    nki, nl, nisa = b1

    @nki.jit
    def k(x):
        out = nl.ndarray((3,) + x.shape, x.dtype, buffer=nl.shared_hbm)
        i_q = nl.arange(x.shape[0])[:, None]
        i_k = nl.arange(x.shape[1])[None, :]
        xt = nl.load(x)
        nl.store(out[0], nisa.affine_select(i_q >= i_k, xt, -9984.0))
        nl.store(out[1], nisa.affine_select(i_k == i_q + 2, xt, 0.0))
        i_p, i_f = nl.mgrid[0:x.shape[0], 0:x.shape[1]]
        nl.store(out[2], nisa.affine_select(4 + i_f * 2 < i_p, xt, nl.fp32.min, dtype=x.dtype))
        return out

    x = _rand((128, 96), dtype, seed=9)
    xf = np.asarray(x, np.float32)
    q = np.arange(128)[:, None]
    kk = np.arange(96)[None, :]
    got = k(x)
    _close(got[0], np.where(q >= kk, xf, -9984.0), dtype)
    _close(got[1], np.where(kk == q + 2, xf, 0.0), dtype)
    g2 = np.asarray(got[2], np.float32)
    keep = 4 + 2 * kk < q
    _close(g2[np.broadcast_to(keep, g2.shape)], xf[np.broadcast_to(keep, xf.shape)], dtype)
    assert np.all(g2[~np.broadcast_to(keep, g2.shape)] <= np.float32(-3.4e38))


@pytest.mark.filterwarnings("ignore:NSIM-W509")  # partition starts the hardware does not allow
def test_affine_select_masked_and_errors(b1):
    nki, nl, nisa = b1

    @nki.jit
    def k(x):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        i_p = nl.arange(128)[:, None]
        i_f = nl.arange(64)[None, :]
        m = (i_p >= 32) & (i_f < 48)
        r = nisa.affine_select(i_p >= i_f, nl.load(x), -1.0, mask=m)  # only the mask's rectangle is written
        nl.store(out[i_p, i_f], r, mask=m)
        return out

    x = _rand((128, 64), seed=10, lo=1.0, hi=2.0)
    q, kk = np.arange(128)[:, None], np.arange(64)[None, :]
    want = np.where(q >= kk, x, -1.0)
    _close(k(x)[32:, :48], want[32:, :48])

    @nki.jit
    def bad(x):
        i_p = nl.arange(128)[:, None]
        i_f = nl.arange(64)[None, :]
        return nisa.affine_select((i_p >= i_f) & (i_f < 3), nl.load(x), 0.0)

    with pytest.raises(nki.KernelError, match="single comparison"):
        bad(x)


def test_nc_stream_shuffle(b1):
    nki, nl, nisa = b1

    @nki.jit
    def k(x):
        out = nl.ndarray((2,) + x.shape, x.dtype, buffer=nl.shared_hbm)
        xt = nl.load(x)
        b = nl.ndarray((32, x.shape[1]), x.dtype, buffer=nl.sbuf)
        assert nisa.nc_stream_shuffle(xt[0:1, :], b, [0] * 32) is None  # broadcast row 0 to 32 partitions
        r = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
        nisa.nc_stream_shuffle(src=xt, dst=r, shuffle_mask=list(range(31, -1, -1)))
        nl.store(out[0, 0:32, :], b)
        nl.store(out[1], r)
        return out

    x = _rand((128, 16), seed=11)
    got = k(x)
    np.testing.assert_array_equal(got[0, 0:32], np.broadcast_to(x[0:1], (32, 16)))
    perm = np.concatenate([q * 32 + np.arange(31, -1, -1) for q in range(4)])
    np.testing.assert_array_equal(got[1], x[perm])


@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_tensor_tensor_scan(b1, dtype):
    nki, nl, nisa = b1

    @nki.jit
    def k(a, b, init):
        out = nl.ndarray((2,) + a.shape, nl.float32, buffer=nl.shared_hbm)
        at, bt = nl.load(a), nl.load(b)
        s = nisa.tensor_tensor_scan(at, bt, nl.load(init), nl.multiply, nl.add, dtype=nl.float32)
        nl.store(out[0], s)
        nl.store(out[1], nisa.tensor_tensor_scan(at, bt, 0.0, np.multiply, np.add, dtype=nl.float32))
        return out

    a, b = _rand((128, 32), dtype, 12, 0.0, 1.0), _rand((128, 32), dtype, 13)
    init = _rand((128, 1), np.float32, 14)
    af, bf = np.asarray(a, np.float32), np.asarray(b, np.float32)
    got = k(a, b, init)
    for i0, g in ((init[:, 0], got[0]), (np.zeros(128, np.float32), got[1])):
        s = i0.copy()
        want = np.empty_like(af)
        for i in range(af.shape[1]):
            s = af[:, i] * s + bf[:, i]
            want[:, i] = s
        _close(g, want)


def test_tensor_scalar_reduce(b1):
    nki, nl, nisa = b1

    @nki.jit
    def k(x, v):
        out = nl.ndarray(x.shape, nl.float32, buffer=nl.shared_hbm)
        red = nl.ndarray((3, x.shape[0], 1), nl.float32, buffer=nl.shared_hbm)
        xt = nl.load(x)
        r0 = nl.ndarray((x.shape[0], 1), nl.float32, buffer=nl.sbuf)
        r1 = nl.ndarray((x.shape[0], 1), nl.float32, buffer=nl.sbuf)
        r2 = nl.ndarray((x.shape[0], 1), nl.float32, buffer=nl.sbuf)
        y = nisa.tensor_scalar_reduce(data=xt, op0=nl.multiply, operand0=nl.load(v), reduce_op=nl.add,
                                      reduce_res=r0)
        nisa.tensor_scalar_reduce(data=xt, op0=nl.add, operand0=1.0, reduce_op=nl.maximum, reduce_res=r1)
        # Beta 1 also reduces by subtract (nki-api.md 2.2; the new dialect rejects it): 0 - y0 - y1 - ...
        nisa.tensor_scalar_reduce(data=xt, op0=nl.multiply, operand0=2.0, reduce_op=nl.subtract, reduce_res=r2)
        nl.store(out, y)
        nl.store(red[0], r0)
        nl.store(red[1], r1)
        nl.store(red[2], r2)
        return out, red

    x, v = _rand((128, 80), seed=15), _rand((128, 1), seed=16)
    y, red = k(x, v)
    _close(y, x * v)
    np.testing.assert_allclose(red[0], (x * v).sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-4)
    _close(red[1], (x + 1).max(axis=1, keepdims=True))
    np.testing.assert_allclose(red[2], -(2 * x).sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_bn_stats_aggr(b1, dtype):
    nki, nl, nisa = b1

    @nki.jit
    def k(x):
        out = nl.ndarray((x.shape[0], 2), nl.float32, buffer=nl.shared_hbm)
        st_out = nl.ndarray((x.shape[0], 6), nl.float32, buffer=nl.shared_hbm)
        xt = nl.load(x)
        st = nisa.bn_stats(xt, dtype=nl.float32)
        assert tuple(st.shape) == (x.shape[0], 6)
        mv = nisa.bn_aggr(st)
        assert tuple(mv.shape) == (x.shape[0], 2) and mv.dtype == np.float32
        nl.store(out, mv)
        nl.store(st_out, st)
        return out, st_out

    x = _rand((128, 300), dtype, 17, 0.0, 4.0)
    xf = np.asarray(x, np.float32)
    mv, st = k(x)
    _close(mv[:, 0], xf.mean(axis=1))
    np.testing.assert_allclose(mv[:, 1], xf.var(axis=1), rtol=1e-4, atol=1e-5)
    e, o = xf[:, 0::2], xf[:, 1::2]
    want = np.stack([np.full(128, e.shape[1]), e.mean(1), e.var(1) * e.shape[1],
                     np.full(128, o.shape[1]), o.mean(1), o.var(1) * o.shape[1]], axis=1)
    np.testing.assert_allclose(st, want, rtol=1e-4, atol=1e-4)


def test_tensor_copy_predicated(b1):
    nki, nl, nisa = b1

    @nki.jit
    def k(s, d, p):
        out = nl.ndarray((3,) + s.shape, nl.float32, buffer=nl.shared_hbm)
        st, pt = nl.load(s), nl.load(p)
        d0, d1, d2 = nl.load(d), nl.load(d), nl.load(d)
        assert nisa.tensor_copy_predicated(src=st, dst=d0, predicate=pt) is None
        nisa.tensor_copy_predicated(src=st, dst=d1, predicate=pt, reverse_pred=True)
        i_p = nl.arange(128)[:, None]
        nisa.tensor_copy_predicated(src=st, dst=d2, predicate=pt, mask=(i_p < 64))
        nl.store(out[0], d0)
        nl.store(out[1], d1)
        nl.store(out[2], d2)
        return out

    s, d = _rand((128, 48), seed=18), _rand((128, 48), seed=19)
    p = (np.random.default_rng(20).uniform(size=(128, 48)) > 0.5).astype(np.uint8)
    got = k(s, d, p)
    np.testing.assert_array_equal(got[0], np.where(p != 0, s, d))
    np.testing.assert_array_equal(got[1], np.where(p == 0, s, d))
    want = np.where(p != 0, s, d)
    want[64:] = d[64:]
    np.testing.assert_array_equal(got[2], want)


def test_range_select(b1):
    nki, nl, nisa = b1

    @nki.jit
    def k(x, lo, hi):
        out = nl.ndarray(x.shape, nl.float32, buffer=nl.shared_hbm)
        mx = nl.ndarray((x.shape[0], 1), nl.float32, buffer=nl.shared_hbm)
        r = nl.ndarray((x.shape[0], 1), nl.float32, buffer=nl.sbuf)
        y = nisa.range_select(on_true_tile=nl.load(x), comp_op0=nl.greater_equal, comp_op1=nl.less,
                              bound0=nl.load(lo), bound1=nl.load(hi), reduce_cmd=nisa.reduce_cmd.reset_reduce,
                              reduce_res=r, reduce_op=np.amax, range_start=10)
        nl.store(out, y)
        nl.store(mx, r)
        return out, mx

    x = _rand((128, 64), seed=21)
    rng = np.random.default_rng(22)
    lo = rng.integers(10, 40, (128, 1)).astype(np.float32)
    hi = lo + rng.integers(1, 30, (128, 1)).astype(np.float32)
    y, mx = k(x, lo, hi)
    idx = 10 + np.arange(64)[None, :]
    keep = (idx >= lo) & (idx < hi)
    want = np.where(keep, x, np.float32(-3.4028235e38))
    np.testing.assert_array_equal(y, want)
    _close(mx, want.max(axis=1, keepdims=True))


def test_dst_keyword_fallback(b1):
    nki, nl, nisa = b1

    @nki.jit
    def k(x):
        out = nl.ndarray((x.shape[0], 2), nl.float32, buffer=nl.shared_hbm)
        st = nl.ndarray((x.shape[0], 6), nl.float32, buffer=nl.sbuf)
        mv = nl.ndarray((x.shape[0], 2), nl.float32, buffer=nl.sbuf)
        assert nisa.bn_stats(nl.load(x), dst=st) is None
        assert nisa.bn_aggr(st, dst=mv) is None
        nl.store(out, mv)
        return out

    x = _rand((128, 100), seed=23)
    got = k(x)
    _close(got[:, 0], x.mean(axis=1))
    np.testing.assert_allclose(got[:, 1], x.var(axis=1), rtol=1e-4, atol=1e-5)


def test_range_select_defaults_and_mask(b1):
    """Beta-1 defaults (reduce_cmd idle, no reduce_res, on_false_value=fp32.min); a free-dim mask keeps the
    flattened index of the full tile (range_start shifted by the mask's first column)."""
    nki, nl, nisa = b1

    @nki.jit
    def k(x, lo, hi):
        out = nl.ndarray((2,) + x.shape, nl.float32, buffer=nl.shared_hbm)
        xt, b0, b1_ = nl.load(x), nl.load(lo), nl.load(hi)
        nl.store(out[0], nisa.range_select(on_true_tile=xt, comp_op0=nl.greater_equal, comp_op1=nl.less_equal,
                                           bound0=b0, bound1=b1_))
        i_p = nl.arange(128)[:, None]
        i_f = nl.arange(64)[None, :]
        m = (i_f >= 16) & (i_f < 40)
        r = nisa.range_select(on_true_tile=xt, comp_op0=nl.greater_equal, comp_op1=nl.less_equal, bound0=b0,
                              bound1=b1_, mask=m)
        nl.store(out[1, i_p, i_f], r, mask=m)
        return out

    x = _rand((128, 64), seed=24)
    rng = np.random.default_rng(25)
    lo = rng.integers(0, 40, (128, 1)).astype(np.float32)
    hi = lo + rng.integers(0, 30, (128, 1)).astype(np.float32)
    got = k(x, lo, hi)
    idx = np.arange(64)[None, :]
    want = np.where((idx >= lo) & (idx <= hi), x, np.float32(-3.4028235e38))
    np.testing.assert_array_equal(got[0], want)
    np.testing.assert_array_equal(got[1][:, 16:40], want[:, 16:40])


def test_masked_scan_and_scalar_reduce(b1):
    nki, nl, nisa = b1

    @nki.jit
    def k(a, b):
        out = nl.ndarray((2,) + a.shape, nl.float32, buffer=nl.shared_hbm)
        red = nl.ndarray((a.shape[0], 1), nl.float32, buffer=nl.shared_hbm)
        at, bt = nl.load(a), nl.load(b)
        i_p = nl.arange(128)[:, None]
        i_f = nl.arange(32)[None, :]
        m = i_p < 96
        s = nisa.tensor_tensor_scan(at, bt, 1.0, nl.multiply, nl.add, mask=m)
        rr = nl.zeros((128, 1), nl.float32, buffer=nl.sbuf)
        y = nisa.tensor_scalar_reduce(data=at, op0=nl.multiply, operand0=3.0, reduce_op=nl.add, reduce_res=rr,
                                      mask=m)
        nl.store(out[0, i_p, i_f], s, mask=m)
        nl.store(out[1, i_p, i_f], y, mask=m)
        nl.store(red, rr)
        return out, red

    a, b = _rand((128, 32), seed=26, lo=0.0, hi=1.0), _rand((128, 32), seed=27)
    got, red = k(a, b)
    s = np.ones(128, np.float32)
    want = np.empty_like(a)
    for i in range(32):
        s = a[:, i] * s + b[:, i]
        want[:, i] = s
    _close(got[0, :96], want[:96])
    _close(got[1, :96], 3 * a[:96])
    np.testing.assert_allclose(red[:96, 0], (3 * a[:96]).sum(axis=1), rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(red[96:], 0)
