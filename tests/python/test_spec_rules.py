"""Rules of nki-api.md that a conformance audit (2026-12-05) found nsim not following: PSUM accumulation (Beta-1
``p[...] = matmul`` then ``p += matmul``; the new dialect's per-element ``accumulate=None`` flag), dtype and operand
rules of the ISA (bit-vector ops on floats, tensor_scalar's op pairs and unary operands, reduction operators, the
activation scale's dtype), Beta-1 indexing (a 1-D arange as an index, assignment into an arange, a non-affine mask,
nl.load from SBUF) and view attributes (``strides``, ``offset``, an HBM view indexed by ints on every dim)."""
import numpy as np
import pytest

from conftest import require_core

_core, ml_dtypes = require_core()

import nsim  # noqa: E402
from nsim import _errors, nki  # noqa: E402
import nsim.nki.isa as nisa  # noqa: E402
import nsim.nki.language as nl  # noqa: E402

A = np.random.default_rng(0).standard_normal((128, 64)).astype(np.float32)
B = np.random.default_rng(3).standard_normal((128, 32)).astype(np.float32)
REF = A.T @ B  # (64, 32)


def _code(name):
    return _errors.code(name)


# --------------------------------------------------------------------------------------------------
# PSUM accumulation
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("form", ["nisa", "nl_matmul", "partial"])
def test_beta1_assign_then_iadd_accumulates(b1, form):
    """Spec 2.1 nc_matmul: "Beta-1 ``+=`` always adds to the current contents". ``p[...] = nc_matmul(..)`` wrote p,
    so the ``+=`` after it adds (before the fix the tile still counted as unwritten and the second matmul
    overwrote it: the result was REF, not 2 REF)."""
    bnki, bnl, bnisa = b1

    def kern(a_in, b_in):
        a = bnl.load(a_in)
        b = bnl.load(b_in)
        p = bnl.ndarray((64, 32), bnl.float32, buffer=bnl.psum)
        if form == "nl_matmul":
            p[...] = bnl.matmul(a, b, transpose_x=True)
            p += bnl.matmul(a, b, transpose_x=True)
        elif form == "partial":
            p[...] = bnisa.nc_matmul(a, b)
            p[:, 0:16] += bnisa.nc_matmul(a, b[:, 0:16])
        else:
            p[...] = bnisa.nc_matmul(a, b)
            p += bnisa.nc_matmul(a, b)
        o = bnl.ndarray((64, 32), bnl.float32, buffer=bnl.shared_hbm)
        bnl.store(o, p)
        return o

    want = 2 * REF
    if form == "partial":
        want = REF.copy()
        want[:, :16] *= 2
    np.testing.assert_allclose(bnki.simulate_kernel(kern, A, B), want, rtol=1e-4, atol=1e-4)


def _ld(x):
    t = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    return t


def _out(p):
    u = nl.ndarray(p.shape, nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=u, src=p)
    o = nl.ndarray(p.shape, nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=o, src=u)
    return o


@nki.jit
def _two_halves_then_whole(a_in, b_in):
    a, b = _ld(a_in), _ld(b_in)
    p = nl.ndarray((64, 32), nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=p[:, 0:16], stationary=a, moving=b[:, 0:16])
    nisa.nc_matmul(dst=p[:, 16:32], stationary=a, moving=b[:, 16:32])
    nisa.nc_matmul(dst=p, stationary=a, moving=b)  # every element's group is open: accumulates
    return _out(p)


@nki.jit
def _read_half_then_other_half(a_in, b_in):
    a, b = _ld(a_in), _ld(b_in)
    p = nl.ndarray((64, 32), nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=p, stationary=a, moving=b)
    u = nl.ndarray((64, 16), nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=u, src=p[:, 0:16])  # ends the group of columns 0:16 only
    nisa.nc_matmul(dst=p[:, 0:16], stationary=a, moving=b[:, 0:16])  # closed: overwrites
    nisa.nc_matmul(dst=p[:, 16:32], stationary=a, moving=b[:, 16:32])  # still open: accumulates
    return _out(p)


@nki.jit
def _mixed(a_in, b_in):
    a, b = _ld(a_in), _ld(b_in)
    p = nl.ndarray((64, 32), nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=p[:, 0:16], stationary=a, moving=b[:, 0:16])
    nisa.nc_matmul(dst=p, stationary=a, moving=b)  # columns 0:16 open, 16:32 not
    return _out(p)


