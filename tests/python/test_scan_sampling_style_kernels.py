"""Scan, sequence-mixing and sampling kernels written like the public NKI kernels that have them
(tests/python/kernels/scan_sampling_style_kernels.py, Beta-1 dialect, and scan_sampling_style_kernels_new.py, new
dialect; both unmodified, through ``nsim.compat``): prefix sums along the free axis (``tensor_tensor_scan`` chained
across column chunks by ``initial=``) and along the partitions (a matmul with an upper-triangular ones matrix from
``affine_select`` / ``iota``), the Mamba-2 causal depthwise conv1d with its conv state carried across sequence
chunks, NxDI-style on-device sampling (top-k by ``max8`` + ``nc_find_index8`` / ``nc_match_replace8`` rounds over
vocabulary tiles, temperature, top-p over the cumulative sorted probabilities, the sampled token), greedy argmax
(max + ``iota`` compare) and embedding lookups by indirect DMA (Beta-1 ``table[ids[i_p, 0], i_f]`` and the
new-dialect vocabulary-parallel ``.ap(vector_offset=)`` gather with skipped out-of-shard ids). Outputs against
float64 numpy written here (fp32 and bf16, ragged last tiles on every tiled axis, distinct values for top-k), and
the instruction and DMA counts their structure implies.

The nsim fixes the Beta-1 embedding kernel needed (each of its tests failed before):
- a row gather whose free index items reach past the table's last column, ``nl.load(table[ids[i_p, 0], h * 2048 +
  i_f], mask=(...) & (h * 2048 + i_f < H))`` (the ragged last column chunk of H = 3000), was rejected with
  err_tensor_access_out_of_bound although the mask excludes those columns (spec §3.8: masked-out positions are
  never bounds-checked); the bounds check now waits for the mask, and an access the mask does not clip still
  raises at the user's line;
- ``nl.load(token_ids[t * 128 + i_p], mask=(t * 128 + i_p < T))`` of the 1-D ids was NSIM-E438 "mask has more dims
  (2) than the instruction (1)" (nsim makes the view (128,), numpy indexing (128, 1)): a mask's extra trailing
  size-1 dims now apply to such a view;
- ``ids[i_p, 0]`` on the (128,) tile that load gives was NSIM-E424 (one item per dim): it addresses the tile's one
  column, as on the (128, 1) tile NKI gives;
- an indirect ``nl.store(table[ids[i_p, 0], ...])`` (a scatter) in an ``affine_range`` was a false NSIM-W504
  affine-write-conflict: the sanitizer compared the scatter's static access (row 0) across iterations; the
  runtime-indexed side of an indirect DMA is no longer compared (as for NSIM-W506).
And a kernel mistake that ran silently: a bit-vector op (``np.bitwise_or``) in ``tensor_tensor_scan`` /
``scalar_tensor_tensor`` (arithmetic ops only) is now NSIM-E312 at the call's line."""
import inspect

import numpy as np
import pytest

from conftest import require_core, sample_fixture  # noqa: E402
from conftest import op_counts as _ops  # noqa: E402

_core, ml_dtypes = require_core()
from numeric_helpers import close, rounded  # noqa: E402
from numeric_helpers import randn as _randn, f64 as _f64  # noqa: E402

BF16 = ml_dtypes.bfloat16

ss = sample_fixture("scan_sampling_style_kernels.py")
ssn = sample_fixture("scan_sampling_style_kernels_new.py", module_only=True)


def _distinct_logits(B, V, seed, scale=20.0, dtype=np.float32):
    """Logits whose values are all distinct (a permutation of a grid), also after rounding to ``dtype``."""
    rng = np.random.default_rng(seed)
    if np.dtype(dtype) == np.dtype(BF16):
        # V consecutive bf16 bit patterns from 1.0 up (distinct, exact), permuted in every row
        grid = (np.arange(V, dtype=np.uint16) + np.uint16(0x3F80)).view(BF16)
        return np.stack([rng.permutation(grid) for _ in range(B)])
    grid = (np.arange(B * V, dtype=np.float64) / (B * V) - 0.5) * scale
    return rng.permutation(grid).reshape(B, V).astype(dtype)


