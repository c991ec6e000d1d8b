"""Differential test of NKI ISA instruction semantics (new dialect) against numpy references written
from the spec (/work/shared/spec/nki-api.md §2.0 numerics + each §2 entry, §3 casting / docs/dtypes.md).

One tiny kernel per case (HBM -> SBUF by dma_copy, one instruction into a dst tile of the case's dtype,
dma_copy back).  References: inputs cast to float32, computed in float32 (numpy), then cast to the dst
dtype: floats round to nearest even (ml_dtypes), float -> int truncates toward zero, saturates, NaN -> 0
(nsim policy, §2.0).  Bit-vector ops and all-int32 ``tensor_tensor`` (GpSimd, two's-complement wrap) are
exact integer references.  Checks: exact for integer / compare / selection / data movement results, fp32
arithmetic within 1 ulp, transcendental activations within 4 fp32 ulp, bf16 results exactly equal to the
rounded fp32 reference (1 bf16 ulp for transcendental activations).

Covered: tensor_scalar (op0/op1 pairs, reverse0/1, immediates and (P,1) operands, fp32/bf16/int32 in x
out), scalar_tensor_tensor, tensor_tensor (arithmetic, compare, logical, bitwise, shifts; fp32/bf16/int32),
tensor_copy (dtype conversions with edge values), activation (bias/scale as (P,1) and scalars), iota and
affine_select (multi-dim patterns, channel_multiplier, offset, every compare op), memset, select_reduce,
range_select, tensor_copy_predicated, nc_stream_shuffle, tensor_tensor_scan, max8 / nc_find_index8 /
nc_match_replace8 with ties.

Spec ambiguities (followed numpy / real NKI): ``right_shift`` is logical (spec §3.5); compare ops give
1.0/0.0 then cast to dst;
iota into a narrower integer dst wraps modulo 2^bits like numpy ``astype`` (spec: "evaluated in int32
and cast to dst.dtype"; nsim's documented store_int policy, docs/dtypes.md), whereas float -> int
(and the fp32-path int32 -> int8 tensor_copy) saturates;
``maximum``/``minimum`` of +0 and -0: which zero is returned is unspecified (numpy returns the first
operand, nsim the second) - only the value is checked.

Also: large int32 / uint32 through the fp32 path vs the exact GpSimd path, engine= choices for
tensor_copy / tensor_scalar / tensor_tensor, fp8 / fp16 / bf16 narrowing edges (docs/dtypes.md), IEEE
special values, numpy-ufunc op aliases, PSUM operands, stride-0 / strided views, register chains
(select_reduce reset_reduce -> reduce, tensor_tensor_scan chained via its last column).

nsim fixes made: none - every case agrees with the spec (no Python or C++ discrepancy found, no xfail).
"""
import numpy as np
import pytest

from conftest import require_core  # noqa: E402

_core, ml_dtypes = require_core()

from nsim import nki  # noqa: E402
import nsim.nki.isa as nisa  # noqa: E402
import nsim.nki.language as nl  # noqa: E402

BF16 = ml_dtypes.bfloat16
F32, I32 = np.float32, np.int32
P, F = 16, 24
FP32_MIN = np.float32(-3.4028235e38)
# edge inputs (1/0, out-of-range casts) legitimately trigger nsim's numeric check warnings
pytestmark = pytest.mark.filterwarnings("ignore:NSIM-W50[35]")


# --------------------------------------------------------------------------------------------------
# harness
# --------------------------------------------------------------------------------------------------

def _run(fn, ins, outs):
    """Run ``fn(dsts..., tiles...)`` in a kernel; ``ins`` numpy arrays (loaded to SBUF), ``outs`` a list of
    (shape, dtype) for the dst tiles (stored back). Returns the list of outputs."""
    def body(*hbm):
        res = [nl.ndarray(s, d, buffer=nl.shared_hbm) for s, d in outs]
        ts = []
        for h in hbm:
            t = nl.ndarray(h.shape, h.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=t, src=h)
            ts.append(t)
        ds = [nl.ndarray(s, d, buffer=nl.sbuf) for s, d in outs]
        fn(*ds, *ts)
        for r, d in zip(res, ds):
            nisa.dma_copy(dst=r, src=d)
        return tuple(res) if len(res) > 1 else res[0]
    r = nki.jit(body)(*ins)
    return [np.asarray(x) for x in (r if isinstance(r, (tuple, list)) else [r])]


def _cast(x, dtype):
    """fp32 value -> dst dtype per §2.0: RNE for floats; trunc / saturate / NaN->0 for ints."""
    dtype = np.dtype(dtype)
    x = np.asarray(x, np.float32)
    with np.errstate(all="ignore"):
        return _cast_(x, dtype)


def _cast_(x, dtype):
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        y = np.trunc(np.nan_to_num(x.astype(np.float64), nan=0.0, posinf=np.inf, neginf=-np.inf))
        return np.clip(y, info.min, info.max).astype(dtype)
    return x.astype(dtype)


def _ulps(a, b):
    a = np.asarray(a, np.float32).view(np.int32).astype(np.int64)
    b = np.asarray(b, np.float32).view(np.int32).astype(np.int64)
    a = np.where(a < 0, -(a & 0x7FFFFFFF), a)
    b = np.where(b < 0, -(b & 0x7FFFFFFF), b)
    return np.abs(a - b)


def _check(got, want, dtype, ulp=1, bf16_ulp=0):
    dtype = np.dtype(dtype)
    assert got.dtype == dtype, (got.dtype, dtype)
    if dtype.kind in "iub":
        np.testing.assert_array_equal(got, want)
        return
    g, w = got.astype(np.float32), np.asarray(want).astype(dtype).astype(np.float32)
    both_nan = np.isnan(g) & np.isnan(w)
    if dtype == np.float32:
        d = _ulps(g, w)
        d = np.where(np.isinf(g) & (g == w), 0, d)
        bad = (d > ulp) & ~both_nan & ~((g == 0) & (w == 0))
    else:
        u = np.uint16 if dtype.itemsize == 2 else np.uint8
        gb = got.view(u).astype(np.int32)
        wb = np.asarray(want).astype(dtype).view(u).astype(np.int32)
        bad = (np.abs(gb - wb) > bf16_ulp) & ~both_nan & ~((g == 0) & (w == 0))
    if bad.any():
        i = np.argwhere(bad)[0]
        raise AssertionError("{} mismatches; first at {}: got {!r} want {!r}".format(
            int(bad.sum()), tuple(i), g[tuple(i)], w[tuple(i)]))


def _data(dtype, seed=0, shape=(P, F), lo=-8.0, hi=8.0, edges=True):
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind in "iu":
        x = rng.integers(int(lo), int(hi) + 1, shape).astype(dtype)
        if edges:
            x.flat[:4] = [0, 1, -1 if np.dtype(dtype).kind == "i" else 2, int(hi)]
        return x
    x = rng.uniform(lo, hi, shape).astype(np.float32)
    if edges:
        x.flat[:6] = [0.0, -0.0, 1.0, -1.0, 0.5, 2.5]
        x.flat[6:9] = [1e-3, -7.75, 3.0]
    return x.astype(dtype)


# --------------------------------------------------------------------------------------------------
# fp32 ALU reference
# --------------------------------------------------------------------------------------------------

def _b(v):
    return v.astype(np.float32)


