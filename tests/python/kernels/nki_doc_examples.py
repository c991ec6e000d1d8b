"""The "Example" snippets of the NKI API reference (awsdocs-neuron, Beta-1 ``neuronxcc.nki`` pages of Neuron SDK
2.2x: ``nki.isa.*`` and ``nki.language.*``), each embedded in the smallest kernel that gives it its inputs
(the names the snippet assumes, ``a_tensor``, ``in_tensor``, ... become kernel arguments) and stores / returns its
results. The docs build their examples the same way (``@nki.jit(mode="simulation")`` test kernels whose marked
middle part is shown on the page).

Written from memory of the published pages; the snippet bodies are kept as the pages write them (their comments,
names, 2-space indentation and ``from neuronxcc.nki.typing import tensor`` annotations included). Where a line
could not be recalled exactly it is written the way the surrounding page writes NKI; the test module's docstring
lists those places. No nsim imports.
"""
import numpy as np

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl
from neuronxcc.nki.language import affine_range, float32
from neuronxcc.nki.typing import tensor


# nki.isa.iota
@nki.jit(mode="simulation")
def nki_iota():
  a_tensor = nl.ndarray([1, 512], dtype=nl.int32, buffer=nl.shared_hbm)
  b_tensor = nl.ndarray([128, 1], dtype=nl.int32, buffer=nl.shared_hbm)
  c_tensor = nl.ndarray([1, 512], dtype=nl.int32, buffer=nl.shared_hbm)
  d_tensor = nl.ndarray([128, 512], dtype=nl.int32, buffer=nl.shared_hbm)
  e_tensor = nl.ndarray([128, 512], dtype=nl.int32, buffer=nl.shared_hbm)
  ##################################################################
  # Example 1: Generate tile a of 512 constant values in SBUF partition 0
  # that start at 0 and increment by 1:
  ##################################################################
  # a = [0, 1, ..., 511]
  expr_a = nl.arange(0, 512)[None, :]
  a: tensor[1, 512] = nisa.iota(expr_a, dtype=nl.int32)

  ##################################################################
  # Example 2: Generate tile b of 128 constant values across SBUF partitions
  # that start at 0 and increment by 1, with one value per partition:
  ##################################################################
  # b = [[0],
  #      [1],
  #      ...,
  #      [127]]
  expr_b = nl.arange(0, 128)[:, None]
  b: tensor[128, 1] = nisa.iota(expr_b, dtype=nl.int32)

  ##################################################################
  # Example 3: Generate tile c of 512 constant values in SBUF partition 0
  # that start at 0 and decrement by 1:
  ##################################################################
  # c = [511, 510, ..., 0]
  expr_c = 511 - nl.arange(0, 512)[None, :]
  c: tensor[1, 512] = nisa.iota(expr_c, dtype=nl.int32)

  ##################################################################
  # Example 4: Generate tile d of 128 x 512 constant values in SBUF
  # that start at 0 and increment by 1 in row-major order:
  ##################################################################
  # d = [[0, 1, ..., 511],
  #      [512, 513, ..., 1023],
  #      ...
  #      [65024, 65025, ..., 65535]]
  expr_d = nl.arange(0, 128)[:, None] * 512 + nl.arange(0, 512)[None, :]
  d: tensor[128, 512] = nisa.iota(expr_d, dtype=nl.int32)

  ##################################################################
  # Example 5: Generate tile e of shape [128, 512] by
  # broadcast-copying tile b generated in Example 2 across the free dimension.
  ##################################################################
  # e = [[0, 0, ..., 0],
  #      [1, 1, ..., 1],
  #      ...
  #      [127, 127, ..., 127]]
  e: tensor[128, 512] = b.broadcast_to((128, 512))

  nl.store(a_tensor, a)
  nl.store(b_tensor, b)
  nl.store(c_tensor, c)
  nl.store(d_tensor, d)
  nl.store(e_tensor, e)
  return a_tensor, b_tensor, c_tensor, d_tensor, e_tensor


# nki.isa.affine_select
@nki.jit(mode="simulation")
def nki_affine_select(a_tensor):
  b_tensor = nl.ndarray([128, 128], dtype=a_tensor.dtype, buffer=nl.shared_hbm)
  ##################################################################
  # Example 1: Take tile a of shape [128, 128] and replace its
  # upper triangle with -9984.0;
  ##################################################################
  ix, iy = nl.mgrid[0:128, 0:128]
  a = nl.load(a_tensor[ix, iy])

  b = nisa.affine_select(pred=(iy < ix), on_true_tile=a[ix, iy], on_false_value=-9984.0)

  nl.store(b_tensor[ix, iy], b)
  return b_tensor


# nki.isa.tensor_tensor_scan
@nki.jit(mode="simulation")
def nki_tensor_tensor_scan(a_tensor, b_tensor):
  c_tensor = nl.ndarray(a_tensor.shape, dtype=a_tensor.dtype, buffer=nl.shared_hbm)
  a = nl.load(a_tensor)
  b = nl.load(b_tensor)
  ##################################################################
  # Example 1: scan two tiles, a and b, of the same
  # shape (128, 1024) using multiply/add and get
  # the scan result in tile c
  ##################################################################
  c = nl.ndarray(shape=(128, 1024), dtype=nl.float32)

  c[:, 0:512] = nisa.tensor_tensor_scan(a[:, 0:512], b[:, 0:512],
                                        initial=0, op0=np.multiply, op1=np.add)

  c[:, 512:1024] = nisa.tensor_tensor_scan(a[:, 512:1024], b[:, 512:1024],
                                           initial=c[:, 511],
                                           op0=np.multiply, op1=np.add)

  nl.store(c_tensor, c)
  return c_tensor


