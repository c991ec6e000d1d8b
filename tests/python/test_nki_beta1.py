"""The Beta-1 NKI dialect (``neuronxcc.nki`` -> nsim.nki.beta1): tutorial-style kernels run through
``nsim.compat.install()``, ``nki.simulate_kernel`` and the jit call, checked against numpy."""
import json
import os
import sys

import numpy as np
import pytest

from conftest import beta1_modules, executed_ops, require_core  # noqa: E402

_core, ml_dtypes = require_core()

BF16 = ml_dtypes.bfloat16
KDIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels")


@pytest.fixture(scope="module")
def b1():
    """compat installed; yields (nki, nl, nisa, kernel modules); restores sys.modules afterwards."""
    names = ("beta1_tensor_add", "beta1_softmax", "beta1_matmul", "beta1_rmsnorm", "beta1_tutorials")
    with beta1_modules(*(os.path.join(KDIR, name + ".py") for name in names)) as mods:
        import neuronxcc.nki as nki
        import neuronxcc.nki.isa as nisa
        import neuronxcc.nki.language as nl
        yield nki, nl, nisa, dict(zip(names, mods))


from numeric_helpers import close as _close, rand as _rand  # noqa: E402


# --------------------------------------------------------------------------------------------------
# compat
# --------------------------------------------------------------------------------------------------


def test_compat_aliases(b1):
    nki, nl, nisa, _ = b1
    import nsim.nki.beta1 as B
    import neuronxcc.nki.compiler as ncc
    import neuronxcc.nki.typing as nt

    assert nki is B and nl is B.language and nisa is B.isa and ncc is B.compiler and nt is B.typing
    assert sys.modules["neuronxcc"].nki is B
    import nki as new_nki

    assert new_nki is not nki  # the new dialect stays separate
    assert ncc.sbuf.alloc(lambda *a: 0) == "sbuf"


# --------------------------------------------------------------------------------------------------
# tensor add
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_tensor_add_simple(b1, dtype):
    nki, _, _, m = b1
    k = m["beta1_tensor_add"]
    a, b = _rand((128, 512), dtype, 1), _rand((128, 512), dtype, 2)
    want = k.reference_add(a, b)
    for got in (nki.simulate_kernel(k.nki_tensor_add_kernel, a, b), k.nki_tensor_add_kernel(a, b)):
        assert got.dtype == np.dtype(dtype) and got.shape == a.shape
        _close(got, want, dtype)


def test_tensor_add_grid_writes_argument(b1):
    nki, _, _, m = b1
    k = m["beta1_tensor_add"]
    a, b = _rand((256, 1024), seed=3), _rand((256, 1024), seed=4)
    _close(k.nki_tensor_add(a, b), a + b)  # kernel[2, 2](a, b, c) inside
    c = np.zeros_like(a)
    assert nki.simulate_kernel(k.nki_tensor_add_kernel_[2, 2], a, b, c) is None
    _close(c, a + b)
    c2 = np.zeros_like(a)
    nki.baremetal(k.nki_tensor_add_kernel_)[2, 2](a, b, c2)
    _close(c2, a + b)
    # the four instances run in one traced kernel: 4 x (2 loads + add + store), their statements traced once,
    # as loops over the program ids (pid0 over pid1), each instance's tile at its ids
    body = k.nki_tensor_add_kernel_.last_json["body"]
    loops = [s["loop"] for s in body if "loop" in s]
    assert len(loops) == 1 and loops[0]["var"] == "pid0" and loops[0]["stop"] == 2
    inner = loops[0]["body"][0]["loop"]
    assert inner["var"] == "pid1" and inner["stop"] == 2
    assert [s["op"] for s in inner["body"] if "op" in s].count("tensor_tensor") == 1
    # (the written argument c's output starts as a copy of it, kernel.json "init": no copy instruction)
    assert [s["op"] for s in executed_ops(body)].count("tensor_tensor") == 4 and len(executed_ops(body)) == 16


def test_tensor_add_grid_shared_output(b1):
    _, _, _, m = b1
    k = m["beta1_tensor_add"]
    a, b = _rand((256, 1024), seed=5), _rand((256, 1024), seed=6)
    got = k.nki_tensor_add_grid_out[2, 2](a, b)
    _close(got, 2 * a - b)
    hbm = [t for t in k.nki_tensor_add_grid_out.last_json["tensors"] if t["kind"] == "output"]
    assert len(hbm) == 1  # one shared_hbm tensor for the whole launch


@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_tensor_add_loop(b1, dtype):
    nki, _, _, m = b1
    k = m["beta1_tensor_add"]
    a, b = _rand((384, 256), dtype, 7), _rand((384, 256), dtype, 8)
    c = np.zeros_like(a)
    nki.simulate_kernel(k.nki_tensor_add_loop, a, b, c)
    _close(c, k.reference_add(a, b), dtype)


# --------------------------------------------------------------------------------------------------
# exp / softmax
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_exp(b1, dtype):
    nki, _, _, m = b1
    k = m["beta1_softmax"]
    x = _rand((256, 384), dtype, 9)
    _close(nki.simulate_kernel(k.exp_kernel, x), k.reference_exp(x), dtype)


@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_softmax_nl(b1, dtype):
    nki, _, _, m = b1
    k = m["beta1_softmax"]
    x = _rand((256, 512), dtype, 10, -4, 4)
    got = k.softmax_nl_kernel(x)
    assert got.dtype == np.dtype(dtype)
    _close(got, k.reference_softmax(x), dtype)


@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_softmax_isa(b1, dtype):
    nki, _, _, m = b1
    k = m["beta1_softmax"]
    x = _rand((256, 512), dtype, 11, -4, 4)
    out = np.zeros_like(x)
    nki.simulate_kernel(k.softmax_isa_kernel, x, out)
    _close(out, k.reference_softmax(x), dtype)


# --------------------------------------------------------------------------------------------------
# matmul with K accumulation in PSUM
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_matmul_tiled(b1, dtype):
    nki, _, _, m = b1
    k = m["beta1_matmul"]
    lhsT, rhs = _rand((384, 256), dtype, 12), _rand((384, 1024), dtype, 13)
    res = np.zeros((256, 1024), dtype)
    nki.simulate_kernel(k.nki_matmul_tiled_, lhsT, rhs, res)
    want = k.reference_matmul(lhsT, rhs)
    if dtype == np.float32:
        np.testing.assert_allclose(res, want, rtol=1e-5, atol=1e-4)
    else:
        _close(res, want, dtype)
    mm = [s for s in executed_ops(k.nki_matmul_tiled_.last_json["body"]) if s.get("op") == "nc_matmul"]
    # the first matmul of each of the 4 output tiles starts its accumulation group: the tile's nl.zeros fill is
    # folded into it (its K loop peeled), as in the unrolled trace
    assert len(mm) == 2 * 2 * 3 and sum("accumulate" not in s.get("flags", []) for s in mm) == 4
    ops = [s["op"] for s in executed_ops(k.nki_matmul_tiled_.last_json["body"])]
    assert "memset" not in ops
    assert "tensor_tensor" not in ops  # += accumulates on TensorE; loads write the tiles directly
    assert ops.count("tensor_copy") == 4  # only the PSUM evictions


@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_matmul_hoist_load_block_dims(b1, dtype):
    _, _, _, m = b1
    k = m["beta1_matmul"]
    lhsT, rhs = _rand((256, 256), dtype, 14), _rand((256, 1024), dtype, 15)
    got = k.nki_matmul_hoist_load_(lhsT, rhs)
    want = k.reference_matmul(lhsT, rhs)
    tol = 1e-4 if dtype == np.float32 else 2e-2
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=tol, atol=tol)


def test_matmul_spmd_grid(b1):
    nki, _, _, m = b1
    k = m["beta1_matmul"]
    lhsT, rhs = _rand((256, 256), seed=16), _rand((256, 1024), seed=17)
    res = np.zeros((256, 1024), np.float32)
    nki.simulate_kernel(k.nki_matmul_spmd_[2, 2], lhsT, rhs, res)
    np.testing.assert_allclose(res, lhsT.T @ rhs, rtol=1e-5, atol=1e-4)


# --------------------------------------------------------------------------------------------------
# language details
# --------------------------------------------------------------------------------------------------


def test_program_queries(b1):
    nki, nl, _, _ = b1

    @nki.jit
    def k(out):
        i, j = nl.program_id(0), nl.program_id(1)
        v = i * 100 + j * 10 + nl.num_programs() + nl.num_programs(1) * 1000 + nl.program_ndim() * 10000
        t = nl.full((1, 1), v, nl.float32)
        nl.store(out[i:i + 1, j:j + 1], t)

    out = np.zeros((2, 3), np.float32)
    k[2, 3](out)
    want = np.array([[i * 100 + j * 10 + 6 + 3000 + 20000 for j in range(3)] for i in range(2)], np.float32)
    np.testing.assert_array_equal(out, want)

    @nki.jit
    def k0(out):
        nl.store(out, nl.full((1, 1), nl.program_id(0) + nl.num_programs() + 10 * nl.program_ndim(), nl.float32))

    o = np.zeros((1, 1), np.float32)
    k0(o)
    assert o[0, 0] == 1.0


def test_launch_grid_traced_as_loops_where_instances_agree(b1):
    # The instances of a launch grid are traced as loops over their program ids (one recording, the ids
    # symbolic) where their statements agree; an instance whose statements depend on its id (a Python `if`
    # on it, an HBM tensor of its own) has its grid dim unrolled, as every instance was traced before.
    nki, nl, _, _ = b1

    @nki.jit
    def scale(x):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        i = nl.program_id(0)
        t = nl.load(x[i * 128:(i + 1) * 128, :])
        nl.store(out[i * 128:(i + 1) * 128, :], t * 2.0)
        return out

    @nki.jit
    def first_differs(x):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        i = nl.program_id(0)
        t = nl.load(x[i * 128:(i + 1) * 128, :])
        if i == 0:  # Python control flow on the program id
            t = t + 1.0
        nl.store(out[i * 128:(i + 1) * 128, :], t * 2.0)
        return out

    @nki.jit
    def own_hbm(x):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        i = nl.program_id(0)
        tmp = nl.ndarray((128, 64), x.dtype, buffer=nl.hbm)  # each instance's own HBM scratch
        nl.store(tmp, nl.load(x[i * 128:(i + 1) * 128, :]))
        nl.store(out[i * 128:(i + 1) * 128, :], nl.load(tmp) * 2.0)
        return out

    x = _rand((512, 64), seed=41)
    got = scale[4](x)
    _close(got, 2 * x)
    body = scale.last_json["body"]
    loops = [st["loop"] for st in body if "loop" in st]
    assert len(loops) == 1 and loops[0]["var"] == "pid" and (loops[0]["start"], loops[0]["stop"]) == (0, 4)
    assert len([st for st in loops[0]["body"] if "op" in st]) == 3  # load, multiply, store: recorded once
    assert len(executed_ops(body)) == 3 * 4

    want = 2 * x
    want[:128] = 2 * (x[:128] + 1.0)
    _close(first_differs[4](x), want)
    body = first_differs.last_json["body"]
    assert not any("loop" in st for st in body)  # unrolled: every instance traced
    assert [st["op"] for st in body if "op" in st].count("dma_copy") == 2 * 4

    _close(own_hbm[4](x), 2 * x)
    assert not any("loop" in st for st in own_hbm.last_json["body"])
    assert len([t for t in own_hbm.last_json["tensors"] if t["kind"] == "internal"]) == 4

    # the kept grid and the instances traced one by one (loops="unroll"): the same instructions and outputs
    res = []
    for mode in ("unroll", "keep"):
        out, prof = scale[4].options(loops=mode).simulate(x)
        res.append((out, json.loads(prof.to_stats_json())["instructions"], prof.total_time_ns))
    (o_u, n_u, t_u), (o_k, n_k, t_k) = res
    np.testing.assert_array_equal(o_u, o_k)
    assert n_u == n_k == 3 * 4
    assert abs(t_k - t_u) <= 0.02 * t_u, (t_k, t_u)