def test_accumulate_none_is_per_element():
    """Spec 2.1: a per-element open-group flag; ``accumulate=None`` overwrites where it is clear and accumulates
    where it is set, and an access other than a matmul clears it on the elements it touches."""
    np.testing.assert_allclose(_two_halves_then_whole(A, B), 2 * REF, rtol=1e-4, atol=1e-4)
    want = REF.copy()
    want[:, 16:] *= 2
    np.testing.assert_allclose(_read_half_then_other_half(A, B), want, rtol=1e-4, atol=1e-4)
    # both kinds of element under one matmul: one IR instruction cannot do both; a clear error instead of wrong
    # numbers (before: the whole region was overwritten)
    with pytest.raises(nsim.NotSupportedError, match="accumulate=True or accumulate=False"):
        _mixed(A, B)


# --------------------------------------------------------------------------------------------------
# ISA dtype and operand rules
# --------------------------------------------------------------------------------------------------


def _elementwise(op_call, dtype=np.float32):
    @nki.jit
    def kern(x):
        t = _ld(x)
        u = nl.ndarray(t.shape, t.dtype, buffer=nl.sbuf)
        op_call(u, t)
        o = nl.ndarray(t.shape, t.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=o, src=u)
        return o
    return kern


def test_bitvec_ops_need_integers():
    """Spec 2.0 / 4.3: bit-vector ops on floats are a validation error (before: the floats were truncated to
    integers and ANDed); on integers they work on the bit patterns."""
    x = np.array([[1.5, 2.0, 3.0, 0.5]] * 128, np.float32)
    band = _elementwise(lambda u, t: nisa.tensor_tensor(dst=u, data1=t, data2=t, op=nl.bitwise_and))
    with pytest.raises(nsim.OperandError, match="integer") as e:
        band(x)
    assert e.value.code == _code("BadDtype") and isinstance(e.value, nisa.NkiValidationError)
    shl = _elementwise(lambda u, t: nisa.tensor_scalar(dst=u, data=t, op0=nl.left_shift, operand0=1))
    with pytest.raises(nsim.OperandError, match="integer"):
        shl(x)
    xi = np.arange(128 * 4, dtype=np.int32).reshape(128, 4)
    np.testing.assert_array_equal(band(xi), xi & xi)
    np.testing.assert_array_equal(shl(xi), xi << 1)


def test_tensor_scalar_operand_rules():
    """Spec 2.1 tensor_scalar: "op0 and op1 must both be arithmetic or both bit-vector"; unary op codes ignore their
    operand, "which must be None or 0"."""
    xi = np.arange(128 * 4, dtype=np.int32).reshape(128, 4)
    mixed = _elementwise(lambda u, t: nisa.tensor_scalar(dst=u, data=t, op0=nl.add, operand0=1,
                                                         op1=nl.bitwise_and, operand1=3))
    with pytest.raises(nsim.OperandError, match="both be arithmetic or both bit-vector") as e:
        mixed(xi)
    assert e.value.code == _code("BadImmediate")
    x = np.full((128, 4), -2.0, np.float32)
    bad = _elementwise(lambda u, t: nisa.tensor_scalar(dst=u, data=t, op0=nl.abs, operand0=3.0))
    with pytest.raises(nsim.OperandError, match="must be None or 0"):
        bad(x)
    ok = _elementwise(lambda u, t: nisa.tensor_scalar(dst=u, data=t, op0=nl.abs, operand0=0.0))
    np.testing.assert_array_equal(ok(x), np.abs(x))


def test_tensor_reduce_takes_reduction_operators_only():
    """Spec 2.1 tensor_reduce "Legal ops" (power is not one, §3.5); before, a left fold of power was computed."""
    @nki.jit
    def kern(x):
        t = _ld(x)
        r = nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=r, op=nl.power, data=t, axis=1)
        o = nl.ndarray((128, 1), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=o, src=r)
        return o

    with pytest.raises(nsim.OperandError, match="not a reduction operator"):
        kern(np.ones((128, 4), np.float32))


