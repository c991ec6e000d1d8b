"""Partial-softmax merges in the Beta-1 dialect (``neuronxcc.nki``), written the way public NKI kernels write them
(arange index expressions, value-returning ``nl`` / ``nisa`` calls, masks on the ragged last tile, 2-space indent):

- ``lse_combine(o_partial, lse_partial)``: the second kernel of flash-decoding (vLLM / NxDI split-KV "reduce"
  kernel): o_partial [B, H, P, d] fp32 (each split's normalised output), lse_partial [B, H, P] fp32; the rows
  B * H on the partitions (tiles of 128, last one masked). o = sum_p exp(lse_p - lse_max) o_p /
  sum_p exp(lse_p - lse_max), lse = lse_max + log(sum_p exp(lse_p - lse_max)). Returns out [B, H, d] and
  lse [B, H] fp32. ``flash_decode_splits`` in lse_merge_kernels_new.py is the first kernel.
- ``ring_attention_merge_b1(qT, kT_chunks, v_chunks, q_block, causal)``: the ring-attention step merge in the
  running-statistics form of the flash-attention ports: each arriving KV chunk (successive HBM inputs
  kT_chunks [C, H, d, Sk], v_chunks [C, H, Sk, d]) gives its unnormalised block output, block max and block sum
  (``nisa.activation`` exp with ``bias=-max`` and ``reduce_res=``), merged into the running (acc, m, l) with
  m' = max(m, m_blk), acc' = acc exp(m - m') + acc_blk exp(m_blk - m'), l' likewise. Causal: chunks past the query
  block are skipped, the diagonal chunk masked by ``nisa.affine_select``. Returns out [H, 128, d] fp32 and
  lse [H, 128] fp32 (= m + log l). Same contract as ``ring_attention_merge`` (new dialect).
- ``flash_fwd_lse(q, k, v, causal)``: the forward of a training flash attention that stores the per-row
  logsumexp for the backward (as nki-samples' ``flash_fwd`` / the NxD training kernels return it): q, k
  [H, d, S] (transposed layout), v [H, S, d], query tiles of 128 on the partitions, online softmax over key blocks
  of 128 (causal: blocks above the diagonal skipped). Returns o [H, S, d] (q dtype) and lse [H, S] fp32.
- ``vocab_log_softmax_b1(logits)``: log-softmax over a large vocabulary as the Beta-1 cross-entropy kernels write
  it: token rows on the partitions (ragged last row tile masked), vocabulary tiles of 2048 (ragged last tile
  masked, its unread columns left at -3e38), running max and running sum of exp rescaled per tile
  (``nisa.activation`` exp with ``bias=-max`` and ``reduce_res=``), then logp = x - lse in bf16 and the
  logsumexp per row into a 1-D lse [N] (``nl.store(lse[r0 + i_p], ...)``). Same contract as
  ``vocab_log_softmax`` (new dialect).

Written for nsim's tests in the style of those kernels; not copies of any file. No nsim imports.
"""
import math

import numpy as np

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl

PMAX = 128
NEG = -3.0e38


