"""Llama decoder-layer kernels written in the style of aws-neuron/neuronx-distributed-inference and the NKI Llama
repository (tests/python/kernels/nxdi_style_kernels.py, Beta-1 dialect, unmodified, through ``nsim.compat``):
rotary position embedding (one tensor, and q/k with GQA), fused residual add + RMSNorm (``nl`` and ISA forms),
the SwiGLU gate/up projection (nki-llama's blocked ``nki_matmul_fully_optimized_`` and a tiled ``nl.matmul``
form over a fused gate_up weight) and token-generation attention over a KV cache with online softmax, SPMD over
heads (grids 1, 2, 4 and ``nl.nc(2)``; MHA, GQA, MQA). Outputs against numpy written here (float64; bf16 and
fp32, ragged last tiles), and the instruction, DMA and traffic counts their structure implies.

Also the two nsim fixes these kernels needed: a masked (and, on a ragged last tile, out-of-bounds) transposed
``nl.arange`` window in ``nl.load`` / ``nl.store`` (the decode kernel's ``k_cache[b, h, j * 128 + i_f, i_p]``),
and a 2-D ``dma_transpose`` whose HBM side has integer indices before a contiguous 2-D part (``k_cache[b, h]``:
its rows were merged into one free dim and the transpose rejected)."""

import numpy as np
import pytest

from conftest import executed_ops, require_core, sample_fixture  # noqa: E402
from conftest import op_counts as _ops  # noqa: E402

_core, ml_dtypes = require_core()
from numeric_helpers import close, rounded  # noqa: E402
from numeric_helpers import randn as _randn, f64 as _f64  # noqa: E402

BF16 = ml_dtypes.bfloat16

nx = sample_fixture("nxdi_style_kernels.py")


# --------------------------------------------------------------------------------------------------
# Rotary position embedding
# --------------------------------------------------------------------------------------------------

def _rope_cache(seq, d, seed, lead=()):
    """HF-style cos/sin caches: cat(freqs, freqs) of angles position * inv_freq (float32)."""
    inv_freq = 1.0 / (10000.0 ** (np.arange(0, d, 2) / d))
    pos = np.arange(seq, dtype=np.float64)
    if lead:  # position ids per batch row (a decode batch at different offsets)
        pos = pos[None, :] + np.random.default_rng(seed).integers(0, 1000, lead)[:, None]
    ang = pos[..., None] * inv_freq
    emb = np.concatenate([ang, ang], -1)
    return np.cos(emb).astype(np.float32), np.sin(emb).astype(np.float32)


def ref_rope(x, cos, sin):
    """float64: x * cos + rotate_half(x) * sin, rotate_half(x) = cat(-x2, x1)."""
    x = _f64(x)
    h = x.shape[-1] // 2
    rot = np.concatenate([-x[..., h:], x[..., :h]], -1)
    return x * _f64(cos) + rot * _f64(sin)


def ref_rope_rounded(x, cos, sin, dtype):
    """The single-tensor kernel's arithmetic in ``dtype``: each product, then the difference / sum, rounded."""
    x, cos, sin = _f64(x), _f64(cos), _f64(sin)
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    r = lambda v: rounded(v, dtype)  # noqa: E731
    first = r(r(x1 * cos[..., :h]) - r(x2 * sin[..., :h]))
    second = r(r(x2 * cos[..., h:]) + r(x1 * sin[..., h:]))
    return np.concatenate([first, second], -1)


@pytest.mark.parametrize("shape,dtype", [
    ((200, 64), np.float32),         # [seq, d]: a full tile and a masked one of 72 rows
    ((2, 3, 130, 32), BF16),         # [batch, heads, seq, d]: 6 heads, a last tile of 2 rows
    ((1, 2, 128, 128), np.float32),  # exactly one tile
    ((1, 1, 37, 64), BF16),          # one partial tile
])
def test_rope_matches_numpy(nx, shape, dtype):
    mod = nx[0]
    seq, d = shape[-2:]
    x = _randn(shape, dtype, seed=seq + d)
    cos, sin = _rope_cache(seq, d, seed=1)
    cos, sin = cos.astype(dtype), sin.astype(dtype)
    out = mod.nki_rope_kernel(x, cos, sin)
    assert out.shape == shape and out.dtype == np.dtype(dtype)
    if dtype == BF16:
        close(out, ref_rope_rounded(x, cos, sin, BF16), BF16)
        close(out, ref_rope(x, cos, sin), BF16)
    else:
        close(out, ref_rope(x, cos, sin))


