"""Dynamic-programming recurrences written like public NKI kernels (tests/python/kernels/dp_recurrence_kernels.py,
Beta-1 dialect, and dp_recurrence_kernels_new.py, new dialect; both unmodified, through ``nsim.compat``): the batch
on the partitions, a sequential loop over time (or anti-diagonals / rows) carrying the DP state in SBUF.

- Viterbi decoding of a linear-chain CRF (Beta 1): max-plus product with the transitions, argmax backpointers by
  iota compares stored to HBM per step, backtrace by a one-hot multiply-reduce of the backpointer row read back (and,
  inline, the other backtrace: an indirect load of one backpointer per row by a runtime index);
- the CRF forward algorithm (Beta 1): log-sum-exp with exp(transitions) on TensorE (nc_transpose + nc_matmul),
  per-row sequence lengths as a 0/1 blend;
- Smith-Waterman local alignment on int32 on anti-diagonals (Beta 1; b loaded reversed by a negative arange
  coefficient);
- the CTC loss forward pass in log space (new dialect; emissions gathered once by nc_n_gather, skip mask);
- dynamic time warping on anti-diagonals and row by row with ``tensor_tensor_scan`` (new dialect).

Checked: exact integers (Viterbi paths and backpointer choice with ties = the first maximal index as np.argmax,
alignment scores), float outputs against float64 numpy DP references (fp32 1e-5: log/exp are computed in fp32
with their arguments kept near 0 by the max shifts, so no looser tolerance is needed), no sanitizer report (every
warning is an error), the instruction counts per step and the DMA / HBM bytes each kernel's structure implies, and
timing: the sequential dependency makes the time grow linearly with T (equal increments per added step), the
length mask of the CRF does not shorten the loop (all rows pay for the longest), and for DTW the row scan
(N steps of 3 instructions) beats the wavefront (N + M - 1 steps of 5).

No nsim fix was needed by this family."""
import numpy as np
import pytest

from conftest import executed_ops, require_core, run_clean, sample_fixture  # noqa: E402
from conftest import op_counts as _ops  # noqa: E402

_core, ml_dtypes = require_core()
from numeric_helpers import close, f64 as _f64, randn as _randn  # noqa: E402

dp = sample_fixture("dp_recurrence_kernels.py")
dpn = sample_fixture("dp_recurrence_kernels_new.py", module_only=True)


# --------------------------------------------------------------------------------------------------
# references
# --------------------------------------------------------------------------------------------------

def ref_viterbi(em, tr):
    """Best path [B, T] (argmax ties -> first index) and its score [B], in float64."""
    em, tr = _f64(em), _f64(tr)
    B, T, _ = em.shape
    score = em[:, 0].copy()
    bps = []
    for t in range(1, T):
        cand = score[:, :, None] + tr[None]          # [b, i, j]
        bps.append(cand.argmax(1))
        score = cand.max(1) + em[:, t]
    cur = score.argmax(1)
    path = [cur]
    for bp in bps[::-1]:
        cur = bp[np.arange(B), cur]
        path.append(cur)
    return np.stack(path[::-1], 1), score.max(1)


def ref_crf_logz(em, tr, lengths):
    em, tr = _f64(em), _f64(tr)
    out = []
    for b in range(em.shape[0]):
        a = em[b, 0]
        for t in range(1, int(lengths[b, 0])):
            c = a[:, None] + tr
            mx = c.max(0)
            a = mx + np.log(np.exp(c - mx).sum(0)) + em[b, t]
        out.append(np.log(np.exp(a - a.max()).sum()) + a.max())
    return np.array(out)


def ref_smith_waterman(a, b, match, mismatch, gap):
    out = []
    for r in range(a.shape[0]):
        N, M = a.shape[1], b.shape[1]
        H = np.zeros((N + 1, M + 1), np.int64)
        s = np.where(a[r][:, None] == b[r][None, :], match, mismatch)
        for i in range(1, N + 1):
            for j in range(1, M + 1):
                H[i, j] = max(0, H[i - 1, j - 1] + s[i - 1, j - 1], H[i - 1, j] - gap, H[i, j - 1] - gap)
        out.append(H.max())
    return np.array(out)


