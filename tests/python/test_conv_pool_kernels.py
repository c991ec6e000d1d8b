"""Convolution and pooling with padding, written the way public NKI authors write them
(tests/python/kernels/conv_pool_kernels.py, Beta-1 dialect, unmodified, through ``nsim.compat``): max-pool and
average-pool 3x3 / stride 2 / padding 1 (count_include_pad both ways) over 5-D window index expressions
``x[n, c, 2 * i_h + i_kh - 1, 2 * i_w + i_kw - 1]`` with a mask excluding the padding; conv1d (causal and same
padding, dilation 1 and 2) as matmuls over shifted windows; ConvTranspose2d stride 2 by scattering each tap's matmul
into the strided output positions; conv2d 3x3 by im2col (one masked 5-D window gather) + matmul; a
depthwise-separable block (depthwise 3x3 from a masked window load + ReLU + pointwise 1x1 matmul). Outputs against
float64 numpy (fp32 1e-5, bf16 1e-2, max-pool exact), no sanitizer report, and structure/traffic facts derived from
the tiling (DMA and matmul counts, HBM bytes: the padding is never read, im2col reads ~k*k times the input).

nsim fixes these kernels needed:

- a padding mask compares a sum of two arange axes (``2 * i_h + i_kh - 1 >= 0``): its true region is not a
  rectangle of the index space and nsim raised NSIM-E446 "non-rectangular masks are not supported yet". Spec §3.8
  makes any such mask valid. The Beta-1 tracer now splits the true region into disjoint boxes
  (beta1/language.py ``mask_boxes`` / ``_mask_rects``: runs of equal rows along each axis share one split) and
  issues one access per box on ``nl.load``, ``nl.store`` and masked element-wise value functions; ``t[idx] =
  nl.load(..., mask=m)`` retargets the per-box DMAs onto ``t[idx]`` (``_retarget_parts``, no copies). A rectangular
  mask still issues one instruction.
- ``nl.full(shape, -np.inf)`` / ``nisa.memset(value=-inf)`` (the max-pool identity) wrote ``-Infinity`` into the
  kernel JSON, which the core rejected (NSIM-E401 "JSON syntax error"); nki/isa.py ``memset`` and ``_imm`` now
  encode non-finite immediates as the "inf"/"-inf"/"nan" strings the core reads.
"""
import numpy as np
import pytest

from conftest import require_core, sample_fixture  # noqa: E402
from conftest import op_counts as _ops  # noqa: E402

_core, ml_dtypes = require_core()
from numeric_helpers import close, f64, randn, rounded  # noqa: E402

BF16 = ml_dtypes.bfloat16

cp = sample_fixture("conv_pool_kernels.py")
vc = sample_fixture("vision_contrib_style_kernels.py")


def _out(x, dtype):
    return rounded(x, BF16) if dtype == BF16 else x


# --------------------------------------------------------------------------------------------------
# float64 references
# --------------------------------------------------------------------------------------------------

def ref_pool(x, kind, count_include_pad=True):
    """torch max_pool2d / avg_pool2d(kernel 3, stride 2, padding 1) of NCHW x, float64."""
    x = f64(x)
    n, c, h, w = x.shape
    oh, ow = (h - 1) // 2 + 1, (w - 1) // 2 + 1
    xp = np.full((n, c, h + 2, w + 2), -np.inf if kind == "max" else 0.0)
    xp[:, :, 1:-1, 1:-1] = x
    valid = np.zeros((h + 2, w + 2))
    valid[1:-1, 1:-1] = 1
    out = np.zeros((n, c, oh, ow))
    for a in range(oh):
        for b in range(ow):
            win = xp[:, :, 2 * a:2 * a + 3, 2 * b:2 * b + 3]
            if kind == "max":
                out[:, :, a, b] = win.max(axis=(2, 3))
            else:
                cnt = 9 if count_include_pad else valid[2 * a:2 * a + 3, 2 * b:2 * b + 3].sum()
                out[:, :, a, b] = win.sum(axis=(2, 3)) / cnt
    return out


