"""Vision / diffusion-model kernels written in the style of the nki-samples ``contributed/`` directory and the NKI
workshop labs (tests/python/kernels/vision_contrib_style_kernels.py, Beta-1 dialect, unmodified, through
``nsim.compat``): bilinear upsampling x2 and bilinear resize to any size (align_corners=False), a 3x3 conv2d
(stride 1 and 2, padding 1) as 9 shifted matmuls with output channels tiled by 128 (ragged last tile masked),
GroupNorm (32 groups, cross-partition statistics by matmuls with on-chip membership matrices) + SiLU, a depthwise
3x3 conv with zero padding by masked loads, and global average pool + a linear classifier head. Outputs against
float64 numpy written here (fp32 and bf16, ragged last tiles), one structural fact per kernel and timing facts.

Also the two nsim fixes these kernels needed: a matmul under ``mask=`` (the conv's ragged last output-channel
tile) whose moving operand has two free dims (the shifted window ``x_pad[i_q, s * i_oh + kh, s * i_ow + kw]``) was
rejected ("needs 2-D operands"), and its masked [M, N] result could not be ``+=``-ed into an [M, OH, OW] PSUM view;
an arange index item over a size-1 axis that is out of bounds (``i_h + kh - 1`` of a one-row image in the
depthwise conv's masked tap loads) raised at the subscript even though the load's mask excludes it."""

import numpy as np
import pytest

from conftest import executed_ops, require_core, sample_fixture  # noqa: E402
from conftest import op_counts as _ops  # noqa: E402

_core, ml_dtypes = require_core()
from numeric_helpers import close, rounded  # noqa: E402
from numeric_helpers import f64 as _f64  # noqa: E402

BF16 = ml_dtypes.bfloat16

vc = sample_fixture("vision_contrib_style_kernels.py")


def _randn(shape, dtype, seed, scale=1.0, shift=0.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale + shift).astype(dtype)


def _out(x, dtype):
    """A float64 reference as the kernel stores it: rounded to bf16 for bf16 outputs."""
    return rounded(x, BF16) if dtype == BF16 else x


# --------------------------------------------------------------------------------------------------
# Bilinear interpolation
# --------------------------------------------------------------------------------------------------

def ref_bilinear(x, oh, ow):
    """torch.nn.functional.interpolate(mode='bilinear', align_corners=False) of [C, H, W], float64: separable,
    source coordinate (dst + 0.5) * in / out - 0.5 clamped at 0, neighbours i0 and min(i0 + 1, in - 1)."""
    x = _f64(x)

    def matrix(n_in, n_out):
        a = np.zeros((n_out, n_in))
        for j in range(n_out):
            src = max((j + 0.5) * n_in / n_out - 0.5, 0.0)
            i0 = min(int(np.floor(src)), n_in - 1)
            i1 = min(i0 + 1, n_in - 1)
            lam = src - i0
            a[j, i0] += 1.0 - lam
            a[j, i1] += lam
        return a
    return np.einsum("oh,chw,pw->cop", matrix(x.shape[1], oh), x, matrix(x.shape[2], ow))


def test_bilinear_reference_matches_the_upsample_x2_weights():
    """The reference against the closed form the x2 kernel applies (0.25 / 0.75 of the two nearest columns, the
    border copied), so the two tests below check the same interpolation."""
    x = _randn((1, 4, 5), np.float64, 0)
    r = ref_bilinear(x, 8, 10)
    row = x[0, 0]
    want = [row[0]] + [v for k in range(4) for v in (0.75 * row[k] + 0.25 * row[k + 1],
                                                      0.25 * row[k] + 0.75 * row[k + 1])] + [row[4]]
    np.testing.assert_allclose(r[0, 0], want, rtol=1e-12)


