"""Tensor utility ("plumbing") kernels written like public NKI model ports
(tests/python/kernels/tensor_utility_kernels.py, new dialect, and tensor_utility_kernels_beta1.py, Beta 1; both
unmodified, through ``nsim.compat``): concatenate / split on the partitions (offsets 37, 40, 70: not multiples of
32) and on the free dim (SBUF and HBM -> HBM ``dma_copy``); [B, S, H, D] -> [B, H, S, D] and [B, H, D, S] permutes
by DMA views (``.permute``, ``.rearrange``, ``.ap``), ``nc_transpose`` and ``dma_transpose``; one-hot encoding (iota
+ equal), embedding bags (gather by ``.ap(vector_offset=)`` + a selection-matrix matmul); cumulative max / sum with
``tensor_scalar_cumulative`` (the VectorE register carried across chunks by ``reduce_cmd.reduce``, restarted by
``reset_reduce``) and ``tensor_tensor_scan``; argsort by ranks (broadcast compares + reduce, stable on ties) and
a 32-element bitonic sort across partitions with ``nc_stream_shuffle``; pad / crop / roll of [C, H, W] by DMA.

Checked: data movement and integer results exactly, sums against float64 numpy (fp32 1e-5, bf16 1e-2), no
sanitizer report, and the DMA structure / timing the tiling implies (descriptor counts of the permute views, HBM
bytes, an element-granular permute view slower than a row-granular one and than ``dma_transpose``).

The nsim fix this family needed: ``nisa.tensor_tensor`` on all-int32/uint32 operands (none in PSUM) without
``engine=`` ran on the Vector engine through fp32, so int32 ids above 2^24 compared equal / subtracted wrongly
(``not_equal(16777217, 16777216)`` gave 0); the spec (nki-api.md 2.1) defaults that case to GpSimd's exact integer
path. The kernel's lowering now picks GpSimd then (``isa::default_engine``, isa/isa.cpp: kernel.json and both
dialects; Beta-1 ``nl.subtract`` / ``nl.equal`` of int32 tiles go through it too); ``engine=vector`` still forces
fp32."""
import numpy as np
import pytest

from conftest import require_core, sample_fixture, executed_ops  # noqa: E402
from conftest import op_counts as _ops  # noqa: E402

_core, ml_dtypes = require_core()
from numeric_helpers import close, rounded  # noqa: E402,F401
from numeric_helpers import randn as _randn, f64 as _f64  # noqa: E402

BF16 = ml_dtypes.bfloat16

tu = sample_fixture("tensor_utility_kernels.py", module_only=True)
tb = sample_fixture("tensor_utility_kernels_beta1.py", module_only=True)


def _eq(got, want):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, (got.shape, want.shape)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    np.testing.assert_array_equal(got.view(np.uint8), np.ascontiguousarray(want).view(np.uint8))


def _data(shape, dtype, seed):
    if np.dtype(dtype) == np.int32:
        return np.random.default_rng(seed).integers(-2 ** 31, 2 ** 31 - 1, shape, dtype=np.int64).astype(np.int32)
    return _randn(shape, dtype, seed)


# --------------------------------------------------------------------------------------------------
# concatenate / split
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("Na,Nb,F,dtype", [(40, 70, 96, np.float32), (37, 91, 64, BF16), (70, 3, 33, np.int32)])
def test_concat_split_partition(tu, Na, Nb, F, dtype):
    """Partition concat at offset Na into one SBUF tile and the split back: bit-exact; 3 DMAs each."""
    a, b = _data((Na, F), dtype, 1), _data((Nb, F), dtype, 2)
    _eq(tu.concat_partition(a, b), np.concatenate([a, b]))
    assert _ops(tu.concat_partition) == {"dma_copy": 3}
    top, bot = tu.split_partition(np.concatenate([a, b]), Na)
    _eq(top, a)
    _eq(bot, b)
    prof = tu.split_partition.last_profile
    assert prof.stat("memory.hbm_read_bytes") == prof.stat("memory.hbm_write_bytes") == a.nbytes + b.nbytes


