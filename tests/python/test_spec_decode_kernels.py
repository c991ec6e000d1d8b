"""Speculative-decoding kernels written like public NKI ports of vLLM / NxD-Inference speculative decoding
(tests/python/kernels/spec_decode_kernels.py, Beta-1 dialect, and spec_decode_kernels_new.py, new dialect; both
unmodified, through ``nsim.compat``):

- multi-token / tree verification attention (new dialect): K draft tokens per head (GQA heads packed on the
  partitions) attend to a KV cache of any length (flash loop over blocks of 128, a ragged last block) plus the
  draft tokens themselves, causal within the draft or by a [K, K] tree mask given as input; bf16 / fp32 inputs,
  fp32 softmax statistics;
- rejection-sampling acceptance (Beta 1 and new dialect): token columns gathered by iota one-hots, by
  ``range_select`` or by one-element indirect DMAs, the accept rule
  u_i < min(1, p_i[t_i] / q_i[t_i]), the "all accepted so far" prefix by ``tensor_tensor_scan``, the residual
  norm(max(0, p - q)) at the first rejected row (or the bonus row p_K) picked by a selector matmul (new dialect:
  ``tensor_scalar_cumulative`` and rows loaded by a runtime ``scalar_offset``);
- KV-cache compaction after acceptance (both dialects): accepted scratch rows (runtime int32 indices) gathered and
  scattered to cache rows cache_len + i (cache_len read at run time) by indirect DMA; with a runtime count, the
  -1 padding and the padded slots' destinations skipped by ``oob_mode=skip``;
- Medusa heads (both dialects): residual blocks x + silu(x W1) and the shared LM head by PSUM-accumulated
  matmuls, top-k ids per head by ``max8`` / ``nc_find_index8`` / ``nc_match_replace8`` rounds (Beta 1: token tiles
  of 128 with the ragged last tile under ``mask=`` everywhere);
- variants of the verification attention: a paged cache (block ids from a runtime block table through
  ``.ap(scalar_offset=)``, runtime context length masked), a runtime block count (``nl.dynamic_range`` over a
  register), LNC=2 (the KV heads split between the cores), and Beta 1 with a runtime cache length.

Checked: float outputs against float64 numpy (fp32 1e-5, bf16 1e-2), exact integers (number accepted) and exact
row moves (bit for bit), no sanitizer report, the instruction / DMA counts and HBM bytes the tiling implies, and
the timing story of speculative decoding: verifying K draft tokens in one pass costs less than K single-token
decode passes over the same cache.

The nsim fixes this family needed (their regression tests fail without them):
- Beta-1 ``nisa.max8`` / ``nisa.nc_find_index8`` / ``nisa.nc_match_replace8`` refused ``mask=`` (NSIM-E446
  "mask= is not supported yet here") although spec 3.8 puts a mask on every call: a ragged token tile's top-k
  (``mask=(t * 128 + i_p < B)``) could not be written (python/nsim/nki/beta1/isa.py ``max8``, ``nc_find_index8``,
  ``nc_match_replace8``, helpers ``_top8_mask`` / ``_top8_masked``: the mask's box over the data's (input) index
  space restricts the partitions read and written, with ``dst=`` the other rows keep their contents; a free-dim
  cut restricts the columns read (where an index is output only a column prefix of a 2-D tile, else still E446));
  ``test_top8_instructions_take_a_mask``, ``test_medusa_heads_beta1``.

``memory.hbm_read_bytes`` / ``hbm_write_bytes`` count the static size of an indirect DMA, rows skipped by
``oob_mode=skip`` included (a decision, docs/timing-model.md: timing-only runs have no index values);
``test_kv_compact_skipped_rows_count_as_issued``.
"""
import math

import numpy as np
import pytest

from conftest import executed_ops, require_core, sample_fixture, run_clean, op_counts  # noqa: E402

_core, ml_dtypes = require_core()
from numeric_helpers import close, f64, randn  # noqa: E402

BF16 = ml_dtypes.bfloat16

sd = sample_fixture("spec_decode_kernels.py")
sdn = sample_fixture("spec_decode_kernels_new.py", module_only=True)


# --------------------------------------------------------------------------------------------------
# Verification attention
# --------------------------------------------------------------------------------------------------

