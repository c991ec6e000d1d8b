"""Defect/fix pairs: small kernels, each with one performance defect a kernel author commonly writes and
its fix, written in the new NKI dialect the way public kernels are. They calibrate `nsim analyze`: on each
"before" kernel the top finding should name the defect and the line marked `# DEFECT`, and its estimated
saving should be within 2x of what the fix measures (tests/python/test_defects.py; the table in
docs/profiling.md comes from `python examples/defects/pairs.py`).
"""
from __future__ import annotations

import inspect
import os
from dataclasses import dataclass
from typing import Callable, Optional, Tuple

import numpy as np

from nsim import nki
import nsim.nki.isa as nisa
import nsim.nki.language as nl
import nsim.kernels.attention as A

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
    lines: Optional[Callable[[], list]] = None  # (file name, line) of the defect when not marked `# DEFECT`
    #: the fix's arguments made from the defect's (a fix that changes the data layout the caller hands in)
    after_inputs: Optional[Callable[[Tuple], Tuple]] = None


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


# ------------------------------------------------------------------------- 3. matmuls: fp32 inputs
def _matmul(cast_to=None):
    """out = lhsT^T @ rhs with K accumulated over 128-row tiles in PSUM: lhsT [K, M] loaded once, rhs loaded
    K x 512 at a time (one 128-row tile per K tile), each of its tiles feeding M / 128 matmuls (one per block of
    128 output rows); the matmuls take the inputs' dtype, or the tiles are cast to `cast_to` on chip first (once
    per tile)."""
    @nki.jit
    def mm(lhsT, rhs):
        k, m = lhsT.shape
        _, n = rhs.shape
        kt = k // 128
        out = nl.ndarray((m, n), nl.float32, buffer=nl.shared_hbm)
        lt = nl.ndarray((128, kt, m), lhsT.dtype, buffer=nl.sbuf)
        for t in nl.affine_range(kt):
            nisa.dma_copy(dst=lt[:, t, :], src=lhsT[t * 128:(t + 1) * 128, :])
        if cast_to is not None:
            lc = nl.ndarray((128, kt, m), cast_to, buffer=nl.sbuf)
            nisa.tensor_copy(dst=lc, src=lt)
            lt = lc
        for j in nl.affine_range(n // 512):
            rt = nl.ndarray((128, kt, 512), rhs.dtype, buffer=nl.sbuf)
            for t in nl.affine_range(kt):
                nisa.dma_copy(dst=rt[:, t, :], src=rhs[t * 128:(t + 1) * 128, j * 512:(j + 1) * 512])
            if cast_to is not None:
                rc = nl.ndarray((128, kt, 512), cast_to, buffer=nl.sbuf)
                nisa.tensor_copy(dst=rc, src=rt)
                rt = rc
            for b in nl.affine_range(m // 128):
                ps = nl.ndarray((128, 512), nl.float32, buffer=nl.psum)
                for t in nl.affine_range(kt):
                    nisa.nc_matmul(dst=ps, stationary=lt[:, t, b * 128:(b + 1) * 128], moving=rt[:, t, :])  # DEFECT
                res = nl.ndarray((128, 512), nl.float32, buffer=nl.sbuf)
                nisa.tensor_copy(dst=res, src=ps)
                nisa.dma_copy(dst=out[b * 128:(b + 1) * 128, j * 512:(j + 1) * 512], src=res)
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
        nisa.tensor_scalar(dst=sh, data=xf, op0=nl.subtract, operand0=mx,  # DEFECT(fold_into_activation)
                           engine=nisa.vector_engine)
        e = nl.ndarray((128, f), nl.float32, buffer=nl.sbuf)
        s = nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=e, op=nl.exp, data=sh, reduce_op=nl.add, reduce_res=s,
                        reduce_cmd=nisa.reduce_cmd.reset_reduce)
        r = nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf)
        nisa.reciprocal(dst=r, data=s)
        y = nl.ndarray((128, f), x.dtype, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=y, data=e, op0=nl.multiply, operand0=r, engine=nisa.vector_engine)
        nisa.dma_copy(dst=out[i * 128:(i + 1) * 128, :], src=y)
    return out


