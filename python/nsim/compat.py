"""Run kernels written for the real NKI toolchain unchanged: ``import nki`` resolves to nsim.

    import nsim.compat
    nsim.compat.install()          # idempotent
    import nki, nki.language as nl, nki.isa as nisa
    ...
    nsim.compat.uninstall()        # restores sys.modules as it was

``install()`` puts aliases into ``sys.modules`` (no import hook):

==========================  =====================================================================
``nki``                     ``nki_cpu_simulator.nki``: forwards to ``nsim.nki`` (``jit``,
                            ``simulate_kernel``, ...); ``simulate``/``cpu_simulate`` accept ``[lnc]``
``nki.language``            ``nki_cpu_simulator.nki.language`` -> ``nsim.nki.language``
``nki.isa``                 ``nki_cpu_simulator.nki.isa`` -> ``nsim.nki.isa``
``nki.isa.constants``       the ISA enums (``engine``, ``reduce_cmd``, ``dge_mode``, ...)
``nki.typing``              -> ``nsim.nki.typing``
``nki.compiler``            decorators/context managers (``skip_middle_end_transformations``,
                            ``enable_stack_allocator``, ``force_auto_alloc``, ``allocation_scope()``,
                            ``multi_buffer(factor)``: no-ops; ``sbuf/psum.alloc/mod_alloc/auto_alloc``:
                            honoured placements (docs/timing-model.md); ``no_reorder()``:
                            ``nl.no_reorder``, the ops inside get one ``order_group``)
``nki.tensor``              ``NkiTensor``
``nki.dtype``               the dtypes (``nki_cpu_simulator.nki.language.dtypes``)
==========================  =====================================================================

The wrapper modules are those of the ``nki_cpu_simulator`` package (the layout the nki-library harness
expects); they forward every name to nsim's modules on access, so the functions, enums and dtypes are
nsim's own objects.

**Beta 1 (``neuronxcc.nki``)** maps to nsim's Beta-1 tree ``nsim.nki.beta1``: ``neuronxcc.nki`` ->
``nsim.nki.beta1`` (``jit``, ``trace``, ``simulate_kernel``, ``baremetal``, ``benchmark``, launch grids
``kernel[g0, g1]``), ``neuronxcc.nki.language`` -> ``nsim.nki.beta1.language`` (value semantics, tile
operators, ``nl.arange``/``nl.mgrid`` indexing, ``nl.par_dim`` block dims, PSUM ``+=``),
``neuronxcc.nki.isa`` -> ``nsim.nki.beta1.isa`` (value-returning instructions), ``neuronxcc.nki.typing``
and ``neuronxcc.nki.compiler`` -> ``nsim.nki.beta1.typing`` / ``.compiler``; ``neuronxcc.nki.isa.constants``
is the new dialect's enum module. ``mask=`` takes any affine predicate (and bools): a non-rectangular one on
``nl.load`` / ``nl.store`` and element-wise value functions is split into boxes of its true region, one
instruction each (docs/debugging.md, "Non-rectangular masks"); on reductions, matmul operand masks and nisa ops,
and transposed arange accesses outside ``nl.load`` / ``nl.store``, it raises ``NotSupportedError``.

``NKI_SIMULATOR=1`` needs nothing: nsim always simulates. ``python -m nsim run script.py`` installs
these aliases and then runs the script as ``__main__``.
"""
from __future__ import annotations

import importlib
import sys
import threading

__all__ = ["install", "uninstall", "installed", "ALIASES", "BETA1_ALIASES"]

_W = "nki_cpu_simulator.nki"

#: sys.modules name -> module that stands in for it (new dialect).
ALIASES = {
    "nki": _W,
    "nki.language": _W + ".language",
    "nki.language.dtypes": _W + ".language.dtypes",
    "nki.isa": _W + ".isa",
    "nki.isa.constants": _W + ".isa.constants",
    "nki.typing": _W + ".typing",
    "nki.compiler": _W + ".compiler",
    "nki.tensor": _W + ".tensor",
    "nki.dtype": _W + ".language.dtypes",
    "nki.builtin": _W + ".builtin",
}

#: Beta-1 names: nsim's Beta-1 tree (value-returning dialect).
_B1 = "nsim.nki.beta1"
BETA1_ALIASES = {
    "neuronxcc.nki": _B1,
    "neuronxcc.nki.language": _B1 + ".language",
    "neuronxcc.nki.isa": _B1 + ".isa",
    "neuronxcc.nki.isa.constants": _W + ".isa.constants",
    "neuronxcc.nki.typing": _B1 + ".typing",
    "neuronxcc.nki.compiler": _B1 + ".compiler",
}

_lock = threading.RLock()
_saved = None  # name -> previous sys.modules entry (or _MISSING) while installed
_installed_mods = {}  # name -> the module object we put there
_MISSING = object()


def _neuronxcc_package():
    import types

    mod = types.ModuleType("neuronxcc", "nsim stand-in for the neuronxcc package (only .nki, mapped to "
                           "nsim.nki.beta1; see nsim.compat).")
    mod.__path__ = []  # a package, but nothing is found inside it besides the aliases
    mod.__nsim_compat__ = True
    return mod


def installed():
    """True while the aliases are installed."""
    return _saved is not None


def install(beta1=True):
    """Alias ``nki.*`` (and, with ``beta1``, ``neuronxcc`` / ``neuronxcc.nki.*``) to nsim in sys.modules.

    Idempotent: a second call does nothing. Entries that already existed (e.g. a real ``nki``) are saved
    and put back by ``uninstall()``."""
    global _saved
    with _lock:
        if _saved is not None:
            return
        mapping = dict(ALIASES)
        if beta1:
            mapping.update(BETA1_ALIASES)
        mods = {name: importlib.import_module(target) for name, target in mapping.items()}
        if beta1:
            nx = _neuronxcc_package()
            nx.nki = mods["neuronxcc.nki"]
            mods["neuronxcc"] = nx
        saved = {}
        for name, mod in mods.items():
            saved[name] = sys.modules.get(name, _MISSING)
            sys.modules[name] = mod
        _installed_mods.clear()
        _installed_mods.update(mods)
        _saved = saved
        importlib.invalidate_caches()


def uninstall():
    """Undo ``install()``: restore (or remove) every sys.modules entry it set. Modules imported through
    the aliases below ``nki.``/``neuronxcc.`` that are ours are removed too. No-op when not installed."""
    global _saved
    with _lock:
        if _saved is None:
            return
        ours = {id(m) for m in _installed_mods.values()}
        for name, prev in _saved.items():
            if prev is _MISSING:
                if sys.modules.get(name) is _installed_mods.get(name):
                    sys.modules.pop(name, None)
            else:
                sys.modules[name] = prev
        for name in [n for n in list(sys.modules) if n.split(".", 1)[0] in ("nki", "neuronxcc")]:
            if name not in _saved and (id(sys.modules[name]) in ours
                                       or (getattr(sys.modules[name], "__name__", "") or "").startswith(_W)):
                sys.modules.pop(name, None)
        _saved = None
        _installed_mods.clear()
        importlib.invalidate_caches()