ALU = {
    "add": np.add, "subtract": np.subtract, "multiply": np.multiply,
    "maximum": np.maximum, "minimum": np.minimum, "divide": np.divide,
    "equal": lambda x, y: _b(x == y), "not_equal": lambda x, y: _b(x != y),
    "greater": lambda x, y: _b(x > y), "greater_equal": lambda x, y: _b(x >= y),
    "less": lambda x, y: _b(x < y), "less_equal": lambda x, y: _b(x <= y),
    "logical_and": lambda x, y: _b((x != 0) & (y != 0)), "logical_or": lambda x, y: _b((x != 0) | (y != 0)),
    "logical_xor": lambda x, y: _b((x != 0) ^ (y != 0)),
    "abs": lambda x, y: np.abs(x), "square": lambda x, y: x * x, "relu": lambda x, y: np.maximum(x, 0),
    "reciprocal": lambda x, y: np.float32(1) / x, "rsqrt": lambda x, y: np.float32(1) / np.sqrt(x),
}
IALU = {  # exact integer (bit-vector / GpSimd int32) references
    "bitwise_and": np.bitwise_and, "bitwise_or": np.bitwise_or, "bitwise_xor": np.bitwise_xor,
    "left_shift": lambda x, y: np.left_shift(x.astype(np.uint32), y.astype(np.uint32)).astype(x.dtype),
    "right_shift": lambda x, y: np.right_shift(x.astype(np.uint32), y.astype(np.uint32)).astype(x.dtype),
    "add": lambda x, y: (x.astype(np.int64) + y).astype(x.dtype),
    "subtract": lambda x, y: (x.astype(np.int64) - y).astype(x.dtype),
    "multiply": lambda x, y: (x.astype(np.int64) * y).astype(x.dtype),
}


def _alu(op, x, y, rev=False):
    x, y = np.asarray(x, np.float32), np.asarray(y, np.float32)
    with np.errstate(all="ignore"):
        return (ALU[op](y, x) if rev else ALU[op](x, y)).astype(np.float32)


def _opf(name):
    return getattr(nl, name)


# --------------------------------------------------------------------------------------------------
# tensor_scalar
# --------------------------------------------------------------------------------------------------

TS_PAIRS = [  # (op0, rev0, op1, rev1)
    ("add", False, None, False), ("subtract", True, None, False), ("multiply", False, "add", False),
    ("subtract", False, "multiply", True), ("maximum", False, "minimum", False), ("divide", True, None, False),
    ("multiply", False, "subtract", True), ("greater", False, "multiply", False),
    ("less_equal", True, None, False), ("abs", False, "add", False), ("square", False, None, False),
    ("relu", False, "subtract", False), ("equal", False, "logical_or", False), ("divide", False, "maximum", True),
]
TS_CASES = ([(p, vec, F32, F32) for p in TS_PAIRS for vec in (False, True)]
            + [(("multiply", False, "add", False), vec, di, do)
               for di in (F32, BF16, I32) for do in (F32, BF16, I32) for vec in (False, True)]
            + [(("subtract", True, "maximum", False), True, di, do) for di, do in ((BF16, BF16), (I32, I32))])


@pytest.mark.parametrize("pair,vec,din,dout", TS_CASES,
                         ids=lambda v: v if isinstance(v, bool) else getattr(v, "__name__", None))
def test_tensor_scalar(pair, vec, din, dout):
    op0, rev0, op1, rev1 = pair
    unary = op0 in ("abs", "square", "relu", "rsqrt", "reciprocal")
    x = _data(din, 1)
    s0 = None if unary else (np.float32(2.5) if din is not I32 else np.float32(3.0))
    s1 = np.float32(-1.25) if op1 else None
    ins = [x]
    if vec:
        v0 = _data(F32, 2, (P, 1), -4, 4, edges=False)
        v0[0, 0] = 0.0 if op0 != "divide" else 2.0
        v1 = _data(F32, 3, (P, 1), -4, 4, edges=False)
        if not unary:
            s0 = v0
            ins.append(v0)
        if op1:
            s1 = v1
            ins.append(v1)

    def k(d, t, *vs):
        vs = list(vs)
        o0 = None if unary else (vs.pop(0) if vec else float(s0))
        o1 = None if not op1 else (vs.pop(0) if vec else float(s1))
        nisa.tensor_scalar(dst=d, data=t, op0=_opf(op0), operand0=o0, reverse0=rev0,
                           op1=_opf(op1) if op1 else None, operand1=o1, reverse1=rev1)

    got, = _run(k, ins, [((P, F), dout)])
    t = _alu(op0, x, 0.0 if s0 is None else s0, rev0)
    if op1:
        t = _alu(op1, t, s1, rev1)
    _check(got, _cast(t, dout), dout)


TS_BIT = [("bitwise_and", 0x0F0F, "left_shift", 2), ("bitwise_or", 0x100, "bitwise_xor", 0x55),
          ("right_shift", 3, None, None), ("left_shift", 4, "right_shift", 1)]


@pytest.mark.parametrize("op0,s0,op1,s1", TS_BIT)
def test_tensor_scalar_bitvec(op0, s0, op1, s1):
    x = np.random.default_rng(4).integers(-2**31, 2**31 - 1, (P, F), dtype=np.int64).astype(I32)

    def k(d, t):
        nisa.tensor_scalar(dst=d, data=t, op0=_opf(op0), operand0=s0, op1=_opf(op1) if op1 else None,
                           operand1=s1)

    got, = _run(k, [x], [((P, F), I32)])
    want = IALU[op0](x, np.int32(s0))
    if op1:
        want = IALU[op1](want, np.int32(s1))
    _check(got, want, I32)


# --------------------------------------------------------------------------------------------------
# scalar_tensor_tensor
# --------------------------------------------------------------------------------------------------

STT = [("multiply", False, "add", False, False, F32, F32), ("subtract", True, "multiply", False, True, F32, F32),
       ("add", False, "maximum", True, True, BF16, BF16), ("divide", False, "subtract", True, False, F32, BF16),
       ("maximum", False, "add", False, True, I32, I32), ("greater", False, "multiply", False, False, F32, F32)]


@pytest.mark.parametrize("op0,rev0,op1,rev1,vec,din,dout", STT)
def test_scalar_tensor_tensor(op0, rev0, op1, rev1, vec, din, dout):
    x, y = _data(din, 5), _data(din, 6)
    v = _data(F32, 7, (P, 1), -3, 3, edges=False)
    s0 = v if vec else np.float32(1.5)
    ins = [x, y] + ([v] if vec else [])

    def k(d, t, u, *vs):
        nisa.scalar_tensor_tensor(dst=d, data=t, op0=_opf(op0), operand0=vs[0] if vec else 1.5, op1=_opf(op1),
                                  operand1=u, reverse0=rev0, reverse1=rev1)

    got, = _run(k, ins, [((P, F), dout)])
    want = _alu(op1, _alu(op0, x, s0, rev0), y, rev1)
    _check(got, _cast(want, dout), dout)


# --------------------------------------------------------------------------------------------------
# tensor_tensor
# --------------------------------------------------------------------------------------------------

TT_F = ["add", "subtract", "multiply", "maximum", "minimum", "divide", "equal", "not_equal", "greater",
        "greater_equal", "less", "less_equal", "logical_and", "logical_or", "logical_xor"]
TT_CASES = ([(op, F32, F32) for op in TT_F] + [(op, BF16, BF16) for op in TT_F[:6]]
            + [(op, F32, BF16) for op in ("add", "multiply", "divide")]
            + [(op, BF16, F32) for op in ("multiply", "subtract")]
            + [(op, F32, I32) for op in ("add", "greater", "multiply")]
            + [(op, I32, F32) for op in ("add", "maximum", "less")])


