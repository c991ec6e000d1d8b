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

import operator
import warnings

from .. import _kernel
from .. import tracer as _tracer
from ..tracer import (NsimError, ConfigError, AccessError, OperandError, KernelError,  # noqa: F401
                      InternalError, NkiTensor)
from . import language, isa, typing  # noqa: F401

__all__ = ["jit", "Kernel", "simulate", "simulate_kernel", "trace_kernel", "language", "isa", "typing",
           "NsimError", "KernelError"]

_PLATFORM = _kernel.PLATFORM_CONFIG

#: ``nki.tensor``: the type of kernel tensors and views (spec §3.4, §3.9)
tensor = NkiTensor


NkiWarning = _tracer.NkiWarning  # spec 4.1 (the sanitizer's CheckWarning is one too)


class Kernel(_kernel.Kernel):
    """A new-dialect kernel (``@nki.jit``). Calling it with arrays traces and simulates it (spec §1.4,
    §1.8); ``.simulate``, ``.options``, ``.with_schedule``: see :class:`nsim._kernel.Kernel`."""

    lnc = 1

    def __getitem__(self, lnc):
        """``kernel[2]``: an LNC=2 launch on two physical cores (``kernel[nl.nc(2)]`` too); ``kernel[1]``:
        one core (docs/lnc.md)."""
        if isinstance(lnc, tuple):
            raise _tracer.make_error("BadLaunchGrid", "new-dialect kernels take a single LNC degree: kernel[1] or kernel[2]")
        n = getattr(lnc, "lnc_cores", None)  # nl.nc(k)
        try:
            n = operator.index(lnc) if n is None else int(n)  # not int(): 2.5 is no LNC degree
        except (TypeError, ValueError):
            raise _tracer.make_error("BadLaunchGrid", "LNC degree must be 1 or 2, got {!r}".format(lnc)) from None
        if n not in (1, 2):
            raise _tracer.make_error("BadLaunchGrid", "LNC degree must be 1 or 2, got {}".format(lnc))
        return self._derive(lnc=n)


def jit(fn=None, **kwargs):
    """``@nki.jit``, ``@nki.jit(**kw)`` or ``nki.jit(fn, **kw)``. Beta-1 kwargs (mode, platform_target,
    ...) are accepted; only platform_target has an effect.

    Calling the kernel: each numpy (or torch CPU) array argument becomes an HBM tensor sharing the caller's
    storage (spec 1.6), and so does each array inside a list, tuple or dict argument, nested ones too (tensors
    ``xs_0``, ``xs_1``, ... for a parameter ``xs``; ``params_w1`` for ``params["w1"]``: the kernel gets a plain
    dict); any other argument reaches the kernel as a Python value. (The spec is silent on containers: nsim
    treats them as pytrees, where a kernel written for NKI itself takes each tensor as an argument of its own.)"""
    for k in ("mode", "platform_target"):  # spec 1.3: both deprecated in the new dialect
        if k in kwargs:
            warnings.warn("nki.jit({}=...) is deprecated{}".format(
                k, " and ignored by nsim" if k == "mode" else ""), NkiWarning, stacklevel=2)
    if fn is None:  # not jit(f, **kwargs): that would warn a second time
        return lambda f: f if isinstance(f, Kernel) and not kwargs else Kernel(f, **kwargs)
    if isinstance(fn, Kernel) and not kwargs:
        return fn
    return Kernel(fn, **kwargs)


def _as_kernel(kernel):
    return kernel if isinstance(kernel, _kernel.Kernel) else Kernel(kernel)


class _Launch:
    """What ``nki.simulate(kernel)`` returns: call it with the kernel's arguments (numpy in, numpy out);
    ``[lnc]`` selects the LNC degree first (``nki.cpu_simulate(kernel)[2](...)``, docs/lnc.md)."""

    def __init__(self, kernel):
        self.kernel = kernel

    def __getitem__(self, lnc):
        return _Launch(self.kernel[lnc])

    def __call__(self, *args, **kwargs):
        return self.kernel(*args, **kwargs)


def simulate(kernel):
    """``nki.simulate(kernel)(*args)``, ``nki.simulate(kernel)[2](*args)``: numpy in, numpy out."""
    return _Launch(_as_kernel(kernel))


@_tracer.user_facing
def simulate_kernel(kernel, *args, **kwargs):
    """``nki.simulate_kernel(kernel, *args)``."""
    return _as_kernel(kernel)(*args, **kwargs)


cpu_simulate = simulate


def trace_kernel(kernel, *args, **kwargs):
    """The kernel IR dict of ``kernel`` called with these arguments (save with json.dump as kernel.json)."""
    return _as_kernel(kernel).to_json(*args, **kwargs)


def benchmark(kernel=None, **kw):
    """Beta 1 only (nki-api.md lists nki.benchmark for the old dialect): a NotSupportedError names what to use
    instead."""
    raise _tracer.make_error("NotSupported", "nki.benchmark is a Beta-1 API (neuronxcc.nki.benchmark); in the new "
                             "dialect, kernel.simulate(...) returns the Profile of the run (total_time_ns)")
