"""An NKI kernel written for the real toolchain (new dialect, ``import nki``), with no nsim imports.

Run unchanged on nsim with ``python -m nsim run tests/python/kernels/nki_add_exp.py``; the __main__
block checks the result against numpy and exits non-zero on a mismatch.
"""
import sys

import numpy as np

import nki
import nki.isa as nisa
import nki.language as nl


@nki.jit
def add_exp_kernel(a, b):
    """out = exp(a + b), tiled by 128 partitions."""
    n, f = a.shape
    out = nl.ndarray((n, f), a.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(n // nl.tile_size.pmax):
        at = nl.ndarray((nl.tile_size.pmax, f), a.dtype, buffer=nl.sbuf)
        bt = nl.ndarray((nl.tile_size.pmax, f), b.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=at, src=a[i * 128:(i + 1) * 128, :])
        nisa.dma_copy(dst=bt, src=b[i * 128:(i + 1) * 128, :])
        st = nl.ndarray((128, f), nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=st, data1=at, data2=bt, op=nl.add)
        et = nl.ndarray((128, f), a.dtype, buffer=nl.sbuf)
        nisa.activation(dst=et, op=nl.exp, data=st)
        nisa.dma_copy(dst=out[i * 128:(i + 1) * 128, :], src=et)
    return out


def reference(a, b):
    return np.exp(a.astype(np.float32) + b.astype(np.float32)).astype(a.dtype)


def make_inputs(seed=0, shape=(256, 64)):
    rng = np.random.default_rng(seed)
    a = rng.uniform(-1, 1, shape).astype(np.float32)
    b = rng.uniform(-1, 1, shape).astype(np.float32)
    return a, b


if __name__ == "__main__":
    a, b = make_inputs()
    expected = reference(a, b)
    ok = True
    for how, got in (("simulate", nki.simulate(add_exp_kernel)(a, b)), ("call", add_exp_kernel(a, b))):
        got = np.asarray(got)
        if got.shape != expected.shape or not np.allclose(got, expected, rtol=1e-3, atol=1e-3):
            print("MISMATCH ({}): max abs err {}".format(
                how, np.max(np.abs(got.astype(np.float64) - expected)) if got.shape == expected.shape else got.shape))
            ok = False
    print("nki_add_exp:", "OK" if ok else "FAILED", "argv={}".format(sys.argv[1:]))
    sys.exit(0 if ok else 1)
