"""Helper for the thin re-export modules of nki_cpu_simulator (also used by ``nsim.compat``).

``delegate(globals(), "nsim.nki.isa")`` gives a module a PEP 562 ``__getattr__``/``__dir__`` that forward
every name the module does not define itself to the target module(s), looked up on each access. Nothing
is copied at import time, so names added to nsim's modules later (new instructions, module state that is
rebound at run time) are always seen, and the objects are the very same ones (``nl.add is
nsim.nki.language.add``). Wrapper modules import their helpers under ``_``-names so that ``__all__``
(computed lazily: own public names + the targets' public names) stays clean.
"""
from __future__ import annotations

import importlib


def _public(mod):
    names = getattr(mod, "__all__", None)
    if names is None:
        names = [n for n in vars(mod) if not n.startswith("_")]
    return list(names)


def delegate(g, *targets):
    """Install ``__getattr__`` and ``__dir__`` (and a lazy ``__all__``) into the module globals ``g``."""
    mods = []

    def _targets():
        if not mods:
            mods.extend(importlib.import_module(t) if isinstance(t, str) else t for t in targets)
        return mods

    def __getattr__(name):
        if name == "__all__":
            out = [k for k in g if not k.startswith("_")]
            for m in _targets():
                out.extend(n for n in _public(m) if n not in out)
            return out
        if not name.startswith("__"):
            for m in _targets():
                try:
                    return getattr(m, name)
                except AttributeError:
                    pass
        raise AttributeError("module {!r} has no attribute {!r}".format(g.get("__name__"), name))

    def __dir__():
        names = set(g)
        for m in _targets():
            names.update(dir(m))
        return sorted(names)

    g["__getattr__"] = __getattr__
    g["__dir__"] = __dir__
