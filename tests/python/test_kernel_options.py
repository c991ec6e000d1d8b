"""The kernel's arguments are the kernel's (issue 10, item 3): kernel(*args, **kwargs) and
kernel.simulate(*args, **kwargs) pass every argument to the kernel; nsim options come from
kernel.options(...) and `with nsim.options(...)`; the old keyword style is deprecated; unknown keywords
of the public nisa/nl functions raise TypeError. Both dialects."""
import dataclasses
import inspect
import warnings

import numpy as np
import pytest

from conftest import require_core  # noqa: E402

_core, ml_dtypes = require_core()

import nsim  # noqa: E402
from nsim import _kernel  # noqa: E402
from nsim import nki  # noqa: E402
import nsim.nki.language as nl  # noqa: E402
import nsim.nki.isa as nisa  # noqa: E402
import nsim.nki.beta1 as nki1  # noqa: E402
import nsim.nki.beta1.language as nl1  # noqa: E402
import nsim.nki.beta1.isa as nisa1  # noqa: E402


def _x(shape=(128, 64), seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# --------------------------------------------------------------------------------------------------
# kernels: the same computations in both dialects
# --------------------------------------------------------------------------------------------------


def _new_add(x, value):
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=float(value))
    nisa.dma_copy(dst=out, src=t)
    return out


def _b1_add(x, value):
    out = nl1.ndarray(x.shape, x.dtype, buffer=nl1.shared_hbm)
    nl1.store(out, value=nl1.load(x) + float(value))
    return out


@dataclasses.dataclass(frozen=True)
class FlashConfig:
    scale: float = 1.0
    shift: float = 0.0


def _make(dialect):
    jit, add = (nki.jit, _new_add) if dialect == "new" else (nki1.jit, _b1_add)

    @jit
    def seeded(x, seed=0):
        return add(x, seed)

    @jit
    def flash(q, k, v, seed, config=FlashConfig()):
        return add(q, config.scale * 10 + config.shift + seed)

    @jit
    def timed(x, timing_only=False):
        return add(x, 100.0 if timing_only else 0.0)

    @jit
    def plain(x):
        return add(x, 1.0)

    @jit
    def with_kwargs(x, **kw):
        return add(x, sum(kw.values()))

    @jit
    def pair(x):
        return add(x, 1.0), 7

    return dict(seeded=seeded, flash=flash, timed=timed, plain=plain, with_kwargs=with_kwargs, pair=pair)


@pytest.fixture(params=["new", "beta1"])
def K(request):
    return _make(request.param)


# --------------------------------------------------------------------------------------------------
# the kernel's own arguments
# --------------------------------------------------------------------------------------------------


def test_seed_reaches_the_kernel(K):
    x = _x()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_allclose(K["seeded"](x, seed=5), x + 5, rtol=1e-6)
        y, prof = K["seeded"].simulate(x, seed=5)
        np.testing.assert_allclose(y, x + 5, rtol=1e-6)
        assert isinstance(prof, nsim.Profile)
        y, prof = nsim.simulate(K["seeded"], x, seed=3)
        np.testing.assert_allclose(y, x + 3, rtol=1e-6)


