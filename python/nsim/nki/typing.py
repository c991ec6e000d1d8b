"""``nki.typing``: annotations (checked only in strict mode, which the tracer does not implement yet)."""
from __future__ import annotations


class _Subscriptable:
    def __init__(self, name):
        self._name = name

    def __getitem__(self, item):
        return self

    def __call__(self, *a, **k):
        return self

    def __repr__(self):
        return "nki.typing." + self._name


tensor = _Subscriptable("tensor")
mutable_tensor = _Subscriptable("mutable_tensor")


def scalar(x):
    """``nki.typing.scalar(t)``: the Python scalar of a one-element tile (nki-api.md 1.4; its value, read eagerly),
    anything else as given."""
    from ..tracer import NkiTensor
    if isinstance(x, NkiTensor) and x.size == 1:
        return x.item()
    return x
