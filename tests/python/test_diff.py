"""Comparing two runs: `Profile.compare` / `ProfileComparison` and the `nsim diff` command.

The CLI is build/nsim (as in test_cli.py); NSIM_BIN=path/to/nsim tests another build directory.
"""
import copy
import json
import os
import subprocess
import sys

import pytest

from conftest import ADD_ONE, NSIM_BIN, REPO_ROOT

# The build-tree extension is appended, so a PYTHONPATH pointing at another build directory wins.
for _p in (os.path.join(REPO_ROOT, "python"), os.path.join(REPO_ROOT, "build", "python")):
    if os.path.isdir(_p) and _p not in sys.path:
        sys.path.append(_p)

nsim = pytest.importorskip("nsim")
if not getattr(nsim, "core_available", False):
    pytest.skip("the _nsim extension is not built (cmake --build build --target _nsim)", allow_module_level=True)

NSIM = NSIM_BIN

# Version A: y = x + 1 over two [128, 64] fp32 tiles (line 4 is the add): conftest.ADD_ONE.
V1 = ADD_ONE


def _v2():
    """Version B: line 4 adds twice (twice the vector work), a new line 6 scales on GpSimd."""
    k = copy.deepcopy(V1)
    body = k["body"][0]["loop"]["body"]
    add = body[2]
    body.insert(3, copy.deepcopy(add))
    body.insert(4, {"op": "tensor_scalar", "dst": "t", "data": "t", "alu0": "multiply", "flags": ["has_imm0"],
                    "imm": [2.0], "engine": "gpsimd", "loc": {"file": "add_one.py", "line": 6}})
    return k


V2 = _v2()


@pytest.fixture(scope="module")
def profiles():
    _, a = nsim.simulate_json(V1, timing_only=True)
    _, b = nsim.simulate_json(V2, timing_only=True)
    return a, b


def _line(cmp, src):
    found = [l for l in cmp.lines if l["src"] == src]
    assert len(found) == 1, (src, cmp.text)
    return found[0]


def _text_row(text, src):
    rows = [r for r in text.splitlines() if r.rstrip().endswith(src)]
    assert len(rows) == 1, (src, text)
    return rows[0]


def test_compare_finds_the_slower_and_the_added_line(profiles):
    a, b = profiles
    c = a.compare(b, labels=("v1", "v2"))
    assert isinstance(c, nsim.ProfileComparison)
    assert str(c) == c.text
    assert c.total_time_delta_ns == pytest.approx(b.total_time_ns - a.total_time_ns, rel=1e-12, abs=1e-9)
    assert c.total_time_delta_ns > 0
    assert c.data["total_time_ns"]["a"] == a.total_time_ns and c.data["total_time_ns"]["b"] == b.total_time_ns
    assert c.data["a"]["label"] == "v1" and c.data["b"]["kernel"] == "add_one"

    l4 = _line(c, "add_one.py:4")
    assert l4["status"] == "changed"
    assert l4["instructions"] == {"a": 2, "b": 4, "delta": 2}
    assert l4["instruction_time_ns"]["delta"] > 0
    assert "slower" in _text_row(c.text, "add_one.py:4")
    l6 = _line(c, "add_one.py:6")
    assert l6["status"] == "added" and l6["instruction_time_ns"]["a"] == 0
    assert l6["instruction_time_ns"]["delta"] == pytest.approx(l6["instruction_time_ns"]["b"])
    assert "added" in _text_row(c.text, "add_one.py:6")
    for src in ("add_one.py:3", "add_one.py:5"):  # the DMA lines did not change
        assert _line(c, src)["status"] == "same"
    deltas = [abs(l["instruction_time_ns"]["delta"]) for l in c.lines]
    assert deltas == sorted(deltas, reverse=True)

    assert list(c.engines) == ["tensor", "vector", "scalar", "gpsimd", "sync", "dma"]
    for e in ("vector", "scalar", "gpsimd"):
        v = c.engines[e]
        assert v["instructions"]["a"] == a.stat("engine.{}.instruction_count".format(e))
        assert v["instructions"]["b"] == b.stat("engine.{}.instruction_count".format(e))
        assert v["active_time_ns"]["delta"] == pytest.approx(
            b.stat("engine.{}.active_time".format(e)) - a.stat("engine.{}.active_time".format(e)))
    # The two added element-wise instructions land on whichever engine the compiler model places them
    # (DMA triggers count on their trigger engine, which the compiler model chooses too).
    compute = ("tensor", "vector", "scalar", "gpsimd", "sync")
    assert sum(c.engines[e]["instructions"]["b"] for e in compute) == sum(
        c.engines[e]["instructions"]["a"] for e in compute) + l4["instructions"]["delta"] + l6["instructions"]["b"]
    assert c.stats["memory.hbm_read_bytes"]["delta"] == 0
    assert "nsim.ProfileComparison v1 -> v2" in repr(c)


