"""Element-wise ``nl`` math of both dialects against numpy (nki-api.md §2.0 numerics, §3.3 result dtypes, §3.5 op
meanings, §3.6 value functions).

Each case is one tiny kernel per (op, dtype): load the [128, F] input tile(s), call the value-returning
``nl.<op>`` (new dialect ``nsim.nki.language``; Beta 1 ``neuronxcc.nki.language`` through the ``b1`` fixture), store
the result. Inputs are seeded random values plus edge values (0, -0, +-1, +-0.5, +-1.5, +-2.5, near-integer values,
large magnitudes; for int32 values above 2^24 and negative values for the bitwise ops, shift counts 0..31).
The reference is the spec's: inputs cast to fp32, computed in fp32 (numpy float32; transcendental functions in
float64 rounded to fp32, since nsim evaluates "the exact function in fp32", §3.5), cast to the result dtype
(§3.3 promotion; comparisons/logical ops: the input dtype in the new dialect, bool in Beta 1). New-dialect int32
comparisons have an int32 result, so they run exactly on GpSimd (§2.1) even above 2^24. Integer-valued
results (int32, comparisons, logical, bitwise, selection, rounding) must match exactly; fp32 arithmetic to ~1e-6
relative; transcendental functions to 4e-6 relative (a few fp32 ulps); bf16/fp16 results to 1 ulp of the fp32
reference rounded to that dtype. The result's dtype and shape are checked too. Also checked: the Beta-1 tile
operators (``+ - * / ** < >= == != & | ^ ~``, unary ``-``), a Python scalar on either side (§3.3 weak typing:
``bf16_tile + 1.5`` is float32, ``bf16_tile + 3`` bfloat16), an explicit ``dtype=``, and the gen4 ``abs_max`` /
``abs_min`` (config trn3; magnitude ties give y). The new dialect is ``nsim.nki`` (what ``import nki`` gives once the
compat layer is installed; the module does not install it at import).

Spec ambiguities (numpy followed): ``mod`` of a negative divisor follows Python ``%`` (sign of y), ``fmod`` C's
(sign of x), as §3.6 says. int32 add/subtract/multiply/maximum/minimum run on GpSimd exact with two's-complement
wrap (§2.1 tensor_tensor, nsim policy), so their reference is numpy int32 arithmetic; other int32 arithmetic takes
the fp32 path (§2.0) and its reference is computed in fp32 and cast back (round toward zero, saturate).

nsim fixes made:

- Beta-1 comparison and logical functions (``nl.equal`` ... ``nl.less_equal``, ``nl.logical_and/or/xor/not``, and
  the tile operators ``< <= > >= == !=`` and ``& | ^ ~`` on float tiles) returned the input dtype; §3.3 says they
  default to ``dtype=bool`` in Beta 1. python/nsim/nki/beta1/language.py ``B1OpCode.__call__`` now passes
  ``dtype=nl.bool_`` when no dtype is given (values 1/0, computed in fp32, so int32 above 2^24 compares after
  rounding, as the reference does). The new dialect keeps the input dtype (§3.3).

Also fixed (isa/semantics/common.cpp ``act_apply``): gelu / gelu_dx / gelu_apprx_tanh lost all relative accuracy in
their left tail (x < ~-6: gelu(-9) was -0, want -1.0e-18; gelu(-8) 1.8 % off) because ``1 + erf(x/sqrt2)`` and
``1 + tanh(z)`` cancel even in double; they are now ``erfc(-x/sqrt2) / 2`` and ``sigmoid(2z)``, as the reference.

Documented approximation honoured: ``nl.cos`` / ``nl.tan`` reduce the argument in fp32 (docs/timing-model.md), so they
are compared with a phase tolerance of ~2 ulp of ``|x| + 2 pi`` times ``|f'(x)|``.
"""
import math
import zlib

import numpy as np
import pytest

from conftest import require_core

_core, _mld = require_core()

from nsim import nki  # noqa: E402
import nsim.nki.isa as nisa  # noqa: E402
import nsim.nki.language as nl  # noqa: E402

