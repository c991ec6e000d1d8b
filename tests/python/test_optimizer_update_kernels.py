"""Fused optimizer-step kernels written like public NKI training kernels (tests/python/kernels/optimizer_update_kernels.py,
Beta-1 dialect, and optimizer_update_kernels_new.py, new dialect; both unmodified, through ``nsim.compat``):

- AdamW fused over a flat parameter buffer viewed as [128, n / 128] (bf16 parameters, fp32 master weights and
  moments, bf16 gradients, decoupled weight decay, bias correction from a [1, 1] int32 step count in HBM; ragged
  last chunk by masks), and the same math as two passes (Beta 1);
- LAMB: moments and the Adam direction in pass 1 with per-partition sums of w^2 / u^2, the global norms by a ones
  matmul over the partitions, the trust ratio applied in pass 2 (Beta 1);
- global gradient-norm clipping over three gradient tensors with the AMP found_inf flag (int32), clipping skipped
  when the total is not finite (Beta 1);
- Lion and SGD with Nesterov momentum (new dialect, ragged row tiles by min-clamped slices);
- Adafactor with factored second moments, the column sums accumulated in PSUM by a ones-column matmul, the column
  factor broadcast by a K = 1 matmul, update clipping by RMS (new dialect).

Checked: outputs against float64 numpy (fp32 1e-5, bf16 1e-2), exact found_inf flags, no sanitizer report (also
none on inf / NaN gradients: the non-finite sums and NaNs are computed from non-finite inputs, which nsim's
sanitizer does not report), the instruction / DMA counts and the exact HBM bytes the tiling implies (an optimizer
step is memory bound), and the timing story: fused AdamW reads every state once, runs within 1.6x of its bytes over
nsim's HBM roof (never faster than it) and beats the two-pass version, which reads the moments twice, by more than
the extra bytes' time; Lion and SGD stream within 1.8x of the roof; Adafactor, serialised behind its global
reductions, does not (more than 2x).

The nsim fixes this family needed: none (no nsim bug found by these kernels)."""
import math

import numpy as np
import pytest

from conftest import require_core, run_clean, sample_fixture  # noqa: E402
from conftest import op_counts as _ops  # noqa: E402

_core, ml_dtypes = require_core()
from numeric_helpers import close, f64 as _f64, randn as _randn, rand as _rand  # noqa: E402

import nsim.plot  # noqa: E402

BF16 = ml_dtypes.bfloat16

ou = sample_fixture("optimizer_update_kernels.py")
oun = sample_fixture("optimizer_update_kernels_new.py", module_only=True)


def _roof_ns(nbytes, profile):
    """The time ``nbytes`` of HBM traffic take at the HBM roof of the profile's configuration."""
    return nbytes / nsim.plot.memory_roof(profile.config, profile.overrides) * 1e9


# --------------------------------------------------------------------------------------------------
# AdamW (Beta 1)
# --------------------------------------------------------------------------------------------------

def ref_adamw(w, g, m, v, t, lr=1e-3, b1=0.9, b2=0.999, eps=1e-8, wd=0.01):
    """torch.optim.AdamW in float64: (w', m', v')."""
    w, g, m, v = map(_f64, (w, g, m, v))
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    w = w * (1 - lr * wd) - lr * (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps)
    return w, m, v


def _adam_state(n, gdtype, seed):
    w = _randn(n, np.float32, seed)
    return (w.astype(BF16), w, _randn(n, gdtype, seed + 1), _randn(n, np.float32, seed + 2, 0.1),
            _rand(n, np.float32, seed + 3, 0.0, 0.01))


@pytest.mark.parametrize("kernel", ["adamw_fused", "adamw_two_pass"])
@pytest.mark.parametrize("n,gdtype,step", [
    (128 * 1300, BF16, 7),          # 3 chunks of 512 + a ragged chunk of 276 (masked)
    (128 * 1024, np.float32, 1),    # first step: the largest bias corrections
    (128 * 200, BF16, 1000),        # one masked chunk
])
def test_adamw_matches_numpy(ou, kernel, n, gdtype, step):
    """master, exp_avg, exp_avg_sq updated in place (fp32), the bf16 copy of the new master in param; the bias
    corrections come from the step count read from HBM."""
    k = getattr(ou[0], kernel)
    p, w, g, m, v = _adam_state(n, gdtype, seed=step)
    want = ref_adamw(w, g, m, v, step)
    W, M, V, P = w.copy(), m.copy(), v.copy(), p.copy()
    run_clean(k, P, W, g, M, V, np.array([[step]], np.int32))
    for got, ref in zip((W, M, V), want):
        close(got, ref)
    assert P.dtype == BF16
    close(P, want[0], BF16)
    np.testing.assert_array_equal(P, W.astype(BF16))  # exactly the RNE-rounded master