def test_activation_scale_vector_is_fp32_in_beta1(b1):
    """Spec 2.1 activation: scale is a compile-time float or a (P,1) fp32 vector; the Beta-1 compiler rejects another
    dtype (err_activation_scale_invalid_type). The new dialect converts it (the NKI tutorials' Mamba passes bf16)."""
    bnki, bnl, bnisa = b1

    def kern(x_in, s_in):
        x = bnl.load(x_in)
        s = bnl.load(s_in)
        y = bnisa.activation(op=bnl.copy, data=x, scale=s)
        o = bnl.ndarray(x_in.shape, bnl.float32, buffer=bnl.shared_hbm)
        bnl.store(o, y)
        return o

    x = np.random.default_rng(1).standard_normal((128, 8)).astype(np.float32)
    s = np.linspace(0.5, 2.0, 128, dtype=np.float32).reshape(128, 1)
    np.testing.assert_allclose(bnki.simulate_kernel(kern, x, s), x * s, rtol=1e-6)
    with pytest.raises(nsim.OperandError, match="err_activation_scale_invalid_type"):
        bnki.simulate_kernel(kern, x, s.astype(ml_dtypes.bfloat16))

    @nki.jit
    def new(x_in, s_in):
        t, sv = _ld(x_in), _ld(s_in)
        u = nl.ndarray(t.shape, nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=u, op=nl.copy, data=t, scale=sv)
        o = nl.ndarray(t.shape, nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=o, src=u)
        return o

    sb = s.astype(ml_dtypes.bfloat16)
    np.testing.assert_allclose(new(x, sb), x * sb.astype(np.float32), rtol=1e-6)


# --------------------------------------------------------------------------------------------------
# Beta-1 indexing and buffers
# --------------------------------------------------------------------------------------------------


def test_beta1_load_and_store_take_hbm(b1):
    """Spec 2.0's example of err_unsupported_memory: "Expected operand 'src' of 'load' to be in address space
    'hbm', but got a tile in 'sbuf'"."""
    bnki, bnl, _bnisa = b1

    def load_sbuf(a_in):
        t = bnl.load(a_in)
        u = bnl.load(t)
        o = bnl.ndarray(a_in.shape, a_in.dtype, buffer=bnl.shared_hbm)
        bnl.store(o, u)
        return o

    def store_sbuf(a_in):
        t = bnl.load(a_in)
        u = bnl.ndarray(a_in.shape, a_in.dtype, buffer=bnl.sbuf)
        bnl.store(u, t)
        return a_in

    for kern, side in ((load_sbuf, "'src' of 'load'"), (store_sbuf, "'dst' of 'store'")):
        with pytest.raises(nsim.OperandError, match=side) as e:
            bnki.simulate_kernel(kern, A)
        assert e.value.code == _code("BadBuffer")


def test_beta1_index_expression_rules(b1):
    """Spec 3.8: a 1-D nl.arange must get a 2-D shape before indexing (err_1d_arange_not_supported); index
    expressions cannot be assigned into (err_cannot_assign_to_index) and masks are affine
    (err_unsupported_expression_in_mask) -- before, the 1-D index loaded a transposed (96,) tile and the other two
    were Python TypeErrors."""
    bnki, bnl, _bnisa = b1

    def one_d(a_in):
        t = bnl.load(a_in[5, bnl.arange(64)])
        o = bnl.ndarray(t.shape, a_in.dtype, buffer=bnl.shared_hbm)
        bnl.store(o, t)
        return o

    def assign(a_in):
        ix = bnl.arange(128)[:, None]
        ix[0] = 3
        return a_in

    def modulo(a_in):
        ix = bnl.arange(128)[:, None]
        iy = bnl.arange(64)[None, :]
        t = bnl.load(a_in[ix, iy], mask=(ix % 4 == 0))
        o = bnl.ndarray(t.shape, a_in.dtype, buffer=bnl.shared_hbm)
        bnl.store(o, t)
        return o

    for kern, code, text in ((one_d, "BadSubscript", "err_1d_arange_not_supported"),
                             (assign, "ItemAssignment", "err_cannot_assign_to_index"),
                             (modulo, "BadIndex", "err_unsupported_expression_in_mask")):
        with pytest.raises(nsim.KernelError, match=text) as e:
            bnki.simulate_kernel(kern, A)
        assert e.value.code == _code(code)
    # the 2-D form loads the row as a (1, 64) tile
    def two_d(a_in):
        t = bnl.load(a_in[5, bnl.arange(64)[None, :]])
        o = bnl.ndarray(t.shape, a_in.dtype, buffer=bnl.shared_hbm)
        bnl.store(o, t)
        return o
    np.testing.assert_array_equal(bnki.simulate_kernel(two_d, A), A[5:6, :])


# --------------------------------------------------------------------------------------------------
# View attributes
# --------------------------------------------------------------------------------------------------


