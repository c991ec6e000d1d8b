"""Views and indexing idioms of public NKI kernels (issue 10, item 2), both dialects, checked against numpy:
``reshape`` of HBM tensors and tiles, ``broadcast_to`` / numpy broadcasting in ``nl`` binary ops, ``mask=`` on
reductions, index expressions combining several arange/mgrid axes."""
import math

import numpy as np
import pytest

from conftest import require_core  # noqa: E402

_core, ml_dtypes = require_core()

from nsim import nki  # noqa: E402
import nsim.nki.isa as nisa  # noqa: E402
import nsim.nki.language as nl  # noqa: E402
from nsim.tracer import NsimError  # noqa: E402

BF16 = ml_dtypes.bfloat16


def _rand(shape, dtype=np.float32, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _close(got, want, dtype=np.float32):
    tol = 1e-2 if np.dtype(dtype) == np.dtype(BF16) else 1e-5
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), rtol=tol, atol=tol)


def _ops(kernel, *args):
    return [s["op"] for s in kernel.to_json(*args)["body"] if "op" in s]


# --------------------------------------------------------------------------------------------------
# reshape (new dialect)
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_new_reshape_hbm_blocks(dtype):
    @nki.jit
    def scale(a):
        n, m = a.shape[0] // 128, a.shape[1]
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        av = a.reshape((n, 128, m))
        ov = out.reshape((n, 128, m))
        for i in nl.affine_range(n):
            t = nl.ndarray((128, m), a.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=t, src=av[i])
            u = nl.ndarray((128, m), a.dtype, buffer=nl.sbuf)
            nisa.tensor_scalar(dst=u, data=t, op0=nl.multiply, operand0=3.0)
            nisa.dma_copy(dst=ov[i], src=u)
        return out

    a = _rand((512, 96), dtype)
    _close(scale(a), a.astype(np.float32) * 3, dtype)


def test_new_reshape_1d_hbm_and_return_reshaped():
    @nki.jit
    def k(x):  # x: (128 * 64,) flat
        out = nl.ndarray((128 * 64,), x.dtype, buffer=nl.shared_hbm)
        t = nl.load(x.reshape((128, 64)))
        nl.store(out.reshape((128, -1)), nl.exp(t))
        return out.reshape((128, 64))

    x = _rand((128 * 64,))
    r = k(x)
    assert r.shape == (128, 64)
    _close(r, np.exp(x.reshape(128, 64)))


def test_new_reshape_tile_split_and_reduce():
    """A (128, 64) tile viewed as (128, 4, 16): reduce the last axis, subtract it back (stride-0 view)."""
    @nki.jit
    def k(a):
        out = nl.ndarray((128, 64), a.dtype, buffer=nl.shared_hbm)
        t = nl.load(a)
        tv = t.reshape((128, 4, 16))
        s = nl.ndarray((128, 4, 1), nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=s, op=nl.add, data=tv, axis=2)
        o = nl.ndarray((128, 4, 16), a.dtype, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=o, data1=tv, data2=s.broadcast(2, 16), op=nl.subtract)
        nl.store(out, o.reshape((128, 64)))
        return out

    a = _rand((128, 64))
    x = a.reshape(128, 4, 16)
    _close(k(a), (x - x.sum(2, keepdims=True)).reshape(128, 64))


def test_new_reshape_merge_tile_dims_keeps_ir_dims():
    """(128, 4, 16) -> (128, 64): a view of the same tile, no copy; the reduce uses the IR dims directly."""
    @nki.jit
    def k(a):
        out = nl.ndarray((128, 1), nl.float32, buffer=nl.shared_hbm)
        t = nl.ndarray((128, 4, 16), a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a.reshape((128, 4, 16)))
        s = nl.sum(t.reshape((128, 64)), axis=1, keepdims=True)
        nl.store(out, s)
        return out

    a = _rand((128, 64))
    _close(k(a), a.sum(1, keepdims=True), np.float32)
    assert _ops(k, a) == ["dma_copy", "tensor_reduce", "dma_copy"]


