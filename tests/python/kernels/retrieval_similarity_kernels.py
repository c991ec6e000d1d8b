"""Exact vector search and a k-means step in the Beta-1 dialect (``neuronxcc.nki``), written the way public NKI
ports of FAISS-style flat search and k-means write them (arange index expressions, value-returning ``nl`` / ``nisa``
calls, masks on the ragged last tiles):

- ``knn_cosine_topk(queries, database, k, n_tile)``: exact cosine nearest neighbours. queries [Q, D], database
  [N, D] (D <= 128, any Q and N >= k; fp32 or bf16). Query tiles of 128 rows are loaded row-major, L2-normalised
  on chip (sum of squares by ``activation_reduce``, ``nl.rsqrt`` of max(ss, 1e-24), as F.normalize) and transposed
  on the PE into the stationary [D, 128]. The database is loaded transposed ([D, n_tile] windows, ``nl.load`` of
  ``database[n0 + i_f, i_d]``), its column norms come from a ones [D, D] matmul of the squares (the norm of each
  row on every partition), and it is normalised once, resident in SBUF. Per (query tile, database tile): the
  scores [128, n_tile] by one matmul; the padding columns of a ragged last tile set to -3e38
  (``nisa.affine_select``); the tile's top k by k / 8 rounds of ``max8`` + ``nc_find_index8`` +
  ``nc_match_replace8``; and the merge with the running best: the [128, 2k] candidates (best | tile) go through the
  same rounds, the winners' global ids taken from the candidate ids by ``nl.gather_flattened``. Returns scores
  [Q, k] fp32 (descending) and ids [Q, k] uint32.
- ``l2_nearest(queries, database, n_tile)``: 1-nearest neighbour by squared L2 distance,
  ||q||^2 - 2 q.x + ||x||^2: queries and database loaded transposed ([D, 128] by ``nl.load``, [D, n_tile] by a
  masked ``nisa.dma_copy`` of ``database[n0 + i_n, i_dp]`` into a zeroed tile); -2 q.x and
  ||x||^2 (a ones [D, 128] matmul of the database squares) accumulated in one PSUM tile, ||q||^2 (per partition)
  subtracted from the negated tile, the argmin as ``max8`` / ``nc_find_index8`` of -d, kept across database tiles
  by a running compare (``nl.greater`` / ``nl.where``). Returns dist [Q, 1] fp32 and idx [Q, 1] uint32.
- ``kmeans_step(points, centroids)``: one Lloyd iteration. points [N, D] (any N; D < 512), centroids [C, D]
  (C <= 128). Per point tile: row-major load (with a ones column appended for the counts), a PE transpose for
  the distance matmul, d' = ||c||^2 - 2 p.c (||p||^2 does not change the argmin), argmin by ``max8`` /
  ``nc_find_index8`` of -d', a one-hot [128, C] by comparing an ``iota`` of the cluster ids with the winner
  (rows past N masked to zero), and onehot^T [points | 1] accumulated in PSUM over all point tiles: [C, D + 1] =
  per-cluster sums and counts. New centroid = sum / count, an empty cluster keeps its old centroid
  (``nl.where``). Returns new centroids [C, D] fp32, counts [C, 1] int32, assignments [N, 1] uint32.
- ``clip_loss_shifted(image_emb, text_emb, logit_scale)``: CLIP's symmetric cross-entropy for any N (ragged last
  tile), both directions from one set of logits tiles without a transpose: the embeddings are L2-normalised so
  every logit lies in [-s, s] (s = min(exp(logit_scale), 100)); a fixed shift by s replaces the max, row sums of
  exp(z - s) come from ``activation`` with an accumulate (row direction), and column sums from a ones-vector
  matmul of the same exp tiles accumulated in PSUM over the row tiles (column direction, the "second pass" of
  the transposed direction done by the PE). loss = (sum_i (lse_row_i - z_ii) + sum_j (lse_col_j - z_jj)) / (2N).
  Returns loss [1, 1] fp32. (Valid while s <= 40: exp(z - s) >= exp(-2s) stays a normal fp32.)

Written for nsim's tests in the style of those kernels; not copies of any file. No nsim imports.
"""
import numpy as np

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl

