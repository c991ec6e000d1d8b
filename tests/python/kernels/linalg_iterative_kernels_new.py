"""Iterative matrix functions in the new NKI dialect (``import nki``, ISA calls writing ``dst=``), written the way
public NKI ports of Shampoo / SOAP preconditioners and Newton-Schulz solvers write them:

- ``ns_inverse_sqrt(a, iters, scale)``: Shampoo's coupled Newton-Schulz iteration for A^{-1/2} of an SPD matrix
  a [n, n] (n <= 512). c = trace(A) (``scale="trace"``: the diagonal picked by a multiply with the identity and
  ``tensor_reduce``) or ||A||_F (``scale="fro"``: ``activation`` square with an add reduction), summed over the
  partitions by a ones matmul; Y = A / c, Z = I, then ``iters`` times T = (3 I - Z Y) / 2, Y <- Y T, Z <- T Z
  as true products: the left factor transposed on the PE first (``nc_transpose`` per block). Every iterate is a
  polynomial in A, hence symmetric in exact arithmetic, and ``symmetric_shortcut=True`` skips the transposes (the
  left factor's row tiles taken as the stationary tiles of its transpose, i.e. x^T y): cheaper, but the coupled
  iteration then amplifies the antisymmetric part of the rounding error step after step (it diverges after a few
  tens of steps). Result Z / sqrt(c) [n, n] fp32. Matmuls in the input dtype (fp32 or bf16), fp32 PSUM.
- ``ns_inverse(a, iters)``: the Newton-Schulz (Hotelling) inverse of an SPD matrix, X0 = I / ||A||_F,
  X <- 2 X - X (A X), ``iters`` times (A X with A's own row tiles as the stationary: A is exactly symmetric; X
  transposed on the PE for the left product); fp32 out.
- ``muon_ns_new(g, steps=5)``: Muon's quintic Newton-Schulz (as the Beta-1 ``muon_newton_schulz``) for G [M, N]
  with M <= N (no transpose case), M, N multiples of 128, M <= 512, N <= 512: the norm by ``activation`` square +
  reduce and a ones matmul, per step X^T by ``nc_transpose`` (PSUM) + ``tensor_copy``, A = X X^T, B = b A + c A^2 by
  ``scalar_tensor_tensor``, X <- a X + B X.

- ``cholesky_solve(l, b)``: x [n, r] with L L^T x = b for a Cholesky factor l [n, n] (fp32, n <= 512) and r <= 128
  right-hand sides b [n, r]: blocked forward then back substitution with the right-hand sides on the partitions
  (b^T [r, n] by PE transposes, so one column of a sweep is an (r, 1) vector). Within a 128-block, column by
  column: the factor's column (L for the forward sweep, L^T -- transposed once on the PE -- for the backward one)
  broadcast as a row to the r partitions by a matmul of a ones tile with its diagonal matrix, the pivot's
  ``reciprocal``, the solution column, and a rank-1 ``scalar_tensor_tensor`` update of the block; the blocks
  beyond by one matmul per block (y_k^T L_jk^T for all j > k at once, x_k^T L_kj for all j < k).

Matrices live on chip as [128, tiles, cols] (row tile t of the matrix = ``x[:, t, :]``), zero-padded to whole
128-row tiles; only the HBM accesses are ragged.

Written for nsim's tests in the style of those kernels; not copies of any file. No nsim imports.
"""
import nki
import nki.isa as nisa
import nki.language as nl

P = 128


def _cdiv(a, b):
  return (a + b - 1) // b


def _identity(n, NT, dtype):
  """I_n as [P, NT, NT * P] (zero on the padding), and the [P, P] identity."""
  ones = nl.ndarray((P, P), dtype=nl.float32, buffer=nl.sbuf)
  nisa.memset(dst=ones, value=1.0)
  eye = nl.ndarray((P, P), dtype=nl.float32, buffer=nl.sbuf)
  nisa.affine_select(dst=eye, pattern=[[-1, P]], channel_multiplier=1, on_true_tile=ones, on_false_value=0.0,
                     cmp_op=nl.equal)
  ident = nl.ndarray((P, NT, NT * P), dtype=dtype, buffer=nl.sbuf)
  nisa.memset(dst=ident, value=0.0)
  for t in nl.affine_range(NT):
    rw = min(P, n - t * P)
    nisa.tensor_copy(dst=ident[:rw, t, t * P:t * P + rw], src=eye[:rw, :rw])
  return ones, eye, ident


