"""The flagship case-study shape of issue 12: one Qwen3-0.6B attention layer, timing-only, from Python.

    PYTHONPATH=python:build/python python3 benchmarks/bench_attention_qwen3.py [--seq 16384] [--unroll]
        [--kernel library|nki-samples|nki-samples-bwd]

Qwen3-0.6B: 16 query heads, 8 kv heads, head dim 128, causal; the library's ``flash_attention_gqa`` on trn2
with ``timing_only=True``, or (``--kernel nki-samples``) the public nki-samples ``flash_fwd`` as written
(tests/python/kernels/nki_samples_attention.py: q (1, 16, 128, S), k (1, 8, 128, S), v (1, 8, S, 128), launched
``flash_fwd[1, 8]``, causal, training; its Python ``if`` on loop indices splits its loops into pieces, written
out iteration by iteration: docs/kernel-json.md "Loops recorded in pieces"), or (``--kernel nki-samples-bwd``) the
public nki-samples backward pass ``flash_attn_bwd`` as written (tests/python/kernels/nki_samples_attention_bwd.py:
q, k, v, o, dy (1, 16, 128, S) (no GQA in the sample: k and v per query head), lse (1, 16, 128, S / 128), launched
``flash_attn_bwd[1, 16]``, causal, mixed precision; its causal mask, a Python bool per tile pair, writes its loops
out). Prints the wall time of the whole run and of its parts (tracing, simulation: the
kernel dict goes to the core as Python objects), the kernel's ops in the traced IR, the kernel.json size, the instructions simulated and
the peak RSS of the process. Loops are kept as loops (``loops="keep"``, the tracer's default); ``--unroll``
traces with every loop unrolled (``loops="unroll"``). One shape per process (peak RSS is per process).
"""
import argparse
import resource
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq", type=int, default=16384)
    ap.add_argument("--hq", type=int, default=16)
    ap.add_argument("--hkv", type=int, default=8)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--unroll", action="store_true", help="force every loop unrolled while tracing")
    ap.add_argument("--kernel", choices=("library", "nki-samples", "nki-samples-bwd"), default="library")
    args = ap.parse_args()

    import numpy as np
    import ml_dtypes
    from nsim import _core, tracer
    from nsim.kernels.attention import flash_attention_gqa

    t0 = time.perf_counter()
    bf16 = ml_dtypes.bfloat16  # timing-only: the values are never read (zeros, no conversion cost)
    q = np.zeros((args.hq, args.seq, args.d), bf16)
    k = np.zeros((args.hkv, args.seq, args.d), bf16)
    v = np.zeros((args.hkv, args.seq, args.d), bf16)
    loops = "unroll" if args.unroll else "keep"
    kkw = {}
    if args.kernel == "library":
        kern = flash_attention_gqa.options(config="trn2", timing_only=True, loops=loops)
        kargs = (q, k, v, True)
    else:
        import importlib.util
        import os
        from nsim import compat
        compat.install()
        bwd = args.kernel == "nki-samples-bwd"
        name = "nki_samples_attention_bwd" if bwd else "nki_samples_attention"
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python", "kernels",
                            name + ".py")
        spec = importlib.util.spec_from_file_location(name, path)
        sample = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sample)
        if bwd:
            kern = sample.flash_attn_bwd.options(config="trn2", timing_only=True, loops=loops)[1, args.hq]
            q = np.zeros((1, args.hq, args.d, args.seq), bf16)
            lse = np.zeros((1, args.hq, 128, args.seq // 128), np.float32)
            kargs = (q, q, q, q, q, lse, None)
            kkw = dict(use_causal_mask=True, mixed_precision=True)
        else:
            kern = sample.flash_fwd.options(config="trn2", timing_only=True, loops=loops)[1, args.hkv]
            q = np.zeros((1, args.hq, args.d, args.seq), bf16)
            k = np.zeros((1, args.hkv, args.d, args.seq), bf16)
            v = np.zeros((1, args.hkv, args.seq, args.d), bf16)
            kargs = (q, k, v, None)
    t1 = time.perf_counter()
    tres = kern.trace(*kargs, **kkw)
    t2 = time.perf_counter()
    _ret, _outs, prof = tracer.run(tres, config="trn2", timing_only=True)  # the dict goes to C++ as objects
    t3 = time.perf_counter()
    text, _ = _core._kernel_text(tres.kernel)  # for its size only (not on the simulate path)
    ir_ops, exec_ops = tracer.count_ops(tres.kernel["body"])
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print("qwen3-0.6B attention S={} hq={} hkv={} d={} ({}, {}), trn2 timing-only".format(
        args.seq, args.hq, args.hkv, args.d, {"library": "flash_attention_gqa", "nki-samples": "nki-samples flash_fwd",
                                              "nki-samples-bwd": "nki-samples flash_attn_bwd"}[args.kernel],
        "unrolled" if args.unroll else "loops kept"))
    print("  wall           {:8.2f} s  (inputs {:.2f}, trace {:.2f}, simulate {:.2f})".format(
        t3 - t0, t1 - t0, t2 - t1, t3 - t2))
    print("  ops in IR      {:8d}  (executed {})".format(ir_ops, exec_ops))
    instrs = sum(int(e["instruction_count"]["value"]) for e in prof.stats["engine"].values()
                 if isinstance(e, dict) and "instruction_count" in e)
    print("  instructions   {:8d}  (issued by the engines)".format(instrs))
    print("  kernel.json    {:8.2f} MB".format(len(text) / 1e6))
    print("  simulated time {:8.1f} us".format(prof.total_time_ns / 1000))
    print("  peak RSS       {:8.0f} MB".format(rss_mb))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