PMAX = 128
NEG = -3.0e38


def _rounds(vals, k, out_v, out_i):
  """k / 8 rounds of max8 / nc_find_index8 / nc_match_replace8 on vals (destroyed): out_v[:, :k] the k largest,
  descending, out_i[:, :k] their positions (uint32)."""
  i_p = nl.arange(PMAX)[:, None]
  i_8 = nl.arange(8)[None, :]
  for r in nl.static_range(k // 8):
    v8 = nisa.max8(src=vals)
    out_v[i_p, r * 8 + i_8] = v8
    out_i[i_p, r * 8 + i_8] = nisa.nc_find_index8(data=vals, vals=v8)
    if r + 1 < k // 8:
      vals[...] = nisa.nc_match_replace8(data=vals, vals=v8, imm=NEG)


@nki.jit
def knn_cosine_topk(queries, database, k=8, n_tile=512):
  Q, D = queries.shape
  N, D_ = database.shape
  assert D == D_ and D <= PMAX
  assert k % 8 == 0 and k <= n_tile <= 512 and n_tile % PMAX == 0 and N >= k
  dt = queries.dtype
  NQ = (Q + PMAX - 1) // PMAX
  NT = (N + n_tile - 1) // n_tile

  scores = nl.ndarray((Q, k), dtype=nl.float32, buffer=nl.shared_hbm)
  ids = nl.ndarray((Q, k), dtype=nl.uint32, buffer=nl.shared_hbm)

  i_p = nl.arange(PMAX)[:, None]
  i_d = nl.arange(D)[None, :]
  i_dp = nl.arange(D)[:, None]
  i_f = nl.arange(n_tile)[None, :]
  i_k = nl.arange(k)[None, :]

  # the database, normalised and transposed, resident: dbn[t] is [D, n_tile], padding columns zero
  ones_dd = nl.ones((D, D), dtype=nl.float32)
  dbn = nl.ndarray((NT, nl.par_dim(D), n_tile), dtype=dt, buffer=nl.sbuf)
  for t in nl.affine_range(NT):
    n0 = t * n_tile
    xT = nl.zeros((D, n_tile), dtype=nl.float32)
    xT[i_dp, i_f] = nl.load(database[n0 + i_f, i_dp], mask=(n0 + i_f < N), dtype=nl.float32)
    # ||x_n||^2 of every column, on every partition
    nrm = nisa.nc_matmul(ones_dd, nl.square(xT))
    rn = nl.rsqrt(nl.maximum(nrm, 1e-24))
    dbn[t, i_dp, i_f] = nl.multiply(xT, rn, dtype=dt)

  for qt in nl.affine_range(NQ):
    q0 = qt * PMAX
    valid = q0 + i_p < Q
    q = nl.zeros((PMAX, D), dtype=dt)
    q[i_p, i_d] = nl.load(queries[q0 + i_p, i_d], mask=valid)
    ss = nl.ndarray((PMAX, 1), dtype=nl.float32)
    nisa.activation_reduce(op=nl.square, data=q, reduce_op=nl.add, reduce_res=ss)
    rq = nl.rsqrt(nl.maximum(ss, 1e-24))
    qn = nl.multiply(q, rq, dtype=dt)
    qT = nl.copy(nisa.nc_transpose(qn), dtype=dt)   # [D, 128]

    best_v = nl.full((PMAX, k), NEG, dtype=nl.float32)
    best_i = nl.zeros((PMAX, k), dtype=nl.uint32)
    for t in nl.sequential_range(NT):
      n0 = t * n_tile
      sc_ps = nisa.nc_matmul(qT, dbn[t])                     # [128, n_tile] cosine scores
      sc = nl.copy(sc_ps, dtype=nl.float32)
      sc = nisa.affine_select(n0 + i_f < N, sc, NEG)          # padding columns of a ragged last tile
      tv = nl.ndarray((PMAX, k), dtype=nl.float32)
      ti = nl.ndarray((PMAX, k), dtype=nl.uint32)
      _rounds(sc, k, tv, ti)

      # merge: candidates = running best | this tile's best (global ids)
      cv = nl.ndarray((PMAX, 2 * k), dtype=nl.float32)
      ci = nl.ndarray((PMAX, 2 * k), dtype=nl.uint32)
      cv[i_p, i_k] = best_v
      cv[i_p, k + i_k] = tv
      ci[i_p, i_k] = best_i
      ci[i_p, k + i_k] = nl.add(ti, n0, dtype=nl.uint32)
      pos = nl.ndarray((PMAX, k), dtype=nl.uint32)
      _rounds(cv, k, best_v, pos)
      best_i[...] = nl.gather_flattened(ci, pos)

    nl.store(scores[q0 + i_p, i_k], value=best_v, mask=valid)
    nl.store(ids[q0 + i_p, i_k], value=best_i, mask=valid)
  return scores, ids


@nki.jit
def l2_nearest(queries, database, n_tile=512):
  Q, D = queries.shape
  N, D_ = database.shape
  assert D == D_ and D <= PMAX and n_tile <= 512 and N >= 8
  NQ = (Q + PMAX - 1) // PMAX
  NT = (N + n_tile - 1) // n_tile

  dist = nl.ndarray((Q, 1), dtype=nl.float32, buffer=nl.shared_hbm)
  idx = nl.ndarray((Q, 1), dtype=nl.uint32, buffer=nl.shared_hbm)

  i_p = nl.arange(PMAX)[:, None]
  i_f = nl.arange(PMAX)[None, :]
  i_dp = nl.arange(D)[:, None]
  i_d = nl.arange(D)[None, :]
  i_n = nl.arange(n_tile)[None, :]
  i_1 = nl.arange(1)[None, :]
  ones_d = nl.ones((D, PMAX), dtype=nl.float32)

  for qt in nl.affine_range(NQ):
    q0 = qt * PMAX
    valid = q0 + i_p < Q
    qT = nl.zeros((D, PMAX), dtype=queries.dtype)
    qT[i_dp, i_f] = nl.load(queries[q0 + i_f, i_dp], mask=(q0 + i_f < Q))
    qm2 = nl.multiply(qT, -2.0, dtype=queries.dtype)   # exact: a power of two
    q = nl.load(queries[q0 + i_p, i_d], mask=valid, dtype=nl.float32)
    qn2 = nl.sum(nl.square(q, mask=valid), axis=[1], keepdims=True, mask=valid)

    run_v = nl.full((PMAX, 1), NEG, dtype=nl.float32)
    run_i = nl.zeros((PMAX, 1), dtype=nl.float32)
    for t in nl.sequential_range(NT):
      n0 = t * n_tile
      xT = nl.zeros((D, n_tile), dtype=database.dtype)
      nisa.dma_copy(dst=xT[i_dp, i_n], src=database[n0 + i_n, i_dp], mask=(n0 + i_n < N))
      xsq = nl.square(xT, dtype=nl.float32)
      d_ps = nl.zeros((PMAX, n_tile), dtype=nl.float32, buffer=nl.psum)
      d_ps += nisa.nc_matmul(qm2, xT)                 # -2 q.x
      d_ps += nisa.nc_matmul(ones_d, xsq)             # + ||x||^2 on every partition
      # -d = -(psum) - ||q||^2
      nd = nisa.tensor_scalar(d_ps, np.multiply, -1.0, op1=np.subtract, operand1=qn2)
      nd = nisa.affine_select(n0 + i_n < N, nd, NEG)
      v8 = nisa.max8(src=nd)
      p8 = nisa.nc_find_index8(data=nd, vals=v8)
      cand_i = nl.add(p8[i_p, 0], n0, dtype=nl.float32)
      better = nl.greater(v8[i_p, 0], run_v)
      run_i[...] = nl.where(better, cand_i, run_i)
      run_v[...] = nl.maximum(run_v, v8[i_p, 0])

    nl.store(dist[q0 + i_p, i_1], value=nl.negative(run_v), mask=valid)
    nl.store(idx[q0 + i_p, i_1], value=nl.copy(run_i, dtype=nl.uint32), mask=valid)
  return dist, idx


@nki.jit
def kmeans_step(points, centroids):
  N, D = points.shape
  C, D_ = centroids.shape
  assert D == D_ and D <= PMAX and 8 <= C <= PMAX
  NP = (N + PMAX - 1) // PMAX
  dt = points.dtype

  new_c = nl.ndarray((C, D), dtype=nl.float32, buffer=nl.shared_hbm)
  counts = nl.ndarray((C, 1), dtype=nl.int32, buffer=nl.shared_hbm)
  assign = nl.ndarray((N, 1), dtype=nl.uint32, buffer=nl.shared_hbm)

  i_p = nl.arange(PMAX)[:, None]
  i_d = nl.arange(D)[None, :]
  i_dp = nl.arange(D)[:, None]
  i_c = nl.arange(C)[None, :]
  i_cp = nl.arange(C)[:, None]
  i_1 = nl.arange(1)[None, :]

  # centroids transposed [D, C]: -2 c and ||c||^2 (on every partition) for d' = ||c||^2 - 2 p.c
  cT = nl.load(centroids[i_c, i_dp], dtype=dt)
  cm2 = nl.multiply(cT, -2.0, dtype=dt)
  csq = nl.square(cT, dtype=nl.float32)
  ones_d = nl.ones((D, PMAX), dtype=nl.float32)
  grid = nl.mgrid[0:PMAX, 0:C]
  cid = nisa.iota(grid.x + 0 * grid.p, dtype=nl.float32)   # cluster ids along the free axis

  acc = nl.zeros((C, D + 1), dtype=nl.float32, buffer=nl.psum)
  for t in nl.affine_range(NP):
    p0 = t * PMAX
    valid = p0 + i_p < N
    # [points | 1], rows past N zero
    p = nl.zeros((PMAX, D + 1), dtype=dt)
    p[i_p, i_d] = nl.load(points[p0 + i_p, i_d], mask=valid)
    p[i_p, D + i_1] = nl.full((PMAX, 1), 1.0, dtype=dt)
    pT = nl.copy(nisa.nc_transpose(p[i_p, i_d]), dtype=dt)   # [D, 128]
    d_ps = nl.zeros((PMAX, C), dtype=nl.float32, buffer=nl.psum)
    d_ps += nisa.nc_matmul(pT, cm2)
    d_ps += nisa.nc_matmul(ones_d, csq)
    nd = nl.negative(d_ps, dtype=nl.float32)
    v8 = nisa.max8(src=nd)
    p8 = nisa.nc_find_index8(data=nd, vals=v8)
    win = nl.copy(p8[i_p, 0], dtype=nl.float32)
    onehot = nl.zeros((PMAX, C), dtype=dt)
    onehot[i_p, i_c] = nl.equal(cid, win, dtype=dt, mask=valid)
    acc += nisa.nc_matmul(onehot, p)                   # [C, D + 1]: sums | counts
    nl.store(assign[p0 + i_p, i_1], value=p8[i_p, 0], mask=valid)

  sums = nl.copy(acc, dtype=nl.float32)
  cnt = sums[i_cp, D + i_1]
  mean = nl.multiply(sums[i_cp, i_d], nl.reciprocal(nl.maximum(cnt, 1.0)))
  old = nl.load(centroids[i_cp, i_d], dtype=nl.float32)
  nl.store(new_c[i_cp, i_d], value=nl.where(nl.greater(cnt, 0.0), mean, old))
  nl.store(counts[i_cp, i_1], value=nl.copy(cnt, dtype=nl.int32))
  return new_c, counts, assign


@nki.jit
def clip_loss_shifted(image_emb, text_emb, logit_scale):
  N, D = image_emb.shape
  assert tuple(text_emb.shape) == (N, D) and D <= PMAX and N <= 512
  NT = (N + PMAX - 1) // PMAX
  dt = image_emb.dtype
  loss = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.shared_hbm)

  i_p = nl.arange(PMAX)[:, None]
  i_d = nl.arange(D)[None, :]
  i_dp = nl.arange(D)[:, None]
  i_n = nl.arange(N)[None, :]
  i_f = nl.arange(PMAX)[None, :]
  i_1 = nl.arange(1)[None, :]

  # s = min(exp(logit_scale), 100) on every partition
  ls = nl.load(logit_scale[0 * i_p + 0 * i_1])
  s = nl.minimum(nl.exp(ls), 100.0)
  neg_s = nl.multiply(s, -1.0)

  # normalised, transposed: img [D, NT * 128] (times s), txt [D, NT * 128]; padding columns zero
  imgT = nl.ndarray((nl.par_dim(D), NT * PMAX), dtype=dt)
  txtT = nl.ndarray((nl.par_dim(D), NT * PMAX), dtype=dt)
  diag = nl.zeros((PMAX, NT), dtype=nl.float32)   # z_ii of row tile r in column r
  for r in nl.affine_range(NT):
    r0 = r * PMAX
    valid = r0 + i_p < N
    xi = nl.zeros((PMAX, D), dtype=dt)
    xi[i_p, i_d] = nl.load(image_emb[r0 + i_p, i_d], mask=valid)
    xt = nl.zeros((PMAX, D), dtype=dt)
    xt[i_p, i_d] = nl.load(text_emb[r0 + i_p, i_d], mask=valid)
    si = nl.ndarray((PMAX, 1), dtype=nl.float32)
    nisa.activation_reduce(op=nl.square, data=xi, reduce_op=nl.add, reduce_res=si)
    st = nl.ndarray((PMAX, 1), dtype=nl.float32)
    nisa.activation_reduce(op=nl.square, data=xt, reduce_op=nl.add, reduce_res=st)
    ri = nl.multiply(nl.rsqrt(nl.maximum(si, 1e-24)), s)
    rt = nl.rsqrt(nl.maximum(st, 1e-24))
    xin = nl.multiply(xi, ri, dtype=dt)
    xtn = nl.multiply(xt, rt, dtype=dt)
    diag[i_p, r + i_1] = nl.sum(nl.multiply(xin, xtn, dtype=nl.float32), axis=[1], keepdims=True)
    imgT[i_dp, r0 + i_f] = nisa.nc_transpose(xin)
    txtT[i_dp, r0 + i_f] = nisa.nc_transpose(xtn)

  acc = nl.zeros((PMAX, 1), dtype=nl.float32)
  ones_col = nl.ones((PMAX, 1), dtype=nl.float32)
  col_ps = nl.zeros((1, N), dtype=nl.float32, buffer=nl.psum)
  for r in nl.affine_range(NT):
    r0 = r * PMAX
    valid = r0 + i_p < N
    z = nisa.nc_matmul(imgT[i_dp, r0 + i_f], txtT[i_dp, i_n])   # [128, N] logits (rows past N: 0)
    rs = nl.ndarray((PMAX, 1), dtype=nl.float32)
    ez = nl.zeros((PMAX, N), dtype=nl.float32)
    ez[i_p, i_n] = nisa.activation(op=nl.exp, data=z, bias=neg_s, reduce_op=nl.add, reduce_res=rs,
                                   reduce_cmd=nisa.reduce_cmd.reset_reduce, mask=valid)
    col_ps += nisa.nc_matmul(ones_col, ez)            # column sums of exp(z - s); rows past N are zero
    # row direction: s + log(rowsum) - z_ii
    lr = nl.add(nl.log(rs, mask=valid), s, mask=valid)
    acc[i_p, i_1] = nl.add(acc, nl.subtract(lr, diag[i_p, r + i_1], mask=valid), mask=valid)

  # column direction: sum_j (s + log(colsum_j)) - sum_j z_jj
  lc = nl.log(col_ps)
  colsum = nl.sum(lc, axis=[1], keepdims=True)
  acc2 = nl.subtract(acc, nl.sum(diag, axis=[1], keepdims=True))
  total_ps = nisa.nc_matmul(acc2, ones_col)             # [1, 1]: the sum over the partitions
  tot = nl.add(nl.add(total_ps, colsum), nl.multiply(s[0:1, 0:1], float(N)))
  nl.store(loss, value=nl.multiply(tot, 0.5 / N))
  return loss
