"""Errors inside a kernel show the user's traceback, not nsim's internals."""
import os
import traceback

import numpy as np
import pytest

nsim = pytest.importorskip("nsim")
if not getattr(nsim, "core_available", False):
    pytest.skip("the _nsim extension is not built", allow_module_level=True)

from nsim import nki  # noqa: E402
import nsim.nki.isa as nisa  # noqa: E402
import nsim.nki.language as nl  # noqa: E402

# nsim's machinery is what lies in the installed package's real directory (not any path containing
# "/nsim/": a checkout is usually named nsim, and this test file lives in it).
NSIM_PKG_DIR = os.path.realpath(os.path.dirname(nsim.__file__))


def is_nsim_file(filename):
    return os.path.realpath(filename).startswith(NSIM_PKG_DIR + os.sep)


def nsim_frames(exc):
    frames = traceback.extract_tb(exc.__traceback__)
    return [f for f in frames if is_nsim_file(f.filename)]


@nki.jit
def buggy(a):
    t = nl.ndarray((128, 64), a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a)
    return {}["missing"]  # a bug in the user's kernel


@nki.jit
def out_of_bounds(a):
    t = nl.ndarray((128, 64), a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a[0:256, :])  # a has 128 rows
    return t


def test_python_exception_in_kernel_shows_user_frames():
    with pytest.raises(KeyError) as e:
        buggy(np.zeros((128, 64), np.float32))
    frames = traceback.extract_tb(e.value.__traceback__)
    assert frames[-1].name == "buggy" and "missing" in frames[-1].line
    assert len(nsim_frames(e.value)) <= 1  # only the entry point's re-raise


def test_nsim_error_points_at_user_line_with_short_traceback():
    with pytest.raises(nsim.NsimError) as e:
        out_of_bounds(np.zeros((128, 64), np.float32))
    assert e.value.code.startswith("NSIM-E")
    assert e.value.file.endswith("test_tracebacks.py")
    assert len(nsim_frames(e.value)) <= 1


def test_this_file_is_not_an_nsim_file():
    assert not is_nsim_file(__file__)
    assert is_nsim_file(nki.__file__)
