"""LNC=2 work-splitting patterns in the new NKI dialect (``import nki``, ISA calls writing ``dst=``), written the
way public trn2 kernels split one logical core's work over its two physical cores (``kernel[2]`` /
``kernel[nl.nc(2)]``; ``nl.program_id(0)`` is the core, HBM is shared, SBUF/PSUM are private):

- ``splitk_matmul(aT, b, combine)``: out [M, N] fp32 = aT.T @ b, aT [K, M], b [K, N] (bf16 or fp32). Each program
  accumulates its half of K (K / 2 / 128 contraction tiles) into PSUM for every M tile and evicts the partials to
  SBUF. Reduce-scatter of the partials: program p finishes the M tiles [p * MT / 2, (p + 1) * MT / 2); it sends the
  other half of its partials to the peer, either SBUF to SBUF (``combine="sendrecv"``, one ``nisa.sendrecv``) or
  through a shared HBM scratch [2, M / 2, N] and ``nisa.core_barrier`` (``combine="barrier"``). Launched without a
  grid it is the one-core kernel over all of K. ``barrier_engine`` names the engine the barrier blocks (default
  GpSimd).
- ``split_row_softmax(x)``: softmax over very long rows x [R, L] (R <= 128), the columns split over the two
  programs. Each program keeps its half in SBUF, computes its row max m and sum exp(x - m), exchanges the
  two [R, 2] stats by ``nisa.sendrecv`` and rescales its half by exp(m - M) / (s exp(m - M) + s' exp(m' - M))
  (the online-softmax combine), writing its half of the output. ``gpsimd_exchange=True`` sends the stats by the
  GpSimd DMA (``dma_engine=nisa.dma_engine.gpsimd_dma``).
- ``ragged_rows_allgather(x, barrier)``: x [N, D], N not a multiple of 256: the row tiles are dealt in two
  contiguous blocks (300 rows: program 0 rows 0..255, program 1 rows 256..299, a partial tile of 44). Each program
  RMS-normalises its rows into the shared y [N, D] (the all-gather through HBM), meets the other at
  ``nisa.core_barrier(y)`` and then reads the whole y back to compute its column sums (``colsum[p] = y.sum(0)``,
  a ones matmul over the partitions). ``barrier=False`` is the same kernel with the barrier missing: a
  cross-core race on y.

Written for nsim's tests in the style of those kernels; not copies of any file. No nsim imports.
"""
import nki
import nki.isa as nisa
import nki.language as nl

P_MAX = 128
N_TILE = 512
EPS = 1e-6


def _programs():
  if nl.program_ndim() == 0:
    return 1, 0
  return nl.num_programs(axes=0), nl.program_id(axis=0)


