"""Training utilities with on-chip randomness and global reductions, written the way public NKI kernels are
(Beta-1 dialect: ``import neuronxcc.nki as nki``, ``nl.arange`` index grids, ``mask=`` on ragged tiles, 2-space
indentation as in the NKI samples):

- ``dropout_fwd_kernel(x, seed, dropout_p)`` / ``dropout_bwd_kernel(dy, seed, dropout_p)``: inverted dropout over
  rows of 128, the generator re-seeded per row tile with ``seed + tile`` (``nl.add(seed, t, dtype=nl.int32)`` then
  ``nl.random_seed``, as the flash-attention samples do), ``nl.dropout`` then the 1 / (1 - p) rescale. The
  backward regenerates the same mask from the same seeds.
- ``dropout_mask_fwd_kernel(x, seed, dropout_p)`` / ``dropout_mask_bwd_kernel(dy, mask, dropout_p)``: the other
  style: ``nl.rand`` (in x's dtype) once seeded, keep = (u >= p), the mask stored as uint8 for the backward to
  reuse.
- ``clip_grad_norm_kernel(g0, g1, g2, max_norm)``: ``torch.nn.utils.clip_grad_norm_`` over three gradients of
  different shapes and dtypes (1-D ones viewed as [128, n / 128]). Pass 1: per tensor the sum of squares per
  partition (``nisa.activation_reduce`` with ``nl.square``) accumulated over tiles into column k of a [128, 3] fp32
  tile, then summed over the partitions by a ones [128, 128] matmul into PSUM (every partition gets the totals),
  sqrt, scale = min(1, max_norm / (norm + 1e-6)). Pass 2: every tile re-read, multiplied by the scale
  (``nisa.tensor_scalar`` with a (P, 1) operand), stored. Returns the clipped gradients and the per-tensor and
  total norms [1, 4] fp32.
- ``clip_grad_norm_pr_kernel``: the same with the partition sum by ``nisa.tensor_partition_reduce`` (GpSimd) and
  the scale broadcast back to the partitions with ``nl.broadcast_to``.
- ``clip_grad_norm_nl_kernel(g, max_norm)``: one gradient clipped by its norm written with ``nl`` operators
  (``acc += nl.sum(..., mask=)``, ``nl.matmul(ones, acc, transpose_x=True)``, ``max_norm / (norm + 1e-6)``).
- ``dropout_isa_kernel(x, seed, dropout_p)``: ``nisa.dropout`` with a (P, 1) probability tile under a row mask.
- ``bias_gelu_fwd_kernel(x, bias, approximate)``: y = gelu(x + bias) in one ScalarE ``nisa.activation`` with the
  bias as its (P, 1) operand (feature-major layout x [D, N], as an MLP computes h^T); tanh approximation
  (``nl.gelu_apprx_tanh``) or exact erf (``nl.gelu``). ``bias_add_kernel`` and ``gelu_kernel`` are the same work
  as two kernels with the intermediate in HBM.
- ``bias_gelu_bwd_kernel(x, bias, dy, approximate)``: dx = dy * gelu'(x + bias) and dbias = sum over N of dx
  (fp32). Exact: ``nl.gelu_dx``; tanh approximation: the derivative written out with ``nl`` operators.

Written for nsim's tests in the style of public kernels; not copies of any file. No nsim imports.
"""
import math

import numpy as np

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl

PMAX = nl.tile_size.pmax    # 128
FT = 2048                   # free-dim chunk of the elementwise passes


# ------------------------------------------------------------------------------------------------
# Dropout
# ------------------------------------------------------------------------------------------------

