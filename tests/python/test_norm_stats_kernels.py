"""Normalization variants and streaming statistics written like public NKI kernels
(tests/python/kernels/norm_stats_kernels.py, Beta-1 dialect, and norm_stats_kernels_new.py, new dialect; both
unmodified, through ``nsim.compat``):

- BatchNorm training (Beta 1), channels on the partitions: the forward over [N, C, HW] (batch mean / variance from
  one ``bn_stats`` per sample side by side and one ``bn_aggr``, the normalize + affine as one ``activation`` per
  sample with per-channel scale / bias vectors) and over [N, C] (each channel tile loaded transposed by an index
  expression, statistics by sums), the running mean / variance updated with momentum from the unbiased variance
  (torch.nn.BatchNorm semantics, also over several steps), and the backward (dx, dgamma, dbeta);
- InstanceNorm per (sample, channel) over HW and weight standardization of a conv weight [Cout, Cin k k] (new
  dialect; bn_stats per 512-element chunk, a ragged last row tile);
- streaming mean / variance of long rows processed in chunks, merged by Chan's parallel (Welford) update or by
  ``bn_stats`` per chunk + ``bn_aggr``, compared with a two-pass variance and float64 numpy on data with a large
  offset; global mean / variance across all 128 partitions by a ones matmul and by ``tensor_partition_reduce``;
- L2-normalized rows and a cosine-similarity matrix on the PE (``nc_transpose`` + ``nc_matmul`` blocks), and a
  fused residual add + LayerNorm + dropout (``nl.random_seed`` with a fixed seed; ``nisa.dropout`` in the new
  dialect, ``nl.dropout`` or a hand-written ``nl.rand() >= p`` keep mask in Beta 1).

Checked: outputs against float64 numpy (fp32 1e-5, bf16 1e-2; the Welford merge 3e-5 on rows of mean 100 and std
down to 0.1, and bit for bit against a step-by-step fp32 emulation of its instructions), the reference backward
itself against finite differences, constant channels (variance 0: y = beta, no NaN), dropout statistics (dropped
fraction within 5 sigma of p overall and per row, kept values the LayerNorm output scaled by 1 / (1 - p)) and exact
reproducibility from the seed (another seed: another mask), no sanitizer report (every warning an error) -- and the
sanitizer's reports when eps is left out (rsqrt of a variance below 2^-87: W507; of 0: W503) --, the instruction /
DMA counts and HBM traffic the tiling implies, and in nsim's timing the streaming variance (chunk DMAs overlapped
with the merge) faster than the two-pass one (bn_stats streaming faster still) and one dropout instruction faster
than rand + compare + multiply.

The nsim fix this family needed (its regression test fails without it):
- the canonical Beta-1 statistics pattern ``stats[i_p, j * 6 + i_6] = nisa.bn_stats(x[...])`` (the LayerNorm
  tutorial, and ``mv[...] = nisa.bn_aggr(stats)``) made nsim emit an extra VectorE ``tensor_copy`` of every
  bn_stats / bn_aggr result into the destination view: ``bn_stats`` / ``bn_aggr`` were missing from the set of
  instructions a fresh temporary's producer may be retargeted to write the assigned view directly
  (python/nsim/nki/beta1/language.py ``_RETARGET_OPS``, used by ``_retarget_fresh``), so the timing had one
  copy per statistics instruction that the compiled kernel does not have;
  ``test_bn_stats_assigned_into_view_has_no_copy``."""
import warnings

import numpy as np
import pytest

from conftest import require_core, sample_fixture  # noqa: E402
from conftest import run_clean as _run  # noqa: E402
from conftest import op_counts as _ops  # noqa: E402

_core, ml_dtypes = require_core()
from numeric_helpers import close, f64 as _f64, randn as _randn  # noqa: E402

BF16 = ml_dtypes.bfloat16

ns = sample_fixture("norm_stats_kernels.py")
nsn = sample_fixture("norm_stats_kernels_new.py", module_only=True)


def _vec(C, seed, lo=None):
    rng = np.random.default_rng(seed)
    if lo is not None:
        return (rng.random(C) + lo).astype(np.float32)
    return rng.standard_normal(C).astype(np.float32)


