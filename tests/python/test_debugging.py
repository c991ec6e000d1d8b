"""Debugging kernels (docs/debugging.md): eager values while tracing (print, np.asarray, .numpy(),
nl.device_print, pdb), the sanitizer (options(check=...)) and the kernel's variable names in messages."""
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

from conftest import NSIM_BIN, REPO_ROOT, require_core  # noqa: E402

_core, ml_dtypes = require_core()

import nsim  # noqa: E402
from nsim import nki, tracer  # noqa: E402
import nsim.nki.language as nl  # noqa: E402
import nsim.nki.isa as nisa  # noqa: E402

HERE = os.path.abspath(__file__)


def _line_of(text):
    """Line number in this file of the first line containing ``text``."""
    with open(HERE) as f:
        for i, line in enumerate(f, 1):
            if text in line and "_line_of" not in line:
                return i
    raise AssertionError(text)


# --------------------------------------------------------------------------------------------------
# eager values: new dialect
# --------------------------------------------------------------------------------------------------

SEEN = {}


@nki.jit
def add_and_look(a, b):
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    at = nl.ndarray((128, 64), a.dtype, buffer=nl.sbuf)
    bt = nl.ndarray((128, 64), a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=at, src=a)
    nisa.dma_copy(dst=bt, src=b)
    ct = nl.ndarray((128, 64), a.dtype, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=ct, data1=at, data2=bt, op=nl.add)
    print(ct)
    SEEN["asarray"] = np.asarray(ct)
    SEEN["numpy_view"] = ct[0:4, 8:16].numpy()
    nl.device_print("ct row 0:", ct[0:1, 0:8])
    # Python may branch on values: scale by 2 only when the sum is positive
    if np.asarray(ct).sum() > 0:
        nisa.tensor_scalar(dst=ct, data=ct, op0=nl.multiply, operand0=2.0)
    SEEN["after"] = ct.numpy()
    if ct[0:1, 0:1]:  # a one-element tensor has a truth value (its value is not 0)
        SEEN["branched"] = True
    nisa.dma_copy(dst=out, src=ct)
    return out


def test_eager_values_new_dialect(capsys):
    SEEN.clear()
    a = np.random.RandomState(0).rand(128, 64).astype(np.float32)
    b = np.random.RandomState(1).rand(128, 64).astype(np.float32)
    # `if tile:` works on the value (eager mode) and warns: the NKI compiler rejects control flow on tensor values
    with pytest.warns(nsim.tracer.NkiWarning, match="err_dynamic_control_flow_not_supported"):
        out = add_and_look(a, b)
    np.testing.assert_allclose(out, 2 * (a + b), rtol=1e-6)
    np.testing.assert_allclose(SEEN["asarray"], a + b, rtol=1e-6)
    np.testing.assert_allclose(SEEN["numpy_view"], (a + b)[0:4, 8:16], rtol=1e-6)
    np.testing.assert_allclose(SEEN["after"], out, rtol=1e-6)
    assert SEEN["branched"]
    text = capsys.readouterr().out
    assert "ct (128, 64) float32 (sbuf)" in text
    assert "ct row 0:" in text
    first = text.split("ct row 0:")[1].split("]]")[0]
    vals = np.array([float(x) for x in first.replace("[", " ").split()])
    np.testing.assert_allclose(vals, (a + b)[0, 0:8], rtol=1e-5)


def test_eager_values_negative_branch_takes_the_other_path():
    SEEN.clear()
    a = -np.ones((128, 64), np.float32)
    out = add_and_look(a, a)
    np.testing.assert_allclose(out, a + a)  # sum <= 0: not scaled


@nki.jit
def look_after_empty_loops(a):
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    at = nl.ndarray((128, 64), a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=at, src=a)
    for i in nl.affine_range(2 ** 20):  # 2^40 iterations in all that only allocate: no op to run in any
        for j in nl.affine_range(2 ** 20):
            scratch = nl.ndarray((128, 64), a.dtype, buffer=nl.sbuf)  # noqa: F841
    SEEN["empty_loops"] = at.numpy()
    nisa.dma_copy(dst=out, src=at)
    return out


def test_eager_values_after_loops_without_ops():
    # The eager session and the simulation each iterated such loops one iteration at a time (2^40: hours); a loop
    # without ops is not iterated (frontend::Lowering::skip_loop, EagerSession::run).
    SEEN.clear()
    a = np.random.RandomState(2).rand(128, 64).astype(np.float32)
    out = look_after_empty_loops(a)
    np.testing.assert_array_equal(SEEN["empty_loops"], a)
    np.testing.assert_array_equal(out, a)


@nki.jit
def matmul_look(x, w):
    xt = nl.ndarray((128, 128), nl.float32, buffer=nl.sbuf)
    wt = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=xt, src=x)
    nisa.dma_copy(dst=wt, src=w)
    ps = nl.ndarray((128, 64), nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=ps, stationary=xt, moving=wt)
    SEEN["psum"] = ps.numpy()
    res = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=res, src=ps)
    out = nl.ndarray((128, 64), nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=res)
    return out


