"""MX (microscaling) on gen4 (trn3): the x4-packed dtypes, ``nisa.quantize_mx`` and ``nisa.nc_matmul_mx``
(nki-api.md 2.3, 3.2; neuroncore.md 3.1, 3.2, C12). Numerics against a numpy reference written here,
independently of nsim: fp8/fp4 decoded with ml_dtypes, scales applied as 2^(byte - 127)."""

import numpy as np
import pytest

from conftest import require_core  # noqa: E402

_core, ml_dtypes = require_core()

from nsim import _errors, nki  # noqa: E402
import nsim.nki.language as nl  # noqa: E402
import nsim.nki.isa as nisa  # noqa: E402
from nki_helpers import load as _load, store as _store  # noqa: E402
import nsim.nki.beta1.language as b1nl  # noqa: E402

BF16 = ml_dtypes.bfloat16
FP8 = {"float8_e4m3fn_x4": ml_dtypes.float8_e4m3fn, "float8_e5m2_x4": ml_dtypes.float8_e5m2}
EMAX = {"float8_e4m3fn_x4": 8, "float8_e5m2_x4": 15}  # OCP MX element emax
X4 = {"float8_e4m3fn_x4": nl.float8_e4m3fn_x4, "float8_e5m2_x4": nl.float8_e5m2_x4,
      "float4_e2m1fn_x4": nl.float4_e2m1fn_x4}


def _code(name):
    return _errors.code(name)


def _raises(name, fn, *args):
    with pytest.raises(Exception) as ei:
        fn(*args)
    assert getattr(ei.value, "code", None) == _code(name), str(ei.value)
    return ei.value


# ---- numpy reference -------------------------------------------------------------------------------


