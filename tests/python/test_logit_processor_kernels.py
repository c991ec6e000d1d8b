"""Serving-time logit processors written like public NKI kernels (tests/python/kernels/logit_processor_kernels.py,
Beta-1 dialect, and logit_processor_kernels_new.py, new dialect; both unmodified, through ``nsim.compat``):

- repetition / presence / frequency penalties as vLLM's ``apply_penalties`` (Beta 1): the per-request token-count
  histogram of the [B, T] generated ids built on chip, either as a sum of one-hots (``nisa.iota`` of each vocabulary
  tile's ids compared with every id column) or by accumulating DMAs (``nl.atomic_rmw(op=np.add)`` of ones into a
  zeroed [B * V, 1] HBM scratch at rows b * V + id, duplicates accumulating); seen logits divided by the repetition
  penalty when positive, multiplied when not, minus frequency * count and presence * seen. The histogram alone with
  the B * T ids flattened onto the partitions (``dma_copy(dst_rmw_op=np.add)``: one DMA adds to the same row many
  times);
- logit bias for host (token, bias) lists, by gather from the output viewed as [B * V, 1]
  (``.ap(vector_offset=...)``), a vector add and a scatter back, or by one read-modify-write ``dma_compute`` per
  column; a bad-words mask (scatter of a NEG tile) (new dialect);
- min-p filtering in logit space, softmax-free: keep x >= max(x) + log(min_p) (new dialect), masked arithmetically
  or by ``select_reduce`` on a uint8 predicate with the tiles addressed by ``.ap`` patterns;
- typical-p (HF ``TypicalLogitsWarper``) without a sort: entropy from one exp pass, scores |x - c|, a bisection over
  the score threshold with the kept mass per round (Beta 1);
- the chain penalties -> bias / bad words -> min-p / typical-p (banned logits stay NEG, are never kept).

Checked: outputs against float64 numpy references (fp32 1e-5, bf16 1e-2; the histograms exactly; the kept logits of
min-p / typical-p and everything bias / bad words touch or not bit for bit; typical-p's kept set equal to HF's away
from the threshold, reaching typical_p and minimal), repeated ids in one DMA and across DMAs, repeated bad words,
min_p = 1 (only the maximum and its ties survive), no sanitizer report, the instruction / DMA counts and HBM traffic
the tiling implies, and nsim's timing ranking the variants as expected: the accumulating-DMA histogram faster than the
one-hot sum, the RMW bias faster than gather / add / scatter, ``select_reduce`` min-p faster than the arithmetic mask,
twice the bisection rounds about twice the compute.

No nsim fix was needed by this family: every kernel (and the idioms probed while writing them: ``nl.where`` with
[B, 1] operands and -inf, a Beta-1 gather / scatter bias through ``out.reshape((B * V, 1))`` indices, new-dialect
``iota(offset=c * vt)`` one-hots with int32 operand columns, ``activation(reduce_res=esum[:, c:c + 1])`` in both
dialects, a masked ``nl.atomic_rmw`` of a ragged id tile) ran
numpy-exact the first time. The two sanitizer reports met (W503: -3e38 + -3e38 overflowing to -inf when a min-p /
typical-p mask was added onto logits already banned to NEG) and one E204 SBUF overflow (three [B, 8192] fp32 temporaries
next to a [B, 32768] row) were the kernels' faults, fixed in the kernels.
"""

import numpy as np
import pytest

from conftest import executed_ops, require_core, sample_fixture  # noqa: E402
from conftest import run_clean as _run  # noqa: E402
from conftest import op_counts as _ops  # noqa: E402

_core, ml_dtypes = require_core()
from numeric_helpers import close, f64 as _f64, randn as _randn  # noqa: E402

BF16 = ml_dtypes.bfloat16
NEG32 = np.float32(-3.0e38)

lp = sample_fixture("logit_processor_kernels.py", module_only=True)
lpn = sample_fixture("logit_processor_kernels_new.py", module_only=True)


# --------------------------------------------------------------------------------------------------
# Penalties
# --------------------------------------------------------------------------------------------------

