"""LNC=2 work splits in the Beta-1 dialect (``neuronxcc.nki``), the way public Beta-1 kernels are launched on a trn2
logical core: ``kernel[nl.nc(2)](...)`` runs one instance per physical core, ``nl.program_id(0)`` picks the share
(a plain ``kernel[1]`` grid runs the same kernel on one core):

- ``ragged_rmsnorm(a, g)``: RMSNorm of rows a [N, D] with weight g [1, D], N not a multiple of 256: the row tiles
  are dealt in two contiguous blocks (300 rows: program 0 gets rows 0..255, program 1 rows 256..299), the ragged
  last tile handled by ``mask=`` on the loads, the math and the store (the RMSNorm tutorial's masks).
- ``split_m_matmul(aT, b)``: out [M, N] fp32 = aT.T @ b, aT [K, M], b [K, N]: the M tiles split over the
  programs (no reduction needed), K accumulated in PSUM with ``res_psum += nisa.nc_matmul(...)``.

Written for nsim's tests in the style of those kernels; not copies of any file. No nsim imports.
"""
import math

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl


@nki.jit
def ragged_rmsnorm(a_tensor, g_tensor):
  out_tensor = nl.ndarray(a_tensor.shape, dtype=a_tensor.dtype, buffer=nl.shared_hbm)
  num_rows, D = a_tensor.shape
  n_prg = nl.num_programs(axes=0)
  pid = nl.program_id(axis=0)
  n_tiles = math.ceil(num_rows / 128)
  per_prg = math.ceil(n_tiles / n_prg)
  t_lo = pid * per_prg
  t_hi = min(n_tiles, t_lo + per_prg)

  ix = nl.arange(128)[:, None]
  iw = nl.arange(1)[:, None]
  iy = nl.arange(D)[None, :]
  g_tile = nl.load(g_tensor[iw, iy])
  g_bcast = g_tile.broadcast_to((128, D))

  for t in nl.affine_range(t_hi - t_lo):
    r0 = (t_lo + t) * 128
    valid = r0 + ix < num_rows
    a_tile = nl.load(a_tensor[r0 + ix, iy], mask=valid)
    square_sum = nl.sum(nl.square(a_tile, mask=valid), axis=[1], mask=valid)
    rms_reciprocal = nl.rsqrt(square_sum / D, mask=valid)
    out_tile = nl.multiply(a_tile, rms_reciprocal, mask=valid)
    out_tile[...] = nl.multiply(out_tile, g_bcast, mask=valid)
    nl.store(out_tensor[r0 + ix, iy], value=out_tile, mask=valid)
  return out_tensor


@nki.jit
def split_m_matmul(aT, b):
  K, M = aT.shape
  _, N = b.shape
  out = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.shared_hbm)
  n_prg = nl.num_programs(axes=0)
  pid = nl.program_id(axis=0)
  MT = M // 128 // n_prg
  KT = K // 128
  i_k = nl.arange(128)[:, None]
  i_m = nl.arange(128)[None, :]
  i_n = nl.arange(N)[None, :]
  for m in nl.affine_range(MT):
    m0 = (pid * MT + m) * 128
    res_psum = nl.zeros((128, N), nl.float32, buffer=nl.psum)
    for k in nl.affine_range(KT):
      a_tile = nl.load(aT[k * 128 + i_k, m0 + i_m])
      b_tile = nl.load(b[k * 128 + i_k, i_n])
      res_psum += nisa.nc_matmul(a_tile, b_tile)
    res_sb = nl.copy(res_psum, dtype=nl.float32)
    nl.store(out[m0 + nl.arange(128)[:, None], i_n], value=res_sb)
  return out
