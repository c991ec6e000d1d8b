"""LAMB and Adafactor optimizer steps and dropout in the new NKI dialect (``import nki``, ISA calls writing ``dst=``), written the way public
NKI 0.3+ kernels are:

- ``lamb_step(w, g, m, v, lr, beta1, beta2, eps, weight_decay, step)``: one LAMB step on one parameter tensor
  [R, C] fp32 (rows over the 128 partitions, ragged last tile, columns in chunks of 2048). Pass 1 per tile:
  m' = b1 m + (1 - b1) g, v' = b2 v + (1 - b2) g^2 (the square scaled inside ScalarE's activation),
  u = (m' / bc1) / (sqrt(v' / bc2) + eps) + wd w, stored to an HBM scratch; per-partition sums of w^2 and u^2 by
  ``nisa.activation_reduce`` accumulated into a [128, 2] fp32 tile. Then a ones [128, 128] matmul into PSUM puts
  both totals on every partition, sqrt, trust = ||w|| / ||u|| (1 where either norm is 0). Pass 2:
  w' = w - lr * trust * u (``scalar_tensor_tensor`` with the (P, 1) factor). Returns (w', m', v', stats [1, 3] =
  ||w||, ||u||, trust).
- ``adafactor_step(w, g, r_state, c_state, lr, beta2, eps1, clip_threshold)``: factored second moment (row means
  per partition, column means by a ones-vector matmul), v = outer(r', c') / mean(r') by a K = 1 matmul of the
  ``nc_transpose``d r' with c', u = g / sqrt(v) clipped by its RMS, three passes (statistics, u, update).
- ``dropout_fwd(x, seed, p)`` / ``dropout_bwd(dy, seed, p)``: ``nisa.dropout`` seeded per row tile with seed + t
  (``nisa.tensor_scalar`` on the [1, 1] seed tile, ``nl.random_seed``), rescaled by 1 / (1 - p).

Written for nsim's tests in the style of public kernels; not copies of any file. No nsim imports.
"""
import math

import nki
import nki.isa as nisa
import nki.language as nl

P_MAX = 128
FT = 2048


