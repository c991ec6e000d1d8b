"""Error codes by name, from the one table of them: ``sim/errors.def``, exposed by the ``_nsim``
extension as ``_nsim.error_codes()``. Python code raises an error by its table name
(``make_error("BadReshape", msg)`` in :mod:`nsim.tracer`), never by a typed code; the exception class
of a code comes from its family (:func:`nsim._core.error_class`). ``tests/python/test_errors.py``
checks that every name used in the package is a row of the table.

Without the extension (tracing only) the table is empty and the name stands in for the code.
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

try:  # installed package
    from nsim import _nsim  # type: ignore[attr-defined]
except ImportError:  # build tree: build/python/_nsim*.so on sys.path
    try:
        import _nsim  # type: ignore[no-redef]
    except ImportError:  # pragma: no cover - depends on the build
        _nsim = None

#: Every row of sim/errors.def: dicts with code (the NSIM-Exxx string), name, family, meaning, hint.
TABLE: Tuple[Dict[str, str], ...] = tuple(_nsim.error_codes()) if _nsim is not None else ()
BY_NAME: Dict[str, Dict[str, str]] = {row["name"]: row for row in TABLE}
BY_CODE: Dict[str, Dict[str, str]] = {row["code"]: row for row in TABLE}


def code(name: str) -> str:
    """The code string (NSIM-Exxx) of the table row ``name`` ("BadReshape")."""
    row = BY_NAME.get(name)
    if row is not None:
        return row["code"]
    if TABLE:
        raise LookupError("no error named {!r} in sim/errors.def".format(name))
    return name  # the extension is not built


def family(code_str: str) -> Optional[str]:
    """The family ("kernel", "not_supported", ...) of a code, None for a code not in the table."""
    row = BY_CODE.get(code_str)
    return row["family"] if row is not None else None


def hint(code_str: str) -> str:
    """What usually fixes an error of this code (the table's hint column), "" for a code not in the table."""
    row = BY_CODE.get(code_str)
    return row["hint"] if row is not None else ""


class NkiValidationError(AssertionError):
    """A hardware-constraint violation (nki-api.md 4.1): shape limits, dtypes, buffers, engine restrictions,
    generation requirements, accesses out of bounds. An ``AssertionError``, as the AWS simulator's messages are,
    so that a test written against it (``pytest.raises(AssertionError)``, ``nki.isa.NkiValidationError``) catches
    nsim's errors of these kinds; ``nki.isa.NkiValidationError`` is this class. nsim raises it through the
    classes below that derive from it (OperandError, AccessError, KernelValidationError), whose ``code`` is the
    stable NSIM-Exxx code (decision, docs/errors.md)."""
