"""Routing / permutation utilities and position-bias attention in the Beta-1 dialect (``neuronxcc.nki``), written
the way public NKI kernels write them (arange/mgrid index expressions, value-returning ``nl``/``nisa`` calls,
indirect DMA with a tile of row indices as the first index item):

- ``moe_dispatch(expert_ids, hidden, num_experts)``: token dispatch preparation of a top-k MoE layer, on chip.
  Per tile of 128 tokens a one-hot [128, E] of the token's experts (``nisa.iota`` of the expert ids compared with
  each top-k column); the expert histogram is the column sum of all one-hots (a matmul with a ones matrix, so it
  lands on every partition); the exclusive offsets per expert are a ``tensor_tensor_scan`` (running sum) over the
  expert axis minus the histogram; a token's rank within its expert is the exclusive prefix sum of the one-hots
  down the partitions (a matmul with a strictly upper-triangular ones matrix from ``nisa.affine_select``) plus the
  experts' counts of the earlier token tiles. Destination row of assignment (t, k) = offset[e] + rank[t, e] with
  e = expert_ids[t, k]. The hidden rows are then scattered to their sorted positions (``nl.store`` with the
  destination tile as the row index). Outputs: counts [1, E], offsets [1, E], dest [T, K] (int32), sorted
  [T * K, H].
- ``moe_combine(expert_out, dest, weights)``: the un-permute: out[t] = sum_k weights[t, k] * expert_out[dest[t, k]]
  by row gathers (``nl.load`` with a runtime row index tile, one per top-k slot) and per-token scaling.
- ``t5_bias_attention(q, k, v, rel_table, num_buckets, max_distance)``: bidirectional T5 attention with a learned
  relative position bias. The bucket of r = j - i is computed on chip (the log bucketing with ``nl.log``,
  comparisons, ``nl.floor`` and ``nl.where``) for each query tile's [128, S] relative positions (``nisa.iota`` of
  ``i_s - i_p - q0``); each head's
  table column, broadcast to the partitions, is gathered by those ids into the score tile (``nl.gather_flattened``).
  Scores q k^T (no scaling, as T5) + bias, softmax, times v. q, k in the transposed layout [H, d, S], v [H, S, d].
  ``t5_bias_attention_toeplitz``: the same with the bias staged in HBM (bucket rows gathered by an indirect DMA,
  stored transposed) and loaded per (head, query tile) as the Toeplitz window ``rel_bias[h, (S - 1) + j - i]``.
- ``alibi_flash_b1(q, k, v, slopes)``: causal ALiBi flash attention (iota bias, affine_select mask).

Written for nsim's tests in the style of those kernels; not copies of any file. No nsim imports.
"""
import math

import numpy as np

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl

PMAX = 128