# --------------------------------------------------------------------------------------------------
# BatchNorm (Beta 1)
# --------------------------------------------------------------------------------------------------

def ref_bn_fwd(x, g, b, rm, rv, momentum, eps, axes):
    """y, batch mean, rstd, new running mean / var (torch: the running var from the unbiased variance)."""
    xd = _f64(x)
    mean = xd.mean(axes)
    var = xd.var(axes)
    M = xd.size // mean.size
    shape = [1] * xd.ndim
    shape[1] = -1
    rstd = 1.0 / np.sqrt(var + eps)
    y = (xd - mean.reshape(shape)) * rstd.reshape(shape) * _f64(g).reshape(shape) + _f64(b).reshape(shape)
    return (y, mean, rstd, (1 - momentum) * _f64(rm) + momentum * mean,
            (1 - momentum) * _f64(rv) + momentum * var * M / (M - 1))


def ref_bn_bwd(dy, x, g, eps):
    xd, dyd = _f64(x), _f64(dy)
    mean = xd.mean((0, 2), keepdims=True)
    rstd = 1.0 / np.sqrt(xd.var((0, 2), keepdims=True) + eps)
    xh = (xd - mean) * rstd
    M = xd.shape[0] * xd.shape[2]
    db = dyd.sum((0, 2))
    dg = (dyd * xh).sum((0, 2))
    dx = _f64(g)[None, :, None] * rstd / M * (M * dyd - db[None, :, None] - xh * dg[None, :, None])
    return dx, dg, db


@pytest.mark.parametrize("N,C,HW,dtype", [
    (4, 256, 196, np.float32),   # 2 channel tiles, 14 x 14 maps
    (2, 384, 64, BF16),          # 3 channel tiles
    (3, 128, 512, np.float32),   # one bn_stats at its full 512 width per sample
    (2, 256, 784, np.float32),   # 28 x 28: two bn_stats per sample, the second under a free-dim mask (272 of 512)
    (2, 128, 1100, BF16),        # three chunks, the last 76 wide
])
def test_batchnorm2d_fwd_matches_numpy(ns, N, C, HW, dtype):
    m = ns[0]
    x = (_randn((N, C, HW), np.float32, seed=C + HW, scale=2.0) + 0.5).astype(dtype)
    g, b, rm = _vec(C, 1), _vec(C, 2), _vec(C, 3)
    rv = _vec(C, 4, lo=0.5)
    y, mean, rstd, nrm, nrv = _run(m.batchnorm2d_fwd, x, g, b, rm, rv, 0.1, 1e-5)
    wy, wm, wr, wrm, wrv = ref_bn_fwd(x, g, b, rm, rv, 0.1, 1e-5, (0, 2))
    assert y.dtype == np.dtype(dtype) and mean.dtype == np.float32
    close(y, wy, dtype)
    for got, want in ((mean, wm), (rstd, wr), (nrm, wrm), (nrv, wrv)):  # statistics in fp32 in both cases
        close(got, want)


def test_batchnorm2d_fwd_structure(ns):
    """Per channel tile: N sample loads, N bn_stats written straight into the stats tile (no copies), one
    bn_aggr, one rsqrt activation plus N normalize activations, N stores, 4 channel-vector loads and 4 stores:
    x crosses HBM once each way."""
    m = ns[0]
    N, C, HW = 4, 256, 196
    CT = C // 128
    x = _randn((N, C, HW), np.float32, seed=1)
    g, b, rm, rv = _vec(C, 1), _vec(C, 2), _vec(C, 3), _vec(C, 4, lo=0.5)
    _run(m.batchnorm2d_fwd, x, g, b, rm, rv)
    c = _ops(m.batchnorm2d_fwd)
    assert c["bn_stats"] == N * CT and c["bn_aggr"] == CT and c["activation"] == (N + 1) * CT, c
    assert c["tensor_copy"] == 0 and c["dma_copy"] == CT * (2 * N + 8), c
    prof = m.batchnorm2d_fwd.last_profile
    assert prof.stat("memory.hbm_read_bytes") == x.nbytes + 4 * C * 4
    assert prof.stat("memory.hbm_write_bytes") == x.nbytes + 4 * C * 4
    # 28 x 28 maps: two bn_stats per sample (the masked second chunk also written in place)
    x = _randn((N, C, 784), np.float32, seed=2)
    _run(m.batchnorm2d_fwd, x, g, b, rm, rv)
    c = _ops(m.batchnorm2d_fwd)
    assert c["bn_stats"] == 2 * N * CT and c["bn_aggr"] == CT and c["tensor_copy"] == 0, c


