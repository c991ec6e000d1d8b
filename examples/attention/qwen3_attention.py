#!/usr/bin/env python3
"""Naive vs flash attention at Qwen3-0.6B attention shapes on nsim (timing only).

Qwen3-0.6B attention: 16 query heads sharing 8 KV heads (grouped-query attention), head dim 128, bf16,
causal. Both kernels come from the nsim kernel library (python/nsim/kernels/attention.py):

* ``attention_naive``: scores = Q K^T / sqrt(d) (masked) written to an HBM scratch tensor [Hq, S, S] fp32,
  read back for the row softmax, probabilities written to a second scratch tensor [Hq, S, S] bf16 and read
  back for P V: O(S^2) HBM traffic per head.
* ``flash_attention_gqa``: online softmax over 512-key chunks, scores and probabilities stay on chip;
  only Q, K, V and the output cross HBM.

    PYTHONPATH=python:build/python python3 examples/attention/qwen3_attention.py            # S = 512, 2048, 4096
    PYTHONPATH=python:build/python python3 examples/attention/qwen3_attention.py --seq 512 2048 --config trn2

For each kernel and sequence length it prints the simulated total time, the HBM bytes moved (read + write),
the TensorE FLOPs (``flops.model``: matmul FLOPs without transposes) and the arithmetic intensity
(``flops.mm_arithmetic_intensity`` = model FLOPs / HBM bytes) from the Profile's stats, and the speed-up of
flash over naive.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
try:
    import nsim  # noqa: F401
except ImportError:  # run from a checkout without PYTHONPATH
    sys.path[:0] = [os.path.join(REPO_ROOT, "python"), os.path.join(REPO_ROOT, "build", "python")]
    import nsim  # noqa: F401

from nsim.kernels import attention as A  # noqa: E402

KERNELS = [("naive", A.attention_naive), ("flash", A.flash_attention_gqa)]


def simulate(kernel, args, config):
    """Profile of one timing-only run (kernel.options() where the kernel API has it)."""
    if hasattr(kernel, "options"):
        return kernel.options(config=config, timing_only=True).simulate(*args)[1]
    return kernel.simulate(*args, config=config, timing_only=True)[1]


def measure(kernel, seq, config, heads=A.QWEN3_HEADS, kv_heads=A.QWEN3_KV_HEADS, head_dim=A.QWEN3_HEAD_DIM):
    """{time_ns, hbm_bytes, flops, intensity, wall_s} of ``kernel`` at the Qwen3 shapes, sequence ``seq``."""
    args = A.gqa_attention_inputs(seed=0, s=seq, hq=heads, hkv=kv_heads, d=head_dim, causal=True)
    t0 = time.time()
    prof = simulate(kernel, args, config)
    return {
        "time_ns": prof.total_time_ns,
        "hbm_bytes": prof.stat("memory.hbm_read_bytes") + prof.stat("memory.hbm_write_bytes"),
        "flops": prof.stat("flops.model"),
        "intensity": prof.stat("flops.mm_arithmetic_intensity"),
        "wall_s": time.time() - t0,
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seq", type=int, nargs="+", default=[512, 2048, 4096], help="sequence lengths (multiples of 128)")
    ap.add_argument("--config", default="trn2", help="nsim preset (default trn2)")
    ap.add_argument("--heads", type=int, default=A.QWEN3_HEADS)
    ap.add_argument("--kv-heads", type=int, default=A.QWEN3_KV_HEADS)
    ap.add_argument("--head-dim", type=int, default=A.QWEN3_HEAD_DIM)
    a = ap.parse_args(argv)
    print("Qwen3-0.6B attention on {}: {} query heads, {} kv heads, head dim {}, bf16, causal, timing only".format(
        a.config, a.heads, a.kv_heads, a.head_dim))
    print("{:>6} {:>6} {:>12} {:>14} {:>14} {:>12} {:>8}".format(
        "S", "kernel", "time (us)", "HBM bytes", "FLOPs", "FLOP/byte", "wall (s)"))
    for seq in a.seq:
        res = {}
        for name, kernel in KERNELS:
            r = res[name] = measure(kernel, seq, a.config, a.heads, a.kv_heads, a.head_dim)
            print("{:>6} {:>6} {:>12.1f} {:>14,} {:>14,} {:>12.1f} {:>8.1f}".format(
                seq, name, r["time_ns"] / 1e3, int(r["hbm_bytes"]), int(r["flops"]), r["intensity"], r["wall_s"]),
                flush=True)
        speedup = res["naive"]["time_ns"] / res["flash"]["time_ns"]
        print("{:>6} speed-up of flash over naive: {:.2f}x".format(seq, speedup), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
