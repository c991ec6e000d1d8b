#!/usr/bin/env python3
"""Multi-head flash attention on one core vs on two physical cores (LNC=2, heads split over the cores).

``flash_attention_mh`` (python/nsim/kernels/attention.py) gives program ``nl.program_id(0)`` the heads
[p * H/n, (p + 1) * H/n) of the launch's n programs: ``flash_attention_mh(q, k, v)`` runs every head on one
core, ``flash_attention_mh[2](q, k, v)`` (``flash_attention_lnc2``) runs half of them on each of the two
physical cores of a trn2/trn3 logical core, which share one HBM stack (docs/lnc.md).

    PYTHONPATH=python:build/python python3 examples/attention/flash_attention_lnc2.py                # trn2
    PYTHONPATH=python:build/python python3 examples/attention/flash_attention_lnc2.py --config trn3 --heads 8

It checks both against numpy and prints each launch's time, the per-core times, the load imbalance
and the speed-up of LNC=2.
"""
from __future__ import annotations

import argparse
import os
import sys

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
try:
    import nsim  # noqa: F401
except ImportError:  # run from a checkout without PYTHONPATH
    sys.path[:0] = [os.path.join(REPO_ROOT, "python"), os.path.join(REPO_ROOT, "build", "python")]
    import nsim  # noqa: F401

import numpy as np  # noqa: E402

from nsim.kernels import attention as A  # noqa: E402


def run(config="trn2", heads=4, seq=512, head_dim=128):
    """{one: Profile, two: Profile, err_one, err_two} of one- and two-core multi-head flash attention."""
    q, k, v, causal = A.flash_attention_mh_inputs(seed=0, h=heads, s=seq, d=head_dim)
    ref = A.flash_attention_mh_ref(q, k, v, causal)
    out1, one = A.flash_attention_mh.options(config=config).simulate(q, k, v, causal)
    out2, two = A.flash_attention_lnc2.options(config=config).simulate(q, k, v, causal)
    err = lambda o: float(np.max(np.abs(np.asarray(o, np.float32) - ref)))  # noqa: E731
    return {"one": one, "two": two, "err_one": err(out1), "err_two": err(out2)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="trn2", choices=["trn2", "trn3"])
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--head-dim", type=int, default=128)
    a = ap.parse_args(argv)
    r = run(a.config, a.heads, a.seq, a.head_dim)
    one, two = r["one"], r["two"]
    print("flash attention, {} heads x S={} x d={}, bf16, causal, on {}".format(a.heads, a.seq, a.head_dim, a.config))
    print("  one core : {:10.1f} ns   max |err| vs numpy {:.3g}".format(one.total_time_ns, r["err_one"]))
    print("  LNC=2    : {:10.1f} ns   max |err| vs numpy {:.3g}".format(two.total_time_ns, r["err_two"]))
    print("    core 0 {:10.1f} ns, core 1 {:10.1f} ns, imbalance {:.1f} %".format(
        two.stat("core0.total_time"), two.stat("core1.total_time"), two.stat("lnc.imbalance_percent")))
    print("  speed-up : {:.2f}x".format(one.total_time_ns / two.total_time_ns))
    return 0


if __name__ == "__main__":
    sys.exit(main())
