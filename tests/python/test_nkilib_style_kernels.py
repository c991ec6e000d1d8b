"""Kernels written in the style of aws-neuron/nki-library (tests/python/kernels/nkilib_style_*.py: an RMSNorm, a
gated MLP, a LayerNorm and a decode attention, new dialect, sharded over LNC=2 by ``nl.program_id(0)``) run unchanged two ways: the
plain way (``import nki`` resolved by ``nsim.compat``, installed only while the fixture holds the modules) and
through the nki-library test harness (``nki_cpu_simulator`` aliased to ``nki``, ``nki.cpu_simulate(kernel)[lnc]
(**kwargs)``). Outputs are compared with numpy; LNC=2 gives the same bits as LNC=1 and shortens the run as the
sharding implies; the MLP's and the attention's matmul counts are the ones their tilings imply. Also the sanitizer's affine-range check
on a reshaped HBM view (the kernels' ``out.reshape((B * S, H))`` row tiles), which these kernels exposed."""
import builtins
import contextlib
import importlib.util
import os
import sys

import numpy as np
import pytest

from conftest import beta1_modules, require_core  # noqa: E402

_core, ml_dtypes = require_core()
from numeric_helpers import close  # noqa: E402

import nsim.tracer  # noqa: E402

BF16 = ml_dtypes.bfloat16
KERNELS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels")
FILES = ("nkilib_style_rmsnorm.py", "nkilib_style_mlp.py", "nkilib_style_layernorm.py",
         "nkilib_style_attention_tkg.py")
HARNESS_MODULES = ("nki", "nki.language", "nki.isa", "nki.isa.constants", "nki.typing", "nki.compiler", "nki.dtype",
                   "nki.tensor")


@pytest.fixture(scope="module")
def plain():
    """The three kernel modules imported with ``import nki`` resolved by nsim.compat: {file stem: module}."""
    with beta1_modules(*[os.path.join(KERNELS, f) for f in FILES]) as mods:
        yield {os.path.splitext(f)[0].replace("nkilib_style_", ""): m for f, m in zip(FILES, mods)}


@contextlib.contextmanager
def _harness_modules():
    """What nki-library's test/utils/simulation_setup.py does: the ``nki_cpu_simulator`` modules under the ``nki``
    names and ``builtins.builtin``; then the kernel files imported. sys.modules and builtins restored afterwards."""
    import nki_cpu_simulator.nki
    import nki_cpu_simulator.nki.builtin
    import nki_cpu_simulator.nki.compiler
    import nki_cpu_simulator.nki.isa
    import nki_cpu_simulator.nki.isa.constants
    import nki_cpu_simulator.nki.language
    import nki_cpu_simulator.nki.language.dtypes
    import nki_cpu_simulator.nki.tensor
    import nki_cpu_simulator.nki.typing

    cs = nki_cpu_simulator.nki
    saved = {n: sys.modules.get(n) for n in HARNESS_MODULES}
    had_builtin, old_builtin = hasattr(builtins, "builtin"), getattr(builtins, "builtin", None)
    for name, mod in zip(HARNESS_MODULES, (cs, cs.language, cs.isa, cs.isa.constants, cs.typing, cs.compiler,
                                           cs.language.dtypes, cs.tensor)):
        sys.modules[name] = mod
    builtins.builtin = cs.builtin
    mods = {}
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("NKI_NC_VERSION", "gen3")
            for f in FILES:
                name = "nsim_test_harness_" + os.path.splitext(f)[0]
                spec = importlib.util.spec_from_file_location(name, os.path.join(KERNELS, f))
                mod = importlib.util.module_from_spec(spec)
                sys.modules[name] = mod
                spec.loader.exec_module(mod)
                mods[os.path.splitext(f)[0].replace("nkilib_style_", "")] = mod
            yield cs, mods
    finally:
        for mod in mods.values():
            sys.modules.pop(mod.__name__, None)
        for name, mod in saved.items():
            if mod is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = mod
        if had_builtin:
            builtins.builtin = old_builtin
        elif hasattr(builtins, "builtin"):
            del builtins.builtin


