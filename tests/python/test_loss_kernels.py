"""Losses and similarity heads written like public NKI kernels (tests/python/kernels/loss_kernels.py, Beta-1 dialect,
and loss_kernels_new.py, new dialect; both unmodified, through ``nsim.compat``):

- knowledge distillation T^2 KL(softmax(t / T) || softmax(s / T)) per row and its batch mean, one streaming pass over
  vocabulary tiles with four running values (online log-sum-exp of student and teacher, the teacher-weighted
  difference), and the same loss with whole rows resident, written with ``nl`` operators (Beta 1);
- label-smoothed cross-entropy with ``ignore_index = -100`` (int32 targets, one-hot by ``nisa.iota`` column ids),
  forward and the gradient of the mean w.r.t. the logits, the mean over the rows that count (Beta 1);
- the CLIP / InfoNCE loss: L2-normalised embeddings, logits = scale I T^T on the PE after ``nc_transpose``, symmetric
  cross-entropy over rows and columns, the column direction by a second set of matmuls or by transposing the fp32
  logits back (``nl.transpose``) (new dialect);
- sigmoid focal loss (torchvision's), cosine-embedding and triplet-margin losses (new dialect);
- Megatron-style vocabulary-parallel cross-entropy over LNC=2: each core half the vocabulary, partial max / sum of exp
  / target logit combined through a shared HBM scratch after ``nisa.core_barrier``, or exchanged SBUF to SBUF by one
  ``nisa.sendrecv`` (new dialect).

Checked against float64 numpy written from the PyTorch / torchvision definitions (fp32 1e-5; bf16 inputs against the
reference of the rounded inputs), plus properties that do not need a reference: KL of a distribution with itself is
exactly 0, gradients of each valid row sum to 0 and ignored rows get exactly 0, the gradient is that of the mean
(central differences of the reference loss), the two CLIP column strategies agree bit for bit, LNC=1 and LNC=2 agree.
Structure: each kernel's HBM traffic (the streaming KD reads each logit once; the CE kernels twice: statistics, then
gradient), the instruction counts that follow from the tiling (two ``activation_reduce`` per KD tile, the CLIP
transposes and matmuls, one ``core_barrier`` per core), and that LNC=2 is faster than one core.

The nsim fix this family needed: ``nl.where(valid, g, 0.0)`` with a (P, 1) row condition against a [P, V] tile
(``label_smoothed_ce_nl_kernel``) was NSIM-E425 "nl.broadcast_to: cannot broadcast (128, V) to (128, 1)": nsim's
``where`` (python/nsim/nki/language.py, which the Beta-1 one calls) took the condition's shape as the result's instead
of the broadcast shape of condition, x and y (numpy.where, spec 3.10); now the result has the shape of the three
broadcast together and the condition is broadcast to it (``test_label_smoothed_ce_nl_operators``; the sparse-graph
family's ``where(member[P, n], xb[P, n, D], v)`` too).
"""
import collections
import math
import warnings

import numpy as np
import pytest

from conftest import executed_ops, require_core, sample_fixture  # noqa: E402
from conftest import op_counts as _ops  # noqa: E402

_core, ml_dtypes = require_core()
from numeric_helpers import close_to_max, f64 as _f64, randn as _randn, rounded  # noqa: E402

BF16 = ml_dtypes.bfloat16
V_TILE = 512

lk = sample_fixture("loss_kernels.py", module_only=True)
lkn = sample_fixture("loss_kernels_new.py", module_only=True)
ts = sample_fixture("training_style_kernels.py", module_only=True)


