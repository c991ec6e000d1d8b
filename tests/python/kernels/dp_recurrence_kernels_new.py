"""Dynamic-programming recurrences in the new NKI dialect (``import nki``, ISA calls writing ``dst=``, ``nl.ndarray``
buffers, ``nisa.dma_copy``), written the way public NKI 0.3+ kernels are: the batch on the partitions and a
``nl.sequential_range`` loop over time whose loop index is a compile-time int (slice bounds may depend on it).

- ``ctc_loss_fwd(log_probs, labels)``: the CTC loss forward pass (alpha recurrence) in log space. log_probs
  [B, T, C] (log-softmax output, blank = class 0), labels [B, L] int32 (classes 1..C-1, repeats allowed). The
  extended sequence of 2 L + 1 symbols (blanks between and around the labels) is built on chip
  (``nisa.memset`` + a strided ``tensor_copy``), and the emission of every (t, s) is gathered once before the loop
  with ``nisa.nc_n_gather`` (index t * C + ext[s] from ``nisa.iota`` plus the broadcast ext row). The skip transition
  s - 2 -> s is allowed only onto a label that differs from the previous label (an additive 0 / -1e30 bias). Per
  step the three predecessors alpha[s], alpha[s-1], alpha[s-2] are slices of one padded buffer; their element-wise
  max m, exp(x - m) of the three stacked as [B, 2L+1, 3] (one ScalarE exp), a sum over the last axis, log, + m +
  emission (log-sum-exp with the max shift keeps log's argument in [1, 3]). Returns the loss -log p(labels | x)
  [B, 1].
- ``dtw_wavefront(x, y)``: dynamic time warping distance between two 1-D sequences per batch row (squared
  difference cost), computed on anti-diagonals: diagonal d holds D[i, d - i] for i = 0..N; the cells of a diagonal
  are independent, so each step is five vector / scalar ops over the diagonal's valid cells (a Python-int slice,
  the loop index being a compile-time int): the squared difference of x with a slice of the reversed y, and
  c + min(D[i-1, j-1], D[i-1, j], D[i, j-1]) (diagonal d - 2 and d - 1 shifted by one). N + M - 1 steps.
- ``dtw_rowscan(x, y)``: the same distance row by row: row i's costs (y - x_i)^2 in one ``nisa.activation``
  (square with a per-partition bias), u_j = min(D[i-1, j-1], D[i-1, j]) in one ``tensor_tensor``, and the in-row
  dependency D[i, j] = c_j + min(u_j, D[i, j-1]) as one ``nisa.tensor_tensor_scan`` (op0 = minimum, op1 = add):
  N steps of three instructions. The kernel an author picks once the scan instruction is known: fewer steps
  (N rather than N + M - 1) and fewer instructions per step than the wavefront.

Written for nsim's tests in the style of those kernels; not copies of any file. No nsim imports.
"""
import nki
import nki.isa as nisa
import nki.language as nl

P_MAX = 128
NEG = -1.0e30
BIG = 1.0e30


