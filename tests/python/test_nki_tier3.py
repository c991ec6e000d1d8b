"""Tier-3 (spec §2.3) and §2.4 ``nki.isa`` instructions in both dialects, each traced, simulated and
checked against a numpy reference (fp32 1e-5, bf16 1e-2), with the edge cases the spec states."""

import numpy as np
import pytest

from conftest import executed_ops, require_core  # noqa: E402

_core, ml_dtypes = require_core()

from nsim import _errors, nki  # noqa: E402
from nsim.tracer import NsimError  # noqa: E402
import nsim.nki.language as nl  # noqa: E402
import nsim.nki.isa as nisa  # noqa: E402
from nki_helpers import load as _load, store as _store  # noqa: E402

from numeric_helpers import close as _close, rand as _rand  # noqa: E402

BF16 = ml_dtypes.bfloat16


def _ops(kernel):
    return [s["op"] for s in kernel.last_json["body"] if "op" in s]


# ---- numpy references ------------------------------------------------------------------------------


def ref_max8(x):
    f = np.asarray(x, np.float32).reshape(x.shape[0], -1)
    return -np.sort(-f, axis=1, kind="stable")[:, :8]


def ref_find_index8(data, vals, bits=32):
    d = np.asarray(data, np.float32).reshape(data.shape[0], -1)
    v = np.asarray(vals, np.float32).reshape(vals.shape[0], -1)
    out = np.full((d.shape[0], 8), (1 << bits) - 1, np.uint64)
    for p in range(d.shape[0]):
        taken = set()
        for i in range(8):
            for j in range(d.shape[1]):
                if j not in taken and d[p, j] == v[p, i]:
                    taken.add(j)
                    out[p, i] = j
                    break
    return out


def ref_match_replace8(data, vals, imm):
    d = np.asarray(data, np.float32).reshape(data.shape[0], -1).copy()
    v = np.asarray(vals, np.float32).reshape(vals.shape[0], -1)
    idx = np.full((d.shape[0], 8), 0xFFFFFFFF, np.uint64)
    for p in range(d.shape[0]):
        for i in range(7, -1, -1):
            hit = np.nonzero(d[p] == v[p, i])[0]
            if hit.size:
                d[p, hit[0]] = imm
                idx[p, i] = hit[0]
    return d.reshape(data.shape), idx


def ref_sequence_bounds(ids):
    ids = np.asarray(ids).reshape(-1)
    n = ids.size
    start, end = np.zeros(n), np.zeros(n)
    i = 0
    while i < n:
        e = i + 1
        while e < n and ids[e] == ids[i]:
            e += 1
        start[i:e], end[i:e] = (n, -1) if ids[i] == 0 else (i, e)
        i = e
    return np.stack([start, end])[None]


def ref_local_gather(src, index, e, nv=None):
    p, _ = src.shape
    out = []
    for g in range(p // 16):
        ids = index[16 * g:16 * g + 16].reshape(16, -1).flatten(order="F")
        ids = ids[:nv] if nv is not None else ids
        for r in range(16):
            row = src[16 * g + r]
            out.append(np.concatenate([row[i:i + e] for i in ids]))
    return np.stack(out)


def ref_cumulative(x, op0, imm0, op1, init):
    f0 = {"add": np.add, "multiply": np.multiply, "subtract": np.subtract}[op0]
    f1 = {"add": lambda a, r: a + r, "multiply": lambda a, r: a * r, "maximum": np.maximum,
          "minimum": np.minimum, "subtract": lambda a, r: a - r}[op1]
    x = np.asarray(x, np.float32).reshape(x.shape[0], -1)
    out = np.zeros_like(x)
    for p in range(x.shape[0]):
        reg = np.float32(init[p] if np.ndim(init) else init)
        for i in range(x.shape[1]):
            reg = np.float32(f1(np.float32(f0(x[p, i], np.float32(imm0))), reg))
            out[p, i] = reg
    return out


# ---- max8 ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_max8_new(dtype):
    @nki.jit
    def k(x):
        t = _load(x)
        d = nl.ndarray((x.shape[0], 8), x.dtype, buffer=nl.sbuf)
        nisa.max8(dst=d, src=t)
        return _store(d)

    x = _rand((64, 4, 50), dtype, seed=3)
    x[5, 1, 7] = x[5, 2, 9] = x[5, 3, 3] = 7.0  # duplicates kept
    y = k(x)
    want = ref_max8(x)
    _close(y, want, dtype)
    np.testing.assert_array_equal(np.asarray(y, np.float32)[5, :3], [7.0, 7.0, 7.0])
    assert "max8" in _ops(k)


def test_max8_psum_src_and_sizes():
    @nki.jit
    def k(x):
        t = _load(x)
        ps = nl.ndarray(x.shape, nl.float32, buffer=nl.psum)
        nisa.tensor_copy(dst=ps, src=t)
        d = nl.ndarray((x.shape[0], 8), nl.float32, buffer=nl.sbuf)
        nisa.max8(d, ps)
        return _store(d)

    x = _rand((32, 8), np.float32, seed=4)  # exactly 8: a sort of each row
    _close(k(x), ref_max8(x))


def test_max8_rejects_bad_sizes():
    @nki.jit
    def k(x):
        t = _load(x)
        d = nl.ndarray((x.shape[0], 8), x.dtype, buffer=nl.sbuf)
        nisa.max8(dst=d, src=t)
        return _store(d)

    with pytest.raises(Exception, match="8 to 16384"):
        k(_rand((4, 7), np.float32))


def test_max8_beta1(b1):
    bnki, bnl, bisa = b1

    @bnki.jit
    def k(a):
        out = bnl.ndarray((a.shape[0], 8), a.dtype, buffer=bnl.shared_hbm)
        x = bnl.load(a)
        m = bisa.max8(src=x)
        assert tuple(m.shape) == (a.shape[0], 8)
        bnl.store(out, m)
        return out

    for dt in (np.float32, BF16):
        a = _rand((128, 300), dt, seed=5)
        _close(k(a), ref_max8(a), dt)


# ---- nc_find_index8 ----------------------------------------------------------------------------------


def _find_data(p=16, n=40, seed=6):
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 12, (p, n)).astype(np.float32)  # many duplicates
    vals = np.sort(data, axis=1)[:, ::-1][:, :8].copy()
    vals[0, 7] = 99.0   # not found -> all ones
    vals[1, :] = data[1, 3]  # 8 copies of one value: successive matches, then all ones
    return data, vals


