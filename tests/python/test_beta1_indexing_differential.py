"""Beta-1 advanced indexing against numpy (nki-api.md §3.8: the result of ``t[item0, item1, ...]`` is numpy's advanced
indexing with every item advanced, its first dim the partition dim), on random subscripts: each item an int or an
affine expression ``c_p * i_p + c_f * i_f (+ c_g * i_g) + offset`` of ``nl.arange`` index arrays with coefficients
from -2 to 3 (zero, negative, repeated arange in several items: reversed rows, diagonals, overlapping windows,
transposed windows), on 2-D and 3-D HBM tensors, read by ``nl.load`` into a [P, F] or [P, F, G] tile and written back
whole; and, where the subscript maps each tile element to its own HBM element, written by ``nl.store`` into a zeroed
output. The loaded tile must equal ``x[np_items]``, the stored output numpy's ``out[np_items] = tile``.

Public kernels reach these subscripts from every side (a Toeplitz window ``rel[S - 1 - i_p + i_s]``, a transposed
store ``out[i * 128 + i_f, i_p]``, reversed rows ``x[127 - i_p, i_f]``); each such form that was wrong or refused was
found one kernel at a time before. This test walks the space instead: a seeded random sample, every case checked
exactly (fp32 values that are their own element's flat index)."""
import random

import numpy as np
import pytest

from conftest import require_core

_core, _mld = require_core()

CASES = 400  # per test; each is one trace + simulation (~20-40 ms)


def _case(rng):
    """A random subscript as public kernels write them: (tensor shape, result shape, items), items[d] = (coefs by
    result axis, offset), or (None, int). Each result axis of size > 1 is indexed by one item (in any item: a
    transposed window when the partition axis is not the first one indexed), an item by one axis with a coefficient
    in (1, 2, -1) (strided, reversed) or by two (a window ``2 * i_h + i_kh``, ``S - 1 - i_p + i_f``); the other
    items are ints. Some cases broadcast over the partitions (``x[b + 0 * i_p, i_f]``: numpy repeats the row)."""
    nres = rng.choice((2, 2, 3))
    rshape = [rng.choice((2, 7, 32, 64, 128))] + [rng.choice((1, 3, 8, 16, 40)) for _ in range(nres - 1)]
    ndim = rng.choice((2, 3))
    axes = [a for a in range(nres) if rshape[a] > 1]
    while len(axes) > ndim:  # more varying axes than dims: pair two of them in one item (a window)
        axes.pop()
    coefs = [None] * ndim
    dims = list(range(ndim))
    rng.shuffle(dims)
    transposed = rng.random() < 0.25
    if not transposed:  # the partition axis indexes the first non-int dim
        dims.sort()
    for d, a in zip(dims, axes):
        coefs[d] = [0] * nres
        coefs[d][a] = rng.choice((1, 1, 2, -1))
    for a in range(nres):
        if rshape[a] > 1 and a not in axes:  # joins an existing item as a window
            d = rng.choice([d for d in range(ndim) if coefs[d] is not None])
            coefs[d][a] = rng.choice((1, -1))
    if rng.random() < 0.2 and nres > 1:  # a window over two result axes
        d = rng.choice([d for d in range(ndim) if coefs[d] is not None])
        free = [a for a in range(nres) if coefs[d][a] == 0 and rshape[a] > 1 and
                all(coefs[e] is None or coefs[e][a] == 0 for e in range(ndim))]
        if free:
            coefs[d][rng.choice(free)] = 1
    windows = any(c is not None and sum(1 for k in c[1:] if k) > 1 for c in coefs)
    if rng.random() < 0.15 and not windows:  # a partition broadcast, ``x[b + 0 * i_p, i_f]``: no item varies along
        # the partitions (with ascending items and no window: a stride-0 dim next to a reversed or an overlapping one
        # is not one kernel-IR access, E428)
        for c in coefs:
            if c is not None:
                c[0] = 0
                c[:] = [abs(k) for k in c]
    shape, items = [], []
    for c in coefs:
        if c is None:
            size = rng.choice((1, 3, 5))
            items.append((None, rng.randrange(size)))
            shape.append(size)
            continue
        lo = sum(min(0, k * (n - 1)) for k, n in zip(c, rshape))
        hi = sum(max(0, k * (n - 1)) for k, n in zip(c, rshape))
        off = -lo + rng.randrange(3)
        items.append((c, off))
        shape.append(off + hi + 1 + rng.randrange(3))
    return tuple(shape), tuple(rshape), items