@pytest.mark.parametrize("c,h,w,dtype", [
    (64, 8, 8, np.float32),
    (130, 5, 7, np.float32),    # a full 128-channel tile and a masked one of 2
    (96, 6, 4, BF16),
])
def test_upsample_bilinear2x_matches_numpy(vc, c, h, w, dtype):
    mod = vc[0]
    x = _randn((c, h, w), dtype, c + h)
    out = mod.upsample_bilinear2x_kernel(x)
    assert out.shape == (c, 2 * h, 2 * w) and out.dtype == np.dtype(dtype)
    close(out, _out(ref_bilinear(x, 2 * h, 2 * w), dtype), dtype)


def test_upsample_bilinear2x_structure(vc):
    """Per channel tile: one load, the two 0.75 products, 4 interpolations with strided (``2 * i_w + 1``) writes
    (a scalar_tensor_tensor each), 4 border copies and one store; 130 channels = two tiles (the second masked to
    2 partitions), no TensorE. Every output element is written by one instruction: the interpolated and copied
    columns of the width pass add up to 2W per row."""
    mod = vc[0]
    x = _randn((130, 6, 5), np.float32, 3)
    close(mod.upsample_bilinear2x_kernel(x), ref_bilinear(x, 12, 10))
    k = mod.upsample_bilinear2x_kernel
    assert _ops(k) == {"dma_copy": 4, "tensor_scalar": 4, "scalar_tensor_tensor": 8, "tensor_copy": 8}, _ops(k)
    ops = executed_ops(k.last_json["body"])
    dmas = [o for o in ops if o["op"] == "dma_copy"]
    assert [d["dst"]["index"][0]["size"] if "index" in d["dst"] else None for d in dmas[2:3]] == [2]
    assert k.last_profile.stat("memory.hbm_write_bytes") == 130 * 12 * 10 * 4
    assert k.last_profile.stat("engine.matmul_instruction_count") == 0


@pytest.mark.parametrize("c,h,w,oh,ow,dtype", [
    (32, 6, 8, 9, 13, np.float32),     # non-integer scales up
    (130, 7, 9, 4, 5, np.float32),     # down-sampling, two channel tiles
    (48, 5, 5, 10, 10, BF16),          # x2 through the general kernel
])
def test_resize_bilinear_matches_numpy(vc, c, h, w, oh, ow, dtype):
    mod = vc[0]
    x = _randn((c, h, w), dtype, oh * ow)
    out = mod.resize_bilinear_kernel(x, (oh, ow))
    assert out.shape == (c, oh, ow) and out.dtype == np.dtype(dtype)
    close(out, _out(ref_bilinear(x, oh, ow), dtype), dtype)


def test_resize_bilinear_one_instruction_pair_per_output_column_and_row(vc):
    """Host-computed taps: per tile and output column one multiply (the second neighbour's weight) and one
    scalar_tensor_tensor (first neighbour * weight + that product), the same per output row: (OW + OH) * 2
    vector instructions per tile. The upsample x2 kernel gives the same numbers with a constant count."""
    mod = vc[0]
    x = _randn((40, 6, 8), np.float32, 9)
    out = mod.resize_bilinear_kernel(x, (12, 16))
    close(out, ref_bilinear(x, 12, 16))
    close(out, mod.upsample_bilinear2x_kernel(x))
    assert _ops(mod.resize_bilinear_kernel) == {"dma_copy": 2, "tensor_scalar": 12 + 16,
                                                "scalar_tensor_tensor": 12 + 16}


# --------------------------------------------------------------------------------------------------
# Conv2d 3x3
# --------------------------------------------------------------------------------------------------

def ref_conv2d(x, w, b, stride):
    """float64 NCHW conv, 3x3, padding 1."""
    x, w, b = _f64(x), _f64(w), _f64(b)
    n, c, h, wd = x.shape
    oh, ow = (h - 1) // stride + 1, (wd - 1) // stride + 1
    xp = np.zeros((n, c, h + 2, wd + 2))
    xp[:, :, 1:-1, 1:-1] = x
    out = np.zeros((n, w.shape[0], oh, ow)) + b[None, :, None, None]
    for kh in range(3):
        for kw in range(3):
            win = xp[:, :, kh:kh + stride * (oh - 1) + 1:stride, kw:kw + stride * (ow - 1) + 1:stride]
            out += np.einsum("oc,nchw->nohw", w[:, :, kh, kw], win)
    return out


