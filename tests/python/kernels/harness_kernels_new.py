"""Small kernels in the new NKI dialect (``import nki``, ISA calls writing ``dst=``) and the driver code public
scripts put around them (``nki.simulate(kernel)(...)``, ``kernel[2](...)`` LNC launches, numpy
pre/post-processing in a plain Python wrapper):

- ``add_kernel(a, b)``: [N, F] tiles of 128 rows shared out between the programs of the launch
  (``nl.program_id(0)`` / ``nl.num_programs(0)``); ``add_kernel[2](a, b)`` runs under LNC=2.
- ``softmax_kernel(x)``: rows on the partitions, ``tensor_reduce`` max, ``activation_reduce`` exp with the negated max
  as bias and the row sum as ``reduce_res``, ``reciprocal``, ``tensor_scalar`` scale; ragged last tile by views.
- ``matmul_kernel(lhsT, rhs)``: tiling from ``nl.tile_size`` (``pmax``, ``gemm_stationary_fmax``,
  ``gemm_moving_fmax``), PSUM accumulation by ``nc_matmul`` into ``dst=``.
- ``transpose_add_kernel(x, y)``: returns ``(x^T, x + y)`` (a tuple) — ``nc_transpose`` via PSUM.
- ``softmax_helper_kernel(x)``: the same softmax with its tile body in a helper sub-kernel (an ``@nki.jit``
  function called from inside the kernel) and a plain Python helper.
- host driver ``softmax_last_axis(x)``: flattens leading axes, casts to float32, calls the kernel through
  ``nki.simulate``, reshapes back.

Written for nsim's tests in the style of those scripts; not copies of any file. No nsim imports.
"""
import numpy as np

import nki
import nki.isa as nisa
import nki.language as nl


@nki.jit
def add_kernel(a, b):
  N, F = a.shape
  out = nl.ndarray((N, F), dtype=a.dtype, buffer=nl.shared_hbm)
  P = nl.tile_size.pmax
  n_tiles = N // P
  per_prog = n_tiles // nl.num_programs(0)
  first = nl.program_id(0) * per_prog
  for i in nl.affine_range(per_prog):
    r0 = (first + i) * P
    at = nl.ndarray((P, F), dtype=a.dtype, buffer=nl.sbuf)
    bt = nl.ndarray((P, F), dtype=b.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=at, src=a[r0:r0 + P, 0:F])
    nisa.dma_copy(dst=bt, src=b[r0:r0 + P, 0:F])
    ct = nl.ndarray((P, F), dtype=a.dtype, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=ct, data1=at, data2=bt, op=nl.add)
    nisa.dma_copy(dst=out[r0:r0 + P, 0:F], src=ct)
  return out


def _softmax_tile(x_tile, y_tile, p, F):
  """softmax of the first p rows of x_tile [128, F] (fp32) into y_tile."""
  mx = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_reduce(dst=mx[0:p], op=nl.maximum, data=x_tile[0:p], axis=1, negate=True, keepdims=True)
  ex = nl.ndarray((128, F), dtype=nl.float32, buffer=nl.sbuf)
  ssum = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.activation_reduce(dst=ex[0:p], op=nl.exp, data=x_tile[0:p], bias=mx[0:p], reduce_op=nl.add,
                         reduce_res=ssum[0:p])
  rs = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.reciprocal(dst=rs[0:p], data=ssum[0:p])
  nisa.tensor_scalar(dst=y_tile[0:p], data=ex[0:p], op0=nl.multiply, operand0=rs[0:p])


@nki.jit
def softmax_kernel(x):
  N, F = x.shape
  out = nl.ndarray((N, F), dtype=x.dtype, buffer=nl.shared_hbm)
  P = nl.tile_size.pmax
  for i in nl.affine_range((N + P - 1) // P):
    p = min(P, N - i * P)
    xt = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=xt[0:p], src=x[i * P:i * P + p, 0:F])
    yt = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.sbuf)
    _softmax_tile(xt, yt, p, F)
    nisa.dma_copy(dst=out[i * P:i * P + p, 0:F], src=yt[0:p])
  return out


