"""Vision-transformer blocks written like community Trainium ports of ViT / DeiT / Swin / SigLIP
(tests/python/kernels/vit_block_kernels.py, Beta-1 dialect, and vit_block_kernels_new.py, new dialect; both unmodified,
through ``nsim.compat``):

- ViT patch embedding (both dialects): image [3, 224, 224] -> 196 tokens by one matmul over im2col'd patches that are
  loaded straight from the image by strided multi-dim DMAs (Beta 1: ``nl.mgrid`` index expressions written into
  partition blocks of the patch tile; new: ``image.ap([[1, 16], [16 W, rows], [16, gw]], offset=...)``), 6 contraction
  chunks accumulating in PSUM, conv bias, class token at row 0 and learned position embeddings;
- Swin (shifted) window attention (Beta 1): window partition of [H, W, C] by views, relative position bias gathered from
  the [(2 * 7 - 1)^2, heads] table by the static index map (``nl.gather_flattened``), the cyclic roll by -3 folded
  into the window loads (``roll="view"``) or done by HBM -> HBM DMAs (``roll="dma"``), the shifted-window attention mask
  from ``iota`` region labels, softmax, window reverse + roll back; and W-MSA with the windows' tokens on the
  partitions (new dialect: one DMA of a reshaped + permuted HBM view per tile of 1 or 2 windows, the second window's
  keys masked, also under LNC = 2);
- LayerScale residual without stochastic depth (Beta 1; also fused with the next block's pre-norm LayerNorm from
  ``bn_stats`` / ``bn_aggr`` over 512-column chunks) and SigLIP's attention-pooling (MAP) head (new dialect: a probe
  query against all tokens, all heads in one block-diagonal matmul, out projection, y + MLP(LN(y)));
- 2-D sin-cos position embeddings generated on chip (new dialect: ``iota``, ``exp`` frequencies, range-reduced ``sin``).

Checked: outputs against float64 numpy (fp32 1e-5, bf16 1e-2), no warning / sanitizer report, the DMA / matmul counts
and HBM bytes the tiling implies (the im2col reads every image byte exactly once; the DMA roll re-reads and re-writes
the maps), and the timing story of the roll (below).

Timing stories: the roll by views against the roll by HBM -> HBM DMAs (Beta 1), 2 windows on the partitions against
one window per tile and LNC = 2 against one core (new dialect), with the direction argued from the cost model in each
test's docstring.

The nsim fixes this family needed: none. Every kernel ran correctly, without a false warning, on its first run in
both dialects (index expressions written into partition blocks of an SBUF tile, 3-D ``mgrid`` loads / stores with a
combined free index, HBM ``.ap`` with three dims and a stride-0 partition broadcast, ``nl.gather_flattened`` of a
broadcast table column, ``activation`` with ``reduce_res``, ``nc_transpose`` of [1, D] rows); the tests below pin those
behaviours down.
"""
import math

import numpy as np
import pytest

from conftest import executed_ops, require_core, sample_fixture, run_clean, op_counts  # noqa: E402,F401

# The Swin kernel broadcasts rows of its bias table with K = 1 matmuls from partitions the start-partition rule does
# not allow (nki-api.md 2.0; the sanitizer's NSIM-W509): its tests check the numbers and timing, not that rule.
_SWIN_W509 = ("NSIM-W509",)

_core, ml_dtypes = require_core()
from numeric_helpers import close, f64, randn  # noqa: E402

BF16 = ml_dtypes.bfloat16

vit = sample_fixture("vit_block_kernels.py")
vitn = sample_fixture("vit_block_kernels_new.py", module_only=True)


# --------------------------------------------------------------------------------------------------
# references
# --------------------------------------------------------------------------------------------------

def ref_patch_embed(img, w, b, cls, pos, patch=16):
    C, H, W = img.shape
    gh, gw = H // patch, W // patch
    pat = f64(img).reshape(C, gh, patch, gw, patch).transpose(1, 3, 0, 2, 4).reshape(gh * gw, -1)
    return np.concatenate([f64(cls) + f64(pos[:1]), pat @ f64(w) + f64(b) + f64(pos[1:])])


