"""Numerical linear algebra kernels in the Beta-1 dialect (``neuronxcc.nki``), written the way public NKI ports of
Muon / Shampoo optimizers and scientific-computing kernels write them (block tensors ``nl.par_dim``, value-returning
``nl`` / ``nisa`` calls, ``psum += nisa.nc_matmul(...)`` accumulation, zero-padded ragged tiles):

- ``muon_newton_schulz(g, steps=5)``: Muon's orthogonalisation of a gradient G [M, N] (M, N <= 1024, min <= 512).
  X = G / (||G||_F + 1e-7) (the norm: squares summed per partition, then over the partitions by a ones matmul),
  transposed first when M > N (X = G^T, as the reference does, so X is [m, n] with m <= n); then ``steps`` quintic
  iterations A = X X^T, B = b A + c A^2, X <- a X + B X with (a, b, c) = (3.4445, -4.7750, 2.0315). The matmuls run
  in the input dtype (bf16 in Muon) with fp32 PSUM accumulation; X, A and B are kept in the input dtype between
  matmuls. X is kept as row tiles [m / 128][128, n] and, per iteration, transposed on the PE (``nc_transpose``, one
  per 128 x 128 block) to X^T [n / 128][128, m] for A's contraction over n. Ragged sizes are zero-padded on chip
  (m to a multiple of 128, n to equal column chunks of <= 512): only the HBM loads and stores are ragged, and the
  padding stays zero through the iterations. Output [M, N] (X^T when M > N).
- ``cholesky_blocked(a)`` / ``cholesky_unblocked(a)``: lower Cholesky factor L [n, n] (fp32, zeros above the
  diagonal) of an SPD matrix a [n, n] (n <= 512; rows on the partitions, 128-row tiles zero-padded).
  ``cholesky_blocked``, per 128-column block: the diagonal block and the panel below it by an unblocked
  column-by-column loop on chip (row j of the block broadcast to every partition by a matmul with a one-hot
  selector, pivot ``nl.rsqrt``, column j of L = column j * rsqrt(pivot), rank-1 elimination of the block's columns by
  ``scalar_tensor_tensor``: for the panel rows this is the triangular solve L_ik = A_ik L_kk^-T column by column),
  then the trailing matrix updated by matmuls (A_ij -= L_ik L_jk^T, the panel transposed on the PE).
  ``cholesky_unblocked``: the same column loop over all n columns with every rank-1 update on the full rows, no
  matmul update (the naive variant).
- ``covariance_centered(x)``: the sample covariance (x - mean)^T (x - mean) / (N - 1) [D, D] fp32 of x [N, D]
  (N ragged, D <= 512): column means by a ones matmul (on every partition), the centred rows kept in SBUF in the
  input dtype, then the Gram matrix by matmuls contracting over the sample tiles.
- ``head_bmm(a, b, pe_tiling=True)``: batched small products c[h] = a[h] @ b[h] of 32 x 32 matrices per head
  (a, b [H, 32, 32]); four heads per 128 partitions, a[h] loaded transposed (advanced-index DMA), the four
  products issued on the four diagonal 32 x 32 tiles of the PE array (``tile_position`` / ``tile_size``); with
  ``pe_tiling=False`` the same matmuls untiled. Output [H, 32, 32] fp32.

Written for nsim's tests in the style of those kernels; not copies of any file. No nsim imports.
"""
import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl

P = 128
NS_A, NS_B, NS_C = 3.4445, -4.7750, 2.0315


def _cdiv(a, b):
  return (a + b - 1) // b


