"""Public-style NKI kernels with the mistakes kernel authors really make (tests/python/kernels/public_kernel_mistakes.py:
copies of the tutorial / nki-samples / nki-library / vLLM kernels with one line changed), in both dialects. For each:
the exception is an nsim one (``nsim.NsimError`` subclass of the code's family; the user's own exception for a bug in
the user's code), its code is the documented one (docs/errors.md), its message names the op or tensor and what to
fix, and its file:line is the line of the mistake in the kernel file (``# MISTAKE: <tag>``), also inside the user's
helper functions, with nsim's own frames trimmed from the traceback.

Shortfalls these kernels found and the fixes they pin (each test failed before its fix):
- a stationary operand wider than the PE array (``nl.matmul`` / ``nisa.nc_matmul`` with M = 256) was reported as
  "tensor #5 'ps': a psum tile of 256 partitions" (E202, Beta 1) or "dst must have M = 256 partitions" (E310, new
  dialect) instead of the matmul limit (E308);
- a Beta-1 ``nisa.nc_transpose`` / ``nl.transpose`` of a [128, 256] tile was reported as a PSUM tile of 256
  partitions (E202) instead of the transpose limit (E310, as the new dialect reports it);
- a Beta-1 ``nisa.*`` instruction given ``None`` (a helper that forgot ``return``) raised a bare AttributeError;
- a kernel returning nothing although it wrote its shared_hbm output ran silently (now UnreturnedOutputWarning);
- an ``nl``/``nisa`` function called outside a kernel named an internal function (``nl.zeros`` -> "nl.ndarray")
  and left several nsim frames in the traceback.
"""
import os
import traceback
import warnings

import numpy as np
import pytest

from conftest import require_core, sample_fixture  # noqa: E402

_core, ml_dtypes = require_core()

import nsim  # noqa: E402
import nsim.tracer  # noqa: E402

KFILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels", "public_kernel_mistakes.py")
NSIM_PKG_DIR = os.path.realpath(os.path.dirname(nsim.__file__))

pkm = sample_fixture("public_kernel_mistakes.py", module_only=True)


def mistake_line(tag):
    """The line of the kernel file that ends in ``# MISTAKE: <tag>``."""
    with open(KFILE) as f:
        hits = [i for i, ln in enumerate(f, 1) if ln.rstrip().endswith("# MISTAKE: " + tag)]
    assert len(hits) == 1, tag
    return hits[0]


def nsim_frames(exc):
    return [f for f in traceback.extract_tb(exc.__traceback__)
            if os.path.realpath(f.filename).startswith(NSIM_PKG_DIR + os.sep)]


def z(*shape, dtype=np.float32):
    return np.zeros(shape, dtype)


def rows(ids):
    return np.asarray(ids, np.int32).reshape(-1, 1)


GATHER_IDS = [-1] + list(range(63))  # a padding slot marked -1

