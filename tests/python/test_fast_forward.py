"""Fast-forward (docs/timing-model.md, "Fast-forward"; on by default where it applies, fast_forward=False /
--no-fast-forward for the full simulation): a timing-only run counts the middle iterations of a loop whose
iterations repeat instead of simulating them. A user relies on: the same stats as the full run for a steady loop,
the option on by default only where it applies and refused where asked for and it cannot apply, and the kernel
option reaching the simulator."""
import json
import os

import numpy as np
import pytest

from conftest import require_core  # noqa: E402

_core, ml_dtypes = require_core()

import nsim  # noqa: E402
from nsim import nki  # noqa: E402
import nsim.nki.isa as nisa  # noqa: E402
import nsim.nki.language as nl  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _long_softmax(n):
    """examples/softmax_2x128x512.json with its batch loop run n times (sequential, one HBM row)."""
    with open(os.path.join(ROOT, "examples", "softmax_2x128x512.json")) as f:
        k = json.load(f)
    loop = k["body"][0]["loop"]
    loop["stop"], loop["kind"] = n, "sequential"
    return json.loads(json.dumps(k).replace('"index": ["b",', '"index": [0,'))


def _flat(stats, prefix=""):
    out = {}
    for key, v in stats.items():
        if isinstance(v, dict) and "value" in v:
            out[prefix + key] = v["value"]
        elif isinstance(v, dict):
            out.update(_flat(v, prefix + key + "."))
    return out


def test_a_steady_loop_gives_the_full_runs_stats():
    k = nsim.load_kernel(_long_softmax(8000))  # 56,000 instructions
    _, full = k.simulate(timing_only=True, fast_forward=False)
    _, ff = k.simulate(timing_only=True, fast_forward=True)
    _, default = k.simulate(timing_only=True)  # on by default
    assert default.stats == ff.stats and default.lines == ff.lines
    assert full.stat("fast_forward.skipped_instructions") == 0
    assert ff.stat("fast_forward.skipped_instructions") > 30000
    a, b = _flat(full.stats), _flat(ff.stats)
    assert a.keys() == b.keys()
    assert {n: v for n, v in a.items() if not n.startswith("fast_forward.")} == \
        {n: v for n, v in b.items() if not n.startswith("fast_forward.")}
    assert ff.total_time_ns == full.total_time_ns
    assert ff.lines == full.lines


def test_the_option_is_refused_where_it_cannot_apply(tmp_path):
    k = _long_softmax(8)
    with pytest.raises(ValueError, match="timing_only"):
        nsim.simulate_json(k, fast_forward=True)
    with pytest.raises(ValueError, match="trace"):
        nsim.simulate_json(k, timing_only=True, fast_forward=True, trace=str(tmp_path / "t.json"))
    with pytest.raises(TypeError, match="fast_forward"):
        nsim.simulate_json(k, timing_only=True, fast_forward="yes")
    # By default it is simply off where it cannot apply: numerics, a trace.
    long, small = _long_softmax(2000), {"compiler.window": 128}  # (a small window: it repeats sooner)
    _, numerics = nsim.simulate_json(long, overrides=small)
    _, traced = nsim.simulate_json(long, overrides=small, timing_only=True, trace=str(tmp_path / "t.json"))
    _, timing = nsim.simulate_json(long, overrides=small, timing_only=True)
    assert numerics.stat("fast_forward.skipped_instructions") == traced.stat("fast_forward.skipped_instructions") == 0
    assert timing.stat("fast_forward.skipped_instructions") > 0
    assert numerics.total_time_ns == traced.total_time_ns == timing.total_time_ns


