"""Retrieval, clustering and contrastive kernels written like public NKI ports of FAISS-style search, k-means and
CLIP / SigLIP training (tests/python/kernels/retrieval_similarity_kernels.py, Beta-1 dialect, and
retrieval_similarity_kernels_new.py, new dialect; both unmodified, through ``nsim.compat``):

- exact cosine k-nearest-neighbour search: queries and database rows L2-normalised on chip (sum of squares,
  rsqrt), scores by matmul over database tiles, a running top-k per query (``max8`` + ``nc_find_index8`` +
  ``nc_match_replace8`` on each tile, then on the [2k] candidates of running best | tile best, the winners' ids by
  ``nl.gather_flattened`` (Beta 1) or ``nisa.nc_n_gather`` (new)); the Beta-1 kernel normalises the database
  columns through a ones-matmul of the squares of a transposed load, the new one rows then PE transposes;
- 1-nearest neighbour by squared L2 distance ||q||^2 - 2 q.x + ||x||^2 accumulated in PSUM (the ||x||^2 row
  broadcast by a ones matmul), argmin as max8 of -d, kept across tiles by compare / select (Beta 1);
- one k-means (Lloyd) step: argmin assignment, a one-hot by ``iota`` compare, onehot^T [points | 1] accumulated in
  PSUM over the point tiles (sums and counts at once), division with empty clusters keeping their centroid
  (Beta 1);
- product-quantisation ADC (FAISS IndexPQ): per-query lookup tables [256, Q] per sub-space built by matmuls, the
  codes summed over the sub-spaces by one-hot matmuls (codes broadcast to the partitions by a K = 1 matmul) or by
  indirect DMA gathers of LUT rows staged in HBM (new dialect);
- CLIP's symmetric cross-entropy with the learned temperature, the column direction as a ones-vector matmul of
  the same exp tiles (a fixed shift by the scale replaces the max, as |logit| <= scale on unit vectors; Beta 1 --
  the two-matmul / transpose versions are test_loss_kernels' ``clip_contrastive_loss``), and SigLIP's sigmoid
  loss -log sigmoid(z_ij (t s_ij + b)) with the labels from ``affine_select`` (new dialect).

Checked against float64 numpy written in this file (fp32 1e-5; bf16 inputs against the reference of the rounded
inputs, 1e-2): top-k ids exactly (distinct random scores: no ties), descending values, argmin / assignments exactly,
centroids and counts (an empty cluster keeps its centroid), several Lloyd steps in a row, the PQ distances of both
gather strategies, the losses; ragged last tiles in every kernel (queries, database, points, pairs); both dialects
of the search agree. Every run has every warning an error (sanitizer reports included). Structure: the instruction
and DMA counts each tiling implies and the HBM bytes (each derived in a comment); and one timing story: database
tiles of 512 columns are faster than tiles of 128 (same work, a quarter of the matmuls and merges).

The nsim fix this family needed (its regression test fails without it):
- a Beta-1 ``nisa.dma_copy`` whose HBM side is a transposed arange window, ``nisa.dma_copy(dst=xT[i_dp, i_n],
  src=database[n0 + i_n, i_dp], mask=(n0 + i_n < N))`` (spec 3.8: the result of advanced indexing is the
  broadcast of the items, the first result dim the partitions, so this is a [D, n] transposed window; spec 2.1:
  Beta-1 ``dma_copy`` takes such views and a mask), was NSIM-E446 "a transposed arange access ... is supported
  only as the HBM operand of nl.load / nl.store" unmasked, and with a mask the misleading NSIM-E408 "slice 0:100
  is out of bounds for dim 1 of size 64 of tensor 'x'" (the mask's rectangle, in the window's coordinates, was
  cut from the storage-order dims). python/nsim/nki/beta1/isa.py ``dma_copy`` now moves such a window by a DMA
  transpose as ``nl.load`` / ``nl.store`` do (only the mask's rectangle; either side; one dtype)
  (``test_dma_copy_of_transposed_window``; ``l2_nearest`` loads its database tiles this way).
"""
import math

import numpy as np
import pytest

from conftest import executed_ops, require_core, run_clean, sample_fixture  # noqa: E402
from conftest import op_counts as _ops  # noqa: E402

