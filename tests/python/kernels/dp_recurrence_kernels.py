"""Dynamic-programming recurrences in the Beta-1 dialect (``neuronxcc.nki``), written the way public NKI kernels
port them to Trainium: the batch on the partitions, a ``nl.sequential_range`` loop over time (or over anti-diagonals)
carrying the DP state in SBUF, arange index expressions, value-returning ``nl``/``nisa`` calls:

- ``viterbi_decode(emissions, transitions)``: Viterbi decoding of a linear-chain CRF / HMM in the log domain.
  emissions [B, T, S] fp32 (B <= 128), transitions [S, S] (transitions[i, j] = score of i -> j). Per step the
  max-plus product of the previous scores [B, S] with the transitions: the transposed transition matrix (loaded
  once as a [1, S, S] index-expression view and broadcast to the B partitions) plus the scores broadcast along the
  middle axis, a max-reduce over the last axis; the argmax (backpointer) by comparing the candidates with their
  max and taking the largest of ``eq * (S - i)`` (a ``nisa.iota`` made once), i.e. the first maximal index as
  ``np.argmax``. The backpointers [B, T, S] int32 go to an HBM scratch tensor step by step; the backtrace then
  walks back from the best final state, reading one backpointer row per step and picking the current state's entry
  with a one-hot (``nisa.iota`` == state) multiply-reduce. Returns the path [B, T] int32 and the best score [B, 1].
- ``crf_log_partition(emissions, transitions, lengths)``: the CRF forward algorithm (log partition function /
  HMM log-likelihood) for variable sequence lengths. alpha [B, S] stays in SBUF; per step the max-shifted
  exponentials exp(alpha - max) are transposed on TensorE (``nisa.nc_transpose``) and multiplied with exp(transitions)
  (``nisa.nc_matmul``, the contraction over the previous state on the partitions), then log + max + emission. Rows
  whose sequence has ended (t >= lengths[b], a per-row [B, 1] int32 input) keep their alpha (a 0/1 blend).
  Returns log Z [B, 1].
- ``smith_waterman(seq_a, seq_b, match, mismatch, gap)``: local alignment score (linear gap) on int32, computed on
  anti-diagonals (wavefront): diagonal d holds H[i, d - i] for i = 0..N, so all its cells are one vector op; the
  three predecessors are diagonal d - 2 (H[i-1, j-1]) and d - 1 shifted by one (H[i-1, j], H[i, j-1]). seq_b is
  loaded reversed (``seq_b[i_p, M - 1 - i_m]``) into a buffer padded with a code that never matches, so the
  substitution scores of diagonal d are a slice of it. The floor at 0 of local alignment keeps the cells outside the
  matrix at 0 (or below the best valid cell), so no mask is needed. Returns the best score [B, 1] int32.
  Why a wavefront: a row of H depends on itself (H[i, j-1]) and would need a sequential scan; the cells of an
  anti-diagonal are independent.

Written for nsim's tests in the style of those kernels; not copies of any file. No nsim imports.
"""
import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl


@nki.jit
def viterbi_decode(emissions, transitions):
  B, T, S = emissions.shape
  assert B <= 128 and S * S <= 16384
  path = nl.ndarray((B, T), dtype=nl.int32, buffer=nl.shared_hbm)
  best = nl.ndarray((B, 1), dtype=nl.float32, buffer=nl.shared_hbm)
  backptr = nl.ndarray((B, T, S), dtype=nl.int32, buffer=nl.hbm)

  i_p = nl.arange(B)[:, None]
  i_s = nl.arange(S)[None, :]
  i_j = nl.arange(S)[None, :, None]
  i_i = nl.arange(S)[None, None, :]

  # trT[b, j, i] = transitions[i, j] on every partition
  trT = nl.load(transitions[i_i, i_j]).broadcast_to((B, S, S))
  em = nl.load(emissions)
  # S - i along the last axis (argmax = first maximal index)
  g = nl.mgrid[0:B, 0:S, 0:S]
  rev = nisa.iota(S - g.y + 0 * g.x + 0 * g.p, dtype=nl.float32)
  rev2 = nisa.iota(S - i_s + 0 * i_p, dtype=nl.float32)
  states = nisa.iota(i_s + 0 * i_p, dtype=nl.float32)

  score = nl.copy(em[i_p, 0, i_s])
  for t in nl.sequential_range(1, T):
    cand = nl.add(trT, score.reshape((B, 1, S)))
    mx = nl.max(cand, axis=[2])
    eq = nl.equal(cand, mx, dtype=nl.float32)
    first = nl.max(nl.multiply(eq, rev), axis=[2])
    bp = nl.subtract(S, first, dtype=nl.int32)
    nl.store(backptr[i_p, t, i_s], value=bp)
    score[...] = nl.add(mx, em[i_p, t, i_s])

  # best final state
  last = nl.max(score, axis=[1], keepdims=True)
  eq_last = nl.equal(score, last, dtype=nl.float32)
  cur = nl.subtract(S, nl.max(nl.multiply(eq_last, rev2), axis=[1], keepdims=True))
  path_sb = nl.ndarray((B, T), dtype=nl.int32)
  path_sb[i_p, T - 1] = cur
  for k in nl.sequential_range(T - 1):
    t = T - 1 - k
    bp_t = nl.load(backptr[i_p, t, i_s], dtype=nl.float32)
    onehot = nl.equal(states, cur, dtype=nl.float32)
    cur[...] = nl.sum(nl.multiply(onehot, bp_t), axis=[1], keepdims=True)
    path_sb[i_p, t - 1] = cur
  nl.store(path, value=path_sb)
  nl.store(best, value=last)
  return path, best


