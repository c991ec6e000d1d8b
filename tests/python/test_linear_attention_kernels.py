"""Linear attention and state-space models, chunked, written like public Trainium ports
(tests/python/kernels/linear_attention_kernels.py, new dialect, and linear_attention_kernels_beta1.py, Beta 1; both
unmodified, through ``nsim.compat``):

- chunked causal linear attention: intra-chunk (Q K^T masked by ``affine_select`` or an ``iota``-built mask) V plus
  the inter-chunk running state S += K^T V carried across chunks in PSUM (``accumulate=``) or SBUF, heads dealt to
  the programs of an LNC=2 launch; and the quadratic masked form of the same product;
- RetNet retention (Beta 1, one program per head): the per-head decay mask gamma^(i - j) built on chip from
  ``iota`` / ``exp`` / ``affine_select``, the chunkwise cross-chunk state, and the recurrent decode step
  S = gamma S + k^T v, o = q S;
- the Mamba-2 SSD chunked scan: the in-chunk cumulative sum of the log decays (a triangular-ones matmul or
  ``tensor_tensor_scan``), L = exp(segsum), (C B^T * L) X, chunk states and the inter-chunk recurrence (new dialect in
  one pass, Beta 1 in the three passes of the reference, with block tensors);
- a gated delta-rule decode step S = alpha S - beta (S k) k^T + beta v k^T, o = S q.

Checked: outputs against float64 numpy recurrences / masked products (the errors are measured against the largest
output magnitude, as these outputs are long sums: fp32 1e-5, bf16 1e-2), that the carried state and the decays
matter, no sanitizer report (pytest makes nsim's CheckWarning an error), and structure / timing from the tilings:
matmul and transpose counts per chunk, chunked linear attention faster than the quadratic form at S = 2048 with a
time linear in S where the quadratic form's grows faster, and LNC=2 faster than one core.

The nsim fixes this family needed:
- a Beta-1 ``nl.load(a[h, c * L + i_p])`` of a 2-D [H, S] tensor (a per-token scalar, as SSD's log decays or a
  gate) returned an (L,) tile instead of numpy's (L, 1) (the broadcast shape of the items, spec §3.8), so the
  following ``nl.matmul(tri, a_col, transpose_x=True)`` failed NSIM-E436 "2-D tiles are needed, got (64, 64) and
  (64,)". ``nl.load`` now gives the (L, 1) tile, with or without a mask (``_numpy_index_shape``,
  python/nsim/nki/beta1/language.py; one arange item on such a tile, the NKI docs' ``idx_tile[ix]``, addresses its
  column as it did on the (L,) tile, ``Tensor.__getitem__``); the view itself is unchanged;
- ``accumulate=(c > 0)`` peels the chunk loop and, its body allocating tiles, the tracer records the middle chunks
  two per pass over tiles allocated before the loop; the allocator gave those tiles whole-loop lifetimes (its
  value-level fallback skipped accesses inside a nested loop), so 4 PSUM tiles x 2 + the state = 9 banks, NSIM-E206
  "PSUM overflow", from 8 chunks on, where unrolled the kernel needs 5. The fallback now splits such tiles when
  nothing they hold is live into the loop's body (``value_ranges``, frontend/compiler/allocate.cpp; documented in
  docs/timing-model.md "Value-level fallback")."""
import collections

import numpy as np
import pytest

from conftest import executed_ops, require_core, sample_fixture  # noqa: E402

_core, ml_dtypes = require_core()
from numeric_helpers import close_to_max, f64 as _f64  # noqa: E402
from numeric_helpers import randn as _randn  # noqa: E402

BF16 = ml_dtypes.bfloat16

la = sample_fixture("linear_attention_kernels.py", module_only=True)
b1 = sample_fixture("linear_attention_kernels_beta1.py")