def ref_conv2d(x, w, pad=1, groups=1):
    x, w = f64(x), f64(w)
    n, c, h, wd = x.shape
    co, k = w.shape[0], w.shape[2]
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    out = np.zeros((n, co, h, wd))
    for kh in range(k):
        for kw in range(k):
            win = xp[:, :, kh:kh + h, kw:kw + wd]
            if groups == 1:
                out += np.einsum("oc,nchw->nohw", w[:, :, kh, kw], win)
            else:
                out += w[None, :, 0, kh, kw, None, None] * win
    return out


def ref_conv1d(x, w, dilation, causal):
    x, w = f64(x), f64(w)
    b, c, length = x.shape
    k = w.shape[2]
    pad = (k - 1) * dilation
    left = pad if causal else pad // 2
    xp = np.zeros((b, c, length + pad))
    xp[:, :, left:left + length] = x
    return sum(np.einsum("oc,bcl->bol", w[:, :, j], xp[:, :, j * dilation:j * dilation + length]) for j in range(k))


def ref_conv_transpose2d_s2(x, w):
    x, w = f64(x), f64(w)
    n, _, h, wd = x.shape
    out = np.zeros((n, w.shape[1], 2 * h, 2 * wd))
    for kh in range(2):
        for kw in range(2):
            out[:, :, kh::2, kw::2] = np.einsum("co,nchw->nohw", w[:, :, kh, kw], x)
    return out


def test_references_against_direct_sums():
    """The references against a literal sum at a few points (padding handled by index checks, not np.pad)."""
    x = randn((1, 2, 5, 6), np.float64, 1)
    w = randn((3, 2, 3, 3), np.float64, 2)
    r = ref_conv2d(x, w)
    for (o, i, j) in ((0, 0, 0), (2, 4, 5), (1, 2, 3)):
        s = sum(w[o, c, a, b] * x[0, c, i + a - 1, j + b - 1] for c in range(2) for a in range(3) for b in range(3)
                if 0 <= i + a - 1 < 5 and 0 <= j + b - 1 < 6)
        assert abs(r[0, o, i, j] - s) < 1e-12
    p = ref_pool(x, "avg", count_include_pad=False)
    assert abs(p[0, 1, 0, 0] - x[0, 1, 0:2, 0:2].mean()) < 1e-12
    assert ref_pool(x, "max")[0, 0, 2, 2] == x[0, 0, 3:5, 3:6].max()
    x1 = randn((1, 2, 7), np.float64, 3)
    w1 = randn((2, 2, 3), np.float64, 4)
    r1 = ref_conv1d(x1, w1, 2, True)
    assert abs(r1[0, 1, 5] - sum(w1[1, c, j] * x1[0, c, 5 - (2 - j) * 2] for c in range(2) for j in range(3)
                                 if 5 - (2 - j) * 2 >= 0)) < 1e-12


# --------------------------------------------------------------------------------------------------
# Pooling
# --------------------------------------------------------------------------------------------------

def _runs(n):
    """Boxes of a padded 3-tap / stride-2 window axis (i_out, i_k) of an n-long input: the first output's
    window loses its first tap; an odd n also cuts the last window's last tap."""
    return 2 if n % 2 == 0 else 3


def _valid_taps(n):
    """Number of (output, tap) pairs of a 3-tap / stride-2 / pad-1 axis that read inside an n-long input."""
    o = (n - 1) // 2 + 1
    return sum(1 for i in range(o) for k in range(3) if 0 <= 2 * i + k - 1 < n)


