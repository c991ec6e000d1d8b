"""Diffusion-model sampling kernels (the non-UNet parts of a denoising loop) written like public NKI kernels
(tests/python/kernels/diffusion_sampling_kernels.py, Beta-1 dialect, and diffusion_sampling_kernels_new.py, new
dialect; both unmodified, through ``nsim.compat``):

- sampler steps on latents [B*C, H*W] tiled over the partitions, the per-step scalars from a host schedule
  (alphas_cumprod of Stable Diffusion's scaled-linear betas, Karras-style sigmas) passed as [1, k] HBM tensors and
  broadcast to the partitions: DDIM with classifier-free guidance fused in (eta = 0, eta > 0 with a noise input,
  x0 clipping; Beta 1), Euler and Euler-ancestral (Beta 1), DPM-Solver++(2M) first and second order with the
  previous step's denoised output (new dialect);
- guidance rescale of a v-prediction model (per-sample std of cond and of the guided output from a ones-matmul
  partition reduction), v -> x0 / eps, and dynamic thresholding by the per-sample max |x0|
  (``tensor_partition_reduce`` and a K = 1 broadcast matmul; new dialect);
- the sinusoidal timestep embedding (``iota``, exp, ``nl.cos`` / ``nl.sin``) and its Linear-SiLU-Linear MLP on
  TensorE (Beta 1);
- DiT adaLN modulation: LayerNorm (bn_stats / bn_aggr) then x (1 + scale) + shift (new dialect).

Checked: outputs against float64 numpy references of the diffusers / k-diffusion formulas (fp32 1e-5 relative to
the output scale, bf16 1e-2; the embedding to the 2e-4 its fp32 arguments allow: t * f up to 999 rad carries an
ulp of 6e-5 into the range reduction), multi-step trajectories (DPM++ 2M over a schedule, Euler-a to sigma = 0), no
sanitizer report, the instruction / DMA counts and HBM bytes the tiling implies, and the timing a kernel author
cares about: fusing the CFG combine into the step saves an HBM round trip of the guided eps and is faster than the
two kernels; bf16 latents halve the HBM bytes of a step (not its time: the loads cast into fp32 tiles).

nsim fixes this family needed: none (no nsim bug found; see the report)."""
import math

import numpy as np
import pytest

from conftest import executed_ops, require_core, run_clean, sample_fixture  # noqa: E402,F401
from conftest import op_counts as _ops  # noqa: E402

_core, ml_dtypes = require_core()
from numeric_helpers import close, f64 as _f64, randn as _randn, rounded as _rounded  # noqa: E402

BF16 = ml_dtypes.bfloat16

ds = sample_fixture("diffusion_sampling_kernels.py")
dsn = sample_fixture("diffusion_sampling_kernels_new.py", module_only=True)


def _close_scaled(got, want, dtype):
    """|got - want| <= tol * (|want| + max |want|): the dtype tolerance (fp32 1e-5, bf16 1e-2) relative to the
    output's scale (sampler outputs are sums of terms much larger than their smallest elements)."""
    tol = 1e-5 if np.dtype(dtype) == np.float32 else 1e-2
    got, want = _f64(got), _f64(want)
    assert got.shape == want.shape
    err = np.abs(got - want) / (np.abs(want) + np.abs(want).max())
    assert err.max() < tol, err.max()


def _alphas_cumprod(T=1000):
    """Stable Diffusion's scaled-linear schedule."""
    betas = np.linspace(0.00085 ** 0.5, 0.012 ** 0.5, T) ** 2
    return np.cumprod(1.0 - betas)


def _karras_sigmas(n, smin=0.03, smax=14.6, rho=7.0):
    ramp = np.linspace(0, 1, n)
    s = (smax ** (1 / rho) + ramp * (smin ** (1 / rho) - smax ** (1 / rho))) ** rho
    return np.concatenate([s, [0.0]])


def _latents(B, C, HW, dtype, seed, scale=1.0):
    return _randn((B * C, HW), dtype, seed=seed, scale=scale)


# --------------------------------------------------------------------------------------------------
# DDIM + CFG (Beta 1)
# --------------------------------------------------------------------------------------------------

