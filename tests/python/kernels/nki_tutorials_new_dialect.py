"""The NKI tutorials (aws-neuron nki-samples ``src/nki_samples/tutorials/*`` and the NKI documentation's
tutorials) in their new-dialect form, as they were ported for the ``nki`` package (Neuron SDK 2.27+, NKI Beta 2 /
0.3-0.6): ``import nki``, ISA calls that write into ``dst=``, outputs made with ``nl.ndarray(...,
buffer=nl.shared_hbm)`` and returned, ``nisa.dma_copy`` between HBM and SBUF, views by slices / ``.ap(...)`` /
``.broadcast(...)``, no ``nl.arange`` / ``nl.mgrid`` / ``mask=``. No nsim imports: ``import nki`` is resolved by
``nsim.compat``.

Written from memory of those public sources; where a detail of the port could not be recalled it is written the
way those authors write the new dialect:

* tensor addition (SPMD): the new dialect's launch grid is the LNC degree (``kernel[1]`` / ``kernel[2]``), so
  the [128, 512] tiles are shared out between the programs by ``nl.program_id(0)`` / ``nl.num_programs(0)``
  (the Beta-1 tutorial gave each program of a 2-D grid one tile); the caller launches ``kernel[grid]``.
* transpose 2-D and average pool 2-D: the Beta-1 ``nl.arange`` / ``nl.mgrid`` index expressions became
  ``.ap([[step, num], ...])`` access patterns over the SBUF tile (the pool sums the windows with one
  ``tensor_reduce`` over the two window axes of a 5-D view, in float32, then scales by 1/pool_size^2).
* RMSNorm, LayerNorm and softmax: the Beta-1 ``mask=(i * 128 + ix < num_rows)`` became views ``[0:p_size]``
  with ``p_size = min(128, num_rows - i * 128)``; the weight vectors are broadcast to the partitions by the
  DMA (``.ap`` with partition step 0); the ``nl`` value functions became the instructions they lower to, with
  float32 intermediates.
* Mamba v1-v3: ``B`` / ``C`` rows broadcast to the 128 channel partitions by the DMA (``.broadcast(0, 128)``
  on the HBM view); the SBUF ``+=`` of ``scanC_accum`` became ``tensor_tensor(dst=acc, data1=acc, data2=scanC,
  op=nl.add)``.
* fused self-attention for small head sizes: ``load_transpose2d`` became ``nisa.dma_transpose`` (same dtype,
  then the cast and the softmax scale in one ``tensor_scalar``); the causal ``affine_select`` reads SBUF (GpSimd
  cannot read PSUM), so the scores are evicted first and masked in place; the transposed store of the
  [d_head, 128] result is an ``.ap`` view of the output rows.

The tutorials' own indentation is kept (2 spaces, Mamba 4).
"""
import math

import numpy as np

import nki
import nki.isa as nisa
import nki.language as nl


# --------------------------------------------------------------------------------------------------
# (1) SPMD tensor addition
# --------------------------------------------------------------------------------------------------

@nki.jit
def nki_tensor_add_kernel_(a_input, b_input):
  """NKI kernel to compute element-wise addition of two input tensors.

  This kernel assumes strict input/output sizes can be uniformly tiled to [128,512], and that the row tiles
  divide evenly between the programs of the launch grid.

  Args:
      a_input: a first input tensor
      b_input: a second input tensor

  Returns:
      c_output: an output tensor
  """
  # Create output tensor shared between all SPMD instances as result tensor
  c_output = nl.ndarray(a_input.shape, dtype=a_input.dtype, buffer=nl.shared_hbm)

  TILE_P = 128
  TILE_F = 512
  num_tiles_x = a_input.shape[0] // TILE_P
  num_tiles_y = a_input.shape[1] // TILE_F

  # Every program of the launch grid takes its share of the row tiles
  tiles_per_program = num_tiles_x // nl.num_programs(0)
  first_tile = nl.program_id(0) * tiles_per_program

  for i in nl.affine_range(tiles_per_program):
    # Calculate tile offsets based on current 'program'
    offset_i_x = (first_tile + i) * TILE_P
    for j in nl.affine_range(num_tiles_y):
      offset_i_y = j * TILE_F

      # Load input data from device memory (HBM) to on-chip memory (SBUF)
      a_tile = nl.ndarray((TILE_P, TILE_F), dtype=a_input.dtype, buffer=nl.sbuf)
      nisa.dma_copy(dst=a_tile, src=a_input[offset_i_x:offset_i_x + TILE_P, offset_i_y:offset_i_y + TILE_F])
      b_tile = nl.ndarray((TILE_P, TILE_F), dtype=b_input.dtype, buffer=nl.sbuf)
      nisa.dma_copy(dst=b_tile, src=b_input[offset_i_x:offset_i_x + TILE_P, offset_i_y:offset_i_y + TILE_F])

      # compute a + b
      c_tile = nl.ndarray((TILE_P, TILE_F), dtype=a_input.dtype, buffer=nl.sbuf)
      nisa.tensor_tensor(dst=c_tile, data1=a_tile, data2=b_tile, op=nl.add)

      # store the addition results back to device memory (c_output)
      nisa.dma_copy(dst=c_output[offset_i_x:offset_i_x + TILE_P, offset_i_y:offset_i_y + TILE_F], src=c_tile)

  # Transfer the ownership of `c_output` to the caller
  return c_output


def nki_tensor_add(a_input, b_input, grid=2):
  """NKI kernel caller to compute element-wise addition of two input tensors.

  The launch grid is the number of programs (logical NeuronCore degree: 1, or 2 on trn2)."""
  return nki_tensor_add_kernel_[grid](a_input, b_input)


# --------------------------------------------------------------------------------------------------
# (2) Transpose 2-D
# --------------------------------------------------------------------------------------------------

