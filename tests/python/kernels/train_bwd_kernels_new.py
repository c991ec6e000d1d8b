"""Training backward passes and weight gradients in the new NKI dialect (``import nki``, ISA calls writing
``dst=``), written the way NxD-Training fused kernels and community Trainium training ports write them:

- ``swiglu_mlp_bwd(x, w_gate, w_up, w_down, dy, psum_accumulate=True, dma_transpose=False)``: backward of the
  SwiGLU MLP y = (silu(x W_gate) * (x W_up)) W_down. Per token tile of 128 the forward's gate/up are recomputed
  on TensorE, dH = dY W_down^T, d_gate = dH * up * silu'(gate), d_up = dH * silu(gate) (ScalarE sigmoid, VectorE
  products), dX = d_gate W_gate^T + d_up W_up^T, and the weight gradients dW_gate = X^T d_gate,
  dW_up = X^T d_up, dW_down = (silu(gate) * up)^T dY, accumulated over all token tiles in PSUM (fp32) and written
  as fp32 master grads. The activations' transposes (x^T, dY^T, d_gate^T, d_up^T) and the weights' transposes
  are PE transposes (``nc_transpose`` into PSUM then copied to SBUF) or, with ``dma_transpose=True``,
  ``nisa.dma_transpose`` (HBM -> SBUF for x, dY and the weights, SBUF -> SBUF for d_gate / d_up).
  ``psum_accumulate=False`` is the other common style: every token tile's dW partials land in a fresh PSUM tile
  and are added into fp32 SBUF accumulators on VectorE.
- ``linear_bwd_accum(x, dy, grad_w, grad_b)``: linear layer backward into existing fp32 grad buffers
  (``nt.mutable_tensor``, read-modify-written in place in HBM and returned): grad_w += X^T dY with the token
  tiles accumulated in PSUM, grad_b += column sums of dY over the tokens (a matmul with a ones vector).
  ``rmw_dma=True``: the read-modify-write by the DMA (``nisa.dma_compute(dst=blk, srcs=[blk, g], reduce_op=nl.add)``,
  0.3+'s form of the accumulating DMA) instead of load + VectorE add + store.
- ``gqa_proj_wgrad(x, dq, dk, dv, n_kv)``: weight gradients of the Q/K/V projections of a GQA layer: dW_q = X^T dQ,
  and for each shared K/V head the sum over its group of Q heads of X^T dK_h (dK, dV given per Q head, as the
  attention backward produces them): the group sum and the token sum are one PSUM accumulation group (every
  member's matmul accumulates into the shared head's columns). ``group_sum_on_vector=True``: the group summed
  first by one VectorE ``tensor_reduce`` over an ``.ap`` view with the group axis innermost, then one matmul.
- ``rope_rmsnorm_residual_bwd(x, residual, gamma, cos, sin, d_out, d_res, eps, interleaved)``: the fused RoPE /
  RMSNorm / residual-add backward of train_bwd_kernels.py written with new-dialect views: all heads' rotation pairs
  as [rows, NH, d_head / 2] views (slices, or stride-2 slices for interleaved pairs) read and written in place,
  cos / sin repeated over the heads by stride-0 ``.ap`` patterns, gamma broadcast to the partitions by a stride-0
  HBM read, the sum of squares from ScalarE's accumulator (``activation(reduce_res=)``), the ragged last token
  tile by ``[:rows]`` slices (dgamma's ones-matmul contracting over the valid rows only).
- ``linear_wgrad_lnc2(x, dy, grad_w)``: grad_w += X^T dY data-parallel over the two cores of an LNC=2 launch
  (``kernel[2]``): each core's half of the token tiles accumulated in PSUM, the partial grad blocks reduce-scattered
  SBUF to SBUF by ``nisa.sendrecv``, each core read-modify-writing its half of the columns of the shared mutable
  grad buffer.

Written for nsim's tests in the style of those kernels; not copies of any file. No nsim imports.
"""
import nki
import nki.isa as nisa
import nki.language as nl
import nki.typing as nt

P_MAX = 128


