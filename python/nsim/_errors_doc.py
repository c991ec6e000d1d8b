"""Generate docs/errors.md from the error-code table (sim/errors.def via ``_nsim.error_codes()``).

    python -m nsim._errors_doc           # rewrite docs/errors.md
    python -m nsim._errors_doc --check   # exit 1 when docs/errors.md is not the generated text

The prose above the marker line in docs/errors.md is hand-written and kept; everything below it is
generated (``tests/python/test_errors.py`` checks that the checked-in file is up to date).
"""
from __future__ import annotations

import os
import sys

from nsim import _core, _errors

MARKER = "<!-- Generated below by `python -m nsim._errors_doc` from sim/errors.def: do not edit by hand. -->"
DOC = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "docs", "errors.md")


def render_table() -> str:
    """The Markdown table of every code, in table order."""
    lines = ["| code | name | exception | raised when | fix |", "|---|---|---|---|---|"]
    for row in _errors.TABLE:
        cls = _core.FAMILY_CLASSES[row["family"]].__name__
        lines.append("| {} | {} | {} | {} | {} |".format(row["code"], row["name"], cls, row["meaning"], row["hint"]))
    return "\n".join(lines) + "\n"


def render(current: str) -> str:
    """The generated document: the hand-written prose of ``current`` up to the marker, then the table."""
    head = current.split(MARKER, 1)[0].rstrip("\n")
    return "{}\n\n{}\n\n{}".format(head, MARKER, render_table())


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    with open(DOC, encoding="utf-8") as f:
        current = f.read()
    text = render(current)
    if "--check" in argv:
        if text != current:
            sys.stderr.write("{} is not up to date: run python -m nsim._errors_doc\n".format(DOC))
            return 1
        return 0
    with open(DOC, "w", encoding="utf-8") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
