"""Runtime offsets on chip, issue 10 items 1-2: Beta-1 ``nisa.tensor_copy_dynamic_src/dst`` (spec nki-api.md
§2.4) written the way the SDK examples write them (``src[i_p, idx_tile[0, j] + i_f]``), ``nl.ds`` with a runtime
start (a tile value or a VirtualRegister) on chip and on HBM, the new-dialect ``nisa.tensor_copy`` of an on-chip
``.ap(scalar_offset=tile)`` view; numerics against numpy, mask, dtype, engine choice, the cost
(max(600, N) cycles, neuroncore.md §3.2), the conservative dependency of the moving side, and the coded
errors (out-of-range runtime offset, assignment copies: ``err_copy_dynamic_indirect_indices_not_natively_supported``)."""

import numpy as np
import pytest

from conftest import require_core  # noqa: E402

_core, ml_dtypes = require_core()

from nsim import _errors, simulate_json  # noqa: E402
from nsim import nki  # noqa: E402
import nsim.nki.isa as nisa  # noqa: E402
import nsim.nki.language as nl  # noqa: E402
from nki_helpers import rng as _rng, code_of as _code  # noqa: E402
from nsim.tracer import NsimError  # noqa: E402

BF16 = ml_dtypes.bfloat16


def _ops(kernel, *args, op="tensor_copy"):
    """The top-level op statements named ``op`` of the kernel's IR (loops flattened)."""
    out = []

    def walk(body):
        for s in body:
            if "loop" in s:
                walk(s["loop"].get("body", []))
            elif s.get("op") == op:
                out.append(s)
    walk(kernel.to_json(*args)["body"])
    return out


# --------------------------------------------------------------------------------------------------
# Beta 1: tensor_copy_dynamic_src / tensor_copy_dynamic_dst
# --------------------------------------------------------------------------------------------------


def _gather_cols(b1):
    """The SDK example of tensor_copy_dynamic_src: gather the columns ``offsets[0, j]`` of every partition."""
    _nki, bnl, bnisa = b1

    @_nki.jit
    def k(src_tensor, offsets):
        n = offsets.shape[1]
        out_tensor = bnl.ndarray([128, n], dtype=src_tensor.dtype, buffer=bnl.shared_hbm)
        src_sbuf = bnl.load(src_tensor)
        offsets_sbuf = bnl.load(offsets)
        out_sbuf = bnl.ndarray([128, n], dtype=src_tensor.dtype, buffer=bnl.sbuf)
        ix, iy = bnl.mgrid[0:128, 0:1]
        for idx in bnl.affine_range(n):
            out_sbuf[ix, idx] = bnisa.tensor_copy_dynamic_src(src_sbuf[ix, offsets_sbuf[0, idx] + iy])
        bnl.store(out_tensor, value=out_sbuf)
        return out_tensor
    return k


@pytest.mark.parametrize("dtype", [np.float32, BF16, np.int32])
def test_beta1_dynamic_src_gathers_columns(b1, dtype):
    src = (_rng().standard_normal((128, 512)) * 100).astype(dtype)
    off = _rng(1).integers(0, 512, (1, 16)).astype(np.int32)
    off[0, :3] = [0, 511, 7]  # both ends of the valid range
    np.testing.assert_array_equal(_gather_cols(b1)(src, off), src[:, off[0]])  # a same-dtype copy: exact


def test_beta1_dynamic_src_ir_is_one_tensor_copy_with_offsets(b1):
    """One tensor_copy per column, its src the static column 0 moved by ``offsets[0, j]`` x 1 element at run time;
    the index bound is the 512 columns (every value keeps the (128, 1) window inside the row)."""
    src, off = np.zeros((128, 512), np.float32), np.zeros((1, 4), np.int32)
    ops = [s for s in _ops(_gather_cols(b1).options(loops="unroll"), src, off) if "offsets" in s]
    assert len(ops) == 4
    for j, s in enumerate(ops):
        assert s["iimm"] == [512, 1]
        assert set(s["flags"]) == {"indirect_scalar", "dynamic_addr"}
        assert s["offsets"] == {"tensor": "offsets_sbuf", "index": [{"start": 0, "size": 1}, {"start": j, "size": 1}]}
    # With the loop kept (the default), the one tensor_copy of the body takes column `idx` of the offsets
    # (the arange subscript ``out_sbuf[ix, idx]`` has a loop index in it).
    kept = [s for s in _ops(_gather_cols(b1), src, off) if "offsets" in s]
    assert len(kept) == 1
    assert kept[0]["iimm"] == [512, 1]
    assert kept[0]["offsets"] == {"tensor": "offsets_sbuf",
                                  "index": [{"start": 0, "size": 1}, {"start": "idx", "size": 1}]}


