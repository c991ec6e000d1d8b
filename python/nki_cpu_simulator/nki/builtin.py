"""``nki_cpu_simulator.nki.builtin``: set as ``builtins.builtin`` by the nki-library harness.

Its contents in AWS's simulator are not documented; nsim forwards every name to ``nsim.nki.language``
and then ``nsim.nki.isa``, and offers the sub-modules as ``builtin.language``/``builtin.isa``.
"""
from __future__ import annotations

from nki_cpu_simulator._delegate import delegate as _delegate

from . import isa, language  # noqa: F401

_delegate(globals(), "nsim.nki.language", "nsim.nki.isa")