# (kernel name, inputs, exception class, code name, tag, fragments the message must contain)
ERRORS = [
    # --- Beta 1 ---
    ("b1_tile_256_partitions", lambda: (z(256, 512), z(256, 512)), "AccessError", "TooManyPartitions", "b1_256",
     ["nl.load", "256", "128"]),
    ("b1_sbuf_overflow", lambda: (z(128, 65536),), "AccessError", "SbufOverflow", "b1_sbuf",
     ["SBUF overflow", "[128, 65536]", "262144"]),
    ("b1_psum_overflow", lambda: (z(128, 128), z(128, 512)), "AccessError", "PsumOverflow", "b1_psum",
     ["PSUM overflow", "'acc'", "[128, 8192]"]),
    ("b1_matmul_stationary_256", lambda: (z(128, 256), z(128, 512)), "OperandError", "MatmulLimit",
     "b1_mm_stationary", ["nl.matmul", "M = 256", "128 columns", "tile M"]),
    ("b1_matmul_moving_1024", lambda: (z(128, 128), z(128, 1024)), "OperandError", "MatmulLimit", "b1_mm_moving",
     ["nc_matmul", "moving free size 1024 exceeds 512"]),
    ("b1_matmul_contraction_mismatch", lambda: (z(128, 128), z(64, 512)), "OperandError", "ShapeMismatch",
     "b1_mm_k", ["nl.matmul", "contraction dims differ", "(64, 512)"]),
    ("b1_load_off_by_one", lambda: (z(256, 64),), "KernelError", "IndexOutOfBounds", "b1_off_by_one",
     ["256:384", "'a_input'", "size 256"]),
    ("b1_ragged_last_tile_without_mask", lambda: (z(300, 64),), "KernelError", "IndexOutOfBounds", "b1_ragged",
     ["'a_input'", "size 300", "mask="]),
    # (the slice past the end names the fix of the dialect: a mask in Beta 1, clipped slices in the new one)
    ("b1_ragged_last_tile_sliced", lambda: (z(300, 64),), "KernelError", "IndexOutOfBounds", "b1_ragged_slices",
     ["256:384", "size 300", "44 of them", "i_f = nl.arange(64)[None, :]", "mask=(i * 128 + i_p < 300)"]),
    ("b1_float_index_tile", lambda: (z(128, 512), np.arange(64, dtype=np.float32)), "OperandError", "BadDtype",
     "b1_float_idx", ["int32", "float32"]),
    ("b1_gather_negative_index", lambda: (z(128, 512), np.asarray(GATHER_IDS, np.int32)), "KernelError",
     "IndexOutOfBounds", "b1_gather_neg", ["indirect index -1", "[0, 128)", "oob_mode"]),
    ("b1_nc_transpose_too_large", lambda: (z(128, 256),), "OperandError", "ShapeMismatch", "b1_transpose",
     ["nisa.nc_transpose", "[128, 256]", "128 x 128"]),
    ("b1_nl_transpose_too_large", lambda: (z(128, 256),), "OperandError", "ShapeMismatch", "b1_nl_transpose",
     ["nl.transpose", "[128, 256]", "128 x 128"]),
    ("b1_exp_of_psum_block", lambda: (z(128, 128), z(128, 512)), "KernelError", "TileInference", "b1_exp_psum",
     ["err_failed_to_infer_tile_from_local_tensor"]),
    ("b1_tensor_tensor_shape_mismatch", lambda: (z(128, 512), z(128, 256)), "OperandError", "ElementCountMismatch",
     "b1_tt_shape", ["tensor_tensor", "'data2' has 256", "512"]),
    ("b1_tensor_tensor_no_broadcast", lambda: (z(128, 512), z(128, 1)), "OperandError", "ElementCountMismatch",
     "b1_tt_bcast", ["tensor_tensor", "'data2' has 1 elements"]),
    ("b1_helper_off_by_one", lambda: (z(256, 64),), "KernelError", "IndexOutOfBounds", "b1_helper_oob",
     ["256:384", "'a_input'"]),
    ("b1_helper_forgot_return", lambda: (z(128, 64),), "OperandError", "BadOperandKind", "b1_forgot_return",
     ["nisa.activation", "data must be a tile", "None"]),
    # --- new dialect ---
    ("n_tile_256_partitions", lambda: (z(256, 512), z(256, 512)), "AccessError", "TooManyPartitions", "n_256",
     ["'a_tile'", "256 partitions", "at most 128"]),
    ("n_sbuf_overflow", lambda: (z(128, 65536),), "AccessError", "SbufOverflow", "n_sbuf",
     ["SBUF overflow", "'big' [128, 65536]"]),
    ("n_sbuf_too_many_live_tiles", lambda: (z(1024, 8192),), "AccessError", "SbufOverflow", "n_many_live",
     ["SBUF overflow", "'t' [128, 8192]", "'t_0'"]),
    ("n_psum_overflow", lambda: (z(128, 128), z(128, 512)), "AccessError", "PsumOverflow", "n_psum",
     ["PSUM overflow", "'ps' [128, 8192]", "16384"]),
    ("n_psum_too_many_banks", lambda: (z(128, 128), z(128, 512)), "AccessError", "PsumOverflow", "n_psum_banks",
     ["PSUM overflow", "2 KiB banks", "'ps' [128, 512]"]),
    ("n_matmul_stationary_256", lambda: (z(128, 256), z(128, 512)), "OperandError", "MatmulLimit",
     "n_mm_stationary", ["nisa.nc_matmul", "stationary (128, 256)", "M = 256", "tile M"]),
    ("n_matmul_moving_1024", lambda: (z(128, 128), z(128, 1024)), "OperandError", "MatmulLimit", "n_mm_moving",
     ["nc_matmul", "moving free size 1024 exceeds 512"]),
    ("n_matmul_contraction_mismatch", lambda: (z(128, 128), z(64, 512)), "OperandError", "ShapeMismatch", "n_mm_k",
     ["nc_matmul", "[K=128, M=128]", "[K=64, N=512]", "contraction"]),
    ("n_load_off_by_one", lambda: (z(256, 64),), "KernelError", "IndexOutOfBounds", "n_off_by_one",
     ["256:384", "'a_input'", "size 256"]),
    ("n_ragged_last_tile_unclipped", lambda: (z(300, 64),), "KernelError", "IndexOutOfBounds", "n_ragged",
     ["256:384", "size 300", "44 of them", "p = min(128, 300 - i * 128)"]),
    ("n_float_index_tile", lambda: (z(128, 512), np.arange(64, dtype=np.float32).reshape(64, 1)), "OperandError",
     "BadDtype", "n_float_idx", ["vector_offset", "int32", "float32"]),
    ("n_gather_negative_index", lambda: (z(128, 512), rows(GATHER_IDS)), "KernelError", "IndexOutOfBounds",
     "n_gather_neg", ["indirect index -1", "oob_mode"]),
    ("n_nc_transpose_too_large", lambda: (z(128, 256),), "OperandError", "ShapeMismatch", "n_transpose",
     ["nc_transpose", "[128, 256]", "128 x 128"]),
    ("n_exp_of_psum_wrong_shape", lambda: (z(128, 128), z(128, 512)), "OperandError", "ElementCountMismatch",
     "n_exp_psum", ["activation", "'data' has 512", "'dst' has 256"]),
    ("n_tensor_tensor_shape_mismatch", lambda: (z(128, 512), z(128, 256)), "OperandError", "ElementCountMismatch",
     "n_tt_shape", ["tensor_tensor", "'data2' has 256"]),
    ("n_tensor_tensor_no_broadcast", lambda: (z(128, 512), z(128, 1)), "OperandError", "ElementCountMismatch",
     "n_tt_bcast", ["tensor_tensor", "'data2' has 1 elements"]),
    ("n_helper_off_by_one", lambda: (z(256, 64),), "KernelError", "IndexOutOfBounds", "n_helper_oob",
     ["256:384", "'a_input'"]),
]