@pytest.mark.parametrize("idx_dtype,bits", [(np.uint32, 32), (np.uint16, 16)])
def test_find_index8_new(idx_dtype, bits):
    @nki.jit
    def k(data, vals):
        d = nl.ndarray((data.shape[0], 8), idx_dtype, buffer=nl.sbuf)
        nisa.nc_find_index8(dst=d, data=_load(data), vals=_load(vals))
        return _store(d)

    data, vals = _find_data()
    got = k(data, vals)
    assert got.dtype == np.dtype(idx_dtype)
    np.testing.assert_array_equal(got.astype(np.uint64), ref_find_index8(data, vals, bits))
    assert got[0, 7] == (1 << bits) - 1


def test_find_index8_with_max8_and_beta1(b1):
    bnki, bnl, bisa = b1

    @bnki.jit
    def k(a):
        out = bnl.ndarray((a.shape[0], 8), bnl.uint32, buffer=bnl.shared_hbm)
        x = bnl.load(a)
        m = bisa.max8(src=x)
        i = bisa.nc_find_index8(data=x, vals=m)
        assert i.dtype == np.uint32
        bnl.store(out, i)
        return out

    a = _rand((64, 100), np.float32, seed=7)
    a[3, 10] = a[3, 20] = 5.0
    got = k(a)
    np.testing.assert_array_equal(got.astype(np.uint64), ref_find_index8(a, ref_max8(a)))
    assert list(got[3, :2]) == [10, 20]
    np.testing.assert_array_equal(np.argsort(-a, axis=1, kind="stable")[:, :8], got.astype(np.int64))


# ---- nc_match_replace8 -------------------------------------------------------------------------------


def test_match_replace8_new():
    @nki.jit
    def k(data, vals):
        d = nl.ndarray(data.shape, data.dtype, buffer=nl.sbuf)
        ix = nl.ndarray((data.shape[0], 8), nl.uint32, buffer=nl.sbuf)
        nisa.nc_match_replace8(dst=d, data=_load(data), vals=_load(vals), imm=-1e9, dst_idx=ix)
        return _store(d), _store(ix)

    data, vals = _find_data(p=32, n=24, seed=8)
    data[1, [9, 17]] = vals[1, 0]  # at least three copies of the repeated value
    data = data.reshape(32, 4, 6)
    got, idx = k(data, vals)
    want, widx = ref_match_replace8(data, vals, -1e9)
    _close(got, want)
    np.testing.assert_array_equal(idx.astype(np.uint64), widx)
    # duplicates pair in the reverse order of find_index8: vals[i=7] takes the first match
    row = data.reshape(32, -1)[1]
    hits = np.nonzero(row == vals[1, 0])[0]
    assert idx[1, 7] == hits[0] and idx[1, 6] == hits[1]


def test_match_replace8_beta1_topk_loop(b1):
    """The public top-k pattern: max8 + match_replace8 repeated gives the 16 largest values."""
    bnki, bnl, bisa = b1

    @bnki.jit
    def k(a):
        out = bnl.ndarray((a.shape[0], 16), a.dtype, buffer=bnl.shared_hbm)
        x = bnl.load(a)
        top = bnl.ndarray((a.shape[0], 16), a.dtype, buffer=bnl.sbuf)
        m1 = bisa.max8(src=x)
        top[:, 0:8] = m1
        x2 = bisa.nc_match_replace8(data=x, vals=m1, imm=-3.0e38)
        top[:, 8:16] = bisa.max8(src=x2)
        bnl.store(out, top)
        return out

    for dt in (np.float32, BF16):
        a = _rand((128, 64), dt, seed=9)
        want = -np.sort(-np.asarray(a, np.float32), axis=1)[:, :16]
        _close(k(a), want, dt)


# ---- tensor_partition_reduce -------------------------------------------------------------------------


@pytest.mark.parametrize("op,ref", [("add", np.sum), ("maximum", np.max), ("average", np.mean),
                                    ("minimum", np.min)])