@nki.jit
def _softmax_sub(xt, yt, p, F):
  _softmax_tile(xt, yt, p, F)


@nki.jit
def softmax_helper_kernel(x):
  N, F = x.shape
  assert N <= nl.tile_size.pmax
  out = nl.ndarray((N, F), dtype=x.dtype, buffer=nl.shared_hbm)
  xt = nl.ndarray((128, F), dtype=nl.float32, buffer=nl.sbuf)
  nisa.dma_copy(dst=xt[0:N], src=x)
  yt = nl.ndarray((128, F), dtype=x.dtype, buffer=nl.sbuf)
  _softmax_sub(xt, yt, N, F)
  nisa.dma_copy(dst=out, src=yt[0:N])
  return out


@nki.jit
def matmul_kernel(lhsT, rhs):
  K, M = lhsT.shape
  K_, N = rhs.shape
  assert K == K_
  TILE_M = nl.tile_size.gemm_stationary_fmax
  TILE_K = nl.tile_size.pmax
  TILE_N = nl.tile_size.gemm_moving_fmax
  result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
  for m in nl.affine_range(M // TILE_M):
    for n in nl.affine_range(N // TILE_N):
      acc = nl.ndarray((TILE_M, TILE_N), dtype=nl.float32, buffer=nl.psum)
      for k in nl.affine_range(K // TILE_K):
        lt = nl.ndarray((TILE_K, TILE_M), dtype=lhsT.dtype, buffer=nl.sbuf)
        rt = nl.ndarray((TILE_K, TILE_N), dtype=rhs.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=lt, src=lhsT[k * TILE_K:(k + 1) * TILE_K, m * TILE_M:(m + 1) * TILE_M])
        nisa.dma_copy(dst=rt, src=rhs[k * TILE_K:(k + 1) * TILE_K, n * TILE_N:(n + 1) * TILE_N])
        nisa.nc_matmul(dst=acc, stationary=lt, moving=rt)
      res = nl.ndarray((TILE_M, TILE_N), dtype=result.dtype, buffer=nl.sbuf)
      nisa.tensor_copy(dst=res, src=acc)
      nisa.dma_copy(dst=result[m * TILE_M:(m + 1) * TILE_M, n * TILE_N:(n + 1) * TILE_N], src=res)
  return result


@nki.jit
def transpose_add_kernel(x, y):
  P, F = x.shape
  xT_out = nl.ndarray((F, P), dtype=x.dtype, buffer=nl.shared_hbm)
  sum_out = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.shared_hbm)
  xt = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.sbuf)
  yt = nl.ndarray((P, F), dtype=y.dtype, buffer=nl.sbuf)
  nisa.dma_copy(dst=xt, src=x)
  nisa.dma_copy(dst=yt, src=y)
  tp = nl.ndarray((F, P), dtype=nl.float32, buffer=nl.psum)
  nisa.nc_transpose(dst=tp, data=xt)
  ts = nl.ndarray((F, P), dtype=x.dtype, buffer=nl.sbuf)
  nisa.tensor_copy(dst=ts, src=tp)
  nisa.dma_copy(dst=xT_out, src=ts)
  st = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.sbuf)
  nisa.tensor_tensor(dst=st, data1=xt, data2=yt, op=nl.add)
  nisa.dma_copy(dst=sum_out, src=st)
  return xT_out, sum_out


def softmax_last_axis(x):
  """softmax over the last axis of an array of any rank, through ``nki.simulate``."""
  shape = x.shape
  x2 = np.ascontiguousarray(x.reshape(-1, shape[-1]), dtype=np.float32)
  return nki.simulate(softmax_kernel)(x2).reshape(shape)