def _sym_mm(dst, x, y, NT, npad, alpha=None, beta=None, add=None):
  """dst[:, mb, :] = x y for x symmetric (row tile kt of x = stationary of x^T); with ``alpha``/``add``:
  dst = alpha * (x y) + beta * add (``scalar_tensor_tensor``)."""
  for mb in nl.affine_range(NT):
    ps = nl.ndarray((P, npad), dtype=nl.float32, buffer=nl.psum)
    for kt in nl.affine_range(NT):
      nisa.nc_matmul(dst=ps, stationary=x[:, kt, mb * P:(mb + 1) * P], moving=y[:, kt, :])
    if add is None:
      nisa.tensor_copy(dst=dst[:, mb, :], src=ps)
    else:
      nisa.scalar_tensor_tensor(dst=dst[:, mb, :], data=ps, op0=nl.multiply, operand0=alpha, op1=nl.add,
                                operand1=add[:, mb, :])


def _mm(dst, x, y, NT, npad, xt, alpha=None, add=None):
  """dst = x y with true products: x transposed on the PE into ``xt`` first (``nc_transpose`` per 128 x 128 block,
  PSUM -> SBUF by ``tensor_copy``), its row tiles then the stationary tiles. ``xt=None``: the symmetric shortcut
  (x's own row tiles as the stationary, i.e. x^T y)."""
  if xt is None:
    _sym_mm(dst, x, y, NT, npad, alpha=alpha, add=add)
    return
  for r in nl.affine_range(NT):
    for c in nl.affine_range(NT):
      tp = nl.ndarray((P, P), dtype=x.dtype, buffer=nl.psum)
      nisa.nc_transpose(dst=tp, data=x[:, r, c * P:(c + 1) * P])
      nisa.tensor_copy(dst=xt[:, c, r * P:(r + 1) * P], src=tp)
  _sym_mm(dst, xt, y, NT, npad, alpha=alpha, add=add)


def _load_padded(a, n, NT, dtype):
  x = nl.ndarray((P, NT, NT * P), dtype=dtype, buffer=nl.sbuf)
  nisa.memset(dst=x, value=0.0)
  for t in nl.affine_range(NT):
    rw = min(P, n - t * P)
    nisa.dma_copy(dst=x[:rw, t, :n], src=a[t * P:t * P + rw, :])
  return x


def _all_partition_sum(ones, part, dst):
  """dst (P, 1) = the sum over the partitions of part (P, 1), on every partition (ones matmul)."""
  ps = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.psum)
  nisa.nc_matmul(dst=ps, stationary=ones, moving=part)
  nisa.tensor_copy(dst=dst, src=ps)


def _store(out, x, n, NT):
  for t in nl.affine_range(NT):
    rw = min(P, n - t * P)
    nisa.dma_copy(dst=out[t * P:t * P + rw, :], src=x[:rw, t, :n])