@nki.jit
def moe_dispatch(expert_ids, hidden, num_experts):
  T, K = expert_ids.shape
  _, H = hidden.shape
  E = num_experts
  assert E <= 512
  NT = (T + PMAX - 1) // PMAX

  counts = nl.ndarray((1, E), dtype=nl.int32, buffer=nl.shared_hbm)
  offsets = nl.ndarray((1, E), dtype=nl.int32, buffer=nl.shared_hbm)
  dest = nl.ndarray((T, K), dtype=nl.int32, buffer=nl.shared_hbm)
  sorted_hidden = nl.ndarray((T * K, H), dtype=hidden.dtype, buffer=nl.shared_hbm)

  i_p = nl.arange(PMAX)[:, None]
  i_e = nl.arange(E)[None, :]
  i_k = nl.arange(K)[None, :]
  i_h = nl.arange(H)[None, :]
  i_q = nl.arange(PMAX)[None, :]

  # expert ids 0..E-1 along the free axis, on every partition
  grid = nl.mgrid[0:PMAX, 0:E]
  expert_iota = nisa.iota(grid.x + 0 * grid.p, dtype=nl.float32)
  ones = nl.ones((PMAX, PMAX), dtype=nl.float32)
  # strictly upper triangular: triu[s, t] = 1 where t > s (earlier tokens s of the tile)
  triu = nisa.affine_select(i_q - i_p > 0, ones, 0.0)

  onehot = nl.ndarray((NT, nl.par_dim(PMAX), E), dtype=nl.float32, buffer=nl.sbuf)
  hist_ps = nl.zeros((PMAX, E), dtype=nl.float32, buffer=nl.psum)
  for t in nl.affine_range(NT):
    valid = t * PMAX + i_p < T  # the ragged last tile: rows past T stay zero
    ids = nl.load(expert_ids[t * PMAX + i_p, i_k], dtype=nl.float32, mask=valid)
    oh = nl.zeros((PMAX, E), dtype=nl.float32)
    for k in nl.static_range(K):
      oh[...] = nl.add(oh, nl.equal(expert_iota, ids[i_p, k], dtype=nl.float32), mask=valid)
    onehot[t, i_p, i_e] = oh
    # histogram: column sums, broadcast to every partition
    hist_ps += nisa.nc_matmul(ones, oh)

  hist = nl.copy(hist_ps, dtype=nl.float32)
  # inclusive running sum over the experts, exclusive = inclusive - count
  incl = nisa.tensor_tensor_scan(ones[:, 0:E], hist, initial=0.0, op0=np.multiply, op1=np.add)
  excl = nl.subtract(incl, hist)
  nl.store(counts, value=nl.copy(hist[0:1, :], dtype=nl.int32))
  nl.store(offsets, value=nl.copy(excl[0:1, :], dtype=nl.int32))

  carry = nl.zeros((PMAX, E), dtype=nl.float32)
  for t in nl.sequential_range(NT):
    rank_ps = nl.zeros((PMAX, E), dtype=nl.float32, buffer=nl.psum)
    rank_ps += nisa.nc_matmul(triu, onehot[t])
    # the destination of each expert slot of each token of this tile
    slot = nl.add(nl.add(rank_ps, carry), excl)
    valid = t * PMAX + i_p < T
    ids = nl.load(expert_ids[t * PMAX + i_p, i_k], dtype=nl.float32, mask=valid)
    d = nl.ndarray((PMAX, K), dtype=nl.int32)
    for k in nl.static_range(K):
      sel = nl.equal(expert_iota, ids[i_p, k], dtype=nl.float32, mask=valid)
      d[i_p, k] = nl.sum(nl.multiply(sel, slot, mask=valid), axis=[1], keepdims=True, dtype=nl.float32,
                         mask=valid)
    nl.store(dest[t * PMAX + i_p, i_k], value=d, mask=valid)
    carry[...] = nl.add(carry, nisa.nc_matmul(ones, onehot[t]))

    # scatter the tile's hidden rows to their sorted positions
    x = nl.load(hidden[t * PMAX + i_p, i_h], mask=valid)
    for k in nl.static_range(K):
      nl.store(sorted_hidden[d[i_p, k], i_h], value=x, mask=valid)

  return counts, offsets, dest, sorted_hidden