def _dropout_rows(src, out, seed, dropout_p):
  N, D = src.shape
  i_p = nl.arange(PMAX)[:, None]
  i_f = nl.arange(D)[None, :]
  seed_local = nl.load(seed[0])
  for t in nl.sequential_range((N + PMAX - 1) // PMAX):
    rows = (t * PMAX + i_p < N)
    offset_seed = nl.add(seed_local, t, dtype=nl.int32)
    nl.random_seed(seed=offset_seed)
    xt = nl.load(src[t * PMAX + i_p, i_f], mask=rows)
    kept = nl.dropout(xt, rate=dropout_p, mask=rows)
    yt = nl.multiply(kept, 1 / (1 - dropout_p), mask=rows)
    nl.store(out[t * PMAX + i_p, i_f], value=yt, mask=rows)


@nki.jit
def dropout_fwd_kernel(x, seed, dropout_p=0.1):
  """y = dropout(x) / (1 - p); seed: int32 [1]."""
  out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
  _dropout_rows(x, out, seed, dropout_p)
  return out


@nki.jit
def dropout_bwd_kernel(dy, seed, dropout_p=0.1):
  """dx = dropout(dy) / (1 - p) with the forward's seeds: the same mask regenerated."""
  dx = nl.ndarray(dy.shape, dtype=dy.dtype, buffer=nl.shared_hbm)
  _dropout_rows(dy, dx, seed, dropout_p)
  return dx


@nki.jit
def dropout_mask_fwd_kernel(x, seed, dropout_p=0.1):
  """(y, mask): keep = nl.rand() >= p, y = x * keep / (1 - p); mask uint8 for the backward."""
  N, D = x.shape
  out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
  mask_out = nl.ndarray(x.shape, dtype=nl.uint8, buffer=nl.shared_hbm)
  i_p = nl.arange(PMAX)[:, None]
  i_f = nl.arange(D)[None, :]
  seed_tile = nl.load(seed[0])
  nl.random_seed(seed=seed_tile)
  for t in nl.sequential_range((N + PMAX - 1) // PMAX):
    rows = (t * PMAX + i_p < N)
    xt = nl.load(x[t * PMAX + i_p, i_f], mask=rows)
    u = nl.rand((PMAX, D), dtype=x.dtype)
    keep = nl.greater_equal(u, dropout_p, dtype=nl.float32)
    yt = nl.multiply(xt, keep, mask=rows)
    yt = nl.multiply(yt, 1 / (1 - dropout_p), mask=rows, dtype=x.dtype)
    nl.store(out[t * PMAX + i_p, i_f], value=yt, mask=rows)
    nl.store(mask_out[t * PMAX + i_p, i_f], value=keep, mask=rows)
  return out, mask_out


@nki.jit
def dropout_mask_bwd_kernel(dy, mask, dropout_p=0.1):
  """dx = dy * mask / (1 - p) with the forward's stored uint8 mask."""
  N, D = dy.shape
  dx = nl.ndarray(dy.shape, dtype=dy.dtype, buffer=nl.shared_hbm)
  i_p = nl.arange(PMAX)[:, None]
  i_f = nl.arange(D)[None, :]
  for t in nl.affine_range((N + PMAX - 1) // PMAX):
    rows = (t * PMAX + i_p < N)
    g = nl.load(dy[t * PMAX + i_p, i_f], mask=rows)
    m = nl.load(mask[t * PMAX + i_p, i_f], mask=rows)
    d = nl.multiply(g, m, mask=rows, dtype=nl.float32)
    nl.store(dx[t * PMAX + i_p, i_f], value=nl.multiply(d, 1 / (1 - dropout_p), mask=rows), mask=rows)
  return dx


# ------------------------------------------------------------------------------------------------
# Gradient clipping by global norm
# ------------------------------------------------------------------------------------------------

def _as_2d(t):
  """A gradient as [rows, cols]: 1-D ones (biases) folded onto the partitions."""
  if len(t.shape) == 1:
    assert t.shape[0] % PMAX == 0
    return t.reshape((PMAX, t.shape[0] // PMAX))
  return t


def _sum_squares(g, acc, k):
  """acc[:, k] += per-partition sum of g ** 2 over all of g's tiles."""
  R, C = g.shape
  i_p = nl.arange(PMAX)[:, None]
  for r in nl.sequential_range((R + PMAX - 1) // PMAX):
    for c in nl.sequential_range((C + FT - 1) // FT):
      i_f = nl.arange(FT)[None, :]
      valid = (r * PMAX + i_p < R) & (c * FT + i_f < C)
      t = nl.load(g[r * PMAX + i_p, c * FT + i_f], mask=valid)
      part = nl.ndarray((PMAX, 1), dtype=nl.float32)
      part[...] = nl.zeros((PMAX, 1), dtype=nl.float32)
      sq = nisa.activation_reduce(op=nl.square, data=t, reduce_op=nl.add, reduce_res=part, mask=valid,
                                  dtype=nl.float32)
      acc[:, k] = nl.add(acc[:, k], part)


def _scale_into(g, out, scale):
  R, C = g.shape
  i_p = nl.arange(PMAX)[:, None]
  for r in nl.affine_range((R + PMAX - 1) // PMAX):
    for c in nl.affine_range((C + FT - 1) // FT):
      i_f = nl.arange(FT)[None, :]
      valid = (r * PMAX + i_p < R) & (c * FT + i_f < C)
      t = nl.load(g[r * PMAX + i_p, c * FT + i_f], mask=valid)
      s = nisa.tensor_scalar(data=t, op0=nl.multiply, operand0=scale, mask=valid, dtype=g.dtype)
      nl.store(out[r * PMAX + i_p, c * FT + i_f], value=s, mask=valid)


def _clip_scale(sq_tot, max_norm, norms_out):
  """sq_tot [P, 4] fp32 (per-tensor sums of squares, column 3 their total) on every partition: store the norms
  and return min(1, max_norm / (total_norm + 1e-6)) as a [P, 1] fp32 tile."""
  norms = nl.sqrt(sq_tot, dtype=nl.float32)
  i_0 = nl.arange(1)[:, None]
  i_4 = nl.arange(4)[None, :]
  nl.store(norms_out[i_0, i_4], value=norms[i_0, i_4])
  denom = nl.add(norms[:, 3], 1e-6)
  clip = nl.multiply(nl.reciprocal(denom), max_norm)
  return nl.minimum(clip, 1.0)


@nki.jit
def clip_grad_norm_kernel(g0, g1, g2, max_norm=1.0):
  """(g0', g1', g2', norms [1, 4]): grads scaled by min(1, max_norm / (||(g0, g1, g2)|| + 1e-6))."""
  outs = [nl.ndarray(g.shape, dtype=g.dtype, buffer=nl.shared_hbm) for g in (g0, g1, g2)]
  norms_out = nl.ndarray((1, 4), dtype=nl.float32, buffer=nl.shared_hbm)
  grads = [_as_2d(g) for g in (g0, g1, g2)]
  views = [_as_2d(o) for o in outs]

  # pass 1: per-partition sums of squares, one column per tensor
  acc = nl.zeros((PMAX, 4), dtype=nl.float32)
  for k in nl.static_range(3):
    _sum_squares(grads[k], acc, k)
  acc[:, 3] = nl.sum(acc[:, 0:3], axis=[1])
  # all-reduce over the partitions: ones^T @ acc puts the column totals on every partition
  ones = nl.full((PMAX, PMAX), 1.0, dtype=nl.float32)
  tot_psum = nisa.nc_matmul(ones, acc)
  tot = nl.copy(tot_psum, dtype=nl.float32)
  scale = _clip_scale(tot, max_norm, norms_out)

  # pass 2
  for k in nl.static_range(3):
    _scale_into(grads[k], views[k], scale)
  return outs[0], outs[1], outs[2], norms_out


@nki.jit
def clip_grad_norm_pr_kernel(g0, g1, g2, max_norm=1.0):
  """clip_grad_norm_kernel with the partition sum on GpSimd (tensor_partition_reduce) and the clip factor
  broadcast back to the partitions."""
  outs = [nl.ndarray(g.shape, dtype=g.dtype, buffer=nl.shared_hbm) for g in (g0, g1, g2)]
  norms_out = nl.ndarray((1, 4), dtype=nl.float32, buffer=nl.shared_hbm)
  grads = [_as_2d(g) for g in (g0, g1, g2)]
  views = [_as_2d(o) for o in outs]

  acc = nl.zeros((PMAX, 4), dtype=nl.float32)
  for k in nl.static_range(3):
    _sum_squares(grads[k], acc, k)
  acc[:, 3] = nl.sum(acc[:, 0:3], axis=[1])
  tot = nisa.tensor_partition_reduce(np.add, acc)          # [1, 4]
  scale1 = _clip_scale(tot, max_norm, norms_out)           # [1, 1]
  scale = nl.broadcast_to(scale1, shape=(PMAX, 1))

  for k in nl.static_range(3):
    _scale_into(grads[k], views[k], scale)
  return outs[0], outs[1], outs[2], norms_out


@nki.jit
def clip_grad_norm_nl_kernel(g, max_norm=1.0):
  """One gradient clipped by its norm, written with nl operators: ``acc += nl.sum(nl.square(t), axis=1,
  keepdims=True, mask=...)`` per row tile, ``nl.matmul(ones, acc, transpose_x=True)`` for the partition sum,
  ``max_norm / (norm + 1e-6)`` as tile arithmetic. Returns (g', [norm, scale] [1, 2])."""
  R, C = g.shape
  out = nl.ndarray((R, C), dtype=g.dtype, buffer=nl.shared_hbm)
  stats = nl.ndarray((1, 2), dtype=nl.float32, buffer=nl.shared_hbm)
  i_p = nl.arange(PMAX)[:, None]
  i_f = nl.arange(C)[None, :]
  acc = nl.zeros((PMAX, 1), dtype=nl.float32)
  for r in nl.sequential_range((R + PMAX - 1) // PMAX):
    rows = (r * PMAX + i_p < R)
    t = nl.load(g[r * PMAX + i_p, i_f], mask=rows)
    sq = nl.square(t, mask=rows, dtype=nl.float32)
    acc += nl.sum(sq, axis=1, keepdims=True, mask=rows)
  ones = nl.ones((PMAX, PMAX), dtype=nl.float32)
  norm = nl.sqrt(nl.matmul(ones, acc, transpose_x=True))
  scale = nl.minimum(max_norm / (norm + 1e-6), 1.0)
  res = nl.ndarray((1, 2), dtype=nl.float32)
  res[0, 0] = norm[0, 0]
  res[0, 1] = scale[0, 0]
  nl.store(stats, value=res)
  for r in nl.affine_range((R + PMAX - 1) // PMAX):
    rows = (r * PMAX + i_p < R)
    t = nl.load(g[r * PMAX + i_p, i_f], mask=rows)
    nl.store(out[r * PMAX + i_p, i_f], value=nl.multiply(t, scale, mask=rows), mask=rows)
  return out, stats


@nki.jit
def dropout_isa_kernel(x, seed, dropout_p=0.1):
  """``nisa.dropout`` with a (P, 1) probability tile (as the flash-attention samples pass it) under the ragged
  row mask; no rescaling."""
  N, D = x.shape
  out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
  p_tile = nl.full((PMAX, 1), fill_value=dropout_p, dtype=np.float32)
  i_p = nl.arange(PMAX)[:, None]
  i_f = nl.arange(D)[None, :]
  nl.random_seed(seed=nl.load(seed[0]))
  for t in nl.sequential_range((N + PMAX - 1) // PMAX):
    rows = (t * PMAX + i_p < N)
    xt = nl.load(x[t * PMAX + i_p, i_f], mask=rows)
    y = nisa.dropout(xt, prob=p_tile, mask=rows)
    nl.store(out[t * PMAX + i_p, i_f], value=y, mask=rows)
  return out


# ------------------------------------------------------------------------------------------------
# Fused bias + GELU
# ------------------------------------------------------------------------------------------------

GELU_K = math.sqrt(2.0 / math.pi)
GELU_C = 0.044715


def _bias_tile(bias, t, D):
  i_p = nl.arange(PMAX)[:, None]
  i_0 = nl.arange(1)[None, :]
  b2 = bias.reshape((D, 1))
  return nl.load(b2[t * PMAX + i_p, i_0], mask=(t * PMAX + i_p < D))


@nki.jit
def bias_gelu_fwd_kernel(x, bias, approximate=True):
  """y = gelu(x + bias[:, None]); x [D, N] (features on the partitions), bias [D]."""
  D, N = x.shape
  y = nl.ndarray((D, N), dtype=x.dtype, buffer=nl.shared_hbm)
  act = nl.gelu_apprx_tanh if approximate else nl.gelu
  i_p = nl.arange(PMAX)[:, None]
  for t in nl.affine_range((D + PMAX - 1) // PMAX):
    b = _bias_tile(bias, t, D)
    for c in nl.affine_range((N + FT - 1) // FT):
      i_f = nl.arange(FT)[None, :]
      valid = (t * PMAX + i_p < D) & (c * FT + i_f < N)
      xt = nl.load(x[t * PMAX + i_p, c * FT + i_f], mask=valid)
      yt = nisa.activation(op=act, data=xt, bias=b, mask=valid, dtype=x.dtype)
      nl.store(y[t * PMAX + i_p, c * FT + i_f], value=yt, mask=valid)
  return y


@nki.jit
def bias_add_kernel(x, bias):
  """z = x + bias[:, None] (the unfused first half)."""
  D, N = x.shape
  z = nl.ndarray((D, N), dtype=x.dtype, buffer=nl.shared_hbm)
  i_p = nl.arange(PMAX)[:, None]
  for t in nl.affine_range((D + PMAX - 1) // PMAX):
    b = _bias_tile(bias, t, D)
    for c in nl.affine_range((N + FT - 1) // FT):
      i_f = nl.arange(FT)[None, :]
      valid = (t * PMAX + i_p < D) & (c * FT + i_f < N)
      xt = nl.load(x[t * PMAX + i_p, c * FT + i_f], mask=valid)
      nl.store(z[t * PMAX + i_p, c * FT + i_f], value=nl.add(xt, b, mask=valid), mask=valid)
  return z


@nki.jit
def gelu_kernel(z, approximate=True):
  """y = gelu(z) (the unfused second half)."""
  D, N = z.shape
  y = nl.ndarray((D, N), dtype=z.dtype, buffer=nl.shared_hbm)
  i_p = nl.arange(PMAX)[:, None]
  for t in nl.affine_range((D + PMAX - 1) // PMAX):
    for c in nl.affine_range((N + FT - 1) // FT):
      i_f = nl.arange(FT)[None, :]
      valid = (t * PMAX + i_p < D) & (c * FT + i_f < N)
      zt = nl.load(z[t * PMAX + i_p, c * FT + i_f], mask=valid)
      yt = nl.gelu_apprx_tanh(zt, mask=valid) if approximate else nl.gelu(zt, mask=valid)
      nl.store(y[t * PMAX + i_p, c * FT + i_f], value=yt, mask=valid)
  return y


@nki.jit
def bias_gelu_bwd_kernel(x, bias, dy, approximate=True):
  """(dx [D, N] in x.dtype, dbias [D] fp32): dx = dy * gelu'(x + bias), dbias = dx summed over N."""
  D, N = x.shape
  dx = nl.ndarray((D, N), dtype=x.dtype, buffer=nl.shared_hbm)
  dbias = nl.ndarray((D,), dtype=nl.float32, buffer=nl.shared_hbm)
  db2 = dbias.reshape((D, 1))
  i_p = nl.arange(PMAX)[:, None]
  i_0 = nl.arange(1)[None, :]
  for t in nl.affine_range((D + PMAX - 1) // PMAX):
    b = _bias_tile(bias, t, D)
    db = nl.zeros((PMAX, 1), dtype=nl.float32)
    for c in nl.sequential_range((N + FT - 1) // FT):
      i_f = nl.arange(FT)[None, :]
      valid = (t * PMAX + i_p < D) & (c * FT + i_f < N)
      xt = nl.load(x[t * PMAX + i_p, c * FT + i_f], mask=valid)
      g = nl.load(dy[t * PMAX + i_p, c * FT + i_f], mask=valid)
      if approximate:
        # gelu'(z) = 0.5 (1 + th) + 0.5 z (1 - th^2) k (1 + 3 c z^2), th = tanh(k z (1 + c z^2))
        z = nisa.activation(op=nl.copy, data=xt, bias=b, mask=valid, dtype=nl.float32)
        z2 = nl.multiply(z, z, mask=valid)
        inner = nl.multiply(z, nl.add(nl.multiply(z2, GELU_C, mask=valid), 1.0, mask=valid), mask=valid)
        th = nisa.activation(op=nl.tanh, data=inner, scale=GELU_K, mask=valid, dtype=nl.float32)
        sech2 = nl.subtract(1.0, nl.multiply(th, th, mask=valid), mask=valid)
        poly = nl.add(nl.multiply(z2, 3 * GELU_C * GELU_K, mask=valid), GELU_K, mask=valid)
        right = nl.multiply(nl.multiply(z, sech2, mask=valid), poly, mask=valid)
        dgelu = nl.multiply(nl.add(nl.add(th, 1.0, mask=valid), right, mask=valid), 0.5, mask=valid)
      else:
        dgelu = nisa.activation(op=nl.gelu_dx, data=xt, bias=b, mask=valid, dtype=nl.float32)
      d = nl.multiply(g, dgelu, mask=valid, dtype=nl.float32)
      nl.store(dx[t * PMAX + i_p, c * FT + i_f], value=d, mask=valid)
      part = nisa.tensor_reduce(np.add, d, axis=[1], mask=valid, dtype=nl.float32)
      db[...] = nl.add(db, part, mask=(t * PMAX + i_p < D))
    nl.store(db2[t * PMAX + i_p, i_0], value=db, mask=(t * PMAX + i_p < D))
  return dx, dbias
