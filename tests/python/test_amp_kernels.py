"""Mixed-precision training utilities with non-finite handling, written like public NKI kernels
(tests/python/kernels/amp_kernels.py, Beta-1 dialect, and amp_kernels_new.py, new dialect; both unmodified, through
``nsim.compat``):

- dynamic loss scaling (Beta 1): gradients (bf16 / fp16, two tensors) unscaled by 1 / scale read at run time from a
  [1, 2] HBM state (scale, growth tracker), an all-finite flag over every gradient tile (``|g| <= FLT_MAX``, false
  for inf and NaN, max-reduced along the free axis, summed over the partitions by a ones matmul; or the x - x test,
  0 for finite and NaN for inf / NaN, reduced over the partitions by ``nl.transpose`` and a max-reduce), the GradScaler
  update of the state (backoff on overflow, growth after ``growth_interval`` good steps) computed branch free, and an
  SGD step that is skipped (``nl.where`` on the flag broadcast by a K = 1 matmul, or ``tensor_copy_predicated``
  with a uint8 predicate) when the flag is set;
- SGD with momentum / Nesterov and L2 weight decay on fp32 master weights with the gradient accumulated in fp32 over
  bf16 micro-batches and a bf16 copy written back, rounded to nearest even or stochastically (``nisa.rng`` bits added
  to the fp32 pattern viewed as uint32, then >> 16; checked to bracket the value and to be unbiased) (new dialect);
- EMA (Polyak averaging) of weights, clip-by-value, and the overflow-safe fp16 cast (clamp to +-65504 before the
  ``tensor_copy``); without the clamp nsim's NSIM-W505 cast-out-of-range fires (and W503, since -inf/+inf come out
  of finite inputs) (new dialect);
- the NaN semantics of max / min (element-wise and reductions) and of comparisons that these kernels rely on.

NaN semantics (the spec, /work/shared/spec/nki-api.md §2.0 / §3.5 / ``tensor_reduce``, states none: max/min are
"max, min", comparisons "1.0 if true else 0.0"; checked here against numpy): nsim's ``maximum`` / ``minimum``
propagate NaN from either operand as ``np.maximum`` / ``np.minimum`` do (not IEEE maxNum / fmax), max / min
reductions return NaN for a row with any NaN as ``np.max`` does, and comparisons are IEEE (every ordered compare
with NaN is false, ``not_equal`` true), so ``|x| <= FLT_MAX`` is a correct finiteness test and ``x - x != 0`` flags
inf and NaN. All of this equals numpy; whether the hardware's ALU max is NaN-propagating is not stated anywhere
we have (a difference here would silently change clip_by_value / relu of NaN, which propagate NaN in nsim as in
torch.clamp). The sanitizer does not report the inf/NaN these kernels compute from inf/NaN gradients (inputs not
finite), nor anything for the finiteness tests.

Checked: outputs against float64 numpy (fp32 1e-5, bf16 1e-2), the state update and skip bit for bit, no sanitizer
report on finite or non-finite gradients, the instruction / DMA counts the tiling implies, and Nesterov costing more
time than plain momentum in nsim's timing.

The nsim fixes this family needed: none (no nsim bug found by these kernels). Observed, not changed: W505 fires at
exactly the fp16 overflow threshold (65520 -> inf; 65519.99 -> 65504 is no report), but a finite fp32 value that
overflows bf16 (|x| >= 3.3961e38 -> inf, by ``tensor_copy`` or a casting DMA) gets only W503 nan-produced, not W505:
engines/check/checker.h scopes cast-out-of-range to integers and fp8/fp16 (``test_bf16_overflow_is_reported``
pins only that some report is made)."""
import warnings

import numpy as np
import pytest

from conftest import require_core, sample_fixture  # noqa: E402
from conftest import op_counts as _ops  # noqa: E402

_core, ml_dtypes = require_core()
from numeric_helpers import close, f64 as _f64, randn as _randn  # noqa: E402

BF16 = ml_dtypes.bfloat16
FP16 = np.float16