@nki.jit
def ns_inverse_sqrt(a, iters=20, scale="trace", symmetric_shortcut=False):
  n, n_ = a.shape
  assert n == n_ and n <= 512 and scale in ("trace", "fro")
  NT = _cdiv(n, P)
  npad = NT * P
  dt = a.dtype
  out = nl.ndarray((n, n), dtype=nl.float32, buffer=nl.shared_hbm)
  x = _load_padded(a, n, NT, nl.float32)
  ones, eye, ident = _identity(n, NT, nl.float32)

  part = nl.ndarray((P, NT), dtype=nl.float32, buffer=nl.sbuf)
  for t in nl.affine_range(NT):
    junk = nl.ndarray((P, npad), dtype=nl.float32, buffer=nl.sbuf)
    if scale == "trace":
      nisa.tensor_tensor(dst=junk[:, :P], data1=x[:, t, t * P:(t + 1) * P], data2=eye, op=nl.multiply)
      nisa.tensor_reduce(dst=part[:, t:t + 1], op=nl.add, data=junk[:, :P], axis=1)
    else:
      nisa.activation(dst=junk, op=nl.square, data=x[:, t, :], reduce_op=nl.add, reduce_res=part[:, t:t + 1],
                      reduce_cmd=nisa.reduce_cmd.reset_reduce)
  psum1 = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_reduce(dst=psum1, op=nl.add, data=part, axis=1)
  c = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
  _all_partition_sum(ones, psum1, c)
  if scale == "fro":
    nisa.activation(dst=c, op=nl.sqrt, data=c)
  rc = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.reciprocal(dst=rc, data=c)

  y = nl.ndarray((P, NT, npad), dtype=dt, buffer=nl.sbuf)
  z = nl.ndarray((P, NT, npad), dtype=dt, buffer=nl.sbuf)
  y2 = nl.ndarray((P, NT, npad), dtype=dt, buffer=nl.sbuf)
  z2 = nl.ndarray((P, NT, npad), dtype=dt, buffer=nl.sbuf)
  tm = nl.ndarray((P, NT, npad), dtype=dt, buffer=nl.sbuf)
  i15 = nl.ndarray((P, NT, npad), dtype=nl.float32, buffer=nl.sbuf)
  xt = None if symmetric_shortcut else nl.ndarray((P, NT, npad), dtype=dt, buffer=nl.sbuf)
  for t in nl.affine_range(NT):
    nisa.tensor_scalar(dst=y[:, t, :], data=x[:, t, :], op0=nl.multiply, operand0=rc)
    nisa.tensor_copy(dst=z[:, t, :], src=ident[:, t, :])
    nisa.tensor_scalar(dst=i15[:, t, :], data=ident[:, t, :], op0=nl.multiply, operand0=1.5)
  for it in nl.static_range(iters):
    # T = 1.5 I - 0.5 Z Y; Y <- Y T; Z <- T Z
    _mm(tm, z, y, NT, npad, xt, alpha=-0.5, add=i15)
    _mm(y2, y, tm, NT, npad, xt)
    _mm(z2, tm, z, NT, npad, xt)
    y, y2 = y2, y
    z, z2 = z2, z
  rs = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.activation(dst=rs, op=nl.rsqrt, data=c)
  res = nl.ndarray((P, NT, npad), dtype=nl.float32, buffer=nl.sbuf)
  for t in nl.affine_range(NT):
    nisa.tensor_scalar(dst=res[:, t, :], data=z[:, t, :], op0=nl.multiply, operand0=rs)
  _store(out, res, n, NT)
  return out