_core, ml_dtypes = require_core()
from numeric_helpers import close, close_to_max, f64 as _f64, randn as _randn  # noqa: E402

BF16 = ml_dtypes.bfloat16

rs = sample_fixture("retrieval_similarity_kernels.py")
rsn = sample_fixture("retrieval_similarity_kernels_new.py", module_only=True)


def _tiles(n, t):
    return (n + t - 1) // t


def _unit(a):
    a = _f64(a)
    return a / np.maximum(np.linalg.norm(a, axis=1, keepdims=True), 1e-12)


# --------------------------------------------------------------------------------------------------
# Exact cosine top-k
# --------------------------------------------------------------------------------------------------

def ref_cosine(q, x):
    """Cosine similarity of every query to every database row (float64 of the given, possibly rounded, inputs)."""
    return _unit(q) @ _unit(x).T


def _check_topk(vals, ids, q, x, k, dtype):
    s = ref_cosine(q, x)
    want_i = np.argsort(-s, axis=1, kind="stable")[:, :k]
    want_v = np.take_along_axis(s, want_i, 1)
    assert vals.shape == (q.shape[0], k) and ids.shape == (q.shape[0], k)
    assert vals.dtype == np.float32 and ids.dtype == np.uint32
    assert (np.diff(vals, axis=1) <= 0).all()        # descending
    if dtype == np.float32:
        np.testing.assert_array_equal(ids, want_i)
        close(vals, want_v)
    else:
        # bf16 normalised vectors: neighbours closer than the rounding may swap; the chosen rows must score what
        # the true top k score, and the reported scores too
        assert all(len(set(r)) == k for r in ids.tolist())
        close(np.take_along_axis(s, ids.astype(np.int64), 1), want_v, BF16)
        close(vals, want_v, BF16)


@pytest.mark.parametrize("Q,N,D,k,n_tile,dtype", [
    (128, 512, 64, 8, 512, np.float32),
    (200, 1100, 64, 16, 512, np.float32),    # ragged queries (72) and database (76 of 512)
    (130, 517, 96, 8, 512, BF16),            # a last database tile of 5 columns (fewer than k)
    (77, 300, 32, 8, 128, np.float32),       # one partial query tile, database tiles of 128, last of 44
])
def test_knn_cosine_topk_beta1(rs, Q, N, D, k, n_tile, dtype):
    m = rs[0]
    q = _randn((Q, D), dtype, seed=Q)
    x = _randn((N, D), dtype, seed=N)
    vals, ids = run_clean(m.knn_cosine_topk, q, x, k, n_tile)
    _check_topk(vals, ids, q, x, k, dtype)


@pytest.mark.parametrize("Q,N,D,k,n_tile,dtype", [
    (200, 1100, 64, 16, 512, np.float32),
    (130, 517, 96, 8, 512, BF16),            # last tile of 5: the -3e38 pre-fill keeps max8's 8 elements
    (300, 1000, 128, 24, 256, np.float32),   # three rounds per tile, 4 database tiles (last 232)
])
def test_knn_cosine_topk_new(rsn, Q, N, D, k, n_tile, dtype):
    q = _randn((Q, D), dtype, seed=Q + 1)
    x = _randn((N, D), dtype, seed=N + 1)
    vals, ids = run_clean(rsn.knn_cosine_topk, q, x, k, n_tile)
    _check_topk(vals, ids, q, x, k, dtype)


def test_knn_dialects_agree(rs, rsn):
    """The two ports (column norms by a ones matmul vs row norms + PE transposes) pick the same neighbours in the
    same order; their scores differ only by fp32 rounding."""
    q = _randn((150, 64), np.float32, seed=5)
    x = _randn((700, 64), np.float32, seed=6)
    v1, i1 = run_clean(rs[0].knn_cosine_topk, q, x, 16, 256)
    v2, i2 = run_clean(rsn.knn_cosine_topk, q, x, 16, 256)
    np.testing.assert_array_equal(i1, i2)
    close(v1, v2)