def _penalty_inputs(B, V, T, dtype, seed, hot=64):
    rng = np.random.default_rng(seed)
    lg = _randn((B, V), dtype, seed=seed, scale=2.0)
    # ids drawn from a small hot set (many repeats) plus a few anywhere in the vocabulary (last tile included)
    ids = rng.integers(0, hot, (B, T))
    ids[:, ::5] = rng.integers(0, V, (B, len(range(0, T, 5))))
    ids[:, -1] = V - 1
    ids[:, 2] = ids[:, 1]  # at least one repeat per request
    rep = rng.uniform(1.0, 2.0, (B, 1)).astype(np.float32)
    rep[0] = 1.0  # penalties off for request 0 except presence / frequency
    pres = rng.uniform(0.0, 1.0, (B, 1)).astype(np.float32)
    freq = rng.uniform(0.0, 0.5, (B, 1)).astype(np.float32)
    pres[1] = freq[1] = 0.0
    return lg, ids.astype(np.int32), rep, pres, freq


def ref_penalties(lg, ids, rep, pres, freq):
    B, V = lg.shape
    cnt = np.zeros((B, V))
    for b in range(B):
        np.add.at(cnt[b], ids[b], 1)
    x = _f64(lg)
    seen = cnt > 0
    r = _f64(rep)
    y = np.where(seen, np.where(x > 0, x / r, x * r), x)
    return y - _f64(freq) * cnt - _f64(pres) * seen, cnt


@pytest.mark.parametrize("variant", ["penalties_onehot", "penalties_scatter"])
@pytest.mark.parametrize("B,V,T,dtype,vt", [
    (8, 4096, 16, np.float32, 2048),
    (64, 8192, 8, BF16, 2048),
    (128, 2048, 24, np.float32, 512),
    (4, 32768, 4, np.float32, 8192),
])
def test_penalties_match_numpy(lp, variant, B, V, T, dtype, vt):
    lg, ids, rep, pres, freq = _penalty_inputs(B, V, T, dtype, seed=B + V + T)
    want, cnt = ref_penalties(lg, ids, rep, pres, freq)
    assert cnt.max() >= 2  # repeated ids present
    out = _run(getattr(lp, variant), lg, ids, rep, pres, freq, vt)
    assert out.dtype == np.dtype(dtype) and out.shape == lg.shape
    if dtype == np.float32:
        close(out, want, dtype)
    else:  # the bf16 logits are read exactly; only the store rounds
        close(out, want.astype(BF16), dtype)
    # untouched tokens bit for bit
    unseen = cnt == 0
    np.testing.assert_array_equal(out[unseen], lg[unseen])


def test_penalties_structure_and_timing(lp):
    """B = 32, V = 8192 in 4 tiles of 2048, T = 16. One-hot: one iota and T compares + T adds per tile, DMAs: the
    ids, the 3 parameter columns (rep, pres, freq), one load and one store per tile. Scatter: T accumulating
    DMAs, the scratch zeroed and read once per tile; the logits cross HBM once each way in both. The scatter variant
    is faster (the one-hot spends T [B, vt] compares and adds per tile on the compute engines)."""
    B, V, T, vt = 32, 8192, 16, 2048
    NC = V // vt
    lg, ids, rep, pres, freq = _penalty_inputs(B, V, T, np.float32, seed=3)
    want, _ = ref_penalties(lg, ids, rep, pres, freq)

    close(_run(lp.penalties_onehot, lg, ids, rep, pres, freq, vt), want)
    c1 = _ops(lp.penalties_onehot)
    assert c1["iota"] == NC, c1
    assert c1["dma_copy"] == 1 + 3 + 2 * NC, c1
    p1 = lp.penalties_onehot.last_profile
    assert p1.stat("memory.hbm_read_bytes") == lg.nbytes + ids.nbytes + 3 * B * 4
    assert p1.stat("memory.hbm_write_bytes") == lg.nbytes

    close(_run(lp.penalties_scatter, lg, ids, rep, pres, freq, vt), want)
    c2 = _ops(lp.penalties_scatter)
    assert c2["iota"] == 1, c2
    dmas = [o for o in executed_ops(lp.penalties_scatter.last_json["body"]) if o["op"] == "dma_copy"]
    rmw = [o for o in dmas if isinstance(o["dst"], dict) and o["dst"]["tensor"] == "counts"
           and "indirect_dst" in o.get("flags", ())]
    assert len(rmw) == T, c2
    assert len(dmas) == NC + 1 + T + 3 + 3 * NC, c2
    p2 = lp.penalties_scatter.last_profile
    assert p2.stat("memory.hbm_read_bytes") >= 2 * lg.nbytes  # logits + the counts
    # T compares (tensor_scalar against an id column) and T adds per vocabulary tile, on whichever engines nsim
    # places the nl elementwise ops: far more compute-engine time than the scatter variant's
    assert c1["tensor_scalar"] >= NC * T and c1["tensor_tensor"] >= NC * T, c1
    busy = lambda p: sum(p.stat("engine.{}.busy_time".format(e)) for e in ("vector", "scalar", "gpsimd"))
    assert busy(p1) > 3 * busy(p2), (busy(p1), busy(p2))
    assert p2.stat("total_time") < p1.stat("total_time")


