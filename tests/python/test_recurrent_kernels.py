"""Recurrent cells and sequence recurrences, written like public Trainium ports of speech / sequence models
(tests/python/kernels/recurrent_kernels.py, new dialect, and recurrent_kernels_beta1.py, Beta 1; both unmodified,
through ``nsim.compat``):

- an LSTM layer: the input projection of every step hoisted into one matmul group (x^T by PE transposes,
  W_ih^T x^T 512 tokens per matmul), then a ``sequential_range`` over time with the recurrent matmuls
  W_hh^T h_{t-1}^T (hidden on the partitions, H / 128 accumulating matmuls per gate block), sigmoid / tanh
  gates with the bias as the activation bias, c and h kept in SBUF across steps, h_t transposed back per step;
- a GRU layer (Beta 1): value-returning ``nisa.nc_matmul`` accumulated with ``psum += ...``,
  ``nl.load_transpose2d`` of x_t, a ragged batch (the mask ``lengths > t`` holds h where a sequence ended and
  zeroes its output) and a bidirectional option whose reverse direction reads steps T - 1 ... 0;
- a linear recurrence h_t = a_t h_{t-1} + b_t along the free dim by ``nisa.tensor_tensor_scan`` over chunks, each
  chunk started from the previous chunk's last column.

Checked: outputs against float64 numpy recurrences (errors relative to the largest output magnitude: fp32 1e-5,
bf16 1e-2; the LSTM / GRU outputs are bounded by 1 and their gates saturate, so bf16 rounding of the fed-back h
does not compound over the steps tested - the measured bf16 error stays under 5e-3 up to T = 64), that the
recurrent state, the ragged mask and the time reversal matter, no sanitizer report (pytest makes nsim's
CheckWarning an error), and structure / timing from the tilings: matmul and transpose counts equal the tiling
formulas, the input projection is outside the time loop as NG * ceil(T B / 512) matmuls of 512 tokens while the
loop body holds only the NG * NH recurrent matmuls, the time loop is kept as one kernel-IR loop of T iterations
(not unrolled), and the simulated time of the sequential recurrence grows linearly with T.

The nsim fix this family needed: a descending ``nl.sequential_range(n - 1, -1, -1)`` (the backward scan's chunk
loop) was written out iteration by iteration instead of kept as a loop: the tracer's test for "a piece of a loop
split by its comparisons" compared the loop's highest index with ``r[-1]``, the lowest one of a descending range,
so every descending loop whose body allocates tiles counted as split (right numbers, but no loop in the IR).
It now compares with ``max(r[0], r[-1])`` (``Tracer._record_piece``, python/nsim/tracer.py);
test_reverse_scan_descending_range_kept_as_loop. (The Beta-1 GRU compares the loop index with the lengths,
``nl.greater(lens, t)``: a per-iteration immediate, so that time loop is unrolled by design - correct numbers.)"""
import collections

import numpy as np
import pytest

from conftest import executed_ops, op_counts, require_core, sample_fixture  # noqa: E402

_core, ml_dtypes = require_core()
from numeric_helpers import close_to_max, f64 as _f64  # noqa: E402
from numeric_helpers import randn as _randn  # noqa: E402

BF16 = ml_dtypes.bfloat16

rk = sample_fixture("recurrent_kernels.py", module_only=True)
b1 = sample_fixture("recurrent_kernels_beta1.py", module_only=True)


_check = close_to_max  # (numeric_helpers)


def _sig(x):
    return 1.0 / (1.0 + np.exp(-x))


# --------------------------------------------------------------------------------------------------
# LSTM (new dialect)
# --------------------------------------------------------------------------------------------------

def _lstm_inputs(T, B, H, I, dtype, seed):
    x = _randn((T, B, I), dtype, seed)
    w_ih = _randn((I, 4 * H), dtype, seed + 1, scale=I ** -0.5)
    w_hh = _randn((H, 4 * H), dtype, seed + 2, scale=H ** -0.5)
    bias = _randn((4 * H,), np.float32, seed + 3, scale=0.1)
    return x, w_ih, w_hh, bias


