"""Vision / diffusion-model kernels in the style of the nki-samples ``contributed/`` directory and the NKI workshop
labs (Beta-1 dialect: ``import neuronxcc.nki as nki``, ``@nki.jit``, 2-space indentation, ``nl.mgrid`` index
tiles, masks on the partition tail):

- ``upsample_bilinear2x_kernel(image)``: bilinear upsampling by 2 (align_corners=False) of an image [C, H, W],
  channels on the partitions; the fixed 0.25 / 0.75 weights applied with strided (``2 * i_w + 1``) writes.
- ``resize_bilinear_kernel(image, out_size)``: bilinear resize to an arbitrary [OH, OW] (align_corners=False),
  the two source columns/rows and their weights of every output column/row computed on the host as Python
  floats, one ``scalar_tensor_tensor`` per output column and per output row.
- ``conv2d_3x3_kernel(x, weight, bias, stride)``: NCHW conv 3x3, padding 1, stride 1 or 2, as 9 shifted
  matmuls accumulating in PSUM (input channels on the contraction/partition axis), output channels tiled by 128
  with a masked ragged last tile, bias added on the PSUM eviction; the weights loaded as contiguous rows and
  transposed per tap on the TensorE; the padded input stays resident across the output-channel tiles.
  ``conv2d_3x3_reload_kernel``: the same with the output-channel loop outermost, the input reloaded for every
  output-channel tile.
- ``group_norm_silu_kernel(x, gamma, beta, num_groups, eps)``: diffusion-UNet GroupNorm (32 groups) + SiLU,
  channels on the partitions in tiles of whole groups; the group statistics (a cross-partition reduction) by two
  matmuls with group-membership matrices built on chip with ``nisa.affine_select``.
  ``group_norm_silu_transpose_kernel``: the same with ``nisa.nc_transpose`` and a free-axis reduce instead.
- ``depthwise_conv2d_3x3_kernel(x, weight, bias)``: depthwise 3x3 conv (groups = C), padding 1, the zero padding
  done by 9 masked loads of shifted windows; per-channel weights as [C, 1] per-partition scalars
  (``nisa.tensor_scalar`` / ``nl.multiply`` broadcast). ``depthwise_conv2d_3x3_padded_kernel``: one load into a
  zero-padded tile and 9 shifted views of it.
- ``global_avgpool_classifier_kernel(x, fc_weight, fc_bias)``: global average pool over H x W and a linear head
  (``fc_weight`` [K, C] as torch ``nn.Linear`` stores it) over a batch, logits [N, K].

Written in those authors' style; not copies of their files. No nsim imports.
"""
import math

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl
from neuronxcc.nki.language import par_dim


# ------------------------------------------------------------------------------------------------
# Bilinear interpolation
# ------------------------------------------------------------------------------------------------

