"""Mamba-1 decode and RWKV-6 kernels in the new NKI dialect (``import nki``, ``nki.language as nl``, ``nki.isa as
nisa``; every ISA call writes a ``dst``), written the way community Trainium ports of Mamba-1 / Jamba and RWKV-6
write them:

- ``mamba1_selective_scan(x, delta, A, B, C, D, z, delta_bias, chunk)``: the Beta-1 file's optimised prefill scan
  as a port in this dialect writes it, every state of a chunk at once: dA = exp(delta A) for all N states as one
  [128, N, chunk] tile (delta broadcast over the states and A over the positions by stride-0 views,
  ``expand_dim(..).broadcast(..)``), B / C of the chunk onto the channel partitions by one stride-0 DMA each, one
  ``tensor_tensor_scan`` per state on the [:, n, :] slices started from the carried last column, y = the reduce of
  C * h over the states through a permuted view (states innermost), D skip, silu(z) gate. Under LNC=2 the batch is
  dealt to the two programs by ``nl.program_id``.
- ``mamba1_decode_step(x, z, dt, B, C, A, D, dt_bias, conv_w, conv_b, conv_state, ssm_state)``: one token of a
  Mamba-1 layer (``mamba_simple.step``) with both states in HBM read and written in place: x, z, dt [Bt, Ch] (x
  before the conv), B / C [Bt, N], A [Ch, N], D / dt_bias / conv_b [Ch, 1], conv_w [Ch, 4], conv_state [Bt, Ch, 4]
  (the last 4 conv inputs), ssm_state [Bt, Ch, N] fp32. Channels on the partitions: the conv state shifted left by
  one and the new x appended (two copies into a fresh [128, 4] tile, stored back over the old state), the 4-tap
  conv as a multiply and a free-axis reduce plus the bias, silu; dt = softplus(dt + dt_bias); dA = exp(dt A)
  (``activation`` with dt as the per-partition scale), h = dA h + (dt x) B with B's row broadcast to the 128
  partitions by a stride-0 DMA, y = sum_n C_n h_n + D x, times silu(z). Returns y [Bt, Ch].
- ``rwkv6_wkv_sequential(r, k, v, w, u, state)``: the RWKV-6 WKV recurrence step by step (the reference form):
  r, k, v, w [H, T, d] (w the data-dependent decay in (0, 1)), u [H, d] (the bonus), state [H, d, d] (key dim on
  the partitions). Per step: kv = k_t^T v_t (a one-row matmul), o_t = r_t S + (r_t * u) kv (two matmuls into one
  PSUM tile), S = diag(w_t) S + kv (``scalar_tensor_tensor`` with w_t as the per-partition operand). r^T, w^T by PE
  transposes per 128 tokens; k, v rows read from the head's [1, T d] flattening. Returns (o [H, T, d], S [H, d, d]).
- ``rwkv6_wkv_chunked(r, k, v, w, u, state, chunk)``: the chunked (parallel) form the ports use: per chunk of
  ``chunk`` tokens, the inclusive cumulative log decay c_t along the chunk (``tensor_tensor_scan`` of log w^T with
  the key dim on the partitions), r~ = r exp(c_{t-1}), k~ = k exp(-c_t), the intra-chunk scores A^T = k~ r~^T masked
  strictly causal (``affine_select``), the bonus r_t (u k_t) on the diagonal (added to v's rows), o = A V + r~ S and
  the state S = diag(exp(c_last)) (S + k~^T V).
- ``rwkv_channel_mix(x, shift_state, mu_k, mu_r, w_k, w_v, w_r)``: the channel mix of the Beta-1 file in this
  dialect: token shift by a shifted ``dma_copy`` of x's rows, D on the partitions by PE transposes, squared ReLU
  key, sigmoid receptance. Returns (out [T, D], new shift state [1, D]).
- ``griffin_rglru(x, gate_a, gate_x, lam, h0, c)``: Griffin's RG-LRU: a_t = sigmoid(lam)^(c r_t) (r_t =
  sigmoid(gate_a)), h_t = a_t h_{t-1} + sqrt(1 - a_t^2) (sigmoid(gate_x) x_t), channels on the partitions, the
  recurrence by ``tensor_tensor_scan``. x, gate_a, gate_x [Ch, L], lam / h0 [Ch, 1]. Returns (h [Ch, L], last h).

Written for nsim's tests in the style of those kernels; not copies of any file. No nsim imports.
"""
import nki
import nki.isa as nisa
import nki.language as nl

