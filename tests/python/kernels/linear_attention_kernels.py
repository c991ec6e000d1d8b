"""Chunked linear attention and the Mamba-2 SSD chunked scan, written the way public Trainium ports of these
models are (new NKI dialect: ``import nki``, ``nki.language as nl``, ``nki.isa as nisa``; every ISA call writes a
``dst``; tokens on the partitions, the head dim on the partitions where a matmul contracts over it).

* ``chunked_linear_attention(q, k, v)``: q, k, v [H, S, d] -> o [H, S, d] with
  ``o_i = sum_{j <= i} (q_i . k_j) v_j``. Per chunk of C tokens: A^T = K Q^T ([key j, query i], C x C), the causal
  mask kept where i - j >= 0 (``nisa.affine_select``, or a 0/1 mask built once from ``nisa.iota`` and a compare),
  the intra-chunk part A V and the inter-chunk part Q S accumulated into one PSUM tile, then the running state
  S += K^T V (d x d, fp32) carried across chunks in PSUM (``accumulate=``) or in SBUF (a VectorE add).
  Heads are dealt to the programs of an LNC=2 launch by ``nl.program_id(0)``.
* ``quadratic_masked_attention(q, k, v)``: the same result by the quadratic form (every key block up to the
  diagonal, the diagonal block masked) - what chunking saves.
* ``ssd_chunked_scan(x, a, b, c)``: Mamba-2 SSD: x [H, S, p], log decays a [H, S] (dt * A < 0), B and C [H, S, N]
  -> y [H, S, p] with ``h_t = exp(a_t) h_{t-1} + B_t^T x_t``, ``y_t = C_t h_t``. Per chunk of L tokens: the
  cumulative sum of a (a triangular-ones matmul, or ``tensor_tensor_scan`` along a row), the segment sums
  a_cs[t] - a_cs[s] masked to -inf above the diagonal and exponentiated (L^T), (B C^T * L^T) as the stationary
  operand of the intra-chunk matmul with X, the inter-chunk term C diag(exp(a_cs)) H_prev accumulated into the
  same PSUM tile, the chunk state B^T diag(exp(a_cs[-1] - a_cs)) X and the recurrence
  H = exp(a_cs[-1]) H + state.
* ``gated_delta_decode(q, k, v, alpha, beta, state)``: one token of the gated delta rule per head,
  ``S = alpha S - beta (S k) k^T + beta v k^T``, ``o = S q``; S stored transposed ([d_k, d_v], d_k on the
  partitions); returns (o [H, d_v], new state [H, d_k, d_v]).

Written for nsim's tests; not a copy of any public file. No nsim imports.
"""
import nki
import nki.isa as nisa
import nki.language as nl

P_MAX = 128
NEG_INF = -3.0e38


def _programs():
  if nl.program_ndim() == 0:
    return 1, 0
  return nl.num_programs(axes=0), nl.program_id(axis=0)


def _load(src, shape, dtype):
  t = nl.ndarray(shape, dtype=dtype, buffer=nl.sbuf)
  nisa.dma_copy(dst=t, src=src)
  return t


def _transpose(x, rows, cols, dtype):
  """x [rows, cols] (SBUF) -> [cols, rows] in SBUF, through the PE."""
  t_ps = nl.ndarray((cols, rows), dtype=dtype, buffer=nl.psum)
  nisa.nc_transpose(dst=t_ps, data=x)
  t = nl.ndarray((cols, rows), dtype=dtype, buffer=nl.sbuf)
  nisa.tensor_copy(dst=t, src=t_ps)
  return t


