"""Top-k / argsort of rows and ALiBi attention in the new NKI dialect (``import nki``, ISA calls writing ``dst=``),
written the way public NKI 0.3+ kernels are:

- ``topk_rows(logits, k)``: rows [B, V] (V <= 16384, max8's limit) on the partitions, k / 8 rounds of
  ``nisa.max8`` (the 8 largest left), ``nisa.nc_find_index8`` (their positions, before they are knocked out) and
  ``nisa.nc_match_replace8`` (replace them by -inf for the next round). Values [B, k] (input dtype) and indices
  [B, k] uint32, descending; equal values come out in ascending index order. k = E is a full argsort of router
  logits.
- ``topk_spread(logits, k)``: the decode case, one row [V] (V up to 32768, beyond one max8) spread over the 128
  partitions as [128, V / 128]: each partition's local top-k by the same rounds, its global indices
  (``nisa.iota`` with ``channel_multiplier`` = V / 128 plus the local index), both [128, k] flattened onto one
  partition by an SBUF -> SBUF ``dma_copy`` ([1, 128 k]), a final k / 8 rounds over the 128 k candidates and
  ``nisa.nc_n_gather`` of the winners' global indices.
- ``alibi_flash_fwd(q, k, v)`` / ``alibi_flash_fwd_table(q, k, v, bias)``: causal attention with ALiBi, flash-style
  (online softmax) over key blocks of 128. The bias slope_h * (j - i) comes from ``nisa.iota`` (offset
  k0 - q0, channel_multiplier -1) fused into the scores by ``scalar_tensor_tensor``; the ``_table`` variant reads
  a host-made [H, S, S] bias from HBM per block instead. Causal mask by ``nisa.affine_select`` on diagonal blocks;
  blocks above the diagonal are skipped. q, k [H, d, S] (transposed layout), v [H, S, d]; slopes
  2^(-8 (h + 1) / H).

Written for nsim's tests in the style of those kernels; not copies of any file. No nsim imports.
"""
import nki
import nki.isa as nisa
import nki.language as nl

P_MAX = 128
NEG = -3.0e38


