"""``nki.tensor``: the tensor class of nsim's new dialect (``NkiTensor``, views never copy)."""
from nsim.tracer import NkiTensor  # noqa: F401
from nki_cpu_simulator._delegate import delegate as _delegate

try:  # if nsim grows its own nki.tensor module, forward to it
    import nsim.nki.tensor as _target  # type: ignore
except ImportError:
    _target = None

if _target is not None:
    _delegate(globals(), _target)
