"""Recurrent layers written the way public Trainium ports of speech / sequence models write them (new NKI
dialect: ``import nki``, ``nki.language as nl``, ``nki.isa as nisa``; every ISA call writes a ``dst``; the hidden
dim on the partitions so the recurrent matmul contracts over it without a per-step transpose of the state).

* ``lstm_layer(x, w_ih, w_hh, bias)``: x [T, B, I] (I <= 128, 128 % B == 0), w_ih [I, 4H], w_hh [H, 4H]
  (H % 128 == 0), bias [4H] (gate order i, f, g, o as torch) -> h [T, B, H].
  Phase 1 (hoisted): x^T for all T*B tokens (PE transposes of 128-token blocks), then the input projection of
  every step as one matmul group G^T = W_ih^T x^T ([4H, T*B] fp32, SBUF), 512 tokens per matmul.
  Phase 2: ``nl.sequential_range(T)``: z^T = W_hh^T h_{t-1}^T (H/128 accumulating matmuls per gate block) +
  G^T[:, t], the gates through sigmoid / tanh with the bias as the per-partition activation bias, c = f c + i g,
  h = o tanh(c); h^T and c^T stay in SBUF across the steps; h_t is transposed back and stored to out[t].
* ``linear_scan(a, b, h0, chunk)``: a, b [R, T], h0 [R, 1] -> h [R, T] with h_t = a_t h_{t-1} + b_t along the
  free dim: ``nisa.tensor_tensor_scan`` over chunks of ``chunk`` columns in a ``sequential_range``, each chunk
  started from the last column of the previous one (the fp32 carry kept in SBUF); ``reverse=True`` runs right to
  left (h_t = a_t h_{t+1} + b_t, an anti-causal / backward-direction scan): the chunk loop
  ``nl.sequential_range(T // chunk - 1, -1, -1)`` and the scan over column-reversed ``.ap`` views.
* ``ctc_forward(em, skip)``: the CTC forward (alpha) recurrence in log space over the [T, S] lattice, batch on
  the partitions: per frame the logsumexp of alpha[s], alpha[s-1] and alpha[s-2] + skip[s] (max, three exp, a
  log), plus the frame's emissions.

Written for nsim's tests; not a copy of any public file. No nsim imports.
"""
import nki
import nki.isa as nisa
import nki.language as nl

P_MAX = 128
F_MAX = 512


