"""Speculative-decoding kernels in the Beta-1 dialect (``neuronxcc.nki``), written the way public NKI ports of
vLLM / NxD-Inference speculative sampling write them (arange index expressions, value-returning ``nl`` / ``nisa``
calls, indirect DMA with a tile of row indices as the first index item):

- ``rejection_sample(draft_probs, target_probs, draft_ids, uniforms)``: the standard speculative-sampling rule.
  Draft probabilities q [K, V], target probabilities p [K + 1, V], the draft token ids t [K] (int32) and uniforms
  u [K]. Token i is accepted while u_i < min(1, p_i[t_i] / q_i[t_i]); the output is the number n of accepted
  tokens ([1, 1] int32) and the residual distribution norm(max(0, p_n - q_n)) at the first rejected position,
  or p_K if all were accepted ([1, V] fp32). The token columns are gathered per V tile by a one-hot of the ids
  (``nisa.iota`` of the column index compared with the id, times the row, summed) or, with
  ``gather="range_select"``, by ``nisa.range_select`` of the column range [t_i, t_i + 1) max-reduced into a
  column per V tile (the tiles' maxima combined by ``nl.max``); the "all accepted so far"
  prefix is a ``tensor_tensor_scan`` (running product) over the K decisions transposed onto one partition; the
  row selector (exclusive minus inclusive prefix) picks row n of max(0, p - q) by a [K + 1, 1] x [K + 1, 512]
  matmul per V tile, and the row is normalised by its sum.
- ``kv_compact_b1(k_cache, v_cache, k_scratch, v_scratch, accepted, cache_len)``: the accepted draft tokens' K/V
  rows (scratch rows given at run time by the int32 ``accepted`` [A]) copied to cache rows cache_len + i
  (``cache_len`` an int32 [1, 1] tensor): ``nl.load`` with the tile of scratch rows as the row index and
  ``nl.store`` with the tile of destination rows (``nisa.iota`` of the partition index plus the broadcast cache
  length). Caches [S_max, Hkv * d], updated in place and returned.
- ``verify_attention_b1(q, k_cache, v_cache, k_draft, v_draft, cache_len, tree_mask=None)``: multi-token
  verification attention over a cache whose length is read at run time (masked by an iota compare), draft block
  causal (``nisa.affine_select``) or by a tree mask; natural layouts, per query head K rows on the partitions.
- ``medusa_heads_b1(x, w1, w_vocab, k)``: Medusa heads h = x + silu(x @ w1[i]), logits = h @ w_vocab, top-k ids
  per head by ``nisa.max8`` / ``nisa.nc_find_index8`` / ``nisa.nc_match_replace8``; tokens in tiles of 128, the
  ragged last tile handled by ``mask=`` on every load, matmul, top-k instruction and store.

Written for nsim's tests in the style of those kernels; not copies of any file. No nsim imports.
"""
import numpy as np

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl

VT = 512  # vocabulary tile: one PSUM bank of fp32


