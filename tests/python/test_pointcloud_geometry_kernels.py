"""Point-cloud / 3-D geometry kernels written like public NKI ports of PointNet++ / 3-D detection ops
(tests/python/kernels/pointcloud_geometry_kernels.py, Beta-1 dialect, and pointcloud_geometry_kernels_new.py, new
dialect; both unmodified, through ``nsim.compat``):

- rigid transform + pinhole projection (Beta 1): homogeneous [4, 128] tiles (masked transposed loads, ragged last
  tile) times [R^T; t] on TensorE, perspective divide;
- kNN grouping (Beta 1): squared distances by the ||c||^2 + ||p||^2 - 2 c.p expansion on TensorE, k nearest by
  max8 / nc_find_index8 / nc_match_replace8 rounds, features gathered by indirect ``nl.load``;
- three_nn + three_interpolate (Beta 1): the 3 nearest from one max8, inverse-distance weights, weighted sum of three
  gathered rows;
- farthest point sampling (new dialect): running min-distance, per-partition max8 / nc_find_index8, the 128
  candidates flattened onto one partition by SBUF -> SBUF DMA, nc_n_gather of the winner's id, ``register_load`` of
  it and the next sample fetched (broadcast to all partitions) by ``xyz.ap(..., scalar_offset=reg)``;
- PointNet++ ball query + grouping (new dialect): the first k points within the radius (max8 rounds on
  in_radius * (N - j)), padded with the first hit, features gathered by ``.ap(vector_offset=)`` DMAs.

Checked: float outputs against float64 numpy (fp32 1e-5; the distance expansion's error is derived where it
matters: with coordinates on a 1/64 grid every term is exact in fp32, so distances, and therefore indices, are exact
and ties are broken as max8 / nc_find_index8 / nc_match_replace8 break them, by ascending point index; with random
floats the inputs are checked to have no near-tie within the derived error bound before the indices are compared),
exact integer ids (FPS order, neighbour ids), no sanitizer report, instruction counts per FPS step and per centroid
tile, HBM bytes of the gathers, and the timing story: each FPS step waits for the previous step's argmax through a
register, so the steps cannot overlap and the time grows by the same amount per sample (linear in npoint); the DMA
addressed by the register starts after the on-chip argmax (nc_find_index8 / nc_n_gather) and the register_load
finished (instruction table of the run).

No nsim fixes were needed by this family."""
import csv

import numpy as np
import pytest

from conftest import executed_ops, op_counts, require_core, run_clean, sample_fixture  # noqa: E402,F401

_core, ml_dtypes = require_core()
from numeric_helpers import close, f64, rand, randn  # noqa: E402

EPS32 = 2.0 ** -23

pc = sample_fixture("pointcloud_geometry_kernels.py")
pcn = sample_fixture("pointcloud_geometry_kernels_new.py", module_only=True)


def _grid_points(n, seed, lo=0, hi=64):
    """Points with coordinates on a 1/64 grid in [0, 1): every product and sum of the distance expansion is exact
    in fp32 (multiples of 2^-12 below 8 need at most 15 significant bits), so distances have exact ties."""
    return (np.random.default_rng(seed).integers(lo, hi, (n, 3)) / 64.0).astype(np.float32)


def _sq_dist(a, b):
    return ((f64(a)[:, None, :] - f64(b)[None, :, :]) ** 2).sum(-1)


def _expansion_bound(a, b):
    """Error bound of -d = 2 c.p - |p|^2 - |c|^2 computed in fp32 (two 3-term matmul sums accumulated in PSUM, the
    |c|^2 row sum and one subtract): a few roundings each of relative size 2^-24 on terms of size at most
    |c|^2 + |p|^2 + 2 |c||p|; 8 units of 2^-23 of that size covers them."""
    na = (f64(a) ** 2).sum(1)[:, None]
    nb = (f64(b) ** 2).sum(1)[None, :]
    return 8 * EPS32 * (na + nb + 2 * np.sqrt(na * nb)).max()


# --------------------------------------------------------------------------------------------------
# rigid transform + projection (Beta 1)
# --------------------------------------------------------------------------------------------------

