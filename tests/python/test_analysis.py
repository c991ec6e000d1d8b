"""`nsim analyze` / Profile.analyze(): kernels with known defects, the findings at the right lines,
and the fixed kernels without the finding and faster."""
import inspect
import json
import os
import subprocess

import numpy as np
import pytest

from conftest import require_core  # noqa: E402

_core, ml_dtypes = require_core()

import nsim  # noqa: E402
from nsim import nki  # noqa: E402
import nsim.nki.language as nl  # noqa: E402
import nsim.nki.isa as nisa  # noqa: E402

BF16 = ml_dtypes.bfloat16
HERE = os.path.abspath(__file__)

import sys  # noqa: E402
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "..", "..", "examples", "defects"))
import pairs as P  # noqa: E402
from pairs import add_bias_reloading, add_bias_hoisted  # noqa: E402


def line_of(fn, marker):
    """Line number (in this file) of the line of `fn` that carries the comment `marker`."""
    src, first = inspect.getsourcelines(fn.fn if hasattr(fn, "fn") else fn)
    hits = [first + i for i, text in enumerate(src) if marker in text]
    assert len(hits) == 1, (marker, hits)
    return hits[0]


def analyse(kernel, *args, **kw):
    """(Analysis, Profile) of a traced kernel, timing-only on trn2 (kw: the kernel's keyword arguments)."""
    _, prof = kernel.options(timing_only=True).simulate(*args, **kw)
    return prof.analyze(), prof


def lines(finding):
    return [(os.path.basename(l["file"]), l["line"]) for l in finding["lines"]]


def here(line):
    return (os.path.basename(HERE), line)


# --------------------------------------------------------------------------------------------------
# 1. DMA efficiency: rows of 128 bytes per partition
# --------------------------------------------------------------------------------------------------


make_scale_kernel = P._scale  # loads and stores of `cols` columns, both marked # DEFECT (examples/defects)


def test_small_dma_rows_are_found_at_their_lines_and_fixing_them_helps():
    x = np.zeros((128, 8192), BF16)
    bad = make_scale_kernel(64)     # 64 bf16 = 128 B per partition per transfer
    good = make_scale_kernel(2048)  # 4 KiB per partition
    a_bad, p_bad = analyse(bad, x)
    f = a_bad.finding("dma_efficiency")
    assert f is not None, a_bad.text
    assert f["metrics"]["transfers"] == 2 * 128  # 128 loads + 128 stores, all of 128 B/partition
    found = lines(f)
    assert sorted(found) == sorted((os.path.basename(P.__file__), n) for n in P.defect_lines(bad))  # load, store
    assert "128 B/partition" in " ".join(l["note"] for l in f["lines"])
    assert f["saving_ns"] > 0
    a_good, p_good = analyse(good, x)
    assert a_good.finding("dma_efficiency") is None, a_good.text
    assert p_good.total_time_ns < p_bad.total_time_ns


# --------------------------------------------------------------------------------------------------
# 2. Redundant DMA: the same weights loaded in every iteration of an outer loop
# --------------------------------------------------------------------------------------------------

OUTER = 4


# add_bias_reloading / add_bias_hoisted: the redundant-load pair of examples/defects/pairs.py


def test_redundant_loads_are_counted_at_their_line_and_hoisting_helps():
    x = np.zeros((128 * OUTER, 2048), BF16)
    w = np.zeros((128, 2048), BF16)
    a_bad, p_bad = analyse(add_bias_reloading, x, w)
    f = a_bad.finding("redundant_dma")
    assert f is not None, a_bad.text
    assert f["metrics"]["times_loaded"] == OUTER
    # (OUTER - 1) reloads of the whole weight tensor, nothing else
    assert f["metrics"]["reload_bytes"] == (OUTER - 1) * w.nbytes
    assert lines(f) == [(os.path.basename(P.__file__), line_of(add_bias_reloading, "# DEFECT"))]
    assert "loaded up to 4 times" in f["lines"][0]["note"]
    a_good, p_good = analyse(add_bias_hoisted, x, w)
    assert a_good.finding("redundant_dma") is None, a_good.text
    assert p_good.total_time_ns < p_bad.total_time_ns


