"""Loops kept as kernel-IR loops by the Python tracer (loops="keep", docs/kernel-json.md "Loops from the Python
tracer"): the same numerics as the unrolled trace on the library kernels and examples, the fallbacks (peel,
unroll) where the body depends on the index, and the sanitizer's affine_range check."""
import gc
import importlib.util
import os
import sys

import numpy as np
import pytest

from conftest import require_core  # noqa: E402

_core, ml_dtypes = require_core()

import nsim  # noqa: E402
from nsim import kernels as K  # noqa: E402
from nsim import nki, tracer  # noqa: E402
import nsim.nki.isa as nisa  # noqa: E402
import nsim.nki.language as nl  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _walk(body, depth=0):
    for s in body:
        if "loop" in s:
            yield s, depth
            yield from _walk(s["loop"].get("body", []), depth + 1)
        else:
            yield s, depth


def _loops(kernel):
    return [s["loop"] for s, _ in _walk(kernel["body"]) if "loop" in s]


def _executed_ops(body):
    n = 0
    for s in body:
        if "op" in s:
            n += 1
        elif "loop" in s:
            lp = s["loop"]
            n += _executed_ops(lp.get("body", [])) * len(range(lp.get("start", 0), lp["stop"], lp.get("step", 1)))
    return n


def _uneven_sites(kernel, config="trn2"):
    """Lines allocated n > 1 times in one kept loop's body where n does not divide the rotating buffers D the
    unrolled trace gives the line (compiler.loop_buffers, psum_loop_buffers): the allocator gives each ceil(D / n)
    buffers, n * that many storages where the unrolled trace rotates over max(n, D), so their times may differ
    (docs/kernel-json.md "Loops from the Python tracer")."""
    values = nsim._isa.config_values(config)
    depth = {"sbuf": values["compiler.loop_buffers"], "psum": values["compiler.psum_loop_buffers"]}
    out = []
    for s, _ in _walk(kernel["body"]):
        if "loop" not in s:
            continue
        sites = {}
        for st in s["loop"].get("body", []):
            a = st.get("alloc")
            if a and not a.get("bufs") and "address" not in a and a.get("loc"):
                k = (a["loc"]["file"], a["loc"]["line"], tuple(a["shape"]), a["dtype"], a["buffer"])
                sites[k] = sites.get(k, 0) + 1
        out += [k for k, n in sites.items() if 1 < n < depth[k[4]] and depth[k[4]] % n]
    return out


def _bits(a):
    a = np.asarray(a)
    return a.view(np.uint8) if a.dtype.kind not in "biu" else a


def _both_ways(kernel, args, **opts):
    """(unrolled (kernel dict, outputs, profile), kept (...)) of one kernel."""
    res = []
    import warnings
    for mode in ("unroll", "keep"):
        k = kernel.options(loops=mode, **opts)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", tracer.CheckWarning)
            out, prof = k.simulate(*args)
        res.append((k.to_json(), out, prof))
    return res