def test_eager_values_of_psum_match_the_output():
    SEEN.clear()
    rs = np.random.RandomState(2)
    x = rs.rand(128, 128).astype(np.float32)
    w = rs.rand(128, 64).astype(np.float32)
    out = matmul_look(x, w)
    np.testing.assert_array_equal(SEEN["psum"], out)  # the same C++ semantics, bit for bit
    np.testing.assert_allclose(out, x.T @ w, rtol=1e-2)


@nki.jit
def two_psum_tiles(x, w):
    xt = nl.ndarray((128, 128), nl.float32, buffer=nl.sbuf)
    wt = nl.ndarray((128, 512), nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=xt, src=x)
    nisa.dma_copy(dst=wt, src=w)
    small = nl.ndarray((128, 256), nl.float32, buffer=nl.psum)  # half a bank
    nisa.nc_matmul(dst=small, stationary=xt, moving=wt[:, 0:256])
    big = nl.ndarray((128, 512), nl.float32, buffer=nl.psum)  # a whole bank: must not straddle two
    nisa.nc_matmul(dst=big, stationary=xt, moving=wt)
    SEEN["big"] = big.numpy()
    res = nl.ndarray((128, 512), nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=res, src=big)
    out = nl.ndarray((128, 512), nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=res)
    return out


def test_eager_psum_tiles_keep_the_bank_rule():
    SEEN.clear()
    rs = np.random.RandomState(7)
    x = rs.rand(128, 128).astype(np.float32)
    w = rs.rand(128, 512).astype(np.float32)
    out = two_psum_tiles(x, w)
    np.testing.assert_array_equal(SEEN["big"], out)


def test_eager_replay_of_flash_attention_matches_the_simulation(monkeypatch):
    """The whole library flash-attention kernel replayed through the eager session gives bit-identical
    outputs to the simulation (one numerics implementation)."""
    from nsim import kernels as K
    got = {}
    orig = tracer.Tracer.name_shared_tiles

    def hook(self):
        for t in self.tensors:
            if t["kind"] != "input":
                got[t["name"]] = self.eager().values(tracer.NkiTensor(self.storage[t["name"]], None, self))
        return orig(self)

    monkeypatch.setattr(tracer.Tracer, "name_shared_tiles", hook)
    args = K.flash_attention_inputs(1)
    out = K.flash_attention(*args)
    assert len(got) == 1
    np.testing.assert_array_equal(next(iter(got.values())), out)


def test_eager_values_of_manually_placed_tiles_share_bytes_as_in_the_simulation():
    seen = {}

    @nki.jit
    def k(a):
        x = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf, address=(0, 0))
        y = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf, address=(0, 0))  # the same bytes as x
        nisa.dma_copy(dst=x, src=a)
        seen["y"] = y.numpy()  # y reads what was written through x
        out = nl.ndarray((128, 64), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=y)
        return out

    a = np.arange(128 * 64, dtype=np.float32).reshape(128, 64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the overlap warning of the allocator
        out = k.options(check=False)(a)
    np.testing.assert_array_equal(out, a)
    np.testing.assert_array_equal(seen["y"], a)


def test_kernels_that_never_read_values_create_no_session():
    a = np.ones((128, 64), np.float32)
    tres = tracer.trace(nki.jit(lambda a: a).fn, (a,), {})
    assert tres is not None
    seen = {}

    @nki.jit
    def k(a):
        t = nl.ndarray((128, 64), a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a)
        seen["eager"] = tracer.active()._eager
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t)
        return out

    np.testing.assert_array_equal(k(a), a)
    assert seen["eager"] is None


# --------------------------------------------------------------------------------------------------
# eager values: Beta-1 dialect
# --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def b1():
    from nsim import compat

    was = compat.installed()
    before = {n for n in sys.modules if n.split(".", 1)[0] in ("nki", "neuronxcc")}
    compat.install()
    import neuronxcc.nki as bnki
    import neuronxcc.nki.language as bnl
    yield bnki, bnl
    if not was:
        compat.uninstall()
        for n in [n for n in sys.modules if n.split(".", 1)[0] in ("nki", "neuronxcc") and n not in before]:
            sys.modules.pop(n, None)


def test_eager_values_beta1(b1, capsys):
    bnki, bnl = b1
    seen = {}

    @bnki.jit
    def k(a, b):
        out = bnl.ndarray(a.shape, dtype=a.dtype, buffer=bnl.shared_hbm)
        at = bnl.load(a)
        bt = bnl.load(b)
        s = bnl.add(at, bt)
        print(s)
        seen["asarray"] = np.asarray(s)
        seen["numpy"] = s.numpy()
        bnl.device_print("sum=", s)
        if s[0:1, 0:1] > 0.5:  # a tile comparison, then the truth value of its one element
            seen["branched"] = True
        bnl.store(out, value=s)
        return out

    a = np.arange(128 * 32, dtype=np.float32).reshape(128, 32)
    b = np.ones((128, 32), np.float32)
    out = k(a, b)
    np.testing.assert_allclose(out, a + b)
    np.testing.assert_allclose(seen["asarray"], out)
    np.testing.assert_allclose(seen["numpy"], out)
    assert seen["branched"]
    text = capsys.readouterr().out
    assert "sum= [[" in text and "s (128, 32) float32 (sbuf)" in text


# --------------------------------------------------------------------------------------------------
# pdb inside a kernel, driven through stdin
# --------------------------------------------------------------------------------------------------