@nki.jit
def softmax_on_vector_bias(x):
    """softmax_on_vector with its subtraction folded into the exp's bias (the max negated by the reduction): the
    fold_into_activation fix; the casts and the scale still on VectorE."""
    n, f = x.shape
    out = nl.ndarray((n, f), x.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(n // 128):
        xt = nl.ndarray((128, f), x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=xt, src=x[i * 128:(i + 1) * 128, :])
        xf = nl.ndarray((128, f), nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=xf, src=xt, engine=nisa.vector_engine)  # DEFECT
        mx = nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=mx, op=nl.maximum, data=xf, axis=1, negate=True)
        e = nl.ndarray((128, f), nl.float32, buffer=nl.sbuf)
        s = nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=e, op=nl.exp, data=xf, bias=mx, reduce_op=nl.add, reduce_res=s,
                        reduce_cmd=nisa.reduce_cmd.reset_reduce)
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


# -------------------------------------- 5./7. linear layer: narrow matmuls, bias broadcast on the PE array
def _load_k_tiles(xT, w):
    """xT [K, M] and w [K, N] loaded into SBUF as [128, K / 128, M] and [128, K / 128, N], one DMA per 128 rows
    (a helper the kernels below call, as public kernels factor their loads)."""
    kt = xT.shape[0] // 128
    xs = nl.ndarray((128, kt, xT.shape[1]), xT.dtype, buffer=nl.sbuf)
    ws = nl.ndarray((128, kt, w.shape[1]), w.dtype, buffer=nl.sbuf)
    for t in nl.affine_range(kt):
        nisa.dma_copy(dst=xs[:, t, :], src=xT[t * 128:(t + 1) * 128, :])
        nisa.dma_copy(dst=ws[:, t, :], src=w[t * 128:(t + 1) * 128, :])
    return xs, ws


