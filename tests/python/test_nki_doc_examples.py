"""The code examples of the NKI API reference (the "Example" snippet of the ``nki.isa.*`` and ``nki.language.*``
pages of awsdocs-neuron), run as the pages write them through ``nsim.compat``: Beta-1 (``neuronxcc.nki``) forms in
tests/python/kernels/nki_doc_examples.py, new-dialect (``import nki``) forms in nki_doc_examples_new.py, each inside
the smallest kernel that gives the snippet its inputs and stores its results. Outputs against numpy references
written here (float64; integer results exact), plus the documented error of ``nl.all_reduce`` (out of nsim's scope,
spec §3.6).

Written from memory of the published pages. Places where the snippet could not be recalled exactly (written the
way the page writes NKI):

* ``nisa.iota`` Example 5 (Beta 1): the broadcast copy of tile ``b`` is written ``b.broadcast_to((128, 512))``.
* ``nisa.tensor_scalar_reduce``, ``nisa.sequence_bounds``, ``nisa.local_gather``, ``nisa.select_reduce`` Example 3,
  ``nisa.range_select`` Example 2 (chained with ``reduce_cmd=reduce``: the second call reads ``on_true - 1``),
  ``nisa.nc_matmul`` Examples 4 (``is_transpose``) and 5 (``perf_mode="double_row_gen3"``),
  ``nl.shared_constant``, ``nl.random_seed``, ``nl.all_reduce``, ``nl.num_programs``: the calls are the documented
  ones, the surrounding shapes and comments are reconstructed.
* ``nl.affine_range`` Example 2: the page's ``nl.load(offset:offset+(xT.shape[0]), ...)`` is not valid Python; it
  is written ``nl.load(xT[offset:offset+128, 0:xT.shape[1]])`` as the comment above it describes.
* ``nl.loop_reduce``: the page's fragment (``b = nl.loop_reduce(a, op=np.add, loop_indices=[k_i],
  dtype=nl.float32)`` with ``a`` "a psum tile from a matmul accumulation group") gets ``a`` from one
  ``nisa.nc_matmul`` per block.
* ``nl.dropout``: the rate is passed as ``rate=`` (the function's parameter name).
* ``nki.baremetal`` / ``nki.benchmark``: applied as ``nki.baremetal(...)(fn)`` to the page's
  ``nki_tensor_tensor_add`` rather than as three decorated copies of it.
* ``nl.broadcast_to``, ``nl.load_transpose2d``, ``nl.ds``, ``nl.matmul``, ``nl.device_print``, the reciprocal
  example and the new-dialect positional / ``nl.load`` / ``nl.gather_flattened`` kernels: the documented calls,
  the kernels around them are reconstructed.
* The new-dialect pages show the same operations with ``dst=``; their shapes and comments follow the Beta-1
  pages, the ``dst`` buffers are declared with ``nl.ndarray`` and filled / drained by ``nisa.dma_copy``.

Fixes the examples needed, each pinned by a test here that fails without it: the rebinding form of
``nl.loop_reduce`` (``b = nl.loop_reduce(a, ...)``: before, ``b`` became an internal object and the store of it
failed) and the result shape of the Beta-1 ``nisa.nc_matmul(..., perf_mode="double_row_gen3")`` (before, the
``[K, 2, M]`` / ``[K, 2, N]`` operands gave a ``[2M, 2N]`` tile)."""
import numpy as np
import pytest

from conftest import executed_ops, require_core, sample_fixture  # noqa: E402

_core, ml_dtypes = require_core()
from numeric_helpers import close  # noqa: E402

import nsim  # noqa: E402

BF16 = ml_dtypes.bfloat16
FP8 = ml_dtypes.float8_e4m3
FP32_MIN = float(np.finfo(np.float32).min)

doc = sample_fixture("nki_doc_examples.py", module_only=True)
new = sample_fixture("nki_doc_examples_new.py", module_only=True)


def _rng(seed):
    return np.random.default_rng(seed)


def _normal(shape, seed, dtype=np.float32):
    return _rng(seed).standard_normal(shape).astype(dtype)


def _ints(shape, seed, lo=-4, hi=5, dtype=np.float32):
    """Small integers as floats: matmul sums of them are exact in float32."""
    return _rng(seed).integers(lo, hi, shape).astype(dtype)


def _f64(x):
    return np.asarray(x).astype(np.float64)


def _exact(got, want):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def _scan(a, b, initial=0.0):
    """tensor_tensor_scan with op0=multiply, op1=add: s_i = a_i * s_(i-1) + b_i per row, float64."""
    a, b = _f64(a), _f64(b)
    out = np.empty_like(a)
    s = np.broadcast_to(np.asarray(initial, np.float64), (a.shape[0],)).copy()
    for i in range(a.shape[1]):
        s = a[:, i] * s + b[:, i]
        out[:, i] = s
    return out


def _sequence_bounds(ids):
    """Per element: the start and the end (exclusive) of its run of equal segment ids; id 0 (padding): n, -1."""
    n = len(ids)
    out = np.empty((2, n), np.int64)
    for i, v in enumerate(ids):
        if v == 0:
            out[:, i] = (n, -1)
            continue
        s, e = i, i + 1
        while s > 0 and ids[s - 1] == v:
            s -= 1
        while e < n and ids[e] == v:
            e += 1
        out[:, i] = (s, e)
    return out


def _max8(x):
    return -np.sort(-_f64(x).reshape(x.shape[0], -1), axis=1)[:, :8]


