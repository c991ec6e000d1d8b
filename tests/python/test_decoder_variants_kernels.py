"""Decoder-layer variants of recent open LLMs written like public NKI ports (NxD-Inference model ports, nki-library,
community Gemma 2/3, Mistral, Qwen3, OLMo 2, GPT-OSS and DIFF Transformer kernels):
tests/python/kernels/decoder_variants_kernels.py (Beta-1 dialect) and decoder_variants_kernels_new.py (new dialect),
both unmodified, through ``nsim.compat``:

- Gemma's input side (Beta 1): embedding rows gathered by an indirect DMA, scaled by sqrt(D), Gemma's RMSNorm with
  (1 + w); Gemma-2 attention with the logit soft-cap ``cap * tanh(s / cap)`` inside a flash (online softmax) loop, and
  the local layers' sliding window (blocks before the window never visited, every visited block masked by
  ``affine_select``); the final-logit soft-cap over vocabulary tiles of 512 with the contraction in PSUM (ragged
  token and vocabulary tiles by masks); the GeGLU MLP with ``nl.matmul`` (Beta 1); a StreamingLLM KV cache
  selection of the sink rows and the recent window at a runtime length (indices computed on chip, indirect DMA);
- GPT-OSS attention with a learned per-head sink logit joined to the softmax denominator (the sink as the online
  softmax's initial state), full causal and banded (new dialect; partial blocks only masked); Mistral-style
  sliding-window flash attention with the mask and row max fused in one ``range_select`` per block (new dialect);
- Qwen3 / OLMo-2 QK-norm: per-head RMSNorm of q and k read straight from the fused QKV projection's PSUM tile, then
  rotate-half RoPE (new dialect);
- the GeGLU MLP tiled over the intermediate dim with the down projection accumulated in PSUM, fused and with the
  activation through HBM (new dialect);
- differential attention (softmax(Q1 K1^T) - lambda softmax(Q2 K2^T)) V with the per-head norm, in both dialects.

Checked: outputs against float64 numpy references (fp32 1e-5, bf16 1e-2; attention-like sums relative to the
largest value, ``numeric_helpers.close_to_max``), ragged last tiles (S, T, V not multiples of 128 / 512), every run
with every warning (sanitizer reports included) an error; that the soft-cap, the window and the sink really act;
the instruction / DMA counts and HBM bytes the tilings imply; and three timing facts (a sliding window is faster
than full causal attention at S = 1024, the fused GeGLU is faster than the one through HBM, the soft-cap adds
ScalarE time).

The nsim fixes this family needed (their regression tests fail without them):
- Beta-1 ``nl.rms_norm(x, w, axis, n, epsilon, mask=...)`` on a ragged row tile was NSIM-E446 "mask= is not
  supported yet here (nl.rms_norm)", although every Beta-1 value function takes ``mask=`` (spec 3.6):
  python/nsim/nki/beta1/language.py ``rms_norm`` now runs the norm on the mask's rectangle, as ``nl.softmax`` does
  (``test_gemma_rmsnorm_nl_rms_norm_under_mask``);
- ``nisa.range_select`` ran on trn1 although it is a gen3+ instruction (spec 2.2 "Vector (gen3+)", 4.3 "feature not
  on this gen"): isa/isa.cpp ``verify`` refuses it before gen3 with NSIM-E313, for both dialects and kernel.json
  (``test_range_select_is_gen3_plus``).

- on trn1 the sanitizer did not report the NaN that a PE transpose of a ragged tile spreads into every stored
  element: engines/check/checker.cpp tainted a transpose element-wise, but gen2 computes it as a matmul whose NaN
  spreads along the output row; a bad element (p, f) of a gen2 TensorE transpose now taints all of output row f
  (``test_gen2_transpose_of_ragged_tile_reports_the_nan_it_stores``).

Everything else ran, matched numpy and drew no sanitizer report on the first run: Beta-1 indirect row gathers masked
on a ragged tile, ``nl.mean`` / ``nl.rsqrt`` under masks, matmul operand masks over a ragged token tile and a ragged
vocabulary tile at once (``nc_matmul(x[kd, i_kp, i_tf], w[i_kp, i_vf], mask=(..i_tf..) & (..i_vf..))``), a causal
loop starting at a window block (``sequential_range(k_lo, qi + 1)``), ``nl.softmax`` after ``affine_select``,
``nl.where`` on an iota and a partition-broadcast runtime length; new-dialect ``affine_select`` with offsets on
``min()``-clamped views, ``range_select`` with per-partition iota bounds, ``activation`` with ``reduce_res`` reading
PSUM, stride-0 partition broadcast DMAs (``.ap([[0, 128], [1, n]])``, read once per partition).
"""
import math

import numpy as np
import pytest

from conftest import executed_ops, require_core, run_clean, sample_fixture  # noqa: E402
from conftest import op_counts as _ops  # noqa: E402

_core, ml_dtypes = require_core()
from numeric_helpers import close, close_to_max, f64, randn  # noqa: E402

BF16 = ml_dtypes.bfloat16
P = 128

dv = sample_fixture("decoder_variants_kernels.py")
dvn = sample_fixture("decoder_variants_kernels_new.py", module_only=True)


# --------------------------------------------------------------------------------------------------
# float64 references
# --------------------------------------------------------------------------------------------------

