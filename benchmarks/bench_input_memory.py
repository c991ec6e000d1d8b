"""Host memory of a run with large inputs from Python: the peak RSS of one ``simulate()`` of the library's
tensor_add on two bf16 inputs of [128 * k, 512] (k = 2048: 256 MiB each; docs/performance.md).

    PYTHONPATH=python:build/python python3 benchmarks/bench_input_memory.py [k]
"""
import resource, sys, time
import numpy as np, ml_dtypes
from nsim import kernels as K
k = int(sys.argv[1]) if len(sys.argv) > 1 else 2048
a = np.ones((128 * k, 512), dtype=ml_dtypes.bfloat16)
b = np.ones((128 * k, 512), dtype=ml_dtypes.bfloat16)
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.perf_counter()
out, prof = K.tensor_add.options(check=False).simulate(a, b)
t = time.perf_counter() - t0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print("inputs %.0f MiB each; rss before run %.0f MiB, peak %.0f MiB (+%.0f MiB); %.2f s; out ok %s" % (
    a.nbytes / 2**20, base / 1024, peak / 1024, (peak - base) / 1024, t, bool((np.asarray(out, np.float32) == 2).all())))
