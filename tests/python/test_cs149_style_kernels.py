"""Kernels in the style of Stanford CS149's assignment 4 for Trainium2 (tests/python/kernels/cs149_style_kernels.py,
Beta-1 dialect, written from memory of the assignment) run through ``nsim.compat`` as the assignment's harness runs
them (``nki.baremetal``, ``nki.benchmark(...).benchmark_result.nc_latency``): the vector-add progression, the tiled
matrix transpose and the fused conv2d + max-pool against numpy written here (float32 and bfloat16, several shapes),
and the instruction counts and simulated-time orderings a student relies on (fewer, larger DMAs are faster; the
conv's matmul count follows its tiling). Also the Beta-1 semantics these kernels rely on: a block tensor with
more than five dims in all (``W_T[kh, kw, out_tile, in_tile]``), ``tile[...] = nl.load(vec[a:b])`` of a 1-D
vector writing the DMA into the tile, and ``nl.max(view, axis=[2, 4])`` as one reduction."""
import numpy as np
import pytest

from conftest import executed_ops, require_core, sample_fixture  # noqa: E402

_core, ml_dtypes = require_core()
from numeric_helpers import close, rand, rounded  # noqa: E402

BF16 = ml_dtypes.bfloat16


cs = sample_fixture("cs149_style_kernels.py")


def op_counts(kernel):
    ops = executed_ops(kernel.last_json["body"])
    out = {}
    for o in ops:
        out[o["op"]] = out.get(o["op"], 0) + 1
    return out


# ---------------------------------------------------------------------------------------------------------
# vector add
# ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name,n,dtype", [
    ("vector_add_naive", 128, np.float32),
    ("vector_add_naive", 100, BF16),              # fewer than 128 rows: 100 partitions
    ("vector_add_tiled", 128 * 3, np.float32),
    ("vector_add_tiled", 1024, BF16),
    ("vector_add_stream", 128 * 512, np.float32),
    ("vector_add_stream", 128 * 512 * 3, BF16),
    ("vector_add_ds", 128 * 2048, np.float32),
    ("vector_add_ds", 128 * 4096, BF16),
])
def test_vector_add_matches_numpy(cs, name, n, dtype):
    """Every version returns a 1-D vector of the input's length and dtype holding a + b (computed in float32,
    stored in the input dtype); the stream and ds versions return a reshape of their 3-D / 2-D HBM output."""
    mod = cs[0]
    a = rand((n,), dtype, seed=n)
    b = rand((n,), dtype, seed=n + 1)
    out = getattr(mod, name)(a, b)
    assert out.shape == (n,) and out.dtype == np.dtype(dtype)
    want = a.astype(np.float64) + b.astype(np.float64)
    if dtype == BF16:
        want = rounded(want, BF16)
    close(out, want, dtype)


def test_vector_add_naive_fails_past_128_elements(cs):
    """Step 1 of the assignment: the naive kernel loads the whole vector as one tile, whose first dim becomes
    the partition dim; 256 elements need 256 partitions and the load is rejected (hence the tiled version)."""
    mod = cs[0]
    a = np.ones(256, np.float32)
    with pytest.raises(Exception, match=r"partition dim and must be <= 128"):
        mod.vector_add_naive(a, a)


def test_vector_add_tiled_loads_into_its_tiles(cs):
    """``a_tile[...] = nl.load(a_vec[m * 128:(m + 1) * 128])``: the load of a 1-D slice is a (128,) tile, which
    behaves as (128, 1) (spec §3.10), so its DMA writes the (128, 1) ``a_tile`` directly, as the compiler emits
    it: per chunk exactly two loads, one add and one store, no copy (nsim used to add a tensor_copy per load)."""
    mod = cs[0]
    n = 128 * 4
    a, b = rand((n,), seed=1), rand((n,), seed=2)
    out = mod.vector_add_tiled(a, b)
    close(out, a.astype(np.float64) + b)
    ops = executed_ops(mod.vector_add_tiled.last_json["body"])
    assert [o["op"] for o in ops] == ["dma_copy", "dma_copy", "tensor_tensor", "dma_copy"] * 4
    assert ops[0]["dst"] == "a_tile" and ops[1]["dst"] == "b_tile", ops[:2]


