"""Stats in the AWS profiler's vocabulary (neuroncore.md 5.1, docs/profiling.md "Stats"): identities
that must hold on a real kernel (examples/swiglu.json), Profile.stats_table() and
`nsim run --stats-table`."""
import re
import json
import math
import os
import subprocess

import pytest

_core = pytest.importorskip("nsim._core", exc_type=ImportError)
try:
    _core.version()
except Exception as e:  # the extension is not built
    pytest.skip("nsim._core not usable: {}".format(e), allow_module_level=True)

import nsim  # noqa: E402

ENGINES = ("tensor", "vector", "scalar", "gpsimd", "sync")
# Stats added for the profiler vocabulary (all must be in the JSON and in the table).
NEW_STATS = (
    "total_exec_time", "total_active_time", "total_active_time_percent",
    "engine.matmul_instruction_count", "engine.scalar.activate_instruction_count",
    "engine.scalar.activate_instruction_time",
    "dma.active_time", "dma.active_time_percent", "dma.static_active_time", "dma.hardware_dynamic_active_time",
    "dma.software_dynamic_active_time", "dma.dma_queue_count",
    "flops.hfu_estimated_percent", "flops.mfu_max_achievable_estimated_percent", "flops.adjusted_hardware",
    "flops.adjusted_transpose", "flops.mm_arithmetic_intensity", "flops.peak_flops_bandwidth_ratio",
    "memory.mbu_estimated_percent",
)


@pytest.fixture(scope="module")
def swiglu(examples_dir):
    _, prof = nsim.simulate_json(os.path.join(examples_dir, "swiglu.json"), timing_only=True)
    return prof


def test_new_stats_exist_with_units(swiglu):
    for name in NEW_STATS:
        v = swiglu.stat(name)
        assert isinstance(v, (int, float)) and math.isfinite(v), name
    assert swiglu.stats["dma"]["active_time"]["unit"] == "ns"
    assert swiglu.stats["flops"]["mm_arithmetic_intensity"]["unit"] == "flops/byte"
    assert swiglu.stats["memory"]["mbu_estimated_percent"]["unit"] == "%"


def test_active_time_identities(swiglu):
    s = swiglu.stat
    total, active = s("total_time"), s("total_active_time")
    eps = 1e-6
    for e in ENGINES:
        assert active >= s("engine.{}.active_time".format(e)) - eps, e
    assert active >= s("dma.active_time") - eps
    assert active <= total + eps
    assert s("total_exec_time") <= total + eps
    assert s("total_active_time_percent") == pytest.approx(100 * active / total)
    # DMA: the union over engines covers the busiest engine and is at most the sum over engines.
    per_engine = [v["active_time"]["value"] for k, v in swiglu.stats["dma"].items() if k.startswith("engine")]
    assert s("dma.active_time") >= s("dma.max_engine_active_time") - eps
    assert s("dma.max_engine_active_time") == pytest.approx(max(per_engine))
    assert s("dma.active_time") <= sum(per_engine) + eps
    classes = [s("dma.{}_active_time".format(c)) for c in ("static", "hardware_dynamic", "software_dynamic")]
    assert max(classes) <= s("dma.active_time") + eps <= sum(classes) + 2 * eps
    assert 1 <= s("dma.dma_queue_count") <= s("dma.transfer_count")


def test_flops_identities(swiglu):
    s = swiglu.stat
    hw, tr, model = s("flops.hardware"), s("flops.transpose"), s("flops.model")
    hbm = s("memory.hbm_read_bytes") + s("memory.hbm_write_bytes")
    assert hw > 0 and tr > 0 and hbm > 0  # swiglu has matmuls, PE transposes and HBM traffic
    assert s("flops.hfu_estimated_percent") >= s("flops.mfu_estimated_percent")
    assert s("flops.hfu_estimated_percent") == pytest.approx(
        s("flops.mfu_estimated_percent") * hw / model)
    assert s("flops.mm_arithmetic_intensity") == pytest.approx((hw - tr) / hbm)
    peak, bw = s("flops.tensor_peak_per_s"), 362.5e9  # trn2 hbm.bw
    assert s("flops.peak_flops_bandwidth_ratio") == pytest.approx(peak / bw)
    assert s("flops.mfu_max_achievable_estimated_percent") == pytest.approx(
        min(100.0, 100 * (model / hbm) / (peak / bw)))
    assert s("memory.mbu_estimated_percent") == pytest.approx(100 * hbm / (s("total_time") * 1e-9) / bw)
    # swiglu's matmuls are bf16: adjusted = raw.
    assert s("flops.adjusted_hardware") == pytest.approx(hw)
    assert s("flops.adjusted_transpose") == pytest.approx(tr)