amp = sample_fixture("amp_kernels.py")
ampn = sample_fixture("amp_kernels_new.py", module_only=True)


def _run(k, *args, **kw):
    """Run kernel ``k`` with every warning (sanitizer reports included) an error."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = k(*args, **kw)
    for w in caught:
        raise AssertionError("unexpected warning: {}".format(w.message))
    return out


# --------------------------------------------------------------------------------------------------
# Dynamic loss scaling (Beta 1)
# --------------------------------------------------------------------------------------------------

def ref_scaler(grads, state, interval=3, backoff=0.5, growth=2.0):
    scale, tracker = float(state[0, 0]), float(state[0, 1])
    found = not all(np.isfinite(_f64(g)).all() for g in grads)
    if found:
        return [_f64(g) / scale for g in grads], 1.0, (scale * backoff, 0.0)
    tracker += 1
    if tracker >= interval:
        return [_f64(g) / scale for g in grads], 0.0, (scale * growth, 0.0)
    return [_f64(g) / scale for g in grads], 0.0, (scale, tracker)


@pytest.mark.parametrize("dtype", [BF16, FP16])
@pytest.mark.parametrize("poison", [None, "inf", "-inf", "nan"])
@pytest.mark.parametrize("tracker", [0.0, 2.0])
def test_unscale_check_update(amp, dtype, poison, tracker):
    m = amp[0]
    g1 = _randn((256, 64), dtype, seed=1, scale=512.0)
    g2 = _randn((384, 64), dtype, seed=2, scale=512.0)
    if poison is not None:  # one bad value, in the last tile of the second tensor, off partition 0
        g2[300, 37] = {"inf": np.inf, "-inf": -np.inf, "nan": np.nan}[poison]
    state = np.array([[1024.0, tracker]], np.float32)
    u1, u2, found, new_state = _run(m.unscale_check_update, g1, g2, state)
    want_u, want_f, want_s = ref_scaler([g1, g2], state)
    assert u1.dtype == np.float32 and found.shape == (1, 1) and new_state.shape == (1, 2)
    close(u1, want_u[0])
    np.testing.assert_array_equal(np.isnan(u2), np.isnan(want_u[1]))
    fin = np.isfinite(want_u[1])
    close(u2[fin], want_u[1][fin])
    assert found[0, 0] == want_f
    np.testing.assert_array_equal(new_state[0], np.array(want_s, np.float32))


def test_scaler_sequence(amp):
    """Five steps with an overflow at step 2: scale 1024 -> 1024 (t=1) -> 512 (backoff) -> 512 (1) -> 512 (2) ->
    1024 (growth after 3 good steps), the state fed back through HBM each step."""
    m = amp[0]
    state = np.array([[1024.0, 0.0]], np.float32)
    seen = []
    for step in range(6):
        g1 = _randn((256, 32), BF16, seed=10 + step, scale=100.0)
        g2 = _randn((256, 32), BF16, seed=20 + step, scale=100.0)
        if step == 1:
            g1[5, 3] = np.inf
        _, _, found, state = _run(m.unscale_check_update, g1, g2, state)
        seen.append((float(found[0, 0]), float(state[0, 0]), float(state[0, 1])))
    assert seen == [(0, 1024, 1), (1, 512, 0), (0, 512, 1), (0, 512, 2), (0, 1024, 0), (0, 1024, 1)]


def test_unscale_check_structure(amp):
    """2 + 3 gradient tiles: one load + one store each, the state load, the flag and state stores; one K = 1
    broadcast matmul and one ones matmul over the partitions; every gradient byte read once."""
    m = amp[0]
    g1 = _randn((256, 64), BF16, seed=1)
    g2 = _randn((384, 64), BF16, seed=2)
    _run(m.unscale_check_update, g1, g2, np.array([[8.0, 0.0]], np.float32))
    c = _ops(m.unscale_check_update)
    assert c["dma_copy"] == 2 * 5 + 1 + 2, c
    assert c["nc_matmul"] == 2, c
    prof = m.unscale_check_update.last_profile
    assert prof.stat("memory.hbm_read_bytes") == (256 + 384) * 64 * 2 + 8
    assert prof.stat("memory.hbm_write_bytes") == (256 + 384) * 64 * 4 + 4 + 8


@pytest.mark.parametrize("dtype", [BF16, FP16, np.float32])
@pytest.mark.parametrize("where", [None, (0, 0), (383, 63), (200, 7)])
def test_found_inf_transpose(amp, dtype, where):
    """The x - x test: inf, -inf and NaN anywhere (first / last element, a middle tile) set the flag, finite
    gradients (large ones too) do not; the NaN that x - x makes of an inf input is no sanitizer report."""
    m = amp[0]
    for val in ((np.inf, -np.inf, np.nan) if where else (None,)):
        g = _randn((384, 64), dtype, seed=3, scale=1000.0 if dtype != FP16 else 100.0)
        if where:
            g[where] = val
        found = _run(m.found_inf_transpose, g)
        assert found.shape == (1, 1) and found[0, 0] == (0.0 if where is None else 1.0), (where, val)
    c = _ops(m.found_inf_transpose)
    assert c["dma_copy"] == 3 + 1 and c["tensor_reduce"] == 3 + 1, c


@pytest.mark.parametrize("kernel", ["sgd_step_if_finite", "sgd_step_if_finite_predicated"])
@pytest.mark.parametrize("poison", [None, "inf", "nan"])
def test_sgd_step_skipped_when_not_finite(amp, poison, kernel):
    """found_inf from the scaler gates the step (``nl.where`` or ``tensor_copy_predicated``): finite -> p - lr g
    (fp32), else p unchanged bit for bit, even though the (discarded) update holds inf / NaN; no sanitizer report
    either way."""
    m = amp[0]
    step = getattr(m, kernel)
    p = _randn((384, 64), np.float32, seed=3)
    g = _randn((384, 64), BF16, seed=4, scale=64.0)
    if poison:
        g[130, 9] = np.inf if poison == "inf" else np.nan
    u, _, found, _ = _run(m.unscale_check_update, g, g[:128], np.array([[64.0, 0.0]], np.float32))
    out = _run(step, p, u, found, 0.1)
    if poison:
        assert found[0, 0] == 1.0
        np.testing.assert_array_equal(out.view(np.uint32), p.view(np.uint32))
    else:
        assert found[0, 0] == 0.0
        close(out, _f64(p) - 0.1 * _f64(g) / 64.0)
    c = _ops(step)
    assert c["nc_matmul"] == 1 and c["dma_copy"] == 1 + 2 * 3 + 3, c
    if kernel.endswith("predicated"):
        assert c["tensor_copy_predicated"] == 3, c


# --------------------------------------------------------------------------------------------------
# SGD momentum / Nesterov with gradient accumulation, EMA, clip, fp16 cast (new dialect)
# --------------------------------------------------------------------------------------------------

def ref_sgd(w, v, grads, lr, mu, wd, nesterov):
    g = _f64(grads).mean(0) + wd * _f64(w)
    v2 = mu * _f64(v) + g
    step = g + mu * v2 if nesterov else v2
    return _f64(w) - lr * step, v2


@pytest.mark.parametrize("nesterov", [True, False])
@pytest.mark.parametrize("M", [1, 4])
def test_sgd_accum_step(ampn, nesterov, M):
    N, F = 384, 96
    w = _randn((N, F), np.float32, seed=1)
    v = _randn((N, F), np.float32, seed=2, scale=0.1)
    grads = _randn((M, N, F), BF16, seed=3)
    wo, vo, wb = _run(ampn.sgd_accum_step, w, v, grads, 0.05, 0.9, 1e-2, nesterov)
    want_w, want_v = ref_sgd(w, v, grads, 0.05, 0.9, 1e-2, nesterov)
    close(wo, want_w)
    close(vo, want_v)
    assert wb.dtype == BF16
    # the bf16 copy is the kernel's own fp32 master weights rounded to nearest even
    np.testing.assert_array_equal(wb.view(np.uint16), wo.astype(BF16).view(np.uint16))
    close(wb, want_w, BF16)


def test_sgd_stochastic_rounding_brackets(ampn):
    """With stochastic rounding every bf16 weight is one of the two bf16 neighbours of the fp32 master weight
    (its truncation, or that plus one ulp in magnitude), and the fp32 outputs are those of the RNE variant."""
    N, F, M = 256, 128, 2
    w = _randn((N, F), np.float32, seed=11)
    v = _randn((N, F), np.float32, seed=12, scale=0.1)
    grads = _randn((M, N, F), BF16, seed=13)
    wo, vo, wb = _run(ampn.sgd_accum_step, w, v, grads, 0.05, 0.9, 1e-2, True, True)
    want_w, want_v = ref_sgd(w, v, grads, 0.05, 0.9, 1e-2, True)
    close(wo, want_w)
    close(vo, want_v)
    hi = (wo.view(np.uint32) >> 16).astype(np.int64)
    got = wb.view(np.uint16).astype(np.int64)
    assert np.isin(got - hi, [0, 1]).all()
    up = (got - hi).mean()
    assert 0.3 < up < 0.7, up  # about half the values round away from zero
    assert _ops(ampn.sgd_accum_step)["rng"] == N // 128


def test_sgd_stochastic_rounding_is_unbiased(ampn):
    """lr = 0 (weights unchanged): 1 + ulp/4 rounds up with probability 1/4 and -(1 + 3 ulp / 4) away from zero with
    probability 3/4 (16384 draws each, within 5 sigma), so the bf16 mean is the fp32 value."""
    N, F = 256, 128
    w = np.full((N, F), 1 + 2.0 ** -9, np.float32)
    w[128:] = -(1 + 3 * 2.0 ** -9)
    z = np.zeros((N, F), np.float32)
    g = np.zeros((1, N, F), BF16)
    _, _, wb = _run(ampn.sgd_accum_step, w, z, g, 0.0, 0.9, 0.0, True, True)
    b = wb.astype(np.float32)
    assert set(np.unique(b[:128])) == {1.0, 1.0078125} and set(np.unique(b[128:])) == {-1.0, -1.0078125}
    n = 128 * F
    for frac, got in ((0.25, (b[:128] > 1).mean()), (0.75, (b[128:] < -1).mean())):
        assert abs(got - frac) < 5 * np.sqrt(frac * (1 - frac) / n), (frac, got)


def test_sgd_accum_structure_and_timing(ampn):
    """3 row tiles, M = 4: per tile 2 + M loads and 3 stores, M accumulate adds; Nesterov adds one Vector op per
    tile and takes longer in nsim's timing."""
    N, F, M = 384, 256, 4
    w = _randn((N, F), np.float32, seed=1)
    v = _randn((N, F), np.float32, seed=2)
    grads = _randn((M, N, F), BF16, seed=3)
    _run(ampn.sgd_accum_step, w, v, grads, 0.01, 0.9, 0.0, True)
    cn = _ops(ampn.sgd_accum_step)
    t_nest = ampn.sgd_accum_step.last_profile.total_time_ns
    _run(ampn.sgd_accum_step, w, v, grads, 0.01, 0.9, 0.0, False)
    cp = _ops(ampn.sgd_accum_step)
    t_plain = ampn.sgd_accum_step.last_profile.total_time_ns
    NT = N // 128
    assert cn["dma_copy"] == NT * (2 + M + 3), cn
    assert cn["tensor_tensor"] == NT * M, cn
    assert cn["scalar_tensor_tensor"] == cp["scalar_tensor_tensor"] + NT, (cn, cp)
    assert t_nest > t_plain, (t_nest, t_plain)