def _ops(kernel):
    """Instructions executed by the last run of ``kernel``, by op, summed over the programs of an LNC=2 launch."""
    kj = kernel.last_json
    bodies = [p["body"] for p in kj["core_programs"]] if "core_programs" in kj else [kj["body"]]
    return collections.Counter(o["op"] for b in bodies for o in executed_ops(b))


_check = close_to_max  # (numeric_helpers)


def _qkv(H, S, d, dtype, seed):
    return [_randn((H, S, d), dtype, seed + i, scale=d ** -0.25) for i in range(3)]


def ref_linear_attention(q, k, v, gammas=None):
    """o_i = sum_{j <= i} gamma^(i - j) (q_i . k_j) v_j in float64 (gamma = 1: causal linear attention)."""
    q, k, v = _f64(q), _f64(k), _f64(v)
    S = q.shape[1]
    i = np.arange(S)
    if gammas is None:
        D = np.tril(np.ones((S, S)))[None]
    else:
        D = np.where(i[:, None] >= i[None, :], _f64(gammas)[:, None, None] ** np.maximum(i[:, None] - i[None, :], 0), 0)
    return (np.einsum("hid,hjd->hij", q, k) * D) @ v


def _ssd_inputs(H, S, p, N, dtype, seed):
    rng = np.random.default_rng(seed)
    x = _randn((H, S, p), dtype, seed)
    a = -rng.uniform(0.002, 0.12, (H, S)).astype(np.float32)  # dt * A
    b = _randn((H, S, N), dtype, seed + 1, scale=N ** -0.5)
    c = _randn((H, S, N), dtype, seed + 2, scale=N ** -0.5)
    return x, a, b, c


def ref_ssd(x, a, b, c):
    """The SSM recurrence h_t = exp(a_t) h_{t-1} + B_t^T x_t, y_t = C_t h_t (float64, token by token)."""
    x, a, b, c = _f64(x), _f64(a), _f64(b), _f64(c)
    H, S, p = x.shape
    st = np.zeros((H, b.shape[2], p))
    y = np.zeros_like(x)
    for t in range(S):
        st = np.exp(a[:, t])[:, None, None] * st + b[:, t, :, None] * x[:, t, None, :]
        y[:, t] = np.einsum("hn,hnp->hp", c[:, t], st)
    return y


# --------------------------------------------------------------------------------------------------
# chunked causal linear attention (new dialect)
# --------------------------------------------------------------------------------------------------

# (H, S, d, chunk), dtype, mask, state, lnc
LA_CASES = [
    ((2, 512, 64, 128), BF16, "affine_select", "psum", 1),
    ((2, 256, 128, 64), np.float32, "iota", "sbuf", 1),
    ((4, 1024, 64, 128), BF16, "iota", "psum", 2),
    ((2, 512, 128, 128), np.float32, "affine_select", "psum", 2),
]