def ref_ddim(x, eu, ec, a_t, a_prev, w=7.5, eta=0.0, noise=None, clip=False):
    x, eu = _f64(x), _f64(eu)
    eps = eu if ec is None else eu + w * (_f64(ec) - eu)
    x0 = (x - math.sqrt(1 - a_t) * eps) / math.sqrt(a_t)
    if clip:
        x0 = np.clip(x0, -1, 1)
    var = (1 - a_prev) / (1 - a_t) * (1 - a_t / a_prev)
    std = eta * math.sqrt(var)
    out = math.sqrt(a_prev) * x0 + math.sqrt(1 - a_prev - std ** 2) * eps
    if eta > 0:
        out = out + std * _f64(noise)
    return out


@pytest.mark.parametrize("B,HW,dtype,eta,clip,t,tp", [
    (2, 4096, np.float32, 0.0, False, 801, 781),   # one full tile of 128 rows
    (3, 4096, BF16, 0.0, True, 981, 961),          # 192 rows: a masked last tile of 64
    (2, 1024, np.float32, 0.5, False, 501, 481),   # 32 rows only
    (3, 4096, np.float32, 1.0, True, 21, 1),
])
def test_ddim_cfg_step_matches_numpy(ds, B, HW, dtype, eta, clip, t, tp):
    m = ds[0]
    acp = _alphas_cumprod()
    alphas = np.array([[acp[t], acp[tp]]], np.float32)
    x = _latents(B, 4, HW, dtype, seed=1)
    eu = _latents(B, 4, HW, dtype, seed=2)
    ec = _latents(B, 4, HW, dtype, seed=3)
    noise = _latents(B, 4, HW, dtype, seed=4) if eta > 0 else None
    out = run_clean(m.ddim_cfg_step, x, eu, ec, alphas, noise, 7.5, eta, clip)
    assert out.dtype == np.dtype(dtype) and out.shape == x.shape
    want = ref_ddim(x, eu, ec, float(alphas[0, 0]), float(alphas[0, 1]), 7.5, eta, noise, clip)
    _close_scaled(out, want, dtype)
    if clip:  # the clip is active for these inputs
        assert np.abs(ref_ddim(x, eu, ec, float(alphas[0, 0]), float(alphas[0, 1]), 7.5, eta, noise)
                      - want).max() > 0.1


def test_ddim_structure(ds):
    """192 rows of 256 = 2 row tiles; per tile 3 loads (x, eu, ec) + 1 noise load + 1 store, plus the [1, 2] alphas
    load: 11 DMAs; every latent byte crosses HBM once (4 inputs read, 1 output written) and the scalars 8 bytes."""
    m = ds[0]
    B, HW = 3, 4096
    acp = _alphas_cumprod()
    alphas = np.array([[acp[501], acp[481]]], np.float32)
    x, eu, ec, z = (_latents(B, 4, HW, np.float32, seed=s) for s in range(4))
    run_clean(m.ddim_cfg_step, x, eu, ec, alphas, z, 7.5, 0.5)
    c = _ops(m.ddim_cfg_step)
    assert c["dma_copy"] == 2 * 5 + 1, c
    # per tile: CFG (subtract + stt), x0 (stt + multiply), direction (multiply), x_prev (stt), noise (stt)
    assert c["scalar_tensor_tensor"] == 2 * 4, c
    prof = m.ddim_cfg_step.last_profile
    assert prof.stat("memory.hbm_read_bytes") == 4 * x.nbytes + alphas.nbytes
    assert prof.stat("memory.hbm_write_bytes") == x.nbytes