BF16 = np.dtype(_mld.bfloat16)
F32, F16, I32 = np.dtype(np.float32), np.dtype(np.float16), np.dtype(np.int32)
FLOATS = (F32, BF16, F16)
ALL = FLOATS + (I32,)
P, F = 128, 8

_EDGES = np.array([0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 0.49999997, -0.49999997, 0.9999999,
                   -0.9999999, 1.0000001, 3.0, -3.0, 7.25, -7.75, 1e-3, -1e-3, 20.0, -20.0, 100.0, -100.0],
                  np.float32)
_IEDGES = np.array([0, 1, -1, 2, -2, 7, -8, 2 ** 24, 2 ** 24 + 1, -(2 ** 24) - 1, 2 ** 30 + 12345, -(2 ** 31),
                    2 ** 31 - 1, 123456789, -987654321], np.int64)


def _inputs(domain, dt, seed):
    """A [P, F] input of ``dt`` for ``domain``: edge values first, then seeded random values."""
    rng = np.random.default_rng(seed)
    n = P * F
    if dt == I32:
        if domain == "shift":
            v = rng.integers(0, 32, n)
        elif domain == "small":  # fp32-exact ints (|x| < 2^24) incl. negatives
            v = rng.integers(-1000, 1000, n)
            v[:7] = [0, 1, -1, 2, -2, 999, -999]
        elif domain == "nonzero":
            v = rng.integers(1, 1000, n) * rng.choice([-1, 1], n)
        else:  # full int32 range
            v = rng.integers(-(2 ** 31), 2 ** 31, n)
            v[:len(_IEDGES)] = _IEDGES
        return v.astype(np.int32).reshape(P, F)
    if domain == "pos":  # log / sqrt / rsqrt: inside the valid ranges of §3.5
        v = np.exp(rng.uniform(-20, 20, n))
        v[:6] = [1.0, 0.5, 2.0, 1e-6, 1e6, 3.0]
    elif domain == "atan":  # arctan: [-pi/2, pi/2] (§3.5; outside it NSIM-W507)
        v = rng.uniform(-np.pi / 2, np.pi / 2, n)
        v[:5] = [0.0, 1.0, -1.0, 1.5, -1.5]
    elif domain == "wide":  # sin / cos / tan: range-reduced by nl.sin / nl.cos / nl.tan (§3.6)
        v = rng.uniform(-30, 30, n)
        v[:4] = [0.0, 1.0, -1.0, 10.0]
    elif domain == "nonzero":
        v = rng.uniform(0.1, 10, n) * rng.choice([-1, 1], n)
        v[:6] = [1.0, -1.0, 0.5, -0.5, 3.0, -7.0]
    elif domain == "small":  # power: moderate positive bases
        v = rng.uniform(0.1, 4, n)
    elif domain == "exps":  # power: exponents, integer and not
        v = rng.uniform(-3, 3, n)
        v[::3] = np.round(v[::3])
    elif domain == "bool":
        v = rng.integers(0, 2, n).astype(np.float32) * rng.uniform(0.5, 3, n)
    elif domain == "exp":
        v = rng.normal(0, 4, n)
        v[:6] = [0.0, -0.0, 1.0, -1.0, 80.0, -80.0]
    else:  # any
        v = rng.normal(0, 3, n)
        v[:len(_EDGES)] = _EDGES
    if dt == F16 and domain == "exp":  # keep e^x inside fp16's range (an overflow is a sanitizer error)
        v = np.clip(v, -10, 10)
    elif dt == F16 and domain == "pos":
        v = np.clip(v, 1e-4, 6e4)
    v = v.astype(np.float32).astype(dt)
    return v.reshape(P, F)


# --- references (inputs already fp32 / int64) ---------------------------------------------------------------------
def _sig(x):
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-x))


def _erf(x):
    return np.vectorize(math.erf, otypes=[np.float64])(x)


def _phi(x):
    """The normal CDF without cancellation in its left tail (0.5 * erfc(-x / sqrt 2))."""
    return 0.5 * np.vectorize(math.erfc, otypes=[np.float64])(-x / np.sqrt(2.0))