def _transpose_to(dst, src_sb, dtype):
  """dst[f, p] = src_sb[p, f] by a PE transpose into PSUM and a copy back to SBUF ([128, 128] at most)."""
  p, f = src_sb.shape
  t_ps = nl.ndarray((f, p), dtype=dtype, buffer=nl.psum)
  nisa.nc_transpose(dst=t_ps, data=src_sb)
  nisa.tensor_copy(dst=dst, src=t_ps)


@nki.jit
def swiglu_mlp_bwd(x, w_gate, w_up, w_down, dy, psum_accumulate=True, dma_transpose=False):
  T, H = x.shape
  H_, I = w_gate.shape
  assert H == H_ and w_up.shape == (H, I) and w_down.shape == (I, H) and dy.shape == (T, H)
  assert T % P_MAX == 0 and H % P_MAX == 0 and I % P_MAX == 0 and H <= 512 and I <= 512
  NT, HK, IK = T // P_MAX, H // P_MAX, I // P_MAX
  dt = x.dtype

  dx = nl.ndarray((T, H), dtype=dt, buffer=nl.shared_hbm)
  dw_gate = nl.ndarray((H, I), dtype=nl.float32, buffer=nl.shared_hbm)
  dw_up = nl.ndarray((H, I), dtype=nl.float32, buffer=nl.shared_hbm)
  dw_down = nl.ndarray((I, H), dtype=nl.float32, buffer=nl.shared_hbm)

  # weights resident in SBUF: W_gate / W_up as [128 h, I] row blocks (the forward's moving operands), their
  # transposes as [128 i, H] (dX's moving operands) and W_down^T as [128 h, I] (dH's moving operand)
  wg = nl.ndarray((P_MAX, HK, I), dtype=dt, buffer=nl.sbuf)
  wu = nl.ndarray((P_MAX, HK, I), dtype=dt, buffer=nl.sbuf)
  wd = nl.ndarray((P_MAX, IK, H), dtype=dt, buffer=nl.sbuf)
  for k in nl.affine_range(HK):
    nisa.dma_copy(dst=wg[:, k, :], src=w_gate[k * P_MAX:(k + 1) * P_MAX, :])
    nisa.dma_copy(dst=wu[:, k, :], src=w_up[k * P_MAX:(k + 1) * P_MAX, :])
  for c in nl.affine_range(IK):
    nisa.dma_copy(dst=wd[:, c, :], src=w_down[c * P_MAX:(c + 1) * P_MAX, :])

  wgT = nl.ndarray((P_MAX, IK, H), dtype=dt, buffer=nl.sbuf)
  wuT = nl.ndarray((P_MAX, IK, H), dtype=dt, buffer=nl.sbuf)
  wdT = nl.ndarray((P_MAX, HK, I), dtype=dt, buffer=nl.sbuf)
  for k in nl.affine_range(HK):
    hs = slice(k * P_MAX, (k + 1) * P_MAX)
    for c in nl.affine_range(IK):
      cs = slice(c * P_MAX, (c + 1) * P_MAX)
      if dma_transpose:
        nisa.dma_transpose(dst=wgT[:, c, hs], src=w_gate[hs, cs])
        nisa.dma_transpose(dst=wuT[:, c, hs], src=w_up[hs, cs])
        nisa.dma_transpose(dst=wdT[:, k, cs], src=w_down[cs, hs])
      else:
        _transpose_to(wgT[:, c, hs], wg[:, k, cs], dt)
        _transpose_to(wuT[:, c, hs], wu[:, k, cs], dt)
        _transpose_to(wdT[:, k, cs], wd[:, c, hs], dt)

  # fp32 weight-gradient accumulators: PSUM across all token tiles, or SBUF (VectorE adds per tile)
  acc_buf = nl.psum if psum_accumulate else nl.sbuf
  acc_g = [nl.ndarray((P_MAX, I), dtype=nl.float32, buffer=acc_buf) for _ in range(HK)]
  acc_u = [nl.ndarray((P_MAX, I), dtype=nl.float32, buffer=acc_buf) for _ in range(HK)]
  acc_d = [nl.ndarray((P_MAX, H), dtype=nl.float32, buffer=acc_buf) for _ in range(IK)]
  if not psum_accumulate:
    for a in acc_g + acc_u + acc_d:
      nisa.memset(dst=a, value=0.0)

  for t in nl.affine_range(NT):
    ts = slice(t * P_MAX, (t + 1) * P_MAX)
    x_sb = nl.ndarray((P_MAX, H), dtype=dt, buffer=nl.sbuf)
    nisa.dma_copy(dst=x_sb, src=x[ts, :])
    dy_sb = nl.ndarray((P_MAX, H), dtype=dt, buffer=nl.sbuf)
    nisa.dma_copy(dst=dy_sb, src=dy[ts, :])
    xT = nl.ndarray((P_MAX, HK, P_MAX), dtype=dt, buffer=nl.sbuf)
    dyT = nl.ndarray((P_MAX, HK, P_MAX), dtype=dt, buffer=nl.sbuf)
    for k in nl.affine_range(HK):
      hs = slice(k * P_MAX, (k + 1) * P_MAX)
      if dma_transpose:
        nisa.dma_transpose(dst=xT[:, k, :], src=x[ts, hs])
        nisa.dma_transpose(dst=dyT[:, k, :], src=dy[ts, hs])
      else:
        _transpose_to(xT[:, k, :], x_sb[:, hs], dt)
        _transpose_to(dyT[:, k, :], dy_sb[:, hs], dt)

    # recompute the forward's gate / up, and dH = dY W_down^T  ([128 tokens, I] each, K-tiled over H)
    gate_ps = nl.ndarray((P_MAX, I), dtype=nl.float32, buffer=nl.psum)
    up_ps = nl.ndarray((P_MAX, I), dtype=nl.float32, buffer=nl.psum)
    dh_ps = nl.ndarray((P_MAX, I), dtype=nl.float32, buffer=nl.psum)
    for k in nl.affine_range(HK):
      nisa.nc_matmul(dst=gate_ps, stationary=xT[:, k, :], moving=wg[:, k, :])
      nisa.nc_matmul(dst=up_ps, stationary=xT[:, k, :], moving=wu[:, k, :])
      nisa.nc_matmul(dst=dh_ps, stationary=dyT[:, k, :], moving=wdT[:, k, :])

    g = nl.ndarray((P_MAX, I), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=g, src=gate_ps)
    sg = nl.ndarray((P_MAX, I), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=sg, op=nl.sigmoid, data=g)
    silu = nl.ndarray((P_MAX, I), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=silu, data1=g, data2=sg, op=nl.multiply)
    up = nl.ndarray((P_MAX, I), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=up, src=up_ps)
    # silu'(g) = sg * (1 + g * (1 - sg))
    one_m = nl.ndarray((P_MAX, I), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=one_m, data=sg, op0=nl.multiply, operand0=-1.0, op1=nl.add, operand1=1.0)
    gs = nl.ndarray((P_MAX, I), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=gs, data1=g, data2=one_m, op=nl.multiply)
    dsilu = nl.ndarray((P_MAX, I), dtype=nl.float32, buffer=nl.sbuf)
    nisa.scalar_tensor_tensor(dst=dsilu, data=gs, op0=nl.add, operand0=1.0, op1=nl.multiply, operand1=sg)

    d_up = nl.ndarray((P_MAX, I), dtype=dt, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=d_up, data1=dh_ps, data2=silu, op=nl.multiply)
    dh_up = nl.ndarray((P_MAX, I), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=dh_up, data1=dh_ps, data2=up, op=nl.multiply)
    d_gate = nl.ndarray((P_MAX, I), dtype=dt, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=d_gate, data1=dh_up, data2=dsilu, op=nl.multiply)
    hmid = nl.ndarray((P_MAX, I), dtype=dt, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=hmid, data1=silu, data2=up, op=nl.multiply)

    # dX = d_gate W_gate^T + d_up W_up^T, contraction over I (d_gate^T, d_up^T stationary)
    dgT = nl.ndarray((P_MAX, IK, P_MAX), dtype=dt, buffer=nl.sbuf)
    duT = nl.ndarray((P_MAX, IK, P_MAX), dtype=dt, buffer=nl.sbuf)
    for c in nl.affine_range(IK):
      cs = slice(c * P_MAX, (c + 1) * P_MAX)
      if dma_transpose:
        nisa.dma_transpose(dst=dgT[:, c, :], src=d_gate[:, cs])
        nisa.dma_transpose(dst=duT[:, c, :], src=d_up[:, cs])
      else:
        _transpose_to(dgT[:, c, :], d_gate[:, cs], dt)
        _transpose_to(duT[:, c, :], d_up[:, cs], dt)
    dx_ps = nl.ndarray((P_MAX, H), dtype=nl.float32, buffer=nl.psum)
    for c in nl.affine_range(IK):
      nisa.nc_matmul(dst=dx_ps, stationary=dgT[:, c, :], moving=wgT[:, c, :])
      nisa.nc_matmul(dst=dx_ps, stationary=duT[:, c, :], moving=wuT[:, c, :])
    dx_sb = nl.ndarray((P_MAX, H), dtype=dt, buffer=nl.sbuf)
    nisa.tensor_copy(dst=dx_sb, src=dx_ps)
    nisa.dma_copy(dst=dx[ts, :], src=dx_sb)

    # weight gradients, contraction over this tile's tokens (the natural layouts are the operands)
    for k in nl.affine_range(HK):
      hs = slice(k * P_MAX, (k + 1) * P_MAX)
      if psum_accumulate:
        nisa.nc_matmul(dst=acc_g[k], stationary=x_sb[:, hs], moving=d_gate)
        nisa.nc_matmul(dst=acc_u[k], stationary=x_sb[:, hs], moving=d_up)
      else:
        pg = nl.ndarray((P_MAX, I), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=pg, stationary=x_sb[:, hs], moving=d_gate)
        nisa.tensor_tensor(dst=acc_g[k], data1=acc_g[k], data2=pg, op=nl.add)
        pu = nl.ndarray((P_MAX, I), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=pu, stationary=x_sb[:, hs], moving=d_up)
        nisa.tensor_tensor(dst=acc_u[k], data1=acc_u[k], data2=pu, op=nl.add)
    for c in nl.affine_range(IK):
      cs = slice(c * P_MAX, (c + 1) * P_MAX)
      if psum_accumulate:
        nisa.nc_matmul(dst=acc_d[c], stationary=hmid[:, cs], moving=dy_sb)
      else:
        pd = nl.ndarray((P_MAX, H), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=pd, stationary=hmid[:, cs], moving=dy_sb)
        nisa.tensor_tensor(dst=acc_d[c], data1=acc_d[c], data2=pd, op=nl.add)

  # fp32 master grads
  for k in nl.affine_range(HK):
    hs = slice(k * P_MAX, (k + 1) * P_MAX)
    for acc, out in ((acc_g[k], dw_gate), (acc_u[k], dw_up)):
      o = nl.ndarray((P_MAX, I), dtype=nl.float32, buffer=nl.sbuf)
      nisa.tensor_copy(dst=o, src=acc)
      nisa.dma_copy(dst=out[hs, :], src=o)
  for c in nl.affine_range(IK):
    o = nl.ndarray((P_MAX, H), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=o, src=acc_d[c])
    nisa.dma_copy(dst=dw_down[c * P_MAX:(c + 1) * P_MAX, :], src=o)
  return dx, dw_gate, dw_up, dw_down