def test_concat_free_hbm_to_hbm(tu):
    """Two HBM -> HBM DMAs into column windows [0, 96) and [96, 129); bytes moved = the inputs, once."""
    a, b = _data((300, 96), BF16, 3), _data((300, 33), BF16, 4)
    _eq(tu.concat_free_hbm(a, b), np.concatenate([a, b], axis=1))
    assert _ops(tu.concat_free_hbm) == {"dma_copy": 2}
    prof = tu.concat_free_hbm.last_profile
    assert prof.stat("memory.hbm_read_bytes") == prof.stat("memory.hbm_write_bytes") == a.nbytes + b.nbytes


def test_beta1_concat_partition_and_split_free(tb):
    a, b = _data((40, 96), BF16, 5), _data((70, 96), BF16, 6)
    _eq(tb.concat_partition_kernel(a, b), np.concatenate([a, b]))
    x = _data((300, 100), np.float32, 7)           # 128 + 128 + 44 rows
    left, right = tb.split_free_kernel(x, 37)
    _eq(left, x[:, :37])
    _eq(right, x[:, 37:])


# --------------------------------------------------------------------------------------------------
# permutes
# --------------------------------------------------------------------------------------------------

B, S, H, D = 2, 128, 4, 64


@pytest.fixture(scope="module")
def x4():
    return _data((B, S, H, D), BF16, 11)


@pytest.mark.parametrize("name", ["permute_bshd_bhsd_dma", "permute_bshd_bhsd_tiled"])
def test_permute_bhsd_exact(tu, x4, name):
    _eq(getattr(tu, name)(x4), x4.transpose(0, 2, 1, 3))


@pytest.mark.parametrize("name", ["permute_bshd_bhds_dma", "permute_bshd_bhds_pe", "permute_bshd_bhds_ap",
                                  "permute_bshd_bhds_dmat"])
@pytest.mark.parametrize("dtype", [BF16, np.float32])
def test_permute_bhds_exact(tu, name, dtype):
    x = _data((B, 96, 3, 40), dtype, 12)
    _eq(getattr(tu, name)(x), x.transpose(0, 2, 3, 1))


def test_permute_structure_and_descriptors(tu, x4):
    """Same bytes everywhere (x read once, out written once); the DMA descriptor count follows the innermost
    contiguous run: [B,H,S,D] moves rows of D (B*S*H descriptors), [B,H,D,S] moves single elements (B*S*H*D)
    and is slower for it (a D-row permute through SBUF costs what a contiguous copy does); dma_transpose (B*H of them) beats the element-granular .ap load."""
    prof = {}
    for name in ("permute_bshd_bhsd_dma", "permute_bshd_bhds_dma", "permute_bshd_bhsd_tiled",
                 "permute_bshd_bhds_ap", "permute_bshd_bhds_dmat", "permute_bshd_bhds_pe"):
        k = getattr(tu, name)
        k(x4)
        prof[name] = k.last_profile
        assert prof[name].stat("memory.hbm_read_bytes") == x4.nbytes, name
        assert prof[name].stat("memory.hbm_write_bytes") == x4.nbytes, name
    assert prof["permute_bshd_bhsd_dma"].stat("dma.descriptor_count") == B * S * H
    assert prof["permute_bshd_bhds_dma"].stat("dma.descriptor_count") == B * S * H * D
    assert (prof["permute_bshd_bhds_dma"].stat("dma.active_time")
            > 4 * prof["permute_bshd_bhsd_dma"].stat("dma.active_time"))
    assert _ops(tu.permute_bshd_bhsd_tiled) == {"dma_copy": 2 * B * H}
    # strided rows of D elements (the rearranged view) cost what a contiguous copy of the same tiles costs
    tu.copy_contiguous(x4)
    pc = tu.copy_contiguous.last_profile
    assert pc.stat("dma.descriptor_count") == prof["permute_bshd_bhsd_tiled"].stat("dma.descriptor_count") \
        == 2 * B * H * S
    assert pc.stat("dma.active_time") == prof["permute_bshd_bhsd_tiled"].stat("dma.active_time")
    assert _ops(tu.permute_bshd_bhds_dmat) == {"dma_transpose": B * H, "dma_copy": B * H}
    assert _ops(tu.permute_bshd_bhds_pe) == {"dma_copy": 2 * B * H, "nc_transpose": B * H, "tensor_copy": B * H}
    assert prof["permute_bshd_bhds_ap"].stat("dma.descriptor_count") == B * H * (S * D + D)
    assert (prof["permute_bshd_bhds_dmat"].stat("dma.active_time")
            < prof["permute_bshd_bhds_ap"].stat("dma.active_time"))
    assert prof["permute_bshd_bhds_dmat"].total_time_ns < prof["permute_bshd_bhds_ap"].total_time_ns


