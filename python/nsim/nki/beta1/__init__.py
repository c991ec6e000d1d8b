"""nsim's implementation of the Beta-1 NKI dialect (``import neuronxcc.nki as nki``; SDK <= 2.26).

    import nsim.compat; nsim.compat.install()
    import neuronxcc.nki as nki
    import neuronxcc.nki.language as nl
    import neuronxcc.nki.isa as nisa

    @nki.jit
    def add(a, b, c):
        i_p = nl.arange(128)[:, None]; i_f = nl.arange(512)[None, :]
        x = nl.load(a[i_p, i_f]); y = nl.load(b[i_p, i_f])
        nl.store(c[i_p, i_f], value=x + y)

    nki.simulate_kernel(add, a, b, c)       # c is updated in place
    add[2, 2](a, b, c)                      # a launch grid: 4 instances run one after the other

The Beta-1 modules share the tracer and the instruction lowering of the new dialect (``nsim.nki``):
value-returning functions allocate a fresh result tile and call the dst-passing instruction.
"""
from __future__ import annotations

import functools
import itertools
import operator

from ... import _kernel
from ... import tracer as _tracer
from ...tracer import (NsimError, ConfigError, AccessError, OperandError, KernelError,  # noqa: F401
                       InternalError)
from . import language, isa, typing, compiler  # noqa: F401
from .language import Tensor as _Tensor

__all__ = ["jit", "trace", "Kernel", "simulate_kernel", "baremetal", "benchmark", "profile", "language", "isa",
           "typing", "compiler", "NsimError", "KernelError"]

def _grid_dims(grid):
    """(sizes, physical cores per dim: the ``nl.nc`` factors) of a launch grid."""
    if not isinstance(grid, tuple):
        grid = (grid,)
    dims, cores = [], []
    for g in grid:
        try:
            n = operator.index(g)  # int() would truncate 2.5 or parse "2": no grid size
        except TypeError:
            raise _tracer.make_error("BadLaunchGrid", "launch grid sizes must be integers, got {!r}".format(
                grid)) from None
        if n < 1:
            raise _tracer.make_error("BadLaunchGrid", "launch grid sizes must be >= 1, got {}".format(
                grid))
        c = int(getattr(g, "lnc_cores", 1))
        if c < 1 or n % c:
            raise _tracer.make_error("BadLaunchGrid", "grid dim {} is not a multiple of its nl.nc({}) factor".format(
                n, c))
        dims.append(n)
        cores.append(c)
    total = 1
    for c in cores:
        total *= c
    if total > 2:
        raise _tracer.make_error("BadLaunchGrid", "the nl.nc factors of grid {} ask for {} physical cores; a logical "
                                 "core has at most 2 (LNC=2)".format(tuple(int(g) for g in grid), total))
    return tuple(dims), tuple(cores)


def _core_of(ids, grid, cores):
    """The physical core of the instance ``ids``: along a dim of size n with k cores, the instances come
    in k contiguous blocks of n/k, block j on core j (mixed radix over the dims)."""
    core = 0
    for i, n, k in zip(ids, grid, cores):
        core = core * k + (i * k) // n
    return core


def _run_grid(tr, fn, grid, args, kwargs, st, ids=()):
    """Run the instances of a launch grid one after the other (``ids``: the program ids of the dims before).
    Each dim of more than one instance is a loop the tracer keeps where it can (Tracer.symbolic_loop: the
    instances' statements recorded once, with the program id symbolic), as a ``sequential_range`` of the
    kernel would be: an unrolled public kernel (Python ``if`` on its loop indices) launched on a [1, 8] grid is
    traced once, not eight times. Where an instance's statements depend on its program id (a Python ``if`` on
    it, an HBM tensor of its own), the tracer unrolls the dim's loop, as the instances ran before."""
    d = len(ids)
    if d == len(grid):
        st["ids"], st["shared_k"] = ids, 0
        return fn(*args, **kwargs)
    r = range(grid[d])
    it = None
    code = getattr(fn, "__code__", None)
    if grid[d] > 1 and code is not None:
        loc = {"file": code.co_filename, "line": code.co_firstlineno, "function": code.co_name}
        it = tr.symbolic_loop(r, "sequential", key=(code.co_filename, code.co_firstlineno, _tracer.GRID_LOOP, d),
                              loc=loc, name="pid{}".format(d) if len(grid) > 1 else "pid")
    ret = None
    for i in (r if it is None else it):
        ret = _run_grid(tr, fn, grid, args, kwargs, st, ids + (i,))
    return ret


