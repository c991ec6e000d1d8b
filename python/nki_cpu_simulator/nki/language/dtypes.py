"""``nki.language.dtypes`` (also ``nki.dtype``): the NKI dtypes, the same objects as in ``nsim.nki.language``."""
import nsim.nki.language as _nl
from nki_cpu_simulator._delegate import delegate as _delegate

_DTYPES = ("bool_", "int8", "int16", "int32", "uint8", "uint16", "uint32", "float16", "float32", "bfloat16",
           "tfloat32", "float8_e4m3", "float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu", "float4_e2m1fn_x4",
           "float8_e4m3fn_x4", "float8_e5m2_x4")

__all__ = [n for n in _DTYPES if getattr(_nl, n, None) is not None]

_delegate(globals(), _nl)
