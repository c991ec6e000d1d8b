"""Weight-only quantization with bit manipulation, written the way public NKI authors write it, run unchanged
(tests/python/kernels/weight_quant_kernels.py, new dialect; weight_quant_kernels_beta1.py, Beta 1):

- on-chip int8 quantizers: symmetric (absmax, scale = absmax / 127) and asymmetric (min / max, scale =
  (max - min) / 255, uint8 zero point), per channel and group-wise (group 64 / 128); round to nearest even by the
  fp32 magic-number trick (x + 1.5 * 2^23 - 1.5 * 2^23), clamp, cast to int8 / uint8;
- a GPTQ-style W4A16 decode GEMM (new dialect): eight int4 values per int32 along K, unpacked on VectorE with
  ``right_shift`` + ``bitwise_and`` (negative int32 words included), scaled per group of 128 K rows on GpSimd,
  the "- 8" folded into one fp32 matmul per K chunk, against a bf16-weight decode GEMM (with the unpacking and the
  dequant both on VectorE the W4A16 GEMM is VectorE-bound and slower than the bf16 one: the split matters);
- an AWQ-style W4A16 decode GEMM (Beta 1): two int4 values per uint8 along N unpacked with ``nl.bitwise_and`` /
  ``nl.right_shift`` value ops, uint8 zero points and bf16 scales per group as [1, N] rows broadcast over the
  partitions, masks for a ragged N;
- fp8 e4m3 per-tensor quantization (dynamic: absmax over all rows through a PE transpose; static: a calibrated
  scale) saturated to +-240 before the cast, and the matching dequant.

The existing fp8 / int8 matmuls of test_quantized_style_kernels.py take already-quantized weights; this family
quantizes on chip and unpacks sub-byte weights. Checked: quantized integers, fp8 bits and scales exactly against
numpy references that follow the kernels' fp32 steps (ties to even and saturation included), the GEMMs against
float64 numpy (bf16 tolerance), no sanitizer report, the instruction counts of the unpacking, and that the W4A16
GEMM reads exactly a quarter of the bf16 weight bytes for its weight and is faster than the bf16 GEMM, which is
DMA-bound.

nsim fix these kernels needed (the test named failed before): a Beta-1 element-wise value function with a
``mask=`` and a broadcasting operand (``nl.subtract(w_tile, zero_row, mask=...)`` with a [1, N] row against a
[128, N] tile, spec 3.10) was NSIM-E425 "shapes (128, 488) and (1, 512) do not broadcast": the mask cut the
full-size tile to the mask's box but left the row whole (python/nsim/nki/beta1/language.py,
``masked_elementwise``; now a broadcasting operand's full-size dims are cut too; ``test_masked_broadcast_row_*``,
``test_w4a16_awq_gemm_beta1_*`` with a ragged N).
"""
from collections import Counter

import numpy as np
import pytest

from conftest import executed_ops, op_counts, require_core, sample_fixture  # noqa: E402

_core, ml_dtypes = require_core()
from numeric_helpers import close, f64, randn, rounded  # noqa: E402

BF16 = ml_dtypes.bfloat16
F32 = np.float32

wq = sample_fixture("weight_quant_kernels.py", module_only=True)
wb1 = sample_fixture("weight_quant_kernels_beta1.py", module_only=True)


