"""One bound verdict (engines/bounds.h): `nsim run`, `nsim analyze`, `Profile.bound` and the roofline
report the same bound for every example kernel, and the verdict follows its definition."""
import json
import re
import subprocess
from pathlib import Path

import pytest

from conftest import NSIM_BIN, require_core  # noqa: E402

_core, _ = require_core()

import nsim  # noqa: E402
from nsim import plot as nplot  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
NSIM = Path(NSIM_BIN)
EXAMPLES = sorted(ROOT.glob("examples/*.json")) + sorted(ROOT.glob("examples/library/*.json"))
RESOURCES = ("tensor", "vector", "scalar", "gpsimd", "sync", "dma", "hbm")


def _cli(*args):
    r = subprocess.run([str(NSIM), *map(str, args)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.skipif(not NSIM.exists(), reason="nsim CLI not built")
@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_run_analyze_and_roofline_agree(path):
    run_bound = re.search(r"^bound\s+(\w+)", _cli("run", "--timing-only", path), re.M).group(1)
    analyze_bound = json.loads(_cli("analyze", path, "--json", "-"))["bottleneck"]
    _, prof = nsim.simulate_json(str(path), timing_only=True)
    assert run_bound == analyze_bound == prof.bound == nplot.roofline(prof)["bound"]


def test_verdict_follows_its_definition():
    """The largest `bound.<resource>.time`, unless it is busy under analysis.latency_bound_percent of the
    kernel time: then "latency". Raising the threshold to 100% makes every kernel latency-bound, 0% none. DMA engines
    paced by HBM tie with it (this softmax on trn2: 16 x 23 B/ns above hbm.bw's 362.5 GB/s): the verdict is hbm."""
    path = ROOT / "examples" / "softmax_4x256x1024.json"
    for threshold in (0, 50, 100):
        _, prof = nsim.simulate_json(str(path), timing_only=True,
                                     overrides={"analysis.latency_bound_percent": threshold})
        times = {r: prof.stat("bound.{}.time".format(r)) for r in RESOURCES}
        top = max(times, key=times.get)
        assert top == "dma" and times["hbm"] == pytest.approx(times["dma"], rel=1e-6)  # the tie
        top = "hbm"
        share = 100 * times[top] / prof.total_time_ns
        b = prof.bounds()
        assert [x["name"] for x in b["bounds"]][0] == top
        assert b["top_share_percent"] == pytest.approx(share)
        assert prof.bound == ("latency" if share < threshold else top)
    # the HBM bound is the traffic at the bandwidth the DMA engines reach: min(362.5 GB/s, 16 x 23 B/ns)
    hbm = prof.stat("memory.hbm_read_bytes") + prof.stat("memory.hbm_write_bytes")
    assert prof.stat("bound.hbm.time") == pytest.approx(hbm / 362.5)


def test_hbm_bound_charges_stores_at_the_store_rate():
    """A copy kernel (as many bytes stored as loaded) on trn2 with hbm.bw doubled: the DMA engines then limit
    loads to 16 x 23 B/ns and stores to x dma.store_bw_factor (1.16) of that, so the `hbm` bound is
    r / 368 + w / 426.9 ns per byte; charged at the load rate, as before 2026-12-05, it exceeded the kernel's time."""
    import numpy as np
    import nsim.nki as nki
    import nsim.nki.isa as nisa
    import nsim.nki.language as nl

    @nki.jit
    def copy(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        for i in nl.affine_range(a.shape[0] // 128):
            t = nl.ndarray((128, a.shape[1]), a.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=t, src=a[i * 128:(i + 1) * 128, :])
            nisa.dma_copy(dst=out[i * 128:(i + 1) * 128, :], src=t)
        return out

    _, prof = copy.options(timing_only=True, overrides={"hbm.bw": "725GB/s"}).simulate(
        np.zeros((2048, 4096), np.float32))
    st = {n: prof.stat(n) for n in ("memory.hbm_read_bytes", "memory.hbm_write_bytes", "bound.hbm.time", "total_time")}
    r, w = st["memory.hbm_read_bytes"], st["memory.hbm_write_bytes"]
    assert r == w == 2048 * 4096 * 4
    engines = 16 * 23.0  # B/ns: dma.engines x dma.engine_bw (trn2)
    want = max((r + w) / 725.0, r / engines + w / (engines * 1.16))
    assert st["bound.hbm.time"] == pytest.approx(want, rel=1e-9)
    assert st["bound.hbm.time"] <= st["total_time"]
    assert (r + w) / engines > st["total_time"]  # what the old rule charged: above the kernel's time
