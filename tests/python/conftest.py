"""Shared fixtures of the Python tests: repository paths and the nsim CLI binary."""
import contextlib
import importlib.util
import os
import sys

import pytest

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
EXAMPLES_DIR = os.path.join(REPO_ROOT, "examples")
# The CLI under test: $NSIM_BIN (another build directory), else build/nsim.
NSIM_BIN = os.environ.get("NSIM_BIN") or os.path.join(REPO_ROOT, "build", "nsim")
PRESETS = ("trn1", "trn2", "trn3")

# A minimal kernel.json shared by the CLI tests: y = x + 1 over two [128, 64] fp32 tiles; its load,
# add and store are lines 3, 4 and 5 of add_one.py.
ADD_ONE = {
    "nsim_kernel": 1,
    "name": "add_one",
    "tensors": [
        {"name": "x", "buffer": "hbm", "kind": "input", "dtype": "float32", "shape": [256, 64]},
        {"name": "y", "buffer": "hbm", "kind": "output", "dtype": "float32", "shape": [256, 64]},
    ],
    "body": [
        {"loop": {"var": "i", "stop": 2, "body": [
            {"alloc": {"name": "t", "buffer": "sbuf", "dtype": "float32", "shape": [128, 64]}},
            {"op": "dma_copy", "dst": "t", "src": {"tensor": "x", "index": [{"start": "128*i", "size": 128}]},
             "loc": {"file": "add_one.py", "line": 3}},
            {"op": "tensor_scalar", "dst": "t", "data": "t", "alu0": "add", "flags": ["has_imm0"], "imm": [1.0],
             "loc": {"file": "add_one.py", "line": 4}},
            {"op": "dma_copy", "dst": {"tensor": "y", "index": [{"start": "128*i", "size": 128}]}, "src": "t",
             "loc": {"file": "add_one.py", "line": 5}},
        ]}},
    ],
}

# examples/gen_examples.py and examples/reference.py are plain scripts, not a package.
if EXAMPLES_DIR not in sys.path:
    sys.path.insert(0, EXAMPLES_DIR)


def executed_ops(body):
    """The op statements of a kernel.json body in execution order, a loop's body repeated once per
    iteration (loops are kept by the tracer by default; tests that count or order ops use this)."""
    out = []
    for s in body:
        if "op" in s:
            out.append(s)
        elif "loop" in s:
            lp = s["loop"]
            inner = executed_ops(lp.get("body", []))
            out.extend(inner * len(range(lp.get("start", 0), lp["stop"], lp.get("step", 1))))
    return out


def run_clean(kernel, *args, allow=()):
    """Run ``kernel(*args)`` with every warning (sanitizer reports included) an error, but those whose message starts
    with one of the codes in ``allow`` ("NSIM-W509"): its output."""
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = kernel(*args)
    for w in caught:
        if not str(w.message).startswith(tuple(allow)):
            raise AssertionError("unexpected warning: {}".format(w.message))
    return out


def op_counts(kernel):
    """How many instructions of each op the last run of ``kernel`` executed (a Counter by op name)."""
    import collections
    return collections.Counter(o["op"] for o in executed_ops(kernel.last_json["body"]))


def require_core():
    """For test modules that need the built simulator: skip the whole module unless nsim._core
    imports and its _nsim extension works, and ml_dtypes is installed. Returns (_core, ml_dtypes)."""
    core = pytest.importorskip("nsim._core", exc_type=ImportError)
    mld = pytest.importorskip("ml_dtypes")
    try:
        core.version()
    except Exception as e:  # the extension is not built
        pytest.skip("nsim._core not usable: {}".format(e), allow_module_level=True)
    return core, mld


@pytest.fixture(scope="session")
def repo_root():
    return REPO_ROOT


@pytest.fixture(scope="session")
def examples_dir():
    return EXAMPLES_DIR


@pytest.fixture(scope="session")
def nsim_bin():
    """Path of the built CLI; skips the test when it has not been built."""
    if not (os.path.isfile(NSIM_BIN) and os.access(NSIM_BIN, os.X_OK)):
        pytest.skip("{} not built (cmake --build build --target nsim)".format(NSIM_BIN))
    return NSIM_BIN


def pytest_configure(config):
    """A sanitizer report (nsim's options(check=True), on by default) from any kernel run by the tests is
    an error: no example or library kernel may trigger one (tests expecting one catch it explicitly)."""
    config.addinivalue_line("filterwarnings", "error::nsim.tracer.CheckWarning")


@contextlib.contextmanager
def beta1_modules(*paths):
    """nsim's compat layer installed (``import neuronxcc.nki`` works) and the kernel files at ``paths``
    imported as modules ``nsim_test_<file stem>``: yields the list of modules; afterwards sys.modules is
    restored (and compat uninstalled if it was not installed before)."""
    from nsim import compat
    prefixes = ("nki", "neuronxcc")
    was = compat.installed()
    before = {n for n in sys.modules if n.split(".", 1)[0] in prefixes}
    compat.install()
    mods = []
    try:
        for path in paths:
            name = "nsim_test_" + os.path.splitext(os.path.basename(str(path)))[0]
            spec = importlib.util.spec_from_file_location(name, str(path))
            mod = importlib.util.module_from_spec(spec)
            sys.modules[name] = mod
            spec.loader.exec_module(mod)
            mods.append(mod)
        yield mods
    finally:
        for mod in mods:
            sys.modules.pop(mod.__name__, None)
        if not was:
            compat.uninstall()
            for n in [n for n in sys.modules if n.split(".", 1)[0] in prefixes and n not in before]:
                sys.modules.pop(n, None)


@contextlib.contextmanager
def beta1_sample(filename):
    """A public kernel file of tests/python/kernels/ imported as beta1_modules() imports it: yields (module,
    neuronxcc.nki, its language module, its isa module)."""
    with beta1_modules(os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels", filename)) as (mod,):
        import neuronxcc.nki as nki
        import neuronxcc.nki.isa as nisa
        import neuronxcc.nki.language as nl
        yield mod, nki, nl, nisa


def sample_fixture(filename, module_only=False):
    """A module-scoped fixture yielding what ``beta1_sample(filename)`` yields (the kernel file's module only with
    ``module_only``): ``rq = sample_fixture("nki_samples_rmsnorm_qkv.py")`` in a test module of a public kernel."""
    @pytest.fixture(scope="module")
    def fixture():
        with beta1_sample(filename) as sample:
            yield sample[0] if module_only else sample
    fixture.__doc__ = "The kernels of tests/python/kernels/{} (compat installed; sys.modules restored after).".format(
        filename)
    return fixture


@pytest.fixture(scope="module")
def b1():
    """The Beta-1 dialect through nsim's compat layer: yields (nki, nl, nisa) of ``neuronxcc.nki``; restores
    sys.modules afterwards (a test module may define its own ``b1`` yielding more)."""
    with beta1_modules():
        import neuronxcc.nki as bnki
        import neuronxcc.nki.isa as bnisa
        import neuronxcc.nki.language as bnl
        yield bnki, bnl, bnisa
