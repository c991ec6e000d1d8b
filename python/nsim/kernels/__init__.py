"""nsim.kernels: a small library of NKI kernels (new dialect, @nki.jit) with numpy references.

    from nsim.kernels import softmax, softmax_ref, KERNELS
    y = softmax(x, 0.25)                       # simulate on the kernel's default preset (trn2)
    y, prof = softmax.simulate(x, 0.25, config="trn1")

``KERNELS`` maps a name to ``(kernel, reference, make_inputs)``: ``args = make_inputs(seed)`` is a tuple of
positional arguments (numpy arrays and scalars), ``kernel(*args)`` and ``reference(*args)`` (fp32 numpy)
are to be compared. Shapes of make_inputs are modest (a few 10k simulated instructions at most).
"""
from __future__ import annotations

from .elementwise import tensor_add, tensor_add_ref, tensor_add_inputs
from .norm import (softmax, softmax_ref, softmax_inputs, rmsnorm, rmsnorm_ref, rmsnorm_inputs, layernorm,
                   layernorm_ref, layernorm_inputs)
from .matmul import (matmul_naive, matmul_naive_ref, matmul_blocked, matmul_blocked_ref, matmul_ref,
                     matmul_inputs, transpose, transpose_ref, transpose_inputs)
from .mlp import swiglu, swiglu_ref, swiglu_inputs
from .attention import (flash_attention, flash_attention_ref, flash_attention_inputs, flash_attention_gqa,
                        flash_attention_gqa_ref, flash_attention_gqa_inputs, attention_naive, attention_naive_ref,
                        attention_naive_inputs, attention_ref, flash_attention_mh, flash_attention_lnc2,
                        flash_attention_mh_ref, flash_attention_mh_inputs)

KERNELS = {
    "tensor_add": (tensor_add, tensor_add_ref, tensor_add_inputs),
    "softmax": (softmax, softmax_ref, softmax_inputs),
    "rmsnorm": (rmsnorm, rmsnorm_ref, rmsnorm_inputs),
    "layernorm": (layernorm, layernorm_ref, layernorm_inputs),
    "matmul_naive": (matmul_naive, matmul_naive_ref, matmul_inputs),
    "matmul_blocked": (matmul_blocked, matmul_blocked_ref, matmul_inputs),
    "transpose": (transpose, transpose_ref, transpose_inputs),
    "swiglu": (swiglu, swiglu_ref, swiglu_inputs),
    "flash_attention": (flash_attention, flash_attention_ref, flash_attention_inputs),
    "flash_attention_gqa": (flash_attention_gqa, flash_attention_gqa_ref, flash_attention_gqa_inputs),
    "attention_naive": (attention_naive, attention_naive_ref, attention_naive_inputs),
    "flash_attention_mh": (flash_attention_mh, flash_attention_mh_ref, flash_attention_mh_inputs),
}

__all__ = ["KERNELS"] + sorted({n for k in KERNELS for n in (k, k + "_ref")} | {
    "tensor_add_inputs", "softmax_inputs", "rmsnorm_inputs", "layernorm_inputs", "matmul_inputs", "matmul_ref",
    "transpose_inputs", "swiglu_inputs", "flash_attention_inputs", "flash_attention_gqa_inputs",
    "attention_naive_inputs", "attention_ref", "flash_attention_lnc2", "flash_attention_mh_inputs"})
