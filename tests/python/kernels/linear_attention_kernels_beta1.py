"""RetNet-style retention written the way Beta-1 NKI ports of it are (``import neuronxcc.nki as nki``,
``neuronxcc.nki.language as nl``, ``neuronxcc.nki.isa as nisa``; value-returning calls, ``nl.arange`` index
expressions, ``nl.load`` / ``nl.store``, PSUM accumulation with ``+=``).

Per head h the decay is gamma_h (RetNet: ``1 - 2 ** (-5 - h)``, given by the host as ``gammas`` [H] fp32; its log
is taken on chip).

* ``retention_chunked[H](q, k, v, gammas)``: one program per head (``nl.program_id(0)``); q, k, v [H, S, d] ->
  o [H, S, d] with ``o_i = sum_{j <= i} gamma^(i - j) (q_i . k_j) v_j``. The decay mask D^T[j, i] = gamma^(i - j)
  (j <= i) is built on chip once: ``nisa.iota(i - j)``, ``nisa.activation(exp, scale=log gamma)`` with a
  per-partition scale, ``nisa.affine_select`` for the causal part. Per chunk of C tokens:
  intra (Q K^T * D) V, cross-chunk (Q R) * xi with xi_i = gamma^(i + 1), and the state
  R = gamma^C R + K^T (V * zeta) with zeta_j = gamma^(C - 1 - j) (fp32 in SBUF).
  ``decay="power"`` builds the mask by ``nl.power(gamma, i - j)`` instead.
* ``retention_decode(q, k, v, gammas, state)``: the recurrent form for one token of B sequences:
  q, k, v [B, H, d], state [B, H, d, d] fp32 -> (o [B, H, d], new state): ``S = gamma S + k^T v``, ``o = q S``.
  ``retention_decode_grid[B, H]``: the same, one (sequence, head) per program of a 2-D SPMD grid, with
  ``nl.transpose`` / ``nl.matmul`` (no transpose_x) for the outer product and q S.
* ``ssd_chunked``: the Mamba-2 SSD in the three passes of the reference ``ssd_minimal`` (see its docstring).
* ``linear_attention_ragged``: causal linear attention for any S, masks on the ragged last chunk, the state in PSUM.

Written for nsim's tests; not a copy of any public file. No nsim imports.
"""
import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl


def _log_gamma_column(gammas, h, n):
  """log(gamma_h) on each of n partitions, an [n, 1] fp32 tile."""
  H = gammas.shape[0]
  g_row = nl.load(gammas.reshape((1, H)))
  g_bc = g_row.broadcast_to((n, H))
  return nl.log(g_bc[:, h], dtype=nl.float32)


