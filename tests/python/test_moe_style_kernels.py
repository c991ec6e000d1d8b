"""The Mixture-of-Experts kernels written in the style of aws-neuron/nki-moe (tests/python/kernels/moe_style_kernels.py,
new dialect, ``import nki`` resolved by ``nsim.compat`` while the fixture holds the module): the top-k router
(softmax over the experts, ``nisa.max8`` + ``nisa.nc_find_index8``, renormalised weights) and the token-dispatch
expert MLP (indirect-DMA gather of each expert's tokens with out-of-range padding slots skipped, SwiGLU on the PE,
per-token routing weight, ``nisa.dma_compute`` scatter-add back). Outputs against numpy written here (float32
and bfloat16, ragged token tiles, tied affinities, experts with no tokens), instruction counts their structure
implies, and the timing facts an MoE user relies on (weight streaming dominates: time and bytes follow the
number of experts and the weight dtype)."""
from collections import Counter

import numpy as np
import pytest

from conftest import executed_ops, require_core, sample_fixture  # noqa: E402

_core, ml_dtypes = require_core()
from numeric_helpers import close, rounded  # noqa: E402
from numeric_helpers import randn as _randn  # noqa: E402

BF16 = ml_dtypes.bfloat16


moe = sample_fixture("moe_style_kernels.py", module_only=True)


def ref_router(x, w, k):
    """float64 softmax over the experts of x @ w; the top k by decreasing affinity (ties: lower expert first);
    their affinities renormalised to sum to one."""
    logits = np.asarray(x, np.float64) @ np.asarray(w, np.float64)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    idx = np.argsort(-p, axis=-1, kind="stable")[:, :k]
    top = np.take_along_axis(p, idx, -1)
    return p, idx, top / top.sum(-1, keepdims=True)


def ref_moe(x, idx, wts, gate_w, up_w, down_w, out_dtype=np.float32):
    """Dense reference: out[t] = sum over j of wts[t, j] * swiglu_mlp_{idx[t, j]}(x[t]), accumulated in expert
    order (the kernel's sequential expert loop); for a bf16 output each expert's contribution is added to the
    bf16 output and rounded, as the kernel's read-modify-write of the output rows does."""
    x = np.asarray(x, np.float64)
    T, H = x.shape
    E = gate_w.shape[0]
    out = np.zeros((T, H))
    for e in range(E):
        g = x @ np.asarray(gate_w[e], np.float64)
        u = x @ np.asarray(up_w[e], np.float64)
        h = g / (1.0 + np.exp(-g)) * u
        if out_dtype != np.float32:
            h = rounded(h, out_dtype)  # the activations are kept in the input dtype for the down projection
        y = h @ np.asarray(down_w[e], np.float64)
        w = np.where(idx == e, wts, 0.0).sum(-1)[:, None]
        hit = (idx == e).any(-1)
        out[hit] = out[hit] + (w * y)[hit]
        if out_dtype != np.float32:
            out = rounded(out, out_dtype)
    return out


ROUTER_CASES = [(64, 256, 8, 2, np.float32), (200, 256, 16, 4, np.float32), (300, 512, 64, 8, BF16),
                (130, 128, 8, 1, BF16)]


@pytest.mark.parametrize("T,H,E,k,dtype", ROUTER_CASES)
def test_router_matches_numpy(moe, T, H, E, k, dtype):
    """Token tiles of 128 with a ragged tail (200 = 128 + 72, 300 = 2 x 128 + 44, 130 = 128 + 2); 8 to 64
    experts (max8 reads all of them); top 1 to 8. Affinities at fp32 tolerance (the logits are fp32 PSUM sums of
    bf16 products for bf16 inputs, computed here from the same bf16 values); the ids exact; the weights sum to
    one."""
    x = _randn((T, H), dtype, seed=T)
    w = _randn((H, E), dtype, seed=E, scale=0.1)
    aff, idx, wts = moe.router_topk(x, w, k)
    assert aff.shape == (T, E) and aff.dtype == np.float32
    assert idx.shape == (T, k) and idx.dtype == np.uint32 and wts.shape == (T, k) and wts.dtype == np.float32
    p, want_idx, want_w = ref_router(x, w, k)
    close(aff, p)
    np.testing.assert_array_equal(idx, want_idx)
    close(wts, want_w)
    close(wts.sum(-1), np.ones(T))


