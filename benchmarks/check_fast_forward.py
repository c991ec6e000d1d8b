#!/usr/bin/env python3
"""Fast-forward against the full simulation on random loop kernels (docs/timing-model.md "Fast-forward").

Each kernel is a sequential loop of N iterations: a load of [128, f] fp32 from x or y at a random HBM row
expression (b, b + 1, b + 2, 2 * b, 0), one to three element-wise ops, and a store to y (b, b + 1, 2 * b + 1, 0,
or the load's own expression). Loads from y through another expression than the store's make a dependency between
iterations through HBM, which fast-forward must not skip over. Every kernel runs `nsim run --timing-only` with and
without `--fast-forward`; the stats JSON (fast_forward.* removed) must be identical.

    python3 benchmarks/check_fast_forward.py [--nsim PATH (default: this checkout's build/nsim)] [--kernels 40] [--iterations 3000]

Prints one line per kernel and a summary; exits 1 if any kernel's stats differ.
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile


def kernel(seed, n):
    r = random.Random(seed)
    f = r.choice([64, 256, 512])
    src = r.choice(["x", "y"])
    li = r.choice(["b", "b + 1", "0", "b + 2", "2 * b"])
    si = r.choice(["b", "b + 1", "0", "2 * b + 1"]) if r.random() < 0.8 else li
    rows = 2 * n + 4
    loc = lambda line: {"file": "r.py", "line": line}
    body = [{"alloc": {"name": "t0", "buffer": "sbuf", "dtype": "float32", "shape": [128, f]}},
            {"op": "dma_copy", "dst": "t0", "loc": loc(1),
             "src": {"tensor": src, "index": [li, {"start": 0, "size": 128}, {"start": 0, "size": f}]}}]
    prev = "t0"
    for i in range(1, 1 + r.randint(1, 3)):
        t = "t%d" % i
        body.append({"alloc": {"name": t, "buffer": "sbuf", "dtype": "float32", "shape": [128, f]}})
        op = r.choice(["act", "ts", "copy"])
        if op == "act":
            body.append({"op": "activation", "dst": t, "data": prev, "act": "exp", "loc": loc(10 + i)})
        elif op == "ts":
            body.append({"op": "tensor_scalar", "dst": t, "data": prev, "alu0": "multiply", "flags": ["has_imm0"],
                         "imm": [0.5, 0, 1, 0], "loc": loc(10 + i)})
        else:
            body.append({"op": "tensor_copy", "dst": t, "src": prev, "engine": r.choice(["vector", "gpsimd"]),
                         "loc": loc(10 + i)})
        prev = t
    body.append({"op": "dma_copy", "src": prev, "loc": loc(40),
                 "dst": {"tensor": "y", "index": [si, {"start": 0, "size": 128}, {"start": 0, "size": f}]}})
    k = {"nsim_kernel": 1, "name": "random_loop", "tensors": [
        {"name": "x", "buffer": "hbm", "kind": "input", "dtype": "float32", "shape": [rows, 128, f]},
        {"name": "y", "buffer": "hbm", "kind": "output", "dtype": "float32", "shape": [rows, 128, f]}],
        "body": [{"loop": {"var": "b", "start": 0, "stop": n, "step": 1, "kind": "sequential", "body": body}}]}
    return k, "load {}[{}], store y[{}]".format(src, li, si)


def stats(nsim, path, ff, tmp):
    out = os.path.join(tmp, "stats.json")
    cmd = [nsim, "run", "--timing-only", "--quiet", "--stats", out, path] + (["--fast-forward"] if ff else [])
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(out) as fh:
        d = json.load(fh)
    skipped = d["stats"]["fast_forward"]["skipped_instructions"]["value"]
    d["stats"].pop("fast_forward")
    d.pop("config", None)
    return d, skipped


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    # build/nsim of this checkout, wherever it lives and whatever the working directory
    ap.add_argument("--nsim", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build", "nsim"))
    ap.add_argument("--kernels", type=int, default=40)
    ap.add_argument("--iterations", type=int, default=3000)
    a = ap.parse_args()
    different = skipping = 0
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.json")
        for seed in range(a.kernels):
            k, desc = kernel(seed, a.iterations)
            with open(path, "w") as fh:
                json.dump(k, fh)
            full, _ = stats(a.nsim, path, False, tmp)
            ff, skipped = stats(a.nsim, path, True, tmp)
            skipping += skipped > 0
            same = full == ff
            different += not same
            print("{} seed {:3d}  {:34s} skipped {:7.0f}".format("same" if same else "DIFFERENT", seed, desc, skipped))
    print("{} kernels: {} different, {} skipped instructions".format(a.kernels, different, skipping))
    return 1 if different else 0


if __name__ == "__main__":
    sys.exit(main())
