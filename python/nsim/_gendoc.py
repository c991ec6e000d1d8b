"""The part of nsim's generated documents they share (docs/errors.md by ``nsim._errors_doc``, docs/config.md by
``nsim._config_doc``): hand-written prose above a marker line, a generated table below it, and a ``main`` that
rewrites the file or, with ``--check``, exits 1 when the checked-in file is not the generated text."""
from __future__ import annotations

import os
import sys


def render(current: str, marker: str, table: str) -> str:
    """The generated document: the hand-written prose of ``current`` up to the marker, then the table."""
    head = current.split(marker, 1)[0].rstrip("\n")
    return "{}\n\n{}\n\n{}".format(head, marker, table)


def main(argv, doc: str, render_fn, module: str) -> int:
    argv = sys.argv[1:] if argv is None else argv
    current = ""
    if os.path.exists(doc):
        with open(doc, encoding="utf-8") as f:
            current = f.read()
    text = render_fn(current)
    if "--check" in argv:
        if text != current:
            sys.stderr.write("{} is not up to date: run python -m {}\n".format(doc, module))
            return 1
        return 0
    with open(doc, "w", encoding="utf-8") as f:
        f.write(text)
    return 0
