"""Mixed-precision training utilities in the Beta-1 dialect (``neuronxcc.nki``): dynamic loss scaling with
non-finite handling, written the way public NKI kernels write them (arange index expressions, value-returning
``nl``/``nisa`` calls, ``nl.where`` selects, a ones-matmul for reductions / broadcasts over the partitions):

- ``unscale_check_update(g1, g2, state, growth_interval, backoff, growth)``: the GradScaler step. ``state`` is a
  small fp32 HBM tensor [1, 2] = (scale, growth_tracker). Every gradient tile (bf16/fp16, two tensors of 2-3 row
  tiles of 128) is unscaled by 1 / scale (fp32 out) and tested for inf/NaN by ``|g| <= FLT_MAX`` (false for inf
  and for NaN: a NaN compares false), the "bad" flag max-reduced along the free axis, summed into one per-partition
  count across all tiles and then over the partitions by a ones matmul (the count lands on every partition).
  found_inf = min(count, 1). The scale update is branch free: tracker' = (tracker + 1) * (1 - found_inf),
  grow = tracker' >= growth_interval, scale' = scale * (found_inf ? backoff : (grow ? growth : 1)),
  tracker' = tracker' * (1 - grow). Outputs: the unscaled grads (fp32), found_inf [1, 1] and the new state [1, 2].
- ``sgd_step_if_finite(param, grad, found_inf, lr)``: a plain SGD step p - lr * g on fp32 master weights, skipped
  (the old weights kept bit for bit) when found_inf is set: the flag is broadcast to the partitions by a
  [1, 128] ones matmul and the update selected with ``nl.where`` (so inf/NaN in the skipped update never reach
  the weights). ``sgd_step_if_finite_predicated``: the same select by ``nisa.tensor_copy_predicated`` with a uint8
  predicate tile.
- ``found_inf_transpose(grads)``: the same flag by the x - x test (NaN for inf / NaN), reduced over the
  partitions by ``nl.transpose`` of the [128, 1] flag and a max-reduce instead of a ones matmul.

Written for nsim's tests in the style of those kernels; not copies of any file. No nsim imports.
"""
import numpy as np

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl

PMAX = 128
FLT_MAX = 3.4028234663852886e38


def _bcast_row(row, n, ones_row):
  """A [1, n] fp32 SBUF row broadcast to all 128 partitions (a K = 1 matmul with a ones row), as an SBUF tile."""
  ps = nl.ndarray((PMAX, n), dtype=nl.float32, buffer=nl.psum)
  ps[...] = nisa.nc_matmul(ones_row, row)
  return nl.copy(ps, dtype=nl.float32)


@nki.jit
def unscale_check_update(g1, g2, state, growth_interval=3, backoff=0.5, growth=2.0):
  N1, F = g1.shape
  N2, F2 = g2.shape
  assert F == F2 and N1 % PMAX == 0 and N2 % PMAX == 0
  u1 = nl.ndarray((N1, F), dtype=nl.float32, buffer=nl.shared_hbm)
  u2 = nl.ndarray((N2, F), dtype=nl.float32, buffer=nl.shared_hbm)
  found_inf = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.shared_hbm)
  new_state = nl.ndarray((1, 2), dtype=nl.float32, buffer=nl.shared_hbm)

  i_p = nl.arange(PMAX)[:, None]
  i_f = nl.arange(F)[None, :]
  i_s = nl.arange(2)[None, :]
  i_0 = nl.arange(1)[:, None]

  st = nl.load(state[i_0, i_s])
  ones_row = nl.ones((1, PMAX), dtype=nl.float32)
  st_all = _bcast_row(st, 2, ones_row)
  inv_scale = nl.reciprocal(st_all[i_p, 0])  # [128, 1]

  bad = nl.zeros((PMAX, 1), dtype=nl.float32)
  for g, u, N in ((g1, u1, N1), (g2, u2, N2)):
    for t in nl.affine_range(N // PMAX):
      x = nl.load(g[t * PMAX + i_p, i_f], dtype=nl.float32)
      nl.store(u[t * PMAX + i_p, i_f], value=nl.multiply(x, inv_scale))
      ok = nl.less_equal(nl.abs(x), FLT_MAX, dtype=nl.float32)
      notok = nl.subtract(1.0, ok)
      bad[...] = nl.add(bad, nl.max(notok, axis=[1], keepdims=True))

  # over the partitions: every partition gets the total count
  ones = nl.ones((PMAX, PMAX), dtype=nl.float32)
  tot_ps = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.psum)
  tot_ps[...] = nisa.nc_matmul(ones, bad)
  inf_flag = nl.minimum(tot_ps, 1.0)
  nl.store(found_inf[i_0, nl.arange(1)[None, :]], value=inf_flag[i_0, nl.arange(1)[None, :]])

  fi = inf_flag[i_0, 0]                # [1, 1]
  scale = st[i_0, 0]
  tracker = st[i_0, 1]
  ok = nl.subtract(1.0, fi)
  t1 = nl.multiply(nl.add(tracker, 1.0), ok)
  grow = nl.greater_equal(t1, float(growth_interval), dtype=nl.float32)
  factor_ok = nl.add(nl.multiply(grow, growth - 1.0), 1.0)
  factor = nl.add(nl.multiply(fi, backoff), nl.multiply(ok, factor_ok))
  new_st = nl.ndarray((1, 2), dtype=nl.float32)
  new_st[i_0, 0] = nl.multiply(scale, factor)
  new_st[i_0, 1] = nl.multiply(t1, nl.subtract(1.0, grow))
  nl.store(new_state[i_0, i_s], value=new_st)
  return u1, u2, found_inf, new_state