def conv_inputs(n, c_in, c_out, h, w, dtype, seed):
    return (_randn((n, c_in, h, w), dtype, seed), _randn((c_out, c_in, 3, 3), dtype, seed + 1, 0.2),
            _randn((c_out,), dtype, seed + 2))


@pytest.mark.parametrize("name", ["conv2d_3x3_kernel", "conv2d_3x3_reload_kernel"])
@pytest.mark.parametrize("n,c_in,c_out,h,w,stride,dtype", [
    (2, 16, 64, 8, 8, 1, np.float32),     # C_out < 128: one masked tile
    (1, 32, 160, 9, 7, 1, np.float32),    # C_out > 128: a full tile and a masked one of 32
    (2, 24, 200, 9, 10, 2, np.float32),   # stride 2, odd size: 5 x 5 output
    (1, 128, 256, 16, 16, 2, BF16),       # two full output tiles, bf16
])
def test_conv2d_matches_numpy(vc, name, n, c_in, c_out, h, w, stride, dtype):
    mod = vc[0]
    x, wt, b = conv_inputs(n, c_in, c_out, h, w, dtype, c_out + h)
    out = getattr(mod, name)(x, wt, b, stride=stride)
    oh, ow = (h - 1) // stride + 1, (w - 1) // stride + 1
    assert out.shape == (n, c_out, oh, ow) and out.dtype == np.dtype(dtype)
    close(out, _out(ref_conv2d(x, wt, b, stride), dtype), dtype)


def test_conv2d_nine_matmuls_per_output_tile_and_stride2_moves_a_quarter(vc):
    """N = 2, C_out = 200 (tiles of 128 and 72): 9 nc_matmul per (image, output-channel tile), 36 in all, each
    contracting C_in = 24 partitions over OH * OW output pixels; the masked last tile's matmuls produce 72
    output partitions (stationary columns); the weights are transposed once (9 per output-channel tile).
    Stride 2 on a 16 x 16 image: an 8 x 8 output, a quarter of the stride-1 output bytes stored, with the same
    matmul count and a quarter of the moving columns."""
    mod = vc[0]
    x, wt, b = conv_inputs(2, 24, 200, 16, 16, np.float32, 1)
    k = mod.conv2d_3x3_kernel
    hbm_out = {}
    for stride, opix in ((1, 256), (2, 64)):
        close(k(x, wt, b, stride=stride), ref_conv2d(x, wt, b, stride))
        counts = _ops(k)
        assert counts["nc_matmul"] == 2 * 2 * 9 and counts["nc_transpose"] == 2 * 9, counts
        mms = [o for o in executed_ops(k.last_json["body"]) if o["op"] == "nc_matmul"]
        assert [o["stationary"]["index"][-1]["size"] for o in mms] == ([128] * 9 + [72] * 9) * 2
        assert all(o["moving"]["index"][0]["size"] == 24 for o in mms)
        assert all(np.prod([d["size"] for d in o["moving"]["index"][1:]]) == opix for o in mms)
        assert k.last_profile.stat("engine.matmul_instruction_count") == 36
        # the weights: one contiguous load per output-channel tile, each tap transposed on the TensorE (the
        # ragged tile's transposes masked to its 72 rows)
        tps = [o for o in executed_ops(k.last_json["body"]) if o["op"] == "nc_transpose"]
        assert [o["data"]["index"][0]["size"] for o in tps] == [128] * 9 + [72] * 9
        hbm_out[stride] = k.last_profile.stat("memory.hbm_write_bytes")
    assert hbm_out[1] == 2 * 200 * 256 * 4 and hbm_out[2] * 4 == hbm_out[1]