_PDB_SCRIPT = """
import numpy as np
from nsim import nki
import nsim.nki.language as nl
import nsim.nki.isa as nisa

@nki.jit
def k(a):
    tile = nl.ndarray((128, 8), a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=tile, src=a)
    nisa.tensor_scalar(dst=tile, data=tile, op0=nl.add, operand0=0.5)
    breakpoint()
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=tile)
    return out

a = np.full((128, 8), 41.0, np.float32)
print("result", float(k(a)[3, 4]))
"""


def test_breakpoint_inside_a_kernel_with_pdb_on_stdin(tmp_path):
    script = tmp_path / "kern.py"
    script.write_text(_PDB_SCRIPT)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(REPO_ROOT, "python"), os.path.join(REPO_ROOT, "build", "python"),
                                         env.get("PYTHONPATH", "")])
    env.pop("PYTHONBREAKPOINT", None)
    p = subprocess.run([sys.executable, str(script)], input="p tile.numpy()[3, 4] * 2\np tile.shape\nc\n",
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "(Pdb)" in p.stdout
    assert "83.0" in p.stdout  # (41 + 0.5) * 2, computed by the simulator core at the breakpoint
    assert "(128, 8)" in p.stdout
    assert "result 41.5" in p.stdout


# --------------------------------------------------------------------------------------------------
# the sanitizer
# --------------------------------------------------------------------------------------------------


def _reports(kernel, *args, check=True):
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        _, prof = kernel.options(check=check).simulate(*args)
    got = [x.message.report for x in w if issubclass(x.category, tracer.CheckWarning)]
    assert got == prof.check_reports
    return got


def _fresh_read(fixed):
    @nki.jit
    def k(a):
        at = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=at, src=a)
        acc = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
        if fixed:
            nisa.memset(dst=acc, value=0.0)
        nisa.tensor_tensor(dst=acc, data1=acc, data2=at, op=nl.add)  # BUG-READ
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=acc)  # BUG-STORE
        return out
    return k


def test_check_uninitialized_read():
    a = np.ones((128, 64), np.float32)
    reps = _reports(_fresh_read(False), a)
    assert len(reps) == 1
    r = reps[0]
    assert r["check"] == "uninitialized-read" and r["code"] == "NSIM-W501"
    # Since taint propagation (2026-12-05) the element-wise tensor_tensor (# BUG-READ) only taints acc: the
    # report is at the store of the garbage to HBM.
    assert r["op"] == "dma_copy" and r["tensor"] == "acc"
    assert r["line"] == _line_of("# BUG-STORE") and r["file"] == HERE
    assert "stores 8192 sbuf elements of src that were never written or computed from never-written data" in r["detail"]
    # ... and names where the garbage began: the accumulation that read acc before anything wrote it
    assert r["detail"].endswith("; the never-written data was first read by tensor_tensor (data1) at {}:{} (k)".format(
        HERE, _line_of("# BUG-READ")))
    assert "uninitialized-read" in r["message"] and "'acc'" in r["message"] and "Fix:" in r["message"]
    assert _reports(_fresh_read(True), a) == []


def _register_sum(cmd):
    @nki.jit
    def k(a):
        at = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=at, src=a)
        y = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
        s = nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf)
        kw = {} if cmd is None else {"reduce_cmd": cmd}
        nisa.activation(dst=y, op=nl.exp, data=at, reduce_op=nl.add, reduce_res=s, **kw)  # REG-READ
        nisa.activation(dst=y, op=nl.exp, data=at, reduce_op=nl.add, reduce_res=s, reduce_cmd=nisa.reduce_cmd.reduce)
        out = nl.ndarray((128, 1), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=s)  # REG-STORE
        return out
    return k


def test_check_accumulator_registers_read_before_any_reset():
    """activation(reduce_op=, reduce_res=) with the default reduce_cmd=idle writes the registers' value into
    reduce_res without reducing (spec 2.1), and a `reduce` adds onto them: before any instruction reset them they
    hold what an earlier kernel left (nsim starts them at 0, the hardware does not promise it). Like never-written
    memory (valgrind-style), the garbage is reported where it is used: NSIM-W501 at the store of reduce_res, naming
    the activation that read the registers. None once a reset_reduce starts the sum (the second activation adds
    onto it), and none when such a reduce_res is never used (tests/python/test_nki_beta1.py's bool masks)."""
    a = np.full((128, 64), 0.5, np.float32)
    reps = _reports(_register_sum(None), a)
    assert [(r["code"], r["op"], r["line"]) for r in reps] == [("NSIM-W501", "dma_copy", _line_of("# REG-STORE"))]
    assert reps[0]["detail"].endswith("; the never-written data was first read by activation (ScalarE registers, "
                                      "reduce_cmd=idle) at {}:{} (k)".format(HERE, _line_of("# REG-READ")))
    k = _register_sum(nisa.reduce_cmd.reset_reduce)
    assert _reports(k, a) == []
    np.testing.assert_allclose(k(a), np.full((128, 1), 2 * 64 * np.exp(0.5)), rtol=1e-5)


