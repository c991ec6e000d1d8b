"""Transforms and rotations written like public ports of quantization, token-mixing, long-context and long-convolution
models (tests/python/kernels/transform_kernels.py, Beta 1, and transform_kernels_new.py, new dialect; both unmodified,
through ``nsim.compat``):

- the Walsh-Hadamard rotation of QuaRot / SpinQuant in both dialects, (a) as a matmul with the Sylvester matrix built
  on chip (``iota`` ids, ``bitwise_and``, the popcount parity folded by shifts and xors, larger sizes as a Kronecker
  product with compile-time signs) or an orthonormal rotation loaded from HBM, (b) as log2(n) butterfly stages on the
  free axis through strided views (Beta-1 arange expressions / ``0::2`` slices, new-dialect ``.ap`` patterns /
  ``0::2`` slices of a reshape), full and block-diagonal (per-head) sizes;
- FNet's token mixing (new dialect): the hidden-dim DFT by matmul with on-chip cos / sin matrices (``iota`` outer
  product, ``nl.cos`` / ``nl.sin``), the 2-D transform's real part (hidden dim, then sequence dim), and the complex
  product of packed real / imaginary tensors;
- RoPE variants (Beta 1): NTK-aware, YaRN and Llama-3 frequencies computed on chip (``exp`` of an ``iota``, the
  YaRN ramp over the pair index and Llama 3's over the wavelength ratio by ``maximum`` / ``minimum``, YaRN's attention
  factor), dynamic NTK with a runtime sequence length (``nl.log`` on chip),
  partial rotary (half-split and GPT-J interleaved pairs; the rest copied), for q tiles [S, H, D];
- the causal long convolution of Hyena / H3 (Beta 1) as a Toeplitz matmul whose blocks are overlapping HBM window
  reads of a zero-padded filter, depthwise or one filter per channel group, with the D * u skip term.

Checked: against float64 numpy (``np.fft``, HF's RoPE / YaRN / dynamic-NTK formulas, direct and FFT causal
convolutions; errors relative to the largest output: fp32 1e-5 unless noted, bf16 1e-2), bit-exact where the
arithmetic is exact (the on-chip Hadamard matrix rotating the identity, pass-through RoPE dims, the complex product's
fp32 operation order, causality of the long convolution), the two Hadamard forms and the two dialects against each
other, no sanitizer report (pytest makes nsim's CheckWarning an error), and structure / timing from the tilings:
matmul, transpose and VectorE instruction counts, HBM bytes of the Toeplitz windows, the matmul rotation faster than
the butterfly from n = 512 (n / 128 PE passes against 2 log2 n VectorE passes per token tile) and the butterfly's time
growing as n log n.

No nsim fix was needed: every kernel ran as written."""
import math

import numpy as np
import pytest

from conftest import require_core, sample_fixture  # noqa: E402
from conftest import op_counts as _ops  # noqa: E402

_core, ml_dtypes = require_core()
from numeric_helpers import close_to_max, f64 as _f64  # noqa: E402
from numeric_helpers import randn as _randn  # noqa: E402

BF16 = ml_dtypes.bfloat16

tb = sample_fixture("transform_kernels.py", module_only=True)
tn = sample_fixture("transform_kernels_new.py", module_only=True)

DIALECTS = ["tb", "tn"]


@pytest.fixture
def mod(request):
    """The kernel module of one dialect: the fixture ``tb`` or ``tn`` named by the (indirect) ``mod`` parameter."""
    return request.getfixturevalue(request.param)


def _rel(got, want):
    return np.abs(_f64(got) - want).max() / np.abs(want).max()


# --------------------------------------------------------------------------------------------------
# Walsh-Hadamard rotation
# --------------------------------------------------------------------------------------------------

def sylvester(n):
    """The n x n Sylvester Hadamard matrix by the recursion [[H, H], [H, -H]] (float64)."""
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h


