"""The NKI tutorials in their new-dialect form (tests/python/kernels/nki_tutorials_new_dialect.py: SPMD tensor
addition, transpose 2-D, average pool 2-D, RMSNorm, LayerNorm v1 / v2, fused Mamba v1-v3, the fused
self-attention for small head sizes, softmax; ``import nki`` resolved by ``nsim.compat``, the kernels unchanged)
against numpy references written here (float64; bf16 cases round where the kernel stores an intermediate), at
several shapes incl. ragged last row tiles and bn_stats chunks, the SPMD kernel at launch grids 1 and 2; and per
kernel the instruction / DMA counts its structure implies, or the engine that does the work. Also the fix these
kernels exposed: an LNC=2 launch whose programs all leave an output unwritten reports it (E409) instead of
returning None."""
import re

import numpy as np
import pytest

from conftest import executed_ops, require_core, sample_fixture  # noqa: E402

_core, ml_dtypes = require_core()
from numeric_helpers import close, rounded  # noqa: E402

import nsim.tracer  # noqa: E402

BF16 = ml_dtypes.bfloat16

tut = sample_fixture("nki_tutorials_new_dialect.py", module_only=True)


def _randn(shape, dtype, seed, scale=1.0, shift=0.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale + shift).astype(dtype)


def _f64(x):
    return np.asarray(x).astype(np.float64)


def _ops(kernel):
    """The executed ops of the kernel's last trace (every core's, for an LNC=2 launch)."""
    j = kernel.last_json
    if "core_programs" in j:
        return [o for cp in j["core_programs"] for o in executed_ops(cp["body"])]
    return executed_ops(j["body"])


def _count(ops, name):
    return sum(1 for o in ops if o["op"] == name)


def _on(prof, engine, op, prefix=""):
    """Instructions of opcode ``op`` that ran on ``engine`` (profile stats)."""
    try:
        return prof.stat("{}engine.{}.opcode.{}.count".format(prefix, engine, op))
    except KeyError:
        return 0


def _at_zero(start):
    """An IR index start (an int, or an expression of loop variables such as "128*i + 512") with every loop
    variable 0."""
    return start if isinstance(start, int) else eval(re.sub(r"[A-Za-z_]\w*", "0", start))


# --------------------------------------------------------------------------------------------------
# (1) SPMD tensor addition
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape,dtype", [((256, 512), np.float32), ((512, 1024), np.float32), ((1024, 512), BF16)])
@pytest.mark.parametrize("grid", [None, 1, 2])
def test_tensor_add_matches_numpy(tut, shape, dtype, grid):
    """Plain call, kernel[1] and kernel[2] (through the tutorial's caller): every [128, 512] tile is added, by
    whichever program owns it; the sum is computed in float32 and stored in the input dtype (bit-exact)."""
    a = _randn(shape, dtype, seed=shape[0])
    b = _randn(shape, dtype, seed=shape[1] + 1)
    out = tut.nki_tensor_add_kernel_(a, b) if grid is None else tut.nki_tensor_add(a, b, grid=grid)
    assert out.shape == shape and out.dtype == np.dtype(dtype)
    want = (a.astype(np.float32) + b.astype(np.float32)).astype(dtype)
    np.testing.assert_array_equal(np.asarray(out, np.float32), np.asarray(want, np.float32))


def test_tensor_add_spmd_split_and_time(tut):
    """[1024, 1024] fp32 = 8 x 2 tiles: per tile two loads, one VectorE/GpSimd add and one store. Under kernel[2]
    each program (physical core) takes 4 row tiles: half the instructions each, core 0 the first 512 rows and core
    1 the rest; the kernel is DMA-bound, so two cores take about half the time of one."""
    a = _randn((1024, 1024), np.float32, seed=1)
    k = tut.nki_tensor_add_kernel_
    out1, p1 = k.simulate(a, a)
    ops1 = _ops(k)
    assert _count(ops1, "dma_copy") == 3 * 16 and _count(ops1, "tensor_tensor") == 16
    assert _on(p1, "vector", "tensor_tensor") + _on(p1, "gpsimd", "tensor_tensor") == 16
    assert p1.stat("engine.matmul_instruction_count") == 0
    out2, p2 = k[2].simulate(a, a)
    np.testing.assert_array_equal(out1, out2)
    assert p2.cores == 2
    for c in (0, 1):
        pre = "core{}.".format(c)
        assert _on(p2, "vector", "tensor_tensor", pre) + _on(p2, "gpsimd", "tensor_tensor", pre) == 8
        body = k.last_json["core_programs"][c]["body"]
        stores = [o for o in executed_ops(body) if o["op"] == "dma_copy" and isinstance(o["dst"], dict)
                  and o["dst"]["tensor"] == "c_output"]
        assert len(stores) == 8
        assert _at_zero(stores[0]["dst"]["index"][0]["start"]) == 512 * c  # the first row the core stores
    t1, t2 = p1.total_time_ns, p2.total_time_ns
    assert 0.4 * t1 < t2 < 0.65 * t1, (t1, t2)