def test_view_strides_offset_and_int_indexed_hbm_shape():
    """Spec 3.9: a view's ``strides`` and ``offset`` (elements); spec 3.8: HBM views drop int-indexed dims but stay
    >= 1-D (``b[1, 2, 3]`` of a 3-D tensor is (1,))."""
    seen = {}

    @nki.jit
    def kern(a, b):
        t = nl.ndarray((128, 4, 16), nl.float32, buffer=nl.sbuf)
        s = t[:, 1:3, ::2]
        seen["sbuf"] = (s.strides, s.offset, s.get_pattern())
        h = a[2:6, 8:40:4]
        seen["hbm"] = (h.strides, h.offset)
        seen["ints"] = (tuple(b[1, 2, 3].shape), tuple(b[1, 2].shape))
        nisa.dma_copy(dst=t[:, 0, 0:1], src=b[1, 2:130:1, 3])  # (128,) rows of one element each
        o = nl.ndarray((128, 1), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=o, src=t[:, 0, 0:1])
        return o

    bt = np.random.default_rng(2).standard_normal((3, 130, 6)).astype(np.float32)
    out = kern(A, bt)
    assert seen["sbuf"] == ((64, 16, 2), 16, [[64, 128], [16, 2], [2, 8]])
    assert seen["hbm"] == ((64, 4), 2 * 64 + 8)
    assert seen["ints"] == ((1,), (6,))
    np.testing.assert_array_equal(out[:, 0], bt[1, 2:130, 3])


def test_hbm_tensor_with_an_initial_value(b1):
    """Spec 1.6: ``nl.full(..., buffer=nl.shared_hbm)`` is rejected by the 2.26 compiler, which nsim reports in
    strict only: otherwise it warns (NkiWarning) and fills the tensor (by DMA from a filled SBUF tile). Before, an
    E446 error in every mode. A ragged size (300 x 70 is not a multiple of 128 partitions) in both dialects."""
    bnki, bnl, _bnisa = b1

    def beta1(a_in):
        out = bnl.full((300, 70), 2.5, dtype=bnl.float32, buffer=bnl.shared_hbm)
        bnl.store(out[0:128, :], bnl.load(a_in))
        return out

    a = np.ones((128, 70), np.float32)
    with pytest.warns(nsim.tracer.NkiWarning, match="err_hbm_tensor_with_init_value_not_supported"):
        got = bnki.simulate_kernel(beta1, a)
    want = np.full((300, 70), 2.5, np.float32)
    want[:128] = 1.0
    np.testing.assert_array_equal(got, want)

    @nki.jit
    def new(a_in):
        return nl.zeros((5, 7, 3), nl.int32, buffer=nl.shared_hbm)

    with pytest.warns(nsim.tracer.NkiWarning):
        np.testing.assert_array_equal(new(a), np.zeros((5, 7, 3), np.int32))


def test_start_partition_rule_is_reported():
    """Spec 2.0: a view of n partitions starts at 0 (n > 64), 0 or 64 (32 < n <= 64) or a multiple of 32 (n <= 32);
    "nsim: warn (error in strict) when a view violates it" -- the sanitizer's NSIM-W509, on the kernel's line. The
    numbers are still computed; a DMA may start anywhere."""
    def make(p0, n):
        @nki.jit
        def kern(x):
            t = _ld(x)
            u = nl.ndarray((128, 8), nl.float32, buffer=nl.sbuf)
            nisa.memset(dst=u, value=0.0)
            nisa.tensor_scalar(dst=u[p0:p0 + n, :], data=t[p0:p0 + n, :], op0=nl.multiply, operand0=2.0)  # THE-OP
            o = nl.ndarray((128, 8), nl.float32, buffer=nl.shared_hbm)
            nisa.dma_copy(dst=o, src=u)
            return o
        return kern

    x = np.random.default_rng(4).standard_normal((128, 8)).astype(np.float32)
    for p0, n in ((0, 128), (64, 64), (32, 32), (96, 1), (0, 100)):
        out, prof = make(p0, n).simulate(x)
        assert prof.check_reports == [], (p0, n)
    bad = make(16, 32)
    with pytest.warns(nsim.tracer.CheckWarning, match="NSIM-W509 start-partition") as rec:
        out, prof = bad.simulate(x)
    want = np.zeros_like(x)
    want[16:48] = 2 * x[16:48]
    np.testing.assert_array_equal(out, want)
    (r,) = prof.check_reports
    assert r["code"] == "NSIM-W509" and r["line"] == _line_of("# THE-OP")
    assert "32 partitions starting at partition 16" in r["detail"]
    assert len(rec) == 1
    with pytest.raises(nsim.NsimError) as e:
        make(32, 96).options(check="strict").simulate(x)
    assert e.value.code == "NSIM-W509"


def _line_of(tag):
    import inspect
    src, first = inspect.getsourcelines(test_start_partition_rule_is_reported)
    return first + next(i for i, line in enumerate(src) if tag in line)