def ref_hadamard(x, block=None):
    """x @ blockdiag(H_B, ..., H_B) / sqrt(B) in float64 (QuaRot's per-head rotation when B < n)."""
    n = x.shape[1]
    B = block or n
    return _f64(x) @ np.kron(np.eye(n // B), sylvester(B)) / math.sqrt(B)


def _butterfly_forms(m):
    return ("strided", "shuffle") if m.__name__.endswith("transform_kernels") else ("ap", "shuffle")


def test_sylvester_reference_is_the_parity_formula():
    """The recursion and H[i, j] = (-1)^popcount(i & j), the formula the kernels build on chip, agree."""
    i = np.arange(512)
    pc = np.array([bin(v).count("1") for v in (i[:, None] & i[None, :]).ravel()]).reshape(512, 512)
    assert np.array_equal(sylvester(512), 1.0 - 2.0 * (pc % 2))
    h = sylvester(256)
    assert np.array_equal(h @ h.T, 256 * np.eye(256))


# (N, n, block, dtype)
HAD_CASES = [
    ((256, 256, None, np.float32)),
    ((384, 512, 64, np.float32)),
    ((256, 512, 256, BF16)),
    ((512, 1024, None, np.float32)),
    ((256, 128, 32, BF16)),
]


@pytest.mark.parametrize("mod", DIALECTS, indirect=True)
@pytest.mark.parametrize("N,n,block,dtype", HAD_CASES)
def test_hadamard_forms_match_numpy_and_each_other(mod, N, n, block, dtype):
    """The matmul form and both butterfly forms against float64 numpy; in fp32 the forms agree with each other to
    1e-6 of the largest output (different summation orders), in bf16 their outputs round alike almost everywhere."""
    x = _randn((N, n), dtype, seed=N + n)
    want = ref_hadamard(x, block)
    mm = mod.hadamard_matmul(x, block=block)
    assert mm.dtype == np.dtype(dtype) and mm.shape == (N, n)
    close_to_max(mm, want, dtype)
    for form in _butterfly_forms(mod):
        bf = mod.hadamard_butterfly(x, block=block, form=form)
        close_to_max(bf, want, dtype)
        if dtype == np.float32:
            assert _rel(bf, _f64(mm)) < 1e-6
        else:
            assert np.mean(_f64(bf) != _f64(mm)) < 0.02


@pytest.mark.parametrize("mod", DIALECTS, indirect=True)
@pytest.mark.parametrize("n,block", [(128, None), (256, None), (512, None), (512, 128), (256, 64), (128, 16)])
def test_hadamard_matrix_built_on_chip_is_exact(mod, n, block):
    """Rotating the identity gives the matrix itself: every element of the on-chip (block-diagonal) Hadamard matrix is
    exactly +-1/sqrt(B) where numpy's is (one nonzero term per sum), and exactly 0 off the diagonal blocks."""
    B = block or n
    eye = np.eye(n, dtype=np.float32)
    want = np.kron(np.eye(n // B), sylvester(B)).astype(np.float32) * np.float32(1.0 / math.sqrt(B))
    assert np.array_equal(mod.hadamard_matmul(eye, block=block), want)
    assert np.array_equal(mod.hadamard_butterfly(eye, block=block), want)


@pytest.mark.parametrize("mod", DIALECTS, indirect=True)
def test_hadamard_is_an_involution_and_keeps_norms(mod):
    """H / sqrt(n) is symmetric and orthonormal: row norms are kept and rotating twice gives x back (fp32)."""
    x = _randn((256, 512), np.float32, seed=5)
    y = mod.hadamard_matmul(x)
    np.testing.assert_allclose(np.linalg.norm(_f64(y), axis=1), np.linalg.norm(_f64(x), axis=1), rtol=1e-6)
    close_to_max(mod.hadamard_butterfly(y), _f64(x), np.float32)
    # QuaRot's point: an outlier column is spread over all columns
    x[:, 7] = 100.0
    y = mod.hadamard_matmul(x)
    assert np.abs(y).max() < 0.2 * np.abs(x).max()


def _random_hadamard(n, seed):
    """QuaRot's random_hadamard_matrix: H diag(+-1) / sqrt(n)."""
    s = np.random.default_rng(seed).choice([-1.0, 1.0], n)
    return sylvester(n) * s[None, :] / math.sqrt(n)


def _random_orthogonal(n, seed):
    """A dense orthogonal rotation with entries other than +-1/sqrt(n) (standing in for SpinQuant's learned R): the
    orthonormal DCT-II matrix with random row signs (built directly: no LAPACK call)."""
    k, i = np.arange(n)[:, None], np.arange(n)[None, :]
    c = np.sqrt(2.0 / n) * np.cos(np.pi * (i + 0.5) * k / n)
    c[0] /= np.sqrt(2.0)
    return c * np.random.default_rng(seed).choice([-1.0, 1.0], n)[:, None]


@pytest.mark.parametrize("mod", DIALECTS, indirect=True)
@pytest.mark.parametrize("kind,n,block,dtype", [("hadamard", 256, None, np.float32), ("orthogonal", 512, None, BF16),
                                                ("orthogonal", 512, 128, np.float32),
                                                ("hadamard", 512, 256, np.float32)])
def test_hadamard_matmul_rotation_from_hbm(mod, kind, n, block, dtype):
    """An orthonormal rotation given from HBM (QuaRot's randomised Hadamard, SpinQuant's learned R) is applied as given,
    per block when ``block`` is set; no on-chip build (no iota) and no scaling."""
    B = block or n
    r = (_random_hadamard if kind == "hadamard" else _random_orthogonal)(B, seed=n)
    x = _randn((256, n), dtype, seed=11)
    got = mod.hadamard_matmul(x, rotation=r.astype(dtype), block=block)
    want = _f64(x) @ np.kron(np.eye(n // B), _f64(r.astype(dtype)))
    close_to_max(got, want, dtype)
    assert _ops(mod.hadamard_matmul)["iota"] == 0
    np.testing.assert_allclose(np.linalg.norm(_f64(got), axis=1), np.linalg.norm(_f64(x), axis=1),
                               rtol=1e-5 if dtype == np.float32 else 2e-2)


@pytest.mark.parametrize("mod", DIALECTS, indirect=True)
@pytest.mark.parametrize("N,n,block", [(512, 512, None), (256, 1024, None), (384, 512, 64), (256, 512, 256)])
def test_hadamard_structure(mod, N, n, block):
    """Matmul form: n / 128 PE transposes per token tile and, per (token tile, block, 512-column chunk), one matmul per
    128-row k-tile of the block (Bt = max(B, 128)); the on-chip matrix costs two iotas (H_128) whatever n.
    Butterfly: 2 log2(B) VectorE tensor_tensor per token tile, no matmul."""
    B = block or n
    Bt = max(B, 128)
    NT = N // 128
    x = _randn((N, n), BF16, seed=3)
    mod.hadamard_matmul(x, block=block)
    ops = _ops(mod.hadamard_matmul)
    assert ops["nc_matmul"] == NT * (n // Bt) * (Bt // min(Bt, 512)) * (Bt // 128), ops
    assert ops["nc_transpose"] == NT * n // 128 and ops["iota"] == 2, ops
    for form in _butterfly_forms(mod):
        mod.hadamard_butterfly(x, block=block, form=form)
        ops = _ops(mod.hadamard_butterfly)
        assert ops["tensor_tensor"] == NT * 2 * int(math.log2(B)) and ops["nc_matmul"] == 0, ops


def test_hadamard_dialects_agree_bit_for_bit(tb, tn):
    """The Beta-1 and new-dialect kernels compute the same thing in the same order: equal bits (fp32 and bf16)."""
    x32 = _randn((256, 512), np.float32, seed=8)
    x16 = x32.astype(BF16)
    r1 = [tb.hadamard_matmul(x32), tb.hadamard_matmul(x16, block=64), tb.hadamard_butterfly(x32, form="shuffle"),
          tb.hadamard_butterfly(x32, form="strided")]
    r2 = [tn.hadamard_matmul(x32), tn.hadamard_matmul(x16, block=64), tn.hadamard_butterfly(x32, form="shuffle"),
          tn.hadamard_butterfly(x32, form="ap")]
    for a, b in zip(r1, r2):
        assert a.dtype == b.dtype and np.array_equal(a.view(np.uint8), b.view(np.uint8))


@pytest.mark.parametrize("mod", DIALECTS, indirect=True)
def test_hadamard_timing_matmul_against_butterfly(mod):
    """512 bf16 tokens: from n = 512 the matmul form (n / 128 PE passes of 512 columns) is at least twice as fast as
    the butterfly (2 log2 n VectorE passes over the fp32 row), and the butterfly's time grows as n log n (512 -> 2048:
    x 4.9 within 20 %). Both forms time as their unrolled traces (at n = 2048: 70,007.4 and 143,459.0 ns, 2.05x);
    kept, the Beta 1 butterfly ran 151,926.5 ns before its lines' tiles rotated as unrolled (docs/kernel-json.md "A
    line taken several times per iteration") and its matmul form 71,996.5 ns before the K loop was peeled to fold
    the PSUM zero fill into its first matmul."""
    t_mm, t_bf = {}, {}
    for n in (512, 2048):
        x = _randn((512, n), BF16, seed=n)
        mod.hadamard_matmul(x)
        t_mm[n] = mod.hadamard_matmul.last_profile.total_time_ns
        mod.hadamard_butterfly(x)
        t_bf[n] = mod.hadamard_butterfly.last_profile.total_time_ns
        assert 2 * t_mm[n] < t_bf[n], (n, t_mm, t_bf)
    assert 0.8 * 4 * 11 / 9 < t_bf[2048] / t_bf[512] < 1.2 * 4 * 11 / 9, t_bf


# --------------------------------------------------------------------------------------------------
# DFT by matmul, FNet, complex product (new dialect)
# --------------------------------------------------------------------------------------------------

def _packed(z):
    return np.stack([z.real, z.imag], -1)


@pytest.mark.parametrize("N,D,dtype", [(256, 256, np.float32), (128, 384, np.float32), (384, 128, BF16),
                                       (128, 512, np.float32)])
def test_dft_hidden_matches_fft(tn, N, D, dtype):
    """X = fft(x, axis=-1) packed [N, D, 2] (real, imaginary): against np.fft.fft; bf16 operands (x and the cos / sin
    matrices in bf16, fp32 accumulation) within 1e-2. 2 matmuls (cos, sin) per (token tile, 512-column chunk,
    k-tile)."""
    x = _randn((N, D), dtype, seed=D)
    got = tn.dft_hidden(x)
    assert got.shape == (N, D, 2) and got.dtype == np.float32
    close_to_max(got, _packed(np.fft.fft(_f64(x), axis=-1)), dtype)
    ops = _ops(tn.dft_hidden)
    NT, KT = N // 128, D // 128
    assert ops["nc_matmul"] == NT * 2 * (D // min(D, 512)) * KT and ops["nc_transpose"] == NT * KT, ops


@pytest.mark.parametrize("B,S,D,dtype", [(2, 256, 256, np.float32), (1, 384, 128, np.float32),
                                         (2, 128, 512, BF16), (1, 512, 256, BF16)])
def test_fnet_fourier_matches_fft2(tn, B, S, D, dtype):
    """Re(fft2(x)) over (sequence, hidden) against numpy; the imaginary part of the hidden-dim DFT matters (C_S x C_D
    alone is far off). Matmuls: per batch, 2 * NS * KT per 512-column chunk for the hidden dim, 2 * NS * NS per
    chunk for the sequence dim; one PE transpose per (sequence tile, hidden k-tile)."""
    x = _randn((B, S, D), dtype, seed=S + D)
    got = tn.fnet_fourier(x)
    assert got.shape == (B, S, D) and got.dtype == np.dtype(dtype)
    want = np.fft.fft2(_f64(x), axes=(-2, -1)).real
    close_to_max(got, want, dtype)
    # the order of the two 1-D transforms does not matter; FNet's is hidden first
    np.testing.assert_allclose(np.fft.fft(np.fft.fft(_f64(x), axis=-1), axis=-2).real, want, atol=1e-9)
    cs = np.cos(2 * np.pi * np.outer(np.arange(S), np.arange(S)) / S)
    cd = np.cos(2 * np.pi * np.outer(np.arange(D), np.arange(D)) / D)
    assert _rel(cs @ _f64(x) @ cd, want) > 0.1
    NS, KT, NO = S // 128, D // 128, D // min(D, 512)
    ops = _ops(tn.fnet_fourier)
    assert ops["nc_matmul"] == B * NO * (2 * NS * KT + 2 * NS * NS), ops
    assert ops["nc_transpose"] == B * NS * KT, ops


@pytest.mark.parametrize("N,F,Nw,dtype", [(256, 64, 256, np.float32), (200, 96, 1, np.float32),
                                          (384, 128, 384, BF16), (100, 33, 1, BF16)])
def test_complex_mul_packed(tn, N, F, Nw, dtype):
    """x * w for [N, F, 2] packed complex tensors, w per row or one [1, F, 2] filter for all rows (ragged N): equal to
    numpy's fp32 (re = xr wr - xi wi, im = xr wi + xi wr, each product rounded) bit for bit before the output cast;
    6 VectorE instructions per row tile."""
    x = _randn((N, F, 2), dtype, seed=N)
    w = _randn((Nw, F, 2), dtype, seed=N + 1)
    got = tn.complex_mul(x, w)
    assert got.shape == (N, F, 2) and got.dtype == np.dtype(dtype)
    xr, xi = x[..., 0].astype(np.float32), x[..., 1].astype(np.float32)
    wr = np.broadcast_to(w[..., 0], (N, F)).astype(np.float32)
    wi = np.broadcast_to(w[..., 1], (N, F)).astype(np.float32)
    want = np.stack([xr * wr - xi * wi, xr * wi + xi * wr], -1).astype(dtype)
    assert np.array_equal(got.view(np.uint8), want.view(np.uint8))
    assert _ops(tn.complex_mul)["tensor_tensor"] == 6 * -(-N // 128)


def test_dft_and_complex_mul_give_the_convolution_theorem(tn):
    """fft(x) * fft(h) = fft(x circularly convolved with h): the two kernels chained (DFT of x and of h, their packed
    complex product) equal the DFT kernel applied to numpy's circular convolution (fp32, 1e-5 of the largest)."""
    N, D = 128, 256
    x = _randn((N, D), np.float32, seed=1)
    h = _randn((N, D), np.float32, seed=2)
    prod = tn.complex_mul(tn.dft_hidden(x), tn.dft_hidden(h))
    conv = np.real(np.fft.ifft(np.fft.fft(_f64(x), axis=-1) * np.fft.fft(_f64(h), axis=-1), axis=-1))
    close_to_max(prod, _f64(tn.dft_hidden(conv.astype(np.float32))), np.float32)
    close_to_max(prod, _packed(np.fft.fft(conv, axis=-1)), np.float32)


# --------------------------------------------------------------------------------------------------
# RoPE: NTK-aware, YaRN, dynamic NTK, partial rotary (Beta 1)
# --------------------------------------------------------------------------------------------------

def ref_inv_freq(R, base=10000.0, scaling=None, factor=1.0, L0=2048, beta_fast=32.0, beta_slow=1.0, seq_len=None,
                 low_freq_factor=1.0, high_freq_factor=4.0):
    """HF's inv_freq (float64) and the attention factor for rope_type default / NTK-aware / yarn / llama3 / dynamic."""
    if scaling == "ntk":
        base = base * factor ** (R / (R - 2))
    if seq_len is not None and seq_len > L0:  # DynamicNTKScalingRotaryEmbedding
        base = base * ((factor * seq_len / L0) - (factor - 1)) ** (R / (R - 2))
    inv = 1.0 / base ** (np.arange(0, R, 2) / R)
    if scaling == "llama3":  # _compute_llama3_parameters, as written there
        low_wl, high_wl = L0 / low_freq_factor, L0 / high_freq_factor
        wavelen = 2 * math.pi / inv
        inv_l = np.where(wavelen > low_wl, inv / factor, inv)
        smooth = (L0 / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
        smoothed = (1 - smooth) * inv_l / factor + smooth * inv_l
        medium = ~(wavelen < high_wl) & ~(wavelen > low_wl)
        return np.where(medium, smoothed, inv_l), 1.0
    if scaling != "yarn":
        return inv, 1.0

    def dim_of(rot):
        return (R * math.log(L0 / (rot * 2 * math.pi))) / (2 * math.log(base))
    low, high = max(math.floor(dim_of(beta_fast)), 0), min(math.ceil(dim_of(beta_slow)), R - 1)
    if low == high:
        high += 0.001
    extrapolation = 1 - np.clip((np.arange(R // 2) - low) / (high - low), 0, 1)
    inv = inv / factor * (1 - extrapolation) + inv * extrapolation
    return inv, (0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0)


def ref_rope(q, R, inv, mscale=1.0, pos_offset=0, interleaved=False):
    """HF apply_rotary_pos_emb on the first R dims of q [S, H, D] (rotate_half, or GPT-J's rotate_every_two), the rest
    passed through, in float64."""
    q = _f64(q)
    S = q.shape[0]
    ang = (np.arange(S) + pos_offset)[:, None] * inv[None, :]
    c, s = (np.cos(ang) * mscale)[:, None, :], (np.sin(ang) * mscale)[:, None, :]
    out = q.copy()
    i1, i2 = (slice(0, R, 2), slice(1, R, 2)) if interleaved else (slice(0, R // 2), slice(R // 2, R))
    x1, x2 = q[..., i1], q[..., i2]
    out[..., i1] = x1 * c - x2 * s
    out[..., i2] = x2 * c + x1 * s
    return out


def _rope_check(got, want, dtype, max_pos):
    """fp32: the angle (position x frequency) carries fp32 rounding ~ max_pos * 2^-24 (in HF's fp32 as here), so the
    error bound grows with the positions: max_pos * 2^-22 of the largest output. bf16: 1e-2 of the largest."""
    if dtype == np.float32:
        err = _rel(got, want)
        assert err < max(1e-5, max_pos * 2.0 ** -22), (err, max_pos)
    else:
        close_to_max(got, want, dtype)


# (S, H, D, R, scaling, factor, L0, pos_offset, interleaved, dtype)
ROPE_CASES = [
    (256, 4, 128, 64, "yarn", 4.0, 2048, 0, False, np.float32),
    (256, 4, 96, 64, "yarn", 8.0, 2048, 4096, True, np.float32),
    (384, 2, 64, 32, "ntk", 2.0, 2048, 100, True, np.float32),
    (256, 8, 128, 128, None, 1.0, 2048, 0, False, BF16),
    (512, 2, 256, 64, None, 1.0, 2048, 0, True, BF16),           # GPT-J: rotary_dim 64 of head_dim 256, interleaved
    (256, 4, 80, 32, "yarn", 16.0, 4096, 8192, False, BF16),
    (256, 4, 128, 128, "llama3", 8.0, 8192, 0, False, np.float32),  # Llama 3.1: factor 8, low 1, high 4, L 8192
    (384, 2, 64, 64, "llama3", 32.0, 8192, 2048, False, BF16),      # Llama 3.2: factor 32
]


@pytest.mark.parametrize("S,H,D,R,scaling,factor,L0,off,il,dtype", ROPE_CASES)
def test_rope_scaled_matches_hf(tb, S, H, D, R, scaling, factor, L0, off, il, dtype):
    """Partial RoPE with on-chip NTK-aware / YaRN / Llama-3 frequencies against HF's formulas; the dims past rotary_dim are the
    input's bits; the scaling and the pair layout matter (the unscaled / other-layout result is far off)."""
    q = _randn((S, H, D), dtype, seed=S + R)
    got = tb.rope_scaled(q, R, scaling=scaling, factor=factor, original_max_position=L0, pos_offset=off,
                         interleaved=il)
    assert got.shape == (S, H, D) and got.dtype == np.dtype(dtype)
    inv, msc = ref_inv_freq(R, scaling=scaling, factor=factor, L0=L0)
    want = ref_rope(q, R, inv, msc, off, il)
    _rope_check(got, want, dtype, S + off)
    if R < D:
        assert np.array_equal(got[..., R:].view(np.uint8), q[..., R:].view(np.uint8))
    if scaling is not None:
        assert _rel(ref_rope(q, R, ref_inv_freq(R)[0], 1.0, off, il), want) > 0.05
    assert _rel(ref_rope(q, R, inv, msc, off, not il), want) > 0.05


def test_rope_yarn_frequencies_by_band(tb):
    """YaRN leaves the high-frequency pairs (below the beta_fast correction dim) as they were, divides the
    low-frequency ones (past beta_slow) by the factor and blends in between: rotating a unit vector per pair at
    position 1000 (pos_offset) reads back each pair's angle, checked against HF's inv_freq band by band."""
    R, factor, L0 = 128, 4.0, 2048
    q = np.zeros((128, 1, R), np.float32)
    q[..., :R // 2] = 1.0  # x1 = 1, x2 = 0: out = (cos, sin) of the pair's angle, times the attention factor
    got = _f64(tb.rope_scaled(q, R, scaling="yarn", factor=factor, original_max_position=L0, pos_offset=1000))
    msc = 0.1 * math.log(factor) + 1.0
    ang = np.arctan2(got[0, 0, R // 2:], got[0, 0, :R // 2])
    np.testing.assert_allclose(np.hypot(got[0, 0, R // 2:], got[0, 0, :R // 2]), msc, rtol=1e-5)
    inv, _ = ref_inv_freq(R, scaling="yarn", factor=factor, L0=L0)
    base_inv, _ = ref_inv_freq(R)
    np.testing.assert_allclose(np.cos(ang - 1000 * inv), 1.0, atol=1e-6)
    low, high = tb.yarn_correction_range(R, 10000.0, L0, 32.0, 1.0)
    j = np.arange(R // 2)
    assert np.allclose(inv[j <= low], base_inv[j <= low]) and np.allclose(inv[j >= high], base_inv[j >= high] / factor)
    mid = (j > low) & (j < high)
    assert mid.any() and np.all((inv[mid] < base_inv[mid]) & (inv[mid] > base_inv[mid] / factor))


@pytest.mark.parametrize("S,H,D,R,factor,seq_len,il", [(256, 4, 128, 64, 2.0, 5000.0, False),
                                                       (256, 4, 64, 64, 4.0, 3000.0, True),
                                                       (384, 2, 128, 96, 2.0, 1000.0, False)])
def test_rope_dynamic_ntk_runtime_length(tb, S, H, D, R, factor, seq_len, il):
    """Dynamic NTK with the sequence length as a runtime tensor: matches HF's DynamicNTKScalingRotaryEmbedding (the
    base grows only past original_max_position = 2048); the traced kernel does not depend on the length (same IR for
    two lengths: the base is computed on chip with nl.log / nl.maximum / nl.exp), and below the original maximum it
    gives the unscaled rotation."""
    q = _randn((S, H, D), np.float32, seed=R)
    k = tb.rope_dynamic_ntk
    got = k(q, np.array([[seq_len]], np.float32), R, factor=factor, interleaved=il)
    ir = k.last_json["body"]
    inv, _ = ref_inv_freq(R, factor=factor, seq_len=seq_len)
    want = ref_rope(q, R, inv, interleaved=il)
    _rope_check(got, want, np.float32, S)
    short = k(q, np.array([[1500.0]], np.float32), R, factor=factor, interleaved=il)
    assert k.last_json["body"] == ir
    _rope_check(short, ref_rope(q, R, ref_inv_freq(R)[0], interleaved=il), np.float32, S)
    if seq_len > 2048:
        assert _rel(short, want) > 0.05
    assert [o.get("act") for o in ir if o.get("op") == "activation"][:2] == ["log", "exp"]


def test_rope_structure(tb):
    """Per token tile: one [128, H, D] load and store, cos (range reduction + sin) and sin on ScalarE, 4 multiplies and
    2 adds on VectorE whatever H (cos / sin [128, 1, R/2] broadcast over the heads as stride-0 views), one copy of the
    pass-through dims; the frequencies once (one exp)."""
    S, H, D, R = 512, 8, 128, 32
    q = _randn((S, H, D), BF16, seed=2)
    tb.rope_scaled(q, R)
    ops = _ops(tb.rope_scaled)
    NT = S // 128
    assert ops["dma_copy"] == 2 * NT and ops["activation"] == 1 + 2 * NT, ops
    assert ops["tensor_tensor"] == 6 * NT and ops["tensor_copy"] == NT, ops


# --------------------------------------------------------------------------------------------------
# Hyena-style causal long convolution as a Toeplitz matmul (Beta 1)
# --------------------------------------------------------------------------------------------------

def ref_long_conv(u, k, d):
    """y[b, h, t] = sum_{s <= t} k[g(h), t - s] u[b, h, s] + d[h] u[b, h, t] (float64, direct sums)."""
    u, k, d = _f64(u), _f64(k), _f64(d)
    B, H, L = u.shape
    cg = H // k.shape[0]
    y = np.zeros_like(u)
    for h in range(H):
        for b in range(B):
            y[b, h] = np.convolve(u[b, h], k[h // cg])[:L]
    return y + u * d[0][None, :, None]


def ref_fftconv(u, k, d):
    """H3 / Hyena's fftconv: irfft(rfft(u, 2L) * rfft(k, 2L))[:L] + u * D (float64)."""
    u, k, d = _f64(u), _f64(k), _f64(d)
    L = u.shape[-1]
    kk = np.repeat(k, u.shape[1] // k.shape[0], axis=0)
    y = np.fft.irfft(np.fft.rfft(u, n=2 * L) * np.fft.rfft(kk, n=2 * L)[None], n=2 * L)[..., :L]
    return y + u * d[0][None, :, None]


def _conv_inputs(B, H, L, G, dtype, seed):
    rng = np.random.default_rng(seed)
    u = _randn((B, H, L), dtype, seed)
    decay = np.exp(-np.arange(L) / (L / 4))[None, :]  # a Hyena-like decaying implicit filter
    k = (rng.standard_normal((G, L)) * decay * 0.3).astype(dtype)
    d = rng.standard_normal((1, H)).astype(np.float32)
    return u, k, d


# (B, H, L, G, dtype)
CONV_CASES = [(4, 8, 256, 8, np.float32), (2, 64, 512, 4, BF16), (8, 16, 384, 16, np.float32),
              (1, 32, 512, 1, BF16)]


@pytest.mark.parametrize("B,H,L,G,dtype", CONV_CASES)
def test_hyena_long_conv_matches_numpy(tb, B, H, L, G, dtype):
    """Against direct causal sums and against the FFT convolution Hyena computes (the two references agree to 1e-10);
    the skip term and the filter's tail (taps past 128) matter."""
    u, k, d = _conv_inputs(B, H, L, G, dtype, seed=L + H)
    got = tb.hyena_long_conv(u, k, d)
    assert got.shape == (B, H, L) and got.dtype == np.dtype(dtype)
    want = ref_long_conv(u, k, d)
    assert np.abs(ref_fftconv(u, k, d) - want).max() < 1e-10 * np.abs(want).max()
    close_to_max(got, want, dtype)
    assert _rel(ref_long_conv(u, k, 0 * d), want) > 0.1
    k_short = k.copy()
    k_short[:, 128:] = 0
    assert _rel(ref_long_conv(u, k_short, d), want) > 1e-3


def test_hyena_long_conv_is_causal(tb):
    """Changing u from position t0 on leaves every output before t0 bit-identical (fp32, t0 = 300, inside a tile)."""
    u, k, d = _conv_inputs(2, 8, 512, 2, np.float32, seed=4)
    y1 = tb.hyena_long_conv(u, k, d)
    u2 = u.copy()
    u2[..., 300:] = _randn(u2[..., 300:].shape, np.float32, seed=99)
    y2 = tb.hyena_long_conv(u2, k, d)
    assert np.array_equal(y1[..., :300], y2[..., :300])
    assert not np.allclose(y1[..., 300:], y2[..., 300:])


@pytest.mark.parametrize("B,H,L,G", [(4, 8, 256, 8), (2, 64, 512, 4), (1, 32, 512, 1)])
def test_hyena_long_conv_structure(tb, B, H, L, G):
    """Causal block skipping: NT (NT + 1) / 2 Toeplitz blocks per group, one matmul each (B * H / G sequences per
    matmul), but only NT distinct window reads (one per block diagonal). HBM reads: u once, the NT [128, 128] windows
    of each padded filter, the filters and the skip weights (broadcast to 128 partitions); the padded scratch written
    once (zeros + filters)."""
    u, k, d = _conv_inputs(B, H, L, G, BF16, seed=1)
    kern = tb.hyena_long_conv
    kern(u, k, d)
    NT = L // 128
    ops = _ops(kern)
    assert ops["nc_matmul"] == G * NT * (NT + 1) // 2, ops
    assert ops["dma_copy"] == 3 + G * (1 + NT + NT + NT), ops
    p = kern.last_profile
    item = np.dtype(BF16).itemsize
    reads = u.nbytes + G * NT * 128 * 128 * item + k.nbytes + G * 128 * (H // G) * 4
    assert p.stat("memory.hbm_read_bytes") == reads
    assert p.stat("memory.hbm_write_bytes") == u.nbytes + G * (2 * L - 1) * item