@pytest.mark.parametrize("B,T,V,hot", [(8, 16, 4096, 8), (12, 20, 2048, 32), (3, 7, 128, 3), (128, 4, 2048, 2048)])
def test_token_histogram_flat_duplicates_in_one_dma(lp, B, T, V, hot):
    """B * T ids flattened onto the partitions, 128 per accumulating DMA (``dma_copy(dst_rmw_op=np.add)``): one DMA
    adds 1 to the same row many times (ids from a hot set of ``hot`` tokens; a request's ids span two DMAs when
    128 % T != 0, the last tile is ragged); every repeat must count."""
    rng = np.random.default_rng(B * T)
    ids = rng.integers(0, hot, (B, T)).astype(np.int32)
    got = _run(lp.token_histogram_flat, ids, V)
    want = np.zeros((B, V))
    for b in range(B):
        np.add.at(want[b], ids[b], 1)
    np.testing.assert_array_equal(got, want)
    N = B * T
    c = _ops(lp.token_histogram_flat)
    dmas = [o for o in executed_ops(lp.token_histogram_flat.last_json["body"]) if o["op"] == "dma_copy"]
    assert sum("indirect_dst" in o.get("flags", ()) for o in dmas) == (N + 127) // 128, c
    assert want.max() >= 2


# --------------------------------------------------------------------------------------------------
# Logit bias / bad words (new dialect)
# --------------------------------------------------------------------------------------------------

def _bias_inputs(B, V, K, W, dtype, seed):
    rng = np.random.default_rng(seed)
    lg = _randn((B, V), dtype, seed=seed, scale=2.0)
    bids = np.stack([rng.choice(V, K, replace=False) for _ in range(B)]).astype(np.int32)
    bids[0, 0] = V - 1  # last token of the vocabulary
    bvals = rng.uniform(-8.0, 8.0, (B, K)).astype(np.float32)
    bad = rng.integers(0, V, (B, W)).astype(np.int32)
    bad[:, -1] = bad[:, 0]  # a repeated bad word
    bad[1, 0] = bids[1, 0]  # a biased token that is also banned: banned
    return lg, bids, bvals, bad


def ref_bias_bad_words(lg, bids, bvals, bad):
    out = lg.copy()
    for b in range(lg.shape[0]):
        out[b, bids[b]] = (_f64(lg[b, bids[b]]) + _f64(bvals[b])).astype(lg.dtype)
        out[b, bad[b]] = NEG32.astype(lg.dtype)
    return out


@pytest.mark.parametrize("B,V,K,W,dtype", [
    (8, 4096, 4, 3, np.float32),
    (128, 2048, 8, 2, BF16),
    (4, 32768, 16, 5, np.float32),
])
def test_logit_bias_bad_words_match_numpy(lpn, B, V, K, W, dtype):
    lg, bids, bvals, bad = _bias_inputs(B, V, K, W, dtype, seed=V + K)
    out = _run(lpn.logit_bias_bad_words, lg, bids, bvals, bad)
    want = ref_bias_bad_words(lg, bids, bvals, bad)
    assert out.dtype == np.dtype(dtype)
    # the bias add is one fp32 add rounded to the logits' dtype, exactly as the reference; the rest is moved
    np.testing.assert_array_equal(out.view(np.uint8), want.view(np.uint8))