def test_conv2d_time_scales_with_output_tiles_and_resident_input_beats_reloading(vc):
    """C_in = 128, a 16 x 16 image, N = 4: 1 against 3 output-channel tiles take more time (3x the matmuls:
    at least 1.5x the time); with 3 tiles, keeping the padded input resident across the tiles (one input load
    per image) is faster than the loop order that reloads it for every tile (3x the input DMA traffic)."""
    mod = vc[0]
    t = {}
    for c_out in (128, 384):
        x, wt, b = conv_inputs(4, 128, c_out, 16, 16, BF16, 7)
        for name in ("conv2d_3x3_kernel", "conv2d_3x3_reload_kernel"):
            k = getattr(mod, name)
            close(k(x, wt, b), _out(ref_conv2d(x, wt, b, 1), BF16), BF16)
            t[name, c_out] = k.last_profile.total_time_ns
            if c_out == 384:
                loads = k.last_profile.stat("memory.hbm_read_bytes") - wt.nbytes - b.nbytes
                assert loads == x.nbytes * {"conv2d_3x3_kernel": 1, "conv2d_3x3_reload_kernel": 3}[name], name
    assert t["conv2d_3x3_kernel", 384] > 1.5 * t["conv2d_3x3_kernel", 128], t
    assert t["conv2d_3x3_kernel", 384] < t["conv2d_3x3_reload_kernel", 384], t


# --------------------------------------------------------------------------------------------------
# GroupNorm + SiLU
# --------------------------------------------------------------------------------------------------

def ref_group_norm_silu(x, gamma, beta, groups, eps):
    x = _f64(x)
    n, c, h, w = x.shape
    xg = x.reshape(n, groups, -1)
    mean = xg.mean(-1, keepdims=True)
    var = xg.var(-1, keepdims=True)
    y = ((xg - mean) / np.sqrt(var + eps)).reshape(n, c, h, w)
    y = y * _f64(gamma)[None, :, None, None] + _f64(beta)[None, :, None, None]
    return y / (1.0 + np.exp(-y))


@pytest.mark.parametrize("name", ["group_norm_silu_kernel", "group_norm_silu_transpose_kernel"])
@pytest.mark.parametrize("n,c,h,w,dtype", [
    (2, 64, 8, 8, np.float32),      # 2 channels per group, one tile of 64 channels
    (1, 320, 4, 6, np.float32),     # SD UNet width: 10 channels per group, tiles of 120, 120 and 80 channels
    (2, 256, 8, 8, BF16),           # 8 channels per group, two full tiles
])
def test_group_norm_silu_matches_numpy(vc, name, n, c, h, w, dtype):
    mod = vc[0]
    x = _randn((n, c, h, w), dtype, c + h, scale=2.0, shift=0.5)
    gamma = _randn((c,), np.float32, 1, 0.5, 1.0)
    beta = _randn((c,), np.float32, 2, 0.5)
    out = getattr(mod, name)(x, gamma, beta)
    assert out.shape == x.shape and out.dtype == np.dtype(dtype)
    close(out, _out(ref_group_norm_silu(x, gamma, beta, 32, 1e-5), dtype), dtype)


