"""Packed-sequence attention with runtime document ids and prefix-LM masking in the new NKI dialect
(``import nki``, ISA calls writing ``dst=``), written the way public NKI 0.3+ flash-attention kernels are:

- ``segment_id_flash_fwd(q, k, v, segment_ids)``: the packed batch of ``packed_doc_flash_fwd`` (q, k [d, S], v
  [S, d]) with the document structure known only at run time: a [S] int32 segment-id tensor. Per query block the
  rows' ids are DMA'd as a [128, 1] column (``.ap`` with one element per partition), per key block the columns'
  ids as a row broadcast to the 128 partitions (``.ap`` with partition step 0); ``nisa.tensor_scalar`` compares
  them (``nl.equal`` against the column) into a 0 / 1 mask turned into an additive -30000 bias; causal by
  ``nisa.affine_select`` on the diagonal. Every key block up to the diagonal is computed (nothing is known about
  the documents at trace time).
- ``prefix_lm_flash_fwd(q, k, v, prefix_len)``: prefix-LM attention (q, k [H, d, S], v [H, S, d]): keys j < P
  are visible to every query (bidirectional prefix), after the prefix causal. Key blocks above the diagonal that
  lie wholly past the prefix are skipped; the causal ``affine_select`` is applied to the columns past the prefix
  only (a column slice of the score tile as dst).

Written for nsim's tests in the style of those kernels; not copies of any file. No nsim imports.
"""
import nki
import nki.isa as nisa
import nki.language as nl

P_MAX = 128
NEG = -30000.0


def _online_softmax_step(s, v_sb, m, l, acc, scale, d):
  """One flash step on the fp32 score tile s [128, 128] (unscaled) and the key block's values v_sb [128, d]."""
  bmax = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_reduce(dst=bmax, op=nl.maximum, data=s, axis=1)
  m_new = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_tensor(dst=m_new, data1=m, data2=bmax, op=nl.maximum)
  neg_m = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_scalar(dst=neg_m, data=m_new, op0=nl.multiply, operand0=-scale)
  alpha = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.activation(dst=alpha, op=nl.exp, data=m, bias=neg_m, scale=scale)
  p = nl.ndarray((P_MAX, P_MAX), dtype=v_sb.dtype, buffer=nl.sbuf)
  rsum = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.activation(dst=p, op=nl.exp, data=s, bias=neg_m, scale=scale, reduce_op=nl.add, reduce_res=rsum,
                  reduce_cmd=nisa.reduce_cmd.reset_reduce)
  nisa.scalar_tensor_tensor(dst=l, data=l, op0=nl.multiply, operand0=alpha, op1=nl.add, operand1=rsum)
  nisa.tensor_copy(dst=m, src=m_new)
  pT_ps = nl.ndarray((P_MAX, P_MAX), dtype=v_sb.dtype, buffer=nl.psum)
  nisa.nc_transpose(dst=pT_ps, data=p)
  pT = nl.ndarray((P_MAX, P_MAX), dtype=v_sb.dtype, buffer=nl.sbuf)
  nisa.tensor_copy(dst=pT, src=pT_ps)
  pv_ps = nl.ndarray((P_MAX, d), dtype=nl.float32, buffer=nl.psum)
  nisa.nc_matmul(dst=pv_ps, stationary=pT, moving=v_sb)
  nisa.scalar_tensor_tensor(dst=acc, data=acc, op0=nl.multiply, operand0=alpha, op1=nl.add, operand1=pv_ps)


def _init_state(d):
  m = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.memset(dst=m, value=NEG)
  l = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.memset(dst=l, value=0.0)
  acc = nl.ndarray((P_MAX, d), dtype=nl.float32, buffer=nl.sbuf)
  nisa.memset(dst=acc, value=0.0)
  return m, l, acc


def _finish(acc, l, out_view, dtype, d):
  inv_l = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.reciprocal(dst=inv_l, data=l)
  o = nl.ndarray((P_MAX, d), dtype=dtype, buffer=nl.sbuf)
  nisa.tensor_scalar(dst=o, data=acc, op0=nl.multiply, operand0=inv_l)
  nisa.dma_copy(dst=out_view, src=o)