def test_partition_reduce_new(op, ref):
    @nki.jit
    def k(x):
        d = nl.ndarray((1,) + x.shape[1:], x.dtype, buffer=nl.sbuf)
        nisa.tensor_partition_reduce(dst=d, op=getattr(nl, op), data=_load(x))
        return _store(d)

    x = _rand((96, 3, 20), np.float32, seed=10)
    _close(k(x), ref(x, axis=0, keepdims=True))
    assert "tensor_partition_reduce" in _ops(k)


def test_partition_reduce_bitwise_and_beta1(b1):
    bnki, bnl, bisa = b1

    @bnki.jit
    def k(a):
        out = bnl.ndarray((1, a.shape[1]), a.dtype, buffer=bnl.shared_hbm)
        out2 = bnl.ndarray((1, a.shape[1]), a.dtype, buffer=bnl.shared_hbm)
        x = bnl.load(a)
        bnl.store(out, bisa.tensor_partition_reduce(bnl.bitwise_or, x))
        bnl.store(out2, bisa.tensor_partition_reduce(np.bitwise_and, x))
        return out, out2

    a = np.random.default_rng(11).integers(0, 1 << 30, (64, 33)).astype(np.int32)
    o, o2 = k(a)
    np.testing.assert_array_equal(o, np.bitwise_or.reduce(a, axis=0, keepdims=True))
    np.testing.assert_array_equal(o2, np.bitwise_and.reduce(a, axis=0, keepdims=True))

    @bnki.jit
    def kb(a):
        out = bnl.ndarray((1, a.shape[1]), bnl.float32, buffer=bnl.shared_hbm)
        bnl.store(out, bisa.tensor_partition_reduce(np.add, bnl.load(a), dtype=bnl.float32))
        return out

    b = _rand((128, 40), BF16, seed=12)
    _close(kb(b), np.asarray(b, np.float32).sum(axis=0, keepdims=True), BF16)


# ---- select_reduce -----------------------------------------------------------------------------------


@pytest.mark.parametrize("reverse", [False, True])
def test_select_reduce_new(reverse):
    @nki.jit
    def k(pred, x, f):
        d = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
        rr = nl.ndarray((x.shape[0], 1), nl.float32, buffer=nl.sbuf)
        d2 = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
        rr2 = nl.ndarray((x.shape[0], 1), nl.float32, buffer=nl.sbuf)
        pt, xt = _load(pred), _load(x)
        nisa.select_reduce(dst=d, predicate=pt, on_true=xt, on_false=-5.0, reduce_res=rr,
                           reduce_cmd=nisa.reduce_cmd.reset_reduce, reverse_pred=reverse)
        # on_false as a (P, 1) vector; the register continues (reduce) from the first call
        nisa.select_reduce(dst=d2, predicate=pt, on_true=xt, on_false=_load(f), reduce_res=rr2,
                           reduce_cmd=nisa.reduce_cmd.reduce, reduce_op=nl.maximum, reverse_pred=reverse)
        return _store(d), _store(rr), _store(d2), _store(rr2)

    rng = np.random.default_rng(13)
    pred = rng.integers(0, 3, (64, 48)).astype(np.uint8)  # values 0, 1, 2: nonzero counts as true
    x = _rand((64, 48), np.float32, seed=14, lo=-10, hi=-1)
    f = _rand((64, 1), np.float32, seed=15, lo=-20, hi=0)
    d, rr, d2, rr2 = k(pred, x, f)
    keep = (pred != 0) != reverse
    w1 = np.where(keep, x, -5.0)
    w2 = np.where(keep, x, f)
    _close(d, w1)
    _close(rr, w1.max(axis=1, keepdims=True))
    _close(d2, w2)
    _close(rr2, np.maximum(w1.max(axis=1), w2.max(axis=1))[:, None])


def test_select_reduce_beta1_bf16(b1):
    bnki, bnl, bisa = b1

    @bnki.jit
    def k(pred, x):
        out = bnl.ndarray(x.shape, x.dtype, buffer=bnl.shared_hbm)
        rout = bnl.ndarray((x.shape[0], 1), bnl.float32, buffer=bnl.shared_hbm)
        d = bnl.ndarray(x.shape, x.dtype, buffer=bnl.sbuf)
        rr = bnl.ndarray((x.shape[0], 1), bnl.float32, buffer=bnl.sbuf)
        r = bisa.select_reduce(dst=d, predicate=bnl.load(pred), on_true=bnl.load(x), on_false=0.0,
                               reduce_res=rr, reduce_cmd=bisa.reduce_cmd.reset_reduce)
        assert r is None
        bnl.store(out, d)
        bnl.store(rout, rr)
        return out, rout

    pred = (np.arange(128 * 32).reshape(128, 32) % 3 == 0).astype(np.int8)
    x = _rand((128, 32), BF16, seed=16)
    d, rr = k(pred, x)
    w = np.where(pred != 0, np.asarray(x, np.float32), 0.0)
    _close(d, w, BF16)
    _close(rr, w.max(axis=1, keepdims=True), BF16)


# ---- tensor_scalar_cumulative ------------------------------------------------------------------------


@pytest.mark.parametrize("op0,imm0,op1", [("multiply", 2.0, "add"), ("add", 0.5, "maximum"),
                                          ("add", 0.0, "minimum"), ("multiply", 1.0, "multiply")])