def test_group_norm_statistics_by_two_matmuls_per_tile(vc):
    """C = 320, 32 groups of 10: tiles of 12 whole groups (120 channels, then 120 and 80). Per (image, tile) the
    group statistics are 2 matmuls (the channel sums [cs, 2] reduced to [groups, 2] with the membership matrix,
    then broadcast back to [cs, 2] with its transpose) and the normalisation + SiLU is one ScalarE activation
    with per-partition scale and bias; the two membership matrices are built once with 4 affine_selects. The
    second matmul's output has exactly the tile's channels on its partitions."""
    mod = vc[0]
    x = _randn((2, 320, 4, 4), np.float32, 4)
    gamma, beta = np.ones(320, np.float32), np.zeros(320, np.float32)
    out = mod.group_norm_silu_kernel(x, gamma, beta)
    close(out, ref_group_norm_silu(x, gamma, beta, 32, 1e-5))
    k = mod.group_norm_silu_kernel
    ops = executed_ops(k.last_json["body"])
    counts = _ops(k)
    assert counts["nc_matmul"] == 2 * 3 * 2 and counts["affine_select"] == 4, counts
    mms = [o for o in ops if o["op"] == "nc_matmul"]
    # the broadcast-back matmul: stationary membership_t[0:gs, 0:cs] (the whole [12, 120] matrix on full tiles)
    cols = [o["stationary"]["index"][1]["size"] if isinstance(o["stationary"], dict) else 120 for o in mms[1::2]]
    assert sorted(cols) == sorted([120, 120, 80] * 2), cols
    acts = [o for o in ops if o["op"] == "activation" and o.get("act") == "silu"]
    assert len(acts) == 2 * 3 and all("scale" in o and "bias" in o for o in acts), acts
    # the transpose form: no matmul, 2 transposes per (image, tile): [cs, 2] -> [2, cs] and back
    kt = mod.group_norm_silu_transpose_kernel
    close(kt(x, gamma, beta), out)
    counts = _ops(kt)
    assert "nc_matmul" not in counts and counts["nc_transpose"] == 2 * 3 * 2, counts


# --------------------------------------------------------------------------------------------------
# Depthwise conv2d 3x3
# --------------------------------------------------------------------------------------------------

def ref_depthwise(x, w, b):
    x, w, b = _f64(x), _f64(w), _f64(b)
    n, c, h, wd = x.shape
    xp = np.zeros((n, c, h + 2, wd + 2))
    xp[:, :, 1:-1, 1:-1] = x
    out = np.zeros_like(x) + b[None, :, None, None]
    for kh in range(3):
        for kw in range(3):
            out += xp[:, :, kh:kh + h, kw:kw + wd] * w[None, :, 0, kh, kw, None, None]
    return out


@pytest.mark.parametrize("name", ["depthwise_conv2d_3x3_kernel", "depthwise_conv2d_3x3_padded_kernel"])
@pytest.mark.parametrize("n,c,h,w,dtype", [
    (2, 64, 6, 7, np.float32),
    (1, 200, 5, 5, np.float32),    # a full tile and a masked one of 72 channels
    (2, 96, 8, 8, BF16),
    (2, 40, 1, 6, np.float32),     # a one-row image: the taps of rows -1 and +1 are masked off entirely
    (1, 8, 1, 1, np.float32),      # one pixel: only the centre tap is loaded
])
def test_depthwise_conv2d_matches_numpy(vc, name, n, c, h, w, dtype):
    mod = vc[0]
    x = _randn((n, c, h, w), dtype, c + w)
    wt = _randn((c, 1, 3, 3), dtype, c + 1)
    b = _randn((c,), dtype, c + 2)
    out = getattr(mod, name)(x, wt, b)
    assert out.shape == x.shape and out.dtype == np.dtype(dtype)
    close(out, _out(ref_depthwise(x, wt, b), dtype), dtype)


