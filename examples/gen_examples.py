#!/usr/bin/env python3
"""Generate the example kernels of examples/ as kernel.json (schema "nsim_kernel": 1).

Until the Python frontend (`import nsim`) exists, the examples are written by this script: each
kernel is a Python function that emits tile ops through a small builder, and every op records the
line of this file that emitted it as its source location ("loc"), so simulator errors, traces and
profiles point back here.

    python3 examples/gen_examples.py            # (re)write examples/*.json
    python3 examples/gen_examples.py --out DIR  # write them elsewhere (the determinism test does)
    python3 examples/gen_examples.py --list     # names, files and instruction counts

The output is deterministic (no randomness, no time stamps, stable key order); regenerating gives
byte-identical files. Numerical references: examples/reference.py. Needs only the Python standard
library.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys

SRC_FILE = "examples/gen_examples.py"

# --------------------------------------------------------------------------------------------------
# Example parameters (shared with reference.py and the tests)
# --------------------------------------------------------------------------------------------------

#: Scaled softmax: y = softmax(SOFTMAX_SCALE * x) over the last dim.
SOFTMAX_SCALE = 0.25
SOFTMAX_SHAPES = [(2, 128, 512), (4, 256, 1024), (1, 1, 64), (2, 300, 768)]

#: SwiGLU MLP: out = (silu(x @ W_gate) * (x @ W_up)) @ W_down.
SWIGLU_T, SWIGLU_D, SWIGLU_F = 256, 256, 512

#: Flash attention (single head, causal): out = softmax(scale * Q K^T + causal mask) V.
FA_S, FA_D = 512, 128
FA_SCALE = 1.0 / math.sqrt(FA_D)
#: Value written into masked (future) scores before the exp: exp(scale * (MASK - max)) == 0.
FA_MASK_VALUE = -30000.0

P = 128  # partitions / tile rows


def softmax_name(shape):
    return "softmax_{}x{}x{}".format(*shape)


# --------------------------------------------------------------------------------------------------
# Builder
# --------------------------------------------------------------------------------------------------


def sl(start, size, step=None):
    """A slice of one dim: elements start, start+step, ... (size of them). start may be an affine string."""
    d = {"start": start, "size": size}
    if step is not None and step != 1:
        d["step"] = step
    return d


def acc(tensor, *index):
    """An access of `tensor`: one entry per dim (int / affine string = one element, sl(...) = slice).
    Missing trailing dims mean the whole dim; no index means the whole tensor."""
    if not index:
        return tensor
    return {"tensor": tensor, "index": list(index)}


def aff(coef, var, const=0):
    """The affine string coef*var + const (canonical, e.g. "128*i + 256", "j + 1", "i")."""
    s = var if coef == 1 else "{}*{}".format(coef, var)
    if const > 0:
        s += " + {}".format(const)
    elif const < 0:
        s += " - {}".format(-const)
    return s


class Kernel:
    """Collects tensors and a statement tree; every op gets the caller's line as its loc."""

    def __init__(self, name, function):
        self.name = name
        self.function = function
        self.tensors = []
        self.body = []
        self._stack = [self.body]
        self._names = set()

    def _declare(self, name):
        if name in self._names:
            raise ValueError("duplicate tensor name " + name)
        self._names.add(name)

    def hbm(self, name, kind, dtype, shape):
        self._declare(name)
        self.tensors.append({"name": name, "buffer": "hbm", "kind": kind, "dtype": dtype, "shape": list(shape)})
        return name

    def alloc(self, name, buffer, dtype, shape, bufs=None):
        self._declare(name)
        a = {"name": name, "buffer": buffer, "dtype": dtype, "shape": list(shape)}
        if bufs is not None:
            a["bufs"] = bufs
        self._stack[-1].append({"alloc": a})
        return name

    @contextlib.contextmanager
    def loop(self, var, start, stop, kind="affine", step=1):
        body = []
        self._stack[-1].append(
            {"loop": {"var": var, "start": start, "stop": stop, "step": step, "kind": kind, "body": body}})
        self._stack.append(body)
        try:
            yield var
        finally:
            self._stack.pop()

    def op(self, name, engine=None, **fields):
        line = sys._getframe(1).f_lineno  # the generator line that emitted the op
        o = {"op": name}
        if engine is not None:
            o["engine"] = engine
        for k, v in fields.items():
            if v is not None:
                o[k] = v
        o["loc"] = {"file": SRC_FILE, "line": line, "function": self.function}
        self._stack[-1].append(o)

    def to_json(self):
        return {"nsim_kernel": 1, "name": self.name, "tensors": self.tensors, "body": self.body}