def test_vector_add_progression_dma_counts_and_latency(cs):
    """M = 2^19 float32 elements (2 MiB per vector). Each version issues 3 DMAs (two loads, one store) per tile:
    tiled, 128-element tiles: 3 * M / 128 = 12288 DMAs of 512 bytes; stream, (128, 512) tiles: 3 * M / 65536 = 24
    DMAs of 256 KiB; ds, (128, 2048) windows: 3 * M / 262144 = 6 DMAs of 1 MiB. The same 6 MiB move in each, so
    the tiled version pays the per-DMA fixed cost 12288 times and is far slower (more than 50x: 4.35 ms against
    21 us when written); stream and ds are bandwidth-bound, within 10 % of each other. Measured as the harness
    does, through ``nki.benchmark(...).benchmark_result.nc_latency`` (microseconds)."""
    _, nki, _, _ = cs
    mod = cs[0]
    m = 1 << 19
    a, b = rand((m,), seed=3), rand((m,), seed=4)
    lat, dmas = {}, {}
    for name in ("vector_add_tiled", "vector_add_stream", "vector_add_ds"):
        bench = nki.benchmark(warmup=2, iters=10, save_neff_name="file.neff")(getattr(mod, name))
        out = bench(a, b)
        close(out, a.astype(np.float64) + b)
        lat[name] = bench.benchmark_result.nc_latency.get_latency_percentile(99)
        assert lat[name] == pytest.approx(bench.last_profile.total_time_ns / 1000.0)
        dmas[name] = op_counts(bench).get("dma_copy", 0)
        assert op_counts(bench).get("tensor_tensor") == dmas[name] // 3
    assert dmas == {"vector_add_tiled": 12288, "vector_add_stream": 24, "vector_add_ds": 6}
    assert lat["vector_add_tiled"] > 50 * lat["vector_add_stream"], lat
    assert abs(lat["vector_add_ds"] - lat["vector_add_stream"]) < 0.1 * lat["vector_add_stream"], lat


# ---------------------------------------------------------------------------------------------------------
# matrix transpose
# ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["matrix_transpose_naive", "matrix_transpose", "matrix_transpose_blocked"])
@pytest.mark.parametrize("m,n,dtype", [(128, 128, np.float32), (256, 384, np.float32), (384, 128, BF16)])
def test_transpose_matches_numpy(cs, name, m, n, dtype):
    """A transpose moves values: bit-exact (the PE transpose is exact, the PSUM copy keeps the dtype)."""
    _, nki, _, _ = cs
    x = rand((m, n), dtype, seed=m + n, lo=-100, hi=100)
    out = nki.baremetal(getattr(cs[0], name))(x)
    assert out.shape == (n, m) and out.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(np.asarray(out, np.float32), np.asarray(x, np.float32).T)