@nki.jit
def moe_combine(expert_out, dest, weights):
  T, K = dest.shape
  _, H = expert_out.shape
  assert T % PMAX == 0
  out = nl.ndarray((T, H), dtype=expert_out.dtype, buffer=nl.shared_hbm)
  i_p = nl.arange(PMAX)[:, None]
  i_k = nl.arange(K)[None, :]
  i_h = nl.arange(H)[None, :]
  for t in nl.affine_range(T // PMAX):
    d = nl.load(dest[t * PMAX + i_p, i_k])
    w = nl.load(weights[t * PMAX + i_p, i_k], dtype=nl.float32)
    acc = nl.zeros((PMAX, H), dtype=nl.float32)
    for k in nl.static_range(K):
      rows = nl.load(expert_out[d[i_p, k], i_h])
      acc[...] = nl.add(acc, nl.multiply(rows, w[i_p, k]))
    nl.store(out[t * PMAX + i_p, i_h], value=acc)
  return out


def _t5_buckets(r, num_buckets, max_distance):
  """Bidirectional T5 bucket of the relative positions r (an fp32 tile), as an int32 tile."""
  nb = num_buckets // 2
  max_exact = nb // 2
  scale = (nb - max_exact) / math.log(max_distance / max_exact)
  ret = nl.multiply(nl.greater(r, 0.0, dtype=nl.float32), float(nb))
  n = nl.abs(r)
  is_small = nl.less(n, float(max_exact), dtype=nl.float32)
  # log(max(n, 1) / max_exact) * scale, floored; the tiny bias keeps exact powers from rounding down
  lg = nl.log(nl.multiply(nl.maximum(n, 1.0), 1.0 / max_exact))
  large = nl.floor(nl.add(nl.multiply(lg, scale), max_exact + 1e-4))
  large = nl.minimum(large, float(nb - 1))
  b = nl.add(ret, nl.where(is_small, n, large))
  return nl.copy(b, dtype=nl.int32)


@nki.jit
def t5_bias_attention(q, k, v, rel_table, num_buckets=32, max_distance=128):
  H, d, S = q.shape
  NB, H_ = rel_table.shape
  assert H == H_ and NB == num_buckets and S % PMAX == 0 and S <= 512
  out = nl.ndarray((H, S, d), dtype=q.dtype, buffer=nl.shared_hbm)

  i_p = nl.arange(PMAX)[:, None]
  i_q = nl.arange(PMAX)[None, :]
  i_d = nl.arange(d)[None, :]
  i_s = nl.arange(S)[None, :]
  i_dp = nl.arange(d)[:, None]
  i_b = nl.arange(NB)[None, :]

  # each head's column of the bias table, on every partition
  tabT = nl.load_transpose2d(rel_table)  # [H, NB]
  tab = nl.ndarray((H, nl.par_dim(PMAX), NB), dtype=nl.float32)
  for h in nl.affine_range(H):
    tab[h, i_p, i_b] = tabT[h:h + 1, :].broadcast_to((PMAX, NB))

  for qt in nl.affine_range(S // PMAX):
    # bucket of r = j - i for the tile's queries i and all keys j (shared by the heads)
    r = nisa.iota(i_s - i_p - qt * PMAX, dtype=nl.float32)
    bucket = nl.copy(_t5_buckets(r, num_buckets, max_distance), dtype=nl.uint32)
    for h in nl.affine_range(H):
      kT = nl.load(k[h, i_dp, i_s])
      qT = nl.load(q[h, i_dp, qt * PMAX + i_q])
      s_ps = nisa.nc_matmul(qT, kT)
      bias = nl.gather_flattened(tab[h], bucket)
      s = nl.add(s_ps, bias, dtype=nl.float32)
      mx = nl.max(s, axis=[1], keepdims=True)
      p = nl.exp(nl.subtract(s, mx))
      ssum = nl.sum(p, axis=[1], keepdims=True)
      p_lo = nl.copy(p, dtype=v.dtype)
      o_ps = nl.zeros((PMAX, d), dtype=nl.float32, buffer=nl.psum)
      for j in nl.affine_range(S // PMAX):
        v_j = nl.load(v[h, j * PMAX + i_p, i_d])
        pT = nisa.nc_transpose(p_lo[i_p, j * PMAX + i_q])
        pT_sb = nl.copy(pT, dtype=v.dtype)
        o_ps += nisa.nc_matmul(pT_sb, v_j)
      o = nl.divide(o_ps, ssum, dtype=q.dtype)
      nl.store(out[h, qt * PMAX + i_p, i_d], value=o)
  return out


@nki.jit
def alibi_flash_b1(q, k, v, slopes):
  """Causal ALiBi attention, flash-style over key blocks of 128 (Beta 1): the bias slope_h * (j - i) from
  ``nisa.iota`` of an index expression of the loop indices, the causal mask from ``nisa.affine_select``, online
  softmax in fp32. q, k [H, d, S], v [H, S, d], slopes [H] fp32."""
  H, d, S = q.shape
  assert S % PMAX == 0
  NT = S // PMAX
  out = nl.ndarray((H, S, d), dtype=q.dtype, buffer=nl.shared_hbm)
  i_p = nl.arange(PMAX)[:, None]
  i_f = nl.arange(PMAX)[None, :]
  i_dp = nl.arange(d)[:, None]
  i_d = nl.arange(d)[None, :]
  scale = 1.0 / math.sqrt(d)
  sl = nl.load(slopes.reshape((1, H)))
  for h in nl.affine_range(H):
    slope_b = sl[0:1, h:h + 1].broadcast_to((PMAX, 1))
    for qi in nl.affine_range(NT):
      qT = nl.load(q[h, i_dp, qi * PMAX + i_f])
      m = nl.full((PMAX, 1), -30000.0, dtype=nl.float32)
      l = nl.zeros((PMAX, 1), dtype=nl.float32)
      acc = nl.zeros((PMAX, d), dtype=nl.float32)
      for ki in nl.sequential_range(qi + 1):
        kT = nl.load(k[h, i_dp, ki * PMAX + i_f])
        v_t = nl.load(v[h, ki * PMAX + i_p, i_d])
        s_ps = nisa.nc_matmul(qT, kT)
        rel = nisa.iota(ki * PMAX - qi * PMAX + i_f - i_p, dtype=nl.float32)
        s = nl.add(nl.multiply(s_ps, scale), nl.multiply(rel, slope_b))
        s = nisa.affine_select(qi * PMAX + i_p - ki * PMAX - i_f >= 0, s, -30000.0)
        mx = nl.maximum(m, nl.max(s, axis=[1], keepdims=True))
        alpha = nl.exp(nl.subtract(m, mx))
        p = nl.exp(nl.subtract(s, mx))
        l[...] = nl.add(nl.multiply(l, alpha), nl.sum(p, axis=[1], keepdims=True))
        pT = nisa.nc_transpose(nl.copy(p, dtype=v.dtype))
        pv = nisa.nc_matmul(nl.copy(pT, dtype=v.dtype), v_t)
        acc[...] = nl.add(nl.multiply(acc, alpha), pv)
        m[...] = mx
      nl.store(out[h, qi * PMAX + i_p, i_d], value=nl.divide(acc, l))
  return out


@nki.jit
def t5_bias_attention_toeplitz(q, k, v, rel_table, num_buckets=32, max_distance=128):
  """t5_bias_attention with the bias staged in HBM: the bucket of every relative position r = j - i in
  [-(S - 1), S - 1] (relative positions on the partitions, from ``nisa.iota``) gathers its row of the table by
  an indirect DMA, stored transposed (``rel_bias[i_h, c * 128 + i_p]``) into a head-major HBM scratch
  rel_bias [H, 2S - 1]; each (head, query tile) then loads its [128, S] bias as the Toeplitz window
  ``rel_bias[h, (S - 1) + j - i]`` (an index expression with a negative partition coefficient; rows contiguous)."""
  H, d, S = q.shape
  NB, H_ = rel_table.shape
  assert H == H_ and NB == num_buckets and S % PMAX == 0 and S <= 512
  R = 2 * S - 1
  out = nl.ndarray((H, S, d), dtype=q.dtype, buffer=nl.shared_hbm)
  rel_bias = nl.ndarray((H, R), dtype=nl.float32, buffer=nl.hbm)

  i_p = nl.arange(PMAX)[:, None]
  i_q = nl.arange(PMAX)[None, :]
  i_h = nl.arange(H)[None, :]
  i_d = nl.arange(d)[None, :]
  i_s = nl.arange(S)[None, :]
  i_dp = nl.arange(d)[:, None]

  for c in nl.affine_range((R + PMAX - 1) // PMAX):
    r = nisa.iota(c * PMAX - (S - 1) + i_p, dtype=nl.float32)
    bucket = _t5_buckets(r, num_buckets, max_distance)
    rows = nl.load(rel_table[bucket[i_p, 0], i_h], mask=(c * PMAX + i_p < R))
    nl.store(rel_bias[i_h, c * PMAX + i_p], value=rows, mask=(c * PMAX + i_p < R))

  for qt in nl.affine_range(S // PMAX):
    for h in nl.affine_range(H):
      kT = nl.load(k[h, i_dp, i_s])
      qT = nl.load(q[h, i_dp, qt * PMAX + i_q])
      s_ps = nisa.nc_matmul(qT, kT)
      bias = nl.load(rel_bias[h, (S - 1) - qt * PMAX - i_p + i_s])
      s = nl.add(s_ps, bias, dtype=nl.float32)
      mx = nl.max(s, axis=[1], keepdims=True)
      p = nl.exp(nl.subtract(s, mx))
      ssum = nl.sum(p, axis=[1], keepdims=True)
      p_lo = nl.copy(p, dtype=v.dtype)
      o_ps = nl.zeros((PMAX, d), dtype=nl.float32, buffer=nl.psum)
      for j in nl.affine_range(S // PMAX):
        v_j = nl.load(v[h, j * PMAX + i_p, i_d])
        pT = nisa.nc_transpose(p_lo[i_p, j * PMAX + i_q])
        pT_sb = nl.copy(pT, dtype=v.dtype)
        o_ps += nisa.nc_matmul(pT_sb, v_j)
      o = nl.divide(o_ps, ssum, dtype=q.dtype)
      nl.store(out[h, qt * PMAX + i_p, i_d], value=o)
  return out
