"""Transforms and rotations in the new NKI dialect (``import nki``, ISA calls writing ``dst=``), written the way public
NKI 0.3+ ports of quantization and token-mixing models write them:

- ``hadamard_matmul(x, rotation=None, block=None)``: the Walsh-Hadamard rotation of QuaRot / SpinQuant,
  y = x H / sqrt(B) on the rows of x [N, n] (N % 128 == 0), as a matmul. H[i, j] = (-1)^popcount(i & j) is built on
  chip, H_128 from two ``nisa.iota`` (row ids by ``channel_multiplier=1``, column ids by the pattern, int32),
  ``tensor_tensor(bitwise_and)``, the parity folded by ``tensor_scalar(right_shift)`` + ``tensor_tensor(bitwise_xor)``
  (v ^= v >> s, s = 4, 2, 1; ``scalar_tensor_tensor`` takes arithmetic ops only), then 1 - 2 (v & 1), and
  H_B = H_(B/128) (x) H_128 by sign-scaled copies (block (kt, jb) times (-1)^popcount(kt & jb)). ``block`` = B < n:
  each block of B columns is rotated on its own (QuaRot's per-head Hadamard); B < 128 gives one 128 x 128
  block-diagonal tile (ids of one block: (i >> log2 B) == (j >> log2 B), and only the low bits of
  i & j counted). ``rotation`` [Bt, Bt] (Bt = max(B, 128)): an orthonormal matrix from HBM used as given (SpinQuant's
  learned R, QuaRot's randomised Hadamard). x^T by ``nc_transpose``; PSUM accumulation over the 128-row k-tiles.
- ``hadamard_butterfly(x, block=None, form="ap")``: the fast Walsh-Hadamard transform, log2(B) stages on the free
  axis in fp32, scaled by 1/sqrt(B) in the final cast. ``form="ap"``: stage h reads and writes the [128, n / 2h, h]
  access patterns ``t.ap([[n, 128], [2h, n / 2h], [1, h]], offset=0 | h)``; ``form="shuffle"``: the constant-geometry
  form through a ``reshape((128, n / B, B))`` view, ``u[:, :, 0::2] = t[:, :, :B/2] + t[:, :, B/2:]``,
  ``u[:, :, 1::2] = t[:, :, :B/2] - t[:, :, B/2:]``.
- ``dft_hidden(x)``: the DFT along the hidden dim of real rows x [N, D] by matmul with the cos / sin matrices:
  X[s, m] = sum_d x[s, d] (cos - i sin)(2 pi d m / D) -> [N, D, 2] (real, imaginary interleaved, torch's
  ``view_as_real`` layout). The matrices are built on chip: ``nisa.iota`` outer product (d * m mod D, exact in fp32 by
  one ``tensor_scalar`` multiply + mod with the row id as a per-partition operand), times 2 pi / D, ``nl.cos`` /
  ``nl.sin`` (-sin for the imaginary part).
- ``fnet_fourier(x)``: FNet's token mixing Re(fft2(x)) over (sequence, hidden) of x [B, S, D] (S, D multiples of 128,
  D <= 512 per PSUM tile column chunk): the DFT over the hidden dim first, X1 = x (C_D - i S_D) (x^T by ``nc_transpose``
  as the stationary operand, the cos / sin matrices moving), then over the sequence dim keeping the real part,
  Re(F_S X1) = C_S Re(X1) + S_S Im(X1), as two matmuls accumulating into one PSUM tile per k-tile (C_S and S_S are
  symmetric, so their row tiles are the stationary operands). Matrices on chip as in ``dft_hidden``, built once.
- ``complex_mul(x, w)``: the element-wise complex product of packed tensors [N, F, 2] (real, imaginary interleaved),
  x * w with w [N, F, 2] or [1, F, 2] (one filter for every row: a stride-0 partition-broadcast load): re = xr wr -
  xi wi, im = xr wi + xi wr on the stride-2 views ``t.reshape((P, F, 2))[:, :, 0 | 1]`` (GFNet / FNO spectral
  filters, FFT convolutions).

Written for nsim's tests in the style of those ports; not copies of any file. No nsim imports.
"""
import math

import nki
import nki.isa as nisa
import nki.language as nl

P_MAX = 128


def _log2(n):
  b = int(n).bit_length() - 1
  assert n > 0 and (1 << b) == n, "not a power of two: {}".format(n)
  return b


# --------------------------------------------------------------------------------------------------
# Walsh-Hadamard rotation
# --------------------------------------------------------------------------------------------------

