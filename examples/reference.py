"""numpy references of the example kernels in examples/ (see gen_examples.py for the kernels).

    reference(name, inputs) -> {output name: float32 array}

`name` is the kernel name ("softmax_2x128x512", "swiglu", "flash_attention", ...); `inputs` maps
the kernel's input tensor names to arrays (bf16 via ml_dtypes, or anything numpy converts to
float32). Inputs are upcast to fp32 and everything is computed in fp32 (accumulation included);
the results are fp32 arrays (not rounded to bf16), compared to the simulator's bf16 outputs with a
bf16 tolerance. Intermediates are rounded to bf16 only where the kernel's definition stores them in
bf16 (the SwiGLU hidden activation).

`make_inputs(name, seed)` gives seeded, well-conditioned bf16 inputs for each example.
"""
from __future__ import annotations

import os
import sys

import ml_dtypes
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_examples as gx  # noqa: E402  (example parameters: shapes, scales)

BF16 = ml_dtypes.bfloat16


def _f32(a):
    return np.asarray(a).astype(np.float32)


def _bf16_round(a):
    """fp32 -> bf16 (RNE) -> fp32."""
    return np.asarray(a, dtype=np.float32).astype(BF16).astype(np.float32)


def softmax_ref(x, scale=gx.SOFTMAX_SCALE):
    z = _f32(x) * np.float32(scale)
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True, dtype=np.float32)


def silu(x):
    return x / (np.float32(1) + np.exp(-x))


def swiglu_ref(x, w_gate, w_up, w_down):
    x, wg, wu, wd = (_f32(a) for a in (x, w_gate, w_up, w_down))
    gate = x @ wg
    up = x @ wu
    # The kernel keeps the hidden activation h = silu(gate) * up in bf16 (it is the bf16 operand of
    # the down projection), so the reference rounds it the same way.
    h = _bf16_round(silu(gate) * up)
    return h @ wd


def flash_attention_ref(q, k, v, scale=gx.FA_SCALE):
    q, k, v = (_f32(a) for a in (q, k, v))
    s = (q @ k.T) * np.float32(scale)
    n = s.shape[0]
    causal = np.tril(np.ones((n, s.shape[1]), dtype=bool))
    s = np.where(causal, s, -np.inf)
    s = s - s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    p = p / p.sum(axis=-1, keepdims=True)
    return p @ v


def _softmax_shape(name):
    for shape in gx.SOFTMAX_SHAPES:
        if gx.softmax_name(shape) == name:
            return shape
    return None


def names():
    """Kernel names of all examples, in gen_examples order."""
    return [gx.softmax_name(s) for s in gx.SOFTMAX_SHAPES] + ["swiglu", "flash_attention"]


def input_shapes(name):
    """{input name: shape} of an example."""
    shape = _softmax_shape(name)
    if shape is not None:
        return {"x": shape}
    if name == "swiglu":
        T, D, F = gx.SWIGLU_T, gx.SWIGLU_D, gx.SWIGLU_F
        return {"x": (T, D), "w_gate": (D, F), "w_up": (D, F), "w_down": (F, D)}
    if name == "flash_attention":
        return {n: (gx.FA_S, gx.FA_D) for n in ("q", "k", "v")}
    raise KeyError("unknown example " + name)


def make_inputs(name, seed=0):
    """Seeded bf16 inputs, scaled so that the outputs are O(0.1..1) and softmax is well-conditioned."""
    rng = np.random.default_rng(seed)
    out = {}
    for n, shape in input_shapes(name).items():
        a = rng.standard_normal(shape, dtype=np.float32)
        if _softmax_shape(name) is not None:
            a *= 4.0  # scale * x ~ N(0, 1): outputs span a few e-folds
        elif name == "swiglu":
            a *= 1.0 if n == "x" else 1.0 / np.sqrt(shape[0])  # unit-variance gate/up, O(0.3) output
        out[n] = a.astype(BF16)
    return out


def reference(name, inputs):
    """Outputs of example `name` for `inputs` ({tensor name: array}): {output name: fp32 array}."""
    if _softmax_shape(name) is not None:
        return {"y": softmax_ref(inputs["x"])}
    if name == "swiglu":
        return {"out": swiglu_ref(inputs["x"], inputs["w_gate"], inputs["w_up"], inputs["w_down"])}
    if name == "flash_attention":
        return {"out": flash_attention_ref(inputs["q"], inputs["k"], inputs["v"])}
    raise KeyError("unknown example " + name)