@pytest.mark.parametrize("B,V,K,dtype", [(8, 4096, 4, np.float32), (128, 2048, 8, BF16), (4, 32768, 16, np.float32)])
def test_logit_bias_rmw_matches_numpy(lpn, B, V, K, dtype):
    """The bias by K read-modify-write DMAs (``dma_compute`` scatter-add); same result as gather / add / scatter."""
    lg, bids, bvals, _ = _bias_inputs(B, V, K, 2, dtype, seed=V + K + 1)
    out = _run(lpn.logit_bias_rmw, lg, bids, bvals)
    want = ref_bias_bad_words(lg, bids, bvals, np.zeros((B, 0), np.int32))
    np.testing.assert_array_equal(out.view(np.uint8), want.view(np.uint8))
    c = _ops(lpn.logit_bias_rmw)
    assert c["dma_copy"] == 3 + K, c  # dma_compute runs as an accumulating DMA
    dmas = [o for o in executed_ops(lpn.logit_bias_rmw.last_json["body"]) if o["op"] == "dma_copy"]
    acc = [o for o in dmas if "accumulate" in o.get("flags", ())]
    assert len(acc) == K and all("indirect_dst" in o.get("flags", ()) for o in acc), acc


def test_logit_bias_bad_words_structure(lpn):
    """One HBM -> HBM copy of the logits, the id / bias / bad-id tiles loaded once, a gather and a scatter per bias
    column and a scatter per bad-words column (all indirect on the output), one iota; the HBM traffic is the copy
    plus B elements per indirect DMA."""
    B, V, K, W = 16, 4096, 4, 3
    lg, bids, bvals, bad = _bias_inputs(B, V, K, W, np.float32, seed=1)
    _run(lpn.logit_bias_bad_words, lg, bids, bvals, bad)
    c = _ops(lpn.logit_bias_bad_words)
    assert c["dma_copy"] == 1 + 3 + 2 * K + W and c["iota"] == 1 and c["memset"] == 1, c
    dmas = [o for o in executed_ops(lpn.logit_bias_bad_words.last_json["body"]) if o["op"] == "dma_copy"]
    flags = [f for o in dmas for f in o.get("flags", ())]
    assert flags.count("indirect_dst") == K + W, flags
    gathers = [o for o in dmas if isinstance(o["src"], dict) and o["src"]["tensor"] == "out" and "offsets" in o]
    assert len(gathers) == K, gathers
    prof = lpn.logit_bias_bad_words.last_profile
    assert prof.stat("memory.hbm_read_bytes") == lg.nbytes + bids.nbytes + bvals.nbytes + bad.nbytes + K * B * 4
    assert prof.stat("memory.hbm_write_bytes") == lg.nbytes + (K + W) * B * 4


# --------------------------------------------------------------------------------------------------
# Min-p (new dialect)
# --------------------------------------------------------------------------------------------------

def ref_min_p_keep(lg, min_p):
    x = _f64(lg)
    p = np.exp(x - x.max(1, keepdims=True))  # p / p_max
    return p >= _f64(min_p)


@pytest.mark.parametrize("B,V,vt,dtype", [
    (8, 4096, 2048, np.float32),
    (64, 8192, 2048, BF16),
    (4, 32768, 8192, np.float32),
    (128, 2048, 512, np.float32),
])
def test_min_p_matches_numpy(lpn, B, V, vt, dtype):
    rng = np.random.default_rng(V + B)
    lg = _randn((B, V), dtype, seed=V, scale=3.0)
    min_p = rng.uniform(0.01, 0.5, (B, 1)).astype(np.float32)
    min_p[0] = 1.0  # only the maximum (and its ties) survives
    lg[0, 7] = lg[0].max()
    out = _run(lpn.min_p_filter, lg, min_p, vt)
    keep = ref_min_p_keep(lg, min_p)
    # away from the threshold (1e-5 relative in the exp(x - max) test) the kept set is the reference's
    x = _f64(lg)
    margin = np.abs((x - x.max(1, keepdims=True)) - np.log(_f64(min_p))) > 1e-5
    got_keep = _f64(out) > -1e38
    np.testing.assert_array_equal(got_keep[margin], keep[margin])
    assert got_keep[0].sum() == 2 and got_keep[0, 7]
    np.testing.assert_array_equal(out[got_keep], lg[got_keep])  # kept logits bit for bit
    assert (out[~got_keep] == NEG32.astype(dtype)).all()
    assert 0 < keep.sum(1).min() and keep.sum(1).max() < V