@nki.jit
def linear_bwd_accum(x, dy, grad_w: nt.mutable_tensor, grad_b: nt.mutable_tensor, rmw_dma=False):
  T, K = x.shape
  T_, N = dy.shape
  assert T == T_ and grad_w.shape == (K, N) and grad_b.shape == (1, N)
  assert T % P_MAX == 0 and K % P_MAX == 0
  NT, KK = T // P_MAX, K // P_MAX
  NW = min(N, 512)
  assert N % NW == 0
  NN = N // NW

  # the activations stay resident: each byte of x and dY is read from HBM once
  x_sb = nl.ndarray((P_MAX, NT, K), dtype=x.dtype, buffer=nl.sbuf)
  dy_sb = nl.ndarray((P_MAX, NT, N), dtype=dy.dtype, buffer=nl.sbuf)
  for t in nl.affine_range(NT):
    nisa.dma_copy(dst=x_sb[:, t, :], src=x[t * P_MAX:(t + 1) * P_MAX, :])
    nisa.dma_copy(dst=dy_sb[:, t, :], src=dy[t * P_MAX:(t + 1) * P_MAX, :])
  ones = nl.ndarray((P_MAX, 1), dtype=dy.dtype, buffer=nl.sbuf)
  nisa.memset(dst=ones, value=1.0)

  for k in nl.affine_range(KK):
    for n in nl.affine_range(NN):
      ns = slice(n * NW, (n + 1) * NW)
      acc = nl.ndarray((P_MAX, NW), dtype=nl.float32, buffer=nl.psum)
      for t in nl.affine_range(NT):
        nisa.nc_matmul(dst=acc, stationary=x_sb[:, t, k * P_MAX:(k + 1) * P_MAX], moving=dy_sb[:, t, ns])
      g = nl.ndarray((P_MAX, NW), dtype=nl.float32, buffer=nl.sbuf)
      blk = grad_w[k * P_MAX:(k + 1) * P_MAX, ns]
      if rmw_dma:
        # the DMA does the read-modify-write: grad_w[blk] = grad_w[blk] + g
        nisa.tensor_copy(dst=g, src=acc)
        nisa.dma_compute(dst=blk, srcs=[blk, g], reduce_op=nl.add)
      else:
        nisa.dma_copy(dst=g, src=blk)
        nisa.tensor_tensor(dst=g, data1=g, data2=acc, op=nl.add)
        nisa.dma_copy(dst=blk, src=g)

  for n in nl.affine_range(NN):
    ns = slice(n * NW, (n + 1) * NW)
    bacc = nl.ndarray((1, NW), dtype=nl.float32, buffer=nl.psum)
    for t in nl.affine_range(NT):
      nisa.nc_matmul(dst=bacc, stationary=ones, moving=dy_sb[:, t, ns])
    b = nl.ndarray((1, NW), dtype=nl.float32, buffer=nl.sbuf)
    if rmw_dma:
      nisa.tensor_copy(dst=b, src=bacc)
      nisa.dma_compute(dst=grad_b[:, ns], srcs=[grad_b[:, ns], b], reduce_op=nl.add)
    else:
      nisa.dma_copy(dst=b, src=grad_b[:, ns])
      nisa.tensor_tensor(dst=b, data1=b, data2=bacc, op=nl.add)
      nisa.dma_copy(dst=grad_b[:, ns], src=b)
  return grad_w, grad_b