def test_tensor_add_output_no_program_writes_is_reported(tut):
    """[128, 512]: one row tile. kernel[1] adds it; under kernel[2] each program's share is 0 tiles (the tutorial
    assumes the tiles divide evenly between the programs), so neither program writes c_output. The LNC=2 launch
    reports the output never written (OutputNotWritten, E409) as a one-core launch of a kernel that writes nothing
    does; it used to return None (each program's tensor table marked it internal, as an output another core
    writes)."""
    a = _randn((128, 512), np.float32, seed=3)
    k = tut.nki_tensor_add_kernel_
    np.testing.assert_array_equal(k[1](a, a), a + a)
    with pytest.raises(nsim.tracer.KernelError, match="E409.*never written"):
        k[2](a, a)


# --------------------------------------------------------------------------------------------------
# (2) transpose 2-D
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("p,shape2d,dtype", [(64, (3, 4), np.float32), (128, (5, 7), BF16), (7, (16, 2), np.float32),
                                             (1, (1, 9), np.float32)])
def test_transpose2d_matches_numpy(tut, p, shape2d, dtype):
    """Each row holds a row-major (rows, cols) matrix; the output row holds its transpose (a copy: bit-exact)."""
    r, c = shape2d
    x = _randn((p, r * c), dtype, seed=r * 10 + c)
    out = tut.tensor_transpose2D_kernel_(x, shape2d)
    assert out.shape == x.shape and out.dtype == np.dtype(dtype)
    want = x.reshape(p, r, c).transpose(0, 2, 1).reshape(p, r * c)
    np.testing.assert_array_equal(np.asarray(out, np.float32), np.asarray(want, np.float32))


def test_transpose2d_is_one_strided_copy(tut):
    """One load, one SBUF-to-SBUF tensor_copy whose source is the transposed access pattern (read in place, no
    TensorE transpose), one store."""
    x = _randn((32, 24), np.float32, seed=2)
    k = tut.tensor_transpose2D_kernel_
    _, prof = k.simulate(x, (4, 6))
    ops = _ops(k)
    assert [o["op"] for o in ops] == ["dma_copy", "tensor_copy", "dma_copy"]
    src = ops[1]["src"]  # in_tile seen as [32, 4, 6] and read in the order (p, col, row)
    assert src["tensor"] == "in_tile" and src["shape"] == [32, 4, 6] and src["order"] == [0, 2, 1], src
    assert prof.stat("engine.tensor.instruction_count") == 0


# --------------------------------------------------------------------------------------------------
# (3) average pool 2-D
# --------------------------------------------------------------------------------------------------

def _avgpool(x, k):
    c, h, w = x.shape
    ho, wo = h // k, w // k
    return _f64(x)[:, :ho * k, :wo * k].reshape(c, ho, k, wo, k).mean(axis=(2, 4))


@pytest.mark.parametrize("c,h,w,pool,dtype", [(64, 12, 10, 2, np.float32), (128, 13, 11, 3, np.float32),
                                              (32, 8, 8, 4, BF16), (5, 6, 9, 3, np.float32)])
