"""GEMM shapes and fused PSUM epilogues in the new NKI dialect (``import nki``, ISA calls writing ``dst=``), written
the way public NKI 0.3+ GEMM / projection kernels are (nki-library / NxD-Inference MLP and projection kernels,
community Trainium GEMM ports):

- ``decode_gemv_x_stationary(x, w)``: decode GEMV / skinny GEMM, x [M, K] (M <= 8 tokens) times w [K, N]. x^T is
  brought into SBUF once by a strided DMA (``x.ap``: K on the partitions) and is the *stationary* operand
  ([128, M]); W streams from HBM in K-major tiles [128, NB] and is the *moving* operand, 512 columns (one PSUM
  bank) per ``nc_matmul``; NB / 512 banks accumulate over the K tiles. Output [M, N] fp32.
- ``decode_gemv_w_stationary(x, w)``: the same product with W stationary: each [128 (k), 128 (n)] slice of the
  same streamed W tile is loaded into the PE and x^T [128 (k), M] moves through it (M columns), giving out^T
  [128 (n), M] in PSUM; stored back through a transposing access pattern (``out.ap``).
- ``gemm_bias_act_fused(xT, w, bias, act)`` / ``gemm_bias_act_unfused``: y^T [N, M] = act(W^T x^T + b) in the
  projection layout (output channels on the partitions), so bias is a per-partition vector and bias + GELU/SiLU
  + bf16 cast is ONE ``nisa.activation`` reading PSUM. The unfused version first copies PSUM -> SBUF
  (``tensor_copy``), adds the bias (``tensor_scalar``), applies the activation and casts (``activation``).
- ``gemm_residual_fused(xT, w, residual)`` / ``gemm_residual_unfused``: y [M, N] = x @ W + residual (tokens on the
  partitions): one ``tensor_tensor`` PSUM + SBUF -> bf16 versus copy, add, cast.
- ``gemm_dequant(xT, wq, scale, bias)``: weight-only quantisation: y^T = (W_q^T x^T) * scale[n] + bias[n] with
  int8 weights widened to bf16 on chip (``tensor_copy``) or fp8 (e4m3) weights fed straight to the PE; the
  per-channel scale and the bias are one ``tensor_scalar`` (multiply, add) reading PSUM.
- ``swiglu_fused(xT, w_gate, w_up)``: h^T [I, M] = silu(x W_g)^T * (x W_u)^T, gate and up in one pass over K
  (sharing each x^T tile), silu on ScalarE from PSUM, the product with up read from PSUM, bf16 out.
  ``swiglu_unfused`` evicts both PSUM tiles first.
- ``ksplit_gemm(xT, w)``: out [M, N] bf16 = x @ W with K up to 8192 accumulated in one PSUM tile [128, N]
  (N <= 2048: four 2 KiB banks) over K / 128 ``nc_matmul`` calls per bank (``accumulate=True`` after the
  first).
- ``batched_gemm_t(a, b, mode)`` / ``batched_gemm_pre(aT, b)``: C[i] = A[i] @ B[i] where the stationary operand
  needs A[i]^T: ``mode="pe"`` loads A[i] tiles and transposes them on the PE (``nisa.nc_transpose`` to PSUM, then
  ``tensor_copy`` to SBUF); ``mode="dma"`` loads them with ``nisa.dma_transpose``; ``batched_gemm_pre`` takes
  A^T already transposed in HBM.

Written for nsim's tests in the style of those kernels; not copies of any file. No nsim imports.
"""
import nki
import nki.isa as nisa
import nki.language as nl

P_MAX = 128
PSUM_FMAX = 512  # fp32 per partition in one PSUM bank


def _load_xT(x):
  """x [M, K] in HBM -> SBUF [128, K / 128, M]: element (p, kt, m) = x[m, kt * 128 + p]."""
  M, K = x.shape
  KT = K // P_MAX
  xT = nl.ndarray((P_MAX, KT, M), dtype=x.dtype, buffer=nl.sbuf)
  nisa.dma_copy(dst=xT, src=x.ap(pattern=[[1, P_MAX], [P_MAX, KT], [K, M]], offset=0))
  return xT


