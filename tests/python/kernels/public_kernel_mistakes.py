"""Public-style NKI kernels with the mistakes kernel authors really make, one mistake per kernel, in both dialects:
copies of the tutorial kernels of this folder (tensor add, the matmul tutorial, softmax / layernorm-style row
tiles, the indirect loads of the vLLM / nki-library kernels, Mamba's carried state) with one line changed. The line
of each mistake ends in ``# MISTAKE: <tag>``; tests/python/test_public_kernel_mistakes.py checks that nsim reports
it at that line (file:line of this file, also inside the helper functions) with the documented code.

Beta-1 kernels (``neuronxcc.nki``) are named ``b1_*``, new-dialect kernels (``nki``) ``n_*``. No nsim imports:
``neuronxcc.nki`` and ``nki`` are resolved by ``nsim.compat``."""
import neuronxcc.nki as bnki
import neuronxcc.nki.isa as bisa
import neuronxcc.nki.language as bl
from neuronxcc.nki.language import par_dim

import nki
import nki.isa as nisa
import nki.language as nl


# ==================================================================================================
# Beta 1 (neuronxcc.nki)
# ==================================================================================================

@bnki.jit
def b1_tile_256_partitions(a_input, b_input):
  """tensor add with a [256, 512] tile: the partition dim is at most 128."""
  c_output = bl.ndarray(a_input.shape, dtype=a_input.dtype, buffer=bl.shared_hbm)
  a_tile = bl.load(a_input[0:256, 0:512])  # MISTAKE: b1_256
  b_tile = bl.load(b_input[0:256, 0:512])
  c_tile = a_tile + b_tile
  bl.store(c_output[0:256, 0:512], value=c_tile)
  return c_output


@bnki.jit
def b1_sbuf_overflow(a_input):
  """a [128, 64K] fp32 row tile: 256 KiB per partition, more than SBUF has."""
  out = bl.ndarray(a_input.shape, dtype=a_input.dtype, buffer=bl.shared_hbm)
  big = bl.load(a_input)  # MISTAKE: b1_sbuf
  bl.store(out, value=big)
  return out


@bnki.jit
def b1_psum_overflow(lhsT, rhs):
  """an accumulator of [128, 8192] fp32 in PSUM: 32 KiB per partition, PSUM has 16 KiB."""
  out = bl.ndarray((128, 512), dtype=bl.float32, buffer=bl.shared_hbm)
  acc = bl.zeros((128, 8192), bl.float32, buffer=bl.psum)  # MISTAKE: b1_psum
  x = bl.load(lhsT)
  y = bl.load(rhs)
  acc[:, 0:512] += bl.matmul(x, y, transpose_x=True)
  bl.store(out, value=bl.copy(acc[:, 0:512]))
  return out


@bnki.jit
def b1_matmul_stationary_256(lhsT, rhs):
  """TILE_M = 256: the stationary operand has more than 128 columns."""
  out = bl.ndarray((256, 512), dtype=bl.float32, buffer=bl.shared_hbm)
  x = bl.load(lhsT)
  y = bl.load(rhs)
  ps = bl.matmul(x, y, transpose_x=True)  # MISTAKE: b1_mm_stationary
  bl.store(out, value=ps)
  return out


@bnki.jit
def b1_matmul_moving_1024(lhsT, rhs):
  """TILE_N = 1024: the moving operand has more than 512 columns."""
  out = bl.ndarray((128, 1024), dtype=bl.float32, buffer=bl.shared_hbm)
  x = bl.load(lhsT)
  y = bl.load(rhs)
  ps = bl.matmul(x, y, transpose_x=True)  # MISTAKE: b1_mm_moving
  bl.store(out, value=bl.copy(ps))
  return out


@bnki.jit
def b1_matmul_contraction_mismatch(lhsT, rhs):
  """lhsT [128, 128] and rhs [64, 512]: the contraction dims differ."""
  out = bl.ndarray((128, 512), dtype=bl.float32, buffer=bl.shared_hbm)
  x = bl.load(lhsT)
  y = bl.load(rhs)
  ps = bl.matmul(x, y, transpose_x=True)  # MISTAKE: b1_mm_k
  bl.store(out, value=bl.copy(ps))
  return out


