"""Tracing time of the two attention layers of issue 12's acceptance (trace only, no simulation): the library's
causal ``flash_attention_gqa`` (16 / 8 heads, d = 128) and the public nki-samples ``flash_fwd`` as written (its
Python ``if`` on loop indices splits its loops into pieces, written out), timing-only, trn2.

    PYTHONPATH=python:build/python python3 benchmarks/bench_trace_attention.py [--seq 4096] [--runs 5]

Each kernel is traced once first (its loop decisions are then cached, as in a session that traces it again), then
--runs times; the minimum and median wall times are printed. Wall times on the 2-vCPU VM move by 10-30 % between
runs: to compare two versions of the tracer, count CPU instructions instead, which do not move, with --runs 0 and 1
under callgrind (the difference is one trace; the real python binary, not a pyenv shim):

    PY=$(python3 -c "import sys; print(sys.executable)")
    PYTHONPATH=python:build/python valgrind --tool=callgrind --callgrind-out-file=/dev/null \\
        $PY benchmarks/bench_trace_attention.py --seq 2048 --runs 1 --kernel gqa     # then --runs 0
"""
import argparse
import importlib.util
import os
import statistics
import time

import numpy as np
import ml_dtypes

from nsim import compat
from nsim.kernels import flash_attention_gqa

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def kernels(seq):
    bf16 = ml_dtypes.bfloat16
    q, k = np.zeros((16, seq, 128), bf16), np.zeros((8, seq, 128), bf16)
    gqa = flash_attention_gqa.options(config="trn2", timing_only=True)
    yield "gqa", "library flash_attention_gqa", lambda: gqa.trace(q, k, k, True)
    compat.install()
    spec = importlib.util.spec_from_file_location(
        "nki_samples_attention", os.path.join(ROOT, "tests", "python", "kernels", "nki_samples_attention.py"))
    sample = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sample)
    fwd = sample.flash_fwd.options(config="trn2", timing_only=True)[1, 8]
    q2, k2 = np.zeros((1, 16, 128, seq), bf16), np.zeros((1, 8, 128, seq), bf16)
    v2 = np.zeros((1, 8, seq, 128), bf16)
    yield "flash_fwd", "nki-samples flash_fwd [1, 8]", lambda: fwd.trace(q2, k2, v2, None)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--kernel", choices=("gqa", "flash_fwd", "both"), default="both")
    args = ap.parse_args()
    for key, what, trace in kernels(args.seq):
        if args.kernel not in ("both", key):
            continue
        trace()
        ts = []
        for _ in range(args.runs):
            t = time.perf_counter()
            trace()
            ts.append(time.perf_counter() - t)
        if ts:
            print("{:30s} S={}  trace min {:.3f} s  median {:.3f} s  ({} runs)".format(
                what, args.seq, min(ts), statistics.median(ts), len(ts)), flush=True)


if __name__ == "__main__":
    main()