@pytest.mark.parametrize("n,c,h,w,dtype", [
    (2, 130, 15, 14, np.float32),   # two channel tiles (the last masked to 2), odd height
    (1, 256, 28, 28, BF16),
    (4, 64, 14, 14, np.float32),
])
def test_maxpool2d_padding_is_exact(cp, n, c, h, w, dtype):
    mod = cp[0]
    x = randn((n, c, h, w), dtype, c + h)
    got = mod.maxpool2d_pad_kernel(x)
    assert got.shape == (n, c, (h - 1) // 2 + 1, (w - 1) // 2 + 1) and got.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(f64(got), ref_pool(x, "max"))


def test_maxpool2d_structure_one_dma_per_box_and_padding_never_read(cp):
    """The padding mask of each window load splits into _runs(H) x _runs(W) boxes: one DMA each, retargeted onto
    the -inf tile (no copies); one memset, one reduce and one store per (image, channel tile). HBM reads are
    exactly the in-image taps (the padded positions are never read); writes are the output."""
    mod = cp[0]
    n, c, h, w = 2, 130, 15, 14
    x = randn((n, c, h, w), np.float32, 7)
    np.testing.assert_array_equal(mod.maxpool2d_pad_kernel(x), ref_pool(x, "max"))
    k = mod.maxpool2d_pad_kernel
    tiles = n * 2
    assert _ops(k) == {"dma_copy": tiles * (_runs(h) * _runs(w) + 1), "memset": tiles, "tensor_reduce": tiles}, _ops(k)
    prof = k.last_profile
    assert prof.stat("memory.hbm_read_bytes") == n * c * _valid_taps(h) * _valid_taps(w) * 4
    assert prof.stat("memory.hbm_write_bytes") == n * c * 8 * 7 * 4


@pytest.mark.parametrize("count_include_pad", [True, False])
@pytest.mark.parametrize("n,c,h,w,dtype", [
    (2, 130, 15, 14, np.float32),
    (1, 192, 28, 28, BF16),
])
def test_avgpool2d_padding_matches_numpy(cp, n, c, h, w, dtype, count_include_pad):
    mod = cp[0]
    x = randn((n, c, h, w), dtype, c + w)
    got = mod.avgpool2d_pad_kernel(x, count_include_pad)
    close(got, _out(ref_pool(x, "avg", count_include_pad), dtype), dtype)


def test_avgpool2d_count_exclude_pad_counts_taps_with_a_masked_add(cp):
    """count_include_pad=False counts each window's valid taps by ``nl.add(ones, 1.0, mask=inside)`` over the
    window space: a non-rectangular element-wise mask, one tensor_scalar per box (retargeted onto ``valid``);
    the border windows differ from a plain /9 (the test fails if the count were 9 everywhere)."""
    mod = cp[0]
    x = randn((1, 64, 14, 14), np.float32, 5) + 3.0
    inc = mod.avgpool2d_pad_kernel(x, True)
    counts_inc = _ops(mod.avgpool2d_pad_kernel)
    exc = mod.avgpool2d_pad_kernel(x, False)
    counts_exc = _ops(mod.avgpool2d_pad_kernel)
    close(exc, ref_pool(x, "avg", False))
    assert np.all(exc[:, :, 0, :] > inc[:, :, 0, :] * 1.3)  # a top-row window has 6 (or 4) of 9 taps
    close(exc[:, :, 1:, 1:], inc[:, :, 1:, 1:] * 1.0)        # interior windows are whole
    boxes = _runs(14) * _runs(14)
    # include: one tensor_scalar (x 1/9); exclude: one per box of the count's masked add, the division a tensor_tensor
    assert counts_inc["tensor_scalar"] == 1 and counts_exc["tensor_scalar"] == boxes, (counts_inc, counts_exc)
    assert counts_exc["tensor_tensor"] == 1, counts_exc
    assert counts_exc["dma_copy"] == counts_inc["dma_copy"] == boxes + 1
    assert "tensor_copy" not in counts_exc


# --------------------------------------------------------------------------------------------------
# Non-rectangular masks directly (regression of NSIM-E446)
# --------------------------------------------------------------------------------------------------

@pytest.mark.filterwarnings("error:NSIM-W509")
def test_non_rectangular_masks_on_load_store_and_elementwise(cp):
    """A triangular mask (``i_f <= i_p``) on a load, a store and an element-wise op: only the masked positions are
    read, computed and written (spec §3.8); each row of the triangle is one box (64 rows: 64 DMAs per load and
    per store, 64 element-wise instructions); a rectangular mask stays one DMA. The element-wise rows start at
    partitions the start-partition rule does not allow for one partition: nsim's lowering, not a view the kernel
    wrote, so the sanitizer's NSIM-W509 is not reported for them (it was, 63 times, telling the user to slice the
    tile at another start)."""
    _, nki, nl, nisa = cp

    @nki.jit
    def tri(a, b):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        i_p, i_f = nl.mgrid[0:64, 0:64]
        t = nl.zeros((64, 64), dtype=a.dtype)
        t[i_p, i_f] = nl.load(a[i_p, i_f], mask=(i_f <= i_p))
        u = nl.load(b[i_p, i_f])
        v = nl.add(t, u, mask=(i_f > i_p))       # upper triangle: 0 + b
        nl.store(out[i_p, i_f], value=t, mask=(i_f <= i_p))
        nl.store(out[i_p, i_f], value=v, mask=(i_f > i_p) & (i_p < 32))
        nl.store(out[i_p, i_f], value=u, mask=(i_f > i_p) & (i_p >= 32) & (i_f < 48))
        return out

    a = randn((64, 64), np.float32, 1)
    b = randn((64, 64), np.float32, 2)
    got = tri(a, b)
    want = np.tril(a) + np.triu(b, 1)
    ip, jf = np.mgrid[0:64, 0:64]
    keep = (jf > ip) & (ip >= 32) & (jf >= 48)  # never written: the output's sentinel
    np.testing.assert_array_equal(got[~keep], want[~keep])
    assert np.all(np.isnan(got[keep]))
    c = _ops(tri)
    # load 64 + load 1 + stores 64 + 32 + 15 (rows 32..46 have i_p < i_f < 48)
    assert c["dma_copy"] == 64 + 1 + 64 + 32 + 15, c
    assert c["tensor_tensor"] == 63, c  # rows 0..62 have an upper part

    @nki.jit
    def rect(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        i_p, i_f = nl.mgrid[0:64, 0:64]
        t = nl.zeros((64, 64), dtype=a.dtype)
        t[i_p, i_f] = nl.load(a[i_p, i_f], mask=(i_p < 40) & (i_f >= 8))
        nl.store(out[i_p, i_f], value=t)
        return out

    r = rect(a)
    np.testing.assert_array_equal(r[:40, 8:], a[:40, 8:])
    assert np.all(r[40:] == 0) and np.all(r[:, :8] == 0)
    assert _ops(rect) == {"dma_copy": 2, "memset": 1}, _ops(rect)


def test_memset_of_negative_infinity(cp):
    """``nisa.memset`` / ``nl.full`` with -inf and +inf (the max/min-pool identities) fill the tile with them."""
    _, nki, nl, nisa = cp

    @nki.jit
    def fills(a):
        out = nl.ndarray((2, 128, 8), dtype=a.dtype, buffer=nl.shared_hbm)
        lo = nl.full((128, 8), -np.inf, dtype=a.dtype)
        hi = nisa.memset((128, 8), np.inf, a.dtype)
        nl.store(out[0], value=nl.maximum(lo, nl.load(a)))
        nl.store(out[1], value=hi)
        return out

    a = randn((128, 8), np.float32, 3)
    got = fills(a)
    np.testing.assert_array_equal(got[0], a)
    assert np.all(got[1] == np.inf)


# --------------------------------------------------------------------------------------------------
# conv1d
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dilation,causal", [(1, True), (2, True), (1, False), (2, False)])
@pytest.mark.parametrize("b,cin,cout,length,k,dtype", [
    (2, 256, 128, 100, 3, np.float32),
    (1, 64, 256, 160, 5, BF16),
])
def test_conv1d_matches_numpy(cp, b, cin, cout, length, k, dtype, dilation, causal):
    mod = cp[0]
    x = randn((b, cin, length), dtype, length)
    w = randn((cout, cin, k), dtype, k, scale=1.0 / np.sqrt(cin * k))
    got = mod.conv1d_kernel(x, w, dilation, causal)
    assert got.shape == (b, cout, length)
    close(got, _out(ref_conv1d(x, w, dilation, causal), dtype), dtype)


def test_conv1d_structure(cp):
    """B x Cout-tiles x Cin-tiles x K matmuls (the taps accumulate in one PSUM tile), the weights transposed once
    per (Cout tile, Cin tile, tap); the causal and same paddings differ only in the window offsets, not in the
    work; reads = input + weights once (the padding is memset on chip, not read)."""
    mod = cp[0]
    b, cin, cout, length, k = 2, 256, 256, 128, 3
    x = randn((b, cin, length), np.float32, 1)
    w = randn((cout, cin, k), np.float32, 2, scale=0.05)
    counts = {}
    for causal in (True, False):
        close(mod.conv1d_kernel(x, w, 2, causal), ref_conv1d(x, w, 2, causal))
        counts[causal] = _ops(mod.conv1d_kernel)
        assert counts[causal]["nc_matmul"] == b * 2 * 2 * k
        assert counts[causal]["nc_transpose"] == 2 * 2 * k
        prof = mod.conv1d_kernel.last_profile
        assert prof.stat("memory.hbm_read_bytes") == x.nbytes + w.nbytes
        assert prof.stat("engine.matmul_instruction_count") >= b * 2 * 2 * k
    assert counts[True] == counts[False]


# --------------------------------------------------------------------------------------------------
# ConvTranspose2d stride 2
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n,cin,cout,h,w,dtype", [
    (1, 128, 64, 14, 14, np.float32),
    (2, 256, 256, 16, 16, BF16),
])
def test_conv_transpose2d_s2_matches_numpy(cp, n, cin, cout, h, w, dtype):
    mod = cp[0]
    x = randn((n, cin, h, w), dtype, h)
    wt = randn((cin, cout, 2, 2), dtype, cout, scale=1.0 / np.sqrt(cin))
    got = mod.conv_transpose2d_s2_kernel(x, wt)
    assert got.shape == (n, cout, 2 * h, 2 * w)
    close(got, _out(ref_conv_transpose2d_s2(x, wt), dtype), dtype)