def test_new_reshape_errors():
    @nki.jit
    def moves_partitions(a):
        t = nl.load(a)
        t.reshape((64, 256))

    with pytest.raises(NsimError, match="partition dim"):
        moves_partitions(_rand((128, 128)))

    @nki.jit
    def count(a):
        a.reshape((3, 5))

    with pytest.raises(NsimError, match="element count"):
        count(_rand((4, 4)))

    @nki.jit
    def strided(a):
        t = nl.load(a)
        t[:, 0:64:2].reshape((128, 4, 9))

    with pytest.raises(NsimError):
        strided(_rand((128, 64)))


def test_new_view_dtype():
    @nki.jit
    def same(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.load(a.view(nl.float32)))
        return out

    a = _rand((128, 8))
    _close(same(a), a)

    @nki.jit
    def bits(a):  # the same element size: the bytes reinterpreted (a kernel-IR access with a dtype)
        out = nl.ndarray(a.shape, nl.int32, buffer=nl.shared_hbm)
        nl.store(out, nl.load(a.view(nl.int32)))
        return out

    np.testing.assert_array_equal(bits(a), a.view(np.int32))

    @nki.jit
    def other(a):  # another element size: the last dim scaled (tests/python/test_view_dtype.py)
        out = nl.ndarray((128, 16), nl.bfloat16, buffer=nl.shared_hbm)
        nl.store(out, nl.load(a.view(nl.bfloat16)))
        return out

    np.testing.assert_array_equal(other(a).view(np.uint16), a.view(np.uint16))


# --------------------------------------------------------------------------------------------------
# broadcasting (new dialect)
# --------------------------------------------------------------------------------------------------


def test_new_binary_ops_broadcast_11_p1_1f():
    @nki.jit
    def k(a, b, c, d):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        t = nl.load(a)
        r = nl.add(t, nl.load(c))                # (1, 1)
        r = nl.multiply(r, nl.load(b))           # (1, F)
        r = nl.subtract(nl.load(d), r)           # (P, 1) on the left
        r = nl.maximum(r, nl.load(c))            # (1, 1) again
        nl.store(out, r)
        return out

    P, F = 128, 512
    a, b, c, d = _rand((P, F), seed=1), _rand((1, F), seed=2), _rand((1, 1), seed=3), _rand((P, 1), seed=4)
    _close(k(a, b, c, d), np.maximum(d - (a + c) * b, c))


def test_new_broadcast_to_hbm_is_one_stride0_dma():
    @nki.jit
    def k(a, b):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        bb = nl.load(nl.broadcast_to(b, a.shape))
        nl.store(out, nl.add(nl.load(a), bb))
        return out

    a, b = _rand((128, 256), seed=1), _rand((1, 256), seed=2)
    _close(k(a, b), a + b)
    body = k.to_json(a, b)["body"]
    dmas = [s for s in body if s.get("op") == "dma_copy" and isinstance(s.get("src"), dict)
            and s["src"]["tensor"] == "b"]
    assert len(dmas) == 1 and dmas[0]["src"]["index"][0] == {"start": 0, "broadcast": 128}
    assert "nc_matmul" not in _ops(k, a, b)



def test_new_broadcast_of_1d_hbm_vector_is_one_stride0_dma():
    """A 1-D vector (a LayerNorm gamma, a bias) loaded onto every partition: ``g.reshape((1, d)).broadcast(0,
    128)`` (new dialect) or ``nl.broadcast_to(g.reshape((1, d)), (128, d))``. The tensor has no dim for the
    stride-0 partition dim to sit on, so the access re-dimensions it as (1, d) (kernel.json ``"shape"``); it
    raised NSIM-E428. One DMA, no matmul."""
    @nki.jit
    def k(x, g, b):
        d = g.shape[0]
        out = nl.ndarray((128, d), dtype=x.dtype, buffer=nl.shared_hbm)
        gb = nl.ndarray((128, d), dtype=g.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=gb, src=g.reshape((1, d)).broadcast(0, 128))
        bb = nl.load(nl.broadcast_to(b.reshape((1, d)), (128, d)))
        xs = nl.ndarray((128, d), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=xs, src=x)
        r = nl.ndarray((128, d), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=r, data1=xs, data2=gb, op=nl.multiply)
        nl.store(out, nl.add(r, bb))
        return out

    x, g, b = _rand((128, 256), seed=3), _rand((256,), seed=4), _rand((256,), seed=5)
    _close(k(x, g, b), x * g + b)
    body = k.to_json(x, g, b)["body"]
    for name in ("g", "b"):
        dmas = [s for s in body if s.get("op") == "dma_copy" and isinstance(s.get("src"), dict)
                and s["src"]["tensor"] == name]
        assert len(dmas) == 1, dmas
        assert dmas[0]["src"]["shape"] == [1, 256]
        assert dmas[0]["src"]["index"][0] == {"start": 0, "broadcast": 128}
    assert "nc_matmul" not in _ops(k, x, g, b)