@nki.jit
def upsample_bilinear2x_kernel(in_tensor):
  """
  Bilinear upsampling by a factor of 2, align_corners=False (torch.nn.Upsample(scale_factor=2,
  mode='bilinear')).

  With scale 2 the source coordinate of output column 2k is k - 0.25 and of 2k + 1 is k + 0.25, so
    out[2k]     = 0.25 * x[k - 1] + 0.75 * x[k]     (k >= 1; out[0] = x[0])
    out[2k + 1] = 0.75 * x[k] + 0.25 * x[k + 1]     (k <= W - 2; out[2W - 1] = x[W - 1])
  and the same along the rows.

  IO tensor layouts:
   - in_tensor: shape (C, H, W), channels on the partitions (tiles of 128, ragged last tile masked)
   - out_tensor: shape (C, 2H, 2W)
  """
  C, H, W = in_tensor.shape
  assert H >= 2 and W >= 2
  OH, OW = 2 * H, 2 * W
  out_tensor = nl.ndarray((C, OH, OW), dtype=in_tensor.dtype, buffer=nl.shared_hbm)

  pmax = nl.tile_size.pmax
  n_tiles = (C + pmax - 1) // pmax

  i_p, i_h, i_w = nl.mgrid[0:pmax, 0:H, 0:W]
  # column pairs (k, k + 1) along the width, row pairs along the height
  i_cp, i_ch, i_ck = nl.mgrid[0:pmax, 0:H, 0:W - 1]
  i_rp, i_rk, i_rw = nl.mgrid[0:pmax, 0:H - 1, 0:OW]
  # the border column / row
  i_bp, i_bh, i_bw = nl.mgrid[0:pmax, 0:H, 0:1]
  i_ep, i_eh, i_ew = nl.mgrid[0:pmax, 0:1, 0:OW]
  i_op, i_oh, i_ow = nl.mgrid[0:pmax, 0:OH, 0:OW]

  for t in nl.affine_range(n_tiles):
    x = nl.load(in_tensor[t * pmax + i_p, i_h, i_w], dtype=nl.float32,
                mask=(t * pmax + i_p < C))

    # width pass: [pmax, H, 2W]
    x75 = nl.multiply(x, 0.75, mask=(t * pmax + i_p < C))
    xw = nl.ndarray((par_dim(pmax), H, OW), dtype=nl.float32, buffer=nl.sbuf)
    xw[i_cp, i_ch, 2 * i_ck + 2] = nisa.scalar_tensor_tensor(
      data=x[i_cp, i_ch, i_ck], op0=nl.multiply, operand0=0.25, op1=nl.add,
      operand1=x75[i_cp, i_ch, i_ck + 1], mask=(t * pmax + i_cp < C))
    xw[i_cp, i_ch, 2 * i_ck + 1] = nisa.scalar_tensor_tensor(
      data=x[i_cp, i_ch, i_ck + 1], op0=nl.multiply, operand0=0.25, op1=nl.add,
      operand1=x75[i_cp, i_ch, i_ck], mask=(t * pmax + i_cp < C))
    xw[i_bp, i_bh, i_bw] = nl.copy(x[i_bp, i_bh, i_bw], mask=(t * pmax + i_bp < C))
    xw[i_bp, i_bh, OW - 1 + i_bw] = nl.copy(x[i_bp, i_bh, W - 1 + i_bw], mask=(t * pmax + i_bp < C))

    # height pass: [pmax, 2H, 2W]
    xw75 = nl.multiply(xw, 0.75, mask=(t * pmax + i_p < C))
    y = nl.ndarray((par_dim(pmax), OH, OW), dtype=nl.float32, buffer=nl.sbuf)
    y[i_rp, 2 * i_rk + 2, i_rw] = nisa.scalar_tensor_tensor(
      data=xw[i_rp, i_rk, i_rw], op0=nl.multiply, operand0=0.25, op1=nl.add,
      operand1=xw75[i_rp, i_rk + 1, i_rw], mask=(t * pmax + i_rp < C))
    y[i_rp, 2 * i_rk + 1, i_rw] = nisa.scalar_tensor_tensor(
      data=xw[i_rp, i_rk + 1, i_rw], op0=nl.multiply, operand0=0.25, op1=nl.add,
      operand1=xw75[i_rp, i_rk, i_rw], mask=(t * pmax + i_rp < C))
    y[i_ep, i_eh, i_ew] = nl.copy(xw[i_ep, i_eh, i_ew], mask=(t * pmax + i_ep < C))
    y[i_ep, OH - 1 + i_eh, i_ew] = nl.copy(xw[i_ep, H - 1 + i_eh, i_ew], mask=(t * pmax + i_ep < C))

    nl.store(out_tensor[t * pmax + i_op, i_oh, i_ow], value=y, mask=(t * pmax + i_op < C))

  return out_tensor


def _linear_taps(in_size, out_size):
  # align_corners=False: src = (dst + 0.5) * in / out - 0.5, clamped at 0 (as torch does)
  scale = in_size / out_size
  taps = []
  for j in range(out_size):
    src = max((j + 0.5) * scale - 0.5, 0.0)
    i0 = min(int(math.floor(src)), in_size - 1)
    i1 = min(i0 + 1, in_size - 1)
    lam = src - i0
    taps.append((i0, i1, 1.0 - lam, lam))
  return taps


