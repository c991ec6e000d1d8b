"""Fast-forward (docs/timing-model.md "Fast-forward") and kept Beta 1 arange loops, end to end.

1. `nsim run --timing-only` on a softmax kernel of N million instructions (examples/softmax_2x128x512.json with its
   batch loop raised, sequential, one HBM row), with `--no-fast-forward` and with fast-forward (the default): wall time, simulated
   instructions per second, and whether every stat and per-line entry of `--stats` agrees.
2. The NKI tutorial's Beta 1 RMSNorm (``a_tensor[i * 128 + ix, iy]`` in an ``nl.affine_range``), timing-only from
   Python over R row tiles of [128, 512] bf16: traced with the loop kept (the default) and unrolled, simulated
   with and without fast_forward.

    PYTHONPATH=python:build/python python3 benchmarks/bench_fast_forward.py [--million 10] [--rows 20000]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def softmax_kernel(iterations):
    with open(os.path.join(ROOT, "examples", "softmax_2x128x512.json")) as f:
        k = json.load(f)
    loop = k["body"][0]["loop"]
    loop["stop"], loop["kind"] = iterations, "sequential"
    return json.dumps(k).replace('"index": ["b",', '"index": [0,')


def cli(nsim, path, stats, *flags):
    t = time.perf_counter()
    subprocess.run([nsim, "run", path, "--timing-only", "--quiet", "--stats", stats, *flags], check=True,
                   stdout=subprocess.DEVNULL)
    return time.perf_counter() - t, json.load(open(stats))


def flat(d, p=""):
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and "value" in v:
            out[p + k] = v["value"]
        elif isinstance(v, dict):
            out.update(flat(v, p + k + "."))
    return out


def same(a, b):
    fa, fb = flat(a["stats"]), flat(b["stats"])
    diff = [k for k in fa if not k.startswith("fast_forward.") and fa[k] != fb.get(k)]
    return not diff and a["lines"] == b["lines"], diff


def part_cli(nsim, million):
    n = int(million * 1e6 / 7)  # 7 instructions per iteration
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "softmax.json")
        with open(path, "w") as f:
            f.write(softmax_kernel(n))
        full_t, full = cli(nsim, path, os.path.join(d, "a.json"), "--no-fast-forward")
        ff_t, ff = cli(nsim, path, os.path.join(d, "b.json"))
    instrs = full["instructions"]
    ok, diff = same(full, ff)
    print("1. nsim run --timing-only, softmax loop of {:,} iterations ({:,} instructions)".format(n, instrs))
    print("   --no-fast-forward {:8.3f} s  {:8.2f} M instr/s".format(full_t, instrs / full_t / 1e6))
    print("   fast-forward      {:8.3f} s  {:8.2f} M instr/s  ({:,.0f} instructions skipped)".format(
        ff_t, instrs / ff_t / 1e6, ff["stats"]["fast_forward"]["skipped_instructions"]["value"]))
    print("   every stat and per-line entry equal: {}{}".format(ok, "" if ok else " (differ: {})".format(diff[:5])))


def part_python(rows):
    import numpy as np
    import ml_dtypes
    import nsim
    from nsim import compat, tracer

    compat.install()
    import neuronxcc.nki as nki
    import neuronxcc.nki.language as nl

    @nki.jit
    def rmsnorm_kernel(a_tensor, g_tensor):
        # the NKI tutorial's RMSNorm (Beta 1: nl.arange subscripts), rows a multiple of 128
        out_tensor = nl.ndarray(a_tensor.shape, dtype=a_tensor.dtype, buffer=nl.shared_hbm)
        ix = nl.arange(128)[:, None]
        iw = nl.arange(1)[:, None]
        iy = nl.arange(a_tensor.shape[1])[None, :]
        g_tile = nl.load(g_tensor.reshape((1, g_tensor.shape[0]))[iw, iy])
        for i in nl.affine_range(a_tensor.shape[0] // 128):
            a_tile = nl.load(a_tensor[i * 128 + ix, iy])
            square_sum = nl.sum(nl.square(a_tile), axis=[1])
            rms_reciprocal = nl.rsqrt(square_sum / a_tensor.shape[1])
            out_tile = nl.multiply(a_tile, rms_reciprocal)
            out_tile[...] = nl.multiply(out_tile, g_tile.broadcast_to((128, g_tensor.shape[0])))
            nl.store(out_tensor[i * 128 + ix, iy], value=out_tile)
        return out_tensor

    bf16 = ml_dtypes.bfloat16
    a = np.broadcast_to(np.zeros((), bf16), (128 * rows, 512))  # timing-only: never read, no memory
    g = np.zeros((512,), bf16)
    print("2. NKI tutorial RMSNorm (Beta 1), {:,} row tiles of [128, 512] bf16, timing-only from Python".format(rows))
    for loops, ff in (("keep", False), ("keep", True), ("unroll", False), ("unroll", True)):
        if loops == "unroll" and rows > 5000:
            print("   loops={:6s} fast_forward={!s:5s}  (skipped: tracing {:,} unrolled tiles takes minutes; "
                  "--rows 5000 or fewer)".format(loops, ff, rows))
            continue
        k = rmsnorm_kernel.options(timing_only=True, loops=loops, fast_forward=ff, check=False)
        t0 = time.perf_counter()
        tres = k.trace(a, g)
        t1 = time.perf_counter()
        _, _, prof = tracer.run(tres, config="trn2", timing_only=True, fast_forward=ff)
        t2 = time.perf_counter()
        print("   loops={:6s} fast_forward={!s:5s} trace {:7.3f} s  simulate {:7.3f} s  IR ops {:>7,}  "
              "simulated {:12.1f} ns  skipped {:,.0f}".format(
                  loops, ff, t1 - t0, t2 - t1, tracer.count_ops(tres.kernel["body"])[0], prof.total_time_ns,
                  prof.stat("fast_forward.skipped_instructions")))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--million", type=float, default=10, help="softmax instructions, in millions (default 10)")
    ap.add_argument("--rows", type=int, default=20000, help="RMSNorm row tiles (default 20000)")
    ap.add_argument("--nsim", default=os.path.join(ROOT, "build", "nsim"))
    args = ap.parse_args()
    part_cli(args.nsim, args.million)
    part_python(args.rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