def ref_attention(q, k, v, causal=True, window=0, softcap=None, sinks=None, scale=None):
    """q, k [H, d, S], v [H, S, d]: softmax(scores) v, scores = q^T k * scale (soft-capped), causal / windowed,
    with an optional per-head sink logit (sinks [1, H]) joined to the denominator."""
    H, d, S = q.shape
    scale = 1 / math.sqrt(d) if scale is None else scale
    s = np.einsum("hdi,hdj->hij", f64(q), f64(k)) * scale
    if softcap is not None:
        s = softcap * np.tanh(s / softcap)
    i, j = np.arange(S)[:, None], np.arange(S)[None, :]
    keep = (j <= i) if causal else np.ones((S, S), bool)
    if window:
        keep &= j > i - window
    s = np.where(keep, s, -np.inf)
    mx = s.max(-1, keepdims=True)
    if sinks is not None:
        sk = f64(sinks).reshape(H, 1, 1)
        mx = np.maximum(mx, sk)
    p = np.exp(s - mx)
    den = p.sum(-1, keepdims=True)
    if sinks is not None:
        den = den + np.exp(sk - mx)
    return (p / den) @ f64(v)


def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def ref_geglu(x, wg, wu, wd):
    x = f64(x)
    return (gelu_tanh(x @ f64(wg)) * (x @ f64(wu))) @ f64(wd)


def ref_diff(q, k, v, lam, w, lambda_init=0.8, eps=1e-5):
    H, _, d, S = q.shape
    p1 = ref_attention(q[:, 0], k[:, 0], np.eye(S)[None].repeat(H, 0))  # the probabilities themselves
    p2 = ref_attention(q[:, 1], k[:, 1], np.eye(S)[None].repeat(H, 0))
    a = (p1 - lam * p2) @ f64(v)
    return a / np.sqrt((a ** 2).mean(-1, keepdims=True) + eps) * f64(w) * (1 - lambda_init)


def _attn_inputs(H, d, S, dtype, seed):
    return (randn((H, d, S), dtype, seed), randn((H, d, S), dtype, seed + 1), randn((H, S, d), dtype, seed + 2))


def _window_blocks(S, W):
    """(query block, key block) pairs a flash loop over 128-blocks visits: causal, and with W > 0 from the block
    holding key q0 - W + 1 (the oldest key of the block's first query) on."""
    NT = (S + P - 1) // P
    out = []
    for qi in range(NT):
        lo = max(0, (qi * P - W + 1) // P) if W > 0 else 0
        out += [(qi, ki) for ki in range(lo, qi + 1)]
    return out


# --------------------------------------------------------------------------------------------------
# Gemma embedding + RMSNorm (Beta 1)
# --------------------------------------------------------------------------------------------------

def _embed_inputs(T, V, D, dtype, seed):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, V, (T, 1)).astype(np.int32)
    return ids, randn((V, D), dtype, seed, 0.05), randn((1, D), np.float32, seed + 1, 0.3)


@pytest.mark.parametrize("T,V,D,dtype", [(200, 1000, 256, np.float32), (300, 512, 128, BF16),
                                         (128, 64, 512, np.float32)])
def test_gemma_embed_rmsnorm_matches_numpy(dv, T, V, D, dtype):
    """embed = table[ids] * sqrt(D); normed = embed / sqrt(mean(embed^2) + eps) * (1 + w); the ragged last token
    tile (T = 200, 300) masked throughout."""
    m = dv[0]
    ids, table, w = _embed_inputs(T, V, D, dtype, seed=T)
    embed, normed = run_clean(m.gemma_embed_rmsnorm, ids, table, w)
    x = f64(table)[ids[:, 0]] * math.sqrt(D)
    y = x / np.sqrt((x ** 2).mean(1, keepdims=True) + 1e-6) * (1 + f64(w))
    assert embed.dtype == np.dtype(dtype) and normed.dtype == np.dtype(dtype)
    close(embed, x, dtype)
    close(normed, y, dtype)


def test_gemma_embed_structure(dv):
    """T = 300 tokens: 3 token tiles; per tile the ids load, one indirect gather of the rows, two stores, plus the
    weight load: 1 + 4 * 3 DMAs. HBM reads: the weight (D * 4), the ids (T * 4), the T gathered rows (T * D * 4);
    writes: embed and normed (2 T D * 4)."""
    m = dv[0]
    T, V, D = 300, 512, 128
    ids, table, w = _embed_inputs(T, V, D, np.float32, seed=1)
    run_clean(m.gemma_embed_rmsnorm, ids, table, w)
    c = _ops(m.gemma_embed_rmsnorm)
    assert c["dma_copy"] == 1 + 4 * 3, c
    gathers = [o for o in executed_ops(m.gemma_embed_rmsnorm.last_json["body"])
               if o["op"] == "dma_copy" and isinstance(o["src"], dict) and o["src"]["tensor"] == "table"]
    assert len(gathers) == 3
    prof = m.gemma_embed_rmsnorm.last_profile
    assert prof.stat("memory.hbm_read_bytes") == D * 4 + T * 4 + T * D * 4
    assert prof.stat("memory.hbm_write_bytes") == 2 * T * D * 4