def _weight(n, k, seed):
    """A bf16 weight whose rows have magnitudes spread over 2^-6 .. 2^2 (and an offset, for the asymmetric case)."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n, k)) * np.exp2(rng.uniform(-6, 2, (n, 1))) + rng.uniform(-0.5, 0.5, (n, 1))
    return w.astype(BF16)


def _name(operand):
    """The tensor name of a kernel.json operand (a name, or an access with a "tensor")."""
    return operand["tensor"] if isinstance(operand, dict) else operand


def _groups(w, group):
    n, k = w.shape
    return np.asarray(w, F32).reshape(n, k // group, group)


# --------------------------------------------------------------------------------------------------
# 1. int8 quantization on chip
# --------------------------------------------------------------------------------------------------

def _sym_ref(w, group):
    """The kernel's fp32 steps: scale = max(absmax, 1e-8) * (1 / 127), inv = 1 / scale, q = clamp(rint(w * inv))."""
    g = _groups(w, group)
    scale = (np.maximum(np.abs(g).max(-1), F32(1e-8)) * F32(1.0 / 127.0)).astype(F32)
    inv = (F32(1) / scale).astype(F32)
    q = np.clip(np.rint((g * inv[..., None]).astype(F32)), -127, 127)
    return q.astype(np.int8).reshape(w.shape), scale