def test_beta1_load_transpose2d_heads(tb):
    x = _data((128, 4, 64), BF16, 13)
    _eq(tb.transpose_3d_kernel(x), x.transpose(1, 2, 0))


# --------------------------------------------------------------------------------------------------
# one-hot, embedding bag
# --------------------------------------------------------------------------------------------------

def test_one_hot_both_dialects(tu, tb):
    ids = np.random.default_rng(21).integers(0, 50, 300).astype(np.int32)   # 128 + 128 + 44
    want = (ids[:, None] == np.arange(50)).astype(np.float32)
    _eq(tu.one_hot(ids, 50), want)
    _eq(tb.one_hot_kernel(ids[:, None].copy(), 50), want)
    assert _ops(tu.one_hot)["iota"] == 1 and _ops(tu.one_hot)["tensor_scalar"] == 3


@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_embedding_bag(tu, dtype):
    V, Hd, N, NB = 1000, 256, 300, 24
    rng = np.random.default_rng(22)
    table = _data((V, Hd), dtype, 23)
    ids = rng.integers(0, V, N).astype(np.int32)
    w = rng.random(N).astype(np.float32)
    seg = np.sort(rng.integers(0, NB, N)).astype(np.int32)
    want = np.zeros((NB, Hd))
    np.add.at(want, seg, rounded(w, dtype)[:, None] * _f64(table)[ids])
    got = tu.embedding_bag(table, ids, w, seg, NB)
    close(got, want, dtype)
    NT = -(-N // 128)
    c = _ops(tu.embedding_bag)
    assert c["nc_matmul"] == NT and c["dma_copy"] == 4 * NT + 1, c
    gathers = [o for o in executed_ops(tu.embedding_bag.last_json["body"])
               if o["op"] == "dma_copy" and isinstance(o["src"], dict) and "offsets" in o]
    assert len(gathers) == NT
    assert tu.embedding_bag.last_profile.stat("memory.hbm_read_bytes") == N * Hd * table.itemsize + 3 * N * 4


# --------------------------------------------------------------------------------------------------
# cumulative ops
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("N,F,tile_f,dtype", [(200, 1000, 256, np.float32), (64, 600, 128, BF16)])
def test_cummax_register_chain(tu, tb, N, F, tile_f, dtype):
    """Chained chunks (reduce_cmd.reduce) = the running max of the whole row; reset_reduce in every chunk = the
    running max of each chunk alone. Beta-1 tensor_tensor_scan with initial= gives the same."""
    x = _data((N, F), dtype, 31)
    want = np.maximum.accumulate(x.astype(np.float32), axis=1).astype(dtype)
    _eq(tu.cummax_free(x, tile_f), want)
    per_chunk = np.concatenate([np.maximum.accumulate(x[:, c:c + tile_f].astype(np.float32), axis=1)
                                for c in range(0, F, tile_f)], axis=1).astype(dtype)
    _eq(tu.cummax_free(x, tile_f, False), per_chunk)
    assert not np.array_equal(per_chunk, want)
    assert _ops(tu.cummax_free)["tensor_scalar_cumulative"] == -(-N // 128) * -(-F // tile_f)
    if dtype == np.float32:
        _eq(tb.cummax_scan_kernel(x, tile_f), want)


def test_cumsum_cumulative_chained(tu):
    x = _data((130, 1000), np.float32, 32)
    want = np.cumsum(_f64(x), axis=1)
    got = _f64(tu.cumsum_free_cumulative(x, 256))
    abs_cum = np.cumsum(np.abs(_f64(x)), axis=1)
    assert (np.abs(got - want) <= 1e-5 * np.abs(want) + 2e-6 * abs_cum + 1e-6).all()


# --------------------------------------------------------------------------------------------------
# sorting
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("N,n,dtype", [(100, 48, np.float32), (128, 64, BF16), (7, 32, np.float32)])
def test_argsort_by_rank_stable(tu, N, n, dtype):
    """Small integer values (many ties): sorted values and the stable argsort indices, exactly."""
    x = np.random.default_rng(N + n).integers(-8, 8, (N, n)).astype(dtype)
    vals, idx = tu.argsort_rank(x)
    order = np.argsort(x.astype(np.float32), axis=1, kind="stable")
    _eq(idx, order.astype(np.int32))
    _eq(vals, np.take_along_axis(x, order, axis=1))


@pytest.mark.parametrize("N,dtype", [(100, np.float32), (512, BF16)])
def test_bitonic_sort32(tu, N, dtype):
    """32 distinct values per row sorted across the partitions: values and indices exact; 15 compare-exchange
    steps, each shuffling values and indices."""
    rng = np.random.default_rng(N)
    x = (np.stack([rng.permutation(200)[:32] for _ in range(N)]) - 100.5).astype(dtype)
    vals, idx = tu.bitonic_sort32(x)
    order = np.argsort(x.astype(np.float32), axis=1)
    _eq(idx, order.astype(np.int32))
    _eq(vals, np.take_along_axis(x, order, axis=1))
    assert _ops(tu.bitonic_sort32)["nc_stream_shuffle"] == 2 * 15


# --------------------------------------------------------------------------------------------------
# pad / crop / roll
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, BF16, np.int32])
def test_pad_crop_roll(tu, dtype):
    x = _data((64, 20, 30), dtype, 41)
    _eq(tu.pad_chw(x, 1, 2, 3, 4), np.pad(x, ((0, 0), (1, 2), (3, 4))))
    _eq(tu.crop_chw(x, 3, 5, 10, 17), x[:, 3:13, 5:22])
    _eq(tu.roll_chw(x, 7, -5), np.roll(x, (7, -5), axis=(1, 2)))
    _eq(tu.roll_chw(x, -1, 29), np.roll(x, (-1, 29), axis=(1, 2)))
    assert _ops(tu.roll_chw) == {"dma_copy": 4}
    prof = tu.roll_chw.last_profile
    assert prof.stat("memory.hbm_read_bytes") == prof.stat("memory.hbm_write_bytes") == x.nbytes
    prof = tu.crop_chw.last_profile
    assert prof.stat("memory.hbm_read_bytes") == 64 * 10 * 17 * x.itemsize


