"""Kernel objects shared by both NKI dialects: options, the kernel's own arguments, schedules.

The kernel's arguments are the kernel's: ``kernel(*args, **kwargs)`` and ``kernel.simulate(*args,
**kwargs)`` pass every argument to the kernel function. nsim's options come from

1. ``kernel.options(config=..., timing_only=..., ...)`` — a configured copy of the kernel (also the
   Beta-1 ``platform_target=`` of ``nki.jit``, which sets ``config``);
2. ``with nsim.options(...):`` — defaults for every kernel run inside the block (a contextvar);
3. the built-in defaults (:data:`OPTION_DEFAULTS`).

A keyword of the old style (``kernel.simulate(x, config="trn1")``) that is *not* a parameter of the
kernel function (and not taken by its ``**kwargs``) still works as an nsim option for one release, with a
DeprecationWarning.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import sys
import warnings

from . import tracer as _tracer

__all__ = ["Kernel", "options", "simulate", "OPTION_DEFAULTS", "PLATFORM_CONFIG"]

#: Every nsim run option and its default (the keyword arguments of ``nsim.simulate_json``).
OPTION_DEFAULTS = {"config": "trn2", "overrides": None, "timing_only": False, "trace": None, "seed": 0,
                   "trace_limit": None, "trace_window": None, "check": True, "loops": None,
                   "fast_forward": None}

#: Options of the tracer, not of the simulation (not passed to ``nsim.simulate_json``).
_TRACE_ONLY = ("loops",)

#: Options the old ``Kernel.simulate(..., config=, overrides=, timing_only=, trace=, seed=)`` took.
_LEGACY = ("config", "overrides", "timing_only", "trace", "seed")

#: ``platform_target`` / NKI_NC_VERSION words -> nsim preset.
PLATFORM_CONFIG = {"trn1": "trn1", "inf2": "trn1", "gen2": "trn1", "trn2": "trn2", "gen3": "trn2",
                   "trn3": "trn3", "gen4": "trn3"}

_UNSET = object()
_CONTEXT = contextvars.ContextVar("nsim_options", default=None)


def _given(**opts):
    return {k: v for k, v in opts.items() if v is not _UNSET}


@contextlib.contextmanager
def options(*, config=_UNSET, overrides=_UNSET, timing_only=_UNSET, trace=_UNSET, seed=_UNSET,
            trace_limit=_UNSET, trace_window=_UNSET, check=_UNSET, loops=_UNSET, progress=_UNSET,
            fast_forward=_UNSET):
    """``with nsim.options(config="trn1", timing_only=True): ...`` — defaults for every kernel run in the
    block (options not given keep the enclosing defaults; blocks nest; restored on exit). An option
    given by ``kernel.options(...)`` wins over these defaults."""
    new = _given(config=config, overrides=overrides, timing_only=timing_only, trace=trace, seed=seed,
                 trace_limit=trace_limit, trace_window=trace_window, check=check, loops=loops, progress=progress,
                 fast_forward=fast_forward)
    if "loops" in new and new["loops"] is not None:
        _tracer.loops_mode(new["loops"])
    cur = _CONTEXT.get() or {}
    token = _CONTEXT.set(dict(cur, **new))
    try:
        yield
    finally:
        _CONTEXT.reset(token)


def current_options():
    """The defaults in force here (built-in defaults updated by the enclosing ``nsim.options`` blocks)."""
    return dict(OPTION_DEFAULTS, **(_CONTEXT.get() or {}))


def _accepts(fn, key):
    """True when calling ``fn(key=...)`` gives the keyword to ``fn`` (a named parameter or ``**kwargs``)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return False
    for p in sig.parameters.values():
        if p.kind is p.VAR_KEYWORD:
            return True
        if p.name == key and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            return True
    return False


def _user_stacklevel():
    """warnings.warn stacklevel of the first frame outside the nsim package (the user's call)."""
    f = sys._getframe(1)
    level = 1
    while f is not None and _tracer._is_internal(f.f_code.co_filename):
        f = f.f_back
        level += 1
    return level


