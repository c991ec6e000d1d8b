"""Tensor utility ("plumbing") kernels in the Beta-1 dialect (``import neuronxcc.nki as nki``, value-returning
``nl.load`` / ``nl.store``, ``nl.arange`` index expressions and masks, 2-space indentation as in the NKI samples):

- ``concat_partition_kernel(a, b)``: [Na, F] and [Nb, F] loaded into partitions [0, Na) and [Na, Na + Nb) of one
  tile by ``t[Na + i_b, i_f] = nl.load(b)`` (an offset of 40, not a multiple of 32), stored once.
- ``split_free_kernel(x, f0)``: [N, F] (N tiled by 128, ragged last tile masked) split into [N, f0] and
  [N, F - f0] by stores of column windows of one loaded tile.
- ``roll_free_kernel(x, shift)``: circular shift of every row along the free dim by two masked loads whose column
  index expressions wrap (``i_f - shift + F`` and ``i_f - shift``), then one store.
- ``pad_rows_kernel(x, pt, pb)``: [C, H, W] -> [C, H + pt + pb, W]: a zero tile stored to the border rows and
  the input stored to the shifted window ``out[i_c, pt + i_h, i_w]`` (a 3-D index expression).
- ``one_hot_kernel(ids, C)``: ids [N, 1] int32 -> [N, C] fp32 by ``nl.equal(iota(classes), ids_tile)``
  (the (P, 1) ids broadcast along the free dim).
- ``cummax_scan_kernel(x, tile_f)``: running max along the free dim by ``nisa.tensor_tensor_scan`` with
  ``op0=np.add`` on zeros and ``op1=np.maximum``, chained over column chunks by ``initial=``.
- ``transpose_3d_kernel(x)``: [S, H, D] -> [H, D, S] (S, D <= 128) per head by ``nl.load_transpose2d`` of the
  strided [S, D] window (``x[i_s, h, i_d]``) and a store.
- ``local_ids_kernel(ids, starts)``: int32 ids minus per-row shard starts by ``nl.subtract`` of int32 tiles.

Written for nsim's tests; not copies of any file. No nsim imports.
"""
import math

import numpy as np

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl
from neuronxcc.nki.language import par_dim

PMAX = 128


@nki.jit
def concat_partition_kernel(a, b):
  Na, F = a.shape
  Nb, _ = b.shape
  assert Na + Nb <= PMAX
  out = nl.ndarray((Na + Nb, F), dtype=a.dtype, buffer=nl.shared_hbm)
  i_a = nl.arange(Na)[:, None]
  i_b = nl.arange(Nb)[:, None]
  i_f = nl.arange(F)[None, :]
  t = nl.ndarray((par_dim(Na + Nb), F), dtype=a.dtype, buffer=nl.sbuf)
  t[i_a, i_f] = nl.load(a[i_a, i_f])
  t[Na + i_b, i_f] = nl.load(b[i_b, i_f])
  nl.store(out, value=t)
  return out


@nki.jit
def split_free_kernel(x, f0):
  N, F = x.shape
  left = nl.ndarray((N, f0), dtype=x.dtype, buffer=nl.shared_hbm)
  right = nl.ndarray((N, F - f0), dtype=x.dtype, buffer=nl.shared_hbm)
  i_p = nl.arange(PMAX)[:, None]
  i_l = nl.arange(f0)[None, :]
  i_r = nl.arange(F - f0)[None, :]
  i_f = nl.arange(F)[None, :]
  for t in nl.affine_range(math.ceil(N / PMAX)):
    rows = t * PMAX + i_p
    tile = nl.load(x[rows, i_f], mask=(rows < N))
    nl.store(left[rows, i_l], value=tile[i_p, i_l], mask=(rows < N))
    nl.store(right[rows, i_r], value=tile[i_p, f0 + i_r], mask=(rows < N))
  return left, right


@nki.jit
def roll_free_kernel(x, shift):
  N, F = x.shape
  assert N <= PMAX and 0 < shift < F
  out = nl.ndarray((N, F), dtype=x.dtype, buffer=nl.shared_hbm)
  i_p = nl.arange(N)[:, None]
  i_f = nl.arange(F)[None, :]
  t = nl.ndarray((par_dim(N), F), dtype=x.dtype, buffer=nl.sbuf)
  # out[:, j] = x[:, j - shift] (wrapped)
  t[i_p, i_f] = nl.load(x[i_p, i_f - shift + F], mask=(i_f < shift))
  t[i_p, i_f] = nl.load(x[i_p, i_f - shift], mask=(i_f >= shift))
  nl.store(out[i_p, i_f], value=t)
  return out