def test_depthwise_masked_loads_skip_the_padding_and_one_padded_load_is_faster(vc):
    """The masked-load kernel issues 9 loads per (image, channel tile), each moving only the part of the shifted
    window inside the image: (H - |dh|) x (W - |dw|) pixels, so all 9 move sum_kh (H - |kh - 1|) *
    sum_kw (W - |kw - 1|) pixels per channel, never the padding. The padded kernel loads each image once and
    reads the 9 windows in place: the same result, fewer DMAs and bytes, less time."""
    mod = vc[0]
    n, c, h, w = 2, 128, 12, 10
    x, wt, b = _randn((n, c, h, w), np.float32, 1), _randn((c, 1, 3, 3), np.float32, 2), _randn((c,), np.float32, 3)
    want = ref_depthwise(x, wt, b)
    t = {}
    for name in ("depthwise_conv2d_3x3_kernel", "depthwise_conv2d_3x3_padded_kernel"):
        k = getattr(mod, name)
        close(k(x, wt, b), want)
        t[name] = k.last_profile.total_time_ns
        reads = k.last_profile.stat("memory.hbm_read_bytes") - wt.nbytes - b.nbytes
        if name == "depthwise_conv2d_3x3_kernel":
            assert _ops(k)["dma_copy"] == 2 + n * 9 + n
            assert reads == n * c * (3 * h - 2) * (3 * w - 2) * 4
        else:
            assert _ops(k)["dma_copy"] == 2 + n + n
            assert reads == x.nbytes
    assert t["depthwise_conv2d_3x3_padded_kernel"] < t["depthwise_conv2d_3x3_kernel"], t


# --------------------------------------------------------------------------------------------------
# Global average pool + classifier head
# --------------------------------------------------------------------------------------------------

def ref_gap_classifier(x, w, b):
    return _f64(x).mean(axis=(2, 3)) @ _f64(w).T + _f64(b)


@pytest.mark.parametrize("n,c,h,w,k,dtype", [
    (4, 64, 7, 7, 10, np.float32),
    (8, 200, 4, 4, 150, np.float32),   # C and K both over 128: ragged tiles
    (16, 256, 5, 5, 100, BF16),
])
def test_gap_classifier_matches_numpy(vc, n, c, h, w, k, dtype):
    mod = vc[0]
    x = _randn((n, c, h, w), dtype, c + k)
    fw = _randn((k, c), dtype, k, 1.0 / np.sqrt(c))
    fb = _randn((k,), dtype, k + 1)
    out = mod.global_avgpool_classifier_kernel(x, fw, fb)
    assert out.shape == (n, k) and out.dtype == np.dtype(dtype)
    close(out, _out(ref_gap_classifier(x, fw, fb), dtype), dtype)


def test_gap_classifier_matmuls_and_traffic(vc):
    """C = 200 (channel tiles of 128 and 72), K = 150 (class tiles of 128 and 22): 2 x 2 matmuls accumulating
    over the channel tiles, each with the batch (N = 8) as its moving columns; x is read exactly once, the
    weights once (transposed by the DMA), and the logits written once (a transposed store per class tile).
    Doubling the batch doubles the pooling work: more time."""
    mod = vc[0]
    t = {}
    for n in (8, 16):
        x, fw, fb = _randn((n, 200, 6, 6), np.float32, n), _randn((150, 200), np.float32, 1, 0.1), \
            _randn((150,), np.float32, 2)
        k = mod.global_avgpool_classifier_kernel
        close(k(x, fw, fb), ref_gap_classifier(x, fw, fb))
        prof = k.last_profile
        assert prof.stat("engine.matmul_instruction_count") == 4
        mms = [o for o in executed_ops(k.last_json["body"]) if o["op"] == "nc_matmul"]
        assert all(o["moving"]["index"][-1]["size"] == n for o in mms if "index" in o["moving"]), mms[0]
        assert prof.stat("memory.hbm_read_bytes") == x.nbytes + fw.nbytes + fb.nbytes
        assert prof.stat("memory.hbm_write_bytes") == n * 150 * 4
        t[n] = prof.total_time_ns
    assert t[16] > t[8], t


# --------------------------------------------------------------------------------------------------
# The nsim fix: masked matmuls with a moving operand of several free dims
# --------------------------------------------------------------------------------------------------

