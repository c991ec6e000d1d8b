"""The projection kernels around attention written in aws-neuron/nki-library's style
(tests/python/kernels/nkilib_style_projections.py: fused QKV for context encoding with an optional fused RMSNorm and
a split [B, heads, S, d] output, the decode QKV with the weight streamed as the moving operand, RoPE half-split and
interleaved on the [B, H, S, d] layout, the output projection; new dialect, LNC=2 by ``nl.program_id(0)``) run
unchanged: outputs against float64 numpy, and the structure and timing their tilings imply: matmul counts, the
decode kernel bound by its weight's HBM traffic (read through nsim's config, ``nsim.plot.memory_roof``), the fused
RMSNorm saving the normalised hidden state's HBM round trip, and LNC=2 faster than one core.

Also a frontend bug these kernels exposed: a 3-D ``nisa.dma_transpose`` whose HBM source is indexed by integers
before its rows (``x[b, rows, :].reshape((rows, K / 128, 128))``, one DMA per token tile) took the int-indexed dim
as the rows (one row of rows x K elements) and failed E310 "dst must be the transpose of src [1, ...]"; only the
2-D form split such a row (``Lowering::transposed_hbm_rows``, frontend/lower.cpp). And ``dma_transpose`` into an HBM
dst (K^T stored straight to HBM), which the spec accepts with a warning, ran silently (``nki/isa.py``
``dma_transpose``)."""
import numpy as np
import pytest

from conftest import require_core, sample_fixture  # noqa: E402

_core, ml_dtypes = require_core()
from numeric_helpers import close, rounded  # noqa: E402
from numeric_helpers import f64 as _f64  # noqa: E402

import nsim.plot  # noqa: E402

BF16 = ml_dtypes.bfloat16

proj = sample_fixture("nkilib_style_projections.py", module_only=True)
rms = sample_fixture("nkilib_style_rmsnorm.py", module_only=True)


def _randn(shape, dtype=BF16, seed=0, scale=1.0, shift=0.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale + shift).astype(dtype)


def _bits(a):
    a = np.asarray(a)
    return a.view(np.uint16 if a.dtype.itemsize == 2 else np.uint32)


def _matmuls(prof):
    return prof.stat("engine.matmul_instruction_count")


def _hbm(prof):
    return prof.stat("memory.hbm_read_bytes"), prof.stat("memory.hbm_write_bytes")


def _qkv_inputs(B, S, H, Hq, Hkv, d, dtype=BF16, seed=0):
    I = (Hq + 2 * Hkv) * d
    x = _randn((B, S, H), dtype, seed, scale=3.0, shift=0.5)  # rms ~ 3: a missing normalisation shows
    w = _randn((H, I), dtype, seed + 1, scale=1 / np.sqrt(H))
    g = _randn((H,), dtype, seed + 2, shift=1.0)
    return x, w, g


def qkv_reference(x, w, gamma=None, eps=1e-6):
    """[B, S, I] in float64: x @ w, or rmsnorm(x) @ w with the kernel's one intermediate rounding (x * gamma stored
    in x's dtype before the matmul; 1/rms applied to the fp32 product)."""
    xf = _f64(x)
    if gamma is None:
        return xf @ _f64(w)
    rstd = 1.0 / np.sqrt((xf * xf).mean(-1, keepdims=True) + eps)
    return (rounded(xf * _f64(gamma), x.dtype) @ _f64(w)) * rstd


def split_heads(y, Hq, Hkv, d):
    """[B, S, (Hq + 2 Hkv) d] -> q [B, Hq, S, d], k, v [B, Hkv, S, d]."""
    B, S, _ = y.shape
    t = np.asarray(y).reshape(B, S, Hq + 2 * Hkv, d).transpose(0, 2, 1, 3)
    return t[:, :Hq], t[:, Hq:Hq + Hkv], t[:, Hq + Hkv:]