def test_instruction_counts(swiglu):
    s = swiglu.stat
    per_engine = sum(s("engine.{}.instruction_count".format(e)) for e in ENGINES)
    assert s("engine.matmul_instruction_count") == s("engine.tensor.opcode.multiply_moving.count")
    assert s("engine.scalar.activate_instruction_count") == s("opcode.activation.count")
    # Per (engine, opcode) counts add up to each engine's count and to the per-opcode totals.
    by_opcode = {}
    for e in ENGINES:
        ops = swiglu.stats["engine"][e].get("opcode", {})
        assert sum(v["count"]["value"] for v in ops.values()) == s("engine.{}.instruction_count".format(e))
        for op, v in ops.items():
            by_opcode[op] = by_opcode.get(op, 0) + v["count"]["value"]
    assert by_opcode == {op: v["count"]["value"] for op, v in swiglu.stats["opcode"].items()}
    assert sum(by_opcode.values()) == per_engine
    # The stats JSON of nsim run --stats still counts instructions per engine only.
    assert json.loads(swiglu.to_stats_json())["instructions"] == per_engine


def test_stats_table_python(swiglu):
    text = swiglu.stats_table()
    assert text.startswith("stat ")
    for group in ("summary", "engine.tensor", "engine.scalar", "dma", "memory", "flops"):
        assert "\n{}\n".format(group) in text
    for name in NEW_STATS:
        assert "  {} ".format(name) in text, name
    row = next(l for l in text.splitlines() if l.strip().startswith("memory.hbm_read_bytes "))
    assert "917,504" in row and "bytes" in row and "HBM bytes read by DMA" in row


def test_stats_table_cli(nsim_bin, examples_dir, swiglu):
    r = subprocess.run([nsim_bin, "run", os.path.join(examples_dir, "swiglu.json"), "--timing-only", "--stats-table"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert out.index("total time") < out.index("\nstat ")  # after the summary
    table = out[out.index("\nstat ") + 1:]
    for name in NEW_STATS:
        assert "  {} ".format(name) in table, name
    # The same text as Profile.stats_table() (the CLI formats the registry, Python the JSON of it).
    assert table == swiglu.stats_table()
    # Without the flag: no table.
    r = subprocess.run([nsim_bin, "run", os.path.join(examples_dir, "swiglu.json"), "--timing-only"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "\nstat " not in r.stdout
    assert "--stats-table" in subprocess.run([nsim_bin, "run", "--help"], capture_output=True, text=True).stdout


def _union_ps(intervals):
    total, lo, hi = 0, None, None
    for s, e in sorted(intervals):
        if hi is None or s > hi:
            if hi is not None:
                total += hi - lo
            lo, hi = s, e
        else:
            hi = max(hi, e)
    return total + (hi - lo if hi is not None else 0)


@pytest.mark.parametrize("kernel", ["swiglu.json", "flash_attention.json"])
def test_active_time_unions_match_the_trace(kernel, examples_dir, tmp_path):
    # total_active_time = union of every slice on the engine and DMA-engine tracks of the trace (the
    # queue tracks span setup + data and are not activity); dma.active_time = union of dma.e<k> slices.
    trace = tmp_path / "t.json"
    _, prof = nsim.simulate_json(os.path.join(examples_dir, kernel), timing_only=True, trace=str(trace))
    events = json.loads(trace.read_text())["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"}
    slices = [e for e in events if e.get("ph") == "X"]

    def ps(e):  # exact picoseconds (ts and dur are microseconds with 6 decimals)
        return round(e["ts"] * 1e6), round((e["ts"] + e["dur"]) * 1e6)

    every = [ps(e) for e in slices if not re.fullmatch(r"q[A-Za-z]+IO\d+", names[e["tid"]])]
    dma = [ps(e) for e in slices if names[e["tid"]].startswith("dma.e")]
    assert prof.stat("total_active_time") == pytest.approx(_union_ps(every) / 1000, abs=2e-3)
    assert prof.stat("dma.active_time") == pytest.approx(_union_ps(dma) / 1000, abs=2e-3)
