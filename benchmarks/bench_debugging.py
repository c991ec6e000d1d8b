"""Cost of the debugging features (docs/debugging.md) on the library's flash-attention test
(tests/python/test_kernels.py: flash_attention on trn2 with make_inputs(1)): trace + simulate, median of
N runs, for
  * the kernel as is (values never read: eager mode must cost nothing), check=False;
  * the same with the sanitizer on (check=True, the Python default);
  * a variant that reads one value (np.asarray of the first output tile) at the end of the kernel: the
    replay of every instruction through the C++ eager session.
Run it in a tree without this feature (e.g. PYTHONPATH=/work/main/python:/work/main/build/python) for the
baseline: options it does not know are skipped.

    PYTHONPATH=python:build/python python3 benchmarks/bench_debugging.py [N]
"""
import statistics
import sys
import time

import numpy as np

from nsim import kernels as K
from nsim import tracer

N = int(sys.argv[1]) if len(sys.argv) > 1 else 5


def timed(fn):
    fn()  # warm-up (imports, caches)
    ts, cs = [], []
    for _ in range(N):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        ts.append(time.perf_counter() - t0)
        cs.append(time.process_time() - c0)
    return statistics.median(ts), min(ts), statistics.median(cs)


kernel, ref, make_inputs = K.flash_attention, K.flash_attention_ref, K.flash_attention_inputs
args = make_inputs(1)
has_check = "check" in kernel.options.__code__.co_varnames


def run(check):
    k = kernel.options(config="trn2", check=check) if has_check else kernel.options(config="trn2")
    out, _prof = k.simulate(*args)
    return out


res = {"values never read, check=False": timed(lambda: run(False))}
if has_check:
    res["values never read, check=True"] = timed(lambda: run(True))
    # one value read at the end of the trace: replays the whole kernel through the eager session
    orig = tracer.Tracer.to_json

    def reading_to_json(self):
        t = next((s["alloc"]["name"] for s in self.body if "alloc" in s), None)
        if t is not None:
            self.eager().sync()
        return orig(self)

    tracer.Tracer.to_json = reading_to_json
    res["every op replayed eagerly (one value read), check=False"] = timed(lambda: run(False))
    tracer.Tracer.to_json = orig
for k, (med, lo, cpu) in res.items():
    print("{:58s} wall median {:.3f} s  min {:.3f} s  CPU median {:.3f} s".format(k, med, lo, cpu))
