"""Diffusion UNet block kernels (Stable Diffusion / SDXL UNet and VAE) in the Beta-1 dialect (``neuronxcc.nki``),
written the way community Trainium ports of those blocks are (arange/mgrid index expressions, value-returning
``nl`` / ``nisa`` calls, ``par_dim`` block tiles, 2-space indentation):

- ``groupnorm_silu_b1(x, gamma, beta, eps, groups)``: GroupNorm (32 groups) + SiLU of x [N, C, H, W], channels on
  the partitions in group-aligned channel tiles (``(128 // gs) * gs`` channels, gs = C / groups). Per-partition
  sum and sum of squares accumulated over the pixels in tiles of 512 (``nl.sum``, ``nisa.activation_reduce``);
  the group totals by a matmul with the [ct, ct] group-indicator matrix M^T M, M [groups in tile, ct] the
  group membership built by two ``nisa.affine_select`` (g gs <= c < (g + 1) gs), so every partition of a group
  receives the group's sums; mean, var = E[x^2] - mean^2, rstd = rsqrt(var + eps); one
  ``nisa.activation(op=nl.silu)`` per pixel tile with the per-partition scale gamma rstd and bias
  beta - mean gamma rstd.
- ``groupnorm_silu_tokens_b1(x, gamma, beta, eps, groups)``: the same GroupNorm + SiLU in the token layout
  x [N, S, C] of a UNet transformer block (pixels on the partitions, channels on the free axis, S ragged): the
  per-partition group sums of the [128, G, gs] view (``nl.sum`` over the last axis) accumulated over the pixel
  tiles, the totals over the partitions by ``nisa.tensor_partition_reduce``, and the [1, G, gs] scale / bias
  broadcast over the partitions by the value API (``nl.multiply`` / ``nl.add`` / ``nl.silu``).
- ``upsample_bilinear2x_b1(x)``: bilinear 2x upsampling (align_corners=False, as torch / diffusers' VAE decoder
  without conv) of x [N, C, H, W]: out[2i] = 0.25 x[i - 1] + 0.75 x[i], out[2i + 1] = 0.75 x[i] + 0.25 x[i + 1],
  edges clamped, separably over rows then columns. The input tile is edge-padded on chip; each output parity is a
  weighted neighbour sum written into the strided positions ``2 * i_h + a`` / ``2 * i_w + b`` of the output tile
  by an index expression; one store per channel tile.
- ``conv3x3_b1(x, w, bias)`` and the helper ``_conv3x3_tile``: 3x3 convolution, padding 1, weights [Cin, 3, 3,
  Cout], as 9 shifted matmuls per Cin tile ``ps += nisa.nc_matmul(w[tap], xp[i_p, r0 + kh + i_r, kw + i_w])`` on a
  zero-padded SBUF tile, accumulating in a PSUM tile of <= 512 pixels.
- ``upsample_nearest2x_b1(x, on_chip)``: nearest 2x upsampling, the output expanded in SBUF by four copies through
  stride-2 index expressions ``o[i_p, 2 * i_h + a, 2 * i_w + b]`` and stored once (``on_chip=False``: four stores
  straight into the strided HBM positions).
- ``cross_attention_b1(q, k, v, x)``: cross-attention of the image tokens to the 77 text tokens (token-major q, k,
  v [Hh, S, d] as the projections produce them, loaded transposed by index expressions), softmax by
  ``nl.max`` and one ``nisa.activation_reduce(exp)``, the probabilities transposed by ``nisa.nc_transpose``
  ([128, 77] -> [77, 128]), p v by ``nl.matmul(transpose_x=True)``, the residual added.
- ``sd_self_attention_b1[Hh](q, k, v, x)``: spatial self-attention of a UNet transformer block in the shape of
  the nki-samples SD attention tutorial: an SPMD grid of one program per head (``nl.program_id(0)``), the full
  [128, S] score row of a query tile in SBUF (S up to 4096 tokens, key blocks of 512, the last one ragged), one
  ``nl.max`` and one ``activation_reduce(exp)`` over it, then per 128-key tile a ``nisa.nc_transpose`` of the
  probabilities and ``o += nisa.nc_matmul(eT, v_tile)`` in PSUM; normalised and added to the residual.
- ``conv3x3_nl_b1(x, w, bias)``: the same convolution in the tutorial style (Cin, Cout <= 128): ``nl.ds`` slices
  of a zero-padded [Cin, H + 2, W + 2] tile as the moving operand of ``ps += nl.matmul(w_tap, window,
  transpose_x=True)``.
- ``resblock_tail_b1(x, temb, gn1_g, gn1_b, w1, b1, gn2_g, gn2_b, w2, b2, eps)``: the timestep-conditioned
  ResBlock of the SD UNet with Cin = Cout = C: h = conv1(silu(gn1(x))) + b1 + temb[n] (the projected time
  embedding, one value per channel, broadcast over the pixels by folding it into the PSUM eviction bias);
  out = x + conv2(silu(gn2(h))) + b2. The activations stay on chip in zero-padded [ct, H + 2, W + 2] tiles.

Written for nsim's tests in the style of those kernels; not copies of any file. No nsim imports.
"""
import numpy as np

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl

