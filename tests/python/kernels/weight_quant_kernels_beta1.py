"""An AWQ-style W4A16 decode GEMM in the Beta-1 dialect (``import neuronxcc.nki``), the way public Beta-1 ports write
it: int4 weights packed two per uint8 along N (column 2 h in the low nibble of byte h, column 2 h + 1 in the high
nibble), one uint8 zero point and one bf16 scale per (group of 128 K rows, column). The packed tile is unpacked with
``nl.bitwise_and`` / ``nl.right_shift`` value ops into the even / odd columns of an int tile, dequantized with
``nl.subtract`` / ``nl.multiply`` against the group's [1, N] zero and scale rows (partition broadcast), and
accumulated with ``psum += nisa.nc_matmul(...)``. A ragged N (not a multiple of 512) is handled with masks; x^T comes
from ``nl.load_transpose2d``.

    out = x @ ((unpack(qweight) - zeros) * scales)

Written for nsim's tests; not a copy of any public file. No nsim imports.
"""
import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl


@nki.jit
def w4a16_awq_gemm(x, qweight, zeros, scales):
  """x [M <= 128, K] bf16, qweight [K, N / 2] uint8, zeros [K / 128, N] uint8, scales [K / 128, N] bf16."""
  M, K = x.shape
  _, NH = qweight.shape
  N = NH * 2
  TILE_K = nl.tile_size.pmax
  TILE_N = nl.tile_size.gemm_moving_fmax
  TILE_H = TILE_N // 2
  assert M <= 128 and K % TILE_K == 0

  out = nl.ndarray((M, N), dtype=x.dtype, buffer=nl.shared_hbm)
  i_kp = nl.arange(TILE_K)[:, None]
  i_mp = nl.arange(M)[:, None]
  i_mf = nl.arange(M)[None, :]
  i_kf = nl.arange(TILE_K)[None, :]
  i_nf = nl.arange(TILE_N)[None, :]
  i_hf = nl.arange(TILE_H)[None, :]
  i_0 = nl.arange(1)[:, None]

  for n in nl.affine_range((N + TILE_N - 1) // TILE_N):
    acc = nl.zeros((M, TILE_N), nl.float32, buffer=nl.psum)
    for k in nl.affine_range(K // TILE_K):
      xT = nl.load_transpose2d(x[i_mp, k * TILE_K + i_kf])
      packed = nl.load(qweight[k * TILE_K + i_kp, n * TILE_H + i_hf], mask=(n * TILE_H + i_hf < NH))
      z_row = nl.load(zeros[k + i_0, n * TILE_N + i_nf], mask=(n * TILE_N + i_nf < N))
      s_row = nl.load(scales[k + i_0, n * TILE_N + i_nf], mask=(n * TILE_N + i_nf < N))

      w_int = nl.ndarray((TILE_K, TILE_H, 2), dtype=nl.int32, buffer=nl.sbuf)
      w_int[:, :, 0] = nl.bitwise_and(packed, 0x0F, mask=(n * TILE_H + i_hf < NH))
      w_int[:, :, 1] = nl.right_shift(packed, 4, mask=(n * TILE_H + i_hf < NH))
      w_q = w_int.reshape((TILE_K, TILE_N))
      w = nl.multiply(nl.subtract(w_q, z_row, dtype=nl.float32, mask=(n * TILE_N + i_nf < N)), s_row,
                      dtype=nl.bfloat16, mask=(n * TILE_N + i_nf < N))
      acc += nisa.nc_matmul(xT[i_kp, i_mf], w[i_kp, i_nf], mask=(n * TILE_N + i_nf < N))
    res = nl.copy(acc, dtype=x.dtype)
    nl.store(out[i_mp, n * TILE_N + i_nf], value=res[i_mp, i_nf], mask=(n * TILE_N + i_nf < N))
  return out


@nki.jit
def masked_row_scale(w, s):
  """w [128, F] bf16, s [1, F] fp32 -> w * s on the columns below ``F - 24`` (a ragged tile's mask), 0 elsewhere:
  the [1, F] row broadcasts over the partitions under the mask."""
  Pn, F = w.shape
  i_p = nl.arange(Pn)[:, None]
  i_f = nl.arange(F)[None, :]
  i_0 = nl.arange(1)[:, None]
  out = nl.ndarray((Pn, F), dtype=w.dtype, buffer=nl.shared_hbm)
  w_t = nl.load(w[i_p, i_f])
  s_t = nl.load(s[i_0, i_f])
  res = nl.zeros((Pn, F), dtype=w.dtype, buffer=nl.sbuf)
  res[i_p, i_f] = nl.multiply(w_t, s_t, mask=(i_f < F - 24))
  nl.store(out[i_p, i_f], value=res)
  return out