def swin_rel_index(ws):
    """Swin's relative_position_index buffer [ws^2, ws^2]."""
    coords = np.stack(np.meshgrid(np.arange(ws), np.arange(ws), indexing="ij")).reshape(2, -1)
    rel = (coords[:, :, None] - coords[:, None, :]).transpose(1, 2, 0) + (ws - 1)
    return (rel[..., 0] * (2 * ws - 1) + rel[..., 1]).astype(np.int32)


def ref_swin(q, k, v, table, idx, nh, ws, shift):
    """Swin's WindowAttention on q / k / v maps, with the SwinTransformerBlock's roll, mask and window reverse."""
    q, k, v = f64(q), f64(k), f64(v)
    H, W, C = q.shape
    hd, N = C // nh, ws * ws
    if shift:
        q, k, v = (np.roll(a, (-shift, -shift), (0, 1)) for a in (q, k, v))
        img = np.zeros((H, W))
        cnt = 0
        for hs in (slice(0, -ws), slice(-ws, -shift), slice(-shift, None)):
            for wsl in (slice(0, -ws), slice(-ws, -shift), slice(-shift, None)):
                img[hs, wsl] = cnt
                cnt += 1

    def part(a):
        return a.reshape(H // ws, ws, W // ws, ws, -1).transpose(0, 2, 1, 3, 4).reshape(-1, N, a.shape[-1])

    qw, kw, vw = part(q), part(k), part(v)
    bias = f64(table)[idx.reshape(-1)].reshape(N, N, nh).transpose(2, 0, 1)
    if shift:
        mw = part(img[..., None])[..., 0]
        am = np.where(mw[:, :, None] != mw[:, None, :], -100.0, 0.0)
    out = np.zeros_like(qw)
    for w in range(qw.shape[0]):
        for h in range(nh):
            sl = slice(h * hd, (h + 1) * hd)
            s = qw[w, :, sl] @ kw[w, :, sl].T / math.sqrt(hd) + bias[h]
            if shift:
                s = s + am[w]
            p = np.exp(s - s.max(1, keepdims=True))
            out[w, :, sl] = (p / p.sum(1, keepdims=True)) @ vw[w, :, sl]
    o = out.reshape(H // ws, W // ws, ws, ws, C).transpose(0, 2, 1, 3, 4).reshape(H, W, C)
    return np.roll(o, (shift, shift), (0, 1)) if shift else o


def _gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def ref_map_head(x, probe, wq, wk, wv, wo, bo, g, be, w1, b1, w2, b2, nh, eps=1e-6):
    B, N, D = x.shape
    hd = D // nh
    outs = []
    for bb in range(B):
        X = f64(x[bb])
        q, K, V = f64(probe) @ f64(wq), X @ f64(wk), X @ f64(wv)
        o = np.zeros((1, D))
        for h in range(nh):
            sl = slice(h * hd, (h + 1) * hd)
            s = q[:, sl] @ K[:, sl].T / math.sqrt(hd)
            p = np.exp(s - s.max())
            o[:, sl] = (p / p.sum()) @ V[:, sl]
        y = o @ f64(wo) + f64(bo)
        mu, var = y.mean(), y.var()
        ln = (y - mu) / np.sqrt(var + eps) * f64(g) + f64(be)
        outs.append((y + _gelu_tanh(ln @ f64(w1) + f64(b1)) @ f64(w2) + f64(b2))[0])
    return np.stack(outs)


def ref_sincos(gh, gw, dim, temperature=10000.0):
    """MAE's get_2d_sincos_pos_embed (no cls row): [sin(x w), cos(x w), sin(y w), cos(y w)], x = column."""
    q = dim // 4
    om = temperature ** (-np.arange(q) / q)
    yy, xx = np.meshgrid(np.arange(gh), np.arange(gw), indexing="ij")
    xa, ya = xx.reshape(-1)[:, None] * om, yy.reshape(-1)[:, None] * om
    return np.concatenate([np.sin(xa), np.cos(xa), np.sin(ya), np.cos(ya)], 1)


def _patch_args(D, dtype, seed=0):
    img = randn((3, 224, 224), dtype, seed)
    w = randn((768, D), dtype, seed + 1, scale=0.05)
    b = randn((1, D), dtype, seed + 2)
    cls = randn((1, D), dtype, seed + 3)
    pos = randn((197, D), dtype, seed + 4)
    return img, w, b, cls, pos


def _swin_args(H, C, nh, seed=0, dtype=np.float32):
    q, k, v = (randn((H, H, C), dtype, seed + i) for i in range(3))
    table = randn((169, nh), np.float32, seed + 3)
    return q, k, v, table, swin_rel_index(7)


# --------------------------------------------------------------------------------------------------
# patch embedding
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dialect", ["beta1", "new"])
@pytest.mark.parametrize("D,dtype", [(128, np.float32), (384, BF16)])
def test_patch_embed_matches_numpy(vit, vitn, dialect, D, dtype):
    k = vit[0].patch_embed_b1 if dialect == "beta1" else vitn.patch_embed
    args = _patch_args(D, dtype)
    out = run_clean(k, *args)
    assert out.shape == (197, D) and out.dtype == np.dtype(dtype)
    want = ref_patch_embed(*args)
    if dtype == np.float32:
        close(out, want)
    else:  # a 768-long bf16 contraction: relative to the largest output
        assert np.abs(f64(out) - want).max() / np.abs(want).max() < 1e-2


@pytest.mark.parametrize("dialect", ["beta1", "new"])
def test_patch_embed_structure(vit, vitn, dialect):
    """Two token tiles (9 patch rows = 126 tokens, 5 rows = 70); per tile 6 chunks x 8 kernel rows of strided im2col
    loads, one pos load, one store (new: plus the stride-0 bias broadcast load); 6 weight loads, bias (Beta 1), class
    token, pos row 0 and its store. 12 matmuls (Beta 1: 14, the [1, D] conv bias broadcast over the token partitions by
    ``nl.add`` is a ones-row matmul per tile, nsim's lowering of a partition broadcast). Every byte of the image, the weight and the position table is read
    from HBM exactly once (the new dialect reads the bias row once per tile)."""
    k = vit[0].patch_embed_b1 if dialect == "beta1" else vitn.patch_embed
    D = 128
    args = _patch_args(D, np.float32)
    run_clean(k, *args)
    ops = op_counts(k)
    per_tile = 6 * 8 + 1 + 1 + (1 if dialect == "new" else 0)
    fixed = 6 + 2 + 1 + (1 if dialect == "beta1" else 0)
    assert ops["dma_copy"] == fixed + 2 * per_tile
    assert ops["nc_matmul"] == 12 + (2 if dialect == "beta1" else 0)
    bias_reads = 1 if dialect == "beta1" else 196
    want = 4 * (3 * 224 * 224 + 768 * D + 197 * D + D + D * bias_reads)
    assert k.last_profile.stat("memory.hbm_read_bytes") == want
    assert k.last_profile.stat("memory.hbm_write_bytes") == 4 * 197 * D
    # the im2col load of one kernel row: 16 partitions (kx), 9 x 14 tokens
    loads = [o for o in executed_ops(k.last_json["body"]) if o["op"] == "dma_copy"]
    assert len(loads) == ops["dma_copy"]


# --------------------------------------------------------------------------------------------------
# Swin window attention
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("H,C,nh,shift,roll,dtype", [
    (14, 64, 2, 0, "view", np.float32),    # W-MSA, 2 x 2 windows
    (14, 64, 2, 3, "view", np.float32),    # SW-MSA: every window touches the roll boundary
    (14, 64, 2, 3, "dma", np.float32),
    (21, 96, 3, 3, "view", np.float32),    # 3 x 3 windows, Swin-T stage-1 width, interior window unmasked
    (21, 96, 3, 3, "dma", np.float32),
    (14, 128, 4, 3, "view", BF16),   # bf16 maps, 4 heads on partition quadrants 0 / 32 / 64 / 96
])
@pytest.mark.filterwarnings("ignore:NSIM-W509")  # partition starts the hardware does not allow
def test_swin_window_attention_matches_numpy(vit, H, C, nh, shift, roll, dtype):
    m = vit[0]
    q, k, v, table, idx = _swin_args(H, C, nh, seed=H + shift, dtype=dtype)
    out = run_clean(m.swin_window_attention, q, k, v, table, idx, nh, 7, shift, roll, allow=_SWIN_W509)
    assert out.dtype == np.dtype(dtype)
    close(out, ref_swin(q, k, v, table, idx, nh, 7, shift), dtype)


@pytest.mark.filterwarnings("ignore:NSIM-W509")  # partition starts the hardware does not allow
def test_swin_shift_mask_matters(vit):
    """The -100 mask of the shifted windows changes the windows on the boundary and only those."""
    m = vit[0]
    q, k, v, table, idx = _swin_args(21, 96, 3, seed=5)
    out = run_clean(m.swin_window_attention, q, k, v, table, idx, 3, 7, 3, "view", allow=_SWIN_W509)
    no_mask = np.roll(ref_swin(*(np.roll(a, (-3, -3), (0, 1)) for a in (q, k, v)), table, idx, 3, 7, 0),
                      (3, 3), (0, 1))
    diff = np.abs(f64(out) - no_mask).max(axis=2) > 1e-4
    # interior window (1, 1) of the rolled map = rows / columns 10 .. 16 of the original
    assert not diff[10:17, 10:17].any()
    assert diff.sum() > 49


@pytest.mark.filterwarnings("ignore:NSIM-W509")  # partition starts the hardware does not allow
def test_swin_structure_and_hbm_bytes(vit):
    """View roll: the map is read once (q, k, v), written once, plus the index map and the table; the boundary
    windows take 2 or 4 DMA pieces per tensor. DMA roll: 12 extra HBM -> HBM DMAs in and 4 out, the maps read and
    written once more. 2 matmuls per (window, head) + one per head for the table column's partition broadcast
    (``broadcast_to`` of a [1, 169] row); one gather per head."""
    m = vit[0]
    H, C, nh = 14, 64, 2
    q, k, v, table, idx = _swin_args(H, C, nh)
    mb = 4 * H * H * C
    fixed_reads = 4 * (49 * 49 + 169 * nh)
    run_clean(m.swin_window_attention, q, k, v, table, idx, nh, 7, 3, "view", allow=_SWIN_W509)
    ops = op_counts(m.swin_window_attention)
    prof = m.swin_window_attention.last_profile
    # windows (0,0): 1 piece, (0,1), (1,0): 2, (1,1): 4 -> 9 pieces x (3 loads + 1 store), + the index map load
    assert ops["dma_copy"] == 9 * 4 + 1
    assert ops["nc_matmul"] == 4 * nh * 2 + nh
    assert ops["nc_n_gather"] == nh
    assert prof.stat("memory.hbm_read_bytes") == 3 * mb + fixed_reads
    assert prof.stat("memory.hbm_write_bytes") == mb
    run_clean(m.swin_window_attention, q, k, v, table, idx, nh, 7, 3, "dma", allow=_SWIN_W509)
    ops = op_counts(m.swin_window_attention)
    prof = m.swin_window_attention.last_profile
    assert ops["dma_copy"] == 12 + 4 * 4 + 4 + 1
    assert prof.stat("memory.hbm_read_bytes") == 3 * mb + fixed_reads + 3 * mb + mb
    assert prof.stat("memory.hbm_write_bytes") == mb + 3 * mb + mb


def _swin_bias(table, idx, nh):
    return np.ascontiguousarray(table[idx.reshape(-1)].reshape(49, 49, nh).transpose(2, 0, 1))


@pytest.mark.parametrize("H,W,C,nh,wpt,dtype", [
    (14, 14, 64, 2, 1, np.float32),
    (14, 14, 64, 2, 2, np.float32),
    (7, 28, 96, 3, 2, np.float32),     # one window row of 4 windows, 2 tiles
    (14, 28, 128, 4, 2, BF16),
])
def test_window_attention_tokens_on_partitions(vitn, H, W, C, nh, wpt, dtype):
    rng_args = [randn((H, W, C), dtype, i) for i in range(3)]
    table = randn((169, nh), np.float32, 3)
    idx = swin_rel_index(7)
    bias = _swin_bias(table, idx, nh)
    out = run_clean(vitn.window_attention, *rng_args, bias, nh, wpt)
    want = ref_swin(*rng_args, table, idx, nh, 7, 0)
    assert out.dtype == np.dtype(dtype)
    close(out, want, dtype)


def test_window_attention_batched_beats_one_window_per_tile(vitn):
    """Timing story: W-MSA with 2 windows packed on the partitions (98 tokens, the other window's keys masked by
    -30000) against one window per tile. Cost model: VectorE / ScalarE / TensorE time is a fixed cost per instruction
    plus elements per partition (partitions run in parallel), so a [98, 98] tile costs about what one [49, 49] tile
    does plus 49 more elements per partition, while 2 windows at a time halve the instruction count (and the DMA count:
    each tile's q, k, v arrive by one DMA of a permuted [wpt, 7, 7, C] view, ~1.1 us of fixed cost each); the
    matmuls' moving sizes double but their count halves. So the batched kernel must be faster, and every instruction
    count (but the bias setup) halves. Both move the same q / k / v bytes (the batched one reads its 2 bias copies)."""
    H, C, nh = 28, 64, 2
    args = [randn((H, H, C), np.float32, i) for i in range(3)]
    bias = _swin_bias(randn((169, nh), np.float32, 3), swin_rel_index(7), nh)
    t, ops, rd = {}, {}, {}
    for wpt in (1, 2):
        run_clean(vitn.window_attention, *args, bias, nh, wpt)
        t[wpt] = vitn.window_attention.last_profile.total_time_ns
        ops[wpt] = op_counts(vitn.window_attention)
        rd[wpt] = vitn.window_attention.last_profile.stat("memory.hbm_read_bytes")
    assert t[2] < 0.85 * t[1], t
    nwin = (H // 7) ** 2
    for wpt in (1, 2):
        assert ops[wpt]["nc_matmul"] == 2 * nh * nwin // wpt
        assert ops[wpt]["dma_copy"] == 4 * nwin // wpt + nh * wpt
        assert rd[wpt] == 4 * (3 * H * H * C + wpt * nh * 49 * 49)
    # tokens on the partitions: one descriptor per token row of q, k, v and out, plus the bias rows (the Beta-1
    # kernel's channels-on-partitions loads take one per element, C times as many)
    assert vitn.window_attention.last_profile.stat("dma.descriptor_count") == 4 * H * H + 2 * nh * 49


@pytest.mark.filterwarnings("ignore:NSIM-W509")  # partition starts the hardware does not allow
def test_swin_roll_by_views_beats_roll_by_dma(vit):
    """Timing story. Cost model (neuroncore.md 3.3): every DMA pays a fixed ~800 ns setup + 300 ns completion, and
    data moves at 23 B/ns per engine. Rolling by DMA puts a full HBM round trip of q, k, v (4 transfers each) before
    the first window can load, and another of the output after the last window stores, with the window loads
    unchanged; rolling by views only splits the boundary windows' loads (2 nw - 1 of nw^2 windows) into 2 or 4
    pieces, which overlap the other windows' work. So on a 4 x 4 window map the view roll must be faster, and the
    unshifted W-MSA (no pieces, no mask) no slower than the DMA roll. (On a 2 x 2 map every window is a boundary
    window and the two are within 1 %.) Both are DMA-bound: the channels-on-partitions window loads from a
    channels-last map move 4-byte elements (one descriptor each, ``dma.desc_min_ns`` apiece), which is also why the
    unshifted and the view-rolled kernels are within 1 % of each other (same descriptors, the pieces only add
    transfers that overlap)."""
    m = vit[0]
    H, C, nh = 28, 64, 2
    args = _swin_args(H, C, nh)
    t = {}
    for shift, roll in ((0, "view"), (3, "view"), (3, "dma")):
        run_clean(m.swin_window_attention, *args, nh, 7, shift, roll, allow=_SWIN_W509)
        t[(shift, roll)] = m.swin_window_attention.last_profile.total_time_ns
    assert t[(3, "view")] < t[(3, "dma")]
    assert t[(0, "view")] <= t[(3, "dma")]
    assert m.swin_window_attention.last_profile.stat("dma.descriptor_count") >= 3 * H * H * C


# --------------------------------------------------------------------------------------------------
# LayerScale residual, SigLIP MAP head, sin-cos position embeddings
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("N,D,dtype", [(197, 192, np.float32), (256, 384, BF16)])
def test_layerscale_residual(vit, N, D, dtype):
    m = vit[0]
    x = randn((N, D), dtype, 1)
    f = randn((N, D), dtype, 2)
    gamma = (randn((1, D), np.float32, 3) * 1e-1).astype(dtype)
    out = run_clean(m.layerscale_residual_b1, x, f, gamma)
    close(out, f64(x) + f64(gamma) * f64(f), dtype)
    ops = op_counts(m.layerscale_residual_b1)
    nt = (N + 127) // 128
    assert ops["dma_copy"] == 1 + 3 * nt


@pytest.mark.parametrize("N,D,dtype", [(197, 768, np.float32), (256, 384, np.float32), (197, 768, BF16)])
def test_layerscale_residual_prenorm(vit, N, D, dtype):
    """ViT-B width: bn_stats over 2 chunks of 384 (its 512-column limit) and bn_aggr give the row statistics; the
    inputs are offset by 3 so the mean matters. Per token tile one bn_stats per chunk and one bn_aggr."""
    m = vit[0]
    x = (randn((N, D), np.float32, 1) + 3).astype(dtype)
    f = randn((N, D), dtype, 2)
    gamma = randn((1, D), dtype, 3, scale=0.1)
    lw = (1 + randn((1, D), np.float32, 4, scale=0.1)).astype(dtype)
    lb = randn((1, D), dtype, 5, scale=0.1)
    res, normed = run_clean(m.layerscale_residual_prenorm_b1, x, f, gamma, lw, lb)
    r = f64(x) + f64(gamma) * f64(f)
    close(res, r, dtype)
    if dtype != np.float32:
        r = f64(res)  # the kernel normalises its fp32 residual; compare against the stored one to bf16 accuracy
    y = (r - r.mean(1, keepdims=True)) / np.sqrt(r.var(1, keepdims=True) + 1e-6) * f64(lw) + f64(lb)
    close(normed, y, dtype)
    ops = op_counts(m.layerscale_residual_prenorm_b1)
    nt = (N + 127) // 128
    assert ops["bn_stats"] == nt * ((D + 511) // 512)
    assert ops["bn_aggr"] == nt


def _map_args(B, N, D, Hm, dtype, seed=0):
    r = lambda shape, s, sc=1.0: randn(shape, dtype, seed + s, scale=sc)  # noqa: E731
    x = r((B, N, D), 0)
    probe = r((1, D), 1)
    wq, wk, wv, wo = (r((D, D), 2 + i, 1 / math.sqrt(D)) for i in range(4))
    bo, be = r((1, D), 6, 0.1), r((1, D), 7, 0.1)
    g = (1 + randn((1, D), np.float32, seed + 8, scale=0.1)).astype(dtype)
    w1, b1 = r((D, Hm), 9, 1 / math.sqrt(D)), r((1, Hm), 10, 0.1)
    w2, b2 = r((Hm, D), 11, 1 / math.sqrt(Hm)), r((1, D), 12, 0.1)
    return x, probe, wq, wk, wv, wo, bo, g, be, w1, b1, w2, b2


@pytest.mark.parametrize("B,N,D,Hm,nh,dtype", [
    (2, 196, 128, 256, 4, np.float32),   # ragged second token tile (68 tokens)
    (1, 256, 128, 512, 8, np.float32),
    (2, 196, 128, 256, 4, BF16),
])
def test_siglip_map_head_matches_numpy(vitn, B, N, D, Hm, nh, dtype):
    args = _map_args(B, N, D, Hm, dtype, seed=N + nh)
    out = run_clean(vitn.siglip_map_head, *args, nh)
    want = ref_map_head(*args, nh)
    assert out.shape == (B, D) and out.dtype == np.dtype(dtype)
    if dtype == np.float32:
        close(out, want)
    else:
        assert np.abs(f64(out) - want).max() / np.abs(want).max() < 2e-2


def test_siglip_map_head_structure(vitn):
    """All heads in one score matmul per image: per image 2 token tiles -> 2 x-tile loads and 2 transposes, k^T
    (1 matmul), scores (1), per tile v (1) + P V (1), the diagonal gather (1), out projection (1), fc1 (1), fc2 per
    128 hidden (2); plus the probe's projection once. x is read from HBM exactly once."""
    B, N, D, Hm, nh = 2, 196, 128, 256, 4
    args = _map_args(B, N, D, Hm, np.float32)
    run_clean(vitn.siglip_map_head, *args, nh)
    ops = op_counts(vitn.siglip_map_head)
    assert ops["nc_matmul"] == 1 + B * (1 + 1 + 2 * 2 + 1 + 1 + 1 + 2)
    weights = 4 * D * D + 2 * D * Hm + 4 * D + Hm + D
    assert vitn.siglip_map_head.last_profile.stat("memory.hbm_read_bytes") == 4 * (B * N * D + weights)
    assert vitn.siglip_map_head.last_profile.stat("memory.hbm_write_bytes") == 4 * B * D


@pytest.mark.parametrize("gh,gw,dim", [(16, 16, 128), (14, 14, 192), (24, 32, 64)])
def test_sincos_pos_embed_2d(vitn, gh, gw, dim):
    """Arguments up to (gw - 1) * 1 rad and omega down to 1e-4: the range reduction keeps ScalarE's sin in
    [-pi, pi); fp32 to 1e-5 absolute (sin / cos of arguments up to ~30 rad after an fp32 mod)."""
    out = run_clean(vitn.sincos_pos_embed_2d, gh, gw, dim)
    assert out.shape == (gh * gw, dim)
    np.testing.assert_allclose(out, ref_sincos(gh, gw, dim), atol=2e-5, rtol=0)


def test_sincos_pos_embed_structure(vitn):
    """Nothing read from HBM; the frequencies once (one iota, one exp); per token tile one iota of the token index,
    the (row, column) split, and 4 range reductions (2 tensor_scalar each) and 4 ScalarE sin."""
    run_clean(vitn.sincos_pos_embed_2d, 16, 16, 128)
    ops = op_counts(vitn.sincos_pos_embed_2d)
    assert ops["iota"] == 1 + 2 and ops["activation"] == 1 + 2 * 4
    assert ops["tensor_scalar"] == 2 * (2 + 2 * 4)
    assert vitn.sincos_pos_embed_2d.last_profile.stat("memory.hbm_read_bytes") == 0
    assert vitn.sincos_pos_embed_2d.last_profile.stat("memory.hbm_write_bytes") == 4 * 256 * 128


def test_window_attention_lnc2(vitn):
    """``window_attention[2]``: each core takes half of the window rows (``nl.program_id``); the same output, each core
    reads its own copy of the bias, and the two halves run concurrently: clearly faster than one core (not 2x: the
    bias setup is repeated on both cores and each core has only 2 window rows)."""
    H, C, nh = 28, 64, 2
    args = [randn((H, H, C), np.float32, i) for i in range(3)]
    table = randn((169, nh), np.float32, 3)
    idx = swin_rel_index(7)
    bias = _swin_bias(table, idx, nh)
    want = ref_swin(*args, table, idx, nh, 7, 0)
    t, rd = {}, {}
    for lnc in (1, 2):
        out = run_clean(vitn.window_attention[lnc], *args, bias, nh, 2)
        close(out, want)
        t[lnc] = vitn.window_attention.last_profile.total_time_ns
        rd[lnc] = vitn.window_attention.last_profile.stat("memory.hbm_read_bytes")
    assert t[2] < 0.8 * t[1], t
    assert rd[2] == rd[1] + 4 * 2 * nh * 49 * 49