@pytest.fixture(scope="module")
def harness():
    """(the harness's ``nki`` = nki_cpu_simulator.nki, {file stem: kernel module imported under it})."""
    with _harness_modules() as h:
        yield h


def _randn(shape, dtype, seed, scale=1.0, shift=0.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale + shift).astype(dtype)


def _bits(a):
    a = np.asarray(a)
    return a.view(np.uint16 if a.dtype.itemsize == 2 else np.uint32)


def _ratio(kernel, lnc_args):
    """Run ``kernel`` at LNC 1 and 2: (outputs, total times, the LNC=2 profile)."""
    outs, times = [], []
    for lnc in (1, 2):
        outs.append(kernel[lnc](*lnc_args))
        times.append(kernel.last_profile.total_time_ns)
    return outs, times, kernel.last_profile


# --------------------------------------------------------------------------------------------------
# RMSNorm
# --------------------------------------------------------------------------------------------------

RMS_CASES = [((2, 128, 512), np.float32), ((1, 200, 1024), BF16), ((3, 100, 256), np.float32),
             ((2, 200, 2048), BF16)]


@pytest.mark.parametrize("lnc", [1, 2])
@pytest.mark.parametrize("shape,dtype", RMS_CASES)
def test_rmsnorm_matches_numpy(plain, shape, dtype, lnc):
    """Row tiles with a ragged tail (200 and 300 rows; row tiles crossing the batch boundary of the reshaped
    [B*S, H] view), H of 1 to 4 ScalarE tiles accumulated in the registers (2048 = reset_reduce then three
    reduce), gamma broadcast by a stride-0 HBM pattern; under LNC=2 each program takes half the rows."""
    mod = plain["rmsnorm"]
    x = _randn(shape, dtype, seed=shape[1])
    g = _randn(shape[-1:], dtype, seed=7)
    out = mod.rmsnorm_cte[lnc](x, g)
    assert out.shape == shape and out.dtype == dtype
    close(out, mod.reference(x, g), dtype)


def test_rmsnorm_reduce_cmd_chain_matters(plain):
    """The kernel's sum of squares over H = 1024 is two activations chained through the ScalarE registers
    (reset_reduce, then reduce): were the second to reset them, rstd would miss half the row. Rows whose first
    half is zero tell the two apart."""
    mod = plain["rmsnorm"]
    x = _randn((1, 128, 1024), np.float32, seed=3)
    x[..., :512] = 0.0
    g = np.ones(1024, np.float32)
    out = mod.rmsnorm_cte(x, g)
    close(out, mod.reference(x, g))
    wrong = x / np.sqrt((x[..., 512:] ** 2).sum(-1, keepdims=True) / 512 + 1e-6)  # only one tile counted
    assert not np.allclose(out, wrong, rtol=1e-3)


def test_rmsnorm_harness(harness, plain):
    """Through nki.cpu_simulate(kernel)[lnc](**kwargs): the same numbers as numpy, bit-identical to the plain
    run, for LNC 1 and 2."""
    nki, mods = harness
    assert mods["rmsnorm"].nki is nki and mods["rmsnorm"].nisa is nki.isa  # imported under the harness's aliases
    x = _randn((2, 200, 1024), BF16, seed=11)
    g = _randn((1024,), BF16, seed=12)
    want = plain["rmsnorm"].rmsnorm_cte(x, g)
    for lnc in (1, 2):
        out = nki.cpu_simulate(mods["rmsnorm"].rmsnorm_cte)[lnc](hidden=x, gamma=g, eps=1e-6)
        assert isinstance(out, np.ndarray) and out.shape == x.shape and out.dtype == BF16
        close(out, mods["rmsnorm"].reference(x, g), BF16)
        np.testing.assert_array_equal(_bits(out), _bits(want))


