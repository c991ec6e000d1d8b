"""Sparse, graph and segment kernels in the Beta-1 dialect (``import neuronxcc.nki as nki``, value-returning
``nl.load`` / ``nl.store``, ``nl.arange`` index expressions and masks, runtime row indices as the first item of an
HBM subscript, 2-space indentation as in the NKI samples), the way public NKI ports of sparse and GNN layers write
them:

- ``spmm_ell_kernel(col_idx, values, b, tile_d)``: out = A @ B with A [M, N] in padded-CSR / ELL form (``col_idx``
  and ``values`` [M, K]: the K stored entries of each row, short rows padded with column 0 and value 0). Per row
  tile of 128 (ragged last tile masked) the index and value tiles are loaded once; for each stored slot k the rows
  of B are gathered by ``nl.load(b[idx[i_p, k], i_f])`` and multiply-added into an fp32 SBUF accumulator with the
  value column as a (P, 1) scalar (``nisa.scalar_tensor_tensor``); D in chunks of ``tile_d``.
- ``sage_mean_kernel(x, src, dst, w_self, w_neigh)``: a GraphSAGE layer with mean aggregation over an edge list
  (src -> dst, repeated destinations and repeated edges allowed). Per edge tile the source rows are gathered, a
  ones column appended (so the same scatter counts the in-degree), and the tile scatter-added into the
  destinations' rows of an fp32 HBM accumulator [N, F + 1] with ``nl.atomic_rmw`` (duplicate destinations all
  add). Per node tile: the sums divided by max(degree, 1), then ``x @ w_self + mean @ w_neigh`` on the PE
  (``nisa.nc_transpose`` of both [128, F] tiles, two ``nc_matmul`` per 128-row chunk of F accumulated in PSUM).
  Returns the layer output and the mean aggregation (saved for the backward pass).
- ``gcn_onehot_kernel(x, src, dst, w, tile_ranges)``: mean aggregation + linear layer the sort-then-segment-sum
  way: the edges sorted by destination on the host; per node tile a one-hot membership matrix [edges, nodes] of
  every edge tile it touches (``nisa.iota`` of the tile's node ids compared with the destination ids) is the
  stationary operand of a matmul with the gathered source rows (plus the ones column: the degree), accumulated in
  PSUM. ``tile_ranges[nt]`` (host-side, from the sorted destinations) lists the edge tiles of node tile nt;
  ``None`` visits every edge tile.
- ``segment_max_kernel(data, seg, num_segments, chunk)``: out[s] = max of the rows of data [N, D] whose sorted
  segment id is s (empty segments 0, as torch_scatter fills them). Segments on the partitions (128 per tile); per
  chunk of rows the chunk is broadcast to every partition (a stride-0 DMA), the membership seg[n] == s made by an
  iota compare, non-members replaced by ``nl.fp32.min`` with ``nl.where`` (the [P, rows] membership broadcast to
  [P, rows, D] with ``.broadcast_to``), and ``nl.max`` over the chunk's rows; chunks combined with ``nl.maximum``,
  a ragged last chunk masked (``mask=`` on the load, the compare, the where and both reductions).
- ``block_topk_attention_kernel(q, k, v, block_idx)``: each block of 128 queries attends to ``n_sel`` key blocks
  of 128 chosen at run time (``block_idx`` [n_qblocks, n_sel] int32, e.g. by a top-k of block scores): the
  block's row ids (block id x 128 + iota) computed on chip, K and V blocks gathered by indirect ``nl.load``, K
  transposed on the PE, and an online softmax over the selected blocks (flash-attention style, scale 1/sqrt(d)).

Written for nsim's tests; not copies of any file. No nsim imports.
"""
import math

import numpy as np

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl
from neuronxcc.nki.language import par_dim

PMAX = 128


# ------------------------------------------------------------------------------------------------
# SpMM, padded CSR / ELL
# ------------------------------------------------------------------------------------------------