def _find_index8(data, vals):
    """For each of the 8 values in order: the first position holding it not taken by an earlier equal value."""
    data, vals = _f64(data).reshape(data.shape[0], -1), _f64(vals)
    out = np.full(vals.shape, 0xFFFFFFFF, np.uint64)
    for p in range(data.shape[0]):
        taken = set()
        for i in range(8):
            for j in np.flatnonzero(data[p] == vals[p, i]):
                if j not in taken:
                    taken.add(j)
                    out[p, i] = j
                    break
    return out


def _match_replace8(data, vals, imm):
    """dst = data; for i = 7 .. 0 the first position still holding vals[i] gets imm (and is dst_idx[i])."""
    dst = _f64(data).reshape(data.shape[0], -1).copy()
    idx = np.full(vals.shape, 0xFFFFFFFF, np.uint64)
    for p in range(dst.shape[0]):
        for i in range(7, -1, -1):
            hit = np.flatnonzero(dst[p] == float(vals[p, i]))
            if len(hit):
                dst[p, hit[0]] = imm
                idx[p, i] = hit[0]
    return dst.reshape(data.shape), idx


def _local_gather(src, index, e, v):
    """Per 16-partition group: ids = the group's indices in column-major order, the first v; each partition p of
    the group gets src_flat[p, id:id+e] for each id, side by side."""
    flat = _f64(src).reshape(src.shape[0], -1)
    out = np.empty((src.shape[0], v * e))
    for g in range(src.shape[0] // 16):
        ids = index[16 * g:16 * g + 16].flatten(order="F")[:v].astype(np.int64)
        for p in range(16 * g, 16 * g + 16):
            out[p] = np.concatenate([flat[p, i:i + e] for i in ids])
    return out


# --------------------------------------------------------------------------------------------------
# Beta 1 (neuronxcc.nki): nki.isa
# --------------------------------------------------------------------------------------------------


def test_iota_examples(doc):
    """nisa.iota, Examples 1-5: a row 0..511, a column 0..127, a row 511..0, a 128x512 row-major count, and the
    column broadcast along the free dim; int32."""
    a, b, c, d, e = doc.nki_iota()
    _exact(a, np.arange(512)[None, :])
    _exact(b, np.arange(128)[:, None])
    _exact(c, 511 - np.arange(512)[None, :])
    _exact(d, np.arange(128 * 512).reshape(128, 512))
    _exact(e, np.broadcast_to(np.arange(128)[:, None], (128, 512)))
    assert all(np.asarray(t).dtype == np.int32 for t in (a, b, c, d, e))


@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_affine_select_example(doc, dtype):
    """nisa.affine_select(pred=(iy < ix), ...): the strictly lower triangle kept, the rest -9984.0."""
    a = _normal((128, 128), 1, dtype)
    got = doc.nki_affine_select(a)
    ix, iy = np.mgrid[0:128, 0:128]
    _exact(np.asarray(got, np.float32), np.where(iy < ix, np.asarray(a, np.float32), np.float32(-9984.0)))


def test_tensor_tensor_scan_example(doc):
    """nisa.tensor_tensor_scan in two 512-column halves, the second starting from ``c[:, 511]``: one scan of the
    whole row."""
    a = _rng(2).uniform(-1, 1, (128, 1024)).astype(np.float32)
    b = _normal((128, 1024), 3)
    close(doc.nki_tensor_tensor_scan(a, b), _scan(a, b))


def test_tensor_scalar_reduce_example(doc):
    """b = a - 1.0 and c = the row sums of b, in one instruction."""
    a = _normal((128, 512), 4)
    b, c = doc.nki_tensor_scalar_reduce(a)
    close(b, _f64(a) - 1.0)
    close(c, (_f64(a) - 1.0).sum(axis=1, keepdims=True))


def test_bn_stats_bn_aggr_examples(doc):
    """Mean and (population) variance per partition: a [128, 128] tile in one bn_stats, a [128, 1024] tile in two
    bn_stats_fmax chunks written side by side through mgrid indices, aggregated by bn_aggr."""
    a = _normal((128, 128), 5) * 3 + 1
    b = _normal((128, 1024), 6) * 0.5 - 2
    mean_a, var_a, mean_b, var_b = doc.nki_bn_stats_bn_aggr(a, b)
    close(mean_a, _f64(a).mean(axis=1, keepdims=True))
    close(var_a, _f64(a).var(axis=1, keepdims=True))
    close(mean_b, _f64(b).mean(axis=1, keepdims=True))
    close(var_b, _f64(b).var(axis=1, keepdims=True))


def test_nc_stream_shuffle_examples(doc):
    """Example 1: partition i moves to (i + 1) % 32, in place; Example 2: one partition broadcast to 32;
    Example 3: the mask applies to every quadrant of a 128-partition tile."""
    x = _normal((32, 128), 7)
    _exact(doc.nki_nc_stream_shuffle_rotate(x), np.roll(x, 1, axis=0))
    row = _normal((1, 128), 8)
    _exact(doc.nki_nc_stream_shuffle_broadcast(row), np.repeat(row, 32, axis=0))
    y = _normal((128, 128), 9)
    _exact(doc.nki_nc_stream_shuffle_quadrants(y), y.reshape(4, 32, 128)[:, ::-1].reshape(128, 128))


def test_range_select_examples(doc):
    """Elements whose free index j has bound0 <= j < bound1 kept, the others nl.fp32.min; the max of each row in
    reduce_res. Example 2 chains a second call (reduce_cmd=reduce) over on_true - 1: the register keeps the
    first call's maximum. Some rows select nothing (bound1 <= bound0): their maximum is fp32.min."""
    rng = _rng(10)
    on_true = _normal((128, 512), 11)
    b0 = rng.integers(0, 300, (128, 1)).astype(np.float32)
    b1 = (b0 + rng.integers(-20, 200, (128, 1))).astype(np.float32)
    res, red, res2, red2 = doc.nki_range_select(on_true, b0, b1)
    j = np.arange(512)[None, :]
    keep = (j >= b0) & (j < b1)
    want = np.where(keep, on_true, np.float32(FP32_MIN))
    _exact(res, want)
    _exact(red, want.max(axis=1, keepdims=True))
    _exact(res2, np.where(keep, on_true - np.float32(1), np.float32(FP32_MIN)))
    _exact(red2, want.max(axis=1, keepdims=True))
    assert (~keep.any(axis=1)).any() and keep.any(axis=1).any()


def test_select_reduce_examples(doc):
    """where(predicate, on_true, fp32.min), then the same with the row max, then with a per-partition on_false
    vector and reverse_pred=True."""
    pred = _rng(12).integers(0, 2, (128, 512)).astype(np.uint8)
    on_true = _normal((128, 512), 13)
    on_false = _normal((128, 1), 14)
    r1, r2, m2, r3, m3 = doc.nki_select_reduce(pred, on_true, on_false)
    want = np.where(pred != 0, on_true, np.float32(FP32_MIN))
    _exact(r1, want)
    _exact(r2, want)
    _exact(m2, want.max(axis=1, keepdims=True))
    want3 = np.where(pred == 0, on_true, np.broadcast_to(on_false, on_true.shape))
    _exact(r3, want3)
    _exact(m3, want3.max(axis=1, keepdims=True))


@pytest.mark.parametrize("dtype", [np.int32, np.float32])
def test_sequence_bounds_example(doc, dtype):
    """The start and end (exclusive) of each element's segment; id 0 is padding (start n, end -1)."""
    ids = np.array([[1, 1, 2, 2, 2, 0, 3, 3, 3, 3, 0, 0, 5, 7, 7, 7]], dtype)
    got = doc.nki_sequence_bounds(ids)
    assert got.shape == (1, 2, 16) and got.dtype == np.dtype(dtype)
    _exact(got[0], _sequence_bounds(ids[0].tolist()).astype(dtype))


def test_max8_and_nc_find_index8_examples(doc):
    """nisa.max8 and nisa.nc_find_index8 on nl.rand tiles (the kernels also store the random data): the 8
    largest values of each row in descending order, and their positions (uint32)."""
    data, top = doc.nki_max8()
    assert ((data >= 0) & (data < 1)).all()
    _exact(top, _max8(data))
    data, idx = doc.nki_nc_find_index8()
    assert idx.dtype == np.uint32
    _exact(idx, _find_index8(data, _max8(data)))


def test_nc_match_replace8_examples(doc):
    """The 8 largest values of each row replaced by -inf (a duplicate of the 8th largest stays), and with
    ``dst_idx`` their positions."""
    data = _normal((4, 16), 15)
    data[1, 3] = data[1, 9] = data[1].max() + 1  # a duplicated maximum: both occurrences are replaced
    res, idx = doc.nki_nc_match_replace8(data)
    want, want_idx = _match_replace8(data, _max8(data), -np.inf)
    _exact(res, want)
    _exact(idx, want_idx)
    assert np.isneginf(res).sum() == 32


def test_local_gather_example(doc):
    """16 of each 16-partition group's 64 indices (column-major), 4 consecutive elements each, per partition."""
    src = _normal((128, 512, 4), 16)
    index = _rng(17).integers(0, 2048 - 4, (128, 4)).astype(np.uint16)
    got = doc.nki_local_gather(src, index)
    assert got.shape == (128, 4, 16)
    _exact(got.reshape(128, 64), _local_gather(src, index, 4, 16))


def test_tensor_copy_predicated_example(doc):
    """dst (loaded from on_false) takes on_true where the predicate is nonzero."""
    pred = _rng(18).integers(0, 2, (128, 512)).astype(np.float32)
    on_true, on_false = _normal((128, 512), 19), _normal((128, 512), 20)
    _exact(doc.nki_tensor_copy_predicated(pred, on_true, on_false), np.where(pred != 0, on_true, on_false))


@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_dma_transpose_examples(doc, dtype):
    """nisa.dma_transpose of a 2-D HBM tensor into SBUF, and of an SBUF tile."""
    a = _normal((16, 128), 21, dtype)
    _exact(doc.nki_dma_transpose_2d_hbm2sb(a), a.T)
    _exact(doc.nki_dma_transpose_2d_sb2sb(a), a.T)


def test_nc_matmul_examples(doc):
    """Example 1: one [128,128] x [128,512] matmul; Example 2: two contraction blocks accumulated with ``+=``;
    Example 3: 16 batched [64,64] x [64,512] matmuls on 64x64 PE tiles (tile_position / tile_size)."""
    a, b = _ints((128, 128), 22), _ints((128, 512), 23)
    d, e = _ints((256, 128), 24), _ints((256, 512), 25)
    g, h = _ints((16, 64, 64), 26), _ints((16, 64, 512), 27)
    c, f, i = doc.nki_nc_matmul(a, b, d, e, g, h)
    _exact(c, _f64(a).T @ _f64(b))
    _exact(f, _f64(d).T @ _f64(e))
    _exact(i, np.einsum("bkm,bkn->bmn", _f64(g), _f64(h)))
    mm = [o for o in executed_ops(doc.nki_nc_matmul.last_json["body"]) if o["op"] == "nc_matmul"]
    assert len(mm) == 1 + 2 + 16
    assert sorted({tuple(o["iimm"]) for o in mm if o.get("iimm")}) == [
        (0, 0, 64, 64), (0, 64, 64, 64), (64, 0, 64, 64), (64, 64, 64, 64)]


@pytest.mark.parametrize("dtype", [BF16, np.float32])
def test_nc_matmul_is_transpose_example(doc, dtype):
    """is_transpose=True with a shared identity as the moving tensor: the bit-exact transpose, in the input
    dtype (NaN and inf included)."""
    j = _normal((128, 32), 28, dtype)
    j[3, 5], j[7, 1] = np.nan, -np.inf
    got = doc.nki_nc_matmul_transpose(j)
    assert got.dtype == np.dtype(dtype)
    _exact(got.view(np.uint16 if dtype == BF16 else np.uint32), j.T.view(np.uint16 if dtype == BF16 else np.uint32))


def test_nc_matmul_double_row_example(doc):
    """perf_mode="double_row_gen3": fp8 [128, 2, 128] x [128, 2, 512] contracts over both rows of each
    partition: a [128, 512] result (was a [256, 1024] tile, rejected by the store)."""
    a = _ints((128, 2, 128), 29, -3, 4, FP8)
    b = _ints((128, 2, 512), 30, -3, 4, FP8)
    got = doc.nki_nc_matmul_double_row(a, b)
    assert got.shape == (128, 512)
    _exact(got, np.einsum("krm,krn->mn", _f64(a), _f64(b)))


def test_activation_and_activation_reduce_examples(doc):
    """exp(a); square(2 b + c) with the row sums in reduce_res."""
    a, b, c = _normal((128, 1024), 31), _normal((128, 512), 32), _normal((128, 1), 33)
    ea, sb, red = doc.nki_activation(a, b, c)
    close(ea, np.exp(_f64(a)))
    want = (2.0 * _f64(b) + _f64(c)) ** 2
    close(sb, want)
    close(red, want.sum(axis=1, keepdims=True))


def test_tensor_scalar_examples(doc):
    """Example 1: a - 1.0; Example 2 (reverse0): 1.0 - c; Example 3: e * f (a (64, 1) vector indexed by
    ``f[i_p_ef, i_f_f]``) + 2.5."""
    a, c, e, f = _normal((128, 512), 80), _normal((128, 512), 81), _normal((64, 1024), 82), _normal((64, 1), 83)
    b, d, g = doc.nki_tensor_scalar(a, c, e, f)
    close(b, _f64(a) - 1.0)
    close(d, 1.0 - _f64(c))
    close(g, _f64(e) * _f64(f) + 2.5)


def test_tensor_tensor_example(doc):
    a, b = _normal((128, 512), 84), _normal((128, 512), 85)
    close(doc.nki_tensor_tensor(a, b), _f64(a) + _f64(b))


def test_tensor_reduce_example(doc):
    """``nisa.tensor_reduce(np.add, a[i_p_a, i_f_a], axis=[1])``: the row sums, stored into a (128, 1) tensor."""
    a = _normal((128, 512), 86)
    close(doc.nki_tensor_reduce(a), _f64(a).sum(axis=1, keepdims=True))


def test_nc_transpose_examples(doc):
    """A (128, 64) tile on the Tensor Engine and a (32, 2) tile with engine=nisa.vector_engine."""
    a, b = _normal((128, 64), 87), _normal((32, 2), 88)
    aT, bT = doc.nki_nc_transpose(a, b)
    _exact(aT, a.T)
    _exact(bT, b.T)
    ops = executed_ops(doc.nki_nc_transpose.last_json["body"])
    assert [o["engine"] for o in ops if o["op"] == "nc_transpose"] == ["tensor", "vector"]


def test_memset_tensor_copy_reciprocal_examples(doc):
    x = _normal((128, 512), 89)
    a, xc, r = doc.nki_memset_tensor_copy_reciprocal(x)
    _exact(a, np.full((128, 128), np.float32(0.2)))
    _exact(xc, x)
    close(r, 1.0 / _f64(x))


def test_dma_copy_examples(doc):
    """Example 1: SBUF -> SBUF copy; Examples 2/3: indirect loads of rows 2i (in bounds, oob_mode.error) and 3i
    (rows past the end skipped with oob_mode.skip: the memset -1 stays); Examples 4/5: the same indices as
    indirect stores (rows past the end skipped)."""
    x = _normal((128, 512), 90)
    a, b, c, st, st2 = doc.nki_dma_copy(x)
    _exact(a, x)
    _exact(b, x[0:128:2])
    i = np.arange(64)
    inb = 3 * i < 128
    _exact(c[inb], x[3 * i[inb]])
    _exact(c[~inb], np.full((int((~inb).sum()), 512), -1, np.float32))
    _exact(st[0:128:2], x[0:64])
    _exact(st2[3 * i[inb]], x[0:64][inb])


def test_device_print_example(doc, capsys):
    x = _normal((4, 4), 91)
    _exact(doc.nki_device_print(x), x)
    out = capsys.readouterr().out
    assert "value of a:" in out and "{:.4f}".format(float(x[0, 0]))[:5] in out


# --------------------------------------------------------------------------------------------------
# Beta 1 (neuronxcc.nki): nki.language
# --------------------------------------------------------------------------------------------------


def test_sequential_range_example(doc):
    """A scan tiled into 512-column steps carrying the last column in ``init``: the scan of the whole row."""
    a = _rng(34).uniform(-1, 1, (128, 2048)).astype(np.float32)
    b = _normal((128, 2048), 35)
    close(doc.nki_sequential_range(a, b), _scan(a, b))


def test_affine_range_examples(doc):
    """Example 1: independent squares of [128, 512] tiles; Example 2: ``result_psum += nl.matmul(xT, y,
    transpose_x=True)`` over four contraction tiles."""
    x = _normal((128, 2048), 36)
    xT, y = _ints((512, 128), 37), _ints((512, 128), 38)
    out, res = doc.nki_affine_range(x, xT, y)
    close(out, _f64(x) ** 2)
    _exact(res, _f64(xT).T @ _f64(y))


def test_gather_flattened_example(doc):
    """indices = 0, 5, ..., 45 set column by column in an nl.static_range loop: every 5th element of each row of
    an nl.rand tile (the kernel stores the tile too)."""
    data, got = doc.nki_gather_flattened()
    _exact(got, data[:, 0:50:5])


def test_shared_constant_example(doc):
    a = _normal((4, 8), 39)
    close(doc.nki_shared_constant(a), _f64(a) + np.arange(32).reshape(4, 8))


def test_loop_reduce_example(doc):
    """``b = nl.loop_reduce(a, op=np.add, loop_indices=[k_i], dtype=nl.float32)`` inside the affine_range: b (zeros
    before the loop) accumulates the PSUM tile of every block. Before the fix b was rebound to nsim's internal
    loop-reduce value and the store of it raised E311."""
    x, y = _ints((3, 128, 64), 40), _ints((3, 128, 256), 41)
    _exact(doc.nki_loop_reduce(x, y), np.einsum("bkm,bkn->mn", _f64(x), _f64(y)))


def test_atomic_rmw_example(doc):
    """rmw_tensor[indices[i], :] += value[i, :], duplicates all applied; the argument is updated in place and
    returned."""
    rmw = _normal((16, 64), 42)
    value = _normal((8, 64), 43)
    idx = np.array([[1], [3], [1], [0], [15], [3], [3], [7]], np.int32)
    want = _f64(rmw)
    np.add.at(want, idx[:, 0], _f64(value))
    got = doc.nki_atomic_rmw(rmw, value, idx)
    close(got, want)
    close(rmw, want)


def test_random_seed_and_rand_example(doc):
    """nl.random_seed from a [1, 1] tile, then nl.rand: uniform values in [0, 1), the same for the same seed,
    others for another seed."""
    r7 = doc.nki_random_seed(np.array([[7]], np.int32))
    assert ((r7 >= 0) & (r7 < 1)).all() and abs(float(r7.mean()) - 0.5) < 0.01
    _exact(doc.nki_random_seed(np.array([[7]], np.int32)), r7)
    assert (doc.nki_random_seed(np.array([[8]], np.int32)) != r7).mean() > 0.99


@pytest.mark.parametrize("kernel", ["nki_nl_dropout", "nki_isa_dropout"])
def test_dropout_examples(doc, kernel):
    """nl.dropout / nisa.dropout with a per-partition probability tile (rows of 0.0 keep everything, rows of 1.0
    drop everything, rows of 0.5 about half) and with the scalar 0.2: each element is either kept unchanged or
    zeroed (no rescaling)."""
    x = (np.abs(_normal((128, 512), 44)) + 0.5).astype(np.float32)  # no zeros of its own
    prob = np.repeat(np.array([0.0, 1.0, 0.5, 0.25], np.float32), 32)[:, None]
    c, b2 = getattr(doc, kernel)(x, prob)
    for got in (c, b2):
        assert ((got == 0) | (got == x)).all()
    _exact(c[0:32], x[0:32])
    _exact(c[32:64], np.zeros((32, 512), np.float32))
    assert abs(float((c[64:96] == 0).mean()) - 0.5) < 0.03
    assert abs(float((c[96:128] == 0).mean()) - 0.25) < 0.03
    assert abs(float((b2 == 0).mean()) - 0.2) < 0.01


def test_load_indirect_examples(doc):
    """``nl.load(data_tensor[idx_tile[ix], iy])`` with the indices loaded from a 1-D HBM tensor, and
    ``nl.load(data_tensor[idx_tile, iy])`` with an iota index tile: rows 0, 2, 4, ..."""
    data = _normal((128, 512), 92)
    idx = np.arange(0, 128, 2).astype(np.int32)[::-1].copy()  # any row order: here 126, 124, ..., 0
    a, b = doc.nki_load_indirect(data, idx)
    _exact(a, data[idx])
    _exact(b, data[0:128:2])


def test_store_indirect_examples(doc):
    """Scatter stores: rows of data_tile[0:64] to the rows idx (loaded from HBM) of dst_tensor, and to the rows
    0, 2, ... (iota) of dst_tensor2; the other rows keep their contents."""
    data = _normal((128, 512), 93)
    idx = _rng(94).permutation(128)[:64].astype(np.int32)
    dst, dst2 = np.zeros((128, 512), np.float32), np.full((128, 512), 7.0, np.float32)
    want, want2 = dst.copy(), dst2.copy()
    want[idx] = data[0:64]
    want2[0:128:2] = data[0:64]
    got, got2 = doc.nki_store_indirect(data, idx, dst, dst2)
    _exact(got, want)
    _exact(got2, want2)
    _exact(dst, want)


def test_load_transpose2d_ds_matmul_examples(doc):
    x_in = _normal((64, 128), 95)
    x, y = _ints((128, 96), 96), _ints((96, 256), 97)
    t, d, z = doc.nki_load_transpose2d_ds_matmul(x_in, x, y)
    _exact(t, x_in.T)
    _exact(d, x_in)
    _exact(z, _f64(x) @ _f64(y))


def test_broadcast_to_example(doc):
    """A (1, 512) tile broadcast to 128 partitions."""
    x = _normal((1, 512), 103)
    _exact(doc.nki_broadcast_to(x), np.repeat(x, 128, axis=0))


def test_simulate_kernel_baremetal_benchmark_examples(doc):
    """The nki.simulate_kernel page (``c = nki.simulate_kernel(nki_tensor_tensor_add, a, b)`` on float16 ones),
    ``@baremetal(save_neff_name=..., save_trace_name=...)`` and ``@benchmark(warmup=10, iters=100, ...)`` with
    ``benchmark_result.nc_latency.get_latency_percentile(99)``."""
    import neuronxcc.nki as nki
    a = np.ones((4, 3), dtype=np.float16)
    b = np.ones((4, 3), dtype=np.float16)
    c = nki.simulate_kernel(doc.nki_tensor_tensor_add_jit, a, b)
    assert np.allclose(c, a + b) and c.dtype == np.float16
    _exact(doc.nki_tensor_tensor_add_baremetal(a, b), a + b)
    _exact(doc.nki_tensor_tensor_add_benchmark(a, b), a + b)
    p99 = doc.nki_tensor_tensor_add_benchmark.benchmark_result.nc_latency.get_latency_percentile(99)
    assert 0 < p99 < 100


def test_all_reduce_example_is_unsupported(doc):
    """nl.all_reduce (a collective across SPMD programs) is out of nsim's scope (spec §3.6): the documented
    NotSupportedError (E446) naming it, at the call."""
    with pytest.raises(nsim.NotSupportedError, match="all_reduce.*not supported") as ei:
        doc.nki_all_reduce[2](_normal((2, 128, 64), 45))
    assert "E446" in str(ei.value)


@pytest.mark.parametrize("grid", ["plain", "spmd_dim(nc(2), 2)", "nc(2) * 2", "spmd_dim(2, nc(2))", "2 * nc(2)"])
def test_spmd_dim_examples(doc, grid):
    """nki_spmd_kernel (``nl.load(a[i, j])`` by ``nl.program_id(0)`` / ``(1)``) launched on a [4, 2] grid, plainly
    and with the four physical-core annotations of the nl.spmd_dim page: every (i, j) tile copied."""
    import neuronxcc.nki.language as nl
    first = {"plain": 4, "spmd_dim(nc(2), 2)": nl.spmd_dim(nl.nc(2), 2), "nc(2) * 2": nl.nc(2) * 2,
             "spmd_dim(2, nc(2))": nl.spmd_dim(2, nl.nc(2)), "2 * nc(2)": 2 * nl.nc(2)}[grid]
    src = _normal((4, 2, 128, 512), 46)
    _exact(doc.nki_spmd_kernel[first, 2](src), src)


@pytest.mark.parametrize("grid", [1, 2, 4])
def test_num_programs_example(doc, grid):
    """Rows split among ``nl.num_programs(axes=0)`` programs; each scales its rows by num_programs *
    program_ndim."""
    a = _normal((128 * grid, 64), 47)
    close(doc.nki_num_programs[grid](a), _f64(a) * grid)


# --------------------------------------------------------------------------------------------------
# New dialect (import nki)
# --------------------------------------------------------------------------------------------------


def test_new_iota(new):
    a, b, d, e = new.nki_iota()
    _exact(a, np.arange(512)[None, :])
    _exact(b, np.arange(128)[:, None])
    _exact(d, np.arange(128 * 512).reshape(128, 512))
    p, i, j = np.mgrid[0:128, 0:4, 0:8]
    _exact(e, (100 + 2 * p - 8 * i + j).astype(np.float32))


def test_new_affine_select(new):
    """pattern [[-1, 128]], channel_multiplier 1, cmp_op greater_equal: keep a[p, j] where p - j >= 0."""
    a = _normal((128, 128), 50)
    ix, iy = np.mgrid[0:128, 0:128]
    _exact(new.nki_affine_select(a), np.where(ix >= iy, a, np.float32(-9984.0)))


def test_new_tensor_tensor_scan(new):
    a = _rng(51).uniform(-1, 1, (128, 1024)).astype(np.float32)
    b = _normal((128, 1024), 52)
    close(new.nki_tensor_tensor_scan(a, b), _scan(a, b))


def test_new_tensor_scalar_reduce(new):
    a = _normal((128, 512), 53)
    b, c = new.nki_tensor_scalar_reduce(a)
    close(b, _f64(a) - 1.0)
    close(c, (_f64(a) - 1.0).sum(axis=1, keepdims=True))


def test_new_bn_stats_bn_aggr(new):
    b = _normal((128, 1024), 54) * 2 + 3
    got = new.nki_bn_stats_bn_aggr(b)
    close(got[:, 0], _f64(b).mean(axis=1))
    close(got[:, 1], _f64(b).var(axis=1))


def test_new_nc_stream_shuffle(new):
    x, row = _normal((32, 128), 55), _normal((1, 128), 56)
    rot, bc = new.nki_nc_stream_shuffle(x, row)
    _exact(rot, np.roll(x, 1, axis=0))
    _exact(bc, np.repeat(row, 32, axis=0))


def test_new_range_select(new):
    rng = _rng(57)
    on_true = _normal((128, 512), 58)
    b0 = rng.integers(0, 300, (128, 1)).astype(np.float32)
    b1 = (b0 + rng.integers(1, 200, (128, 1))).astype(np.float32)
    res, red = new.nki_range_select(on_true, b0, b1)
    j = np.arange(512)[None, :]
    want = np.where((j >= b0) & (j < b1), on_true, np.float32(FP32_MIN))
    _exact(res, want)
    _exact(red, want.max(axis=1, keepdims=True))


def test_new_select_reduce(new):
    pred = _rng(59).integers(0, 2, (128, 512)).astype(np.uint8)
    on_true = _normal((128, 512), 60)
    res, red = new.nki_select_reduce(pred, on_true)
    want = np.where(pred != 0, on_true, np.float32(FP32_MIN))
    _exact(res, want)
    _exact(red, want.max(axis=1, keepdims=True))


def test_new_sequence_bounds(new):
    ids = np.array([[4, 4, 4, 0, 1, 2, 2, 0]], np.int32)
    _exact(new.nki_sequence_bounds(ids)[0], _sequence_bounds(ids[0].tolist()))


def test_new_max8_find_index8_match_replace8(new):
    data = _normal((16, 64), 61)
    data[2, 10] = data[2, 40] = data[2].max() + 0.5  # a duplicated maximum
    top, idx, rep, rep_idx = new.nki_max8_find_replace(data)
    _exact(top, _max8(data))
    _exact(idx, _find_index8(data, _max8(data)))
    want, want_idx = _match_replace8(data, _max8(data), -np.inf)
    _exact(rep, want)
    _exact(rep_idx, want_idx)
    assert idx[2, 0] == 10 and idx[2, 1] == 40


def test_new_local_gather(new):
    src = _normal((128, 512), 62)
    index = _rng(63).integers(0, 512 - 4, (128, 2)).astype(np.uint16)
    _exact(new.nki_local_gather(src, index), _local_gather(src, index, 4, 32))


def test_new_tensor_copy_predicated(new):
    pred = _rng(64).integers(0, 2, (128, 512)).astype(np.uint8)
    on_true, on_false = _normal((128, 512), 65), _normal((128, 512), 66)
    _exact(new.nki_tensor_copy_predicated(pred, on_true, on_false), np.where(pred == 0, on_true, on_false))


def test_new_dma_transpose(new):
    a, x = _normal((16, 128), 67, BF16), _normal((4, 8, 16), 68, BF16)
    b, y = new.nki_dma_transpose(a, x)
    _exact(b, a.T)
    _exact(y, x.transpose(2, 1, 0))


def test_new_nc_matmul_accumulate_and_transpose(new):
    a, b = _ints((256, 128), 69), _ints((256, 512), 70)
    t = _normal((128, 64), 71, BF16)
    c, tT = new.nki_nc_matmul(a, b, t)
    _exact(c, _f64(a).T @ _f64(b))
    assert tT.dtype == BF16
    _exact(tT, t.T)


def test_new_nc_matmul_double_row(new):
    a = _ints((128, 2, 128), 72, -3, 4, FP8)
    b = _ints((128, 2, 512), 73, -3, 4, FP8)
    _exact(new.nki_nc_matmul_double_row(a, b), np.einsum("krm,krn->mn", _f64(a), _f64(b)))


def test_new_activation_reduce(new):
    b, c = _normal((128, 512), 74), _normal((128, 1), 75)
    act, red = new.nki_activation_reduce(b, c)
    want = (2.0 * _f64(b) + _f64(c)) ** 2
    close(act, want)
    close(red, want.sum(axis=1, keepdims=True))


@pytest.mark.parametrize("lnc", [1, 2])
def test_new_program_id(new, lnc):
    """Row tiles shared out by nl.program_id(0) / nl.num_programs(0); each program adds its id."""
    a = _normal((512, 64), 76)
    got = new.nki_program_id[lnc](a)
    want = _f64(a)
    if lnc == 2:
        want[256:] += 1.0
    close(got, want)


def test_new_static_range(new):
    a = _normal((128, 512), 77)
    close(new.nki_static_range(a), _f64(a) * np.repeat(np.arange(1, 5), 128)[None, :])


def test_new_dropout_random_seed_rand(new):
    x = (np.abs(_normal((128, 512), 78)) + 0.5).astype(np.float32)
    out, r = new.nki_dropout(x, np.array([[7]], np.int32))
    assert ((out == 0) | (out == x)).all()
    assert abs(float((out == 0).mean()) - 0.2) < 0.01
    assert ((r >= 0) & (r < 1)).all()
    out2, r2 = new.nki_dropout(x, np.array([[7]], np.int32))
    _exact(out2, out)
    _exact(r2, r)


def test_new_positional_calls(new):
    """nc_matmul / tensor_copy / tensor_scalar / tensor_tensor / activation / memset / tensor_reduce / dma_copy
    with their operands by position (dst first)."""
    a, b = _ints((128, 128), 98, -2, 3), _ints((128, 256), 99, -2, 3)
    c, e = new.nki_positional(a, b)
    want = np.exp((2.0 * (2.0 * (_f64(a).T @ _f64(b)) + 1.0)) / 64)
    close(c, want)
    close(e, want.sum(axis=1, keepdims=True))


def test_new_load_store_values(new):
    a, b = _normal((128, 64), 100), _normal((128, 64), 101)
    close(new.nki_load_store_values(a, b), np.exp((_f64(a) + _f64(b)) * 0.5))


def test_new_shared_constant_gather_flattened(new):
    a = _normal((64, 32), 102)
    _exact(new.nki_shared_constant_gather(a), a[:, np.arange(7, -1, -1) * 3])


# --------------------------------------------------------------------------------------------------
# The fixes the examples needed
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("init", ["zeros", "ndarray", "unbound"])
@pytest.mark.parametrize("op,ref", [("add", np.sum), ("maximum", np.max)])
def test_loop_reduce_rebinding_form(b1, init, op, ref):
    """``acc = nl.loop_reduce(t, op, loop_indices=[j])`` (the API reference's form): the tile ``acc`` is bound to
    when the call runs is updated in place and returned. Bound to zeros before the loop: zeros take part (the
    sum; the max of positive values); to an unwritten ``nl.ndarray``: its first value is t (nsim's policy for
    ``T[idx] = nl.loop_reduce(...)``); not bound: the first call's value is a copy of t, later ones reduce into
    it. No affine-range write conflict is reported."""
    _nki, bnl, _ = b1

    @_nki.jit
    def k(x):
        out = bnl.ndarray((128, 128), dtype=bnl.float32, buffer=bnl.shared_hbm)
        if init == "zeros":
            acc = bnl.zeros((128, 128), dtype=bnl.float32, buffer=bnl.sbuf)
        elif init == "ndarray":
            acc = bnl.ndarray((128, 128), dtype=bnl.float32, buffer=bnl.sbuf)
        for j in bnl.affine_range(4):
            t = bnl.load(x[:, j * 128:(j + 1) * 128])
            acc = bnl.loop_reduce(t, op=getattr(bnl, op), loop_indices=[j], dtype=bnl.float32)
        bnl.store(out, acc)
        return out

    x = (0.5 + _rng(110).random((128, 512))).astype(np.float32)
    got, prof = k.simulate(x)
    close(got, ref(_f64(x).reshape(128, 4, 128), axis=1))
    assert prof.check_reports == []


def test_loop_reduce_item_form_unchanged(b1):
    """``T[i] = nl.loop_reduce(...)`` (the nki-samples form) still reduces into the view it is assigned to, and a
    loop_reduce value passed on without being assigned is not mistaken for the rebinding form."""
    _nki, bnl, _ = b1

    @_nki.jit
    def k(x):
        out = bnl.ndarray((128, 256), dtype=bnl.float32, buffer=bnl.shared_hbm)
        acc = bnl.zeros((128, 256), dtype=bnl.float32, buffer=bnl.sbuf)
        for j in bnl.affine_range(4):
            t = bnl.load(x[:, j * 128:(j + 1) * 128])
            acc[:, 0:128] = bnl.loop_reduce(t, op=bnl.add, loop_indices=[j])
            acc[:, 128:256] = bnl.loop_reduce(t, op=bnl.maximum, loop_indices=[j])
        bnl.store(out, acc)
        return out

    x = (0.5 + _rng(111).random((128, 512))).astype(np.float32)
    got = k(x)
    close(got[:, :128], _f64(x).reshape(128, 4, 128).sum(axis=1))
    close(got[:, 128:], _f64(x).reshape(128, 4, 128).max(axis=1))


@pytest.mark.parametrize("masked", [False, True])
def test_beta1_double_row_matmul_result_shape(b1, masked):
    """Beta-1 ``nisa.nc_matmul(a, b, perf_mode="double_row_gen3")`` with a ``[K, 2, M]`` stationary and a
    ``[K, 2, N]`` moving tensor returns an ``[M, N]`` PSUM tile (also masked off by ``mask=False``); ``+=`` into an
    ``[M, N]`` accumulator adds the double-row products."""
    _nki, bnl, bnisa = b1

    @_nki.jit(platform_target="trn2")
    def k(a_t, b_t):
        out = bnl.ndarray((64, 256), dtype=bnl.float32, buffer=bnl.shared_hbm)
        a = bnl.load(a_t)
        b = bnl.load(b_t)
        r = bnisa.nc_matmul(a, b, perf_mode="double_row_gen3", mask=False if masked else None)
        assert tuple(r.shape) == (64, 256)
        acc = bnl.zeros((64, 256), dtype=bnl.float32, buffer=bnl.psum)
        acc += bnisa.nc_matmul(a, b, perf_mode="double_row_gen3")
        acc += bnisa.nc_matmul(a, b, perf_mode="double_row_gen3")
        bnl.store(out, acc)
        return out

    a = _ints((128, 2, 64), 112, -3, 4, FP8)
    b = _ints((128, 2, 256), 113, -3, 4, FP8)
    _exact(k(a, b), 2 * np.einsum("krm,krn->mn", _f64(a), _f64(b)))
