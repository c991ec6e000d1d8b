#!/usr/bin/env python3
"""Fast-forward against the full simulation on random loop kernels (docs/timing-model.md "Fast-forward").

``--kind hbm`` (the default): each kernel is a sequential loop of N iterations: a load of [128, f] fp32 from x or y
at a random HBM row expression (b, b + 1, b + 2, 2 * b, 0), one to three element-wise ops, and a store to y (b,
b + 1, 2 * b + 1, 0, or the load's own expression). Loads from y through another expression than the store's make a
dependency between iterations through HBM, which fast-forward must not skip over.

``--misalign 1024`` puts every tensor 1 KiB off the 4 KiB chunks of the simulator's HBM dependency tracking, so that
consecutive rows share a chunk at their boundary.

``--kind rich``: loops over [P, f] tiles (P 64, 96 or 128; fp32 or bf16) whose bodies mix 1 to 6 pieces: ScalarE
activations (exp, tanh, copy; with a reduction, with a bias), element-wise ops on VectorE / ScalarE / GpSimd,
reductions, nc_matmul into PSUM (one, or accumulated by an inner loop), TensorE transposes, affine_select, half-tile
views, inner loops, an SBUF-to-SBUF DMA, a persistent accumulator read and written every iteration, DMAs on every
trigger engine and on random queues, explicit rotating buffers; the loop alone, twice in a row, inside an outer
loop, or with step 2; on trn1, trn2 or trn3 with a random compiler.window and compiler.loop_buffers; some read y
back (a recurrence through HBM). ``--kind wide``: the same with PE-tiled matmuls, ScalarE reading PSUM, DMAs
accumulating into HBM in place, dma_transpose, ops on partitions 32..95, order_group pairs, iota patterns moving
with the index, and loops of n / 20 iterations inside an outer loop of 20.

Every kernel runs `nsim run --timing-only` with `--fast-forward` and with `--no-fast-forward`; the stats JSON (fast_forward.*
removed; the per-line stats included) must be identical. With ``--trace`` both runs also write a trace with a filter
drawn from the seed (a slice limit, a window ending at 2-60 % of the run, a window with a start and an end, or a limit
with a window start; JSON or Perfetto), whose bytes must be identical (fast-forward skips once the trace keeps no more
slices: docs/timing-model.md, "A trace with a window or a limit").

    python3 benchmarks/check_fast_forward.py [--nsim PATH (default: this checkout's build/nsim)] [--kind hbm|rich]
        [--kernels 40] [--first 0] [--iterations 3000] [--misalign BYTES] [--limit] [--trace]

Prints one line per kernel and a summary; exits 1 if any kernel's stats differ or a run fails otherwise than with a
clean error of the full run (exit status 2: a random kernel whose tiles do not fit, E206 with compiler.loop_buffers;
counted as rejected). Past ~7,000 iterations the rich kernels' tensors may not fit in trn1's 16 GiB of HBM (E205).
"""
import argparse
import json
import os
import random
import re
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


