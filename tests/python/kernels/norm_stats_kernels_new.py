"""Normalization variants and streaming statistics in the new NKI dialect (``import nki``, ISA calls writing
``dst=``), written the way public NKI 0.3+ kernels are:

- ``instance_norm(x, gamma, beta, eps)``: x [N, C, HW], per (sample, channel) statistics over HW; channels on the
  partitions (C a multiple of 128), ``nisa.bn_stats`` per <= 512-element chunk of HW into a [128, 6 k] tile,
  ``nisa.bn_aggr``, rstd by ``nisa.activation(op=nl.rsqrt, bias=eps)``, x hat by one ``nisa.activation`` with
  per-partition scale rstd and bias -mean rstd, the affine by ``tensor_scalar`` with the channel vectors.
- ``weight_standardization(w, eps)``: a conv weight [Cout, Cin k k] standardized per output channel (rows on
  the partitions, 128 per tile; the same bn_stats / bn_aggr chunking).
- ``welford_stream(x, chunk)``: mean and variance of each row of x [128, L] with the free axis processed in
  chunks (one DMA per chunk): each chunk's mean and M2 (``tensor_reduce``, then an ``activation(op=square)``
  with an add-reduce into ``reduce_res``), merged into the running (n, mean, M2) by Chan's parallel update
  (n_a, n_b compile-time: delta = mean_b - mean_a, mean += delta n_b / n, M2 += M2_b + delta^2 n_a n_b / n).
  ``bn_stats_stream(x, chunk)``: the same stream reduced by one ``bn_stats`` per chunk and one ``bn_aggr``.
  ``two_pass_var(x)``: the textbook two-pass mean / variance of the whole row held in SBUF.
- ``global_stats_matmul(x)`` / ``global_stats_partition_reduce(x)``: the mean and variance over all of
  x [128, F] (across the partitions): per-partition sums [128, 2] (sum x, sum x^2), then either a matmul with a
  [128, 128] ones matrix (the totals land on every partition, PSUM) or ``nisa.tensor_partition_reduce`` (GpSimd).
- ``l2_normalize(x, eps)`` / ``cosine_similarity(x, eps)``: rows of x [N, D] (D <= 128) scaled to unit L2 norm
  (sum of squares by an activation reduce, ``rsqrt`` of sum + eps), and the [N, N] cosine-similarity matrix on
  the PE: each normalized row tile transposed (``nc_transpose`` through PSUM) to [D, 128] and the blocks
  ``xn_i xn_j^T`` by ``nc_matmul``.
- ``residual_layernorm_dropout(x, res, gamma, beta, seed, p, eps)``: h = x + res, LayerNorm of h over the
  hidden dim (bn_stats / bn_aggr), then dropout with probability p (``nl.random_seed`` with a fixed seed and
  ``nisa.dropout``, scaled by 1 / (1 - p)); returns h (the new residual stream) and the output.

Written for nsim's tests in the style of those kernels; not copies of any file. No nsim imports.
"""
import nki
import nki.isa as nisa
import nki.language as nl

P_MAX = 128
BN_FMAX = 512


def _row_mean_var(src, rows, F, mv):
  """mean / population variance of each row of src[:rows, :F] into mv[:rows, 0:2] (bn_stats per chunk)."""
  nch = (F + BN_FMAX - 1) // BN_FMAX
  stats = nl.ndarray((P_MAX, 6 * nch), dtype=nl.float32, buffer=nl.sbuf)
  for c in nl.affine_range(nch):
    f0 = c * BN_FMAX
    f1 = min(F, f0 + BN_FMAX)
    nisa.bn_stats(dst=stats[:rows, c * 6:(c + 1) * 6], data=src[:rows, f0:f1])
  nisa.bn_aggr(dst=mv[:rows, :], data=stats[:rows, :])


def _rstd_and_bias(mv, rows, eps):
  """rstd = rsqrt(var + eps) and nbias = -mean * rstd, both [128, 1] fp32."""
  eps_t = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.memset(dst=eps_t, value=eps)
  rstd = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.activation(dst=rstd[:rows, :], op=nl.rsqrt, data=mv[:rows, 1:2], bias=eps_t[:rows, :])
  nbias = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.scalar_tensor_tensor(dst=nbias[:rows, :], data=mv[:rows, 0:1], op0=nl.multiply, operand0=-1.0,
                            op1=nl.multiply, operand1=rstd[:rows, :])
  return rstd, nbias