def test_check_ragged_last_tile_computes_on_unwritten_rows_without_a_report(b1):
    """The public-kernel pattern: a masked load of the ragged last tile (rows 0..31 of 128), an unmasked
    element-wise op over all 128 partitions, a masked store of rows 0..31. The garbage rows never leave the chip:
    the multiply only taints them (no NSIM-W501). Stored unmasked, they reach HBM: one report, at the store."""
    bnki, bnl = b1

    def make(masked_store):
        @bnki.jit
        def k(x):
            n, f = x.shape
            out = bnl.ndarray(((n + 127) // 128 * 128, f), dtype=x.dtype, buffer=bnl.shared_hbm)
            i_p = bnl.arange(128)[:, None]
            i_f = bnl.arange(f)[None, :]
            for c in bnl.affine_range((n + 127) // 128):
                t = bnl.load(x[c * 128 + i_p, i_f], mask=(c * 128 + i_p < n))
                y = bnl.multiply(t, 2.0)  # RAGGED-MULTIPLY
                if masked_store:
                    bnl.store(out[c * 128 + i_p, i_f], value=y, mask=(c * 128 + i_p < n))
                else:
                    bnl.store(out[c * 128 + i_p, i_f], value=y)  # RAGGED-STORE
            return out
        return k

    x = np.random.default_rng(0).random((160, 64), dtype=np.float32)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        out, prof = make(True).options(check=True).simulate(x)
    assert prof.check_reports == [] and not [m for m in w if issubclass(m.category, tracer.CheckWarning)]
    np.testing.assert_array_equal(out[:160], 2 * x)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        out, prof = make(False).options(check=True).simulate(x)
    np.testing.assert_array_equal(out[:160], 2 * x)
    reps = prof.check_reports
    assert [(r["code"], r["op"], r["line"], r["count"]) for r in reps] == [
        ("NSIM-W501", "dma_copy", _line_of("# RAGGED-STORE"), 1)]
    assert ("stores 6144 sbuf elements of src that were never written or computed from never-written data (of 8192), "
            "first at partition 32 element 0, last at partition 127 element 63") in reps[0]["detail"]


def test_check_ragged_tile_through_transpose_and_matmul(b1):
    """The nki-samples RMSNorm + QKV pattern, small: a ragged token tile (rows 0..71 of 128 loaded), transposed on
    the PE (tokens become columns), then the stationary of a matmul (its columns become output rows): the garbage
    tokens end in output rows 72..127, which the masked store drops: no NSIM-W501 (element-granular taint,
    2026-12-05; before, the transpose reported). Stored unmasked they reach HBM: one report, at the store, naming
    the transpose that first read the unwritten rows."""
    bnki, bnl = b1
    import neuronxcc.nki.isa as bnisa

    def make(masked_store):
        @bnki.jit
        def k(x, w):
            n, d = x.shape
            h = w.shape[1]
            out = bnl.ndarray((128, h), dtype=x.dtype, buffer=bnl.shared_hbm)
            i_p = bnl.arange(128)[:, None]
            i_d = bnl.arange(d)[None, :]
            i_h = bnl.arange(h)[None, :]
            t = bnl.load(x[i_p, i_d], mask=(i_p < n))
            tt = bnl.copy(bnisa.nc_transpose(t))  # RAGGED-TRANSPOSE [d, 128 tokens]: token columns n.. garbage
            y = bnl.copy(bnisa.nc_matmul(tt, bnl.load(w)))  # [128 tokens, h]: rows n.. garbage
            if masked_store:
                bnl.store(out[i_p, i_h], value=y, mask=(i_p < n))
            else:
                bnl.store(out[i_p, i_h], value=y)  # RAGGED-MM-STORE
            return out
        return k

    rng = np.random.default_rng(1)
    x = rng.standard_normal((72, 128)).astype(np.float32)
    w = rng.standard_normal((128, 64)).astype(np.float32)
    with warnings.catch_warnings(record=True) as w_:
        warnings.simplefilter("always")
        out, prof = make(True).options(check=True).simulate(x, w)
    assert prof.check_reports == [] and not [m for m in w_ if issubclass(m.category, tracer.CheckWarning)]
    np.testing.assert_allclose(out[:72], x.astype(np.float64) @ w, rtol=1e-4, atol=1e-4)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        out, prof = make(False).options(check=True).simulate(x, w)
    np.testing.assert_allclose(out[:72], x.astype(np.float64) @ w, rtol=1e-4, atol=1e-4)
    reps = prof.check_reports
    assert [(r["code"], r["op"], r["line"], r["count"]) for r in reps] == [
        ("NSIM-W501", "dma_copy", _line_of("# RAGGED-MM-STORE"), 1)]
    assert ("stores 3584 sbuf elements of src that were never written or computed from never-written data (of 8192), "
            "first at partition 72 element 0, last at partition 127 element 63") in reps[0]["detail"]
    assert reps[0]["detail"].endswith("; the never-written data was first read by nc_transpose (data) at {}:{} (k)".format(
        HERE, _line_of("# RAGGED-TRANSPOSE")))


def _reused_storage(fixed):
    @nki.jit
    def k(a, b):
        out = nl.ndarray((128, 128), a.dtype, buffer=nl.shared_hbm)
        at = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=at, src=a)
        nisa.dma_copy(dst=out[:, 0:64], src=at)  # at is dead from here: its bytes may serve another tile
        ct = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
        if fixed:
            nisa.dma_copy(dst=ct, src=b)
        nisa.tensor_scalar(dst=ct, data=ct, op0=nl.multiply, operand0=2.0)  # BUG-STALE
        nisa.dma_copy(dst=out[:, 64:128], src=ct)  # BUG-STALE-STORE
        return out
    return k


def test_check_uninitialized_read_of_storage_an_earlier_tile_wrote():
    # ct is never written, but the compiler model gives it the bytes of `at`, which died before: on
    # hardware (and in nsim's numerics) ct reads a's values, no NaN shows. The shadow remembers which
    # allocation wrote each byte, so the read is still reported (at the store of what tensor_scalar computed
    # from it, since taint propagation). SBUF is cut to the 256 bytes per partition of one tile, so ct must take
    # at's bytes (with room, a tile takes bytes unused so far).
    a = np.arange(128 * 64, dtype=np.float32).reshape(128, 64)
    b = np.ones((128, 64), np.float32)
    tight = {"sbuf.bytes_per_partition": "256B"}
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        out, prof = _reused_storage(False).options(check=True, overrides=tight).simulate(a, b)
    np.testing.assert_array_equal(out[:, 64:], 2 * a)  # the stale values: storage really is shared
    reps = prof.check_reports
    assert [(r["check"], r["op"], r["tensor"]) for r in reps] == [("uninitialized-read", "dma_copy", "ct")]
    assert reps[0]["line"] == _line_of("# BUG-STALE-STORE")
    assert "stores 8192 sbuf elements of src that were never written or computed" in reps[0]["detail"]
    out, prof = _reused_storage(True).options(check=True, overrides=tight).simulate(a, b)
    assert prof.check_reports == []
    np.testing.assert_array_equal(out[:, 64:], 2 * b)


def test_check_from_the_command_line(tmp_path):
    if not os.path.exists(NSIM_BIN):
        pytest.skip("no nsim binary")
    a = np.ones((128, 64), np.float32)
    for fixed in (False, True):
        path = tmp_path / "k{}.json".format(int(fixed))
        path.write_text(tracer.dumps(_fresh_read(fixed).to_json(a)))
        r = subprocess.run([NSIM_BIN, "run", str(path), "--check", "-q"], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        if fixed:
            assert "NSIM-W" not in r.stderr
        else:
            assert "nsim: warning: NSIM-W501 uninitialized-read: dma_copy on 'acc'" in r.stderr
            assert "test_debugging.py:{}".format(_line_of("# BUG-STORE")) in r.stderr
        r = subprocess.run([NSIM_BIN, "run", str(path), "-q"], capture_output=True, text=True, timeout=120)
        assert "NSIM-W" not in r.stderr  # off unless asked for


def test_check_strict_raises_and_off_is_silent():
    a = np.ones((128, 64), np.float32)
    with pytest.raises(nsim.NsimError) as e:
        _fresh_read(False).options(check="strict").simulate(a)
    assert e.value.code == "NSIM-W501" and "acc" in str(e.value)
    assert _reports(_fresh_read(False), a, check=False) == []


def _accumulate(fixed):
    @nki.jit
    def k(x, w):
        xt = nl.ndarray((128, 128), nl.float32, buffer=nl.sbuf)
        wt = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=xt, src=x)
        nisa.dma_copy(dst=wt, src=w)
        ps = nl.ndarray((128, 64), nl.float32, buffer=nl.psum)
        for i in range(2):
            nisa.nc_matmul(dst=ps, stationary=xt, moving=wt, accumulate=(i > 0) if fixed else True)  # BUG-ACC
        res = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=res, src=ps)
        out = nl.ndarray((128, 64), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=res)
        return out
    return k


def test_check_psum_accumulate_uninitialized():
    rs = np.random.RandomState(3)
    x = rs.rand(128, 128).astype(np.float32)
    w = rs.rand(128, 64).astype(np.float32)
    reps = _reports(_accumulate(False), x, w)
    assert [r["check"] for r in reps] == ["psum-accumulate-uninitialized"]
    r = reps[0]
    assert r["code"] == "NSIM-W502" and r["op"] == "nc_matmul" and r["tensor"] == "ps"
    assert r["line"] == _line_of("# BUG-ACC")
    assert _reports(_accumulate(True), x, w) == []


def _log(fixed):
    @nki.jit
    def k(a):
        xt = nl.ndarray((128, 16), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=xt, src=a)
        if fixed:
            nisa.tensor_scalar(dst=xt, data=xt, op0=nl.add, operand0=1.0)
        lg = nl.ndarray((128, 16), nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=lg, op=nl.log, data=xt)  # BUG-NAN
        out = nl.ndarray((128, 16), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=lg)
        return out
    return k


def test_check_first_nan_from_finite_inputs():
    a = np.zeros((128, 16), np.float32)
    reps = _reports(_log(False), a)
    assert [r["check"] for r in reps] == ["nan-produced"]
    r = reps[0]
    assert r["code"] == "NSIM-W503" and r["op"] == "activation" and r["tensor"] == "lg"
    assert r["line"] == _line_of("# BUG-NAN") and "-inf" in r["detail"]
    assert _reports(_log(True), a) == []


def test_check_nan_from_nan_input_is_not_reported():
    a = np.full((128, 16), np.nan, np.float32)
    assert _reports(_log(True), a) == []


def _quantize(fixed):
    @nki.jit
    def k(a):  # a in [-1000, 1000): quantize to int8 (a per-tensor scale of 127/1000 fixes it)
        xt = nl.ndarray((128, 16), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=xt, src=a)
        if fixed:
            nisa.tensor_scalar(dst=xt, data=xt, op0=nl.multiply, operand0=127.0 / 1000.0)
        q = nl.ndarray((128, 16), nl.int8, buffer=nl.sbuf)
        nisa.tensor_copy(dst=q, src=xt)  # BUG-CAST
        out = nl.ndarray((128, 16), nl.int8, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=q)
        return out
    return k


def test_check_cast_out_of_range():
    a = np.random.RandomState(4).uniform(-1000, 1000, (128, 16)).astype(np.float32)
    reps = _reports(_quantize(False), a)
    assert [r["check"] for r in reps] == ["cast-out-of-range"]
    r = reps[0]
    assert r["code"] == "NSIM-W505" and r["op"] == "tensor_copy" and r["tensor"] == "q"
    assert r["line"] == _line_of("# BUG-CAST") and "int8" in r["detail"]
    t = np.trunc(a)  # float -> int8 truncates toward zero, then saturates
    n_out = int(((t > 127) | (t < -128)).sum())
    assert r["detail"].startswith("{} values".format(n_out))  # every saturated element is counted
    assert _reports(_quantize(True), a) == []


def _affine(fixed):
    @nki.jit
    def k(a):
        out = nl.ndarray((128, 64), nl.float32, buffer=nl.shared_hbm)
        scratch = nl.ndarray((128, 16), nl.float32, buffer=nl.sbuf)
        for i in nl.affine_range(4):
            if fixed:  # each iteration its own tile
                scratch = nl.ndarray((128, 16), nl.float32, buffer=nl.sbuf)
            nisa.dma_copy(dst=scratch, src=a[:, i * 16:(i + 1) * 16])  # BUG-AFFINE
            nisa.tensor_scalar(dst=scratch, data=scratch, op0=nl.add, operand0=1.0)
            nisa.dma_copy(dst=out[:, i * 16:(i + 1) * 16], src=scratch)
        return out
    return k


def test_check_affine_range_write_conflict():
    a = np.random.RandomState(5).rand(128, 64).astype(np.float32)
    reps = _reports(_affine(False), a)
    assert [r["check"] for r in reps] == ["affine-write-conflict"]
    r = reps[0]
    assert r["code"] == "NSIM-W504" and r["op"] == "dma_copy" and r["tensor"] == "scratch"
    assert r["line"] == _line_of("# BUG-AFFINE") and r["file"] == HERE
    assert "iteration 1 of the affine_range" in r["detail"] and "iteration 0" in r["detail"]
    assert _reports(_affine(True), a) == []
    # the same loop as sequential_range is legal
    assert not tracer.active()


def test_check_affine_range_loop_carried_read():
    a = np.random.RandomState(8).rand(128, 64).astype(np.float32)

    @nki.jit
    def k(a):
        out = nl.ndarray((128, 64), nl.float32, buffer=nl.shared_hbm)
        run = nl.ndarray((128, 16), nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=run, value=0.0)
        for i in nl.affine_range(4):
            x = nl.ndarray((128, 16), nl.float32, buffer=nl.sbuf)
            nisa.dma_copy(dst=x, src=a[:, i * 16:(i + 1) * 16])
            nisa.tensor_tensor(dst=x, data1=x, data2=run, op=nl.add)  # BUG-CARRIED
            nisa.tensor_copy(dst=run, src=x)
            nisa.dma_copy(dst=out[:, i * 16:(i + 1) * 16], src=x)
        return out

    reps = _reports(k, a)
    assert [r["check"] for r in reps] == ["affine-write-conflict"]
    r = reps[0]
    assert r["tensor"] == "run" and r["op"] == "tensor_tensor" and r["line"] == _line_of("# BUG-CARRIED")
    assert "reads data2 bytes that iteration 0 wrote" in r["detail"] and "loop-carried" in r["detail"]


def test_check_affine_range_accumulation_is_legal():
    rs = np.random.RandomState(6)
    x = rs.rand(128, 128).astype(np.float32)
    w = rs.rand(128, 64).astype(np.float32)

    @nki.jit
    def k(x, w):
        xt = nl.ndarray((128, 128), nl.float32, buffer=nl.sbuf)
        wt = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=xt, src=x)
        nisa.dma_copy(dst=wt, src=w)
        ps = nl.ndarray((128, 64), nl.float32, buffer=nl.psum)
        for i in nl.affine_range(3):
            nisa.nc_matmul(dst=ps, stationary=xt, moving=wt)
        res = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=res, src=ps)
        out = nl.ndarray((128, 64), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=res)
        return out

    assert _reports(k, x, w) == []


