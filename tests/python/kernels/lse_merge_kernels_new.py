"""Partial-softmax merges in the new NKI dialect (``import nki``, ISA calls writing ``dst=``), written the way the
public flash-decoding / context-parallel / ring-attention ports for trn2 write them:

- ``flash_decode_splits(q, k_cache, v_cache, num_splits)``: token generation with the KV cache split along the
  sequence (flash-decoding). q [B, Hq, d] (one token per sequence), k_cache [B, Hkv, d, S] (the transposed K cache
  NxDI keeps for token generation), v_cache [B, Hkv, S, d]; GQA: the G = Hq / Hkv query heads of a kv head sit on
  G partitions. Each split of S / num_splits keys runs an online softmax over blocks of up to 512 keys (scores
  [G, 512] in one PSUM bank, p^T in 128-key pieces by ``nc_transpose``) and writes its normalised
  o_partial [B, Hq, P, d] fp32 and lse_partial [B, Hq, P] fp32 to HBM (the scratch the combine kernel reads;
  ``lse_combine`` in lse_merge_kernels.py is the second kernel).
- ``flash_decode_lnc2(q, k_cache, v_cache, num_splits, combine)``: the same splits and their combine in one
  kernel. Launched as ``kernel[2]`` each core runs half of the splits; ``combine="barrier"`` writes the partials
  (o and lse packed as [B, Hq, P, d + 1]) to a shared HBM scratch, meets the other core at
  ``nisa.core_barrier`` and combines the (b, kv head) groups g with g % 2 == core; ``combine="sendrecv"`` exchanges
  the SBUF partials by one ``nisa.sendrecv``. Without a grid, one core runs every split. Returns out [B, Hq, d]
  (q dtype) and lse [B, Hq] fp32.
- ``ring_attention_merge(qT, kT_chunks, v_chunks, q_block, causal)``: one query block [128 rows] of a ring-attention
  step per head (q in the transposed layout [H, d, 128]); the KV chunks that arrive from the other devices are
  the successive HBM inputs kT_chunks [C, H, d, Sk] / v_chunks [C, H, Sk, d]. Each chunk's partial (block_out,
  block_lse) is merged into the running (out, lse) as ring-flash-attn's ``_update_out_and_lse`` does it:
  out -= sigmoid(block_lse - lse) * (out - block_out); lse -= logsigmoid(lse - block_lse). Causal: the query
  block is block ``q_block`` of the global sequence; chunks past it are skipped, the diagonal chunk is masked by
  ``nisa.affine_select``. Returns out [H, 128, d] and lse [H, 128] fp32.
- ``vocab_log_softmax(logits, two_pass)``: log-softmax (and logsumexp) over a large vocabulary, rows of tokens on
  the partitions, the vocabulary in tiles of 2048 (ragged last tile). One-pass statistics: running max and running
  sum of exp rescaled by exp(m_old - m_new) per tile (``activation`` exp with ``bias=-max`` and ``reduce_res=``);
  ``two_pass=True`` takes the row max in a first pass and accumulates sum exp(x - max) across tiles in ScalarE's
  accumulation registers (``reduce_cmd`` reset_reduce then reduce) in a second. Then x - lse is written in bf16.
  Returns logp [N, V] bf16 and lse [N] fp32.

Written for nsim's tests in the style of those kernels; not copies of any file. No nsim imports.
"""
import nki
import nki.isa as nisa
import nki.language as nl

P_MAX = 128
BLK = 512
V_TILE = 2048
NEG = -3.0e38


def _programs():
  if nl.program_ndim() == 0:
    return 1, 0
  return nl.num_programs(axes=0), nl.program_id(axis=0)


def _load_qT(q, b, h0, G, d, scale):
  """q[b, h0:h0+G, :] as qT [d, G] (SBUF, q dtype) pre-multiplied by the softmax scale."""
  q_sb = nl.ndarray((G, d), dtype=q.dtype, buffer=nl.sbuf)
  nisa.dma_copy(dst=q_sb, src=q[b, h0:h0 + G, :])
  qT_ps = nl.ndarray((d, G), dtype=q.dtype, buffer=nl.psum)
  nisa.nc_transpose(dst=qT_ps, data=q_sb)
  qT = nl.ndarray((d, G), dtype=q.dtype, buffer=nl.sbuf)
  nisa.activation(dst=qT, op=nl.copy, data=qT_ps, scale=scale)
  return qT


