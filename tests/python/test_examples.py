"""The example kernels of examples/: generated deterministically, and run from the CLI on every
preset they match their numpy references (bf16 tolerance); --timing-only gives the same time."""
import filecmp
import json
import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

from conftest import EXAMPLES_DIR, PRESETS, REPO_ROOT

import gen_examples  # noqa: E402  (examples/ is put on sys.path by conftest)
import reference  # noqa: E402

EXAMPLE_FILES = [fname for fname, _ in gen_examples.all_examples()]
EXAMPLE_NAMES = reference.names()
SEED = 20240611


def _example_file(name):
    return os.path.join(EXAMPLES_DIR, name + ".json")


# --------------------------------------------------------------------------------------------------
# Generator (no simulator needed)
# --------------------------------------------------------------------------------------------------


def test_generator_is_deterministic(tmp_path):
    """Regenerating gives byte-identical files, and the checked-in files are up to date."""
    for out in (tmp_path / "a", tmp_path / "b"):
        r = subprocess.run([sys.executable, os.path.join(EXAMPLES_DIR, "gen_examples.py"), "--out", str(out)],
                           capture_output=True, text=True, cwd=str(tmp_path))
        assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(tmp_path / "a")) == sorted(EXAMPLE_FILES)
    for fname in EXAMPLE_FILES:
        assert filecmp.cmp(tmp_path / "a" / fname, tmp_path / "b" / fname, shallow=False), fname
        assert filecmp.cmp(tmp_path / "a" / fname, os.path.join(EXAMPLES_DIR, fname), shallow=False), (
            "examples/{} is stale: run python3 examples/gen_examples.py".format(fname))


def test_names_match_files():
    assert [n + ".json" for n in EXAMPLE_NAMES] == EXAMPLE_FILES


@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_example_structure(name):
    """Schema-level sanity: every op has a loc, names are unique, inputs match reference.py."""
    with open(_example_file(name), encoding="utf-8") as f:
        k = json.load(f)
    assert k["nsim_kernel"] == 1 and k["name"] == name
    inputs = {t["name"]: tuple(t["shape"]) for t in k["tensors"] if t["kind"] == "input"}
    assert inputs == {n: tuple(s) for n, s in reference.input_shapes(name).items()}
    names = [t["name"] for t in k["tensors"]]

    def walk(body):
        for s in body:
            if "alloc" in s:
                names.append(s["alloc"]["name"])
            elif "loop" in s:
                walk(s["loop"]["body"])
            else:
                loc = s["loc"]
                assert loc["file"] == "examples/gen_examples.py" and loc["line"] > 0 and loc["function"]

    walk(k["body"])
    assert len(names) == len(set(names))
    assert 0 < gen_examples.instruction_count(k) < 20000


# --------------------------------------------------------------------------------------------------
# CLI runs against the references
# --------------------------------------------------------------------------------------------------


def _load_npy(path):
    a = np.load(path)
    if a.dtype.kind == "V" and a.dtype.itemsize == 2 or a.dtype == np.uint16:
        a = a.view(ml_dtypes.bfloat16)  # bf16 .npy files carry the numpy descr '<V2'
    return a.astype(np.float32)


def _run(nsim, args, cwd):
    r = subprocess.run([nsim, "run"] + args, capture_output=True, text=True, cwd=cwd, timeout=600)
    assert r.returncode == 0, "nsim run {} failed (exit {}):\n{}\n{}".format(" ".join(args), r.returncode, r.stdout,
                                                                            r.stderr)
    return r


def _total_time(stats_path):
    with open(stats_path, encoding="utf-8") as f:
        stats = json.load(f)["stats"]
    return stats["total_time"]["value"]


@pytest.fixture(scope="module")
def example_inputs(tmp_path_factory):
    """Per example: (inputs dir with <tensor>.npy files, inputs dict, reference outputs)."""
    cache = {}

    def get(name):
        if name not in cache:
            d = tmp_path_factory.mktemp(name + "_inputs")
            inputs = reference.make_inputs(name, seed=SEED)
            for n, a in inputs.items():
                np.save(d / (n + ".npy"), a)
            cache[name] = (d, inputs, reference.reference(name, inputs))
        return cache[name]

    return get


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_example_matches_reference(nsim_bin, example_inputs, tmp_path, name, preset):
    in_dir, _, ref = example_inputs(name)
    out_dir = tmp_path / "out"
    stats = tmp_path / "stats.json"
    r = _run(nsim_bin, [_example_file(name), "--config", preset, "--inputs", str(in_dir), "--outputs", str(out_dir),
                        "--stats", str(stats), "--check"], REPO_ROOT)
    assert "NSIM-W" not in r.stderr, r.stderr  # the sanitizer (docs/debugging.md) finds nothing in an example
    for out_name, expected in ref.items():
        got = _load_npy(out_dir / (out_name + ".npy"))
        assert got.shape == expected.shape
        # bf16 tolerance; the absolute part scales with the output (softmax values are ~1/hidden)
        atol = min(2e-2, 2e-2 * float(np.abs(expected).max()))
        np.testing.assert_allclose(got, expected, rtol=2e-2, atol=atol, err_msg="{} on {}".format(name, preset))
    t_full = _total_time(stats)
    assert t_full > 0

    # --timing-only: the same schedule without the numerics.
    stats_t = tmp_path / "stats_timing.json"
    _run(nsim_bin, [_example_file(name), "--config", preset, "--timing-only", "--stats", str(stats_t)], REPO_ROOT)
    assert _total_time(stats_t) == t_full


def test_kernel_json_doc_example_computes_softmax(tmp_path):
    """The complete example at the top of docs/kernel-json.md, as written there, run with --check: a row softmax
    of its input (fp32 tolerance) and no sanitizer report. (An audit found it leaving reduce_cmd idle: every
    output was inf from accumulator registers never written, and only --check said so.)"""
    import nsim
    text = open(os.path.join(REPO_ROOT, "docs", "kernel-json.md")).read()
    block = text.split("```json\n", 1)[1].split("```", 1)[0]
    assert '"name": "row_softmax"' in block
    x = np.random.default_rng(5).standard_normal((256, 512)).astype(np.float32)
    out, prof = nsim.simulate_json(block, inputs={"x": x}, check=True)
    assert prof.check_reports == []
    e = np.exp(x - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(out["y"], e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-7)