@pytest.mark.parametrize("name", sorted(__import__("nsim.kernels", fromlist=["KERNELS"]).KERNELS))
def test_library_kernels_report_nothing(name):
    from nsim import kernels as K
    kernel, _ref, make_inputs = K.KERNELS[name]
    assert _reports(kernel, *make_inputs(1)) == []


# --------------------------------------------------------------------------------------------------
# names: tiles and tensors carry the kernel's variable names
# --------------------------------------------------------------------------------------------------


def test_tiles_are_named_after_their_variables():
    a = np.ones((128, 64), np.float32)
    kern = add_and_look.to_json(a, a)
    allocs = [s["alloc"]["name"] for s in kern["body"] if "alloc" in s]
    assert {"at", "bt", "ct"} <= set(allocs)
    assert "out" in [t["name"] for t in kern["tensors"]]
    lines = nsim.disasm_json(kern)
    assert any(l.startswith("tensor_tensor") and l.endswith("[dst=ct data1=at data2=bt]") for l in lines), lines


def test_errors_name_the_variable():
    @nki.jit
    def k(a):
        my_tile = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=my_tile, src=a)
        return my_tile[:, 70:80]

    with pytest.raises(nsim.NsimError) as e:
        k(np.ones((128, 64), np.float32))
    assert "my_tile" in str(e.value)