def test_rope_is_the_half_split_rotation(nx):
    """At angle pi/2 (cos 0, sin 1) the result is rotate_half(x) = cat(-x2, x1) exactly: the halves are not
    swapped the other way round (cat(x2, -x1)) nor interleaved."""
    mod = nx[0]
    x = _randn((130, 16), np.float32, seed=4)
    out = mod.nki_rope_kernel(x, np.zeros((130, 16), np.float32), np.ones((130, 16), np.float32))
    np.testing.assert_array_equal(out, np.concatenate([-x[:, 8:], x[:, :8]], -1))


@pytest.mark.parametrize("q_shape,n_kv,dtype", [
    ((1, 4, 150, 64), 2, np.float32),   # GQA, a ragged second tile
    ((2, 8, 128, 128), 1, BF16),        # MQA, batch 2
    ((1, 2, 300, 32), 2, BF16),         # MHA, three tiles
])
def test_apply_rotary_pos_emb_matches_numpy(nx, q_shape, n_kv, dtype):
    """q and k in one launch (k has fewer heads), cos/sin gathered per batch row, computed in fp32 and stored in
    the input dtype."""
    mod = nx[0]
    b, _, seq, d = q_shape
    q = _randn(q_shape, dtype, seed=seq)
    k = _randn((b, n_kv, seq, d), dtype, seed=seq + 1)
    cos, sin = _rope_cache(seq, d, seed=seq, lead=(b,))
    q_out, k_out = mod.nki_apply_rotary_pos_emb(q, k, cos, sin)
    assert q_out.shape == q.shape and k_out.shape == k.shape and q_out.dtype == np.dtype(dtype)
    close(q_out, ref_rope(q, cos[:, None], sin[:, None]), dtype)
    close(k_out, ref_rope(k, cos[:, None], sin[:, None]), dtype)


def test_rope_instruction_counts(nx):
    """[2, 3, 130, 32]: 2 seq tiles x 6 heads. Per tile 2 DMAs (cos, sin), per (tile, head) a load and a store;
    per (tile, head) 4 multiplies, a subtract and an add, on VectorE/GpSimd (no TensorE, no compute on ScalarE). The ragged
    tile's loads and stores move 2 rows."""
    mod = nx[0]
    x = _randn((2, 3, 130, 32), np.float32, seed=2)
    cos, sin = _rope_cache(130, 32, seed=0)
    out = mod.nki_rope_kernel(x, cos, sin)
    close(out, ref_rope(x, cos, sin))
    k = mod.nki_rope_kernel
    ops = _ops(k)
    assert ops == {"dma_copy": 2 * (2 + 2 * 6), "tensor_tensor": 2 * 6 * 6}, ops
    prof = k.last_profile
    assert prof.stat("engine.matmul_instruction_count") == 0
    assert prof.stat("engine.tensor.instruction_count") == 0
    # no compute on ScalarE: what runs there is a DMA trigger (gen3's hardware DGE), if any
    scalar_dmas = prof.stats["engine"]["scalar"].get("opcode", {}).get("dma_copy", {}).get("count", {}).get("value", 0)
    assert prof.stat("engine.scalar.instruction_count") == scalar_dmas
    assert prof.stat("engine.vector.instruction_count") + prof.stat("engine.gpsimd.instruction_count") == 72
    dmas = [o for o in executed_ops(k.last_json["body"]) if o["op"] == "dma_copy"]
    hbm = lambda o, side, names: isinstance(o[side], dict) and o[side]["tensor"] in names  # noqa: E731
    rows = [o["src"]["index"][0]["size"] for o in dmas if hbm(o, "src", ("cos_tensor", "sin_tensor"))]
    assert rows == [128, 128, 2, 2], rows
    stores = [o["dst"]["index"] for o in dmas if hbm(o, "dst", ("out_tensor",))]
    assert [ix[-2]["size"] for ix in stores] == [128] * 6 + [2] * 6, stores
    # every element read once (x, cos, sin) and written once
    assert prof.stat("memory.hbm_read_bytes") == x.nbytes + cos.nbytes + sin.nbytes
    assert prof.stat("memory.hbm_write_bytes") == x.nbytes


# --------------------------------------------------------------------------------------------------
# Fused residual add + RMSNorm
# --------------------------------------------------------------------------------------------------

