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

import numpy as np

from ... import tracer as _tracer
from ...tracer import (NsimError, ConfigError, AccessError, OperandError, KernelError,  # noqa: F401
                       InternalError)
from .. import _PLATFORM
from . import language, isa, typing, compiler  # noqa: F401
from .language import Tensor as _Tensor

__all__ = ["jit", "trace", "Kernel", "simulate_kernel", "baremetal", "benchmark", "profile", "language", "isa",
           "typing", "compiler", "NsimError", "KernelError"]

_SIM_KW = ("config", "overrides", "timing_only", "seed")


def _grid_dims(grid):
    if not isinstance(grid, tuple):
        grid = (grid,)
    dims = []
    for g in grid:
        n = int(g)
        if n < 1:
            raise _tracer.make_error(KernelError, "NSIM-E404", "launch grid sizes must be >= 1, got {}".format(
                grid))
        dims.append(n)
    return tuple(dims)


class Kernel:
    """A Beta-1 kernel (``@nki.jit``, ``nki.baremetal``, ``nki.benchmark``, ``nki.trace``).

    ``kernel(*arrays)`` traces and simulates; ``kernel[g0, g1](*arrays)`` launches a grid; called from
    inside another kernel it runs inline (a sub-kernel)."""

    def __init__(self, fn, grid=(), **kwargs):
        if isinstance(fn, Kernel):
            kwargs = dict(fn.kwargs, **kwargs)
            grid = grid or fn.grid
            fn = fn.fn
        elif hasattr(fn, "fn") and callable(getattr(fn, "fn")) and not hasattr(fn, "__code__"):
            fn = fn.fn  # a new-dialect nsim.nki.Kernel
        self.fn = fn
        self.grid = grid
        self.kwargs = kwargs
        pt = kwargs.get("platform_target")
        self.config = kwargs.get("config") or (_PLATFORM.get(str(pt)) if pt is not None else None) or "trn2"
        self.last_json = None
        self.last_profile = None
        self.last_outputs = None
        self.benchmark_result = None
        self._root = None
        functools.update_wrapper(self, fn)

    def __getitem__(self, grid):
        k = type(self).__new__(type(self))
        k.__dict__.update(self.__dict__)
        k.grid = _grid_dims(grid)
        k._root = self._root if self._root is not None else self  # last_json/last_profile also land there
        return k

    def _record(self, **kw):
        for obj in (self, self._root):
            if obj is not None:
                obj.__dict__.update(kw)

    # --- tracing ------------------------------------------------------------------------------
    def _launcher(self):
        fn, grid = self.fn, self.grid

        @functools.wraps(fn)
        def launch(*args, **kwargs):
            tr = _tracer.current()
            st = tr.dialect_state
            if not grid:
                return fn(*args, **kwargs)
            st["grid"], st["shared"] = grid, []
            ret = None
            try:
                for ids in itertools.product(*(range(g) for g in grid)):
                    st["ids"], st["shared_k"] = ids, 0
                    ret = fn(*args, **kwargs)
            finally:
                for k in ("grid", "ids", "shared", "shared_k"):
                    st.pop(k, None)
            return ret

        return launch

    def trace(self, *args, **kwargs):
        """Trace only: the TraceResult (kernel dict in ``.kernel``)."""
        if _tracer.active() is not None:
            raise _tracer.make_error(KernelError, "NSIM-E404", "nested kernel tracing")
        tres = _tracer.trace(self._launcher(), args, kwargs, name=getattr(self.fn, "__name__", "kernel"),
                             tensor_cls=_Tensor)
        self._record(last_json=tres.kernel)
        return tres

    def to_json(self, *args, **kwargs):
        if args or kwargs:
            return self.trace(*args, **kwargs).kernel
        if self.last_json is None:
            raise _tracer.make_error(KernelError, "NSIM-E404", "to_json(): the kernel has not been traced yet")
        return self.last_json

    @_tracer.user_facing
    def simulate(self, *args, config=None, overrides=None, timing_only=False, seed=0, **kwargs):
        """Run and return (return value, profile)."""
        if _tracer.active() is not None:
            if self.grid:
                raise _tracer.make_error(KernelError, "NSIM-E404", "err_nested_kernel_with_spmd_grid: a kernel "
                                         "with a launch grid cannot be called from inside another kernel")
            return self.fn(*args, **kwargs), None
        tres = self.trace(*args, **kwargs)
        sim_kw = {"timing_only": timing_only, "seed": seed}
        if overrides is not None:
            sim_kw["overrides"] = overrides
        ret, outputs, prof = _tracer.run(tres, config=config or self.config, **sim_kw)
        self._record(last_profile=prof, last_outputs=outputs)
        return ret, prof

    @_tracer.user_facing
    def __call__(self, *args, **kwargs):
        if _tracer.active() is not None:
            if self.grid:
                raise _tracer.make_error(KernelError, "NSIM-E404", "err_nested_kernel_with_spmd_grid: a kernel "
                                         "with a launch grid cannot be called from inside another kernel")
            return self.fn(*args, **kwargs)
        return self.simulate(*args, **kwargs)[0]


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

    def simulate(self, *args, **kwargs):
        ret, prof = Kernel.simulate(self, *args, **kwargs)
        if prof is not None:
            ns = getattr(prof, "total_time_ns", None)
            if ns is None and isinstance(prof, dict):
                ns = prof.get("total_time_ns")
            self._record(benchmark_result=BenchmarkResult(float(ns or 0.0) / 1000.0))
        return ret, prof


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
    """``nki.profile(...)``: runs once on nsim (no profile files are written yet)."""
    return _deco(Kernel, kernel, kwargs)


@_tracer.user_facing
def simulate_kernel(kernel, *args, **kwargs):
    """``nki.simulate_kernel(kernel, *args)``: run on nsim, return numpy, update written numpy args."""
    k = kernel if isinstance(kernel, Kernel) else Kernel(kernel)
    return k(*args, **kwargs)


def simulate(kernel):
    k = kernel if isinstance(kernel, Kernel) else Kernel(kernel)
    return k