_SQ2PI = np.sqrt(2.0 / np.pi)
_UNARY_ACT = {  # name: (reference on float64, domain)
    "exp": (np.exp, "exp"), "log": (np.log, "pos"), "tanh": (np.tanh, "any"), "sigmoid": (_sig, "any"),
    "relu": (lambda x: np.maximum(x, 0), "any"),
    # the spec's formulas, evaluated without cancellation: 0.5 (1 + erf(x / sqrt 2)) = Phi(x),
    # 0.5 (1 + tanh z) = sigmoid(2 z)
    "gelu": (lambda x: x * _phi(x), "any"),
    "gelu_dx": (lambda x: _phi(x) + x * np.exp(-x * x / 2) / np.sqrt(2 * np.pi), "any"),
    "gelu_apprx_tanh": (lambda x: x * _sig(2 * _SQ2PI * (x + 0.044715 * x ** 3)), "any"),
    "gelu_apprx_sigmoid": (lambda x: x * _sig(1.702 * x), "any"),
    "gelu_apprx_sigmoid_dx": (lambda x: _sig(1.702 * x) * (1 + 1.702 * x * (1 - _sig(1.702 * x))), "any"),
    "silu": (lambda x: x * _sig(x), "any"),
    "silu_dx": (lambda x: _sig(x) * (1 + x * (1 - _sig(x))), "any"),
    "softplus": (lambda x: np.logaddexp(0, x), "any"),
    "mish": (lambda x: x * np.tanh(np.logaddexp(0, x)), "any"),
    "erf": (_erf, "any"), "erf_dx": (lambda x: 2 / np.sqrt(np.pi) * np.exp(-x * x), "any"),
    "sqrt": (np.sqrt, "pos"), "rsqrt": (lambda x: 1 / np.sqrt(x), "pos"), "reciprocal": (lambda x: 1 / x, "nonzero"),
    "arctan": (np.arctan, "atan"), "sign": (np.sign, "any"), "square": (np.square, "any"), "abs": (np.abs, "any"),
    "sin": (np.sin, "wide"), "cos": (np.cos, "wide"), "tan": (np.tan, "wide"),
}
_EXACT_UNARY = {"relu", "sign", "abs", "square"}  # fp32-exact results (square: one rounding)
_UNARY_ALU = {  # name: (reference on fp32 / int64, domain, dtypes)
    "negative": (np.negative, "any", ALL), "floor": (np.floor, "any", FLOATS), "ceil": (np.ceil, "any", FLOATS),
    "trunc": (np.trunc, "any", FLOATS), "logical_not": (lambda x: (x == 0), "bool", ALL),
    "invert": (np.invert, "any", (I32,)),
}
_CMP = {"equal": np.equal, "not_equal": np.not_equal, "greater": np.greater, "greater_equal": np.greater_equal,
        "less": np.less, "less_equal": np.less_equal}
_LOGIC = {"logical_and": np.logical_and, "logical_or": np.logical_or, "logical_xor": np.logical_xor}
_BITS = {"bitwise_and": np.bitwise_and, "bitwise_or": np.bitwise_or, "bitwise_xor": np.bitwise_xor}
_ARITH = {  # name: (reference, domain x, domain y)
    "add": (np.add, "any", "any"), "subtract": (np.subtract, "any", "any"), "multiply": (np.multiply, "any", "any"),
    "divide": (np.divide, "any", "nonzero"), "maximum": (np.maximum, "any", "any"),
    "minimum": (np.minimum, "any", "any"), "power": (np.power, "small", "exps"),
    "fmod": (np.fmod, "any", "nonzero"), "mod": (np.mod, "any", "nonzero"),
}
_INT_EXACT = {"add", "subtract", "multiply", "maximum", "minimum"}  # GpSimd int32 (wrap)


def _cases():
    out = []
    for n, (_, dom) in _UNARY_ACT.items():
        for dt in FLOATS:
            out.append(("act", n, dt))
    for n, (_, dom, dts) in _UNARY_ALU.items():
        for dt in dts:
            out.append(("alu1", n, dt))
    for n in _ARITH:
        for dt in ALL:
            out.append(("arith", n, dt))
    for n in list(_CMP) + list(_LOGIC):
        for dt in ALL:
            out.append(("cmp", n, dt))
    for n in _BITS:
        out.append(("bits", n, I32))
    for n in ("left_shift", "right_shift"):
        out.append(("shift", n, I32))
    for dt in ALL:
        out.append(("where", "where", dt))
    return out