def test_knn_beta1_structure(rs):
    """Q = 256, N = 1024, D = 64, k = 16, n_tile = 512: NQ = 2 query tiles, NT = 2 database tiles."""
    m = rs[0]
    Q, N, D, k, W = 256, 1024, 64, 16, 512
    NQ, NT, R = Q // 128, N // W, k // 8
    q = _randn((Q, D), np.float32, seed=1)
    x = _randn((N, D), np.float32, seed=2)
    run_clean(m.knn_cosine_topk, q, x, k, W)
    c = _ops(m.knn_cosine_topk)
    # one norm matmul per database tile (ones [D, D] x squares) + one score matmul per (query, database) tile
    assert c["nc_matmul"] == NT + NQ * NT, c
    assert c["nc_transpose"] == NQ, c                      # the normalised query tile onto [D, 128]
    assert c["dma_transpose"] == NT, c                     # the database loaded transposed, once
    # per (query, database) tile: R rounds on the scores and R on the merged candidates
    assert c["max8"] == c["nc_find_index8"] == 2 * R * NQ * NT, c
    assert c["nc_match_replace8"] == 2 * (R - 1) * NQ * NT, c   # not after the last round
    assert c["nc_n_gather"] == NQ * NT, c                  # gather_flattened of the merged ids
    assert c["affine_select"] == NQ * NT, c                # padding columns to -3e38
    assert c["dma_copy"] == NQ + 2 * NQ, c                 # query loads; value and id stores
    prof = m.knn_cosine_topk.last_profile
    # every query and database element read once (the database stays resident across query tiles)
    assert prof.stat("memory.hbm_read_bytes") == (Q + N) * D * 4
    assert prof.stat("memory.hbm_write_bytes") == Q * k * (4 + 4)


def test_knn_new_structure(rsn):
    """The same problem in the new dialect: database normalised per 128 rows and PE-transposed."""
    Q, N, D, k, W = 256, 1024, 64, 16, 512
    NQ, NT, R = Q // 128, N // W, k // 8
    q = _randn((Q, D), np.float32, seed=1)
    x = _randn((N, D), np.float32, seed=2)
    run_clean(rsn.knn_cosine_topk, q, x, k, W)
    c = _ops(rsn.knn_cosine_topk)
    assert c["nc_matmul"] == NQ * NT, c
    assert c["nc_transpose"] == N // 128 + NQ, c
    assert c["activation_reduce"] == N // 128 + NQ, c     # sum of squares per normalised tile
    assert c["max8"] == 2 * R * NQ * NT and c["nc_n_gather"] == NQ * NT, c
    assert c["dma_copy"] == N // 128 + NQ + 2 * NQ, c
    assert c["memset"] == 2 * NQ, c                        # running best values / ids; no tile narrower than k
    prof = rsn.knn_cosine_topk.last_profile
    assert prof.stat("memory.hbm_read_bytes") == (Q + N) * D * 4
    assert prof.stat("memory.hbm_write_bytes") == Q * k * (4 + 4)
    # a last database tile of 5 columns (< k = 8) is pre-filled once per query tile
    run_clean(rsn.knn_cosine_topk, q[:130], x[:517], 8, 512)
    assert _ops(rsn.knn_cosine_topk)["memset"] == 2 * 2 + 2


def test_knn_tile_width_timing(rs, rsn):
    """Database tiles of 512 columns beat tiles of 128 in both ports: the same score elements and max8 passes,
    but a quarter of the score matmuls, of the [2k] candidate merges (each R max8 / find_index8 / match_replace8
    plus copies and a gather) and of the per-tile fixed costs."""
    q = _randn((256, 64), np.float32, seed=3)
    x = _randn((1024, 64), np.float32, seed=4)
    for k in (rs[0].knn_cosine_topk, rsn.knn_cosine_topk):
        run_clean(k, q, x, 16, 512)
        wide = k.last_profile.total_time_ns
        run_clean(k, q, x, 16, 128)
        narrow = k.last_profile.total_time_ns
        assert wide < 0.95 * narrow, (wide, narrow)


# --------------------------------------------------------------------------------------------------
# L2 nearest neighbour (Beta 1)
# --------------------------------------------------------------------------------------------------

def ref_l2(q, x):
    q, x = _f64(q), _f64(x)
    return (q * q).sum(1)[:, None] - 2 * q @ x.T + (x * x).sum(1)[None, :]