def test_beta1_dynamic_src_middle_dim_and_static_start(b1):
    """``src[ix, offsets[0, j], iz]`` on a (128, 5, 4) tile (the SDK's second example) and a runtime index plus a
    constant (``offsets[0, j] + iy + 1``; ``offsets[0, j] + 1`` alone would be an add on chip, a new tile):
    bound = 20 - 1 columns."""
    _nki, bnl, bnisa = b1

    @_nki.jit
    def k(src, offsets):
        out = bnl.ndarray([128, 8, 4], dtype=src.dtype, buffer=bnl.shared_hbm)
        out2 = bnl.ndarray([128, 8], dtype=src.dtype, buffer=bnl.shared_hbm)
        s = bnl.load(src)
        o = bnl.load(offsets)
        res = bnl.ndarray([128, 8, 4], dtype=src.dtype, buffer=bnl.sbuf)
        res2 = bnl.ndarray([128, 8], dtype=src.dtype, buffer=bnl.sbuf)
        flat = bnl.load(src.reshape((128, 20)))
        ix, _, iz = bnl.mgrid[0:128, 0:1, 0:4]
        jx, jy = bnl.mgrid[0:128, 0:1]
        for j in bnl.affine_range(8):
            res[ix, j, iz] = bnisa.tensor_copy_dynamic_src(s[ix, o[0, j], iz])
            res2[jx, j] = bnisa.tensor_copy_dynamic_src(flat[jx, o[0, j] + jy + 1])
        bnl.store(out, res)
        bnl.store(out2, res2)
        return out, out2

    src = _rng().standard_normal((128, 5, 4)).astype(np.float32)
    off = np.array([[4, 0, 2, 1, 3, 3, 0, 4]], np.int32)
    got, got2 = k(src, off)
    np.testing.assert_array_equal(got, src[:, off[0], :])
    np.testing.assert_array_equal(got2, src.reshape(128, 20)[:, off[0] + 1])
    bounds = sorted({tuple(s["iimm"]) for s in _ops(k, src, off) if "offsets" in s})
    assert bounds == [(5, 4), (19, 1)]  # 5 rows of 4 elements; 20 - 1 columns after the static + 1


def test_beta1_dynamic_dst_scatters_columns(b1):
    _nki, bnl, bnisa = b1

    @_nki.jit
    def k(base, upd, offsets):
        out = bnl.ndarray(base.shape, dtype=base.dtype, buffer=bnl.shared_hbm)
        d = bnl.load(base)
        u = bnl.load(upd)
        o = bnl.load(offsets)
        ix, iy = bnl.mgrid[0:128, 0:1]
        for j in bnl.sequential_range(upd.shape[1]):
            bnisa.tensor_copy_dynamic_dst(dst=d[ix, o[0, j] + iy], src=u[ix, j])
        bnl.store(out, d)
        return out

    base = _rng().standard_normal((128, 64)).astype(np.float32)
    upd = _rng(2).standard_normal((128, 6)).astype(np.float32)
    off = np.array([[5, 63, 0, 5, 17, 40]], np.int32)  # column 5 twice: the later copy wins (program order)
    want = base.copy()
    for j in range(6):
        want[:, off[0, j]] = upd[:, j]
    np.testing.assert_array_equal(k(base, upd, off), want)
    ops = [s for s in _ops(k.options(loops="unroll"), base, upd, off) if "offsets" in s]
    assert len(ops) == 6 and all("indirect_dst" in s["flags"] for s in ops)
    kept = [s for s in _ops(k, base, upd, off) if "offsets" in s]  # the loop kept: one copy, column j
    assert len(kept) == 1 and kept[0]["offsets"]["index"][1] == {"start": "j", "size": 1}