def ref_add_rmsnorm(h, r, g, eps, dtype):
    """(out, residual_out): the residual sum in the activation dtype (stored, and normalised as stored), the
    norm in float64."""
    s = rounded(_f64(h) + _f64(r), dtype)
    return s / np.sqrt((s * s).mean(-1, keepdims=True) + eps) * _f64(g), s


@pytest.mark.parametrize("shape,dtype", [
    ((2, 200, 256), BF16),       # two batches of a full and a 72-row tile
    ((1, 128, 512), np.float32),
    ((3, 100, 128), BF16),       # one partial tile per batch
])
def test_fused_add_rmsnorm_matches_numpy(nx, shape, dtype):
    mod = nx[0]
    h = _randn(shape, dtype, seed=shape[1])
    r = _randn(shape, dtype, seed=shape[1] + 1, scale=2.0)
    g = _randn(shape[-1:], dtype, seed=3, scale=0.5)
    out, res = mod.nki_fused_add_rmsnorm_kernel(h, r, g, 1e-6)
    want, want_res = ref_add_rmsnorm(h, r, g, 1e-6, dtype)
    assert out.shape == shape and res.shape == shape and out.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(_f64(res), want_res)  # the sum rounded once to the activation dtype
    close(out, want, dtype)


@pytest.mark.parametrize("shape,dtype", [
    ((200, 256), BF16),
    ((128, 1024), np.float32),
    ((300, 384), BF16),          # three tiles, the last of 44 rows
])
def test_fused_add_rmsnorm_isa_matches_numpy(nx, shape, dtype):
    mod = nx[0]
    h = _randn(shape, dtype, seed=shape[0])
    r = _randn(shape, dtype, seed=shape[0] + 1)
    g = _randn(shape[-1:], dtype, seed=5)
    out, res = mod.nki_fused_add_rmsnorm_isa_kernel(h, r, g, 1e-5)
    want, want_res = ref_add_rmsnorm(h, r, g, 1e-5, dtype)
    np.testing.assert_array_equal(_f64(res), want_res)
    close(out, want, dtype)


def test_fused_add_rmsnorm_eps_and_scale_matter(nx):
    """Rows of values ~0.1 (mean square ~1e-2): with eps = 1 the result is x / sqrt(mean + 1), with eps = 1e-6
    of unit rms: the kernels apply eps inside the root and 1/H as the mean's scale."""
    mod = nx[0]
    h = _randn((128, 256), np.float32, seed=8, scale=0.1)
    r = np.zeros_like(h)
    g = np.ones(256, np.float32)
    for kernel in (mod.nki_fused_add_rmsnorm_isa_kernel,
                   lambda *a: mod.nki_fused_add_rmsnorm_kernel(*[x[None] if x.ndim == 2 else x for x in a[:3]], a[3])):
        big, _ = kernel(h, r, g, 1.0)
        small, _ = kernel(h, r, g, 1e-6)
        close(np.reshape(big, h.shape), h / np.sqrt((_f64(h) ** 2).mean(-1, keepdims=True) + 1.0))
        rms = np.sqrt((_f64(np.reshape(small, h.shape)) ** 2).mean(-1))
        np.testing.assert_allclose(rms, 1.0, rtol=1e-3)


def test_fused_add_rmsnorm_traffic_and_engines(nx):
    """[300, 256] bf16, 3 row tiles: the ISA kernel reads hidden and residual once and the weight once (one
    [1, H] DMA), writes the two outputs once; per tile one activation_reduce (the sum of squares) and one
    activation (rsqrt) on ScalarE, and 4 DMAs. The nl kernel squares on ScalarE and takes the mean on VectorE
    (one tensor_reduce per tile)."""
    mod = nx[0]
    h = _randn((300, 256), BF16, seed=1)
    r = _randn((300, 256), BF16, seed=2)
    g = _randn((256,), BF16, seed=3)
    mod.nki_fused_add_rmsnorm_isa_kernel(h, r, g)
    k = mod.nki_fused_add_rmsnorm_isa_kernel
    ops, prof = _ops(k), k.last_profile
    assert ops["activation_reduce"] == 3 and ops["activation"] == 3, ops
    assert ops["dma_copy"] == 1 + 4 * 3, ops
    assert prof.stat("memory.hbm_read_bytes") == h.nbytes + r.nbytes + g.nbytes
    assert prof.stat("memory.hbm_write_bytes") == 2 * h.nbytes
    assert prof.stat("engine.scalar.instruction_count") >= 6

    mod.nki_fused_add_rmsnorm_kernel(h[None], r[None], g)
    k = mod.nki_fused_add_rmsnorm_kernel
    ops = _ops(k)
    assert ops["tensor_reduce"] == 3 and ops["activation"] == 2 * 3, ops  # mean; square and rsqrt
    assert ops["dma_copy"] == 1 + 4 * 3, ops
    assert k.last_profile.stat("memory.hbm_read_bytes") == h.nbytes + r.nbytes + g.nbytes