CASES = _cases()


def _id(c):
    return "{}-{}".format(c[1], c[2].name)


def _ulp_close(got, ref, dt, what):
    """``got`` (dtype dt) within 1 ulp of the fp32 reference rounded to ``dt``; inf/nan must match."""
    want = np.asarray(ref, np.float32).astype(dt).astype(np.float64)
    g = np.asarray(got).astype(np.float64)
    fin = np.isfinite(want)
    assert np.array_equal(np.isnan(g), np.isnan(want)), what + ": NaN positions differ"
    assert np.array_equal(g[~fin & ~np.isnan(want)], want[~fin & ~np.isnan(want)]), what + ": inf differ"
    eps = float(np.finfo(dt).eps) if dt != BF16 else 2.0 ** -7
    tiny = float(np.finfo(dt).tiny) if dt != BF16 else 2.0 ** -126
    tol = np.maximum(np.abs(want[fin]), tiny) * eps
    bad = np.abs(g[fin] - want[fin]) > tol
    if bad.any():
        i = np.flatnonzero(bad)[:5]
        raise AssertionError("{}: {} elements off by > 1 ulp, e.g. got {} want {}".format(
            what, int(bad.sum()), g[fin][i], want[fin][i]))


def _check_float(got, ref64, dt, rtol, atol, what):
    if dt != F32:
        return _ulp_close(got, ref64, dt, what)
    want = np.asarray(ref64, np.float64).astype(np.float32)
    np.testing.assert_allclose(np.asarray(got, np.float64), want.astype(np.float64), rtol=rtol, atol=atol,
                               equal_nan=True, err_msg=what)


def _plan(kind, name, dt, seed, dialect="new"):
    """(inputs, reference result as numpy array, expected dtype, comparison mode) of a case."""
    if kind == "act":
        ref, dom = _UNARY_ACT[name]
        x = _inputs(dom, dt, seed)
        mode = "exact32" if name in _EXACT_UNARY else ("phase" if name in ("sin", "cos", "tan") else "tr")
        return [x], ref(x.astype(np.float32).astype(np.float64)), dt, mode
    if kind == "alu1":
        ref, dom, _ = _UNARY_ALU[name]
        x = _inputs("small" if (dt == I32 and name != "invert") else dom, dt, seed)
        want = np.dtype(np.bool_) if (dialect == "b1" and name == "logical_not") else dt
        if dt == I32:
            return [x], ref(x.astype(np.int64)).astype(np.int64), want, "exact"
        return [x], ref(x.astype(np.float32)), want, "exact32" if want == dt else "exact"
    if kind == "arith":
        ref, dx, dy = _ARITH[name]
        if dt == I32:
            big = name in _INT_EXACT
            x = _inputs("int" if big else "small", dt, seed)
            y = _inputs("int" if big else ("nonzero" if dy == "nonzero" else "small"), dt, seed + 1)
            if name == "power":
                x, y = np.abs(x) % 7, np.abs(y) % 5
            if big:
                with np.errstate(over="ignore"):
                    return [x, y], ref(x, y).astype(np.int32), dt, "exact"
            r = ref(x.astype(np.float32), y.astype(np.float32)).astype(np.float32)
            return [x, y], np.trunc(r).astype(np.int64), dt, "exact"
        x, y = _inputs(dx, dt, seed), _inputs(dy, dt, seed + 1)
        x32, y32 = x.astype(np.float32), y.astype(np.float32)
        if name in ("power",):
            return [x, y], np.power(x32.astype(np.float64), y32.astype(np.float64)), dt, "tr"
        return [x, y], ref(x32, y32), dt, "exact32" if name not in ("divide", "fmod", "mod") else "arith"
    if kind == "cmp":
        ref = _CMP.get(name) or _LOGIC[name]
        dom = "int" if dt == I32 else ("bool" if name in _LOGIC else "any")
        x, y = _inputs(dom, dt, seed), _inputs(dom, dt, seed + 1)
        y[:, :2] = x[:, :2]  # equal pairs
        y[:, 2] = x[:, 2] + 1  # neighbours (above 2^24 for int32: equal once rounded to fp32)
        if dialect == "new":  # result int32 (the input dtype): exact on GpSimd for int32 (§2.1 tensor_tensor)
            return [x, y], ref(x, y).astype(dt), dt, "exact"
        # Beta 1: bool result, so the fp32 path (§2.0): int32 above 2^24 compared after rounding to fp32
        return [x, y], ref(x.astype(np.float32), y.astype(np.float32)), np.dtype(np.bool_), "exact"
    if kind == "bits":
        x, y = _inputs("int", dt, seed), _inputs("int", dt, seed + 1)
        return [x, y], _BITS[name](x, y), dt, "exact"
    if kind == "shift":
        x, y = _inputs("int", dt, seed), _inputs("shift", dt, seed + 1)
        u = x.view(np.uint32)
        r = (u << y.astype(np.uint32)) if name == "left_shift" else (u >> y.astype(np.uint32))
        return [x, y], r.view(np.int32), dt, "exact"
    if kind == "where":
        c = _inputs("bool", F32, seed)
        x, y = _inputs("any" if dt != I32 else "int", dt, seed + 1), _inputs("any" if dt != I32 else "int", dt, seed + 2)
        return [c, x, y], np.where(c != 0, x, y), dt, "exact"
    raise AssertionError(kind)