@nki.jit
def chunked_linear_attention(q, k, v, chunk=128, mask="affine_select", state="psum"):
  H, S, d = q.shape
  C = chunk
  assert S % C == 0 and C <= P_MAX and d <= P_MAX
  dt = q.dtype
  out = nl.ndarray((H, S, d), dtype=dt, buffer=nl.shared_hbm)
  n_prg, pid = _programs()
  heads = H // n_prg

  if mask == "iota":
    # keep[j, i] = 1.0 where query i >= key j (j on the partitions)
    diff = nl.ndarray((C, C), dtype=nl.float32, buffer=nl.sbuf)
    nisa.iota(dst=diff, pattern=[[1, C]], offset=0, channel_multiplier=-1)
    keep = nl.ndarray((C, C), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=keep, data=diff, op0=nl.greater_equal, operand0=0.0)

  for hh in nl.affine_range(heads):
    h = pid * heads + hh
    s_ps = nl.ndarray((d, d), dtype=nl.float32, buffer=nl.psum)
    s_acc = nl.ndarray((d, d), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=s_acc, value=0.0)
    for c in nl.sequential_range(S // C):
      q_sb = _load(q[h, nl.ds(c * C, C), :], (C, d), dt)
      k_sb = _load(k[h, nl.ds(c * C, C), :], (C, d), dt)
      v_sb = _load(v[h, nl.ds(c * C, C), :], (C, d), dt)
      qT = _transpose(q_sb, C, d, dt)
      kT = _transpose(k_sb, C, d, dt)

      # A^T[j, i] = k_j . q_i, masked to j <= i
      aT_ps = nl.ndarray((C, C), dtype=nl.float32, buffer=nl.psum)
      nisa.nc_matmul(dst=aT_ps, stationary=kT, moving=qT)
      aT = nl.ndarray((C, C), dtype=dt, buffer=nl.sbuf)
      if mask == "iota":
        nisa.tensor_tensor(dst=aT, data1=aT_ps, data2=keep, op=nl.multiply)
      else:
        aT_f = nl.ndarray((C, C), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=aT_f, src=aT_ps)
        nisa.affine_select(dst=aT, pattern=[[1, C]], channel_multiplier=-1, on_true_tile=aT_f,
                           on_false_value=0.0, cmp_op=nl.greater_equal)

      # the state of the previous chunks as a matmul operand
      s_mm = nl.ndarray((d, d), dtype=dt, buffer=nl.sbuf)
      nisa.tensor_copy(dst=s_mm, src=s_acc)

      o_ps = nl.ndarray((C, d), dtype=nl.float32, buffer=nl.psum)
      nisa.nc_matmul(dst=o_ps, stationary=aT, moving=v_sb)
      nisa.nc_matmul(dst=o_ps, stationary=qT, moving=s_mm, accumulate=True)
      o_sb = nl.ndarray((C, d), dtype=dt, buffer=nl.sbuf)
      nisa.tensor_copy(dst=o_sb, src=o_ps)
      nisa.dma_copy(dst=out[h, nl.ds(c * C, C), :], src=o_sb)

      # S += K^T V
      if state == "psum":
        nisa.nc_matmul(dst=s_ps, stationary=k_sb, moving=v_sb, accumulate=(c > 0))
        nisa.tensor_copy(dst=s_acc, src=s_ps)
      else:
        kv_ps = nl.ndarray((d, d), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=kv_ps, stationary=k_sb, moving=v_sb)
        nisa.tensor_tensor(dst=s_acc, data1=s_acc, data2=kv_ps, op=nl.add)
  return out


@nki.jit
def quadratic_masked_attention(q, k, v, block=128):
  H, S, d = q.shape
  C = block
  dt = q.dtype
  out = nl.ndarray((H, S, d), dtype=dt, buffer=nl.shared_hbm)
  for h in nl.affine_range(H):
    for i in nl.affine_range(S // C):
      q_sb = _load(q[h, nl.ds(i * C, C), :], (C, d), dt)
      qT = _transpose(q_sb, C, d, dt)
      o_ps = nl.ndarray((C, d), dtype=nl.float32, buffer=nl.psum)
      for j in range(i + 1):
        k_sb = _load(k[h, nl.ds(j * C, C), :], (C, d), dt)
        v_sb = _load(v[h, nl.ds(j * C, C), :], (C, d), dt)
        kT = _transpose(k_sb, C, d, dt)
        aT_ps = nl.ndarray((C, C), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=aT_ps, stationary=kT, moving=qT)
        aT = nl.ndarray((C, C), dtype=dt, buffer=nl.sbuf)
        if j == i:
          aT_f = nl.ndarray((C, C), dtype=nl.float32, buffer=nl.sbuf)
          nisa.tensor_copy(dst=aT_f, src=aT_ps)
          nisa.affine_select(dst=aT, pattern=[[1, C]], channel_multiplier=-1, on_true_tile=aT_f,
                             on_false_value=0.0, cmp_op=nl.greater_equal)
        else:
          nisa.tensor_copy(dst=aT, src=aT_ps)
        nisa.nc_matmul(dst=o_ps, stationary=aT, moving=v_sb, accumulate=(j > 0))
      o_sb = nl.ndarray((C, d), dtype=dt, buffer=nl.sbuf)
      nisa.tensor_copy(dst=o_sb, src=o_ps)
      nisa.dma_copy(dst=out[h, nl.ds(i * C, C), :], src=o_sb)
  return out


@nki.jit
def ssd_chunked_scan(x, a, b, c, chunk=128, cumsum="matmul"):
  H, S, p = x.shape
  N = b.shape[2]
  L = chunk
  assert S % L == 0 and L <= P_MAX and N <= L and p <= 512
  dt = x.dtype
  y = nl.ndarray((H, S, p), dtype=dt, buffer=nl.shared_hbm)

  ones = nl.ndarray((L, L), dtype=nl.float32, buffer=nl.sbuf)
  nisa.memset(dst=ones, value=1.0)
  # tri[s, t] = 1 where t >= s: the cumulative-sum matrix
  tri = nl.ndarray((L, L), dtype=nl.float32, buffer=nl.sbuf)
  nisa.affine_select(dst=tri, pattern=[[1, L]], channel_multiplier=-1, on_true_tile=ones, on_false_value=0.0,
                     cmp_op=nl.greater_equal)

  for h in nl.affine_range(H):
    state = nl.ndarray((N, p), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=state, value=0.0)
    for ci in nl.sequential_range(S // L):
      rows = nl.ds(ci * L, L)
      x_sb = _load(x[h, rows, :], (L, p), dt)
      b_sb = _load(b[h, rows, :], (L, N), dt)
      c_sb = _load(c[h, rows, :], (L, N), dt)

      # a_cs[t] = sum_{s <= t} a[s] within the chunk: as a column acs [L, 1] and along the free dim of every
      # partition, rowb[s, t] = a_cs[t]
      acs_ps = nl.ndarray((L, 1), dtype=nl.float32, buffer=nl.psum)
      rowb_ps = nl.ndarray((L, L), dtype=nl.float32, buffer=nl.psum)
      if cumsum == "matmul":
        a_col = _load(a[h, rows], (L, 1), nl.float32)
        nisa.nc_matmul(dst=acs_ps, stationary=tri, moving=a_col)
        a_bc = nl.ndarray((L, L), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=a_bc, data=ones, op0=nl.multiply, operand0=a_col)
        nisa.nc_matmul(dst=rowb_ps, stationary=a_bc, moving=tri)
      else:
        a_row = _load(a[h:h + 1, rows], (1, L), nl.float32)
        acs_row = nl.ndarray((1, L), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor_scan(dst=acs_row, data0=ones[0:1, :], data1=a_row, initial=0.0, op0=nl.multiply,
                                op1=nl.add)
        nisa.nc_transpose(dst=acs_ps, data=acs_row)
        nisa.nc_matmul(dst=rowb_ps, stationary=ones[0:1, :], moving=acs_row)
      acs = nl.ndarray((L, 1), dtype=nl.float32, buffer=nl.sbuf)
      nisa.tensor_copy(dst=acs, src=acs_ps)
      rowb = nl.ndarray((L, L), dtype=nl.float32, buffer=nl.sbuf)
      nisa.tensor_copy(dst=rowb, src=rowb_ps)
      neg_acs = nl.ndarray((L, 1), dtype=nl.float32, buffer=nl.sbuf)
      nisa.tensor_scalar(dst=neg_acs, data=acs, op0=nl.multiply, operand0=-1.0)

      # L^T[s, t] = exp(segsum) = exp(a_cs[t] - a_cs[s]) for t >= s, else exp(-inf) = 0
      seg = nl.ndarray((L, L), dtype=nl.float32, buffer=nl.sbuf)
      nisa.tensor_scalar(dst=seg, data=rowb, op0=nl.add, operand0=neg_acs)
      seg_m = nl.ndarray((L, L), dtype=nl.float32, buffer=nl.sbuf)
      nisa.affine_select(dst=seg_m, pattern=[[1, L]], channel_multiplier=-1, on_true_tile=seg,
                         on_false_value=NEG_INF, cmp_op=nl.greater_equal)
      lT = nl.ndarray((L, L), dtype=nl.float32, buffer=nl.sbuf)
      nisa.activation(dst=lT, op=nl.exp, data=seg_m)

      # M^T = (C B^T)^T * L^T = (B C^T) * L^T  [s, t]
      bT = _transpose(b_sb, L, N, dt)
      cT = _transpose(c_sb, L, N, dt)
      gT_ps = nl.ndarray((L, L), dtype=nl.float32, buffer=nl.psum)
      nisa.nc_matmul(dst=gT_ps, stationary=bT, moving=cT)
      mT = nl.ndarray((L, L), dtype=dt, buffer=nl.sbuf)
      nisa.tensor_tensor(dst=mT, data1=gT_ps, data2=lT, op=nl.multiply)

      # C^T with column t scaled by exp(a_cs[t]) (the decay of the incoming state)
      ecs = nl.ndarray((N, L), dtype=nl.float32, buffer=nl.sbuf)
      nisa.activation(dst=ecs, op=nl.exp, data=rowb[0:N, :])
      cdecT = nl.ndarray((N, L), dtype=dt, buffer=nl.sbuf)
      nisa.tensor_tensor(dst=cdecT, data1=cT, data2=ecs, op=nl.multiply)
      st_mm = nl.ndarray((N, p), dtype=dt, buffer=nl.sbuf)
      nisa.tensor_copy(dst=st_mm, src=state)

      y_ps = nl.ndarray((L, p), dtype=nl.float32, buffer=nl.psum)
      nisa.nc_matmul(dst=y_ps, stationary=mT, moving=x_sb)
      nisa.nc_matmul(dst=y_ps, stationary=cdecT, moving=st_mm, accumulate=True)
      y_sb = nl.ndarray((L, p), dtype=dt, buffer=nl.sbuf)
      nisa.tensor_copy(dst=y_sb, src=y_ps)
      nisa.dma_copy(dst=y[h, rows, :], src=y_sb)

      # chunk state B^T diag(exp(a_cs[-1] - a_cs)) X and H = exp(a_cs[-1]) H + state
      dec_end = nl.ndarray((L, 1), dtype=nl.float32, buffer=nl.sbuf)
      nisa.activation(dst=dec_end, op=nl.exp, data=acs, scale=-1.0, bias=rowb[:, L - 1:L])
      b_dec = nl.ndarray((L, N), dtype=dt, buffer=nl.sbuf)
      nisa.tensor_scalar(dst=b_dec, data=b_sb, op0=nl.multiply, operand0=dec_end)
      cs_ps = nl.ndarray((N, p), dtype=nl.float32, buffer=nl.psum)
      nisa.nc_matmul(dst=cs_ps, stationary=b_dec, moving=x_sb)
      chunk_dec = nl.ndarray((N, 1), dtype=nl.float32, buffer=nl.sbuf)
      nisa.activation(dst=chunk_dec, op=nl.exp, data=rowb[0:N, L - 1:L])
      nisa.scalar_tensor_tensor(dst=state, data=state, op0=nl.multiply, operand0=chunk_dec, op1=nl.add,
                                operand1=cs_ps)
  return y


@nki.jit
def gated_delta_decode(q, k, v, alpha, beta, state):
  """q, k [H, dk], v [H, dv], alpha, beta [H] (fp32), state [H, dk, dv] (fp32, S^T) -> (o [H, dv], new state)."""
  H, dk = q.shape
  dv = v.shape[1]
  dt = q.dtype
  o = nl.ndarray((H, dv), dtype=dt, buffer=nl.shared_hbm)
  new_state = nl.ndarray((H, dk, dv), dtype=nl.float32, buffer=nl.shared_hbm)
  for h in nl.affine_range(H):
    st = _load(state[h], (dk, dv), nl.float32)
    k_col = _load(k[h], (dk, 1), dt)
    q_col = _load(q[h], (dk, 1), dt)
    k_row = _load(k[h:h + 1, :], (1, dk), dt)
    v_row = _load(v[h:h + 1, :], (1, dv), dt)
    # alpha and beta broadcast to every partition straight from HBM (stride-0 partition step)
    al = _load(alpha.ap([[0, dk], [1, 1]], offset=h), (dk, 1), nl.float32)
    be = _load(beta.ap([[0, 1], [1, 1]], offset=h), (1, 1), nl.float32)

    k_f = nl.ndarray((dk, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=k_f, src=k_col)
    # u = S k = S^T^T k: [1, dv]
    u_ps = nl.ndarray((1, dv), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=u_ps, stationary=k_f, moving=st)
    # w = beta * (v - u)
    w = nl.ndarray((1, dv), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=w, data1=v_row, data2=u_ps, op=nl.subtract)
    nisa.tensor_scalar(dst=w, data=w, op0=nl.multiply, operand0=be)
    # S^T = alpha S^T + k w^T
    k_rf = nl.ndarray((1, dk), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=k_rf, src=k_row)
    kw_ps = nl.ndarray((dk, dv), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=kw_ps, stationary=k_rf, moving=w)
    st_new = nl.ndarray((dk, dv), dtype=nl.float32, buffer=nl.sbuf)
    nisa.scalar_tensor_tensor(dst=st_new, data=st, op0=nl.multiply, operand0=al, op1=nl.add, operand1=kw_ps)
    # o = S q
    q_f = nl.ndarray((dk, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=q_f, src=q_col)
    o_ps = nl.ndarray((1, dv), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=o_ps, stationary=q_f, moving=st_new)
    o_sb = nl.ndarray((1, dv), dtype=dt, buffer=nl.sbuf)
    nisa.tensor_copy(dst=o_sb, src=o_ps)
    nisa.dma_copy(dst=o[h:h + 1, :], src=o_sb)
    nisa.dma_copy(dst=new_state[h], src=st_new)
  return o, new_state
