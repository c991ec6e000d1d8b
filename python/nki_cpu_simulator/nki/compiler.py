"""``nki.compiler`` (and Beta-1 ``neuronxcc.nki.compiler``): compiler directives, accepted as no-ops.

- decorators ``skip_middle_end_transformations``, ``enable_stack_allocator``, ``force_auto_alloc``:
  usable bare (``@d``) or called (``@d(...)``); return the kernel unchanged;
- context managers ``no_reorder()`` (nsim's ``nl.no_reorder`` when it exists), ``allocation_scope()``,
  ``multi_buffer(factor)``;
- ``sbuf`` / ``psum`` with ``.alloc(...)``, ``.mod_alloc(...)``, ``.auto_alloc(...)``: the allocation
  objects compare equal to "sbuf"/"psum" and are accepted as ``buffer=``; addresses are ignored
  (spec §1.4).
"""
from __future__ import annotations

import functools as _functools


def _noop_decorator(name):
    def deco(fn=None, *args, **kwargs):
        if callable(fn) and not args and not kwargs:
            return fn
        return lambda f: f

    deco.__name__ = deco.__qualname__ = name
    deco.__doc__ = "``@nki.compiler.{}``: accepted, no effect in nsim.".format(name)
    return deco


skip_middle_end_transformations = _noop_decorator("skip_middle_end_transformations")
enable_stack_allocator = _noop_decorator("enable_stack_allocator")
force_auto_alloc = _noop_decorator("force_auto_alloc")


class _NullContext:
    """A no-op context manager, also usable as a decorator and as a ``directives=`` value."""

    def __init__(self, name, *args, **kwargs):
        self._name = name
        self.args, self.kwargs = args, kwargs
        self._inner = None

    def __enter__(self):
        if self._name == "no_reorder":
            import nsim.nki.language as _nl

            nr = getattr(_nl, "no_reorder", None)
            if nr is not None:
                self._inner = nr()
                self._inner.__enter__()
        return self

    def __exit__(self, *exc):
        if self._inner is not None:
            inner, self._inner = self._inner, None
            return inner.__exit__(*exc)
        return False

    def __call__(self, fn):
        @_functools.wraps(fn)
        def wrapped(*a, **k):
            with self.__class__(self._name, *self.args, **self.kwargs):
                return fn(*a, **k)

        return wrapped

    def __repr__(self):
        return "nki.compiler.{}()".format(self._name)


def no_reorder(*args, **kwargs):
    return _NullContext("no_reorder", *args, **kwargs)


def allocation_scope(*args, **kwargs):
    return _NullContext("allocation_scope", *args, **kwargs)


def multi_buffer(factor=None, *args, **kwargs):
    return _NullContext("multi_buffer", factor, *args, **kwargs)


class _AllocBuffer(str):
    """``ncc.sbuf`` / ``ncc.psum``: compares equal to the buffer name; ``.alloc(...)`` etc. return the
    plain buffer (addresses are ignored by nsim)."""

    def _region(self):
        import nsim.nki.language as _nl

        return getattr(_nl, str(self))

    def alloc(self, *args, **kwargs):
        return self._region()

    mod_alloc = alloc
    auto_alloc = alloc


sbuf = _AllocBuffer("sbuf")
psum = _AllocBuffer("psum")

try:  # if nsim grows its own nki.compiler module, forward everything else to it
    import nsim.nki.compiler as _target  # type: ignore
except ImportError:
    _target = None

if _target is not None:
    from nki_cpu_simulator._delegate import delegate as _delegate

    _delegate(globals(), _target)
