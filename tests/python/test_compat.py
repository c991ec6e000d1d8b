"""nsim.compat (``import nki`` -> nsim), ``python -m nsim run`` and the ``nki_cpu_simulator`` package."""
import builtins
import importlib
import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest

import nsim

if not nsim.core_available:
    pytest.skip("nsim._nsim extension not built", allow_module_level=True)

from nsim import compat  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
KERNELS = os.path.join(HERE, "kernels")
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
KERNEL_FILE = os.path.join(KERNELS, "nki_add_exp.py")

_PREFIXES = ("nki", "neuronxcc")
_AT_IMPORT = {n for n in sys.modules if n.split(".", 1)[0] in _PREFIXES}


def _nki_entries():
    return {n: m for n, m in sys.modules.items() if n.split(".", 1)[0] in _PREFIXES}


@pytest.fixture
def clean_modules():
    """Snapshot nki/neuronxcc sys.modules entries (and builtins.builtin); restore them afterwards."""
    before = _nki_entries()
    had_builtin = hasattr(builtins, "builtin")
    old_builtin = getattr(builtins, "builtin", None)
    loaded = []
    yield loaded
    compat.uninstall()
    for name in loaded:
        sys.modules.pop(name, None)
    for name in list(_nki_entries()):
        if name not in before:
            del sys.modules[name]
    sys.modules.update(before)
    if had_builtin:
        builtins.builtin = old_builtin
    elif hasattr(builtins, "builtin"):
        del builtins.builtin


def _load_kernel_module(loaded, name="nsim_test_kernels_nki_add_exp"):
    spec = importlib.util.spec_from_file_location(name, KERNEL_FILE)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    loaded.append(name)
    spec.loader.exec_module(mod)
    return mod


def _env():
    env = dict(os.environ)
    paths = [os.path.join(REPO, "python"), os.path.join(REPO, "build", "python")]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


# --------------------------------------------------------------------------------------------------
# (a) import nki after nsim.compat.install()
# --------------------------------------------------------------------------------------------------


def test_install_aliases(clean_modules):
    compat.install()
    compat.install()  # idempotent
    assert compat.installed()
    import nki
    import nki.compiler as ncc
    import nki.isa as nisa
    import nki.isa.constants as consts
    import nki.language as nl
    import nki.typing as nt
    import nki.tensor
    import nki.dtype
    import nsim.nki.isa
    import nsim.nki.language

    assert nl.add is nsim.nki.language.add
    assert nisa.dma_copy is nsim.nki.isa.dma_copy
    assert consts.engine is nsim.nki.isa.engine and nki.isa.constants.reduce_cmd is nisa.reduce_cmd
    assert nki.dtype.bfloat16 is nl.bfloat16 and nki.dtype.float32 is np.float32
    assert nki.tensor.NkiTensor is nsim.tracer.NkiTensor
    assert nki.jit is nsim.nki.jit
    assert nt.tensor[128, 64] is not None
    from nki.isa.constants import dge_mode  # noqa: F401
    ns = {}
    exec("from nki.language import *", ns)
    assert ns["affine_range"] is nl.affine_range and "ndarray" in ns

    # compiler directives are no-ops
    def f(x):
        return x

    assert ncc.skip_middle_end_transformations(f) is f
    assert ncc.enable_stack_allocator()(f) is f
    assert ncc.force_auto_alloc(f) is f
    with ncc.no_reorder(), ncc.allocation_scope(), ncc.multi_buffer(2):
        pass
    assert ncc.sbuf.alloc(lambda *a: 0) == "sbuf" and ncc.psum.mod_alloc(base_bank=0) == "psum"

    # Beta-1 names resolve to nsim's Beta-1 dialect modules
    import nsim.nki.beta1 as B1
    import neuronxcc.nki as bnki
    import neuronxcc.nki.isa as bnisa
    import neuronxcc.nki.language as bnl
    from neuronxcc.nki import typing as bnt  # noqa: F401
    import neuronxcc.nki.compiler as bncc

    assert bnki is B1 and bnl is B1.language and bnisa is B1.isa and bncc is B1.compiler


def test_kernel_file_after_install(clean_modules):
    compat.install()
    mod = _load_kernel_module(clean_modules)
    import nki

    a, b = mod.make_inputs(seed=1)
    expected = mod.reference(a, b)
    out1 = nki.simulate(mod.add_exp_kernel)(a, b)
    out2 = mod.add_exp_kernel(a, b)
    out3 = nki.simulate(mod.add_exp_kernel)[1](a=a, b=b)
    for out in (out1, out2, out3):
        assert isinstance(out, np.ndarray) and out.shape == a.shape and out.dtype == np.float32
        np.testing.assert_allclose(out, expected, rtol=1e-3, atol=1e-3)


def test_compiler_decorated_kernel(clean_modules):
    compat.install()
    import nki
    import nki.compiler
    import nki.isa as nisa
    import nki.language as nl

    @nki.compiler.skip_middle_end_transformations
    @nki.jit
    def copy_kernel(x):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
        with nki.compiler.no_reorder():
            nisa.dma_copy(dst=t, src=x)
            nisa.dma_copy(dst=out, src=t)
        return out

    x = np.arange(128 * 8, dtype=np.float32).reshape(128, 8)
    np.testing.assert_array_equal(copy_kernel(x), x)


