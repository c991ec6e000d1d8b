"""The new NKI dialect (nsim.nki, nki.language, nki.isa): eager tracing to kernel.json + simulation."""
import json
import subprocess

import numpy as np
import pytest

from conftest import executed_ops, require_core  # noqa: E402

_core, ml_dtypes = require_core()

import nsim  # noqa: E402
from nsim import _isa, nki, tracer  # noqa: E402
import nsim.nki.language as nl  # noqa: E402
import nsim.nki.isa as nisa  # noqa: E402

BF16 = ml_dtypes.bfloat16


# --------------------------------------------------------------------------------------------------
# kernels
# --------------------------------------------------------------------------------------------------


@nki.jit
def tensor_add(a, b):
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    n, f = a.shape
    for i in nl.affine_range(n // nl.tile_size.pmax):
        at = nl.ndarray((128, f), a.dtype, buffer=nl.sbuf)
        bt = nl.ndarray((128, f), a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=at, src=a[i * 128:(i + 1) * 128, :])
        nisa.dma_copy(dst=bt, src=b[nl.ds(i * 128, 128), ...])
        ct = nl.ndarray((128, f), a.dtype, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=ct, data1=at, data2=bt, op=nl.add)
        nisa.dma_copy(dst=out[i * 128:(i + 1) * 128, :], src=ct)
    return out


@nki.jit
def row_softmax(x):
    n, f = x.shape
    out = nl.ndarray((n, f), x.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(n // 128):
        xt = nl.ndarray((128, f), x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=xt, src=x[i * 128:(i + 1) * 128, :])
        mx = nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=mx, op=nl.maximum, data=xt, axis=1)
        neg = nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=neg, data=mx, op0=nl.multiply, operand0=-1.0)
        e = nl.ndarray((128, f), nl.float32, buffer=nl.sbuf)
        s = nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=e, op=nl.exp, data=xt, bias=neg, reduce_op=nl.add, reduce_res=s,
                        reduce_cmd=nisa.reduce_cmd.reset_reduce)
        r = nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf)
        nisa.reciprocal(dst=r, data=s)
        y = nl.ndarray((128, f), x.dtype, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=y, data=e, op0=np.multiply, operand0=r)
        nisa.dma_copy(dst=out[i * 128:(i + 1) * 128, :], src=y)
    return out


