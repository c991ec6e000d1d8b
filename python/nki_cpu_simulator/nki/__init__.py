"""``nki_cpu_simulator.nki``: the ``nki`` module of the CPU simulator, backed by nsim (``nsim.nki``).

Own definitions: the sub-modules (``builtin``, ``compiler``, ``isa``, ``language``, ``tensor``,
``typing``), ``dtype`` (= ``language.dtypes``) and ``simulate``/``cpu_simulate`` returning a launcher
that also supports the LNC subscript: ``nki.cpu_simulate(kernel)[lnc](**kwargs)`` and
``nki.simulate(kernel)(*args)``. Everything else (``jit``, ``simulate_kernel``, ``trace_kernel``,
errors, ...) is forwarded to ``nsim.nki``.

When neither the kernel nor the call selects a platform, ``NKI_NC_VERSION`` /
``NEURON_PLATFORM_TARGET_OVERRIDE`` (gen2|gen3|gen4, trn1|inf2|trn2|trn3) pick the nsim preset
(the nki-library harness sets ``NKI_NC_VERSION``).
"""
from __future__ import annotations

import os as _os

from nki_cpu_simulator._delegate import delegate as _delegate

from . import builtin, compiler, isa, language, tensor, typing  # noqa: F401
from .language import dtypes as dtype  # noqa: F401

_delegate(globals(), "nsim.nki")

# Kernel.simulate() keywords that would shadow kernel parameters of the same name.


def _env_config():
    import nsim.nki as _n

    for var in ("NKI_NC_VERSION", "NEURON_PLATFORM_TARGET_OVERRIDE"):
        v = _os.environ.get(var, "").strip().lower()
        if v in _n._PLATFORM:
            return _n._PLATFORM[v]
    return None


class _Launcher:
    """What ``simulate(kernel)`` returns: call it with the kernel's arguments (numpy in, numpy out);
    ``[lnc]`` selects the logical-NeuronCore degree first."""

    def __init__(self, kernel):
        import nsim.nki as _n

        self.kernel = kernel if isinstance(kernel, _n.Kernel) else _n.jit(kernel)

    def __getitem__(self, lnc):
        return _Launcher(self.kernel[lnc])

    def __call__(self, *args, **kwargs):
        k = self.kernel
        config = None
        if k.kwargs.get("platform_target") is None:
            config = _env_config()
        # Every argument is the kernel's; the preset from NKI_NC_VERSION goes through options().
        return (k.options(config=config) if config else k).simulate(*args, **kwargs)[0]

    def __repr__(self):
        return "<nsim launcher for {}>".format(getattr(self.kernel, "__name__", self.kernel))


def simulate(kernel):
    """``nki.simulate(kernel)(*args)`` / ``nki.simulate(kernel)[lnc](*args)``: run on nsim."""
    return _Launcher(kernel)


def cpu_simulate(kernel):
    """``nki.cpu_simulate(kernel)[lnc](**kwargs)`` (nki-library harness). Returns None, an array, or a
    tuple/list of arrays."""
    return _Launcher(kernel)