@nki.jit
def spmm_ell_kernel(col_idx, values, b, tile_d=512):
  """col_idx [M, K] int32, values [M, K], b [N, D] -> out [M, D] (b's dtype), out[m] = sum_k values[m, k] *
  b[col_idx[m, k]] accumulated in fp32 in k order."""
  M, K = col_idx.shape
  N, D = b.shape
  tile_d = min(tile_d, D)
  out = nl.ndarray((M, D), dtype=b.dtype, buffer=nl.shared_hbm)

  i_p = nl.arange(PMAX)[:, None]
  i_k = nl.arange(K)[None, :]
  i_f = nl.arange(tile_d)[None, :]

  for m in nl.affine_range(math.ceil(M / PMAX)):
    r_mask = (m * PMAX + i_p < M)
    idx = nl.load(col_idx[m * PMAX + i_p, i_k], mask=r_mask)
    val = nl.load(values[m * PMAX + i_p, i_k], mask=r_mask, dtype=nl.float32)
    for d in nl.affine_range(math.ceil(D / tile_d)):
      mask = r_mask & (d * tile_d + i_f < D)
      acc = nl.zeros((par_dim(PMAX), tile_d), dtype=nl.float32, buffer=nl.sbuf)
      for k in nl.sequential_range(K):
        rows = nl.load(b[idx[i_p, k], d * tile_d + i_f], mask=mask)
        acc[i_p, i_f] = nisa.scalar_tensor_tensor(data=rows, op0=np.multiply, operand0=val[i_p, k],
                                                  op1=np.add, operand1=acc, mask=mask)
      nl.store(out[m * PMAX + i_p, d * tile_d + i_f], value=acc, mask=mask)
  return out


# ------------------------------------------------------------------------------------------------
# GNN message passing
# ------------------------------------------------------------------------------------------------

def _linear_pe(res, lhs, w, F, Fo):
  """res [128, Fo] (PSUM) += lhs[128, F] @ w[F, Fo]: per 128-row chunk of F the lhs chunk transposed on the PE
  ([128, kf] -> [kf, 128]) is the stationary operand, the weight rows the moving one."""
  i_p = nl.arange(PMAX)[:, None]
  i_o = nl.arange(Fo)[None, :]
  for kc in nl.affine_range(math.ceil(F / PMAX)):
    kf = min(PMAX, F - kc * PMAX)
    i_kp = nl.arange(kf)[:, None]
    i_kf = nl.arange(kf)[None, :]
    lhsT = nl.copy(nisa.nc_transpose(lhs[i_p, kc * PMAX + i_kf]))
    wt = nl.load(w[kc * PMAX + i_kp, i_o], dtype=nl.float32)
    res[i_p, i_o] += nisa.nc_matmul(lhsT, wt)


