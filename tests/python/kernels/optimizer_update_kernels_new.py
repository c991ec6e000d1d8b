"""Optimizer-step kernels in the new NKI dialect (``import nki``, ISA calls writing ``dst=``, ``nl.ndarray`` buffers,
``nisa.dma_copy``), written the way public NKI 0.3+ kernels are:

- ``lion_step(param, grad, exp_avg, lr, beta1, beta2, weight_decay)``: Lion on a 2-D fp32 weight [R, C] (row tiles
  of 128, a ragged last tile by ``min``-clamped slices; bf16 or fp32 gradients cast by the load DMA):
  c = beta1 m + (1 - beta1) g, w' = w (1 - lr wd) - lr sign(c) (``nisa.activation(op=nl.sign)``),
  m' = beta2 m + (1 - beta2) g. Returns (w', m').
- ``sgd_nesterov(param, grad, momentum_buf, lr, momentum, weight_decay)``: torch.optim.SGD with Nesterov momentum
  and L2 weight decay (dampening 0): g += wd w; b' = mu b + g; w' = w - lr (g + mu b'). Returns (w', b').
- ``adafactor_step(param, grad, exp_avg_sq_row, exp_avg_sq_col, lr, beta2t, eps1, clip_threshold,
  weight_decay)``: Adafactor with factored second moments for a 2-D weight [R, C] (R a multiple of 128,
  C <= 512). Pass 1 (gradient tiles kept resident in SBUF): g^2 by ``nisa.activation(op=nl.square)`` whose
  accumulate gives the row sums; the column sums accumulate over the row tiles in one PSUM bank by a matmul with
  a ones column; r' = beta2t r + (1 - beta2t) (mean_c(g^2) + eps1), c' likewise with the row mean. mean(r') over
  all R rows = a free-axis reduce and a ones matmul over the partitions. The update
  u = g rsqrt(r' / mean(r')) rsqrt(c') (the rsqrt(c') row broadcast to the partitions by a K = 1 matmul), its RMS
  from a second square-and-accumulate and a ones matmul, clipped by max(1, RMS(u) / clip_threshold), and
  w' = w (1 - lr wd) - lr u. Returns (w', r', c'); the gradient and the weight are each read once.

Written for nsim's tests in the style of those kernels; not copies of any file. No nsim imports.
"""
import nki
import nki.isa as nisa
import nki.language as nl

P_MAX = 128