@nki.jit
def ctc_loss_fwd(log_probs, labels):
  B, T, C = log_probs.shape
  _, L = labels.shape
  assert B <= P_MAX and L >= 2
  Lp = 2 * L + 1
  loss = nl.ndarray((B, 1), dtype=nl.float32, buffer=nl.shared_hbm)

  lp = nl.ndarray((B, T, C), dtype=nl.float32, buffer=nl.sbuf)
  nisa.dma_copy(dst=lp, src=log_probs)
  lab = nl.ndarray((B, L), dtype=nl.int32, buffer=nl.sbuf)
  nisa.dma_copy(dst=lab, src=labels)

  # extended labels: blank (0) at even positions, the labels at odd ones
  ext = nl.ndarray((B, Lp), dtype=nl.uint32, buffer=nl.sbuf)
  nisa.memset(dst=ext, value=0)
  nisa.tensor_copy(dst=ext[:, 1:Lp:2], src=lab)
  # emissions of the extended symbols at every step: em[b, t, s] = lp[b, t, ext[b, s]]
  idx = nl.ndarray((B, T, Lp), dtype=nl.uint32, buffer=nl.sbuf)
  nisa.iota(dst=idx, pattern=[[C, T], [0, Lp]], offset=0)
  nisa.tensor_tensor(dst=idx, data1=idx, data2=ext.expand_dim(1).broadcast(1, T), op=nl.add)
  em = nl.ndarray((B, T, Lp), dtype=nl.float32, buffer=nl.sbuf)
  nisa.nc_n_gather(dst=em, data=lp, indices=idx)

  # skip s-2 -> s only onto a label different from the previous label: bias 0, else NEG
  skip = nl.ndarray((B, Lp), dtype=nl.float32, buffer=nl.sbuf)
  nisa.memset(dst=skip, value=NEG)
  differ = nl.ndarray((B, L - 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_tensor(dst=differ, data1=lab[:, 1:L], data2=lab[:, 0:L - 1], op=nl.not_equal)
  nisa.tensor_scalar(dst=skip[:, 3:Lp:2], data=differ, op0=nl.subtract, operand0=1.0, reverse0=True,
                     op1=nl.multiply, operand1=NEG)

  # alpha with two leading NEG columns: alpha[s-2], alpha[s-1], alpha[s] are slices
  alpha = nl.ndarray((B, Lp + 2), dtype=nl.float32, buffer=nl.sbuf)
  nisa.memset(dst=alpha, value=NEG)
  nisa.tensor_copy(dst=alpha[:, 2:4], src=em[:, 0, 0:2])

  a2 = nl.ndarray((B, Lp), dtype=nl.float32, buffer=nl.sbuf)
  m = nl.ndarray((B, Lp), dtype=nl.float32, buffer=nl.sbuf)
  diff = nl.ndarray((B, Lp, 3), dtype=nl.float32, buffer=nl.sbuf)
  ex = nl.ndarray((B, Lp, 3), dtype=nl.float32, buffer=nl.sbuf)
  ssum = nl.ndarray((B, Lp), dtype=nl.float32, buffer=nl.sbuf)
  lg = nl.ndarray((B, Lp), dtype=nl.float32, buffer=nl.sbuf)
  for t in nl.sequential_range(1, T):
    nisa.tensor_tensor(dst=a2, data1=alpha[:, 0:Lp], data2=skip, op=nl.add)
    nisa.tensor_tensor(dst=m, data1=alpha[:, 2:Lp + 2], data2=alpha[:, 1:Lp + 1], op=nl.maximum)
    nisa.tensor_tensor(dst=m, data1=m, data2=a2, op=nl.maximum)
    nisa.tensor_tensor(dst=diff[:, :, 0], data1=alpha[:, 2:Lp + 2], data2=m, op=nl.subtract)
    nisa.tensor_tensor(dst=diff[:, :, 1], data1=alpha[:, 1:Lp + 1], data2=m, op=nl.subtract)
    nisa.tensor_tensor(dst=diff[:, :, 2], data1=a2, data2=m, op=nl.subtract)
    nisa.activation(dst=ex, op=nl.exp, data=diff)
    nisa.tensor_reduce(dst=ssum, op=nl.add, data=ex, axis=2)
    nisa.activation(dst=lg, op=nl.log, data=ssum)
    nisa.tensor_tensor(dst=lg, data1=lg, data2=m, op=nl.add)
    nisa.tensor_tensor(dst=alpha[:, 2:Lp + 2], data1=lg, data2=em[:, t, :], op=nl.add)

  # loss = -logsumexp(alpha[last label], alpha[final blank])
  fin = alpha[:, Lp:Lp + 2]
  mx = nl.ndarray((B, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_reduce(dst=mx, op=nl.maximum, data=fin, axis=1)
  neg_mx = nl.ndarray((B, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_scalar(dst=neg_mx, data=mx, op0=nl.multiply, operand0=-1.0)
  e2 = nl.ndarray((B, 2), dtype=nl.float32, buffer=nl.sbuf)
  s2 = nl.ndarray((B, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.activation(dst=e2, op=nl.exp, data=fin, bias=neg_mx, reduce_op=nl.add, reduce_res=s2,
                  reduce_cmd=nisa.reduce_cmd.reset_reduce)
  out = nl.ndarray((B, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.activation(dst=out, op=nl.log, data=s2)
  nisa.tensor_tensor(dst=out, data1=out, data2=mx, op=nl.add)
  nisa.tensor_scalar(dst=out, data=out, op0=nl.multiply, operand0=-1.0)
  nisa.dma_copy(dst=loss, src=out)
  return loss


@nki.jit
def dtw_wavefront(x, y):
  B, N = x.shape
  _, M = y.shape
  assert B <= P_MAX
  dist = nl.ndarray((B, 1), dtype=nl.float32, buffer=nl.shared_hbm)

  xs = nl.ndarray((B, N), dtype=nl.float32, buffer=nl.sbuf)
  nisa.dma_copy(dst=xs, src=x)
  # y reversed by the DMA's access pattern: y_rev[k] = y[M - 1 - k], so y[j - 1] with j = d - i is y_rev[M - d + i]
  y_rev = nl.ndarray((B, M), dtype=nl.float32, buffer=nl.sbuf)
  nisa.dma_copy(dst=y_rev, src=y.ap([[M, B], [-1, M]], offset=M - 1))

  # diag[:, d, i] = D[i, d - i]; BIG outside the matrix, D[0, 0] = 0
  diag = nl.ndarray((B, N + M + 1, N + 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.memset(dst=diag, value=BIG)
  nisa.memset(dst=diag[:, 0, 0:1], value=0.0)
  cost = nl.ndarray((B, N), dtype=nl.float32, buffer=nl.sbuf)
  m = nl.ndarray((B, N), dtype=nl.float32, buffer=nl.sbuf)
  for d in nl.sequential_range(2, N + M + 1):
    lo = max(1, d - M)
    hi = min(N, d - 1)
    w = hi - lo + 1
    # cost (x[i-1] - y[j-1])^2 for the diagonal's cells i = lo..hi
    nisa.tensor_tensor(dst=cost[:, 0:w], data1=xs[:, lo - 1:hi], data2=y_rev[:, M - d + lo:M - d + hi + 1],
                       op=nl.subtract)
    nisa.activation(dst=cost[:, 0:w], op=nl.square, data=cost[:, 0:w])
    nisa.tensor_tensor(dst=m[:, 0:w], data1=diag[:, d - 2, lo - 1:hi], data2=diag[:, d - 1, lo - 1:hi],
                       op=nl.minimum)
    nisa.tensor_tensor(dst=m[:, 0:w], data1=m[:, 0:w], data2=diag[:, d - 1, lo:hi + 1], op=nl.minimum)
    nisa.tensor_tensor(dst=diag[:, d, lo:hi + 1], data1=m[:, 0:w], data2=cost[:, 0:w], op=nl.add)
  nisa.dma_copy(dst=dist, src=diag[:, N + M, N:N + 1])
  return dist


@nki.jit
def dtw_rowscan(x, y):
  B, N = x.shape
  _, M = y.shape
  assert B <= P_MAX
  dist = nl.ndarray((B, 1), dtype=nl.float32, buffer=nl.shared_hbm)

  neg_x = nl.ndarray((B, N), dtype=nl.float32, buffer=nl.sbuf)
  nisa.dma_copy(dst=neg_x, src=x)
  nisa.tensor_scalar(dst=neg_x, data=neg_x, op0=nl.multiply, operand0=-1.0)
  ys = nl.ndarray((B, M), dtype=nl.float32, buffer=nl.sbuf)
  nisa.dma_copy(dst=ys, src=y)

  # rows[:, i, j] = D[i, j]: row 0 = [0, BIG, ...], column 0 = BIG below it
  rows = nl.ndarray((B, N + 1, M + 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.memset(dst=rows, value=BIG)
  nisa.memset(dst=rows[:, 0, 0:1], value=0.0)
  cost = nl.ndarray((B, M), dtype=nl.float32, buffer=nl.sbuf)
  u = nl.ndarray((B, M), dtype=nl.float32, buffer=nl.sbuf)
  for i in nl.sequential_range(1, N + 1):
    nisa.activation(dst=cost, op=nl.square, data=ys, bias=neg_x[:, i - 1:i])
    nisa.tensor_tensor(dst=u, data1=rows[:, i - 1, 0:M], data2=rows[:, i - 1, 1:M + 1], op=nl.minimum)
    # D[i, j] = cost[j] + min(u[j], D[i, j - 1]), D[i, 0] = BIG
    nisa.tensor_tensor_scan(dst=rows[:, i, 1:M + 1], data0=u, data1=cost, initial=BIG, op0=nl.minimum,
                            op1=nl.add)
  nisa.dma_copy(dst=dist, src=rows[:, N, M:M + 1])
  return dist