def ref_ctc(lp, labels):
    lp = _f64(lp)
    out = []
    for b in range(lp.shape[0]):
        ext = [0]
        for lab in labels[b]:
            ext += [int(lab), 0]
        ext = np.array(ext)
        S = len(ext)
        skip = np.zeros(S, bool)
        skip[2:] = (ext[2:] != 0) & (ext[2:] != ext[:-2])
        a = np.full(S, -np.inf)
        a[:2] = lp[b, 0, ext[:2]]
        for t in range(1, lp.shape[1]):
            a1 = np.concatenate([[-np.inf], a[:-1]])
            a2 = np.where(skip, np.concatenate([[-np.inf, -np.inf], a[:-2]]), -np.inf)
            a = np.logaddexp(np.logaddexp(a, a1), a2) + lp[b, t, ext]
        out.append(-np.logaddexp(a[-1], a[-2]))
    return np.array(out)


def ref_dtw(x, y):
    x, y = _f64(x), _f64(y)
    out = []
    for r in range(x.shape[0]):
        N, M = x.shape[1], y.shape[1]
        c = (x[r][:, None] - y[r][None, :]) ** 2
        D = np.full((N + 1, M + 1), np.inf)
        D[0, 0] = 0.0
        for i in range(1, N + 1):
            for j in range(1, M + 1):
                D[i, j] = c[i - 1, j - 1] + min(D[i - 1, j - 1], D[i - 1, j], D[i, j - 1])
        out.append(D[N, M])
    return np.array(out)


def _log_softmax(B, T, C, seed):
    z = _randn((B, T, C), np.float64, seed=seed, scale=2.0)
    return (z - np.log(np.exp(z).sum(-1, keepdims=True))).astype(np.float32)


def _labels(B, L, C, seed, repeats=True):
    lab = np.random.default_rng(seed).integers(1, C, (B, L)).astype(np.int32)
    if repeats:  # some adjacent repeats, where the skip transition is forbidden
        lab[::2, 2] = lab[::2, 1]
    return lab


# --------------------------------------------------------------------------------------------------
# Viterbi
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("B,T,S", [(128, 16, 16), (37, 10, 5), (8, 24, 32)])
def test_viterbi_matches_numpy(dp, B, T, S):
    m = dp[0]
    em = _randn((B, T, S), np.float32, seed=T + S)
    tr = _randn((S, S), np.float32, seed=S)
    path, best = run_clean(m.viterbi_decode, em, tr)
    want_p, want_s = ref_viterbi(em, tr)
    assert path.dtype == np.int32 and path.shape == (B, T)
    np.testing.assert_array_equal(path, want_p)
    close(best[:, 0], want_s)


def test_viterbi_ties_take_the_first_index(dp):
    """Integer scores in {-1, 0, 1}: most maxima are tied. The argmax by ``S - max(eq * (S - i))`` picks the first
    maximal previous state at every step and the first best final state, exactly as np.argmax."""
    m = dp[0]
    rng = np.random.default_rng(3)
    B, T, S = 64, 12, 6
    em = rng.integers(-1, 2, (B, T, S)).astype(np.float32)
    tr = rng.integers(-1, 2, (S, S)).astype(np.float32)
    path, best = run_clean(m.viterbi_decode, em, tr)
    want_p, want_s = ref_viterbi(em, tr)
    # ties among the candidates of a step: the first step's max-plus product already has them in most rows
    c1 = _f64(em[:, 0])[:, :, None] + _f64(tr)[None]
    assert ((c1 == c1.max(1, keepdims=True)).sum(1) > 1).any(1).sum() > B // 2
    np.testing.assert_array_equal(path, want_p)
    np.testing.assert_array_equal(best[:, 0], want_s)
    # a different tie rule (last index) would give another path
    assert not np.array_equal(path, _last_index_paths(em, tr))


def _last_index_paths(em, tr):
    """Viterbi with ties broken towards the last index (what the test above must rule out)."""
    S = em.shape[2]
    p, _ = ref_viterbi(em[:, :, ::-1], tr[::-1, ::-1])
    return S - 1 - p


