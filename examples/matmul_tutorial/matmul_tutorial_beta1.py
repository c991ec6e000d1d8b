"""The NKI matrix-multiplication tutorial's four kernels in the Beta-1 dialect (``neuronxcc.nki``), as the
tutorial of the Neuron SDK 2.x docs writes them: value-returning ``nl.load`` / ``nl.matmul``, ``+=``
accumulation into PSUM, ``nl.par_dim`` block dimensions and ``nl.mgrid`` indices. No nsim imports: they run
unchanged on nsim after ``nsim.compat.install()`` (or under ``python -m nsim run``).

The same progression in the new dialect, with the explanation of each step, is
``matmul_tutorial_kernels.py`` beside this file (the one the timing test and ``run_tutorial.py`` use:
it traces much faster at the tutorial's size). ``reference``, ``make_inputs``, ``TUTORIAL_SIZE`` and
``STEPS`` are defined as in that file.
"""
import numpy as np

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl

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

    # Define the indices (shape) of the tiles
    i_lhsT = nl.mgrid[0:TILE_K, 0:TILE_M]
    i_rhs = nl.mgrid[0:TILE_K, 0:TILE_N]
    i_res = nl.mgrid[0:TILE_M, 0:TILE_N]

    # Use affine_range to loop over tiles
    for m in nl.affine_range(M // TILE_M):
        # Load a whole column tiles from lhsT (with K * TILE_M numbers)
        # This corresponds to the whole row in the original lhs
        lhsT_tiles = nl.ndarray((K // TILE_K, nl.par_dim(TILE_K), TILE_M), dtype=lhsT.dtype, buffer=nl.sbuf)
        for k in nl.affine_range(K // TILE_K):
            # use `.p` for partition dimension and `.x` for the first free dimension
            lhsT_tiles[k, i_lhsT.p, i_lhsT.x] = nl.load(lhsT[k * TILE_K + i_lhsT.p, m * TILE_M + i_lhsT.x])

        for n in nl.affine_range(N // TILE_N):
            # Load a whole column tiles from rhs (with K * TILE_N numbers)
            rhs_tiles = nl.ndarray((K // TILE_K, nl.par_dim(TILE_K), TILE_N), dtype=rhs.dtype, buffer=nl.sbuf)
            for k in nl.affine_range(K // TILE_K):
                rhs_tiles[k, i_rhs.p, i_rhs.x] = nl.load(rhs[k * TILE_K + i_rhs.p, n * TILE_N + i_rhs.x])

            # Allocate a tile in PSUM for the result
            res_psum = nl.zeros((TILE_M, TILE_N), nl.float32, buffer=nl.psum)
            for k in nl.affine_range(K // TILE_K):
                # Accumulate partial-sums into PSUM
                res_psum[...] += nl.matmul(lhsT_tiles[k, i_lhsT.p, i_lhsT.x], rhs_tiles[k, i_rhs.p, i_rhs.x],
                                           transpose_x=True)

            # Copy the result from PSUM back to SBUF, and cast to expected output data-type
            res_sb = nl.copy(res_psum, dtype=result.dtype)
            nl.store(result[m * TILE_M + i_res.p, n * TILE_N + i_res.x], value=res_sb)

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

    i_lhsT = nl.mgrid[0:TILE_K, 0:TILE_M]
    i_rhs = nl.mgrid[0:TILE_K, 0:TILE_N]
    i_res = nl.mgrid[0:TILE_M, 0:TILE_N]

    # Configuring the blocking size for the free dimensions
    BLOCK_M = TILE_M * TILES_IN_BLOCK_M  # 256
    BLOCK_N = TILE_N * TILES_IN_BLOCK_N  # 1024

    # the size has to be multiple of block size
    assert M % BLOCK_M == 0
    assert N % BLOCK_N == 0

    # Loop over blocks over the M dimension
    for m in nl.affine_range(M // BLOCK_M):
        # Load TILES_IN_BLOCK_M columns tiles from lhsT
        lhsT_tiles = nl.ndarray((TILES_IN_BLOCK_M, K // TILE_K, nl.par_dim(TILE_K), TILE_M), dtype=lhsT.dtype,
                                buffer=nl.sbuf)
        for bm in nl.affine_range(TILES_IN_BLOCK_M):
            for k in nl.affine_range(K // TILE_K):
                lhsT_tiles[bm, k, i_lhsT.p, i_lhsT.x] = nl.load(
                    lhsT[k * TILE_K + i_lhsT.p, (m * TILES_IN_BLOCK_M + bm) * TILE_M + i_lhsT.x])

        for n in nl.affine_range(N // BLOCK_N):
            # Load TILES_IN_BLOCK_N columns from rhs
            rhs_tiles = nl.ndarray((TILES_IN_BLOCK_N, K // TILE_K, nl.par_dim(TILE_K), TILE_N), dtype=rhs.dtype,
                                   buffer=nl.sbuf)
            for bn in nl.affine_range(TILES_IN_BLOCK_N):
                for k in nl.affine_range(K // TILE_K):
                    rhs_tiles[bn, k, i_rhs.p, i_rhs.x] = nl.load(
                        rhs[k * TILE_K + i_rhs.p, (n * TILES_IN_BLOCK_N + bn) * TILE_N + i_rhs.x])

            for bm in nl.affine_range(TILES_IN_BLOCK_M):
                for bn in nl.affine_range(TILES_IN_BLOCK_N):
                    # Allocate a tensor in PSUM
                    res_psum = nl.zeros((TILE_M, TILE_N), nl.float32, buffer=nl.psum)
                    for k in nl.affine_range(K // TILE_K):
                        # Accumulate partial-sums into PSUM
                        res_psum += nl.matmul(lhsT_tiles[bm, k, i_lhsT.p, i_lhsT.x],
                                              rhs_tiles[bn, k, i_rhs.p, i_rhs.x], transpose_x=True)

                    # Copy the result from PSUM back to SBUF, and cast to expected output data-type
                    res_sb = nl.copy(res_psum, dtype=result.dtype)
                    nl.store(result[(m * TILES_IN_BLOCK_M + bm) * TILE_M + i_res.p,
                                    (n * TILES_IN_BLOCK_N + bn) * TILE_N + i_res.x], value=res_sb)

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
        result_tiles = nl.zeros((NUM_BLOCK_M, TILES_IN_BLOCK_M, TILES_IN_BLOCK_N, nl.par_dim(TILE_M), TILE_N),
                                dtype=lhsT.dtype, buffer=nl.sbuf)

        # Blocking K dimension (the contraction dimension)
        # Use `sequential_range` because we do not want the compiler to change this loop by,
        # for example, vectorizing it
        for k in nl.sequential_range(NUM_BLOCK_K):
            # Loading tiles from rhs
            # setting the load tile to `TILE_K x BLOCK_SIZE_N` to optimize DMA performance
            i_rhs = nl.mgrid[0:TILE_K, 0:BLOCK_N]
            rhs_tiles = nl.ndarray((TILES_IN_BLOCK_K, nl.par_dim(TILE_K), BLOCK_N), dtype=rhs.dtype, buffer=nl.sbuf)

            for bk_r in nl.affine_range(TILES_IN_BLOCK_K):
                rhs_tiles[bk_r, i_rhs.p, i_rhs.x] = nl.load(
                    rhs[(TILES_IN_BLOCK_K * k + bk_r) * TILE_K + i_rhs.p, BLOCK_N * n + i_rhs.x])

            # Blocking M dimension (the LHS free dimension)
            for m in nl.affine_range(NUM_BLOCK_M):
                # Loading tiles from lhsT
                i_lhsT = nl.mgrid[0:TILE_K, 0:BLOCK_M]
                lhsT_tiles = nl.ndarray((TILES_IN_BLOCK_K, nl.par_dim(TILE_K), BLOCK_M), dtype=lhsT.dtype,
                                        buffer=nl.sbuf)
                for bk_l in nl.affine_range(TILES_IN_BLOCK_K):
                    lhsT_tiles[bk_l, i_lhsT.p, i_lhsT.x] = nl.load(
                        lhsT[(TILES_IN_BLOCK_K * k + bk_l) * TILE_K + i_lhsT.p, BLOCK_M * m + i_lhsT.x])

                # Do matmul with all tiles in the blocks
                i_lhsT_mm = nl.mgrid[0:TILE_K, 0:TILE_M]
                i_rhs_mm = nl.mgrid[0:TILE_K, 0:TILE_N]
                i_res_mm = nl.mgrid[0:TILE_M, 0:TILE_N]
                for bn in nl.affine_range(TILES_IN_BLOCK_N):
                    for bm in nl.affine_range(TILES_IN_BLOCK_M):
                        res_tile = nl.zeros((TILE_M, TILE_N), dtype=nl.float32, buffer=nl.psum)

                        for bk in nl.affine_range(TILES_IN_BLOCK_K):
                            res_tile[...] += nisa.nc_matmul(lhsT_tiles[bk, i_lhsT_mm.p, bm * TILE_M + i_lhsT_mm.x],
                                                            rhs_tiles[bk, i_rhs_mm.p, bn * TILE_N + i_rhs_mm.x])

                        # Accumulate partial-sums into result_tiles
                        result_tiles[m, bm, bn, i_res_mm.p, i_res_mm.x] += res_tile[i_res_mm.p, i_res_mm.x]

        # Copying the result from SBUF to HBM
        for m in nl.affine_range(NUM_BLOCK_M):
            for bm in nl.affine_range(TILES_IN_BLOCK_M):
                i_res = nl.mgrid[0:TILE_M, 0:TILE_N]
                i_res_packed = nl.mgrid[0:TILE_M, 0:BLOCK_N]
                result_packed = nl.ndarray((TILE_M, BLOCK_N), dtype=result_tiles.dtype, buffer=nl.sbuf)

                # coalesce result tiles for better DMA performance
                for bn in nl.affine_range(TILES_IN_BLOCK_N):
                    result_packed[i_res.p, bn * TILE_N + i_res.x] = nl.copy(result_tiles[m, bm, bn, i_res.p, i_res.x])
                nl.store(result[(TILES_IN_BLOCK_M * m + bm) * TILE_M + i_res_packed.p, BLOCK_N * n + i_res_packed.x],
                         value=result_packed[i_res_packed.p, i_res_packed.x])

    return result


#: The progression, in the tutorial's order.
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