def _close_scan(got, want, abs_cum, dtype):
    """A running sum: fp32 accumulation error grows with the sum of |x| so far (atol relative to it)."""
    if np.dtype(dtype) == np.float32:
        err = np.abs(_f64(got) - want)
        assert (err <= 1e-5 * np.abs(want) + 2e-6 * abs_cum + 1e-6).all(), err.max()
    else:
        close(got, want, dtype)


# --------------------------------------------------------------------------------------------------
# Prefix sums
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("N,F,tile_f,dtype", [
    (200, 1000, 512, np.float32),   # 128 + 72 rows; chunks of 512 + 488 columns
    (128, 512, 512, np.float32),    # one tile, one chunk
    (130, 2048, 512, BF16),         # 128 + 2 rows; four full chunks chained
    (37, 300, 128, BF16),           # one partial row tile; 128 + 128 + 44 columns
])
def test_cumsum_free_matches_numpy(ss, N, F, tile_f, dtype):
    """Row-wise prefix sums, the scan state in fp32 across chunks (each chunk starts from the last column of the
    previous one); bf16 output is the rounded fp32 running sum."""
    m, *_ = ss
    x = _randn((N, F), dtype, seed=N + F)
    out = m.cumsum_free_kernel(x, tile_f)
    assert out.shape == (N, F) and out.dtype == np.dtype(dtype)
    want = np.cumsum(_f64(x), 1)
    _close_scan(out, rounded(want, dtype) if dtype != np.float32 else want, np.cumsum(np.abs(_f64(x)), 1), dtype)


def test_cumsum_free_carries_across_chunks(ss):
    """All ones: column j holds exactly j + 1 (fp32 integers), so a chunk that did not start from the previous
    chunk's last column (or started from the wrong column) is off by a multiple of 128. One scan per row tile and
    chunk, one load and one store each; the carried column is one copy per chunk that has a successor."""
    m, *_ = ss
    N, F, tf = 150, 700, 128
    out = m.cumsum_free_kernel(np.ones((N, F), np.float32), tf)
    np.testing.assert_array_equal(out, np.tile(np.arange(1, F + 1, dtype=np.float32), (N, 1)))
    ops = _ops(m.cumsum_free_kernel)
    n_p, n_f = 2, 6  # 128 + 22 rows; 5 x 128 + 60 columns
    assert ops["tensor_tensor_scan"] == n_p * n_f, ops
    assert ops["dma_copy"] == 2 * n_p * n_f, ops
    prof = m.cumsum_free_kernel.last_profile
    assert prof.stat("memory.hbm_read_bytes") == N * F * 4
    assert prof.stat("memory.hbm_write_bytes") == N * F * 4


