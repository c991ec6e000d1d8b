"""GEMM shapes and PSUM epilogues in the Beta-1 dialect (``neuronxcc.nki``), written the way public Beta-1 GEMM
kernels are (the nki-samples matrix-multiplication tutorial, NxD-Inference MLP / MoE kernels of SDK 2.2x,
community Trainium GEMM ports): arange index expressions, value-returning ``nl`` / ``nisa`` calls, masks for
ragged tiles, ``psum[...] += nisa.nc_matmul(...)`` accumulation.

- ``decode_gemv_b1(x, w)``: decode GEMV, x [M, K] (M <= 8) times w [K, N] fp32 out. x^T tiles [128 (k), M] are
  loaded through a transposing index expression (``x[i_m, k0 + i_k]`` with i_k on the partitions) and are the
  stationary operand; W streams in K-major tiles [128, NB], 512 columns (one PSUM bank) per matmul, into a
  block-dim PSUM accumulator ``nl.zeros((NB / 512, nl.par_dim(M), 512), buffer=nl.psum)``.
- ``mlp_epilogue_b1(xT, w, bias, residual, act)``: y [M, N] = act(x @ W + bias) (+ residual), bf16. Tokens on
  the partitions, so the bias is a row vector broadcast to the partitions (``broadcast_to``); the epilogue reads
  PSUM directly: ``nl.add(psum, bias)`` then ``nl.gelu`` / ``nl.silu`` with ``dtype=nl.bfloat16``.
  ``mlp_epilogue_b1_unfused``: ``nl.copy(psum)`` to SBUF first, then the same ops, then an explicit cast.
- ``ksplit_gemm_b1(xT, w)``: K up to 8192 accumulated with ``res_psum[j, i_p, i_f] += nisa.nc_matmul(...)``
  into a [N / 512, par_dim(128), 512] PSUM tile (one bank per block), evicted once as bf16.
- ``grouped_gemm_b1(xT, w, group_sizes)``: MoE-style grouped GEMM over static groups of tokens sorted by expert:
  out[t0_g:t0_g + s_g] = x[t0_g:t0_g + s_g] @ w[g]. Each group is cut into 128-token tiles; the last tile of a
  group whose size is not a multiple of 128 is partial: its load, matmul and store carry
  ``mask=(t * 128 + i < s_g)``. xT [K, T] (hidden transposed, as MoE kernels take it), w [G, K, N].
- ``batched_gemm_b1(a, b)`` / ``batched_gemm_b1_pre(aT, b)``: C[i] = A[i] @ B[i] (fp32 out) with the stationary
  A[i]^T tiles loaded by ``nl.load_transpose2d`` (the DMA transposes), or read from an A^T [B, K, M] that the
  caller transposed in HBM.

Written for nsim's tests in the style of those kernels; not copies of any file. No nsim imports.
"""
import numpy as np

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl

PMAX = 128
FMAX_MOVING = 512