@nki.jit
def gqa_proj_wgrad(x, dq, dk, dv, n_q, n_kv, group_sum_on_vector=False):
  T, H = x.shape
  _, QD = dq.shape
  assert dk.shape == (T, QD) and dv.shape == (T, QD)
  assert T % P_MAX == 0 and H % P_MAX == 0 and QD <= 512 and QD % n_q == 0 and n_q % n_kv == 0
  NT, HK = T // P_MAX, H // P_MAX
  D = QD // n_q
  G = n_q // n_kv
  KD = n_kv * D

  dw_q = nl.ndarray((H, QD), dtype=nl.float32, buffer=nl.shared_hbm)
  dw_k = nl.ndarray((H, KD), dtype=nl.float32, buffer=nl.shared_hbm)
  dw_v = nl.ndarray((H, KD), dtype=nl.float32, buffer=nl.shared_hbm)

  for hk in nl.affine_range(HK):
    hs = slice(hk * P_MAX, (hk + 1) * P_MAX)
    acc_q = nl.ndarray((P_MAX, QD), dtype=nl.float32, buffer=nl.psum)
    acc_k = nl.ndarray((P_MAX, KD), dtype=nl.float32, buffer=nl.psum)
    acc_v = nl.ndarray((P_MAX, KD), dtype=nl.float32, buffer=nl.psum)
    for t in nl.affine_range(NT):
      ts = slice(t * P_MAX, (t + 1) * P_MAX)
      x_sb = nl.ndarray((P_MAX, P_MAX), dtype=x.dtype, buffer=nl.sbuf)
      nisa.dma_copy(dst=x_sb, src=x[ts, hs])
      dq_sb = nl.ndarray((P_MAX, QD), dtype=dq.dtype, buffer=nl.sbuf)
      nisa.dma_copy(dst=dq_sb, src=dq[ts, :])
      dk_sb = nl.ndarray((P_MAX, QD), dtype=dk.dtype, buffer=nl.sbuf)
      nisa.dma_copy(dst=dk_sb, src=dk[ts, :])
      dv_sb = nl.ndarray((P_MAX, QD), dtype=dv.dtype, buffer=nl.sbuf)
      nisa.dma_copy(dst=dv_sb, src=dv[ts, :])
      nisa.nc_matmul(dst=acc_q, stationary=x_sb, moving=dq_sb)
      if group_sum_on_vector:
        # the other style: sum each group's heads first (VectorE reduce over a [P, n_kv, D, G] view of the
        # [P, n_q * D] tile, the group axis innermost), then one matmul per projection
        for src, acc in ((dk_sb, acc_k), (dv_sb, acc_v)):
          red = nl.ndarray((P_MAX, KD), dtype=src.dtype, buffer=nl.sbuf)
          nisa.tensor_reduce(dst=red, op=nl.add, data=src.ap([[QD, P_MAX], [G * D, n_kv], [1, D], [D, G]]),
                             axis=3)
          nisa.nc_matmul(dst=acc, stationary=x_sb, moving=red)
        continue
      # every Q head of a group accumulates into its shared K/V head's columns: the group sum and the token
      # sum are one accumulation group
      for j in nl.static_range(n_kv):
        for g in nl.static_range(G):
          qh = j * G + g
          nisa.nc_matmul(dst=acc_k[:, j * D:(j + 1) * D], stationary=x_sb, moving=dk_sb[:, qh * D:(qh + 1) * D])
          nisa.nc_matmul(dst=acc_v[:, j * D:(j + 1) * D], stationary=x_sb, moving=dv_sb[:, qh * D:(qh + 1) * D])
    for acc, out, w in ((acc_q, dw_q, QD), (acc_k, dw_k, KD), (acc_v, dw_v, KD)):
      o = nl.ndarray((P_MAX, w), dtype=nl.float32, buffer=nl.sbuf)
      nisa.tensor_copy(dst=o, src=acc)
      nisa.dma_copy(dst=out[hs, :], src=o)
  return dw_q, dw_k, dw_v