def test_router_ties_pair_with_successive_experts(moe):
    """Experts 2 and 5 have identical router columns, larger than the others: every token's two best
    affinities are equal. max8 keeps duplicates, and nc_find_index8 pairs equal values with successive matches in
    ascending order, so the ids are (2, 5) (not (2, 2)), each with weight 1/2; with top 3 the third is the next
    best expert."""
    H, E, T = 128, 8, 96
    w = _randn((H, E), np.float32, seed=1, scale=0.01)
    w[:, 2] = w[:, 5] = np.abs(_randn((H,), np.float32, seed=2)) * 0.2
    x = np.abs(_randn((T, H), np.float32, seed=3))  # positive tokens: columns 2 and 5 win by far
    aff, idx, wts = moe.router_topk(x, w, 3)
    np.testing.assert_array_equal(idx[:, :2], np.tile(np.array([2, 5], np.uint32), (T, 1)))
    np.testing.assert_array_equal(aff[:, 2], aff[:, 5])
    np.testing.assert_array_equal(wts[:, 0], wts[:, 1])
    _, want_idx, want_w = ref_router(x, w, 3)
    np.testing.assert_array_equal(idx, want_idx)
    close(wts, want_w)


def test_router_instruction_counts(moe):
    """T = 200: two token tiles (128 + 72 rows), H = 512: four hidden tiles. Per tile: one load, four PE
    transposes (each copied out of PSUM) and four matmuls into one PSUM accumulation group; one max8 and one
    nc_find_index8; three stores (affinities, ids, weights); plus the one load of the router weight."""
    x = _randn((200, 512), np.float32, seed=4)
    w = _randn((512, 16), np.float32, seed=5, scale=0.05)
    moe.router_topk(x, w, 2)
    ops = Counter(o["op"] for o in executed_ops(moe.router_topk.last_json["body"]))
    assert ops["nc_matmul"] == 2 * 4 and ops["nc_transpose"] == 2 * 4 and ops["tensor_copy"] == 2 * 4
    assert ops["max8"] == 2 and ops["nc_find_index8"] == 2
    assert ops["dma_copy"] == 1 + 2 * (1 + 3)
    assert moe.router_topk.last_profile.stat("engine.matmul_instruction_count") == 2 * 4


MLP_CASES = [  # T, H, E, I, top_k, dtype, capacity (None: the busiest expert's count)
    (64, 256, 8, 256, 2, np.float32, None),
    (200, 256, 8, 384, 2, np.float32, 128),
    (96, 512, 16, 256, 4, BF16, None),
]


def _moe_inputs(moe, T, H, E, I, k, dtype, seed=0):
    x = _randn((T, H), dtype, seed=seed)
    wr = _randn((H, E), dtype, seed=seed + 1, scale=0.1)
    gate = _randn((E, H, I), dtype, seed=seed + 2, scale=0.05)
    up = _randn((E, H, I), dtype, seed=seed + 3, scale=0.05)
    down = _randn((E, I, H), dtype, seed=seed + 4, scale=0.05)
    return x, wr, gate, up, down


@pytest.mark.parametrize("T,H,E,I,k,dtype,cap", MLP_CASES)
def test_router_dispatch_experts_combine(moe, T, H, E, I, k, dtype, cap):
    """The whole MoE layer: route on the kernel, dispatch on the host (token ids per expert padded with the
    out-of-range id T), run the experts and scatter-add back. Against the dense numpy MoE with numpy's own
    routing. Padding slots (every expert has some: capacity 128 > the busiest expert's count in case 2) gather
    nothing and add nothing."""
    x, wr, gate, up, down = _moe_inputs(moe, T, H, E, I, k, dtype, seed=T)
    _, idx, wts = moe.router_topk(x, wr, k)
    _, want_idx, want_w = ref_router(x, wr, k)
    np.testing.assert_array_equal(idx, want_idx)
    ids, tws = moe.dispatch(idx, wts, E, cap)
    assert (ids == T).any()  # padding exercised
    out = moe.moe_expert_mlp(x, ids, tws, gate, up, down)
    assert out.shape == (T, H) and out.dtype == np.dtype(dtype)
    want = ref_moe(x, want_idx, want_w, gate, up, down, dtype)
    close(out, want, dtype)