@nki.jit
def sgd_step_if_finite(param, grad, found_inf, lr=0.1):
  N, F = param.shape
  assert N % PMAX == 0
  out = nl.ndarray((N, F), dtype=param.dtype, buffer=nl.shared_hbm)
  i_p = nl.arange(PMAX)[:, None]
  i_f = nl.arange(F)[None, :]
  i_0 = nl.arange(1)[:, None]
  i_1 = nl.arange(1)[None, :]

  flag = nl.load(found_inf[i_0, i_1])
  ones_row = nl.ones((1, PMAX), dtype=nl.float32)
  flag_all = _bcast_row(flag, 1, ones_row)          # [128, 1]
  finite = nl.equal(flag_all, 0.0)                  # [128, 1] bool
  for t in nl.affine_range(N // PMAX):
    p = nl.load(param[t * PMAX + i_p, i_f])
    g = nl.load(grad[t * PMAX + i_p, i_f], dtype=nl.float32)
    upd = nl.subtract(p, nl.multiply(g, lr))
    keep = nl.where(finite.broadcast_to((PMAX, F)), upd, p)
    nl.store(out[t * PMAX + i_p, i_f], value=keep)
  return out


@nki.jit
def found_inf_transpose(grads):
  """found_inf of one gradient tensor [N, F] by the x - x test (0 for finite values, NaN for inf / NaN, so
  ``not_equal(x - x, 0)`` is the bad flag), max-reduced along the free axis and across the tiles, then over the
  partitions by a PE transpose of the [128, 1] flag to [1, 128] and a second max-reduce. Output [1, 1] fp32."""
  N, F = grads.shape
  assert N % PMAX == 0
  found_inf = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.shared_hbm)
  i_p = nl.arange(PMAX)[:, None]
  i_f = nl.arange(F)[None, :]
  bad = nl.zeros((PMAX, 1), dtype=nl.float32)
  for t in nl.affine_range(N // PMAX):
    x = nl.load(grads[t * PMAX + i_p, i_f])
    d = nl.subtract(x, x, dtype=nl.float32)
    flag = nl.not_equal(d, 0.0, dtype=nl.float32)
    bad[...] = nl.maximum(bad, nl.max(flag, axis=[1], keepdims=True))
  bad_t = nl.transpose(bad)                   # [1, 128] in PSUM
  nl.store(found_inf, value=nl.max(bad_t, axis=[1], keepdims=True))
  return found_inf


@nki.jit
def sgd_step_if_finite_predicated(param, grad, found_inf, lr=0.1):
  """``sgd_step_if_finite`` with the select done by ``nisa.tensor_copy_predicated``: the update is copied over the
  loaded weights only where the (uint8) finite predicate is set."""
  N, F = param.shape
  assert N % PMAX == 0
  out = nl.ndarray((N, F), dtype=param.dtype, buffer=nl.shared_hbm)
  i_p = nl.arange(PMAX)[:, None]
  i_f = nl.arange(F)[None, :]
  i_0 = nl.arange(1)[:, None]
  i_1 = nl.arange(1)[None, :]

  flag = nl.load(found_inf[i_0, i_1])
  ones_row = nl.ones((1, PMAX), dtype=nl.float32)
  flag_all = _bcast_row(flag, 1, ones_row)
  zeros = nl.zeros((PMAX, F), dtype=nl.float32)
  pred = nl.equal(nl.add(zeros, flag_all), 0.0, dtype=nl.uint8)   # [128, F]
  for t in nl.affine_range(N // PMAX):
    p = nl.load(param[t * PMAX + i_p, i_f])
    g = nl.load(grad[t * PMAX + i_p, i_f], dtype=nl.float32)
    upd = nl.subtract(p, nl.multiply(g, lr))
    nisa.tensor_copy_predicated(src=upd, dst=p, predicate=pred)
    nl.store(out[t * PMAX + i_p, i_f], value=p)
  return out
