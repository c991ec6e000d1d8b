"""Source lines of traced instructions (issues 14 and 15).

nsim's own machinery (files of the nsim package) is skipped when an instruction is attributed to a line,
but the kernel library nsim/kernels is user-level code: its instructions point at its own lines. What is
"internal" is decided by the package's real directory, never by a folder name: a checkout or a user
project named "nsim", paths with spaces and symlinked paths work."""
import importlib.util
import inspect
import os
import re
import traceback

import numpy as np
import pytest

from conftest import require_core  # noqa: E402

_core, ml_dtypes = require_core()

import nsim  # noqa: E402
from nsim import kernels as K  # noqa: E402
from nsim import tracer  # noqa: E402

PKG_DIR = os.path.realpath(os.path.dirname(nsim.__file__))
KERNELS_DIR = os.path.join(PKG_DIR, "kernels")


def _real(path):
    return os.path.realpath(path)


def _in_dir(path, d):
    return _real(path).startswith(d + os.sep)


def _call_lines(fn):
    """Line numbers of the nisa.* calls in fn's source (where its instructions come from)."""
    src, first = inspect.getsourcelines(fn)
    return {first + i for i, text in enumerate(src) if re.search(r"\bnisa\.\w+\(", text)}


# ------------------------------------------------------------------------------------------------
# _is_internal


def test_is_internal_package_machinery():
    import nsim.nki.isa as nisa
    for mod in (tracer, nisa, nsim):
        assert tracer._is_internal(mod.__file__), mod.__name__


def test_is_internal_not_the_kernel_library():
    from nsim.kernels import _common, elementwise
    for mod in (K, _common, elementwise):
        assert not tracer._is_internal(mod.__file__), mod.__name__


def test_is_internal_not_user_files_in_folders_named_nsim(tmp_path):
    for d in (tmp_path / "nsim", tmp_path / "path with space" / "nsim", tmp_path / "nsim" / "python" / "nsim"):
        assert not tracer._is_internal(str(d / "kernel.py"))
    assert not tracer._is_internal(PKG_DIR + "_extra" + os.sep + "x.py")  # a sibling with the same prefix
    assert not tracer._is_internal(os.path.dirname(PKG_DIR) + os.sep + "x.py")
    for name in ("<string>", "<stdin>", "<frozen importlib._bootstrap>", ""):
        assert not tracer._is_internal(name)


def test_is_internal_through_a_symlink(tmp_path):
    link = tmp_path / "linked nsim"
    try:
        os.symlink(PKG_DIR, str(link))
    except OSError:
        pytest.skip("symlinks not supported here")
    assert tracer._is_internal(str(link / "tracer.py"))
    assert not tracer._is_internal(str(link / "kernels" / "norm.py"))


# ------------------------------------------------------------------------------------------------
# Library kernels are attributed to their own lines


def test_library_kernel_lines_point_into_nsim_kernels():
    a, b = K.tensor_add_inputs(seed=1, shape=(256, 64))
    out, prof = K.tensor_add.simulate(a, b)
    np.testing.assert_array_equal(out, a + b)
    lines = prof.lines
    assert lines
    elementwise = _real(inspect.getsourcefile(K.tensor_add.fn))
    assert all(_real(ln["file"]) == elementwise for ln in lines), {ln["src"] for ln in lines}
    assert all(ln["function"] == "tensor_add" for ln in lines)
    # Every line is one of the kernel's instruction calls; the busiest is too.
    assert {ln["line"] for ln in lines} <= _call_lines(K.tensor_add.fn)
    assert lines[0]["line"] in _call_lines(K.tensor_add.fn)


def test_library_softmax_lines_point_into_nsim_kernels():
    args = K.softmax_inputs(seed=2, shape=(1, 128, 64), scale=0.25)
    _, prof = K.softmax.simulate(*args)
    assert prof.lines
    for ln in prof.lines:
        assert _in_dir(ln["file"], KERNELS_DIR), ln["src"]
        assert ln["line"] > 0
    # Statements of the traced IR too.
    kernel = K.softmax.to_json()
    locs = []

    def walk(body):
        for st in body:
            if "loc" in st:
                locs.append(st["loc"])
            for v in st.values():
                if isinstance(v, dict) and "body" in v:
                    walk(v["body"])
                if isinstance(v, dict) and "loc" in v:
                    locs.append(v["loc"])

    walk(kernel["body"])
    assert locs
    assert all(_in_dir(loc["file"], KERNELS_DIR) for loc in locs), {loc["file"] for loc in locs}


def test_library_kernel_error_shows_the_library_line():
    a = np.zeros((100, 64), np.float32)  # rows must be a multiple of 128
    with pytest.raises(AssertionError) as e:
        K.tensor_add(a, a)
    last = traceback.extract_tb(e.value.__traceback__)[-1]
    assert _real(last.filename) == _real(inspect.getsourcefile(K.tensor_add.fn))
    assert last.name == "tensor_add"
    # nsim's own frames are removed; the library's and this test's remain.
    frames = traceback.extract_tb(e.value.__traceback__)
    assert sum(1 for f in frames if tracer._is_internal(f.filename)) <= 1


# ------------------------------------------------------------------------------------------------
# A user's kernel in a folder named "nsim", under a path with a space

USER_KERNEL = '''\
from nsim import nki
import nsim.nki.isa as nisa
import nsim.nki.language as nl


@nki.jit
def add_one(a):
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray((128, 64), a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a)  # line 10
    nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=1.0)  # line 11
    nisa.dma_copy(dst=out, src=t)  # line 12
    return out


@nki.jit
def buggy(a):
    t = nl.ndarray((128, 64), a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a)
    return {}["missing"]  # line 20
'''


@pytest.fixture
def user_module(tmp_path):
    d = tmp_path / "path with space" / "nsim"
    d.mkdir(parents=True)
    path = d / "user_kernel.py"
    path.write_text(USER_KERNEL)
    spec = importlib.util.spec_from_file_location("nsim_issue15_user_kernel", str(path))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod, str(path)


def test_user_kernel_in_folder_named_nsim_is_attributed_to_its_lines(user_module):
    mod, path = user_module
    a = np.zeros((128, 64), np.float32)
    out, prof = mod.add_one.simulate(a)
    np.testing.assert_array_equal(out, a + 1)
    assert {ln["line"] for ln in prof.lines} == {10, 11, 12}
    assert all(_real(ln["file"]) == _real(path) for ln in prof.lines)


def test_user_kernel_in_folder_named_nsim_traceback(user_module):
    mod, path = user_module
    with pytest.raises(KeyError) as e:
        mod.buggy(np.zeros((128, 64), np.float32))
    frames = traceback.extract_tb(e.value.__traceback__)
    assert _real(frames[-1].filename) == _real(path) and frames[-1].lineno == 20
    assert sum(1 for f in frames if tracer._is_internal(f.filename)) <= 1
