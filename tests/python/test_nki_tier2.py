"""The new NKI dialect, Tier 2: nisa Tier-2 instructions and the value-returning nl functions, each
traced to kernel.json, simulated and checked against a numpy reference."""
import numpy as np
import pytest

from conftest import require_core  # noqa: E402

_core, ml_dtypes = require_core()

from nsim import nki  # noqa: E402
import nsim.nki.language as nl  # noqa: E402
import nsim.nki.isa as nisa  # noqa: E402
from nki_helpers import load as _load, store as _store, rng as _rng  # noqa: E402

BF16 = ml_dtypes.bfloat16
F32 = dict(rtol=1e-5, atol=1e-5)
B16 = dict(rtol=1e-2, atol=1e-2)


def _ops(kernel):
    return [s["op"] for s in kernel.last_json["body"] if "op" in s]


# --------------------------------------------------------------------------------------------------
# nisa Tier 2
# --------------------------------------------------------------------------------------------------


def test_dma_transpose_2d():
    @nki.jit
    def k(x):
        p, f = x.shape
        t = nl.ndarray((f, p), x.dtype, buffer=nl.sbuf)
        nisa.dma_transpose(dst=t, src=x, name="tr")
        return _store(t)

    for dt in (np.float32, BF16):
        x = _rng(1).standard_normal((64, 96)).astype(dt)
        y = k(x)
        np.testing.assert_array_equal(y, x.T)
    assert "dma_transpose" in _ops(k)


def test_iota_pattern_values():
    @nki.jit
    def k(dummy):
        t = nl.ndarray((16, 3, 5), nl.int32, buffer=nl.sbuf)
        nisa.iota(dst=t, pattern=[[100, 3], [2, 5]], offset=7, channel_multiplier=1000)
        f = nl.ndarray((16, 15), nl.float32, buffer=nl.sbuf)
        nisa.iota(f, [[1, 15]], offset=-3, channel_multiplier=-2)
        return _store(t), _store(f)

    a, b = k(np.zeros((1, 1), np.float32))
    p = np.arange(16)[:, None, None]
    ref = 7 + 1000 * p + 100 * np.arange(3)[None, :, None] + 2 * np.arange(5)[None, None, :]
    np.testing.assert_array_equal(a, ref.astype(np.int32))
    refb = -3 - 2 * np.arange(16)[:, None] + np.arange(15)[None, :]
    np.testing.assert_array_equal(b, refb.astype(np.float32))


def test_scalar_tensor_tensor():
    @nki.jit
    def k(x, y, v):
        xt, yt, vt = _load(x), _load(y), _load(v)
        a = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
        nisa.scalar_tensor_tensor(dst=a, data=xt, op0=nl.multiply, operand0=2.5, op1=nl.add, operand1=yt)
        b = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
        nisa.scalar_tensor_tensor(b, xt, nl.subtract, vt, nl.subtract, yt, reverse0=True, reverse1=True)
        return _store(a), _store(b)

    r = _rng(2)
    x, y = r.standard_normal((2, 128, 64)).astype(np.float32)
    v = r.standard_normal((128, 1)).astype(np.float32)
    a, b = k(x, y, v)
    np.testing.assert_allclose(a, x * 2.5 + y, **F32)
    np.testing.assert_allclose(b, y - (v - x), **F32)


def test_reciprocal():
    @nki.jit
    def k(x):
        xt = _load(x)
        r = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
        nisa.reciprocal(dst=r, data=xt)
        return _store(r)

    x = (_rng(3).random((32, 48)) + 0.5).astype(np.float32)
    np.testing.assert_allclose(k(x), 1.0 / x, **F32)


def test_activation_reduce_row_sums():
    @nki.jit
    def k(x, bias):
        xt, bt = _load(x), _load(bias)
        e = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
        s = nl.ndarray((x.shape[0], 1), nl.float32, buffer=nl.sbuf)
        nisa.activation_reduce(dst=e, op=nl.exp, data=xt, reduce_op=nl.add, reduce_res=s, bias=bt, scale=0.5)
        return _store(e), _store(s)

    r = _rng(4)
    x = r.standard_normal((128, 200)).astype(np.float32)
    bias = r.standard_normal((128, 1)).astype(np.float32)
    e, s = k(x, bias)
    ref = np.exp(x * 0.5 + bias)
    np.testing.assert_allclose(e, ref, **F32)
    np.testing.assert_allclose(s, ref.sum(axis=1, keepdims=True), rtol=1e-5)
    assert "activation_reduce" in _ops(k)