def test_beta1_roll_and_pad(tb):
    x = np.random.default_rng(42).integers(-100, 100, (100, 77)).astype(np.int32)
    _eq(tb.roll_free_kernel(x, 10), np.roll(x, 10, axis=1))
    xc = _data((64, 20, 30), np.float32, 43)
    _eq(tb.pad_rows_kernel(xc, 2, 3), np.pad(xc, ((0, 0), (2, 3), (0, 0))))


# --------------------------------------------------------------------------------------------------
# int32 above 2^24 (regression: tensor_tensor's default engine for int32)
# --------------------------------------------------------------------------------------------------

def test_int32_run_starts_exact_above_2_24(tu):
    """Hashed ids near 2^24 + k: neighbouring distinct ids differ by 1 and must not compare equal (fp32 would
    round 16777217 to 16777216). Runs on GpSimd's integer path by default."""
    rng = np.random.default_rng(51)
    ids = (2 ** 24 + rng.integers(0, 3, (64, 100))).astype(np.int32)
    want = np.ones(ids.shape, np.int32)
    want[:, 1:] = (ids[:, 1:] != ids[:, :-1]).astype(np.int32)
    _eq(tu.run_starts(ids), want)
    # (no engine= in the kernel: the lowering's default, isa::default_engine, puts all-int32 operands on GpSimd)
    prof = tu.run_starts.last_profile
    assert prof.stat("engine.gpsimd.opcode.tensor_tensor.count") == 1
    with pytest.raises(KeyError):  # (no tensor_tensor ran on VectorE)
        prof.stat("engine.vector.opcode.tensor_tensor.count")


def test_beta1_int32_subtract_exact(tb):
    rng = np.random.default_rng(52)
    ids = rng.integers(2 ** 30, 2 ** 30 + 4096, (300, 16)).astype(np.int32)
    starts = np.repeat((rng.integers(0, 8, (300, 1)) * 2 ** 27 + 1).astype(np.int32), 16, axis=1)
    _eq(tb.local_ids_kernel(ids, starts), ids - starts)
