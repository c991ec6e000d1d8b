"""Vision-transformer blocks in the new NKI dialect (``import nki``, ISA calls writing ``dst=``), written the way public
NKI 0.3+ ports of ViT / SigLIP are:

- ``patch_embed(image, w, b, cls_token, pos_embed, patch)``: the ViT patch embedding of ``patch_embed_b1`` (one
  image [C, H, W] -> [1 + (H / 16) (W / 16), D]) with explicit access patterns: each kernel row's im2col slice is one
  ``nisa.dma_copy`` from ``image.ap([[1, 16], [16 W, rows], [16, gw]], offset=...)`` (kx on the partitions, patch row
  and column on the free axis) into partitions ky * 16 .. ky * 16 + 15 of the [128, tokens] patch tile; 6
  contraction chunks accumulate in one PSUM tile (``nc_matmul`` with the default accumulate); the conv bias comes in
  broadcast over the token partitions by a stride-0 HBM access pattern (``b.ap([[0, ntok], [1, D]])``).
- ``siglip_map_head(x, probe, wq, wk, wv, wo, bo, ln_g, ln_b, w1, b1, w2, b2, num_heads)``: SigLIP's attention
  pooling head (MAP): a learned probe query attends to all tokens of each image with ``num_heads`` heads, the result
  goes through the output projection, then y + MLP(LayerNorm(y)) (gelu tanh approximation). x [B, N, D] (D <= 128,
  N <= 512), weights in x @ W layout, output [B, D]. All heads at once: the probe's projection q [D, 1] is spread
  into a block-diagonal [D, heads] stationary (a head mask from ``nisa.iota``), so one matmul against k^T [D, N]
  gives the [heads, N] scores; softmax along the free axis; the probabilities transposed per 128 tokens give
  [tokens, heads] stationaries against v [tokens, D], accumulating O [heads, D] in PSUM, whose block diagonal is
  gathered into a column [D, 1] by masking and a matmul with a ones vector. The LayerNorm and MLP run on one row.
- ``window_attention(q, k, v, bias, num_heads, windows_per_tile)``: Swin W-MSA (no shift) with the windows' tokens on
  the partitions: the window partition is a reshaped + permuted view of the channels-last map
  (``q.reshape((nwy, 7, nwx, 7, C))[wy, :, wx0:wx0 + wpt].permute((1, 0, 2, 3))``), one DMA per tile of
  ``windows_per_tile`` (1 or 2) windows of a window row into [wpt * 49, C]; q, k transposed on TensorE; one score
  matmul per head over the whole tile with the host-gathered relative position bias [heads, 49, 49] on the diagonal
  blocks and -30000 between windows; softmax (``activation`` exp with the row sum in ``reduce_res``); p^T v. Under
  LNC = 2 (``window_attention[2]``) each core takes half of the window rows.
- ``sincos_pos_embed_2d(grid_h, grid_w, dim, temperature)``: MAE / SigLIP 2-D sin-cos position embedding
  [grid_h * grid_w, dim] generated on chip: token index from ``nisa.iota`` (tokens on the partitions), frequencies
  omega_i = temperature^(-i / (dim / 4)) from ``nisa.iota`` + ``exp``, and sin / cos of pos * omega with the argument
  range-reduced to [-pi, pi) first (ScalarE's sin is only valid there): r = ((a + pi) mod 2 pi) - pi, cos(a) =
  sin(a + pi / 2) reduced the same way. Layout [sin(x w), cos(x w), sin(y w), cos(y w)] (x = column, y = row), as
  MAE's ``get_2d_sincos_pos_embed`` (its first half comes from grid[0] of meshgrid(grid_w, grid_h), the column).

Written for nsim's tests in the style of those kernels; not copies of any file. No nsim imports.
"""
import math

import nki
import nki.isa as nisa
import nki.language as nl

P_MAX = 128