def test_dataclass_config_reaches_the_kernel(K):
    q, k, v = _x(seed=1), _x(seed=2), _x(seed=3)
    cfg = FlashConfig(scale=0.5, shift=2.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_allclose(K["flash"](q, k, v, 1, config=cfg), q + 8.0, rtol=1e-6)
        y, prof = K["flash"].simulate(q, k, v, 1, config=cfg)
        np.testing.assert_allclose(y, q + 8.0, rtol=1e-6)
        assert prof.config == "trn2"  # the kernel's config is not nsim's
        np.testing.assert_allclose(K["flash"](q, k, v, 0), q + 10.0, rtol=1e-6)


def test_timing_only_parameter_reaches_the_kernel(K):
    x = _x()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y = K["timed"](x, timing_only=True)
        assert y is not None
        np.testing.assert_allclose(y, x + 100, rtol=1e-6)
        y, prof = K["timed"].simulate(x, timing_only=True)
        assert not prof.timing_only
        np.testing.assert_allclose(y, x + 100, rtol=1e-6)


def test_kernel_kwargs_take_everything(K):
    x = _x()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_allclose(K["with_kwargs"](x, seed=2, config=3), x + 5, rtol=1e-6)


# --------------------------------------------------------------------------------------------------
# nsim options
# --------------------------------------------------------------------------------------------------


def test_options_returns_a_configured_kernel(K):
    x = _x()
    k = K["plain"]
    ko = k.options(timing_only=True)
    assert type(ko) is type(k) and callable(ko)
    assert all(hasattr(ko, a) for a in ("simulate", "options", "with_schedule"))
    y, prof = ko.simulate(x)
    assert y is None and isinstance(prof, nsim.Profile) and prof.timing_only and prof.total_time_ns > 0
    assert ko(x) is None
    # a non-tensor return value survives timing_only
    y, prof = K["pair"].options(timing_only=True).simulate(x)
    assert y == (None, 7)
    # the original kernel is unchanged; options stack
    np.testing.assert_allclose(k(x), x + 1, rtol=1e-6)
    k3 = ko.options(config="trn3")
    _, prof = k3.simulate(x)
    assert prof.config == "trn3" and prof.timing_only
    assert k3.config == "trn3" and k.config == "trn2"
    with pytest.raises(TypeError, match="bogus"):
        k.options(bogus=1)


def test_options_trace_and_overrides(K, tmp_path):
    x = _x()
    path = tmp_path / "t.json"
    _, prof = K["plain"].options(trace=str(path), overrides={"hbm.bw": "100GB/s"}, seed=3).simulate(x)
    assert path.exists() and prof.overrides == ["hbm.bw=100GB/s"]


def test_nsim_options_context(K):
    x = _x()
    k = K["plain"]
    with nsim.options(config="trn1"):
        _, prof = k.simulate(x)
        assert prof.config == "trn1" and k.config == "trn1"
        with nsim.options(timing_only=True):
            y, prof = k.simulate(x)
            assert prof.config == "trn1" and prof.timing_only and y is None
            with nsim.options(config="trn3"):
                assert k.simulate(x)[1].config == "trn3"
        y, prof = k.simulate(x)
        assert prof.config == "trn1" and not prof.timing_only
        np.testing.assert_allclose(y, x + 1, rtol=1e-6)
        # kernel.options wins over the block's defaults
        assert k.options(config="trn2").simulate(x)[1].config == "trn2"
        assert nsim.simulate(k, x)[1].config == "trn1"
    assert k.simulate(x)[1].config == "trn2"


def test_platform_target_sets_the_config():
    jit = nki1.jit(platform_target="trn3")
    k = jit(_make("beta1")["plain"])
    assert k.config == "trn3"
    assert k.simulate(_x())[1].config == "trn3"


# --------------------------------------------------------------------------------------------------
# the deprecated keyword style
# --------------------------------------------------------------------------------------------------


def test_deprecated_option_keywords(K):
    x = _x()
    k = K["plain"]
    with pytest.warns(DeprecationWarning, match="config") as rec:
        y, prof = k.simulate(x, config="trn1")
    assert prof.config == "trn1"
    np.testing.assert_allclose(y, x + 1, rtol=1e-6)
    assert rec[0].filename == __file__  # attributed to the caller's line
    with pytest.warns(DeprecationWarning, match="timing_only"):
        assert k(x, timing_only=True) is None
    with pytest.warns(DeprecationWarning):
        _, prof = k.simulate(x, seed=1, overrides=["hbm.bw=100GB/s"])
    assert prof.overrides == ["hbm.bw=100GB/s"]
    # only the keywords the kernel does not take are options: seeded takes seed, not config
    with pytest.warns(DeprecationWarning) as rec:
        y, prof = K["seeded"].simulate(x, seed=2, config="trn3")
    assert prof.config == "trn3" and "seed" not in str(rec[0].message)
    np.testing.assert_allclose(y, x + 2, rtol=1e-6)


def test_none_valued_option_keywords_are_dropped_quietly(K):
    x = _x()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y, _ = K["plain"].simulate(x, config=None)
    np.testing.assert_allclose(y, x + 1, rtol=1e-6)


# --------------------------------------------------------------------------------------------------
# one implementation, strict keywords
# --------------------------------------------------------------------------------------------------


def test_one_kernel_class_for_both_dialects():
    for cls in (nki.Kernel, nki1.Kernel, nki1.BenchmarkKernel):
        assert issubclass(cls, _kernel.Kernel)
        for name in ("simulate", "options", "with_schedule", "__call__", "trace", "to_json"):
            assert name not in vars(cls), (cls, name)
    for deco in (nki1.jit, nki1.trace, nki1.baremetal, nki1.profile, nki1.benchmark, nki.jit):
        assert isinstance(deco(_new_add), _kernel.Kernel)


def test_nsim_simulate_plain_function():
    x = _x()
    y, prof = nsim.simulate(_new_add, x, 4)
    np.testing.assert_allclose(y, x + 4, rtol=1e-6)
    assert isinstance(prof, nsim.Profile)


def _public_functions(mod):
    for name, obj in sorted(vars(mod).items()):
        if name.startswith("_"):
            continue
        if isinstance(obj, nl.OpCode) or (inspect.isfunction(obj) and obj.__module__.startswith("nsim.nki")):
            yield name, obj


@pytest.mark.parametrize("mod", [nisa, nl, nisa1, nl1], ids=lambda m: m.__name__)
def test_unknown_keywords_raise_type_error(mod):
    names = []
    for name, fn in _public_functions(mod):
        with pytest.raises(TypeError) as ei:
            fn(nsim_bogus_keyword=1)
        msg = str(ei.value)
        shown = fn.name if isinstance(fn, nl.OpCode) else name  # nl.identity is the op code nl.copy
        assert "nsim_bogus_keyword" in msg and shown + "()" in msg, (name, msg)
        names.append(name)
    assert len(names) > 20


def test_documented_but_ignored_keywords_are_accepted():
    sig = inspect.signature(nisa.dma_copy)
    assert "dst_rmw_op" in sig.parameters and "name" in sig.parameters
    for fn, kws in ((nisa1.nc_matmul, ("perf_mode", "accumulate", "name")),
                    (nisa1.activation, ("name", "mask", "dtype")),
                    (nisa1.dma_copy, ("engine", "name"))):
        params = inspect.signature(fn).parameters
        assert all(k in params for k in kws), fn
    assert all(p.kind is not p.VAR_KEYWORD for p in inspect.signature(nisa1.activation).parameters.values())


def test_ndarray_address_places_the_tile():
    """nl.ndarray(address=(partition_offset, free_offset_bytes)) reaches the allocator as the tile's
    byte offset (docs/timing-model.md "Memory allocation"); values stay right."""
    import numpy as np
    from nsim import nki
    import nsim.nki.language as nl
    import nsim.nki.isa as nisa

    @nki.jit
    def placed(x):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray((128, 64), x.dtype, buffer=nl.sbuf, address=(0, 4096))
        nisa.dma_copy(dst=t, src=x)
        nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=1.0)
        nisa.dma_copy(dst=out, src=t)
        return out

    x = np.arange(128 * 64, dtype=np.float32).reshape(128, 64)
    allocs = [s["alloc"] for s in placed.to_json(x)["body"] if "alloc" in s]
    assert [a.get("address") for a in allocs] == [4096]
    np.testing.assert_allclose(placed(x), x + 1)
    with pytest.raises(ValueError):
        @nki.jit
        def bad(x):
            nl.ndarray((128, 64), x.dtype, buffer=nl.sbuf, address=(0, -8))
            return x
        bad.to_json(x)


def test_an_output_returned_twice_gives_two_independent_arrays():
    # The core's output arrays are handed out without a copy; a second reference to the same output
    # tensor gets its own array, so changing one returned array never changes the other.
    @nki.jit
    def twice(x):
        out = _new_add(x, 1.0)
        return out, out

    x = _x()
    a, b = twice(x)
    np.testing.assert_array_equal(a, x + 1.0)
    np.testing.assert_array_equal(b, x + 1.0)
    assert not np.shares_memory(a, b)
    a[0, 0] = -7.0
    assert b[0, 0] == x[0, 0] + 1.0