def test_expert_without_tokens_and_single_token(moe):
    """Expert 0 gets no token (all its slots padding), expert 1 only token 5 with weight 1, the others nothing:
    the output is expert 1's MLP of token 5 in row 5 and exact zeros everywhere else (the zero-filled output is
    never touched by a skipped slot)."""
    T, H, E, I = 40, 128, 4, 128
    x, _, gate, up, down = _moe_inputs(moe, T, H, E, I, 1, np.float32, seed=9)
    ids = np.full((E, 8), T, np.int32)
    tws = np.zeros((E, 8), np.float32)
    ids[1, 3], tws[1, 3] = 5, 1.0
    out = moe.moe_expert_mlp(x, ids, tws, gate, up, down)
    g, u = x[5].astype(np.float64) @ gate[1], x[5].astype(np.float64) @ up[1]
    close(out[5], (g / (1 + np.exp(-g)) * u) @ down[1])
    assert not np.delete(out, 5, axis=0).any()


def test_expert_mlp_instruction_counts(moe):
    """T=200, H=256, E=8, I=384, top 2, capacity C from the dispatch. Per expert: one PE transpose per hidden
    tile of the gathered tokens (2); gate and up projections: per intermediate tile (3) one matmul per hidden
    tile each (2 x 3 x 2 = 12); the down projection: per PSUM bank of H (1) one matmul per intermediate tile (3).
    15 matmuls per expert, 120 in all, whatever the routing."""
    T, H, E, I = 200, 256, 8, 384
    x, wr, gate, up, down = _moe_inputs(moe, T, H, E, I, 2, np.float32, seed=11)
    _, idx, wts = moe.router_topk(x, wr, 2)
    ids, tws = moe.dispatch(idx, wts, E)
    moe.moe_expert_mlp(x, ids, tws, gate, up, down)
    ops = Counter(o["op"] for o in executed_ops(moe.moe_expert_mlp.last_json["body"]))
    assert ops["nc_matmul"] == E * 15
    assert ops["nc_transpose"] == E * 2
    assert ops["activation"] == E * 3  # silu of each gate tile
    assert moe.moe_expert_mlp.last_profile.stat("engine.matmul_instruction_count") == E * 15


def test_expert_mlp_time_follows_weight_bytes(moe):
    """A decode-sized batch (T = 32 tokens, top 2) is weight-streaming: each expert loads 3 x H x I weights and
    runs matmuls whose moving side is only C <= 32 columns wide. So
    - HBM reads are the weights plus, per capacity slot, one row of tokens gathered (at most E x C rows) and one
      row of the output the scatter-add reads back (its read-modify-write), plus the dispatch metadata;
    - doubling the experts (8 -> 16) at the same T roughly doubles the time (1.6x to 2.4x);
    - bf16 weights and tokens halve the weight bytes and take less time than fp32."""
    T, H, I, k = 32, 512, 512, 2
    res = {}
    for E, dtype in ((8, np.float32), (16, np.float32), (8, BF16)):
        x, wr, gate, up, down = _moe_inputs(moe, T, H, E, I, k, dtype, seed=E)
        _, idx, wts = moe.router_topk(x, wr, k)
        ids, tws = moe.dispatch(idx, wts, E)
        moe.moe_expert_mlp(x, ids, tws, gate, up, down)
        prof = moe.moe_expert_mlp.last_profile
        isz = np.dtype(dtype).itemsize
        weights = E * 3 * H * I * isz
        meta = ids.nbytes + tws.nbytes
        rd = prof.stat("memory.hbm_read_bytes")
        assert weights + 2 * (ids < T).sum() * H * isz + meta <= rd <= weights + 2 * ids.size * H * isz + meta, (E, dtype)
        res[(E, np.dtype(dtype).name)] = (prof.total_time_ns, rd)
    t8, t16, tb = res[(8, "float32")][0], res[(16, "float32")][0], res[(8, "bfloat16")][0]
    assert 1.6 * t8 <= t16 <= 2.4 * t8, res
    assert tb < t8, res