def _handoff(fixed):
    @nki.jit
    def k(a):  # core 0 computes buf = a + 1, core 1 reads buf: only a barrier orders the two cores
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        buf = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray(a.shape, a.dtype, buffer=nl.sbuf)
        if nl.program_id(0) == 0:
            nisa.dma_copy(dst=t, src=a)
            nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=1.0)
            nisa.dma_copy(dst=buf, src=t)  # RACE-WRITE
        if fixed:
            nisa.core_barrier(buf, (0, 1), engine=nisa.engine.sync)
        if nl.program_id(0) == 1:
            nisa.dma_copy(dst=t, src=buf)  # RACE-READ
            nisa.dma_copy(dst=out, src=t)
        return out
    return k


def test_check_dma_race_between_the_cores_of_an_lnc2_launch():
    a = np.random.RandomState(5).standard_normal((128, 64)).astype(np.float32)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        _, prof = _handoff(False).options(check=True)[2].simulate(a)
    reps = prof.check_reports
    assert [x.message.report for x in w if issubclass(x.category, tracer.CheckWarning)] == reps
    assert [r["check"] for r in reps] == ["dma-race"]
    r = reps[0]
    # nothing holds core 1 back: its load of buf issues first (reading garbage), core 0's store later;
    # the report is on the later of the two and names the other one's line
    assert r["code"] == "NSIM-W506" and r["tensor"] == "buf" and r["op"] == "dma_copy on core 0"
    assert r["line"] == _line_of("# RACE-WRITE")
    assert "writes bytes" in r["detail"] and "on core 1 reads" in r["detail"]
    assert "test_debugging.py:{}".format(_line_of("# RACE-READ")) in r["detail"]
    print(r["message"])
    # with the barrier, core 1 reads what core 0 wrote, and nothing is reported
    out, prof = _handoff(True).options(check=True)[2].simulate(a)
    assert prof.check_reports == []
    np.testing.assert_allclose(out, a + 1, rtol=1e-6)