def _compare(got, ref, want_dt, mode, what):
    assert got.shape == (P, F), "{}: shape {}".format(what, got.shape)
    assert np.dtype(got.dtype) == np.dtype(want_dt), "{}: dtype {} want {}".format(what, got.dtype, want_dt)
    if mode == "exact":
        want = np.asarray(ref).astype(want_dt)
        if want_dt.kind == "f" or want_dt == BF16:
            np.testing.assert_array_equal(np.asarray(got, np.float64), want.astype(np.float64), err_msg=what)
        else:
            np.testing.assert_array_equal(got, want, err_msg=what)
        return
    if mode == "exact32":  # one fp32 rounding, then the cast
        if want_dt == F32:
            np.testing.assert_array_equal(np.asarray(got, np.float64),
                                          np.asarray(ref, np.float32).astype(np.float64), err_msg=what)
            return
        return _ulp_close(got, ref, want_dt, what)
    if mode == "arith":
        return _check_float(got, ref, want_dt, 1e-6, 1e-6, what)
    return _check_float(got, ref, want_dt, 4e-6, 1e-37, what)  # transcendental


def _new_kernel(name, nin, **kw):
    fn = getattr(nl, name)

    @nki.jit
    def k(*args):
        ts = []
        for a in args:
            t = nl.ndarray(a.shape, a.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=t, src=a)
            ts.append(t)
        r = fn(*ts, **kw)
        out = nl.ndarray(r.shape, r.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=r)
        return out
    return k


_XFAIL = {}  # (dialect, op, dtype name): reason (C++ root causes; none left)


def _mark(dialect, c):
    r = _XFAIL.get((dialect, c[1], c[2].name))
    return pytest.param(*c, id=_id(c), marks=pytest.mark.xfail(strict=True, reason=r) if r else ())


@pytest.mark.parametrize("kind,name,dt", [_mark("new", c) for c in CASES])
def test_new_dialect(kind, name, dt):
    ins, ref, want_dt, mode = _plan(kind, name, dt, seed=zlib.crc32((name + dt.name).encode()) % 1000)
    got = np.asarray(_new_kernel(name, len(ins))(*ins))
    _check(kind, name, dt, ins, got, ref, want_dt, mode, "new")


