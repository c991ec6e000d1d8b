"""Fused optimizer-step kernels in the Beta-1 dialect (``neuronxcc.nki``), written the way public NKI training
kernels write them (a flat parameter buffer viewed as [128, N], arange index expressions, value-returning
``nl``/``nisa`` calls, ``nl.load``/``nl.store``, masks for the ragged last tile):

- ``adamw_fused(param, master, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps, weight_decay)``: one AdamW
  step (decoupled weight decay) of the mixed-precision pattern: fp32 master weights and moments, bf16 gradients,
  the bf16 parameter copy written from the new master. All buffers are flat [n] (n a multiple of 128) viewed as
  [128, n / 128] and walked in free-axis chunks of 512 (the last chunk masked). The step count is a [1, 1] int32
  HBM tensor (the optimizer's device-side state): the bias corrections 1 - beta^t come from it on chip
  (``exp(t ln beta)``, broadcast to the partitions). master, exp_avg, exp_avg_sq are updated in place and param is
  overwritten; every state is read once and written once.
- ``adamw_two_pass``: the same math as two separate passes (the foreach-style split: moments first, written back
  to HBM; then the parameter update reading them again), the baseline the fused kernel is measured against.
- ``lamb_step(param, grad, exp_avg, exp_avg_sq, step, ...)``: LAMB on a 2-D fp32 weight [R, C] (row tiles of 128,
  the last one masked), step count a Python int. Pass 1 updates the moments, forms the Adam direction
  u = m_hat / (sqrt(v_hat) + eps) + wd w into an HBM scratch and accumulates per-partition sums of w^2 and u^2
  (free-axis ``nl.sum``); the global norms are a cross-partition sum by a matmul with a ones matrix; the trust
  ratio ||w|| / ||u|| (1 when either norm is 0) scales the update of pass 2.
- ``clip_grad_norm(g0, g1, g2, max_norm)``: global gradient-norm clipping over three gradient tensors of any row
  count (masked last tiles) plus the AMP inf / NaN check: the total sum of squares (free-axis reduce, then a ones
  matmul over the partitions), found_inf = (s - s != 0) as an int32 [1, 1] output, the clip coefficient
  min(1, max_norm / (norm + 1e-6)) applied in place, or 1 (the gradients left as they are) when found_inf is set
  and the optimizer step is to be skipped. Returns (total_norm [1, 1] fp32, found_inf [1, 1] int32).

Written for nsim's tests in the style of those kernels; not copies of any file. No nsim imports.
"""
import math

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl

PMAX = 128
FTILE = 512


def _bias_corrections(step, beta1, beta2):
  """(1 - beta1^t, 1 - beta2^t) as [128, 1] fp32 tiles from the [1, 1] int32 step count in HBM."""
  t = nl.load(step, dtype=nl.float32)
  t_b = t.broadcast_to((PMAX, 1))
  bc1 = 1.0 - nl.exp(nl.multiply(t_b, math.log(beta1)))
  bc2 = 1.0 - nl.exp(nl.multiply(t_b, math.log(beta2)))
  return bc1, bc2