@nki.jit
def decode_gemv_b1(x, w, n_block=2048):
  M, K = x.shape
  K_, N = w.shape
  assert K == K_ and M <= 8 and K % PMAX == 0
  NB = min(n_block, N)
  assert N % NB == 0 and NB % FMAX_MOVING == 0
  NJ = NB // FMAX_MOVING
  out = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.shared_hbm)

  i_kp = nl.arange(PMAX)[:, None]
  i_mf = nl.arange(M)[None, :]
  i_mp = nl.arange(M)[:, None]
  i_nf = nl.arange(FMAX_MOVING)[None, :]
  i_bf = nl.arange(NB)[None, :]

  # x^T, K-major: xT[kt][k, m] = x[m, kt * 128 + k]
  xT = nl.ndarray((K // PMAX, nl.par_dim(PMAX), M), dtype=x.dtype, buffer=nl.sbuf)
  for kt in nl.affine_range(K // PMAX):
    xT[kt, i_kp, i_mf] = nl.load(x[i_mf, kt * PMAX + i_kp])

  for nb in nl.affine_range(N // NB):
    acc = nl.zeros((NJ, nl.par_dim(M), FMAX_MOVING), dtype=nl.float32, buffer=nl.psum)
    for kt in nl.affine_range(K // PMAX):
      w_t = nl.load(w[kt * PMAX + i_kp, nb * NB + i_bf])
      for j in nl.affine_range(NJ):
        acc[j, i_mp, i_nf] += nisa.nc_matmul(xT[kt, i_kp, i_mf], w_t[i_kp, j * FMAX_MOVING + i_nf])
    for j in nl.affine_range(NJ):
      nl.store(out[i_mp, nb * NB + j * FMAX_MOVING + i_nf], value=nl.copy(acc[j, i_mp, i_nf], dtype=nl.float32))
  return out


def _mlp_epilogue(xT, w, bias, residual, act, fused):
  K, M = xT.shape
  K_, N = w.shape
  assert K == K_ and K % PMAX == 0 and M % PMAX == 0 and N % FMAX_MOVING == 0
  out = nl.ndarray((M, N), dtype=nl.bfloat16, buffer=nl.shared_hbm)
  i_p = nl.arange(PMAX)[:, None]
  i_f = nl.arange(PMAX)[None, :]
  i_n = nl.arange(FMAX_MOVING)[None, :]
  fn = nl.gelu if act == "gelu" else nl.silu
  bias2 = bias.reshape((1, N))
  for n in nl.affine_range(N // FMAX_MOVING):
    b_row = nl.load(bias2[0:1, n * FMAX_MOVING:(n + 1) * FMAX_MOVING])
    b_t = b_row.broadcast_to((PMAX, FMAX_MOVING))
    for m in nl.affine_range(M // PMAX):
      ps = nl.zeros((PMAX, FMAX_MOVING), dtype=nl.float32, buffer=nl.psum)
      for kt in nl.affine_range(K // PMAX):
        x_t = nl.load(xT[kt * PMAX + i_p, m * PMAX + i_f])
        w_t = nl.load(w[kt * PMAX + i_p, n * FMAX_MOVING + i_n])
        ps += nisa.nc_matmul(x_t, w_t)
      if fused:
        h = fn(nl.add(ps, b_t), dtype=nl.float32 if residual is not None else nl.bfloat16)
      else:
        h_sb = nl.copy(ps, dtype=nl.float32)
        h = fn(nl.add(h_sb, b_t))
      if residual is not None:
        r = nl.load(residual[m * PMAX + i_p, n * FMAX_MOVING + i_n])
        h = nl.add(h, r, dtype=nl.bfloat16 if fused else nl.float32)
      if not fused:
        h = nl.copy(h, dtype=nl.bfloat16)
      nl.store(out[m * PMAX + i_p, n * FMAX_MOVING + i_n], value=h)
  return out


@nki.jit
def mlp_epilogue_b1(xT, w, bias, residual=None, act="gelu"):
  return _mlp_epilogue(xT, w, bias, residual, act, True)


@nki.jit
def mlp_epilogue_b1_unfused(xT, w, bias, residual=None, act="gelu"):
  return _mlp_epilogue(xT, w, bias, residual, act, False)


@nki.jit
def ksplit_gemm_b1(xT, w):
  K, M = xT.shape
  K_, N = w.shape
  assert K == K_ and K % PMAX == 0 and M % PMAX == 0 and N % FMAX_MOVING == 0
  NJ = N // FMAX_MOVING
  out = nl.ndarray((M, N), dtype=nl.bfloat16, buffer=nl.shared_hbm)
  i_p = nl.arange(PMAX)[:, None]
  i_f = nl.arange(PMAX)[None, :]
  i_n = nl.arange(FMAX_MOVING)[None, :]
  i_w = nl.arange(N)[None, :]
  for m in nl.affine_range(M // PMAX):
    res_psum = nl.zeros((NJ, nl.par_dim(PMAX), FMAX_MOVING), dtype=nl.float32, buffer=nl.psum)
    for kt in nl.affine_range(K // PMAX):
      x_t = nl.load(xT[kt * PMAX + i_p, m * PMAX + i_f])
      w_t = nl.load(w[kt * PMAX + i_p, i_w])
      for j in nl.affine_range(NJ):
        res_psum[j, i_p, i_n] += nisa.nc_matmul(x_t, w_t[i_p, j * FMAX_MOVING + i_n])
    for j in nl.affine_range(NJ):
      y = nl.copy(res_psum[j, i_p, i_n], dtype=nl.bfloat16)
      nl.store(out[m * PMAX + i_p, j * FMAX_MOVING + i_n], value=y)
  return out


@nki.jit
def grouped_gemm_b1(xT, w, group_sizes):
  K, T = xT.shape
  G, K_, N = w.shape
  assert K == K_ and K % PMAX == 0 and N <= FMAX_MOVING and len(group_sizes) == G and sum(group_sizes) == T
  out = nl.ndarray((T, N), dtype=nl.float32, buffer=nl.shared_hbm)
  i_p = nl.arange(PMAX)[:, None]
  i_f = nl.arange(PMAX)[None, :]
  i_n = nl.arange(N)[None, :]
  t0 = 0
  for g in nl.static_range(G):
    s = group_sizes[g]
    for t in nl.affine_range((s + PMAX - 1) // PMAX):
      ps = nl.zeros((PMAX, N), dtype=nl.float32, buffer=nl.psum)
      for kt in nl.affine_range(K // PMAX):
        x_t = nl.load(xT[kt * PMAX + i_p, t0 + t * PMAX + i_f], mask=(t * PMAX + i_f < s))
        w_t = nl.load(w[g, kt * PMAX + i_p, i_n])
        ps += nisa.nc_matmul(x_t[i_p, i_f], w_t, mask=(t * PMAX + i_f < s))
      y = nl.copy(ps, dtype=nl.float32, mask=(t * PMAX + i_p < s))
      nl.store(out[t0 + t * PMAX + i_p, i_n], value=y, mask=(t * PMAX + i_p < s))
    t0 += s
  return out


@nki.jit
def batched_gemm_b1(a, b):
  B, M, K = a.shape
  B_, K_, N = b.shape
  assert B == B_ and K == K_ and M % PMAX == 0 and K % PMAX == 0 and N <= FMAX_MOVING
  c = nl.ndarray((B, M, N), dtype=nl.float32, buffer=nl.shared_hbm)
  i_p = nl.arange(PMAX)[:, None]
  i_n = nl.arange(N)[None, :]
  for i in nl.affine_range(B):
    for m in nl.affine_range(M // PMAX):
      ps = nl.zeros((PMAX, N), dtype=nl.float32, buffer=nl.psum)
      for kt in nl.affine_range(K // PMAX):
        aT = nl.load_transpose2d(a[i, m * PMAX:(m + 1) * PMAX, kt * PMAX:(kt + 1) * PMAX])
        b_t = nl.load(b[i, kt * PMAX + i_p, i_n])
        ps += nisa.nc_matmul(aT, b_t)
      nl.store(c[i, m * PMAX + i_p, i_n], value=nl.copy(ps, dtype=nl.float32))
  return c


@nki.jit
def batched_gemm_b1_pre(aT, b):
  B, K, M = aT.shape
  B_, K_, N = b.shape
  assert B == B_ and K == K_ and M % PMAX == 0 and K % PMAX == 0 and N <= FMAX_MOVING
  c = nl.ndarray((B, M, N), dtype=nl.float32, buffer=nl.shared_hbm)
  i_p = nl.arange(PMAX)[:, None]
  i_f = nl.arange(PMAX)[None, :]
  i_n = nl.arange(N)[None, :]
  for i in nl.affine_range(B):
    for m in nl.affine_range(M // PMAX):
      ps = nl.zeros((PMAX, N), dtype=nl.float32, buffer=nl.psum)
      for kt in nl.affine_range(K // PMAX):
        a_t = nl.load(aT[i, kt * PMAX + i_p, m * PMAX + i_f])
        b_t = nl.load(b[i, kt * PMAX + i_p, i_n])
        ps += nisa.nc_matmul(a_t, b_t)
      nl.store(c[i, m * PMAX + i_p, i_n], value=nl.copy(ps, dtype=nl.float32))
  return c