@nki.jit
def segment_id_flash_fwd(q, k, v, segment_ids):
  d, S = q.shape
  assert S % P_MAX == 0 and d <= P_MAX
  NT = S // P_MAX
  scale = 1.0 / (d ** 0.5)
  out = nl.ndarray((S, d), dtype=q.dtype, buffer=nl.shared_hbm)

  for qi in nl.affine_range(NT):
    q0 = qi * P_MAX
    qT = nl.ndarray((d, P_MAX), dtype=q.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=qT, src=q[:, q0:q0 + P_MAX])
    # the query rows' segment ids, one per partition
    q_ids = nl.ndarray((P_MAX, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=q_ids, src=segment_ids.ap(pattern=[[1, P_MAX], [1, 1]], offset=q0))
    q_idf = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=q_idf, src=q_ids)
    m, l, acc = _init_state(d)

    for ki in nl.sequential_range(qi + 1):
      k0 = ki * P_MAX
      kT = nl.ndarray((d, P_MAX), dtype=k.dtype, buffer=nl.sbuf)
      nisa.dma_copy(dst=kT, src=k[:, k0:k0 + P_MAX])
      v_sb = nl.ndarray((P_MAX, d), dtype=v.dtype, buffer=nl.sbuf)
      nisa.dma_copy(dst=v_sb, src=v[k0:k0 + P_MAX, :])
      # the key columns' segment ids, the same row on every partition
      k_ids = nl.ndarray((P_MAX, P_MAX), dtype=nl.int32, buffer=nl.sbuf)
      nisa.dma_copy(dst=k_ids, src=segment_ids.ap(pattern=[[0, P_MAX], [1, P_MAX]], offset=k0))
      # bias = (k_id == q_id) * 30000 - 30000: 0 inside the row's document, -30000 outside
      bias = nl.ndarray((P_MAX, P_MAX), dtype=nl.float32, buffer=nl.sbuf)
      nisa.tensor_scalar(dst=bias, data=k_ids, op0=nl.equal, operand0=q_idf, op1=nl.multiply,
                         operand1=-NEG)
      s_ps = nl.ndarray((P_MAX, P_MAX), dtype=nl.float32, buffer=nl.psum)
      nisa.nc_matmul(dst=s_ps, stationary=qT, moving=kT)
      s = nl.ndarray((P_MAX, P_MAX), dtype=nl.float32, buffer=nl.sbuf)
      # s = (bias - 30000) * (1 / scale) + qk; the exp applies the scale
      nisa.scalar_tensor_tensor(dst=s, data=bias, op0=nl.add, operand0=NEG, op1=nl.add, operand1=s_ps)
      if ki == qi:  # diagonal block: keep j <= i
        nisa.affine_select(dst=s, pattern=[[-1, P_MAX]], channel_multiplier=1, on_true_tile=s,
                           on_false_value=NEG, cmp_op=nl.greater_equal)
      _online_softmax_step(s, v_sb, m, l, acc, scale, d)
    _finish(acc, l, out[q0:q0 + P_MAX, :], q.dtype, d)
  return out


@nki.jit
def prefix_lm_flash_fwd(q, k, v, prefix_len):
  H, d, S = q.shape
  P = prefix_len
  assert S % P_MAX == 0 and d <= P_MAX and 0 <= P <= S
  NT = S // P_MAX
  scale = 1.0 / (d ** 0.5)
  out = nl.ndarray((H, S, d), dtype=q.dtype, buffer=nl.shared_hbm)

  for h in nl.affine_range(H):
    for qi in nl.affine_range(NT):
      q0 = qi * P_MAX
      qT = nl.ndarray((d, P_MAX), dtype=q.dtype, buffer=nl.sbuf)
      nisa.dma_copy(dst=qT, src=q[h, :, q0:q0 + P_MAX])
      m, l, acc = _init_state(d)
      # key blocks up to the diagonal, and past it those that start inside the prefix
      n_kb = max(qi + 1, (P + P_MAX - 1) // P_MAX)
      for ki in nl.sequential_range(n_kb):
        k0 = ki * P_MAX
        kT = nl.ndarray((d, P_MAX), dtype=k.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=kT, src=k[h, :, k0:k0 + P_MAX])
        v_sb = nl.ndarray((P_MAX, d), dtype=v.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=v_sb, src=v[h, k0:k0 + P_MAX, :])
        s_ps = nl.ndarray((P_MAX, P_MAX), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=s_ps, stationary=qT, moving=kT)
        s = nl.ndarray((P_MAX, P_MAX), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=s, src=s_ps)
        # columns at or past the prefix are causal: keep (q0 + i) - (k0 + c + j) >= 0
        c = min(max(P - k0, 0), P_MAX)
        if c < P_MAX and k0 + P_MAX - 1 > q0:  # some key of the block may lie past the diagonal
          nisa.affine_select(dst=s[:, c:P_MAX], pattern=[[-1, P_MAX - c]], channel_multiplier=1,
                             on_true_tile=s[:, c:P_MAX], on_false_value=NEG, cmp_op=nl.greater_equal,
                             offset=q0 - k0 - c)
        _online_softmax_step(s, v_sb, m, l, acc, scale, d)
      _finish(acc, l, out[h, q0:q0 + P_MAX, :], q.dtype, d)
  return out
