"""Coverage of the NKI API spec by nsim, per dialect: ``python -m nsim.nki._coverage [spec.md] [--out FILE]``.

Reads the names of the API sections of the spec (``../shared/spec/nki-api.md`` beside the repository, or
the path given): ``nki.isa`` (§2.1–§2.5), ``nki.language`` (loops §1.7, buffers §3.1, dtypes §3.2,
creation §3.4, value functions §3.6, ``tile_size`` §3.7) and the tensor view methods (§3.9, plus the Beta-1
methods of §1.2), then looks each one up in nsim's two dialects. A name is

- **implemented**: defined and not a stub;
- **not supported: <reason>**: a stub that raises ``NotSupportedError`` (``nsim.nki._unsupported``);
- **missing**: not defined at all;
- **n/a**: the spec says the dialect does not have it.

``docs/nki-coverage.md`` is this script's output (``tests/python/test_nki_coverage.py`` checks it is up to
date).
"""
from __future__ import annotations

import os
import re
import sys

from nsim import _errors
from nsim.nki import _unsupported

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def default_spec():
    d = os.environ.get("NSIM_SPEC_DIR") or os.path.join(os.path.dirname(_ROOT), "shared", "spec")
    return os.path.join(d, "nki-api.md")


def _sections(text):
    """{section number ("2.3"): body text} of the '### n.m Title' sections."""
    out = {}
    parts = re.split(r"^### (\d+\.\d+) [^\n]*$", text, flags=re.M)
    for i in range(1, len(parts) - 1, 2):
        out[parts[i]] = parts[i + 1]
    return out


def _rows(body):
    """Table rows (lists of cell texts) of a section body."""
    rows = []
    for line in body.splitlines():
        if line.startswith("|") and not re.match(r"^\|[-| ]+\|$", line):
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
            rows.append(cells)
    return rows[1:] if rows else rows  # drop the header


def _calls(cell):
    """Identifiers written as calls (`name(`) inside backticks of a cell."""
    return re.findall(r"`(?:[a-z]+\.)?([A-Za-z_][A-Za-z0-9_]*)\(", cell)


def _ticked(cell):
    """Identifiers of a cell: each backticked span's words (``nl.``/``nisa.`` prefixes dropped)."""
    out = []
    for span in re.findall(r"`([^`]*)`", cell):
        span = re.sub(r"\(.*", "", span)
        for w in span.split():
            w = w.strip(",")
            w = re.sub(r"^(nl|nisa|nki)\.", "", w)
            if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", w):
                out.append(w)
    return out


def _uniq(items):
    seen, out = set(), []
    for it in items:
        if it[0] not in seen:
            seen.add(it[0])
            out.append(it)
    return out


def spec_names(text):
    """{group: [(name, tier, dialects)]} where dialects is a subset of {"new", "beta1"}."""
    sec = _sections(text)
    both, new, b1 = {"new", "beta1"}, {"new"}, {"beta1"}
    isa = []
    for s, tier in (("2.1", "1"), ("2.2", "2")):
        for head in re.findall(r"^#### (.*)$", sec.get(s, ""), flags=re.M):
            for n in re.findall(r"`nisa\.([A-Za-z_0-9]+)`", head):
                isa.append((n, tier, both))
    for row in _rows(sec.get("2.3", "")):
        if len(row) < 2:
            continue
        d = new if row[1].strip() in ("—", "-", "") else both
        for n in _calls(row[0]):
            isa.append((n, "3", d))
    for bullet in re.split(r"^- ", sec.get("2.4", ""), flags=re.M)[1:]:
        if "Removed in 0.4" in bullet:
            d = b1
        elif "Beta 1" in bullet:
            d = both
        else:
            d = new
        names = _calls(bullet)
        if "builtin_custom_op" in bullet:
            names.append("builtin_custom_op")
        for n in names:
            if n not in ("op0", "op1", "op"):
                isa.append((n, "2.4", d))
    for row in _rows(sec.get("2.5", "")):
        if row and row[0] == "Classes":
            for n in _ticked(row[1]):
                if n[0].isupper():
                    isa.append((n, "enum", new))
        elif row:
            for n in _ticked(row[0]):
                isa.append((n, "enum", both))
    lang = []
    for row in _rows(sec.get("1.7", "")):
        for n in _ticked(row[0]):
            if n not in ("range", "while", "if", "for", "reg"):
                lang.append((n, "loop", both if n != "fori_loop" and n != "while_loop" else new))
    for row in _rows(sec.get("3.1", "")):
        for n in _ticked(row[0]):
            lang.append((n, "buffer", both))
    m = re.search(r"Predicates:(.*?)\.\s", sec.get("3.1", ""), flags=re.S)
    lang.append(("MemoryRegion", "buffer", both))
    for n in _calls(m.group(1) if m else ""):
        lang.append((n, "buffer", both))
    for row in _rows(sec.get("3.2", "")):
        for n in _ticked(row[0]):
            lang.append((n, "dtype", both))
    for n in ("fp32", "bfp16", "finfo", "static_cast"):
        lang.append((n, "dtype", both))
    for row in _rows(sec.get("3.4", "")):
        for n in _calls(row[0]):
            lang.append((n, "create", both))
    for row in _rows(sec.get("3.6", "")):
        d = b1 if "Beta 1 only" in row[0] else both
        for n in _ticked(row[0]):
            if n not in ("axis", "compute_dtype", "dtype", "keepdims", "x"):
                lang.append((n, "value", d))
    for row in _rows(sec.get("3.7", "")):
        for n in _ticked(row[0]):
            lang.append(("tile_size." + n, "tile_size", both))
    meth = []
    for row in _rows(sec.get("3.9", "")):
        for n in _calls(row[0]) + [w for w in _ticked(row[0]) if w in ("reinterpret_cast",)]:
            meth.append((n, "view", new))
    for n in ("astype", "broadcast_to", "reshape", "view", "expand_dims", "assert_shape"):
        meth.append((n, "view", b1 if n in ("astype", "expand_dims", "assert_shape", "broadcast_to") else both))
    # a name listed for both Beta 1 only and new in different places counts for both
    def merge(items):
        acc = {}
        order = []
        for n, t, d in items:
            if n not in acc:
                acc[n] = [t, set(d)]
                order.append(n)
            else:
                acc[n][1] |= set(d)
        return [(n, acc[n][0], acc[n][1]) for n in order]

    return {"nki.isa": merge(isa), "nki.language": merge(lang), "tensor methods": merge(meth)}