@pytest.mark.parametrize("Q,N,D,n_tile,dtype", [
    (200, 1100, 64, 512, np.float32),
    (130, 517, 96, 512, BF16),
    (64, 300, 128, 128, np.float32),
])
def test_l2_nearest(rs, Q, N, D, n_tile, dtype):
    m = rs[0]
    q = _randn((Q, D), dtype, seed=Q + 7)
    x = _randn((N, D), dtype, seed=N + 7)
    dist, idx = run_clean(m.l2_nearest, q, x, n_tile)
    d = ref_l2(q, x)
    assert dist.shape == (Q, 1) and idx.shape == (Q, 1) and idx.dtype == np.uint32
    # the distances are exact products of the (rounded) inputs accumulated in fp32: the argmin is exact
    np.testing.assert_array_equal(idx[:, 0], d.argmin(1))
    close(dist[:, 0], d.min(1), dtype)


def test_l2_nearest_structure(rs):
    """Q = 256, N = 1024, D = 64, n_tile = 512: NQ = 2, NT = 2."""
    m = rs[0]
    Q, N, D, W = 256, 1024, 64, 512
    NQ, NT = Q // 128, N // W
    run_clean(m.l2_nearest, _randn((Q, D), np.float32, seed=1), _randn((N, D), np.float32, seed=2), W)
    c = _ops(m.l2_nearest)
    assert c["nc_matmul"] == 2 * NQ * NT, c       # -2 q.x and the ||x||^2 broadcast, into one PSUM tile
    assert c["dma_transpose"] == NQ + NQ * NT, c  # queries [D, 128]; database [D, 512] per (query, db) tile
    assert c["max8"] == c["nc_find_index8"] == NQ * NT, c
    assert c["dma_copy"] == NQ + 2 * NQ, c        # queries row-major (||q||^2); dist and idx stores
    prof = m.l2_nearest.last_profile
    # queries twice (transposed and row-major), the database once per query tile
    assert prof.stat("memory.hbm_read_bytes") == 2 * Q * D * 4 + NQ * N * D * 4
    assert prof.stat("memory.hbm_write_bytes") == Q * (4 + 4)


def test_dma_copy_of_transposed_window(rs):
    """Regression: Beta-1 ``nisa.dma_copy`` with a transposed arange window on the HBM side (spec 3.8), loading
    ``x[i_f, i_dp]`` into a zeroed [D, 128] tile under the ragged mask ``i_f < N`` and storing it back through
    ``out[i_f, i_dp]``, unmasked too. Was E446 (unmasked) / E408 out of bounds (masked)."""
    _, nki, nl, nisa = rs

    @nki.jit
    def roundtrip(x):
        N, D = x.shape
        out = nl.ndarray((N, D), dtype=x.dtype, buffer=nl.shared_hbm)
        i_dp = nl.arange(D)[:, None]
        i_f = nl.arange(128)[None, :]
        xT = nl.zeros((D, 128), dtype=x.dtype)
        if N == 128:
            nisa.dma_copy(dst=xT[i_dp, i_f], src=x[i_f, i_dp])
        else:
            nisa.dma_copy(dst=xT[i_dp, i_f], src=x[i_f, i_dp], mask=(i_f < N))
        y = nl.add(xT, 1.0, dtype=x.dtype)
        if N == 128:
            nisa.dma_copy(dst=out[i_f, i_dp], src=y)
        else:
            nisa.dma_copy(dst=out[i_f, i_dp], src=y, mask=(i_f < N))
        return out

    for n, dt in ((100, np.float32), (128, np.float32), (37, BF16)):
        x = _randn((n, 64), dt, seed=n)
        y = run_clean(roundtrip, x)
        np.testing.assert_array_equal(y, (x.astype(np.float32) + 1).astype(dt))
        assert _ops(roundtrip)["dma_transpose"] == 2


# --------------------------------------------------------------------------------------------------
# k-means step (Beta 1)
# --------------------------------------------------------------------------------------------------

