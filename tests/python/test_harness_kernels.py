"""How public scripts invoke and benchmark kernels (tests/python/kernels/harness_kernels.py, Beta-1 dialect, and
harness_kernels_new.py, new dialect; both unmodified, through ``nsim.compat``): small add / softmax / matmul /
transpose kernels called the ways the nki-samples tutorials, the aws-neuron-sdk examples and nki-autotune style
benchmark loops call them:

- Beta 1: ``@nki.jit``, ``@nki.jit()``, ``@nki.jit(mode=..., platform_target=..., <other compile kwargs>)``,
  ``nki.jit(fn, **kw)``, ``@nki.trace`` / ``mode="trace"`` sub-kernels, ``nki.simulate_kernel(kernel, *args)``
  (of a jit object, a plain function, ``baremetal(k)[grid]``), ``nki.baremetal(k, **kw)`` / ``@baremetal`` /
  ``@baremetal(**kw)``, ``nki.benchmark(warmup=, iters=, save_neff_name=)(k)`` / ``nki.benchmark(kernel=k)`` and
  its ``benchmark_result.nc_latency.get_latency_percentile(p)``, ``nki.profile(working_directory=,
  save_trace_name=)`` and the files it writes, SPMD launches ``k[2, 2]`` / ``k[(2, 2)]`` / ``k[nl.nc(2), 2]`` /
  ``k[nl.spmd_dim(nl.nc(2), 2)]`` / ``k[nl.nc(2) * 3]`` with ``program_id`` / ``num_programs`` /
  ``program_ndim``, outputs passed in as arguments (numpy updated in place, also non-contiguous views), tuple /
  list / namedtuple / nested / ``None`` returns, scalars and keyword arguments passed through, bf16 dtypes kept;
- new dialect: ``@nki.jit``, ``nki.simulate(k)(...)``, ``nki.simulate(k)[2](...)``, ``nki.simulate(k[2])``,
  ``k[nl.nc(2)]``, ``nki.simulate(plain_function)``, ``nki.simulate_kernel``, ``k.simulate`` (value, Profile),
  ``@nki.jit`` helpers called from inside a kernel, ``mode=`` / ``platform_target=`` deprecation warnings, errors
  for ``k[8]`` / ``k[1, 1]`` / ``k[2.5]`` and ``nki.benchmark``;
- ``nl.tile_size`` constants (pmax, gemm_stationary_fmax, gemm_moving_fmax, psum bank sizes) driving the tiling,
  in both dialects; numpy pre/post-processing wrappers around kernel calls; torch tensors in (skipped when torch
  is not installed).

Checked: outputs against numpy (fp32 1e-5 / exact for moves), return types and order, the documented attributes of
the returned objects (``benchmark_result`` latency = the run's ``total_time_ns`` / 1000 in µs, every percentile
equal; profile files), in-place argument updates, errors for misuse.

The nsim fixes this family needed (their regression tests fail without them):
- a kernel returning a ``namedtuple`` of tensors crashed after the simulation (TypeError ``__new__() missing 1
  required positional argument``: the return structure was rebuilt as ``type(r)(generator)``), and a returned
  ``list`` came back as a list although spec §1.6 says a tuple/list of tensors gives a tuple of arrays
  (python/nsim/tracer.py ``run.build``: lists become tuples, namedtuples are rebuilt from their fields;
  ``test_namedtuple_and_list_returns``);
- a float launch grid ``k[2.5]`` (Beta 1) silently ran ``int(2.5)`` = 2 instances, and ``k["2"]`` parsed the
  string; the new dialect's ``k[2.5]`` ran under LNC=2 (python/nsim/nki/beta1/__init__.py ``_grid_dims`` and
  python/nsim/nki/__init__.py ``Kernel.__getitem__``: sizes through ``operator.index``;
  ``test_non_integer_grid_is_an_error``);
- new dialect ``@nki.jit(mode=...)`` issued its warning twice (the decorator form re-entered ``jit``), as a
  DeprecationWarning (hidden by default) where spec §4.1 says ``nki.NkiWarning`` (a UserWarning; the class did not
  exist: ``nki.NkiWarning`` was an AttributeError), and ``platform_target=`` (deprecated in the new dialect as
  ``mode=`` is, spec §1.3) gave none (python/nsim/nki/__init__.py: ``NkiWarning`` added, the base class of the
  sanitizer's ``CheckWarning`` and of nsim's other NKI warnings (python/nsim/tracer.py), ``jit`` warns once with
  it for both; ``test_new_jit_deprecated_kwargs_warn_once``).
"""
import collections
import os
import warnings

