"""A 1-D wave equation, an N-body step and a histogram in the new NKI dialect (``import nki``, ISA calls writing
``dst=``, ``nl.ndarray`` buffers, ``nisa.dma_copy``), written the way public NKI 0.3+ kernels are:

- ``wave1d_leapfrog(u_prev, u_cur, c2, n_steps)``: B independent strings [B <= 128, N] (one per partition), the
  leapfrog update u_next = 2 u - u_prev + c2 (u[i + 1] - 2 u[i] + u[i - 1]) with a periodic boundary. The state
  lives in three SBUF buffers [B, N + 2] with one ghost cell at each end, refreshed every step by two
  ``tensor_copy`` of the opposite edge column; the neighbours are shifted free-axis slices
  (``cur[:, 2:N + 2]``, ``cur[:, 0:N]``), combined by ``tensor_tensor`` and two ``scalar_tensor_tensor``.
  Returns the last two time levels.
- ``nbody_kick_drift(pos, vel, mass, dt, eps, G)``: one kick-drift (symplectic Euler / leapfrog) step of N <= 128
  softened point masses. Squared distances come from TensorE as ||x_i||^2 + ||x_j||^2 - 2 x_i.x_j: one matmul of
  the augmented coordinates [x, y, z, |x|^2, 1] and [-2x, -2y, -2z, 1, |x|^2] (both moved to the partition axis by
  ``nc_transpose``), then softening, ``rsqrt`` and a cube give 1 / r^3, ``affine_select`` zeroes the diagonal,
  and one more matmul with [m x, m y, m z, m] sums the forces: a_i = G (sum_j w_ij m_j x_j - x_i sum_j w_ij m_j).
  v += dt a, x += dt v. Returns the new positions, velocities and the accelerations.
- ``histogram_onehot(values, num_bins, lo, hi)``: counts of values [128, F] in ``num_bins`` equal bins of
  [lo, hi) (values outside are not counted). Per column of 128 samples a one-hot [128, num_bins] by comparing the
  scaled value with an ``iota`` of bin numbers (0 <= v' - b < 1), summed over the partitions by a matmul with a
  ones column accumulated in one PSUM tile. Returns the counts [1, num_bins] int32.

Written for nsim's tests in the style of those kernels; not copies of any file. No nsim imports.
"""
import nki
import nki.isa as nisa
import nki.language as nl

P_MAX = 128


@nki.jit
def wave1d_leapfrog(u_prev, u_cur, c2=0.25, n_steps=16):
  B, N = u_cur.shape
  assert B <= P_MAX and N >= 2
  out_prev = nl.ndarray((B, N), dtype=u_cur.dtype, buffer=nl.shared_hbm)
  out_cur = nl.ndarray((B, N), dtype=u_cur.dtype, buffer=nl.shared_hbm)

  bufs = []
  for i in nl.static_range(3):
    bufs.append(nl.ndarray((B, N + 2), dtype=nl.float32, buffer=nl.sbuf))
  prev, cur, nxt = bufs
  nisa.dma_copy(dst=prev[:, 1:N + 1], src=u_prev)
  nisa.dma_copy(dst=cur[:, 1:N + 1], src=u_cur)
  nb = nl.ndarray((B, N), dtype=nl.float32, buffer=nl.sbuf)
  tmp = nl.ndarray((B, N), dtype=nl.float32, buffer=nl.sbuf)

  for step in nl.static_range(n_steps):
    # periodic ghost cells: u[-1] = u[N - 1], u[N] = u[0]
    nisa.tensor_copy(dst=cur[:, 0:1], src=cur[:, N:N + 1])
    nisa.tensor_copy(dst=cur[:, N + 1:N + 2], src=cur[:, 1:2])
    nisa.tensor_tensor(dst=nb, data1=cur[:, 2:N + 2], data2=cur[:, 0:N], op=nl.add)
    # (2 - 2 c2) u - u_prev
    nisa.scalar_tensor_tensor(dst=tmp, data=cur[:, 1:N + 1], op0=nl.multiply, operand0=2.0 - 2.0 * c2,
                              op1=nl.subtract, operand1=prev[:, 1:N + 1])
    # + c2 (u[i + 1] + u[i - 1])
    nisa.scalar_tensor_tensor(dst=nxt[:, 1:N + 1], data=nb, op0=nl.multiply, operand0=c2, op1=nl.add,
                              operand1=tmp)
    prev, cur, nxt = cur, nxt, prev

  nisa.dma_copy(dst=out_prev, src=prev[:, 1:N + 1])
  nisa.dma_copy(dst=out_cur, src=cur[:, 1:N + 1])
  return out_prev, out_cur


