"""Diffusion UNet block kernels written like community Trainium ports of Stable Diffusion / SDXL UNet and VAE blocks
(tests/python/kernels/unet_block_kernels.py, Beta-1 dialect, and unet_block_kernels_new.py, new dialect; both
unmodified, through ``nsim.compat``):

- GroupNorm (32 groups) + SiLU with the group statistics combined across the partitions of a group by a matmul
  with a group-indicator matrix (new dialect: ``bn_stats`` / ``bn_aggr`` moments, indicator from ``iota`` and
  ``mod``; Beta 1: sums over pixel tiles, indicator M^T M from two ``affine_select``), in group-aligned channel
  tiles (C = 320: 120 + 120 + 80 channels);
- nearest 2x upsampling by strided-view / ``.ap`` writes (new) and bilinear 2x upsampling (align_corners=False) by
  weighted neighbour sums written through stride-2 index expressions (Beta 1);
- 3x3 convolution as 9 shifted matmuls per Cin tile accumulating in PSUM over a zero-padded SBUF tile (both
  dialects, channels 64-320);
- spatial self-attention (up to 4096 tokens, heads of 64, flash-style) and cross-attention to 77 text tokens
  (one ragged key block) with the residual add (new dialect);
- the timestep-conditioned ResBlock tail GN -> SiLU -> conv3x3 -> + time-embedding bias -> GN -> SiLU -> conv3x3
  -> + skip, all on chip (Beta 1).

Checked: outputs against float64 numpy references (fp32 1e-5, bf16 1e-2; nearest upsampling bit-exact), no
sanitizer report (every warning an error), the instruction / DMA counts and HBM traffic the tiling implies, and
timing stories justified from the cost model (fused GroupNorm + SiLU saves a ScalarE pass; attention time grows
quadratically with the tokens; cross-attention to 77 tokens costs a fraction of self-attention).

The nsim fixes this family needed (their regression tests fail without them):
- ``nl.matmul(w_tap, xp[:, nl.ds(r0 + kh, R), nl.ds(kw, W)], transpose_x=True)`` (the tutorial-style conv3x3, a
  [Cin, R, W] image window as the moving operand) was NSIM-E436 "2-D tiles are needed" although nl.matmul with
  transpose_x=True is nc_matmul with x stationary (spec 2.1) and a moving operand may have several free dims (spec
  2.0), which nisa.nc_matmul accepts (python/nsim/nki/language.py ``matmul``: y may be >= 2-D, the result is
  [M] + y's free dims); ``test_nl_matmul_takes_an_image_window_as_moving``,
  ``test_nl_matmul_masked_off_keeps_the_window_shape``.
"""
import numpy as np
import pytest

from conftest import executed_ops, require_core, sample_fixture, run_clean, op_counts  # noqa: E402

_core, ml_dtypes = require_core()
from numeric_helpers import close, f64, randn  # noqa: E402

BF16 = ml_dtypes.bfloat16

ub = sample_fixture("unet_block_kernels.py")
ubn = sample_fixture("unet_block_kernels_new.py", module_only=True)


def _busy(prof, engine):
    return prof.stats["engine"][engine]["busy_time"]["value"]


# --------------------------------------------------------------------------------------------------
# numpy references (float64)
# --------------------------------------------------------------------------------------------------

def ref_groupnorm(x, gamma, beta, groups=32, eps=1e-5, silu=True):
    x = f64(x)
    N, C, H, W = x.shape
    xr = x.reshape(N, groups, -1)
    mu = xr.mean(-1, keepdims=True)
    var = xr.var(-1, keepdims=True)
    y = ((xr - mu) / np.sqrt(var + eps)).reshape(N, C, H, W)
    y = y * f64(gamma)[None, :, None, None] + f64(beta)[None, :, None, None]
    return y / (1.0 + np.exp(-y)) if silu else y


def ref_conv3x3(x, w, bias):
    x = f64(x)
    N, Cin, H, W = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    out = np.zeros((N, w.shape[-1], H, W)) + f64(bias)[None, :, None, None]
    for kh in range(3):
        for kw in range(3):
            out += np.einsum("nchw,co->nohw", xp[:, :, kh:kh + H, kw:kw + W], f64(w[:, kh, kw, :]))
    return out