def test_new_broadcast_to_sbuf_partition_and_free():
    @nki.jit
    def k(b, c):
        out = nl.ndarray((128, 64), nl.float32, buffer=nl.shared_hbm)
        bt = nl.load(b)                                   # (1, 64)
        ct = nl.load(c)                                   # (128, 1)
        x = nl.broadcast_to(bt, (128, 64))                # partition broadcast: TensorE
        y = nl.broadcast_to(ct, (128, 64))                # free broadcast: stride-0 view
        nl.store(out, nl.add(x, y))
        return out

    b, c = _rand((1, 64), seed=5), _rand((128, 1), seed=6)
    _close(k(b, c), b + c)


def test_new_broadcast_to_1d_operand_and_bf16():
    @nki.jit
    def k(a, m):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        t = nl.load(a)
        s = nl.sum(t, axis=1)                            # (P,)
        r = nl.divide(t, s)                              # (P, F) / (P,)
        r2 = nl.multiply(r, nl.load(m))                  # * (1, F) in bf16
        nl.store(out, r2)
        return out

    a = (np.abs(_rand((128, 32), seed=7)) + 0.5).astype(BF16)
    m = _rand((1, 32), BF16, seed=8)
    af = a.astype(np.float32)
    _close(k(a, m), af / af.sum(1, keepdims=True) * m.astype(np.float32), BF16)


# --------------------------------------------------------------------------------------------------
# Beta 1
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_b1_vector_add_reshape_blocks(b1, dtype):
    bnki, bnl, _ = b1

    @bnki.jit
    def vector_add(a, b):
        c = bnl.ndarray(a.shape, dtype=a.dtype, buffer=bnl.shared_hbm)
        n = a.shape[0] // 128
        av = a.reshape((n, 128, a.shape[1]))
        bv = b.reshape((n, 128, b.shape[1]))
        cv = c.reshape((n, 128, c.shape[1]))
        for i in bnl.affine_range(n):
            x = bnl.load(av[i])
            y = bnl.load(bv[i])
            bnl.store(cv[i], value=x + y)
        return c

    a, b = _rand((384, 64), dtype, 1), _rand((384, 64), dtype, 2)
    _close(vector_add(a, b), a.astype(np.float32) + b.astype(np.float32), dtype)


def test_b1_layernorm_tutorial(b1):
    """The shape of the SDK layer-norm tutorial (v1): gamma/beta via reshape((1, n)) and broadcast to 128
    partitions, masked loads/stores of a ragged last tile, mean/var with masks."""
    bnki, bnl, _ = b1

    @bnki.jit
    def layernorm(input_tensor, epsilon, gamma_vector, beta_vector):
        output_tensor = bnl.ndarray(input_tensor.shape, dtype=input_tensor.dtype, buffer=bnl.shared_hbm)
        i_p_io = bnl.arange(bnl.tile_size.pmax)[:, None]
        i_f_io = bnl.arange(input_tensor.shape[1])[None, :]
        i_p_param = bnl.arange(1)[:, None]
        num_rows = input_tensor.shape[0]
        shift_scale = bnl.load(gamma_vector.reshape((1, gamma_vector.shape[0]))[i_p_param, i_f_io])
        shift_scale = shift_scale.broadcast_to((bnl.tile_size.pmax, gamma_vector.shape[0]))
        beta = bnl.load(beta_vector.reshape((1, beta_vector.shape[0]))[i_p_param, i_f_io])
        for i in bnl.affine_range(math.ceil(num_rows / bnl.tile_size.pmax)):
            rows = i * bnl.tile_size.pmax + i_p_io < num_rows
            x = bnl.load(input_tensor[i * bnl.tile_size.pmax + i_p_io, i_f_io], mask=rows)
            mean = bnl.mean(x, axis=[1], mask=rows)
            shifted = bnl.subtract(x, mean, mask=rows)
            var = bnl.mean(bnl.square(shifted, mask=rows), axis=[1], mask=rows)
            rstd = bnl.rsqrt(var + epsilon)
            y = bnl.multiply(shifted, rstd, mask=rows)
            y = bnl.multiply(y, shift_scale, mask=rows)
            y = bnl.add(y, beta, mask=rows)
            bnl.store(output_tensor[i * bnl.tile_size.pmax + i_p_io, i_f_io], value=y, mask=rows)
        return output_tensor

    x = _rand((300, 64), seed=3)
    g, bt = _rand((64,), seed=4), _rand((64,), seed=5)
    mu = x.mean(1, keepdims=True)
    ref = (x - mu) / np.sqrt(((x - mu) ** 2).mean(1, keepdims=True) + 1e-5) * g + bt
    np.testing.assert_allclose(layernorm(x, 1e-5, g, bt), ref, rtol=1e-4, atol=1e-4)