@nki.jit
def rope_rmsnorm_residual_bwd(x, residual, gamma, cos, sin, d_out, d_res, eps=1e-6, interleaved=False):
  T, D = x.shape
  _, half = cos.shape
  Dh = 2 * half
  assert D % Dh == 0 and D <= 512
  NH = D // Dh
  NT = (T + P_MAX - 1) // P_MAX

  dx = nl.ndarray((T, D), dtype=x.dtype, buffer=nl.shared_hbm)
  dgamma = nl.ndarray((1, D), dtype=nl.float32, buffer=nl.shared_hbm)

  # gamma on every partition: a stride-0 partition read of the HBM row
  g_sb = nl.ndarray((P_MAX, D), dtype=nl.float32, buffer=nl.sbuf)
  nisa.dma_copy(dst=g_sb, src=gamma.ap([[0, P_MAX], [1, D]]))
  ones = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.memset(dst=ones, value=1.0)
  eps_sb = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.memset(dst=eps_sb, value=eps)
  dg_ps = nl.ndarray((1, D), dtype=nl.float32, buffer=nl.psum)

  for t in nl.affine_range(NT):
    t0 = t * P_MAX
    rows = min(P_MAX, T - t0)
    xa = nl.ndarray((P_MAX, D), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=xa[:rows, :], src=x[t0:t0 + rows, :])
    ra = nl.ndarray((P_MAX, D), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=ra[:rows, :], src=residual[t0:t0 + rows, :])
    r = nl.ndarray((P_MAX, D), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=r[:rows, :], data1=xa[:rows, :], data2=ra[:rows, :], op=nl.add)
    do = nl.ndarray((P_MAX, D), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=do[:rows, :], src=d_out[t0:t0 + rows, :])
    c = nl.ndarray((P_MAX, half), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=c[:rows, :], src=cos[t0:t0 + rows, :])
    s = nl.ndarray((P_MAX, half), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=s[:rows, :], src=sin[t0:t0 + rows, :])

    # RoPE backward for all heads at once: [rows, NH, half] views of the pairs, cos / sin repeated over the heads
    # by stride-0 access patterns
    do3 = do.reshape((P_MAX, NH, Dh))
    dn = nl.ndarray((P_MAX, D), dtype=nl.float32, buffer=nl.sbuf)
    dn3 = dn.reshape((P_MAX, NH, Dh))
    if interleaved:
      a, b = do3[:rows, :, 0:Dh:2], do3[:rows, :, 1:Dh:2]
      dn_a, dn_b = dn3[:rows, :, 0:Dh:2], dn3[:rows, :, 1:Dh:2]
    else:
      a, b = do3[:rows, :, 0:half], do3[:rows, :, half:Dh]
      dn_a, dn_b = dn3[:rows, :, 0:half], dn3[:rows, :, half:Dh]
    c_b = c.ap([[half, rows], [0, NH], [1, half]])
    s_b = s.ap([[half, rows], [0, NH], [1, half]])
    ac = nl.ndarray((P_MAX, NH, half), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=ac[:rows], data1=a, data2=c_b, op=nl.multiply)
    bs = nl.ndarray((P_MAX, NH, half), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=bs[:rows], data1=b, data2=s_b, op=nl.multiply)
    nisa.tensor_tensor(dst=dn_a, data1=ac[:rows], data2=bs[:rows], op=nl.add)
    bc = nl.ndarray((P_MAX, NH, half), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=bc[:rows], data1=b, data2=c_b, op=nl.multiply)
    as_ = nl.ndarray((P_MAX, NH, half), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=as_[:rows], data1=a, data2=s_b, op=nl.multiply)
    nisa.tensor_tensor(dst=dn_b, data1=bc[:rows], data2=as_[:rows], op=nl.subtract)

    # RMSNorm backward: rstd = rsqrt(sum(r^2) / D + eps) from ScalarE's accumulator
    sq = nl.ndarray((P_MAX, D), dtype=nl.float32, buffer=nl.sbuf)
    ss = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=sq[:rows], op=nl.square, data=r[:rows], reduce_op=nl.add, reduce_res=ss[:rows],
                    reduce_cmd=nisa.reduce_cmd.reset_reduce)
    rstd = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=rstd[:rows], op=nl.rsqrt, data=ss[:rows], scale=1.0 / D, bias=eps_sb[:rows])
    gdn = nl.ndarray((P_MAX, D), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=gdn[:rows], data1=dn[:rows], data2=g_sb[:rows], op=nl.multiply)
    gdr = nl.ndarray((P_MAX, D), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=gdr[:rows], data1=gdn[:rows], data2=r[:rows], op=nl.multiply)
    dot = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=dot[:rows], op=nl.add, data=gdr[:rows], axis=1)
    r2 = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=r2[:rows], data1=rstd[:rows], data2=rstd[:rows], op=nl.multiply)
    coef = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.scalar_tensor_tensor(dst=coef[:rows], data=dot[:rows], op0=nl.multiply, operand0=-1.0 / D,
                              op1=nl.multiply, operand1=r2[:rows])
    nisa.tensor_tensor(dst=coef[:rows], data1=coef[:rows], data2=rstd[:rows], op=nl.multiply)
    gdn_r = nl.ndarray((P_MAX, D), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=gdn_r[:rows], data=gdn[:rows], op0=nl.multiply, operand0=rstd[:rows])
    dr = nl.ndarray((P_MAX, D), dtype=nl.float32, buffer=nl.sbuf)
    nisa.scalar_tensor_tensor(dst=dr[:rows], data=r[:rows], op0=nl.multiply, operand0=coef[:rows], op1=nl.add,
                              operand1=gdn_r[:rows])

    # residual add backward: dx = dr + d_res
    dres = nl.ndarray((P_MAX, D), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=dres[:rows, :], src=d_res[t0:t0 + rows, :])
    dxt = nl.ndarray((P_MAX, D), dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=dxt[:rows], data1=dr[:rows], data2=dres[:rows], op=nl.add)
    nisa.dma_copy(dst=dx[t0:t0 + rows, :], src=dxt[:rows, :])

    # dgamma += ones^T (dn * r * rstd) over this tile's valid rows only
    xhat_dn = nl.ndarray((P_MAX, D), dtype=nl.float32, buffer=nl.sbuf)
    nisa.scalar_tensor_tensor(dst=xhat_dn[:rows], data=r[:rows], op0=nl.multiply, operand0=rstd[:rows],
                              op1=nl.multiply, operand1=dn[:rows])
    nisa.nc_matmul(dst=dg_ps, stationary=ones[:rows], moving=xhat_dn[:rows])

  dg = nl.ndarray((1, D), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_copy(dst=dg, src=dg_ps)
  nisa.dma_copy(dst=dgamma, src=dg)
  return dx, dgamma


@nki.jit
def linear_wgrad_lnc2(x, dy, grad_w: nt.mutable_tensor):
  """grad_w += X^T dY with the token tiles split over the two cores of an LNC=2 launch (``kernel[2]``): each core
  accumulates its half of the tokens into PSUM for every [128, N] grad block, the partials are reduce-scattered
  SBUF to SBUF (``nisa.sendrecv``: each core sends the peer the columns the peer owns) and each core
  read-modify-writes its half of the columns of the shared grad buffer. Launched without a grid it is the
  one-core kernel."""
  T, K = x.shape
  _, N = dy.shape
  assert T % P_MAX == 0 and K % P_MAX == 0 and N <= 512 and N % 2 == 0
  NT, KK = T // P_MAX, K // P_MAX
  n_prg = nl.num_programs(0)
  pid = nl.program_id(0)
  assert NT % n_prg == 0
  my_nt = NT // n_prg
  NH = N // n_prg

  for k in nl.affine_range(KK):
    ks = slice(k * P_MAX, (k + 1) * P_MAX)
    acc = nl.ndarray((P_MAX, N), dtype=nl.float32, buffer=nl.psum)
    for t in nl.affine_range(my_nt):
      t0 = (pid * my_nt + t) * P_MAX
      x_sb = nl.ndarray((P_MAX, P_MAX), dtype=x.dtype, buffer=nl.sbuf)
      nisa.dma_copy(dst=x_sb, src=x[t0:t0 + P_MAX, ks])
      dy_sb = nl.ndarray((P_MAX, N), dtype=dy.dtype, buffer=nl.sbuf)
      nisa.dma_copy(dst=dy_sb, src=dy[t0:t0 + P_MAX, :])
      nisa.nc_matmul(dst=acc, stationary=x_sb, moving=dy_sb)
    part = nl.ndarray((P_MAX, N), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=part, src=acc)
    mine = nl.ds(pid * NH, NH)
    g = nl.ndarray((P_MAX, NH), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=g, src=grad_w[ks, mine])
    nisa.tensor_tensor(dst=g, data1=g, data2=part[:, mine], op=nl.add)
    if n_prg == 2:
      peer = nl.ndarray((P_MAX, NH), dtype=nl.float32, buffer=nl.sbuf)
      nisa.sendrecv(src=part[:, nl.ds((1 - pid) * NH, NH)], dst=peer, send_to_rank=1 - pid,
                    recv_from_rank=1 - pid, pipe_id=k)
      nisa.tensor_tensor(dst=g, data1=g, data2=peer, op=nl.add)
    nisa.dma_copy(dst=grad_w[ks, mine], src=g)
  return grad_w