@nki.jit
def scale_rows(x):
    """A public-style NKI kernel: one [128, 512] tile per iteration, scaled on ScalarE and stored."""
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(x.shape[0] // 128):
        t = nl.load(x[i * 128:(i + 1) * 128, :])
        y = nl.multiply(t, 2.0)
        nl.store(out[i * 128:(i + 1) * 128, :], value=y)
    return out


def test_kernel_option_reaches_the_simulator():
    # 2,000 iterations of 3 instructions; a list-scheduler window of 128 instructions (compiler.window) lets
    # the repetition show within a few hundred iterations (2 x 128 / 3 = 86 repeating iterations per sample,
    # the samples 192 iterations apart: whole cycles of the scheduler's 64-admission height refresh). Each tile is
    # 64 KiB, one of the list scheduler's HBM chunks (smaller rows share chunks between iterations: skipped in whole
    # chunks, their states moved along; docs/timing-model.md).
    x = np.zeros((128 * 2000, 256), ml_dtypes.bfloat16)
    small = {"compiler.window": 128}
    _, full = scale_rows.options(timing_only=True, overrides=small, fast_forward=False).simulate(x)
    _, ff = scale_rows.options(timing_only=True, overrides=small).simulate(x)  # on by default
    assert ff.stat("fast_forward.skipped_instructions") > 4000  # of 6,000
    assert [(lp["function"], lp["instances"], lp["outcome"], lp["why"]) for lp in ff.fast_forward_loops] == [
        ("scale_rows", {"skipped": 1}, "skipped", "")]
    a, b = _flat(full.stats), _flat(ff.stats)
    assert sorted(n for n in a if a[n] != b[n]) == ["fast_forward.loops.skipped", "fast_forward.skipped_instructions"]
    with nsim.options(timing_only=True, overrides=small, fast_forward=False):
        _, ctx = scale_rows.simulate(x)
    assert ctx.stat("fast_forward.skipped_instructions") == 0 and ctx.stats == full.stats


def test_the_nki_tutorial_rmsnorm_is_skipped_across_the_schedulers_refreshes():
    # The Beta 1 tutorial RMSNorm as published (tests/python/kernels/beta1_rmsnorm.py), 8,000 row tiles of [128, 512]
    # bf16, 12 instructions per iteration. Its steps repeat every 4 iterations only between two refreshes of the
    # list scheduler's heights, and as a whole every 1,536 iterations (lcm(6, 512 / gcd(512, 11 admissions),
    # 8 / gcd(8, 12))): that period shows itself twice by iteration ~4,850, and one period is skipped (1,536 x 12
    # instructions). With periods of 1 to 8 iterations only, nothing was.
    from conftest import beta1_sample
    with beta1_sample("beta1_rmsnorm.py") as (mod, *_):
        a = np.broadcast_to(np.zeros((), ml_dtypes.bfloat16), (128 * 8000, 512))  # timing-only: never read
        g = np.zeros((1, 512), ml_dtypes.bfloat16)
        _, full = mod.nki_rmsnorm_kernel.options(timing_only=True, fast_forward=False).simulate(a, g)
        _, ff = mod.nki_rmsnorm_kernel.options(timing_only=True, fast_forward=True).simulate(a, g)
    assert ff.stat("fast_forward.skipped_instructions") == 1536 * 12
    a, b = _flat(full.stats), _flat(ff.stats)
    assert sorted(n for n in a if a[n] != b[n]) == ["fast_forward.loops.skipped", "fast_forward.skipped_instructions"]
    assert ff.lines == full.lines


@pytest.mark.skipif(not os.path.exists(__import__("conftest").NSIM_BIN), reason="nsim CLI not built")
def test_cli(tmp_path):
    import subprocess
    from conftest import NSIM_BIN

    kpath = tmp_path / "softmax_long.json"
    kpath.write_text(json.dumps(_long_softmax(8000)))

    def run(*args):
        return subprocess.run([NSIM_BIN, "run", str(kpath), *args], capture_output=True, text=True, timeout=120)

    for bad in ([], ["--timing-only", "--trace", str(tmp_path / "t.json"), "--trace-limit", "0"],
                ["--timing-only", "--instructions", str(tmp_path / "i.csv")], ["--timing-only", "--no-fast-forward"]):
        r = run("--fast-forward", *bad)
        assert r.returncode == 2 and "NSIM-E414" in r.stderr and "--fast-forward" in r.stderr, (bad, r.stderr)
    stats = {}
    for flag in (["--no-fast-forward"], [], ["--fast-forward"]):
        out = tmp_path / "stats{}.json".format(len(stats))
        r = run("--timing-only", "--quiet", "--stats", str(out), *flag)
        assert r.returncode == 0, r.stderr
        skipping = flag != ["--no-fast-forward"]  # on by default
        # the summary says what was not simulated, and how to simulate it
        assert ("counted as repeats" in r.stdout and "--no-fast-forward simulates each" in r.stdout) == skipping
        # ... and, per loop, what fast-forward made of it
        assert ("fast-forward    loop 0 (b): instances 1 skipped" in r.stdout) == skipping, r.stdout
        stats[len(stats)] = json.loads(out.read_text())
    full, ff = stats[0], stats[1]
    assert stats[2] == ff
    assert ff["instructions"] == full["instructions"] == 56000
    assert ff["stats"]["fast_forward"]["skipped_instructions"]["value"] > 30000
    assert ff["stats"]["total_time"] == full["stats"]["total_time"]
    assert ff["lines"] == full["lines"]


def test_a_trace_with_a_window_or_a_limit_skips_once_it_keeps_no_more_slices(tmp_path):
    # A trace of the start of a long run (a window ending early, or a slice limit) no longer costs the whole run:
    # iterations are skipped once the trace keeps no more slices (Simulator::trace_closed), and the trace file is
    # the one the run simulating every instruction writes, byte for byte (its slices, and its count of the slices
    # dropped). Without an end or a limit nothing is skipped, and the loop says the trace held it.
    long, small = _long_softmax(8000), {"compiler.window": 128}  # 56,000 instructions, 11.7 ms simulated
    for i, (kw, ext) in enumerate([({"trace_window": (None, 20000.0)}, "json"),
                                   ({"trace_window": (3000.0, 40000.0)}, "pftrace"),
                                   ({"trace_limit": 500}, "json"),
                                   ({"trace_limit": 400, "trace_window": (2000.0, None)}, "pftrace")]):
        paths, profs = [], []
        for ff in (False, None):
            paths.append(tmp_path / "t{}{}.{}".format(i, ff, ext))
            _, prof = nsim.simulate_json(long, overrides=small, timing_only=True, trace=str(paths[-1]),
                                         fast_forward=ff, **kw)
            profs.append(prof)
        full, skipped = profs
        assert full.stat("fast_forward.skipped_instructions") == 0
        assert skipped.stat("fast_forward.skipped_instructions") > 40000, kw
        a, b = _flat(full.stats), _flat(skipped.stats)
        assert {n: v for n, v in a.items() if not n.startswith("fast_forward.")} == \
            {n: v for n, v in b.items() if not n.startswith("fast_forward.")}
        assert full.lines == skipped.lines
        assert paths[0].read_bytes() == paths[1].read_bytes(), kw
        if ext == "json":  # (a partial trace that says what it dropped)
            marks = [e for e in json.loads(paths[1].read_text())["traceEvents"] if e.get("ph") == "i"]
            assert marks and marks[-1]["args"]["slices_dropped"] > 100000
    # A window without an end and no limit keeps slices to the end: nothing skipped, and the loop says why.
    _, prof = nsim.simulate_json(long, overrides=small, timing_only=True, trace=str(tmp_path / "w.json"),
                                 trace_window=(3000.0, None))
    assert prof.stat("fast_forward.skipped_instructions") == 0
    assert prof.stat("fast_forward.loops.traced") == 1
    # Asked for with a trace of every slice: refused.
    with pytest.raises(ValueError, match="trace_limit or trace_window"):
        nsim.simulate_json(long, timing_only=True, fast_forward=True, trace=str(tmp_path / "all.json"))


def test_cli_trace_limit_with_fast_forward(tmp_path):
    import subprocess
    from conftest import NSIM_BIN

    kpath = tmp_path / "softmax_long.json"
    kpath.write_text(json.dumps(_long_softmax(8000)))
    outs = []
    for flag in ("--no-fast-forward", "--fast-forward"):
        t = tmp_path / "t{}.json".format(len(outs))
        r = subprocess.run([NSIM_BIN, "run", str(kpath), "--timing-only", "--quiet", "-p", "compiler.window=128",
                            "--trace", str(t), "--trace-limit", "300", flag], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        outs.append((t.read_bytes(), r.stdout))
    assert outs[0][0] == outs[1][0]
    assert "counted as repeats" in outs[1][1] and "counted as repeats" not in outs[0][1]


def test_cli_lists_five_loops_the_skipped_first_then_counts_the_rest(tmp_path):
    import subprocess
    from conftest import NSIM_BIN

    ms = {"op": "memset", "engine": "vector", "dst": {"tensor": "t"}, "imm": [1.0]}

    def loop(var, n):
        return {"loop": {"var": var, "start": 0, "stop": n, "kind": "sequential", "body": [ms]}}

    # Six loops of 100 iterations (followed, but too few left to skip), one of 4 (too short to follow), then one of
    # 20,000 that skips: it is listed first, then four of the six, then the two left are counted.
    body = [{"alloc": {"name": "t", "buffer": "sbuf", "dtype": "float32", "shape": [128, 4]}}]
    body += [loop("i%d" % j, 100) for j in range(6)] + [loop("s", 4), loop("big", 20000)]
    kpath = tmp_path / "eight.json"
    kpath.write_text(json.dumps({"nsim_kernel": 1, "name": "eight", "tensors": [], "body": body}))
    r = subprocess.run([NSIM_BIN, "run", str(kpath), "--timing-only", "--fast-forward", "--quiet"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    ff = [x for x in r.stdout.splitlines() if x.startswith("fast-forward ")]
    assert "counted as repeats" in ff[0]
    # (a kernel.json loop without "loc": its index and variable)
    assert ff[1] == "fast-forward    loop 7 (big): instances 1 skipped"
    assert ff[2:6] == ["fast-forward    loop {} (i{}): instances 1 too_few_left".format(j, j) for j in range(4)]
    assert ff[6] == "fast-forward    ... and 2 more loops"
    assert ff[7].startswith("fast-forward    1 loop (1 instance) too short to follow")
    assert len(ff) == 8


@pytest.mark.parametrize("limit,skips", [(["--max-instructions", "100000"], True),
                                         (["--max-sim-time", "5000000"], True),
                                         (["--max-instructions", "8000"], False)])
def test_a_run_limit_inside_a_skipped_span_stops_where_the_full_run_does(tmp_path, limit, skips):
    # 200,000 memsets in one loop, the run stopped by a limit in the middle: the skip ends before the limit, so
    # the partial run's stats are the full run's (before, the skip jumped over it: --max-instructions 100000
    # stopped at 195,586 instructions, --max-sim-time 5 ms at 13.04 ms). A limit before the first span ends: not
    # skipped, outcome "limit".
    import subprocess
    from conftest import NSIM_BIN

    ms = {"op": "memset", "engine": "vector", "dst": {"tensor": "t"}, "imm": [1.0]}
    kpath = tmp_path / "long.json"
    kpath.write_text(json.dumps({"nsim_kernel": 1, "name": "long", "tensors": [], "body": [
        {"alloc": {"name": "t", "buffer": "sbuf", "dtype": "float32", "shape": [128, 4]}},
        {"loop": {"var": "i", "start": 0, "stop": 200000, "kind": "sequential", "body": [ms]}}]}))
    stats = []
    for flag in (["--no-fast-forward"], []):
        out = tmp_path / "stats{}.json".format(len(flag))
        r = subprocess.run([NSIM_BIN, "run", str(kpath), "--timing-only", "--quiet", "--stats", str(out), *limit, *flag],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and "NSIM-E416" in r.stderr, r.stderr
        stats.append(json.loads(out.read_text()))
    full, ff = (_flat(x["stats"]) for x in stats)
    assert full["fast_forward.skipped_instructions"] == 0
    assert (ff["fast_forward.skipped_instructions"] > 0) == skips
    assert ff["fast_forward.loops.limit"] == (0 if skips else 1)
    assert {n: v for n, v in ff.items() if not n.startswith("fast_forward.")} == \
        {n: v for n, v in full.items() if not n.startswith("fast_forward.")}
    assert stats[0]["lines"] == stats[1]["lines"] and stats[0]["instructions"] == stats[1]["instructions"]


@nki.jit
def decay_rows(x):
    """A public-style recurrence through HBM: row i + 1 of the output is computed from row i of it."""
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nl.store(out[0:128, :], value=nl.load(x[0:128, :]))
    for i in nl.sequential_range(x.shape[0] // 128 - 1):
        prev = nl.load(out[i * 128:(i + 1) * 128, :])
        nxt = nl.add(nl.multiply(prev, 0.5), nl.load(x[(i + 1) * 128:(i + 2) * 128, :]))
        nl.store(out[(i + 1) * 128:(i + 2) * 128, :], value=nxt)
    return out


def test_a_loop_not_skipped_says_why(tmp_path):
    # 2,000 iterations, each reading the row the one before it wrote: a skip would lose that dependency, so the
    # loop is not followed, and the outcome says so (the stat in Python; the CLI names the loop and the reason).
    x = np.broadcast_to(np.zeros((), ml_dtypes.bfloat16), (128 * 2000, 256))  # timing-only: never read, no memory
    _, ff = decay_rows.options(timing_only=True, fast_forward=True).simulate(x)
    assert ff.stat("fast_forward.skipped_instructions") == 0
    assert ff.stat("fast_forward.loops.recurrence") == 1
    assert ff.stat("fast_forward.loops.skipped") == 0
    # Per loop source line: the loop of decay_rows (its `for` line), its outcome and the reason.
    why = ff.stats["fast_forward"]["loops"]["recurrence"]["description"]  # "loop instances " + the reason
    [loop] = ff.fast_forward_loops
    assert loop["file"].endswith("test_fast_forward.py") and "nl.sequential_range" in open(loop["file"]).readlines(
        )[loop["line"] - 1]
    assert loop["instances"] == {"recurrence": 1} and loop["outcome"] == "recurrence"
    assert loop["why"] == why.replace("loop instances ", "")
    _, full = decay_rows.options(timing_only=True, fast_forward=False).simulate(x)
    assert full.fast_forward_loops == []
    from conftest import NSIM_BIN
    if not os.path.exists(NSIM_BIN):
        return
    import subprocess
    kpath = tmp_path / "decay.json"
    kpath.write_text(json.dumps(decay_rows.options(timing_only=True).trace(x).kernel))
    r = subprocess.run([NSIM_BIN, "run", str(kpath), "--timing-only", "--fast-forward"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("fast-forward    loop at "))
    assert "test_fast_forward.py" in line and line.endswith(": instances 1 recurrence"), line
    assert why.replace("loop instances ", "") in r.stdout, r.stdout
    # Not asked for (on by default) and nothing skipped: the summary says nothing of it.
    r = subprocess.run([NSIM_BIN, "run", str(kpath), "--timing-only"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "fast-forward" not in r.stdout, r.stdout


def test_sweep_with_fast_forward():
    # An architecture study over HBM bandwidth of a long loop: the same kernel times either way, in one
    # process (jobs=1), with the iterations counted where they repeat.
    import nsim.sweep as sw

    k = _long_softmax(3000)
    grid = {"hbm.bw": ["45GB/s", "2900GB/s"]}
    full = sw.sweep(k, grid, jobs=1, fast_forward=False)
    ff = sw.sweep(k, grid, jobs=1)  # on by default
    assert [r["status"] for r in ff] == ["ok", "ok"]
    assert [r["total_time"] for r in ff] == [r["total_time"] for r in full]
    assert ff[0]["total_time"] > ff[1]["total_time"]  # the slower HBM takes longer
