"""BatchNorm training forward and backward in the Beta-1 dialect (``neuronxcc.nki``), written the way public NKI
kernels write them (arange index expressions, value-returning ``nl`` / ``nisa`` calls, channels on the
partitions):

- ``batchnorm2d_fwd(x, gamma, beta, running_mean, running_var, momentum, eps)``: x [N, C, HW] (NCHW with the
  spatial dims flattened), C a multiple of 128. Per channel tile: ``nisa.bn_stats`` per sample and per
  ``bn_stats_fmax`` chunk of its [128, HW] slab ``x[n, c0 + i_p, i_hw]`` (the ragged last chunk under a free-dim
  mask, as the LayerNorm tutorial), written side by side into a [128, 6 N k] stats tile, one
  ``nisa.bn_aggr`` for the batch mean / (population) variance; rstd = rsqrt(var + eps); y = x * (gamma rstd) +
  (beta - mean gamma rstd) by one ``nisa.activation`` per sample (per-partition scale and bias vectors).
  The running statistics are updated with momentum, the running variance from the unbiased variance
  var * M / (M - 1), M = N HW (as torch.nn.BatchNorm2d). Outputs y, the saved mean and rstd [C] (for the
  backward) and the new running mean / var [C].
- ``batchnorm1d_fwd(x, gamma, beta, running_mean, running_var, momentum, eps)``: x [N, C] (N <= 512). Each channel
  tile is loaded transposed by an index expression with the partition index on the column (``x[i_n, c0 + i_p]``,
  a transposing DMA), the statistics by sums (``nl.sum`` of x, then of the squared deviations), y stored back the
  same way.
- ``batchnorm2d_bwd(dy, x, gamma, mean, rstd)``: dbeta = sum dy, dgamma = sum dy xhat over (N, HW), then
  dx = gamma rstd / M (M dy - dbeta - xhat dgamma). Two passes over the samples: the sums accumulated into
  [128, 1] tiles, then dx.
- ``residual_layernorm_dropout_b1(x, res, gamma, beta, seed, p, eps, use_rand)``: h = x + res, LayerNorm over the
  hidden dim (masked bn_stats chunks, the tutorial's two-op ``tensor_scalar``), dropout seeded by
  ``nl.random_seed(nl.load(seed))`` (``nl.dropout``, or the hand-written ``nl.rand() >= p`` keep mask), scaled by
  1 / (1 - p).

Written for nsim's tests in the style of those kernels; not copies of any file. No nsim imports.
"""
import math

import numpy as np

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl

PMAX = 128


def _load_channel_vec(v, c0):
  """v [C] -> a [128, 1] fp32 tile of channels c0 .. c0 + 127 (one per partition)."""
  i_p = nl.arange(PMAX)[:, None]
  i_o = nl.arange(1)[None, :]
  return nl.load(v.reshape((v.shape[0], 1))[c0 + i_p, i_o], dtype=nl.float32)


def _store_channel_vec(v, c0, value):
  i_p = nl.arange(PMAX)[:, None]
  i_o = nl.arange(1)[None, :]
  nl.store(v.reshape((v.shape[0], 1))[c0 + i_p, i_o], value=value)


def _running_update(rm, rv, mean, var, M, momentum, c0, new_rm, new_rv):
  """running = (1 - momentum) running + momentum stat; the variance unbiased (var M / (M - 1))."""
  rm_t = _load_channel_vec(rm, c0)
  rv_t = _load_channel_vec(rv, c0)
  m_upd = nl.add(nl.multiply(rm_t, 1.0 - momentum), nl.multiply(mean, momentum))
  v_upd = nl.add(nl.multiply(rv_t, 1.0 - momentum), nl.multiply(var, momentum * M / (M - 1)))
  _store_channel_vec(new_rm, c0, m_upd)
  _store_channel_vec(new_rv, c0, v_upd)


