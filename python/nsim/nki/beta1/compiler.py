"""``neuronxcc.nki.compiler`` (Beta 1): compiler directives and allocators, accepted as no-ops (spec §1.4).
The same objects as nsim's ``nki.compiler`` stand-in (``nki_cpu_simulator.nki.compiler``)."""
from __future__ import annotations

from nki_cpu_simulator.nki.compiler import (  # noqa: F401
    skip_middle_end_transformations, enable_stack_allocator, force_auto_alloc, no_reorder, allocation_scope,
    multi_buffer, sbuf, psum)