def _assert_same_outputs(a, b):
    if isinstance(a, (tuple, list)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _assert_same_outputs(x, y)
        return
    if a is None:
        assert b is None
        return
    np.testing.assert_array_equal(_bits(a), _bits(b))


@pytest.mark.parametrize("name", sorted(K.KERNELS))
def test_library_kernels_give_the_same_outputs_with_loops_kept(name):
    kernel, _ref, make_inputs = K.KERNELS[name]
    args = make_inputs(1)
    (ku, ou, pu), (kk, ok, pk) = _both_ways(kernel, args)
    _assert_same_outputs(ou, ok)  # bit-identical: the same instructions on the same values
    # the sanitizer (on by default) finds the same things
    assert sorted((r["check"], r["line"]) for r in pu.check_reports) == \
        sorted((r["check"], r["line"]) for r in pk.check_reports)
    assert _executed_ops(ku["body"]) == _executed_ops(kk["body"])
    assert not _loops(ku)
    assert pu.total_time_ns > 0 and pk.total_time_ns > 0
    # the same instructions over the same storages: the same time (before a helper's tile line was keyed by its
    # caller too, the attention kernels' unrolled traces were 4-25 % slower than the kept ones); a line with n tiles
    # per pass not dividing the rotating buffers gets more storages kept than unrolled (matmul_naive's B tiles: 3 per
    # pass, 6 storages against 4): within 10 % then. The lowering may then place a kept loop's PSUM tiles faster
    # than the allocator did (compiler.placement_search, by simulating the swaps of two tiles' banks: the attention
    # kernels here, 10,606.2 -> 10,284.5 ns for flash_attention_gqa): never slower, and equal with the search off.
    pk0 = kernel.options(loops="keep", overrides=["compiler.placement_search=0"]).simulate(*args)[1]
    assert pk.total_time_ns <= pk0.total_time_ns
    if _uneven_sites(kk):
        assert pk0.total_time_ns == pytest.approx(pu.total_time_ns, rel=0.1)
    else:
        assert pk0.total_time_ns == pu.total_time_ns


def test_flash_attention_keeps_its_loops_and_shrinks():
    kernel, _ref, _mk = K.KERNELS["flash_attention_gqa"]
    args = K.flash_attention_gqa_inputs(hq=4, hkv=2, s=5120)
    (ku, ou, pu), (kk, ok, pk) = _both_ways(kernel, args)
    _assert_same_outputs(ou, ok)
    loops = _loops(kk)
    # the key-chunk loop `c` is peeled (`if c == 0`, the masked last chunk) and its body allocates PSUM tiles,
    # so its middle chunks are recorded four per pass (tracer._group: trn2's 4 SBUF and 2 PSUM rotating buffers)
    # over the storages of the peeled chunks (a pair loop); at S = 5120 query blocks 36..39 have 10 chunks (8 in
    # the middle: one pair loop of 2 trips each), the others too few to group. The head loops and the
    # transposes' loop `j` stay loops.
    assert {lp["var"] for lp in loops} >= {"g", "r", "j", "c"}
    pair_loops = [lp for lp in loops if lp["var"] == "c"]
    assert len(pair_loops) == 4 and all((lp["start"], lp["stop"]) == (0, 2) for lp in pair_loops)
    assert not any("alloc" in s for lp in pair_loops for s in lp["body"])  # the line's storages, outside
    # ... and kept loops then simulate what the unrolled trace does (the same storages per line and caller;
    # 412,958.9 ns both, where the unrolled trace gave 414,019.5 ns with storages per line alone)
    assert pk.total_time_ns == pu.total_time_ns
    n_ops_kept = sum(1 for s, _ in _walk(kk["body"]) if "op" in s)
    n_ops_unrolled = sum(1 for s in ku["body"] if "op" in s)
    assert n_ops_kept * 4 < n_ops_unrolled
    assert _executed_ops(kk["body"]) == n_ops_unrolled
    # g and r (kv head, query head of the group) index the HBM tensors: affine expressions in the IR
    text = tracer.dumps(kk)
    assert '"2*g + r"' in text or '"r + 2*g"' in text


def _load_example(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up
    sys.path.insert(0, os.path.dirname(path))
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.path.pop(0)
    return mod


def test_examples_give_the_same_outputs_with_loops_kept():
    pairs = _load_example(os.path.join(ROOT, "examples", "defects", "pairs.py"), "nsim_defect_pairs_loops")
    for p in pairs.PAIRS:
        args = p.inputs()
        for kern in (p.before, p.after):
            (_ku, ou, _pu), (_kk, ok, _pk) = _both_ways(kern, args)
            _assert_same_outputs(ou, ok)
    from nsim import compat
    small = dict(K=512, M=256, N=1024)
    blocks = dict(TILES_IN_BLOCK_M=2, TILES_IN_BLOCK_N=1, TILES_IN_BLOCK_K=2)  # step 4 at the small size
    kept = []
    for fname in ("matmul_tutorial_kernels.py", "matmul_tutorial_beta1.py"):  # new dialect, Beta 1
        was = compat.installed()
        compat.install()
        try:
            mt = _load_example(os.path.join(ROOT, "examples", "matmul_tutorial", fname), "nsim_loops_" + fname[:-3])
        finally:
            if not was:
                compat.uninstall()
        lhsT, rhs = mt.make_inputs(seed=3, **small)
        for step, kern in mt.STEPS:
            kw = blocks if step == "fully_optimized" else {}
            outs, kernels = [], []
            for mode in ("unroll", "keep"):
                with nsim.options(loops=mode):
                    out, _prof = kern.simulate(lhsT, rhs, **kw)
                outs.append(out)
                kernels.append(getattr(kern, "last_json", None))
            _assert_same_outputs(outs[0], outs[1])
            if kernels[1] is not None:
                kept.append(bool(_loops(kernels[1])))
    assert any(kept)


# (128 * 10 + 44: 11 tiles, the first and the last peeled, the 9 between one run with its int index and two groups
# of four: a peeled body allocating tiles is recorded four iterations per pass, tracer._group)
@pytest.mark.parametrize("rows,masked,trips", [(128 * 6, False, [6]), (128 * 6, True, [6]), (128 * 10 + 44, True, None)])
def test_a_beta1_arange_subscript_with_the_loop_index_keeps_the_loop(rows, masked, trips):
    """The NKI tutorial's Beta 1 RMSNorm indexes HBM as ``a_tensor[i * 128 + ix, iy]`` (``ix``, ``iy``: nl.arange)
    and masks the last, partial tile with ``mask=(i * 128 + ix < num_rows)``: the index expression's offset is
    symbolic, so the loop is kept; a mask that holds in every iteration leaves it whole, one that does not
    (rows not a multiple of 128) peels the first and last iterations. The outputs are the unrolled trace's."""
    from nsim import compat
    was = compat.installed()
    compat.install()
    try:
        import neuronxcc.nki as bnki
        import neuronxcc.nki.language as bnl

        @bnki.jit
        def rmsnorm_kernel(a_tensor, g_tensor):
            out_tensor = bnl.ndarray(a_tensor.shape, dtype=a_tensor.dtype, buffer=bnl.shared_hbm)
            ix = bnl.arange(128)[:, None]
            iw = bnl.arange(1)[:, None]
            iy = bnl.arange(a_tensor.shape[1])[None, :]
            num_rows = a_tensor.shape[0]
            g_tile = bnl.load(g_tensor.reshape((1, g_tensor.shape[0]))[iw, iy])
            for i in bnl.affine_range((num_rows + 127) // 128):
                m = (i * 128 + ix < num_rows) if masked else None
                a_tile = bnl.load(a_tensor[i * 128 + ix, iy], mask=m)
                square_sum = bnl.sum(bnl.square(a_tile), axis=[1])
                rms_reciprocal = bnl.rsqrt(square_sum / a_tensor.shape[1])
                out_tile = bnl.multiply(a_tile, rms_reciprocal)
                out_tile[...] = bnl.multiply(out_tile, g_tile.broadcast_to((128, g_tensor.shape[0])), mask=m)
                bnl.store(out_tensor[i * 128 + ix, iy], value=out_tile, mask=m)
            return out_tensor

        rng = np.random.default_rng(5)
        a = rng.standard_normal((rows, 64)).astype(np.float32)
        g = rng.standard_normal((64,)).astype(np.float32)
        (ku, ou, _pu), (kk, ok, _pk) = _both_ways(rmsnorm_kernel, (a, g))
    finally:
        if not was:
            compat.uninstall()
    _assert_same_outputs(ou, ok)
    loops = _loops(kk)
    assert loops
    if trips is not None:
        assert [lp["stop"] for lp in loops] == trips
    (ir_k, exec_k), (ir_u, exec_u) = tracer.count_ops(kk["body"]), tracer.count_ops(ku["body"])
    assert exec_k == exec_u and ir_k < ir_u  # the same ops executed, the body's recorded once
    ref = a / np.sqrt((a * a).sum(axis=1, keepdims=True) / 64) * g
    np.testing.assert_allclose(ok, ref, rtol=1e-4, atol=1e-4)


def test_a_mask_that_is_not_made_of_inequalities_unrolls_the_loop():
    """``|`` in a mask on the loop index: whether it holds everywhere cannot be read off the corners of the
    index range, so the loop is unrolled (the same outputs either way)."""
    from nsim import compat
    was = compat.installed()
    compat.install()
    try:
        import neuronxcc.nki as bnki
        import neuronxcc.nki.language as bnl

        @bnki.jit
        def copy_rows(a_tensor):
            out_tensor = bnl.ndarray(a_tensor.shape, dtype=a_tensor.dtype, buffer=bnl.shared_hbm)
            ix = bnl.arange(128)[:, None]
            iy = bnl.arange(a_tensor.shape[1])[None, :]
            for i in bnl.affine_range(a_tensor.shape[0] // 128):
                t = bnl.load(a_tensor[i * 128 + ix, iy])
                bnl.store(out_tensor[i * 128 + ix, iy], value=t, mask=(i * 128 + ix < 100000) | (iy < 0))
            return out_tensor

        a = np.arange(128 * 4 * 8, dtype=np.float32).reshape(128 * 4, 8)
        (ku, ou, _pu), (kk, ok, _pk) = _both_ways(copy_rows, (a,))
    finally:
        if not was:
            compat.uninstall()
    _assert_same_outputs(ou, ok)
    assert not _loops(kk)


# ---------------------------------------------------------------------------------------------------------------
# Timing: a loop whose body allocates no tile lowers to exactly the unrolled instruction stream.
@nki.jit
def scale_rows(x):
    n, f = x.shape
    out = nl.ndarray((n, f), x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray((128, f), x.dtype, buffer=nl.sbuf)
    u = nl.ndarray((128, f), x.dtype, buffer=nl.sbuf)
    for i in nl.sequential_range(n // 128):
        nisa.dma_copy(dst=t, src=x[i * 128:(i + 1) * 128, :])
        nisa.tensor_scalar(dst=u, data=t, op0=nl.multiply, operand0=2.0)
        nisa.dma_copy(dst=out[i * 128:(i + 1) * 128, :], src=u)
    return out


def test_a_loop_without_tiles_in_its_body_has_the_unrolled_timing():
    x = np.random.default_rng(0).standard_normal((1024, 256)).astype(np.float32)
    (ku, ou, pu), (kk, ok, pk) = _both_ways(scale_rows, (x,))
    _assert_same_outputs(ou, ok)
    np.testing.assert_array_equal(ok, 2 * x)
    [lp] = _loops(kk)
    assert (lp["var"], lp["start"], lp["stop"], lp["kind"]) == ("i", 0, 8, "sequential")
    ops = [s for s in lp["body"] if "op" in s]
    assert ops[0]["src"]["index"][0] == {"start": "128*i", "size": 128}
    # the same instructions in the same order, the same storage: the same simulated time to the picosecond
    assert pk.total_time_ns == pu.total_time_ns
    assert nsim.disasm_json(kk) == nsim.disasm_json(ku)


# ---------------------------------------------------------------------------------------------------------------
# When the body depends on the index: peeled or unrolled, never guessed.
@nki.jit
def psum_first_iteration_special(x, w):
    """sum over c of x[:, c]^T w, the first product copied, the others added: a peeled loop allocating PSUM."""
    n = x.shape[1] // 128
    out = nl.ndarray((128, 512), nl.float32, buffer=nl.shared_hbm)
    w_sb = nl.ndarray((128, 512), w.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=w_sb, src=w)
    acc = nl.ndarray((128, 512), nl.float32, buffer=nl.sbuf)
    for c in nl.sequential_range(n):
        x_t = nl.ndarray((128, 128), x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=x_t, src=x[:, c * 128:(c + 1) * 128])
        ps = nl.ndarray((128, 512), nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=ps, stationary=x_t, moving=w_sb)
        if c == 0:
            nisa.tensor_copy(dst=acc, src=ps)
        else:
            nisa.tensor_tensor(dst=acc, data1=acc, data2=ps, op=nl.add)
    nisa.dma_copy(dst=out, src=acc)
    return out


@pytest.mark.parametrize("n,first", [(12, 384), (13, 512)])
def test_a_peeled_loop_allocating_psum_is_recorded_a_group_of_iterations_at_a_time(n, first):
    # peeled, the loop's PSUM tile would be three allocations with their own buffers (the first iteration's,
    # the loop's, the last's); unrolled, each line rotates over its storages (trn2: 4 per SBUF line, 2 per PSUM
    # line). The middle iterations are recorded four per pass (tracer._group) over the storages the peeled
    # iterations use: the same instructions on the same storages as the unrolled trace, so the same outputs and
    # the same simulated time. n = 13: 11 middle iterations, the first three run with their int index (c = 1..3),
    # then 2 groups of 4 from c = 4 (first = 512).
    rng = np.random.default_rng(7)
    x = rng.standard_normal((128, 128 * n)).astype(np.float32)
    w = rng.standard_normal((128, 512)).astype(np.float32)
    (ku, ou, pu), (kk, ok, pk) = _both_ways(psum_first_iteration_special, (x, w))
    _assert_same_outputs(ou, ok)
    ref = sum(x[:, c * 128:(c + 1) * 128].T.astype(np.float64) @ w for c in range(n))
    np.testing.assert_allclose(ok, ref, rtol=1e-4, atol=1e-3)
    [lp] = _loops(kk)
    assert (lp["var"], lp["start"], lp["stop"], lp["kind"]) == ("c", 0, 2, "sequential")
    assert not any("alloc" in s for s in lp["body"])
    srcs = [s["src"]["index"][1]["start"] for s in lp["body"] if s.get("op") == "dma_copy"]
    assert srcs == ["512*c + {}".format(first + 128 * j) for j in range(4)]
    psum_dsts = [s["dst"] for s in lp["body"] if s.get("op") == "nc_matmul"]
    assert len(psum_dsts) == 4 and len(set(psum_dsts)) == 2  # a PSUM line rotates over its two storages
    sbuf_dsts = [s["dst"] for s in lp["body"] if s.get("op") == "dma_copy"]
    assert len(set(sbuf_dsts)) == 4  # an SBUF line over its four
    assert pk.total_time_ns == pytest.approx(pu.total_time_ns, rel=1e-9)
    assert _executed_ops(kk["body"]) == _executed_ops(ku["body"])


@nki.jit
def psum_tile_carried(x, w):
    """As psum_first_iteration_special, but each iteration also adds the previous iteration's PSUM tile:
    Python state carried from one iteration to the next."""
    n = x.shape[1] // 128
    out = nl.ndarray((128, 512), nl.float32, buffer=nl.shared_hbm)
    w_sb = nl.ndarray((128, 512), w.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=w_sb, src=w)
    acc = nl.ndarray((128, 512), nl.float32, buffer=nl.sbuf)
    prev = None
    for c in nl.sequential_range(n):
        x_t = nl.ndarray((128, 128), x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=x_t, src=x[:, c * 128:(c + 1) * 128])
        ps = nl.ndarray((128, 512), nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=ps, stationary=x_t, moving=w_sb)
        if c == 0:
            nisa.tensor_copy(dst=acc, src=ps)
        else:
            nisa.tensor_tensor(dst=acc, data1=acc, data2=prev, op=nl.add)
        prev = ps
    nisa.tensor_tensor(dst=acc, data1=acc, data2=prev, op=nl.add)
    nisa.dma_copy(dst=out, src=acc)
    return out


def test_a_psum_tile_carried_across_a_pair_unrolls_the_loop():
    # the previous iteration's tile is found when the peeled loop is first recorded (one iteration per pass),
    # before its iterations are paired (where a pass's second iteration could read its first's): unrolled
    rng = np.random.default_rng(8)
    x = rng.standard_normal((128, 128 * 8)).astype(np.float32)
    w = rng.standard_normal((128, 512)).astype(np.float32)
    (_ku, ou, _pu), (kk, ok, _pk) = _both_ways(psum_tile_carried, (x, w))
    _assert_same_outputs(ou, ok)
    ref = x[:, 0:128].T.astype(np.float64) @ w
    for c in range(8):
        ref = ref + x[:, c * 128:(c + 1) * 128].T.astype(np.float64) @ w
    np.testing.assert_allclose(ok, ref, rtol=1e-4, atol=1e-3)
    assert not _loops(kk)


ATTEMPTS = []


@nki.jit
def first_iteration_special(x):
    ATTEMPTS.append(x.shape)  # once per attempt of a trace (each runs the kernel's Python again)
    n, f = x.shape
    out = nl.ndarray((128, f), x.dtype, buffer=nl.shared_hbm)
    acc = nl.ndarray((128, f), nl.float32, buffer=nl.sbuf)
    for i in nl.sequential_range(n // 128):
        t = nl.ndarray((128, f), x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x[i * 128:(i + 1) * 128, :])
        if i == 0:
            nisa.tensor_copy(dst=acc, src=t)
        else:
            nisa.tensor_tensor(dst=acc, data1=acc, data2=t, op=nl.add)
    nisa.dma_copy(dst=out, src=acc)
    return out


def test_a_comparison_that_differs_between_iterations_peels_the_loop():
    """Iterations 0 and 15 run with their int index; of the 14 between, 2 too (14 mod 4) and 12 are a group loop
    (its body allocates a tile: recorded four iterations per pass over the line's storages, tracer._group), so the
    kept trace's time is the unrolled one's (with pairs and one buffer more per line peeled, 10,587 ns against
    11,657 ns unrolled, when a line had two rotating buffers)."""
    x = np.random.default_rng(1).standard_normal((2048, 64)).astype(np.float32)
    (_ku, ou, pu), (kk, ok, pk) = _both_ways(first_iteration_special, (x,))
    _assert_same_outputs(ou, ok)
    np.testing.assert_allclose(ok, x.reshape(16, 128, 64).sum(0), rtol=1e-5)
    [lp] = _loops(kk)
    assert (lp["start"], lp["stop"]) == (0, 3)  # 3 groups of 4 iterations
    assert pk.total_time_ns == pu.total_time_ns


@nki.jit
def python_state_carried(x):
    n, f = x.shape
    out = nl.ndarray((n, f), x.dtype, buffer=nl.shared_hbm)
    prev = None
    for i in nl.affine_range(n // 128):
        t = nl.ndarray((128, f), x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x[i * 128:(i + 1) * 128, :])
        if prev is not None:  # a previous iteration's tile: the body differs from one iteration to the next
            nisa.tensor_tensor(dst=t, data1=t, data2=prev, op=nl.add)
        nisa.dma_copy(dst=out[i * 128:(i + 1) * 128, :], src=t)
        prev = t
    return out


def test_python_state_carried_between_iterations_unrolls_the_loop():
    x = np.random.default_rng(2).standard_normal((512, 32)).astype(np.float32)
    (_ku, ou, _pu), (kk, ok, _pk) = _both_ways(python_state_carried, (x,), check=False)
    _assert_same_outputs(ou, ok)
    assert not _loops(kk)
    np.testing.assert_allclose(ok, np.cumsum(x.reshape(4, 128, 32), 0).reshape(512, 32), rtol=1e-5)


@nki.jit
def ragged(x):
    n, f = x.shape
    out = nl.ndarray((n, f), x.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(-(-n // 128)):
        rows = min(128, n - i * 128)  # the last tile is short: a size that depends on the index
        t = nl.ndarray((128, f), x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t[:rows, :], src=x[i * 128:i * 128 + rows, :])
        nisa.dma_copy(dst=out[i * 128:i * 128 + rows, :], src=t[:rows, :])
    return out


@nki.jit
def divided(x):
    n, f = x.shape
    out = nl.ndarray((n, f), x.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(n // 64):
        t = nl.ndarray((64, f), x.dtype, buffer=nl.sbuf)
        r = (i * 64) // 128  # not exact for odd i: needs the int
        nisa.dma_copy(dst=t, src=x[r * 128 + (i % 2) * 64:r * 128 + (i % 2) * 64 + 64, :])
        nisa.dma_copy(dst=out[i * 64:(i + 1) * 64, :], src=t)
    return out


@pytest.mark.parametrize("kern,shape,kept", [(ragged, (2000, 16), (0, 3)), (ragged, (600, 16), ()),
                                             (divided, (256, 16), None)])
def test_index_dependent_bodies_are_peeled_or_unrolled(kern, shape, kept):
    x = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    (_ku, ou, _pu), (kk, ok, _pk) = _both_ways(kern, (x,))
    _assert_same_outputs(ou, ok)
    np.testing.assert_array_equal(ok, x)
    loops = _loops(kk)
    if not kept:  # divided: a non-exact // of the index cannot be peeled away; ragged of 5 tiles: too few to pair
        assert not loops
    else:  # ragged: min(128, n - 128 i) is 128 for i = 1..14: peeled (i = 0 and the short i = 15 run with their
        # int index) and, its body allocating a tile, i = 1, 2 with their int index and 3 groups of 4 (tracer._group):
        # the unrolled trace's time
        [lp] = loops
        assert (lp["start"], lp["stop"]) == kept
        assert _pk.total_time_ns == _pu.total_time_ns


@nki.jit
def ap_moved_by_the_index(a):
    """New-dialect views moved by the loop index: ``.ap(offset=)`` (the nki-library style) and ``.T`` of a sliced
    HBM view (the tutorials' transposed store)."""
    n, f = a.shape
    out = nl.ndarray((n, f), a.dtype, buffer=nl.shared_hbm)
    out_t = nl.ndarray((f, n), a.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(n // 128):
        t = nl.ndarray((128, f), a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a.ap([[f, 128], [1, f]], offset=i * 128 * f))
        u = nl.ndarray((128, f), a.dtype, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=u, data=t, op0=nl.multiply, operand0=2.0)
        nisa.dma_copy(dst=out.ap([[f, 128], [1, f]], offset=i * 128 * f), src=u)
        nisa.dma_copy(dst=out_t[:, i * 128:(i + 1) * 128].T, src=t)
    return out, out_t


@nki.jit
def ap_column_blocks(a):
    """``.ap(offset=j * 64)``: 64-column blocks of the first 128 rows; the block's row, (64 j) // f, is 0 in every
    iteration and its column (64 j) % f is 64 j."""
    n, f = a.shape
    out = nl.ndarray((128, f), a.dtype, buffer=nl.shared_hbm)
    for j in nl.affine_range(f // 64):
        t = nl.ndarray((128, 64), a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a.ap([[f, 128], [1, 64]], offset=j * 64))
        nisa.dma_copy(dst=out[:, j * 64:(j + 1) * 64], src=t)
    return out


@nki.jit
def ap_half_rows(a):
    """An ``.ap`` offset of half a row per iteration: the row it starts in is not affine in the index."""
    n, f = a.shape
    out = nl.ndarray((n // 4, f), a.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(n // 4):
        t = nl.ndarray((1, f // 2), a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a.ap([[f, 1], [1, f // 2]], offset=i * (2 * f + f // 2)))
        nisa.dma_copy(dst=out[i:i + 1, 0:f // 2], src=t)
        nisa.dma_copy(dst=out[i:i + 1, f // 2:f], src=t)
    return out


def test_views_moved_by_the_index_through_ap_and_T_keep_the_loop():
    """A view whose flat offset is affine in the index (``.ap(offset=i * 128 * f)``, ``out[:, i*128:...].T``) keeps
    the loop (was unrolled: the view's offset needed an int); its row start ``(i * 128 * f // f) % n`` is affine
    since the quotient of ``// n`` is the same in every iteration; so is a column block's row ``(64 j) // f`` (0).
    Same outputs and time as the unrolled trace."""
    a = np.random.default_rng(7).standard_normal((1024, 256)).astype(np.float32)
    (ku, ou, pu), (kk, ok, pk) = _both_ways(ap_moved_by_the_index, (a,))
    _assert_same_outputs(ou, ok)
    np.testing.assert_array_equal(ok[0], 2 * a)
    np.testing.assert_array_equal(ok[1], a.T)
    [lp] = _loops(kk)
    assert (lp["start"], lp["stop"]) == (0, 8) and _executed_ops(kk["body"]) == _executed_ops(ku["body"]) == 32
    assert len([s for s in lp["body"] if "op" in s]) == 4 and len(kk["body"]) == 1  # the whole body, once
    assert pk.total_time_ns == pu.total_time_ns
    (ku, ou, pu), (kk, ok, pk) = _both_ways(ap_column_blocks, (a,))
    np.testing.assert_array_equal(ok, a[:128])
    [lp] = _loops(kk)
    assert (lp["start"], lp["stop"]) == (0, 4) and len(kk["body"]) == 1
    assert pk.total_time_ns == pu.total_time_ns


def test_a_view_offset_whose_row_is_not_affine_in_the_index_unrolls_the_loop():
    """Half a row more per iteration: the row (i * 2.5 rows) // 1 row changes by a non-integer step, which no
    affine index expresses: the loop is unrolled (as before), with the same outputs."""
    a = np.arange(40 * 8, dtype=np.float32).reshape(40, 8)
    (_ku, ou, _pu), (kk, ok, _pk) = _both_ways(ap_half_rows, (a,))
    _assert_same_outputs(ou, ok)
    flat = a.reshape(-1)
    want = np.stack([flat[i * 20:i * 20 + 4] for i in range(10)])
    np.testing.assert_array_equal(ok, np.concatenate([want, want], axis=1))
    assert not _loops(kk)


@nki.jit
def k_accumulation(a_t, b):
    """The new dialect's matmul: a PSUM tile made per M block, its K loop accumulating with accumulate=None."""
    K, M = a_t.shape
    _, N = b.shape
    out = nl.ndarray((M, N), np.float32, buffer=nl.shared_hbm)
    for m in nl.affine_range(M // 128):
        ps = nl.ndarray((128, N), np.float32, buffer=nl.psum)
        for k in nl.affine_range(K // 128):
            at = nl.ndarray((128, 128), a_t.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=at, src=a_t[k * 128:(k + 1) * 128, m * 128:(m + 1) * 128])
            bt = nl.ndarray((128, N), b.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=bt, src=b[k * 128:(k + 1) * 128, :])
            nisa.nc_matmul(dst=ps, stationary=at, moving=bt)
        o = nl.ndarray((128, N), np.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=o, src=ps)
        nisa.dma_copy(dst=out[m * 128:(m + 1) * 128, :], src=o)
    return out


@nki.jit
def psum_rewritten(a_t, b):
    """A PSUM tile made outside an affine_range, each iteration's product evicted: not an accumulation."""
    K, _ = a_t.shape
    _, N = b.shape
    out = nl.ndarray((K, N), np.float32, buffer=nl.shared_hbm)
    ps = nl.ndarray((128, N), np.float32, buffer=nl.psum)
    for k in nl.affine_range(K // 128):
        at = nl.ndarray((128, 128), a_t.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=at, src=a_t[k * 128:(k + 1) * 128, 0:128])
        bt = nl.ndarray((128, N), b.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=bt, src=b[k * 128:(k + 1) * 128, :])
        nisa.nc_matmul(dst=ps, stationary=at, moving=bt)
        o = nl.ndarray((128, N), np.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=o, src=ps)
        nisa.dma_copy(dst=out[k * 128:(k + 1) * 128, :], src=o)
    return out


@pytest.mark.parametrize("check", [True, False])
def test_a_k_loop_accumulating_with_accumulate_none_is_peeled_not_unrolled(check):
    """``nc_matmul(dst=ps, accumulate=None)`` in a K loop into a PSUM tile made outside it: the first matmul
    overwrites, the others accumulate. Was unrolled; now peeled (k = 0 with its int index, the others recorded and
    accumulating), with the sanitizer on or off: the same outputs and time as the unrolled trace. (16 K tiles: the
    14 between the peeled ones are recorded four per pass, tracer._group, 2 of them with their int index.)"""
    rng = np.random.default_rng(11)
    a = rng.standard_normal((2048, 256)).astype(np.float32)
    b = rng.standard_normal((2048, 512)).astype(np.float32)
    (ku, ou, pu), (kk, ok, pk) = _both_ways(k_accumulation, (a, b), check=check)
    _assert_same_outputs(ou, ok)
    np.testing.assert_allclose(ok, a.T @ b, rtol=1e-4, atol=1e-3)
    assert len(kk["body"]) == 1 and len(_loops(kk)) == 2  # the M loop, and the K loop inside it
    assert _executed_ops(kk["body"]) == _executed_ops(ku["body"])
    assert pk.total_time_ns == pu.total_time_ns


def test_a_psum_tile_rewritten_by_every_iteration_is_still_reported():
    """The same pattern without accumulation (each product evicted): peeling does not help, the loop is unrolled
    and the sanitizer reports the PSUM tile that two affine_range iterations write, as before. What is simulated
    is the trace without the sanitizer (tracer._unsanitized): the loop kept."""
    rng = np.random.default_rng(12)
    a = rng.standard_normal((512, 128)).astype(np.float32)
    b = rng.standard_normal((512, 256)).astype(np.float32)
    with pytest.warns(tracer.CheckWarning, match="NSIM-W504 affine-write-conflict: nc_matmul on 'ps'"):
        out, _ = psum_rewritten.options(loops="keep", check=True).simulate(a, b)
    np.testing.assert_allclose(out, np.concatenate([a[k * 128:(k + 1) * 128, :128].T @ b[k * 128:(k + 1) * 128]
                                                    for k in range(4)]), rtol=1e-4, atol=1e-3)
    assert _loops(psum_rewritten.to_json())
    assert psum_rewritten.to_json() == psum_rewritten.options(loops="keep", check=False).to_json(a, b)


@nki.jit
def rows_of_a_reshape(x):
    """nki-library style: row tiles of ``x.reshape((B * S, H))``, which cross a batch boundary when S is not a
    multiple of 128."""
    B, S, H = x.shape
    x2 = x.reshape((B * S, H))
    out = nl.ndarray((B, S, H), x.dtype, buffer=nl.shared_hbm)
    o2 = out.reshape((B * S, H))
    for t in nl.affine_range((B * S) // 128):
        tile = nl.ndarray((128, H), x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=tile, src=x2[nl.ds(t * 128, 128), :])
        nisa.tensor_scalar(dst=tile, data=tile, op0=nl.add, operand0=1.0)
        nisa.dma_copy(dst=o2[nl.ds(t * 128, 128), :], src=tile)
    return out


@nki.jit
def gathered_rows(x, rows):
    """The nki-samples resize idiom: a row picked by a host-side list indexed with an unrolled inner loop, inside a
    kept outer loop over a reshape (``out_seqs[b, i:i + 1, :]``)."""
    B, H, W, C = x.shape
    out = nl.ndarray((B, 1, len(rows), C), x.dtype, buffer=nl.shared_hbm)
    xs = x.reshape((B, H * W, C))
    os_ = out.reshape((B, len(rows), C))
    for b in nl.affine_range(B):
        for i in nl.affine_range(len(rows)):
            r = rows[i]  # a Python list indexed by the index: this loop is unrolled
            t = nl.ndarray((1, C), x.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=t, src=xs[b, r:r + 1, :])
            nisa.dma_copy(dst=os_[b, i:i + 1, :], src=t)
    return out


def test_row_tiles_of_a_reshape_crossing_batches_keep_the_loop():
    """Rows 128 t .. 128 t + 127 of a (B * S, H) reshape are not affine in t as (b, s) indices of the (B, S, H)
    tensor (they cross a batch): the access is written on the reshape itself (kernel.json ``"shape"``) and the loop
    is kept (was unrolled). Same outputs and time as the unrolled trace."""
    x = np.random.default_rng(13).standard_normal((2, 320, 32)).astype(np.float32)  # 640 rows: tile 2 crosses a batch
    (ku, ou, pu), (kk, ok, pk) = _both_ways(rows_of_a_reshape, (x,))
    _assert_same_outputs(ou, ok)
    np.testing.assert_array_equal(ok, x + 1)
    [lp] = _loops(kk)
    assert (lp["start"], lp["stop"]) == (0, 5)
    loads = [st for st in lp["body"] if st.get("op") == "dma_copy" and isinstance(st["src"], dict)]
    assert loads[0]["src"]["shape"] == [640, 32] and loads[0]["src"]["index"][0]["start"] == "128*t"
    assert pk.total_time_ns == pu.total_time_ns


def test_rows_of_a_kept_loop_and_an_unrolled_inner_loop_do_not_conflict():
    """The inner loop is unrolled (a list indexed by its index), the outer one kept: the inner iterations' stores
    ``os_[b, i:i + 1, :]`` (i = 0 on the tensor's own dims, i = 1 on the reshape's) are compared through the
    difference of their first elements, which does not depend on b: no false NSIM-W504 (was reported: a symbolic
    start on two layouts counted as an overlap). Four rows: the inner loop's tiles then rotate over the line's four
    buffers the same way in every outer iteration, so the outer loop stays a loop (with three it is peeled:
    test_a_line_taken_unevenly_per_iteration_rotates_as_unrolled)."""
    x = np.arange(2 * 6 * 4, dtype=np.float32).reshape(2, 2, 3, 4)
    rows = [4, 0, 2, 5]
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error", tracer.CheckWarning)
        k = gathered_rows.options(loops="keep", check=True)
        ok, _ = k.simulate(x, rows)
    np.testing.assert_array_equal(ok, x.reshape(2, 6, 4)[:, rows, :].reshape(2, 1, 4, 4))
    [lp] = _loops(k.to_json())
    assert lp["var"] == "b"


@nki.jit
def sbuf_accumulation(x, read_in_body=False):
    """``acc = acc + x_i`` over an affine_range (the NKI Mamba tutorial's scanC_accum, new dialect): an in-place
    tensor_tensor accumulation into an SBUF tile made outside the loop."""
    n, f = x.shape
    out = nl.ndarray((128, f), np.float32, buffer=nl.shared_hbm)
    prefix = nl.ndarray((n, f), np.float32, buffer=nl.shared_hbm)
    acc = nl.ndarray((128, f), np.float32, buffer=nl.sbuf)
    nisa.memset(dst=acc, value=0.0)
    for i in nl.affine_range(n // 128):
        t = nl.ndarray((128, f), x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x[i * 128:(i + 1) * 128, :])
        nisa.tensor_tensor(dst=acc, data1=acc, data2=t, op=nl.add)
        if read_in_body:  # the running sum stored per iteration: order-dependent, checked exactly
            nisa.dma_copy(dst=prefix[i * 128:(i + 1) * 128, :], src=acc)
    nisa.dma_copy(dst=out, src=acc)
    if not read_in_body:
        nisa.memset(dst=acc, value=0.0)
        for i in nl.affine_range(n // 128):
            nisa.dma_copy(dst=prefix[i * 128:(i + 1) * 128, :], src=acc)
    return out, prefix


@pytest.mark.parametrize("read_in_body", [False, True])
def test_an_in_place_accumulation_over_an_affine_range(read_in_body):
    """``tensor_tensor(dst=acc, data1=acc, ...)`` with a reduction operator gives the same result in any iteration
    order: the symbolic affine_range check lets it keep the loop (was unrolled), as the exact check lets it pass.
    A body that also reads the accumulator otherwise is still unrolled and checked exactly (what is simulated is
    then the trace without the sanitizer, tracer._unsanitized)."""
    x = np.random.default_rng(14).standard_normal((1024, 64)).astype(np.float32)
    (ku, ou, pu), (kk, ok, pk) = _both_ways(sbuf_accumulation, (x, read_in_body))
    _assert_same_outputs(ou, ok)
    np.testing.assert_allclose(ok[0], x.reshape(8, 128, 64).sum(0), rtol=1e-5, atol=1e-5)
    if read_in_body:
        np.testing.assert_allclose(ok[1], np.cumsum(x.reshape(8, 128, 64), 0).reshape(1024, 64), rtol=1e-5, atol=1e-5)
    assert [lp["stop"] for lp in _loops(kk)] == ([8] if read_in_body else [8, 8])
    assert kk == sbuf_accumulation.options(loops="keep", check=False).to_json(x, read_in_body)
    assert pk.total_time_ns == pu.total_time_ns


@nki.jit
def own_slice_reread(x, other=False):
    """The SD-attention tutorial's score buffer: each iteration writes its column slice of a tile made outside
    the loop, then reads that slice back (``other``: reads the whole buffer instead, what other iterations
    write)."""
    n, f = x.shape
    out = nl.ndarray((128, n // 128), np.float32, buffer=nl.shared_hbm)
    buf = nl.ndarray((128, n), np.float32, buffer=nl.sbuf)
    mx = nl.ndarray((128, n // 128), np.float32, buffer=nl.sbuf)
    for k in nl.affine_range(n // 128):
        t = nl.ndarray((128, 128), x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x[k * 128:(k + 1) * 128, 0:128])
        nisa.tensor_scalar(dst=buf[:, k * 128:(k + 1) * 128], data=t, op0=nl.multiply, operand0=2.0)
        src = buf if other else buf[:, k * 128:(k + 1) * 128]
        nisa.tensor_reduce(dst=mx[:, k:k + 1], data=src, op=nl.maximum, axis=1)
    nisa.dma_copy(dst=out, src=mx)
    return out


def test_an_iteration_reading_back_its_own_slice_keeps_the_loop_with_the_sanitizer():
    """With the sanitizer on, a body reading a tensor it writes was always unrolled; reading back exactly the
    slice this iteration wrote (which moves with the index) is not a loop-carried dependency: kept. Reading the
    whole buffer (what other iterations write) is still unrolled and checked exactly; what is simulated is then the
    trace without the sanitizer (tracer._unsanitized)."""
    x = np.random.default_rng(15).standard_normal((512, 128)).astype(np.float32)
    (_ku, ou, pu), (kk, ok, pk) = _both_ways(own_slice_reread, (x,), check=True)
    _assert_same_outputs(ou, ok)
    np.testing.assert_allclose(ok, (2 * x).reshape(4, 128, 128).max(axis=2).T, rtol=1e-6)
    assert [lp["stop"] for lp in _loops(kk)] == [4]
    assert pk.total_time_ns == pu.total_time_ns
    (_ku, _ou, _pu), (kk, _ok, _pk) = _both_ways(own_slice_reread, (x, True), check=True)
    assert kk == own_slice_reread.options(loops="keep", check=False).to_json(x, True)


@nki.jit
def reads_values(x):
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray((128, x.shape[1]), x.dtype, buffer=nl.sbuf)
    for i in nl.affine_range(x.shape[0] // 128):
        u = nl.ndarray((128, x.shape[1]), x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=u, src=x[i * 128:(i + 1) * 128, :])
        if float(np.asarray(u).sum()) > -1e30:  # an eager value read in the body
            nisa.tensor_copy(dst=t, src=u)
        nisa.dma_copy(dst=out[i * 128:(i + 1) * 128, :], src=t)
    return out


def test_a_value_read_in_the_body_unrolls_the_loop():
    x = np.random.default_rng(4).standard_normal((256, 8)).astype(np.float32)
    (_ku, ou, _pu), (kk, ok, _pk) = _both_ways(reads_values, (x,), check=False)
    _assert_same_outputs(ou, ok)
    np.testing.assert_array_equal(ok, x)
    assert not _loops(kk)


@nki.jit
def breaks_out(x):
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(x.shape[0] // 128):
        t = nl.ndarray((128, x.shape[1]), x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x[i * 128:(i + 1) * 128, :])
        nisa.dma_copy(dst=out[i * 128:(i + 1) * 128, :], src=t)
        if i * 128 >= 256:
            break
    return out


def test_break_unrolls_the_loop():
    x = np.random.default_rng(5).standard_normal((512, 8)).astype(np.float32)
    (ku, ou, _pu), (kk, ok, _pk) = _both_ways(breaks_out, (x,), timing_only=True)
    assert not _loops(kk)
    assert _executed_ops(kk["body"]) == _executed_ops(ku["body"]) == 6


@nki.jit
def out_of_bounds(x):
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(3):
        t = nl.ndarray((128, x.shape[1]), x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x[i * 128:(i + 1) * 128, :])  # x has 256 rows: i = 2 is out of bounds
        nisa.dma_copy(dst=out[i * 128:(i + 1) * 128, :], src=t)
    return out


def test_an_error_of_the_kernel_is_the_unrolled_traces_error():
    x = np.zeros((256, 8), np.float32)
    errs = []
    for mode in ("unroll", "keep"):
        with pytest.raises(nsim.NsimError) as ei:
            out_of_bounds.options(loops=mode).simulate(x)
        errs.append((ei.value.code, ei.value.line, str(ei.value)))
    assert errs[0] == errs[1]


_GC_SEEN = []


@nki.jit
def notes_the_gc(x):
    _GC_SEEN.append(gc.isenabled())
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    nisa.dma_copy(dst=out, src=t)
    return out


@pytest.mark.parametrize("enabled", [True, False])
def test_tracing_pauses_the_gc_and_leaves_it_as_it_was(enabled):
    """The tracer pauses the cyclic GC while the kernel runs (tracer.trace) and restores the caller's
    setting afterwards, whether the trace succeeds or raises; a caller who disabled it keeps it disabled."""
    was = gc.isenabled()
    try:
        gc.enable() if enabled else gc.disable()
        _GC_SEEN.clear()
        x = np.arange(128 * 4, dtype=np.float32).reshape(128, 4)
        np.testing.assert_array_equal(notes_the_gc.simulate(x)[0], x)
        assert _GC_SEEN == [False] and gc.isenabled() is enabled
        with pytest.raises(nsim.NsimError):
            out_of_bounds.simulate(np.zeros((256, 8), np.float32))
        assert gc.isenabled() is enabled
    finally:
        gc.enable() if was else gc.disable()


def test_the_loops_option_is_checked():
    with pytest.raises(nsim.NsimError, match="loops='fold'"):
        scale_rows.options(loops="fold")


# ---------------------------------------------------------------------------------------------------------------
# The sanitizer's affine_range check (NSIM-W504) with loops kept
@nki.jit
def conflicting(x):
    out = nl.ndarray((128, x.shape[1]), x.dtype, buffer=nl.shared_hbm)
    scratch = nl.ndarray((128, x.shape[1]), x.dtype, buffer=nl.sbuf)
    for i in nl.affine_range(x.shape[0] // 128):
        nisa.dma_copy(dst=scratch, src=x[i * 128:(i + 1) * 128, :])  # every iteration writes scratch
    nisa.dma_copy(dst=out, src=scratch)
    return out


def test_the_affine_write_check_reports_the_same_with_loops_kept():
    x = np.random.default_rng(6).standard_normal((512, 8)).astype(np.float32)
    reports = []
    for mode in ("unroll", "keep"):
        with pytest.warns(tracer.CheckWarning) as w:
            conflicting.options(loops=mode).simulate(x)
        reports.append(sorted(r.message.report["check"] for r in w))
    assert reports[0] == reports[1] and "affine-write-conflict" in reports[0]
    # without the sanitizer the loop stays a loop, as a sequential one (verify_kernel would reject it as affine)
    k = conflicting.options(loops="keep", check=False).to_json(x)
    [lp] = _loops(k)
    assert lp["kind"] == "sequential"


def _head_rows(b1, two_apart):
    """A Beta-1 kernel launched on a grid of 2: program `pid` writes row block 2 pid + j (j = 0, 1) of `out` in an
    affine_range, through two stores of one tensor (its two halves of 64 rows) -- the public flash_fwd's
    `o[batch, head_id * q_h_per_k_h + i_q_h, ...]`. `two_apart`: the second store writes the first half of the next
    row block instead, which the next iteration's first store writes too (a conflict across iterations)."""
    bnki, bnl, bnisa = b1

    def head_rows(x):
        pid = bnl.program_id(0)
        out = bnl.ndarray((5 * 128, 128), x.dtype, buffer=bnl.shared_hbm)
        for j in bnl.affine_range(2):
            base = (pid * 2 + j) * 128
            t = bnl.load(x[base:base + 128, :])
            off = 128 if two_apart else 64
            bnl.store(out[base:base + 64, :], value=t[0:64, :])
            bnl.store(out[base + off:base + off + 64, :], value=t[64:128, :])
        return out

    return bnki.jit(head_rows)


def test_the_affine_write_check_takes_a_launch_grids_index_as_fixed(b1):
    # Two stores of one tensor in the body, rows 2 pid + j: apart across the iterations of j whatever pid is (pid
    # does not move while the loop runs). The check used to take pid's whole range into the window, could not show
    # it, and unrolled the loop to check it exactly: with the sanitizer on (simulate()'s default) the public
    # flash_fwd traced 2.4x longer and its simulated time moved (1,497,056.7 against 1,477,444.7 ns at seq 2048).
    k = _head_rows(b1, two_apart=False)
    x = np.random.default_rng(7).standard_normal((4 * 128, 128)).astype(np.float32)
    checked = k[2].options(loops="keep", check=True).to_json(x)
    assert any(lp["kind"] == "affine" for lp in _loops(checked))
    assert checked == k[2].options(loops="keep", check=False).to_json(x)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error", tracer.CheckWarning)
        np.testing.assert_array_equal(k[2].options(loops="keep").simulate(x)[0][:4 * 128], x)


def test_the_affine_write_check_still_reports_writes_meeting_across_iterations_of_a_grid_program(b1):
    k = _head_rows(b1, two_apart=True)
    x = np.random.default_rng(8).standard_normal((4 * 128, 128)).astype(np.float32)
    with pytest.warns(tracer.CheckWarning, match="NSIM-W504") as w:
        k[2].options(loops="keep").simulate(x)
    assert any(r.message.report["check"] == "affine-write-conflict" for r in w)


def test_an_affine_loop_writing_disjoint_slices_stays_affine_with_the_sanitizer_on():
    k = K.KERNELS["flash_attention_gqa"][0]
    kj = k.options(loops="keep").to_json(*K.flash_attention_gqa_inputs(hq=2, hkv=1, s=256))
    assert any(lp["kind"] == "affine" for lp in _loops(kj))


@nki.jit
def prints_index(x):
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(x.shape[0] // 128):
        print("block", i)
        t = nl.ndarray((128, x.shape[1]), x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x[i * 128:(i + 1) * 128, :])
        nisa.dma_copy(dst=out[i * 128:(i + 1) * 128, :], src=t)
    return out


def test_printing_the_index_unrolls_the_loop(capsys):
    x = np.zeros((384, 8), np.float32)
    k = prints_index.options(loops="keep", timing_only=True).to_json(x)
    assert not _loops(k)
    # the attempt that kept the loop stopped in the middle of the first print (a new attempt prints again)
    assert capsys.readouterr().out.endswith("block 0\nblock 1\nblock 2\n")


def test_eager_values_after_kept_loops_match_the_simulation(monkeypatch):
    """The eager session runs kept loops (every iteration): the library flash attention replayed through it
    gives the simulation's outputs bit for bit."""
    got = {}
    orig = tracer.Tracer.name_shared_tiles

    def hook(self):
        for t in self.tensors:
            if t["kind"] != "input":
                got[t["name"]] = self.eager().values(tracer.NkiTensor(self.storage[t["name"]], None, self))
        return orig(self)

    monkeypatch.setattr(tracer.Tracer, "name_shared_tiles", hook)
    with nsim.options(loops="keep"):
        out = K.flash_attention(*K.flash_attention_inputs(1))
    assert _loops(K.flash_attention.last_json)
    assert len(got) == 1
    np.testing.assert_array_equal(next(iter(got.values())), out)


@nki.jit
def _cast_then_scale(x):
    """Per row block: load (fp32), cast to bf16 dropping the fp32 tile right away (`t = c`), scale, store.
    The loaded tile and the scaled tile have one shape and dtype but come from different lines."""
    out = nl.ndarray(x.shape, nl.float32, buffer=nl.shared_hbm)
    for i in nl.affine_range(x.shape[0] // 128):
        t = nl.ndarray((128, x.shape[1]), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x[i * 128:(i + 1) * 128, :])
        c = nl.ndarray((128, x.shape[1]), nl.bfloat16, buffer=nl.sbuf)
        nisa.tensor_copy(dst=c, src=t)
        t = c
        r = nl.ndarray((128, x.shape[1]), nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=r, data=t, op0=nl.multiply, operand0=2.0)
        nisa.dma_copy(dst=out[i * 128:(i + 1) * 128, :], src=r)
    return out


@pytest.mark.parametrize("depth", [2, 4])
def test_unrolled_trace_rotates_each_lines_tiles_over_its_storages(depth):
    # Unrolled, the tracer hands a dead tile's storage only to a later tile of the same line (and kind), and
    # never to one of the line's latest compiler.loop_buffers - 1 tiles: the loaded tile `t` is dropped right
    # after its cast, yet each line keeps that many storages (4 on trn2; 2: double buffering), and the fp32
    # input and fp32 result (same shape, other lines) never share one (that would order the next block's load
    # behind this block's store).
    x = np.random.default_rng(0).standard_normal((128 * 6, 256)).astype(np.float32)
    kern = _cast_then_scale.options(loops="unroll", overrides=["compiler.loop_buffers={}".format(depth)])
    k = kern.to_json(x)
    names = [s["alloc"]["name"] for s, _ in _walk(k["body"]) if "alloc" in s]
    assert len(names) == 3 * depth, names  # 3 lines x depth storages, for 6 iterations
    ops = [s for s, _ in _walk(k["body"]) if "op" in s]

    def name(v):
        return v if isinstance(v, str) else v["tensor"]

    loads = [name(o["dst"]) for o in ops if o["op"] == "dma_copy" and name(o["src"]) == "x"]
    assert len(loads) == 6 and len(set(loads)) == depth, loads
    assert loads == [loads[i % depth] for i in range(6)], loads  # consecutive blocks take the storages in turn
    results = {name(o["dst"]) for o in ops if o["op"] == "tensor_scalar"}
    assert len(results) == depth and not results & set(loads), (results, loads)
    out, _ = kern.simulate(x)
    ref = (x.astype(ml_dtypes.bfloat16).astype(np.float32) * 2).astype(np.float32)
    np.testing.assert_allclose(out, ref, rtol=1e-2)


def test_kept_loop_with_an_unrolled_inner_loop_simulates_as_unrolled():
    # examples/defects/pairs.py's fp32 matmul: the output-column loop j is kept, the K-tile loop inside it
    # unrolled in each pass of j's body; its load line rotates over two storages within the pass, which keep
    # one buffer each in the kept loop, so kept and unrolled traces use the same storages and times.
    pairs = _load_example(os.path.join(ROOT, "examples", "defects", "pairs.py"), "nsim_defect_pairs_inner")
    pair = next(p for p in pairs.PAIRS if p.kind == "fp32_matmul")
    args = pair.inputs()
    (_ku, ou, pu), (kk, ok, pk) = _both_ways(pair.before, args, timing_only=False)
    _assert_same_outputs(ou, ok)
    assert _loops(kk), "the j loop is kept"
    assert pk.total_time_ns == pytest.approx(pu.total_time_ns, rel=1e-9)


def test_count_ops_counts_a_loops_ops_once_in_the_ir_and_once_per_iteration_executed():
    body = [{"op": "memset"},
            {"loop": {"var": "i", "start": 1, "stop": 7, "step": 2, "body": [  # 3 iterations
                {"op": "dma_copy"}, {"alloc": {"name": "t"}},
                {"loop": {"var": "j", "stop": 4, "body": [{"op": "nc_matmul"}, {"op": "tensor_copy"}]}}]}}]
    assert tracer.count_ops(body) == (4, 1 + 3 * (1 + 4 * 2))



def test_a_kernel_traced_again_starts_from_its_loop_decisions():
    # the first trace finds that the loop must be peeled (`if i == 0`) by a second attempt, and paired (its body
    # allocates a tile) by a third; tracing the kernel again with arguments of the same kind starts from those
    # decisions: one attempt, the same IR
    x = np.random.default_rng(5).standard_normal((512, 64)).astype(np.float32)
    k = first_iteration_special.options(loops="keep", check=False)
    tracer._LOOP_PLANS.clear()  # (an earlier test may have traced it so)
    del ATTEMPTS[:]
    first = k.to_json(x)
    assert len(ATTEMPTS) == 3
    del ATTEMPTS[:]
    assert k.to_json(x) == first
    assert len(ATTEMPTS) == 1
    np.testing.assert_allclose(k(x), x.reshape(4, 128, 64).sum(0), rtol=1e-5)
    # another shape is another kind of argument: its decisions are found again
    del ATTEMPTS[:]
    k.to_json(x[:384])
    assert len(ATTEMPTS) == 2


def test_a_grid_launched_beta1_kernel_traced_again_starts_from_its_loop_decisions(b1):
    # kernel[2] makes a new launch of the grid each time (the public samples' `flash_fwd[1, 8]`); the loop decisions
    # of its last trace were kept per launch function, so each `kernel[2]` found them again by retries (7 retries,
    # ~0.9 s of the public flash_fwd's trace at S=16384). They are kept per kernel function and grid now.
    bnki, bnl, bnisa = b1
    attempts = []

    def rows(x):
        attempts.append(1)
        pid = bnl.program_id(0)
        out = bnl.ndarray((128, 64), x.dtype, buffer=bnl.shared_hbm)
        acc = bnl.ndarray((128, 64), bnl.float32, buffer=bnl.sbuf)
        for i in bnl.sequential_range(4):
            t = bnl.load(x[pid * 512 + i * 128:pid * 512 + (i + 1) * 128, :])
            if i == 0:
                acc[...] = bnl.copy(t)
            else:
                acc[...] = bnl.add(acc, t)
        bnl.store(out, value=acc)
        return out

    k = bnki.jit(rows)
    x = np.random.default_rng(6).standard_normal((1024, 64)).astype(np.float32)
    tracer._LOOP_PLANS.clear()
    first = k[2].options(loops="keep").to_json(x)
    assert len(attempts) > 2  # (once per grid instance and attempt)
    del attempts[:]
    assert k[2].options(loops="keep").to_json(x) == first
    assert len(attempts) == 2  # one attempt: one run per grid instance
    del attempts[:]
    k[1].options(loops="keep").to_json(x)  # another grid: its decisions are found again
    assert len(attempts) > 1


# ---- loops recorded in pieces (docs/kernel-json.md "Loops recorded in pieces")

BODY_RUNS = []  # one entry per run of a test kernel's loop body (the Python that traces it)


def _kept_as_unrolled(kernel, args, want):
    """The kept trace of ``kernel`` against the unrolled one: the same outputs (``want``), executed ops and time;
    the kept kernel dict."""
    (ku, ou, pu), (kk, ok, pk) = _both_ways(kernel, args)
    _assert_same_outputs(ou, ok)
    np.testing.assert_array_equal(ok, want)
    assert _executed_ops(kk["body"]) == _executed_ops(ku["body"])
    assert pk.total_time_ns == pu.total_time_ns  # the same instructions over the same storages
    return kk


def _body_runs(kernel, *args, loops="keep"):
    """Runs of the loop body (BODY_RUNS) while ``kernel`` is traced once more (its loop decisions remembered) and the
    kernel dict traced."""
    kernel.options(loops=loops).trace(*args)
    BODY_RUNS.clear()
    k = kernel.options(loops=loops).trace(*args).kernel
    return len(BODY_RUNS), k


@nki.jit
def threshold_in_the_middle(x):
    """A comparison that changes at iteration 5 of 16, the body allocating nothing: the loop is peeled, and its
    middle is recorded as two loops, [1, 5) and [5, 15)."""
    n, f = x.shape
    out = nl.ndarray((n, f), x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray((128, f), x.dtype, buffer=nl.sbuf)
    for i in nl.sequential_range(n // 128):
        nisa.dma_copy(dst=t, src=x[i * 128:(i + 1) * 128, :])
        if i < 5:
            nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=2.0)
        nisa.dma_copy(dst=out[i * 128:(i + 1) * 128, :], src=t)
    return out


def test_a_comparison_that_changes_in_the_middle_keeps_the_loop_in_pieces():
    x = np.random.default_rng(11).standard_normal((16 * 128, 64)).astype(np.float32)
    want = x.copy()
    want[:5 * 128] *= 2
    kk = _kept_as_unrolled(threshold_in_the_middle, (x,), want)
    # peeled (iterations 0 and 15 with their int index), the 14 between in two pieces
    assert sorted((lp["start"], lp["stop"]) for lp in _loops(kk)) == [(1, 5), (5, 15)]


@nki.jit
def scaled_from_row_block(x, first):
    """Each iteration allocates its tile; row blocks from ``first`` on are scaled (a causal-mask-like threshold)."""
    n, f = x.shape
    out = nl.ndarray((n, f), x.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(n // 128):
        BODY_RUNS.append(1)
        t = nl.ndarray((128, f), x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x[i * 128:(i + 1) * 128, :])
        if i >= first:
            nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=0.5)
        nisa.dma_copy(dst=out[i * 128:(i + 1) * 128, :], src=t)
    return out


def test_pieces_that_allocate_tiles_are_written_out_as_unrolled_from_few_runs_of_the_body():
    """Pieces of a loop whose body allocates tiles are written out iteration by iteration (as a loop, each piece's
    tiles would take rotating buffers of their own): the unrolled trace's instructions, storages and time, from a
    few runs of the Python body per piece instead of one per iteration."""
    x = np.random.default_rng(12).standard_normal((32 * 128, 64)).astype(np.float32)
    want = x.copy()
    want[11 * 128:] *= 0.5
    kk = _kept_as_unrolled(scaled_from_row_block, (x, 11), want)
    assert not _loops(kk)  # written out
    # the body runs a few times per piece (a pass per storage of a line, tracer._group: 4 on trn2, one more where
    # the last is not the last iteration's, and the passes a comparison narrowed), not 32 times
    runs, _ = _body_runs(scaled_from_row_block, x, 11)
    assert 0 < runs <= 16, runs
    assert _body_runs(scaled_from_row_block, x, 11, loops="unroll")[0] == 32


@nki.jit
def causal_row_blocks(x):
    """out[r, c] = x[r, c] where r >= c, else -9984: an affine_select whose offset moves with the loop index."""
    n, f = x.shape
    out = nl.ndarray((n, f), x.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(n // 128):
        BODY_RUNS.append(1)
        t = nl.ndarray((128, f), x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x[i * 128:(i + 1) * 128, :])
        m = nl.ndarray((128, f), x.dtype, buffer=nl.sbuf)
        nisa.affine_select(dst=m, pattern=[[-1, f]], channel_multiplier=1, on_true_tile=t, on_false_value=-9984.0,
                           cmp_op=nl.greater_equal, offset=i * 128)
        nisa.dma_copy(dst=out[i * 128:(i + 1) * 128, :], src=m)
    return out


def test_an_affine_select_offset_moving_with_the_index_is_written_out():
    x = np.random.default_rng(13).standard_normal((8 * 128, 512)).astype(np.float32)
    r, c = np.indices(x.shape)
    kk = _kept_as_unrolled(causal_row_blocks, (x,), np.where(r >= c, x, np.float32(-9984.0)))
    assert not _loops(kk)
    assert sorted(s["iimm"][0] for s, _ in _walk(kk["body"]) if s.get("op") == "affine_select") == \
        [128 * i for i in range(8)]
    runs, _ = _body_runs(causal_row_blocks, x)  # tracer._group() passes or one more (4 or 5 on trn2), not 8 times
    assert 0 < runs <= 5, runs


@nki.jit
def lower_triangle_blocks(x):
    """Two loops: block (i, j) is copied where j <= i, zeroed above the diagonal (a comparison of two indices)."""
    n, _ = x.shape
    nb = n // 128
    out = nl.ndarray((n, n), x.dtype, buffer=nl.shared_hbm)
    z = nl.ndarray((128, 128), x.dtype, buffer=nl.sbuf)
    nisa.memset(dst=z, value=0.0)
    t = nl.ndarray((128, 128), x.dtype, buffer=nl.sbuf)
    for i in nl.sequential_range(nb):
        BODY_RUNS.append(1)
        for j in nl.sequential_range(nb):
            if j <= i:
                nisa.dma_copy(dst=t, src=x[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128])
                nisa.dma_copy(dst=out[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128], src=t)
            else:
                nisa.dma_copy(dst=out[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128], src=z)
    return out


def test_a_comparison_of_two_loop_indices_gives_the_unrolled_outputs():
    x = np.random.default_rng(14).standard_normal((12 * 128, 12 * 128)).astype(np.float32)
    b = np.arange(x.shape[0]) // 128
    kk = _kept_as_unrolled(lower_triangle_blocks, (x,), np.where(b[None, :] <= b[:, None], x, 0))
    assert _loops(kk)  # the row blocks in pieces: below the diagonal, above it
    # the outer loop's thresholds differ at every index: after two one-iteration pieces (each a pass over the rest
    # of the range first, then the iteration) the rest runs unrolled, one run of the body per iteration
    runs = {}
    for singles in (tracer.MAX_SINGLE_PIECES, 1000):
        old, tracer.MAX_SINGLE_PIECES = tracer.MAX_SINGLE_PIECES, singles
        try:
            tracer._LOOP_PLANS.clear()
            runs[singles], kk2 = _body_runs(lower_triangle_blocks, x)
        finally:
            tracer.MAX_SINGLE_PIECES = old
        assert _executed_ops(kk2["body"]) == _executed_ops(kk["body"])
    assert runs[tracer.MAX_SINGLE_PIECES] < runs[1000], runs


@pytest.mark.parametrize("expr, var, value, want", [
    ("128*i + 64", "i", 3, 448),
    ("-512*k_i + 128*i - 2048", "i", 20, "-512*k_i + 512"),
    ("- i - 5", "i", 2, -7),
    ("i", "k", 1, "i"),
    ("2*i - 3*j", "j", 1, "2*i - 3"),
    ("2*i - 3*j", "i", 1, "-3*j + 2"),
])
def test_index_expressions_are_substituted_as_the_tracer_writes_them(expr, var, value, want):
    assert tracer._substituted(expr, var, value) == want


def test_a_body_that_changes_python_values_unrolls_its_loop():
    """Run twice with the symbolic index, a body that changes a plain Python value of the kernel (a counter, a list
    of offsets) leaves it as after two iterations; the loop is unrolled so that the value is that of every
    iteration (an audit's kernel divided by a counter incremented in an affine_range: a wrong mean). A body that
    leaves them alone keeps its loop."""
    @nki.jit
    def mean_of_blocks(a):
        out = nl.ndarray((128, 128), nl.float32, buffer=nl.shared_hbm)
        acc = nl.ndarray((128, 128), nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=acc, value=0.0)
        count, seen = 0, []
        for i in nl.affine_range(a.shape[1] // 128):
            t = nl.ndarray((128, 128), nl.float32, buffer=nl.sbuf)
            nisa.dma_copy(dst=t, src=a[:, i * 128:(i + 1) * 128])
            nisa.tensor_tensor(dst=acc, data1=acc, data2=t, op=nl.add)
            count += 1
        for j in nl.affine_range(2):
            seen.append(len(seen))
        nisa.tensor_scalar(dst=acc, data=acc, op0=nl.multiply, operand0=1.0 / count)
        nisa.tensor_scalar(dst=acc, data=acc, op0=nl.add, operand0=float(sum(seen)))
        nisa.dma_copy(dst=out, src=acc)
        return out

    @nki.jit
    def plain(a):
        out = nl.ndarray(a.shape, nl.float32, buffer=nl.shared_hbm)
        n = a.shape[1] // 128
        for i in nl.affine_range(n):
            t = nl.ndarray((128, 128), nl.float32, buffer=nl.sbuf)
            nisa.dma_copy(dst=t, src=a[:, i * 128:(i + 1) * 128])
            nisa.dma_copy(dst=out[:, i * 128:(i + 1) * 128], src=t)
        return out

    a = np.random.default_rng(3).standard_normal((128, 640)).astype(np.float32)
    got = mean_of_blocks.options(loops="keep")(a)
    np.testing.assert_allclose(got, a.reshape(128, 5, 128).mean(axis=1) + 1.0, rtol=1e-5, atol=1e-6)
    assert _loops(mean_of_blocks.options(loops="keep").to_json(a)) == []
    np.testing.assert_array_equal(plain.options(loops="keep")(a), a)
    assert len(_loops(plain.options(loops="keep").to_json(a))) == 1


@nki.jit
def blocked_pv(probs, v):
    """out = probs @ v block row by block row, as attention_naive's third pass: each [128, S] row block of probs is
    transposed block by block on TensorE (PSUM), copied to SBUF and accumulated into one PSUM tile. The inner
    loop's ``accumulate=j > 0`` peels it, and its tiles are taken nb times per outer iteration."""
    s, d = v.shape
    nb = s // 128
    out = nl.ndarray((s, d), v.dtype, buffer=nl.shared_hbm)
    v_sb = nl.ndarray((128, nb, d), v.dtype, buffer=nl.sbuf)
    for j in nl.affine_range(nb):
        nisa.dma_copy(dst=v_sb[:, j, :], src=v[j * 128:(j + 1) * 128, :])
    for i in nl.affine_range(nb):
        pr = nl.ndarray((128, s), probs.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=pr, src=probs[i * 128:(i + 1) * 128, :])
        o_ps = nl.ndarray((128, d), nl.float32, buffer=nl.psum)
        for j in nl.sequential_range(nb):
            tp = nl.ndarray((128, 128), probs.dtype, buffer=nl.psum)
            nisa.nc_transpose(dst=tp, data=pr[:, j * 128:(j + 1) * 128])
            p_t = nl.ndarray((128, 128), probs.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=p_t, src=tp)
            nisa.nc_matmul(dst=o_ps, stationary=p_t, moving=v_sb[:, j, :], accumulate=j > 0)
        o_t = nl.ndarray((128, d), v.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=o_t, src=o_ps)
        nisa.dma_copy(dst=out[i * 128:(i + 1) * 128, :], src=o_t)
    return out


@pytest.mark.parametrize("nb", [4, 5, 10, 12])
def test_a_line_taken_unevenly_per_iteration_rotates_as_unrolled(nb):
    """A kept loop whose body takes a line's tiles m times per iteration (an inner loop written out) shares the
    line's rotating buffers D among them ("site_count"): every iteration takes them in the same turn. The unrolled
    trace rotates on across iterations; when m and D divide neither the other (m = 5 with D = 4 in SBUF, any odd
    m >= 3 with D = 2 in PSUM) the last tile of an iteration and the first of the next took one storage, and the
    next iteration's transpose waited for the previous iteration's last matmul: this kernel at nb = 5 ran 9,159.3 ns
    kept against 8,414.4 ns unrolled (attention_naive, whose third pass this is, at S = 1152 with 2 / 2 heads:
    121,735.1 against 114,971.4 ns). Such a loop is now peeled and its middle recorded in groups (or written out
    when short): the unrolled trace's storages and time. nb = 4 and 12 (D divides m) stay plain loops; nb = 10 gives
    a group loop."""
    rng = np.random.default_rng(nb)
    s = 128 * nb
    probs = rng.random((s, s)).astype(ml_dtypes.bfloat16)
    v = rng.standard_normal((s, 64)).astype(ml_dtypes.bfloat16)
    (ku, ou, pu), (kk, ok, pk) = _both_ways(blocked_pv, (probs, v))
    _assert_same_outputs(ou, ok)
    np.testing.assert_allclose(np.asarray(ok, np.float32),
                               np.asarray(probs, np.float32) @ np.asarray(v, np.float32), rtol=2e-2, atol=2e-2)
    assert pk.total_time_ns == pu.total_time_ns
    outer = [lp for lp in _loops(kk) if lp["var"] == "i"]
    if nb % 4 == 0:  # a multiple of 4 tiles of each line per iteration: one loop over every row block
        assert [(lp["start"], lp["stop"]) for lp in outer] == [(0, nb)]
    elif nb == 5:  # peeled; its 3 middle iterations are fewer than two groups: written out
        assert outer == []
    else:  # peeled; its 8 middle iterations recorded as 2 groups of 4 row blocks per pass
        assert [lp["stop"] - lp["start"] for lp in outer] == [2]


def test_non_causal_gqa_kept_times_as_unrolled():
    """flash_attention_gqa without the causal mask, 4 query heads over 4 kv heads, S = 384: kept, the head loop's
    body allocates five PSUM lines with two buffers each (K^T transposes, Q transposes, scores, P^T, P V) in 8
    banks, so two of them share; the allocator alone let the P V accumulator take the K^T transposes' banks, and
    the next head's K^T transposes waited for this head's last P V (24,474.3 ns kept against 16,987.3 ns
    unrolled). The lowering now simulates each swap of two PSUM tiles' banks and keeps the fastest placement
    (compiler.placement_search: 16,987.3 ns, as unrolled); with the search off the kept loop is as slow as before."""
    args = K.flash_attention_gqa_inputs(0, hq=4, hkv=4, s=384, d=64, causal=False)
    t = {}
    for loops in ("keep", "unroll"):
        _out, prof = K.flash_attention_gqa.options(loops=loops, check=False, timing_only=True).simulate(*args)
        t[loops] = prof.total_time_ns
    assert t["keep"] <= 1.02 * t["unroll"], t
    _out, prof = K.flash_attention_gqa.options(loops="keep", check=False, timing_only=True,
                                               overrides=["compiler.placement_search=0"]).simulate(*args)
    assert prof.total_time_ns > 1.3 * t["unroll"], (prof.total_time_ns, t)