def test_ema_update(ampn):
    ema = _randn((512, 64), np.float32, seed=5)
    w = _randn((512, 64), np.float32, seed=6)
    out = _run(ampn.ema_update, ema, w, 0.99)
    close(out, 0.99 * _f64(ema) + 0.01 * _f64(w))
    c = _ops(ampn.ema_update)
    assert c["dma_copy"] == 4 * 3 and c["tensor_scalar"] == 4 and c["scalar_tensor_tensor"] == 4, c


@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_clip_by_value(ampn, dtype):
    g = _randn((256, 128), dtype, seed=7, scale=2.0)
    g[3, 4] = np.inf
    g[200, 5] = -np.inf
    g[201, 6] = np.nan
    out = _run(ampn.clip_by_value, g, 0.5)
    want = np.clip(_f64(g), -0.5, 0.5)   # numpy (and torch.clamp) propagate NaN, clip infinities
    assert out.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(np.isnan(out.astype(np.float32)), np.isnan(want))
    assert out[3, 4] == 0.5 and out[200, 5] == -0.5
    ok = ~np.isnan(want)
    close(out[ok], want[ok], dtype)
    assert _ops(ampn.clip_by_value)["tensor_scalar"] == 2


def test_fp16_safe_cast(ampn):
    x = _randn((256, 64), np.float32, seed=8, scale=40000.0)
    assert (np.abs(x) > 65504).any()
    out = _run(ampn.cast_fp16, x, True)
    assert out.dtype == FP16 and np.isfinite(out).all()
    np.testing.assert_array_equal(out, np.clip(x, -65504, 65504).astype(FP16))
    assert _ops(ampn.cast_fp16)["tensor_scalar"] == 2