def ref_kmeans(p, c):
    """One Lloyd step: assignment by squared L2 distance, new centroids = means, an empty cluster unchanged."""
    p, c = _f64(p), _f64(c)
    a = ((p[:, None, :] - c[None]) ** 2).sum(-1).argmin(1)
    cnt = np.bincount(a, minlength=c.shape[0])
    new = c.copy()
    for j in np.nonzero(cnt)[0]:
        new[j] = p[a == j].mean(0)
    return new, cnt, a


def _clusters(N, D, C, dtype, seed, empty=()):
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((C, D)) * 3
    p = centres[rng.integers(0, C, N)] + rng.standard_normal((N, D))
    c = centres + rng.standard_normal((C, D)) * 0.5
    for j in empty:
        c[j] += 100.0       # far away from every point: no assignment
    return p.astype(dtype), c.astype(dtype)


@pytest.mark.parametrize("N,D,C,dtype,empty", [
    (512, 32, 16, np.float32, ()),
    (300, 48, 24, np.float32, (3, 17)),      # ragged last tile of 44 points, two empty clusters
    (1000, 64, 32, BF16, (0,)),
])
def test_kmeans_step(rs, N, D, C, dtype, empty):
    m = rs[0]
    p, c = _clusters(N, D, C, dtype, seed=N + C, empty=empty)
    new, cnt, a = run_clean(m.kmeans_step, p, c)
    want_c, want_n, want_a = ref_kmeans(p, c)
    assert new.dtype == np.float32 and cnt.dtype == np.int32 and a.dtype == np.uint32
    np.testing.assert_array_equal(a[:, 0], want_a)
    np.testing.assert_array_equal(cnt[:, 0], want_n)
    assert cnt.sum() == N
    for j in empty:
        assert cnt[j, 0] == 0
        np.testing.assert_array_equal(new[j], c[j].astype(np.float32))   # kept bit for bit
    close(new, want_c, dtype)


def test_kmeans_lloyd_iterations(rs):
    """Four steps in a row, each fed the kernel's previous centroids, track numpy's Lloyd iterations; the
    inertia never increases."""
    m = rs[0]
    p, c = _clusters(640, 16, 12, np.float32, seed=11)
    want = _f64(c)
    inertia = []
    for _ in range(4):
        c, cnt, a = run_clean(m.kmeans_step, p, c)
        want, want_n, want_a = ref_kmeans(p, want)
        np.testing.assert_array_equal(a[:, 0], want_a)
        close(c, want)
        inertia.append(((_f64(p) - _f64(c)[a[:, 0]]) ** 2).sum())
    assert all(b <= a_ * (1 + 1e-9) for a_, b in zip(inertia, inertia[1:])), inertia


def test_kmeans_structure(rs):
    """N = 512, D = 32, C = 16: NP = 4 point tiles."""
    m = rs[0]
    N, D, C = 512, 32, 16
    NP = N // 128
    p, c = _clusters(N, D, C, np.float32, seed=1)
    run_clean(m.kmeans_step, p, c)
    cnt = _ops(m.kmeans_step)
    # per point tile: -2 p.c, the ||c||^2 broadcast and the onehot^T [p | 1] accumulation
    assert cnt["nc_matmul"] == 3 * NP, cnt
    assert cnt["nc_transpose"] == NP, cnt
    assert cnt["max8"] == cnt["nc_find_index8"] == NP, cnt
    assert cnt["iota"] == 1 and cnt["dma_transpose"] == 1, cnt   # cluster ids; centroids loaded [D, C]
    # point loads and assignment stores per tile; old centroids (row-major), new centroids and counts
    assert cnt["dma_copy"] == 2 * NP + 1 + 2, cnt
    prof = m.kmeans_step.last_profile
    assert prof.stat("memory.hbm_read_bytes") == N * D * 4 + 2 * C * D * 4
    assert prof.stat("memory.hbm_write_bytes") == C * D * 4 + C * 4 + N * 4


# --------------------------------------------------------------------------------------------------
# CLIP (Beta 1, shifted) and SigLIP (new dialect)
# --------------------------------------------------------------------------------------------------

def _lse(z):
    mx = z.max(1, keepdims=True)
    return mx[:, 0] + np.log(np.exp(z - mx).sum(1))


