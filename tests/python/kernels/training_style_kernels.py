"""Training-time kernels (backward passes and an optimizer step) in the style of aws-neuron/neuronx-distributed's
NKI kernels and of the NKI samples they start from, in the Beta-1 dialect (``import neuronxcc.nki as nki``,
``@nki.jit``, ``nl.affine_range``, ``nl.arange`` index grids, masks, ``nl.par_dim``; 2-space indentation as in
the samples):

- ``nki_rmsnorm_bwd_kernel(x, gamma, grad_out, eps)``: RMSNorm backward. ``rstd`` recomputed per row tile
  (``nisa.activation_reduce`` sum of squares, ``nisa.activation`` rsqrt with scale and bias), grad_x with
  ``tensor_scalar`` / ``scalar_tensor_tensor``, grad_gamma reduced over the rows on TensorE by a matmul with a
  ones vector, accumulated in PSUM across the row tiles (``+=``); rows tiled over 128 partitions, the ragged
  last tile masked, the hidden dim in 512-wide PSUM banks (the last one masked).
- ``nki_layernorm_bwd_kernel(x, gamma, grad_out, eps)``: LayerNorm backward, mean/var recomputed with
  ``nisa.bn_stats`` / ``nisa.bn_aggr`` (as the NKI LayerNorm sample's forward), grad_gamma and grad_beta reduced
  over the rows by ``nl.sum`` of ``nisa.nc_transpose``d tiles, accumulated in SBUF across a sequential loop.
- ``nki_softmax_bwd_kernel(y, dy)``: dx = y * (dy - sum(dy * y)), one multiply, one reduce and one fused
  ``scalar_tensor_tensor`` per row tile; ``nki_softmax_bwd_naive_kernel`` is the same with ``nl`` operators.
- ``nki_cross_entropy_kernel(logits, labels)``: per-row cross-entropy loss and dlogits = softmax - onehot over
  logits [N, V], V tiled over the free axis (512 wide, ragged last chunk masked) with an online max and
  log-sum-exp; the onehot from ``nisa.iota`` column ids compared with the label broadcast per partition.
- ``nki_adamw_kernel(param, grad, exp_avg, exp_avg_sq, lr, beta1, beta2, eps, weight_decay, step)``: a fused
  AdamW step (torch semantics: decoupled weight decay, bias corrections) over flattened fp32 parameters
  [rows, F], param / exp_avg / exp_avg_sq updated in place (``nt.mutable_tensor``, returned), the work spread
  over ScalarE (a ``tensor_scalar`` on ScalarE: gen3+), VectorE and GpSimd;
  ``nki_adamw_naive_kernel`` is the same written with ``nl`` operators as a line-by-line port of the torch code.

Written from memory of those repositories and in their authors' style; not copies of their files. No nsim
imports.
"""
import math

import numpy as np

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl
import neuronxcc.nki.typing as nt

PMAX = nl.tile_size.pmax            # 128 partitions
FMAX = nl.tile_size.psum_fmax       # 512 fp32 per PSUM bank


# ------------------------------------------------------------------------------------------------
# RMSNorm backward
# ------------------------------------------------------------------------------------------------