@nki.jit
def decode_gemv_x_stationary(x, w, n_block=2048):
  M, K = x.shape
  K_, N = w.shape
  assert K == K_ and M <= 8 and K % P_MAX == 0
  NB = min(n_block, N)
  assert N % NB == 0 and NB % PSUM_FMAX == 0 and NB <= 4 * PSUM_FMAX
  KT = K // P_MAX
  out = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.shared_hbm)
  xT = _load_xT(x)
  for nb in nl.affine_range(N // NB):
    acc = nl.ndarray((M, NB), dtype=nl.float32, buffer=nl.psum)
    for kt in nl.sequential_range(KT):
      w_sb = nl.ndarray((P_MAX, NB), dtype=w.dtype, buffer=nl.sbuf)
      nisa.dma_copy(dst=w_sb, src=w[kt * P_MAX:(kt + 1) * P_MAX, nb * NB:(nb + 1) * NB])
      for j in nl.affine_range(NB // PSUM_FMAX):
        nisa.nc_matmul(dst=acc[:, j * PSUM_FMAX:(j + 1) * PSUM_FMAX], stationary=xT[:, kt, :],
                       moving=w_sb[:, j * PSUM_FMAX:(j + 1) * PSUM_FMAX], accumulate=(kt > 0))
    res = nl.ndarray((M, NB), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=res, src=acc)
    nisa.dma_copy(dst=out[:, nb * NB:(nb + 1) * NB], src=res)
  return out


@nki.jit
def decode_gemv_w_stationary(x, w, n_block=2048):
  M, K = x.shape
  K_, N = w.shape
  assert K == K_ and M <= 8 and K % P_MAX == 0
  NB = min(n_block, N)
  assert N % NB == 0 and NB % P_MAX == 0
  KT = K // P_MAX
  NJ = NB // P_MAX
  out = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.shared_hbm)
  xT = _load_xT(x)
  for nb in nl.affine_range(N // NB):
    accT = nl.ndarray((P_MAX, NJ, M), dtype=nl.float32, buffer=nl.psum)  # NJ * M fp32 <= one bank
    for kt in nl.sequential_range(KT):
      w_sb = nl.ndarray((P_MAX, NB), dtype=w.dtype, buffer=nl.sbuf)
      nisa.dma_copy(dst=w_sb, src=w[kt * P_MAX:(kt + 1) * P_MAX, nb * NB:(nb + 1) * NB])
      for j in nl.affine_range(NJ):
        nisa.nc_matmul(dst=accT[:, j, :], stationary=w_sb[:, j * P_MAX:(j + 1) * P_MAX], moving=xT[:, kt, :],
                       accumulate=(kt > 0))
    resT = nl.ndarray((P_MAX, NJ, M), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=resT, src=accT)
    # (p, j, m) -> out[m, nb * NB + j * 128 + p]
    nisa.dma_copy(dst=out.ap(pattern=[[1, P_MAX], [P_MAX, NJ], [N, M]], offset=nb * NB), src=resT)
  return out


def _proj_T(xT, w, n0, xT_sb):
  """PSUM [128 (n0..n0+127), M] = W[:, n0:n0+128]^T x^T, accumulated over the K tiles."""
  K, M = xT.shape
  KT = K // P_MAX
  ps = nl.ndarray((P_MAX, M), dtype=nl.float32, buffer=nl.psum)
  for kt in nl.sequential_range(KT):
    w_sb = nl.ndarray((P_MAX, P_MAX), dtype=w.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=w_sb, src=w[kt * P_MAX:(kt + 1) * P_MAX, n0:n0 + P_MAX])
    nisa.nc_matmul(dst=ps, stationary=w_sb, moving=xT_sb[:, kt, :], accumulate=(kt > 0))
  return ps


def _load_xT_kmajor(xT):
  K, M = xT.shape
  KT = K // P_MAX
  xT_sb = nl.ndarray((P_MAX, KT, M), dtype=xT.dtype, buffer=nl.sbuf)
  nisa.dma_copy(dst=xT_sb, src=xT.reshape((KT, P_MAX, M)).permute((1, 0, 2)))
  return xT_sb


def _act_op(act):
  return {"gelu": nl.gelu, "silu": nl.silu, "relu": nl.relu}[act]


@nki.jit
def gemm_bias_act_fused(xT, w, bias, act="gelu"):
  K, M = xT.shape
  K_, N = w.shape
  assert K == K_ and K % P_MAX == 0 and N % P_MAX == 0 and M <= PSUM_FMAX
  yT = nl.ndarray((N, M), dtype=nl.bfloat16, buffer=nl.shared_hbm)
  xT_sb = _load_xT_kmajor(xT)
  b_sb = nl.ndarray((P_MAX, N // P_MAX), dtype=nl.float32, buffer=nl.sbuf)
  nisa.dma_copy(dst=b_sb, src=bias.reshape((N // P_MAX, P_MAX)).permute((1, 0)))
  for n in nl.affine_range(N // P_MAX):
    ps = _proj_T(xT, w, n * P_MAX, xT_sb)
    y = nl.ndarray((P_MAX, M), dtype=nl.bfloat16, buffer=nl.sbuf)
    nisa.activation(dst=y, op=_act_op(act), data=ps, bias=b_sb[:, n:n + 1], scale=1.0)
    nisa.dma_copy(dst=yT[n * P_MAX:(n + 1) * P_MAX, :], src=y)
  return yT


@nki.jit
def gemm_bias_act_unfused(xT, w, bias, act="gelu"):
  K, M = xT.shape
  K_, N = w.shape
  assert K == K_ and K % P_MAX == 0 and N % P_MAX == 0 and M <= PSUM_FMAX
  yT = nl.ndarray((N, M), dtype=nl.bfloat16, buffer=nl.shared_hbm)
  xT_sb = _load_xT_kmajor(xT)
  b_sb = nl.ndarray((P_MAX, N // P_MAX), dtype=nl.float32, buffer=nl.sbuf)
  nisa.dma_copy(dst=b_sb, src=bias.reshape((N // P_MAX, P_MAX)).permute((1, 0)))
  for n in nl.affine_range(N // P_MAX):
    ps = _proj_T(xT, w, n * P_MAX, xT_sb)
    h = nl.ndarray((P_MAX, M), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=h, src=ps)
    nisa.tensor_scalar(dst=h, data=h, op0=nl.add, operand0=b_sb[:, n:n + 1])
    a = nl.ndarray((P_MAX, M), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=a, op=_act_op(act), data=h)
    y = nl.ndarray((P_MAX, M), dtype=nl.bfloat16, buffer=nl.sbuf)
    nisa.tensor_copy(dst=y, src=a)
    nisa.dma_copy(dst=yT[n * P_MAX:(n + 1) * P_MAX, :], src=y)
  return yT


def _gemm_residual(xT, w, residual, fused):
  K, M = xT.shape
  K_, N = w.shape
  assert K == K_ and K % P_MAX == 0 and M % P_MAX == 0 and N % PSUM_FMAX == 0
  KT = K // P_MAX
  out = nl.ndarray((M, N), dtype=nl.bfloat16, buffer=nl.shared_hbm)
  xT_sb = _load_xT_kmajor(xT)
  for m in nl.affine_range(M // P_MAX):
    for n in nl.affine_range(N // PSUM_FMAX):
      ps = nl.ndarray((P_MAX, PSUM_FMAX), dtype=nl.float32, buffer=nl.psum)
      for kt in nl.sequential_range(KT):
        w_sb = nl.ndarray((P_MAX, PSUM_FMAX), dtype=w.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=w_sb, src=w[kt * P_MAX:(kt + 1) * P_MAX, n * PSUM_FMAX:(n + 1) * PSUM_FMAX])
        nisa.nc_matmul(dst=ps, stationary=xT_sb[:, kt, m * P_MAX:(m + 1) * P_MAX], moving=w_sb,
                       accumulate=(kt > 0))
      r_sb = nl.ndarray((P_MAX, PSUM_FMAX), dtype=residual.dtype, buffer=nl.sbuf)
      nisa.dma_copy(dst=r_sb, src=residual[m * P_MAX:(m + 1) * P_MAX, n * PSUM_FMAX:(n + 1) * PSUM_FMAX])
      y = nl.ndarray((P_MAX, PSUM_FMAX), dtype=nl.bfloat16, buffer=nl.sbuf)
      if fused:
        nisa.tensor_tensor(dst=y, data1=ps, data2=r_sb, op=nl.add)
      else:
        h = nl.ndarray((P_MAX, PSUM_FMAX), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=h, src=ps)
        s = nl.ndarray((P_MAX, PSUM_FMAX), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=s, data1=h, data2=r_sb, op=nl.add)
        nisa.tensor_copy(dst=y, src=s)
      nisa.dma_copy(dst=out[m * P_MAX:(m + 1) * P_MAX, n * PSUM_FMAX:(n + 1) * PSUM_FMAX], src=y)
  return out


@nki.jit
def gemm_residual_fused(xT, w, residual):
  return _gemm_residual(xT, w, residual, True)


@nki.jit
def gemm_residual_unfused(xT, w, residual):
  return _gemm_residual(xT, w, residual, False)


@nki.jit
def gemm_dequant(xT, wq, scale, bias):
  """wq int8 (widened to bf16 on chip) or float8_e4m3 (fed to the PE as is); scale, bias [N] fp32."""
  K, M = xT.shape
  K_, N = wq.shape
  assert K == K_ and K % P_MAX == 0 and N % P_MAX == 0 and M <= PSUM_FMAX
  KT = K // P_MAX
  yT = nl.ndarray((N, M), dtype=nl.bfloat16, buffer=nl.shared_hbm)
  xT_sb = _load_xT_kmajor(xT)
  s_sb = nl.ndarray((P_MAX, N // P_MAX), dtype=nl.float32, buffer=nl.sbuf)
  nisa.dma_copy(dst=s_sb, src=scale.reshape((N // P_MAX, P_MAX)).permute((1, 0)))
  b_sb = nl.ndarray((P_MAX, N // P_MAX), dtype=nl.float32, buffer=nl.sbuf)
  nisa.dma_copy(dst=b_sb, src=bias.reshape((N // P_MAX, P_MAX)).permute((1, 0)))
  widen = wq.dtype == nl.int8
  for n in nl.affine_range(N // P_MAX):
    ps = nl.ndarray((P_MAX, M), dtype=nl.float32, buffer=nl.psum)
    for kt in nl.sequential_range(KT):
      wq_sb = nl.ndarray((P_MAX, P_MAX), dtype=wq.dtype, buffer=nl.sbuf)
      nisa.dma_copy(dst=wq_sb, src=wq[kt * P_MAX:(kt + 1) * P_MAX, n * P_MAX:(n + 1) * P_MAX])
      if widen:
        w_sb = nl.ndarray((P_MAX, P_MAX), dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.tensor_copy(dst=w_sb, src=wq_sb)
      else:
        w_sb = wq_sb
      nisa.nc_matmul(dst=ps, stationary=w_sb, moving=xT_sb[:, kt, :], accumulate=(kt > 0))
    y = nl.ndarray((P_MAX, M), dtype=nl.bfloat16, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=y, data=ps, op0=nl.multiply, operand0=s_sb[:, n:n + 1], op1=nl.add,
                       operand1=b_sb[:, n:n + 1])
    nisa.dma_copy(dst=yT[n * P_MAX:(n + 1) * P_MAX, :], src=y)
  return yT


def _swiglu(xT, w_gate, w_up, fused):
  K, M = xT.shape
  K_, I = w_gate.shape
  assert K == K_ and w_up.shape == w_gate.shape and K % P_MAX == 0 and I % P_MAX == 0 and M <= PSUM_FMAX
  KT = K // P_MAX
  hT = nl.ndarray((I, M), dtype=nl.bfloat16, buffer=nl.shared_hbm)
  xT_sb = _load_xT_kmajor(xT)
  for i in nl.affine_range(I // P_MAX):
    g_ps = nl.ndarray((P_MAX, M), dtype=nl.float32, buffer=nl.psum)
    u_ps = nl.ndarray((P_MAX, M), dtype=nl.float32, buffer=nl.psum)
    for kt in nl.sequential_range(KT):
      g_sb = nl.ndarray((P_MAX, P_MAX), dtype=w_gate.dtype, buffer=nl.sbuf)
      nisa.dma_copy(dst=g_sb, src=w_gate[kt * P_MAX:(kt + 1) * P_MAX, i * P_MAX:(i + 1) * P_MAX])
      u_sb = nl.ndarray((P_MAX, P_MAX), dtype=w_up.dtype, buffer=nl.sbuf)
      nisa.dma_copy(dst=u_sb, src=w_up[kt * P_MAX:(kt + 1) * P_MAX, i * P_MAX:(i + 1) * P_MAX])
      nisa.nc_matmul(dst=g_ps, stationary=g_sb, moving=xT_sb[:, kt, :], accumulate=(kt > 0))
      nisa.nc_matmul(dst=u_ps, stationary=u_sb, moving=xT_sb[:, kt, :], accumulate=(kt > 0))
    h = nl.ndarray((P_MAX, M), dtype=nl.bfloat16, buffer=nl.sbuf)
    sg = nl.ndarray((P_MAX, M), dtype=nl.float32, buffer=nl.sbuf)
    if fused:
      nisa.activation(dst=sg, op=nl.silu, data=g_ps)
      nisa.tensor_tensor(dst=h, data1=sg, data2=u_ps, op=nl.multiply)
    else:
      g = nl.ndarray((P_MAX, M), dtype=nl.float32, buffer=nl.sbuf)
      nisa.tensor_copy(dst=g, src=g_ps)
      u = nl.ndarray((P_MAX, M), dtype=nl.float32, buffer=nl.sbuf)
      nisa.tensor_copy(dst=u, src=u_ps)
      nisa.activation(dst=sg, op=nl.silu, data=g)
      p = nl.ndarray((P_MAX, M), dtype=nl.float32, buffer=nl.sbuf)
      nisa.tensor_tensor(dst=p, data1=sg, data2=u, op=nl.multiply)
      nisa.tensor_copy(dst=h, src=p)
    nisa.dma_copy(dst=hT[i * P_MAX:(i + 1) * P_MAX, :], src=h)
  return hT


@nki.jit
def swiglu_fused(xT, w_gate, w_up):
  return _swiglu(xT, w_gate, w_up, True)


@nki.jit
def swiglu_unfused(xT, w_gate, w_up):
  return _swiglu(xT, w_gate, w_up, False)


@nki.jit
def ksplit_gemm(xT, w):
  K, M = xT.shape
  K_, N = w.shape
  assert K == K_ and K % P_MAX == 0 and M % P_MAX == 0 and N % PSUM_FMAX == 0 and N <= 4 * PSUM_FMAX
  KT = K // P_MAX
  NJ = N // PSUM_FMAX
  out = nl.ndarray((M, N), dtype=nl.bfloat16, buffer=nl.shared_hbm)
  for m in nl.affine_range(M // P_MAX):
    acc = nl.ndarray((P_MAX, N), dtype=nl.float32, buffer=nl.psum)  # N / 512 banks
    for kt in nl.sequential_range(KT):
      x_sb = nl.ndarray((P_MAX, P_MAX), dtype=xT.dtype, buffer=nl.sbuf)
      nisa.dma_copy(dst=x_sb, src=xT[kt * P_MAX:(kt + 1) * P_MAX, m * P_MAX:(m + 1) * P_MAX])
      w_sb = nl.ndarray((P_MAX, N), dtype=w.dtype, buffer=nl.sbuf)
      nisa.dma_copy(dst=w_sb, src=w[kt * P_MAX:(kt + 1) * P_MAX, :])
      for j in nl.affine_range(NJ):
        nisa.nc_matmul(dst=acc[:, j * PSUM_FMAX:(j + 1) * PSUM_FMAX], stationary=x_sb,
                       moving=w_sb[:, j * PSUM_FMAX:(j + 1) * PSUM_FMAX], accumulate=(kt > 0))
    y = nl.ndarray((P_MAX, N), dtype=nl.bfloat16, buffer=nl.sbuf)
    nisa.tensor_copy(dst=y, src=acc)
    nisa.dma_copy(dst=out[m * P_MAX:(m + 1) * P_MAX, :], src=y)
  return out


@nki.jit
def batched_gemm_t(a, b, mode="pe"):
  """a [B, M, K], b [B, K, N] (M, K multiples of 128, N <= 512): C[i] = a[i] @ b[i], fp32."""
  B, M, K = a.shape
  B_, K_, N = b.shape
  assert B == B_ and K == K_ and M % P_MAX == 0 and K % P_MAX == 0 and N <= PSUM_FMAX
  KT = K // P_MAX
  c = nl.ndarray((B, M, N), dtype=nl.float32, buffer=nl.shared_hbm)
  for i in nl.affine_range(B):
    b_sb = nl.ndarray((P_MAX, KT, N), dtype=b.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=b_sb, src=b[i].reshape((KT, P_MAX, N)).permute((1, 0, 2)))
    for m in nl.affine_range(M // P_MAX):
      ps = nl.ndarray((P_MAX, N), dtype=nl.float32, buffer=nl.psum)
      for kt in nl.sequential_range(KT):
        aT = nl.ndarray((P_MAX, P_MAX), dtype=a.dtype, buffer=nl.sbuf)
        if mode == "pe":
          a_sb = nl.ndarray((P_MAX, P_MAX), dtype=a.dtype, buffer=nl.sbuf)
          nisa.dma_copy(dst=a_sb, src=a[i, m * P_MAX:(m + 1) * P_MAX, kt * P_MAX:(kt + 1) * P_MAX])
          aT_ps = nl.ndarray((P_MAX, P_MAX), dtype=a.dtype, buffer=nl.psum)
          nisa.nc_transpose(dst=aT_ps, data=a_sb)
          nisa.tensor_copy(dst=aT, src=aT_ps)
        else:
          nisa.dma_transpose(dst=aT, src=a[i, m * P_MAX:(m + 1) * P_MAX, kt * P_MAX:(kt + 1) * P_MAX])
        nisa.nc_matmul(dst=ps, stationary=aT, moving=b_sb[:, kt, :], accumulate=(kt > 0))
      res = nl.ndarray((P_MAX, N), dtype=nl.float32, buffer=nl.sbuf)
      nisa.tensor_copy(dst=res, src=ps)
      nisa.dma_copy(dst=c[i, m * P_MAX:(m + 1) * P_MAX, :], src=res)
  return c


@nki.jit
def batched_gemm_pre(aT, b):
  """aT [B, K, M] (A already transposed in HBM), b [B, K, N]: C[i] = aT[i]^T @ b[i], fp32."""
  B, K, M = aT.shape
  B_, K_, N = b.shape
  assert B == B_ and K == K_ and M % P_MAX == 0 and K % P_MAX == 0 and N <= PSUM_FMAX
  KT = K // P_MAX
  c = nl.ndarray((B, M, N), dtype=nl.float32, buffer=nl.shared_hbm)
  for i in nl.affine_range(B):
    b_sb = nl.ndarray((P_MAX, KT, N), dtype=b.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=b_sb, src=b[i].reshape((KT, P_MAX, N)).permute((1, 0, 2)))
    for m in nl.affine_range(M // P_MAX):
      ps = nl.ndarray((P_MAX, N), dtype=nl.float32, buffer=nl.psum)
      for kt in nl.sequential_range(KT):
        aT_sb = nl.ndarray((P_MAX, P_MAX), dtype=aT.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=aT_sb, src=aT[i, kt * P_MAX:(kt + 1) * P_MAX, m * P_MAX:(m + 1) * P_MAX])
        nisa.nc_matmul(dst=ps, stationary=aT_sb, moving=b_sb[:, kt, :], accumulate=(kt > 0))
      res = nl.ndarray((P_MAX, N), dtype=nl.float32, buffer=nl.sbuf)
      nisa.tensor_copy(dst=res, src=ps)
      nisa.dma_copy(dst=c[i, m * P_MAX:(m + 1) * P_MAX, :], src=res)
  return c