def test_compare_the_other_way_is_faster_and_removed(profiles):
    a, b = profiles
    c = b.compare(a)
    assert c.total_time_delta_ns < 0
    assert "faster" in [r for r in c.text.splitlines() if r.startswith("total time")][0]
    l4 = _line(c, "add_one.py:4")
    assert l4["instruction_time_ns"]["delta"] < 0 and "faster" in _text_row(c.text, "add_one.py:4")
    assert _line(c, "add_one.py:6")["status"] == "removed"


def test_max_lines_limits_the_text_only(profiles):
    a, b = profiles
    c = a.compare(b, max_lines=1)
    assert "(1 of 4)" in c.text and "add_one.py:4" in c.text and "add_one.py:3" not in c.text
    assert len(c.lines) == 4


def test_to_stats_json_is_the_cli_stats_format(profiles, tmp_path):
    a, _ = profiles
    doc = json.loads(a.to_stats_json())
    assert doc["kernel"] == "add_one" and doc["config"] == "trn2" and doc["timing_only"] is True
    assert doc["stats"] == a.stats
    assert [l["src"] for l in doc["lines"]] == [l["src"] for l in a.lines]
    if not os.path.isfile(NSIM):
        pytest.skip("build/nsim not built")
    k = tmp_path / "v1.json"
    k.write_text(json.dumps(V1))
    s = tmp_path / "s.json"
    assert _nsim_cli("run", k, "--timing-only", "--stats", s).returncode == 0
    cli = json.loads(s.read_text())
    assert cli["instructions"] == doc["instructions"]
    assert {key: cli[key] for key in ("kernel", "config", "timing_only")} == \
        {key: doc[key] for key in ("kernel", "config", "timing_only")}
    assert [(l["src"], l["instructions"]) for l in cli["lines"]] == [(l["src"], l["instructions"]) for l in doc["lines"]]
    # A stats file and a Profile compare as equal.
    same = nsim.ProfileComparison.from_stats_json(s.read_text(), a.to_stats_json())
    assert same.total_time_delta_ns == 0 and all(l["status"] == "same" for l in same.lines)


def test_malformed_stats_raise_coded_errors(profiles):
    a, _ = profiles
    with pytest.raises(nsim.KernelError) as e:
        nsim.ProfileComparison.from_stats_json("{", a.to_stats_json())
    assert e.value.code == "NSIM-E401"
    with pytest.raises(nsim.KernelError) as e:
        nsim.ProfileComparison.from_stats_json(a.to_stats_json(), json.dumps({"stats": {}}), labels=("x", "y"))
    assert e.value.code == "NSIM-E445" and "y" in str(e.value) and "total_time" in str(e.value)


# ------------------------------------------------------------------------------------------------ CLI


def _nsim_cli(*args):
    return subprocess.run([NSIM, *map(str, args)], capture_output=True, text=True, timeout=120)


@pytest.fixture
def cli_files(tmp_path):
    if not (os.path.isfile(NSIM) and os.access(NSIM, os.X_OK)):
        pytest.skip("build/nsim not built (cmake --build build --target nsim)")
    k1, k2 = tmp_path / "v1.json", tmp_path / "v2.json"
    k1.write_text(json.dumps(V1))
    k2.write_text(json.dumps(V2))
    return tmp_path, k1, k2


def test_cli_diff_of_two_kernels_and_of_their_stats(cli_files, profiles):
    d, k1, k2 = cli_files
    a, b = profiles
    out = d / "diff.json"
    r = _nsim_cli("diff", k1, k2, "--json", out)
    assert r.returncode == 0, r.stderr
    assert "slower" in _text_row(r.stdout, "add_one.py:4") and "added" in _text_row(r.stdout, "add_one.py:6")
    data = json.loads(out.read_text())
    assert data["a"]["label"] == str(k1) and data["b"]["label"] == str(k2)
    assert data["total_time_ns"]["a"] == a.total_time_ns and data["total_time_ns"]["b"] == b.total_time_ns
    assert data["total_time_ns"]["delta"] == pytest.approx(b.total_time_ns - a.total_time_ns, rel=1e-12, abs=1e-9)
    assert [l["src"] for l in data["lines"]][:2] == ["add_one.py:4", "add_one.py:6"]

    s1, s2 = d / "s1.json", d / "s2.json"
    assert _nsim_cli("run", k1, "--timing-only", "--stats", s1).returncode == 0
    assert _nsim_cli("run", k2, "--timing-only", "--stats", s2).returncode == 0
    r2 = _nsim_cli("diff", s1, s2, "--json", "-")
    assert r2.returncode == 0, r2.stderr
    from_stats = json.loads(r2.stdout)
    assert from_stats["total_time_ns"] == data["total_time_ns"]
    assert from_stats["engines"] == data["engines"]
    assert [(l["src"], l["status"]) for l in from_stats["lines"]] == [(l["src"], l["status"]) for l in data["lines"]]
    # A stats file against a kernel.json works too.
    r3 = _nsim_cli("diff", s1, k2, "--lines", "1")
    assert r3.returncode == 0 and "(1 of 4)" in r3.stdout