def test_beta1_dynamic_src_dtype_engine_and_ds_form(b1):
    """``dtype=`` casts (fp32 -> bf16, RNE as numpy/ml_dtypes); ``engine=`` picks the engine of the instruction
    (Vector when unknown); ``nl.ds(idx_tile[0, 0], n)`` is the same runtime window."""
    _nki, bnl, bnisa = b1

    @_nki.jit
    def k(src, offsets):
        a = bnl.ndarray([128, 16], dtype=BF16, buffer=bnl.shared_hbm)
        b = bnl.ndarray([128, 16], dtype=src.dtype, buffer=bnl.shared_hbm)
        s = bnl.load(src)
        o = bnl.load(offsets)
        i_p = bnl.arange(128)[:, None]
        i_f = bnl.arange(16)[None, :]
        r1 = bnisa.tensor_copy_dynamic_src(s[i_p, o[0, 0] + i_f], dtype=BF16, engine=bnisa.scalar_engine)
        r2 = bnisa.tensor_copy_dynamic_src(s[:, bnl.ds(o[0, 1], 16)], engine=bnisa.gpsimd_engine)
        r3 = bnisa.tensor_copy_dynamic_src(s[:, bnl.ds(o[0, 1], 16)])
        bnl.store(a, r1)
        bnl.store(b, bnl.add(r2, r3))
        return a, b

    src = _rng().standard_normal((128, 100)).astype(np.float32)
    off = np.array([[84, 3]], np.int32)  # 84 + 16 = 100: the last valid window
    a, b = k(src, off)
    np.testing.assert_array_equal(a, src[:, 84:100].astype(BF16))
    np.testing.assert_array_equal(b, src[:, 3:19] * 2)
    engines = [s.get("engine") for s in _ops(k, src, off) if "offsets" in s]
    assert engines == ["scalar", "gpsimd", None]  # None: the compiler's choice (Vector by default)
    assert [s["iimm"] for s in _ops(k, src, off) if "offsets" in s] == [[85, 1]] * 3  # 100 - 15 start columns


def test_beta1_dynamic_copy_mask(b1):
    """``mask=`` restricts the copy to the predicate's rectangle over the output (§3.8): masked-out positions of
    the destination keep their values."""
    _nki, bnl, bnisa = b1

    @_nki.jit
    def k(src, dst0, offsets):
        out = bnl.ndarray(dst0.shape, dtype=dst0.dtype, buffer=bnl.shared_hbm)
        s = bnl.load(src)
        d = bnl.load(dst0)
        o = bnl.load(offsets)
        i_p = bnl.arange(128)[:, None]
        i_f = bnl.arange(8)[None, :]
        bnisa.tensor_copy_dynamic_dst(dst=d[i_p, o[0, 0] + i_f], src=s[i_p, i_f], mask=(i_p < 64) & (i_f < 6))
        bnl.store(out, d)
        return out

    src = _rng().standard_normal((128, 8)).astype(np.float32)
    dst0 = _rng(3).standard_normal((128, 32)).astype(np.float32)
    off = np.array([[25]], np.int32)  # 25 + 8 > 32 but the mask cuts the window to 6 columns: 25 + 6 = 31 fits
    want = dst0.copy()
    want[:64, 25:31] = src[:64, :6]
    np.testing.assert_array_equal(k(src, dst0, off), want)


def test_beta1_dynamic_offset_out_of_range_is_a_coded_error(b1):
    """A runtime value past the bound: NSIM-E408 when the copy runs, naming the value and the bound (no crash)."""
    src = np.zeros((128, 512), np.float32)
    for bad in (512, -1):
        with pytest.raises(NsimError) as e:
            _gather_cols(b1)(src, np.array([[3, bad]], np.int32))
        assert _code(e.value) == _errors.code("IndexOutOfBounds"), str(e.value)
        assert "runtime offset {}".format(bad) in str(e.value) and "[0, 512)" in str(e.value)


