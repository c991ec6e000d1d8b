"""Convolution and pooling kernels with padding, written the way public NKI authors write them (Beta-1 dialect:
``import neuronxcc.nki as nki``, ``@nki.jit``, 2-space indentation, ``nl.mgrid`` index tiles, masks):

- ``maxpool2d_pad_kernel(x)`` / ``avgpool2d_pad_kernel(x, count_include_pad)``: 2-D pooling, kernel 3, stride 2,
  padding 1, of NCHW images, channels on the partitions. The windows are gathered by one load of the 5-D index
  expression ``x[n, c, 2 * i_h + i_kh - 1, 2 * i_w + i_kw - 1]`` whose mask excludes the padded positions (a
  non-rectangular mask: it compares sums of two arange axes) into a tile pre-filled with the pool's identity
  (-inf / 0), then reduced over the two window axes. ``count_include_pad=False`` divides by the number of valid
  taps, counted on chip by a masked add over the same window space.
- ``conv1d_kernel(x, weight, dilation, causal)``: conv1d for sequence models ([B, Cin, L] -> [B, Cout, L]),
  causal (left padding (K-1)*d) or same padding, as K matmuls over shifted windows of a zero-padded input tile
  accumulating in PSUM.
- ``conv_transpose2d_s2_kernel(x, weight)``: ConvTranspose2d kernel 2, stride 2 (exact 2x upsampling): one
  matmul per tap, its [Cout, H, W] result scattered into the strided output positions ``(2 * i_h + kh, 2 * i_w
  + kw)`` of an SBUF tile, one store.
- ``conv2d_im2col_kernel(x, weight)``: conv2d 3x3, stride 1, padding 1 by im2col: every tap's shifted window
  loaded (masked: zero padding) into the patch matrix [Cin, 9, H*W], then one matmul per tap and 512-column
  block.
- ``depthwise_separable_kernel(x, dw_weight, pw_weight)``: MobileNet block: depthwise 3x3 (padding 1) from one
  masked 5-D window load ``x[c, i_h + i_kh - 1, i_w + i_kw - 1]`` per channel tile (taps as per-partition
  scalars), then the pointwise 1x1 conv as a matmul over the channels.

Written in those authors' style; not copies of their files. No nsim imports.
"""
import numpy as np

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl
from neuronxcc.nki.language import par_dim


# ------------------------------------------------------------------------------------------------
# Pooling (kernel 3, stride 2, padding 1)
# ------------------------------------------------------------------------------------------------

def _pool_out(n):
  return (n + 2 * 1 - 3) // 2 + 1


@nki.jit
def maxpool2d_pad_kernel(x):
  """
  MaxPool2d(kernel_size=3, stride=2, padding=1) of x (N, C, H, W) -> (N, C, OH, OW).
  """
  N, C, H, W = x.shape
  OH, OW = _pool_out(H), _pool_out(W)
  out = nl.ndarray((N, C, OH, OW), dtype=x.dtype, buffer=nl.shared_hbm)
  P = nl.tile_size.pmax
  n_tiles = (C + P - 1) // P

  i_c, i_h, i_kh, i_w, i_kw = nl.mgrid[0:P, 0:OH, 0:3, 0:OW, 0:3]
  i_p, i_oh, i_ow = nl.mgrid[0:P, 0:OH, 0:OW]
  row = 2 * i_h + i_kh - 1
  col = 2 * i_w + i_kw - 1

  for n in nl.affine_range(N):
    for t in nl.affine_range(n_tiles):
      win = nl.full((par_dim(P), OH, 3, OW, 3), -np.inf, dtype=x.dtype, buffer=nl.sbuf)
      win[i_c, i_h, i_kh, i_w, i_kw] = nl.load(
        x[n, t * P + i_c, row, col],
        mask=((t * P + i_c < C) & (row >= 0) & (row < H) & (col >= 0) & (col < W)))
      res = nl.max(win, axis=[2, 4])
      nl.store(out[n, t * P + i_p, i_oh, i_ow], value=res, mask=(t * P + i_p < C))
  return out