@bnki.jit
def b1_load_off_by_one(a_input):
  """the row-tile loop runs one tile too far."""
  out = bl.ndarray(a_input.shape, dtype=a_input.dtype, buffer=bl.shared_hbm)
  for i in bl.affine_range(a_input.shape[0] // 128 + 1):
    t = bl.load(a_input[i * 128:(i + 1) * 128, :])  # MISTAKE: b1_off_by_one
    bl.store(out[i * 128:(i + 1) * 128, :], value=t)
  return out


@bnki.jit
def b1_ragged_last_tile_sliced(a_input):
  """300 rows in tiles of 128 (ceil) taken by slices: the last slice reaches past the end."""
  out = bl.ndarray(a_input.shape, dtype=a_input.dtype, buffer=bl.shared_hbm)
  for i in bl.affine_range((a_input.shape[0] + 127) // 128):
    t = bl.load(a_input[i * 128:(i + 1) * 128, :])  # MISTAKE: b1_ragged_slices
    bl.store(out[i * 128:(i + 1) * 128, :], value=t)
  return out


@bnki.jit
def b1_ragged_last_tile_without_mask(a_input):
  """300 rows in tiles of 128 (ceil), the last tile loaded without mask=(i * 128 + i_p < num_rows)."""
  out = bl.ndarray(a_input.shape, dtype=a_input.dtype, buffer=bl.shared_hbm)
  i_p = bl.arange(128)[:, None]
  i_f = bl.arange(a_input.shape[1])[None, :]
  for i in bl.affine_range((a_input.shape[0] + 127) // 128):
    t = bl.load(a_input[i * 128 + i_p, i_f])  # MISTAKE: b1_ragged
    bl.store(out[i * 128 + i_p, i_f], value=t)
  return out


@bnki.jit
def b1_float_index_tile(data, idx):
  """the gather's index tile is float32 (the indices were passed as floats)."""
  out = bl.ndarray((64, 512), dtype=data.dtype, buffer=bl.shared_hbm)
  ix = bl.arange(64)[:, None]
  iy = bl.arange(512)[None, :]
  idx_tile = bl.load(idx[ix])
  d = bl.load(data[idx_tile[ix], iy])  # MISTAKE: b1_float_idx
  bl.store(out, value=d)
  return out


@bnki.jit
def b1_gather_negative_index(data, idx):
  """an index tile holding -1 (a padding slot) in a gather with the default oob_mode."""
  out = bl.ndarray((64, 512), dtype=data.dtype, buffer=bl.shared_hbm)
  ix = bl.arange(64)[:, None]
  iy = bl.arange(512)[None, :]
  idx_tile = bl.load(idx[ix])
  d = bl.load(data[idx_tile[ix], iy])  # MISTAKE: b1_gather_neg
  bl.store(out, value=d)
  return out


@bnki.jit
def b1_nc_transpose_too_large(a_input):
  """nc_transpose of a [128, 256] tile: TensorE transposes at most 128 x 128."""
  out = bl.ndarray((256, 128), dtype=a_input.dtype, buffer=bl.shared_hbm)
  t = bl.load(a_input)
  tt = bisa.nc_transpose(t)  # MISTAKE: b1_transpose
  bl.store(out, value=tt)
  return out


@bnki.jit
def b1_nl_transpose_too_large(a_input):
  """nl.transpose of a [128, 256] tile (the same limit through the nl API)."""
  out = bl.ndarray((256, 128), dtype=a_input.dtype, buffer=bl.shared_hbm)
  t = bl.load(a_input)
  tt = bl.transpose(t)  # MISTAKE: b1_nl_transpose
  bl.store(out, value=bl.copy(tt))
  return out


@bnki.jit
def b1_exp_of_psum_block(lhsT, rhs):
  """nl.exp of a whole [2, par_dim(128), 512] PSUM block tensor instead of one block ps[j]."""
  out = bl.ndarray((128, 512), dtype=bl.float32, buffer=bl.shared_hbm)
  ps = bl.ndarray((2, par_dim(128), 512), dtype=bl.float32, buffer=bl.psum)
  x = bl.load(lhsT)
  y = bl.load(rhs)
  for j in bl.affine_range(2):
    ps[j] = bl.matmul(x, y, transpose_x=True)
  e = bl.exp(ps)  # MISTAKE: b1_exp_psum
  bl.store(out, value=e)
  return out


@bnki.jit  # MISTAKE: b1_no_return
def b1_returns_nothing(a_input):
  """the output is computed and stored, but `return out` is missing."""
  out = bl.ndarray(a_input.shape, dtype=a_input.dtype, buffer=bl.shared_hbm)
  t = bl.load(a_input)
  bl.store(out, value=bl.exp(t))


@bnki.jit
def b1_tensor_tensor_shape_mismatch(a_input, b_input):
  """nisa.tensor_tensor of [128, 512] and [128, 256]."""
  out = bl.ndarray((128, 512), dtype=a_input.dtype, buffer=bl.shared_hbm)
  a = bl.load(a_input)
  b = bl.load(b_input)
  c = bisa.tensor_tensor(a, b, op=bl.add)  # MISTAKE: b1_tt_shape
  bl.store(out, value=c)
  return out


@bnki.jit
def b1_tensor_tensor_no_broadcast(a_input, b_input):
  """nisa.tensor_tensor of [128, 512] and a [128, 1] column: ISA calls do not broadcast (use tensor_scalar)."""
  out = bl.ndarray((128, 512), dtype=a_input.dtype, buffer=bl.shared_hbm)
  a = bl.load(a_input)
  b = bl.load(b_input)
  c = bisa.tensor_tensor(a, b, op=bl.multiply)  # MISTAKE: b1_tt_bcast
  bl.store(out, value=c)
  return out


def b1_iota_outside_kernel():
  """an nki.isa call at module level (building a constant index tile outside the kernel)."""
  return bisa.memset((128, 1), 0.0, bl.float32)  # MISTAKE: b1_outside


def b1_zeros_outside_kernel():
  return bl.zeros((128, 64), dtype=bl.float32)  # MISTAKE: b1_outside_zeros


def _b1_scale_rows(t, factors):
  return bl.multiply(t, factors["scale"])  # MISTAKE: b1_user_exc


@bnki.jit
def b1_user_exception(a_input):
  """a KeyError in the user's own helper: it comes through unchanged."""
  out = bl.ndarray(a_input.shape, dtype=a_input.dtype, buffer=bl.shared_hbm)
  t = bl.load(a_input)
  s = _b1_scale_rows(t, {"scal": 2.0})
  bl.store(out, value=s)
  return out


def _b1_load_tile(src, i):
  return bl.load(src[i * 128:(i + 1) * 128, :])  # MISTAKE: b1_helper_oob


@bnki.jit
def b1_helper_off_by_one(a_input):
  """the off-by-one load inside a helper function of the user's."""
  out = bl.ndarray(a_input.shape, dtype=a_input.dtype, buffer=bl.shared_hbm)
  for i in bl.affine_range(a_input.shape[0] // 128 + 1):
    t = _b1_load_tile(a_input, i)
    bl.store(out[i * 128:(i + 1) * 128, :], value=t)
  return out


def _b1_rms_scale(t):
  sq = bl.multiply(t, t)
  s = bl.sum(sq, axis=[1], keepdims=True)  # (forgets `return s`)


@bnki.jit
def b1_helper_forgot_return(a_input):
  """a helper that forgets to return its tile: the instruction gets None."""
  out = bl.ndarray(a_input.shape, dtype=a_input.dtype, buffer=bl.shared_hbm)
  t = bl.load(a_input)
  s = _b1_rms_scale(t)
  r = bisa.activation(op=bl.rsqrt, data=s)  # MISTAKE: b1_forgot_return
  bl.store(out, value=bl.multiply(t, r))
  return out


# ==================================================================================================
# New dialect (nki)
# ==================================================================================================

@nki.jit
def n_tile_256_partitions(a_input, b_input):
  c_output = nl.ndarray(a_input.shape, dtype=a_input.dtype, buffer=nl.shared_hbm)
  a_tile = nl.ndarray((256, 512), dtype=a_input.dtype, buffer=nl.sbuf)  # MISTAKE: n_256
  nisa.dma_copy(dst=a_tile, src=a_input[0:256, 0:512])
  b_tile = nl.ndarray((128, 512), dtype=b_input.dtype, buffer=nl.sbuf)
  nisa.dma_copy(dst=b_tile, src=b_input[0:128, 0:512])
  nisa.tensor_tensor(dst=b_tile, data1=a_tile[0:128, :], data2=b_tile, op=nl.add)
  nisa.dma_copy(dst=c_output[0:128, 0:512], src=b_tile)
  return c_output


@nki.jit
def n_sbuf_overflow(a_input):
  out = nl.ndarray(a_input.shape, dtype=a_input.dtype, buffer=nl.shared_hbm)
  big = nl.ndarray((128, 65536), dtype=nl.float32, buffer=nl.sbuf)  # MISTAKE: n_sbuf
  nisa.dma_copy(dst=big, src=a_input)
  nisa.dma_copy(dst=out, src=big)
  return out


@nki.jit
def n_sbuf_too_many_live_tiles(a_input):
  """every row tile kept live in a Python list: 8 x [128, 8192] fp32 = 256 KiB per partition."""
  out = nl.ndarray(a_input.shape, dtype=a_input.dtype, buffer=nl.shared_hbm)
  tiles = []
  for i in range(a_input.shape[0] // 128):
    t = nl.ndarray((128, a_input.shape[1]), dtype=nl.float32, buffer=nl.sbuf)  # MISTAKE: n_many_live
    nisa.dma_copy(dst=t, src=a_input[i * 128:(i + 1) * 128, :])
    tiles.append(t)
  for i in range(len(tiles)):
    nisa.dma_copy(dst=out[i * 128:(i + 1) * 128, :], src=tiles[i])
  return out


def _n_load(src):
  t = nl.ndarray(src.shape, dtype=src.dtype, buffer=nl.sbuf)
  nisa.dma_copy(dst=t, src=src)
  return t


@nki.jit
def n_psum_overflow(lhsT, rhs):
  out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
  ps = nl.ndarray((128, 8192), dtype=nl.float32, buffer=nl.psum)  # MISTAKE: n_psum
  x, y = _n_load(lhsT), _n_load(rhs)
  nisa.nc_matmul(dst=ps[:, 0:512], stationary=x, moving=y)
  r = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_copy(dst=r, src=ps[:, 0:512])
  nisa.dma_copy(dst=out, src=r)
  return out


@nki.jit
def n_psum_too_many_banks(lhsT, rhs):
  """nine [128, 512] fp32 accumulators live at once: PSUM has eight 2 KiB banks."""
  out = nl.ndarray((128, 9 * 512), dtype=nl.float32, buffer=nl.shared_hbm)
  x, y = _n_load(lhsT), _n_load(rhs)
  accs = []
  for j in range(9):
    ps = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)  # MISTAKE: n_psum_banks
    nisa.nc_matmul(dst=ps, stationary=x, moving=y)
    accs.append(ps)
  for j in range(9):
    r = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=r, src=accs[j])
    nisa.dma_copy(dst=out[:, j * 512:(j + 1) * 512], src=r)
  return out


@nki.jit
def n_matmul_stationary_256(lhsT, rhs):
  out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
  x, y = _n_load(lhsT), _n_load(rhs)
  ps = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
  nisa.nc_matmul(dst=ps, stationary=x, moving=y)  # MISTAKE: n_mm_stationary
  r = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_copy(dst=r, src=ps)
  nisa.dma_copy(dst=out, src=r)
  return out


@nki.jit
def n_matmul_moving_1024(lhsT, rhs):
  out = nl.ndarray((128, 1024), dtype=nl.float32, buffer=nl.shared_hbm)
  x, y = _n_load(lhsT), _n_load(rhs)
  ps = nl.ndarray((128, 1024), dtype=nl.float32, buffer=nl.psum)
  nisa.nc_matmul(dst=ps, stationary=x, moving=y)  # MISTAKE: n_mm_moving
  r = nl.ndarray((128, 1024), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_copy(dst=r, src=ps)
  nisa.dma_copy(dst=out, src=r)
  return out


@nki.jit
def n_matmul_contraction_mismatch(lhsT, rhs):
  out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
  x, y = _n_load(lhsT), _n_load(rhs)
  ps = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
  nisa.nc_matmul(dst=ps, stationary=x, moving=y)  # MISTAKE: n_mm_k
  r = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_copy(dst=r, src=ps)
  nisa.dma_copy(dst=out, src=r)
  return out


@nki.jit
def n_load_off_by_one(a_input):
  out = nl.ndarray(a_input.shape, dtype=a_input.dtype, buffer=nl.shared_hbm)
  for i in nl.affine_range(a_input.shape[0] // 128 + 1):
    t = nl.ndarray((128, a_input.shape[1]), dtype=a_input.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a_input[i * 128:(i + 1) * 128, :])  # MISTAKE: n_off_by_one
    nisa.dma_copy(dst=out[i * 128:(i + 1) * 128, :], src=t)
  return out


@nki.jit
def n_ragged_last_tile_unclipped(a_input):
  """the tutorials' p_size = min(128, num_rows - i * 128) forgotten: the last tile reads past the end."""
  out = nl.ndarray(a_input.shape, dtype=a_input.dtype, buffer=nl.shared_hbm)
  for i in nl.affine_range((a_input.shape[0] + 127) // 128):
    t = nl.ndarray((128, a_input.shape[1]), dtype=a_input.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a_input[i * 128:i * 128 + 128, :])  # MISTAKE: n_ragged
    nisa.dma_copy(dst=out[i * 128:i * 128 + 128, :], src=t)
  return out


@nki.jit
def n_float_index_tile(data, idx):
  """the row ids of an indirect load (the MoE / nki-library gather) in a float32 tile."""
  out = nl.ndarray((64, 512), dtype=data.dtype, buffer=nl.shared_hbm)
  ids = _n_load(idx)
  x = nl.ndarray((64, 512), dtype=data.dtype, buffer=nl.sbuf)
  nisa.dma_copy(dst=x, src=data.ap(pattern=[[512, 64], [1, 512]], vector_offset=ids, indirect_dim=0))  # MISTAKE: n_float_idx
  nisa.dma_copy(dst=out, src=x)
  return out


@nki.jit
def n_gather_negative_index(data, idx):
  out = nl.ndarray((64, 512), dtype=data.dtype, buffer=nl.shared_hbm)
  ids = _n_load(idx)
  x = nl.ndarray((64, 512), dtype=data.dtype, buffer=nl.sbuf)
  nisa.dma_copy(dst=x, src=data.ap(pattern=[[512, 64], [1, 512]], vector_offset=ids, indirect_dim=0))  # MISTAKE: n_gather_neg
  nisa.dma_copy(dst=out, src=x)
  return out


@nki.jit
def n_nc_transpose_too_large(a_input):
  out = nl.ndarray((128, 256), dtype=a_input.dtype, buffer=nl.shared_hbm)
  t = _n_load(a_input)
  tp = nl.ndarray((128, 256), dtype=a_input.dtype, buffer=nl.psum)
  nisa.nc_transpose(dst=tp, data=t)  # MISTAKE: n_transpose
  r = nl.ndarray((128, 256), dtype=a_input.dtype, buffer=nl.sbuf)
  nisa.tensor_copy(dst=r, src=tp)
  nisa.dma_copy(dst=out, src=r)
  return out


@nki.jit
def n_exp_of_psum_wrong_shape(lhsT, rhs):
  """exp of a [128, 512] PSUM result into a [128, 256] tile (the softmax's half-width buffer)."""
  out = nl.ndarray((128, 256), dtype=nl.float32, buffer=nl.shared_hbm)
  x, y = _n_load(lhsT), _n_load(rhs)
  ps = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
  nisa.nc_matmul(dst=ps, stationary=x, moving=y)
  e = nl.ndarray((128, 256), dtype=nl.float32, buffer=nl.sbuf)
  nisa.activation(dst=e, op=nl.exp, data=ps)  # MISTAKE: n_exp_psum
  nisa.dma_copy(dst=out, src=e)
  return out


@nki.jit  # MISTAKE: n_no_return
def n_returns_nothing(a_input):
  out = nl.ndarray(a_input.shape, dtype=a_input.dtype, buffer=nl.shared_hbm)
  t = _n_load(a_input)
  nisa.activation(dst=t, op=nl.exp, data=t)
  nisa.dma_copy(dst=out, src=t)


@nki.jit
def n_tensor_tensor_shape_mismatch(a_input, b_input):
  out = nl.ndarray((128, 512), dtype=a_input.dtype, buffer=nl.shared_hbm)
  a, b = _n_load(a_input), _n_load(b_input)   # [128, 512] and [128, 256]
  c = nl.ndarray((128, 512), dtype=a_input.dtype, buffer=nl.sbuf)
  nisa.tensor_tensor(dst=c, data1=a, data2=b, op=nl.add)  # MISTAKE: n_tt_shape
  nisa.dma_copy(dst=out, src=c)
  return out


@nki.jit
def n_tensor_tensor_no_broadcast(a_input, b_input):
  """multiplying by a (128, 1) column with tensor_tensor: ISA calls do not broadcast (spec 3.10)."""
  out = nl.ndarray((128, 512), dtype=a_input.dtype, buffer=nl.shared_hbm)
  a, b = _n_load(a_input), _n_load(b_input)   # [128, 512] and [128, 1]
  c = nl.ndarray((128, 512), dtype=a_input.dtype, buffer=nl.sbuf)
  nisa.tensor_tensor(dst=c, data1=a, data2=b, op=nl.multiply)  # MISTAKE: n_tt_bcast
  nisa.dma_copy(dst=out, src=c)
  return out


@nki.jit
def n_affine_range_carried_state(a_input):
  """a running state carried from one row tile to the next in nl.affine_range (needs nl.sequential_range)."""
  out = nl.ndarray((128, 512), dtype=a_input.dtype, buffer=nl.shared_hbm)
  prev = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
  nisa.memset(dst=prev, value=0.0)
  for i in nl.affine_range(a_input.shape[0] // 128):
    t = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a_input[i * 128:(i + 1) * 128, :])
    nisa.tensor_tensor(dst=t, data1=t, data2=prev, op=nl.maximum)  # MISTAKE: n_carried
    nisa.tensor_scalar(dst=prev, data=t, op0=nl.multiply, operand0=0.5)
  nisa.dma_copy(dst=out, src=prev)
  return out


def n_ndarray_outside_kernel():
  return nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)  # MISTAKE: n_outside


def _n_scale(t, factors):
  nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=factors["scale"])  # MISTAKE: n_user_exc


@nki.jit
def n_user_exception(a_input):
  out = nl.ndarray(a_input.shape, dtype=a_input.dtype, buffer=nl.shared_hbm)
  t = _n_load(a_input)
  _n_scale(t, {"scal": 2.0})
  nisa.dma_copy(dst=out, src=t)
  return out


def _n_load_rows(dst, src, i):
  nisa.dma_copy(dst=dst, src=src[i * 128:(i + 1) * 128, :])  # MISTAKE: n_helper_oob


@nki.jit
def n_helper_off_by_one(a_input):
  out = nl.ndarray(a_input.shape, dtype=a_input.dtype, buffer=nl.shared_hbm)
  for i in nl.affine_range(a_input.shape[0] // 128 + 1):
    t = nl.ndarray((128, a_input.shape[1]), dtype=a_input.dtype, buffer=nl.sbuf)
    _n_load_rows(t, a_input, i)
    nisa.dma_copy(dst=out[i * 128:(i + 1) * 128, :], src=t)
  return out


@nki.jit
def n_write_input_argument(a_input):
  """writes its input in place and returns it: allowed by nsim (the caller's array is updated; nki-api.md 1.6)."""
  t = _n_load(a_input)
  nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=2.0)
  nisa.dma_copy(dst=a_input, src=t)
  return a_input