def test_fp16_unclamped_cast_warns(ampn):
    """Without the clamp the cast overflows to +-inf: NSIM-W505 cast-out-of-range fires (and W503, inf from finite
    inputs); in range values need no clamp and give no report."""
    x = _randn((256, 64), np.float32, seed=8, scale=40000.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = ampn.cast_fp16(x, False)
    msgs = [str(w.message) for w in caught]
    assert any("NSIM-W505" in s for s in msgs), msgs
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(np.isinf(out), np.isinf(x.astype(FP16)))
    small = _randn((256, 64), np.float32, seed=9, scale=100.0)
    np.testing.assert_array_equal(_run(ampn.cast_fp16, small, False), small.astype(FP16))


# --------------------------------------------------------------------------------------------------
# NaN semantics of max / min and comparisons
# --------------------------------------------------------------------------------------------------

NAN, INF = np.nan, np.inf
X = np.array([[NAN, 1, 2, 3], [1, NAN, 2, 0], [1, 2, 3, NAN], [INF, NAN, -INF, 0], [1, 2, 3, 4], [INF, -INF, 0, 5]],
             np.float32)
Y = np.array([[1, NAN, 5, 0], [NAN, NAN, 0, 0], [0, 0, 0, 0], [NAN, 0, 0, INF], [1, 2, 3, 4], [INF, 0, -INF, 1]],
             np.float32)


def test_nan_semantics_beta1(amp):
    """What nsim does (the spec is silent; numpy's semantics): maximum / minimum and max / min reductions propagate
    NaN, comparisons are IEEE (NaN compares false, != true), x - x is NaN exactly for inf / NaN. No sanitizer report:
    every NaN here comes from a NaN or inf input."""
    _, nki, nl, nisa = amp

    @nki.jit
    def nan_probe(x, y):
        P, F = x.shape
        outs = [nl.ndarray((P, F), dtype=nl.float32, buffer=nl.shared_hbm) for _ in range(9)]
        red = [nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.shared_hbm) for _ in range(2)]
        a = nl.load(x)
        b = nl.load(y)
        vals = [nl.maximum(a, b), nl.minimum(a, b), nl.greater(a, b, dtype=nl.float32),
                nl.less_equal(a, b, dtype=nl.float32), nl.equal(a, b, dtype=nl.float32),
                nl.not_equal(a, b, dtype=nl.float32), nl.maximum(a, 0.0),
                nl.not_equal(nl.subtract(a, a), 0.0, dtype=nl.float32),
                nl.less_equal(nl.abs(a), 3.4028234663852886e38, dtype=nl.float32)]
        for o, v in zip(outs, vals):
            nl.store(o, v)
        nl.store(red[0], nisa.tensor_reduce(np.max, a, axis=[1], keepdims=True))
        nl.store(red[1], nl.min(a, axis=[1], keepdims=True))
        return tuple(outs) + tuple(red)

    r = _run(nan_probe, X, Y)
    with np.errstate(invalid="ignore"):
        want = [np.maximum(X, Y), np.minimum(X, Y), X > Y, X <= Y, X == Y, X != Y, np.maximum(X, 0),
                (X - X) != 0, np.abs(X) <= np.finfo(np.float32).max,
                X.max(1, keepdims=True), X.min(1, keepdims=True)]
    for got, w in zip(r, want):
        np.testing.assert_array_equal(got, np.asarray(w, np.float32))
    # the finiteness tests agree with np.isfinite
    np.testing.assert_array_equal(r[7], ~np.isfinite(X))
    np.testing.assert_array_equal(r[8], np.isfinite(X))


