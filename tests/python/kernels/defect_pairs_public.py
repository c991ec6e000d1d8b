"""Defect/fix pairs written the way public NKI kernels (nki-samples, nki-library, vLLM / NxD-Inference ports) are
written, each "before" kernel with one performance defect their authors commonly make, marked ``# DEFECT`` on
the line that causes it, and its "after" fix (same numerics):

1. ``gelu_gate_thrash`` / ``gelu_gate_grouped`` (new dialect): an MLP gate that alternates ``gelu`` and ``exp``
   (two ScalarE activation table sets) on every tile of its loop, so every activation reloads a function table;
   the fix runs all the gelus, then all the exps (two table loads in all).
2. ``scores_exp_scalar_evac`` / ``scores_exp_vector_evac`` (Beta 1): a q k^T score block evacuated from PSUM by a
   ScalarE copy (``nisa.activation(op=nl.copy)``) right before the ScalarE exp that consumes it, so the copies
   queue on the engine the exps need; the fix evacuates with VectorE's ``nisa.tensor_copy``.
3. ``proj_reload_weights`` / ``proj_hoisted_weights`` (new dialect, an NxDI-style projection out^T = w^T x^T): the
   stationary weight block loaded from HBM again for every 512-token block; the fix loads it once before the loop.
4. ``transpose_by_strided_dma`` / ``transpose_by_dma_transpose`` (new dialect): x [M, K] loaded transposed (K on the
   partitions) by a DMA whose innermost HBM dim has stride K (one 2-byte descriptor per element); the fix uses
   the DMA engines' transposing mode (``nisa.dma_transpose``), which reads contiguous rows.
5. ``silu_gate_dma_on_scalar`` / ``silu_gate_dma_default`` (new dialect): every load and store of a SiLU gate pinned
   to the hardware DGE (``dge_mode=hwdge``: triggered from ScalarE, ~600 ns of ScalarE time each), the engine the
   gate's activations need; the fix leaves the trigger engine and queues to the compiler (Sync, spread queues).
6. ``colsum_by_transpose`` / ``colsum_by_matmul`` (Beta 1): the per-column sums of x [N, F] (the reduction over
   the partition axis) computed by transposing each 128 x 128 block on the PE array and reducing it along the
   free axis with ``tensor_reduce``; the fix contracts the partition axis with one ones-vector matmul per block
   (TensorE reduces over partitions for free).

7. ``exp_rows_sequential`` / ``exp_rows_affine`` (Beta 1): a row-tile loop with no loop-carried dependency marked
   ``nl.sequential_range`` instead of ``nl.affine_range``. Not a defect in nsim: its loop-carried dependencies are
   its data dependencies only (docs/timing-model.md, "List scheduling"), so both run the same schedule.

Written for nsim's tests in the style of those kernels; not copies of any file. No nsim imports: ``neuronxcc.nki``
and ``nki`` are resolved by ``nsim.compat``.
"""
import neuronxcc.nki as bnki
import neuronxcc.nki.isa as bisa
import neuronxcc.nki.language as bl

import nki
import nki.isa as nisa
import nki.language as nl

PMAX = 128


# ==================================================================================================
# 1. activation table thrash (new dialect)
# ==================================================================================================
# Cost model (neuroncore.md 3.2, configs scalar.act_table_sets / act_table_load): gelu and exp are in different
# table sets, so each activation after the other function pays scalar.act_table_load = 1330 ns on ScalarE on top
# of its max(64, N) cycles. Before: 2 * NT switches (NT row tiles); after: 2. With NT = 8 and N = 512 columns
# (427 ns per activation at 1.2 GHz) ScalarE does 16 x 427 + 16 x 1330 = 28.1 us before, 16 x 427 + 2 x 1330 =
# 9.5 us after: the fix should save ~18.6 us (14 table loads) when ScalarE is the bottleneck.

