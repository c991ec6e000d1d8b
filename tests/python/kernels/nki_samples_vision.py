"""Two vision kernels of the public nki-samples repository (``src/nki_samples/reference/vision.py``):
``select_and_scatter_kernel`` (the backward pass of a 3x3 / stride 2 / padding 1 max-pool: select the maximum of
each window of the operand and scatter the source gradient to it, adding where windows overlap) and
``resize_nearest_fixed_dma_kernel`` (nearest-neighbour resize of an NHWC image done only with DMAs, one load and
one store per output pixel, the source pixel of each computed on the host).

Written from memory of the nki-samples source, in the sample's own style (Beta-1 dialect, 2-space indentation,
``nl.mgrid`` index tiles, masks on the partition tail): the loops, tiling and index expressions follow the
sample as far as remembered, but small deviations from the published code are possible. No nsim imports."""
import numpy as np

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl
from neuronxcc.nki.language import par_dim


@nki.jit
def select_and_scatter_kernel(operand_tensor, source_tensor):
  """
  Implementation of a select-and-scatter kernel.

  It selects an element from each window of operand_tensor, and then scatters
  source_tensor to the indices of the selected positions to construct out_tensor
  with the same shape as the operand_tensor.

  This kernel assumes that
   - windows dimensions: (3, 3)
   - windows strides: (2, 2)
   - padding: (1, 1)
   - init value: 0
   - select function: greater equal (the first maximum of a window is selected)
   - scatter function: add

  IO Tensor layouts:
   - operand_tensor: shape   (n, c, h, w)
   - source_tensor : shape   (n, c, src_h, src_w)
   - out_tensor    : shape   (n, c, h, w)

  IO tensor dtypes:
   - This kernel assumes all IO tensors have the same dtype.
   - If operand_tensor, source_tensor and out_tensor are specified as bfloat16,
     compute for the kernel is in float32.
  """

  N, C, H, W = operand_tensor.shape  # batch, channel, height, width
  sw_h, sw_w = 3, 3  # set window dimensions to 3
  stride_h, stride_w = 2, 2  # set strides to 2
  padding = (1, 1)
  src_n, src_c, src_h, src_w = source_tensor.shape

  # check dimensions and strides match
  assert N == src_n and C == src_c
  assert (H + 2 * padding[0] - sw_h) // stride_h + 1 == src_h
  assert (W + 2 * padding[1] - sw_w) // stride_w + 1 == src_w
  assert H == W and src_h == src_w

  # a few constants for the kernel
  kernel_dtype = nl.float32  # compute in float32
  pmax = nl.tile_size.pmax
  n_rows = N * C  # every (image, channel) pair is one row of the partition dimension
  n_tiles = (n_rows + pmax - 1) // pmax
  h_pad, w_pad = H + 2 * padding[0], W + 2 * padding[1]

  out_tensor = nl.ndarray((N, C, H, W), dtype=operand_tensor.dtype,
                          buffer=nl.shared_hbm)

  operand_rows = operand_tensor.reshape((n_rows, H, W))
  source_rows = source_tensor.reshape((n_rows, src_h, src_w))
  out_rows = out_tensor.reshape((n_rows, H, W))

  # index tiles: the operand (i_p, i_h, i_w), the source (i_p, i_sh, i_sw), and the
  # windows (window row, row inside the window, window column, column inside the window)
  i_p, i_h, i_w = nl.mgrid[0:pmax, 0:H, 0:W]
  i_sp, i_sh, i_sw = nl.mgrid[0:pmax, 0:src_h, 0:src_w]
  i_wp, i_wh, i_kh, i_ww, i_kw = nl.mgrid[0:pmax, 0:src_h, 0:sw_h, 0:src_w, 0:sw_w]

  for ib in nl.affine_range(n_tiles):
    # (1) load the operand into the middle of a tile padded with the lowest float32,
    #     so that the padding is never selected
    padded_operand = nl.full((par_dim(pmax), h_pad, w_pad), fill_value=nl.fp32.min,
                             dtype=kernel_dtype)
    padded_operand[i_p, padding[0] + i_h, padding[1] + i_w] = nl.load(
      operand_rows[ib * pmax + i_p, i_h, i_w], dtype=kernel_dtype,
      mask=(ib * pmax + i_p < n_rows))

    source_tile = nl.load(source_rows[ib * pmax + i_sp, i_sh, i_sw], dtype=kernel_dtype,
                          mask=(ib * pmax + i_sp < n_rows))

    # (2) the maximum of every window
    local_max = nl.max(padded_operand[i_wp, stride_h * i_wh + i_kh, stride_w * i_ww + i_kw],
                       axis=[2, 4], mask=(ib * pmax + i_wp < n_rows))

    # (3) walk the window in row-major order: the first element equal to the maximum is
    #     selected (greater-equal select), its source value is added to the output
    padded_out = nl.zeros((par_dim(pmax), h_pad, w_pad), dtype=kernel_dtype)
    selected = nl.zeros((par_dim(pmax), src_h, src_w), dtype=kernel_dtype)
    for kh in nl.sequential_range(sw_h):
      for kw in nl.sequential_range(sw_w):
        is_max = nl.equal(padded_operand[i_sp, stride_h * i_sh + kh, stride_w * i_sw + kw],
                          local_max, dtype=kernel_dtype, mask=(ib * pmax + i_sp < n_rows))
        # 1.0 for the first maximum only: not selected before in this window
        first_max = nisa.scalar_tensor_tensor(data=selected, op0=nl.multiply, operand0=-1.0,
                                              op1=nl.add, operand1=is_max,
                                              mask=(ib * pmax + i_sp < n_rows))
        first_max = nl.maximum(first_max, 0.0, mask=(ib * pmax + i_sp < n_rows))
        selected[i_sp, i_sh, i_sw] = nl.add(selected, first_max, mask=(ib * pmax + i_sp < n_rows))

        # scatter: windows overlap, so accumulate into the padded output
        padded_out[i_sp, stride_h * i_sh + kh, stride_w * i_sw + kw] = nl.add(
          padded_out[i_sp, stride_h * i_sh + kh, stride_w * i_sw + kw],
          nl.multiply(first_max, source_tile, mask=(ib * pmax + i_sp < n_rows)),
          mask=(ib * pmax + i_sp < n_rows))

    # (4) store the unpadded part
    nl.store(out_rows[ib * pmax + i_p, i_h, i_w],
             value=padded_out[i_p, padding[0] + i_h, padding[1] + i_w],
             mask=(ib * pmax + i_p < n_rows))

  return out_tensor