@nki.jit
def rejection_sample(draft_probs, target_probs, draft_ids, uniforms, gather="onehot"):
  K, V = draft_probs.shape
  K1, V_ = target_probs.shape
  assert K1 == K + 1 and V == V_ and K1 <= 128 and V % VT == 0
  NV = V // VT

  num_accepted = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.shared_hbm)
  residual = nl.ndarray((1, V), dtype=nl.float32, buffer=nl.shared_hbm)

  i_p = nl.arange(K)[:, None]
  i_p1 = nl.arange(K1)[:, None]
  i_v = nl.arange(VT)[None, :]
  i_0 = nl.arange(1)[None, :]

  ids = nl.load(draft_ids.reshape((K, 1))[i_p, i_0], dtype=nl.float32)
  u = nl.load(uniforms.reshape((K, 1))[i_p, i_0])
  cols = nisa.iota(i_v + 0 * i_p, dtype=nl.float32)  # column index within a V tile, on every row

  # p_i[t_i] and q_i[t_i]: one-hot of the id column in each V tile, or range_select of the column range
  # [t_i, t_i + 1) with a max-reduction (FP32_MIN elsewhere) per tile, the tiles' maxima combined at the end
  p_t = nl.zeros((K, 1), dtype=nl.float32)
  q_t = nl.zeros((K, 1), dtype=nl.float32)
  p_cols = nl.ndarray((K, NV), dtype=nl.float32)
  q_cols = nl.ndarray((K, NV), dtype=nl.float32)
  for j in nl.sequential_range(NV):
    lo = nl.subtract(ids, float(j * VT))
    pj = nl.load(target_probs[i_p, j * VT + i_v])
    qj = nl.load(draft_probs[i_p, j * VT + i_v])
    if gather == "onehot":
      onehot = nl.equal(cols, lo, dtype=nl.float32)
      p_t[...] = nl.add(p_t, nl.sum(nl.multiply(onehot, pj), axis=[1], keepdims=True))
      q_t[...] = nl.add(q_t, nl.sum(nl.multiply(onehot, qj), axis=[1], keepdims=True))
    else:
      hi = nl.add(lo, 1.0)
      nisa.range_select(on_true_tile=pj, comp_op0=np.greater_equal, comp_op1=np.less, bound0=lo, bound1=hi,
                        reduce_cmd=nisa.reduce_cmd.reset_reduce, reduce_res=p_cols[i_p, j], reduce_op=np.max)
      nisa.range_select(on_true_tile=qj, comp_op0=np.greater_equal, comp_op1=np.less, bound0=lo, bound1=hi,
                        reduce_cmd=nisa.reduce_cmd.reset_reduce, reduce_res=q_cols[i_p, j], reduce_op=np.max)
  if gather != "onehot":
    p_t[...] = nl.max(p_cols, axis=[1], keepdims=True)
    q_t[...] = nl.max(q_cols, axis=[1], keepdims=True)

  ratio = nl.minimum(nl.divide(p_t, q_t), 1.0)
  accept = nl.less(u, ratio, dtype=nl.float32)  # [K, 1] 0/1

  # all accepted so far: running product along the drafts (on one partition)
  acc_row = nl.copy(nisa.nc_transpose(accept), dtype=nl.float32)  # [1, K]
  alive = nisa.tensor_tensor_scan(acc_row, nl.zeros((1, K), dtype=nl.float32), initial=1.0, op0=np.multiply,
                                  op1=np.add)
  n = nl.sum(alive, axis=[1], keepdims=True)
  nl.store(num_accepted, value=nl.copy(n, dtype=nl.int32))

  # selector of row n among the K + 1: exclusive prefix minus inclusive prefix
  excl = nl.full((1, K1), 1.0, dtype=nl.float32)
  excl[0:1, 1:K1] = alive
  incl = nl.zeros((1, K1), dtype=nl.float32)
  incl[0:1, 0:K] = alive
  sel = nl.copy(nisa.nc_transpose(nl.subtract(excl, incl)), dtype=nl.float32)  # [K + 1, 1]

  res = nl.ndarray((1, V), dtype=nl.float32)
  total = nl.zeros((1, 1), dtype=nl.float32)
  for j in nl.sequential_range(NV):
    pj = nl.load(target_probs[i_p1, j * VT + i_v])
    qj = nl.zeros((K1, VT), dtype=nl.float32)  # the bonus row K has no draft: q = 0
    qj[i_p, i_v] = nl.load(draft_probs[i_p, j * VT + i_v])
    diff = nl.maximum(nl.subtract(pj, qj), 0.0)
    r_ps = nisa.nc_matmul(sel, diff)  # [1, VT]: row n of diff
    res[0, j * VT + i_v] = r_ps
    total[...] = nl.add(total, nl.sum(r_ps, axis=[1], keepdims=True))
  inv = nl.reciprocal(total)
  for j in nl.affine_range(NV):
    nl.store(residual[0, j * VT + i_v], value=nl.multiply(res[0, j * VT + i_v], inv))
  return num_accepted, residual