@pytest.mark.parametrize("kernel,inputs,cls,code,tag,fragments", ERRORS, ids=[c[0] for c in ERRORS])
def test_mistake_is_reported_at_the_users_line(pkm, kernel, inputs, cls, code, tag, fragments):
    with pytest.raises(nsim.NsimError) as ei:
        getattr(pkm, kernel)(*inputs())
    e = ei.value
    assert isinstance(e, getattr(nsim, cls)) and type(e) is nsim.error_class(e.code), repr(e)
    assert e.code == nsim._errors.code(code), str(e)
    assert os.path.realpath(e.file) == os.path.realpath(KFILE) and e.line == mistake_line(tag), str(e)
    for frag in fragments:
        assert frag in e.message, (frag, str(e))
    assert e.hint  # what usually fixes it (docs/errors.md)
    assert len(nsim_frames(e)) <= 1, traceback.format_tb(e.__traceback__)


@pytest.mark.parametrize("kernel,tag", [("b1_user_exception", "b1_user_exc"), ("n_user_exception", "n_user_exc")])
def test_exception_in_users_helper_comes_through_unchanged(pkm, kernel, tag):
    with pytest.raises(KeyError) as ei:
        getattr(pkm, kernel)(z(128, 64))
    assert not isinstance(ei.value, nsim.NsimError) and ei.value.args == ("scale",)
    last = traceback.extract_tb(ei.value.__traceback__)[-1]
    assert os.path.realpath(last.filename) == os.path.realpath(KFILE) and last.lineno == mistake_line(tag)
    assert len(nsim_frames(ei.value)) <= 1


@pytest.mark.parametrize("fn,tag,api", [("b1_iota_outside_kernel", "b1_outside", "isa.memset"),
                                        ("b1_zeros_outside_kernel", "b1_outside_zeros", "language.zeros"),
                                        ("n_ndarray_outside_kernel", "n_outside", "language.ndarray")])
def test_nki_call_outside_a_kernel(pkm, fn, tag, api):
    with pytest.raises(nsim.KernelError) as ei:
        getattr(pkm, fn)()
    e = ei.value
    assert e.code == nsim._errors.code("OutsideKernel")
    assert e.line == mistake_line(tag) and os.path.realpath(e.file) == os.path.realpath(KFILE)
    assert api + " can only be called inside an NKI kernel" in e.message, e.message  # the function called
    assert len(nsim_frames(e)) <= 1, traceback.format_tb(e.__traceback__)