@nki.jit
def sage_mean_kernel(x, src, dst, w_self, w_neigh):
  """x [N, F]; src, dst [E] int32 (edge e carries x[src[e]] to node dst[e]); w_self, w_neigh [F, Fo].
  Returns out [N, Fo] = x @ w_self + mean_{e: dst[e] = n} x[src[e]] @ w_neigh (x's dtype) and the mean
  aggregation [N, F] fp32 (0 for a node without in-edges)."""
  N, F = x.shape
  E, = src.shape
  _, Fo = w_self.shape
  out = nl.ndarray((N, Fo), dtype=x.dtype, buffer=nl.shared_hbm)
  h_neigh = nl.ndarray((N, F), dtype=nl.float32, buffer=nl.shared_hbm)
  agg = nl.ndarray((N, F + 1), dtype=nl.float32, buffer=nl.hbm)  # neighbour sums | in-degree

  i_p = nl.arange(PMAX)[:, None]
  i_f = nl.arange(F)[None, :]
  i_g = nl.arange(F + 1)[None, :]
  i_o = nl.arange(Fo)[None, :]
  i_1 = nl.arange(1)[None, :]

  zeros = nl.zeros((par_dim(PMAX), F + 1), dtype=nl.float32)
  for n in nl.affine_range(math.ceil(N / PMAX)):
    nl.store(agg[n * PMAX + i_p, i_g], value=zeros, mask=(n * PMAX + i_p < N))

  # messages: gather the source rows, scatter-add them (and a 1 each) into the destination rows
  for e in nl.affine_range(math.ceil(E / PMAX)):
    e_mask = (e * PMAX + i_p < E)
    s_idx = nl.load(src[e * PMAX + i_p], mask=e_mask)
    d_idx = nl.load(dst[e * PMAX + i_p], mask=e_mask)
    msg = nl.ndarray((par_dim(PMAX), F + 1), dtype=nl.float32, buffer=nl.sbuf)
    msg[i_p, i_f] = nl.load(x[s_idx[i_p, 0], i_f], mask=e_mask, dtype=nl.float32)
    msg[i_p, F + i_1] = nl.full((par_dim(PMAX), 1), 1.0, dtype=nl.float32)
    nl.atomic_rmw(agg[d_idx[i_p, 0], i_g], value=msg, op=np.add, mask=e_mask)

  # per node tile: mean, then x @ w_self + mean @ w_neigh
  for n in nl.affine_range(math.ceil(N / PMAX)):
    n_mask = (n * PMAX + i_p < N)
    a = nl.load(agg[n * PMAX + i_p, i_g], mask=n_mask)
    deg = nl.maximum(a[i_p, F + i_1], 1.0, mask=n_mask)
    # rows past N stay 0: the transposes below move whole tiles
    mean = nl.zeros((par_dim(PMAX), F), dtype=nl.float32, buffer=nl.sbuf)
    mean[i_p, i_f] = nl.divide(a[i_p, i_f], deg, mask=n_mask)
    nl.store(h_neigh[n * PMAX + i_p, i_f], value=mean, mask=n_mask)
    xt = nl.zeros((par_dim(PMAX), F), dtype=nl.float32, buffer=nl.sbuf)
    xt[i_p, i_f] = nl.load(x[n * PMAX + i_p, i_f], mask=n_mask, dtype=nl.float32)
    res = nl.zeros((par_dim(PMAX), Fo), dtype=nl.float32, buffer=nl.psum)
    _linear_pe(res, xt, w_self, F, Fo)
    _linear_pe(res, mean, w_neigh, F, Fo)
    nl.store(out[n * PMAX + i_p, i_o], value=res, mask=n_mask)
  return out, h_neigh