def test_cfg_fused_into_step_saves_round_trip_and_is_faster(ds):
    """The unfused pipeline writes the guided eps to HBM (cfg_combine) and reads it back in the step: one extra
    latent-sized write and read. The fused step gives the same result, moves 2 latent tensors fewer through HBM
    (reads x, eu, ec and writes x_prev: 4 N bytes against 3 N + 3 N for the two kernels) and, the step being
    memory-bound, finishes before the two kernels together."""
    m = ds[0]
    B, HW = 4, 4096
    acp = _alphas_cumprod()
    alphas = np.array([[acp[601], acp[581]]], np.float32)
    x, eu, ec = (_latents(B, 4, HW, np.float32, seed=s) for s in (5, 6, 7))
    fused = run_clean(m.ddim_cfg_step, x, eu, ec, alphas)
    pf = m.ddim_cfg_step.last_profile
    eps = run_clean(m.cfg_combine, eu, ec, 7.5)
    pc = m.cfg_combine.last_profile
    two = run_clean(m.ddim_cfg_step, x, eps, None, alphas)
    ps = m.ddim_cfg_step.last_profile
    close(eps, _f64(eu) + 7.5 * (_f64(ec) - _f64(eu)))
    np.testing.assert_allclose(two, fused, rtol=1e-6, atol=1e-5)
    N = x.nbytes
    assert pf.stat("memory.hbm_read_bytes") == 3 * N + 8 and pf.stat("memory.hbm_write_bytes") == N
    unfused_bytes = (pc.stat("memory.hbm_read_bytes") + pc.stat("memory.hbm_write_bytes")
                     + ps.stat("memory.hbm_read_bytes") + ps.stat("memory.hbm_write_bytes"))
    assert unfused_bytes == 6 * N + 8
    assert pf.total_time_ns < pc.total_time_ns + ps.total_time_ns, (
        pf.total_time_ns, pc.total_time_ns, ps.total_time_ns)


def test_bf16_latents_halve_traffic_and_run_faster(ds):
    """The step computes in fp32 on chip either way: bf16 latents in HBM halve the bytes read and written. The
    loads cast into fp32 tiles, so a load's DMA still writes the fp32 size into SBUF and costs as much as the fp32
    load (nsim's DMA time follows the larger side): bf16 is not slower, and its stores are shorter."""
    m = ds[0]
    acp = _alphas_cumprod()
    alphas = np.array([[acp[401], acp[381]]], np.float32)
    prof = {}
    for dt in (np.float32, BF16):
        x, eu, ec = (_latents(4, 4, 4096, dt, seed=s) for s in (1, 2, 3))
        run_clean(m.ddim_cfg_step, x, eu, ec, alphas)
        prof[dt] = m.ddim_cfg_step.last_profile
    assert prof[BF16].stat("memory.hbm_read_bytes") - 8 == (prof[np.float32].stat("memory.hbm_read_bytes") - 8) // 2
    assert prof[BF16].stat("memory.hbm_write_bytes") * 2 == prof[np.float32].stat("memory.hbm_write_bytes")
    assert prof[BF16].total_time_ns <= prof[np.float32].total_time_ns


# --------------------------------------------------------------------------------------------------
# Euler / Euler-ancestral (Beta 1)
# --------------------------------------------------------------------------------------------------

def ref_euler(x, eu, ec, sigma, sigma_next, w=7.5, noise=None):
    x = _f64(x)
    eps = _f64(eu) + w * (_f64(ec) - _f64(eu))
    if noise is None:
        return x + eps * (sigma_next - sigma)
    up = min(sigma_next, math.sqrt(sigma_next ** 2 * (sigma ** 2 - sigma_next ** 2) / sigma ** 2))
    down = math.sqrt(max(sigma_next ** 2 - up ** 2, 0.0))
    return x + eps * (down - sigma) + _f64(noise) * up


