"""Kernels in the style of Stanford CS149's assignment 4 for Trainium2 (the course's starter code and the
students' solutions, e.g. github tianyeeT/cs149-asst4-trainium2): the vector-add progression of part 1
(``vector_add_naive``, ``vector_add_tiled``, ``vector_add_stream``, and a ``nl.ds`` variant), a tiled matrix
transpose (``matrix_transpose_naive``, ``matrix_transpose``, ``matrix_transpose_blocked``) and the fused
conv2d + max-pool of part 2 (``fused_conv2d_maxpool``, with the first per-row attempt
``fused_conv2d_maxpool_per_row``).

Written from memory of that assignment, in its style (Beta-1 dialect: ``neuronxcc.nki``, ``nl.load`` /
``nl.store``, ``nl.affine_range``, ``nl.mgrid`` index tiles, ``nl.ndarray(..., buffer=nl.hbm)`` outputs,
``par_dim`` block tensors, TODO-style comments); these are not copies of the published code. No nsim imports:
run them with ``nsim.compat.install()`` first (or ``python -m nsim run``)."""
import numpy as np

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl


# ---------------------------------------------------------------------------------------------------------
# Part 1: vector add
# ---------------------------------------------------------------------------------------------------------

@nki.jit
def vector_add_naive(a_vec, b_vec):
    # Allocate space for the output vector in HBM
    out = nl.ndarray(shape=a_vec.shape, dtype=a_vec.dtype, buffer=nl.hbm)

    # Load the input vectors from HBM into variables stored in SBUF
    a = nl.load(a_vec)
    b = nl.load(b_vec)

    # Add the input vectors
    res = nl.add(a, b)

    # Store the result into HBM
    nl.store(out, value=res)

    return out