def _modules():
    from . import isa as nisa, language as nl
    from .beta1 import isa as b1isa, language as b1nl
    from ..tracer import NkiTensor
    return {"nki.isa": {"new": nisa, "beta1": b1isa},
            "nki.language": {"new": nl, "beta1": b1nl},
            "tensor methods": {"new": NkiTensor, "beta1": b1nl.Tensor}}


def status(obj, name):
    cur = obj
    for part in name.split("."):
        if not hasattr(cur, part):
            from ._unsupported import MISSING
            return "not supported: " + MISSING[name] if name in MISSING else "missing"
        cur = getattr(cur, part)
    reason = getattr(cur, "__nsim_unsupported__", None)
    if reason:
        return "not supported: " + reason
    return "implemented"


def table(text):
    """[(group, name, tier, {dialect: status})]."""
    mods = _modules()
    out = []
    for group, items in spec_names(text).items():
        for name, tier, dialects in items:
            st = {}
            for d in ("new", "beta1"):
                st[d] = status(mods[group][d], name) if d in dialects else "n/a"
            out.append((group, name, tier, st))
    return out


def tier3_and_24(rows):
    """(implemented, counted) over the nki.isa names of Tier 3 and §2.4 in every dialect that has them,
    leaving out the names NKI itself does not support (issue 10's acceptance: >= 90%)."""
    sts = [s[d] for g, n, t, s in rows for d in ("new", "beta1")
           if g == "nki.isa" and t in ("3", "2.4") and s[d] != "n/a" and n not in _unsupported.NOT_IN_NKI]
    return sum(1 for s in sts if s == "implemented"), len(sts)


def _share(pair):
    imp, total = pair
    return "{}/{} implemented ({:.0f}%)".format(imp, total, 100.0 * imp / total if total else 100.0)


def render(text):
    rows = table(text)
    lines = ["# NKI API coverage of nsim", "",
             "Generated by `python -m nsim.nki._coverage` from the API sections of `shared/spec/nki-api.md`",
             "(do not edit by hand; `tests/python/test_nki_coverage.py` checks it is up to date).",
             "", "Status per dialect: **implemented**; **not supported** (raises `NotSupportedError`, code",
             _errors.code("NotSupported") + ", with the reason below); **missing** (not defined); **n/a** (the "
             "dialect does not have it).",
             ""]
    lines.append("## Summary")
    lines.append("")
    lines.append("| Group | Tier | Dialect | implemented | not supported | missing |")
    lines.append("|---|---|---|---|---|---|")
    groups = []
    for g, _n, t, _s in rows:
        if (g, t) not in groups:
            groups.append((g, t))
    for g, t in groups:
        for d in ("new", "beta1"):
            sts = [s[d] for gg, _n, tt, s in rows if gg == g and tt == t and s[d] != "n/a"]
            if not sts:
                continue
            imp = sum(1 for s in sts if s == "implemented")
            ns = sum(1 for s in sts if s.startswith("not supported"))
            mi = sum(1 for s in sts if s == "missing")
            lines.append("| {} | {} | {} | {}/{} ({:.0f}%) | {} | {} |".format(g, t, d, imp, len(sts),
                                                                                100.0 * imp / len(sts), ns, mi))
    lines += ["", "Tier 3 and §2.4 of `nki.isa` together, both dialects, not counting names NKI itself does not "
              "support ({}): {}.".format(", ".join("`{}`".format(n) for n in sorted(_unsupported.NOT_IN_NKI)),
                                          _share(tier3_and_24(rows)))]
    for g in ("nki.isa", "nki.language", "tensor methods"):
        lines += ["", "## " + g, "", "| Name | Tier | `nki` (new) | `neuronxcc.nki` (Beta 1) |", "|---|---|---|---|"]
        for gg, n, t, s in rows:
            if gg == g:
                lines.append("| `{}` | {} | {} | {} |".format(n, t, s["new"], s["beta1"]))
    return "\n".join(lines) + "\n"


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    out = None
    if "--out" in argv:
        i = argv.index("--out")
        out = argv[i + 1]
        del argv[i:i + 2]
    spec = argv[0] if argv else default_spec()
    with open(spec, encoding="utf-8") as f:
        doc = render(f.read())
    if out:
        with open(out, "w", encoding="utf-8") as f:
            f.write(doc)
    else:
        sys.stdout.write(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
