"""MX (microscaling) and FP8 GEMM / MLP kernels on trn3 written like public NKI 0.6 kernels for Trainium3
(tests/python/kernels/mx_gemm_kernels_new.py, new dialect, unmodified; the MX instructions have no Beta-1 form):

- an MX GEMM: bf16 activations quantized on chip (``dma_transpose`` into the interleaved x4 layout, then
  ``quantize_mx``: blocks of 32 = 8 partitions x 4 packed values sharing an E8M0 scale) times pre-quantized MX
  weights from HBM (packed ``float8_e4m3fn_x4`` bits + compact scales loaded into the quadrant layout), K-split
  accumulation of ``nc_matmul_mx`` in PSUM, bf16 output;
- a SwiGLU MLP in MX fp8 (gate / up with the weights stationary so the intermediate lands with its neurons on the
  partitions, SwiGLU written straight into the down projection's interleaved input, one ``quantize_mx`` per 512
  intermediate values) and the same MLP in bf16 with ``nc_matmul``, for decode (M = 8) and prefill (M = 512, 1024);
- an FP8 (e4m3fn) GEMM with host quantization: per-row activation scales and a per-tensor weight scale.

Checked: the MX GEMM against a numpy emulation of MX quantization (block max -> shared exponent -> element RNE) to
fp32-accumulation accuracy plus the bf16 output rounding, and against the float64 product within the format's
precision; the MLPs against float64 within MX / bf16 precision; per-format error vs float64 on data with per-block
outliers (MX block scales beat FP8 per-row / per-tensor scales by a wide margin; on plain Gaussian data they are
comparable); instruction / DMA counts and HBM bytes the tiling implies; the MX-vs-bf16 timing story from the
neuroncore.md cost model (decode is weight-DMA-bound: ~2x from the bytes; prefill is PE-bound: the MX matmuls run at
4x the bf16 rate, so the kernel approaches the MX peak); the gen4-only error on trn2 and bad MX shapes.

Also covered: MXFP4 weights (``float4_e2m1fn_x4``), ``float8_e8m0fnu``-typed scales, trn3's wide moving tiles (2048 /
4096 columns with fp32 PSUM, 8192 with bf16 PSUM accumulation), LNC = 2 (alternate N tiles per core), and the fp8
double_row perf mode, whose PE time sits between plain fp8 and MX as the cost model says (1x / 2x / 4x).

The nsim fixes this family needed (their regression tests fail without them): nsim's sanitizer (engines/check/
checker.cpp ``Checker::before``) treated the scale operands of ``nc_matmul_mx`` as read on every partition of their
views, though the instruction reads only the rows of the scale placement ((g // 4) * 32 + g % 4 for 8-row group g,
nki-api.md 2.3): a scale tile loaded from compact HBM scales with one DMA per quadrant got a false NSIM-W501
uninitialized-read; now only those rows are checked (``test_unused_scale_rows_are_not_read``). (The kernels still
zero their scale tiles on GpSimd first, as written before the fix.)
"""
import numpy as np
import pytest

from conftest import executed_ops, require_core, sample_fixture, run_clean, op_counts  # noqa: E402

_core, ml_dtypes = require_core()
from numeric_helpers import close, f64, randn  # noqa: E402

BF16 = ml_dtypes.bfloat16
E4M3 = ml_dtypes.float8_e4m3fn
E4M3_MAX = 448.0
EMAX = 8  # e4m3fn element emax (OCP MX)

mx = sample_fixture("mx_gemm_kernels_new.py", module_only=True)


def trn3(k):
    return k.options(config="trn3")


# --------------------------------------------------------------------------------------------------
# numpy MX emulation (independent of nsim)
# --------------------------------------------------------------------------------------------------

