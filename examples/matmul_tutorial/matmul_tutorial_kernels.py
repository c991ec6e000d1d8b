"""The NKI matrix-multiplication tutorial's four kernels, in the new NKI dialect (``import nki``) as the
nki-samples tutorial writes them: ``nisa.dma_copy`` loads and stores, ``nisa.nc_matmul(dst=psum, ...)``
accumulating over K in PSUM, ``nisa.tensor_copy`` evictions. No nsim imports: they run unchanged on nsim after
``nsim.compat.install()`` (or under ``python -m nsim run``). The Beta-1 twin (``neuronxcc.nki``, value
semantics, ``nl.mgrid``) is ``matmul_tutorial_beta1.py``.

    result[M, N] = lhsT[K, M].T @ rhs[K, N]     (bf16 in, fp32 PSUM accumulation, bf16 out)

The progression (the tutorial's size: lhsT [K=8192, M=4096], rhs [K=8192, N=8192]):

1. ``nki_matmul_tiled_``: output tiles of TILE_M = 128 x TILE_N = 512, K in TILE_K = 128 steps; both
   operand tiles are loaded inside the innermost (K) loop, so every lhsT tile is loaded N / 512 times and
   every rhs tile M / 128 times.
2. ``nki_matmul_hoist_load_``: the K column of lhsT tiles of one m is loaded once, outside the n loop; the
   rhs tiles of one (m, n) are loaded before the K loop: loads no longer sit between the matmuls.
3. ``nki_matmul_block_free_dimension_``: the free dimensions M and N are blocked (TILES_IN_BLOCK_M x
   TILES_IN_BLOCK_N output tiles share their operand loads), cutting the rhs reloads by TILES_IN_BLOCK_M.
4. ``nki_matmul_fully_optimized_``: all three dimensions blocked so that the working set fits SBUF: a column
   block of BLOCK_N of the output is accumulated in SBUF over K blocks of BLOCK_K, rhs is loaded once in
   total and lhsT once per N block, and the results leave in [128, BLOCK_N] stores.

Every kernel takes the problem size from its arguments (any multiple of its block sizes), so tests run them
small; the blocking factors are keyword arguments with the tutorial's values as defaults.
"""
import numpy as np

import nki
import nki.isa as nisa
import nki.language as nl

#: The tutorial's problem size: (K, M, N) of lhsT [K, M] and rhs [K, N].
TUTORIAL_SIZE = (8192, 4096, 8192)


