"""Transforms and rotations in the Beta-1 dialect (``import neuronxcc.nki as nki``, ``neuronxcc.nki.language as nl``,
``neuronxcc.nki.isa as nisa``; value-returning calls, arange index expressions, ``psum += nc_matmul``), written the way
public quantization / long-context / long-convolution ports write them:

- ``hadamard_matmul(x, rotation=None, block=None)``: the Walsh-Hadamard rotation of QuaRot / SpinQuant,
  y = x H / sqrt(B) on the rows of x [N, n] (N % 128 == 0). The Sylvester matrix H[i, j] = (-1)^popcount(i & j) is
  built on chip: H_128 from ``nisa.iota`` of the row and column ids (int32), ``nl.bitwise_and``, the parity folded by
  ``right_shift`` / ``bitwise_xor`` (v ^= v >> s for s = 4, 2, 1), then 1 - 2 * parity; larger B as the Kronecker
  product H_(B/128) (x) H_128 (block (kt, jb) = H_128 times the compile-time sign (-1)^popcount(kt & jb)).
  ``block`` = B (a power of two dividing n) rotates each block of B columns on its own (QuaRot's per-head Hadamard,
  B = head_dim); B < 128 makes one 128 x 128 block-diagonal tile (the ids' high bits compared, ``(i >> log2 B) ==
  (j >> log2 B)``, and only the low bits of i & j counted). ``rotation`` [Bt, Bt] (Bt = max(B, 128)) is an
  orthonormal matrix from HBM used as given instead (SpinQuant's learned R, or QuaRot's randomised Hadamard
  H diag(+-1) / sqrt(B)): no scaling then. x^T comes from PE transposes (``nisa.nc_transpose``) and the product
  accumulates over the block's 128-row k-tiles in PSUM (512 output columns per matmul).
- ``hadamard_butterfly(x, block=None, form="strided")``: the same rotation by log2(B) butterfly stages on the free
  axis in fp32 (the fast Walsh-Hadamard transform), scaled by 1/sqrt(B) as the result is cast. ``form="strided"``:
  stage h pairs columns g*2h + i and g*2h + h + i through arange index expressions ``t[i_p, i_g * 2h + i_h]``
  (a [128, G, h] strided view) and writes a + b and a - b into the same views of the next tile;
  ``form="shuffle"``: the constant-geometry (Pease) form, every stage ``u[:, 0::2] = t[:, :B/2] + t[:, B/2:]`` and
  ``u[:, 1::2] = t[:, :B/2] - t[:, B/2:]`` (blocks through a [128, n/B, B] reshape). Two VectorE instructions a stage.
- ``rope_scaled(q, rotary_dim, base, scaling, factor, original_max_position, beta_fast, beta_slow, pos_offset,
  interleaved)``: RoPE of a q tile [S, H, D] (tokens on the partitions, all heads in one [128, H, D] tile) with the
  frequencies computed on chip: j = ``nisa.iota`` of the pair index, inv_freq = ``exp(j * -2 ln(base) / R)``
  (``nisa.activation(exp, scale=)``); ``scaling="ntk"``: NTK-aware base * factor^(R / (R - 2)); ``"yarn"``
  (HF ``_compute_yarn_parameters``): the ramp clamp((j - low) / (high - low), 0, 1) by ``nl.maximum`` /
  ``nl.minimum`` between the correction dims of beta_fast / beta_slow, inv = inv_freq * (1 + ramp * (1/factor - 1)),
  cos / sin times the attention factor 0.1 ln(factor) + 1; ``"llama3"`` (Llama 3.1): the same kind of ramp on the
  on-chip wavelength ratio, s = clamp((L inv / 2 pi - low_freq_factor) / (high_freq_factor - low_freq_factor), 0, 1),
  inv * (s + (1 - s) / factor); positions ``nisa.iota(pos_offset + s0 + i_p)``.
  Partial rotary: only the first R = rotary_dim of D dims rotate (half-split pairs (j, j + R/2), NeoX / Phi style, or
  ``interleaved`` pairs (2j, 2j + 1), GPT-J style), dims R..D are copied.
- ``rope_dynamic_ntk(q, seq_len, rotary_dim, base, factor, original_max_position, interleaved)``: HF's dynamic NTK
  scaling with the sequence length a runtime value (seq_len [1, 1] fp32 in HBM, broadcast to the partitions by a
  stride-0 load): ln(base') = ln(base) + R / (R - 2) * ``nl.log``(``nl.maximum``(factor * len / L - (factor - 1), 1)),
  inv_freq = exp(j * (-2 / R) ln(base')) with the per-partition scale as the activation's ``scale`` vector.
- ``hyena_long_conv(u, k, d_skip)``: the causal long convolution of Hyena / H3 (``fftconv``: y = irfft(rfft(u) *
  rfft(k))[:L] + u * D) as a Toeplitz matmul. u [B, H, L], k [G, L] (one filter per group of H / G channels; G = H is
  depthwise), d_skip [1, H] -> y [B, H, L]. Each group's filter goes to an HBM scratch zero-padded in front
  (kpad[g, L - 1 + m] = k[g, m]); a 128 x 128 block (s0, t0) of the transposed Toeplitz matrix T^T[s, t] = k[t - s] is
  one overlapping window read ``kpad[g, (L - 1) - s0 - i_p + t0 + i_f]`` (negative partition step), and as it depends
  on t0 - s0 only, the L / 128 windows of the block diagonals serve every block; blocks above the diagonal (s > t
  everywhere) are skipped. The moving operand is the group's channels of all batches,
  u[i_b, c0 + i_c, s0 + i_p] as a [128, B, Cg] tile (sequence on the partitions), so one matmul serves B * Cg <= 512
  sequences; the skip term D * u is added at the PSUM eviction.

Written for nsim's tests in the style of those ports; not copies of any file. No nsim imports.
"""
import math

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl

PMAX = 128


def _log2(n):
  b = int(n).bit_length() - 1
  assert n > 0 and (1 << b) == n, "not a power of two: {}".format(n)
  return b


# --------------------------------------------------------------------------------------------------
# Walsh-Hadamard rotation
# --------------------------------------------------------------------------------------------------

def _hadamard128(block, dtype):
  """The 128 x 128 Sylvester Hadamard matrix (+-1, unscaled) as a tile of ``dtype``; block-diagonal with blocks of
  ``block`` when ``block`` < 128: H[i, j] = (-1)^popcount(i & j & (block - 1)) where i >> log2(block) ==
  j >> log2(block), else 0."""
  i_p = nl.arange(PMAX)[:, None]
  i_f = nl.arange(PMAX)[None, :]
  rows = nisa.iota(i_p + 0 * i_f, dtype=nl.int32)
  cols = nisa.iota(i_f + 0 * i_p, dtype=nl.int32)
  v = nl.bitwise_and(rows, cols)
  if block < PMAX:  # within a diagonal block only the ids' low bits count
    v = nl.bitwise_and(v, block - 1)
  for s in (4, 2, 1):  # fold the 7 bits: bit 0 ends up as the parity of popcount(v)
    v = nl.bitwise_xor(v, nl.right_shift(v, s))
  par = nl.bitwise_and(v, 1)
  h = nisa.tensor_scalar(data=par, op0=nl.multiply, operand0=-2.0, op1=nl.add, operand1=1.0, dtype=nl.float32)
  if block < PMAX:
    lb = _log2(block)
    same = nl.equal(nl.right_shift(rows, lb), nl.right_shift(cols, lb), dtype=nl.float32)
    h = nl.multiply(h, same)
  return nl.copy(h, dtype=dtype)


def _parity(v):
  return bin(v).count("1") % 2