@nki.jit
def adamw_fused(param, master, grad, exp_avg, exp_avg_sq, step, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8,
                weight_decay=0.01):
  n = master.shape[0]
  assert n % PMAX == 0
  F = n // PMAX
  p_v = param.reshape((PMAX, F))
  w_v = master.reshape((PMAX, F))
  g_v = grad.reshape((PMAX, F))
  m_v = exp_avg.reshape((PMAX, F))
  v_v = exp_avg_sq.reshape((PMAX, F))

  bc1, bc2 = _bias_corrections(step, beta1, beta2)
  # step_size = lr / bc1; denominator sqrt(v) / sqrt(bc2) + eps
  step_size = nl.multiply(nl.reciprocal(bc1), -lr)
  inv_sqrt_bc2 = nl.rsqrt(bc2)

  i_p = nl.arange(PMAX)[:, None]
  i_f = nl.arange(FTILE)[None, :]
  for c in nl.affine_range((F + FTILE - 1) // FTILE):
    msk = (c * FTILE + i_f < F)
    w = nl.load(w_v[i_p, c * FTILE + i_f], mask=msk)
    g = nl.load(g_v[i_p, c * FTILE + i_f], dtype=nl.float32, mask=msk)
    m = nl.load(m_v[i_p, c * FTILE + i_f], mask=msk)
    v = nl.load(v_v[i_p, c * FTILE + i_f], mask=msk)

    m_new = nl.add(nl.multiply(m, beta1, mask=msk), nl.multiply(g, 1.0 - beta1, mask=msk), mask=msk)
    g2 = nl.multiply(nl.square(g, mask=msk), 1.0 - beta2, mask=msk)
    v_new = nl.add(nl.multiply(v, beta2, mask=msk), g2, mask=msk)
    denom = nl.add(nl.multiply(nl.sqrt(v_new, mask=msk), inv_sqrt_bc2, mask=msk), eps, mask=msk)
    upd = nl.divide(m_new, denom, mask=msk)
    # decoupled weight decay, then the Adam step
    w_new = nl.add(nl.multiply(w, 1.0 - lr * weight_decay, mask=msk), nl.multiply(upd, step_size, mask=msk),
                   mask=msk)

    nl.store(m_v[i_p, c * FTILE + i_f], value=m_new, mask=msk)
    nl.store(v_v[i_p, c * FTILE + i_f], value=v_new, mask=msk)
    nl.store(w_v[i_p, c * FTILE + i_f], value=w_new, mask=msk)
    nl.store(p_v[i_p, c * FTILE + i_f], value=nl.copy(w_new, dtype=param.dtype, mask=msk), mask=msk)


@nki.jit
def adamw_two_pass(param, master, grad, exp_avg, exp_avg_sq, step, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8,
                   weight_decay=0.01):
  n = master.shape[0]
  assert n % PMAX == 0
  F = n // PMAX
  p_v = param.reshape((PMAX, F))
  w_v = master.reshape((PMAX, F))
  g_v = grad.reshape((PMAX, F))
  m_v = exp_avg.reshape((PMAX, F))
  v_v = exp_avg_sq.reshape((PMAX, F))
  i_p = nl.arange(PMAX)[:, None]
  i_f = nl.arange(FTILE)[None, :]
  NC = (F + FTILE - 1) // FTILE

  # pass 1: the moments
  for c in nl.affine_range(NC):
    msk = (c * FTILE + i_f < F)
    g = nl.load(g_v[i_p, c * FTILE + i_f], dtype=nl.float32, mask=msk)
    m = nl.load(m_v[i_p, c * FTILE + i_f], mask=msk)
    v = nl.load(v_v[i_p, c * FTILE + i_f], mask=msk)
    m_new = nl.add(nl.multiply(m, beta1, mask=msk), nl.multiply(g, 1.0 - beta1, mask=msk), mask=msk)
    v_new = nl.add(nl.multiply(v, beta2, mask=msk), nl.multiply(nl.square(g, mask=msk), 1.0 - beta2, mask=msk),
                   mask=msk)
    nl.store(m_v[i_p, c * FTILE + i_f], value=m_new, mask=msk)
    nl.store(v_v[i_p, c * FTILE + i_f], value=v_new, mask=msk)

  # pass 2: the parameters
  bc1, bc2 = _bias_corrections(step, beta1, beta2)
  step_size = nl.multiply(nl.reciprocal(bc1), -lr)
  inv_sqrt_bc2 = nl.rsqrt(bc2)
  for c in nl.affine_range(NC):
    msk = (c * FTILE + i_f < F)
    w = nl.load(w_v[i_p, c * FTILE + i_f], mask=msk)
    m = nl.load(m_v[i_p, c * FTILE + i_f], mask=msk)
    v = nl.load(v_v[i_p, c * FTILE + i_f], mask=msk)
    denom = nl.add(nl.multiply(nl.sqrt(v, mask=msk), inv_sqrt_bc2, mask=msk), eps, mask=msk)
    upd = nl.divide(m, denom, mask=msk)
    w_new = nl.add(nl.multiply(w, 1.0 - lr * weight_decay, mask=msk), nl.multiply(upd, step_size, mask=msk),
                   mask=msk)
    nl.store(w_v[i_p, c * FTILE + i_f], value=w_new, mask=msk)
    nl.store(p_v[i_p, c * FTILE + i_f], value=nl.copy(w_new, dtype=param.dtype, mask=msk), mask=msk)


@nki.jit
def lamb_step(param, grad, exp_avg, exp_avg_sq, step, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-6,
              weight_decay=0.01):
  R, C = param.shape
  NT = (R + PMAX - 1) // PMAX
  bc1 = 1.0 - beta1 ** step
  bc2 = 1.0 - beta2 ** step

  param_out = nl.ndarray((R, C), dtype=param.dtype, buffer=nl.shared_hbm)
  m_out = nl.ndarray((R, C), dtype=nl.float32, buffer=nl.shared_hbm)
  v_out = nl.ndarray((R, C), dtype=nl.float32, buffer=nl.shared_hbm)
  upd_hbm = nl.ndarray((R, C), dtype=nl.float32, buffer=nl.hbm)

  i_p = nl.arange(PMAX)[:, None]
  i_f = nl.arange(C)[None, :]

  # per-partition partial sums of w^2 (column 0) and u^2 (column 1)
  sums = nl.zeros((PMAX, 2), dtype=nl.float32)
  for t in nl.affine_range(NT):
    msk = (t * PMAX + i_p < R)
    w = nl.load(param[t * PMAX + i_p, i_f], dtype=nl.float32, mask=msk)
    g = nl.load(grad[t * PMAX + i_p, i_f], dtype=nl.float32, mask=msk)
    m = nl.load(exp_avg[t * PMAX + i_p, i_f], mask=msk)
    v = nl.load(exp_avg_sq[t * PMAX + i_p, i_f], mask=msk)
    m_new = nl.add(nl.multiply(m, beta1, mask=msk), nl.multiply(g, 1.0 - beta1, mask=msk), mask=msk)
    v_new = nl.add(nl.multiply(v, beta2, mask=msk), nl.multiply(nl.square(g, mask=msk), 1.0 - beta2, mask=msk),
                   mask=msk)
    denom = nl.add(nl.sqrt(nl.multiply(v_new, 1.0 / bc2, mask=msk), mask=msk), eps, mask=msk)
    u = nl.divide(nl.multiply(m_new, 1.0 / bc1, mask=msk), denom, mask=msk)
    u = nl.add(u, nl.multiply(w, weight_decay, mask=msk), mask=msk)
    nl.store(m_out[t * PMAX + i_p, i_f], value=m_new, mask=msk)
    nl.store(v_out[t * PMAX + i_p, i_f], value=v_new, mask=msk)
    nl.store(upd_hbm[t * PMAX + i_p, i_f], value=u, mask=msk)
    sums[i_p, 0] = nl.add(sums[i_p, 0], nl.sum(nl.square(w, mask=msk), axis=[1], keepdims=True, mask=msk),
                          mask=msk)
    sums[i_p, 1] = nl.add(sums[i_p, 1], nl.sum(nl.square(u, mask=msk), axis=[1], keepdims=True, mask=msk),
                          mask=msk)

  # global sums on every partition: ones^T @ sums
  ones = nl.ones((PMAX, PMAX), dtype=nl.float32)
  tot = nl.copy(nisa.nc_matmul(ones, sums))
  w_norm = nl.sqrt(tot[i_p, 0])
  u_norm = nl.sqrt(tot[i_p, 1])
  ratio = nl.divide(w_norm, nl.maximum(u_norm, 1e-30))
  both = nl.multiply(nl.greater(w_norm, 0.0, dtype=nl.float32), nl.greater(u_norm, 0.0, dtype=nl.float32))
  trust = nl.where(both, ratio, 1.0)
  scale = nl.multiply(trust, -lr)

  for t in nl.affine_range(NT):
    msk = (t * PMAX + i_p < R)
    w = nl.load(param[t * PMAX + i_p, i_f], dtype=nl.float32, mask=msk)
    u = nl.load(upd_hbm[t * PMAX + i_p, i_f], mask=msk)
    w_new = nl.add(w, nl.multiply(u, scale, mask=msk), mask=msk)
    nl.store(param_out[t * PMAX + i_p, i_f], value=w_new, mask=msk)
  return param_out, m_out, v_out


@nki.jit
def clip_grad_norm(g0, g1, g2, max_norm=1.0):
  total_norm = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.shared_hbm)
  found_inf = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.shared_hbm)
  grads = (g0, g1, g2)
  i_p = nl.arange(PMAX)[:, None]

  # pass 1: sum of squares of every gradient, per partition
  acc = nl.zeros((PMAX, 1), dtype=nl.float32)
  for g in grads:
    R, C = g.shape
    i_f = nl.arange(C)[None, :]
    for t in nl.affine_range((R + PMAX - 1) // PMAX):
      msk = (t * PMAX + i_p < R)
      x = nl.load(g[t * PMAX + i_p, i_f], dtype=nl.float32, mask=msk)
      acc[...] = nl.add(acc, nl.sum(nl.square(x, mask=msk), axis=[1], keepdims=True, mask=msk), mask=msk)

  # total on every partition; inf / NaN anywhere makes it non-finite: s - s is NaN then, 0 otherwise
  ones = nl.ones((PMAX, PMAX), dtype=nl.float32)
  tot = nl.copy(nisa.nc_matmul(ones, acc))
  norm = nl.sqrt(tot)
  nonfinite = nl.not_equal(nl.subtract(tot, tot), 0.0, dtype=nl.float32)
  coef = nl.minimum(nl.multiply(nl.reciprocal(nl.add(norm, 1e-6)), max_norm), 1.0)
  scale = nl.where(nonfinite, 1.0, coef)
  nl.store(total_norm, value=norm[0:1, 0:1])
  nl.store(found_inf, value=nl.copy(nonfinite[0:1, 0:1], dtype=nl.int32))

  # pass 2: clip in place
  for g in grads:
    R, C = g.shape
    i_f = nl.arange(C)[None, :]
    for t in nl.affine_range((R + PMAX - 1) // PMAX):
      msk = (t * PMAX + i_p < R)
      x = nl.load(g[t * PMAX + i_p, i_f], dtype=nl.float32, mask=msk)
      nl.store(g[t * PMAX + i_p, i_f], value=nl.multiply(x, scale, mask=msk), mask=msk)
  return total_norm, found_inf
