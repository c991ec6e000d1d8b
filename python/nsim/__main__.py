"""``python -m nsim``: run unmodified NKI scripts on nsim.

    python -m nsim run script.py [args...]   install nsim.compat (import nki -> nsim), run script as __main__
    python -m nsim cli [args...]             exec the C++ ``nsim`` command-line tool (if it can be found)
    python -m nsim --help | --version
"""
from __future__ import annotations

import os
import shutil
import sys

USAGE = """usage: python -m nsim run SCRIPT.py [ARGS...]
       python -m nsim cli [NSIM-CLI-ARGS...]
       python -m nsim --help | --version

commands:
  run SCRIPT.py [ARGS...]  Run an NKI kernel script written for the real toolchain, unchanged, on nsim:
                           `import nki`, `nki.language`, `nki.isa`, `nki.isa.constants`, `nki.typing`,
                           `nki.compiler`, `nki.tensor`, `nki.dtype` resolve to nsim's new dialect, and
                           `neuronxcc.nki` (Beta 1: `nl.load`, value-returning ops, launch grids) to
                           nsim.nki.beta1 (see nsim.compat). sys.argv of the script is
                           [SCRIPT.py, ARGS...]; its directory is put first on sys.path.
  cli [ARGS...]            Execute the C++ `nsim` CLI (next to the package, in build/, or on PATH),
                           e.g. `python -m nsim cli kernel.json --config trn2`.
"""


def _find_cli():
    import sysconfig

    here = os.path.dirname(os.path.abspath(__file__))
    cands = [os.path.join(here, "bin", "nsim"), os.path.join(here, "nsim"),
             os.path.join(here, "..", "..", "build", "nsim"), os.path.join(os.getcwd(), "build", "nsim"),
             # an installed wheel's scripts: found without an activated venv (PATH need not name them)
             os.path.join(sysconfig.get_path("scripts"), "nsim"),
             os.path.join(os.path.dirname(sys.executable), "nsim")]
    for c in cands:
        c = os.path.normpath(c)
        if os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    found = shutil.which("nsim")
    if found and os.path.realpath(found) != os.path.realpath(sys.argv[0]):
        return found
    return None


def _run(argv):
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m nsim run SCRIPT.py [ARGS...]", file=sys.stderr if not argv else sys.stdout)
        return 2 if not argv else 0
    script = argv[0]
    if not os.path.isfile(script):
        print("python -m nsim run: no such file: {}".format(script), file=sys.stderr)
        return 2
    import runpy

    from nsim import compat

    compat.install()
    sys.argv = list(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        code = e.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code
        print(code, file=sys.stderr)
        return 1
    return 0


def _cli(argv):
    exe = _find_cli()
    if exe is None:
        print("python -m nsim cli: the C++ nsim binary was not found (build it with "
              "`cmake --build build --target nsim`)", file=sys.stderr)
        return 127
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(exe, [exe] + list(argv))
    return 0  # not reached


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        sys.stdout.write(USAGE)
        return 0 if argv else 2
    if argv[0] in ("-V", "--version"):
        import nsim

        print("nsim {}".format(nsim.__version__))
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd == "run":
        return _run(rest)
    if cmd == "cli":
        return _cli(rest)
    print("python -m nsim: unknown command {!r}\n".format(cmd), file=sys.stderr)
    sys.stderr.write(USAGE)
    return 2


def run_script_main():
    """Console script ``nsim-run SCRIPT.py [ARGS...]`` = ``python -m nsim run SCRIPT.py [ARGS...]``."""
    return _run(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