def ref_clip(img, txt, logit_scale):
    z = min(math.exp(float(logit_scale[0])), 100.0) * _unit(img) @ _unit(txt).T
    d = np.diag(z)
    return 0.5 * ((_lse(z) - d).mean() + (_lse(z.T) - d).mean())


def ref_siglip(img, txt, t_prime, b):
    L = math.exp(float(t_prime[0])) * _unit(img) @ _unit(txt).T + float(b[0])
    z = 2 * np.eye(L.shape[0]) - 1
    return np.logaddexp(0.0, -z * L).sum() / L.shape[0]


def _pairs(N, D, dtype, seed):
    """Paired embeddings: text = image + noise, so the diagonal dominates as in a trained model."""
    img = _randn((N, D), np.float32, seed=seed)
    txt = img + _randn((N, D), np.float32, seed=seed + 1)
    return img.astype(dtype), txt.astype(dtype)


@pytest.mark.parametrize("N,D,dtype,scale", [
    (256, 64, np.float32, 1 / 0.07),
    (300, 96, np.float32, 30.0),      # ragged last row tile of 44
    (200, 128, BF16, 1 / 0.07),
])
def test_clip_loss_shifted(rs, N, D, dtype, scale):
    m = rs[0]
    img, txt = _pairs(N, D, dtype, seed=N)
    ls = np.array([math.log(scale)], np.float32)
    loss = run_clean(m.clip_loss_shifted, img, txt, ls)
    assert loss.shape == (1, 1) and loss.dtype == np.float32
    close(loss[0, 0], ref_clip(img, txt, ls), dtype)


def test_clip_loss_shifted_structure(rs):
    """N = 256, D = 64: NT = 2 row tiles."""
    m = rs[0]
    N, D = 256, 64
    NT = N // 128
    img, txt = _pairs(N, D, np.float32, seed=3)
    run_clean(m.clip_loss_shifted, img, txt, np.array([2.5], np.float32))
    c = _ops(m.clip_loss_shifted)
    # per row tile the [128, N] logits and the column sums (ones^T exp); one partition sum at the end
    assert c["nc_matmul"] == 2 * NT + 1, c
    assert c["nc_transpose"] == 2 * NT, c          # normalised image and text tiles onto [D, 128]
    assert c["activation_reduce"] == 2 * NT, c     # sums of squares
    prof = m.clip_loss_shifted.last_profile
    # both embeddings once; the logit scale broadcast to the 128 partitions (4 bytes each)
    assert prof.stat("memory.hbm_read_bytes") == 2 * N * D * 4 + 128 * 4
    assert prof.stat("memory.hbm_write_bytes") == 4


@pytest.mark.parametrize("N,D,dtype,t,b", [
    (256, 64, np.float32, 10.0, -10.0),     # big_vision's initialisation t' = log 10, b = -10
    (300, 96, np.float32, 5.0, -3.0),       # ragged last row tile
    (200, 128, BF16, 10.0, -10.0),
])
def test_siglip_loss(rsn, N, D, dtype, t, b):
    img, txt = _pairs(N, D, dtype, seed=N + 5)
    tp = np.array([math.log(t)], np.float32)
    bb = np.array([b], np.float32)
    loss = run_clean(rsn.siglip_loss, img, txt, tp, bb)
    assert loss.shape == (1, 1) and loss.dtype == np.float32
    close(loss[0, 0], ref_siglip(img, txt, tp, bb), dtype)


def test_siglip_structure(rsn):
    """N = 256, D = 64: NT = 2 row tiles."""
    N, D = 256, 64
    NT = N // 128
    img, txt = _pairs(N, D, np.float32, seed=9)
    run_clean(rsn.siglip_loss, img, txt, np.array([2.3], np.float32), np.array([-10.0], np.float32))
    c = _ops(rsn.siglip_loss)
    assert c["nc_matmul"] == NT + 1, c             # logits per row tile; the partition sum
    assert c["affine_select"] == NT, c             # the +-1 labels of each row tile
    assert c["activation_reduce"] == 2 * NT + NT, c   # sums of squares (image, text), softplus row sums
    assert c["nc_transpose"] == 2 * NT, c
    prof = rsn.siglip_loss.last_profile
    # both embeddings once; t' and b broadcast to 128 partitions
    assert prof.stat("memory.hbm_read_bytes") == 2 * N * D * 4 + 2 * 128 * 4


