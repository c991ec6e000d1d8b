"""A blocked GEMM written in the style of awslabs/nki-autotune's ``gemm`` kernels: Beta-1 dialect
(``neuronxcc.nki``), a compatibility object that derives the tiling from the tuning knobs, a kernel entry point
whose non-tensor parameters are the knobs the autotuner sweeps (``TILES_IN_BLOCK_M/N/K``, ``BUFFER_M/N/K``,
``loop_order``), blocks of tiles brought into SBUF with ``nl.load`` through ``nl.mgrid`` index tiles, a block of
``nisa.nc_matmul`` accumulated in PSUM over the K tiles of a block (``psum += nisa.nc_matmul(...)``), the PSUM
partial sums added into an fp32 SBUF result block over the K blocks, and the result block cast and packed into
row stripes (``nl.copy``) and written with ``nl.store``.

    transposed_lhs=True:   result[M, N] = lhs.T @ rhs,  lhs [K, M] ("lhsT"), rhs [K, N]
    transposed_lhs=False:  result[M, N] = lhs @ rhs,    lhs [M, K] (each 128 x 128 tile transposed on the PE)

The ``BUFFER_*`` knobs are buffer degrees: the number of SBUF slots a loaded block rotates through (block ``b``
goes to slot ``b % BUFFER``), so that with a degree of 2 the load of the next block does not wait for the
matmuls still reading the current one.

Written for nsim's tests from memory of that repository's idioms (its kernel signatures, the
``MatMulCompatibility`` check object, ``load_tensor_block`` / ``matmul_tiles`` / ``save_result_block`` helpers);
it is not a copy of any nki-autotune file, and details differ from the published code. No nsim imports.
"""
import numpy as np

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl
from neuronxcc.nki.language import par_dim

LOOP_ORDERS = ("MNK", "NMK", "MKN", "KMN")