@nki.jit
def tensor_transpose2D_kernel_(in_tensor, shape2D):
  """
  NKI kernel to reorder the elements on axis[1] of the input tensor.

  Every row of the input tensor is a flattened row-major 2D matrix.
  The shape2D argument defines the dimensions of the flattened matrices (#rows,#cols).
  Our goal in this kernel is to transpose these flattened 2D matrices, i.e. make them (#cols,#rows).

  Example:
      in_tensor = [a0,a1,a2,a3,b0,b1,b2,b3,c0,c1,c2,c3]
      shape2D = (3,4)
  this means that in_tensor has 3 rows and 4 columns, i.e. can be represented as:
      [a0,a1,a2,a3]
      [b0,b1,b2,b3]
      [c0,c1,c2,c3]
  after transpose, we expect to get:
      [a0,b0,c0]
      [a1,b1,c1]
      [a2,b2,c2]
      [a3,b3,c3]
  Thus, out_tensor is expected to be [a0,b0,c0,a1,b1,c1,a2,b2,c2,a3,b3,c3]

  Args:
    in_tensor: an input tensor
    shape2D: tuple representing the dimensions to be transposed: (#rows, #cols)
  """
  out_tensor = nl.ndarray(in_tensor.shape, dtype=in_tensor.dtype, buffer=nl.shared_hbm)
  # Gather input shapes
  sz_p, _ = in_tensor.shape

  # Load input data from external memory to on-chip memory
  in_tile = nl.ndarray(in_tensor.shape, dtype=in_tensor.dtype, buffer=nl.sbuf)
  nisa.dma_copy(dst=in_tile, src=in_tensor)

  # Performing f1/f2 transpose
  # ==========================
  # The desired transpose pattern is provided as an input:
  sz_f1, sz_f2 = shape2D

  # Perform the transposition via a SBUF-to-SBUF copy, with access-pattern manipulation.
  # The destination is written in row-major order, an (sz_f2, sz_f1) matrix per partition;
  # the source access pattern walks the (sz_f1, sz_f2) input column by column:
  # [partition step, #partitions], [step 1 over the sz_f2 columns], [step sz_f2 over the sz_f1 rows]
  out_tile = nl.ndarray((sz_p, sz_f2 * sz_f1), dtype=out_tensor.dtype, buffer=nl.sbuf)
  nisa.tensor_copy(dst=out_tile, src=in_tile.ap([[sz_f1 * sz_f2, sz_p], [1, sz_f2], [sz_f2, sz_f1]]))

  # Finally, we store out_tile to external memory
  nisa.dma_copy(dst=out_tensor, src=out_tile)

  return out_tensor


# --------------------------------------------------------------------------------------------------
# (3) Average pool 2-D
# --------------------------------------------------------------------------------------------------