def test_check_dma_race_ignores_disjoint_columns_of_a_shared_tensor():
    @nki.jit
    def k(a):  # each core writes every other 16-column block of out: interleaved, never the same bytes
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        pid = nl.program_id(0)
        t = nl.ndarray((128, 16), a.dtype, buffer=nl.sbuf)
        for j in range(4):
            c = (2 * j + pid) * 16
            nisa.dma_copy(dst=t, src=a[:, c:c + 16])
            nisa.dma_copy(dst=out[:, c:c + 16], src=t)
        return out
    a = np.random.RandomState(6).standard_normal((128, 128)).astype(np.float32)
    out, prof = k.options(check=True)[2].simulate(a)
    np.testing.assert_array_equal(out, a)
    assert prof.check_reports == []


def test_check_affine_range_inplace_accumulation():
    """``acc = acc + x`` on an SBUF tile made outside an affine_range (Beta 1 writes it ``acc[...] += x``: the NKI
    mamba sample's scanC_accum): an associative accumulation, legal in any iteration order, so not reported; a
    plain read of acc inside the loop (the running value, which depends on the order) still is."""
    a = np.random.RandomState(9).rand(4, 128, 64).astype(np.float32)

    def make(read_running):
        @nki.jit
        def k(a):
            out = nl.ndarray((128, 64), nl.float32, buffer=nl.shared_hbm)
            acc = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
            nisa.memset(dst=acc, value=0.0)
            for i in nl.affine_range(4):
                x = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
                nisa.dma_copy(dst=x, src=a[i])
                nisa.tensor_tensor(dst=acc, data1=acc, data2=x, op=nl.add)
                if read_running:
                    y = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
                    nisa.tensor_scalar(dst=y, data=acc, op0=nl.multiply, operand0=2.0)  # BUG-RUNNING
                    nisa.dma_copy(dst=out, src=y)
            if not read_running:
                nisa.dma_copy(dst=out, src=acc)
            return out
        return k

    assert _reports(make(False), a) == []
    got, _ = make(False).simulate(a)
    np.testing.assert_allclose(got, a.sum(axis=0), rtol=1e-5, atol=1e-5)
    reps = _reports(make(True), a)
    assert [r["check"] for r in reps] == ["affine-write-conflict"]
    assert reps[0]["tensor"] == "acc" and reps[0]["line"] == _line_of("# BUG-RUNNING")