def test_beta1_assignment_copy_with_runtime_index_is_refused(b1):
    """The spec's err_copy_dynamic_indirect_indices_not_natively_supported: an assignment copy (or the plain
    tensor_copy, or a compute instruction) cannot use a runtime-indexed view."""
    _nki, bnl, bnisa = b1

    def run(body):
        @_nki.jit
        def k(src, offsets):
            s = bnl.load(src)
            o = bnl.load(offsets)
            d = bnl.ndarray((128, 1), dtype=src.dtype, buffer=bnl.sbuf)
            ix, iy = bnl.mgrid[0:128, 0:1]
            body(bnl, bnisa, s, o, d, ix, iy)
            return src
        return k(np.zeros((128, 32), np.float32), np.zeros((1, 2), np.int32))

    def assign_src(bnl, bnisa, s, o, d, ix, iy):
        d[ix, iy] = s[ix, o[0, 0] + iy]

    def assign_dst(bnl, bnisa, s, o, d, ix, iy):
        s[ix, o[0, 1] + iy] = d

    def plain_copy(bnl, bnisa, s, o, d, ix, iy):
        bnisa.tensor_copy(s[ix, o[0, 0] + iy])

    def compute(bnl, bnisa, s, o, d, ix, iy):
        bnl.exp(s[ix, o[0, 0] + iy])

    def two_runtime_items(bnl, bnisa, s, o, d, ix, iy):
        bnisa.tensor_copy_dynamic_src(s[o[0, 0], o[0, 1]])

    def partition_dim(bnl, bnisa, s, o, d, ix, iy):
        bnisa.tensor_copy_dynamic_src(s[o[0, 0] + ix, iy])

    for body, legacy in ((assign_src, True), (assign_dst, True), (plain_copy, True), (compute, False),
                         (two_runtime_items, False), (partition_dim, False)):
        with pytest.raises(NsimError) as e:
            run(body)
        assert _code(e.value) == _errors.code("DynamicIndex"), (body.__name__, str(e.value))
        assert ("err_copy_dynamic_indirect_indices_not_natively_supported" in str(e.value)) == legacy, str(e.value)


def test_beta1_dynamic_offset_must_be_an_sbuf_int_scalar(b1):
    _nki, bnl, bnisa = b1

    @_nki.jit
    def k(src, offsets):
        s = bnl.load(src)
        o = bnl.load(offsets)
        return bnisa.tensor_copy_dynamic_src(s[:, bnl.ds(o[0, 0], 4)])

    with pytest.raises(NsimError) as e:
        k(np.zeros((128, 32), np.float32), np.zeros((1, 2), np.float32))
    assert _code(e.value) == _errors.code("BadDtype"), str(e.value)


# --------------------------------------------------------------------------------------------------
# timing: the dynamic-copy cost and the conservative dependency
# --------------------------------------------------------------------------------------------------


def _copy_kernel(b1, dynamic, n):
    _nki, bnl, bnisa = b1

    @_nki.jit
    def k(src, offsets):
        out = bnl.ndarray([128, n], dtype=src.dtype, buffer=bnl.shared_hbm)
        s = bnl.load(src)
        o = bnl.load(offsets)
        if dynamic:
            r = bnisa.tensor_copy_dynamic_src(s[:, bnl.ds(o[0, 0], n)], engine=bnisa.vector_engine)
        else:
            r = bnisa.tensor_copy(s[:, 0:n], engine=bnisa.vector_engine)
        bnl.store(out, r)
        return out
    return k


@pytest.mark.parametrize("n,ratio", [(256, 600 / 256), (2048, 1.0)])
def test_dynamic_copy_costs_max_600_n_cycles(b1, n, ratio):
    """VectorE busy time of one fp32 copy of N elements per partition (no perf mode for fp32 on trn2):
    plain max(MIN_II = 64, N) = N cycles; dynamic max(vector.dynamic_copy_cycles = 600, N) (neuroncore.md 3.2).
    N = 256: 600 / 256; N = 2048: both 2048 cycles."""
    src = np.zeros((128, 4096), np.float32)
    off = np.zeros((1, 1), np.int32)
    busy = {}
    for dyn in (False, True):
        _out, prof = _copy_kernel(b1, dyn, n).options(config="trn2", timing_only=True).simulate(src, off)
        assert prof.stat("engine.vector.instruction_count") == 1
        busy[dyn] = prof.stat("engine.vector.busy_time")
    assert busy[True] / busy[False] == pytest.approx(ratio, rel=1e-5)  # busy_time: ns of whole ps


def test_dynamic_read_waits_for_every_write_it_may_read(b1):
    """The runtime offset is unknown to the schedule, so a dynamic read of column window [0, 4) moved at run time
    depends on a write to column 100 of the same tile (its reach covers every column): the copy reads the written
    value, whatever the engines' order."""
    _nki, bnl, bnisa = b1

    @_nki.jit
    def k(src, offsets):
        out = bnl.ndarray([128, 4], dtype=src.dtype, buffer=bnl.shared_hbm)
        s = bnl.load(src)
        o = bnl.load(offsets)
        s[:, 100:104] = bnl.multiply(s[:, 100:104], 3.0)  # a write to columns the runtime window may reach
        r = bnisa.tensor_copy_dynamic_src(s[:, bnl.ds(o[0, 0], 4)], engine=bnisa.gpsimd_engine)
        bnl.store(out, r)
        return out

    src = _rng().standard_normal((128, 128)).astype(np.float32)
    got = k(src, np.array([[100]], np.int32))
    np.testing.assert_allclose(got, src[:, 100:104] * 3.0, rtol=1e-6)