def test_conv_transpose2d_structure(cp):
    """4 taps x Cin-tiles matmuls per (image, Cout tile), each tap's PSUM result scattered by one copy into the
    strided (2h + kh, 2w + kw) positions, one contiguous store per (image, Cout tile): the output written once
    (4x the input pixels per channel)."""
    mod = cp[0]
    n, cin, cout, h, w = 2, 256, 256, 16, 16
    x = randn((n, cin, h, w), np.float32, 4)
    wt = randn((cin, cout, 2, 2), np.float32, 5, scale=0.06)
    close(mod.conv_transpose2d_s2_kernel(x, wt), ref_conv_transpose2d_s2(x, wt))
    c = _ops(mod.conv_transpose2d_s2_kernel)
    assert c["nc_matmul"] == n * 2 * 4 * 2 and c["tensor_copy"] == n * 2 * 4, c
    assert c["dma_copy"] == 2 + n * 2 + n * 2, c
    prof = mod.conv_transpose2d_s2_kernel.last_profile
    assert prof.stat("memory.hbm_write_bytes") == n * cout * 4 * h * w * 4
    assert prof.stat("memory.hbm_read_bytes") == x.nbytes + wt.nbytes


# --------------------------------------------------------------------------------------------------
# im2col conv2d
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n,cin,cout,h,w,dtype", [
    (1, 64, 128, 28, 28, np.float32),   # two row blocks of 18 rows (the last masked to 10)
    (2, 128, 256, 14, 14, BF16),
    (1, 64, 64, 56, 56, BF16),          # 7 row blocks of 9 rows, the last masked to 2
])
def test_conv2d_im2col_matches_numpy(cp, n, cin, cout, h, w, dtype):
    mod = cp[0]
    x = randn((n, cin, h, w), dtype, w)
    wt = randn((cout, cin, 3, 3), dtype, cin, scale=1.0 / np.sqrt(9 * cin))
    got = mod.conv2d_im2col_kernel(x, wt)
    close(got, _out(ref_conv2d(x, wt), dtype), dtype)