def test_rmsnorm_lnc2_halves_time(plain):
    """4096 rows: 32 row tiles, 16 per program under LNC=2. The kernel is a stream of independent row tiles
    (each program also loads gamma once), so two cores take about half the time of one; each core's own time is
    about the same; the outputs are the same bits."""
    mod = plain["rmsnorm"]
    x = _randn((4, 1024, 1024), BF16, seed=5)
    g = _randn((1024,), BF16, seed=6)
    (o1, o2), (t1, t2), prof = _ratio(mod.rmsnorm_cte, (x, g))
    np.testing.assert_array_equal(_bits(o1), _bits(o2))
    assert prof.cores == 2
    assert 0.45 * t1 < t2 < 0.6 * t1, (t1, t2)
    c0, c1 = prof.core_times_ns
    assert abs(c0 - c1) < 0.1 * max(c0, c1), prof.core_times_ns


def _check_quant(q, scales, want_q, want_scales):
    """fp8 values: equal to numpy's but for rare one-ulp differences at rounding ties (the kernel's y is fp32
    arithmetic, numpy's float64 rounded); scales at fp32 tolerance."""
    close(scales, want_scales)
    got, want = np.asarray(q, np.float32), np.asarray(want_q, np.float32)
    assert (got == want).mean() > 0.999
    np.testing.assert_array_less(np.abs(got - want), np.abs(want) / 8 + 1e-6)  # e4m3: 3 mantissa bits


@pytest.mark.parametrize("lnc", [1, 2])
@pytest.mark.parametrize("shape,dtype", [((2, 128, 512), np.float32), ((1, 200, 1024), BF16)])
def test_rmsnorm_quant_matches_numpy(plain, harness, shape, dtype, lnc):
    """RMSNorm + per-row fp8 quantization (a tuple of two shared_hbm outputs, float8_e4m3 and float32), plain and
    through the harness; an all-zero row gets the floor scale 1e-6 / 240 and zeros."""
    mod = plain["rmsnorm"]
    x = _randn(shape, dtype, seed=41)
    x[0, 3] = 0
    g = _randn(shape[-1:], dtype, seed=42)
    want_q, want_s = mod.reference_quant(x, g)
    q, sc = mod.rmsnorm_quant_cte[lnc](x, g)
    assert q.dtype == np.dtype(ml_dtypes.float8_e4m3) and q.shape == shape and sc.shape == shape[:2] + (1,)
    _check_quant(q, sc, want_q, want_s)
    assert sc[0, 3, 0] == np.float32(np.float32(1e-6) * np.float32(1 / 240.0)) and not np.asarray(q[0, 3], np.float32).any()
    nki, mods = harness
    hq, hs = nki.cpu_simulate(mods["rmsnorm"].rmsnorm_quant_cte)[lnc](hidden=x, gamma=g)
    np.testing.assert_array_equal(hq.view(np.uint8), q.view(np.uint8))
    np.testing.assert_array_equal(hs, sc)


@pytest.mark.parametrize("shape,dtype", [((4, 1, 1024), np.float32), ((2, 3, 2048), BF16), ((64, 2, 512), np.float32)])
def test_rmsnorm_tkg_sendrecv(plain, harness, shape, dtype):
    """Decode RMSNorm with the hidden dim split between the LNC=2 programs, which exchange their partial sums
    of squares with nisa.sendrecv: LNC 1 and 2, plain and through the harness, all match numpy (not
    bit-for-bit with each other: the two halves are summed separately)."""
    x = _randn(shape, dtype, seed=61)
    g = _randn(shape[-1:], dtype, seed=62)
    nki, mods = harness
    for lnc in (1, 2):
        for out in (plain["rmsnorm"].rmsnorm_tkg[lnc](x, g),
                    nki.cpu_simulate(mods["rmsnorm"].rmsnorm_tkg)[lnc](hidden=x, gamma=g)):
            assert out.shape == shape and out.dtype == dtype
            close(out, plain["rmsnorm"].reference(x, g), dtype)


def test_rmsnorm_tkg_lnc2_time(plain):
    """One token, H = 8192: each program squares, normalises and moves half the row, so LNC=2 cuts the time
    although the exchange of the partial sums adds a round trip (0.61 of LNC=1 when written)."""
    x = _randn((1, 1, 8192), BF16, seed=63)
    g = _randn((8192,), BF16, seed=64)
    (o1, o2), (t1, t2), prof = _ratio(plain["rmsnorm"].rmsnorm_tkg, (x, g))
    close(o2, o1, BF16)
    assert prof.cores == 2
    assert 0.45 * t1 < t2 < 0.75 * t1, (t1, t2)