@nki.jit
def ns_inverse(a, iters=16):
  n, n_ = a.shape
  assert n == n_ and n <= 512
  NT = _cdiv(n, P)
  npad = NT * P
  dt = a.dtype
  out = nl.ndarray((n, n), dtype=nl.float32, buffer=nl.shared_hbm)
  xa = _load_padded(a, n, NT, dt)
  ones, eye, ident = _identity(n, NT, nl.float32)
  part = nl.ndarray((P, NT), dtype=nl.float32, buffer=nl.sbuf)
  for t in nl.affine_range(NT):
    junk = nl.ndarray((P, npad), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=junk, op=nl.square, data=xa[:, t, :], reduce_op=nl.add, reduce_res=part[:, t:t + 1],
                    reduce_cmd=nisa.reduce_cmd.reset_reduce)
  s1 = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_reduce(dst=s1, op=nl.add, data=part, axis=1)
  fro = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
  _all_partition_sum(ones, s1, fro)
  rf = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.activation(dst=rf, op=nl.rsqrt, data=fro)  # 1 / ||A||_F
  x = nl.ndarray((P, NT, npad), dtype=dt, buffer=nl.sbuf)
  x2 = nl.ndarray((P, NT, npad), dtype=dt, buffer=nl.sbuf)
  ax = nl.ndarray((P, NT, npad), dtype=dt, buffer=nl.sbuf)
  for t in nl.affine_range(NT):
    nisa.tensor_scalar(dst=x[:, t, :], data=ident[:, t, :], op0=nl.multiply, operand0=rf)
  xt = nl.ndarray((P, NT, npad), dtype=dt, buffer=nl.sbuf)
  for it in nl.static_range(iters):
    _sym_mm(ax, xa, x, NT, npad)  # A is the input itself: exactly symmetric
    # X <- 2 X - X (A X), X transposed on the PE for the left product
    for r in nl.affine_range(NT):
      for c in nl.affine_range(NT):
        tp = nl.ndarray((P, P), dtype=dt, buffer=nl.psum)
        nisa.nc_transpose(dst=tp, data=x[:, r, c * P:(c + 1) * P])
        nisa.tensor_copy(dst=xt[:, c, r * P:(r + 1) * P], src=tp)
    for mb in nl.affine_range(NT):
      ps = nl.ndarray((P, npad), dtype=nl.float32, buffer=nl.psum)
      for kt in nl.affine_range(NT):
        nisa.nc_matmul(dst=ps, stationary=xt[:, kt, mb * P:(mb + 1) * P], moving=ax[:, kt, :])
      nisa.scalar_tensor_tensor(dst=x2[:, mb, :], data=x[:, mb, :], op0=nl.multiply, operand0=2.0,
                                op1=nl.subtract, operand1=ps)
    x, x2 = x2, x
  res = nl.ndarray((P, NT, npad), dtype=nl.float32, buffer=nl.sbuf)
  for t in nl.affine_range(NT):
    nisa.tensor_copy(dst=res[:, t, :], src=x[:, t, :])
  _store(out, res, n, NT)
  return out


