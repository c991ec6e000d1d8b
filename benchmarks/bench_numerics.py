"""Numerics + timing of library kernels against the numpy reference of the same math (issue 12: a full
simulation should cost at most 2x the numpy reference).

For each case: the wall time of ``kernel.simulate(*args)`` (trace + numerics + timing, the Python path a
user takes; with the sanitizer off and on) and of ``reference(*args)`` (the library's fp32 numpy
reference), medians of N runs after a pause and a warm-up, and their ratio.

    PYTHONPATH=python:build/python python3 benchmarks/bench_numerics.py [N]
"""
import statistics
import sys
import time

from nsim import kernels as K

N = int(sys.argv[1]) if len(sys.argv) > 1 else 5
PAUSE = 0.5  # seconds before each measurement

CASES = [
    ("softmax (4, 1024, 1024) bf16", K.softmax, K.softmax_ref, lambda: K.softmax_inputs(0, shape=(4, 1024, 1024))),
    ("matmul_blocked 1024^3 bf16", K.matmul_blocked, K.matmul_ref, lambda: K.matmul_inputs(0, 1024, 1024, 1024)),
    ("flash_attention S=2048 d=128", K.flash_attention, K.flash_attention_ref,
     lambda: K.flash_attention_inputs(0, s=2048)),
]


def median_time(fn):
    # Each measurement starts after a pause: numpy's OpenBLAS threads keep polling for ~0.2 s after a
    # matmul, taking the second vCPU from whatever runs next (nsim then leaves its helper thread idle,
    # isa/semantics/parallel.h), so without it a case's nsim runs would pay for its reference's.
    time.sleep(PAUSE)
    fn()  # warm-up
    ts = []
    for _ in range(N):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def main():
    print("{:32s} {:>10s} {:>12s} {:>12s} {:>8s} {:>8s}".format(
        "case", "numpy s", "nsim s", "nsim+check", "ratio", "+check"))
    for name, kernel, ref, make in CASES:
        args = make()
        t_ref = median_time(lambda: ref(*args))
        t_sim = median_time(lambda: kernel.options(check=False).simulate(*args))
        t_chk = median_time(lambda: kernel.options(check=True).simulate(*args))
        print("{:32s} {:10.3f} {:12.3f} {:12.3f} {:7.1f}x {:7.1f}x".format(
            name, t_ref, t_sim, t_chk, t_sim / t_ref, t_chk / t_ref), flush=True)


if __name__ == "__main__":
    main()