# --------------------------------------------------------------------------------------------------
# gated MLP
# --------------------------------------------------------------------------------------------------

# (B, S, H, I), dtype
MLP_CASES = [((1, 128, 256, 512), np.float32), ((2, 200, 512, 384), BF16), ((1, 96, 1024, 256), BF16)]


def _mlp_inputs(B, S, H, I, dtype, seed=0):
    x = _randn((B, S, H), dtype, seed)
    wg = _randn((H, I), dtype, seed + 1, scale=1 / np.sqrt(H))
    wu = _randn((H, I), dtype, seed + 2, scale=1 / np.sqrt(H))
    wd = _randn((I, H), dtype, seed + 3, scale=1 / np.sqrt(I))
    return x, wg, wu, wd


def _mlp_matmuls(B, S, H, I, lnc):
    """nc_matmuls the tiling implies: per token tile (<= 128 tokens of one program), the gate and the up
    projection are (I/128 output tiles) x (H/128 contraction tiles) each, the down projection (H/512 PSUM-bank
    chunks, H if smaller) x (I/128 contraction tiles); the PE transposes of the tokens are nc_transpose, not
    counted. Programs take ceil(B*S/lnc) tokens each."""
    kt, it, hc = H // 128, I // 128, max(1, H // 512)
    per_tile = 2 * kt * it + it * hc
    per_prg = -(-B * S // lnc)
    tiles = 0
    for p in range(lnc):
        n = max(0, min(B * S, (p + 1) * per_prg) - p * per_prg)
        tiles += -(-n // 128)
    return tiles * per_tile


@pytest.mark.parametrize("lnc", [1, 2])
@pytest.mark.parametrize("dims,dtype", MLP_CASES)
def test_mlp_matches_numpy_and_matmul_count(plain, dims, dtype, lnc):
    """out = (silu(x Wg) * (x Wu)) Wd against numpy (its one bf16 rounding of h included), and the
    number of nc_matmuls equal to the tiling's (e.g. (2, 200, 512, 384) at LNC=1: 400 tokens = 4 token tiles of
    2*4*3 + 3*1 = 27 matmuls = 108; at LNC=2, 200 tokens per program = 2 tiles each, also 108)."""
    mod = plain["mlp"]
    x, wg, wu, wd = _mlp_inputs(*dims, dtype, seed=sum(dims))
    out = mod.mlp_cte[lnc](x, wg, wu, wd)
    assert out.shape == x.shape and out.dtype == dtype
    close(out, mod.reference(x, wg, wu, wd), dtype)
    prof = mod.mlp_cte.last_profile
    assert prof.stat("engine.matmul_instruction_count") == _mlp_matmuls(*dims, lnc)


def test_mlp_matmul_count_formula():
    """The expected counts of the test above, written out for two shapes (so the formula is checked too)."""
    assert _mlp_matmuls(2, 200, 512, 384, 1) == 4 * 27 == _mlp_matmuls(2, 200, 512, 384, 2)
    assert _mlp_matmuls(1, 128, 256, 512, 2) == 2 * (2 * 2 * 4 + 4)  # 64 tokens per program, one tile each
    assert _mlp_matmuls(2, 256, 1024, 512, 1) == 4 * (2 * 8 * 4 + 4 * 2)


def test_mlp_harness_and_lnc2(harness, plain):
    """Through the harness at LNC 1 and 2: numpy's numbers, bit-identical to the plain run; LNC=2 is faster than
    LNC=1 but not twice as fast (each program loads all three weight matrices)."""
    nki, mods = harness
    x, wg, wu, wd = _mlp_inputs(2, 256, 512, 512, BF16, seed=21)
    want = mods["mlp"].reference(x, wg, wu, wd)
    (p1, p2), (t1, t2), _prof = _ratio(plain["mlp"].mlp_cte, (x, wg, wu, wd))
    np.testing.assert_array_equal(_bits(p1), _bits(p2))
    assert 0.5 * t1 < t2 < 0.9 * t1, (t1, t2)
    for lnc in (1, 2):
        out = nki.cpu_simulate(mods["mlp"].mlp_cte)[lnc](hidden=x, gate_w=wg, up_w=wu, down_w=wd)
        close(out, want, BF16)
        np.testing.assert_array_equal(_bits(out), _bits(p1))


# --------------------------------------------------------------------------------------------------
# LayerNorm
# --------------------------------------------------------------------------------------------------

LN_CASES = [((2, 128, 512), np.float32), ((1, 200, 1024), BF16), ((3, 100, 256), np.float32)]


@pytest.mark.parametrize("lnc", [1, 2])
@pytest.mark.parametrize("shape,dtype", LN_CASES)
def test_layernorm_matches_numpy(plain, shape, dtype, lnc):
    """Mean and variance from bn_stats/bn_aggr (two 512-element chunks at H = 1024), rows with a non-zero mean
    (so a wrong mean broadcast shows), beta broadcast by stream shuffles; LNC=2 deals the row tiles round-robin."""
    mod = plain["layernorm"]
    x = _randn(shape, dtype, seed=shape[1], scale=2.0, shift=0.5)
    g = _randn(shape[-1:], dtype, seed=8)
    b = _randn(shape[-1:], dtype, seed=9)
    out = mod.layernorm_cte[lnc](x, g, b)
    assert out.shape == shape and out.dtype == dtype
    close(out, mod.reference(x, g, b), dtype)


def test_layernorm_harness_and_lnc2(harness, plain):
    """Through the harness (LNC 1 and 2) against numpy; 16 row tiles dealt round-robin: LNC=2 gives the same
    bits in about half the time, each core running the same number of VectorE instructions."""
    nki, mods = harness
    x = _randn((4, 512, 1024), BF16, seed=31, scale=2.0, shift=-1.0)
    g = _randn((1024,), BF16, seed=32)
    b = _randn((1024,), BF16, seed=33)
    want = mods["layernorm"].reference(x, g, b)
    for lnc in (1, 2):
        out = nki.cpu_simulate(mods["layernorm"].layernorm_cte)[lnc](hidden=x, gamma=g, beta=b)
        close(out, want, BF16)
    (o1, o2), (t1, t2), prof = _ratio(plain["layernorm"].layernorm_cte, (x, g, b))
    np.testing.assert_array_equal(_bits(o1), _bits(o2))
    np.testing.assert_array_equal(_bits(o1), _bits(out))
    assert 0.45 * t1 < t2 < 0.62 * t1, (t1, t2)
    assert prof.stat("core0.engine.vector.instruction_count") == prof.stat("core1.engine.vector.instruction_count")


# --------------------------------------------------------------------------------------------------
# the sanitizer's affine_range check through a reshaped HBM view
# --------------------------------------------------------------------------------------------------


def _row_copy_kernel(B, S, H, step):
    """Copies hidden [B, S, H] through its [B*S, H] view in row tiles of 128 starting every ``step`` rows (step
    128: disjoint tiles; step < 128: tiles that overlap, a real conflict between affine_range iterations)."""
    import nsim.nki as nki
    import nsim.nki.isa as nisa
    import nsim.nki.language as nl

    @nki.jit
    def row_copy(hidden):
        out = nl.ndarray(hidden.shape, dtype=hidden.dtype, buffer=nl.shared_hbm)
        x2, o2 = hidden.reshape((B * S, H)), out.reshape((B * S, H))
        for t in nl.affine_range(-(-(B * S - 128) // step) + 1):
            rows = min(128, B * S - t * step)
            s = nl.ndarray((128, H), dtype=hidden.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=s[:rows, :], src=x2[nl.ds(t * step, rows), :])
            nisa.dma_copy(dst=o2[nl.ds(t * step, rows), :], src=s[:rows, :])
        return out

    return row_copy


@pytest.mark.parametrize("B,S", [(2, 192), (4, 96), (2, 200)])
def test_affine_check_on_reshaped_rows(B, S):
    """Row tiles of the [B*S, H] view that cross a batch boundary are written as flat accesses of the [B, S, H]
    tensor, the others as [b, rows, :] boxes: the two kinds never share an element here, and the check compares
    them on the tensor's elements instead of calling every such pair a conflict (NSIM-W504, an error in the
    tests). (2, 192): tiles [128, 256) flat and [256, 384) a box of batch 1."""
    x = np.arange(B * S * 64, dtype=np.float32).reshape(B, S, 64)
    np.testing.assert_array_equal(_row_copy_kernel(B, S, 64, 128)(x), x)


def test_affine_check_on_reshaped_rows_still_reports_overlap():
    """Tiles of 128 rows every 96 rows overlap: iteration 1 (rows 96..224, crossing the batch boundary at 192:
    a flat access) rewrites rows 96..128 of iteration 0 (a box): still NSIM-W504."""
    x = np.ones((2, 192, 64), np.float32)
    with pytest.warns(nsim.tracer.CheckWarning, match="NSIM-W504 affine-write-conflict"):
        _row_copy_kernel(2, 192, 64, 96)(x)


# --------------------------------------------------------------------------------------------------
# decode attention
# --------------------------------------------------------------------------------------------------

# (B, Hq, Hkv, S, D), dtype
TKG_CASES = [((1, 8, 2, 512, 64), np.float32), ((2, 16, 4, 1024, 128), BF16), ((3, 4, 1, 256, 128), BF16)]


def _tkg_inputs(B, Hq, Hkv, S, D, dtype, seed):
    return (_randn((B, Hq, D), dtype, seed), _randn((B, Hkv, S, D), dtype, seed + 1),
            _randn((B, Hkv, S, D), dtype, seed + 2))


@pytest.mark.parametrize("lnc", [1, 2])
@pytest.mark.parametrize("dims,dtype", TKG_CASES)
def test_attention_tkg_matches_numpy_and_matmul_count(plain, dims, dtype, lnc):
    """GQA decode attention against numpy. Matmuls: per (batch, KV head) work item, S/512 Q.K^T chunks (one PSUM
    bank each; S if smaller) and S/128 P.V tiles accumulated in PSUM, e.g. (2, 16, 4, 1024, 128): 8 items x
    (2 + 8) = 80, the same under LNC=2 (the items are only dealt to two programs); the PE transposes of K and P
    are nc_transpose, not nc_matmul."""
    B, Hq, Hkv, S, D = dims
    mod = plain["attention_tkg"]
    q, k, v = _tkg_inputs(*dims, dtype, seed=S + Hq)
    out = mod.attention_tkg[lnc](q, k, v)
    assert out.shape == q.shape and out.dtype == dtype
    close(out, mod.reference(q, k, v), dtype)
    assert mod.attention_tkg.last_profile.stat("engine.matmul_instruction_count") == \
        B * Hkv * (max(1, S // 512) + S // 128)


def test_attention_tkg_harness_and_lnc2(harness, plain):
    """Through the harness at LNC 1 and 2, bit-identical to the plain run; 8 work items dealt 4 + 4: LNC=2
    takes well under LNC=1's time (less than half is not expected: each program's item chain is serial)."""
    nki, mods = harness
    q, k, v = _tkg_inputs(1, 32, 8, 2048, 128, BF16, seed=51)
    (o1, o2), (t1, t2), prof = _ratio(plain["attention_tkg"].attention_tkg, (q, k, v))
    np.testing.assert_array_equal(_bits(o1), _bits(o2))
    assert 0.45 * t1 < t2 < 0.7 * t1, (t1, t2)
    close(o1, mods["attention_tkg"].reference(q, k, v), BF16)
    for lnc in (1, 2):
        out = nki.cpu_simulate(mods["attention_tkg"].attention_tkg)[lnc](q=q, k=k, v=v)
        np.testing.assert_array_equal(_bits(out), _bits(o1))