def test_nan_semantics_new_dialect(b1):
    """The same through the new dialect's ISA calls: tensor_tensor maximum / minimum, tensor_scalar maximum with a
    scalar (relu-like) and tensor_reduce maximum propagate NaN as numpy; ``nisa.max8`` is not checked here."""
    import nki
    import nki.isa as nisa
    import nki.language as nl

    @nki.jit
    def nan_probe_new(x, y):
        P, F = x.shape
        o_max = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.shared_hbm)
        o_min = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.shared_hbm)
        o_ge = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.shared_hbm)
        o_red = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.shared_hbm)
        a = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
        b = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=a, src=x)
        nisa.dma_copy(dst=b, src=y)
        t = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=t, data1=a, data2=b, op=nl.maximum)
        nisa.dma_copy(dst=o_max, src=t)
        t2 = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=t2, data1=a, data2=b, op=nl.minimum)
        nisa.dma_copy(dst=o_min, src=t2)
        t3 = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=t3, data=a, op0=nl.greater_equal, operand0=0.0)
        nisa.dma_copy(dst=o_ge, src=t3)
        r = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=r, op=nl.maximum, data=a, axis=1, keepdims=True)
        nisa.dma_copy(dst=o_red, src=r)
        return o_max, o_min, o_ge, o_red

    mx, mn, ge, red = _run(nan_probe_new, X, Y)
    np.testing.assert_array_equal(mx, np.maximum(X, Y))
    np.testing.assert_array_equal(mn, np.minimum(X, Y))
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(ge, (X >= 0).astype(np.float32))
    np.testing.assert_array_equal(red, X.max(1, keepdims=True))


def test_bf16_overflow_is_reported(ampn):
    """fp16 overflow is W505 at exactly the rounding threshold; an fp32 -> bf16 overflow of a finite value is reported
    too (as W503: inf from finite inputs)."""
    import nki
    import nki.isa as nisa
    import nki.language as nl

    @nki.jit
    def to_dtype(x, dt):
        P, F = x.shape
        o = nl.ndarray((P, F), dtype=dt, buffer=nl.shared_hbm)
        a = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=a, src=x)
        b = nl.ndarray((P, F), dtype=dt, buffer=nl.sbuf)
        nisa.tensor_copy(dst=b, src=a)
        nisa.dma_copy(dst=o, src=b)
        return o

    x = np.full((128, 8), 65519.99, np.float32)
    assert (_run(to_dtype, x, FP16) == 65504).all()
    for dt, v, code in ((FP16, 65520.0, "NSIM-W505"), (BF16, 3.4e38, "NSIM-W503")):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = to_dtype(np.full((128, 8), v, np.float32), dt)
        assert np.isinf(out.astype(np.float32)).all()
        assert any(code in str(w.message) for w in caught), [str(w.message) for w in caught]