@nki.jit
def load_in_32_byte_pieces(x):
    """Every byte of x loaded exactly once, 8 fp32 (32 B) per partition per transfer."""
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    for j in nl.affine_range(x.shape[1] // 8):
        t = nl.ndarray((128, 8), x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x[:, j * 8:(j + 1) * 8])
        nisa.dma_copy(dst=out[:, j * 8:(j + 1) * 8], src=t)
    return out


@nki.jit
def reload_row_8x(g):
    """A 1-D weight (2048 fp32, one partition) loaded 8 times: one transfer each, 8 loads."""
    out = nl.ndarray((8, g.shape[0]), g.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(8):
        t = nl.ndarray((1, g.shape[0]), g.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=g.reshape((1, g.shape[0])))  # ROW
        nisa.dma_copy(dst=out[i:i + 1, :], src=t)
    return out


def test_no_false_reloads():
    """Reloads are bytes an earlier transfer loaded: two transfers sharing a 64 B chunk reload nothing
    (was "50% of HBM reads redundant"), and one transfer reading a 1-D tensor as one-element rows is one
    load of each byte (a kernel that reloads 8x was reported as more)."""
    a, _ = analyse(load_in_32_byte_pieces, np.zeros((128, 256), np.float32))
    assert a.finding("redundant_dma") is None, a.text
    g = np.zeros(2048, np.float32)
    a, prof = analyse(reload_row_8x, g)
    f = a.finding("redundant_dma")
    assert f is not None, a.text
    assert f["metrics"]["times_loaded"] == 8 and f["metrics"]["reload_bytes"] == 7 * g.nbytes
    assert lines(f) == [here(line_of(reload_row_8x, "# ROW"))]
    # the 8 KiB row is one contiguous buffer: one descriptor per load, not one per element
    assert prof.stat("dma.descriptor_count") == 16


# --------------------------------------------------------------------------------------------------
# 3. PE under-fill: matmuls with a 32-column moving tile
# --------------------------------------------------------------------------------------------------


def make_matmul(ncols):
    @nki.jit
    def mm(a_t, b):
        k, m = a_t.shape
        _, n = b.shape
        out = nl.ndarray((m, n), nl.float32, buffer=nl.shared_hbm)
        st = nl.ndarray((128, 128), a_t.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=st, src=a_t)
        mv = nl.ndarray((128, n), b.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=mv, src=b)
        res = nl.ndarray((128, n), nl.float32, buffer=nl.sbuf)
        for j in nl.affine_range(n // 512):
            ps = nl.ndarray((128, 512), nl.float32, buffer=nl.psum)
            for c in nl.affine_range(512 // ncols):
                lo = j * 512 + c * ncols
                nisa.nc_matmul(dst=ps[:, c * ncols:(c + 1) * ncols], stationary=st, moving=mv[:, lo:lo + ncols])  # MM
            nisa.tensor_copy(dst=res[:, j * 512:(j + 1) * 512], src=ps)
        nisa.dma_copy(dst=out, src=res)
        return out
    return mm


def test_narrow_moving_tiles_are_found_and_512_columns_are_faster():
    a_t = np.zeros((128, 128), BF16)
    b = np.zeros((128, 4096), BF16)
    bad, good = make_matmul(32), make_matmul(512)
    a_bad, p_bad = analyse(bad, a_t, b)
    f = a_bad.finding("pe_underfill")
    assert f is not None, a_bad.text
    assert f["metrics"]["matmuls"] == 4096 // 32
    assert lines(f) == [here(line_of(bad, "# MM"))]
    assert "N=32" in f["lines"][0]["note"]
    a_good, p_good = analyse(good, a_t, b)
    assert a_good.finding("pe_underfill") is None, a_good.text
    assert p_good.total_time_ns < p_bad.total_time_ns
    # the fix removes about what the finding estimated (within a factor of 2)
    saved = p_bad.total_time_ns - p_good.total_time_ns
    assert 0.5 * f["saving_ns"] <= saved <= 2.0 * f["saving_ns"], (saved, f["saving_ns"])


def test_fp32_matmuls_are_reported():
    a_t = np.zeros((128, 128), np.float32)
    b = np.zeros((128, 2048), np.float32)
    a, _ = analyse(make_matmul(512), a_t, b)
    f = a.finding("fp32_matmul")
    assert f is not None, a.text
    assert f["metrics"]["matmuls"] == 4


# --------------------------------------------------------------------------------------------------
# 4. A softmax whose Vector engine is the bottleneck (its element-wise ops pinned to VectorE with
#    engine=: without it the compiler model spreads them over the engines)
# --------------------------------------------------------------------------------------------------


@nki.jit
def softmax_on_vector(x):
    n, f = x.shape
    out = nl.ndarray((n, f), x.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(n // 128):
        xt = nl.ndarray((128, f), x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=xt, src=x[i * 128:(i + 1) * 128, :])
        x32 = nl.ndarray((128, f), nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=x32, src=xt, engine=nisa.vector_engine)  # VEC-CAST
        mx = nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=mx, op=nl.maximum, data=x32, axis=1)  # VEC-MAX
        d = nl.ndarray((128, f), nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=d, data=x32, op0=nl.subtract, operand0=mx, engine=nisa.vector_engine)  # VEC-SUB
        e = nl.ndarray((128, f), nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=e, op=nl.exp, data=d)
        s = nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=s, op=nl.add, data=e, axis=1)  # VEC-SUM
        r = nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf)
        nisa.reciprocal(dst=r, data=s)
        y = nl.ndarray((128, f), x.dtype, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=y, data=e, op0=nl.multiply, operand0=r, engine=nisa.vector_engine)  # VEC-MUL
        nisa.dma_copy(dst=out[i * 128:(i + 1) * 128, :], src=y)
    return out


softmax_balanced = P.softmax_fused  # exp+sum and the scale in ScalarE activations (examples/defects)


def test_vector_bound_softmax_is_found_and_balancing_engines_helps():
    x = np.zeros((512, 2048), BF16)
    a_bad, p_bad = analyse(softmax_on_vector, x)
    assert a_bad.bottleneck == "vector", a_bad.text
    f = a_bad.finding("engine_bound")
    assert f is not None and f["title"].startswith("vector engine is the bottleneck"), a_bad.text
    markers = ("# VEC-CAST", "# VEC-MAX", "# VEC-SUB", "# VEC-SUM", "# VEC-MUL")
    vec_lines = {here(line_of(softmax_on_vector, m)) for m in markers}
    assert set(lines(f)[:5]) == vec_lines  # the five full passes over the tile, before the reciprocal
    # saving = vector busy - the next resource bound (the dependency chain runs through the vector ops
    # and would shrink with them), less what the defect findings on VectorE claim: here the row sum of
    # the exp in a separate pass (split_reduce, on the VEC-SUM line) and the subtraction the exp could do
    # with bias= (fold_into_activation, on the VEC-SUB line)
    second = sorted(v for k, v in a_bad.bounds.items() if k != "dependencies")[-2]
    split = a_bad.finding("split_reduce")
    assert split is not None and lines(split) == [here(line_of(softmax_on_vector, "# VEC-SUM"))], a_bad.text
    fold = a_bad.finding("fold_into_activation")
    assert fold is not None and lines(fold) == [here(line_of(softmax_on_vector, "# VEC-SUB"))], a_bad.text
    np.testing.assert_allclose(f["saving_ns"], a_bad.bounds["vector"] - second - split["saving_ns"] - fold["saving_ns"],
                               rtol=1e-6)
    a_good, p_good = analyse(softmax_balanced, x)
    eb = a_good.finding("engine_bound")
    assert eb is None or not eb["title"].startswith("vector"), a_good.text
    assert a_good.bottleneck != "vector"
    assert p_good.total_time_ns < p_bad.total_time_ns
    # the numbers agree with the two runs
    np.testing.assert_allclose(a_bad.total_time_ns, p_bad.total_time_ns, rtol=1e-9)
    np.testing.assert_allclose(a_bad.bounds["vector"], p_bad.stat("engine.vector.busy_time"), rtol=1e-9)


# --------------------------------------------------------------------------------------------------
# CLI and JSON
# --------------------------------------------------------------------------------------------------


def test_cli_analyze_prints_the_report_and_writes_json(nsim_bin, examples_dir, tmp_path):
    kernel = os.path.join(examples_dir, "flash_attention.json")
    out = tmp_path / "report.json"
    r = subprocess.run([nsim_bin, "analyze", kernel, "--json", str(out), "--lines", "2"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    for section in ("Bounds", "Critical path", "Idle time per engine", "Findings"):
        assert section in r.stdout
    data = json.loads(out.read_text())
    assert data["kernel"] == "flash_attention" and data["config"] == "trn2"
    # the verdict: the largest resource bound, or latency when it is busy under half the time (then the
    # dependency chain is what the report points at)
    resources = [b for b in data["bounds"] if b["name"] != "dependencies"]
    top = resources[0]
    assert data["top_share_percent"] == pytest.approx(100 * top["ns"] / data["total_time_ns"], rel=1e-3)
    assert data["bottleneck"] == ("latency" if data["top_share_percent"] < 50 else top["name"])
    # largest saving first, the defects before the serialization symptom
    savings = [f["saving_ns"] for f in data["findings"] if f["kind"] != "serialization"]
    assert savings == sorted(savings, reverse=True) and data["findings"]
    kinds = [f["kind"] for f in data["findings"]]
    assert "serialization" not in kinds or kinds.index("serialization") == len(kinds) - 1
    for f in data["findings"]:
        assert f["kind"] in {"dma_efficiency", "redundant_dma", "pe_underfill", "fp32_matmul", "pe_transpose",
                             "engine_bound", "serialization"}
        assert f["lines"] and all(l["file"].endswith("gen_examples.py") and l["line"] > 0 for l in f["lines"])
    # the same report as the Python API
    a = nsim.analyze(kernel)
    assert a.data["findings"] == data["findings"] and a.data["bounds"] == data["bounds"]
    # --json - prints only the JSON
    r = subprocess.run([nsim_bin, "analyze", kernel, "--json", "-"], capture_output=True, text=True)
    assert r.returncode == 0 and json.loads(r.stdout)["total_time_ns"] == data["total_time_ns"]
    # every engine's time is busy + waited + blocked + idle at the end (TensorE included, whose
    # LoadStationary pipe issues under matmuls), and the waits are attributed in full
    for e in data["idle"]:
        assert e["busy_ns"] + e["wait_ns"] + e["other_wait_ns"] + e["tail_ns"] == pytest.approx(data["total_time_ns"])
        assert sum(e["waited_on"].values()) == pytest.approx(e["wait_ns"])
    # the critical path accounts for the whole kernel time
    assert sum(data["critical_path"]["by_track"].values()) == pytest.approx(data["total_time_ns"], rel=1e-9)


@pytest.mark.parametrize("args, code", [
    (["analyze"], "NSIM-E414"),                                   # no kernel
    (["analyze", "/nonexistent/k.json"], "NSIM-E4"),              # cannot open
    (["analyze", "{kernel}", "--config", "trn9"], "NSIM-E1"),     # unknown preset
    (["analyze", "{kernel}", "-p", "analysis.min_saving_percent=abc"], "NSIM-E1"),  # bad config value
    (["analyze", "{kernel}", "--lines", "-3"], "NSIM-E414"),
])
def test_cli_analyze_bad_input_exits_2(nsim_bin, examples_dir, args, code):
    kernel = os.path.join(examples_dir, "softmax_2x128x512.json")
    r = subprocess.run([nsim_bin] + [a.format(kernel=kernel) for a in args], capture_output=True, text=True)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.startswith(code), r.stderr


def test_malformed_kernel_raises_nsim_error():
    with pytest.raises(nsim.NsimError) as e:
        nsim.analyze('{"nsim_kernel": 1, "name": "k", "tensors": [], "body": [{"op": "frobnicate"}]}')
    assert e.value.code.startswith("NSIM-E4")


def test_thresholds_come_from_the_config():
    """Raising the efficient DMA size makes 4 KiB-per-partition transfers 'small'."""
    x = np.zeros((128, 8192), BF16)
    k = make_scale_kernel(2048).to_json(x)
    assert nsim.analyze(k).finding("dma_efficiency") is None
    a = nsim.analyze(k, overrides={"analysis.dma_efficient_bytes_per_partition": "8KiB",
                                   "analysis.min_saving_percent": 0})
    f = a.finding("dma_efficiency")
    assert f is not None and f["metrics"]["efficient_bytes_per_partition"] == 8192


def test_beyond_the_record_limit_the_critical_path_is_skipped_but_the_rest_reported(examples_dir):
    kernel = os.path.join(examples_dir, "flash_attention.json")
    full = nsim.analyze(kernel)
    cut = nsim.analyze(kernel, overrides={"analysis.max_recorded_instructions": 10})
    assert full.data["critical_path"]["available"] and not cut.data["critical_path"]["available"]
    assert "Critical path: not computed" in cut.text
    assert cut.bounds == full.bounds
    assert {f["kind"] for f in cut.findings} >= {"serialization", "pe_transpose"}


# --------------------------------------------------------------------------------------------------
# 5. Element-wise ops without engine=: the compiler model spreads them over VectorE and GpSimd
# --------------------------------------------------------------------------------------------------


@nki.jit
def many_adds(a, b):
    out = nl.ndarray((128, 32 * 1000), a.dtype, buffer=nl.shared_hbm)
    ta = nl.ndarray((128, 32), a.dtype, buffer=nl.sbuf)
    tb = nl.ndarray((128, 32), a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=ta, src=a)
    nisa.dma_copy(dst=tb, src=b)
    y = nl.ndarray((128, 32 * 1000), a.dtype, buffer=nl.sbuf)
    for i in nl.affine_range(1000):
        nisa.tensor_tensor(dst=y[:, i * 32:(i + 1) * 32], data1=ta, data2=tb, op=nl.add)  # ADD
    nisa.dma_copy(dst=out, src=y)
    return out


def test_engine_free_elementwise_ops_keep_vector_and_gpsimd_busy():
    a = np.zeros((128, 32), np.float32)
    an, prof = analyse(many_adds, a, a)
    vec, gps = prof.stat("engine.vector.instruction_count"), prof.stat("engine.gpsimd.instruction_count")
    assert vec >= 300 and gps >= 300, an.text
    f = an.finding("engine_bound")
    assert f is None or not f["title"].startswith("vector engine is the bottleneck"), an.text
    # Pinned to VectorE (engine=), all 1,000 adds (64 cycles each at 0.96 GHz: 66.7 us) queue on it;
    # spread, the busier of the two engines carries well under 70% of that, and the kernel is faster.
    _, pinned = kernel_with_engine(a)
    assert pinned.stat("engine.gpsimd.instruction_count") == 0
    busiest = max(prof.stat("engine.vector.busy_time"), prof.stat("engine.gpsimd.busy_time"))
    assert busiest < 0.7 * pinned.stat("engine.vector.busy_time")
    assert pinned.total_time_ns > prof.total_time_ns + 0.25 * pinned.stat("engine.vector.busy_time")


def kernel_with_engine(a):
    @nki.jit
    def many_adds_on_vector(a, b):
        out = nl.ndarray((128, 32 * 1000), a.dtype, buffer=nl.shared_hbm)
        ta = nl.ndarray((128, 32), a.dtype, buffer=nl.sbuf)
        tb = nl.ndarray((128, 32), a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=ta, src=a)
        nisa.dma_copy(dst=tb, src=b)
        y = nl.ndarray((128, 32 * 1000), a.dtype, buffer=nl.sbuf)
        for i in nl.affine_range(1000):
            nisa.tensor_tensor(dst=y[:, i * 32:(i + 1) * 32], data1=ta, data2=tb, op=nl.add,
                               engine=nisa.vector_engine)
        nisa.dma_copy(dst=out, src=y)
        return out

    return analyse(many_adds_on_vector, a, a)


@nki.jit
def tensor_heavy_transposing(lhsT, rhs, tiles):
    # 256 full bf16 matmuls (512 cycles each) and 64 PE transposes of [128, 128] tiles (128 cycles each):
    # the transposes are 64 x 128 / (256 x 512 + 64 x 128) = 5.9 % of TensorE's busy time, under
    # analysis.transpose_share_percent (no pe_transpose finding), so engine_bound names them. (Each transposes
    # another tile: 64 transposes of one tile would be recomputed_value's.)
    out = nl.ndarray((128, 512), nl.float32, buffer=nl.shared_hbm)
    lt = nl.ndarray((128, 128), lhsT.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=lt, src=lhsT)
    rt = nl.ndarray((128, 512), rhs.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=rt, src=rhs)
    ps = nl.ndarray((128, 512), nl.float32, buffer=nl.psum)
    for i in nl.sequential_range(256):
        nisa.nc_matmul(dst=ps, stationary=lt, moving=rt, accumulate=True)
    tt = nl.ndarray((128, 64 * 128), tiles.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=tt, src=tiles)
    for i in nl.sequential_range(64):
        tp = nl.ndarray((128, 128), lhsT.dtype, buffer=nl.psum)
        nisa.nc_transpose(dst=tp, data=tt[:, i * 128:(i + 1) * 128])
    res = nl.ndarray((128, 512), nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=res, src=ps)
    nisa.dma_copy(dst=out, src=res)
    return out


def test_engine_advice_fits_the_engine():
    """The engine-bound advice names that engine's knobs: TensorE gets PE-array advice (dtypes, tile
    shapes, transposes), not ScalarE activations or VectorE modes; VectorE gets engine placement."""
    a, _ = analyse(tensor_heavy_transposing, np.zeros((128, 128), BF16), np.zeros((128, 512), BF16),
                   np.zeros((128, 64 * 128), BF16))
    assert a.bottleneck == "tensor", a.text
    f = a.finding("engine_bound")
    assert f is not None and f["title"].startswith("tensor engine"), a.text
    assert "PE array" in f["detail"] and "fp32" in f["detail"] and "transposes" in f["detail"]
    assert "VectorE's 2x/4x" not in f["detail"] and "activation" not in f["detail"]
    # What it may save is TensorE's busy time above its useful work (the matmuls' FLOPs at peak): the
    # transposes, not the next bound's distance
    m = dict(f["metrics"])
    assert a.data["tensor_useful_ns"] == pytest.approx(m["useful_ns"])
    assert f["saving_ns"] <= m["busy_ns"] - m["useful_ns"] + 1e-2 < m["busy_ns"] - m["next_bound_ns"]
    v, _ = analyse(softmax_on_vector, np.zeros((512, 2048), BF16))
    fv = v.finding("engine_bound")
    assert "engine=" in fv["detail"] and "GpSimd" in fv["detail"] and "PE array" not in fv["detail"]



def test_reloads_of_a_tensor_bound_kernel_save_no_more_than_the_tensor_engine_leaves():
    """Dropping reloads cannot make a kernel faster than its busiest compute engine. The NKI matmul tutorial's third
    step (free dimension blocked; examples/matmul_tutorial) at lhsT [4096, 2048] x rhs [4096, 4096] bf16 is
    TensorE-bound and still reloads its operands: `redundant_dma` estimates at most its time above TensorE's busy
    time (520 us before that limit), and the fourth step, which drops the reloads, saves about that (122 us)."""
    from conftest import EXAMPLES_DIR, beta1_modules
    with beta1_modules(os.path.join(EXAMPLES_DIR, "matmul_tutorial", "matmul_tutorial_kernels.py")) as (mod,):
        pass  # the kernels keep working once the compat aliases are gone
    lhsT = np.zeros((4096, 2048), BF16)
    rhs = np.zeros((4096, 4096), BF16)
    a, before = analyse(mod.nki_matmul_block_free_dimension_, lhsT, rhs)
    _, after = analyse(mod.nki_matmul_fully_optimized_, lhsT, rhs)
    assert a.bottleneck == "tensor", a.text
    f = a.finding("redundant_dma")
    assert f is not None
    assert f["saving_ns"] <= a.total_time_ns - a.bounds["tensor"] + 1e-2
    saved = before.total_time_ns - after.total_time_ns
    assert saved > 0 and saved / 2 <= f["saving_ns"] <= 2 * saved, (f["saving_ns"], saved)
    # TensorE's useful work is most of its busy time here, and all but 0.5 % in the fourth step
    b = after.analyze()
    assert b.data["tensor_useful_ns"] >= 0.99 * b.bounds["tensor"] and b.finding("engine_bound") is None, b.text
    assert "the matmuls fill the array" in b.text


def _vector_chain(dtype, gpsimd_every=0):
    """32 dependent tensor_scalar passes over one [128, 512] tile on VectorE (every ``gpsimd_every``-th a
    tensor_tensor pinned to GpSimd instead: a GpSimd tensor_scalar runs rsqrt only): a kernel whose time is its
    dependency chain."""

    @nki.jit
    def vector_chain(x):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray((128, 512), dtype, buffer=nl.sbuf)
        half = nl.ndarray((128, 512), dtype, buffer=nl.sbuf)
        nisa.memset(dst=half, value=0.5)
        nisa.dma_copy(dst=t, src=x)
        for i in range(32):
            if gpsimd_every and i % gpsimd_every == 1:
                nisa.tensor_tensor(dst=t, data1=t, data2=half, op=nl.multiply, engine=nisa.gpsimd_engine)  # CHAIN
            else:
                nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=0.5, op1=nl.add, operand1=1.0,
                                   engine=nisa.vector_engine)  # CHAIN
        nisa.dma_copy(dst=out, src=t)
        return out

    return vector_chain


def test_engine_bound_on_a_dependency_chain_says_to_shorten_the_chain():
    """VectorE the busiest engine, but the kernel is one dependency chain through its instructions (longer than
    its busy time): the engine_bound advice says the kernel waits on the chain, which only faster or fewer
    instructions shorten (moving work helps only to an engine that runs it faster) — as the runs show: bf16
    operands (VectorE's faster modes) save a third; half the passes moved to GpSimd (as tensor_tensor: a GpSimd
    tensor_scalar runs rsqrt only), which runs them slower, lengthen the chain."""
    x = np.zeros((128, 512), np.float32)
    a, p = analyse(_vector_chain(nl.float32), x)
    assert a.bottleneck == "vector", a.text
    f = a.finding("engine_bound")
    assert f is not None and f["title"].startswith("vector engine"), a.text
    m = dict(f["metrics"])
    assert m["dependency_chain_ns"] == pytest.approx(a.bounds["dependencies"]) and m["dependency_chain_ns"] > m["busy_ns"]
    assert "waits on the chain" in f["detail"] and "pin some tensor_tensor" not in f["detail"], f["detail"]
    _, moved = analyse(_vector_chain(nl.float32, gpsimd_every=2), x)
    _, faster = analyse(_vector_chain(nl.bfloat16), x.astype(BF16))
    assert faster.total_time_ns < p.total_time_ns < moved.total_time_ns
    assert faster.total_time_ns < 0.8 * p.total_time_ns
    # a kernel of independent tiles keeps the placement advice (test_engine_advice_fits_the_engine)
    v, _ = analyse(softmax_on_vector, np.zeros((512, 2048), BF16))
    assert "waits on the chain" not in v.finding("engine_bound")["detail"]


def _transposing(onchip):
    @nki.jit
    def transposing(x, w):
        # 64 PE transposes of a [128, 128] bf16 tile, each followed by a matmul using it. The tile is loaded from HBM
        # as stored (onchip=False: a transposed load would do), or computed on chip first (onchip=True: exp of the
        # load, as attention's probabilities; only the PE array changes its layout).
        out = nl.ndarray((128, 512), nl.float32, buffer=nl.shared_hbm)
        xt = nl.ndarray((128, 128), x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=xt, src=x)
        wt = nl.ndarray((128, 512), w.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=wt, src=w)
        src = xt
        if onchip:
            src = nl.ndarray((128, 128), x.dtype, buffer=nl.sbuf)
            nisa.activation(dst=src, op=nl.exp, data=xt)
        ps = nl.ndarray((128, 512), nl.float32, buffer=nl.psum)
        for i in nl.sequential_range(64):
            tp = nl.ndarray((128, 128), x.dtype, buffer=nl.psum)
            nisa.nc_transpose(dst=tp, data=src)
            ts = nl.ndarray((128, 128), x.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=ts, src=tp)
            nisa.nc_matmul(dst=ps, stationary=ts, moving=wt, accumulate=True)
        res = nl.ndarray((128, 512), nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=res, src=ps)
        nisa.dma_copy(dst=out, src=res)
        return out
    return transposing


def test_pe_transposes_of_tiles_computed_on_chip_are_not_a_finding():
    """pe_transpose advises a transposed load (dma_transpose, a transposed access pattern): right for a tile loaded
    from HBM as stored, impossible for one computed on chip (attention's probabilities), where following it made the
    kernel slower (an analyzer audit: dma_transpose of P through SBUF, 115.8 -> 187.5 us). The transposes of a
    computed tile are left out of the finding (and of its re-simulation) and counted in its metrics."""
    x, w = np.zeros((128, 128), BF16), np.zeros((128, 512), BF16)
    a, _ = analyse(_transposing(False), x, w)
    f = a.finding("pe_transpose")
    assert f is not None and f["metrics"]["transposes"] == 64 and f["metrics"]["onchip_transposes"] == 0, a.text
    assert "transposed" in f["detail"]
    b, _ = analyse(_transposing(True), x, w)
    assert b.finding("pe_transpose") is None, b.text


@nki.jit
def rows_one_at_a_time(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    for t in nl.affine_range(x.shape[0] // 128):
        buf = nl.ndarray((128, x.shape[1]), dtype=x.dtype, buffer=nl.sbuf)
        for r in nl.affine_range(128):
            nisa.dma_copy(dst=buf[r:r + 1, :], src=x[t * 128 + r:t * 128 + r + 1, :])  # ROW
        nisa.dma_copy(dst=out[t * 128:(t + 1) * 128, :], src=buf)
    return out


@nki.jit
def rows_as_tiles(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    for t in nl.affine_range(x.shape[0] // 128):
        buf = nl.ndarray((128, x.shape[1]), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=buf, src=x[t * 128:(t + 1) * 128, :])
        nisa.dma_copy(dst=out[t * 128:(t + 1) * 128, :], src=buf)
    return out


@nki.jit
def quarter_tiles(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    for t in nl.affine_range(x.shape[0] // 32):
        buf = nl.ndarray((32, x.shape[1]), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=buf, src=x[t * 32:(t + 1) * 32, :])
        nisa.dma_copy(dst=out[t * 32:(t + 1) * 32, :], src=buf)
    return out


def test_narrow_transfers_of_32_partitions_are_estimated_by_their_idle_engines():
    """Tiles of 32 of the 128 partitions (an audit's pair, 2026-12-06): every transfer lands on the same 4 of the 16
    DMA engines (dma.partitions_per_engine = 8), so the others stay idle. dma_efficiency counted only the setups
    (estimate 0.11x of the saving) and its title said "a few partitions (one row at a time)"; it now counts the
    confined engines' time above what all of them take, and gives the partitions. The fix, [128, n] tiles, moves
    the same rows in a quarter as many transfers (rows_as_tiles)."""
    x = np.zeros((1024, 1024), np.float32)
    a, prof = analyse(quarter_tiles, x)
    _, fixed = analyse(rows_as_tiles, x)
    f = a.finding("dma_efficiency")
    assert f is not None and f["metrics"]["narrow_transfers"] == 64, a.text
    assert "each move 32 partitions or fewer of 128" in f["title"], f["title"]
    actual = prof.total_time_ns - fixed.total_time_ns
    assert actual / 2 <= f["saving_ns"] <= 2 * actual, (f["saving_ns"], actual)


def test_rows_loaded_one_dma_at_a_time_are_a_dma_efficiency_finding():
    """1024 rows of 4 KiB loaded one DMA each (t[r:r + 1, :]): 4 KiB per partition passes the bytes-per-partition
    test, but each transfer keeps 15 of the 16 DMA engines idle and pays a queue setup; an analyzer audit found no
    finding naming them (the top one said the Sync engine). dma_efficiency names the row line, first, and its
    estimate is within 2x of what loading each tile in one transfer saves (the same bytes, 8 + 8 transfers)."""
    x = np.zeros((1024, 1024), np.float32)
    a, prof = analyse(rows_one_at_a_time, x)
    _, fixed = analyse(rows_as_tiles, x)
    f = a.finding("dma_efficiency")
    assert f is not None and f["metrics"]["narrow_transfers"] == 1024, a.text
    assert a.findings[0]["kind"] == "dma_efficiency", a.text
    assert "each move one partition (one row at a time)" in f["title"], f["title"]
    assert lines(f)[0] == here(line_of(rows_one_at_a_time, "# ROW")), f["lines"]
    actual = prof.total_time_ns - fixed.total_time_ns
    assert actual / 2 <= f["saving_ns"] <= 2 * actual, (f["saving_ns"], actual)


def _attention_pair(b1):
    """Naive attention (scores and probabilities through HBM) and the same with each query tile's score row kept in
    SBUF (an analyzer audit's pair, Beta 1): qT, kT [d, S], v [S, d]."""
    bnki, bnl, bnisa = b1

    def naive(qT, kT, v):
        d, S = qT.shape
        out = bnl.ndarray((S, d), dtype=qT.dtype, buffer=bnl.shared_hbm)
        scores = bnl.ndarray((S, S), dtype=bnl.float32, buffer=bnl.shared_hbm)
        probs = bnl.ndarray((S, S), dtype=qT.dtype, buffer=bnl.shared_hbm)
        kT_sb = bnl.load(kT)
        v_sb = bnl.ndarray((S // 128, bnl.par_dim(128), d), dtype=v.dtype, buffer=bnl.sbuf)
        for j in bnl.affine_range(S // 128):
            v_sb[j] = bnl.load(v[j * 128:(j + 1) * 128, :])
        for i in bnl.affine_range(S // 128):
            q_t = bnl.load(qT[:, i * 128:(i + 1) * 128])
            for j in bnl.affine_range(S // 512):
                s_sb = bnl.multiply(bnisa.nc_matmul(q_t, kT_sb[:, j * 512:(j + 1) * 512]), 1.0 / np.sqrt(d),
                                    dtype=bnl.float32)
                bnl.store(scores[i * 128:(i + 1) * 128, j * 512:(j + 1) * 512], value=s_sb)
        for i in bnl.affine_range(S // 128):
            s_row = bnl.load(scores[i * 128:(i + 1) * 128, :])
            mx = bnisa.tensor_reduce(np.max, s_row, axis=(1,), negate=True)
            ssum = bnl.ndarray((128, 1), dtype=bnl.float32, buffer=bnl.sbuf)
            e = bnisa.activation_reduce(op=bnl.exp, data=s_row, bias=mx, reduce_op=np.add, reduce_res=ssum,
                                        dtype=bnl.float32)
            bnl.store(probs[i * 128:(i + 1) * 128, :], value=bnl.multiply(e, bnl.reciprocal(ssum), dtype=qT.dtype))
        for i in bnl.affine_range(S // 128):
            p_row = bnl.load(probs[i * 128:(i + 1) * 128, :])
            o_ps = bnl.zeros((128, d), bnl.float32, buffer=bnl.psum)
            for j in bnl.affine_range(S // 128):
                pT = bnl.copy(bnisa.nc_transpose(p_row[:, j * 128:(j + 1) * 128]), dtype=qT.dtype)
                o_ps += bnisa.nc_matmul(pT, v_sb[j])
            bnl.store(out[i * 128:(i + 1) * 128, :], value=bnl.copy(o_ps, dtype=qT.dtype))
        return out

    def fused(qT, kT, v):
        d, S = qT.shape
        out = bnl.ndarray((S, d), dtype=qT.dtype, buffer=bnl.shared_hbm)
        kT_sb = bnl.load(kT)
        v_sb = bnl.ndarray((S // 128, bnl.par_dim(128), d), dtype=v.dtype, buffer=bnl.sbuf)
        for j in bnl.affine_range(S // 128):
            v_sb[j] = bnl.load(v[j * 128:(j + 1) * 128, :])
        for i in bnl.affine_range(S // 128):
            q_t = bnl.load(qT[:, i * 128:(i + 1) * 128])
            s_row = bnl.ndarray((128, S), dtype=bnl.float32, buffer=bnl.sbuf)
            for j in bnl.affine_range(S // 512):
                s_row[:, j * 512:(j + 1) * 512] = bnl.multiply(bnisa.nc_matmul(q_t, kT_sb[:, j * 512:(j + 1) * 512]),
                                                               1.0 / np.sqrt(d), dtype=bnl.float32)
            mx = bnisa.tensor_reduce(np.max, s_row, axis=(1,), negate=True)
            ssum = bnl.ndarray((128, 1), dtype=bnl.float32, buffer=bnl.sbuf)
            e = bnisa.activation_reduce(op=bnl.exp, data=s_row, bias=mx, reduce_op=np.add, reduce_res=ssum,
                                        dtype=bnl.float32)
            p_row = bnl.multiply(e, bnl.reciprocal(ssum), dtype=qT.dtype)
            o_ps = bnl.zeros((128, d), bnl.float32, buffer=bnl.psum)
            for j in bnl.affine_range(S // 128):
                pT = bnl.copy(bnisa.nc_transpose(p_row[:, j * 128:(j + 1) * 128]), dtype=qT.dtype)
                o_ps += bnisa.nc_matmul(pT, v_sb[j])
            bnl.store(out[i * 128:(i + 1) * 128, :], value=bnl.copy(o_ps, dtype=qT.dtype))
        return out

    return bnki.jit(naive), bnki.jit(fused)


def test_hbm_roundtrip_saving_leaves_the_compute(b1):
    """Keeping attention's scores on chip makes the kernel no faster than its busiest compute engine: the
    hbm_roundtrip estimate is capped at total - that bound (it was 2 x the bytes at the HBM roof, 2.4x the measured
    saving at S = 2048 in an audit); within 2x of what the fused kernel saves."""
    naive, fused = _attention_pair(b1)
    S, d = 2048, 128
    rng = np.random.default_rng(0)
    args = tuple(a.astype(BF16) for a in (rng.standard_normal((d, S)), rng.standard_normal((d, S)),
                                          rng.standard_normal((S, d))))
    _, pn = naive.options(timing_only=True).simulate(*args)
    _, pf = fused.options(timing_only=True).simulate(*args)
    a = pn.analyze()
    f = a.finding("hbm_roundtrip")
    assert f is not None, a.text
    compute = max(b["ns"] for b in a.data["bounds"] if b["name"] in ("tensor", "vector", "scalar", "gpsimd"))
    assert f["saving_ns"] <= pn.total_time_ns - compute + 1e-6, (f["saving_ns"], pn.total_time_ns, compute)
    actual = pn.total_time_ns - pf.total_time_ns
    assert actual / 2 <= f["saving_ns"] <= 2 * actual, (f["saving_ns"], actual)


def _mlp_pair(b1):
    """A two-layer MLP whose hidden activation h goes to HBM and is read back transposed in 128 x 128 blocks (a 2-D
    transposed load each: a DMA transpose), and the same MLP computing h^T on chip (an analyzer audit's kernel)."""
    bnki, bnl, _bnisa = b1

    def through_hbm(xT, w1, w2):
        D, N = xT.shape
        _, F = w1.shape
        _, O = w2.shape
        out = bnl.ndarray((N, O), dtype=bnl.float32, buffer=bnl.shared_hbm)
        h_hbm = bnl.ndarray((N, F), dtype=xT.dtype, buffer=bnl.hbm)
        x_sb = bnl.load(xT)
        w1_sb = bnl.load(w1)
        w2_sb = bnl.ndarray((F // 128, bnl.par_dim(128), O), dtype=w2.dtype, buffer=bnl.sbuf)
        for f in bnl.affine_range(F // 128):
            w2_sb[f] = bnl.load(w2[f * 128:(f + 1) * 128, :])
        i_p, i_f = bnl.mgrid[0:128, 0:128]
        for n in bnl.affine_range(N // 128):
            ps = bnl.matmul(x_sb[:, n * 128:(n + 1) * 128], w1_sb, transpose_x=True)
            bnl.store(h_hbm[n * 128:(n + 1) * 128, :], value=bnl.maximum(ps, 0.0, dtype=xT.dtype))  # ROUNDTRIP
        for n in bnl.affine_range(N // 128):
            acc = bnl.zeros((128, O), bnl.float32, buffer=bnl.psum)
            for f in bnl.affine_range(F // 128):
                hT = bnl.load(h_hbm[n * 128 + i_f, f * 128 + i_p])  # TRANSPOSED
                acc += bnl.matmul(hT, w2_sb[f], transpose_x=True)
            bnl.store(out[n * 128:(n + 1) * 128, :], value=bnl.copy(acc))
        return out

    def on_chip(xT, w1, w2):
        D, N = xT.shape
        _, F = w1.shape
        _, O = w2.shape
        out = bnl.ndarray((N, O), dtype=bnl.float32, buffer=bnl.shared_hbm)
        x_sb = bnl.load(xT)
        w1_sb = bnl.load(w1)
        w2_sb = bnl.ndarray((F // 128, bnl.par_dim(128), O), dtype=w2.dtype, buffer=bnl.sbuf)
        for f in bnl.affine_range(F // 128):
            w2_sb[f] = bnl.load(w2[f * 128:(f + 1) * 128, :])
        hT = bnl.ndarray((F // 128, bnl.par_dim(128), N), dtype=xT.dtype, buffer=bnl.sbuf)
        for f in bnl.affine_range(F // 128):
            ps = bnl.matmul(w1_sb[:, f * 128:(f + 1) * 128], x_sb, transpose_x=True)
            hT[f] = bnl.maximum(ps, 0.0, dtype=xT.dtype)
        for n in bnl.affine_range(N // 128):
            acc = bnl.zeros((128, O), bnl.float32, buffer=bnl.psum)
            for f in bnl.affine_range(F // 128):
                acc += bnl.matmul(hT[f, :, n * 128:(n + 1) * 128], w2_sb[f], transpose_x=True)
            bnl.store(out[n * 128:(n + 1) * 128, :], value=bnl.copy(acc))
        return out

    return bnki.jit(through_hbm), bnki.jit(on_chip), through_hbm


def test_transposed_loads_are_not_small_transfers_and_the_roundtrip_comes_first(b1):
    """The h^T blocks read back by 2-D transposed loads are DMA transposes: they move at the transpose rate whatever
    their size, and merging them (the dma_efficiency advice for small transfers) makes one strided copy,
    descriptor-bound (16.6 -> 173.0 us in the audit that found it). They are no longer counted as small transfers;
    the first finding is the round trip through HBM, on the store, and keeping h^T on chip saves about what it
    estimates (12.06 -> 7.81 us, 2.9 us estimated)."""
    through_hbm, on_chip, src = _mlp_pair(b1)
    rng = np.random.default_rng(0)
    args = (rng.standard_normal((128, 512)).astype(BF16), (rng.standard_normal((128, 512)) / 8).astype(BF16),
            (rng.standard_normal((512, 128)) / 16).astype(BF16))
    ref = np.maximum(args[0].astype(np.float32).T @ args[1].astype(np.float32), 0)
    ref = ref.astype(BF16).astype(np.float32) @ args[2].astype(np.float32)
    out_h, ph = through_hbm.simulate(*args)
    out_c, pc = on_chip.simulate(*args)
    np.testing.assert_allclose(out_h, ref, rtol=1e-2, atol=1e-2)
    np.testing.assert_allclose(out_c, ref, rtol=1e-2, atol=1e-2)
    a = ph.analyze()
    top = a.findings[0]
    assert top["kind"] == "hbm_roundtrip", a.text
    assert here(line_of(src, "# ROUNDTRIP")) in lines(top) or here(line_of(src, "# TRANSPOSED")) in lines(top), lines(top)
    eff = a.finding("dma_efficiency")
    assert eff is None or here(line_of(src, "# TRANSPOSED")) not in lines(eff), lines(eff)
    saved = ph.total_time_ns - pc.total_time_ns
    assert saved > 0 and saved / 2 <= top["saving_ns"] <= 2 * saved, (top["saving_ns"], saved)


def test_engine_bound_on_many_tiny_instructions_names_the_scan(b1):
    """A recurrence stepped one column at a time (the Mamba tutorial's naive scan: a [128, 1] multiply-add and a
    copy per position) keeps an engine busy with instructions at its minimum cost each: the engine_bound advice
    says the time is in their number and names nisa.tensor_tensor_scan, which computes the row in one instruction
    and saves about the estimate (an analyzer audit: fusing the ALU ops, the only advice then, saved a third of it).
    The softmax whose element-wise work sits on VectorE (wide instructions) gets no such sentence."""
    bnki, bnl, bnisa = b1

    def stepwise(dA, dBx):
        c, t_len = dA.shape
        out = bnl.ndarray((c, t_len), dtype=bnl.float32, buffer=bnl.shared_hbm)
        a = bnl.load(dA)
        b = bnl.load(dBx)
        h = bnl.ndarray((128, t_len), dtype=bnl.float32, buffer=bnl.sbuf)
        state = bnl.zeros((128, 1), dtype=bnl.float32, buffer=bnl.sbuf)
        for t in bnl.sequential_range(t_len):
            state = bnl.add(bnl.multiply(state, a[:, t:t + 1]), b[:, t:t + 1])
            h[:, t:t + 1] = bnl.copy(state)
        bnl.store(out, value=h)
        return out

    def scanned(dA, dBx):
        c, t_len = dA.shape
        out = bnl.ndarray((c, t_len), dtype=bnl.float32, buffer=bnl.shared_hbm)
        h = bnisa.tensor_tensor_scan(bnl.load(dA), bnl.load(dBx), initial=0.0, op0=np.multiply, op1=np.add)
        bnl.store(out, value=h)
        return out

    rng = np.random.default_rng(0)
    a = rng.uniform(0.5, 1.0, (128, 256)).astype(np.float32)
    b = rng.standard_normal((128, 256)).astype(np.float32)
    ref = np.zeros_like(b, dtype=np.float64)
    s = np.zeros(128)
    for t in range(256):
        s = s * a[:, t] + b[:, t]
        ref[:, t] = s
    out_s, ps = bnki.jit(stepwise).simulate(a, b)
    out_c, pc = bnki.jit(scanned).simulate(a, b)
    np.testing.assert_allclose(out_s, ref, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(out_c, ref, rtol=1e-4, atol=1e-4)
    an = ps.analyze()
    f = an.finding("engine_bound")
    assert f is not None and an.findings[0]["kind"] == "engine_bound", an.text
    assert "tensor_tensor_scan" in f["detail"], f["detail"]
    assert dict(f["metrics"])["average_instruction_ns"] > 0
    saved = ps.total_time_ns - pc.total_time_ns
    assert saved / 2 <= f["saving_ns"] <= 2 * saved, (f["saving_ns"], saved)
    # wide element-wise instructions: no such sentence
    pair = next(p for p in P.PAIRS if p.kind == "engine_bound")
    _, pv = pair.before.options(timing_only=True).simulate(*pair.inputs())
    g = pv.analyze().finding("engine_bound")
    assert g is not None and "tensor_tensor_scan" not in g["detail"], g


def test_single_buffer_not_told_for_a_psum_tile_allocated_in_the_loop(b1):
    """A PSUM tile allocated inside the loop body rotates (here the unrolled loop's tiles alternate between two
    storages): a matmul that waited for an evacuation because the list scheduler issued two groups of one storage in
    a row was reported as `single_buffer`, advising to allocate the tile in the loop, where it already is (a
    newcomer's audit, 2026-12-05). A line whose groups open in more than one PSUM tile is not reported."""
    bnki, bnl, bnisa = b1

    def matmul(lhsT, rhs):
        K, M = lhsT.shape
        N = rhs.shape[1]
        result = bnl.ndarray((M, N), dtype=lhsT.dtype, buffer=bnl.shared_hbm)
        a_tiles = [[bnl.copy(bnl.load(lhsT[k * 128:(k + 1) * 128, m * 128:(m + 1) * 128]), dtype=bnl.bfloat16)
                    for m in range(M // 128)] for k in range(K // 128)]
        b_tiles = [[bnl.copy(bnl.load(rhs[k * 128:(k + 1) * 128, n * 512:(n + 1) * 512]), dtype=bnl.bfloat16)
                    for n in range(N // 512)] for k in range(K // 128)]
        for m in bnl.affine_range(M // 128):
            for n in bnl.affine_range(N // 512):
                res_psum = bnl.zeros((128, 512), bnl.float32, buffer=bnl.psum)
                for k in bnl.affine_range(K // 128):
                    res_psum += bnisa.nc_matmul(a_tiles[k][m], b_tiles[k][n])
                bnl.store(result[m * 128:(m + 1) * 128, n * 512:(n + 1) * 512], value=bnl.copy(res_psum))
        return result

    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal(s).astype(np.float32) for s in ((1024, 512), (1024, 1024)))
    _, prof = bnki.jit(matmul).options(timing_only=True).simulate(a, b)
    an = prof.analyze()
    f = an.finding("single_buffer")
    assert f is None or not f["metrics"].get("matmuls"), an.text


def _gelu_rows(hoisted_out):
    @nki.jit
    def gelu_rows(x):
        n, f = x.shape
        out = nl.ndarray((n, f), x.dtype, buffer=nl.shared_hbm)
        if hoisted_out:
            y = nl.ndarray((128, f), x.dtype, buffer=nl.sbuf)  # one output tile for every iteration
        for i in nl.affine_range(n // 128):
            xt = nl.ndarray((128, f), x.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=xt, src=x[i * 128:(i + 1) * 128, :])
            if not hoisted_out:
                y = nl.ndarray((128, f), x.dtype, buffer=nl.sbuf)
            nisa.activation(dst=y, op=nl.gelu, data=xt)  # the line waiting for the store
            nisa.dma_copy(dst=out[i * 128:(i + 1) * 128, :], src=y)
        return out
    return gelu_rows


def test_single_buffer_names_an_output_tile_a_store_still_reads():
    """An output tile allocated before the loop: each iteration's activation overwrites the tile the previous
    iteration's store is still reading (a write-after-read on the store), so compute and stores do not overlap.
    single_buffer names the activation's line (an audit of new defect pairs, 2026-12-05: before, only loads and PSUM
    matmuls were counted and `serialization` came first at a quarter of the saving); the estimate is within 2x of
    what allocating the tile in the loop saves, and the fixed kernel has no such finding."""
    import ml_dtypes
    x = np.random.default_rng(0).standard_normal((1024, 2048)).astype(ml_dtypes.bfloat16)
    bad, good = _gelu_rows(True), _gelu_rows(False)
    _, pb = bad.options(timing_only=True).simulate(x)
    _, pg = good.options(timing_only=True).simulate(x)
    saved = pb.total_time_ns - pg.total_time_ns
    assert saved > 0.3 * pb.total_time_ns
    an = pb.analyze()
    top = an.findings[0]
    assert top["kind"] == "single_buffer", an.text
    src, first = inspect.getsourcelines(_gelu_rows)
    line = first + next(i for i, t in enumerate(src) if "the line waiting for the store" in t)
    assert top["lines"][0]["line"] == line
    assert "store to finish reading their output tile" in top["lines"][0]["note"]
    assert top["metrics"]["outputs"] == 7 and top["metrics"]["loads"] == 0  # 8 iterations: the 7 after the first
    assert "output tile" in top["detail"] and "inside the loop body" in top["detail"]
    assert "SBUF cannot hold two buffers" not in top["detail"]  # (the tile is before the loop: room enough)
    assert saved / 2 <= top["saving_ns"] <= 2 * saved, (top["saving_ns"], saved)
    assert pg.analyze().finding("single_buffer") is None


def _gated_rows(hoisted):
    @nki.jit
    def scale_rows(x, g):
        n, f = x.shape
        out = nl.ndarray((n, f), x.dtype, buffer=nl.shared_hbm)
        gt = nl.ndarray((128, f), g.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=gt, src=g.broadcast(0, 128))

        def gate():  # sigmoid(g) = 1 / (1 + exp(-g)): a function of the weights alone
            ge = nl.ndarray((128, f), nl.float32, buffer=nl.sbuf)
            nisa.activation(dst=ge, op=nl.exp, data=gt, scale=-1.0)  # recomputed
            ge1 = nl.ndarray((128, f), nl.float32, buffer=nl.sbuf)
            nisa.tensor_scalar(dst=ge1, data=ge, op0=nl.add, operand0=1.0)  # recomputed
            gs = nl.ndarray((128, f), nl.float32, buffer=nl.sbuf)
            nisa.reciprocal(dst=gs, data=ge1)  # recomputed
            return gs

        if hoisted:
            gs = gate()
        for i in nl.affine_range(n // 128):
            xt = nl.ndarray((128, f), x.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=xt, src=x[i * 128:(i + 1) * 128, :])
            if not hoisted:
                gs = gate()
            y = nl.ndarray((128, f), x.dtype, buffer=nl.sbuf)
            nisa.tensor_tensor(dst=y, data1=xt, data2=gs, op=nl.multiply)
            nisa.dma_copy(dst=out[i * 128:(i + 1) * 128, :], src=y)
        return out
    return scale_rows


def test_recomputed_value_names_a_loop_invariant_made_in_every_iteration():
    """A gate computed from the weights alone (exp, add, reciprocal of one tile) inside the row loop: from the second
    iteration on, each of its three instructions recomputes its previous result from unchanged inputs. The analyzer's
    recomputed_value (since 2026-12-05; before, engine_bound on VectorE advised moving work to other engines) names
    the three lines; its estimate is within 2x of what computing the gate once before the loop saves (an audit's
    pair: 105.0 us estimated, 102.0 us saved). The hoisted kernel and the row-dependent work are not reported."""
    import ml_dtypes
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1024, 2048)).astype(ml_dtypes.bfloat16)
    g = rng.standard_normal((1, 2048)).astype(ml_dtypes.bfloat16)
    bad, good = _gated_rows(False), _gated_rows(True)
    out_b, pb = bad.simulate(x, g)
    out_g, pg = good.simulate(x, g)
    ref = x.astype(np.float64) / (1 + np.exp(-g.astype(np.float64)))
    np.testing.assert_allclose(out_b.astype(np.float64), ref, rtol=2e-2, atol=2e-2)
    np.testing.assert_array_equal(out_b, out_g)
    saved = pb.total_time_ns - pg.total_time_ns
    an = pb.analyze()
    top = an.findings[0]
    assert top["kind"] == "recomputed_value", an.text
    src, first = inspect.getsourcelines(_gated_rows)
    lines = {first + i for i, t in enumerate(src) if "# recomputed" in t}
    assert {ln["line"] for ln in top["lines"]} == lines
    assert top["metrics"]["instructions"] == 3 * 7  # 8 iterations: the 7 after the first
    assert "before the loop" in top["detail"]
    assert saved / 2 <= top["saving_ns"] <= 2 * saved, (top["saving_ns"], saved)
    assert pg.analyze().finding("recomputed_value") is None


def _masked_rows(hoisted, by):
    """exp(s + mask) over row tiles of s, the additive causal mask of a 128 x 128 diagonal block (0 where col <=
    row, -30000 above) repeated along the row: built by `by` = "iota" (iota of col - row, then a tensor_scalar) or
    "affine_select" (a memset of zeros, then affine_select, the flash attention samples' idiom), in every iteration
    or once before the loop."""
    @nki.jit
    def masked_exp(s):
        n, f = s.shape
        out = nl.ndarray((n, f), s.dtype, buffer=nl.shared_hbm)

        def mask_tile():
            if by == "iota":
                rel = nl.ndarray((128, f), nl.float32, buffer=nl.sbuf)
                nisa.iota(dst=rel, pattern=[[0, f // 128], [-1, 128]], offset=0, channel_multiplier=1)  # mask:iota
                mask = nl.ndarray((128, f), s.dtype, buffer=nl.sbuf)
                nisa.tensor_scalar(dst=mask, data=rel, op0=nl.less, operand0=0.0, op1=nl.multiply,  # mask:iota
                                   operand1=-30000.0)
                return mask
            z = nl.ndarray((128, f), s.dtype, buffer=nl.sbuf)
            nisa.memset(dst=z, value=0.0, engine=nisa.engine.gpsimd)
            mask = nl.ndarray((128, f), s.dtype, buffer=nl.sbuf)
            nisa.affine_select(dst=mask, pattern=[[0, f // 128], [-1, 128]], channel_multiplier=1,  # mask:affine_select
                               on_true_tile=z, on_false_value=-30000.0, cmp_op=nl.greater_equal)
            return mask

        if hoisted:
            mask = mask_tile()
        for i in nl.affine_range(n // 128):
            st = nl.ndarray((128, f), s.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=st, src=s[i * 128:(i + 1) * 128, :])
            if not hoisted:
                mask = mask_tile()
            sm = nl.ndarray((128, f), s.dtype, buffer=nl.sbuf)
            nisa.tensor_tensor(dst=sm, data1=st, data2=mask, op=nl.add)
            y = nl.ndarray((128, f), s.dtype, buffer=nl.sbuf)
            nisa.activation(dst=y, op=nl.exp, data=sm)
            nisa.dma_copy(dst=out[i * 128:(i + 1) * 128, :], src=y)
        return out
    return masked_exp


@pytest.mark.parametrize("by", ["iota", "affine_select"])
def test_recomputed_value_names_a_mask_built_in_every_iteration(by):
    """A loop-invariant causal mask built in every iteration of an HBM-bound row loop (an audit's pairs, 2026-12-06).
    recomputed_value names the mask's lines (the `# mask:` lines): with affine_select (memset + affine_select, GpSimd)
    it was not reported at all -- the kernel runs 1.83x its HBM bound, and the cap for a fix on one engine scaled the
    HBM bound by that too, which left total - 1.83 x HBM = 0 (only `serialization` remained); with iota the iota line,
    half the GpSimd work, was never counted (iotas were taken for accumulator resets, as memsets are). The affine_select
    estimate is within 2x of what building the mask once saves (14.7 us estimated, 16.2 us saved). The iota kernel is
    GpSimd-bound, and its estimate stays capped by the waits that bound (10.4 us against 23.0 us saved: a limit of
    the bound estimate, which assumes the waits above the bottleneck remain)."""
    import ml_dtypes
    s = (np.random.default_rng(0).standard_normal((2048, 1024)) * 0.5).astype(ml_dtypes.bfloat16)
    bad, good = _masked_rows(False, by), _masked_rows(True, by)
    out_b, pb = bad.simulate(s)
    out_g, pg = good.simulate(s)
    col = np.arange(1024)[None, :] % 128
    row = np.arange(128)[:, None]
    ref = np.exp(s.astype(np.float64) + np.tile(np.where(col <= row, 0.0, -30000.0), (16, 1)))
    np.testing.assert_allclose(out_b.astype(np.float64), ref, rtol=2e-2, atol=2e-2)
    np.testing.assert_array_equal(out_b, out_g)
    saved = pb.total_time_ns - pg.total_time_ns
    assert saved > 0.3 * pb.total_time_ns
    an = pb.analyze()
    top = an.findings[0]
    assert top["kind"] == "recomputed_value", an.text
    src, first = inspect.getsourcelines(_masked_rows)
    lines = {first + i for i, t in enumerate(src) if "# mask:" + by in t}
    assert {ln["line"] for ln in top["lines"]} == lines, an.text
    if by == "iota":
        assert saved / 2.5 <= top["saving_ns"] <= 2 * saved, (top["saving_ns"], saved)
    else:
        assert saved / 2 <= top["saving_ns"] <= 2 * saved, (top["saving_ns"], saved)
    assert pg.analyze().finding("recomputed_value") is None


def test_gpsimd_partition_reduce_advice_names_the_ones_matmul():
    """Column sums of x [2048, 2048] by GpSimd's tensor_partition_reduce per row tile, plus a running add: the kernel is
    GpSimd-bound, and the engine_bound advice named "partition work only it does" as what GpSimd is for, endorsing
    the defect; following its other advice saved 10 us where the fix, one ones-vector matmul per row tile accumulated
    in PSUM, saves 53 us (an audit, 2026-12-06). The advice now names that matmul."""
    import ml_dtypes

    @nki.jit
    def colsum(x):
        n, f = x.shape
        out = nl.ndarray((1, f), nl.float32, buffer=nl.shared_hbm)
        acc = nl.ndarray((1, f), nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=acc, value=0.0)
        for i in nl.sequential_range(n // 128):
            xt = nl.ndarray((128, f), x.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=xt, src=x[i * 128:(i + 1) * 128, :])
            cs = nl.ndarray((1, f), nl.float32, buffer=nl.sbuf)
            nisa.tensor_partition_reduce(dst=cs, op=nl.add, data=xt)
            nisa.tensor_tensor(dst=acc, data1=acc, data2=cs, op=nl.add)
        nisa.dma_copy(dst=out, src=acc)
        return out

    x = np.random.default_rng(0).standard_normal((2048, 2048)).astype(ml_dtypes.bfloat16)
    got, prof = colsum.simulate(x)
    np.testing.assert_allclose(got, x.astype(np.float64).sum(0, keepdims=True), rtol=1e-2, atol=0.5)
    an = prof.analyze()
    eb = an.finding("engine_bound")
    assert eb is not None and eb["title"].startswith("gpsimd"), an.text
    assert "tensor_partition_reduce" in eb["detail"] and "ones [128, 1] stationary" in eb["detail"], eb["detail"]
    assert "partition work only it does" not in eb["detail"]


def _k_tiled_matmul(sbuf_acc):
    """out = xT^T @ w for xT [K, M], w [K, N], K in 128-row tiles: each tile's matmul into its own PSUM tile and added
    to an SBUF accumulator on VectorE (a CPU loop's port), or all K matmuls accumulated in one PSUM tile."""
    @nki.jit
    def mm(xT, w):
        k, m = xT.shape
        _, n = w.shape
        kt = k // 128
        out = nl.ndarray((m, n), nl.float32, buffer=nl.shared_hbm)
        xs = nl.ndarray((128, kt, m), xT.dtype, buffer=nl.sbuf)
        ws = nl.ndarray((128, kt, n), w.dtype, buffer=nl.sbuf)
        for t in nl.affine_range(kt):
            nisa.dma_copy(dst=xs[:, t, :], src=xT[t * 128:(t + 1) * 128, :])
            nisa.dma_copy(dst=ws[:, t, :], src=w[t * 128:(t + 1) * 128, :])
        for i in nl.affine_range(m // 128):
            for j in nl.affine_range(n // 512):
                res = nl.ndarray((128, 512), nl.float32, buffer=nl.sbuf)
                if sbuf_acc:
                    nisa.memset(dst=res, value=0.0)
                    for t in nl.sequential_range(kt):
                        ps = nl.ndarray((128, 512), nl.float32, buffer=nl.psum)
                        nisa.nc_matmul(dst=ps, stationary=xs[:, t, i * 128:(i + 1) * 128],
                                       moving=ws[:, t, j * 512:(j + 1) * 512])
                        nisa.tensor_tensor(dst=res, data1=res, data2=ps, op=nl.add)  # PARTIALS
                else:
                    ps = nl.ndarray((128, 512), nl.float32, buffer=nl.psum)
                    for t in nl.affine_range(kt):
                        nisa.nc_matmul(dst=ps, stationary=xs[:, t, i * 128:(i + 1) * 128],
                                       moving=ws[:, t, j * 512:(j + 1) * 512])
                    nisa.tensor_copy(dst=res, src=ps)
                nisa.dma_copy(dst=out[i * 128:(i + 1) * 128, j * 512:(j + 1) * 512], src=res)
        return out
    return mm


def test_matmul_partials_summed_in_sbuf_are_a_psum_accumulation_finding():
    """K-tiled matmul partial products added into an SBUF accumulator by VectorE tensor_tensor (an audit's pair,
    2026-12-06): the kernel is VectorE-bound and engine_bound's advice never said to accumulate in PSUM.
    psum_accumulation names the add line, first, within 2x of what accumulating the K matmuls in one PSUM tile
    saves; the fixed kernel has no such finding."""
    import ml_dtypes
    rng = np.random.default_rng(1)
    xT = rng.standard_normal((1024, 512)).astype(ml_dtypes.bfloat16)
    w = rng.standard_normal((1024, 1024)).astype(ml_dtypes.bfloat16)
    bad, good = _k_tiled_matmul(True), _k_tiled_matmul(False)
    out_b, pb = bad.simulate(xT, w)
    out_g, pg = good.simulate(xT, w)
    ref = xT.astype(np.float64).T @ w.astype(np.float64)
    np.testing.assert_allclose(out_b, ref, rtol=1e-2, atol=0.1)
    np.testing.assert_allclose(out_g, ref, rtol=1e-2, atol=0.1)
    saved = pb.total_time_ns - pg.total_time_ns
    assert saved > 0.2 * pb.total_time_ns
    an = pb.analyze()
    top = an.findings[0]
    assert top["kind"] == "psum_accumulation", an.text
    src, first = inspect.getsourcelines(_k_tiled_matmul)
    assert top["lines"][0]["line"] == first + next(i for i, t in enumerate(src) if "# PARTIALS" in t)
    assert top["metrics"]["adds"] == 4 * 2 * 8  # (M / 128) x (N / 512) accumulators of K / 128 adds each
    assert "same PSUM tile" in top["detail"]
    assert saved / 2 <= top["saving_ns"] <= 2 * saved, (top["saving_ns"], saved)
    assert pg.analyze().finding("psum_accumulation") is None


def _gate_rows(inter):
    """y = relu((x * 0.5 + 1) * x) over row tiles of x (bf16), the intermediates in `inter`, pinned to VectorE."""
    @nki.jit
    def gate(x):
        n, f = x.shape
        out = nl.ndarray((n, f), x.dtype, buffer=nl.shared_hbm)
        for i in nl.affine_range(n // 128):
            xt = nl.ndarray((128, f), x.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=xt, src=x[i * 128:(i + 1) * 128, :])
            t1 = nl.ndarray((128, f), inter, buffer=nl.sbuf)
            nisa.tensor_scalar(dst=t1, data=xt, op0=nl.multiply, operand0=0.5, op1=nl.add, operand1=1.0,
                               engine=nisa.engine.vector)
            t2 = nl.ndarray((128, f), inter, buffer=nl.sbuf)
            nisa.tensor_tensor(dst=t2, data1=t1, data2=xt, op=nl.multiply, engine=nisa.engine.vector)
            y = nl.ndarray((128, f), x.dtype, buffer=nl.sbuf)
            nisa.tensor_scalar(dst=y, data=t2, op0=nl.maximum, operand0=0.0, engine=nisa.engine.vector)
            nisa.dma_copy(dst=out[i * 128:(i + 1) * 128, :], src=y)
        return out
    return gate


def test_vector_bound_on_fp32_operands_leads_with_16_bit_tiles():
    """fp32 intermediates of a VectorE-bound gate (an audit's pair, 2026-12-06): engine_bound's estimate was right,
    but its advice led with moving work off VectorE and named 16-bit operands last; bf16 intermediates save more than
    half the kernel. The advice now starts with the fp32 share of VectorE's time and the 2x/4x modes bf16 enables."""
    import ml_dtypes
    x = np.random.default_rng(2).standard_normal((1024, 2048)).astype(ml_dtypes.bfloat16)
    out32, p32 = _gate_rows(nl.float32).simulate(x)
    out16, p16 = _gate_rows(nl.bfloat16).simulate(x)
    xf = x.astype(np.float64)
    np.testing.assert_allclose(out32.astype(np.float64), np.maximum((xf * 0.5 + 1) * xf, 0), rtol=2e-2, atol=2e-2)
    np.testing.assert_allclose(out16.astype(np.float64), out32.astype(np.float64), rtol=2e-2, atol=5e-2)
    assert p16.total_time_ns < 0.6 * p32.total_time_ns
    eb = p32.analyze().finding("engine_bound")
    assert eb is not None and eb["title"].startswith("vector"), eb
    assert eb["metrics"]["fp32_1x_ns"] >= 0.99 * eb["metrics"]["busy_ns"]
    detail = eb["detail"]
    assert detail.index("bf16 (16-bit) tiles") < detail.index("Move element-wise work off VectorE"), detail
    assert "fp32_1x_ns" not in (p16.analyze().finding("engine_bound") or {"metrics": {}})["metrics"]