@pytest.mark.parametrize("N,K,group", [(200, 1024, 128), (128, 2048, 2048), (256, 1024, 64)])
def test_int8_symmetric_quantize_exact(wq, N, K, group):
    """Ragged row tile (200 = 128 + 72), per channel (group = K) and group-wise. Row 0 is built so that its scale
    is exactly 1 and it holds the ties 2.5, -3.5, 0.5, 126.5: ties go to even (2, -4, 0, 126), not away from zero
    or toward zero (the float -> int store alone truncates)."""
    w = _weight(N, K, seed=N + group)
    w[0, :] = 0
    w[0, :8] = np.array([127, 2.5, -3.5, 0.5, 126.5, -1.5, 3.2, -0.7], F32).astype(BF16)
    q, scales = wq.quantize_int8_sym(w, group)
    assert q.dtype == np.int8 and q.shape == (N, K) and scales.dtype == F32 and scales.shape == (N, K // group)
    want_q, want_s = _sym_ref(w, group)
    np.testing.assert_array_equal(scales, want_s)
    np.testing.assert_array_equal(q, want_q)
    assert scales[0, 0] == 1.0 and list(q[0, :8]) == [127, 2, -4, 0, 126, -2, 3, -1]
    # each group uses the full range (row 0's all-zero groups: the floor scale, zeros) and dequantizes within
    # half a step
    assert (np.abs(q[1:].astype(np.int32)).reshape(N - 1, K // group, group).max(-1) == 127).all()
    assert not q[0, group:].any() and (scales[0, 1:] == F32(F32(1e-8) * F32(1.0 / 127.0))).all()
    deq = q.astype(np.float64).reshape(N, K // group, group) * scales[..., None]
    assert (np.abs(deq - f64(_groups(w, group))) <= 0.5 * f64(scales)[..., None] * (1 + 1e-5)).all()
    t = -(-N // 128)
    c = op_counts(wq.quantize_int8_sym)
    assert c["tensor_reduce"] == t and c["reciprocal"] == t and c["activation"] == t and c["tensor_tensor"] == t
    assert c["tensor_scalar"] == 3 * t and c["dma_copy"] == 3 * t


def _asym_ref(w, group):
    g = _groups(w, group)
    wmax, wmin = g.max(-1), g.min(-1)
    scale = (np.maximum((wmax - wmin).astype(F32), F32(1e-8)) * F32(1.0 / 255.0)).astype(F32)
    inv = (F32(1) / scale).astype(F32)
    zero = np.clip(np.rint(-(wmin * inv).astype(F32)), 0, 255).astype(F32)
    q = np.clip(np.rint((g * inv[..., None]).astype(F32)) + zero[..., None], 0, 255)
    return q.astype(np.uint8).reshape(w.shape), scale, zero


@pytest.mark.parametrize("N,K,group", [(200, 1024, 64), (128, 4096, 128)])
def test_uint8_asymmetric_quantize_exact(wq, N, K, group):
    """Rows with an offset (so the zero point is not 128) and an all-positive row (zero point 0 after the clamp:
    -min / scale < 0); exact uint8, scales and zero points; dequantized within half a step inside the range."""
    w = _weight(N, K, seed=3 * N + group)
    w[1, :] = np.abs(np.asarray(w[1, :], F32)).astype(BF16) + BF16(0.25)
    q, scales, zeros = wq.quantize_uint8_asym(w, group)
    assert q.dtype == np.uint8 and scales.dtype == F32 and zeros.dtype == F32
    want_q, want_s, want_z = _asym_ref(w, group)
    np.testing.assert_array_equal(scales, want_s)
    np.testing.assert_array_equal(zeros, want_z)
    np.testing.assert_array_equal(q, want_q)
    assert (zeros[1] == 0).all() and len(np.unique(zeros)) > 20
    assert q.min() == 0 and q.max() == 255
    g = _groups(w, group)
    deq = (q.astype(np.float64).reshape(g.shape) - zeros[..., None]) * scales[..., None]
    inside = (q.reshape(g.shape) > 0) & (q.reshape(g.shape) < 255)
    assert (np.abs(deq - f64(g))[inside] <= (0.5 * f64(scales)[..., None] * (1 + 1e-5) + 1e-7)
            .repeat(group, -1)[inside]).all()


# --------------------------------------------------------------------------------------------------
# 2. GPTQ-style W4A16 decode GEMM (new dialect)
# --------------------------------------------------------------------------------------------------

def _gptq_case(M, K, N, seed):
    """x, the int32 qweight, bf16 scales; the weight as the kernel applies it (nibble * scale rounded to bf16 on
    GpSimd, minus 8 * scale through the folded fp32 matmul) and (nibble - 8) * scale rounded to bf16 (the bf16
    GEMM's weight)."""
    rng = np.random.default_rng(seed)
    x = randn((M, K), BF16, seed)
    nib = rng.integers(0, 16, (K, N)).astype(np.uint32)
    nib[7::8, 0] = 15  # the top nibble set: negative int32 words
    qweight = np.zeros((K // 8, N), np.uint32)
    for j in range(8):
        qweight |= nib[j::8] << np.uint32(4 * j)
    scales = rng.uniform(0.002, 0.02, (K // 128, N)).astype(BF16)
    s = np.repeat(f64(scales), 128, axis=0)
    return x, qweight.view(np.int32), scales, rounded(nib * s, BF16) - 8 * s, (nib.astype(np.float64) - 8) * s


@pytest.mark.parametrize("M,K,N", [(1, 4096, 1024), (16, 2048, 2048), (128, 1024, 1536)])
def test_w4a16_gptq_gemm_matches_numpy(wq, M, K, N):
    """Against x @ W in float64 with W as the kernel forms it (bf16 tolerance), and within 1% (relative norm) of
    x @ the exact dequantized weight (the bf16 rounding of nibble * scale is the difference); the words with the
    sign bit set unpack like the others (a logical shift, then the nibble mask)."""
    x, qweight, scales, w, w_exact = _gptq_case(M, K, N, seed=M + K + N)
    assert (qweight < 0).any()
    out = wq.w4a16_gptq_gemm(x, qweight, scales)
    assert out.dtype == BF16 and out.shape == (M, N)
    close(out, f64(x) @ w, BF16)
    want = f64(x) @ w_exact
    assert np.linalg.norm(f64(out) - want) < 1e-2 * np.linalg.norm(want)
    # per (512-column tile, 1024-row chunk): the packed and scale loads, the folded "- 8" matmul, and per shift
    # one shift + mask (VectorE), one scale multiply (GpSimd), one matmul; x^T loaded and summed once
    nt, ch = N // 512, K // 1024
    per = nt * ch * 8
    c = op_counts(wq.w4a16_gptq_gemm)
    assert c["tensor_scalar"] == per + 1 and c["tensor_tensor"] == per and c["nc_matmul"] == per + nt * ch
    assert c["tensor_reduce"] == 1 and c["dma_copy"] == 1 + 2 * nt * ch + nt
    prof = wq.w4a16_gptq_gemm.last_profile
    # the bit-vector unpacking is VectorE-only (spec 2.1); the fp32 "* -8" may go to either engine
    assert prof.stat("engine.vector.opcode.tensor_scalar.count") in (per, per + 1)
    assert prof.stat("engine.gpsimd.opcode.tensor_tensor.count") == per


def test_w4a16_reads_a_quarter_of_the_weight_bytes_and_is_faster(wq):
    """Decode (M = 8), K = N = 4096: the bf16 GEMM is DMA-bound (its DMA time exceeds every compute engine's busy
    time). The W4A16 GEMM reads exactly K * N / 2 bytes of weight (a quarter of the bf16 weight's K * N * 2), on top
    of x (once; the bf16 GEMM reads it once per column tile) and the scale rows (each broadcast to 16 partitions),
    and finishes sooner although it unpacks every weight on chip."""
    M, K, N = 8, 4096, 4096
    x, qweight, scales, w, w_exact = _gptq_case(M, K, N, seed=11)
    out4 = wq.w4a16_gptq_gemm(x, qweight, scales)
    p4 = wq.w4a16_gptq_gemm.last_profile
    w16 = w_exact.astype(BF16)
    out16 = wq.bf16_gemm_decode(x, w16)
    p16 = wq.bf16_gemm_decode.last_profile
    close(out4, f64(x) @ w, BF16)
    close(out16, f64(x) @ f64(w16), BF16)
    assert p16.stat("memory.hbm_read_bytes") == 2 * M * K * (N // 512) + 2 * K * N
    assert p4.stat("memory.hbm_read_bytes") == 2 * M * K + K * N // 2 + 16 * scales.nbytes
    compute = max(p16.stat("engine.{}.busy_time".format(e)) for e in ("tensor", "vector", "scalar", "gpsimd"))
    assert p16.stat("dma.active_time") > compute
    assert p4.stat("dma.active_time") < 0.5 * p16.stat("dma.active_time")
    assert p4.total_time_ns < 0.9 * p16.total_time_ns, (p4.total_time_ns, p16.total_time_ns)


# --------------------------------------------------------------------------------------------------
# 3. AWQ-style W4A16 decode GEMM (Beta 1), ragged N under masks
# --------------------------------------------------------------------------------------------------

def _awq_case(M, K, N, seed):
    rng = np.random.default_rng(seed)
    x = randn((M, K), BF16, seed)
    nib = rng.integers(0, 16, (K, N)).astype(np.uint8)
    qweight = (nib[:, 0::2] | (nib[:, 1::2] << 4)).astype(np.uint8)
    zeros = rng.integers(0, 16, (K // 128, N)).astype(np.uint8)
    scales = rng.uniform(0.002, 0.02, (K // 128, N)).astype(BF16)
    w = (nib.astype(np.float64) - np.repeat(zeros, 128, axis=0)) * np.repeat(f64(scales), 128, axis=0)
    return x, qweight, zeros, scales, rounded(w, BF16)


@pytest.mark.parametrize("M,K,N", [(8, 1024, 1000), (1, 2048, 4096), (128, 1024, 1288)])
def test_w4a16_awq_gemm_beta1_matches_numpy(wb1, M, K, N):
    """N = 1000 and 1288 leave a ragged last column tile (488 and 264 columns): the masked loads, unpacking,
    dequantization and store touch only the valid columns (the zero and scale rows broadcast under the mask)."""
    x, qweight, zeros, scales, w = _awq_case(M, K, N, seed=M + N)
    out = wb1.w4a16_awq_gemm(x, qweight, zeros, scales)
    assert out.dtype == BF16 and out.shape == (M, N)
    close(out, f64(x) @ w, BF16)
    tiles = (-(-N // 512)) * (K // 128)
    ops = executed_ops(wb1.w4a16_awq_gemm.last_json["body"])
    assert sum(o["op"] == "nc_matmul" and _name(o["dst"]).startswith("acc") for o in ops) == tiles
    # unpacking: one bitwise_and and one right_shift per (column tile, K tile), both on the packed bytes
    unpack = Counter(o["alu0"] for o in ops if o["op"] == "tensor_scalar" and _name(o["data"]).startswith("packed"))
    assert unpack == Counter({"bitwise_and": tiles, "right_shift": tiles}), unpack
    assert op_counts(wb1.w4a16_awq_gemm)["tensor_scalar"] == 2 * tiles


def test_masked_broadcast_row_beta1(wb1):
    """Regression (see the module docstring): ``nl.multiply(tile[128, F], row[1, F], mask=(i_f < F - 24))``."""
    w = randn((128, 512), BF16, seed=1)
    s = np.random.default_rng(2).uniform(0.5, 2.0, (1, 512)).astype(F32)
    out = wb1.masked_row_scale(w, s)
    want = f64(w) * f64(s)
    want[:, 512 - 24:] = 0
    close(out, want, BF16)


# --------------------------------------------------------------------------------------------------
# 4. fp8 e4m3 per-tensor quantization with saturation, and the dequant
# --------------------------------------------------------------------------------------------------

FP8 = ml_dtypes.float8_e4m3


def _fp8_ref(x, scale):
    """The kernel's fp32 steps: min(x * (1 / scale), 240), max(., -240), then the e4m3 cast (RNE, docs/dtypes.md)."""
    inv = F32(1) / F32(scale)
    return np.maximum(np.minimum(np.asarray(x, F32) * inv, F32(240)), F32(-240)).astype(FP8)


@pytest.mark.parametrize("N,K", [(300, 1024), (128, 2048)])
def test_fp8_per_tensor_dynamic_quantize_exact(wq, N, K):
    """Dynamic per-tensor scale (absmax over all rows: a per-partition max, a PE transpose, a max over the
    partitions, a ones-matmul broadcast back) bit-exact, and the e4m3 bits of every element; the largest element
    maps to exactly +-240."""
    x = (randn((N, K), np.float64, seed=N) * 3).astype(BF16)
    x[N - 1, 7] = BF16(-40.0)  # the absmax sits in the ragged last row tile
    q, s = wq.quantize_fp8_per_tensor(x)
    assert q.dtype == np.dtype(FP8) and s.shape == (1, 1)
    want_s = F32(F32(40.0) * F32(1.0 / 240.0))
    assert s[0, 0] == want_s
    np.testing.assert_array_equal(q.view(np.uint8), _fp8_ref(x, want_s).view(np.uint8))
    assert np.asarray(q, F32)[N - 1, 7] == -240.0 and np.abs(np.asarray(q, F32)).max() == 240.0


def test_fp8_static_scale_saturates_and_dequantizes(wq):
    """A static scale too small for the data: 40% of the values saturate to +-240 (the kernel clamps before the
    cast; e4m3 has an inf, and numpy's cast of the unclamped values gives inf), none is inf or NaN; the dequant
    (ScalarE copy with the per-partition scale) gives bf16(q * scale) exactly."""
    x = (randn((200, 1024), np.float64, seed=7) * 3).astype(BF16)
    st = np.array([[0.01]], F32)
    q, s = wq.quantize_fp8_per_tensor(x, st)
    qf = np.asarray(q, F32)
    np.testing.assert_array_equal(q.view(np.uint8), _fp8_ref(x, st[0, 0]).view(np.uint8))
    assert s[0, 0] == st[0, 0] and np.isfinite(qf).all()
    assert 0.3 < (np.abs(qf) == 240).mean() < 0.6
    assert np.isinf((np.asarray(x, F32) * (F32(1) / st[0, 0])).astype(FP8).astype(F32)).any()
    d = wq.dequantize_fp8(q, st)
    assert d.dtype == BF16
    np.testing.assert_array_equal(np.asarray(d, F32), (qf * st[0, 0]).astype(BF16).astype(F32))