# --------------------------------------------------------------------------------------------------
# new dialect: nisa.tensor_copy of a runtime-offset on-chip view; nl.ds with runtime starts
# --------------------------------------------------------------------------------------------------


def test_new_tensor_copy_with_on_chip_scalar_offset():
    @nki.jit
    def k(src, offsets):
        out = nl.ndarray((128, 3, 8), dtype=src.dtype, buffer=nl.shared_hbm)
        s = nl.ndarray((128, 6, 8), dtype=src.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=s, src=src)
        f = nl.ndarray((128, 48), dtype=src.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=f, src=src)
        o = nl.ndarray(offsets.shape, dtype=offsets.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=o, src=offsets)
        r = nl.ndarray((128, 3, 8), dtype=src.dtype, buffer=nl.sbuf)
        # .ap with a runtime offset along dim 1 (rows of 8 elements), select(1, tile), nl.ds(tile, 8)
        nisa.tensor_copy(dst=r[:, 0, :], src=s.ap([[48, 128], [1, 8]], scalar_offset=o[0:1, 0:1], indirect_dim=1))
        nisa.tensor_copy(dst=r[:, 1, :], src=s.select(1, o[0:1, 1:2]))
        nisa.tensor_copy(dst=r[:, 2, :], src=f[:, nl.ds(o[0:1, 2:3], 8)])
        nisa.dma_copy(dst=out, src=r)
        return out

    src = _rng().standard_normal((128, 48)).astype(np.float32)
    off = np.array([[5, 2, 40]], np.int32)
    got = k(src, off)
    np.testing.assert_array_equal(got[:, 0], src[:, 40:48])
    np.testing.assert_array_equal(got[:, 1], src[:, 16:24])
    np.testing.assert_array_equal(got[:, 2], src[:, 40:48])
    assert [s["iimm"] for s in _ops(k, src, off) if "offsets" in s] == [[6, 8], [6, 8], [41, 1]]


def test_new_runtime_view_in_another_instruction_is_refused():
    @nki.jit
    def k(src, offsets):
        s = nl.ndarray(src.shape, dtype=src.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=s, src=src)
        o = nl.ndarray(offsets.shape, dtype=offsets.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=o, src=offsets)
        r = nl.ndarray((128, 8), dtype=src.dtype, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=r, data1=s[:, nl.ds(o[0:1, 0:1], 8)], data2=s[:, 0:8], op=nl.add)
        return src

    with pytest.raises(NsimError) as e:
        k(np.zeros((128, 48), np.float32), np.zeros((1, 1), np.int32))
    assert _code(e.value) == _errors.code("DynamicIndex"), str(e.value)


def test_ds_with_runtime_start_on_hbm_and_register():
    """``nl.ds(tile_value, n)`` on an HBM tensor is a scalar-offset DMA (the rows chosen at run time);
    ``nl.ds(register, n)`` uses the register's value (known while tracing: a static slice)."""
    @nki.jit
    def k(table, which):
        a = nl.ndarray((16, 64), dtype=table.dtype, buffer=nl.shared_hbm)
        b = nl.ndarray((16, 64), dtype=table.dtype, buffer=nl.shared_hbm)
        w = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=w, src=which)
        t = nl.ndarray((16, 64), dtype=table.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=table[nl.ds(w, 16), :])
        nisa.dma_copy(dst=a, src=t)
        r = nisa.register_alloc(7)
        u = nl.ndarray((16, 64), dtype=table.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=u, src=table[nl.ds(r, 16), :])
        nisa.dma_copy(dst=b, src=u)
        return a, b

    table = _rng().standard_normal((100, 64)).astype(np.float32)
    a, b = k(table, np.array([[84]], np.int32))
    np.testing.assert_array_equal(a, table[84:100])
    np.testing.assert_array_equal(b, table[7:23])
    dmas = [s for s in _ops(k, table, np.array([[84]], np.int32), op="dma_copy") if "offsets" in s]
    assert len(dmas) == 1 and dmas[0]["iimm"] == [85, 64] and "indirect_scalar" in dmas[0]["flags"]
    with pytest.raises(NsimError) as e:
        k(table, np.array([[85]], np.int32))
    assert _code(e.value) == _errors.code("IndexOutOfBounds"), str(e.value)