@nki.jit
def muon_newton_schulz(g, steps=5, eps=1e-7):
  M, N = g.shape
  transposed = M > N
  m, n = (N, M) if transposed else (M, N)
  assert m <= 512 and n <= 1024
  dt = g.dtype
  MT, NT = _cdiv(m, P), _cdiv(n, P)
  NCH = _cdiv(NT, 4)  # column chunks of X for the B X matmuls (<= 512 fp32 = one PSUM bank)
  CW = P * _cdiv(NT, NCH)
  mp, npad = MT * P, NCH * CW  # zero-padded sizes: every compute tile is whole, only HBM accesses are ragged
  out = nl.ndarray((M, N), dtype=dt, buffer=nl.shared_hbm)

  X = nl.zeros((MT, nl.par_dim(P), npad), dtype=dt, buffer=nl.sbuf)
  Xn = nl.zeros((MT, nl.par_dim(P), npad), dtype=dt, buffer=nl.sbuf)
  XT = nl.zeros((NT, nl.par_dim(P), mp), dtype=dt, buffer=nl.sbuf)
  A = nl.ndarray((MT, nl.par_dim(P), mp), dtype=dt, buffer=nl.sbuf)
  B = nl.ndarray((MT, nl.par_dim(P), mp), dtype=dt, buffer=nl.sbuf)

  # G as it is in HBM: row tiles of X, or of X^T when transposed
  src, rows, cols = (XT, n, m) if transposed else (X, m, n)
  sumsq = nl.zeros((P, 1), dtype=nl.float32)
  for t in nl.affine_range(_cdiv(rows, P)):
    rw = min(P, rows - t * P)
    src[t, 0:rw, 0:cols] = nl.load(g[t * P:t * P + rw, 0:cols])
    sumsq[...] = nl.add(sumsq, nl.sum(nl.square(src[t], dtype=nl.float32), axis=[1], keepdims=True))
  ones = nl.ones((P, P), dtype=nl.float32)
  tot = nisa.nc_matmul(ones, sumsq)  # the sum over all partitions, on every partition
  rnorm = nl.reciprocal(nl.add(nl.sqrt(tot), eps))
  for t in nl.affine_range(_cdiv(rows, P)):
    src[t] = nl.multiply(src[t], rnorm, dtype=dt)
  if transposed:
    for t in nl.affine_range(NT):
      for mt in nl.affine_range(MT):
        X[mt, :, t * P:(t + 1) * P] = nisa.nc_transpose(XT[t, :, mt * P:(mt + 1) * P])

  for it in nl.static_range(steps):
    for mt in nl.affine_range(MT):
      for t in nl.affine_range(NT):
        XT[t, :, mt * P:(mt + 1) * P] = nisa.nc_transpose(X[mt, :, t * P:(t + 1) * P])
    # A = X X^T (contraction over n on the partitions of X^T)
    for mb in nl.affine_range(MT):
      a_ps = nl.zeros((P, mp), dtype=nl.float32, buffer=nl.psum)
      for kt in nl.affine_range(NT):
        a_ps += nisa.nc_matmul(XT[kt, :, mb * P:(mb + 1) * P], XT[kt])
      A[mb] = nl.copy(a_ps, dtype=dt)
    # B = b A + c A A (A symmetric: its row tiles are the stationary tiles of A^T)
    for mb in nl.affine_range(MT):
      a2_ps = nl.zeros((P, mp), dtype=nl.float32, buffer=nl.psum)
      for kt in nl.affine_range(MT):
        a2_ps += nisa.nc_matmul(A[kt, :, mb * P:(mb + 1) * P], A[kt])
      B[mb] = nl.add(nl.multiply(A[mb], NS_B), nl.multiply(a2_ps, NS_C), dtype=dt)
    # X <- a X + B X (B symmetric), one PSUM bank of columns at a time
    for mb in nl.affine_range(MT):
      for c in nl.affine_range(NCH):
        bx_ps = nl.zeros((P, CW), dtype=nl.float32, buffer=nl.psum)
        for kt in nl.affine_range(MT):
          bx_ps += nisa.nc_matmul(B[kt, :, mb * P:(mb + 1) * P], X[kt, :, c * CW:(c + 1) * CW])
        Xn[mb, :, c * CW:(c + 1) * CW] = nl.add(nl.multiply(X[mb, :, c * CW:(c + 1) * CW], NS_A), bx_ps, dtype=dt)
    X, Xn = Xn, X

  if transposed:
    for mt in nl.affine_range(MT):
      for t in nl.affine_range(NT):
        XT[t, :, mt * P:(mt + 1) * P] = nisa.nc_transpose(X[mt, :, t * P:(t + 1) * P])
  res = XT if transposed else X
  for t in nl.affine_range(_cdiv(rows, P)):
    rw = min(P, rows - t * P)
    nl.store(out[t * P:t * P + rw, 0:cols], value=res[t, 0:rw, 0:cols])
  return out


def _cholesky(a, blocked):
  n, n_ = a.shape
  assert n == n_ and n <= 512
  NT = _cdiv(n, P)
  out = nl.ndarray((n, n), dtype=nl.float32, buffer=nl.shared_hbm)
  A = nl.zeros((NT, nl.par_dim(P), n), dtype=nl.float32, buffer=nl.sbuf)
  L = nl.zeros((NT, nl.par_dim(P), n), dtype=nl.float32, buffer=nl.sbuf)
  for t in nl.affine_range(NT):
    rw = min(P, n - t * P)
    A[t, 0:rw, 0:n] = nl.load(a[t * P:t * P + rw, 0:n])

  i_p = nl.arange(P)[:, None]
  i_f = nl.arange(P)[None, :]
  ones = nl.ones((P, P), dtype=nl.float32)
  ident = nisa.affine_select(i_p - i_f == 0, ones, 0.0)

  for kb in nl.sequential_range(NT):
    c0 = kb * P
    bw = min(P, n - c0)
    # the columns the rank-1 updates touch: this block's (blocked) or all the rest (unblocked)
    c1 = c0 + bw if blocked else n
    for j in nl.sequential_range(bw):
      g = c0 + j
      # row g of the matrix on every partition: sel[k, i] = (k == j)
      sel = nl.multiply(ones, ident[:, j:j + 1])
      row_ps = nisa.nc_matmul(sel, A[kb, :, c0:c1])
      inv = nl.rsqrt(row_ps[:, j:j + 1])
      lrow = nl.multiply(row_ps, inv)
      for t in nl.sequential_range(kb, NT):
        lcol = nl.multiply(A[t, :, g:g + 1], inv)
        L[t, :, g:g + 1] = lcol
        A[t, :, c0:c1] = nisa.scalar_tensor_tensor(data=lrow, op0=nl.multiply, operand0=lcol, op1=nl.subtract,
                                                   operand1=A[t, :, c0:c1], reverse1=True)
    # zeros above the diagonal (the eliminated rows leave rounding residue there)
    i_b = nl.arange(bw)[None, :]
    L[kb, :, c0:c0 + bw] = nisa.affine_select(i_p - i_b >= 0, L[kb, :, c0:c0 + bw], 0.0)
    if blocked and kb + 1 < NT:
      # trailing update A_ij -= L_ik L_jk^T for the row tiles below, columns right of the block
      r0 = c0 + P
      LT = nl.ndarray((nl.par_dim(P), n - r0), dtype=nl.float32, buffer=nl.sbuf)
      for t in nl.affine_range(kb + 1, NT):
        tw = min(P, n - t * P)
        LT[0:bw, t * P - r0:t * P - r0 + tw] = nisa.nc_transpose(L[t, 0:tw, c0:c0 + bw])
      for t in nl.affine_range(kb + 1, NT):
        tw = min(P, n - t * P)
        upd = nisa.nc_matmul(LT[0:bw, t * P - r0:t * P - r0 + tw], LT[0:bw, 0:n - r0])
        A[t, 0:tw, r0:n] = nl.subtract(A[t, 0:tw, r0:n], upd)

  for t in nl.affine_range(NT):
    rw = min(P, n - t * P)
    nl.store(out[t * P:t * P + rw, 0:n], value=L[t, 0:rw, 0:n])
  return out