class Kernel(_kernel.Kernel):
    """A Beta-1 kernel (``@nki.jit``, ``nki.baremetal``, ``nki.benchmark``, ``nki.trace``): the shared
    :class:`nsim._kernel.Kernel` (``.simulate``, ``.options``, ``.with_schedule``) plus launch grids:
    ``kernel[g0, g1](*arrays)`` runs ``g0 * g1`` instances one after the other."""

    _tensor_cls = _Tensor

    def __init__(self, fn, grid=(), **kwargs):
        grid = grid or getattr(fn, "grid", ())
        super().__init__(fn, **kwargs)
        self.grid = grid
        self.grid_cores = getattr(fn, "grid_cores", None) or (1,) * len(grid)
        self.benchmark_result = None

    def __getitem__(self, grid):
        dims, cores = _grid_dims(grid)
        return self._derive(grid=dims, grid_cores=cores)

    def _cores(self):
        n = 1
        for c in getattr(self, "grid_cores", ()):
            n *= c
        return n

    def _launch_fn(self):
        fn, grid = self.fn, self.grid
        cores = getattr(self, "grid_cores", (1,) * len(grid))
        if not grid:
            return fn

        @functools.wraps(fn)
        def launch(*args, **kwargs):
            tr = _tracer.current()
            st = tr.dialect_state
            st["grid"], st["shared"] = grid, []
            me, lnc = getattr(tr, "lnc", (0, 1))
            ret = None
            try:
                if lnc > 1:
                    for ids in itertools.product(*(range(g) for g in grid)):
                        if _core_of(ids, grid, cores) != me:
                            continue  # another physical core's instance (LNC=2: nl.nc in the grid)
                        st["ids"], st["shared_k"] = ids, 0
                        ret = fn(*args, **kwargs)
                else:
                    ret = _run_grid(tr, fn, grid, args, kwargs, st)
            finally:
                for k in ("grid", "ids", "shared", "shared_k"):
                    st.pop(k, None)
            return ret

        # The same launch for every derived kernel of this function and grid (kernel[1, 8] makes a new one each
        # time): the tracer's loop plans are kept per traced function (tracer._plan_key), so a repeated trace
        # starts from the loop decisions of the last one instead of finding them again by retries.
        launch.nsim_plan_id = (fn, grid, tuple(cores))
        return launch

    def _check_inline(self):
        if self.grid:
            raise _tracer.make_error("NestedKernel", "err_nested_kernel_with_spmd_grid: a kernel "
                                     "with a launch grid cannot be called from inside another kernel")


class _Latency:
    def __init__(self, us):
        self._us = float(us)

    def get_latency_percentile(self, p):
        return self._us

    def __repr__(self):
        return "nc_latency({} us)".format(self._us)


class BenchmarkResult:
    """``kernel.benchmark_result``: ``.nc_latency.get_latency_percentile(p)`` in µs (nsim's timing model:
    one deterministic run, so every percentile is the same)."""

    def __init__(self, us):
        self.nc_latency = _Latency(us)


class BenchmarkKernel(Kernel):
    """``nki.benchmark(...)``: runs once on nsim and records the simulated latency."""

    def _after_run(self, prof):
        if prof is not None:
            ns = getattr(prof, "total_time_ns", None)
            if ns is None and isinstance(prof, dict):
                ns = prof.get("total_time_ns")
            self._record(benchmark_result=BenchmarkResult(float(ns or 0.0) / 1000.0))


