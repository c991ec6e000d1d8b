"""Quantized / low-precision matmul kernels written as nki-library (new dialect,
tests/python/kernels/quantized_style_kernels.py) and NxDI (Beta 1, quantized_style_kernels_beta1.py) write them, run
unchanged: a per-channel fp8 weight matmul (scale applied on PSUM eviction), dynamic per-row fp8 activation
quantization, a blockwise-quantized fp8 weight matmul (one PSUM accumulation group per K block), an int8 weight
decode projection (dequantized by a cast copy, scale per PSUM partition) and an fp8 x fp8 matmul with per-row and
per-column scales in plain and ``perf_mode=double_row`` form. Outputs against float64 numpy references written here,
ragged last tiles included; per kernel the instruction counts its tiling implies; the double_row form is faster
than the plain fp8 one where the spec has it, and plain fp8 runs at the bf16 rate (spec 3.1).

Also the fixes these kernels exposed (nc_matmul's dtype rules of nki-api.md 2.1, checked at the call's line; before,
nsim ran each of these silently): ``perf_mode=double_row`` on gen2 (E313) or with non-fp8 inputs (E302, and the cost
model timed such a matmul at twice the hardware's rate), an fp32 input paired with a non-fp32 one (E302), and
``float8_e4m3fn`` before gen4 (E313) or mixed with ``float8_e4m3`` (E302)."""
from collections import Counter

import numpy as np
import pytest

from conftest import executed_ops, require_core, sample_fixture  # noqa: E402

_core, ml_dtypes = require_core()
from numeric_helpers import close  # noqa: E402
from numeric_helpers import randn as _randn  # noqa: E402

import nsim  # noqa: E402

BF16 = ml_dtypes.bfloat16
FP8 = ml_dtypes.float8_e4m3
FP8FN = ml_dtypes.float8_e4m3fn

qk = sample_fixture("quantized_style_kernels.py", module_only=True)
qb1 = sample_fixture("quantized_style_kernels_beta1.py", module_only=True)


def _f64(x):
    return np.asarray(x).astype(np.float64)


def _ops(kernel):
    return executed_ops(kernel.last_json["body"])


def _count(kernel):
    return Counter(o["op"] for o in _ops(kernel))


def _allocs(body, out=None):
    """{tensor name: dtype} of the on-chip tensors a kernel.json body allocates (loops included)."""
    out = {} if out is None else out
    for s in body:
        if "alloc" in s:
            out[s["alloc"]["name"]] = s["alloc"]["dtype"]
        elif "loop" in s:
            _allocs(s["loop"].get("body", []), out)
    return out