# --------------------------------------------------------------------------------------------------
# Product quantisation ADC (new dialect)
# --------------------------------------------------------------------------------------------------

def ref_pq(q, cb, codes):
    Q = q.shape[0]
    M, _, dsub = cb.shape
    lut = ((_f64(q).reshape(Q, M, 1, dsub) - _f64(cb)[None]) ** 2).sum(-1)     # [Q, M, 256]
    return sum(lut[:, m, codes[:, m].astype(np.int64)] for m in range(M))


def _pq_inputs(Q, M, dsub, N, dtype, seed):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((Q, M * dsub)).astype(dtype)
    cb = rng.standard_normal((M, 256, dsub)).astype(dtype)
    codes = rng.integers(0, 256, (N, M)).astype(np.uint8)
    return q, cb, codes


@pytest.mark.parametrize("gather", ["onehot", "dma"])
@pytest.mark.parametrize("Q,M,dsub,N,dtype", [
    (50, 4, 16, 700, np.float32),      # ragged: tiles of 512 + 188 (onehot), 5 x 128 + 60 (dma)
    (128, 8, 8, 1000, np.float32),
    (64, 8, 16, 300, BF16),            # bf16 queries / codebooks, the LUTs in fp32
])
def test_pq_adc(rsn, gather, Q, M, dsub, N, dtype):
    q, cb, codes = _pq_inputs(Q, M, dsub, N, dtype, seed=N + M)
    dist = run_clean(rsn.pq_adc, q, cb, codes, gather)
    assert dist.shape == (Q, N) and dist.dtype == np.float32
    # the LUTs are exact fp32 arithmetic on the (rounded) inputs: fp32 tolerance even for bf16 inputs
    close_to_max(dist, ref_pq(q, cb, codes), np.float32)


def test_pq_adc_strategies_structure(rsn):
    """Q = 64, M = 8, dsub = 16, N = 1024: the same distances; the one-hot variant reads each input once, the gather
    variant stages the LUTs in HBM (written once) and gathers one LUT row per (database row, sub-space)."""
    Q, M, dsub, N = 64, 8, 16, 1024
    H = 2                                   # halves of the 256 codes
    q, cb, codes = _pq_inputs(Q, M, dsub, N, np.float32, seed=2)
    inputs = Q * M * dsub * 4 + M * 256 * dsub * 4 + N * M
    d1 = run_clean(rsn.pq_adc, q, cb, codes, "onehot")
    c1, p1 = _ops(rsn.pq_adc), rsn.pq_adc.last_profile
    d2 = run_clean(rsn.pq_adc, q, cb, codes, "dma")
    c2, p2 = _ops(rsn.pq_adc), rsn.pq_adc.last_profile
    close(d1, d2)
    NT = N // 512
    # LUTs: 2 matmuls per (m, half); per 512-column tile M code broadcasts and M * H one-hot matmuls
    assert c1["nc_matmul"] == 2 * M * H + NT * (M + M * H), c1
    # queries, M * H codebook halves, codes and distances per tile
    assert c1["dma_copy"] == 1 + M * H + 2 * NT, c1
    assert p1.stat("memory.hbm_read_bytes") == inputs
    assert p1.stat("memory.hbm_write_bytes") == Q * N * 4
    NR = N // 128
    assert c2["nc_matmul"] == 2 * M * H, c2
    # queries, codebooks, LUT staging (M * H), per 128 rows: codes, M gathers, the store
    assert c2["dma_copy"] == 1 + M * H + M * H + NR * (1 + M + 1), c2
    gathers = [o for o in executed_ops(rsn.pq_adc.last_json["body"])
               if o["op"] == "dma_copy" and "offsets" in o]      # a runtime row offset per partition
    assert len(gathers) == NR * M and all(o["src"]["tensor"] == "lut_hbm" for o in gathers)
    assert p2.stat("memory.hbm_read_bytes") == inputs + N * M * Q * 4
    assert p2.stat("memory.hbm_write_bytes") == Q * N * 4 + M * 256 * Q * 4
