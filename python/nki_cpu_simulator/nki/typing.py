"""``nki.typing``: forwards to ``nsim.nki.typing`` (``tensor[...]``, ``mutable_tensor``, ``scalar``)."""
from nki_cpu_simulator._delegate import delegate as _delegate

_delegate(globals(), "nsim.nki.typing")