def _split_partial(qT, k_cache, v_cache, b, kvh, s0, L, G, d, o_dst, lse_dst):
  """Online softmax of the G query rows of qT over keys [s0, s0 + L) of kv head kvh: the normalised output
  into o_dst [G, d] and its logsumexp into lse_dst [G, 1] (both fp32 views)."""
  blk = min(BLK, L)
  assert L % blk == 0 and blk % P_MAX == 0
  m = nl.ndarray((G, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.memset(dst=m, value=NEG)
  l = nl.ndarray((G, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.memset(dst=l, value=0.0)
  acc = nl.ndarray((G, d), dtype=nl.float32, buffer=nl.sbuf)
  nisa.memset(dst=acc, value=0.0)
  for j in nl.sequential_range(L // blk):
    k0 = s0 + j * blk
    kT = nl.ndarray((d, blk), dtype=k_cache.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=kT, src=k_cache[b, kvh, :, k0:k0 + blk])
    v_sb = nl.ndarray((P_MAX, blk // P_MAX, d), dtype=v_cache.dtype, buffer=nl.sbuf)
    for c in nl.affine_range(blk // P_MAX):
      nisa.dma_copy(dst=v_sb[:, c, :], src=v_cache[b, kvh, k0 + c * P_MAX:k0 + (c + 1) * P_MAX, :])

    s_ps = nl.ndarray((G, blk), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=s_ps, stationary=qT, moving=kT)
    bmax = nl.ndarray((G, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=bmax, op=nl.maximum, data=s_ps, axis=1)
    m_new = nl.ndarray((G, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=m_new, data1=m, data2=bmax, op=nl.maximum)
    neg = nl.ndarray((G, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=neg, data=m_new, op0=nl.multiply, operand0=-1.0)
    alpha = nl.ndarray((G, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=alpha, op=nl.exp, data=m, bias=neg)
    p = nl.ndarray((G, blk), dtype=v_cache.dtype, buffer=nl.sbuf)
    rs = nl.ndarray((G, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=p, op=nl.exp, data=s_ps, bias=neg, reduce_op=nl.add, reduce_res=rs,
                    reduce_cmd=nisa.reduce_cmd.reset_reduce)
    nisa.scalar_tensor_tensor(dst=l, data=l, op0=nl.multiply, operand0=alpha, op1=nl.add, operand1=rs)
    nisa.tensor_copy(dst=m, src=m_new)

    pv_ps = nl.ndarray((G, d), dtype=nl.float32, buffer=nl.psum)
    for c in nl.affine_range(blk // P_MAX):
      pT_ps = nl.ndarray((P_MAX, G), dtype=p.dtype, buffer=nl.psum)
      nisa.nc_transpose(dst=pT_ps, data=p[:, c * P_MAX:(c + 1) * P_MAX])
      pT = nl.ndarray((P_MAX, G), dtype=p.dtype, buffer=nl.sbuf)
      nisa.tensor_copy(dst=pT, src=pT_ps)
      nisa.nc_matmul(dst=pv_ps, stationary=pT, moving=v_sb[:, c, :])
    nisa.scalar_tensor_tensor(dst=acc, data=acc, op0=nl.multiply, operand0=alpha, op1=nl.add, operand1=pv_ps)

  inv = nl.ndarray((G, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.reciprocal(dst=inv, data=l)
  nisa.tensor_scalar(dst=o_dst, data=acc, op0=nl.multiply, operand0=inv)
  nisa.activation(dst=lse_dst, op=nl.log, data=l)
  nisa.tensor_tensor(dst=lse_dst, data1=lse_dst, data2=m, op=nl.add)


def _combine(parts, G, NP, d, o_dst, lse_dst):
  """parts [G, NP, d + 1] fp32 (per split: o then lse): o_dst [G, d] = sum_p w_p o_p / sum_p w_p with
  w_p = exp(lse_p - max lse); lse_dst [G, 1] = max lse + log(sum_p w_p)."""
  lse = parts[:, :, d]
  mx = nl.ndarray((G, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_reduce(dst=mx, op=nl.maximum, data=lse, axis=1)
  neg = nl.ndarray((G, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_scalar(dst=neg, data=mx, op0=nl.multiply, operand0=-1.0)
  w = nl.ndarray((G, NP), dtype=nl.float32, buffer=nl.sbuf)
  ws = nl.ndarray((G, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.activation(dst=w, op=nl.exp, data=lse, bias=neg, reduce_op=nl.add, reduce_res=ws,
                  reduce_cmd=nisa.reduce_cmd.reset_reduce)
  acc = nl.ndarray((G, d), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_scalar(dst=acc, data=parts[:, 0, 0:d], op0=nl.multiply, operand0=w[:, 0:1])
  for p in nl.sequential_range(1, NP):
    nisa.scalar_tensor_tensor(dst=acc, data=parts[:, p, 0:d], op0=nl.multiply, operand0=w[:, p:p + 1],
                              op1=nl.add, operand1=acc)
  inv = nl.ndarray((G, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.reciprocal(dst=inv, data=ws)
  nisa.tensor_scalar(dst=o_dst, data=acc, op0=nl.multiply, operand0=inv)
  nisa.activation(dst=lse_dst, op=nl.log, data=ws)
  nisa.tensor_tensor(dst=lse_dst, data1=lse_dst, data2=mx, op=nl.add)


@nki.jit
def flash_decode_splits(q, k_cache, v_cache, num_splits=4):
  B, Hq, d = q.shape
  _, Hkv, d_, S = k_cache.shape
  assert d == d_ and d <= P_MAX and Hq % Hkv == 0
  G = Hq // Hkv
  NP = num_splits
  assert S % NP == 0
  L = S // NP
  scale = 1.0 / (d ** 0.5)
  o_part = nl.ndarray((B, Hq, NP, d), dtype=nl.float32, buffer=nl.shared_hbm)
  lse_part = nl.ndarray((B, Hq, NP), dtype=nl.float32, buffer=nl.shared_hbm)
  for b in nl.affine_range(B):
    for kvh in nl.affine_range(Hkv):
      h0 = kvh * G
      qT = _load_qT(q, b, h0, G, d, scale)
      res = nl.ndarray((G, NP, d + 1), dtype=nl.float32, buffer=nl.sbuf)
      for sp in nl.affine_range(NP):
        _split_partial(qT, k_cache, v_cache, b, kvh, sp * L, L, G, d, res[:, sp, 0:d], res[:, sp, d:d + 1])
      nisa.dma_copy(dst=o_part[b, h0:h0 + G, :, :], src=res[:, :, 0:d])
      nisa.dma_copy(dst=lse_part[b, h0:h0 + G, :], src=res[:, :, d])
  return o_part, lse_part


@nki.jit
def flash_decode_lnc2(q, k_cache, v_cache, num_splits=4, combine="barrier"):
  B, Hq, d = q.shape
  _, Hkv, d_, S = k_cache.shape
  n_prg, pid = _programs()
  assert d == d_ and d <= P_MAX and Hq % Hkv == 0
  assert combine in ("barrier", "sendrecv")
  G = Hq // Hkv
  NG = B * Hkv
  NP = num_splits
  assert S % NP == 0 and NP % n_prg == 0
  L = S // NP
  NPh = NP // n_prg          # splits of this core
  sp0 = pid * NPh
  scale = 1.0 / (d ** 0.5)
  out = nl.ndarray((B, Hq, d), dtype=q.dtype, buffer=nl.shared_hbm)
  lse_out = nl.ndarray((B, Hq), dtype=nl.float32, buffer=nl.shared_hbm)

  # this core's partials of every (b, kv head) group: o and lse per split
  mine = nl.ndarray((G, NG, NPh, d + 1), dtype=nl.float32, buffer=nl.sbuf)
  for g in nl.affine_range(NG):
    b = g // Hkv
    kvh = g % Hkv
    qT = _load_qT(q, b, kvh * G, G, d, scale)
    for sp in nl.affine_range(NPh):
      _split_partial(qT, k_cache, v_cache, b, kvh, (sp0 + sp) * L, L, G, d, mine[:, g, sp, 0:d],
                     mine[:, g, sp, d:d + 1])

  peer = None
  if n_prg > 1:
    if combine == "barrier":
      scratch = nl.ndarray((B, Hq, NP, d + 1), dtype=nl.float32, buffer=nl.shared_hbm)
      for g in nl.affine_range(NG):
        h0 = (g % Hkv) * G
        nisa.dma_copy(dst=scratch[g // Hkv, h0:h0 + G, sp0:sp0 + NPh, :], src=mine[:, g, :, :])
      nisa.core_barrier(data=scratch, cores=(0, 1))
    else:
      peer = nl.ndarray((G, NG, NPh, d + 1), dtype=nl.float32, buffer=nl.sbuf)
      nisa.sendrecv(src=mine, dst=peer, send_to_rank=1 - pid, recv_from_rank=1 - pid, pipe_id=0)

  for g in nl.affine_range(NG):
    if g % n_prg != pid:
      continue
    b = g // Hkv
    h0 = (g % Hkv) * G
    if n_prg == 1:
      parts = mine[:, g, :, :]
    else:
      allp = nl.ndarray((G, NP, d + 1), dtype=nl.float32, buffer=nl.sbuf)
      if combine == "barrier":
        nisa.dma_copy(dst=allp, src=scratch[b, h0:h0 + G, :, :])
      else:
        nisa.tensor_copy(dst=allp[:, sp0:sp0 + NPh, :], src=mine[:, g, :, :])
        p0 = (1 - pid) * NPh
        nisa.tensor_copy(dst=allp[:, p0:p0 + NPh, :], src=peer[:, g, :, :])
      parts = allp
    o32 = nl.ndarray((G, d), dtype=nl.float32, buffer=nl.sbuf)
    lse = nl.ndarray((G, 1), dtype=nl.float32, buffer=nl.sbuf)
    _combine(parts, G, NP, d, o32, lse)
    o = nl.ndarray((G, d), dtype=q.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=o, src=o32)
    nisa.dma_copy(dst=out[b, h0:h0 + G, :], src=o)
    nisa.dma_copy(dst=lse_out[b, h0:h0 + G], src=lse)
  return out, lse_out


# ------------------------------------------------------------------------------------------------
# Ring attention: merge the running (out, lse) with each arriving chunk
# ------------------------------------------------------------------------------------------------

def _chunk_attention(qT, kT, v_sb, Sk, d, scale, mask_offset, bo_dst, blse_dst):
  """Softmax attention of the 128 query rows of qT [d, 128] over one chunk (kT [d, Sk], v_sb [128, Sk/128, d]):
  the normalised block_out into bo_dst [128, d] fp32 and block_lse into blse_dst [128, 1]. mask_offset is None
  (no mask) or q0 - k0 (keep key j of row i where j <= i + mask_offset)."""
  s_ps = nl.ndarray((P_MAX, Sk), dtype=nl.float32, buffer=nl.psum)
  nisa.nc_matmul(dst=s_ps, stationary=qT, moving=kT)
  s = nl.ndarray((P_MAX, Sk), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_scalar(dst=s, data=s_ps, op0=nl.multiply, operand0=scale)
  if mask_offset is not None:
    # i + mask_offset - j >= 0
    nisa.affine_select(dst=s, pattern=[[-1, Sk]], offset=mask_offset, channel_multiplier=1, on_true_tile=s,
                       on_false_value=NEG, cmp_op=nl.greater_equal)
  mx = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_reduce(dst=mx, op=nl.maximum, data=s, axis=1)
  neg = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_scalar(dst=neg, data=mx, op0=nl.multiply, operand0=-1.0)
  p = nl.ndarray((P_MAX, Sk), dtype=v_sb.dtype, buffer=nl.sbuf)
  rs = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.activation(dst=p, op=nl.exp, data=s, bias=neg, reduce_op=nl.add, reduce_res=rs,
                  reduce_cmd=nisa.reduce_cmd.reset_reduce)
  pv_ps = nl.ndarray((P_MAX, d), dtype=nl.float32, buffer=nl.psum)
  for c in nl.affine_range(Sk // P_MAX):
    pT_ps = nl.ndarray((P_MAX, P_MAX), dtype=p.dtype, buffer=nl.psum)
    nisa.nc_transpose(dst=pT_ps, data=p[:, c * P_MAX:(c + 1) * P_MAX])
    pT = nl.ndarray((P_MAX, P_MAX), dtype=p.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=pT, src=pT_ps)
    nisa.nc_matmul(dst=pv_ps, stationary=pT, moving=v_sb[:, c, :])
  inv = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.reciprocal(dst=inv, data=rs)
  nisa.tensor_scalar(dst=bo_dst, data=pv_ps, op0=nl.multiply, operand0=inv)
  nisa.activation(dst=blse_dst, op=nl.log, data=rs)
  nisa.tensor_tensor(dst=blse_dst, data1=blse_dst, data2=mx, op=nl.add)


@nki.jit
def ring_attention_merge(qT, kT_chunks, v_chunks, q_block=0, causal=False):
  H, d, Sq = qT.shape
  C, H_, d_, Sk = kT_chunks.shape
  assert Sq == P_MAX and H == H_ and d == d_ and Sk % P_MAX == 0 and Sk <= BLK
  scale = 1.0 / (d ** 0.5)
  q0 = q_block * Sq
  out = nl.ndarray((H, Sq, d), dtype=nl.float32, buffer=nl.shared_hbm)
  lse_out = nl.ndarray((H, Sq), dtype=nl.float32, buffer=nl.shared_hbm)
  for h in nl.affine_range(H):
    q_sb = nl.ndarray((d, Sq), dtype=qT.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=q_sb, src=qT[h])
    o = nl.ndarray((P_MAX, d), dtype=nl.float32, buffer=nl.sbuf)
    lse = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    first = True
    for c in nl.sequential_range(C):
      k0 = c * Sk
      if causal and k0 > q0 + Sq - 1:
        continue   # the chunk is entirely in the future of this query block
      mask = None
      if causal and k0 + Sk - 1 > q0:
        mask = q0 - k0
      kT = nl.ndarray((d, Sk), dtype=kT_chunks.dtype, buffer=nl.sbuf)
      nisa.dma_copy(dst=kT, src=kT_chunks[c, h])
      v_sb = nl.ndarray((P_MAX, Sk // P_MAX, d), dtype=v_chunks.dtype, buffer=nl.sbuf)
      for t in nl.affine_range(Sk // P_MAX):
        nisa.dma_copy(dst=v_sb[:, t, :], src=v_chunks[c, h, t * P_MAX:(t + 1) * P_MAX, :])
      if first:
        _chunk_attention(q_sb, kT, v_sb, Sk, d, scale, mask, o, lse)
        first = False
        continue
      bo = nl.ndarray((P_MAX, d), dtype=nl.float32, buffer=nl.sbuf)
      blse = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
      _chunk_attention(q_sb, kT, v_sb, Sk, d, scale, mask, bo, blse)
      # out = out - sigmoid(block_lse - lse) * (out - block_out)
      diff = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
      nisa.tensor_tensor(dst=diff, data1=blse, data2=lse, op=nl.subtract)
      sg = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
      nisa.activation(dst=sg, op=nl.sigmoid, data=diff)
      dlt = nl.ndarray((P_MAX, d), dtype=nl.float32, buffer=nl.sbuf)
      nisa.tensor_tensor(dst=dlt, data1=o, data2=bo, op=nl.subtract)
      nisa.scalar_tensor_tensor(dst=o, data=dlt, op0=nl.multiply, operand0=sg, op1=nl.subtract, operand1=o)
      nisa.tensor_scalar(dst=o, data=o, op0=nl.multiply, operand0=-1.0)
      # lse = lse - logsigmoid(lse - block_lse) = lse + log(1 + exp(block_lse - lse))
      ex = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
      nisa.activation(dst=ex, op=nl.exp, data=diff)
      sp = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
      nisa.activation(dst=sp, op=nl.log, data=ex, bias=1.0)
      nisa.tensor_tensor(dst=lse, data1=lse, data2=sp, op=nl.add)
    nisa.dma_copy(dst=out[h], src=o)
    nisa.dma_copy(dst=lse_out[h], src=lse)
  return out, lse_out


# ------------------------------------------------------------------------------------------------
# Log-softmax over a large vocabulary
# ------------------------------------------------------------------------------------------------

@nki.jit
def vocab_log_softmax(logits, two_pass=False):
  N, V = logits.shape
  NV = (V + V_TILE - 1) // V_TILE
  logp = nl.ndarray((N, V), dtype=nl.bfloat16, buffer=nl.shared_hbm)
  lse_out = nl.ndarray((N,), dtype=nl.float32, buffer=nl.shared_hbm)
  for r in nl.affine_range((N + P_MAX - 1) // P_MAX):
    r0 = r * P_MAX
    rows = min(P_MAX, N - r0)
    m = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    s = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    neg = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    if not two_pass:
      nisa.memset(dst=m[:rows], value=NEG)
      nisa.memset(dst=s[:rows], value=0.0)
      for j in nl.sequential_range(NV):
        c0 = j * V_TILE
        nc = min(V_TILE, V - c0)
        x = nl.ndarray((P_MAX, V_TILE), dtype=logits.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=x[:rows, :nc], src=logits[r0:r0 + rows, c0:c0 + nc])
        cm = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=cm[:rows], op=nl.maximum, data=x[:rows, :nc], axis=1)
        nisa.tensor_tensor(dst=cm[:rows], data1=cm[:rows], data2=m[:rows], op=nl.maximum)
        nisa.tensor_scalar(dst=neg[:rows], data=cm[:rows], op0=nl.multiply, operand0=-1.0)
        corr = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=corr[:rows], op=nl.exp, data=m[:rows], bias=neg[:rows])
        e = nl.ndarray((P_MAX, V_TILE), dtype=nl.bfloat16, buffer=nl.sbuf)
        ts = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=e[:rows, :nc], op=nl.exp, data=x[:rows, :nc], bias=neg[:rows], reduce_op=nl.add,
                        reduce_res=ts[:rows], reduce_cmd=nisa.reduce_cmd.reset_reduce)
        nisa.scalar_tensor_tensor(dst=s[:rows], data=s[:rows], op0=nl.multiply, operand0=corr[:rows],
                                  op1=nl.add, operand1=ts[:rows])
        nisa.tensor_copy(dst=m[:rows], src=cm[:rows])
      nisa.tensor_scalar(dst=neg[:rows], data=m[:rows], op0=nl.multiply, operand0=-1.0)
    else:
      tmax = nl.ndarray((P_MAX, NV), dtype=nl.float32, buffer=nl.sbuf)
      for j in nl.affine_range(NV):
        c0 = j * V_TILE
        nc = min(V_TILE, V - c0)
        x = nl.ndarray((P_MAX, V_TILE), dtype=logits.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=x[:rows, :nc], src=logits[r0:r0 + rows, c0:c0 + nc])
        nisa.tensor_reduce(dst=tmax[:rows, j:j + 1], op=nl.maximum, data=x[:rows, :nc], axis=1)
      nisa.tensor_reduce(dst=m[:rows], op=nl.maximum, data=tmax[:rows], axis=1)
      nisa.tensor_scalar(dst=neg[:rows], data=m[:rows], op0=nl.multiply, operand0=-1.0)
      for j in nl.sequential_range(NV):
        c0 = j * V_TILE
        nc = min(V_TILE, V - c0)
        x = nl.ndarray((P_MAX, V_TILE), dtype=logits.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=x[:rows, :nc], src=logits[r0:r0 + rows, c0:c0 + nc])
        e = nl.ndarray((P_MAX, V_TILE), dtype=nl.bfloat16, buffer=nl.sbuf)
        cmd = nisa.reduce_cmd.reset_reduce if j == 0 else nisa.reduce_cmd.reduce
        nisa.activation(dst=e[:rows, :nc], op=nl.exp, data=x[:rows, :nc], bias=neg[:rows], reduce_op=nl.add,
                        reduce_res=s[:rows], reduce_cmd=cmd)
    # lse = m + log(s); logp = x - lse
    lse = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=lse[:rows], op=nl.log, data=s[:rows])
    nisa.tensor_tensor(dst=lse[:rows], data1=lse[:rows], data2=m[:rows], op=nl.add)
    nlse = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=nlse[:rows], data=lse[:rows], op0=nl.multiply, operand0=-1.0)
    for j in nl.affine_range(NV):
      c0 = j * V_TILE
      nc = min(V_TILE, V - c0)
      x = nl.ndarray((P_MAX, V_TILE), dtype=logits.dtype, buffer=nl.sbuf)
      nisa.dma_copy(dst=x[:rows, :nc], src=logits[r0:r0 + rows, c0:c0 + nc])
      y = nl.ndarray((P_MAX, V_TILE), dtype=nl.bfloat16, buffer=nl.sbuf)
      nisa.activation(dst=y[:rows, :nc], op=nl.copy, data=x[:rows, :nc], bias=nlse[:rows])
      nisa.dma_copy(dst=logp[r0:r0 + rows, c0:c0 + nc], src=y[:rows, :nc])
    nisa.dma_copy(dst=lse_out[r0:r0 + rows], src=lse[:rows])
  return logp, lse_out