# --------------------------------------------------------------------------------------------------
# Gemma-2 attention: soft-cap and sliding window (Beta 1)
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("H,d,S,cap,W,dtype", [
    (2, 64, 512, 50.0, 0, np.float32),      # global layer
    (2, 64, 512, 20.0, 200, BF16),          # local layer, window not a block multiple
    (1, 128, 384, None, 128, np.float32),   # window only
    (2, 128, 256, 5.0, 384, np.float32),    # window wider than S: full causal, hard cap
])
def test_gemma2_attention_matches_numpy(dv, H, d, S, cap, W, dtype):
    m = dv[0]
    q, k, v = _attn_inputs(H, d, S, dtype, seed=S + d)
    if cap is not None:
        q = (f64(q) * 3).astype(dtype)  # scores large enough for the cap to bend them
    out = run_clean(m.gemma2_attention, q, k, v, cap, W)
    assert out.dtype == np.dtype(dtype)
    close_to_max(out, ref_attention(q, k, v, window=W, softcap=cap), dtype)


def test_gemma2_softcap_and_window_act(dv):
    """The cap and the window change the output (an implementation ignoring either would pass a loose test)."""
    m = dv[0]
    q, k, v = _attn_inputs(1, 64, 256, np.float32, seed=7)
    q = q * 4
    capped = run_clean(m.gemma2_attention, q, k, v, 5.0, 0)
    close_to_max(capped, ref_attention(q, k, v, softcap=5.0), np.float32)
    assert np.abs(f64(capped) - ref_attention(q, k, v)).max() > 0.05
    windowed = run_clean(m.gemma2_attention, q, k, v, None, 64)
    assert np.abs(f64(windowed) - ref_attention(q, k, v)).max() > 0.05


def test_gemma2_window_structure(dv):
    """H = 2, S = 512, W = 200: per head the loop visits 1 + 2 + 3 + 3 = 9 key blocks (query block 3 starts at
    key 384 - 199 = 185, in block 1), not the 10 of full causal; each visited block makes one QK and one PV matmul,
    one P transpose, two affine_selects (causal, window edge) and with the cap a tanh: the activations are tanh +
    2 exps per block. HBM reads: q once (H d S 4) and one K and one V block per visited block."""
    m = dv[0]
    H, d, S, W = 2, 64, 512, 200
    q, k, v = _attn_inputs(H, d, S, np.float32, seed=2)
    run_clean(m.gemma2_attention, q, k, v, 30.0, W)
    blocks = H * len(_window_blocks(S, W))
    assert blocks == 18
    c = _ops(m.gemma2_attention)
    assert c["nc_matmul"] == 2 * blocks and c["nc_transpose"] == blocks, c
    assert c["affine_select"] == 2 * blocks and c["activation"] == 3 * blocks, c
    prof = m.gemma2_attention.last_profile
    assert prof.stat("memory.hbm_read_bytes") == H * d * S * 4 + blocks * 2 * P * d * 4
    assert prof.stat("memory.hbm_write_bytes") == H * S * d * 4


def test_sliding_window_faster_than_full_causal(dv):
    """S = 1024 (8 blocks), W = 128: the local layer visits 1 + 7 * 2 = 15 blocks against 36 for full causal (both
    without the cap); per-block work is the same (plus one select), so the local layer must be clearly faster (less
    than 2/3 of the global layer's time, the block ratio being 15/36 = 0.42)."""
    m = dv[0]
    q, k, v = _attn_inputs(1, 64, 1024, BF16, seed=4)
    run_clean(m.gemma2_attention, q, k, v, None, 0)
    full = m.gemma2_attention.last_profile.total_time_ns
    assert _ops(m.gemma2_attention)["nc_matmul"] == 2 * 36
    run_clean(m.gemma2_attention, q, k, v, None, 128)
    local = m.gemma2_attention.last_profile.total_time_ns
    assert _ops(m.gemma2_attention)["nc_matmul"] == 2 * 15
    assert local < 2 / 3 * full, (local, full)


def test_softcap_adds_scalar_engine_time(dv):
    """The cap is one more ScalarE pass (tanh) over every score block, and tanh lives in another activation table
    set than exp (configs scalar.act_table_sets), so each block switches tables twice: ScalarE is busier and the
    kernel slower with the cap than without."""
    m = dv[0]
    q, k, v = _attn_inputs(2, 64, 512, BF16, seed=5)
    run_clean(m.gemma2_attention, q, k, v, None, 0)
    plain = m.gemma2_attention.last_profile
    run_clean(m.gemma2_attention, q, k, v, 50.0, 0)
    capped = m.gemma2_attention.last_profile
    assert capped.stat("engine.scalar.busy_time") > plain.stat("engine.scalar.busy_time")
    assert capped.total_time_ns > plain.total_time_ns


# --------------------------------------------------------------------------------------------------
# Final logit soft-cap over vocabulary tiles (Beta 1)
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("D,T,V,dtype", [(256, 200, 1100, np.float32), (128, 64, 512, BF16),
                                         (384, 300, 700, BF16)])