@nki.jit
def vector_add_tiled(a_vec, b_vec):
    # Allocate space for the output vector in HBM
    out = nl.ndarray(shape=a_vec.shape, dtype=a_vec.dtype, buffer=nl.hbm)

    # Get the total number of vector rows
    M = a_vec.shape[0]

    # TODO: You should modify this variable for Step 1
    ROW_CHUNK = 128

    # Loop over the total number of chunks, we can use affine_range
    # because there are no loop-carried dependencies
    for m in nl.affine_range(M // ROW_CHUNK):

        # Allocate row-chunk sized tiles for the input vectors
        a_tile = nl.ndarray((ROW_CHUNK, 1), dtype=a_vec.dtype, buffer=nl.sbuf)
        b_tile = nl.ndarray((ROW_CHUNK, 1), dtype=b_vec.dtype, buffer=nl.sbuf)

        # Load a chunk of rows
        a_tile[...] = nl.load(a_vec[m * ROW_CHUNK : (m + 1) * ROW_CHUNK])
        b_tile[...] = nl.load(b_vec[m * ROW_CHUNK : (m + 1) * ROW_CHUNK])

        # Add the row chunks together
        res = nl.add(a_tile, b_tile)

        # Store the result chunk into HBM
        nl.store(out[m * ROW_CHUNK : (m + 1) * ROW_CHUNK], value=res)

    return out


@nki.jit
def vector_add_stream(a_vec, b_vec):
    # Get the total number of vector rows
    M = a_vec.shape[0]

    # TODO: You should modify this variable for Step 2a
    FREE_DIM = 512

    # The maximum size of our Partition Dimension
    PARTITION_DIM = 128

    # The total size of each tile
    TILE_M = PARTITION_DIM * FREE_DIM

    # Reshape the the input vectors
    a_vec_re = a_vec.reshape((M // TILE_M, PARTITION_DIM, FREE_DIM))
    b_vec_re = b_vec.reshape((M // TILE_M, PARTITION_DIM, FREE_DIM))

    # Allocate space for the reshaped output vector in HBM
    out = nl.ndarray(shape=a_vec_re.shape, dtype=a_vec_re.dtype, buffer=nl.hbm)

    # Loop over the total number of tiles
    for m in nl.affine_range(M // TILE_M):

        # Allocate space for a reshaped tile
        a_tile = nl.ndarray((PARTITION_DIM, FREE_DIM), dtype=a_vec.dtype, buffer=nl.sbuf)
        b_tile = nl.ndarray((PARTITION_DIM, FREE_DIM), dtype=a_vec.dtype, buffer=nl.sbuf)

        # Load the input tiles
        a_tile = nl.load(a_vec_re[m])
        b_tile = nl.load(b_vec_re[m])

        # Add the tiles together
        res = nl.add(a_tile, b_tile)

        # Store the result tile into HBM
        nl.store(out[m], value=res)

    # Reshape the output vector into its original shape
    out = out.reshape((M,))

    return out


@nki.jit
def vector_add_ds(a_vec, b_vec):
    # Same as vector_add_stream, but the vector is viewed as one (128, M // 128) matrix
    # and we walk its free dimension in FREE_DIM-wide windows with nl.ds
    M = a_vec.shape[0]
    PARTITION_DIM = nl.tile_size.pmax
    FREE_DIM = 2048
    n_cols = M // PARTITION_DIM
    assert n_cols % FREE_DIM == 0

    a_mat = a_vec.reshape((PARTITION_DIM, n_cols))
    b_mat = b_vec.reshape((PARTITION_DIM, n_cols))
    out = nl.ndarray(shape=(PARTITION_DIM, n_cols), dtype=a_vec.dtype, buffer=nl.shared_hbm)

    for j in nl.affine_range(n_cols // FREE_DIM):
        a_tile = nl.load(a_mat[:, nl.ds(j * FREE_DIM, FREE_DIM)])
        b_tile = nl.load(b_mat[:, nl.ds(j * FREE_DIM, FREE_DIM)])
        nl.store(out[:, nl.ds(j * FREE_DIM, FREE_DIM)], value=a_tile + b_tile)

    return out.reshape((M,))


# ---------------------------------------------------------------------------------------------------------
# Matrix transpose
# ---------------------------------------------------------------------------------------------------------

@nki.jit
def matrix_transpose_naive(a_tensor):
    # First attempt: one 128 x 128 tile at a time, addressed with index tiles,
    # transposed on the Tensor Engine with nl.transpose (result in PSUM)
    M, N = a_tensor.shape
    out = nl.ndarray((N, M), dtype=a_tensor.dtype, buffer=nl.hbm)
    TILE = nl.tile_size.pmax

    i_p, i_f = nl.mgrid[0:TILE, 0:TILE]
    for m in nl.affine_range(M // TILE):
        for n in nl.affine_range(N // TILE):
            a_tile = nl.load(a_tensor[m * TILE + i_p, n * TILE + i_f])
            a_t = nl.transpose(a_tile)
            # copy out of PSUM before storing
            out_tile = nl.copy(a_t, dtype=a_tensor.dtype)
            nl.store(out[n * TILE + i_p, m * TILE + i_f], value=out_tile)

    return out


@nki.jit
def matrix_transpose(a_tensor):
    M, N = a_tensor.shape
    out = nl.ndarray((N, M), dtype=a_tensor.dtype, buffer=nl.hbm)
    tile_dim = nl.tile_size.pmax

    assert M % tile_dim == N % tile_dim == 0, "Matrix dimensions not divisible by tile dimension!"

    for m in nl.affine_range(M // tile_dim):
        for n in nl.affine_range(N // tile_dim):
            a_tile = nl.load(a_tensor[m * tile_dim:(m + 1) * tile_dim, n * tile_dim:(n + 1) * tile_dim])
            a_t_psum = nisa.nc_transpose(a_tile)
            a_t_sbuf = nl.copy(a_t_psum, dtype=a_tensor.dtype)
            nl.store(out[n * tile_dim:(n + 1) * tile_dim, m * tile_dim:(m + 1) * tile_dim], value=a_t_sbuf)

    return out


@nki.jit
def matrix_transpose_blocked(a_tensor):
    # Optimized: load a whole 128-row stripe of the input with one DMA, transpose its
    # 128 x 128 blocks into one SBUF stripe of the output, and store it with one DMA
    M, N = a_tensor.shape
    out = nl.ndarray((N, M), dtype=a_tensor.dtype, buffer=nl.hbm)
    TILE = nl.tile_size.pmax
    n_tiles_n = N // TILE

    for m in nl.affine_range(M // TILE):
        stripe = nl.load(a_tensor[m * TILE:(m + 1) * TILE, :])
        # block dims first: stripe_t[n] is the transpose of block n of the stripe
        stripe_t = nl.ndarray((n_tiles_n, nl.par_dim(TILE), TILE), dtype=a_tensor.dtype, buffer=nl.sbuf)
        for n in nl.affine_range(n_tiles_n):
            stripe_t[n] = nisa.nc_transpose(stripe[:, n * TILE:(n + 1) * TILE])
        for n in nl.affine_range(n_tiles_n):
            nl.store(out[n * TILE:(n + 1) * TILE, m * TILE:(m + 1) * TILE], value=stripe_t[n])

    return out


# ---------------------------------------------------------------------------------------------------------
# Part 2: fused conv2d + max-pool
# ---------------------------------------------------------------------------------------------------------

def _rows_per_block(out_height, out_width, pool_size):
    # the largest number of output rows whose pixels fit in one PSUM bank (512 fp32),
    # dividing out_height, and a multiple of the pool size
    best = pool_size
    for r in range(pool_size, out_height + 1, pool_size):
        if out_height % r == 0 and r * out_width <= nl.tile_size.gemm_moving_fmax:
            best = r
    return best


@nki.jit
def fused_conv2d_maxpool(X, W, bias, pool_size=1):

    batch_size, in_channels, input_height, input_width = X.shape
    out_channels, in_channels_, filter_height, filter_width = W.shape
    out_channels_ = bias.shape[0]

    assert (
        in_channels_ == in_channels and out_channels_ == out_channels
    ), f"Shape mismatch. {in_channels}, {in_channels_}, {out_channels}, {out_channels_}"

    out_height = input_height - filter_height + 1
    out_width = input_width - filter_width + 1

    out_pool_height = out_height // pool_size
    out_pool_width = out_width // pool_size

    # Can assume multiple of 128 to avoid using mask
    assert in_channels % 128 == 0

    # Can assume one PSUM bank can at least fit one row of the pixels
    assert nl.tile_size.gemm_moving_fmax >= out_width

    # Initialize output array
    X_out = nl.ndarray(
        shape=(batch_size, out_channels, out_pool_height, out_pool_width),
        dtype=X.dtype,
        buffer=nl.hbm,
    )

    # Various tiling dimensions
    c_in_pmax = nl.tile_size.pmax
    n_tiles_c_in = in_channels // c_in_pmax
    c_out_pmax = min(nl.tile_size.pmax, out_channels)
    n_tiles_c_out = out_channels // c_out_pmax
    assert out_channels % c_out_pmax == 0

    # output rows computed by one matmul group (their pixels share one PSUM bank)
    rows = _rows_per_block(out_height, out_width, pool_size)
    n_row_blocks = out_height // rows
    in_rows = rows + filter_height - 1

    # ---- load the weights once: W[c_out, c_in, kh, kw], c_out on the partitions
    W_sbuf = nl.ndarray((n_tiles_c_out, nl.par_dim(c_out_pmax), in_channels, filter_height, filter_width),
                        dtype=W.dtype, buffer=nl.sbuf)
    for out_tile in nl.affine_range(n_tiles_c_out):
        W_sbuf[out_tile] = nl.load(W[out_tile * c_out_pmax:(out_tile + 1) * c_out_pmax, :, :, :])

    # ---- transpose them once: W_T[kh, kw, out_tile, in_tile] is [c_in (partitions), c_out]
    W_T = nl.ndarray((filter_height, filter_width, n_tiles_c_out, n_tiles_c_in, nl.par_dim(c_in_pmax), c_out_pmax),
                     dtype=W.dtype, buffer=nl.sbuf)
    for kh in nl.affine_range(filter_height):
        for kw in nl.affine_range(filter_width):
            for out_tile in nl.affine_range(n_tiles_c_out):
                for in_tile in nl.affine_range(n_tiles_c_in):
                    w_t_psum = nisa.nc_transpose(
                        W_sbuf[out_tile, :, in_tile * c_in_pmax:(in_tile + 1) * c_in_pmax, kh, kw])
                    W_T[kh, kw, out_tile, in_tile] = nl.copy(w_t_psum, dtype=W.dtype)

    # ---- bias, one value per output channel (partition)
    bias_re = bias.reshape((n_tiles_c_out, c_out_pmax, 1))
    bias_sbuf = nl.ndarray((n_tiles_c_out, nl.par_dim(c_out_pmax), 1), dtype=nl.float32, buffer=nl.sbuf)
    for out_tile in nl.affine_range(n_tiles_c_out):
        bias_sbuf[out_tile] = nl.load(bias_re[out_tile], dtype=nl.float32)

    # Process the images in batches
    for b in nl.affine_range(batch_size):
        for rb in nl.affine_range(n_row_blocks):
            # input rows rb * rows ... rb * rows + in_rows - 1 of every input channel
            x = nl.ndarray((n_tiles_c_in, nl.par_dim(c_in_pmax), in_rows, input_width), dtype=X.dtype,
                           buffer=nl.sbuf)
            for in_tile in nl.affine_range(n_tiles_c_in):
                x[in_tile] = nl.load(X[b, in_tile * c_in_pmax:(in_tile + 1) * c_in_pmax,
                                       rb * rows:rb * rows + in_rows, :])

            for out_tile in nl.affine_range(n_tiles_c_out):
                res_psum = nl.zeros((c_out_pmax, rows, out_width), nl.float32, buffer=nl.psum)
                for kh in nl.affine_range(filter_height):
                    for kw in nl.affine_range(filter_width):
                        for in_tile in nl.affine_range(n_tiles_c_in):
                            # shifted window: output pixel (r, c) reads input pixel (r + kh, c + kw)
                            res_psum += nisa.nc_matmul(W_T[kh, kw, out_tile, in_tile],
                                                       x[in_tile, :, kh:kh + rows, kw:kw + out_width])

                # bias add while evacuating PSUM
                conv = nisa.tensor_scalar(res_psum, np.add, bias_sbuf[out_tile], dtype=X.dtype)

                if pool_size > 1:
                    i_0, i_1, i_2, i_3, i_4 = nl.mgrid[0:c_out_pmax, 0:rows // pool_size, 0:pool_size,
                                                       0:out_pool_width, 0:pool_size]
                    pooled = nl.max(conv[i_0, pool_size * i_1 + i_2, pool_size * i_3 + i_4], axis=[2, 4])
                    nl.store(X_out[b, out_tile * c_out_pmax:(out_tile + 1) * c_out_pmax,
                                   rb * (rows // pool_size):(rb + 1) * (rows // pool_size), :], value=pooled)
                else:
                    nl.store(X_out[b, out_tile * c_out_pmax:(out_tile + 1) * c_out_pmax,
                                   rb * rows:(rb + 1) * rows, :], value=conv)

    return X_out


@nki.jit
def fused_conv2d_maxpool_per_row(X, W, bias):
    # First working attempt (no pooling): the input image and the weights are loaded whole,
    # every output row is its own PSUM accumulation of KH * KW * n_tiles_c_in matmuls of
    # out_width columns, and each row is stored on its own
    batch_size, in_channels, input_height, input_width = X.shape
    out_channels, _, filter_height, filter_width = W.shape
    out_height = input_height - filter_height + 1
    out_width = input_width - filter_width + 1
    assert in_channels % 128 == 0 and out_channels <= 128

    X_out = nl.ndarray((batch_size, out_channels, out_height, out_width), dtype=X.dtype, buffer=nl.hbm)
    c_in_pmax = nl.tile_size.pmax
    n_tiles_c_in = in_channels // c_in_pmax

    W_sbuf = nl.load(W)  # (out_channels, in_channels, KH, KW)
    W_T = nl.ndarray((filter_height, filter_width, n_tiles_c_in, nl.par_dim(c_in_pmax), out_channels),
                     dtype=W.dtype, buffer=nl.sbuf)
    for kh in nl.affine_range(filter_height):
        for kw in nl.affine_range(filter_width):
            for in_tile in nl.affine_range(n_tiles_c_in):
                W_T[kh, kw, in_tile] = nl.copy(
                    nl.transpose(W_sbuf[:, in_tile * c_in_pmax:(in_tile + 1) * c_in_pmax, kh, kw]),
                    dtype=W.dtype)
    bias_sbuf = nl.load(bias.reshape((out_channels, 1)))

    for b in nl.affine_range(batch_size):
        x = nl.ndarray((n_tiles_c_in, nl.par_dim(c_in_pmax), input_height, input_width), dtype=X.dtype,
                       buffer=nl.sbuf)
        for in_tile in nl.affine_range(n_tiles_c_in):
            x[in_tile] = nl.load(X[b, in_tile * c_in_pmax:(in_tile + 1) * c_in_pmax])
        for r in nl.affine_range(out_height):
            row_psum = nl.zeros((out_channels, out_width), nl.float32, buffer=nl.psum)
            for kh in nl.affine_range(filter_height):
                for kw in nl.affine_range(filter_width):
                    for in_tile in nl.affine_range(n_tiles_c_in):
                        row_psum += nl.matmul(W_T[kh, kw, in_tile], x[in_tile, :, r + kh, kw:kw + out_width],
                                              transpose_x=True)
            row = nl.add(row_psum, bias_sbuf, dtype=X.dtype)
            nl.store(X_out[b, :, r, :], value=row)

    return X_out