@nki.jit
def tensor_avgpool_kernel(in_tensor, pool_size):
  """NKI kernel to compute a 2D avg-pool operation

  Args:
      in_tensor: an input tensor, of shape C x H x W
      pool_size: an integer representing a (square) pool-window size

  Return:
      out_tensor: the resulting output tensor, of shape C x (H/pool_size) x (W/pool_size)
  """

  # Get input/output dimensions
  sz_cin, sz_hin, sz_win = in_tensor.shape
  sz_hout = sz_hin // pool_size
  sz_wout = sz_win // pool_size
  # Create output tensor shared between all SPMD instances as result tensor
  out_tensor = nl.ndarray((sz_cin, sz_hout, sz_wout), dtype=in_tensor.dtype, buffer=nl.shared_hbm)

  # Set relevant sizes
  sz_p = sz_cin
  sz_pool = pool_size

  # Load input data from external memory to on-chip memory
  in_tile = nl.ndarray((sz_p, sz_hin, sz_win), dtype=in_tensor.dtype, buffer=nl.sbuf)
  nisa.dma_copy(dst=in_tile, src=in_tensor)

  # Generate pool index patterns (requires two extra dimensions, for the pooling window):
  # [partition], [output row], [output column], [window row], [window column]
  pool_view = in_tile.ap([[sz_hin * sz_win, sz_p],
                          [sz_pool * sz_win, sz_hout],
                          [sz_pool, sz_wout],
                          [sz_win, sz_pool],
                          [1, sz_pool]])

  # Perform the pooling operation:
  # sum over the two window axes, then scale by the window size
  sum_tile = nl.ndarray((sz_p, sz_hout, sz_wout), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_reduce(dst=sum_tile, op=nl.add, data=pool_view, axis=[3, 4])
  out_tile = nl.ndarray((sz_p, sz_hout, sz_wout), dtype=in_tensor.dtype, buffer=nl.sbuf)
  nisa.tensor_scalar(dst=out_tile, data=sum_tile, op0=nl.multiply, operand0=1.0 / (pool_size * pool_size))

  # Store the results back to hbm
  nisa.dma_copy(dst=out_tensor, src=out_tile)

  # Transfer the ownership of `out_tensor` to the caller
  return out_tensor


# --------------------------------------------------------------------------------------------------
# (4) RMSNorm
# --------------------------------------------------------------------------------------------------

@nki.jit
def nki_rmsnorm_kernel(a_tensor, g_tensor):
  # Calculate out_tensor = a_tensor/RMS(a_tensor) * g_tensor
  # Where RMS(a_tensor) = sqrt((1/N) * sum(a_tensor * a_tensor))
  # and N = a_tensor.shape[1]
  # Reduction (mean) is performed in the free (2nd) dimension
  out_tensor = nl.ndarray(a_tensor.shape, dtype=a_tensor.dtype, buffer=nl.shared_hbm)

  # Make sure shapes match
  assert a_tensor.shape[1] == g_tensor.shape[0]

  num_rows, num_cols = a_tensor.shape
  pmax = nl.tile_size.pmax

  # Load RMSNorm weight once, reused by rows/tiles of a_tensor;
  # the DMA broadcasts it along the partition dimension (partition step 0)
  g_tile = nl.ndarray((pmax, num_cols), dtype=g_tensor.dtype, buffer=nl.sbuf)
  nisa.dma_copy(dst=g_tile, src=g_tensor.ap([[0, pmax], [1, num_cols]]))

  # Process 128 rows at a time due to 128-partition tile size limitation
  # Since we're not reducing across the first dimension
  # Tiles can be processed independently
  for i in nl.affine_range(math.ceil(num_rows / pmax)):
    # Rows of this tile (the last tile may be partial)
    p_start = i * pmax
    p_size = min(pmax, num_rows - p_start)

    # Load input data from external memory to on-chip memory
    a_tile = nl.ndarray((pmax, num_cols), dtype=a_tensor.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=a_tile[0:p_size], src=a_tensor[p_start:p_start + p_size])

    # Compute element-wise square of a_tensor
    in_square = nl.ndarray((pmax, num_cols), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=in_square[0:p_size], op=nl.square, data=a_tile[0:p_size])

    # Calculate sum of squared elements, along last dimension
    square_sum = nl.ndarray((pmax, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=square_sum[0:p_size], op=nl.add, data=in_square[0:p_size], axis=1)

    # Scale (mean) and take the reciprocal of the square root
    # with rsqrt (one ISA instruction)
    rms_reciprocal = nl.ndarray((pmax, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=rms_reciprocal[0:p_size], op=nl.rsqrt, data=square_sum[0:p_size],
                    scale=1.0 / num_cols)

    # Scale the input tensor
    out_tile = nl.ndarray((pmax, num_cols), dtype=a_tensor.dtype, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=out_tile[0:p_size], data=a_tile[0:p_size], op0=nl.multiply,
                       operand0=rms_reciprocal[0:p_size])

    # Multiply with the RMSNorm weight
    nisa.tensor_tensor(dst=out_tile[0:p_size], data1=out_tile[0:p_size], data2=g_tile[0:p_size],
                       op=nl.multiply)

    # store the results back to external memory (out_tensor)
    nisa.dma_copy(dst=out_tensor[p_start:p_start + p_size], src=out_tile[0:p_size])

  return out_tensor


# --------------------------------------------------------------------------------------------------
# (5) LayerNorm
# --------------------------------------------------------------------------------------------------

@nki.jit
def nki_layernorm_kernel_v1(input_tensor, epsilon, gamma_vector, beta_vector):
  """Computes LayerNorm.
    The mean and variance computed with reductions (var = mean(x^2) - mean^2).
  """
  output_tensor = nl.ndarray(input_tensor.shape, dtype=input_tensor.dtype, buffer=nl.shared_hbm)

  # Ensure that the shapes of tensors match
  assert input_tensor.shape[1] == gamma_vector.shape[0] == beta_vector.shape[0]

  num_rows, num_cols = input_tensor.shape
  pmax = nl.tile_size.pmax

  # Load gamma and beta, which will be reused across rows/tiles of input_tensor
  # (broadcast along the partition dimension by the DMA)
  gamma_sb = nl.ndarray((pmax, num_cols), dtype=gamma_vector.dtype, buffer=nl.sbuf)
  nisa.dma_copy(dst=gamma_sb, src=gamma_vector.ap([[0, pmax], [1, num_cols]]))
  beta_sb = nl.ndarray((pmax, num_cols), dtype=beta_vector.dtype, buffer=nl.sbuf)
  nisa.dma_copy(dst=beta_sb, src=beta_vector.ap([[0, pmax], [1, num_cols]]))

  # Tile partition dimension of the input tensor by nl.tile_size.pmax
  for i in nl.affine_range(math.ceil(num_rows / pmax)):
    p_start = i * pmax
    p_size = min(pmax, num_rows - p_start)

    # Load input tile
    input_sb = nl.ndarray((pmax, num_cols), dtype=input_tensor.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=input_sb[0:p_size], src=input_tensor[p_start:p_start + p_size])

    # Compute mean = sum(x) / N
    mean = nl.ndarray((pmax, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=mean[0:p_size], op=nl.add, data=input_sb[0:p_size], axis=1)
    nisa.tensor_scalar(dst=mean[0:p_size], data=mean[0:p_size], op0=nl.multiply, operand0=1.0 / num_cols)

    # Compute var = mean(x^2) - mean^2
    square = nl.ndarray((pmax, num_cols), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=square[0:p_size], op=nl.square, data=input_sb[0:p_size])
    mean_square = nl.ndarray((pmax, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=mean_square[0:p_size], op=nl.add, data=square[0:p_size], axis=1)
    nisa.tensor_scalar(dst=mean_square[0:p_size], data=mean_square[0:p_size], op0=nl.multiply,
                       operand0=1.0 / num_cols)
    var = nl.ndarray((pmax, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=var[0:p_size], data1=mean[0:p_size], data2=mean[0:p_size], op=nl.multiply)
    nisa.tensor_tensor(dst=var[0:p_size], data1=mean_square[0:p_size], data2=var[0:p_size], op=nl.subtract)

    # Compute 1 / sqrt(var + epsilon)
    rstd = nl.ndarray((pmax, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=rstd[0:p_size], data=var[0:p_size], op0=nl.add, operand0=epsilon)
    nisa.activation(dst=rstd[0:p_size], op=nl.rsqrt, data=rstd[0:p_size])

    # Normalize: (x - mean) * rstd
    shift_scale_tensor = nl.ndarray((pmax, num_cols), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=shift_scale_tensor[0:p_size], data=input_sb[0:p_size], op0=nl.subtract,
                       operand0=mean[0:p_size])
    nisa.tensor_scalar(dst=shift_scale_tensor[0:p_size], data=shift_scale_tensor[0:p_size], op0=nl.multiply,
                       operand0=rstd[0:p_size])

    # Scale and shift: * gamma + beta
    output_sb = nl.ndarray((pmax, num_cols), dtype=output_tensor.dtype, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=shift_scale_tensor[0:p_size], data1=shift_scale_tensor[0:p_size],
                       data2=gamma_sb[0:p_size], op=nl.multiply)
    nisa.tensor_tensor(dst=output_sb[0:p_size], data1=shift_scale_tensor[0:p_size], data2=beta_sb[0:p_size],
                       op=nl.add)

    nisa.dma_copy(dst=output_tensor[p_start:p_start + p_size], src=output_sb[0:p_size])

  return output_tensor


@nki.jit
def nki_layernorm_kernel_v2(input_tensor, epsilon, gamma_vector, beta_vector):
  """Computes LayerNorm.
    Used nki.isa APIs to calculate mean/variance and perform shift/scale.
  """
  output_tensor = nl.ndarray(input_tensor.shape, dtype=input_tensor.dtype, buffer=nl.shared_hbm)

  # Ensure that the shapes of tensors match
  assert input_tensor.shape[1] == gamma_vector.shape[0] == beta_vector.shape[0]

  num_rows, num_cols = input_tensor.shape
  pmax = nl.tile_size.pmax

  # Load gamma and beta, which will be reused across rows/tiles of input_tensor
  gamma_sb = nl.ndarray((pmax, num_cols), dtype=gamma_vector.dtype, buffer=nl.sbuf)
  nisa.dma_copy(dst=gamma_sb, src=gamma_vector.ap([[0, pmax], [1, num_cols]]))
  beta_sb = nl.ndarray((pmax, num_cols), dtype=beta_vector.dtype, buffer=nl.sbuf)
  nisa.dma_copy(dst=beta_sb, src=beta_vector.ap([[0, pmax], [1, num_cols]]))

  # Tile partition dimension of the input tensor by nl.tile_size.pmax
  for i in nl.affine_range(math.ceil(num_rows / pmax)):
    p_start = i * pmax
    p_size = min(pmax, num_rows - p_start)

    # Load input tile
    input_sb = nl.ndarray((pmax, num_cols), dtype=input_tensor.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=input_sb[0:p_size], src=input_tensor[p_start:p_start + p_size])

    # Tile free dimension of the input tensor by nl.tile_size.bn_stats_fmax,
    # as bn_stats has a free dimension size limit
    bn_stats_fmax = nl.tile_size.bn_stats_fmax
    num_bn_stats = math.ceil(num_cols / bn_stats_fmax)
    stats_results = nl.ndarray((pmax, 6 * num_bn_stats), dtype=nl.float32, buffer=nl.sbuf)
    for j in nl.affine_range(num_bn_stats):
      f_start = j * bn_stats_fmax
      f_size = min(bn_stats_fmax, num_cols - f_start)
      nisa.bn_stats(dst=stats_results[0:p_size, j * 6:(j + 1) * 6],
                    data=input_sb[0:p_size, f_start:f_start + f_size])

    # Aggregate bn_stats results to compute mean and var
    mean_var = nl.ndarray((pmax, 2), dtype=nl.float32, buffer=nl.sbuf)
    nisa.bn_aggr(dst=mean_var[0:p_size], data=stats_results[0:p_size])
    mean = mean_var[0:p_size, 0:1]
    var = mean_var[0:p_size, 1:2]

    # Get reciprocal of sqrt(var + epsilon)
    scale_var = nl.ndarray((pmax, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=scale_var[0:p_size], data=var, op0=nl.add, operand0=epsilon)
    nisa.activation(dst=scale_var[0:p_size], op=nl.rsqrt, data=scale_var[0:p_size])

    # Putting the shift and scale together in one line to trigger two alu_op tensor_scalar instruction
    shift_scale_tensor = nl.ndarray((pmax, num_cols), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=shift_scale_tensor[0:p_size], data=input_sb[0:p_size], op0=nl.subtract,
                       operand0=mean, op1=nl.multiply, operand1=scale_var[0:p_size])

    # Scale the normalized tensor by gamma and shift it by beta
    output_sb = nl.ndarray((pmax, num_cols), dtype=output_tensor.dtype, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=shift_scale_tensor[0:p_size], data1=shift_scale_tensor[0:p_size],
                       data2=gamma_sb[0:p_size], op=nl.multiply)
    nisa.tensor_tensor(dst=output_sb[0:p_size], data1=shift_scale_tensor[0:p_size], data2=beta_sb[0:p_size],
                       op=nl.add)

    nisa.dma_copy(dst=output_tensor[p_start:p_start + p_size], src=output_sb[0:p_size])

  return output_tensor


# --------------------------------------------------------------------------------------------------
# (6) Fused Mamba
# --------------------------------------------------------------------------------------------------

@nki.jit
def mamba_v1(delta, u, A, B, C):
    """Computes the SSM operation in the Mamba model.

    :param delta: (batch_size, channels, seq_len)
    :param u: (batch_size, channels, seq_len)
    :param A: (channels, state_size)
    :param B: (batch_size, state_size, seq_len)
    :param C: (batch_size, state_size, seq_len)
    :return: (batch_size, channels, seq_len)
    """
    batch_size, channels, seq_len = delta.shape
    output = nl.ndarray((batch_size, channels, seq_len), dtype=delta.dtype,
                        buffer=nl.shared_hbm)

    _, state_size = A.shape

    # We can relax this using mask paramters in all the NKI API calls
    assert channels % 128 == 0

    # Map channels to the partition dimension
    # Tile channels to comply with NKI tile size constraints
    channel_psize = nl.tile_size.pmax
    n_channel_tile = channels // channel_psize

    # Most outer loop with batch_size, parallel_for
    for i_batch in nl.affine_range(batch_size):
        # partial accumulated scanC result with processed states
        scanC_accum = nl.zeros((channel_psize, n_channel_tile, seq_len), dtype=delta.dtype, buffer=nl.sbuf)

        # Second outer loop with state_size, partial parallel
        for i_state in nl.affine_range(state_size):

            # Inner loop: tiling channels
            for i_channel_tile in nl.affine_range(n_channel_tile):
                channel_start = i_channel_tile * channel_psize

                # Load the relevant tile from delta and A
                delta_i = nl.ndarray((channel_psize, seq_len), dtype=delta.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=delta_i, src=delta[i_batch, channel_start:channel_start + channel_psize, 0:seq_len])
                A_i = nl.ndarray((channel_psize, 1), dtype=A.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=A_i, src=A[channel_start:channel_start + channel_psize, i_state:i_state + 1])

                # Step 1&2: Element-wise multiplication of delta_i and A_i and then exponential
                deltaA = nl.ndarray((channel_psize, seq_len), dtype=delta.dtype, buffer=nl.sbuf)
                nisa.activation(dst=deltaA, op=nl.exp, data=delta_i, scale=A_i)

                # Load the relevant tile from u and B
                u_i = nl.ndarray((channel_psize, seq_len), dtype=u.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=u_i, src=u[i_batch, channel_start:channel_start + channel_psize, 0:seq_len])
                B_i_bcast = nl.ndarray((channel_psize, seq_len), dtype=B.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=B_i_bcast, src=B[i_batch, i_state:i_state + 1, 0:seq_len].broadcast(0, channel_psize))

                # Step 3: Element-wise multiplication of delta_i, B_i and u_i
                deltaU = nl.ndarray((channel_psize, seq_len), dtype=delta.dtype, buffer=nl.sbuf)
                nisa.tensor_tensor(dst=deltaU, data1=delta_i, data2=u_i, op=nl.multiply)
                deltaBu = nl.ndarray((channel_psize, seq_len), dtype=delta.dtype, buffer=nl.sbuf)
                nisa.tensor_tensor(dst=deltaBu, data1=deltaU, data2=B_i_bcast, op=nl.multiply)

                # Step 4: Associative scan between deltaA and deltaBu
                scan_res = nl.ndarray((channel_psize, seq_len), dtype=delta.dtype, buffer=nl.sbuf)
                nisa.tensor_tensor_scan(dst=scan_res, data0=deltaA, data1=deltaBu, initial=0,
                                        op0=nl.multiply, op1=nl.add)

                # Load the relevant tile from C
                C_i_bcast = nl.ndarray((channel_psize, seq_len), dtype=C.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=C_i_bcast, src=C[i_batch, i_state:i_state + 1, 0:seq_len].broadcast(0, channel_psize))

                # Step 5: Element-wise multiplication of scan_res and C_i
                scanC = nl.ndarray((channel_psize, seq_len), dtype=delta.dtype, buffer=nl.sbuf)
                nisa.tensor_tensor(dst=scanC, data1=scan_res, data2=C_i_bcast, op=nl.multiply)

                # Step 6: Accumulation of scanC along state_size dimension
                nisa.tensor_tensor(dst=scanC_accum[0:channel_psize, i_channel_tile, 0:seq_len],
                                   data1=scanC_accum[0:channel_psize, i_channel_tile, 0:seq_len],
                                   data2=scanC, op=nl.add)

        # Store scanC_accum for a single batch to output
        for i_channel_tile in nl.affine_range(n_channel_tile):
            channel_start = i_channel_tile * channel_psize
            nisa.dma_copy(dst=output[i_batch, channel_start:channel_start + channel_psize, 0:seq_len],
                          src=scanC_accum[0:channel_psize, i_channel_tile, 0:seq_len])

    return output


@nki.jit
def mamba_v2(delta, u, A, B, C):
    """Computes the SSM operation in the Mamba model.

    Loop reordering: channel tiles outside the state loop, so that delta and u are loaded once per channel
    tile.

    :param delta: (batch_size, channels, seq_len)
    :param u: (batch_size, channels, seq_len)
    :param A: (channels, state_size)
    :param B: (batch_size, state_size, seq_len)
    :param C: (batch_size, state_size, seq_len)
    :return: (batch_size, channels, seq_len)
    """
    batch_size, channels, seq_len = delta.shape
    output = nl.ndarray((batch_size, channels, seq_len), dtype=delta.dtype,
                        buffer=nl.shared_hbm)
    _, state_size = A.shape

    assert channels % 128 == 0

    # Map channels to the partition dimension
    # Tile channels to comply with NKI tile size constraints
    channel_psize = nl.tile_size.pmax
    n_channel_tile = channels // channel_psize

    # Most outer loop with batch_size, parallel_for
    for i_batch in nl.affine_range(batch_size):

        # Second outer loop: tiling channels
        for i_channel_tile in nl.affine_range(n_channel_tile):
            channel_start = i_channel_tile * channel_psize

            # partial accumulated scanC result with processed states
            scanC_accum = nl.zeros((channel_psize, seq_len), dtype=delta.dtype, buffer=nl.sbuf)

            # Load delta/u once to be reused across states
            delta_i = nl.ndarray((channel_psize, seq_len), dtype=delta.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=delta_i, src=delta[i_batch, channel_start:channel_start + channel_psize, 0:seq_len])
            u_i = nl.ndarray((channel_psize, seq_len), dtype=u.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=u_i, src=u[i_batch, channel_start:channel_start + channel_psize, 0:seq_len])

            # Inner loop with state_size, partial parallel
            for i_state in nl.affine_range(state_size):
                # Load the relevant tile from A
                A_i = nl.ndarray((channel_psize, 1), dtype=A.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=A_i, src=A[channel_start:channel_start + channel_psize, i_state:i_state + 1])

                # Step 1&2: Element-wise multiplication of delta_i and A_i and then exponential
                deltaA = nl.ndarray((channel_psize, seq_len), dtype=delta.dtype, buffer=nl.sbuf)
                nisa.activation(dst=deltaA, op=nl.exp, data=delta_i, scale=A_i)

                # Load the relevant tile from B
                B_i_bcast = nl.ndarray((channel_psize, seq_len), dtype=B.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=B_i_bcast, src=B[i_batch, i_state:i_state + 1, 0:seq_len].broadcast(0, channel_psize))

                # Step 3: Element-wise multiplication of delta_i, B_i and u_i
                deltaU = nl.ndarray((channel_psize, seq_len), dtype=delta.dtype, buffer=nl.sbuf)
                nisa.tensor_tensor(dst=deltaU, data1=delta_i, data2=u_i, op=nl.multiply)
                deltaBu = nl.ndarray((channel_psize, seq_len), dtype=delta.dtype, buffer=nl.sbuf)
                nisa.tensor_tensor(dst=deltaBu, data1=deltaU, data2=B_i_bcast, op=nl.multiply)

                # Step 4: Associative scan between deltaA and deltaBu
                scan_res = nl.ndarray((channel_psize, seq_len), dtype=delta.dtype, buffer=nl.sbuf)
                nisa.tensor_tensor_scan(dst=scan_res, data0=deltaA, data1=deltaBu, initial=0,
                                        op0=nl.multiply, op1=nl.add)

                # Load the relevant tile from C
                C_i_bcast = nl.ndarray((channel_psize, seq_len), dtype=C.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=C_i_bcast, src=C[i_batch, i_state:i_state + 1, 0:seq_len].broadcast(0, channel_psize))

                # Step 5: Element-wise multiplication of scan_res and C_i
                scanC = nl.ndarray((channel_psize, seq_len), dtype=delta.dtype, buffer=nl.sbuf)
                nisa.tensor_tensor(dst=scanC, data1=scan_res, data2=C_i_bcast, op=nl.multiply)

                # Step 6: Accumulation of scanC along state_size dimension
                nisa.tensor_tensor(dst=scanC_accum, data1=scanC_accum, data2=scanC, op=nl.add)

            # Store scanC_accum for a single batch to output
            nisa.dma_copy(dst=output[i_batch, channel_start:channel_start + channel_psize, 0:seq_len],
                          src=scanC_accum[0:channel_psize, 0:seq_len])

    return output


@nki.jit
def mamba_v3(delta, u, A, B, C):
    """Computes the SSM operation in the Mamba model.

    Sequence tiling: the scan runs over seq_len in 512-wide steps, the last column of a step's result is
    the initial value of the next step's scan.

    :param delta: (batch_size, channels, seq_len)
    :param u: (batch_size, channels, seq_len)
    :param A: (channels, state_size)
    :param B: (batch_size, state_size, seq_len)
    :param C: (batch_size, state_size, seq_len)
    :return: (batch_size, channels, seq_len)
    """
    batch_size, channels, seq_len = delta.shape
    output = nl.ndarray((batch_size, channels, seq_len), dtype=delta.dtype,
                        buffer=nl.shared_hbm)
    _, state_size = A.shape

    # Map channels to the partition dimension
    # Tile channels to comply with NKI tile size constraints
    channel_psize = nl.tile_size.pmax
    n_channel_tile = channels // channel_psize

    # Magic number, decided through empiracal profiling data
    seq_len_fsize = 512
    n_seq_len_tile = seq_len // seq_len_fsize

    # Fix this later with mask
    assert channels % channel_psize == 0
    assert seq_len % seq_len_fsize == 0

    # Most outer loop with batch_size, parallel_for
    for i_batch in nl.affine_range(batch_size):

        # Second outer loop: tiling channels
        for i_channel_tile in nl.affine_range(n_channel_tile):
            channel_start = i_channel_tile * channel_psize

            # partial accumulated scanC result with processed states
            scanC_accum = nl.zeros((channel_psize, seq_len), dtype=delta.dtype, buffer=nl.sbuf)

            # Load delta/u once to be reused across states
            delta_i = nl.ndarray((channel_psize, seq_len), dtype=delta.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=delta_i, src=delta[i_batch, channel_start:channel_start + channel_psize, 0:seq_len])
            u_i = nl.ndarray((channel_psize, seq_len), dtype=u.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=u_i, src=u[i_batch, channel_start:channel_start + channel_psize, 0:seq_len])

            # Inner loop with state_size, partial parallel
            for i_state in nl.affine_range(state_size):
                # Load the relevant tile from A, B and C
                A_i = nl.ndarray((channel_psize, 1), dtype=A.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=A_i, src=A[channel_start:channel_start + channel_psize, i_state:i_state + 1])
                B_i = nl.ndarray((channel_psize, seq_len), dtype=B.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=B_i, src=B[i_batch, i_state:i_state + 1, 0:seq_len].broadcast(0, channel_psize))
                C_i = nl.ndarray((channel_psize, seq_len), dtype=C.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=C_i, src=C[i_batch, i_state:i_state + 1, 0:seq_len].broadcast(0, channel_psize))

                # Initial value of the scan of the first sequence tile
                scan_init = nl.zeros((channel_psize, 1), dtype=delta.dtype, buffer=nl.sbuf)

                # Inner loop with seq_len, sequential: each tile's scan starts where the previous one ended
                for i_seq_len_tile in nl.static_range(n_seq_len_tile):
                    seq_len_start = i_seq_len_tile * seq_len_fsize

                    # Step 1&2: Element-wise multiplication of delta_i and A_i and then exponential
                    deltaA = nl.ndarray((channel_psize, seq_len_fsize), dtype=delta.dtype, buffer=nl.sbuf)
                    nisa.activation(dst=deltaA, op=nl.exp,
                                    data=delta_i[0:channel_psize, seq_len_start:seq_len_start + seq_len_fsize],
                                    scale=A_i)

                    # Step 3: Element-wise multiplication of delta_i, B_i and u_i
                    deltaU = nl.ndarray((channel_psize, seq_len_fsize), dtype=delta.dtype, buffer=nl.sbuf)
                    nisa.tensor_tensor(dst=deltaU,
                                       data1=delta_i[0:channel_psize, seq_len_start:seq_len_start + seq_len_fsize],
                                       data2=u_i[0:channel_psize, seq_len_start:seq_len_start + seq_len_fsize],
                                       op=nl.multiply)
                    deltaBu = nl.ndarray((channel_psize, seq_len_fsize), dtype=delta.dtype, buffer=nl.sbuf)
                    nisa.tensor_tensor(dst=deltaBu, data1=deltaU,
                                       data2=B_i[0:channel_psize, seq_len_start:seq_len_start + seq_len_fsize],
                                       op=nl.multiply)

                    # Step 4: Associative scan between deltaA and deltaBu
                    scan_res = nl.ndarray((channel_psize, seq_len_fsize), dtype=delta.dtype, buffer=nl.sbuf)
                    nisa.tensor_tensor_scan(dst=scan_res, data0=deltaA, data1=deltaBu, initial=scan_init,
                                            op0=nl.multiply, op1=nl.add)
                    nisa.tensor_copy(dst=scan_init, src=scan_res[0:channel_psize, seq_len_fsize - 1:seq_len_fsize])

                    # Step 5: Element-wise multiplication of scan_res and C_i
                    scanC = nl.ndarray((channel_psize, seq_len_fsize), dtype=delta.dtype, buffer=nl.sbuf)
                    nisa.tensor_tensor(dst=scanC, data1=scan_res,
                                       data2=C_i[0:channel_psize, seq_len_start:seq_len_start + seq_len_fsize],
                                       op=nl.multiply)

                    # Step 6: Accumulation of scanC along state_size dimension
                    nisa.tensor_tensor(dst=scanC_accum[0:channel_psize, seq_len_start:seq_len_start + seq_len_fsize],
                                       data1=scanC_accum[0:channel_psize, seq_len_start:seq_len_start + seq_len_fsize],
                                       data2=scanC, op=nl.add)

            # Store scanC_accum for a single batch to output
            nisa.dma_copy(dst=output[i_batch, channel_start:channel_start + channel_psize, 0:seq_len],
                          src=scanC_accum[0:channel_psize, 0:seq_len])

    return output


# --------------------------------------------------------------------------------------------------
# (7) Fused self-attention for small head sizes (Stable Diffusion)
# --------------------------------------------------------------------------------------------------

@nki.jit
def fused_self_attn_for_SD_small_head_size(q_ref, k_ref, v_ref, use_causal_mask=False,
                                           mixed_precision=True):
  """
  Fused self attention kernel for small head size Stable Diffusion workload.

  Computes softmax(QK^T)V. Decoder model can optionally include a causal mask
  application. Does not include QKV projection, output projection, dropout,
  residual connection, etc.

  This kernel is designed to be used for Stable Diffusion models where the
  d_head is smaller or equal to 128. Assertion is thrown if `d_head` does
  not satisfy the requirement.

  IO tensor layouts:
   - q_ptr: shape   (seq_q, d_head)
   - k_ptr: shape   (seq_k, d_head)
   - v_ptr: shape   (seq_v, d_head)
   - out_ptr: shape (seq_q, d_head)
   - We use seq_q and seq_k just for clarity, this kernel requires seq_q == seq_k

  IO tensor dtypes:
   - This kernel assumes all IO tensors have the same dtype
   - If mixed_precision is True, then all Tensor Engine operation will be performed in
     bfloat16 and accumulation will be performed in float32. Otherwise the intermediates
     will be in the same type as the inputs.
  """
  # Use q_ref dtype as the intermediate tensor dtype
  # Assume all IO tensors have the same dtype
  kernel_dtype = q_ref.dtype
  pe_in_dt = nl.bfloat16 if mixed_precision else np.float32
  assert q_ref.dtype == k_ref.dtype == v_ref.dtype

  # Shape checking
  seqlen, d_head = q_ref.shape
  assert d_head <= 128, "Cannot use this kernel for d_head > 128"
  assert tuple(q_ref.shape) == (seqlen, d_head), 'Input shape mismatch!'
  assert tuple(k_ref.shape) == (seqlen, d_head), 'Input shape mismatch!'
  assert tuple(v_ref.shape) == (seqlen, d_head), \
    f'Input shape mismatch! Expect {(seqlen, d_head)} Actual {tuple(v_ref.shape)}'
  out_ref = nl.ndarray((seqlen, d_head), dtype=q_ref.dtype, buffer=nl.shared_hbm)

  # Softmax scaling factor, multiplied onto Q
  softmax_scale = 0.125

  q_seq_n_tiles, q_seq_tile_size = seqlen // 128, 128
  k_seq_n_tiles, k_seq_tile_size = seqlen // 128, 128
  # No tiling on d_head dimension since the dimension of d_head fits in SB
  d_head_tile_size = d_head
  v_seq_n_tiles, v_seq_tile_size = seqlen // 128, 128

  ###################################
  # Step 1. transpose(tensor_v)
  ###################################
  # Buffer for v matrix transposed
  # Pre-fetch and keep it in SBUF throughout the entire kernel
  trans_v = nl.ndarray((v_seq_tile_size, v_seq_n_tiles, d_head), dtype=pe_in_dt, buffer=nl.sbuf)

  # Job 1: Load v in 128x128 tiles
  for i_v_seq_tile in nl.affine_range(v_seq_n_tiles):
    nisa.dma_copy(dst=trans_v[:, i_v_seq_tile, :],
                  src=v_ref[i_v_seq_tile * v_seq_tile_size:(i_v_seq_tile + 1) * v_seq_tile_size, :])

  q_local = nl.ndarray((d_head_tile_size, q_seq_n_tiles, q_seq_tile_size), dtype=pe_in_dt, buffer=nl.sbuf)
  for i_q_seq_tile in nl.affine_range(q_seq_n_tiles):
    # Load q transposed ([d_head, 128]) and apply the softmax scale
    q_raw = nl.ndarray((d_head_tile_size, q_seq_tile_size), dtype=kernel_dtype, buffer=nl.sbuf)
    nisa.dma_transpose(dst=q_raw,
                       src=q_ref[i_q_seq_tile * q_seq_tile_size:(i_q_seq_tile + 1) * q_seq_tile_size, :])
    nisa.tensor_scalar(dst=q_local[:, i_q_seq_tile, :], data=q_raw, op0=nl.multiply, operand0=softmax_scale)

  k_local = nl.ndarray((d_head_tile_size, k_seq_n_tiles, k_seq_tile_size), dtype=pe_in_dt, buffer=nl.sbuf)
  for i_k_seq_tile in nl.affine_range(k_seq_n_tiles):
    # Load k transposed ([d_head, 128])
    k_raw = nl.ndarray((d_head_tile_size, k_seq_tile_size), dtype=kernel_dtype, buffer=nl.sbuf)
    nisa.dma_transpose(dst=k_raw,
                       src=k_ref[i_k_seq_tile * k_seq_tile_size:(i_k_seq_tile + 1) * k_seq_tile_size, :])
    nisa.tensor_copy(dst=k_local[:, i_k_seq_tile, :], src=k_raw)

  ###################################
  # Step 2. matmul(q, k) and softmax
  ###################################
  for i_q_seq_tile in nl.affine_range(q_seq_n_tiles):
    # A SBUF buffer for an independent softmax tile
    qk_res_buf = nl.ndarray((q_seq_tile_size, seqlen), dtype=kernel_dtype, buffer=nl.sbuf)

    neg_max_res = nl.ndarray((q_seq_tile_size, k_seq_n_tiles), dtype=kernel_dtype, buffer=nl.sbuf)

    # Loop over RHS free of matmul(stationary=tensor_q, moving=tensor_k, contract=d_head)
    for i_k_seq_tile in nl.affine_range(k_seq_n_tiles):
      k_start = i_k_seq_tile * k_seq_tile_size

      # Tensor indices for accessing qk result in k_seq_tile_size
      qk_psum = nl.ndarray((q_seq_tile_size, k_seq_tile_size), dtype=nl.float32, buffer=nl.psum)

      # Loop over contraction dim of Step 1 matmul
      nisa.nc_matmul(dst=qk_psum, stationary=q_local[:, i_q_seq_tile, :], moving=k_local[:, i_k_seq_tile, :])

      # Evict the scores of this tile to SBUF
      nisa.tensor_copy(dst=qk_res_buf[:, k_start:k_start + k_seq_tile_size], src=qk_psum)

      if use_causal_mask:
        # mask are used to only apply computation to the lower half of the matrix,
        # which reduce the arthimetic intensity by half:
        # keep where q_pos - k_pos = (i_q - i_k) * 128 + p - f >= 0
        nisa.affine_select(dst=qk_res_buf[:, k_start:k_start + k_seq_tile_size],
                           pattern=[[-1, k_seq_tile_size]],
                           offset=i_q_seq_tile * q_seq_tile_size - k_start,
                           channel_multiplier=1,
                           on_true_tile=qk_res_buf[:, k_start:k_start + k_seq_tile_size],
                           on_false_value=-9984.0,
                           cmp_op=nl.greater_equal)

      # Calculate max of the current tile
      nisa.tensor_reduce(dst=neg_max_res[:, i_k_seq_tile:i_k_seq_tile + 1], op=nl.maximum,
                         data=qk_res_buf[:, k_start:k_start + k_seq_tile_size], axis=1, negate=True)

    neg_max_res_final = nl.ndarray((q_seq_tile_size, 1), dtype=kernel_dtype, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=neg_max_res_final, op=nl.minimum, data=neg_max_res, axis=1, negate=False)

    softmax_res = nl.ndarray((q_seq_tile_size, seqlen), dtype=pe_in_dt, buffer=nl.sbuf)
    sum_divisor = nl.ndarray((q_seq_tile_size, d_head_tile_size), dtype=kernel_dtype, buffer=nl.sbuf)

    # Simply use a large tile of seq_len in size since this is a "blocking" instruction
    # Assuming the compiler will merge exp and reduce_add into a single instruction on ACT
    exp_res = nl.ndarray((q_seq_tile_size, seqlen), dtype=kernel_dtype, buffer=nl.sbuf)
    nisa.activation(dst=exp_res, op=nl.exp, data=qk_res_buf, bias=neg_max_res_final, scale=1.0)

    sum_res = nl.ndarray((q_seq_tile_size, 1), dtype=kernel_dtype, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=sum_res, op=nl.add, data=exp_res, axis=1)
    nisa.tensor_copy(dst=softmax_res, src=exp_res)

    sum_reciprocal = nl.ndarray((q_seq_tile_size, 1), dtype=kernel_dtype, buffer=nl.sbuf)
    nisa.reciprocal(dst=sum_reciprocal, data=sum_res)
    nisa.tensor_copy(dst=sum_divisor, src=sum_reciprocal.broadcast(1, d_head_tile_size))

    # Buffer for transposed softmax results (FP32 in PSUM)
    trans_softmax_res = nl.ndarray((k_seq_tile_size, k_seq_n_tiles, q_seq_tile_size), dtype=pe_in_dt,
                                   buffer=nl.sbuf)

    # Result psum buffer has the hidden dim as P
    attn_res_psum = nl.ndarray((d_head_tile_size, q_seq_tile_size), dtype=nl.float32, buffer=nl.psum)

    for i_k_seq_tile in nl.affine_range(k_seq_n_tiles):
      k_start = i_k_seq_tile * k_seq_tile_size
      trans_psum = nl.ndarray((k_seq_tile_size, q_seq_tile_size), dtype=pe_in_dt, buffer=nl.psum)
      nisa.nc_transpose(dst=trans_psum, data=softmax_res[:, k_start:k_start + k_seq_tile_size])
      nisa.tensor_copy(dst=trans_softmax_res[:, i_k_seq_tile, :], src=trans_psum)

    # Loop over contraction dim of Step 2 matmul
    for i_k_seq_tile in nl.affine_range(k_seq_n_tiles):
      nisa.nc_matmul(dst=attn_res_psum, stationary=trans_v[:, i_k_seq_tile, :],
                     moving=trans_softmax_res[:, i_k_seq_tile, :])

    attn_res_sbuf = nl.ndarray((d_head_tile_size, q_seq_tile_size), dtype=kernel_dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=attn_res_sbuf, src=attn_res_psum)

    sum_divisor_t = nl.ndarray((d_head_tile_size, q_seq_tile_size), dtype=kernel_dtype, buffer=nl.psum)
    nisa.nc_transpose(dst=sum_divisor_t, data=sum_divisor)
    attn_res_div = nl.ndarray((d_head_tile_size, q_seq_tile_size), dtype=kernel_dtype, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=attn_res_div, data1=attn_res_sbuf, data2=sum_divisor_t, op=nl.multiply)

    # Store the [d_head, 128] result transposed into rows of out_ref
    nisa.dma_copy(dst=out_ref.ap([[1, d_head_tile_size], [d_head, q_seq_tile_size]],
                                 offset=i_q_seq_tile * q_seq_tile_size * d_head),
                  src=attn_res_div)

  return out_ref


# --------------------------------------------------------------------------------------------------
# (8) Softmax
# --------------------------------------------------------------------------------------------------

@nki.jit
def nki_softmax_kernel(a_tensor):
  # Calculate out_tensor = softmax(a_tensor) along the free (2nd) dimension
  out_tensor = nl.ndarray(a_tensor.shape, dtype=a_tensor.dtype, buffer=nl.shared_hbm)

  num_rows, num_cols = a_tensor.shape
  pmax = nl.tile_size.pmax

  # Process 128 rows at a time due to 128-partition tile size limitation
  for i in nl.affine_range(math.ceil(num_rows / pmax)):
    p_start = i * pmax
    p_size = min(pmax, num_rows - p_start)

    # Load input data from external memory to on-chip memory
    a_tile = nl.ndarray((pmax, num_cols), dtype=a_tensor.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=a_tile[0:p_size], src=a_tensor[p_start:p_start + p_size])

    # Find max and subtract from each value to ensure numerical stability
    max_vals = nl.ndarray((pmax, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=max_vals[0:p_size], op=nl.maximum, data=a_tile[0:p_size], axis=1, keepdims=True)
    shifted = nl.ndarray((pmax, num_cols), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=shifted[0:p_size], data=a_tile[0:p_size], op0=nl.subtract, operand0=max_vals[0:p_size])

    # Compute element-wise exp of the shifted values
    numerator = nl.ndarray((pmax, num_cols), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=numerator[0:p_size], op=nl.exp, data=shifted[0:p_size])

    # Calculate sum of the exponentials, along last dimension
    denominator = nl.ndarray((pmax, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=denominator[0:p_size], op=nl.add, data=numerator[0:p_size], axis=1, keepdims=True)

    # Divide by the sum: multiply by its reciprocal
    recip = nl.ndarray((pmax, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.reciprocal(dst=recip[0:p_size], data=denominator[0:p_size])
    sm = nl.ndarray((pmax, num_cols), dtype=a_tensor.dtype, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=sm[0:p_size], data=numerator[0:p_size], op0=nl.multiply, operand0=recip[0:p_size])

    # store the results back to external memory (out_tensor)
    nisa.dma_copy(dst=out_tensor[p_start:p_start + p_size], src=sm[0:p_size])

  return out_tensor