def test_min_p_structure(lpn):
    """4 vocabulary tiles: 4 loads and 4 stores, 5 tensor_reduce (per tile + the row), one log activation, per tile
    one tensor_scalar and two scalar_tensor_tensor; the logits are read from HBM once."""
    B, V, vt = 32, 8192, 2048
    NC = V // vt
    lg = _randn((B, V), np.float32, seed=2)
    min_p = np.full((B, 1), 0.1, np.float32)
    _run(lpn.min_p_filter, lg, min_p, vt)
    c = _ops(lpn.min_p_filter)
    assert c["dma_copy"] == 2 * NC + 1 and c["tensor_reduce"] == NC + 1 and c["activation"] == 1, c
    assert c["tensor_scalar"] == NC and c["scalar_tensor_tensor"] == 2 * NC, c
    prof = lpn.min_p_filter.last_profile
    assert prof.stat("memory.hbm_read_bytes") == lg.nbytes + B * 4
    assert prof.stat("memory.hbm_write_bytes") == lg.nbytes


# --------------------------------------------------------------------------------------------------
# Typical-p (Beta 1)
# --------------------------------------------------------------------------------------------------

def ref_typical(lg, typical_p):
    """HF TypicalLogitsWarper (min_tokens_to_keep = 1) in float64: the kept mask and the scores."""
    x = _f64(lg)
    lp = x - x.max(1, keepdims=True)
    lp -= np.log(np.exp(lp).sum(1, keepdims=True))
    p = np.exp(lp)
    ent = -np.where(p > 0, p * np.where(p > 0, lp, 0.0), 0.0).sum(1, keepdims=True)  # 0 log 0 = 0
    score = np.abs(-lp - ent)
    keep = np.zeros(x.shape, bool)
    tau = np.zeros(x.shape[0])
    for b in range(x.shape[0]):
        order = np.argsort(score[b], kind="stable")
        last = int((np.cumsum(p[b][order]) < typical_p[b, 0]).sum())
        keep[b, order[:last + 1]] = True
        tau[b] = score[b, order[last]]
    return keep, score, tau, p


@pytest.mark.parametrize("B,V,vt,dtype,scale", [
    (8, 4096, 2048, np.float32, 3.0),
    (32, 2048, 1024, BF16, 2.0),
    (128, 2048, 2048, np.float32, 1.0),
    (4, 8192, 2048, np.float32, 4.0),
])
def test_typical_p_matches_numpy(lp, B, V, vt, dtype, scale):
    rng = np.random.default_rng(V + B)
    lg = _randn((B, V), dtype, seed=B, scale=scale)
    tp = rng.uniform(0.2, 0.95, (B, 1)).astype(np.float32)
    out = _run(lp.typical_p_filter, lg, tp, 24, vt)
    keep, score, tau, p = ref_typical(lg, tp)
    got = _f64(out) > -1e38
    # the fp32 scores of tokens next to the threshold may order differently: compare away from it
    away = np.abs(score - tau[:, None]) > 1e-4
    np.testing.assert_array_equal(got[away], keep[away])
    # the kept set reaches typical_p and is the smallest such prefix of the score order (up to fp32 rounding)
    mass = (p * got).sum(1)
    assert (mass >= tp[:, 0] - 1e-5).all(), mass
    smax_kept = np.where(got, score, -1).max(1)
    assert ((p * got * (score < smax_kept[:, None] - 1e-4)).sum(1) < tp[:, 0] + 1e-5).all()
    np.testing.assert_array_equal(out[got], lg[got])  # kept logits bit for bit
    assert (out[~got] == NEG32.astype(dtype)).all()
    assert keep.sum(1).min() > 1 and keep.sum(1).max() < V


def test_typical_p_bisection_rounds(lp):
    """Per bisection round one [B, vt] compare + multiply + sum per vocabulary tile and one reduce of the tiles'
    masses: tensor_reduce = 4 NC + 4 (max, the sums, the score max) + iters (NC + 1); twice the rounds cost about
    twice the compute-engine time of the rounds; the logits cross HBM once each way."""
    B, V, vt = 16, 4096, 2048
    NC = V // vt
    lg = _randn((B, V), np.float32, seed=9, scale=3.0)
    tp = np.full((B, 1), 0.5, np.float32)
    busy = {}
    for iters in (8, 16):
        _run(lp.typical_p_filter, lg, tp, iters, vt)
        c = _ops(lp.typical_p_filter)
        assert c["tensor_reduce"] == 4 * NC + 4 + iters * (NC + 1), c
        assert c["dma_copy"] == 2 * NC + 1, c
        prof = lp.typical_p_filter.last_profile
        assert prof.stat("memory.hbm_read_bytes") == lg.nbytes + B * 4
        assert prof.stat("memory.hbm_write_bytes") == lg.nbytes
        busy[iters] = sum(prof.stat("engine.{}.busy_time".format(e)) for e in ("vector", "scalar", "gpsimd"))
    assert busy[16] > 1.4 * busy[8], busy


