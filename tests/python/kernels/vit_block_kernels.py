"""Vision-transformer blocks in the Beta-1 dialect (``neuronxcc.nki``), written the way community Trainium ports of
ViT / DeiT / Swin write them (2-space indentation, ``nl.mgrid`` / ``nl.arange`` index expressions, value-returning
``nl`` / ``nisa`` calls, PSUM accumulation with ``+=``):

- ``patch_embed_b1(image, w, b, cls_token, pos_embed, patch)``: ViT patch embedding of one image [C, H, W]
  (C = 3, 224 x 224, patch 16 -> 14 x 14 = 196 tokens). The conv is one matmul over the im2col'd patches: the
  contraction index k = c * 256 + ky * 16 + kx (the host flattens the conv weight [D, C, 16, 16] to w [768, D]) is
  put on the partitions in chunks of 128 (one channel, 8 kernel rows of 16 pixels), each chunk's patches loaded
  straight from the image by one strided DMA per kernel row: ``image[c, (gy0 + g.x) * 16 + ky, g.y * 16 + g.p]``
  (kx on the partitions, patch row and patch column on the free axis) written to partitions ky * 16 .. ky * 16 + 15
  of the [128, tokens] patch tile (``pt[ky * 16 + g.p, g.x * gw + g.y]``). Tokens on the output partitions in
  tiles of whole patch rows (9 rows = 126 tokens, then 5 rows), 6 chunks accumulating in PSUM, + conv bias +
  position embedding row 1 + t; row 0 is the class token + pos_embed[0]. Output [197, D].
- ``swin_window_attention(q, k, v, rel_table, rel_index, num_heads, window, shift, roll)``: Swin-Transformer (shifted)
  window attention of a feature map [H, W, C] (q, k, v already projected, heads split along C). The cyclic roll by
  -shift along H and W and the window partition are both done by the loads: each window's [C, 7 * 7] tile
  (channels on the partitions, the window's tokens on the free axis) comes from up to 4 rectangular pieces of the
  map when the window wraps around the roll boundary (``roll="view"``), and the result goes back through the same
  pieces (window reverse + roll back). ``roll="dma"`` instead rolls the whole q / k / v maps into HBM scratch
  tensors first (4 HBM -> HBM DMAs each), takes plain windows of the rolled maps, and rolls the output back with 4
  more DMAs. Per window and head: scores q k^T * hd^-0.5 + the relative position bias (each head's column of the
  [(2 * 7 - 1)^2, heads] table broadcast to the 49 partitions and gathered by the static [49, 49] index map with
  ``nl.gather_flattened``, once per head for the whole kernel) + for shifted windows on the last window row/column
  the attention mask (-100 between tokens of different regions of the rolled map: region labels from ``nisa.iota``
  of the tokens' rolled coordinates, compared with their transpose), softmax, times v (v transposed on TensorE).
- ``layerscale_residual_b1(x, f, gamma)``: CaiT / DeiT-III LayerScale residual without stochastic depth,
  out = x + gamma * f, tokens on the partitions, gamma [1, D] broadcast over them.
  ``layerscale_residual_prenorm_b1(x, f, gamma, ln_w, ln_b, eps)``: the same fused with the next block's pre-norm
  LayerNorm (``nisa.bn_stats`` per chunk of at most 512 columns, ``nisa.bn_aggr``, ``nl.rsqrt``), ViT-B width 768 in
  2 chunks, masked ragged last tile of the 197 tokens; returns (residual, normed).

Written for nsim's tests in the style of those kernels; not copies of any file. No nsim imports.
"""
import math

import numpy as np

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl
from neuronxcc.nki.language import par_dim

PMAX = 128