def test_im2col_moves_k_squared_times_the_input_unlike_shifted_matmuls(cp, vc):
    """The im2col gather reads every in-image tap: Cin * (3H - 2) * (3W - 2) elements, ~9x the input, in 9 DMAs
    (the padding mask splits into 3 x 3 boxes); the shifted-matmul conv (vision_contrib_style_kernels) reads the
    input once. Both issue 9 matmuls per output block."""
    n, cin, cout, h, w = 1, 64, 128, 16, 16   # (the shifted kernel needs OH * OW <= 512)
    x = randn((n, cin, h, w), np.float32, 11)
    wt = randn((cout, cin, 3, 3), np.float32, 12, scale=0.04)
    bias = np.zeros((cout,), np.float32)
    k = cp[0].conv2d_im2col_kernel
    close(k(x, wt), ref_conv2d(x, wt))
    c = _ops(k)
    blocks = 1  # 512 // 16 = 32 rows per PSUM bank
    assert c["nc_matmul"] == 9 * blocks and c["dma_copy"] == 1 + 9 + blocks, c
    im2col_x = k.last_profile.stat("memory.hbm_read_bytes") - wt.nbytes
    assert im2col_x == cin * (3 * h - 2) * (3 * w - 2) * 4
    s = vc[0].conv2d_3x3_kernel
    close(s(x, wt, bias), ref_conv2d(x, wt))
    shifted_x = s.last_profile.stat("memory.hbm_read_bytes") - wt.nbytes - bias.nbytes
    assert shifted_x == x.nbytes
    assert im2col_x > 8 * shifted_x