@nki.jit
def resize_bilinear_kernel(in_tensor, out_size):
  """
  Bilinear resize (align_corners=False) of an image [C, H, W] to [C, OH, OW] for any OH, OW. The
  source columns/rows and weights of every output column/row are computed on the host; the kernel
  applies them column by column (width pass) and then row by row (height pass).
  """
  C, H, W = in_tensor.shape
  OH, OW = out_size
  out_tensor = nl.ndarray((C, OH, OW), dtype=in_tensor.dtype, buffer=nl.shared_hbm)

  taps_w = _linear_taps(W, OW)
  taps_h = _linear_taps(H, OH)

  pmax = nl.tile_size.pmax
  n_tiles = (C + pmax - 1) // pmax

  i_p, i_h, i_w = nl.mgrid[0:pmax, 0:H, 0:W]
  i_cp, i_ch, i_c0 = nl.mgrid[0:pmax, 0:H, 0:1]     # one column
  i_rp, i_r0, i_rw = nl.mgrid[0:pmax, 0:1, 0:OW]    # one row
  i_op, i_oh, i_ow = nl.mgrid[0:pmax, 0:OH, 0:OW]

  for t in nl.affine_range(n_tiles):
    x = nl.load(in_tensor[t * pmax + i_p, i_h, i_w], dtype=nl.float32,
                mask=(t * pmax + i_p < C))

    xw = nl.ndarray((par_dim(pmax), H, OW), dtype=nl.float32, buffer=nl.sbuf)
    for j in nl.static_range(OW):
      w0, w1, a0, a1 = taps_w[j]
      xw[i_cp, i_ch, j + i_c0] = nisa.scalar_tensor_tensor(
        data=x[i_cp, i_ch, w0 + i_c0], op0=nl.multiply, operand0=a0, op1=nl.add,
        operand1=nl.multiply(x[i_cp, i_ch, w1 + i_c0], a1, mask=(t * pmax + i_cp < C)),
        mask=(t * pmax + i_cp < C))

    y = nl.ndarray((par_dim(pmax), OH, OW), dtype=nl.float32, buffer=nl.sbuf)
    for i in nl.static_range(OH):
      h0, h1, b0, b1 = taps_h[i]
      y[i_rp, i + i_r0, i_rw] = nisa.scalar_tensor_tensor(
        data=xw[i_rp, h0 + i_r0, i_rw], op0=nl.multiply, operand0=b0, op1=nl.add,
        operand1=nl.multiply(xw[i_rp, h1 + i_r0, i_rw], b1, mask=(t * pmax + i_rp < C)),
        mask=(t * pmax + i_rp < C))

    nl.store(out_tensor[t * pmax + i_op, i_oh, i_ow], value=y, mask=(t * pmax + i_op < C))

  return out_tensor


# ------------------------------------------------------------------------------------------------
# Conv2d 3x3 as 9 shifted matmuls
# ------------------------------------------------------------------------------------------------

def _conv_out_size(size, stride, pad=1, k=3):
  return (size + 2 * pad - k) // stride + 1


def _load_conv_weights(weight, bias):
  # weight [C_out, C_in, 3, 3] -> w_T[co_tile, kh, kw] = [C_in (partitions), 128 output channels],
  # the stationary operand of every tap: contiguous rows of 128 output channels are loaded, and every
  # tap is transposed on the TensorE
  C_out, C_in, KH, KW = weight.shape
  pmax = nl.tile_size.pmax
  n_co = (C_out + pmax - 1) // pmax
  n_taps = KH * KW

  w_rows = weight.reshape((C_out, C_in * n_taps))
  i_o, i_f = nl.mgrid[0:pmax, 0:C_in * n_taps]
  i_r, i_c = nl.mgrid[0:pmax, 0:C_in]
  i_ci, i_m = nl.mgrid[0:C_in, 0:pmax]
  w_T = nl.ndarray((n_co, KH, KW, par_dim(C_in), pmax), dtype=weight.dtype, buffer=nl.sbuf)
  for co in nl.affine_range(n_co):
    w_sb = nl.load(w_rows[co * pmax + i_o, i_f], mask=(co * pmax + i_o < C_out))
    for kh in nl.affine_range(KH):
      for kw in nl.affine_range(KW):
        # tap (kh, kw) of every input channel: columns ci * 9 + kh * 3 + kw
        w_tap_T = nisa.nc_transpose(w_sb[i_r, n_taps * i_c + kh * KW + kw], mask=(co * pmax + i_r < C_out))
        w_T[co, kh, kw, i_ci, i_m] = nl.copy(w_tap_T, dtype=weight.dtype, mask=(co * pmax + i_m < C_out))

  i_b, i_0 = nl.mgrid[0:pmax, 0:1]
  bias_2d = bias.reshape((C_out, 1))
  b_sb = nl.ndarray((n_co, par_dim(pmax), 1), dtype=nl.float32, buffer=nl.sbuf)
  for co in nl.affine_range(n_co):
    b_sb[co, i_b, i_0] = nl.load(bias_2d[co * pmax + i_b, i_0], dtype=nl.float32,
                                 mask=(co * pmax + i_b < C_out))
  return w_T, b_sb