P_MAX = 128


def _load(src, shape, dtype):
  t = nl.ndarray(shape, dtype=dtype, buffer=nl.sbuf)
  nisa.dma_copy(dst=t, src=src)
  return t


def _transpose(x, rows, cols):
  """x [rows, cols] fp32 (SBUF) -> [cols, rows] in SBUF, through the PE."""
  t_ps = nl.ndarray((cols, rows), dtype=nl.float32, buffer=nl.psum)
  nisa.nc_transpose(dst=t_ps, data=x)
  t = nl.ndarray((cols, rows), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_copy(dst=t, src=t_ps)
  return t


@nki.jit
def mamba1_decode_step(x, z, dt, B, C, A, D, dt_bias, conv_w, conv_b, conv_state, ssm_state):
  batch, channels = x.shape
  N = A.shape[1]
  K = conv_w.shape[1]
  assert channels % P_MAX == 0 and K == 4
  y = nl.ndarray((batch, channels), dtype=x.dtype, buffer=nl.shared_hbm)
  for ct in nl.affine_range(channels // P_MAX):
    cs = nl.ds(ct * P_MAX, P_MAX)
    A_t = _load(A[cs, :], (P_MAX, N), nl.float32)
    D_t = _load(D[cs, :], (P_MAX, 1), nl.float32)
    dtb = _load(dt_bias[cs, :], (P_MAX, 1), nl.float32)
    cw = _load(conv_w[cs, :], (P_MAX, K), nl.float32)
    cb = _load(conv_b[cs, :], (P_MAX, 1), nl.float32)
    for b in nl.affine_range(batch):
      x_c = _load(x[b, cs], (P_MAX, 1), nl.float32)
      z_c = _load(z[b, cs], (P_MAX, 1), nl.float32)
      dt_c = _load(dt[b, cs], (P_MAX, 1), nl.float32)
      st = _load(conv_state[b, cs, :], (P_MAX, K), nl.float32)
      # shift the conv window left by one and append the new input; written back in place
      st_new = nl.ndarray((P_MAX, K), dtype=nl.float32, buffer=nl.sbuf)
      nisa.tensor_copy(dst=st_new[:, 0:K - 1], src=st[:, 1:K])
      nisa.tensor_copy(dst=st_new[:, K - 1:K], src=x_c)
      nisa.dma_copy(dst=conv_state[b, cs, :], src=st_new)
      # the causal conv at the newest position, then silu
      prod = nl.ndarray((P_MAX, K), dtype=nl.float32, buffer=nl.sbuf)
      nisa.tensor_tensor(dst=prod, data1=st_new, data2=cw, op=nl.multiply)
      conv = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
      nisa.tensor_reduce(dst=conv, op=nl.add, data=prod, axis=1, keepdims=True)
      xa = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
      nisa.activation(dst=xa, op=nl.silu, data=conv, bias=cb)
      # dt = softplus(dt + dt_bias)
      dts = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
      nisa.activation(dst=dts, op=nl.softplus, data=dt_c, bias=dtb)
      dtx = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
      nisa.tensor_tensor(dst=dtx, data1=dts, data2=xa, op=nl.multiply)
      # B and C rows of this token on every channel partition
      B_bc = _load(B[b:b + 1, :].broadcast(0, P_MAX), (P_MAX, N), nl.float32)
      C_bc = _load(C[b:b + 1, :].broadcast(0, P_MAX), (P_MAX, N), nl.float32)
      dA = nl.ndarray((P_MAX, N), dtype=nl.float32, buffer=nl.sbuf)
      nisa.activation(dst=dA, op=nl.exp, data=A_t, scale=dts)
      h = _load(ssm_state[b, cs, :], (P_MAX, N), nl.float32)
      dBx = nl.ndarray((P_MAX, N), dtype=nl.float32, buffer=nl.sbuf)
      nisa.tensor_scalar(dst=dBx, data=B_bc, op0=nl.multiply, operand0=dtx)
      h_new = nl.ndarray((P_MAX, N), dtype=nl.float32, buffer=nl.sbuf)
      nisa.tensor_tensor(dst=h_new, data1=h, data2=dA, op=nl.multiply)
      nisa.tensor_tensor(dst=h_new, data1=h_new, data2=dBx, op=nl.add)
      nisa.dma_copy(dst=ssm_state[b, cs, :], src=h_new)
      # y = C . h + D x, gated by silu(z)
      hc = nl.ndarray((P_MAX, N), dtype=nl.float32, buffer=nl.sbuf)
      nisa.tensor_tensor(dst=hc, data1=h_new, data2=C_bc, op=nl.multiply)
      yc = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
      nisa.tensor_reduce(dst=yc, op=nl.add, data=hc, axis=1, keepdims=True)
      nisa.scalar_tensor_tensor(dst=yc, data=xa, op0=nl.multiply, operand0=D_t, op1=nl.add, operand1=yc)
      g = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
      nisa.activation(dst=g, op=nl.silu, data=z_c)
      yo = nl.ndarray((P_MAX, 1), dtype=x.dtype, buffer=nl.sbuf)
      nisa.tensor_tensor(dst=yo, data1=yc, data2=g, op=nl.multiply)
      nisa.dma_copy(dst=y[b, cs], src=yo)
  return y


@nki.jit
def mamba1_selective_scan(x, delta, A, B, C, D, z, delta_bias, chunk=256):
  batch, channels, seq_len = x.shape
  N = A.shape[1]
  assert channels % P_MAX == 0 and seq_len % chunk == 0
  out = nl.ndarray((batch, channels, seq_len), dtype=x.dtype, buffer=nl.shared_hbm)
  # under LNC=2 the batch is dealt to the two programs
  n_prg = nl.num_programs(axes=0) if nl.program_ndim() > 0 else 1
  pid = nl.program_id(axis=0) if nl.program_ndim() > 0 else 0
  assert batch % n_prg == 0
  for bb in nl.affine_range(batch // n_prg):
    b = pid * (batch // n_prg) + bb
    for ct in nl.affine_range(channels // P_MAX):
      cs = nl.ds(ct * P_MAX, P_MAX)
      A_t = _load(A[cs, :], (P_MAX, N), nl.float32)
      D_t = _load(D[cs, :], (P_MAX, 1), nl.float32)
      db_t = _load(delta_bias[cs, :], (P_MAX, 1), nl.float32)
      h_last = nl.ndarray((P_MAX, N), dtype=nl.float32, buffer=nl.sbuf)
      nisa.memset(dst=h_last, value=0.0)
      for j in nl.sequential_range(seq_len // chunk):
        ls = nl.ds(j * chunk, chunk)
        d_sb = _load(delta[b, cs, ls], (P_MAX, chunk), nl.float32)
        x_sb = _load(x[b, cs, ls], (P_MAX, chunk), nl.float32)
        z_sb = _load(z[b, cs, ls], (P_MAX, chunk), nl.float32)
        dsp = nl.ndarray((P_MAX, chunk), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=dsp, op=nl.softplus, data=d_sb, bias=db_t)
        dx = nl.ndarray((P_MAX, chunk), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=dx, data1=dsp, data2=x_sb, op=nl.multiply)
        # every state at once: [128, N, chunk], delta broadcast over the states and A over the positions
        dA = nl.ndarray((P_MAX, N, chunk), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=dA, data1=dsp.expand_dim(1).broadcast(1, N),
                           data2=A_t.expand_dim(2).broadcast(2, chunk), op=nl.multiply)
        nisa.activation(dst=dA, op=nl.exp, data=dA)
        # B and C of the chunk on every channel partition (stride-0 DMA)
        B_bc = _load(B[b:b + 1, :, ls].broadcast(0, P_MAX), (P_MAX, N, chunk), nl.float32)
        C_bc = _load(C[b:b + 1, :, ls].broadcast(0, P_MAX), (P_MAX, N, chunk), nl.float32)
        dBx = nl.ndarray((P_MAX, N, chunk), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=dBx, data1=B_bc, data2=dx.expand_dim(1).broadcast(1, N), op=nl.multiply)
        h = nl.ndarray((P_MAX, N, chunk), dtype=nl.float32, buffer=nl.sbuf)
        for n in nl.affine_range(N):
          nisa.tensor_tensor_scan(dst=h[:, n, :], data0=dA[:, n, :], data1=dBx[:, n, :], initial=h_last[:, n:n + 1],
                                  op0=nl.multiply, op1=nl.add)
        nisa.tensor_copy(dst=h_last, src=h[:, :, chunk - 1])
        # y = sum_n C_n h_n: the states innermost (a permuted view) for the free-axis reduce
        nisa.tensor_tensor(dst=h, data1=h, data2=C_bc, op=nl.multiply)
        y = nl.ndarray((P_MAX, chunk), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=y, op=nl.add, data=h.permute((0, 2, 1)), axis=2)
        nisa.scalar_tensor_tensor(dst=y, data=x_sb, op0=nl.multiply, operand0=D_t, op1=nl.add, operand1=y)
        g = nl.ndarray((P_MAX, chunk), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=g, op=nl.silu, data=z_sb)
        o_sb = nl.ndarray((P_MAX, chunk), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=o_sb, data1=y, data2=g, op=nl.multiply)
        nisa.dma_copy(dst=out[b, cs, ls], src=o_sb)
  return out


def _head_T(src, h, T, d):
  """src[h] [T, d] -> [d, T] fp32 in SBUF (PE transposes of 128-token blocks)."""
  out = nl.ndarray((d, T), dtype=nl.float32, buffer=nl.sbuf)
  for tb in nl.affine_range((T + P_MAX - 1) // P_MAX):
    n = min(P_MAX, T - tb * P_MAX)
    blk = _load(src[h, nl.ds(tb * P_MAX, n), :], (n, d), nl.float32)
    t_ps = nl.ndarray((d, n), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_transpose(dst=t_ps, data=blk)
    nisa.tensor_copy(dst=out[:, nl.ds(tb * P_MAX, n)], src=t_ps)
  return out


@nki.jit
def rwkv6_wkv_sequential(r, k, v, w, u, state):
  H, T, d = r.shape
  assert d <= P_MAX
  o = nl.ndarray((H, T, d), dtype=r.dtype, buffer=nl.shared_hbm)
  s_out = nl.ndarray((H, d, d), dtype=nl.float32, buffer=nl.shared_hbm)
  k_flat = k.reshape((H, 1, T * d))
  v_flat = v.reshape((H, 1, T * d))
  o_flat = o.reshape((H, 1, T * d))
  for h in nl.affine_range(H):
    S = _load(state[h], (d, d), nl.float32)
    rT = _head_T(r, h, T, d)
    wT = _head_T(w, h, T, d)
    u_c = _load(u[h], (d, 1), nl.float32)
    ruT = nl.ndarray((d, T), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=ruT, data=rT, op0=nl.multiply, operand0=u_c)
    k_r = _load(k_flat[h], (1, T * d), nl.float32)
    v_r = _load(v_flat[h], (1, T * d), nl.float32)
    o_r = nl.ndarray((1, T * d), dtype=r.dtype, buffer=nl.sbuf)
    for t in nl.sequential_range(T):
      f = nl.ds(t * d, d)
      kv_ps = nl.ndarray((d, d), dtype=nl.float32, buffer=nl.psum)
      nisa.nc_matmul(dst=kv_ps, stationary=k_r[:, f], moving=v_r[:, f])
      kv = nl.ndarray((d, d), dtype=nl.float32, buffer=nl.sbuf)
      nisa.tensor_copy(dst=kv, src=kv_ps)
      o_ps = nl.ndarray((1, d), dtype=nl.float32, buffer=nl.psum)
      nisa.nc_matmul(dst=o_ps, stationary=rT[:, t:t + 1], moving=S)
      nisa.nc_matmul(dst=o_ps, stationary=ruT[:, t:t + 1], moving=kv, accumulate=True)
      nisa.tensor_copy(dst=o_r[:, f], src=o_ps)
      nisa.scalar_tensor_tensor(dst=S, data=S, op0=nl.multiply, operand0=wT[:, t:t + 1], op1=nl.add,
                                operand1=kv)
    nisa.dma_copy(dst=o_flat[h], src=o_r)
    nisa.dma_copy(dst=s_out[h], src=S)
  return o, s_out


@nki.jit
def rwkv6_wkv_chunked(r, k, v, w, u, state, chunk=32):
  H, T, d = r.shape
  L = chunk
  assert d <= P_MAX and L <= P_MAX and T % L == 0
  o = nl.ndarray((H, T, d), dtype=r.dtype, buffer=nl.shared_hbm)
  s_out = nl.ndarray((H, d, d), dtype=nl.float32, buffer=nl.shared_hbm)

  ones = nl.ndarray((d, L), dtype=nl.float32, buffer=nl.sbuf)
  nisa.memset(dst=ones, value=1.0)
  ones_l = nl.ndarray((L, L), dtype=nl.float32, buffer=nl.sbuf)
  nisa.memset(dst=ones_l, value=1.0)
  # strict[s, t] = 1 where t > s (key s strictly before query t)
  strict = nl.ndarray((L, L), dtype=nl.float32, buffer=nl.sbuf)
  nisa.affine_select(dst=strict, pattern=[[1, L]], channel_multiplier=-1, on_true_tile=ones_l, on_false_value=0.0,
                     cmp_op=nl.greater, offset=0)

  for h in nl.affine_range(H):
    S = _load(state[h], (d, d), nl.float32)
    # u on every token partition
    u_bc = _load(u[h:h + 1, :].broadcast(0, L), (L, d), nl.float32)
    for c in nl.sequential_range(T // L):
      rows = nl.ds(c * L, L)
      r_sb = _load(r[h, rows, :], (L, d), nl.float32)
      k_sb = _load(k[h, rows, :], (L, d), nl.float32)
      v_sb = _load(v[h, rows, :], (L, d), nl.float32)
      w_sb = _load(w[h, rows, :], (L, d), nl.float32)
      rT = _transpose(r_sb, L, d)
      kT = _transpose(k_sb, L, d)
      wT = _transpose(w_sb, L, d)
      # inclusive cumulative log decay along the chunk (key dim on the partitions)
      lw = nl.ndarray((d, L), dtype=nl.float32, buffer=nl.sbuf)
      nisa.activation(dst=lw, op=nl.log, data=wT)
      cum = nl.ndarray((d, L), dtype=nl.float32, buffer=nl.sbuf)
      nisa.tensor_tensor_scan(dst=cum, data0=ones, data1=lw, initial=0.0, op0=nl.multiply, op1=nl.add)
      ecum = nl.ndarray((d, L), dtype=nl.float32, buffer=nl.sbuf)
      nisa.tensor_tensor(dst=ecum, data1=cum, data2=lw, op=nl.subtract)
      # r~ = r exp(c_{t-1}), k~ = k exp(-c_t)
      rdT = nl.ndarray((d, L), dtype=nl.float32, buffer=nl.sbuf)
      nisa.activation(dst=rdT, op=nl.exp, data=ecum)
      nisa.tensor_tensor(dst=rdT, data1=rdT, data2=rT, op=nl.multiply)
      kdT = nl.ndarray((d, L), dtype=nl.float32, buffer=nl.sbuf)
      nisa.activation(dst=kdT, op=nl.exp, data=cum, scale=-1.0)
      nisa.tensor_tensor(dst=kdT, data1=kdT, data2=kT, op=nl.multiply)
      kd = _transpose(kdT, d, L)                                   # [L, d]
      # A^T[s, t] = k~_s . r~_t for s < t
      aT_ps = nl.ndarray((L, L), dtype=nl.float32, buffer=nl.psum)
      nisa.nc_matmul(dst=aT_ps, stationary=kdT, moving=rdT)
      aT = nl.ndarray((L, L), dtype=nl.float32, buffer=nl.sbuf)
      nisa.tensor_tensor(dst=aT, data1=aT_ps, data2=strict, op=nl.multiply)
      # the bonus: o_t += (r_t . (u * k_t)) v_t
      ruk = nl.ndarray((L, d), dtype=nl.float32, buffer=nl.sbuf)
      nisa.tensor_tensor(dst=ruk, data1=r_sb, data2=k_sb, op=nl.multiply)
      nisa.tensor_tensor(dst=ruk, data1=ruk, data2=u_bc, op=nl.multiply)
      bonus = nl.ndarray((L, 1), dtype=nl.float32, buffer=nl.sbuf)
      nisa.tensor_reduce(dst=bonus, op=nl.add, data=ruk, axis=1, keepdims=True)
      # o = A V + r~ S (+ bonus v)
      o_ps = nl.ndarray((L, d), dtype=nl.float32, buffer=nl.psum)
      nisa.nc_matmul(dst=o_ps, stationary=aT, moving=v_sb)
      nisa.nc_matmul(dst=o_ps, stationary=rdT, moving=S, accumulate=True)
      o_sb = nl.ndarray((L, d), dtype=r.dtype, buffer=nl.sbuf)
      nisa.scalar_tensor_tensor(dst=o_sb, data=v_sb, op0=nl.multiply, operand0=bonus, op1=nl.add, operand1=o_ps)
      nisa.dma_copy(dst=o[h, rows, :], src=o_sb)
      # S = diag(exp(c_last)) (S + k~^T V)
      kv_ps = nl.ndarray((d, d), dtype=nl.float32, buffer=nl.psum)
      nisa.nc_matmul(dst=kv_ps, stationary=kd, moving=v_sb)
      dec = nl.ndarray((d, 1), dtype=nl.float32, buffer=nl.sbuf)
      nisa.activation(dst=dec, op=nl.exp, data=cum[:, L - 1:L])
      nisa.tensor_tensor(dst=S, data1=S, data2=kv_ps, op=nl.add)
      nisa.tensor_scalar(dst=S, data=S, op0=nl.multiply, operand0=dec)
    nisa.dma_copy(dst=s_out[h], src=S)
  return o, s_out


@nki.jit
def rwkv_channel_mix(x, shift_state, mu_k, mu_r, w_k, w_v, w_r):
  T, D = x.shape
  F = w_k.shape[1]
  assert D == P_MAX and T % P_MAX == 0 and F % P_MAX == 0
  tp = P_MAX
  nf = F // tp
  dt = x.dtype
  out = nl.ndarray((T, D), dtype=dt, buffer=nl.shared_hbm)
  new_state = nl.ndarray((1, D), dtype=dt, buffer=nl.shared_hbm)

  mk = _load(mu_k, (D, 1), nl.float32)
  mr = _load(mu_r, (D, 1), nl.float32)
  wk = _load(w_k, (D, F), dt)
  wr = _load(w_r, (D, D), dt)
  wv = nl.ndarray((tp, nf, D), dtype=dt, buffer=nl.sbuf)
  nisa.dma_copy(dst=wv, src=w_v.reshape((nf, tp, D)).permute((1, 0, 2)))

  for t in nl.affine_range(T // tp):
    t0 = t * tp
    x_sb = _load(x[nl.ds(t0, tp), :], (tp, D), nl.float32)
    # the previous token of every row: x[t0 - 1 + i]; row 0 of the sequence takes the carried state
    p_sb = nl.ndarray((tp, D), dtype=nl.float32, buffer=nl.sbuf)
    if t == 0:
      nisa.dma_copy(dst=p_sb[0:1, :], src=shift_state)
      nisa.dma_copy(dst=p_sb[1:tp, :], src=x[0:tp - 1, :])
    else:
      nisa.dma_copy(dst=p_sb, src=x[nl.ds(t0 - 1, tp), :])
    xT = _transpose(x_sb, tp, D)
    pT = _transpose(p_sb, tp, D)
    dx = nl.ndarray((D, tp), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=dx, data1=pT, data2=xT, op=nl.subtract)
    xk = nl.ndarray((D, tp), dtype=dt, buffer=nl.sbuf)
    nisa.scalar_tensor_tensor(dst=xk, data=dx, op0=nl.multiply, operand0=mk, op1=nl.add, operand1=xT)
    xr = nl.ndarray((D, tp), dtype=dt, buffer=nl.sbuf)
    nisa.scalar_tensor_tensor(dst=xr, data=dx, op0=nl.multiply, operand0=mr, op1=nl.add, operand1=xT)
    kv_ps = nl.ndarray((D, tp), dtype=nl.float32, buffer=nl.psum)
    for f in nl.affine_range(nf):
      k_ps = nl.ndarray((tp, tp), dtype=nl.float32, buffer=nl.psum)
      nisa.nc_matmul(dst=k_ps, stationary=wk[:, nl.ds(f * tp, tp)], moving=xk)
      k_r = nl.ndarray((tp, tp), dtype=nl.float32, buffer=nl.sbuf)
      nisa.activation(dst=k_r, op=nl.relu, data=k_ps)
      k_sq = nl.ndarray((tp, tp), dtype=dt, buffer=nl.sbuf)
      nisa.tensor_tensor(dst=k_sq, data1=k_r, data2=k_r, op=nl.multiply)
      nisa.nc_matmul(dst=kv_ps, stationary=wv[:, f, :], moving=k_sq, accumulate=(f > 0))
    r_ps = nl.ndarray((D, tp), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=r_ps, stationary=wr, moving=xr)
    rs = nl.ndarray((D, tp), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=rs, op=nl.sigmoid, data=r_ps)
    oT = nl.ndarray((D, tp), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=oT, data1=rs, data2=kv_ps, op=nl.multiply)
    o_ps = nl.ndarray((tp, D), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_transpose(dst=o_ps, data=oT)
    o_sb = nl.ndarray((tp, D), dtype=dt, buffer=nl.sbuf)
    nisa.tensor_copy(dst=o_sb, src=o_ps)
    nisa.dma_copy(dst=out[nl.ds(t0, tp), :], src=o_sb)
  nisa.dma_copy(dst=new_state, src=x[T - 1:T, :])
  return out, new_state


@nki.jit
def griffin_rglru(x, gate_a, gate_x, lam, h0, c=8.0):
  Ch, L = x.shape
  assert Ch % P_MAX == 0
  h_out = nl.ndarray((Ch, L), dtype=x.dtype, buffer=nl.shared_hbm)
  h_last = nl.ndarray((Ch, 1), dtype=nl.float32, buffer=nl.shared_hbm)
  for ct in nl.affine_range(Ch // P_MAX):
    cs = nl.ds(ct * P_MAX, P_MAX)
    xs = _load(x[cs, :], (P_MAX, L), nl.float32)
    ga = _load(gate_a[cs, :], (P_MAX, L), nl.float32)
    gx = _load(gate_x[cs, :], (P_MAX, L), nl.float32)
    lm = _load(lam[cs, :], (P_MAX, 1), nl.float32)
    hi = _load(h0[cs, :], (P_MAX, 1), nl.float32)
    # log a = c r log(sigmoid(lam)) = -c r softplus(-lam)
    sp = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=sp, op=nl.softplus, data=lm, scale=-1.0)
    nisa.tensor_scalar(dst=sp, data=sp, op0=nl.multiply, operand0=-c)
    rg = nl.ndarray((P_MAX, L), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=rg, op=nl.sigmoid, data=ga)
    a = nl.ndarray((P_MAX, L), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=a, op=nl.exp, data=rg, scale=sp)
    # sqrt(1 - a^2) = sqrt(1 - exp(2 log a))
    a2 = nl.ndarray((P_MAX, L), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=a2, data1=a, data2=a, op=nl.multiply)
    mult = nl.ndarray((P_MAX, L), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=mult, op=nl.sqrt, data=a2, scale=-1.0, bias=1.0)
    ig = nl.ndarray((P_MAX, L), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=ig, op=nl.sigmoid, data=gx)
    bx = nl.ndarray((P_MAX, L), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=bx, data1=ig, data2=xs, op=nl.multiply)
    nisa.tensor_tensor(dst=bx, data1=bx, data2=mult, op=nl.multiply)
    hs = nl.ndarray((P_MAX, L), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor_scan(dst=hs, data0=a, data1=bx, initial=hi, op0=nl.multiply, op1=nl.add)
    ho = nl.ndarray((P_MAX, L), dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=ho, src=hs)
    nisa.dma_copy(dst=h_out[cs, :], src=ho)
    nisa.dma_copy(dst=h_last[cs, :], src=hs[:, L - 1:L])
  return h_out, h_last