@nki.jit
def cholesky_blocked(a):
  return _cholesky(a, blocked=True)


@nki.jit
def cholesky_unblocked(a):
  return _cholesky(a, blocked=False)


@nki.jit
def covariance_centered(x):
  N, D = x.shape
  assert D <= 512 and N >= 2
  NT, DT = _cdiv(N, P), _cdiv(D, P)
  out = nl.ndarray((D, D), dtype=nl.float32, buffer=nl.shared_hbm)
  xs = nl.ndarray((NT, nl.par_dim(P), D), dtype=x.dtype, buffer=nl.sbuf)
  ones = nl.ones((P, P), dtype=x.dtype)
  colsum = nl.zeros((P, D), dtype=nl.float32, buffer=nl.psum)
  for t in nl.affine_range(NT):
    rw = min(P, N - t * P)
    xs[t, 0:rw, 0:D] = nl.load(x[t * P:t * P + rw, 0:D])
    colsum += nisa.nc_matmul(ones[0:rw, :], xs[t, 0:rw, 0:D])
  mean = nl.multiply(colsum, 1.0 / N)  # [P, D], every partition
  for t in nl.affine_range(NT):
    rw = min(P, N - t * P)
    xs[t, 0:rw, 0:D] = nl.subtract(xs[t, 0:rw, 0:D], mean[0:rw, 0:D], dtype=x.dtype)
  for db in nl.affine_range(DT):
    dw = min(P, D - db * P)
    g_ps = nl.zeros((dw, D), dtype=nl.float32, buffer=nl.psum)
    for t in nl.affine_range(NT):
      rw = min(P, N - t * P)
      g_ps += nisa.nc_matmul(xs[t, 0:rw, db * P:db * P + dw], xs[t, 0:rw, 0:D])
    nl.store(out[db * P:db * P + dw, 0:D], value=nl.multiply(g_ps, 1.0 / (N - 1)))
  return out


@nki.jit
def head_bmm(a, b, pe_tiling=True):
  H, S, S_ = a.shape
  assert S == 32 and S_ == 32 and b.shape == (H, 32, 32)
  G = P // S  # heads per partition tile
  out = nl.ndarray((H, S, S), dtype=nl.float32, buffer=nl.shared_hbm)
  a2 = a.reshape((H * S, S))
  b2 = b.reshape((H * S, S))
  o2 = out.reshape((H * S, S))
  i_s = nl.arange(S)[:, None]
  i_t = nl.arange(S)[None, :]
  for grp in nl.affine_range(_cdiv(H, G)):
    nh = min(G, H - grp * G)
    rw = nh * S
    bt = nl.load(b2[grp * P:grp * P + rw, 0:S])
    at = nl.ndarray((nl.par_dim(P), S), dtype=a.dtype, buffer=nl.sbuf)
    for g in nl.static_range(nh):
      # at[32 g + k, m] = a[h, m, k]
      at[g * S + i_s, i_t] = nl.load(a2[(grp * G + g) * S + i_t, i_s])
    c_ps = nl.zeros((nl.par_dim(P), S), dtype=nl.float32, buffer=nl.psum)
    for g in nl.static_range(nh):
      kw = dict(tile_position=(g * S, g * S), tile_size=(S, S)) if pe_tiling else {}
      c_ps[g * S + i_s, i_t] = nisa.nc_matmul(at[g * S + i_s, i_t], bt[g * S + i_s, i_t], **kw)
    nl.store(o2[grp * P:grp * P + rw, 0:S], value=nl.copy(c_ps[0:rw, 0:S]))
  return out