def test_masked_matmul_with_a_multi_dim_moving_operand(vc):
    """``psum[i_o, i_a, i_b] += nisa.nc_matmul(st[i_s, i_m], mov[i_q, i_a, i_b], mask=...)`` (the conv's ragged
    output-channel tile): a mask on M only gives the [M, N] result of the unmasked form with only its first M
    partitions written, added to an [M, A, B] PSUM view (its other partitions untouched, here left at zero); a
    mask on the moving's free dims (``i_a < 3``) restricts those columns of an [M, A, B] result. Both were
    rejected ("needs 2-D operands") before the fix."""
    _, nki, nl, nisa = vc
    st = _randn((16, 32), np.float32, 1)
    mov = _randn((16, 5, 6), np.float32, 2)

    @nki.jit
    def k(st_hbm, mov_hbm, m_valid, a_valid):
        out = nl.ndarray((2, 32, 5, 6), dtype=nl.float32, buffer=nl.shared_hbm)
        s_sb = nl.load(st_hbm)
        m_sb = nl.load(mov_hbm)
        i_s, i_m = nl.mgrid[0:16, 0:32]
        i_q, i_a, i_b = nl.mgrid[0:16, 0:5, 0:6]
        i_o, i_x, i_y = nl.mgrid[0:32, 0:5, 0:6]
        acc = nl.zeros((nl.par_dim(32), 5, 6), dtype=nl.float32, buffer=nl.psum)
        for rep in nl.affine_range(2):
          acc[i_o, i_x, i_y] += nisa.nc_matmul(s_sb[i_s, i_m], m_sb[i_q, i_a, i_b], mask=(i_m < m_valid))
        nl.store(out[0], value=nl.copy(acc))
        acc2 = nl.zeros((nl.par_dim(32), 5, 6), dtype=nl.float32, buffer=nl.psum)
        acc2 += nl.matmul(s_sb[i_s, i_m], m_sb[i_q, i_a, i_b], transpose_x=True, mask=(i_a < a_valid))
        nl.store(out[1], value=nl.copy(acc2))
        return out

    out = k(st, mov, 20, 3)
    full = np.einsum("km,kab->mab", _f64(st), _f64(mov))
    want0 = 2 * full
    want0[20:] = 0.0
    want1 = full.copy()
    want1[:, 3:] = 0.0
    close(out[0], want0)
    close(out[1], want1)
    mms = [o for o in executed_ops(k.last_json["body"]) if o["op"] == "nc_matmul"]
    assert len(mms) == 3
    assert mms[0]["stationary"]["index"][1]["size"] == 20 and mms[2]["moving"]["index"][1]["size"] == 3, mms


def test_out_of_bounds_arange_item_on_a_size_one_axis_is_checked_only_where_the_mask_holds(vc):
    """``x[i_p, i_h - 1, i_w]`` with ``i_h`` over a single row is the constant row -1: out of bounds, but a mask
    (``i_h - 1 >= 0``) that excludes it everywhere makes the load a no-op (spec §3.8: masked-out positions are not
    bounds-checked), as for ranges that are partly out of bounds; without the mask it is an error naming the
    kernel line. Before the fix the subscript raised in both cases."""
    _, nki, nl, nisa = vc

    def make(masked):
        @nki.jit
        def k(x):
            out = nl.ndarray((4, 1, 5), dtype=x.dtype, buffer=nl.shared_hbm)
            i_p, i_h, i_w = nl.mgrid[0:4, 0:1, 0:5]
            t = nl.full((4, 1, 5), 7.0, dtype=x.dtype)
            if masked:
                t[i_p, i_h, i_w] = nl.load(x[i_p, i_h - 1, i_w], mask=(i_h - 1 >= 0))
            else:
                t[i_p, i_h, i_w] = nl.load(x[i_p, i_h - 1, i_w])
            nl.store(out[i_p, i_h, i_w], value=t)
            return out
        return k

    x = np.ones((4, 1, 5), np.float32)
    np.testing.assert_array_equal(make(True)(x), np.full((4, 1, 5), 7.0, np.float32))
    k = make(False)
    with pytest.raises(Exception, match=r"err_tensor_access_out_of_bound: index -1 (.|\n)*"
                                        r"test_vision_contrib_style_kernels\.py:\d+"):
        k(x)
