"""Timing-only 1024^3 bf16 GEMM (issue 12: <= 2.2 ms, 10,000x SCALE-Sim v2's 22 s): the library's
``matmul_blocked`` at 1024 x 1024 x 1024 traced once (with every loop unrolled, then with loops kept), then
simulated timing-only in this process

- ``simulate_json(text)``: the kernel.json text read on every run;
- ``simulate_json(dict)``: the traced kernel's dict handed to C++ on every run (no JSON text; what
  ``Kernel.simulate`` does after tracing);
- ``handle.simulate()``: the kernel read once with ``nsim.load_kernel`` (what a sweep does);

medians (and best) of N runs after a warm-up run, wall time per run.

    PYTHONPATH=python:build/python python3 benchmarks/bench_gemm_timing.py [N]
"""
import json
import statistics
import sys
import time

import nsim
from nsim import kernels as K

N = int(sys.argv[1]) if len(sys.argv) > 1 else 50


def times(fn):
    fn()  # warm-up: the config's YAML parse, first allocations
    ts = []
    for _ in range(N):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return ts


def main():
    args = K.matmul_inputs(0, 1024, 1024, 1024)
    # Both trace forms: every loop unrolled (the tracer's default before loops were kept) and loops kept.
    for loops in ("unroll", "keep"):
        kj = K.matmul_blocked.options(loops=loops).to_json(*args)
        text = json.dumps(kj)
        handle = nsim.load_kernel(text)
        _, prof = handle.simulate(timing_only=True)
        n_instr = sum(int(e.get("instruction_count", {}).get("value", 0)) for e in prof.stats["engine"].values())
        print("matmul_blocked 1024^3 bf16, loops={}: {} statements at the top of the body, {} instructions, {} bytes "
              "of kernel.json, simulated {:.1f} us".format(loops, len(kj["body"]), n_instr, len(text),
                                                          prof.total_time_ns / 1e3))
        print("{:36s} {:>10s} {:>10s}   ({} runs)".format("timing only, in-process", "median ms", "best ms", N))
        for name, fn in (("simulate_json(text)", lambda: nsim.simulate_json(text, timing_only=True)),
                         ("simulate_json(dict)", lambda: nsim.simulate_json(kj, timing_only=True)),
                         ("load_kernel(text) once, .simulate()", lambda: handle.simulate(timing_only=True))):
            ts = times(fn)
            print("{:36s} {:10.3f} {:10.3f}".format(name, statistics.median(ts) * 1e3, min(ts) * 1e3), flush=True)


if __name__ == "__main__":
    main()
