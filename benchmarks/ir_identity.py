"""The same kernel IR from two versions of the Python tracer, over the whole Python test suite: a pytest plugin
that logs a digest of every kernel the tests trace, and a comparison of two logs.

For speed work on the tracer (issue 12): a change meant to make tracing faster must leave every traced kernel as
it was, byte for byte. Each ``trace()`` of the suite writes one line, ``<test id> <kernel name> <sha1 of the
kernel dict as sorted JSON>``, in the order the tests trace them (in source locations, the directory of the
nsim package imported, absolute or relative, and the numbered directory of pytest's ``tmp_path``, written as one
name each: they differ between the runs). To compare against a commit, extract it (``git archive REV | tar -x -C /tmp/base``) and run the
baseline with ``PYTHONPATH=benchmarks:/tmp/base/python:build/python``; the two runs may go at the same time.

    IR_LOG=/tmp/ir_before.log PYTHONPATH=benchmarks:python:build/python python3 -m pytest -q -p ir_identity \\
        tests/python -p no:cacheprovider
    ... the same with the changed tracer into /tmp/ir_after.log ...
    python3 benchmarks/ir_identity.py /tmp/ir_before.log /tmp/ir_after.log

The comparison lists the traces whose digests differ (and tests that traced a different number of kernels); it
exits with 1 when any differ. (Tests that fail for a reason of their own still log what they traced.)
"""
import collections
import hashlib
import json
import os
import re
import sys

# pytest's temporary directories (a kernel written to tmp_path by a test) are numbered per session
_TMP = re.compile(r"pytest-of-[^/\\]+[/\\]pytest-\d+")
# a source file of the nsim package written relative to the checkout or to the package's parent
_REL = re.compile(r'"(?:python/)?nsim/')


_LOG = []


def pytest_configure(config):
    import nsim
    from nsim import tracer
    pkg = os.path.dirname(os.path.abspath(nsim.__file__))  # (the library kernels' source locations hold it)
    log = open(os.environ.get("IR_LOG", "/tmp/ir.log"), "a")
    _LOG.append(log)
    orig = tracer._trace

    def wrapped(fn, *args):
        tres = orig(fn, *args)
        test = os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0]
        text = _TMP.sub("<pytest tmp>", json.dumps(tres.kernel, sort_keys=True, default=repr)).replace(pkg, "<nsim>")
        text = _REL.sub('"<nsim>/', text)  # (examples/export_from_library.py writes them relative)
        log.write("{} {} {}\n".format(test, getattr(fn, "__name__", "?"), hashlib.sha1(text.encode()).hexdigest()))
        log.flush()
        return tres

    tracer._trace = wrapped


def pytest_unconfigure(config):
    while _LOG:
        _LOG.pop().close()


def _load(path):
    d = collections.defaultdict(list)
    for line in open(path):
        p = line.split()
        if len(p) == 3:
            d[p[0]].append((p[1], p[2]))
    return d


def main(a, b):
    x, y = _load(a), _load(b)
    bad = 0
    for test in sorted(set(x) | set(y)):
        if x.get(test) == y.get(test):
            continue
        bad += 1
        xs, ys = x.get(test, []), y.get(test, [])
        if len(xs) != len(ys):
            print("{}: {} traces against {}".format(test, len(xs), len(ys)))
        else:
            names = sorted({n for (n, h), (_, h2) in zip(xs, ys) if h != h2})
            print("{}: different IR of {}".format(test, ", ".join(names)))
    print("{} tests, {} traces: {}".format(len(set(x) | set(y)), sum(len(v) for v in y.values()),
                                          "identical" if not bad else "{} tests differ".format(bad)))
    return 1 if bad else 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python3 benchmarks/ir_identity.py BEFORE.log AFTER.log")
    sys.exit(main(sys.argv[1], sys.argv[2]))