@pytest.mark.parametrize("dims,dtype,mask,state,lnc", LA_CASES)
def test_chunked_linear_attention_matches_numpy(la, dims, dtype, mask, state, lnc):
    """Per chunk: 2 PE transposes (Q^T, K^T) and 4 matmuls (A^T, intra A V, inter Q S, state K^T V); the output
    needs the carried state (dropping it, i.e. chunk-local attention, is far off)."""
    H, S, d, C = dims
    q, k, v = _qkv(H, S, d, dtype, seed=S + d)
    k_ = la.chunked_linear_attention
    out = k_[lnc](q, k, v, chunk=C, mask=mask, state=state)
    assert out.dtype == np.dtype(dtype)
    want = ref_linear_attention(q, k, v)
    _check(out, want, dtype)
    local = want.copy()
    for c0 in range(C, S, C):  # the chunk-local product misses every earlier chunk
        qf, kf, vf = _f64(q[:, c0:c0 + C]), _f64(k[:, c0:c0 + C]), _f64(v[:, c0:c0 + C])
        local[:, c0:c0 + C] = (np.einsum("hid,hjd->hij", qf, kf) * np.tril(np.ones((C, C)))) @ vf
    assert np.abs(_f64(out) - local).max() > 0.1 * np.abs(want).max()
    ops = _ops(k_)
    n = H * (S // C)
    assert ops["nc_matmul"] == 4 * n and ops["nc_transpose"] == 2 * n, ops
    assert ops["affine_select"] == (n if mask == "affine_select" else 0)
    assert ops["iota"] == (lnc if mask == "iota" else 0)  # the mask built once per program


def _quadratic_matmuls(H, S, C):
    n = S // C
    return H * n * (n + 1)  # two matmuls per (query block, key block <= it)


def test_chunked_faster_than_quadratic_and_linear_in_s(la):
    """The same product at S = 2048 (C = 128): the chunked form runs H * 16 * 4 = 64 matmuls where the quadratic
    runs H * 16 * 17 = 272, and is faster on nsim's timing by more than 2x; doubling S doubles the chunked time
    (linear) and more than triples the quadratic one."""
    H, d, C = 1, 64, 128
    t = {}
    for S in (1024, 2048):
        q, k, v = _qkv(H, S, d, BF16, seed=7)
        want = ref_linear_attention(q, k, v)
        for name in ("chunked_linear_attention", "quadratic_masked_attention"):
            kern = getattr(la, name)
            _check(kern(q, k, v), want, BF16)
            t[name, S] = kern.last_profile.total_time_ns
            mm = _ops(kern)["nc_matmul"]
            assert mm == (4 * H * S // C if name.startswith("chunked") else _quadratic_matmuls(H, S, C)), (name, mm)
    ch, qu = t["chunked_linear_attention", 2048], t["quadratic_masked_attention", 2048]
    assert 2 * ch < qu, t
    r_ch = ch / t["chunked_linear_attention", 1024]
    r_qu = qu / t["quadratic_masked_attention", 1024]
    assert 1.6 < r_ch < 2.4 and r_qu > 3.0, (r_ch, r_qu, t)


def test_lnc2_faster_than_one_core(la):
    """4 heads dealt 2 + 2 to the programs of LNC=2: the same bits as one core, in well under the time."""
    q, k, v = _qkv(4, 512, 64, BF16, seed=11)
    kern = la.chunked_linear_attention
    o1 = kern(q, k, v)
    p1 = kern.last_profile
    o2 = kern[2](q, k, v)
    p2 = kern.last_profile
    np.testing.assert_array_equal(_f64(o1), _f64(o2))
    assert p2.total_time_ns < 0.7 * p1.total_time_ns, (p1.total_time_ns, p2.total_time_ns)


# --------------------------------------------------------------------------------------------------
# Mamba-2 SSD
# --------------------------------------------------------------------------------------------------

# (H, S, p, N, chunk), dtype, cumsum
SSD_CASES = [
    ((2, 512, 64, 64, 128), np.float32, "matmul"),
    ((2, 512, 64, 64, 128), BF16, "scan"),
    ((1, 512, 128, 128, 128), BF16, "matmul"),
    ((2, 256, 64, 32, 64), np.float32, "scan"),
]


@pytest.mark.parametrize("dims,dtype,cumsum", SSD_CASES)
def test_ssd_chunked_scan_matches_recurrence(la, dims, dtype, cumsum):
    """The chunked SSD against the token-by-token recurrence; per chunk 6 matmuls with the triangular-ones cumsum
    (cumsum, its row broadcast, B C^T, intra, inter, chunk state) or 5 with tensor_tensor_scan (+1 transpose);
    the decays matter (a = 0 gives other numbers)."""
    H, S, p, N, L = dims
    x, a, b, c = _ssd_inputs(H, S, p, N, dtype, seed=S + N)
    y = la.ssd_chunked_scan(x, a, b, c, chunk=L, cumsum=cumsum)
    want = ref_ssd(x, a, b, c)
    _check(y, want, dtype)
    assert np.abs(ref_ssd(x, np.zeros_like(a), b, c) - want).max() > 0.1 * np.abs(want).max()
    ops = _ops(la.ssd_chunked_scan)
    n = H * S // L
    assert ops["nc_matmul"] == (6 if cumsum == "matmul" else 5) * n, ops
    assert ops["nc_transpose"] == (2 if cumsum == "matmul" else 3) * n, ops
    assert ops["tensor_tensor_scan"] == (n if cumsum == "scan" else 0)


@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_ssd_beta1_three_pass_matches_recurrence(b1, la, dtype):
    """The Beta-1 SSD (block tensors of per-chunk results, the chunk-state recurrence in a sequential_range) equals
    the recurrence and, in fp32, the new-dialect one-pass kernel."""
    mod = b1[0]
    x, a, b, c = _ssd_inputs(2, 512, 64, 64, dtype, seed=3)
    y = mod.ssd_chunked(x, a, b, c, chunk=64)
    _check(y, ref_ssd(x, a, b, c), dtype)
    if dtype == np.float32:
        _check(y, _f64(la.ssd_chunked_scan(x, a, b, c, chunk=64)), dtype)
    # per chunk: the cumsum, its partition broadcast (a ones matmul), B C^T, intra, chunk state; + inter (pass 3)
    assert _ops(mod.ssd_chunked)["nc_matmul"] == 2 * 8 * 6


@pytest.mark.parametrize("S,dtype", [(300, np.float32), (256, BF16)])
def test_beta1_linear_attention_ragged_psum_state(b1, S, dtype):
    """The Beta-1 form: any S (a ragged last chunk of 44 rows under mask=), Q^T / K^T as transposed HBM windows,
    the causal mask from nl.mgrid, the state carried in PSUM by ``s_ps += nc_matmul``; the same numbers as the
    new-dialect kernel where S is a multiple of the chunk."""
    mod = b1[0]
    q, k, v = _qkv(2, S, 64, dtype, seed=S)
    out = mod.linear_attention_ragged(q, k, v)
    _check(out, ref_linear_attention(q, k, v), dtype)
    n = 2 * -(-S // 128)
    assert _ops(mod.linear_attention_ragged)["nc_matmul"] == 4 * n


# --------------------------------------------------------------------------------------------------
# RetNet retention (Beta 1)
# --------------------------------------------------------------------------------------------------

def _gammas(H):
    return (1.0 - 2.0 ** (-5.0 - np.arange(H))).astype(np.float32)


@pytest.mark.parametrize("dims,dtype,decay", [((4, 512, 64, 128), BF16, "exp"), ((2, 256, 128, 64), np.float32, "exp"),
                                              ((2, 256, 64, 128), np.float32, "power")])
def test_retention_chunked_matches_numpy(b1, dims, dtype, decay):
    """One program per head with its own decay (the mask from iota + exp, or nl.power); the cross-chunk state
    decays by gamma^C per chunk. Different per-head decays matter (all heads at gamma_0 differ)."""
    mod = b1[0]
    H, S, d, C = dims
    q, k, v = _qkv(H, S, d, dtype, seed=5)
    g = _gammas(H)
    out = mod.retention_chunked[H](q, k, v, g, chunk=C, decay=decay)
    want = ref_linear_attention(q, k, v, g)
    _check(out, want, dtype)
    same = ref_linear_attention(q, k, v, np.full(H, g[0]))
    assert np.abs(same - want).max() > 0.1 * np.abs(want).max()
    ops = _ops(mod.retention_chunked)
    n = H * S // C
    # per chunk 4; per program 2 more (3 with nl.power): the partition broadcasts of the decays (broadcast_to, a
    # ones matmul)
    assert ops["nc_matmul"] == 4 * n + (3 if decay == "power" else 2) * H and ops["nc_transpose"] == 2 * n, ops


@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_retention_decode_step_and_chain(b1, dtype):
    """The recurrent step against numpy (B = 2 sequences, 4 heads, one matmul pair per head), and 6 chained
    steps from a zero state equal the parallel retention of those 6 tokens."""
    mod = b1[0]
    B, H, d = 2, 4, 64
    g = _gammas(H)
    q, k, v = [_randn((B, H, d), dtype, 20 + i, scale=d ** -0.25) for i in range(3)]
    st = _randn((B, H, d, d), np.float32, 23)
    o, ns = mod.retention_decode(q, k, v, g, st)
    s_new = _f64(g)[None, :, None, None] * _f64(st) + np.einsum("bhk,bhv->bhkv", _f64(k), _f64(v))
    _check(ns, s_new, np.float32)
    _check(o, np.einsum("bhk,bhkv->bhv", _f64(q), s_new), dtype)
    assert _ops(mod.retention_decode)["nc_matmul"] == 2 * B * H + 1  # + the decays' partition broadcast

    # the 2-D SPMD grid form (nl.transpose / nl.matmul without transpose_x): the same numbers
    o_g, ns_g = mod.retention_decode_grid[B, H](q, k, v, g, st)
    _check(ns_g, s_new, np.float32)
    _check(o_g, np.einsum("bhk,bhkv->bhv", _f64(q), s_new), dtype)

    T = 6
    qs, ks, vs = _qkv(H, T, d, dtype, seed=30)
    state = np.zeros((1, H, d, d), np.float32)
    outs = []
    for t in range(T):
        o, state = mod.retention_decode(qs[None, :, t], ks[None, :, t], vs[None, :, t], g, state)
        outs.append(_f64(o[0]))
    _check(np.stack(outs, 1), ref_linear_attention(qs, ks, vs, g), dtype)


# --------------------------------------------------------------------------------------------------
# gated delta rule decode (new dialect)
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("d,dtype", [(128, np.float32), (64, BF16)])
def test_gated_delta_decode_matches_numpy(la, d, dtype):
    H = 4
    rng = np.random.default_rng(d)
    q = _randn((H, d), dtype, 40, scale=d ** -0.5)
    k = np.asarray(_f64(_randn((H, d), np.float32, 41)), np.float64)
    k = (k / np.linalg.norm(k, axis=1, keepdims=True)).astype(dtype)  # L2-normalised keys, as the model uses
    v = _randn((H, d), dtype, 42)
    alpha = rng.uniform(0.8, 1.0, H).astype(np.float32)
    beta = rng.uniform(0.1, 0.9, H).astype(np.float32)
    st = _randn((H, d, d), np.float32, 43)  # S^T: [d_k, d_v]
    o, ns = la.gated_delta_decode(q, k, v, alpha, beta, st)
    S = np.swapaxes(_f64(st), 1, 2)  # [d_v, d_k]
    Sk = np.einsum("hvk,hk->hv", S, _f64(k))
    al, be = _f64(alpha)[:, None, None], _f64(beta)[:, None, None]
    S_new = al * S - be * np.einsum("hv,hk->hvk", Sk, _f64(k)) + be * np.einsum("hv,hk->hvk", _f64(v), _f64(k))
    _check(ns, np.swapaxes(S_new, 1, 2), np.float32 if dtype == np.float32 else dtype)
    _check(o, np.einsum("hvk,hk->hv", S_new, _f64(q)), dtype)
    # the delta term matters: without it (plain gated linear attention) the state differs
    plain = al * S + be * np.einsum("hv,hk->hvk", _f64(v), _f64(k))
    assert np.abs(np.swapaxes(_f64(ns), 1, 2) - plain).max() > 0.1


# --------------------------------------------------------------------------------------------------
# the nsim fix: Beta-1 nl.load of an arange subscript with a trailing size-1 index axis
# --------------------------------------------------------------------------------------------------

def test_beta1_load_of_per_token_scalars_is_a_column(b1):
    """``nl.load(a[h, c * L + i_p])`` (a 2-D [H, S]) and ``nl.load(ids[c * L + i_p])`` (1-D), plain or masked, are
    (L, 1) tiles (numpy's broadcast shape of the items) that matmul as columns; before the fix they were (L,)
    tiles and the matmul raised NSIM-E436. One arange item on such a tile (``idx_tile[ix]``, as the NKI docs' indirect
    DMA examples write it) still addresses its column."""
    _, nki, nl, nisa = b1
    L = 64

    @nki.jit
    def colsum(a, ids):
        out = nl.ndarray((1, 4), dtype=nl.float32, buffer=nl.shared_hbm)
        part_out = nl.ndarray((L, 1), dtype=nl.float32, buffer=nl.shared_hbm)
        i_p = nl.arange(L)[:, None]
        ones = nl.ones((L, 4), dtype=nl.float32)
        col = nl.load(a[1, L + i_p])
        assert tuple(col.shape) == (L, 1), col.shape
        idc = nl.load(ids[i_p], dtype=nl.float32)
        assert tuple(idc.shape) == (L, 1), idc.shape
        assert tuple(idc[i_p].shape) == (L, 1)  # one item on the (L, 1) tile: its column (the NKI docs' idx_tile[ix])
        part = nl.load(a[0, i_p], mask=(i_p < 40))  # rows 40.. of the tile stay unwritten
        assert tuple(part.shape) == (L, 1), part.shape
        nl.store(part_out[i_p, 0], value=part, mask=(i_p < 40))
        r = nl.matmul(col, ones, transpose_x=True)  # [1, 4]: the column's sum
        r2 = nl.matmul(idc, ones, transpose_x=True)
        nl.store(out, value=nl.add(nl.copy(r), r2))
        return out, part_out

    a = _randn((2, 2 * L), np.float32, 50)
    ids = np.arange(L, dtype=np.int32) * 3
    out, part = colsum(a, ids)
    np.testing.assert_allclose(out[0], np.full(4, a[1, L:].sum() + ids.sum()), rtol=1e-5)
    np.testing.assert_array_equal(part[:40, 0], a[0, :40])


# --------------------------------------------------------------------------------------------------
# the nsim fix: PSUM allocation of a peeled loop recorded two iterations per pass
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("S", [2048, 3072])
def test_peeled_chunk_loop_fits_psum_like_unrolled(la, S):
    """``accumulate=(c > 0)`` peels the chunk loop (first and last chunk with int indices) and, as its body
    allocates tiles, records the middle chunks four per pass (tracer._group; with two rotating buffers, two per
    pass from 8 chunks on) over the tiles of the peeled chunks, allocated before the loop. Those tiles' accesses in the loop were given whole-loop lifetimes: 4 PSUM tiles x 2 + the state =
    9 banks, NSIM-E206, from 8 chunks on (4 chunks are unrolled). The allocator's value-level fallback now splits
    them as in the unrolled trace (5 banks at a time): the loop stays a loop, numbers and time match the unrolled
    trace's."""
    q, k, v = _qkv(1, S, 64, BF16, seed=S)
    kern = la.chunked_linear_attention
    out = kern(q, k, v, state="psum")
    kept = kern.last_profile.total_time_ns
    assert any("loop" in s for s in kern.last_json["body"])  # the chunk loop kept (peeled, paired)
    _check(out, ref_linear_attention(q, k, v), BF16)
    unrolled = kern.options(loops="unroll")
    out_u = unrolled(q, k, v, state="psum")
    assert not any("loop" in s for s in unrolled.last_json["body"])
    np.testing.assert_array_equal(_f64(out), _f64(out_u))
    assert abs(kept - unrolled.last_profile.total_time_ns) <= 0.05 * kept, (kept, unrolled.last_profile.total_time_ns)