def scale_row(g):
    """Row of the scale view holding the scale of 8-partition group g (its quadrant's rows 0..3)."""
    return (g // 4) * 32 + g % 4


def ref_quantize(x, tname):
    """(packed uint32 [P, F/4], scale bytes [P/8, F/4]) of x [P, F] (float values), by the spec's formula."""
    x = np.asarray(x, np.float64)
    P, F = x.shape
    emax, f8 = EMAX[tname], FP8[tname]
    fmax = float(ml_dtypes.finfo(f8).max)
    codes = np.zeros((P, F), np.uint8)
    scales = np.zeros((P // 8, F // 4), np.uint8)
    for g in range(P // 8):
        for j in range(F // 4):
            blk = x[8 * g:8 * g + 8, 4 * j:4 * j + 4]
            amax = np.abs(blk).max()
            e = -127 if amax == 0 else int(np.clip(np.floor(np.log2(amax)) - (emax - 1), -127, 127))
            scales[g, j] = e + 127
            q = np.clip(blk / 2.0 ** e, -fmax, fmax).astype(np.float32).astype(f8)
            codes[8 * g:8 * g + 8, 4 * j:4 * j + 4] = q.view(np.uint8)
    packed = codes.reshape(P, F // 4, 4).copy().view("<u4").reshape(P, F // 4)
    return packed, scales


def decode_x4(bits, tname):
    """fp64 values [K, C, 4] of x4 data given as its packed unsigned bits [K, C]."""
    bits = np.asarray(bits)
    if tname == "float4_e2m1fn_x4":
        b = bits.astype("<u2").view(np.uint8).reshape(bits.shape + (2,))
        nib = np.stack([b[..., 0] & 15, b[..., 0] >> 4, b[..., 1] & 15, b[..., 1] >> 4], axis=-1)
        return nib.astype(np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float64)  # one value per byte
    b = bits.astype("<u4").view(np.uint8).reshape(bits.shape + (4,))
    return b.view(FP8[tname]).astype(np.float64)


def dequant(bits, tname, scale_view):
    """[K, C, 4] values times 2^(scale - 127), the scale of packed row k on row scale_row(k // 8)."""
    K = bits.shape[0]
    s = np.stack([scale_view[scale_row(k // 8)] for k in range(K)]).astype(np.float64)
    return decode_x4(bits, tname) * (2.0 ** (s - 127))[:, :, None]


def ref_matmul_mx(st_bits, st_t, ss, mv_bits, mv_t, ms):
    """(result [M, N], sum of |terms| [M, N]) in float64: sum over k, q of st[k, m, q] mv[k, n, q]."""
    a = dequant(st_bits, st_t, ss)  # [K, M, 4]
    b = dequant(mv_bits, mv_t, ms)  # [K, N, 4]
    a2 = a.transpose(0, 2, 1).reshape(-1, a.shape[1])
    b2 = b.transpose(0, 2, 1).reshape(-1, b.shape[1])
    return a2.T @ b2, np.abs(a2).T @ np.abs(b2)


def rand_x4(shape, tname, rng):
    """Random packed bits of an x4 type without NaN codes."""
    if tname == "float4_e2m1fn_x4":
        return rng.integers(0, 1 << 16, size=shape, dtype=np.uint32).astype(np.uint16)
    b = rng.integers(0, 256, size=shape + (4,), dtype=np.uint8)
    vals = b.view(FP8[tname]).astype(np.float32)
    b = np.where(np.isfinite(vals), b, 0).astype(np.uint8)
    return b.view("<u4").reshape(shape)


def scale_tile(rng, P, C, lo=120, hi=135):
    """A [P, C] uint8 scale tile with random bytes on the rows the placement uses, 0xEE elsewhere."""
    s = np.full((P, C), 0xEE, np.uint8)
    for g in range(P // 8):
        s[scale_row(g)] = rng.integers(lo, hi, size=C)
    return s


# ---- kernels ---------------------------------------------------------------------------------------


def quant_kernel(tname, scale_rows=None, scale_start=0, sentinel=0xEE, memset=True, scale_dtype=np.uint8):
    @nki.jit
    def k(x):
        P, F = x.shape
        xt = _load(x)
        q = nl.ndarray((P, F // 4), X4[tname], buffer=nl.sbuf)
        rows = scale_rows or P
        s = nl.ndarray((rows, F // 4), scale_dtype, buffer=nl.sbuf)
        if memset:
            nisa.memset(s, sentinel)
        nisa.quantize_mx(q, xt, s[scale_start:rows, :])
        return _store(q), _store(s)
    return k


def mm_kernel(st_t, mv_t, dst_dtype=np.float32, accumulate=None, twice=False):
    @nki.jit
    def k(st, mv, ss, ms):
        K, M = st.shape
        N = mv.shape[1]
        a, b = _load(st), _load(mv)
        sa, sb = _load(ss), _load(ms)
        ps = nl.ndarray((M, N), dst_dtype, buffer=nl.psum)
        nisa.nc_matmul_mx(ps, a, b, sa, sb, accumulate=accumulate)
        if twice:
            nisa.nc_matmul_mx(ps, a, b, sa, sb, accumulate=accumulate)
        r = nl.ndarray((M, N), np.float32, buffer=nl.sbuf)
        nisa.tensor_copy(r, ps)
        return _store(r)
    return k


def _host(bits, tname):
    return np.ascontiguousarray(bits).view(X4[tname])


# ---- dtypes ----------------------------------------------------------------------------------------


def test_x4_dtypes_are_distinct_structured_dtypes():
    a, b, c = nl.float8_e5m2_x4, nl.float8_e4m3fn_x4, nl.float4_e2m1fn_x4
    assert (a.itemsize, b.itemsize, c.itemsize) == (4, 4, 2)
    assert len({a, b, c}) == 3 and a != np.dtype(np.uint32) and b != np.dtype(np.uint32)
    assert c != np.dtype(np.uint16)
    assert np.zeros(3, np.uint32).view(a).dtype == a  # the host view of packed uint32 data
    assert nl.float8_e8m0fnu == ml_dtypes.float8_e8m0fnu
    # the same names in the Beta-1 language module; the ops are new-dialect only (coverage: n/a)
    assert b1nl.float8_e4m3fn_x4 == b and b1nl.float4_e2m1fn_x4 == c
    import nsim.nki.beta1.isa as b1isa
    assert not hasattr(b1isa, "quantize_mx") and not hasattr(b1isa, "nc_matmul_mx")


def test_x4_has_no_cast_path():
    @nki.jit
    def to_f32(x):
        t = _load(x)
        f = nl.ndarray(x.shape, np.float32, buffer=nl.sbuf)
        nisa.tensor_copy(f, t)
        return _store(f)

    @nki.jit
    def dma_to_u32(x):
        t = _load(x)
        out = nl.ndarray(x.shape, np.uint32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t)
        return out

    x = _host(np.zeros((32, 4), np.uint32), "float8_e4m3fn_x4")
    _raises("MxNoCast", to_f32.options(config="trn3"), x)
    _raises("MxNoCast", dma_to_u32.options(config="trn3"), x)


def test_x4_copy_keeps_the_bits():
    @nki.jit
    def copy(x):
        return _store(_load(x))

    bits = np.arange(32 * 8, dtype=np.uint32).reshape(32, 8) * 0x01010101
    out = copy.options(config="trn3")(_host(bits, "float8_e5m2_x4"))
    assert out.dtype == nl.float8_e5m2_x4
    np.testing.assert_array_equal(out.view(np.uint32), bits)


# ---- quantize_mx -----------------------------------------------------------------------------------


def test_quantize_mx_hand_computed_bits():
    # Group 0 (partitions 0..7, elements 0..3) holds row 0 = [1, -2, 0.5, 3], zeros elsewhere: amax 3,
    # floor(log2 3) = 1. e4m3fn (Emax 8): X = 2^(1 - 7) = 2^-6, scale byte 121; v / X = 64, -128, 32, 192 =
    # 0x68, 0xF0, 0x60, 0x74 (bias 7: 2^6 -> exp 13, 2^7 -> exp 14, 2^5 -> exp 12, 1.5 * 2^7 -> exp 14 mant 100),
    # packed element 0 in the low byte: 0x7460F068. e5m2 (Emax 15): X = 2^(1 - 14) = 2^-13, byte 114;
    # v / X = 2^13, -2^14, 2^12, 3 * 2^13 = 1.5 * 2^14 = 0x70, 0xF4, 0x6C, 0x76 (bias 15) -> 0x766CF470.
    # All-zero groups: X = 2^-127, scale byte 0, data 0. The scale view starts at partition 4 (offset 4 of
    # quadrant 0): groups 0..3 go to tile rows 4..7, the other rows keep the memset sentinel 0xEE.
    x = np.zeros((32, 4), np.float32)
    x[0] = [1, -2, 0.5, 3]
    for tname, word, byte in (("float8_e4m3fn_x4", 0x7460F068, 121), ("float8_e5m2_x4", 0x766CF470, 114)):
        q, s = quant_kernel(tname, scale_rows=16, scale_start=4).options(config="trn3")(x.astype(BF16))
        assert q.dtype == X4[tname] and q.shape == (32, 1)
        want = np.zeros((32, 1), np.uint32)
        want[0, 0] = word
        np.testing.assert_array_equal(q.view(np.uint32), want)
        want_s = np.full((16, 1), 0xEE, np.uint8)
        want_s[4:8, 0] = [byte, 0, 0, 0]
        np.testing.assert_array_equal(s, want_s)
        # the same with a float8_e8m0fnu scale tile (the scale's own dtype: 2^(byte - 127))
        _, s8 = quant_kernel(tname, scale_rows=16, scale_start=4, sentinel=1.0,  # memset 1.0 = byte 127
                             scale_dtype=nl.float8_e8m0fnu).options(config="trn3")(x.astype(BF16))
        assert s8.dtype == ml_dtypes.float8_e8m0fnu
        want_s[:] = 127
        want_s[4:8, 0] = [byte, 0, 0, 0]
        np.testing.assert_array_equal(s8.view(np.uint8), want_s)
        assert s8[4, 0].astype(np.float64) == 2.0 ** (byte - 127)


@pytest.mark.parametrize("tname", ["float8_e4m3fn_x4", "float8_e5m2_x4"])
@pytest.mark.parametrize("src_dtype", [BF16, np.float16])
def test_quantize_mx_matches_reference_and_round_trips(tname, src_dtype):
    rng = np.random.default_rng(7)
    P, F = 128, 64
    # magnitudes spread over 2^-6 .. 2^6 per row so groups get different scales
    x = (rng.standard_normal((P, F)) * 2.0 ** rng.integers(-6, 7, size=(P, 1))).astype(src_dtype)
    q, s = quant_kernel(tname).options(config="trn3")(x)
    packed, scales = ref_quantize(x.astype(np.float64), tname)
    np.testing.assert_array_equal(q.view(np.uint32), packed)  # bit-exact vs the numpy reference
    for g in range(P // 8):
        np.testing.assert_array_equal(s[scale_row(g)], scales[g])
    used = {scale_row(g) for g in range(P // 8)}
    assert all((s[r] == 0xEE).all() for r in range(P) if r not in used)  # other rows untouched
    # dequantize and compare to the source: each value within half an fp8 ulp (relative 2^-(m+1), m the
    # mantissa bits) or, for values in the fp8 subnormal range of its group, half the subnormal spacing
    deq = dequant(q.view(np.uint32), tname, s).reshape(P, F)
    xs = x.astype(np.float64)
    m = 3 if tname == "float8_e4m3fn_x4" else 2
    sub = 2.0 ** (-6 - m) if tname == "float8_e4m3fn_x4" else 2.0 ** (-14 - m)  # smallest subnormal
    X = np.repeat(np.repeat(2.0 ** (scales.astype(np.float64) - 127), 8, axis=0), 4, axis=1)
    bound = np.maximum(np.abs(xs) * 2.0 ** -(m + 1), X * sub / 2)
    assert (np.abs(deq - xs) <= bound * (1 + 1e-12)).all()


def test_quantize_mx_cost_and_gen4_only():
    # quantize_mx of bf16 [128, 512] on trn3: VectorE busy = max(MIN_II, N * vector.quantize_mx_factor) =
    # max(64, 512 * 0.25) = 128 cycles at 1.2 GHz = 106.67 ns (neuroncore.md 3.2), the only VectorE
    # instruction of the kernel (the DMA triggers run on Sync / GpSimd).
    x = np.ones((128, 512), BF16)
    k = quant_kernel("float8_e4m3fn_x4", memset=False)
    _, prof = k.options(config="trn3", timing_only=True).simulate(x)
    assert prof.stat("engine.vector.instruction_count") == 1
    assert prof.stat("engine.vector.busy_time") == pytest.approx(128 / 1.2, abs=1e-3)  # ns, to the ps
    e = _raises("NotOnGeneration", k.options(config="trn2"), x)
    assert "gen4" in str(e)


@pytest.mark.parametrize("case, code", [
    ("p_not_32", "ShapeMismatch"), ("f_not_4", "ShapeMismatch"), ("fp4_dst", "BadDtype"),
    ("fp32_src", "BadDtype"), ("f32_scale", "BadDtype"), ("scale_rows", "ShapeMismatch"),
    ("scale_offset", "ShapeMismatch"), ("dst_shape", "ShapeMismatch"), ("scale_cols", "ShapeMismatch"),
])
def test_quantize_mx_errors(case, code):
    P, F = (16, 8) if case == "p_not_32" else (32, 6) if case == "f_not_4" else (32, 8)
    src_dt = np.float32 if case == "fp32_src" else BF16
    dst_dt = nl.float4_e2m1fn_x4 if case == "fp4_dst" else nl.float8_e4m3fn_x4

    @nki.jit
    def k(x):
        xt = _load(x)
        q = nl.ndarray((P, F // 4 + (case == "dst_shape")), dst_dt, buffer=nl.sbuf)
        s = nl.ndarray((32, F // 4 + (case == "scale_cols")), np.float32 if case == "f32_scale" else nl.uint8,
                       buffer=nl.sbuf)
        view = s[0:3] if case == "scale_rows" else s[2:32] if case == "scale_offset" else s
        nisa.quantize_mx(q, xt, view)
        return _store(q)

    _raises(code, k.options(config="trn3"), np.ones((P, F), src_dt))


# ---- nc_matmul_mx ----------------------------------------------------------------------------------


def _check_mm(out, ref, mag, rtol=1e-5):
    assert np.all(np.abs(out.astype(np.float64) - ref) <= rtol * mag + 1e-30), np.max(np.abs(out - ref) / (mag + 1e-30))


@pytest.mark.parametrize("st_t, mv_t, K, M, N", [
    ("float8_e4m3fn_x4", "float8_e4m3fn_x4", 128, 128, 512),
    ("float8_e5m2_x4", "float8_e4m3fn_x4", 64, 96, 256),
    ("float4_e2m1fn_x4", "float4_e2m1fn_x4", 128, 64, 128),
    ("float4_e2m1fn_x4", "float8_e5m2_x4", 32, 2, 1024),
])
def test_nc_matmul_mx_matches_numpy(st_t, mv_t, K, M, N):
    rng = np.random.default_rng(K + M + N)
    st, mv = rand_x4((K, M), st_t, rng), rand_x4((K, N), mv_t, rng)
    ss, ms = scale_tile(rng, K, M), scale_tile(rng, K, N)
    out = mm_kernel(st_t, mv_t).options(config="trn3")(_host(st, st_t), _host(mv, mv_t), ss, ms)
    ref, mag = ref_matmul_mx(st, st_t, ss, mv, mv_t, ms)
    _check_mm(out, ref, mag)


def test_nc_matmul_mx_accumulate_and_bf16_dst():
    rng = np.random.default_rng(3)
    t = "float8_e4m3fn_x4"
    st, mv = rand_x4((128, 64), t, rng), rand_x4((128, 256), t, rng)
    ss, ms = scale_tile(rng, 128, 64), scale_tile(rng, 128, 256)
    args = (_host(st, t), _host(mv, t), ss, ms)
    ref, mag = ref_matmul_mx(st, t, ss, mv, t, ms)
    # accumulate=None: the second matmul into the same PSUM group accumulates; False: overwrites
    _check_mm(mm_kernel(t, t, twice=True).options(config="trn3")(*args), 2 * ref, 2 * mag)
    _check_mm(mm_kernel(t, t, twice=True, accumulate=False).options(config="trn3")(*args), ref, mag)
    # bf16 PSUM dst: the fp32 result rounded to bf16 (RNE: within half a bf16 ulp, 2^-8 relative, of the fp32
    # result, itself within 1e-5 of the terms' magnitude); accumulating reads bf16, adds in fp32, rounds again
    out = mm_kernel(t, t, dst_dtype=BF16).options(config="trn3")(*args)
    assert np.all(np.abs(out - ref) <= 2.0 ** -8 * np.abs(ref) + 1e-5 * mag)
    out2 = mm_kernel(t, t, dst_dtype=BF16, twice=True).options(config="trn3")(*args)
    assert np.all(np.abs(out2 - 2 * ref) <= 2.0 ** -7 * np.abs(2 * ref) + 2e-5 * mag)


def test_nc_matmul_mx_cost_and_flops():
    # trn3 nc_matmul_mx, K = 128 packed rows (512 values), M = 128, N = 512, x4 fp8 inputs: f_dt = 1 and
    # 4 values per PE row at tensor.mx_rate 4 per cycle, so ii_mm = 1 * max(64, 512) * 4 / 4 = 512 cycles and
    # ii_ls = ceil(128 / 4) = 32 (neuroncore.md 3.1). With throttling off (it starts at 50% on trn3, 3.4) the
    # TensorE busy time is the LS then the MM that waits for its weights: 32 + 512 = 544 cycles at 2.4 GHz =
    # 226.67 ns. FLOPs = 2 * (4 * 128) * 128 * 512 = 67,108,864; adjusted (x tensor.adjusted_flops_mx 0.25)
    # = 16,777,216. MX peak = 2 * 128 * 128 * 2.4e9 * mx_rate 4 = 314.57 TFLOP/s (C12 "MX x4").
    rng = np.random.default_rng(1)
    t = "float8_e4m3fn_x4"
    st, mv = rand_x4((128, 128), t, rng), rand_x4((128, 512), t, rng)
    ss, ms = scale_tile(rng, 128, 128), scale_tile(rng, 128, 512)
    _, prof = mm_kernel(t, t).options(config="trn3", overrides=["tensor.throttle.enabled=false"],
                                      timing_only=True).simulate(_host(st, t), _host(mv, t), ss, ms)
    assert prof.stat("flops.hardware") == 2 * 512 * 128 * 512
    assert prof.stat("flops.adjusted_hardware") == 2 * 512 * 128 * 512 * 0.25
    assert prof.stat("flops.tensor_peak_mx_per_s") == pytest.approx(2 * 128 * 128 * 2.4e9 * 4)
    assert prof.stat("engine.tensor.busy_time") == pytest.approx((32 + 512) / 2.4, abs=1e-3)


@pytest.mark.parametrize("case, code", [
    ("trn2", "NotOnGeneration"), ("k16", "ShapeMismatch"), ("m_odd", "ShapeMismatch"),
    ("mixed", "BadDtype"), ("scale_dtype", "BadDtype"),
    ("scale_cols", "ShapeMismatch"), ("col_tiling", "BadArgument"), ("nc_matmul_x4", "BadDtype"),
    ("k_mismatch", "ShapeMismatch"),
])
def test_nc_matmul_mx_errors(case, code):
    K = 16 if case == "k16" else 32
    M = 3 if case == "m_odd" else 4
    N = 8
    t = nl.float8_e4m3fn_x4

    @nki.jit
    def k():
        a = nl.ndarray((K, M), t, buffer=nl.sbuf)
        b = nl.ndarray((64 if case == "k_mismatch" else K, N), BF16 if case == "mixed" else t, buffer=nl.sbuf)
        sa = nl.ndarray((32, M), np.float32 if case == "scale_dtype" else nl.uint8, buffer=nl.sbuf)
        sb = nl.ndarray((64, N + (case == "scale_cols")), nl.uint8, buffer=nl.sbuf)
        ps = nl.ndarray((M, N), np.float32, buffer=nl.psum)
        if case == "nc_matmul_x4":
            nisa.nc_matmul(ps, a, b)
        else:
            nisa.nc_matmul_mx(ps, a, b, sa, sb, tile_position=(0, 64) if case == "col_tiling" else None,
                              tile_size=(32, 64) if case == "col_tiling" else None)
        r = nl.ndarray((M, N), np.float32, buffer=nl.sbuf)
        nisa.tensor_copy(r, ps)
        return _store(r)

    _raises(code, k.options(config="trn2" if case == "trn2" else "trn3", timing_only=True))


# ---- a public-style MX kernel end to end -----------------------------------------------------------


@nki.jit
def mx_matmul_kernel(a_t, b_t):
    """C = A^T B with MX fp8: the kernel loads bf16 A and B laid out [128, 4 * cols] (contraction index
    4k + q on partition k, element 4c + q), quantizes both with quantize_mx, multiplies with nc_matmul_mx
    into PSUM, copies out and stores, as public NKI MX kernels do."""
    K, M4 = a_t.shape
    N4 = b_t.shape[1]
    M, N = M4 // 4, N4 // 4
    a = nl.ndarray((K, M4), nl.bfloat16, buffer=nl.sbuf)
    b = nl.ndarray((K, N4), nl.bfloat16, buffer=nl.sbuf)
    nisa.dma_copy(dst=a, src=a_t)
    nisa.dma_copy(dst=b, src=b_t)
    a_q = nl.ndarray((K, M), nl.float8_e4m3fn_x4, buffer=nl.sbuf)
    b_q = nl.ndarray((K, N), nl.float8_e4m3fn_x4, buffer=nl.sbuf)
    a_s = nl.ndarray((K, M), nl.uint8, buffer=nl.sbuf)
    b_s = nl.ndarray((K, N), nl.uint8, buffer=nl.sbuf)
    nisa.quantize_mx(dst=a_q, src=a, dst_scale=a_s)
    nisa.quantize_mx(dst=b_q, src=b, dst_scale=b_s)
    ps = nl.ndarray((M, N), nl.float32, buffer=nl.psum)
    nisa.nc_matmul_mx(dst=ps, stationary=a_q, moving=b_q, stationary_scale=a_s, moving_scale=b_s)
    c = nl.ndarray((M, N), nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=c, src=ps)
    out = nl.ndarray((M, N), nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=c)
    return out


def test_public_style_mx_kernel_end_to_end():
    rng = np.random.default_rng(11)
    Kv, M, N = 512, 128, 256  # 512 contraction values = 128 packed partitions
    A = rng.standard_normal((Kv, M)).astype(BF16)
    B = rng.standard_normal((Kv, N)).astype(BF16)
    a_t = np.ascontiguousarray(A.reshape(128, 4, M).transpose(0, 2, 1).reshape(128, 4 * M))
    b_t = np.ascontiguousarray(B.reshape(128, 4, N).transpose(0, 2, 1).reshape(128, 4 * N))
    out = mx_matmul_kernel.options(config="trn3")(a_t, b_t)
    # numpy: quantize both with the reference, dequantize, multiply in float64
    qa, sa = ref_quantize(a_t.astype(np.float64), "float8_e4m3fn_x4")
    qb, sb = ref_quantize(b_t.astype(np.float64), "float8_e4m3fn_x4")
    full_sa = np.zeros((128, M), np.uint8)
    full_sb = np.zeros((128, N), np.uint8)
    for g in range(16):
        full_sa[scale_row(g)], full_sb[scale_row(g)] = sa[g], sb[g]
    ref, mag = ref_matmul_mx(qa, "float8_e4m3fn_x4", full_sa, qb, "float8_e4m3fn_x4", full_sb)
    _check_mm(out, ref, mag)
    # and close to the exact product: MX fp8 error is a few percent of the terms' magnitude
    exact = A.astype(np.float64).T @ B.astype(np.float64)
    assert np.abs(out - exact).max() <= 0.1 * (np.abs(A.astype(np.float64)).T @ np.abs(B.astype(np.float64))).max()


def test_cli_takes_and_writes_x4_data_as_packed_bits(tmp_path):
    # `nsim run` on the traced x4 copy kernel: the .npz input is the packed uint32 bits, the .npy output too
    import json
    import subprocess
    from conftest import NSIM_BIN

    @nki.jit
    def copy(x):
        return _store(_load(x))

    bits = (np.arange(32 * 8, dtype=np.uint32).reshape(32, 8) * 0x01010101).astype(np.uint32)
    copy.options(config="trn3")(_host(bits, "float8_e4m3fn_x4"))
    kj = tmp_path / "copy.json"
    kj.write_text(json.dumps(copy.last_json))
    name = [t["name"] for t in copy.last_json["tensors"] if t.get("buffer") == "hbm"][0]
    np.savez(tmp_path / "in.npz", **{name: bits})
    r = subprocess.run([NSIM_BIN, "run", str(kj), "-c", "trn3", "--inputs", str(tmp_path / "in.npz"),
                        "--outputs", str(tmp_path / "out")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    outs = list((tmp_path / "out").glob("*.npy"))
    assert len(outs) == 1
    out = np.load(outs[0])
    assert out.dtype == np.uint32
    np.testing.assert_array_equal(out, bits)
    np.savez(tmp_path / "bad.npz", **{name: bits.astype(np.float32)})  # no cast path into x4
    r = subprocess.run([NSIM_BIN, "run", str(kj), "-c", "trn3", "--inputs", str(tmp_path / "bad.npz")],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "no cast path" in r.stderr


def test_roofline_counts_mx_flops_at_the_mx_peak():
    # The public-style kernel on trn3: every TensorE FLOP is MX, so the roofline's compute roof is
    # flops / (mx / mx_peak + other / peak) with mx = 2 * 512 * 128 * 256 and other = the VectorE FLOPs.
    from nsim import plot
    rng = np.random.default_rng(2)
    a_t = rng.standard_normal((128, 512)).astype(BF16)
    b_t = rng.standard_normal((128, 1024)).astype(BF16)
    _, prof = mx_matmul_kernel.options(config="trn3", timing_only=True).simulate(a_t, b_t)
    mx = prof.stat("flops.mx")
    assert mx == prof.stat("flops.model") == 2 * 512 * 128 * 256
    peak, mx_peak = prof.stat("flops.tensor_peak_per_s"), prof.stat("flops.tensor_peak_mx_per_s")
    assert mx_peak == pytest.approx(4 * peak)
    r = plot.roofline_numbers(prof)
    assert r["compute_roof"] == pytest.approx(r["flops"] / (mx / mx_peak + (r["flops"] - mx) / peak))
    assert peak < r["compute_roof"] <= mx_peak


@pytest.mark.parametrize("tname", ["float8_e4m3fn_x4", "float4_e2m1fn_x4"])
def test_kernel_views_packed_host_data_as_x4(tname):
    # The host passes the packed bits as uint32 / uint16 and the kernel reinterprets them with .view(): a
    # kernel-IR access with a dtype (same element size); the result equals the host-side-view run.
    rng = np.random.default_rng(5)
    st, mv = rand_x4((64, 32), tname, rng), rand_x4((64, 128), tname, rng)
    ss, ms = scale_tile(rng, 64, 32), scale_tile(rng, 64, 128)
    x4 = X4[tname]

    @nki.jit
    def k(st_bits, mv_bits, ss, ms):
        a = nl.ndarray(st_bits.shape, x4, buffer=nl.sbuf)
        nisa.dma_copy(dst=a, src=st_bits.view(x4))          # an HBM view
        b_raw = _load(mv_bits)
        b = b_raw.view(x4)                                    # an SBUF view
        assert b.dtype == x4 and b_raw.dtype == mv_bits.dtype and b[:, 0:4].dtype == x4
        ps = nl.ndarray((32, 128), np.float32, buffer=nl.psum)
        nisa.nc_matmul_mx(ps, a, b, _load(ss), _load(ms))
        r = nl.ndarray((32, 128), np.float32, buffer=nl.sbuf)
        nisa.tensor_copy(r, ps)
        return _store(r)

    out = k.options(config="trn3")(st, mv, ss, ms)
    ref, mag = ref_matmul_mx(st, tname, ss, mv, tname, ms)
    _check_mm(out, ref, mag)
    accs = [v for s in k.last_json["body"] if s.get("op") in ("dma_copy", "nc_matmul_mx")
            for v in s.values() if isinstance(v, dict) and "dtype" in v]
    assert {a["dtype"] for a in accs} == {tname}  # the IR carries the reinterpretation


def test_view_changing_the_element_size_scales_the_last_dim():
    # 4-byte uint32 [32, 4] as 2-byte fp4 x4: [32, 8] (spec 3.9; tests/python/test_view_dtype.py), the bits unchanged
    @nki.jit
    def k(x):
        v = x.view(nl.float4_e2m1fn_x4)
        assert tuple(v.shape) == (32, 8)
        out = nl.ndarray((32, 8), nl.float4_e2m1fn_x4, buffer=nl.shared_hbm)
        t = nl.ndarray((32, 8), nl.float4_e2m1fn_x4, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=v)
        nisa.dma_copy(dst=out, src=t)
        return out

    x = np.random.default_rng(6).integers(0, 2 ** 32, (32, 4), dtype=np.uint32)
    out = k.options(config="trn3")(x)
    assert out.shape == (32, 8)
    np.testing.assert_array_equal(np.ascontiguousarray(out).view(np.uint16), x.view(np.uint16))
    # a last dim of bytes that do not divide: 3 x uint8 as fp4 x4 (2 bytes)

    @nki.jit
    def odd(x):
        x.view(nl.float4_e2m1fn_x4)

    _raises("BadDtype", odd.options(config="trn3"), np.zeros((32, 3), np.uint8))


def test_nc_matmul_mx_row_tiling_has_no_functional_effect():
    # tile_position=(32, 0), tile_size=(32, 128): a 32-row tile at row 32, the full column width (row tiling
    # only); K = 32 packed rows fit it. Same result as without tiling; K = 64 does not fit (BadArgument).
    rng = np.random.default_rng(9)
    t = "float8_e5m2_x4"

    def kernel(K):
        @nki.jit
        def k(st, mv, ss, ms):
            ps = nl.ndarray((16, 64), np.float32, buffer=nl.psum)
            nisa.nc_matmul_mx(dst=ps, stationary=_load(st), moving=_load(mv), stationary_scale=_load(ss),
                              moving_scale=_load(ms), tile_position=(32, 0), tile_size=(32, 128))
            r = nl.ndarray((16, 64), np.float32, buffer=nl.sbuf)
            nisa.tensor_copy(r, ps)
            return _store(r)
        st, mv = rand_x4((K, 16), t, rng), rand_x4((K, 64), t, rng)
        ss, ms = scale_tile(rng, K, 16), scale_tile(rng, K, 64)
        return k.options(config="trn3"), (_host(st, t), _host(mv, t), ss, ms), (st, ss, mv, ms)

    k, args, (st, ss, mv, ms) = kernel(32)
    ref, mag = ref_matmul_mx(st, t, ss, mv, t, ms)
    _check_mm(k(*args), ref, mag)
    k, args, _ = kernel(64)
    _raises("BadArgument", k, *args)
