"""Diffusion UNet block kernels (Stable Diffusion / SDXL UNet and VAE) in the new NKI dialect (``import nki``, ISA
calls writing ``dst=``), written the way community Trainium ports of those blocks are (nki-samples style):

- ``groupnorm_silu(x, gamma, beta, eps, groups, fuse_silu)``: GroupNorm (32 groups) + SiLU of x [N, C, H, W],
  channels on the partitions in group-aligned channel tiles (``(128 // gs) * gs`` channels, gs = C / groups, so
  C = 320 is tiles of 120, 120, 80). Per-partition mean / variance by ``nisa.bn_stats`` per 512-pixel chunk and
  ``nisa.bn_aggr``; the moments (mean, E[x^2]) of the gs partitions of a group are combined by a matmul with a
  [ct, ct] group-indicator matrix scaled by 1 / gs (built on chip from ``nisa.iota`` and ``nl.mod``), which puts
  each group's moments on every partition of the group. y = silu(x * (gamma rstd) + (beta - mean gamma rstd)) by
  one ``nisa.activation`` (per-partition scale and bias); ``fuse_silu=False`` evicts the affine with
  ``op=nl.copy`` and runs the SiLU as a second ScalarE pass. ``combine="transpose"`` combines the group moments
  without the indicator matrix: the [ct, 2] moments transposed to [2, ct] (``nc_transpose`` through PSUM), summed
  over each group's gs columns (``tensor_reduce`` of the [2, ng, gs] view), broadcast back by a stride-0 view
  (``.broadcast``) and transposed back. ``rstd_on_vector=True`` computes rsqrt(var + eps) by a VectorE
  ``tensor_scalar`` instead of a ScalarE activation, so that ScalarE stays on the SiLU function table.
- ``upsample_nearest2x(x)``: x [N, C, H, W] -> [N, C, 2H, 2W]; the output tile [C, H, 2, W, 2] is written by four
  ``tensor_copy`` into strided views (two of them through ``.ap`` patterns), then stored by one DMA.
- ``upsample_bilinear2x(x)``: bilinear 2x (align_corners=False), the new-dialect twin of the Beta-1 kernel: edge
  rows by ``tensor_copy``, each output parity a ``tensor_scalar`` + ``scalar_tensor_tensor`` (0.75 / 0.25 weights)
  written into the strided views ``r[:, :, a, 1:W + 1]`` / ``o[:, :, :, b]`` of [C, H, 2, W + 2] and [C, 2H, W, 2]
  tiles (the intermediate reshaped to [C, 2H, W + 2] for the column pass), one store.
- ``conv3x3(x, w, bias)``: 3x3 convolution, stride 1, padding 1 of x [N, Cin, H, W], weights in the host layout
  [Cin, 3, 3, Cout], bias [Cout]. Each channel tile of the image lands in a zero-padded SBUF tile [128, H+2, W+2];
  the output, per Cout tile and block of rows (<= 512 pixels, one PSUM bank), is 9 shifted matmuls per Cin tile
  accumulating in PSUM (moving operand: the [Cin, R, W] window of the padded tile), evicted with the bias add.
- ``unet_attention(q, k, v, x, scale)``: the attention of a UNet transformer block, flash-style (online softmax)
  over key blocks of up to 512 with the residual add: q [Hh, 64, Sq] and k [Hh, 64, Sk] (head-transposed layout),
  v [Hh, Sk, 64], x [Sq, Hh * 64] (the residual stream); out = x + concat_h softmax(scale q_h^T k_h) v_h. Spatial
  self-attention (Sk = Sq = H * W up to 4096) and cross-attention to the 77 text tokens (one ragged key block of
  77) are the same kernel. The probabilities are transposed back through the PE in chunks of <= 128 keys.

Written for nsim's tests in the style of those kernels; not copies of any file. No nsim imports.
"""
import nki
import nki.isa as nisa
import nki.language as nl

