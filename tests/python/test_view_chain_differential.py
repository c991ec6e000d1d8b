"""New-dialect tensor views against numpy (nki-api.md §3.9: element ``(i0, ..., in)`` of a view is storage element
``offset + sum strides[k] * ik``), on random chains of the view methods public kernels use on HBM tensors: basic
subscripts (ints, slices with steps, ``nl.ds``), ``slice``, ``select``, ``.T`` / ``permute``, ``reshape`` (of a
contiguous view), ``reshape_dim``, ``flatten_dims``, ``expand_dim`` / ``squeeze_dim``, ``rearrange`` and ``.ap``
(which addresses the storage from the view's offset). Each chain is mirrored on a numpy array of the storage's flat
indices; the view is copied by ``nisa.dma_copy`` into an SBUF tile and back into a fresh output, which must equal
``storage.flat[indices]`` exactly. A view nsim refuses must be refused with an nsim error that names the rule (a
reshape of a non-contiguous view, more than 128 partitions), never with wrong values or another exception."""
import random

import numpy as np
import pytest

from conftest import require_core

_core, _mld = require_core()

from nsim import nki  # noqa: E402
import nsim.nki.isa as nisa  # noqa: E402
import nsim.nki.language as nl  # noqa: E402
from nsim.tracer import NsimError  # noqa: E402

CASES = 400


def _contiguous(idx):
    """Whether numpy index array ``idx`` (flat storage indices of a view) is a row-major dense run."""
    f = idx.ravel()
    return f.size == 0 or bool(np.all(np.diff(f) == 1))


