"""Checking a kernel against a reference: the loop a kernel author runs while debugging.

    from nsim.testing import assert_kernel_matches
    assert_kernel_matches(my_kernel, my_numpy_ref, x, w, rtol=1e-2, atol=1e-2, config="trn2")

On a mismatch the AssertionError says which output, the max abs/rel error, the first mismatching
index, how many elements differ, and where NaN/Inf first appeared.
"""
from __future__ import annotations

import numpy as np

__all__ = ["assert_kernel_matches", "compare_arrays"]


def _as_f64(a):
    a = np.asarray(a)
    try:
        return a.astype(np.float64)
    except (TypeError, ValueError):  # ml_dtypes arrays convert through float32
        return a.astype(np.float32).astype(np.float64)


def compare_arrays(name, got, want, rtol, atol):
    """'' when got matches want within tolerance, else a readable report."""
    g, w = _as_f64(got), _as_f64(want)
    if g.shape != w.shape:
        return "output {}: shape {} differs from the reference's {}".format(name, g.shape, w.shape)
    lines = []
    bad_g, bad_w = ~np.isfinite(g), ~np.isfinite(w)
    if np.any(bad_g & ~bad_w):
        first = tuple(int(i) for i in np.argwhere(bad_g & ~bad_w)[0])
        lines.append("NaN/Inf first appears at index {} (value {}, reference {})".format(first, g[first], w[first]))
    err = np.abs(g - w)
    err = np.where(bad_g | bad_w, np.where((g == w) | (np.isnan(g) & np.isnan(w)), 0.0, np.inf), err)
    mismatch = err > atol + rtol * np.abs(np.where(bad_w, 0.0, w))
    n = int(mismatch.sum())
    if n == 0 and not lines:
        return ""
    if n:
        first = tuple(int(i) for i in np.argwhere(mismatch)[0])
        rel = err / np.maximum(np.abs(w), np.finfo(np.float64).tiny)
        lines.insert(0, "output {}: {} of {} elements differ (rtol={}, atol={})".format(name, n, g.size, rtol, atol))
        lines.append("max abs error {:.6g}, max rel error {:.6g}".format(float(np.max(np.where(np.isfinite(err), err, 0))),
                                                                      float(np.max(np.where(np.isfinite(rel), rel, 0)))))
        lines.append("first mismatch at index {}: got {}, expected {}".format(first, g[first], w[first]))
    else:
        lines.insert(0, "output {}:".format(name))
    return "\n  ".join(lines)


def assert_kernel_matches(kernel, reference_fn, *inputs, rtol=1e-5, atol=1e-5, config="trn2", **kwargs):
    """Run `kernel(*inputs, **kwargs)` on nsim (preset `config`) and `reference_fn(*inputs)`, compare every
    output. `kwargs` are the kernel's keyword arguments.

    Works with nsim.nki kernels (jit objects) and plain callables returning arrays. Returns the
    kernel's outputs. Raises AssertionError with a diagnostic on any mismatch.
    """
    copies = [np.array(x, copy=True) if isinstance(x, np.ndarray) else x for x in inputs]
    if hasattr(kernel, "options") and hasattr(kernel, "simulate"):  # an nsim kernel: kwargs are the kernel's
        got, _profile = kernel.options(config=config).simulate(*inputs, **kwargs)
    else:
        got = kernel(*inputs, **kwargs)
    want = reference_fn(*copies)
    got_t = got if isinstance(got, (tuple, list)) else (got,)
    want_t = want if isinstance(want, (tuple, list)) else (want,)
    if len(got_t) != len(want_t):
        raise AssertionError("kernel returned {} outputs, the reference {}".format(len(got_t), len(want_t)))
    reports = [compare_arrays(i, g, w, rtol, atol) for i, (g, w) in enumerate(zip(got_t, want_t))]
    reports = [r for r in reports if r]
    if reports:
        raise AssertionError("kernel does not match the reference on {}:\n  {}".format(config, "\n  ".join(reports)))
    return got