@nki.jit
def resize_nearest_fixed_dma_kernel(data_tensor, out_shape):
  """
  Resize the input image to the given size using the nearest interpolation mode. This kernel is designed to be
  used when the scaling factor is not an integer.

  Example:
   - Input height : 30, Input width : 20
   - Output height : 59, Output width : 38

  IO tensor layouts:
   - data_tensor: shape   (in_b, in_h, in_w, in_c)
   - out_tensor: shape   (out_b, out_h, out_w, out_c)
   - b : batch, c : channel, h : height, w : width
   - This kernel requires in_b == out_b as input batch and output batch must be identical
   - This kernel requires in_c == out_c as input channel and output channel must be identical
  """
  in_b, in_h, in_w, in_c = data_tensor.shape
  out_b, out_h, out_w, out_c = out_shape
  out_tensor = nl.ndarray(out_shape, dtype=data_tensor.dtype,
                          buffer=nl.shared_hbm)

  assert in_b == out_b, "Input batch and output batch must be identical"
  assert in_c == out_c, "Input channel and output channel must be identical"

  h_scale, w_scale = 1.0 * in_h / out_h, 1.0 * in_w / out_w
  out_hw = out_h * out_w

  # Compute the (fixed) source pixel of every output pixel on the host
  map = []
  for i in range(out_h):
    for j in range(out_w):
      h_map = min(int(np.floor(i * h_scale)), in_h - 1)
      w_map = min(int(np.floor(j * w_scale)), in_w - 1)
      map.append(h_map * in_w + w_map)

  in_seqs = data_tensor.reshape((in_b, in_h * in_w, in_c))
  out_seqs = out_tensor.reshape((out_b, out_h * out_w, out_c))

  for b in nl.affine_range(in_b):
    for i in nl.affine_range(out_hw):
      target_addr = map[i]
      local_data = nl.load(in_seqs[b, target_addr:target_addr + 1, :])
      nl.store(out_seqs[b, i:i + 1, :], value=local_data)

  return out_tensor