def test_adamw_step_count_is_read_at_run_time(ou):
    """Same inputs, step 1 versus step 2: different bias corrections, so different weights (a kernel that ignored
    the step tensor would give the same)."""
    k = ou[0].adamw_fused
    n = 128 * 512
    outs = []
    for step in (1, 2):
        p, w, g, m, v = _adam_state(n, BF16, seed=3)
        run_clean(k, p, w, g, m, v, np.array([[step]], np.int32))
        close(w, ref_adamw(*_adam_state(n, BF16, seed=3)[1:], step)[0])
        outs.append(w)
    assert np.abs(outs[0] - outs[1]).max() > 1e-5


def test_adamw_fused_structure_and_bytes(ou):
    """Per 512-wide chunk 4 loads (master, grad, m, v) and 4 stores (m, v, master, bf16 param), plus the step count:
    HBM reads (4 + 2 + 4 + 4) B and writes (4 + 4 + 4 + 2) B per element, + 4 B of step. Every chunk runs two
    ScalarE activations (``nl.square`` of g and ``nl.sqrt`` of v, spec 3.6), plus the two exps, the reciprocal and
    the rsqrt of the bias corrections once."""
    m_ = ou[0]
    n = 128 * 1300
    NC = math.ceil(1300 / 512)
    p, w, g, m, v = _adam_state(n, BF16, seed=1)
    run_clean(m_.adamw_fused, p, w, g, m, v, np.array([[3]], np.int32))
    c = _ops(m_.adamw_fused)
    assert c["dma_copy"] == 8 * NC + 1, c
    assert c["activation"] == 2 * NC + 4, c
    prof = m_.adamw_fused.last_profile
    assert prof.stat("memory.hbm_read_bytes") == n * 14 + 4
    assert prof.stat("memory.hbm_write_bytes") == n * 14


def test_adamw_fused_is_hbm_bound_and_beats_two_pass(ou):
    """An optimizer step does ~15 flops per 28 bytes: far below the ridge, bound by HBM. The fused kernel reads each
    state once (28 B / element of traffic) and can neither beat its bytes over nsim's HBM roof nor be far from it
    (within 1.6x: the VectorE / ScalarE passes overlap the DMAs of other chunks; nsim: ~1.4x); the two-pass form re-reads m and v
    (36 B / element), so it takes longer, by at least the extra bytes' time at the roof."""
    m_ = ou[0]
    n = 128 * 4096
    step = np.array([[10]], np.int32)
    p, w, g, m, v = _adam_state(n, BF16, seed=2)
    run_clean(m_.adamw_fused, p, w, g, m, v, step)
    pf = m_.adamw_fused.last_profile
    p, w, g, m, v = _adam_state(n, BF16, seed=2)
    run_clean(m_.adamw_two_pass, p, w, g, m, v, step)
    pt = m_.adamw_two_pass.last_profile
    fused_bytes = pf.stat("memory.hbm_read_bytes") + pf.stat("memory.hbm_write_bytes")
    two_bytes = pt.stat("memory.hbm_read_bytes") + pt.stat("memory.hbm_write_bytes")
    assert two_bytes - fused_bytes == n * 8
    roof = _roof_ns(fused_bytes, pf)
    assert roof <= pf.total_time_ns < 1.6 * roof, (pf.total_time_ns, roof)
    assert pt.total_time_ns - pf.total_time_ns > _roof_ns(n * 8, pt), (pt.total_time_ns, pf.total_time_ns)


# --------------------------------------------------------------------------------------------------
# LAMB (Beta 1)
# --------------------------------------------------------------------------------------------------

def ref_lamb(w, g, m, v, t, lr=1e-3, b1=0.9, b2=0.999, eps=1e-6, wd=0.01):
    w, g, m, v = map(_f64, (w, g, m, v))
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    u = (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps) + wd * w
    wn, un = np.linalg.norm(w), np.linalg.norm(u)
    trust = wn / un if wn > 0 and un > 0 else 1.0
    return w - lr * trust * u, m, v