def test_final_logit_softcap_matches_numpy(dv, D, T, V, dtype):
    """Ragged token tiles (200, 300) and vocabulary tiles (1100 = 2 * 512 + 76, 700 = 512 + 188); fp32 logits from
    fp32 PSUM accumulation whatever the input dtype."""
    m = dv[0]
    hT = randn((D, T), dtype, seed=D)
    w = randn((D, V), dtype, seed=V, scale=15 / math.sqrt(D))  # logits ~ N(0, 15^2)
    lg = run_clean(m.final_logit_softcap, hT, w, 30.0)
    want = 30.0 * np.tanh(f64(hT).T @ f64(w) / 30.0)
    assert lg.dtype == np.float32 and np.abs(want).max() > 15  # the cap bends the large logits
    close_to_max(lg, want, np.float32)


def test_final_logit_softcap_structure(dv):
    """D = 256 (2 chunks), T = 200 (2 token tiles), V = 1100 (3 vocabulary tiles): 2 * 3 * 2 = 12 matmuls, one tanh
    per (token, vocabulary) tile = 6; DMAs: 2 hidden chunk loads + 3 * 2 weight tile loads + 3 stores per token
    tile = 22. HBM reads: hT once (D T 4) and the weights once per token tile (2 D V 4); writes T V 4."""
    m = dv[0]
    D, T, V = 256, 200, 1100
    hT = randn((D, T), np.float32, seed=1)
    w = randn((D, V), np.float32, seed=2)
    run_clean(m.final_logit_softcap, hT, w, 30.0)
    c = _ops(m.final_logit_softcap)
    assert c["nc_matmul"] == 12 and c["activation"] == 6 and c["dma_copy"] == 22, c
    prof = m.final_logit_softcap.last_profile
    assert prof.stat("memory.hbm_read_bytes") == D * T * 4 + 2 * D * V * 4
    assert prof.stat("memory.hbm_write_bytes") == T * V * 4


# --------------------------------------------------------------------------------------------------
# KV cache selection: sinks + recent window (Beta 1)
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_sink_window_select(dv, dtype):
    """Row i < n_sink of the compact cache is cache row i, row n_sink + r is row len - W + r: runtime lengths,
    R = 4 + 200 = 204 rows (a ragged second tile of 76); bit-exact (a DMA moves values). One length load, 2 index
    iotas and 2 indirect gathers + 2 stores per sequence."""
    m = dv[0]
    B, S_max, D, ns, W = 3, 700, 64, 4, 200
    cache = randn((B, S_max, D), dtype, seed=9)
    lens = np.array([[700], [300], [204]], np.int32)
    out = run_clean(m.sink_window_select, cache, lens, ns, W)
    want = np.stack([np.concatenate([cache[b, :ns], cache[b, lens[b, 0] - W:lens[b, 0]]]) for b in range(B)])
    np.testing.assert_array_equal(out.view(np.uint8), want.view(np.uint8))
    c = _ops(m.sink_window_select)
    assert c["iota"] == 2 * B and c["dma_copy"] == B * (1 + 2 + 2), c
    isz = np.dtype(dtype).itemsize
    assert m.sink_window_select.last_profile.stat("memory.hbm_write_bytes") == B * (ns + W) * D * isz


# --------------------------------------------------------------------------------------------------
# GeGLU MLP (Beta 1 and new dialect)
# --------------------------------------------------------------------------------------------------

def _mlp_inputs(T, D, I, dtype, seed):
    return (randn((T, D), dtype, seed), randn((D, I), dtype, seed + 1, 1 / math.sqrt(D)),
            randn((D, I), dtype, seed + 2, 1 / math.sqrt(D)), randn((I, D), dtype, seed + 3, 1 / math.sqrt(I)))


@pytest.mark.parametrize("T,D,I,dtype", [(200, 256, 512, np.float32), (300, 128, 384, BF16),
                                         (128, 512, 256, BF16)])
def test_geglu_mlp_matches_numpy(dv, dvn, T, D, I, dtype):
    """The three forms (Beta-1 nl.matmul, new fused, new through HBM) against one reference; ragged T = 200 / 300.
    The activation enters the down projection rounded to the input dtype."""
    x, wg, wu, wd = _mlp_inputs(T, D, I, dtype, seed=T + I)
    want = ref_geglu(x, wg, wu, wd)
    for k in (dv[0].geglu_mlp_b1, dvn.geglu_mlp, dvn.geglu_mlp_unfused):
        out = run_clean(k, x, wg, wu, wd)
        assert out.dtype == np.dtype(dtype)
        close_to_max(out, want, dtype)


def test_geglu_fused_is_faster_and_reads_less(dvn):
    """T = 512 (4 token tiles), D = 256, I = 1024 (8 intermediate tiles), bf16. Both forms: 2 * 8 * 2 gate/up + 8 down
    matmuls per tile = 40 * 4 = 160; one tanh-GELU per intermediate tile. The unfused form writes the activation
    [I, T] to HBM and reads it back (I T 2 bytes each way, as 32 stores and 32 loads of [128, 128]), which the fused
    one keeps in SBUF: it must be faster."""
    T, D, I = 512, 256, 1024
    x, wg, wu, wd = _mlp_inputs(T, D, I, BF16, seed=1)
    profs = {}
    for name in ("geglu_mlp", "geglu_mlp_unfused"):
        k = getattr(dvn, name)
        run_clean(k, x, wg, wu, wd)
        c = _ops(k)
        assert c["nc_matmul"] == 160 and c["activation"] == 4 * 8, (name, c)
        profs[name] = (k.last_profile, c)
    (pf, cf), (pu, cu) = profs["geglu_mlp"], profs["geglu_mlp_unfused"]
    assert cu["dma_copy"] == cf["dma_copy"] + 2 * 4 * 8, (cf, cu)
    h_bytes = I * T * 2
    assert pu.stat("memory.hbm_read_bytes") == pf.stat("memory.hbm_read_bytes") + h_bytes
    assert pu.stat("memory.hbm_write_bytes") == pf.stat("memory.hbm_write_bytes") + h_bytes
    assert pf.stat("memory.hbm_read_bytes") == x.nbytes + wg.nbytes + wu.nbytes + wd.nbytes
    assert pf.total_time_ns < pu.total_time_ns, (pf.total_time_ns, pu.total_time_ns)