@nki.jit
def kv_compact_b1(k_cache, v_cache, k_scratch, v_scratch, accepted, cache_len):
  S_max, R = k_cache.shape
  K, R_ = k_scratch.shape
  A = accepted.shape[0]
  assert R == R_ and A <= K <= 128
  i_p = nl.arange(A)[:, None]
  i_r = nl.arange(R)[None, :]
  i_0 = nl.arange(1)[None, :]

  src = nl.load(accepted.reshape((A, 1))[i_p, i_0])
  base = nl.load(cache_len)  # [1, 1]
  lane = nisa.iota(i_p + 0 * i_0, dtype=nl.int32)
  dst = nl.add(lane, base.broadcast_to((A, 1)), dtype=nl.int32)

  kr = nl.load(k_scratch[src[i_p, 0], i_r])
  nl.store(k_cache[dst[i_p, 0], i_r], value=kr)
  vr = nl.load(v_scratch[src[i_p, 0], i_r])
  nl.store(v_cache[dst[i_p, 0], i_r], value=vr)
  return k_cache, v_cache


@nki.jit
def verify_attention_b1(q, k_cache, v_cache, k_draft, v_draft, cache_len, tree_mask=None):
  """Verification attention in Beta 1, natural layouts: q [Hq, K, d], k_cache / v_cache [Hkv, S_max, d] of which
  the first ``cache_len`` (an int32 [1, 1] tensor, read at run time) rows are valid, k_draft / v_draft
  [Hkv, K, d]. Per query head K rows on the partitions; q^T by ``nl.load_transpose2d``, each key block transposed
  on chip by ``nisa.nc_transpose`` once per KV head and reused by its G query heads. The draft block comes first
  (its diagonal is always visible, so the running max is finite from the start), then every cache block with
  the keys at or beyond cache_len masked (``nisa.iota`` of the key position compared with the runtime length,
  ``nl.where``). Causal within the draft by ``nisa.affine_select``, or the [K, K] 0/1 ``tree_mask``."""
  Hq, K, d = q.shape
  Hkv, S, _ = k_cache.shape
  G = Hq // Hkv
  assert K <= 128 and d <= 128 and S % 128 == 0
  NB = S // 128
  scale = 1.0 / np.sqrt(d)
  out = nl.ndarray((Hq, K, d), dtype=q.dtype, buffer=nl.shared_hbm)

  i_k = nl.arange(K)[:, None]
  i_kf = nl.arange(K)[None, :]
  i_b = nl.arange(128)[:, None]
  i_f = nl.arange(128)[None, :]
  i_d = nl.arange(d)[None, :]
  i_dp = nl.arange(d)[:, None]

  length = nl.load(cache_len, dtype=nl.float32).broadcast_to((K, 1))
  if tree_mask is not None:
    keep = nl.load(tree_mask)

  for h in nl.affine_range(Hkv):
    kdT = nisa.nc_transpose(nl.load(k_draft[h, i_k, i_d]))
    kdT_sb = nl.copy(kdT, dtype=k_draft.dtype)
    vd = nl.load(v_draft[h, i_k, i_d])
    kT = nl.ndarray((NB, nl.par_dim(d), 128), dtype=k_cache.dtype)
    vb = nl.ndarray((NB, nl.par_dim(128), d), dtype=v_cache.dtype)
    for b in nl.affine_range(NB):
      kT[b, i_dp, i_f] = nisa.nc_transpose(nl.load(k_cache[h, b * 128 + i_b, i_d]))
      vb[b, i_b, i_d] = nl.load(v_cache[h, b * 128 + i_b, i_d])

    for g in nl.affine_range(G):
      qT = nl.load_transpose2d(q[h * G + g])  # [d, K]
      s = nl.multiply(nisa.nc_matmul(qT, kdT_sb), scale)
      if tree_mask is None:
        s = nisa.affine_select(i_k - i_kf >= 0, s, -30000.0)
      else:
        s = nl.where(keep, s, -30000.0)
      m = nl.max(s, axis=[1], keepdims=True)
      p = nl.exp(nl.subtract(s, m))
      l = nl.sum(p, axis=[1], keepdims=True)
      acc = nl.ndarray((K, d), dtype=nl.float32)
      acc[...] = nisa.nc_matmul(nl.copy(nisa.nc_transpose(nl.copy(p, dtype=v_draft.dtype)), dtype=v_draft.dtype), vd)

      for b in nl.sequential_range(NB):
        s = nl.multiply(nisa.nc_matmul(qT, kT[b]), scale)
        pos = nisa.iota(b * 128 + i_f + 0 * i_k, dtype=nl.float32)
        s = nl.where(nl.less(pos, length), s, -30000.0)
        m_new = nl.maximum(m, nl.max(s, axis=[1], keepdims=True))
        alpha = nl.exp(nl.subtract(m, m_new))
        p = nl.exp(nl.subtract(s, m_new))
        l[...] = nl.add(nl.multiply(l, alpha), nl.sum(p, axis=[1], keepdims=True))
        pT = nl.copy(nisa.nc_transpose(nl.copy(p, dtype=v_cache.dtype)), dtype=v_cache.dtype)
        acc[...] = nl.add(nl.multiply(acc, alpha), nisa.nc_matmul(pT, vb[b]))
        m[...] = m_new
      nl.store(out[h * G + g, i_k, i_d], value=nl.divide(acc, l))
  return out