def ref_lstm(x, w_ih, w_hh, bias):
    """torch.nn.LSTM (gates i, f, g, o; one bias) in float64, h0 = c0 = 0: h [T, B, H]."""
    x, w_ih, w_hh, bias = _f64(x), _f64(w_ih), _f64(w_hh), _f64(bias)
    T, B, _ = x.shape
    H = w_hh.shape[0]
    h, c = np.zeros((B, H)), np.zeros((B, H))
    out = np.zeros((T, B, H))
    for t in range(T):
        z = x[t] @ w_ih + h @ w_hh + bias
        i, f, g, o = _sig(z[:, :H]), _sig(z[:, H:2 * H]), np.tanh(z[:, 2 * H:3 * H]), _sig(z[:, 3 * H:])
        c = f * c + i * g
        h = o * np.tanh(c)
        out[t] = h
    return out


def _time_loop(kern, trips):
    """The kernel-IR loop of ``trips`` iterations at the top of the last run's body (the time loop)."""
    loops = [s["loop"] for s in kern.last_json["body"] if "loop" in s]
    hits = [lp for lp in loops if len(range(lp.get("start", 0), lp["stop"], lp.get("step", 1))) == trips]
    assert len(hits) == 1, [(lp.get("start", 0), lp["stop"]) for lp in loops]
    return hits[0]


# (T, B, H, I), dtype
LSTM_CASES = [
    ((16, 64, 128, 64), np.float32),
    ((32, 4, 512, 128), BF16),
    ((64, 16, 256, 128), BF16),
    ((128, 8, 128, 32), np.float32),
]