@nki.jit
def conv2d_3x3_kernel(x_tensor, weight, bias, stride=1):
  """
  2D convolution, NCHW, kernel 3x3, padding 1, stride 1 or 2.

  out[n, co, oh, ow] = bias[co] + sum_{ci, kh, kw} weight[co, ci, kh, kw] * x_pad[n, ci, s*oh + kh, s*ow + kw]

  Every tap (kh, kw) is one matmul: stationary = weight[:, :, kh, kw]^T ([C_in, co]), moving = the
  (strided) window of the zero-padded input ([C_in, OH, OW]); the 9 of them accumulate in one PSUM tile.

  IO tensor layouts:
   - x_tensor: (N, C_in, H, W), C_in <= 128
   - weight: (C_out, C_in, 3, 3), any C_out (tiles of 128, ragged last tile masked)
   - bias: (C_out,)
   - out: (N, C_out, OH, OW), OH * OW <= 512 (one PSUM bank)
  """
  N, C_in, H, W = x_tensor.shape
  C_out, C_in_, KH, KW = weight.shape
  assert C_in == C_in_ and KH == 3 and KW == 3
  assert C_in <= nl.tile_size.pmax
  assert stride in (1, 2)
  OH, OW = _conv_out_size(H, stride), _conv_out_size(W, stride)
  assert OH * OW <= nl.tile_size.gemm_moving_fmax

  out_tensor = nl.ndarray((N, C_out, OH, OW), dtype=x_tensor.dtype, buffer=nl.shared_hbm)
  pmax = nl.tile_size.pmax
  n_co = (C_out + pmax - 1) // pmax

  w_T, b_sb = _load_conv_weights(weight, bias)

  i_p, i_h, i_w = nl.mgrid[0:C_in, 0:H, 0:W]
  i_q, i_oh, i_ow = nl.mgrid[0:C_in, 0:OH, 0:OW]
  i_s, i_m = nl.mgrid[0:C_in, 0:pmax]
  i_o, i_yh, i_yw = nl.mgrid[0:pmax, 0:OH, 0:OW]

  for n in nl.affine_range(N):
    # zero-padded input, loaded once and kept for every output-channel tile
    x_pad = nl.zeros((par_dim(C_in), H + 2, W + 2), dtype=x_tensor.dtype, buffer=nl.sbuf)
    x_pad[i_p, 1 + i_h, 1 + i_w] = nl.load(x_tensor[n, i_p, i_h, i_w])

    for co in nl.affine_range(n_co):
      acc = nl.zeros((par_dim(pmax), OH, OW), dtype=nl.float32, buffer=nl.psum)
      for kh in nl.affine_range(KH):
        for kw in nl.affine_range(KW):
          acc[i_o, i_yh, i_yw] += nisa.nc_matmul(
            w_T[co, kh, kw][i_s, i_m], x_pad[i_q, stride * i_oh + kh, stride * i_ow + kw],
            mask=(co * pmax + i_m < C_out))

      # bias add on the PSUM eviction
      y = nisa.activation(op=nl.copy, data=acc, bias=b_sb[co], dtype=x_tensor.dtype,
                          mask=(co * pmax + i_o < C_out))
      nl.store(out_tensor[n, co * pmax + i_o, i_yh, i_yw], value=y, mask=(co * pmax + i_o < C_out))

  return out_tensor


@nki.jit
def conv2d_3x3_reload_kernel(x_tensor, weight, bias, stride=1):
  """
  The same convolution with the output-channel tile loop outermost: the padded input of every image
  is loaded again for each output-channel tile (nl.matmul with transpose_x=True).
  """
  N, C_in, H, W = x_tensor.shape
  C_out, C_in_, KH, KW = weight.shape
  assert C_in == C_in_ and KH == 3 and KW == 3
  assert C_in <= nl.tile_size.pmax
  OH, OW = _conv_out_size(H, stride), _conv_out_size(W, stride)
  assert OH * OW <= nl.tile_size.gemm_moving_fmax

  out_tensor = nl.ndarray((N, C_out, OH, OW), dtype=x_tensor.dtype, buffer=nl.shared_hbm)
  pmax = nl.tile_size.pmax
  n_co = (C_out + pmax - 1) // pmax

  w_T, b_sb = _load_conv_weights(weight, bias)

  i_p, i_h, i_w = nl.mgrid[0:C_in, 0:H, 0:W]
  i_q, i_oh, i_ow = nl.mgrid[0:C_in, 0:OH, 0:OW]
  i_s, i_m = nl.mgrid[0:C_in, 0:pmax]
  i_o, i_yh, i_yw = nl.mgrid[0:pmax, 0:OH, 0:OW]

  for co in nl.affine_range(n_co):
    for n in nl.affine_range(N):
      x_pad = nl.zeros((par_dim(C_in), H + 2, W + 2), dtype=x_tensor.dtype, buffer=nl.sbuf)
      x_pad[i_p, 1 + i_h, 1 + i_w] = nl.load(x_tensor[n, i_p, i_h, i_w])

      acc = nl.zeros((par_dim(pmax), OH, OW), dtype=nl.float32, buffer=nl.psum)
      for kh in nl.affine_range(KH):
        for kw in nl.affine_range(KW):
          acc += nl.matmul(w_T[co, kh, kw][i_s, i_m],
                           x_pad[i_q, stride * i_oh + kh, stride * i_ow + kw],
                           transpose_x=True, mask=(co * pmax + i_m < C_out))

      y = nisa.activation(op=nl.copy, data=acc, bias=b_sb[co], dtype=x_tensor.dtype,
                          mask=(co * pmax + i_o < C_out))
      nl.store(out_tensor[n, co * pmax + i_o, i_yh, i_yw], value=y, mask=(co * pmax + i_o < C_out))

  return out_tensor


