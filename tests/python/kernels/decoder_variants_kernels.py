"""Decoder-layer variants of recent open LLMs in the Beta-1 dialect (``neuronxcc.nki``), written the way public
Beta-1 NKI kernels write them (arange index expressions, masks for ragged tails, value-returning ``nl`` / ``nisa``
calls, ``psum[...] += nisa.nc_matmul(...)`` accumulation, ``nisa.affine_select`` masks):

- ``gemma_embed_rmsnorm(ids, table, w, eps)``: Gemma's input side. ids [T, 1] int32 token ids, table [V, D],
  w [1, D] the RMSNorm weight stored as an offset from one. Per tile of 128 tokens (the last one ragged, masked)
  the embedding rows are gathered by an indirect DMA (``table[idx[i_p, 0], i_d]``), scaled by sqrt(D) (Gemma's
  embedding normalizer), and normalized by Gemma's RMSNorm ``x / sqrt(mean(x^2) + eps) * (1 + w)``. Returns
  (embed [T, D], normed [T, D]), both in table.dtype.
- ``gemma_rmsnorm(x, w, eps)``: the same norm with ``nl.rms_norm(x, 1 + w, axis=1, n=D, mask=...)`` on row tiles
  of 128 (the last masked).
- ``gemma2_attention(q, k, v, softcap, window, scale)``: Gemma-2 causal attention, flash style (online softmax
  over key blocks of 128) with the attention-logit soft-cap ``cap * tanh(s * scale / cap)`` (``softcap=None``:
  no cap, plain scaled scores) and, for the local layers, a sliding window (``window=W``: query i sees keys
  i - W + 1 .. i). Key blocks wholly above the diagonal or wholly before the window are never visited (the loop
  runs from the first block the window reaches); every visited block is masked with ``nisa.affine_select``
  (causal, and with a window a second select for the window's far edge), as the nki-samples flash kernel masks
  every block of its causal loop. q, k [H, d, S] (transposed layout), v [H, S, d], S % 128 == 0, d <= 128.
- ``final_logit_softcap(hT, w, softcap)``: Gemma-2's LM head with the final-logit soft-cap:
  logits = cap * tanh((h @ w) / cap) in fp32. hT [D, T] (hidden transposed, D % 128 == 0), w [D, V]. Token tiles
  of 128 and vocabulary tiles of 512 (one PSUM bank), both possibly ragged (masked loads / stores); the
  contraction accumulates D / 128 matmuls in PSUM and the cap is applied on the PSUM eviction (tanh on ScalarE
  with scale 1 / cap, then a multiply by cap).
- ``geglu_mlp_b1(x, w_gate, w_up, w_down)``: the GeGLU MLP (gelu_tanh(x W_gate) * (x W_up)) W_down with
  ``nl.matmul(transpose_x=True)``: gate / up feature-major accumulated over D / 128 in PSUM, ``nl.gelu_apprx_tanh``
  from PSUM, the down projection accumulated over the intermediate tiles; x [T, D] (ragged T: masked load and
  store), D % 128 == 0, D <= 512, I % 128 == 0.
- ``diff_attention_b1(q, k, v, lam, norm_w, lambda_init, eps)``: DIFF Transformer attention
  (softmax(Q1 K1^T s) - lam softmax(Q2 K2^T s)) V, causal (``affine_select``, then ``nl.softmax``), with the
  per-head RMSNorm (the reference code's "GroupNorm") times (1 - lambda_init). q, k [H, 2, d, S], v [H, S, 2 d],
  S % 128 == 0, S <= 512.
- ``sink_window_select(k_cache, seq_lens, n_sink, window)``: StreamingLLM KV cache selection of the n_sink first
  rows and the last ``window`` rows before each sequence's runtime length, compacted to [B, n_sink + window, D];
  the source rows computed on chip (``nisa.iota``, ``nl.where``) and gathered by an indirect DMA.

Written for nsim's tests in the style of those kernels; not copies of any file. No nsim imports.
"""
import math

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl

PMAX = 128
VTILE = 512
NEG = -30000.0


@nki.jit
def gemma_embed_rmsnorm(ids, table, w, eps=1e-6):
  T, _ = ids.shape
  V, D = table.shape
  embed = nl.ndarray((T, D), dtype=table.dtype, buffer=nl.shared_hbm)
  normed = nl.ndarray((T, D), dtype=table.dtype, buffer=nl.shared_hbm)

  i_p = nl.arange(PMAX)[:, None]
  i_d = nl.arange(D)[None, :]
  i_0 = nl.arange(1)[None, :]
  i_w = nl.arange(1)[:, None]

  # (1 + w) once, broadcast to the partitions
  w_t = nl.load(w[i_w, i_d], dtype=nl.float32)
  w1 = nl.add(w_t, 1.0)
  w_b = w1.broadcast_to((PMAX, D))
  normalizer = math.sqrt(D)

  for t in nl.affine_range((T + PMAX - 1) // PMAX):
    valid = t * PMAX + i_p < T
    idx = nl.load(ids[t * PMAX + i_p, i_0], mask=valid)
    rows = nl.load(table[idx[i_p, 0], i_d], mask=valid)
    x = nl.multiply(rows, normalizer, dtype=nl.float32, mask=valid)
    nl.store(embed[t * PMAX + i_p, i_d], value=x, mask=valid)

    ms = nl.mean(nl.square(x, mask=valid), axis=[1], keepdims=True, mask=valid)
    rstd = nl.rsqrt(nl.add(ms, eps, mask=valid), mask=valid)
    y = nl.multiply(nl.multiply(x, rstd, mask=valid), w_b, mask=valid)
    nl.store(normed[t * PMAX + i_p, i_d], value=y, mask=valid)
  return embed, normed


@nki.jit
def gemma_rmsnorm(x, w, eps=1e-6):
  """Gemma's RMSNorm with ``nl.rms_norm``: x [T, D], w [1, D] (the offset from one): nl.rms_norm(x, 1 + w) per
  tile of 128 rows, the ragged last tile under ``mask=`` on the load, the norm and the store."""
  T, D = x.shape
  out = nl.ndarray((T, D), dtype=x.dtype, buffer=nl.shared_hbm)
  i_p = nl.arange(PMAX)[:, None]
  i_d = nl.arange(D)[None, :]
  w1 = nl.add(nl.load(w), 1.0, dtype=nl.float32)
  for t in nl.affine_range((T + PMAX - 1) // PMAX):
    valid = t * PMAX + i_p < T
    x_t = nl.load(x[t * PMAX + i_p, i_d], mask=valid)
    y = nl.rms_norm(x_t, w1, axis=1, n=D, epsilon=eps, mask=valid)
    nl.store(out[t * PMAX + i_p, i_d], value=y, mask=valid)
  return out


@nki.jit
def gemma2_attention(q, k, v, softcap=50.0, window=0, scale=None):
  H, d, S = q.shape
  assert S % PMAX == 0 and d <= PMAX
  NT = S // PMAX
  if scale is None:
    scale = 1.0 / math.sqrt(d)
  out = nl.ndarray((H, S, d), dtype=q.dtype, buffer=nl.shared_hbm)

  i_p = nl.arange(PMAX)[:, None]
  i_f = nl.arange(PMAX)[None, :]
  i_dp = nl.arange(d)[:, None]
  i_d = nl.arange(d)[None, :]

  for h in nl.affine_range(H):
    for qi in nl.affine_range(NT):
      qT = nl.load(q[h, i_dp, qi * PMAX + i_f])
      m = nl.full((PMAX, 1), NEG, dtype=nl.float32)
      l = nl.zeros((PMAX, 1), dtype=nl.float32)
      acc = nl.zeros((PMAX, d), dtype=nl.float32)
      # first key block the window reaches: key qi * 128 - W + 1 (query qi * 128's oldest key)
      k_lo = max(0, (qi * PMAX - window + 1) // PMAX) if window > 0 else 0
      for ki in nl.sequential_range(k_lo, qi + 1):
        kT = nl.load(k[h, i_dp, ki * PMAX + i_f])
        v_t = nl.load(v[h, ki * PMAX + i_p, i_d])
        s_ps = nisa.nc_matmul(qT, kT)
        if softcap is not None:
          s = nisa.activation(op=nl.tanh, data=s_ps, scale=scale / softcap, dtype=nl.float32)
          s = nl.multiply(s, softcap)
        else:
          s = nl.multiply(s_ps, scale, dtype=nl.float32)
        # causal: key j <= query i
        s = nisa.affine_select(qi * PMAX + i_p - ki * PMAX - i_f >= 0, s, NEG)
        if window > 0:  # local layer: key j > i - W
          s = nisa.affine_select(ki * PMAX + i_f - qi * PMAX - i_p + window > 0, s, NEG)
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
def final_logit_softcap(hT, w, softcap=30.0):
  D, T = hT.shape
  D_, V = w.shape
  assert D == D_ and D % PMAX == 0
  KD = D // PMAX
  logits = nl.ndarray((T, V), dtype=nl.float32, buffer=nl.shared_hbm)

  i_kp = nl.arange(PMAX)[:, None]
  i_tf = nl.arange(PMAX)[None, :]
  i_vf = nl.arange(VTILE)[None, :]
  i_p = nl.arange(PMAX)[:, None]

  for t in nl.affine_range((T + PMAX - 1) // PMAX):
    # the token tile's hidden states, contraction chunks on the partitions
    x = nl.ndarray((KD, nl.par_dim(PMAX), PMAX), dtype=hT.dtype, buffer=nl.sbuf)
    for kd in nl.affine_range(KD):
      x[kd, i_kp, i_tf] = nl.load(hT[kd * PMAX + i_kp, t * PMAX + i_tf], mask=(t * PMAX + i_tf < T))
    for vt in nl.affine_range((V + VTILE - 1) // VTILE):
      ps = nl.zeros((PMAX, VTILE), dtype=nl.float32, buffer=nl.psum)
      for kd in nl.affine_range(KD):
        w_t = nl.load(w[kd * PMAX + i_kp, vt * VTILE + i_vf], mask=(vt * VTILE + i_vf < V))
        ps += nisa.nc_matmul(x[kd, i_kp, i_tf], w_t[i_kp, i_vf], mask=(t * PMAX + i_tf < T) & (vt * VTILE + i_vf < V))
      valid = (t * PMAX + i_p < T) & (vt * VTILE + i_vf < V)
      th = nisa.activation(op=nl.tanh, data=ps, scale=1.0 / softcap, mask=valid, dtype=nl.float32)
      lg = nl.multiply(th, softcap, mask=valid)
      nl.store(logits[t * PMAX + i_p, vt * VTILE + i_vf], value=lg, mask=valid)
  return logits


@nki.jit
def geglu_mlp_b1(x, w_gate, w_up, w_down):
  """GeGLU MLP (gelu_tanh(x W_gate) * (x W_up)) W_down in the Beta-1 form: x [T, D] (D % 128 == 0, D <= 512),
  w_gate / w_up [D, I], w_down [I, D] (I % 128 == 0). Per token tile (the last masked): x transposed on the PE
  (``nisa.nc_transpose``), gate and up feature-major by ``nl.matmul(transpose_x=True)`` accumulated over D / 128
  in PSUM (``+=``), ``nl.gelu_apprx_tanh`` read from PSUM times up, the down projection accumulated over the
  I / 128 tiles in one PSUM tile; only the store is masked (the tutorial style: rows past T are computed on
  whatever the masked load left and never stored)."""
  T, D = x.shape
  I = w_gate.shape[1]
  assert D % PMAX == 0 and D <= VTILE and I % PMAX == 0
  KD, KI = D // PMAX, I // PMAX
  out = nl.ndarray((T, D), dtype=x.dtype, buffer=nl.shared_hbm)
  i_p = nl.arange(PMAX)[:, None]
  i_f = nl.arange(PMAX)[None, :]
  i_d = nl.arange(D)[None, :]
  i_i = nl.arange(I)[None, :]

  wg = nl.ndarray((KD, nl.par_dim(PMAX), I), dtype=w_gate.dtype, buffer=nl.sbuf)
  wu = nl.ndarray((KD, nl.par_dim(PMAX), I), dtype=w_up.dtype, buffer=nl.sbuf)
  for kd in nl.affine_range(KD):
    wg[kd, i_p, i_i] = nl.load(w_gate[kd * PMAX + i_p, i_i])
    wu[kd, i_p, i_i] = nl.load(w_up[kd * PMAX + i_p, i_i])
  wd = nl.ndarray((KI, nl.par_dim(PMAX), D), dtype=w_down.dtype, buffer=nl.sbuf)
  for ki in nl.affine_range(KI):
    wd[ki, i_p, i_d] = nl.load(w_down[ki * PMAX + i_p, i_d])

  for t in nl.affine_range((T + PMAX - 1) // PMAX):
    valid = t * PMAX + i_p < T
    x_t = nl.load(x[t * PMAX + i_p, i_d], mask=valid)
    xT = nl.ndarray((KD, nl.par_dim(PMAX), PMAX), dtype=x.dtype, buffer=nl.sbuf)
    for kd in nl.affine_range(KD):
      xT[kd, i_p, i_f] = nisa.nc_transpose(x_t[i_p, kd * PMAX + i_f])
    o_ps = nl.zeros((PMAX, D), dtype=nl.float32, buffer=nl.psum)
    for ki in nl.affine_range(KI):
      g_ps = nl.zeros((PMAX, PMAX), dtype=nl.float32, buffer=nl.psum)
      u_ps = nl.zeros((PMAX, PMAX), dtype=nl.float32, buffer=nl.psum)
      for kd in nl.affine_range(KD):
        g_ps += nl.matmul(wg[kd, i_p, ki * PMAX + i_f], xT[kd, i_p, i_f], transpose_x=True)
        u_ps += nl.matmul(wu[kd, i_p, ki * PMAX + i_f], xT[kd, i_p, i_f], transpose_x=True)
      hT = nl.multiply(nl.gelu_apprx_tanh(g_ps, dtype=nl.float32), u_ps, dtype=x.dtype)
      o_ps += nl.matmul(hT, wd[ki, i_p, i_d], transpose_x=True)
    nl.store(out[t * PMAX + i_p, i_d], value=nl.copy(o_ps, dtype=x.dtype), mask=valid)
  return out


@nki.jit
def diff_attention_b1(q, k, v, lam, norm_w, lambda_init=0.8, eps=1e-5):
  """Differential attention in the Beta-1 form: q, k [H, 2, d, S], v [H, S, 2 d], S % 128 == 0, S <= 512,
  norm_w [1, 2 d]. Per (head, query tile): both score maps q_c k_c^T, the causal mask by ``nisa.affine_select``,
  ``nl.softmax`` of each (scaled), the differential map p1 - lam p2, PV over the causal key tiles
  (``nisa.nc_transpose`` + ``nisa.nc_matmul``), then the per-head RMSNorm times (1 - lambda_init)."""
  H, two, d, S = q.shape
  d2 = v.shape[2]
  assert two == 2 and S % PMAX == 0 and S <= VTILE and d2 == 2 * d
  NT = S // PMAX
  scale = 1.0 / math.sqrt(d)
  out = nl.ndarray((H, S, d2), dtype=q.dtype, buffer=nl.shared_hbm)
  i_p = nl.arange(PMAX)[:, None]
  i_f = nl.arange(PMAX)[None, :]
  i_s = nl.arange(S)[None, :]
  i_dp = nl.arange(d)[:, None]
  i_v = nl.arange(d2)[None, :]
  i_w = nl.arange(1)[:, None]
  w_b = nl.load(norm_w[i_w, i_v], dtype=nl.float32).broadcast_to((PMAX, d2))

  for h in nl.affine_range(H):
    for qi in nl.affine_range(NT):
      p = []
      for c in nl.static_range(2):
        qT = nl.load(q[h, c, i_dp, qi * PMAX + i_f])
        kT = nl.load(k[h, c, i_dp, i_s])
        s = nl.multiply(nisa.nc_matmul(qT, kT), scale, dtype=nl.float32)
        s = nisa.affine_select(qi * PMAX + i_p - i_s >= 0, s, NEG)
        p.append(nl.softmax(s, axis=1, dtype=nl.float32))
      pd = nl.subtract(p[0], nl.multiply(p[1], lam), dtype=v.dtype)
      o_ps = nl.zeros((PMAX, d2), dtype=nl.float32, buffer=nl.psum)
      for j in nl.sequential_range(qi + 1):
        v_j = nl.load(v[h, j * PMAX + i_p, i_v])
        pT = nl.copy(nisa.nc_transpose(pd[i_p, j * PMAX + i_f]), dtype=v.dtype)
        o_ps += nisa.nc_matmul(pT, v_j)
      ms = nl.mean(nl.square(o_ps), axis=[1], keepdims=True)
      rstd = nl.multiply(nl.rsqrt(nl.add(ms, eps)), 1.0 - lambda_init)
      o = nl.multiply(nl.multiply(o_ps, rstd), w_b, dtype=q.dtype)
      nl.store(out[h, qi * PMAX + i_p, i_v], value=o)
  return out


@nki.jit
def sink_window_select(k_cache, seq_lens, n_sink, window):
  """StreamingLLM KV cache selection: for each sequence b keep its n_sink first rows and the last ``window``
  rows before its runtime length, compacted to [B, n_sink + window, D]. k_cache [B, S_max, D], seq_lens [B, 1]
  int32 (n_sink + window <= len <= S_max). The source row of compact row i is computed on chip from the runtime
  length (``nisa.iota`` of i, ``nl.where(i < n_sink, i, len - window - n_sink + i)``, plus b * S_max) and the rows
  are gathered by an indirect DMA from the flattened cache (``cache[idx[i_p, 0], i_d]``, masked on the ragged
  last tile)."""
  B, S_max, D = k_cache.shape
  R = n_sink + window
  out = nl.ndarray((B, R, D), dtype=k_cache.dtype, buffer=nl.shared_hbm)
  flat = k_cache.reshape((B * S_max, D))
  i_p = nl.arange(PMAX)[:, None]
  i_d = nl.arange(D)[None, :]
  i_0 = nl.arange(1)[None, :]
  for b in nl.affine_range(B):
    ln = nl.load(seq_lens[b + 0 * i_p, i_0], dtype=nl.float32)  # the length on every partition
    for r in nl.affine_range((R + PMAX - 1) // PMAX):
      valid = r * PMAX + i_p < R
      i_row = nisa.iota(r * PMAX + i_p, dtype=nl.float32)
      recent = nl.add(nl.add(i_row, ln), float(b * S_max - window - n_sink))
      src = nl.where(nl.less(i_row, float(n_sink)), nl.add(i_row, float(b * S_max)), recent)
      idx = nl.copy(src, dtype=nl.int32)
      rows = nl.load(flat[idx[i_p, 0], i_d], mask=valid)
      nl.store(out[b, r * PMAX + i_p, i_d], value=rows, mask=valid)
  return out