def test_transpose_instruction_counts_and_time(cs):
    """(256, 512): 2 x 4 = 8 blocks of 128 x 128, each transposed once on TensorE (8 nc_transpose) and copied
    out of PSUM on VectorE (8 tensor_copy) by every version. The tiled versions (mgrid + nl.transpose, slices +
    nisa.nc_transpose: the same instructions, the same time) issue one load and one store per block, 16 DMAs; the
    blocked one loads each 128-row stripe once, 256 / 128 = 2 loads + 8 stores = 10 DMAs, and is faster
    (5.5 us against 5.9 us: the tiled versions' 16 transfers overlap over four rotating buffers; 5.6 against 8.2
    us when a tile had two)."""
    _, nki, _, _ = cs
    mod = cs[0]
    x = rand((256, 512), seed=7)
    t, counts = {}, {}
    for name in ("matrix_transpose_naive", "matrix_transpose", "matrix_transpose_blocked"):
        k = getattr(mod, name)
        np.testing.assert_array_equal(nki.baremetal(k)(x), x.T)
        prof = k.last_profile
        t[name] = prof.total_time_ns
        counts[name] = op_counts(k)
        assert prof.stat("engine.tensor.instruction_count") == 8
        assert prof.stat("engine.matmul_instruction_count") == 0
    assert counts["matrix_transpose_naive"] == counts["matrix_transpose"] == \
        {"dma_copy": 16, "nc_transpose": 8, "tensor_copy": 8}
    assert counts["matrix_transpose_blocked"] == {"dma_copy": 10, "nc_transpose": 8, "tensor_copy": 8}
    assert t["matrix_transpose_naive"] == t["matrix_transpose"]
    assert t["matrix_transpose_blocked"] < 0.95 * t["matrix_transpose"], t


# ---------------------------------------------------------------------------------------------------------
# conv2d + max-pool
# ---------------------------------------------------------------------------------------------------------

def reference_conv2d_maxpool(x, w, bias, pool_size=1, dtype=np.float32):
    """Valid (no padding, stride 1) cross-correlation plus bias, in float64; rounded to ``dtype`` as the kernel
    stores it (bias added in float32 before the store), then a pool_size x pool_size / stride pool_size max-pool
    (a ragged last row / column dropped)."""
    b, c_in, h, wd = x.shape
    c_out, _, kh, kw = w.shape
    oh, ow = h - kh + 1, wd - kw + 1
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    out = np.zeros((b, c_out, oh, ow))
    for i in range(kh):
        for j in range(kw):
            out += np.einsum("bchw,oc->bohw", x64[:, :, i:i + oh, j:j + ow], w64[:, :, i, j])
    out += bias.astype(np.float64)[None, :, None, None]
    out = rounded(out, dtype)
    if pool_size > 1:
        ph, pw = oh // pool_size, ow // pool_size
        out = out[:, :, :ph * pool_size, :pw * pool_size].reshape(b, c_out, ph, pool_size, pw, pool_size)
        out = out.max(axis=(3, 5))
    return out