def test_tensor_scalar_cumulative(op0, imm0, op1):
    @nki.jit
    def k(x):
        d = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar_cumulative(dst=d, src=_load(x), op0=getattr(nl, op0), op1=getattr(nl, op1),
                                      imm0=imm0)
        return _store(d)

    x = _rand((32, 40), np.float32, seed=17, lo=0.5, hi=1.5)
    init = {"add": 0.0, "maximum": -np.inf, "minimum": np.inf, "multiply": 1.0}[op1]
    _close(k(x), ref_cumulative(x, op0, imm0, op1, init))


def test_tensor_scalar_cumulative_load_reduce_and_vector_imm():
    @nki.jit
    def k(x, s, init):
        d = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
        d2 = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
        xt = _load(x)
        nisa.tensor_scalar_cumulative(dst=d, src=xt, op0=nl.multiply, op1=nl.add, imm0=_load(s),
                                      imm1=_load(init), reduce_cmd=nisa.reduce_cmd.load_reduce)
        nisa.tensor_scalar_cumulative(dst=d2, src=xt, op0=nl.add, op1=nl.add, imm0=1.0,
                                      reduce_cmd=nisa.reduce_cmd.reduce)  # continues from the register
        return _store(d), _store(d2)

    x = _rand((16, 12), np.float32, seed=18)
    s = _rand((16, 1), np.float32, seed=19)
    init = _rand((16, 1), np.float32, seed=20)
    d, d2 = k(x, s, init)
    want = np.cumsum(x * s, axis=1) + init
    _close(d, want)
    _close(d2, want[:, -1:] + np.cumsum(x + 1.0, axis=1))


def test_tensor_scalar_cumulative_rejects_int32():
    @nki.jit
    def k(x):
        d = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar_cumulative(dst=d, src=_load(x), op0=nl.add, op1=nl.add, imm0=1)
        return _store(d)

    with pytest.raises(Exception, match="int32"):
        k(np.zeros((4, 4), np.int32))


# ---- sequence_bounds ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_sequence_bounds_new(dtype):
    @nki.jit
    def k(ids):
        d = nl.ndarray((1, 2, ids.shape[1]), ids.dtype, buffer=nl.sbuf)
        nisa.sequence_bounds(dst=d, segment_ids=_load(ids))
        return _store(d)

    ids = np.array([[1, 1, 1, 2, 2, 3, 0, 0, 4, 4, 4, 4, 0]], dtype)
    got = k(ids)
    np.testing.assert_array_equal(got, ref_sequence_bounds(ids).astype(dtype))


def test_sequence_bounds_beta1(b1):
    bnki, bnl, bisa = b1

    @bnki.jit
    def k(ids):
        out = bnl.ndarray((1, 2, ids.shape[1]), bnl.float32, buffer=bnl.shared_hbm)
        b = bisa.sequence_bounds(segment_ids=bnl.load(ids), dtype=bnl.float32)
        assert tuple(b.shape) == (1, 2, ids.shape[1])
        bnl.store(out, b)
        return out

    ids = np.sort(np.random.default_rng(21).integers(0, 6, (1, 200))).astype(np.int32)
    np.testing.assert_array_equal(k(ids), ref_sequence_bounds(ids).astype(np.float32))


# ---- nc_n_gather / local_gather ----------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, BF16, np.int32])
def test_nc_n_gather(dtype):
    @nki.jit
    def k(data, idx):
        d = nl.ndarray(idx.shape, data.dtype, buffer=nl.sbuf)
        nisa.nc_n_gather(dst=d, data=_load(data), indices=_load(idx))
        return _store(d)

    data = (_rand((64, 5, 10), np.float32, seed=22) * 100).astype(dtype)
    idx = np.random.default_rng(23).integers(0, 50, (64, 17)).astype(np.uint32)
    got = k(data, idx)
    want = np.take_along_axis(data.reshape(64, -1), idx.astype(np.int64), axis=1)
    np.testing.assert_array_equal(got, want)


def test_nc_n_gather_out_of_range_is_an_error():
    @nki.jit
    def k(data, idx):
        d = nl.ndarray(idx.shape, data.dtype, buffer=nl.sbuf)
        nisa.nc_n_gather(dst=d, data=_load(data), indices=_load(idx))
        return _store(d)

    with pytest.raises(Exception, match="outside"):
        k(np.zeros((4, 8), np.float32), np.full((4, 2), 8, np.uint32))


@pytest.mark.parametrize("e,nv", [(1, None), (4, 20), (2, 3)])
def test_local_gather_new(e, nv):
    @nki.jit
    def k(src, index):
        n = (16 * index.shape[1] if nv is None else nv) * e
        d = nl.ndarray((src.shape[0], n), src.dtype, buffer=nl.sbuf)
        nisa.local_gather(dst=d, src_buffer=_load(src), index=_load(index), num_elem_per_idx=e,
                          num_valid_indices=nv)
        return _store(d)

    src = _rand((32, 64), np.float32, seed=24)
    index = np.random.default_rng(25).integers(0, 64 - e + 1, (32, 2)).astype(np.uint16)
    got = k(src, index)
    np.testing.assert_array_equal(got, ref_local_gather(src, index, e, nv))


