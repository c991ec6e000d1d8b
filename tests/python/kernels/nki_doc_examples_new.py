"""The "Example" snippets of the NKI API reference in the new dialect (``import nki``, NKI 0.2-0.6 pages of Neuron SDK
2.27+: ``nki.isa.*`` calls that write ``dst=``, ``nl.ndarray`` buffers, ``nisa.dma_copy`` between HBM and SBUF),
each embedded in the smallest kernel that gives it its inputs (the names the snippet assumes become kernel
arguments) and returns its results in ``nl.shared_hbm`` tensors.

Written from memory of the published pages; the snippet bodies are kept as the pages write them (comments,
names, 4-space indentation). Where a line could not be recalled exactly it is written the way the surrounding
page writes NKI; the test module's docstring lists those places. No nsim imports: ``import nki`` is resolved by
``nsim.compat``.
"""
import numpy as np

import nki
import nki.isa as nisa
import nki.language as nl


# nki.isa.iota
@nki.jit
def nki_iota():
    a_out = nl.ndarray((1, 512), dtype=nl.int32, buffer=nl.shared_hbm)
    b_out = nl.ndarray((128, 1), dtype=nl.int32, buffer=nl.shared_hbm)
    d_out = nl.ndarray((128, 512), dtype=nl.int32, buffer=nl.shared_hbm)
    e_out = nl.ndarray((128, 4, 8), dtype=nl.float32, buffer=nl.shared_hbm)
    ##################################################################
    # Example 1: Generate tile a of 512 constant values in SBUF partition 0
    # that start at 0 and increment by 1:
    ##################################################################
    # a = [0, 1, ..., 511]
    a = nl.ndarray((1, 512), dtype=nl.int32, buffer=nl.sbuf)
    nisa.iota(dst=a, pattern=[[1, 512]], offset=0)

    ##################################################################
    # Example 2: Generate tile b of 128 constant values across SBUF partitions
    # that start at 0 and increment by 1, with one value per partition:
    ##################################################################
    # b = [[0], [1], ..., [127]]
    b = nl.ndarray((128, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.iota(dst=b, pattern=[[0, 1]], offset=0, channel_multiplier=1)

    ##################################################################
    # Example 3: Generate tile d of 128 x 512 constant values in SBUF
    # that start at 0 and increment by 1 in row-major order:
    ##################################################################
    d = nl.ndarray((128, 512), dtype=nl.int32, buffer=nl.sbuf)
    nisa.iota(dst=d, pattern=[[1, 512]], offset=0, channel_multiplier=512)

    ##################################################################
    # Example 4: A two-level pattern with an offset, written to a float32
    # tile: e[p, i, j] = 100 + 2 * p - 8 * i + j
    ##################################################################
    e = nl.ndarray((128, 4, 8), dtype=nl.float32, buffer=nl.sbuf)
    nisa.iota(dst=e, pattern=[[-8, 4], [1, 8]], offset=100, channel_multiplier=2)

    nisa.dma_copy(dst=a_out, src=a)
    nisa.dma_copy(dst=b_out, src=b)
    nisa.dma_copy(dst=d_out, src=d)
    nisa.dma_copy(dst=e_out, src=e)
    return a_out, b_out, d_out, e_out


# nki.isa.affine_select
@nki.jit
def nki_affine_select(a_tensor):
    b_tensor = nl.ndarray((128, 128), dtype=a_tensor.dtype, buffer=nl.shared_hbm)
    a = nl.ndarray((128, 128), dtype=a_tensor.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=a, src=a_tensor)
    ##################################################################
    # Example 1: Take tile a of shape [128, 128] and replace its
    # upper triangle with -9984.0: keep a[p, j] where p - j >= 0
    ##################################################################
    b = nl.ndarray((128, 128), dtype=a.dtype, buffer=nl.sbuf)
    nisa.affine_select(dst=b, pattern=[[-1, 128]], channel_multiplier=1,
                       on_true_tile=a, on_false_value=-9984.0,
                       cmp_op=nl.greater_equal, offset=0)
    nisa.dma_copy(dst=b_tensor, src=b)
    return b_tensor


# nki.isa.tensor_tensor_scan
@nki.jit
def nki_tensor_tensor_scan(a_tensor, b_tensor):
    c_tensor = nl.ndarray(a_tensor.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    a = nl.ndarray((128, 1024), dtype=a_tensor.dtype, buffer=nl.sbuf)
    b = nl.ndarray((128, 1024), dtype=b_tensor.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=a, src=a_tensor)
    nisa.dma_copy(dst=b, src=b_tensor)
    ##################################################################
    # Example 1: scan two tiles, a and b, of the same
    # shape (128, 1024) using multiply/add and get
    # the scan result in tile c
    ##################################################################
    c = nl.ndarray(shape=(128, 1024), dtype=nl.float32, buffer=nl.sbuf)

    nisa.tensor_tensor_scan(dst=c[:, 0:512], data0=a[:, 0:512], data1=b[:, 0:512],
                            initial=0, op0=nl.multiply, op1=nl.add)

    nisa.tensor_tensor_scan(dst=c[:, 512:1024], data0=a[:, 512:1024], data1=b[:, 512:1024],
                            initial=c[:, 511], op0=nl.multiply, op1=nl.add)

    nisa.dma_copy(dst=c_tensor, src=c)
    return c_tensor


# nki.isa.tensor_scalar_reduce
@nki.jit
def nki_tensor_scalar_reduce(a_tensor):
    b_tensor = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
    c_tensor = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    a = nl.ndarray((128, 512), dtype=a_tensor.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=a, src=a_tensor)
    ##################################################################
    # Example 1: subtract 1.0 from all elements of tile a of
    # shape (128, 512) and get the output tile in b; the sum of
    # each partition of b goes to c of shape (128, 1)
    ##################################################################
    b = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
    c = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar_reduce(dst=b, data=a, op0=nl.subtract, operand0=1.0,
                              reduce_op=nl.add, reduce_res=c)
    nisa.dma_copy(dst=b_tensor, src=b)
    nisa.dma_copy(dst=c_tensor, src=c)
    return b_tensor, c_tensor


# nki.isa.bn_stats / nki.isa.bn_aggr
@nki.jit
def nki_bn_stats_bn_aggr(b_tensor):
    mean_var_tensor = nl.ndarray((128, 2), dtype=nl.float32, buffer=nl.shared_hbm)
    b = nl.ndarray((128, 1024), dtype=b_tensor.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=b, src=b_tensor)
    ##################################################################
    # Example: Calculate the mean and variance for each partition of
    # tile b with shape [128, 1024]; bn_stats takes at most
    # nl.tile_size.bn_stats_fmax elements per partition, so it runs on
    # two chunks whose statistics bn_aggr combines.
    ##################################################################
    bn_tile = nl.tile_size.bn_stats_fmax
    n_chunks = 1024 // bn_tile
    stats_b = nl.ndarray((128, 6 * n_chunks), dtype=nl.float32, buffer=nl.sbuf)
    for i in nl.affine_range(n_chunks):
        nisa.bn_stats(dst=stats_b[:, i * 6:(i + 1) * 6], data=b[:, i * bn_tile:(i + 1) * bn_tile])

    mean_var_b = nl.ndarray((128, 2), dtype=nl.float32, buffer=nl.sbuf)
    nisa.bn_aggr(dst=mean_var_b, data=stats_b)

    nisa.dma_copy(dst=mean_var_tensor, src=mean_var_b)
    return mean_var_tensor


# nki.isa.nc_stream_shuffle
@nki.jit
def nki_nc_stream_shuffle(in_tensor, row_tensor):
    out_tensor = nl.ndarray((32, 128), dtype=in_tensor.dtype, buffer=nl.shared_hbm)
    bcast_tensor = nl.ndarray((32, 128), dtype=in_tensor.dtype, buffer=nl.shared_hbm)
    #####################################################################
    # Example 1:
    # Apply cross-partition data movement to a 32-partition tensor,
    # in-place shuffling the data in partition[i] to partition[(i+1)%32].
    #####################################################################
    a = nl.ndarray((32, 128), dtype=in_tensor.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=a, src=in_tensor)
    shuffle_mask = [(i - 1) % 32 for i in range(32)]
    nisa.nc_stream_shuffle(dst=a, src=a, shuffle_mask=shuffle_mask)
    nisa.dma_copy(dst=out_tensor, src=a)

    #####################################################################
    # Example 2:
    # Broadcast data in 1 partition to 32 partitions.
    #####################################################################
    r = nl.ndarray((1, 128), dtype=row_tensor.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=r, src=row_tensor)
    b = nl.ndarray((32, 128), dtype=row_tensor.dtype, buffer=nl.sbuf)
    shuffle_mask = [0] * 32
    nisa.nc_stream_shuffle(dst=b, src=r, shuffle_mask=shuffle_mask)
    nisa.dma_copy(dst=bcast_tensor, src=b)
    return out_tensor, bcast_tensor


# nki.isa.range_select
@nki.jit
def nki_range_select(on_true_tensor, bound0_tensor, bound1_tensor):
    select_res = nl.ndarray(on_true_tensor.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    reduce_result = nl.ndarray((on_true_tensor.shape[0], 1), dtype=nl.float32, buffer=nl.shared_hbm)
    on_true = nl.ndarray(on_true_tensor.shape, dtype=on_true_tensor.dtype, buffer=nl.sbuf)
    bound0 = nl.ndarray((on_true_tensor.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
    bound1 = nl.ndarray((on_true_tensor.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=on_true, src=on_true_tensor)
    nisa.dma_copy(dst=bound0, src=bound0_tensor)
    nisa.dma_copy(dst=bound1, src=bound1_tensor)
    ##################################################################
    # Example 1: Select elements where
    # bound0 <= range_start + index < bound1 and compute max reduction
    # on_false_value = nl.fp32.min
    ##################################################################
    reduce_res_tile = nl.ndarray((on_true.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
    result = nl.ndarray(on_true.shape, dtype=nl.float32, buffer=nl.sbuf)

    nisa.range_select(
        dst=result,
        on_true_tile=on_true,
        comp_op0=nl.greater_equal,
        comp_op1=nl.less,
        bound0=bound0,
        bound1=bound1,
        reduce_cmd=nisa.reduce_cmd.reset_reduce,
        reduce_res=reduce_res_tile,
        reduce_op=nl.maximum,
        range_start=0,
        on_false_value=nl.fp32.min
    )

    nisa.dma_copy(dst=select_res, src=result)
    nisa.dma_copy(dst=reduce_result, src=reduce_res_tile)
    return select_res, reduce_result


# nki.isa.select_reduce
@nki.jit
def nki_select_reduce(predicate_data, on_true_data):
    result_tensor = nl.ndarray(on_true_data.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    reduce_tensor = nl.ndarray((on_true_data.shape[0], 1), dtype=nl.float32, buffer=nl.shared_hbm)
    predicate = nl.ndarray(predicate_data.shape, dtype=predicate_data.dtype, buffer=nl.sbuf)
    on_true = nl.ndarray(on_true_data.shape, dtype=on_true_data.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=predicate, src=predicate_data)
    nisa.dma_copy(dst=on_true, src=on_true_data)
    ##################################################################
    # Example: select elements from on_true where predicate is nonzero,
    # nl.fp32.min elsewhere, and compute the max of each partition
    ##################################################################
    result = nl.ndarray(on_true.shape, dtype=nl.float32, buffer=nl.sbuf)
    reduce_res = nl.ndarray((on_true.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.select_reduce(
        dst=result,
        predicate=predicate,
        on_true=on_true,
        on_false=nl.fp32.min,
        reduce_res=reduce_res,
        reduce_cmd=nisa.reduce_cmd.reset_reduce,
        reduce_op=nl.maximum,
    )
    nisa.dma_copy(dst=result_tensor, src=result)
    nisa.dma_copy(dst=reduce_tensor, src=reduce_res)
    return result_tensor, reduce_tensor


# nki.isa.sequence_bounds
@nki.jit
def nki_sequence_bounds(segment_ids_tensor):
    n = segment_ids_tensor.shape[1]
    bounds_tensor = nl.ndarray((1, 2, n), dtype=segment_ids_tensor.dtype, buffer=nl.shared_hbm)
    segment_ids = nl.ndarray((1, n), dtype=segment_ids_tensor.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=segment_ids, src=segment_ids_tensor)
    ##################################################################
    # Example: the start and end index of the sequence of each element
    ##################################################################
    bounds = nl.ndarray((1, 2, n), dtype=segment_ids_tensor.dtype, buffer=nl.sbuf)
    nisa.sequence_bounds(dst=bounds, segment_ids=segment_ids)
    nisa.dma_copy(dst=bounds_tensor, src=bounds)
    return bounds_tensor


# nki.isa.max8 / nki.isa.nc_find_index8 / nki.isa.nc_match_replace8
@nki.jit
def nki_max8_find_replace(data_tensor):
    P, F = data_tensor.shape
    max_tensor = nl.ndarray((P, 8), dtype=nl.float32, buffer=nl.shared_hbm)
    idx_tensor = nl.ndarray((P, 8), dtype=nl.uint32, buffer=nl.shared_hbm)
    replaced_tensor = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.shared_hbm)
    replaced_idx_tensor = nl.ndarray((P, 8), dtype=nl.uint32, buffer=nl.shared_hbm)
    data = nl.ndarray((P, F), dtype=data_tensor.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=data, src=data_tensor)
    ##################################################################
    # max8: the 8 largest values of each partition, in descending order
    ##################################################################
    max_vals = nl.ndarray((P, 8), dtype=nl.float32, buffer=nl.sbuf)
    nisa.max8(dst=max_vals, src=data)

    ##################################################################
    # nc_find_index8: the index of each of the 8 values in data
    ##################################################################
    indices = nl.ndarray((P, 8), dtype=nl.uint32, buffer=nl.sbuf)
    nisa.nc_find_index8(dst=indices, data=data, vals=max_vals)

    ##################################################################
    # nc_match_replace8: replace the 8 values with -inf, and get their
    # indices in dst_idx
    ##################################################################
    replaced = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
    replaced_idx = nl.ndarray((P, 8), dtype=nl.uint32, buffer=nl.sbuf)
    nisa.nc_match_replace8(dst=replaced, data=data, vals=max_vals, imm=float('-inf'), dst_idx=replaced_idx)

    nisa.dma_copy(dst=max_tensor, src=max_vals)
    nisa.dma_copy(dst=idx_tensor, src=indices)
    nisa.dma_copy(dst=replaced_tensor, src=replaced)
    nisa.dma_copy(dst=replaced_idx_tensor, src=replaced_idx)
    return max_tensor, idx_tensor, replaced_tensor, replaced_idx_tensor


# nki.isa.local_gather
@nki.jit
def nki_local_gather(src_buffer_tensor, index_tensor):
    num_partitions = 128
    num_elem_per_idx = 4
    num_valid_indices = 32
    output_tensor = nl.ndarray((num_partitions, num_valid_indices * num_elem_per_idx),
                               dtype=src_buffer_tensor.dtype, buffer=nl.shared_hbm)
    src_buffer = nl.ndarray(src_buffer_tensor.shape, dtype=src_buffer_tensor.dtype, buffer=nl.sbuf)
    index = nl.ndarray(index_tensor.shape, dtype=index_tensor.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=src_buffer, src=src_buffer_tensor)
    nisa.dma_copy(dst=index, src=index_tensor)
    ##################################################################
    # Example: gather groups of num_elem_per_idx elements of each
    # partition of src_buffer at the first num_valid_indices indices
    # of its 16-partition group
    ##################################################################
    output = nl.ndarray((num_partitions, num_valid_indices * num_elem_per_idx),
                        dtype=src_buffer.dtype, buffer=nl.sbuf)
    nisa.local_gather(dst=output, src_buffer=src_buffer, index=index,
                      num_elem_per_idx=num_elem_per_idx, num_valid_indices=num_valid_indices)
    nisa.dma_copy(dst=output_tensor, src=output)
    return output_tensor


# nki.isa.tensor_copy_predicated
@nki.jit
def nki_tensor_copy_predicated(predicate, on_true_tensor, on_false_tensor):
    out_tensor = nl.ndarray(on_true_tensor.shape, dtype=on_true_tensor.dtype, buffer=nl.shared_hbm)
    pre_tile = nl.ndarray(predicate.shape, dtype=predicate.dtype, buffer=nl.sbuf)
    src_tile = nl.ndarray(on_true_tensor.shape, dtype=on_true_tensor.dtype, buffer=nl.sbuf)
    dst_tile = nl.ndarray(on_false_tensor.shape, dtype=on_false_tensor.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=pre_tile, src=predicate)
    nisa.dma_copy(dst=src_tile, src=on_true_tensor)
    nisa.dma_copy(dst=dst_tile, src=on_false_tensor)
    ##################################################################
    # Example: copy src_tile into dst_tile where pre_tile is nonzero
    # (reverse_pred=True: where it is zero)
    ##################################################################
    nisa.tensor_copy_predicated(dst=dst_tile, src=src_tile, predicate=pre_tile, reverse_pred=True)
    nisa.dma_copy(dst=out_tensor, src=dst_tile)
    return out_tensor


# nki.isa.dma_transpose
@nki.jit
def nki_dma_transpose(a_tensor, x_tensor):
    b_tensor = nl.ndarray((a_tensor.shape[1], a_tensor.shape[0]), dtype=a_tensor.dtype, buffer=nl.shared_hbm)
    y_tensor = nl.ndarray(tuple(reversed(x_tensor.shape)), dtype=x_tensor.dtype, buffer=nl.shared_hbm)
    ##################################################################
    # Example 1: transpose a 2D HBM tensor into SBUF
    ##################################################################
    b = nl.ndarray((a_tensor.shape[1], a_tensor.shape[0]), dtype=a_tensor.dtype, buffer=nl.sbuf)
    nisa.dma_transpose(dst=b, src=a_tensor)
    nisa.dma_copy(dst=b_tensor, src=b)

    ##################################################################
    # Example 2: transpose a 3D HBM tensor with axes=(2, 1, 0)
    ##################################################################
    y = nl.ndarray(tuple(reversed(x_tensor.shape)), dtype=x_tensor.dtype, buffer=nl.sbuf)
    nisa.dma_transpose(dst=y, src=x_tensor, axes=(2, 1, 0))
    nisa.dma_copy(dst=y_tensor, src=y)
    return b_tensor, y_tensor


# nki.isa.nc_matmul (accumulation, is_transpose) / nki.language.shared_identity_matrix
@nki.jit
def nki_nc_matmul(a_tensor, b_tensor, t_tensor):
    c_tensor = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
    tT_tensor = nl.ndarray((t_tensor.shape[1], t_tensor.shape[0]), dtype=t_tensor.dtype, buffer=nl.shared_hbm)
    ##################################################################
    # Example 1: multiply matrix a of shape (256, 128) and matrix b of
    # shape (256, 512) to get matrix c in PSUM of shape (128, 512),
    # accumulating over the two 128-row blocks of the contraction dim
    ##################################################################
    c_psum = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
    for k in nl.affine_range(2):
        a = nl.ndarray((128, 128), dtype=a_tensor.dtype, buffer=nl.sbuf)
        b = nl.ndarray((128, 512), dtype=b_tensor.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=a, src=a_tensor[k * 128:(k + 1) * 128, :])
        nisa.dma_copy(dst=b, src=b_tensor[k * 128:(k + 1) * 128, :])
        nisa.nc_matmul(dst=c_psum, stationary=a, moving=b)
    c = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=c, src=c_psum)
    nisa.dma_copy(dst=c_tensor, src=c)

    ##################################################################
    # Example 2: transpose t of shape (128, 64) with the transpose mode
    # of the Tensor Engine (the moving tensor is an identity matrix;
    # the result keeps the input dtype)
    ##################################################################
    t = nl.ndarray(t_tensor.shape, dtype=t_tensor.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=t_tensor)
    identity = nl.shared_identity_matrix(n=128, dtype=t.dtype)
    tT_psum = nl.ndarray((t_tensor.shape[1], t_tensor.shape[0]), dtype=t.dtype, buffer=nl.psum)
    nisa.nc_matmul(dst=tT_psum, stationary=t, moving=identity, is_transpose=True)
    tT = nl.ndarray((t_tensor.shape[1], t_tensor.shape[0]), dtype=t.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=tT, src=tT_psum)
    nisa.dma_copy(dst=tT_tensor, src=tT)
    return c_tensor, tT_tensor


# nki.isa.nc_matmul (perf_mode=matmul_perf_mode.double_row)
@nki.jit
def nki_nc_matmul_double_row(a_tensor, b_tensor):
    K, _, M = a_tensor.shape
    N = b_tensor.shape[2]
    c_tensor = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.shared_hbm)
    a = nl.ndarray((K, 2, M), dtype=a_tensor.dtype, buffer=nl.sbuf)
    b = nl.ndarray((K, 2, N), dtype=b_tensor.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=a, src=a_tensor)
    nisa.dma_copy(dst=b, src=b_tensor)
    ##################################################################
    # Example: fp8 matmul in the double row performance mode: a and b
    # hold 2 * K contraction rows as [K, 2, M] and [K, 2, N]
    ##################################################################
    c_psum = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=c_psum, stationary=a, moving=b, perf_mode=nisa.matmul_perf_mode.double_row)
    c = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=c, src=c_psum)
    nisa.dma_copy(dst=c_tensor, src=c)
    return c_tensor


# nki.isa.activation_reduce
@nki.jit
def nki_activation_reduce(b_tensor, c_tensor):
    b_act_tensor = nl.ndarray(b_tensor.shape, dtype=b_tensor.dtype, buffer=nl.shared_hbm)
    reduce_tensor = nl.ndarray((b_tensor.shape[0], 1), dtype=nl.float32, buffer=nl.shared_hbm)
    b = nl.ndarray(b_tensor.shape, dtype=b_tensor.dtype, buffer=nl.sbuf)
    c = nl.ndarray(c_tensor.shape, dtype=c_tensor.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=b, src=b_tensor)
    nisa.dma_copy(dst=c, src=c_tensor)
    ##################################################################
    # Example: perform the following operations to matrix b of shape (128, 512)
    # using a single activation instruction:
    # 1) multiply all elements in b by 2.0,
    # 2) add a user-input vector c to the 1) result,
    # 3) apply a square function on the 2) result
    # 4) reduce along the free dimension to get a column vector of shape (128, 1)
    ##################################################################
    activated_b = nl.ndarray(b.shape, dtype=b.dtype, buffer=nl.sbuf)
    reduce_res = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation_reduce(dst=activated_b, op=nl.square, data=b, reduce_op=nl.add,
                           reduce_res=reduce_res, bias=c, scale=2.0)
    nisa.dma_copy(dst=b_act_tensor, src=activated_b)
    nisa.dma_copy(dst=reduce_tensor, src=reduce_res)
    return b_act_tensor, reduce_tensor


# nki.language.program_id / nki.language.num_programs (launched with kernel[2]: LNC=2)
@nki.jit
def nki_program_id(a_tensor):
    b_tensor = nl.ndarray(a_tensor.shape, dtype=a_tensor.dtype, buffer=nl.shared_hbm)
    ##################################################################
    # Example: each program handles its share of the row tiles of a
    ##################################################################
    num_p = nl.num_programs(0)
    pid = nl.program_id(0)
    n_tiles = a_tensor.shape[0] // 128
    for i in nl.affine_range(n_tiles // num_p):
        row = (pid * (n_tiles // num_p) + i) * 128
        t = nl.ndarray((128, a_tensor.shape[1]), dtype=a_tensor.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a_tensor[row:row + 128, :])
        nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=float(pid))
        nisa.dma_copy(dst=b_tensor[row:row + 128, :], src=t)
    return b_tensor


# nki.language.static_range / nki.isa.memset
@nki.jit
def nki_static_range(a_tensor):
    out_tensor = nl.ndarray(a_tensor.shape, dtype=a_tensor.dtype, buffer=nl.shared_hbm)
    ##################################################################
    # Example: a loop fully unrolled at trace time: each column block j
    # of a is scaled by j + 1
    ##################################################################
    n_blocks = a_tensor.shape[1] // 128
    for j in nl.static_range(n_blocks):
        t = nl.ndarray((128, 128), dtype=a_tensor.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a_tensor[:, j * 128:(j + 1) * 128])
        s = nl.ndarray((128, 128), dtype=a_tensor.dtype, buffer=nl.sbuf)
        nisa.memset(dst=s, value=float(j + 1))
        nisa.tensor_tensor(dst=t, data1=t, data2=s, op=nl.multiply)
        nisa.dma_copy(dst=out_tensor[:, j * 128:(j + 1) * 128], src=t)
    return out_tensor


# nki.isa.dropout / nki.language.random_seed / nki.language.rand
@nki.jit
def nki_dropout(in_tensor, seed_tensor):
    out_tensor = nl.ndarray(in_tensor.shape, dtype=in_tensor.dtype, buffer=nl.shared_hbm)
    rand_tensor = nl.ndarray(in_tensor.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    a = nl.ndarray(in_tensor.shape, dtype=in_tensor.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=a, src=in_tensor)
    seed = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=seed, src=seed_tensor)
    ##################################################################
    # Example: seed the random number generator, then zero each element
    # of a with probability 0.2; also a tile of uniform random values
    ##################################################################
    nl.random_seed(seed=seed)
    b = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
    nisa.dropout(dst=b, data=a, prob=0.2)
    r = nl.rand(a.shape, dtype=nl.float32)
    nisa.dma_copy(dst=out_tensor, src=b)
    nisa.dma_copy(dst=rand_tensor, src=r)
    return out_tensor, rand_tensor


# nki.isa tier-1 calls with positional arguments (dst first), as the 0.x pages show them
@nki.jit
def nki_positional(a_tensor, b_tensor):
    K, M = a_tensor.shape
    N = b_tensor.shape[1]
    c_tensor = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.shared_hbm)
    e_tensor = nl.ndarray((M, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    a = nl.ndarray((K, M), dtype=a_tensor.dtype, buffer=nl.sbuf)
    b = nl.ndarray((K, N), dtype=b_tensor.dtype, buffer=nl.sbuf)
    nisa.dma_copy(a, a_tensor)
    nisa.dma_copy(b, b_tensor)
    # c = a.T @ b on the Tensor Engine, evicted from PSUM
    c_psum = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(c_psum, a, b)
    c = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(c, c_psum)
    # c = 2 * c + 1, then c = c + c, then exp(c / 64)
    nisa.tensor_scalar(c, c, nl.multiply, 2.0, op1=nl.add, operand1=1.0)
    nisa.tensor_tensor(c, c, c, nl.add)
    nisa.activation(c, nl.exp, c, scale=1.0 / 64)
    # e = the row sums of c
    e = nl.ndarray((M, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(e, 0.0)
    nisa.tensor_reduce(e, nl.add, c, axis=1)
    nisa.dma_copy(c_tensor, c)
    nisa.dma_copy(e_tensor, e)
    return c_tensor, e_tensor


# nki.language.load / nki.language.store / value-returning nki.language calls (NKI 0.3+)
@nki.jit
def nki_load_store_values(a_tensor, b_tensor):
    out_tensor = nl.ndarray(a_tensor.shape, dtype=a_tensor.dtype, buffer=nl.shared_hbm)
    a = nl.load(a_tensor)
    b = nl.load(b_tensor)
    c = nl.add(a, b)
    d = nl.exp(nl.multiply(c, 0.5))
    nl.store(out_tensor, d)
    return out_tensor


# nki.language.shared_constant / nki.language.gather_flattened
@nki.jit
def nki_shared_constant_gather(a_tensor):
    out_tensor = nl.ndarray((a_tensor.shape[0], 8), dtype=a_tensor.dtype, buffer=nl.shared_hbm)
    a = nl.ndarray(a_tensor.shape, dtype=a_tensor.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=a, src=a_tensor)
    # the gather indices: a constant known when the kernel is traced
    idx_hbm = nl.shared_constant(np.tile(np.arange(7, -1, -1, dtype=np.uint32) * 3, (a_tensor.shape[0], 1)))
    idx = nl.ndarray((a_tensor.shape[0], 8), dtype=nl.uint32, buffer=nl.sbuf)
    nisa.dma_copy(dst=idx, src=idx_hbm)
    g = nl.gather_flattened(a, idx)
    nisa.dma_copy(dst=out_tensor, src=g)
    return out_tensor
