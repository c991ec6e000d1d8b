"""A per-channel fp8 weight projection in the Beta-1 dialect (``import neuronxcc.nki``), in the style of the
quantized MLP kernels of NxDI (neuronx-distributed-inference): the fp8 weight column block loaded once and fed to
the PE as it is, the token tile brought in transposed by ``nl.load_transpose2d``, the K tiles accumulated with
``res_psum += nisa.nc_matmul(...)``, and the per-output-channel scale (a [1, N] fp32 row) applied by a broadcasting
``nl.multiply`` on the way out of PSUM. The ragged last token tile is handled with masks.

Written for nsim's tests from memory of those kernels' idioms; it is not a copy of any NxDI file. No nsim imports.

    out = hidden @ (weight_q * weight_scale)
"""
import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl


@nki.jit
def quantized_fp8_proj(hidden, weight_q, weight_scale):
  """hidden [M, K] bf16, weight_q [K, N] float8_e4m3, weight_scale [1, N] fp32 -> [M, N] in hidden's dtype."""
  M, K = hidden.shape
  _, N = weight_q.shape
  TILE_M = nl.tile_size.gemm_stationary_fmax  # 128
  TILE_K = nl.tile_size.pmax  # 128
  TILE_N = nl.tile_size.gemm_moving_fmax  # 512
  assert K % TILE_K == 0, "K must be a multiple of 128"
  assert N % TILE_N == 0, "N must be a multiple of 512"

  out = nl.ndarray((M, N), dtype=hidden.dtype, buffer=nl.shared_hbm)

  i_kp = nl.arange(TILE_K)[:, None]
  i_kf = nl.arange(TILE_K)[None, :]
  i_mp = nl.arange(TILE_M)[:, None]
  i_mf = nl.arange(TILE_M)[None, :]
  i_nf = nl.arange(TILE_N)[None, :]
  i_0 = nl.arange(1)[:, None]

  for n in nl.affine_range(N // TILE_N):
    # the fp8 weight block stays fp8: nc_matmul reads it directly
    w_tiles = nl.ndarray((K // TILE_K, nl.par_dim(TILE_K), TILE_N), dtype=weight_q.dtype, buffer=nl.sbuf)
    for k in nl.affine_range(K // TILE_K):
      w_tiles[k, i_kp, i_nf] = nl.load(weight_q[k * TILE_K + i_kp, n * TILE_N + i_nf])
    scale_tile = nl.load(weight_scale[i_0, n * TILE_N + i_nf])  # [1, TILE_N]

    for m in nl.affine_range((M + TILE_M - 1) // TILE_M):
      res_psum = nl.zeros((TILE_M, TILE_N), nl.float32, buffer=nl.psum)
      for k in nl.affine_range(K // TILE_K):
        hT = nl.load_transpose2d(hidden[m * TILE_M + i_mp, k * TILE_K + i_kf], mask=(m * TILE_M + i_mp < M))
        res_psum += nisa.nc_matmul(hT[i_kp, i_mf], w_tiles[k, i_kp, i_nf], mask=(m * TILE_M + i_mf < M))
      # dequantize on eviction: the [1, TILE_N] scale row broadcasts over the partitions
      res = nl.multiply(res_psum, scale_tile, dtype=hidden.dtype, mask=(m * TILE_M + i_mp < M))
      nl.store(out[m * TILE_M + i_mp, n * TILE_N + i_nf], value=res, mask=(m * TILE_M + i_mp < M))
  return out