def test_avgpool_matches_numpy(tut, c, h, w, pool, dtype):
    """Windows pool x pool with stride pool; rows / columns past the last whole window are dropped (13 x 11 with
    3 x 3 windows). Sum in float32, scaled by 1/pool^2, stored in the input dtype."""
    x = _randn((c, h, w), dtype, seed=h * w)
    out = tut.tensor_avgpool_kernel(x, pool)
    assert out.shape == (c, h // pool, w // pool) and out.dtype == np.dtype(dtype)
    want = _avgpool(x, pool)
    close(out, rounded(want, dtype) if dtype == BF16 else want, dtype)


def test_avgpool_reduces_the_window_view_in_place(tut):
    """One load, one tensor_reduce over the 5-D window view of the loaded tile (no copy of the windows: the
    access reads the tile with a finer shape and an order), one tensor_scalar, one store; nothing on TensorE or
    ScalarE's activation path."""
    x = _randn((64, 12, 10), np.float32, seed=3)
    k = tut.tensor_avgpool_kernel
    _, prof = k.simulate(x, 2)
    ops = _ops(k)
    assert [o["op"] for o in ops] == ["dma_copy", "tensor_reduce", "tensor_scalar", "dma_copy"]
    data = ops[1]["data"]
    assert data["tensor"] == "in_tile" and data["shape"] == [64, 6, 2, 5, 2], data
    assert prof.stat("engine.tensor.instruction_count") == 0
    assert prof.stat("engine.scalar.activate_instruction_count") == 0


# --------------------------------------------------------------------------------------------------
# (4) RMSNorm
# --------------------------------------------------------------------------------------------------

def _rmsnorm(a, g, dtype):
    r = 1.0 / np.sqrt((_f64(a) ** 2).mean(axis=1, keepdims=True))
    y = _f64(a) * r
    if dtype == BF16:
        y = rounded(y, BF16)  # out_tile holds a * rms_reciprocal in the input dtype
    return y * _f64(g)


@pytest.mark.parametrize("rows,cols,dtype", [(250, 256, np.float32), (128, 512, np.float32), (64, 384, BF16),
                                             (300, 1024, BF16)])
def test_rmsnorm_matches_numpy(tut, rows, cols, dtype):
    """Row tiles of 128 with a partial last tile (250 = 128 + 122; 64 alone; 300 = 2 x 128 + 44)."""
    a = _randn((rows, cols), dtype, seed=rows)
    g = _randn((cols,), dtype, seed=cols)
    out = tut.nki_rmsnorm_kernel(a, g)
    assert out.shape == a.shape and out.dtype == np.dtype(dtype)
    close(out, _rmsnorm(a, g, dtype), dtype)


def test_rmsnorm_instructions_per_tile(tut):
    """300 rows: 3 row tiles, the last of 44 rows. One broadcast load of g (partition step 0), then per tile a
    load and a store (the last tile's move 44 partitions), two ScalarE activations (square, rsqrt), one
    tensor_reduce, one tensor_scalar and one tensor_tensor."""
    a = _randn((300, 256), np.float32, seed=4)
    g = _randn((256,), np.float32, seed=5)
    k = tut.nki_rmsnorm_kernel
    _, prof = k.simulate(a, g)
    ops = _ops(k)
    dmas = [o for o in ops if o["op"] == "dma_copy"]
    assert len(dmas) == 1 + 2 * 3
    assert dmas[0]["src"]["tensor"] == "g_tensor" and dmas[0]["src"]["index"][0] == {"start": 0, "broadcast": 128}
    loads = [o for o in dmas[1:]
             if (o["dst"] if isinstance(o["dst"], str) else o["dst"]["tensor"]).startswith("a_tile")]
    assert len(loads) == 3 and loads[-1]["dst"]["index"][0] == {"start": 0, "size": 44}, loads[-1]
    assert _on(prof, "scalar", "activation") == 2 * 3
    assert _count(ops, "tensor_reduce") == 3 and _count(ops, "tensor_scalar") == 3
    assert _count(ops, "tensor_tensor") == 3
    assert prof.stat("engine.tensor.instruction_count") == 0


# --------------------------------------------------------------------------------------------------
# (5) LayerNorm
# --------------------------------------------------------------------------------------------------

def _layernorm(x, eps, g, b):
    x = _f64(x)
    return (x - x.mean(axis=1, keepdims=True)) / np.sqrt(x.var(axis=1, keepdims=True) + eps) * _f64(g) + _f64(b)


LN_CASES = [(250, 700, np.float32), (128, 512, BF16), (300, 64, np.float32), (100, 1100, BF16)]


@pytest.mark.parametrize("version", ["v1", "v2"])
@pytest.mark.parametrize("rows,cols,dtype", LN_CASES)
def test_layernorm_matches_numpy(tut, version, rows, cols, dtype):
    """v1: mean and E[x^2] by reductions; v2: bn_stats over 512-wide chunks (700 = 512 + 188, 1100 = 2 x 512 +
    76: a partial last chunk) aggregated by bn_aggr. Partial last row tiles (250, 300, 100 rows). Inputs with an
    offset, so a wrong mean or variance shows."""
    x = _randn((rows, cols), dtype, seed=rows + cols, shift=0.5)
    g = _randn((cols,), dtype, seed=1)
    b = _randn((cols,), dtype, seed=2)
    k = tut.nki_layernorm_kernel_v1 if version == "v1" else tut.nki_layernorm_kernel_v2
    out = k(x, 1e-5, g, b)
    assert out.shape == x.shape and out.dtype == np.dtype(dtype)
    want = _layernorm(x, 1e-5, g, b)
    if dtype == np.float32:
        close(out, want)
    else:
        np.testing.assert_allclose(np.asarray(out, np.float32), want, rtol=1e-2, atol=2e-2)


def test_layernorm_v2_bn_stats_chunks_and_fewer_instructions(tut):
    """250 x 1100: 2 row tiles x 3 bn_stats chunks (512, 512, 76 wide: the last reads only 76 columns), one
    bn_aggr per tile; the shift and scale is one two-op tensor_scalar. v2 issues fewer Vector/GpSimd
    instructions than v1 (which reduces twice and applies mean and rstd in two tensor_scalars) and is not
    slower."""
    x = _randn((250, 1100), np.float32, seed=6)
    g = _randn((1100,), np.float32, seed=7)
    b = _randn((1100,), np.float32, seed=8)
    k2 = tut.nki_layernorm_kernel_v2
    _, p2 = k2.simulate(x, 1e-5, g, b)
    ops = _ops(k2)
    stats = [o for o in ops if o["op"] == "bn_stats"]
    assert len(stats) == 2 * 3 and _count(ops, "bn_aggr") == 2
    assert [o["data"]["index"][1]["size"] for o in stats] == [512, 512, 76] * 2
    assert [o["data"]["index"][0]["size"] for o in stats] == [128] * 3 + [122] * 3
    two_op = [o for o in ops if o["op"] == "tensor_scalar" and o.get("alu1") == "multiply"]
    assert len(two_op) == 2 and all(o["alu0"] == "subtract" for o in two_op)
    k1 = tut.nki_layernorm_kernel_v1
    _, p1 = k1.simulate(x, 1e-5, g, b)
    assert _count(_ops(k1), "bn_stats") == 0

    def vector_side(p):
        return p.stat("engine.vector.instruction_count") + p.stat("engine.gpsimd.instruction_count")

    assert vector_side(p2) < vector_side(p1)
    assert p2.total_time_ns <= p1.total_time_ns * 1.02, (p1.total_time_ns, p2.total_time_ns)


# --------------------------------------------------------------------------------------------------
# (6) fused Mamba
# --------------------------------------------------------------------------------------------------

def _mamba_inputs(batch, channels, seq, state, dtype, seed=0):
    rng = np.random.default_rng(seed)
    delta = rng.uniform(0.05, 0.5, (batch, channels, seq)).astype(dtype)
    u = rng.standard_normal((batch, channels, seq)).astype(dtype)
    A = (-rng.uniform(0.5, 2.0, (channels, state))).astype(dtype)
    B = rng.standard_normal((batch, state, seq)).astype(dtype)
    C = rng.standard_normal((batch, state, seq)).astype(dtype)
    return delta, u, A, B, C


def _mamba(delta, u, A, B, C, dtype):
    """out[b, c, t] = sum_s C[b, s, t] h_s[c, t],  h_s[c, t] = exp(delta A[c, s]) h_s[c, t-1] + delta u B[b, s, t].
    bf16: the kernel's tiles are bf16, so deltaA, delta u, delta u B, the scan result (the scan state itself is
    float32), scan C and the running sum over states are rounded where it stores them."""
    r = (lambda v: rounded(v, BF16)) if dtype == BF16 else (lambda v: v)
    delta, u, A, B, C = (_f64(v) for v in (delta, u, A, B, C))
    out = np.zeros(delta.shape)
    for b in range(delta.shape[0]):
        acc = np.zeros(delta.shape[1:])
        for s in range(A.shape[1]):
            d_a = r(np.exp(delta[b] * A[:, s:s + 1]))
            d_bu = r(r(delta[b] * u[b]) * B[b, s][None, :])
            h = np.zeros(delta.shape[1])
            scan = np.zeros(delta.shape[1:])
            for t in range(delta.shape[2]):
                h = d_a[:, t] * h + d_bu[:, t]
                scan[:, t] = h
            acc = r(acc + r(r(scan) * C[b, s][None, :]))
        out[b] = acc
    return out


MAMBA_CASES = [((1, 128, 512, 2), np.float32), ((2, 256, 512, 3), np.float32), ((1, 128, 1024, 2), BF16)]


@pytest.mark.parametrize("version", ["v1", "v2", "v3"])
@pytest.mark.parametrize("dims,dtype", MAMBA_CASES)
def test_mamba_matches_numpy(tut, version, dims, dtype):
    """Three loop orders of the same SSM; v3 runs the scan in 512-wide steps and carries the last column into
    the next step's ``initial`` (1024 = two steps)."""
    delta, u, A, B, C = _mamba_inputs(*dims, dtype, seed=sum(dims))
    k = getattr(tut, "mamba_" + version)
    out = k(delta, u, A, B, C)
    assert out.shape == delta.shape and out.dtype == np.dtype(dtype)
    close(out, _mamba(delta, u, A, B, C, dtype), dtype)


def test_mamba_v3_carries_the_scan_across_sequence_tiles(tut):
    """A scan restarted at zero in the second 512-wide step (no carry) would differ: decays close to 1 keep the
    state of step one alive far into step two."""
    delta, u, A, B, C = _mamba_inputs(1, 128, 1024, 1, np.float32, seed=9)
    A[:] = -0.01
    out = tut.mamba_v3(delta, u, A, B, C)
    want = _mamba(delta, u, A, B, C, np.float32)
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)  # float32 over 1024 slowly decaying steps
    restarted = np.concatenate([_mamba(*(v[..., :512] if v is not A else v for v in (delta, u, A, B, C)),
                                       np.float32),
                                _mamba(*(v[..., 512:] if v is not A else v for v in (delta, u, A, B, C)),
                                       np.float32)], axis=-1)
    assert np.abs(restarted - want)[..., 512:600].max() > 0.1