# ------------------------------------------------------------------------------------------------
# GroupNorm + SiLU
# ------------------------------------------------------------------------------------------------

@nki.jit
def group_norm_silu_kernel(x_tensor, gamma, beta, num_groups=32, eps=1e-5):
  """
  y = silu(group_norm(x) * gamma + beta), as the resnet blocks of a diffusion UNet apply it.

  Channels on the partitions, H * W on the free axis. A tile holds whole groups
  (128 // (C / num_groups) groups), so the statistics of a group never cross tiles. The per-channel
  sums (sum of x, sum of x^2) are reduced over the channels of a group on the TensorE: a matmul with
  the [channels, groups] membership matrix gives the group sums, a matmul with its transpose
  broadcasts them back to the channels.

  IO tensor layouts:
   - x_tensor: (N, C, H, W); gamma, beta: (C,)
   - out: (N, C, H, W)
  """
  N, C, H, W = x_tensor.shape
  HW = H * W
  assert C % num_groups == 0
  cpg = C // num_groups                    # channels per group
  pmax = nl.tile_size.pmax
  assert cpg <= pmax
  gpt = pmax // cpg                        # groups per tile
  cpt = gpt * cpg                          # channels per tile
  n_tiles = (C + cpt - 1) // cpt
  inv_count = 1.0 / (cpg * HW)

  out_tensor = nl.ndarray((N, C, H, W), dtype=x_tensor.dtype, buffer=nl.shared_hbm)
  x_rows = x_tensor.reshape((N, C, HW))
  out_rows = out_tensor.reshape((N, C, HW))
  gamma_2d = gamma.reshape((C, 1))
  beta_2d = beta.reshape((C, 1))

  # membership[c, g] = 1 if channel c is in group g (cpg * g <= c < cpg * (g + 1))
  i_c, i_g = nl.mgrid[0:cpt, 0:gpt]
  member = nl.ones((par_dim(cpt), gpt), dtype=nl.float32)
  member = nisa.affine_select(i_c - cpg * i_g >= 0, member, 0.0)
  member = nisa.affine_select(cpg * i_g + (cpg - 1) - i_c >= 0, member, 0.0)
  # and its transpose, membership_t[g, c]
  i_tg, i_tc = nl.mgrid[0:gpt, 0:cpt]
  member_t = nl.ones((par_dim(gpt), cpt), dtype=nl.float32)
  member_t = nisa.affine_select(i_tc - cpg * i_tg >= 0, member_t, 0.0)
  member_t = nisa.affine_select(cpg * i_tg + (cpg - 1) - i_tc >= 0, member_t, 0.0)

  for t in nl.static_range(n_tiles):
    c0 = t * cpt
    cs = min(cpt, C - c0)                  # channels of this tile (whole groups)
    gs = cs // cpg
    g_sb = nl.load(gamma_2d[c0:c0 + cs, :], dtype=nl.float32)
    b_sb = nl.load(beta_2d[c0:c0 + cs, :], dtype=nl.float32)

    for n in nl.affine_range(N):
      x = nl.load(x_rows[n, c0:c0 + cs, :], dtype=nl.float32)

      # per-channel sum and sum of squares
      stats = nl.ndarray((par_dim(cs), 2), dtype=nl.float32, buffer=nl.sbuf)
      stats[:, 0:1] = nl.sum(x, axis=[1], keepdims=True)
      sq = nisa.activation_reduce(op=nl.square, data=x, reduce_op=nl.add, reduce_res=stats[:, 1:2])

      # group mean and E[x^2], then back to every channel of the group
      group_sums = nl.matmul(member[0:cs, 0:gs], stats, transpose_x=True)          # [gs, 2]
      group_stats = nl.multiply(group_sums, inv_count)
      ch_stats = nl.matmul(member_t[0:gs, 0:cs], group_stats, transpose_x=True)    # [cs, 2]
      mean = nl.copy(ch_stats[:, 0:1])
      var = nl.subtract(ch_stats[:, 1:2], nl.multiply(mean, mean))
      rstd = nl.rsqrt(nl.add(var, eps))

      # y = silu(x * scale + shift), scale = gamma * rstd, shift = beta - mean * scale
      scale = nl.multiply(g_sb, rstd)
      shift = nl.subtract(b_sb, nl.multiply(mean, scale))
      y = nisa.activation(op=nl.silu, data=x, scale=scale, bias=shift, dtype=x_tensor.dtype)
      nl.store(out_rows[n, c0:c0 + cs, :], value=y)

  return out_tensor


