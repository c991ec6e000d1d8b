"""NKI reductions against numpy, in both dialects (new ``nsim.nki`` = ``import nki``; Beta 1 ``neuronxcc.nki`` via
the conftest ``b1`` fixture), one small kernel per case of a parametrised table.

Checked (shape, dtype and values of every result):

- value API ``nl.sum / max / min / prod / mean / var / all`` (spec §3.6; the spec has no ``nl.any`` / ``argmax``)
  over single and multiple free axes, trailing and non-trailing (permuted, e.g. ``[1, 3]`` of a 4-D tile), negative
  axes, keepdims True/False, on 2-D, 3-D and 4-D tiles, float32 / bfloat16 / int32; Beta 1 also under ``mask=``
  (the masked elements only) and via ``nisa.tensor_reduce(..., mask=)``.
- ``nisa.tensor_reduce`` (add / max / min / multiply / subtract, trailing axes, negate, keepdims),
  ``nisa.tensor_partition_reduce`` (add / average / maximum / bitwise_or / bitwise_and),
  ``nisa.activation_reduce`` and ``nisa.tensor_scalar_reduce`` ``reduce_res`` (add / max / min / multiply, negate),
  ``nisa.bn_stats`` + ``nisa.bn_aggr`` (mean / population variance), ``nisa.max8`` + ``nisa.nc_find_index8`` (the
  argmax-style ops of the spec, with ties: first occurrences, duplicates pair with successive matches) and a
  partition-axis sum through ``nl.matmul`` with a ones column.

References follow the spec's semantics: fp32 arithmetic, result cast to the result dtype (the input's unless
``dtype=``); exact comparison for max / min / int / index results, fp32 sums within 1e-5 of sum(|x|) (products,
means, variances relative), bf16 results against the reference rounded to bf16 (one bf16 ulp). Inputs mix
negative values, large magnitudes and ties. ``nl.all`` returns the input dtype (new dialect, spec §3.3) with 1/0.

Spec ambiguities: ``nl.var`` lists ``keepdims=False`` in its signature (spec §3.6) but "keeps the reduced dims":
nsim keeps them by default and drops them only for an explicit ``keepdims=False`` (numpy). int32 reductions go
through fp32 (spec §2.0), so values beyond 2^24 round: the reference rounds too (documented hazard). A Beta-1 mask
on a kept axis leaves the unmasked result positions unwritten (only the masked ones are compared).

nsim fixes made (python/nsim/nki/):
1. language.py ``all``: new-dialect ``nl.all(x, axis, keepdims=True)`` raised TypeError (spec §3.6 gives it
   keepdims; Beta 1's has none); now keeps the reduced dims.
2. language.py ``var``: ``nl.var(x, axis, keepdims=...)`` raised TypeError; now accepted (see above).
3. beta1/isa.py ``tensor_partition_reduce``: ``mask=`` (in the spec's Beta-1 signature) raised NSIM-E446
   NotSupported; now reduces the masked partitions into the masked columns.
4. engines/check/checker.cpp ``Checker::check_registers`` (the sanitizer's accumulator-register check, new that
   day) did not count ``tensor_scalar_reduce(reduce_cmd=load_reduce)`` as setting the VectorE registers, so its first
   use in a kernel raised a false NSIM-W501 (the value itself was right): ``test_tensor_scalar_reduce_load_reduce``.
"""
import re
import zlib

import numpy as np
import pytest

from conftest import require_core

_core, _mld = require_core()

from nsim import nki  # noqa: E402
import nsim.nki.language as nl  # noqa: E402
import nsim.nki.isa as nisa  # noqa: E402

BF16 = np.dtype(_mld.bfloat16)
F32 = np.dtype(np.float32)
I32 = np.dtype(np.int32)


def _data(shape, dt, seed, kind="mixed"):
    rng = np.random.default_rng(seed)
    if dt == I32:
        return rng.integers(-50, 50, shape).astype(np.int32)
    if kind == "prod":
        x = rng.uniform(0.8, 1.25, shape) * rng.choice([-1.0, 1.0], shape)
    elif kind == "pos":
        x = rng.uniform(0.5, 2.0, shape)
    else:
        x = rng.standard_normal(shape) * 3.0
        x[..., ::7] *= 1000.0  # large magnitudes
        x = np.round(x * 4) / 4  # ties for max / min
    return x.astype(np.float32).astype(dt)