def test_integer_immediates_are_exact_bit_patterns():
    """Spec 2.0: bit-vector ops "operate on bit patterns without casting"; an integer immediate above 2^24 went
    through the instruction's float32 immediate (x & 0x0ff0ff0f was x & 0x0ff0ff10; uint32 x & 0xFFFFFFFF was 0).
    tensor_copy_predicated's scalar src into an int32 tile likewise (2.2: dst = src)."""
    xi = np.random.default_rng(6).integers(-2**31, 2**31 - 1, (128, 4), dtype=np.int64).astype(np.int32)
    xu = xi.view(np.uint32)
    band = _elementwise(lambda u, t: nisa.tensor_scalar(dst=u, data=t, op0=nl.bitwise_and, operand0=0x0ff0ff0f))
    bxor = _elementwise(lambda u, t: nisa.tensor_scalar(dst=u, data=t, op0=nl.bitwise_xor, operand0=0x9E3779B9,
                                                        op1=nl.bitwise_and, operand1=0xFFFFFFFF))
    np.testing.assert_array_equal(band(xi), xi & 0x0ff0ff0f)
    np.testing.assert_array_equal(bxor(xu), (xu ^ np.uint32(0x9E3779B9)) & np.uint32(0xFFFFFFFF))

    @nki.jit
    def pred(x):
        t = _ld(x)
        u = nl.ndarray(t.shape, nl.int32, buffer=nl.sbuf)
        nisa.memset(dst=u, value=0)
        nisa.tensor_copy_predicated(dst=u, src=16777217, predicate=t)
        o = nl.ndarray(t.shape, nl.int32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=o, src=u)
        return o

    m = (np.arange(128 * 4).reshape(128, 4) % 3 == 0).astype(np.float32)
    np.testing.assert_array_equal(pred(m), np.where(m != 0, 16777217, 0).astype(np.int32))


@pytest.mark.parametrize("dt,shift", [(np.int8, 1), (np.int16, 4), (np.int32, 1)])
def test_right_shift_is_logical_on_the_dtype_bit_pattern(dt, shift):
    """Spec 3.5: "right_shift | logical x >> y"; 2.0: bit patterns without casting. int8 -16 >> 1 is 120 (0xF0 >>
    1 = 0x78), not -8 (the value widened with its sign first, as before)."""
    bits = 8 * np.dtype(dt).itemsize
    x = np.array([[-16, -2, 5, -128 if bits == 8 else -30000]] * 128, dtype=dt)
    ux = x.view(np.dtype("uint{}".format(bits)))
    want = (ux >> shift).view(dt)
    ts = _elementwise(lambda u, t: nisa.tensor_scalar(dst=u, data=t, op0=nl.right_shift, operand0=shift))
    np.testing.assert_array_equal(ts(x), want)

    @nki.jit
    def tt(a, s):
        t, sv = _ld(a), _ld(s)
        u = nl.ndarray(t.shape, t.dtype, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=u, data1=t, data2=sv, op=nl.right_shift)
        o = nl.ndarray(t.shape, t.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=o, src=u)
        return o

    np.testing.assert_array_equal(tt(x, np.full_like(x, shift)), want)


def test_new_dialect_call_without_dst_runs_its_beta1_twin():
    """Spec 1.1: "a new-dialect function called without dst (only keyword arguments) behaves as its Beta-1 twin and
    returns a fresh SBUF tile, with a warning" (before: a Python TypeError for the missing dst)."""
    @nki.jit
    def kern(x):
        t = _ld(x)
        e = nisa.activation(op=nl.exp, data=t)
        s = nisa.tensor_tensor(data1=e, data2=t, op=nl.add)
        o = nl.ndarray(t.shape, nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=o, src=s)
        return o

    x = np.random.default_rng(8).standard_normal((128, 16)).astype(np.float32)
    with pytest.warns(nsim.tracer.NkiWarning, match="without dst"):
        got = kern(x)
    np.testing.assert_allclose(got, np.exp(x) + x, rtol=1e-5, atol=1e-6)


def test_deprecated_forms_warn():
    """Spec 1.3: string buffer names and integers for enum parameters are accepted with a deprecation warning."""
    @nki.jit
    def kern(x):
        t = nl.ndarray(x.shape, x.dtype, buffer="sbuf")
        nisa.dma_copy(dst=t, src=x)
        u = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=u, src=t, engine=5)  # 5 = nisa.engine.vector
        o = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=o, src=u)
        return o

    x = np.ones((128, 4), np.float32)
    with pytest.warns(nsim.tracer.NkiWarning) as rec:
        np.testing.assert_array_equal(kern(x), x)
    text = " ".join(str(w.message) for w in rec)
    assert "buffer='sbuf'" in text and "integer for nisa.engine" in text


