"""examples/export_from_library.py: the kernel.json files of the nsim.kernels library are generated
deterministically, the checked-in examples/library/ is up to date, and every file runs from the CLI
(`nsim run FILE --inputs INPUTS.npz --outputs DIR`) and matches the kernel's numpy reference."""
import filecmp
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import EXAMPLES_DIR, REPO_ROOT

ml_dtypes = pytest.importorskip("ml_dtypes")
import export_from_library as X  # noqa: E402  (examples/ is put on sys.path by conftest)
from nsim import kernels as K  # noqa: E402

NAMES = X.names()
LIBRARY_DIR = os.path.join(EXAMPLES_DIR, "library")
BF16 = np.dtype(ml_dtypes.bfloat16)


def _export(out):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(REPO_ROOT, "python"), os.path.join(REPO_ROOT, "build", "python")]
                                        + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    r = subprocess.run([sys.executable, os.path.join(EXAMPLES_DIR, "export_from_library.py"), "--out", str(out)],
                       capture_output=True, text=True, cwd=str(out.parent), env=env, timeout=600)
    assert r.returncode == 0, r.stderr


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    out = tmp_path_factory.mktemp("library") / "lib"
    _export(out)
    return out


def test_export_is_deterministic_and_up_to_date(generated, tmp_path):
    again = tmp_path / "again"
    _export(again)
    files = sorted(n + ".json" for n in NAMES)
    assert sorted(os.listdir(generated)) == files
    for fname in files:
        assert filecmp.cmp(generated / fname, again / fname, shallow=False), fname
        assert filecmp.cmp(generated / fname, os.path.join(LIBRARY_DIR, fname), shallow=False), (
            "examples/library/{} is stale: run python3 examples/export_from_library.py".format(fname))


@pytest.mark.parametrize("name", NAMES)
def test_library_file_structure(generated, name):
    with open(generated / (name + ".json"), encoding="utf-8") as f:
        k = json.load(f)
    assert k["nsim_kernel"] == 1 and k["name"] == name
    kj, inputs, _ = X.export(name)
    assert k == json.loads(json.dumps(kj))
    assert {t["name"] for t in k["tensors"] if t["kind"] == "input"} == set(inputs)
    assert any(t["kind"] == "output" for t in k["tensors"])
    stack = [k["body"]]  # every statement's loc, in loops too: repository-relative (the files are checked in)
    while stack:
        for s in stack.pop():
            if "loop" in s:
                stack.append(s["loop"]["body"])
            loc = s["loc"] if "op" in s else (s.get("alloc") or s.get("loop") or {}).get("loc")
            if loc is not None and loc["line"]:
                assert loc["file"].startswith("python/nsim/kernels/"), loc


def _load_npy(path):
    a = np.load(path)
    if a.dtype.kind == "V" and a.dtype.itemsize == 2 or a.dtype == np.uint16:
        a = a.view(ml_dtypes.bfloat16)
    return a.astype(np.float32)


def _outputs(spec):
    """Flatten a TraceResult.ret_spec into the list of output tensor names (in return order)."""
    if spec is None:
        return []
    tag, v = spec
    if tag == "tensor":
        return [v]
    if tag == "value":
        return []
    if tag is dict:
        return [n for k in sorted(v) for n in _outputs(v[k])]
    return [n for x in v for n in _outputs(x)]


def _refs(ref):
    if isinstance(ref, dict):
        return [ref[k] for k in sorted(ref)]
    if isinstance(ref, (tuple, list)):
        return list(ref)
    return [ref]


@pytest.mark.parametrize("preset", ["trn1", "trn2", "trn3"])
@pytest.mark.parametrize("name", NAMES)
def test_library_file_runs_and_matches_reference(nsim_bin, generated, tmp_path, name, preset):
    _kernel, reference, make_inputs = K.KERNELS[name]
    args = make_inputs(X.SEED)
    _, inputs, tres = X.export(name)
    npz = tmp_path / "inputs.npz"
    np.savez(npz, **inputs)
    out_dir = tmp_path / "out"
    r = subprocess.run([nsim_bin, "run", str(generated / (name + ".json")), "--config", preset, "--inputs", str(npz),
                        "--outputs", str(out_dir), "--check"], capture_output=True, text=True, cwd=REPO_ROOT,
                       timeout=600)
    assert r.returncode == 0, "nsim run failed (exit {}):\n{}\n{}".format(r.returncode, r.stdout, r.stderr)
    assert "NSIM-W" not in r.stderr, r.stderr  # the sanitizer (docs/debugging.md) finds nothing
    names, refs = _outputs(tres.ret_spec), _refs(reference(*args))
    assert names and len(names) == len(refs)
    tol = 2e-2 if np.dtype(args[0].dtype) == BF16 else 1e-5
    for out_name, expected in zip(names, refs):
        expected = np.asarray(expected, dtype=np.float32)
        got = _load_npy(out_dir / (out_name + ".npy"))
        assert got.shape == expected.shape
        assert np.all(np.isfinite(got))
        scale = float(np.max(np.abs(expected))) or 1.0
        np.testing.assert_allclose(got, expected, rtol=tol, atol=tol * scale, err_msg="{} on {}".format(name, preset))