@pytest.mark.parametrize("R,C,step,zero_w", [
    (300, 256, 5, False),    # 3 row tiles, the last of 44 rows (masked)
    (256, 512, 1, False),
    (128, 64, 3, True),      # w = 0: ||w|| = 0, trust ratio 1
])
def test_lamb_matches_numpy(ou, R, C, step, zero_w):
    m_ = ou[0]
    w = np.zeros((R, C), np.float32) if zero_w else _randn((R, C), np.float32, R)
    g = _randn((R, C), np.float32, R + 1)
    m = _randn((R, C), np.float32, R + 2, 0.1)
    v = _rand((R, C), np.float32, R + 3, 0.0, 0.01)
    W, M, V = run_clean(m_.lamb_step, w, g, m, v, step)
    want = ref_lamb(w, g, m, v, step)
    for got, ref in zip((W, M, V), want):
        close(got, ref)
    if not zero_w:  # the trust ratio matters: plain Adam (ratio 1) would be off
        u = (want[1] / (1 - 0.9 ** step)) / (np.sqrt(want[2] / (1 - 0.999 ** step)) + 1e-6) + 0.01 * _f64(w)
        assert np.abs(_f64(W) - (_f64(w) - 1e-3 * u)).max() > 1e-4
        # the step's norm is lr * ||w||, whatever ||u|| is
        u_step = _f64(w) - want[0]
        assert abs(np.linalg.norm(u_step) - 1e-3 * np.linalg.norm(_f64(w))) < 1e-6 * np.linalg.norm(_f64(w))


def test_lamb_structure(ou):
    """Pass 1 per row tile: 4 loads and 3 stores (m, v, the direction u into the HBM scratch); pass 2: 2 loads, 1
    store; one ones matmul for both global norms. HBM: reads 16 + 8 B, writes 12 + 4 B per element."""
    m_ = ou[0]
    R, C = 300, 256
    NT = 3
    args = (_randn((R, C), np.float32, 1), _randn((R, C), np.float32, 2), _randn((R, C), np.float32, 3, 0.1),
            _rand((R, C), np.float32, 4, 0.0, 0.01))
    run_clean(m_.lamb_step, *args, 2)
    c = _ops(m_.lamb_step)
    assert c["dma_copy"] == NT * (4 + 3 + 2 + 1), c
    assert c["nc_matmul"] == 1, c
    prof = m_.lamb_step.last_profile
    assert prof.stat("memory.hbm_read_bytes") == R * C * 24
    assert prof.stat("memory.hbm_write_bytes") == R * C * 16


# --------------------------------------------------------------------------------------------------
# Global gradient-norm clipping + found_inf (Beta 1)
# --------------------------------------------------------------------------------------------------

def _grads(seed, scale=1.0):
    return [_randn((300, 64), np.float32, seed, scale), _randn((128, 100), BF16, seed + 1, scale),
            _randn((50, 32), np.float32, seed + 2, scale)]


@pytest.mark.parametrize("max_norm,scale", [(1.0, 1.0), (1e4, 1.0), (5.0, 0.01)])
def test_clip_grad_norm_matches_torch_semantics(ou, max_norm, scale):
    """total = sqrt(sum of all squares); every gradient scaled in place by min(1, max_norm / (total + 1e-6))."""
    m_ = ou[0]
    gs = _grads(7, scale)
    G = [x.copy() for x in gs]
    norm, found = run_clean(m_.clip_grad_norm, *G, max_norm)
    total = math.sqrt(sum((_f64(x) ** 2).sum() for x in gs))
    coef = min(1.0, max_norm / (total + 1e-6))
    assert found.dtype == np.int32 and found.shape == (1, 1) and found[0, 0] == 0
    close(norm[0, 0], total)
    for got, x in zip(G, gs):
        close(got, _f64(x) * coef, got.dtype)
    if coef == 1.0:
        for got, x in zip(G, gs):
            np.testing.assert_array_equal(got, x)