def conv_inputs(b, c_in, c_out, h, w, kh, kw, dtype, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((b, c_in, h, w)).astype(dtype)
    wt = (rng.standard_normal((c_out, c_in, kh, kw)) / np.sqrt(c_in * kh * kw)).astype(dtype)
    bias = rng.standard_normal(c_out).astype(dtype)
    return x, wt, bias


@pytest.mark.parametrize("b,c_in,c_out,h,w,kh,kw,pool,dtype", [
    (1, 128, 64, 8, 8, 3, 3, 1, np.float32),      # C_out < 128: one partial output-channel tile
    (2, 256, 128, 12, 10, 3, 3, 2, np.float32),   # two C_in tiles accumulate in PSUM; 10 x 8 -> 5 x 4
    (1, 128, 64, 12, 13, 3, 3, 2, np.float32),    # 10 x 11 output: the pool drops the last column
    (2, 128, 128, 34, 34, 3, 3, 1, np.float32),   # 32 x 32 = 1024 pixels: two row blocks of 16 rows (512 px)
    (1, 128, 256, 9, 9, 2, 2, 2, BF16),           # two C_out tiles; bf16 in and out
    (1, 256, 128, 7, 9, 1, 3, 1, BF16),           # a 1 x 3 filter
])
def test_conv2d_maxpool_matches_numpy(cs, b, c_in, c_out, h, w, kh, kw, pool, dtype):
    _, nki, _, _ = cs
    x, wt, bias = conv_inputs(b, c_in, c_out, h, w, kh, kw, dtype, seed=h * w + c_out)
    out = nki.baremetal(cs[0].fused_conv2d_maxpool)(x, wt, bias, pool_size=pool)
    oh, ow = h - kh + 1, w - kw + 1
    assert out.shape == (b, c_out, oh // pool, ow // pool) and out.dtype == np.dtype(dtype)
    close(out, reference_conv2d_maxpool(x, wt, bias, pool, dtype), dtype)


def test_conv2d_maxpool_instruction_counts(cs):
    """B = 2, C_in = C_out = 256, 34 x 34 input, 3 x 3 filter, pool 2: a 32 x 32 output; one PSUM bank holds
    512 / 32 = 16 output rows, so 2 row blocks of 16 rows. The kernel issues
    B * row_blocks * C_out_tiles * KH * KW * C_in_tiles = 2 * 2 * 2 * 9 * 2 = 144 nc_matmul, each of one full
    bank (moving = 16 rows x 32 columns = 512 elements per partition), plus KH * KW * C_out_tiles * C_in_tiles =
    36 weight transposes (done once, not per image) and their 36 PSUM evictions. DMAs: 2 weight loads + 2 bias
    loads + B * row_blocks * C_in_tiles = 8 input loads + B * row_blocks * C_out_tiles = 8 stores = 20. Per
    (image, row block, C_out tile) one bias add (tensor_scalar, evicting PSUM) and one max-pool: a single
    tensor_reduce over the 2 x 2 windows read in place (the view ``conv[i_0, 2*i_1 + i_2, 2*i_3 + i_4]`` with
    axes 2 and 4 permuted to the end, axis_count 2), no copy of ``conv`` and no element-wise fold. The PSUM
    accumulator's ``nl.zeros`` is folded into the first matmul of its group (no memset; until 2026-12-06 the kept
    trace kept the 8 fills, the unrolled trace folded them: docs/kernel-json.md)."""
    _, nki, _, _ = cs
    mod = cs[0]
    x, wt, bias = conv_inputs(2, 256, 256, 34, 34, 3, 3, np.float32, seed=11)
    out = nki.baremetal(mod.fused_conv2d_maxpool)(x, wt, bias, pool_size=2)
    close(out, reference_conv2d_maxpool(x, wt, bias, 2))
    k = mod.fused_conv2d_maxpool
    assert op_counts(k) == {"nc_matmul": 144, "nc_transpose": 36, "tensor_copy": 36, "dma_copy": 20,
                            "tensor_scalar": 8, "tensor_reduce": 8}
    assert k.last_profile.stat("engine.matmul_instruction_count") == 144
    ops = executed_ops(k.last_json["body"])
    mms = [o for o in ops if o["op"] == "nc_matmul"]
    assert all([d["size"] for d in o["moving"]["index"][2:]] == [16, 32] for o in mms), mms[0]
    reduces = [o for o in ops if o["op"] == "tensor_reduce"]
    assert all(o["axis_count"] == 2 and o["data"]["tensor"] == "conv" for o in reduces), reduces[0]


def test_conv2d_row_blocks_beat_one_matmul_per_row(cs):
    """The first attempt (one PSUM accumulation per output row: out_width = 14 columns per matmul) against the
    row-blocked kernel (all 14 rows x 14 columns = 196 columns in one accumulation): for B = 2, C_in = 256, 3 x 3
    the per-row kernel issues B * out_height * KH * KW * C_in_tiles = 2 * 14 * 9 * 2 = 504 matmuls, the blocked
    one 2 * 1 * 9 * 2 = 36, each streaming 196 instead of 14 columns; the same results, and the blocked kernel
    is faster (more than 2x: 23 us against 64 us when written)."""
    _, nki, _, _ = cs
    mod = cs[0]
    x, wt, bias = conv_inputs(2, 256, 128, 16, 16, 3, 3, np.float32, seed=5)
    want = reference_conv2d_maxpool(x, wt, bias)
    t = {}
    for name in ("fused_conv2d_maxpool", "fused_conv2d_maxpool_per_row"):
        k = getattr(mod, name)
        close(nki.baremetal(k)(x, wt, bias), want)
        t[name] = k.last_profile.total_time_ns
        assert op_counts(k)["nc_matmul"] == {"fused_conv2d_maxpool": 36, "fused_conv2d_maxpool_per_row": 504}[name]
    assert 2 * t["fused_conv2d_maxpool"] < t["fused_conv2d_maxpool_per_row"], t


def test_block_tensor_with_more_than_five_dims(cs):
    """Beta 1: the dims before ``nl.par_dim`` are block dims, a list of (P, F..) tiles (spec §1.2); only a tile is
    limited to 5 dims. The conv's ``W_T`` has 4 block dims (6 in all). Each block is its own tile (writes to one
    do not touch another), ``.shape`` is the logical shape, and a block index out of range is an error."""
    _, nki, nl, nisa = cs

    @nki.jit
    def k(x):
        out = nl.ndarray((2, 3, 2, 2, 128, 16), dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray((2, 3, 2, 2, nl.par_dim(128), 16), dtype=x.dtype, buffer=nl.sbuf)
        assert t.shape == (2, 3, 2, 2, 128, 16)
        for a in nl.affine_range(2):
            for b in nl.affine_range(3):
                for c in nl.affine_range(2):
                    for d in nl.affine_range(2):
                        t[a, b, c, d] = nl.load(x[a, b, c, d])
        for a in nl.affine_range(2):
            for b in nl.affine_range(3):
                for c in nl.affine_range(2):
                    for d in nl.affine_range(2):
                        nl.store(out[a, b, c, d], value=nl.multiply(t[a, b, c, d], 2.0))
        return out

    @nki.jit
    def oob(x):
        t = nl.ndarray((2, 3, 2, 2, nl.par_dim(128), 16), dtype=x.dtype, buffer=nl.sbuf)
        t[0, 3, 0, 0] = nl.load(x[0, 0, 0, 0])
        return x

    x = rand((2, 3, 2, 2, 128, 16), seed=9)
    np.testing.assert_array_equal(k(x), x * 2)
    with pytest.raises(Exception, match="outside the tensor's block dims"):
        oob(x)


def test_max_and_mean_over_non_trailing_axes_are_one_reduction(cs):
    """``nl.max(t[i_0, 2*i_1 + i_2, 2*i_3 + i_4], axis=[2, 4])`` (the assignment's pooling idiom; here 3 x 3
    windows with stride 2, which overlap): spec §3.6 permutes the reduced axes to the end, so it is one
    tensor_reduce (axis_count 2) reading the windows in place, as is ``nl.mean`` (one reduce, one scale); nsim
    used to copy or fold the non-trailing axis with element-wise maxima."""
    _, nki, nl, _ = cs

    @nki.jit
    def pool(x):
        out = nl.ndarray((2, 128, 4, 4), dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.load(x)
        i_0, i_1, i_2, i_3, i_4 = nl.mgrid[0:128, 0:4, 0:3, 0:4, 0:3]
        nl.store(out[0], value=nl.max(t[i_0, 2 * i_1 + i_2, 2 * i_3 + i_4], axis=[2, 4]))
        nl.store(out[1], value=nl.mean(t[i_0, 2 * i_1 + i_2, 2 * i_3 + i_4], axis=(2, 4)))
        return out

    x = rand((128, 9, 9), seed=12)
    out = pool(x)
    win = np.lib.stride_tricks.sliding_window_view(x.astype(np.float64), (3, 3), axis=(1, 2))[:, ::2, ::2]
    close(out[0], win.max(axis=(3, 4)))
    close(out[1], win.mean(axis=(3, 4)))
    assert op_counts(pool) == {"dma_copy": 3, "tensor_reduce": 2, "tensor_scalar": 1}
    assert [o["axis_count"] for o in executed_ops(pool.last_json["body"]) if o["op"] == "tensor_reduce"] == [2, 2]