def _pose(seed):
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.standard_normal((3, 3)))
    if np.linalg.det(q) < 0:
        q[:, 0] *= -1
    t = np.array([0.2, -0.3, 5.0])
    return q, t


@pytest.mark.parametrize("N", [128, 300, 1000])
def test_transform_project_matches_numpy(pc, N):
    """cam = p R^T + t by one matmul of the homogeneous tile; (u, v, z) with u = fx x / z + cx. Ragged last tile by
    masks; relative fp32 error (the pixel values are ~ 300, errors ~ 1e-5 of them)."""
    m = pc[0]
    R, t = _pose(N)
    pts = rand((N, 3), np.float32, seed=N)
    rt = np.vstack([R.T, t]).astype(np.float32)
    out = run_clean(m.transform_project, pts, rt, 500.0, 480.0, 320.0, 240.0)
    cam = f64(pts) @ f64(rt[:3]) + f64(rt[3])
    want = np.stack([500 * cam[:, 0] / cam[:, 2] + 320, 480 * cam[:, 1] / cam[:, 2] + 240, cam[:, 2]], 1)
    assert out.shape == (N, 3) and out.dtype == np.float32
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    NT = (N + 127) // 128
    c = op_counts(m.transform_project)
    assert c["nc_matmul"] == NT, c  # one matmul per tile: rotation and translation together
    assert m.transform_project.last_profile.stat("memory.hbm_read_bytes") == N * 12 + rt.nbytes


# --------------------------------------------------------------------------------------------------
# kNN grouping and three_interpolate (Beta 1)
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("N,M,C,k", [(512, 256, 32, 16), (256, 130, 16, 8), (64, 5, 8, 32)])
def test_knn_group_exact_on_grid(pc, N, M, C, k):
    """Grid coordinates: distances exact, many ties; the k nearest in ascending distance, equal distances in
    ascending point index (a stable argsort), distances exact, features bit for bit."""
    m = pc[0]
    xyz, cen = _grid_points(N, seed=N), _grid_points(M, seed=M + 1)
    feat = randn((N, C), np.float32, seed=3)
    ids, dist, g = run_clean(m.knn_group, xyz, cen, feat, k)
    d = _sq_dist(cen, xyz)
    want = np.argsort(d, 1, kind="stable")[:, :k]
    assert any(len(np.unique(r[:k + 1])) < k + 1 for r in np.sort(d, 1))  # ties present
    assert ids.dtype == np.int32
    np.testing.assert_array_equal(ids, want)
    np.testing.assert_array_equal(f64(dist), np.take_along_axis(d, want, 1))
    np.testing.assert_array_equal(g, feat[want])


def test_knn_group_random_floats(pc):
    """Random coordinates: the expansion's fp32 error (bound derived in ``_expansion_bound``) is far below the gaps
    between consecutive neighbour distances of these inputs (checked), so the ids are exact and the distances within
    the bound."""
    m = pc[0]
    N, M, C, k = 512, 128, 16, 8
    xyz, cen = rand((N, 3), seed=13, lo=-1, hi=1), rand((M, 3), seed=14, lo=-1, hi=1)
    feat = randn((N, C), np.float32, seed=12)
    d = _sq_dist(cen, xyz)
    bound = _expansion_bound(cen, xyz)
    ds = np.sort(d, 1)[:, :k + 1]
    assert np.diff(ds, axis=1).min() > 2 * bound  # no near-tie among the k + 1 nearest
    ids, dist, g = run_clean(m.knn_group, xyz, cen, feat, k)
    want = np.argsort(d, 1)[:, :k]
    np.testing.assert_array_equal(ids, want)
    assert np.abs(f64(dist) - ds[:, :k]).max() <= bound
    np.testing.assert_array_equal(g, feat[want])


