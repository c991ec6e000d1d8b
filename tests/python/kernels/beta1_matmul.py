"""Beta-1 NKI matmul tutorial kernels (``neuronxcc.nki``): K accumulation in PSUM with ``+=``. No nsim
imports."""
import numpy as np

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl


@nki.jit
def nki_matmul_tiled_(lhsT, rhs, result):
    """result = lhsT.T @ rhs, tiled (M 128, K 128, N 512) with PSUM accumulation over K."""
    K, M = lhsT.shape
    K_, N = rhs.shape
    assert K == K_, "lhsT and rhs must have the same contraction dimension"

    TILE_M = nl.tile_size.gemm_stationary_fmax  # 128
    TILE_K = nl.tile_size.pmax  # 128
    TILE_N = nl.tile_size.gemm_moving_fmax  # 512

    for m in nl.affine_range(M // TILE_M):
        for n in nl.affine_range(N // TILE_N):
            # Allocate a tensor in PSUM
            res_psum = nl.zeros((TILE_M, TILE_N), nl.float32, buffer=nl.psum)

            for k in nl.affine_range(K // TILE_K):
                # Declare the tiles on SBUF
                lhsT_tile = nl.ndarray((TILE_K, TILE_M), dtype=lhsT.dtype, buffer=nl.sbuf)
                rhs_tile = nl.ndarray((TILE_K, TILE_N), dtype=rhs.dtype, buffer=nl.sbuf)

                # Load tiles from lhsT and rhs
                lhsT_tile[...] = nl.load(lhsT[k * TILE_K:(k + 1) * TILE_K, m * TILE_M:(m + 1) * TILE_M])
                rhs_tile[...] = nl.load(rhs[k * TILE_K:(k + 1) * TILE_K, n * TILE_N:(n + 1) * TILE_N])

                # Accumulate partial-sums into PSUM
                res_psum += nl.matmul(lhsT_tile[...], rhs_tile[...], transpose_x=True)

            # Copy the result from PSUM back to SBUF, and cast to expected output data-type
            res_sb = nl.copy(res_psum, dtype=result.dtype)
            nl.store(result[m * TILE_M:(m + 1) * TILE_M, n * TILE_N:(n + 1) * TILE_N], value=res_sb)


@nki.jit
def nki_matmul_hoist_load_(lhsT, rhs):
    """Block-dim tiles (nl.par_dim), arange indexing and psum[...] += nisa.nc_matmul; output returned."""
    K, M = lhsT.shape
    K_, N = rhs.shape
    TILE_M, TILE_K, TILE_N = 128, 128, 512
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)

    i_lhsT = nl.mgrid[0:TILE_K, 0:TILE_M]
    i_rhs = nl.mgrid[0:TILE_K, 0:TILE_N]
    i_res = nl.mgrid[0:TILE_M, 0:TILE_N]

    for m in nl.affine_range(M // TILE_M):
        # Load a whole column tiles from lhsT (with K * TILE_M numbers)
        lhsT_tiles = nl.ndarray((K // TILE_K, nl.par_dim(TILE_K), TILE_M), dtype=lhsT.dtype, buffer=nl.sbuf)
        for k in nl.affine_range(K // TILE_K):
            lhsT_tiles[k, i_lhsT.p, i_lhsT.x] = nl.load(lhsT[k * TILE_K + i_lhsT.p, m * TILE_M + i_lhsT.x])

        for n in nl.affine_range(N // TILE_N):
            rhs_tiles = nl.ndarray((K // TILE_K, nl.par_dim(TILE_K), TILE_N), dtype=rhs.dtype, buffer=nl.sbuf)
            for k in nl.affine_range(K // TILE_K):
                rhs_tiles[k, i_rhs.p, i_rhs.x] = nl.load(rhs[k * TILE_K + i_rhs.p, n * TILE_N + i_rhs.x])

            res_psum = nl.zeros((TILE_M, TILE_N), nl.float32, buffer=nl.psum)
            for k in nl.affine_range(K // TILE_K):
                res_psum[...] += nisa.nc_matmul(lhsT_tiles[k], rhs_tiles[k])

            res_sb = nl.copy(res_psum, dtype=result.dtype)
            nl.store(result[m * TILE_M + i_res.p, n * TILE_N + i_res.x], value=res_sb)
    return result


@nki.jit
def nki_matmul_spmd_(lhsT, rhs, result):
    """One (128, 512) output tile per program of a 2-D launch grid."""
    K, M = lhsT.shape
    m = nl.program_id(0)
    n = nl.program_id(1)
    i_k = nl.arange(128)[:, None]
    i_m = nl.arange(128)[None, :]
    i_n = nl.arange(512)[None, :]
    res_psum = nl.zeros((128, 512), nl.float32, buffer=nl.psum)
    for k in nl.affine_range(K // 128):
        lhsT_tile = nl.load(lhsT[k * 128 + i_k, m * 128 + i_m])
        rhs_tile = nl.load(rhs[k * 128 + i_k, n * 512 + i_n])
        res_psum += nisa.nc_matmul(lhsT_tile, rhs_tile)
    i_p = nl.arange(128)[:, None]
    nl.store(result[m * 128 + i_p, n * 512 + i_n], value=res_psum)


def reference_matmul(lhsT, rhs, dtype=None):
    out = lhsT.astype(np.float32).T @ rhs.astype(np.float32)
    return out.astype(dtype or lhsT.dtype)


if __name__ == "__main__":
    lhsT = np.random.rand(256, 128).astype(np.float32)
    rhs = np.random.rand(256, 512).astype(np.float32)
    res = np.zeros((128, 512), np.float32)
    nki.simulate_kernel(nki_matmul_tiled_, lhsT, rhs, res)
    assert np.allclose(res, reference_matmul(lhsT, rhs), rtol=1e-5, atol=1e-4)
    print("OK")