# --------------------------------------------------------------------------------------------------
# GPT-OSS attention with learned sinks (new dialect)
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("H,d,S,W,dtype", [
    (2, 64, 300, 0, np.float32),      # ragged last tile of 44
    (2, 64, 300, 100, BF16),
    (1, 128, 256, 128, np.float32),   # GPT-OSS's band of 128
    (2, 64, 520, 200, BF16),          # ragged tile of 8 rows
])
def test_sink_attention_matches_numpy(dvn, H, d, S, W, dtype):
    q, k, v = _attn_inputs(H, d, S, dtype, seed=S + W)
    sinks = randn((1, H), np.float32, seed=S, scale=2.0)
    out = run_clean(dvn.sink_attention, q, k, v, sinks, W)
    assert out.dtype == np.dtype(dtype)
    close_to_max(out, ref_attention(q, k, v, window=W, sinks=sinks), dtype)


def test_sink_joins_the_denominator_only(dvn):
    """A sink of -1e4 contributes exp(-1e4 - m) = 0: plain causal attention; a large sink only shrinks the rows:
    out = attention * Z / (Z + e^sink) per query (Z the row's sum of exponentials), never changes their direction."""
    H, d, S = 2, 64, 256
    q, k, v = _attn_inputs(H, d, S, np.float32, seed=11)
    out = run_clean(dvn.sink_attention, q, k, v, np.full((1, H), -1e4, np.float32), 0)
    close_to_max(out, ref_attention(q, k, v), np.float32)
    big = run_clean(dvn.sink_attention, q, k, v, np.full((1, H), 6.0, np.float32), 0)
    plain = ref_attention(q, k, v)
    ratio = np.linalg.norm(f64(big), axis=-1) / np.linalg.norm(plain, axis=-1)
    assert (ratio < 1).all() and ratio.min() < 0.5
    cos = (f64(big) * plain).sum(-1) / np.linalg.norm(f64(big), axis=-1) / np.linalg.norm(plain, axis=-1)
    np.testing.assert_allclose(cos, 1.0, atol=1e-5)


def test_sink_attention_masks_only_partial_blocks(dvn):
    """S = 520 (5 blocks, the last of 8 keys), W = 200, one head: blocks visited per query block 1, 2, 3, 3, 3 = 12
    (each one QK and one PV matmul, one transpose). Causal selects only on the 5 diagonal blocks; a window select on
    a block holding a key too old for the block's last query (k0 <= q0 + rows - 1 - W): W = 200 > 128, so the edge
    crosses two blocks for the full query blocks 2 and 3: 0 + 1 + 2 + 2 + 1 = 6. HBM reads: the sink row broadcast
    to the 128 partitions by a stride-0 DMA (read once per partition), q, and K and V of the visited blocks (the
    ragged one 8 keys)."""
    H, d, S, W = 1, 64, 520, 200
    q, k, v = _attn_inputs(H, d, S, np.float32, seed=12)
    run_clean(dvn.sink_attention, q, k, v, np.zeros((1, H), np.float32), W)
    blocks = _window_blocks(S, W)
    assert len(blocks) == 12
    c = _ops(dvn.sink_attention)
    assert c["nc_matmul"] == 2 * 12 and c["nc_transpose"] == 12, c
    partial = [(qi, ki) for qi, ki in blocks if ki * P <= qi * P + min(P, S - qi * P) - 1 - W]
    assert len(partial) == 6
    assert c["affine_select"] == 5 + 6, c
    keys = sum(min(P, S - ki * P) for _, ki in blocks)
    prof = dvn.sink_attention.last_profile
    assert prof.stat("memory.hbm_read_bytes") == P * H * 4 + H * d * S * 4 + 2 * keys * d * 4


@pytest.mark.parametrize("H,d,S,W,dtype", [
    (2, 64, 300, 0, np.float32),      # full causal, ragged
    (2, 64, 300, 100, np.float32),
    (1, 128, 520, 200, BF16),
    (2, 64, 1024, 4096, BF16),        # Mistral's W = 4096 > S: full causal
])
def test_swa_range_select_matches_numpy(dvn, H, d, S, W, dtype):
    q, k, v = _attn_inputs(H, d, S, dtype, seed=S + 3)
    out = run_clean(dvn.swa_flash_range_select, q, k, v, W)
    assert out.dtype == np.dtype(dtype)
    close_to_max(out, ref_attention(q, k, v, window=W), dtype)


