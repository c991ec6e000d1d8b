"""Kept loops against unrolled traces over the whole Python test suite: a pytest plugin and its summary.

Every kernel the tests trace with loops kept (the tracer's default) is traced again with every loop unrolled
(``loops="unroll"``) and both are simulated timing-only; one line per trace goes to the log: ``SAME kernel test``
or ``DIFF +x.xx% kept=.. unrolled=.. kernel test`` (kept against unrolled). Kernels of more than 60,000 executed
instructions, and traces without a kernel-IR loop, are skipped. The tests themselves may fail under the plugin
(it traces each kernel twice: a test counting traces or calls sees two); the log is what it is for.

    KV_LOG=/tmp/kv.log PYTHONPATH=benchmarks:python:build/python python3 -m pytest -q -p kept_vs_unrolled \\
        tests/python -p no:cacheprovider --deselect tests/python/test_examples_from_library.py
    python3 benchmarks/kept_vs_unrolled.py /tmp/kv.log [/tmp/kv_other.log ...]   # summary, or runs compared

With several logs (a baseline first, then runs of changed code), the traces all of them hold are compared: how
many moved closer to or further from their unrolled time in the last run than in the first, and, kernel by kernel,
the sum of |kept/unrolled - 1| in each run for the kernels whose sums differ. A subset of the suite (some test
files) gives a quick first look; the comparison takes the traces the logs share.

``KV_DUMP=name`` also writes the last kept and unrolled kernel.json of kernel ``name`` to /tmp/kv_keep.json and
/tmp/kv_unroll.json (for ``nsim diff`` / ``nsim disasm``). docs/kernel-json.md ("Kept and unrolled traces: what still differs") has the figures.
"""
import collections
import json
import os
import sys

MAX_OPS = 60000


def pytest_configure(config):
    from nsim import tracer
    log = open(os.environ.get("KV_LOG", "/tmp/kv.log"), "a")
    orig = tracer._trace
    state = {"busy": False}

    def wrapped(fn, args, kwargs, name, tensor_cls, schedule, cfg, overrides, check, lnc, loops):
        tres = orig(fn, args, kwargs, name, tensor_cls, schedule, cfg, overrides, check, lnc, loops)
        if state["busy"] or tracer.loops_mode(loops) == "unroll":
            return tres
        test = os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0]
        kname = getattr(fn, "__name__", "?")
        try:
            state["busy"] = True
            k = tres.kernel
            progs = k.get("core_programs", [k])
            if sum(tracer.count_ops(p["body"])[1] for p in progs) > MAX_OPS or \
                    not any('"loop"' in json.dumps(p["body"]) for p in progs):
                return tres
            tu = orig(fn, args, kwargs, name, tensor_cls, schedule, cfg, overrides, False, lnc, "unroll")
            sim = tracer._simulate_fn()
            kw = dict(config=cfg or "trn2", timing_only=True)
            if overrides:
                kw["overrides"] = overrides
            a = sim(k, **kw)[1].total_time_ns
            b = sim(tu.kernel, **kw)[1].total_time_ns
            if os.environ.get("KV_DUMP") == kname:
                json.dump(k, open("/tmp/kv_keep.json", "w"))
                json.dump(tu.kernel, open("/tmp/kv_unroll.json", "w"))
            if a != b:
                log.write("DIFF %+.2f%% kept=%.1f unrolled=%.1f %s %s\n" % (100 * (a / b - 1), a, b, kname, test))
            else:
                log.write("SAME %s %s\n" % (kname, test))
        except Exception as e:  # (the kernel's own errors are the test's business)
            log.write("ERR %s %s %s\n" % (kname, test, str(e)[:120].replace("\n", " ")))
        finally:
            state["busy"] = False
            log.flush()
        return tres

    tracer._trace = wrapped


def _load(path):
    d = collections.defaultdict(list)
    for line in open(path):
        p = line.split()
        if p and p[0] == "DIFF":
            d[(p[5], p[4])].append(float(p[1].rstrip("%")))
        elif p and p[0] == "SAME":
            d[(p[2], p[1])].append(0.0)
    return d


def _buckets(vals):
    c = collections.Counter()
    for v in vals:
        v = abs(v)
        c["> 20 %" if v > 20 else "5-20 %" if v > 5 else "1-5 %" if v > 1 else "< 1 %" if v > 0 else "equal"] += 1
    return ", ".join("{} {}".format(k, c[k]) for k in ("equal", "< 1 %", "1-5 %", "5-20 %", "> 20 %"))


def main(argv):
    a = _load(argv[1])
    vals = [x for v in a.values() for x in v]
    print("{} traces: {}; sum of |kept/unrolled - 1| {:.0f} %".format(len(vals), _buckets(vals),
                                                                      sum(abs(x) for x in vals)))
    worst = collections.defaultdict(float)
    for (test, kernel), v in a.items():
        worst[kernel] = max(worst[kernel], max(abs(x) for x in v))
    gaps = sorted(((k, v) for k, v in worst.items() if v > 0), key=lambda kv: -kv[1])[:12]
    print("largest gaps by kernel:", ", ".join("{} {:.1f} %".format(k, v) for k, v in gaps) or "none")
    if len(argv) > 2:
        runs = [a] + [_load(p) for p in argv[2:]]
        last = runs[-1]
        keys = [k for k in last if all(k in r and len(r[k]) == len(last[k]) for r in runs)]
        pairs = [(x, y) for k in keys for x, y in zip(a[k], last[k])]
        better = sum(abs(y) + 0.5 < abs(x) for x, y in pairs)
        worse = sum(abs(y) > abs(x) + 0.5 for x, y in pairs)
        print("{} traces in every run: {} closer in the last run than in the first, {} further (by more than 0.5 "
              "points); sum of gaps {}".format(len(pairs), better, worse, " -> ".join(
                  "{:.0f} %".format(sum(abs(x) for k in keys for x in r[k])) for r in runs)))
        by_kernel = collections.defaultdict(lambda: [0.0] * len(runs))
        for k in keys:
            for i, r in enumerate(runs):
                by_kernel[k[1]][i] += sum(abs(x) for x in r[k])
        changed = [(k, v) for k, v in by_kernel.items() if max(v) - min(v) > 3]
        for k, v in sorted(changed, key=lambda kv: -max(kv[1]))[:25]:
            print("  {:<44} {}".format(k[:44], " ".join("{:8.1f}".format(x) for x in v)))


if __name__ == "__main__":
    main(sys.argv)