@nki.jit
def instance_norm(x, gamma, beta, eps=1e-5):
  N, C, HW = x.shape
  assert C % P_MAX == 0
  out = nl.ndarray((N, C, HW), dtype=x.dtype, buffer=nl.shared_hbm)
  g2 = gamma.reshape((C, 1))
  b2 = beta.reshape((C, 1))
  for ct in nl.affine_range(C // P_MAX):
    c0 = ct * P_MAX
    g = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=g, src=g2[c0:c0 + P_MAX, :])
    b = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=b, src=b2[c0:c0 + P_MAX, :])
    for n in nl.affine_range(N):
      xt = nl.ndarray((P_MAX, HW), dtype=x.dtype, buffer=nl.sbuf)
      nisa.dma_copy(dst=xt, src=x[n, c0:c0 + P_MAX, :])
      mv = nl.ndarray((P_MAX, 2), dtype=nl.float32, buffer=nl.sbuf)
      _row_mean_var(xt, P_MAX, HW, mv)
      rstd, nbias = _rstd_and_bias(mv, P_MAX, eps)
      xh = nl.ndarray((P_MAX, HW), dtype=nl.float32, buffer=nl.sbuf)
      nisa.activation(dst=xh, op=nl.copy, data=xt, bias=nbias, scale=rstd)
      yt = nl.ndarray((P_MAX, HW), dtype=x.dtype, buffer=nl.sbuf)
      nisa.tensor_scalar(dst=yt, data=xh, op0=nl.multiply, operand0=g, op1=nl.add, operand1=b)
      nisa.dma_copy(dst=out[n, c0:c0 + P_MAX, :], src=yt)
  return out