def test_mamba_versions_loads_and_engines(tut):
    """batch 2, 256 channels (2 tiles), 512 steps, 3 states. v1 loads delta, A, u, B and C per (batch, state,
    channel tile): 5 x 12 = 60 loads; v2 and v3 load delta and u once per (batch, channel tile) and A, B, C per
    state: 2 x 4 + 3 x 12 = 44; 4 stores each. Every version: one exp on ScalarE and one tensor_tensor_scan on
    VectorE per (batch, state, channel tile) (v3: per 512-wide step, one here), no TensorE; v2 is faster than v1
    (it moves 16 fewer [128, 512] tiles)."""
    args = _mamba_inputs(2, 256, 512, 3, np.float32, seed=10)
    times = {}
    for v, loads in (("v1", 60), ("v2", 44), ("v3", 44)):
        k = getattr(tut, "mamba_" + v)
        _, prof = k.simulate(*args)
        ops = _ops(k)
        assert _count(ops, "dma_copy") == loads + 4, v
        assert _on(prof, "scalar", "activation") == 12, v
        assert _on(prof, "vector", "tensor_tensor_scan") == 12, v
        assert prof.stat("engine.tensor.instruction_count") == 0, v
        times[v] = prof.total_time_ns
    assert times["v2"] < times["v1"], times


