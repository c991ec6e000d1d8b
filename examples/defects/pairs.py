"""Defect/fix pairs: small kernels, each with one performance defect a kernel author commonly writes and
its fix, written in the new NKI dialect the way public kernels are. They calibrate `nsim analyze`: on each
"before" kernel the top finding should name the defect and the line marked `# DEFECT`, and its estimated
saving should be within 2x of what the fix measures (tests/python/test_defects.py; the table in
docs/profiling.md comes from `python examples/defects/pairs.py`).
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable, Tuple

import numpy as np

from nsim import nki
import nsim.nki.isa as nisa
import nsim.nki.language as nl

try:
    from ml_dtypes import bfloat16 as BF16
except ImportError:  # pragma: no cover
    BF16 = np.float32


@dataclass
class Pair:
    name: str
    kind: str                # the finding that should come first on `before`
    before: Callable
    after: Callable
    inputs: Callable[[], Tuple]
    what: str


# ---------------------------------------------------------------------------------------- 1. tiny DMAs
def _scale(cols):
    @nki.jit
    def scale(x):
        n, f = x.shape
        out = nl.ndarray((n, f), x.dtype, buffer=nl.shared_hbm)
        for j in nl.affine_range(f // cols):
            t = nl.ndarray((128, cols), x.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=t, src=x[:, j * cols:(j + 1) * cols])  # DEFECT
            y = nl.ndarray((128, cols), x.dtype, buffer=nl.sbuf)
            nisa.tensor_scalar(dst=y, data=t, op0=nl.multiply, operand0=2.0)
            nisa.dma_copy(dst=out[:, j * cols:(j + 1) * cols], src=y)  # DEFECT
        return out
    return scale


# --------------------------------------------------------------------------- 2. weights reloaded 8x
@nki.jit
def add_bias_reloading(x, w):
    n, f = x.shape
    out = nl.ndarray((n, f), x.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(n // 128):
        wt = nl.ndarray((128, f), w.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=wt, src=w)  # DEFECT
        xt = nl.ndarray((128, f), x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=xt, src=x[i * 128:(i + 1) * 128, :])
        y = nl.ndarray((128, f), x.dtype, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=y, data1=xt, data2=wt, op=nl.add)
        nisa.dma_copy(dst=out[i * 128:(i + 1) * 128, :], src=y)
    return out


@nki.jit
def add_bias_hoisted(x, w):
    n, f = x.shape
    out = nl.ndarray((n, f), x.dtype, buffer=nl.shared_hbm)
    wt = nl.ndarray((128, f), w.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=wt, src=w)
    for i in nl.affine_range(n // 128):
        xt = nl.ndarray((128, f), x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=xt, src=x[i * 128:(i + 1) * 128, :])
        y = nl.ndarray((128, f), x.dtype, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=y, data1=xt, data2=wt, op=nl.add)
        nisa.dma_copy(dst=out[i * 128:(i + 1) * 128, :], src=y)
    return out


# ------------------------------------------------------------- 3./4. matmuls: fp32 inputs, narrow N
def _matmul(ncols, cast_to=None):
    """out = lhsT^T @ rhs, rhs loaded 512 columns at a time; each 512-column tile multiplied in
    `ncols`-column pieces, in the inputs' dtype or cast to `cast_to` on chip first."""
    @nki.jit
    def mm(lhsT, rhs):
        k, m = lhsT.shape
        _, n = rhs.shape
        out = nl.ndarray((m, n), nl.float32, buffer=nl.shared_hbm)
        lt = nl.ndarray((k, m), lhsT.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=lt, src=lhsT)
        if cast_to is not None:
            lc = nl.ndarray((k, m), cast_to, buffer=nl.sbuf)
            nisa.tensor_copy(dst=lc, src=lt)
            lt = lc
        for j in nl.affine_range(n // 512):
            rt = nl.ndarray((k, 512), rhs.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=rt, src=rhs[:, j * 512:(j + 1) * 512])
            if cast_to is not None:
                rc = nl.ndarray((k, 512), cast_to, buffer=nl.sbuf)
                nisa.tensor_copy(dst=rc, src=rt)
                rt = rc
            ps = nl.ndarray((m, 512), nl.float32, buffer=nl.psum)
            for c in nl.affine_range(512 // ncols):
                nisa.nc_matmul(dst=ps[:, c * ncols:(c + 1) * ncols], stationary=lt,  # DEFECT
                               moving=rt[:, c * ncols:(c + 1) * ncols])
            res = nl.ndarray((m, 512), nl.float32, buffer=nl.sbuf)
            nisa.tensor_copy(dst=res, src=ps)
            nisa.dma_copy(dst=out[:, j * 512:(j + 1) * 512], src=res)
        return out
    return mm


# ------------------------------------------------------- 5. element-wise work all on VectorE
@nki.jit
def softmax_on_vector(x):
    n, f = x.shape
    out = nl.ndarray((n, f), x.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(n // 128):
        xt = nl.ndarray((128, f), x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=xt, src=x[i * 128:(i + 1) * 128, :])
        xf = nl.ndarray((128, f), nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=xf, src=xt, engine=nisa.vector_engine)  # DEFECT
        mx = nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=mx, op=nl.maximum, data=xf, axis=1)
        sh = nl.ndarray((128, f), nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=sh, data=xf, op0=nl.subtract, operand0=mx, engine=nisa.vector_engine)
        e = nl.ndarray((128, f), nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=e, op=nl.exp, data=sh)
        s = nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=s, op=nl.add, data=e, axis=1)
        r = nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf)
        nisa.reciprocal(dst=r, data=s)
        y = nl.ndarray((128, f), x.dtype, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=y, data=e, op0=nl.multiply, operand0=r, engine=nisa.vector_engine)
        nisa.dma_copy(dst=out[i * 128:(i + 1) * 128, :], src=y)
    return out


@nki.jit
def softmax_fused(x):
    n, f = x.shape
    out = nl.ndarray((n, f), x.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(n // 128):
        xt = nl.ndarray((128, f), x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=xt, src=x[i * 128:(i + 1) * 128, :])
        mx = nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=mx, op=nl.maximum, data=xt, axis=1, negate=True)
        e = nl.ndarray((128, f), nl.float32, buffer=nl.sbuf)
        s = nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=e, op=nl.exp, data=xt, bias=mx, reduce_op=nl.add, reduce_res=s,
                        reduce_cmd=nisa.reduce_cmd.reset_reduce)
        r = nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf)
        nisa.reciprocal(dst=r, data=s)
        y = nl.ndarray((128, f), x.dtype, buffer=nl.sbuf)
        nisa.activation(dst=y, op=nl.copy, data=e, scale=r)
        nisa.dma_copy(dst=out[i * 128:(i + 1) * 128, :], src=y)
    return out