def _hadamard128(dst, block):
  """dst [128, 128] = the 128 x 128 Sylvester Hadamard matrix (+-1, unscaled); block-diagonal with blocks of ``block``
  when ``block`` < 128 (H[i, j] = (-1)^popcount(i & j & (block - 1)) where i, j are in one block, else 0)."""
  rows = nl.ndarray((P_MAX, P_MAX), dtype=nl.int32, buffer=nl.sbuf)
  nisa.iota(dst=rows, pattern=[[0, P_MAX]], offset=0, channel_multiplier=1)
  cols = nl.ndarray((P_MAX, P_MAX), dtype=nl.int32, buffer=nl.sbuf)
  nisa.iota(dst=cols, pattern=[[1, P_MAX]], offset=0, channel_multiplier=0)
  v = nl.ndarray((P_MAX, P_MAX), dtype=nl.int32, buffer=nl.sbuf)
  nisa.tensor_tensor(dst=v, data1=rows, data2=cols, op=nl.bitwise_and)
  if block < P_MAX:
    nisa.tensor_scalar(dst=v, data=v, op0=nl.bitwise_and, operand0=block - 1)
  sh = nl.ndarray((P_MAX, P_MAX), dtype=nl.int32, buffer=nl.sbuf)
  for s in (4, 2, 1):  # v ^= v >> s: bit 0 ends up as the parity of popcount(i & j)
    nisa.tensor_scalar(dst=sh, data=v, op0=nl.right_shift, operand0=s)
    nisa.tensor_tensor(dst=v, data1=v, data2=sh, op=nl.bitwise_xor)
  nisa.tensor_scalar(dst=v, data=v, op0=nl.bitwise_and, operand0=1)
  hf = nl.ndarray((P_MAX, P_MAX), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_scalar(dst=hf, data=v, op0=nl.multiply, operand0=-2.0, op1=nl.add, operand1=1.0)
  if block < P_MAX:
    lb = _log2(block)
    nisa.tensor_scalar(dst=rows, data=rows, op0=nl.right_shift, operand0=lb)
    nisa.tensor_scalar(dst=cols, data=cols, op0=nl.right_shift, operand0=lb)
    same = nl.ndarray((P_MAX, P_MAX), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=same, data1=rows, data2=cols, op=nl.equal)
    nisa.tensor_tensor(dst=hf, data1=hf, data2=same, op=nl.multiply)
  nisa.tensor_copy(dst=dst, src=hf)


@nki.jit
def hadamard_matmul(x, rotation=None, block=None):
  N, n = x.shape
  B = n if block is None else block
  _log2(B)
  Bt = max(B, P_MAX)
  assert N % P_MAX == 0 and n % Bt == 0
  KT = Bt // P_MAX
  OC = min(Bt, 512)
  NC = n // P_MAX
  mm_dt = nl.bfloat16 if x.dtype == nl.bfloat16 else nl.float32
  out = nl.ndarray((N, n), dtype=x.dtype, buffer=nl.shared_hbm)

  # the rotation's rows: k-tile kt is hrows[:, kt * Bt : (kt + 1) * Bt]
  hrows = nl.ndarray((P_MAX, KT * Bt), dtype=mm_dt, buffer=nl.sbuf)
  if rotation is None:
    # Sylvester: H_B = H_(B/128) (x) H_128; block (kt, jb) is H_128 times (-1)^popcount(kt & jb)
    h128 = nl.ndarray((P_MAX, P_MAX), dtype=mm_dt, buffer=nl.sbuf)
    _hadamard128(h128, B)
    for kt in nl.static_range(KT):
      for jb in nl.static_range(KT):
        sgn = -1.0 if bin(kt & jb).count("1") % 2 else 1.0
        c0 = kt * Bt + jb * P_MAX
        nisa.tensor_scalar(dst=hrows[:, c0:c0 + P_MAX], data=h128, op0=nl.multiply, operand0=sgn)
  else:
    for kt in nl.affine_range(KT):
      nisa.dma_copy(dst=hrows[:, kt * Bt:(kt + 1) * Bt], src=rotation[kt * P_MAX:(kt + 1) * P_MAX, :])
  scale = 1.0 / math.sqrt(B) if rotation is None else 1.0

  for t in nl.affine_range(N // P_MAX):
    xt = nl.ndarray((P_MAX, n), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=xt, src=x[t * P_MAX:(t + 1) * P_MAX, :])
    xT = nl.ndarray((P_MAX, NC * P_MAX), dtype=mm_dt, buffer=nl.sbuf)  # chunk c: x[:, c*128:(c+1)*128]^T
    for c in nl.affine_range(NC):
      tp = nl.ndarray((P_MAX, P_MAX), dtype=x.dtype, buffer=nl.psum)
      nisa.nc_transpose(dst=tp, data=xt[:, c * P_MAX:(c + 1) * P_MAX])
      nisa.tensor_copy(dst=xT[:, c * P_MAX:(c + 1) * P_MAX], src=tp)
    for blk in nl.affine_range(n // Bt):
      for oc in nl.affine_range(Bt // OC):
        ps = nl.ndarray((P_MAX, OC), dtype=nl.float32, buffer=nl.psum)
        for kt in nl.affine_range(KT):
          c = blk * KT + kt
          nisa.nc_matmul(dst=ps, stationary=xT[:, c * P_MAX:(c + 1) * P_MAX],
                         moving=hrows[:, kt * Bt + oc * OC:kt * Bt + (oc + 1) * OC], accumulate=kt > 0)
        ot = nl.ndarray((P_MAX, OC), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=ot, data=ps, op0=nl.multiply, operand0=scale)
        c0 = blk * Bt + oc * OC
        nisa.dma_copy(dst=out[t * P_MAX:(t + 1) * P_MAX, c0:c0 + OC], src=ot)
  return out


@nki.jit
def hadamard_butterfly(x, block=None, form="ap"):
  N, n = x.shape
  B = n if block is None else block
  _log2(B)
  assert N % P_MAX == 0 and n % B == 0 and form in ("ap", "shuffle")
  NB = n // B
  half = B // 2
  out = nl.ndarray((N, n), dtype=x.dtype, buffer=nl.shared_hbm)

  for t in nl.affine_range(N // P_MAX):
    cur = nl.ndarray((P_MAX, n), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=cur, src=x[t * P_MAX:(t + 1) * P_MAX, :])  # cast to fp32 on the way in
    for st in nl.static_range(_log2(B)):
      nxt = nl.ndarray((P_MAX, n), dtype=nl.float32, buffer=nl.sbuf)
      if form == "ap":
        h = 1 << st
        pat = [[n, P_MAX], [2 * h, n // (2 * h)], [1, h]]
        a, b = cur.ap(pat, offset=0), cur.ap(pat, offset=h)
        nisa.tensor_tensor(dst=nxt.ap(pat, offset=0), data1=a, data2=b, op=nl.add)
        nisa.tensor_tensor(dst=nxt.ap(pat, offset=h), data1=a, data2=b, op=nl.subtract)
      else:
        c3 = cur.reshape((P_MAX, NB, B))
        n3 = nxt.reshape((P_MAX, NB, B))
        nisa.tensor_tensor(dst=n3[:, :, 0::2], data1=c3[:, :, 0:half], data2=c3[:, :, half:B], op=nl.add)
        nisa.tensor_tensor(dst=n3[:, :, 1::2], data1=c3[:, :, 0:half], data2=c3[:, :, half:B], op=nl.subtract)
      cur = nxt
    ot = nl.ndarray((P_MAX, n), dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=ot, data=cur, op0=nl.multiply, operand0=1.0 / math.sqrt(B))
    nisa.dma_copy(dst=out[t * P_MAX:(t + 1) * P_MAX, :], src=ot)
  return out


# --------------------------------------------------------------------------------------------------
# DFT by matmul (FNet)
# --------------------------------------------------------------------------------------------------

def _dft_rows(cos_dst, sin_dst, r0, M, negate_sin=False):
  """cos_dst / sin_dst [128, M] = cos / sin(2 pi (r0 + p) m / M) for m < M (rows r0 .. r0 + 127 of the M-point DFT
  matrices; -sin with ``negate_sin``). (r0 + p) m mod M is exact in fp32 (< 2^24) before the scaling by 2 pi / M."""
  k = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.iota(dst=k, pattern=[[0, 1]], offset=r0, channel_multiplier=1)
  m = nl.ndarray((P_MAX, M), dtype=nl.float32, buffer=nl.sbuf)
  nisa.iota(dst=m, pattern=[[1, M]], offset=0, channel_multiplier=0)
  km = nl.ndarray((P_MAX, M), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_scalar(dst=km, data=m, op0=nl.multiply, operand0=k, op1=nl.mod, operand1=float(M))
  ang = nl.ndarray((P_MAX, M), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_scalar(dst=ang, data=km, op0=nl.multiply, operand0=(-1.0 if negate_sin else 1.0) * 2 * math.pi / M)
  nisa.tensor_copy(dst=cos_dst, src=nl.cos(ang))  # cos is even: the sign of the angle does not matter
  nisa.tensor_copy(dst=sin_dst, src=nl.sin(ang))


def _dft_matrices(M, dt, negate_sin=False):
  """The M x M cos and sin matrices as two [128, (M / 128) * M] tiles, row tile r at columns r * M .. (r + 1) * M."""
  R = M // P_MAX
  cm = nl.ndarray((P_MAX, R * M), dtype=dt, buffer=nl.sbuf)
  sm = nl.ndarray((P_MAX, R * M), dtype=dt, buffer=nl.sbuf)
  for r in nl.affine_range(R):
    _dft_rows(cm[:, r * M:(r + 1) * M], sm[:, r * M:(r + 1) * M], r * P_MAX, M, negate_sin)
  return cm, sm


def _transpose_rows(xt, D, dt):
  """[128, D] tile -> xT [128, (D / 128) * 128]: chunk c holds x[:, c*128:(c+1)*128]^T."""
  xT = nl.ndarray((P_MAX, D), dtype=dt, buffer=nl.sbuf)
  for c in nl.affine_range(D // P_MAX):
    tp = nl.ndarray((P_MAX, P_MAX), dtype=xt.dtype, buffer=nl.psum)
    nisa.nc_transpose(dst=tp, data=xt[:, c * P_MAX:(c + 1) * P_MAX])
    nisa.tensor_copy(dst=xT[:, c * P_MAX:(c + 1) * P_MAX], src=tp)
  return xT


def _dft_hidden_tile(ps, xT, mat, D, o0, OC):
  """ps [128, OC] = x_tile @ mat[:, o0 : o0 + OC] (contraction over the D hidden dims in 128-row k-tiles)."""
  for c in nl.affine_range(D // P_MAX):
    nisa.nc_matmul(dst=ps, stationary=xT[:, c * P_MAX:(c + 1) * P_MAX],
                   moving=mat[:, c * D + o0:c * D + o0 + OC], accumulate=c > 0)


@nki.jit
def dft_hidden(x):
  N, D = x.shape
  assert N % P_MAX == 0 and D % P_MAX == 0
  OC = min(D, 512)
  mm_dt = nl.bfloat16 if x.dtype == nl.bfloat16 else nl.float32
  out = nl.ndarray((N, D, 2), dtype=nl.float32, buffer=nl.shared_hbm)
  cm, sm = _dft_matrices(D, mm_dt, negate_sin=True)  # X = x C - i x S: the imaginary part uses -sin

  for t in nl.affine_range(N // P_MAX):
    xt = nl.ndarray((P_MAX, D), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=xt, src=x[t * P_MAX:(t + 1) * P_MAX, :])
    xT = _transpose_rows(xt, D, mm_dt)
    ot = nl.ndarray((P_MAX, 2 * D), dtype=nl.float32, buffer=nl.sbuf)
    o3 = ot.reshape((P_MAX, D, 2))
    for oc in nl.affine_range(D // OC):
      for part, mat in ((0, cm), (1, sm)):
        ps = nl.ndarray((P_MAX, OC), dtype=nl.float32, buffer=nl.psum)
        _dft_hidden_tile(ps, xT, mat, D, oc * OC, OC)
        nisa.tensor_copy(dst=o3[:, oc * OC:(oc + 1) * OC, part], src=ps)
    nisa.dma_copy(dst=out.reshape((N, 2 * D))[t * P_MAX:(t + 1) * P_MAX, :], src=ot)
  return out


@nki.jit
def fnet_fourier(x):
  B, S, D = x.shape
  assert S % P_MAX == 0 and D % P_MAX == 0
  NS = S // P_MAX
  OC = min(D, 512)
  mm_dt = nl.bfloat16 if x.dtype == nl.bfloat16 else nl.float32
  out = nl.ndarray((B, S, D), dtype=x.dtype, buffer=nl.shared_hbm)
  cd, sd = _dft_matrices(D, mm_dt)
  if S == D:
    cs, ss = cd, sd
  else:
    cs, ss = _dft_matrices(S, mm_dt)

  for b in nl.affine_range(B):
    # DFT over the hidden dim: X1 = x C_D - i x S_D; kept as re = x C_D, imn = x S_D (= -Im X1), s on the partitions
    re = nl.ndarray((P_MAX, NS * D), dtype=mm_dt, buffer=nl.sbuf)
    imn = nl.ndarray((P_MAX, NS * D), dtype=mm_dt, buffer=nl.sbuf)
    for si in nl.affine_range(NS):
      xt = nl.ndarray((P_MAX, D), dtype=x.dtype, buffer=nl.sbuf)
      nisa.dma_copy(dst=xt, src=x[b, si * P_MAX:(si + 1) * P_MAX, :])
      xT = _transpose_rows(xt, D, mm_dt)
      for oc in nl.affine_range(D // OC):
        for dst, mat in ((re, cd), (imn, sd)):
          ps = nl.ndarray((P_MAX, OC), dtype=nl.float32, buffer=nl.psum)
          _dft_hidden_tile(ps, xT, mat, D, oc * OC, OC)
          nisa.tensor_copy(dst=dst[:, si * D + oc * OC:si * D + (oc + 1) * OC], src=ps)
    # DFT over the sequence dim, real part: Re(F_S X1) = C_S re + S_S Im(X1) = C_S re - S_S imn
    nimn = nl.ndarray((P_MAX, NS * D), dtype=mm_dt, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=nimn, data=imn, op0=nl.multiply, operand0=-1.0)
    for so in nl.affine_range(NS):
      for oc in nl.affine_range(D // OC):
        ps = nl.ndarray((P_MAX, OC), dtype=nl.float32, buffer=nl.psum)
        for si in nl.affine_range(NS):
          cols = slice(si * S + so * P_MAX, si * S + (so + 1) * P_MAX)  # C_S[s-tile si, s_o-tile so]
          mov = slice(si * D + oc * OC, si * D + (oc + 1) * OC)
          nisa.nc_matmul(dst=ps, stationary=cs[:, cols], moving=re[:, mov], accumulate=si > 0)
          nisa.nc_matmul(dst=ps, stationary=ss[:, cols], moving=nimn[:, mov], accumulate=True)
        ot = nl.ndarray((P_MAX, OC), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=ot, src=ps)
        nisa.dma_copy(dst=out[b, so * P_MAX:(so + 1) * P_MAX, oc * OC:(oc + 1) * OC], src=ot)
  return out


# --------------------------------------------------------------------------------------------------
# complex element-wise product of packed tensors
# --------------------------------------------------------------------------------------------------

@nki.jit
def complex_mul(x, w):
  N, F, two = x.shape
  Nw = w.shape[0]
  assert two == 2 and tuple(w.shape[1:]) == (F, 2) and Nw in (1, N)
  out = nl.ndarray((N, F, 2), dtype=x.dtype, buffer=nl.shared_hbm)
  xf, of = x.reshape((N, 2 * F)), out.reshape((N, 2 * F))
  wf = w.reshape((Nw, 2 * F))

  for t in nl.affine_range((N + P_MAX - 1) // P_MAX):
    r0 = t * P_MAX
    rows = min(P_MAX, N - r0)
    xt = nl.ndarray((P_MAX, 2 * F), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=xt[:rows, :], src=xf[r0:r0 + rows, :])
    wt = nl.ndarray((P_MAX, 2 * F), dtype=nl.float32, buffer=nl.sbuf)
    if Nw == 1:  # one filter for every row: a stride-0 partition broadcast read
      nisa.dma_copy(dst=wt[:rows, :], src=wf.broadcast(0, rows))
    else:
      nisa.dma_copy(dst=wt[:rows, :], src=wf[r0:r0 + rows, :])
    x3, w3 = xt.reshape((P_MAX, F, 2)), wt.reshape((P_MAX, F, 2))
    xr, xi = x3[:rows, :, 0], x3[:rows, :, 1]
    wr, wi = w3[:rows, :, 0], w3[:rows, :, 1]
    a = nl.ndarray((P_MAX, F), dtype=nl.float32, buffer=nl.sbuf)
    bb = nl.ndarray((P_MAX, F), dtype=nl.float32, buffer=nl.sbuf)
    ot = nl.ndarray((P_MAX, 2 * F), dtype=x.dtype, buffer=nl.sbuf)
    o3 = ot.reshape((P_MAX, F, 2))
    nisa.tensor_tensor(dst=a[:rows, :], data1=xr, data2=wr, op=nl.multiply)
    nisa.tensor_tensor(dst=bb[:rows, :], data1=xi, data2=wi, op=nl.multiply)
    nisa.tensor_tensor(dst=o3[:rows, :, 0], data1=a[:rows, :], data2=bb[:rows, :], op=nl.subtract)
    nisa.tensor_tensor(dst=a[:rows, :], data1=xr, data2=wi, op=nl.multiply)
    nisa.tensor_tensor(dst=bb[:rows, :], data1=xi, data2=wr, op=nl.multiply)
    nisa.tensor_tensor(dst=o3[:rows, :, 1], data1=a[:rows, :], data2=bb[:rows, :], op=nl.add)
    nisa.dma_copy(dst=of[r0:r0 + rows, :], src=ot[:rows, :])
  return out