@pytest.mark.parametrize("op,din,dout", TT_CASES, ids=lambda v: getattr(v, "__name__", v))
def test_tensor_tensor(op, din, dout):
    x, y = _data(din, 8), _data(din, 9)
    y.flat[10:14] = x.flat[10:14]  # equal pairs for the compares
    if op == "divide":
        y[y == 0] = 3

    def k(d, a, b):
        nisa.tensor_tensor(dst=d, data1=a, data2=b, op=_opf(op))

    got, = _run(k, [x, y], [((P, F), dout)])
    _check(got, _cast(_alu(op, x, y), dout), dout)


TT_INT = ["add", "subtract", "multiply", "bitwise_and", "bitwise_or", "bitwise_xor", "left_shift", "right_shift"]


@pytest.mark.parametrize("op", TT_INT)
def test_tensor_tensor_int32_exact(op):
    rng = np.random.default_rng(10)
    x = rng.integers(-2**31, 2**31 - 1, (P, F), dtype=np.int64).astype(I32)
    if "shift" in op:
        y = rng.integers(0, 31, (P, F)).astype(I32)
    else:
        y = rng.integers(-2**31, 2**31 - 1, (P, F), dtype=np.int64).astype(I32)
    x.flat[:3] = [2**31 - 1, -2**31, 16777217]
    y.flat[:3] = [1, 1 if "shift" in op else -1, 1]

    def k(d, a, b):
        nisa.tensor_tensor(dst=d, data1=a, data2=b, op=_opf(op))

    got, = _run(k, [x, y], [((P, F), I32)])
    _check(got, IALU[op](x, y), I32)


# --------------------------------------------------------------------------------------------------
# tensor_copy / memset
# --------------------------------------------------------------------------------------------------

EDGE_F = np.array([0.0, -0.0, 1.5, -1.5, 2.5, -2.5, 0.49999997, 3e9, -3e9, np.inf, -np.inf, np.nan,
                   1.00390625, 1.01171875, 255.5, 65504.0, 16777217.0, -7.9, 1e-40, -1e-40,
                   3.3895314e38, 127.9, -128.9, 300.0], np.float32)
TC = [(F32, BF16), (F32, I32), (BF16, F32), (BF16, I32), (I32, F32), (I32, BF16), (F32, np.int8),
      (F32, np.uint8), (F32, np.int16), (F32, np.float16), (I32, np.int8), (F32, F32), (I32, I32), (BF16, BF16)]


@pytest.mark.parametrize("din,dout", TC, ids=lambda v: np.dtype(v).name)
def test_tensor_copy_convert(din, dout):
    if np.dtype(din).kind == "i":
        x = np.random.default_rng(11).integers(-2**31, 2**31 - 1, (P, F), dtype=np.int64).astype(din)
        x[0, :8] = [0, 1, -1, 16777217, 2**31 - 1, -2**31, 300, -129]
    else:
        x = np.tile(EDGE_F, (P, 1))[:, :F].astype(din)
        x[1:] = _data(F32, 12, (P - 1, F), -300, 300).astype(din)

    def k(d, t):
        nisa.tensor_copy(dst=d, src=t)

    got, = _run(k, [x], [((P, F), dout)])
    if np.dtype(din) == np.dtype(dout):
        np.testing.assert_array_equal(got.view(np.uint8), x.view(np.uint8))  # bit-exact
        return
    _check(got, _cast(x.astype(np.float32), dout), dout)


MEMSET = [(F32, 2.75), (F32, -0.0), (BF16, 1.00390625), (BF16, -3.5), (I32, 7), (I32, -123456789), (np.uint8, 200),
          (np.int16, -300)]


@pytest.mark.parametrize("dtype,value", MEMSET, ids=str)
def test_memset(dtype, value):
    def k(d):
        nisa.memset(dst=d, value=value)

    got, = _run(k, [], [((P, F), dtype)])
    want = np.full((P, F), value, np.float64)
    want = want.astype(dtype) if np.dtype(dtype).kind in "iu" else _cast(np.float32(value), dtype) + np.zeros((P, F), dtype)
    _check(got, want, dtype)
    if value == 0.0 and np.dtype(dtype).kind == "f":
        assert np.signbit(got.astype(np.float32)).all() == np.signbit(value)


# --------------------------------------------------------------------------------------------------
# activation
# --------------------------------------------------------------------------------------------------

def _sig(x):
    return 1 / (1 + np.exp(-x))


ACT = {"copy": lambda x: x, "exp": np.exp, "tanh": np.tanh, "sigmoid": _sig, "relu": lambda x: np.maximum(x, 0),
       "square": lambda x: x * x, "silu": lambda x: x * _sig(x), "gelu_apprx_tanh":
       lambda x: x * _sig(2 * np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3))}  # = 0.5x(1+tanh(z)), no cancellation
ACT_CASES = [("copy", "vec", "vec", F32), ("copy", 2.0, "vec", F32), ("exp", 0.5, "vec", F32),
             ("exp", "vec", 0.25, F32), ("tanh", -1.5, None, F32), ("sigmoid", "vec", "vec", BF16),
             ("relu", 3.0, -0.5, F32), ("square", "vec", None, F32), ("silu", 1.0, "vec", F32),
             ("gelu_apprx_tanh", 1.0, 0.1, BF16), ("copy", 1.0, "vec", I32), ("relu", "vec", "vec", BF16)]


@pytest.mark.parametrize("fn,scale,bias,dout", ACT_CASES, ids=str)
def test_activation(fn, scale, bias, dout):
    x = _data(F32, 13, lo=-4, hi=4)
    sv = _data(F32, 14, (P, 1), -2, 2, edges=False)
    bv = _data(F32, 15, (P, 1), -2, 2, edges=False)
    ins = [x] + ([sv] if scale == "vec" else []) + ([bv] if bias == "vec" else [])

    def k(d, t, *vs):
        vs = list(vs)
        sc = vs.pop(0) if scale == "vec" else scale
        bi = vs.pop(0) if bias == "vec" else bias
        nisa.activation(dst=d, op=_opf(fn), data=t, bias=bi, scale=sc)

    got, = _run(k, ins, [((P, F), dout)])
    s = sv if scale == "vec" else np.float32(scale)
    b = bv if bias == "vec" else np.float32(0.0 if bias is None else bias)
    pre = (x * s + b).astype(np.float32)
    y = ACT[fn](pre.astype(np.float64)).astype(np.float32)
    exact = fn in ("copy", "relu", "square")
    if np.dtype(dout).kind == "f" and np.dtype(dout) == np.float32 and not exact:
        _check(got, y, dout, ulp=4)
    else:
        _check(got, _cast(y, dout), dout, bf16_ulp=0 if exact else 1)


# --------------------------------------------------------------------------------------------------
# iota / affine_select
# --------------------------------------------------------------------------------------------------

def _iota_ref(p, pattern, offset, cm):
    steps = [s for s, _ in pattern]
    nums = [n for _, n in pattern]
    grids = np.meshgrid(*[np.arange(n) for n in nums], indexing="ij")
    free = sum(g.astype(np.int64) * s for g, s in zip(grids, steps)).reshape(-1)
    return offset + np.arange(p, dtype=np.int64)[:, None] * cm + free[None, :]


IOTA = [([[1, F]], 0, 0, I32), ([[1, F]], 0, 1, F32), ([[4, 6], [1, 4]], 5, -24, I32),
        ([[-1, 2], [3, 3], [1, 4]], -7, 2, F32), ([[0, 3], [1, 8]], 100, 16, BF16),
        ([[2, 2], [-1, 2], [5, 3], [1, 2]], 3, -1, I32), ([[1, F]], 2**24 - 5, 1, F32)]