@nki.jit
def lstm_layer(x, w_ih, w_hh, bias):
  T, B, I = x.shape
  H = w_hh.shape[0]
  G = 4 * H
  assert I <= P_MAX and H % P_MAX == 0 and P_MAX % B == 0
  dt = x.dtype
  NH = H // P_MAX          # hidden blocks of 128
  NG = G // P_MAX          # gate blocks of 128
  N = T * B                # tokens
  out = nl.ndarray((T, B, H), dtype=dt, buffer=nl.shared_hbm)

  # weights, resident in SBUF
  wih = nl.ndarray((I, G), dtype=dt, buffer=nl.sbuf)
  nisa.dma_copy(dst=wih, src=w_ih)
  whh = nl.ndarray((P_MAX, NH, G), dtype=dt, buffer=nl.sbuf)
  for k in nl.affine_range(NH):
    nisa.dma_copy(dst=whh[:, k, :], src=w_hh[nl.ds(k * P_MAX, P_MAX), :])
  # bias as one column per gate block (the gate unit on the partitions)
  b_sb = nl.ndarray((P_MAX, NG), dtype=nl.float32, buffer=nl.sbuf)
  nisa.dma_copy(dst=b_sb, src=bias.reshape((NG, P_MAX)).ap([[1, P_MAX], [P_MAX, NG]]))

  # phase 1: x^T for all tokens, then the input projection of all steps at once
  x_flat = x.reshape((N, I))
  xT = nl.ndarray((I, N), dtype=dt, buffer=nl.sbuf)
  for blk in nl.affine_range(N // P_MAX):
    x_sb = nl.ndarray((P_MAX, I), dtype=dt, buffer=nl.sbuf)
    nisa.dma_copy(dst=x_sb, src=x_flat[nl.ds(blk * P_MAX, P_MAX), :])
    xt_ps = nl.ndarray((I, P_MAX), dtype=dt, buffer=nl.psum)
    nisa.nc_transpose(dst=xt_ps, data=x_sb)
    nisa.tensor_copy(dst=xT[:, nl.ds(blk * P_MAX, P_MAX)], src=xt_ps)

  gx = nl.ndarray((P_MAX, NG, N), dtype=nl.float32, buffer=nl.sbuf)
  NCOL = min(N, F_MAX)
  for g in nl.affine_range(NG):
    for n in nl.affine_range(N // NCOL):
      g_ps = nl.ndarray((P_MAX, NCOL), dtype=nl.float32, buffer=nl.psum)
      nisa.nc_matmul(dst=g_ps, stationary=wih[:, nl.ds(g * P_MAX, P_MAX)], moving=xT[:, nl.ds(n * NCOL, NCOL)])
      nisa.tensor_copy(dst=gx[:, g, nl.ds(n * NCOL, NCOL)], src=g_ps)

  # the carried state: h^T (matmul dtype) and c^T (fp32)
  hT = nl.ndarray((P_MAX, NH, B), dtype=dt, buffer=nl.sbuf)
  nisa.memset(dst=hT, value=0.0)
  cT = nl.ndarray((P_MAX, NH, B), dtype=nl.float32, buffer=nl.sbuf)
  nisa.memset(dst=cT, value=0.0)

  # phase 2: the recurrence
  for t in nl.sequential_range(T):
    gates = nl.ndarray((P_MAX, NG, B), dtype=nl.float32, buffer=nl.sbuf)
    # gate blocks [0, 2NH) are i and f, [2NH, 3NH) g, [3NH, 4NH) o
    for g0, n_blk, func in ((0, 2 * NH, nl.sigmoid), (2 * NH, NH, nl.tanh), (3 * NH, NH, nl.sigmoid)):
      for gg in nl.affine_range(n_blk):
        g = g0 + gg
        z_ps = nl.ndarray((P_MAX, B), dtype=nl.float32, buffer=nl.psum)
        for k in nl.affine_range(NH):
          nisa.nc_matmul(dst=z_ps, stationary=whh[:, k, nl.ds(g * P_MAX, P_MAX)], moving=hT[:, k, :])
        z = nl.ndarray((P_MAX, B), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=z, data1=z_ps, data2=gx[:, g, nl.ds(t * B, B)], op=nl.add)
        nisa.activation(dst=gates[:, g, :], op=func, data=z, bias=b_sb[:, nl.ds(g, 1)])
    for k in nl.affine_range(NH):
      ig = nl.ndarray((P_MAX, B), dtype=nl.float32, buffer=nl.sbuf)
      nisa.tensor_tensor(dst=ig, data1=gates[:, k, :], data2=gates[:, 2 * NH + k, :], op=nl.multiply)
      fc = nl.ndarray((P_MAX, B), dtype=nl.float32, buffer=nl.sbuf)
      nisa.tensor_tensor(dst=fc, data1=gates[:, NH + k, :], data2=cT[:, k, :], op=nl.multiply)
      nisa.tensor_tensor(dst=cT[:, k, :], data1=fc, data2=ig, op=nl.add)
      tc = nl.ndarray((P_MAX, B), dtype=nl.float32, buffer=nl.sbuf)
      nisa.activation(dst=tc, op=nl.tanh, data=cT[:, k, :])
      nisa.tensor_tensor(dst=hT[:, k, :], data1=gates[:, 3 * NH + k, :], data2=tc, op=nl.multiply)
      h_ps = nl.ndarray((B, P_MAX), dtype=dt, buffer=nl.psum)
      nisa.nc_transpose(dst=h_ps, data=hT[:, k, :])
      h_sb = nl.ndarray((B, P_MAX), dtype=dt, buffer=nl.sbuf)
      nisa.tensor_copy(dst=h_sb, src=h_ps)
      nisa.dma_copy(dst=out[t, :, nl.ds(k * P_MAX, P_MAX)], src=h_sb)
  return out


@nki.jit
def linear_scan(a, b, h0, chunk=512, reverse=False):
  R, T = a.shape
  assert R <= P_MAX and T % chunk == 0
  dt = a.dtype
  C = chunk
  out = nl.ndarray((R, T), dtype=dt, buffer=nl.shared_hbm)
  carry = nl.ndarray((R, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.dma_copy(dst=carry, src=h0)
  chunks = nl.sequential_range(T // C - 1, -1, -1) if reverse else nl.sequential_range(T // C)
  for c in chunks:
    a_sb = nl.ndarray((R, C), dtype=dt, buffer=nl.sbuf)
    nisa.dma_copy(dst=a_sb, src=a[:, nl.ds(c * C, C)])
    b_sb = nl.ndarray((R, C), dtype=dt, buffer=nl.sbuf)
    nisa.dma_copy(dst=b_sb, src=b[:, nl.ds(c * C, C)])
    h = nl.ndarray((R, C), dtype=nl.float32, buffer=nl.sbuf)
    if reverse:
      # right to left: the scan over views that walk the columns backwards; the carry is column 0
      back = [[C, R], [-1, C]]
      nisa.tensor_tensor_scan(dst=h.ap(back, offset=C - 1), data0=a_sb.ap(back, offset=C - 1),
                              data1=b_sb.ap(back, offset=C - 1), initial=carry, op0=nl.multiply, op1=nl.add)
      nisa.tensor_copy(dst=carry, src=h[:, 0:1])
    else:
      nisa.tensor_tensor_scan(dst=h, data0=a_sb, data1=b_sb, initial=carry, op0=nl.multiply, op1=nl.add)
      nisa.tensor_copy(dst=carry, src=h[:, nl.ds(C - 1, 1)])
    h_o = nl.ndarray((R, C), dtype=dt, buffer=nl.sbuf)
    nisa.tensor_copy(dst=h_o, src=h)
    nisa.dma_copy(dst=out[:, nl.ds(c * C, C)], src=h_o)
  return out


@nki.jit
def ctc_forward(em, skip):
  """CTC forward algorithm in log space, batch on the partitions: em [B, T, S] fp32/bf16, the log-probabilities
  of the extended label sequence (S = 2 L + 1 states: blank, l1, blank, l2, ...) gathered per frame; skip [B, S]
  fp32, 0 where the s-2 -> s transition is allowed (s a label differing from label s-2) else -1e30. Returns
  alpha [B, T, S] fp32: alpha_0 = em_0 on states 0, 1; alpha_t[s] = logsumexp(alpha_{t-1}[s], alpha_{t-1}[s-1],
  alpha_{t-1}[s-2] + skip[s]) + em_t[s] (a ``sequential_range`` over frames; -1e30 stands for -inf)."""
  B, T, S = em.shape
  assert B <= P_MAX and S >= 3
  NEG = -1.0e30
  out = nl.ndarray((B, T, S), dtype=nl.float32, buffer=nl.shared_hbm)
  skip_sb = nl.ndarray((B, S), dtype=nl.float32, buffer=nl.sbuf)
  nisa.dma_copy(dst=skip_sb, src=skip)

  alpha = nl.ndarray((B, S), dtype=nl.float32, buffer=nl.sbuf)
  nisa.memset(dst=alpha, value=NEG)
  e0 = nl.ndarray((B, S), dtype=em.dtype, buffer=nl.sbuf)
  nisa.dma_copy(dst=e0, src=em[:, 0, :])
  nisa.tensor_copy(dst=alpha[:, 0:2], src=e0[:, 0:2])
  nisa.dma_copy(dst=out[:, 0, :], src=alpha)

  sh1 = nl.ndarray((B, S), dtype=nl.float32, buffer=nl.sbuf)
  sh2 = nl.ndarray((B, S), dtype=nl.float32, buffer=nl.sbuf)
  nisa.memset(dst=sh1, value=NEG)
  nisa.memset(dst=sh2, value=NEG)
  for t in nl.sequential_range(1, T):
    e_t = nl.ndarray((B, S), dtype=em.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=e_t, src=em[:, t, :])
    # the shifted terms alpha[s-1] and alpha[s-2] + skip[s] (columns 0 and 0:2 stay -inf)
    nisa.tensor_copy(dst=sh1[:, 1:S], src=alpha[:, 0:S - 1])
    nisa.tensor_tensor(dst=sh2[:, 2:S], data1=alpha[:, 0:S - 2], data2=skip_sb[:, 2:S], op=nl.add)
    m = nl.ndarray((B, S), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=m, data1=alpha, data2=sh1, op=nl.maximum)
    nisa.tensor_tensor(dst=m, data1=m, data2=sh2, op=nl.maximum)
    acc = nl.ndarray((B, S), dtype=nl.float32, buffer=nl.sbuf)
    tmp = nl.ndarray((B, S), dtype=nl.float32, buffer=nl.sbuf)
    for i, term in enumerate((alpha, sh1, sh2)):
      d = nl.ndarray((B, S), dtype=nl.float32, buffer=nl.sbuf)
      nisa.tensor_tensor(dst=d, data1=term, data2=m, op=nl.subtract)
      if i == 0:
        nisa.activation(dst=acc, op=nl.exp, data=d)
      else:
        nisa.activation(dst=tmp, op=nl.exp, data=d)
        nisa.tensor_tensor(dst=acc, data1=acc, data2=tmp, op=nl.add)
    lse = nl.ndarray((B, S), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=lse, op=nl.log, data=acc)
    nisa.tensor_tensor(dst=lse, data1=lse, data2=m, op=nl.add)
    nisa.tensor_tensor(dst=alpha, data1=lse, data2=e_t, op=nl.add)
    nisa.dma_copy(dst=out[:, t, :], src=alpha)
  return out