def _cdiv(a, b):
    return -(-a // b)


def qkv_cte_matmuls(B, S, H, I, lnc=1, shard="tokens"):
    """nc_matmuls of qkv_cte: per token tile (<= 128 tokens of one batch: B * ceil(S / 128) tiles) and per 512-column
    PSUM chunk of the program's columns, one matmul per 128-row K tile (H / 128). Sharding the tokens only deals the
    tiles; sharding the columns gives each program ceil(I / 2 / 512) chunks of every tile (768 columns: 512 + 256,
    so 4 chunks in all where one core runs 2)."""
    tiles, kt = B * _cdiv(S, 128), H // 128
    if shard == "columns":
        return lnc * tiles * _cdiv(I // lnc, 512) * kt
    return tiles * _cdiv(I, 512) * kt


def test_matmul_count_formulas():
    """The formulas of this module written out for a few shapes."""
    assert qkv_cte_matmuls(2, 200, 512, 768) == 4 * 2 * 4 == qkv_cte_matmuls(2, 200, 512, 768, 2)
    assert qkv_cte_matmuls(1, 1024, 1024, 1536, 2, "columns") == 8 * 2 * 2 * 8  # 768 columns: 2 chunks each
    assert qkv_cte_matmuls(1, 1024, 1024, 2048, 2, "columns") == qkv_cte_matmuls(1, 1024, 1024, 2048) == 8 * 4 * 8
    assert tkg_matmuls(2048, 4096) == 8 * 16 and tkg_matmuls(2048, 4096, 2) == 2 * 4 * 16
    assert oproj_matmuls(2, 200, 512, 1024, 2) == 2 * 2 * 4 * (2 * 1)


# --------------------------------------------------------------------------------------------------
# qkv_cte
# --------------------------------------------------------------------------------------------------

# (B, S, H, Hq, Hkv, d), dtype, kernel keywords, lnc
CTE_CASES = [
    ((1, 128, 256, 4, 2, 64), BF16, {}, 1),
    ((2, 200, 512, 4, 2, 64), BF16, {"transpose_on": "dma"}, 2),  # ragged: tiles of 128 + 72 tokens per batch
    ((2, 200, 512, 8, 2, 64), BF16, {"norm": True}, 1),  # I = 768: a 256-column tail chunk
    ((2, 200, 512, 8, 2, 64), BF16, {"norm": True}, 2),
    ((1, 300, 384, 2, 1, 128), np.float32, {"norm": True}, 2),
    ((1, 96, 256, 4, 2, 64), np.float32, {"transpose_on": "dma"}, 1),
]


@pytest.mark.parametrize("dims,dtype,kw,lnc", CTE_CASES)
def test_qkv_cte_matches_numpy_and_matmul_count(proj, dims, dtype, kw, lnc):
    """Fused QKV projection, plain or with the fused RMSNorm, hidden transposed on the PE or by dma_transpose, 1 or 2
    programs (token tiles dealt round-robin): numpy's numbers (fp32 to fp32 tolerance, the fused norm's
    reassociation included) and the tiling's matmul count."""
    B, S, H, Hq, Hkv, d = dims
    x, w, g = _qkv_inputs(*dims, dtype=dtype, seed=S + H)
    kw = dict(kw)
    gamma = g if kw.pop("norm", False) else None
    out = proj.qkv_cte[lnc](x, w, gamma=gamma, **kw)
    assert out.shape == (B, S, w.shape[1]) and out.dtype == dtype
    close(out, qkv_reference(x, w, gamma), dtype)
    if gamma is not None:  # the normalisation and gamma both matter at these inputs
        assert np.abs(_f64(out) - qkv_reference(x, w)).max() > 0.5
        assert np.abs(_f64(out) - qkv_reference(x, w, np.ones_like(g))).max() > 0.1
    assert _matmuls(proj.qkv_cte.last_profile) == qkv_cte_matmuls(B, S, H, w.shape[1], lnc)


@pytest.mark.parametrize("dims,shard", [((2, 200, 512, 8, 2, 64), "tokens"), ((2, 200, 512, 8, 2, 64), "columns"),
                                        ((1, 256, 256, 4, 2, 128), "columns")])
def test_qkv_cte_split_layout(proj, dims, shard):
    """output_layout="NBSd": q [B, Hq, S, d], k and v [B, Hkv, S, d] written by strided stores, a 512-column chunk
    holding heads of two outputs (768 = q 0..511 | k 512..639, v 640..767). With the columns sharded (LNC=2 at
    768: program 0 takes q heads 0-5, program 1 q heads 6-7, k and v) the outputs are the same bits as the one-core
    BSD output split in numpy, and the fused RMSNorm gives the same split of its BSD output too."""
    B, S, H, Hq, Hkv, d = dims
    x, w, g = _qkv_inputs(*dims, seed=7)
    heads = dict(n_q_heads=Hq, n_kv_heads=Hkv, d_head=d)
    for gamma in (None, g):
        bsd = proj.qkv_cte(x, w, gamma=gamma)
        close(bsd, qkv_reference(x, w, gamma), BF16)
        for lnc in (1, 2):
            q, k, v = proj.qkv_cte[lnc](x, w, gamma=gamma, output_layout="NBSd", shard=shard, **heads)
            assert q.shape == (B, Hq, S, d) and k.shape == v.shape == (B, Hkv, S, d)
            for got, want in zip((q, k, v), split_heads(bsd, Hq, Hkv, d)):
                np.testing.assert_array_equal(_bits(got), _bits(want))
            assert _matmuls(proj.qkv_cte.last_profile) == qkv_cte_matmuls(B, S, H, w.shape[1], lnc, shard)


@pytest.mark.parametrize("shard", ["tokens", "columns"])
def test_qkv_cte_lnc2_faster(proj, shard):
    """1024 tokens, H = 1024, I = 1536: 8 token tiles of 3 x 8 matmuls, TensorE-bound. LNC=2 dealing the token tiles
    (each program loads the whole weight) or splitting the columns (each program transposes every token tile but
    loads half the weight) runs in well under LNC=1's time (about 0.6 when written), with the same bits."""
    x, w, g = _qkv_inputs(1, 1024, 1024, 8, 2, 128, seed=3)
    kw = dict(n_q_heads=8, n_kv_heads=2, d_head=128, shard=shard)
    o1 = proj.qkv_cte[1](x, w, **kw)
    p1 = proj.qkv_cte.last_profile
    o2 = proj.qkv_cte[2](x, w, **kw)
    p2 = proj.qkv_cte.last_profile
    np.testing.assert_array_equal(_bits(o1), _bits(o2))
    assert p1.bound == "tensor", p1.bound
    assert p2.cores == 2 and p2.total_time_ns < 0.7 * p1.total_time_ns, (p1.total_time_ns, p2.total_time_ns)
    # tokens dealt: each program loads the whole weight and its half of the tokens; columns split: each loads every
    # token and half the weight
    r1, r2 = _hbm(p1)[0], _hbm(p2)[0]
    assert r1 == x.nbytes + w.nbytes
    assert r2 == (x.nbytes + 2 * w.nbytes if shard == "tokens" else 2 * x.nbytes + w.nbytes)


def test_fused_rmsnorm_saves_the_hidden_round_trip(proj, rms):
    """RMSNorm fused into the projection against the two kernels one after the other (nkilib_style_rmsnorm's
    rmsnorm_cte writing the normalised hidden state to HBM, then the plain projection reading it back): the fused
    kernel reads hidden, the weight and gamma once and writes the output; the pair also writes and reads the
    normalised [B, S, H] tensor, 2 x hidden's bytes more, and takes longer. Both give numpy's numbers."""
    x, w, g = _qkv_inputs(2, 512, 1024, 8, 2, 64, seed=11)
    fused = proj.qkv_cte(x, w, gamma=g)
    pf = proj.qkv_cte.last_profile
    normed = rms.rmsnorm_cte(x, g)
    pr = rms.rmsnorm_cte.last_profile
    sep = proj.qkv_cte(normed, w)
    pp = proj.qkv_cte.last_profile
    close(fused, qkv_reference(x, w, g), BF16)
    close(normed, rms.reference(x, g), BF16)
    close(sep, _f64(normed) @ _f64(w), BF16)  # its one rounding: the normalised hidden stored in bf16
    assert _hbm(pf) == (x.nbytes + w.nbytes + g.nbytes, fused.nbytes)
    assert _hbm(pp) == (normed.nbytes + w.nbytes, sep.nbytes)
    assert _hbm(pr)[1] == normed.nbytes == x.nbytes and _hbm(pr)[0] >= x.nbytes + g.nbytes
    separate = sum(_hbm(pr)) + sum(_hbm(pp))
    assert separate - sum(_hbm(pf)) >= 2 * x.nbytes
    assert pf.total_time_ns < pr.total_time_ns + pp.total_time_ns, (pf.total_time_ns, pr.total_time_ns,
                                                                     pp.total_time_ns)


# --------------------------------------------------------------------------------------------------
# qkv_tkg
# --------------------------------------------------------------------------------------------------

def tkg_matmuls(H, I, lnc=1):
    """The weight is the moving operand: one matmul per (512-column chunk, 128-row K tile), ceil(I / lnc / 512)
    chunks per program. (With the weight stationary it would be one per 128 x 128 block: 4x as many.)"""
    return lnc * _cdiv(_cdiv(I, lnc), 512) * (H // 128)


@pytest.mark.parametrize("lnc", [1, 2])
@pytest.mark.parametrize("B,S,H,I,dtype", [(2, 3, 1024, 1536, BF16), (8, 1, 512, 1280, BF16),
                                           (4, 8, 256, 640, np.float32), (1, 1, 2048, 512, BF16)])
def test_qkv_tkg_matches_numpy(proj, B, S, H, I, dtype, lnc):
    """Decode QKV (1 to 32 tokens, ragged column tails, LNC=2 splitting the columns) against numpy; matmul count."""
    x = _randn((B, S, H), dtype, seed=H + I)
    w = _randn((H, I), dtype, seed=H, scale=1 / np.sqrt(H))
    out = proj.qkv_tkg[lnc](x, w)
    assert out.shape == (B, S, I) and out.dtype == dtype
    close(out, _f64(x) @ _f64(w), dtype)
    assert _matmuls(proj.qkv_tkg.last_profile) == tkg_matmuls(H, I, lnc)


def test_qkv_tkg_is_hbm_bound(proj):
    """8 tokens against a 2048 x 4096 bf16 weight (16 MiB): the kernel reads the weight and the tokens once and
    nothing else, is bound by its DMAs, and cannot beat the weight's bytes over the HBM bandwidth nsim's config gives
    (min(hbm.bw, dma.engines x dma.engine_bw), ``nsim.plot.memory_roof``); streaming it in 512-column blocks overlaps
    the matmuls well enough to stay within 1.4x of that bound. Under LNC=2 each core streams half the weight from its
    own HBM share: about half the time."""
    x = _randn((4, 2, 2048), seed=1)
    w = _randn((2048, 4096), seed=2, scale=1 / 45)
    o1 = proj.qkv_tkg[1](x, w)
    p1 = proj.qkv_tkg.last_profile
    roof_ns = w.nbytes / nsim.plot.memory_roof(p1.config, p1.overrides) * 1e9
    assert _hbm(p1) == (w.nbytes + x.nbytes, o1.nbytes)
    assert p1.bound == "dma", p1.bound
    assert roof_ns <= p1.total_time_ns < 1.4 * roof_ns, (p1.total_time_ns, roof_ns)
    o2 = proj.qkv_tkg[2](x, w)
    p2 = proj.qkv_tkg.last_profile
    np.testing.assert_array_equal(_bits(o1), _bits(o2))
    assert _hbm(p2)[0] == w.nbytes + 2 * x.nbytes  # each program loads the tokens, half the weight
    assert p2.total_time_ns < 0.65 * p1.total_time_ns, (p1.total_time_ns, p2.total_time_ns)
    assert max(p2.core_times_ns) >= roof_ns / 2


# --------------------------------------------------------------------------------------------------
# RoPE
# --------------------------------------------------------------------------------------------------

def rope_reference(x, cos, sin, interleaved):
    xf, c, s = _f64(x), _f64(cos), _f64(sin)
    x1, x2 = (xf[..., 0::2], xf[..., 1::2]) if interleaved else np.split(xf, 2, axis=-1)
    r1, r2 = x1 * c - x2 * s, x2 * c + x1 * s
    if not interleaved:
        return np.concatenate([r1, r2], axis=-1)
    out = np.empty_like(xf)
    out[..., 0::2], out[..., 1::2] = r1, r2
    return out


def _rope_tables(S, d, dtype=np.float32, base=10000.0):
    inv = base ** (-np.arange(0, d, 2) / d)
    ang = np.arange(S)[:, None] * inv[None, :]
    return np.cos(ang).astype(dtype), np.sin(ang).astype(dtype)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("shape,dtype", [((2, 4, 200, 64), BF16), ((1, 8, 128, 128), BF16),
                                         ((1, 2, 300, 32), np.float32)])
def test_rope_matches_numpy(proj, shape, dtype, interleaved):
    """Half-split and interleaved rotation on [B, H, S, d], all heads of a 128-token tile per instruction, ragged
    tails; LNC=2 the same bits. The two variants differ (so neither view is read as the other)."""
    x = _randn(shape, dtype, seed=shape[2])
    cos, sin = _rope_tables(shape[2], shape[3])
    want = rope_reference(x, cos, sin, interleaved)
    o1 = proj.rope(x, cos, sin, interleaved=interleaved)
    o2 = proj.rope[2](x, cos, sin, interleaved=interleaved)
    assert o1.shape == shape and o1.dtype == dtype
    close(o1, want, dtype)
    np.testing.assert_array_equal(_bits(o1), _bits(o2))
    assert np.abs(want - rope_reference(x, cos, sin, not interleaved)).max() > 0.5


def test_qkv_then_rope(proj):
    """The decoder's chain: fused RMSNorm + QKV into the split layout, then RoPE on q and k (v untouched): numpy's
    chain with the kernels' roundings (q, k stored in bf16 between the kernels)."""
    B, S, H, Hq, Hkv, d = 1, 256, 512, 4, 2, 64
    x, w, g = _qkv_inputs(B, S, H, Hq, Hkv, d, seed=21)
    q, k, v = proj.qkv_cte(x, w, gamma=g, output_layout="NBSd", n_q_heads=Hq, n_kv_heads=Hkv, d_head=d)
    cos, sin = _rope_tables(S, d)
    qr, kr = proj.rope(q, cos, sin), proj.rope(k, cos, sin)
    wq, wk, wv = split_heads(qkv_reference(x, w, g), Hq, Hkv, d)
    close(v, wv, BF16)
    close(qr, rope_reference(rounded(wq, BF16), cos, sin, False), BF16)
    close(kr, rope_reference(rounded(wk, BF16), cos, sin, False), BF16)


# --------------------------------------------------------------------------------------------------
# output projection
# --------------------------------------------------------------------------------------------------

def oproj_matmuls(B, S, K, H, lnc=1):
    """Per token tile, each program's ceil(H / lnc / 512) column chunks x K / 128 tiles."""
    return B * _cdiv(S, 128) * lnc * _cdiv(H // lnc, 512) * (K // 128)


@pytest.mark.parametrize("lnc", [1, 2])
@pytest.mark.parametrize("B,S,K,H,dtype", [(2, 200, 512, 1024, BF16), (1, 128, 256, 768, BF16),
                                           (1, 100, 384, 512, np.float32)])
def test_output_projection_matches_numpy(proj, B, S, K, H, dtype, lnc):
    """attn @ w_o with each token tile transposed by one 3-D dma_transpose from HBM (the form that failed E310), the
    H columns split between the programs under LNC=2; the tiling's matmul count."""
    a = _randn((B, S, K), dtype, seed=S + K)
    w = _randn((K, H), dtype, seed=K, scale=1 / np.sqrt(K))
    out = proj.output_projection[lnc](a, w)
    assert out.shape == (B, S, H) and out.dtype == dtype
    close(out, _f64(a) @ _f64(w), dtype)
    assert _matmuls(proj.output_projection.last_profile) == oproj_matmuls(B, S, K, H, lnc)


def test_output_projection_lnc2(proj):
    """H = 2048 split 1024 + 1024: each program loads half of w_o and transposes every token tile itself, so it
    reads the attention output twice and w_o once in all; same bits in a bit over half the time."""
    a = _randn((2, 512, 1024), seed=5)
    w = _randn((1024, 2048), seed=6, scale=1 / 32)
    o1 = proj.output_projection[1](a, w)
    p1 = proj.output_projection.last_profile
    o2 = proj.output_projection[2](a, w)
    p2 = proj.output_projection.last_profile
    np.testing.assert_array_equal(_bits(o1), _bits(o2))
    assert _hbm(p1) == (a.nbytes + w.nbytes, o1.nbytes)
    assert _hbm(p2) == (2 * a.nbytes + w.nbytes, o2.nbytes)
    assert p2.total_time_ns < 0.65 * p1.total_time_ns, (p1.total_time_ns, p2.total_time_ns)


# --------------------------------------------------------------------------------------------------
# 3-D dma_transpose of an integer-indexed HBM view
# --------------------------------------------------------------------------------------------------

def _transpose_3d_kernel(form):
    import nsim.nki as nki
    import nsim.nki.isa as nisa
    import nsim.nki.language as nl

    @nki.jit
    def t3(x):
        B, S, H = x.shape
        KT = H // 128
        rows = 1 if form == "one row" else S
        cols = H // 2 if form == "strided" else H
        out = nl.ndarray((B, 128, cols // 128, rows), dtype=x.dtype, buffer=nl.shared_hbm)
        for b in nl.affine_range(B):
            t = nl.ndarray((128, cols // 128, rows), dtype=x.dtype, buffer=nl.sbuf)
            if form == "rows":  # contiguous rows: the view's two dims are one free dim of the DMA
                src = x[b, :, :].reshape((S, KT, 128))
            elif form == "strided":  # half of each row: rows and columns stay two dims
                src = x[b, :, nl.ds(0, cols)].reshape((S, cols // 128, 128))
            else:  # a leading dim of one: [1, KT, 128] -> [128, KT, 1]
                src = x[b, nl.ds(0, 1), :].reshape((1, KT, 128))
            nisa.dma_transpose(dst=t, src=src, axes=(2, 1, 0))
            nisa.dma_copy(dst=out[b], src=t)
        return out

    return t3


@pytest.mark.parametrize("form", ["rows", "strided", "one row"])
def test_dma_transpose_3d_of_int_indexed_hbm_view(form):
    """x[b, ...] (the batch dim indexed by an int) reshaped to [rows, K/128, 128] and transposed to [128, K/128,
    rows]: was E310 ("dst must be the transpose of src [1, 4, 8192]"), now numpy's transpose; a view of one row
    stays one row."""
    x = _randn((2, 64, 512), seed=9)
    out = _transpose_3d_kernel(form)(x)
    cols = 256 if form == "strided" else 512
    rows = 1 if form == "one row" else 64
    want = np.asarray(x)[:, :rows, :cols].reshape(2, rows, cols // 128, 128).transpose(0, 3, 2, 1)
    np.testing.assert_array_equal(_bits(out), _bits(want))


def test_dma_transpose_into_hbm_warns():
    """A K projection tile stored transposed ([S, d] in SBUF -> K^T [d, S] in HBM) by ``dma_transpose`` straight
    into a ``shared_hbm`` tensor: nki-api.md 2.2 says nsim accepts an HBM dst with a warning (0.6 takes an SBUF
    dst; the 0.4 migration notes show a shared_hbm one). It ran silently; now a UserWarning at the call's line, and
    the transpose is still right."""
    import nsim.nki as nki
    import nsim.nki.isa as nisa
    import nsim.nki.language as nl

    @nki.jit
    def k_transposed(k):
        S, d = k.shape
        out = nl.ndarray((d, S), dtype=k.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray((S, d), dtype=k.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=k)
        nisa.dma_transpose(dst=out, src=t)
        return out

    k = _randn((128, 64), seed=4)
    with pytest.warns(UserWarning, match="dma_transpose: dst is in HBM") as rec:
        out = k_transposed(k)
    assert any(w.filename == __file__ for w in rec if "dma_transpose" in str(w.message))
    np.testing.assert_array_equal(_bits(out), _bits(np.ascontiguousarray(np.asarray(k).T)))