def test_batchnorm2d_constant_channel(ns):
    """A channel holding one value everywhere: variance 0, rstd = eps^-1/2 (inside rsqrt's range), y = beta (exactly
    for a zero channel; x scale + (beta - mean scale) rounds in fp32 otherwise); no NaN, no sanitizer report."""
    m = ns[0]
    N, C, HW = 2, 128, 100
    x = _randn((N, C, HW), np.float32, seed=3)
    x[:, 5, :] = 3.25
    x[:, 77, :] = 0.0
    g, b = _vec(C, 1), _vec(C, 2)
    y, mean, rstd, _, nrv = _run(m.batchnorm2d_fwd, x, g, b, np.zeros(C, np.float32), np.ones(C, np.float32))
    for ch, v in ((5, 3.25), (77, 0.0)):
        assert mean[ch] == v and rstd[ch] == pytest.approx(1e-5 ** -0.5, rel=1e-6)
        close(y[:, ch, :], np.full((N, HW), b[ch]))
        assert nrv[ch] == pytest.approx(0.9, rel=1e-6)
    np.testing.assert_array_equal(y[:, 77, :], np.full((N, HW), b[77], np.float32))
    assert np.isfinite(y).all()


@pytest.mark.parametrize("N,C,dtype", [(256, 384, np.float32), (500, 256, BF16), (64, 128, np.float32)])
def test_batchnorm1d_fwd_matches_numpy(ns, N, C, dtype):
    """[N, C] with the channels on the partitions: one transposing load and one transposing store per channel
    tile; statistics by sums."""
    m = ns[0]
    x = (_randn((N, C), np.float32, seed=N + C) * 1.5 - 0.7).astype(dtype)
    g, b, rm, rv = _vec(C, 5), _vec(C, 6), _vec(C, 7), _vec(C, 8, lo=0.5)
    y, nrm, nrv = _run(m.batchnorm1d_fwd, x, g, b, rm, rv, 0.1, 1e-5)
    wy, _, _, wrm, wrv = ref_bn_fwd(x[:, :, None], g, b, rm, rv, 0.1, 1e-5, (0, 2))
    close(y, wy[:, :, 0], dtype)
    close(nrm, wrm)
    close(nrv, wrv)
    c = _ops(m.batchnorm1d_fwd)
    assert c["dma_transpose"] == 2 * C // 128 and c["dma_copy"] == 6 * C // 128, c


def test_running_stats_over_steps_follow_torch(ns):
    """Three training steps feeding the running statistics back, momentum 0.3: the torch recurrence
    running = (1 - m) running + m stat, with the unbiased batch variance (M / (M - 1) for M = N HW = 128)."""
    m = ns[0]
    N, C, HW = 2, 128, 64
    g, b = _vec(C, 1), _vec(C, 2)
    rm, rv = np.zeros(C, np.float32), np.ones(C, np.float32)
    wrm, wrv = _f64(rm), _f64(rv)
    for step in range(3):
        x = _randn((N, C, HW), np.float32, seed=10 + step, scale=1.0 + step) + step
        _, _, _, rm, rv = _run(m.batchnorm2d_fwd, x, g, b, rm, rv, 0.3, 1e-5)
        wrm = 0.7 * wrm + 0.3 * _f64(x).mean((0, 2))
        wrv = 0.7 * wrv + 0.3 * _f64(x).var((0, 2), ddof=1)
        close(rm, wrm)
        close(rv, wrv)