@pytest.mark.parametrize("which,bad", [(1, np.inf), (0, -np.inf), (2, np.nan), (1, np.nan)])
def test_clip_grad_norm_found_inf_skips(ou, which, bad):
    """One inf / NaN anywhere: found_inf = 1 exactly, the reported norm is inf (inf only) or NaN, and the gradients
    are left untouched (the step will be skipped, the loss scale backed off). No sanitizer report: the non-finite
    sums come from non-finite inputs."""
    m_ = ou[0]
    gs = _grads(11)
    gs[which][min(gs[which].shape[0] - 1, 77), 3] = bad
    G = [x.copy() for x in gs]
    norm, found = run_clean(m_.clip_grad_norm, *G, 1.0)
    assert found[0, 0] == 1
    if np.isnan(bad):
        assert np.isnan(norm[0, 0])
    else:
        assert norm[0, 0] == np.inf
    for got, x in zip(G, gs):
        np.testing.assert_array_equal(got.view(np.uint8), x.view(np.uint8))


def test_clip_grad_norm_structure(ou):
    """Two passes over every row tile (4 + 1 + 1 tiles: 300, 128 and 50 rows): one load each in pass 1, a load and
    a store in pass 2, plus the two [1, 1] outputs; one ones matmul. Each gradient crosses HBM three times."""
    m_ = ou[0]
    gs = _grads(3)
    run_clean(m_.clip_grad_norm, *gs, 1.0)
    c = _ops(m_.clip_grad_norm)
    NT = 3 + 1 + 1
    assert c["dma_copy"] == 3 * NT + 2 and c["nc_matmul"] == 1, c
    nbytes = sum(x.nbytes for x in gs)
    prof = m_.clip_grad_norm.last_profile
    assert prof.stat("memory.hbm_read_bytes") == 2 * nbytes
    assert prof.stat("memory.hbm_write_bytes") == nbytes + 8


# --------------------------------------------------------------------------------------------------
# Lion, SGD-Nesterov (new dialect)
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("R,C,gdtype,wd", [(300, 256, BF16, 0.1), (256, 512, np.float32, 0.0), (77, 96, BF16, 0.0)])
def test_lion_matches_numpy(oun, R, C, gdtype, wd):
    w = _randn((R, C), np.float32, R)
    g = _randn((R, C), gdtype, R + 1)
    m = _randn((R, C), np.float32, R + 2, 0.1)
    lr, b1, b2 = 1e-3, 0.9, 0.99
    W, M = run_clean(oun.lion_step, w, g, m, lr, b1, b2, wd)
    c = b1 * _f64(m) + (1 - b1) * _f64(g)
    close(W, _f64(w) * (1 - lr * wd) - lr * np.sign(c))
    close(M, b2 * _f64(m) + (1 - b2) * _f64(g))
    # every element moved by exactly lr (plus the decay): the sign, not the magnitude
    np.testing.assert_allclose(np.abs(_f64(W) - _f64(w) * (1 - lr * wd)), lr, rtol=1e-3)


@pytest.mark.parametrize("R,C,gdtype", [(300, 256, BF16), (128, 1024, np.float32)])
def test_sgd_nesterov_matches_numpy(oun, R, C, gdtype):
    w = _randn((R, C), np.float32, 5)
    g = _randn((R, C), gdtype, 6)
    b = _randn((R, C), np.float32, 7, 0.1)
    lr, mu, wd = 0.01, 0.9, 1e-4
    W, B = run_clean(oun.sgd_nesterov, w, g, b, lr, mu, wd)
    gg = _f64(g) + wd * _f64(w)
    bb = mu * _f64(b) + gg
    close(B, bb)
    close(W, _f64(w) - lr * (gg + mu * bb))


