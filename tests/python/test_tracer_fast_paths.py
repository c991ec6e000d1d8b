"""The tracer's fast paths give what its general code gives (issue 12, tracing speed; docs/performance.md).

``NkiTensor._plain_view`` takes the common subscripts (ints, loop indices, int slices without a step, ``nl.ds``)
without ``__getitem__``'s general scans, and ``tracer.env_get`` reads an environment variable without
``os.environ.get``'s per-call encoding: each is checked against the general path on the same input, views on random
subscripts (errors included) and whole kernels traced both ways (public ones, with loops kept and pieces written
out), so a kernel's IR does not depend on which path ran."""
import json
import os
import random

import numpy as np
import pytest

from conftest import beta1_sample, require_core

_core, ml_dtypes = require_core()

from nsim import kernels as K  # noqa: E402
from nsim import nki, tracer  # noqa: E402
import nsim.nki.isa as nisa  # noqa: E402
import nsim.nki.language as nl  # noqa: E402



@pytest.fixture
def general_views(monkeypatch):
    """Views made by __getitem__'s general code alone."""
    def use(on):
        if on:
            monkeypatch.setattr(tracer.NkiTensor, "_plain_view", lambda self, key: None)
        else:
            monkeypatch.undo()
    return use


def _key(rng, shape, loop_index=None):
    """A random subscript of a view of ``shape``: per dim an int, a slice (bounds or none, in range or out of it), an
    nl.ds or the loop index; sometimes fewer items than dims, sometimes one too many."""
    items = []
    n = rng.choice((len(shape), len(shape), max(1, len(shape) - 1), len(shape) + 1))
    for d in range(n):
        size = shape[d] if d < len(shape) else 4
        kind = rng.randrange(7)
        a = rng.randrange(-1, size + 1)
        b = rng.randrange(-1, size + 2)
        if kind == 0:
            items.append(a)
        elif kind == 1:
            items.append(slice(a, b))
        elif kind == 2:
            items.append(slice(None, b) if rng.random() < 0.5 else slice(a, None))
        elif kind == 3:
            items.append(slice(None))
        elif kind == 4:
            items.append(nl.ds(max(a, 0), max(1, b - a)))
        elif kind == 5 and loop_index is not None:
            items.append(loop_index * rng.choice((1, 2)) + rng.randrange(0, 3))
        else:
            items.append(nl.ds(loop_index, rng.choice((1, 2))) if loop_index is not None else a)
    return tuple(items)


def _view_or_error(t, key):
    try:
        v = t[key]
    except tracer.NsimError as e:
        return ("error", type(e).__name__, str(e))
    except tracer._NeedsConcrete as e:  # (a loop index out of range in some iteration: the loop is unrolled)
        return ("needs", e.why)
    return ("view", repr(v._dims), tuple(v.shape), v._regw)


def test_plain_views_equal_general_views(general_views):
    """On 3,000 random subscripts of HBM tensors and SBUF tiles, in the kernel body and with a loop index in a kept
    loop, the fast path's view (or the general code's error) is the general code's."""
    got = {True: [], False: []}
    for general in (False, True):
        general_views(general)
        rng = random.Random(7)

        @nki.jit
        def probe(x):
            out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
            t = nl.ndarray((128, 6, 16), nl.float32, buffer=nl.sbuf)
            seen = got[general]
            for _ in range(1000):
                seen.append(_view_or_error(x, _key(rng, x.shape)))
                seen.append(_view_or_error(t, _key(rng, t.shape)))
            for i in nl.affine_range(4):
                for _ in range(250):
                    seen.append(_view_or_error(x, _key(rng, x.shape, i)))
                    seen.append(_view_or_error(t, _key(rng, t.shape, i)))
                s = nl.ndarray((128, 16), nl.float32, buffer=nl.sbuf)
                nisa.dma_copy(dst=s, src=x[i, 0:128, :])
                nisa.dma_copy(dst=out[i, 0:128, :], src=s)
            return out

        probe.options(timing_only=True).trace(np.zeros((4, 128, 16), np.float32))
    general_views(False)
    assert len(got[False]) == 3000
    kinds = {g[0] for g in got[False]}
    assert kinds == {"view", "error", "needs"}  # every outcome was exercised
    assert got[False] == got[True]


def _kernel_ir(fn, *args, **kw):
    tracer._LOOP_PLANS.clear()  # (each trace finds its loop decisions itself, not from the other's)
    return json.dumps(fn(*args, **kw).kernel, sort_keys=True, default=repr)


@pytest.mark.parametrize("case", ["library_flash_gqa", "library_matmul", "nki_samples_flash_fwd"])
def test_kernels_trace_the_same_ir_with_and_without_the_fast_paths(case, general_views):
    """Whole kernels: the library's causal GQA flash attention (loops kept, a q loop run concretely), its blocked
    matmul, and the public nki-samples flash_fwd (Beta 1 views, loops split into pieces written out): the IR traced
    with the fast paths is the IR the general code traces."""
    bf16 = ml_dtypes.bfloat16
    if case == "library_flash_gqa":
        q, k = np.zeros((4, 512, 64), bf16), np.zeros((2, 512, 64), bf16)
        run = lambda: _kernel_ir(K.flash_attention_gqa.options(timing_only=True).trace, q, k, k, True)  # noqa: E731
    elif case == "library_matmul":
        a, b = K.matmul_inputs(0, 256, 384, 640)
        run = lambda: _kernel_ir(K.matmul_blocked.options(timing_only=True).trace, a, b)  # noqa: E731
    else:
        s = 2048
        q, k, v = (np.zeros((1, 4, 128, s), bf16), np.zeros((1, 2, 128, s), bf16), np.zeros((1, 2, s, 128), bf16))
        with beta1_sample("nki_samples_attention.py") as (sample, *_):
            kern = sample.flash_fwd.options(timing_only=True)[1, 2]
            fast = _kernel_ir(kern.trace, q, k, v, None)
            general_views(True)
            general = _kernel_ir(kern.trace, q, k, v, None)
            general_views(False)
        assert fast == general
        return
    fast = run()
    general_views(True)
    general = run()
    general_views(False)
    assert fast == general


def test_env_get_reads_the_live_environment(monkeypatch):
    """env_get gives os.environ.get's value: unset, set, changed and deleted again (monkeypatch writes through
    os.environ, as a kernel's caller does)."""
    name = "NSIM_TEST_ENV_GET_PROBE"
    monkeypatch.delenv(name, raising=False)
    assert tracer.env_get(name) is None
    monkeypatch.setenv(name, "gen3")
    assert tracer.env_get(name) == "gen3" == os.environ.get(name)
    os.environ[name] = "trn2 \u00e9"
    assert tracer.env_get(name) == os.environ.get(name) == "trn2 \u00e9"
    monkeypatch.delenv(name)
    assert tracer.env_get(name) is None