def _linear(ncols=512, bias=None):
    """out = x @ w (+ b) for xT [K, M] (x transposed: K on the partitions) and w [K, N], K accumulated in
    PSUM 128 rows at a time, N in 512-column PSUM banks multiplied `ncols` columns per matmul. bias "pe":
    the bias row broadcast to 128 partitions by a ones-row matmul accumulated into each PSUM bank; "dma":
    the bias loaded once onto every partition by a stride-0 DMA and added while evacuating PSUM."""
    @nki.jit
    def linear(xT, w, b):
        k, m = xT.shape
        _, n = w.shape
        kt = k // 128
        out = nl.ndarray((m, n), xT.dtype, buffer=nl.shared_hbm)
        xs, ws = _load_k_tiles(xT, w)
        if bias == "pe":
            ones = nl.ndarray((1, 128), b.dtype, buffer=nl.sbuf)
            nisa.memset(dst=ones, value=1.0)
            brow = nl.ndarray((1, n), b.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=brow, src=b)
        elif bias == "dma":
            bb = nl.ndarray((128, n), b.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=bb, src=b.broadcast(0, 128))
        for i in nl.affine_range(m // 128):
            for j in nl.affine_range(n // 512):
                ps = nl.ndarray((128, 512), nl.float32, buffer=nl.psum)
                for t in nl.affine_range(kt):
                    for c in nl.affine_range(512 // ncols):
                        nisa.nc_matmul(dst=ps[:, c * ncols:(c + 1) * ncols],  # DEFECT(pe_underfill)
                                       stationary=xs[:, t, i * 128:(i + 1) * 128],
                                       moving=ws[:, t, j * 512 + c * ncols:j * 512 + (c + 1) * ncols])
                if bias == "pe":  # accumulates ones^T @ b = b on every partition into the bank
                    nisa.nc_matmul(dst=ps, stationary=ones, moving=brow[:, j * 512:(j + 1) * 512])  # DEFECT(pe_broadcast)
                res = nl.ndarray((128, 512), xT.dtype, buffer=nl.sbuf)
                if bias == "dma":
                    nisa.tensor_tensor(dst=res, data1=ps, data2=bb[:, j * 512:(j + 1) * 512], op=nl.add)
                else:
                    nisa.tensor_copy(dst=res, src=ps)
                nisa.dma_copy(dst=out[i * 128:(i + 1) * 128, j * 512:(j + 1) * 512], src=res)
        return out
    return linear


# ------------------------------------------------------------------ 6. transposes on the PE array
def _xw(transpose_on_pe):
    """out = x @ w: TensorE contracts over the partitions, so x is needed transposed (K on the
    partitions) as the stationary operand. With x [M, K] row-major in HBM each 128x128 block is
    transposed on the PE array (through PSUM, copied back to SBUF); the fix lays the data out so the
    contraction dimension is on the partitions: the caller hands in x^T [K, M] (the layout the producing
    kernel writes), loaded with plain DMAs. (Loading x transposed by dma_transpose is no fix on trn2: the
    DMA transposes cost about what the PE transposes and their evictions do.)"""
    @nki.jit
    def xw(x, w):
        if transpose_on_pe:
            m, k = x.shape
        else:
            k, m = x.shape  # x^T
        _, n = w.shape
        kt = k // 128
        out = nl.ndarray((m, n), nl.float32, buffer=nl.shared_hbm)
        ws = nl.ndarray((128, kt, n), w.dtype, buffer=nl.sbuf)
        for t in nl.affine_range(kt):
            nisa.dma_copy(dst=ws[:, t, :], src=w[t * 128:(t + 1) * 128, :])
        xT = nl.ndarray((128, kt, m), x.dtype, buffer=nl.sbuf)  # xT[:, t, :] = x[:, t*128:(t+1)*128]^T
        if transpose_on_pe:
            for i in nl.affine_range(m // 128):
                xs = nl.ndarray((128, k), x.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=xs, src=x[i * 128:(i + 1) * 128, :])
                for t in nl.affine_range(kt):
                    tp = nl.ndarray((128, 128), x.dtype, buffer=nl.psum)
                    nisa.nc_transpose(dst=tp, data=xs[:, t * 128:(t + 1) * 128], engine=nisa.tensor_engine)  # DEFECT
                    nisa.tensor_copy(dst=xT[:, t, i * 128:(i + 1) * 128], src=tp)
        else:
            for t in nl.affine_range(kt):
                nisa.dma_copy(dst=xT[:, t, :], src=x[t * 128:(t + 1) * 128, :])
        for i in nl.affine_range(m // 128):
            ps = nl.ndarray((128, n), nl.float32, buffer=nl.psum)
            for t in nl.affine_range(kt):
                nisa.nc_matmul(dst=ps, stationary=xT[:, t, i * 128:(i + 1) * 128], moving=ws[:, t, :])
            res = nl.ndarray((128, n), nl.float32, buffer=nl.sbuf)
            nisa.tensor_copy(dst=res, src=ps)
            nisa.dma_copy(dst=out[i * 128:(i + 1) * 128, :], src=res)
        return out
    return xw


# ------------------------------------------------------------------ 8. no double buffering
def _exp_rows(double_buffered):
    @nki.jit
    def exp_rows(x):
        n, f = x.shape
        out = nl.ndarray((n, f), x.dtype, buffer=nl.shared_hbm)
        if not double_buffered:
            xt = nl.ndarray((128, f), x.dtype, buffer=nl.sbuf)  # allocated once: one buffer for every tile
        for i in nl.affine_range(n // 128):
            if double_buffered:
                xt = nl.ndarray((128, f), x.dtype, buffer=nl.sbuf)  # allocated in the loop: rotating buffers
            nisa.dma_copy(dst=xt, src=x[i * 128:(i + 1) * 128, :])  # DEFECT
            y = nl.ndarray((128, f), x.dtype, buffer=nl.sbuf)
            nisa.activation(dst=y, op=nl.exp, data=xt)
            nisa.dma_copy(dst=out[i * 128:(i + 1) * 128, :], src=y)
        return out
    return exp_rows


# ------------------------------------------------------ 8b. one PSUM tile for every matmul group
def _psum_rows(double_buffered):
    """relu(xT^T @ w) in [128, 512] output blocks, K = 256 accumulated in PSUM, ScalarE reading each block out."""
    @nki.jit
    def mm_relu(xT, w):
        k, m = xT.shape
        _, n = w.shape
        kt = k // 128
        out = nl.ndarray((m, n), nl.bfloat16, buffer=nl.shared_hbm)
        xs, ws = _load_k_tiles(xT, w)
        if not double_buffered:
            ps = nl.ndarray((128, 512), nl.float32, buffer=nl.psum)  # allocated once: one bank for every block
        for i in nl.affine_range(m // 128):
            for j in nl.affine_range(n // 512):
                if double_buffered:
                    ps = nl.ndarray((128, 512), nl.float32, buffer=nl.psum)  # in the loop: rotating banks
                for t in nl.affine_range(kt):
                    nisa.nc_matmul(dst=ps, stationary=xs[:, t, i * 128:(i + 1) * 128],  # DEFECT
                                   moving=ws[:, t, j * 512:(j + 1) * 512])
                res = nl.ndarray((128, 512), nl.bfloat16, buffer=nl.sbuf)
                nisa.activation(dst=res, op=nl.relu, data=ps)
                nisa.dma_copy(dst=out[i * 128:(i + 1) * 128, j * 512:(j + 1) * 512], src=res)
        return out
    return mm_relu


# --------------------------------------------------------- 9. softmax: exp and sum in separate passes
@nki.jit
def softmax_two_pass(x):
    n, f = x.shape
    out = nl.ndarray((n, f), x.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(n // 128):
        xt = nl.ndarray((128, f), x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=xt, src=x[i * 128:(i + 1) * 128, :])
        mx = nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=mx, op=nl.maximum, data=xt, axis=1, negate=True)
        e = nl.ndarray((128, f), nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=e, op=nl.exp, data=xt, bias=mx)
        s = nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=s, op=nl.add, data=e, axis=1)  # DEFECT
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
    Pair("fp32 matmul inputs", "fp32_matmul", _matmul(), _matmul(cast_to=BF16),
         lambda: (_rand((512, 512)), _rand((512, 8192), seed=1)), "operands cast to bf16 on chip (fp32 PSUM)"),
    Pair("exp of a subtraction made in a pass of its own", "fold_into_activation", softmax_on_vector,
         softmax_on_vector_bias, lambda: (_rand((512, 2048), BF16),),
         "the subtraction folded into the exp's bias= (the max negated by its reduction)"),
    Pair("all element-wise work on VectorE", "engine_bound", softmax_on_vector_bias, softmax_fused,
         lambda: (_rand((512, 2048), BF16),), "the cast and the scale moved to ScalarE activations"),
    Pair("PE under-fill: 32-column matmuls", "pe_underfill", _linear(32), _linear(512),
         lambda: (_rand((512, 512), BF16), _rand((512, 2048), BF16, 1), _rand((1, 2048), BF16, 2)),
         "one 512-column matmul per PSUM bank instead of 16 of 32 columns"),
    Pair("transposes on the PE array", "pe_transpose", _xw(True), _xw(False),
         lambda: (_rand((256, 4096), BF16), _rand((4096, 128), BF16, 1)),
         "x handed in transposed (contraction dim on the partitions), plain loads",
         after_inputs=lambda a: (np.ascontiguousarray(a[0].T), a[1])),
    Pair("partition broadcast through the PE array", "pe_broadcast", _linear(512, "pe"), _linear(512, "dma"),
         lambda: (_rand((1024, 512), BF16), _rand((1024, 1024), BF16, 1), _rand((1, 1024), BF16, 2)),
         "bias loaded onto every partition by one stride-0 DMA, added while evacuating PSUM"),
    Pair("no double buffering", "single_buffer", _exp_rows(False), _exp_rows(True),
         lambda: (_rand((1024, 2048), BF16),), "input tile allocated inside the loop (rotating buffers)"),
    Pair("one PSUM tile for every matmul group", "single_buffer", _psum_rows(False), _psum_rows(True),
         lambda: (_rand((256, 2048), BF16), _rand((256, 4096), BF16, 1)),
         "PSUM tile allocated inside the loop (rotating banks)"),
    Pair("softmax: exp and sum in separate passes", "split_reduce", softmax_two_pass, softmax_fused,
         lambda: (_rand((512, 2048), BF16),), "row sums accumulated by the exp activation (reduce_res=)"),
    Pair("naive vs flash attention (S=1024, d=128)", "hbm_roundtrip", A.attention_naive, A.flash_attention,
         lambda: A.attention_inputs(s=1024) + (False,), "nsim.kernels flash attention: online softmax, scores kept on "
         "chip", lines=lambda: _naive_attention_lines()),
]


def _marked(fn, kind):
    src, first = inspect.getsourcelines(fn)
    return [first + i for i, text in enumerate(src)
            if "# DEFECT" in text and ("# DEFECT(" not in text or "# DEFECT({})".format(kind) in text)]


def _library_lines(module, *texts):
    """(file name, line) of the lines of a library module that contain one of `texts`."""
    src = inspect.getsource(module).splitlines()
    name = os.path.basename(inspect.getsourcefile(module))
    return [(name, i + 1) for i, t in enumerate(src) if any(x in t for x in texts)]


def _naive_attention_lines():
    """The naive kernel's defect: the score and probability matrices stored to HBM and loaded back."""
    return _library_lines(A, "nisa.dma_copy(dst=scores[", "src=scores[", "nisa.dma_copy(dst=probs[", "src=probs[")


def defect_lines(pair) -> list:
    """(file name, line) of the lines of `pair.before` marked `# DEFECT` (or `# DEFECT(<its kind>)`), or
    the library lines `pair.lines` names. Given a kernel instead of a Pair: its lines marked `# DEFECT`
    (line numbers)."""
    if not isinstance(pair, Pair):
        return _marked(getattr(pair, "fn", pair), None)
    if pair.lines is not None:
        return pair.lines()
    fn = getattr(pair.before, "fn", pair.before)
    return [(os.path.basename(inspect.getsourcefile(fn)), n) for n in _marked(fn, pair.kind)]


def top_line(finding) -> tuple:
    """(file name, line) of a finding's first line, or None."""
    if not finding or not finding["lines"]:
        return None
    return (os.path.basename(finding["lines"][0]["file"]), finding["lines"][0]["line"])


def measure(pair: Pair, config: str = "trn2") -> dict:
    """Before/after times, the before kernel's top finding and the after kernel's finding of that kind."""
    args = pair.inputs()
    _, pb = pair.before.options(timing_only=True, config=config).simulate(*args)
    _, pa = pair.after.options(timing_only=True, config=config).simulate(
        *(pair.after_inputs(args) if pair.after_inputs else args))
    ab, aa = pb.analyze(), pa.analyze()
    top = ab.findings[0] if ab.findings else None
    after = aa.finding(pair.kind)
    if after is not None and top is not None and pair.kind == "engine_bound" and \
            after["title"].split()[0] != top["title"].split()[0]:
        after = None  # another engine is the busiest now: not the bottleneck the fix removed
    return {"name": pair.name, "kind": pair.kind, "before_ns": pb.total_time_ns, "after_ns": pa.total_time_ns,
            "saved_ns": pb.total_time_ns - pa.total_time_ns, "top": top, "after_finding": after,
            "defect_lines": defect_lines(pair)}


def main():
    print("| defect (trn2) | top finding | its line | estimated saving (ns) | before (ns) | after (ns) | "
          "measured saving (ns) | fix |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for p in PAIRS:
        m = measure(p)
        top = m["top"]
        line = top_line(top)
        print("| {} | `{}` | {} | {:.0f} | {:.0f} | {:.0f} | {:.0f} | {} |".format(
            p.name, top["kind"] if top else "-",
            "-" if line is None else "{}:{}{}".format(line[0], line[1], " (the defect)" if line in m["defect_lines"] else ""),
            top["saving_ns"] if top else 0, m["before_ns"], m["after_ns"], m["saved_ns"], p.what))


if __name__ == "__main__":
    main()