@nki.jit
def lion_step(param, grad, exp_avg, lr=1e-4, beta1=0.9, beta2=0.99, weight_decay=0.0):
  R, C = param.shape
  param_out = nl.ndarray((R, C), dtype=param.dtype, buffer=nl.shared_hbm)
  m_out = nl.ndarray((R, C), dtype=exp_avg.dtype, buffer=nl.shared_hbm)
  for t in nl.affine_range((R + P_MAX - 1) // P_MAX):
    r0 = t * P_MAX
    rows = min(P_MAX, R - r0)
    w = nl.ndarray((P_MAX, C), dtype=nl.float32, buffer=nl.sbuf)
    g = nl.ndarray((P_MAX, C), dtype=nl.float32, buffer=nl.sbuf)
    m = nl.ndarray((P_MAX, C), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=w[:rows, :], src=param[r0:r0 + rows, :])
    nisa.dma_copy(dst=g[:rows, :], src=grad[r0:r0 + rows, :])
    nisa.dma_copy(dst=m[:rows, :], src=exp_avg[r0:r0 + rows, :])

    # c = beta1 * m + (1 - beta1) * g; its sign is the update
    c = nl.ndarray((P_MAX, C), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=c[:rows, :], data=m[:rows, :], op0=nl.multiply, operand0=beta1)
    nisa.scalar_tensor_tensor(dst=c[:rows, :], data=g[:rows, :], op0=nl.multiply, operand0=1.0 - beta1,
                              op1=nl.add, operand1=c[:rows, :])
    s = nl.ndarray((P_MAX, C), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=s[:rows, :], op=nl.sign, data=c[:rows, :])

    # w = w * (1 - lr * wd) - lr * sign(c)
    if weight_decay != 0.0:
      nisa.tensor_scalar(dst=w[:rows, :], data=w[:rows, :], op0=nl.multiply, operand0=1.0 - lr * weight_decay)
    nisa.scalar_tensor_tensor(dst=w[:rows, :], data=s[:rows, :], op0=nl.multiply, operand0=-lr, op1=nl.add,
                              operand1=w[:rows, :])
    # m = beta2 * m + (1 - beta2) * g
    nisa.tensor_scalar(dst=m[:rows, :], data=m[:rows, :], op0=nl.multiply, operand0=beta2)
    nisa.scalar_tensor_tensor(dst=m[:rows, :], data=g[:rows, :], op0=nl.multiply, operand0=1.0 - beta2,
                              op1=nl.add, operand1=m[:rows, :])

    nisa.dma_copy(dst=param_out[r0:r0 + rows, :], src=w[:rows, :])
    nisa.dma_copy(dst=m_out[r0:r0 + rows, :], src=m[:rows, :])
  return param_out, m_out


@nki.jit
def sgd_nesterov(param, grad, momentum_buf, lr=0.01, momentum=0.9, weight_decay=1e-4):
  R, C = param.shape
  param_out = nl.ndarray((R, C), dtype=param.dtype, buffer=nl.shared_hbm)
  buf_out = nl.ndarray((R, C), dtype=momentum_buf.dtype, buffer=nl.shared_hbm)
  for t in nl.affine_range((R + P_MAX - 1) // P_MAX):
    r0 = t * P_MAX
    rows = min(P_MAX, R - r0)
    w = nl.ndarray((P_MAX, C), dtype=nl.float32, buffer=nl.sbuf)
    g = nl.ndarray((P_MAX, C), dtype=nl.float32, buffer=nl.sbuf)
    b = nl.ndarray((P_MAX, C), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=w[:rows, :], src=param[r0:r0 + rows, :])
    nisa.dma_copy(dst=g[:rows, :], src=grad[r0:r0 + rows, :])
    nisa.dma_copy(dst=b[:rows, :], src=momentum_buf[r0:r0 + rows, :])
    # g = g + wd * w
    nisa.scalar_tensor_tensor(dst=g[:rows, :], data=w[:rows, :], op0=nl.multiply, operand0=weight_decay,
                              op1=nl.add, operand1=g[:rows, :])
    # b = mu * b + g
    nisa.scalar_tensor_tensor(dst=b[:rows, :], data=b[:rows, :], op0=nl.multiply, operand0=momentum,
                              op1=nl.add, operand1=g[:rows, :])
    # d = g + mu * b ; w = w - lr * d
    d = nl.ndarray((P_MAX, C), dtype=nl.float32, buffer=nl.sbuf)
    nisa.scalar_tensor_tensor(dst=d[:rows, :], data=b[:rows, :], op0=nl.multiply, operand0=momentum,
                              op1=nl.add, operand1=g[:rows, :])
    nisa.scalar_tensor_tensor(dst=w[:rows, :], data=d[:rows, :], op0=nl.multiply, operand0=-lr, op1=nl.add,
                              operand1=w[:rows, :])
    nisa.dma_copy(dst=param_out[r0:r0 + rows, :], src=w[:rows, :])
    nisa.dma_copy(dst=buf_out[r0:r0 + rows, :], src=b[:rows, :])
  return param_out, buf_out


@nki.jit
def adafactor_step(param, grad, exp_avg_sq_row, exp_avg_sq_col, lr=1e-2, beta2t=0.8, eps1=1e-30,
                   clip_threshold=1.0, weight_decay=0.0):
  R, C = param.shape
  assert R % P_MAX == 0 and C <= 512
  NT = R // P_MAX
  param_out = nl.ndarray((R, C), dtype=param.dtype, buffer=nl.shared_hbm)
  row_out = nl.ndarray((R,), dtype=nl.float32, buffer=nl.shared_hbm)
  col_out = nl.ndarray((C,), dtype=nl.float32, buffer=nl.shared_hbm)

  ones = nl.ndarray((P_MAX, P_MAX), dtype=nl.float32, buffer=nl.sbuf)
  nisa.memset(dst=ones, value=1.0)

  # pass 1: g^2 row sums (ScalarE accumulate) and column sums (ones-column matmul, accumulated in PSUM)
  g_all = nl.ndarray((P_MAX, NT, C), dtype=nl.float32, buffer=nl.sbuf)
  rsum = nl.ndarray((P_MAX, NT), dtype=nl.float32, buffer=nl.sbuf)
  csum_ps = nl.ndarray((1, C), dtype=nl.float32, buffer=nl.psum)
  for t in nl.affine_range(NT):
    nisa.dma_copy(dst=g_all[:, t, :], src=grad[t * P_MAX:(t + 1) * P_MAX, :])
    sq = nl.ndarray((P_MAX, C), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=sq, op=nl.square, data=g_all[:, t, :], reduce_op=nl.add, reduce_res=rsum[:, t:t + 1],
                    reduce_cmd=nisa.reduce_cmd.reset_reduce)
    nisa.nc_matmul(dst=csum_ps, stationary=ones[:, 0:1], moving=sq)

  # r' = beta2t r + (1 - beta2t) (rsum / C + eps1), row t * 128 + p in column t
  r_old = nl.ndarray((P_MAX, NT), dtype=nl.float32, buffer=nl.sbuf)
  nisa.dma_copy(dst=r_old, src=exp_avg_sq_row.reshape((NT, P_MAX)).T)
  r_new = nl.ndarray((P_MAX, NT), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_scalar(dst=r_new, data=rsum, op0=nl.multiply, operand0=(1.0 - beta2t) / C, op1=nl.add,
                     operand1=(1.0 - beta2t) * eps1)
  nisa.scalar_tensor_tensor(dst=r_new, data=r_old, op0=nl.multiply, operand0=beta2t, op1=nl.add, operand1=r_new)
  nisa.dma_copy(dst=row_out.reshape((NT, P_MAX)).T, src=r_new)

  # c' likewise, on partition 0
  c_old = nl.ndarray((1, C), dtype=nl.float32, buffer=nl.sbuf)
  nisa.dma_copy(dst=c_old, src=exp_avg_sq_col.reshape((1, C)))
  c_new = nl.ndarray((1, C), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_scalar(dst=c_new, data=csum_ps, op0=nl.multiply, operand0=(1.0 - beta2t) / R, op1=nl.add,
                     operand1=(1.0 - beta2t) * eps1)
  nisa.scalar_tensor_tensor(dst=c_new, data=c_old, op0=nl.multiply, operand0=beta2t, op1=nl.add, operand1=c_new)
  nisa.dma_copy(dst=col_out.reshape((1, C)), src=c_new)

  # mean(r') over all rows, on every partition
  rpart = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_reduce(dst=rpart, op=nl.add, data=r_new, axis=1)
  rtot_ps = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.psum)
  nisa.nc_matmul(dst=rtot_ps, stationary=ones, moving=rpart)
  inv_mean = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_scalar(dst=inv_mean, data=rtot_ps, op0=nl.multiply, operand0=1.0 / R)
  nisa.reciprocal(dst=inv_mean, data=inv_mean)

  # row factors rsqrt(r' / mean(r')), column factors rsqrt(c') broadcast to the partitions (K = 1 matmul)
  r_fac = nl.ndarray((P_MAX, NT), dtype=nl.float32, buffer=nl.sbuf)
  nisa.activation(dst=r_fac, op=nl.rsqrt, data=r_new, scale=inv_mean)
  c_fac = nl.ndarray((1, C), dtype=nl.float32, buffer=nl.sbuf)
  nisa.activation(dst=c_fac, op=nl.rsqrt, data=c_new)
  c_fac_ps = nl.ndarray((P_MAX, C), dtype=nl.float32, buffer=nl.psum)
  nisa.nc_matmul(dst=c_fac_ps, stationary=ones[0:1, :], moving=c_fac)

  # pass 2: u = g * r_fac * c_fac (in place of g), sum of u^2 per partition
  usum = nl.ndarray((P_MAX, NT), dtype=nl.float32, buffer=nl.sbuf)
  for t in nl.affine_range(NT):
    nisa.scalar_tensor_tensor(dst=g_all[:, t, :], data=g_all[:, t, :], op0=nl.multiply,
                              operand0=r_fac[:, t:t + 1], op1=nl.multiply, operand1=c_fac_ps)
    sq = nl.ndarray((P_MAX, C), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=sq, op=nl.square, data=g_all[:, t, :], reduce_op=nl.add, reduce_res=usum[:, t:t + 1],
                    reduce_cmd=nisa.reduce_cmd.reset_reduce)

  # RMS(u) over the whole tensor; scale = -lr / max(1, RMS / clip_threshold)
  upart = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_reduce(dst=upart, op=nl.add, data=usum, axis=1)
  utot_ps = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.psum)
  nisa.nc_matmul(dst=utot_ps, stationary=ones, moving=upart)
  rms = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.activation(dst=rms, op=nl.sqrt, data=utot_ps, scale=1.0 / (R * C))
  denom = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_scalar(dst=denom, data=rms, op0=nl.multiply, operand0=1.0 / clip_threshold, op1=nl.maximum,
                     operand1=1.0)
  scale = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.reciprocal(dst=scale, data=denom)
  nisa.tensor_scalar(dst=scale, data=scale, op0=nl.multiply, operand0=-lr)

  # pass 3: w' = w (1 - lr wd) + scale * u
  for t in nl.affine_range(NT):
    w = nl.ndarray((P_MAX, C), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=w, src=param[t * P_MAX:(t + 1) * P_MAX, :])
    if weight_decay != 0.0:
      nisa.tensor_scalar(dst=w, data=w, op0=nl.multiply, operand0=1.0 - lr * weight_decay)
    nisa.scalar_tensor_tensor(dst=w, data=g_all[:, t, :], op0=nl.multiply, operand0=scale, op1=nl.add,
                              operand1=w)
    nisa.dma_copy(dst=param_out[t * P_MAX:(t + 1) * P_MAX, :], src=w)
  return param_out, row_out, col_out