def _np_items(rshape, items):
    """The numpy index arrays of a case (broadcast over the result shape)."""
    grids = np.meshgrid(*[np.arange(n) for n in rshape], indexing="ij")
    out = []
    for coefs, off in items:
        if coefs is None:
            out.append(off)
        else:
            out.append(off + sum(c * g for c, g in zip(coefs, grids)))
    return tuple(out)


def _whole(nl, rshape):
    """One nl.arange index array per result axis (``nl.arange(n)[None, :, None]``...): the whole index space."""
    nres = len(rshape)
    ar = []
    for a, n in enumerate(rshape):
        sl = [None] * nres
        sl[a] = slice(None)
        ar.append(nl.arange(n)[tuple(sl)])
    return tuple(ar)


def _nl_items(nl, rshape, items):
    """The same items as Beta-1 index expressions of nl.arange."""
    ar = _whole(nl, rshape)
    out = []
    bcast = not any(c is not None and c[0] for c, _o in items)  # ``0 * i_p`` in the first item makes the partitions
    for coefs, off in items:
        if coefs is None:
            out.append(off)
            continue
        e = None
        if bcast:
            e, bcast = 0 * ar[0], False
        for c, x in zip(coefs, ar):
            if c:
                e = c * x if e is None else e + c * x
        if e is None:  # every coefficient 0: the constant, as an expression over the partition axis
            e = 0 * ar[0]
        out.append(e + off)
    return tuple(out)


def _cases(seed):
    rng = random.Random(seed)
    out = []
    while len(out) < CASES:
        shape, rshape, items = _case(rng)
        if np.prod(shape) > 1 << 20:
            continue
        out.append((shape, rshape, items))
    return out


def _describe(shape, rshape, items):
    names = "pfg"
    parts = []
    for coefs, off in items:
        if coefs is None:
            parts.append(str(off))
        else:
            terms = ["{}*i_{}".format(c, names[a]) for a, c in enumerate(coefs) if c]
            parts.append(" + ".join(terms + [str(off)]))
    return "x{} [{}] -> {}".format(list(shape), ", ".join(parts), list(rshape))