@nki.jit
def group_norm_silu_transpose_kernel(x_tensor, gamma, beta, num_groups=32, eps=1e-5):
  """
  The same GroupNorm + SiLU with the cross-partition reduction done by transposes instead of
  membership matmuls: the [channels, 2] sums are transposed to [2, channels] (nisa.nc_transpose), the
  channels of each group summed on the free axis ([2, groups, cpg] -> [2, groups]), the group
  statistics broadcast back along the free axis and transposed again to [channels, 2].
  """
  N, C, H, W = x_tensor.shape
  HW = H * W
  assert C % num_groups == 0
  cpg = C // num_groups
  pmax = nl.tile_size.pmax
  assert cpg <= pmax
  gpt = pmax // cpg
  cpt = gpt * cpg
  n_tiles = (C + cpt - 1) // cpt
  inv_count = 1.0 / (cpg * HW)

  out_tensor = nl.ndarray((N, C, H, W), dtype=x_tensor.dtype, buffer=nl.shared_hbm)
  x_rows = x_tensor.reshape((N, C, HW))
  out_rows = out_tensor.reshape((N, C, HW))
  gamma_2d = gamma.reshape((C, 1))
  beta_2d = beta.reshape((C, 1))

  for t in nl.static_range(n_tiles):
    c0 = t * cpt
    cs = min(cpt, C - c0)
    gs = cs // cpg
    g_sb = nl.load(gamma_2d[c0:c0 + cs, :], dtype=nl.float32)
    b_sb = nl.load(beta_2d[c0:c0 + cs, :], dtype=nl.float32)

    for n in nl.affine_range(N):
      x = nl.load(x_rows[n, c0:c0 + cs, :], dtype=nl.float32)
      stats = nl.ndarray((par_dim(cs), 2), dtype=nl.float32, buffer=nl.sbuf)
      stats[:, 0:1] = nl.sum(x, axis=[1], keepdims=True)
      stats[:, 1:2] = nl.sum(nl.square(x), axis=[1], keepdims=True)

      # [cs, 2] -> [2, cs] -> per-group sums on the free axis
      stats_t = nl.copy(nisa.nc_transpose(stats))
      group_stats = nl.sum(stats_t.reshape((2, gs, cpg)), axis=[2])
      group_stats = nl.multiply(group_stats, inv_count)

      # back to one value per channel: broadcast over the group's channels, transpose to [cs, 2]
      ch_stats_t = nl.ndarray((par_dim(2), gs, cpg), dtype=nl.float32, buffer=nl.sbuf)
      ch_stats_t[...] = group_stats.reshape((2, gs, 1)).broadcast_to((2, gs, cpg))
      ch_stats = nisa.nc_transpose(ch_stats_t.reshape((2, cs)))

      mean = nl.copy(ch_stats[:, 0:1])
      var = nl.subtract(ch_stats[:, 1:2], nl.multiply(mean, mean))
      rstd = nl.rsqrt(nl.add(var, eps))
      scale = nl.multiply(g_sb, rstd)
      shift = nl.subtract(b_sb, nl.multiply(mean, scale))
      y = nisa.activation(op=nl.silu, data=x, scale=scale, bias=shift, dtype=x_tensor.dtype)
      nl.store(out_rows[n, c0:c0 + cs, :], value=y)

  return out_tensor