@nki.jit
def matmul(a_t, b):
    """a_t = A^T [K, M], b [K, N]: out = A @ B [M, N], K tiled by 128 with PSUM accumulation."""
    k, m = a_t.shape
    _, n = b.shape
    out = nl.ndarray((m, n), nl.float32, buffer=nl.shared_hbm)
    for mi in nl.affine_range(m // 128):
        ps = nl.ndarray((128, n), nl.float32, buffer=nl.psum)
        for ki in nl.sequential_range(k // 128):
            st = nl.ndarray((128, 128), a_t.dtype, buffer=nl.sbuf)
            mv = nl.ndarray((128, n), b.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=st, src=a_t[ki * 128:(ki + 1) * 128, mi * 128:(mi + 1) * 128])
            nisa.dma_copy(dst=mv, src=b[ki * 128:(ki + 1) * 128, :])
            nisa.nc_matmul(dst=ps, stationary=st, moving=mv)  # accumulate=None: first overwrites
        res = nl.ndarray((128, n), nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=res, src=ps)
        nisa.dma_copy(dst=out[mi * 128:(mi + 1) * 128, :], src=res)
    return out


@nki.jit
def transpose(x):
    p, f = x.shape
    out = nl.ndarray((f, p), x.dtype, buffer=nl.shared_hbm)
    xt = nl.ndarray((p, f), x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=xt, src=x)
    tp = nl.ndarray((f, p), x.dtype, buffer=nl.psum)
    nisa.nc_transpose(dst=tp, data=xt)
    ot = nl.ndarray((f, p), x.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=ot, src=tp)
    nisa.dma_copy(dst=out, src=ot)
    return out


OOB_LINE = None


@nki.jit
def oob(a):
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray((128, 64), a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a[0:128, 0:64])
    nisa.dma_copy(dst=out[64:192, :], src=t)  # OOB_LINE: rows 64..191 of a 128-row tensor
    return out


def _oob_line():
    import inspect
    src, first = inspect.getsourcelines(oob.fn)
    return first + next(i for i, l in enumerate(src) if "OOB_LINE" in l)


# --------------------------------------------------------------------------------------------------
# tests
# --------------------------------------------------------------------------------------------------


def test_tensor_add_two_tiles_exact():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((256, 512)).astype(np.float32)
    b = rng.standard_normal((256, 512)).astype(np.float32)
    c = tensor_add(a, b)
    assert c.dtype == np.float32 and c.shape == (256, 512)
    np.testing.assert_array_equal(c, a + b)
    assert tensor_add.last_profile.total_time_ns > 0


def test_row_softmax_bf16():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((256, 512)).astype(BF16)
    y = nki.simulate(row_softmax)(x)
    assert y.dtype == BF16
    xf = x.astype(np.float32)
    ref = np.exp(xf - xf.max(axis=1, keepdims=True))
    ref /= ref.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(y.astype(np.float32), ref, rtol=1e-2, atol=1e-4)


def test_matmul_k_tiled_accumulate():
    rng = np.random.default_rng(2)
    a = rng.standard_normal((256, 256)).astype(BF16)   # A [M, K]
    b = rng.standard_normal((256, 512)).astype(BF16)   # B [K, N]
    a_t = np.ascontiguousarray(a.T)
    out = nki.simulate_kernel(matmul, a_t, b)
    ref = a.astype(np.float32) @ b.astype(np.float32)
    assert np.max(np.abs(out - ref)) <= 1e-2 * np.max(np.abs(ref))
    # accumulate=None: first matmul of each PSUM tile overwrites, the second accumulates
    kj = matmul.to_json()
    mms = [s for s in executed_ops(kj["body"]) if s.get("op") == "nc_matmul"]
    assert ["accumulate" in s.get("flags", []) for s in mms] == [False, True, False, True]


def test_matmul_spec_shape_256x128_at_128x512():
    rng = np.random.default_rng(3)
    a = rng.standard_normal((256, 128)).astype(BF16)
    b = rng.standard_normal((128, 512)).astype(BF16)
    out = matmul(np.ascontiguousarray(a.T), b)
    ref = a.astype(np.float32) @ b.astype(np.float32)
    assert np.max(np.abs(out - ref)) <= 1e-2 * np.max(np.abs(ref))


def test_nc_transpose():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((128, 64)).astype(np.float32)
    y = transpose(x)
    np.testing.assert_array_equal(y, x.T)
    ops = [s for s in transpose.to_json()["body"] if s.get("op") == "nc_transpose"]
    assert ops[0]["engine"] == "tensor"


def test_op_outside_kernel_raises():
    with pytest.raises(nsim.NsimError, match="inside an NKI kernel"):
        nl.ndarray((128, 4), nl.float32)
    with pytest.raises(nsim.KernelError, match="inside an NKI kernel"):
        nisa.memset(None, 0.0)
    with pytest.raises(nsim.KernelError, match="inside an NKI kernel"):
        nl.zeros((128, 4), nl.float32, buffer=nl.psum)


def test_out_of_bounds_slice_points_at_user_line():
    a = np.zeros((128, 64), np.float32)
    with pytest.raises(nsim.NsimError) as ei:
        oob(a)
    e = ei.value
    assert e.code == "NSIM-E408"
    assert e.line == _oob_line()
    assert e.file == __file__


def test_locations_and_written_argument_copy_back():
    @nki.jit
    def scale_in_place(x):
        t = nl.ndarray((128, 32), x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=2.0, op1=nl.add, operand1=1.0)
        nisa.dma_copy(dst=x, src=t)

    x = np.arange(128 * 32, dtype=np.float32).reshape(128, 32)
    ref = x * 2 + 1
    assert scale_in_place(x) is None
    np.testing.assert_array_equal(x, ref)
    kj = scale_in_place.to_json()
    locs = [s["loc"] for s in kj["body"] if "op" in s and s["loc"]["line"]]
    assert all(l["file"] == __file__ and l["function"] == "scale_in_place" for l in locs)


def test_views_shapes():
    seen = {}

    @nki.jit
    def k(a):
        t = nl.ndarray((64, 64, 64), nl.float32, buffer=nl.sbuf)
        seen["chip"] = t[:, 0, 10].shape
        seen["chip2"] = t[3, :, 0:64:2].shape
        seen["hbm"] = a[0].shape
        seen["hbm2"] = a[1, 2:6].shape
        seen["list"] = t.shape == [64, 64, 64]
        nisa.memset(dst=t, value=0.0)

    k(np.zeros((4, 8), np.float32))
    assert seen == {"chip": (64, 1), "chip2": (1, 64, 32), "hbm": (8,), "hbm2": (4,), "list": True}


def test_saved_json_matches_cli_total_time(tmp_path, nsim_bin):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((256, 512)).astype(BF16)
    y, prof = row_softmax.simulate(x)
    kj = row_softmax.to_json()
    assert nki.trace_kernel(row_softmax, x) == kj
    kfile = tmp_path / "kernel.json"
    kfile.write_text(json.dumps(kj))
    np.savez(tmp_path / "in.npz", x=x.astype(np.float32))  # bf16 -> fp32 is exact
    r = subprocess.run([nsim_bin, "run", str(kfile), "--inputs", str(tmp_path / "in.npz"), "--outputs",
                        str(tmp_path / "out"), "--stats", str(tmp_path / "stats.json")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    cli = json.loads((tmp_path / "stats.json").read_text())["stats"]["total_time"]["value"]
    assert cli == prof.total_time_ns
    out = np.load(tmp_path / "out" / (kj["tensors"][-1]["name"] + ".npy"))
    np.testing.assert_array_equal(out, y.astype(np.float32))


def test_simulator_error_points_at_user_line():
    @nki.jit
    def bad(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray((128, 64), a.dtype, buffer=nl.sbuf)
        u = nl.ndarray((128, 32), a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a)
        nisa.tensor_tensor(dst=u, data1=t, data2=t, op=nl.add)  # BAD_LINE
        nisa.dma_copy(dst=out, src=t)
        return out

    import inspect
    src, first = inspect.getsourcelines(bad.fn)
    line = first + next(i for i, l in enumerate(src) if "BAD_LINE" in l)
    with pytest.raises(nsim.OperandError) as ei:
        bad(np.zeros((128, 64), np.float32))
    assert ei.value.line == line and ei.value.file == __file__ and ei.value.code == "NSIM-E304"


def test_misc_ops_and_creation():
    @nki.jit
    def k(x, v):
        out = nl.ndarray((128, 8), nl.float32, buffer=nl.shared_hbm)
        xt = nl.ndarray((128, 4, 16), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=xt, src=x)
        vt = nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=vt, src=v)
        res = nl.zeros((128, 8), nl.float32)
        # col 0..3: per-row-group sums over the last axis of a 3-D tile
        nisa.tensor_reduce(dst=res[:, 0:4], op=np.sum, data=xt, axis=2)
        # col 4: max over both free axes, negated
        nisa.tensor_reduce(dst=res[:, 4], op=nl.max, data=xt, axis=(1, 2), negate=True)
        # col 5: (v - 3) reversed -> 3 - v, then * v (vector operand)
        nisa.tensor_scalar(dst=res[:, 5:6], data=vt, op0=nl.subtract, operand0=3.0, reverse0=True,
                           op1=nl.multiply, operand1=vt)
        # col 6: tanh(2 * v + 0.5)
        nisa.activation(dst=res[:, 6:7], op=nl.tanh, data=vt, bias=0.5, scale=2.0)
        # col 7: ones
        one = nl.ones((128, 1), nl.float32)
        nisa.tensor_copy(dst=res[:, 7:8], src=one, engine=nisa.engine.scalar)
        nisa.dma_copy(dst=out, src=res)
        return out

    rng = np.random.default_rng(6)
    x = rng.standard_normal((128, 64)).astype(np.float32)
    v = rng.standard_normal((128, 1)).astype(np.float32)
    out = k(x, v)
    x3 = x.reshape(128, 4, 16)
    ref = np.zeros((128, 8), np.float32)
    ref[:, 0:4] = x3.sum(axis=2)
    ref[:, 4] = -x.max(axis=1)
    ref[:, 5] = ((3.0 - v) * v)[:, 0]
    ref[:, 6] = np.tanh(2 * v + 0.5)[:, 0]
    ref[:, 7] = 1.0
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


def test_matmul_accumulate_group_ends_at_eviction():
    @nki.jit
    def k(a, b):
        out = nl.ndarray((128, 2, 64), nl.float32, buffer=nl.shared_hbm)
        st = nl.ndarray((128, 128), a.dtype, buffer=nl.sbuf)
        mv = nl.ndarray((128, 64), b.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=st, src=a)
        nisa.dma_copy(dst=mv, src=b)
        ps = nl.ndarray((128, 64), nl.float32, buffer=nl.psum)
        res = nl.ndarray((128, 2, 64), nl.float32, buffer=nl.sbuf)
        for r in range(2):
            nisa.nc_matmul(ps, st, mv)
            nisa.nc_matmul(ps, st, mv)  # accumulates
            nisa.tensor_copy(dst=res[:, r, :], src=ps)  # ends the group: the next matmul overwrites
        nisa.dma_copy(dst=out, src=res)
        return out

    rng = np.random.default_rng(7)
    a = rng.standard_normal((128, 128)).astype(np.float32)
    b = rng.standard_normal((128, 64)).astype(np.float32)
    out = k(a, b)
    ref = 2 * (a.T @ b)
    np.testing.assert_allclose(out[:, 0, :], ref, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(out[:, 1, :], ref, rtol=1e-4, atol=1e-3)


def test_dma_priority_is_gen4_only_and_tensor_copy_dtype_warns():
    """nki-api.md 2.1 / 4.3: ``priority=`` of dma_copy / dma_transpose exists on gen4 only (NotOnGeneration before);
    on trn3 it is accepted and times the transfer as without (the QoS arbitration is not modelled). 1.3: a
    ``tensor_copy(dtype=)`` that differs from dst's dtype warns, dst's dtype is written."""
    def make(prio):
        @nki.jit
        def k(a):
            out = nl.ndarray((128, 64), dtype=a.dtype, buffer=nl.shared_hbm)
            t = nl.ndarray((128, 64), dtype=a.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=t, src=a, priority=prio)
            nisa.dma_copy(dst=out, src=t)
            return out
        return k

    a = np.arange(128 * 64, dtype=np.float32).reshape(128, 64)
    with pytest.raises(nsim.NsimError) as ei:
        make(1).options(config="trn2").simulate(a)
    assert ei.value.code == "NSIM-E313" and "priority" in str(ei.value)
    out, p1 = make(1).options(config="trn3").simulate(a)
    np.testing.assert_array_equal(out, a)
    assert p1.total_time_ns == make(None).options(config="trn3").simulate(a)[1].total_time_ns

    @nki.jit
    def copy_as(a):
        out = nl.ndarray((128, 64), dtype=a.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray((128, 64), dtype=a.dtype, buffer=nl.sbuf)
        u = nl.ndarray((128, 64), dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a)
        nisa.tensor_copy(dst=u, src=t, dtype=nl.bfloat16)
        nisa.dma_copy(dst=out, src=u)
        return out

    with pytest.warns(UserWarning, match="dtype=bfloat16 differs from dst's float32"):
        out = copy_as(a)
    np.testing.assert_array_equal(out, a)  # float32 written: exact


def test_tensor_scalar_on_gpsimd_runs_rsqrt_only():
    """nki-api.md 2.1 (tensor_scalar engines: "GpSimd only for rsqrt") and 4.3 (``engine=gpsimd`` for a non-rsqrt
    tensor_scalar is a validation error): NSIM-E306 BadEngine at the call, naming the ops; rsqrt runs there, and an
    unset engine leaves the choice to the compiler model (compiler.md 2). Regression: any op ran on GpSimd."""
    def make(op0, op1, eng):
        @nki.jit
        def k(a):
            out = nl.ndarray((128, 64), dtype=a.dtype, buffer=nl.shared_hbm)
            t = nl.ndarray((128, 64), dtype=a.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=t, src=a)
            nisa.tensor_scalar(dst=t, data=t, op0=op0, operand0=0.0 if op0 is nl.rsqrt else 2.0, op1=op1,
                               operand1=None if op1 is None else 1.0, engine=eng)
            nisa.dma_copy(dst=out, src=t)
            return out
        return k

    a = np.linspace(0.5, 4.0, 128 * 64, dtype=np.float32).reshape(128, 64)
    for op0, op1 in ((nl.multiply, None), (nl.multiply, nl.add), (nl.rsqrt, nl.add)):
        with pytest.raises(nsim.NsimError) as ei:
            make(op0, op1, nisa.engine.gpsimd)(a)
        assert ei.value.code == "NSIM-E306" and "engine=gpsimd runs rsqrt only" in str(ei.value), str(ei.value)
    np.testing.assert_allclose(make(nl.rsqrt, None, nisa.engine.gpsimd)(a), 1 / np.sqrt(a), rtol=1e-5)
    np.testing.assert_allclose(make(nl.multiply, nl.add, nisa.engine.unknown)(a), a * 2 + 1, rtol=1e-6)


def test_dma_copy_of_psum_warns_in_the_new_dialect_only(b1):
    """nki-api.md 2.1: a PSUM source or destination of dma_copy is legal in Beta 1 / 0.2 and rejected since 0.3.
    nsim runs it in both dialects (the values are right) and warns, at the kernel's line, when new-dialect code
    calls it; Beta-1 code (``nisa.dma_copy`` and ``nl.store`` of a PSUM tile) does not warn."""
    import warnings
    a = np.arange(128 * 128, dtype=np.float32).reshape(128, 128) / 1000
    b = np.eye(128, dtype=np.float32)

    @nki.jit
    def evict_by_dma(a, b):
        out = nl.ndarray((128, 128), np.float32, buffer=nl.shared_hbm)
        at = nl.ndarray((128, 128), a.dtype, buffer=nl.sbuf)
        bt = nl.ndarray((128, 128), b.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=at, src=a)
        nisa.dma_copy(dst=bt, src=b)
        ps = nl.ndarray((128, 128), np.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=ps, stationary=at, moving=bt)
        nisa.dma_copy(dst=out, src=ps)
        return out

    with pytest.warns(UserWarning, match="src is in PSUM; NKI 0.3 and later reject") as rec:
        out = evict_by_dma(a, b)
    np.testing.assert_allclose(out, a.T, rtol=1e-5)
    assert [w.filename for w in rec if "PSUM" in str(w.message)] == [__file__]

    bnki, bnl, bnisa = b1

    @bnki.jit
    def beta1_evict(a, b):
        out = bnl.ndarray((128, 128), dtype=np.float32, buffer=bnl.shared_hbm)
        ps = bnl.ndarray((128, 128), dtype=np.float32, buffer=bnl.psum)
        ps[...] = bnisa.nc_matmul(bnl.load(a), bnl.load(b))
        bnisa.dma_copy(dst=out, src=ps)
        bnl.store(out, value=ps)
        return out

    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        out = beta1_evict(a, b)
    np.testing.assert_allclose(out, a.T, rtol=1e-5)


def test_dma_transpose_3d_and_4d_forms():
    """nki-api.md 2.1: dma_transpose's (2, 1, 0) and (3, 1, 2, 0) forms (the default of their rank) swap the first and
    last dims and keep the middle ones: from HBM (one row too) and from SBUF, and Beta 1's value-returning call with
    the default axes of a 4-D tile."""
    @nki.jit
    def t3(x):
        out = nl.ndarray((x.shape[2], x.shape[1], x.shape[0]), dtype=x.dtype, buffer=nl.shared_hbm)
        d = nl.ndarray((x.shape[2], x.shape[1], x.shape[0]), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_transpose(dst=d, src=x)
        nisa.dma_copy(dst=out, src=d)
        return out

    @nki.jit
    def t4(x):
        out = nl.ndarray((32, 3, 5, 4), dtype=x.dtype, buffer=nl.shared_hbm)
        s = nl.ndarray((4, 3, 5, 32), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=s, src=x)
        d = nl.ndarray((32, 3, 5, 4), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_transpose(dst=d, src=s, axes=(3, 1, 2, 0))
        nisa.dma_copy(dst=out, src=d)
        return out

    rng = np.random.default_rng(5)
    for shape in ((16, 8, 64), (1, 8, 64)):
        x = rng.standard_normal(shape).astype(BF16)
        np.testing.assert_array_equal(t3(x), x.transpose(2, 1, 0))
    y = rng.standard_normal((4, 3, 5, 32)).astype(BF16)
    np.testing.assert_array_equal(t4(y), y.transpose(3, 1, 2, 0))

    import nsim.nki.beta1 as b1

    @b1.jit
    def b4(x):
        out = b1.language.ndarray((32, 3, 5, 4), dtype=x.dtype, buffer=b1.language.shared_hbm)
        t = b1.isa.dma_transpose(b1.language.load(x))
        b1.language.store(out, value=t)
        return out

    np.testing.assert_array_equal(b4(y), y.transpose(3, 1, 2, 0))

    @nki.jit
    def wrong_axes(x):
        d = nl.ndarray((16, 8, 64), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_transpose(dst=d, src=x, axes=(0, 2, 1))
        return None

    with pytest.raises(nsim.NsimError, match=r"3-D transpose needs axes=\(2, 1, 0\)"):
        wrong_axes(rng.standard_normal((16, 64, 8)).astype(BF16))


def test_dge_mode_picks_the_trigger_engine_and_hwdge_is_checked():
    """nki-api.md 2.1: dge_mode has no functional effect; it names how descriptors are made, so (engine= unset) it
    picks the trigger (none: Sync's static descriptors, swdge: GpSimd, hwdge: a sequencer, costed on Scalar at
    dma.hwdge_instr); hwdge needs gen3+ and a copy without a cast; an explicit engine= wins. dma_transpose's hwdge
    path has its shape rules."""
    def make(mode, engine=None, out_dtype=None):
        @nki.jit
        def k(a):
            out = nl.ndarray((128, 64), dtype=a.dtype, buffer=nl.shared_hbm)
            t = nl.ndarray((128, 64), dtype=out_dtype or a.dtype, buffer=nl.sbuf)
            kw = {} if engine is None else {"engine": engine}
            nisa.dma_copy(dst=t, src=a, dge_mode=mode, **kw)
            nisa.dma_copy(dst=out, src=t)
            return out
        return k

    a = np.arange(128 * 64, dtype=np.float32).reshape(128, 64)

    def trigger(mode, engine=None):
        body = make(mode, engine).options(config="trn2").trace(a).kernel["body"]
        return [st.get("engine") for st in body if st.get("op") == "dma_copy"][0]

    assert trigger(nisa.dge_mode.none) == "sync"
    assert trigger(nisa.dge_mode.swdge) == "gpsimd"
    assert trigger(nisa.dge_mode.hwdge) == "scalar"
    assert trigger(nisa.dge_mode.unknown) is None  # the compiler model places it
    assert trigger(nisa.dge_mode.hwdge, nisa.engine.sync) == "sync"
    out, prof = make(nisa.dge_mode.hwdge).options(config="trn2").simulate(a)
    np.testing.assert_array_equal(out, a)
    assert prof.stats["engine"]["scalar"]["instruction_count"]["value"] == 1  # the hwdge trigger
    with pytest.raises(nsim.NsimError) as ei:
        make(nisa.dge_mode.hwdge).options(config="trn1").simulate(a)
    assert ei.value.code == "NSIM-E313"
    with pytest.raises(nsim.NsimError, match="hwdge copies without a cast"):
        make(nisa.dge_mode.hwdge, out_dtype=nl.bfloat16).options(config="trn2").simulate(a)

    @nki.jit
    def tr(x):
        d = nl.ndarray((x.shape[1], x.shape[0]), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_transpose(dst=d, src=x, dge_mode=nisa.dge_mode.hwdge)
        out = nl.ndarray((x.shape[1], x.shape[0]), dtype=x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=d)
        return out

    x = np.arange(16 * 128, dtype=np.float32).reshape(16, 128).astype(BF16)
    np.testing.assert_array_equal(tr(x), x.T)  # [16, 128] bf16: the hwdge shape
    with pytest.raises(nsim.NsimError, match="dge_mode=hwdge needs a 2-byte dtype"):
        tr(np.zeros((32, 128), BF16))  # 2-D hwdge needs src.shape[0] == 16


def test_zeros_overwritten_whole_is_dropped():
    """``nl.zeros`` then an instruction writing the whole tile without reading it (``nc_matmul`` with
    ``accumulate=None``: the zeroing closed no group, so the matmul overwrites): a dead store the compiler drops.
    With ``accumulate=True`` the matmul reads the zeros: kept. The values are the same either way."""

    @nki.jit
    def k(a, w):
        out = nl.ndarray((2, 128, 128), dtype=np.float32, buffer=nl.shared_hbm)
        at = nl.ndarray((128, 128), dtype=np.float32)
        nisa.dma_copy(dst=at, src=a)
        wt = nl.ndarray((128, 128), dtype=np.float32)
        nisa.dma_copy(dst=wt, src=w)
        p = nl.zeros((128, 128), dtype=np.float32, buffer=nl.psum)  # overwritten: dropped
        nisa.nc_matmul(dst=p, stationary=at, moving=wt)
        q = nl.zeros((128, 128), dtype=np.float32, buffer=nl.psum)  # accumulated into: kept
        nisa.nc_matmul(dst=q, stationary=at, moving=wt, accumulate=True)
        for i, t in enumerate((p, q)):
            r = nl.ndarray((128, 128), dtype=np.float32)
            nisa.tensor_copy(dst=r, src=t)
            nisa.dma_copy(dst=out[i], src=r)
        return out

    rng = np.random.default_rng(6)
    a = (rng.standard_normal((128, 128)) / 8).astype(np.float32)
    w = rng.standard_normal((128, 128)).astype(np.float32)
    got = np.asarray(k(a, w))
    want = a.astype(np.float64).T @ w.astype(np.float64)
    np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got[1], want, rtol=1e-5, atol=1e-5)
    kept = [i for i, t in enumerate(open(__file__).read().splitlines(), 1) if "accumulated into: kept" in t
            and "nl.zeros(" in t]
    assert [s.get("loc", {}).get("line") for s in executed_ops(k.last_json["body"]) if s["op"] == "memset"] == kept


def test_tile_size_follows_each_traces_config_and_the_environment(monkeypatch):
    """nl.tile_size inside a kernel gives the values of that kernel's configuration (the tracer keeps them for its
    config and overrides: language._current_tile_sizes), and NKI_DMA_TRANSPOSE_AS_PE_TRANSPOSE is read at each
    access: a trace with other overrides, or the variable set while the kernel runs, sees the new values."""
    seen = []

    @nki.jit
    def probe(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        seen.append((nl.tile_size.sbuf_fmax_bytes, nl.tile_size.psum_num_banks))
        monkeypatch.setenv("NKI_DMA_TRANSPOSE_AS_PE_TRANSPOSE", "true")
        seen.append((nl.tile_size.sbuf_fmax_bytes, nl.tile_size.psum_num_banks))
        monkeypatch.delenv("NKI_DMA_TRANSPOSE_AS_PE_TRANSPOSE")
        t = nl.ndarray((128, 64), a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a)
        nisa.dma_copy(dst=out, src=t)
        return out

    x = np.ones((128, 64), np.float32)
    monkeypatch.delenv("NKI_DMA_TRANSPOSE_AS_PE_TRANSPOSE", raising=False)
    probe.options(timing_only=True).simulate(x)
    probe.options(timing_only=True, overrides={"sbuf.bytes_per_partition": 98304}).simulate(x)
    probe.options(timing_only=True).simulate(x)
    full = _isa.config_values("trn2")["sbuf.bytes_per_partition"] - 16 * 1024  # NKI reserves 16 KiB per partition
    banks = _isa.config_values("trn2")["psum.banks"]
    assert seen == [(full, banks), (full, banks - 1), (98304 - 16 * 1024, banks), (98304 - 16 * 1024, banks - 1),
                    (full, banks), (full, banks - 1)]