def instruction_count(kernel_json):
    """ISA instructions the kernel lowers to (nc_matmul = load_stationary + multiply_moving); DMA
    descriptors are not counted."""

    def count(body):
        n = 0
        for s in body:
            if "op" in s:
                n += 2 if s["op"] == "nc_matmul" else 1
            elif "loop" in s:
                lp = s["loop"]
                trips = max(0, -(-(lp["stop"] - lp["start"]) // lp["step"]))
                n += trips * count(lp["body"])
        return n

    return count(kernel_json["body"])


def dumps(obj):
    """Stable, diff-friendly JSON: one tensor / alloc / op per line, loops indented."""

    def stmts(body, ind):
        lines = []
        for i, s in enumerate(body):
            comma = "," if i + 1 < len(body) else ""
            if "loop" in s:
                lp = s["loop"]
                head = {k: lp[k] for k in ("var", "start", "stop", "step", "kind")}
                h = json.dumps(head, separators=(", ", ": "))[1:-1]
                lines.append(ind + '{"loop": {' + h + ', "body": [')
                lines.extend(stmts(lp["body"], ind + "  "))
                lines.append(ind + "]}}" + comma)
            else:
                lines.append(ind + json.dumps(s, separators=(", ", ": ")) + comma)
        return lines

    out = ["{", '"nsim_kernel": {},'.format(obj["nsim_kernel"]), '"name": {},'.format(json.dumps(obj["name"])),
           '"tensors": [']
    for i, t in enumerate(obj["tensors"]):
        out.append("  " + json.dumps(t, separators=(", ", ": ")) + ("," if i + 1 < len(obj["tensors"]) else ""))
    out.append("],")
    out.append('"body": [')
    out.extend(stmts(obj["body"], "  "))
    out.append("]")
    out.append("}")
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------------------------------
# Scaled softmax over the last dim of x [batch, seq, hidden] (bf16 in/out, fp32 inside)
# --------------------------------------------------------------------------------------------------


def softmax(shape, scale=SOFTMAX_SCALE):
    B, S, H = shape
    k = Kernel(softmax_name(shape), "softmax")
    k.hbm("x", "input", "bfloat16", shape)
    k.hbm("y", "output", "bfloat16", shape)

    def rows_block(row0, rows, sfx):
        """Softmax of `rows` (<= 128) consecutive rows starting at row0 of batch b, one row per partition."""
        x_t = k.alloc("x_t" + sfx, "sbuf", "bfloat16", [rows, H])
        mx = k.alloc("row_max" + sfx, "sbuf", "float32", [rows, 1])
        nb = k.alloc("neg_max" + sfx, "sbuf", "float32", [rows, 1])
        e_t = k.alloc("exp_t" + sfx, "sbuf", "float32", [rows, H])
        sm = k.alloc("row_sum" + sfx, "sbuf", "float32", [rows, 1])
        rs = k.alloc("inv_sum" + sfx, "sbuf", "float32", [rows, 1])
        y_t = k.alloc("y_t" + sfx, "sbuf", "bfloat16", [rows, H])
        rows_view = ["b", sl(row0, rows), sl(0, H)]
        k.op("dma_copy", dst=x_t, src=acc("x", *rows_view))
        # max_j x[r, j]; with scale > 0, max(scale * x) = scale * max(x)
        k.op("tensor_reduce", dst=mx, data=x_t, alu0="maximum", axis_count=0)
        k.op("tensor_scalar", dst=nb, data=mx, alu0="multiply", flags=["has_imm0"], imm=[-scale, 0.0, 1.0, 0.0])
        # e = exp(scale * x - scale * max) in fp32, row sums accumulated by ScalarE into row_sum
        k.op("activation", dst=e_t, data=x_t, bias=nb, reduce_res=sm, act="exp", alu1="add",
             reduce_cmd="reset_reduce", imm=[0.0, 0.0, scale, 0.0])
        k.op("reciprocal", dst=rs, data=sm)
        k.op("tensor_scalar", dst=y_t, data=e_t, operand0=rs, alu0="multiply")
        k.op("dma_copy", dst=acc("y", *rows_view), src=y_t)

    full, rem = divmod(S, P)
    with k.loop("b", 0, B, "affine"):
        if full:
            with k.loop("i", 0, full, "affine"):
                rows_block(aff(P, "i"), P, "")
        if rem:  # ragged tail: a block of fewer partitions
            rows_block(full * P, rem, "_tail")
    return k


# --------------------------------------------------------------------------------------------------
# SwiGLU MLP: out = (silu(x @ Wg) * (x @ Wu)) @ Wd, bf16 operands, fp32 PSUM accumulation
# --------------------------------------------------------------------------------------------------


def swiglu(T=SWIGLU_T, D=SWIGLU_D, F=SWIGLU_F):
    assert T % P == 0 and D % P == 0 and F % P == 0 and 2 * T <= 512 and D <= 512  # PSUM bank: 512 fp32
    nt, nd, nf = T // P, D // P, F // P
    k = Kernel("swiglu", "swiglu")
    k.hbm("x", "input", "bfloat16", [T, D])
    k.hbm("w_gate", "input", "bfloat16", [D, F])
    k.hbm("w_up", "input", "bfloat16", [D, F])
    k.hbm("w_down", "input", "bfloat16", [F, D])
    k.hbm("out", "output", "bfloat16", [T, D])

    # Resident operands. Contraction runs over partitions, so x is needed as x^T [D, T] and the
    # hidden activation is produced directly transposed, h^T [F, T] (no transpose before W_down).
    x_sb = k.alloc("x_sb", "sbuf", "bfloat16", [P, nt, D])       # x rows 128*t + p
    xT = k.alloc("xT", "sbuf", "bfloat16", [P, nd, T])           # x^T rows (d) 128*c + p
    wg = k.alloc("wg_sb", "sbuf", "bfloat16", [P, nd, F])        # W_gate rows 128*c + p
    wu = k.alloc("wu_sb", "sbuf", "bfloat16", [P, nd, F])
    wd = k.alloc("wd_sb", "sbuf", "bfloat16", [P, nf, D])        # W_down rows 128*f + p
    hT = k.alloc("hT", "sbuf", "bfloat16", [P, nf, T])           # h^T rows (f) 128*f + p

    with k.loop("t", 0, nt, "affine"):
        k.op("dma_copy", dst=acc(x_sb, sl(0, P), "t"), src=acc("x", sl(aff(P, "t"), P)), dma_queue=0)
    with k.loop("c", 0, nd, "affine"):
        k.op("dma_copy", dst=acc(wg, sl(0, P), "c"), src=acc("w_gate", sl(aff(P, "c"), P)), dma_queue=1)
        k.op("dma_copy", dst=acc(wu, sl(0, P), "c"), src=acc("w_up", sl(aff(P, "c"), P)), dma_queue=2)
    with k.loop("f", 0, nf, "affine"):
        k.op("dma_copy", dst=acc(wd, sl(0, P), "f"), src=acc("w_down", sl(aff(P, "f"), P)), dma_queue=3)

    # x^T by 128x128 TensorE transposes (SBUF -> PSUM), evicted to SBUF by VectorE.
    with k.loop("t", 0, nt, "affine"):
        with k.loop("c", 0, nd, "affine"):
            tp = k.alloc("x_tp", "psum", "bfloat16", [P, P], bufs=2)  # PSUM tiles take whole 2 KiB banks
            k.op("nc_transpose", engine="tensor", dst=acc(tp, sl(0, P), sl(0, P)),
                 data=acc(x_sb, sl(0, P), "t", sl(aff(P, "c"), P)))
            k.op("tensor_copy", engine="vector", dst=acc(xT, sl(0, P), "c", sl(aff(P, "t"), P)),
                 src=acc(tp, sl(0, P), sl(0, P)))

    # gate^T / up^T [128 f, T] = W[:, f-block]^T @ x^T, K-tiled over D with PSUM accumulation;
    # h^T = silu(gate^T) * up^T, stored bf16.
    with k.loop("f", 0, nf, "affine"):
        gu = k.alloc("gate_up_ps", "psum", "float32", [P, 2 * T], bufs=2)  # one 2 KiB bank: gate^T | up^T
        gate, up = acc(gu, sl(0, P), sl(0, T)), acc(gu, sl(0, P), sl(T, T))
        for c in range(nd):
            k.op("nc_matmul", dst=gate, stationary=acc(wg, sl(0, P), c, sl(aff(P, "f"), P)),
                 moving=acc(xT, sl(0, P), c), flags=["accumulate"] if c else None)
            k.op("nc_matmul", dst=up, stationary=acc(wu, sl(0, P), c, sl(aff(P, "f"), P)),
                 moving=acc(xT, sl(0, P), c), flags=["accumulate"] if c else None)
        sg = k.alloc("silu_gate", "sbuf", "float32", [P, T])
        k.op("activation", dst=sg, data=gate, act="silu")
        k.op("tensor_tensor", dst=acc(hT, sl(0, P), "f"), data1=sg, data2=up, alu0="multiply")

    # out [128 t, D] = h[t-block, :] @ W_down, K-tiled over F.
    with k.loop("t", 0, nt, "affine"):
        po = k.alloc("out_ps", "psum", "float32", [P, D], bufs=2)
        for f in range(nf):
            k.op("nc_matmul", dst=acc(po, sl(0, P), sl(0, D)), stationary=acc(hT, sl(0, P), f, sl(aff(P, "t"), P)),
                 moving=acc(wd, sl(0, P), f), flags=["accumulate"] if f else None)
        o_t = k.alloc("out_t", "sbuf", "bfloat16", [P, D])
        k.op("tensor_copy", engine="vector", dst=o_t, src=acc(po, sl(0, P), sl(0, D)))
        k.op("dma_copy", dst=acc("out", sl(aff(P, "t"), P)), src=o_t)
    return k


# --------------------------------------------------------------------------------------------------
# Flash attention forward (single head, causal), 128x128 blocks, online softmax
# --------------------------------------------------------------------------------------------------


def flash_attention(S=FA_S, d=FA_D, scale=FA_SCALE):
    """out = softmax(scale * Q K^T, causal) V for Q, K, V [S, d] bf16.

    The causal block grid (q block i, kv block j <= i) is walked by diagonals: distance 0 (the
    diagonal blocks, masked with affine_select; they also load and transpose Q, K and V and
    initialise the running state), then distance 1, 2, ... below it. Each distance is one affine
    loop over kv block j (q block i = j + dist): loop bounds are constants, so a triangular block
    range is expressed this way without unrolling. The online-softmax state of every q block
    (running max m, running sum l, unnormalised output o) stays in SBUF, indexed by the q block.

    PSUM is allocated in whole 2 KiB banks (8 per partition), so each loop body uses one fp32 bank
    [128, 512] for all its TensorE results: transposes (bf16 -> fp32, exact), scores and P V.
    """
    assert S % P == 0 and d == P
    nb = S // P
    k = Kernel("flash_attention", "flash_attention")
    k.hbm("q", "input", "bfloat16", [S, d])
    k.hbm("k", "input", "bfloat16", [S, d])
    k.hbm("v", "input", "bfloat16", [S, d])
    k.hbm("out", "output", "bfloat16", [S, d])

    qT = k.alloc("qT", "sbuf", "bfloat16", [d, S])            # Q^T: d on partitions
    kT = k.alloc("kT", "sbuf", "bfloat16", [d, S])            # K^T
    v_sb = k.alloc("v_sb", "sbuf", "bfloat16", [P, nb, d])    # V rows 128*j + p
    m = k.alloc("m_run", "sbuf", "float32", [P, nb])          # running max of raw scores, per q block
    l = k.alloc("l_run", "sbuf", "float32", [P, nb])          # running sum of exp
    o_acc = k.alloc("o_acc", "sbuf", "float32", [P, nb, d])  # unnormalised output

    def m_of(i):
        return acc(m, sl(0, P), i)

    def l_of(i):
        return acc(l, sl(0, P), i)

    def o_of(i):
        return acc(o_acc, sl(0, P), i, sl(0, d))

    def cols(t, c):  # 128 columns of a [128, 512] PSUM bank, slot c
        return acc(t, sl(0, P), sl(c * P, P))

    # --- distance 0: diagonal blocks (i = j) --------------------------------------------------------
    with k.loop("j", 0, nb, "affine"):
        i = "j"
        q_t = k.alloc("q_t", "sbuf", "bfloat16", [P, d])
        k_t = k.alloc("k_t", "sbuf", "bfloat16", [P, d])
        k.op("dma_copy", dst=q_t, src=acc("q", sl(aff(P, "j"), P)), dma_queue=0)
        k.op("dma_copy", dst=k_t, src=acc("k", sl(aff(P, "j"), P)), dma_queue=1)
        k.op("dma_copy", dst=acc(v_sb, sl(0, P), "j"), src=acc("v", sl(aff(P, "j"), P)), dma_queue=2)
        ps = k.alloc("ps_diag", "psum", "float32", [P, 512], bufs=2)  # Q^T | K^T | S | P^T, then P V in slot 0
        k.op("nc_transpose", engine="tensor", dst=cols(ps, 0), data=q_t)
        k.op("tensor_copy", engine="vector", dst=acc(qT, sl(0, P), sl(aff(P, "j"), P)), src=cols(ps, 0))
        k.op("nc_transpose", engine="tensor", dst=cols(ps, 1), data=k_t)
        k.op("tensor_copy", engine="vector", dst=acc(kT, sl(0, P), sl(aff(P, "j"), P)), src=cols(ps, 1))
        # scores S = Q_i K_j^T [q, k] (stationary Q_i^T [d, q], moving K_j^T [d, k])
        k.op("nc_matmul", dst=cols(ps, 2), stationary=acc(qT, sl(0, P), sl(aff(P, i), P)),
             moving=acc(kT, sl(0, P), sl(aff(P, "j"), P)))
        s_t = k.alloc("s_diag", "sbuf", "float32", [P, P])
        k.op("tensor_copy", engine="vector", dst=s_t, src=cols(ps, 2))
        # causal mask: keep where q - k = p - col >= 0, else FA_MASK_VALUE
        s_m = k.alloc("s_masked", "sbuf", "float32", [P, P])
        k.op("affine_select", dst=s_m, on_true=s_t, alu0="greater_equal", iimm=[0, 1, -1, P, 0, 1, 0, 1, 0, 1],
             imm=[FA_MASK_VALUE, 0.0, 1.0, 0.0])
        # first block of every q row: m = rowmax, p = exp(scale * (s - m)), l = rowsum(p)
        k.op("tensor_reduce", dst=m_of(i), data=s_m, alu0="maximum", axis_count=0)
        nbias = k.alloc("nbias_diag", "sbuf", "float32", [P, 1])
        k.op("tensor_scalar", dst=nbias, data=m_of(i), alu0="multiply", flags=["has_imm0"],
             imm=[-scale, 0.0, 1.0, 0.0])
        p_t = k.alloc("p_diag", "sbuf", "bfloat16", [P, P])
        k.op("activation", dst=p_t, data=s_m, bias=nbias, reduce_res=l_of(i), act="exp", alu1="add",
             reduce_cmd="reset_reduce", imm=[0.0, 0.0, scale, 0.0])
        # P^T [k, q]: the contraction of P V runs over k on the partitions; o = P V
        k.op("nc_transpose", engine="tensor", dst=cols(ps, 3), data=p_t)
        pT = k.alloc("pT_diag", "sbuf", "bfloat16", [P, P])
        k.op("tensor_copy", engine="vector", dst=pT, src=cols(ps, 3))
        k.op("nc_matmul", dst=cols(ps, 0), stationary=pT, moving=acc(v_sb, sl(0, P), "j"))
        k.op("tensor_copy", engine="vector", dst=o_of(i), src=cols(ps, 0))

    # --- distance dist >= 1: blocks (i, j) = (j + dist, j), no mask ----------------------------------
    for dist in range(1, nb):
        sfx = "_d{}".format(dist)
        i = aff(1, "j", dist)
        with k.loop("j", 0, nb - dist, "affine"):
            ps = k.alloc("ps" + sfx, "psum", "float32", [P, 512], bufs=2 if nb - dist > 1 else 1)  # S | P^T | P V
            k.op("nc_matmul", dst=cols(ps, 0), stationary=acc(qT, sl(0, P), sl(aff(P, "j", P * dist), P)),
                 moving=acc(kT, sl(0, P), sl(aff(P, "j"), P)))
            s_ps = cols(ps, 0)
            # m_new = max(m, rowmax(S)); alpha = exp(scale * (m - m_new)); bias = -scale * m_new
            bmax = k.alloc("bmax" + sfx, "sbuf", "float32", [P, 1])
            k.op("tensor_reduce", dst=bmax, data=s_ps, alu0="maximum", axis_count=0)
            m_new = k.alloc("m_new" + sfx, "sbuf", "float32", [P, 1])
            k.op("tensor_tensor", dst=m_new, data1=m_of(i), data2=bmax, alu0="maximum")
            nbias = k.alloc("nbias" + sfx, "sbuf", "float32", [P, 1])
            k.op("tensor_scalar", dst=nbias, data=m_new, alu0="multiply", flags=["has_imm0"],
                 imm=[-scale, 0.0, 1.0, 0.0])
            alpha = k.alloc("alpha" + sfx, "sbuf", "float32", [P, 1])
            k.op("activation", dst=alpha, data=m_of(i), bias=nbias, act="exp", imm=[0.0, 0.0, scale, 0.0])
            k.op("tensor_copy", engine="vector", dst=m_of(i), src=m_new)
            # p = exp(scale * S - scale * m_new), rowsum into bsum; l = l * alpha + bsum
            p_t = k.alloc("p" + sfx, "sbuf", "bfloat16", [P, P])
            bsum = k.alloc("bsum" + sfx, "sbuf", "float32", [P, 1])
            k.op("activation", dst=p_t, data=s_ps, bias=nbias, reduce_res=bsum, act="exp", alu1="add",
                 reduce_cmd="reset_reduce", imm=[0.0, 0.0, scale, 0.0])
            k.op("scalar_tensor_tensor", dst=l_of(i), data=l_of(i), operand0=alpha, operand1=bsum,
                 alu0="multiply", alu1="add")
            # o = o * alpha + P V
            k.op("nc_transpose", engine="tensor", dst=cols(ps, 1), data=p_t)
            pT = k.alloc("pT" + sfx, "sbuf", "bfloat16", [P, P])
            k.op("tensor_copy", engine="vector", dst=pT, src=cols(ps, 1))
            k.op("nc_matmul", dst=cols(ps, 2), stationary=pT, moving=acc(v_sb, sl(0, P), "j"))
            k.op("scalar_tensor_tensor", dst=o_of(i), data=o_of(i), operand0=alpha, operand1=cols(ps, 2),
                 alu0="multiply", alu1="add")

    # --- out = o / l ------------------------------------------------------------------------------------
    with k.loop("i", 0, nb, "affine"):
        rl = k.alloc("inv_l", "sbuf", "float32", [P, 1])
        k.op("reciprocal", dst=rl, data=l_of("i"))
        o_t = k.alloc("out_t", "sbuf", "bfloat16", [P, d])
        k.op("tensor_scalar", dst=o_t, data=o_of("i"), operand0=rl, alu0="multiply")
        k.op("dma_copy", dst=acc("out", sl(aff(P, "i"), P)), src=o_t)
    return k


# --------------------------------------------------------------------------------------------------


def all_examples():
    """(file name, kernel builder) for every example, in a fixed order."""
    ex = [(softmax_name(s) + ".json", (lambda s=s: softmax(s))) for s in SOFTMAX_SHAPES]
    ex.append(("swiglu.json", swiglu))
    ex.append(("flash_attention.json", flash_attention))
    return ex


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)), help="output directory")
    ap.add_argument("--list", action="store_true", help="print names and instruction counts, write nothing")
    args = ap.parse_args(argv)
    if not args.list:
        os.makedirs(args.out, exist_ok=True)
    for fname, build in all_examples():
        kj = build().to_json()
        if not args.list:
            with open(os.path.join(args.out, fname), "w", encoding="utf-8", newline="\n") as f:
                f.write(dumps(kj))
        print("{:28s} {:24s} {:6d} instructions".format(fname, kj["name"], instruction_count(kj)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
