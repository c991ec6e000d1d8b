"""Speculative-decoding kernels in the new NKI dialect (``import nki``, ISA calls writing ``dst=``), written the way
public NKI ports of vLLM / NxD-Inference speculative decoding (EAGLE / Medusa style) write them:

- ``verify_attention(q, k_cache, v_cache, k_draft, v_draft, tree_mask=None)``: multi-token verification attention.
  The K draft tokens of every query head attend to the whole KV cache plus the K draft tokens themselves (causal
  within the draft, or by a [K, K] 0/1 tree mask given as input). GQA: the G = Hq / Hkv query heads sharing a KV
  head are packed on the partitions (G * K <= 128 query rows), so each cache block is loaded once per KV head.
  Flash-style online softmax (fp32 max / sum stats) over cache blocks of 128 keys (a ragged last block for any
  cache length), then one block of the K draft keys with the mask as an additive bias. q [Hq, d, K] and the keys
  [Hkv, d, *] in the transposed layout, values [Hkv, *, d]; bf16 or fp32. Output [Hq, K, d]. Under LNC=2
  (``verify_attention[2]``) the KV heads are split between the two cores (``nl.program_id`` / ``nl.num_programs``).
- ``kv_compact(k_cache, v_cache, k_scratch, v_scratch, accepted, cache_len)``: after verification, the accepted
  draft tokens' K/V rows (scratch rows listed at run time by the int32 tensor ``accepted`` [A]) are copied to
  the cache positions cache_len .. cache_len + A - 1 (``cache_len`` an int32 [1] tensor, read at run time):
  the destination rows are ``nisa.iota`` plus the broadcast cache length, the rows are gathered from the scratch
  and scattered into the cache by indirect DMAs (``.ap(vector_offset=..., indirect_dim=0)``). The caches are
  updated in place and returned. ``kv_compact_padded(..., accepted, num_accepted, cache_len)``: the same with a
  runtime count, -1 padding and out-of-range destinations skipped by ``oob_mode=skip``.
- ``medusa_heads(x, w1, w_vocab, k)``: Medusa heads h = x + silu(x @ w1[i]) and logits = h @ w_vocab
  (contraction tiled by 128, accumulated in PSUM), top-k ids per head by ``nisa.max8`` / ``nc_find_index8`` /
  ``nc_match_replace8`` rounds.
- ``rejection_sample_new(draft_probs, target_probs, draft_ids, uniforms)``: the speculative-sampling acceptance
  rule (see the Beta-1 file) with one-element indirect-DMA gathers of the token columns, a
  ``tensor_scalar_cumulative`` running product, and the rows p_n / q_n loaded by a runtime ``scalar_offset``.
- ``verify_attention_paged(q, k_cache, v_cache, block_table, context_len, k_draft, v_draft, tree_mask=None)``:
  verification over a paged cache (block ids from a runtime block table, runtime context length masked);
  ``verify_attention_dyn(q, k_cache, v_cache, k_draft, v_draft, num_blocks, tree_mask=None)``: a runtime number
  of cache blocks (``nl.dynamic_range`` over a sequencer register).

Written for nsim's tests in the style of those kernels; not copies of any file. No nsim imports.
"""
import nki
import nki.isa as nisa
import nki.language as nl

P_MAX = 128
NEG = -3.0e38


def _online_block(s, width, v_sb, m, l, acc, rows, d, scale, vdt):
  """One flash step: scores s[:rows, :width] (SBUF or PSUM, unscaled), values v_sb[:width, :d]."""
  bmax = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_reduce(dst=bmax, op=nl.maximum, data=s[:rows, :width], axis=1)
  m_new = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_tensor(dst=m_new, data1=m, data2=bmax, op=nl.maximum)
  neg_m = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_scalar(dst=neg_m, data=m_new, op0=nl.multiply, operand0=-scale)
  alpha = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.activation(dst=alpha, op=nl.exp, data=m, bias=neg_m, scale=scale)
  p = nl.ndarray((rows, width), dtype=vdt, buffer=nl.sbuf)
  rsum = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.activation(dst=p, op=nl.exp, data=s[:rows, :width], bias=neg_m, scale=scale, reduce_op=nl.add,
                  reduce_res=rsum, reduce_cmd=nisa.reduce_cmd.reset_reduce)
  nisa.scalar_tensor_tensor(dst=l, data=l, op0=nl.multiply, operand0=alpha, op1=nl.add, operand1=rsum)
  nisa.tensor_copy(dst=m, src=m_new)

  pT_ps = nl.ndarray((width, rows), dtype=vdt, buffer=nl.psum)
  nisa.nc_transpose(dst=pT_ps, data=p)
  pT = nl.ndarray((width, rows), dtype=vdt, buffer=nl.sbuf)
  nisa.tensor_copy(dst=pT, src=pT_ps)
  pv = nl.ndarray((rows, d), dtype=nl.float32, buffer=nl.psum)
  nisa.nc_matmul(dst=pv, stationary=pT, moving=v_sb[:width, :])
  nisa.scalar_tensor_tensor(dst=acc, data=acc, op0=nl.multiply, operand0=alpha, op1=nl.add, operand1=pv)