@nki.jit
def batchnorm2d_fwd(x, gamma, beta, running_mean, running_var, momentum=0.1, eps=1e-5):
  N, C, HW = x.shape
  assert C % PMAX == 0
  M = N * HW
  y = nl.ndarray((N, C, HW), dtype=x.dtype, buffer=nl.shared_hbm)
  save_mean = nl.ndarray((C,), dtype=nl.float32, buffer=nl.shared_hbm)
  save_rstd = nl.ndarray((C,), dtype=nl.float32, buffer=nl.shared_hbm)
  new_rm = nl.ndarray((C,), dtype=nl.float32, buffer=nl.shared_hbm)
  new_rv = nl.ndarray((C,), dtype=nl.float32, buffer=nl.shared_hbm)

  i_p = nl.arange(PMAX)[:, None]
  i_hw = nl.arange(HW)[None, :]
  i_6 = nl.arange(6)[None, :]
  FMAX = nl.tile_size.bn_stats_fmax
  i_bn = nl.arange(FMAX)[None, :]
  NCH = math.ceil(HW / FMAX)

  for ct in nl.affine_range(C // PMAX):
    c0 = ct * PMAX
    xt = nl.ndarray((N, nl.par_dim(PMAX), HW), dtype=x.dtype, buffer=nl.sbuf)
    stats = nl.ndarray((PMAX, 6 * N * NCH), dtype=nl.float32, buffer=nl.sbuf)
    for n in nl.affine_range(N):
      xt[n, i_p, i_hw] = nl.load(x[n, c0 + i_p, i_hw])
      for j in nl.affine_range(NCH):
        # the last chunk of a sample is ragged (HW not a multiple of bn_stats_fmax): masked
        stats[i_p, (n * NCH + j) * 6 + i_6] = nisa.bn_stats(xt[n, i_p, j * FMAX + i_bn],
                                                            mask=(j * FMAX + i_bn < HW), dtype=nl.float32)
    mv = nisa.bn_aggr(stats)
    mean = mv[:, 0:1]
    var = mv[:, 1:2]
    rstd = nl.rsqrt(nl.add(var, eps))
    g = _load_channel_vec(gamma, c0)
    b = _load_channel_vec(beta, c0)
    scale = nl.multiply(g, rstd)
    shift = nl.subtract(b, nl.multiply(mean, scale))
    for n in nl.affine_range(N):
      yn = nisa.activation(op=nl.copy, data=xt[n, i_p, i_hw], scale=scale, bias=shift, dtype=x.dtype)
      nl.store(y[n, c0 + i_p, i_hw], value=yn)
    _store_channel_vec(save_mean, c0, mean)
    _store_channel_vec(save_rstd, c0, rstd)
    _running_update(running_mean, running_var, mean, var, M, momentum, c0, new_rm, new_rv)
  return y, save_mean, save_rstd, new_rm, new_rv


@nki.jit
def batchnorm1d_fwd(x, gamma, beta, running_mean, running_var, momentum=0.1, eps=1e-5):
  N, C = x.shape
  assert C % PMAX == 0 and N <= 512
  y = nl.ndarray((N, C), dtype=x.dtype, buffer=nl.shared_hbm)
  new_rm = nl.ndarray((C,), dtype=nl.float32, buffer=nl.shared_hbm)
  new_rv = nl.ndarray((C,), dtype=nl.float32, buffer=nl.shared_hbm)
  i_p = nl.arange(PMAX)[:, None]
  i_n = nl.arange(N)[None, :]
  for ct in nl.affine_range(C // PMAX):
    c0 = ct * PMAX
    # channels on the partitions: the column index is the partition index (a transposing, strided DMA)
    xt = nl.load(x[i_n, c0 + i_p], dtype=nl.float32)
    mean = nl.multiply(nl.sum(xt, axis=[1], keepdims=True), 1.0 / N)
    xc = nl.subtract(xt, mean)
    var = nl.multiply(nl.sum(nl.square(xc), axis=[1], keepdims=True), 1.0 / N)
    rstd = nl.rsqrt(nl.add(var, eps))
    g = _load_channel_vec(gamma, c0)
    b = _load_channel_vec(beta, c0)
    yt = nl.add(nl.multiply(xc, nl.multiply(rstd, g)), b, dtype=x.dtype)
    nl.store(y[i_n, c0 + i_p], value=yt)
    _running_update(running_mean, running_var, mean, var, N, momentum, c0, new_rm, new_rv)
  return y, new_rm, new_rv


@nki.jit
def batchnorm2d_bwd(dy, x, gamma, mean, rstd):
  N, C, HW = x.shape
  assert C % PMAX == 0
  M = N * HW
  dx = nl.ndarray((N, C, HW), dtype=x.dtype, buffer=nl.shared_hbm)
  dgamma = nl.ndarray((C,), dtype=nl.float32, buffer=nl.shared_hbm)
  dbeta = nl.ndarray((C,), dtype=nl.float32, buffer=nl.shared_hbm)
  i_p = nl.arange(PMAX)[:, None]
  i_hw = nl.arange(HW)[None, :]

  for ct in nl.affine_range(C // PMAX):
    c0 = ct * PMAX
    mu = _load_channel_vec(mean, c0)
    rs = _load_channel_vec(rstd, c0)
    g = _load_channel_vec(gamma, c0)
    xh = nl.ndarray((N, nl.par_dim(PMAX), HW), dtype=nl.float32, buffer=nl.sbuf)
    dyt = nl.ndarray((N, nl.par_dim(PMAX), HW), dtype=nl.float32, buffer=nl.sbuf)
    sum_dy = nl.zeros((PMAX, 1), dtype=nl.float32)
    sum_dyx = nl.zeros((PMAX, 1), dtype=nl.float32)
    for n in nl.sequential_range(N):
      dyt[n, i_p, i_hw] = nl.load(dy[n, c0 + i_p, i_hw], dtype=nl.float32)
      xn = nl.load(x[n, c0 + i_p, i_hw], dtype=nl.float32)
      xh[n, i_p, i_hw] = nl.multiply(nl.subtract(xn, mu), rs)
      sum_dy[...] = nl.add(sum_dy, nl.sum(dyt[n, i_p, i_hw], axis=[1], keepdims=True))
      sum_dyx[...] = nl.add(sum_dyx, nl.sum(nl.multiply(dyt[n, i_p, i_hw], xh[n, i_p, i_hw]), axis=[1],
                                            keepdims=True))
    k = nl.multiply(nl.multiply(g, rs), 1.0 / M)
    for n in nl.affine_range(N):
      t = nl.subtract(nl.multiply(dyt[n, i_p, i_hw], float(M)), sum_dy)
      t = nl.subtract(t, nl.multiply(xh[n, i_p, i_hw], sum_dyx))
      nl.store(dx[n, c0 + i_p, i_hw], value=nl.multiply(t, k, dtype=x.dtype))
    _store_channel_vec(dgamma, c0, sum_dyx)
    _store_channel_vec(dbeta, c0, sum_dy)
  return dx, dgamma, dbeta


@nki.jit
def residual_layernorm_dropout_b1(x, res, gamma, beta, seed, p=0.1, eps=1e-5, use_rand=False):
  """h = x + res; out = dropout(LayerNorm(h) * gamma + beta) / (1 - p), rows of 128 tokens. The PRNG is seeded
  from a [1, 1] int32 tensor (``nl.random_seed``); the mask is ``nl.dropout`` or, with ``use_rand``, the explicit
  ``nl.rand(...) >= p`` keep mask of a hand-written dropout."""
  N, H = x.shape
  assert N % PMAX == 0
  h_out = nl.ndarray((N, H), dtype=x.dtype, buffer=nl.shared_hbm)
  out = nl.ndarray((N, H), dtype=x.dtype, buffer=nl.shared_hbm)
  i_p = nl.arange(PMAX)[:, None]
  i_h = nl.arange(H)[None, :]
  i_6 = nl.arange(6)[None, :]
  FMAX = nl.tile_size.bn_stats_fmax
  i_bn = nl.arange(FMAX)[None, :]
  NCH = math.ceil(H / FMAX)

  nl.random_seed(seed=nl.load(seed))
  g = nl.load(gamma.reshape((1, H)), dtype=nl.float32).broadcast_to((PMAX, H))
  b = nl.load(beta.reshape((1, H)), dtype=nl.float32).broadcast_to((PMAX, H))
  for t in nl.affine_range(N // PMAX):
    h = nl.add(nl.load(x[t * PMAX + i_p, i_h]), nl.load(res[t * PMAX + i_p, i_h]), dtype=nl.float32)
    nl.store(h_out[t * PMAX + i_p, i_h], value=h)
    stats = nl.ndarray((PMAX, 6 * NCH), dtype=nl.float32)
    for j in nl.affine_range(NCH):
      stats[i_p, j * 6 + i_6] = nisa.bn_stats(h[i_p, j * FMAX + i_bn], mask=(j * FMAX + i_bn < H),
                                              dtype=nl.float32)
    mv = nisa.bn_aggr(stats)
    rstd = nl.rsqrt(mv[:, 1:2] + eps)
    y = nisa.tensor_scalar(data=h, op0=np.subtract, operand0=mv[:, 0:1], op1=np.multiply, operand1=rstd)
    y = y * g + b
    if use_rand:
      keep = nl.greater_equal(nl.rand((PMAX, H)), p, dtype=nl.float32)
      y = nl.multiply(y, keep)
    else:
      y = nl.dropout(y, rate=p)
    nl.store(out[t * PMAX + i_p, i_h], value=nl.multiply(y, 1.0 / (1.0 - p), dtype=x.dtype))
  return h_out, out