def test_small_api_rules(b1):
    """Spec 1.4 nki.typing.scalar gives a Python scalar; 3.2 Beta-1 nl.static_cast of a host array is a numpy cast;
    3.1 PSUM address= on a bank boundary, nl.MemoryRegion's members; 2.1 / 2.2 / 3.5 instruction rules: negate with a
    bit-vector reduction, bn_stats over 512 elements, range_select with not_equal, a shuffle mask of 16 entries,
    tensor_scalar on ScalarE with (subtract, None), power on VectorE, new-dialect tensor_scalar_reduce by subtract --
    each an error now (they ran before)."""
    from nsim.nki import typing as nt
    bnki, bnl, _bnisa = b1
    seen = {}

    @nki.jit
    def sc(x):
        t = _ld(x)
        seen["v"] = nt.scalar(t[0:1, 0:1])
        return x

    sc(np.full((128, 4), 2.5, np.float32))
    assert seen["v"] == 2.5 and isinstance(seen["v"], float)
    a = np.array([1.00390625, 3.0], np.float32)
    np.testing.assert_array_equal(bnl.static_cast(a, ml_dtypes.bfloat16), a.astype(ml_dtypes.bfloat16))
    assert list(nl.MemoryRegion) == [nl.sbuf, nl.psum, nl.private_hbm, nl.shared_hbm]
    assert nl.MemoryRegion.psum == "psum"

    def run(body, shape=(128, 4), dtype=np.float32):
        @nki.jit
        def kern(x):
            body(_ld(x))
            return x
        return kern(np.ones(shape, dtype))

    def psum_off(t):
        nl.ndarray((128, 4), nl.float32, buffer=nl.psum, address=(0, 1024))

    def neg_or(t):
        r = nl.ndarray((128, 1), t.dtype, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=r, op=nl.bitwise_or, data=t, axis=1, negate=True)

    def bn_big(t):
        r = nl.ndarray((128, 6), nl.float32, buffer=nl.sbuf)
        nisa.bn_stats(dst=r, data=t)

    def rs_ne(t):
        r = nl.ndarray(t.shape, t.dtype, buffer=nl.sbuf)
        nisa.range_select(dst=r, on_true_tile=t, comp_op0=nl.not_equal, comp_op1=nl.less, bound0=0.0, bound1=9.0)

    def shuffle16(t):
        r = nl.ndarray((32, 4), t.dtype, buffer=nl.sbuf)
        nisa.nc_stream_shuffle(dst=r, src=t[0:32, :], shuffle_mask=list(range(16)))

    def scalar_sub(t):
        r = nl.ndarray(t.shape, t.dtype, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=r, data=t, op0=nl.subtract, operand0=1.0, engine=nisa.engine.scalar)

    def power_vector(t):
        r = nl.ndarray(t.shape, t.dtype, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=r, data1=t, data2=t, op=nl.power, engine=nisa.engine.vector)

    def tsr_subtract(t):  # 2.2: reduce_op add, multiply, maximum or minimum (Beta 1 also subtract)
        r = nl.ndarray(t.shape, t.dtype, buffer=nl.sbuf)
        acc = nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar_reduce(dst=r, data=t, op0=nl.multiply, operand0=1.0, reduce_op=nl.subtract, reduce_res=acc)

    for body, shape, dtype, code in ((psum_off, (128, 4), np.float32, "BadPlacement"),
                                     (neg_or, (128, 4), np.int32, "BadArgument"),
                                     (bn_big, (128, 513), np.float32, "ElementCountMismatch"),
                                     (rs_ne, (128, 4), np.float32, "BadArgument"),
                                     (shuffle16, (128, 4), np.float32, "BadOperandKind"),
                                     (scalar_sub, (128, 4), np.float32, "BadEngine"),
                                     (power_vector, (128, 4), np.float32, "BadEngine"),
                                     (tsr_subtract, (128, 4), np.float32, "BadArgument")):
        with pytest.raises(nsim.NsimError) as e:
            run(body, shape, dtype)
        assert e.value.code == _code(code), (body.__name__, str(e.value))

    # power with the engine unset runs on GpSimd (and computes x ** x)
    @nki.jit
    def pw(x):
        t = _ld(x)
        r = nl.ndarray(t.shape, t.dtype, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=r, data1=t, data2=t, op=nl.power)
        o = nl.ndarray(t.shape, t.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=o, src=r)
        return o

    x = np.full((128, 4), 1.5, np.float32)
    out, prof = pw.simulate(x)
    np.testing.assert_allclose(out, x ** x, rtol=1e-6)
    assert prof.stat("engine.gpsimd.instruction_count") == 1 and prof.stat("engine.vector.instruction_count") == 0


