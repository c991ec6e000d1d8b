"""``tensor.rearrange(src_pattern, dst_pattern, fixed_sizes=None)`` (spec nki-api.md §3.9, issue 10 item 2):
einops-style split / permute / merge views of HBM tensors and tiles, checked against numpy's reshape and
transpose of the same pattern, in both dialects; and the documented errors."""

import numpy as np
import pytest

from conftest import require_core  # noqa: E402

_core, ml_dtypes = require_core()

from nsim import _errors, nki  # noqa: E402
import nsim.nki.isa as nisa  # noqa: E402
import nsim.nki.language as nl  # noqa: E402
from nki_helpers import code_of as _code  # noqa: E402
from nsim.tracer import NsimError  # noqa: E402


def _rng(seed=0):
    return np.random.default_rng(seed)


def _via_dma(pattern_src, pattern_dst, fixed, out_shape, on_chip):
    """A kernel copying ``a.rearrange(...)`` (HBM view, or the view of a tile holding ``a``) into an output."""
    @nki.jit
    def k(a):
        out = nl.ndarray(out_shape, dtype=a.dtype, buffer=nl.shared_hbm)
        if on_chip:
            t = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=t, src=a)
            r = nl.ndarray(out_shape, dtype=a.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=r, src=t.rearrange(pattern_src, pattern_dst, fixed))
            nisa.dma_copy(dst=out, src=r)
        else:
            nisa.dma_copy(dst=out, src=a.rearrange(pattern_src, pattern_dst, fixed))
        return out
    return k


@pytest.mark.parametrize("on_chip", [False, True])
@pytest.mark.parametrize("src,dst,fixed,shape,ref", [
    # the spec's example pattern on a tensor that has the two dims: swap them (a permuted access)
    (("b", "h", "w"), ("b", "w", "h"), None, (128, 4, 8), lambda a: a.transpose(0, 2, 1)),
    # split only, merge only, and both (identity layouts)
    (("b", ("h", "w")), ("b", "h", "w"), {"w": 8}, (128, 32), lambda a: a.reshape(128, 4, 8)),
    (("b", "h", "w"), ("b", ("h", "w")), None, (128, 4, 8), lambda a: a.reshape(128, 32)),
    # a permute, then a merge of axes that stay adjacent in memory (c has size 1)
    (("b", "h", "w", "c"), ("b", "w", ("h", "c")), None, (128, 2, 4, 1),
     lambda a: a.transpose(0, 2, 1, 3).reshape(128, 4, 2)),
    # a size-1 dim from () and a reversal of three dims
    (("b", "x", "y", "z"), ("b", "z", (), "y", "x"), None, (128, 2, 3, 4),
     lambda a: a.transpose(0, 3, 2, 1).reshape(128, 4, 1, 3, 2)),
    # a split of three then a merge back in another grouping: (b, (x y z)) -> (b, (x y), z)
    (("b", ("x", "y", "z")), ("b", ("x", "y"), "z"), {"x": 2, "y": 3}, (128, 24), lambda a: a.reshape(128, 6, 4)),
])
def test_rearrange_matches_numpy(on_chip, src, dst, fixed, shape, ref):
    a = _rng().standard_normal(shape).astype(np.float32)
    want = ref(a)
    got = _via_dma(src, dst, fixed, want.shape, on_chip)(a)
    np.testing.assert_array_equal(got, want)


def test_rearrange_hbm_permute_of_the_leading_dim():
    """On HBM every dim may move: (n, h, w) -> (w, n, h), and a split of a dim that stays in place:
    (n, h, (x y)) -> (h, n, x, y)."""
    a = _rng(1).standard_normal((6, 4, 5)).astype(np.float32)
    got = _via_dma(("n", "h", "w"), ("w", "n", "h"), None, (5, 6, 4), False)(a)
    np.testing.assert_array_equal(got, a.transpose(2, 0, 1))
    b = _rng(2).standard_normal((6, 4, 10)).astype(np.float32)
    got = _via_dma(("n", "h", ("x", "y")), ("h", "n", "x", "y"), {"x": 2}, (4, 6, 2, 5), False)(b)
    np.testing.assert_array_equal(got, b.reshape(6, 4, 2, 5).transpose(1, 0, 2, 3))