# --------------------------------------------------------------------------------------------------
# SwiGLU gate/up projection
# --------------------------------------------------------------------------------------------------

def ref_swiglu(xT, wg, wu):
    x = _f64(xT).T
    g, u = x @ _f64(wg), x @ _f64(wu)
    return g / (1.0 + np.exp(-g)) * u


@pytest.mark.parametrize("kmn,blocks,dtype", [
    ((256, 256, 1024), (2, 2, 2), BF16),    # one block of 2 x 2 x 2 tiles
    ((256, 256, 1024), (1, 1, 1), BF16),    # 2 x 2 x 2 blocks: two K blocks accumulated in SBUF
    ((128, 128, 512), (1, 1, 1), np.float32),
    ((512, 128, 512), (1, 1, 2), np.float32),
])
def test_swiglu_fully_optimized_matches_numpy(nx, kmn, blocks, dtype):
    mod = nx[0]
    K, M, N = kmn
    xT = _randn((K, M), dtype, seed=K + M)
    wg = _randn((K, N), dtype, seed=1, scale=K ** -0.5)
    wu = _randn((K, N), dtype, seed=2, scale=K ** -0.5)
    out = mod.nki_swiglu_fully_optimized_(xT, wg, wu, *blocks)
    assert out.shape == (M, N) and out.dtype == np.dtype(dtype)
    close(out, ref_swiglu(xT, wg, wu), dtype)


@pytest.mark.parametrize("kmi,dtype", [((256, 128, 512), BF16), ((384, 256, 1024), np.float32)])
def test_gate_up_swiglu_tiled_matches_numpy(nx, kmi, dtype):
    mod = nx[0]
    K, M, I = kmi
    xT = _randn((K, M), dtype, seed=K)
    w = _randn((K, 2 * I), dtype, seed=I, scale=K ** -0.5)
    out = mod.nki_gate_up_swiglu_tiled_(xT, w)
    assert out.shape == (M, I)
    close(out, ref_swiglu(xT, w[:, :I], w[:, I:]), dtype)


