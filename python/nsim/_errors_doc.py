"""Generate docs/errors.md from the error-code table (sim/errors.def via ``_nsim.error_codes()``).

    python -m nsim._errors_doc           # rewrite docs/errors.md
    python -m nsim._errors_doc --check   # exit 1 when docs/errors.md is not the generated text

The prose above the marker line in docs/errors.md is hand-written and kept; everything below it is
generated (``tests/python/test_errors.py`` checks that the checked-in file is up to date).
"""
from __future__ import annotations

import os
import sys

from nsim import _core, _errors, _gendoc

MARKER = "<!-- Generated below by `python -m nsim._errors_doc` from sim/errors.def: do not edit by hand. -->"
DOC = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "docs", "errors.md")


def render_table() -> str:
    """The Markdown table of every code, in table order."""
    lines = ["| code | name | exception | raised when | fix |", "|---|---|---|---|---|"]
    for row in _errors.TABLE:
        cls = _core.error_class(row["code"]).__name__
        lines.append("| {} | {} | {} | {} | {} |".format(row["code"], row["name"], cls, row["meaning"], row["hint"]))
    return "\n".join(lines) + "\n"


def render(current: str) -> str:
    """The generated document: the hand-written prose of ``current`` up to the marker, then the table."""
    return _gendoc.render(current, MARKER, render_table())


def main(argv=None) -> int:
    return _gendoc.main(argv, DOC, render, "nsim._errors_doc")


if __name__ == "__main__":
    sys.exit(main())
