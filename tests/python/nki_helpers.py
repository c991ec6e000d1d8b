"""Helpers of the NKI (new dialect) conformance tests: move a tensor on chip and back, seeded data, and the
error code of an NsimError."""
import numpy as np

import nsim.nki.isa as nisa
import nsim.nki.language as nl


def rng(seed=0):
    return np.random.default_rng(seed)


def load(src, dtype=None):
    """An SBUF tile holding the HBM tensor `src` (as `dtype` when given)."""
    t = nl.ndarray(src.shape, dtype or src.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=src)
    return t


def store(t):
    """A new shared-HBM tensor holding the tile `t` (a kernel's output)."""
    out = nl.ndarray(t.shape, t.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)
    return out


def code_of(e):
    """The NSIM-Exxx code that starts an NsimError's message."""
    return str(e).split(":", 1)[0]