@nki.jit
def lse_combine(o_partial, lse_partial):
  B, H, NP, d = o_partial.shape
  R = B * H
  o_flat = o_partial.reshape((R, NP, d))
  l_flat = lse_partial.reshape((R, NP))
  out = nl.ndarray((B, H, d), dtype=nl.float32, buffer=nl.shared_hbm)
  lse = nl.ndarray((B, H), dtype=nl.float32, buffer=nl.shared_hbm)
  out_flat = out.reshape((R, d))
  lse_flat = lse.reshape((R, 1))

  i_p = nl.arange(PMAX)[:, None]
  i_s = nl.arange(NP)[None, :]
  i_d = nl.arange(d)[None, :]
  i_1 = nl.arange(1)[None, :]

  for t in nl.affine_range((R + PMAX - 1) // PMAX):
    rmask = t * PMAX + i_p < R
    lse_t = nl.load(l_flat[t * PMAX + i_p, i_s], mask=rmask)
    mx = nisa.tensor_reduce(np.max, data=lse_t, axis=(1,), keepdims=True, mask=rmask)
    w = nisa.activation(op=nl.exp, data=lse_t, bias=nl.negative(mx, mask=rmask), mask=rmask,
                        dtype=nl.float32)
    w_sum = nl.sum(w, axis=[1], keepdims=True, mask=rmask, dtype=nl.float32)

    acc = nl.zeros((PMAX, d), dtype=nl.float32)
    for p in nl.static_range(NP):
      o_p = nl.load(o_flat[t * PMAX + i_p, p, i_d], mask=rmask)
      acc[...] = nl.add(acc, nl.multiply(o_p, w[i_p, p], mask=rmask), mask=rmask)

    o = nl.divide(acc, w_sum, mask=rmask, dtype=nl.float32)
    lse_new = nl.add(mx, nl.log(w_sum, mask=rmask), mask=rmask)
    nl.store(out_flat[t * PMAX + i_p, i_d], value=o, mask=rmask)
    nl.store(lse_flat[t * PMAX + i_p, i_1], value=lse_new, mask=rmask)
  return out, lse


def _chunk_stats(q_sb, kT, v_sb, Sk, d, scale, q0, k0, masked, kernel_dtype):
  """Unnormalised block output [128, d] (PSUM), block max and block sum of exp ([128, 1] fp32)."""
  i_p = nl.arange(PMAX)[:, None]
  i_k = nl.arange(Sk)[None, :]
  i_f = nl.arange(PMAX)[None, :]
  s_ps = nisa.nc_matmul(q_sb, kT)  # [128, Sk]
  s = nl.multiply(s_ps, scale, dtype=nl.float32)
  if masked:
    s = nisa.affine_select(pred=(q0 + i_p - k0 - i_k >= 0), on_true_tile=s, on_false_value=NEG, dtype=nl.float32)
  m_blk = nisa.tensor_reduce(np.max, data=s, axis=(1,), keepdims=True, dtype=nl.float32)
  neg_m = nl.multiply(m_blk, -1.0)
  l_blk = nl.ndarray((PMAX, 1), dtype=nl.float32)
  p = nisa.activation(op=nl.exp, data=s, bias=neg_m, reduce_op=nl.add, reduce_res=l_blk,
                      reduce_cmd=nisa.reduce_cmd.reset_reduce, dtype=kernel_dtype)
  pv_ps = nl.zeros((PMAX, d), dtype=nl.float32, buffer=nl.psum)
  for c in nl.affine_range(Sk // PMAX):
    pT = nl.copy(nisa.nc_transpose(p[i_p, c * PMAX + i_f]), dtype=kernel_dtype)
    pv_ps += nisa.nc_matmul(pT, v_sb[c, i_p, nl.arange(d)[None, :]])
  return pv_ps, m_blk, l_blk


@nki.jit
def ring_attention_merge_b1(qT, kT_chunks, v_chunks, q_block=0, causal=False):
  H, d, Sq = qT.shape
  C, H_, d_, Sk = kT_chunks.shape
  assert Sq == PMAX and H == H_ and d == d_ and Sk % PMAX == 0 and Sk <= 512
  scale = 1.0 / math.sqrt(d)
  q0 = q_block * Sq
  kernel_dtype = v_chunks.dtype
  out = nl.ndarray((H, Sq, d), dtype=nl.float32, buffer=nl.shared_hbm)
  lse = nl.ndarray((H, Sq), dtype=nl.float32, buffer=nl.shared_hbm)
  lse3 = lse.reshape((H, Sq, 1))

  i_p = nl.arange(PMAX)[:, None]
  i_dp = nl.arange(d)[:, None]
  i_q = nl.arange(Sq)[None, :]
  i_k = nl.arange(Sk)[None, :]
  i_d = nl.arange(d)[None, :]
  i_1 = nl.arange(1)[None, :]

  for h in nl.affine_range(H):
    q_sb = nl.load(qT[h, i_dp, i_q])
    acc = nl.zeros((PMAX, d), dtype=nl.float32)
    m = nl.full((PMAX, 1), NEG, dtype=nl.float32)
    l = nl.zeros((PMAX, 1), dtype=nl.float32)
    for c in nl.sequential_range(C):
      k0 = c * Sk
      if causal and k0 > q0 + Sq - 1:
        continue
      kT = nl.load(kT_chunks[c, h, i_dp, i_k])
      v_sb = nl.ndarray((Sk // PMAX, nl.par_dim(PMAX), d), dtype=v_chunks.dtype)
      for t in nl.affine_range(Sk // PMAX):
        v_sb[t, i_p, i_d] = nl.load(v_chunks[c, h, t * PMAX + i_p, i_d])
      masked = causal and k0 + Sk - 1 > q0
      o_blk, m_blk, l_blk = _chunk_stats(q_sb, kT, v_sb, Sk, d, scale, q0, k0, masked, kernel_dtype)

      # merge the chunk into the running statistics
      m_new = nl.maximum(m, m_blk)
      a = nl.exp(nl.subtract(m, m_new))
      b = nl.exp(nl.subtract(m_blk, m_new))
      acc[...] = nl.add(nl.multiply(acc, a), nl.multiply(o_blk, b))
      l[...] = nl.add(nl.multiply(l, a), nl.multiply(l_blk, b))
      m[...] = m_new

    o = nl.divide(acc, l, dtype=nl.float32)
    nl.store(out[h, i_p, i_d], value=o)
    nl.store(lse3[h, i_p, i_1], value=nl.add(m, nl.log(l)))
  return out, lse


@nki.jit
def flash_fwd_lse(q, k, v, causal=True):
  H, d, S = q.shape
  assert S % PMAX == 0 and d <= PMAX
  NT = S // PMAX
  scale = 1.0 / math.sqrt(d)
  kernel_dtype = q.dtype
  o = nl.ndarray((H, S, d), dtype=q.dtype, buffer=nl.shared_hbm)
  lse = nl.ndarray((H, S), dtype=nl.float32, buffer=nl.shared_hbm)
  lse3 = lse.reshape((H, S, 1))

  i_p = nl.arange(PMAX)[:, None]
  i_dp = nl.arange(d)[:, None]
  i_f = nl.arange(PMAX)[None, :]
  i_d = nl.arange(d)[None, :]
  i_1 = nl.arange(1)[None, :]

  for h in nl.affine_range(H):
    for qi in nl.affine_range(NT):
      q_tile = nl.load(q[h, i_dp, qi * PMAX + i_f])
      m_i = nl.full((PMAX, 1), NEG, dtype=nl.float32)
      l_i = nl.zeros((PMAX, 1), dtype=nl.float32)
      o_acc = nl.zeros((PMAX, d), dtype=nl.float32)
      n_kb = qi + 1 if causal else NT
      for ki in nl.sequential_range(n_kb):
        k_tile = nl.load(k[h, i_dp, ki * PMAX + i_f])
        v_tile = nl.load(v[h, ki * PMAX + i_p, i_d])
        qk = nisa.nc_matmul(q_tile, k_tile)
        s = nl.multiply(qk, scale, dtype=nl.float32)
        if causal and ki == qi:
          s = nisa.affine_select(pred=(i_p - i_f >= 0), on_true_tile=s, on_false_value=NEG, dtype=nl.float32)
        m_cur = nisa.tensor_reduce(np.max, data=s, axis=(1,), keepdims=True, dtype=nl.float32)
        m_new = nl.maximum(m_i, m_cur)
        alpha = nl.exp(nl.subtract(m_i, m_new))
        p = nisa.activation(op=nl.exp, data=s, bias=nl.negative(m_new), dtype=kernel_dtype)
        l_cur = nl.sum(p, axis=[1], keepdims=True, dtype=nl.float32)
        pT = nl.copy(nisa.nc_transpose(p), dtype=kernel_dtype)
        pv = nisa.nc_matmul(pT, v_tile)
        o_acc[...] = nl.add(nl.multiply(o_acc, alpha), pv)
        l_i[...] = nl.add(nl.multiply(l_i, alpha), l_cur)
        m_i[...] = m_new
      o_tile = nl.divide(o_acc, l_i, dtype=q.dtype)
      nl.store(o[h, qi * PMAX + i_p, i_d], value=o_tile)
      # the backward recomputes p = exp(s - lse)
      nl.store(lse3[h, qi * PMAX + i_p, i_1], value=nl.add(m_i, nl.log(l_i)))
  return o, lse


@nki.jit
def vocab_log_softmax_b1(logits):
  N, V = logits.shape
  VT = 2048
  NV = (V + VT - 1) // VT
  logp = nl.ndarray((N, V), dtype=nl.bfloat16, buffer=nl.shared_hbm)
  lse = nl.ndarray((N,), dtype=nl.float32, buffer=nl.shared_hbm)

  i_p = nl.arange(PMAX)[:, None]
  i_v = nl.arange(VT)[None, :]

  for r in nl.affine_range((N + PMAX - 1) // PMAX):
    rmask = r * PMAX + i_p < N
    m = nl.full((PMAX, 1), NEG, dtype=nl.float32)
    s = nl.zeros((PMAX, 1), dtype=nl.float32)
    for j in nl.sequential_range(NV):
      vmask = (r * PMAX + i_p < N) & (j * VT + i_v < V)
      x = nl.full((PMAX, VT), NEG, dtype=nl.float32)
      x[i_p, i_v] = nl.load(logits[r * PMAX + i_p, j * VT + i_v], mask=vmask, dtype=nl.float32)
      m_cur = nisa.tensor_reduce(np.max, data=x, axis=(1,), keepdims=True, mask=rmask)
      m_new = nl.maximum(m, m_cur, mask=rmask)
      s_cur = nl.ndarray((PMAX, 1), dtype=nl.float32)
      nisa.activation(op=nl.exp, data=x, bias=nl.negative(m_new, mask=rmask), reduce_op=nl.add, reduce_res=s_cur,
                      reduce_cmd=nisa.reduce_cmd.reset_reduce, mask=rmask, dtype=nl.bfloat16)
      s[...] = nl.add(nl.multiply(s, nl.exp(nl.subtract(m, m_new, mask=rmask), mask=rmask), mask=rmask), s_cur,
                      mask=rmask)
      m[...] = m_new

    row_lse = nl.add(m, nl.log(s, mask=rmask), mask=rmask)
    for j in nl.affine_range(NV):
      vmask = (r * PMAX + i_p < N) & (j * VT + i_v < V)
      x = nl.load(logits[r * PMAX + i_p, j * VT + i_v], mask=vmask, dtype=nl.float32)
      nl.store(logp[r * PMAX + i_p, j * VT + i_v], value=nl.subtract(x, row_lse, mask=vmask, dtype=nl.bfloat16),
               mask=vmask)
    nl.store(lse[r * PMAX + i_p], value=row_lse, mask=rmask)
  return logp, lse