@pytest.mark.parametrize("kernel,tag", [("b1_returns_nothing", "b1_no_return"), ("n_returns_nothing", "n_no_return")])
def test_kernel_that_returns_nothing_warns(pkm, kernel, tag):
    with pytest.warns(nsim.tracer.UnreturnedOutputWarning, match="returns None but writes the shared_hbm tensor "
                      "'out': its values are lost") as rec:
        assert getattr(pkm, kernel)(z(128, 64)) is None
    w = [r for r in rec if r.category is nsim.tracer.UnreturnedOutputWarning][0]
    assert os.path.realpath(w.filename) == os.path.realpath(KFILE) and w.lineno == mistake_line(tag)


def test_kernel_returning_nothing_but_writing_an_argument_does_not_warn(pkm):
    @pkm.nki.jit
    def scale_in_place(a):
        t = pkm._n_load(a)
        pkm.nisa.tensor_scalar(dst=t, data=t, op0=pkm.nl.multiply, operand0=2.0)
        pkm.nisa.dma_copy(dst=a, src=t)
    a = np.ones((128, 64), np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error", nsim.tracer.UnreturnedOutputWarning)
        assert scale_in_place(a) is None
    assert (a == 2).all()


def test_affine_range_with_a_carried_state(pkm):
    """A loop-carried dependency in nl.affine_range: the sanitizer's NSIM-W504 (a warning; strict: an error), at the
    line that reads what the previous iteration wrote."""
    a = np.ones((512, 512), np.float32)
    with pytest.warns(nsim.tracer.CheckWarning, match="NSIM-W504.*loop-carried dependency") as rec:
        pkm.n_affine_range_carried_state(a)
    w = [r for r in rec if r.category is nsim.tracer.CheckWarning][0]
    assert w.lineno == mistake_line("n_carried") and "prev" in str(w.message)
    with pytest.raises(nsim.KernelError) as ei:
        pkm.n_affine_range_carried_state.options(check="strict")(a)
    assert ei.value.code == "NSIM-W504" and ei.value.line == mistake_line("n_carried")


def test_b1_accumulation_into_a_tile_is_not_reported(b1):
    """``acc[...] = acc + x`` (and ``acc[...] += x``) over an affine_range is the spec's associative accumulation:
    the retargeted write's check leaves it alone."""
    bnki, bl, _bisa = b1

    @bnki.jit
    def acc_sum(a_input):
        out = bl.ndarray((128, 512), dtype=np.float32, buffer=bl.shared_hbm)
        acc = bl.zeros((128, 512), dtype=np.float32, buffer=bl.sbuf)
        for i in bl.affine_range(a_input.shape[0] // 128):
            acc[...] = acc + bl.load(a_input[i * 128:(i + 1) * 128, :])
        bl.store(out, value=acc)
        return out

    a = np.random.default_rng(3).standard_normal((512, 512)).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error", nsim.tracer.CheckWarning)
        out = acc_sum(a)
    np.testing.assert_allclose(out, a.reshape(4, 128, 512).sum(0), rtol=1e-5, atol=1e-5)


def test_the_ragged_tile_fix_the_message_names_works(b1):
    """The E408 hint for a last row tile past the end (the kernels b1_ragged_last_tile_sliced and
    n_ragged_last_tile_unclipped), applied as written: each kernel then copies all 300 rows."""
    bnki, bl, _bisa = b1
    import nki
    import nki.isa as nisa
    import nki.language as nl

    @bnki.jit
    def b1_masked(a_input):
        out = bl.ndarray(a_input.shape, dtype=a_input.dtype, buffer=bl.shared_hbm)
        i_p = bl.arange(128)[:, None]
        i_f = bl.arange(64)[None, :]
        for i in bl.affine_range((a_input.shape[0] + 127) // 128):
            t = bl.load(a_input[i * 128 + i_p, i_f], mask=(i * 128 + i_p < 300))
            bl.store(out[i * 128 + i_p, i_f], value=t, mask=(i * 128 + i_p < 300))
        return out

    @nki.jit
    def n_clipped(a_input):
        out = nl.ndarray(a_input.shape, dtype=a_input.dtype, buffer=nl.shared_hbm)
        for i in nl.affine_range((a_input.shape[0] + 127) // 128):
            p = min(128, 300 - i * 128)
            t = nl.ndarray((128, a_input.shape[1]), dtype=a_input.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=t[0:p, :], src=a_input[i * 128:i * 128 + p, :])
            nisa.dma_copy(dst=out[i * 128:i * 128 + p, :], src=t[0:p, :])
        return out

    a = np.random.default_rng(5).standard_normal((300, 64)).astype(np.float32)
    np.testing.assert_array_equal(b1_masked(a), a)
    np.testing.assert_array_equal(nki.simulate(n_clipped)(a), a)


def test_writing_an_input_argument_is_allowed(pkm):
    """nki-api.md 1.6: a kernel's writes to an argument are visible in the caller's array (no error, not strict)."""
    a = np.full((128, 64), 3.0, np.float32)
    out = pkm.n_write_input_argument(a)
    assert (out == 6).all() and (a == 6).all()


@pytest.mark.parametrize("call,api,arg", [
    (lambda bl, bisa, t: bisa.tensor_tensor(t, None, op=bl.add), "nisa.tensor_tensor", "data2"),
    (lambda bl, bisa, t: bisa.nc_matmul(None, t), "nisa.nc_matmul", "stationary"),
    (lambda bl, bisa, t: bisa.nc_transpose(None), "nisa.nc_transpose", "data"),
    (lambda bl, bisa, t: bl.transpose(None), "nl.transpose", "x"),
    (lambda bl, bisa, t: bl.load_transpose2d(None), "nl.load_transpose2d", "src"),
], ids=["tensor_tensor", "nc_matmul", "nc_transpose", "nl.transpose", "nl.load_transpose2d"])
def test_b1_call_given_none_names_the_argument(pkm, call, api, arg):
    """A None tile (a helper that forgot ``return``) given to a Beta-1 call: BadOperandKind naming the call and the
    argument, at the user's line (was a bare AttributeError from nsim's internals)."""
    bl, bisa = pkm.bl, pkm.bisa

    @pkm.bnki.jit
    def k(a):
        out = bl.ndarray(a.shape, dtype=a.dtype, buffer=bl.shared_hbm)
        t = bl.load(a)
        call(bl, bisa, t)
        bl.store(out, value=t)
        return out
    with pytest.raises(nsim.OperandError) as ei:
        k(z(128, 64))
    e = ei.value
    assert e.code == nsim._errors.code("BadOperandKind") and "{}: {} must be a".format(api, arg) in e.message
    assert os.path.realpath(e.file) == os.path.realpath(__file__)


@pytest.mark.parametrize("dialect,call,code,fragment", [
    ("beta1", lambda nl, a: nl.zeros(None, dtype=nl.float32), "NSIM-E429", "a shape is an int or a tuple of ints, got None"),
    ("beta1", lambda nl, a: nl.ndarray("abc", dtype=nl.float32, buffer=nl.sbuf), "NSIM-E429", "got 'abc'"),
    ("new", lambda nl, a: nl.ndarray((128, "4"), nl.float32, buffer=nl.sbuf), "NSIM-E429", "got (128, '4')"),
    ("beta1", lambda nl, a: nl.full((128, 4), "x", dtype=nl.float32), "NSIM-E312", "must be a number, got 'x'"),
    ("beta1", lambda nl, a: nl.max(nl.load(a), axis=None), "NSIM-E312", "axis must be an int or a tuple of ints"),
])
def test_plain_misuse_of_nl_functions_names_the_argument(b1, dialect, call, code, fragment):
    """Arguments of the wrong kind to creation and reduction functions (a shape of None or with a string, a string
    fill value, ``axis=None``) raised bare TypeError / ValueError from int() or iteration inside nsim; now the
    documented code at the user's line, naming the argument."""
    if dialect == "beta1":
        bnki, bnl, _bnisa = b1
        jit, nl = bnki.jit, bnl
    else:
        from nsim import nki
        import nsim.nki.language as nl
        jit = nki.jit

    @jit
    def k(a):
        call(nl, a)  # the mistake
        return a

    with pytest.raises(nsim.NsimError) as ei:
        k(z(128, 64))
    assert ei.value.code == code and fragment in str(ei.value), str(ei.value)
    # the user's line: the call of the nl function (in the lambda of this test's parameters)
    assert os.path.basename(ei.value.file) == os.path.basename(__file__)
    assert ei.value.line == call.__code__.co_firstlineno