@pytest.mark.parametrize("ancestral", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_euler_step_matches_numpy(ds, ancestral, dtype):
    m = ds[0]
    sig = _karras_sigmas(20)
    sigmas = np.array([[sig[5], sig[6]]], np.float32)
    s, sn = float(sigmas[0, 0]), float(sigmas[0, 1])
    x = _latents(3, 4, 4096, dtype, seed=11, scale=s)
    eu, ec = _latents(3, 4, 4096, dtype, seed=12), _latents(3, 4, 4096, dtype, seed=13)
    z = _latents(3, 4, 4096, dtype, seed=14) if ancestral else None
    out = run_clean(m.euler_cfg_step, x, eu, ec, sigmas, z)
    _close_scaled(out, ref_euler(x, eu, ec, s, sn, noise=z), dtype)
    c = _ops(m.euler_cfg_step)
    assert c["dma_copy"] == 2 * (4 + ancestral) + 1, c


def test_euler_ancestral_trajectory_to_sigma_zero(ds):
    """A whole Euler-a loop over a 10-step Karras schedule (fp32, the host feeding each step's output back): the
    final step to sigma = 0 has sigma_up = sigma_down = 0 and lands on x0 = x - sigma eps; the trajectory matches a
    float64 loop."""
    m = ds[0]
    sig = _karras_sigmas(10)
    x = _latents(2, 4, 1024, np.float32, seed=20, scale=float(sig[0]))
    xr = _f64(x)
    for i in range(10):
        sigmas = np.array([[sig[i], sig[i + 1]]], np.float32)
        # a stand-in model: eps = x / sqrt(sigma^2 + 1) (uncond) and a slightly different cond
        eu = (x / np.sqrt(sigmas[0, 0] ** 2 + 1)).astype(np.float32)
        ec = (0.9 * eu).astype(np.float32)
        z = _latents(2, 4, 1024, np.float32, seed=100 + i)
        x = run_clean(m.euler_cfg_step, x, eu, ec, sigmas, z, 3.0)
        xr = ref_euler(xr, eu, ec, float(sigmas[0, 0]), float(sigmas[0, 1]), 3.0, z)
    _close_scaled(x, xr, np.float32)


# --------------------------------------------------------------------------------------------------
# Timestep embedding + MLP (Beta 1)
# --------------------------------------------------------------------------------------------------

def ref_temb(ts, D, max_period=10000.0):
    half = D // 2
    f = np.exp(-math.log(max_period) * np.arange(half) / half)
    a = _f64(ts)[:, None] * f
    return np.concatenate([np.cos(a), np.sin(a)], 1)


def _silu(h):
    return h / (1 + np.exp(-h))


def test_timestep_embedding_is_accurate(ds):
    """With identity weights and zero biases the MLP returns silu(emb) (silu is strictly increasing with a slope of
    at least 0.5 on [-1, 1], so this checks every embedding element): within 2e-4 of float64 for t up to 999 (the fp32 argument t * f of up to 999 rad
    has an ulp of 6.1e-5, and the range reduction of nl.sin / nl.cos starts from it)."""
    m = ds[0]
    D = 256
    ts = np.array([0, 1, 17, 250, 500, 999, 999.5, 731], np.float32)
    eye = np.eye(D, dtype=np.float32)
    zero = np.zeros(D, np.float32)
    out = run_clean(m.timestep_embedding_mlp, ts, eye, zero, eye, zero)
    want = _silu(ref_temb(ts, D))
    np.testing.assert_allclose(_f64(out), want, rtol=0, atol=2e-4)
    # cos first (flip_sin_to_cos): t = 0 embeds as [1] * half + [0] * half
    np.testing.assert_allclose(_f64(out[0]), _silu(np.r_[np.ones(D // 2), np.zeros(D // 2)]), atol=1e-6)


@pytest.mark.parametrize("B,D,Hd,dtype", [(4, 320, 1280, np.float32), (16, 320, 1280, BF16), (2, 128, 256, BF16)])
def test_timestep_mlp_matches_numpy(ds, B, D, Hd, dtype):
    m = ds[0]
    rng = np.random.default_rng(B + D)
    ts = rng.integers(0, 1000, B).astype(np.float32)
    w1 = _randn((D, Hd), dtype, seed=1, scale=1 / math.sqrt(D))
    w2 = _randn((Hd, Hd), dtype, seed=2, scale=1 / math.sqrt(Hd))
    b1 = _randn((Hd,), np.float32, seed=3, scale=0.1)
    b2 = _randn((Hd,), np.float32, seed=4, scale=0.1)
    out = run_clean(m.timestep_embedding_mlp, ts, w1, b1, w2, b2)
    assert out.dtype == np.dtype(dtype) and out.shape == (B, Hd)
    if dtype == np.float32:
        want = _silu(ref_temb(ts, D) @ _f64(w1) + b1) @ _f64(w2) + b2
        np.testing.assert_allclose(_f64(out), want, rtol=0, atol=2e-4)
    else:  # the embedding and the hidden layer are stored in bf16 before their matmuls
        emb = _rounded(ref_temb(ts, D), BF16)
        h = _rounded(_silu(emb @ _f64(w1) + b1), BF16)
        want = h @ _f64(w2) + b2
        np.testing.assert_allclose(_f64(out), want, rtol=1e-2, atol=1e-2 * np.abs(want).max())


def test_timestep_mlp_structure(ds):
    """D = 320 is KT = 3 contraction chunks (128, 128, 64), Hd = 1280 is NM = 10 tiles: KT transposes of the
    embedding and NM of the output; NM KT + NM^2 matmuls; exp once, the cos and sin (each a range reduction and a
    sin activation), NM SiLU and NM bias activations; DMAs: timesteps, KT w1 slabs, NM^2 w2 tiles, 2 NM bias
    columns and one store. Every weight byte is read once."""
    m = ds[0]
    B, D, Hd = 8, 320, 1280
    w1 = _randn((D, Hd), BF16, seed=1, scale=0.05)
    w2 = _randn((Hd, Hd), BF16, seed=2, scale=0.03)
    b = np.zeros(Hd, np.float32)
    ts = np.arange(B, dtype=np.float32) * 100
    run_clean(m.timestep_embedding_mlp, ts, w1, b, w2, b)
    KT, NM = 3, 10
    c = _ops(m.timestep_embedding_mlp)
    assert c["nc_matmul"] == NM * KT + NM * NM and c["nc_transpose"] == KT + NM, c
    assert c["iota"] == 1 and c["activation"] == 1 + 2 + 2 * NM, c
    assert c["dma_copy"] == 1 + KT + NM * NM + 2 * NM + 1, c
    prof = m.timestep_embedding_mlp.last_profile
    assert prof.stat("memory.hbm_read_bytes") == ts.nbytes + w1.nbytes + w2.nbytes + 2 * b.nbytes
    assert prof.stat("memory.hbm_write_bytes") == B * Hd * 2


# --------------------------------------------------------------------------------------------------
# DPM-Solver++(2M) (new dialect)
# --------------------------------------------------------------------------------------------------

def ref_dpmpp_2m(x, eu, ec, s_prev, s, s_next, old=None, w=7.5):
    x = _f64(x)
    eps = _f64(eu) + w * (_f64(ec) - _f64(eu))
    den = x - s * eps
    if old is None:
        return s_next / s * x + (1 - s_next / s) * den, den
    h = math.log(s / s_next)
    r = math.log(s_prev / s) / h
    dd = (1 + 1 / (2 * r)) * den - 1 / (2 * r) * _f64(old)
    return s_next / s * x + (1 - s_next / s) * dd, den


@pytest.mark.parametrize("R,HW,dtype,second", [
    (8, 4096, np.float32, False),
    (8, 4096, np.float32, True),
    (12, 4096, BF16, True),      # 192 rows: ragged last tile of 64
    (4, 1000, np.float32, True),   # 4000 elements as 16 rows of 250
])
def test_dpmpp_2m_matches_numpy(dsn, R, HW, dtype, second):
    sig = _karras_sigmas(20)
    sigmas = np.array([[sig[3], sig[4], sig[5]]], np.float32)
    sp, s, sn = (float(v) for v in sigmas[0])
    x = _latents(1, R, HW, dtype, seed=1, scale=s)
    eu, ec = _latents(1, R, HW, dtype, seed=2), _latents(1, R, HW, dtype, seed=3)
    old = _latents(1, R, HW, dtype, seed=4, scale=0.5) if second else None
    free = 256 if (R * HW) % 256 == 0 else 250
    xn, den = run_clean(dsn.dpmpp_2m_step, x, eu, ec, sigmas, old, 7.5, free)
    want_x, want_d = ref_dpmpp_2m(x, eu, ec, sp, s, sn, old)
    _close_scaled(den, want_d, dtype)
    _close_scaled(xn, want_x, dtype)


def test_dpmpp_2m_trajectory(dsn):
    """A 12-step DPM++ 2M loop as k-diffusion runs it: first order on the first step and on the last (to sigma = 0,
    where the host passes no old_denoised), second order in between with the previous step's denoised output
    fed back; matches a float64 loop."""
    n = 12
    sig = _karras_sigmas(n)
    x = _latents(2, 4, 1024, np.float32, seed=7, scale=float(sig[0]))
    xr, old, old_r = _f64(x), None, None
    for i in range(n):
        sigmas = np.array([[sig[i - 1] if i else sig[0], sig[i], sig[i + 1]]], np.float32)
        eu = (x / np.sqrt(sigmas[0, 1] ** 2 + 1)).astype(np.float32)
        ec = (1.1 * eu).astype(np.float32)
        use_old = old if 0 < i < n - 1 else None
        x, old = run_clean(dsn.dpmpp_2m_step, x, eu, ec, sigmas, use_old, 2.0)
        sp, s, sn = (float(v) for v in sigmas[0])
        xr, old_r = ref_dpmpp_2m(xr, eu, ec, sp, s, sn, old_r if 0 < i < n - 1 else None, 2.0)
    _close_scaled(x, xr, np.float32)


def test_dpmpp_2m_structure(dsn):
    """Per row tile 3 loads (x, eu, ec) + 1 old_denoised load in second order, 2 stores (x_next, denoised); one
    broadcast DMA of the 3 sigmas (12 bytes read by each of the 128 partitions); the log activation only in
    second order."""
    x, eu, ec, old = (_latents(3, 4, 4096, np.float32, seed=s) for s in range(4))
    sigmas = np.array([[3.0, 2.0, 1.5]], np.float32)
    NT = 2
    run_clean(dsn.dpmpp_2m_step, x, eu, ec, sigmas)
    c1 = _ops(dsn.dpmpp_2m_step)
    p1 = dsn.dpmpp_2m_step.last_profile
    run_clean(dsn.dpmpp_2m_step, x, eu, ec, sigmas, old)
    c2 = _ops(dsn.dpmpp_2m_step)
    p2 = dsn.dpmpp_2m_step.last_profile
    assert c1["dma_copy"] == 1 + NT * 5 and c2["dma_copy"] == 1 + NT * 6, (c1, c2)
    assert c1["activation"] == 0 and c2["activation"] == 1, (c1, c2)
    assert p1.stat("memory.hbm_read_bytes") == 3 * x.nbytes + 128 * 12
    assert p2.stat("memory.hbm_read_bytes") == 4 * x.nbytes + 128 * 12
    assert p1.stat("memory.hbm_write_bytes") == p2.stat("memory.hbm_write_bytes") == 2 * x.nbytes


# --------------------------------------------------------------------------------------------------
# Guidance rescale, v-prediction, dynamic thresholding (new dialect)
# --------------------------------------------------------------------------------------------------

def ref_rescale_v_ddim(x, vu, vc, a_t, a_prev, C=4, w=7.5, phi=0.7, smv=None):
    B = x.shape[0] // C
    x, vu, vc = (_f64(a).reshape(B, -1) for a in (x, vu, vc))
    v = vu + w * (vc - vu)
    if phi > 0:
        std_c = vc.std(1, ddof=1, keepdims=True)
        std_g = v.std(1, ddof=1, keepdims=True)
        v = phi * v * std_c / std_g + (1 - phi) * v
    x0 = math.sqrt(a_t) * x - math.sqrt(1 - a_t) * v
    eps = math.sqrt(a_t) * v + math.sqrt(1 - a_t) * x
    if smv is not None:
        s = np.clip(np.abs(x0).max(1, keepdims=True), 1, smv)
        x0 = np.clip(x0, -s, s) / s
    return (math.sqrt(a_prev) * x0 + math.sqrt(1 - a_prev) * eps).reshape(B * C, -1)


@pytest.mark.parametrize("B,HW,dtype,phi,smv", [
    (2, 4096, np.float32, 0.7, None),
    (3, 4096, np.float32, 0.7, 1.5),    # thresholding active (max |x0| > 1.5)
    (2, 1024, BF16, 0.5, 1.5),
    (2, 4096, np.float32, 0.0, None),   # plain CFG
])
def test_cfg_rescale_v_ddim_matches_numpy(dsn, B, HW, dtype, phi, smv):
    acp = _alphas_cumprod()
    alphas = np.array([[acp[601], acp[581]]], np.float32)
    x = _latents(B, 4, HW, dtype, seed=1)
    vu = _latents(B, 4, HW, dtype, seed=2, scale=0.5)
    vc = _latents(B, 4, HW, dtype, seed=3, scale=0.6)
    vc = (_f64(vc) + 0.4 * np.arange(1, B + 1).repeat(4)[:, None]).astype(dtype)  # per-sample means: the mean term
    out = run_clean(dsn.cfg_rescale_v_ddim_step, x, vu, vc, alphas, 4, 7.5, phi, smv)
    a_t, a_p = float(alphas[0, 0]), float(alphas[0, 1])
    want = ref_rescale_v_ddim(x, vu, vc, a_t, a_p, 4, 7.5, phi, smv)
    _close_scaled(out, want, dtype)
    if smv is not None:  # the threshold matters for these inputs
        assert np.abs(ref_rescale_v_ddim(x, vu, vc, a_t, a_p, 4, 7.5, phi) - want).max() > 0.1
    if phi > 0:  # and so does the rescale
        assert np.abs(ref_rescale_v_ddim(x, vu, vc, a_t, a_p, 4, 7.5, 0.0, smv) - want).max() > 0.1


def test_cfg_rescale_structure(dsn):
    """Per sample (one [128, F] tile): 3 loads and 1 store; one ones-matmul for the four sums of the rescale and,
    with thresholding, one tensor_partition_reduce and one K = 1 broadcast matmul; without either, no TensorE work
    at all. The latents cross HBM once (3 read, 1 written)."""
    B = 3
    acp = _alphas_cumprod()
    alphas = np.array([[acp[601], acp[581]]], np.float32)
    x, vu, vc = (_latents(B, 4, 4096, np.float32, seed=s) for s in range(3))
    run_clean(dsn.cfg_rescale_v_ddim_step, x, vu, vc, alphas, 4, 7.5, 0.7, 1.5)
    c = _ops(dsn.cfg_rescale_v_ddim_step)
    assert c["dma_copy"] == 1 + 4 * B and c["nc_matmul"] == 2 * B and c["tensor_partition_reduce"] == B, c
    assert c["activation_reduce"] == 2 * B, c
    prof = dsn.cfg_rescale_v_ddim_step.last_profile
    assert prof.stat("memory.hbm_read_bytes") == 3 * x.nbytes + 128 * alphas.nbytes
    assert prof.stat("memory.hbm_write_bytes") == x.nbytes
    run_clean(dsn.cfg_rescale_v_ddim_step, x, vu, vc, alphas, 4, 7.5, 0.0, None)
    c0 = _ops(dsn.cfg_rescale_v_ddim_step)
    assert c0["nc_matmul"] == 0 and c0["tensor_partition_reduce"] == 0 and c0["activation_reduce"] == 0, c0


# --------------------------------------------------------------------------------------------------
# adaLN modulation (new dialect)
# --------------------------------------------------------------------------------------------------

def ref_adaln(x, shift, scale, eps=1e-6):
    x = _f64(x)
    mu = x.mean(-1, keepdims=True)
    var = x.var(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * (1 + _f64(scale)[:, None]) + _f64(shift)[:, None]


@pytest.mark.parametrize("B,N,D,dtype", [(2, 256, 1152, np.float32), (3, 300, 1152, BF16), (1, 64, 384, np.float32),
                                         (2, 200, 768, np.float32)])
def test_adaln_modulate_matches_numpy(dsn, B, N, D, dtype):
    x = _randn((B, N, D), dtype, seed=N, scale=2.0)
    x = (_f64(x) + 0.5).astype(dtype)  # a nonzero mean per token
    shift = _randn((B, D), np.float32, seed=1, scale=0.5)
    scale = _randn((B, D), np.float32, seed=2, scale=0.5)
    out = run_clean(dsn.adaln_modulate, x, shift, scale)
    assert out.dtype == np.dtype(dtype)
    _close_scaled(out, ref_adaln(x, shift, scale), dtype)


def test_adaln_structure(dsn):
    """N = 300 tokens = 3 token tiles (the last of 44) per sample; D = 1152 = bn_stats chunks of 512, 512 and 128:
    3 bn_stats and 1 bn_aggr per token tile. The shift / scale rows are DMA-broadcast once per sample (not per token
    tile): the stride-0 source is read once per destination partition, 128 D 4 bytes each."""
    B, N, D = 2, 300, 1152
    x = _randn((B, N, D), np.float32, seed=1)
    shift, scale = _randn((B, D), np.float32, seed=2), _randn((B, D), np.float32, seed=3)
    run_clean(dsn.adaln_modulate, x, shift, scale)
    NT = 3
    c = _ops(dsn.adaln_modulate)
    assert c["bn_stats"] == B * NT * 3 and c["bn_aggr"] == B * NT, c
    assert c["dma_copy"] == B * (2 + 2 * NT), c
    prof = dsn.adaln_modulate.last_profile
    assert prof.stat("memory.hbm_read_bytes") == x.nbytes + B * 2 * 128 * D * 4
    assert prof.stat("memory.hbm_write_bytes") == x.nbytes