def test_affine_select_causal_mask():
    @nki.jit
    def k(x):
        xt = _load(x)
        y = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
        # keep where q - k >= 0 (q = partition, k = free index)
        nisa.affine_select(dst=y, pattern=[[-1, x.shape[1]]], channel_multiplier=1, on_true_tile=xt,
                           on_false_value=-9984.0, cmp_op=nl.greater_equal)
        z = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
        nisa.affine_select(z, [[-1, x.shape[1]]], 1, xt, nl.fp32.min, offset=-2)  # cmp equal: q - k - 2 == 0
        return _store(y), _store(z)

    for dt, tol in ((np.float32, F32), (BF16, B16)):
        x = _rng(5).standard_normal((64, 64)).astype(dt)
        y, z = k(x)
        q, kk = np.indices((64, 64))
        ref = np.where(q - kk >= 0, x.astype(np.float32), -9984.0)
        np.testing.assert_allclose(y.astype(np.float32), ref, **tol)
        refz = np.where(q - kk - 2 == 0, x.astype(np.float32), np.float32(-3.4028235e38).astype(dt).astype(
            np.float32))
        np.testing.assert_allclose(z.astype(np.float32), refz, **tol)


def test_nc_stream_shuffle_broadcast_and_permute():
    @nki.jit
    def k(x):
        xt = _load(x)
        b = nl.ndarray((32, x.shape[1]), x.dtype, buffer=nl.sbuf)
        nisa.nc_stream_shuffle(dst=b, src=xt[0:1, :], shuffle_mask=[0] * 32)  # broadcast row 0
        r = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
        nisa.nc_stream_shuffle(r, xt, list(range(31, -1, -1)))  # reverse each quadrant
        return _store(b), _store(r)

    x = _rng(6).standard_normal((64, 40)).astype(np.float32)
    b, r = k(x)
    np.testing.assert_array_equal(b, np.broadcast_to(x[0:1], (32, 40)))
    ref = np.concatenate([x[31::-1], x[63:31:-1]])
    np.testing.assert_array_equal(r, ref)


def test_tensor_tensor_scan_linear_recurrence():
    @nki.jit
    def k(a, b, init):
        at, bt, it = _load(a), _load(b), _load(init)
        s = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor_scan(dst=s, data0=at, data1=bt, initial=it, op0=nl.multiply, op1=nl.add)
        c = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor_scan(c, at, bt, 0.0, nl.add, nl.add)  # cumsum(a + b)
        return _store(s), _store(c)

    r = _rng(7)
    a = (r.random((128, 100)) * 0.9).astype(np.float32)
    b = r.standard_normal((128, 100)).astype(np.float32)
    init = r.standard_normal((128, 1)).astype(np.float32)
    s, c = k(a, b, init)
    ref = np.empty_like(a)
    st = init[:, 0].copy()
    for i in range(a.shape[1]):
        st = (a[:, i] * st + b[:, i]).astype(np.float32)
        ref[:, i] = st
    np.testing.assert_allclose(s, ref, **F32)
    np.testing.assert_allclose(c, np.cumsum(a + b, axis=1), rtol=1e-5, atol=1e-4)