@nki.jit
def lamb_step(w, g, m, v, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-6, weight_decay=0.01, step=1):
  R, C = w.shape
  bc1 = 1.0 - beta1 ** step
  bc2 = 1.0 - beta2 ** step
  w_out = nl.ndarray((R, C), dtype=w.dtype, buffer=nl.shared_hbm)
  m_out = nl.ndarray((R, C), dtype=m.dtype, buffer=nl.shared_hbm)
  v_out = nl.ndarray((R, C), dtype=v.dtype, buffer=nl.shared_hbm)
  stats = nl.ndarray((1, 3), dtype=nl.float32, buffer=nl.shared_hbm)
  u_hbm = nl.ndarray((R, C), dtype=nl.float32, buffer=nl.hbm)

  acc = nl.ndarray((P_MAX, 2), dtype=nl.float32, buffer=nl.sbuf)
  nisa.memset(dst=acc, value=0.0)

  # ---- pass 1: moments, update direction, per-partition sums of squares
  for r in nl.affine_range((R + P_MAX - 1) // P_MAX):
    r0 = r * P_MAX
    rows = min(P_MAX, R - r0)
    for c in nl.affine_range((C + FT - 1) // FT):
      c0 = c * FT
      cols = min(FT, C - c0)
      wt = nl.ndarray((P_MAX, FT), dtype=nl.float32, buffer=nl.sbuf)
      gt = nl.ndarray((P_MAX, FT), dtype=nl.float32, buffer=nl.sbuf)
      mt = nl.ndarray((P_MAX, FT), dtype=nl.float32, buffer=nl.sbuf)
      vt = nl.ndarray((P_MAX, FT), dtype=nl.float32, buffer=nl.sbuf)
      nisa.dma_copy(dst=wt[:rows, :cols], src=w[r0:r0 + rows, c0:c0 + cols])
      nisa.dma_copy(dst=gt[:rows, :cols], src=g[r0:r0 + rows, c0:c0 + cols])
      nisa.dma_copy(dst=mt[:rows, :cols], src=m[r0:r0 + rows, c0:c0 + cols])
      nisa.dma_copy(dst=vt[:rows, :cols], src=v[r0:r0 + rows, c0:c0 + cols])

      # m' = b1 m + (1 - b1) g
      tmp = nl.ndarray((P_MAX, FT), dtype=nl.float32, buffer=nl.sbuf)
      nisa.tensor_scalar(dst=tmp[:rows, :cols], data=gt[:rows, :cols], op0=nl.multiply, operand0=1.0 - beta1)
      nisa.scalar_tensor_tensor(dst=mt[:rows, :cols], data=mt[:rows, :cols], op0=nl.multiply, operand0=beta1,
                                op1=nl.add, operand1=tmp[:rows, :cols])
      # v' = b2 v + (sqrt(1 - b2) g)^2
      nisa.activation(dst=tmp[:rows, :cols], op=nl.square, data=gt[:rows, :cols], scale=math.sqrt(1.0 - beta2))
      nisa.scalar_tensor_tensor(dst=vt[:rows, :cols], data=vt[:rows, :cols], op0=nl.multiply, operand0=beta2,
                                op1=nl.add, operand1=tmp[:rows, :cols])
      nisa.dma_copy(dst=m_out[r0:r0 + rows, c0:c0 + cols], src=mt[:rows, :cols])
      nisa.dma_copy(dst=v_out[r0:r0 + rows, c0:c0 + cols], src=vt[:rows, :cols])

      # u = (m' / bc1) / (sqrt(v' / bc2) + eps) + wd * w
      den = nl.ndarray((P_MAX, FT), dtype=nl.float32, buffer=nl.sbuf)
      nisa.activation(dst=den[:rows, :cols], op=nl.sqrt, data=vt[:rows, :cols], scale=1.0 / bc2)
      nisa.tensor_scalar(dst=den[:rows, :cols], data=den[:rows, :cols], op0=nl.add, operand0=eps)
      nisa.reciprocal(dst=den[:rows, :cols], data=den[:rows, :cols])
      ut = nl.ndarray((P_MAX, FT), dtype=nl.float32, buffer=nl.sbuf)
      nisa.scalar_tensor_tensor(dst=ut[:rows, :cols], data=mt[:rows, :cols], op0=nl.multiply, operand0=1.0 / bc1,
                                op1=nl.multiply, operand1=den[:rows, :cols])
      nisa.scalar_tensor_tensor(dst=ut[:rows, :cols], data=wt[:rows, :cols], op0=nl.multiply,
                                operand0=weight_decay, op1=nl.add, operand1=ut[:rows, :cols])
      nisa.dma_copy(dst=u_hbm[r0:r0 + rows, c0:c0 + cols], src=ut[:rows, :cols])

      # per-partition sums of squares of w and u
      part = nl.ndarray((P_MAX, 2), dtype=nl.float32, buffer=nl.sbuf)
      junk = nl.ndarray((P_MAX, FT), dtype=nl.float32, buffer=nl.sbuf)
      nisa.activation_reduce(dst=junk[:rows, :cols], op=nl.square, data=wt[:rows, :cols], reduce_op=nl.add,
                             reduce_res=part[:rows, 0:1])
      nisa.activation_reduce(dst=junk[:rows, :cols], op=nl.square, data=ut[:rows, :cols], reduce_op=nl.add,
                             reduce_res=part[:rows, 1:2])
      nisa.tensor_tensor(dst=acc[:rows, :], data1=acc[:rows, :], data2=part[:rows, :], op=nl.add)

  # ---- the norms on every partition: ones^T @ acc
  ones = nl.ndarray((P_MAX, P_MAX), dtype=nl.float32, buffer=nl.sbuf)
  nisa.memset(dst=ones, value=1.0)
  tot = nl.ndarray((P_MAX, 2), dtype=nl.float32, buffer=nl.psum)
  nisa.nc_matmul(dst=tot, stationary=ones, moving=acc)
  st = nl.ndarray((P_MAX, 3), dtype=nl.float32, buffer=nl.sbuf)
  nisa.activation(dst=st[:, 0:2], op=nl.sqrt, data=tot)

  # trust = ||w|| / ||u||, 1 where either is 0
  ok = nl.ndarray((P_MAX, 2), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_scalar(dst=ok, data=st[:, 0:2], op0=nl.greater, operand0=0.0)
  both = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_tensor(dst=both, data1=ok[:, 0:1], data2=ok[:, 1:2], op=nl.multiply)
  rinv = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_scalar(dst=rinv, data=st[:, 1:2], op0=nl.maximum, operand0=1e-30)
  nisa.reciprocal(dst=rinv, data=rinv)
  ratio = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_tensor(dst=ratio, data1=st[:, 0:1], data2=rinv, op=nl.multiply)
  # trust = both * (ratio - 1) + 1
  nisa.scalar_tensor_tensor(dst=ratio, data=ratio, op0=nl.subtract, operand0=1.0, op1=nl.multiply, operand1=both)
  nisa.tensor_scalar(dst=st[:, 2:3], data=ratio, op0=nl.add, operand0=1.0)
  nisa.dma_copy(dst=stats, src=st[0:1, :])
  neg = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_scalar(dst=neg, data=st[:, 2:3], op0=nl.multiply, operand0=-lr)

  # ---- pass 2: w' = w - lr * trust * u
  for r in nl.affine_range((R + P_MAX - 1) // P_MAX):
    r0 = r * P_MAX
    rows = min(P_MAX, R - r0)
    for c in nl.affine_range((C + FT - 1) // FT):
      c0 = c * FT
      cols = min(FT, C - c0)
      wt = nl.ndarray((P_MAX, FT), dtype=nl.float32, buffer=nl.sbuf)
      ut = nl.ndarray((P_MAX, FT), dtype=nl.float32, buffer=nl.sbuf)
      nisa.dma_copy(dst=wt[:rows, :cols], src=w[r0:r0 + rows, c0:c0 + cols])
      nisa.dma_copy(dst=ut[:rows, :cols], src=u_hbm[r0:r0 + rows, c0:c0 + cols])
      nisa.scalar_tensor_tensor(dst=wt[:rows, :cols], data=ut[:rows, :cols], op0=nl.multiply,
                                operand0=neg[:rows, :], op1=nl.add, operand1=wt[:rows, :cols])
      nisa.dma_copy(dst=w_out[r0:r0 + rows, c0:c0 + cols], src=wt[:rows, :cols])
  return w_out, m_out, v_out, stats


@nki.jit
def adafactor_step(w, g, r_state, c_state, lr=1e-2, beta2=0.999, eps1=1e-30, clip_threshold=1.0):
  """One Adafactor step (factored second moment, no momentum, fixed lr) on w [R, C] fp32 with row state r [R] and
  column state c [C]:
    g2 = g^2 + eps1;  r' = b2 r + (1 - b2) mean_cols(g2);  c' = b2 c + (1 - b2) mean_rows(g2)
    v = outer(r', c') / mean(r');  u = g / sqrt(v);  u /= max(1, rms(u) / clip_threshold);  w' = w - lr u
  Column sums of g2 by a ones-vector matmul (K = rows, M = 1) per 512 columns added into an SBUF row; v per tile by
  a K = 1 matmul of r'^T (``nc_transpose``d onto one partition) with c'; u to an HBM scratch; rms(u) by a ones
  matmul over the partitions. Returns (w', r', c', rms [1, 1])."""
  R, C = w.shape
  NT = (R + P_MAX - 1) // P_MAX
  CB = 512
  NC = (C + CB - 1) // CB
  w_out = nl.ndarray((R, C), dtype=w.dtype, buffer=nl.shared_hbm)
  r_out = nl.ndarray((R,), dtype=nl.float32, buffer=nl.shared_hbm)
  c_out = nl.ndarray((C,), dtype=nl.float32, buffer=nl.shared_hbm)
  rms_out = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.shared_hbm)
  u_hbm = nl.ndarray((R, C), dtype=nl.float32, buffer=nl.hbm)
  r_new = nl.ndarray((P_MAX, NT), dtype=nl.float32, buffer=nl.sbuf)   # r' of tile t in column t
  nisa.memset(dst=r_new, value=0.0)
  colsum = nl.ndarray((1, C), dtype=nl.float32, buffer=nl.sbuf)
  nisa.memset(dst=colsum, value=0.0)
  ones = nl.ndarray((P_MAX, P_MAX), dtype=nl.float32, buffer=nl.sbuf)
  nisa.memset(dst=ones, value=1.0)

  # ---- pass 1: row and column means of g^2
  for t in nl.sequential_range(NT):
    r0 = t * P_MAX
    rows = min(P_MAX, R - r0)
    gt = nl.ndarray((P_MAX, C), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=gt[:rows, :], src=g[r0:r0 + rows, :])
    g2 = nl.ndarray((P_MAX, C), dtype=nl.float32, buffer=nl.sbuf)
    rs = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation_reduce(dst=g2[:rows, :], op=nl.square, data=gt[:rows, :], reduce_op=nl.add,
                           reduce_res=rs[:rows, :])
    nisa.tensor_scalar(dst=g2[:rows, :], data=g2[:rows, :], op0=nl.add, operand0=eps1)
    # r' = b2 r + (1 - b2) (rowsum / C + eps1)
    rt = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=rt[:rows, :], src=r_state[r0:r0 + rows].reshape((rows, 1)))
    nisa.tensor_scalar(dst=rs[:rows, :], data=rs[:rows, :], op0=nl.multiply, operand0=(1.0 - beta2) / C,
                       op1=nl.add, operand1=(1.0 - beta2) * eps1)
    nisa.scalar_tensor_tensor(dst=r_new[:rows, t:t + 1], data=rt[:rows, :], op0=nl.multiply, operand0=beta2,
                              op1=nl.add, operand1=rs[:rows, :])
    nisa.dma_copy(dst=r_out[r0:r0 + rows].reshape((rows, 1)), src=r_new[:rows, t:t + 1])
    for cb in nl.affine_range(NC):
      c0 = cb * CB
      cols = min(CB, C - c0)
      cs = nl.ndarray((1, CB), dtype=nl.float32, buffer=nl.psum)
      nisa.nc_matmul(dst=cs[:, :cols], stationary=ones[:rows, 0:1], moving=g2[:rows, c0:c0 + cols])
      nisa.tensor_tensor(dst=colsum[:, c0:c0 + cols], data1=colsum[:, c0:c0 + cols], data2=cs[:, :cols], op=nl.add)

  # c' = b2 c + (1 - b2) colsum / R
  c_new = nl.ndarray((1, C), dtype=nl.float32, buffer=nl.sbuf)
  nisa.dma_copy(dst=c_new, src=c_state.reshape((1, C)))
  nisa.tensor_scalar(dst=colsum, data=colsum, op0=nl.multiply, operand0=(1.0 - beta2) / R)
  nisa.scalar_tensor_tensor(dst=c_new, data=c_new, op0=nl.multiply, operand0=beta2, op1=nl.add, operand1=colsum)
  nisa.dma_copy(dst=c_out.reshape((1, C)), src=c_new)

  # 1 / mean(r') on every partition
  rsum = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_reduce(dst=rsum, op=nl.add, data=r_new, axis=1)
  rtot = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.psum)
  nisa.nc_matmul(dst=rtot, stationary=ones, moving=rsum)
  inv_mean = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_scalar(dst=inv_mean, data=rtot, op0=nl.multiply, operand0=1.0 / R)
  nisa.reciprocal(dst=inv_mean, data=inv_mean)

  # ---- pass 2: u = g * rsqrt(outer(r', c') / mean(r')), sum of u^2 per partition
  usq = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.memset(dst=usq, value=0.0)
  for t in nl.sequential_range(NT):
    r0 = t * P_MAX
    rows = min(P_MAX, R - r0)
    gt = nl.ndarray((P_MAX, C), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=gt[:rows, :], src=g[r0:r0 + rows, :])
    rT_psum = nl.ndarray((1, P_MAX), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_transpose(dst=rT_psum[:, :rows], data=r_new[:rows, t:t + 1])
    rT = nl.ndarray((1, P_MAX), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=rT[:, :rows], src=rT_psum[:, :rows])
    ut = nl.ndarray((P_MAX, C), dtype=nl.float32, buffer=nl.sbuf)
    for cb in nl.affine_range(NC):
      c0 = cb * CB
      cols = min(CB, C - c0)
      v_psum = nl.ndarray((P_MAX, CB), dtype=nl.float32, buffer=nl.psum)
      nisa.nc_matmul(dst=v_psum[:rows, :cols], stationary=rT[:, :rows], moving=c_new[:, c0:c0 + cols])
      nisa.activation(dst=ut[:rows, c0:c0 + cols], op=nl.rsqrt, data=v_psum[:rows, :cols],
                      scale=inv_mean[:rows, :])
    nisa.tensor_tensor(dst=ut[:rows, :], data1=ut[:rows, :], data2=gt[:rows, :], op=nl.multiply)
    part = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    junk = nl.ndarray((P_MAX, C), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation_reduce(dst=junk[:rows, :], op=nl.square, data=ut[:rows, :], reduce_op=nl.add,
                           reduce_res=part[:rows, :])
    nisa.tensor_tensor(dst=usq[:rows, :], data1=usq[:rows, :], data2=part[:rows, :], op=nl.add)
    nisa.dma_copy(dst=u_hbm[r0:r0 + rows, :], src=ut[:rows, :])

  # rms(u) and -lr / max(1, rms / d) on every partition
  utot = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.psum)
  nisa.nc_matmul(dst=utot, stationary=ones, moving=usq)
  rms = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.activation(dst=rms, op=nl.sqrt, data=utot, scale=1.0 / (R * C))
  nisa.dma_copy(dst=rms_out, src=rms[0:1, :])
  fac = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_scalar(dst=fac, data=rms, op0=nl.multiply, operand0=1.0 / clip_threshold, op1=nl.maximum,
                     operand1=1.0)
  nisa.reciprocal(dst=fac, data=fac)
  nisa.tensor_scalar(dst=fac, data=fac, op0=nl.multiply, operand0=-lr)

  # ---- pass 3: w' = w + fac * u
  for t in nl.affine_range(NT):
    r0 = t * P_MAX
    rows = min(P_MAX, R - r0)
    wt = nl.ndarray((P_MAX, C), dtype=nl.float32, buffer=nl.sbuf)
    ut = nl.ndarray((P_MAX, C), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=wt[:rows, :], src=w[r0:r0 + rows, :])
    nisa.dma_copy(dst=ut[:rows, :], src=u_hbm[r0:r0 + rows, :])
    nisa.scalar_tensor_tensor(dst=wt[:rows, :], data=ut[:rows, :], op0=nl.multiply, operand0=fac[:rows, :],
                              op1=nl.add, operand1=wt[:rows, :])
    nisa.dma_copy(dst=w_out[r0:r0 + rows, :], src=wt[:rows, :])
  return w_out, r_out, c_out, rms_out


def _dropout_rows(src, out, seed, p):
  """out = dropout(src) / (1 - p) over rows of 128, the generator seeded with seed + tile per row tile."""
  N, D = src.shape
  seed_sb = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
  nisa.dma_copy(dst=seed_sb, src=seed.reshape((1, 1)))
  for t in nl.sequential_range((N + P_MAX - 1) // P_MAX):
    r0 = t * P_MAX
    rows = min(P_MAX, N - r0)
    st = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=st, data=seed_sb, op0=nl.add, operand0=t)
    nl.random_seed(seed=st)
    xt = nl.ndarray((P_MAX, D), dtype=src.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=xt[:rows, :], src=src[r0:r0 + rows, :])
    dt = nl.ndarray((P_MAX, D), dtype=src.dtype, buffer=nl.sbuf)
    nisa.dropout(dst=dt[:rows, :], data=xt[:rows, :], prob=p)
    nisa.tensor_scalar(dst=dt[:rows, :], data=dt[:rows, :], op0=nl.multiply, operand0=1.0 / (1.0 - p))
    nisa.dma_copy(dst=out[r0:r0 + rows, :], src=dt[:rows, :])


@nki.jit
def dropout_fwd(x, seed, p=0.1):
  """Inverted dropout with ``nisa.dropout``; seed: int32 [1]."""
  out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
  _dropout_rows(x, out, seed, p)
  return out


@nki.jit
def dropout_bwd(dy, seed, p=0.1):
  """The forward's mask regenerated from the same seeds."""
  dx = nl.ndarray(dy.shape, dtype=dy.dtype, buffer=nl.shared_hbm)
  _dropout_rows(dy, dx, seed, p)
  return dx
