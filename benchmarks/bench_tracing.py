"""Tracing overhead of the Python frontend: time to trace a kernel of 100,000 tile ops.

    PYTHONPATH=python:build/python python3 benchmarks/bench_tracing.py [--ops 100000] [--keep] [--no-check]

Traces (no simulation) a new-dialect kernel whose loop issues tensor_scalar / tensor_tensor ops on
[128, 64] tiles, then reports ops/s; also times simulating the traced kernel in timing-only mode.
Traced with every loop unrolled (``loops="unroll"``), which measures the per-op cost of tracing; ``--keep``
traces with ``loops="keep"`` (the loop writes tiles made outside it at the same place in every iteration,
so with the sanitizer on, the default, it is still unrolled; ``--no-check`` turns the sanitizer off and
the loop stays a loop: two ops in the IR, run n_ops / 2 times). ops/s counts the ops the kernel executes.
"""
import argparse
import time

import numpy as np

from nsim import nki, tracer
import nsim.nki.isa as nisa
import nsim.nki.language as nl


def make_kernel(n_ops):
    @nki.jit
    def many_ops(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray((128, 64), a.dtype, buffer=nl.sbuf)
        u = nl.ndarray((128, 64), a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a)
        for i in nl.affine_range(n_ops // 2):
            nisa.tensor_scalar(dst=u, data=t, op0=nl.multiply, operand0=1.0001)
            nisa.tensor_tensor(dst=t, data1=u, data2=t, op=nl.add)
        nisa.dma_copy(dst=out, src=t)
        return out

    return many_ops


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", type=int, default=100_000)
    ap.add_argument("--keep", action="store_true", help='trace with loops="keep"')
    ap.add_argument("--no-check", action="store_true", help="trace without the sanitizer's checks")
    args = ap.parse_args()
    a = np.zeros((128, 64), np.float32)
    k = make_kernel(args.ops)
    t0 = time.perf_counter()
    kernel = nki.trace_kernel(k.options(loops="keep" if args.keep else "unroll", check=not args.no_check), a)
    t1 = time.perf_counter()
    ir_ops, n_ops = tracer.count_ops(kernel["body"])
    print("traced {} ops ({} in the IR) in {:.3f} s ({:.0f} ops/s)".format(n_ops, ir_ops, t1 - t0,
                                                                          n_ops / (t1 - t0)))
    import nsim
    t2 = time.perf_counter()
    _, prof = nsim.simulate_json(kernel, inputs={"a": a}, timing_only=True)
    t3 = time.perf_counter()
    print("simulated (timing-only, incl. JSON parse) in {:.3f} s; simulated time {:.1f} us".format(
        t3 - t2, prof.total_time_ns / 1000))


if __name__ == "__main__":
    main()