@nki.jit
def muon_ns_new(g, steps=5, eps=1e-7):
  M, N = g.shape
  assert M <= N and M % P == 0 and N % P == 0 and M <= 512 and N <= 512
  MT, NT = M // P, N // P
  dt = g.dtype
  a_, b_, c_ = 3.4445, -4.7750, 2.0315
  out = nl.ndarray((M, N), dtype=dt, buffer=nl.shared_hbm)
  x = nl.ndarray((P, MT, N), dtype=dt, buffer=nl.sbuf)
  for t in nl.affine_range(MT):
    nisa.dma_copy(dst=x[:, t, :], src=g[t * P:(t + 1) * P, :])
  ones = nl.ndarray((P, P), dtype=nl.float32, buffer=nl.sbuf)
  nisa.memset(dst=ones, value=1.0)
  part = nl.ndarray((P, MT), dtype=nl.float32, buffer=nl.sbuf)
  for t in nl.affine_range(MT):
    junk = nl.ndarray((P, N), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=junk, op=nl.square, data=x[:, t, :], reduce_op=nl.add, reduce_res=part[:, t:t + 1],
                    reduce_cmd=nisa.reduce_cmd.reset_reduce)
  s1 = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_reduce(dst=s1, op=nl.add, data=part, axis=1)
  tot = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
  _all_partition_sum(ones, s1, tot)
  nisa.activation(dst=tot, op=nl.sqrt, data=tot)
  nisa.tensor_scalar(dst=tot, data=tot, op0=nl.add, operand0=eps)
  rn = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.reciprocal(dst=rn, data=tot)
  for t in nl.affine_range(MT):
    nisa.tensor_scalar(dst=x[:, t, :], data=x[:, t, :], op0=nl.multiply, operand0=rn)

  xt = nl.ndarray((P, NT, M), dtype=dt, buffer=nl.sbuf)
  am = nl.ndarray((P, MT, M), dtype=dt, buffer=nl.sbuf)
  bm = nl.ndarray((P, MT, M), dtype=dt, buffer=nl.sbuf)
  xn = nl.ndarray((P, MT, N), dtype=dt, buffer=nl.sbuf)
  for it in nl.static_range(steps):
    for mt in nl.affine_range(MT):
      for t in nl.affine_range(NT):
        tp = nl.ndarray((P, P), dtype=dt, buffer=nl.psum)
        nisa.nc_transpose(dst=tp, data=x[:, mt, t * P:(t + 1) * P])
        nisa.tensor_copy(dst=xt[:, t, mt * P:(mt + 1) * P], src=tp)
    for mb in nl.affine_range(MT):
      ps = nl.ndarray((P, M), dtype=nl.float32, buffer=nl.psum)
      for kt in nl.affine_range(NT):
        nisa.nc_matmul(dst=ps, stationary=xt[:, kt, mb * P:(mb + 1) * P], moving=xt[:, kt, :])
      nisa.tensor_copy(dst=am[:, mb, :], src=ps)
    for mb in nl.affine_range(MT):
      ps = nl.ndarray((P, M), dtype=nl.float32, buffer=nl.psum)
      for kt in nl.affine_range(MT):
        nisa.nc_matmul(dst=ps, stationary=am[:, kt, mb * P:(mb + 1) * P], moving=am[:, kt, :])
      ta = nl.ndarray((P, M), dtype=nl.float32, buffer=nl.sbuf)
      nisa.tensor_scalar(dst=ta, data=am[:, mb, :], op0=nl.multiply, operand0=b_)
      nisa.scalar_tensor_tensor(dst=bm[:, mb, :], data=ps, op0=nl.multiply, operand0=c_, op1=nl.add, operand1=ta)
    for mb in nl.affine_range(MT):
      ps = nl.ndarray((P, N), dtype=nl.float32, buffer=nl.psum)
      for kt in nl.affine_range(MT):
        nisa.nc_matmul(dst=ps, stationary=bm[:, kt, mb * P:(mb + 1) * P], moving=x[:, kt, :])
      nisa.scalar_tensor_tensor(dst=xn[:, mb, :], data=x[:, mb, :], op0=nl.multiply, operand0=a_, op1=nl.add,
                                operand1=ps)
    x, xn = xn, x
  for t in nl.affine_range(MT):
    nisa.dma_copy(dst=out[t * P:(t + 1) * P, :], src=x[:, t, :])
  return out


