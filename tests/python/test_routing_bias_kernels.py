"""Routing / permutation utilities and position-bias attention written like public NKI kernels
(tests/python/kernels/routing_bias_kernels.py, Beta-1 dialect, and routing_bias_kernels_new.py, new dialect; both
unmodified, through ``nsim.compat``):

- MoE token dispatch preparation on chip (Beta 1): the expert histogram (``iota`` one-hots reduced by a ones
  matmul), exclusive offsets per expert (``tensor_tensor_scan``), each assignment's destination row (rank within its
  expert from a strictly-triangular ``affine_select`` matmul over the partitions plus the earlier tiles' counts), the
  scatter of hidden rows to the expert-sorted order and the weighted un-permute (row gathers by a runtime index tile);
- top-k / argsort of rows by iterated ``max8`` + ``nc_find_index8`` + ``nc_match_replace8`` (new dialect): batched rows,
  a single 32768-wide row spread over the partitions (candidates flattened by an SBUF -> SBUF DMA, winners' ids by
  ``nc_n_gather``), and a full argsort of router logits read straight from PSUM;
- position-bias attention: T5 relative-position buckets computed on chip (``iota`` of j - i, ``nl.log`` bucketing)
  gathering a per-head table into the score tile on chip (``nl.gather_flattened``) or staged in HBM and loaded as a
  Toeplitz window (Beta 1), and causal ALiBi in a flash loop over key blocks, its bias from ``iota`` or from a host
  table in HBM (new dialect and Beta 1).

Checked: exact integers (histogram, offsets, destinations = a stable sort by expert, top-k indices with ties in
ascending index order as nc_find_index8 / nc_match_replace8 pair them), float outputs against float64 numpy (fp32
1e-5, bf16 1e-2), no sanitizer report, and the instruction / DMA counts and HBM traffic the tiling implies; ALiBi from
iota reads none of the table's bytes and is faster than the table variant.

The nsim fixes this family needed (their regression tests fail without them):
- a Beta-1 index expression with a negative arange coefficient, ``nl.load(x[127 - i_p, i_f])`` (rows reversed) or
  ``nl.store(out[n - 1 - i_p, i_f], ...)``, was NSIM-E446 "negative arange strides are not supported yet" although
  the kernel IR takes a negative step (python/nsim/nki/beta1/language.py ``Tensor.__getitem__``: the refusal removed,
  the bounds check made sign-aware; a reversed partition range of an on-chip tile is still E407);
- the overlapping Toeplitz window ``rel[(S - 1) - i_p + i_s]`` / ``rel[h, (S - 1) - q0 - i_p + i_s]`` (T5 relative
  bias) was NSIM-E428 "negative stride": ``ir_strided`` (python/nsim/tracer.py) now writes a negative stride as its
  magnitude walked backwards (index step -1 from the far end), and an offset finer than every stride (the column h
  of ``rel[r - i_p + i_s, h]``) as a size-1 unit-stride dim.

Also fixed (engines/check/checker.cpp ``Checker::after``): NSIM-W503 nan-produced was reported, falsely, for a
row scatter (``nl.store(out[idx[i_p, 0], i_f], ...)``, ``nisa.dma_copy``, the new dialect's ``out.ap(...,
vector_offset=)``) into a fresh (never written) HBM tensor: the sanitizer inspected the static view of the DMA's
indirect destination (rows 0..127, still the NaN fill) instead of the rows the runtime indices wrote (whether it
appeared depended on which rows the first tile scattered). A DMA with a side addressed at run time is no longer
checked for produced NaNs (it moves values, it computes none); ``test_scatter_into_fresh_tensor_has_no_sanitizer_report``."""
import math
import warnings

import numpy as np
import pytest

from conftest import executed_ops, require_core, run_clean, sample_fixture  # noqa: E402
from conftest import op_counts as _ops  # noqa: E402