def test_reference_backward_against_finite_differences():
    """The float64 backward reference is d/dx, d/dgamma, d/dbeta of L = sum(dy * batchnorm(x))."""
    rng = np.random.default_rng(0)
    N, C, HW, eps = 2, 3, 5, 1e-5
    x, dy = rng.standard_normal((N, C, HW)), rng.standard_normal((N, C, HW))
    g, b = rng.standard_normal(C), rng.standard_normal(C)

    def loss(x, g, b):
        return (dy * ref_bn_fwd(x, g, b, np.zeros(C), np.ones(C), 0.1, eps, (0, 2))[0]).sum()

    dx, dg, db = ref_bn_bwd(dy, x, g, eps)
    h = 1e-6
    for idx in [(0, 0, 0), (1, 2, 4), (0, 1, 3)]:
        xp, xm = x.copy(), x.copy()
        xp[idx] += h
        xm[idx] -= h
        assert (loss(xp, g, b) - loss(xm, g, b)) / (2 * h) == pytest.approx(dx[idx], rel=1e-5, abs=1e-7)
    for c in range(C):
        e = np.eye(C)[c] * h
        assert (loss(x, g + e, b) - loss(x, g - e, b)) / (2 * h) == pytest.approx(dg[c], rel=1e-5)
        assert (loss(x, g, b + e) - loss(x, g, b - e)) / (2 * h) == pytest.approx(db[c], rel=1e-5)


@pytest.mark.parametrize("N,C,HW,dtype", [(4, 256, 196, np.float32), (2, 384, 64, BF16)])
def test_batchnorm2d_bwd_matches_numpy(ns, N, C, HW, dtype):
    """dx, dgamma, dbeta from the forward's saved mean / rstd; dx sums to ~0 per channel and is orthogonal to x
    hat (the two projections the BatchNorm gradient removes)."""
    m = ns[0]
    x = (_randn((N, C, HW), np.float32, seed=HW, scale=2.0) + 1.0).astype(dtype)
    dy = _randn((N, C, HW), dtype, seed=HW + 1)
    g, b = _vec(C, 1), _vec(C, 2)
    _, mean, rstd, _, _ = _run(m.batchnorm2d_fwd, x, g, b, np.zeros(C, np.float32), np.ones(C, np.float32))
    dx, dg, db = _run(m.batchnorm2d_bwd, dy, x, g, mean, rstd)
    wdx, wdg, wdb = ref_bn_bwd(dy, x, g, 1e-5)
    assert dx.dtype == np.dtype(dtype)
    close(dx, wdx, dtype)
    # dgamma / dbeta are sums of N HW terms: relative to their scale
    np.testing.assert_allclose(dg, wdg, rtol=1e-5, atol=1e-5 * np.abs(wdg).max())
    np.testing.assert_allclose(db, wdb, rtol=1e-5, atol=1e-5 * np.abs(wdb).max())
    if dtype == np.float32:
        assert np.abs(_f64(dx).sum((0, 2))).max() < 1e-4
    c = _ops(m.batchnorm2d_bwd)
    CT = C // 128
    assert c["dma_copy"] == CT * (2 * N + N + 3 + 2) and c["tensor_reduce"] == 2 * N * CT, c


# --------------------------------------------------------------------------------------------------
# InstanceNorm, weight standardization (new dialect)
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("N,C,HW,dtype", [(2, 256, 784, np.float32), (3, 128, 196, BF16), (1, 384, 1024, BF16)])
def test_instance_norm_matches_numpy(nsn, N, C, HW, dtype):
    x = (_randn((N, C, HW), np.float32, seed=HW, scale=3.0) + 2.0).astype(dtype)
    g, b = _vec(C, 1), _vec(C, 2)
    y = _run(nsn.instance_norm, x, g, b, 1e-5)
    xd = _f64(x)
    want = ((xd - xd.mean(2, keepdims=True)) / np.sqrt(xd.var(2, keepdims=True) + 1e-5) * g[None, :, None]
            + b[None, :, None])
    assert y.dtype == np.dtype(dtype)
    close(y, want, dtype)
    c = _ops(nsn.instance_norm)
    CT, nch = C // 128, -(-HW // 512)
    assert c["bn_stats"] == N * CT * nch and c["bn_aggr"] == N * CT, c
    assert c["dma_copy"] == CT * (2 + 2 * N), c