# --------------------------------------------------------------------------------------------------
# NSIM-W507: an activation's input outside the valid range of the hardware's function (spec 3.5)
# --------------------------------------------------------------------------------------------------


def _act_kernel(op, scale=1.0, bias=None):
    @nki.jit
    def k(x):
        out = nl.ndarray(x.shape, nl.float32, buffer=nl.shared_hbm)
        t = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        o = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=o, op=op, data=t, scale=scale, bias=bias)  # ACT-LINE
        nisa.dma_copy(dst=out, src=o)
        return out
    return k


def test_check_activation_input_out_of_range():
    rng = np.random.default_rng(20)
    angles = rng.uniform(-3.0, 3.0, (128, 32)).astype(np.float32)
    assert _reports(_act_kernel(nl.sin), angles) == []
    wide = angles.copy()
    wide[5, 7] = 12.5  # an unreduced RoPE angle: the hardware's sin extrapolates a cubic there
    reps = _reports(_act_kernel(nl.sin), wide)
    assert [r["check"] for r in reps] == ["activation-out-of-range"]
    r = reps[0]
    assert r["code"] == "NSIM-W507" and r["op"] == "activation" and r["line"] == _line_of("# ACT-LINE")
    assert "12.5 at partition 5 element 7" in r["detail"]
    # the function's input is data * scale + bias: scale 0.2 brings 12.5 to 2.5 (in range); a bias of 1.0 moves
    # 2.9 past pi
    assert _reports(_act_kernel(nl.sin, scale=0.2), wide) == []
    assert [r["check"] for r in _reports(_act_kernel(nl.sin, bias=1.0), np.full((128, 4), 2.9, np.float32))] == \
        ["activation-out-of-range"]
    # arctan on [-pi/2, pi/2]; reciprocal by magnitude (+-[2^-42, 2^42]); log above 2^64. 0 is not checked (log(0)
    # is -inf: NSIM-W503's), nor is sqrt of 0.
    assert [r["check"] for r in _reports(_act_kernel(nl.arctan), np.full((128, 4), 2.0, np.float32))] == \
        ["activation-out-of-range"]
    assert _reports(_act_kernel(nl.reciprocal), np.full((128, 4), -3.0e-14, np.float32)) != []
    assert _reports(_act_kernel(nl.reciprocal), np.full((128, 4), -3.0e-6, np.float32)) == []
    assert _reports(_act_kernel(nl.log), np.full((128, 4), 1e20, np.float32)) != []
    assert _reports(_act_kernel(nl.sqrt), np.zeros((128, 4), np.float32)) == []


def test_check_activate2_input_out_of_range():
    """activate2 (gen4) applies its function to v = op1(op0(data, imm0), imm1): the range check reads that, the
    reverse flags and a (P, 1) operand included (before 2026-12-05 activate2 was not checked)."""
    @nki.jit
    def k(x, b):
        out = nl.ndarray(x.shape, nl.float32, buffer=nl.shared_hbm)
        t = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        bt = nl.ndarray(b.shape, nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=bt, src=b)
        o = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
        nisa.activate2(dst=o, op=nl.sin, data=t, imm0=2.0, imm1=bt, op0=nl.multiply,  # ACT2-LINE
                       op1=nl.subtract, reverse1=True)
        nisa.dma_copy(dst=out, src=o)
        return out

    x = np.full((128, 8), 1.0, np.float32)
    b = np.full((128, 1), 1.5, np.float32)
    assert _reports(k.options(config="trn3"), x, b) == []  # v = b - 2x = -0.5: in [-pi, pi]
    b[9, 0] = 6.0  # v = 6 - 2 = 4 at partition 9 (data * scale + bias, as activation reads it, would be 1.0)
    reps = _reports(k.options(config="trn3"), x, b)
    assert [(r["code"], r["op"]) for r in reps] == [("NSIM-W507", "activate2")]
    assert reps[0]["line"] == _line_of("# ACT2-LINE")
    assert "op1(op0(data, imm0), imm1) is 4 at partition 9 element 0" in reps[0]["detail"]


def test_nl_sin_reduces_its_argument_first():
    """nl.sin(x) is a range reduction (one tensor_scalar: x + pi mod 2 pi) and the sin activation with a bias of -pi
    (spec 3.6), so any angle is in the activation's range: no NSIM-W507, sin within an fp32 phase error of |x|."""
    @nki.jit
    def k(x):
        out = nl.ndarray(x.shape, nl.float32, buffer=nl.shared_hbm)
        t = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        nisa.dma_copy(dst=out, src=nl.sin(t))
        return out

    x = (np.random.default_rng(21).standard_normal((128, 64)) * 200).astype(np.float32)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        got = k(x)
    assert [m for m in w if issubclass(m.category, tracer.CheckWarning)] == []
    x64 = x.astype(np.float64)
    assert (np.abs(got - np.sin(x64)) <= 2 * np.spacing(np.float32(np.abs(x64) + 2 * np.pi)) + 1e-6).all()
    ops = [s["op"] for s in k.last_json["body"] if "op" in s]
    assert ops.count("tensor_scalar") == 1 and ops.count("activation") == 1