class Kernel:
    """A kernel function (``@nki.jit`` in both dialects, Beta-1 ``nki.trace``/``baremetal``/``benchmark``).

    ``kernel(*args, **kwargs)`` traces the function with these arguments, simulates it and returns its
    return value (numpy in, numpy out); ``kernel.simulate(*args, **kwargs)`` returns ``(return value,
    Profile)``; ``kernel.options(...)`` and ``kernel.with_schedule(...)`` return configured copies. Called
    from inside another kernel, a kernel runs inline as a plain function (a sub-kernel)."""

    #: the NkiTensor class of the dialect (None: nsim.tracer.NkiTensor)
    _tensor_cls = None

    def __init__(self, fn, config=None, **kwargs):
        opts, schedule = {}, []
        if isinstance(fn, Kernel):  # re-wrapping keeps the options and the schedule
            kwargs = dict(fn.kwargs, **kwargs)
            opts, schedule = dict(fn._opts), list(fn._schedule)
            fn = fn.fn
        self.fn = fn
        self.kwargs = kwargs
        pt = kwargs.get("platform_target")
        if pt is not None and str(pt) in PLATFORM_CONFIG:
            opts["config"] = PLATFORM_CONFIG[str(pt)]
        if config is not None:
            opts["config"] = config
        self._opts = opts
        self._schedule = schedule
        self._root = None
        self._parent = None  # the kernel this one is a configured copy of (_derive)
        self.last_json = None
        self.last_profile = None
        self.last_outputs = None  # the last run's output arrays by name (the return value shares them)
        functools.update_wrapper(self, fn)

    # --- configured copies ----------------------------------------------------------------------
    def _derive(self, **attrs):
        """A copy of this kernel with ``attrs`` changed; its runs are also recorded on the kernels it was derived
        from, up to the original (``k = kernel.options(...); k[2](...)`` sets ``k.last_profile`` too)."""
        k = type(self).__new__(type(self))
        k.__dict__.update(self.__dict__)
        k.__dict__.update(attrs)
        k._root = self._root if self._root is not None else self
        k._parent = self
        return k

    def _record(self, **kw):
        obj = self
        while obj is not None:
            obj.__dict__.update(kw)
            obj = obj.__dict__.get("_parent")

    def options(self, *, config=_UNSET, overrides=_UNSET, timing_only=_UNSET, trace=_UNSET, seed=_UNSET,
                trace_limit=_UNSET, trace_window=_UNSET, check=_UNSET, loops=_UNSET, progress=_UNSET,
                fast_forward=_UNSET):
        """This kernel with nsim options set: ``config`` (preset name, default "trn2"), ``overrides`` (dict
        or ["key=value"]), ``timing_only`` (skip numerics; returned tensors are None), ``trace`` (path of a
        Perfetto trace to write), ``seed``, ``trace_limit``, ``trace_window`` (as ``nsim.simulate_json``),
        ``check`` (the sanitizer, docs/debugging.md: True (default) warns with CheckWarning, "strict" raises,
        False skips it), ``loops`` (how the tracer treats nl.affine_range / nl.sequential_range: "keep" them as
        kernel-IR loops where it can, the default, or "unroll" every iteration; docs/kernel-json.md "Loops
        from the Python tracer"), ``progress`` and ``fast_forward`` (as ``nsim.simulate_json``; ``progress=True`` also
        shows the tracing of a kernel that takes over 2 s to trace). Options not given keep
        their current values."""
        new = _given(config=config, overrides=overrides, timing_only=timing_only, trace=trace, seed=seed,
                     trace_limit=trace_limit, trace_window=trace_window, check=check, loops=loops, progress=progress,
                 fast_forward=fast_forward)
        if "loops" in new and new["loops"] is not None:
            _tracer.loops_mode(new["loops"])
        return self._derive(_opts=dict(self._opts, **new))

    def with_schedule(self, schedule):
        """``kernel.with_schedule([("b", "a"), ("c", ["a", "b"])])``: the instruction named ``b`` (``name=``
        of an nisa call) runs after ``a``; ``c`` after ``a`` and ``b``. Returns the kernel with these
        dependency edges (added to any it has); every name must be the name of an instruction of the
        kernel (checked when it is traced)."""
        if isinstance(schedule, (str, bytes)) or not hasattr(schedule, "__iter__"):
            raise TypeError("with_schedule() takes a list of (name, name or list of names) pairs, got "
                            "{!r}".format(schedule))
        edges = []
        for item in schedule:
            try:
                after, before = item
            except (TypeError, ValueError):
                raise TypeError("with_schedule(): each entry must be a pair (name, name or list of names), got "
                                "{!r}".format(item)) from None
            before = [before] if isinstance(before, str) else list(before)
            for nm in [after] + before:
                if not isinstance(nm, str) or not nm:
                    raise TypeError("with_schedule(): instruction names must be non-empty strings, got "
                                    "{!r}".format(nm))
            edges.append((after, before))
        return self._derive(_schedule=self._schedule + edges)

    @property
    def config(self):
        """The preset this kernel runs on here (its own option, else the ``nsim.options`` default)."""
        return self._effective()["config"]

    @property
    def schedule(self):
        """The with_schedule edges: [(after, [before, ...]), ...]."""
        return [(a, list(b)) for a, b in self._schedule]

    def _effective(self, legacy=None):
        eff = current_options()
        eff.update(self._opts)
        if legacy:
            eff.update(legacy)
        if eff["config"] is None:
            eff["config"] = OPTION_DEFAULTS["config"]
        return eff

    def _split_legacy(self, kwargs):
        """Old-style nsim options among the call's keywords: those the kernel function does not take."""
        hits = [k for k in _LEGACY if k in kwargs and not _accepts(self.fn, k)]
        if not hits:
            return kwargs, {}
        kwargs = dict(kwargs)
        legacy = {k: kwargs.pop(k) for k in hits}
        legacy = {k: v for k, v in legacy.items() if v is not None}  # None = "the default": nothing to do
        if legacy:
            warnings.warn("passing nsim options as keywords of the kernel call ({}) is deprecated: the kernel's "
                          "arguments are the kernel's; use kernel.options({}).simulate(...) or `with "
                          "nsim.options(...)`".format(", ".join(sorted(legacy)),
                                                      ", ".join("{}=...".format(k) for k in sorted(legacy))),
                          DeprecationWarning, stacklevel=_user_stacklevel())
        return kwargs, legacy

    # --- dialect hooks ---------------------------------------------------------------------------
    def _launch_fn(self):
        """The function traced for a launch (Beta 1: a loop over the launch grid)."""
        return self.fn

    def _cores(self):
        """Physical cores of a launch: the LNC degree (``kernel[2]``; Beta 1: the ``nl.nc`` factors)."""
        return int(getattr(self, "lnc", 1) or 1)

    def _check_inline(self):
        """Called before a kernel runs inline inside another kernel."""

    def _after_run(self, profile):
        """Called after a simulation (Beta-1 ``nki.benchmark`` records its latency)."""

    # --- tracing and running -----------------------------------------------------------------------
    def trace(self, *args, **kwargs):
        """Trace only: the TraceResult (kernel dict in ``.kernel``)."""
        if _tracer.active() is not None:
            raise _tracer.make_error("NestedKernel", "nested kernel tracing")
        eff = self._effective()
        name = getattr(self.fn, "__name__", "kernel")
        kw = dict(name=name, tensor_cls=self._tensor_cls, schedule=self._schedule,
                  config=eff["config"], overrides=eff.get("overrides"),
                  check=False if eff.get("timing_only") else
                  "strict" if eff.get("check") == "strict" else bool(eff.get("check")), loops=eff.get("loops"))
        close = None
        if eff.get("progress") is True:  # a long trace shows its progress too (a callable sees the run's only)
            try:
                from . import _core
            except ImportError:  # tracing without the simulator built: no clock
                _core = None
            if _core is not None:
                kw["progress"], close = _core._trace_progress_reporter(name)
        try:
            cores = self._cores()
            if cores > 1:  # LNC=2: one program per physical core (docs/lnc.md)
                tres = _tracer.trace_lnc(self._launch_fn(), args, kwargs, cores, **kw)
            else:
                tres = _tracer.trace(self._launch_fn(), args, kwargs, **kw)
        finally:
            if close is not None:
                close()
        self._record(last_json=tres.kernel)
        return tres

    def to_json(self, *args, **kwargs):
        """The kernel IR (kernel.json as a dict) for these arguments; without arguments, the last one traced."""
        if args or kwargs:
            return self.trace(*args, **kwargs).kernel
        if self.last_json is None:
            raise _tracer.make_error("NotTraced", "to_json(): the kernel has not been "
                                     "traced yet; pass its arguments")
        return self.last_json

    @_tracer.user_facing
    def simulate(self, *args, **kwargs):
        """Run the kernel with these arguments; return ``(return value, Profile)``. Called from inside
        another kernel: runs inline and returns ``(return value, None)``."""
        kwargs, legacy = self._split_legacy(kwargs)
        if _tracer.active() is not None:
            self._check_inline()
            return self.fn(*args, **kwargs), None
        opts = self._effective(legacy)
        for k in _TRACE_ONLY:
            opts.pop(k, None)
        tres = self.trace(*args, **kwargs)
        config = opts.pop("config")
        ret, outputs, profile = _tracer.run(tres, config=config, **opts)
        self._record(last_profile=profile, last_outputs=outputs)
        self._after_run(profile)
        return ret, profile

    @_tracer.user_facing
    def __call__(self, *args, **kwargs):
        if _tracer.active() is not None:  # sub-kernel: inline
            self._check_inline()
            return self.fn(*args, **kwargs)
        return self.simulate(*args, **kwargs)[0]

    def __repr__(self):
        return "<nsim kernel {}{}>".format(getattr(self.fn, "__name__", self.fn),
                                           " " + repr(self._opts) if self._opts else "")


@_tracer.user_facing
def simulate(kernel, *args, **kwargs):
    """``nsim.simulate(kernel, *args, **kwargs) -> (return value, Profile)``: every argument goes to the
    kernel (set nsim options with ``kernel.options(...)`` or ``with nsim.options(...)``). ``kernel`` is a
    kernel object of either dialect or a plain function (traced as a new-dialect kernel)."""
    if not isinstance(kernel, Kernel):
        from .nki import jit

        kernel = jit(kernel)
    return kernel.simulate(*args, **kwargs)
