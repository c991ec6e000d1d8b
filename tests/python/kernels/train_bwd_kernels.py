"""Training backward passes and weight gradients in the Beta-1 dialect (``neuronxcc.nki``), written the way
neuronx-distributed's fused training kernels and the nki-samples backward kernels write them (arange index grids,
value-returning ``nl`` / ``nisa`` calls, ``psum[...] += nisa.nc_matmul(...)`` accumulation, 2-space indentation):

- ``linear_bwd_accum(x, dy, grad_w, grad_b)``: linear layer backward into existing fp32 grad buffers (Beta-1
  in-place arguments annotated ``nt.mutable_tensor`` and returned): grad_w += X^T dY, the token tiles
  accumulated in PSUM (one ``+=`` per tile) and the buffer read-modify-written in HBM once per [128, 512] block;
  grad_b += the column sums of dY over the tokens, a matmul with a ones vector accumulated over the tiles.
- ``rope_rmsnorm_residual_bwd(x, residual, gamma, cos, sin, d_out, d_res, eps)``: one fused kernel for the
  backward of r = x + residual (the residual stream, also an output of the forward), n = rmsnorm(r) * gamma,
  out = rope(n) (RoPE per head of d_head = 2 * cos.shape[1], cos / sin [T, d_head / 2]; rotate-half pairs
  (j, j + d_head / 2) or, ``interleaved=True``, GPT-J pairs (2j, 2j + 1) by stride-2 index expressions). The RoPE
  backward is the transposed rotation (sin negated): dn1 = do1 cos + do2 sin, dn2 = do2 cos - do1 sin; the RMSNorm
  backward recomputes rstd per row, dr = rstd * (gamma dn - r rstd^2 mean(gamma dn r)); the residual add's
  backward adds the gradient d_res of the residual output: dx = d_residual = dr + d_res. dgamma = the sum over
  the tokens of dn * r * rstd (fp32), a ones-vector matmul accumulated in PSUM across the token tiles. T need not
  be a multiple of 128: the last tile's rows are masked and zero-filled.
- ``linear_bwd_accum_rmw(x, dy, grad_w, grad_b)``: the same update with the read-modify-write done by the DMA
  (``nisa.dma_copy(..., dst_rmw_op=np.add)``, an accumulating DMA into the fp32 buffer; no load of the old grads).
- ``swiglu_mlp_bwd(x, w_gate, w_up, w_down, dy)``: the SwiGLU MLP backward of train_bwd_kernels_new.py as a
  Beta-1 author writes it: x^T / dY^T and the weight transposes by ``nl.load_transpose2d`` (DMA transposes),
  ``nl.matmul(..., transpose_x=True)`` for the recomputed gate / up and dH = dY W_down^T, ``nl.silu`` /
  ``nl.silu_dx`` on ScalarE, d_gate^T / d_up^T by ``nisa.nc_transpose`` (PE), and the weight gradients
  accumulated across the token tiles in block-dim PSUM tiles (``acc[k] += nisa.nc_matmul(...)``), stored as fp32.
- ``gqa_proj_wgrad(x, dq, dk, dv, n_q, n_kv)``: the GQA projection weight gradients of
  train_bwd_kernels_new.py in Beta 1: every Q head's matmul of a group accumulates (``+=``) into its shared
  K/V head's column window of the PSUM accumulator (``acc_k[i_p, j * D + i_d] += nisa.nc_matmul(...)``).

Written for nsim's tests in the style of those kernels; not copies of any file. No nsim imports.
"""
import numpy as np

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl
import neuronxcc.nki.typing as nt

PMAX = nl.tile_size.pmax            # 128 partitions
FMAX = nl.tile_size.psum_fmax       # 512 fp32 per PSUM bank