@pytest.mark.parametrize("on_chip", [False, True])
def test_rearrange_that_splits_a_dim_and_moves_the_parts_apart(on_chip):
    """The spec's example ``(('b', ('h', 'w')), ('b', 'w', 'h'), {'h': 4})`` on a (128, 32) tensor: both parts come
    from dim 1, which a kernel-IR access of the (128, 32) tensor visits once; the tracer writes it as an access of
    the tensor re-dimensioned (128, 4, 8) and visited (0, 2, 1) (kernel.json "shape")."""
    a = _rng(7).standard_normal((128, 32)).astype(np.float32)
    k = _via_dma(("b", ("h", "w")), ("b", "w", "h"), {"h": 4}, (128, 8, 4), on_chip)
    np.testing.assert_array_equal(k(a), a.reshape(128, 4, 8).transpose(0, 2, 1))
    accs = [v for s in k.to_json(a)["body"] for v in s.values() if isinstance(v, dict) and "tensor" in v]
    assert [(v["shape"], v["order"]) for v in accs if "shape" in v] == [([128, 4, 8], [0, 2, 1])]


def test_rearrange_beta1_tile(b1):
    bnki, bnl, _ = b1

    @bnki.jit
    def k(a):
        out = bnl.ndarray((128, 8, 4), dtype=a.dtype, buffer=bnl.shared_hbm)
        t = bnl.load(a)
        bnl.store(out, bnl.multiply(t.rearrange(("p", "h", "w"), ("p", "w", "h")), 2.0))
        return out

    a = _rng(2).standard_normal((128, 4, 8)).astype(np.float32)
    np.testing.assert_array_equal(k(a), a.transpose(0, 2, 1) * np.float32(2.0))


@pytest.mark.parametrize("args,name", [
    ((("b",), ("b",)), "BadView"),                                  # fewer names than dims
    ((("b", ("h", "w")), ("b", "h", "w")), "BadView"),              # two unknown sizes
    ((("b", ("h", "w")), ("b", "h", "w"), {"h": 5}), "BadView"),    # 32 does not split by 5
    ((("b", "h"), ("b", "h", "h")), "BadView"),                     # an axis twice
    ((("b", "h"), ("b", "x")), "BadView"),                          # an unknown axis
    ((("b", "h"), ("h", "b")), "BadView"),                          # on chip the partition dim stays first
    ((("b", ("h", "w")), ("b", ("h", "w")), {"h": 4, "q": 2}), "BadView"),  # fixed size of no axis
])
def test_rearrange_errors(args, name):
    @nki.jit
    def k(a):
        t = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a)
        t.rearrange(*args)
        return a

    with pytest.raises(NsimError) as e:
        k(np.zeros((128, 32), np.float32))
    assert _code(e.value) == _errors.code(name), str(e.value)


def test_rearrange_merge_of_non_adjacent_axes_is_a_reshape_error():
    """(b, h, w) -> (w, (b h))? needs b and h adjacent after the permute: on an HBM (6, 4, 5) tensor, (h w) -> (w h)
    merged is not one stride: BadReshape, the documented error (copy into a fresh tile first)."""
    @nki.jit
    def k(a):
        a.rearrange(("b", "h", "w"), ("b", ("w", "h")))
        return a

    with pytest.raises(NsimError) as e:
        k(np.zeros((6, 4, 5), np.float32))
    assert _code(e.value) == _errors.code("BadReshape"), str(e.value)