def ref_bilinear2x(x):
    """torch.nn.functional.interpolate(scale_factor=2, mode="bilinear", align_corners=False)."""
    def up(a, ax):
        n = a.shape[ax]
        lo = np.take(a, np.clip(np.arange(n) - 1, 0, n - 1), ax)
        hi = np.take(a, np.clip(np.arange(n) + 1, 0, n - 1), ax)
        out = np.stack([0.25 * lo + 0.75 * a, 0.75 * a + 0.25 * hi], ax + 1)
        return out.reshape(a.shape[:ax] + (2 * n,) + a.shape[ax + 1:])
    return up(up(f64(x), 2), 3)


def ref_attention(q, k, v, x):
    Hh, d, Sq = q.shape
    s = np.einsum("hds,hdt->hst", f64(q), f64(k)) / np.sqrt(d)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("hst,htd->shd", p, f64(v)).reshape(Sq, Hh * d) + f64(x)


def _gn_args(N, C, H, W, dtype, seed):
    x = randn((N, C, H, W), np.float32, seed, scale=2.0) + 0.5
    gamma = randn((C,), np.float32, seed + 1) * 0.5 + 1.0
    beta = randn((C,), np.float32, seed + 2) * 0.5
    return x.astype(dtype), gamma, beta


def _tile(C, groups=32):
    gs = C // groups
    ct = (128 // gs) * gs
    return ct, -(-C // ct)


# --------------------------------------------------------------------------------------------------
# GroupNorm + SiLU
# --------------------------------------------------------------------------------------------------

GN_CASES = [
    (1, 64, 16, 16, np.float32),    # gs = 2, one tile of 64 channels
    (2, 320, 8, 8, BF16),           # gs = 10: tiles of 120, 120, 80 channels
    (1, 128, 24, 24, np.float32),   # HW = 576: a ragged 64-pixel chunk after 512
    (1, 256, 16, 16, BF16),         # gs = 8, two full tiles
]


@pytest.mark.parametrize("N,C,H,W,dtype", GN_CASES)
def test_groupnorm_silu_new_matches_numpy(ubn, N, C, H, W, dtype):
    x, g, b = _gn_args(N, C, H, W, dtype, seed=C + H)
    y = run_clean(ubn.groupnorm_silu, x, g, b)
    assert y.dtype == np.dtype(dtype)
    close(y, ref_groupnorm(x, g, b), dtype)


@pytest.mark.parametrize("N,C,H,W,dtype", GN_CASES)
def test_groupnorm_silu_b1_matches_numpy(ub, N, C, H, W, dtype):
    x, g, b = _gn_args(N, C, H, W, dtype, seed=C + W + 7)
    y = run_clean(ub[0].groupnorm_silu_b1, x, g, b)
    assert y.dtype == np.dtype(dtype)
    close(y, ref_groupnorm(x, g, b), dtype)


def test_groupnorm_statistics_are_per_group_not_per_channel(ubn, ub):
    """Channels of one group with very different offsets: normalising per channel (instance norm) would make every
    channel zero-mean; the group statistics keep the channels' offsets relative to each other."""
    N, C, H, W = 1, 64, 8, 8
    x = randn((N, C, H, W), np.float32, 3)
    x += np.repeat([[-3.0, 3.0]], 32, 0).reshape(1, C, 1, 1).astype(np.float32)   # gs = 2: one low, one high
    g = np.ones(C, np.float32)
    b = np.zeros(C, np.float32)
    want = ref_groupnorm(x, g, b, silu=False)
    assert want[0, 0].mean() < -0.9 and want[0, 1].mean() > 0.9
    close(run_clean(ubn.groupnorm_silu, x, g, b), ref_groupnorm(x, g, b), np.float32)
    close(run_clean(ub[0].groupnorm_silu_b1, x, g, b), ref_groupnorm(x, g, b), np.float32)


def test_groupnorm_silu_structure(ubn):
    """N = 2, C = 320 (tiles 120 / 120 / 80), 24 x 24 pixels (two bn_stats chunks): per (sample, tile) two bn_stats,
    one bn_aggr, one indicator matmul, the rstd and the fused SiLU activations and four DMAs (gamma, beta, x, y);
    x crosses HBM once each way."""
    N, C, H, W = 2, 320, 24, 24
    x, g, b = _gn_args(N, C, H, W, np.float32, seed=5)
    k = ubn.groupnorm_silu
    run_clean(k, x, g, b)
    _, nct = _tile(C)
    tiles = N * nct
    c = op_counts(k)
    assert c["bn_stats"] == 2 * tiles and c["bn_aggr"] == tiles and c["nc_matmul"] == tiles, c
    assert c["activation"] == 2 * tiles and c["dma_copy"] == 4 * tiles, c
    assert c["iota"] == 2, c
    prof = k.last_profile
    assert prof.stat("memory.hbm_read_bytes") == x.nbytes + N * (g.nbytes + b.nbytes)
    assert prof.stat("memory.hbm_write_bytes") == x.nbytes


def test_fused_silu_saves_a_scalar_pass(ubn):
    """GroupNorm with the SiLU fused into the normalising activation versus the affine evicted by ``op=copy`` and
    the SiLU as a second ScalarE pass over the tile. activation costs max(MIN_II, N) ScalarE cycles with the scale
    and bias free (cost model, 3.2): the split version spends one more pass of HW = 1024 elements per partition per
    (sample, tile), >= 1024 cycles each (<= 1.4 GHz: >= 731 ns), on the engine that also runs the fused pass, so
    the kernel is slower by about that much; the results agree."""
    N, C, H, W = 1, 256, 32, 32
    x, g, b = _gn_args(N, C, H, W, np.float32, seed=9)
    k = ubn.groupnorm_silu
    fused = run_clean(k, x, g, b)
    p_fused = k.last_profile
    n_fused = op_counts(k)["activation"]
    split = run_clean(k, x, g, b, 1e-5, 32, False)
    p_split = k.last_profile
    _, nct = _tile(C)
    assert op_counts(k)["activation"] == n_fused + N * nct
    close(fused, split, np.float32)
    assert _busy(p_split, "scalar") - _busy(p_fused, "scalar") >= N * nct * H * W / 1.4
    assert p_fused.total_time_ns < p_split.total_time_ns, (p_fused.total_time_ns, p_split.total_time_ns)


# --------------------------------------------------------------------------------------------------
# upsampling
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("N,C,H,W,dtype", [(1, 64, 8, 8, np.float32), (2, 192, 16, 12, BF16), (1, 320, 4, 8, BF16)])
def test_upsample_nearest2x_is_exact(ubn, N, C, H, W, dtype):
    x = randn((N, C, H, W), dtype, seed=C)
    y = run_clean(ubn.upsample_nearest2x, x)
    assert y.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(y.view(np.uint8), x.repeat(2, 2).repeat(2, 3).view(np.uint8))
    nct = -(-C // 128)
    c = op_counts(ubn.upsample_nearest2x)
    assert c["tensor_copy"] == 4 * N * nct and c["dma_copy"] == 2 * N * nct, c
    assert ubn.upsample_nearest2x.last_profile.stat("memory.hbm_write_bytes") == 4 * x.nbytes
    assert ubn.upsample_nearest2x.last_profile.stat("memory.hbm_read_bytes") == x.nbytes


@pytest.mark.parametrize("N,C,H,W,dtype", [(1, 64, 8, 6, np.float32), (2, 192, 16, 16, np.float32),
                                           (1, 128, 12, 20, BF16)])
def test_upsample_bilinear2x_matches_numpy(ub, N, C, H, W, dtype):
    x = randn((N, C, H, W), dtype, seed=C + 1)
    y = run_clean(ub[0].upsample_bilinear2x_b1, x)
    assert y.dtype == np.dtype(dtype)
    close(y, ref_bilinear2x(x), dtype)
    k = ub[0].upsample_bilinear2x_b1
    assert k.last_profile.stat("memory.hbm_read_bytes") == x.nbytes
    assert k.last_profile.stat("memory.hbm_write_bytes") == 4 * x.nbytes
    nct = -(-C // 128)
    assert op_counts(k)["dma_copy"] == 2 * N * nct


def test_bilinear_of_a_ramp_is_the_ramp_interpolated(ub):
    """A linear ramp along the columns is reproduced exactly at the interior output positions (x at (j + 0.5) / 2
    - 0.5 input coordinates), clamped at the two edges: the align_corners=False sample positions."""
    W = 8
    x = np.broadcast_to(np.arange(W, dtype=np.float32), (1, 64, 4, W)).copy()
    y = run_clean(ub[0].upsample_bilinear2x_b1, x)
    pos = np.clip((np.arange(2 * W) + 0.5) / 2 - 0.5, 0, W - 1)
    np.testing.assert_allclose(y[0, 5, 3], pos, rtol=0, atol=1e-6)


# --------------------------------------------------------------------------------------------------
# conv3x3
# --------------------------------------------------------------------------------------------------

CONV_CASES = [
    (1, 64, 64, 16, 16, np.float32),
    (1, 320, 320, 8, 8, BF16),     # 3 Cin tiles (128, 128, 64), 3 Cout tiles
    (2, 128, 192, 32, 32, BF16),   # two blocks of 16 rows (512 pixels) per Cout tile
    (1, 96, 160, 20, 24, np.float32),  # ragged row block: 21 rows per bank -> 20 in one block
]


def _conv_args(N, Cin, Cout, H, W, dtype, seed):
    x = randn((N, Cin, H, W), dtype, seed)
    w = (randn((Cin, 3, 3, Cout), np.float32, seed + 1) / np.sqrt(9 * Cin)).astype(dtype)
    b = randn((Cout,), np.float32, seed + 2)
    return x, w, b


@pytest.mark.parametrize("N,Cin,Cout,H,W,dtype", CONV_CASES)
def test_conv3x3_new_matches_numpy(ubn, N, Cin, Cout, H, W, dtype):
    x, w, b = _conv_args(N, Cin, Cout, H, W, dtype, seed=Cin + W)
    y = run_clean(ubn.conv3x3, x, w, b)
    close(y, ref_conv3x3(x, w, b), dtype)
    nkt, nmt = -(-Cin // 128), -(-Cout // 128)
    R = 512 // W
    nr = -(-H // R)
    assert op_counts(ubn.conv3x3)["nc_matmul"] == N * nmt * nr * nkt * 9
    prof = ubn.conv3x3.last_profile
    assert prof.stat("memory.hbm_read_bytes") == x.nbytes + w.nbytes + b.nbytes
    assert prof.stat("memory.hbm_write_bytes") == N * Cout * H * W * np.dtype(dtype).itemsize


@pytest.mark.parametrize("N,Cin,Cout,H,W,dtype", CONV_CASES[:3])
def test_conv3x3_b1_matches_numpy(ub, N, Cin, Cout, H, W, dtype):
    x, w, b = _conv_args(N, Cin, Cout, H, W, dtype, seed=Cin + H + 3)
    k = ub[0].conv3x3_b1
    y = run_clean(k, x, w, b)
    close(y, ref_conv3x3(x, w, b), dtype)
    nkt, nmt = -(-Cin // 128), -(-Cout // 128)
    nr = -(-H // (512 // W))
    assert op_counts(k)["nc_matmul"] == N * nmt * nr * nkt * 9
    # the bias vectors are loaded per image, the weights once
    assert k.last_profile.stat("memory.hbm_read_bytes") == x.nbytes + w.nbytes + N * b.nbytes


# --------------------------------------------------------------------------------------------------
# attention
# --------------------------------------------------------------------------------------------------

def _attn_args(Hh, Sq, Sk, dtype, seed, d=64):
    q = randn((Hh, d, Sq), dtype, seed)
    k = randn((Hh, d, Sk), dtype, seed + 1)
    v = randn((Hh, Sk, d), dtype, seed + 2)
    x = randn((Sq, Hh * d), dtype, seed + 3)
    return q, k, v, x


@pytest.mark.parametrize("Hh,Sq,Sk,dtype", [
    (2, 256, 256, np.float32),   # spatial self-attention, 16 x 16 tokens
    (1, 1024, 1024, BF16),       # 32 x 32 tokens: two key blocks of 512
    (2, 256, 77, np.float32),    # cross-attention to the 77 text tokens: one ragged key block
    (4, 512, 77, BF16),
    (1, 256, 600, np.float32),   # a ragged second key block of 88 keys
])
def test_unet_attention_matches_numpy(ubn, Hh, Sq, Sk, dtype):
    q, k, v, x = _attn_args(Hh, Sq, Sk, dtype, seed=Sq + Sk)
    y = run_clean(ubn.unet_attention, q, k, v, x)
    assert y.dtype == np.dtype(dtype)
    close(y, ref_attention(q, k, v, x), dtype)


def test_cross_attention_structure(ubn):
    """77 keys: per (head, query tile) one score matmul, one transpose of the [128, 77] probabilities and one p v
    matmul; the keys and values are read once per query tile, q once, x once."""
    Hh, Sq, Sk = 2, 512, 77
    q, k, v, x = _attn_args(Hh, Sq, Sk, np.float32, seed=11)
    kern = ubn.unet_attention
    run_clean(kern, q, k, v, x)
    nq = Sq // 128
    c = op_counts(kern)
    assert c["nc_matmul"] == 2 * Hh * nq and c["nc_transpose"] == Hh * nq, c
    assert c["dma_copy"] == Hh * nq * 5, c
    transposes = [o for o in executed_ops(kern.last_json["body"]) if o["op"] == "nc_transpose"]
    assert len(transposes) == Hh * nq
    prof = kern.last_profile
    assert prof.stat("memory.hbm_read_bytes") == q.nbytes + nq * (k.nbytes + v.nbytes) + x.nbytes
    assert prof.stat("memory.hbm_write_bytes") == x.nbytes


def test_attention_time_grows_quadratically_with_tokens(ubn):
    """Self-attention of 2048 versus 1024 tokens (one head, timing only): the work is (Sq / 128) x (Sk / 512) key
    blocks, each the same fixed mix of one score matmul, four transposes / p v matmuls and a few [128, 512] ScalarE /
    VectorE passes, so doubling the tokens quadruples the blocks and the time (within the per-query-tile set-up);
    cross-attention to 77 tokens of the 4096-token image is one small block per query tile and costs a fraction of
    the 4096-token self-attention."""
    times = {}
    for Sq, Sk in [(1024, 1024), (2048, 2048), (4096, 4096), (4096, 77)]:
        q, k, v, x = _attn_args(1, Sq, Sk, BF16, seed=1)
        _, prof = ubn.unet_attention.options(timing_only=True).simulate(q, k, v, x)
        times[(Sq, Sk)] = prof.total_time_ns
    r = times[(2048, 2048)] / times[(1024, 1024)]
    assert 3.0 < r < 4.5, times
    assert times[(4096, 4096)] > 3.0 * times[(2048, 2048)], times
    assert times[(4096, 77)] < times[(4096, 4096)] / 4, times


# --------------------------------------------------------------------------------------------------
# ResBlock tail
# --------------------------------------------------------------------------------------------------

def _res_args(N, C, H, W, dtype, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((N, C, H, W)).astype(dtype)
    temb = rng.standard_normal((N, C)).astype(np.float32)
    vec = [(rng.standard_normal(C) * 0.5 + (1.0 if i in (0, 3) else 0.0)).astype(np.float32) for i in range(6)]
    w1 = (rng.standard_normal((C, 3, 3, C)) / np.sqrt(9 * C)).astype(dtype)
    w2 = (rng.standard_normal((C, 3, 3, C)) / np.sqrt(9 * C)).astype(dtype)
    return x, temb, vec[0], vec[1], w1, vec[2], vec[3], vec[4], w2, vec[5]


def ref_resblock(x, temb, g1, be1, w1, b1, g2, be2, w2, b2):
    h = ref_conv3x3(ref_groupnorm(x, g1, be1), w1, b1) + f64(temb)[:, :, None, None]
    return f64(x) + ref_conv3x3(ref_groupnorm(h, g2, be2), w2, b2)


@pytest.mark.parametrize("N,C,H,W,dtype", [(2, 64, 8, 8, np.float32), (1, 320, 8, 8, np.float32),
                                           (1, 128, 16, 16, BF16)])
def test_resblock_tail_matches_numpy(ub, N, C, H, W, dtype):
    args = _res_args(N, C, H, W, dtype, seed=C)
    y = run_clean(ub[0].resblock_tail_b1, *args)
    assert y.dtype == np.dtype(dtype)
    close(y, ref_resblock(*args), dtype)


def test_resblock_tail_structure(ub):
    """N = 2, C = 320 (group tiles 120 / 120 / 80): per sample 2 x 9 x 3 x 3 conv matmuls and 2 x 3 indicator
    matmuls of the group statistics, plus the one M^T M; x is read once (the skip comes from SBUF), the weights
    once, the seven per-channel vectors once per sample; the output written once."""
    N, C, H, W = 2, 320, 8, 8
    args = _res_args(N, C, H, W, np.float32, seed=2)
    k = ub[0].resblock_tail_b1
    run_clean(k, *args)
    _, nct = _tile(C)
    c = op_counts(k)
    assert c["nc_matmul"] == N * (2 * 9 * nct * nct + 2 * nct) + 1, c
    assert c["affine_select"] == 2, c
    x, temb, w1, w2 = args[0], args[1], args[4], args[8]
    prof = k.last_profile
    assert prof.stat("memory.hbm_read_bytes") == x.nbytes + w1.nbytes + w2.nbytes + N * 7 * C * 4
    assert prof.stat("memory.hbm_write_bytes") == x.nbytes


# --------------------------------------------------------------------------------------------------
# more GroupNorm variants, nearest (Beta 1), Beta-1 cross-attention
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("N,C,H,W,dtype", GN_CASES[:3])
def test_groupnorm_transpose_combine_matches_numpy(ubn, N, C, H, W, dtype):
    """The group moments combined without the indicator matrix: transposed to [2, ct], a tensor_reduce of the
    [2, ng, gs] view, a stride-0 broadcast back and a transpose back: the same numbers."""
    x, g, b = _gn_args(N, C, H, W, dtype, seed=C + 3)
    k = ubn.groupnorm_silu
    y = run_clean(k, x, g, b, 1e-5, 32, True, "transpose")
    close(y, ref_groupnorm(x, g, b), dtype)
    _, nct = _tile(C)
    c = op_counts(k)
    assert c["nc_transpose"] == 2 * N * nct and c.get("nc_matmul", 0) == 0 and c["tensor_reduce"] == N * nct, c


def test_rstd_on_vector_avoids_act_table_switches(ubn):
    """ScalarE function tables come in sets (cost model 3.2, scalar.act_table_sets: rsqrt is in the
    sqrt+rsqrt+reciprocal set, silu in the tanh+sigmoid+silu+... set) and each switch costs scalar.act_table_load
    = 1330 ns on ScalarE. With the rstd computed by a ScalarE rsqrt every channel tile switches tables between the
    rsqrt and the SiLU; with rsqrt(var + eps) on VectorE (a tensor_scalar, ~MIN_II cycles for one element) ScalarE
    loads the SiLU set once. C = 1280 (10 channel tiles) at 8 x 8 pixels, where the table loads dominate: ScalarE
    is busy for at least one table load less, the kernel is faster, the results agree."""
    N, C, H, W = 1, 1280, 8, 8
    x, g, b = _gn_args(N, C, H, W, np.float32, seed=21)
    k = ubn.groupnorm_silu
    y_act = run_clean(k, x, g, b, 1e-5, 32, True, "matmul", False)
    p_act = k.last_profile
    y_vec = run_clean(k, x, g, b, 1e-5, 32, True, "matmul", True)
    p_vec = k.last_profile
    close(y_act, ref_groupnorm(x, g, b), np.float32)
    close(y_vec, ref_groupnorm(x, g, b), np.float32)
    assert _busy(p_act, "scalar") - _busy(p_vec, "scalar") >= 1330.0, (_busy(p_act, "scalar"), _busy(p_vec, "scalar"))
    assert p_vec.total_time_ns < p_act.total_time_ns, (p_vec.total_time_ns, p_act.total_time_ns)


@pytest.mark.parametrize("N,S,C,dtype", [(1, 256, 320, np.float32), (2, 200, 64, np.float32),
                                         (1, 256, 128, BF16)])
def test_groupnorm_tokens_layout_matches_numpy(ub, N, S, C, dtype):
    """The token layout [N, S, C] (pixels on the partitions, S = 200 a ragged second tile of 72): per-partition group
    sums of the [128, G, gs] view, totals over the partitions by tensor_partition_reduce, the [1, G, gs] scale and
    bias broadcast over the partitions by the value API."""
    x = (randn((N, S, C), np.float32, seed=S + C, scale=2.0) + 0.5).astype(dtype)
    g = randn((C,), np.float32, 1) * 0.5 + 1.0
    b = randn((C,), np.float32, 2) * 0.5
    k = ub[0].groupnorm_silu_tokens_b1
    y = run_clean(k, x, g, b)
    want = ref_groupnorm(f64(x).transpose(0, 2, 1)[..., None], g, b)[..., 0].transpose(0, 2, 1)
    close(y, want, dtype)
    assert op_counts(k)["tensor_partition_reduce"] == N
    assert k.last_profile.stat("memory.hbm_read_bytes") == x.nbytes + g.nbytes + b.nbytes


def test_upsample_nearest2x_b1_on_chip_beats_strided_stores(ub):
    """Nearest 2x (Beta 1): expanding in SBUF and storing the [C, 2H, 2W] tile contiguously versus four stores
    straight into the stride-2 HBM positions. Same bytes either way (4 x the input), but a strided store moves
    one 4-byte element per DMA buffer: per DMA engine (8 partitions) 8 x H x W buffers of 4 bytes, each at least
    dma.desc_min_ns, against 8 contiguous 4 H W x 4-byte rows (cost model 3.3, bandwidth curve: throughput falls
    with the bytes per buffer), so the on-chip version is several times faster."""
    x = randn((1, 192, 16, 16), np.float32, seed=4)
    k = ub[0].upsample_nearest2x_b1
    want = x.repeat(2, 2).repeat(2, 3)
    y1 = run_clean(k, x, True)
    t_chip = k.last_profile.total_time_ns
    assert op_counts(k)["dma_copy"] == 2 * 2
    y2 = run_clean(k, x, False)
    t_strided = k.last_profile.total_time_ns
    assert op_counts(k)["dma_copy"] == 2 * 5
    np.testing.assert_array_equal(y1, want)
    np.testing.assert_array_equal(y2, want)
    assert k.last_profile.stat("memory.hbm_write_bytes") == 4 * x.nbytes
    assert t_strided > 3 * t_chip, (t_chip, t_strided)


@pytest.mark.parametrize("Hh,Sq,dtype", [(2, 256, np.float32), (4, 512, BF16)])
def test_cross_attention_b1_matches_numpy(ub, Hh, Sq, dtype):
    """77 text tokens, token-major q, k, v loaded transposed by index expressions."""
    d, Sk = 64, 77
    rng = np.random.default_rng(Sq)
    q = rng.standard_normal((Hh, Sq, d)).astype(dtype)
    k = rng.standard_normal((Hh, Sk, d)).astype(dtype)
    v = rng.standard_normal((Hh, Sk, d)).astype(dtype)
    x = rng.standard_normal((Sq, Hh * d)).astype(dtype)
    kern = ub[0].cross_attention_b1
    y = run_clean(kern, q, k, v, x)
    want = ref_attention(q.transpose(0, 2, 1), k.transpose(0, 2, 1), v, x)
    close(y, want, dtype)
    nq = Sq // 128
    c = op_counts(kern)
    assert c["nc_transpose"] == Hh * nq and c["nc_matmul"] == 2 * Hh * nq, c
    assert kern.last_profile.stat("memory.hbm_read_bytes") == q.nbytes + k.nbytes + v.nbytes + x.nbytes


@pytest.mark.parametrize("Hh,S,dtype", [(2, 256, np.float32), (2, 1024, BF16), (1, 640, np.float32)])
def test_sd_self_attention_b1_grid_matches_numpy(ub, Hh, S, dtype):
    """One program per head (an SPMD grid), the full score row in SBUF; S = 640: a ragged key block of 128."""
    d = 64
    rng = np.random.default_rng(S)
    q, k, v = (rng.standard_normal((Hh, S, d)).astype(dtype) for _ in range(3))
    x = rng.standard_normal((S, Hh * d)).astype(dtype)
    kern = ub[0].sd_self_attention_b1
    y = run_clean(kern[Hh], q, k, v, x)
    close(y, ref_attention(q.transpose(0, 2, 1), k.transpose(0, 2, 1), v, x), dtype)
    nq = nk = S // 128
    nkb = -(-S // 512)
    c = op_counts(kern)
    assert c["nc_transpose"] == Hh * nq * nk and c["nc_matmul"] == Hh * nq * (nkb + nk), c
    assert kern.last_profile.stat("memory.hbm_read_bytes") == q.nbytes + k.nbytes + v.nbytes + x.nbytes
    assert kern.last_profile.stat("memory.hbm_write_bytes") == x.nbytes


@pytest.mark.parametrize("N,C,H,W,dtype", [(1, 64, 8, 6, np.float32), (2, 192, 16, 16, BF16),
                                           (1, 32, 1, 5, np.float32)])
def test_upsample_bilinear2x_new_matches_numpy_and_b1(ubn, ub, N, C, H, W, dtype):
    """The new-dialect bilinear kernel (strided-view writes of tensor_scalar / scalar_tensor_tensor) agrees with the
    numpy reference and with the Beta-1 kernel (index-expression writes); H = 1: both row parities are the edge row.
    Per channel tile 4 edge copies, 2 x 2 lerps of two instructions each, 2 DMAs."""
    x = randn((N, C, H, W), dtype, seed=H * W)
    y = run_clean(ubn.upsample_bilinear2x, x)
    close(y, ref_bilinear2x(x), dtype)
    close(y, run_clean(ub[0].upsample_bilinear2x_b1, x), dtype)
    nct = -(-C // 128)
    c = op_counts(ubn.upsample_bilinear2x)
    assert c["tensor_copy"] == 4 * N * nct and c["scalar_tensor_tensor"] == 4 * N * nct, c
    assert c["tensor_scalar"] == 4 * N * nct and c["dma_copy"] == 2 * N * nct, c


# --------------------------------------------------------------------------------------------------
# regression tests of the nsim fixes
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("N,C,Cout,H,W,dtype", [(1, 64, 96, 32, 32, np.float32), (2, 128, 128, 8, 8, BF16)])
def test_nl_matmul_takes_an_image_window_as_moving(ub, N, C, Cout, H, W, dtype):
    """Regression (python/nsim/nki/language.py ``matmul``): ``nl.matmul(w_tap, xp[:, nl.ds(r0 + kh, R), nl.ds(kw,
    W)], transpose_x=True)`` with a [Cin, R, W] window was NSIM-E436 "2-D tiles are needed", although
    nl.matmul(transpose_x=True) is nc_matmul with x stationary (spec 2.1) and nc_matmul's moving operand may have
    several free dims (spec 2.0: same partitions, elements per partition paired in row-major order). The result is
    the [M, R, W] PSUM tile, as nisa.nc_matmul gives."""
    x, w, b = _conv_args(N, C, Cout, H, W, dtype, seed=C + H)
    k = ub[0].conv3x3_nl_b1
    y = run_clean(k, x, w, b)
    close(y, ref_conv3x3(x, w, b), dtype)
    R = min(H, 512 // W)
    assert op_counts(k)["nc_matmul"] == N * (H // R) * 9


def test_nl_matmul_masked_off_keeps_the_window_shape(ub):
    """Regression (python/nsim/nki/language.py ``matmul``, as above) through the Beta-1 wrapper with a compile-time
    mask: ``ps[...] += nl.matmul(w, window, transpose_x=True, mask=(tap == 0))`` into a [M, H, W] accumulator
    issues the first tap (a [K, H, W] moving window, E436 before the fix) and skips the second."""
    _, nki, nl, nisa = ub

    @nki.jit
    def two_taps(x, w):
        C, H, W = x.shape
        out = nl.ndarray((C, H, W), dtype=x.dtype, buffer=nl.shared_hbm)
        xt = nl.load(x)
        wt = nl.load(w)
        ps = nl.zeros((C, H, W), dtype=nl.float32, buffer=nl.psum)
        for tap in nl.static_range(2):
            ps[...] += nl.matmul(wt, xt[:, nl.ds(0, H), nl.ds(0, W)], transpose_x=True, mask=(tap == 0))
        nl.store(out, value=nl.copy(ps, dtype=x.dtype))
        return out

    x = randn((32, 4, 8), np.float32, 1)
    w = randn((32, 32), np.float32, 2)
    y = run_clean(two_taps, x, w)
    close(y, np.einsum("co,chw->ohw", f64(w), f64(x)), np.float32)
    assert op_counts(two_taps)["nc_matmul"] == 1