@nki.jit
def avgpool2d_pad_kernel(x, count_include_pad=True):
  """
  AvgPool2d(kernel_size=3, stride=2, padding=1, count_include_pad=...) of x (N, C, H, W).
  """
  N, C, H, W = x.shape
  OH, OW = _pool_out(H), _pool_out(W)
  out = nl.ndarray((N, C, OH, OW), dtype=x.dtype, buffer=nl.shared_hbm)
  P = nl.tile_size.pmax
  n_tiles = (C + P - 1) // P

  i_c, i_h, i_kh, i_w, i_kw = nl.mgrid[0:P, 0:OH, 0:3, 0:OW, 0:3]
  i_p, i_oh, i_ow = nl.mgrid[0:P, 0:OH, 0:OW]
  row = 2 * i_h + i_kh - 1
  col = 2 * i_w + i_kw - 1
  inside = (row >= 0) & (row < H) & (col >= 0) & (col < W)

  if not count_include_pad:
    # the number of valid taps of every window (same for all channels)
    ones = nl.zeros((par_dim(P), OH, 3, OW, 3), dtype=nl.float32, buffer=nl.sbuf)
    valid = nl.zeros((par_dim(P), OH, 3, OW, 3), dtype=nl.float32, buffer=nl.sbuf)
    valid[i_c, i_h, i_kh, i_w, i_kw] = nl.add(ones, 1.0, mask=inside)
    count = nl.sum(valid, axis=[2, 4])
    inv_count = nl.reciprocal(count)

  for n in nl.affine_range(N):
    for t in nl.affine_range(n_tiles):
      win = nl.zeros((par_dim(P), OH, 3, OW, 3), dtype=nl.float32, buffer=nl.sbuf)
      win[i_c, i_h, i_kh, i_w, i_kw] = nl.load(x[n, t * P + i_c, row, col], mask=((t * P + i_c < C) & inside))
      total = nl.sum(win, axis=[2, 4])
      if count_include_pad:
        res = nl.multiply(total, 1.0 / 9.0, dtype=x.dtype)
      else:
        res = nl.multiply(total, inv_count, dtype=x.dtype)
      nl.store(out[n, t * P + i_p, i_oh, i_ow], value=res, mask=(t * P + i_p < C))
  return out


# ------------------------------------------------------------------------------------------------
# conv1d (causal / same padding, dilation) as shifted-window matmuls
# ------------------------------------------------------------------------------------------------