def _check(kind, name, dt, ins, got, ref, want_dt, mode, dialect):
    if name == "logical_not":
        ref = np.asarray(ref).astype(want_dt)
        mode = "exact"
    if mode == "phase":  # nl.sin / nl.cos / nl.tan: the documented fp32 range reduction (docs/timing-model.md,
        # nl.cos / nl.tan) costs up to about an ulp of |x| + 2 pi in phase, i.e. that times |f'(x)| in value
        x = ins[0].astype(np.float64)
        dphase = 2 * np.spacing(np.float32(np.abs(x) + 2 * np.pi)).astype(np.float64)
        deriv = np.abs(np.sin(x)) if name == "cos" else np.abs(np.cos(x)) if name == "sin" else 1 + np.tan(x) ** 2
        ok = np.abs(got.astype(np.float64) - ref) <= dphase * deriv + 4e-6 * np.abs(ref) + \
            (0 if dt == F32 else np.abs(ref) * float(np.finfo(np.float16).eps if dt == F16 else 2.0 ** -7))
        assert got.dtype == dt and got.shape == (P, F)
        assert ok.all(), "{} nl.{}({}): got {} want {} at x {}".format(dialect, name, dt.name, got[~ok][:4], ref[~ok][:4],
                                                                    x[~ok][:4])
        return
    _compare(got, ref, want_dt, mode, "{} nl.{}({})".format(dialect, name, dt.name))


def _b1_kernel(bnki, bnl, name, op=None):
    fn = getattr(bnl, name)

    @bnki.jit
    def k(*args):
        ts = [bnl.load(a) for a in args]
        r = op(*ts) if op is not None else fn(*ts)
        out = bnl.ndarray(r.shape, dtype=r.dtype, buffer=bnl.shared_hbm)
        bnl.store(out, value=r)
        return out
    return k


@pytest.mark.parametrize("kind,name,dt", [_mark("b1", c) for c in CASES])
def test_beta1(b1, kind, name, dt):
    bnki, bnl, _ = b1
    ins, ref, want_dt, mode = _plan(kind, name, dt, seed=zlib.crc32((name + dt.name).encode()) % 1000, dialect="b1")
    got = np.asarray(_b1_kernel(bnki, bnl, name)(*ins))
    _check(kind, name, dt, ins, got, ref, want_dt, mode, "b1")


# Beta-1 tile operators (§1.2): the same functions through ``a + b`` ...; ``& | ^ ~`` bitwise on int tiles
_OPERATORS = {
    "add": lambda a, b: a + b, "subtract": lambda a, b: a - b, "multiply": lambda a, b: a * b,
    "divide": lambda a, b: a / b, "power": lambda a, b: a ** b, "less": lambda a, b: a < b,
    "greater_equal": lambda a, b: a >= b, "equal": lambda a, b: a == b, "not_equal": lambda a, b: a != b,
    "bitwise_and": lambda a, b: a & b, "bitwise_or": lambda a, b: a | b, "bitwise_xor": lambda a, b: a ^ b,
    "invert": lambda a: ~a, "negative": lambda a: -a,
}
_OP_CASES = [c for c in CASES if c[1] in _OPERATORS and c[2] in (F32, BF16, I32)]


@pytest.mark.parametrize("kind,name,dt", [_mark("b1op", c) for c in _OP_CASES])
def test_beta1_operators(b1, kind, name, dt):
    bnki, bnl, _ = b1
    ins, ref, want_dt, mode = _plan(kind, name, dt, seed=zlib.crc32((name + dt.name).encode()) % 1000, dialect="b1")
    got = np.asarray(_b1_kernel(bnki, bnl, name, op=_OPERATORS[name])(*ins))
    _check(kind, name, dt, ins, got, ref, want_dt, mode, "b1 operator")


# A Python scalar operand (tensor_scalar; §3.3: a weak int counts as int32, a float as float32, so
# ``bf16_tile + 1.5`` is float32 and ``bf16_tile + 3`` stays bfloat16), on either side
_SCALAR_OPS = ("add", "subtract", "multiply", "divide", "maximum", "greater", "mod")
_SCALAR_CASES = [(n, dt, s, rev) for n in _SCALAR_OPS for dt in ALL for s in (3, -1.5) for rev in (False, True)
                 if not (n in ("divide", "mod") and rev)]


@pytest.mark.parametrize("dialect", ["new", "b1"])
@pytest.mark.parametrize("name,dt,s,rev", _SCALAR_CASES,
                         ids=["{}-{}-{}{}".format(n, d.name, s, "-rev" if r else "") for n, d, s, r in _SCALAR_CASES])
