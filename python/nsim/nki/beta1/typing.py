"""``neuronxcc.nki.typing`` (Beta 1): ``tensor[...]``, ``mutable_tensor``, ``scalar`` annotations (checked only
in strict mode, which nsim does not implement yet)."""
from __future__ import annotations

from ..typing import tensor, mutable_tensor, scalar  # noqa: F401