import numpy as np
import pytest

from conftest import require_core, sample_fixture  # noqa: E402

_core, ml_dtypes = require_core()
from numeric_helpers import close, f64 as _f64, randn as _randn  # noqa: E402

BF16 = ml_dtypes.bfloat16

hk = sample_fixture("harness_kernels.py")
hkn = sample_fixture("harness_kernels_new.py")


def _run(k, *args, **kwargs):
    """Run kernel ``k`` with every warning (sanitizer reports included) an error."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = k(*args, **kwargs)
    for w in caught:
        raise AssertionError("unexpected warning: {}".format(w.message))
    return out


def ref_softmax(x):
    x = _f64(x)
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


# --------------------------------------------------------------------------------------------------
# Beta 1: decorators, simulate_kernel, baremetal
# --------------------------------------------------------------------------------------------------

def test_jit_kernel_direct_call_and_simulate_kernel(hk):
    m, nki, nl, _ = hk
    a = _randn((128, 512), np.float32, 1)
    b = _randn((128, 512), np.float32, 2)
    assert isinstance(m.tensor_add_kernel, nki.Kernel)
    k = m.tensor_add_kernel[1, 1]  # the kernel reads program_id(0) and program_id(1)
    for out in (_run(k, a, b), _run(nki.simulate_kernel, k, a, b)):
        assert isinstance(out, np.ndarray) and out.dtype == np.float32 and out.shape == a.shape
        np.testing.assert_array_equal(out, a + b)


def test_output_argument_updated_in_place(hk):
    """Beta-1 ``def kernel(a, b, out)``: simulate_kernel of the plain function returns None and fills ``c``; also
    through ``nki.jit(fn)``, ``nki.baremetal`` and for non-contiguous numpy outputs (a transposed / strided view)."""
    m, nki, nl, _ = hk
    a = _randn((256, 384), np.float32, 3)
    b = _randn((256, 384), np.float32, 4)
    c = np.zeros_like(a)
    assert _run(nki.simulate_kernel, m.add_out_kernel, a, b, c) is None
    np.testing.assert_array_equal(c, a + b)
    c2 = np.zeros_like(a)
    assert _run(nki.jit(m.add_out_kernel, mode="baremetal"), a, b, c2) is None
    np.testing.assert_array_equal(c2, a + b)
    np.testing.assert_array_equal(_run(m.baremetal_add, a, b), a + b)
    cT = np.zeros((384, 256), np.float32).T
    strided = np.zeros((256, 768), np.float32)[:, ::2]
    for out in (cT, strided):
        _run(nki.simulate_kernel, m.add_out_kernel, a, b, out)
        np.testing.assert_array_equal(out, a + b)


def test_jit_modes_and_compile_kwargs_accepted(hk):
    """Every Beta-1 mode and the other compile kwargs are accepted and simulate; platform_target sets the preset."""
    m, nki, nl, _ = hk
    x = _randn((128, 64), np.float32, 5)
    y = _randn((128, 64), np.float32, 6)
    for mode in ("jax", "torchxla", "baremetal", "benchmark", "simulation", "auto", "trace"):
        k = nki.jit(mode=mode, experimental_flags="x", additional_compile_opt="-O1", show_compiler_tb=True,
                    debug_kernel=True, kernel_return=True)(m.add_sub_kernel.fn)
        s, d = _run(k, x, y)
        np.testing.assert_array_equal(s, x + y)
        np.testing.assert_array_equal(d, x - y)
    assert m.matmul_kernel.config == "trn2"
    assert nki.jit(platform_target="trn1")(m.add_sub_kernel.fn).config == "trn1"
    assert nki.jit()(m.add_sub_kernel.fn)(x, y)[0].shape == (128, 64)


def test_baremetal_forms(hk):
    m, nki, nl, _ = hk
    a = _randn((128, 512), np.float32, 7)

    @nki.baremetal
    def bm(a):
        o = nl.ndarray((128, 64), dtype=a.dtype, buffer=nl.shared_hbm)
        nl.store(o, value=nl.load(a[0:128, 0:64]))
        return o

    @nki.baremetal(save_neff_name="x.neff", save_trace_name="x.ntff", artifacts_dir="/nonexistent/dir")
    def bm2(a):
        o = nl.ndarray((128, 64), dtype=a.dtype, buffer=nl.shared_hbm)
        nl.store(o, value=nl.load(a[0:128, 0:64]))
        return o

    for k in (bm, bm2):
        np.testing.assert_array_equal(_run(k, a), a[:, :64])
    b = _randn((256, 1024), np.float32, 8)
    a2 = _randn((256, 1024), np.float32, 9)
    out = _run(nki.simulate_kernel, nki.baremetal(m.tensor_add_kernel)[2, 2], a2, b)
    np.testing.assert_array_equal(out, a2 + b)


# --------------------------------------------------------------------------------------------------
# SPMD launches
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("grid", ["2,2", "tuple", "nc", "spmd_dim", "nc_mul"])
def test_spmd_grid_forms(hk, grid):
    m, nki, nl, _ = hk
    a = _randn((256, 1024), np.float32, 10)
    b = _randn((256, 1024), np.float32, 11)
    k = m.tensor_add_kernel
    launched = {"2,2": lambda: k[2, 2], "tuple": lambda: k[(2, 2)], "nc": lambda: k[nl.nc(2), 2],
                "spmd_dim": lambda: k[nl.spmd_dim(nl.nc(2), 1), 2], "nc_mul": lambda: k[nl.nc(2) * 1, 2]}[grid]()
    np.testing.assert_array_equal(_run(launched, a, b), a + b)


def test_program_queries(hk):
    m, nki, nl, _ = hk

    @nki.jit
    def progs(a):
        o = nl.ndarray((1, 4), dtype=nl.int32, buffer=nl.private_hbm)
        t = nl.full((1, 4), 0, dtype=nl.int32)
        t[0, 0] = nl.program_ndim()
        t[0, 1] = nl.num_programs()
        t[0, 2] = nl.num_programs(0)
        t[0, 3] = nl.num_programs(axes=(0, 1)) if nl.program_ndim() > 1 else 1
        res = nl.ndarray((1, 4), dtype=nl.int32, buffer=nl.shared_hbm)
        nl.store(o, value=t)
        if nl.program_id(0) == 0 and (nl.program_ndim() < 2 or nl.program_id(1) == 0):
            nl.store(res, value=nl.load(o))
        return res

    a = np.zeros((128, 4), np.float32)
    np.testing.assert_array_equal(_run(progs, a), [[0, 1, 1, 1]])
    np.testing.assert_array_equal(_run(progs[2, 3], a), [[2, 6, 2, 6]])
    np.testing.assert_array_equal(_run(progs[4], a), [[1, 4, 4, 1]])


def test_grid_misuse_errors(hk):
    m, nki, nl, _ = hk
    a = _randn((256, 1024), np.float32, 12)
    with pytest.raises(_core.NsimError, match="NSIM-E435"):
        m.tensor_add_kernel[0]
    with pytest.raises(_core.NsimError, match="NSIM-E435"):
        m.tensor_add_kernel[nl.nc(2), nl.nc(2)]

    @nki.jit
    def outer(x, y):
        return m.tensor_add_kernel[2, 2](x, y)

    with pytest.raises(_core.NsimError, match="err_nested_kernel_with_spmd_grid"):
        outer(a, a)


def test_non_integer_grid_is_an_error(hk, hkn):
    """The fix: ``k[2.5]`` ran int(2.5) = 2 instances (Beta 1) or an LNC=2 launch (new); ``k["2"]`` parsed it."""
    m, nki, nl, _ = hk
    for g in (2.5, "2", (2, 1.5)):
        with pytest.raises(_core.NsimError, match="NSIM-E435"):
            m.tensor_add_kernel[g]
    with pytest.raises(_core.NsimError, match="NSIM-E435"):
        hkn[0].add_kernel[2.5]
    import numpy as _np
    assert m.tensor_add_kernel[_np.int64(2), 2].grid == (2, 2)  # numpy integers are sizes


# --------------------------------------------------------------------------------------------------
# Return values
# --------------------------------------------------------------------------------------------------

def test_tuple_returns_in_order(hk):
    m, nki, nl, _ = hk
    x = _randn((128, 96), np.float32, 13)
    t, c = _run(m.transpose_kernel, x)
    np.testing.assert_array_equal(t, x.T)
    np.testing.assert_array_equal(c, x)
    r = _run(nki.simulate(m.add_sub_kernel), x, 2 * x)
    assert type(r) is tuple and len(r) == 2
    close(r[0], 3 * _f64(x))
    close(r[1], -_f64(x))


def test_namedtuple_and_list_returns(hk):
    """The fix: a namedtuple return crashed after the run; a list return came back as a list (spec 1.6: tuple)."""
    m, nki, nl, _ = hk
    Pair = collections.namedtuple("Pair", "s d")

    @nki.jit
    def ret_nt(a, b):
        s, d = m.add_sub_kernel(a, b)
        return Pair(s, d)

    @nki.jit
    def ret_list(a, b):
        s, d = m.add_sub_kernel(a, b)
        return [s, d]

    @nki.jit
    def ret_nested(a, b):
        s, d = m.add_sub_kernel(a, b)
        return s, (d, None)

    x = _randn((128, 64), np.float32, 14)
    y = _randn((128, 64), np.float32, 15)
    r = _run(ret_nt, x, y)
    assert type(r) is Pair
    np.testing.assert_array_equal(r.s, x + y)
    np.testing.assert_array_equal(r.d, x - y)
    r = _run(ret_list, x, y)
    assert type(r) is tuple and len(r) == 2
    np.testing.assert_array_equal(r[1], x - y)
    r = _run(ret_nested, x, y)
    assert type(r) is tuple and type(r[1]) is tuple and r[1][1] is None
    np.testing.assert_array_equal(r[1][0], x - y)


def test_returned_argument_and_none(hk):
    """Returning a written argument: a copy of its final contents (and the caller's array updated); no return:
    None."""
    m, nki, nl, _ = hk

    @nki.jit
    def ret_arg(a, c):
        nl.store(c[0:128, 0:64], value=nl.load(a[0:128, 0:64]))
        return c

    @nki.jit
    def ret_none(a, c):
        nl.store(c[0:128, 0:64], value=nl.load(a[0:128, 0:64]))

    a = _randn((128, 64), np.float32, 16)
    c = np.zeros((128, 64), np.float32)
    r = _run(ret_arg, a, c)
    assert isinstance(r, np.ndarray) and not np.shares_memory(r, c)
    np.testing.assert_array_equal(r, a)
    np.testing.assert_array_equal(c, a)
    c2 = np.zeros((128, 64), np.float32)
    assert _run(ret_none, a, c2) is None
    np.testing.assert_array_equal(c2, a)


def test_lists_and_tuples_of_arrays_are_tensors(hk):
    """A list or tuple of arrays (nested, a namedtuple, items that are not arrays) as an argument: each array is
    an HBM tensor sharing the caller's storage, as a lone array argument is (spec 1.6); the other items stay Python
    values. Before, the list reached the kernel as it was and nl.load of an item failed with E311."""
    m, nki, nl, _ = hk
    Pair = collections.namedtuple("Pair", "a b")

    @nki.jit
    def add_all(xs, pair, scales):
        o = nl.ndarray((128, 64), dtype=xs[0].dtype, buffer=nl.shared_hbm)
        acc = nl.multiply(nl.load(xs[0]), scales[0])
        for x, (y, s) in zip(xs[1:], [(pair.a, scales[1]), (pair.b[0], scales[2])]):
            acc = nl.add(acc, nl.multiply(nl.load(x), s))
            acc = nl.add(acc, nl.load(y))
        nl.store(pair.b[1], value=acc)  # written through the nested tuple: the caller's array sees it
        nl.store(o, value=acc)
        return o

    xs = [_randn((128, 64), np.float32, 20 + i) for i in range(3)]
    a, b0 = _randn((128, 64), np.float32, 30), _randn((128, 64), np.float32, 31)
    b1 = np.zeros((128, 64), np.float32)
    r = _run(add_all, xs, Pair(a, (b0, b1)), (1.0, 2.0, 0.5))
    want = xs[0] + (2.0 * xs[1] + a) + (0.5 * xs[2] + b0)
    np.testing.assert_allclose(r, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(b1, r)


def test_dicts_of_arrays_are_tensors(hk):
    """A dict of arrays (weights by name; inside a list too) as an argument: each array is an HBM tensor sharing the
    caller's storage, named after the argument and its key, and the kernel gets a dict. Before, the dict reached the
    kernel as it was and nl.load of a value failed with E311, whose message printed the whole array."""
    m, nki, nl, _ = hk

    @nki.jit
    def mlp_step(x, params, extras):
        o = nl.ndarray((128, 64), dtype=x.dtype, buffer=nl.shared_hbm)
        acc = nl.add(nl.multiply(nl.load(x), nl.load(params["w1"])), nl.load(params[7]))
        acc = nl.multiply(acc, params["scale"])
        acc = nl.add(acc, nl.load(extras[0]["bias"]))
        nl.store(params["out"], value=acc)  # written through the dict: the caller's array sees it
        nl.store(o, value=acc)
        return o

    x, w1, b7, bias = (_randn((128, 64), np.float32, 40 + i) for i in range(4))
    for scale in (0.5, 2.0):  # the second call reuses the first's loop plan (a dict in the plan key)
        out = np.zeros((128, 64), np.float32)
        r = _run(mlp_step, x, {"w1": w1, 7: b7, "scale": scale, "out": out}, [{"bias": bias}])
        want = (x * w1 + b7) * scale + bias
        np.testing.assert_allclose(r, want, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(out, r)


def test_a_host_array_in_the_kernel_is_named_by_shape(hk):
    """A numpy array the kernel was not passed (a module-level constant) where a tensor belongs: E311 gives its shape
    and dtype and what makes it a tensor, not the repr of every value."""
    m, nki, nl, _ = hk
    const = np.ones((128, 64), np.float32)

    @nki.jit
    def uses_global(a):
        o = nl.ndarray((128, 64), dtype=a.dtype, buffer=nl.shared_hbm)
        nl.store(o, value=nl.multiply(nl.load(a), nl.load(const)))
        return o

    with pytest.raises(_core.OperandError) as e:
        uses_global(np.ones((128, 64), np.float32))
    msg = str(e.value)
    assert msg.startswith("NSIM-E311: nl.load: src must be a tensor, got a host numpy array of shape (128, 64) "
                          "and dtype float32"), msg
    assert "pass it as one" in msg and "array(" not in msg and len(msg) < 400, msg


def test_a_float64_argument_is_refused_with_the_fix(hk):
    """numpy's default dtype (np.random.rand gives float64) is not a NeuronCore dtype: E302 lists the dtypes and
    says which cast fixes it (its hint refers to the list, which the message did not give before)."""
    m, nki, nl, _ = hk
    for dt, want in ((np.float64, "float32"), (np.int64, "int32")):
        with pytest.raises(_core.OperandError) as e:
            _run(m.add_sub_kernel, np.ones((128, 64), dt), np.ones((128, 64), dt))
        msg = str(e.value)
        assert msg.startswith("NSIM-E302: dtype {} is not supported".format(np.dtype(dt).name)), msg
        assert "bfloat16" in msg and "convert the array with .astype(np.{})".format(want) in msg, msg


def test_scalars_kwargs_and_bf16(hk):
    m, nki, nl, _ = hk

    @nki.jit()
    def scaled(a, scale=2.0, *, flag=True):
        o = nl.ndarray((128, 64), dtype=a.dtype, buffer=nl.shared_hbm)
        nl.store(o, value=nl.multiply(nl.load(a[0:128, 0:64]), scale if flag else 1.0))
        return o

    a = _randn((128, 64), np.float32, 17)
    np.testing.assert_array_equal(_run(scaled, a), a * 2)
    np.testing.assert_array_equal(_run(scaled, a, scale=4.0), a * 4)
    np.testing.assert_array_equal(_run(nki.simulate_kernel, scaled, a, 5.0, flag=False), a)
    for dt in (np.float16, np.int32, np.int8):
        x = (a * 10).astype(dt)
        s, _ = _run(m.add_sub_kernel, x, x)
        assert s.dtype == np.dtype(dt)
        np.testing.assert_array_equal(s, (_f64(x) * 2).astype(dt))
    np.testing.assert_array_equal(_run(m.add_sub_kernel, a=a, b=a)[0], a + a)  # arrays as keywords
    ab = a.astype(BF16)
    s, d = _run(m.add_sub_kernel, ab, ab)
    assert s.dtype == BF16 and d.dtype == BF16
    np.testing.assert_array_equal(_f64(s), _f64((_f64(ab) * 2).astype(BF16)))
    np.testing.assert_array_equal(_f64(d), 0.0)


# --------------------------------------------------------------------------------------------------
# Sub-kernels, host wrappers, tile_size
# --------------------------------------------------------------------------------------------------

def test_helper_sub_kernels(hk):
    m, nki, nl, _ = hk
    x = _randn((128, 200), np.float32, 18)
    close(_run(m.softmax_helper_kernel, x), ref_softmax(x))

    @nki.jit(mode="trace")
    def triple(t):
        return nl.multiply(t, 3.0)

    @nki.jit
    def use(a):
        o = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        nl.store(o, value=triple(nl.load(a)))
        return o

    np.testing.assert_array_equal(_run(use, x), x * 3)


@pytest.mark.parametrize("shape", [(3, 100, 64), (300, 128), (128, 1000)])
def test_host_wrapper_softmax(hk, shape):
    """numpy pre/post-processing around the kernel call (flatten, cast, reshape back); ragged tiles masked."""
    m = hk[0]
    x = _randn(shape, np.float64, sum(shape))
    out = _run(m.softmax_rows, x)
    assert out.shape == shape and out.dtype == np.float32
    close(out, ref_softmax(x.astype(np.float32)))


def test_tile_size_constants(hk, hkn):
    bnl = hk[2]
    import nki.language as nnl
    for tl in (bnl.tile_size, nnl.tile_size):
        assert tl.pmax == 128 and tl.gemm_stationary_fmax == 128 and tl.gemm_moving_fmax == 512
        assert tl.psum_fmax == 512 and tl.bn_stats_fmax == 512
    assert nnl.tile_size.psum_bank_fmax == 512 and nnl.tile_size.psum_bank_fmax_bytes == 2048
    assert nnl.tile_size.psum_num_banks == 8


@pytest.mark.parametrize("M,K,N", [(128, 128, 512), (256, 384, 1024)])
def test_matmul_tiled_by_tile_size(hk, hkn, M, K, N):
    lhsT = _randn((K, M), np.float32, M + K)
    rhs = _randn((K, N), np.float32, N)
    want = _f64(lhsT).T @ _f64(rhs)
    for k in (hk[0].matmul_kernel, hkn[0].matmul_kernel):
        out = _run(k, lhsT, rhs)
        assert out.shape == (M, N)
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)
    from conftest import op_counts
    assert op_counts(hk[0].matmul_kernel)["nc_matmul"] == (M // 128) * (N // 512) * (K // 128)


# --------------------------------------------------------------------------------------------------
# benchmark / profile
# --------------------------------------------------------------------------------------------------

def test_benchmark_result(hk):
    m, nki, nl, _ = hk
    lhsT = _randn((256, 128), np.float32, 19)
    rhs = _randn((256, 1024), np.float32, 20)
    p50, p99 = _run(m.benchmark_matmul, lhsT, rhs)
    assert isinstance(p50, float) and p50 > 0 and p50 == p99
    bench = nki.benchmark(kernel=m.matmul_kernel, warmup=2, iters=3)
    assert bench.benchmark_result is None
    out = _run(bench, lhsT, rhs)
    np.testing.assert_allclose(out, _f64(lhsT).T @ _f64(rhs), rtol=1e-4, atol=1e-4)
    lat = bench.benchmark_result.nc_latency
    vals = [lat.get_latency_percentile(p) for p in (0, 1, 10, 25, 50, 90, 99, 100)]
    assert len(set(vals)) == 1
    assert vals[0] == pytest.approx(bench.last_profile.total_time_ns / 1000.0)
    assert vals[0] == pytest.approx(p50)
    # a benchmark kernel launched on a grid records its result on the benchmark object
    b = _randn((256, 1024), np.float32, 21)
    bk = nki.benchmark(warmup=1, iters=1)(m.tensor_add_kernel)
    np.testing.assert_array_equal(_run(bk[2, 2], b, b), 2 * b)
    assert bk.benchmark_result.nc_latency.get_latency_percentile(50) > 0

    @nki.benchmark(warmup=2, iters=3, save_neff_name="copy.neff")
    def bdeco(x):
        o = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(o, value=nl.load(x))
        return o

    x = _randn((128, 64), np.float32, 33)
    np.testing.assert_array_equal(_run(nki.simulate_kernel, bdeco, x), x)
    assert bdeco.benchmark_result.nc_latency.get_latency_percentile(50) == pytest.approx(
        bdeco.last_profile.total_time_ns / 1000.0)


def test_profile_writes_files(hk, tmp_path):
    m, nki, nl, _ = hk
    a = _randn((256, 1024), np.float32, 22)
    k = nki.profile(working_directory=str(tmp_path / "prof"), save_trace_name="add.ntff")(m.tensor_add_kernel)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = k[2, 2](a, a)
    np.testing.assert_array_equal(out, 2 * a)
    files = sorted(os.listdir(tmp_path / "prof"))
    assert files == ["add.analysis.txt", "add.pftrace"]
    assert os.path.getsize(tmp_path / "prof" / "add.pftrace") > 0
    # without a working directory: runs, writes nothing
    np.testing.assert_array_equal(_run(nki.profile(m.add_sub_kernel), a[:128], a[:128])[0], 2 * a[:128])


# --------------------------------------------------------------------------------------------------
# New dialect
# --------------------------------------------------------------------------------------------------

def test_new_add_launch_forms(hkn):
    m = hkn[0]
    import nki
    import nki.language as nl
    a = _randn((512, 256), np.float32, 23)
    b = _randn((512, 256), np.float32, 24)
    for launch in (m.add_kernel, m.add_kernel[1], m.add_kernel[2], m.add_kernel[nl.nc(2)],
                   nki.simulate(m.add_kernel), nki.simulate(m.add_kernel)[2], nki.simulate(m.add_kernel[2])):
        out = _run(launch, a, b)
        assert isinstance(out, np.ndarray) and out.dtype == np.float32
        np.testing.assert_array_equal(out, a + b)
    np.testing.assert_array_equal(_run(nki.simulate_kernel, m.add_kernel, a, b), a + b)


def test_new_keyword_call_and_argument_writes(hkn):
    """``nki.cpu_simulate(k)[lnc](**kwargs)`` (the nki-library harness: keyword-only) and a new-dialect kernel
    writing an argument through ``nki.simulate`` (numpy updated in place, None returned)."""
    m = hkn[0]
    import nki
    import nki.isa as nisa
    import nki.language as nl
    a = _randn((512, 128), np.float32, 30)
    b = _randn((512, 128), np.float32, 31)
    for lnc in (1, 2):
        np.testing.assert_array_equal(_run(nki.cpu_simulate(m.add_kernel)[lnc], a=a, b=b), a + b)

    @nki.jit
    def copy_into(x, y):
        t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        nisa.dma_copy(dst=y, src=t)

    x = _randn((128, 64), np.float32, 32)
    y = np.zeros_like(x)
    assert _run(nki.simulate(copy_into), x, y) is None
    np.testing.assert_array_equal(y, x)


def test_new_misuse_errors(hkn):
    m = hkn[0]
    import nki
    for g in (8, (1, 1), 0):
        with pytest.raises(_core.NsimError, match="NSIM-E435"):
            m.add_kernel[g]
    with pytest.raises(_core.NsimError, match="NSIM-E446"):
        nki.benchmark(m.add_kernel)


def test_new_returns_and_simulate(hkn):
    m = hkn[0]
    import nki
    x = _randn((128, 64), np.float32, 25)
    y = _randn((128, 64), np.float32, 26)
    for r in (_run(m.transpose_add_kernel, x, y), _run(nki.simulate(m.transpose_add_kernel.fn), x, y)):
        assert type(r) is tuple and len(r) == 2
        np.testing.assert_array_equal(r[0], x.T)
        np.testing.assert_array_equal(r[1], x + y)
    ret, prof = m.transpose_add_kernel.simulate(x, y)
    assert type(ret) is tuple and prof.total_time_ns > 0
    assert m.transpose_add_kernel.last_profile is prof


def test_new_softmax_wrapper_and_helper(hkn):
    m = hkn[0]
    x = _randn((2, 100, 96), np.float32, 27)
    close(_run(m.softmax_last_axis, x), ref_softmax(x))
    x2 = _randn((100, 96), np.float32, 28)
    close(_run(m.softmax_helper_kernel, x2), ref_softmax(x2))


def test_new_jit_deprecated_kwargs_warn_once(hkn):
    """The fix: ``@nki.jit(mode=...)`` warned twice, with a DeprecationWarning (hidden by default) instead of
    ``nki.NkiWarning`` (spec 4.1, which did not exist); ``platform_target=`` (deprecated too, spec 1.3) not at all.
    Both still work: the kernel runs, platform_target picks the preset."""
    m = hkn[0]
    import nki
    for kw, cfg in ((dict(mode="simulation"), "trn2"), (dict(platform_target="trn1"), "trn1")):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            k = nki.jit(**kw)(m.transpose_add_kernel.fn)
        assert len(caught) == 1 and list(kw)[0] in str(caught[0].message), [str(w.message) for w in caught]
        assert issubclass(caught[0].category, nki.NkiWarning) and issubclass(nki.NkiWarning, UserWarning)
        assert k.config == cfg
        x = _randn((128, 32), np.float32, 29)
        np.testing.assert_array_equal(_run(k, x, x)[1], 2 * x)
    # spec 4.1: the hardware rules nsim checks warn with it too (the sanitizer's reports are NkiWarnings)
    from nsim import tracer
    assert issubclass(tracer.CheckWarning, nki.NkiWarning)


def test_torch_tensors_in(hk, hkn):
    torch = pytest.importorskip("torch")
    m, nki, nl, _ = hk
    a = torch.randn(256, 1024)
    b = torch.randn(256, 1024)
    out = m.tensor_add_kernel[2, 2](a, b)
    np.testing.assert_allclose(np.asarray(out), (a + b).numpy(), rtol=1e-6)
    import nki as nnki
    out = nnki.simulate(hkn[0].add_kernel)(a[:256, :256].contiguous(), b[:256, :256].contiguous())
    assert isinstance(out, torch.Tensor)
    np.testing.assert_allclose(out.numpy(), (a[:256, :256] + b[:256, :256]).numpy(), rtol=1e-6)
    c = torch.zeros(256, 1024)
    assert nki.simulate_kernel(m.add_out_kernel, a, b, c) is None
    np.testing.assert_allclose(c.numpy(), (a + b).numpy(), rtol=1e-6)


def test_returning_a_private_hbm_tensor_warns_in_the_new_dialect(hkn):
    """Spec 1.3: NKI 0.3+ rejects returning an ``nl.hbm`` (private_hbm) output; nsim runs it with an NkiWarning (it
    gave none). A ``shared_hbm`` output does not warn (the check is the new dialect's: Beta 1 is not checked)."""
    import nki
    import nki.isa as nisa
    import nki.language as nl

    def make(buffer):
        @nki.jit
        def k(a):
            out = nl.ndarray(a.shape, a.dtype, buffer=buffer)
            t = nl.ndarray(a.shape, a.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=t, src=a)
            nisa.dma_copy(dst=out, src=t)
            return out
        return k

    a = _randn((128, 8), np.float32, 40)
    for buffer, warns in ((nl.hbm, True), (nl.private_hbm, True), (nl.shared_hbm, False)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            np.testing.assert_array_equal(make(buffer)(a), a)
        got = [w for w in caught if issubclass(w.category, nki.NkiWarning)]
        assert len(got) == (1 if warns else 0), [str(w.message) for w in caught]
        if warns:
            assert "nl.hbm (private_hbm) tensor" in str(got[0].message) and "shared_hbm" in str(got[0].message)