def test_tile_operators_and_assignment(b1):
    nki, nl, nisa, _ = b1

    @nki.jit
    def k(a, b):
        out = nl.ndarray((6, 128, 64), nl.float32, buffer=nl.shared_hbm)
        x = nl.load(a)
        y = nl.load(b)
        nl.store(out[0], -x + 1.0)
        nl.store(out[1], 2.0 * x - y / 4.0)
        nl.store(out[2], (x > y))
        nl.store(out[3], 1.0 - x * x)
        t = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
        t[...] = 3.0
        t[:, 0:32] = x[:, 32:64]
        nl.store(out[4], t)
        s = nl.ndarray((128, 64), nl.bfloat16, buffer=nl.sbuf)
        col = nl.sum(x, axis=1, keepdims=True)  # (128, 1) broadcast on assignment
        s[...] = col
        s[...] += y
        nl.store(out[5], s)
        return out

    a, b = _rand((128, 64), seed=18), _rand((128, 64), seed=19)
    got = k(a, b)
    _close(got[0], 1.0 - a)
    _close(got[1], 2 * a - b / 4)
    np.testing.assert_array_equal(got[2], (a > b).astype(np.float32))
    _close(got[3], 1 - a * a)
    t = np.full((128, 64), 3.0, np.float32)
    t[:, :32] = a[:, 32:]
    _close(got[4], t)
    s = (a.sum(axis=1, keepdims=True).astype(BF16).astype(np.float32) + b).astype(BF16)
    _close(got[5], s, BF16)