def _run(k, *args):
    """Run kernel ``k`` with every warning (sanitizer reports included) an error."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return k(*args)


def _tiles(n, t):
    return (n + t - 1) // t


def _lse(z):
    m = z.max(1, keepdims=True)
    return m[:, 0] + np.log(np.exp(z - m).sum(1))


def _log_softmax(z):
    return z - _lse(z)[:, None]


# --------------------------------------------------------------------------------------------------
# Knowledge distillation (Beta 1)
# --------------------------------------------------------------------------------------------------

def ref_kd(student, teacher, T):
    """T^2 * KL(p_t || p_s) per row: F.kl_div(log_softmax(s / T), log_softmax(t / T), log_target=True) summed over
    the vocabulary, times T^2 (the batch mean is its mean)."""
    ls = _log_softmax(_f64(student) / T)
    lt = _log_softmax(_f64(teacher) / T)
    return T * T * (np.exp(lt) * (lt - ls)).sum(1)


def _kd_inputs(N, V, dtype, seed):
    s = _randn((N, V), dtype, seed, scale=2.0)
    # a teacher correlated with the student (as after some training), with its own peaks
    t = (_f64(s) * 0.7 + _randn((N, V), np.float32, seed + 1, scale=1.5)).astype(dtype)
    return s, t


@pytest.mark.parametrize("name", ["kd_loss_kernel", "kd_loss_resident_kernel"])
@pytest.mark.parametrize("N,V,dtype,T", [
    (300, 2000, np.float32, 2.0),   # 3 row tiles (the last of 44 rows), 4 vocabulary tiles (the last of 464)
    (256, 1536, BF16, 4.0),
    (100, 700, np.float32, 1.0),    # one partial row tile, two vocabulary tiles
])
def test_kd_loss_matches_numpy(lk, name, N, V, dtype, T):
    """Per-row T^2 KL and the batch mean; KL's absolute error (after dividing by T^2) below 2e-5 (its terms are
    log-sum-exps of size ~log V that cancel), the mean to fp32 relative precision of the rows."""
    s, t = _kd_inputs(N, V, dtype, seed=N + V)
    loss, mean = _run(getattr(lk, name), s, t, T)
    assert loss.shape == (N,) and loss.dtype == np.float32 and mean.shape == (1, 1)
    want = ref_kd(s, t, T)
    np.testing.assert_allclose(loss, want, rtol=0, atol=2e-5 * T * T)
    np.testing.assert_allclose(mean[0, 0], want.mean(), rtol=1e-5, atol=2e-5 * T * T)
    assert (loss > -2e-5 * T * T).all()   # Gibbs: KL >= 0


@pytest.mark.parametrize("name", ["kd_loss_kernel", "kd_loss_resident_kernel"])
def test_kd_loss_of_a_distribution_with_itself_is_zero(lk, name):
    """student == teacher: every row's KL is exactly 0 (the two log-sum-exps are the same instructions on the same
    values, the weighted difference sums zeros), whatever the temperature."""
    s, _t = _kd_inputs(200, 1500, np.float32, seed=3)
    for T in (1.0, 3.0):
        loss, mean = _run(getattr(lk, name), s, s, T)
        np.testing.assert_array_equal(loss, 0.0)
        assert mean[0, 0] == 0.0


def test_kd_loss_online_rescale_with_late_maxima(lk):
    """The maxima of both student and teacher rows sit in the last vocabulary tile (+30 spikes): the running sums of
    the earlier tiles, and the teacher-weighted sum, must all be rescaled by exp(m_old - m_new); without it the loss
    would be off by orders of magnitude (exp(30 / T))."""
    s, t = _kd_inputs(256, 2000, np.float32, seed=9)
    s[:, 1990] += 30.0
    t[:, 1995] += 30.0
    t[::2, 5] += 25.0        # half of the rows: a teacher peak in the first tile too
    loss, _mean = _run(lk.kd_loss_kernel, s, t, 2.0)
    np.testing.assert_allclose(loss, ref_kd(s, t, 2.0), rtol=1e-5, atol=1e-4)


def test_kd_loss_streams_each_logit_once(lk):
    """[300, 2000]: the streaming kernel reads each student and teacher logit exactly once and writes the 300 row
    losses and the mean; per (row tile, vocabulary tile) one ScalarE activation_reduce per input (3 x 4 x 2), one
    ones-vector matmul for the mean."""
    s, t = _kd_inputs(300, 2000, np.float32, seed=4)
    lk.kd_loss_kernel(s, t, 2.0)
    k = lk.kd_loss_kernel
    prof = k.last_profile
    assert prof.stat("memory.hbm_read_bytes") == s.nbytes + t.nbytes
    assert prof.stat("memory.hbm_write_bytes") == 300 * 4 + 4
    c = _ops(k)
    assert c["activation_reduce"] == 2 * 3 * 4 and c["nc_matmul"] == 1, c
    assert c["dma_copy"] == 2 * 3 * 4 + 3 + 1, c


# --------------------------------------------------------------------------------------------------
# Label-smoothed cross-entropy with ignore_index (Beta 1)
# --------------------------------------------------------------------------------------------------

def ref_ls_loss(x, targets, eps, ignore_index=-100):
    """F.cross_entropy(x, targets, label_smoothing=eps, ignore_index=ignore_index, reduction="none") and "mean"
    (0 when no row counts: the kernel divides by max(count, 1))."""
    x = _f64(x)
    N, V = x.shape
    valid = targets != ignore_index
    lse = _lse(x)
    pick = np.where(valid, x[np.arange(N), np.where(valid, targets, 0)], 0.0)
    rows = np.where(valid, lse - (1 - eps) * pick - eps / V * x.sum(1), 0.0)
    return rows, rows.sum() / max(valid.sum(), 1)


def ref_ls_grad(x, targets, eps, ignore_index=-100):
    """d mean / d x = (softmax - (1 - eps) onehot - eps / V) * valid / count."""
    x = _f64(x)
    N, V = x.shape
    valid = targets != ignore_index
    p = np.exp(x - _lse(x)[:, None])
    oh = np.zeros_like(p)
    oh[np.arange(N)[valid], targets[valid]] = 1.0
    return (p - (1 - eps) * oh - eps / V) * valid[:, None] / max(valid.sum(), 1)


def _ce_inputs(N, V, dtype, seed, ignore_every=None):
    x = _randn((N, V), dtype, seed, scale=2.0)
    tg = np.random.default_rng(seed + 1).integers(0, V, N).astype(np.int32)
    tg[:4] = [0, V - 1, V_TILE - 1, V_TILE]   # the first and last columns and a tile boundary
    if ignore_every:
        tg[1::ignore_every] = -100
    return x, tg


@pytest.mark.parametrize("N,V,dtype,eps,ignore_every", [
    (300, 2000, np.float32, 0.1, 7),
    (256, 1536, BF16, 0.2, 5),
    (100, 700, np.float32, 0.0, None),
    (384, 1024, np.float32, 0.1, 2),     # half of the rows ignored
])
def test_label_smoothed_ce_matches_numpy(lk, N, V, dtype, eps, ignore_every):
    x, tg = _ce_inputs(N, V, dtype, seed=N + V, ignore_every=ignore_every)
    loss, mean, dx = _run(lk.label_smoothed_ce_kernel, x, tg, eps)
    assert loss.shape == (N,) and loss.dtype == np.float32 and mean.shape == (1, 1)
    assert dx.shape == (N, V) and dx.dtype == np.dtype(dtype)
    rows, want_mean = ref_ls_loss(x, tg, eps)
    np.testing.assert_allclose(loss, rows, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(mean[0, 0], want_mean, rtol=1e-5)
    g = ref_ls_grad(x, tg, eps)
    close_to_max(dx, g, dtype)
    ignored = tg == -100
    assert (loss[ignored] == 0).all() and (_f64(dx)[ignored] == 0).all()
    # each counted row's gradient sums to 0 (softmax and the smoothed target both sum to 1)
    sums = _f64(dx)[~ignored].sum(1)
    assert np.abs(sums).max() < (1e-5 if dtype == np.float32 else 1e-2) * np.abs(g).max() * math.sqrt(V)


def test_label_smoothed_ce_gradient_is_that_of_the_mean(lk):
    """The kernel's dlogits against central differences of the reference mean loss at a few logits of counted and
    ignored rows (the target's column, another column of the same row, a column of an ignored row)."""
    x, tg = _ce_inputs(200, 1100, np.float32, seed=12, ignore_every=3)
    _loss, _mean, dx = _run(lk.label_smoothed_ce_kernel, x, tg, 0.1)
    h = 1e-4
    for n, v in [(0, int(tg[0])), (0, 7), (2, int(tg[2])), (150, 1099), (1, 3), (4, 600)]:
        xp, xm = _f64(x).copy(), _f64(x).copy()
        xp[n, v] += h
        xm[n, v] -= h
        fd = (ref_ls_loss(xp, tg, 0.1)[1] - ref_ls_loss(xm, tg, 0.1)[1]) / (2 * h)
        assert abs(dx[n, v] - fd) < 1e-6, (n, v, dx[n, v], fd)
    assert tg[1] == -100 and tg[4] == -100 and (dx[1] == 0).all() and (dx[4] == 0).all()


def test_label_smoothed_ce_without_smoothing_is_the_plain_kernel(lk, ts):
    """smoothing = 0 and no ignored rows: the row losses are those of the training-style cross-entropy kernel
    (nki_cross_entropy_kernel, the same online log-sum-exp) and the gradient is its gradient divided by N."""
    x, tg = _ce_inputs(300, 2000, np.float32, seed=5)
    loss, mean, dx = _run(lk.label_smoothed_ce_kernel, x, tg, 0.0)
    loss2, dx2 = _run(ts.nki_cross_entropy_kernel, x, tg)
    np.testing.assert_allclose(loss, loss2, rtol=1e-6, atol=0)
    np.testing.assert_allclose(_f64(dx) * 300, dx2, rtol=0, atol=1e-6)
    np.testing.assert_allclose(mean[0, 0], _f64(loss2).mean(), rtol=1e-6)


def test_label_smoothed_ce_every_row_ignored(lk):
    """No row counts: loss 0 everywhere, mean 0 (not 0 / 0: the count is clamped to 1), gradient 0."""
    x, _tg = _ce_inputs(200, 1000, np.float32, seed=6)
    loss, mean, dx = _run(lk.label_smoothed_ce_kernel, x, np.full(200, -100, np.int32), 0.1)
    assert (loss == 0).all() and mean[0, 0] == 0 and (dx == 0).all()


@pytest.mark.parametrize("N,V,dtype", [(300, 2000, np.float32), (256, 1024, BF16)])
def test_label_smoothed_ce_nl_operators(lk, N, V, dtype):
    """The first-port form (whole rows, ``nl`` operators, ``nl.equal`` one-hot, ``nl.where(valid, g, 0.0)`` with a
    (P, 1) condition): reduction "sum", so its gradient is the mean kernel's times the count."""
    x, tg = _ce_inputs(N, V, dtype, seed=N, ignore_every=3)
    loss, dx = _run(lk.label_smoothed_ce_nl_kernel, x, tg, 0.1)
    rows, _mean = ref_ls_loss(x, tg, 0.1)
    np.testing.assert_allclose(loss, rows, rtol=1e-5, atol=1e-5)
    assert dx.dtype == np.dtype(dtype)
    close_to_max(dx, ref_ls_grad(x, tg, 0.1) * (tg != -100).sum(), dtype)
    assert (_f64(dx)[tg == -100] == 0).all()


def test_label_smoothed_ce_traffic_and_structure(lk):
    """[300, 2000] fp32: the targets are read twice (the count pass and the row tiles), the logits twice (statistics,
    gradient); the row losses, the mean and dlogits written once. Per (row tile, vocabulary tile) one
    activation_reduce (pass 1) and one exp activation (pass 2); one matmul for the count, one for the mean."""
    x, tg = _ce_inputs(300, 2000, np.float32, seed=7, ignore_every=4)
    lk.label_smoothed_ce_kernel(x, tg, 0.1)
    k = lk.label_smoothed_ce_kernel
    prof = k.last_profile
    assert prof.stat("memory.hbm_read_bytes") == 2 * x.nbytes + 2 * tg.nbytes
    assert prof.stat("memory.hbm_write_bytes") == x.nbytes + 300 * 4 + 4
    c = _ops(k)
    assert c["activation_reduce"] == 3 * 4 and c["nc_matmul"] == 2 and c["iota"] == 1, c


# --------------------------------------------------------------------------------------------------
# CLIP / InfoNCE (new dialect)
# --------------------------------------------------------------------------------------------------

def _clip_normed(img, txt, scale):
    """The normalised rows as the kernel holds them: x / max(||x||, 1e-12) (images times the scale), rounded to the
    embeddings' dtype (bf16 rows go to the PE in bf16)."""
    dt = img.dtype
    out = []
    for x, s in ((img, scale), (txt, 1.0)):
        x = _f64(x)
        n = np.maximum(np.sqrt((x * x).sum(1, keepdims=True)), 1e-12)
        out.append(rounded(x * (s / n), dt))
    return out


def ref_clip_loss(logits, diag):
    """0.5 (CE over rows + CE over columns) with the diagonal as targets."""
    return 0.5 * ((_lse(logits) - diag).mean() + (_lse(logits.T) - diag).mean())


def _clip_inputs(N, D, dtype, seed):
    img = _randn((N, D), np.float32, seed)
    txt = img * 0.5 + _randn((N, D), np.float32, seed + 1)  # matching pairs somewhat aligned
    return img.astype(dtype), txt.astype(dtype)


@pytest.mark.parametrize("columns", ["matmul", "transpose"])
@pytest.mark.parametrize("N,D,dtype,log_scale", [
    (256, 512, np.float32, math.log(1 / 0.07)),   # CLIP's initial temperature
    (384, 256, BF16, math.log(1 / 0.07)),
    (512, 384, np.float32, math.log(200.0)),     # exp(logit_scale) = 200 is clamped to 100
    (128, 128, np.float32, 0.0),
])
def test_clip_loss_matches_numpy(lkn, columns, N, D, dtype, log_scale):
    img, txt = _clip_inputs(N, D, dtype, seed=N + D)
    ls = np.array([log_scale], np.float32)
    loss, logits = _run(lkn.clip_contrastive_loss, img, txt, ls, columns)
    assert loss.shape == (1, 1) and logits.shape == (N, N) and logits.dtype == np.float32
    scale = min(math.exp(float(ls[0])), 100.0)
    i_n, t_n = _clip_normed(img, txt, scale)
    want = i_n @ t_n.T
    # bf16: the kernel's fp32 x * (scale / ||x||) lands on a bf16 rounding tie where the float64 one does not for a
    # few elements (x = +-1: 4 of 98304 here), one bf16 ulp apart; the logits' error stays below 1e-3 of their max
    tol = 1e-5 if dtype == np.float32 else 1e-3
    err = np.abs(_f64(logits) - want).max() / np.abs(want).max()
    assert err < tol, err
    assert abs(float(np.abs(_f64(logits)).max()) - scale) < 0.6 * scale   # the scale reached the logits
    # the loss of the reference logits; and the loss of the kernel's own logits (isolating the cross-entropy)
    # (absolute error: the loss is a difference of log-sum-exps of logits up to the scale, ~1e-7 of it in fp32)
    np.testing.assert_allclose(loss[0, 0], ref_clip_loss(want, np.diag(want)), rtol=tol, atol=2e-7 * scale)
    np.testing.assert_allclose(loss[0, 0], ref_clip_loss(_f64(logits), np.diag(_f64(logits))), rtol=1e-5,
                               atol=2e-7 * scale)


def test_clip_loss_column_strategies_agree_bit_for_bit(lkn):
    """The text rows by T I^T matmuls (the same products in the same order) and by fp32 PE transposes of the image
    rows' logits (exact moves) give the same loss, bit for bit; swapping the modalities gives the same loss to fp32
    precision (the scale then multiplies the other side)."""
    img, txt = _clip_inputs(384, 256, np.float32, seed=2)
    ls = np.array([math.log(1 / 0.07)], np.float32)
    l1, g1 = _run(lkn.clip_contrastive_loss, img, txt, ls, "matmul")
    l2, g2 = _run(lkn.clip_contrastive_loss, img, txt, ls, "transpose")
    np.testing.assert_array_equal(l1, l2)
    np.testing.assert_array_equal(g1, g2)
    l3, g3 = _run(lkn.clip_contrastive_loss, txt, img, ls, "matmul")
    np.testing.assert_allclose(l3, l1, rtol=1e-5)
    close_to_max(g3.T, _f64(g1), np.float32)


def test_clip_loss_perfectly_aligned_pairs(lkn):
    """text == image with orthonormal rows and scale 100: each row's own logit is 100, every other one ~0, so the
    loss is 0 up to fp32 rounding of logits of size 100."""
    q, _ = np.linalg.qr(np.random.default_rng(0).standard_normal((512, 256)))
    img = q.T.astype(np.float32)       # 256 orthonormal rows of 512
    loss, logits = _run(lkn.clip_contrastive_loss, img, img, np.array([math.log(100.0)], np.float32))
    np.testing.assert_allclose(np.diag(logits), 100.0, rtol=1e-5)
    assert np.abs(logits - np.diag(np.diag(logits))).max() < 1e-3
    assert abs(loss[0, 0]) < 2e-5   # 255 exp(-100) below fp32's resolution of 100: 0 up to rounding


@pytest.mark.parametrize("columns", ["matmul", "transpose"])
def test_clip_loss_structure(lkn, columns):
    """[256, 512] fp32: each embedding read once (plus the 4-byte logit_scale once per partition: a stride-0
    broadcast DMA), the [256, 256] logits and the loss written once. Transposes: 2 embeddings x 2 row tiles x 4 D
    chunks = 16 (+ 2 x 2 logits blocks transposed back);
    matmuls: 2 row tiles x 4 D chunks per direction (one direction when transposing) + the final partition sum."""
    img, txt = _clip_inputs(256, 512, np.float32, seed=8)
    lkn.clip_contrastive_loss(img, txt, np.array([2.0], np.float32), columns)
    k = lkn.clip_contrastive_loss
    prof = k.last_profile
    assert prof.stat("memory.hbm_read_bytes") == img.nbytes + txt.nbytes + 128 * 4
    assert prof.stat("memory.hbm_write_bytes") == 256 * 256 * 4 + 4
    c = _ops(k)
    if columns == "matmul":
        assert c["nc_transpose"] == 16 and c["nc_matmul"] == 2 * 2 * 4 + 1, c
    else:
        assert c["nc_transpose"] == 16 + 4 and c["nc_matmul"] == 2 * 4 + 1, c


# --------------------------------------------------------------------------------------------------
# Focal, cosine-embedding and triplet-margin losses (new dialect)
# --------------------------------------------------------------------------------------------------

def ref_focal(x, t, alpha, gamma):
    """torchvision.ops.sigmoid_focal_loss(reduction="none")."""
    x, t = _f64(x), _f64(t)
    p = 1 / (1 + np.exp(-x))
    ce = np.logaddexp(0, x) - x * t
    p_t = p * t + (1 - p) * (1 - t)
    loss = ce * (1 - p_t) ** gamma
    if alpha >= 0:
        loss = loss * (alpha * t + (1 - alpha) * (1 - t))
    return loss


@pytest.mark.parametrize("N,C,dtype,alpha,gamma", [
    (300, 80, np.float32, 0.25, 2.0),    # COCO's 80 classes, RetinaNet's defaults; a ragged row tile
    (256, 1000, BF16, -1.0, 1.5),        # no alpha weighting, a non-integer gamma by the power ALU op
    (128, 91, np.float32, 0.5, 0.0),     # gamma 0: alpha-weighted BCE
])
def test_sigmoid_focal_loss_matches_numpy(lkn, N, C, dtype, alpha, gamma):
    x = _randn((N, C), dtype, seed=N + C, scale=3.0)
    x[0, :4] = [40.0, -40.0, 40.0, -40.0]          # saturated sigmoids: 1 - p_t exactly 0 or 1
    t = (np.random.default_rng(C).random((N, C)) < 0.05).astype(dtype)
    t[0, :4] = [1, 0, 0, 1]
    loss, mean = _run(lkn.sigmoid_focal_loss, x, t, alpha, gamma)
    assert loss.shape == (N, C) and loss.dtype == np.float32
    want = ref_focal(x, t, alpha, gamma)
    np.testing.assert_allclose(loss, want, rtol=2e-5, atol=1e-6)
    np.testing.assert_allclose(mean[0, 0], want.mean(), rtol=1e-5)
    if gamma > 0:   # confident and right: no loss (sigmoid(40) is 1 in fp32); confident and wrong: ~40 alpha_t
        assert loss[0, 0] == 0 and loss[0, 1] < 1e-30
    np.testing.assert_allclose(loss[0, 2:4], want[0, 2:4], rtol=1e-5)
    assert (loss[0, 2:4] > 9).all()
    assert np.isfinite(loss).all()


def test_sigmoid_focal_loss_traffic(lkn):
    """Logits and targets read once, the element losses and the mean written once."""
    x = _randn((300, 80), np.float32, 1, scale=3.0)
    t = (np.random.default_rng(2).random((300, 80)) < 0.1).astype(np.float32)
    lkn.sigmoid_focal_loss(x, t)
    prof = lkn.sigmoid_focal_loss.last_profile
    assert prof.stat("memory.hbm_read_bytes") == x.nbytes + t.nbytes
    assert prof.stat("memory.hbm_write_bytes") == x.nbytes + 4


def ref_cosine_embedding(x1, x2, y, margin):
    """nn.CosineEmbeddingLoss(reduction="none") (aten's EPSILON = 1e-12 added to both squared norms)."""
    a, b = _f64(x1), _f64(x2)
    cos = (a * b).sum(1) / np.sqrt(((a * a).sum(1) + 1e-12) * ((b * b).sum(1) + 1e-12))
    return np.where(y == 1, 1 - cos, 0.0) + np.where(y == -1, np.maximum(cos - margin, 0.0), 0.0)


@pytest.mark.parametrize("N,D,dtype,margin", [
    (300, 768, np.float32, 0.0),
    (256, 512, BF16, 0.5),
    (64, 128, np.float32, -0.2),
])
def test_cosine_embedding_loss_matches_numpy(lkn, N, D, dtype, margin):
    x1 = _randn((N, D), dtype, seed=N)
    x2 = _randn((N, D), dtype, seed=D)
    x2[0] = x1[0]            # identical pair: cos 1
    x2[1] = -_f64(x1[1])     # opposite pair: cos -1
    x2[2] = 0                # a zero vector: the epsilon keeps cos at 0
    y = np.where(np.random.default_rng(3).random(N) < 0.5, 1.0, -1.0).astype(np.float32)
    y[:3] = [1.0, -1.0, 1.0]
    loss, mean = _run(lkn.cosine_embedding_loss, x1, x2, y, margin)
    want = ref_cosine_embedding(x1, x2, y, margin)
    np.testing.assert_allclose(loss, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(mean[0, 0], want.mean(), rtol=1e-5)
    assert abs(loss[0]) < 1e-6 and loss[2] == 1.0


def ref_triplet(a, p, n, margin, eps=1e-6):
    """nn.TripletMarginLoss(p=2, eps=1e-6, reduction="none"): pairwise_distance adds eps to the difference."""
    a, p, n = _f64(a), _f64(p), _f64(n)
    dap = np.sqrt(((a - p + eps) ** 2).sum(1))
    dan = np.sqrt(((a - n + eps) ** 2).sum(1))
    return np.maximum(dap - dan + margin, 0.0), dap


@pytest.mark.parametrize("N,D,dtype,margin", [(300, 768, np.float32, 1.0), (200, 256, BF16, 0.2)])
def test_triplet_margin_loss_matches_numpy(lkn, N, D, dtype, margin):
    """Distances are sqrt of D-term sums (~sqrt(2D)): the loss, a difference of two, is exact to fp32 relative to
    the distances. Half of the positives are near the anchor (some triplets already satisfied: loss 0)."""
    rng = np.random.default_rng(D)
    a = _randn((N, D), dtype, seed=1)
    # positives and negatives at random distances from the anchor: some triplets satisfied (loss 0), some not
    p = (_f64(a) + _randn((N, D), np.float32, 2) * rng.uniform(0.2, 1.0, (N, 1))).astype(dtype)
    n = (_f64(a) + _randn((N, D), np.float32, 3) * rng.uniform(0.2, 1.0, (N, 1))).astype(dtype)
    p[0] = a[0]              # d(a, p) = sqrt(D) * eps
    loss, mean = _run(lkn.triplet_margin_loss, a, p, n, margin)
    want, dap = ref_triplet(a, p, n, margin)
    np.testing.assert_allclose(loss, want, rtol=0, atol=2e-6 * math.sqrt(2 * D))
    np.testing.assert_allclose(mean[0, 0], want.mean(), rtol=1e-5)
    assert (want == 0).any() and (want > 0).any()
    assert abs(dap[0] - math.sqrt(D) * 1e-6) < 1e-9


# --------------------------------------------------------------------------------------------------
# Vocabulary-parallel cross-entropy over LNC=2 (new dialect)
# --------------------------------------------------------------------------------------------------

def _lnc_ops(kernel):
    """Instruction counts of the last run, summed over the core programs of a multi-core launch."""
    j = kernel.last_json
    bodies = [p["body"] for p in j["core_programs"]] if "core_programs" in j else [j["body"]]
    return collections.Counter(o["op"] for b in bodies for o in executed_ops(b))


def ref_ce(x, tg):
    x = _f64(x)
    N = x.shape[0]
    lse = _lse(x)
    g = np.exp(x - lse[:, None])
    g[np.arange(N), tg] -= 1.0
    return lse - x[np.arange(N), tg], g


@pytest.mark.parametrize("launch,combine", [("1", "barrier"), ("2", "barrier"), ("nc2", "barrier"), ("2", "sendrecv")])
@pytest.mark.parametrize("N,V,dtype", [
    (256, 4096, np.float32),     # each core 2048 columns: 4 vocabulary tiles
    (200, 3000, np.float32),     # ragged rows; each core 1500 columns: the last tile of 476
    (300, 1024, BF16),
])
def test_vocab_parallel_ce_matches_numpy(lkn, launch, combine, N, V, dtype):
    x = _randn((N, V), dtype, seed=V, scale=3.0)
    tg = np.random.default_rng(N).integers(0, V, N).astype(np.int32)
    tg[:4] = [0, V - 1, V // 2 - 1, V // 2]   # both ends of both halves
    k = lkn.vocab_parallel_cross_entropy
    kl = {"1": k, "2": k[2], "nc2": k[lkn.nl.nc(2)]}[launch]
    loss, dx = _run(kl, x, tg, combine)
    assert loss.shape == (N,) and dx.shape == (N, V) and dx.dtype == np.dtype(dtype)
    want, g = ref_ce(x, tg)
    np.testing.assert_allclose(loss, want, rtol=1e-5, atol=1e-5)
    close_to_max(dx, g, dtype)
    c = _lnc_ops(k)
    two = launch != "1"
    assert c["core_barrier"] == (2 if two and combine == "barrier" else 0), c
    assert c["sendrecv"] == (2 if two and combine == "sendrecv" else 0), c


def test_vocab_parallel_ce_lnc2_agrees_and_is_faster(lkn):
    """[256, 4096] fp32: the two-core launch gives the one-core losses to fp32 precision (the log-sum-exp combined
    from two halves) and finishes in well under the one-core time; one rendezvous; HBM: the logits read twice in
    both, each core also reads all targets and the other core's [N, 3] partials and writes its own."""
    N, V = 256, 4096
    x = _randn((N, V), np.float32, seed=1, scale=3.0)
    tg = np.random.default_rng(2).integers(0, V, N).astype(np.int32)
    k = lkn.vocab_parallel_cross_entropy
    l1, d1 = _run(k, x, tg, "barrier")
    p1 = k.last_profile
    l2, d2 = _run(k[2], x, tg, "barrier")
    p2 = k.last_profile
    np.testing.assert_allclose(l2, l1, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(d2, d1, rtol=0, atol=1e-6)
    assert p1.stat("memory.hbm_read_bytes") == 2 * x.nbytes + tg.nbytes
    assert p1.stat("memory.hbm_write_bytes") == x.nbytes + N * 4
    scratch = N * 3 * 4
    assert p2.stat("memory.hbm_read_bytes") == 2 * x.nbytes + 2 * tg.nbytes + 2 * scratch
    assert p2.stat("memory.hbm_write_bytes") == x.nbytes + N * 4 + 2 * scratch
    assert p2.stat("lnc.rendezvous") == 1
    assert p2.total_time_ns < 0.75 * p1.total_time_ns, (p1.total_time_ns, p2.total_time_ns)
    assert p2.stat("lnc.imbalance_percent") < 10


def test_vocab_parallel_ce_sendrecv_combine(lkn):
    """Exchanging the SBUF partials by one ``sendrecv`` instead of the HBM scratch + ``core_barrier``: the same bits
    (the same combine arithmetic on the same partials), no scratch traffic (each core's [N, 3] write and the peer's
    read gone), one rendezvous, and faster (no HBM round trip between the passes)."""
    N, V = 256, 4096
    x = _randn((N, V), np.float32, seed=3, scale=3.0)
    tg = np.random.default_rng(4).integers(0, V, N).astype(np.int32)
    k = lkn.vocab_parallel_cross_entropy
    l1, d1 = _run(k[2], x, tg, "barrier")
    p1 = k.last_profile
    l2, d2 = _run(k[2], x, tg, "sendrecv")
    p2 = k.last_profile
    np.testing.assert_array_equal(l2, l1)
    np.testing.assert_array_equal(d2, d1)
    scratch = N * 3 * 4
    assert p1.stat("memory.hbm_read_bytes") - p2.stat("memory.hbm_read_bytes") == 2 * scratch
    assert p1.stat("memory.hbm_write_bytes") - p2.stat("memory.hbm_write_bytes") == 2 * scratch
    assert p2.stat("lnc.rendezvous") == 1
    assert p2.total_time_ns < p1.total_time_ns, (p1.total_time_ns, p2.total_time_ns)
