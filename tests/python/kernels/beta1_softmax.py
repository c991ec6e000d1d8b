"""Beta-1 NKI kernels (``neuronxcc.nki``): exp and row softmax, in the nl value style and in the nisa
value-returning style. No nsim imports."""
import numpy as np

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl


@nki.jit
def exp_kernel(in_tensor):
    out_tensor = nl.ndarray(in_tensor.shape, dtype=in_tensor.dtype, buffer=nl.shared_hbm)
    n, f = in_tensor.shape
    i_p = nl.arange(128)[:, None]
    i_f = nl.arange(f)[None, :]
    for i in nl.affine_range(n // 128):
        t = nl.load(in_tensor[i * 128 + i_p, i_f])
        e = nisa.activation(op=nl.exp, data=t)
        nl.store(out_tensor[i * 128 + i_p, i_f], value=e)
    return out_tensor


@nki.jit
def softmax_nl_kernel(in_tensor):
    """Row softmax with nl value functions and tile operators."""
    out_tensor = nl.ndarray(in_tensor.shape, dtype=in_tensor.dtype, buffer=nl.shared_hbm)
    n, f = in_tensor.shape
    i_p = nl.arange(128)[:, None]
    i_f = nl.arange(f)[None, :]
    for i in nl.affine_range(n // 128):
        x = nl.load(in_tensor[i * 128 + i_p, i_f], dtype=nl.float32)
        row_max = nl.max(x, axis=[1], keepdims=True)
        e = nl.exp(x - row_max)
        row_sum = nl.sum(e, axis=1, keepdims=True)
        y = e / row_sum
        nl.store(out_tensor[i * 128 + i_p, i_f], value=y)
    return out_tensor


@nki.jit
def softmax_isa_kernel(in_tensor, out_tensor):
    """Row softmax with value-returning nisa instructions; writes out_tensor."""
    n, f = in_tensor.shape
    for i in nl.affine_range(n // 128):
        x = nl.load(in_tensor[i * 128:(i + 1) * 128, :])
        neg_max = nisa.tensor_reduce(op=nl.max, data=x, axis=(1,), negate=True, keepdims=True,
                                     dtype=nl.float32)
        sums = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)
        e = nisa.activation(op=nl.exp, data=x, bias=neg_max, reduce_op=nl.add, reduce_res=sums,
                            reduce_cmd=nisa.reduce_cmd.reset_reduce, dtype=nl.float32)
        inv = nisa.reciprocal(sums)
        y = nisa.tensor_scalar(e, np.multiply, inv, dtype=in_tensor.dtype)
        nl.store(out_tensor[i * 128:(i + 1) * 128, :], value=y)


def reference_exp(x):
    return np.exp(x.astype(np.float32)).astype(x.dtype)


def reference_softmax(x):
    x32 = x.astype(np.float32)
    e = np.exp(x32 - x32.max(axis=1, keepdims=True))
    return (e / e.sum(axis=1, keepdims=True)).astype(x.dtype)


if __name__ == "__main__":
    x = np.random.randn(256, 512).astype(np.float32)
    assert np.allclose(softmax_nl_kernel(x), reference_softmax(x), atol=1e-5)
    print("OK")