def test_viterbi_structure(dp):
    """B = 32, T = 8, S = 8. Forward step (T - 1 of them): add (candidates), max-reduce, equal, multiply, max-reduce
    (the first maximal index), S - that (tensor_scalar), the backpointer store, add of the emissions; backtrace
    step: the backpointer row load, one-hot (tensor_scalar equal with the state column), multiply, sum-reduce and
    the copy into the path tile. HBM: emissions + transitions + the backpointers read back once; written: the
    backpointers, the path and the best scores."""
    m = dp[0]
    B, T, S = 32, 8, 8
    em = _randn((B, T, S), np.float32, seed=1)
    tr = _randn((S, S), np.float32, seed=2)
    run_clean(m.viterbi_decode, em, tr)
    c = _ops(m.viterbi_decode)
    steps = T - 1
    assert c["tensor_tensor"] == 4 * steps + steps + 1, c
    assert c["tensor_reduce"] == 2 * steps + steps + 2, c
    assert c["tensor_scalar"] == steps + steps + 2, c
    assert c["dma_copy"] == 2 + 2 * steps + 2, c
    assert c["iota"] == 3 and c["nc_matmul"] == 1, c  # iotas once; the transitions broadcast to the partitions
    stores = [o for o in executed_ops(m.viterbi_decode.last_json["body"])
              if o["op"] == "dma_copy" and isinstance(o["dst"], dict) and o["dst"]["tensor"] == "backptr"]
    assert len(stores) == steps
    prof = m.viterbi_decode.last_profile
    bp_bytes = steps * B * S * 4
    assert prof.stat("memory.hbm_read_bytes") == em.nbytes + tr.nbytes + bp_bytes
    assert prof.stat("memory.hbm_write_bytes") == bp_bytes + B * T * 4 + B * 4


def test_viterbi_time_is_linear_in_T(dp):
    """Every step depends on the previous one, so the steps cannot overlap: doubling T adds the same time per step
    (equal increments from T = 8 -> 16 -> 32 within 10 %), and that time is well above zero."""
    m = dp[0]
    B, S = 64, 16
    tr = _randn((S, S), np.float32, seed=2)
    times = {}
    for T in (8, 16, 32):
        run_clean(m.viterbi_decode, _randn((B, T, S), np.float32, seed=T), tr)
        times[T] = m.viterbi_decode.last_profile.total_time_ns
    d1 = (times[16] - times[8]) / 8
    d2 = (times[32] - times[16]) / 16
    assert d1 > 0 and d2 == pytest.approx(d1, rel=0.1), times
    assert times[32] > 3 * times[8] / 2, times


# --------------------------------------------------------------------------------------------------
# CRF forward algorithm
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("B,T,S", [(128, 20, 16), (45, 9, 7), (16, 32, 64)])
def test_crf_log_partition_matches_numpy(dp, B, T, S):
    m = dp[0]
    em = _randn((B, T, S), np.float32, seed=B + T)
    tr = _randn((S, S), np.float32, seed=S, scale=0.5)
    lengths = np.random.default_rng(T).integers(1, T + 1, (B, 1)).astype(np.int32)
    lengths[0, 0], lengths[-1, 0] = 1, T
    logz = run_clean(m.crf_log_partition, em, tr, lengths)
    assert logz.shape == (B, 1) and logz.dtype == np.float32
    close(logz[:, 0], ref_crf_logz(em, tr, lengths))


def test_crf_log_partition_structure_and_mask_cost(dp):
    """Per step: max-reduce, exp and log (ScalarE), the TensorE transpose and matmul, its PSUM eviction; the length
    mask is a compare and a blend, so a row whose sequence has ended still runs every step: the kernel takes exactly
    as long with all lengths 1 as with all lengths T. HBM: the inputs once, log Z out (the state stays in SBUF)."""
    m = dp[0]
    B, T, S = 32, 12, 16
    em = _randn((B, T, S), np.float32, seed=1)
    tr = _randn((S, S), np.float32, seed=2)
    times = []
    for L in (T, 1):
        lengths = np.full((B, 1), L, np.int32)
        out = run_clean(m.crf_log_partition, em, tr, lengths)
        close(out[:, 0], ref_crf_logz(em, tr, lengths))
        times.append(m.crf_log_partition.last_profile.total_time_ns)
        c = _ops(m.crf_log_partition)
        steps = T - 1
        assert c["nc_matmul"] == steps and c["nc_transpose"] == steps, c
        assert c["activation"] == 2 * steps + 3, c   # exp, log per step; exp(transitions); final exp, log
        assert c["tensor_reduce"] == steps + 2 and c["dma_copy"] == 4, c
        prof = m.crf_log_partition.last_profile
        assert prof.stat("memory.hbm_read_bytes") == em.nbytes + tr.nbytes + lengths.nbytes
        assert prof.stat("memory.hbm_write_bytes") == B * 4
    assert times[0] == times[1], times