def test_tensor_scalar_reduce_with_reduce_res():
    @nki.jit
    def k(x, v):
        xt, vt = _load(x), _load(v)
        y = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
        s = nl.ndarray((x.shape[0], 1), nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar_reduce(dst=y, data=xt, op0=nl.multiply, operand0=vt, reduce_op=nl.add, reduce_res=s)
        m = nl.ndarray((x.shape[0], 1), nl.float32, buffer=nl.sbuf)
        y2 = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar_reduce(dst=y2, data=xt, op0=nl.add, operand0=1.0, reduce_op=nl.maximum, reduce_res=m,
                                  reduce_res_negate=True)
        # chain: load_reduce with an init value, then reduce
        c = nl.ndarray((x.shape[0], 1), nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar_reduce(dst=y2, data=xt, op0=nl.abs, operand0=None, reduce_op=nl.add,
                                  reduce_cmd=nisa.reduce_cmd.load_reduce, reduce_init=10.0)
        nisa.tensor_scalar_reduce(dst=y2, data=xt, op0=nl.multiply, operand0=2.0, reduce_op=nl.add, reduce_res=c,
                                  reduce_cmd=nisa.reduce_cmd.reduce)
        return _store(y), _store(s), _store(m), _store(c)

    r = _rng(8)
    x = r.standard_normal((128, 96)).astype(np.float32)
    v = r.standard_normal((128, 1)).astype(np.float32)
    y, s, m, c = k(x, v)
    np.testing.assert_allclose(y, x * v, **F32)
    np.testing.assert_allclose(s, (x * v).sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(m, -(x + 1.0).max(axis=1, keepdims=True), **F32)
    ref_c = 10.0 + np.abs(x).sum(axis=1, keepdims=True) + (2 * x).sum(axis=1, keepdims=True)
    np.testing.assert_allclose(c, ref_c, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("dt,tol", [(np.float32, F32), (BF16, B16)])
def test_bn_stats_bn_aggr_mean_var(dt, tol):
    @nki.jit
    def k(x):
        p, f = x.shape
        xt = _load(x)
        nch = (f + 511) // 512
        st = nl.ndarray((p, 6 * nch), nl.float32, buffer=nl.sbuf)
        for c in nl.affine_range(nch):
            w = min(512, f - c * 512)
            nisa.bn_stats(dst=st[:, c * 6:(c + 1) * 6], data=xt[:, c * 512:c * 512 + w])
        mv = nl.ndarray((p, 2), nl.float32, buffer=nl.sbuf)
        nisa.bn_aggr(dst=mv, data=st)
        return _store(mv)

    x = (_rng(9).standard_normal((128, 1000)) * 3 + 1).astype(dt)
    mv = k(x)
    xf = x.astype(np.float32)
    np.testing.assert_allclose(mv[:, 0], xf.mean(axis=1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(mv[:, 1], xf.var(axis=1), rtol=1e-5, atol=1e-5)


def test_tensor_copy_predicated():
    @nki.jit
    def k(x, y, pred):
        xt, yt, pt = _load(x), _load(y), _load(pred)
        nisa.tensor_copy_predicated(dst=yt, src=xt, predicate=pt)
        z = _load(y)
        nisa.tensor_copy_predicated(z, 7.0, pt, reverse_pred=True)
        return _store(yt), _store(z)

    r = _rng(10)
    x, y = r.standard_normal((2, 128, 64)).astype(np.float32)
    pred = (r.random((128, 64)) > 0.5).astype(np.uint8)
    a, b = k(x, y, pred)
    np.testing.assert_array_equal(a, np.where(pred != 0, x, y))
    np.testing.assert_array_equal(b, np.where(pred == 0, np.float32(7.0), y))


def test_range_select_with_reduce():
    @nki.jit
    def k(x, lo, hi):
        xt, lt, ht = _load(x), _load(lo), _load(hi)
        y = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
        m = nl.ndarray((x.shape[0], 1), nl.float32, buffer=nl.sbuf)
        nisa.range_select(dst=y, on_true_tile=xt, comp_op0=nl.greater_equal, comp_op1=nl.less, bound0=lt,
                          bound1=ht, reduce_cmd=nisa.reduce_cmd.reset_reduce, reduce_res=m, reduce_op=nl.maximum,
                          range_start=4)
        return _store(y), _store(m)

    r = _rng(11)
    x = r.standard_normal((128, 80)).astype(np.float32)
    lo = r.integers(0, 40, (128, 1)).astype(np.float32)
    hi = lo + r.integers(1, 40, (128, 1)).astype(np.float32)
    y, m = k(x, lo, hi)
    idx = 4 + np.arange(80)[None, :]
    fmin = np.float32(-3.4028235e38)
    ref = np.where((idx >= lo) & (idx < hi), x, fmin)
    np.testing.assert_array_equal(y, ref)
    np.testing.assert_array_equal(m, ref.max(axis=1, keepdims=True))


def test_get_nc_version():
    assert nisa.get_nc_version() >= 2
    assert nisa.get_nc_version() in (nisa.nc_version.gen2, nisa.nc_version.gen3, nisa.nc_version.gen4)
    assert nisa.get_nc_sub_version() in (0, 1)


def test_tier2_ir_encoding():
    @nki.jit
    def k(x):
        xt = _load(x)
        t = nl.ndarray((32, 64), nl.int32, buffer=nl.sbuf)
        nisa.iota(t, [[1, 64]], offset=3, channel_multiplier=64)
        s = nl.ndarray((32, 64), nl.float32, buffer=nl.sbuf)
        nisa.affine_select(s, [[-1, 64]], 1, xt, -1.0, cmp_op=nl.greater)
        nisa.nc_stream_shuffle(s, xt, [1, 0] + [255] * 30)  # (32 entries, nki-api.md 2.2)
        return _store(s)

    k.to_json(np.zeros((32, 64), np.float32))
    body = [s for s in k.last_json["body"] if "op" in s]
    io = next(s for s in body if s["op"] == "iota")
    assert io["iimm"] == [3, 64, 0, 1, 0, 1, 0, 1, 1, 64]
    af = next(s for s in body if s["op"] == "affine_select")
    assert af["alu0"] == "greater" and af["imm"] == [-1.0] and af["iimm"][-2:] == [-1, 64]
    sh = next(s for s in body if s["op"] == "nc_stream_shuffle")
    assert sh["shuffle"] == [1, 0] + [255] * 30


# --------------------------------------------------------------------------------------------------
# value-returning nl functions
# --------------------------------------------------------------------------------------------------


def test_nl_add_two_tiles_and_scalars():
    @nki.jit
    def k(a, b, v):
        at, bt, vt = nl.load(a), nl.load(b), nl.load(v)
        c = nl.add(at, bt)
        d = nl.subtract(2.0, at)  # scalar first: reverse
        e = nl.multiply(at, vt)  # (P, 1) operand -> tensor_scalar
        f = nl.divide(vt, bt)  # (P, 1) first
        g = nl.maximum(at, bt, dtype=nl.bfloat16)
        out = nl.ndarray(a.shape, nl.float32, buffer=nl.shared_hbm)
        nl.store(out, c)
        return out, _store(d), _store(e), _store(f), _store(g)

    r = _rng(12)
    a, b = r.standard_normal((2, 128, 64)).astype(np.float32)
    b = np.abs(b) + 0.5
    v = r.standard_normal((128, 1)).astype(np.float32)
    c, d, e, f, g = k(a, b, v)
    np.testing.assert_array_equal(c, a + b)
    np.testing.assert_allclose(d, 2.0 - a, **F32)
    np.testing.assert_allclose(e, a * v, **F32)
    np.testing.assert_allclose(f, v / b, **F32)
    assert g.dtype == BF16
    np.testing.assert_allclose(g.astype(np.float32), np.maximum(a, b), **B16)
    ops = _ops(k)
    assert "tensor_tensor" in ops and "tensor_scalar" in ops


def test_nl_opcode_still_usable_as_op():
    @nki.jit
    def k(a):
        at = nl.load(a)
        y = nl.ndarray(a.shape, a.dtype, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=y, data1=at, data2=at, op=nl.add)
        z = nl.ndarray(a.shape, a.dtype, buffer=nl.sbuf)
        nisa.activation(dst=z, op=nl.exp, data=y)
        return _store(z)

    a = _rng(13).standard_normal((16, 8)).astype(np.float32)
    np.testing.assert_allclose(k(a), np.exp(2 * a), **F32)


@pytest.mark.parametrize("dt,tol", [(np.float32, F32), (BF16, B16)])
def test_nl_unary_activations(dt, tol):
    fns = {"exp": np.exp, "tanh": np.tanh, "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
           "relu": lambda x: np.maximum(x, 0), "silu": lambda x: x / (1 + np.exp(-x)), "square": np.square,
           "abs": np.abs, "negative": np.negative}
    pos = {"log": np.log, "sqrt": np.sqrt, "rsqrt": lambda x: 1 / np.sqrt(x), "reciprocal": lambda x: 1 / x}

    @nki.jit
    def k(x, xp):
        xt, pt = nl.load(x), nl.load(xp)
        outs = [_store(getattr(nl, n)(xt)) for n in fns]
        outs += [_store(getattr(nl, n)(pt)) for n in pos]
        return tuple(outs)

    r = _rng(14)
    x = r.standard_normal((128, 32)).astype(dt)
    xp = (r.random((128, 32)) + 0.25).astype(dt)
    res = k(x, xp)
    refs = [f(x.astype(np.float32)) for f in fns.values()] + [f(xp.astype(np.float32)) for f in pos.values()]
    for name, got, ref in zip(list(fns) + list(pos), res, refs):
        assert got.dtype == dt, name
        np.testing.assert_allclose(got.astype(np.float32), ref, err_msg=name, **tol)


def test_nl_reductions_axis_keepdims_mean():
    @nki.jit
    def k(x, x3):
        xt, x3t = nl.load(x), nl.load(x3)
        s = nl.sum(xt, axis=1, keepdims=True)
        m = nl.max(xt, axis=-1)
        mn = nl.min(x3t, axis=[1, 2], keepdims=True)
        s3 = nl.sum(x3t, axis=2)  # (P, A)
        mu = nl.mean(xt, axis=1, keepdims=True)
        assert tuple(s.shape) == (128, 1) and tuple(m.shape) == (128,) and tuple(s3.shape) == (128, 4)
        centered = nl.subtract(xt, nl.mean(xt, axis=1))  # (P,) broadcasts as (P, 1)
        return _store(s), _store(m), _store(mn), _store(s3), _store(mu), _store(centered)

    r = _rng(15)
    x = r.standard_normal((128, 100)).astype(np.float32)
    x3 = r.standard_normal((128, 4, 6)).astype(np.float32)
    s, m, mn, s3, mu, c = k(x, x3)
    np.testing.assert_allclose(s, x.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(m, x.max(axis=1))
    np.testing.assert_array_equal(mn, x3.min(axis=(1, 2), keepdims=True))
    np.testing.assert_allclose(s3, x3.sum(axis=2), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(mu, x.mean(axis=1, keepdims=True), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(c, x - x.mean(axis=1, keepdims=True), rtol=1e-5, atol=1e-5)


def test_nl_matmul_transpose_copy():
    @nki.jit
    def k(a, b, at_):
        x, y, xt = nl.load(a), nl.load(b), nl.load(at_)
        p1 = nl.matmul(x, y)  # x [M, K]
        p2 = nl.matmul(xt, y, transpose_x=True)  # xt [K, M]
        tr = nl.transpose(x)
        assert p1.buffer == "psum" and p1.dtype == np.float32 and tr.buffer == "psum"
        return _store(nl.copy(p1)), _store(nl.copy(p2)), _store(nl.copy(tr))

    r = _rng(16)
    a = r.standard_normal((96, 128)).astype(np.float32)  # [M, K]
    b = r.standard_normal((128, 200)).astype(np.float32)  # [K, N]
    p1, p2, tr = k(a, b, np.ascontiguousarray(a.T))
    ref = a.astype(np.float64) @ b
    np.testing.assert_allclose(p1, ref, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(p2, ref, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(tr, a.T)


def test_nl_matmul_bf16():
    @nki.jit
    def k(a, b):
        p = nl.matmul(nl.load(a), nl.load(b))
        return _store(nl.copy(p))

    r = _rng(17)
    a = r.standard_normal((64, 128)).astype(BF16)
    b = r.standard_normal((128, 64)).astype(BF16)
    got = k(a, b)
    ref = a.astype(np.float32) @ b.astype(np.float32)
    np.testing.assert_allclose(got, ref, rtol=1e-2, atol=1e-2)


def test_nl_load_store_dtype_and_psum_store():
    @nki.jit
    def k(a):
        t = nl.load(a, dtype=nl.bfloat16)
        e = nl.exp(t)
        out = nl.ndarray(a.shape, nl.bfloat16, buffer=nl.shared_hbm)
        nl.store(out, e)
        out2 = nl.ndarray(a.shape, nl.float32, buffer=nl.shared_hbm)
        nl.store(out2, nl.transpose(nl.transpose(nl.load(a))))  # PSUM value
        out3 = nl.ndarray(a.shape, nl.float32, buffer=nl.shared_hbm)
        nl.store(out3, 1.5)
        return out, out2, out3

    a = _rng(18).standard_normal((64, 32)).astype(np.float32)
    o, o2, o3 = k(a)
    assert o.dtype == BF16
    np.testing.assert_allclose(o.astype(np.float32), np.exp(a.astype(BF16).astype(np.float32)), **B16)
    np.testing.assert_array_equal(o2, a)
    np.testing.assert_array_equal(o3, np.full_like(a, 1.5))


def test_nl_result_dtypes():
    assert nl.promote(np.float16, BF16) == np.float32
    assert nl.promote(BF16, np.int32) == BF16
    assert nl.promote(np.int8, np.uint8) == np.int16
    assert nl.promote(np.int32, np.uint32) == np.float32
    assert nl.promote(ml_dtypes.float8_e4m3, ml_dtypes.float8_e5m2) == BF16

    @nki.jit
    def k(a):
        t = nl.load(a)
        x = nl.multiply(t, 2)  # int scalar -> stays bf16
        y = nl.add(t, 1.5)  # float scalar counts as float32
        assert x.dtype == BF16 and y.dtype == np.float32
        return _store(x), _store(y)

    a = _rng(19).standard_normal((8, 8)).astype(BF16)
    x, y = k(a)
    np.testing.assert_allclose(x.astype(np.float32), a.astype(np.float32) * 2, **B16)
    np.testing.assert_allclose(y, a.astype(np.float32) + 1.5, **F32)


def test_nl_value_functions_outside_kernel_error():
    with pytest.raises(Exception):
        nl.add(1, 2)