def test_swa_range_select_structure_and_dialects_agree(dv, dvn):
    """S = 512, W = 200, H = 2: 9 visited blocks per head (as the Beta-1 kernel), one range_select per block (mask and
    row max in one instruction, no separate tensor_reduce), one iota per query tile; the two dialects' kernels (same
    block order, same online softmax) agree to fp32 rounding."""
    H, d, S, W = 2, 64, 512, 200
    q, k, v = _attn_inputs(H, d, S, np.float32, seed=8)
    out = run_clean(dvn.swa_flash_range_select, q, k, v, W)
    blocks = H * len(_window_blocks(S, W))
    c = _ops(dvn.swa_flash_range_select)
    assert c["range_select"] == blocks and c["nc_matmul"] == 2 * blocks and c["iota"] == S // P, c
    assert c["tensor_reduce"] == 0 and c["affine_select"] == 0, c
    close_to_max(out, f64(run_clean(dv[0].gemma2_attention, q, k, v, None, W)), np.float32)


# --------------------------------------------------------------------------------------------------
# QK-norm + RoPE fused with the QKV projection (new dialect)
# --------------------------------------------------------------------------------------------------

def _rope(T, d, base=1e6):
    inv = base ** (-np.arange(d // 2) / (d // 2))
    ang = np.arange(T)[:, None] * inv[None]
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


def ref_qk_norm_rope(x, w, qn, kn, cos, sin, Hq, Hkv, eps=1e-6):
    T = x.shape[0]
    d = w.shape[1] // (Hq + 2 * Hkv)
    y = f64(x) @ f64(w)

    def norm_rope(z, g, H):
        z = z.reshape(T, H, d)
        z = z / np.sqrt((z ** 2).mean(-1, keepdims=True) + eps) * f64(g)
        x1, x2 = z[..., :d // 2], z[..., d // 2:]
        c, s = f64(cos)[:, None], f64(sin)[:, None]
        return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], -1).reshape(T, H * d)
    return (norm_rope(y[:, :Hq * d], qn, Hq), norm_rope(y[:, Hq * d:(Hq + Hkv) * d], kn, Hkv),
            y[:, (Hq + Hkv) * d:])


@pytest.mark.parametrize("T,D,Hq,Hkv,dtype", [(200, 256, 4, 2, np.float32), (128, 512, 8, 2, BF16),
                                              (300, 128, 6, 1, BF16)])
def test_qk_norm_rope_matches_numpy(dvn, T, D, Hq, Hkv, dtype):
    d = 128
    x = randn((T, D), dtype, seed=T)
    w = randn((D, (Hq + 2 * Hkv) * d), dtype, seed=D, scale=1 / math.sqrt(D))
    qn = randn((1, d), np.float32, seed=1, scale=0.5) + 1
    kn = randn((1, d), np.float32, seed=2, scale=0.5) + 1
    cos, sin = _rope(T, d)
    got = run_clean(dvn.qk_norm_rope, x, w, qn, kn, cos, sin, Hq, Hkv)
    for g, want in zip(got, ref_qk_norm_rope(x, w, qn, kn, cos, sin, Hq, Hkv)):
        assert g.dtype == np.dtype(dtype)
        close_to_max(g, want, dtype)


def test_qk_norm_rope_structure(dvn):
    """T = 200 (2 tiles), D = 256 (2 chunks), Hq = 6, Hkv = 2, d = 128: per tile the q heads make PSUM tiles of 4 + 2
    heads, k one of 2, v one of 2: 4 tiles * 2 chunks = 8 matmuls; 2 x transposes; the norm per q/k head one square
    (sum from PSUM) and one rsqrt: 2 * (6 + 2) * 2 = 32 activations; RoPE 6 tensor_tensor per head = 96. HBM: the
    weights and x once, cos / sin once (T * 64 * 4 each), the norm weights once per partition."""
    T, D, Hq, Hkv, d = 200, 256, 6, 2, 128
    x = randn((T, D), np.float32, seed=3)
    w = randn((D, (Hq + 2 * Hkv) * d), np.float32, seed=4, scale=0.05)
    qn, kn = np.ones((1, d), np.float32), np.ones((1, d), np.float32)
    cos, sin = _rope(T, d)
    run_clean(dvn.qk_norm_rope, x, w, qn, kn, cos, sin, Hq, Hkv)
    c = _ops(dvn.qk_norm_rope)
    NT = 2
    assert c["nc_matmul"] == NT * 4 * 2 and c["nc_transpose"] == NT * 2, c
    assert c["activation"] == NT * 2 * (Hq + Hkv) and c["tensor_tensor"] == NT * 6 * (Hq + Hkv), c
    prof = dvn.qk_norm_rope.last_profile
    # the two norm weights, each broadcast to the 128 partitions by a stride-0 DMA: read once per partition
    assert prof.stat("memory.hbm_read_bytes") == w.nbytes + x.nbytes + cos.nbytes + sin.nbytes + 2 * P * d * 4
    assert prof.stat("memory.hbm_write_bytes") == T * (Hq + 2 * Hkv) * d * 4


# --------------------------------------------------------------------------------------------------
# Differential attention (both dialects)
# --------------------------------------------------------------------------------------------------

def _diff_inputs(H, d, S, dtype, seed):
    return (randn((H, 2, d, S), dtype, seed), randn((H, 2, d, S), dtype, seed + 1),
            randn((H, S, 2 * d), dtype, seed + 2), randn((1, 2 * d), np.float32, seed + 3, 0.3) + 1)


@pytest.mark.parametrize("H,d,S,dtype", [(2, 64, 300, np.float32), (1, 128, 512, BF16), (2, 32, 77, np.float32)])
def test_diff_attention_new_matches_numpy(dvn, H, d, S, dtype):
    q, k, v, w = _diff_inputs(H, d, S, dtype, seed=S)
    lam = 0.35
    out = run_clean(dvn.diff_attention, q, k, v, lam, w, 0.8)
    assert out.dtype == np.dtype(dtype)
    close_to_max(out, ref_diff(q, k, v, lam, w), dtype)


@pytest.mark.parametrize("H,d,S,dtype", [(2, 64, 384, np.float32), (1, 64, 256, BF16)])
def test_diff_attention_beta1_matches_numpy(dv, dvn, H, d, S, dtype):
    """The Beta-1 form (nl.softmax after affine_select) agrees with the reference and with the new-dialect form."""
    q, k, v, w = _diff_inputs(H, d, S, dtype, seed=S + 1)
    lam = 0.5
    out = run_clean(dv[0].diff_attention_b1, q, k, v, lam, w, 0.8)
    close_to_max(out, ref_diff(q, k, v, lam, w), dtype)
    close_to_max(out, f64(run_clean(dvn.diff_attention, q, k, v, lam, w, 0.8)), dtype)


def test_diff_attention_lambda_zero_is_normed_attention(dvn):
    """lam = 0: the second map drops out; the result is the per-head RMSNorm of softmax(Q1 K1^T) V."""
    H, d, S = 1, 64, 200
    q, k, v, w = _diff_inputs(H, d, S, np.float32, seed=21)
    out = run_clean(dvn.diff_attention, q, k, v, 0.0, w, 0.8)
    a = ref_attention(q[:, 0], k[:, 0], v)
    close_to_max(out, a / np.sqrt((a ** 2).mean(-1, keepdims=True) + 1e-5) * f64(w) * 0.2, np.float32)


def test_diff_attention_structure(dvn):
    """H = 2, S = 300 (3 query tiles, the last of 44 rows): per (head, query tile) two QK matmuls and two causal
    affine_selects, PV over the causal key tiles (1 + 2 + 3 per head) with a transpose each; two softmax exps and the
    norm's square and rsqrt = 4 activations per tile. HBM reads: K both halves once per head, V once per head, Q
    both halves once (each read once), and the norm weight [1, 2 d] broadcast to the 128 partitions by a stride-0
    DMA, which reads it once per partition (128 * 2 d * 4 bytes)."""
    H, d, S = 2, 64, 300
    q, k, v, w = _diff_inputs(H, d, S, np.float32, seed=5)
    run_clean(dvn.diff_attention, q, k, v, 0.4, w, 0.8)
    c = _ops(dvn.diff_attention)
    tiles = H * 3
    assert c["affine_select"] == 2 * tiles and c["nc_transpose"] == H * 6, c
    assert c["nc_matmul"] == 2 * tiles + H * 6 and c["activation"] == 4 * tiles, c
    prof = dvn.diff_attention.last_profile
    assert prof.stat("memory.hbm_read_bytes") == q.nbytes + k.nbytes + v.nbytes + P * 2 * d * 4


@pytest.mark.parametrize("config", ["trn1", "trn3"])
def test_kernels_on_other_generations(dv, dvn, config):
    """The kernels without a gen3+ instruction give the same results on trn1 (gen2) and trn3 (gen4): the Gemma-2
    flash loop, the sink attention, QK-norm + RoPE, the fused GeGLU (its ragged tile by clamped slices) and the
    differential attention (new dialect). (The Beta-1 GeGLU's ragged tile is the open gen2 issue below.)"""
    q, k, v = _attn_inputs(2, 64, 300 if config == "trn3" else 256, np.float32, seed=31)
    S = q.shape[2]
    if S % P == 0:
        out = run_clean(dv[0].gemma2_attention.options(config=config), q, k, v, 20.0, 100)
        close_to_max(out, ref_attention(q, k, v, window=100, softcap=20.0), np.float32)
    sinks = randn((1, 2), np.float32, seed=32)
    out = run_clean(dvn.sink_attention.options(config=config), q, k, v, sinks, 100)
    close_to_max(out, ref_attention(q, k, v, window=100, sinks=sinks), np.float32)
    T, D, Hq, Hkv, d = 200, 256, 2, 1, 128
    x = randn((T, D), np.float32, seed=33)
    w = randn((D, (Hq + 2 * Hkv) * d), np.float32, seed=34, scale=1 / 16)
    qn, kn = np.ones((1, d), np.float32), np.full((1, d), 0.5, np.float32)
    cos, sin = _rope(T, d)
    got = run_clean(dvn.qk_norm_rope.options(config=config), x, w, qn, kn, cos, sin, Hq, Hkv)
    for g, want in zip(got, ref_qk_norm_rope(x, w, qn, kn, cos, sin, Hq, Hkv)):
        close_to_max(g, want, np.float32)
    x, wg, wu, wd = _mlp_inputs(200, 256, 384, np.float32, seed=35)
    close_to_max(run_clean(dvn.geglu_mlp.options(config=config), x, wg, wu, wd), ref_geglu(x, wg, wu, wd), np.float32)
    q, k, v, w = _diff_inputs(1, 64, 200, np.float32, seed=36)
    out = run_clean(dvn.diff_attention.options(config=config), q, k, v, 0.3, w, 0.8)
    close_to_max(out, ref_diff(q, k, v, 0.3, w), np.float32)


# --------------------------------------------------------------------------------------------------
# nsim fixes and open issues
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("T,D,dtype", [(200, 256, np.float32), (300, 128, BF16)])
def test_gemma_rmsnorm_nl_rms_norm_under_mask(dv, T, D, dtype):
    """The fix (NSIM-E446 "mask= is not supported yet here (nl.rms_norm)" before): Beta-1 ``nl.rms_norm`` takes
    ``mask=`` like every value function (spec 3.6); a ragged row tile is normalized over its valid rows only, the
    masked-off rows are neither computed into the stored part nor reported. Gemma's (1 + w) weight is a [1, D] row
    broadcast over the partitions."""
    m = dv[0]
    x = randn((T, D), dtype, seed=T)
    w = randn((1, D), np.float32, seed=D, scale=0.3)
    out = run_clean(m.gemma_rmsnorm, x, w)
    xf = f64(x)
    assert out.dtype == np.dtype(dtype)
    close(out, xf / np.sqrt((xf ** 2).mean(1, keepdims=True) + 1e-6) * (1 + f64(w)), dtype)
    # one squared sum (tensor_reduce) per row tile, as the unmasked nl.rms_norm
    assert _ops(m.gemma_rmsnorm)["tensor_reduce"] == (T + P - 1) // P


def test_gen2_transpose_of_ragged_tile_reports_the_nan_it_stores(dv):
    """Regression (no report before: the taint was element-wise on every generation). trn1: a ragged tile (72 of 128 rows loaded) transposed on the PE and stored masked to its 72 valid columns.
    On gen3 the transpose is exact and the stored part is the input (no report, docs/debugging.md decision). On gen2
    nsim computes NaN into every stored element (the never-written rows' NaN sentinel spreads along each output
    row); a kernel whose output is silently NaN must get the NSIM-W501 report at the store (the sanitizer's taint
    must follow the gen2 numerics: a bad input element (p, f) taints output row f, as a bad stationary element of
    a matmul taints its output row). geglu_mlp_b1 (tutorial-style ragged token tile) hits this on trn1."""
    import warnings
    _, nki, nl, nisa = dv

    @nki.jit
    def ragged_transpose(x):
        n, F = x.shape
        out = nl.ndarray((F, n), dtype=x.dtype, buffer=nl.shared_hbm)
        i_p = nl.arange(P)[:, None]
        i_f = nl.arange(P)[None, :]
        t = nl.load(x[i_p, i_f], mask=(i_p < n))
        tT = nl.copy(nisa.nc_transpose(t), dtype=x.dtype)
        nl.store(out[i_p, i_f], value=tT, mask=(i_f < n))
        return out

    x = np.arange(72 * P, dtype=np.float32).reshape(72, P)
    np.testing.assert_array_equal(run_clean(ragged_transpose, x), x.T)  # trn2: exact, no report
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = ragged_transpose.options(config="trn1")(x)
    reported = any("NSIM-W501" in str(w.message) for w in caught)
    assert np.isnan(out).any() and reported, "trn1: {} NaN stored, no report".format(int(np.isnan(out).sum()))


def test_range_select_is_gen3_plus(dv, dvn):
    """The fix (trn1 ran it before): ``nisa.range_select`` is a gen3+ Vector instruction (spec 2.2 "range_select —
    Vector (gen3+)"; 4.3 lists it among the features "not on this gen" that must be refused before gen3). On trn1
    both dialects now raise NSIM-E313 (isa::verify, so a kernel.json too); trn2 runs them."""
    _, nki, nl, nisa = dv
    q, k, v = _attn_inputs(1, 64, 128, np.float32, seed=1)
    with pytest.raises(_core.NsimError, match="NSIM-E313.*range_select.*needs gen3"):
        dvn.swa_flash_range_select.options(config="trn1")(q, k, v, 0)

    @nki.jit
    def window_rows(s_in, lo, hi):
        out = nl.ndarray(s_in.shape, dtype=s_in.dtype, buffer=nl.shared_hbm)
        t = nl.load(s_in)
        nl.store(out, value=nisa.range_select(on_true_tile=t, comp_op0=np.greater, comp_op1=np.less_equal,
                                              bound0=nl.load(lo), bound1=nl.load(hi), range_start=0))
        return out

    s_in = randn((P, 64), np.float32, seed=2)
    lo = (np.arange(P, dtype=np.float32) % 64 - 8).reshape(P, 1)
    hi = (np.arange(P, dtype=np.float32) % 64).reshape(P, 1)
    j = np.arange(64)[None, :]
    want = np.where((j > lo) & (j <= hi), s_in, np.finfo(np.float32).min)
    np.testing.assert_array_equal(run_clean(window_rows, s_in, lo, hi), want)
    with pytest.raises(_core.NsimError, match="NSIM-E313"):
        window_rows.options(config="trn1")(s_in, lo, hi)