# --------------------------------------------------------------------------------------------------
# Smith-Waterman
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("B,N,M,scoring", [
    (128, 48, 40, (2, -1, 1)),
    (5, 17, 33, (3, -2, 2)),
    (20, 32, 32, (1, 0, 1)),
])
def test_smith_waterman_matches_numpy(dp, B, N, M, scoring):
    m = dp[0]
    rng = np.random.default_rng(N + M)
    a = rng.integers(0, 4, (B, N)).astype(np.int32)
    b = rng.integers(0, 4, (B, M)).astype(np.int32)
    b[0, :min(N, M)] = a[0, :min(N, M)]           # a long exact match
    score = run_clean(m.smith_waterman, a, b, *scoring)
    assert score.dtype == np.int32
    np.testing.assert_array_equal(score[:, 0], ref_smith_waterman(a, b, *scoring))


def test_smith_waterman_structure(dp):
    """N + M - 1 anti-diagonals; each one: the substitution scores (equal with a slice of the reversed b, times
    (match - mismatch), + mismatch), the three predecessors (add, maximum, - gap), the max with the diagonal
    cell and with 0 and the running best: 5 tensor_tensor + 4 tensor_scalar. The DP table never leaves SBUF: HBM
    reads are the two sequences, the only write is the score."""
    m = dp[0]
    B, N, M = 16, 24, 40
    rng = np.random.default_rng(0)
    a = rng.integers(0, 4, (B, N)).astype(np.int32)
    b = rng.integers(0, 4, (B, M)).astype(np.int32)
    run_clean(m.smith_waterman, a, b, 2, -1, 1)
    c = _ops(m.smith_waterman)
    D = N + M - 1
    assert c["tensor_tensor"] == 5 * D and c["tensor_scalar"] == 4 * D, c
    assert c["dma_copy"] == 3 and c["tensor_reduce"] == 1, c
    prof = m.smith_waterman.last_profile
    assert prof.stat("memory.hbm_read_bytes") == a.nbytes + b.nbytes
    assert prof.stat("memory.hbm_write_bytes") == B * 4


# --------------------------------------------------------------------------------------------------
# CTC loss
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("B,T,C,L", [(128, 40, 20, 8), (33, 25, 6, 5), (4, 60, 50, 20)])
def test_ctc_loss_matches_numpy(dpn, B, T, C, L):
    lp = _log_softmax(B, T, C, seed=T + C)
    lab = _labels(B, L, C, seed=L)
    loss = run_clean(dpn.ctc_loss_fwd, lp, lab)
    assert loss.shape == (B, 1) and loss.dtype == np.float32
    want = ref_ctc(lp, lab)
    assert np.isfinite(want).all()
    close(loss[:, 0], want)


def test_ctc_loss_skip_rule_matters(dpn):
    """With every label equal to the previous one the skip transitions are all forbidden; allowing them (the
    reference with the rule dropped) would give a smaller loss, so the kernel must apply the rule."""
    B, T, C, L = 8, 30, 5, 4
    lp = _log_softmax(B, T, C, seed=9)
    lab = np.full((B, L), 2, np.int32)
    loss = run_clean(dpn.ctc_loss_fwd, lp, lab)
    close(loss[:, 0], ref_ctc(lp, lab))
    no_rule = ref_ctc(lp, np.tile(np.array([[2, 3, 2, 3]], np.int32), (B, 1)))
    assert not np.allclose(loss[:, 0], no_rule)


def test_ctc_loss_structure_and_linear_time(dpn):
    """One gather (nc_n_gather) of every step's emissions before the loop; per step 8 tensor_tensor, 2 activations
    (exp of the three stacked predecessors, log) and 1 tensor_reduce. The log-probabilities are read from HBM once.
    Time: T - 1 dependent steps, equal increments per step from T = 16 -> 32 -> 64 (within 10 %)."""
    B, C, L = 64, 12, 6
    times = {}
    for T in (16, 32, 64):
        lp = _log_softmax(B, T, C, seed=T)
        lab = _labels(B, L, C, seed=1)
        run_clean(dpn.ctc_loss_fwd, lp, lab)
        c = _ops(dpn.ctc_loss_fwd)
        steps = T - 1
        assert c["nc_n_gather"] == 1 and c["iota"] == 1, c
        assert c["tensor_tensor"] == 8 * steps + 3 and c["activation"] == 2 * steps + 2, c
        assert c["tensor_reduce"] == steps + 1 and c["dma_copy"] == 3, c
        prof = dpn.ctc_loss_fwd.last_profile
        assert prof.stat("memory.hbm_read_bytes") == lp.nbytes + lab.nbytes
        assert prof.stat("memory.hbm_write_bytes") == B * 4
        times[T] = prof.total_time_ns
    d1 = (times[32] - times[16]) / 16
    d2 = (times[64] - times[32]) / 32
    assert d1 > 0 and d2 == pytest.approx(d1, rel=0.1), times