@pytest.mark.parametrize("Cout,Cin,k,dtype", [(200, 64, 3, np.float32), (256, 128, 3, BF16), (64, 3, 7, np.float32)])
def test_weight_standardization_matches_numpy(nsn, Cout, Cin, k, dtype):
    """Per output channel over Cin k k (576, 1152 = 3 bn_stats chunks with a 128 tail, 147); 200 rows = a
    ragged second row tile."""
    K = Cin * k * k
    w = (_randn((Cout, K), np.float32, seed=K, scale=0.05) + 0.01).astype(dtype)
    out = _run(nsn.weight_standardization, w, 1e-5)
    wd = _f64(w)
    want = (wd - wd.mean(1, keepdims=True)) / np.sqrt(wd.var(1, keepdims=True) + 1e-5)
    close(out, want, dtype)
    c = _ops(nsn.weight_standardization)
    assert c["bn_stats"] == -(-Cout // 128) * -(-K // 512), c


def _reports(k, *args):
    """The sanitizer report codes of one run of ``k`` (warnings recorded, not raised)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        k(*args)
    return [str(w.message).split()[0] for w in caught]


def test_sanitizer_flags_missing_eps(nsn):
    """What eps is for: without it a degenerate filter's rsqrt leaves the hardware function's range. A row of
    tiny values (variance ~1e-32 < 2^-87) is NSIM-W507, a constant row (variance 0, rsqrt = inf) NSIM-W503; with
    eps = 1e-5 the same weights run clean."""
    w = _randn((128, 576), np.float32, seed=1)
    w[3] *= 1e-16
    assert "NSIM-W507" in _reports(nsn.weight_standardization, w, 0.0)
    w2 = w.copy()
    w2[7] = 0.5
    assert "NSIM-W503" in _reports(nsn.weight_standardization, w2, 0.0)
    out = _run(nsn.weight_standardization, w2, 1e-5)
    assert np.isfinite(out).all() and (out[7] == 0).all()


# --------------------------------------------------------------------------------------------------
# Streaming statistics (new dialect)
# --------------------------------------------------------------------------------------------------

def _seq_sum(a):
    """Row sums accumulated element by element in fp32 (VectorE / ScalarE reduction order)."""
    s = np.zeros(a.shape[0], np.float32)
    for j in range(a.shape[1]):
        s += a[:, j]
    return s


def emulate_welford_fp32(x, chunk):
    """welford_stream's arithmetic step by step in fp32 (each instruction rounds to fp32)."""
    f = np.float32
    P, L = x.shape
    mean, m2 = np.zeros(P, f), np.zeros(P, f)
    for c in range(L // chunk):
        n_a, n_b = c * chunk, chunk
        n = n_a + n_b
        xc = x[:, c * chunk:(c + 1) * chunk]
        neg_mb = _seq_sum(xc) * f(-1.0 / n_b)
        m2_b = _seq_sum(np.square(xc + neg_mb[:, None]))
        delta = (neg_mb + mean) * f(-1.0)
        mean = delta * f(n_b / n) + mean
        m2 = (delta * delta) * f(n_a * n_b / n) + m2
        m2 = m2 + m2_b
    return mean, m2 * f(1.0 / L)


@pytest.mark.parametrize("L,chunk", [(2048, 512), (1536, 256), (4096, 1024)])
def test_welford_merge_matches_two_pass(nsn, L, chunk):
    """Rows with a large offset (100 + N(0, s^2), s per row down to 0.1): the single-pass E[x^2] - E[x]^2 in fp32
    loses most digits there; the two-pass variance keeps 1e-5 of float64 numpy, the chunked Chan / Welford merge
    3e-5 (its delta = mean_b - mean_a carries the fp32 rounding of the chunk sums of values ~100) and equals a
    step-by-step fp32 emulation of its instructions bit for bit."""
    rng = np.random.default_rng(L + chunk)
    x = (100.0 + rng.standard_normal((128, L)) * rng.uniform(0.1, 3.0, (128, 1))).astype(np.float32)
    xd = _f64(x)
    naive = (x * x).mean(1, dtype=np.float32) - x.mean(1, dtype=np.float32) ** 2
    assert np.abs(naive / xd.var(1) - 1).max() > 1e-3  # the failure mode both avoid
    a = _run(nsn.welford_stream, x, chunk)
    t = _run(nsn.two_pass_var, x)
    np.testing.assert_allclose(t[:, 0], xd.mean(1), rtol=1e-5)
    np.testing.assert_allclose(t[:, 1], xd.var(1), rtol=1e-5)
    np.testing.assert_allclose(a[:, 0], xd.mean(1), rtol=1e-6)
    np.testing.assert_allclose(a[:, 1], xd.var(1), rtol=3e-5)
    np.testing.assert_allclose(a[:, 1], t[:, 1], rtol=3e-5)
    if chunk <= 512:  # bn_stats' width limit
        s = _run(nsn.bn_stats_stream, x, chunk)
        np.testing.assert_allclose(s[:, 0], xd.mean(1), rtol=1e-6)
        np.testing.assert_allclose(s[:, 1], xd.var(1), rtol=1e-5)
        cs = _ops(nsn.bn_stats_stream)
        assert cs["bn_stats"] == L // chunk and cs["bn_aggr"] == 1 and cs["dma_copy"] == L // chunk + 1, cs
    e_mean, e_var = emulate_welford_fp32(x, chunk)
    np.testing.assert_array_equal(a[:, 0], e_mean)
    np.testing.assert_array_equal(a[:, 1], e_var)
    c = _ops(nsn.welford_stream)
    assert c["dma_copy"] == L // chunk + 1 and c["activation"] == L // chunk and c["tensor_reduce"] == L // chunk, c


def test_welford_partial_rows(nsn):
    """P = 96 rows (a partial partition range in every instruction)."""
    x = _randn((96, 1024), np.float32, seed=3) * 0.5 - 4.0
    a = _run(nsn.welford_stream, x, 256)
    close(a[:, 0], _f64(x).mean(1))
    close(a[:, 1], _f64(x).var(1))


def test_streaming_is_faster_than_two_pass(nsn):
    """The chunked pass overlaps each chunk's DMA with the previous chunk's statistics (VectorE reduce, ScalarE
    square-reduce) and reads x once; the two-pass kernel waits for the whole row and then makes three vector passes
    over it; bn_stats streaming (one vector pass per chunk, one bn_aggr) is faster still. All read x from HBM
    exactly once."""
    x = _randn((128, 4096), np.float32, seed=4) + 10.0
    prof = {}
    for name, args in (("welford_stream", (x, 512)), ("two_pass_var", (x,)), ("bn_stats_stream", (x, 512))):
        k = getattr(nsn, name)
        _run(k, *args)
        prof[name] = k.last_profile
        assert prof[name].stat("memory.hbm_read_bytes") == x.nbytes
    t = {k: p.total_time_ns for k, p in prof.items()}
    assert t["bn_stats_stream"] < t["welford_stream"] < t["two_pass_var"], t
    vb = {k: p.stat("engine.vector.busy_time") for k, p in prof.items()}
    assert vb["bn_stats_stream"] < vb["two_pass_var"], vb


@pytest.mark.parametrize("F", [256, 1000])
def test_global_stats_across_partitions(nsn, F):
    """Mean / variance of all 128 F elements: the ones matmul (PE, totals on every partition) and GpSimd's
    tensor_partition_reduce give the same numbers, both matching numpy."""
    x = _randn((128, F), np.float32, seed=F) * 0.8 + 0.3
    xd = _f64(x)
    a = _run(nsn.global_stats_matmul, x)
    b = _run(nsn.global_stats_partition_reduce, x)
    for got in (a, b):
        np.testing.assert_allclose(got[0, 0], xd.mean(), rtol=1e-5)
        np.testing.assert_allclose(got[0, 1], xd.var(), rtol=1e-4)
    np.testing.assert_allclose(a, b, rtol=1e-6)
    ca, cb = _ops(nsn.global_stats_matmul), _ops(nsn.global_stats_partition_reduce)
    assert ca["nc_matmul"] == 1 and ca["tensor_partition_reduce"] == 0, ca
    assert cb["nc_matmul"] == 0 and cb["tensor_partition_reduce"] == 1, cb
    assert nsn.global_stats_partition_reduce.last_profile.stat("engine.gpsimd.instruction_count") >= 1
    assert nsn.global_stats_matmul.last_profile.stat("engine.tensor.instruction_count") >= 1


# --------------------------------------------------------------------------------------------------
# L2 normalize, cosine similarity, residual + LayerNorm + dropout (new dialect)
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("N,D,dtype", [(256, 64, np.float32), (384, 128, BF16), (512, 32, np.float32)])
def test_l2_normalize_and_cosine_similarity(nsn, N, D, dtype):
    x = _randn((N, D), dtype, seed=N + D)
    xd = _f64(x)
    xn = xd / np.linalg.norm(xd, axis=1, keepdims=True)
    out = _run(nsn.l2_normalize, x)
    close(out, xn, dtype)
    sim = _run(nsn.cosine_similarity, x)
    assert sim.shape == (N, N) and sim.dtype == np.float32
    if dtype == np.float32:
        close(sim, xn @ xn.T)
        close(np.diag(sim), np.ones(N))
    else:  # the normalized rows are rounded to bf16 before the PE
        np.testing.assert_allclose(sim, xn @ xn.T, atol=1e-2)
    np.testing.assert_array_equal(sim, sim.T)  # the same products, summed in the same order
    NT = N // 128
    c = _ops(nsn.cosine_similarity)
    assert c["nc_transpose"] == NT and c["nc_matmul"] == NT and c["dma_copy"] == 2 * NT, c


def _ln(h, g, b, eps=1e-5):
    return (h - h.mean(1, keepdims=True)) / np.sqrt(h.var(1, keepdims=True) + eps) * g + b


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_residual_layernorm_dropout(nsn, p):
    """h = x + res exactly (fp32); kept outputs = LayerNorm(h) / (1 - p); the dropped fraction within 5 sigma of p;
    the same seed reproduces the output bit for bit, another seed drops other elements."""
    N, H = 256, 768
    x = _randn((N, H), np.float32, seed=1)
    r = _randn((N, H), np.float32, seed=2)
    g, b = _vec(H, 3), _vec(H, 4)
    seed = np.array([[1234]], np.int32)
    h, out = _run(nsn.residual_layernorm_dropout, x, r, g, b, seed, p)
    np.testing.assert_array_equal(h, x + r)
    want = _ln(_f64(x + r), _f64(g), _f64(b)) / (1 - p)
    dropped = out == 0
    frac = dropped.mean()
    assert abs(frac - p) < 5 * np.sqrt(p * (1 - p) / out.size), frac
    close(out[~dropped], want[~dropped])
    # no row or column pattern: each row's and each column's dropped fraction stays near p
    assert np.abs(dropped.mean(1) - p).max() < 6 * np.sqrt(p * (1 - p) / H)
    _, out2 = _run(nsn.residual_layernorm_dropout, x, r, g, b, seed, p)
    np.testing.assert_array_equal(out, out2)
    _, out3 = _run(nsn.residual_layernorm_dropout, x, r, g, b, np.array([[99]], np.int32), p)
    assert (dropped != (out3 == 0)).mean() > p * (1 - p)  # independent masks differ in ~2 p (1 - p)
    c = _ops(nsn.residual_layernorm_dropout)
    assert c["dropout"] == N // 128 and c["bn_stats"] == 2 * N // 128, c


@pytest.mark.parametrize("use_rand", [False, True])
def test_residual_layernorm_dropout_beta1(ns, use_rand):
    """The Beta-1 form (``nl.random_seed(nl.load(seed))``, ``nl.dropout`` or an ``nl.rand() >= p`` keep mask; the
    LayerNorm with masked bn_stats chunks of H = 768): the same statistical and reproducibility checks."""
    m = ns[0]
    N, H, p = 256, 768, 0.2
    x = _randn((N, H), np.float32, seed=11)
    r = _randn((N, H), np.float32, seed=12)
    g, b = _vec(H, 13), _vec(H, 14)
    seed = np.array([[42]], np.int32)
    h, out = _run(m.residual_layernorm_dropout_b1, x, r, g, b, seed, p, 1e-5, use_rand)
    np.testing.assert_array_equal(h, x + r)
    dropped = out == 0
    assert abs(dropped.mean() - p) < 5 * np.sqrt(p * (1 - p) / out.size), dropped.mean()
    want = _ln(_f64(x + r), _f64(g), _f64(b)) / (1 - p)
    close(out[~dropped], want[~dropped])
    _, out2 = _run(m.residual_layernorm_dropout_b1, x, r, g, b, seed, p, 1e-5, use_rand)
    np.testing.assert_array_equal(out, out2)
    _, out3 = _run(m.residual_layernorm_dropout_b1, x, r, g, b, np.array([[43]], np.int32), p, 1e-5, use_rand)
    assert not np.array_equal(dropped, out3 == 0)
    c = _ops(m.residual_layernorm_dropout_b1)
    NT = N // 128
    assert c["set_rng_seed"] == 1 and c["bn_stats"] == 2 * NT and c["bn_aggr"] == NT, c
    assert c["dropout"] == (0 if use_rand else NT) and c["rng"] == (NT if use_rand else 0), c
    assert c["dma_copy"] == 3 + 4 * NT, c


def test_dropout_instruction_faster_than_rand_mask(ns):
    """One VectorE dropout per tile beats drawing uniforms, comparing and multiplying (same traffic)."""
    m = ns[0]
    N, H = 256, 768
    x = _randn((N, H), np.float32, seed=1)
    r = _randn((N, H), np.float32, seed=2)
    g, b = _vec(H, 3), _vec(H, 4)
    seed = np.array([[5]], np.int32)
    t = {}
    for use_rand in (False, True):
        _run(m.residual_layernorm_dropout_b1, x, r, g, b, seed, 0.1, 1e-5, use_rand)
        t[use_rand] = m.residual_layernorm_dropout_b1.last_profile.total_time_ns
    assert t[False] < t[True], t


def test_dropout_zero_prob_is_layernorm(nsn):
    N, H = 128, 512
    x = _randn((N, H), np.float32, seed=5)
    r = _randn((N, H), np.float32, seed=6)
    g, b = _vec(H, 7), _vec(H, 8)
    _, out = _run(nsn.residual_layernorm_dropout, x, r, g, b, np.array([[7]], np.int32), 0.0)
    close(out, _ln(_f64(x + r), _f64(g), _f64(b)))


# --------------------------------------------------------------------------------------------------
# nsim fix: bn_stats / bn_aggr results assigned into a view are written in place (Beta 1)
# --------------------------------------------------------------------------------------------------

def test_bn_stats_assigned_into_view_has_no_copy(ns):
    """The LayerNorm tutorial's ``stats[i_p, j * 6 + i_6] = nisa.bn_stats(...)`` and ``mv[...] =
    nisa.bn_aggr(stats)``: the instructions write the views (no VectorE copy after each, fix in
    ``_RETARGET_OPS``), with the same numbers."""
    _, nki, nl, nisa = ns

    @nki.jit
    def row_mean_var(x):
        P, F = x.shape
        out = nl.ndarray((P, 2), dtype=nl.float32, buffer=nl.shared_hbm)
        i_p = nl.arange(P)[:, None]
        i_6 = nl.arange(6)[None, :]
        i_f = nl.arange(512)[None, :]
        xt = nl.load(x)
        stats = nl.ndarray((P, 6 * (F // 512)), dtype=nl.float32)
        for j in nl.affine_range(F // 512):
            stats[i_p, j * 6 + i_6] = nisa.bn_stats(xt[i_p, j * 512 + i_f])
        mv = nl.ndarray((P, 2), dtype=nl.float32)
        mv[...] = nisa.bn_aggr(stats)
        nl.store(out, value=mv)
        return out

    x = _randn((128, 1536), np.float32, seed=9) + 3.0
    mv = _run(row_mean_var, x)
    close(mv[:, 0], _f64(x).mean(1))
    close(mv[:, 1], _f64(x).var(1))
    c = _ops(row_mean_var)
    assert c["bn_stats"] == 3 and c["bn_aggr"] == 1 and c["tensor_copy"] == 0, c