def test_cli_diff_two_generations_and_a_what_if(cli_files):
    _, k1, _ = cli_files
    r = _nsim_cli("diff", k1, k1, "--config", "trn1", "--config-b", "trn2", "--json", "-")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["a"]["config"] == "trn1" and data["b"]["config"] == "trn2"
    assert data["a"]["label"].endswith("[trn1]") and data["b"]["label"].endswith("[trn2]")
    _, p1 = nsim.simulate_json(V1, timing_only=True, config="trn1")
    _, p2 = nsim.simulate_json(V1, timing_only=True, config="trn2")
    assert data["total_time_ns"]["a"] == p1.total_time_ns and data["total_time_ns"]["b"] == p2.total_time_ns

    r = _nsim_cli("diff", k1, k1, "-P", "hbm.bw=725GB/s", "--json", "-")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["b"]["label"].endswith("[trn2 hbm.bw=725GB/s]")
    _, pw = nsim.simulate_json(V1, timing_only=True, overrides=["hbm.bw=725GB/s"])
    assert data["total_time_ns"]["b"] == pw.total_time_ns
    # The text report lists the configuration keys that differ between the two sides.
    r = _nsim_cli("diff", k1, k1, "-P", "hbm.bw=725GB/s")
    assert r.returncode == 0, r.stderr
    tail = r.stdout[r.stdout.index("Configuration differences (A -> B), 1 key:"):]
    assert "hbm.bw" in tail and "362.5GB/s -> 725GB/s" in " ".join(tail.split())
    r = _nsim_cli("diff", k1, k1, "--config", "trn1", "--config-b", "trn2")
    diffs = r.stdout[r.stdout.index("Configuration differences"):].splitlines()[1:]
    assert {l.split()[0] for l in diffs} >= {"generation", "clock.tensor", "hbm.bw", "sbuf.bytes_per_partition"}
    r = _nsim_cli("diff", k1, k1)
    assert "Configuration differences" not in r.stdout


def test_cli_diff_of_long_loops_counts_their_repeats_with_the_same_result(tmp_path):
    # A kernel.json side is a timing-only run: fast-forward on, as in `nsim run --timing-only` (a softmax loop of
    # 6,000 iterations, most of them counted as repeats), and --no-fast-forward simulates every instruction; the
    # comparison is the same either way, and each side's total time is simulate_json's.
    with open(os.path.join(REPO_ROOT, "examples", "softmax_2x128x512.json")) as f:
        k = json.load(f)
    k["body"][0]["loop"]["stop"], k["body"][0]["loop"]["kind"] = 6000, "sequential"
    k = json.loads(json.dumps(k).replace('"index": ["b",', '"index": [0,'))
    path = tmp_path / "long.json"
    path.write_text(json.dumps(k))
    fast = _nsim_cli("diff", path, path, "--config-b", "trn3", "--json", "-")
    full = _nsim_cli("diff", path, path, "--config-b", "trn3", "--json", "-", "--no-fast-forward")
    assert fast.returncode == 0 and full.returncode == 0, (fast.stderr, full.stderr)
    assert fast.stdout == full.stdout
    _, p3 = nsim.simulate_json(k, timing_only=True, config="trn3")
    assert p3.stat("fast_forward.skipped_instructions") > 0
    assert json.loads(fast.stdout)["total_time_ns"]["b"] == p3.total_time_ns


def test_cli_diff_help_and_bad_input(cli_files):
    d, k1, _ = cli_files
    r = _nsim_cli("diff", "--help")
    assert r.returncode == 0 and "usage: nsim diff" in r.stdout
    assert "diff" in _nsim_cli("--help").stdout
    bad = d / "bad.json"
    bad.write_text('{"stats": ')
    neither = d / "neither.json"
    neither.write_text('{"name": "x"}')
    cases = [
        ((d / "missing.json", k1), "NSIM-E413"),
        ((k1, bad), "NSIM-E401"),
        ((neither, k1), "NSIM-E445"),
        ((k1,), "NSIM-E414"),
        ((k1, k1, "--lines", "x"), "NSIM-E414"),
        ((k1, k1, "--config-b", "trn9"), "NSIM-E104"),
    ]
    for args, code in cases:
        r = _nsim_cli("diff", *args)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert r.stderr.startswith(code), (args, r.stderr)