@pytest.mark.parametrize("pattern,offset,cm,dout", IOTA, ids=str)
def test_iota(pattern, offset, cm, dout):
    def k(d):
        nisa.iota(dst=d, pattern=pattern, offset=offset, channel_multiplier=cm)

    got, = _run(k, [], [((P, F), dout)])
    want = _iota_ref(P, pattern, offset, cm)
    _check(got, _cast(want.astype(np.float32), dout) if np.dtype(dout).kind == "f" else want.astype(dout), dout)


CMPS = ["equal", "not_equal", "greater", "greater_equal", "less", "less_equal"]
AS = ([(c, [[-1, F]], 0, 1, F32) for c in CMPS]
      + [("greater_equal", [[-1, 4], [1, 6]], 3, 2, BF16), ("less", [[2, 3], [-1, 8]], -5, 1, F32),
         ("equal", [[1, 4], [0, 6]], -2, -1, F32), ("not_equal", [[-1, F]], 4, 1, I32)])


@pytest.mark.parametrize("cmp,pattern,offset,cm,dout", AS, ids=str)
def test_affine_select(cmp, pattern, offset, cm, dout):
    x = _data(dout, 16, lo=-50, hi=50)
    fv = -9984.0

    def k(d, t):
        nisa.affine_select(dst=d, pattern=pattern, channel_multiplier=cm, on_true_tile=t, on_false_value=fv,
                           cmp_op=_opf(cmp), offset=offset)

    got, = _run(k, [x], [((P, F), dout)])
    v = _iota_ref(P, pattern, offset, cm).astype(np.float32)
    keep = ALU[cmp](v, np.float32(0)) != 0
    want = np.where(keep, x.astype(np.float32), np.float32(fv))
    _check(got, _cast(want, dout), dout)


# --------------------------------------------------------------------------------------------------
# selection / predication / shuffle
# --------------------------------------------------------------------------------------------------

SR = [(False, False, F32, np.uint8), (True, True, F32, np.uint8), (False, True, BF16, np.int16),
      (True, False, F32, np.uint16)]


@pytest.mark.parametrize("rev,vec,dtype,pdtype", SR, ids=str)
def test_select_reduce(rev, vec, dtype, pdtype):
    x = _data(dtype, 17)
    pred = (np.random.default_rng(18).integers(0, 3, (P, F))).astype(pdtype)
    pred[0] = 0
    fv = _data(F32, 19, (P, 1), -9, 9, edges=False)
    ins = [pred, x] + ([fv] if vec else [])

    def k(d, r, pr, t, *vs):
        nisa.select_reduce(dst=d, predicate=pr, on_true=t, on_false=vs[0] if vec else -2.5, reduce_res=r,
                           reduce_cmd=nisa.reduce_cmd.reset_reduce, reduce_op=nl.maximum, reverse_pred=rev)

    got, red = _run(k, ins, [((P, F), dtype), ((P, 1), F32)])
    p = (pred != 0) != rev
    want = np.where(p, x.astype(np.float32), fv if vec else np.float32(-2.5))
    _check(got, _cast(want, dtype), dtype)
    _check(red, want.max(axis=1, keepdims=True), F32, ulp=0)


RS = [("greater_equal", "less", 0, F32), ("greater", "less_equal", 5, F32), ("equal", "less", 0, BF16),
      ("less", "greater_equal", 3, F32)]


@pytest.mark.parametrize("c0,c1,start,dtype", RS, ids=str)
def test_range_select(c0, c1, start, dtype):
    x = _data(dtype, 20)
    b0 = np.random.default_rng(21).integers(0, F, (P, 1)).astype(F32)
    b1 = (b0 + np.random.default_rng(22).integers(0, 10, (P, 1))).astype(F32)

    def k(d, r, t, u, v):
        nisa.range_select(dst=d, on_true_tile=t, comp_op0=_opf(c0), comp_op1=_opf(c1), bound0=u, bound1=v,
                          reduce_cmd=nisa.reduce_cmd.reset_reduce, reduce_res=r, reduce_op=nl.maximum,
                          range_start=start)

    got, red = _run(k, [x, b0, b1], [((P, F), dtype), ((P, 1), F32)])
    idx = (start + np.arange(F, dtype=np.float32))[None, :]
    keep = (ALU[c0](idx, b0) != 0) & (ALU[c1](idx, b1) != 0)
    want = np.where(keep, x.astype(np.float32), FP32_MIN)
    _check(got, _cast(want, dtype), dtype)
    _check(red, want.max(axis=1, keepdims=True), F32, ulp=0)


TCP = [(F32, np.uint8, False, False), (F32, np.uint32, True, False), (BF16, np.uint16, False, False),
       (I32, np.uint8, True, False), (F32, F32, False, False), (F32, np.uint8, False, True)]


@pytest.mark.parametrize("dtype,pdtype,rev,scalar", TCP, ids=str)
def test_tensor_copy_predicated(dtype, pdtype, rev, scalar):
    src, old = _data(dtype, 23, lo=-99, hi=99), _data(dtype, 24, lo=-99, hi=99)
    pred = np.random.default_rng(25).integers(0, 2, (P, F)).astype(pdtype)
    if np.dtype(pdtype).kind == "f":
        pred = np.where(pred != 0, np.float32(-0.5), np.float32(0.0)).astype(pdtype)

    def k(d, o, s, pr):
        nisa.tensor_copy(dst=d, src=o)
        nisa.tensor_copy_predicated(dst=d, src=4.0 if scalar else s, predicate=pr, reverse_pred=rev)

    got, = _run(k, [old, src, pred], [((P, F), dtype)])
    s = np.full((P, F), 4.0, np.float32).astype(dtype) if scalar else src
    want = np.where((pred != 0) != rev, s, old)
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))


SHUF = [(32, 32, list(range(31, -1, -1))), (64, 64, [(i * 7) % 32 for i in range(32)]),
        (32, 32, [0] * 16 + [255] * 16), (1, 32, [0] * 32), (128, 128, [255, 3, 3, 0] * 8),
        (48, 48, list(range(1, 32)) + [0])]