@pytest.mark.parametrize("dims,dtype", LSTM_CASES)
def test_lstm_matches_numpy_and_tiling(rk, dims, dtype):
    """h_t of every step against torch's LSTM recurrence in float64; the recurrence matters (W_hh = 0 is far off).
    Matmuls: NG * ceil(N / 512) for the hoisted projection (NG = 4H / 128 gate blocks, N = T B tokens) + T * NG * NH
    recurrent (NH = H / 128); PE transposes N / 128 (x^T) + T * NH (h back to [B, H]). The time loop is kept as one
    IR loop of T iterations whose body has the NG * NH recurrent matmuls and no input-projection matmul."""
    T, B, H, I = dims
    x, w_ih, w_hh, bias = _lstm_inputs(T, B, H, I, dtype, seed=T + H)
    kern = rk.lstm_layer
    out = kern(x, w_ih, w_hh, bias)
    assert out.dtype == np.dtype(dtype)
    want = ref_lstm(x, w_ih, w_hh, bias)
    _check(out, want, dtype)
    no_rec = ref_lstm(x, w_ih, np.zeros_like(w_hh), bias)
    assert np.abs(_f64(out) - no_rec).max() > 0.05

    NG, NH, N = 4 * H // 128, H // 128, T * B
    ops = op_counts(kern)
    assert ops["nc_matmul"] == NG * -(-N // 512) + T * NG * NH, ops
    assert ops["nc_transpose"] == N // 128 + T * NH, ops
    body = _time_loop(kern, T)["body"]
    step = collections.Counter(o["op"] for o in executed_ops(body))
    assert step["nc_matmul"] == NG * NH and step["activation"] == NG + NH, step
    # the hoisted projection: every matmul outside the time loop streams min(N, 512) tokens
    outside = [s for s in kern.last_json["body"] if not ("loop" in s and s["loop"] is _time_loop(kern, T))]
    assert collections.Counter(o["op"] for o in executed_ops(outside))["nc_matmul"] == NG * -(-N // 512)


def test_lstm_time_linear_in_steps(rk):
    """The recurrence is sequential: doubling T (16 -> 32 -> 64, B = 8, H = 256) adds about the same time per added
    step (the increments grow as the step count, ratio 2 within 20 %), and each step costs at least its
    NG * NH = 16 dependent recurrent matmuls (time per step > the 16->32 increment / 16 / 2)."""
    t = {}
    for T in (16, 32, 64):
        x, w_ih, w_hh, bias = _lstm_inputs(T, 8, 256, 128, BF16, seed=5)
        kern = rk.lstm_layer
        _check(kern(x, w_ih, w_hh, bias), ref_lstm(x, w_ih, w_hh, bias), BF16)
        _time_loop(kern, T)
        t[T] = kern.last_profile.total_time_ns
    d1, d2 = t[32] - t[16], t[64] - t[32]
    assert d1 > 0 and 1.6 < d2 / d1 < 2.4, t
    assert d1 > 0.5 * t[16], t  # the steps dominate: 16 more steps cost at least half a 16-step run


# --------------------------------------------------------------------------------------------------
# GRU (Beta 1), ragged and bidirectional
# --------------------------------------------------------------------------------------------------

def _gru_inputs(T, B, H, I, D, dtype, seed, ragged=True):
    rng = np.random.default_rng(seed)
    x = _randn((T, B, I), dtype, seed)
    lens = (rng.integers(1, T + 1, (1, B)) if ragged else np.full((1, B), T)).astype(np.float32)
    lens[0, 0] = T
    w_ih = _randn((D, I, 3 * H), dtype, seed + 1, scale=I ** -0.5)
    w_hh = _randn((D, H, 3 * H), dtype, seed + 2, scale=H ** -0.5)
    b_ih = _randn((D, 3 * H, 1), np.float32, seed + 3, scale=0.1)
    b_hh = _randn((D, 3 * H, 1), np.float32, seed + 4, scale=0.1)
    return x, lens, w_ih, w_hh, b_ih, b_hh


def ref_gru(x, lens, w_ih, w_hh, b_ih, b_hh, reverse_reads=True):
    """torch.nn.GRU over packed (ragged) sequences in float64: out [D, T, H, B], 0 past a sequence's length; the
    reverse direction starts at each sequence's last valid step (``reverse_reads=False``: it runs forward too)."""
    x, w_ih, w_hh, b_ih, b_hh = _f64(x), _f64(w_ih), _f64(w_hh), _f64(b_ih), _f64(b_hh)
    T, B, _ = x.shape
    D, H = w_hh.shape[0], w_hh.shape[1]
    out = np.zeros((D, T, H, B))
    for d in range(D):
        h = np.zeros((B, H))
        for t in range(T):
            ts = T - 1 - t if (d == 1 and reverse_reads) else t
            gi = x[ts] @ w_ih[d] + b_ih[d, :, 0]
            gh = h @ w_hh[d] + b_hh[d, :, 0]
            r = _sig(gi[:, :H] + gh[:, :H])
            z = _sig(gi[:, H:2 * H] + gh[:, H:2 * H])
            n = np.tanh(gi[:, 2 * H:] + r * gh[:, 2 * H:])
            m = (lens[0] > ts)[:, None]
            h = np.where(m, (1 - z) * n + z * h, h)
            out[d, ts] = (h * m).T
    return out


# (T, B, H, I), D, dtype
GRU_CASES = [
    ((16, 8, 128, 64), 2, np.float32),
    ((32, 32, 64, 128), 1, BF16),
    ((24, 16, 128, 128), 2, BF16),
]


@pytest.mark.parametrize("dims,D,dtype", GRU_CASES)
def test_gru_ragged_bidirectional_matches_numpy(b1, dims, D, dtype):
    """The packed-sequence GRU: outputs past each length are exactly 0, and the ragged mask and (D = 2) the
    reverse reading matter; 6 matmuls per step and direction (r, z: input + recurrent into one PSUM tile each;
    n: input and recurrent apart), one load_transpose2d per step and direction."""
    T, B, H, I = dims
    x, lens, w_ih, w_hh, b_ih, b_hh = _gru_inputs(T, B, H, I, D, dtype, seed=T + B)
    kern = b1.gru_layer
    out = kern(x, lens, w_ih, w_hh, b_ih, b_hh, bidirectional=D == 2)
    assert out.dtype == np.dtype(dtype) and out.shape == (D, T, H, B)
    want = ref_gru(x, lens, w_ih, w_hh, b_ih, b_hh)
    _check(out, want, dtype)
    dead = np.arange(T)[:, None] >= lens[0][None, :]  # [T, B]
    assert dead.any() and not _f64(out).transpose(0, 1, 3, 2)[:, dead].any()
    full = ref_gru(x, np.full_like(lens, T), w_ih, w_hh, b_ih, b_hh)
    assert np.abs(_f64(out) - full).max() > 0.05  # the mask changes the live outputs too (reverse) or holds h
    if D == 2:
        fwd_only = ref_gru(x, lens, w_ih, w_hh, b_ih, b_hh, reverse_reads=False)
        assert np.abs(_f64(out[1]) - fwd_only[1]).max() > 0.05
    ops = op_counts(kern)
    # + 1: the partition broadcast of the lengths row (``broadcast_to((H, B))``) is a ones matmul
    assert ops["nc_matmul"] == 6 * D * T + 1 and ops["dma_transpose"] == D * T, ops


def test_gru_time_linear_in_steps(b1):
    """Doubling T (16 -> 32 -> 64, B = 16, H = 128, one direction) doubles the time of the recurrence: the
    increments have ratio 2 within 20 %."""
    t = {}
    for T in (16, 32, 64):
        args = _gru_inputs(T, 16, 128, 128, 1, BF16, seed=9)
        kern = b1.gru_layer
        _check(kern(*args), ref_gru(*args), BF16)
        t[T] = kern.last_profile.total_time_ns
    d1, d2 = t[32] - t[16], t[64] - t[32]
    assert d1 > 0 and 1.6 < d2 / d1 < 2.4, t


# --------------------------------------------------------------------------------------------------
# linear recurrence by tensor_tensor_scan (new dialect)
# --------------------------------------------------------------------------------------------------

def _scan_inputs(R, T, dtype, seed):
    rng = np.random.default_rng(seed)
    a = rng.uniform(0.8, 1.0, (R, T)).astype(dtype)
    b = _randn((R, T), dtype, seed + 1, scale=0.1)
    h0 = _randn((R, 1), np.float32, seed + 2)
    return a, b, h0


def ref_scan(a, b, h0, reverse=False):
    a, b = _f64(a), _f64(b)
    h = _f64(h0)[:, 0]
    out = np.zeros_like(a)
    for t in (range(a.shape[1] - 1, -1, -1) if reverse else range(a.shape[1])):
        h = a[:, t] * h + b[:, t]
        out[:, t] = h
    return out


@pytest.mark.parametrize("R,T,chunk,dtype", [(128, 2048, 512, np.float32), (64, 1024, 256, BF16),
                                             (96, 1536, 512, np.float32)])
def test_linear_scan_matches_numpy(rk, R, T, chunk, dtype):
    """h_t = a_t h_{t-1} + b_t from h0 over T columns: the chunk carry matters (restarting each chunk from h0 is far
    off); one tensor_tensor_scan per chunk, in a kept loop of T / chunk iterations."""
    a, b, h0 = _scan_inputs(R, T, dtype, seed=R + T)
    kern = rk.linear_scan
    out = kern(a, b, h0, chunk=chunk)
    want = ref_scan(a, b, h0)
    _check(out, want, dtype)
    restart = np.concatenate([ref_scan(a[:, c:c + chunk], b[:, c:c + chunk], h0) for c in range(0, T, chunk)], 1)
    assert np.abs(_f64(out) - restart).max() > 0.1 * np.abs(want).max()
    assert op_counts(kern)["tensor_tensor_scan"] == T // chunk
    _time_loop(kern, T // chunk)


def test_linear_scan_time_linear_in_length(rk):
    """The chunks are dependent: 2x / 4x the length costs ~2x / ~4x the time increment (ratio 2 within 20 %)."""
    t = {}
    for T in (2048, 4096, 8192):
        a, b, h0 = _scan_inputs(128, T, np.float32, seed=3)
        kern = rk.linear_scan
        _check(kern(a, b, h0, chunk=512), ref_scan(a, b, h0), np.float32)
        t[T] = kern.last_profile.total_time_ns
    d1, d2 = t[4096] - t[2048], t[8192] - t[4096]
    assert d1 > 0 and 1.6 < d2 / d1 < 2.4, t


# --------------------------------------------------------------------------------------------------
# CTC forward algorithm in log space (new dialect)
# --------------------------------------------------------------------------------------------------

def _ctc_inputs(B, T, L, dtype, seed, V=6):
    """Per-frame log-softmax over V symbols gathered at the extended labels (blank 0, l1, 0, l2, ..., 0) and the
    additive skip mask (0 where s - 2 -> s is allowed: s a label unlike label s - 2, else -1e30)."""
    rng = np.random.default_rng(seed)
    S = 2 * L + 1
    lab = rng.integers(1, V, (B, L))
    logits = rng.standard_normal((B, T, V))
    lp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    ext = np.zeros((B, S), int)
    ext[:, 1::2] = lab
    em = np.take_along_axis(lp, np.broadcast_to(ext[:, None, :], (B, T, S)), 2).astype(dtype)
    skip = np.full((B, S), -1e30, np.float32)
    for s in range(2, S):
        skip[(ext[:, s] != 0) & (ext[:, s] != ext[:, s - 2]), s] = 0.0
    return em, skip


def ref_ctc(em, skip):
    """alpha [B, T, S] in float64 with true -inf (np.logaddexp)."""
    em = _f64(em)
    B, T, S = em.shape
    allow = np.where(skip < -1e29, -np.inf, 0.0)
    a = np.full((B, S), -np.inf)
    a[:, :2] = em[:, 0, :2]
    out = np.empty((B, T, S))
    out[:, 0] = a
    for t in range(1, T):
        s1 = np.full((B, S), -np.inf)
        s1[:, 1:] = a[:, :-1]
        s2 = np.full((B, S), -np.inf)
        s2[:, 2:] = a[:, :-2] + allow[:, 2:]
        a = np.logaddexp(np.logaddexp(a, s1), s2) + em[:, t]
        out[:, t] = a
    return out


@pytest.mark.parametrize("B,T,L,dtype", [(32, 64, 10, np.float32), (128, 48, 20, BF16), (8, 100, 3, np.float32)])
def test_ctc_forward_matches_numpy(rk, B, T, L, dtype):
    """Every reachable alpha_t[s] against float64 logaddexp (relative to max |alpha|, 1e-5: the recurrence is in
    fp32 even for bf16 emissions, which the reference reads rounded); unreachable states stay at the -1e30 floor;
    the skip transition matters (without it the last label's alphas differ). The frame loop stays an IR loop: its
    body takes the tiles of line ``d`` three times per frame (the Python loop over the three terms) over 4 rotating
    buffers, so it is peeled and recorded 4 frames per pass (docs/kernel-json.md "A line taken several times per
    iteration"): (T - 3) // 4 passes, the other frames written out."""
    em, skip = _ctc_inputs(B, T, L, dtype, seed=B + T)
    kern = rk.ctc_forward
    out = kern(em, skip)
    want = ref_ctc(em, skip)
    fin = np.isfinite(want)
    assert (~fin).any() and fin.all(axis=(0, 2))[-1]  # early frames have unreachable states, the last none
    _check(_f64(out)[fin], want[fin], np.float32)
    assert (_f64(out)[~fin] <= -1e29).all()
    no_skip = ref_ctc(em, np.full_like(skip, -1e30))
    assert np.abs(_f64(out)[:, -1] - no_skip[:, -1]).max() > 0.1
    _time_loop(kern, (T - 3) // 4)


def test_ctc_forward_time_linear_in_frames(rk):
    """One dependent log-space update per frame: the time increments of T = 32 -> 64 -> 128 have ratio 2 (within
    20 %)."""
    t = {}
    for T in (32, 64, 128):
        em, skip = _ctc_inputs(64, T, 12, np.float32, seed=2)
        kern = rk.ctc_forward
        out = kern(em, skip)
        want = ref_ctc(em, skip)
        fin = np.isfinite(want)
        _check(_f64(out)[fin], want[fin], np.float32)
        t[T] = kern.last_profile.total_time_ns
    d1, d2 = t[64] - t[32], t[128] - t[64]
    assert d1 > 0 and 1.6 < d2 / d1 < 2.4, t


# --------------------------------------------------------------------------------------------------
# the nsim fix: a sequential_range with a negative step was written out instead of kept
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_reverse_scan_descending_range_kept_as_loop(rk, dtype):
    """``nl.sequential_range(n - 1, -1, -1)`` (the backward direction of a scan, chunks right to left): the right
    numbers, and the chunk loop kept as one IR loop of step -1 (it was written out iteration by iteration: the
    tracer took a descending range's last value r[-1] = its lowest for its highest and treated the whole loop as
    a piece of a split loop). Its time equals the unrolled trace's within 5 %."""
    R, T, C = 128, 2048, 256
    a, b, h0 = _scan_inputs(R, T, dtype, seed=17)
    kern = rk.linear_scan
    out = kern(a, b, h0, chunk=C, reverse=True)
    want = ref_scan(a, b, h0, reverse=True)
    _check(out, want, dtype)
    assert np.abs(_f64(out) - ref_scan(a, b, h0)).max() > 0.1 * np.abs(want).max()  # not the forward scan
    lp = _time_loop(kern, T // C)
    assert (lp.get("start", 0), lp["stop"], lp.get("step", 1)) == (T // C - 1, -1, -1), lp
    kept = kern.last_profile.total_time_ns
    unrolled = kern.options(loops="unroll")
    np.testing.assert_array_equal(_f64(unrolled(a, b, h0, chunk=C, reverse=True)), _f64(out))
    assert not any("loop" in s for s in unrolled.last_json["body"])
    assert abs(kept - unrolled.last_profile.total_time_ns) <= 0.05 * kept, (kept, unrolled.last_profile.total_time_ns)