def _tiles(n, t):
    return -(-n // t)


def _fp8_weight(k, n, seed):
    """An fp8 weight as a per-channel quantizer leaves it: each column scaled to use the e4m3 range (|w| <= 240),
    and the [n] fp32 scale that undoes it."""
    w = _randn((k, n), np.float64, seed) * np.random.default_rng(seed + 1).uniform(0.2, 3.0, n)
    scale = (np.abs(w).max(axis=0) / 240.0).astype(np.float32)
    return (w / scale).astype(FP8), scale


def _raises(code, fn, *args, **kwargs):
    with pytest.raises(nsim.NsimError) as e:
        fn(*args, **kwargs)
    assert e.value.code == code, str(e.value)
    assert e.value.file.endswith("quantized_style_kernels.py") and e.value.line > 0, (e.value.file, e.value.line)
    return str(e.value)


# --------------------------------------------------------------------------------------------------
# 1. per-channel fp8 weight, x @ W_q on the PE, the scale applied on eviction
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("M,K,N", [(200, 256, 640), (128, 384, 512), (64, 128, 96)])
def test_fp8_weight_matmul_matches_numpy(qk, M, K, N):
    """Ragged last token tile (200 = 128 + 72) and output tile (640 = 512 + 128); bf16 tolerance: the fp8 weight
    is exact in the PE, products accumulate in fp32 and the result is rounded once to bf16."""
    x = _randn((M, K), BF16, seed=M + K)
    w_q, scale = _fp8_weight(K, N, seed=N)
    out = qk.fp8_weight_matmul(x, w_q, scale)
    assert out.dtype == BF16 and out.shape == (M, N)
    want = _f64(x) @ (_f64(w_q) * _f64(scale))
    close(out, want, BF16)
    assert not np.allclose(_f64(out), _f64(x) @ _f64(w_q) * _f64(scale).mean(), rtol=1e-2, atol=1e-2)  # per column
    # tiling: the token tile transposed once per K tile, one matmul per (M tile, N tile, K tile) reading the fp8
    # weight as it is, one scaling tensor_tensor per output tile
    mt, nt, kt = _tiles(M, 128), _tiles(N, 512), K // 128
    ops = _ops(qk.fp8_weight_matmul)
    c = Counter(o["op"] for o in ops)
    assert c["nc_matmul"] == mt * nt * kt and c["nc_transpose"] == mt * kt and c["tensor_tensor"] == mt * nt
    assert c["dma_copy"] == 2 + mt + mt * nt  # weight, scale, token tiles, output tiles
    dtypes = _allocs(qk.fp8_weight_matmul.last_json["body"])
    assert {dtypes[o["moving"]["tensor"]] for o in ops if o["op"] == "nc_matmul"} == {"float8_e4m3"}
    assert qk.fp8_weight_matmul.last_profile.stat("engine.matmul_instruction_count") == mt * nt * kt  # transposes apart


# --------------------------------------------------------------------------------------------------
# 2. dynamic per-row activation quantization to fp8
# --------------------------------------------------------------------------------------------------

def _quant_reference(x):
    xf = _f64(x)
    absmax = np.abs(xf).max(axis=1, keepdims=True)
    scale = np.maximum(absmax, 1e-6) / 240.0
    return (xf / scale).astype(FP8), scale


@pytest.mark.parametrize("shape,dtype", [((300, 384), BF16), ((128, 512), np.float32)])
def test_quantize_fp8_per_row_matches_numpy(qk, shape, dtype):
    """Rows of magnitudes 2^-9 .. 2^4 (the scale makes them alike; the row's small values land in the e4m3
    subnormals), an all-zero row (floor scale 1e-6 / 240, zeros), a ragged last row tile (300 = 2 x 128 + 44).
    fp8 tolerance: the kernel rounds fp32 x * (1 / scale) once to e4m3 (3 mantissa bits) where numpy rounds the
    float64 x / scale; the two differ by a few fp32 ulps, which changes the rounded value only next to a rounding
    tie, and then by one e4m3 ulp (|v| / 8 for normal values, 2^-9 for subnormals)."""
    rng = np.random.default_rng(shape[0])
    x = (rng.standard_normal(shape) * np.exp2(rng.uniform(-9, 4, (shape[0], 1)))).astype(dtype)
    x[5] = 0
    q, scales = qk.quantize_fp8_per_row(x)
    assert q.dtype == np.dtype(FP8) and q.shape == shape
    assert scales.dtype == np.float32 and scales.shape == (shape[0], 1)
    want_q, want_s = _quant_reference(x)
    close(scales, want_s)
    got, want = np.asarray(q, np.float32), np.asarray(want_q, np.float32)
    assert (got == want).mean() > 0.995
    np.testing.assert_array_less(np.abs(got - want), np.abs(want) / 8 + 2.0 ** -9 + 1e-9)
    # each nonzero row reaches the e4m3 maximum exactly; the zero row stays zero with the floor scale
    amax = np.abs(got).max(axis=1)
    assert (np.delete(amax, 5) == 240.0).all() and amax[5] == 0
    assert scales[5, 0] == np.float32(np.float32(1e-6) * np.float32(1 / 240.0))
    # dequantized: within half an e4m3 ulp of x (and one subnormal step)
    deq = got.astype(np.float64) * _f64(scales)
    np.testing.assert_array_less(np.abs(deq - _f64(x)), np.abs(_f64(x)) / 16 * 1.001 + _f64(scales) * 2.0 ** -9 + 1e-12)
    # per row tile: |x| and the quantizing multiply on ScalarE, the absmax and 1/scale on VectorE
    t = _tiles(shape[0], 128)
    assert _count(qk.quantize_fp8_per_row) == Counter({"dma_copy": 3 * t, "activation": 2 * t, "tensor_reduce": t,
                                                       "tensor_scalar": t, "reciprocal": t})
    prof = qk.quantize_fp8_per_row.last_profile
    assert prof.stat("engine.scalar.opcode.activation.count") == 2 * t
    assert prof.stat("engine.vector.opcode.tensor_reduce.count") == t


# --------------------------------------------------------------------------------------------------
# 3. blockwise-quantized weight: one PSUM group and one scale row per K block
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("M,K,N,block_k", [(200, 384, 640, 128), (128, 512, 256, 256)])
def test_blockwise_fp8_matmul_matches_numpy(qk, M, K, N, block_k):
    """Block scales differing by up to 16x between blocks (a block scaled with a neighbour's scale row, or two
    blocks summed in PSUM before scaling, is far off); bf16 tolerance (fp32 accumulation, one bf16 rounding)."""
    nb = K // block_k
    rng = np.random.default_rng(K + N)
    w = rng.standard_normal((K, N)) * np.repeat(np.exp2(rng.uniform(-2, 2, (nb, 1))), block_k, axis=0)
    w = w * rng.uniform(0.5, 2.0, N)
    w_scale = np.stack([np.abs(w[b * block_k:(b + 1) * block_k]).max(axis=0) / 240.0 for b in range(nb)])
    w_scale = w_scale.astype(np.float32)
    w_q = (w / np.repeat(w_scale, block_k, axis=0)).astype(FP8)
    x = _randn((M, K), BF16, seed=M)
    out = qk.blockwise_fp8_matmul(x, w_q, w_scale, block_k=block_k)
    assert out.dtype == BF16 and out.shape == (M, N)
    want = sum(_f64(x)[:, b * block_k:(b + 1) * block_k] @ (_f64(w_q)[b * block_k:(b + 1) * block_k] * _f64(w_scale[b]))
               for b in range(nb))
    close(out, want, BF16)
    wrong = _f64(x) @ (_f64(w_q) * _f64(w_scale).mean(axis=0))  # one scale row for all blocks
    assert not np.allclose(_f64(out), wrong, rtol=2e-2, atol=2e-2)
    # per (M tile, N tile): K / 128 matmuls, of which the first of each block opens a new accumulation group
    # (overwrite) and the others accumulate; per block a scaling and an adding tensor_tensor into fp32 SBUF
    mt, nt, kt = _tiles(M, 128), _tiles(N, 512), K // 128
    ops = _ops(qk.blockwise_fp8_matmul)
    mms = [o for o in ops if o["op"] == "nc_matmul"]
    assert len(mms) == mt * nt * kt
    assert sum("accumulate" in o.get("flags", []) for o in mms) == mt * nt * nb * (block_k // 128 - 1)
    c = Counter(o["op"] for o in ops)
    assert c["tensor_tensor"] == 2 * mt * nt * nb and c["memset"] == mt * nt and c["tensor_copy"] == mt * kt + mt * nt


# --------------------------------------------------------------------------------------------------
# 4. int8 weight, decode shape: dequantize by a cast copy, scale per PSUM partition
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("M,K,N", [(7, 256, 200), (128, 384, 256)])
def test_int8_weight_matmul_tkg_matches_numpy(qk, M, K, N):
    rng = np.random.default_rng(M + N)
    w = rng.integers(-127, 128, (K, N)).astype(np.int8)
    scale = (rng.uniform(0.5, 2.0, N) / 127 / np.sqrt(K)).astype(np.float32)
    x = _randn((M, K), BF16, seed=K)
    out = qk.int8_weight_matmul_tkg(x, w, scale)
    assert out.dtype == BF16 and out.shape == (M, N)
    close(out, _f64(x) @ (_f64(w) * _f64(scale)), BF16)
    # the output channels are the PSUM partitions (ragged last tile 200 = 128 + 72): one matmul per (N tile, K
    # tile), one ScalarE activation applying the per-partition scale per N tile, one int8 -> bf16 cast copy
    nt, kt = _tiles(N, 128), K // 128
    ops = _ops(qk.int8_weight_matmul_tkg)
    c = Counter(o["op"] for o in ops)
    assert c["nc_matmul"] == nt * kt and c["activation"] == nt and c["tensor_copy"] == 1
    (cast,) = [o for o in ops if o["op"] == "tensor_copy"]
    dtypes = _allocs(qk.int8_weight_matmul_tkg.last_json["body"])
    assert (dtypes[cast["src"]], dtypes[cast["dst"]]) == ("int8", "bfloat16")
    assert all(o["stationary"]["tensor"] == cast["dst"] for o in ops if o["op"] == "nc_matmul")
    assert qk.int8_weight_matmul_tkg.last_profile.stat("engine.scalar.opcode.activation.count") == nt


def test_int8_dequantize_is_exact(qk):
    """One-hot token rows pick single weight rows: out[i] = bf16(w[k_i] * scale), so a cast of int8 that were not
    exact (every int8 value is a bf16 value) or a scale on the wrong channel shows up bit for bit."""
    K, N = 256, 200
    rng = np.random.default_rng(3)
    w = rng.integers(-128, 128, (K, N)).astype(np.int8)
    w[0, :] = np.arange(-128, 72)
    scale = np.exp2(rng.integers(-8, 0, N)).astype(np.float32)  # powers of two: the products are exact
    rows = np.array([0, 5, 77, 255, 128, 129])
    x = np.zeros((len(rows), K), BF16)
    x[np.arange(len(rows)), rows] = 1
    out = qk.int8_weight_matmul_tkg(x, w, scale)
    np.testing.assert_array_equal(_f64(out), (_f64(w[rows]) * _f64(scale)).astype(BF16).astype(np.float64))


# --------------------------------------------------------------------------------------------------
# 5. fp8 x fp8 with row and column scales; perf_mode=double_row
# --------------------------------------------------------------------------------------------------

def _scaled_operands(K, M, N, seed, dtype=FP8):
    """Small-integer fp8 operands (exact in e4m3, and their fp32 sums exact) and power-of-two scales: the result
    is exact until the final bf16 rounding, whatever the accumulation order."""
    rng = np.random.default_rng(seed)
    lhsT = rng.integers(-4, 5, (K, M)).astype(dtype)
    rhs = rng.integers(-4, 5, (K, N)).astype(dtype)
    ls = np.exp2(rng.integers(-6, 2, (M, 1))).astype(np.float32)
    rs = np.exp2(rng.integers(-6, 2, N)).astype(np.float32)
    want = ((_f64(lhsT).T * _f64(ls)) @ (_f64(rhs) * _f64(rs))).astype(BF16)
    return (lhsT, rhs, ls, rs), want


@pytest.mark.parametrize("config", ["trn2", "trn3"])
@pytest.mark.parametrize("K,M,N", [(512, 200, 640), (256, 128, 96)])
def test_fp8_scaled_matmul_plain_and_double_row(qk, config, K, M, N):
    """Both forms give the exact result rounded to bf16; the double_row form issues half the matmuls, each
    contracting the chunk's 256 rows laid out [128, 2, ...]."""
    args, want = _scaled_operands(K, M, N, seed=K + M)
    mt, nt, ct = _tiles(M, 128), _tiles(N, 512), K // 256
    k = qk.fp8_scaled_matmul.options(config=config)
    for double_row, per_chunk in ((False, 2), (True, 1)):
        out = k(*args, double_row=double_row)
        assert out.dtype == BF16 and out.shape == (M, N)
        np.testing.assert_array_equal(_f64(out), want.astype(np.float64))
        mms = [o for o in _ops(qk.fp8_scaled_matmul) if o["op"] == "nc_matmul"]
        assert len(mms) == mt * nt * ct * per_chunk
        assert all(("double_row" in o.get("flags", [])) == double_row for o in mms)
        assert _count(qk.fp8_scaled_matmul)["scalar_tensor_tensor"] == mt * nt


@pytest.mark.parametrize("config", ["trn2", "trn3"])
def test_double_row_is_faster(qk, config):
    """A TensorE-heavy shape (K 1024, M 512, N 512: 32 plain matmuls of K 128, N 512). Spec 3.1: a plain matmul
    costs max(64, N) = 512 cycles whatever its fp8/bf16 input; double_row contracts K = 256 "at the II of K = 128
    bf16", so the same work takes half the matmuls and about half the TensorE time (the LoadStationary and fixed
    latencies are shared), and the kernel finishes sooner."""
    args, _ = _scaled_operands(1024, 512, 512, seed=9)
    k = qk.fp8_scaled_matmul.options(config=config, timing_only=True)
    prof = {}
    for dr in (False, True):
        k(*args, double_row=dr)
        prof[dr] = qk.fp8_scaled_matmul.last_profile
    assert prof[False].stat("opcode.multiply_moving.count") == 32
    assert prof[True].stat("opcode.multiply_moving.count") == 16
    plain_t, dr_t = prof[False].stat("bound.tensor.time"), prof[True].stat("bound.tensor.time")
    assert 0.45 * plain_t < dr_t < 0.6 * plain_t, (plain_t, dr_t)
    assert prof[True].total_time_ns < 0.9 * prof[False].total_time_ns, (prof[True].total_time_ns,
                                                                       prof[False].total_time_ns)


@pytest.mark.parametrize("config", ["trn1", "trn2", "trn3"])
def test_fp8_matmul_runs_at_the_bf16_rate(qk, config):
    """neuroncore.md 3.1: f_dt = 1 for bf16, fp16, tf32 and fp8 (e4m3, e5m2) without a perf mode, 4 for fp32. So
    the plain kernel's TensorE busy time is the same for fp8 and bf16 operands on every generation (fp8's 2x of
    peak_tflops.fp8 on trn2/trn3 is the double_row mode only; on trn1 cFP8 runs at the bf16 rate), and fp32 takes
    about 4x (the matmul's fixed latency is not multiplied, hence > 3x)."""
    K, M, N = 1024, 512, 512
    t = {}
    for dt in (FP8, ml_dtypes.float8_e5m2, BF16, np.float32):
        args, _ = _scaled_operands(K, M, N, seed=4, dtype=dt)
        qk.fp8_scaled_matmul.options(config=config, timing_only=True)(*args)
        prof = qk.fp8_scaled_matmul.last_profile
        t[np.dtype(dt).name] = prof.stat("bound.tensor.time")
        if dt == FP8:  # the profiler's bf16-equivalent FLOPs (spec 5.1): fp8 counts 1 on trn1, 0.5 on trn2/trn3
            fp8_weight = 1 if config == "trn1" else 0.5
            assert prof.stat("flops.adjusted_hardware") == prof.stat("flops.hardware") * fp8_weight
    assert t["float8_e4m3"] == t["float8_e5m2"] == t["bfloat16"], t
    assert t["float32"] > 3 * t["bfloat16"], t


# --------------------------------------------------------------------------------------------------
# nc_matmul dtype rules (nki-api.md 2.1), at the kernel's line
# --------------------------------------------------------------------------------------------------

def test_double_row_needs_gen3(qk):
    args, _ = _scaled_operands(256, 128, 128, seed=1)
    msg = _raises("NSIM-E313", qk.fp8_scaled_matmul.options(config="trn1"), *args, double_row=True)
    assert "double_row" in msg and "gen3" in msg
    qk.fp8_scaled_matmul.options(config="trn1")(*args)  # the plain form runs on trn1


def test_double_row_follows_the_config(qk):
    """Double-row availability is the core's tensor.fp8_double_row (isa::matmul_dtype_rule), so a what-if config
    may turn the mode off on trn2 or on for trn1."""
    args, want = _scaled_operands(256, 128, 128, seed=6)
    msg = _raises("NSIM-E313", qk.fp8_scaled_matmul.options(config="trn2", overrides={"tensor.fp8_double_row": False}),
                  *args, double_row=True)
    assert "tensor.fp8_double_row" in msg
    out = qk.fp8_scaled_matmul.options(config="trn1", overrides={"tensor.fp8_double_row": True})(*args, double_row=True)
    np.testing.assert_array_equal(_f64(out), want.astype(np.float64))


def test_double_row_needs_fp8_inputs(qk):
    args, _ = _scaled_operands(256, 128, 128, seed=2, dtype=BF16)
    msg = _raises("NSIM-E302", qk.fp8_scaled_matmul.options(config="trn2"), *args, double_row=True)
    assert "double_row" in msg and "bfloat16" in msg
    qk.fp8_scaled_matmul.options(config="trn2")(*args)  # bf16 runs in the plain form


def test_fp32_input_needs_fp32_partner(qk):
    (lhsT, rhs, ls, rs), _ = _scaled_operands(256, 128, 128, seed=3)
    msg = _raises("NSIM-E302", qk.fp8_scaled_matmul, lhsT.astype(np.float32), rhs, ls, rs)
    assert "float32" in msg and "float8_e4m3" in msg
    qk.fp8_scaled_matmul(lhsT.astype(np.float32), rhs.astype(np.float32), ls, rs)


def test_float8_e4m3fn_rules(qk):
    """e4m3fn (OCP fp8) is a gen4 matmul input and does not mix with Trainium's e4m3; on trn3 it runs, also in
    double_row form."""
    (lhsT, rhs, ls, rs), want = _scaled_operands(256, 128, 128, seed=5)
    fn = (lhsT.astype(FP8FN), rhs.astype(FP8FN), ls, rs)
    msg = _raises("NSIM-E313", qk.fp8_scaled_matmul.options(config="trn2"), *fn)
    assert "float8_e4m3fn" in msg and "gen4" in msg
    _raises("NSIM-E302", qk.fp8_scaled_matmul.options(config="trn3"), lhsT.astype(FP8FN), rhs, ls, rs)
    for dr in (False, True):
        out = qk.fp8_scaled_matmul.options(config="trn3")(*fn, double_row=dr)
        np.testing.assert_array_equal(_f64(out), want.astype(np.float64))


# --------------------------------------------------------------------------------------------------
# Beta 1 (NxDI style)
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("M", [200, 50])
def test_beta1_quantized_fp8_proj_matches_numpy(qb1, M):
    """Masked ragged token tile (200 = 128 + 72; 50), the [1, N] scale broadcast over the partitions by
    nl.multiply; bf16 tolerance."""
    K, N = 256, 1024
    x = _randn((M, K), BF16, seed=M)
    w_q, scale = _fp8_weight(K, N, seed=11)
    out = qb1.quantized_fp8_proj(x, w_q, scale[None, :])
    assert out.dtype == BF16 and out.shape == (M, N)
    close(out, _f64(x) @ (_f64(w_q) * _f64(scale)), BF16)
    # per (N tile, M tile, K tile): one transposing load of the token tile (only its valid rows) and one matmul on
    # the fp8 weight tile; the weight tiles loaded once per N tile
    mt, nt, kt = _tiles(M, 128), N // 512, K // 128
    ops = _ops(qb1.quantized_fp8_proj)
    wmm = [o for o in ops if o["op"] == "nc_matmul" and isinstance(o["moving"], dict)
           and o["moving"]["tensor"] == "w_tiles"]
    assert len(wmm) == nt * mt * kt
    tr = [o for o in ops if o["op"] == "dma_transpose"]
    assert len(tr) == nt * mt * kt
    assert sorted({o["src"]["index"][0]["size"] for o in tr}) == sorted({min(128, M - 128 * m) for m in range(mt)})
    assert sum(1 for o in ops if o["op"] == "dma_copy" and isinstance(o["dst"], dict)
               and o["dst"]["tensor"] == "w_tiles") == nt * kt