def test_b1_masked_reductions(b1):
    bnki, bnl, bnisa = b1

    @bnki.jit
    def k(a, rows):
        out = bnl.ndarray((128, 4), dtype=bnl.float32, buffer=bnl.shared_hbm)
        i_p = bnl.arange(128)[:, None]
        i_f = bnl.arange(64)[None, :]
        x = bnl.load(a[i_p, i_f])
        res = bnl.zeros((128, 4), dtype=bnl.float32)
        res[:, 0] = bnl.sum(x, axis=1, mask=(i_p < rows))
        res[:, 1] = bnl.max(x, axis=1, mask=(i_p < rows) & (i_f < 32))
        res[:, 2] = bnl.mean(x, axis=1, mask=(i_f >= 16))
        res[:, 3] = bnisa.tensor_reduce(bnl.minimum, x, axis=1, mask=(i_p < rows))
        bnl.store(out, res)
        return out

    a = _rand((128, 64), seed=9)
    # `res[:, 0] = <masked reduction>` writes only the rows inside the mask; the others keep their zeros (on
    # hardware the masked instruction writes res directly). Nothing reads never-written memory: the test
    # suite turns any sanitizer report into an error.
    r = k(a, 100)
    np.testing.assert_array_equal(r[100:, [0, 1, 3]], 0.0)
    _close(r[:100, 0], a[:100].sum(1))
    _close(r[:100, 1], a[:100, :32].max(1))
    _close(r[:, 2], a[:, 16:].mean(1))
    _close(r[:100, 3], a[:100].min(1))


def test_b1_broadcast_to_tile_and_hbm(b1):
    bnki, bnl, _ = b1

    @bnki.jit
    def k(a, b, c):
        out = bnl.ndarray(a.shape, dtype=a.dtype, buffer=bnl.shared_hbm)
        x = bnl.load(a)
        b_tile = bnl.load(b)                                       # (1, 512)
        y = x * b_tile.broadcast_to((128, 512))
        z = y + bnl.load(c.broadcast_to((128, 512)))               # HBM (1, 512): stride-0 DMA
        w = z - bnl.broadcast_to(bnl.load(c), shape=(128, 512))
        t = bnl.ndarray((128, 512), dtype=bnl.float32)
        t[...] = b_tile                                            # assignment broadcasts the partition dim
        bnl.store(out, value=w + t + bnl.load(c)[0:1, 0:1])        # + a (1, 1) tile
        return out

    a, b, c = _rand((128, 512), seed=1), _rand((1, 512), seed=2), _rand((1, 512), seed=3)
    _close(k(a, b, c), a * b + b + c[0, 0])


