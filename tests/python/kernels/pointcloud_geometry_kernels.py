"""Point-cloud geometry kernels in the Beta-1 dialect (``neuronxcc.nki``), written the way public NKI kernels write
them (arange index expressions, value-returning ``nl``/``nisa`` calls, masks for ragged tiles, indirect loads with a
tile of row ids as the first index item):

- ``transform_project(points, rt, fx, fy, cx, cy)``: rigid transform + pinhole projection of N points (tiles of
  128, the last one masked). Each tile is loaded transposed ([3, 128], coordinates on the partitions) into a
  homogeneous [4, 128] tile (row 3 = ones) and multiplied on TensorE by rt = [R^T; t] ([4, 3]): camera
  coordinates [128, 3] in PSUM; then the perspective divide (``nl.reciprocal`` of z) and u = fx x / z + cx,
  v = fy y / z + cy (``nisa.tensor_scalar``). Returns [N, 3] = (u, v, z).
- ``knn_group(xyz, new_xyz, features, k)``: k nearest neighbours of M centroids (tiles of 128, ragged last tile)
  among N <= 512 points and the grouping of their features. Negated squared distances
  -d = 2 c.p - |p|^2 - |c|^2 by two accumulating matmuls on the coordinate rows (``psum += nisa.nc_matmul``) and a
  per-partition subtract of |c|^2; k / 8 rounds of ``nisa.max8`` / ``nisa.nc_find_index8`` with
  ``nisa.nc_match_replace8`` between rounds (nearest first; equal distances in ascending point order); each
  neighbour slot's features [128, C] gathered by ``nl.load(features[ids[i_p, j], i_c])``. Returns the ids [M, k]
  int32, squared distances [M, k] and grouped features [M, k, C].
- ``three_interpolate(unknown, known, known_feats)``: PointNet++ feature propagation: three_nn (the same distance
  matmuls, the first 3 of one ``max8``), inverse-distance weights 1 / (sqrt(d) + 1e-8) normalised to sum 1, and the
  weighted sum of the three gathered feature rows. Returns [n, C].

Written for nsim's tests in the style of those kernels; not copies of any file. No nsim imports.
"""
import numpy as np

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl

PMAX = 128
NEG = -3.0e38


