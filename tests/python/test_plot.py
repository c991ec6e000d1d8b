"""nsim.plot: roofline numbers, utilisation from the trace, PNG output and `python -m nsim.plot`."""
import os
import subprocess
import sys

import pytest

from conftest import EXAMPLES_DIR, REPO_ROOT

nsim = pytest.importorskip("nsim")
if not getattr(nsim, "core_available", False):
    pytest.skip("nsim core (_nsim extension) not built", allow_module_level=True)
pytest.importorskip("matplotlib")

import nsim.plot as nplot  # noqa: E402

SOFTMAX = os.path.join(EXAMPLES_DIR, "softmax_2x128x512.json")
SWIGLU = os.path.join(EXAMPLES_DIR, "swiglu.json")
ENGINES = ("tensor", "vector", "scalar", "gpsimd", "sync")


@pytest.fixture(scope="module")
def softmax_run(tmp_path_factory):
    trace = str(tmp_path_factory.mktemp("trace") / "softmax.trace.json")
    _, prof = nsim.simulate_json(SOFTMAX, config="trn2", timing_only=True, trace=trace)
    return prof, trace


@pytest.fixture(scope="module")
def swiglu_run(tmp_path_factory):
    trace = str(tmp_path_factory.mktemp("trace") / "swiglu.trace.json")
    _, prof = nsim.simulate_json(SWIGLU, config="trn2", timing_only=True, trace=trace)
    return prof, trace


def _png_ok(path):
    assert os.path.isfile(path), path
    assert os.path.getsize(path) > 1000, path
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_parse_bandwidth():
    assert nplot.parse_bandwidth("362.5GB/s") == pytest.approx(362.5e9)
    assert nplot.parse_bandwidth("23B/ns") == pytest.approx(23e9)
    assert nplot.parse_bandwidth("1KiB/us") == pytest.approx(1024e6)
    assert nplot.parse_bandwidth(5.0) == 5.0
    with pytest.raises(ValueError):
        nplot.parse_bandwidth("fast")


def test_roofline_numbers_softmax(softmax_run):
    prof, _ = softmax_run
    r = nplot.roofline(prof)
    s = prof.stats
    assert r["memory_roof"] == pytest.approx(362.5e9)  # min(362.5 GB/s, 23 B/ns x 16 = 368 GB/s)
    assert r["compute_roof"] == pytest.approx(2 * 128 * 128 * 2.4e9)
    flops = s["flops"]["hardware"]["value"] + sum(s["engine"][e]["flops"]["value"] for e in ENGINES if e != "tensor")
    hbm = s["memory"]["hbm_read_bytes"]["value"] + s["memory"]["hbm_write_bytes"]["value"]
    assert flops > 0 and hbm > 0
    assert r["flops"] == pytest.approx(flops)
    assert r["hbm_bytes"] == pytest.approx(hbm)
    assert r["intensity"] == pytest.approx(flops / hbm)
    t = s["total_time"]["value"] * 1e-9
    assert r["achieved_flops_per_s"] == pytest.approx(flops / t)
    assert r["ridge"] == pytest.approx(r["compute_roof"] / r["memory_roof"])
    # softmax has ~0.75 FLOP/B, far left of the ridge (~217 FLOP/B)
    assert r["intensity"] < r["ridge"]
    assert r["regime"] == "memory"
    expected_pct = 100 * (flops / t) / (r["memory_roof"] * r["intensity"])
    assert r["achieved_percent"] == pytest.approx(expected_pct)
    assert r["bound"] == prof.bound  # the one verdict (engines/bounds.h), not a roofline-only one


def test_roofline_png(softmax_run, tmp_path):
    prof, _ = softmax_run
    out = tmp_path / "roof.png"
    r = nplot.roofline(prof, str(out), title="softmax roofline")
    _png_ok(str(out))
    assert r["path"] == str(out)


@pytest.mark.parametrize("which", ["softmax", "swiglu"])
def test_utilisation_matches_stats(which, softmax_run, swiglu_run, tmp_path):
    prof, trace = softmax_run if which == "softmax" else swiglu_run
    out = tmp_path / "util.png"
    avg = nplot.utilisation(trace, str(out), bins=100)
    _png_ok(str(out))
    for e in ENGINES:
        want = prof.stat("engine.{}.active_time_percent".format(e))
        assert 100 * avg[e] == pytest.approx(want, abs=5.0), e
    total = prof.stat("total_time")
    dma = [v["active_time"]["value"] for k, v in prof.stats["dma"].items() if k.startswith("engine")]
    want_dma = 100 * sum(dma) / len(dma) / total
    assert 100 * avg["dma"] == pytest.approx(want_dma, abs=5.0)
    # profile + trace= form gives the same averages (total_time from the stats)
    avg2 = nplot.utilisation(prof, None, trace=trace)
    for e in ENGINES:
        assert avg2[e] == pytest.approx(avg[e], abs=0.02)


def test_utilisation_series_shape(swiglu_run):
    _, trace = swiglu_run
    u = nplot.utilisation_numbers(trace, bins=50)
    assert u["bins"] == 50 and len(u["times_ns"]) == 50
    for name in ENGINES + ("dma",):
        ser = u["series"][name]
        assert len(ser) == 50
        assert all(-1e-9 <= v <= 1 + 1e-9 for v in ser)
        # bin means reproduce the average
        assert sum(ser) / 50 == pytest.approx(u["average"][name], abs=1e-6)


def test_module_cli_swiglu(tmp_path):
    env = dict(os.environ)
    paths = [os.path.join(REPO_ROOT, "python"), os.path.join(REPO_ROOT, "build", "python")]
    env["PYTHONPATH"] = os.pathsep.join(paths + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["MPLBACKEND"] = "Agg"
    res = subprocess.run([sys.executable, "-m", "nsim.plot", SWIGLU, "--config", "trn2", "--out", str(tmp_path)],
                         capture_output=True, text=True, env=env, cwd=REPO_ROOT, timeout=600)
    assert res.returncode == 0, res.stderr
    _png_ok(str(tmp_path / "swiglu_roofline.png"))
    _png_ok(str(tmp_path / "swiglu_utilisation.png"))
    assert "swiglu" in res.stdout and "intensity" in res.stdout