@nki.jit
def pad_rows_kernel(x, pt, pb):
  C, H, W = x.shape
  assert C <= PMAX
  out = nl.ndarray((C, H + pt + pb, W), dtype=x.dtype, buffer=nl.shared_hbm)
  i_c, i_h, i_w = nl.mgrid[0:C, 0:H, 0:W]
  zeros = nl.zeros((par_dim(C), max(pt, pb), W), dtype=x.dtype)
  if pt > 0:
    i_zc, i_zh, i_zw = nl.mgrid[0:C, 0:pt, 0:W]
    nl.store(out[i_zc, i_zh, i_zw], value=zeros[i_zc, i_zh, i_zw])
  if pb > 0:
    i_zc, i_zh, i_zw = nl.mgrid[0:C, 0:pb, 0:W]
    nl.store(out[i_zc, pt + H + i_zh, i_zw], value=zeros[i_zc, i_zh, i_zw])
  t = nl.load(x[i_c, i_h, i_w])
  nl.store(out[i_c, pt + i_h, i_w], value=t)
  return out


@nki.jit
def one_hot_kernel(ids, C):
  N, _ = ids.shape
  out = nl.ndarray((N, C), dtype=nl.float32, buffer=nl.shared_hbm)
  i_p = nl.arange(PMAX)[:, None]
  i_c = nl.arange(C)[None, :]
  classes = nisa.iota(i_c + 0 * i_p, dtype=nl.int32)
  for t in nl.affine_range(math.ceil(N / PMAX)):
    rows = t * PMAX + i_p
    idt = nl.load(ids[rows, 0], mask=(rows < N))
    oh = nl.equal(classes, idt, dtype=nl.float32, mask=(rows < N))
    nl.store(out[rows, i_c], value=oh, mask=(rows < N))
  return out


@nki.jit
def cummax_scan_kernel(x, tile_f=512):
  N, F = x.shape
  out = nl.ndarray((N, F), dtype=x.dtype, buffer=nl.shared_hbm)
  i_p = nl.arange(PMAX)[:, None]
  i_f = nl.arange(tile_f)[None, :]
  zeros = nl.zeros((par_dim(PMAX), tile_f), dtype=nl.float32)
  for i in nl.affine_range(math.ceil(N / PMAX)):
    init = nl.full((par_dim(PMAX), 1), -3.0e38, dtype=nl.float32)
    for j in nl.sequential_range(math.ceil(F / tile_f)):
      mask = (i * PMAX + i_p < N) & (j * tile_f + i_f < F)
      xt = nl.load(x[i * PMAX + i_p, j * tile_f + i_f], mask=mask, dtype=nl.float32)
      res = nisa.tensor_tensor_scan(zeros, xt, initial=init, op0=np.add, op1=np.maximum, mask=mask)
      nl.store(out[i * PMAX + i_p, j * tile_f + i_f], value=res, mask=mask)
      init[i_p, 0] = nl.copy(res[i_p, tile_f - 1], mask=(i * PMAX + i_p < N) & (j * tile_f + tile_f - 1 < F))
  return out


@nki.jit
def transpose_3d_kernel(x):
  S, H, D = x.shape
  assert S <= PMAX and D <= PMAX
  out = nl.ndarray((H, D, S), dtype=x.dtype, buffer=nl.shared_hbm)
  i_s = nl.arange(S)[:, None]
  i_d = nl.arange(D)[None, :]
  i_dp = nl.arange(D)[:, None]
  i_sf = nl.arange(S)[None, :]
  for h in nl.affine_range(H):
    t = nl.load_transpose2d(x[i_s, h, i_d])
    nl.store(out[h, i_dp, i_sf], value=t)
  return out


@nki.jit
def local_ids_kernel(ids, starts):
  """Vocabulary-shard local ids: ids [N, F] int32 minus the shard start of each row (starts [N, F] int32, the
  row's start repeated), value-returning ``nl.subtract`` of two int32 tiles (ragged last row tile masked)."""
  N, F = ids.shape
  out = nl.ndarray((N, F), dtype=nl.int32, buffer=nl.shared_hbm)
  i_p = nl.arange(PMAX)[:, None]
  i_f = nl.arange(F)[None, :]
  for t in nl.affine_range(math.ceil(N / PMAX)):
    rows = t * PMAX + i_p
    a = nl.load(ids[rows, i_f], mask=(rows < N))
    s = nl.load(starts[rows, i_f], mask=(rows < N))
    nl.store(out[rows, i_f], value=nl.subtract(a, s, mask=(rows < N)), mask=(rows < N))
  return out