def test_instruction_rules_of_buffers_dtypes_and_gen2():
    """Spec 2.2 "not both in PSUM" (scalar_tensor_tensor, tensor_tensor_scan, tensor_copy_predicated), "src and dst
    same dtype" (tensor_copy_predicated, 2.3 nc_stream_shuffle); 2.1 activation on gen2: the bias a vector, none with
    reciprocal; activation_reduce by add only -- each ran before."""
    def run(body, config="trn2"):
        @nki.jit
        def kern(x):
            t = _ld(x)
            p = nl.ndarray(t.shape, t.dtype, buffer=nl.psum)
            q = nl.ndarray(t.shape, t.dtype, buffer=nl.psum)
            nisa.tensor_copy(dst=p, src=t)
            nisa.tensor_copy(dst=q, src=t)
            body(t, p, q)
            return x
        return kern.options(config=config)(np.ones((128, 4), np.float32))

    def stt(t, p, q):
        nisa.scalar_tensor_tensor(dst=t, data=p, op0=nl.add, operand0=1.0, op1=nl.add, operand1=q)

    def pred(t, p, q):
        nisa.tensor_copy_predicated(dst=t, src=p, predicate=q)

    def pred_dt(t, p, q):
        u = nl.ndarray(t.shape, nl.bfloat16, buffer=nl.sbuf)
        nisa.tensor_copy_predicated(dst=u, src=t, predicate=t)

    def bias_scalar(t, p, q):
        nisa.activation(dst=t, op=nl.exp, data=t, bias=1.0)

    def recip_bias(t, p, q):
        b = nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=b, value=1.0)
        nisa.activation(dst=t, op=nl.reciprocal, data=t, bias=b)

    def act_reduce_max(t, p, q):
        r = nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf)
        nisa.activation_reduce(dst=t, op=nl.exp, data=t, reduce_op=nl.maximum, reduce_res=r)

    for body, config, code in ((stt, "trn2", "BadBuffer"), (pred, "trn2", "BadBuffer"), (pred_dt, "trn2", "BadDtype"),
                               (bias_scalar, "trn1", "NotOnGeneration"), (recip_bias, "trn1", "NotOnGeneration"),
                               (act_reduce_max, "trn1", "NotOnGeneration")):
        with pytest.raises(nsim.NsimError) as e:
            run(body, config)
        assert e.value.code == _code(code), (body.__name__, str(e.value))
    run(bias_scalar, "trn2")  # a scalar bias is fine on gen3+