@nki.jit
def medusa_heads_b1(x, w1, w_vocab, k=8):
  B, H = x.shape
  NH, _, _ = w1.shape
  _, V = w_vocab.shape
  assert H <= 128 and V % VT == 0 and V <= 16384 and k % 8 == 0
  NT = (B + 127) // 128
  NV = V // VT
  values = nl.ndarray((NH, B, k), dtype=nl.float32, buffer=nl.shared_hbm)
  ids = nl.ndarray((NH, B, k), dtype=nl.uint32, buffer=nl.shared_hbm)

  i_p = nl.arange(128)[:, None]
  i_q = nl.arange(128)[None, :]
  i_h = nl.arange(H)[None, :]
  i_hp = nl.arange(H)[:, None]
  i_v = nl.arange(VT)[None, :]
  i_vv = nl.arange(V)[None, :]
  i_8 = nl.arange(8)[None, :]

  wv = nl.load(w_vocab)  # [H, V]
  for t in nl.affine_range(NT):
    x_t = nl.load(x[t * 128 + i_p, i_h], mask=(t * 128 + i_p < B))
    xT = nl.load(x[t * 128 + i_q, i_hp], mask=(t * 128 + i_q < B))  # [H, 128], the tokens on the free axis
    for i in nl.affine_range(NH):
      w = nl.load(w1[i, i_hp, i_h])
      h_ps = nisa.nc_matmul(xT[i_hp, i_q], w, mask=(t * 128 + i_q < B))
      h = nl.add(x_t, nl.silu(h_ps, mask=(t * 128 + i_p < B)), mask=(t * 128 + i_p < B), dtype=x.dtype)
      hT = nisa.nc_transpose(h[i_p, i_h], mask=(t * 128 + i_p < B))
      hT_sb = nl.copy(hT, dtype=x.dtype, mask=(t * 128 + i_q < B))
      logits = nl.ndarray((nl.par_dim(128), V), dtype=nl.float32)
      for v in nl.affine_range(NV):
        lg = nisa.nc_matmul(hT_sb[i_hp, i_q], wv[i_hp, v * VT + i_v], mask=(t * 128 + i_q < B))
        logits[i_p, v * VT + i_v] = nl.copy(lg, mask=(t * 128 + i_p < B))
      for r in nl.static_range(k // 8):
        mx = nisa.max8(src=logits[i_p, i_vv], mask=(t * 128 + i_p < B))
        ix = nisa.nc_find_index8(data=logits[i_p, i_vv], vals=mx, mask=(t * 128 + i_p < B))
        nl.store(values[i, t * 128 + i_p, r * 8 + i_8], value=mx, mask=(t * 128 + i_p < B))
        nl.store(ids[i, t * 128 + i_p, r * 8 + i_8], value=ix, mask=(t * 128 + i_p < B))
        if r + 1 < k // 8:
          logits[i_p, i_vv] = nisa.nc_match_replace8(data=logits[i_p, i_vv], vals=mx, imm=-3.0e38,
                                                     mask=(t * 128 + i_p < B))
  return values, ids
