"""Generate docs/config.md from the parameter schema (engines/params.def via ``_nsim.param_schema()``) and
the presets' resolved values (``_nsim.config_values``).

    python -m nsim._config_doc           # rewrite docs/config.md
    python -m nsim._config_doc --check   # exit 1 when docs/config.md is not the generated text

The prose above the marker line in docs/config.md is hand-written and kept; everything below it is
generated (``tests/python/test_isa_tables.py`` checks that the checked-in file is up to date).
"""
from __future__ import annotations

import os
import sys

from nsim import _gendoc, _isa

MARKER = "<!-- Generated below by `python -m nsim._config_doc` from engines/params.def: do not edit by hand. -->"
DOC = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "docs", "config.md")
#: The presets shown (configs/*.yaml), oldest generation first.
PRESETS = ("trn1", "trn2", "trn3")


def _num(x) -> str:
    return "{:g}".format(x) if isinstance(x, float) else str(x)


def _value(v, unit: str) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (list, tuple)):
        return ", ".join(str(e) for e in v) or "(empty)"
    if isinstance(v, (int, float)):
        return "{} {}".format(_num(v), unit).strip()
    return str(v)


def render_table() -> str:
    """The Markdown table of every parameter, in schema order, with each preset's value."""
    values = {p: _isa.config_values(p) for p in PRESETS}
    lines = ["| key | kind | range | {} | meaning |".format(" | ".join(PRESETS)),
             "|---|---|---|{}---|".format("---|" * len(PRESETS))]
    for row in _isa.PARAMS:
        kind, unit = row["kind"], row["unit"]
        ranged = kind not in ("string", "string_list", "bool")
        rng = "[{}, {}] {}".format(_num(row["min"]), _num(row["max"]), unit).strip() if ranged else ""
        vals = " | ".join(_value(values[p][row["key"]], unit).replace("|", "\\|") for p in PRESETS)
        lines.append("| `{}` | {} | {} | {} | {} |".format(row["key"], kind, rng, vals,
                                                          row["description"].replace("|", "\\|")))
    return "\n".join(lines) + "\n"


def render(current: str) -> str:
    """The generated document: the hand-written prose of ``current`` up to the marker, then the table."""
    return _gendoc.render(current, MARKER, render_table())


def main(argv=None) -> int:
    return _gendoc.main(argv, DOC, render, "nsim._config_doc")


if __name__ == "__main__":
    sys.exit(main())
