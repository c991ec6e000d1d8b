"""Post-training losses in the Beta-1 dialect (``neuronxcc.nki``), written the way public NKI / Liger-Kernel-style
ports write them (arange index expressions with masks for the ragged token tile, value-returning ``nl``/``nisa``
calls, PSUM accumulation with ``+=``):

- ``flce_fwd_bwd(h, w, targets, ignore_index=-100, lse_square_scale=0.0, dw_in_hbm=False)``: Liger's fused
  linear cross-entropy. h [T, D] (D <= 512), the LM head w [V, D], targets [T] int32. The head is read once: its
  rows stay in SBUF ([V / 128, 128, D]) and its transpose [D / 128, 128, V] is made on the PE; the logits matmul
  contracts over ceil(D / 128) tiles of the hidden size, accumulated in PSUM. Per tile of 128 tokens (rows past T masked and
  zero): pass 1 over vocabulary chunks of 512 computes the logits h W^T into PSUM, an online max / sum of exp and the
  target logit (``nisa.iota`` column ids == target); pass 2 recomputes each chunk and forms the gradient of the
  logits g = (softmax * (1 + 2 c lse) - onehot) * keep / n (c = lse_square_scale, keep = target != ignore_index,
  n = the number of tokens that count, counted on chip by a ones matmul over the partitions), then
  dh = g W (g transposed per 128 columns on the PE, accumulated in PSUM over the vocabulary) and dW += g^T h
  (accumulated in fp32 in SBUF over the token tiles, stored once). The [T, V] logits never reach HBM.
  ``dw_in_hbm=True`` (fp32 heads) accumulates dW in HBM instead, as Liger's grad_weight: zeroed by stores, then one
  accumulating DMA (``nisa.dma_copy(..., dst_rmw_op=np.add)``) per (token tile, head block).
  Outputs: loss [1, 1] fp32 = sum over counted tokens of (lse - z_target + c lse^2) / n, dh [T, D] (h.dtype),
  dw [V, D] (w.dtype).
- ``preference_loss(policy_logits, labels, loss_mask, ref_logits=None, beta=0.1, loss_type="sigmoid",
  gamma=0.0, orpo_lambda=0.1)``: TRL-style preference losses from logits. logits [S, L, V] of S = 2B sequences
  (the B chosen first, then the B rejected, as TRL's concatenated forward), labels [S, L] int32, loss_mask [S, L]
  fp32 (1 on response tokens). Tokens flattened [S L, V] in tiles of 128 (ragged last tile masked); per token the
  log-probability of its label (z_label - lse, online over vocabulary chunks of 512, ragged last chunk); the masked
  per-sequence sums and token counts by matmuls of the tile's values with its token -> sequence one-hot
  (``nisa.iota`` of the token index minus L * sequence, two comparisons), accumulated in PSUM over the token tiles
  into one partition ([1, S]). Then on [1, B] rows: ``sigmoid`` DPO -log sigmoid(beta ((pc - rc) - (pr - rr)))
  (sums; needs ref_logits); ``simpo`` -log sigmoid(beta (pc / nc - pr / nr) - gamma) (length-normalised, no
  reference); ``orpo`` NLL of the chosen (-pc / nc) + lambda * -log sigmoid(log odds), log odds =
  (ac - ar) - (log(1 - exp(ac)) - log(1 - exp(ar))), a = the length-normalised logps. Outputs: losses [1, B],
  chosen_rewards [1, B], rejected_rewards [1, B] (DPO: beta (pc - rc); SimPO / ORPO: beta ac / beta ar), policy
  logps [1, S] (the masked sums).
- ``grpo_loss_nl(logp, old_logp, ref_logp, advantages, mask, eps=0.2, beta=0.04)``: the GRPO clipped surrogate with
  the k3 KL penalty written with ``nl`` tile operators (``ratio * a`` with a [128, 1] advantage column broadcast,
  ``nl.minimum`` / ``nl.maximum`` with scalars, ``nl.sum(..., axis=1)``), whole rows of L tokens per tile of 128
  sequences (ragged last tile masked). Outputs per_token [B, L] fp32, seq_loss [B, 1] fp32 (masked token mean) and
  loss [1, 1] (their mean, a ones matmul over the partitions accumulated in PSUM over the tiles).
- ``ppo_gae(rewards, values, gamma=0.99, lam=0.95)``: PPO's generalised advantage estimation on chip. rewards,
  values [B, L] (sequences on the partitions, ragged last tile masked); the tokens are loaded time-reversed
  (``x[b, L - 1 - i_l]``, a negative arange coefficient) so the backward recursion A_t = delta_t + gamma lam A_{t+1}
  (delta_t = r_t + gamma V_{t+1} - V_t, V_L = 0; V_{t+1} by a second reversed load shifted by one, its first column
  masked and zero) is one forward ``nisa.tensor_tensor_scan`` (multiply by gamma lam, add delta); advantages and
  returns (A + V) stored back time-reversed. Outputs adv [B, L], returns [B, L] fp32.

Written for nsim's tests in the style of those kernels; not copies of any file. No nsim imports.
"""
import numpy as np

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl

PMAX = 128
V_CHUNK = 512
NEG_BIG = -3.0e38


@nki.jit
def flce_fwd_bwd(h, w, targets, ignore_index=-100, lse_square_scale=0.0, dw_in_hbm=False):
  T, D = h.shape
  V, D_ = w.shape
  assert D == D_ and D <= 512 and V < 2 ** 24  # dh [128, D] and dW blocks [128, D] fp32 in one PSUM bank
  NT = (T + PMAX - 1) // PMAX
  NV = (V + V_CHUNK - 1) // V_CHUNK
  NB = (V + PMAX - 1) // PMAX
  KD = (D + PMAX - 1) // PMAX  # contraction tiles of the logits matmul

  loss = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.shared_hbm)
  dh = nl.ndarray((T, D), dtype=h.dtype, buffer=nl.shared_hbm)
  dw = nl.ndarray((V, D), dtype=w.dtype, buffer=nl.shared_hbm)

  i_p = nl.arange(PMAX)[:, None]
  i_q = nl.arange(PMAX)[None, :]
  i_d = nl.arange(D)[None, :]
  i_dp = nl.arange(D)[:, None]
  i_0 = nl.arange(1)[None, :]
  i_c = nl.arange(V_CHUNK)[None, :]
  tg2 = targets.reshape((T, 1))

  # column ids 0..V_CHUNK-1 on every partition
  col_ids = nisa.iota(i_p * 0 + i_c, dtype=nl.float32)
  ones = nl.ones((PMAX, PMAX), dtype=nl.float32)

  # the LM head, resident: rows [NB, 128, D] and its transpose [KD, 128, V] (PE transposes)
  w_rows = nl.ndarray((NB, nl.par_dim(PMAX), D), dtype=w.dtype, buffer=nl.sbuf)
  wT = nl.ndarray((KD, nl.par_dim(PMAX), V), dtype=w.dtype, buffer=nl.sbuf)
  for j in nl.static_range(NB):
    vr = min(PMAX, V - j * PMAX)
    w_rows[j, 0:vr, 0:D] = nl.load(w[j * PMAX:j * PMAX + vr, 0:D])
    for k in nl.static_range(KD):
      dk = min(PMAX, D - k * PMAX)
      wT_ps = nisa.nc_transpose(w_rows[j, 0:vr, k * PMAX:k * PMAX + dk])
      wT[k, 0:dk, j * PMAX:j * PMAX + vr] = nl.copy(wT_ps, dtype=w.dtype)

  # n = number of tokens whose target is not ignore_index, on every partition
  cnt_ps = nl.zeros((PMAX, 1), dtype=nl.float32, buffer=nl.psum)
  for t in nl.affine_range(NT):
    valid = t * PMAX + i_p < T
    tg = nl.load(tg2[t * PMAX + i_p, i_0], mask=valid)
    keep = nl.zeros((PMAX, 1), dtype=nl.float32)
    keep[i_p, i_0] = nl.not_equal(tg, ignore_index, dtype=nl.float32, mask=valid)
    cnt_ps += nisa.nc_matmul(ones, keep)
  inv_n = nl.reciprocal(nl.maximum(cnt_ps, 1.0))

  if dw_in_hbm:  # dW accumulated in HBM by accumulating DMAs (Liger's grad_weight), zeroed first
    assert w.dtype == nl.float32
    zero = nl.zeros((PMAX, D), dtype=nl.float32)
    for j in nl.static_range(NB):
      vr = min(PMAX, V - j * PMAX)
      nl.store(dw[j * PMAX:j * PMAX + vr, 0:D], value=zero[0:vr, 0:D])
  else:
    dw_acc = nl.zeros((NB, nl.par_dim(PMAX), D), dtype=nl.float32, buffer=nl.sbuf)
  loss_acc = nl.zeros((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)

  for t in nl.sequential_range(NT):
    valid = t * PMAX + i_p < T
    x = nl.zeros((PMAX, D), dtype=h.dtype)
    x[i_p, i_d] = nl.load(h[t * PMAX + i_p, i_d], mask=valid)
    xT = nl.ndarray((KD, nl.par_dim(PMAX), PMAX), dtype=h.dtype, buffer=nl.sbuf)
    for k in nl.static_range(KD):
      dk = min(PMAX, D - k * PMAX)
      xT[k, 0:dk, 0:PMAX] = nl.copy(nisa.nc_transpose(x[0:PMAX, k * PMAX:k * PMAX + dk]), dtype=h.dtype)
    tg = nl.zeros((PMAX, 1), dtype=nl.int32)
    tg[i_p, i_0] = nl.load(tg2[t * PMAX + i_p, i_0], mask=valid)
    tgf = nl.copy(tg, dtype=nl.float32)
    keep = nl.zeros((PMAX, 1), dtype=nl.float32)
    keep[i_p, i_0] = nl.not_equal(tg, ignore_index, dtype=nl.float32, mask=valid)

    # pass 1: online log-sum-exp and the target logit
    m = nl.full((PMAX, 1), NEG_BIG, dtype=nl.float32)
    s = nl.zeros((PMAX, 1), dtype=nl.float32)
    zt = nl.zeros((PMAX, 1), dtype=nl.float32)
    for c in nl.static_range(NV):
      v0 = c * V_CHUNK
      vc = min(V_CHUNK, V - v0)
      z = nl.zeros((PMAX, vc), dtype=nl.float32, buffer=nl.psum)
      for k in nl.static_range(KD):
        dk = min(PMAX, D - k * PMAX)
        z += nisa.nc_matmul(xT[k, 0:dk, 0:PMAX], wT[k, 0:dk, v0:v0 + vc])
      m_new = nl.maximum(m, nisa.tensor_reduce(np.max, z, axis=(1,), keepdims=True))
      neg_m = nl.negative(m_new)
      csum = nl.ndarray((PMAX, 1), dtype=nl.float32)
      nisa.activation_reduce(op=nl.exp, data=z, bias=neg_m, reduce_op=nl.add, reduce_res=csum)
      alpha = nisa.activation(op=nl.exp, data=m, bias=neg_m)
      s[...] = nisa.scalar_tensor_tensor(data=s, op0=nl.multiply, operand0=alpha, op1=nl.add, operand1=csum)
      m[...] = nl.copy(m_new)
      onehot = nisa.tensor_scalar(col_ids[0:PMAX, 0:vc], op0=nl.equal, operand0=nl.add(tgf, -1.0 * v0))
      hit = nisa.tensor_tensor(onehot, z, op=nl.multiply)
      zt[...] = nl.add(zt, nisa.tensor_reduce(np.add, hit, axis=(1,), keepdims=True))

    lse = nl.add(nl.log(s), m)
    # per-token loss (lse - z_target + c lse^2) of the counted tokens
    tok = nl.add(nl.subtract(lse, zt), nl.multiply(nl.multiply(lse, lse), lse_square_scale))
    loss_acc[...] = nl.add(loss_acc, nl.multiply(tok, keep))

    # pass 2: g = (softmax (1 + 2 c lse) - onehot) keep / n; dh = g W, dW += g^T h
    neg_lse = nl.negative(lse)
    pscale = nl.add(nl.multiply(lse, 2.0 * lse_square_scale), 1.0)
    rscale = nl.multiply(keep, inv_n)
    dh_ps = nl.zeros((PMAX, D), dtype=nl.float32, buffer=nl.psum)
    for c in nl.static_range(NV):
      v0 = c * V_CHUNK
      vc = min(V_CHUNK, V - v0)
      z = nl.zeros((PMAX, vc), dtype=nl.float32, buffer=nl.psum)
      for k in nl.static_range(KD):
        dk = min(PMAX, D - k * PMAX)
        z += nisa.nc_matmul(xT[k, 0:dk, 0:PMAX], wT[k, 0:dk, v0:v0 + vc])
      p = nisa.activation(op=nl.exp, data=z, bias=neg_lse, scale=1.0)
      p = nl.multiply(p, pscale)
      onehot = nisa.tensor_scalar(col_ids[0:PMAX, 0:vc], op0=nl.equal, operand0=nl.add(tgf, -1.0 * v0))
      g = nisa.tensor_tensor(p, onehot, op=nl.subtract)
      g = nl.multiply(g, rscale, dtype=w.dtype)
      for b in nl.static_range((vc + PMAX - 1) // PMAX):
        j = (v0 + b * PMAX) // PMAX
        vr = min(PMAX, vc - b * PMAX)
        gT = nl.copy(nisa.nc_transpose(g[0:PMAX, b * PMAX:b * PMAX + vr]), dtype=w.dtype)
        dh_ps += nisa.nc_matmul(gT, w_rows[j, 0:vr, 0:D])
        dw_ps = nisa.nc_matmul(g[0:PMAX, b * PMAX:b * PMAX + vr], x)
        if dw_in_hbm:
          nisa.dma_copy(dst=dw[j * PMAX:j * PMAX + vr, 0:D], src=nl.copy(dw_ps, dtype=nl.float32), dst_rmw_op=np.add)
        else:
          dw_acc[j, 0:vr, 0:D] = nl.add(dw_acc[j, 0:vr, 0:D], dw_ps)
    nl.store(dh[t * PMAX + i_p, i_d], value=nl.copy(dh_ps, dtype=h.dtype), mask=valid)

  if not dw_in_hbm:
    for j in nl.static_range(NB):
      vr = min(PMAX, V - j * PMAX)
      nl.store(dw[j * PMAX:j * PMAX + vr, 0:D], value=nl.copy(dw_acc[j, 0:vr, 0:D], dtype=w.dtype))

  # loss = (sum over the partitions) / n
  tot = nisa.nc_matmul(ones[0:PMAX, 0:1], loss_acc)
  nl.store(loss, value=nl.multiply(tot, inv_n[0:1, 0:1]))
  return loss, dh, dw


def _seq_logps(logits, labels, loss_mask, out_sum, out_cnt):
  """Masked per-sequence sums of log p(label) (and token counts) of logits [S, L, V] into PSUM [1, S] tiles."""
  S, L, V = logits.shape
  N = S * L
  NT = (N + PMAX - 1) // PMAX
  NV = (V + V_CHUNK - 1) // V_CHUNK
  lg = logits.reshape((N, V))
  lb = labels.reshape((N, 1))
  lm = loss_mask.reshape((N, 1))
  i_p = nl.arange(PMAX)[:, None]
  i_0 = nl.arange(1)[None, :]
  i_s = nl.arange(S)[None, :]
  i_c = nl.arange(V_CHUNK)[None, :]
  col_ids = nisa.iota(i_p * 0 + i_c, dtype=nl.float32)

  for t in nl.affine_range(NT):
    valid = t * PMAX + i_p < N
    lab = nl.load(lb[t * PMAX + i_p, i_0], mask=valid)
    labf = nl.copy(lab, dtype=nl.float32, mask=valid)
    msk = nl.zeros((PMAX, 1), dtype=nl.float32)
    msk[i_p, i_0] = nl.load(lm[t * PMAX + i_p, i_0], mask=valid)

    m = nl.full((PMAX, 1), NEG_BIG, dtype=nl.float32)
    s = nl.zeros((PMAX, 1), dtype=nl.float32)
    zt = nl.zeros((PMAX, 1), dtype=nl.float32)
    for c in nl.static_range(NV):
      v0 = c * V_CHUNK
      vc = min(V_CHUNK, V - v0)
      i_v = nl.arange(vc)[None, :]
      z = nl.load(lg[t * PMAX + i_p, v0 + i_v], mask=valid, dtype=nl.float32)
      m_new = nl.maximum(m, nisa.tensor_reduce(np.max, z, axis=(1,), keepdims=True, mask=valid), mask=valid)
      neg_m = nl.negative(m_new, mask=valid)
      csum = nl.ndarray((PMAX, 1), dtype=nl.float32)
      nisa.activation_reduce(op=nl.exp, data=z, bias=neg_m, reduce_op=nl.add, reduce_res=csum, mask=valid)
      alpha = nisa.activation(op=nl.exp, data=m, bias=neg_m, mask=valid)
      s[i_p, i_0] = nisa.scalar_tensor_tensor(data=s, op0=nl.multiply, operand0=alpha, op1=nl.add,
                                              operand1=csum, mask=valid)
      m[i_p, i_0] = nl.copy(m_new, mask=valid)
      onehot = nisa.tensor_scalar(col_ids[i_p, i_v], op0=nl.equal, operand0=nl.add(labf, -1.0 * v0, mask=valid),
                                  mask=valid)
      hit = nisa.tensor_tensor(onehot, z, op=nl.multiply, mask=valid)
      zt[i_p, i_0] = nl.add(zt, nisa.tensor_reduce(np.add, hit, axis=(1,), keepdims=True, mask=valid), mask=valid)

    logp = nl.zeros((PMAX, 1), dtype=nl.float32)
    logp[i_p, i_0] = nl.multiply(nl.subtract(zt, nl.add(nl.log(s, mask=valid), m, mask=valid), mask=valid), msk,
                                 mask=valid)
    # token -> sequence one-hot: 0 <= (token index - L * seq) < L
    rel = nisa.iota(t * PMAX + i_p - L * i_s, dtype=nl.float32)
    seg = nl.multiply(nl.greater_equal(rel, 0.0, dtype=nl.float32), nl.less(rel, float(L), dtype=nl.float32))
    out_sum += nisa.nc_matmul(logp, seg)
    out_cnt += nisa.nc_matmul(msk, seg)


@nki.jit
def preference_loss(policy_logits, labels, loss_mask, ref_logits=None, beta=0.1, loss_type="sigmoid", gamma=0.0,
                    orpo_lambda=0.1):
  S, L, V = policy_logits.shape
  assert S % 2 == 0 and S <= 512 and V < 2 ** 24
  B = S // 2
  losses = nl.ndarray((1, B), dtype=nl.float32, buffer=nl.shared_hbm)
  chosen_rewards = nl.ndarray((1, B), dtype=nl.float32, buffer=nl.shared_hbm)
  rejected_rewards = nl.ndarray((1, B), dtype=nl.float32, buffer=nl.shared_hbm)
  logps_out = nl.ndarray((1, S), dtype=nl.float32, buffer=nl.shared_hbm)

  pol = nl.zeros((1, S), dtype=nl.float32, buffer=nl.psum)
  cnt = nl.zeros((1, S), dtype=nl.float32, buffer=nl.psum)
  _seq_logps(policy_logits, labels, loss_mask, pol, cnt)
  pol_sb = nl.copy(pol)
  nl.store(logps_out, value=pol_sb)

  if loss_type == "sigmoid":
    assert ref_logits is not None
    ref = nl.zeros((1, S), dtype=nl.float32, buffer=nl.psum)
    cnt2 = nl.zeros((1, S), dtype=nl.float32, buffer=nl.psum)
    _seq_logps(ref_logits, labels, loss_mask, ref, cnt2)
    lr = nl.subtract(pol_sb, ref)  # log ratios pi - ref
    rc = nl.multiply(lr[0:1, 0:B], beta)
    rr = nl.multiply(lr[0:1, B:S], beta)
    x = nl.subtract(rc, rr)
    loss_v = nl.softplus(nl.negative(x))  # -log sigmoid(x)
  else:
    avg = nl.divide(pol_sb, nl.maximum(cnt, 1.0))
    rc = nl.multiply(avg[0:1, 0:B], beta)
    rr = nl.multiply(avg[0:1, B:S], beta)
    if loss_type == "simpo":
      x = nl.subtract(nl.subtract(rc, rr), gamma)
      loss_v = nl.softplus(nl.negative(x))
    else:
      assert loss_type == "orpo"
      # log(1 - exp(a)) for a < 0
      l1c = nl.log(nl.subtract(1.0, nl.exp(avg[0:1, 0:B])))
      l1r = nl.log(nl.subtract(1.0, nl.exp(avg[0:1, B:S])))
      log_odds = nl.subtract(nl.subtract(avg[0:1, 0:B], avg[0:1, B:S]), nl.subtract(l1c, l1r))
      ratio_loss = nl.softplus(nl.negative(log_odds))
      loss_v = nl.subtract(nl.multiply(ratio_loss, orpo_lambda), avg[0:1, 0:B])
  nl.store(losses, value=loss_v)
  nl.store(chosen_rewards, value=rc)
  nl.store(rejected_rewards, value=rr)
  return losses, chosen_rewards, rejected_rewards, logps_out


@nki.jit
def grpo_loss_nl(logp, old_logp, ref_logp, advantages, mask, eps=0.2, beta=0.04):
  B, L = logp.shape
  per_token = nl.ndarray((B, L), dtype=nl.float32, buffer=nl.shared_hbm)
  seq_loss = nl.ndarray((B, 1), dtype=nl.float32, buffer=nl.shared_hbm)
  seq_loss1 = seq_loss.reshape((B,))
  loss = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.shared_hbm)
  i_p = nl.arange(PMAX)[:, None]
  i_l = nl.arange(L)[None, :]
  i_0 = nl.arange(1)[None, :]
  ones = nl.ones((PMAX, 1), dtype=nl.float32)
  tot = nl.zeros((1, 1), dtype=nl.float32, buffer=nl.psum)
  for b in nl.affine_range((B + PMAX - 1) // PMAX):
    rows = b * PMAX + i_p < B
    lp = nl.load(logp[b * PMAX + i_p, i_l], mask=rows, dtype=nl.float32)
    old = nl.load(old_logp[b * PMAX + i_p, i_l], mask=rows, dtype=nl.float32)
    ref = nl.load(ref_logp[b * PMAX + i_p, i_l], mask=rows, dtype=nl.float32)
    m = nl.load(mask[b * PMAX + i_p, i_l], mask=rows, dtype=nl.float32)
    a = nl.load(advantages[b * PMAX + i_p, i_0], mask=rows)
    ratio = nl.exp(lp - old, mask=rows)
    clipped = nl.minimum(nl.maximum(ratio, 1.0 - eps, mask=rows), 1.0 + eps, mask=rows)
    surr = nl.minimum(ratio * a, clipped * a, mask=rows)
    x = nl.subtract(ref, lp, mask=rows)
    kl = nl.exp(x, mask=rows) - x - 1.0
    tok = beta * kl - surr
    nl.store(per_token[b * PMAX + i_p, i_l], value=tok, mask=rows)
    s = nl.sum(tok * m, axis=1, mask=rows)
    n = nl.sum(m, axis=1, mask=rows)
    sl = s / nl.maximum(n, 1.0)
    nl.store(seq_loss1[b * PMAX + i_p], value=sl, mask=rows)
    slz = nl.zeros((PMAX, 1), dtype=nl.float32)
    slz[i_p, i_0] = nl.copy(sl, mask=rows)
    tot += nl.matmul(slz, ones, transpose_x=True)
  nl.store(loss, value=nl.multiply(tot, 1.0 / B))
  return per_token, seq_loss, loss


@nki.jit
def ppo_gae(rewards, values, gamma=0.99, lam=0.95):
  B, L = rewards.shape
  adv = nl.ndarray((B, L), dtype=nl.float32, buffer=nl.shared_hbm)
  ret = nl.ndarray((B, L), dtype=nl.float32, buffer=nl.shared_hbm)
  i_p = nl.arange(PMAX)[:, None]
  i_l = nl.arange(L)[None, :]
  gl = nl.full((PMAX, L), gamma * lam, dtype=nl.float32)
  for b in nl.affine_range((B + PMAX - 1) // PMAX):
    rows = b * PMAX + i_p < B
    # time reversed: column j is token L - 1 - j
    r = nl.load(rewards[b * PMAX + i_p, L - 1 - i_l], mask=rows, dtype=nl.float32)
    v = nl.load(values[b * PMAX + i_p, L - 1 - i_l], mask=rows, dtype=nl.float32)
    v_next = nl.zeros((PMAX, L), dtype=nl.float32)
    v_next[i_p, i_l] = nl.load(values[b * PMAX + i_p, L - i_l], mask=rows & (i_l >= 1), dtype=nl.float32)
    delta = nl.subtract(nl.add(r, nl.multiply(v_next, gamma, mask=rows), mask=rows), v, mask=rows)
    a = nisa.tensor_tensor_scan(gl, delta, initial=0.0, op0=np.multiply, op1=np.add, mask=rows)
    nl.store(adv[b * PMAX + i_p, L - 1 - i_l], value=a, mask=rows)
    nl.store(ret[b * PMAX + i_p, L - 1 - i_l], value=nl.add(a, v, mask=rows), mask=rows)
  return adv, ret