def _topk_rounds(vals, rows, n, k, out_v, out_i):
  """k / 8 rounds on vals[:rows, :n] (destroyed): out_v[:rows, :k] values, out_i[:rows, :k] positions (uint32)."""
  for r in nl.static_range(k // 8):
    nisa.max8(dst=out_v[:rows, r * 8:(r + 1) * 8], src=vals[:rows, :n])
    nisa.nc_find_index8(dst=out_i[:rows, r * 8:(r + 1) * 8], data=vals[:rows, :n],
                        vals=out_v[:rows, r * 8:(r + 1) * 8])
    if r + 1 < k // 8:
      nisa.nc_match_replace8(dst=vals[:rows, :n], data=vals[:rows, :n], vals=out_v[:rows, r * 8:(r + 1) * 8],
                             imm=NEG)


@nki.jit
def topk_rows(logits, k=8):
  B, V = logits.shape
  assert k % 8 == 0 and 8 <= V <= 16384
  values = nl.ndarray((B, k), dtype=logits.dtype, buffer=nl.shared_hbm)
  indices = nl.ndarray((B, k), dtype=nl.uint32, buffer=nl.shared_hbm)
  for b in nl.affine_range((B + P_MAX - 1) // P_MAX):
    b0 = b * P_MAX
    rows = min(P_MAX, B - b0)
    x = nl.ndarray((P_MAX, V), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=x[:rows, :], src=logits[b0:b0 + rows, :])
    tv = nl.ndarray((P_MAX, k), dtype=nl.float32, buffer=nl.sbuf)
    ti = nl.ndarray((P_MAX, k), dtype=nl.uint32, buffer=nl.sbuf)
    _topk_rounds(x, rows, V, k, tv, ti)
    tv_out = nl.ndarray((P_MAX, k), dtype=logits.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=tv_out[:rows, :], src=tv[:rows, :])
    nisa.dma_copy(dst=values[b0:b0 + rows, :], src=tv_out[:rows, :])
    nisa.dma_copy(dst=indices[b0:b0 + rows, :], src=ti[:rows, :])
  return values, indices


@nki.jit
def topk_spread(logits, k=8):
  B, V = logits.shape
  assert V % P_MAX == 0 and k % 8 == 0
  F = V // P_MAX
  assert 8 <= F and k <= F and P_MAX * k <= 16384
  values = nl.ndarray((B, k), dtype=nl.float32, buffer=nl.shared_hbm)
  indices = nl.ndarray((B, k), dtype=nl.uint32, buffer=nl.shared_hbm)

  # first global index of each partition's slice: p * F
  base = nl.ndarray((P_MAX, k), dtype=nl.uint32, buffer=nl.sbuf)
  nisa.iota(dst=base, pattern=[[0, k]], offset=0, channel_multiplier=F)

  for b in nl.sequential_range(B):
    x = nl.ndarray((P_MAX, F), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=x, src=logits[b].reshape((P_MAX, F)))
    lv = nl.ndarray((P_MAX, k), dtype=nl.float32, buffer=nl.sbuf)
    li = nl.ndarray((P_MAX, k), dtype=nl.uint32, buffer=nl.sbuf)
    _topk_rounds(x, P_MAX, F, k, lv, li)
    gi = nl.ndarray((P_MAX, k), dtype=nl.uint32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=gi, data1=li, data2=base, op=nl.add)

    # all candidates on one partition, in partition-major order
    cv = nl.ndarray((1, P_MAX * k), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=cv, src=lv)
    ci = nl.ndarray((1, P_MAX * k), dtype=nl.uint32, buffer=nl.sbuf)
    nisa.dma_copy(dst=ci, src=gi)

    fv = nl.ndarray((1, k), dtype=nl.float32, buffer=nl.sbuf)
    fp = nl.ndarray((1, k), dtype=nl.uint32, buffer=nl.sbuf)
    _topk_rounds(cv, 1, P_MAX * k, k, fv, fp)
    fi = nl.ndarray((1, k), dtype=nl.uint32, buffer=nl.sbuf)
    nisa.nc_n_gather(dst=fi, data=ci, indices=fp)
    nisa.dma_copy(dst=values[b:b + 1, :], src=fv)
    nisa.dma_copy(dst=indices[b:b + 1, :], src=fi)
  return values, indices


def _alibi_flash(q, k, v, bias):
  H, d, S = q.shape
  assert S % P_MAX == 0 and d <= P_MAX
  NT = S // P_MAX
  scale = 1.0 / (d ** 0.5)
  out = nl.ndarray((H, S, d), dtype=q.dtype, buffer=nl.shared_hbm)

  for h in nl.affine_range(H):
    slope = 2.0 ** (-8.0 * (h + 1) / H)
    for qi in nl.affine_range(NT):
      q0 = qi * P_MAX
      qT = nl.ndarray((d, P_MAX), dtype=q.dtype, buffer=nl.sbuf)
      nisa.dma_copy(dst=qT, src=q[h, :, q0:q0 + P_MAX])
      m = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
      nisa.memset(dst=m, value=NEG)
      l = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
      nisa.memset(dst=l, value=0.0)
      acc = nl.ndarray((P_MAX, d), dtype=nl.float32, buffer=nl.sbuf)
      nisa.memset(dst=acc, value=0.0)

      for ki in nl.sequential_range(qi + 1):  # causal: key blocks up to the diagonal
        k0 = ki * P_MAX
        kT = nl.ndarray((d, P_MAX), dtype=k.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=kT, src=k[h, :, k0:k0 + P_MAX])
        v_sb = nl.ndarray((P_MAX, d), dtype=v.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=v_sb, src=v[h, k0:k0 + P_MAX, :])
        s_ps = nl.ndarray((P_MAX, P_MAX), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=s_ps, stationary=qT, moving=kT)

        # s = qk + (slope * (j - i)) / scale; the softmax scale is applied by the exp
        s = nl.ndarray((P_MAX, P_MAX), dtype=nl.float32, buffer=nl.sbuf)
        if bias is None:
          rel = nl.ndarray((P_MAX, P_MAX), dtype=nl.float32, buffer=nl.sbuf)
          nisa.iota(dst=rel, pattern=[[1, P_MAX]], offset=k0 - q0, channel_multiplier=-1)
          nisa.scalar_tensor_tensor(dst=s, data=rel, op0=nl.multiply, operand0=slope / scale, op1=nl.add,
                                    operand1=s_ps)
        else:
          b_sb = nl.ndarray((P_MAX, P_MAX), dtype=bias.dtype, buffer=nl.sbuf)
          nisa.dma_copy(dst=b_sb, src=bias[h, q0:q0 + P_MAX, k0:k0 + P_MAX])
          nisa.scalar_tensor_tensor(dst=s, data=b_sb, op0=nl.multiply, operand0=1.0 / scale, op1=nl.add,
                                    operand1=s_ps)
        if ki == qi:  # diagonal block: keep j <= i
          nisa.affine_select(dst=s, pattern=[[-1, P_MAX]], channel_multiplier=1, on_true_tile=s,
                             on_false_value=NEG, cmp_op=nl.greater_equal)

        # online softmax
        bmax = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=bmax, op=nl.maximum, data=s, axis=1)
        m_new = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=m_new, data1=m, data2=bmax, op=nl.maximum)
        neg_m = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=neg_m, data=m_new, op0=nl.multiply, operand0=-scale)
        alpha = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=alpha, op=nl.exp, data=m, bias=neg_m, scale=scale)
        p = nl.ndarray((P_MAX, P_MAX), dtype=v.dtype, buffer=nl.sbuf)
        psum_row = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=p, op=nl.exp, data=s, bias=neg_m, scale=scale, reduce_op=nl.add, reduce_res=psum_row,
                        reduce_cmd=nisa.reduce_cmd.reset_reduce)
        nisa.scalar_tensor_tensor(dst=l, data=l, op0=nl.multiply, operand0=alpha, op1=nl.add, operand1=psum_row)
        nisa.tensor_copy(dst=m, src=m_new)

        pT_ps = nl.ndarray((P_MAX, P_MAX), dtype=v.dtype, buffer=nl.psum)
        nisa.nc_transpose(dst=pT_ps, data=p)
        pT = nl.ndarray((P_MAX, P_MAX), dtype=v.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=pT, src=pT_ps)
        pv_ps = nl.ndarray((P_MAX, d), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=pv_ps, stationary=pT, moving=v_sb)
        nisa.scalar_tensor_tensor(dst=acc, data=acc, op0=nl.multiply, operand0=alpha, op1=nl.add,
                                  operand1=pv_ps)

      inv_l = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
      nisa.reciprocal(dst=inv_l, data=l)
      o = nl.ndarray((P_MAX, d), dtype=q.dtype, buffer=nl.sbuf)
      nisa.tensor_scalar(dst=o, data=acc, op0=nl.multiply, operand0=inv_l)
      nisa.dma_copy(dst=out[h, q0:q0 + P_MAX, :], src=o)
  return out