# --------------------------------------------------------------------------------------------------
# index expressions combining several arange / mgrid axes (Beta 1)
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_b1_avgpool_tutorial(b1, dtype):
    """The SDK average-pooling example: ``in_tile[i0, sz_pool*i1+i2, sz_pool*i3+i4]`` summed over
    axis=[2, 4] (a non-trailing reduction axis)."""
    bnki, bnl, _ = b1

    @bnki.jit
    def avgpool(in_tensor, pool_size):
        sz_cin, sz_hin, sz_win = in_tensor.shape
        sz_hout, sz_wout = sz_hin // pool_size, sz_win // pool_size
        out_tensor = bnl.ndarray((sz_cin, sz_hout, sz_wout), dtype=in_tensor.dtype, buffer=bnl.shared_hbm)
        sz_p, sz_pool = sz_cin, pool_size
        i0, i1, i2, i3, i4 = bnl.mgrid[0:sz_p, 0:sz_hin // sz_pool, 0:sz_pool, 0:sz_win // sz_pool, 0:sz_pool]
        in_tile = bnl.load(in_tensor)
        out_tile = bnl.sum(in_tile[i0, sz_pool * i1 + i2, sz_pool * i3 + i4], axis=[2, 4]) / (pool_size * pool_size)
        bnl.store(out_tensor, value=out_tile)
        return out_tensor

    x = _rand((64, 8, 12), dtype, 11)
    ref = x.astype(np.float32).reshape(64, 4, 2, 6, 2).mean(axis=(2, 4))
    _close(avgpool(x, 2), ref, dtype)


def test_b1_two_axis_index_load_store(b1):
    """``x[i_p, 2 * i_f + i_k]`` (mgrid) as the HBM operand of nl.load / nl.store, and on a tile."""
    bnki, bnl, _ = b1

    @bnki.jit
    def k(a):
        out = bnl.ndarray((128, 32, 2), dtype=a.dtype, buffer=bnl.shared_hbm)
        out2 = bnl.ndarray((128, 32), dtype=a.dtype, buffer=bnl.shared_hbm)
        i_p, i_f, i_k = bnl.mgrid[0:128, 0:32, 0:2]
        t = bnl.load(a[i_p, 2 * i_f + i_k])             # (128, 32, 2)
        bnl.store(out, value=t * 2.0)
        full = bnl.load(a)
        m = bnl.max(full[i_p, 2 * i_f + i_k], axis=2)   # pairwise max over a tile view
        bnl.store(out2, value=m)
        return out, out2

    a = _rand((128, 64), seed=12)
    o, o2 = k(a)
    _close(o, a.reshape(128, 32, 2) * 2)
    _close(o2, a.reshape(128, 32, 2).max(2))


def test_b1_overlapping_windows(b1):
    """Overlapping windows (width 3, stride 2: ``t[i_p, 2 * i_f + i_k]``) are numpy advanced indexing (spec
    §3.8) and one hardware access pattern (§2.0: a source may visit an element twice): read in place as a
    kernel.json strided view, by the reduction and by a DMA from HBM (they raised NSIM-E428). Also the 3x3 /
    stride-2 windows of a 2-D max pool (4 free dims), and a 2-D window of an HBM tensor. Writing through such a
    view is an error (its elements may overlap)."""
    bnki, bnl, _ = b1

    @bnki.jit
    def k(a, b):
        out = bnl.ndarray((128, 31), dtype=a.dtype, buffer=bnl.shared_hbm)
        out2 = bnl.ndarray((128, 31, 3), dtype=a.dtype, buffer=bnl.shared_hbm)
        out3 = bnl.ndarray((128, 4, 4), dtype=a.dtype, buffer=bnl.shared_hbm)
        i_p, i_f, i_k = bnl.mgrid[0:128, 0:31, 0:3]
        t = bnl.load(a)
        bnl.store(out, value=bnl.sum(t[i_p, 2 * i_f + i_k], axis=2))
        bnl.store(out2, value=bnl.load(a[i_p, 2 * i_f + i_k]))
        j_p, j_h, j_kh, j_w, j_kw = bnl.mgrid[0:128, 0:4, 0:3, 0:4, 0:3]
        tb = bnl.load(b)
        bnl.store(out3, value=bnl.max(tb[j_p, 2 * j_h + j_kh, 2 * j_w + j_kw], axis=[2, 4]))
        return out, out2, out3

    a = _rand((128, 64), seed=13)
    b = _rand((128, 9, 9), seed=14)
    o, o2, o3 = k(a, b)
    win = np.stack([a[:, 2 * np.arange(31) + j] for j in range(3)], axis=2)
    _close(o2, win)
    _close(o, win.sum(axis=2))
    want = np.array([[b[:, 2 * i:2 * i + 3, 2 * j:2 * j + 3].max(axis=(1, 2)) for j in range(4)] for i in range(4)])
    _close(o3, want.transpose(2, 0, 1))

    @bnki.jit
    def bad(a):
        i_p, i_f, i_k = bnl.mgrid[0:128, 0:31, 0:3]
        t = bnl.load(a)
        t[i_p, 2 * i_f + i_k] = bnl.load(a[i_p, 2 * i_f + i_k])
        return a

    with pytest.raises(NsimError, match="through a strided view.*can only be read"):
        bad(_rand((128, 64)))


# --------------------------------------------------------------------------------------------------
# names composed from existing ops, and names that are not supported yet
# --------------------------------------------------------------------------------------------------


def test_new_shared_constant_and_identity():
    @nki.jit
    def k(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        c = nl.shared_constant(np.arange(a.shape[1], dtype=np.float32).reshape(1, -1))
        ident = nl.shared_identity_matrix(128, dtype=nl.float32)
        assert isinstance(c, nki.tensor) and ident.shape == (128, 128)
        t = nl.load(a)
        r = nl.matmul(ident, t, transpose_x=True)     # I.T @ a = a
        nl.store(out, nl.add(nl.copy(r), nl.load(c)))
        return out

    a = _rand((128, 64), seed=13)
    _close(k(a), a + np.arange(64, dtype=np.float32))


def test_b1_shared_constant_and_identity(b1):
    bnki, bnl, bnisa = b1

    @bnki.jit
    def k(a):
        out = bnl.ndarray(a.shape, dtype=a.dtype, buffer=bnl.shared_hbm)
        ident = bnl.load(bnl.shared_identity_matrix(128, dtype=bnl.bfloat16))
        c = bnl.load(bnl.shared_constant(np.full((128, 1), 2.0), dtype=bnl.float32))
        x = bnl.load(a)
        r = bnisa.nc_matmul(ident, x)                 # ident.T @ x
        bnl.store(out, value=bnl.copy(r) * c)
        return out

    a = _rand((128, 32), BF16, 14)
    _close(k(a), a.astype(np.float32) * 2, BF16)


@pytest.mark.parametrize("dialect", ["new", "beta1"])
def test_unsupported_names_raise_nsim_errors(b1, dialect):
    from nsim.nki._unsupported import NotSupportedError
    if dialect == "new":
        jit, L, I = nki.jit, nl, nisa
        from nsim.tracer import NkiTensor  # the tensor methods still stubbed (quantize_mx / nc_matmul_mx are real)
        calls = [lambda a, n=n: getattr(a, n)() for n in ("indirect", "rearrange")
                 if getattr(getattr(NkiTensor, n, None), "__nsim_unsupported__", None)]
        if not calls:
            pytest.skip("no new-dialect name is unsupported any more")
    else:
        jit, L, I = b1[0].jit, b1[1], b1[2]
        calls = [lambda a: I.builtin_custom_op(a), lambda a: L.all_reduce(a, L.add, (0,))]
    for fn in calls:
        @jit
        def k(a):
            fn(a)

        with pytest.raises(NotSupportedError, match="not supported yet by nsim: .+") as e:
            k(_rand((128, 8)))
        assert isinstance(e.value, NsimError) and e.value.code == "NSIM-E446"


@pytest.mark.parametrize("dialect", ["new", "beta1"])
def test_composed_value_functions(b1, dialect):
    jit, L = (nki.jit, nl) if dialect == "new" else (b1[0].jit, b1[1])

    @jit
    def k(a, w):
        outs = [L.ndarray((128, 64), dtype=L.float32, buffer=L.shared_hbm) for _ in range(5)]
        o_all = L.ndarray((128, 1), dtype=L.float32, buffer=L.shared_hbm)
        o_var = L.ndarray((128, 1), dtype=L.float32, buffer=L.shared_hbm)
        x = L.load(a)
        L.store(outs[0], L.floor(x))
        L.store(outs[1], L.ceil(x))
        L.store(outs[2], L.trunc(x))
        L.store(outs[3], L.where(L.greater(x, 0.0), x, 0.5))
        L.store(outs[4], L.rms_norm(x, L.load(w), 1, 64))
        L.store(o_all, L.expand_dims(L.all(L.greater(x, -2.5), 1), 1))
        L.store(o_var, L.var(x, 1))
        return tuple(outs) + (o_all, o_var)

    a = _rand((128, 64), seed=21) * 3
    w = _rand((1, 64), seed=22)
    r = k(a, w)
    _close(r[0], np.floor(a))
    _close(r[1], np.ceil(a))
    _close(r[2], np.trunc(a))
    _close(r[3], np.where(a > 0, a, 0.5))
    _close(r[4], a / np.sqrt((a * a).sum(1, keepdims=True) / 64 + 1e-6) * w)
    _close(r[5][:, 0], np.all(a > -2.5, axis=1).astype(np.float32))
    np.testing.assert_allclose(r[6][:, 0], a.var(1), rtol=1e-4, atol=1e-4)


def test_new_view_methods():
    @nki.jit
    def k(a):
        out = nl.ndarray((128, 16), a.dtype, buffer=nl.shared_hbm)
        out2 = nl.ndarray((128, 32), a.dtype, buffer=nl.shared_hbm)
        t = nl.load(a)                                       # (128, 64)
        assert t.get_pattern() == [[64, 128], [1, 64]] and t.is_contiguous()
        s = t.slice(1, 0, 64, 4)                             # columns 0, 4, ..., 60
        assert not s.is_contiguous() and not s.is_indirect()
        nl.store(out, nl.copy(s))
        v = t.ap([[64, 128], [2, 32]], offset=1)             # odd columns via an access pattern
        nl.store(out2, nl.copy(v))
        assert t.reshape((128, 64, 1)).permute((0, 2, 1)).shape == (128, 1, 64)
        assert t.select(1, 3).shape == (128, 1)
        return out, out2

    a = _rand((128, 64), seed=23)
    o, o2 = k(a)
    _close(o, a[:, 0:64:4])
    _close(o2, a[:, 1::2])


# --------------------------------------------------------------------------------------------------
# nl.loop_reduce (Beta 1): T[idx] = op(T[idx], x) across loop iterations
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("op,ref", [("add", np.sum), ("maximum", np.max), ("multiply", np.prod)])
def test_beta1_loop_reduce_over_column_blocks(b1, op, ref):
    """The public-kernel idiom: an uninitialised SBUF accumulator reduced over an affine_range. The first
    assignment stores x (nsim policy, spec §2.3), the others combine; no affine-range write conflict is
    reported (it is a reduction)."""
    _nki, bnl, _ = b1

    @_nki.jit
    def k(x):
        out = bnl.ndarray((128, 128), dtype=x.dtype, buffer=bnl.shared_hbm)
        acc = bnl.ndarray((128, 128), dtype=bnl.float32, buffer=bnl.sbuf)
        for j in bnl.affine_range(4):
            t = bnl.load(x[:, j * 128:(j + 1) * 128])
            acc[...] = bnl.loop_reduce(t, op=getattr(bnl, op), loop_indices=[j])
        bnl.store(out, acc)
        return out

    x = (0.5 + np.random.default_rng(3).random((128, 512))).astype(np.float32)
    got, prof = k.simulate(x)
    _close(got, ref(x.reshape(128, 4, 128), axis=1))
    assert prof.check_reports == []


@pytest.mark.parametrize("dialect", ["new", "beta1"])
def test_load_and_store_one_element(b1, dialect):
    """``nl.load(x[1])`` and ``nl.store(out[2], t)`` / ``nl.store(out[0], 3.0)`` on 1-D HBM tensors (the flash
    attention sample loads its dropout seed with ``nl.load(seed[0])``): one element as a (1,) tile (``x[1]`` of a
    1-D HBM tensor is (1,): HBM views stay >= 1-D, nki-api.md 3.8; a (P,) tile behaves as (P, 1), 3.10); the
    other elements untouched. Before, an IndexError out of the tracer."""
    jit, L = (nki.jit, nl) if dialect == "new" else (b1[0].jit, b1[1])

    @jit
    def k(x):
        out = L.ndarray((4,), dtype=L.float32, buffer=L.shared_hbm)
        t = L.load(x[1])
        assert tuple(t.shape) == (1,)
        L.store(out[2], t)
        L.store(out[0], 3.0)
        return out

    got = k(np.array([1.0, 2.0, 3.0, 4.0], np.float32))
    np.testing.assert_array_equal(got[[0, 2]], [3.0, 2.0])