@nki.jit
def transform_project(points, rt, fx, fy, cx, cy):
  N, _ = points.shape
  out = nl.ndarray((N, 3), dtype=points.dtype, buffer=nl.shared_hbm)
  i_c = nl.arange(3)[:, None]
  i_h = nl.arange(4)[:, None]
  i_n = nl.arange(PMAX)[None, :]
  i_p = nl.arange(PMAX)[:, None]
  i_3 = nl.arange(3)[None, :]

  w = nl.load(rt[i_h, i_3])  # [R^T; t]: [4, 3]
  for t in nl.affine_range((N + PMAX - 1) // PMAX):
    ph = nl.ones((4, PMAX), dtype=nl.float32)
    ph[i_c, i_n] = nl.load(points[t * PMAX + i_n, i_c], mask=(t * PMAX + i_n < N))
    cam = nisa.nc_matmul(ph, w)  # [128, 3] = p R^T + t
    valid = t * PMAX + i_p < N
    rz = nl.reciprocal(cam[i_p, 2], mask=valid)
    res = nl.ndarray((PMAX, 3), dtype=nl.float32)
    res[i_p, 0] = nisa.tensor_scalar(nl.multiply(cam[i_p, 0], rz, mask=valid), np.multiply, fx, op1=np.add,
                                     operand1=cx, mask=valid)
    res[i_p, 1] = nisa.tensor_scalar(nl.multiply(cam[i_p, 1], rz, mask=valid), np.multiply, fy, op1=np.add,
                                     operand1=cy, mask=valid)
    res[i_p, 2] = nl.copy(cam[i_p, 2], mask=valid)
    nl.store(out[t * PMAX + i_p, i_3], value=res, mask=valid)
  return out


def _neg_sq_dist(xyz_t, xyz_sq, cen_t, cen, valid):
  """-|c - p|^2 [128, N] for the centroids cen [128, 3] (cen_t [3, 128]) and the points xyz_t [3, N]."""
  N = xyz_t.shape[1]
  i_p = nl.arange(PMAX)[:, None]
  neg_ones = nl.full((3, PMAX), -1.0, dtype=nl.float32)
  nd_ps = nl.zeros((PMAX, N), dtype=nl.float32, buffer=nl.psum)
  nd_ps += nisa.nc_matmul(nl.multiply(cen_t, 2.0), xyz_t)
  nd_ps += nisa.nc_matmul(neg_ones, xyz_sq)
  c2 = nl.sum(nl.multiply(cen, cen, mask=valid), axis=[1], keepdims=True, mask=valid)
  return nl.subtract(nd_ps, c2[i_p, 0], mask=valid)


@nki.jit
def knn_group(xyz, new_xyz, features, k):
  N, _ = xyz.shape
  M, _ = new_xyz.shape
  _, C = features.shape
  assert N <= 512 and k % 8 == 0 and 8 <= k <= N
  ids_out = nl.ndarray((M, k), dtype=nl.int32, buffer=nl.shared_hbm)
  dist_out = nl.ndarray((M, k), dtype=nl.float32, buffer=nl.shared_hbm)
  grouped = nl.ndarray((M, k, C), dtype=features.dtype, buffer=nl.shared_hbm)

  i_c = nl.arange(3)[:, None]
  i_n = nl.arange(N)[None, :]
  i_m = nl.arange(PMAX)[None, :]
  i_p = nl.arange(PMAX)[:, None]
  i_3 = nl.arange(3)[None, :]
  i_k = nl.arange(k)[None, :]
  i_8 = nl.arange(8)[None, :]
  i_f = nl.arange(C)[None, :]

  xyz_t = nl.load(xyz[i_n, i_c])  # [3, N]
  xyz_sq = nl.multiply(xyz_t, xyz_t)
  for t in nl.affine_range((M + PMAX - 1) // PMAX):
    valid = t * PMAX + i_p < M
    cen_t = nl.zeros((3, PMAX), dtype=nl.float32)
    cen_t[i_c, i_m] = nl.load(new_xyz[t * PMAX + i_m, i_c], mask=(t * PMAX + i_m < M))
    cen = nl.load(new_xyz[t * PMAX + i_p, i_3], mask=valid)
    work = _neg_sq_dist(xyz_t, xyz_sq, cen_t, cen, valid)

    vals = nl.ndarray((PMAX, k), dtype=nl.float32)
    ids = nl.ndarray((PMAX, k), dtype=nl.uint32)
    for r in nl.static_range(k // 8):
      vals[i_p, r * 8 + i_8] = nisa.max8(src=work, mask=valid)
      ids[i_p, r * 8 + i_8] = nisa.nc_find_index8(data=work, vals=vals[i_p, r * 8 + i_8], mask=valid)
      if r + 1 < k // 8:
        work = nisa.nc_match_replace8(data=work, vals=vals[i_p, r * 8 + i_8], imm=NEG, mask=valid)

    nl.store(ids_out[t * PMAX + i_p, i_k], value=nl.copy(ids, dtype=nl.int32, mask=valid), mask=valid)
    nl.store(dist_out[t * PMAX + i_p, i_k], value=nl.negative(vals, mask=valid), mask=valid)
    for j in nl.static_range(k):
      g = nl.load(features[ids[i_p, j], i_f], mask=valid)
      nl.store(grouped[t * PMAX + i_p, j, i_f], value=g, mask=valid)
  return ids_out, dist_out, grouped


@nki.jit
def three_interpolate(unknown, known, known_feats):
  n, _ = unknown.shape
  m, _ = known.shape
  _, C = known_feats.shape
  assert 8 <= m <= 512
  out = nl.ndarray((n, C), dtype=known_feats.dtype, buffer=nl.shared_hbm)

  i_c = nl.arange(3)[:, None]
  i_n = nl.arange(m)[None, :]
  i_m = nl.arange(PMAX)[None, :]
  i_p = nl.arange(PMAX)[:, None]
  i_3 = nl.arange(3)[None, :]
  i_f = nl.arange(C)[None, :]

  known_t = nl.load(known[i_n, i_c])
  known_sq = nl.multiply(known_t, known_t)
  for t in nl.affine_range((n + PMAX - 1) // PMAX):
    valid = t * PMAX + i_p < n
    cen_t = nl.zeros((3, PMAX), dtype=nl.float32)
    cen_t[i_c, i_m] = nl.load(unknown[t * PMAX + i_m, i_c], mask=(t * PMAX + i_m < n))
    cen = nl.load(unknown[t * PMAX + i_p, i_3], mask=valid)
    nd = _neg_sq_dist(known_t, known_sq, cen_t, cen, valid)

    top = nisa.max8(src=nd, mask=valid)
    ids = nisa.nc_find_index8(data=nd, vals=top, mask=valid)
    # three_nn distances sqrt(max(d, 0)); weights 1 / (dist + 1e-8), normalised
    d2 = nl.maximum(nl.negative(top[i_p, i_3], mask=valid), 0.0, mask=valid)
    recip = nl.reciprocal(nl.add(nl.sqrt(d2, mask=valid), 1e-8, mask=valid), mask=valid)
    norm = nl.sum(recip, axis=[1], keepdims=True, mask=valid)
    w = nl.divide(recip, norm, mask=valid)

    acc = nl.zeros((PMAX, C), dtype=nl.float32)
    for j in nl.static_range(3):
      rows = nl.load(known_feats[ids[i_p, j], i_f], mask=valid)
      acc[i_p, i_f] = nl.add(acc, nl.multiply(rows, w[i_p, j], mask=valid), mask=valid)
    nl.store(out[t * PMAX + i_p, i_f], value=acc, mask=valid)
  return out