# --------------------------------------------------------------------------------------------------
# (7) fused self-attention for small head sizes
# --------------------------------------------------------------------------------------------------

def _sd_attention(q, k, v, causal, mixed):
    """softmax(0.125 q k^T [causal: -9984 above the diagonal]) v, with the kernel's roundings: the TensorE inputs
    in bf16 when ``mixed`` (q scaled before the cast), and for bf16 inputs the scores, exp, sum, reciprocal and
    the matmul result stored in bf16 (kernel_dtype)."""
    bf = lambda x: rounded(x, BF16)  # noqa: E731
    low = np.asarray(q).dtype == BF16
    kd = bf if low else (lambda x: x)
    pe = bf if mixed else (lambda x: x)
    s = kd(pe(_f64(q) * 0.125) @ pe(_f64(k)).T)
    if causal:
        s = np.where(np.tril(np.ones(s.shape, bool)), s, -9984.0)
    e = kd(np.exp(s - s.max(axis=1, keepdims=True)))
    recip = kd(1.0 / kd(e.sum(axis=1, keepdims=True)))
    return kd(kd(pe(e) @ pe(_f64(v))) * recip)


ATTN_CASES = [(128, 64, np.float32, False, True), (256, 32, np.float32, True, True),
              (384, 128, np.float32, True, False), (256, 64, BF16, False, True), (256, 16, BF16, True, True)]


