"""``nki.isa``: forwards to ``nsim.nki.isa``; ``nki.isa.constants`` re-exports the enums."""
from nki_cpu_simulator._delegate import delegate as _delegate

from . import constants  # noqa: F401

_delegate(globals(), "nsim.nki.isa")