# --------------------------------------------------------------------------------------------------
# Depthwise-separable block
# --------------------------------------------------------------------------------------------------

def ref_dws(x, dw, pw, dtype):
    mid = np.maximum(ref_conv2d(x, dw, groups=x.shape[1]), 0.0)
    mid = _out(mid, dtype)
    return np.einsum("oc,nchw->nohw", f64(pw[:, :, 0, 0]), mid)


@pytest.mark.parametrize("n,c,cout,h,w,dtype", [
    (2, 256, 128, 14, 14, np.float32),
    (1, 64, 256, 16, 16, BF16),
])
def test_depthwise_separable_matches_numpy(cp, n, c, cout, h, w, dtype):
    mod = cp[0]
    x = randn((n, c, h, w), dtype, c)
    dw = randn((c, 1, 3, 3), dtype, 1, scale=0.3)
    pw = randn((cout, c, 1, 1), dtype, 2, scale=1.0 / np.sqrt(c))
    got = mod.depthwise_separable_kernel(x, dw, pw)
    close(got, _out(ref_dws(x, dw, pw, dtype), dtype), dtype)


def test_depthwise_separable_structure(cp):
    """Per (image, channel tile): the 5-D window load is 3 x 3 boxes = 9 DMAs, 1 multiply + 8 fused multiply-adds
    on VectorE, one ReLU; per (image, Cout tile): one matmul per channel tile and one store."""
    mod = cp[0]
    n, c, cout, h, w = 2, 256, 128, 14, 14
    x = randn((n, c, h, w), np.float32, 8)
    dw = randn((c, 1, 3, 3), np.float32, 9, scale=0.3)
    pw = randn((cout, c, 1, 1), np.float32, 10, scale=0.06)
    close(mod.depthwise_separable_kernel(x, dw, pw), ref_dws(x, dw, pw, np.float32))
    cnt = _ops(mod.depthwise_separable_kernel)
    tiles = n * 2
    assert cnt["dma_copy"] == 2 + 1 + tiles * 9 + n, cnt
    assert cnt["scalar_tensor_tensor"] == tiles * 8 and cnt["activation"] == tiles, cnt
    assert cnt["nc_matmul"] == n * 2, cnt
    prof = mod.depthwise_separable_kernel.last_profile
    assert prof.stat("memory.hbm_read_bytes") == (n * c * (3 * h - 2) * (3 * w - 2) * 4 + dw.nbytes + pw.nbytes)