@nki.jit
def gelu_gate_thrash(x):
  n, f = x.shape
  out = nl.ndarray((n, f), dtype=x.dtype, buffer=nl.shared_hbm)
  for i in nl.affine_range(n // PMAX):
    xt = nl.ndarray((PMAX, f), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=xt, src=x[i * PMAX:(i + 1) * PMAX, :])
    g = nl.ndarray((PMAX, f), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=g, op=nl.gelu, data=xt)  # DEFECT
    e = nl.ndarray((PMAX, f), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=e, op=nl.exp, data=xt, scale=-1.0)  # DEFECT
    y = nl.ndarray((PMAX, f), dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=y, data1=g, data2=e, op=nl.multiply)
    nisa.dma_copy(dst=out[i * PMAX:(i + 1) * PMAX, :], src=y)
  return out


@nki.jit
def gelu_gate_grouped(x):
  n, f = x.shape
  nt = n // PMAX
  out = nl.ndarray((n, f), dtype=x.dtype, buffer=nl.shared_hbm)
  xs = nl.ndarray((PMAX, nt, f), dtype=x.dtype, buffer=nl.sbuf)
  g = nl.ndarray((PMAX, nt, f), dtype=nl.float32, buffer=nl.sbuf)
  e = nl.ndarray((PMAX, nt, f), dtype=nl.float32, buffer=nl.sbuf)
  for i in nl.affine_range(nt):
    nisa.dma_copy(dst=xs[:, i, :], src=x[i * PMAX:(i + 1) * PMAX, :])
  for i in nl.affine_range(nt):  # all gelus, then all exps: one table switch
    nisa.activation(dst=g[:, i, :], op=nl.gelu, data=xs[:, i, :])
  for i in nl.affine_range(nt):
    nisa.activation(dst=e[:, i, :], op=nl.exp, data=xs[:, i, :], scale=-1.0)
  for i in nl.affine_range(nt):
    y = nl.ndarray((PMAX, f), dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=y, data1=g[:, i, :], data2=e[:, i, :], op=nl.multiply)
    nisa.dma_copy(dst=out[i * PMAX:(i + 1) * PMAX, :], src=y)
  return out


# ==================================================================================================
# 2. PSUM evacuated by ScalarE in front of ScalarE's exps (Beta 1)
# ==================================================================================================
# Cost model (neuroncore.md 3.2): an activation costs max(64, N) ScalarE cycles at 1.2 GHz, a tensor_copy
# max(64, N) VectorE cycles at 0.96 GHz. Per [128, 512] score block ScalarE does copy + exp = 2 x 427 ns before,
# 427 ns after; VectorE, otherwise idle, takes the copy (533 ns). With 32 blocks (s_q = 512, s_k = 4096) ScalarE's
# 27.3 us become 13.7 us and VectorE's 17.1 us is the new bound: the fix should save ~10 us.

@bnki.jit
def scores_exp_scalar_evac(qT, kT):
  d, s_q = qT.shape
  _, s_k = kT.shape
  probs = bl.ndarray((s_q, s_k), dtype=bl.bfloat16, buffer=bl.shared_hbm)
  q_sb = bl.load(qT)
  k_sb = bl.load(kT)
  for i in bl.affine_range(s_q // PMAX):
    s = bl.ndarray((bl.par_dim(PMAX), s_k), dtype=bl.float32, buffer=bl.sbuf)
    e = bl.ndarray((bl.par_dim(PMAX), s_k), dtype=bl.bfloat16, buffer=bl.sbuf)
    for j in bl.affine_range(s_k // 512):
      ps = bisa.nc_matmul(q_sb[:, i * PMAX:(i + 1) * PMAX], k_sb[:, j * 512:(j + 1) * 512])
      s[:, j * 512:(j + 1) * 512] = bisa.activation(op=bl.copy, data=ps, dtype=bl.float32)  # DEFECT
      e[:, j * 512:(j + 1) * 512] = bisa.activation(op=bl.exp, data=s[:, j * 512:(j + 1) * 512], scale=0.125,
                                                    dtype=bl.bfloat16)
    bl.store(probs[i * PMAX:(i + 1) * PMAX, :], value=e)
  return probs


@bnki.jit
def scores_exp_vector_evac(qT, kT):
  d, s_q = qT.shape
  _, s_k = kT.shape
  probs = bl.ndarray((s_q, s_k), dtype=bl.bfloat16, buffer=bl.shared_hbm)
  q_sb = bl.load(qT)
  k_sb = bl.load(kT)
  for i in bl.affine_range(s_q // PMAX):
    s = bl.ndarray((bl.par_dim(PMAX), s_k), dtype=bl.float32, buffer=bl.sbuf)
    e = bl.ndarray((bl.par_dim(PMAX), s_k), dtype=bl.bfloat16, buffer=bl.sbuf)
    for j in bl.affine_range(s_k // 512):
      ps = bisa.nc_matmul(q_sb[:, i * PMAX:(i + 1) * PMAX], k_sb[:, j * 512:(j + 1) * 512])
      s[:, j * 512:(j + 1) * 512] = bisa.tensor_copy(ps, dtype=bl.float32, engine=bisa.vector_engine)
      e[:, j * 512:(j + 1) * 512] = bisa.activation(op=bl.exp, data=s[:, j * 512:(j + 1) * 512], scale=0.125,
                                                    dtype=bl.bfloat16)
    bl.store(probs[i * PMAX:(i + 1) * PMAX, :], value=e)
  return probs


# ==================================================================================================
# 3. stationary (lhsT) tiles reloaded for every output column block (Beta 1, matmul tutorial loop)
# ==================================================================================================
# Cost model (3.3): the weights w [K, M] are read T / 512 times instead of once. K = 2048, M = 256, T = 2048 (bf16):
# 4 x 1 MiB of weights instead of 1 MiB, besides 8 MiB of tokens and 2 MiB of fp32 output; the kernel is
# DMA-bound (TensorE: 64 matmuls x 213 ns = 13.7 us), so dropping 3 MiB at 362.5 GB/s should save ~8.7 us.

def _proj(hoisted):
  """out^T [M, T] = w^T @ x^T, weights w [K, M] stationary (M = 128 per output row tile), tokens x^T [K, T] moving
  512 at a time; each DMA moves a [128, K / 128, cols] block (one descriptor row per partition and k tile)."""
  @nki.jit
  def proj(w, xT):
    K, M = w.shape
    _, T = xT.shape
    kt = K // PMAX
    outT = nl.ndarray((M, T), dtype=nl.float32, buffer=nl.shared_hbm)
    if hoisted:
      w_sb = nl.ndarray((PMAX, kt, M), dtype=w.dtype, buffer=nl.sbuf)
      nisa.dma_copy(dst=w_sb, src=w.ap([[M, PMAX], [PMAX * M, kt], [1, M]]))
    for t in nl.affine_range(T // 512):
      if not hoisted:
        w_sb = nl.ndarray((PMAX, kt, M), dtype=w.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=w_sb, src=w.ap([[M, PMAX], [PMAX * M, kt], [1, M]]))  # DEFECT
      x_sb = nl.ndarray((PMAX, kt, 512), dtype=xT.dtype, buffer=nl.sbuf)
      nisa.dma_copy(dst=x_sb, src=xT.ap([[T, PMAX], [PMAX * T, kt], [1, 512]], offset=t * 512))
      for mo in nl.affine_range(M // PMAX):
        ps = nl.ndarray((PMAX, 512), dtype=nl.float32, buffer=nl.psum)
        for k in nl.affine_range(kt):
          nisa.nc_matmul(dst=ps, stationary=w_sb[:, k, mo * PMAX:(mo + 1) * PMAX], moving=x_sb[:, k, :])
        res = nl.ndarray((PMAX, 512), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=res, src=ps)
        nisa.dma_copy(dst=outT[mo * PMAX:(mo + 1) * PMAX, t * 512:(t + 1) * 512], src=res)
    return outT
  return proj


proj_reload_weights = _proj(False)
proj_hoisted_weights = _proj(True)


# ==================================================================================================
# 4. transposed load by a DMA with a strided innermost dim (new dialect)
# ==================================================================================================
# Cost model (3.3): an SBUF-side row of the strided view is M one-element (2-byte) DMA buffers, each at least
# dma.desc_min (10 ns): a [128, M] tile is 128 x M descriptors over 16 engines, M x 80 ns per tile (82 us for
# M = 1024), against 256 KiB at 0.9 x 362.5 GB/s (~0.8 us) for dma_transpose. The fix should save nearly all
# of the strided loads' time (8 tiles: ~650 us).

def _xT_matmul(strided):
  @nki.jit
  def xw(x, w):
    m, k = x.shape
    _, n = w.shape
    kt = k // PMAX
    out = nl.ndarray((m, n), dtype=nl.float32, buffer=nl.shared_hbm)
    ws = nl.ndarray((PMAX, kt, n), dtype=w.dtype, buffer=nl.sbuf)
    for t in nl.affine_range(kt):
      nisa.dma_copy(dst=ws[:, t, :], src=w[t * PMAX:(t + 1) * PMAX, :])
    xT = nl.ndarray((PMAX, kt, m), dtype=x.dtype, buffer=nl.sbuf)
    for t in nl.affine_range(kt):
      if strided:
        nisa.dma_copy(dst=xT[:, t, :], src=x[:, t * PMAX:(t + 1) * PMAX].T)  # DEFECT
      else:
        nisa.dma_transpose(dst=xT[:, t, :], src=x[:, t * PMAX:(t + 1) * PMAX])
    for i in nl.affine_range(m // PMAX):
      ps = nl.ndarray((PMAX, n), dtype=nl.float32, buffer=nl.psum)
      for t in nl.affine_range(kt):
        nisa.nc_matmul(dst=ps, stationary=xT[:, t, i * PMAX:(i + 1) * PMAX], moving=ws[:, t, :])
      res = nl.ndarray((PMAX, n), dtype=nl.float32, buffer=nl.sbuf)
      nisa.tensor_copy(dst=res, src=ps)
      nisa.dma_copy(dst=out[i * PMAX:(i + 1) * PMAX, :], src=res)
    return out
  return xw


transpose_by_strided_dma = _xT_matmul(True)
transpose_by_dma_transpose = _xT_matmul(False)


# ==================================================================================================
# 5. every DMA triggered from ScalarE (hwdge) in a ScalarE-heavy kernel (new dialect)
# ==================================================================================================
# Cost model (3.3): an hwdge trigger is dma.hwdge_instr = 600 ns of ScalarE time; a Sync (static descriptor)
# trigger 80 ns on Sync. SiLU gate per [128, 512] tile: one ScalarE activation (427 ns) and a VectorE multiply.
# Three DMAs per tile (x, g, out) pinned to ScalarE add 1800 ns per tile to ScalarE: 32 tiles -> ScalarE 71.3 us
# before, 13.7 us after, against 12 MiB of DMA (34.7 us at 362.5 GB/s): the fix can save up to ~37 us (down to
# the DMA time; its 1 KiB-per-partition transfers keep it above that).

def _silu_gate(dge):
  @nki.jit
  def silu_gate(x, g):
    n, f = x.shape
    out = nl.ndarray((n, f), dtype=x.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(n // PMAX):
      xt = nl.ndarray((PMAX, f), dtype=x.dtype, buffer=nl.sbuf)
      gt = nl.ndarray((PMAX, f), dtype=g.dtype, buffer=nl.sbuf)
      nisa.dma_copy(dst=xt, src=x[i * PMAX:(i + 1) * PMAX, :], dge_mode=dge)  # DEFECT
      nisa.dma_copy(dst=gt, src=g[i * PMAX:(i + 1) * PMAX, :], dge_mode=dge)  # DEFECT
      sg = nl.ndarray((PMAX, f), dtype=nl.float32, buffer=nl.sbuf)
      nisa.activation(dst=sg, op=nl.silu, data=gt)
      y = nl.ndarray((PMAX, f), dtype=x.dtype, buffer=nl.sbuf)
      nisa.tensor_tensor(dst=y, data1=sg, data2=xt, op=nl.multiply, engine=nisa.engine.vector)
      nisa.dma_copy(dst=out[i * PMAX:(i + 1) * PMAX, :], src=y, dge_mode=dge)  # DEFECT
    return out
  return silu_gate


silu_gate_dma_on_scalar = _silu_gate(nisa.dge_mode.hwdge)
silu_gate_dma_default = _silu_gate(nisa.dge_mode.unknown)


# ==================================================================================================
# 6. column sums (reduction over the partition axis) by PE transposes (Beta 1)
# ==================================================================================================
# Cost model (3.1, 3.2): per 128 x 128 block a PE transpose (max(128, 64) = 128 cycles at 2.4 GHz = 53 ns) and a
# PSUM -> SBUF copy (max(64, 128) VectorE cycles at 0.96 GHz = 133 ns), then a tensor_reduce of [128, N] per column
# block (N cycles). The fix: one ones-column matmul per 128 rows and 512 columns (512 cycles = 213 ns, the 128 rows
# summed on the PE array) and one [1, 512] PSUM copy per 512 columns. x [2048, 2048] bf16: 256 copies (34 us) and
# 16 reduces of 2048 (34 us) on VectorE before; 64 matmuls (14 us of TensorE) after, under the 8 MiB load (23 us at
# 362.5 GB/s): the fix should save ~45 us (VectorE's 68 us down to the DMA time).

@bnki.jit
def colsum_by_transpose(x):
  N, F = x.shape
  out = bl.ndarray((F, 1), dtype=bl.float32, buffer=bl.shared_hbm)
  x_sb = bl.ndarray((N // PMAX, bl.par_dim(PMAX), F), dtype=x.dtype, buffer=bl.sbuf)
  for r in bl.affine_range(N // PMAX):
    x_sb[r] = bl.load(x[r * PMAX:(r + 1) * PMAX, :])
  for c in bl.affine_range(F // PMAX):
    xT = bl.ndarray((bl.par_dim(PMAX), N), dtype=bl.float32, buffer=bl.sbuf)
    for r in bl.affine_range(N // PMAX):
      tp = bisa.nc_transpose(x_sb[r, :, c * PMAX:(c + 1) * PMAX])  # DEFECT
      xT[:, r * PMAX:(r + 1) * PMAX] = bl.copy(tp, dtype=bl.float32)
    cs = bisa.tensor_reduce(bl.add, xT, axis=(1,), dtype=bl.float32)
    bl.store(out[c * PMAX:(c + 1) * PMAX, :], value=cs)
  return out


@bnki.jit
def colsum_by_matmul(x):
  N, F = x.shape
  out = bl.ndarray((F, 1), dtype=bl.float32, buffer=bl.shared_hbm)
  out_row = out.reshape((1, F))
  x_sb = bl.ndarray((N // PMAX, bl.par_dim(PMAX), F), dtype=x.dtype, buffer=bl.sbuf)
  for r in bl.affine_range(N // PMAX):
    x_sb[r] = bl.load(x[r * PMAX:(r + 1) * PMAX, :])
  ones = bl.ones((PMAX, 1), dtype=x.dtype)
  for c in bl.affine_range(F // 512):
    ps = bl.zeros((1, 512), bl.float32, buffer=bl.psum)
    for r in bl.affine_range(N // PMAX):
      ps += bisa.nc_matmul(ones, x_sb[r, :, c * 512:(c + 1) * 512])
    bl.store(out_row[:, c * 512:(c + 1) * 512], value=bl.copy(ps, dtype=bl.float32))
  return out


# ==================================================================================================
# 7. sequential_range on a loop without a loop-carried dependency (Beta 1)
# ==================================================================================================
# compiler.md 1: "sequential_range carries a dependency from one iteration to the next", affine_range iterations
# may be software-pipelined. A compiler that fenced each sequential iteration would run load -> exp -> store of
# 16 tiles back to back (~16 x 3 us); nsim adds no fence (its decision, docs/timing-model.md), so the two kernels
# have the same schedule.

def _exp_rows(loop):
  @bnki.jit
  def exp_rows(x):
    n, f = x.shape
    out = bl.ndarray((n, f), dtype=x.dtype, buffer=bl.shared_hbm)
    for i in loop(n // PMAX):
      xt = bl.load(x[i * PMAX:(i + 1) * PMAX, :])
      bl.store(out[i * PMAX:(i + 1) * PMAX, :], value=bl.exp(xt))
    return out
  return exp_rows


exp_rows_sequential = _exp_rows(bl.sequential_range)
exp_rows_affine = _exp_rows(bl.affine_range)