def test_processor_chain_keeps_banned_tokens_banned(lp, lpn):
    """penalties -> bias / bad words -> min-p, and -> typical-p: logits already at NEG (banned) stay exactly NEG
    (no overflow to -inf, so no sanitizer report), are never kept, and do not widen typical-p's bracket (the kept
    sets match the references computed on the banned-free rows)."""
    B, V, T, K, W = 16, 4096, 8, 4, 3
    lg, ids, rep, pres, freq = _penalty_inputs(B, V, T, np.float32, seed=21)
    x1 = _run(lp.penalties_scatter, lg, ids, rep, pres, freq, 2048)
    _, bids, bvals, bad = _bias_inputs(B, V, K, W, np.float32, seed=22)
    x2 = _run(lpn.logit_bias_bad_words, x1, bids, bvals, bad)
    banned = x2 == NEG32
    assert banned.sum(1).min() >= 2
    # the references see the banned tokens with probability 0
    x2_ref = np.where(banned, -np.inf, _f64(x2))

    min_p = np.full((B, 1), 0.05, np.float32)
    y = _run(lpn.min_p_filter, x2, min_p, 2048)
    assert (y[banned] == NEG32).all()
    p = np.exp(x2_ref - x2_ref.max(1, keepdims=True))
    np.testing.assert_array_equal(y > -1e38, p >= 0.05)

    tp = np.full((B, 1), 0.6, np.float32)
    z = _run(lp.typical_p_filter, x2, tp, 24, 2048)
    assert (z[banned] == NEG32).all()
    keep, score, tau, _ = ref_typical(x2_ref, tp)
    away = np.abs(score - tau[:, None]) > 1e-4
    np.testing.assert_array_equal((z > -1e38)[away], keep[away])


def test_logit_bias_rmw_faster_than_gather_scatter(lpn):
    """K read-modify-write DMAs against K gathers + K vector adds + K scatters, each depending on the previous (the
    gather-add-scatter variant also scatters one bad-words column): the RMW bias is clearly faster in nsim's timing."""
    B, V, K = 64, 4096, 8
    lg, bids, bvals, bad = _bias_inputs(B, V, K, 1, np.float32, seed=31)
    _run(lpn.logit_bias_rmw, lg, bids, bvals)
    _run(lpn.logit_bias_bad_words, lg, bids, bvals, bad)
    t_rmw = lpn.logit_bias_rmw.last_profile.stat("total_time")
    t_gs = lpn.logit_bias_bad_words.last_profile.stat("total_time")
    assert t_rmw < 0.75 * t_gs, (t_rmw, t_gs)


@pytest.mark.parametrize("B,V,vt,dtype", [(8, 4096, 2048, np.float32), (64, 8192, 2048, BF16),
                                          (4, 32768, 8192, np.float32)])
def test_min_p_select_matches_arithmetic_mask(lpn, B, V, vt, dtype):
    """``.ap`` tile views, a uint8 predicate and one ``select_reduce`` per tile give the arithmetic-mask variant's
    output bit for bit, with one vector pass per tile fewer: faster in nsim's timing."""
    rng = np.random.default_rng(B + V)
    lg = _randn((B, V), dtype, seed=B, scale=3.0)
    min_p = rng.uniform(0.01, 0.5, (B, 1)).astype(np.float32)
    a = _run(lpn.min_p_filter, lg, min_p, vt)
    b = _run(lpn.min_p_select, lg, min_p, vt)
    np.testing.assert_array_equal(b.view(np.uint8), a.view(np.uint8))
    x = _f64(lg)
    keep = x >= x.max(1, keepdims=True) + np.log(_f64(min_p))
    margin = np.abs(x - x.max(1, keepdims=True) - np.log(_f64(min_p))) > 1e-5
    np.testing.assert_array_equal((_f64(b) > -1e38)[margin], keep[margin])
    c = _ops(lpn.min_p_select)
    NC = V // vt
    assert c["select_reduce"] == NC and c["tensor_scalar"] == NC and c["dma_copy"] == 2 * NC + 1, c
    assert lpn.min_p_select.last_profile.stat("total_time") < lpn.min_p_filter.last_profile.stat("total_time")