class MatMulCompatibility:
  """Checks the input shapes against the tiling knobs and derives the block sizes.

  TILE_K = pmax (contraction on the partitions), TILE_M = gemm_stationary_fmax (the stationary free size),
  TILE_N = gemm_moving_fmax (one PSUM bank of fp32). A block holds TILES_IN_BLOCK_* tiles in each dim.
  """

  def __init__(self, lhs_shape, rhs_shape, TILES_IN_BLOCK_M, TILES_IN_BLOCK_N, TILES_IN_BLOCK_K,
               BUFFER_M, BUFFER_N, BUFFER_K, transposed_lhs):
    if transposed_lhs:
      self.K, self.M = lhs_shape
    else:
      self.M, self.K = lhs_shape
    K_, self.N = rhs_shape
    assert self.K == K_, "lhs and rhs contraction dimensions mismatch: {} vs {}".format(lhs_shape, rhs_shape)
    self.transposed_lhs = transposed_lhs

    self.TILE_M = nl.tile_size.gemm_stationary_fmax  # 128
    self.TILE_N = nl.tile_size.gemm_moving_fmax  # 512
    self.TILE_K = nl.tile_size.pmax  # 128

    self.TILES_IN_BLOCK_M = TILES_IN_BLOCK_M
    self.TILES_IN_BLOCK_N = TILES_IN_BLOCK_N
    self.TILES_IN_BLOCK_K = TILES_IN_BLOCK_K
    self.BLOCK_M = self.TILE_M * TILES_IN_BLOCK_M
    self.BLOCK_N = self.TILE_N * TILES_IN_BLOCK_N
    self.BLOCK_K = self.TILE_K * TILES_IN_BLOCK_K
    for dim, block in (("M", self.BLOCK_M), ("N", self.BLOCK_N), ("K", self.BLOCK_K)):
      size = getattr(self, dim)
      assert size % block == 0, "{}={} is not a multiple of BLOCK_{}={}".format(dim, size, dim, block)
    self.NUM_BLOCK_M = self.M // self.BLOCK_M
    self.NUM_BLOCK_N = self.N // self.BLOCK_N
    self.NUM_BLOCK_K = self.K // self.BLOCK_K

    for name, b in (("BUFFER_M", BUFFER_M), ("BUFFER_N", BUFFER_N), ("BUFFER_K", BUFFER_K)):
      assert 1 <= b, "{}={} must be at least 1".format(name, b)
    self.BUFFER_M = BUFFER_M
    self.BUFFER_N = BUFFER_N
    self.BUFFER_K = BUFFER_K

  def matmul_count(self):
    return (self.M // self.TILE_M) * (self.N // self.TILE_N) * (self.K // self.TILE_K)


def load_tensor_block(input_tensor, ofs, load_shape, dst=None, dst_block=0):
  """Load the 2D region of ``input_tensor`` whose upper left corner is ``ofs`` and whose size is
  (block_size * par_size, free_size) into SBUF, one (par_size, free_size) tile per block position:
  result[b, p, f] = input_tensor[ofs[0] + b * par_size + p, ofs[1] + f].
  With ``dst`` given, the tiles go into ``dst[dst_block, b]`` (a buffer slot of a rotating buffer)."""
  assert len(ofs) == 2 and len(load_shape) == 3
  block_size, par_size, free_size = load_shape
  if dst is None:
    dst = nl.ndarray((1, block_size, par_dim(par_size), free_size), dtype=input_tensor.dtype, buffer=nl.sbuf)
    dst_block = 0
  max_rows, max_cols = input_tensor.shape
  idx = nl.mgrid[0:par_size, 0:free_size]
  for block_id in nl.affine_range(block_size):
    row_indices = ofs[0] + block_id * par_size + idx.p
    col_indices = ofs[1] + idx.x
    dst[dst_block, block_id, idx.p, idx.x] = nl.load(
        input_tensor[row_indices, col_indices], mask=(row_indices < max_rows) & (col_indices < max_cols))
  return dst


def load_lhsT_block(lhs, mm, block_m, block_k, dst, slot):
  """The (block_k, block_m) block of lhsT as TILES_IN_BLOCK_K tiles [TILE_K, BLOCK_M] into ``dst[slot]``. A
  non-transposed lhs [M, K] is loaded as [TILE_M, BLOCK_K] row tiles and each 128 x 128 piece transposed on the
  PE (nc_transpose through PSUM), as the library does for the lhs of C = A @ B."""
  if mm.transposed_lhs:
    return load_tensor_block(lhs, (block_k * mm.BLOCK_K, block_m * mm.BLOCK_M),
                             (mm.TILES_IN_BLOCK_K, mm.TILE_K, mm.BLOCK_M), dst, slot)
  rows = load_tensor_block(lhs, (block_m * mm.BLOCK_M, block_k * mm.BLOCK_K),
                           (mm.TILES_IN_BLOCK_M, mm.TILE_M, mm.BLOCK_K))
  i_t = nl.mgrid[0:mm.TILE_M, 0:mm.TILE_K]
  for tile_m in nl.affine_range(mm.TILES_IN_BLOCK_M):
    for tile_k in nl.affine_range(mm.TILES_IN_BLOCK_K):
      tileT = nisa.nc_transpose(rows[0, tile_m, i_t.p, tile_k * mm.TILE_K + i_t.x])
      dst[slot, tile_k, i_t.p, tile_m * mm.TILE_M + i_t.x] = nl.copy(tileT, dtype=lhs.dtype)
  return dst


def matmul_tiles(lhsT_tiles, lhs_slot, rhs_tiles, rhs_slot, result_tiles, res_block, mm):
  """result_tiles[res_block, m, n] += sum over the K tiles of the block of lhsT_tile(k, m).T @ rhs_tile(k, n):
  one PSUM accumulation group per (m, n) result tile, then added into the fp32 SBUF result."""
  idx_lhsT = nl.mgrid[0:mm.TILE_K, 0:mm.TILE_M]
  idx_rhs = nl.mgrid[0:mm.TILE_K, 0:mm.TILE_N]
  idx_res = nl.mgrid[0:mm.TILE_M, 0:mm.TILE_N]
  for tile_id_M in nl.affine_range(mm.TILES_IN_BLOCK_M):
    for tile_id_N in nl.affine_range(mm.TILES_IN_BLOCK_N):
      res_tile = nl.zeros((mm.TILE_M, mm.TILE_N), dtype=nl.float32, buffer=nl.psum)
      for tile_id_K in nl.affine_range(mm.TILES_IN_BLOCK_K):
        res_tile += nisa.nc_matmul(
            lhsT_tiles[lhs_slot, tile_id_K, idx_lhsT.p, tile_id_M * mm.TILE_M + idx_lhsT.x],
            rhs_tiles[rhs_slot, tile_id_K, idx_rhs.p, tile_id_N * mm.TILE_N + idx_rhs.x])
      result_tiles[res_block, tile_id_M, tile_id_N, idx_res.p, idx_res.x] += res_tile[idx_res.p, idx_res.x]


def save_result_block(result, result_tiles, res_block, block_m, block_n, mm):
  """Cast the fp32 result block to the output dtype, packed into [TILE_M, BLOCK_N] row stripes, and store it."""
  idx_res = nl.mgrid[0:mm.TILE_M, 0:mm.TILE_N]
  idx_packed = nl.mgrid[0:mm.TILE_M, 0:mm.BLOCK_N]
  for tile_id_M in nl.affine_range(mm.TILES_IN_BLOCK_M):
    packed = nl.ndarray((par_dim(mm.TILE_M), mm.BLOCK_N), dtype=result.dtype, buffer=nl.sbuf)
    for tile_id_N in nl.affine_range(mm.TILES_IN_BLOCK_N):
      packed[idx_res.p, tile_id_N * mm.TILE_N + idx_res.x] = nl.copy(
          result_tiles[res_block, tile_id_M, tile_id_N, idx_res.p, idx_res.x], dtype=result.dtype)
    nl.store(result[block_m * mm.BLOCK_M + tile_id_M * mm.TILE_M + idx_packed.p,
                    block_n * mm.BLOCK_N + idx_packed.x],
             value=packed[idx_packed.p, idx_packed.x])


def _lhs_buffer(lhs, mm):
  return nl.ndarray((mm.BUFFER_K, mm.TILES_IN_BLOCK_K, par_dim(mm.TILE_K), mm.BLOCK_M), dtype=lhs.dtype,
                    buffer=nl.sbuf)


def _rhs_buffer(rhs, mm, degree):
  return nl.ndarray((degree, mm.TILES_IN_BLOCK_K, par_dim(mm.TILE_K), mm.BLOCK_N), dtype=rhs.dtype,
                    buffer=nl.sbuf)


def _result_blocks(mm, n_blocks):
  return nl.zeros((n_blocks, mm.TILES_IN_BLOCK_M, mm.TILES_IN_BLOCK_N, par_dim(mm.TILE_M), mm.TILE_N),
                  dtype=nl.float32, buffer=nl.sbuf)


def matmul_MNK(lhs, rhs, mm, result):
  """Blocks of M outermost, then N, then K innermost (one result block live at a time; the lhs block of
  (m, k) is loaded again for every n, the rhs block of (k, n) again for every m)."""
  lhs_tiles = _lhs_buffer(lhs, mm)
  rhs_tiles = _rhs_buffer(rhs, mm, mm.BUFFER_K)
  for block_m in nl.affine_range(mm.NUM_BLOCK_M):
    for block_n in nl.affine_range(mm.NUM_BLOCK_N):
      result_tiles = _result_blocks(mm, 1)
      for block_k in nl.sequential_range(mm.NUM_BLOCK_K):
        slot = block_k % mm.BUFFER_K
        load_lhsT_block(lhs, mm, block_m, block_k, lhs_tiles, slot)
        load_tensor_block(rhs, (block_k * mm.BLOCK_K, block_n * mm.BLOCK_N),
                          (mm.TILES_IN_BLOCK_K, mm.TILE_K, mm.BLOCK_N), rhs_tiles, slot)
        matmul_tiles(lhs_tiles, slot, rhs_tiles, slot, result_tiles, 0, mm)
      save_result_block(result, result_tiles, 0, block_m, block_n, mm)


def matmul_NMK(lhs, rhs, mm, result):
  """N outermost, then M, then K."""
  lhs_tiles = _lhs_buffer(lhs, mm)
  rhs_tiles = _rhs_buffer(rhs, mm, mm.BUFFER_K)
  for block_n in nl.affine_range(mm.NUM_BLOCK_N):
    for block_m in nl.affine_range(mm.NUM_BLOCK_M):
      result_tiles = _result_blocks(mm, 1)
      for block_k in nl.sequential_range(mm.NUM_BLOCK_K):
        slot = block_k % mm.BUFFER_K
        load_tensor_block(rhs, (block_k * mm.BLOCK_K, block_n * mm.BLOCK_N),
                          (mm.TILES_IN_BLOCK_K, mm.TILE_K, mm.BLOCK_N), rhs_tiles, slot)
        load_lhsT_block(lhs, mm, block_m, block_k, lhs_tiles, slot)
        matmul_tiles(lhs_tiles, slot, rhs_tiles, slot, result_tiles, 0, mm)
      save_result_block(result, result_tiles, 0, block_m, block_n, mm)


def matmul_MKN(lhs, rhs, mm, result):
  """M outermost, then K, then N: the lhs block of (m, k) is loaded once and reused for every n; a row of
  NUM_BLOCK_N result blocks stays in SBUF while K advances."""
  lhs_tiles = _lhs_buffer(lhs, mm)
  rhs_tiles = _rhs_buffer(rhs, mm, mm.BUFFER_N)
  for block_m in nl.affine_range(mm.NUM_BLOCK_M):
    result_row = _result_blocks(mm, mm.NUM_BLOCK_N)
    for block_k in nl.sequential_range(mm.NUM_BLOCK_K):
      lhs_slot = block_k % mm.BUFFER_K
      load_lhsT_block(lhs, mm, block_m, block_k, lhs_tiles, lhs_slot)
      for block_n in nl.affine_range(mm.NUM_BLOCK_N):
        rhs_slot = block_n % mm.BUFFER_N
        load_tensor_block(rhs, (block_k * mm.BLOCK_K, block_n * mm.BLOCK_N),
                          (mm.TILES_IN_BLOCK_K, mm.TILE_K, mm.BLOCK_N), rhs_tiles, rhs_slot)
        matmul_tiles(lhs_tiles, lhs_slot, rhs_tiles, rhs_slot, result_row, block_n, mm)
    for block_n in nl.affine_range(mm.NUM_BLOCK_N):
      save_result_block(result, result_row, block_n, block_m, block_n, mm)


def matmul_KMN(lhs, rhs, mm, result):
  """K outermost: every result block stays in SBUF (fp32) for the whole kernel; each lhs block is loaded
  once, each rhs block once per block of M."""
  lhs_tiles = nl.ndarray((mm.BUFFER_M, mm.TILES_IN_BLOCK_K, par_dim(mm.TILE_K), mm.BLOCK_M), dtype=lhs.dtype,
                         buffer=nl.sbuf)
  rhs_tiles = _rhs_buffer(rhs, mm, mm.BUFFER_N)
  result_all = _result_blocks(mm, mm.NUM_BLOCK_M * mm.NUM_BLOCK_N)
  for block_k in nl.sequential_range(mm.NUM_BLOCK_K):
    for block_m in nl.affine_range(mm.NUM_BLOCK_M):
      lhs_slot = block_m % mm.BUFFER_M
      load_lhsT_block(lhs, mm, block_m, block_k, lhs_tiles, lhs_slot)
      for block_n in nl.affine_range(mm.NUM_BLOCK_N):
        rhs_slot = block_n % mm.BUFFER_N
        load_tensor_block(rhs, (block_k * mm.BLOCK_K, block_n * mm.BLOCK_N),
                          (mm.TILES_IN_BLOCK_K, mm.TILE_K, mm.BLOCK_N), rhs_tiles, rhs_slot)
        matmul_tiles(lhs_tiles, lhs_slot, rhs_tiles, rhs_slot, result_all, block_m * mm.NUM_BLOCK_N + block_n, mm)
  for block_m in nl.affine_range(mm.NUM_BLOCK_M):
    for block_n in nl.affine_range(mm.NUM_BLOCK_N):
      save_result_block(result, result_all, block_m * mm.NUM_BLOCK_N + block_n, block_m, block_n, mm)


@nki.jit
def matmul_main(lhs, rhs, TILES_IN_BLOCK_M=4, TILES_IN_BLOCK_N=2, TILES_IN_BLOCK_K=4, BUFFER_M=2, BUFFER_N=2,
                BUFFER_K=2, loop_order="MNK", transposed_lhs=True):
  """GEMM entry point swept by the autotuner: result = lhs.T @ rhs (transposed_lhs) or lhs @ rhs, in lhs.dtype.

  Args:
    lhs: [K, M] if transposed_lhs else [M, K]; M a multiple of 128 * TILES_IN_BLOCK_M, K of 128 * TILES_IN_BLOCK_K.
    rhs: [K, N], N a multiple of 512 * TILES_IN_BLOCK_N.
    loop_order: the nesting of the block loops, outermost first: one of LOOP_ORDERS.
  """
  mm = MatMulCompatibility(lhs.shape, rhs.shape, TILES_IN_BLOCK_M, TILES_IN_BLOCK_N, TILES_IN_BLOCK_K,
                           BUFFER_M, BUFFER_N, BUFFER_K, transposed_lhs)
  result = nl.ndarray((mm.M, mm.N), dtype=lhs.dtype, buffer=nl.shared_hbm)
  if loop_order == "MNK":
    matmul_MNK(lhs, rhs, mm, result)
  elif loop_order == "NMK":
    matmul_NMK(lhs, rhs, mm, result)
  elif loop_order == "MKN":
    matmul_MKN(lhs, rhs, mm, result)
  elif loop_order == "KMN":
    matmul_KMN(lhs, rhs, mm, result)
  else:
    raise NotImplementedError("Loop order {} is not supported (one of {})".format(loop_order, LOOP_ORDERS))
  return result


def hbm_read_bytes(lhs_shape, rhs_shape, itemsize, TILES_IN_BLOCK_M=4, TILES_IN_BLOCK_N=2, TILES_IN_BLOCK_K=4,
                   loop_order="MNK", transposed_lhs=True, **_):
  """The bytes ``matmul_main`` reads from HBM (the autotuner's traffic model): every lhs block is loaded once
  per block of N (MNK, NMK) or once (MKN, KMN); every rhs block once per block of M."""
  mm = MatMulCompatibility(lhs_shape, rhs_shape, TILES_IN_BLOCK_M, TILES_IN_BLOCK_N, TILES_IN_BLOCK_K, 1, 1, 1,
                           transposed_lhs)
  lhs_loads = mm.NUM_BLOCK_N if loop_order in ("MNK", "NMK") else 1
  return itemsize * (lhs_loads * mm.M * mm.K + mm.NUM_BLOCK_M * mm.K * mm.N)


def reference(lhs, rhs, transposed_lhs=True):
  a = np.asarray(lhs, np.float64)
  return (a.T if transposed_lhs else a) @ np.asarray(rhs, np.float64)