PMAX = 128
FTILE = 512


def _group_tile(C, groups):
  gs = C // groups
  assert C % groups == 0 and gs <= PMAX
  ct = (PMAX // gs) * gs
  return gs, ct, (C + ct - 1) // ct


def _group_indicator(ct, gs):
  """[ct, ct] fp32 in PSUM-evicted SBUF: 1 where channels p and q of the tile are in the same group."""
  ng = ct // gs
  i_g = nl.arange(ng)[:, None]
  i_c = nl.arange(ct)[None, :]
  ones = nl.ones((ng, ct), dtype=nl.float32)
  lo = nisa.affine_select(i_c - i_g * gs >= 0, ones, 0.0)
  memb = nisa.affine_select((i_g + 1) * gs - 1 - i_c >= 0, lo, 0.0)
  gm = nisa.nc_matmul(memb, memb)
  return nl.copy(gm, dtype=nl.float32)


def _gn_scale_bias(sums, gmat, gam, bet, cs, count, eps):
  """sums [cs, 2] = (sum x, sum x^2) per channel -> per-channel (scale, bias) [cs, 1] of the fused GroupNorm affine."""
  i_c = nl.arange(cs)[:, None]
  j_c = nl.arange(cs)[None, :]
  tot = nisa.nc_matmul(gmat[i_c, j_c], sums[i_c, nl.arange(2)[None, :]])
  mean = nl.multiply(tot[i_c, 0], 1.0 / count)
  ex2 = nl.multiply(tot[i_c, 1], 1.0 / count)
  var = nl.subtract(ex2, nl.multiply(mean, mean))
  rstd = nl.rsqrt(nl.add(var, eps))
  scl = nl.multiply(rstd, gam[i_c, 0])
  bia = nl.subtract(bet[i_c, 0], nl.multiply(mean, scl))
  return scl, bia


def _channel_sums(xt, cs, HW):
  """(sum x, sum x^2) over the pixels of each partition, accumulated over pixel tiles of 512."""
  i_p = nl.arange(PMAX)[:, None]
  i_f = nl.arange(FTILE)[None, :]
  sums = nl.zeros((PMAX, 2), dtype=nl.float32)
  for f in nl.sequential_range((HW + FTILE - 1) // FTILE):
    valid = (i_p < cs) & (f * FTILE + i_f < HW)
    chunk = xt[i_p, f * FTILE + i_f]
    s1 = nl.sum(chunk, axis=[1], dtype=nl.float32, mask=valid, keepdims=True)
    s2 = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    sq = nisa.activation_reduce(op=nl.square, data=chunk, reduce_op=nl.add, reduce_res=s2, mask=valid,
                                dtype=nl.float32)
    sums[i_p, 0] = nl.add(sums[i_p, 0], s1, mask=(i_p < cs))
    sums[i_p, 1] = nl.add(sums[i_p, 1], s2, mask=(i_p < cs))
  return sums


@nki.jit
def groupnorm_silu_b1(x, gamma, beta, eps=1e-5, groups=32):
  N, C, H, W = x.shape
  HW = H * W
  gs, CT, NCT = _group_tile(C, groups)
  out = nl.ndarray((N, C, H, W), dtype=x.dtype, buffer=nl.shared_hbm)
  xf = x.reshape((N, C, HW))
  of = out.reshape((N, C, HW))
  g2 = gamma.reshape((C, 1))
  b2 = beta.reshape((C, 1))
  i_p = nl.arange(PMAX)[:, None]
  i_hw = nl.arange(HW)[None, :]
  i_f = nl.arange(FTILE)[None, :]
  i_0 = nl.arange(1)[None, :]
  gmat = _group_indicator(CT, gs)

  for n in nl.affine_range(N):
    for t in nl.affine_range(NCT):
      c0 = t * CT
      cs = min(CT, C - c0)
      gam = nl.load(g2[c0 + i_p, i_0], mask=(i_p < cs), dtype=nl.float32)
      bet = nl.load(b2[c0 + i_p, i_0], mask=(i_p < cs), dtype=nl.float32)
      xt = nl.load(xf[n, c0 + i_p, i_hw], mask=(i_p < cs))
      sums = _channel_sums(xt, cs, HW)
      scl, bia = _gn_scale_bias(sums, gmat, gam, bet, cs, gs * HW, eps)
      i_c = nl.arange(cs)[:, None]
      for f in nl.affine_range((HW + FTILE - 1) // FTILE):
        valid = f * FTILE + i_f < HW
        y = nisa.activation(op=nl.silu, data=xt[i_c, f * FTILE + i_f], scale=scl, bias=bia, mask=valid,
                            dtype=x.dtype)
        nl.store(of[n, c0 + i_c, f * FTILE + i_f], value=y, mask=valid)
  return out


@nki.jit
def upsample_bilinear2x_b1(x):
  N, C, H, W = x.shape
  out = nl.ndarray((N, C, 2 * H, 2 * W), dtype=x.dtype, buffer=nl.shared_hbm)
  i_p = nl.arange(PMAX)[:, None, None]
  i_h = nl.arange(H)[None, :, None]
  i_w = nl.arange(W)[None, None, :]
  i_h2 = nl.arange(2 * H)[None, :, None]
  i_0 = nl.arange(1)[None, :, None]
  i_1 = nl.arange(1)[None, None, :]
  for n in nl.affine_range(N):
    for t in nl.affine_range((C + PMAX - 1) // PMAX):
      c0 = t * PMAX
      cs = min(PMAX, C - c0)
      cm = i_p < cs
      # rows edge-padded: xp[:, 0] = x[:, 0], xp[:, H + 1] = x[:, H - 1]
      xp = nl.ndarray((PMAX, H + 2, W), dtype=nl.float32, buffer=nl.sbuf)
      xp[i_p, 1 + i_h, i_w] = nl.load(x[n, c0 + i_p, i_h, i_w], mask=cm)
      xp[i_p, i_0, i_w] = nl.copy(xp[i_p, 1 + i_0, i_w], mask=cm)
      xp[i_p, H + 1 + i_0, i_w] = nl.copy(xp[i_p, H + i_0, i_w], mask=cm)
      # row pass into the column-padded tile r [C, 2H, W + 2]
      r = nl.ndarray((PMAX, 2 * H, W + 2), dtype=nl.float32, buffer=nl.sbuf)
      r[i_p, 2 * i_h, 1 + i_w] = nl.add(nl.multiply(xp[i_p, i_h, i_w], 0.25, mask=cm),
                                        nl.multiply(xp[i_p, 1 + i_h, i_w], 0.75, mask=cm), mask=cm)
      r[i_p, 2 * i_h + 1, 1 + i_w] = nl.add(nl.multiply(xp[i_p, 1 + i_h, i_w], 0.75, mask=cm),
                                            nl.multiply(xp[i_p, 2 + i_h, i_w], 0.25, mask=cm), mask=cm)
      r[i_p, i_h2, i_1] = nl.copy(r[i_p, i_h2, 1 + i_1], mask=cm)
      r[i_p, i_h2, W + 1 + i_1] = nl.copy(r[i_p, i_h2, W + i_1], mask=cm)
      # column pass into the output tile [C, 2H, 2W]
      o = nl.ndarray((PMAX, 2 * H, 2 * W), dtype=x.dtype, buffer=nl.sbuf)
      o[i_p, i_h2, 2 * i_w] = nl.add(nl.multiply(r[i_p, i_h2, i_w], 0.25, mask=cm),
                                     nl.multiply(r[i_p, i_h2, 1 + i_w], 0.75, mask=cm), mask=cm)
      o[i_p, i_h2, 2 * i_w + 1] = nl.add(nl.multiply(r[i_p, i_h2, 1 + i_w], 0.75, mask=cm),
                                         nl.multiply(r[i_p, i_h2, 2 + i_w], 0.25, mask=cm), mask=cm)
      i_o = nl.arange(2 * W)[None, None, :]
      nl.store(out[n, c0 + i_p, i_h2, i_o], value=o, mask=cm)
  return out


def _load_weights(w, C_in, C_out, ct_in):
  """w [Cin, 3, 3, Cout] -> per Cin tile a [ct_in, 9, Cout] SBUF tile (block dim = Cin tile)."""
  nkt = (C_in + ct_in - 1) // ct_in
  i_p = nl.arange(PMAX)[:, None, None]
  i_t = nl.arange(9)[None, :, None]
  i_o = nl.arange(C_out)[None, None, :]
  wf = w.reshape((C_in, 9, C_out))
  wt = nl.ndarray((nkt, nl.par_dim(PMAX), 9, C_out), dtype=w.dtype, buffer=nl.sbuf)
  for kt in nl.affine_range(nkt):
    k0 = kt * ct_in
    wt[kt, i_p, i_t, i_o] = nl.load(wf[k0 + i_p, i_t, i_o], mask=(i_p < min(ct_in, C_in - k0)))
  return wt


def _conv3x3_tile(xp, wt, C_in, ct_in, m0, ms, H, W, bias_vec, dst, dst_dtype):
  """dst[:ms, r, c] = bias + sum over taps and Cin tiles of w^T xp (dst a [PMAX, H, W] tile)."""
  nkt = (C_in + ct_in - 1) // ct_in
  R = max(1, FTILE // W)
  i_m = nl.arange(ms)[None, :]
  i_mo = nl.arange(ms)[:, None, None]
  i_mb = nl.arange(ms)[:, None]
  i_w = nl.arange(W)[None, None, :]
  for rb in nl.affine_range((H + R - 1) // R):
    r0 = rb * R
    rr = min(R, H - r0)
    i_r = nl.arange(rr)[None, :, None]
    ps = nl.zeros((PMAX, rr, W), dtype=nl.float32, buffer=nl.psum)
    for kt in nl.affine_range(nkt):
      ks = min(ct_in, C_in - kt * ct_in)
      i_k = nl.arange(ks)[:, None]
      i_k3 = nl.arange(ks)[:, None, None]
      for tap in nl.static_range(9):
        kh = tap // 3
        kw = tap % 3
        ps[i_mo, i_r, i_w] += nisa.nc_matmul(wt[kt, i_k, tap, m0 + i_m], xp[kt, i_k3, r0 + kh + i_r, kw + i_w])
    dst[i_mo, r0 + i_r, i_w] = nisa.activation(op=nl.copy, data=ps[i_mo, i_r, i_w], bias=bias_vec[i_mb, 0],
                                               dtype=dst_dtype)


@nki.jit
def conv3x3_b1(x, w, bias):
  N, Cin, H, W = x.shape
  _, _, _, Cout = w.shape
  out = nl.ndarray((N, Cout, H, W), dtype=x.dtype, buffer=nl.shared_hbm)
  nkt = (Cin + PMAX - 1) // PMAX
  i_p = nl.arange(PMAX)[:, None, None]
  i_h = nl.arange(H)[None, :, None]
  i_w = nl.arange(W)[None, None, :]
  i_0 = nl.arange(1)[None, :]
  i_q = nl.arange(PMAX)[:, None]
  b2 = bias.reshape((Cout, 1))
  wt = _load_weights(w, Cin, Cout, PMAX)
  for n in nl.affine_range(N):
    xp = nl.zeros((nkt, nl.par_dim(PMAX), H + 2, W + 2), dtype=x.dtype, buffer=nl.sbuf)
    for kt in nl.affine_range(nkt):
      k0 = kt * PMAX
      xp[kt, i_p, 1 + i_h, 1 + i_w] = nl.load(x[n, k0 + i_p, i_h, i_w], mask=(i_p < min(PMAX, Cin - k0)))
    for mt in nl.affine_range((Cout + PMAX - 1) // PMAX):
      m0 = mt * PMAX
      ms = min(PMAX, Cout - m0)
      bv = nl.load(b2[m0 + i_q, i_0], mask=(i_q < ms), dtype=nl.float32)
      ot = nl.ndarray((PMAX, H, W), dtype=x.dtype, buffer=nl.sbuf)
      _conv3x3_tile(xp, wt, Cin, PMAX, m0, ms, H, W, bv, ot, x.dtype)
      nl.store(out[n, m0 + i_p, i_h, i_w], value=ot, mask=(i_p < ms))
  return out


def _gn_silu_into_padded(src, C, CT, NCT, gs, H, W, gmat, g2, b2, eps, dst, dtype):
  """GroupNorm + SiLU of the activation ``src(t, i_p, i_h, i_w)`` (channel tile t, [ct, H, W]) into the interior
  of the zero-padded tile dst [NCT][ct, H + 2, W + 2]."""
  HW = H * W
  i_p = nl.arange(PMAX)[:, None]
  i_0 = nl.arange(1)[None, :]
  i_p3 = nl.arange(PMAX)[:, None, None]
  i_h = nl.arange(H)[None, :, None]
  i_w = nl.arange(W)[None, None, :]
  for t in nl.affine_range(NCT):
    c0 = t * CT
    cs = min(CT, C - c0)
    gam = nl.load(g2[c0 + i_p, i_0], mask=(i_p < cs), dtype=nl.float32)
    bet = nl.load(b2[c0 + i_p, i_0], mask=(i_p < cs), dtype=nl.float32)
    flat = nl.ndarray((PMAX, HW), dtype=nl.float32, buffer=nl.sbuf)
    flat[i_p3, i_h * W + i_w] = nl.copy(src(t, i_p3, i_h, i_w), mask=(i_p3 < cs))
    sums = _channel_sums(flat, cs, HW)
    scl, bia = _gn_scale_bias(sums, gmat, gam, bet, cs, gs * HW, eps)
    i_c = nl.arange(cs)[:, None, None]
    dst[t, i_c, 1 + i_h, 1 + i_w] = nisa.activation(op=nl.silu, data=flat[i_c, i_h * W + i_w], scale=scl,
                                                    bias=bia, dtype=dtype)


@nki.jit
def resblock_tail_b1(x, temb, gn1_g, gn1_b, w1, b1, gn2_g, gn2_b, w2, b2, eps=1e-5, groups=32):
  N, C, H, W = x.shape
  gs, CT, NCT = _group_tile(C, groups)
  out = nl.ndarray((N, C, H, W), dtype=x.dtype, buffer=nl.shared_hbm)
  i_p = nl.arange(PMAX)[:, None]
  i_0 = nl.arange(1)[None, :]
  i_p3 = nl.arange(PMAX)[:, None, None]
  i_h = nl.arange(H)[None, :, None]
  i_w = nl.arange(W)[None, None, :]
  gmat = _group_indicator(CT, gs)
  wt1 = _load_weights(w1, C, C, CT)
  wt2 = _load_weights(w2, C, C, CT)
  g1 = gn1_g.reshape((C, 1))
  be1 = gn1_b.reshape((C, 1))
  g2 = gn2_g.reshape((C, 1))
  be2 = gn2_b.reshape((C, 1))
  cb1 = b1.reshape((C, 1))
  cb2 = b2.reshape((C, 1))
  tT = temb.reshape((N, C, 1))

  for n in nl.affine_range(N):
    xs = nl.ndarray((NCT, nl.par_dim(PMAX), H, W), dtype=x.dtype, buffer=nl.sbuf)
    for t in nl.affine_range(NCT):
      xs[t, i_p3, i_h, i_w] = nl.load(x[n, t * CT + i_p3, i_h, i_w], mask=(i_p3 < min(CT, C - t * CT)))

    a1 = nl.zeros((NCT, nl.par_dim(PMAX), H + 2, W + 2), dtype=x.dtype, buffer=nl.sbuf)
    _gn_silu_into_padded(lambda t, p, h, w: xs[t, p, h, w], C, CT, NCT, gs, H, W, gmat, g1, be1, eps, a1,
                         x.dtype)

    # conv1 + b1 + temb[n] (one bias per output channel, broadcast over the pixels on eviction)
    h1 = nl.ndarray((NCT, nl.par_dim(PMAX), H, W), dtype=nl.float32, buffer=nl.sbuf)
    for mt in nl.affine_range(NCT):
      m0 = mt * CT
      ms = min(CT, C - m0)
      bv = nl.add(nl.load(cb1[m0 + i_p, i_0], mask=(i_p < ms), dtype=nl.float32),
                  nl.load(tT[n, m0 + i_p, i_0], mask=(i_p < ms), dtype=nl.float32), mask=(i_p < ms))
      _conv3x3_tile(a1, wt1, C, CT, m0, ms, H, W, bv, h1[mt], nl.float32)

    a2 = nl.zeros((NCT, nl.par_dim(PMAX), H + 2, W + 2), dtype=x.dtype, buffer=nl.sbuf)
    _gn_silu_into_padded(lambda t, p, h, w: h1[t, p, h, w], C, CT, NCT, gs, H, W, gmat, g2, be2, eps, a2,
                         x.dtype)

    for mt in nl.affine_range(NCT):
      m0 = mt * CT
      ms = min(CT, C - m0)
      bv = nl.load(cb2[m0 + i_p, i_0], mask=(i_p < ms), dtype=nl.float32)
      h2 = nl.ndarray((PMAX, H, W), dtype=nl.float32, buffer=nl.sbuf)
      _conv3x3_tile(a2, wt2, C, CT, m0, ms, H, W, bv, h2, nl.float32)
      y = nl.add(h2, xs[mt], mask=(i_p3 < ms), dtype=x.dtype)
      nl.store(out[n, m0 + i_p3, i_h, i_w], value=y, mask=(i_p3 < ms))
  return out


@nki.jit
def upsample_nearest2x_b1(x, on_chip=True):
  N, C, H, W = x.shape
  out = nl.ndarray((N, C, 2 * H, 2 * W), dtype=x.dtype, buffer=nl.shared_hbm)
  i_p = nl.arange(PMAX)[:, None, None]
  i_h = nl.arange(H)[None, :, None]
  i_w = nl.arange(W)[None, None, :]
  i_h2 = nl.arange(2 * H)[None, :, None]
  i_w2 = nl.arange(2 * W)[None, None, :]
  for n in nl.affine_range(N):
    for t in nl.affine_range((C + PMAX - 1) // PMAX):
      c0 = t * PMAX
      cm = i_p < min(PMAX, C - c0)
      xt = nl.load(x[n, c0 + i_p, i_h, i_w], mask=cm)
      if on_chip:
        # expand in SBUF through stride-2 index expressions, then one contiguous store
        o = nl.ndarray((PMAX, 2 * H, 2 * W), dtype=x.dtype, buffer=nl.sbuf)
        for a in nl.static_range(2):
          for b in nl.static_range(2):
            o[i_p, 2 * i_h + a, 2 * i_w + b] = nl.copy(xt, mask=cm)
        nl.store(out[n, c0 + i_p, i_h2, i_w2], value=o, mask=cm)
      else:
        # four stores straight into the strided output positions
        for a in nl.static_range(2):
          for b in nl.static_range(2):
            nl.store(out[n, c0 + i_p, 2 * i_h + a, 2 * i_w + b], value=xt, mask=cm)
  return out


@nki.jit
def cross_attention_b1(q, k, v, x):
  """q [Hh, Sq, d], k / v [Hh, Sk, d] (token-major, as the torch projections produce them; Sk <= 128, the 77 text
  tokens), x [Sq, Hh * d]: out = x + concat_h softmax(q k^T / sqrt(d)) v."""
  Hh, Sq, d = q.shape
  _, Sk, _ = k.shape
  assert Sq % PMAX == 0 and Sk <= PMAX and d <= PMAX
  scale = 1.0 / (d ** 0.5)
  out = nl.ndarray((Sq, Hh * d), dtype=x.dtype, buffer=nl.shared_hbm)
  i_dp = nl.arange(d)[:, None]
  i_qf = nl.arange(PMAX)[None, :]
  i_kf = nl.arange(Sk)[None, :]
  i_kp = nl.arange(Sk)[:, None]
  i_p = nl.arange(PMAX)[:, None]
  i_df = nl.arange(d)[None, :]
  for h in nl.affine_range(Hh):
    # keys transposed by the load (d on the partitions), values as they are
    kT = nl.load(k[h, i_kf, i_dp])
    vt = nl.load(v[h, i_kp, i_df])
    for qi in nl.affine_range(Sq // PMAX):
      q0 = qi * PMAX
      qT = nl.load(q[h, q0 + i_qf, i_dp])
      s = nl.matmul(qT, kT, transpose_x=True)
      mx = nl.max(s, axis=[1], keepdims=True)
      nmx = nl.multiply(mx, -scale)
      ssum = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
      e = nisa.activation_reduce(op=nl.exp, data=s, reduce_op=nl.add, reduce_res=ssum, bias=nmx, scale=scale,
                                 dtype=q.dtype)
      eT = nisa.nc_transpose(e)
      eTs = nl.copy(eT, dtype=q.dtype)
      o = nl.matmul(eTs, vt, transpose_x=True)
      rs = nl.reciprocal(ssum)
      xt = nl.load(x[q0 + i_p, h * d + i_df])
      y = nl.add(nl.multiply(o, rs), xt, dtype=x.dtype)
      nl.store(out[q0 + i_p, h * d + i_df], value=y)
  return out


@nki.jit
def groupnorm_silu_tokens_b1(x, gamma, beta, eps=1e-5, groups=32):
  """x [N, S, C] (the token layout of a UNet transformer block: pixels on the partitions, channels on the free
  axis)."""
  N, S, C = x.shape
  G = groups
  gs = C // G
  assert C % G == 0 and C <= 4096
  NT = (S + PMAX - 1) // PMAX
  out = nl.ndarray((N, S, C), dtype=x.dtype, buffer=nl.shared_hbm)
  i_p = nl.arange(PMAX)[:, None]
  i_c = nl.arange(C)[None, :]
  i_0 = nl.arange(1)[:, None]
  i_g = nl.arange(G)[None, :]
  gam = nl.load(gamma.reshape((1, C))[i_0, i_c], dtype=nl.float32).reshape((1, G, gs))
  bet = nl.load(beta.reshape((1, C))[i_0, i_c], dtype=nl.float32).reshape((1, G, gs))
  for n in nl.affine_range(N):
    xs = nl.ndarray((NT, nl.par_dim(PMAX), C), dtype=x.dtype, buffer=nl.sbuf)
    acc = nl.zeros((PMAX, 2 * G), dtype=nl.float32)
    for t in nl.sequential_range(NT):
      valid = t * PMAX + i_p < S
      xs[t, i_p, i_c] = nl.load(x[n, t * PMAX + i_p, i_c], mask=valid)
      x3 = xs[t].reshape((PMAX, G, gs))
      acc[i_p, i_g] = nl.add(acc[i_p, i_g], nl.sum(x3, axis=[2], dtype=nl.float32, mask=valid), mask=valid)
      acc[i_p, G + i_g] = nl.add(acc[i_p, G + i_g], nl.sum(nl.square(x3, dtype=nl.float32, mask=valid), axis=[2],
                                                         mask=valid), mask=valid)
    # totals over all pixels (the partitions): one row [1, 2G]
    tot = nisa.tensor_partition_reduce(np.add, acc)
    cnt = float(S * gs)
    mean = nl.multiply(tot[i_0, i_g], 1.0 / cnt)
    var = nl.subtract(nl.multiply(tot[i_0, G + i_g], 1.0 / cnt), nl.multiply(mean, mean))
    rstd = nl.rsqrt(nl.add(var, eps))
    scl = nl.multiply(gam, rstd)                       # [1, G, gs] * [1, G]
    bia = nl.subtract(bet, nl.multiply(scl, mean))     # [1, G, gs]
    for t in nl.affine_range(NT):
      valid = t * PMAX + i_p < S
      x3 = xs[t].reshape((PMAX, G, gs))
      y = nl.silu(nl.add(nl.multiply(x3, scl, mask=valid), bia, mask=valid), mask=valid, dtype=x.dtype)
      nl.store(out[n, t * PMAX + i_p, i_c], value=y.reshape((PMAX, C)), mask=valid)
  return out


@nki.jit
def sd_self_attention_b1(q, k, v, x):
  """Launched as ``sd_self_attention_b1[Hh](q, k, v, x)``, one program per head (``nl.program_id(0)``).
  q, k, v [Hh, S, d] token-major, x [S, Hh * d]; each program writes its head's d columns of out = x + attn."""
  Hh, S, d = q.shape
  assert S % PMAX == 0 and d <= PMAX and S <= 4096
  h = nl.program_id(0)
  scale = 1.0 / (d ** 0.5)
  out = nl.ndarray((S, Hh * d), dtype=x.dtype, buffer=nl.shared_hbm)
  NK = S // PMAX
  KB = min(FTILE, S)
  i_dp = nl.arange(d)[:, None]
  i_sf = nl.arange(S)[None, :]
  i_qf = nl.arange(PMAX)[None, :]
  i_p = nl.arange(PMAX)[:, None]
  i_df = nl.arange(d)[None, :]
  # the head's keys transposed [d, S] and values in key tiles [NK][128, d], loaded once per program
  kT = nl.load(k[h, i_sf, i_dp])
  vt = nl.ndarray((NK, nl.par_dim(PMAX), d), dtype=v.dtype, buffer=nl.sbuf)
  for j in nl.affine_range(NK):
    vt[j, i_p, i_df] = nl.load(v[h, j * PMAX + i_p, i_df])
  for qi in nl.affine_range(S // PMAX):
    q0 = qi * PMAX
    qT = nl.load(q[h, q0 + i_qf, i_dp])
    s = nl.ndarray((PMAX, S), dtype=nl.float32, buffer=nl.sbuf)
    for kb in nl.affine_range((S + KB - 1) // KB):
      i_kn = nl.arange(min(KB, S - kb * KB))[None, :]
      s[i_p, kb * KB + i_kn] = nl.matmul(qT, kT[i_dp, kb * KB + i_kn], transpose_x=True)
    mx = nl.max(s, axis=[1])
    nmx = nl.multiply(mx, -scale)
    ssum = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    e = nisa.activation_reduce(op=nl.exp, data=s, reduce_op=nl.add, reduce_res=ssum, bias=nmx, scale=scale,
                               dtype=q.dtype)
    o = nl.zeros((PMAX, d), dtype=nl.float32, buffer=nl.psum)
    for j in nl.affine_range(NK):
      eT = nl.copy(nisa.nc_transpose(e[i_p, j * PMAX + i_qf]), dtype=q.dtype)
      o += nisa.nc_matmul(eT, vt[j])
    xt = nl.load(x[q0 + i_p, h * d + i_df])
    y = nl.add(nl.multiply(o, nl.reciprocal(ssum)), xt, dtype=x.dtype)
    nl.store(out[q0 + i_p, h * d + i_df], value=y)
  return out


@nki.jit
def conv3x3_nl_b1(x, w, bias):
  """conv3x3 in the tutorial style for Cin, Cout <= 128 (the VAE decoder's 128-channel blocks): the image tile
  zero-padded in SBUF by a ``nl.ds`` store of the load, 9 ``ps += nl.matmul(w_tap, window, transpose_x=True)``
  per row block on [Cin, R, W] windows ``xp[:, nl.ds(r0 + kh, R), nl.ds(kw, W)]``, the bias added on eviction."""
  N, Cin, H, W = x.shape
  _, _, _, Cout = w.shape
  assert Cin <= PMAX and Cout <= PMAX
  R = max(1, FTILE // W)
  assert H % R == 0 or H < R
  R = min(R, H)
  out = nl.ndarray((N, Cout, H, W), dtype=x.dtype, buffer=nl.shared_hbm)
  wt = nl.load(w.reshape((Cin, 9, Cout)))
  bv = nl.load(bias.reshape((Cout, 1)), dtype=nl.float32)
  for n in nl.affine_range(N):
    xp = nl.zeros((nl.par_dim(Cin), H + 2, W + 2), dtype=x.dtype, buffer=nl.sbuf)
    xp[:, nl.ds(1, H), nl.ds(1, W)] = nl.load(x[n])
    ot = nl.ndarray((nl.par_dim(Cout), H, W), dtype=x.dtype, buffer=nl.sbuf)
    for rb in nl.affine_range(H // R):
      ps = nl.zeros((nl.par_dim(Cout), R, W), dtype=nl.float32, buffer=nl.psum)
      for tap in nl.static_range(9):
        kh = tap // 3
        kw = tap % 3
        ps[...] += nl.matmul(wt[:, tap, :], xp[:, nl.ds(rb * R + kh, R), nl.ds(kw, W)], transpose_x=True)
      ot[:, nl.ds(rb * R, R), :] = nisa.activation(op=nl.copy, data=ps, bias=bv, dtype=x.dtype)
    nl.store(out[n], value=ot)
  return out
