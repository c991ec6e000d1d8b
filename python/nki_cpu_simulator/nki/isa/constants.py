"""``nki.isa.constants``: the ISA enums (spec §2.5), the same objects as in ``nsim.nki.isa``."""
import nsim.nki.isa as _isa
from nki_cpu_simulator._delegate import delegate as _delegate

_ENUMS = ("engine", "reduce_cmd", "dge_mode", "oob_mode", "matmul_perf_mode", "nc_version", "dma_engine",
          "tensor_engine", "vector_engine", "scalar_engine", "gpsimd_engine", "unknown_engine", "dma_engine")

__all__ = sorted(set(n for n in _ENUMS if hasattr(_isa, n)))

_delegate(globals(), _isa)