def ref_verify(q, kc, vc, kd, vd, tree=None):
    """q [Hq, d, K], kc [Hkv, d, S], vc [Hkv, S, d], kd [Hkv, d, K], vd [Hkv, K, d] -> [Hq, K, d] in float64."""
    Hq, d, K = q.shape
    Hkv = kc.shape[0]
    G = Hq // Hkv
    keep = np.tril(np.ones((K, K), bool)) if tree is None else tree.astype(bool)
    out = np.zeros((Hq, K, d))
    for h in range(Hq):
        kv = h // G
        keys = np.concatenate([f64(kc[kv]), f64(kd[kv])], 1)  # [d, S + K]
        vals = np.concatenate([f64(vc[kv]), f64(vd[kv])], 0)
        s = f64(q[h]).T @ keys / math.sqrt(d)
        s[:, kc.shape[2]:][~keep] = -np.inf
        p = np.exp(s - s.max(1, keepdims=True))
        out[h] = p / p.sum(1, keepdims=True) @ vals
    return out


def _tree_mask(K, seed):
    """A random draft tree: token i's parent is an earlier token (or the root); keep[i, j] = j is i or an ancestor."""
    rng = np.random.default_rng(seed)
    parent = [-1] + [int(rng.integers(-1, i)) for i in range(1, K)]
    keep = np.zeros((K, K), np.float32)
    for i in range(K):
        j = i
        while j >= 0:
            keep[i, j] = 1.0
            j = parent[j]
    return keep


def _verify_inputs(Hq, Hkv, d, S, K, dtype, seed):
    return (randn((Hq, d, K), dtype, seed), randn((Hkv, d, S), dtype, seed + 1), randn((Hkv, S, d), dtype, seed + 2),
            randn((Hkv, d, K), dtype, seed + 3), randn((Hkv, K, d), dtype, seed + 4))


@pytest.mark.parametrize("Hq,Hkv,d,S,K,dtype,tree", [
    (8, 2, 64, 512, 4, BF16, False),
    (8, 2, 128, 300, 8, BF16, False),      # ragged last cache block of 44 keys
    (4, 4, 64, 256, 16, np.float32, False),  # MHA, fp32
    (16, 2, 64, 640, 16, BF16, True),      # G * K = 128 rows, tree mask
    (4, 1, 128, 200, 12, np.float32, True),
])
def test_verify_attention_matches_numpy(sdn, Hq, Hkv, d, S, K, dtype, tree):
    q, kc, vc, kd, vd = _verify_inputs(Hq, Hkv, d, S, K, dtype, seed=S + K)
    args = (q, kc, vc, kd, vd)
    mask = None
    if tree:
        mask = _tree_mask(K, seed=K)
        args = args + (mask,)
    out = run_clean(sdn.verify_attention, *args)
    assert out.dtype == np.dtype(dtype) and out.shape == (Hq, K, d)
    want = ref_verify(q, kc, vc, kd, vd, mask)
    if dtype == np.float32:
        close(out, want)
    else:  # bf16 probabilities into the PV matmul
        np.testing.assert_allclose(f64(out), want, rtol=2e-2, atol=2e-2)


# --------------------------------------------------------------------------------------------------
# Rejection sampling
# --------------------------------------------------------------------------------------------------

def _probs(n, V, rng, sharp=3.0):
    z = rng.standard_normal((n, V)) * sharp
    p = np.exp(z - z.max(1, keepdims=True))
    return (p / p.sum(1, keepdims=True)).astype(np.float32)


def ref_rejection(q, p, t, u):
    """Number accepted and the residual distribution (float64)."""
    K = q.shape[0]
    n = 0
    while n < K and u[n] < min(1.0, f64(p[n, t[n]]) / f64(q[n, t[n]])):
        n += 1
    if n == K:
        return n, f64(p[K])
    r = np.maximum(f64(p[n]) - f64(q[n]), 0.0)
    return n, r / r.sum()


def _spec_inputs(K, V, seed, reject_at):
    """Draft / target probs, draft ids sampled from q, uniforms chosen so the first rejection is at ``reject_at``
    (K = all accepted), each u well away from its acceptance threshold."""
    rng = np.random.default_rng(seed)
    q = _probs(K, V, rng)
    p = _probs(K + 1, V, rng)
    t = np.array([rng.choice(V, p=f64(q[i]) / f64(q[i]).sum()) for i in range(K)], np.int32)
    ratio = np.minimum(1.0, f64(p[np.arange(K), t]) / f64(q[np.arange(K), t]))
    u = np.zeros(K)
    for i in range(K):
        if i < reject_at:
            u[i] = ratio[i] * rng.uniform(0.0, 0.9)
        elif i == reject_at:
            if ratio[i] >= 1.0:  # force a rejectable token: make the target give it less mass
                p[i, t[i]] *= 0.25
                p[i] /= p[i].sum(dtype=np.float64)
                ratio[i] = min(1.0, f64(p[i, t[i]]) / f64(q[i, t[i]]))
            u[i] = ratio[i] + (1.0 - ratio[i]) * rng.uniform(0.1, 0.9)
        else:
            u[i] = rng.uniform()
    return q, p.astype(np.float32), t, u.astype(np.float32)