def _check(got, want, dt, scale=None, exact=False):
    got = np.asarray(got)
    assert got.dtype == np.dtype(dt), (got.dtype, dt)
    assert got.shape == np.shape(want), (got.shape, np.shape(want))
    w = np.asarray(want, np.float64)
    if exact or np.dtype(dt) == I32:
        np.testing.assert_array_equal(got.astype(np.float64), np.asarray(want).astype(dt).astype(np.float64))
        return
    if np.dtype(dt) == BF16:
        wr = w.astype(np.float32).astype(BF16).astype(np.float64)
        np.testing.assert_allclose(got.astype(np.float64), wr, rtol=2 ** -7, atol=1e-6 if scale is None else
                                   float(np.max(scale)) * 2 ** -7)
        return
    tol = 1e-5 * (np.abs(w) if scale is None else np.asarray(scale, np.float64)) + 1e-30
    assert np.all(np.abs(got.astype(np.float64) - w) <= tol), np.max(np.abs(got.astype(np.float64) - w) - tol)


def _axes_norm(axis, nd):
    ax = (axis,) if isinstance(axis, int) else tuple(axis)
    return tuple(sorted(a % nd for a in ax))


def _ref(op, x, axis, keepdims):
    xf = x.astype(np.float64)
    ax = _axes_norm(axis, x.ndim)
    f = {"sum": np.sum, "max": np.max, "min": np.min, "prod": np.prod, "mean": np.mean, "var": np.var}[op] \
        if op != "all" else None
    if op == "all":
        return np.all(xf != 0, axis=ax, keepdims=keepdims).astype(np.float64)
    r = f(xf, axis=ax, keepdims=keepdims)
    if op in ("max", "min"):
        return r
    if op == "sum":
        return r, np.sum(np.abs(xf), axis=ax, keepdims=keepdims)
    if op == "mean":
        return r, np.mean(np.abs(xf), axis=ax, keepdims=keepdims)
    if op == "var":
        return r, np.mean(xf ** 2, axis=ax, keepdims=keepdims)  # fp32 error relative to E[x^2]
    return r, np.abs(r) * 8  # prod: rounding of each of n fp32 multiplies


def _value_kernel(jit, lang, fn):
    def k(x):
        t = lang.load(x)
        r = fn(t)
        out = lang.ndarray(tuple(r.shape), r.dtype, buffer=lang.shared_hbm)
        lang.store(out, r)
        return out
    return jit(k)


# (op, shape, axis, keepdims, dtype)
_SHAPES = [((128, 64), 1), ((128, 64), -1), ((64, 8, 16), 2), ((64, 8, 16), (1, 2)), ((64, 8, 16), 1),
           ((32, 4, 6, 8), (2, 3)), ((32, 4, 6, 8), (1, 3)), ((32, 4, 6, 8), [1, 2, 3]), ((32, 4, 6, 8), (-3, -1))]
NL_CASES = []
for _op in ("sum", "max", "min", "mean", "prod", "all"):
    for _i, (_shape, _axis) in enumerate(_SHAPES):
        for _dt in (F32, BF16, I32):
            if _op in ("mean", "prod") and _dt == I32:
                continue
            if _op in ("prod", "all") and _i % 2:
                continue
            NL_CASES.append((_op, _shape, _axis, bool((_i + len(NL_CASES)) % 2), _dt))
for (_shape, _axis) in _SHAPES[::2]:
    for _dt in (F32, BF16):
        NL_CASES.append(("var", _shape, _axis, True, _dt))


def _nl_case(lang, jit, op, shape, axis, keepdims, dt, seed):
    kind = "prod" if op == "prod" else "mixed"
    x = _data(shape, dt, seed, kind)
    if op == "all":
        x = np.where(np.random.default_rng(seed + 1).random(shape) < 0.02, 0, x).astype(dt)
        x[0] = 0  # a row of zeros
        x[1] = 1  # a row without zeros
        fn = lambda t: lang.all(t, axis)  # noqa: E731
        keepdims = False
    elif op == "var":
        fn = lambda t: lang.var(t, axis)  # noqa: E731
        keepdims = True
    else:
        f = getattr(lang, op)
        fn = lambda t: f(t, axis, keepdims=keepdims)  # noqa: E731
    got = _value_kernel(jit, lang, fn)(x)
    ref = _ref(op, x, axis, keepdims)
    if isinstance(ref, tuple):
        _check(got, ref[0], dt, scale=ref[1])
    else:
        _check(got, ref, dt, exact=True)


@pytest.mark.parametrize("op,shape,axis,keepdims,dt", NL_CASES,
                         ids=["{}-{}-{}-{}-{}".format(c[0], "x".join(map(str, c[1])), c[2], "kd" if c[3] else "nokd",
                                                      np.dtype(c[4]).name) for c in NL_CASES])
def test_nl_reduce_new(op, shape, axis, keepdims, dt):
    _nl_case(nl, nki.jit, op, shape, axis, keepdims, dt, seed=zlib.crc32(repr((op, shape, axis)).encode()) % 1000)