@nki.jit
def conv1d_kernel(x, weight, dilation=1, causal=True):
  """
  torch Conv1d(Cin, Cout, K, dilation=d, bias=False) with causal padding (left (K-1)*d) or 'same' padding
  ((K-1)*d split left/right, the extra one on the right).

  IO tensor layouts:
   - x: (B, Cin, L), L <= 512; weight: (Cout, Cin, K); Cin, Cout <= 128 or multiples of 128
   - out: (B, Cout, L)
  """
  B, Cin, L = x.shape
  Cout, Cin_w, K = weight.shape
  assert Cin_w == Cin and L <= nl.tile_size.psum_fmax
  P = nl.tile_size.pmax
  CI, CO = min(P, Cin), min(P, Cout)
  assert Cin % CI == 0 and Cout % CO == 0
  n_ci, n_co = Cin // CI, Cout // CO
  pad = (K - 1) * dilation
  left = pad if causal else pad // 2
  out = nl.ndarray((B, Cout, L), dtype=x.dtype, buffer=nl.shared_hbm)

  # weights transposed per tap on the TensorE: wT[co, ci, k] is [CI, CO] (contraction on the partitions)
  wT = nl.ndarray((n_co, n_ci, K, par_dim(CI), CO), dtype=x.dtype, buffer=nl.sbuf)
  i_o, i_c, i_k = nl.mgrid[0:CO, 0:Cin, 0:K]
  for co in nl.affine_range(n_co):
    w_sb = nl.load(weight[co * CO + i_o, i_c, i_k])
    for ci in nl.affine_range(n_ci):
      for k in nl.static_range(K):
        wT[co, ci, k, :, :] = nisa.nc_transpose(w_sb[:, ci * CI:(ci + 1) * CI, k])

  i_p, i_l = nl.mgrid[0:CI, 0:L]
  i_q, i_m = nl.mgrid[0:CO, 0:L]
  for b in nl.affine_range(B):
    x_pad = nl.zeros((n_ci, par_dim(CI), L + pad), dtype=x.dtype, buffer=nl.sbuf)
    for ci in nl.affine_range(n_ci):
      x_pad[ci, i_p, left + i_l] = nl.load(x[b, ci * CI + i_p, i_l])
    for co in nl.affine_range(n_co):
      acc = nl.zeros((CO, L), nl.float32, buffer=nl.psum)
      for ci in nl.affine_range(n_ci):
        for k in nl.static_range(K):
          acc += nisa.nc_matmul(wT[co, ci, k], x_pad[ci, i_p, k * dilation + i_l])
      res = nl.copy(acc, dtype=x.dtype)
      nl.store(out[b, co * CO + i_q, i_m], value=res)
  return out


# ------------------------------------------------------------------------------------------------
# ConvTranspose2d kernel 2, stride 2 (2x upsampling)
# ------------------------------------------------------------------------------------------------

@nki.jit
def conv_transpose2d_s2_kernel(x, weight):
  """
  torch ConvTranspose2d(Cin, Cout, kernel_size=2, stride=2, bias=False): every input pixel paints a 2x2 block.

  IO tensor layouts:
   - x: (N, Cin, H, W), H * W <= 512; weight: (Cin, Cout, 2, 2) (torch layout, Cin first: the stationary
     operand loads directly with the contraction dim on the partitions)
   - out: (N, Cout, 2H, 2W)
  """
  N, Cin, H, W = x.shape
  _, Cout, KH, KW = weight.shape
  assert KH == 2 and KW == 2 and H * W <= nl.tile_size.psum_fmax
  P = nl.tile_size.pmax
  CI, CO = min(P, Cin), min(P, Cout)
  assert Cin % CI == 0 and Cout % CO == 0
  n_ci, n_co = Cin // CI, Cout // CO
  out = nl.ndarray((N, Cout, 2 * H, 2 * W), dtype=x.dtype, buffer=nl.shared_hbm)

  i_p, i_o, i_kh, i_kw = nl.mgrid[0:CI, 0:Cout, 0:2, 0:2]
  w_sb = nl.ndarray((n_ci, par_dim(CI), Cout, 2, 2), dtype=x.dtype, buffer=nl.sbuf)
  for ci in nl.affine_range(n_ci):
    w_sb[ci, i_p, i_o, i_kh, i_kw] = nl.load(weight[ci * CI + i_p, i_o, i_kh, i_kw])

  i_x, i_h, i_w = nl.mgrid[0:CI, 0:H, 0:W]
  i_q, i_y, i_z = nl.mgrid[0:CO, 0:H, 0:W]
  i_s, i_a, i_b = nl.mgrid[0:CO, 0:2 * H, 0:2 * W]
  for n in nl.affine_range(N):
    x_sb = nl.ndarray((n_ci, par_dim(CI), H, W), dtype=x.dtype, buffer=nl.sbuf)
    for ci in nl.affine_range(n_ci):
      x_sb[ci, i_x, i_h, i_w] = nl.load(x[n, ci * CI + i_x, i_h, i_w])
    for co in nl.affine_range(n_co):
      o_sb = nl.ndarray((par_dim(CO), 2 * H, 2 * W), dtype=x.dtype, buffer=nl.sbuf)
      for kh in nl.static_range(2):
        for kw in nl.static_range(2):
          acc = nl.zeros((CO, H, W), nl.float32, buffer=nl.psum)
          for ci in nl.affine_range(n_ci):
            acc += nisa.nc_matmul(w_sb[ci, :, co * CO:(co + 1) * CO, kh, kw], x_sb[ci])
          # scatter the tap into the strided output positions
          o_sb[i_q, 2 * i_y + kh, 2 * i_z + kw] = nl.copy(acc, dtype=x.dtype)
      nl.store(out[n, co * CO + i_s, i_a, i_b], value=o_sb)
  return out