def test_permuted_views_in_the_ir():
    """A transposing view is one access with an ``order``: ``.T`` of a (64, 32) HBM tensor copied into a tile, and
    ``permute`` of an on-chip (128, 4, 8) tile consumed by a compute instruction."""
    @nki.jit
    def k(a, b):
        out_t = nl.ndarray((32, 64), dtype=a.dtype, buffer=nl.shared_hbm)
        out_p = nl.ndarray((128, 8, 4), dtype=b.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray((32, 64), dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a.T)
        nisa.dma_copy(dst=out_t, src=t)
        s = nl.ndarray(b.shape, dtype=b.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=s, src=b)
        r = nl.ndarray((128, 8, 4), dtype=b.dtype, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=r, data=s.permute((0, 2, 1)), op0=nl.multiply, operand0=3.0)
        nisa.dma_copy(dst=out_p, src=r)
        return out_t, out_p

    a = _rng(3).standard_normal((64, 32)).astype(np.float32)
    b = _rng(4).standard_normal((128, 4, 8)).astype(np.float32)
    got_t, got_p = k(a, b)
    np.testing.assert_array_equal(got_t, a.T)
    np.testing.assert_array_equal(got_p, b.transpose(0, 2, 1) * np.float32(3.0))
    orders = [v["order"] for s in k.to_json(a, b)["body"] for v in s.values() if isinstance(v, dict) and "order" in v]
    assert orders == [[1, 0], [0, 2, 1]]


@pytest.mark.parametrize("order", [[0, 0, 1], [0, 1], [1, 0, 2], [0, 1, 3]])
def test_kernel_json_bad_order(order):
    """A malformed order (not a permutation, wrong length, the partition dim not first on chip, a dim out of
    range) is E404 WrongType."""
    from nsim import simulate_json
    k = {"nsim_kernel": 1, "name": "o",
         "tensors": [{"name": "x", "buffer": "hbm", "shape": [128, 4, 8], "dtype": "float32", "kind": "input"},
                     {"name": "y", "buffer": "hbm", "shape": [128, 8, 4], "dtype": "float32", "kind": "output"}],
         "body": [{"alloc": {"name": "s", "shape": [128, 4, 8], "dtype": "float32", "buffer": "sbuf"}},
                  {"alloc": {"name": "r", "shape": [128, 8, 4], "dtype": "float32", "buffer": "sbuf"}},
                  {"op": "dma_copy", "dst": "s", "src": "x"},
                  {"op": "tensor_copy", "dst": "r", "src": {"tensor": "s", "index": [], "order": order}},
                  {"op": "dma_copy", "dst": "y", "src": "r"}]}
    x = _rng(5).standard_normal((128, 4, 8)).astype(np.float32)
    with pytest.raises(NsimError) as e:
        simulate_json(k, inputs={"x": x})
    assert _code(e.value) == _errors.code("WrongType"), str(e.value)
    k["body"][3]["src"]["order"] = [0, 2, 1]
    outs, _ = simulate_json(k, inputs={"x": x})
    np.testing.assert_array_equal(outs["y"], x.transpose(0, 2, 1))


def _redim_kernel(dst):
    """x (128, 60) -> s; r = s through `dst` (an access of r (128, 60)); y = r."""
    return {"nsim_kernel": 1, "name": "redim",
            "tensors": [{"name": "x", "buffer": "hbm", "shape": [128, 60], "dtype": "float32", "kind": "input"},
                        {"name": "y", "buffer": "hbm", "shape": [128, 60], "dtype": "float32", "kind": "output"}],
            "body": [{"alloc": {"name": "s", "shape": [128, 60], "dtype": "float32", "buffer": "sbuf"}},
                     {"alloc": {"name": "r", "shape": [128, 60], "dtype": "float32", "buffer": "sbuf"}},
                     {"op": "dma_copy", "dst": "s", "src": "x"},
                     {"op": "tensor_copy", "dst": dst,
                      "src": {"tensor": "s", "shape": [128, 6, 10], "index": [{"size": 128}, {"size": 6}, {"size": 10}]}},
                     {"op": "dma_copy", "dst": "y", "src": "r"}]}


def test_kernel_json_redimensioned_access():
    """A re-dimensioned access ("shape"): the NKI transpose tutorial's out[i_p, i_x * 6 + i_y] as r viewed
    (128, 10, 6) visited (0, 2, 1); the elements of the tensor in row-major order with the access's shape.
    Errors: another element count or partition dim (E427 BadReshape), an index past the access's dim (E408)."""
    from nsim import simulate_json
    x = _rng(6).standard_normal((128, 60)).astype(np.float32)
    good = {"tensor": "r", "shape": [128, 10, 6], "index": [{"size": 128}, {"size": 10}, {"size": 6}],
            "order": [0, 2, 1]}
    outs, _ = simulate_json(_redim_kernel(good), inputs={"x": x})
    np.testing.assert_array_equal(outs["y"], x.reshape(128, 6, 10).transpose(0, 2, 1).reshape(128, 60))
    for shape, name in (([128, 10, 5], "BadReshape"), ([64, 10, 12], "BadReshape")):
        with pytest.raises(NsimError) as e:
            simulate_json(_redim_kernel(dict(good, shape=shape)), inputs={"x": x})
        assert _code(e.value) == _errors.code(name), str(e.value)
    oob = dict(good, index=[{"size": 128}, {"start": 1, "size": 10}, {"size": 6}])
    with pytest.raises(NsimError) as e:
        simulate_json(_redim_kernel(oob), inputs={"x": x})
    assert _code(e.value) == _errors.code("IndexOutOfBounds"), str(e.value)
    assert "[128, 10, 6]" in str(e.value)