@pytest.mark.parametrize("seed", [1, 2, 5, 6, 7])
def test_load_matches_numpy_advanced_indexing(b1, seed):
    nki, nl, _ = b1
    failures = []
    for shape, rshape, items in _cases(seed):
        x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
        want = x[_np_items(rshape, items)]
        assert want.shape == rshape
        tile_shape = []

        @nki.jit
        def gather(x):
            out = nl.ndarray(rshape, dtype=nl.float32, buffer=nl.shared_hbm)
            t = nl.load(x[_nl_items(nl, rshape, items)])
            tile_shape.append(tuple(t.shape))
            nl.store(out[_whole(nl, rshape)], value=t)
            return out

        try:
            got = gather(x)
        except Exception as e:  # noqa: BLE001 - every failure is collected and reported with its case
            failures.append("{}: {}: {}".format(_describe(shape, rshape, items), type(e).__name__, str(e)[:200]))
            continue
        if got.shape != want.shape or not np.array_equal(got, want):
            failures.append("{}: wrong values".format(_describe(shape, rshape, items)))
        elif tile_shape[-1] != rshape:
            failures.append("{}: a tile of shape {}".format(_describe(shape, rshape, items), tile_shape[-1]))
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("seed", [3, 4, 8, 9, 10])
def test_store_matches_numpy_assignment(b1, seed):
    """Subscripts that give each tile element its own HBM element (numpy assignment is then unambiguous)."""
    nki, nl, _ = b1
    failures, checked = [], 0
    for shape, rshape, items in _cases(seed):
        idx = _np_items(rshape, items)
        flat = np.ravel_multi_index(tuple(np.broadcast_to(i, rshape) for i in idx), shape)
        if len(np.unique(flat)) != flat.size:
            continue
        checked += 1
        src = (1 + np.arange(np.prod(rshape), dtype=np.float32)).reshape(rshape)
        want = np.zeros(shape, np.float32)
        want[idx] = src

        @nki.jit
        def scatter(src):
            out = nl.ndarray(shape, dtype=nl.float32, buffer=nl.shared_hbm)
            zero = nl.zeros(shape[1:] and (1,) + tuple(shape[1:]), dtype=nl.float32)
            for r in nl.affine_range(shape[0]):
                nl.store(out[r:r + 1], value=zero)
            t = nl.load(src[_whole(nl, rshape)])
            nl.store(out[_nl_items(nl, rshape, items)], value=t)
            return out

        try:
            got = scatter(src)
        except Exception as e:  # noqa: BLE001
            failures.append("{}: {}: {}".format(_describe(shape, rshape, items), type(e).__name__, str(e)[:200]))
            continue
        if not np.array_equal(got, want):
            failures.append("{}: wrong values".format(_describe(shape, rshape, items)))
    assert checked >= CASES // 4, checked
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("seed", [11, 12])
def test_masked_load_matches_numpy(b1, seed):
    """The ragged-tail idiom: one item shifted so that its last positions fall past its dim, those positions masked
    off (``mask=(item < size)``, spec §3.8: masked-out positions are never bounds-checked) in the load and in the
    store of the tile into a zeroed output; the output holds x's elements where the mask holds, 0 elsewhere. (Index
    spaces with a size-1 axis that indexes no dim, ``x[i_p, i_g]`` over (P, 1, n), were refused under a mask, and the
    unmasked load gave a (P, n) tile where numpy gives (P, 1, n).)"""
    nki, nl, _ = b1
    rng = random.Random(seed)
    failures, checked = [], 0
    for shape, rshape, items in _cases(seed):
        # (a mask on a window item, ``2 * i_h + i_kh < n``, is not a rectangle of the index space: one access per box)
        ds = [d for d, (c, _o) in enumerate(items) if c is not None]
        if not ds:
            continue
        d = rng.choice(ds)
        coefs, off = items[d]
        items = list(items)
        items[d] = (coefs, off + rng.randrange(1, 9))
        idx = _np_items(rshape, items)
        inside = np.broadcast_to(idx[d] < shape[d], rshape)
        if inside.all() or not inside.any():
            continue
        checked += 1
        x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
        safe = tuple(np.where(inside, i, 0) if k == d else i for k, i in enumerate(idx))
        want = np.where(inside, x[safe], 0).astype(np.float32)

        @nki.jit
        def masked(x):
            out = nl.ndarray(rshape, dtype=nl.float32, buffer=nl.shared_hbm)
            whole = _whole(nl, rshape)
            nl.store(out[whole], value=nl.zeros(rshape, dtype=nl.float32))
            it = _nl_items(nl, rshape, items)
            t = nl.load(x[it], mask=(it[d] < shape[d]))
            nl.store(out[whole], value=t, mask=(it[d] < shape[d]))
            return out

        try:
            got = masked(x)
        except Exception as e:  # noqa: BLE001
            failures.append("{} (mask on item {}): {}: {}".format(_describe(shape, rshape, items), d,
                                                                 type(e).__name__, str(e)[:200]))
            continue
        if not np.array_equal(got, want):
            failures.append("{} (mask on item {}): wrong values".format(_describe(shape, rshape, items), d))
    assert checked >= CASES // 4, checked
    assert not failures, "\n".join(failures)


def test_non_affine_index_expressions_are_an_nsim_error(b1):
    """A product of two aranges (``nisa.iota(i_p * i_f)``, ``x[i_p * i_f]``) is not affine: NSIM-E407 BadIndex at the
    kernel's line (was a bare Python TypeError from ``*``); an integer multiple stays affine."""
    nki, nl, nisa = b1
    from nsim.tracer import NsimError

    @nki.jit
    def product(x):
        out = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.shared_hbm)
        i_p, i_f = nl.mgrid[0:128, 0:64]
        nl.store(out[i_p, i_f], value=nisa.iota(i_p * i_f, dtype=nl.float32))
        return out

    with pytest.raises(NsimError, match="E407.*product of two nl.arange"):
        product(np.zeros((128, 64), np.float32))

    @nki.jit
    def scaled(x):
        out = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.shared_hbm)
        i_p, i_f = nl.mgrid[0:128, 0:64]
        nl.store(out[i_p, i_f], value=nisa.iota(3 * i_p + i_f * 2, dtype=nl.float32))
        return out

    p, f = np.mgrid[0:128, 0:64]
    np.testing.assert_array_equal(scaled(np.zeros((128, 64), np.float32)), (3 * p + 2 * f).astype(np.float32))