def test_local_gather_beta1(b1):
    bnki, bnl, bisa = b1

    @bnki.jit
    def k(src, index):
        out = bnl.ndarray((src.shape[0], 16 * index.shape[1] * 2), src.dtype, buffer=bnl.shared_hbm)
        g = bisa.local_gather(bnl.load(src), bnl.load(index), 2)
        bnl.store(out, g)
        return out

    src = _rand((16, 40), BF16, seed=26)
    index = np.random.default_rng(27).integers(0, 39, (16, 3)).astype(np.uint16)
    np.testing.assert_array_equal(k(src, index), ref_local_gather(src, index, 2))


def test_local_gather_rejects_bad_elem_count():
    @nki.jit
    def k(src, index):
        d = nl.ndarray((16, 16), src.dtype, buffer=nl.sbuf)
        nisa.local_gather(dst=d, src_buffer=_load(src), index=_load(index), num_elem_per_idx=3)
        return _store(d)

    with pytest.raises(Exception, match="num_elem_per_idx"):
        k(np.zeros((16, 8), np.float32), np.zeros((16, 1), np.uint16))


# ---- nonzero_with_count ------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_nonzero_with_count(dtype):
    @nki.jit
    def k(x, init):
        d = _load(init)  # rows other than 0, 16, ... keep these values
        nisa.nonzero_with_count(dst=d, src=_load(x), index_offset=5, padding_val=-7)
        return _store(d)

    rng = np.random.default_rng(40)
    x = (rng.integers(0, 3, (64, 30)) * (rng.random((64, 30)) < 0.4)).astype(dtype)
    x[16] = 0  # no nonzero: all padding, count 0
    init = np.full((64, 31), 123, np.int32)
    got = k(x, init)
    want = init.copy()
    for p in range(0, 64, 16):
        nz = np.nonzero(x[p])[0]
        want[p, :30] = -7
        want[p, :nz.size] = nz + 5
        want[p, 30] = nz.size
    np.testing.assert_array_equal(got, want)
    assert got[16, 30] == 0