class ProfileKernel(Kernel):
    """``nki.profile(working_directory=, save_trace_name=, ...)``: runs once on nsim and writes the run's profile
    into ``working_directory`` (created if missing): the Perfetto timeline ``<name>.pftrace`` (open it in
    ui.perfetto.dev) and ``nsim analyze``'s report ``<name>.analysis.txt`` (bounds, critical path, findings by
    source line), where ``<name>`` is ``save_trace_name`` without its extension (default: the kernel's name).
    Existing files are overwritten; ``save_neff_name``, ``profile_nth`` and ``additional_compile_opt`` have no
    effect (there is no NEFF, and every run of nsim is the same)."""

    def profile_paths(self):
        """(trace path, report path), or None without a working_directory."""
        import os
        wd = self.kwargs.get("working_directory")
        if not wd:
            return None
        name = self.kwargs.get("save_trace_name") or getattr(self.fn, "__name__", "kernel")
        stem = os.path.splitext(os.path.basename(str(name)))[0] or "profile"
        return os.path.join(str(wd), stem + ".pftrace"), os.path.join(str(wd), stem + ".analysis.txt")

    def _effective(self, legacy=None):
        eff = super()._effective(legacy)
        paths = self.profile_paths()
        if paths is not None and not eff.get("trace"):
            import os
            os.makedirs(os.path.dirname(paths[0]) or ".", exist_ok=True)
            eff["trace"] = paths[0]
        return eff

    def _after_run(self, prof):
        paths = self.profile_paths()
        if prof is None or paths is None:
            return
        import sys
        with open(paths[1], "w") as f:
            f.write(str(prof.analyze()))
        print("nsim: profile of {} written to {} and {}".format(getattr(self.fn, "__name__", "kernel"), *paths),
              file=sys.stderr)


def _deco(cls, kernel, kwargs):
    if kernel is None:
        return lambda f: _deco(cls, f, kwargs)
    if isinstance(kernel, cls) and not kwargs:
        return kernel
    return cls(kernel, **kwargs)


def jit(kernel=None, **kwargs):
    """``@nki.jit``, ``@nki.jit(mode=..., platform_target=...)`` or ``nki.jit(fn, **kw)``. Beta-1 kwargs are
    accepted; ``platform_target`` picks the nsim preset; every mode simulates on nsim."""
    return _deco(Kernel, kernel, kwargs)


def trace(kernel=None, **kwargs):
    """``@nki.trace``: a sub-kernel (runs inline when called from inside a kernel)."""
    return _deco(Kernel, kernel, kwargs)


def baremetal(kernel=None, **kwargs):
    """``nki.baremetal(kernel, **kw)`` / ``@nki.baremetal(**kw)``: same as simulate_kernel (no device).
    ``save_neff_name``, ``save_trace_name``, ``additional_compile_opt``, ``artifacts_dir`` are ignored."""
    return _deco(Kernel, kernel, kwargs)


def benchmark(kernel=None, warmup=10, iters=100, **kwargs):
    """``nki.benchmark(kernel=None, warmup=10, iters=100, **kw)``: runs once on nsim; sets
    ``kernel.benchmark_result.nc_latency.get_latency_percentile(p)`` (µs) from nsim's timing model."""
    return _deco(BenchmarkKernel, kernel, kwargs)


def profile(kernel=None, working_directory=None, **kwargs):
    """``nki.profile(...)``: runs once on nsim and writes its timeline and analysis into ``working_directory``
    (:class:`ProfileKernel`)."""
    if working_directory is not None:
        kwargs["working_directory"] = working_directory
    return _deco(ProfileKernel, kernel, kwargs)


@_tracer.user_facing
def simulate_kernel(kernel, *args, **kwargs):
    """``nki.simulate_kernel(kernel, *args)``: run on nsim, return numpy, update written numpy args."""
    return _as_kernel(kernel)(*args, **kwargs)


def _as_kernel(kernel):
    return kernel if isinstance(kernel, _kernel.Kernel) else Kernel(kernel)


def simulate(kernel):
    return _as_kernel(kernel)


def _tensor_type():
    from .language import Tensor
    return Tensor


#: ``nki.tensor``: the type of Beta-1 kernel tensors and views
tensor = _tensor_type()