@nki.jit
def hadamard_matmul(x, rotation=None, block=None):
  N, n = x.shape
  B = n if block is None else block
  _log2(B)
  Bt = max(B, PMAX)  # the matmul block: B itself, or 128 holding 128 / B diagonal blocks
  assert N % PMAX == 0 and n % Bt == 0
  KT = Bt // PMAX
  OC = min(Bt, 512)
  mm_dt = nl.bfloat16 if x.dtype == nl.bfloat16 else nl.float32
  out = nl.ndarray((N, n), dtype=x.dtype, buffer=nl.shared_hbm)

  i_p = nl.arange(PMAX)[:, None]
  i_b = nl.arange(Bt)[None, :]
  i_q = nl.arange(PMAX)[None, :]
  i_o = nl.arange(OC)[None, :]

  # the rotation's rows, one [128, Bt] tile per k-tile, kept for every token tile
  hrows = nl.ndarray((KT, nl.par_dim(PMAX), Bt), dtype=mm_dt, buffer=nl.sbuf)
  if rotation is None:
    # Sylvester: H_B = H_(B/128) (x) H_128, so the 128 x 128 block (kt, jb) is (-1)^popcount(kt & jb) H_128
    h128 = _hadamard128(B, mm_dt)
    for kt in nl.static_range(KT):
      for jb in nl.static_range(KT):
        if _parity(kt & jb):
          hrows[kt, i_p, jb * PMAX + i_q] = nl.multiply(h128, -1.0, dtype=mm_dt)
        else:
          hrows[kt, i_p, jb * PMAX + i_q] = nl.copy(h128, dtype=mm_dt)
  else:
    for kt in nl.affine_range(KT):
      hrows[kt] = nl.load(rotation[kt * PMAX + i_p, i_b], dtype=mm_dt)
  scale = 1.0 / math.sqrt(B) if rotation is None else 1.0

  for t in nl.affine_range(N // PMAX):
    xt = nl.load(x[t * PMAX + i_p, nl.arange(n)[None, :]])
    # x^T by PE transposes: xT[c] = x[:, c*128 : (c+1)*128]^T
    xT = nl.ndarray((n // PMAX, nl.par_dim(PMAX), PMAX), dtype=mm_dt, buffer=nl.sbuf)
    for c in nl.affine_range(n // PMAX):
      xT[c] = nl.copy(nisa.nc_transpose(xt[i_p, c * PMAX + i_q]), dtype=mm_dt)
    for blk in nl.affine_range(n // Bt):
      for oc in nl.affine_range(Bt // OC):
        ps = nl.zeros((nl.par_dim(PMAX), OC), dtype=nl.float32, buffer=nl.psum)
        for kt in nl.affine_range(KT):
          ps += nisa.nc_matmul(xT[blk * KT + kt], hrows[kt, i_p, oc * OC + i_o])
        nl.store(out[t * PMAX + i_p, blk * Bt + oc * OC + i_o], value=nl.multiply(ps, scale, dtype=x.dtype))
  return out


@nki.jit
def hadamard_butterfly(x, block=None, form="strided"):
  N, n = x.shape
  B = n if block is None else block
  _log2(B)
  assert N % PMAX == 0 and n % B == 0 and form in ("strided", "shuffle")
  NB = n // B
  out = nl.ndarray((N, n), dtype=x.dtype, buffer=nl.shared_hbm)
  i_p = nl.arange(PMAX)[:, None]
  i_n = nl.arange(n)[None, :]
  i_p3 = nl.arange(PMAX)[:, None, None]

  for t in nl.affine_range(N // PMAX):
    cur = nl.load(x[t * PMAX + i_p, i_n], dtype=nl.float32)
    if form == "strided":
      h = 1
      while h < B:  # stage h: columns g*2h + i and g*2h + h + i (g over all n / 2h groups: blocks included)
        i_g = nl.arange(n // (2 * h))[None, :, None]
        i_h = nl.arange(h)[None, None, :]
        lo = i_g * (2 * h) + i_h
        nxt = nl.ndarray((nl.par_dim(PMAX), n), dtype=nl.float32, buffer=nl.sbuf)
        nxt[i_p3, lo] = nl.add(cur[i_p3, lo], cur[i_p3, lo + h])
        nxt[i_p3, lo + h] = nl.subtract(cur[i_p3, lo], cur[i_p3, lo + h])
        cur = nxt
        h *= 2
    else:
      half = B // 2
      for _ in nl.static_range(_log2(B)):
        c3 = cur.reshape((PMAX, NB, B))
        nxt = nl.ndarray((nl.par_dim(PMAX), n), dtype=nl.float32, buffer=nl.sbuf)
        n3 = nxt.reshape((PMAX, NB, B))
        n3[:, :, 0::2] = nl.add(c3[:, :, 0:half], c3[:, :, half:B])
        n3[:, :, 1::2] = nl.subtract(c3[:, :, 0:half], c3[:, :, half:B])
        cur = nxt
    nl.store(out[t * PMAX + i_p, i_n], value=nl.multiply(cur, 1.0 / math.sqrt(B), dtype=x.dtype))
  return out


# --------------------------------------------------------------------------------------------------
# RoPE with scaled frequencies and partial rotary
# --------------------------------------------------------------------------------------------------

def yarn_correction_range(rotary_dim, base, original_max_position, beta_fast, beta_slow):
  """HF ``_compute_yarn_parameters``' low / high correction dims (host arithmetic, floor / ceil, clamped)."""
  def dim_of(rot):
    return (rotary_dim * math.log(original_max_position / (rot * 2 * math.pi))) / (2 * math.log(base))
  low = max(math.floor(dim_of(beta_fast)), 0)
  high = min(math.ceil(dim_of(beta_slow)), rotary_dim - 1)
  if low == high:
    high += 0.001
  return low, high


def _pair_index(half):
  """j = 0 .. half - 1 along the free axis of every partition, as a [128, 1, half] fp32 tile."""
  i_p3 = nl.arange(PMAX)[:, None, None]
  i_1 = nl.arange(1)[None, :, None]
  i_j = nl.arange(half)[None, None, :]
  return nisa.iota(0 * i_p3 + 0 * i_1 + i_j, dtype=nl.float32)


def _rotate_tile(q, out, s0, cos, sin, R, interleaved):
  """out[s0 : s0 + 128] = RoPE of q[s0 : s0 + 128] ([128, H, D] tile) with cos / sin [128, 1, R / 2] (fp32)."""
  _, H, D = q.shape
  half = R // 2
  i_p3 = nl.arange(PMAX)[:, None, None]
  i_h = nl.arange(H)[None, :, None]
  i_d = nl.arange(D)[None, None, :]
  i_j = nl.arange(half)[None, None, :]
  qt = nl.load(q[s0 + i_p3, i_h, i_d])
  ot = nl.ndarray((nl.par_dim(PMAX), H, D), dtype=q.dtype, buffer=nl.sbuf)
  if interleaved:  # GPT-J rotate_every_two: pairs (2j, 2j + 1)
    d1, d2 = 2 * i_j, 2 * i_j + 1
  else:  # NeoX rotate_half over the rotary dims: pairs (j, j + R/2)
    d1, d2 = i_j, half + i_j
  x1 = qt[i_p3, i_h, d1]
  x2 = qt[i_p3, i_h, d2]
  ot[i_p3, i_h, d1] = nl.subtract(nl.multiply(x1, cos), nl.multiply(x2, sin))
  ot[i_p3, i_h, d2] = nl.add(nl.multiply(x2, cos), nl.multiply(x1, sin))
  if R < D:  # the pass-through dims
    i_r = nl.arange(D - R)[None, None, :]
    ot[i_p3, i_h, R + i_r] = nl.copy(qt[i_p3, i_h, R + i_r])
  nl.store(out[s0 + i_p3, i_h, i_d], value=ot)


def _cos_sin(inv, s0, mscale):
  """cos / sin of (s0 + p) * inv ([128, 1, half]) for the 128 positions of a token tile, times mscale."""
  i_p = nl.arange(PMAX)[:, None]
  pos = nisa.iota(s0 + i_p, dtype=nl.float32)  # [128, 1]
  ang = nl.multiply(inv, pos)
  cos = nl.cos(ang)
  sin = nl.sin(ang)
  if mscale != 1.0:
    cos = nl.multiply(cos, mscale)
    sin = nl.multiply(sin, mscale)
  return cos, sin


@nki.jit
def rope_scaled(q, rotary_dim, base=10000.0, scaling=None, factor=1.0, original_max_position=2048, beta_fast=32.0,
                beta_slow=1.0, pos_offset=0, interleaved=False, low_freq_factor=1.0, high_freq_factor=4.0):
  S, H, D = q.shape
  R = rotary_dim
  assert S % PMAX == 0 and R % 2 == 0 and 2 <= R <= D and scaling in (None, "ntk", "yarn", "llama3")
  half = R // 2
  out = nl.ndarray((S, H, D), dtype=q.dtype, buffer=nl.shared_hbm)

  ln_base = math.log(base)
  if scaling == "ntk":  # NTK-aware: a larger base, the lowest frequency stretched by `factor`
    ln_base += (R / (R - 2)) * math.log(factor)
  j = _pair_index(half)
  inv = nisa.activation(op=nl.exp, data=j, scale=-2.0 * ln_base / R)  # base^(-2j/R)
  mscale = 1.0
  if scaling == "yarn":
    low, high = yarn_correction_range(R, base, original_max_position, beta_fast, beta_slow)
    ramp = nl.multiply(nl.subtract(j, float(low)), 1.0 / (high - low))
    ramp = nl.minimum(nl.maximum(ramp, 0.0), 1.0)
    # inv_ext * (1 - ramp) ... HF: inv_int * (1 - e) + inv_ext * e with e = 1 - ramp, inv_int = inv_ext / factor
    w = nl.add(nl.multiply(ramp, 1.0 / factor - 1.0), 1.0)
    inv = nl.multiply(inv, w)
    mscale = 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0
  elif scaling == "llama3":
    # the wavelength ramp: s = clamp((L / wavelen - lo) / (hi - lo), 0, 1) with L / wavelen = inv * L / (2 pi);
    # inv * (s + (1 - s) / factor): low frequencies / factor, high ones kept, a blend between
    r = nl.multiply(inv, original_max_position / (2 * math.pi))
    s = nl.multiply(nl.subtract(r, low_freq_factor), 1.0 / (high_freq_factor - low_freq_factor))
    s = nl.minimum(nl.maximum(s, 0.0), 1.0)
    inv = nl.multiply(inv, nl.add(nl.multiply(s, 1.0 - 1.0 / factor), 1.0 / factor))

  for t in nl.affine_range(S // PMAX):
    cos, sin = _cos_sin(inv, pos_offset + t * PMAX, mscale)
    _rotate_tile(q, out, t * PMAX, cos, sin, R, interleaved)
  return out


@nki.jit
def rope_dynamic_ntk(q, seq_len, rotary_dim, base=10000.0, factor=2.0, original_max_position=2048, interleaved=False):
  S, H, D = q.shape
  R = rotary_dim
  assert S % PMAX == 0 and R % 2 == 0 and 4 <= R <= D
  half = R // 2
  out = nl.ndarray((S, H, D), dtype=q.dtype, buffer=nl.shared_hbm)

  i_p = nl.arange(PMAX)[:, None]
  i_0 = nl.arange(1)[None, :]
  ln_ = nl.load(seq_len[0 * i_p, i_0], dtype=nl.float32)  # the runtime length on every partition
  g = nl.maximum(nl.add(nl.multiply(ln_, factor / original_max_position), 1.0 - factor), 1.0)
  ln_base = nl.add(nl.multiply(nl.log(g), R / (R - 2)), math.log(base))
  coef = nl.multiply(ln_base, -2.0 / R)  # [128, 1]
  inv = nisa.activation(op=nl.exp, data=_pair_index(half), scale=coef)

  for t in nl.affine_range(S // PMAX):
    cos, sin = _cos_sin(inv, t * PMAX, 1.0)
    _rotate_tile(q, out, t * PMAX, cos, sin, R, interleaved)
  return out


# --------------------------------------------------------------------------------------------------
# Hyena-style causal long convolution as a Toeplitz matmul
# --------------------------------------------------------------------------------------------------

@nki.jit
def hyena_long_conv(u, k, d_skip):
  B, H, L = u.shape
  G, Lk = k.shape
  assert Lk == L and L % PMAX == 0 and H % G == 0 and G <= PMAX
  Cg = H // G
  assert B * Cg <= 512
  NT = L // PMAX
  mm_dt = nl.bfloat16 if u.dtype == nl.bfloat16 else nl.float32
  y = nl.ndarray((B, H, L), dtype=u.dtype, buffer=nl.shared_hbm)
  kpad = nl.ndarray((G, 2 * L - 1), dtype=k.dtype, buffer=nl.hbm)

  i_g = nl.arange(G)[:, None]
  i_l = nl.arange(L)[None, :]
  i_z = nl.arange(L - 1)[None, :]
  i_p = nl.arange(PMAX)[:, None]
  i_f = nl.arange(PMAX)[None, :]
  i_p3 = nl.arange(PMAX)[:, None, None]
  i_b = nl.arange(B)[None, :, None]
  i_c = nl.arange(Cg)[None, None, :]

  # the zero-padded filters: kpad[g, 0 : L-1] = 0, kpad[g, L-1 : 2L-1] = k[g]
  nl.store(kpad[i_g, i_z], value=nl.zeros((G, L - 1), dtype=k.dtype, buffer=nl.sbuf))
  nl.store(kpad[i_g, L - 1 + i_l], value=nl.load(k[i_g, i_l]))

  for g in nl.affine_range(G):
    c0 = g * Cg
    dv = nl.load(d_skip[0 * i_p3, c0 + i_c], dtype=nl.float32)  # [128, 1, Cg]
    # the moving operands: the group's sequences, s on the partitions
    us = nl.ndarray((NT, nl.par_dim(PMAX), B, Cg), dtype=mm_dt, buffer=nl.sbuf)
    for si in nl.affine_range(NT):
      us[si] = nl.load(u[i_b, c0 + i_c, si * PMAX + i_p3], dtype=mm_dt)
    # T^T[s, t] = k[t - s]: block (si, ti) depends only on the block diagonal dd = ti - si, so NT windows serve
    # all NT (NT + 1) / 2 causal blocks; window dd = kpad[g, (L - 1) - i_p + dd * 128 + i_f]
    tT = nl.ndarray((NT, nl.par_dim(PMAX), PMAX), dtype=mm_dt, buffer=nl.sbuf)
    for dd in nl.affine_range(NT):
      tT[dd] = nl.load(kpad[g, (L - 1) - i_p + dd * PMAX + i_f], dtype=mm_dt)
    for ti in nl.affine_range(NT):
      ps = nl.zeros((nl.par_dim(PMAX), B, Cg), dtype=nl.float32, buffer=nl.psum)
      for si in nl.affine_range(ti + 1):  # causal: blocks with s0 > t0 are all zero
        ps += nisa.nc_matmul(tT[ti - si], us[si])
      yt = nl.add(ps, nl.multiply(us[ti], dv), dtype=u.dtype)
      nl.store(y[i_b, c0 + i_c, ti * PMAX + i_p3], value=yt)
  return y