# --------------------------------------------------------------------------------------------------
# DTW
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("B,N,M", [(128, 24, 32), (9, 40, 17), (3, 1, 12), (16, 33, 33)])
@pytest.mark.parametrize("name", ["dtw_wavefront", "dtw_rowscan"])
def test_dtw_matches_numpy(dpn, name, B, N, M):
    x = _randn((B, N), np.float32, seed=N)
    y = _randn((B, M), np.float32, seed=M + 1)
    if N == M:
        y[0] = x[0]  # identical sequences: distance 0
    dist = run_clean(getattr(dpn, name), x, y)
    want = ref_dtw(x, y)
    assert dist.shape == (B, 1)
    close(dist[:, 0], want)
    if N == M:
        assert dist[0, 0] == 0.0


def test_dtw_rowscan_beats_wavefront(dpn):
    """Same distances. The wavefront needs N + M - 1 dependent steps of 5 instructions (cost, square, two minima,
    add); the row form needs N steps of 3 (square with a bias, one minimum, one tensor_tensor_scan that resolves
    the in-row dependency in hardware), so it is faster, although each scan is a serial pass along the row."""
    B, N, M = 64, 32, 48
    x = _randn((B, N), np.float32, seed=1)
    y = _randn((B, M), np.float32, seed=2)
    dw = run_clean(dpn.dtw_wavefront, x, y)
    cw = _ops(dpn.dtw_wavefront)
    tw = dpn.dtw_wavefront.last_profile.total_time_ns
    dr = run_clean(dpn.dtw_rowscan, x, y)
    cr = _ops(dpn.dtw_rowscan)
    tr = dpn.dtw_rowscan.last_profile.total_time_ns
    close(dw, dr)
    D = N + M - 1
    assert cw["tensor_tensor"] == 4 * D and cw["activation"] == D, cw
    assert cr["tensor_tensor_scan"] == N and cr["activation"] == N and cr["tensor_tensor"] == N, cr
    for k in (dpn.dtw_wavefront, dpn.dtw_rowscan):
        assert k.last_profile.stat("memory.hbm_read_bytes") == x.nbytes + y.nbytes
    assert tr < tw, (tr, tw)


def test_viterbi_backtrace_by_row_gather(dp):
    """The other backtrace kernel authors write: the backpointer of the current state read straight from HBM by an
    indirect load of one element per row (``flat[idx[i_p, 0], i_0]`` with idx = b T S + t S + state, a
    ``sequential_range`` walking t down). Same path as numpy, one indirect DMA of B elements per step."""
    _, nki, nl, nisa = dp

    @nki.jit
    def backtrace(backptr, last_state):
        B, T, S = backptr.shape
        out = nl.ndarray((B, T), dtype=nl.int32, buffer=nl.shared_hbm)
        flat = backptr.reshape((B * T * S, 1))
        i_p = nl.arange(B)[:, None]
        i_0 = nl.arange(1)[None, :]
        cur = nl.load(last_state)
        row0 = nisa.iota(i_p * (T * S) + 0 * i_0, dtype=nl.int32)
        path = nl.ndarray((B, T), dtype=nl.int32)
        path[i_p, T - 1] = cur
        for t in nl.sequential_range(T - 1, 0, -1):
            idx = nl.add(row0, nl.add(cur, t * S))
            cur[...] = nl.load(flat[idx[i_p, 0], i_0])
            path[i_p, t - 1] = cur
        nl.store(out, value=path)
        return out

    rng = np.random.default_rng(5)
    B, T, S = 48, 10, 7
    bp = rng.integers(0, S, (B, T, S)).astype(np.int32)
    last = rng.integers(0, S, (B, 1)).astype(np.int32)
    got = run_clean(backtrace, bp, last)
    cur = last[:, 0]
    want = [cur]
    for t in range(T - 1, 0, -1):
        cur = bp[np.arange(B), t, cur]
        want.append(cur)
    np.testing.assert_array_equal(got, np.stack(want[::-1], 1))
    gathers = [o for o in executed_ops(backtrace.last_json["body"])
               if o["op"] == "dma_copy" and isinstance(o["src"], dict) and o["src"]["tensor"] == "backptr"]
    assert len(gathers) == T - 1
    assert backtrace.last_profile.stat("memory.hbm_read_bytes") == (T - 1) * B * 4 + B * 4