def _draft_bias(tree_mask, G, K):
  """[G * K, K] additive bias of the draft block: 0 where packed query row g * K + i may see draft key j (j <= i,
  or tree_mask[i, j] != 0), NEG elsewhere."""
  GK = G * K
  keep = nl.ndarray((GK, K), dtype=nl.float32, buffer=nl.sbuf)
  if tree_mask is None:
    tri = nl.ndarray((K, K), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=tri, value=1.0)
    nisa.affine_select(dst=tri, pattern=[[-1, K]], channel_multiplier=1, on_true_tile=tri, on_false_value=0.0,
                       cmp_op=nl.greater_equal)
    for g in nl.static_range(G):
      nisa.dma_copy(dst=keep[g * K:(g + 1) * K, :], src=tri)
  else:
    for g in nl.static_range(G):
      nisa.dma_copy(dst=keep[g * K:(g + 1) * K, :], src=tree_mask)
  bias = nl.ndarray((GK, K), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_scalar(dst=bias, data=keep, op0=nl.subtract, operand0=1.0, op1=nl.multiply, operand1=-NEG)
  return bias


@nki.jit
def verify_attention(q, k_cache, v_cache, k_draft, v_draft, tree_mask=None):
  Hq, d, K = q.shape
  Hkv, d_, S = k_cache.shape
  assert d == d_ and d <= P_MAX and Hq % Hkv == 0
  G = Hq // Hkv
  GK = G * K
  assert GK <= P_MAX and S >= 1
  scale = 1.0 / (d ** 0.5)
  NB = (S + P_MAX - 1) // P_MAX
  out = nl.ndarray((Hq, K, d), dtype=q.dtype, buffer=nl.shared_hbm)

  # which draft keys each packed query row may see: causal (j <= i) or the tree mask, repeated per head of
  # the group; as an additive bias 0 / NEG
  draft_bias = _draft_bias(tree_mask, G, K)

  # under LNC=2 (``verify_attention[2](...)``) each core takes half of the KV heads
  n_prog = nl.num_programs(0)
  assert Hkv % n_prog == 0
  per_core = Hkv // n_prog
  for hh in nl.affine_range(per_core):
    h = nl.program_id(0) * per_core + hh
    qT = nl.ndarray((d, GK), dtype=q.dtype, buffer=nl.sbuf)
    for g in nl.static_range(G):
      nisa.dma_copy(dst=qT[:, g * K:(g + 1) * K], src=q[h * G + g])
    m = nl.ndarray((GK, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=m, value=NEG)
    l = nl.ndarray((GK, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=l, value=0.0)
    acc = nl.ndarray((GK, d), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=acc, value=0.0)

    for b in nl.sequential_range(NB):
      k0 = b * P_MAX
      w = min(P_MAX, S - k0)
      kT = nl.ndarray((d, P_MAX), dtype=k_cache.dtype, buffer=nl.sbuf)
      nisa.dma_copy(dst=kT[:, :w], src=k_cache[h, :, k0:k0 + w])
      v_sb = nl.ndarray((P_MAX, d), dtype=v_cache.dtype, buffer=nl.sbuf)
      nisa.dma_copy(dst=v_sb[:w, :], src=v_cache[h, k0:k0 + w, :])
      s_ps = nl.ndarray((GK, P_MAX), dtype=nl.float32, buffer=nl.psum)
      nisa.nc_matmul(dst=s_ps[:, :w], stationary=qT, moving=kT[:, :w])
      _online_block(s_ps, w, v_sb, m, l, acc, GK, d, scale, v_cache.dtype)

    # the draft tokens themselves
    kdT = nl.ndarray((d, K), dtype=k_draft.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=kdT, src=k_draft[h])
    vd = nl.ndarray((K, d), dtype=v_draft.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=vd, src=v_draft[h])
    sd_ps = nl.ndarray((GK, K), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=sd_ps, stationary=qT, moving=kdT)
    sd = nl.ndarray((GK, K), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=sd, data1=sd_ps, data2=draft_bias, op=nl.add)
    _online_block(sd, K, vd, m, l, acc, GK, d, scale, v_draft.dtype)

    inv_l = nl.ndarray((GK, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.reciprocal(dst=inv_l, data=l)
    o = nl.ndarray((GK, d), dtype=q.dtype, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=o, data=acc, op0=nl.multiply, operand0=inv_l)
    for g in nl.static_range(G):
      nisa.dma_copy(dst=out[h * G + g], src=o[g * K:(g + 1) * K, :])
  return out


@nki.jit
def kv_compact(k_cache, v_cache, k_scratch, v_scratch, accepted, cache_len):
  S_max, Hkv, d = k_cache.shape
  K = k_scratch.shape[0]
  A = accepted.shape[0]
  assert A <= K <= P_MAX
  row = Hkv * d
  kc = k_cache.reshape((S_max, row))
  vc = v_cache.reshape((S_max, row))
  ks = k_scratch.reshape((K, row))
  vs = v_scratch.reshape((K, row))

  src_rows = nl.ndarray((A, 1), dtype=nl.int32, buffer=nl.sbuf)
  nisa.dma_copy(dst=src_rows, src=accepted.reshape((A, 1)))
  # cache_len on every partition (a stride-0 read), plus the partition index
  base = nl.ndarray((A, 1), dtype=nl.int32, buffer=nl.sbuf)
  nisa.dma_copy(dst=base, src=cache_len.reshape((1, 1)).ap(pattern=[[0, A], [1, 1]]))
  lane = nl.ndarray((A, 1), dtype=nl.int32, buffer=nl.sbuf)
  nisa.iota(dst=lane, pattern=[[0, 1]], offset=0, channel_multiplier=1)
  dst_rows = nl.ndarray((A, 1), dtype=nl.int32, buffer=nl.sbuf)
  nisa.tensor_tensor(dst=dst_rows, data1=base, data2=lane, op=nl.add)

  for cache, scratch in ((kc, ks), (vc, vs)):
    rows = nl.ndarray((A, row), dtype=scratch.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=rows, src=scratch.ap(pattern=[[row, A], [1, row]], vector_offset=src_rows, indirect_dim=0))
    nisa.dma_copy(dst=cache.ap(pattern=[[row, A], [1, row]], vector_offset=dst_rows, indirect_dim=0), src=rows)
  return k_cache, v_cache


@nki.jit
def medusa_heads(x, w1, w_vocab, k=8):
  """Medusa heads: for each of the NH heads, h = x + silu(x @ w1[i]) (a residual block), logits = h @ w_vocab
  (the shared LM head), and the top-k token ids of each row by ``nisa.max8`` / ``nisa.nc_find_index8`` rounds
  (``nisa.nc_match_replace8`` knocks out the found values between rounds). x [B, H] (B <= 128 tokens), w1
  [NH, H, H], w_vocab [H, V] (H a multiple of 128, H <= 512, V a multiple of 512, V <= 16384). The contraction
  over H is tiled by 128 and accumulated in PSUM (``accumulate`` left to nsim's inference: the first matmul into
  a fresh PSUM tile overwrites, later ones add). Returns values [NH, B, k] fp32 and ids [NH, B, k] uint32."""
  B, H = x.shape
  NH, H_, H2 = w1.shape
  _, V = w_vocab.shape
  assert H == H_ == H2 and H % P_MAX == 0 and H <= 512 and B <= P_MAX and V % 512 == 0 and V <= 16384
  assert k % 8 == 0
  KT = H // P_MAX
  NV = V // 512
  values = nl.ndarray((NH, B, k), dtype=nl.float32, buffer=nl.shared_hbm)
  ids = nl.ndarray((NH, B, k), dtype=nl.uint32, buffer=nl.shared_hbm)

  x_sb = nl.ndarray((B, H), dtype=x.dtype, buffer=nl.sbuf)
  nisa.dma_copy(dst=x_sb, src=x)
  xT = nl.ndarray((P_MAX, KT, B), dtype=x.dtype, buffer=nl.sbuf)
  for kt in nl.affine_range(KT):
    xT_ps = nl.ndarray((P_MAX, B), dtype=x.dtype, buffer=nl.psum)
    nisa.nc_transpose(dst=xT_ps, data=x_sb[:, kt * P_MAX:(kt + 1) * P_MAX])
    nisa.tensor_copy(dst=xT[:, kt, :], src=xT_ps)
  wv = nl.ndarray((P_MAX, KT, V), dtype=w_vocab.dtype, buffer=nl.sbuf)
  for kt in nl.affine_range(KT):
    nisa.dma_copy(dst=wv[:, kt, :], src=w_vocab[kt * P_MAX:(kt + 1) * P_MAX, :])

  for i in nl.affine_range(NH):
    w_sb = nl.ndarray((P_MAX, KT, H), dtype=w1.dtype, buffer=nl.sbuf)
    for kt in nl.affine_range(KT):
      nisa.dma_copy(dst=w_sb[:, kt, :], src=w1[i, kt * P_MAX:(kt + 1) * P_MAX, :])
    h_ps = nl.ndarray((B, H), dtype=nl.float32, buffer=nl.psum)
    for kt in nl.affine_range(KT):
      nisa.nc_matmul(dst=h_ps, stationary=xT[:, kt, :], moving=w_sb[:, kt, :])
    act = nl.ndarray((B, H), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=act, op=nl.silu, data=h_ps)
    res = nl.ndarray((B, H), dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=res, data1=act, data2=x_sb, op=nl.add)

    resT = nl.ndarray((P_MAX, KT, B), dtype=x.dtype, buffer=nl.sbuf)
    for kt in nl.affine_range(KT):
      rT_ps = nl.ndarray((P_MAX, B), dtype=x.dtype, buffer=nl.psum)
      nisa.nc_transpose(dst=rT_ps, data=res[:, kt * P_MAX:(kt + 1) * P_MAX])
      nisa.tensor_copy(dst=resT[:, kt, :], src=rT_ps)

    logits = nl.ndarray((B, V), dtype=nl.float32, buffer=nl.sbuf)
    for v in nl.affine_range(NV):
      lg_ps = nl.ndarray((B, 512), dtype=nl.float32, buffer=nl.psum)
      for kt in nl.affine_range(KT):
        nisa.nc_matmul(dst=lg_ps, stationary=resT[:, kt, :], moving=wv[:, kt, v * 512:(v + 1) * 512])
      nisa.tensor_copy(dst=logits[:, v * 512:(v + 1) * 512], src=lg_ps)

    tv = nl.ndarray((B, k), dtype=nl.float32, buffer=nl.sbuf)
    ti = nl.ndarray((B, k), dtype=nl.uint32, buffer=nl.sbuf)
    for r in nl.static_range(k // 8):
      nisa.max8(dst=tv[:, r * 8:(r + 1) * 8], src=logits)
      nisa.nc_find_index8(dst=ti[:, r * 8:(r + 1) * 8], data=logits, vals=tv[:, r * 8:(r + 1) * 8])
      if r + 1 < k // 8:
        nisa.nc_match_replace8(dst=logits, data=logits, vals=tv[:, r * 8:(r + 1) * 8], imm=NEG)
    nisa.dma_copy(dst=values[i], src=tv)
    nisa.dma_copy(dst=ids[i], src=ti)
  return values, ids


@nki.jit
def rejection_sample_new(draft_probs, target_probs, draft_ids, uniforms):
  """The speculative-sampling rule (as ``rejection_sample`` of the Beta-1 file) written the new way: p_i[t_i] and
  q_i[t_i] gathered by one-element indirect DMAs (flat index i * V + t_i from ``nisa.iota`` with
  ``channel_multiplier=V``), the accept bits transposed onto one partition and their running product by
  ``nisa.tensor_scalar_cumulative`` (op1 = multiply), n = its sum; the rows p_n and q_n loaded by DMAs with a
  runtime row (``.ap(scalar_offset=n)``) spread over the 128 partitions as [128, V / 128] (q's row clamped to
  K - 1 and multiplied by [n < K]), max(0, p - q), per-partition sums and a ones-matmul for the total on every
  partition, then the normalised row. Returns n [1, 1] int32 and the residual [1, V] fp32."""
  K, V = draft_probs.shape
  K1 = K + 1
  assert target_probs.shape == (K1, V) and K1 <= P_MAX and V % P_MAX == 0
  F = V // P_MAX
  num_accepted = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.shared_hbm)
  residual = nl.ndarray((1, V), dtype=nl.float32, buffer=nl.shared_hbm)

  ids = nl.ndarray((K, 1), dtype=nl.int32, buffer=nl.sbuf)
  nisa.dma_copy(dst=ids, src=draft_ids.reshape((K, 1)))
  row0 = nl.ndarray((K, 1), dtype=nl.int32, buffer=nl.sbuf)
  nisa.iota(dst=row0, pattern=[[0, 1]], offset=0, channel_multiplier=V)
  flat_idx = nl.ndarray((K, 1), dtype=nl.int32, buffer=nl.sbuf)
  nisa.tensor_tensor(dst=flat_idx, data1=row0, data2=ids, op=nl.add)
  p_t = nl.ndarray((K, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.dma_copy(dst=p_t, src=target_probs.reshape((K1 * V, 1)).ap(pattern=[[1, K], [1, 1]], vector_offset=flat_idx,
                                                                    indirect_dim=0))
  q_t = nl.ndarray((K, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.dma_copy(dst=q_t, src=draft_probs.reshape((K * V, 1)).ap(pattern=[[1, K], [1, 1]], vector_offset=flat_idx,
                                                                  indirect_dim=0))
  u = nl.ndarray((K, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.dma_copy(dst=u, src=uniforms.reshape((K, 1)))

  # accept_i = u_i < min(1, p / q)
  ratio = nl.ndarray((K, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_tensor(dst=ratio, data1=p_t, data2=q_t, op=nl.divide)
  nisa.tensor_scalar(dst=ratio, data=ratio, op0=nl.minimum, operand0=1.0)
  accept = nl.ndarray((K, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_tensor(dst=accept, data1=u, data2=ratio, op=nl.less)

  acc_ps = nl.ndarray((1, K), dtype=nl.float32, buffer=nl.psum)
  nisa.nc_transpose(dst=acc_ps, data=accept)
  acc_row = nl.ndarray((1, K), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_copy(dst=acc_row, src=acc_ps)
  alive = nl.ndarray((1, K), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_scalar_cumulative(dst=alive, src=acc_row, op0=nl.multiply, op1=nl.multiply, imm0=1.0,
                                reduce_cmd=nisa.reduce_cmd.reset_reduce)
  n_f = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_reduce(dst=n_f, op=nl.add, data=alive, axis=1)
  n_i = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
  nisa.tensor_copy(dst=n_i, src=n_f)
  nisa.dma_copy(dst=num_accepted, src=n_i)

  # rows p_n and q_min(n, K-1) spread over the partitions
  nq_i = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
  nisa.tensor_scalar(dst=nq_i, data=n_i, op0=nl.minimum, operand0=K - 1)
  p_row = nl.ndarray((P_MAX, F), dtype=nl.float32, buffer=nl.sbuf)
  nisa.dma_copy(dst=p_row, src=target_probs.ap(pattern=[[F, P_MAX], [1, F]], offset=0, scalar_offset=n_i,
                                               indirect_dim=0))
  q_row = nl.ndarray((P_MAX, F), dtype=nl.float32, buffer=nl.sbuf)
  nisa.dma_copy(dst=q_row, src=draft_probs.ap(pattern=[[F, P_MAX], [1, F]], offset=0, scalar_offset=nq_i,
                                              indirect_dim=0))
  # [n < K] on every partition: a ones matmul broadcasts the (1, 1) flag
  flag = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_scalar(dst=flag, data=n_f, op0=nl.less, operand0=float(K))
  ones_row = nl.ndarray((1, P_MAX), dtype=nl.float32, buffer=nl.sbuf)
  nisa.memset(dst=ones_row, value=1.0)
  flag_ps = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.psum)
  nisa.nc_matmul(dst=flag_ps, stationary=ones_row, moving=flag)
  flag_b = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_copy(dst=flag_b, src=flag_ps)

  diff = nl.ndarray((P_MAX, F), dtype=nl.float32, buffer=nl.sbuf)
  nisa.scalar_tensor_tensor(dst=diff, data=q_row, op0=nl.multiply, operand0=flag_b, op1=nl.subtract,
                            operand1=p_row, reverse1=True)
  part = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_scalar_reduce(dst=diff, data=diff, op0=nl.maximum, operand0=0.0, reduce_op=nl.add, reduce_res=part)
  ones = nl.ndarray((P_MAX, P_MAX), dtype=nl.float32, buffer=nl.sbuf)
  nisa.memset(dst=ones, value=1.0)
  tot_ps = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.psum)
  nisa.nc_matmul(dst=tot_ps, stationary=ones, moving=part)
  inv = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.reciprocal(dst=inv, data=tot_ps)
  res = nl.ndarray((P_MAX, F), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_scalar(dst=res, data=diff, op0=nl.multiply, operand0=inv)
  nisa.dma_copy(dst=residual.reshape((P_MAX, F)), src=res)
  return num_accepted, residual


@nki.jit
def kv_compact_padded(k_cache, v_cache, k_scratch, v_scratch, accepted, num_accepted, cache_len):
  """``kv_compact`` with a runtime count: ``accepted`` [K] int32 lists the accepted scratch rows first, padded
  with -1; ``num_accepted`` [1] int32. All K slots are moved by the same two indirect DMAs per cache with
  ``oob_mode=skip``: padding rows (-1) are skipped by the gather, and their destination is set out of range
  (S_max) so the scatter skips them too (dst row = p < n ? cache_len + p : S_max, computed in int32)."""
  S_max, Hkv, d = k_cache.shape
  K = k_scratch.shape[0]
  assert accepted.shape[0] == K and K <= P_MAX
  row = Hkv * d
  kc = k_cache.reshape((S_max, row))
  vc = v_cache.reshape((S_max, row))
  ks = k_scratch.reshape((K, row))
  vs = v_scratch.reshape((K, row))

  src_rows = nl.ndarray((K, 1), dtype=nl.int32, buffer=nl.sbuf)
  nisa.dma_copy(dst=src_rows, src=accepted.reshape((K, 1)))
  base = nl.ndarray((K, 1), dtype=nl.int32, buffer=nl.sbuf)
  nisa.dma_copy(dst=base, src=cache_len.reshape((1, 1)).ap(pattern=[[0, K], [1, 1]]))
  n_b = nl.ndarray((K, 1), dtype=nl.int32, buffer=nl.sbuf)
  nisa.dma_copy(dst=n_b, src=num_accepted.reshape((1, 1)).ap(pattern=[[0, K], [1, 1]]))
  lane = nl.ndarray((K, 1), dtype=nl.int32, buffer=nl.sbuf)
  nisa.iota(dst=lane, pattern=[[0, 1]], offset=0, channel_multiplier=1)
  valid = nl.ndarray((K, 1), dtype=nl.int32, buffer=nl.sbuf)
  nisa.tensor_tensor(dst=valid, data1=lane, data2=n_b, op=nl.less)
  # (cache_len + p - S_max) * valid + S_max
  dst_rows = nl.ndarray((K, 1), dtype=nl.int32, buffer=nl.sbuf)
  nisa.tensor_tensor(dst=dst_rows, data1=base, data2=lane, op=nl.add)
  nisa.tensor_scalar(dst=dst_rows, data=dst_rows, op0=nl.subtract, operand0=S_max)
  nisa.tensor_tensor(dst=dst_rows, data1=dst_rows, data2=valid, op=nl.multiply)
  nisa.tensor_scalar(dst=dst_rows, data=dst_rows, op0=nl.add, operand0=S_max)

  for cache, scratch in ((kc, ks), (vc, vs)):
    rows = nl.ndarray((K, row), dtype=scratch.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=rows, src=scratch.ap(pattern=[[row, K], [1, row]], vector_offset=src_rows, indirect_dim=0),
                  oob_mode=nisa.oob_mode.skip)
    nisa.dma_copy(dst=cache.ap(pattern=[[row, K], [1, row]], vector_offset=dst_rows, indirect_dim=0), src=rows,
                  oob_mode=nisa.oob_mode.skip)
  return k_cache, v_cache


@nki.jit
def verify_attention_paged(q, k_cache, v_cache, block_table, context_len, k_draft, v_draft, tree_mask=None):
  """``verify_attention`` over a paged KV cache (vLLM layout, keys transposed per block): k_cache
  [num_blocks, Hkv, d, 128], v_cache [num_blocks, Hkv, 128, d], the sequence's blocks listed by the int32
  ``block_table`` [NB] and its length by the int32 ``context_len`` [1], both read at run time. Each block is
  fetched by a DMA whose start is the block id (``.ap(scalar_offset=block_table[b], indirect_dim=0)``); keys at
  positions >= context_len are masked (``nisa.iota`` of the position compared with the length on every
  partition by ``tensor_scalar``, turned into an additive bias)."""
  Hq, d, K = q.shape
  _, Hkv, d_, BS = k_cache.shape
  NB = block_table.shape[0]
  assert d == d_ and BS == P_MAX and Hq % Hkv == 0
  G = Hq // Hkv
  GK = G * K
  assert GK <= P_MAX
  scale = 1.0 / (d ** 0.5)
  out = nl.ndarray((Hq, K, d), dtype=q.dtype, buffer=nl.shared_hbm)

  draft_bias = _draft_bias(tree_mask, G, K)

  bt = nl.ndarray((1, NB), dtype=nl.int32, buffer=nl.sbuf)
  nisa.dma_copy(dst=bt, src=block_table.reshape((1, NB)))
  ctx = nl.ndarray((GK, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.dma_copy(dst=ctx, src=context_len.reshape((1, 1)).ap(pattern=[[0, GK], [1, 1]]))

  # additive bias of every block: 0 where the key position is < context_len, NEG after
  cache_bias = nl.ndarray((GK, NB, P_MAX), dtype=nl.float32, buffer=nl.sbuf)
  pos = nl.ndarray((GK, NB, P_MAX), dtype=nl.float32, buffer=nl.sbuf)
  nisa.iota(dst=pos, pattern=[[P_MAX, NB], [1, P_MAX]], offset=0, channel_multiplier=0)
  nisa.tensor_scalar(dst=cache_bias, data=pos, op0=nl.less, operand0=ctx, op1=nl.subtract, operand1=1.0)
  nisa.tensor_scalar(dst=cache_bias, data=cache_bias, op0=nl.multiply, operand0=-NEG)

  for h in nl.affine_range(Hkv):
    qT = nl.ndarray((d, GK), dtype=q.dtype, buffer=nl.sbuf)
    for g in nl.static_range(G):
      nisa.dma_copy(dst=qT[:, g * K:(g + 1) * K], src=q[h * G + g])
    m = nl.ndarray((GK, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=m, value=NEG)
    l = nl.ndarray((GK, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=l, value=0.0)
    acc = nl.ndarray((GK, d), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=acc, value=0.0)

    for b in nl.sequential_range(NB):
      kT = nl.ndarray((d, P_MAX), dtype=k_cache.dtype, buffer=nl.sbuf)
      nisa.dma_copy(dst=kT, src=k_cache.ap(pattern=[[P_MAX, d], [1, P_MAX]], offset=h * d * P_MAX,
                                           scalar_offset=bt[0:1, b:b + 1], indirect_dim=0))
      v_sb = nl.ndarray((P_MAX, d), dtype=v_cache.dtype, buffer=nl.sbuf)
      nisa.dma_copy(dst=v_sb, src=v_cache.ap(pattern=[[d, P_MAX], [1, d]], offset=h * P_MAX * d,
                                             scalar_offset=bt[0:1, b:b + 1], indirect_dim=0))
      s_ps = nl.ndarray((GK, P_MAX), dtype=nl.float32, buffer=nl.psum)
      nisa.nc_matmul(dst=s_ps, stationary=qT, moving=kT)
      s = nl.ndarray((GK, P_MAX), dtype=nl.float32, buffer=nl.sbuf)
      nisa.tensor_tensor(dst=s, data1=s_ps, data2=cache_bias[:, b, :], op=nl.add)
      _online_block(s, P_MAX, v_sb, m, l, acc, GK, d, scale, v_cache.dtype)

    kdT = nl.ndarray((d, K), dtype=k_draft.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=kdT, src=k_draft[h])
    vd = nl.ndarray((K, d), dtype=v_draft.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=vd, src=v_draft[h])
    sd_ps = nl.ndarray((GK, K), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=sd_ps, stationary=qT, moving=kdT)
    sd = nl.ndarray((GK, K), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=sd, data1=sd_ps, data2=draft_bias, op=nl.add)
    _online_block(sd, K, vd, m, l, acc, GK, d, scale, v_draft.dtype)

    inv_l = nl.ndarray((GK, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.reciprocal(dst=inv_l, data=l)
    o = nl.ndarray((GK, d), dtype=q.dtype, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=o, data=acc, op0=nl.multiply, operand0=inv_l)
    for g in nl.static_range(G):
      nisa.dma_copy(dst=out[h * G + g], src=o[g * K:(g + 1) * K, :])
  return out


@nki.jit
def verify_attention_dyn(q, k_cache, v_cache, k_draft, v_draft, num_blocks, tree_mask=None):
  """``verify_attention`` with a runtime trip count: the number of valid 128-key cache blocks is the int32
  ``num_blocks`` [1] read into a sequencer register (``nisa.register_load``), and the cache loop is
  ``nl.dynamic_range`` over it (the blocks sliced with the loop register). The draft block goes first, so the
  running max is finite whatever the count (also 0: a fresh sequence)."""
  Hq, d, K = q.shape
  Hkv, _, S_max = k_cache.shape
  G = Hq // Hkv
  GK = G * K
  assert GK <= P_MAX and S_max % P_MAX == 0
  scale = 1.0 / (d ** 0.5)
  out = nl.ndarray((Hq, K, d), dtype=q.dtype, buffer=nl.shared_hbm)
  draft_bias = _draft_bias(tree_mask, G, K)
  nblk = nisa.register_alloc()
  nisa.register_load(nblk, num_blocks.reshape((1, 1)))

  for h in nl.affine_range(Hkv):
    qT = nl.ndarray((d, GK), dtype=q.dtype, buffer=nl.sbuf)
    for g in nl.static_range(G):
      nisa.dma_copy(dst=qT[:, g * K:(g + 1) * K], src=q[h * G + g])
    m = nl.ndarray((GK, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=m, value=NEG)
    l = nl.ndarray((GK, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=l, value=0.0)
    acc = nl.ndarray((GK, d), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=acc, value=0.0)

    kdT = nl.ndarray((d, K), dtype=k_draft.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=kdT, src=k_draft[h])
    vd = nl.ndarray((K, d), dtype=v_draft.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=vd, src=v_draft[h])
    sd_ps = nl.ndarray((GK, K), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=sd_ps, stationary=qT, moving=kdT)
    sd = nl.ndarray((GK, K), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=sd, data1=sd_ps, data2=draft_bias, op=nl.add)
    _online_block(sd, K, vd, m, l, acc, GK, d, scale, v_draft.dtype)

    for b in nl.dynamic_range(nblk):
      kT = nl.ndarray((d, P_MAX), dtype=k_cache.dtype, buffer=nl.sbuf)
      nisa.dma_copy(dst=kT, src=k_cache[h, :, b * P_MAX:(b + 1) * P_MAX])
      v_sb = nl.ndarray((P_MAX, d), dtype=v_cache.dtype, buffer=nl.sbuf)
      nisa.dma_copy(dst=v_sb, src=v_cache[h, b * P_MAX:(b + 1) * P_MAX, :])
      s_ps = nl.ndarray((GK, P_MAX), dtype=nl.float32, buffer=nl.psum)
      nisa.nc_matmul(dst=s_ps, stationary=qT, moving=kT)
      _online_block(s_ps, P_MAX, v_sb, m, l, acc, GK, d, scale, v_cache.dtype)

    inv_l = nl.ndarray((GK, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.reciprocal(dst=inv_l, data=l)
    o = nl.ndarray((GK, d), dtype=q.dtype, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=o, data=acc, op0=nl.multiply, operand0=inv_l)
    for g in nl.static_range(G):
      nisa.dma_copy(dst=out[h * G + g], src=o[g * K:(g + 1) * K, :])
  return out