@nki.jit
def patch_embed(image, w, b, cls_token, pos_embed, patch=16):
  C, H, W = image.shape
  K, D = w.shape
  gh, gw = H // patch, W // patch
  T = gh * gw
  assert K == C * patch * patch and K % P_MAX == 0 and D <= 512
  kc_rows = P_MAX // patch
  n_chunks = K // P_MAX
  chunks_per_c = patch // kc_rows
  rows_per_tile = P_MAX // gw
  out = nl.ndarray((T + 1, D), dtype=image.dtype, buffer=nl.shared_hbm)

  w_sb = nl.ndarray((P_MAX, n_chunks, D), dtype=w.dtype, buffer=nl.sbuf)
  for kc in nl.affine_range(n_chunks):
    nisa.dma_copy(dst=w_sb[:, kc, :], src=w[kc * P_MAX:(kc + 1) * P_MAX, :])

  # class token + pos_embed[0]
  cls = nl.ndarray((1, D), dtype=nl.float32, buffer=nl.sbuf)
  pos0 = nl.ndarray((1, D), dtype=nl.float32, buffer=nl.sbuf)
  nisa.dma_copy(dst=cls, src=cls_token)
  nisa.dma_copy(dst=pos0, src=pos_embed[0:1, :])
  cls_o = nl.ndarray((1, D), dtype=image.dtype, buffer=nl.sbuf)
  nisa.tensor_tensor(dst=cls_o, data1=cls, data2=pos0, op=nl.add)
  nisa.dma_copy(dst=out[0:1, :], src=cls_o)

  n_tiles = (gh + rows_per_tile - 1) // rows_per_tile
  for tt in nl.static_range(n_tiles):
    gy0 = tt * rows_per_tile
    nr = min(rows_per_tile, gh - gy0)
    ntok = nr * gw
    acc = nl.ndarray((ntok, D), dtype=nl.float32, buffer=nl.psum)
    for kc in nl.static_range(n_chunks):
      c = kc // chunks_per_c
      ky0 = (kc % chunks_per_c) * kc_rows
      pt = nl.ndarray((P_MAX, ntok), dtype=image.dtype, buffer=nl.sbuf)
      for ky in nl.static_range(kc_rows):
        base = c * H * W + (gy0 * patch + ky0 + ky) * W
        nisa.dma_copy(dst=pt[ky * patch:(ky + 1) * patch, :],
                      src=image.ap([[1, patch], [patch * W, nr], [patch, gw]], offset=base))
      nisa.nc_matmul(dst=acc, stationary=pt, moving=w_sb[:, kc, :])
    bias = nl.ndarray((ntok, D), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=bias, src=b.ap([[0, ntok], [1, D]]))
    pos = nl.ndarray((ntok, D), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=pos, src=pos_embed[1 + gy0 * gw:1 + gy0 * gw + ntok, :])
    res = nl.ndarray((ntok, D), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=res, data1=acc, data2=bias, op=nl.add)
    res_o = nl.ndarray((ntok, D), dtype=image.dtype, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=res_o, data1=res, data2=pos, op=nl.add)
    nisa.dma_copy(dst=out[1 + gy0 * gw:1 + gy0 * gw + ntok, :], src=res_o)
  return out


def _row(t_hbm, D):
  """A [1, D] HBM row loaded as fp32 into SBUF."""
  r = nl.ndarray((1, D), dtype=nl.float32, buffer=nl.sbuf)
  nisa.dma_copy(dst=r, src=t_hbm)
  return r