@pytest.mark.parametrize("blocks", [(2, 2, 2), (1, 1, 1)])
def test_swiglu_matmul_and_dma_counts(nx, blocks):
    """K = M = 256, N = 1024 bf16: 2 x (M/128) x (N/512) x (K/128) = 16 matmuls on TensorE however it is blocked,
    one silu (ScalarE) per 128 x 512 result tile. The blocking decides the DMAs and the traffic: each K block
    of both weights is loaded once per N block, xT once per (N block, K block, M block), and the result stored
    in [128, BLOCK_N] rows; the weights are read once, xT once per N block."""
    mod = nx[0]
    K, M, N = 256, 256, 1024
    bm, bn, bk = blocks
    xT = _randn((K, M), BF16, seed=1)
    wg = _randn((K, N), BF16, seed=2, scale=0.06)
    wu = _randn((K, N), BF16, seed=3, scale=0.06)
    out = mod.nki_swiglu_fully_optimized_(xT, wg, wu, bm, bn, bk)
    close(out, ref_swiglu(xT, wg, wu), BF16)
    k = mod.nki_swiglu_fully_optimized_
    nbm, nbn, nbk = M // (128 * bm), N // (512 * bn), K // (128 * bk)
    ops, prof = _ops(k), k.last_profile
    assert ops["nc_matmul"] == prof.stat("engine.matmul_instruction_count") == 2 * 2 * 2 * 2
    assert ops["activation"] == (M // 128) * (N // 512), ops
    assert ops["dma_copy"] == nbn * nbk * (2 * bk + nbm * bk) + nbn * (M // 128), ops
    assert prof.stat("memory.hbm_read_bytes") == wg.nbytes + wu.nbytes + nbn * xT.nbytes
    assert prof.stat("memory.hbm_write_bytes") == out.nbytes

    x2 = _randn((256, 128), BF16, seed=4)
    w2 = _randn((256, 1024), BF16, seed=5, scale=0.06)
    mod.nki_gate_up_swiglu_tiled_(x2, w2)
    t = mod.nki_gate_up_swiglu_tiled_
    assert t.last_profile.stat("engine.matmul_instruction_count") == 2 * 1 * 1 * 2
    assert _ops(t)["activation"] == 1


# --------------------------------------------------------------------------------------------------
# Token-generation attention
# --------------------------------------------------------------------------------------------------

def ref_decode(q, kc, vc, length=None, q_dtype=None):
    """float64 softmax(q k^T / sqrt(d)) v per head over the first ``length`` cache positions; kv head of query head
    h: h // (H / KV). ``q_dtype``: q * scale rounded to it first (the kernels pre-scale q in its dtype)."""
    B, H, D = q.shape
    KV, S = kc.shape[1], kc.shape[2]
    length = S if length is None else length
    g = H // KV
    qs = _f64(q) / np.sqrt(D)
    if q_dtype is not None:
        qs = rounded(qs, q_dtype)
    k = np.repeat(_f64(kc), g, 1)[:, :, :length]
    v = np.repeat(_f64(vc), g, 1)[:, :, :length]
    s = np.einsum("bhd,bhsd->bhs", qs, k)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("bhs,bhsd->bhd", p, v)


DECODE_CASES = [
    # B, H, KV, S, D, grid, dtype
    (1, 2, 2, 300, 64, 2, np.float32),     # MHA, grid over the heads, a last block of 44 keys
    (2, 4, 2, 200, 32, 1, BF16),           # GQA, one program takes all heads
    (2, 4, 1, 128, 64, 4, np.float32),     # MQA, one exact block
    (1, 4, 2, 257, 64, "nc2", BF16),       # nl.nc(2): two cores, a last block of one key
]


@pytest.mark.parametrize("B,H,KV,S,D,grid,dtype", DECODE_CASES)
def test_flash_decode_matches_numpy(nx, B, H, KV, S, D, grid, dtype):
    mod, _, nl, _ = nx
    q = _randn((B, H, D), dtype, seed=S)
    kc = _randn((B, KV, S, D), dtype, seed=S + 1)
    vc = _randn((B, KV, S, D), dtype, seed=S + 2)
    g = nl.nc(2) if grid == "nc2" else grid
    out = mod.nki_flash_decode_kernel[g](q, kc, vc)
    assert out.shape == (B, H, D) and out.dtype == np.dtype(dtype)
    close(out, ref_decode(q, kc, vc, q_dtype=dtype if dtype == BF16 else None), dtype)


def test_flash_decode_grids_agree_and_split_the_work(nx):
    """B=2, H=4 (GQA 2:1), S=300 (3 blocks): grids 1, 2, 4 and nl.nc(2) give the same bits; 2 matmuls (QK^T and
    PV) per (batch, head, block) in all; under nl.nc(2) each core takes half the heads and the launch takes
    less time than one core doing all (grid 1)."""
    mod, _, nl, _ = nx
    q = _randn((2, 4, 64), BF16, seed=1)
    kc = _randn((2, 2, 300, 64), BF16, seed=2)
    vc = _randn((2, 2, 300, 64), BF16, seed=3)
    k = mod.nki_flash_decode_kernel
    outs, times = {}, {}
    for g in (1, 2, 4, "nc2"):
        outs[g] = k[nl.nc(2) if g == "nc2" else g](q, kc, vc)
        times[g] = k.last_profile.total_time_ns
        assert k.last_profile.stat("engine.matmul_instruction_count") == 2 * 4 * 3 * 2
    for g in (2, 4, "nc2"):
        np.testing.assert_array_equal(outs[g].view(np.uint16), outs[1].view(np.uint16))
    close(outs[1], ref_decode(q, kc, vc, q_dtype=BF16), BF16)
    prof = k.last_profile  # nl.nc(2)
    assert prof.stat("lnc.cores") == 2
    assert prof.stat("core0.engine.matmul_instruction_count") == prof.stat("core1.engine.matmul_instruction_count") == 24
    assert times["nc2"] < 0.8 * times[1], times
    # K blocks come in transposed by DMA (3 per (batch, head)), V blocks and q by plain DMAs
    k[1](q, kc, vc)
    ops = _ops(k)
    assert ops["dma_transpose"] == 2 * 4 * 3 and ops["nc_transpose"] == 2 * 4 * 3, ops
    assert ops["dma_copy"] == 2 * 4 * (1 + 3 + 1), ops


GQA_CASES = [
    # B, H, KV, max_seq, cache_len, D, grid, dtype
    (1, 4, 2, 256, 200, 64, 2, np.float32),
    (2, 8, 2, 384, 300, 32, 1, np.float32),
    (1, 2, 2, 128, 128, 64, "nc2", BF16),
    (2, 4, 4, 256, 129, 64, 4, BF16),    # MHA: groups of one head
    (1, 8, 1, 256, 1, 64, 1, BF16),      # MQA, a single valid position
]


@pytest.mark.parametrize("B,H,KV,S,L,D,grid,dtype", GQA_CASES)
def test_gqa_token_gen_matches_numpy(nx, B, H, KV, S, L, D, grid, dtype):
    """The cache past cache_len holds large garbage: a position that leaked into the softmax would dominate."""
    mod, _, nl, _ = nx
    q = _randn((B, H, D), dtype, seed=L)
    kc = _randn((B, KV, S, D), dtype, seed=L + 1)
    vc = _randn((B, KV, S, D), dtype, seed=L + 2)
    kc[:, :, L:] = (kc[:, :, L:].astype(np.float32) * 50).astype(dtype)
    vc[:, :, L:] = (vc[:, :, L:].astype(np.float32) * 1000).astype(dtype)
    g = nl.nc(2) if grid == "nc2" else grid
    out = mod.nki_gqa_token_gen_attention[g](q, kc, vc, L)
    assert out.shape == (B, H, D)
    close(out, ref_decode(q, kc, vc, L, q_dtype=dtype if dtype == BF16 else None), dtype)


@pytest.mark.parametrize("H", [2, 8])
def test_gqa_token_gen_shares_kv_reads(nx, H):
    """One program per kv head with its query heads on the partitions: the matmuls (2 per block) and the HBM
    traffic (q once, the valid blocks of K and V once per kv head, padding blocks never) do not grow with the
    number of query heads per kv head."""
    mod = nx[0]
    B, KV, S, L, D = 2, 2, 512, 300, 64
    q = _randn((B, H, D), BF16, seed=H)
    kc = _randn((B, KV, S, D), BF16, seed=1)
    vc = _randn((B, KV, S, D), BF16, seed=2)
    out = mod.nki_gqa_token_gen_attention[KV](q, kc, vc, L)
    close(out, ref_decode(q, kc, vc, L, q_dtype=BF16), BF16)
    prof = mod.nki_gqa_token_gen_attention.last_profile
    blocks = (L + 127) // 128
    assert prof.stat("engine.matmul_instruction_count") == 2 * B * KV * blocks
    assert prof.stat("memory.hbm_read_bytes") == q.nbytes + 2 * B * KV * blocks * 128 * D * 2
    assert prof.stat("memory.hbm_write_bytes") == out.nbytes


# --------------------------------------------------------------------------------------------------
# The nsim fixes these kernels needed
# --------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def kits(nx):
    """(Beta-1 nki, nl; new-dialect nki, nl, nisa) while compat is installed."""
    import nki
    import nki.isa as nnisa
    import nki.language as nnl
    return nx[1], nx[2], nki, nnl, nnisa


def test_masked_transposed_arange_load_and_store(kits):
    """``nl.load(x[s * 128 + i_f, i_p], mask=(s * 128 + i_f < S))``: a transposed window (the partition index on
    the later dim) under a mask, its last window reaching past the end of x (out of bounds but masked, spec §3.8).
    Was NotSupportedError (E446) for the mask and for the out-of-bounds window. The load writes only the masked
    columns of the zero-filled tile (one DMA transpose of 72 rows, no copy); the masked store writes only rows
    < S; unmasked, the out-of-bounds window is an error."""
    nki, nl = kits[:2]

    @nki.jit
    def k(x):
        S, D = x.shape
        n = (S + 127) // 128
        out = nl.ndarray((S, D), dtype=x.dtype, buffer=nl.shared_hbm)
        tiles = nl.ndarray((D, n * 128), dtype=x.dtype, buffer=nl.shared_hbm)
        i_dp = nl.arange(D)[:, None]
        i_sf = nl.arange(128)[None, :]
        for s in nl.affine_range(n):
            t = nl.zeros((D, 128), dtype=x.dtype)
            t[i_dp, i_sf] = nl.load(x[s * 128 + i_sf, i_dp], mask=(s * 128 + i_sf < S))
            nl.store(tiles[i_dp, s * 128 + i_sf], value=t)
            u = nl.multiply(t, 3.0, mask=(s * 128 + i_sf < S))
            nl.store(out[s * 128 + i_sf, i_dp], value=u, mask=(s * 128 + i_sf < S))
        return out, tiles

    x = _randn((200, 16), np.float32, seed=6)
    out, tiles = k(x)
    np.testing.assert_array_equal(out, 3 * x)
    want = np.zeros((16, 256), np.float32)
    want[:, :200] = x.T
    np.testing.assert_array_equal(tiles, want)
    tr = [o for o in executed_ops(k.last_json["body"]) if o["op"] == "dma_transpose"]
    assert len(tr) == 4 and "tensor_copy" not in _ops(k), _ops(k)
    assert [o["src"]["index"][0]["size"] for o in tr if isinstance(o["src"], dict) and o["src"]["tensor"] == "x"] \
        == [128, 72]

    @nki.jit
    def unmasked(x):
        out = nl.ndarray((16, 128), dtype=x.dtype, buffer=nl.shared_hbm)
        i_dp = nl.arange(16)[:, None]
        i_sf = nl.arange(128)[None, :]
        nl.store(out[i_dp, i_sf], value=nl.load(x[128 + i_sf, i_dp]))
        return out

    with pytest.raises(Exception, match="out of bounds"):
        unmasked(x)


def test_dma_transpose_of_hbm_rows_behind_integer_indices(kits):
    """A 2-D dma_transpose whose HBM side is indexed by integers before a contiguous 2-D part (``kc[b, h]``,
    ``q[b, heads, :]``): the lowering merged its rows and columns into one free dim of a single row, so the
    transpose was rejected (E310 "dst must be the transpose of src [1, 8192]"). Loads (new-dialect
    ``nisa.dma_transpose``, Beta-1 ``nl.load_transpose2d`` and transposed ``nl.arange`` windows) and a store
    of a transposed window into a 4-D tensor."""
    nki, nl, nnki, nnl, nnisa = kits

    @nnki.jit
    def new(kc):
        out = nnl.ndarray((64, 128), dtype=kc.dtype, buffer=nnl.shared_hbm)
        t = nnl.ndarray((64, 128), dtype=kc.dtype, buffer=nnl.sbuf)
        nnisa.dma_transpose(dst=t, src=kc[1, 1])
        nnisa.dma_copy(dst=out, src=t)
        return out

    kc = _randn((2, 2, 128, 64), BF16, seed=7)
    np.testing.assert_array_equal(new(kc).view(np.uint16), kc[1, 1].T.view(np.uint16))

    @nki.jit
    def old(kc, q):
        B, H, S, D = kc.shape
        kT = nl.ndarray((B, H, D, S), dtype=kc.dtype, buffer=nl.shared_hbm)
        back = nl.ndarray((B, H, S, D), dtype=kc.dtype, buffer=nl.shared_hbm)
        qT = nl.ndarray((B, D, 2), dtype=q.dtype, buffer=nl.shared_hbm)
        i_dp = nl.arange(D)[:, None]
        i_sf = nl.arange(S)[None, :]
        for b in nl.affine_range(B):
          for h in nl.affine_range(H):
            t = nl.load(kc[b, h, i_sf, i_dp])                   # [D, S] window of [S, D] rows
            nl.store(kT[b, h], value=t)
            nl.store(back[b, h, i_sf, i_dp], value=t)           # and transposed back
          qT[b] = nl.load_transpose2d(q[b, nl.ds(2, 2), :])     # heads 2, 3 of q [B, 4, D]
        return kT, back, qT

    q = _randn((2, 4, 64), BF16, seed=8)
    kT, back, qT = old(kc, q)
    np.testing.assert_array_equal(_f64(kT), _f64(kc).transpose(0, 1, 3, 2))
    np.testing.assert_array_equal(_f64(back), _f64(kc))
    np.testing.assert_array_equal(_f64(qT), _f64(q[:, 2:4]).transpose(0, 2, 1))