def test_hbm_buffer_names():
    """Spec 1.6 / 3.1 / 3.4: an argument's buffer is nl.hbm (private_hbm), shared_hbm under LNC=2; a kernel's
    nl.shared_hbm output and nl.shared_constant are shared_hbm; a private_hbm tensor private_hbm (before, all were
    the string 'hbm', equal to none of them). nsim's own "hbm" still matches all of them."""
    seen = {}

    @nki.jit
    def kern(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        priv = nl.ndarray(a.shape, a.dtype, buffer=nl.private_hbm)
        const = nl.shared_constant(np.ones((2, 2), np.float32))
        seen.setdefault("bufs", []).append({"arg": a.buffer, "out": out.buffer, "priv": priv.buffer,
                                           "const": const.buffer})
        t = _ld(a)
        nisa.dma_copy(dst=priv, src=t)
        nisa.dma_copy(dst=out, src=t)
        return out

    x = np.ones((128, 4), np.float32)
    kern(x)
    b = seen["bufs"][-1]
    assert b["arg"] == nl.hbm == nl.private_hbm and b["arg"] != nl.shared_hbm
    assert b["out"] == nl.shared_hbm and b["out"] != nl.private_hbm
    assert b["priv"] == nl.private_hbm and b["const"] == nl.shared_hbm
    assert all(v == "hbm" and nl.is_hbm(v) for v in b.values())
    assert repr(b["out"]) == "'shared_hbm'"
    with pytest.warns(nsim.tracer.CheckWarning, match="NSIM-W506"):  # (both cores write all of out: a race)
        kern[2](x)
    assert seen["bufs"][-1]["arg"] == nl.shared_hbm


def test_tfloat32_tiles(b1):
    """Spec 3.2: tfloat32 is stored as fp32 rounded to 10 mantissa bits (RNE). nl.tfloat32 (numpy's 4-byte void
    dtype) was rejected as 'void32' in both dialects."""
    x = np.full((128, 4), 1 + 2.0 ** -11 + 2.0 ** -12, np.float32)  # rounds up to 1 + 2^-10 in tf32

    @nki.jit
    def new(a):
        s = _ld(a)
        t = nl.ndarray((128, 4), nl.tfloat32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=t, src=s)
        nisa.tensor_copy(dst=s, src=t)
        o = nl.ndarray((128, 4), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=o, src=s)
        return o

    bnki, bnl, _bnisa = b1

    def beta1(a):
        o = bnl.ndarray((128, 4), dtype=bnl.float32, buffer=bnl.shared_hbm)
        bnl.store(o, value=bnl.load(a).astype(bnl.tfloat32))
        return o

    want = np.full_like(x, 1 + 2.0 ** -10)
    np.testing.assert_array_equal(new(x), want)
    np.testing.assert_array_equal(bnki.simulate_kernel(beta1, x), want)


def test_strict_turns_the_nki_warnings_into_errors():
    """Spec 4.1: "strict=True ... turns lint-level checks into errors"; 1.3 "accept with a deprecation warning unless
    strict", 1.6 "nsim reports both in strict only": with check="strict" a form nsim otherwise accepts with an
    NkiWarning is a StrictRule error at the kernel's line."""
    def deprecated_buffer(x):
        t = nl.ndarray(x.shape, x.dtype, buffer="sbuf")
        nisa.dma_copy(dst=t, src=x)

    def init_value(x):
        nl.zeros((4, 4), nl.float32, buffer=nl.shared_hbm)

    def value_branch(x):
        t = _ld(x)
        if t[0:1, 0:1]:
            pass

    def no_dst(x):
        nisa.tensor_copy(src=_ld(x))

    x = np.ones((128, 4), np.float32)
    for body in (deprecated_buffer, init_value, value_branch, no_dst):
        @nki.jit
        def kern(a):
            body(a)
            return a

        with pytest.warns(nsim.tracer.NkiWarning):
            kern(x)
        with pytest.raises(nsim.KernelError) as e:
            kern.options(check="strict")(x)
        assert e.value.code == _code("StrictRule"), (body.__name__, str(e.value))


def test_double_row_operands_have_a_middle_dim_of_two():
    """Spec 2.1 nc_matmul perf_mode=double_row: stationary [K, 2, M], moving [K, 2, N], "middle dim exactly 2". A 2-D
    [128, 128] x [128, 512] or a [128, 4, 32] x [128, 4, 128] pair ran, read as [K, 2, F / 2] without a word; now an
    error naming the shape. [K, 2, M] x [K, 2, N] contracts both rows of each partition (numpy einsum)."""
    E4M3 = ml_dtypes.float8_e4m3

    def mk(sst, smv, m, n):
        @nki.jit
        def dr(a, b):
            st = nl.ndarray(sst, a.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=st, src=a.reshape(sst))
            mv = nl.ndarray(smv, b.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=mv, src=b.reshape(smv))
            ps = nl.ndarray((m, n), nl.float32, buffer=nl.psum)
            nisa.nc_matmul(dst=ps, stationary=st, moving=mv, perf_mode=nisa.matmul_perf_mode.double_row)
            r = nl.ndarray((m, n), nl.float32, buffer=nl.sbuf)
            nisa.tensor_copy(dst=r, src=ps)
            o = nl.ndarray((m, n), nl.float32, buffer=nl.shared_hbm)
            nisa.dma_copy(dst=o, src=r)
            return o
        return dr.options(config="trn2")

    rng = np.random.default_rng(0)
    a = rng.integers(-3, 4, (128, 128)).astype(np.float32).astype(E4M3)
    b = rng.integers(-3, 4, (128, 512)).astype(np.float32).astype(E4M3)
    out = mk((128, 2, 64), (128, 2, 256), 64, 256)(a, b)
    ref = np.einsum("krm,krn->mn", a.astype(np.float64).reshape(128, 2, 64), b.astype(np.float64).reshape(128, 2, 256))
    np.testing.assert_array_equal(out, ref)
    for sst, smv, m, n in (((128, 128), (128, 512), 64, 256), ((128, 4, 32), (128, 4, 128), 64, 256)):
        with pytest.raises(nsim.NsimError) as e:
            mk(sst, smv, m, n)(a, b)
        assert e.value.code == _code("ShapeMismatch") and "[K, 2, M]" in str(e.value), str(e.value)