@pytest.mark.parametrize("seqlen,d_head,dtype,causal,mixed", ATTN_CASES)
def test_sd_attention_matches_numpy(tut, seqlen, d_head, dtype, causal, mixed):
    q = _randn((seqlen, d_head), dtype, seed=seqlen + d_head)
    k = _randn((seqlen, d_head), dtype, seed=seqlen + d_head + 1)
    v = _randn((seqlen, d_head), dtype, seed=seqlen + d_head + 2)
    out = tut.fused_self_attn_for_SD_small_head_size(q, k, v, use_causal_mask=causal, mixed_precision=mixed)
    assert out.shape == (seqlen, d_head) and out.dtype == np.dtype(dtype)
    want = _sd_attention(q, k, v, causal, mixed)
    if dtype == np.float32 and not mixed:
        close(out, want)
    else:  # float32 inputs with bf16 TensorE operands, or bf16 kernel
        np.testing.assert_allclose(np.asarray(out, np.float32), want, rtol=1e-2, atol=1e-2)
    if causal:  # the first query attends to the first key only (v in bf16 on TensorE when mixed)
        v0 = rounded(v[0], BF16) if mixed or dtype == BF16 else _f64(v[0])
        close(out[0], v0, dtype)


@pytest.mark.parametrize("causal", [False, True])
def test_sd_attention_instruction_counts(tut, causal):
    """seqlen 384 = 3 tiles: 2 x 3 x 3 = 18 matmuls on TensorE (QK^T and PV per q/k tile pair), 3 x (3 + 1)
    PE transposes (the softmax tiles and the divisor), 6 DMA transposes (q and k tiles), 3 loads of v and 3
    transposed stores; the causal mask is 9 affine_selects on GpSimd (none without it); one exp per q tile on
    ScalarE over the whole row of scores."""
    q = _randn((384, 64), np.float32, seed=11)
    k = tut.fused_self_attn_for_SD_small_head_size
    _, prof = k.simulate(q, q, q, use_causal_mask=causal)
    ops = _ops(k)
    assert prof.stat("engine.matmul_instruction_count") == 18
    assert _on(prof, "tensor", "multiply_moving") == 18 and _on(prof, "tensor", "load_stationary") == 18
    assert _on(prof, "tensor", "nc_transpose") == 12
    assert _count(ops, "dma_transpose") == 6 and _count(ops, "dma_copy") == 6
    assert _on(prof, "gpsimd", "affine_select") == (9 if causal else 0)
    assert _on(prof, "scalar", "activation") == 3
    exps = [o for o in ops if o["op"] == "activation"]
    assert all(o["act"] == "exp" and o["data"].startswith("qk_res_buf") for o in exps), exps  # the whole tile


# --------------------------------------------------------------------------------------------------
# (8) softmax
# --------------------------------------------------------------------------------------------------

def _softmax(x):
    x = _f64(x)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@pytest.mark.parametrize("rows,cols,dtype", [(200, 300, np.float32), (128, 1000, BF16), (64, 8, np.float32),
                                             (300, 130, BF16)])
def test_softmax_matches_numpy(tut, rows, cols, dtype):
    """Rows with a large offset (a softmax without the max subtraction would overflow exp); partial last row
    tiles."""
    x = _randn((rows, cols), dtype, seed=rows * cols, scale=4.0, shift=80.0)
    out = tut.nki_softmax_kernel(x)
    assert out.shape == x.shape and out.dtype == np.dtype(dtype)
    close(out, _softmax(x), dtype)
    close(np.asarray(out, np.float64).sum(axis=1), np.ones(rows), dtype)


def test_softmax_engines(tut):
    """200 rows: 2 tiles. Per tile the exp is the only ScalarE instruction; the max and the sum (2 reductions),
    the shift and the scale (2 tensor_scalar) and the reciprocal run on VectorE / GpSimd; 2 loads, 2 stores."""
    x = _randn((200, 300), np.float32, seed=12)
    k = tut.nki_softmax_kernel
    _, prof = k.simulate(x)
    ops = _ops(k)
    assert _count(ops, "dma_copy") == 4
    assert prof.stat("engine.scalar.instruction_count") - _on(prof, "scalar", "dma_copy") == 2
    assert _on(prof, "scalar", "activation") == 2
    for op, n in (("tensor_reduce", 4), ("tensor_scalar", 4), ("reciprocal", 2)):
        assert _on(prof, "vector", op) + _on(prof, "gpsimd", op) == n, op
    assert prof.stat("engine.tensor.instruction_count") == 0
