"""The NKI matmul tutorial progression (examples/matmul_tutorial/): tiled -> loads hoisted -> free dimension
blocked -> all dimensions blocked (compiler.md §5).

* numerics of the four kernels of both dialects (new: matmul_tutorial_kernels.py, Beta 1:
  matmul_tutorial_beta1.py) against numpy at a small size;
* at the tutorial's size (lhsT [8192, 4096] x rhs [8192, 8192], bf16), timing only, on trn1 and trn2: every
  step is faster than the one before, the fully blocked kernel is several times faster than the first, and
  no kernel overflows SBUF. This needs the compiler back end (scheduler, liveness-based SBUF allocation): the
  program-order model with one region per tile overflows SBUF on steps 3 and 4 (NSIM-E204).

The kernel files use only ``import nki`` / ``import neuronxcc.nki`` (run through ``nsim.compat``); each is
traced once per size and the traced kernel simulated on each preset.
"""
import importlib.util
import os
import re

import numpy as np
import pytest

from conftest import EXAMPLES_DIR, require_core

_core, ml_dtypes = require_core()

import nsim  # noqa: E402
from nsim import compat  # noqa: E402

TUTORIAL_DIR = os.path.join(EXAMPLES_DIR, "matmul_tutorial")
FILES = {"new": "matmul_tutorial_kernels.py", "beta1": "matmul_tutorial_beta1.py"}
STEP_NAMES = ["tiled", "hoist_load", "block_free_dimension", "fully_optimized"]
#: small size for numerics: K, M, N (multiples of the default blockings of steps 1-3)
SMALL = dict(K=512, M=256, N=1024)
#: blocking factors of step 4 at the small size (its defaults need M >= 2048, N >= 1024, K >= 1024)
SMALL_BLOCKS = dict(TILES_IN_BLOCK_M=2, TILES_IN_BLOCK_N=1, TILES_IN_BLOCK_K=2)
_MODULES = {}


def _module(dialect):
    """The kernel file of ``dialect``, imported with nsim.compat's ``nki`` / ``neuronxcc.nki`` aliases
    (removed again afterwards; the loaded kernels keep working)."""
    if dialect not in _MODULES:
        was = compat.installed()
        compat.install()
        try:
            path = os.path.join(TUTORIAL_DIR, FILES[dialect])
            spec = importlib.util.spec_from_file_location("nsim_example_matmul_tutorial_" + dialect, path)
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
        finally:
            if not was:
                compat.uninstall()
        assert [n for n, _ in mod.STEPS] == STEP_NAMES
        _MODULES[dialect] = mod
    return _MODULES[dialect]


def _simulate(kernel, args, config, timing_only=False, **kernel_kwargs):
    """(return value, Profile) on ``config``; kernel.options() where the kernel API has it."""
    if hasattr(kernel, "options"):
        return kernel.options(config=config, timing_only=timing_only).simulate(*args, **kernel_kwargs)
    return kernel.simulate(*args, config=config, timing_only=timing_only, **kernel_kwargs)


@pytest.mark.parametrize("config", ["trn1", "trn2"])
@pytest.mark.parametrize("dialect", sorted(FILES))
@pytest.mark.parametrize("step", STEP_NAMES)
def test_numerics_small(step, dialect, config):
    mod = _module(dialect)
    kernel = dict(mod.STEPS)[step]
    lhsT, rhs = mod.make_inputs(seed=3, **SMALL)
    kw = SMALL_BLOCKS if step == "fully_optimized" else {}
    out, prof = _simulate(kernel, (lhsT, rhs), config, **kw)
    assert prof.total_time_ns > 0
    ref = mod.reference(lhsT, rhs)
    out = np.asarray(out)
    assert out.shape == ref.shape == (SMALL["M"], SMALL["N"]) and out.dtype == lhsT.dtype
    out = out.astype(np.float32)
    assert np.all(np.isfinite(out))
    np.testing.assert_allclose(out, ref, rtol=2e-2, atol=2e-2 * float(np.max(np.abs(ref))))


def test_step4_default_blocking_needs_tutorial_multiples():
    mod = _module("new")
    lhsT, rhs = mod.make_inputs(seed=4, **SMALL)
    with pytest.raises(AssertionError):
        mod.nki_matmul_fully_optimized_.to_json(lhsT, rhs)  # BLOCK_M = 2048 > M = 256


# --------------------------------------------------------------------------------------------------
# the tutorial's size: timing only
# --------------------------------------------------------------------------------------------------

_FULL = {}


def _full_size_kernels():
    """{step: kernel.json dict} of the new-dialect kernels traced once at the tutorial's size."""
    if not _FULL:
        mod = _module("new")
        k, m, n = mod.TUTORIAL_SIZE
        assert (k, m, n) == (8192, 4096, 8192)
        lhsT = np.zeros((k, m), ml_dtypes.bfloat16)
        rhs = np.zeros((k, n), ml_dtypes.bfloat16)
        for name, kernel in mod.STEPS:
            _FULL[name] = kernel.to_json(lhsT, rhs)
    return _FULL


def _sbuf_capacity(config):
    """sbuf.bytes_per_partition of the preset, in bytes."""
    text = nsim.effective_config(config, None)
    m = re.search(r"^sbuf:\n(?:[ \t]+.*\n)*?[ \t]+bytes_per_partition:\s*(\d+)\s*(KiB|B)?\s*$", text, re.M)
    assert m, "sbuf.bytes_per_partition not in the effective config of " + config
    return int(m.group(1)) * (1024 if m.group(2) == "KiB" else 1)


@pytest.mark.parametrize("config", ["trn1", "trn2"])
def test_tutorial_progression_full_size(config):
    kernels = _full_size_kernels()
    capacity = _sbuf_capacity(config)
    times, errors = {}, []
    for name in STEP_NAMES:
        try:
            _, prof = nsim.simulate_json(kernels[name], config=config, timing_only=True)
        except nsim.NsimError as e:
            errors.append("{}: {}".format(name, e))
            continue
        peak = prof.stat("memory.sbuf_peak_bytes_per_partition")
        if peak > capacity:
            errors.append("{}: SBUF peak {} B per partition > {} B".format(name, peak, capacity))
        times[name] = prof.total_time_ns
    summary = ", ".join("{} {:.2f} ms".format(n, t / 1e6) for n, t in times.items())
    assert not errors, "{}: {} (times: {})".format(config, "; ".join(errors), summary)
    for prev, cur in zip(STEP_NAMES, STEP_NAMES[1:]):
        assert times[cur] < times[prev], "{}: {} is not faster than {} ({})".format(config, cur, prev, summary)
    speedup = times["tiled"] / times["fully_optimized"]
    assert speedup >= 2.0, "{}: fully blocked only {:.2f}x faster than tiled ({})".format(config, speedup, summary)