@pytest.mark.parametrize("which", ["scan", "stt"])
def test_bitwise_op_in_a_scan_is_an_error_at_the_users_line(ss, which):
    """tensor_tensor_scan and scalar_tensor_tensor take arithmetic ops only (spec §2.2; they compute in fp32): a
    bit-vector op there (``np.bitwise_or`` for ``np.add``) is NSIM-E312 naming the op, at the call's line (it ran,
    computing something undefined)."""
    _m, nki, nl, nisa = ss

    @nki.jit
    def k(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        t = nl.load(a)
        if which == "scan":
            r = nisa.tensor_tensor_scan(t, t, initial=0.0, op0=np.multiply, op1=np.bitwise_or)  # BAD
        else:
            r = nisa.scalar_tensor_tensor(data=t, op0=np.bitwise_or, operand0=1.0, op1=np.add, operand1=t)  # BAD
        nl.store(out, value=r)
        return out

    src, first = inspect.getsourcelines(k)
    line = first + [i for i, ln in enumerate(src) if ln.rstrip().endswith("# BAD")][0 if which == "scan" else 1]
    with pytest.raises(_core.NsimError) as ei:
        k(np.ones((128, 64), np.float32))
    msg = str(ei.value)
    assert "NSIM-E312" in msg and "arithmetic" in msg and "nl.bitwise_or" in msg, msg
    assert "test_scan_sampling_style_kernels.py:{}".format(line) in msg, msg


@pytest.mark.parametrize("S,D,dtype", [(300, 64, np.float32), (128, 512, np.float32), (37, 96, BF16),
                                       (257, 128, BF16)])
def test_cumsum_partition_matches_numpy(ss, ssn, S, D, dtype):
    """Prefix sums down the partitions, both dialects: Beta 1 (``affine_select`` over an arange predicate, zero-
    filled ragged tile, fp32 matmul) and new (``iota`` ones + ``affine_select``, the last tile's matmul contracting
    only its rows, bf16 operands for bf16 input). PSUM sums of exact 0/1 weights: fp32 accuracy."""
    m, *_ = ss
    x = _randn((S, D), dtype, seed=S)
    want = np.cumsum(_f64(x), 0)
    abs_cum = np.cumsum(np.abs(_f64(x)), 0)
    for k in (m.cumsum_partition_kernel, ssn.cumsum_partition):
        out = k(x)
        assert out.shape == (S, D) and out.dtype == np.dtype(dtype)
        _close_scan(out, rounded(want, dtype) if dtype != np.float32 else want, abs_cum, dtype)


def test_cumsum_partition_structure(ss, ssn):
    """S = 300: three row tiles (128, 128, 44). Each: a triangular matmul and a totals matmul (6 in all); the
    triangle is built once (one affine_select; the new dialect's ones by one iota); one load and one store per
    tile."""
    m, *_ = ss
    x = _randn((300, 64), np.float32, seed=1)
    for k, extra in ((m.cumsum_partition_kernel, {}), (ssn.cumsum_partition, {"iota": 1})):
        k(x)
        ops = _ops(k)
        assert ops["nc_matmul"] == 6 and ops["affine_select"] == 1 and ops["dma_copy"] == 6, ops
        for op, n in extra.items():
            assert ops[op] == n, ops
        assert k.last_profile.stat("engine.matmul_instruction_count") == 6


# --------------------------------------------------------------------------------------------------
# Mamba-2 causal depthwise conv1d
# --------------------------------------------------------------------------------------------------

def ref_conv1d(x, w, b, state, act):
    """float64: out[c, t] = b[c] + sum_k w[c, k] * xp[c, t + k], xp = cat(state, x) (the 3 inputs before x)."""
    L = x.shape[1]
    xp = np.concatenate([_f64(state), _f64(x)], 1)
    y = _f64(b) + sum(_f64(w)[:, k:k + 1] * xp[:, k:k + L] for k in range(4))
    return y / (1.0 + np.exp(-y)) if act else y


CONV_CASES = [  # C, L, tile_l, dtype, act, zero state
    (160, 1100, 512, np.float32, True, False),  # channels 128 + 32; chunks 512, 512, 76
    (64, 512, 512, BF16, False, True),          # one chunk, the prefill start (zero state)
    (130, 37, 16, np.float32, True, False),     # channels 128 + 2; chunks 16, 16, 5
]


@pytest.mark.parametrize("C,L,tile_l,dtype,act,zero", CONV_CASES)
def test_causal_conv1d_matches_numpy(ss, C, L, tile_l, dtype, act, zero):
    m, *_ = ss
    x = _randn((C, L), dtype, seed=C + L)
    w = _randn((C, 4), dtype, seed=1, scale=0.5)
    b = _randn((C, 1), dtype, seed=2, scale=0.1)
    st = np.zeros((C, 3), dtype) if zero else _randn((C, 3), dtype, seed=3)
    out, new_state = m.causal_conv1d_kernel(x, w, b, st, tile_l, act)
    assert out.shape == (C, L) and out.dtype == np.dtype(dtype) and new_state.shape == (C, 3)
    close(out, ref_conv1d(x, w, b, st, act), dtype)
    np.testing.assert_array_equal(new_state, x[:, -3:])


def test_causal_conv1d_state_continues_the_sequence(ss):
    """Mamba's chunked prefill: running the sequence in two calls, the second starting from the conv state the
    first returned, gives the one-call output (fp32, the same arithmetic in the same order: exact)."""
    m, *_ = ss
    C, L, cut = 96, 700, 300
    x = _randn((C, L), np.float32, seed=5)
    w = _randn((C, 4), np.float32, seed=6, scale=0.5)
    b = _randn((C, 1), np.float32, seed=7, scale=0.1)
    st0 = np.zeros((C, 3), np.float32)
    whole, st_whole = m.causal_conv1d_kernel(x, w, b, st0, 256, True)
    first, st1 = m.causal_conv1d_kernel(np.ascontiguousarray(x[:, :cut]), w, b, st0, 256, True)
    second, st2 = m.causal_conv1d_kernel(np.ascontiguousarray(x[:, cut:]), w, b, st1, 256, True)
    np.testing.assert_array_equal(np.concatenate([first, second], 1), whole)
    np.testing.assert_array_equal(st2, st_whole)


def test_causal_conv1d_structure(ss):
    """C = 160 (two channel tiles), L = 1100 in chunks of 512 (three): per channel tile and chunk one
    tensor_scalar (first tap + bias), three scalar_tensor_tensor (the other taps), one SiLU activation and one
    copy of the carried 3 columns; DMAs: per channel tile weight, bias, state loads and the state load + store at
    the end, per chunk one load and one store; every tap on the vector engine, the SiLU on the scalar engine."""
    m, *_ = ss
    C, L = 160, 1100
    m.causal_conv1d_kernel(_randn((C, L), np.float32, 1), _randn((C, 4), np.float32, 2),
                           _randn((C, 1), np.float32, 3), _randn((C, 3), np.float32, 4), 512, True)
    ops = _ops(m.causal_conv1d_kernel)
    n = 2 * 3
    assert ops["tensor_scalar"] == n and ops["scalar_tensor_tensor"] == 3 * n, ops
    assert ops["activation"] == n, ops
    assert ops["dma_copy"] == 2 * (3 + 2) + 2 * n, ops
    prof = m.causal_conv1d_kernel.last_profile
    assert prof.stat("memory.hbm_write_bytes") == (C * L + C * 3) * 4
    assert prof.stat("engine.scalar.instruction_count") >= n


# --------------------------------------------------------------------------------------------------
# Top-k, sampling, argmax
# --------------------------------------------------------------------------------------------------

def ref_topk(lg, k):
    idx = np.argsort(-_f64(lg), 1, kind="stable")[:, :k]
    return np.take_along_axis(_f64(lg), idx, 1), idx


TOPK_CASES = [  # B, V, k, vocab_tile
    (5, 1000, 8, 16384),    # one vocabulary tile, one max8
    (3, 500, 5, 16384),     # k < 8: the first k of max8
    (130, 3000, 32, 1024),  # rows 128 + 2; vocabulary tiles 1024, 1024, 952; four rounds per tile and four merging
    (4, 5000, 16, 2048),    # two rounds per tile
    (2, 20000, 1, 16384),   # two vocabulary tiles, the last of 3616; 8 candidates each
]


@pytest.mark.parametrize("B,V,k,vt", TOPK_CASES)
def test_topk_matches_numpy(ss, B, V, k, vt):
    m, *_ = ss
    lg = _distinct_logits(B, V, seed=V + k)
    vals, ids = m.topk_kernel(lg, k, vt)
    assert vals.shape == (B, k) and ids.shape == (B, k) and ids.dtype == np.uint32
    want_v, want_i = ref_topk(lg, k)
    np.testing.assert_array_equal(ids, want_i)
    np.testing.assert_array_equal(vals, want_v.astype(np.float32))


def test_topk_bf16_logits(ss):
    """bf16 logits (distinct in bf16), loaded as fp32: values exact."""
    m, *_ = ss
    lg = _distinct_logits(7, 900, seed=3, dtype=BF16)
    vals, ids = m.topk_kernel(lg, 16, 512)
    want_v, want_i = ref_topk(lg, 16)
    np.testing.assert_array_equal(ids, want_i)
    np.testing.assert_array_equal(vals, want_v)


@pytest.mark.parametrize("B,V,k,vt,rounds", [
    (130, 3000, 32, 1024, 2 * (3 * 4 + 4)),  # per row tile: 4 rounds per vocabulary tile, 4 merging the candidates
    (5, 1000, 8, 16384, 1),                  # one vocabulary tile: one max8, no merge
    (4, 5000, 16, 2048, 3 * 2 + 2),
])
def test_topk_max8_rounds(ss, B, V, k, vt, rounds):
    """max8 returns 8 values: k = 16 / 32 take k / 8 rounds, each knocking its 8 values out with one
    nc_match_replace8 (whose dst_idx gives the positions), k <= 8 one max8 and one nc_find_index8; with several
    vocabulary tiles the per-tile candidates are merged by another top-k and their ids looked up with
    gather_flattened. The logits are read from HBM once."""
    m, *_ = ss
    lg = _distinct_logits(B, V, seed=1)
    m.topk_kernel(lg, k, vt)
    ops = _ops(m.topk_kernel)
    assert ops["max8"] == rounds, ops
    if k > 8:
        assert ops["nc_match_replace8"] == rounds and ops["nc_find_index8"] == 0, ops
    else:
        assert ops["nc_find_index8"] == rounds and ops["nc_match_replace8"] == 0, ops
    assert m.topk_kernel.last_profile.stat("memory.hbm_read_bytes") == lg.nbytes


def test_topk_time_follows_rounds(ss):
    """Each round of max8 + nc_match_replace8 reads the whole vocabulary tile on the vector engine: its busy time
    doubles from k = 16 (2 rounds) to k = 32 (4 rounds), and the kernel takes longer; k = 8 (one max8 + one
    nc_find_index8, the same passes as one round) is about half of k = 16."""
    m, *_ = ss
    lg = _distinct_logits(64, 4096, seed=5)
    busy, total = {}, {}
    for k in (8, 16, 32):
        m.topk_kernel(lg, k)
        prof = m.topk_kernel.last_profile
        busy[k], total[k] = prof.stat("engine.vector.busy_time"), prof.total_time_ns
    assert busy[32] == pytest.approx(2 * busy[16], rel=0.05), busy
    assert busy[16] == pytest.approx(2 * busy[8], rel=0.05), busy
    assert total[8] < total[16] < total[32], total


def ref_sample(lg, temp, top_p, u, k):
    """float64 NxDI-style sampling: top-k, softmax(topk / T), keep tokens whose preceding mass is < top_p,
    renormalise, the first token whose kept cumulative mass exceeds u. Returns (tokens, kept probs, margin): the
    margin is the distance of u and top_p to the nearest cumulative-sum boundary (the kernel's fp32 sums must not
    cross it)."""
    tv, idx = ref_topk(lg, k)
    z = tv / _f64(temp)
    p = np.exp(z - z[:, :1])
    p /= p.sum(1, keepdims=True)
    before = np.cumsum(p, 1) - p
    keep = before < _f64(top_p)
    kp = p * keep
    kp /= kp.sum(1, keepdims=True)
    kc = np.cumsum(kp, 1)
    choice = np.minimum((kc <= _f64(u)).sum(1), keep.sum(1) - 1)
    margin = min(np.abs(before - _f64(top_p)).min(), np.abs(kc[:, :-1] - _f64(u)).min())
    return idx[np.arange(len(lg)), choice], kp, margin


SAMPLE_CASES = [(6, 1000, 8, 16384), (130, 3000, 32, 1024), (4, 700, 16, 16384), (9, 300, 4, 16384)]


@pytest.mark.parametrize("B,V,k,vt", SAMPLE_CASES)
def test_sampling_matches_numpy(ss, B, V, k, vt):
    m, *_ = ss
    rng = np.random.default_rng(B + k)
    lg = _distinct_logits(B, V, seed=V, scale=40.0)
    temp = rng.uniform(0.5, 1.5, (B, 1)).astype(np.float32)
    top_p = rng.uniform(0.3, 0.9, (B, 1)).astype(np.float32)
    u = rng.uniform(0.0, 1.0, (B, 1)).astype(np.float32)
    tok, probs = m.sample_kernel(lg, temp, top_p, u, k, vt)
    assert tok.shape == (B, 1) and tok.dtype == np.int32 and probs.shape == (B, k)
    want_tok, want_p, margin = ref_sample(lg, temp, top_p, u, k)
    assert margin > 1e-4  # the case is decidable at fp32
    close(probs, want_p)
    np.testing.assert_array_equal(tok[:, 0], want_tok)


def test_sampling_limits(ss):
    """top_p -> 0 keeps only the most likely token (greedy, whatever u); top_p = 1 and u just below 1 picks the
    last of the top k; a temperature near 0 makes the first probability ~1. Each row is one regime."""
    m, *_ = ss
    B, V, k = 4, 400, 8
    lg = _distinct_logits(B, V, seed=11)
    temp = np.array([[1.0], [1.0], [1e-3], [0.7]], np.float32)
    top_p = np.array([[1e-6], [1.0], [1.0], [1e-6]], np.float32)
    u = np.array([[0.99], [0.999999], [0.5], [0.0]], np.float32)
    tok, probs = m.sample_kernel(lg, temp, top_p, u, k)
    _, want_i = ref_topk(lg, k)
    np.testing.assert_array_equal(tok[:, 0], [want_i[0, 0], want_i[1, k - 1], want_i[2, 0], want_i[3, 0]])
    np.testing.assert_array_equal(probs[0], [1.0] + [0.0] * (k - 1))
    assert probs[1].min() > 0 and probs[2, 0] > 0.999


def test_sampling_structure(ss):
    """B = 130 (two row tiles), k = 32 over one vocabulary tile: per row tile four max8 rounds, two scans (the
    cumulative probabilities and the kept cumulative mass), one exp with its row sum on the scalar engine."""
    m, *_ = ss
    B, V = 130, 600
    lg = _distinct_logits(B, V, seed=2)
    ones = np.ones((B, 1), np.float32)
    m.sample_kernel(lg, ones, ones * 0.9, ones * 0.5, 32)
    ops = _ops(m.sample_kernel)
    assert ops["max8"] == 2 * 4 and ops["nc_match_replace8"] == 2 * 4, ops
    assert ops["tensor_tensor_scan"] == 2 * 2, ops
    assert ops["activation_reduce"] + ops["activation"] >= 2, ops
    assert ops["iota"] == 1, ops


@pytest.mark.parametrize("B,V,vt,dtype", [(130, 5000, 2048, np.float32), (3, 100, 4096, BF16),
                                          (64, 9000, 4096, BF16)])
def test_greedy_argmax_matches_numpy(ss, B, V, vt, dtype):
    """The first maximum of every row, across vocabulary tiles: rows 0-2 hold their maximum twice (in one tile,
    in two tiles, and at the very end of the row): numpy's argmax (the first) is the answer."""
    m, *_ = ss
    lg = _randn((B, V), dtype, seed=V)
    lg[0, [10, 20]] = 50
    lg[1, [V - 1, 5]] = 60
    lg[2, V - 1] = 70
    ids = m.greedy_argmax_kernel(lg, vt)
    assert ids.shape == (B, 1) and ids.dtype == np.int32
    np.testing.assert_array_equal(ids[:, 0], np.argmax(_f64(lg), 1))


def test_greedy_argmax_structure(ss):
    """B = 130, V = 5000 in tiles of 2048: per row tile and vocabulary tile one iota of the column ids, one max
    and one min reduction; the logits are read once."""
    m, *_ = ss
    lg = _randn((130, 5000), np.float32, seed=4)
    m.greedy_argmax_kernel(lg, 2048)
    ops = _ops(m.greedy_argmax_kernel)
    assert ops["iota"] == 2 * 3 and ops["tensor_reduce"] == 2 * 3 * 2, ops
    assert m.greedy_argmax_kernel.last_profile.stat("memory.hbm_read_bytes") == lg.nbytes


# --------------------------------------------------------------------------------------------------
# Embedding lookup
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("T,V,H,tile_h,dtype", [
    (300, 1000, 3000, 2048, np.float32),  # 128 + 128 + 44 tokens; columns 2048 + 952 (masked ragged chunk)
    (5, 50, 64, 2048, BF16),
    (128, 10, 100, 64, np.float32),       # columns 64 + 36; a tiny vocabulary, ids repeat
])
def test_embedding_beta1_matches_numpy(ss, T, V, H, tile_h, dtype):
    m, *_ = ss
    ids = np.random.default_rng(T).integers(0, V, T).astype(np.int32)
    table = _randn((V, H), dtype, seed=V)
    out = m.embedding_kernel(ids, table, tile_h)
    assert out.shape == (T, H) and out.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(out, table[ids])


def test_embedding_beta1_dma_counts(ss):
    """T = 300 (three token tiles), H = 3000 in column chunks of 2048 (two): per token tile one id load, per
    chunk one gather and one store, 3 x (1 + 2 x 2) = 15 DMAs; HBM reads are the ids and the T gathered rows
    only (the masked-off rows and columns are not read), writes the output."""
    m, *_ = ss
    T, V, H = 300, 1000, 3000
    ids = np.random.default_rng(0).integers(0, V, T).astype(np.int32)
    table = _randn((V, H), np.float32, seed=1)
    m.embedding_kernel(ids, table, 2048)
    ops = _ops(m.embedding_kernel)
    assert ops["dma_copy"] == 3 * (1 + 2 * 2), ops
    prof = m.embedding_kernel.last_profile
    assert prof.stat("memory.hbm_read_bytes") == ids.nbytes + T * H * 4
    assert prof.stat("memory.hbm_write_bytes") == T * H * 4


@pytest.mark.parametrize("T,V,H,tile_h", [(300, 40, 600, 256), (50, 1000, 64, 512)])
def test_embedding_backward_scatter_add(ss, T, V, H, tile_h):
    """The weight gradient: every token's gradient row added into its id's row (few ids, many repeats in case 1;
    columns 256 + 256 + 88); untouched rows stay zero. The adds happen in token order per row: fp32 sums."""
    m, *_ = ss
    ids = np.random.default_rng(T).integers(0, V, T).astype(np.int32)
    g = _randn((T, H), np.float32, seed=H)
    out = m.embedding_backward_kernel(ids, g, V, tile_h)
    want = np.zeros((V, H))
    np.add.at(want, ids, _f64(g))
    close(out, want)
    assert not out[np.setdiff1d(np.arange(V), ids)].any()
    n_t, n_h = -(-T // 128), -(-H // tile_h)
    ops = _ops(m.embedding_backward_kernel)
    # zero stores per 128 rows of the table; per token tile an id load, per chunk a load and a scatter-add
    assert ops["dma_copy"] == -(-V // 128) + n_t * (1 + 2 * n_h), ops


def test_embedding_update_scatter_in_affine_range(ss):
    """Rows written at distinct ids by an indirect nl.store in an affine_range over token tiles, the last column
    chunk ragged (H = 600 in chunks of 256, masked). The rows each iteration writes are runtime values: the
    sanitizer's affine_range check (NSIM-W504) does not compare them (it took every scatter's static access,
    row 0, as the same bytes in every iteration: a false "iteration 1 writes dst bytes that iteration 0 wrote");
    the other rows keep their values."""
    m, *_ = ss
    T, V, H = 300, 1000, 600
    ids = np.random.default_rng(0).permutation(V)[:T].astype(np.int32)
    table = _randn((V, H), np.float32, seed=1)
    new_rows = _randn((T, H), np.float32, seed=2)
    want = table.copy()
    want[ids] = new_rows
    out = m.embedding_update_kernel(table, ids, new_rows, 256)
    np.testing.assert_array_equal(out, want)
    assert not m.embedding_update_kernel.last_profile.check_reports
    ops = _ops(m.embedding_update_kernel)
    assert ops["dma_copy"] == 3 * (1 + 2 * 3), ops


@pytest.mark.parametrize("slack", [None, 10])
def test_embedding_beta1_unclipped_ragged_chunk_is_an_error_at_the_users_line(ss, slack):
    """The fix above does not hide a real out-of-bounds gather: without a column mask (``slack=None``), or with
    one that does not clip all the columns past H (``< H + 10``), the last chunk is err_tensor_access_out_of_bound
    at the load's line."""
    _m, nki, nl, _nisa = ss

    @nki.jit
    def emb(token_ids, table):
        T = token_ids.shape[0]
        V, H = table.shape
        out = nl.ndarray((T, H), dtype=table.dtype, buffer=nl.shared_hbm)
        i_p = nl.arange(128)[:, None]
        i_f = nl.arange(64)[None, :]
        ids = nl.load(token_ids[i_p], mask=(i_p < T))
        for h in nl.affine_range(2):
            cols = (i_p < T) if slack is None else (i_p < T) & (h * 64 + i_f < H + slack)
            rows = nl.load(table[ids[i_p, 0], h * 64 + i_f], mask=cols)  # LOAD
            nl.store(out[i_p, h * 64 + i_f], value=rows, mask=(i_p < T) & (h * 64 + i_f < H))
        return out

    src, first = inspect.getsourcelines(emb)
    line = first + next(i for i, ln in enumerate(src) if ln.rstrip().endswith("# LOAD"))
    ids = np.arange(128, dtype=np.int32) % 7
    with pytest.raises(_core.NsimError) as ei:
        emb(ids, _randn((7, 100), np.float32, 0))
    msg = str(ei.value)
    assert "err_tensor_access_out_of_bound" in msg and "'table'" in msg, msg
    assert "test_scan_sampling_style_kernels.py:{}".format(line) in msg, msg


def test_embedding_vocab_parallel_new_dialect(ssn):
    """Vocabulary-parallel embedding over two shards (ids 0-599 and 600-999): each rank gathers the rows of its
    shard and leaves zeros where the id is elsewhere (skipped out-of-range rows, including negative shifted ids);
    the sum of the ranks is the full lookup. Ragged last token tile (300 = 2 x 128 + 44), bf16."""
    T, V, H, cut = 300, 1000, 256, 600
    ids = np.random.default_rng(2).integers(0, V, T).astype(np.int32)
    table = _randn((V, H), BF16, seed=3)
    o0 = ssn.vocab_parallel_embedding(ids, np.ascontiguousarray(table[:cut]), 0)
    o1 = ssn.vocab_parallel_embedding(ids, np.ascontiguousarray(table[cut:]), cut)
    assert o0.dtype == np.dtype(BF16) and o0.shape == (T, H)
    np.testing.assert_array_equal(o0[ids < cut], table[ids[ids < cut]])
    assert not o0[ids >= cut].astype(np.float32).any()
    np.testing.assert_array_equal(o1[ids >= cut], table[ids[ids >= cut]])
    assert not o1[ids < cut].astype(np.float32).any()
    ops = _ops(ssn.vocab_parallel_embedding)
    assert ops["dma_copy"] == 3 * 3, ops  # per token tile: ids, gather, store
    # the reads: the ids and at most one row per token (nsim's cost model counts a skipped row as read)
    n_in = int((ids >= cut).sum())
    rd = ssn.vocab_parallel_embedding.last_profile.stat("memory.hbm_read_bytes")
    assert ids.nbytes + n_in * H * 2 <= rd <= ids.nbytes + T * H * 2