@pytest.mark.parametrize("op,shape,axis,keepdims,dt", NL_CASES[::3],
                         ids=["{}-{}-{}-{}-{}".format(c[0], "x".join(map(str, c[1])), c[2], "kd" if c[3] else "nokd",
                                                      np.dtype(c[4]).name) for c in NL_CASES[::3]])
def test_nl_reduce_beta1(b1, op, shape, axis, keepdims, dt):
    bnki, bnl, _ = b1
    _nl_case(bnl, bnki.jit, op, shape, axis, keepdims, dt, seed=7)


# --------------------------------------------------------------------------------------------------
# nisa (new dialect: dst-passing; each body returns the result tiles, stored to HBM outputs)
# --------------------------------------------------------------------------------------------------


def _isa_kernel(body):
    @nki.jit
    def k(x):
        t = nl.ndarray(tuple(x.shape), x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        outs = []
        for r in body(t):
            o = nl.ndarray(tuple(r.shape), r.dtype, buffer=nl.shared_hbm)
            nisa.dma_copy(dst=o, src=r)
            outs.append(o)
        return tuple(outs)
    return k


def _tile(shape, dt):
    return nl.ndarray(tuple(shape), np.dtype(dt), buffer=nl.sbuf)


_NP_OP = {"add": np.sum, "maximum": np.max, "minimum": np.min, "multiply": np.prod}
# (op, shape, axis, negate, keepdims, data dtype, dst dtype)
TR_CASES = [
    ("add", (128, 96), 1, False, False, F32, F32), ("add", (128, 96), -1, True, True, F32, F32),
    ("maximum", (64, 8, 16), 2, False, True, F32, F32), ("maximum", (64, 8, 16), (1, 2), False, False, BF16, BF16),
    ("minimum", (32, 4, 6, 8), (2, 3), False, True, F32, F32), ("minimum", (32, 4, 6, 8), (1, 2, 3), True, False,
                                                                F32, F32),
    ("add", (32, 4, 6, 8), (3,), False, False, BF16, F32), ("add", (64, 8, 16), (1, 2), False, False, BF16, BF16),
    ("multiply", (64, 3, 5), 2, False, False, F32, F32), ("multiply", (64, 10), 1, True, False, F32, F32),
    ("add", (128, 40), 1, False, False, I32, I32), ("maximum", (128, 4, 10), (1, 2), False, True, I32, I32),
    ("minimum", (128, 40), 1, True, False, I32, I32), ("subtract", (64, 12), 1, False, False, F32, F32),
]


@pytest.mark.parametrize("op,shape,axis,negate,keepdims,dt,odt", TR_CASES)
def test_tensor_reduce(op, shape, axis, negate, keepdims, dt, odt):
    x = _data(shape, dt, 11, "prod" if op == "multiply" else "mixed")
    ax = _axes_norm(axis, len(shape))
    oshape = [1 if a in ax else n for a, n in enumerate(shape)]
    if not keepdims:
        oshape = [n for a, n in enumerate(shape) if a not in ax]
        if len(oshape) == 1:
            oshape.append(1)

    def body(t):
        d = _tile(oshape, odt)
        nisa.tensor_reduce(dst=d, op=getattr(nl, op), data=t, axis=axis, negate=negate, keepdims=keepdims)
        return [d]
    (got,) = _isa_kernel(body)(x)
    xf = x.astype(np.float64)
    if op == "subtract":  # left fold from the first element (spec §2.1, nsim policy)
        want = xf[:, 0] - np.sum(xf[:, 1:], axis=1)
        scale = np.sum(np.abs(xf), axis=1)
    else:
        want = _NP_OP[op](xf, axis=ax)
        scale = np.sum(np.abs(xf), axis=ax) if op == "add" else np.abs(want) * 8
    want, scale = (-want if negate else want).reshape(oshape), scale.reshape(oshape)
    _check(got, want, odt, scale=scale, exact=op in ("maximum", "minimum"))


# (op, P, F, dtype)
TPR_CASES = [("add", 128, 64, F32), ("average", 100, 32, F32), ("maximum", 128, 48, F32), ("maximum", 64, 16, BF16),
             ("add", 32, 40, BF16), ("bitwise_or", 128, 16, I32), ("bitwise_and", 96, 16, I32), ("add", 128, 8, I32)]


@pytest.mark.parametrize("op,p,f,dt", TPR_CASES)
def test_tensor_partition_reduce(op, p, f, dt):
    x = _data((p, f), dt, 5)
    if op.startswith("bitwise"):
        x = np.random.default_rng(5).integers(0, 1 << 20, (p, f)).astype(np.int32)
        x |= 1 << 3  # a bit set everywhere (bitwise_and keeps it)

    def body(t):
        d = _tile((1, f), dt)
        nisa.tensor_partition_reduce(dst=d, op=getattr(nl, op), data=t)
        return [d]
    (got,) = _isa_kernel(body)(x)
    xf = x.astype(np.float64)
    if op == "bitwise_or":
        _check(got, np.bitwise_or.reduce(x, axis=0, keepdims=True), dt, exact=True)
    elif op == "bitwise_and":
        _check(got, np.bitwise_and.reduce(x, axis=0, keepdims=True), dt, exact=True)
    elif op == "maximum":
        _check(got, xf.max(0, keepdims=True), dt, exact=True)
    elif op == "add":
        _check(got, xf.sum(0, keepdims=True), dt, scale=np.abs(xf).sum(0, keepdims=True))
    else:
        _check(got, xf.mean(0, keepdims=True), dt, scale=np.abs(xf).mean(0, keepdims=True))


@pytest.mark.parametrize("act,shape,dt", [("copy", (128, 64), F32), ("exp", (64, 4, 16), F32),
                                          ("square", (128, 32), BF16)])
def test_activation_reduce(act, shape, dt):
    x = _data(shape, dt, 3, "pos")

    def body(t):
        d = _tile(shape, dt)
        s = _tile((shape[0], 1), F32)
        nisa.activation_reduce(dst=d, op=getattr(nl, act), data=t, reduce_op=nl.add, reduce_res=s, scale=2.0)
        return [d, s]
    got, s = _isa_kernel(body)(x)
    y = {"copy": lambda v: v, "exp": np.exp, "square": np.square}[act](2.0 * x.astype(np.float32)).astype(np.float32)
    _check(got, y, dt, scale=np.abs(y) * 2)
    yf = y.reshape(shape[0], -1).astype(np.float64)  # the sum is of the fp32 y (before the cast of dst)
    _check(s, yf.sum(1, keepdims=True), F32, scale=yf.sum(1, keepdims=True) * 10)


# (reduce_op, shape, dtype, negate)
TSR_CASES = [("add", (128, 64), F32, False), ("maximum", (128, 64), F32, True), ("minimum", (64, 4, 8), BF16, False),
             ("multiply", (32, 12), F32, False), ("add", (96, 8, 8), BF16, True)]


@pytest.mark.parametrize("rop,shape,dt,negate", TSR_CASES)
def test_tensor_scalar_reduce(rop, shape, dt, negate):
    x = _data(shape, dt, 9, "prod" if rop == "multiply" else "mixed")

    def body(t):
        d = _tile(shape, dt)
        r = _tile((shape[0], 1), F32)
        nisa.tensor_scalar_reduce(dst=d, data=t, op0=nl.multiply, operand0=-1.5, reduce_op=getattr(nl, rop),
                                  reduce_res=r, reduce_res_negate=negate)
        return [d, r]
    got, r = _isa_kernel(body)(x)
    y = (x.astype(np.float32) * np.float32(-1.5)).reshape(shape[0], -1).astype(np.float64)
    _check(got, y.reshape(shape), dt, exact=True)
    want = _NP_OP[rop](y, axis=1, keepdims=True)
    scale = np.abs(y).sum(1, keepdims=True) if rop == "add" else np.abs(want) * 8
    _check(r, -want if negate else want, F32, scale=scale, exact=rop in ("maximum", "minimum"))


@pytest.mark.parametrize("shape,dt,chunks", [((128, 512), F32, 1), ((64, 300), F32, 1), ((128, 1024), BF16, 2),
                                             ((32, 4, 96), F32, 1), ((128, 7), F32, 1)])
def test_bn_stats_aggr(shape, dt, chunks):
    x = _data(shape, dt, 4) / np.asarray(100, dt)  # keep var in range (large magnitudes still present)
    x = x.astype(dt)
    p = shape[0]
    f = int(np.prod(shape[1:]))

    def body(t):
        st = _tile((p, 6 * chunks), F32)
        if chunks == 1:
            nisa.bn_stats(dst=st, data=t)
        else:
            c = f // chunks
            for i in range(chunks):
                nisa.bn_stats(dst=st[:, 6 * i:6 * (i + 1)], data=t[:, c * i:c * (i + 1)])
        ag = _tile((p, 2), F32)
        nisa.bn_aggr(dst=ag, data=st)
        return [st, ag]
    st, ag = _isa_kernel(body)(x)
    xf = x.reshape(p, f).astype(np.float64)
    c = f // chunks
    for i in range(chunks):
        blk = xf[:, c * i:c * (i + 1)]
        ev, od = blk[:, 0::2], blk[:, 1::2]
        for j, part in enumerate((ev, od)):
            n = part.shape[1]
            s6 = st[:, 6 * i + 3 * j:6 * i + 3 * j + 3]
            np.testing.assert_array_equal(s6[:, 0], n)
            _check(s6[:, 1], part.mean(1), F32, scale=np.abs(part).mean(1) * 2)
            _check(s6[:, 2], part.var(1) * n, F32, scale=(part ** 2).sum(1) * 4)
    _check(ag[:, 0:1], xf.mean(1, keepdims=True), F32, scale=np.abs(xf).mean(1, keepdims=True) * 2)
    _check(ag[:, 1:2], xf.var(1, keepdims=True), F32, scale=(xf ** 2).mean(1, keepdims=True) * 4)


@pytest.mark.parametrize("shape,dt", [((128, 64), F32), ((64, 4, 40), F32), ((32, 200), BF16)])
def test_max8_find_index8(shape, dt):
    rng = np.random.default_rng(2)
    x = rng.integers(-20, 20, shape).astype(np.float32)
    x[0] = 7.0  # one row all equal: indices 0..7
    x = x.astype(dt)
    p = shape[0]

    def body(t):
        m = _tile((p, 8), dt)
        nisa.max8(dst=m, src=t)
        i = _tile((p, 8), np.uint32)
        nisa.nc_find_index8(dst=i, data=t, vals=m)
        return [m, i]
    m, idx = _isa_kernel(body)(x)
    xf = x.reshape(p, -1).astype(np.float64)
    order = np.argsort(-xf, axis=1, kind="stable")[:, :8]  # descending, ties by first occurrence
    _check(m, np.take_along_axis(xf, order, 1), dt, exact=True)
    _check(idx, order.astype(np.uint32), np.uint32, exact=True)
    # argmax = idx[:, 0], argmin of -x likewise
    np.testing.assert_array_equal(idx[:, 0], np.argmax(xf, axis=1))


@pytest.mark.parametrize("k,n,dt", [(128, 64, F32), (96, 200, BF16)])
def test_partition_sum_via_matmul(k, n, dt):
    x = _data((k, n), dt, 21)

    def fn(t):
        ones = nl.ndarray((k, 1), dt, buffer=nl.sbuf)
        nisa.memset(dst=ones, value=1.0)
        return nl.matmul(ones, t, transpose_x=True)  # (1, n) fp32 PSUM: sum over the partitions
    got = _value_kernel(nki.jit, nl, fn)(x)
    xf = x.astype(np.float64)
    _check(got, xf.sum(0, keepdims=True), F32, scale=np.abs(xf).sum(0, keepdims=True))


# --------------------------------------------------------------------------------------------------
# dtype= of the value API, Beta-1 masks and Beta-1 nisa reductions
# --------------------------------------------------------------------------------------------------

# (op, shape, axis, input dtype, dtype=)
DT_CASES = [("sum", (128, 64), 1, BF16, F32), ("sum", (32, 4, 6, 8), (1, 3), F32, BF16),
            ("max", (64, 8, 16), (1, 2), BF16, F32), ("mean", (64, 8, 16), 1, BF16, F32),
            ("sum", (128, 40), 1, I32, F32), ("min", (128, 40), -1, F32, I32), ("var", (128, 64), 1, BF16, F32)]


@pytest.mark.parametrize("dialect", ["new", "beta1"])
@pytest.mark.parametrize("op,shape,axis,dt,odt", DT_CASES)
def test_nl_reduce_dtype(request, dialect, op, shape, axis, dt, odt):
    if dialect == "new":
        lang, jit = nl, nki.jit
    else:
        bnki, lang, _ = request.getfixturevalue("b1")
        jit = bnki.jit
    x = _data(shape, dt, 13)
    if odt == I32:
        x = np.round(x).astype(dt)
    fn = (lambda t: getattr(lang, op)(t, axis, dtype=odt)) if op == "var" else \
        (lambda t: getattr(lang, op)(t, axis, dtype=odt, keepdims=False))
    got = _value_kernel(jit, lang, fn)(x)
    ref = _ref(op, x, axis, op == "var")
    if isinstance(ref, tuple):
        _check(got, ref[0], odt, scale=ref[1])
    else:
        _check(got, ref, odt, exact=True)


# (op, shape, mask over (i_p, i_f) of a [P, F] tile, keepdims, dtype)
MASK_CASES = [("sum", (128, 64), "f<40", True, F32), ("max", (128, 64), "f<33", False, F32),
              ("min", (128, 64), "f>=8", True, BF16), ("mean", (128, 64), "f<48", True, F32),
              ("sum", (128, 64), "p<100", True, F32), ("var", (128, 64), "f<32", True, F32),
              ("sum", (128, 40), "f<17", False, I32), ("prod", (64, 16), "f<5", True, F32),
              ("all", (128, 64), "f<20", False, F32)]


def _parse(spec):
    """'f<40' -> ('f', '<', 40)."""
    ax, cmp, v = re.match(r"([pf])(>=|<)(\d+)$", spec).groups()
    return ax, cmp, int(v)


def _mask(bnl, spec, i_p, i_f):
    ax, cmp, v = _parse(spec)
    e = i_p if ax == "p" else i_f
    return (e < v) if cmp == "<" else (e >= v)


def _sel(spec, n):
    _, cmp, v = _parse(spec)
    return (np.arange(n) < v) if cmp == "<" else (np.arange(n) >= v)


@pytest.mark.parametrize("op,shape,mspec,keepdims,dt", MASK_CASES)
def test_nl_reduce_beta1_mask(b1, op, shape, mspec, keepdims, dt):
    bnki, bnl, _ = b1
    P, F = shape
    x = _data(shape, dt, 17, "prod" if op == "prod" else "mixed")
    if op == "all":
        x[:, 25] = 0  # outside the mask: all() inside is 1 for rows without other zeros
        x[5, 3] = 0

    @bnki.jit
    def k(a):
        i_p, i_f = bnl.mgrid[0:P, 0:F]
        t = bnl.load(a[i_p, i_f])
        m = _mask(bnl, mspec, i_p, i_f)
        if op == "var":
            r = bnl.var(t, axis=1, mask=m)
        elif op == "all":
            r = bnl.all(t, axis=1, mask=m)
        elif op == "mean":
            r = bnl.mean(t, axis=1, keepdims=keepdims, mask=m)
        else:
            r = getattr(bnl, op)(t, axis=1, keepdims=keepdims, mask=m)
        out = bnl.ndarray(tuple(r.shape), r.dtype, buffer=bnl.shared_hbm)
        if len(r.shape) == 2:
            j_p, j_f = bnl.mgrid[0:P, 0:1]
            nl_mask = (j_p < 100) if mspec.startswith("p") else None
            bnl.store(out[j_p, j_f], value=r, mask=nl_mask)
        else:
            bnl.store(out, value=r, mask=(bnl.arange(P) < 100) if mspec.startswith("p") else None)
        return out
    got = k(x)
    ax, _, v = _parse(mspec)
    sel = _sel(mspec, F if ax == "f" else P)
    xs = x[:, sel] if ax == "f" else x[sel]
    kd = keepdims or op == "var"
    ref = _ref(op, xs, 1, kd)
    if ax == "p":
        got = got[:v]
    if isinstance(ref, tuple):
        _check(got, ref[0], dt, scale=ref[1])
    else:
        _check(got, ref, dt, exact=True)


# Beta-1 nisa: value-returning, dtype= / mask= / negate / keepdims
@pytest.mark.parametrize("op,shape,axis,negate,keepdims,dt,odt,mspec", [
    ("add", (128, 64), 1, False, True, BF16, F32, None), ("maximum", (128, 64), 1, True, False, F32, F32, "f<30"),
    ("minimum", (128, 64), 1, False, True, I32, I32, "f>=3"), ("add", (128, 64), 1, True, True, F32, BF16, "f<50")])
def test_tensor_reduce_beta1(b1, op, shape, axis, negate, keepdims, dt, odt, mspec):
    bnki, bnl, bnisa = b1
    P, F = shape
    x = _data(shape, dt, 19)

    @bnki.jit
    def k(a):
        i_p, i_f = bnl.mgrid[0:P, 0:F]
        t = bnl.load(a[i_p, i_f])
        m = None if mspec is None else _mask(bnl, mspec, i_p, i_f)
        r = bnisa.tensor_reduce(getattr(bnl, op), t, axis, mask=m, dtype=odt, negate=negate, keepdims=keepdims)
        out = bnl.ndarray(tuple(r.shape), r.dtype, buffer=bnl.shared_hbm)
        bnl.store(out, value=r)
        return out
    got = k(x)
    xs = x if mspec is None else x[:, _sel(mspec, F)]
    xf = xs.astype(np.float64)
    want = _NP_OP[op](xf, axis=1, keepdims=keepdims)
    want = -want if negate else want
    _check(got, want, odt, scale=np.abs(xf).sum(1, keepdims=keepdims), exact=op != "add")


def test_beta1_isa_reductions(b1):
    """Beta-1 tensor_partition_reduce / activation_reduce / tensor_scalar_reduce / bn_stats + bn_aggr."""
    bnki, bnl, bnisa = b1
    x = _data((128, 96), F32, 23) / np.float32(100)

    @bnki.jit
    def k(a):
        t = bnl.load(a)
        pr = bnisa.tensor_partition_reduce(bnl.maximum, t)
        s1 = bnl.ndarray((128, 1), bnl.float32, buffer=bnl.sbuf)
        y = bnisa.activation_reduce(bnl.copy, t, reduce_op=bnl.add, reduce_res=s1, scale=-1.0)
        s2 = bnl.ndarray((128, 1), bnl.float32, buffer=bnl.sbuf)
        z = bnisa.tensor_scalar_reduce(data=t, op0=bnl.add, operand0=1.0, reduce_op=bnl.minimum, reduce_res=s2)
        ag = bnisa.bn_aggr(bnisa.bn_stats(t))
        outs = []
        for r in (pr, s1, y, s2, z, ag):
            o = bnl.ndarray(tuple(r.shape), r.dtype, buffer=bnl.shared_hbm)
            bnl.store(o, value=r)
            outs.append(o)
        return tuple(outs)
    pr, s1, y, s2, z, ag = k(x)
    xf = x.astype(np.float64)
    _check(pr, xf.max(0, keepdims=True), F32, exact=True)
    _check(s1, -xf.sum(1, keepdims=True), F32, scale=np.abs(xf).sum(1, keepdims=True))
    _check(y, -xf, F32, exact=True)
    _check(s2, (x + np.float32(1)).min(1, keepdims=True), F32, exact=True)
    _check(z, x + np.float32(1), F32, exact=True)
    _check(ag[:, 0:1], xf.mean(1, keepdims=True), F32, scale=np.abs(xf).mean(1, keepdims=True) * 2)
    _check(ag[:, 1:2], xf.var(1, keepdims=True), F32, scale=(xf ** 2).mean(1, keepdims=True) * 4)


# --------------------------------------------------------------------------------------------------
# regressions of the nsim fixes, and spec-documented edge cases
# --------------------------------------------------------------------------------------------------

_X3 = _data((64, 8, 16), F32, 31)


@pytest.mark.parametrize("what,fn,want,scale", [
    # fix 1: new-dialect nl.all takes keepdims (spec 3.6; was a TypeError)
    ("all-kd", lambda t: nl.all(t, 1, keepdims=True), np.all(_X3 != 0, 1, keepdims=True), None),
    ("all-kd-2", lambda t: nl.all(t, (1, 2), keepdims=True), np.all(_X3 != 0, (1, 2), keepdims=True), None),
    # fix 2: new-dialect nl.var takes keepdims (spec 3.6; was a TypeError); default keeps the reduced dims
    ("var-nokd", lambda t: nl.var(t, 2, keepdims=False), _X3.astype(np.float64).var(2),
     (_X3.astype(np.float64) ** 2).mean(2)),
    ("var-kd", lambda t: nl.var(t, (1, 2), keepdims=True), _X3.astype(np.float64).var((1, 2), keepdims=True),
     (_X3.astype(np.float64) ** 2).mean((1, 2), keepdims=True)),
    # reductions of views: slices, strides, reshapes, a partition range; +/-inf
    ("sum-strided", lambda t: nl.sum(t[:, ::2, 1::3], axis=1), _X3[:, ::2, 1::3].astype(np.float64).sum(1),
     np.abs(_X3[:, ::2, 1::3].astype(np.float64)).sum(1)),
    ("max-reshape-ax1", lambda t: nl.max(t.reshape((64, 4, 32)), axis=1), _X3.reshape(64, 4, 32).max(1), None),
    ("min-prange", lambda t: nl.min(t[10:50], axis=(1, 2), keepdims=True), _X3[10:50].min((1, 2), keepdims=True),
     None),
])
@pytest.mark.filterwarnings("ignore:NSIM-W509")  # partition starts the hardware does not allow
def test_nl_regressions(what, fn, want, scale):
    got = _value_kernel(nki.jit, nl, fn)(_X3)
    _check(got, want, F32, scale=scale, exact=scale is None)


def test_int32_max_through_fp32():
    """Spec 2.0: Vector arithmetic casts to fp32, so int32 beyond 2^24 round (a documented hazard, not a bug)."""
    x = np.random.default_rng(0).integers(-2 ** 30, 2 ** 30, (128, 16)).astype(np.int32)
    got = _value_kernel(nki.jit, nl, lambda t: nl.max(t, 1))(x)
    _check(got, x.astype(np.float32).max(1).astype(np.float64).astype(np.int32), I32, exact=True)


def test_inf_max_min():
    x = _data((128, 32), F32, 37)
    x[:, 5] = np.inf
    x[:, 9] = -np.inf
    got = _value_kernel(nki.jit, nl, lambda t: nl.min(t, 1))(x)
    _check(got, x.min(1), F32, exact=True)
    got = _value_kernel(nki.jit, nl, lambda t: nl.max(t, 1, keepdims=True))(x)
    _check(got, x.max(1, keepdims=True), F32, exact=True)


@pytest.mark.filterwarnings("ignore:NSIM-W509")  # partition starts the hardware does not allow
@pytest.mark.parametrize("op,mspec,dt", [("add", "p<100", F32), ("maximum", "f<20", F32), ("add", "p>=30", BF16)])
def test_tensor_partition_reduce_beta1_mask(b1, op, mspec, dt):
    """fix 3: Beta-1 nisa.tensor_partition_reduce(mask=) (spec 2.3 lists mask=; was NSIM-E446 NotSupported)."""
    bnki, bnl, bnisa = b1
    P, F = 128, 48
    x = _data((P, F), dt, 41)

    @bnki.jit
    def k(a):
        i_p, i_f = bnl.mgrid[0:P, 0:F]
        t = bnl.load(a)
        r = bnisa.tensor_partition_reduce(getattr(bnl, op), t, mask=_mask(bnl, mspec, i_p, i_f))
        out = bnl.ndarray((1, F), r.dtype, buffer=bnl.shared_hbm)
        j_p, j_f = bnl.mgrid[0:1, 0:F]
        bnl.store(out[j_p, j_f], value=r, mask=_mask(bnl, mspec, j_p, j_f) if mspec[0] == "f" else None)
        return out
    got = k(x)
    xf = x.astype(np.float64)
    if mspec[0] == "p":
        xs = xf[_sel(mspec, P)]
    else:
        xs, got = xf[:, _sel(mspec, F)], got[:, _sel(mspec, F)]
    if op == "add":
        _check(got, xs.sum(0, keepdims=True), dt, scale=np.abs(xs).sum(0, keepdims=True))
    else:
        _check(got, xs.max(0, keepdims=True), dt, exact=True)


def test_beta1_mask_3d(b1):
    bnki, bnl, _ = b1
    x = _data((64, 8, 16), F32, 43)

    @bnki.jit
    def k(a):
        i_p, i_a, i_b = bnl.mgrid[0:64, 0:8, 0:16]
        t = bnl.load(a[i_p, i_a, i_b])
        s = bnl.sum(t, axis=(1, 2), mask=(i_b < 10))
        m = bnl.max(t, axis=1, mask=(i_a < 5))
        o1 = bnl.ndarray((64,), s.dtype, buffer=bnl.shared_hbm)
        o2 = bnl.ndarray((64, 16), m.dtype, buffer=bnl.shared_hbm)
        bnl.store(o1, value=s)
        bnl.store(o2, value=m)
        return o1, o2
    s, m = k(x)
    xf = x.astype(np.float64)
    _check(s, xf[:, :, :10].sum((1, 2)), F32, scale=np.abs(xf[:, :, :10]).sum((1, 2)))
    _check(m, xf[:, :5].max(1), F32, exact=True)


def test_tensor_scalar_reduce_load_reduce():
    x = _data((128, 64), F32, 47)

    def body(t):
        d = _tile((128, 64), F32)
        r = _tile((128, 1), F32)
        nisa.tensor_scalar_reduce(dst=d, data=t, op0=nl.multiply, operand0=1.0, reduce_op=nl.add, reduce_res=r,
                                  reduce_cmd=nisa.reduce_cmd.load_reduce, reduce_init=5.0)
        return [r]
    (r,) = _isa_kernel(body)(x)
    xf = x.astype(np.float64)
    _check(r, xf.sum(1, keepdims=True) + 5.0, F32, scale=np.abs(xf).sum(1, keepdims=True) + 5.0)


def test_register_chains():
    """activation reset_reduce then reduce (ScalarE registers), tensor_scalar_reduce max over two calls (VectorE)."""
    x = _data((128, 64), F32, 49)

    def body(t):
        r1, r2 = _tile((128, 1), F32), _tile((128, 1), F32)
        d = [_tile((128, 32), F32) for _ in range(4)]
        nisa.activation(dst=d[0], op=nl.copy, data=t[:, 0:32], reduce_op=nl.add,
                        reduce_cmd=nisa.reduce_cmd.reset_reduce)
        nisa.activation(dst=d[1], op=nl.copy, data=t[:, 32:64], reduce_op=nl.add, reduce_res=r1,
                        reduce_cmd=nisa.reduce_cmd.reduce)
        nisa.tensor_scalar_reduce(dst=d[2], data=t[:, 0:32], op0=nl.add, operand0=0.0, reduce_op=nl.maximum,
                                  reduce_cmd=nisa.reduce_cmd.reset_reduce)
        nisa.tensor_scalar_reduce(dst=d[3], data=t[:, 32:64], op0=nl.add, operand0=0.0, reduce_op=nl.maximum,
                                  reduce_res=r2, reduce_cmd=nisa.reduce_cmd.reduce)
        return [r1, r2]
    r1, r2 = _isa_kernel(body)(x)
    xf = x.astype(np.float64)
    _check(r1, xf.sum(1, keepdims=True), F32, scale=np.abs(xf).sum(1, keepdims=True))
    _check(r2, xf.max(1, keepdims=True), F32, exact=True)