def rich_kernel(seed, n, wide=False):
    """A random loop kernel of --kind rich (``wide``: --kind wide): (kernel dict, preset, overrides, description)."""
    r = random.Random(seed)
    cfg0 = r.choice(["trn1", "trn2", "trn2", "trn3"]) if wide else None  # (PE tiles depend on it)
    P = r.choice([128, 128, 128, 64, 96])
    f = r.choice([64, 128, 256, 512])
    dt = r.choice(["float32", "bfloat16"])
    rows = 4 * n + 8
    loc = lambda line: {"file": "r.py", "line": line}
    line = [100]
    def L():
        line[0] += 1
        return loc(line[0])
    tensors = [{"name": "x", "buffer": "hbm", "kind": "input", "dtype": dt, "shape": [rows, P, f]},
               {"name": "y", "buffer": "hbm", "kind": "output", "dtype": dt, "shape": [rows, P, f]}]
    pre, body, post = [], [], []
    use_mm = P == 128 and r.random() < 0.5
    if use_mm:
        tensors.append({"name": "w", "buffer": "hbm", "kind": "input", "dtype": "bfloat16", "shape": [128, 128]})
        pre.append({"alloc": {"name": "wt", "buffer": "sbuf", "dtype": "bfloat16", "shape": [128, 128]}})
        pre.append({"op": "dma_copy", "dst": "wt", "src": "w", "loc": L()})
    use_acc = r.random() < 0.4
    if use_acc:
        pre.append({"alloc": {"name": "acc", "buffer": "sbuf", "dtype": "float32", "shape": [P, f]}})
        pre.append({"op": "memset", "engine": r.choice(["vector", "gpsimd"]), "dst": "acc", "imm": [0.0], "loc": L()})
    def dma(dst, src):
        d = {"op": "dma_copy", "dst": dst, "src": src, "loc": L()}
        e = r.choice(["sync", "sync", "scalar", "gpsimd", None])
        if e:
            d["engine"] = e
        if r.random() < 0.3:
            d["dma_queue"] = r.randint(0, 15)
        return d
    recur = r.random() < 0.15
    li = r.choice(["b", "b + 1", "0", "2 * b", "b + 3"])
    si = r.choice(["b", "b + 2", "2 * b + 1", "0"])
    src = "y" if recur else "x"
    ntiles = [0]
    dtypes = {}
    need_z = [False]
    def tile(dtype="float32", parts=P, free=f, buf="sbuf"):
        ntiles[0] += 1
        nm = "t%d" % ntiles[0]
        dtypes[nm] = dtype
        a = {"name": nm, "buffer": buf, "dtype": dtype, "shape": [parts, free]}
        if r.random() < 0.2:
            a["bufs"] = r.randint(1, 4)
        body.append({"alloc": a})
        return nm
    t0 = tile(dt)
    body.append(dma(t0, {"tensor": src, "index": [li, {"start": 0, "size": P}, {"start": 0, "size": f}]}))
    prev = t0
    for _ in range(r.randint(1, 6)):
        k = r.choice(["act", "actred", "ts", "tt", "copy", "red", "mm", "acc", "half", "inner", "tr", "sel", "bias", "sb2sb", "mm4"]
                     + (["ptile", "psact", "dacc", "dtr", "part", "og", "iota"] if wide else []))
        if k == "act":
            t = tile()
            body.append({"op": "activation", "dst": t, "data": prev, "act": r.choice(["exp", "copy", "tanh"]), "loc": L()})
        elif k == "actred":
            t = tile(); s = tile(free=1)
            body.append({"op": "activation", "dst": t, "data": prev, "act": "exp", "reduce_res": s, "alu1": "add",
                         "reduce_cmd": "reset_reduce", "loc": L()})
        elif k == "ts":
            t = tile()
            body.append({"op": "tensor_scalar", "dst": t, "data": prev, "alu0": "multiply", "flags": ["has_imm0"],
                         "imm": [0.5, 0, 1, 0], "engine": r.choice(["vector", "scalar", "gpsimd"]), "loc": L()})
        elif k == "tt":
            t = tile()
            body.append({"op": "tensor_tensor", "dst": t, "data1": prev, "data2": t0, "alu0": "add",
                         "engine": r.choice(["vector", "gpsimd"]), "loc": L()})
        elif k == "copy":
            t = tile(r.choice(["float32", "bfloat16"]))
            body.append({"op": "tensor_copy", "dst": t, "src": prev, "engine": r.choice(["vector", "gpsimd", "scalar"]),
                         "loc": L()})
        elif k == "red":
            m = tile(free=1); t = tile()
            body.append({"op": "tensor_reduce", "dst": m, "data": prev, "alu0": "maximum", "loc": L()})
            body.append({"op": "tensor_scalar", "dst": t, "data": prev, "operand0": m, "alu0": "subtract", "loc": L()})
        elif k == "mm" and use_mm:
            mv = tile("bfloat16")
            body.append({"op": "tensor_copy", "dst": mv, "src": prev, "loc": L()})
            ps = tile("float32", 128, f, "psum")
            if r.random() < 0.5:
                body.append({"loop": {"var": "k", "start": 0, "stop": 2, "step": 1, "kind": "sequential", "body": [
                    {"op": "nc_matmul", "dst": ps, "stationary": "wt", "moving": mv, "flags": ["accumulate"], "loc": L()}]}})
            else:
                body.append({"op": "nc_matmul", "dst": ps, "stationary": "wt", "moving": mv, "loc": L()})
            t = tile()
            body.append({"op": "tensor_copy", "dst": t, "src": ps, "engine": r.choice(["vector", "scalar"]), "loc": L()})
        elif k == "acc" and use_acc:
            body.append({"op": "tensor_tensor", "dst": "acc", "data1": "acc", "data2": prev, "alu0": "add", "loc": L()})
            t = prev
        elif k == "half" and f >= 128:
            h = f // 2
            body.append({"op": "tensor_scalar", "dst": {"tensor": prev, "index": [{"start": 0, "size": P}, {"start": h, "size": h}]},
                         "data": {"tensor": prev, "index": [{"start": 0, "size": P}, {"start": 0, "size": h}]},
                         "alu0": "add", "flags": ["has_imm0"], "imm": [1.0, 0, 1, 0], "loc": L()})
            t = prev
        elif k == "inner" and f >= 128:
            h = f // 2
            body.append({"loop": {"var": "j", "start": 0, "stop": 2, "step": 1, "kind": "affine", "body": [
                {"op": "tensor_scalar", "dst": {"tensor": prev, "index": [{"start": 0, "size": P}, {"start": "%d*j" % h, "size": h}]},
                 "data": {"tensor": prev, "index": [{"start": 0, "size": P}, {"start": "%d*j" % h, "size": h}]},
                 "alu0": "add", "flags": ["has_imm0"], "imm": [1.0, 0, 1, 0], "loc": L()}]}})
            t = prev
        elif k == "tr" and P == 128 and f >= 128:
            ps = tile("float32", 128, 128, "psum")
            body.append({"op": "nc_transpose", "dst": ps, "data": {"tensor": prev, "index": [{"start": 0, "size": 128}, {"start": 0, "size": 128}]},
                         "engine": "tensor", "loc": L()})
            t = tile(free=128)
            body.append({"op": "tensor_copy", "dst": t, "src": ps, "loc": L()})
            t2 = tile()
            body.append({"op": "tensor_tensor", "dst": t2, "data1": prev, "data2": prev, "alu0": "add", "loc": L()})
            t = t2
        elif k == "sel":
            t = tile()
            body.append({"op": "affine_select", "dst": t, "on_true": prev, "alu0": "greater_equal", "imm": [-9984],
                         "iimm": [r.choice([0, 5, -7]), 1, 0, 1, 0, 1, 0, 1, -1, f], "loc": L()})
        elif k == "bias":
            m = tile(free=1); t = tile()
            body.append({"op": "tensor_reduce", "dst": m, "data": prev, "alu0": "add", "loc": L()})
            body.append({"op": "activation", "dst": t, "data": prev, "act": "exp", "bias": m, "loc": L()})
        elif k == "sb2sb":
            t = tile()
            body.append(dma(t, prev))
        elif k == "mm4" and use_mm and f >= 128:
            mv = tile("bfloat16")
            body.append({"op": "tensor_copy", "dst": mv, "src": prev, "loc": L()})
            ps = tile("float32", 128, f // 2, "psum")
            h = f // 2
            body.append({"loop": {"var": "k", "start": 0, "stop": 4, "step": 1, "kind": "sequential", "body": [
                {"op": "nc_matmul", "dst": ps, "stationary": "wt",
                 "moving": {"tensor": mv, "index": [{"start": 0, "size": 128}, {"start": 0, "size": h}]},
                 "flags": ["accumulate"], "loc": L()}]}})
            t = tile(free=h)
            body.append({"op": "tensor_copy", "dst": t, "src": ps, "loc": L()})
            t2 = tile()
            body.append({"op": "tensor_copy", "dst": {"tensor": t2, "index": [{"start": 0, "size": P}, {"start": 0, "size": h}]}, "src": t, "loc": L()})
            body.append({"op": "tensor_copy", "dst": {"tensor": t2, "index": [{"start": 0, "size": P}, {"start": h, "size": h}]}, "src": t, "loc": L()})
            t = t2
        elif k == "ptile" and use_mm:  # PE-tiled matmuls (tile_position / tile_size) on disjoint row tiles
            rows_t = 64 if cfg0 == "trn1" else 32
            mv = tile("bfloat16")
            body.append({"op": "tensor_copy", "dst": mv, "src": prev, "loc": L()})
            ps = tile("float32", 32, f, "psum")
            for q in range(128 // rows_t):
                body.append({"op": "nc_matmul", "dst": ps,
                             "stationary": {"tensor": "wt", "index": [{"start": rows_t * q, "size": rows_t}, {"start": 0, "size": 32}]},
                             "moving": {"tensor": mv, "index": [{"start": rows_t * q, "size": rows_t}, {"start": 0, "size": f}]},
                             "iimm": [rows_t * q, 0, rows_t, 32], "loc": L()})
            t = tile(free=f, parts=32)
            body.append({"op": "tensor_copy", "dst": t, "src": ps, "loc": L()})
            t = prev
        elif k == "psact" and use_mm:  # ScalarE reading PSUM
            mv = tile("bfloat16")
            body.append({"op": "tensor_copy", "dst": mv, "src": prev, "loc": L()})
            ps = tile("float32", 128, f, "psum")
            body.append({"op": "nc_matmul", "dst": ps, "stationary": "wt", "moving": mv, "loc": L()})
            t = tile()
            body.append({"op": "activation", "dst": t, "data": ps, "act": "exp", "loc": L()})
        elif k == "dacc" and dtypes[prev] == "float32" and f <= 256:  # (x, y and z fit in trn1's HBM)  # a DMA accumulating into z[b] (read-modify-write in place)
            body.append({"op": "dma_copy", "dst": {"tensor": "z", "index": ["b", {"start": 0, "size": P}, {"start": 0, "size": f}]},
                         "src": prev, "flags": ["accumulate"], "engine": r.choice(["gpsimd", "sync"]), "loc": L()})
            need_z[0] = True
            t = prev
        elif k == "dtr" and f == P:
            t = tile(dtypes[prev])
            body.append({"op": "dma_transpose", "dst": t, "src": prev, "loc": L()})
        elif k == "part" and P == 128:  # partitions 32..95 only
            t = tile()
            body.append({"op": "tensor_scalar", "dst": {"tensor": t, "index": [{"start": 32, "size": 64}, {"start": 0, "size": f}]},
                         "data": {"tensor": prev, "index": [{"start": 32, "size": 64}, {"start": 0, "size": f}]},
                         "alu0": "multiply", "flags": ["has_imm0"], "imm": [2.0, 0, 1, 0], "loc": L()})
            t = prev
        elif k == "og":  # two ops kept in program order (order_group)
            t = tile()
            body.append({"op": "tensor_copy", "dst": t, "src": prev, "order_group": 1, "loc": L()})
            t2 = tile()
            body.append({"op": "tensor_scalar", "dst": t2, "data": prev, "alu0": "multiply", "flags": ["has_imm0"],
                         "imm": [3.0, 0, 1, 0], "order_group": 1, "engine": "gpsimd", "loc": L()})
            t = t2
        elif k == "iota":  # a pattern that may move with the index
            t = tile()
            body.append({"op": "iota", "dst": t, "iimm": [r.choice([0, "b"]), 1, 1, f], "loc": L()})
            t = prev
        else:
            continue
        prev = t
    # the last tile may have 128 partitions (matmul) or P: store a P-partition view
    yt = tile(dt)
    body.append({"op": "tensor_copy", "dst": yt, "src": {"tensor": prev, "index": [{"start": 0, "size": P}, {"start": 0, "size": f}]}, "loc": L()})
    body.append(dma({"tensor": "y", "index": [si, {"start": 0, "size": P}, {"start": 0, "size": f}]}, yt))
    if use_acc:
        post.append({"alloc": {"name": "acc_o", "buffer": "sbuf", "dtype": dt, "shape": [P, f]}})
        post.append({"op": "tensor_copy", "dst": "acc_o", "src": "acc", "loc": L()})
        post.append({"op": "dma_copy", "dst": {"tensor": "y", "index": [rows - 1, {"start": 0, "size": P}, {"start": 0, "size": f}]},
                     "src": "acc_o", "loc": L()})
    kind = "sequential" if (si == "0" or use_acc or recur or r.random() < 0.5) else "affine"
    if need_z[0]:
        tensors.append({"name": "z", "buffer": "hbm", "kind": "output", "dtype": "float32", "shape": [2 * n, P, f]})
    shape = r.random()
    if wide and shape > 0.85:  # an outer loop of 20 around a loop of n / 20 (each instance followed on its own)
        inner = max(200, n // 20)
        main = [{"loop": {"var": "o", "start": 0, "stop": 20, "step": 1, "kind": "sequential", "body": [
            {"loop": {"var": "b", "start": 0, "stop": inner, "step": 1, "kind": kind, "body": body}}]}}]
        k = {"nsim_kernel": 1, "name": "rich_loop", "tensors": tensors, "body": pre + main + post}
        return k, cfg0, [], "nested 20x%d P%d f%d %s %s" % (inner, P, f, dt, cfg0)
    if shape < 0.15:   # an outer loop of 2 around the long loop (its index unused)
        loop = {"loop": {"var": "o", "start": 0, "stop": 2, "step": 1, "kind": "sequential", "body": [
            {"loop": {"var": "b", "start": 0, "stop": n // 2, "step": 1, "kind": kind, "body": body}}]}}
        main = [loop]
    elif shape < 0.3:  # two loops one after the other (the second a copy of the first)
        main = [{"loop": {"var": "b", "start": 0, "stop": n // 2, "step": 1, "kind": kind, "body": body}},
                {"loop": {"var": "b", "start": n // 2, "stop": n, "step": 1, "kind": kind, "body": json.loads(re.sub(r'"t(\d+)"', r'"u\1"', json.dumps(body)))}}]
    elif shape < 0.4:  # step 2
        main = [{"loop": {"var": "b", "start": 1, "stop": 2 * n - 1, "step": 2, "kind": kind, "body": body}}]
    else:
        main = [{"loop": {"var": "b", "start": 0, "stop": n, "step": 1, "kind": kind, "body": body}}]
    k = {"nsim_kernel": 1, "name": "rich_loop", "tensors": tensors, "body": pre + main + post}
    cfg = cfg0 or r.choice(["trn1", "trn2", "trn2", "trn3"])
    ov = []
    if r.random() < 0.5:
        ov.append("compiler.window=%d" % r.choice([64, 256, 1024, 2048]))
    if r.random() < 0.5:
        ov.append("compiler.loop_buffers=%d" % r.choice([2, 3, 4]))
    return k, cfg, ov, "P%d f%d %s mm%d acc%d rec%d %s %s" % (P, f, dt, use_mm, use_acc, recur, cfg, " ".join(ov))


def stats(nsim, path, ff, tmp, config="trn2", overrides=(), limit=()):
    out = os.path.join(tmp, "stats.json")
    cmd = [nsim, "run", "--timing-only", "--quiet", "--config", config, "--stats", out, path, *limit]
    for o in overrides:
        cmd += ["-p", o]
    p = subprocess.run(cmd + (["--fast-forward"] if ff else ["--no-fast-forward"]), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                       text=True)
    if any(x.startswith("--max-") for x in limit) and p.returncode == 2 and "limit reached" in p.stderr:
        pass  # stopped by the limit (E416), as asked: the stats file covers the partial run
    elif p.returncode == 2 and not ff:  # a clean error on the full run (a random kernel whose tiles do not fit: E206)
        return None, p.stderr.splitlines()[0] if p.stderr else "exit status 2"
    elif p.returncode != 0:
        sys.stderr.write(p.stderr)
        raise subprocess.CalledProcessError(p.returncode, cmd)
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
    ap.add_argument("--kind", choices=("hbm", "rich", "wide"), default="hbm")
    ap.add_argument("--kernels", type=int, default=40)
    ap.add_argument("--first", type=int, default=0, help="first seed")
    ap.add_argument("--iterations", type=int, default=3000)
    ap.add_argument("--misalign", type=int, default=0, metavar="BYTES",
                    help="put an unused input tensor of BYTES bytes (a multiple of 4) first, so that the others start "
                         "off the 4 KiB chunks of the simulator's HBM dependency tracking (HBM tensors are 64 B aligned)")
    ap.add_argument("--trace", action="store_true",
                    help="both runs also write a trace with a filter drawn from the seed; the files must be identical")
    ap.add_argument("--limit", action="store_true",
                    help="stop both runs by a limit somewhere in the kernel (--max-instructions or --max-sim-time, "
                         "by seed, at 10-90 %% of the full run's instructions or time, drawn from the seed): the "
                         "partial runs' stats must be identical too")
    a = ap.parse_args()
    different = skipping = rejected = 0
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.json")
        for seed in range(a.first, a.first + a.kernels):
            if a.kind in ("rich", "wide"):
                k, config, overrides, desc = rich_kernel(seed, a.iterations, a.kind == "wide")
            else:
                (k, desc), config, overrides = kernel(seed, a.iterations), "trn2", []
            if a.misalign:
                k["tensors"].insert(0, {"name": "pad", "buffer": "hbm", "kind": "input", "dtype": "float32",
                                        "shape": [a.misalign // 4]})
            with open(path, "w") as fh:
                json.dump(k, fh)
            full, error = stats(a.nsim, path, False, tmp, config, overrides)
            if full is None:
                rejected += 1
                print("rejected seed {:4d}  {:34s} {}".format(seed, desc, error[:120]), flush=True)
                continue
            limit = []
            if a.limit:
                r = random.Random(seed * 7919 + 1)
                if seed % 2:
                    limit = ["--max-instructions", str(int(full["instructions"] * r.uniform(0.1, 0.9)))]
                else:
                    limit = ["--max-sim-time", "%.1f" % (full["stats"]["total_time"]["value"] * r.uniform(0.1, 0.9))]
                full, _ = stats(a.nsim, path, False, tmp, config, overrides, limit)
                desc += " " + " ".join(limit)
            traces = []
            if a.trace:
                r = random.Random(seed * 104729 + 3)
                total = full["stats"]["total_time"]["value"]
                how = r.choice(("limit", "end", "window", "limit+start"))
                ext = r.choice(("json", "pftrace"))
                filt = {"limit": ["--trace-limit", str(r.randint(50, 5000))],
                        "end": ["--trace-window", ":%.1f" % (total * r.uniform(0.02, 0.6))],
                        "window": ["--trace-window", "%.1f:%.1f" % (total * r.uniform(0.01, 0.1), total * r.uniform(0.2, 0.6))],
                        "limit+start": ["--trace-limit", str(r.randint(50, 5000)),
                                        "--trace-window", "%.1f:" % (total * r.uniform(0.01, 0.1))]}[how]
                limit = limit + filt
                desc += " trace " + " ".join(filt)
                for run_ff in (False, True):
                    t = os.path.join(tmp, "t{}.{}".format(int(run_ff), ext))
                    traces.append(t)
                    d, s = stats(a.nsim, path, run_ff, tmp, config, overrides, limit + ["--trace", t])
                    if run_ff:
                        ff, skipped = d, s
                    else:
                        full = d
            else:
                ff, skipped = stats(a.nsim, path, True, tmp, config, overrides, limit)
            skipping += skipped > 0
            same = full == ff
            if traces:
                with open(traces[0], "rb") as f0, open(traces[1], "rb") as f1:
                    same = same and f0.read() == f1.read()
            different += not same
            print("{} seed {:4d}  {:34s} skipped {:7.0f}".format("same" if same else "DIFFERENT", seed, desc, skipped),
                  flush=True)
    print("{} kernels: {} different, {} skipping, {} rejected by the full run".format(
        a.kernels, different, skipping, rejected))
    return 1 if different else 0


if __name__ == "__main__":
    sys.exit(main())