def test_knn_group_structure(pc):
    """Per centroid tile: 2 matmuls (2 c.p, then -|p|^2 accumulated), k / 8 max8 and nc_find_index8, k / 8 - 1
    nc_match_replace8, k row gathers + k stores of the grouped rows + 2 centroid loads (one transposed) + 2 stores.
    HBM reads = the points once (N x 12 B) + the centroids twice (both layouts) + exactly the k gathered rows per
    centroid (M k C x 4 B): the features are never read whole."""
    m = pc[0]
    N, M, C, k = 512, 256, 32, 16
    xyz, cen = _grid_points(N, seed=1), _grid_points(M, seed=2)
    feat = randn((N, C), np.float32, seed=3)
    run_clean(m.knn_group, xyz, cen, feat, k)
    NT = M // 128
    c = op_counts(m.knn_group)
    assert c["nc_matmul"] == 2 * NT and c["max8"] == NT * k // 8 and c["nc_find_index8"] == NT * k // 8, c
    assert c["nc_match_replace8"] == NT * (k // 8 - 1), c
    gathers = [o for o in executed_ops(m.knn_group.last_json["body"])
               if o["op"] == "dma_copy" and isinstance(o["src"], dict) and o["src"]["tensor"] == "features"]
    assert len(gathers) == NT * k and all("offsets" in o for o in gathers)
    # per tile k gathers + k stores + the row-layout centroid load + 2 stores; the transposed loads (points once,
    # centroids per tile) are dma_transpose
    assert c["dma_copy"] == NT * (2 * k + 3) and c["dma_transpose"] == 1 + NT, c
    prof = m.knn_group.last_profile
    assert prof.stat("memory.hbm_read_bytes") == N * 12 + 2 * M * 12 + M * k * C * 4
    assert prof.stat("memory.hbm_write_bytes") == M * k * 4 * 2 + M * k * C * 4


def _ref_three_interpolate(unk, kn, kf):
    d = _sq_dist(unk, kn)
    idx = np.argsort(d, 1, kind="stable")[:, :3]
    r = 1.0 / (np.sqrt(np.take_along_axis(d, idx, 1)) + 1e-8)
    w = r / r.sum(1, keepdims=True)
    return (f64(kf)[idx] * w[..., None]).sum(1)


@pytest.mark.parametrize("n,m,C", [(300, 256, 32), (128, 64, 64)])
def test_three_interpolate_on_grid(pc, n, m, C):
    """Grid coordinates (exact distances; ties at the third neighbour broken by ascending index as nc_find_index8
    does; a point coinciding with a known point gets weight ~1 through 1 / 1e-8): fp32 tolerance."""
    mod = pc[0]
    unk, kn = _grid_points(n, seed=n), _grid_points(m, seed=m + 7)
    kf = randn((m, C), np.float32, seed=5)
    out = run_clean(mod.three_interpolate, unk, kn, kf)
    close(out, _ref_three_interpolate(unk, kn, kf))
    c = op_counts(mod.three_interpolate)
    NT = (n + 127) // 128
    assert c["max8"] == NT and c["nc_find_index8"] == NT and c["nc_match_replace8"] == 0, c
    gathers = [o for o in executed_ops(mod.three_interpolate.last_json["body"])
               if o["op"] == "dma_copy" and isinstance(o["src"], dict) and o["src"]["tensor"] == "known_feats"]
    assert len(gathers) == 3 * NT


def test_three_interpolate_random_floats(pc):
    """Random coordinates: the squared distances carry the expansion's absolute error e (``_expansion_bound``), so a
    weight 1 / sqrt(d) has relative error e / (2 d); with the nearest d >= d_min of these inputs the output's error
    is bounded by 2 e / (2 d_min) relative to the feature scale (plus fp32 rounding)."""
    mod = pc[0]
    n, m, C = 200, 128, 16
    unk, kn = rand((n, 3), seed=20, lo=-1, hi=1), rand((m, 3), seed=21, lo=-1, hi=1)
    kf = randn((m, C), np.float32, seed=22)
    d = _sq_dist(unk, kn)
    ds = np.sort(d, 1)
    e = _expansion_bound(unk, kn)
    assert (ds[:, 3] - ds[:, 2]).min() > 2 * e  # the third and fourth neighbours are never confused
    tol = 2 * e / (2 * ds[:, 0].min()) + 1e-5
    out = run_clean(mod.three_interpolate, unk, kn, kf)
    want = _ref_three_interpolate(unk, kn, kf)
    assert np.abs(f64(out) - want).max() <= tol * np.abs(kf).max() * 3, (np.abs(f64(out) - want).max(), tol)


# --------------------------------------------------------------------------------------------------
# farthest point sampling (new dialect)
# --------------------------------------------------------------------------------------------------

def ref_fps(xyz, npoint):
    """PointNet++ FPS in float64 (first sample 0); also the smallest relative gap between the chosen min-distance
    and the runner-up over the steps (the kernel's fp32 distances must not reorder them)."""
    x = f64(xyz)
    md = np.full(len(x), 1e10)
    sel, gap = [0], np.inf
    for _ in range(npoint - 1):
        md = np.minimum(md, ((x - x[sel[-1]]) ** 2).sum(1))
        top2 = np.sort(md)[-2:]
        gap = min(gap, (top2[1] - top2[0]) / top2[1])
        sel.append(int(np.argmax(md)))
    return np.array(sel), gap


@pytest.mark.parametrize("N,npoint", [(1024, 32), (2048, 16), (4096, 8), (1024, 1)])
def test_fps_matches_numpy(pcn, N, npoint):
    """Sample order exact (the direct diff-square-sum distances in fp32 have relative error < 4 x 2^-24, far below
    the smallest gap between the farthest point and the runner-up of these inputs, checked) and the coordinates of
    the samples bit for bit."""
    xyz = rand((N, 3), np.float32, seed=N + npoint, lo=-1, hi=1)
    want, gap = ref_fps(xyz, npoint)
    assert gap > 1e-5
    ids, pts = run_clean(pcn.farthest_point_sample, xyz, npoint)
    assert ids.dtype == np.uint32 and ids.shape == (1, npoint)
    np.testing.assert_array_equal(ids[0], want)
    np.testing.assert_array_equal(pts, xyz[want])


def test_fps_ops_per_step(pcn):
    """Per step (npoint - 1 of them): 4 tensor_tensor on [128, F(, 3)] (subtract, square, running min, global id)
    + tensor_reduce; 2 max8 + 2 nc_find_index8 (per partition, then over the 128 candidates); 1 nc_n_gather;
    1 register_load; 4 DMAs (two flattening copies, the register-addressed fetch, the sample's store). Once: the
    points' load, the first fetch and store, the ids' store. HBM reads: the points once + 128 x 12 B per sample
    (the broadcast fetch reads the 12-byte row for every partition)."""
    N, npoint = 2048, 24
    xyz = rand((N, 3), np.float32, seed=5, lo=-1, hi=1)
    run_clean(pcn.farthest_point_sample, xyz, npoint)
    S = npoint - 1
    c = op_counts(pcn.farthest_point_sample)
    assert c["tensor_tensor"] == 4 * S and c["tensor_reduce"] == S, c
    assert c["max8"] == 2 * S and c["nc_find_index8"] == 2 * S and c["nc_n_gather"] == S, c
    assert c["register_load"] == S and c["dma_copy"] == 4 * S + 4, c
    prof = pcn.farthest_point_sample.last_profile
    assert prof.stat("memory.hbm_read_bytes") == N * 12 + npoint * 128 * 12
    assert prof.stat("memory.hbm_write_bytes") == npoint * 12 + npoint * 4


def test_fps_time_is_linear_in_npoint(pcn):
    """Each step's fetch waits, through the register, for the previous step's argmax, and each argmax needs the
    running min updated with that fetch: a serial chain with no overlap between steps. The time therefore grows by
    the same amount per sample: the increments 8 -> 16, 16 -> 32, 32 -> 64 per added sample agree within 2 %, and
    doubling npoint nearly doubles the time."""
    xyz = rand((2048, 3), np.float32, seed=9, lo=-1, hi=1)
    t = {}
    for n in (8, 16, 32, 64):
        run_clean(pcn.farthest_point_sample, xyz, n)
        t[n] = pcn.farthest_point_sample.last_profile.total_time_ns
    per = [(t[b] - t[a]) / (b - a) for a, b in ((8, 16), (16, 32), (32, 64))]
    assert max(per) <= 1.02 * min(per), (t, per)
    assert 1.8 < t[64] / t[32] < 2.05, t


def test_fps_register_addressed_fetch_starts_after_the_argmax(pcn, tmp_path):
    """Instruction table of the run (nsim.export.write_tables of kernel.last_json): every DMA addressed by the
    register (the fetch of the next sample) starts no earlier than the end of the nc_n_gather that wrote the id,
    the nc_find_index8 that found it and the register_load that read it."""
    from nsim.export import write_tables
    npoint = 6
    xyz = rand((1024, 3), np.float32, seed=4, lo=-1, hi=1)
    run_clean(pcn.farthest_point_sample, xyz, npoint)
    res = write_tables(pcn.farthest_point_sample.last_json, tmp_path)
    rows = list(csv.DictReader(open(res["instructions"])))
    src = open(pcn.__file__).read().splitlines()
    fetch_line = [i + 1 for i, s in enumerate(src) if "scalar_offset=last" in s][-1]  # the fetch inside the loop
    fetches = [r for r in rows if r["opcode"] == "dma_copy" and int(r["src_line"]) == fetch_line]
    assert len(fetches) == npoint - 1
    for f in fetches:
        i = int(f["index"])
        before = rows[:i]
        last = {op: [r for r in before if r["opcode"] == op][-1] for op in
                ("nc_find_index8", "nc_n_gather", "register_load")}
        for op, r in last.items():
            assert float(f["start_ns"]) >= float(r["end_ns"]), (op, r, f)


# --------------------------------------------------------------------------------------------------
# ball query + grouping (new dialect)
# --------------------------------------------------------------------------------------------------

def ref_ball_query(xyz, cen, r, k):
    d = _sq_dist(cen, xyz)
    out = np.empty((len(cen), k), np.int64)
    for i in range(len(cen)):
        h = np.nonzero(d[i] < r * r)[0][:k]
        out[i] = np.concatenate([h, np.full(k - len(h), h[0])])
    return out


@pytest.mark.parametrize("N,M,C,k,r", [(512, 128, 32, 16, 0.2), (256, 100, 16, 8, 0.3), (512, 64, 8, 32, 0.35)])
def test_ball_query_group_matches_numpy(pcn, N, M, C, k, r):
    """The first k points within r in index order, padded with the first hit (some centroids have fewer than k
    hits, some more); grid coordinates make the distances exact and no distance equals r^2; each centroid is one
    of the points, so it always has a hit. Grouped features bit for bit."""
    rng = np.random.default_rng(N + k)
    xyz = _grid_points(N, seed=N + M)
    cen = xyz[rng.choice(N, M, replace=False)]
    feat = randn((N, C), np.float32, seed=k)
    d = _sq_dist(cen, xyz)
    assert np.abs(d - r * r).min() > 1e-6
    hits = (d < r * r).sum(1)
    assert hits.min() < k < hits.max()
    ids, g = run_clean(pcn.ball_query_group, xyz, cen, feat, r, k)
    want = ref_ball_query(xyz, cen, r, k)
    assert ids.dtype == np.int32
    np.testing.assert_array_equal(ids, want)
    np.testing.assert_array_equal(g, feat[want])


def test_ball_query_group_structure(pcn):
    """Two matmuls; k / 8 max8 rounds, no nc_find_index8 (the id is N - score); one indirect DMA per neighbour slot
    (k of them, each gathering M rows through vector_offset); HBM reads = the points and centroids (the centroids
    in both layouts) + exactly the M k gathered rows."""
    N, M, C, k = 512, 128, 32, 16
    xyz = _grid_points(N, seed=3)
    cen = xyz[:M]
    feat = randn((N, C), np.float32, seed=4)
    run_clean(pcn.ball_query_group, xyz, cen, feat, 0.2, k)
    c = op_counts(pcn.ball_query_group)
    assert c["nc_matmul"] == 2 and c["max8"] == k // 8 and c["nc_match_replace8"] == k // 8 - 1, c
    assert c.get("nc_find_index8", 0) == 0 and c["dma_copy"] == 3 + k + 2, c
    prof = pcn.ball_query_group.last_profile
    assert prof.stat("memory.hbm_read_bytes") == N * 12 + 2 * M * 12 + M * k * C * 4
    assert prof.stat("memory.hbm_write_bytes") == M * k * 4 + M * k * C * 4