def test_isa_value_functions(b1):
    nki, nl, nisa, _ = b1

    @nki.jit
    def k(a, b):
        out = nl.ndarray((7, 128, 128), nl.float32, buffer=nl.shared_hbm)
        x = nl.load(a)
        y = nl.load(b)
        nl.store(out[0], nisa.tensor_tensor(x, y, nl.multiply))
        nl.store(out[1], nisa.tensor_scalar(x, nl.multiply, 2.0, op1=nl.add, operand1=1.0))
        nl.store(out[2], nisa.nc_transpose(x))
        nl.store(out[3], nl.transpose(x))
        nl.store(out[4], nl.matmul(x, y))  # x @ y (transpose inserted)
        nl.store(out[5], nisa.iota(nl.arange(128)[:, None] * 1000 + nl.arange(128)[None, :], nl.int32))
        m = nisa.memset((128, 128), 7.0, nl.float32)
        nl.store(out[6], nisa.tensor_copy(m, dtype=nl.bfloat16))
        return out

    a, b = _rand((128, 128), seed=20), _rand((128, 128), seed=21)
    got = k(a, b)
    _close(got[0], a * b)
    _close(got[1], 2 * a + 1)
    _close(got[2], a.T)
    _close(got[3], a.T)
    np.testing.assert_allclose(got[4], a @ b, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(got[5], np.add.outer(np.arange(128) * 1000, np.arange(128)).astype(np.float32))
    np.testing.assert_array_equal(got[6], np.full((128, 128), 7.0, np.float32))


def test_dma_copy_keyword_only_and_reduce(b1):
    nki, nl, nisa, _ = b1

    @nki.jit
    def k(a):
        out = nl.ndarray((128, 1), nl.float32, buffer=nl.shared_hbm)
        t = nl.ndarray((128, 256), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a)
        r = nisa.tensor_reduce(nl.add, t, axis=1, keepdims=True)
        nisa.dma_copy(dst=out, src=r)
        return out

    a = _rand((128, 256), seed=22)
    np.testing.assert_allclose(k(a), a.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-4)

    @nki.jit
    def bad(a):
        t = nl.ndarray((128, 256), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(t, a)

    with pytest.raises(TypeError):
        bad(a)


def test_block_dims_need_indexing(b1):
    nki, nl, nisa, _ = b1

    @nki.jit
    def k(a):
        t = nl.zeros((2, nl.par_dim(128), 64), nl.float32, buffer=nl.sbuf)
        assert t.shape == [2, 128, 64]
        return nl.exp(t)

    with pytest.raises(nki.KernelError):
        k(_rand((128, 64)))


def test_masked_reduction(b1):
    """mask= on a reduction (was 'not supported yet'; more in test_nki_views.py)."""
    nki, nl, nisa, _ = b1

    @nki.jit
    def k(a):
        out = nl.ndarray((100, 1), dtype=a.dtype, buffer=nl.shared_hbm)
        i_p = nl.arange(128)[:, None]
        t = nl.load(a[i_p, nl.arange(64)[None, :]])
        s = nl.sum(t, axis=1, mask=(i_p < 100), keepdims=True)
        nl.store(out, value=s[0:100, :])
        return out

    a = _rand((128, 64))
    np.testing.assert_allclose(k(a)[:, 0], a[:100].sum(1), rtol=1e-5, atol=1e-5)


def test_benchmark_baremetal_trace(b1):
    nki, nl, nisa, m = b1

    @nki.trace
    def add_one(t):
        return t + 1.0

    @nki.benchmark(warmup=2, iters=3)
    def k(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        nl.store(out, add_one(nl.load(a)))
        return out

    a = _rand((128, 64), seed=23)
    _close(k(a), a + 1)
    lat = k.benchmark_result.nc_latency
    assert lat.get_latency_percentile(50) > 0 and lat.get_latency_percentile(99) == lat.get_latency_percentile(1)

    bk = nki.baremetal(save_neff_name="x.neff")(k.fn)
    _close(bk(a), a + 1)
    jk = nki.jit(k.fn, mode="simulation", platform_target="trn1")
    assert jk.config == "trn1"
    _close(jk(a), a + 1)


def test_arange_views(b1):
    nki, nl, nisa, _ = b1

    @nki.jit
    def k(a):
        out = nl.ndarray((64, 32), nl.float32, buffer=nl.shared_hbm)
        i_p = nl.arange(64)[:, None]
        i_f = nl.arange(32)[None, :]
        x = nl.load(a[2 * i_p + 1, i_f * 2 + 8])  # strided rows and columns
        nl.store(out[i_p, i_f], x)
        return out

    a = _rand((200, 100), seed=24)
    np.testing.assert_array_equal(k(a), a[1:129:2, 8:72:2])

    @nki.jit
    def oob(a):
        i_p = nl.arange(128)[:, None]
        return nl.load(a[i_p + 100, nl.arange(4)[None, :]])

    with pytest.raises(nki.KernelError):
        oob(a)


def test_masks_tail_tiles(b1):
    """Beta-1 tail handling: loads/stores/ops under affine masks (rectangular)."""
    nki, nl, nisa, _ = b1

    @nki.jit
    def k(a, b):
        n, f = a.shape
        out = nl.ndarray((n, f), nl.float32, buffer=nl.shared_hbm)
        out2 = nl.ndarray((n, f), nl.float32, buffer=nl.shared_hbm)
        i_p = nl.arange(128)[:, None]
        i_f = nl.arange(f)[None, :]
        for i in nl.affine_range((n + 127) // 128):
            m = (i * 128 + i_p < n)
            x = nl.load(a[i * 128 + i_p, i_f], mask=m)
            y = nl.load(b[i * 128 + i_p, i_f], mask=m)
            z = nl.add(x, y, mask=m)
            e = nisa.activation(op=nl.exp, data=z, mask=m)
            nl.store(out[i * 128 + i_p, i_f], value=e, mask=m)
            w = nisa.tensor_scalar(x, nl.multiply, 3.0, mask=m & (i_f < 16))
            nl.store(out2[i * 128 + i_p, i_f], value=w, mask=(i * 128 + i_p < n) & (i_f < 16))
        return out, out2

    a, b = _rand((300, 64), seed=25), _rand((300, 64), seed=26)
    o1, o2 = k(a, b)
    np.testing.assert_allclose(o1, np.exp(a + b), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(o2[:, :16], 3 * a[:, :16], rtol=1e-5, atol=1e-6)

    @nki.jit
    def nonrect(a):  # a non-rectangular mask: one DMA per box of its true region (docs/debugging.md)
        out = nl.ndarray((128, 64), nl.float32, buffer=nl.shared_hbm)
        i_p = nl.arange(128)[:, None]
        i_f = nl.arange(64)[None, :]
        nl.store(out[i_p, i_f], value=nl.zeros((128, 64), nl.float32))
        t = nl.load(a[i_p, i_f], mask=(i_p < i_f))
        nl.store(out[i_p, i_f], value=t, mask=(i_p < i_f))
        return out

    a = _rand((128, 64))
    np.testing.assert_array_equal(nonrect(a), np.where(np.arange(128)[:, None] < np.arange(64)[None, :], a, 0))


def test_assignment_keeps_aliased_values(b1):
    """`t[...] = y[...]` / `p += r[...]` where the value's storage is still referenced: no retargeting."""
    nki, nl, nisa, _ = b1

    @nki.jit
    def k(a):
        out = nl.ndarray((4, 128, 128), nl.float32, buffer=nl.shared_hbm)
        y = nl.load(a)
        t = nl.ndarray((128, 128), nl.float32, buffer=nl.sbuf)
        t[...] = y[...]
        r = nisa.nc_matmul(y, y)
        p = nl.zeros((128, 128), nl.float32, buffer=nl.psum)
        p += r[...]
        p[...] += r
        nl.store(out[0], y)
        nl.store(out[1], r)
        nl.store(out[2], p)
        nl.store(out[3], t)
        return out

    a = _rand((128, 128), seed=27)
    o = k(a)
    np.testing.assert_array_equal(o[0], a)
    np.testing.assert_allclose(o[1], a.T @ a, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(o[2], 2 * (a.T @ a), rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(o[3], a)


@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_rmsnorm_masked_tail(b1, dtype):
    """RMSNorm tutorial: row-tail masks, (1, F) -> (128, F) partition broadcast of the weight."""
    nki, _, _, m = b1
    k = m["beta1_rmsnorm"]
    a = _rand((300, 512), dtype, 28, 0.5, 1.5)
    g = _rand((1, 512), dtype, 29, 0.5, 1.5)
    got = nki.simulate_kernel(k.nki_rmsnorm_kernel, a, g)
    _close(got, k.reference_rmsnorm(a, g), dtype)


def test_tutorial_avgpool(b1):
    """The average-pool tutorial: nl.mgrid advanced indexing, a sum over two of five dims."""
    nki, _, _, m = b1
    x = _rand((64, 32, 48), np.float32, 40)
    got = nki.simulate_kernel(m["beta1_tutorials"].tensor_avgpool_kernel, x, 2)
    np.testing.assert_allclose(got, x.reshape(64, 16, 2, 24, 2).mean(axis=(2, 4)), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_tutorial_transpose2d(b1, dtype):
    """The f1/f2 transpose tutorial: ``out_tile[i_p, i_x * ny + i_y] = nl.copy(in_tile[i_p, i_y * nx + i_x])``
    visits one dim of out_tile with two strides, written as a re-dimensioned access (kernel.json "shape")."""
    nki, _, _, m = b1
    k = m["beta1_tutorials"].tensor_transpose2D_kernel_
    x = _rand((128, 6 * 10), dtype, 41)
    got = nki.simulate_kernel(k, x, (6, 10))
    np.testing.assert_array_equal(got, x.reshape(128, 6, 10).transpose(0, 2, 1).reshape(128, 60))
    shaped = [v for s in k.to_json(x, (6, 10))["body"] for v in s.values() if isinstance(v, dict) and "tensor" in v and "shape" in v]
    assert [(v["shape"], v.get("order")) for v in shaped] == [([128, 10, 6], [0, 2, 1])]


@pytest.mark.parametrize("kernel", ["nki_layernorm_kernel_v1", "nki_layernorm_kernel_v2"])
@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_tutorial_layernorm(b1, kernel, dtype):
    """The LayerNorm tutorial, both versions: a row tail (300 rows), and in v2 bn_stats over a 512-wide
    arange window masked to the 500 columns there are."""
    nki, _, _, m = b1
    t = m["beta1_tutorials"]
    x = _rand((300, 500), dtype, 42)
    g = _rand((500,), dtype, 43, 0.5, 1.5)
    b = _rand((500,), dtype, 44)
    got = nki.simulate_kernel(getattr(t, kernel), x, 1e-5, g, b)
    _close(got, t.reference_layernorm(x, 1e-5, g, b), dtype)


def test_tutorial_mamba_v1(b1):
    """The Mamba v1 sample: tensor_tensor_scan, partition broadcasts, and ``scanC_accum[...] += scanC`` on an
    SBUF tile across an affine_range over states: an associative accumulation the sanitizer does not report."""
    import warnings
    nki, _, _, m = b1
    t = m["beta1_tutorials"]
    rs = np.random.default_rng(46)
    delta = rs.uniform(0, 0.1, (2, 256, 64)).astype(np.float32)
    u = rs.standard_normal((2, 256, 64)).astype(np.float32)
    A = -rs.uniform(0.5, 1.5, (256, 3)).astype(np.float32)
    B = rs.standard_normal((2, 3, 64)).astype(np.float32)
    C = rs.standard_normal((2, 3, 64)).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a sanitizer report is a CheckWarning
        got, prof = t.mamba_v1.simulate(delta, u, A, B, C)
    assert prof.check_reports == []
    np.testing.assert_allclose(got, t.reference_mamba(delta, u, A, B, C), rtol=1e-4, atol=1e-5)



def _mamba_inputs(b, ch, seq, states, seed=46):
    rs = np.random.default_rng(seed)
    delta = rs.uniform(0, 0.1, (b, ch, seq)).astype(np.float32)
    u = rs.standard_normal((b, ch, seq)).astype(np.float32)
    A = -rs.uniform(0.5, 1.5, (ch, states)).astype(np.float32)
    B = rs.standard_normal((b, states, seq)).astype(np.float32)
    C = rs.standard_normal((b, states, seq)).astype(np.float32)
    return delta, u, A, B, C


@pytest.mark.parametrize("kernel", ["mamba_v2", "mamba_v3"])
def test_tutorial_mamba_v2_v3(b1, kernel):
    """Mamba v2 (loops reordered: delta and u loaded once per channel tile) and v3 (the sequence in 512-wide
    steps, the scan's last column assigned into a [128, 1] tile, ``scan_init[...] = scan_res[:, 511]``, and
    passed as the next step's ``initial``): the whole-sequence recurrence of numpy, two steps here, so a carry
    that is lost or stale shows in the second half. No sanitizer report."""
    import warnings
    nki, _, _, m = b1
    t = m["beta1_tutorials"]
    args = _mamba_inputs(2, 256, 1024, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got, prof = getattr(t, kernel).simulate(*args)
    assert prof.check_reports == []
    np.testing.assert_allclose(got, t.reference_mamba(*args), rtol=1e-4, atol=1e-5)


def test_tutorial_mamba_v3_pipelines_where_v2_cannot(b1):
    """The tutorial's step from v2 to v3, as a kernel author meets it: each v2 instruction covers the whole
    [128, 4096] sequence, so every engine waits for the whole previous step of the chain (exp on ScalarE, the
    products, the scan, the accumulation); v3's 512-wide steps let the next step's exp and products run while
    this step scans. Same numbers, v3 the faster (63.1 against 86.0 us on 2026-12-06, v2's loops kept: 94.5 us
    before the placement search gave its scan result the second buffer; asserted with a 10 % margin)."""
    nki, _, _, m = b1
    t = m["beta1_tutorials"]
    args = _mamba_inputs(1, 128, 4096, 2)
    ref = t.reference_mamba(*args)
    times = {}
    for name in ("mamba_v2", "mamba_v3"):
        got, prof = getattr(t, name).simulate(*args)
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
        times[name] = prof.total_time_ns
    assert times["mamba_v3"] < 0.9 * times["mamba_v2"], times



def _mamba_v2_broadcast(b1):
    """`nsim analyze` on the Mamba v2 sample as written: its first finding is the partition broadcasts of B_i
    and C_i on the PE array (``B_i.broadcast_to((128, seq_len))``: a ones-row matmul and a PSUM copy per 512
    columns), named on their lines, its saving re-simulated with them free. The fix its advice names, the rows
    loaded onto every partition by a stride-0 DMA (``nl.load(B[...].broadcast_to(...))``), gives the same
    numbers and is faster. Its saving is within 2x of the estimate only while the broadcasts cost more than the
    stride-0 loads replacing them: 12.7 us estimated, 8.2 us saved until 2026-12-05; since a write-after-read waits
    for the reader's last read, the PE broadcasts overlap better (the kernel 104.5 -> 97.8 us, the fix 96.3 us
    either way): 6.0 us estimated (re-simulated 91.7 us with them free), 1.5 us saved (a strict xfail below).
    Both kernels are traced with their loops unrolled (2026-12-06): kept, the fix's loops time 5.6 % slower than
    unrolled (96.3 against 91.1 us: its SBUF tiles' four rotating buffers; with compiler.loop_buffers=2 kept and
    unrolled agree), which hid its saving (the kept kernel as written 96.2 us, 95.5 unrolled). Unrolled, the first
    finding is `recomputed_value` (``delta_i * u_i`` recomputed for every state: 14.3 us), then the broadcasts'
    (4.1 us estimated), and the fix saves 4.4 us: the estimate is now within 2x."""
    nki, nl, nisa, m = b1
    t = m["beta1_tutorials"]

    @nki.jit
    def mamba_v2_dma_broadcast(delta, u, A, B, C):
        batch_size, channels, seq_len = delta.shape
        output = nl.ndarray((batch_size, channels, seq_len), dtype=delta.dtype, buffer=nl.shared_hbm)
        _, state_size = A.shape
        channel_psize = nl.tile_size.pmax
        n_channel_tile = channels // channel_psize
        for i_batch in nl.affine_range(batch_size):
            for i_channel_tile in nl.affine_range(n_channel_tile):
                channel_start = i_channel_tile * channel_psize
                scanC_accum = nl.zeros((channel_psize, seq_len), dtype=delta.dtype)
                delta_i = nl.load(delta[i_batch, channel_start:channel_start + channel_psize, 0:seq_len])
                u_i = nl.load(u[i_batch, channel_start:channel_start + channel_psize, 0:seq_len])
                for i_state in nl.affine_range(state_size):
                    A_i = nl.load(A[channel_start:channel_start + channel_psize, i_state])
                    deltaA = nisa.activation(op=nl.exp, data=delta_i, scale=A_i)
                    deltaU = nisa.tensor_tensor(delta_i, u_i, op=nl.multiply)
                    B_i_bcast = nl.load(B[i_batch, i_state:i_state + 1, 0:seq_len].broadcast_to(
                        (channel_psize, seq_len)))
                    deltaBu = nisa.tensor_tensor(deltaU, B_i_bcast, op=nl.multiply)
                    scan_res = nisa.tensor_tensor_scan(deltaA, deltaBu, initial=0, op0=np.multiply, op1=np.add)
                    C_i_bcast = nl.load(C[i_batch, i_state:i_state + 1, 0:seq_len].broadcast_to(
                        (channel_psize, seq_len)))
                    scanC = nisa.tensor_tensor(scan_res, C_i_bcast, op=nl.multiply)
                    scanC_accum[0:channel_psize, 0:seq_len] += scanC
                nl.store(output[i_batch, channel_start:channel_start + channel_psize, 0:seq_len],
                         scanC_accum[0:channel_psize, 0:seq_len])
        return output

    args = _mamba_inputs(1, 256, 2048, 4)
    ref = t.reference_mamba(*args)
    got, before = t.mamba_v2.options(loops="unroll").simulate(*args)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
    findings = before.analyze().findings
    assert findings[0]["kind"] == "recomputed_value", findings[0]
    top = next(f for f in findings if f["kind"] == "pe_broadcast")
    assert top["method"].startswith("re-simulated"), top["method"]
    src = open(t.__file__).read().splitlines()
    lines = {l["line"] for l in top["lines"]}
    assert lines and all(".broadcast_to(" in src[n - 1] for n in lines), lines
    got, after = mamba_v2_dma_broadcast.options(loops="unroll").simulate(*args)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
    saved = before.total_time_ns - after.total_time_ns
    assert saved > 0
    return top, saved


def test_tutorial_mamba_v2_broadcast_finding_and_its_fix(b1):
    _mamba_v2_broadcast(b1)


def test_tutorial_mamba_v2_broadcast_estimate_within_2x(b1):
    top, saved = _mamba_v2_broadcast(b1)
    assert saved / 2 <= top["saving_ns"] <= 2 * saved, (top["saving_ns"], saved)



def test_tutorial_rmsnorm_broadcast_claims_no_more_than_its_fix_saves(b1):
    """The published RMSNorm tutorial loads the weight once and broadcasts it inside the row loop
    (``g_tile.broadcast_to((128, F))``: a ones-row matmul per iteration). The kernel is DMA-bound and the broadcast
    hides under the DMA time: with it hoisted out of the loop the kernel is no faster, and the pe_broadcast advice,
    the weight loaded onto every partition by a stride-0 DMA, adds DMA time (4096 x 1024 fp32: 99.9 us, 99.9 us
    hoisted, 101.2 us with the DMA). The finding kept its bound, the time above the DMA bound, over the
    re-simulation with the broadcasts free (0.8 us) until 2026-12-07 and came first at 7.2 us; it now claims at most
    what the re-simulation measures."""
    nki, nl, _, m = b1
    k = m["beta1_rmsnorm"]

    def variant(dma):
        @nki.jit
        def rmsnorm_bcast_once(a_tensor, g_tensor):
            out_tensor = nl.ndarray(a_tensor.shape, dtype=a_tensor.dtype, buffer=nl.shared_hbm)
            ix = nl.arange(128)[:, None]
            iw = nl.arange(1)[:, None]
            iy = nl.arange(a_tensor.shape[1])[None, :]
            if dma:
                g_bcast = nl.load(g_tensor.broadcast_to((128, g_tensor.shape[1])))
            else:
                g_bcast = nl.load(g_tensor[iw, iy]).broadcast_to((128, g_tensor.shape[1]))
            for i in nl.affine_range(a_tensor.shape[0] // 128):
                a_tile = nl.load(a_tensor[i * 128 + ix, iy])
                rms_reciprocal = nl.rsqrt(nl.sum(nl.square(a_tile), axis=[1]) / a_tensor.shape[1])
                out_tile = nl.multiply(nl.multiply(a_tile, rms_reciprocal), g_bcast)
                nl.store(out_tensor[i * 128 + ix, iy], value=out_tile)
            return out_tensor
        return rmsnorm_bcast_once

    a = _rand((4096, 1024), np.float32, 63, 0.5, 1.5)
    g = _rand((1, 1024), np.float32, 64, 0.5, 1.5)
    ref = k.reference_rmsnorm(a, g)
    got, before = k.nki_rmsnorm_kernel.simulate(a, g)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
    assert before.bound == "dma"
    saved = 0.0
    for dma in (False, True):
        got, after = variant(dma).simulate(a, g)
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
        saved = max(saved, before.total_time_ns - after.total_time_ns)
    f = before.analyze().finding("pe_broadcast")
    assert f is None or (f["method"].startswith("re-simulated") and f["saving_ns"] <= saved + 500), (f, saved)


def test_tutorial_rmsnorm_split_reduce_estimate_within_2x(b1):
    """The published RMSNorm tutorial sums the squares in a pass of their own (``nl.sum(nl.square(a_tile),
    axis=[1])``): split_reduce names it, and its fix, ``nisa.activation_reduce`` accumulating the sum while it
    squares, saves about what the finding claims. The kernel is DMA-bound, and the finding's bound claimed 7.0 us
    where the fix saves 1.8 us (4096 x 1024 fp32); since 2026-12-07 it is re-simulated with those reductions free."""
    nki, nl, nisa, m = b1
    import math
    k = m["beta1_rmsnorm"]

    @nki.jit
    def rmsnorm_fused_sum(a_tensor, g_tensor):
        out_tensor = nl.ndarray(a_tensor.shape, dtype=a_tensor.dtype, buffer=nl.shared_hbm)
        num_rows = a_tensor.shape[0]
        ix = nl.arange(128)[:, None]
        iw = nl.arange(1)[:, None]
        iy = nl.arange(a_tensor.shape[1])[None, :]
        g_tile = nl.load(g_tensor[iw, iy])
        for i in nl.affine_range(math.ceil(a_tensor.shape[0] / 128)):
            a_tile = nl.load(a_tensor[i * 128 + ix, iy], mask=(i * 128 + ix < num_rows))
            square_sum = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.activation_reduce(op=nl.square, data=a_tile, reduce_op=nl.add, reduce_res=square_sum)
            rms_reciprocal = nl.rsqrt(square_sum / a_tensor.shape[1])
            out_tile = nl.multiply(a_tile, rms_reciprocal)
            g_bcast = g_tile.broadcast_to((128, g_tensor.shape[1]))
            out_tile[...] = nl.multiply(out_tile, g_bcast, mask=(i * 128 + ix < num_rows))
            nl.store(out_tensor[i * 128 + ix, iy], value=out_tile, mask=(i * 128 + ix < num_rows))
        return out_tensor

    a = _rand((4096, 1024), np.float32, 65, 0.5, 1.5)
    g = _rand((1, 1024), np.float32, 66, 0.5, 1.5)
    ref = k.reference_rmsnorm(a, g)
    got, before = k.nki_rmsnorm_kernel.simulate(a, g)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
    f = before.analyze().finding("split_reduce")
    assert f is not None and f["method"].startswith("re-simulated"), f
    src = open(k.__file__).read().splitlines()
    assert "nl.sum(" in src[f["lines"][0]["line"] - 1]
    got, after = rmsnorm_fused_sum.simulate(a, g)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
    saved = before.total_time_ns - after.total_time_ns
    assert saved > 0 and saved / 2 <= f["saving_ns"] <= 2 * saved, (f["saving_ns"], saved)


def test_softmax_tutorial_split_reduce_not_claimed_when_fusing_saves_nothing(b1):
    """The softmax tutorial's nl kernel (``e = nl.exp(x - row_max)``, then ``nl.sum(e, axis=1)``) is DMA-bound at
    4096 x 1024 fp32: accumulating the sum in the exp (``nisa.activation_reduce``) saves nothing, as the
    re-simulation with the reductions free says. Until 2026-12-07 a re-simulation that came out no faster left the
    bound, the time above the DMA bound (4.6 us), as split_reduce's claim: the rule of the PE-array helpers, whose
    fixes change more than their re-simulation does."""
    nki, nl, nisa, m = b1
    k = m["beta1_softmax"]

    @nki.jit
    def softmax_fused_sum(in_tensor):
        out_tensor = nl.ndarray(in_tensor.shape, dtype=in_tensor.dtype, buffer=nl.shared_hbm)
        n, f = in_tensor.shape
        i_p = nl.arange(128)[:, None]
        i_f = nl.arange(f)[None, :]
        for i in nl.affine_range(n // 128):
            x = nl.load(in_tensor[i * 128 + i_p, i_f], dtype=nl.float32)
            row_max = nl.max(x, axis=[1], keepdims=True)
            row_sum = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)
            e = nisa.activation_reduce(op=nl.exp, data=x - row_max, reduce_op=nl.add, reduce_res=row_sum)
            nl.store(out_tensor[i * 128 + i_p, i_f], value=e / row_sum)
        return out_tensor

    x = _rand((4096, 1024), np.float32, 67)
    ref = k.reference_softmax(x)
    got, before = k.softmax_nl_kernel.simulate(x)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
    got, after = softmax_fused_sum.simulate(x)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
    saved = before.total_time_ns - after.total_time_ns
    f = before.analyze().finding("split_reduce")
    assert f is None or f["saving_ns"] <= max(saved, 0) + 500, (f, saved)


def _softmax_bias(b1):
    """The softmax tutorial's nl kernel with its subtraction folded into the exp's bias= (the max negated by its
    reduction): the fix fold_into_activation names."""
    nki, nl, nisa, _ = b1

    @nki.jit
    def softmax_bias(in_tensor):
        out_tensor = nl.ndarray(in_tensor.shape, dtype=in_tensor.dtype, buffer=nl.shared_hbm)
        n, f = in_tensor.shape
        i_p = nl.arange(128)[:, None]
        i_f = nl.arange(f)[None, :]
        for i in nl.affine_range(n // 128):
            x = nl.load(in_tensor[i * 128 + i_p, i_f], dtype=nl.float32)
            neg_max = nisa.tensor_reduce(op=nl.max, data=x, axis=(1,), negate=True, keepdims=True)
            e = nisa.activation(op=nl.exp, data=x, bias=neg_max)
            nl.store(out_tensor[i * 128 + i_p, i_f], value=e / nl.sum(e, axis=1, keepdims=True))
        return out_tensor

    return softmax_bias


def test_softmax_tutorial_single_buffer_says_sbuf_has_no_room(b1):
    """The softmax tutorial's nl kernel at 1024 x 8192 fp32 makes four [128, 8192] fp32 tiles in its loop body, and
    SBUF cannot hold two buffers of each: the allocator leaves some with one, and the output tile's compute waits for
    its store (single_buffer). The advice to allocate the tile in the loop body does not apply (it is there): the
    detail says SBUF has no room and names the tiles (since 2026-12-07), and one of its remedies, the subtraction
    folded into the exp's bias= (one tile fewer), saves time."""
    nki, nl, nisa, m = b1
    k = m["beta1_softmax"]

    softmax_bias = _softmax_bias(b1)

    x = _rand((1024, 8192), np.float32, 68)
    ref = k.reference_softmax(x)
    got, before = k.softmax_nl_kernel.simulate(x)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
    f = before.analyze().finding("single_buffer")
    assert f is not None and "SBUF cannot hold two buffers" in f["detail"] and "'y'" in f["detail"], f
    assert "bias=" in f["detail"] and f["metrics"]["one_buffer_loop_tiles"] >= 1
    got, after = softmax_bias.simulate(x)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
    assert after.total_time_ns < 0.9 * before.total_time_ns, (before.total_time_ns, after.total_time_ns)


def test_softmax_tutorial_subtraction_folds_into_the_exp(b1):
    """The softmax tutorial's nl kernel computes ``nl.exp(x - row_max)``: a VectorE pass over the tile that the exp's
    bias= makes unnecessary. At 2048 x 4096 fp32 nsim analyze's fold_into_activation names that line (its only
    finding but serialization until 2026-12-07), re-simulated with those passes free, within 2x of what folding
    saves; a subtraction whose result is also stored is not reported (the pass stays)."""
    nki, nl, nisa, m = b1
    k = m["beta1_softmax"]

    softmax_bias = _softmax_bias(b1)

    @nki.jit
    def shifted_also_stored(in_tensor):
        out_tensor = nl.ndarray(in_tensor.shape, dtype=in_tensor.dtype, buffer=nl.shared_hbm)
        shifted = nl.ndarray(in_tensor.shape, dtype=in_tensor.dtype, buffer=nl.shared_hbm)
        n, f = in_tensor.shape
        i_p = nl.arange(128)[:, None]
        i_f = nl.arange(f)[None, :]
        for i in nl.affine_range(n // 128):
            x = nl.load(in_tensor[i * 128 + i_p, i_f], dtype=nl.float32)
            d = x - nl.max(x, axis=[1], keepdims=True)
            nl.store(shifted[i * 128 + i_p, i_f], value=d)
            e = nl.exp(d)
            nl.store(out_tensor[i * 128 + i_p, i_f], value=e / nl.sum(e, axis=1, keepdims=True))
        return out_tensor, shifted

    x = _rand((2048, 4096), np.float32, 69)
    ref = k.reference_softmax(x)
    got, before = k.softmax_nl_kernel.simulate(x)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
    f = before.analyze().finding("fold_into_activation")
    assert f is not None and f["method"].startswith("re-simulated"), f
    src = open(k.__file__).read().splitlines()
    assert [l["line"] for l in f["lines"]] and all("nl.exp(x - row_max)" in src[l["line"] - 1] for l in f["lines"])
    got, after = softmax_bias.simulate(x)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
    saved = before.total_time_ns - after.total_time_ns
    assert saved > 0 and saved / 2 <= f["saving_ns"] <= 2 * saved, (f["saving_ns"], saved)
    (got, sh), prof = shifted_also_stored.simulate(x)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
    assert prof.analyze().finding("fold_into_activation") is None


def _layernorm_v1_broadcast(b1):
    """LayerNorm v1 broadcasts gamma and beta onto the partitions inside its loop (``gamma_sb.broadcast_to((128,
    d))`` of a one-row SBUF tile: a ones-row matmul and a PSUM copy per 512 columns, every tile). `nsim analyze`
    names those lines in a `pe_broadcast` finding; its advice, a 1-D vector loaded once onto every partition by a
    stride-0 DMA (``nl.load(gamma_vector.reshape((1, d)).broadcast_to((128, d)))``, which raised NSIM-E428: no
    dim of the 1-D tensor for the broadcast to sit on), gives the same numbers, no TensorE work and a faster
    kernel (130.1 against 129.4 us with four rotating buffers per loop tile; 132.5 against 126.3 us with two, and
    170.2 / 164.7 against 122.2 / 128.9 us kept / unrolled before the tracer's pools told apart the tiles one
    statement makes through nsim's own calls, 2026-12-05)."""
    nki, nl, nisa, m = b1
    t = m["beta1_tutorials"]
    import math

    @nki.jit
    def layernorm_v1_loaded_once(input_tensor, epsilon, gamma_vector, beta_vector):
        output_tensor = nl.ndarray(input_tensor.shape, dtype=input_tensor.dtype, buffer=nl.shared_hbm)
        i_p_io = nl.arange(nl.tile_size.pmax)[:, None]
        i_f_io = nl.arange(input_tensor.shape[1])[None, :]
        num_rows = input_tensor.shape[0]
        d = gamma_vector.shape[0]
        gamma_sb = nl.load(gamma_vector.reshape((1, d)).broadcast_to((nl.tile_size.pmax, d)))
        beta_sb = nl.load(beta_vector.reshape((1, d)).broadcast_to((nl.tile_size.pmax, d)))
        for i in nl.affine_range(math.ceil(input_tensor.shape[0] / nl.tile_size.pmax)):
            input_sb = nl.load(input_tensor[i * nl.tile_size.pmax + i_p_io, i_f_io],
                               mask=(i * nl.tile_size.pmax + i_p_io < num_rows))
            mean = nl.mean(input_sb, axis=1)
            var = nl.mean(nl.square(input_sb), axis=1) - mean * mean
            shift_scale_tensor = (input_sb - mean) * nl.rsqrt(var + epsilon)
            output_sb = shift_scale_tensor * gamma_sb
            output_sb = output_sb + beta_sb
            nl.store(output_tensor[i * nl.tile_size.pmax + i_p_io, i_f_io], value=output_sb,
                     mask=(i * nl.tile_size.pmax + i_p_io < num_rows))
        return output_tensor

    x = _rand((4096, 1024), np.float32, 60)
    g = _rand((1024,), np.float32, 61, 0.5, 1.5)
    b = _rand((1024,), np.float32, 62)
    ref = t.reference_layernorm(x, 1e-5, g, b)
    got, before = t.nki_layernorm_kernel_v1.simulate(x, 1e-5, g, b)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
    f = before.analyze().finding("pe_broadcast")
    assert f is not None
    src = open(t.__file__).read().splitlines()
    assert {l["line"] for l in f["lines"]} and all(".broadcast_to(" in src[l["line"] - 1] for l in f["lines"])
    got, after = layernorm_v1_loaded_once.simulate(x, 1e-5, g, b)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
    assert after.stat("engine.tensor.active_time") == 0 < before.stat("engine.tensor.active_time")
    saved = before.total_time_ns - after.total_time_ns
    assert saved > 0
    return f, saved


def test_tutorial_layernorm_v1_broadcast_loaded_once(b1):
    _layernorm_v1_broadcast(b1)


def test_tutorial_layernorm_v1_broadcast_estimate_within_2x(b1):
    """Re-simulated with the broadcasts and their PSUM copies taking no time, LayerNorm v1 runs at 116.5 us (from
    131.2 us); the fix, gamma and beta loaded once, 118.4 us: 14.7 us estimated, 12.8 us saved. (Until 2026-12-05,
    when a write-after-read began to wait for the reader's last read rather than its end, the fixed kernel ran
    1.10x its VectorE bound, 129.4 us: 12.0 us estimated, 0.7 us saved, a strict xfail here; with two rotating
    buffers per tile, 9.6 us estimated, 6.2 us saved.)"""
    f, saved = _layernorm_v1_broadcast(b1)
    assert saved / 2 <= f["saving_ns"] <= 2 * saved, (saved, f["saving_ns"])


def test_masked_off_instructions_causal_attention_scores(b1):
    """The causal pattern of the flash attention samples: ``forward_mask = q_tile_idx * 128 >= k_i * 128`` (a
    bool in every iteration) on ``qk_psum[...] += nisa.nc_matmul(..., mask=forward_mask)`` and on
    ``nisa.affine_select(..., on_true_tile=qk_psum[...], mask=forward_mask)``. A False mask issues nothing (the
    blocks above the diagonal keep the -9984 the kernel filled in); affine_select's PSUM on_true is copied to
    SBUF first (GpSimd has no PSUM port)."""
    import warnings
    nki, nl, nisa, _ = b1

    @nki.jit
    def causal_scores(q, k):
        d, S = q.shape
        out = nl.ndarray((S, S), dtype=np.float32, buffer=nl.shared_hbm)
        ip_qk = nl.arange(128)[:, None]
        if_qk = nl.arange(128)[None, :]
        k_sb = nl.load(k)
        for q_tile_idx in nl.affine_range(S // 128):
            q_local_tile = nl.load(q[:, nl.ds(q_tile_idx * 128, 128)])
            qk_res_buf = nl.full((nl.par_dim(128), S), -9984.0, dtype=np.float32)
            for k_i in nl.affine_range(S // 128):
                forward_mask = q_tile_idx * 128 >= k_i * 128
                qk_psum = nl.zeros((nl.par_dim(128), 128), dtype=np.float32, buffer=nl.psum)
                qk_psum[ip_qk, if_qk] += nisa.nc_matmul(moving=k_sb[:, nl.ds(k_i * 128, 128)],
                                                        stationary=q_local_tile, mask=forward_mask)
                qk_res_buf[:, nl.ds(k_i * 128, 128)] = nisa.affine_select(
                    pred=(q_tile_idx * 128 + ip_qk >= k_i * 128 + if_qk),
                    on_true_tile=qk_psum[ip_qk, if_qk], on_false_value=-9984.0, dtype=np.float32, mask=forward_mask)
            nl.store(out[nl.ds(q_tile_idx * 128, 128), :], qk_res_buf)
        return out

    q = _rand((64, 512), np.float32, 47)
    k = _rand((64, 512), np.float32, 48)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no sanitizer report: nothing reads what the skipped ones did not write
        got, _ = causal_scores.simulate(q, k)
    want = np.where(np.tril(np.ones((512, 512), bool)), q.T @ k, np.float32(-9984.0))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    ops = [s["op"] for s in executed_ops(causal_scores.last_json["body"])]
    assert ops.count("nc_matmul") == 4 * 5 // 2 and ops.count("affine_select") == 4 * 5 // 2


@pytest.mark.parametrize("causal", [False, True])
def test_tutorial_sd_attention(b1, causal):
    """The fused self-attention tutorial for small head sizes (S=512, d=64, bf16 matmuls): causal, its
    affine_select reads the PSUM scores (copied to SBUF for GpSimd)."""
    nki, _, _, m = b1
    t = m["beta1_tutorials"]
    q, k, v = (_rand((512, 64), np.float32, s) for s in (49, 50, 51))
    got = nki.simulate_kernel(t.fused_self_attn_for_SD_small_head_size, q, k, v, causal)
    _close(got, t.reference_sd_attention(q, k, v, causal), BF16)


_BOOL_MASK_OPS = {
    # name: (body(nl, nisa, r, x, a, mask) writing r, the opcode it issues, numpy of the same with x = a)
    "activation": (lambda nl, nisa, r, x, a, m: r.__setitem__(Ellipsis, nisa.activation(np.exp, x, mask=m)),
                   "activation", lambda a: np.exp(a)),
    "tensor_scalar": (lambda nl, nisa, r, x, a, m: r.__setitem__(Ellipsis, nisa.tensor_scalar(x, np.multiply, 2.0,
                                                                                          mask=m)),
                      "tensor_scalar", lambda a: 2 * a),
    "nl.exp": (lambda nl, nisa, r, x, a, m: r.__setitem__(Ellipsis, nl.exp(x, mask=m)), "activation",
               lambda a: np.exp(a)),
    "nc_transpose": (lambda nl, nisa, r, x, a, m: r.__setitem__(Ellipsis, nisa.nc_transpose(x, mask=m)),
                     "nc_transpose", lambda a: a.T),
    "nl.matmul": (lambda nl, nisa, r, x, a, m: r.__setitem__(Ellipsis, nl.matmul(x, x, transpose_x=True, mask=m)),
                  "nc_matmul", lambda a: a.T @ a),
    "nl.load": (lambda nl, nisa, r, x, a, m: r.__setitem__(Ellipsis, nl.load(a, mask=m)), "dma_copy",
                lambda a: a),
    "nl.dropout": (lambda nl, nisa, r, x, a, m: r.__setitem__(Ellipsis, nl.dropout(x, rate=0.0, mask=m)),
                   "dropout", lambda a: a),
    "activation+reduce_res": (lambda nl, nisa, r, x, a, m: r.__setitem__(Ellipsis, nisa.activation(
        np.exp, x, reduce_op=np.add, reduce_res=nl.ndarray((128, 1), nl.float32), mask=m)), "activation",
        lambda a: np.exp(a)),
}


def test_masked_activation_reduce_res(b1):
    """nisa.activation(..., reduce_res=, reduce_cmd=reset_reduce, mask=rows < 100): the masked rows and their
    sums; the rest untouched."""
    nki, nl, nisa, _ = b1

    @nki.jit
    def k(a):
        out = nl.ndarray((128, 65), nl.float32, buffer=nl.shared_hbm)
        ip = nl.arange(128)[:, None]
        x = nl.load(a)
        r = nl.full((128, 65), -1.0, nl.float32)
        r[:, 0:64] = nisa.activation(np.exp, x, reduce_op=np.add, reduce_res=r[:, 64:65],
                                     reduce_cmd=nisa.reduce_cmd.reset_reduce, mask=(ip < 100))
        nl.store(out, r)
        return out

    a = _rand((128, 64), np.float32, 53)
    got = k(a)
    np.testing.assert_allclose(got[:100, :64], np.exp(a[:100]), rtol=1e-5)
    np.testing.assert_allclose(got[:100, 64], np.exp(a[:100]).sum(axis=1), rtol=1e-5)
    np.testing.assert_array_equal(got[100:], -1.0)


@pytest.mark.parametrize("name", sorted(_BOOL_MASK_OPS))
def test_bool_masks_issue_or_skip(b1, name):
    """A bool mask (a comparison of loop indices in an unrolled loop): True is no mask, False issues nothing and
    leaves the destination as it was. Iteration 0 of ``i in range(2)`` has ``i >= 1`` False."""
    nki, nl, nisa, _ = b1
    body, opcode, ref = _BOOL_MASK_OPS[name]

    @nki.jit
    def k(a):
        out = nl.ndarray((128, 128), nl.float32, buffer=nl.shared_hbm)
        x = nl.load(a)
        r = nl.full((128, 128), 7.0, nl.float32)
        for i in nl.affine_range(2):
            body(nl, nisa, r, x, a, i >= 1)
        nl.store(out, r)
        return out

    a = _rand((128, 128), np.float32, 52)
    np.testing.assert_allclose(k(a), ref(a), rtol=1e-5, atol=1e-4)
    ops = [s["op"] for s in executed_ops(k.last_json["body"])]
    assert ops.count(opcode) == (1 if opcode != "dma_copy" else 3)  # (dma_copy: x's load and the store too)


def test_flash_fwd_idioms(b1):
    """Idioms of the flash attention sample: a ``@nki.jit(mode='trace')`` helper called from the kernel with
    keyword tiles, ``nisa.get_nc_version()`` branches (dma_transpose on gen3, nc_transpose through PSUM before),
    ``nl.zeros(..., lazy_initialization=True)`` and a scalar assigned to a PSUM tile."""
    nki, nl, nisa, _ = b1

    @nki.jit(mode="trace")
    def transpose_p_local(p_local_transposed, p_local, LARGE_TILE_SZ):
        for i in nl.affine_range(LARGE_TILE_SZ // 512):
            if nisa.get_nc_version() == nisa.nc_version.gen3:
                p_local_t_tmp = nl.ndarray((nl.par_dim(128), 512), buffer=nl.sbuf, dtype=p_local.dtype)
            else:
                p_local_t_tmp = nl.ndarray((nl.par_dim(128), 512), buffer=nl.psum, dtype=np.float32)
            for j in nl.affine_range(512 // 128):
                j_128_slice = nl.ds(j * 128, 128)
                i_j_128_slice = nl.ds(i * 512 + j * 128, 128)
                if nisa.get_nc_version() == nisa.nc_version.gen3:
                    p_local_t_tmp[:, j_128_slice] = nisa.dma_transpose(p_local[:, i_j_128_slice])
                else:
                    p_local_t_tmp[:, j_128_slice] = nisa.nc_transpose(p_local[:, i_j_128_slice])
            p_local_transposed[:, nl.ds(i * 512, 512)] = nl.copy(p_local_t_tmp, dtype=p_local_transposed.dtype)

    @nki.jit
    def k(a):
        out = nl.ndarray((128, 1024), dtype=a.dtype, buffer=nl.shared_hbm)
        acc = nl.zeros((nl.par_dim(128), 1024), dtype=np.float32, buffer=nl.sbuf, lazy_initialization=True)
        ps = nl.ndarray((nl.par_dim(128), 512), dtype=np.float32, buffer=nl.psum)
        ps[:, :] = 0
        transpose_p_local(p_local_transposed=acc, p_local=nl.load(a), LARGE_TILE_SZ=1024)
        acc[:, 0:512] += ps
        nl.store(out, acc)
        return out

    a = _rand((128, 1024), np.float32, 54)
    for config in ("trn1", "trn2"):
        got = k.options(config=config).simulate(a)[0]
        np.testing.assert_array_equal(got, a.reshape(128, 8, 128).transpose(2, 1, 0).reshape(128, 1024))


def test_flash_fwd_accumulators(b1):
    """The flash attention sample's online-softmax bookkeeping: o/l/m accumulators as nl.zeros with two block
    dims before the partition dim (``(n_tile_q, q_h_per_k_h, par_dim(128), d)``) or after it, their views
    (``o_buffer[i, h]``, ``l_buffer[:, i, h]``) passed to a trace-mode core function updated over a
    sequential loop; activation_reduce into a column of a tile, nl.log / exp / maximum on (P,) values."""
    nki, nl, nisa, _ = b1
    par_dim = nl.par_dim

    @nki.jit(mode='trace')
    def core(x_tile, o_buffer, l_buffer, m_buffer, initialize):
      max_ = nisa.tensor_reduce(np.max, x_tile[:, :], axis=(1,), dtype=np.float32, negate=False)
      if initialize:
        m_buffer[:, 0] = nl.copy(max_)
        m_current = max_
      else:
        m_previous = nl.copy(m_buffer[:, 0])
        m_buffer[:, 0] = nl.maximum(m_previous, max_)
        m_current = m_buffer[:, 0]
        alpha = nisa.activation(np.exp, m_previous, bias=-1*m_current, scale=1.0)
      p_partial_sum = nl.ndarray((par_dim(128), 2), dtype=np.float32)
      p_local = nl.ndarray((par_dim(128), 512), dtype=nl.bfloat16)
      for k_r_i in nl.affine_range(2):
        sl = nl.ds(k_r_i * 256, 256)
        p_local[:, sl] = nisa.activation_reduce(np.exp, x_tile[:, sl], bias=-1 * m_current, scale=1.0,
                                                reduce_op=nl.add, reduce_res=p_partial_sum[:, k_r_i], dtype=nl.bfloat16)
      ps = nl.sum(p_partial_sum, axis=1, dtype=np.float32)
      if initialize:
        o_buffer[:, :] = nl.copy(p_local[:, 0:64])
        l_buffer[:, 0] = nl.add(nl.log(ps), max_)
      else:
        o_buffer[:, :] = nl.add(nl.multiply(o_buffer[:, :], alpha), p_local[:, 0:64])
        l_prev = l_buffer[:, 0]
        l_exp = nl.add(nl.exp(nl.subtract(l_prev, m_current)), ps)
        l_buffer[:, 0] = nl.add(m_current, nl.log(l_exp))

    @nki.jit
    def k(x):
      nt, nh = 2, 2
      o = nl.ndarray((nt, nh, 128, 64), dtype=np.float32, buffer=nl.shared_hbm)
      lse = nl.ndarray((nh, 128, nt), dtype=np.float32, buffer=nl.shared_hbm)
      o_buffer = nl.zeros((nt, nh, par_dim(128), 64), dtype=np.float32, buffer=nl.sbuf, lazy_initialization=True)
      l_buffer = nl.zeros((par_dim(128), nt, nh), dtype=np.float32, buffer=nl.sbuf, lazy_initialization=True)
      m_buffer = nl.zeros((nt, nh, par_dim(128), 1), dtype=np.float32, buffer=nl.sbuf, lazy_initialization=True)
      for j in nl.sequential_range(3):
        for i in nl.affine_range(nt):
          for h in nl.affine_range(nh):
            xt = nl.load(x[j, i, h])
            core(x_tile=xt, o_buffer=o_buffer[i, h], l_buffer=l_buffer[:, i, h], m_buffer=m_buffer[i, h], initialize=(j == 0))
      for i in nl.affine_range(nt):
        for h in nl.affine_range(nh):
          nl.store(o[i, h], o_buffer[i, h])
          nl.store(lse[h, :, i], l_buffer[:, i, h])
      return o, lse

    x = _rand((3, 2, 2, 128, 512), np.float32, 55)
    o, lse = k(x)
    m = x.max(axis=(0, 4))
    np.testing.assert_allclose(lse.transpose(2, 0, 1), np.log(np.exp(x - m[None, ..., None]).sum(axis=(0, 4))) + m,
                               rtol=1e-5, atol=1e-5)
    _close(o, np.exp(x[..., :64] - m[None, ..., None]).sum(axis=0), BF16)  # p_local is bf16


def test_masked_bn_stats_partitions(b1):
    """bn_stats / bn_aggr under a mask over partitions and free elements: the masked rows' statistics of the
    masked columns; the other rows of the result are not written (dst keeps its values)."""
    nki, nl, nisa, _ = b1

    @nki.jit
    def k(a):
        out = nl.ndarray((128, 2), nl.float32, buffer=nl.shared_hbm)
        ip = nl.arange(128)[:, None]
        jf = nl.arange(64)[None, :]
        x = nl.load(a)
        st = nl.full((128, 6), 0.0, nl.float32)
        nisa.bn_stats(x[ip, jf], mask=(ip < 100) & (jf < 40), dst=st)
        mv = nl.full((128, 2), -1.0, nl.float32)
        nisa.bn_aggr(st, mask=(ip < 100), dst=mv)
        nl.store(out, mv)
        return out

    a = _rand((128, 64), np.float32, 45)
    got = nki.simulate_kernel(k, a)
    np.testing.assert_allclose(got[:100, 0], a[:100, :40].mean(axis=1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got[:100, 1], a[:100, :40].var(axis=1), rtol=1e-4, atol=1e-6)
    np.testing.assert_array_equal(got[100:], -1.0)


def test_transposed_arange_windows(b1):
    """`out[i_f, i_p]` / `a[i_f, i_p]` (partition index on the second dim): DMA transposes."""
    nki, nl, _, _ = b1

    @nki.jit
    def store_t(a):
        out = nl.ndarray((64, 128), nl.float32, buffer=nl.shared_hbm)
        ip = nl.arange(128)[:, None]
        jf = nl.arange(64)[None, :]
        x = nl.load(a[ip, jf])
        assert out[jf, ip].shape == (128, 64)
        nl.store(out[jf, ip], x)
        return out

    @nki.jit
    def load_t(a):
        out = nl.ndarray((64, 128), nl.float32, buffer=nl.shared_hbm)
        ip = nl.arange(64)[:, None]
        jf = nl.arange(128)[None, :]
        nl.store(out[ip, jf], nl.load(a[jf, ip]))
        return out

    a = _rand((128, 64), seed=30)
    np.testing.assert_array_equal(store_t(a), a.T)
    np.testing.assert_array_equal(load_t(a), a.T)


# --------------------------------------------------------------------------------------------------
# masks on matmuls, transposes and iota (spec §3.8: operand masks restrict K, M and N separately)
# --------------------------------------------------------------------------------------------------


def _matmul_tails(nki, nl, nisa):
    """A Beta-1 tiled matmul for any K, M, N, written as such kernels are: every tile loaded, multiplied and
    stored under masks that clip the tails (``k * TILE_K + i_k < K``)."""

    @nki.jit
    def matmul_tails(lhsT, rhs, TILE_N=512):
        K, M = lhsT.shape
        _, N = rhs.shape
        result = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.shared_hbm)
        TILE_K = nl.tile_size.pmax
        TILE_M = nl.tile_size.gemm_stationary_fmax
        i_k = nl.arange(TILE_K)[:, None]
        i_m = nl.arange(TILE_M)[None, :]
        i_n = nl.arange(TILE_N)[None, :]
        i_res_p = nl.arange(TILE_M)[:, None]
        for m in nl.affine_range((M + TILE_M - 1) // TILE_M):
            for n in nl.affine_range((N + TILE_N - 1) // TILE_N):
                res_psum = nl.zeros((TILE_M, TILE_N), nl.float32, buffer=nl.psum)
                for k in nl.affine_range((K + TILE_K - 1) // TILE_K):
                    lhsT_tile = nl.load(lhsT[k * TILE_K + i_k, m * TILE_M + i_m],
                                        mask=((k * TILE_K + i_k < K) & (m * TILE_M + i_m < M)))
                    rhs_tile = nl.load(rhs[k * TILE_K + i_k, n * TILE_N + i_n],
                                       mask=((k * TILE_K + i_k < K) & (n * TILE_N + i_n < N)))
                    res_psum += nisa.nc_matmul(lhsT_tile[i_k, i_m], rhs_tile[i_k, i_n],
                                               mask=((k * TILE_K + i_k < K) & (m * TILE_M + i_m < M)
                                                     & (n * TILE_N + i_n < N)))
                res_sb = nl.copy(res_psum, dtype=result.dtype)
                nl.store(result[m * TILE_M + i_res_p, n * TILE_N + i_n], value=res_sb,
                         mask=((m * TILE_M + i_res_p < M) & (n * TILE_N + i_n < N)))
        return result

    return matmul_tails


@pytest.mark.parametrize("K,M,N,tile_n", [(300, 200, 700, 512), (300, 200, 300, 128), (256, 128, 512, 512)])
def test_masked_matmul_tails(b1, K, M, N, tile_n):
    """nc_matmul's operand mask: each condition restricts the operand dims its index expression indexes (K: both
    partitions, M: the stationary's free dim, N: the moving's), also when M and N tiles have one size (tile_n=128:
    i_m and i_n tell them apart). The partial tiles multiply only their K rows, M and N columns: the result equals
    numpy's; the matmuls of the last K tile contract 300 - 256 = 44 rows."""
    nki, nl, nisa, _ = b1
    k = _matmul_tails(nki, nl, nisa)
    a, b = _rand((K, M), np.float32, 60), _rand((K, N), np.float32, 61)
    np.testing.assert_allclose(k(a, b, TILE_N=tile_n), a.T @ b, rtol=1e-4, atol=1e-3)
    mms = [s for s in executed_ops(k.last_json["body"]) if s["op"] == "nc_matmul"]
    tiles = -(-K // 128) * -(-M // 128) * -(-N // tile_n)
    assert len(mms) == tiles
    if K % 128:  # the last K tile's matmuls read only its K % 128 partitions
        assert any(s["moving"]["index"][0]["size"] == K % 128 for s in mms if isinstance(s["moving"], dict))


def test_masked_nl_matmul_operand_and_result_masks(b1):
    """nl.matmul(mask=): conditions on each operand's free index (``i_lhs_f < 64``, ``i_rhs_f < 256``) restrict M
    and N; a condition on the result's own index (``i_res_p < 32``: a variable neither operand is indexed with)
    restricts the result rows. Only that part of the PSUM tile is accumulated; the rest keeps its zeros. The
    same with transpose_x=False (x is [M, K])."""
    nki, nl, nisa, _ = b1

    @nki.jit
    def k(lhsT, rhs, which):
        out = nl.ndarray((128, 512), nl.float32, buffer=nl.shared_hbm)
        i_lhs_p, i_lhs_f = nl.mgrid[0:128, 0:128]
        i_rhs_p, i_rhs_f = nl.mgrid[0:128, 0:512]
        i_res_p = nl.arange(128)[:, None]
        a = nl.load(lhsT)
        b = nl.load(rhs)
        res = nl.zeros((128, 512), nl.float32, buffer=nl.psum)
        if which == 0:
            res[...] += nl.matmul(a[i_lhs_p, i_lhs_f], b[i_rhs_p, i_rhs_f], transpose_x=True,
                                  mask=((i_lhs_f < 64) & (i_rhs_f < 256)))
        elif which == 1:
            res[...] += nl.matmul(a[i_lhs_p, i_lhs_f], b[i_rhs_p, i_rhs_f], transpose_x=True, mask=(i_res_p < 32))
        else:  # x = a as [M, K]: i_lhs_f indexes K here
            res[...] += nl.matmul(a[i_lhs_p, i_lhs_f], b[i_rhs_p, i_rhs_f], mask=((i_lhs_f < 100) & (i_lhs_p < 64)))
        nl.store(out, nl.copy(res))
        return out

    a, b = _rand((128, 128), np.float32, 62), _rand((128, 512), np.float32, 63)
    ref = np.zeros((128, 512), np.float32)
    ref[:64, :256] = (a.T @ b)[:64, :256]
    np.testing.assert_allclose(k(a, b, 0), ref, rtol=1e-4, atol=1e-3)
    ref = np.zeros((128, 512), np.float32)
    ref[:32] = (a.T @ b)[:32]
    np.testing.assert_allclose(k(a, b, 1), ref, rtol=1e-4, atol=1e-3)
    ref = np.zeros((128, 512), np.float32)
    ref[:64] = a[:64, :100] @ b[:100]
    np.testing.assert_allclose(k(a, b, 2), ref, rtol=1e-4, atol=1e-3)


def test_operand_masks_written_as_subscripts(b1):
    """Spec §3.8: nc_matmul / nl.matmul take operand masks written as subscripts of the operands
    (``lhs_T[i_lhs_f <= 64]`` restricts M, ``rhs[i_rhs_f <= 256]`` N; ``t[i_p < K, i_f < M]`` several at once).
    Was NSIM-E424 (a comparison is no subscript item). The condition belongs to the operand it subscripts, even
    when both use one nl.arange (as mask= it would be ambiguous); only the selected part of the result is
    computed, as with mask=. Any other use of such a view is NSIM-E446."""
    import nsim as nsim_errors
    nki, nl, nisa, _ = b1

    @nki.jit
    def k(lhsT, rhs, which):
        out = nl.ndarray((128, 512), nl.float32, buffer=nl.shared_hbm)
        i_f = nl.arange(128)[None, :]
        i_rhs_f = nl.arange(512)[None, :]
        i_p = nl.arange(128)[:, None]
        a = nl.load(lhsT)
        b = nl.load(rhs)
        res = nl.zeros((128, 512), nl.float32, buffer=nl.psum)
        if which == 0:
            res[...] += nl.matmul(a[i_f <= 64], b[i_rhs_f <= 256], transpose_x=True)
        elif which == 1:  # the same nl.arange in both operands' conditions: each restricts its own operand
            sq = nl.zeros((128, 128), nl.float32, buffer=nl.psum)
            sq[...] += nisa.nc_matmul(a[i_f < 32], a[i_f < 100])
            nl.store(out[:, 0:128], nl.copy(sq))
            return out
        elif which == 4:  # a condition that does not index its operand (b's free size is 512)
            res[...] += nisa.nc_matmul(a, b[i_f < 100])
        elif which == 2:  # two conditions: K (the partitions) and M
            res[...] += nisa.nc_matmul(a[i_p < 96, i_f < 48], b)
        else:
            nl.store(out, nl.exp(a[i_f < 10]))
            return out
        nl.store(out, nl.copy(res))
        return out

    a, b = _rand((128, 128), np.float32, 66), _rand((128, 512), np.float32, 67)
    full = a.T @ b
    ref = np.zeros((128, 512), np.float32)
    ref[:65, :257] = full[:65, :257]
    np.testing.assert_allclose(k(a, b, 0), ref, rtol=1e-4, atol=1e-3)
    mm = [o for o in executed_ops(k.last_json["body"]) if o["op"] in ("nc_matmul", "multiply_moving")]
    assert len(mm) == 1
    got = k(a, b, 1)[:, :128]
    ref = np.zeros((128, 128), np.float32)
    ref[:32, :100] = (a.T @ a)[:32, :100]
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-3)
    with pytest.raises(nsim_errors.KernelError, match="NSIM-E438.*does not index the view"):
        k(a, b, 4)
    ref = np.zeros((128, 512), np.float32)
    ref[:48] = a[:96, :48].T @ b[:96]
    np.testing.assert_allclose(k(a, b, 2), ref, rtol=1e-4, atol=1e-3)
    with pytest.raises(nsim_errors.KernelError, match="NSIM-E446.*operand mask"):
        k(a, b, 3)


def test_masked_matmul_ambiguous_and_off(b1):
    """One variable indexing both operands' free dims cannot say which it restricts: NotImplementedError naming
    the fix; one that fits no operand is NSIM-E438. A mask that holds nowhere issues no matmul and adds nothing."""
    import nsim as nsim_errors
    nki, nl, nisa, _ = b1

    @nki.jit
    def k(lhsT, rhs, which):
        out = nl.ndarray((128, 128), nl.float32, buffer=nl.shared_hbm)
        i_p, i_f = nl.mgrid[0:128, 0:128]
        a = nl.load(lhsT)
        b = nl.load(rhs)
        res = nl.zeros((128, 128), nl.float32, buffer=nl.psum)
        i_x = nl.arange(7)[None, :]
        m = (i_f < 64) if which == 0 else (i_p < 0) if which == 1 else (i_x < 3)
        res[...] += nisa.nc_matmul(a[i_p, i_f], b[i_p, i_f], mask=m)
        nl.store(out, nl.copy(res))
        return out

    a, b = _rand((128, 128), np.float32, 64), _rand((128, 128), np.float32, 65)
    with pytest.raises(NotImplementedError, match="either operand"):
        k(a, b, 0)
    with pytest.raises(nsim_errors.KernelError, match="NSIM-E438.*fits none of the operands"):
        k(a, b, 2)  # a condition of another size than any operand's dims
    np.testing.assert_array_equal(k(a, b, 1), np.zeros((128, 128), np.float32))
    assert "nc_matmul" not in [s["op"] for s in executed_ops(k.last_json["body"])]


@pytest.mark.parametrize("form", ["nc_transpose", "nc_transpose_out", "nc_transpose_bf16", "nl.transpose",
                                  "nl.transpose_bf16", "load_transpose2d", "dma_transpose"])
def test_masked_transposes(b1, form):
    """A transpose under mask=: a condition on the input's index (``i_p < 100`` on ``x[i_p, i_f]``) or on the
    result's (``i_out_f < 100``) transposes that part only; assigned into a tile, the rest keeps its value."""
    nki, nl, nisa, _ = b1

    @nki.jit
    def k(x):
        out = nl.ndarray((64, 128), nl.float32, buffer=nl.shared_hbm)
        i_p, i_f = nl.mgrid[0:128, 0:64]
        i_out_f = nl.arange(128)[None, :]
        t = nl.load(x)
        o = nl.full((64, 128), 7.0, nl.float32)
        if form == "nc_transpose":
            o[...] = nisa.nc_transpose(t[i_p, i_f], mask=(i_p < 100))
        elif form == "nc_transpose_out":
            o[...] = nisa.nc_transpose(t[i_p, i_f], mask=(i_out_f < 100))
        elif form == "nc_transpose_bf16":  # the written part is cast (a copy of that part only)
            o[...] = nisa.nc_transpose(t[i_p, i_f], mask=(i_p < 100), dtype=nl.bfloat16)
        elif form == "nl.transpose_bf16":
            o[...] = nl.transpose(t[i_p, i_f], mask=(i_p < 100), dtype=nl.bfloat16)
        elif form == "nl.transpose":
            o[...] = nl.transpose(t[i_p, i_f], mask=(i_p < 100))
        elif form == "load_transpose2d":
            o[...] = nl.load_transpose2d(x[i_p, i_f], mask=(i_p < 100))
        else:
            o[...] = nisa.dma_transpose(t[i_p, i_f], mask=(i_p < 100))
        nl.store(out, o)
        return out

    x = _rand((128, 64), np.float32, 66)
    ref = np.full((64, 128), 7.0, np.float32)
    ref[:, :100] = x[:100].T
    if form.endswith("bf16"):
        np.testing.assert_allclose(k(x), ref, rtol=1e-2, atol=1e-2)
    else:
        np.testing.assert_array_equal(k(x), ref)


@pytest.mark.filterwarnings("ignore:NSIM-W509")  # partition starts the hardware does not allow
def test_masked_iota(b1):
    """nisa.iota(expr, mask=): the expression's values on the mask's rectangle, written there only."""
    nki, nl, nisa, _ = b1

    @nki.jit
    def k():
        out = nl.ndarray((128, 64), nl.int32, buffer=nl.shared_hbm)
        i_p = nl.arange(128)[:, None]
        i_f = nl.arange(64)[None, :]
        t = nl.full((128, 64), -1, nl.int32)
        t[i_p, i_f] = nisa.iota(i_p * 64 + i_f + 5, dtype=nl.int32, mask=((i_f >= 8) & (i_f < 40) & (i_p >= 3)))
        nl.store(out, t)
        return out

    ref = np.full((128, 64), -1, np.int32)
    ref[3:, 8:40] = (np.arange(128)[:, None] * 64 + np.arange(64) + 5)[3:, 8:40]
    np.testing.assert_array_equal(k(), ref)


def test_none_in_subscripts(b1):
    """None in a subscript inserts a size-1 dim (spec §3.8), with slices, ints and ``...``, on tiles and HBM."""
    nki, nl, nisa, _ = b1

    @nki.jit
    def k(x, which):
        t = nl.load(x)
        if which == 0:
            out = nl.ndarray((128, 1, 64), dtype=nl.float32, buffer=nl.shared_hbm)
            nl.store(out, t[:, None, :])
        elif which == 1:
            out = nl.ndarray((64, 32, 1), dtype=nl.float32, buffer=nl.shared_hbm)
            nl.store(out, t[0:64, 0:32, None])
        elif which == 2:
            out = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.shared_hbm)
            nl.store(out, nl.exp(t[..., None][:, :, 0]))
        elif which == 3:
            out = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.shared_hbm)
            nl.store(out, nl.load(x[None, :, :][0]))
        else:
            out = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.shared_hbm)
            nl.store(out, t[:, 5, None])
        return out

    x = _rand((128, 64), np.float32, 67)
    np.testing.assert_array_equal(k(x, 0), x[:, None, :])
    np.testing.assert_array_equal(k(x, 1), x[:64, :32, None])
    np.testing.assert_allclose(k(x, 2), np.exp(x), rtol=1e-5)
    np.testing.assert_array_equal(k(x, 3), x)
    np.testing.assert_array_equal(k(x, 4), x[:, 5, None])


def test_nki_profile_writes_timeline_and_report(b1, tmp_path, capsys):
    """``@nki.profile(working_directory=..., save_trace_name=...)`` as the NKI profiling tutorial writes it: the
    kernel runs once (its result as usual) and its Perfetto timeline and analysis report land in the directory,
    named after save_trace_name (default: the kernel's name)."""
    nki, nl, nisa, _ = b1
    from neuronxcc.nki import profile

    wd = tmp_path / "profiles"

    @profile(working_directory=str(wd), save_neff_name="file.neff", save_trace_name="profile.ntff", profile_nth=2)
    def add(a, b):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.load(a) + nl.load(b))
        return out

    a = _rand((128, 512), np.float32, 68)
    np.testing.assert_array_equal(add(a, a), a + a)
    trace, report = wd / "profile.pftrace", wd / "profile.analysis.txt"
    assert trace.stat().st_size > 0
    text = report.read_text()
    assert text.startswith("nsim analysis: add on trn2") and "Bounds" in text
    assert str(trace) in capsys.readouterr().err

    named = nki.profile(add.fn, working_directory=str(wd))
    named(a, a)
    assert (wd / "add.pftrace").exists() and (wd / "add.analysis.txt").exists()


def test_masked_load_into_a_view_writes_it_directly(b1):
    """``buf[k, i_k, i_n] = nl.load(x[...], mask=...)``: the masked load writes its part of the view directly, as the
    instruction does on hardware: no copy through a temporary, and nothing unwritten is read (before, the whole
    temporary was copied, unwritten rows included, and the sanitizer reported NSIM-W501)."""
    import warnings
    nki, nl, nisa, _ = b1

    @nki.jit
    def k(x):
        K, N = x.shape
        out = nl.ndarray((K, N), dtype=x.dtype, buffer=nl.shared_hbm)
        i_k = nl.arange(128)[:, None]
        i_n = nl.arange(N)[None, :]
        kt = (K + 127) // 128
        buf = nl.ndarray((kt, nl.par_dim(128), N), dtype=x.dtype, buffer=nl.sbuf)
        for j in nl.affine_range(kt):
            buf[j, i_k, i_n] = nl.load(x[j * 128 + i_k, i_n], mask=(j * 128 + i_k < K))
        for j in nl.affine_range(kt):
            res = nl.ndarray((128, N), dtype=x.dtype, buffer=nl.sbuf)
            res[i_k, i_n] = nl.exp(buf[j, i_k, i_n], mask=(j * 128 + i_k < K))
            nl.store(out[j * 128 + i_k, i_n], value=res[i_k, i_n], mask=(j * 128 + i_k < K))
        return out

    x = _rand((200, 256), np.float32, 69)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_allclose(k(x), np.exp(x), rtol=1e-5)
    ops = [s["op"] for s in executed_ops(k.last_json["body"])]
    assert "tensor_copy" not in ops and ops.count("dma_copy") == 4


def test_unsupported_beta1_forms_are_nsim_errors(b1):
    """What nsim does not support yet is NSIM-E446 (NotSupportedError, also a NotImplementedError) at the kernel's
    line, not a bare NotImplementedError from inside nsim."""
    import nsim
    nki, nl, nisa, _ = b1

    @nki.jit
    def nonrect(a):  # (a non-rectangular mask is supported on loads, stores and element-wise ops, not reductions)
        i_p = nl.arange(128)[:, None]
        i_f = nl.arange(64)[None, :]
        return nl.sum(nl.load(a), axis=1, keepdims=True, mask=(i_p < i_f))

    with pytest.raises(nsim.NotSupportedError) as e:
        nonrect(_rand((128, 64)))
    assert e.value.code == "NSIM-E446" and isinstance(e.value, NotImplementedError)
    assert e.value.file == __file__ and "non-rectangular" in e.value.message
    with pytest.raises(nsim.NotSupportedError, match="Beta-1 API"):
        nsim.nki.benchmark(nonrect.fn)


def test_masked_softmax_var_dropout(b1):
    """nl.softmax / nl.var / nl.dropout under mask=: computed on the mask's rectangle (softmax over its columns,
    the variance of its elements), written there only; the rest of the destination keeps its value."""
    nki, nl, nisa, _ = b1

    @nki.jit
    def k(x):
        out = nl.ndarray((128, 256), nl.float32, buffer=nl.shared_hbm)
        var = nl.ndarray((128, 1), nl.float32, buffer=nl.shared_hbm)
        drop = nl.ndarray((128, 256), nl.float32, buffer=nl.shared_hbm)
        i_p = nl.arange(128)[:, None]
        i_f = nl.arange(256)[None, :]
        t = nl.load(x)
        o = nl.full((128, 256), 5.0, nl.float32)
        o[i_p, i_f] = nl.softmax(t[i_p, i_f], axis=1, mask=(i_p < 100) & (i_f < 200))
        nl.store(out, o)
        v = nl.full((128, 1), -1.0, nl.float32)
        v[...] = nl.var(t[i_p, i_f], axis=1, mask=(i_p < 90) & (i_f >= 16))
        nl.store(var, v)
        d = nl.full((128, 256), 5.0, nl.float32)
        d[i_p, i_f] = nl.dropout(t[i_p, i_f], 0.0, mask=(i_p >= 64))
        nl.store(drop, d)
        return out, var, drop

    x = _rand((128, 256), np.float32, 70)
    o, v, d = k(x)
    ref = np.full((128, 256), 5.0, np.float32)
    e = np.exp(x[:100, :200] - x[:100, :200].max(1, keepdims=True))
    ref[:100, :200] = e / e.sum(1, keepdims=True)
    np.testing.assert_allclose(o, ref, rtol=1e-5, atol=1e-6)
    rv = np.full((128, 1), -1.0, np.float32)
    rv[:90, 0] = x[:90, 16:].var(1)
    np.testing.assert_allclose(v, rv, rtol=1e-4, atol=1e-6)
    rd = np.full((128, 256), 5.0, np.float32)
    rd[64:] = x[64:]  # rate 0 keeps every element
    np.testing.assert_allclose(d, rd, rtol=1e-6)


def test_masked_tiled_matmul_keeps_its_loops(b1):
    """The tiled matmul with masked tails at 1000^3: the masks on the outer loops' indices inside the K loop hold
    in every iteration between the first and the last, so the loops are kept (peeled, and paired: their bodies
    allocate tiles) instead of unrolled, with the unrolled trace's instructions and simulated time."""
    import nsim
    nki, nl, nisa, _ = b1
    k = _matmul_tails(nki, nl, nisa)
    a, b = _rand((1000, 1000), np.float32, 71), _rand((1000, 1000), np.float32, 72)
    res = []
    # (two rotating buffers: the loops are then recorded two iterations per pass, and the 6 tiles between the peeled
    # ones make 3 pairs; with trn2's 4 a pass takes 4 iterations, tracer._group, and 6 are too few: unrolled)
    for mode in ("unroll", "keep"):
        _, prof = k.options(loops=mode, timing_only=True, overrides=["compiler.loop_buffers=2"]).simulate(a, b)
        n = json.loads(prof.to_stats_json())["instructions"]
        res.append((prof.total_time_ns, len(json.dumps(k.last_json)), n))
    (t_u, size_u, n_u), (t_k, size_k, n_k) = res
    # 560 instructions less the zeroings of the 7 output tiles that no mask clips (8 x 2 tiles; the last row and
    # column of tiles are partial): their first `+=` matmul starts the accumulation instead
    assert t_k == t_u and n_k == n_u == 560 - 7
    assert size_k < size_u / 2


def test_fill_overwritten_whole_is_dropped(b1):
    """``nl.zeros`` (``ones``, ``full``) then a write of the whole tile that reads nothing of it: the fill is a dead
    store, which the compiler drops (the nki-samples flash attention zeroes its PSUM scores before each
    ``qk_psum[:, :] = nl.matmul(...)``). A partial write, an accumulation (``+=``) or a read first keeps it; the
    values are the same either way. A zero fill followed by ``+=`` next to it is folded into the first matmul,
    which starts the accumulation group; so is one followed by a loop of ``+=`` (the loop is peeled: its first
    iteration, next to the fill, folds it, as the unrolled trace does; kept since 2026-12-06). A write of some
    elements (a predicated copy), or a write in a loop after the fill, keeps it."""
    nki, nl, nisa, _ = b1

    @nki.jit
    def k(a, w):
        out = nl.ndarray((7, 128, 128), dtype=np.float32, buffer=nl.shared_hbm)
        over = nl.zeros((128, 128), dtype=np.float32, buffer=nl.psum)  # overwritten whole by a matmul: dropped
        over[:, :] = nl.matmul(nl.load(a), nl.load(w), transpose_x=True)
        loaded = nl.full((128, 128), 3.0, dtype=np.float32)  # overwritten whole by a load: dropped
        loaded[...] = nl.load(w)
        part = nl.zeros((128, 128), dtype=np.float32)  # half overwritten: kept
        part[:, 0:64] = nl.load(w[:, 0:64])
        acc = nl.zeros((128, 128), dtype=np.float32, buffer=nl.psum)  # accumulated into in a loop: folded
        for i in nl.affine_range(2):
            acc[...] += nisa.nc_matmul(nl.load(a), nl.load(w))
        one = nl.zeros((128, 128), dtype=np.float32, buffer=nl.psum)  # accumulated into next to it: folded
        one[...] += nisa.nc_matmul(nl.load(a), nl.load(w))
        pred = nl.zeros((128, 128), dtype=np.float32)  # a predicated copy writes some elements: kept
        looped = nl.zeros((128, 128), dtype=np.float32)  # overwritten in a loop (which might run no iteration): kept
        for i in nl.sequential_range(2):
            looped[...] = nl.load(w)
        nisa.tensor_copy_predicated(src=nl.load(w), dst=pred, predicate=nl.greater(nl.load(w), 0.0))
        nl.store(out[0], value=nl.copy(over))
        nl.store(out[1], value=loaded)
        nl.store(out[2], value=part)
        nl.store(out[3], value=nl.copy(acc))
        nl.store(out[4], value=nl.copy(one))
        nl.store(out[5], value=pred)
        nl.store(out[6], value=looped)
        return out

    rng = np.random.default_rng(5)
    a = (rng.standard_normal((128, 128)) / 8).astype(np.float32)
    w = rng.standard_normal((128, 128)).astype(np.float32)
    got = np.asarray(k(a, w))
    mm = a.astype(np.float64).T @ w.astype(np.float64)
    _close(got[0], mm)
    _close(got[1], w)
    _close(got[2][:, :64], w[:, :64])
    assert (got[2][:, 64:] == 0).all()
    _close(got[3], 2 * mm)
    _close(got[4], mm)
    _close(got[5], np.where(w > 0, w, 0.0))
    _close(got[6], w)
    src = open(__file__).read().splitlines()
    fills = [s.get("loc", {}).get("line") for s in executed_ops(k.last_json["body"]) if s["op"] == "memset"]
    kept = [i for i, t in enumerate(src, 1) if "= nl.zeros(" in t and t.endswith(": kept")]
    assert len(kept) == 3
    assert sorted(fills) == sorted(kept)
    # the loop of `+=`: peeled (its first matmul starts the group), the same time as the unrolled trace
    k2 = k.options(loops="unroll")
    np.testing.assert_array_equal(np.asarray(k2(a, w)), got)
    assert k2.last_profile.total_time_ns == k.last_profile.total_time_ns