@nki.jit
def gcn_onehot_kernel(x, src, dst, w, tile_ranges=None):
  """x [N, F]; src, dst [E] int32 with dst sorted ascending; w [F, Fo]. Returns out [N, Fo] = mean aggregation @
  w (x's dtype) and the in-degree [N, 1] fp32. ``tile_ranges[nt] = (first, stop)``: the edge tiles whose
  destinations fall in node tile nt (host-side, from the sorted dst); None: every edge tile."""
  N, F = x.shape
  E, = src.shape
  _, Fo = w.shape
  assert F + 1 <= 512
  n_et = math.ceil(E / PMAX)
  out = nl.ndarray((N, Fo), dtype=x.dtype, buffer=nl.shared_hbm)
  degree = nl.ndarray((N, 1), dtype=nl.float32, buffer=nl.shared_hbm)

  i_p = nl.arange(PMAX)[:, None]
  i_q = nl.arange(PMAX)[None, :]
  i_f = nl.arange(F)[None, :]
  i_g = nl.arange(F + 1)[None, :]
  i_o = nl.arange(Fo)[None, :]
  i_1 = nl.arange(1)[None, :]

  # node ids 0..127 along the free dim, the same on every partition
  node_ids = nisa.iota(i_q + 0 * i_p, dtype=nl.float32)

  for nt in nl.affine_range(math.ceil(N / PMAX)):
    n_mask = (nt * PMAX + i_p < N)
    first, stop = (0, n_et) if tile_ranges is None else tile_ranges[nt]
    acc = nl.zeros((par_dim(PMAX), F + 1), dtype=nl.float32, buffer=nl.psum)
    for e in nl.affine_range(stop - first):
      e0 = (first + e) * PMAX
      e_mask = (e0 + i_p < E)
      s_idx = nl.load(src[e0 + i_p], mask=e_mask)
      # destination relative to this node tile; a padding edge row (beyond E) keeps -1: a member of no node
      d_loc = nl.full((par_dim(PMAX), 1), -1.0, dtype=nl.float32, buffer=nl.sbuf)
      d_loc[i_p, i_1] = nl.load(dst[e0 + i_p], mask=e_mask, dtype=nl.float32)
      d_loc[i_p, i_1] = nl.add(d_loc, -nt * PMAX, mask=e_mask)
      member = nl.equal(node_ids, d_loc, dtype=nl.float32)       # [edges, nodes]
      msg = nl.zeros((par_dim(PMAX), F + 1), dtype=nl.float32, buffer=nl.sbuf)
      msg[i_p, i_f] = nl.load(x[s_idx[i_p, 0], i_f], mask=e_mask, dtype=nl.float32)
      msg[i_p, F + i_1] = nl.full((par_dim(PMAX), 1), 1.0, dtype=nl.float32)
      acc[i_p, i_g] += nisa.nc_matmul(member, msg)             # [nodes, F + 1]

    a = nl.copy(acc)
    nl.store(degree[nt * PMAX + i_p, i_1], value=a[i_p, F + i_1], mask=n_mask)
    deg = nl.maximum(a[i_p, F + i_1], 1.0)
    mean = nl.divide(a[i_p, i_f], deg)
    res = nl.zeros((par_dim(PMAX), Fo), dtype=nl.float32, buffer=nl.psum)
    _linear_pe(res, mean, w, F, Fo)
    nl.store(out[nt * PMAX + i_p, i_o], value=res, mask=n_mask)
  return out, degree


# ------------------------------------------------------------------------------------------------
# Segment max
# ------------------------------------------------------------------------------------------------