P_MAX = 128
BN_FMAX = 512
PSUM_F = 512
NEG = -3.0e38


def _group_matrix(ct, gs):
  """[ct, ct] fp32: 1 / gs where partitions p and q are in the same group of gs channels, else 0."""
  col = nl.ndarray((P_MAX, ct), dtype=nl.float32, buffer=nl.sbuf)
  nisa.iota(dst=col, pattern=[[1, ct]], offset=0, channel_multiplier=0)
  row = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.iota(dst=row, pattern=[[0, 1]], offset=0, channel_multiplier=1)
  # group start = i - i mod gs
  colm = nl.ndarray((P_MAX, ct), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_scalar(dst=colm, data=col, op0=nl.mod, operand0=float(gs))
  colg = nl.ndarray((P_MAX, ct), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_tensor(dst=colg, data1=col, data2=colm, op=nl.subtract)
  rowm = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_scalar(dst=rowm, data=row, op0=nl.mod, operand0=float(gs))
  rowg = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_tensor(dst=rowg, data1=row, data2=rowm, op=nl.subtract)
  g = nl.ndarray((P_MAX, ct), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_scalar(dst=g[:ct, :], data=colg[:ct, :], op0=nl.equal, operand0=rowg[:ct, :],
                     op1=nl.multiply, operand1=1.0 / gs)
  return g


@nki.jit
def groupnorm_silu(x, gamma, beta, eps=1e-5, groups=32, fuse_silu=True, combine="matmul", rstd_on_vector=False):
  N, C, H, W = x.shape
  HW = H * W
  assert C % groups == 0
  gs = C // groups
  assert gs <= P_MAX
  CT = (P_MAX // gs) * gs
  NCT = (C + CT - 1) // CT
  nch = (HW + BN_FMAX - 1) // BN_FMAX
  out = nl.ndarray((N, C, H, W), dtype=x.dtype, buffer=nl.shared_hbm)
  g2 = gamma.reshape((C, 1))
  b2 = beta.reshape((C, 1))

  gmat = _group_matrix(CT, gs)
  eps_t = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.memset(dst=eps_t, value=eps)

  for n in nl.affine_range(N):
    for t in nl.affine_range(NCT):
      c0 = t * CT
      cs = min(CT, C - c0)
      gam = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
      nisa.dma_copy(dst=gam[:cs, :], src=g2[c0:c0 + cs, :])
      bet = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
      nisa.dma_copy(dst=bet[:cs, :], src=b2[c0:c0 + cs, :])

      xt = nl.ndarray((P_MAX, HW), dtype=x.dtype, buffer=nl.sbuf)
      nisa.dma_copy(dst=xt[:cs, :], src=x[n, c0:c0 + cs])

      # per-channel mean / variance over the pixels, in bn_stats chunks
      stats = nl.ndarray((P_MAX, 6 * nch), dtype=nl.float32, buffer=nl.sbuf)
      for c in nl.affine_range(nch):
        f0 = c * BN_FMAX
        f1 = min(HW, f0 + BN_FMAX)
        nisa.bn_stats(dst=stats[:cs, c * 6:(c + 1) * 6], data=xt[:cs, f0:f1])
      mv = nl.ndarray((P_MAX, 2), dtype=nl.float32, buffer=nl.sbuf)
      nisa.bn_aggr(dst=mv[:cs, :], data=stats[:cs, :])

      # moments (mean, E[x^2]) per channel, averaged over the group's partitions by the indicator matmul
      mom = nl.ndarray((P_MAX, 2), dtype=nl.float32, buffer=nl.sbuf)
      nisa.tensor_copy(dst=mom[:cs, 0:1], src=mv[:cs, 0:1])
      nisa.scalar_tensor_tensor(dst=mom[:cs, 1:2], data=mv[:cs, 0:1], op0=nl.multiply, operand0=mv[:cs, 0:1],
                                op1=nl.add, operand1=mv[:cs, 1:2])
      gm = nl.ndarray((P_MAX, 2), dtype=nl.float32, buffer=nl.sbuf)
      if combine == "matmul":
        gps = nl.ndarray((P_MAX, 2), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=gps[:cs, :], stationary=gmat[:cs, :cs], moving=mom[:cs, :])
        nisa.tensor_copy(dst=gm[:cs, :], src=gps[:cs, :])
      else:
        # channels to the free axis, mean over each group's gs columns, broadcast back, transpose back
        ng = cs // gs
        momT = nl.ndarray((2, P_MAX), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_transpose(dst=momT[:, :cs], data=mom[:cs, :])
        gsum = nl.ndarray((2, P_MAX // gs), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=gsum[:, :ng], op=nl.add, data=momT[:, :cs].reshape((2, ng, gs)), axis=2)
        gbc = nl.ndarray((2, P_MAX), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=gbc[:, :cs].reshape((2, ng, gs)),
                           data=gsum[:, :ng].reshape((2, ng, 1)).broadcast(2, gs), op0=nl.multiply,
                           operand0=1.0 / gs)
        gT = nl.ndarray((P_MAX, 2), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_transpose(dst=gT[:cs, :], data=gbc[:, :cs])
        nisa.tensor_copy(dst=gm[:cs, :], src=gT[:cs, :])

      # var = E[x^2] - mean^2; rstd = rsqrt(var + eps)
      var = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
      nisa.scalar_tensor_tensor(dst=var[:cs, :], data=gm[:cs, 0:1], op0=nl.multiply, operand0=gm[:cs, 0:1],
                                op1=nl.subtract, operand1=gm[:cs, 1:2], reverse1=True)
      rstd = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
      if rstd_on_vector:
        # keeps ScalarE on the SiLU table set (no table switch per tile)
        nisa.tensor_scalar(dst=rstd[:cs, :], data=var[:cs, :], op0=nl.add, operand0=eps, op1=nl.rsqrt,
                           operand1=0.0)
      else:
        nisa.activation(dst=rstd[:cs, :], op=nl.rsqrt, data=var[:cs, :], bias=eps_t[:cs, :])
      scl = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
      nisa.tensor_tensor(dst=scl[:cs, :], data1=rstd[:cs, :], data2=gam[:cs, :], op=nl.multiply)
      # bias = beta - mean * scale
      bia = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
      nisa.scalar_tensor_tensor(dst=bia[:cs, :], data=gm[:cs, 0:1], op0=nl.multiply, operand0=scl[:cs, :],
                                op1=nl.subtract, operand1=bet[:cs, :], reverse1=True)

      yt = nl.ndarray((P_MAX, HW), dtype=x.dtype, buffer=nl.sbuf)
      if fuse_silu:
        nisa.activation(dst=yt[:cs, :], op=nl.silu, data=xt[:cs, :], bias=bia[:cs, :], scale=scl[:cs, :])
      else:
        hn = nl.ndarray((P_MAX, HW), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=hn[:cs, :], op=nl.copy, data=xt[:cs, :], bias=bia[:cs, :], scale=scl[:cs, :])
        nisa.activation(dst=yt[:cs, :], op=nl.silu, data=hn[:cs, :])
      nisa.dma_copy(dst=out[n, c0:c0 + cs], src=yt[:cs, :])
  return out


@nki.jit
def upsample_nearest2x(x):
  N, C, H, W = x.shape
  out = nl.ndarray((N, C, 2 * H, 2 * W), dtype=x.dtype, buffer=nl.shared_hbm)
  for n in nl.affine_range(N):
    for t in nl.affine_range((C + P_MAX - 1) // P_MAX):
      c0 = t * P_MAX
      cs = min(P_MAX, C - c0)
      xt = nl.ndarray((P_MAX, H, W), dtype=x.dtype, buffer=nl.sbuf)
      nisa.dma_copy(dst=xt[:cs], src=x[n, c0:c0 + cs])
      # out[c, 2i + a, 2j + b] = x[c, i, j]: the tile [C, H, 2, W, 2] is the [C, 2H, 2W] image
      ot = nl.ndarray((P_MAX, H, 2, W, 2), dtype=x.dtype, buffer=nl.sbuf)
      nisa.tensor_copy(dst=ot[:cs, :, 0, :, 0], src=xt[:cs])
      nisa.tensor_copy(dst=ot[:cs, :, 0, :, 1], src=xt[:cs])
      # the odd rows by explicit access patterns: [partition], [row step 4W, H], [col step 2, W]
      fe = 4 * H * W
      nisa.tensor_copy(dst=ot.ap([[fe, cs], [4 * W, H], [2, W]], offset=2 * W), src=xt[:cs])
      nisa.tensor_copy(dst=ot.ap([[fe, cs], [4 * W, H], [2, W]], offset=2 * W + 1), src=xt[:cs])
      nisa.dma_copy(dst=out[n, c0:c0 + cs], src=ot[:cs])
  return out


def _lerp2(dst, a, b, wa, tmp):
  """dst = wa * a + (1 - wa) * b (same-shape views): tmp = (1 - wa) b on ScalarE-free VectorE, then one
  scalar_tensor_tensor."""
  nisa.tensor_scalar(dst=tmp, data=b, op0=nl.multiply, operand0=1.0 - wa)
  nisa.scalar_tensor_tensor(dst=dst, data=a, op0=nl.multiply, operand0=wa, op1=nl.add, operand1=tmp)


@nki.jit
def upsample_bilinear2x(x):
  N, C, H, W = x.shape
  out = nl.ndarray((N, C, 2 * H, 2 * W), dtype=x.dtype, buffer=nl.shared_hbm)
  for n in nl.affine_range(N):
    for t in nl.affine_range((C + P_MAX - 1) // P_MAX):
      c0 = t * P_MAX
      cs = min(P_MAX, C - c0)
      # rows edge-padded
      xp = nl.ndarray((P_MAX, H + 2, W), dtype=nl.float32, buffer=nl.sbuf)
      nisa.dma_copy(dst=xp[:cs, 1:H + 1, :], src=x[n, c0:c0 + cs])
      nisa.tensor_copy(dst=xp[:cs, 0:1, :], src=xp[:cs, 1:2, :])
      nisa.tensor_copy(dst=xp[:cs, H + 1:H + 2, :], src=xp[:cs, H:H + 1, :])
      # row pass: r [C, H, 2, W + 2] is the [C, 2H, W + 2] column-padded image
      r = nl.ndarray((P_MAX, H, 2, W + 2), dtype=nl.float32, buffer=nl.sbuf)
      tmp = nl.ndarray((P_MAX, H, W), dtype=nl.float32, buffer=nl.sbuf)
      _lerp2(r[:cs, :, 0, 1:W + 1], xp[:cs, 1:H + 1, :], xp[:cs, 0:H, :], 0.75, tmp[:cs])
      _lerp2(r[:cs, :, 1, 1:W + 1], xp[:cs, 1:H + 1, :], xp[:cs, 2:H + 2, :], 0.75, tmp[:cs])
      r2 = r.reshape((P_MAX, 2 * H, W + 2))
      nisa.tensor_copy(dst=r2[:cs, :, 0:1], src=r2[:cs, :, 1:2])
      nisa.tensor_copy(dst=r2[:cs, :, W + 1:W + 2], src=r2[:cs, :, W:W + 1])
      # column pass: o [C, 2H, W, 2] is the [C, 2H, 2W] output
      o = nl.ndarray((P_MAX, 2 * H, W, 2), dtype=x.dtype, buffer=nl.sbuf)
      tmp2 = nl.ndarray((P_MAX, 2 * H, W), dtype=nl.float32, buffer=nl.sbuf)
      _lerp2(o[:cs, :, :, 0], r2[:cs, :, 1:W + 1], r2[:cs, :, 0:W], 0.75, tmp2[:cs])
      _lerp2(o[:cs, :, :, 1], r2[:cs, :, 1:W + 1], r2[:cs, :, 2:W + 2], 0.75, tmp2[:cs])
      nisa.dma_copy(dst=out[n, c0:c0 + cs], src=o[:cs])
  return out


@nki.jit
def conv3x3(x, w, bias):
  N, Cin, H, W = x.shape
  Cin_, KH, KW, Cout = w.shape
  assert Cin_ == Cin and KH == 3 and KW == 3 and W <= PSUM_F
  NKT = (Cin + P_MAX - 1) // P_MAX
  NMT = (Cout + P_MAX - 1) // P_MAX
  R = max(1, PSUM_F // W)
  NR = (H + R - 1) // R
  out = nl.ndarray((N, Cout, H, W), dtype=x.dtype, buffer=nl.shared_hbm)
  b2 = bias.reshape((Cout, 1))

  # weights stay resident: per Cin tile [ci, 9 * Cout]
  wts = []
  for kt in nl.static_range(NKT):
    k0 = kt * P_MAX
    ks = min(P_MAX, Cin - k0)
    wt = nl.ndarray((P_MAX, 9, Cout), dtype=w.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=wt[:ks], src=w[k0:k0 + ks])
    wts.append(wt)
  bts = []
  for mt in nl.static_range(NMT):
    m0 = mt * P_MAX
    ms = min(P_MAX, Cout - m0)
    bt = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=bt[:ms, :], src=b2[m0:m0 + ms, :])
    bts.append(bt)

  for n in nl.affine_range(N):
    xps = []
    for kt in nl.static_range(NKT):
      k0 = kt * P_MAX
      ks = min(P_MAX, Cin - k0)
      xp = nl.ndarray((P_MAX, H + 2, W + 2), dtype=x.dtype, buffer=nl.sbuf)
      nisa.memset(dst=xp, value=0.0)
      nisa.dma_copy(dst=xp[:ks, 1:H + 1, 1:W + 1], src=x[n, k0:k0 + ks])
      xps.append(xp)
    for mt in nl.static_range(NMT):
      m0 = mt * P_MAX
      ms = min(P_MAX, Cout - m0)
      ot = nl.ndarray((P_MAX, H, W), dtype=x.dtype, buffer=nl.sbuf)
      for rb in nl.affine_range(NR):
        r0 = rb * R
        rr = min(R, H - r0)
        ps = nl.ndarray((P_MAX, R, W), dtype=nl.float32, buffer=nl.psum)
        for kt in nl.static_range(NKT):
          ks = min(P_MAX, Cin - kt * P_MAX)
          for tap in nl.static_range(9):
            kh = tap // 3
            kw = tap % 3
            nisa.nc_matmul(dst=ps[:ms, :rr, :], stationary=wts[kt][:ks, tap, m0:m0 + ms],
                           moving=xps[kt][:ks, r0 + kh:r0 + kh + rr, kw:kw + W])
        nisa.activation(dst=ot[:ms, r0:r0 + rr, :], op=nl.copy, data=ps[:ms, :rr, :], bias=bts[mt][:ms, :])
      nisa.dma_copy(dst=out[n, m0:m0 + ms], src=ot[:ms])
  return out


@nki.jit
def unet_attention(q, k, v, x, scale=None):
  Hh, d, Sq = q.shape
  _, _, Sk = k.shape
  assert Sq % P_MAX == 0 and d <= P_MAX
  if scale is None:
    scale = 1.0 / (d ** 0.5)
  KB = min(PSUM_F, Sk)
  NKB = (Sk + KB - 1) // KB
  out = nl.ndarray((Sq, Hh * d), dtype=x.dtype, buffer=nl.shared_hbm)

  for h in nl.affine_range(Hh):
    for qi in nl.affine_range(Sq // P_MAX):
      q0 = qi * P_MAX
      qT = nl.ndarray((d, P_MAX), dtype=q.dtype, buffer=nl.sbuf)
      nisa.dma_copy(dst=qT, src=q[h, :, q0:q0 + P_MAX])
      m = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
      nisa.memset(dst=m, value=NEG)
      l = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
      nisa.memset(dst=l, value=0.0)
      acc = nl.ndarray((P_MAX, d), dtype=nl.float32, buffer=nl.sbuf)
      nisa.memset(dst=acc, value=0.0)

      for kb in nl.sequential_range(NKB):
        k0 = kb * KB
        kn = min(KB, Sk - k0)
        kT = nl.ndarray((d, KB), dtype=k.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=kT[:, :kn], src=k[h, :, k0:k0 + kn])
        s_ps = nl.ndarray((P_MAX, KB), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=s_ps[:, :kn], stationary=qT, moving=kT[:, :kn])

        # online softmax: new running max, rescale factor, exp and row sums in one ScalarE pass
        bmax = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=bmax, op=nl.maximum, data=s_ps[:, :kn], axis=1)
        m_new = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.scalar_tensor_tensor(dst=m_new, data=bmax, op0=nl.multiply, operand0=scale, op1=nl.maximum,
                                  operand1=m)
        neg_m = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=neg_m, data=m_new, op0=nl.multiply, operand0=-1.0)
        corr = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=corr, op=nl.exp, data=m, bias=neg_m)
        p = nl.ndarray((P_MAX, KB), dtype=q.dtype, buffer=nl.sbuf)
        rsum = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=p[:, :kn], op=nl.exp, data=s_ps[:, :kn], bias=neg_m, scale=scale,
                        reduce_op=nl.add, reduce_res=rsum, reduce_cmd=nisa.reduce_cmd.reset_reduce)
        nisa.scalar_tensor_tensor(dst=l, data=l, op0=nl.multiply, operand0=corr, op1=nl.add, operand1=rsum)
        nisa.tensor_copy(dst=m, src=m_new)

        # p @ v, the keys of the block in chunks of <= 128 on the partitions
        pv = nl.ndarray((P_MAX, d), dtype=nl.float32, buffer=nl.psum)
        for j in nl.static_range((kn + P_MAX - 1) // P_MAX):
          j0 = j * P_MAX
          jn = min(P_MAX, kn - j0)
          pT_ps = nl.ndarray((P_MAX, P_MAX), dtype=q.dtype, buffer=nl.psum)
          nisa.nc_transpose(dst=pT_ps[:jn, :], data=p[:, j0:j0 + jn])
          pT = nl.ndarray((P_MAX, P_MAX), dtype=q.dtype, buffer=nl.sbuf)
          nisa.tensor_copy(dst=pT[:jn, :], src=pT_ps[:jn, :])
          vt = nl.ndarray((P_MAX, d), dtype=v.dtype, buffer=nl.sbuf)
          nisa.dma_copy(dst=vt[:jn, :], src=v[h, k0 + j0:k0 + j0 + jn, :])
          nisa.nc_matmul(dst=pv, stationary=pT[:jn, :], moving=vt[:jn, :])
        nisa.scalar_tensor_tensor(dst=acc, data=acc, op0=nl.multiply, operand0=corr, op1=nl.add, operand1=pv)

      # normalise, add the residual
      rl = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
      nisa.reciprocal(dst=rl, data=l)
      xt = nl.ndarray((P_MAX, d), dtype=x.dtype, buffer=nl.sbuf)
      nisa.dma_copy(dst=xt, src=x[q0:q0 + P_MAX, h * d:(h + 1) * d])
      ot = nl.ndarray((P_MAX, d), dtype=x.dtype, buffer=nl.sbuf)
      nisa.scalar_tensor_tensor(dst=ot, data=acc, op0=nl.multiply, operand0=rl, op1=nl.add, operand1=xt)
      nisa.dma_copy(dst=out[q0:q0 + P_MAX, h * d:(h + 1) * d], src=ot)
  return out