@pytest.mark.parametrize("K,V,reject_at", [
    (4, 1024, 0), (4, 1024, 2), (4, 1024, 4),  # first rejected, middle, all accepted (bonus row)
    (8, 4096, 5), (16, 32000 // 512 * 512, 16), (16, 2048, 11),
])
@pytest.mark.parametrize("gather", ["onehot", "range_select"])
def test_rejection_sample_matches_numpy(sd, K, V, reject_at, gather):
    m = sd[0]
    q, p, t, u = _spec_inputs(K, V, seed=K * V + reject_at, reject_at=reject_at)
    n, res = run_clean(m.rejection_sample, q, p, t, u, gather)
    want_n, want_r = ref_rejection(q, p, t, u)
    assert want_n == reject_at
    assert n.dtype == np.int32 and n.shape == (1, 1) and int(n[0, 0]) == want_n
    assert res.shape == (1, V)
    close(res[0], want_r)
    assert (res >= 0).all() and abs(f64(res).sum() - 1.0) < 1e-5


@pytest.mark.parametrize("K,V,reject_at", [(4, 1024, 0), (4, 1024, 4), (8, 4096, 5), (16, 32768, 16), (16, 2048, 11)])
def test_rejection_sample_new_dialect(sd, sdn, K, V, reject_at):
    """The new-dialect kernel (indirect one-element gathers, tensor_scalar_cumulative prefix, rows p_n / q_n by a
    runtime scalar_offset DMA) gives the same answer as numpy and as the Beta-1 kernel."""
    q, p, t, u = _spec_inputs(K, V, seed=K * V + reject_at + 1, reject_at=reject_at)
    n, res = run_clean(sdn.rejection_sample_new, q, p, t, u)
    want_n, want_r = ref_rejection(q, p, t, u)
    assert want_n == reject_at
    assert n.dtype == np.int32 and n.shape == (1, 1) and int(n[0, 0]) == want_n
    close(res[0], want_r)
    if V % 512 == 0:
        n1, res1 = run_clean(sd[0].rejection_sample, q, p, t, u)
        assert int(n1[0, 0]) == want_n
        close(res1, res)
    prof = sdn.rejection_sample_new.last_profile
    # two one-element gathers per draft, ids and uniforms, and one row of p and of q
    assert prof.stat("memory.hbm_read_bytes") == 2 * K * 4 + t.nbytes + u.nbytes + 2 * V * 4


def test_rejection_sample_structure(sd):
    """Two passes over V tiles of 512: the first reads q rows and p rows 0..K-1 (the gathers), the second p
    (K + 1 rows) and q; one selector matmul per V tile, one iota, one scan, two transposes."""
    m = sd[0]
    K, V = 8, 4096
    q, p, t, u = _spec_inputs(K, V, seed=3, reject_at=3)
    run_clean(m.rejection_sample, q, p, t, u)
    NV = V // 512
    c = op_counts(m.rejection_sample)
    assert c["nc_matmul"] == NV and c["iota"] == 1 and c["tensor_tensor_scan"] == 1, c
    assert c["nc_transpose"] == 2, c
    # the decisions (scan) are complete before the residual pass's first selector matmul
    ops = [o["op"] for o in executed_ops(m.rejection_sample.last_json["body"])]
    assert ops.index("tensor_tensor_scan") < ops.index("nc_matmul"), ops
    prof = m.rejection_sample.last_profile
    assert prof.stat("memory.hbm_read_bytes") == 2 * q.nbytes + p.nbytes + K * V * 4 + t.nbytes + u.nbytes
    assert prof.stat("memory.hbm_write_bytes") == 4 + V * 4
    # the range_select gather: two range_selects per V tile instead of the one-hot arithmetic, same traffic
    run_clean(m.rejection_sample, q, p, t, u, "range_select")
    c2 = op_counts(m.rejection_sample)
    assert c2["range_select"] == 2 * NV and c2["nc_matmul"] == NV, c2
    assert m.rejection_sample.last_profile.stat("memory.hbm_read_bytes") == prof.stat("memory.hbm_read_bytes")


# --------------------------------------------------------------------------------------------------
# KV-cache compaction
# --------------------------------------------------------------------------------------------------

def _compact_inputs(S_max, Hkv, d, K, A, L, dtype, seed):
    rng = np.random.default_rng(seed)
    kc = randn((S_max, Hkv, d), dtype, seed)
    vc = randn((S_max, Hkv, d), dtype, seed + 1)
    ks = randn((K, Hkv, d), dtype, seed + 2)
    vs = randn((K, Hkv, d), dtype, seed + 3)
    acc = np.sort(rng.choice(K, A, replace=False)).astype(np.int32)  # an accepted tree path
    return kc, vc, ks, vs, acc, np.array([L], np.int32)


def _ref_compact(kc, vc, ks, vs, acc, L):
    kc, vc = kc.copy(), vc.copy()
    kc[L:L + len(acc)] = ks[acc]
    vc[L:L + len(acc)] = vs[acc]
    return kc, vc


@pytest.mark.parametrize("S_max,Hkv,d,K,A,L,dtype", [
    (512, 2, 64, 8, 5, 300, BF16), (256, 8, 128, 16, 16, 0, np.float32), (1024, 1, 64, 4, 1, 1023, BF16),
])
def test_kv_compact_both_dialects(sd, sdn, S_max, Hkv, d, K, A, L, dtype):
    kc, vc, ks, vs, acc, L_arr = _compact_inputs(S_max, Hkv, d, K, A, L, dtype, seed=A + L)
    want_k, want_v = _ref_compact(kc, vc, ks, vs, acc, L)
    k1, v1 = run_clean(sdn.kv_compact, kc.copy(), vc.copy(), ks, vs, acc, L_arr)
    R = Hkv * d
    k2, v2 = run_clean(sd[0].kv_compact_b1, kc.reshape(S_max, R).copy(), vc.reshape(S_max, R).copy(),
                       ks.reshape(K, R), vs.reshape(K, R), acc, L_arr.reshape(1, 1))
    for got, want in ((k1, want_k), (v1, want_v), (k2, want_k), (v2, want_v)):
        np.testing.assert_array_equal(got.reshape(want.shape).view(np.uint8), want.view(np.uint8))
    for kern in (sdn.kv_compact, sd[0].kv_compact_b1):
        prof = kern.last_profile
        row_bytes = R * np.dtype(dtype).itemsize
        # two row gathers (scratch) + the indices and cache_len (the new dialect's stride-0 broadcast read of
        # cache_len reads it once per partition); two row scatters
        len_bytes = A * 4 if kern is sdn.kv_compact else 4
        assert prof.stat("memory.hbm_read_bytes") == 2 * A * row_bytes + A * 4 + len_bytes, kern
        assert prof.stat("memory.hbm_write_bytes") == 2 * A * row_bytes, kern
        c = op_counts(kern)
        assert c["dma_copy"] == 6 and c["iota"] == 1, (kern, c)


def test_verify_attention_structure_and_timing(sdn):
    """Per KV head: NB cache blocks (QK matmul, P transpose, PV matmul each) plus the draft block; the cache is read
    from HBM once per KV head whatever K is. Verifying K = 8 draft tokens in one pass is much cheaper than 8
    single-token decode passes (K = 1) over the same cache, and costs little more than one of them."""
    Hq, Hkv, d, S = 8, 2, 128, 1024
    NB = S // 128
    times = {}
    for K in (1, 8):
        q, kc, vc, kd, vd = _verify_inputs(Hq, Hkv, d, S, K, BF16, seed=7)
        run_clean(sdn.verify_attention, q, kc, vc, kd, vd)
        c = op_counts(sdn.verify_attention)
        assert c["nc_matmul"] == Hkv * 2 * (NB + 1) and c["nc_transpose"] == Hkv * (NB + 1), c
        assert c["affine_select"] == 1, c
        prof = sdn.verify_attention.last_profile
        assert prof.stat("memory.hbm_read_bytes") == q.nbytes + kc.nbytes + vc.nbytes + kd.nbytes + vd.nbytes
        assert prof.stat("memory.hbm_write_bytes") == Hq * K * d * 2
        times[K] = prof.total_time_ns
    assert times[8] < 8 * times[1] / 4, times
    assert times[8] < 1.5 * times[1], times


def test_verify_attention_kept_loop_times_as_unrolled(sdn):
    """The KV-head loop kept: its body holds the cache blocks' PSUM tiles (scores, P^T, P V; the last block peeled,
    the tracer's site_count 2: one buffer per tile) and the draft block's: six banks used, two unused, no tile
    sharing, so the next head's first matmuls waited for this head's last reads of their banks (22,067.7 ns kept
    against 15,940.8 ns unrolled at K = 8). The placement search also gives one tile at a time a second buffer while
    banks stay unused: 16,682.4 ns kept; with the search off the kept loop is as slow as before."""
    Hq, Hkv, d, S, K = 8, 2, 128, 1024, 8
    args = _verify_inputs(Hq, Hkv, d, S, K, BF16, seed=7)
    t = {}
    for loops in ("keep", "unroll"):
        _out, prof = sdn.verify_attention.options(loops=loops, check=False, timing_only=True).simulate(*args)
        t[loops] = prof.total_time_ns
    assert t["keep"] < 1.08 * t["unroll"], t
    _out, prof = sdn.verify_attention.options(loops="keep", check=False, timing_only=True,
                                              overrides=["compiler.placement_search=0"]).simulate(*args)
    assert prof.total_time_ns > 1.25 * t["unroll"], (prof.total_time_ns, t)


@pytest.mark.parametrize("Hq,Hkv,d,S_max,L,K,dtype,tree", [
    (8, 2, 64, 512, 300, 4, BF16, False),
    (4, 2, 128, 256, 256, 8, np.float32, False),
    (4, 1, 64, 384, 1, 16, np.float32, True),   # a single valid cache row
    (6, 3, 64, 512, 129, 12, BF16, True),
])
def test_verify_attention_beta1_matches_numpy(sd, sdn, Hq, Hkv, d, S_max, L, K, dtype, tree):
    """The Beta-1 kernel (natural layouts, runtime cache length) against numpy and, on the same problem, the
    new-dialect kernel given the valid part of the cache."""
    m = sd[0]
    rng_seed = S_max + L + K
    q = randn((Hq, K, d), dtype, rng_seed)
    kc = randn((Hkv, S_max, d), dtype, rng_seed + 1)
    vc = randn((Hkv, S_max, d), dtype, rng_seed + 2)
    kd = randn((Hkv, K, d), dtype, rng_seed + 3)
    vd = randn((Hkv, K, d), dtype, rng_seed + 4)
    mask = _tree_mask(K, seed=K + 1) if tree else None
    args = (q, kc, vc, kd, vd, np.array([[L]], np.int32)) + ((mask,) if tree else ())
    out = run_clean(m.verify_attention_b1, *args)
    qT, kT, kdT = (np.ascontiguousarray(np.swapaxes(a, 1, 2)) for a in (q, kc[:, :L], kd))
    want = ref_verify(qT, kT, vc[:, :L], kdT, vd, mask)
    args_new = (qT, kT, np.ascontiguousarray(vc[:, :L]), kdT, vd) + ((mask,) if tree else ())
    out_new = run_clean(sdn.verify_attention, *args_new)
    if dtype == np.float32:
        close(out, want)
        close(out_new, want)
    else:
        np.testing.assert_allclose(f64(out), want, rtol=2e-2, atol=2e-2)
        np.testing.assert_allclose(f64(out_new), want, rtol=2e-2, atol=2e-2)


# --------------------------------------------------------------------------------------------------
# Medusa heads
# --------------------------------------------------------------------------------------------------

def ref_medusa(x, w1, wv):
    x64 = f64(x)
    out = []
    for i in range(w1.shape[0]):
        z = x64 @ f64(w1[i])
        h = x64 + z / (1.0 + np.exp(-z))
        if x.dtype != np.float32:  # the kernel stores the residual in the input dtype before the LM head
            h = h.astype(x.dtype).astype(np.float64)
        out.append(h @ f64(wv))
    return np.stack(out)


@pytest.mark.parametrize("B,H,NH,V,k,dtype", [
    (4, 128, 3, 4096, 8, np.float32), (16, 256, 4, 8192, 16, np.float32), (64, 384, 2, 2048, 8, BF16),
])
def test_medusa_heads_topk(sdn, B, H, NH, V, k, dtype):
    x = randn((B, H), dtype, seed=B)
    w1 = randn((NH, H, H), dtype, seed=B + 1, scale=1.0 / math.sqrt(H))
    wv = randn((H, V), dtype, seed=B + 2, scale=1.0 / math.sqrt(H))
    vals, ids = run_clean(sdn.medusa_heads, x, w1, wv, k)
    lg = ref_medusa(x, w1, wv)
    want_ids = np.argsort(-lg, -1, kind="stable")[..., :k]
    want_vals = np.take_along_axis(lg, want_ids, -1)
    tol = 1e-4 if dtype == np.float32 else 3e-2
    np.testing.assert_allclose(f64(vals), want_vals, rtol=tol, atol=tol)
    # the ids are the ids of those values (a near tie may swap two of them)
    np.testing.assert_allclose(np.take_along_axis(lg, ids.astype(np.int64), -1), want_vals, rtol=tol, atol=tol)
    assert (ids.astype(np.int64) == want_ids).mean() > 0.95
    assert ids.dtype == np.uint32 and vals.shape == ids.shape == (NH, B, k)
    c = op_counts(sdn.medusa_heads)
    KT = H // 128
    assert c["max8"] == c["nc_find_index8"] == NH * k // 8, c
    assert c["nc_matmul"] == NH * KT * (1 + V // 512), c
    assert sdn.medusa_heads.last_profile.stat("memory.hbm_read_bytes") == x.nbytes + w1.nbytes + wv.nbytes


@pytest.mark.parametrize("S_max,Hkv,d,K,n,L,dtype", [
    (512, 2, 64, 8, 3, 300, BF16), (256, 4, 32, 16, 16, 100, np.float32), (128, 1, 64, 4, 0, 64, BF16),
    (1024, 2, 64, 8, 1, 1023, np.float32),
])
def test_kv_compact_runtime_count(sdn, S_max, Hkv, d, K, n, L, dtype):
    """A runtime number of accepted rows: the -1 padding is skipped by the gather, the padded slots' destinations
    (S_max) by the scatter; only rows L .. L + n - 1 of the caches change, bit for bit."""
    kc, vc, ks, vs, _, L_arr = _compact_inputs(S_max, Hkv, d, K, n, L, dtype, seed=n + L + 5)
    rng = np.random.default_rng(n)
    acc = np.full(K, -1, np.int32)
    acc[:n] = np.sort(rng.choice(K, n, replace=False))
    want_k, want_v = _ref_compact(kc, vc, ks, vs, acc[:n], L)
    k1, v1 = run_clean(sdn.kv_compact_padded, kc.copy(), vc.copy(), ks, vs, acc, np.array([n], np.int32), L_arr)
    np.testing.assert_array_equal(k1.view(np.uint8), want_k.view(np.uint8))
    np.testing.assert_array_equal(v1.view(np.uint8), want_v.view(np.uint8))
    c = op_counts(sdn.kv_compact_padded)
    assert c["dma_copy"] == 3 + 4 and c["iota"] == 1, c


def test_kv_compact_skipped_rows_count_as_issued(sdn):
    """With n of K slots accepted the scatter writes n rows per cache (the others are skipped: the destination is
    unchanged, as the test above checks), but a transfer's bytes and time are those of all K rows it was issued
    for (docs/timing-model.md, decision: a timing-only run, which has no index values, gives the same stats), so
    ``memory.hbm_write_bytes`` counts 2 caches x K rows whatever n is."""
    S_max, Hkv, d, K, L = 512, 2, 64, 8, 300
    got = []
    for n in (3, K):
        kc, vc, ks, vs, _, L_arr = _compact_inputs(S_max, Hkv, d, K, n, L, BF16, seed=1)
        acc = np.array([0, 2, 5] + [-1] * (K - n) if n < K else list(range(K)), np.int32)
        run_clean(sdn.kv_compact_padded, kc, vc, ks, vs, acc, np.array([n], np.int32), L_arr)
        got.append(sdn.kv_compact_padded.last_profile.stat("memory.hbm_write_bytes"))
    assert got[0] == got[1] == 2 * K * Hkv * d * 2


@pytest.mark.parametrize("Hq,Hkv,d,NB,L,K,dtype,tree", [
    (8, 2, 64, 4, 400, 4, BF16, False),
    (4, 2, 128, 3, 256, 8, np.float32, True),
    (16, 2, 64, 5, 129, 8, BF16, True),
    (4, 4, 64, 2, 1, 16, np.float32, False),
])
def test_verify_attention_paged(sdn, Hq, Hkv, d, NB, L, K, dtype, tree):
    """Paged cache: the sequence's blocks scattered over a pool of 16 blocks in a random order, the length read at
    run time (the tail of the last block and whole blocks past it masked); same answer as the contiguous kernel
    over the first L positions."""
    rng = np.random.default_rng(NB * L)
    NBLK = 16
    kpool = randn((NBLK, Hkv, d, 128), dtype, seed=L)
    vpool = randn((NBLK, Hkv, 128, d), dtype, seed=L + 1)
    table = rng.choice(NBLK, NB, replace=False).astype(np.int32)
    q = randn((Hq, d, K), dtype, seed=L + 2)
    kd = randn((Hkv, d, K), dtype, seed=L + 3)
    vd = randn((Hkv, K, d), dtype, seed=L + 4)
    mask = _tree_mask(K, seed=K + 2) if tree else None
    args = (q, kpool, vpool, table, np.array([L], np.int32), kd, vd) + ((mask,) if tree else ())
    out = run_clean(sdn.verify_attention_paged, *args)
    kc = np.concatenate([kpool[b] for b in table], axis=2)[:, :, :L]  # [Hkv, d, NB * 128]
    vc = np.concatenate([vpool[b] for b in table], axis=1)[:, :L]
    want = ref_verify(q, kc, vc, kd, vd, mask)
    if dtype == np.float32:
        close(out, want)
    else:
        np.testing.assert_allclose(f64(out), want, rtol=2e-2, atol=2e-2)
    prof = sdn.verify_attention_paged.last_profile
    blk = Hkv * NB * 128 * d * np.dtype(dtype).itemsize  # the K and V blocks of the table, once each
    assert prof.stat("memory.hbm_read_bytes") == (2 * blk + q.nbytes + kd.nbytes + vd.nbytes + table.nbytes +
                                                  Hq // Hkv * K * 4 + (mask.nbytes * Hq // Hkv if tree else 0))


@pytest.mark.parametrize("B,H,NH,V,k,dtype", [(200, 128, 2, 2048, 16, np.float32), (50, 64, 3, 1024, 8, np.float32),
                                              (128, 128, 2, 4096, 8, BF16)])
def test_medusa_heads_beta1(sd, B, H, NH, V, k, dtype):
    """The Beta-1 Medusa kernel: tokens in tiles of 128 with a ragged last tile under ``mask=`` (also on
    ``nisa.max8`` / ``nc_find_index8`` / ``nc_match_replace8``); against numpy."""
    x = randn((B, H), dtype, seed=B + 7)
    w1 = randn((NH, H, H), dtype, seed=B + 8, scale=1.0 / math.sqrt(H))
    wv = randn((H, V), dtype, seed=B + 9, scale=1.0 / math.sqrt(H))
    vals, ids = run_clean(sd[0].medusa_heads_b1, x, w1, wv, k)
    lg = ref_medusa(x, w1, wv)
    want_ids = np.argsort(-lg, -1, kind="stable")[..., :k]
    want_vals = np.take_along_axis(lg, want_ids, -1)
    tol = 1e-4 if dtype == np.float32 else 3e-2
    np.testing.assert_allclose(f64(vals), want_vals, rtol=tol, atol=tol)
    np.testing.assert_allclose(np.take_along_axis(lg, ids.astype(np.int64), -1), want_vals, rtol=tol, atol=tol)
    c = op_counts(sd[0].medusa_heads_b1)
    NT = (B + 127) // 128
    assert c["max8"] == c["nc_find_index8"] == NH * NT * k // 8, c
    assert c["nc_match_replace8"] == NH * NT * (k // 8 - 1), c


def test_top8_instructions_take_a_mask(sd):
    """Regression (nsim fix): Beta-1 ``nisa.max8`` / ``nc_find_index8`` / ``nc_match_replace8`` under ``mask=``
    (spec 3.8: a mask on any call, over the instruction's input space) were NSIM-E446 "mask= is not supported yet
    here". A ragged row count masks the partitions: only rows < B are read and written (with ``dst=`` the other
    rows keep their contents); a mask over the free dim restricts the columns read (a prefix ``i_v < n`` on
    nc_find_index8: the indices count from column 0)."""
    _, nki, nl, nisa = sd

    @nki.jit
    def top16_ragged(x, ncols):
        B, V = x.shape
        vals = nl.ndarray((128, 16), dtype=nl.float32, buffer=nl.shared_hbm)
        idx = nl.ndarray((128, 8), dtype=nl.uint32, buffer=nl.shared_hbm)
        part = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.shared_hbm)
        part_idx = nl.ndarray((128, 8), dtype=nl.uint32, buffer=nl.shared_hbm)
        i_p = nl.arange(128)[:, None]
        i_v = nl.arange(V)[None, :]
        i_8 = nl.arange(8)[None, :]
        t = nl.load(x[i_p, i_v], mask=(i_p < B))
        out = nl.full((128, 16), -1.0, dtype=nl.float32)
        m1 = nisa.max8(src=t, mask=(i_p < B))
        ix = nisa.nc_find_index8(data=t, vals=m1, mask=(i_p < B))
        t2 = nisa.nc_match_replace8(data=t, vals=m1, imm=-1e30, mask=(i_p < B))
        nisa.max8(src=t2, mask=(i_p < B), dst=out[i_p, 8 + i_8])
        out[i_p, i_8] = m1
        nl.store(vals, value=out)
        nl.store(idx[i_p, i_8], value=ix, mask=(i_p < B))
        pm = nisa.max8(src=t, mask=(i_p < B) & (i_v < ncols))
        nl.store(part[i_p, i_8], value=pm, mask=(i_p < B))
        pix = nisa.nc_find_index8(data=t, vals=pm, mask=(i_p < B) & (i_v < ncols))
        nl.store(part_idx[i_p, i_8], value=pix, mask=(i_p < B))
        return vals, idx, part, part_idx

    B, V, n = 70, 256, 100
    x = randn((B, V), np.float32, seed=11)
    vals, idx, part, part_idx = run_clean(top16_ragged, x, n)
    order = np.argsort(-x, 1, kind="stable")
    np.testing.assert_array_equal(vals[:B], np.take_along_axis(x, order[:, :16], 1))
    assert (vals[B:] == -1.0).all()
    np.testing.assert_array_equal(idx[:B], order[:, :8])
    np.testing.assert_array_equal(part[:B], -np.sort(-x[:, :n], 1)[:, :8])
    np.testing.assert_array_equal(part_idx[:B], np.argsort(-x[:, :n], 1, kind="stable")[:, :8])
    c = op_counts(top16_ragged)
    assert c["max8"] == 3 and c["nc_find_index8"] == 2 and c["nc_match_replace8"] == 1, c



@pytest.mark.parametrize("nblk,tree", [(3, False), (0, True), (4, True)])
def test_verify_attention_runtime_block_count(sdn, nblk, tree):
    """``nl.dynamic_range`` over a block count loaded into a register: blocks past the count are never read (HBM
    traffic and matmul count follow the runtime count), and the result equals numpy over the first nblk * 128 keys
    (with no cache block at all: attention over the draft tokens only)."""
    Hq, Hkv, d, S_max, K = 8, 2, 64, 512, 8
    q, kc, vc, kd, vd = _verify_inputs(Hq, Hkv, d, S_max, K, BF16, seed=nblk + 40)
    mask = _tree_mask(K, seed=nblk) if tree else None
    args = (q, kc, vc, kd, vd, np.array([nblk], np.int32)) + ((mask,) if tree else ())
    out = run_clean(sdn.verify_attention_dyn, *args)
    L = nblk * 128
    want = ref_verify(q, kc[:, :, :L], vc[:, :L], kd, vd, mask)
    np.testing.assert_allclose(f64(out), want, rtol=2e-2, atol=2e-2)
    c = op_counts(sdn.verify_attention_dyn)
    assert c["nc_matmul"] == Hkv * 2 * (nblk + 1), c
    prof = sdn.verify_attention_dyn.last_profile
    # (the register load of the count is a sequencer read, not a DMA: not in the DMA byte count)
    assert prof.stat("memory.hbm_read_bytes") == (q.nbytes + kd.nbytes + vd.nbytes + 2 * Hkv * L * d * 2 +
                                                  (mask.nbytes * Hq // Hkv if tree else 0))



def test_verify_attention_lnc2_splits_heads(sdn):
    """Under LNC=2 each core verifies half of the KV heads: the same output bit for bit, each core's share of the
    matmuls, and a shorter run than on one core."""
    Hq, Hkv, d, S, K = 8, 4, 64, 512, 8
    q, kc, vc, kd, vd = _verify_inputs(Hq, Hkv, d, S, K, BF16, seed=77)
    a = run_clean(sdn.verify_attention, q, kc, vc, kd, vd)
    t1 = sdn.verify_attention.last_profile.total_time_ns
    b = run_clean(sdn.verify_attention[2], q, kc, vc, kd, vd)
    t2 = sdn.verify_attention.last_profile.total_time_ns
    np.testing.assert_array_equal(f64(a), f64(b))
    np.testing.assert_allclose(f64(b), ref_verify(q, kc, vc, kd, vd), rtol=2e-2, atol=2e-2)
    assert t2 < 0.75 * t1, (t1, t2)