@nki.jit
def cholesky_solve(l, b):
  """x [n, r] with L L^T x = b for a lower-triangular l [n, n] (fp32, zeros above the diagonal) and r <= 128
  right-hand sides b [n, r]; blocked forward then back substitution with the right-hand sides on the partitions
  (b^T [r, n], so a column of the sweep is a (r, 1) vector)."""
  n, n_ = l.shape
  n2, r = b.shape
  assert n == n_ == n2 and n <= 512 and r <= P
  NT = _cdiv(n, P)
  npad = NT * P
  out = nl.ndarray((n, r), dtype=nl.float32, buffer=nl.shared_hbm)
  ls = _load_padded(l, n, NT, nl.float32)
  ones, eye, ident = _identity(n, NT, nl.float32)

  # L^T (row tile c of L^T = column block c of L), and b^T, by PE transposes
  lt = nl.ndarray((P, NT, npad), dtype=nl.float32, buffer=nl.sbuf)
  for rt in nl.affine_range(NT):
    for ct in nl.affine_range(NT):
      tp = nl.ndarray((P, P), dtype=nl.float32, buffer=nl.psum)
      nisa.nc_transpose(dst=tp, data=ls[:, rt, ct * P:(ct + 1) * P])
      nisa.tensor_copy(dst=lt[:, ct, rt * P:(rt + 1) * P], src=tp)
  bs = nl.ndarray((P, NT, r), dtype=nl.float32, buffer=nl.sbuf)
  nisa.memset(dst=bs, value=0.0)
  for t in nl.affine_range(NT):
    rw = min(P, n - t * P)
    nisa.dma_copy(dst=bs[:rw, t, :], src=b[t * P:t * P + rw, :])
  bt = nl.ndarray((r, npad), dtype=nl.float32, buffer=nl.sbuf)
  for t in nl.affine_range(NT):
    tp = nl.ndarray((r, P), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_transpose(dst=tp, data=bs[:, t, :])
    nisa.tensor_copy(dst=bt[:, t * P:(t + 1) * P], src=tp)

  def sweep(rhs, res, tri, k, i):
    """One column of a substitution in block k: column g = k * P + i of the block's rows of ``tri`` (L for the
    forward sweep, L^T for the backward one) as a row on the r partitions (a matmul of a ones tile with the diagonal
    matrix of that column),
    res[:, g] = rhs[:, g] / pivot, then rhs[:, block] -= res[:, g] * row."""
    g = k * P + i
    d = nl.ndarray((P, P), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=d, data=eye, op0=nl.multiply, operand0=tri[:, k, g:g + 1])
    row = nl.ndarray((r, P), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=row, stationary=ones[:, :r], moving=d)
    rp = nl.ndarray((r, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.reciprocal(dst=rp, data=row[:, i:i + 1])
    nisa.tensor_scalar(dst=res[:, g:g + 1], data=rhs[:, g:g + 1], op0=nl.multiply, operand0=rp)
    nisa.scalar_tensor_tensor(dst=rhs[:, k * P:(k + 1) * P], data=row, op0=nl.multiply, operand0=res[:, g:g + 1],
                              op1=nl.subtract, operand1=rhs[:, k * P:(k + 1) * P], reverse1=True)

  def block_t(src, k):
    """src[:, block k] ([r, P]) transposed to [P, r] in SBUF."""
    tp = nl.ndarray((P, r), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_transpose(dst=tp, data=src[:, k * P:(k + 1) * P])
    s = nl.ndarray((P, r), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=s, src=tp)
    return s

  # forward: L y = b (y^T in yt)
  yt = nl.ndarray((r, npad), dtype=nl.float32, buffer=nl.sbuf)
  nisa.memset(dst=yt, value=0.0)
  for k in nl.sequential_range(NT):
    for i in nl.sequential_range(min(P, n - k * P)):
      sweep(bt, yt, ls, k, i)
    if k + 1 < NT:
      # b_j -= L_jk y_k for the blocks below, all at once: [r, n - (k + 1) P] = y_k^T L_jk^T
      yk = block_t(yt, k)
      ps = nl.ndarray((r, npad - (k + 1) * P), dtype=nl.float32, buffer=nl.psum)
      nisa.nc_matmul(dst=ps, stationary=yk, moving=lt[:, k, (k + 1) * P:npad])
      nisa.tensor_tensor(dst=bt[:, (k + 1) * P:npad], data1=bt[:, (k + 1) * P:npad], data2=ps, op=nl.subtract)

  # backward: L^T x = y (x^T in xt)
  xt = nl.ndarray((r, npad), dtype=nl.float32, buffer=nl.sbuf)
  nisa.memset(dst=xt, value=0.0)
  for kk in nl.sequential_range(NT):
    k = NT - 1 - kk
    for ii in nl.sequential_range(min(P, n - k * P)):
      sweep(yt, xt, lt, k, min(P, n - k * P) - 1 - ii)
    if k > 0:
      # y_j -= L_kj^T x_k for the blocks above, all at once: [r, k P] = x_k^T L[block k rows, :k P]
      xk = block_t(xt, k)
      ps = nl.ndarray((r, k * P), dtype=nl.float32, buffer=nl.psum)
      nisa.nc_matmul(dst=ps, stationary=xk, moving=ls[:, k, 0:k * P])
      nisa.tensor_tensor(dst=yt[:, 0:k * P], data1=yt[:, 0:k * P], data2=ps, op=nl.subtract)

  for t in nl.affine_range(NT):
    rw = min(P, n - t * P)
    xs = block_t(xt, t)
    nisa.dma_copy(dst=out[t * P:t * P + rw, :], src=xs[:rw, :])
  return out
