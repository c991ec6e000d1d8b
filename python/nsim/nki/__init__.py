"""nsim's implementation of the new NKI dialect (``import nki``; NKI 0.2 ... 0.6).

    from nsim import nki
    import nsim.nki.language as nl
    import nsim.nki.isa as nisa

    @nki.jit
    def add(a, b):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        ...
        return out

    c = add(a_np, b_np)                 # traces eagerly, simulates on nsim, returns numpy
    kernel_json = add.to_json(a_np, b_np)

Calling a kernel traces the Python function eagerly into nsim's kernel IR (every nisa call goes through
``nsim.tracer.emit``), runs ``nsim._core.simulate_json`` on it and returns the kernel's return value.
"""
from __future__ import annotations

import functools
import warnings

from .. import tracer as _tracer
from ..tracer import (NsimError, ConfigError, AccessError, OperandError, KernelError,  # noqa: F401
                      InternalError, NkiTensor)
from . import language, isa, typing  # noqa: F401

__all__ = ["jit", "Kernel", "simulate", "simulate_kernel", "trace_kernel", "language", "isa", "typing",
           "NsimError", "KernelError"]

_PLATFORM = {"trn1": "trn1", "inf2": "trn1", "gen2": "trn1", "trn2": "trn2", "gen3": "trn2", "trn3": "trn3",
             "gen4": "trn3"}


class Kernel:
    """A kernel function. Calling it with arrays traces and simulates it (spec §1.4, §1.8)."""

    def __init__(self, fn, config=None, **kwargs):
        self.fn = fn
        self.kwargs = kwargs
        pt = kwargs.get("platform_target")
        self.config = config or (_PLATFORM.get(str(pt)) if pt is not None else None) or "trn2"
        self.lnc = 1
        self.last_json = None
        self.last_profile = None
        self.last_outputs = None
        functools.update_wrapper(self, fn)

    def __getitem__(self, lnc):
        if isinstance(lnc, tuple):
            raise _tracer.make_error(KernelError, "NSIM-E404", "new-dialect kernels take a single LNC degree: kernel[1] or kernel[2]")
        if int(lnc) not in (1, 2):
            raise _tracer.make_error(KernelError, "NSIM-E404", "LNC degree must be 1 or 2, got {}".format(lnc))
        if int(lnc) == 2:
            raise NotImplementedError("nsim: LNC=2 launches are not supported yet")
        return self

    def trace(self, *args, **kwargs):
        """Trace only: the TraceResult (kernel dict in .kernel)."""
        if _tracer.active() is not None:
            raise _tracer.make_error(KernelError, "NSIM-E404", "nested kernel tracing")
        tres = _tracer.trace(self.fn, args, kwargs, name=getattr(self.fn, "__name__", "kernel"))
        self.last_json = tres.kernel
        return tres

    def to_json(self, *args, **kwargs):
        """The kernel IR (kernel.json as a dict) for these arguments; without arguments, the last one traced."""
        if args or kwargs:
            return self.trace(*args, **kwargs).kernel
        if self.last_json is None:
            raise _tracer.make_error(KernelError, "NSIM-E404", "to_json(): the kernel has not been traced yet; pass its arguments")
        return self.last_json

    @_tracer.user_facing
    def simulate(self, *args, config=None, overrides=None, timing_only=False, trace=None, seed=0, **kwargs):
        """Run and return (return value, profile)."""
        if _tracer.active() is not None:  # a kernel called from another kernel runs inline
            return self.fn(*args, **kwargs), None
        tres = self.trace(*args, **kwargs)
        sim_kw = {"timing_only": timing_only, "seed": seed}
        if overrides is not None:
            sim_kw["overrides"] = overrides
        if trace is not None:
            sim_kw["trace"] = trace
        ret, outputs, profile = _tracer.run(tres, config=config or self.config, **sim_kw)
        self.last_profile = profile
        self.last_outputs = outputs
        return ret, profile

    @_tracer.user_facing
    def __call__(self, *args, **kwargs):
        if _tracer.active() is not None:  # sub-kernel: inline
            return self.fn(*args, **kwargs)
        return self.simulate(*args, **kwargs)[0]


def jit(fn=None, **kwargs):
    """``@nki.jit``, ``@nki.jit(**kw)`` or ``nki.jit(fn, **kw)``. Beta-1 kwargs (mode, platform_target,
    ...) are accepted; only platform_target has an effect."""
    for k in ("mode",):
        if k in kwargs:
            warnings.warn("nki.jit({}=...) is deprecated and ignored by nsim".format(k), DeprecationWarning,
                          stacklevel=2)
    if fn is None:
        return lambda f: jit(f, **kwargs)
    if isinstance(fn, Kernel):
        return fn
    return Kernel(fn, **kwargs)


def _as_kernel(kernel):
    return kernel if isinstance(kernel, Kernel) else Kernel(kernel)


def simulate(kernel):
    """``nki.simulate(kernel)(*args)``: numpy in, numpy out."""
    k = _as_kernel(kernel)

    def run(*args, **kwargs):
        return k(*args, **kwargs)

    return run


@_tracer.user_facing
def simulate_kernel(kernel, *args, **kwargs):
    """``nki.simulate_kernel(kernel, *args)``."""
    return _as_kernel(kernel)(*args, **kwargs)


cpu_simulate = simulate


def trace_kernel(kernel, *args, **kwargs):
    """The kernel IR dict of ``kernel`` called with these arguments (save with json.dump as kernel.json)."""
    return _as_kernel(kernel).to_json(*args, **kwargs)


def benchmark(kernel=None, **kw):  # minimal; Beta-1 style helpers are out of scope here
    raise NotImplementedError("nki.benchmark is not implemented yet in nsim")