def _step(rng, idx):
    """One random view method: (description, function of the NKI view, the numpy mirror of the index array), or None
    when none applies to this view."""
    nd, shape = idx.ndim, idx.shape
    choices = []
    if nd >= 1:
        d = rng.randrange(nd)
        n = shape[d]
        if n > 1:
            a = rng.randrange(n - 1)
            b = rng.randrange(a + 1, n + 1)
            s = rng.choice((1, 1, 2, 3))
            key = tuple([slice(None)] * d + [slice(a, b, s)])
            choices.append(("[{}:{}:{}] on dim {}".format(a, b, s, d), lambda v, key=key: v[key], idx[key]))
            choices.append(("slice({}, {}, {}, {})".format(d, a, b, s),
                            lambda v, d=d, a=a, b=b, s=s: v.slice(d, a, b, s), idx[key]))
            key2 = tuple([slice(None)] * d + [nl.ds(a, b - a)])
            choices.append(("nl.ds({}, {}) on dim {}".format(a, b - a, d), lambda v, key=key2: v[key],
                            idx[tuple([slice(None)] * d + [slice(a, b)])]))
        if nd >= 2:
            i = rng.randrange(n)
            choices.append(("select({}, {})".format(d, i), lambda v, d=d, i=i: v.select(d, i), np.take(idx, i, axis=d)))
            key = tuple([slice(None)] * d + [i])
            choices.append(("[{}] on dim {}".format(i, d), lambda v, key=key: v[key], idx[key]))
    if nd == 2:
        choices.append((".T", lambda v: v.T, idx.T))
    if nd >= 2:
        perm = list(range(nd))
        rng.shuffle(perm)
        choices.append(("permute({})".format(perm), lambda v, p=tuple(perm): v.permute(p), idx.transpose(perm)))
        d = rng.randrange(nd - 1)
        choices.append(("flatten_dims({}, {})".format(d, d + 1), lambda v, d=d: v.flatten_dims(d, d + 1),
                        idx.reshape(shape[:d] + (shape[d] * shape[d + 1],) + shape[d + 2:]) if _contiguous_dims(idx, d)
                        else None))
    if nd >= 1 and nd < 5:
        d = rng.randrange(nd)
        divs = [k for k in (2, 3, 4, 8) if shape[d] % k == 0 and shape[d] > k]
        if divs:
            k = rng.choice(divs)
            new = shape[:d] + (k, shape[d] // k) + shape[d + 1:]
            choices.append(("reshape_dim({}, ({}, -1))".format(d, k), lambda v, d=d, k=k: v.reshape_dim(d, (k, -1)),
                            idx.reshape(new)))
            if _contiguous(idx):
                choices.append(("reshape({})".format(new), lambda v, s=new: v.reshape(s), idx.reshape(new)))
        e = rng.randrange(nd + 1)
        choices.append(("expand_dim({})".format(e), lambda v, e=e: v.expand_dim(e), np.expand_dims(idx, e)))
    ones = [d for d in range(nd) if shape[d] == 1]
    if ones and nd > 1:
        d = rng.choice(ones)
        choices.append(("squeeze_dim({})".format(d), lambda v, d=d: v.squeeze_dim(d), np.squeeze(idx, d)))
    if nd == 2 and shape[1] % 2 == 0 and shape[1] > 2:
        h = 2
        w = shape[1] // h
        choices.append(("rearrange('b (h w) -> b w h', h=2)",
                        lambda v, h=h: v.rearrange(("b", ("h", "w")), ("b", "w", "h"), {"h": h}),
                        idx.reshape(shape[0], h, w).transpose(0, 2, 1)))
    if idx.size:
        off = int(idx.ravel()[0])
        # .ap over the storage from the view's offset: a [rows, cols] window with a row step of the storage's row
        choices.append(None)  # placeholder: filled by the caller, who knows the storage
    choices = [c for c in choices if c is None or c[2] is not None]
    return rng.choice(choices) if choices else None


def _contiguous_dims(idx, d):
    """flatten_dims(d, d + 1) applies where dim d steps over exactly dim d + 1's run."""
    if idx.shape[d] <= 1 or idx.shape[d + 1] <= 1:
        return True
    s = idx.strides
    return s[d] == s[d + 1] * idx.shape[d + 1]


def _ap_step(rng, idx, storage_shape):
    """A ``.ap`` over the storage from the view's offset: [rows, cols] (or [rows, a, b]) with row step the storage's
    row length, inside the storage."""
    total = int(np.prod(storage_shape))
    row = int(storage_shape[-1])
    off = int(idx.ravel()[0])
    rows = rng.randrange(1, 9)
    cols = rng.randrange(1, row + 1)
    if off + (rows - 1) * row + cols > total:
        return None
    pat = [[row, rows], [1, cols]]
    if rng.random() < 0.3 and cols % 2 == 0:
        pat = [[row, rows], [2, cols // 2], [1, 2]]
    extra = 0
    grid = np.zeros([c for _s, c in pat], np.int64) + off + extra
    for k, (s, c) in enumerate(pat):
        shp = [1] * len(pat)
        shp[k] = c
        grid = grid + s * np.arange(c).reshape(shp)
    return ".ap({})".format(pat), (lambda v, p=pat: v.ap(p)), grid


def _chain(seed):
    rng = random.Random(seed)
    shape = tuple(rng.choice((3, 4, 8, 12, 16, 24)) for _ in range(rng.choice((2, 3, 4))))
    idx = np.arange(int(np.prod(shape))).reshape(shape)
    steps = []
    for _ in range(rng.randrange(1, 5)):
        st = _step(rng, idx)
        if st is None:
            st = _ap_step(rng, idx, shape) if idx.size else None
        if st is None:
            break
        steps.append(st)
        idx = st[2]
        if idx.size == 0:
            return None
    return shape, steps, idx


def _cases(seed):
    out, k = [], 0
    while len(out) < CASES:
        c = _chain(seed * 100000 + k)
        k += 1
        if c is None:
            continue
        shape, steps, idx = c
        if idx.ndim < 2 or idx.ndim > 5 or idx.shape[0] > 128:  # (an SBUF tile: partitions + 1..4 free dims)
            continue
        if int(np.prod(idx.shape[1:])) * 4 > 64 * 1024:  # (and it fits SBUF)
            continue
        out.append(c)
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_view_chains_match_numpy(seed):
    failures, refused = [], 0
    for shape, steps, idx in _cases(seed):
        x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
        want = x.ravel()[idx]
        rshape = tuple(int(n) for n in idx.shape)

        @nki.jit
        def copy_view(x):
            v = x
            for _d, f, _i in steps:
                v = f(v)
            t = nl.ndarray(tuple(v.shape), dtype=x.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=t, src=v)
            out = nl.ndarray(tuple(v.shape), dtype=x.dtype, buffer=nl.shared_hbm)
            nisa.dma_copy(dst=out, src=t)
            return out

        what = "x{} {}".format(list(shape), " . ".join(d for d, _f, _i in steps))
        try:
            got = copy_view(x)
        except NsimError as e:
            refused += 1
            if e.code not in ("NSIM-E427", "NSIM-E202", "NSIM-E428"):  # a rule named: non-contiguous, partitions
                failures.append("{}: {}".format(what, str(e)[:220]))
            continue
        except Exception as e:  # noqa: BLE001 - anything but an nsim error is a bug
            failures.append("{}: {}: {}".format(what, type(e).__name__, str(e)[:220]))
            continue
        if tuple(got.shape) != rshape or not np.array_equal(got, want):
            failures.append("{}: wrong values (shape {} vs {})".format(what, tuple(got.shape), rshape))
    assert not failures, "\n".join(failures)
    assert refused < CASES // 3, refused