@nki.jit
def siglip_map_head(x, probe, wq, wk, wv, wo, bo, ln_g, ln_b, w1, b1, w2, b2, num_heads, eps=1e-6):
  B, N, D = x.shape
  Hm = w1.shape[1]
  nh = num_heads
  hd = D // nh
  assert D <= P_MAX and N <= 512 and Hm % P_MAX == 0 and Hm <= 512 and hd * nh == D
  scale = 1.0 / math.sqrt(hd)
  out = nl.ndarray((B, D), dtype=x.dtype, buffer=nl.shared_hbm)
  n_tok_tiles = (N + P_MAX - 1) // P_MAX
  n_h_tiles = Hm // P_MAX

  # weights, resident
  wq_sb = nl.ndarray((D, D), dtype=wq.dtype, buffer=nl.sbuf)
  wk_sb = nl.ndarray((D, D), dtype=wk.dtype, buffer=nl.sbuf)
  wv_sb = nl.ndarray((D, D), dtype=wv.dtype, buffer=nl.sbuf)
  wo_sb = nl.ndarray((D, D), dtype=wo.dtype, buffer=nl.sbuf)
  w1_sb = nl.ndarray((D, Hm), dtype=w1.dtype, buffer=nl.sbuf)
  w2_sb = nl.ndarray((P_MAX, n_h_tiles, D), dtype=w2.dtype, buffer=nl.sbuf)
  nisa.dma_copy(dst=wq_sb, src=wq)
  nisa.dma_copy(dst=wk_sb, src=wk)
  nisa.dma_copy(dst=wv_sb, src=wv)
  nisa.dma_copy(dst=wo_sb, src=wo)
  nisa.dma_copy(dst=w1_sb, src=w1)
  for j in nl.affine_range(n_h_tiles):
    nisa.dma_copy(dst=w2_sb[:, j, :], src=w2[j * P_MAX:(j + 1) * P_MAX, :])
  bo_sb, g_sb, be_sb, b1_sb, b2_sb = _row(bo, D), _row(ln_g, D), _row(ln_b, D), _row(b1, Hm), _row(b2, D)

  # head masks: hmask[d, h] = 1 if d belongs to head h, hmaskT[h, d] the same transposed
  hv = nl.ndarray((D, nh), dtype=nl.float32, buffer=nl.sbuf)
  nisa.iota(dst=hv, pattern=[[-hd, nh]], offset=0, channel_multiplier=1)        # d - h * hd
  ge = nl.ndarray((D, nh), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_scalar(dst=ge, data=hv, op0=nl.greater_equal, operand0=0.0)
  hmask = nl.ndarray((D, nh), dtype=nl.float32, buffer=nl.sbuf)
  nisa.scalar_tensor_tensor(dst=hmask, data=hv, op0=nl.less, operand0=float(hd), op1=nl.multiply, operand1=ge)
  hvT = nl.ndarray((nh, D), dtype=nl.float32, buffer=nl.sbuf)
  nisa.iota(dst=hvT, pattern=[[1, D]], offset=0, channel_multiplier=-hd)        # d - h * hd
  geT = nl.ndarray((nh, D), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_scalar(dst=geT, data=hvT, op0=nl.greater_equal, operand0=0.0)
  hmaskT = nl.ndarray((nh, D), dtype=nl.float32, buffer=nl.sbuf)
  nisa.scalar_tensor_tensor(dst=hmaskT, data=hvT, op0=nl.less, operand0=float(hd), op1=nl.multiply, operand1=geT)
  ones = nl.ndarray((nh, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.memset(dst=ones, value=1.0)

  # the probe's query, scaled, as a column [D, 1], spread block-diagonally over the heads
  probeT = nl.ndarray((D, 1), dtype=probe.dtype, buffer=nl.sbuf)
  nisa.dma_copy(dst=probeT, src=probe.ap([[1, D], [1, 1]]))
  q_ps = nl.ndarray((D, 1), dtype=nl.float32, buffer=nl.psum)
  nisa.nc_matmul(dst=q_ps, stationary=wq_sb, moving=probeT)
  q_col = nl.ndarray((D, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.activation(dst=q_col, op=nl.copy, data=q_ps, scale=scale)
  qblk = nl.ndarray((D, nh), dtype=x.dtype, buffer=nl.sbuf)
  nisa.tensor_scalar(dst=qblk, data=hmask, op0=nl.multiply, operand0=q_col)

  for b in nl.affine_range(B):
    # x^T [D, N] by TensorE transposes of 128-token tiles
    xT = nl.ndarray((D, N), dtype=x.dtype, buffer=nl.sbuf)
    for t in nl.affine_range(n_tok_tiles):
      t0 = t * P_MAX
      nt = min(P_MAX, N - t0)
      xt = nl.ndarray((P_MAX, D), dtype=x.dtype, buffer=nl.sbuf)
      nisa.dma_copy(dst=xt[:nt, :], src=x[b, t0:t0 + nt, :])
      xT_ps = nl.ndarray((D, P_MAX), dtype=x.dtype, buffer=nl.psum)
      nisa.nc_transpose(dst=xT_ps[:, :nt], data=xt[:nt, :])
      nisa.tensor_copy(dst=xT[:, t0:t0 + nt], src=xT_ps[:, :nt])

    # k^T [D, N] and the scores of all heads [nh, N]
    kT_ps = nl.ndarray((D, N), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=kT_ps, stationary=wk_sb, moving=xT)
    kT = nl.ndarray((D, N), dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=kT, src=kT_ps)
    s_ps = nl.ndarray((nh, N), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=s_ps, stationary=qblk, moving=kT)

    # softmax over the tokens
    mx = nl.ndarray((nh, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=mx, op=nl.maximum, data=s_ps, axis=1, negate=True, keepdims=True)
    e = nl.ndarray((nh, N), dtype=nl.float32, buffer=nl.sbuf)
    ssum = nl.ndarray((nh, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=e, op=nl.exp, data=s_ps, bias=mx, reduce_op=nl.add, reduce_res=ssum,
                    reduce_cmd=nisa.reduce_cmd.reset_reduce)
    rs = nl.ndarray((nh, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.reciprocal(dst=rs, data=ssum)
    p = nl.ndarray((nh, N), dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=p, data=e, op0=nl.multiply, operand0=rs)

    # O [nh, D] = P V, token tiles accumulating in PSUM
    o_ps = nl.ndarray((nh, D), dtype=nl.float32, buffer=nl.psum)
    for t in nl.affine_range(n_tok_tiles):
      t0 = t * P_MAX
      nt = min(P_MAX, N - t0)
      v_ps = nl.ndarray((P_MAX, D), dtype=nl.float32, buffer=nl.psum)
      nisa.nc_matmul(dst=v_ps[:nt, :], stationary=xT[:, t0:t0 + nt], moving=wv_sb)
      v_sb = nl.ndarray((P_MAX, D), dtype=x.dtype, buffer=nl.sbuf)
      nisa.tensor_copy(dst=v_sb[:nt, :], src=v_ps[:nt, :])
      pT_ps = nl.ndarray((P_MAX, nh), dtype=x.dtype, buffer=nl.psum)
      nisa.nc_transpose(dst=pT_ps[:nt, :], data=p[:, t0:t0 + nt])
      pT = nl.ndarray((P_MAX, nh), dtype=x.dtype, buffer=nl.sbuf)
      nisa.tensor_copy(dst=pT[:nt, :], src=pT_ps[:nt, :])
      nisa.nc_matmul(dst=o_ps, stationary=pT[:nt, :], moving=v_sb[:nt, :])

    # the block diagonal of O as a column [D, 1]
    om = nl.ndarray((nh, D), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=om, data1=o_ps, data2=hmaskT, op=nl.multiply)
    oc_ps = nl.ndarray((D, 1), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=oc_ps, stationary=om, moving=ones)
    o_col = nl.ndarray((D, 1), dtype=wo.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=o_col, src=oc_ps)

    # output projection y = o wo + bo [1, D]
    y_ps = nl.ndarray((1, D), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=y_ps, stationary=o_col, moving=wo_sb)
    y = nl.ndarray((1, D), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=y, data1=y_ps, data2=bo_sb, op=nl.add)

    # LayerNorm of the row
    mean = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=mean, op=nl.add, data=y, axis=1, keepdims=True)
    nisa.tensor_scalar(dst=mean, data=mean, op0=nl.multiply, operand0=1.0 / D)
    yc = nl.ndarray((1, D), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=yc, data=y, op0=nl.subtract, operand0=mean)
    sq = nl.ndarray((1, D), dtype=nl.float32, buffer=nl.sbuf)
    var = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=sq, op=nl.square, data=yc, reduce_op=nl.add, reduce_res=var,
                    reduce_cmd=nisa.reduce_cmd.reset_reduce)
    std = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=var, data=var, op0=nl.multiply, operand0=1.0 / D, op1=nl.add, operand1=eps)
    nisa.activation(dst=std, op=nl.sqrt, data=var)
    rstd = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.reciprocal(dst=rstd, data=std)
    ln = nl.ndarray((1, D), dtype=nl.float32, buffer=nl.sbuf)
    nisa.scalar_tensor_tensor(dst=ln, data=yc, op0=nl.multiply, operand0=rstd, op1=nl.multiply, operand1=g_sb)
    ln_o = nl.ndarray((1, D), dtype=w1.dtype, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=ln_o, data1=ln, data2=be_sb, op=nl.add)

    # MLP: gelu_tanh(ln w1 + b1) w2 + b2, the hidden row transposed in 128 chunks for the second matmul
    lnT_ps = nl.ndarray((D, 1), dtype=w1.dtype, buffer=nl.psum)
    nisa.nc_transpose(dst=lnT_ps, data=ln_o)
    lnT = nl.ndarray((D, 1), dtype=w1.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=lnT, src=lnT_ps)
    h_ps = nl.ndarray((1, Hm), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=h_ps, stationary=lnT, moving=w1_sb)
    hpre = nl.ndarray((1, Hm), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=hpre, data1=h_ps, data2=b1_sb, op=nl.add)
    hact = nl.ndarray((1, Hm), dtype=w2.dtype, buffer=nl.sbuf)
    nisa.activation(dst=hact, op=nl.gelu_apprx_tanh, data=hpre)
    z_ps = nl.ndarray((1, D), dtype=nl.float32, buffer=nl.psum)
    for j in nl.affine_range(n_h_tiles):
      hT_ps = nl.ndarray((P_MAX, 1), dtype=w2.dtype, buffer=nl.psum)
      nisa.nc_transpose(dst=hT_ps, data=hact[:, j * P_MAX:(j + 1) * P_MAX])
      hT = nl.ndarray((P_MAX, 1), dtype=w2.dtype, buffer=nl.sbuf)
      nisa.tensor_copy(dst=hT, src=hT_ps)
      nisa.nc_matmul(dst=z_ps, stationary=hT, moving=w2_sb[:, j, :])
    z = nl.ndarray((1, D), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=z, data1=z_ps, data2=b2_sb, op=nl.add)
    res = nl.ndarray((1, D), dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=res, data1=z, data2=y, op=nl.add)
    nisa.dma_copy(dst=out[b:b + 1, :], src=res)
  return out


@nki.jit
def sincos_pos_embed_2d(grid_h, grid_w, dim, temperature=10000.0):
  T = grid_h * grid_w
  assert dim % 4 == 0
  q = dim // 4
  out = nl.ndarray((T, dim), dtype=nl.float32, buffer=nl.shared_hbm)
  two_pi = 2.0 * math.pi

  # omega_i = temperature^(-i / q) = exp(-ln(temperature) / q * i), the same on every partition
  fi = nl.ndarray((P_MAX, q), dtype=nl.float32, buffer=nl.sbuf)
  nisa.iota(dst=fi, pattern=[[1, q]], offset=0, channel_multiplier=0)
  omega = nl.ndarray((P_MAX, q), dtype=nl.float32, buffer=nl.sbuf)
  nisa.activation(dst=omega, op=nl.exp, data=fi, scale=-math.log(temperature) / q)

  for t in nl.affine_range((T + P_MAX - 1) // P_MAX):
    t0 = t * P_MAX
    nt = min(P_MAX, T - t0)
    # token index -> (row y, column x) = (idx // grid_w, idx mod grid_w)
    idx = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.iota(dst=idx, pattern=[[0, 1]], offset=t0, channel_multiplier=1)
    xc = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=xc, data=idx, op0=nl.mod, operand0=float(grid_w))
    yc = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=yc, data=idx, op0=nl.subtract, operand0=xc, op1=nl.multiply, operand1=1.0 / grid_w)

    emb = nl.ndarray((P_MAX, dim), dtype=nl.float32, buffer=nl.sbuf)
    for half, coord in ((0, xc), (1, yc)):
      for k, phase in ((0, 0.0), (1, 0.5 * math.pi)):
        # a = coord * omega + phase, reduced to [-pi, pi): ((a + pi) mod 2 pi) - pi
        a = nl.ndarray((P_MAX, q), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=a, data=omega, op0=nl.multiply, operand0=coord, op1=nl.add,
                           operand1=phase + math.pi)
        r = nl.ndarray((P_MAX, q), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=r, data=a, op0=nl.mod, operand0=two_pi, op1=nl.subtract, operand1=math.pi)
        c0 = (2 * half + k) * q
        nisa.activation(dst=emb[:, c0:c0 + q], op=nl.sin, data=r)
    nisa.dma_copy(dst=out[t0:t0 + nt, :], src=emb[:nt, :])
  return out


@nki.jit
def window_attention(q, k, v, bias, num_heads, windows_per_tile=2, window=7):
  """Swin W-MSA (no shift) with the windows' tokens on the partitions, ``windows_per_tile`` windows of one window row
  packed into one partition tile (2 x 49 = 98 tokens). The window partition is a view of the channels-last map,
  ``q.reshape((nwy, ws, nwx, ws, C))[wy, :, wx0:wx0 + wpt].permute((1, 0, 2, 3))`` ([wpt, ws, ws, C], rows of C
  contiguous elements), one DMA per tile and tensor into a [wpt * 49, C] tile; q and k transposed on TensorE; per head
  one [n, n] score matmul over all the tile's windows, the per-head relative position bias ``bias`` [heads, 49, 49]
  (the host's gathered table) on the diagonal blocks and -30000 between windows; softmax; the probabilities
  transposed and multiplied with v [n, hd] straight from the tile. Output [H, W, C]. Launched as
  ``window_attention[2](...)`` (LNC = 2) the two cores take half of the window rows each."""
  H, W, C = q.shape
  ws = window
  N = ws * ws
  nh = num_heads
  hd = C // nh
  wpt = windows_per_tile
  nwy, nwx = H // ws, W // ws
  assert nwx % wpt == 0 and wpt * N <= P_MAX and C <= P_MAX
  n = wpt * N
  scale = 1.0 / math.sqrt(hd)
  out = nl.ndarray((H, W, C), dtype=q.dtype, buffer=nl.shared_hbm)

  # block-diagonal bias of every head, -30000 between the tile's windows
  bias_sb = nl.ndarray((n, nh, n), dtype=nl.float32, buffer=nl.sbuf)
  nisa.memset(dst=bias_sb, value=-30000.0)
  for h in nl.static_range(nh):
    for w in nl.static_range(wpt):
      nisa.dma_copy(dst=bias_sb[w * N:(w + 1) * N, h, w * N:(w + 1) * N], src=bias[h])

  qv = q.reshape((nwy, ws, nwx, ws, C))
  kv = k.reshape((nwy, ws, nwx, ws, C))
  vv = v.reshape((nwy, ws, nwx, ws, C))
  ov = out.reshape((nwy, ws, nwx, ws, C))
  # under LNC = 2 (``window_attention[2]``) each core takes half of the window rows
  n_prog = nl.num_programs(0)
  pid = nl.program_id(0)
  assert nwy % n_prog == 0
  rows = nwy // n_prog
  for wr in nl.affine_range(rows):
    wy = pid * rows + wr
    for g in nl.affine_range(nwx // wpt):
      wx0 = g * wpt
      qt = nl.ndarray((n, C), dtype=q.dtype, buffer=nl.sbuf)
      kt = nl.ndarray((n, C), dtype=k.dtype, buffer=nl.sbuf)
      vt = nl.ndarray((n, C), dtype=v.dtype, buffer=nl.sbuf)
      nisa.dma_copy(dst=qt, src=qv[wy, :, wx0:wx0 + wpt, :, :].permute((1, 0, 2, 3)))
      nisa.dma_copy(dst=kt, src=kv[wy, :, wx0:wx0 + wpt, :, :].permute((1, 0, 2, 3)))
      nisa.dma_copy(dst=vt, src=vv[wy, :, wx0:wx0 + wpt, :, :].permute((1, 0, 2, 3)))
      qT_ps = nl.ndarray((C, n), dtype=q.dtype, buffer=nl.psum)
      nisa.nc_transpose(dst=qT_ps, data=qt)
      qT = nl.ndarray((C, n), dtype=q.dtype, buffer=nl.sbuf)
      nisa.tensor_copy(dst=qT, src=qT_ps)
      kT_ps = nl.ndarray((C, n), dtype=k.dtype, buffer=nl.psum)
      nisa.nc_transpose(dst=kT_ps, data=kt)
      kT = nl.ndarray((C, n), dtype=k.dtype, buffer=nl.sbuf)
      nisa.tensor_copy(dst=kT, src=kT_ps)

      o_sb = nl.ndarray((n, C), dtype=q.dtype, buffer=nl.sbuf)
      for h in nl.static_range(nh):
        s_ps = nl.ndarray((n, n), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=s_ps, stationary=qT[h * hd:(h + 1) * hd, :], moving=kT[h * hd:(h + 1) * hd, :])
        s = nl.ndarray((n, n), dtype=nl.float32, buffer=nl.sbuf)
        nisa.scalar_tensor_tensor(dst=s, data=s_ps, op0=nl.multiply, operand0=scale, op1=nl.add,
                                  operand1=bias_sb[:, h, :])
        negmx = nl.ndarray((n, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=negmx, op=nl.maximum, data=s, axis=1, negate=True, keepdims=True)
        e = nl.ndarray((n, n), dtype=nl.float32, buffer=nl.sbuf)
        ssum = nl.ndarray((n, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=e, op=nl.exp, data=s, bias=negmx, reduce_op=nl.add, reduce_res=ssum,
                        reduce_cmd=nisa.reduce_cmd.reset_reduce)
        rs = nl.ndarray((n, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.reciprocal(dst=rs, data=ssum)
        p = nl.ndarray((n, n), dtype=v.dtype, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=p, data=e, op0=nl.multiply, operand0=rs)
        pT_ps = nl.ndarray((n, n), dtype=v.dtype, buffer=nl.psum)
        nisa.nc_transpose(dst=pT_ps, data=p)
        pT = nl.ndarray((n, n), dtype=v.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=pT, src=pT_ps)
        o_ps = nl.ndarray((n, hd), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=o_ps, stationary=pT, moving=vt[:, h * hd:(h + 1) * hd])
        nisa.tensor_copy(dst=o_sb[:, h * hd:(h + 1) * hd], src=o_ps)
      nisa.dma_copy(dst=ov[wy, :, wx0:wx0 + wpt, :, :].permute((1, 0, 2, 3)), src=o_sb)
  return out
