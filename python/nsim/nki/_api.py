"""The one gate of the public ``nisa`` / ``nl`` functions of both dialects: keyword checking and ``name=``.

:func:`publish` is called at the end of each API module (``nsim.nki.isa``, ``nsim.nki.language``,
``nsim.nki.beta1.isa``, ``nsim.nki.beta1.language``). It wraps every public function defined there that
either takes ``**kwargs`` or is an ISA instruction:

- an unknown keyword raises ``TypeError("<module>.<function>() got an unexpected keyword argument 'k'")``
  before anything else runs. Known keywords = the function's named parameters plus the extra names
  given to :func:`publish` for it (parameters the spec documents that the function reads from
  ``**kwargs``, or accepts and ignores). The wrapper's ``__signature__`` lists them explicitly.
- for ISA modules, ``name=`` (a keyword or the positional ``name`` parameter) labels every op the call
  emits (kernel.json op field ``label``; ``kernel.with_schedule`` refers to it).

Functions without ``**kwargs`` that are not instructions are left alone: Python already rejects unknown
keywords for them. Op codes (``nl.add`` ...) check their keywords in ``language._call_opcode``.
"""
from __future__ import annotations

import functools
import inspect

from .. import tracer as _tr


def unexpected(what, key):
    return TypeError("{}() got an unexpected keyword argument {!r}".format(what, key))


def check_kwargs(what, kwargs, allowed):
    """Raise TypeError for the first key of ``kwargs`` that is not in ``allowed``."""
    for k in kwargs:
        if k not in allowed:
            raise unexpected(what, k)


_OUTSIDE = [_tr._errors.code("OutsideKernel")]


def _wrap(fn, what, extra, isa, twin=None):
    sig = inspect.signature(fn)
    params = list(sig.parameters.values())
    var_kw = any(p.kind is p.VAR_KEYWORD for p in params)
    named = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    allowed = frozenset(named) | frozenset(extra)
    if isa and "name" not in named:
        allowed |= {"name"}
    check = var_kw  # without **kwargs Python itself rejects unknown keywords
    label_pos = None
    if isa and "name" in named:
        p = sig.parameters["name"]
        if p.kind is p.POSITIONAL_OR_KEYWORD:
            label_pos = [q.name for q in params if q.kind in (q.POSITIONAL_ONLY, q.POSITIONAL_OR_KEYWORD)].index(
                "name")

    if not check and not isa:
        return fn
    # nki-api.md 1.1: a new-dialect instruction called with keywords only and no dst behaves as its Beta-1 twin
    # (a fresh SBUF tile returned), with a warning
    dst_twin = twin if twin is not None and "dst" in named else None

    @functools.wraps(fn)
    def api(*args, **kwargs):
        if dst_twin is not None and not args and "dst" not in kwargs:
            other = dst_twin()
            if other is not None:
                theirs = getattr(other, "__nsim_api__", (None, frozenset()))[1]
                for k in kwargs:  # a keyword neither form takes: this function's TypeError, before any warning
                    if k not in allowed and k not in theirs:
                        raise unexpected(what, k)
                _tr.nki_warn("{}() called without dst=: run as its Beta-1 form, which returns a new tile (pass dst= "
                             "to write a tile of yours; nki-api.md 1.1)".format(what), stacklevel=2)
                return other(**kwargs)
        if check and kwargs and not allowed.issuperset(kwargs):  # (one set operation per call in the common case)
            check_kwargs(what, kwargs, allowed)
        if isa:
            label = kwargs.get("name")
            if label is None and label_pos is not None and len(args) > label_pos:
                label = args[label_pos]
            if label is not None and _tr.active() is not None:
                with _tr.labelled(label):
                    return fn(*args, **kwargs)
        try:
            return fn(*args, **kwargs)
        except _tr.KernelError as e:
            if _tr.active() is not None or getattr(e, "code", None) != _OUTSIDE[0]:
                raise
            # called outside a kernel: name the function the user called (not the nl.ndarray nl.zeros calls), at
            # the user's line, without nsim's frames (no kernel entry point trims them here)
        raise _tr.make_error("OutsideKernel", "{} can only be called inside an NKI kernel (a function decorated "
                             "with @nki.jit and called with arrays, or run by nki.simulate)".format(what)) from None

    # the accepted keywords, explicitly (``**kwargs`` replaced by keyword-only parameters)
    new_params = [p for p in params if p.kind is not p.VAR_KEYWORD]
    have = {p.name for p in new_params}
    for k in sorted(allowed - have):
        new_params.append(inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY, default=None))
    try:
        api.__signature__ = sig.replace(parameters=new_params)
    except ValueError:  # pragma: no cover - defaults order; keep the original
        api.__signature__ = sig
    api.__nsim_api__ = (what, allowed)
    return api


def publish(namespace, prefix, extra=None, isa=False, exclude=(), twins=None):
    """Wrap the public functions of the module whose globals are ``namespace`` (see the module doc).

    ``prefix``: the name used in messages (``"nki.isa"``); ``extra``: {function name: extra accepted
    keywords}; ``isa``: the functions are instructions (``name=`` labels their ops); ``twins``: the name of the
    module whose function of the same name runs a call made without ``dst`` (the new dialect's Beta-1 twins)."""
    extra = extra or {}
    mod = namespace["__name__"]
    for nm, fn in list(namespace.items()):
        if nm.startswith("_") or nm in exclude or not inspect.isfunction(fn) or fn.__module__ != mod:
            continue
        if getattr(fn, "__nsim_api__", None) is not None:
            continue
        twin = None
        if twins is not None:
            def twin(nm=nm):  # resolved at the call: the twin module imports this one
                import importlib
                return getattr(importlib.import_module(twins), nm, None)
        namespace[nm] = _wrap(fn, "{}.{}".format(prefix, nm), extra.get(nm, ()), isa, twin)
    unknown = set(extra) - set(namespace)
    if unknown:  # pragma: no cover - a typo in a module's table
        raise RuntimeError("nsim: publish({}): no functions {}".format(prefix, sorted(unknown)))