# ------------------------------------------------------------------------------------------------
# Depthwise conv2d 3x3
# ------------------------------------------------------------------------------------------------

@nki.jit
def depthwise_conv2d_3x3_kernel(x_tensor, weight, bias):
  """
  Depthwise 3x3 convolution (groups = C), stride 1, padding 1.

  Each channel (partition) is convolved with its own 3x3 filter: the 9 taps are per-partition
  scalars. The zero padding is never materialised: tap (kh, kw) loads the window shifted by
  (kh - 1, kw - 1) into a zeroed tile with a mask that skips the positions outside the image.

  IO tensor layouts:
   - x_tensor: (N, C, H, W); weight: (C, 1, 3, 3) (torch Conv2d(groups=C)); bias: (C,)
   - out: (N, C, H, W)
  """
  N, C, H, W = x_tensor.shape
  assert weight.shape == (C, 1, 3, 3)
  out_tensor = nl.ndarray((N, C, H, W), dtype=x_tensor.dtype, buffer=nl.shared_hbm)

  pmax = nl.tile_size.pmax
  n_tiles = (C + pmax - 1) // pmax
  w_2d = weight.reshape((C, 9))
  b_2d = bias.reshape((C, 1))

  i_p, i_h, i_w = nl.mgrid[0:pmax, 0:H, 0:W]
  i_q, i_k = nl.mgrid[0:pmax, 0:9]
  i_b, i_0 = nl.mgrid[0:pmax, 0:1]

  for t in nl.affine_range(n_tiles):
    w_sb = nl.load(w_2d[t * pmax + i_q, i_k], dtype=nl.float32, mask=(t * pmax + i_q < C))
    b_sb = nl.load(b_2d[t * pmax + i_b, i_0], dtype=nl.float32, mask=(t * pmax + i_b < C))

    for n in nl.affine_range(N):
      acc = nl.zeros((par_dim(pmax), H, W), dtype=nl.float32, buffer=nl.sbuf)
      for kh in nl.static_range(3):
        for kw in nl.static_range(3):
          tap = nl.zeros((par_dim(pmax), H, W), dtype=x_tensor.dtype, buffer=nl.sbuf)
          tap[i_p, i_h, i_w] = nl.load(
            x_tensor[n, t * pmax + i_p, i_h + (kh - 1), i_w + (kw - 1)],
            mask=((t * pmax + i_p < C) & (i_h + (kh - 1) >= 0) & (i_h + (kh - 1) < H)
                  & (i_w + (kw - 1) >= 0) & (i_w + (kw - 1) < W)))
          k = kh * 3 + kw
          if k == 0:
            acc[i_p, i_h, i_w] = nisa.tensor_scalar(data=tap, op0=nl.multiply, operand0=w_sb[i_b, k + i_0],
                                                    dtype=nl.float32, mask=(t * pmax + i_p < C))
          else:
            acc[i_p, i_h, i_w] = nl.add(acc, nl.multiply(tap, w_sb[i_b, k + i_0], mask=(t * pmax + i_p < C)),
                                        mask=(t * pmax + i_p < C))

      y = nisa.tensor_scalar(data=acc, op0=nl.add, operand0=b_sb, dtype=x_tensor.dtype,
                             mask=(t * pmax + i_p < C))
      nl.store(out_tensor[n, t * pmax + i_p, i_h, i_w], value=y, mask=(t * pmax + i_p < C))

  return out_tensor