# ------------------------------------------------------------------------------------------------
# conv2d 3x3, padding 1 by im2col + matmul
# ------------------------------------------------------------------------------------------------

@nki.jit
def conv2d_im2col_kernel(x, weight):
  """
  torch Conv2d(Cin, Cout, 3, stride=1, padding=1, bias=False) by im2col: the patch matrix
  cols[ci, kh, kw, h, w] = x_padded[ci, h + kh, w + kw] is gathered from HBM by one masked load of the 5-D
  window expression (the mask skips the zero padding), then each tap is a matmul over the input channels.

  IO tensor layouts:
   - x: (N, Cin, H, W), Cin <= 128; weight: (Cout, Cin, 3, 3), Cout <= 128 or a multiple of 128
   - out: (N, Cout, H, W)
  """
  N, Cin, H, W = x.shape
  Cout = weight.shape[0]
  P = nl.tile_size.pmax
  assert Cin <= P and W <= nl.tile_size.psum_fmax
  CO = min(P, Cout)
  assert Cout % CO == 0
  n_co = Cout // CO
  rows = nl.tile_size.psum_fmax // W  # output rows per PSUM bank
  n_blk = (H + rows - 1) // rows
  out = nl.ndarray((N, Cout, H, W), dtype=x.dtype, buffer=nl.shared_hbm)

  # per-tap transposed weights [Cin, CO]
  wT = nl.ndarray((n_co, 9, par_dim(Cin), CO), dtype=x.dtype, buffer=nl.sbuf)
  i_o, i_c, i_t = nl.mgrid[0:CO, 0:Cin, 0:9]
  w_flat = weight.reshape((Cout, Cin, 9))
  for co in nl.affine_range(n_co):
    w_sb = nl.load(w_flat[co * CO + i_o, i_c, i_t])
    for t in nl.static_range(9):
      wT[co, t, :, :] = nisa.nc_transpose(w_sb[:, :, t])

  i_p, i_kh, i_kw, i_h, i_w = nl.mgrid[0:Cin, 0:3, 0:3, 0:H, 0:W]
  row = i_h + i_kh - 1
  col = i_w + i_kw - 1
  for n in nl.affine_range(N):
    cols = nl.zeros((par_dim(Cin), 3, 3, H, W), dtype=x.dtype, buffer=nl.sbuf)
    cols[i_p, i_kh, i_kw, i_h, i_w] = nl.load(x[n, i_p, row, col],
                                              mask=(row >= 0) & (row < H) & (col >= 0) & (col < W))
    for co in nl.affine_range(n_co):
      for blk in nl.affine_range(n_blk):
        i_q, i_r, i_s = nl.mgrid[0:CO, 0:rows, 0:W]
        i_k, i_y, i_z = nl.mgrid[0:Cin, 0:rows, 0:W]
        acc = nl.zeros((CO, rows, W), nl.float32, buffer=nl.psum)
        for t in nl.static_range(9):
          acc += nisa.nc_matmul(wT[co, t], cols[i_k, t // 3, t % 3, blk * rows + i_y, i_z],
                                mask=(blk * rows + i_y < H))
        res = nl.copy(acc, dtype=x.dtype)
        nl.store(out[n, co * CO + i_q, blk * rows + i_r, i_s], value=res, mask=(blk * rows + i_r < H))
  return out


# ------------------------------------------------------------------------------------------------
# Depthwise-separable block: depthwise 3x3 (padding 1) + ReLU + pointwise 1x1
# ------------------------------------------------------------------------------------------------

@nki.jit
def depthwise_separable_kernel(x, dw_weight, pw_weight):
  """
  MobileNet block: y = pointwise(relu(depthwise3x3(x))), no biases.

  IO tensor layouts:
   - x: (N, C, H, W), H * W <= 512, C <= 128 or a multiple of 128; dw_weight: (C, 1, 3, 3);
     pw_weight: (Cout, C, 1, 1), Cout <= 128 or a multiple of 128
   - out: (N, Cout, H, W)
  """
  N, C, H, W = x.shape
  Cout = pw_weight.shape[0]
  P = nl.tile_size.pmax
  CC, CO = min(P, C), min(P, Cout)
  assert C % CC == 0 and Cout % CO == 0 and H * W <= nl.tile_size.psum_fmax
  n_c, n_co = C // CC, Cout // CO
  out = nl.ndarray((N, Cout, H, W), dtype=x.dtype, buffer=nl.shared_hbm)

  dw_2d = dw_weight.reshape((C, 9))
  pw_2d = pw_weight.reshape((Cout, C))
  i_c9, i_9 = nl.mgrid[0:CC, 0:9]
  dw_sb = nl.ndarray((n_c, par_dim(CC), 9), dtype=nl.float32, buffer=nl.sbuf)
  for c in nl.affine_range(n_c):
    dw_sb[c, i_c9, i_9] = nl.load(dw_2d[c * CC + i_c9, i_9], dtype=nl.float32)
  # pointwise weights transposed: pwT[co, c] is [CC, CO]
  pwT = nl.ndarray((n_co, n_c, par_dim(CC), CO), dtype=x.dtype, buffer=nl.sbuf)
  i_o, i_k = nl.mgrid[0:CO, 0:C]
  for co in nl.affine_range(n_co):
    pw_sb = nl.load(pw_2d[co * CO + i_o, i_k])
    for c in nl.affine_range(n_c):
      pwT[co, c, :, :] = nisa.nc_transpose(pw_sb[:, c * CC:(c + 1) * CC])

  i_p, i_kh, i_kw, i_h, i_w = nl.mgrid[0:CC, 0:3, 0:3, 0:H, 0:W]
  row = i_h + i_kh - 1
  col = i_w + i_kw - 1
  i_q, i_y, i_z = nl.mgrid[0:CO, 0:H, 0:W]
  for n in nl.affine_range(N):
    mid = nl.ndarray((n_c, par_dim(CC), H, W), dtype=x.dtype, buffer=nl.sbuf)
    for c in nl.affine_range(n_c):
      win = nl.zeros((par_dim(CC), 3, 3, H, W), dtype=x.dtype, buffer=nl.sbuf)
      win[i_p, i_kh, i_kw, i_h, i_w] = nl.load(x[n, c * CC + i_p, row, col],
                                               mask=(row >= 0) & (row < H) & (col >= 0) & (col < W))
      acc = nl.multiply(win[:, 0, 0], dw_sb[c, :, 0:1], dtype=nl.float32)
      for t in nl.static_range(1, 9):
        acc = nisa.scalar_tensor_tensor(data=win[:, t // 3, t % 3], op0=nl.multiply, operand0=dw_sb[c, :, t:t + 1],
                                        op1=nl.add, operand1=acc)
      mid[c] = nl.relu(acc, dtype=x.dtype)
    for co in nl.affine_range(n_co):
      ps = nl.zeros((CO, H, W), nl.float32, buffer=nl.psum)
      for c in nl.affine_range(n_c):
        ps += nisa.nc_matmul(pwT[co, c], mid[c])
      nl.store(out[n, co * CO + i_q, i_y, i_z], value=nl.copy(ps, dtype=x.dtype))
  return out