@nki.jit
def patch_embed_b1(image, w, b, cls_token, pos_embed, patch=16):
  C, H, W = image.shape
  K, D = w.shape
  gh, gw = H // patch, W // patch
  T = gh * gw
  assert K == C * patch * patch and K % PMAX == 0 and D <= 512
  assert pos_embed.shape == (T + 1, D)
  kc_rows = PMAX // patch          # kernel rows per contraction chunk (8)
  n_chunks = K // PMAX             # 6
  chunks_per_c = patch // kc_rows  # 2
  rows_per_tile = PMAX // gw       # 9 patch rows = 126 tokens
  out = nl.ndarray((T + 1, D), dtype=image.dtype, buffer=nl.shared_hbm)

  i_p = nl.arange(PMAX)[:, None]
  i_d = nl.arange(D)[None, :]

  # the flattened conv weight, one [128, D] tile per contraction chunk, resident
  w_sb = nl.ndarray((n_chunks, par_dim(PMAX), D), dtype=w.dtype)
  for kc in nl.affine_range(n_chunks):
    w_sb[kc, i_p, i_d] = nl.load(w[kc * PMAX + i_p, i_d])
  bias = nl.load(b)  # [1, D]

  # class token row
  cls = nl.add(nl.load(cls_token), nl.load(pos_embed[0:1, :]), dtype=image.dtype)
  nl.store(out[0:1, :], value=cls)

  n_tiles = (gh + rows_per_tile - 1) // rows_per_tile
  for tt in nl.static_range(n_tiles):
    gy0 = tt * rows_per_tile
    nr = min(rows_per_tile, gh - gy0)
    ntok = nr * gw
    g = nl.mgrid[0:patch, 0:nr, 0:gw]
    i_t = nl.arange(ntok)[None, :]
    i_tp = nl.arange(ntok)[:, None]
    acc = nl.zeros((ntok, D), dtype=nl.float32, buffer=nl.psum)
    for kc in nl.static_range(n_chunks):
      c = kc // chunks_per_c
      ky0 = (kc % chunks_per_c) * kc_rows
      # im2col: partition ky * 16 + kx, free = token (patch row, patch column)
      pt = nl.ndarray((PMAX, ntok), dtype=image.dtype)
      for ky in nl.static_range(kc_rows):
        pt[ky * patch + g.p, g.x * gw + g.y] = nl.load(
            image[c, (gy0 + g.x) * patch + ky0 + ky, g.y * patch + g.p])
      acc += nisa.nc_matmul(pt[i_p, i_t], w_sb[kc])
    pos = nl.load(pos_embed[1 + gy0 * gw + i_tp, i_d])
    res = nl.add(nl.add(acc, bias), pos, dtype=image.dtype)
    nl.store(out[1 + gy0 * gw + i_tp, i_d], value=res)
  return out


def _pieces(w0, ws, shift, n):
  """The rectangular pieces of window coordinates [w0, w0 + ws) of the map rolled by -shift: (dst offset in the
  window, source start in the unrolled map, length)."""
  out = []
  r = 0
  while r < ws:
    src = (w0 + r + shift) % n
    ln = min(ws - r, n - src)
    out.append((r, src, ln))
    r += ln
  return out


def _load_window(dst, x, wy, wx, ws, shift, C):
  H, W, _ = x.shape
  for (dr, sr, nr) in _pieces(wy * ws, ws, shift, H):
    for (dc, sc, ncol) in _pieces(wx * ws, ws, shift, W):
      g = nl.mgrid[0:C, 0:nr, 0:ncol]
      dst[g.p, (dr + g.x) * ws + dc + g.y] = nl.load(x[sr + g.x, sc + g.y, g.p])


def _store_window(out, src, wy, wx, ws, shift, C):
  H, W, _ = out.shape
  for (dr, sr, nr) in _pieces(wy * ws, ws, shift, H):
    for (dc, sc, ncol) in _pieces(wx * ws, ws, shift, W):
      g = nl.mgrid[0:C, 0:nr, 0:ncol]
      nl.store(out[sr + g.x, sc + g.y, g.p], value=src[g.p, (dr + g.x) * ws + dc + g.y])


def _roll_hbm(dst, src, shift, back=False):
  """dst = roll(src, -shift) along H and W (back: roll(src, +shift)), by 4 HBM -> HBM DMAs."""
  H, W, _ = src.shape
  s = shift
  for (a0, a1, b0) in ((0, H - s, s), (H - s, H, 0)):
    for (c0, c1, d0) in ((0, W - s, s), (W - s, W, 0)):
      if back:
        nisa.dma_copy(dst=dst[b0:b0 + a1 - a0, d0:d0 + c1 - c0, :], src=src[a0:a1, c0:c1, :])
      else:
        nisa.dma_copy(dst=dst[a0:a1, c0:c1, :], src=src[b0:b0 + a1 - a0, d0:d0 + c1 - c0, :])