# --------------------------------------------------------------------------------------------------
# (b) python -m nsim run
# --------------------------------------------------------------------------------------------------


def test_python_m_nsim_run():
    r = subprocess.run([sys.executable, "-m", "nsim", "run", KERNEL_FILE, "extra-arg"], env=_env(), cwd=REPO,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "nki_add_exp: OK" in r.stdout and "extra-arg" in r.stdout


def test_python_m_nsim_run_exit_code(tmp_path):
    script = tmp_path / "bad.py"
    script.write_text("import nki, nki.language as nl\nimport sys\nsys.exit(3 if nl.sbuf == 'sbuf' else 0)\n")
    r = subprocess.run([sys.executable, "-m", "nsim", "run", str(script)], env=_env(), cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 3, r.stdout + r.stderr


def test_python_m_nsim_help():
    r = subprocess.run([sys.executable, "-m", "nsim", "--help"], env=_env(), capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and "run SCRIPT.py" in r.stdout
    r = subprocess.run([sys.executable, "-m", "nsim", "bogus"], env=_env(), capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2


# --------------------------------------------------------------------------------------------------
# (c) nki-library-style harness on nki_cpu_simulator
# --------------------------------------------------------------------------------------------------


def test_nki_library_harness(clean_modules, monkeypatch):
    import nki_cpu_simulator.nki
    import nki_cpu_simulator.nki.builtin
    import nki_cpu_simulator.nki.compiler
    import nki_cpu_simulator.nki.isa
    import nki_cpu_simulator.nki.isa.constants
    import nki_cpu_simulator.nki.language
    import nki_cpu_simulator.nki.language.dtypes
    import nki_cpu_simulator.nki.tensor
    import nki_cpu_simulator.nki.typing

    cs = nki_cpu_simulator.nki
    sys.modules["nki"] = cs
    sys.modules["nki.language"] = cs.language
    sys.modules["nki.isa"] = cs.isa
    sys.modules["nki.isa.constants"] = cs.isa.constants
    sys.modules["nki.typing"] = cs.typing
    sys.modules["nki.compiler"] = cs.compiler
    sys.modules["nki.dtype"] = cs.language.dtypes
    sys.modules["nki.tensor"] = cs.tensor
    builtins.builtin = cs.builtin
    monkeypatch.setenv("NKI_NC_VERSION", "gen3")

    mod = _load_kernel_module(clean_modules, "nsim_test_kernels_nki_add_exp_harness")
    import nki

    assert nki is cs
    a, b = mod.make_inputs(seed=2)
    out = nki.cpu_simulate(mod.add_exp_kernel)[1](a=a, b=b)
    np.testing.assert_allclose(out, mod.reference(a, b), rtol=1e-3, atol=1e-3)
    assert builtin.language.add is nki.language.add  # noqa: F821 - set on builtins above

    # a plain (un-jitted) function works too, and parameter names that collide with simulate() keywords
    import nki.isa as nisa
    import nki.language as nl

    def copy_kernel(config, seed):
        out = nl.ndarray(config.shape, config.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray(config.shape, config.dtype, buffer=nl.sbuf)
        u = nl.ndarray(seed.shape, seed.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=config)
        nisa.dma_copy(dst=u, src=seed)
        nisa.tensor_tensor(dst=t, data1=t, data2=u, op=nl.add)
        nisa.dma_copy(dst=out, src=t)
        return out

    x = np.ones((128, 4), np.float32)
    y = np.full((128, 4), 2.0, np.float32)
    np.testing.assert_array_equal(nki.cpu_simulate(copy_kernel)[1](config=x, seed=y), x + y)


# --------------------------------------------------------------------------------------------------
# (d) uninstall
# --------------------------------------------------------------------------------------------------


def test_uninstall_restores(clean_modules):
    real_nki = importlib.util.find_spec("nki") is not None if "nki" not in sys.modules else True
    compat.install()
    import nki  # noqa: F401
    import nki.isa.constants  # noqa: F401
    import neuronxcc.nki.language  # noqa: F401

    compat.uninstall()
    compat.uninstall()  # idempotent
    assert not compat.installed()
    assert real_nki or not any(n.split(".", 1)[0] in _PREFIXES for n in sys.modules)
    if real_nki:
        pytest.skip("a real nki package is installed")
    with pytest.raises(ImportError):
        importlib.import_module("nki")
    with pytest.raises(ImportError):
        importlib.import_module("nki.language")
    with pytest.raises(ImportError):
        importlib.import_module("neuronxcc.nki")
    # and install() works again afterwards
    compat.install()
    import nki.language as nl

    assert nl.sbuf == "sbuf"


def test_zz_no_leak():
    """Runs last in this file: nothing nki/neuronxcc-related is left in sys.modules or builtins."""
    assert not compat.installed()
    left = {n for n in sys.modules if n.split(".", 1)[0] in _PREFIXES} - _AT_IMPORT
    assert not left, left
    assert not hasattr(builtins, "builtin")
