"""nki_cpu_simulator: nsim under the package layout of AWS's NKI CPU simulator.

The nki-library test harness (test/utils/simulation_setup.py) does, unchanged::

    import nki_cpu_simulator.nki, nki_cpu_simulator.nki.builtin, nki_cpu_simulator.nki.compiler, ...
    sys.modules["nki"] = nki_cpu_simulator.nki
    sys.modules["nki.language"] = nki_cpu_simulator.nki.language
    ...                                  # nki.isa, nki.isa.constants, nki.typing, nki.compiler,
                                         # nki.dtype, nki.tensor
    builtins.builtin = nki_cpu_simulator.nki.builtin
    out = nki.cpu_simulate(kernel)[lnc](**kwargs)

Every module here is a thin re-export of nsim's new-dialect implementation (``nsim.nki.*``): names are
forwarded on access (see ``_delegate``), so the objects are nsim's own. ``nsim.compat.install()`` uses
the same modules for ``import nki``.
"""
from . import nki  # noqa: F401

__all__ = ["nki"]