# nki.language.sequential_range
@nki.jit(mode="simulation")
def nki_sequential_range(input0_tensor, input1_tensor):
  output = nl.ndarray(input0_tensor.shape, dtype=input0_tensor.dtype, buffer=nl.shared_hbm)
  input0 = nl.load(input0_tensor)
  input1 = nl.load(input1_tensor)
  #######################################################################
  # Example 1: Loop carried dependency from tiling tensor_tensor_scan
  # Both sbuf tensor input0 and input1 shapes: [128, 2048]
  # Perform a scan operation between the two inputs using a tile size of [128, 512]
  # Store the scan output to another [128, 2048] tensor
  #######################################################################

  # Loop iterations communicate through this init tensor
  init = nl.zeros((128, 1), dtype=input0.dtype)

  # This loop will only produce correct results if the iterations are performed in order
  for i_input in nl.sequential_range(input0.shape[1] // 512):
    offset = i_input * 512

    # Depends on scan result from the previous loop iteration
    result = nisa.tensor_tensor_scan(input0[:, offset:offset+512],
                                     input1[:, offset:offset+512],
                                     initial=init,
                                     op0=nl.multiply, op1=nl.add)

    nl.store(output[0:input0.shape[0], offset:offset+512], result)

    # Prepare initial result for scan in the next loop iteration
    init[:, :] = result[:, 511]
  return output


# nki.language.affine_range
@nki.jit(mode="simulation")
def nki_affine_range(input, xT, y):
  output = nl.ndarray(input.shape, dtype=input.dtype, buffer=nl.shared_hbm)
  result = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.shared_hbm)
  #######################################################################
  # Example 1: No loop carried dependency
  # Input/Output tensor shape: [128, 2048]
  # Load one tile ([128, 512]) at a time, square the tensor element-wise,
  # and store it into output tile
  #######################################################################

  # Every loop instance works on an independent input/output tile.
  # No data dependency between loop instances.
  for i_input in nl.affine_range(input.shape[1] // 512):
    offset = i_input * 512
    input_sb = nl.load(input[0:input.shape[0], offset:offset+512])
    result_sb = nl.multiply(input_sb, input_sb)
    nl.store(output[0:input.shape[0], offset:offset+512], result_sb)

  #######################################################################
  # Example 2: Matmul output buffer accumulation, a type of associative reduction
  # Input tensor shapes for nl.matmul: xT[K=2048, M=128] and y[K=2048, N=128]
  # Load one tile ([128, 128]) from both xT and y at a time, matmul and
  # accumulate into the same output buffer
  #######################################################################

  result_psum = nl.zeros((128, 128), dtype=nl.float32, buffer=nl.psum)
  for i_K in nl.affine_range(xT.shape[0] // 128):
    offset = i_K * 128
    xT_sbuf = nl.load(xT[offset:offset+128, 0:xT.shape[1]])
    y_sbuf = nl.load(y[offset:offset+128, 0:y.shape[1]])

    result_psum += nl.matmul(xT_sbuf, y_sbuf, transpose_x=True)

  nl.store(result, result_psum)
  return output, result


# nki.isa.tensor_scalar_reduce
@nki.jit(mode="simulation")
def nki_tensor_scalar_reduce(a_tensor):
  b_tensor = nl.ndarray([128, 512], dtype=nl.float32, buffer=nl.shared_hbm)
  c_tensor = nl.ndarray([128, 1], dtype=nl.float32, buffer=nl.shared_hbm)
  ##################################################################
  # Example 1: subtract 1.0 from all elements of tile a of
  # shape (128, 512) and get the output tile in b, while computing
  # the sum of each partition of b into c of shape (128, 1)
  ##################################################################
  i_p = nl.arange(128)[:, None]
  i_f = nl.arange(512)[None, :]

  a = nl.load(a_tensor[i_p, i_f])
  c = nl.ndarray([128, 1], dtype=nl.float32)
  b = nisa.tensor_scalar_reduce(data=a[i_p, i_f], op0=np.subtract, operand0=1.0,
                                reduce_op=np.add, reduce_res=c[i_p, 0])

  nl.store(b_tensor[i_p, i_f], b)
  nl.store(c_tensor, c)
  return b_tensor, c_tensor


# nki.isa.bn_stats / nki.isa.bn_aggr
@nki.jit(mode="simulation")
def nki_bn_stats_bn_aggr(a_tensor, b_tensor):
  mean_a_tensor = nl.ndarray([a_tensor.shape[0], 1], dtype=nl.float32, buffer=nl.shared_hbm)
  var_a_tensor = nl.ndarray([a_tensor.shape[0], 1], dtype=nl.float32, buffer=nl.shared_hbm)
  mean_b_tensor = nl.ndarray([b_tensor.shape[0], 1], dtype=nl.float32, buffer=nl.shared_hbm)
  var_b_tensor = nl.ndarray([b_tensor.shape[0], 1], dtype=nl.float32, buffer=nl.shared_hbm)
  ##################################################################
  # Example 1: Calculate the mean and variance for each partition
  # of tile a with shape (128, 128)
  ##################################################################
  a: tensor[128, 128] = nl.load(a_tensor)
  stats_a: tensor[128, 6] = nisa.bn_stats(a)
  mean_var_a: tensor[128, 2] = nisa.bn_aggr(stats_a)

  # Extract mean and variance
  mean_a = mean_var_a[:, 0]
  var_a = mean_var_a[:, 1]
  nl.store(mean_a_tensor, mean_a)
  nl.store(var_a_tensor, var_a)

  # ##################################################################
  # # Example 2: Calculate the mean and variance for each partition of
  # # tile b with shape [128, 1024]
  # ##################################################################
  b: tensor[128, 1024] = nl.load(b_tensor)

  # Run bn_stats in two tiles because b has 1024 elements per partition,
  # but bn_stats has a limitation of nl.tile_size.bn_stats_fmax
  # Initialize a bn_stats output tile with shape of [128, 6*2] to
  # hold outputs of two bn_stats instructions
  stats_b = nl.ndarray((128, 6 * 2), dtype=nl.float32)
  bn_tile = nl.tile_size.bn_stats_fmax
  ix, iy = nl.mgrid[0:128, 0:bn_tile]
  iz, iw = nl.mgrid[0:128, 0:6]

  for i in range(1024 // bn_tile):
    stats_b[iz, i * 6 + iw] = nisa.bn_stats(b[ix, i * bn_tile + iy], dtype=nl.float32)

  mean_var_b = nisa.bn_aggr(stats_b)

  # Extract mean and variance
  mean_b = mean_var_b[:, 0]
  var_b = mean_var_b[:, 1]

  nl.store(mean_b_tensor, mean_b)
  nl.store(var_b_tensor, var_b)
  return mean_a_tensor, var_a_tensor, mean_b_tensor, var_b_tensor


# nki.isa.nc_stream_shuffle (Example 1: in-place rotation of a 32-partition tile)
@nki.jit(mode="simulation")
def nki_nc_stream_shuffle_rotate(in_tensor):
  out_tensor = nl.ndarray(in_tensor.shape, dtype=in_tensor.dtype, buffer=nl.shared_hbm)
  #####################################################################
  # Example 1:
  # Apply cross-partition data movement to a 32-partition tensor,
  # in-place shuffling the data in partition[i] to partition[(i+1)%32].
  #####################################################################
  a = nl.load(in_tensor)
  a_mgrid = nl.mgrid[0:32, 0:128]
  shuffle_mask = [(i - 1) % 32 for i in range(32)]
  nisa.nc_stream_shuffle(src=a[a_mgrid.p, a_mgrid.x], dst=a[a_mgrid.p, a_mgrid.x], shuffle_mask=shuffle_mask)

  nl.store(out_tensor, value=a)
  return out_tensor


# nki.isa.nc_stream_shuffle (Example 2: broadcast one partition to 32)
@nki.jit(mode="simulation")
def nki_nc_stream_shuffle_broadcast(in_tensor):
  out_tensor = nl.ndarray([32, 128], dtype=in_tensor.dtype, buffer=nl.shared_hbm)
  #####################################################################
  # Example 2:
  # Broadcast data in 1 partition to 32 partitions.
  #####################################################################
  a: tensor[1, 128] = nl.load(in_tensor)
  b = nl.ndarray(shape=(32, 128), dtype=np.float32)
  dst_mgrid = nl.mgrid[0:32, 0:128]
  src_mgrid = nl.mgrid[0:1, 0:128]
  shuffle_mask = [0] * 32
  nisa.nc_stream_shuffle(src=a[0, src_mgrid.x], dst=b[dst_mgrid.p, dst_mgrid.x], shuffle_mask=shuffle_mask)

  nl.store(out_tensor, value=b)
  return out_tensor


# nki.isa.nc_stream_shuffle (Example 3: the same mask in every quadrant of a 128-partition tile)
@nki.jit(mode="simulation")
def nki_nc_stream_shuffle_quadrants(in_tensor):
  out_tensor = nl.ndarray(in_tensor.shape, dtype=in_tensor.dtype, buffer=nl.shared_hbm)
  #####################################################################
  # Example 3:
  # In the case when src partition size > 32, the same shuffle_mask is
  # applied to each quadrant: reverse the partitions of every quadrant.
  #####################################################################
  a: tensor[128, 128] = nl.load(in_tensor)
  b = nl.ndarray(shape=(128, 128), dtype=np.float32)
  shuffle_mask = [31 - i for i in range(32)]
  nisa.nc_stream_shuffle(src=a, dst=b, shuffle_mask=shuffle_mask)

  nl.store(out_tensor, value=b)
  return out_tensor


# nki.isa.range_select
@nki.jit(mode="simulation", platform_target="trn2")
def nki_range_select(on_true_tensor, bound0_tensor, bound1_tensor):
  select_res = nl.ndarray(on_true_tensor.shape, dtype=nl.float32, buffer=nl.shared_hbm)
  reduce_result = nl.ndarray((on_true_tensor.shape[0], 1), dtype=nl.float32, buffer=nl.shared_hbm)
  select_res2 = nl.ndarray(on_true_tensor.shape, dtype=nl.float32, buffer=nl.shared_hbm)
  reduce_result2 = nl.ndarray((on_true_tensor.shape[0], 1), dtype=nl.float32, buffer=nl.shared_hbm)
  ##################################################################
  # Example 1: Select elements where
  # bound0 <= range_start + index < bound1 and compute max reduction
  # on_false_value = nl.fp32.min
  ##################################################################
  on_true = nl.load(on_true_tensor[...])
  bound0 = nl.load(bound0_tensor[...])
  bound1 = nl.load(bound1_tensor[...])

  reduce_res_tile = nl.ndarray((on_true.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
  result = nl.ndarray(on_true.shape, dtype=nl.float32, buffer=nl.sbuf)

  result[...] = nisa.range_select(
      on_true_tile=on_true,
      comp_op0=np.greater_equal,
      comp_op1=np.less,
      bound0=bound0,
      bound1=bound1,
      reduce_cmd=nisa.reduce_cmd.reset_reduce,
      reduce_res=reduce_res_tile,
      reduce_op=np.max,
      range_start=0,
      on_false_value=nl.fp32.min
  )

  nl.store(select_res[...], value=result[...])
  nl.store(reduce_result[...], value=reduce_res_tile[...])

  ##################################################################
  # Example 2: Chaining multiple range_select operations with reduction:
  # the second call continues the reduction of the first one
  # (reduce_cmd=reduce) over on_true - 1.0
  ##################################################################
  reduce_res_tile2 = nl.ndarray((on_true.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
  result2 = nl.ndarray(on_true.shape, dtype=nl.float32, buffer=nl.sbuf)

  # First range_select with reset_reduce
  result[...] = nisa.range_select(
      on_true_tile=on_true,
      comp_op0=np.greater_equal,
      comp_op1=np.less,
      bound0=bound0,
      bound1=bound1,
      reduce_cmd=nisa.reduce_cmd.reset_reduce,
      reduce_op=np.max,
      range_start=0,
      on_false_value=nl.fp32.min
  )

  # Second range_select continues the reduction
  ones = nl.full(on_true.shape, fill_value=1, dtype=nl.float32, buffer=nl.sbuf)
  shifted_on_true = nl.subtract(on_true, ones)
  result2[...] = nisa.range_select(
      on_true_tile=shifted_on_true,
      comp_op0=np.greater_equal,
      comp_op1=np.less,
      bound0=bound0,
      bound1=bound1,
      reduce_cmd=nisa.reduce_cmd.reduce,
      reduce_res=reduce_res_tile2,
      reduce_op=np.max,
      range_start=0,
      on_false_value=nl.fp32.min
  )

  nl.store(select_res2[...], value=result2[...])
  nl.store(reduce_result2[...], value=reduce_res_tile2[...])
  return select_res, reduce_result, select_res2, reduce_result2


# nki.isa.select_reduce
@nki.jit(mode="simulation")
def nki_select_reduce(predicate_data, on_true_data, on_false_data):
  select_res_tensor = nl.ndarray(on_true_data.shape, dtype=nl.float32, buffer=nl.shared_hbm)
  select_reduce_res_tensor = nl.ndarray(on_true_data.shape, dtype=nl.float32, buffer=nl.shared_hbm)
  reduce_tensor = nl.ndarray((on_true_data.shape[0], 1), dtype=nl.float32, buffer=nl.shared_hbm)
  reverse_res_tensor = nl.ndarray(on_true_data.shape, dtype=nl.float32, buffer=nl.shared_hbm)
  reverse_reduce_tensor = nl.ndarray((on_true_data.shape[0], 1), dtype=nl.float32, buffer=nl.shared_hbm)
  ##################################################################
  # Example 1: Basic usage of select_reduce
  # Select elements from on_true based on predicate, use on_false_value for others
  ##################################################################
  predicate = nl.load(predicate_data[...])
  on_true = nl.load(on_true_data[...])

  result = nl.ndarray(on_true.shape, dtype=nl.float32, buffer=nl.sbuf)
  nisa.select_reduce(
      dst=result,
      predicate=predicate,
      on_true=on_true,
      on_false=nl.fp32.min,
  )
  nl.store(select_res_tensor[...], value=result)

  ##################################################################
  # Example 2: Using select_reduce with reduction
  # Perform selection and compute the max of the selected values
  ##################################################################
  result2 = nl.ndarray(on_true.shape, dtype=nl.float32, buffer=nl.sbuf)
  reduce_res = nl.ndarray((on_true.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.select_reduce(
      dst=result2,
      predicate=predicate,
      on_true=on_true,
      on_false=nl.fp32.min,
      reduce_cmd=nisa.reduce_cmd.reset_reduce,
      reduce_res=reduce_res,
      reduce_op=np.max,
  )
  nl.store(select_reduce_res_tensor[...], value=result2)
  nl.store(reduce_tensor[...], value=reduce_res)

  ##################################################################
  # Example 3: Using select_reduce with a per-partition on_false vector
  # and a reversed predicate
  ##################################################################
  on_false = nl.load(on_false_data[...])
  result3 = nl.ndarray(on_true.shape, dtype=nl.float32, buffer=nl.sbuf)
  reduce_res3 = nl.ndarray((on_true.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.select_reduce(
      dst=result3,
      predicate=predicate,
      on_true=on_true,
      on_false=on_false,
      reduce_cmd=nisa.reduce_cmd.reset_reduce,
      reduce_res=reduce_res3,
      reduce_op=np.max,
      reverse_pred=True,
  )
  nl.store(reverse_res_tensor[...], value=result3)
  nl.store(reverse_reduce_tensor[...], value=reduce_res3)
  return select_res_tensor, select_reduce_res_tensor, reduce_tensor, reverse_res_tensor, reverse_reduce_tensor


# nki.isa.sequence_bounds
@nki.jit(mode="simulation")
def nki_sequence_bounds(segment_ids_tensor):
  n = segment_ids_tensor.shape[1]
  bounds_tensor = nl.ndarray((1, 2, n), dtype=segment_ids_tensor.dtype, buffer=nl.shared_hbm)
  ##################################################################
  # Example 1: Compute the start and end index of the sequence each
  # element of segment_ids belongs to (segment id 0 is padding)
  ##################################################################
  segment_ids = nl.load(segment_ids_tensor)
  bounds = nisa.sequence_bounds(segment_ids=segment_ids)
  nl.store(bounds_tensor, value=bounds)
  return bounds_tensor


# nki.isa.max8
@nki.jit(mode="simulation")
def nki_max8():
  data_tensor = nl.ndarray([32, 128], dtype=nl.float32, buffer=nl.shared_hbm)
  ##################################################################
  # Example 1: Generate tile b of 32 * 128 random floating point values
  # and get the 8 largest values in each row:
  ##################################################################
  expr_a = nl.rand((32, 128))
  a = nisa.max8(src=expr_a)

  a_tensor = nl.ndarray([32, 8], dtype=nl.float32, buffer=nl.shared_hbm)
  nl.store(a_tensor, value=a)

  nl.store(data_tensor, value=expr_a)
  return data_tensor, a_tensor


# nki.isa.nc_find_index8
@nki.jit(mode="simulation")
def nki_nc_find_index8():
  data_tensor = nl.ndarray([32, 128], dtype=nl.float32, buffer=nl.shared_hbm)
  ##################################################################
  # Example 1: Generate tile b of 32 * 128 random floating point values,
  # find the 8 largest values in each row, then find their indices:
  ##################################################################
  # Generate random data
  data = nl.rand((32, 128))

  # Find max 8 values per row
  max_vals = nisa.max8(src=data)

  # Create output tensor for indices
  indices_tensor = nl.ndarray([32, 8], dtype=nl.uint32, buffer=nl.shared_hbm)

  # Find indices of max values
  indices = nisa.nc_find_index8(data=data, vals=max_vals)

  # Store results
  nl.store(indices_tensor, value=indices)

  nl.store(data_tensor, value=data)
  return data_tensor, indices_tensor


# nki.isa.nc_match_replace8
@nki.jit(mode="simulation")
def nki_nc_match_replace8(data_tensor):
  N, M = data_tensor.shape
  result_tensor = nl.ndarray([N, M], dtype=nl.float32, buffer=nl.shared_hbm)
  idx_tensor = nl.ndarray([N, 8], dtype=nl.uint32, buffer=nl.shared_hbm)
  ##################################################################
  # Example 1: Get the 8 largest values in each row of tile data_tile,
  # then replace their first occurrences with -inf:
  ##################################################################
  data_tile = nl.load(data_tensor)
  max_vals = nisa.max8(src=data_tile)

  result = nisa.nc_match_replace8(data=data_tile[:, :], vals=max_vals, imm=float('-inf'))
  nl.store(result_tensor, value=result)

  ##################################################################
  # Example 2: The same, also writing the index of each replaced
  # value into idx_tile:
  ##################################################################
  idx_tile = nl.ndarray([N, 8], dtype=nl.uint32)
  result2 = nisa.nc_match_replace8(data=data_tile[:, :], vals=max_vals, imm=float('-inf'), dst_idx=idx_tile)
  nl.store(idx_tensor, value=idx_tile)
  return result_tensor, idx_tensor


# nki.isa.local_gather
@nki.jit(mode="simulation")
def nki_local_gather(src_buffer_tensor, index_tensor):
  ##################################################################
  # Example 1: gather src_buffer using index
  # Gather input: src_buffer_tensor with shape (128, 512, 4)
  # Gather indices: index_tensor with shape (128, 4)
  # We use num_elem_per_idx = 4, so each index gathers 4 elements
  # We use num_valid_indices = 16, so 16 indices are valid per 16 partitions
  # Output: output_tensor with shape (128, 4, 16)
  ##################################################################
  num_partitions = 128
  num_elem_per_idx = 4
  num_valid_indices = 16
  output_shape = (num_partitions, 4, 16)

  src_buffer = nl.load(src_buffer_tensor)
  index = nl.load(index_tensor)

  output = nisa.local_gather(src_buffer, index, num_elem_per_idx=num_elem_per_idx,
                             num_valid_indices=num_valid_indices)

  output_tensor = nl.ndarray(output_shape, dtype=src_buffer.dtype, buffer=nl.shared_hbm)
  nl.store(output_tensor, value=output)
  return output_tensor


# nki.isa.tensor_copy_predicated
@nki.jit(mode="simulation")
def nki_tensor_copy_predicated(predicate, on_true_tensor, on_false_tensor):
  out_tensor = nl.ndarray(on_true_tensor.shape, dtype=on_true_tensor.dtype, buffer=nl.shared_hbm)
  ##################################################################
  # Example 1: Conditionally copies elements from the `on_true` tile to
  # SBUF/PSUM destination tile using Vector Engine, where copying occurs
  # only at positions where the predicate evaluates to True.
  ##################################################################
  pre_tile: tensor[128, 512] = nl.load(predicate)
  src_tile: tensor[128, 512] = nl.load(on_true_tensor)

  ix, iy = nl.mgrid[0:128, 0:512]
  dst_tile: tensor[128, 512] = nl.zeros(shape=src_tile.shape, dtype=src_tile.dtype)
  dst_tile[ix, iy] = nl.load(on_false_tensor)

  nisa.tensor_copy_predicated(src=src_tile, dst=dst_tile, predicate=pre_tile)

  nl.store(out_tensor, value=dst_tile)
  return out_tensor


# nki.isa.dma_transpose (Example 1: HBM -> SBUF)
@nki.jit(mode="simulation", platform_target="trn2")
def nki_dma_transpose_2d_hbm2sb(a):
  b = nisa.dma_transpose(a)
  b_tensor = nl.ndarray(b.shape, dtype=b.dtype, buffer=nl.shared_hbm)
  nl.store(b_tensor, value=b)
  return b_tensor


# nki.isa.dma_transpose (Example 2: SBUF -> SBUF)
@nki.jit(mode="simulation", platform_target="trn2")
def nki_dma_transpose_2d_sb2sb(a):
  a_sb = nl.load(a)
  b = nisa.dma_transpose(a_sb)
  b_tensor = nl.ndarray(b.shape, dtype=b.dtype, buffer=nl.shared_hbm)
  nl.store(b_tensor, value=b)
  return b_tensor


# nki.isa.nc_matmul (Examples 1-3)
@nki.jit(mode="simulation")
def nki_nc_matmul(a_tensor, b_tensor, d_tensor, e_tensor, g_tensor, h_tensor):
  c_tensor = nl.ndarray([128, 512], dtype=nl.float32, buffer=nl.shared_hbm)
  f_tensor = nl.ndarray([128, 512], dtype=nl.float32, buffer=nl.shared_hbm)
  i_tensor = nl.ndarray([16, 64, 512], dtype=nl.float32, buffer=nl.shared_hbm)
  ##################################################################
  # Example 1:
  # multiply matrix a of shape (128, 128) and matrix b of shape (128, 512)
  # to get matrix c in PSUM of shape (128, 512)
  ##################################################################
  a_mgrid = nl.mgrid[0:128, 0:128]
  b_mgrid = nl.mgrid[0:128, 0:512]
  c_mgrid = nl.mgrid[0:128, 0:512]

  a = nl.load(a_tensor[a_mgrid.p, a_mgrid.x])
  b = nl.load(b_tensor[b_mgrid.p, b_mgrid.x])

  c_psum = nisa.nc_matmul(a[a_mgrid.p, a_mgrid.x], b[b_mgrid.p, b_mgrid.x])

  nl.store(c_tensor[c_mgrid.p, c_mgrid.x], c_psum)

  ##################################################################
  # Example 2:
  # multiply matrix d of shape (256, 128) and matrix e of shape (256, 512)
  # to get matrix f in PSUM of shape (128, 512) using psum accumulation
  ##################################################################
  d_mgrid = nl.mgrid[0:128, 0:128]
  e_mgrid = nl.mgrid[0:128, 0:512]
  f_mgrid = nl.mgrid[0:128, 0:512]

  f_psum = nl.zeros((128, 512), nl.float32, buffer=nl.psum)

  for i_contract in nl.affine_range(2):
    d = nl.load(d_tensor[i_contract * 128 + d_mgrid.p, d_mgrid.x])
    e = nl.load(e_tensor[i_contract * 128 + e_mgrid.p, e_mgrid.x])
    f_psum += nisa.nc_matmul(d[d_mgrid.p, d_mgrid.x], e[e_mgrid.p, e_mgrid.x])

  nl.store(f_tensor[f_mgrid.p, f_mgrid.x], f_psum)

  ##################################################################
  # Example 3:
  # perform batched matrix multiplication on matrix g of shape (16, 64, 64)
  # and matrix h of shape (16, 64, 512) to get matrix i of (16, 64, 512)
  # using Tensor Engine PE tiling mode.
  ##################################################################
  g_mgrid = nl.mgrid[0:64, 0:64]
  h_mgrid = nl.mgrid[0:64, 0:512]
  i_mgrid = nl.mgrid[0:64, 0:512]

  for i in nl.affine_range(4):
    for j in nl.affine_range(4):
      g = nl.load(g_tensor[i * 4 + j, g_mgrid.p, g_mgrid.x])
      h = nl.load(h_tensor[i * 4 + j, h_mgrid.p, h_mgrid.x])
      i_psum = nisa.nc_matmul(g, h, tile_position=((i % 2) * 64, (j % 2) * 64), tile_size=(64, 64))
      nl.store(i_tensor[i * 4 + j, i_mgrid.p, i_mgrid.x], i_psum)

  return c_tensor, f_tensor, i_tensor


# nki.isa.nc_matmul (Example 4: transpose with is_transpose=True) / nki.language.shared_identity_matrix
@nki.jit(mode="simulation", platform_target="trn2")
def nki_nc_matmul_transpose(j_tensor):
  j_T_tensor = nl.ndarray([j_tensor.shape[1], j_tensor.shape[0]], dtype=j_tensor.dtype, buffer=nl.shared_hbm)
  ##################################################################
  # Example 4:
  # transpose matrix j of shape (128, 32) into matrix j_T of shape
  # (32, 128) using the transpose mode of the Tensor Engine: the moving
  # tensor is an identity matrix.
  ##################################################################
  j = nl.load(j_tensor)
  identity_hbm = nl.shared_identity_matrix(n=128, dtype=j.dtype)
  identity = nl.load(identity_hbm)
  j_T_psum = nisa.nc_matmul(j, identity, is_transpose=True)

  nl.store(j_T_tensor, value=j_T_psum)
  return j_T_tensor


# nki.isa.nc_matmul (Example 5: FP8 double row performance mode)
@nki.jit(mode="simulation", platform_target="trn2")
def nki_nc_matmul_double_row(a_tensor, b_tensor):
  c_tensor = nl.ndarray([a_tensor.shape[2], b_tensor.shape[2]], dtype=nl.float32, buffer=nl.shared_hbm)
  ##################################################################
  # Example 5:
  # multiply fp8 matrices a of shape (256, 128) and b of shape (256, 512),
  # laid out as (128, 2, 128) and (128, 2, 512), with the double row
  # performance mode of the Tensor Engine
  ##################################################################
  a = nl.load(a_tensor)
  b = nl.load(b_tensor)
  c_psum = nisa.nc_matmul(a, b, perf_mode="double_row_gen3")

  nl.store(c_tensor, value=c_psum)
  return c_tensor


# nki.isa.activation / nki.isa.activation_reduce
@nki.jit(mode="simulation")
def nki_activation(a_tensor, b_tensor, c_tensor):
  a_act_tensor = nl.ndarray(a_tensor.shape, dtype=a_tensor.dtype, buffer=nl.shared_hbm)
  b_act_tensor = nl.ndarray(b_tensor.shape, dtype=b_tensor.dtype, buffer=nl.shared_hbm)
  reduce_tensor = nl.ndarray((b_tensor.shape[0], 1), dtype=nl.float32, buffer=nl.shared_hbm)
  ##################################################################
  # Example 1: perform exponential function on matrix a of shape (128, 1024)
  ##################################################################
  a = nl.load(a_tensor)
  activated_a = nisa.activation(op=nl.exp, data=a)
  nl.store(a_act_tensor, activated_a)

  ##################################################################
  # Example 2: perform the following operations to matrix b of shape (128, 512)
  # using a single activation instruction:
  # 1) multiply all elements in b by 2.0,
  # 2) add a user-input vector c to the 1) result,
  # 3) apply a square function on the 2) result
  # 4) reduce along the free dimension to get a column vector of shape (128, 1)
  ##################################################################
  b = nl.load(b_tensor)
  c = nl.load(c_tensor)

  # create result tensors
  reduce_res = nl.zeros((nl.par_dim(128), 1), dtype=nl.float32)

  activated_b = nisa.activation_reduce(op=np.square, data=b, reduce_op=np.add,
                                       reduce_res=reduce_res, bias=c, scale=2.0)

  nl.store(b_act_tensor, activated_b)
  nl.store(reduce_tensor, reduce_res)
  return a_act_tensor, b_act_tensor, reduce_tensor


# nki.language.gather_flattened (and nki.language.static_range)
@nki.jit(mode="simulation")
def nki_gather_flattened():
  ##################################################################
  # Example 1: Gather values from a tensor using indices
  ##################################################################
  # Create source tensor
  N = 32
  M = 64
  data = nl.rand((N, M), dtype=nl.float32)

  # Create indices tensor - gather every 5th element
  indices = nl.zeros((N, 10), dtype=nl.uint32)
  for i in nl.static_range(10):
    indices[:, i] = i * 5

  # Gather values from data according to indices
  result = nl.gather_flattened(data=data, indices=indices)

  # Store result to output tensor
  out_tensor = nl.ndarray((N, 10), dtype=nl.float32, buffer=nl.shared_hbm)
  nl.store(out_tensor, value=result)

  data_tensor = nl.ndarray((N, M), dtype=nl.float32, buffer=nl.shared_hbm)
  nl.store(data_tensor, value=data)
  return data_tensor, out_tensor


# nki.language.shared_constant
@nki.jit(mode="simulation")
def nki_shared_constant(a_tensor):
  out_tensor = nl.ndarray(a_tensor.shape, dtype=a_tensor.dtype, buffer=nl.shared_hbm)
  ##################################################################
  # Example 1: Create a constant tensor in HBM from a numpy array
  # (a host-side value known when the kernel is traced), then add it to a.
  ##################################################################
  constant = nl.shared_constant(np.arange(4 * 8, dtype=np.float32).reshape(4, 8), dtype=nl.float32)
  c = nl.load(constant)
  a = nl.load(a_tensor)
  out = nl.add(a, c)
  nl.store(out_tensor, value=out)
  return out_tensor


# nki.language.loop_reduce
@nki.jit(mode="simulation")
def nki_loop_reduce(x_tensor, y_tensor):
  NUM_K_BLOCKS = x_tensor.shape[0]
  N_TILE_SIZE, M_TILE_SIZE = x_tensor.shape[2], y_tensor.shape[2]
  out_tensor = nl.ndarray((N_TILE_SIZE, M_TILE_SIZE), dtype=nl.float32, buffer=nl.shared_hbm)

  b = nl.zeros((N_TILE_SIZE, M_TILE_SIZE), dtype=float32, buffer=nl.sbuf)
  for k_i in affine_range(NUM_K_BLOCKS):

    # Skipping over multiple nested loops here.
    # a, is a psum tile from a matmul accumulation group.
    a = nisa.nc_matmul(nl.load(x_tensor[k_i]), nl.load(y_tensor[k_i]))
    b = nl.loop_reduce(a, op=np.add, loop_indices=[k_i], dtype=nl.float32)

  nl.store(out_tensor, value=b)
  return out_tensor


# nki.language.atomic_rmw
@nki.jit(mode="simulation")
def nki_atomic_rmw(rmw_tensor, value_tensor, indices_tensor):
  N, M = value_tensor.shape
  value: tensor[N, M] = nl.load(value_tensor)

  # dynamic indices have to be in SBUF, with shape [N, 1]
  indices_tile: tensor[N, 1] = nl.load(indices_tensor)

  ix = nl.arange(M)[None, :]

  ########################################################################
  # Atomic read-modify-write example:
  #   - read: values of rmw_tensor is indexed by values from indices_tile
  #   - modify: incremented by value
  #   - write: saved back into rmw_tensor
  # resulting in rmw_tensor = rmw_tensor + value
  ########################################################################
  nl.atomic_rmw(rmw_tensor[indices_tile, ix], value=value, op=np.add)
  return rmw_tensor


# nki.language.random_seed / nki.language.rand
@nki.jit(mode="simulation")
def nki_random_seed(seed_tensor):
  out_tensor = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
  ##################################################################
  # Example 1: Set the seed of the random number generator from a
  # [1, 1] tile, then generate a tile of uniform random values in [0, 1)
  ##################################################################
  seed = nl.load(seed_tensor)
  nl.random_seed(seed=seed)
  a = nl.rand((128, 512))
  nl.store(out_tensor, value=a)
  return out_tensor


# nki.language.dropout
@nki.jit(mode="simulation")
def nki_nl_dropout(in_tensor, rate_tensor):
  out_tensor = nl.ndarray(in_tensor.shape, dtype=in_tensor.dtype, buffer=nl.shared_hbm)
  out2_tensor = nl.ndarray(in_tensor.shape, dtype=in_tensor.dtype, buffer=nl.shared_hbm)
  ######################################################
  # Example 1: From an input tile a of shape [128, 512],
  # dropout its values with probabilities in tile b of
  # shape [128, 1] and store the result in c.
  ######################################################
  a = nl.load(in_tensor)
  b = nl.load(rate_tensor)
  c = nl.dropout(a, rate=b)
  nl.store(out_tensor, c)

  ######################################################
  # Example 2: From an input tile a, dropout its values
  # with probability of 0.2 and store the result in b.
  ######################################################
  b2 = nl.dropout(a, rate=0.2)
  nl.store(out2_tensor, b2)
  return out_tensor, out2_tensor


# nki.isa.dropout
@nki.jit(mode="simulation")
def nki_isa_dropout(in_tensor, prob_tensor):
  out_tensor = nl.ndarray(in_tensor.shape, dtype=in_tensor.dtype, buffer=nl.shared_hbm)
  out2_tensor = nl.ndarray(in_tensor.shape, dtype=in_tensor.dtype, buffer=nl.shared_hbm)
  ##################################################################
  # Example 1: From an input tile a of shape [128, 512], dropout its values
  # with probabilities in tile b of shape [128, 1] and store the result in c.
  ##################################################################
  a = nl.load(in_tensor)
  b = nl.load(prob_tensor)
  c = nisa.dropout(a, prob=b)
  nl.store(out_tensor, c)

  ######################################################
  # Example 2: From an input tile a, dropout its values
  # with probability of 0.2 and store the result in b.
  ######################################################
  b2 = nisa.dropout(a, prob=0.2)
  nl.store(out2_tensor, b2)
  return out_tensor, out2_tensor


# nki.language.all_reduce
@nki.jit(mode="simulation")
def nki_all_reduce(in_tensor):
  out_tensor = nl.ndarray(in_tensor.shape[1:], dtype=in_tensor.dtype, buffer=nl.shared_hbm)
  ##################################################################
  # Example 1: Sum the tiles of all programs of the launch grid along
  # axis 0; every program gets the sum.
  ##################################################################
  a = nl.load(in_tensor[nl.program_id(0)])
  b = nl.all_reduce(a, op=np.add, program_axes=[0])
  nl.store(out_tensor, value=b)
  return out_tensor


# nki.language.spmd_dim / nki.language.nc / nki.language.program_id
@nki.jit
def nki_spmd_kernel(a):
  b = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
  i = nl.program_id(0)
  j = nl.program_id(1)

  a_tile = nl.load(a[i, j])
  nl.store(b[i, j], a_tile)

  return b


# nki.language.num_programs / nki.language.program_ndim
@nki.jit
def nki_num_programs(a):
  b = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
  ##################################################################
  # Example 1: Split the rows of a among the programs of a 1-D launch
  # grid; each program scales its rows by the number of programs.
  ##################################################################
  num_p = nl.num_programs(axes=0)
  pid = nl.program_id(axis=0)
  rows = a.shape[0] // num_p
  a_tile = nl.load(a[pid * rows:(pid + 1) * rows, :])
  nl.store(b[pid * rows:(pid + 1) * rows, :], value=nl.multiply(a_tile, num_p * nl.program_ndim()))
  return b


# nki.isa.tensor_scalar
@nki.jit(mode="simulation")
def nki_tensor_scalar(a_tensor, c_tensor, e_tensor, f_tensor):
  b_tensor = nl.ndarray(a_tensor.shape, dtype=a_tensor.dtype, buffer=nl.shared_hbm)
  d_tensor = nl.ndarray(c_tensor.shape, dtype=c_tensor.dtype, buffer=nl.shared_hbm)
  g_tensor = nl.ndarray(e_tensor.shape, dtype=e_tensor.dtype, buffer=nl.shared_hbm)
  a = nl.load(a_tensor)
  c = nl.load(c_tensor)
  e = nl.load(e_tensor)
  f = nl.load(f_tensor)
  ##################################################################
  # Example 1: subtract 1.0 from all elements of tile a of
  # shape (128, 512) and get the output tile in b
  ##################################################################
  i_p = nl.arange(128)[:, None]
  i_f = nl.arange(512)[None, :]

  b = nisa.tensor_scalar(a[i_p, i_f], np.subtract, 1.0)

  ##################################################################
  # Example 2: broadcast 1.0 into a shape of (128, 512) and subtract
  # it with tile c to get output tile d
  ##################################################################
  i_p = nl.arange(128)[:, None]
  i_f = nl.arange(512)[None, :]

  d = nisa.tensor_scalar(c[i_p, i_f], np.subtract, 1.0, reverse0=True)

  ##################################################################
  # Example 3: broadcast multiply tile e with vector f and
  # then broadcast add with scalar 2.5;
  # tile e has a shape of (64, 1024) and vector f has a shape of (64,)
  ##################################################################
  i_p_ef = nl.arange(64)[:, None]
  i_f_e = nl.arange(1024)[None, :]
  i_f_f = nl.arange(1)[None, :]

  g = nisa.tensor_scalar(e[i_p_ef, i_f_e], op0=np.multiply, operand0=f[i_p_ef, i_f_f], op1=np.add, operand1=2.5)

  nl.store(b_tensor, b)
  nl.store(d_tensor, d)
  nl.store(g_tensor, g)
  return b_tensor, d_tensor, g_tensor


# nki.isa.tensor_tensor
@nki.jit(mode="simulation")
def nki_tensor_tensor(a_tensor, b_tensor):
  c_tensor = nl.ndarray(a_tensor.shape, dtype=a_tensor.dtype, buffer=nl.shared_hbm)
  ##################################################################
  # Example 1: add two tiles, a and b, of the same
  # shape (128, 512) element-wise and get
  # the addition result in tile c
  ##################################################################
  a: tensor[128, 512] = nl.load(a_tensor)
  b: tensor[128, 512] = nl.load(b_tensor)

  c: tensor[128, 512] = nisa.tensor_tensor(a, b, op=nl.add)

  nl.store(c_tensor, c)
  return c_tensor


# nki.isa.tensor_reduce
@nki.jit(mode="simulation")
def nki_tensor_reduce(a_tensor):
  b_tensor = nl.ndarray([a_tensor.shape[0], 1], dtype=a_tensor.dtype, buffer=nl.shared_hbm)
  a = nl.load(a_tensor)
  ##################################################################
  # Example 1: reduce add tile a of shape (128, 512)
  # in the free dimension and return
  # reduction result in tile b of shape (128, 1)
  ##################################################################
  i_p_a = nl.arange(128)[:, None]
  i_f_a = nl.arange(512)[None, :]
  b = nisa.tensor_reduce(np.add, a[i_p_a, i_f_a], axis=[1])

  nl.store(b_tensor, b)
  return b_tensor


# nki.isa.nc_transpose
@nki.jit(mode="simulation")
def nki_nc_transpose(a_tensor, b_tensor):
  aT_tensor = nl.ndarray([a_tensor.shape[1], a_tensor.shape[0]], dtype=a_tensor.dtype, buffer=nl.shared_hbm)
  bT_tensor = nl.ndarray([b_tensor.shape[1], b_tensor.shape[0]], dtype=b_tensor.dtype, buffer=nl.shared_hbm)
  a = nl.load(a_tensor)
  b = nl.load(b_tensor)
  ##################################################################
  # Example 1: transpose tile a of shape (128, 64)
  ##################################################################
  i_p_a = nl.arange(128)[:, None]
  i_f_a = nl.arange(64)[None, :]
  aT = nisa.nc_transpose(a[i_p_a, i_f_a])

  ##################################################################
  # Example 2: transpose tile b of shape (32, 2) using Vector Engine
  ##################################################################
  i_p_b = nl.arange(32)[:, None]
  i_f_b = nl.arange(2)[None, :]
  bT = nisa.nc_transpose(b[i_p_b, i_f_b], engine=nisa.vector_engine)

  nl.store(aT_tensor, aT)
  nl.store(bT_tensor, bT)
  return aT_tensor, bT_tensor


# nki.isa.memset / nki.isa.tensor_copy / nki.isa.reciprocal
@nki.jit(mode="simulation")
def nki_memset_tensor_copy_reciprocal(in_tensor):
  a_tensor = nl.ndarray([128, 128], dtype=nl.float32, buffer=nl.shared_hbm)
  out_tensor = nl.ndarray(in_tensor.shape, dtype=in_tensor.dtype, buffer=nl.shared_hbm)
  recip_tensor = nl.ndarray(in_tensor.shape, dtype=in_tensor.dtype, buffer=nl.shared_hbm)
  ##################################################################
  # Example 1: Initialize a float32 tile a of shape (128, 128)
  # with a value of 0.2
  ##################################################################
  a = nisa.memset(shape=(128, 128), value=0.2, dtype=np.float32)
  nl.store(a_tensor, value=a)

  ############################################################################
  # Example 1: Copy over the tensor to another tensor using the Vector engine.
  ############################################################################
  x = nl.load(in_tensor)
  x_copy = nisa.tensor_copy(x, engine=nisa.vector_engine)
  nl.store(out_tensor, value=x_copy)

  ############################################################################
  # Example 1: Compute the reciprocal of a tile x of shape (128, 512)
  ############################################################################
  x = nl.load(in_tensor[nl.mgrid[0:128, 0:512]])
  y = nisa.reciprocal(x)
  nl.store(recip_tensor[nl.mgrid[0:128, 0:512]], value=y)
  return a_tensor, out_tensor, recip_tensor


# nki.isa.dma_copy (indirect loads and stores with oob_mode)
@nki.jit(mode="simulation")
def nki_dma_copy(in_tensor):
  n, m = in_tensor.shape
  out_a = nl.ndarray([n, m], dtype=in_tensor.dtype, buffer=nl.shared_hbm)
  out_b = nl.ndarray([n // 2, m], dtype=in_tensor.dtype, buffer=nl.shared_hbm)
  out_c = nl.ndarray([n // 2, m], dtype=in_tensor.dtype, buffer=nl.shared_hbm)
  out_tensor = nl.ndarray([n, m], dtype=in_tensor.dtype, buffer=nl.shared_hbm)
  out_tensor2 = nl.ndarray([n, m], dtype=in_tensor.dtype, buffer=nl.shared_hbm)
  ############################################################################
  # Example 1: Copy over the tensor to another tensor
  ############################################################################
  a = nl.load(in_tensor)
  b = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
  nisa.dma_copy(dst=b, src=a)
  nl.store(out_a, value=b)

  ix, iy = nl.mgrid[0:n // 2, 0:m]
  ############################################################################
  # Example 2: Load elements from HBM with indirect addressing. If addressing
  # results out-of-bound access, the operation will fail.
  ############################################################################
  expr_arange = 2 * nl.arange(n // 2)[:, None]
  idx_tile: tensor[64, 1] = nisa.iota(expr_arange, dtype=np.int32)

  out_tile: tensor[64, 512] = nisa.memset(shape=(n // 2, m), value=-1, dtype=in_tensor.dtype)
  nisa.dma_copy(src=in_tensor[idx_tile, iy], dst=out_tile[ix, iy], oob_mode=nisa.oob_mode.error)
  nl.store(out_b, value=out_tile)

  ############################################################################
  # Example 3: Load elements from HBM with indirect addressing. If addressing
  # results in out-of-bound access, the operation will skip indices.
  ############################################################################
  expr_arange = 3 * nl.arange(n // 2)[:, None]
  idx_tile: tensor[64, 1] = nisa.iota(expr_arange, dtype=np.int32)

  out_tile: tensor[64, 512] = nisa.memset(shape=(n // 2, m), value=-1, dtype=in_tensor.dtype)
  nisa.dma_copy(src=in_tensor[idx_tile, iy], dst=out_tile[ix, iy], oob_mode=nisa.oob_mode.skip)
  nl.store(out_c, value=out_tile)

  ############################################################################
  # Example 4: Store elements to HBM with indirect addressing and with
  # out-of-bound error checking.
  ############################################################################
  in_tile: tensor[64, 512] = nl.load(in_tensor[ix, iy])
  expr_arange = 2 * nl.arange(n // 2)[:, None]
  idx_tile: tensor[64, 1] = nisa.iota(expr_arange, dtype=np.int32)
  nisa.dma_copy(src=in_tile[ix, iy], dst=out_tensor[idx_tile, iy], oob_mode=nisa.oob_mode.error)

  ############################################################################
  # Example 5: Store elements to HBM with indirect addressing. If addressing
  # results in out-of-bound access, the operation will skip indices.
  ############################################################################
  expr_arange = 3 * nl.arange(n // 2)[:, None]
  idx_tile: tensor[64, 1] = nisa.iota(expr_arange, dtype=np.int32)
  nisa.dma_copy(src=in_tile[ix, iy], dst=out_tensor2[idx_tile, iy], oob_mode=nisa.oob_mode.skip)
  return out_a, out_b, out_c, out_tensor, out_tensor2


# nki.language.device_print
@nki.jit(mode="simulation")
def nki_device_print(a_tensor):
  out_tensor = nl.ndarray(a_tensor.shape, dtype=a_tensor.dtype, buffer=nl.shared_hbm)
  a = nl.load(a_tensor)
  nl.device_print("value of a:", a)
  nl.store(out_tensor, value=a)
  return out_tensor


# nki.language.load (indirect DMA reads)
@nki.jit(mode="simulation")
def nki_load_indirect(data_tensor, idx_tensor):
  out_1 = nl.ndarray([64, 512], dtype=data_tensor.dtype, buffer=nl.shared_hbm)
  out_2 = nl.ndarray([64, 512], dtype=data_tensor.dtype, buffer=nl.shared_hbm)
  ############################################################################
  # indirect DMA read example 1:
  # - data_tensor on HBM has shape [128 x 512].
  # - idx_tensor on HBM has shape [64] (with values [0, 2, 4, 6, ...]).
  # - idx_tensor values read from HBM and stored in local idx_tile.
  # - data_tensor values read from HBM indexed by values in idx_tile
  #   and store into local data_tile.
  ############################################################################
  ix = nl.arange(64)[:, None]
  iy = nl.arange(512)[None, :]

  idx_tile = nl.load(idx_tensor[ix])
  data_tile = nl.load(data_tensor[idx_tile[ix], iy])
  nl.store(out_1, value=data_tile)

  ############################################################################
  # indirect DMA read example 2:
  # - data_tensor on HBM has shape [128 x 512].
  # - idx_tile on SBUF has shape [64 x 1] (with values [[0], [2], [4], ...]
  # generated by iota)
  # - data_tensor values read from HBM indexed by values in idx_tile
  #   and store into local data_tile.
  ############################################################################
  ix = nl.arange(64)[:, None]
  iy = nl.arange(512)[None, :]

  expr_arange = 2 * nl.arange(64)[:, None]
  idx_tile: tensor[64, 1] = nisa.iota(expr_arange, dtype=np.int32)
  data_tile = nl.load(data_tensor[idx_tile, iy])
  nl.store(out_2, value=data_tile)
  return out_1, out_2


# nki.language.store (indirect DMA writes)
@nki.jit(mode="simulation")
def nki_store_indirect(data_tensor, idx_tensor, dst_tensor, dst_tensor2):
  data_tile = nl.load(data_tensor)
  ############################################################################
  # indirect DMA write example 1:
  #  - data_tensor has shape [128 x 512].
  #  - idx_tensor on HBM has shape [64] (with values [0, 2, 4, 6, ...]).
  #  - idx_tensor values read from HBM and stored in local idx_tile.
  #  - data_tile of shape [64 x 512] values written into
  #    HBM dst_tensor indexed by values in idx_tile.
  ############################################################################
  ix = nl.arange(64)[:, None]
  iy = nl.arange(512)[None, :]
  idx_tile = nl.load(idx_tensor[ix])

  nl.store(dst_tensor[idx_tile[ix], iy], value=data_tile[0:64, 0:512])

  ############################################################################
  # indirect DMA write example 2:
  #  - data_tensor has shape [128 x 512].
  #  - idx_tile on SBUF has shape [64 x 1] (with values [[0], [2], [4], ...]
  #  generated by iota)
  #  - data_tile of shape [64 x 512] values written into
  #    HBM dst_tensor indexed by values in idx_tile.
  ############################################################################
  idx_expr = 2 * nl.arange(64)[:, None]
  idx_tile = nisa.iota(idx_expr, dtype=np.int32)

  nl.store(dst_tensor2[idx_tile, iy], value=data_tile[0:64, 0:512])
  return dst_tensor, dst_tensor2


# nki.language.load_transpose2d / nki.language.ds / nki.language.matmul
@nki.jit(mode="simulation")
def nki_load_transpose2d_ds_matmul(in_tensor, x_tensor, y_tensor):
  N, M = in_tensor.shape
  t_tensor = nl.ndarray([M, N], dtype=in_tensor.dtype, buffer=nl.shared_hbm)
  ds_tensor = nl.ndarray(in_tensor.shape, dtype=in_tensor.dtype, buffer=nl.shared_hbm)
  mm_tensor = nl.ndarray([x_tensor.shape[0], y_tensor.shape[1]], dtype=nl.float32, buffer=nl.shared_hbm)
  # load from in_tensor[F, P] that is on HBM
  # transpose and copy into local_tile[P, F] that is on SBUF
  local_tile: tensor[M, N] = nl.load_transpose2d(in_tensor)
  nl.store(t_tensor, value=local_tile)

  for i in nl.affine_range(in_tensor.shape[1] // 32):
    tile = nl.load(in_tensor[:, (i * 32):((i + 1) * 32)])
    # Same as above but use ds (dynamic slice) instead of the native
    # slice syntax
    tile = nl.load(in_tensor[:, nl.ds(i * 32, 32)])
    nl.store(ds_tensor[:, nl.ds(i * 32, 32)], value=tile)

  # matmul of x [M, K] and y [K, N]: transpose_x=False inserts the transpose of x
  x = nl.load(x_tensor)
  y = nl.load(y_tensor)
  z = nl.matmul(x, y, transpose_x=False)
  nl.store(mm_tensor, value=z)
  return t_tensor, ds_tensor, mm_tensor


# nki.language.broadcast_to
@nki.jit(mode="simulation")
def nki_broadcast_to(in_tensor):
  out_tensor = nl.ndarray([128, in_tensor.shape[1]], dtype=in_tensor.dtype, buffer=nl.shared_hbm)
  ##################################################################
  # Example 1: broadcast a tile of shape (1, 512) to (128, 512)
  ##################################################################
  in_tile = nl.load(in_tensor, dtype=in_tensor.dtype)
  out_tile = nl.broadcast_to(in_tile, shape=(128, in_tensor.shape[1]))
  nl.store(out_tensor, value=out_tile)
  return out_tensor


# nki.simulate_kernel / nki.baremetal / nki.benchmark
def nki_tensor_tensor_add(a_tensor, b_tensor):
  c_output = nl.ndarray(a_tensor.shape, dtype=a_tensor.dtype, buffer=nl.shared_hbm)

  a = nl.load(a_tensor)
  b = nl.load(b_tensor)

  c = a + b

  nl.store(c_output, c)

  return c_output


nki_tensor_tensor_add_jit = nki.jit(nki_tensor_tensor_add)
nki_tensor_tensor_add_baremetal = nki.baremetal(save_neff_name='file.neff',
                                                save_trace_name='profile.ntff')(nki_tensor_tensor_add)
nki_tensor_tensor_add_benchmark = nki.benchmark(warmup=10, iters=100, save_neff_name='file.neff',
                                                save_trace_name='profile.ntff')(nki_tensor_tensor_add)