def test_scalar_operand(request, dialect, name, dt, s, rev):
    if dialect == "b1":
        bnki, lang, _ = request.getfixturevalue("b1")
        jit = bnki.jit
    else:
        lang, jit = nl, nki.jit
    fn = getattr(lang, name)
    x = _inputs("small" if dt == I32 else "any", dt, 7)

    @jit
    def k(a):
        if dialect == "b1":
            t = lang.load(a)
        else:
            t = nl.ndarray(a.shape, a.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=t, src=a)
        r = fn(s, t) if rev else fn(t, s)
        out = lang.ndarray(r.shape, dtype=r.dtype, buffer=lang.shared_hbm)
        if dialect == "b1":
            lang.store(out, value=r)
        else:
            nisa.dma_copy(dst=out, src=r)
        return out
    got = np.asarray(k(x))
    sdt = I32 if isinstance(s, int) else F32
    want_dt = nl.promote(dt, sdt)
    if name == "greater":
        want_dt = np.dtype(np.bool_) if dialect == "b1" else want_dt
    a, b = x.astype(np.float32), np.float32(s)
    ref = {"add": np.add, "subtract": np.subtract, "multiply": np.multiply, "divide": np.divide,
           "maximum": np.maximum, "greater": np.greater, "mod": np.mod}[name](*((b, a) if rev else (a, b)))
    what = "{} nl.{}({}, {}{})".format(dialect, name, dt.name, s, " rev" if rev else "")
    if want_dt == I32 or want_dt == np.bool_:
        ref = np.trunc(ref) if want_dt == I32 else ref
        _compare(got, ref, want_dt, "exact", what)
    else:
        _compare(got, ref, want_dt, "exact32" if name not in ("divide", "mod") else "arith", what)


@pytest.mark.parametrize("name", ["abs_max", "abs_min"])
@pytest.mark.parametrize("dt", ALL, ids=[d.name for d in ALL])
def test_abs_max_min_gen4(name, dt):
    """gen4 ALU ops (§3.5): the signed operand of larger / smaller magnitude, a tie gives y."""
    x = _inputs("small" if dt == I32 else "any", dt, 11)
    y = _inputs("small" if dt == I32 else "any", dt, 12)
    y[:, 0] = x[:, 0]
    y[:, 1] = -x[:, 1]  # magnitude ties of opposite sign
    got = np.asarray(_new_kernel(name, 2).options(config="trn3")(x, y))
    a, b = np.abs(x.astype(np.float32)), np.abs(y.astype(np.float32))
    ref = np.where(a > b, x, y) if name == "abs_max" else np.where(a < b, x, y)
    _compare(got, ref, dt, "exact", "new nl.{}({})".format(name, dt.name))


_DTYPE_KW = [("multiply", F32, I32), ("divide", F32, I32), ("add", I32, F32), ("add", BF16, F16), ("exp", F32, BF16),
             ("tanh", BF16, F32), ("negative", F32, I32), ("sqrt", F16, F32)]


@pytest.mark.parametrize("name,dt,out", _DTYPE_KW, ids=["{}-{}-{}".format(n, a.name, b.name) for n, a, b in _DTYPE_KW])
def test_explicit_dtype(name, dt, out):
    """``dtype=`` wins (§3.3): computed in fp32, then cast (float -> int: toward zero, §2.0 nsim policy)."""
    kind = "act" if name in _UNARY_ACT else ("alu1" if name in _UNARY_ALU else "arith")
    ins, ref, _, mode = _plan(kind, name, dt, seed=5)
    if dt == I32:  # (add only) not an int32 result: the fp32 path, no wrap (§2.0)
        ref = np.add(*[i.astype(np.float32) for i in ins])
    got = np.asarray(_new_kernel(name, len(ins), dtype=out)(*ins))
    what = "new nl.{}({}, dtype={})".format(name, dt.name, out.name)
    if out == I32:
        _compare(got, np.trunc(np.asarray(ref, np.float32)), out, "exact", what)
    else:
        _compare(got, ref, out, mode if mode != "exact" else "exact32", what)