@nki.jit
def splitk_matmul(aT, b, combine="sendrecv", barrier_engine=None):
  K, M = aT.shape
  _, N = b.shape
  n_prg, pid = _programs()
  assert combine in ("sendrecv", "barrier")
  assert K % (n_prg * P_MAX) == 0 and M % (n_prg * P_MAX) == 0 and N <= N_TILE
  KT = K // n_prg // P_MAX          # contraction tiles of this program
  MT = M // P_MAX
  k0 = pid * KT * P_MAX
  out = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.shared_hbm)

  # this program's half of K, resident in SBUF
  a_sb = nl.ndarray((P_MAX, KT, M), dtype=aT.dtype, buffer=nl.sbuf)
  b_sb = nl.ndarray((P_MAX, KT, N), dtype=b.dtype, buffer=nl.sbuf)
  for k in nl.affine_range(KT):
    nisa.dma_copy(dst=a_sb[:, k, :], src=aT[nl.ds(k0 + k * P_MAX, P_MAX), :])
    nisa.dma_copy(dst=b_sb[:, k, :], src=b[nl.ds(k0 + k * P_MAX, P_MAX), :])

  part = nl.ndarray((P_MAX, MT, N), dtype=nl.float32, buffer=nl.sbuf)
  for m in nl.affine_range(MT):
    ps = nl.ndarray((P_MAX, N), dtype=nl.float32, buffer=nl.psum)
    for k in nl.affine_range(KT):
      nisa.nc_matmul(dst=ps, stationary=a_sb[:, k, nl.ds(m * P_MAX, P_MAX)], moving=b_sb[:, k, :])
    nisa.tensor_copy(dst=part[:, m, :], src=ps)

  if n_prg == 1:
    for m in nl.affine_range(MT):
      nisa.dma_copy(dst=out[nl.ds(m * P_MAX, P_MAX), :], src=part[:, m, :])
    return out

  half = MT // 2
  mine = pid * half            # first M tile this program finishes
  theirs = (1 - pid) * half    # first M tile the peer finishes
  peer = nl.ndarray((P_MAX, half, N), dtype=nl.float32, buffer=nl.sbuf)
  if combine == "sendrecv":
    nisa.sendrecv(src=part[:, nl.ds(theirs, half), :], dst=peer, send_to_rank=1 - pid, recv_from_rank=1 - pid,
                  pipe_id=0)
  else:
    scratch = nl.ndarray((2, half * P_MAX, N), dtype=nl.float32, buffer=nl.shared_hbm)
    for m in nl.affine_range(half):
      nisa.dma_copy(dst=scratch[pid, nl.ds(m * P_MAX, P_MAX), :], src=part[:, theirs + m, :])
    if barrier_engine is None:
      nisa.core_barrier(data=scratch, cores=(0, 1))
    else:
      nisa.core_barrier(data=scratch, cores=(0, 1), engine=barrier_engine)
    for m in nl.affine_range(half):
      nisa.dma_copy(dst=peer[:, m, :], src=scratch[1 - pid, nl.ds(m * P_MAX, P_MAX), :])
  for m in nl.affine_range(half):
    res = nl.ndarray((P_MAX, N), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=res, data1=part[:, mine + m, :], data2=peer[:, m, :], op=nl.add)
    nisa.dma_copy(dst=out[nl.ds((mine + m) * P_MAX, P_MAX), :], src=res)
  return out


@nki.jit
def split_row_softmax(x, gpsimd_exchange=False):
  R, L = x.shape
  n_prg, pid = _programs()
  assert R <= P_MAX and L % (n_prg * N_TILE) == 0
  Lh = L // n_prg
  NT = Lh // N_TILE
  c0 = pid * Lh
  out = nl.ndarray((R, L), dtype=x.dtype, buffer=nl.shared_hbm)

  xs = nl.ndarray((P_MAX, NT, N_TILE), dtype=nl.float32, buffer=nl.sbuf)
  tmax = nl.ndarray((P_MAX, NT), dtype=nl.float32, buffer=nl.sbuf)
  for t in nl.affine_range(NT):
    nisa.dma_copy(dst=xs[:R, t, :], src=x[:, nl.ds(c0 + t * N_TILE, N_TILE)])
    nisa.tensor_reduce(dst=tmax[:R, nl.ds(t, 1)], op=nl.maximum, data=xs[:R, t, :], axis=1)
  stats = nl.ndarray((P_MAX, 2), dtype=nl.float32, buffer=nl.sbuf)      # [max, sum exp(x - max)] of this half
  nisa.tensor_reduce(dst=stats[:R, 0:1], op=nl.maximum, data=tmax[:R], axis=1)
  neg = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_scalar(dst=neg[:R], data=stats[:R, 0:1], op0=nl.multiply, operand0=-1.0)
  ex = nl.ndarray((P_MAX, NT, N_TILE), dtype=nl.float32, buffer=nl.sbuf)
  tsum = nl.ndarray((P_MAX, NT), dtype=nl.float32, buffer=nl.sbuf)
  for t in nl.affine_range(NT):
    nisa.activation(dst=ex[:R, t, :], op=nl.exp, data=xs[:R, t, :], bias=neg[:R], reduce_op=nl.add,
                    reduce_res=tsum[:R, nl.ds(t, 1)], reduce_cmd=nisa.reduce_cmd.reset_reduce)
  nisa.tensor_reduce(dst=stats[:R, 1:2], op=nl.add, data=tsum[:R], axis=1)

  scale = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
  if n_prg == 1:
    nisa.reciprocal(dst=scale[:R], data=stats[:R, 1:2])
  else:
    pst = nl.ndarray((P_MAX, 2), dtype=nl.float32, buffer=nl.sbuf)
    if gpsimd_exchange:   # 8 bytes per partition: within the GpSimd DMA's limit
      nisa.sendrecv(src=stats[:R], dst=pst[:R], send_to_rank=1 - pid, recv_from_rank=1 - pid, pipe_id=1,
                    dma_engine=nisa.dma_engine.gpsimd_dma)
    else:
      nisa.sendrecv(src=stats[:R], dst=pst[:R], send_to_rank=1 - pid, recv_from_rank=1 - pid, pipe_id=1)
    gmax = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=gmax[:R], data1=stats[:R, 0:1], data2=pst[:R, 0:1], op=nl.maximum)
    gneg = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=gneg[:R], data=gmax[:R], op0=nl.multiply, operand0=-1.0)
    cm = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)    # exp(m - M)
    cp = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)    # exp(m' - M)
    nisa.activation(dst=cm[:R], op=nl.exp, data=stats[:R, 0:1], bias=gneg[:R])
    nisa.activation(dst=cp[:R], op=nl.exp, data=pst[:R, 0:1], bias=gneg[:R])
    tot = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=tot[:R], data1=stats[:R, 1:2], data2=cm[:R], op=nl.multiply)
    nisa.scalar_tensor_tensor(dst=tot[:R], data=pst[:R, 1:2], op0=nl.multiply, operand0=cp[:R], op1=nl.add,
                              operand1=tot[:R])
    nisa.reciprocal(dst=scale[:R], data=tot[:R])
    nisa.tensor_tensor(dst=scale[:R], data1=scale[:R], data2=cm[:R], op=nl.multiply)
  for t in nl.affine_range(NT):
    y = nl.ndarray((P_MAX, N_TILE), dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=y[:R], data=ex[:R, t, :], op0=nl.multiply, operand0=scale[:R])
    nisa.dma_copy(dst=out[:, nl.ds(c0 + t * N_TILE, N_TILE)], src=y[:R])
  return out


