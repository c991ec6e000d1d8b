"""Small kernels in the Beta-1 dialect (``neuronxcc.nki``) together with the driver code public scripts put around
them (nki-samples tutorials' ``__main__`` blocks, aws-neuron-sdk examples, nki-autotune style benchmark loops):

- ``tensor_add_kernel(a, b)``: ``@nki.jit``, output made in the kernel (``shared_hbm``) and returned; one
  [128, 512] tile per SPMD instance (``nl.program_id(0/1)``), launched as ``kernel[grid](...)``.
- ``add_out_kernel(a, b, c)``: the old tutorial style, output passed in as an argument and written with
  ``nl.store``; undecorated (``nki.simulate_kernel(add_out_kernel, a, b, c)`` updates ``c`` in place).
- ``softmax_kernel(x)``: ``@nki.jit(mode="simulation")``, rows on the partitions, masked last tile.
- ``matmul_kernel(lhsT, rhs)``: tiling from ``nl.tile_size`` (``pmax``, ``gemm_stationary_fmax``,
  ``gemm_moving_fmax``), PSUM ``+=`` accumulation; ``@nki.jit(platform_target="trn2")``.
- ``transpose_kernel(x)``: ``nisa.nc_transpose`` of a [P, F] tile (F <= 128); returns a tuple
  ``(x^T, x)`` (the copy checks tuple returns in order).
- ``add_sub_kernel(a, b)``: returns ``(a + b, a - b)``.
- ``softmax_helper_kernel(x)``: the softmax built from helper sub-kernels (``@nki.trace`` exp-and-sum, a plain
  Python helper for the normalisation) called from inside the kernel.
- host drivers: ``softmax_rows(x)`` (numpy pre/post-processing around ``softmax_kernel``: flatten leading dims,
  cast to float32, reshape back), ``benchmark_matmul(lhsT, rhs, ...)`` (the ``nki.benchmark`` call of the
  nki-samples matmul tutorial, returning the p50/p99 latency) and ``baremetal_add(a, b)``.

Written for nsim's tests in the style of those scripts; not copies of any file. No nsim imports.
"""
import numpy as np

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl
from neuronxcc.nki import baremetal, benchmark


@nki.jit
def tensor_add_kernel(a_input, b_input):
  c_output = nl.ndarray(a_input.shape, dtype=a_input.dtype, buffer=nl.shared_hbm)
  offset_i_x = nl.program_id(0) * 128
  offset_i_y = nl.program_id(1) * 512
  ix = offset_i_x + nl.arange(128)[:, None]
  iy = offset_i_y + nl.arange(512)[None, :]
  a_tile = nl.load(a_input[ix, iy])
  b_tile = nl.load(b_input[ix, iy])
  c_tile = a_tile + b_tile
  nl.store(c_output[ix, iy], value=c_tile)
  return c_output


