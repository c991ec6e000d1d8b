"""``nki.language``: forwards to ``nsim.nki.language``; ``nki.language.dtypes`` lists the dtypes."""
from nki_cpu_simulator._delegate import delegate as _delegate

from . import dtypes  # noqa: F401

_delegate(globals(), "nsim.nki.language")