def mx_order(K):
    """Contraction index of (packed row r, slot q) as the kernels lay it out: K tile kt = r // 128 holds
    kp = min(128, (K - 512 kt) / 4) packed rows; slot q of row k of the tile is index 512 kt + q kp + k.
    Returns an int array [K/4, 4]."""
    idx = np.zeros((K // 4, 4), np.int64)
    for kt in range((K + 511) // 512):
        kp = min(128, (K - 512 * kt) // 4)
        for q in range(4):
            idx[kt * 128:kt * 128 + kp, q] = 512 * kt + q * kp + np.arange(kp)
    return idx


def mx_quantize(w):
    """MX e4m3fn quantization of w [K, N] along K in the kernels' layout: (packed uint32 [K/4, N], compact scale
    bytes [K/32, N], dequantized float64 [K, N]). Block = 8 packed rows x 4 slots: amax -> X = 2^(floor(log2
    amax) - (Emax - 1)) (2^-127 for an all-zero block) -> RNE(v / X) into e4m3fn (clipped to +-448)."""
    w = f64(w)
    K, N = w.shape
    idx = mx_order(K)
    v = w[idx]                                     # [K/4, 4, N]
    blk = v.reshape(K // 32, 8, 4, N)
    amax = np.abs(blk).max(axis=(1, 2))            # [K/32, N]
    with np.errstate(divide="ignore"):
        e = np.where(amax == 0, -127, np.clip(np.floor(np.log2(np.where(amax == 0, 1, amax))) - (EMAX - 1),
                                              -127, 127)).astype(np.int64)
    X = 2.0 ** e
    q = np.clip(blk / X[:, None, None, :], -E4M3_MAX, E4M3_MAX).astype(np.float32).astype(E4M3)
    deq_blk = q.astype(np.float64) * X[:, None, None, :]
    codes = q.view(np.uint8).reshape(K // 4, 4, N).transpose(0, 2, 1)   # [K/4, N, 4]
    packed = np.ascontiguousarray(codes).view("<u4").reshape(K // 4, N)
    deq = np.empty_like(w)
    deq[idx] = deq_blk.reshape(K // 4, 4, N)
    return packed, (e + 127).astype(np.uint8), deq


def mxfp4_quantize(w):
    """MX e2m1fn (fp4) quantization of w [K, N] along K in the kernels' layout: (packed uint16 [K/4, N], scale
    bytes [K/32, N], dequantized float64). Emax 2 (e2m1: 0.5, 1, 1.5, 2, 3, 4, 6), X = 2^(floor(log2 amax) - 2),
    RNE into e2m1 clipped to +-6; four values per uint16, slot 0 in the low nibble of the low byte."""
    fp4 = ml_dtypes.float4_e2m1fn
    w = f64(w)
    K, N = w.shape
    idx = mx_order(K)
    blk = w[idx].reshape(K // 32, 8, 4, N)
    amax = np.abs(blk).max(axis=(1, 2))
    e = np.where(amax == 0, -127, np.floor(np.log2(np.where(amax == 0, 1, amax))) - 2).astype(np.int64)
    X = 2.0 ** e
    q = np.clip(blk / X[:, None, None, :], -6, 6).astype(np.float32).astype(fp4)
    deq = np.empty_like(w)
    deq[idx] = (q.astype(np.float64) * X[:, None, None, :]).reshape(K // 4, 4, N)
    nib = q.view(np.uint8).reshape(K // 4, 4, N).astype(np.uint16) & 15
    packed = nib[:, 0] | nib[:, 1] << 4 | nib[:, 2] << 8 | nib[:, 3] << 12
    return packed.astype(np.uint16), (e + 127).astype(np.uint8), deq


def mx_dequant_act(x):
    """x [M, K] quantized as the kernels quantize activations on chip (blocks along K), dequantized, float64."""
    return mx_quantize(f64(x).T)[2].T


def _rel_err(got, want):
    return np.abs(f64(got) - want).max() / np.abs(want).max()


# --------------------------------------------------------------------------------------------------
# MX GEMM
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("M, K, N", [(8, 512, 512), (128, 1024, 768), (100, 640, 256)])
def test_mx_gemm_matches_mx_emulation(mx, M, K, N):
    """K = 640: a 128-value tail tile (32 packed rows); N = 768: a ragged 256-column N tile; M = 100: a ragged
    token tile. Reference: x and W quantized by the numpy emulation, dequantized, multiplied in float64; the
    kernel accumulates in fp32 and rounds to bf16 once (half a bf16 ulp, 2^-9 relative, plus fp32 sums)."""
    x = randn((M, K), BF16, seed=M + K)
    w = randn((K, N), np.float32, seed=N) * 0.05
    wq, ws, wdeq = mx_quantize(w)
    out = run_clean(trn3(mx.mx_gemm), x, wq, ws)
    assert out.dtype == BF16 and out.shape == (M, N)
    xdeq = mx_dequant_act(x)
    ref = xdeq @ wdeq
    mag = np.abs(xdeq) @ np.abs(wdeq)
    assert np.all(np.abs(f64(out) - ref) <= 2.0 ** -8 * np.abs(ref) + 1e-5 * mag)
    # and the exact product within MX fp8 precision: each operand is within 2^-4 relative (e4m3 RNE, 3 mantissa
    # bits), the errors are independent, so the sum's error is a few percent of its magnitude
    exact = f64(x) @ f64(w)
    assert np.abs(f64(out) - exact).max() <= 0.03 * mag.max()



def _mx_one_tile_kernel(memset_scales):
    """One nc_matmul_mx of a [128, 128] x4 stationary and a [128, 64] x4 moving whose scales come from compact HBM
    scales [16, cols] with one DMA per quadrant (rows 0..3, 32..35, 64..67, 96..99 of the scale tiles)."""
    from nsim import nki
    import nsim.nki.isa as nisa
    import nsim.nki.language as nl

    @nki.jit
    def k(a_q, a_s, b_q, b_s):
        a = nl.ndarray((128, 128), dtype=nl.float8_e4m3fn_x4, buffer=nl.sbuf)
        b = nl.ndarray((128, 64), dtype=nl.float8_e4m3fn_x4, buffer=nl.sbuf)
        nisa.dma_copy(dst=a, src=a_q.view(nl.float8_e4m3fn_x4))
        nisa.dma_copy(dst=b, src=b_q.view(nl.float8_e4m3fn_x4))
        sa = nl.ndarray((128, 128), dtype=nl.uint8, buffer=nl.sbuf)
        sb = nl.ndarray((128, 64), dtype=nl.uint8, buffer=nl.sbuf)
        if memset_scales:
            nisa.memset(dst=sa, value=0)
            nisa.memset(dst=sb, value=0)
        for j in range(4):
            nisa.dma_copy(dst=sa[32 * j:32 * j + 4, :], src=a_s[4 * j:4 * j + 4, :])
            nisa.dma_copy(dst=sb[32 * j:32 * j + 4, :], src=b_s[4 * j:4 * j + 4, :])
        ps = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul_mx(dst=ps, stationary=a, moving=b, stationary_scale=sa, moving_scale=sb)
        o = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=o, src=ps)
        out = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=o)
        return out
    return k.options(config="trn3")


def _one_tile_args():
    a = randn((512, 128), np.float32, seed=1)
    b = randn((512, 64), np.float32, seed=2)
    aq, as_, adeq = mx_quantize(a)
    bq, bs, bdeq = mx_quantize(b)
    return (aq, as_, bq, bs), adeq.T @ bdeq, np.abs(adeq).T @ np.abs(bdeq)


def test_one_tile_with_zeroed_scale_rows_matches():
    args, ref, mag = _one_tile_args()
    out = run_clean(_mx_one_tile_kernel(True), *args)
    assert np.all(np.abs(out - ref) <= 1e-5 * mag)


def test_unused_scale_rows_are_not_read():
    """nc_matmul_mx reads the scale of 8-row group g from partition (g // 4) * 32 + g % 4 only (nki-api.md 2.3):
    a scale tile whose other rows were never written, loaded from compact HBM scales with one DMA per quadrant,
    is a correct kernel and must run without a sanitizer report (and give the same numbers)."""
    args, ref, mag = _one_tile_args()
    out = run_clean(_mx_one_tile_kernel(False), *args)
    assert np.all(np.abs(out - ref) <= 1e-5 * mag)


def test_mx_gemm_structure(mx):
    """M = 128, K = 1024, N = 768: 2 K tiles x 2 N tiles (512 + 256 columns). One 3-D ``dma_transpose`` and one
    ``quantize_mx`` per K tile; per (N tile, K tile) one weight DMA, 4 scale DMAs (one per quadrant) and one
    ``nc_matmul_mx``; one eviction and one store per N tile. HBM reads: x once (bf16), the packed weights once
    (1 byte per value) and the compact scales (1 byte per 32 values)."""
    M, K, N = 128, 1024, 768
    x = randn((M, K), BF16, seed=3)
    wq, ws, _ = mx_quantize(randn((K, N), np.float32, seed=4))
    run_clean(trn3(mx.mx_gemm), x, wq, ws)
    c = op_counts(mx.mx_gemm)
    KT, NT = 2, 2
    assert c["dma_transpose"] == KT and c["quantize_mx"] == KT, c
    assert c["nc_matmul_mx"] == NT * KT and c["tensor_copy"] == NT, c
    assert c["dma_copy"] == NT * KT * (1 + 4) + NT, c
    assert c["nc_matmul"] == 0, c
    prof = mx.mx_gemm.last_profile
    assert prof.stat("memory.hbm_read_bytes") == M * K * 2 + K * N + K * N // 32
    assert prof.stat("memory.hbm_write_bytes") == M * N * 2
    # the accumulation chain: each N tile's matmuls write the same PSUM tile, K tile 0 first
    mms = [o for o in executed_ops(mx.mx_gemm.last_json["body"]) if o["op"] == "nc_matmul_mx"]
    assert len(mms) == NT * KT
    assert prof.stat("flops.mx") == 2 * M * K * N


# --------------------------------------------------------------------------------------------------
# MX MLP (SwiGLU) vs bf16
# --------------------------------------------------------------------------------------------------

def _mlp_weights(H, I, seed=0):
    wg = randn((H, I), np.float32, seed=seed + 1) / np.sqrt(H)
    wu = randn((H, I), np.float32, seed=seed + 2) / np.sqrt(H)
    wd = randn((I, H), np.float32, seed=seed + 3) / np.sqrt(I)
    return wg, wu, wd


def _mlp_ref(x, wg, wu, wd):
    x = f64(x)
    g, u = x @ f64(wg), x @ f64(wu)
    return (g / (1 + np.exp(-g)) * u) @ f64(wd)


def _mx_args(x, wg, wu, wd):
    return (x,) + mx_quantize(wg)[:2] + mx_quantize(wu)[:2] + mx_quantize(wd)[:2]


def _bf16_args(x, wg, wu, wd):
    return (x, wg.astype(BF16), wu.astype(BF16), wd.astype(BF16))


@pytest.mark.parametrize("M", [8, 512, 600])
def test_mx_mlp_matches_float64(mx, M):
    """Decode (M = 8), prefill (M = 512: one chunk of 512 tokens = 4 down-projection token tiles) and a ragged
    second chunk (M = 600). The MX MLP quantizes three operands per matmul chain (x, the weights, the SwiGLU
    intermediate) to e4m3 (3 mantissa bits: 2^-4 relative per element): its output is within 10% of the
    float64 output's range, where the bf16 MLP is within 1%; and it equals a numpy emulation of the MX chain."""
    H, I = 512, 1024
    x = randn((M, H), BF16, seed=M)
    w = _mlp_weights(H, I)
    ref = _mlp_ref(x, *w)
    out = run_clean(trn3(mx.mx_mlp), *_mx_args(x, *w))
    outb = run_clean(trn3(mx.bf16_mlp), *_bf16_args(x, *w))
    assert out.dtype == BF16 and out.shape == (M, H) and outb.shape == (M, H)
    e_mx, e_bf = _rel_err(out, ref), _rel_err(outb, ref)
    assert e_bf < 0.01 and e_mx < 0.1, (e_mx, e_bf)
    assert e_mx > 2 * e_bf  # (the MX error is the format's, not a bug hiding in both)
    # the whole chain emulated in numpy: x and the weights MX-quantized, SwiGLU in float64 rounded to bf16 (the
    # kernel's interleaved tile), that intermediate MX-quantized along I in the kernels' block layout (slot
    # it % 4 of down K tile it // 4), the down product: the kernel agrees to fp32 / bf16 rounding, plus a few
    # e4m3 rounding-tie flips of the intermediate (each one fp8 ulp of one term: 2e-3 of the magnitude bounds them)
    wg, wu, wd = [mx_quantize(a)[2] for a in w]
    xd = mx_dequant_act(x)
    g, u = xd @ wg, xd @ wu
    hd = mx_dequant_act((g / (1 + np.exp(-g)) * u).astype(BF16))
    emul, mag = hd @ wd, np.abs(hd) @ np.abs(wd)
    assert np.all(np.abs(f64(out) - emul) <= 2.0 ** -8 * np.abs(emul) + 2e-3 * mag)


def test_mx_mlp_structure(mx):
    """H = 512, I = 1024, M = 600 (chunks of 512 and 88 tokens): weights and scales loaded once (per 512-row K tile one
    packed DMA + 4 quadrant scale DMAs, one GpSimd memset), per chunk one dma_transpose + quantize_mx per H tile,
    2 x IT x HT gate/up matmuls, IT silu + multiply, one quantize_mx per 512 intermediate values, and per 128-token
    tile x 512-column H tile DT down matmuls, one eviction and one store."""
    H, I, M = 512, 1024, 600
    HT, DT, IT = H // 512, I // 512, I // 128
    x = randn((M, H), BF16, seed=1)
    run_clean(trn3(mx.mx_mlp), *_mx_args(x, *_mlp_weights(H, I)))
    c = op_counts(mx.mx_mlp)
    chunks = [512, 88]
    tiles = sum((mc + 127) // 128 for mc in chunks)  # 4 + 1 token tiles of the down projection
    assert c["memset"] == 2 * HT + DT, c
    assert c["dma_copy"] == 5 * (2 * HT + DT) + tiles * (H // 512), c
    assert c["dma_transpose"] == len(chunks) * HT and c["quantize_mx"] == len(chunks) * (HT + DT), c
    assert c["nc_matmul_mx"] == len(chunks) * 2 * IT * HT + tiles * (H // 512) * DT, c
    assert c["activation"] == c["tensor_tensor"] == len(chunks) * IT, c
    assert c["tensor_copy"] == tiles * (H // 512), c
    prof = mx.mx_mlp.last_profile
    assert prof.stat("memory.hbm_read_bytes") == 3 * H * I * (1 + 1 / 32) + M * H * 2
    assert prof.stat("memory.hbm_write_bytes") == M * H * 2
    assert prof.stat("flops.mx") == 3 * 2 * M * H * I


def _times(mx, H, I, M):
    x = randn((M, H), BF16, seed=5)
    w = _mlp_weights(H, I)
    _, pm = mx.mx_mlp.options(config="trn3", timing_only=True).simulate(*_mx_args(x, *w))
    _, pb = mx.bf16_mlp.options(config="trn3", timing_only=True).simulate(*_bf16_args(x, *w))
    return pm, pb


def test_mx_mlp_decode_is_weight_bound_and_about_2x_faster(mx):
    """Decode, M = 8, H = 2048, I = 1024: 8 tokens reuse each weight only 8 times, far below the ridge (neuroncore.md
    1.3: 314.6 TFLOP/s MX / 528 GB/s per core ~ 600 FLOP/B), so both kernels are bound by streaming the weights
    from HBM. bf16 weights are 2 bytes per value, MX 1 + 1/32 (fp8 element + one E8M0 byte per 32-value block):
    the expected speed-up is the byte ratio, 2 / (33/32) = 1.94, minus the fixed DMA / instruction latencies both
    pay. Measured ~1.7x."""
    H, I, M = 2048, 1024, 8
    pm, pb = _times(mx, H, I, M)
    rm, rb = pm.stat("memory.hbm_read_bytes"), pb.stat("memory.hbm_read_bytes")
    assert rb / rm == pytest.approx(2 / (33 / 32), rel=0.01)
    speedup = pb.total_time_ns / pm.total_time_ns
    assert 1.4 < speedup < 2.0, speedup
    # neither is PE-bound: TensorE is busy well under half the time in both
    for p in (pm, pb):
        assert p.stat("engine.tensor.busy_time") < 0.5 * p.total_time_ns


def test_mx_mlp_prefill_approaches_the_mx_peak(mx):
    """Prefill, M = 2048, H = 2048, I = 1024 (4 chunks of 512 tokens; the weights load once): 25.8 GFLOP.
    Cost model (neuroncore.md 3.1): one nc_matmul_mx contracts K = 512 (128 packed rows x 4) at the II of a K = 128
    bf16 nc_matmul (ii_mm = max(64, N) cycles, N = 512 here), so the MX PE rate is 4x bf16: 314.6 vs 78.6
    TFLOP/s (peak_tflops.mx / .bf16). PE time at peak: 82 us MX, 328 us bf16. The bf16 kernel is PE-bound
    (~95% of its peak); the MX one keeps ~70% of the MX peak, the rest being the weight / activation DMAs of the
    first chunk, the power-throttle ramp (3.4) and the VectorE / ScalarE SwiGLU and quantize work that the 4x
    faster PE no longer hides. Expected speed-up: 4 x 0.7 / 0.95 ~ 3 (measured ~3.0)."""
    H, I, M = 2048, 1024, 2048
    pm, pb = _times(mx, H, I, M)
    flops = 3 * 2 * M * H * I
    assert pm.stat("flops.mx") == flops
    mx_peak = pm.stat("flops.tensor_peak_mx_per_s")
    bf_peak = pb.stat("flops.tensor_peak_per_s")
    assert mx_peak == pytest.approx(4 * bf_peak) and mx_peak == pytest.approx(2 * 128 * 128 * 2.4e9 * 4)
    frac_mx = flops / (pm.total_time_ns * 1e-9) / mx_peak
    frac_bf = flops / (pb.total_time_ns * 1e-9) / bf_peak
    assert 0.6 < frac_mx <= 1.0 and 0.9 < frac_bf <= 1.0, (frac_mx, frac_bf)
    speedup = pb.total_time_ns / pm.total_time_ns
    assert 2.5 < speedup < 4.0, speedup
    # and the matmul count: K = 512 per MX instruction, 128 per bf16 one (4x fewer MX matmuls)
    assert 4 * pm.stat("engine.matmul_instruction_count") == pb.stat("engine.matmul_instruction_count")


# --------------------------------------------------------------------------------------------------
# FP8 (per-row / per-tensor scales) vs MX (block scales)
# --------------------------------------------------------------------------------------------------

def fp8_quantize(a, axis):
    """e4m3fn quantization of ``a`` with one scale per slice along ``axis`` (None = per tensor): scale = amax / 448,
    values RNE; returns (fp8 array, float32 scales shaped to broadcast, dequantized float64)."""
    a = f64(a)
    amax = np.abs(a).max(axis=axis, keepdims=axis is not None)
    s = np.where(amax == 0, 1.0, amax / E4M3_MAX).astype(np.float32)
    q = (a / f64(s)).astype(np.float32).astype(E4M3)
    return q, s, q.astype(np.float64) * f64(s)


def _run_fp8(mx, x, w, per_row):
    xq, xs, xdeq = fp8_quantize(x, 1 if per_row else None)
    wq, ws, wdeq = fp8_quantize(w, None)
    M = x.shape[0]
    xs_col = np.broadcast_to(xs, (M, 1)).astype(np.float32).copy()
    out = run_clean(trn3(mx.fp8_gemm), np.ascontiguousarray(xq.T), xs_col, wq, float(ws))
    return out, xdeq @ wdeq, np.abs(xdeq) @ np.abs(wdeq)


def _outlier_data(M, K, N, seed):
    """x and w whose magnitudes change per MX block (the kernels' 32-value blocks along K): block b of the
    contraction gets 2^a_b in x and 2^-a_b in w (a_b in [-12, 12]), and row m of x a further 2^r_m (r_m in
    [-6, 6]). Every product x[m, c] w[c, n] stays O(2^r_m), so every block matters to the result, but one scale
    per row (or per tensor) spans 2^24+ of range, beyond e4m3's ~2^17 (448 down to the 2^-9 subnormal)."""
    rng = np.random.default_rng(seed)
    blk = np.empty(K, np.int64)
    blk[mx_order(K).ravel()] = np.repeat(np.arange(K // 32), 32)  # block of each contraction index
    a = rng.integers(-12, 13, size=K // 32)[blk]
    r = rng.integers(-6, 7, size=(M, 1))
    x = (rng.standard_normal((M, K)) * 2.0 ** (a[None, :] + r)).astype(BF16)
    w = (rng.standard_normal((K, N)) * 2.0 ** -a[:, None]).astype(np.float32)
    return x, w


def test_fp8_gemm_matches_its_quantized_reference(mx):
    """The FP8 kernel itself: fp8 e4m3fn nc_matmul on trn3 with fp32 PSUM accumulation over 8 K tiles, dequantized
    by row scale x tensor scale on eviction: equal to the float64 product of the dequantized operands to fp32
    accumulation accuracy plus the bf16 output rounding."""
    M, K, N = 64, 1024, 640
    x, w = randn((M, K), BF16, seed=7), randn((K, N), np.float32, seed=8)
    for per_row in (True, False):
        out, ref, mag = _run_fp8(mx, x, w, per_row)
        assert out.dtype == BF16
        assert np.all(np.abs(f64(out) - ref) <= 2.0 ** -8 * np.abs(ref) + 1e-5 * mag)
    c = op_counts(mx.fp8_gemm)
    assert c["nc_matmul"] == (K // 128) * 2 and c["tensor_scalar"] == 2, c


def test_block_scales_beat_row_and_tensor_scales_on_outliers(mx):
    """Error vs the float64 product, relative to its largest output, per format: MX (block scales, activations
    quantized on chip), FP8 with per-row activation scales and a per-tensor weight scale, FP8 with per-tensor
    scales on both. On per-block outliers the row / tensor scales flush whole blocks to zero (or saturate nothing
    but lose them), MX keeps every block at full e4m3 precision: MX's error is several times lower, and the
    per-tensor one is the worst. On plain Gaussian data the three are within the same e4m3 rounding error."""
    M, K, N = 64, 1024, 512
    x, w = _outlier_data(M, K, N, seed=11)
    exact = f64(x) @ f64(w)
    wq, ws, _ = mx_quantize(w)
    e_mx = _rel_err(run_clean(trn3(mx.mx_gemm), x, wq, ws), exact)
    e_row = _rel_err(_run_fp8(mx, x, w, True)[0], exact)
    e_ten = _rel_err(_run_fp8(mx, x, w, False)[0], exact)
    assert e_mx < 0.05, e_mx
    assert e_row > 4 * e_mx and e_ten >= e_row, (e_mx, e_row, e_ten)
    # no outliers: all three are the e4m3 element rounding (a few percent at most), none far from the others
    x, w = randn((M, K), BF16, seed=12), randn((K, N), np.float32, seed=13)
    exact = f64(x) @ f64(w)
    wq, ws, _ = mx_quantize(w)
    errs = [_rel_err(run_clean(trn3(mx.mx_gemm), x, wq, ws), exact),
            _rel_err(_run_fp8(mx, x, w, True)[0], exact), _rel_err(_run_fp8(mx, x, w, False)[0], exact)]
    assert max(errs) < 0.05 and max(errs) < 2.5 * min(errs), errs


# --------------------------------------------------------------------------------------------------
# errors
# --------------------------------------------------------------------------------------------------

def _code(name):
    from nsim import _errors
    return _errors.code(name)


def test_mx_kernels_are_gen4_only(mx):
    """quantize_mx / nc_matmul_mx exist on NeuronCore-v4 only: on trn2 the GEMM and the MLP stop at their first MX
    instruction with NSIM-E313 NotOnGeneration (the quantize_mx of the activations)."""
    x = randn((8, 512), BF16, seed=1)
    wq, ws, _ = mx_quantize(randn((512, 512), np.float32, seed=2))
    with pytest.raises(Exception) as ei:
        mx.mx_gemm.options(config="trn2")(x, wq, ws)
    assert getattr(ei.value, "code", None) == _code("NotOnGeneration") == "NSIM-E313", str(ei.value)
    assert "quantize_mx" in str(ei.value) and "gen4" in str(ei.value)
    with pytest.raises(Exception) as ei:
        mx.mx_mlp.options(config="trn2")(*_mx_args(randn((8, 512), BF16, seed=3), *_mlp_weights(512, 512)))
    assert getattr(ei.value, "code", None) == "NSIM-E313", str(ei.value)


@pytest.mark.parametrize("K", [576, 544])
def test_k_not_a_multiple_of_the_mx_tile_is_a_clear_error(mx, K):
    """K = 576 / 544: the last K tile holds 64 / 32 values = 16 / 8 packed rows, fewer than the 32 partitions
    quantize_mx needs (a block is 8 partitions x 4 values and the instruction works on whole 32-partition quadrants):
    NSIM ShapeMismatch naming quantize_mx and the partition count, not wrong numbers."""
    x = randn((8, K), BF16, seed=1)
    wq, ws, _ = mx_quantize(randn((K, 256), np.float32, seed=2))
    with pytest.raises(Exception) as ei:
        mx.mx_gemm.options(config="trn3")(x, wq, ws)
    msg = str(ei.value)
    assert getattr(ei.value, "code", None) == _code("ShapeMismatch"), msg
    assert "quantize_mx" in msg and "32" in msg, msg


# --------------------------------------------------------------------------------------------------
# trn3's wide moving tiles and bf16 PSUM
# --------------------------------------------------------------------------------------------------

def test_mx_gemm_wide_moving_tiles_and_bf16_psum(mx):
    """trn3 lets one matmul stream 4096 (fp32 PSUM) / 8192 (bf16 PSUM) moving columns (nki-api.md 2.0, all 8
    banks). N = 8192 with n_tile 2048 / 4096 in fp32 gives the 512-column kernel's numbers with 4x / 8x fewer
    matmuls and less time (fewer, larger weight DMAs and fewer instructions: 30.5 / 38.9 against 41.0 us; at 4096
    the two N tiles' four weight loads all start at once, their 4 rotating buffers free, and the first tile's
    matmuls wait behind the second's transfers on the queues: 35.3 us with two buffers); n_tile 8192 needs a bf16 PSUM
    tile, which accumulates the two K tiles as bf16(bf16(p0) + p1) (upcast, fp32 add, RNE): equal to that
    emulation except where an fp32 partial sum sits at a bf16 rounding tie (one ulp of p0)."""
    import nki.language as nl  # the fixture installed the compat modules
    M, K, N = 128, 1024, 8192
    x = randn((M, K), BF16, seed=1)
    w = randn((K, N), np.float32, seed=2) * 0.05
    wq, ws, wdeq = mx_quantize(w)
    xd = mx_dequant_act(x)
    ref, mag = xd @ wdeq, np.abs(xd) @ np.abs(wdeq)
    times = {}
    for nt in (512, 2048, 4096):
        k = trn3(mx.mx_gemm)
        out = run_clean(k, x, wq, ws, nt, nl.float32)
        assert np.all(np.abs(f64(out) - ref) <= 2.0 ** -8 * np.abs(ref) + 1e-5 * mag), nt
        assert op_counts(mx.mx_gemm)["nc_matmul_mx"] == 2 * N // nt
        times[nt] = k.last_profile.total_time_ns
    assert times[2048] < 0.8 * times[512] and times[4096] < times[512], times
    out = run_clean(trn3(mx.mx_gemm), x, wq, ws, 8192, nl.bfloat16)
    assert op_counts(mx.mx_gemm)["nc_matmul_mx"] == 2
    p0, p1 = xd[:, :512] @ wdeq[:512], xd[:, 512:] @ wdeq[512:]
    emul = (p0.astype(np.float32).astype(BF16).astype(np.float32) + p1.astype(np.float32)).astype(BF16)
    d = np.abs(f64(out) - f64(emul))
    assert (d == 0).mean() > 0.999
    assert np.all(d <= 2.0 ** -8 * (np.abs(p0) + np.abs(f64(emul))) + 1e-5 * mag)
    # 8192 columns in fp32 PSUM do not fit (4096 is the gen4 limit): a clear error, not a silent overflow
    with pytest.raises(Exception) as ei:
        trn3(mx.mx_gemm)(x, wq, ws, 8192, nl.float32)
    assert getattr(ei.value, "code", None) == "NSIM-E206" and "PSUM" in str(ei.value), str(ei.value)


def test_mx_gemm_mxfp4_weights(mx):
    """MXFP4 weights (``float4_e2m1fn_x4``: the host passes uint16 bits, the kernel ``.view``-s them) against MXFP8
    activations quantized on chip: the same accumulation, equal to the numpy emulation to fp32 + bf16 rounding;
    the weight bytes halve (2 bytes per 4 values + 1 scale byte per 32)."""
    M, K, N = 64, 1024, 512
    x = randn((M, K), BF16, seed=21)
    w = randn((K, N), np.float32, seed=22) * 0.05
    wq, ws, wdeq = mxfp4_quantize(w)
    out = run_clean(trn3(mx.mx_gemm), x, wq, ws)
    xd = mx_dequant_act(x)
    ref, mag = xd @ wdeq, np.abs(xd) @ np.abs(wdeq)
    assert np.all(np.abs(f64(out) - ref) <= 2.0 ** -8 * np.abs(ref) + 1e-5 * mag)
    # e2m1 has one mantissa bit: within ~25% of each term, so within ~10% of the product's range
    assert _rel_err(out, f64(x) @ f64(w)) < 0.15
    assert mx.mx_gemm.last_profile.stat("memory.hbm_read_bytes") == M * K * 2 + K * N // 2 + K * N // 32


def test_mx_gemm_e8m0_scales(mx):
    """The same GEMM with the scales typed ``float8_e8m0fnu`` (2^(byte - 127)) instead of uint8, on the host and in
    the kernel's scale tiles (quantize_mx writes the activation scales in that dtype): the same bits, the same
    output."""
    M, K, N = 32, 512, 256
    x = randn((M, K), BF16, seed=31)
    wq, ws, _ = mx_quantize(randn((K, N), np.float32, seed=32))
    a = run_clean(trn3(mx.mx_gemm), x, wq, ws)
    b = run_clean(trn3(mx.mx_gemm), x, wq, ws.view(ml_dtypes.float8_e8m0fnu))
    np.testing.assert_array_equal(a.view(np.uint16), b.view(np.uint16))


def test_mx_gemm_lnc2_splits_the_n_tiles(mx):
    """``mx_gemm[2]`` (LNC = 2, trn3): the two cores take alternate 512-column N tiles of the shared output, each
    quantizing the activations itself. Same bits as LNC = 1; the weights are read once in total (each core its
    half), the activations once per core; faster than one core."""
    M, K, N = 128, 1024, 2048
    x = randn((M, K), BF16, seed=41)
    wq, ws, _ = mx_quantize(randn((K, N), np.float32, seed=42) * 0.05)
    k1 = trn3(mx.mx_gemm)
    a = run_clean(k1, x, wq, ws)
    t1 = k1.last_profile.total_time_ns
    b = run_clean(trn3(mx.mx_gemm)[2], x, wq, ws)
    np.testing.assert_array_equal(a.view(np.uint16), b.view(np.uint16))
    p2 = mx.mx_gemm.last_profile
    assert len(p2.core_times_ns) == 2
    assert p2.stat("memory.hbm_read_bytes") == 2 * M * K * 2 + K * N + K * N // 32
    assert p2.total_time_ns < 0.75 * t1, (p2.total_time_ns, t1)


def test_pe_time_fp8_vs_double_row_vs_mx(mx):
    """The same GEMM (M = 128, K = 2048, N = 2048) three ways on trn3. TensorE time from the cost model
    (neuroncore.md 3.1, f_dt = 1 for all three, ii_mm = max(64, N = 512) cycles per matmul): plain fp8
    nc_matmul contracts K = 128 per instruction (64 matmuls), double_row 256 (32), nc_matmul_mx 512 (16), so
    the PE time halves at each step (fp8 1x / double_row 2x / MX 4x the bf16 rate: peak_tflops 78.6 / 157.3 /
    314.6): 64 / 32 / 16 x 512 cycles at 2.4 GHz = 13,653 / 6,827 / 3,413 ns. double_row gives the plain kernel's
    numbers (same fp8 products, same fp32 accumulation). The PE time is TensorE's busy time less what the power
    throttle added (tensor.throttled_time, neuroncore.md C26: ~1.9 us on a kernel this short, whose TensorE starts
    from idle, and more or less of it as the loads let the matmuls run back to back)."""
    M, K, N = 128, 2048, 2048
    x, w = randn((M, K), BF16, seed=7), randn((K, N), np.float32, seed=8)
    xq, xs, xd = fp8_quantize(x, 1)
    wq, wsc, wd = fp8_quantize(w, None)
    ref, mag = xd @ wd, np.abs(xd) @ np.abs(wd)
    pe, outs = {}, {}
    for dr in (False, True):
        k = trn3(mx.fp8_gemm)
        outs[dr] = run_clean(k, np.ascontiguousarray(xq.T), xs.astype(np.float32), wq, float(wsc), dr)
        assert np.all(np.abs(f64(outs[dr]) - ref) <= 2.0 ** -8 * np.abs(ref) + 1e-5 * mag)
        assert op_counts(mx.fp8_gemm)["nc_matmul"] == (K // 128 if not dr else K // 256) * (N // 512)
        pe[dr] = k.last_profile.stat("bound.tensor.time") - k.last_profile.stat("tensor.throttled_time")
    np.testing.assert_array_equal(outs[False].view(np.uint16), outs[True].view(np.uint16))
    wq4, ws4, _ = mx_quantize(w)
    k = trn3(mx.mx_gemm)
    run_clean(k, x, wq4, ws4)
    assert op_counts(mx.mx_gemm)["nc_matmul_mx"] == (K // 512) * (N // 512)
    pe["mx"] = k.last_profile.stat("bound.tensor.time") - k.last_profile.stat("tensor.throttled_time")
    assert pe["mx"] == pytest.approx(16 * 512 / 2.4, rel=0.02), pe
    assert pe[False] / pe[True] == pytest.approx(2, rel=0.02), pe
    assert pe[True] / pe["mx"] == pytest.approx(2, rel=0.02), pe