def test_lion_and_sgd_structure_and_bytes(oun):
    """Per row tile 3 loads and 2 stores; Lion one sign activation per tile and no ScalarE work otherwise. HBM:
    fp32 weight + bf16 grad + fp32 state read, fp32 weight + state written (Lion keeps one state like SGD: both
    move (4 + 2 + 4) + (4 + 4) B per element). Both are HBM bound: never faster than their bytes over the roof,
    and within 1.8x of it (nsim: ~1.35x Lion, ~1.6x SGD with its extra VectorE pass)."""
    R, C = 1024, 512
    w = _randn((R, C), np.float32, 1)
    g = _randn((R, C), BF16, 2)
    s = _randn((R, C), np.float32, 3, 0.1)
    for k, args in ((oun.lion_step, (1e-3, 0.9, 0.99, 0.1)), (oun.sgd_nesterov, (0.01, 0.9, 1e-4))):
        run_clean(k, w, g, s, *args)
        c = _ops(k)
        assert c["dma_copy"] == 5 * (R // 128), c
        prof = k.last_profile
        assert prof.stat("memory.hbm_read_bytes") == R * C * 10
        assert prof.stat("memory.hbm_write_bytes") == R * C * 8
        roof = _roof_ns(R * C * 18, prof)
        assert roof <= prof.total_time_ns < 1.8 * roof, (k, prof.total_time_ns, roof)
    assert _ops(oun.lion_step)["activation"] == R // 128
    assert _ops(oun.sgd_nesterov)["activation"] == 0


# --------------------------------------------------------------------------------------------------
# Adafactor (new dialect)
# --------------------------------------------------------------------------------------------------

def ref_adafactor(w, g, r, c, lr, b2, eps1, clip, wd):
    """HF transformers Adafactor (factored, no relative step, no first moment) in float64: (w', r', c')."""
    w, g, r, c = map(_f64, (w, g, r, c))
    g2 = g * g + eps1
    r = b2 * r + (1 - b2) * g2.mean(1)
    c = b2 * c + (1 - b2) * g2.mean(0)
    u = g / np.sqrt(np.outer(r / r.mean(), c))
    u /= max(1.0, np.sqrt((u * u).mean()) / clip)
    return w * (1 - lr * wd) - lr * u, r, c


@pytest.mark.parametrize("R,C,gdtype,clip,wd", [
    (512, 384, np.float32, 0.5, 0.0),     # RMS(u) ~ 1 > 0.5: clipped
    (256, 512, BF16, 100.0, 0.01),        # not clipped, with weight decay
    (128, 64, np.float32, 1.0, 0.0),
])
def test_adafactor_matches_numpy(oun, R, C, gdtype, clip, wd):
    w = _randn((R, C), np.float32, R)
    g = _randn((R, C), gdtype, C)
    r = _rand(R, np.float32, 1, 0.5, 1.5)
    c = _rand(C, np.float32, 2, 0.5, 1.5)
    lr, b2 = 1e-2, 0.8
    W, Rn, Cn = run_clean(oun.adafactor_step, w, g, r, c, lr, b2, 1e-30, clip, wd)
    want = ref_adafactor(w, g, r, c, lr, b2, 1e-30, clip, wd)
    for got, ref in zip((W, Rn, Cn), want):
        close(got, ref)
    if clip < 1.0:  # the clipping is active: without it the step would be twice as large
        assert np.abs(_f64(W) - ref_adafactor(w, g, r, c, lr, b2, 1e-30, 1e9, wd)[0]).max() > 1e-3


def test_adafactor_structure_and_bytes(oun):
    """NT row tiles: NT gradient loads and NT weight loads / stores, 3 state transfers in and out; NT column-sum
    matmuls accumulating in one PSUM bank + 2 ones matmuls over the partitions (mean(r), sum u^2) + the K = 1
    broadcast of rsqrt(c). The gradient and the weight cross HBM once each: reads (2 + 4) B per element for a bf16
    gradient + the factored state (R + C) * 4 B, writes 4 B per element + (R + C) * 4 B: the second moment costs
    (R + C) / (R C) of Adam's. The price is latency: the update needs the global column sums, mean(r) and RMS(u)
    first, so the three passes serialise behind two global reductions and the kernel is not HBM bound: it takes
    more than twice its bytes over the roof (nsim: ~3x), unlike the streaming AdamW / Lion / SGD steps."""
    R, C = 1024, 512
    NT = R // 128
    w = _randn((R, C), np.float32, 1)
    g = _randn((R, C), BF16, 2)
    r = _rand(R, np.float32, 3, 0.5, 1.5)
    c = _rand(C, np.float32, 4, 0.5, 1.5)
    run_clean(oun.adafactor_step, w, g, r, c)
    cnt = _ops(oun.adafactor_step)
    assert cnt["nc_matmul"] == NT + 3, cnt
    assert cnt["dma_copy"] == 3 * NT + 4, cnt
    prof = oun.adafactor_step.last_profile
    assert prof.stat("memory.hbm_read_bytes") == R * C * 6 + (R + C) * 4
    assert prof.stat("memory.hbm_write_bytes") == R * C * 4 + (R + C) * 4
    assert prof.total_time_ns > 2.0 * _roof_ns(R * C * 10 + (R + C) * 8, prof), prof.total_time_ns