def test_beta1_ds_with_runtime_start_on_hbm(b1):
    _nki, bnl, _ = b1

    @_nki.jit
    def k(table, which):
        out = bnl.ndarray((32, 64), dtype=table.dtype, buffer=bnl.shared_hbm)
        w = bnl.load(which)
        bnl.store(out, bnl.load(table[bnl.ds(w[0, 0], 32), :]))
        return out

    table = _rng().standard_normal((100, 64)).astype(BF16)
    np.testing.assert_array_equal(k(table, np.array([[50]], np.int32)), table[50:82])


# --------------------------------------------------------------------------------------------------
# kernel.json: hostile dynamic copies get coded errors
# --------------------------------------------------------------------------------------------------


def _dyn_json(iimm=(512, 1), flags=("indirect_scalar",), offsets="o"):
    k = {"nsim_kernel": 1, "name": "dyn",
         "tensors": [{"name": "src", "buffer": "hbm", "shape": [128, 512], "dtype": "float32", "kind": "input"},
                     {"name": "off", "buffer": "hbm", "shape": [1, 1], "dtype": "int32", "kind": "input"},
                     {"name": "out", "buffer": "hbm", "shape": [128, 4], "dtype": "float32", "kind": "output"}],
         "body": [{"alloc": {"name": "s", "shape": [128, 512], "dtype": "float32", "buffer": "sbuf"}},
                  {"alloc": {"name": "o", "shape": [1, 1], "dtype": "int32", "buffer": "sbuf"}},
                  {"alloc": {"name": "r", "shape": [128, 4], "dtype": "float32", "buffer": "sbuf"}},
                  {"op": "dma_copy", "dst": "s", "src": "src"},
                  {"op": "dma_copy", "dst": "o", "src": "off"},
                  {"op": "tensor_copy", "dst": "r",
                   "src": {"tensor": "s", "index": [{"start": 0, "size": 128}, {"start": 0, "size": 4}]},
                   "flags": list(flags), "iimm": list(iimm)},
                  {"op": "dma_copy", "dst": "out", "src": "r"}]}
    if offsets:
        k["body"][5]["offsets"] = offsets
    return k


def _inputs(v=3):
    return {"src": np.arange(128 * 512, dtype=np.float32).reshape(128, 512), "off": np.array([[v]], np.int32)}


def test_kernel_json_dynamic_copy_runs():
    outs, _ = simulate_json(_dyn_json((509, 1)), inputs=_inputs(3))
    np.testing.assert_array_equal(outs["out"], _inputs()["src"][:, 3:7])


@pytest.mark.parametrize("iimm,flags,offsets,name", [
    ((510, 1), ("indirect_scalar",), "o", "OutOfBounds"),   # index 509 would read column 512 of a 512-column tile
    ((0, 1), ("indirect_scalar",), "o", "BadImmediate"),     # no valid index
    ((509, 1), (), "o", "ShapeMismatch"),                    # a dynamic tensor_copy takes one scalar offset
    ((509, 1), ("indirect_scalar",), None, "MissingOperand"),  # indirect flags without offsets
    ((509, 1), ("indirect_scalar",), "src", "BadBuffer"),    # offsets from HBM
])
def test_kernel_json_bad_dynamic_copies(iimm, flags, offsets, name):
    with pytest.raises(NsimError) as e:
        simulate_json(_dyn_json(iimm, flags, offsets), inputs=_inputs())
    assert _code(e.value) == _errors.code(name), str(e.value)


def test_values_of_a_runtime_indexed_view_are_not_the_static_window(b1):
    """Printing / reading a runtime-indexed view while tracing would show its static window (runtime value 0):
    ValuesUnavailable instead; the copied tile has the values."""
    _nki, bnl, bnisa = b1
    seen = {}

    @_nki.jit
    def k(src, offsets):
        s = bnl.load(src)
        o = bnl.load(offsets)
        v = s[:, bnl.ds(o[0, 0], 2)]
        with pytest.raises(NsimError) as e:
            v.numpy()
        seen["code"] = _code(e.value)
        seen["copy"] = bnisa.tensor_copy_dynamic_src(v).numpy()
        return src

    src = _rng().standard_normal((128, 16)).astype(np.float32)
    k(src, np.array([[9]], np.int32))
    assert seen["code"] == _errors.code("ValuesUnavailable")
    np.testing.assert_array_equal(seen["copy"], src[:, 9:11])