def _snake(vec, parts, cols):
    """A group's vector in topk's snake layout: element e at partition e % 16, column e // 16."""
    t = np.zeros((parts, cols), vec.dtype)
    for e, v in enumerate(vec):
        t[e % 16, e // 16] = v
    return t


@pytest.mark.parametrize("n,k", [(1000, 16), (8, 8), (300, 1)])
def test_topk_snake_layout_per_group_of_16_partitions(n, k):
    @nki.jit
    def kern(x, init_v, init_i):
        v = _load(init_v)  # partitions other than 0, 16 keep these values
        i = _load(init_i)
        nisa.topk(v, i, _load(x), n)
        return _store(v), _store(i)

    rng = np.random.default_rng(41)
    groups = [rng.standard_normal(n).astype(np.float32) for _ in range(2)]
    x = np.concatenate([_snake(g, 16, 64) for g in groups]).astype(BF16)
    init_v = np.full((32, k), 5, BF16)
    init_i = np.full((32, k), 9, np.uint32)
    got_v, got_i = kern(x, init_v, init_i)
    for gi, g in enumerate(groups):
        gb = g.astype(BF16).astype(np.float32)  # the values as the tile holds them (ties possible)
        top = sorted(range(n), key=lambda e: (-gb[e], e))[:k]  # the k largest, lower index first on ties
        top = sorted(top, key=lambda e: (gb[e], e))  # ascending
        np.testing.assert_array_equal(got_i[16 * gi], np.array(top, np.uint32))
        np.testing.assert_array_equal(got_v[16 * gi].astype(np.float32), gb[top])
    untouched = [p for p in range(32) if p % 16]
    np.testing.assert_array_equal(got_v[untouched].astype(np.float32), 5.0)
    np.testing.assert_array_equal(got_i[untouched], 9)


def test_topk_ties_nan_and_limits():
    @nki.jit
    def kern(x, nn, kk):
        v = nl.ndarray((16, kk), nl.bfloat16, buffer=nl.sbuf)
        i = nl.ndarray((16, kk), nl.uint32, buffer=nl.sbuf)
        nisa.topk(v, i, _load(x), nn)
        return _store(v), _store(i)

    g = np.array([1, 3, np.nan, 3, 2, 0, 3, -1], np.float32)  # decisions: NaN largest, ties lower index first
    got_v, got_i = kern(_snake(g, 16, 1).astype(BF16), 8, 4)
    assert got_i[0].tolist() == [1, 3, 6, 2]
    assert got_v[0, :3].astype(np.float32).tolist() == [3, 3, 3] and np.isnan(float(got_v[0, 3]))
    x = _snake(np.arange(16, dtype=np.float32), 16, 1).astype(BF16)
    for nn, kk, what in [(16, 17, "K"), (7, 4, "n must be"), (17, 4, "do not fit")]:
        with pytest.raises(NsimError) as e:
            kern(x, nn, kk)
        assert e.value.code == _errors.code("ShapeMismatch") and what in str(e.value)


# ---- dropout and the PRNG ----------------------------------------------------------------------------


def test_dropout_new_and_seed_determinism():
    @nki.jit
    def k(x, seeds, pv):
        a = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
        b = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
        c = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
        z = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
        i = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
        xt, st = _load(x), _load(seeds)
        nisa.set_rng_seed(st)
        nisa.dropout(dst=a, data=xt, prob=0.3)
        nisa.set_rng_seed(src_seeds=st)
        nisa.dropout(b, xt, 0.3)  # same seeds: the same mask
        nisa.dropout(dst=c, data=xt, prob=_load(pv))  # per-partition probability, stream continues
        nisa.dropout(dst=z, data=xt, prob=1.0)
        nisa.dropout(dst=i, data=xt, prob=0.0)
        return _store(a), _store(b), _store(c), _store(z), _store(i)

    x = _rand((128, 256), np.float32, seed=30, lo=1, hi=2)  # never 0
    pv = np.linspace(0.0, 1.0, 128, dtype=np.float32)[:, None]
    a, b, c, z, i = k(x, np.array([[1234, 5678]], np.uint32), pv)
    for y in (a, b, c):
        assert np.all((y == 0) | (y == x))
    frac = np.mean(a == 0)
    assert 0.27 < frac < 0.33
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    drop_rows = np.mean(c == 0, axis=1)
    assert drop_rows[0] == 0 and drop_rows[-1] == 1
    assert np.corrcoef(drop_rows, pv[:, 0])[0, 1] > 0.95
    np.testing.assert_array_equal(z, 0)
    np.testing.assert_array_equal(i, x)
    # a different seed: a different mask
    a2 = k(x, np.array([[1234, 5679]], np.uint32), pv)[0]
    assert not np.array_equal(a, a2)


def test_dropout_beta1_bf16(b1):
    bnki, bnl, bisa = b1

    @bnki.jit
    def k(x):
        out = bnl.ndarray(x.shape, x.dtype, buffer=bnl.shared_hbm)
        bnl.store(out, bisa.dropout(bnl.load(x), 0.5))
        return out

    x = _rand((64, 128), BF16, seed=31, lo=1, hi=2)
    y = k(x)
    assert np.all((y == 0) | (y == x))
    assert 0.45 < np.mean(np.asarray(y, np.float32) == 0) < 0.55


@pytest.mark.parametrize("dialect", ["new", "beta1"])
def test_nl_dropout(b1, dialect):
    jit, L = (nki.jit, nl) if dialect == "new" else (b1[0].jit, b1[1])

    @jit
    def k(x):
        out = L.ndarray(x.shape, x.dtype, buffer=L.shared_hbm)
        L.store(out, L.dropout(L.load(x), 0.25))
        return out

    x = _rand((128, 64), np.float32, seed=32, lo=1, hi=2)
    y = k(x)
    assert np.all((y == 0) | (y == x))
    assert 0.2 < np.mean(y == 0) < 0.3


def test_rng_and_state_round_trip():
    @nki.jit
    def k(seeds):
        st = nl.ndarray((128, 2), nl.uint32, buffer=nl.sbuf)
        a = nl.ndarray((128, 64), nl.uint32, buffer=nl.sbuf)
        b = nl.ndarray((128, 64), nl.uint32, buffer=nl.sbuf)
        g = nl.ndarray((128, 64), nl.uint16, buffer=nl.sbuf)
        nisa.set_rng_seed(_load(seeds))
        nisa.rand_get_state(dst=st, engine=nisa.engine.vector)
        nisa.rng(dst=a)
        nisa.rand_set_state(src_seeds=st, engine=nisa.engine.vector)
        nisa.rng(b, engine=nisa.engine.vector)
        nisa.rng(dst=g, engine=nisa.engine.gpsimd)
        return _store(a), _store(b), _store(st), _store(g)

    a, b, st, g = k(np.array([[7, 8, 9]], np.uint32))
    np.testing.assert_array_equal(a, b)
    assert len(np.unique(a)) > 8000  # 32 random bits per element
    assert np.all(st == st[0])
    assert 20000 < a.astype(np.float64).mean() / 2 ** 16 < 45000
    assert g.dtype == np.uint16 and len(np.unique(g)) > 4000
    assert "rng" in _ops(k) and "rand_get_state" in _ops(k)


def test_rng_rejects_float_dst():
    @nki.jit
    def k(x):
        d = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
        nisa.rng(dst=d)
        return _store(d)

    with pytest.raises(Exception, match="integer"):
        k(np.zeros((4, 4), np.float32))


# ---- gen4: exponential, rand2 ------------------------------------------------------------------------


def test_exponential_gen4():
    @nki.jit
    def k(x, m, init):
        d = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
        d2 = nl.ndarray(x.shape, BF16, buffer=nl.sbuf)
        rr = nl.ndarray((x.shape[0], 1), nl.float32, buffer=nl.sbuf)
        rr2 = nl.ndarray((x.shape[0], 1), nl.float32, buffer=nl.sbuf)
        xt = _load(x)
        nisa.exponential(dst=d, src=xt, max_value=_load(m), reduce_res=rr, reduce_cmd=nisa.reduce_cmd.reset_reduce)
        nisa.exponential(d2, xt, 0.5, reduce_res=rr2, reduce_cmd=nisa.reduce_cmd.load_reduce,
                         reduce_init=_load(init))
        return _store(d), _store(rr), _store(d2), _store(rr2)

    x = _rand((128, 96), np.float32, seed=50, lo=-3, hi=3)
    m = x.max(axis=1, keepdims=True)
    init = _rand((128, 1), np.float32, seed=51)
    d, rr, d2, rr2 = k.options(config="trn3")(x, m, init)
    _close(d, np.exp(x - m))
    _close(rr, np.exp(x - m).sum(axis=1, keepdims=True))
    e2 = np.exp(x - 0.5)
    _close(d2, e2, BF16)
    np.testing.assert_allclose(rr2, init + e2.sum(axis=1, keepdims=True), rtol=1e-5)
    with pytest.raises(Exception, match="gen4"):
        k.options(config="trn2")(x, m, init)


@pytest.mark.parametrize("pair", [("multiply", "add"), ("multiply", "subtract"), ("add", "bypass"),
                                  ("bypass", "bypass")])
def test_activate2_gen4(pair):
    op0, op1 = pair

    @nki.jit
    def k(x, b):
        d = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
        d2 = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
        rr = nl.ndarray((x.shape[0], 1), nl.float32, buffer=nl.sbuf)
        xt = _load(x)
        nisa.activate2(dst=d, op=nl.exp, data=xt, imm0=0.5, imm1=_load(b), op0=getattr(nl, op0),
                       op1=getattr(nl, op1), reduce_op=nl.maximum, reduce_res=rr,
                       reduce_cmd=nisa.reduce_cmd.reset_reduce)
        nisa.activate2(d2, nl.tanh, xt, 0.5, _load(b), getattr(nl, op0), getattr(nl, op1), reverse0=True,
                       reverse1=True)
        return _store(d), _store(rr), _store(d2)

    f = {"multiply": lambda a, c: a * c, "add": lambda a, c: a + c, "subtract": lambda a, c: a - c,
         "bypass": lambda a, c: a}
    x = _rand((64, 40), np.float32, seed=52)
    b = _rand((64, 1), np.float32, seed=53)
    d, rr, d2 = k.options(config="trn3")(x, b)
    v = f[op1](f[op0](x, np.float32(0.5)), b)
    _close(d, np.exp(v))
    _close(rr, np.exp(v).max(axis=1, keepdims=True))
    vr = f[op0](np.float32(0.5), x) if op0 != "bypass" else x
    vr = f[op1](b, vr) if op1 != "bypass" else vr
    _close(d2, np.tanh(vr))


def test_activate2_prelu_and_bad_pair():
    @nki.jit
    def k(x):
        d = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
        nisa.activate2(dst=d, op=nl.prelu, data=_load(x), imm0=2.0, imm1=None, op0=nl.multiply, op1=None,
                       relu_param=0.1)
        return _store(d)

    x = _rand((32, 16), np.float32, seed=54)
    v = 2 * x
    _close(k.options(config="trn3")(x), np.where(v > 0, v, 0.1 * v))

    @nki.jit
    def bad(x):
        d = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
        nisa.activate2(dst=d, op=nl.exp, data=_load(x), imm0=1.0, imm1=1.0, op0=nl.add, op1=nl.add)
        return _store(d)

    with pytest.raises(Exception, match="not one of"):
        bad.options(config="trn3")(x)


def test_rand2_gen4():
    @nki.jit
    def k(seeds):
        a = nl.ndarray((128, 256), nl.float32, buffer=nl.sbuf)
        b = nl.ndarray((128, 256), nl.float32, buffer=nl.sbuf)
        st = _load(seeds)
        nisa.set_rng_seed(st)
        nisa.rand2(dst=a, min=-1.0, max=3.0)
        nisa.set_rng_seed(st)
        nisa.rand2(b, -1.0, 3.0)
        return _store(a), _store(b)

    a, b = k.options(config="trn3")(np.array([[42]], np.uint32))
    np.testing.assert_array_equal(a, b)
    assert a.min() >= -1.0 and a.max() < 3.0
    assert abs(a.mean() - 1.0) < 0.05 and abs(a.std() - 4 / np.sqrt(12)) < 0.05


# ---- signatures --------------------------------------------------------------------------------------


@pytest.mark.parametrize("fn", ["max8", "nc_find_index8", "nc_match_replace8", "tensor_partition_reduce",
                                "select_reduce", "tensor_scalar_cumulative", "sequence_bounds", "nc_n_gather",
                                "local_gather", "nonzero_with_count", "dropout", "rng", "exponential", "rand2", "activate2", "set_rng_seed", "rand_set_state",
                                "rand_get_state"])
def test_unknown_keyword_is_a_type_error(fn):
    f = getattr(nisa, fn)
    assert not hasattr(f, "__nsim_unsupported__")
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        f(bogus=1)


@pytest.mark.parametrize("fn", ["max8", "nc_find_index8", "nc_match_replace8", "tensor_partition_reduce",
                                "select_reduce", "sequence_bounds", "local_gather", "dropout"])
def test_unknown_keyword_is_a_type_error_beta1(b1, fn):
    f = getattr(b1[2], fn)
    assert not hasattr(f, "__nsim_unsupported__")
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        f(bogus=1)


def test_lnc2_ops_need_an_lnc2_launch():
    # sendrecv / core_barrier are supported under kernel[2] (tests/python/test_lnc.py); with one core
    # there is no peer: error LncNotSupported.
    @nki.jit
    def k(a):
        t = nl.ndarray(a.shape, a.dtype, buffer=nl.sbuf)
        nisa.sendrecv(t, t, 1, 1, 0)

    with pytest.raises(NsimError) as e:
        k(np.zeros((128, 8), np.float32))
    assert e.value.code == _errors.code("LncNotSupported")


# --------------------------------------------------------------------------------------------------
# nl.rand / nl.random_seed / nl.gather_flattened (built on rng, set_rng_seed, nc_n_gather), both dialects
# --------------------------------------------------------------------------------------------------


def _rand_kernel(mod):
    @nki.jit
    def k(seed):
        out = mod.ndarray((128, 512), dtype=mod.float32, buffer=mod.shared_hbm)
        mod.random_seed(seed)
        mod.store(out, mod.rand((128, 512), mod.float32))
        return out
    return k


@pytest.mark.parametrize("dialect", ["new", "beta1"])
def test_rand_uniform_and_seeded(dialect, b1):
    mod = nl if dialect == "new" else b1[1]
    k = _rand_kernel(mod)
    a, a2, b = k(7), k(7), k(8)
    assert a.dtype == np.float32 and 0.0 <= a.min() and a.max() < 1.0
    # 65,536 samples of U[0, 1): mean 1/2, std 1/sqrt(12) = 0.2887, each within ~5 standard errors
    assert abs(a.mean() - 0.5) < 0.006 and abs(a.std() - 12 ** -0.5) < 0.004
    assert np.array_equal(a, a2) and not np.array_equal(a, b)  # the seed decides the stream
    assert len(np.unique(a)) > 60000


@pytest.mark.parametrize("dialect", ["new", "beta1"])
def test_gather_flattened(dialect, b1):
    mod = nl if dialect == "new" else b1[1]

    @nki.jit
    def k(data, idx):
        out = mod.ndarray(idx.shape, dtype=data.dtype, buffer=mod.shared_hbm)
        mod.store(out, mod.gather_flattened(mod.load(data), mod.load(idx)))
        return out

    data = _rand((128, 64))
    idx = np.random.default_rng(1).integers(0, 64, (128, 16)).astype(np.uint32)
    np.testing.assert_array_equal(k(data, idx), np.take_along_axis(data, idx.astype(np.int64), 1))


# --------------------------------------------------------------------------------------------------
# Sequencer registers: evaluated while tracing (loop bounds, while_loop, scalar_offset, load/store)
# --------------------------------------------------------------------------------------------------


def test_registers_drive_dynamic_loops_offsets_and_stores():
    @nki.jit
    def k(n_hbm, x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        n = nisa.register_alloc()
        nisa.register_load(n, n_hbm)  # the block count comes from the device
        for i in nl.dynamic_range(n):
            nl.store(out[i * 128:(i + 1) * 128, :], nl.multiply(nl.load(x[i * 128:(i + 1) * 128, :]), 2.0))
        trips = nisa.register_alloc(0)
        left = nisa.register_alloc(4)

        def body(r):  # counts down: 4 iterations
            nisa.register_move(trips, trips.value + 1)
            nisa.register_move(r, r.value - 1)
            return r

        nl.while_loop(left, body)
        cnt = nl.ndarray((1, 2), dtype=nl.int32, buffer=nl.shared_hbm)
        nisa.register_store(cnt[0:1, 0:1], n)
        nisa.register_store(cnt[0:1, 1:2], trips)
        blk = nl.ndarray((128, 64), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=blk, src=x.ap([[64, 128], [1, 64]], scalar_offset=n, indirect_dim=0))
        rows = nl.ndarray((128, 64), dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(rows, blk)
        return out, cnt, rows

    x = _rand((512, 64))
    out, cnt, rows = k(np.array([[3]], np.int32), x)
    _close(out[:384], 2 * x[:384])
    assert cnt.tolist() == [[3, 4]]
    np.testing.assert_array_equal(rows, x[3:131])  # scalar_offset n: rows start at row n
    # n's register_load is an instruction; what uses n waits for it (kernel.json "after", docs/timing-model.md
    # "Sequencer registers"): the ops of the loop it bounds, its register_store and the DMA it addresses; trips
    # (never loaded) adds no wait to its store
    ops = executed_ops(k.last_json["body"])
    (rl,) = [o for o in ops if o["op"] == "register_load"]
    waits = [o for o in ops if o.get("after") == [rl["label"]]]
    assert all(o.get("after") in (None, [rl["label"]]) for o in ops)
    # 3 iterations x (load, multiply, store), n's store (memset + DMA to HBM), the addressed DMA
    assert len(waits) == 3 * 3 + 2 + 1, [(o["op"], o.get("after")) for o in ops]
    assert [o["op"] for o in ops].count("memset") == 2 and ops.index(rl) < ops.index(waits[0])
    _out, prof = k.options(timing_only=True).simulate(np.array([[1]], np.int32), x)
    _out3, prof3 = k.options(timing_only=True).simulate(np.array([[3]], np.int32), x)
    assert prof3.total_time_ns > prof.total_time_ns  # the loaded bound decides the work, also timing-only


def test_register_misuse_is_refused():
    @nki.jit
    def truth(x):
        if nisa.register_alloc(1):
            pass

    with pytest.raises(TypeError):
        truth(_rand((128, 8)))

    @nki.jit
    def bad_load(x):
        nisa.register_load(nisa.register_alloc(), x)  # not one element

    with pytest.raises(NsimError) as e:
        bad_load(_rand((128, 8)))
    assert e.value.code == _errors.code("ShapeMismatch")
