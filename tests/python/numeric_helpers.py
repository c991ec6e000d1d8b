"""Numeric helpers shared by the Python tests."""
import numpy as np


def rand(shape, dtype=np.float32, seed=0, lo=-1.0, hi=1.0):
    """Seeded uniform values in [lo, hi), rounded to `dtype` through float32."""
    return np.random.default_rng(seed).uniform(lo, hi, shape).astype(np.float32).astype(dtype)


def close(got, want, dtype=np.float32):
    """fp32 tolerance 1e-5, anything narrower (bf16) 1e-2."""
    tol = 1e-5 if np.dtype(dtype) == np.float32 else 1e-2
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), rtol=tol, atol=tol)


def rounded(x, dtype):
    """``x`` rounded to ``dtype`` (a kernel's store of an intermediate), as float64 for the rest of a reference."""
    return np.asarray(x).astype(dtype).astype(np.float64)


def randn(shape, dtype, seed, scale=1.0):
    """Standard normal values (times ``scale``) of ``shape`` in ``dtype``, from seed ``seed``."""
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(dtype)


def f64(a):
    """``a`` as a float64 array (the precision the numpy references compute in)."""
    return np.asarray(a, np.float64)


def close_to_max(got, want, dtype):
    """max |got - want| relative to max |want| below the dtype's tolerance (fp32 1e-5, narrower 1e-2): for outputs
    that are long sums (attention, recurrences), whose small elements carry the sums' absolute error. Returns it."""
    tol = 1e-5 if np.dtype(dtype) == np.float32 else 1e-2
    got = f64(got)
    assert got.shape == want.shape, (got.shape, want.shape)
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err < tol, err
    return err