@nki.jit
def nbody_kick_drift(pos, vel, mass, dt=0.01, eps=0.1, G=1.0):
  N, D = pos.shape
  assert N <= P_MAX and D == 3
  new_pos = nl.ndarray((N, 3), dtype=pos.dtype, buffer=nl.shared_hbm)
  new_vel = nl.ndarray((N, 3), dtype=vel.dtype, buffer=nl.shared_hbm)
  accel = nl.ndarray((N, 3), dtype=nl.float32, buffer=nl.shared_hbm)

  x = nl.ndarray((N, 3), dtype=nl.float32, buffer=nl.sbuf)
  v = nl.ndarray((N, 3), dtype=nl.float32, buffer=nl.sbuf)
  m = nl.ndarray((N, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.dma_copy(dst=x, src=pos)
  nisa.dma_copy(dst=v, src=vel)
  nisa.dma_copy(dst=m, src=mass)

  # |x|^2 per body
  xx = nl.ndarray((N, 3), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_tensor(dst=xx, data1=x, data2=x, op=nl.multiply)
  sq = nl.ndarray((N, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_reduce(dst=sq, op=nl.add, data=xx, axis=1, keepdims=True)

  # augmented coordinates: d2[i, j] = sum_k a[i, k] b[j, k]
  a = nl.ndarray((N, 5), dtype=nl.float32, buffer=nl.sbuf)
  b = nl.ndarray((N, 5), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_copy(dst=a[:, 0:3], src=x)
  nisa.tensor_copy(dst=a[:, 3:4], src=sq)
  nisa.memset(dst=a[:, 4:5], value=1.0)
  nisa.tensor_scalar(dst=b[:, 0:3], data=x, op0=nl.multiply, operand0=-2.0)
  nisa.memset(dst=b[:, 3:4], value=1.0)
  nisa.tensor_copy(dst=b[:, 4:5], src=sq)

  aT_ps = nl.ndarray((5, N), dtype=nl.float32, buffer=nl.psum)
  nisa.nc_transpose(dst=aT_ps, data=a)
  aT = nl.ndarray((5, N), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_copy(dst=aT, src=aT_ps)
  bT_ps = nl.ndarray((5, N), dtype=nl.float32, buffer=nl.psum)
  nisa.nc_transpose(dst=bT_ps, data=b)
  bT = nl.ndarray((5, N), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_copy(dst=bT, src=bT_ps)

  d2_ps = nl.ndarray((N, N), dtype=nl.float32, buffer=nl.psum)
  nisa.nc_matmul(dst=d2_ps, stationary=aT, moving=bT)

  # softened r^2 (clamped: the expansion can round slightly below zero), 1 / r^3
  r2 = nl.ndarray((N, N), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_scalar(dst=r2, data=d2_ps, op0=nl.maximum, operand0=0.0, op1=nl.add, operand1=eps * eps)
  inv_r = nl.ndarray((N, N), dtype=nl.float32, buffer=nl.sbuf)
  nisa.activation(dst=inv_r, op=nl.rsqrt, data=r2)
  inv_r2 = nl.ndarray((N, N), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_tensor(dst=inv_r2, data1=inv_r, data2=inv_r, op=nl.multiply)
  inv_r3 = nl.ndarray((N, N), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_tensor(dst=inv_r3, data1=inv_r2, data2=inv_r, op=nl.multiply)
  # no self-interaction: keep where i - j != 0
  w = nl.ndarray((N, N), dtype=nl.float32, buffer=nl.sbuf)
  nisa.affine_select(dst=w, pattern=[[-1, N]], channel_multiplier=1, on_true_tile=inv_r3, on_false_value=0.0,
                     cmp_op=nl.not_equal)

  # [m x, m y, m z, m]
  mx = nl.ndarray((N, 4), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_scalar(dst=mx[:, 0:3], data=x, op0=nl.multiply, operand0=m)
  nisa.tensor_copy(dst=mx[:, 3:4], src=m)
  f_ps = nl.ndarray((N, 4), dtype=nl.float32, buffer=nl.psum)
  nisa.nc_matmul(dst=f_ps, stationary=w, moving=mx)  # w is symmetric: f[i] = sum_j w[j, i] mx[j]
  f = nl.ndarray((N, 4), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_copy(dst=f, src=f_ps)

  # a = G (f[:, :3] - x * f[:, 3])
  acc = nl.ndarray((N, 3), dtype=nl.float32, buffer=nl.sbuf)
  nisa.scalar_tensor_tensor(dst=acc, data=x, op0=nl.multiply, operand0=f[:, 3:4], op1=nl.subtract,
                            operand1=f[:, 0:3], reverse1=True)
  if G != 1.0:
    nisa.tensor_scalar(dst=acc, data=acc, op0=nl.multiply, operand0=G)

  # kick, drift
  v2 = nl.ndarray((N, 3), dtype=nl.float32, buffer=nl.sbuf)
  nisa.scalar_tensor_tensor(dst=v2, data=acc, op0=nl.multiply, operand0=dt, op1=nl.add, operand1=v)
  x2 = nl.ndarray((N, 3), dtype=nl.float32, buffer=nl.sbuf)
  nisa.scalar_tensor_tensor(dst=x2, data=v2, op0=nl.multiply, operand0=dt, op1=nl.add, operand1=x)

  nisa.dma_copy(dst=new_pos, src=x2)
  nisa.dma_copy(dst=new_vel, src=v2)
  nisa.dma_copy(dst=accel, src=acc)
  return new_pos, new_vel, accel


@nki.jit
def histogram_onehot(values, num_bins=32, lo=0.0, hi=1.0):
  P, F = values.shape
  assert P == P_MAX and num_bins <= 512
  counts = nl.ndarray((1, num_bins), dtype=nl.int32, buffer=nl.shared_hbm)

  v = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
  nisa.dma_copy(dst=v, src=values)
  # position in bin units: (v - lo) * num_bins / (hi - lo)
  s = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_scalar(dst=s, data=v, op0=nl.subtract, operand0=lo, op1=nl.multiply,
                     operand1=num_bins / (hi - lo))

  bins = nl.ndarray((P, num_bins), dtype=nl.float32, buffer=nl.sbuf)
  nisa.iota(dst=bins, pattern=[[1, num_bins]], offset=0, channel_multiplier=0)
  ones = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.memset(dst=ones, value=1.0)

  hist_ps = nl.ndarray((1, num_bins), dtype=nl.float32, buffer=nl.psum)
  d = nl.ndarray((P, num_bins), dtype=nl.float32, buffer=nl.sbuf)
  ge = nl.ndarray((P, num_bins), dtype=nl.float32, buffer=nl.sbuf)
  onehot = nl.ndarray((P, num_bins), dtype=nl.float32, buffer=nl.sbuf)
  for c in nl.sequential_range(F):
    # d = s - b; one-hot where 0 <= d < 1
    nisa.tensor_scalar(dst=d, data=bins, op0=nl.subtract, operand0=s[:, c:c + 1], reverse0=True)
    nisa.tensor_scalar(dst=ge, data=d, op0=nl.greater_equal, operand0=0.0)
    nisa.scalar_tensor_tensor(dst=onehot, data=d, op0=nl.less, operand0=1.0, op1=nl.multiply, operand1=ge)
    nisa.nc_matmul(dst=hist_ps, stationary=ones, moving=onehot)  # first overwrites, then accumulates

  out = nl.ndarray((1, num_bins), dtype=nl.int32, buffer=nl.sbuf)
  nisa.tensor_copy(dst=out, src=hist_ps)
  nisa.dma_copy(dst=counts, src=out)
  return counts