@nki.jit
def crf_log_partition(emissions, transitions, lengths):
  B, T, S = emissions.shape
  assert B <= 128 and S <= 128
  logz = nl.ndarray((B, 1), dtype=nl.float32, buffer=nl.shared_hbm)

  i_p = nl.arange(B)[:, None]
  i_s = nl.arange(S)[None, :]

  em = nl.load(emissions)
  exp_trans = nl.exp(nl.load(transitions))  # [S(i), S(j)], i on the partitions
  seq_len = nl.load(lengths, dtype=nl.float32)  # [B, 1]

  alpha = nl.copy(em[i_p, 0, i_s])
  for t in nl.sequential_range(1, T):
    m = nl.max(alpha, axis=[1], keepdims=True)
    p = nl.exp(nl.subtract(alpha, m))
    pT = nl.copy(nisa.nc_transpose(p))
    ps = nisa.nc_matmul(pT, exp_trans)  # [B, S] = p @ exp(transitions)
    nxt = nl.add(nl.add(nl.log(ps), m), em[i_p, t, i_s])
    keep = nl.greater(seq_len, t, dtype=nl.float32)  # 1 while t < length
    alpha[...] = nl.add(alpha, nl.multiply(nl.subtract(nxt, alpha), keep))

  m = nl.max(alpha, axis=[1], keepdims=True)
  ssum = nl.sum(nl.exp(nl.subtract(alpha, m)), axis=[1], keepdims=True)
  nl.store(logz, value=nl.add(nl.log(ssum), m))
  return logz


@nki.jit
def smith_waterman(seq_a, seq_b, match=2, mismatch=-1, gap=1):
  B, N = seq_a.shape
  _, M = seq_b.shape
  assert B <= 128 and mismatch <= 0 and gap >= 0
  score = nl.ndarray((B, 1), dtype=nl.int32, buffer=nl.shared_hbm)

  i_p = nl.arange(B)[:, None]
  i_n = nl.arange(N)[None, :]
  i_m = nl.arange(M)[None, :]

  a = nl.load(seq_a)
  # reversed b, padded with N never-matching codes on both sides
  b_pad = nl.full((B, M + 2 * N), -1, dtype=nl.int32)
  b_pad[i_p, N + i_m] = nl.load(seq_b[i_p, M - 1 - i_m])

  # diag[d, :, i] = H[i, d - i]; column i = 0 and diagonals 0, 1 are the zero border
  diag = nl.zeros((N + M + 1, nl.par_dim(B), N + 1), dtype=nl.int32)
  best = nl.zeros((B, N), dtype=nl.int32)
  for d in nl.sequential_range(2, N + M + 1):
    # b[j - 1] for j = d - i, i = 1..N
    same = nl.equal(a, b_pad[i_p, (M + N + 1 - d) + i_n], dtype=nl.int32)
    subst = nl.add(nl.multiply(same, match - mismatch), mismatch)
    h_diag = nl.add(diag[d - 2, i_p, i_n], subst)
    h_gap = nl.subtract(nl.maximum(diag[d - 1, i_p, i_n], diag[d - 1, i_p, 1 + i_n]), gap)
    diag[d, i_p, 1 + i_n] = nl.maximum(nl.maximum(h_diag, h_gap), 0)
    best[...] = nl.maximum(best, diag[d, i_p, 1 + i_n])
  nl.store(score, value=nl.max(best, axis=[1], keepdims=True))
  return score
