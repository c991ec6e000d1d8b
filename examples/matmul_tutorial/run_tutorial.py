#!/usr/bin/env python3
"""Run the NKI matmul tutorial's four steps (matmul_tutorial_kernels.py) on nsim, timing only, and print
each step's simulated time, speed-up over step 1, HBM bytes and peak SBUF use.

    PYTHONPATH=python:build/python python3 examples/matmul_tutorial/run_tutorial.py      # trn1, trn2; tutorial size
    PYTHONPATH=python:build/python python3 examples/matmul_tutorial/run_tutorial.py --config trn2 --size 2048 1024 2048
    PYTHONPATH=python:build/python python3 examples/matmul_tutorial/run_tutorial.py --dialect beta1   # Beta-1 kernels

Each kernel is traced once and the trace simulated on every preset given. A step that does not fit
(e.g. NSIM-E204 SBUF overflow) prints the error and the script goes on.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
HERE = os.path.dirname(os.path.abspath(__file__))
try:
    import nsim  # noqa: F401
except ImportError:  # run from a checkout without PYTHONPATH
    sys.path[:0] = [os.path.join(REPO_ROOT, "python"), os.path.join(REPO_ROOT, "build", "python")]
    import nsim  # noqa: F401

import numpy as np  # noqa: E402
import nsim.compat  # noqa: E402
from nsim.tracer import count_ops  # noqa: E402

FILES = {"new": "matmul_tutorial_kernels.py", "beta1": "matmul_tutorial_beta1.py"}


def load(dialect="new"):
    """The tutorial kernel module of ``dialect`` (imported with nsim.compat's ``nki`` aliases)."""
    nsim.compat.install()
    spec = importlib.util.spec_from_file_location("matmul_tutorial_" + dialect, os.path.join(HERE, FILES[dialect]))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", nargs="+", default=["trn1", "trn2"], help="nsim presets (default trn1 trn2)")
    ap.add_argument("--size", type=int, nargs=3, metavar=("K", "M", "N"),
                    help="default: the tutorial's 8192 4096 8192")
    ap.add_argument("--dialect", choices=sorted(FILES), default="new")
    ap.add_argument("--steps", nargs="+",
                    help="only these steps (tiled hoist_load block_free_dimension fully_optimized)")
    a = ap.parse_args(argv)
    mod = load(a.dialect)
    import ml_dtypes
    k, m, n = a.size or mod.TUTORIAL_SIZE
    lhsT = np.zeros((k, m), ml_dtypes.bfloat16)
    rhs = np.zeros((k, n), ml_dtypes.bfloat16)
    print("NKI matmul tutorial ({} dialect): lhsT [K={}, M={}] x rhs [K={}, N={}] bf16, timing only".format(
        a.dialect, k, m, k, n))
    traced = {}
    for name, kernel in mod.STEPS:
        if a.steps and name not in a.steps:
            continue
        t0 = time.time()
        traced[name] = kernel.to_json(lhsT, rhs)
        ir, run = count_ops(traced[name]["body"])
        print("  traced {:<22} {:>8} ops ({} in the IR, loops kept) in {:.1f} s".format(
            name, run, ir, time.time() - t0), flush=True)
    for config in a.config:
        print("{}:".format(config))
        print("  {:<22} {:>11} {:>9} {:>16} {:>14}".format("step", "time (ms)", "speed-up", "HBM bytes",
                                                          "SBUF peak (B)"))
        first = None
        for name, kj in traced.items():
            try:
                _, prof = nsim.simulate_json(kj, config=config, timing_only=True)
            except nsim.NsimError as e:
                print("  {:<22} {}".format(name, e), flush=True)
                continue
            t = prof.total_time_ns
            first = first or t
            hbm = prof.stat("memory.hbm_read_bytes") + prof.stat("memory.hbm_write_bytes")
            print("  {:<22} {:>11.3f} {:>8.2f}x {:>16,} {:>14,}".format(
                name, t / 1e6, first / t, int(hbm), int(prof.stat("memory.sbuf_peak_bytes_per_partition"))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