@nki.jit
def linear_bwd_accum(x, dy, grad_w: nt.mutable_tensor, grad_b: nt.mutable_tensor):
  T, K = x.shape
  _, N = dy.shape
  assert T % PMAX == 0 and K % PMAX == 0
  NW = min(N, FMAX)
  assert N % NW == 0

  i_p = nl.arange(PMAX)[:, None]
  i_k = nl.arange(PMAX)[None, :]
  i_n = nl.arange(NW)[None, :]
  i_1 = nl.arange(1)[:, None]

  for k in nl.affine_range(K // PMAX):
    for n in nl.affine_range(N // NW):
      acc = nl.zeros((PMAX, NW), dtype=nl.float32, buffer=nl.psum)
      for t in nl.affine_range(T // PMAX):
        x_t = nl.load(x[t * PMAX + i_p, k * PMAX + i_k])
        dy_t = nl.load(dy[t * PMAX + i_p, n * NW + i_n])
        acc += nisa.nc_matmul(x_t, dy_t)
      g = nl.load(grad_w[k * PMAX + i_p, n * NW + i_n])
      nl.store(grad_w[k * PMAX + i_p, n * NW + i_n], value=nl.add(g, acc))

  ones = nl.ones((PMAX, 1), dtype=dy.dtype)
  for n in nl.affine_range(N // NW):
    bacc = nl.zeros((1, NW), dtype=nl.float32, buffer=nl.psum)
    for t in nl.affine_range(T // PMAX):
      dy_t = nl.load(dy[t * PMAX + i_p, n * NW + i_n])
      bacc += nisa.nc_matmul(ones, dy_t)
    b = nl.load(grad_b[i_1, n * NW + i_n])
    nl.store(grad_b[i_1, n * NW + i_n], value=nl.add(b, bacc))
  return grad_w, grad_b


@nki.jit
def rope_rmsnorm_residual_bwd(x, residual, gamma, cos, sin, d_out, d_res, eps=1e-6, interleaved=False):
  T, D = x.shape
  _, half = cos.shape
  Dh = 2 * half
  assert D % Dh == 0 and D <= FMAX
  NH = D // Dh

  dx = nl.ndarray((T, D), dtype=x.dtype, buffer=nl.shared_hbm)
  dgamma = nl.ndarray((1, D), dtype=nl.float32, buffer=nl.shared_hbm)

  i_p = nl.arange(PMAX)[:, None]
  i_d = nl.arange(D)[None, :]
  i_h = nl.arange(half)[None, :]

  g_row = nl.load(gamma.reshape((1, D)), dtype=nl.float32)
  g_b = g_row.broadcast_to((PMAX, D))
  ones = nl.ones((PMAX, 1), dtype=nl.float32)
  dg_ps = nl.zeros((1, D), dtype=nl.float32, buffer=nl.psum)

  for t in nl.affine_range((T + PMAX - 1) // PMAX):
    valid = t * PMAX + i_p < T
    # zero-filled: the rows past T contribute nothing to dgamma
    r = nl.zeros((PMAX, D), dtype=nl.float32)
    r[i_p, i_d] = nl.add(nl.load(x[t * PMAX + i_p, i_d], dtype=nl.float32, mask=valid),
                         nl.load(residual[t * PMAX + i_p, i_d], dtype=nl.float32, mask=valid), mask=valid)
    do = nl.load(d_out[t * PMAX + i_p, i_d], dtype=nl.float32, mask=valid)
    c = nl.load(cos[t * PMAX + i_p, i_h], dtype=nl.float32, mask=valid)
    s = nl.load(sin[t * PMAX + i_p, i_h], dtype=nl.float32, mask=valid)

    # RoPE backward: the rotation by -theta, on (first half, second half) of each head or on (even, odd) pairs
    dn = nl.zeros((PMAX, D), dtype=nl.float32)
    for h in nl.static_range(NH):
      if interleaved:
        lo, hi = h * Dh + 2 * i_h, h * Dh + 2 * i_h + 1
      else:
        lo, hi = h * Dh + i_h, h * Dh + half + i_h
      a = do[i_p, lo]
      b = do[i_p, hi]
      dn[i_p, lo] = nl.add(nl.multiply(a, c, mask=valid), nl.multiply(b, s, mask=valid), mask=valid)
      dn[i_p, hi] = nl.subtract(nl.multiply(b, c, mask=valid), nl.multiply(a, s, mask=valid), mask=valid)

    # RMSNorm backward (rstd recomputed)
    ms = nl.mean(nl.square(r), axis=[1], keepdims=True)
    rstd = nl.rsqrt(nl.add(ms, eps))
    gdn = nl.multiply(dn, g_b)
    dot = nl.mean(nl.multiply(gdn, r), axis=[1], keepdims=True)
    coef = nl.multiply(dot, nl.multiply(rstd, nl.multiply(rstd, rstd)))
    dr = nl.subtract(nl.multiply(gdn, rstd), nl.multiply(r, coef))

    # residual add backward
    dres = nl.load(d_res[t * PMAX + i_p, i_d], dtype=nl.float32, mask=valid)
    nl.store(dx[t * PMAX + i_p, i_d], value=nl.add(dr, dres, mask=valid), mask=valid)

    # dgamma: column sums over the tokens on TensorE
    dg_ps += nisa.nc_matmul(ones, nl.multiply(dn, nl.multiply(r, rstd)))

  nl.store(dgamma, value=nl.copy(dg_ps, dtype=nl.float32))
  return dx, dgamma


@nki.jit
def linear_bwd_accum_rmw(x, dy, grad_w: nt.mutable_tensor, grad_b: nt.mutable_tensor):
  T, K = x.shape
  _, N = dy.shape
  assert T % PMAX == 0 and K % PMAX == 0
  NW = min(N, FMAX)
  assert N % NW == 0

  i_p = nl.arange(PMAX)[:, None]
  i_k = nl.arange(PMAX)[None, :]
  i_n = nl.arange(NW)[None, :]
  i_1 = nl.arange(1)[:, None]

  for k in nl.affine_range(K // PMAX):
    for n in nl.affine_range(N // NW):
      acc = nl.zeros((PMAX, NW), dtype=nl.float32, buffer=nl.psum)
      for t in nl.affine_range(T // PMAX):
        x_t = nl.load(x[t * PMAX + i_p, k * PMAX + i_k])
        dy_t = nl.load(dy[t * PMAX + i_p, n * NW + i_n])
        acc += nisa.nc_matmul(x_t, dy_t)
      g = nl.copy(acc, dtype=nl.float32)
      nisa.dma_copy(dst=grad_w[k * PMAX + i_p, n * NW + i_n], src=g, dst_rmw_op=np.add)

  ones = nl.ones((PMAX, 1), dtype=dy.dtype)
  for n in nl.affine_range(N // NW):
    bacc = nl.zeros((1, NW), dtype=nl.float32, buffer=nl.psum)
    for t in nl.affine_range(T // PMAX):
      dy_t = nl.load(dy[t * PMAX + i_p, n * NW + i_n])
      bacc += nisa.nc_matmul(ones, dy_t)
    nisa.dma_copy(dst=grad_b[i_1, n * NW + i_n], src=nl.copy(bacc, dtype=nl.float32), dst_rmw_op=np.add)
  return grad_w, grad_b


@nki.jit
def swiglu_mlp_bwd(x, w_gate, w_up, w_down, dy):
  T, H = x.shape
  _, I = w_gate.shape
  assert T % PMAX == 0 and H % PMAX == 0 and I % PMAX == 0 and H <= FMAX and I <= FMAX
  NT, HK, IK = T // PMAX, H // PMAX, I // PMAX
  dt = x.dtype

  dx = nl.ndarray((T, H), dtype=dt, buffer=nl.shared_hbm)
  dw_gate = nl.ndarray((H, I), dtype=nl.float32, buffer=nl.shared_hbm)
  dw_up = nl.ndarray((H, I), dtype=nl.float32, buffer=nl.shared_hbm)
  dw_down = nl.ndarray((I, H), dtype=nl.float32, buffer=nl.shared_hbm)

  i_p = nl.arange(PMAX)[:, None]
  i_f = nl.arange(PMAX)[None, :]
  i_h = nl.arange(H)[None, :]
  i_i = nl.arange(I)[None, :]

  wg = nl.ndarray((HK, nl.par_dim(PMAX), I), dtype=dt)
  wu = nl.ndarray((HK, nl.par_dim(PMAX), I), dtype=dt)
  wdT = nl.ndarray((HK, nl.par_dim(PMAX), I), dtype=dt)
  wgT = nl.ndarray((IK, nl.par_dim(PMAX), H), dtype=dt)
  wuT = nl.ndarray((IK, nl.par_dim(PMAX), H), dtype=dt)
  for k in nl.affine_range(HK):
    wg[k, i_p, i_i] = nl.load(w_gate[k * PMAX + i_p, i_i])
    wu[k, i_p, i_i] = nl.load(w_up[k * PMAX + i_p, i_i])
    for c in nl.affine_range(IK):
      wdT[k, i_p, c * PMAX + i_f] = nl.load_transpose2d(w_down[c * PMAX:(c + 1) * PMAX, k * PMAX:(k + 1) * PMAX])
      wgT[c, i_p, k * PMAX + i_f] = nl.load_transpose2d(w_gate[k * PMAX:(k + 1) * PMAX, c * PMAX:(c + 1) * PMAX])
      wuT[c, i_p, k * PMAX + i_f] = nl.load_transpose2d(w_up[k * PMAX:(k + 1) * PMAX, c * PMAX:(c + 1) * PMAX])

  acc_g = nl.zeros((HK, nl.par_dim(PMAX), I), dtype=nl.float32, buffer=nl.psum)
  acc_u = nl.zeros((HK, nl.par_dim(PMAX), I), dtype=nl.float32, buffer=nl.psum)
  acc_d = nl.zeros((IK, nl.par_dim(PMAX), H), dtype=nl.float32, buffer=nl.psum)

  for t in nl.affine_range(NT):
    x_t = nl.load(x[t * PMAX + i_p, i_h])
    dy_t = nl.load(dy[t * PMAX + i_p, i_h])

    gate_ps = nl.zeros((PMAX, I), dtype=nl.float32, buffer=nl.psum)
    up_ps = nl.zeros((PMAX, I), dtype=nl.float32, buffer=nl.psum)
    dh_ps = nl.zeros((PMAX, I), dtype=nl.float32, buffer=nl.psum)
    for k in nl.affine_range(HK):
      xT = nl.load_transpose2d(x[t * PMAX:(t + 1) * PMAX, k * PMAX:(k + 1) * PMAX])
      dyT = nl.load_transpose2d(dy[t * PMAX:(t + 1) * PMAX, k * PMAX:(k + 1) * PMAX])
      gate_ps += nl.matmul(xT, wg[k], transpose_x=True)
      up_ps += nl.matmul(xT, wu[k], transpose_x=True)
      dh_ps += nl.matmul(dyT, wdT[k], transpose_x=True)

    silu = nl.silu(gate_ps)
    dsilu = nl.silu_dx(gate_ps)
    up = nl.copy(up_ps, dtype=nl.float32)
    d_up = nl.multiply(dh_ps, silu, dtype=dt)
    d_gate = nl.multiply(nl.multiply(dh_ps, up), dsilu, dtype=dt)
    hmid = nl.multiply(silu, up, dtype=dt)

    dx_ps = nl.zeros((PMAX, H), dtype=nl.float32, buffer=nl.psum)
    for c in nl.affine_range(IK):
      dgT = nl.copy(nisa.nc_transpose(d_gate[i_p, c * PMAX + i_f]), dtype=dt)
      duT = nl.copy(nisa.nc_transpose(d_up[i_p, c * PMAX + i_f]), dtype=dt)
      dx_ps += nisa.nc_matmul(dgT, wgT[c])
      dx_ps += nisa.nc_matmul(duT, wuT[c])
    nl.store(dx[t * PMAX + i_p, i_h], value=nl.copy(dx_ps, dtype=dt))

    for k in nl.affine_range(HK):
      acc_g[k] += nisa.nc_matmul(x_t[i_p, k * PMAX + i_f], d_gate)
      acc_u[k] += nisa.nc_matmul(x_t[i_p, k * PMAX + i_f], d_up)
    for c in nl.affine_range(IK):
      acc_d[c] += nisa.nc_matmul(hmid[i_p, c * PMAX + i_f], dy_t)

  for k in nl.affine_range(HK):
    nl.store(dw_gate[k * PMAX + i_p, i_i], value=nl.copy(acc_g[k], dtype=nl.float32))
    nl.store(dw_up[k * PMAX + i_p, i_i], value=nl.copy(acc_u[k], dtype=nl.float32))
  for c in nl.affine_range(IK):
    nl.store(dw_down[c * PMAX + i_p, i_h], value=nl.copy(acc_d[c], dtype=nl.float32))
  return dx, dw_gate, dw_up, dw_down


@nki.jit
def gqa_proj_wgrad(x, dq, dk, dv, n_q, n_kv):
  T, H = x.shape
  _, QD = dq.shape
  assert T % PMAX == 0 and H % PMAX == 0 and QD <= FMAX and QD % n_q == 0 and n_q % n_kv == 0
  D = QD // n_q
  G = n_q // n_kv
  KD = n_kv * D

  dw_q = nl.ndarray((H, QD), dtype=nl.float32, buffer=nl.shared_hbm)
  dw_k = nl.ndarray((H, KD), dtype=nl.float32, buffer=nl.shared_hbm)
  dw_v = nl.ndarray((H, KD), dtype=nl.float32, buffer=nl.shared_hbm)

  i_p = nl.arange(PMAX)[:, None]
  i_f = nl.arange(PMAX)[None, :]
  i_q = nl.arange(QD)[None, :]
  i_kd = nl.arange(KD)[None, :]
  i_d = nl.arange(D)[None, :]

  for hk in nl.affine_range(H // PMAX):
    acc_q = nl.zeros((PMAX, QD), dtype=nl.float32, buffer=nl.psum)
    acc_k = nl.zeros((PMAX, KD), dtype=nl.float32, buffer=nl.psum)
    acc_v = nl.zeros((PMAX, KD), dtype=nl.float32, buffer=nl.psum)
    for t in nl.affine_range(T // PMAX):
      x_t = nl.load(x[t * PMAX + i_p, hk * PMAX + i_f])
      dq_t = nl.load(dq[t * PMAX + i_p, i_q])
      dk_t = nl.load(dk[t * PMAX + i_p, i_q])
      dv_t = nl.load(dv[t * PMAX + i_p, i_q])
      acc_q += nisa.nc_matmul(x_t, dq_t)
      for j in nl.static_range(n_kv):
        for g in nl.static_range(G):
          qh = j * G + g
          acc_k[i_p, j * D + i_d] += nisa.nc_matmul(x_t, dk_t[i_p, qh * D + i_d])
          acc_v[i_p, j * D + i_d] += nisa.nc_matmul(x_t, dv_t[i_p, qh * D + i_d])
    nl.store(dw_q[hk * PMAX + i_p, i_q], value=nl.copy(acc_q, dtype=nl.float32))
    nl.store(dw_k[hk * PMAX + i_p, i_kd], value=nl.copy(acc_k, dtype=nl.float32))
    nl.store(dw_v[hk * PMAX + i_p, i_kd], value=nl.copy(acc_v, dtype=nl.float32))
  return dw_q, dw_k, dw_v
