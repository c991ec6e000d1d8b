"""Names of the NKI API that nsim does not implement yet: each one is a function that raises
:class:`NotSupportedError` (an ``NsimError``/``KernelError``, error NotSupported of sim/errors.def) saying why. The reason
is also its ``__nsim_unsupported__`` attribute, which ``python -m nsim.nki._coverage`` lists in
``docs/nki-coverage.md``."""
from __future__ import annotations

from ..tracer import NotSupportedError, make_error  # noqa: F401  (NotSupportedError is re-exported)


REASONS = {
    # nki.isa, Tier 3 and 0.6-only
    "builtin_custom_op": "custom operators are not supported (spec §2.4)",
    # nki.language
    "all_reduce": "collectives across SPMD programs are out of nsim's scope (spec §3.6)",
    "indirect": "gen4 tensor-indirection views (per-element offsets from an index tile) are not in the kernel IR: "
                "runtime offsets exist only as one scalar or one row index per partition (tensor_copy, dma_copy)",
}

#: names the spec lists that nsim does not define at all, with the reason (shown by the coverage doc)
MISSING = {}


def stub(prefix, name, params="*args, **kwargs", reason=None):
    """A public function ``prefix.name(<params>)`` that raises NotSupportedError with the reason. With its
    real parameter list, Python itself rejects unknown keywords (TypeError naming the function)."""
    reason = reason or REASONS[name]
    qual = "{}.{}".format(prefix, name)
    ns = {"_raise": lambda: _raise(qual, reason)}
    exec("def {}({}):\n    _raise()\n".format(name, params), ns)  # noqa: S102 - a fixed parameter list
    fn = ns[name]
    fn.__qualname__ = name
    fn.__doc__ = "Not supported yet by nsim: {}.".format(reason)
    fn.__nsim_unsupported__ = reason
    return fn


def _raise(qual, reason):
    raise make_error("NotSupported", "{} is not supported yet by nsim: {}".format(qual, reason))


def install(namespace, prefix, sigs):
    """Define a stub for each ``{name: parameter list}`` of ``sigs`` missing from the module globals."""
    for n, params in sigs.items():
        if n not in namespace:
            fn = stub(prefix, n, params)
            fn.__module__ = namespace["__name__"] + "._unsupported"
            namespace[n] = fn


def stub_method(name, reason=None):
    """A tensor method that raises NotSupportedError."""
    reason = reason or REASONS[name]

    def m(self, *args, **kwargs):
        raise make_error("NotSupported", "tensor.{}() is not supported yet by nsim: {}".format(
            name, reason))

    m.__name__ = m.__qualname__ = name
    m.__nsim_unsupported__ = reason
    return m


def stub_class(prefix, name, reason=None):
    """A class whose construction raises NotSupportedError."""
    reason = reason or REASONS[name]

    def __init__(self, *args, **kwargs):
        raise make_error("NotSupported", "{}.{} is not supported yet by nsim: {}".format(
            prefix, name, reason))

    return type(name, (), {"__init__": __init__, "__nsim_unsupported__": reason, "__doc__": reason})


def _install_view_stubs():
    from ..tracer import NkiTensor
    for n in ("indirect",):
        if not hasattr(NkiTensor, n):
            setattr(NkiTensor, n, stub_method(n))


_install_view_stubs()


#: names the spec lists as unsupported by NKI itself (§2.4: "builtin_custom_op — unsupported"): nsim raises
#: NotSupportedError for them as NKI does, and the coverage percentages do not count them.
NOT_IN_NKI = frozenset({"builtin_custom_op"})