@nki.jit
def nki_matmul_tiled_(lhsT, rhs):
    """Step 1: tiled matmul, both operand tiles loaded in the innermost loop."""
    K, M = lhsT.shape
    K_, N = rhs.shape
    assert K == K_, "lhsT and rhs must have the same contraction dimension"
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)

    TILE_M = nl.tile_size.gemm_stationary_fmax  # 128
    TILE_K = nl.tile_size.pmax  # 128
    TILE_N = nl.tile_size.gemm_moving_fmax  # 512

    # Use affine_range to loop over tiles
    for m in nl.affine_range(M // TILE_M):
        for n in nl.affine_range(N // TILE_N):
            # Allocate a tensor in PSUM
            res_psum = nl.ndarray((TILE_M, TILE_N), nl.float32, buffer=nl.psum)

            for k in nl.affine_range(K // TILE_K):
                # Declare the tiles on SBUF
                lhsT_tile = nl.ndarray((TILE_K, TILE_M), dtype=lhsT.dtype, buffer=nl.sbuf)
                rhs_tile = nl.ndarray((TILE_K, TILE_N), dtype=rhs.dtype, buffer=nl.sbuf)

                # Load tiles from lhsT and rhs
                nisa.dma_copy(dst=lhsT_tile, src=lhsT[k * TILE_K:(k + 1) * TILE_K, m * TILE_M:(m + 1) * TILE_M])
                nisa.dma_copy(dst=rhs_tile, src=rhs[k * TILE_K:(k + 1) * TILE_K, n * TILE_N:(n + 1) * TILE_N])

                # Accumulate partial-sums into PSUM
                nisa.nc_matmul(dst=res_psum, stationary=lhsT_tile, moving=rhs_tile, accumulate=k > 0)

            # Copy the result from PSUM back to SBUF, and cast to expected output data-type
            res_sb = nl.ndarray(res_psum.shape, dtype=result.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=res_sb, src=res_psum)

            # Copy the result from SBUF to HBM.
            nisa.dma_copy(dst=result[m * TILE_M:(m + 1) * TILE_M, n * TILE_N:(n + 1) * TILE_N], src=res_sb)

    return result


@nki.jit
def nki_matmul_hoist_load_(lhsT, rhs):
    """Step 2: loads hoisted out of the innermost loop."""
    K, M = lhsT.shape
    K_, N = rhs.shape
    assert K == K_, "lhsT and rhs must have the same contraction dimension"
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)

    TILE_M = nl.tile_size.gemm_stationary_fmax  # 128
    TILE_K = nl.tile_size.pmax  # 128
    TILE_N = nl.tile_size.gemm_moving_fmax  # 512

    # Use affine_range to loop over tiles
    for m in nl.affine_range(M // TILE_M):
        # Load a whole column tiles from lhsT (with K * TILE_M numbers)
        # This corresponds to the whole row in the original lhs
        lhsT_tiles = nl.ndarray((TILE_K, K // TILE_K, TILE_M), dtype=lhsT.dtype, buffer=nl.sbuf)
        for k in nl.affine_range(K // TILE_K):
            nisa.dma_copy(dst=lhsT_tiles[:, k, :], src=lhsT[k * TILE_K:(k + 1) * TILE_K, m * TILE_M:(m + 1) * TILE_M])

        for n in nl.affine_range(N // TILE_N):
            # Load a whole column tiles from rhs (with K * TILE_N numbers)
            rhs_tiles = nl.ndarray((TILE_K, K // TILE_K, TILE_N), dtype=rhs.dtype, buffer=nl.sbuf)
            for k in nl.affine_range(K // TILE_K):
                nisa.dma_copy(dst=rhs_tiles[:, k, :], src=rhs[k * TILE_K:(k + 1) * TILE_K, n * TILE_N:(n + 1) * TILE_N])

            # Allocate a tensor in PSUM
            res_psum = nl.ndarray((TILE_M, TILE_N), nl.float32, buffer=nl.psum)
            for k in nl.affine_range(K // TILE_K):
                # Accumulate partial-sums into PSUM
                nisa.nc_matmul(dst=res_psum, stationary=lhsT_tiles[:, k, :], moving=rhs_tiles[:, k, :],
                               accumulate=k > 0)

            # Copy the result from PSUM back to SBUF, and cast to expected output data-type
            res_sb = nl.ndarray(res_psum.shape, dtype=result.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=res_sb, src=res_psum)
            nisa.dma_copy(dst=result[m * TILE_M:(m + 1) * TILE_M, n * TILE_N:(n + 1) * TILE_N], src=res_sb)

    return result


@nki.jit
def nki_matmul_block_free_dimension_(lhsT, rhs, TILES_IN_BLOCK_M=2, TILES_IN_BLOCK_N=2):
    """Step 3: the free dimensions (M, N) blocked: a block of TILES_IN_BLOCK_M x TILES_IN_BLOCK_N output
    tiles shares its operand loads."""
    K, M = lhsT.shape
    K_, N = rhs.shape
    assert K == K_, "lhsT and rhs must have the same contraction dimension"
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)

    TILE_M = nl.tile_size.gemm_stationary_fmax  # 128
    TILE_K = nl.tile_size.pmax  # 128
    TILE_N = nl.tile_size.gemm_moving_fmax  # 512

    # Configuring the blocking size for the free dimensions
    BLOCK_M = TILE_M * TILES_IN_BLOCK_M  # 256
    BLOCK_N = TILE_N * TILES_IN_BLOCK_N  # 1024

    # the size has to be multiple of block size
    assert M % BLOCK_M == 0
    assert N % BLOCK_N == 0

    # Loop over blocks over the M dimension
    for m in nl.affine_range(M // BLOCK_M):
        # Load TILES_IN_BLOCK_M columns tiles from lhsT
        lhsT_tiles = nl.ndarray((TILE_K, TILES_IN_BLOCK_M, K // TILE_K, TILE_M), dtype=lhsT.dtype, buffer=nl.sbuf)
        for bm in nl.affine_range(TILES_IN_BLOCK_M):
            for k in nl.affine_range(K // TILE_K):
                tm = m * TILES_IN_BLOCK_M + bm  # the lhsT column tile
                nisa.dma_copy(dst=lhsT_tiles[:, bm, k, :],
                              src=lhsT[k * TILE_K:(k + 1) * TILE_K, tm * TILE_M:(tm + 1) * TILE_M])

        for n in nl.affine_range(N // BLOCK_N):
            # Load TILES_IN_BLOCK_N columns from rhs
            rhs_tiles = nl.ndarray((TILE_K, TILES_IN_BLOCK_N, K // TILE_K, TILE_N), dtype=rhs.dtype, buffer=nl.sbuf)
            for bn in nl.affine_range(TILES_IN_BLOCK_N):
                for k in nl.affine_range(K // TILE_K):
                    tn = n * TILES_IN_BLOCK_N + bn  # the rhs column tile
                    nisa.dma_copy(dst=rhs_tiles[:, bn, k, :],
                                  src=rhs[k * TILE_K:(k + 1) * TILE_K, tn * TILE_N:(tn + 1) * TILE_N])

            for bm in nl.affine_range(TILES_IN_BLOCK_M):
                for bn in nl.affine_range(TILES_IN_BLOCK_N):
                    # Allocate a tensor in PSUM
                    res_psum = nl.ndarray((TILE_M, TILE_N), nl.float32, buffer=nl.psum)
                    for k in nl.affine_range(K // TILE_K):
                        # Accumulate partial-sums into PSUM
                        nisa.nc_matmul(dst=res_psum, stationary=lhsT_tiles[:, bm, k, :],
                                       moving=rhs_tiles[:, bn, k, :], accumulate=k > 0)

                    # Copy the result from PSUM back to SBUF, and cast to expected output data-type
                    res_sb = nl.ndarray(res_psum.shape, dtype=result.dtype, buffer=nl.sbuf)
                    nisa.tensor_copy(dst=res_sb, src=res_psum)
                    tm = m * TILES_IN_BLOCK_M + bm  # the output row tile
                    tn = n * TILES_IN_BLOCK_N + bn  # the output column tile
                    nisa.dma_copy(dst=result[tm * TILE_M:(tm + 1) * TILE_M, tn * TILE_N:(tn + 1) * TILE_N], src=res_sb)

    return result


@nki.jit
def nki_matmul_fully_optimized_(lhsT, rhs,
                                # Meta-parameters
                                TILES_IN_BLOCK_M=16, TILES_IN_BLOCK_N=2, TILES_IN_BLOCK_K=8):
    """Step 4: all dimensions blocked to fit SBUF (the tutorial's meta-parameters as defaults)."""
    K, M = lhsT.shape
    K_, N = rhs.shape
    assert K == K_, "lhsT and rhs must have the same contraction dimension"
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)

    TILE_M = nl.tile_size.gemm_stationary_fmax  # 128
    TILE_K = nl.tile_size.pmax  # 128
    TILE_N = nl.tile_size.gemm_moving_fmax  # 512

    BLOCK_M = TILE_M * TILES_IN_BLOCK_M
    BLOCK_N = TILE_N * TILES_IN_BLOCK_N
    BLOCK_K = TILE_K * TILES_IN_BLOCK_K

    # the size has to be multiple of block size
    assert M % BLOCK_M == 0
    assert N % BLOCK_N == 0
    assert K % BLOCK_K == 0

    NUM_BLOCK_M = M // BLOCK_M
    NUM_BLOCK_N = N // BLOCK_N
    NUM_BLOCK_K = K // BLOCK_K

    # Blocking N dimension (the RHS free dimension)
    for n in nl.affine_range(NUM_BLOCK_N):
        # The output column block, accumulated over the K blocks; laid out [128, BLOCK_N] per output row tile
        # so that each row tile leaves in one coalesced store
        result_tiles = nl.ndarray((TILE_M, NUM_BLOCK_M, TILES_IN_BLOCK_M, BLOCK_N), dtype=lhsT.dtype, buffer=nl.sbuf)
        nisa.memset(dst=result_tiles, value=0.0)

        # Blocking K dimension (the contraction dimension)
        # Use `sequential_range` because we do not want the compiler to change this loop by,
        # for example, vectorizing it
        for k in nl.sequential_range(NUM_BLOCK_K):
            # Loading tiles from rhs
            # setting the load tile to `TILE_K x BLOCK_SIZE_N` to optimize DMA performance
            rhs_tiles = nl.ndarray((TILE_K, TILES_IN_BLOCK_K, BLOCK_N), dtype=rhs.dtype, buffer=nl.sbuf)
            for bk_r in nl.affine_range(TILES_IN_BLOCK_K):
                tk = TILES_IN_BLOCK_K * k + bk_r  # the K tile
                nisa.dma_copy(dst=rhs_tiles[:, bk_r, :],
                              src=rhs[tk * TILE_K:(tk + 1) * TILE_K, BLOCK_N * n:BLOCK_N * (n + 1)])

            # Blocking M dimension (the LHS free dimension)
            for m in nl.affine_range(NUM_BLOCK_M):
                # Loading tiles from lhsT
                lhsT_tiles = nl.ndarray((TILE_K, TILES_IN_BLOCK_K, BLOCK_M), dtype=lhsT.dtype, buffer=nl.sbuf)
                for bk_l in nl.affine_range(TILES_IN_BLOCK_K):
                    tk = TILES_IN_BLOCK_K * k + bk_l  # the K tile
                    nisa.dma_copy(dst=lhsT_tiles[:, bk_l, :],
                                  src=lhsT[tk * TILE_K:(tk + 1) * TILE_K, BLOCK_M * m:BLOCK_M * (m + 1)])

                # Do matmul with all tiles in the blocks
                for bn in nl.affine_range(TILES_IN_BLOCK_N):
                    for bm in nl.affine_range(TILES_IN_BLOCK_M):
                        res_tile = nl.ndarray((TILE_M, TILE_N), dtype=nl.float32, buffer=nl.psum)
                        for bk in nl.affine_range(TILES_IN_BLOCK_K):
                            nisa.nc_matmul(dst=res_tile, stationary=lhsT_tiles[:, bk, bm * TILE_M:(bm + 1) * TILE_M],
                                           moving=rhs_tiles[:, bk, bn * TILE_N:(bn + 1) * TILE_N], accumulate=bk > 0)

                        # Accumulate partial-sums into result_tiles
                        acc = result_tiles[:, m, bm, bn * TILE_N:(bn + 1) * TILE_N]
                        nisa.tensor_tensor(dst=acc, data1=acc, data2=res_tile, op=nl.add)

        # Copying the result from SBUF to HBM, one [TILE_M, BLOCK_N] row of tiles per store
        for m in nl.affine_range(NUM_BLOCK_M):
            for bm in nl.affine_range(TILES_IN_BLOCK_M):
                nisa.dma_copy(dst=result[(TILES_IN_BLOCK_M * m + bm) * TILE_M:(TILES_IN_BLOCK_M * m + bm + 1) * TILE_M,
                                         BLOCK_N * n:BLOCK_N * (n + 1)],
                              src=result_tiles[:, m, bm, :])

    return result


#: The progression, in the tutorial's order: (name, kernel).
STEPS = [
    ("tiled", nki_matmul_tiled_),
    ("hoist_load", nki_matmul_hoist_load_),
    ("block_free_dimension", nki_matmul_block_free_dimension_),
    ("fully_optimized", nki_matmul_fully_optimized_),
]


def reference(lhsT, rhs):
    """fp32 numpy reference: lhsT.T @ rhs."""
    return lhsT.astype(np.float32).T @ rhs.astype(np.float32)


def make_inputs(seed=0, K=512, M=256, N=1024, dtype=None):
    """lhsT [K, M], rhs [K, N] (bf16 by default), N(0, 1)."""
    if dtype is None:
        import ml_dtypes
        dtype = ml_dtypes.bfloat16
    rng = np.random.default_rng(seed)
    return rng.standard_normal((K, M)).astype(dtype), rng.standard_normal((K, N)).astype(dtype)