@nki.jit
def depthwise_conv2d_3x3_padded_kernel(x_tensor, weight, bias):
  """
  The same depthwise convolution with one load per (image, channel tile) into a zero-padded
  [C, H + 2, W + 2] tile; the 9 taps read shifted windows of it in place.
  """
  N, C, H, W = x_tensor.shape
  assert weight.shape == (C, 1, 3, 3)
  out_tensor = nl.ndarray((N, C, H, W), dtype=x_tensor.dtype, buffer=nl.shared_hbm)

  pmax = nl.tile_size.pmax
  n_tiles = (C + pmax - 1) // pmax
  w_2d = weight.reshape((C, 9))
  b_2d = bias.reshape((C, 1))

  i_p, i_h, i_w = nl.mgrid[0:pmax, 0:H, 0:W]
  i_q, i_k = nl.mgrid[0:pmax, 0:9]
  i_b, i_0 = nl.mgrid[0:pmax, 0:1]

  for t in nl.affine_range(n_tiles):
    w_sb = nl.load(w_2d[t * pmax + i_q, i_k], dtype=nl.float32, mask=(t * pmax + i_q < C))
    b_sb = nl.load(b_2d[t * pmax + i_b, i_0], dtype=nl.float32, mask=(t * pmax + i_b < C))

    for n in nl.affine_range(N):
      x_pad = nl.zeros((par_dim(pmax), H + 2, W + 2), dtype=x_tensor.dtype, buffer=nl.sbuf)
      x_pad[i_p, 1 + i_h, 1 + i_w] = nl.load(x_tensor[n, t * pmax + i_p, i_h, i_w],
                                             mask=(t * pmax + i_p < C))
      acc = nl.zeros((par_dim(pmax), H, W), dtype=nl.float32, buffer=nl.sbuf)
      for kh in nl.static_range(3):
        for kw in nl.static_range(3):
          acc[i_p, i_h, i_w] = nisa.scalar_tensor_tensor(
            data=x_pad[i_p, i_h + kh, i_w + kw], op0=nl.multiply, operand0=w_sb[i_b, kh * 3 + kw + i_0],
            op1=nl.add, operand1=acc, mask=(t * pmax + i_p < C))

      y = nisa.tensor_scalar(data=acc, op0=nl.add, operand0=b_sb, dtype=x_tensor.dtype,
                             mask=(t * pmax + i_p < C))
      nl.store(out_tensor[n, t * pmax + i_p, i_h, i_w], value=y, mask=(t * pmax + i_p < C))

  return out_tensor


# ------------------------------------------------------------------------------------------------
# Global average pool + linear classifier head
# ------------------------------------------------------------------------------------------------

@nki.jit
def global_avgpool_classifier_kernel(x_tensor, fc_weight, fc_bias):
  """
  logits = mean_{h, w}(x) @ fc_weight^T + fc_bias

  The pooled features are kept as [C (partitions), N] so that they are the moving operand of the
  classifier matmul, contracted over the channels (tiles of 128, accumulated in PSUM); the logits come
  out as [K (partitions), N], the bias is a per-partition add on the eviction, and the store writes
  them transposed into logits[N, K].

  IO tensor layouts:
   - x_tensor: (N, C, H, W), N <= 512
   - fc_weight: (K, C) (nn.Linear), fc_bias: (K,)
   - out: (N, K)
  """
  N, C, H, W = x_tensor.shape
  K, C_ = fc_weight.shape
  assert C == C_
  HW = H * W
  pmax = nl.tile_size.pmax
  assert N <= nl.tile_size.gemm_moving_fmax
  n_c = (C + pmax - 1) // pmax
  n_k = (K + pmax - 1) // pmax

  out_tensor = nl.ndarray((N, K), dtype=x_tensor.dtype, buffer=nl.shared_hbm)
  x_rows = x_tensor.reshape((N, C, HW))
  bias_2d = fc_bias.reshape((K, 1))

  # global average pool: pooled[c_tile][c, n]
  pooled = nl.ndarray((n_c, par_dim(pmax), N), dtype=nl.float32, buffer=nl.sbuf)
  for ct in nl.static_range(n_c):
    cs = min(pmax, C - ct * pmax)
    for n in nl.affine_range(N):
      x = nl.load(x_rows[n, ct * pmax:ct * pmax + cs, :], dtype=nl.float32)
      pooled[ct, 0:cs, n:n + 1] = nl.mean(x, axis=[1], keepdims=True)

  # classifier head, one tile of 128 classes at a time
  for kt in nl.static_range(n_k):
    ks = min(pmax, K - kt * pmax)
    logits = nl.zeros((par_dim(ks), N), dtype=nl.float32, buffer=nl.psum)
    for ct in nl.static_range(n_c):
      cs = min(pmax, C - ct * pmax)
      w_T = nl.load_transpose2d(fc_weight[kt * pmax:kt * pmax + ks, ct * pmax:ct * pmax + cs],
                                dtype=nl.float32)
      logits += nl.matmul(w_T, pooled[ct, 0:cs, :], transpose_x=True)

    b_sb = nl.load(bias_2d[kt * pmax:kt * pmax + ks, :], dtype=nl.float32)
    res = nisa.activation(op=nl.copy, data=logits, bias=b_sb, dtype=x_tensor.dtype)

    i_k = nl.arange(ks)[:, None]
    i_n = nl.arange(N)[None, :]
    nl.store(out_tensor[i_n, kt * pmax + i_k], value=res)

  return out_tensor