@nki.jit
def nki_rmsnorm_bwd_kernel(x, gamma, grad_out, eps=1e-6):
  """
  Forward: y = x * rstd * gamma, rstd = 1 / sqrt(mean(x ** 2, -1) + eps).
  Backward:
    grad_x = rstd * (dy * gamma) - x * rstd ** 3 * mean(dy * gamma * x, -1)
    grad_gamma = sum over rows of dy * x * rstd

  x, grad_out: [N, H]; gamma: [H]. Returns (grad_x [N, H] in x.dtype, grad_gamma [H] in gamma.dtype).
  """
  N, H = x.shape
  assert grad_out.shape == x.shape
  assert gamma.shape[0] == H
  # grad_gamma lives in PSUM as one row of H fp32: at most 4 banks
  assert H <= 4 * FMAX

  grad_x = nl.ndarray((N, H), dtype=x.dtype, buffer=nl.shared_hbm)
  grad_gamma = nl.ndarray((H,), dtype=gamma.dtype, buffer=nl.shared_hbm)

  i_p = nl.arange(PMAX)[:, None]
  i_h = nl.arange(H)[None, :]
  i_w = nl.arange(1)[:, None]
  i_c = nl.arange(FMAX)[None, :]
  n_h = (H + FMAX - 1) // FMAX

  gamma_sb = nl.load(gamma.reshape((1, H))[i_w, i_h], dtype=nl.float32)
  gamma_bcast = gamma_sb.broadcast_to((PMAX, H))
  eps_sb = nl.full((PMAX, 1), eps, dtype=nl.float32)

  # ones vector: stationary operand of the partition (row) reduction
  ones = nl.ones((PMAX, 1), dtype=nl.float32)
  dgamma_psum = nl.zeros((n_h, nl.par_dim(1), FMAX), dtype=nl.float32, buffer=nl.psum)

  for i in nl.affine_range((N + PMAX - 1) // PMAX):
    row_mask = (i * PMAX + i_p < N)

    # zero-filled tiles: the rows past N contribute nothing to grad_gamma
    x_sb = nl.zeros((PMAX, H), dtype=nl.float32)
    x_sb[i_p, i_h] = nl.load(x[i * PMAX + i_p, i_h], mask=row_mask, dtype=nl.float32)
    dy_sb = nl.zeros((PMAX, H), dtype=nl.float32)
    dy_sb[i_p, i_h] = nl.load(grad_out[i * PMAX + i_p, i_h], mask=row_mask, dtype=nl.float32)

    # recompute rstd = rsqrt(sum(x^2) / H + eps)
    sq_sum = nl.ndarray((PMAX, 1), dtype=nl.float32)
    nisa.activation_reduce(op=nl.square, data=x_sb, reduce_op=nl.add, reduce_res=sq_sum)
    rstd = nisa.activation(op=nl.rsqrt, data=sq_sum, scale=1.0 / H, bias=eps_sb)

    # dyg = dy * gamma; dot = sum(dyg * x)
    dyg = nisa.tensor_tensor(dy_sb, gamma_bcast, op=nl.multiply)
    dyg_x = nisa.tensor_tensor(dyg, x_sb, op=nl.multiply)
    dot = nisa.tensor_reduce(nl.add, dyg_x, axis=(1,), keepdims=True)

    # coef = -dot * rstd^3 / H
    rstd_sq = nisa.tensor_tensor(rstd, rstd, op=nl.multiply)
    rstd_cube = nisa.tensor_tensor(rstd_sq, rstd, op=nl.multiply)
    coef = nisa.tensor_scalar(dot, op0=nl.multiply, operand0=rstd_cube, op1=nl.multiply, operand1=-1.0 / H)

    # grad_x = x * coef + dyg * rstd
    dyg_rstd = nisa.tensor_scalar(dyg, op0=nl.multiply, operand0=rstd)
    dx = nisa.scalar_tensor_tensor(data=x_sb, op0=nl.multiply, operand0=coef,
                                   op1=nl.add, operand1=dyg_rstd, dtype=x.dtype)
    nl.store(grad_x[i * PMAX + i_p, i_h], value=dx, mask=row_mask)

    # grad_gamma partial sums: sum over the partitions of dy * x * rstd, as ones^T @ (dy * x_hat)
    dy_xhat = nisa.scalar_tensor_tensor(data=x_sb, op0=nl.multiply, operand0=rstd,
                                        op1=nl.multiply, operand1=dy_sb)
    for c in nl.affine_range(n_h):
      dgamma_psum[c, i_w, i_c] += nisa.nc_matmul(ones[i_p, i_w], dy_xhat[i_p, c * FMAX + i_c],
                                                 mask=(c * FMAX + i_c < H))

  grad_gamma_2d = grad_gamma.reshape((1, H))
  for c in nl.affine_range(n_h):
    dgamma_sb = nl.copy(dgamma_psum[c, i_w, i_c], dtype=gamma.dtype, mask=(c * FMAX + i_c < H))
    nl.store(grad_gamma_2d[i_w, c * FMAX + i_c], value=dgamma_sb, mask=(c * FMAX + i_c < H))

  return grad_x, grad_gamma


# ------------------------------------------------------------------------------------------------
# LayerNorm backward
# ------------------------------------------------------------------------------------------------

@nki.jit
def nki_layernorm_bwd_kernel(x, gamma, grad_out, eps=1e-5):
  """
  Forward: y = (x - mean) * rstd * gamma + beta, rstd = 1 / sqrt(var + eps) (population variance).
  Backward, with x_hat = (x - mean) * rstd and g = dy * gamma:
    grad_x = rstd * (g - mean(g) - x_hat * mean(g * x_hat))
    grad_gamma = sum over rows of dy * x_hat
    grad_beta = sum over rows of dy

  x, grad_out: [N, H] with H a multiple of 128; gamma: [H].
  Returns (grad_x [N, H], grad_gamma [H], grad_beta [H]).
  """
  N, H = x.shape
  assert grad_out.shape == x.shape
  assert gamma.shape[0] == H
  assert H % PMAX == 0

  grad_x = nl.ndarray((N, H), dtype=x.dtype, buffer=nl.shared_hbm)
  grad_gamma = nl.ndarray((H,), dtype=gamma.dtype, buffer=nl.shared_hbm)
  grad_beta = nl.ndarray((H,), dtype=gamma.dtype, buffer=nl.shared_hbm)

  i_p = nl.arange(PMAX)[:, None]
  i_h = nl.arange(H)[None, :]
  i_w = nl.arange(1)[:, None]
  i_t = nl.arange(PMAX)[None, :]
  i_0 = nl.arange(1)[None, :]

  bn_fmax = nl.tile_size.bn_stats_fmax
  i_f_bn = nl.arange(bn_fmax)[None, :]
  i_f_stats = nl.arange(6)[None, :]
  num_bn_stats = math.ceil(H / bn_fmax)
  i_f_aggr = nl.arange(6 * num_bn_stats)[None, :]

  gamma_sb = nl.load(gamma.reshape((1, H))[i_w, i_h])
  gamma_bcast = gamma_sb.broadcast_to((PMAX, H))

  # per-feature sums, the feature dim on the partitions (transposed layout)
  n_ht = H // PMAX
  dgamma_acc = nl.zeros((n_ht, nl.par_dim(PMAX), 1), dtype=nl.float32)
  dbeta_acc = nl.zeros((n_ht, nl.par_dim(PMAX), 1), dtype=nl.float32)

  for i in nl.sequential_range((N + PMAX - 1) // PMAX):
    row_mask = (i * PMAX + i_p < N)
    x_sb = nl.zeros((PMAX, H), dtype=nl.float32)
    x_sb[i_p, i_h] = nl.load(x[i * PMAX + i_p, i_h], mask=row_mask, dtype=nl.float32)
    dy_sb = nl.zeros((PMAX, H), dtype=nl.float32)
    dy_sb[i_p, i_h] = nl.load(grad_out[i * PMAX + i_p, i_h], mask=row_mask, dtype=nl.float32)

    # mean / var as the forward computed them
    stats = nl.ndarray((PMAX, 6 * num_bn_stats), dtype=nl.float32)
    for j in nl.affine_range(num_bn_stats):
      stats[i_p, j * 6 + i_f_stats] = nisa.bn_stats(x_sb[i_p, j * bn_fmax + i_f_bn],
                                                    mask=(j * bn_fmax + i_f_bn < H),
                                                    dtype=nl.float32)
    mean_var = nisa.bn_aggr(stats[i_p, i_f_aggr])
    mean = mean_var[i_p, 0]
    var = mean_var[i_p, 1]
    rstd = nl.rsqrt(var + eps)

    x_hat = nisa.tensor_scalar(data=x_sb, op0=np.subtract, operand0=mean, op1=np.multiply, operand1=rstd)
    g = nl.multiply(dy_sb, gamma_bcast)

    mean_g = nl.mean(g, axis=[1])
    mean_g_xhat = nl.mean(nl.multiply(g, x_hat), axis=[1])

    # grad_x = (g - x_hat * mean(g * x_hat) - mean(g)) * rstd
    t = nisa.scalar_tensor_tensor(data=x_hat, op0=np.multiply, operand0=mean_g_xhat,
                                  op1=np.subtract, operand1=g, reverse1=True)
    dx = nisa.tensor_scalar(data=t, op0=np.subtract, operand0=mean_g, op1=np.multiply, operand1=rstd,
                            dtype=x.dtype)
    nl.store(grad_x[i * PMAX + i_p, i_h], value=dx, mask=row_mask)

    # column sums over this tile's rows: transpose 128 x 128 blocks, reduce along the free axis
    dy_xhat = nl.multiply(dy_sb, x_hat)
    for h in nl.affine_range(n_ht):
      dy_xhat_t = nisa.nc_transpose(dy_xhat[i_p, h * PMAX + i_t])
      dy_t = nisa.nc_transpose(dy_sb[i_p, h * PMAX + i_t])
      dgamma_acc[h, i_p, i_0] += nl.sum(dy_xhat_t, axis=[1], keepdims=True)
      dbeta_acc[h, i_p, i_0] += nl.sum(dy_t, axis=[1], keepdims=True)

  grad_gamma_2d = grad_gamma.reshape((H, 1))
  grad_beta_2d = grad_beta.reshape((H, 1))
  for h in nl.affine_range(n_ht):
    nl.store(grad_gamma_2d[h * PMAX + i_p, i_0], value=dgamma_acc[h, i_p, i_0])
    nl.store(grad_beta_2d[h * PMAX + i_p, i_0], value=dbeta_acc[h, i_p, i_0])

  return grad_x, grad_gamma, grad_beta


# ------------------------------------------------------------------------------------------------
# Softmax backward
# ------------------------------------------------------------------------------------------------

@nki.jit
def nki_softmax_bwd_kernel(y, dy):
  """dx = y * (dy - sum(dy * y, axis=-1)); y (the forward output), dy: [N, D]."""
  N, D = y.shape
  assert dy.shape == y.shape
  dx = nl.ndarray((N, D), dtype=y.dtype, buffer=nl.shared_hbm)

  i_p = nl.arange(PMAX)[:, None]
  i_f = nl.arange(D)[None, :]

  for i in nl.affine_range((N + PMAX - 1) // PMAX):
    row_mask = (i * PMAX + i_p < N)
    y_sb = nl.load(y[i * PMAX + i_p, i_f], mask=row_mask)
    dy_sb = nl.load(dy[i * PMAX + i_p, i_f], mask=row_mask)

    # s = sum(dy * y) per row, in fp32
    prod = nisa.tensor_tensor(dy_sb, y_sb, op=np.multiply, dtype=nl.float32, mask=row_mask)
    s = nisa.tensor_reduce(np.add, prod, axis=(1,), keepdims=True, mask=row_mask)

    # dx = (dy - s) * y in one instruction
    dx_sb = nisa.scalar_tensor_tensor(data=dy_sb, op0=np.subtract, operand0=s,
                                      op1=np.multiply, operand1=y_sb, dtype=y.dtype, mask=row_mask)
    nl.store(dx[i * PMAX + i_p, i_f], value=dx_sb, mask=row_mask)

  return dx


@nki.jit
def nki_softmax_bwd_naive_kernel(y, dy):
  """The same as ``nki_softmax_bwd_kernel`` written with nl operators (one more VectorE pass per tile)."""
  N, D = y.shape
  dx = nl.ndarray((N, D), dtype=y.dtype, buffer=nl.shared_hbm)

  i_p = nl.arange(PMAX)[:, None]
  i_f = nl.arange(D)[None, :]

  for i in nl.affine_range((N + PMAX - 1) // PMAX):
    row_mask = (i * PMAX + i_p < N)
    y_sb = nl.load(y[i * PMAX + i_p, i_f], mask=row_mask, dtype=nl.float32)
    dy_sb = nl.load(dy[i * PMAX + i_p, i_f], mask=row_mask, dtype=nl.float32)
    s = nl.sum(nl.multiply(dy_sb, y_sb, mask=row_mask), axis=[1], keepdims=True, mask=row_mask)
    dx_sb = nl.multiply(nl.subtract(dy_sb, s, mask=row_mask), y_sb, mask=row_mask)
    nl.store(dx[i * PMAX + i_p, i_f], value=dx_sb, mask=row_mask)

  return dx


# ------------------------------------------------------------------------------------------------
# Cross-entropy loss, forward and backward
# ------------------------------------------------------------------------------------------------

@nki.jit
def nki_cross_entropy_kernel(logits, labels):
  """
  loss[n] = logsumexp(logits[n, :]) - logits[n, labels[n]]
  dlogits[n, :] = softmax(logits[n, :]) - onehot(labels[n])

  logits: [N, V] (V up to a few thousand, tiled over the free axis); labels: int32 [N].
  Returns (loss fp32 [N], dlogits [N, V] in logits.dtype).
  """
  N, V = logits.shape
  assert labels.shape[0] == N
  assert V < 2 ** 24  # column ids compared in fp32

  loss = nl.ndarray((N,), dtype=nl.float32, buffer=nl.shared_hbm)
  dlogits = nl.ndarray((N, V), dtype=logits.dtype, buffer=nl.shared_hbm)

  V_TILE = min(V, 512)
  n_v = (V + V_TILE - 1) // V_TILE

  i_p = nl.arange(PMAX)[:, None]
  i_v = nl.arange(V_TILE)[None, :]
  i_0 = nl.arange(1)[None, :]

  labels_2d = labels.reshape((N, 1))
  loss_2d = loss.reshape((N, 1))

  # column ids 0..V_TILE-1 on every partition
  col_ids = nisa.iota(i_p * 0 + i_v, dtype=nl.float32)

  for i in nl.affine_range((N + PMAX - 1) // PMAX):
    row_mask = (i * PMAX + i_p < N)

    label_sb = nl.load(labels_2d[i * PMAX + i_p, i_0], mask=row_mask)
    label_f = nl.copy(label_sb, dtype=nl.float32, mask=row_mask)

    run_max = nl.full((PMAX, 1), -3.0e38, dtype=nl.float32)
    run_sum = nl.zeros((PMAX, 1), dtype=nl.float32)
    picked = nl.zeros((PMAX, 1), dtype=nl.float32)

    # pass 1: online max / sum of exp, and the label's logit
    for j in nl.sequential_range(n_v):
      mask = row_mask & (j * V_TILE + i_v < V)
      x_sb = nl.load(logits[i * PMAX + i_p, j * V_TILE + i_v], mask=mask, dtype=nl.float32)

      chunk_max = nisa.tensor_reduce(np.max, x_sb, axis=(1,), keepdims=True, mask=mask)
      new_max = nl.maximum(run_max, chunk_max, mask=row_mask)
      neg_max = nl.negative(new_max, mask=row_mask)

      # exp(x - new_max) summed along the row on ScalarE
      chunk_sum = nl.ndarray((PMAX, 1), dtype=nl.float32)
      nisa.activation_reduce(op=nl.exp, data=x_sb, bias=neg_max, reduce_op=nl.add,
                             reduce_res=chunk_sum, mask=mask)
      # rescale the running sum: run_sum * exp(run_max - new_max) + chunk_sum
      alpha = nisa.activation(op=nl.exp, data=run_max, bias=neg_max, mask=row_mask)
      run_sum[i_p, i_0] = nisa.scalar_tensor_tensor(data=run_sum, op0=nl.multiply, operand0=alpha,
                                                    op1=nl.add, operand1=chunk_sum, mask=row_mask)
      run_max[i_p, i_0] = nl.copy(new_max, mask=row_mask)

      # logits[n, label] if the label falls in this chunk
      label_local = nl.add(label_f, -1.0 * j * V_TILE, mask=row_mask)
      onehot = nisa.tensor_scalar(col_ids, op0=nl.equal, operand0=label_local, mask=mask)
      hit = nisa.tensor_tensor(onehot, x_sb, op=nl.multiply, mask=mask)
      picked[i_p, i_0] = nl.add(picked, nisa.tensor_reduce(np.add, hit, axis=(1,), keepdims=True, mask=mask),
                                mask=row_mask)

    # loss = log(run_sum) + run_max - picked
    lse = nl.add(nl.log(run_sum, mask=row_mask), run_max, mask=row_mask)
    loss_sb = nl.subtract(lse, picked, mask=row_mask)
    nl.store(loss_2d[i * PMAX + i_p, i_0], value=loss_sb, mask=row_mask)

    # pass 2: dlogits = exp(x - lse) - onehot
    neg_lse = nl.negative(lse, mask=row_mask)
    for j in nl.affine_range(n_v):
      mask = row_mask & (j * V_TILE + i_v < V)
      x_sb = nl.load(logits[i * PMAX + i_p, j * V_TILE + i_v], mask=mask, dtype=nl.float32)
      probs = nisa.activation(op=nl.exp, data=x_sb, bias=neg_lse, mask=mask)
      label_local = nl.add(label_f, -1.0 * j * V_TILE, mask=row_mask)
      # (col == label) subtracted from probs: probs - onehot
      grad = nisa.scalar_tensor_tensor(data=col_ids, op0=nl.equal, operand0=label_local,
                                       op1=nl.subtract, operand1=probs, reverse1=True,
                                       dtype=logits.dtype, mask=mask)
      nl.store(dlogits[i * PMAX + i_p, j * V_TILE + i_v], value=grad, mask=mask)

  return loss, dlogits


# ------------------------------------------------------------------------------------------------
# Fused AdamW step
# ------------------------------------------------------------------------------------------------

@nki.jit
def nki_adamw_kernel(param: nt.mutable_tensor, grad, exp_avg: nt.mutable_tensor,
                     exp_avg_sq: nt.mutable_tensor, lr, beta1, beta2, eps, weight_decay, step):
  """
  One AdamW step (torch.optim.AdamW, amsgrad=False) on flattened fp32 parameters [rows, F], in place:
    param = param * (1 - lr * weight_decay)
    exp_avg = beta1 * exp_avg + (1 - beta1) * grad
    exp_avg_sq = beta2 * exp_avg_sq + (1 - beta2) * grad * grad
    param = param - lr / (1 - beta1 ** step) * exp_avg / (sqrt(exp_avg_sq / (1 - beta2 ** step)) + eps)
  lr, betas, eps, weight_decay and step are Python scalars (folded at trace time).
  """
  rows, F = param.shape
  assert grad.shape == param.shape and exp_avg.shape == param.shape and exp_avg_sq.shape == param.shape

  bias_correction1 = 1.0 - beta1 ** step
  bias_correction2 = 1.0 - beta2 ** step
  step_size = lr / bias_correction1
  decay = 1.0 - lr * weight_decay

  F_TILE = min(F, 2048)
  i_p = nl.arange(PMAX)[:, None]
  i_f = nl.arange(F_TILE)[None, :]

  for i in nl.affine_range((rows + PMAX - 1) // PMAX):
    for j in nl.affine_range((F + F_TILE - 1) // F_TILE):
      mask = (i * PMAX + i_p < rows) & (j * F_TILE + i_f < F)
      p_sb = nl.load(param[i * PMAX + i_p, j * F_TILE + i_f], mask=mask)
      g_sb = nl.load(grad[i * PMAX + i_p, j * F_TILE + i_f], mask=mask)
      m_sb = nl.load(exp_avg[i * PMAX + i_p, j * F_TILE + i_f], mask=mask)
      v_sb = nl.load(exp_avg_sq[i * PMAX + i_p, j * F_TILE + i_f], mask=mask)

      # The elementwise work is shared by the engines: ScalarE the one-input steps (activation computes
      # f(data * scale + bias)), VectorE the fused two-input ones, GpSimd one product.
      # exp_avg = beta1 * m + (1 - beta1) * g
      g_scaled = nisa.activation(op=nl.copy, data=g_sb, scale=1.0 - beta1, mask=mask)
      m_new = nisa.scalar_tensor_tensor(data=m_sb, op0=np.multiply, operand0=beta1,
                                        op1=np.add, operand1=g_scaled, mask=mask)
      # exp_avg_sq = beta2 * v + (1 - beta2) * g * g, with (1 - beta2) * g^2 = (sqrt(1 - beta2) * g)^2
      g_sq = nisa.activation(op=nl.square, data=g_sb, scale=math.sqrt(1.0 - beta2), mask=mask)
      v_new = nisa.scalar_tensor_tensor(data=v_sb, op0=np.multiply, operand0=beta2,
                                        op1=np.add, operand1=g_sq, mask=mask)

      # -step_size / (sqrt(v / bias_correction2) + eps): sqrt and reciprocal on ScalarE (VectorE's
      # reciprocal is 8x slower per element); reciprocal(denom * scale) with scale = -1 / step_size
      denom = nisa.activation(op=nl.sqrt, data=v_new, scale=1.0 / bias_correction2, mask=mask)
      denom = nisa.tensor_scalar(denom, op0=np.add, operand0=eps, engine=nisa.scalar_engine, mask=mask)
      neg_step = nisa.activation(op=nl.reciprocal, data=denom, scale=-1.0 / step_size, mask=mask)

      # param = param * decay + m * neg_step (the product on GpSimd, the third engine)
      update = nisa.tensor_tensor(m_new, neg_step, op=np.multiply, engine=nisa.gpsimd_engine, mask=mask)
      p_new = nisa.scalar_tensor_tensor(data=p_sb, op0=np.multiply, operand0=decay,
                                        op1=np.add, operand1=update, mask=mask)

      nl.store(param[i * PMAX + i_p, j * F_TILE + i_f], value=p_new, mask=mask)
      nl.store(exp_avg[i * PMAX + i_p, j * F_TILE + i_f], value=m_new, mask=mask)
      nl.store(exp_avg_sq[i * PMAX + i_p, j * F_TILE + i_f], value=v_new, mask=mask)

  return param, exp_avg, exp_avg_sq


@nki.jit
def nki_adamw_naive_kernel(param: nt.mutable_tensor, grad, exp_avg: nt.mutable_tensor,
                           exp_avg_sq: nt.mutable_tensor, lr, beta1, beta2, eps, weight_decay, step):
  """``nki_adamw_kernel`` as a line-by-line port of the torch code with nl operators."""
  rows, F = param.shape
  bias_correction1 = 1.0 - beta1 ** step
  bias_correction2 = 1.0 - beta2 ** step
  step_size = lr / bias_correction1
  bias_correction2_sqrt = math.sqrt(bias_correction2)

  F_TILE = min(F, 2048)
  i_p = nl.arange(PMAX)[:, None]
  i_f = nl.arange(F_TILE)[None, :]

  for i in nl.affine_range((rows + PMAX - 1) // PMAX):
    for j in nl.affine_range((F + F_TILE - 1) // F_TILE):
      mask = (i * PMAX + i_p < rows) & (j * F_TILE + i_f < F)
      p = nl.load(param[i * PMAX + i_p, j * F_TILE + i_f], mask=mask)
      g = nl.load(grad[i * PMAX + i_p, j * F_TILE + i_f], mask=mask)
      m = nl.load(exp_avg[i * PMAX + i_p, j * F_TILE + i_f], mask=mask)
      v = nl.load(exp_avg_sq[i * PMAX + i_p, j * F_TILE + i_f], mask=mask)

      p = nl.multiply(p, 1.0 - lr * weight_decay, mask=mask)
      m = nl.add(nl.multiply(m, beta1, mask=mask), nl.multiply(g, 1.0 - beta1, mask=mask), mask=mask)
      v = nl.add(nl.multiply(v, beta2, mask=mask),
                 nl.multiply(nl.multiply(g, g, mask=mask), 1.0 - beta2, mask=mask), mask=mask)
      denom = nl.add(nl.divide(nl.sqrt(v, mask=mask), bias_correction2_sqrt, mask=mask), eps, mask=mask)
      p = nl.subtract(p, nl.multiply(nl.divide(m, denom, mask=mask), step_size, mask=mask), mask=mask)

      nl.store(param[i * PMAX + i_p, j * F_TILE + i_f], value=p, mask=mask)
      nl.store(exp_avg[i * PMAX + i_p, j * F_TILE + i_f], value=m, mask=mask)
      nl.store(exp_avg_sq[i * PMAX + i_p, j * F_TILE + i_f], value=v, mask=mask)

  return param, exp_avg, exp_avg_sq
