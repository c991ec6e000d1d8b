#!/usr/bin/env python3
"""Write kernel.json files generated from the nsim.kernels library into examples/library/<name>.json.

Every entry of ``nsim.kernels.KERNELS`` (kernel, reference, make_inputs) is traced with
``make_inputs(SEED)`` (``nsim.trace_kernel``); the JSON depends only on the shapes, dtypes and scalar
arguments, not on the input values. Ops' ``loc`` point at the kernel's source line in
``python/nsim/kernels/`` (repository-relative), so the output is deterministic and independent of where
the repository lives.

    PYTHONPATH=python python3 examples/export_from_library.py              # rewrites examples/library/
    PYTHONPATH=python python3 examples/export_from_library.py --out DIR    # elsewhere
    PYTHONPATH=python python3 examples/export_from_library.py --list       # names and op counts
    build/nsim run examples/library/flash_attention_gqa.json --config trn2

``export(name)`` returns (kernel dict, {input tensor name: array}, TraceResult) for use from Python (the
inputs are those of make_inputs(SEED), keyed by the tensor names of the JSON; save them with np.savez and
pass the .npz to ``nsim run --inputs``).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
DEFAULT_OUT = os.path.join(REPO_ROOT, "examples", "library")
SEED = 0

try:
    import nsim  # noqa: F401
except ImportError:  # run from a checkout without PYTHONPATH
    sys.path[:0] = [os.path.join(REPO_ROOT, "python"), os.path.join(REPO_ROOT, "build", "python")]
    import nsim  # noqa: F401

import nsim.tracer as _tracer  # noqa: E402
from nsim import kernels as K  # noqa: E402

_KERNELS_DIR = os.path.dirname(os.path.abspath(K.__file__))


def _library_loc():
    """Source location of the innermost frame in nsim/kernels/ (the library kernel's line), with a
    repository-relative path; falls back to the tracer's default (the caller's frame)."""
    f = sys._getframe(1)
    while f is not None:
        fn = os.path.abspath(f.f_code.co_filename)
        if fn.startswith(_KERNELS_DIR + os.sep):
            rel = os.path.relpath(fn, REPO_ROOT) if fn.startswith(REPO_ROOT + os.sep) else os.path.join(
                "nsim", "kernels", os.path.basename(fn))
            return {"file": rel.replace(os.sep, "/"), "line": f.f_lineno, "function": f.f_code.co_name}
        f = f.f_back
    loc = _orig_user_loc()
    loc["file"] = os.path.basename(loc["file"]) if loc.get("file") else ""
    return loc


_orig_user_loc = _tracer.user_loc


@contextlib.contextmanager
def _library_locs():
    _tracer.user_loc = _library_loc
    try:
        yield
    finally:
        _tracer.user_loc = _orig_user_loc


def names():
    return sorted(K.KERNELS)


def export(name, seed=SEED):
    """(kernel dict, {input tensor name: numpy array}, TraceResult) of library kernel ``name``."""
    kernel, _ref, make_inputs = K.KERNELS[name]
    args = make_inputs(seed)
    with _library_locs():
        tres = kernel.trace(*args)
    kj = dict(tres.kernel, name=name)
    return kj, dict(tres.inputs), tres


def dumps(kernel):
    """Deterministic text: one tensor / statement per line (loops, if any, indented)."""
    def enc(x):
        return json.dumps(x, separators=(", ", ": "))

    def body(stmts, ind):
        lines = []
        for i, s in enumerate(stmts):
            sep = "," if i + 1 < len(stmts) else ""
            if "loop" in s:
                lp = {k: v for k, v in s["loop"].items() if k != "body"}
                head = enc(lp)[:-1] + (", " if lp else "") + '"body": ['
                lines.append(ind + '{"loop": ' + head)
                lines.extend(body(s["loop"].get("body", []), ind + "  "))
                lines.append(ind + "]}}" + sep)
            else:
                lines.append(ind + enc(s) + sep)
        return lines

    out = ["{", '"nsim_kernel": {},'.format(enc(kernel["nsim_kernel"])), '"name": {},'.format(enc(kernel["name"]))]
    extra = [k for k in kernel if k not in ("nsim_kernel", "name", "tensors", "body")]
    for k in extra:
        out.append("{}: {},".format(enc(k), enc(kernel[k])))
    out.append('"tensors": [')
    ts = kernel["tensors"]
    out.extend(" " + enc(t) + ("," if i + 1 < len(ts) else "") for i, t in enumerate(ts))
    out.append("],")
    out.append('"body": [')
    out.extend(body(kernel["body"], " "))
    out.append("]")
    out.append("}")
    return "\n".join(out) + "\n"


def op_count(kernel):
    def walk(b):
        return sum(walk(s["loop"].get("body", [])) if "loop" in s else int("op" in s) for s in b)
    return walk(kernel["body"])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=DEFAULT_OUT, help="output directory [default: examples/library]")
    ap.add_argument("--list", action="store_true", help="print the kernels and their op counts, write nothing")
    ap.add_argument("names", nargs="*", help="kernels to export [default: all of nsim.kernels.KERNELS]")
    a = ap.parse_args(argv)
    todo = a.names or names()
    unknown = [n for n in todo if n not in K.KERNELS]
    if unknown:
        ap.error("unknown kernel(s) {}; known: {}".format(", ".join(unknown), ", ".join(names())))
    if not a.list:
        os.makedirs(a.out, exist_ok=True)
    for n in todo:
        kj, _inputs, _ = export(n)
        if a.list:
            print("{:24s} {:6d} ops".format(n, op_count(kj)))
            continue
        path = os.path.join(a.out, n + ".json")
        with open(path, "w", encoding="utf-8", newline="\n") as f:
            f.write(dumps(kj))
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