@nki.jit
def weight_standardization(w, eps=1e-5):
  Cout, K = w.shape
  out = nl.ndarray((Cout, K), dtype=w.dtype, buffer=nl.shared_hbm)
  for t in nl.affine_range((Cout + P_MAX - 1) // P_MAX):
    r0 = t * P_MAX
    rows = min(P_MAX, Cout - r0)
    wt = nl.ndarray((P_MAX, K), dtype=w.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=wt[:rows, :], src=w[r0:r0 + rows, :])
    mv = nl.ndarray((P_MAX, 2), dtype=nl.float32, buffer=nl.sbuf)
    _row_mean_var(wt, rows, K, mv)
    rstd, nbias = _rstd_and_bias(mv, rows, eps)
    ws = nl.ndarray((P_MAX, K), dtype=w.dtype, buffer=nl.sbuf)
    nisa.activation(dst=ws[:rows, :], op=nl.copy, data=wt[:rows, :], bias=nbias[:rows, :], scale=rstd[:rows, :])
    nisa.dma_copy(dst=out[r0:r0 + rows, :], src=ws[:rows, :])
  return out


@nki.jit
def welford_stream(x, chunk=512):
  P, L = x.shape
  assert P <= P_MAX and L % chunk == 0
  mean_var = nl.ndarray((P, 2), dtype=nl.float32, buffer=nl.shared_hbm)
  mean = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
  m2 = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.memset(dst=mean, value=0.0)
  nisa.memset(dst=m2, value=0.0)
  for c in nl.sequential_range(L // chunk):
    n_a = c * chunk
    n_b = chunk
    n = n_a + n_b
    xc = nl.ndarray((P_MAX, chunk), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=xc[:P, :], src=x[:, c * chunk:(c + 1) * chunk])
    # the chunk's own mean and M2
    s = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=s[:P, :], op=nl.add, data=xc[:P, :], axis=1)
    neg_mb = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=neg_mb[:P, :], data=s[:P, :], op0=nl.multiply, operand0=-1.0 / n_b)
    sq = nl.ndarray((P_MAX, chunk), dtype=nl.float32, buffer=nl.sbuf)
    m2_b = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=sq[:P, :], op=nl.square, data=xc[:P, :], bias=neg_mb[:P, :], reduce_op=nl.add,
                    reduce_res=m2_b[:P, :], reduce_cmd=nisa.reduce_cmd.reset_reduce)
    # Chan et al.: merge (n_a, mean, m2) with (n_b, mean_b, m2_b)
    delta = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)  # mean_b - mean_a
    nisa.tensor_tensor(dst=delta[:P, :], data1=neg_mb[:P, :], data2=mean[:P, :], op=nl.add)
    nisa.tensor_scalar(dst=delta[:P, :], data=delta[:P, :], op0=nl.multiply, operand0=-1.0)
    nisa.scalar_tensor_tensor(dst=mean[:P, :], data=delta[:P, :], op0=nl.multiply, operand0=n_b / n, op1=nl.add,
                              operand1=mean[:P, :])
    d2 = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=d2[:P, :], data1=delta[:P, :], data2=delta[:P, :], op=nl.multiply)
    nisa.scalar_tensor_tensor(dst=m2[:P, :], data=d2[:P, :], op0=nl.multiply, operand0=n_a * n_b / n, op1=nl.add,
                              operand1=m2[:P, :])
    nisa.tensor_tensor(dst=m2[:P, :], data1=m2[:P, :], data2=m2_b[:P, :], op=nl.add)
  res = nl.ndarray((P_MAX, 2), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_copy(dst=res[:P, 0:1], src=mean[:P, :])
  nisa.tensor_scalar(dst=res[:P, 1:2], data=m2[:P, :], op0=nl.multiply, operand0=1.0 / L)
  nisa.dma_copy(dst=mean_var, src=res[:P, :])
  return mean_var


@nki.jit
def bn_stats_stream(x, chunk=512):
  """The hardware's own streaming statistics: each chunk (DMA'd through an ``.ap`` access pattern) reduced by one
  ``bn_stats`` into its column of a [P, 6 k] tile, all merged by one ``bn_aggr`` (Chan's merge on VectorE)."""
  P, L = x.shape
  assert P <= P_MAX and L % chunk == 0 and chunk <= BN_FMAX
  NC = L // chunk
  mean_var = nl.ndarray((P, 2), dtype=nl.float32, buffer=nl.shared_hbm)
  stats = nl.ndarray((P_MAX, 6 * NC), dtype=nl.float32, buffer=nl.sbuf)
  for c in nl.affine_range(NC):
    xc = nl.ndarray((P_MAX, chunk), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=xc[:P, :], src=x.ap(pattern=[[L, P], [1, chunk]], offset=c * chunk))
    nisa.bn_stats(dst=stats[:P, c * 6:(c + 1) * 6], data=xc[:P, :])
  mv = nl.ndarray((P_MAX, 2), dtype=nl.float32, buffer=nl.sbuf)
  nisa.bn_aggr(dst=mv[:P, :], data=stats[:P, :])
  nisa.dma_copy(dst=mean_var, src=mv[:P, :])
  return mean_var


@nki.jit
def two_pass_var(x):
  P, L = x.shape
  assert P <= P_MAX
  mean_var = nl.ndarray((P, 2), dtype=nl.float32, buffer=nl.shared_hbm)
  xt = nl.ndarray((P_MAX, L), dtype=x.dtype, buffer=nl.sbuf)
  nisa.dma_copy(dst=xt[:P, :], src=x)
  s = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_reduce(dst=s[:P, :], op=nl.add, data=xt[:P, :], axis=1)
  res = nl.ndarray((P_MAX, 2), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_scalar(dst=res[:P, 0:1], data=s[:P, :], op0=nl.multiply, operand0=1.0 / L)
  dev = nl.ndarray((P_MAX, L), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_scalar(dst=dev[:P, :], data=xt[:P, :], op0=nl.subtract, operand0=res[:P, 0:1])
  sq = nl.ndarray((P_MAX, L), dtype=nl.float32, buffer=nl.sbuf)
  ss = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_tensor(dst=sq[:P, :], data1=dev[:P, :], data2=dev[:P, :], op=nl.multiply)
  nisa.tensor_reduce(dst=ss[:P, :], op=nl.add, data=sq[:P, :], axis=1)
  nisa.tensor_scalar(dst=res[:P, 1:2], data=ss[:P, :], op0=nl.multiply, operand0=1.0 / L)
  nisa.dma_copy(dst=mean_var, src=res[:P, :])
  return mean_var


def _partition_sums(x):
  """x [128, F] -> ([128, F] sbuf copy, [128, 2] per-partition (sum x, sum x^2))."""
  P, F = x.shape
  xt = nl.ndarray((P_MAX, F), dtype=nl.float32, buffer=nl.sbuf)
  nisa.dma_copy(dst=xt, src=x)
  sums = nl.ndarray((P_MAX, 2), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_reduce(dst=sums[:, 0:1], op=nl.add, data=xt, axis=1)
  sq = nl.ndarray((P_MAX, F), dtype=nl.float32, buffer=nl.sbuf)
  nisa.activation(dst=sq, op=nl.square, data=xt, reduce_op=nl.add, reduce_res=sums[:, 1:2],
                  reduce_cmd=nisa.reduce_cmd.reset_reduce)
  return xt, sums


def _moments_to_mean_var(tot, count, res):
  """tot [1, 2] (sum, sum of squares) -> res [1, 2] (mean, E[x^2] - mean^2)."""
  nisa.tensor_scalar(dst=res, data=tot, op0=nl.multiply, operand0=1.0 / count)
  m_sq = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_tensor(dst=m_sq, data1=res[:, 0:1], data2=res[:, 0:1], op=nl.multiply)
  nisa.tensor_tensor(dst=res[:, 1:2], data1=res[:, 1:2], data2=m_sq, op=nl.subtract)


@nki.jit
def global_stats_matmul(x):
  P, F = x.shape
  assert P == P_MAX
  mean_var = nl.ndarray((1, 2), dtype=nl.float32, buffer=nl.shared_hbm)
  _, sums = _partition_sums(x)
  ones = nl.ndarray((P_MAX, P_MAX), dtype=nl.float32, buffer=nl.sbuf)
  nisa.memset(dst=ones, value=1.0)
  tot_ps = nl.ndarray((P_MAX, 2), dtype=nl.float32, buffer=nl.psum)
  nisa.nc_matmul(dst=tot_ps, stationary=ones, moving=sums)  # every partition gets the column totals
  res = nl.ndarray((1, 2), dtype=nl.float32, buffer=nl.sbuf)
  _moments_to_mean_var(tot_ps[0:1, :], P * F, res)
  nisa.dma_copy(dst=mean_var, src=res)
  return mean_var


@nki.jit
def global_stats_partition_reduce(x):
  P, F = x.shape
  assert P == P_MAX
  mean_var = nl.ndarray((1, 2), dtype=nl.float32, buffer=nl.shared_hbm)
  _, sums = _partition_sums(x)
  tot = nl.ndarray((1, 2), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_partition_reduce(dst=tot, op=nl.add, data=sums)
  res = nl.ndarray((1, 2), dtype=nl.float32, buffer=nl.sbuf)
  _moments_to_mean_var(tot, P * F, res)
  nisa.dma_copy(dst=mean_var, src=res)
  return mean_var


def _l2_rows(x, r0, D, eps, xn):
  """xn[:, :D] = x[r0:r0 + 128] / sqrt(sum x^2 + eps) (fp32)."""
  xt = nl.ndarray((P_MAX, D), dtype=x.dtype, buffer=nl.sbuf)
  nisa.dma_copy(dst=xt, src=x[r0:r0 + P_MAX, :])
  sq = nl.ndarray((P_MAX, D), dtype=nl.float32, buffer=nl.sbuf)
  ss = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.activation(dst=sq, op=nl.square, data=xt, reduce_op=nl.add, reduce_res=ss,
                  reduce_cmd=nisa.reduce_cmd.reset_reduce)
  eps_t = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.memset(dst=eps_t, value=eps)
  inv = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.activation(dst=inv, op=nl.rsqrt, data=ss, bias=eps_t)
  nisa.tensor_scalar(dst=xn, data=xt, op0=nl.multiply, operand0=inv)


@nki.jit
def l2_normalize(x, eps=1e-12):
  N, D = x.shape
  assert N % P_MAX == 0
  out = nl.ndarray((N, D), dtype=x.dtype, buffer=nl.shared_hbm)
  for t in nl.affine_range(N // P_MAX):
    xn = nl.ndarray((P_MAX, D), dtype=x.dtype, buffer=nl.sbuf)
    _l2_rows(x, t * P_MAX, D, eps, xn)
    nisa.dma_copy(dst=out[t * P_MAX:(t + 1) * P_MAX, :], src=xn)
  return out


@nki.jit
def cosine_similarity(x, eps=1e-12):
  N, D = x.shape
  assert N % P_MAX == 0 and D <= P_MAX and N <= 512
  NT = N // P_MAX
  sim = nl.ndarray((N, N), dtype=nl.float32, buffer=nl.shared_hbm)
  # all normalized rows, transposed: [D, N] (the contraction dim D on the partitions)
  xnT = nl.ndarray((D, N), dtype=x.dtype, buffer=nl.sbuf)
  for t in nl.affine_range(NT):
    xn = nl.ndarray((P_MAX, D), dtype=x.dtype, buffer=nl.sbuf)
    _l2_rows(x, t * P_MAX, D, eps, xn)
    tp = nl.ndarray((D, P_MAX), dtype=x.dtype, buffer=nl.psum)
    nisa.nc_transpose(dst=tp, data=xn)
    nisa.tensor_copy(dst=xnT[:, t * P_MAX:(t + 1) * P_MAX], src=tp)
  for i in nl.affine_range(NT):
    s_ps = nl.ndarray((P_MAX, N), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=s_ps, stationary=xnT[:, i * P_MAX:(i + 1) * P_MAX], moving=xnT)
    s = nl.ndarray((P_MAX, N), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=s, src=s_ps)
    nisa.dma_copy(dst=sim[i * P_MAX:(i + 1) * P_MAX, :], src=s)
  return sim


@nki.jit
def residual_layernorm_dropout(x, res, gamma, beta, seed, p=0.1, eps=1e-5):
  N, H = x.shape
  assert N % P_MAX == 0
  h_out = nl.ndarray((N, H), dtype=x.dtype, buffer=nl.shared_hbm)
  out = nl.ndarray((N, H), dtype=x.dtype, buffer=nl.shared_hbm)
  seed_sb = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
  nisa.dma_copy(dst=seed_sb, src=seed)
  nl.random_seed(seed_sb)
  g = nl.ndarray((P_MAX, H), dtype=nl.float32, buffer=nl.sbuf)
  nisa.dma_copy(dst=g, src=gamma.reshape((1, H)).broadcast_to((P_MAX, H)))
  b = nl.ndarray((P_MAX, H), dtype=nl.float32, buffer=nl.sbuf)
  nisa.dma_copy(dst=b, src=beta.reshape((1, H)).broadcast_to((P_MAX, H)))
  for t in nl.affine_range(N // P_MAX):
    r0 = t * P_MAX
    xt = nl.ndarray((P_MAX, H), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=xt, src=x[r0:r0 + P_MAX, :])
    rt = nl.ndarray((P_MAX, H), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=rt, src=res[r0:r0 + P_MAX, :])
    ht = nl.ndarray((P_MAX, H), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=ht, data1=xt, data2=rt, op=nl.add)
    h_lo = nl.ndarray((P_MAX, H), dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=h_lo, src=ht)
    nisa.dma_copy(dst=h_out[r0:r0 + P_MAX, :], src=h_lo)
    mv = nl.ndarray((P_MAX, 2), dtype=nl.float32, buffer=nl.sbuf)
    _row_mean_var(ht, P_MAX, H, mv)
    rstd, nbias = _rstd_and_bias(mv, P_MAX, eps)
    y = nl.ndarray((P_MAX, H), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=y, op=nl.copy, data=ht, bias=nbias, scale=rstd)
    nisa.tensor_tensor(dst=y, data1=y, data2=g, op=nl.multiply)
    nisa.tensor_tensor(dst=y, data1=y, data2=b, op=nl.add)
    yd = nl.ndarray((P_MAX, H), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dropout(dst=yd, data=y, prob=p)
    o = nl.ndarray((P_MAX, H), dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=o, data=yd, op0=nl.multiply, operand0=1.0 / (1.0 - p))
    nisa.dma_copy(dst=out[r0:r0 + P_MAX, :], src=o)
  return h_out, out