@nki.jit
def retention_chunked(q, k, v, gammas, chunk=128, decay="exp"):
  H, S, d = q.shape
  C = chunk
  h = nl.program_id(0)
  out = nl.ndarray((H, S, d), dtype=q.dtype, buffer=nl.shared_hbm)

  i_p = nl.arange(C)[:, None]
  i_f = nl.arange(C)[None, :]
  i_d = nl.arange(d)[None, :]

  lg = _log_gamma_column(gammas, h, C)  # [C, 1]
  lg_d = _log_gamma_column(gammas, h, d)  # [d, 1]
  # D^T[j, i] = gamma^(i - j) where i >= j
  dist = nisa.iota(i_f - i_p, dtype=nl.float32)
  if decay == "power":  # gamma ** (i - j) directly (GpSimd)
    g_bc = nl.load(gammas.reshape((1, H))).broadcast_to((C, H))
    dec = nl.power(g_bc[:, h], dist)
  else:
    dec = nisa.activation(op=nl.exp, data=dist, scale=lg)
  decT = nisa.affine_select(pred=(i_f - i_p >= 0), on_true_tile=dec, on_false_value=0.0)
  # xi_i = gamma^(i + 1), zeta_j = gamma^(C - 1 - j), gamma^C
  xi = nisa.activation(op=nl.exp, data=nisa.iota(i_p + 1, dtype=nl.float32), scale=lg)
  zeta = nisa.activation(op=nl.exp, data=nisa.iota(C - 1 - i_p, dtype=nl.float32), scale=lg)
  g_chunk = nl.exp(nl.multiply(lg_d, float(C)))

  state = nl.zeros((nl.par_dim(d), d), dtype=nl.float32, buffer=nl.sbuf)
  for c in nl.sequential_range(S // C):
    q_t = nl.load(q[h, c * C + i_p, i_d])
    k_t = nl.load(k[h, c * C + i_p, i_d])
    v_t = nl.load(v[h, c * C + i_p, i_d])
    qT = nisa.nc_transpose(q_t)
    qT_sb = nl.copy(qT, dtype=q.dtype)
    kT = nisa.nc_transpose(k_t)
    kT_sb = nl.copy(kT, dtype=q.dtype)

    aT = nisa.nc_matmul(kT_sb, qT_sb)  # [j, i]
    aT_dec = nl.multiply(aT, decT, dtype=q.dtype)
    o_ps = nl.zeros((nl.par_dim(C), d), dtype=nl.float32, buffer=nl.psum)
    o_ps += nisa.nc_matmul(aT_dec, v_t)

    r_mm = nl.copy(state, dtype=q.dtype)
    cross = nl.matmul(qT_sb, r_mm, transpose_x=True)  # [C, d]
    o = nl.add(o_ps, nl.multiply(cross, xi), dtype=q.dtype)
    nl.store(out[h, c * C + i_p, i_d], value=o)

    v_z = nl.multiply(v_t, zeta, dtype=q.dtype)
    kv = nisa.nc_matmul(k_t, v_z)  # [d, d]
    state[...] = nl.add(nl.multiply(state, g_chunk), kv)
  return out


@nki.jit
def retention_decode(q, k, v, gammas, state):
  B, H, d = q.shape
  o_out = nl.ndarray((B, H, d), dtype=q.dtype, buffer=nl.shared_hbm)
  new_state = nl.ndarray((B, H, d, d), dtype=nl.float32, buffer=nl.shared_hbm)
  i_dp = nl.arange(d)[:, None]
  i_d = nl.arange(d)[None, :]
  g_row = nl.load(gammas.reshape((1, H)))
  g_bc = g_row.broadcast_to((d, H))
  for b in nl.affine_range(B):
    for h in nl.affine_range(H):
      k_row = nl.load(k[b, h, i_d], dtype=nl.float32)  # [1, d]
      v_row = nl.load(v[b, h, i_d], dtype=nl.float32)
      q_col = nl.load(q[b, h, i_dp], dtype=nl.float32)  # [d, 1]
      s = nl.load(state[b, h])
      kv = nisa.nc_matmul(k_row, v_row)  # k^T v, [d, d]
      s_new = nl.add(nl.multiply(s, g_bc[:, h]), kv)
      o = nisa.nc_matmul(q_col, s_new)  # [1, d]
      nl.store(o_out[b, h, i_d], value=o)
      nl.store(new_state[b, h], value=s_new)
  return o_out, new_state


@nki.jit
def ssd_chunked(x, a, b, c, chunk=64):
  """Mamba-2 SSD in three passes (per head), as the reference ``ssd_minimal`` is laid out: (1) per chunk, in any
  order, the cumulative log decay (a triangular-ones matmul), the intra-chunk output (C B^T * exp(segsum)) X, the
  chunk state and the chunk's total decay, kept in SBUF block tensors [n_chunks, P, F]; (2) the inter-chunk
  recurrence over the chunk states (``sequential_range``); (3) the state contribution C diag(exp(a_cs)) H_in
  added to each chunk's output. x [H, S, p], a [H, S] (dt * A < 0), b, c [H, S, N] -> y [H, S, p]."""
  H, S, p = x.shape
  N = b.shape[2]
  L = chunk
  NC = S // L
  y = nl.ndarray((H, S, p), dtype=x.dtype, buffer=nl.shared_hbm)

  i_p = nl.arange(L)[:, None]
  i_f = nl.arange(L)[None, :]
  i_x = nl.arange(p)[None, :]
  i_n = nl.arange(N)[None, :]
  # tri[s, t] = 1 where t >= s
  tri = nisa.affine_select(pred=(i_f - i_p >= 0), on_true_tile=nl.ones((L, L), dtype=nl.float32),
                           on_false_value=0.0)

  for h in nl.affine_range(H):
    y_diag = nl.ndarray((NC, nl.par_dim(L), p), dtype=nl.float32, buffer=nl.sbuf)
    states = nl.ndarray((NC, nl.par_dim(N), p), dtype=nl.float32, buffer=nl.sbuf)
    chunk_decay = nl.ndarray((NC, nl.par_dim(N), 1), dtype=nl.float32, buffer=nl.sbuf)
    c_dec = nl.ndarray((NC, nl.par_dim(N), L), dtype=x.dtype, buffer=nl.sbuf)

    for ci in nl.affine_range(NC):
      a_col = nl.load(a[h, ci * L + i_p])  # [L, 1]
      acs = nl.copy(nl.matmul(tri, a_col, transpose_x=True))  # a_cs[t], [L, 1]
      acs_row = nisa.nc_transpose(acs)  # [1, L]
      rowb = nl.copy(acs_row, dtype=nl.float32).broadcast_to((L, L))  # rowb[s, t] = a_cs[t]
      seg = nl.subtract(rowb, acs)  # segsum^T[s, t] = a_cs[t] - a_cs[s]
      seg_m = nisa.affine_select(pred=(i_f - i_p >= 0), on_true_tile=seg, on_false_value=nl.fp32.min)
      lT = nl.exp(seg_m)

      x_t = nl.load(x[h, ci * L + i_p, i_x])
      b_t = nl.load(b[h, ci * L + i_p, i_n])
      bT = nl.load_transpose2d(b[h, nl.ds(ci * L, L), :])  # [N, L]
      cT = nl.load_transpose2d(c[h, nl.ds(ci * L, L), :])
      gT = nisa.nc_matmul(bT, cT)  # (B C^T)[s, t]
      mT = nl.multiply(gT, lT, dtype=x.dtype)
      y_diag[ci] = nisa.nc_matmul(mT, x_t)

      dec_end = nl.exp(nl.subtract(rowb[:, L - 1], acs))  # exp(a_cs[-1] - a_cs[s]), [L, 1]
      b_dec = nl.multiply(b_t, dec_end, dtype=x.dtype)
      states[ci] = nisa.nc_matmul(b_dec, x_t)  # [N, p]
      chunk_decay[ci] = nl.exp(rowb[0:N, L - 1])
      c_dec[ci] = nl.multiply(cT, nl.exp(rowb[0:N, :]), dtype=x.dtype)

    h_in = nl.ndarray((NC, nl.par_dim(N), p), dtype=x.dtype, buffer=nl.sbuf)
    run = nl.zeros((nl.par_dim(N), p), dtype=nl.float32, buffer=nl.sbuf)
    for ci in nl.sequential_range(NC):
      h_in[ci] = nl.copy(run, dtype=x.dtype)
      run[...] = nl.add(nl.multiply(run, chunk_decay[ci]), states[ci])

    for ci in nl.affine_range(NC):
      y_off = nisa.nc_matmul(c_dec[ci], h_in[ci])  # [L, p]
      nl.store(y[h, ci * L + i_p, i_x], value=nl.add(y_diag[ci], y_off, dtype=x.dtype))
  return y


@nki.jit
def linear_attention_ragged(q, k, v, chunk=128):
  """Causal linear attention for any S (the last chunk ragged, everything under ``mask=``), with Q^T / K^T loaded as
  transposed windows (``q[h, c * C + i_f, i_dp]``), the causal mask from ``nl.mgrid`` and the running state
  S = sum K^T V carried across chunks in PSUM (``s_ps += nisa.nc_matmul(...)`` on a PSUM zeros tile)."""
  H, S, d = q.shape
  C = chunk
  out = nl.ndarray((H, S, d), dtype=q.dtype, buffer=nl.shared_hbm)
  i = nl.mgrid[0:C, 0:C]
  i_p = nl.arange(C)[:, None]
  i_f = nl.arange(C)[None, :]
  i_d = nl.arange(d)[None, :]
  i_dp = nl.arange(d)[:, None]
  for h in nl.affine_range(H):
    s_ps = nl.zeros((nl.par_dim(d), d), dtype=nl.float32, buffer=nl.psum)
    for c in nl.sequential_range((S + C - 1) // C):
      valid = c * C + i_p < S
      k_t = nl.load(k[h, c * C + i_p, i_d], mask=valid)
      v_t = nl.load(v[h, c * C + i_p, i_d], mask=valid)
      qT = nl.load(q[h, c * C + i_f, i_dp], mask=(c * C + i_f < S))  # [d, C]
      kT = nl.load(k[h, c * C + i_f, i_dp], mask=(c * C + i_f < S))
      i_m = nl.arange(C)[None, :]
      i_n = nl.arange(C)[None, :]
      aT = nisa.nc_matmul(kT[i_dp, i_m], qT[i_dp, i_n], mask=((c * C + i_m < S) & (c * C + i_n < S)))
      aT_m = nisa.affine_select(pred=(i.x - i.p >= 0), on_true_tile=aT, on_false_value=0.0, dtype=q.dtype)
      s_mm = nl.copy(s_ps, dtype=q.dtype)
      o_ps = nl.zeros((nl.par_dim(C), d), dtype=nl.float32, buffer=nl.psum)
      o_ps[i_p, i_d] += nisa.nc_matmul(aT_m[i_p, i_f], v_t, mask=valid)
      o_ps[i_p, i_d] += nisa.nc_matmul(qT, s_mm, mask=valid)
      nl.store(out[h, c * C + i_p, i_d], value=o_ps, mask=valid)
      s_ps += nisa.nc_matmul(k_t, v_t, mask=valid)
  return out


@nki.jit
def retention_decode_grid(q, k, v, gammas, state):
  B, H, d = q.shape
  b = nl.program_id(0)
  h = nl.program_id(1)
  o_out = nl.ndarray((B, H, d), dtype=q.dtype, buffer=nl.shared_hbm)
  new_state = nl.ndarray((B, H, d, d), dtype=nl.float32, buffer=nl.shared_hbm)
  i_d = nl.arange(d)[None, :]
  g_col = nl.load(gammas[h]).broadcast_to((d, 1))
  k_row = nl.load(k[b, h, i_d], dtype=nl.float32)
  v_row = nl.load(v[b, h, i_d], dtype=nl.float32)
  q_row = nl.load(q[b, h, i_d], dtype=nl.float32)
  s = nl.load(state[b, h])
  kv = nl.matmul(nl.transpose(k_row), v_row)  # k^T v: x [d, 1] @ y [1, d]
  s_new = nl.add(nl.multiply(s, g_col), kv)
  o = nl.matmul(q_row, s_new)  # [1, d]
  nl.store(o_out[b, h, i_d], value=o)
  nl.store(new_state[b, h], value=s_new)
  return o_out, new_state