# Its kernels use partition offsets the hardware's start-partition rule does not allow (nki-api.md 2.0: a view of n
# partitions starts at 0 for n > 64, 0 or 64 for n > 32, a multiple of 32 otherwise), which the sanitizer reports as
# NSIM-W509; the tests check their numbers and timing, so that warning is not an error here.
pytestmark = pytest.mark.filterwarnings("ignore:NSIM-W509")

_core, ml_dtypes = require_core()
from numeric_helpers import close, f64 as _f64, randn as _randn  # noqa: E402

BF16 = ml_dtypes.bfloat16

rb = sample_fixture("routing_bias_kernels.py")
rbn = sample_fixture("routing_bias_kernels_new.py", module_only=True)


def _run(k, *args):
    """Run kernel ``k`` with every warning (sanitizer reports included) an error, but NSIM-W509 (see pytestmark)."""
    return run_clean(k, *args, allow=("NSIM-W509",))


# --------------------------------------------------------------------------------------------------
# MoE dispatch / combine
# --------------------------------------------------------------------------------------------------

def _routing(T, E, K, seed, skew=False):
    rng = np.random.default_rng(seed)
    p = None
    if skew:  # a few hot experts and some that get no token at all
        p = np.zeros(E)
        p[: E // 2] = rng.random(E // 2) ** 4 + 1e-3
        p /= p.sum()
    return np.stack([rng.choice(E, K, replace=False, p=p) for _ in range(T)]).astype(np.int32)


def ref_dispatch(ids, E):
    """counts, exclusive offsets, destination of each (t, k) (a stable sort of the flattened ids by expert)."""
    flat = ids.ravel()
    counts = np.bincount(flat, minlength=E)
    offsets = np.concatenate([[0], np.cumsum(counts)[:-1]])
    dest = np.empty(flat.size, np.int64)
    dest[np.argsort(flat, kind="stable")] = np.arange(flat.size)
    return counts, offsets, dest.reshape(ids.shape)


@pytest.mark.parametrize("T,E,H,dtype,skew", [
    (256, 8, 64, np.float32, False),
    (1024, 64, 256, BF16, True),    # 8 token tiles, empty experts
    (300, 16, 128, BF16, False),    # ragged last tile of 44 tokens (masked loads, one-hots, stores, scatters)
    (1000, 32, 64, np.float32, True),
])
def test_moe_dispatch_matches_numpy(rb, T, E, H, dtype, skew):
    m = rb[0]
    K = 2
    ids = _routing(T, E, K, seed=T + E, skew=skew)
    hidden = _randn((T, H), dtype, seed=E)
    counts, offsets, dest, sorted_h = _run(m.moe_dispatch, ids, hidden, E)
    want_c, want_o, want_d = ref_dispatch(ids, E)
    assert counts.dtype == np.int32 and dest.dtype == np.int32 and sorted_h.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(counts[0], want_c)
    np.testing.assert_array_equal(offsets[0], want_o)
    np.testing.assert_array_equal(dest, want_d)
    # the permutation moves rows bit for bit: row dest[t, k] is token t
    np.testing.assert_array_equal(sorted_h.view(np.uint8).reshape(T * K, -1)[dest.ravel()],
                                  np.repeat(hidden.view(np.uint8).reshape(T, -1), K, 0))
    if skew:
        assert (want_c == 0).any()


def test_moe_dispatch_structure(rb):
    """T = 512 (4 token tiles), K = 2: per tile two id loads, one hidden load, K indirect scatters and one store of the
    destinations, plus the counts and offsets; 3 matmuls per tile (histogram, rank, running carry); one scan, one
    iota and one affine_select for the whole kernel. The hidden rows cross HBM once each way."""
    m = rb[0]
    T, E, H, K = 512, 16, 128, 2
    ids = _routing(T, E, K, seed=1)
    hidden = _randn((T, H), np.float32, seed=2)
    _run(m.moe_dispatch, ids, hidden, E)
    NT = T // 128
    c = _ops(m.moe_dispatch)
    assert c["dma_copy"] == NT * (2 + 1 + K + 1) + 2, c
    assert c["nc_matmul"] == 3 * NT, c
    assert c["tensor_tensor_scan"] == 1 and c["iota"] == 1 and c["affine_select"] == 1, c
    dmas = [o for o in executed_ops(m.moe_dispatch.last_json["body"]) if o["op"] == "dma_copy"]
    scatters = [o for o in dmas if isinstance(o["dst"], dict) and o["dst"]["tensor"] == "sorted_hidden"]
    assert len(scatters) == K * NT and all("indirect_dst" in o.get("flags", ()) for o in scatters)
    prof = m.moe_dispatch.last_profile
    assert prof.stat("memory.hbm_write_bytes") == T * K * H * 4 + T * K * 4 + 2 * E * 4
    assert prof.stat("memory.hbm_read_bytes") == T * H * 4 + 2 * T * K * 4


@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_moe_combine_unpermutes(rb, dtype):
    """out[t] = sum_k w[t, k] * y[dest[t, k]] by K row gathers per token tile; with y = the sorted hidden rows the
    combine of weights summing to one gives back the hidden rows."""
    m = rb[0]
    T, E, H, K = 384, 32, 128, 2
    ids = _routing(T, E, K, seed=5)
    _, _, dest = ref_dispatch(ids, E)
    dest = dest.astype(np.int32)
    y = _randn((T * K, H), dtype, seed=6)
    w = np.random.default_rng(7).random((T, K)).astype(np.float32)
    out = _run(m.moe_combine, y, dest, w)
    want = sum(_f64(w[:, k:k + 1]) * _f64(y)[dest[:, k]] for k in range(K))
    close(out, want, dtype)
    c = _ops(m.moe_combine)
    gathers = [o for o in executed_ops(m.moe_combine.last_json["body"])
               if o["op"] == "dma_copy" and isinstance(o["src"], dict) and o["src"]["tensor"] == "expert_out"]
    assert len(gathers) == K * T // 128 and all("offsets" in o for o in gathers), c
    assert m.moe_combine.last_profile.stat("memory.hbm_read_bytes") == (
        T * K * H * np.dtype(dtype).itemsize + 2 * T * K * 4)


def test_dispatch_then_combine_round_trip(rb):
    """dispatch -> (identity experts) -> combine with weights (0.25, 0.75) = the input rows (fp32)."""
    m = rb[0]
    T, E, H = 256, 8, 64
    ids = _routing(T, E, 2, seed=11)
    hidden = _randn((T, H), np.float32, seed=12)
    _, _, dest, sorted_h = _run(m.moe_dispatch, ids, hidden, E)
    w = np.tile(np.array([[0.25, 0.75]], np.float32), (T, 1))
    close(_run(m.moe_combine, sorted_h, dest, w), hidden)


def test_scatter_into_fresh_tensor_has_no_sanitizer_report(rb):
    """A permutation scattered into a fresh output (every row written exactly once) holds only finite values: no
    sanitizer report is due."""
    _, nki, nl, _ = rb

    @nki.jit
    def permute_rows(x, idx):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        i_p = nl.arange(128)[:, None]
        i_f = nl.arange(x.shape[1])[None, :]
        for t in nl.affine_range(x.shape[0] // 128):
            ix = nl.load(idx[t * 128 + i_p, nl.arange(1)[None, :]])
            nl.store(out[ix[i_p, 0], i_f], value=nl.load(x[t * 128 + i_p, i_f]))
        return out

    x = _randn((256, 64), np.float32, seed=3)
    perm = np.random.default_rng(4).permutation(256).astype(np.int32).reshape(256, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = permute_rows(x, perm)
    np.testing.assert_array_equal(out[perm[:, 0]], x)


# --------------------------------------------------------------------------------------------------
# Top-k / argsort
# --------------------------------------------------------------------------------------------------

def ref_topk(lg, k):
    idx = np.argsort(-_f64(lg), 1, kind="stable")[:, :k]
    return np.take_along_axis(_f64(lg), idx, 1), idx


def _logits_with_ties(B, V, seed, dtype=np.float32):
    """Normal logits with many exact duplicates among the largest (copies of each row's maximum and runs of equal
    values), so the order of equal values matters."""
    rng = np.random.default_rng(seed)
    lg = rng.standard_normal((B, V)).astype(dtype)
    for b in range(B):
        top = np.argsort(-_f64(lg[b]))[:6]
        dup = rng.choice(V, 5, replace=False)
        lg[b, dup] = lg[b, top[0]]
        lg[b, rng.choice(V, 12, replace=False)] = lg[b, top[5]]
    return lg


@pytest.mark.parametrize("B,V,k,dtype", [
    (130, 4096, 16, np.float32),   # two row tiles (128 + 2)
    (8, 16384, 32, BF16),          # one max8's full width
    (64, 8192, 8, np.float32),
    (4, 64, 64, np.float32),       # k = V: a full argsort
])
def test_topk_rows_matches_numpy(rbn, B, V, k, dtype):
    lg = _logits_with_ties(B, V, seed=V + k, dtype=dtype)
    vals, idx = _run(rbn.topk_rows, lg, k)
    want_v, want_i = ref_topk(lg, k)
    assert idx.dtype == np.uint32 and vals.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(idx, want_i)
    np.testing.assert_array_equal(_f64(vals), want_v)


def test_topk_rows_rounds(rbn):
    """k / 8 rounds per row tile: max8 and nc_find_index8 each round, nc_match_replace8 between rounds. Each of those
    reads the whole row on the vector engine, so r rounds make 3 r - 1 passes and the vector busy time follows: k = 32
    (11 passes) takes 11/5 of k = 16 (5 passes)."""
    lg = _logits_with_ties(128, 8192, seed=1)
    busy = {}
    for k in (8, 16, 32):
        _run(rbn.topk_rows, lg, k)
        c = _ops(rbn.topk_rows)
        r = k // 8
        assert c["max8"] == r and c["nc_find_index8"] == r and c["nc_match_replace8"] == r - 1, c
        prof = rbn.topk_rows.last_profile
        busy[k] = prof.stat("engine.vector.busy_time")
        assert prof.stat("memory.hbm_read_bytes") == lg.nbytes
    assert busy[8] < busy[16] < busy[32], busy
    assert busy[32] / busy[16] == pytest.approx(11 / 5, rel=0.1), busy


@pytest.mark.parametrize("B,V,k", [(2, 32768, 32), (3, 4096, 8), (1, 16384, 16)])
def test_topk_spread_matches_numpy(rbn, B, V, k):
    """One row over 128 partitions: per-partition top-k, candidates flattened partition-major, a final top-k; ties
    come out in ascending global index (earlier partitions first, ascending within a partition)."""
    lg = _logits_with_ties(B, V, seed=k + V)
    vals, idx = _run(rbn.topk_spread, lg, k)
    want_v, want_i = ref_topk(lg, k)
    np.testing.assert_array_equal(idx, want_i)
    np.testing.assert_array_equal(_f64(vals), want_v)


def test_topk_spread_structure(rbn):
    """Per row: k / 8 rounds over [128, V / 128] and k / 8 over the 128 k candidates (2 k / 8 max8), two SBUF -> SBUF
    flattening DMAs, one nc_n_gather; the logits are read from HBM once."""
    B, V, k = 2, 32768, 32
    lg = _logits_with_ties(B, V, seed=3)
    _run(rbn.topk_spread, lg, k)
    c = _ops(rbn.topk_spread)
    assert c["max8"] == B * 2 * k // 8 and c["nc_find_index8"] == B * 2 * k // 8, c
    assert c["nc_match_replace8"] == B * 2 * (k // 8 - 1) and c["nc_n_gather"] == B and c["iota"] == 1, c
    assert c["dma_copy"] == B * (1 + 2 + 2), c
    prof = rbn.topk_spread.last_profile
    assert prof.stat("memory.hbm_read_bytes") == lg.nbytes
    assert prof.stat("memory.hbm_write_bytes") == B * k * 8


@pytest.mark.parametrize("T,H,E,dtype", [(300, 128, 64, np.float32), (256, 64, 16, BF16), (128, 128, 8, BF16)])
def test_router_argsort_from_psum(rbn, T, H, E, dtype):
    """Full argsort of router logits (E / 8 rounds), the first round reading the matmul's PSUM tile directly. Small
    integer inputs make the logits exact integers in fp32 PSUM, with many ties among a token's experts: equal logits
    must come out in ascending expert order."""
    rng = np.random.default_rng(T + E)
    x = rng.integers(-3, 4, (H, T)).astype(dtype)
    w = rng.integers(-2, 3, (H, E)).astype(dtype)
    vals, order = _run(rbn.router_argsort, x, w)
    lg = _f64(x).T @ _f64(w)
    want = np.argsort(-lg, 1, kind="stable")
    assert any(len(np.unique(r)) < E for r in lg)  # ties present
    np.testing.assert_array_equal(order, want)
    np.testing.assert_array_equal(vals, np.take_along_axis(lg, want, 1))
    assert _ops(rbn.router_argsort)["max8"] == (T + 127) // 128 * E // 8


# --------------------------------------------------------------------------------------------------
# Position-bias attention
# --------------------------------------------------------------------------------------------------

def t5_bucket(r, num_buckets=32, max_distance=128):
    """HF T5 bidirectional bucket of relative position r = key - query (exact math)."""
    nb = num_buckets // 2
    me = nb // 2
    n = np.abs(r)
    large = me + np.floor(np.log(np.maximum(n, 1) / me) / math.log(max_distance / me) * (nb - me) + 1e-9)
    return (r > 0) * nb + np.where(n < me, n, np.minimum(large, nb - 1)).astype(np.int64)


def ref_attention(q, k, v, bias, causal=False, scale=1.0):
    """q, k [H, d, S], v [H, S, d], bias [H, S, S] -> softmax(scale q^T k + bias) v in float64."""
    H, d, S = q.shape
    out = np.zeros((H, S, d))
    for h in range(H):
        s = scale * (_f64(q[h]).T @ _f64(k[h])) + bias[h]
        if causal:
            s[np.triu_indices(S, 1)] = -np.inf
        p = np.exp(s - s.max(1, keepdims=True))
        out[h] = (p / p.sum(1, keepdims=True)) @ _f64(v[h])
    return out


@pytest.mark.parametrize("H,d,S,dtype,nb,md", [
    (4, 64, 256, np.float32, 32, 128),
    (2, 128, 512, BF16, 32, 128),
    (3, 64, 384, np.float32, 64, 256),
])
def test_t5_bias_attention_matches_numpy(rb, H, d, S, dtype, nb, md):
    m = rb[0]
    q = _randn((H, d, S), dtype, seed=S, scale=0.3)
    k = _randn((H, d, S), dtype, seed=S + 1, scale=0.3)
    v = _randn((H, S, d), dtype, seed=S + 2)
    table = _randn((nb, H), np.float32, seed=nb, scale=2.0)
    out = _run(m.t5_bias_attention, q, k, v, table, nb, md)
    i, j = np.arange(S)[:, None], np.arange(S)[None, :]
    bucket = t5_bucket(j - i, nb, md)
    bias = np.stack([table[bucket, h] for h in range(H)]).astype(np.float64)
    want = ref_attention(q, k, v, bias)
    if dtype == np.float32:
        close(out, want)
    else:  # bf16 probabilities into the PV matmul
        np.testing.assert_allclose(_f64(out), want, rtol=2e-2, atol=2e-2)


def test_t5_buckets_are_exact(rb):
    """The bias a query sees is table[bucket(j - i)] exactly: with q = k = 0 and v = one-hot rows of the keys the
    output is the softmax of the bias row itself, so every bucket id shows (including the exact powers 16, 32, 64
    where fp32 log rounding could floor one bucket too low, and the clamp at max_distance)."""
    m = rb[0]
    H, d, S, nb = 1, 128, 256, 32
    q = np.zeros((H, d, S), np.float32)
    v = np.zeros((H, S, d), np.float32)
    table = (np.arange(nb, dtype=np.float32) * 0.37).reshape(nb, 1)
    # v[j] = e_{j mod 128} scaled by the key block: out[i, c] = sum_j p[i, j] v[j, c]
    for j in range(S):
        v[0, j, j % 128] = 1.0 + (j // 128)
    out = _run(m.t5_bias_attention, q, q, v, table, nb, 128)
    i, j = np.arange(S)[:, None], np.arange(S)[None, :]
    bias = table[t5_bucket(j - i, nb, 128), 0][None].astype(np.float64)
    close(out, ref_attention(q, q, v, bias))


def test_t5_structure(rb):
    """Per query tile one bucket computation (iota, log) shared by the heads; per (head, query tile) one on-chip
    gather of the bias row (``nl.gather_flattened``: nc_n_gather), one QK matmul, S / 128 PV matmuls and P transposes; the table is read
    once."""
    m = rb[0]
    H, d, S, nb = 4, 64, 512, 32
    q = _randn((H, d, S), BF16, seed=1)
    v = _randn((H, S, d), BF16, seed=2)
    table = _randn((nb, H), np.float32, seed=3)
    _run(m.t5_bias_attention, q, q, v, table)
    NT = S // 128
    c = _ops(m.t5_bias_attention)
    assert c["iota"] == NT and c["nc_n_gather"] == H * NT, c
    assert c["nc_transpose"] == H * NT * NT, c
    assert c["activation"] >= H * NT, c
    prof = m.t5_bias_attention.last_profile
    # per (head, query tile): q^T [d, 128], k^T [d, S] and v [S, d] in bf16
    assert prof.stat("memory.hbm_read_bytes") == table.nbytes + H * NT * (d * 128 + 2 * d * S) * 2


@pytest.mark.parametrize("H,d,S,dtype", [(4, 64, 512, BF16), (3, 64, 384, np.float32)])
def test_t5_toeplitz_variant(rb, H, d, S, dtype):
    """The bias staged in HBM (bucket rows gathered by indirect DMA, stored transposed head-major, loaded per (head,
    query tile) as a Toeplitz window with a negative partition coefficient): the same output bit for bit as the
    on-chip gather; HBM traffic = the gather variant's + the scratch (written once, a [128, S] fp32 window read per
    (head, query tile)) + the bucket rows gathered from the table (2S - 1 of them)."""
    m = rb[0]
    q = _randn((H, d, S), dtype, seed=S, scale=0.3)
    v = _randn((H, S, d), dtype, seed=S + 2)
    table = _randn((32, H), np.float32, seed=4, scale=2.0)
    a = _run(m.t5_bias_attention, q, q, v, table)
    pa = m.t5_bias_attention.last_profile
    b = _run(m.t5_bias_attention_toeplitz, q, q, v, table)
    pb = m.t5_bias_attention_toeplitz.last_profile
    np.testing.assert_array_equal(_f64(a), _f64(b))
    R, NT = 2 * S - 1, S // 128
    assert pb.stat("memory.hbm_write_bytes") == pa.stat("memory.hbm_write_bytes") + R * H * 4
    assert pb.stat("memory.hbm_read_bytes") == (pa.stat("memory.hbm_read_bytes") - table.nbytes + R * H * 4 +
                                                H * NT * 128 * S * 4)
    c = _ops(m.t5_bias_attention_toeplitz)
    assert c["nc_n_gather"] == 0 and c["iota"] == (R + 127) // 128, c


def _alibi_bias(H, S):
    slopes = 2.0 ** (-8.0 * (np.arange(H) + 1) / H)
    i, j = np.arange(S)[:, None], np.arange(S)[None, :]
    return (slopes[:, None, None] * (j - i)).astype(np.float32)


@pytest.mark.parametrize("H,d,S,dtype", [(4, 64, 512, BF16), (2, 128, 256, np.float32), (3, 64, 1024, BF16)])
def test_alibi_flash_matches_numpy(rbn, H, d, S, dtype):
    q = _randn((H, d, S), dtype, seed=S)
    k = _randn((H, d, S), dtype, seed=S + 1)
    v = _randn((H, S, d), dtype, seed=S + 2)
    bias = _alibi_bias(H, S)
    want = ref_attention(q, k, v, _f64(bias), causal=True, scale=1 / math.sqrt(d))
    for name, args in (("alibi_flash_fwd", (q, k, v)), ("alibi_flash_fwd_table", (q, k, v, bias))):
        out = _run(getattr(rbn, name), *args)
        assert out.dtype == np.dtype(dtype)
        if dtype == np.float32:
            close(out, want)
        else:  # bf16 inputs and bf16 probabilities into the PV matmul
            np.testing.assert_allclose(_f64(out), want, rtol=2e-2, atol=2e-2)


def test_alibi_iota_avoids_table_traffic_and_is_faster(rbn):
    """Causal blocks only: H * NT (NT + 1) / 2 key blocks, each one QK and one PV matmul and one P transpose; the
    iota variant makes its bias with one iota per block and reads no bias bytes, the table variant reads exactly one
    fp32 [128, 128] bias block per key block more, and takes longer."""
    H, d, S = 4, 64, 512
    q = _randn((H, d, S), BF16, seed=1)
    k = _randn((H, d, S), BF16, seed=2)
    v = _randn((H, S, d), BF16, seed=3)
    bias = _alibi_bias(H, S)
    NT = S // 128
    blocks = H * NT * (NT + 1) // 2
    _run(rbn.alibi_flash_fwd, q, k, v)
    c = _ops(rbn.alibi_flash_fwd)
    assert c["iota"] == blocks and c["affine_select"] == H * NT, c
    assert c["nc_matmul"] == 2 * blocks and c["nc_transpose"] == blocks, c
    p_iota = rbn.alibi_flash_fwd.last_profile
    _run(rbn.alibi_flash_fwd_table, q, k, v, bias)
    c_t = _ops(rbn.alibi_flash_fwd_table)
    assert c_t["iota"] == 0 and c_t["dma_copy"] == c["dma_copy"] + blocks, c_t
    p_tab = rbn.alibi_flash_fwd_table.last_profile
    qkv = H * S * d * 2 + 2 * blocks * 128 * d * 2
    assert p_iota.stat("memory.hbm_read_bytes") == qkv
    assert p_tab.stat("memory.hbm_read_bytes") == qkv + blocks * 128 * 128 * 4
    assert p_iota.total_time_ns < p_tab.total_time_ns, (p_iota.total_time_ns, p_tab.total_time_ns)


def test_toeplitz_window_load(rb):
    """The fix (NSIM-E428 before): ``rel[(S - 1) - i_p + i_f]`` is numpy advanced indexing of an affine expression
    (spec 3.8) with a negative partition coefficient: row i of the tile is rel[S - 1 - i : 2 S - 1 - i] (overlapping
    rows of a read); also on a column of a 2-D tensor (``rel[r0 - i_p + i_f, h]``, the column as a unit-stride dim)."""
    _, nki, nl, _ = rb

    @nki.jit
    def toeplitz(rel):
        S = (rel.shape[0] + 1) // 2
        out = nl.ndarray((128, S), dtype=rel.dtype, buffer=nl.shared_hbm)
        i_p = nl.arange(128)[:, None]
        i_f = nl.arange(S)[None, :]
        nl.store(out, value=nl.load(rel[(S - 1) - i_p + i_f]))
        return out

    @nki.jit
    def toeplitz_col(rel, h, q0):
        S = (rel.shape[0] + 1) // 2
        out = nl.ndarray((128, S), dtype=rel.dtype, buffer=nl.shared_hbm)
        i_p = nl.arange(128)[:, None]
        i_f = nl.arange(S)[None, :]
        nl.store(out, value=nl.load(rel[(S - 1) - q0 - i_p + i_f, h]))
        return out

    S = 256
    i, j = np.arange(128)[:, None], np.arange(S)[None, :]
    rel = np.arange(2 * S - 1, dtype=np.float32)
    np.testing.assert_array_equal(_run(toeplitz, rel), rel[(S - 1) - i + j])
    rel2 = _randn((2 * S - 1, 3), np.float32, seed=1)
    for h, q0 in ((0, 0), (2, 128), (1, 64)):
        np.testing.assert_array_equal(_run(toeplitz_col, rel2, h, q0), rel2[(S - 1) - q0 - i + j, h])


def test_reversed_rows_load_and_store(rb):
    """The fix (NSIM-E446 "negative arange strides are not supported yet" before): ``x[127 - i_p, i_f]`` loads the
    rows in reverse, ``out[n - 1 - i_p, i_f]`` stores them so (masked for a ragged n), ``x[i_p, 63 - i_f]`` reverses
    the columns, on HBM and within an SBUF partition. A reversed *partition* range of an on-chip tile is not an access
    the engines have: still an error (NSIM-E407)."""
    _, nki, nl, _ = rb
    i_p = nl.arange(128)[:, None]
    i_f = nl.arange(64)[None, :]

    @nki.jit
    def rev_rows(x, n):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.load(x[n - 1 - i_p, i_f], mask=(i_p < n))
        nl.store(out[n - 1 - i_p, i_f], value=nl.load(x[i_p, i_f], mask=(i_p < n)), mask=(i_p < n))
        out2 = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(out2[i_p, i_f], value=t, mask=(i_p < n))
        return out, out2

    @nki.jit
    def rev_cols(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        out2 = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(out, value=nl.load(x[i_p, 63 - i_f]))
        t = nl.load(x)
        nl.store(out2, value=nl.copy(t[i_p, 63 - i_f]))
        return out, out2

    @nki.jit
    def rev_partitions_on_chip(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.load(x)
        nl.store(out, value=nl.copy(t[127 - i_p, i_f]))
        return out

    x = _randn((128, 64), np.float32, seed=5)
    for n in (128, 100):
        a, b = _run(rev_rows, x, n)
        np.testing.assert_array_equal(a[:n], x[:n][::-1])
        np.testing.assert_array_equal(b[:n], x[:n][::-1])
    for o in _run(rev_cols, x):
        np.testing.assert_array_equal(o, x[:, ::-1])
    with pytest.raises(_core.NsimError, match="NSIM-E407"):
        rev_partitions_on_chip(x)


@pytest.mark.parametrize("H,d,S,dtype", [(2, 64, 384, BF16), (4, 128, 256, np.float32)])
def test_alibi_flash_beta1_matches_numpy(rb, H, d, S, dtype):
    """The Beta-1 form: iota of ``k0 - q0 + i_f - i_p`` with the loop indices, affine_select on every block of the
    causal loop ``sequential_range(qi + 1)``: NT (NT + 1) / 2 blocks per head, one iota and one affine_select each."""
    m = rb[0]
    q = _randn((H, d, S), dtype, seed=S)
    k = _randn((H, d, S), dtype, seed=S + 1)
    v = _randn((H, S, d), dtype, seed=S + 2)
    slopes = (2.0 ** (-8.0 * (np.arange(H) + 1) / H)).astype(np.float32)
    out = _run(m.alibi_flash_b1, q, k, v, slopes)
    want = ref_attention(q, k, v, _f64(_alibi_bias(H, S)), causal=True, scale=1 / math.sqrt(d))
    if dtype == np.float32:
        close(out, want)
    else:
        np.testing.assert_allclose(_f64(out), want, rtol=2e-2, atol=2e-2)
    NT = S // 128
    c = _ops(m.alibi_flash_b1)
    assert c["iota"] == c["affine_select"] == H * NT * (NT + 1) // 2, c