@pytest.mark.parametrize("ps,pd,mask", SHUF, ids=lambda v: str(v)[:20])
def test_nc_stream_shuffle(ps, pd, mask):
    src = _data(F32, 26, (ps, 8))
    old = _data(F32, 27, (pd, 8))

    def k(d, o, s):
        nisa.tensor_copy(dst=d, src=o)
        nisa.nc_stream_shuffle(dst=d, src=s, shuffle_mask=mask)

    if ps == 48:  # quadrant 1 reads src rows 33..63 beyond P_src = 48: an error (nsim policy, §2.2)
        with pytest.raises(Exception, match="(?i)partition|row|shuffle"):
            _run(k, [old, src], [((pd, 8), F32)])
        return
    got, = _run(k, [old, src], [((pd, 8), F32)])
    want = old.copy()
    for q in range((max(ps, pd) + 31) // 32):
        for i, m in enumerate(mask):
            if m != 255 and q * 32 + i < pd:
                want[q * 32 + i] = src[q * 32 + m]
    np.testing.assert_array_equal(got, want)


# --------------------------------------------------------------------------------------------------
# tensor_tensor_scan
# --------------------------------------------------------------------------------------------------

SCAN = [("multiply", "add", False, False, False, F32), ("multiply", "add", False, False, True, F32),
        ("add", "maximum", True, False, True, F32), ("subtract", "multiply", True, True, False, F32),
        ("maximum", "subtract", False, True, True, F32), ("multiply", "add", False, False, True, BF16),
        ("add", "add", False, False, False, I32)]


@pytest.mark.parametrize("op0,op1,rev0,rev1,vec,dtype", SCAN, ids=str)
def test_tensor_tensor_scan(op0, op1, rev0, rev1, vec, dtype):
    a = _data(dtype, 28, lo=-1.2, hi=1.2) if dtype is not I32 else _data(dtype, 28, lo=-5, hi=5)
    b = _data(dtype, 29, lo=-1, hi=1) if dtype is not I32 else _data(dtype, 29, lo=-5, hi=5)
    init = _data(F32, 30, (P, 1), -2, 2, edges=False)
    ins = [a, b] + ([init] if vec else [])

    def k(d, x, y, *vs):
        nisa.tensor_tensor_scan(dst=d, data0=x, data1=y, initial=vs[0] if vec else 0.75, op0=_opf(op0),
                                op1=_opf(op1), reverse0=rev0, reverse1=rev1)

    got, = _run(k, ins, [((P, F), dtype)])
    s = (init[:, 0] if vec else np.full(P, 0.75, np.float32)).astype(np.float32)
    want = np.empty((P, F), np.float32)
    af, bf = a.astype(np.float32), b.astype(np.float32)
    for i in range(F):
        t = _alu(op0, af[:, i], s) if not rev0 else _alu(op0, s, af[:, i])
        s = _alu(op1, t, bf[:, i]) if not rev1 else _alu(op1, bf[:, i], t)
        want[:, i] = s
    _check(got, _cast(want, dtype), dtype)


# --------------------------------------------------------------------------------------------------
# max8 / nc_find_index8 / nc_match_replace8
# --------------------------------------------------------------------------------------------------

def _tied(dtype, seed):
    x = np.random.default_rng(seed).integers(-6, 7, (P, 20)).astype(np.float32)  # many ties
    x[0] = 3.0  # all equal
    x[1, :5] = [-0.0, 0.0, -0.0, 0.0, 9]
    return x.astype(dtype)


@pytest.mark.parametrize("dtype", [F32, BF16, I32], ids=lambda v: np.dtype(v).name)
def test_max8(dtype):
    x = _tied(dtype, 31)

    def k(d, t):
        nisa.max8(dst=d, src=t)

    got, = _run(k, [x], [((P, 8), dtype)])
    want = -np.sort(-x.astype(np.float32), axis=1, kind="stable")[:, :8]
    _check(got, _cast(want, dtype), dtype)


def _find8(data, vals):
    out = np.full(vals.shape, 0xFFFFFFFF, np.uint64)
    for p in range(data.shape[0]):
        taken = set()
        for i in range(8):
            for j in range(data.shape[1]):
                if j not in taken and np.float32(data[p, j]) == np.float32(vals[p, i]):
                    out[p, i] = j
                    taken.add(j)
                    break
    return out


@pytest.mark.parametrize("dtype,idt", [(F32, np.uint32), (BF16, np.uint32), (F32, np.uint16)], ids=str)
def test_nc_find_index8(dtype, idt):
    x = _tied(dtype, 32)
    vals = -np.sort(-x.astype(np.float32), axis=1)[:, :8].astype(dtype)
    vals[2, 7] = 100  # not found

    def k(d, t, v):
        nisa.nc_find_index8(dst=d, data=t, vals=v)

    got, = _run(k, [x, vals], [((P, 8), idt)])
    want = _find8(x, vals)
    want = np.where(want == 0xFFFFFFFF, np.iinfo(idt).max, want).astype(idt)
    _check(got, want, idt)


@pytest.mark.parametrize("dtype", [F32, BF16], ids=lambda v: np.dtype(v).name)
def test_nc_match_replace8(dtype):
    x = _tied(dtype, 33)
    vals = -np.sort(-x.astype(np.float32), axis=1)[:, :8].astype(dtype)
    imm = -1000.0

    def k(d, di, t, v):
        nisa.nc_match_replace8(dst=d, data=t, vals=v, imm=imm, dst_idx=di)

    got, idx = _run(k, [x, vals], [((P, 20), dtype), ((P, 8), np.uint32)])
    want = x.astype(np.float32).copy()
    widx = np.full((P, 8), 0xFFFFFFFF, np.uint32)
    for p in range(P):
        for i in range(7, -1, -1):
            hits = np.nonzero(want[p] == np.float32(vals[p, i]))[0]
            if len(hits):
                want[p, hits[0]] = imm
                widx[p, i] = hits[0]
    _check(got, _cast(want, dtype), dtype)
    _check(idx, widx, np.uint32)


# --------------------------------------------------------------------------------------------------
# precision edges: large int32 through the fp32 path, non-fp32 immediates, mixed input dtypes, in-place
# --------------------------------------------------------------------------------------------------

def _big_i32(seed):
    x = np.random.default_rng(seed).integers(-2**31, 2**31 - 1, (P, F), dtype=np.int64).astype(I32)
    x.flat[:6] = [16777217, -16777217, 2**31 - 1, -2**31, 33554435, 7]
    return x


@pytest.mark.parametrize("op0,s0,dout", [("add", 1.0, I32), ("multiply", 1.0, I32), ("add", 0.0, F32),
                                         ("subtract", 3.0, BF16)], ids=str)
def test_tensor_scalar_int32_fp32_path(op0, s0, dout):
    x = _big_i32(40)

    def k(d, t):
        nisa.tensor_scalar(dst=d, data=t, op0=_opf(op0), operand0=s0)

    got, = _run(k, [x], [((P, F), dout)])
    _check(got, _cast(_alu(op0, x.astype(np.float32), np.float32(s0)), dout), dout)


@pytest.mark.parametrize("s0,s1", [(0.1, 1 / 3), (1e-45, 3.4e38), (-2.5e-8, 7e20)], ids=str)
def test_tensor_scalar_nonrepresentable_immediates(s0, s1):
    x = _data(F32, 41)

    def k(d, t):
        nisa.tensor_scalar(dst=d, data=t, op0=nl.multiply, operand0=s0, op1=nl.add, operand1=s1)

    got, = _run(k, [x], [((P, F), F32)])
    _check(got, _alu("add", _alu("multiply", x, np.float32(s0)), np.float32(s1)), F32)


@pytest.mark.parametrize("vdt", [BF16, I32], ids=lambda v: np.dtype(v).name)
def test_tensor_scalar_vector_operand_dtype(vdt):
    x = _data(F32, 42)
    v = _data(vdt, 43, (P, 1), -4, 4, edges=False)

    def k(d, t, u):
        nisa.tensor_scalar(dst=d, data=t, op0=nl.subtract, operand0=u, reverse0=True)

    got, = _run(k, [x, v], [((P, F), F32)])
    _check(got, _alu("subtract", x, v.astype(np.float32), True), F32)


@pytest.mark.parametrize("op,da,db,dout", [("add", F32, BF16, F32), ("multiply", BF16, F32, BF16),
                                           ("add", I32, F32, F32), ("subtract", F32, I32, I32),
                                           ("maximum", I32, I32, F32), ("add", I32, I32, F32)], ids=str)
def test_tensor_tensor_mixed_dtypes(op, da, db, dout):
    x = _big_i32(44) if da is I32 else _data(da, 44, lo=-1e4, hi=1e4)
    y = _big_i32(45) if db is I32 else _data(db, 45, lo=-1e4, hi=1e4)

    def k(d, a, b):
        nisa.tensor_tensor(dst=d, data1=a, data2=b, op=_opf(op))

    got, = _run(k, [x, y], [((P, F), dout)])
    _check(got, _cast(_alu(op, x, y), dout), dout)


@pytest.mark.parametrize("op", ["maximum", "minimum", "equal", "greater"])
def test_tensor_tensor_int32_nonarith(op):
    """all-int32 max/min/compare: the spec routes all-int32 tensor_tensor to GpSimd (exact integers)."""
    x = _big_i32(46)
    y = x.copy()
    y.flat[::2] += 1  # differ only in the low bit: fp32 rounding would call many of these equal
    y.flat[1::4] -= 1

    def k(d, a, b):
        nisa.tensor_tensor(dst=d, data1=a, data2=b, op=_opf(op))

    got, = _run(k, [x, y], [((P, F), I32)])
    ref = {"maximum": np.maximum, "minimum": np.minimum, "equal": lambda a, b: (a == b).astype(I32),
           "greater": lambda a, b: (a > b).astype(I32)}[op](x, y).astype(I32)
    _check(got, ref, I32)


def test_affine_select_int32_same_dtype_exact():
    x = _big_i32(47)

    def k(d, t):
        nisa.affine_select(dst=d, pattern=[[-1, F]], channel_multiplier=1, on_true_tile=t, on_false_value=-5.0,
                           cmp_op=nl.greater_equal)

    got, = _run(k, [x], [((P, F), I32)])
    keep = (np.arange(P)[:, None] - np.arange(F)[None, :]) >= 0
    _check(got, np.where(keep, x, I32(-5)), I32)


def test_tensor_copy_predicated_int32_bit_exact():
    src, old = _big_i32(48), _big_i32(49)
    pred = np.random.default_rng(50).integers(0, 2, (P, F)).astype(np.uint8)

    def k(d, o, s, pr):
        nisa.tensor_copy(dst=d, src=o)
        nisa.tensor_copy_predicated(dst=d, src=s, predicate=pr)

    got, = _run(k, [old, src, pred], [((P, F), I32)])
    _check(got, np.where(pred != 0, src, old), I32)


@pytest.mark.parametrize("dtype", [F32, I32, BF16], ids=lambda v: np.dtype(v).name)
def test_nc_stream_shuffle_in_place(dtype):
    x = _big_i32(51)[:, :8].astype(dtype) if dtype is not BF16 else _data(BF16, 51, (P * 2, 8))[:P]
    x = np.concatenate([x, x[::-1]])  # 32 partitions
    mask = [(i + 5) % 32 for i in range(32)]

    def k(d, t):
        nisa.nc_stream_shuffle(dst=t, src=t, shuffle_mask=mask)
        nisa.tensor_copy(dst=d, src=t)

    got, = _run(k, [x], [((32, 8), dtype)])
    np.testing.assert_array_equal(got.view(np.uint8), x[mask].view(np.uint8))


@pytest.mark.parametrize("din,dout", [(I32, F32), (BF16, F32), (F32, I32)], ids=str)
def test_activation_dtypes(din, dout):
    x = _big_i32(52) if din is I32 else _data(din, 52, lo=-100, hi=100)
    b = _data(F32, 53, (P, 1), -2, 2, edges=False)

    def k(d, t, u):
        nisa.activation(dst=d, op=nl.copy, data=t, bias=u, scale=0.5)

    got, = _run(k, [x, b], [((P, F), dout)])
    _check(got, _cast((x.astype(np.float32) * np.float32(0.5) + b).astype(np.float32), dout), dout)


@pytest.mark.parametrize("dtype", [I32, np.uint32], ids=lambda v: np.dtype(v).name)
def test_tensor_copy_int32_to_float_rounding(dtype):
    x = np.random.default_rng(54).integers(0, 2**31 - 1, (P, F), dtype=np.int64).astype(dtype)
    x.flat[:4] = [16777217, 16777219, 2**31 - 1, 33554433]

    def k(d, t):
        nisa.tensor_copy(dst=d, src=t)

    got, = _run(k, [x], [((P, F), F32)])
    _check(got, x.astype(np.float32), F32, ulp=0)


# --------------------------------------------------------------------------------------------------
# engine choice, views, register chains, NaN
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("eng,din,dout,exact", [("vector", I32, I32, False), ("gpsimd", I32, I32, True),
                                                ("scalar", F32, BF16, False), ("gpsimd", BF16, F32, False),
                                                ("scalar", I32, F32, False)], ids=str)
def test_tensor_copy_engines(eng, din, dout, exact):
    x = _big_i32(60) if din is I32 else _data(din, 60, lo=-1e3, hi=1e3)

    def k(d, t):
        nisa.tensor_copy(dst=d, src=t, engine=getattr(nisa.engine, eng))

    got, = _run(k, [x], [((P, F), dout)])
    if np.dtype(din) == np.dtype(dout) and eng != "scalar":
        np.testing.assert_array_equal(got.view(np.uint8), x.view(np.uint8))  # Vector/GpSimd same-dtype: bit-exact
    else:
        _check(got, _cast(x.astype(np.float32), dout), dout)


def test_tensor_tensor_int32_engine_vector_fp32_path():
    x, y = _big_i32(61), _big_i32(62)

    def k(d, a, b):
        nisa.tensor_tensor(dst=d, data1=a, data2=b, op=nl.add, engine=nisa.engine.vector)

    got, = _run(k, [x, y], [((P, F), I32)])
    _check(got, _cast(_alu("add", x, y), I32), I32)


@pytest.mark.parametrize("op0,op1,eng", [("multiply", "add", "scalar"), ("add", None, "scalar"),
                                         ("rsqrt", None, "gpsimd"), ("multiply", None, "scalar")], ids=str)
def test_tensor_scalar_engines(op0, op1, eng):
    x = _data(F32, 63, lo=0.1, hi=9, edges=False)

    def k(d, t):
        nisa.tensor_scalar(dst=d, data=t, op0=_opf(op0), operand0=None if op0 == "rsqrt" else 1.75,
                           op1=_opf(op1) if op1 else None, operand1=-0.5 if op1 else None,
                           engine=getattr(nisa.engine, eng))

    got, = _run(k, [x], [((P, F), F32)])
    want = _alu(op0, x, np.float32(1.75))
    if op1:
        want = _alu(op1, want, np.float32(-0.5))
    _check(got, want, F32)


def test_elementwise_views_pair_row_major():
    """Free shapes need not match: elements pair in row-major order; strided / transposed source views."""
    x = _data(F32, 64, (P, 4, 6))
    y = _data(F32, 65, (P, 6, 4))

    def k(d, a, b):
        # d (P, 24) <- a (P, 4, 6) + b viewed transposed (P, 4, 6) via rearrange-free ap
        nisa.tensor_tensor(dst=d.reshape((P, 2, 12)), data1=a, data2=b, op=nl.subtract)

    got, = _run(k, [x, y], [((P, F), F32)])
    _check(got, _alu("subtract", x.reshape(P, F), y.reshape(P, F)), F32)


def test_select_reduce_register_chain():
    """reset_reduce on the first call, reduce on the second: reduce_res = max over both rows."""
    a, b = _data(F32, 66), _data(F32, 67)
    pa = np.random.default_rng(68).integers(0, 2, (P, F)).astype(np.uint8)

    def k(d, r, x, y, pr):
        nisa.select_reduce(dst=d, predicate=pr, on_true=x, on_false=-100.0, reduce_cmd=nisa.reduce_cmd.reset_reduce)
        nisa.select_reduce(dst=d, predicate=pr, on_true=y, on_false=-100.0, reduce_res=r,
                           reduce_cmd=nisa.reduce_cmd.reduce)

    got, red = _run(k, [a, b, pa], [((P, F), F32), ((P, 1), F32)])
    wa = np.where(pa != 0, a, np.float32(-100))
    wb = np.where(pa != 0, b, np.float32(-100))
    _check(got, wb, F32, ulp=0)
    _check(red, np.maximum(wa.max(1), wb.max(1))[:, None], F32, ulp=0)


def test_tensor_tensor_scan_chain_last_column():
    a, b = _data(F32, 69, (P, 2 * F), -1, 1), _data(F32, 70, (P, 2 * F), -1, 1)

    def k(d, x, y):
        nisa.tensor_tensor_scan(dst=d[:, :F], data0=x[:, :F], data1=y[:, :F], initial=0.0, op0=nl.multiply,
                                op1=nl.add)
        nisa.tensor_tensor_scan(dst=d[:, F:], data0=x[:, F:], data1=y[:, F:], initial=d[:, F - 1:F],
                                op0=nl.multiply, op1=nl.add)

    got, = _run(k, [a, b], [((P, 2 * F), F32)])
    s = np.zeros(P, np.float32)
    want = np.empty((P, 2 * F), np.float32)
    for i in range(2 * F):
        s = (a[:, i] * s + b[:, i]).astype(np.float32)
        want[:, i] = s
    _check(got, want, F32)


@pytest.mark.parametrize("dt_true,dout", [(BF16, F32), (F32, BF16), (F32, I32)], ids=str)
def test_affine_select_dtype_cast(dt_true, dout):
    x = _data(dt_true, 71, lo=-300, hi=300)

    def k(d, t):
        nisa.affine_select(dst=d, pattern=[[1, F]], channel_multiplier=-1, on_true_tile=t,
                           on_false_value=float(FP32_MIN), cmp_op=nl.less)

    got, = _run(k, [x], [((P, F), dout)])
    keep = (np.arange(F)[None, :] - np.arange(P)[:, None]) < 0
    _check(got, _cast(np.where(keep, x.astype(np.float32), FP32_MIN), dout), dout)


FP8 = [getattr(ml_dtypes, n) for n in ("float8_e4m3", "float8_e4m3fn", "float8_e5m2")]
FP8_EDGE = np.array([0.0, -0.0, 240.0, 248.0, 250.0, 448.0, 464.0, 500.0, 57344.0, 61440.0, 70000.0, np.inf,
                     -np.inf, np.nan, 2.0 ** -9, 2.0 ** -10, 3 * 2.0 ** -11, 2.0 ** -16, 2.0 ** -17, 1.0625,
                     1.1875, -3.3, 0.3, 1e-40], np.float32)


@pytest.mark.parametrize("dout", FP8 + [np.float16, BF16], ids=lambda v: np.dtype(v).name)
def test_tensor_copy_narrow_floats(dout):
    x = np.tile(FP8_EDGE, (P, 1))
    x[1:] = _data(F32, 72, (P - 1, F), -600, 600)

    def k(d, t):
        nisa.tensor_copy(dst=d, src=t)

    got, = _run(k, [x], [((P, F), dout)])
    _check(got, _cast(x, dout), dout)


@pytest.mark.parametrize("din", FP8, ids=lambda v: np.dtype(v).name)
def test_tensor_copy_fp8_widen(din):
    x = np.arange(256, dtype=np.uint8).reshape(16, 16).view(din)

    def k(d, t):
        nisa.tensor_copy(dst=d, src=t)

    got, = _run(k, [x], [((16, 16), F32)])
    _check(got, x.astype(np.float32), F32, ulp=0)


@pytest.mark.parametrize("op", ["divide", "maximum", "minimum", "multiply", "greater", "equal", "not_equal"])
def test_tensor_tensor_special_values(op):
    sv = np.array([0.0, -0.0, np.inf, -np.inf, 1.0, -1.0, 3e38, 1e-45], np.float32)
    x = np.repeat(sv, 8)[None, :].repeat(P, 0)
    y = np.tile(sv, 8)[None, :].repeat(P, 0)

    def k(d, a, b):
        nisa.tensor_tensor(dst=d, data1=a, data2=b, op=_opf(op))

    got, = _run(k, [x, y], [((P, 64), F32)])
    want = _alu(op, x, y)
    _check(got, want, F32, ulp=0)
    if op in ("multiply", "divide"):  # signed zeros (max/min of +-0: which zero is unspecified, not checked)
        z = (want == 0) & (got == 0)
        np.testing.assert_array_equal(np.signbit(got[z]), np.signbit(want[z]))


# --------------------------------------------------------------------------------------------------
# more op codes: numpy aliases, unary ALU ops, power, activation functions, narrow-int iota
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("alias,op", [(np.add, "add"), (np.subtract, "subtract"), (np.greater_equal, "greater_equal"),
                                      (np.maximum, "maximum"), (np.amin, "minimum"), (np.true_divide, "divide"),
                                      (np.not_equal, "not_equal"), (np.logical_xor, "logical_xor")],
                         ids=lambda v: getattr(v, "__name__", v))
def test_numpy_alias_opcodes(alias, op):
    x, y = _data(F32, 80), _data(F32, 81)
    y[y == 0] = 2

    def k(d, e, a, b):
        nisa.tensor_tensor(dst=d, data1=a, data2=b, op=alias)
        nisa.tensor_scalar(dst=e, data=a, op0=alias, operand0=0.5, reverse0=True)

    got, got2 = _run(k, [x, y], [((P, F), F32), ((P, F), F32)])
    _check(got, _alu(op, x, y), F32)
    _check(got2, _alu(op, x, np.float32(0.5), True), F32)


@pytest.mark.parametrize("op,operand", [("abs", 0), ("reciprocal", None), ("rsqrt", None), ("square", 0),
                                        ("relu", None)], ids=str)
def test_tensor_scalar_unary(op, operand):
    x = _data(F32, 82, lo=0.01, hi=50, edges=False) if op == "rsqrt" else _data(F32, 82)
    if op == "reciprocal":
        x[x == 0] = 4

    def k(d, t):
        nisa.tensor_scalar(dst=d, data=t, op0=_opf(op), operand0=operand, op1=nl.multiply, operand1=2.0)

    got, = _run(k, [x], [((P, F), F32)])
    _check(got, _alu("multiply", _alu(op, x, 0.0), np.float32(2.0)), F32)


def test_tensor_scalar_invert():
    x = _big_i32(83)

    def k(d, t):
        nisa.tensor_scalar(dst=d, data=t, op0=nl.invert, operand0=None, op1=nl.bitwise_and, operand1=0x7FFF)

    got, = _run(k, [x], [((P, F), I32)])
    _check(got, np.bitwise_and(np.invert(x), 0x7FFF), I32)


def test_tensor_tensor_power():
    x = _data(F32, 84, lo=0.1, hi=4, edges=False)
    y = _data(F32, 85, lo=-2, hi=3, edges=False)
    y.flat[:3] = [0.0, 1.0, 2.0]

    def k(d, a, b):
        nisa.tensor_tensor(dst=d, data1=a, data2=b, op=nl.power)

    got, = _run(k, [x, y], [((P, F), F32)])
    _check(got, np.power(x.astype(np.float64), y.astype(np.float64)).astype(np.float32), F32, ulp=2)


def _erf(x):
    import math
    return np.vectorize(math.erf)(x)


ACT2 = {"log": (np.log, 0.05, 40), "sqrt": (np.sqrt, 0.0, 40), "rsqrt": (lambda x: 1 / np.sqrt(x), 0.05, 40),
        "reciprocal": (lambda x: 1 / x, 0.1, 40), "sign": (np.sign, -3, 3), "abs": (np.abs, -3, 3),
        "erf": (_erf, -3, 3), "gelu": (lambda x: 0.5 * x * (1 + _erf(x / np.sqrt(2))), -5, 5),
        "softplus": (lambda x: np.logaddexp(0, x), -20, 20), "arctan": (np.arctan, -1.5, 1.5),
        "sin": (np.sin, -3.1, 3.1), "mish": (lambda x: x * np.tanh(np.logaddexp(0, x)), -8, 8),
        "erf_dx": (lambda x: 2 / np.sqrt(np.pi) * np.exp(-x * x), -3, 3),
        "gelu_apprx_sigmoid": (lambda x: x / (1 + np.exp(-1.702 * x)), -6, 6)}


@pytest.mark.parametrize("fn", sorted(ACT2))
def test_activation_functions(fn):
    f, lo, hi = ACT2[fn]
    x = _data(F32, 86, lo=lo, hi=hi, edges=False)
    b = _data(F32, 87, (P, 1), 0, 0.01, edges=False)

    def k(d, t, u):
        nisa.activation(dst=d, op=_opf(fn), data=t, bias=u, scale=1.0)

    got, = _run(k, [x, b], [((P, F), F32)])
    pre = (x + b).astype(np.float32)
    _check(got, f(pre.astype(np.float64)).astype(np.float32), F32, ulp=4)


@pytest.mark.parametrize("dout,offset,cm", [(np.int8, -140, 3), (np.uint8, -5, 20), (np.int16, 32760, 1),
                                            (np.uint16, -1, 4096), (np.uint32, -3, 1)], ids=str)
def test_iota_narrow_ints(dout, offset, cm):
    def k(d):
        nisa.iota(dst=d, pattern=[[1, F]], offset=offset, channel_multiplier=cm)

    got, = _run(k, [], [((P, F), dout)])
    want = _iota_ref(P, [[1, F]], offset, cm)
    _check(got, want.astype(np.int32).astype(dout), dout)  # int -> int: two's-complement wrap (numpy)


# --------------------------------------------------------------------------------------------------
# PSUM operands, stride-0 / strided views, uint32, mixed-dtype selection inputs
# --------------------------------------------------------------------------------------------------

def test_tensor_scalar_psum_vector_and_dst():
    x = _data(F32, 90)
    v = _data(F32, 91, (P, 1), -3, 3, edges=False)

    def k(d, t, u):
        pv = nl.ndarray((P, 1), F32, buffer=nl.psum)
        nisa.tensor_copy(dst=pv, src=u)
        pd = nl.ndarray((P, F), F32, buffer=nl.psum)
        nisa.tensor_scalar(dst=pd, data=t, op0=nl.multiply, operand0=pv, op1=nl.add, operand1=pv)
        nisa.tensor_copy(dst=d, src=pd)

    got, = _run(k, [x, v], [((P, F), F32)])
    _check(got, _alu("add", _alu("multiply", x, v), v), F32)


def test_tensor_tensor_stride0_broadcast_and_strided_dst():
    x = _data(F32, 92, (P, F))
    v = _data(F32, 93, (P, 1), edges=False)

    def k(d, a, b):
        nisa.memset(dst=d, value=7.0)
        nisa.tensor_tensor(dst=d[:, ::2], data1=a[:, 1::2], data2=b.broadcast(1, F // 2), op=nl.multiply)

    got, = _run(k, [x, v], [((P, F), F32)])
    want = np.full((P, F), 7.0, np.float32)
    want[:, ::2] = x[:, 1::2] * v
    _check(got, want, F32, ulp=0)


@pytest.mark.parametrize("op", ["add", "multiply", "bitwise_xor", "right_shift"])
def test_tensor_tensor_uint32(op):
    rng = np.random.default_rng(94)
    x = rng.integers(0, 2**32 - 1, (P, F), dtype=np.uint64).astype(np.uint32)
    y = (rng.integers(0, 31, (P, F)) if "shift" in op else rng.integers(0, 2**32 - 1, (P, F), dtype=np.uint64)
         ).astype(np.uint32)

    def k(d, a, b):
        nisa.tensor_tensor(dst=d, data1=a, data2=b, op=_opf(op))

    got, = _run(k, [x, y], [((P, F), np.uint32)])
    ref = {"add": lambda a, b: (a.astype(np.uint64) + b).astype(np.uint32),
           "multiply": lambda a, b: (a.astype(np.uint64) * b).astype(np.uint32),
           "bitwise_xor": np.bitwise_xor, "right_shift": np.right_shift}[op](x, y)
    _check(got, ref, np.uint32)


def test_max8_find_index8_mixed_dtypes():
    x = _tied(BF16, 95)

    def k(d, i, t):
        nisa.max8(dst=d, src=t)
        nisa.nc_find_index8(dst=i, data=t, vals=d)

    got, idx = _run(k, [x], [((P, 8), F32), ((P, 8), np.uint32)])
    want = -np.sort(-x.astype(np.float32), axis=1)[:, :8]
    _check(got, want, F32, ulp=0)
    _check(idx, _find8(x, want).astype(np.uint32), np.uint32)


def test_max8_large_row_with_inf():
    x = _data(F32, 96, (4, 16384), -1e6, 1e6, edges=False)
    x[0, 100] = np.inf
    x[1, :] = -np.inf
    x[2, 5:13] = 3e38

    def k(d, t):
        nisa.max8(dst=d, src=t)

    got, = _run(k, [x], [((4, 8), F32)])
    _check(got, -np.sort(-x, axis=1)[:, :8], F32, ulp=0)


def test_select_reduce_bf16_on_true_fp32_dst():
    x = _data(BF16, 97)
    pred = np.random.default_rng(98).integers(0, 2, (P, F)).astype(np.uint8)

    def k(d, pr, t):
        nisa.select_reduce(dst=d, predicate=pr, on_true=t, on_false=0.1, reverse_pred=True)

    got, = _run(k, [pred, x], [((P, F), F32)])
    _check(got, np.where(pred == 0, x.astype(np.float32), np.float32(0.1)), F32, ulp=0)


def test_range_select_scalar_bounds_idle():
    x = _data(F32, 99)

    def k(d, t):
        nisa.range_select(dst=d, on_true_tile=t, comp_op0=nl.greater_equal, comp_op1=nl.less, bound0=3.0,
                          bound1=11.0, reduce_cmd=nisa.reduce_cmd.idle, range_start=2)

    got, = _run(k, [x], [((P, F), F32)])
    idx = 2 + np.arange(F)
    _check(got, np.where((idx >= 3) & (idx < 11), x, FP32_MIN), F32, ulp=0)


def test_tensor_copy_predicated_float_predicate_signed_zero_nan():
    src, old = _data(F32, 100), _data(F32, 101)
    pred = np.zeros((P, F), np.float32)
    pred[:, 0::4], pred[:, 1::4], pred[:, 2::4] = -0.0, np.nan, 1e-45

    def k(d, o, s, pr):
        nisa.tensor_copy(dst=d, src=o)
        nisa.tensor_copy_predicated(dst=d, src=s, predicate=pr)

    got, = _run(k, [old, src, pred], [((P, F), F32)])
    np.testing.assert_array_equal(got, np.where(pred != 0, src, old))  # -0 false, NaN / subnormal true


@pytest.mark.parametrize("op,dout", [("greater", I32), ("not_equal", BF16), ("less_equal", np.uint8)], ids=str)
def test_tensor_scalar_compare_dst_dtypes(op, dout):
    x = _data(F32, 102)

    def k(d, t):
        nisa.tensor_scalar(dst=d, data=t, op0=_opf(op), operand0=0.5, op1=nl.multiply, operand1=3.0)

    got, = _run(k, [x], [((P, F), dout)])
    _check(got, _cast(_alu("multiply", _alu(op, x, np.float32(0.5)), np.float32(3.0)), dout), dout)