@nki.jit
def swin_window_attention(q, k, v, rel_table, rel_index, num_heads, window=7, shift=0, roll="view"):
  H, W, C = q.shape
  ws = window
  N = ws * ws
  nh = num_heads
  hd = C // nh
  assert H % ws == 0 and W % ws == 0 and C <= PMAX and hd * nh == C
  assert rel_table.shape == ((2 * ws - 1) * (2 * ws - 1), nh) and rel_index.shape == (N, N)
  nwy, nwx = H // ws, W // ws
  scale = 1.0 / math.sqrt(hd)
  out = nl.ndarray((H, W, C), dtype=q.dtype, buffer=nl.shared_hbm)
  NB = rel_table.shape[0]

  i_n = nl.arange(N)[:, None]
  i_b = nl.arange(NB)[None, :]

  # relative position bias of every head, [N, N] each, gathered once by the static index map
  idx = nl.load(rel_index, dtype=nl.uint32)
  tabT = nl.load_transpose2d(rel_table)  # [nh, NB]
  bias = nl.ndarray((nh, par_dim(N), N), dtype=nl.float32)
  for h in nl.affine_range(nh):
    tab_h = nl.ndarray((par_dim(N), NB), dtype=nl.float32)
    tab_h[i_n, i_b] = tabT[h:h + 1, :].broadcast_to((N, NB))
    bias[h] = nl.gather_flattened(tab_h, idx)

  src_q, src_k, src_v, dst = q, k, v, out
  view_shift = shift
  if shift > 0 and roll == "dma":
    src_q = nl.ndarray((H, W, C), dtype=q.dtype, buffer=nl.hbm)
    src_k = nl.ndarray((H, W, C), dtype=k.dtype, buffer=nl.hbm)
    src_v = nl.ndarray((H, W, C), dtype=v.dtype, buffer=nl.hbm)
    dst = nl.ndarray((H, W, C), dtype=q.dtype, buffer=nl.hbm)
    _roll_hbm(src_q, q, shift)
    _roll_hbm(src_k, k, shift)
    _roll_hbm(src_v, v, shift)
    view_shift = 0

  for wy in nl.static_range(nwy):
    for wx in nl.static_range(nwx):
      masked = shift > 0 and (wy == nwy - 1 or wx == nwx - 1)
      if masked:
        # region label of each token of the rolled map: 3 * row region + column region, regions split at
        # H - ws and H - shift (W likewise); labF[i, j] = label of token j, labP[i, j] = label of token i
        gm = nl.mgrid[0:N, 0:ws, 0:ws]
        yy = nisa.iota(wy * ws + gm.x + 0 * gm.p + 0 * gm.y, dtype=nl.float32)
        xx = nisa.iota(wx * ws + gm.y + 0 * gm.p + 0 * gm.x, dtype=nl.float32)
        ry = nl.add(nl.greater_equal(yy, float(H - ws), dtype=nl.float32),
                    nl.greater_equal(yy, float(H - shift), dtype=nl.float32))
        rx = nl.add(nl.greater_equal(xx, float(W - ws), dtype=nl.float32),
                    nl.greater_equal(xx, float(W - shift), dtype=nl.float32))
        lab3 = nl.add(nl.multiply(ry, 3.0), rx)
        labF = lab3.reshape((N, N))
        labP = nl.copy(nisa.nc_transpose(labF), dtype=nl.float32)
        amask = nl.multiply(nl.not_equal(labF, labP, dtype=nl.float32), -100.0)

      qt = nl.ndarray((C, N), dtype=q.dtype)
      kt = nl.ndarray((C, N), dtype=k.dtype)
      vt = nl.ndarray((C, N), dtype=v.dtype)
      _load_window(qt, src_q, wy, wx, ws, view_shift, C)
      _load_window(kt, src_k, wy, wx, ws, view_shift, C)
      _load_window(vt, src_v, wy, wx, ws, view_shift, C)

      ot = nl.ndarray((C, N), dtype=q.dtype)
      for h in nl.static_range(nh):
        s_ps = nisa.nc_matmul(qt[h * hd:(h + 1) * hd, :], kt[h * hd:(h + 1) * hd, :])
        s = nl.add(nl.multiply(s_ps, scale), bias[h], dtype=nl.float32)
        if masked:
          s = nl.add(s, amask)
        mx = nl.max(s, axis=[1], keepdims=True)
        p = nl.exp(nl.subtract(s, mx))
        ssum = nl.sum(p, axis=[1], keepdims=True)
        p = nl.multiply(p, nl.reciprocal(ssum), dtype=v.dtype)
        pT = nl.copy(nisa.nc_transpose(p), dtype=v.dtype)
        v_h = nl.copy(nisa.nc_transpose(vt[h * hd:(h + 1) * hd, :]), dtype=v.dtype)   # [N, hd]
        o_ps = nisa.nc_matmul(v_h, pT)                                             # [hd, N] = (p v)^T
        ot[h * hd:(h + 1) * hd, :] = nl.copy(o_ps, dtype=q.dtype)
      _store_window(dst, ot, wy, wx, ws, view_shift, C)

  if shift > 0 and roll == "dma":
    _roll_hbm(out, dst, shift, back=True)
  return out