def _rand(shape, dtype=np.float32, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


PAIRS = [
    Pair("tiny DMAs: 128 B per partition per transfer", "dma_efficiency", _scale(64), _scale(2048),
         lambda: (_rand((128, 8192), BF16),), "64-column tiles -> 2048-column tiles"),
    Pair("weights reloaded in every iteration (8x)", "redundant_dma", add_bias_reloading, add_bias_hoisted,
         lambda: (_rand((128 * 8, 2048), BF16), _rand((128, 2048), BF16, 1)), "weight load hoisted out of the loop"),
    Pair("fp32 matmul inputs", "fp32_matmul", _matmul(512), _matmul(512, cast_to=BF16),
         lambda: (_rand((128, 128)), _rand((128, 8192), seed=1)), "operands cast to bf16 on chip (fp32 PSUM)"),
    Pair("all element-wise work on VectorE", "engine_bound", softmax_on_vector, softmax_fused,
         lambda: (_rand((512, 2048), BF16),), "exp+sum and the scale fused into ScalarE activations"),
]


def defect_lines(kernel) -> list:
    """The lines of `kernel` marked `# DEFECT`."""
    fn = getattr(kernel, "fn", kernel)
    src, first = inspect.getsourcelines(fn)
    return [first + i for i, text in enumerate(src) if "# DEFECT" in text]


def measure(pair: Pair, config: str = "trn2") -> dict:
    """Before/after times, the before kernel's top finding and the after kernel's finding of that kind."""
    args = pair.inputs()
    _, pb = pair.before.options(timing_only=True, config=config).simulate(*args)
    _, pa = pair.after.options(timing_only=True, config=config).simulate(*args)
    ab, aa = pb.analyze(), pa.analyze()
    top = ab.findings[0] if ab.findings else None
    return {"name": pair.name, "kind": pair.kind, "before_ns": pb.total_time_ns, "after_ns": pa.total_time_ns,
            "saved_ns": pb.total_time_ns - pa.total_time_ns, "top": top, "after_finding": aa.finding(pair.kind),
            "defect_lines": defect_lines(pair.before)}


def main():
    print("| defect (trn2) | top finding | its line | estimated saving (ns) | before (ns) | after (ns) | "
          "measured saving (ns) | fix |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for p in PAIRS:
        m = measure(p)
        top = m["top"]
        line = top["lines"][0]["line"] if top and top["lines"] else "-"
        print("| {} | `{}` | {} | {:.0f} | {:.0f} | {:.0f} | {:.0f} | {} |".format(
            p.name, top["kind"] if top else "-", "`# DEFECT`" if line in m["defect_lines"] else line,
            top["saving_ns"] if top else 0, m["before_ns"], m["after_ns"], m["saved_ns"], p.what))


if __name__ == "__main__":
    main()