@nki.jit
def ragged_rows_allgather(x, barrier=True):
  N, D = x.shape
  n_prg, pid = _programs()
  NT = (N + P_MAX - 1) // P_MAX
  per = (NT + n_prg - 1) // n_prg               # row tiles of program 0; the rest (maybe a partial tile) to 1
  t_lo = pid * per
  t_hi = min(NT, t_lo + per)
  y = nl.ndarray((N, D), dtype=x.dtype, buffer=nl.shared_hbm)
  colsum = nl.ndarray((n_prg, D), dtype=nl.float32, buffer=nl.shared_hbm)

  for t in nl.affine_range(t_hi - t_lo):
    r0 = (t_lo + t) * P_MAX
    rows = min(P_MAX, N - r0)
    xt = nl.ndarray((P_MAX, D), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=xt[:rows], src=x[r0:r0 + rows, :])
    sq = nl.ndarray((P_MAX, D), dtype=nl.float32, buffer=nl.sbuf)
    ss = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=sq[:rows], op=nl.square, data=xt[:rows], reduce_op=nl.add, reduce_res=ss[:rows],
                    reduce_cmd=nisa.reduce_cmd.reset_reduce)
    rs = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=rs[:rows], data=ss[:rows], op0=nl.multiply, operand0=1.0 / D, op1=nl.add,
                       operand1=EPS)
    nisa.activation(dst=rs[:rows], op=nl.rsqrt, data=rs[:rows])
    yt = nl.ndarray((P_MAX, D), dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=yt[:rows], data=xt[:rows], op0=nl.multiply, operand0=rs[:rows])
    nisa.dma_copy(dst=y[r0:r0 + rows, :], src=yt[:rows])

  if barrier:
    nisa.core_barrier(data=y, cores=(0, 1))

  # read the whole gathered y back: its column sums by a ones matmul over the partitions
  ones = nl.ndarray((P_MAX, 1), dtype=x.dtype, buffer=nl.sbuf)
  nisa.memset(dst=ones, value=1.0)
  cs_ps = nl.ndarray((1, D), dtype=nl.float32, buffer=nl.psum)
  for t in nl.affine_range(NT):
    r0 = t * P_MAX
    rows = min(P_MAX, N - r0)
    yt = nl.ndarray((P_MAX, D), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=yt[:rows], src=y[r0:r0 + rows, :])
    nisa.nc_matmul(dst=cs_ps, stationary=ones[:rows], moving=yt[:rows])
  cs = nl.ndarray((1, D), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_copy(dst=cs, src=cs_ps)
  nisa.dma_copy(dst=colsum[nl.ds(pid, 1), :], src=cs)
  return y, colsum