@nki.jit
def layerscale_residual_b1(x, f, gamma):
  N, D = x.shape
  out = nl.ndarray((N, D), dtype=x.dtype, buffer=nl.shared_hbm)
  i_p = nl.arange(PMAX)[:, None]
  i_d = nl.arange(D)[None, :]
  g = nl.load(gamma, dtype=nl.float32)  # [1, D]
  for t in nl.affine_range((N + PMAX - 1) // PMAX):
    valid = t * PMAX + i_p < N
    xt = nl.load(x[t * PMAX + i_p, i_d], mask=valid)
    ft = nl.load(f[t * PMAX + i_p, i_d], mask=valid)
    res = nl.add(xt, nl.multiply(ft, g, mask=valid), mask=valid, dtype=x.dtype)
    nl.store(out[t * PMAX + i_p, i_d], value=res, mask=valid)
  return out


@nki.jit
def layerscale_residual_prenorm_b1(x, f, gamma, ln_w, ln_b, eps=1e-6):
  """The residual of a ViT block with LayerScale, fused with the next block's pre-norm: res = x + gamma * f and
  LayerNorm(res) (ln_w, ln_b [1, D]) from ``nisa.bn_stats`` over chunks of at most 512 columns and ``nisa.bn_aggr``
  (D = 768 -> 2 chunks of 384), tokens on the partitions, masked ragged last tile (197 tokens). Returns (res, normed)."""
  N, D = x.shape
  fmax = nl.tile_size.bn_stats_fmax
  n_ch = (D + fmax - 1) // fmax
  assert D % n_ch == 0
  chunk = D // n_ch
  res_out = nl.ndarray((N, D), dtype=x.dtype, buffer=nl.shared_hbm)
  norm_out = nl.ndarray((N, D), dtype=x.dtype, buffer=nl.shared_hbm)
  i_p = nl.arange(PMAX)[:, None]
  i_d = nl.arange(D)[None, :]
  i_c = nl.arange(chunk)[None, :]
  g = nl.load(gamma, dtype=nl.float32)
  w_ln = nl.load(ln_w, dtype=nl.float32)
  b_ln = nl.load(ln_b, dtype=nl.float32)
  for t in nl.affine_range((N + PMAX - 1) // PMAX):
    valid = t * PMAX + i_p < N
    xt = nl.load(x[t * PMAX + i_p, i_d], mask=valid)
    ft = nl.load(f[t * PMAX + i_p, i_d], mask=valid)
    res = nl.add(xt, nl.multiply(ft, g, mask=valid), mask=valid, dtype=nl.float32)
    nl.store(res_out[t * PMAX + i_p, i_d], value=res, mask=valid)
    stats = nl.ndarray((PMAX, n_ch * 6), dtype=nl.float32)
    for c in nl.affine_range(n_ch):
      stats[i_p, c * 6 + nl.arange(6)[None, :]] = nisa.bn_stats(res[i_p, c * chunk + i_c], mask=valid)
    mv = nisa.bn_aggr(stats, mask=valid)
    mean = mv[i_p, 0]
    rstd = nl.rsqrt(nl.add(mv[i_p, 1], eps, mask=valid), mask=valid)
    y = nisa.tensor_scalar(res, np.subtract, mean, op1=np.multiply, operand1=rstd, mask=valid)
    y = nl.add(nl.multiply(y, w_ln, mask=valid), b_ln, mask=valid, dtype=x.dtype)
    nl.store(norm_out[t * PMAX + i_p, i_d], value=y, mask=valid)
  return res_out, norm_out