@nki.jit
def segment_max_kernel(data, seg, num_segments, chunk=None):
  """data [N, D], seg [N] int32 sorted ascending in [0, num_segments) -> out [num_segments, D] (data's dtype):
  out[s] = max of data[n] over seg[n] == s, 0 for an empty segment. ``chunk`` rows at a time (default: 32 KiB of
  fp32 per partition for the broadcast rows)."""
  N, D = data.shape
  S = num_segments
  chunk = min(chunk or max(1, 8192 // D), N)
  out = nl.ndarray((S, D), dtype=data.dtype, buffer=nl.shared_hbm)

  i_p = nl.arange(PMAX)[:, None]
  i_d = nl.arange(D)[None, :]
  i_c = nl.arange(chunk)[None, :]
  i_s, i_n, i_e = nl.mgrid[0:PMAX, 0:chunk, 0:D]

  for st in nl.affine_range(math.ceil(S / PMAX)):
    s_mask = (st * PMAX + i_p < S)
    # the segment id of each partition, repeated along the chunk
    sid = nisa.iota(st * PMAX + i_p + 0 * i_c, dtype=nl.float32)
    best = nl.full((par_dim(PMAX), D), nl.fp32.min, dtype=nl.float32, buffer=nl.sbuf)
    count = nl.zeros((par_dim(PMAX), 1), dtype=nl.float32, buffer=nl.sbuf)
    for c in nl.sequential_range(math.ceil(N / chunk)):
      n0 = c * chunk
      # rows n0 .. n0 + chunk of data and their segment ids on every partition (stride-0 partition DMAs); a
      # ragged last chunk: every op masked to its rows
      rows3 = (n0 + i_n < N)
      rows2 = (n0 + i_c < N)
      xb = nl.load(data[0 * i_s + n0 + i_n, i_e], mask=rows3, dtype=nl.float32)
      sb = nl.load(seg[0 * i_p + n0 + i_c], mask=rows2, dtype=nl.float32)
      member = nl.equal(sb, sid, dtype=nl.float32, mask=rows2)                          # [segments, rows]
      masked = nl.where(member.broadcast_to((PMAX, chunk, D)), xb, nl.fp32.min, mask=rows3)  # [segments, rows, D]
      best[i_p, i_d] = nl.maximum(best, nl.max(masked, axis=[1], mask=rows3))
      count[i_p, 0] = nl.add(count, nl.sum(member, axis=[1], mask=rows2))
    res = nl.where(nl.greater(count, 0.0).broadcast_to((PMAX, D)), best, 0.0)
    nl.store(out[st * PMAX + i_p, i_d], value=res, mask=s_mask)
  return out


# ------------------------------------------------------------------------------------------------
# Top-k block-sparse attention
# ------------------------------------------------------------------------------------------------

@nki.jit
def block_topk_attention_kernel(q, k, v, block_idx):
  """q [Sq, d], k and v [Sk, d] (Sq, Sk multiples of 128, d <= 128); block_idx [Sq / 128, n_sel] int32: the key
  blocks (of 128 keys) each query block attends to (a block listed twice counts twice). Returns
  out [Sq, d] (q's dtype) = softmax(q kT / sqrt(d)) v over the selected keys."""
  Sq, d = q.shape
  Sk, _ = k.shape
  n_qb, n_sel = block_idx.shape
  assert Sq == n_qb * PMAX and Sk % PMAX == 0 and d <= PMAX
  scale = 1.0 / math.sqrt(d)
  out = nl.ndarray((Sq, d), dtype=q.dtype, buffer=nl.shared_hbm)

  i_p = nl.arange(PMAX)[:, None]
  i_q = nl.arange(PMAX)[None, :]
  i_d = nl.arange(d)[None, :]
  i_s = nl.arange(n_sel)[None, :]
  i_1 = nl.arange(1)[None, :]

  row_in_block = nisa.iota(i_p + 0 * i_s, dtype=nl.int32)          # [128, n_sel]: p

  for qb in nl.affine_range(n_qb):
    qT = nl.load_transpose2d(q[qb * PMAX + i_p, i_d], dtype=nl.float32)     # [d, 128 queries]
    # the key rows of every selected block: block id x 128 + p, one column per selected block
    bid = nl.load(block_idx[qb + 0 * i_p, i_s])                              # [128, n_sel] (row broadcast)
    rid = nl.add(nl.multiply(bid, PMAX, dtype=nl.int32), row_in_block, dtype=nl.int32)

    m_run = nl.full((par_dim(PMAX), 1), nl.fp32.min, dtype=nl.float32, buffer=nl.sbuf)
    l_run = nl.zeros((par_dim(PMAX), 1), dtype=nl.float32, buffer=nl.sbuf)
    o_acc = nl.zeros((par_dim(PMAX), d), dtype=nl.float32, buffer=nl.sbuf)
    for j in nl.sequential_range(n_sel):
      kb = nl.load(k[rid[i_p, j], i_d], dtype=nl.float32)                   # [128 keys, d] gathered
      vb = nl.load(v[rid[i_p, j], i_d], dtype=nl.float32)
      kT = nl.copy(nisa.nc_transpose(kb))                                    # [d, 128 keys]
      s = nl.multiply(nisa.nc_matmul(qT, kT), scale)                         # [128 queries, 128 keys]
      m_new = nl.maximum(m_run, nl.max(s, axis=[1], keepdims=True))
      p = nl.exp(nl.subtract(s, m_new))
      alpha = nl.exp(nl.subtract(m_run, m_new))
      l_run[i_p, i_1] = nl.add(nl.multiply(l_run, alpha), nl.sum(p, axis=[1], keepdims=True))
      pT = nl.copy(nisa.nc_transpose(p))                                     # [128 keys, 128 queries]
      pv = nisa.nc_matmul(pT, vb)                                            # [128 queries, d]
      o_acc[i_p, i_d] = nl.add(nl.multiply(o_acc, alpha), pv)
      m_run[i_p, i_1] = nl.copy(m_new)
    res = nl.divide(o_acc, l_run)
    nl.store(out[qb * PMAX + i_p, i_d], value=res)
  return out
