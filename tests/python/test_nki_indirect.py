"""Indirect (runtime-indexed) HBM accesses, issue 10 item 2, both dialects, checked against numpy:
gathers and scatters through ``.ap(vector_offset=/scalar_offset=)``, ``select(dim, tile)``, ``vector_select``,
Beta-1 ``t[idx_tile[i_p, 0], i_f]`` subscripts, ``nl.atomic_rmw`` and ``dma_copy(dst_rmw_op=np.add)``;
``oob_mode``; the errors of bad indirect accesses; and the timing facts a kernel author relies on (the
gather waits for the writes it may read, it is triggered from GpSimd)."""

import warnings

import numpy as np
import pytest

from conftest import require_core  # noqa: E402

_core, ml_dtypes = require_core()

from nsim import _errors, simulate_json  # noqa: E402
from nsim import nki, tracer  # noqa: E402
import nsim.nki.isa as nisa  # noqa: E402
import nsim.nki.language as nl  # noqa: E402
from nki_helpers import rng as _rng, code_of as _code  # noqa: E402
from nsim.tracer import NsimError  # noqa: E402

BF16 = ml_dtypes.bfloat16


# --------------------------------------------------------------------------------------------------
# new dialect
# --------------------------------------------------------------------------------------------------


@nki.jit
def _gather(table, idx):
    rows, d = idx.shape[0], table.shape[1]
    out = nl.ndarray((rows, d), dtype=table.dtype, buffer=nl.shared_hbm)
    it = nl.ndarray((rows, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=it, src=idx)
    g = nl.ndarray((rows, d), dtype=table.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=g, src=table.ap([[d, rows], [1, d]], vector_offset=it, indirect_dim=0))
    nisa.dma_copy(dst=out, src=g)
    return out


@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_new_gather_rows_by_vector_offset(dtype):
    table = _rng().standard_normal((1000, 64)).astype(dtype)
    idx = _rng(1).integers(0, 1000, (128, 1)).astype(np.int32)
    np.testing.assert_array_equal(_gather(table, idx), table[idx[:, 0]])  # a copy: exact in any dtype


def test_new_gather_ir_and_engine():
    """The gather is one dma_copy with an `offsets` slot, triggered from GpSimd (swdge: the only DGE mode that
    can gather, neuroncore.md 3.3); the index bound is the table's row count, the stride its row length."""
    table = np.zeros((300, 32), np.float32)
    idx = np.zeros((128, 1), np.int32)
    ops = [s for s in _gather.to_json(table, idx)["body"] if s.get("op") == "dma_copy" and "offsets" in s]
    assert len(ops) == 1
    assert ops[0]["engine"] == "gpsimd" and ops[0]["iimm"] == [300, 32]
    assert "indirect_dst" not in ops[0].get("flags", [])


@nki.jit
def _scatter_add(table, idx, upd, skip=False):
    out = nl.ndarray(table.shape, dtype=table.dtype, buffer=nl.shared_hbm)
    nl.store(out, nl.load(table))
    it = nl.load(idx)
    u = nl.load(upd)
    mode = nisa.oob_mode.skip if skip else nisa.oob_mode.error
    nisa.dma_copy(dst=out.ap([[64, 128], [1, 64]], vector_offset=it, indirect_dim=0), src=u, dst_rmw_op=nl.add,
                  oob_mode=mode)
    return out


def test_new_scatter_add_applies_duplicate_indices():
    table = _rng().standard_normal((128, 64)).astype(np.float32)
    idx = _rng(2).integers(0, 16, (128, 1)).astype(np.int32)  # many duplicates
    upd = _rng(3).standard_normal((128, 64)).astype(np.float32)
    want = table.copy()
    np.add.at(want, idx[:, 0], upd)
    np.testing.assert_allclose(_scatter_add(table, idx, upd), want, rtol=1e-5, atol=1e-5)


def test_new_out_of_range_index_error_and_skip():
    table = _rng().standard_normal((128, 64)).astype(np.float32)
    idx = _rng(2).integers(0, 128, (128, 1)).astype(np.int32)
    idx[5], idx[9] = 128, -3
    upd = _rng(3).standard_normal((128, 64)).astype(np.float32)
    with pytest.raises(NsimError) as e:
        _scatter_add(table, idx, upd)
    assert _code(e.value) == _errors.code("IndexOutOfBounds")
    assert "index 128 of row 5" in str(e.value) and "oob_mode" in str(e.value)
    ok = (idx[:, 0] >= 0) & (idx[:, 0] < 128)
    want = table.copy()
    np.add.at(want, idx[ok, 0], upd[ok])
    np.testing.assert_allclose(_scatter_add(table, idx, upd, skip=True), want, rtol=1e-5, atol=1e-5)


def test_new_select_runtime_index_and_vector_select():
    @nki.jit
    def k(t3, which, rows_idx):
        a = nl.ndarray((128, 64), dtype=t3.dtype, buffer=nl.shared_hbm)
        b = nl.ndarray((128, 64), dtype=t3.dtype, buffer=nl.shared_hbm)
        w = nl.load(which)
        r = nl.ndarray((128, 64), dtype=t3.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=r, src=t3.select(0, w))  # t3[which]: a scalar_offset access
        nl.store(a, r)
        ri = nl.load(rows_idx)
        flat = t3.reshape((t3.shape[0] * 128, 64))
        s = nl.ndarray((128, 64), dtype=t3.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=s, src=flat.vector_select(0, ri))
        nl.store(b, s)
        return a, b

    t3 = _rng().standard_normal((6, 128, 64)).astype(np.float32)
    ri = _rng(4).integers(0, 6 * 128, (128, 1)).astype(np.int32)
    a, b = k(t3, np.array([[4]], np.int32), ri)
    np.testing.assert_array_equal(a, t3[4])
    np.testing.assert_array_equal(b, t3.reshape(-1, 64)[ri[:, 0]])
    assert k.to_json(t3, np.array([[4]], np.int32), ri)  # traces without values


def test_new_gather_waits_for_the_rows_it_may_read():
    """A gather from a tensor the kernel wrote must run after the write: its dependency covers every row an
    index may reach (the values are unknown to the schedule). Reversed, the gather would read zeros."""
    @nki.jit
    def k(src, idx):
        tmp = nl.ndarray(src.shape, dtype=src.dtype, buffer=nl.shared_hbm)
        out = nl.ndarray((128, 64), dtype=src.dtype, buffer=nl.shared_hbm)
        for i in nl.affine_range(src.shape[0] // 128):  # write tmp = 2 * src, 128 rows at a time
            t = nl.load(src[i * 128:(i + 1) * 128, :])
            nl.store(tmp[i * 128:(i + 1) * 128, :], nl.multiply(t, 2.0))
        it = nl.load(idx)
        g = nl.ndarray((128, 64), dtype=src.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=g, src=tmp.ap([[64, 128], [1, 64]], vector_offset=it, indirect_dim=0))
        nl.store(out, g)
        return out

    src = _rng().standard_normal((512, 64)).astype(np.float32)
    idx = np.array([[511 - 3 * p] for p in range(128)], np.int32)  # rows from every 128-row block
    got, prof = k.simulate(src, idx)
    np.testing.assert_allclose(got, 2 * src[idx[:, 0]], rtol=1e-6)


def test_new_indirect_view_errors():
    table = np.zeros((64, 32), np.float32)

    def run(body):
        @nki.jit
        def k(t, i):
            it = nl.load(i)
            body(t, it)
            return t
        return k(table, np.zeros((128, 1), np.int32))

    cases = [
        (lambda t, it: t.ap([[32, 128], [1, 32]], vector_offset=it, scalar_offset=it), "BadView"),
        (lambda t, it: t.ap([[32, 128], [1, 32]], vector_offset=it, indirect_dim=1), "BadView"),
        (lambda t, it: t.ap([[32, 64], [1, 32]], vector_offset=it), "ShapeMismatch"),
        (lambda t, it: t.ap([[32, 128], [1, 32]], vector_offset=it)[0:4], "NotSupported"),
        (lambda t, it: nisa.dma_copy(dst=nl.ndarray((128, 32), nl.float32, buffer=nl.sbuf),
                                     src=t.ap([[32, 128], [1, 32]], vector_offset=it),
                                     dge_mode=nisa.dge_mode.hwdge), "BadArgument"),
    ]
    for body, name in cases:
        with pytest.raises(NsimError) as e:
            run(body)
        assert _code(e.value) == _errors.code(name), (name, str(e.value))


# --------------------------------------------------------------------------------------------------
# Beta 1
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("form", ["expr", "tile"])
def test_beta1_embedding_gather(b1, form):
    _nki, bnl, _ = b1

    @_nki.jit
    def embed(table, ids):
        out = bnl.ndarray((128, 64), dtype=table.dtype, buffer=bnl.shared_hbm)
        i_p = bnl.arange(128)[:, None]
        i_f = bnl.arange(64)[None, :]
        idx = bnl.load(ids)
        rows = bnl.load(table[idx[i_p, 0], i_f] if form == "expr" else table[idx, i_f])
        bnl.store(out[i_p, i_f], rows)
        return out

    table = _rng().standard_normal((512, 64)).astype(BF16)
    ids = _rng(5).integers(0, 512, (128, 1)).astype(np.int32)
    np.testing.assert_array_equal(embed(table, ids), table[ids[:, 0]])


def test_beta1_scatter_store_and_atomic_rmw(b1):
    _nki, bnl, _ = b1

    @_nki.jit
    def k(table, ids, upd):
        put = bnl.ndarray(table.shape, dtype=table.dtype, buffer=bnl.shared_hbm)
        acc = bnl.ndarray(table.shape, dtype=table.dtype, buffer=bnl.shared_hbm)
        for i in bnl.affine_range(table.shape[0] // 128):
            t = bnl.load(table[i * 128:(i + 1) * 128, :])
            bnl.store(put[i * 128:(i + 1) * 128, :], t)
            bnl.store(acc[i * 128:(i + 1) * 128, :], t)
        i_p = bnl.arange(128)[:, None]
        i_f = bnl.arange(64)[None, :]
        idx = bnl.load(ids)
        u = bnl.load(upd)
        bnl.store(put[idx[i_p, 0], i_f], value=u)
        bnl.atomic_rmw(acc[idx[i_p, 0], i_f], value=u, op=np.add)
        return put, acc

    table = _rng().standard_normal((256, 64)).astype(np.float32)
    ids = _rng(6).permutation(256)[:128].reshape(128, 1).astype(np.int32)  # distinct rows for the plain store
    ids[1] = ids[0]  # ... except one duplicate: the store keeps the later row, atomic_rmw adds both
    upd = _rng(7).standard_normal((128, 64)).astype(np.float32)
    put, acc = k(table, ids, upd)
    want_put = table.copy()
    for p in range(128):
        want_put[ids[p, 0]] = upd[p]
    want_acc = table.copy()
    np.add.at(want_acc, ids[:, 0], upd)
    np.testing.assert_array_equal(put, want_put)
    np.testing.assert_allclose(acc, want_acc, rtol=1e-5, atol=1e-5)


def test_beta1_masked_gather_and_scatter_add(b1):
    """A MoE token dispatch in the Beta-1 dialect (tests/python/test_moe_style_kernels.py): the slots of an
    expert's capacity past its token count hold an out-of-range id (T) and are masked off (``mask=(i_p <
    n_valid)``, spec §3.8: masked-out index positions are neither read nor bounds-checked), the columns past 48
    too; the gather (``nl.load``), the combine (``nl.store`` of the loaded rows plus the update, then
    ``nl.atomic_rmw`` and ``dma_copy(dst_rmw_op=np.add)``) touch only the valid rows and columns. nsim used to
    refuse a mask on a row-indexed view (NSIM-E446 'a view of the indirect view cannot be taken')."""
    _nki, bnl, bnisa = b1

    @_nki.jit
    def k(hidden, ids, n_valid):
        T, H = hidden.shape
        out = bnl.ndarray((T, H), dtype=hidden.dtype, buffer=bnl.shared_hbm)
        i_t = bnl.arange(T)[:, None]
        i_h = bnl.arange(H)[None, :]
        bnl.store(out[i_t, i_h], value=bnl.zeros((T, H), dtype=hidden.dtype))
        C = ids.shape[0]
        i_c = bnl.arange(C)[:, None]
        idx = bnl.load(ids)
        valid = (i_c < n_valid) & (i_h < 48)
        x = bnl.load(hidden[idx[i_c, 0], i_h], mask=valid)
        cur = bnl.load(out[idx[i_c, 0], i_h], mask=valid)
        bnl.store(out[idx[i_c, 0], i_h], value=bnl.add(cur, x, mask=valid), mask=valid)
        bnl.atomic_rmw(out[idx[i_c, 0], i_h], value=x, op=np.add, mask=valid)
        bnisa.dma_copy(dst=out[idx[i_c, 0], i_h], src=x, dst_rmw_op=np.add, mask=valid)
        return out

    T, n_valid = 40, 5
    hidden = _rng(8).standard_normal((T, 64)).astype(np.float32)
    ids = np.full((16, 1), T, np.int32)  # unused capacity slots: out of range
    ids[:n_valid, 0] = [3, 17, 0, 39, 22]
    out = k(hidden, ids, n_valid)
    want = np.zeros_like(hidden)
    want[ids[:n_valid, 0], :48] = 3 * hidden[ids[:n_valid, 0], :48]
    np.testing.assert_array_equal(out, want)


def test_beta1_indirect_index_on_a_free_dim_is_refused(b1):
    _nki, bnl, _ = b1

    @_nki.jit
    def k(table, ids):
        i_p = bnl.arange(128)[:, None]
        idx = bnl.load(ids)
        return bnl.load(table[i_p, idx[i_p, 0]])

    with pytest.raises(NsimError) as e:
        k(np.zeros((128, 64), np.float32), np.zeros((128, 1), np.int32))
    assert "err_indirect_indices_free_dim" in str(e.value)


# --------------------------------------------------------------------------------------------------
# kernel.json: hostile indirect transfers get coded errors
# --------------------------------------------------------------------------------------------------


def _kernel(iimm, flags=(), offsets=True):
    """The kernel.json of ``_gather`` on a (100, 64) table with the indirect transfer's fields replaced."""
    k = _gather.to_json(np.zeros((100, 64), np.float32), np.zeros((128, 1), np.int32))
    op = next(s for s in k["body"] if "offsets" in s)
    op["iimm"], op["flags"] = list(iimm), list(flags)
    if not offsets:
        del op["offsets"]
    return k


@pytest.mark.parametrize("iimm,flags,offsets,name", [
    ([101, 64], (), True, "OutOfBounds"),          # the reach (100 rows) is smaller than the bound claims
    ([0, 64], (), True, "BadImmediate"),            # no valid index
    ([100, 64], ("indirect_dst",), False, "MissingOperand"),  # indirect flags without offsets
])
def test_kernel_json_bad_indirect_transfers(iimm, flags, offsets, name):
    k = _kernel(iimm, flags, offsets)
    with pytest.raises(NsimError) as e:
        simulate_json(k, inputs={"idx": np.zeros((128, 1), np.int32), "table": np.zeros((100, 64), np.float32)})
    assert _code(e.value) == _errors.code(name), str(e.value)


def test_kernel_json_gather_runs():
    table = _rng().standard_normal((100, 64)).astype(np.float32)
    idx = _rng(8).integers(0, 100, (128, 1)).astype(np.int32)
    outs, _prof = simulate_json(_kernel([100, 64]), inputs={"idx": idx, "table": table})
    assert "out" in outs, sorted(outs)
    np.testing.assert_array_equal(outs["out"], table[idx[:, 0]])


# --------------------------------------------------------------------------------------------------
# nisa.dma_compute: sums and the RMW scatter-add form
# --------------------------------------------------------------------------------------------------


@nki.jit
def _dma_compute(a, b, c, table, idx, upd):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    nisa.dma_compute(out, [a, b, c], nl.add)  # HBM -> HBM sum of three sources
    t = nl.ndarray(table.shape, dtype=table.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=t, src=table)
    v = t.ap([[64, 128], [1, 64]], vector_offset=nl.load(idx), indirect_dim=0)
    nisa.dma_compute(v, [v, nl.load(upd)], nl.add, scales=[1.0, 1.0])  # dst[idx] += src
    return out, t


@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_dma_compute_sum_and_scatter_add(dtype):
    r = _rng(9)
    a, b, c = (r.standard_normal((128, 64)).astype(dtype) for _ in range(3))
    table = r.standard_normal((256, 64)).astype(dtype)
    idx = r.permutation(256)[:128, None].astype(np.int32)  # unique rows: dma_compute's unique_indices=True
    upd = r.standard_normal((128, 64)).astype(dtype)
    out, t = _dma_compute(a, b, c, table, idx, upd)
    f = np.float32
    want_t = table.astype(f)
    np.add.at(want_t, idx[:, 0], upd.astype(f))
    tol = 1e-5 if dtype == np.float32 else 3e-2  # bf16: the sum is rounded to bf16 after each add
    np.testing.assert_allclose(np.asarray(out, f), a.astype(f) + b.astype(f) + c.astype(f), rtol=tol, atol=tol)
    np.testing.assert_allclose(np.asarray(t, f), want_t, rtol=tol, atol=tol)


def test_dma_compute_scatter_add_reports_repeated_rows():
    """dma_compute's scatter-add promises unique rows (unique_indices=True, its default: spec 2.3's RMW forms); a
    repeated row is NSIM-W508 duplicate-indices (the hardware's read-modify-writes of one row may overlap and lose an
    update), reported at the dma_compute's line with the two partitions; nsim still adds every row (np.add.at)."""
    r = _rng(10)
    a = np.zeros((128, 64), np.float32)
    table = r.standard_normal((256, 64)).astype(np.float32)
    upd = r.standard_normal((128, 64)).astype(np.float32)
    idx = r.permutation(256)[:128, None].astype(np.int32)
    idx[77, 0] = idx[12, 0]
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        _, t = _dma_compute(a, a, a, table, idx, upd)
    reps = [x.message.report for x in w if issubclass(x.category, tracer.CheckWarning)]
    assert [(x["code"], x["check"], x["op"]) for x in reps] == [("NSIM-W508", "duplicate-indices", "dma_copy")]
    assert "partitions 12 and 77" in reps[0]["detail"] and "row {}".format(idx[12, 0]) in reps[0]["detail"]
    src = open(__file__).read().splitlines()
    assert "dst[idx] += src" in src[reps[0]["line"] - 1]
    want = table.copy()
    np.add.at(want, idx[:, 0], upd)
    np.testing.assert_allclose(t, want, rtol=1e-5, atol=1e-5)
    # an index outside the table is no repeat of a row (oob_mode=skip skips both rows)
    @nki.jit
    def skip(table, idx, upd):
        t = nl.ndarray(table.shape, dtype=table.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=t, src=table)
        v = t.ap([[64, 128], [1, 64]], vector_offset=nl.load(idx), indirect_dim=0)
        nisa.dma_compute(v, [v, nl.load(upd)], nl.add, oob_mode=nisa.oob_mode.skip)
        return t
    idx = r.permutation(256)[:128, None].astype(np.int32)
    idx[3, 0] = idx[9, 0] = 1000
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        skip(table, idx, upd)
    # a gather-add (dst_sbuf += src_hbm[idx]) reads repeated rows: nothing to report
    @nki.jit
    def gather(table, idx):
        out = nl.ndarray((128, 64), dtype=table.dtype, buffer=nl.shared_hbm)
        acc = nl.ndarray((128, 64), dtype=table.dtype, buffer=nl.sbuf)
        nisa.memset(dst=acc, value=0.0)
        g = table.ap([[64, 128], [1, 64]], vector_offset=nl.load(idx), indirect_dim=0)
        nisa.dma_compute(acc, [acc, g], nl.add)
        nisa.dma_copy(dst=out, src=acc)
        return out
    idx = np.zeros((128, 1), np.int32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = gather(table, idx)
    np.testing.assert_allclose(got, np.repeat(table[:1], 128, 0), rtol=1e-6)


def test_dma_compute_rejects_what_the_hardware_cannot_do():
    a = np.zeros((128, 64), np.float32)
    for call, name in [(lambda o, x: nisa.dma_compute(o, [x, x], nl.multiply), "BadArgument"),
                       (lambda o, x: nisa.dma_compute(o, [x, x], nl.add, scales=[0.5, 1.0]), "BadArgument"),
                       (lambda o, x: nisa.dma_compute(o, [x] * 17, nl.add), "BadArgument")]:
        @nki.jit
        def k(x):
            o = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
            call(o, x)
            return o
        with pytest.raises(NsimError) as e:
            k(a)
        assert _code(e.value) == _errors.code(name)