def add_out_kernel(a_input, b_input, c_output):
  i_p = nl.arange(128)[:, None]
  i_f = nl.arange(a_input.shape[1])[None, :]
  for t in nl.affine_range(a_input.shape[0] // 128):
    a = nl.load(a_input[t * 128 + i_p, i_f])
    b = nl.load(b_input[t * 128 + i_p, i_f])
    nl.store(c_output[t * 128 + i_p, i_f], value=nl.add(a, b))


@nki.jit(mode="simulation")
def softmax_kernel(in_tensor):
  num_rows, num_cols = in_tensor.shape
  out_tensor = nl.ndarray((num_rows, num_cols), dtype=in_tensor.dtype, buffer=nl.shared_hbm)
  pmax = nl.tile_size.pmax
  ix = nl.arange(pmax)[:, None]
  iy = nl.arange(num_cols)[None, :]
  for i in nl.affine_range((num_rows + pmax - 1) // pmax):
    mask = i * pmax + ix < num_rows
    x = nl.load(in_tensor[i * pmax + ix, iy], mask=mask)
    mx = nl.max(x, axis=[1], keepdims=True, mask=mask)
    e = nl.exp(nl.subtract(x, mx, mask=mask), mask=mask)
    s = nl.sum(e, axis=[1], keepdims=True, mask=mask)
    y = nl.multiply(e, nl.reciprocal(s, mask=mask), mask=mask)
    nl.store(out_tensor[i * pmax + ix, iy], value=y, mask=mask)
  return out_tensor


@nki.jit(platform_target="trn2")
def matmul_kernel(lhsT, rhs):
  K, M = lhsT.shape
  K_, N = rhs.shape
  assert K == K_, "lhsT and rhs must have the same contraction dimension"
  TILE_M = nl.tile_size.gemm_stationary_fmax  # 128
  TILE_K = nl.tile_size.pmax  # 128
  TILE_N = nl.tile_size.gemm_moving_fmax  # 512
  assert M % TILE_M == 0 and K % TILE_K == 0 and N % TILE_N == 0
  result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
  for m in nl.affine_range(M // TILE_M):
    for n in nl.affine_range(N // TILE_N):
      res_psum = nl.zeros((TILE_M, TILE_N), nl.float32, buffer=nl.psum)
      for k in nl.affine_range(K // TILE_K):
        lhsT_tile = nl.load(lhsT[k * TILE_K:(k + 1) * TILE_K, m * TILE_M:(m + 1) * TILE_M])
        rhs_tile = nl.load(rhs[k * TILE_K:(k + 1) * TILE_K, n * TILE_N:(n + 1) * TILE_N])
        res_psum += nl.matmul(lhsT_tile, rhs_tile, transpose_x=True)
      res_sb = nl.copy(res_psum, dtype=result.dtype)
      nl.store(result[m * TILE_M:(m + 1) * TILE_M, n * TILE_N:(n + 1) * TILE_N], value=res_sb)
  return result


@nki.jit
def transpose_kernel(x):
  P, F = x.shape
  out_t = nl.ndarray((F, P), dtype=x.dtype, buffer=nl.shared_hbm)
  out_copy = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.shared_hbm)
  t = nl.load(x)
  tt = nisa.nc_transpose(t)
  nl.store(out_t, value=nl.copy(tt, dtype=x.dtype))
  nl.store(out_copy, value=t)
  return out_t, out_copy


@nki.jit
def add_sub_kernel(a, b):
  s = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
  d = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
  x = nl.load(a)
  y = nl.load(b)
  nl.store(s, value=x + y)
  nl.store(d, value=x - y)
  return s, d


@nki.trace
def _exp_and_sum(x):
  mx = nl.max(x, axis=[1], keepdims=True)
  e = nl.exp(x - mx)
  return e, nl.sum(e, axis=[1], keepdims=True)


def _normalize(e, s):
  return e * nl.reciprocal(s)


@nki.jit
def softmax_helper_kernel(in_tensor):
  out = nl.ndarray(in_tensor.shape, dtype=in_tensor.dtype, buffer=nl.shared_hbm)
  x = nl.load(in_tensor)
  e, s = _exp_and_sum(x)
  nl.store(out, value=_normalize(e, s))
  return out


# ---------------------------------------------------------------------------------------------------
# host-side drivers, as the tutorials' scripts write them
# ---------------------------------------------------------------------------------------------------

def softmax_rows(x):
  """softmax over the last axis of an array of any rank (numpy pre/post-processing around the kernel)."""
  shape = x.shape
  x2 = np.ascontiguousarray(x.reshape(-1, shape[-1]).astype(np.float32))
  out = softmax_kernel(x2)
  return out.reshape(shape)


def benchmark_matmul(lhsT, rhs, warmup=5, iters=10):
  """The nki-samples matmul tutorial's benchmark: returns (p50, p99) latency in us."""
  bench = nki.benchmark(warmup=warmup, iters=iters, save_neff_name="file.neff")(matmul_kernel)
  bench(lhsT, rhs)
  latency_res = bench.benchmark_result.nc_latency
  p50 = latency_res.get_latency_percentile(50)
  p99 = latency_res.get_latency_percentile(99)
  return p50, p99


def baremetal_add(a, b):
  """``nki.baremetal`` around the output-argument kernel; returns c."""
  c = np.zeros_like(a)
  baremetal(add_out_kernel, save_neff_name="add.neff")(a, b, c)
  return c