@nki.jit
def alibi_flash_fwd(q, k, v):
  return _alibi_flash(q, k, v, None)


@nki.jit
def alibi_flash_fwd_table(q, k, v, bias):
  return _alibi_flash(q, k, v, bias)


@nki.jit
def router_argsort(hidden_T, w_router):
  """Router logits hidden @ w_router (hidden given transposed, [H, T], H <= 128) left in PSUM and fully sorted
  per token: E / 8 rounds, the first reading the PSUM tile itself. Returns the sorted logits [T, E] fp32 and the
  expert order [T, E] uint32."""
  H, T = hidden_T.shape
  H_, E = w_router.shape
  assert H == H_ and H <= P_MAX and E % 8 == 0 and 8 <= E <= 512
  sorted_vals = nl.ndarray((T, E), dtype=nl.float32, buffer=nl.shared_hbm)
  order = nl.ndarray((T, E), dtype=nl.uint32, buffer=nl.shared_hbm)
  w_sb = nl.ndarray((H, E), dtype=w_router.dtype, buffer=nl.sbuf)
  nisa.dma_copy(dst=w_sb, src=w_router)
  for t in nl.affine_range((T + P_MAX - 1) // P_MAX):
    t0 = t * P_MAX
    rows = min(P_MAX, T - t0)
    xT = nl.ndarray((H, P_MAX), dtype=hidden_T.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=xT[:, :rows], src=hidden_T[:, t0:t0 + rows])
    lg_ps = nl.ndarray((P_MAX, E), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=lg_ps[:rows, :], stationary=xT[:, :rows], moving=w_sb)
    sv = nl.ndarray((P_MAX, E), dtype=nl.float32, buffer=nl.sbuf)
    si = nl.ndarray((P_MAX, E), dtype=nl.uint32, buffer=nl.sbuf)
    work = nl.ndarray((P_MAX, E), dtype=nl.float32, buffer=nl.sbuf)
    for r in nl.static_range(E // 8):
      src = lg_ps if r == 0 else work
      nisa.max8(dst=sv[:rows, r * 8:(r + 1) * 8], src=src[:rows, :])
      nisa.nc_find_index8(dst=si[:rows, r * 8:(r + 1) * 8], data=src[:rows, :], vals=sv[:rows, r * 8:(r + 1) * 8])
      nisa.nc_match_replace8(dst=work[:rows, :], data=src[:rows, :], vals=sv[:rows, r * 8:(r + 1) * 8], imm=NEG)
    nisa.dma_copy(dst=sorted_vals[t0:t0 + rows, :], src=sv[:rows, :])
    nisa.dma_copy(dst=order[t0:t0 + rows, :], src=si[:rows, :])
  return sorted_vals, order
