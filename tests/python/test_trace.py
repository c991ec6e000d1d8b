"""The Chrome/Perfetto trace of examples/flash_attention.json: a schema check of every trace event,
slice durations per track against the stats, and the --trace-limit / --trace-window options (CLI
and Python)."""
import json
import re
import os
import subprocess
from collections import defaultdict

import pytest

from conftest import EXAMPLES_DIR, REPO_ROOT

nsim = pytest.importorskip("nsim")
if not getattr(nsim, "core_available", False):
    pytest.skip("nsim core (_nsim extension) not built", allow_module_level=True)

FLASH = os.path.join(EXAMPLES_DIR, "flash_attention.json")
ENGINES = ("tensor", "vector", "scalar", "gpsimd", "sync")  # tids 0..4
REL = 1e-6


def _nsim_binary():
    """The CLI next to the _nsim extension in use (build-*/python/_nsim*.so -> build-*/nsim), else
    $NSIM_BIN, else build/nsim."""
    cands = []
    if os.environ.get("NSIM_BIN"):
        cands.append(os.environ["NSIM_BIN"])
    try:
        from nsim._core import _nsim as ext
        ext_file = getattr(ext, "__file__", None)
        if ext_file:
            cands.append(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(ext_file))), "nsim"))
    except ImportError:  # pragma: no cover
        pass
    cands.append(os.path.join(REPO_ROOT, "build", "nsim"))
    for c in cands:
        if os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


NSIM_BIN = _nsim_binary()
needs_cli = pytest.mark.skipif(NSIM_BIN is None, reason="the nsim CLI is not built")


def run_cli(*args):
    return subprocess.run([NSIM_BIN, *map(str, args)], capture_output=True, text=True, timeout=300)


def load_events(path):
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    assert isinstance(data, dict) and isinstance(data.get("traceEvents"), list)
    return data["traceEvents"]


def x_events(events):
    return [e for e in events if e.get("ph") == "X"]


def to_ps(us):
    """Trace timestamps are microseconds with 6 decimals = whole picoseconds."""
    return int(round(us * 1e6))


def key(e):
    return (e["tid"], to_ps(e["ts"]), to_ps(e["dur"]), e["name"], e["args"].get("src"))


@pytest.fixture(scope="module")
def flash(tmp_path_factory):
    """(events, Profile) of flash_attention on trn2, timing-only, unfiltered."""
    path = tmp_path_factory.mktemp("trace") / "flash.trace.json"
    _, prof = nsim.simulate_json(FLASH, config="trn2", timing_only=True, trace=path)
    return load_events(path), prof


def thread_names(events):
    return {e["tid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"}


def is_num(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


# --------------------------------------------------------------------------------------------------
# Schema
# --------------------------------------------------------------------------------------------------


def test_every_event_passes_the_schema(flash):
    events, prof = flash
    assert {e.get("ph") for e in events} == {"M", "X", "s", "f", "C"}  # no filter -> no instant event
    names = thread_names(events)
    for e in events:
        if e["ph"] == "M":
            assert {"pid", "tid", "name", "args"} <= e.keys(), e
            assert isinstance(e["pid"], int) and isinstance(e["tid"], int), e
            assert isinstance(e["args"], dict), e
    slices = x_events(events)
    assert len(slices) > 250  # the limit tests below keep 100 and 250
    for e in slices:
        assert is_num(e["ts"]) and e["ts"] >= 0, e
        assert is_num(e["dur"]) and e["dur"] >= 0, e
        assert isinstance(e["tid"], int) and e["tid"] in names, e
        assert isinstance(e["pid"], int), e
        assert isinstance(e["name"], str) and e["name"], e
        args = e["args"]
        assert isinstance(args, dict) and "src" in args, e
        track = names[e["tid"]]
        if e["tid"] < len(ENGINES) and e["name"] == "ACT_TABLE_LOAD":  # ScalarE's table load before an activation
            assert track == "scalar" and set(args) == {"src", "table_load_of"}, e
        elif e["tid"] < len(ENGINES):
            assert {"src", "opcode", "instr", "ready_ns", "index", "bytes"} <= args.keys(), e
            assert args["opcode"] == e["name"], e
            assert isinstance(args["bytes"], int) and args["bytes"] > 0, e
            if not args["opcode"].startswith("dma"):
                assert is_num(args["flops"]) and args["flops"] >= 0, e
        else:
            assert track.startswith(("dma.e", "q")), e
            assert "bytes" in args and isinstance(args["bytes"], int) and args["bytes"] > 0, e
    # Every slice ends within the run, and sources point into the kernel.
    total_ps = to_ps(prof.total_time_ns / 1e3)
    assert max(to_ps(e["ts"]) + to_ps(e["dur"]) for e in slices) <= total_ps
    assert any(e["args"]["src"] for e in slices)


def test_flow_arrows_join_each_waiter_to_the_slice_it_waited_for(flash):
    events, _ = flash
    names = thread_names(events)
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    ends = {e["id"]: e for e in events if e["ph"] == "f"}
    assert starts and set(starts) == set(ends)  # every arrow has both ends, ids unique
    slices = x_events(events)
    by_start = {}  # a background LoadStationary may start with the matmul before it: a list per start
    for e in slices:
        by_start.setdefault((e["tid"], to_ps(e["ts"])), []).append(e)
    for fid, f in ends.items():
        s = starts[fid]
        assert f["bp"] == "e" and s["tid"] in names and f["tid"] in names
        assert (s["tid"], to_ps(s["ts"])) in by_start  # the arrow starts where the producer's slice starts
        # the consumer names the producer and its wait
        consumers = [c for c in by_start[(f["tid"], to_ps(f["ts"]))] if "waited_for" in c["args"]]
        assert len(consumers) == 1, by_start[(f["tid"], to_ps(f["ts"]))]
        consumer = consumers[0]
        assert to_ps(s["ts"]) <= to_ps(consumer["ts"])
        assert consumer["args"]["waited_for"] >= 0 and consumer["args"]["wait_ns"] > 0, consumer


def test_tracks(flash):
    events, _ = flash
    names = thread_names(events)
    assert [names[t] for t in range(len(ENGINES))] == list(ENGINES)
    n_dma = sum(1 for n in names.values() if n.startswith("dma.e"))
    assert n_dma == 16  # trn2: dma.engines
    for k in range(n_dma):
        assert names[len(ENGINES) + k] == "dma.e{}".format(k)
    # Queue tracks carry the profiler's names: q<trigger engine>IO<k>, k < compiler.dma_queues_per_trigger.
    queues = {t: n for t, n in names.items() if t >= len(ENGINES) + n_dma}
    assert queues and all(re.fullmatch(r"q(Sync|Scalar|GpSimd|Vector)IO[0-3]", n) for n in queues.values()), queues
    used = {e["tid"] for e in x_events(events)}
    assert set(queues) <= used  # queue tracks are declared when first used


def test_occupancy_counter_tracks(flash):
    """SBUF and PSUM bytes per partition held by live tiles (first use to last use of each tile
    allocation, shared storage counted once): a counter track each, starting and ending at 0,
    never above the memory."""
    events, prof = flash
    for mem in ("sbuf", "psum"):
        c = sorted((e for e in events if e.get("ph") == "C" and e["name"] == mem + " bytes/partition in use"),
                   key=lambda e: e["ts"])
        assert c, mem
        values = [e["args"]["bytes"] for e in c]
        assert values[0] == 0 and values[-1] == 0
        cap = 16384 if mem == "psum" else 229376  # trn2: psum.banks x psum.bank_bytes, sbuf.bytes_per_partition
        assert 0 < max(values) <= cap
        assert all(v >= 0 for v in values)
        assert max(e["ts"] for e in c) <= prof.total_time_ns / 1e3 + 1e-9


def test_slices_are_sorted_by_start(flash):
    events, _ = flash
    ts = [to_ps(e["ts"]) for e in x_events(events)]
    assert ts == sorted(ts)


# --------------------------------------------------------------------------------------------------
# Trace against the stats
# --------------------------------------------------------------------------------------------------


def test_engine_track_durations_equal_instruction_time(flash):
    """Per engine track, the summed slice durations = engine.<e>.instruction_time (sum of instruction
    durations; a DMA instruction contributes its trigger on the issuing engine; an activation that loads its function
    table first is two slices, ACT_TABLE_LOAD and the activation, of its duration together)."""
    events, prof = flash
    dur_ps = defaultdict(int)
    count = defaultdict(int)
    for e in x_events(events):
        dur_ps[e["tid"]] += to_ps(e["dur"])
        count[e["tid"]] += 1
    for tid, eng in enumerate(ENGINES):
        want = prof.stat("engine.{}.instruction_time".format(eng))
        assert dur_ps[tid] / 1e3 == pytest.approx(want, rel=REL, abs=1e-9), eng
        loads = prof.stat("engine.scalar.act_table_load_count") if eng == "scalar" else 0
        assert count[tid] == prof.stat("engine.{}.instruction_count".format(eng)) + loads, eng
    assert sum(dur_ps[t] for t in range(len(ENGINES))) > 0


def test_dma_engine_track_durations_equal_active_time(flash):
    """Per dma.e<k> track, the summed slice durations = dma.engine<k>.active_time. The stats have no
    separate DMA busy/instruction time: active_time is the union of the engine's packet intervals,
    which equals the sum because one DMA engine serves its packets one at a time (checked below)."""
    events, prof = flash
    names = thread_names(events)
    per = defaultdict(list)
    for e in x_events(events):
        if names[e["tid"]].startswith("dma.e"):
            per[int(names[e["tid"]][len("dma.e"):])].append(e)
    assert per
    for k in range(16):
        sl = sorted(per.get(k, []), key=lambda e: to_ps(e["ts"]))
        total = sum(to_ps(e["dur"]) for e in sl)
        assert total / 1e3 == pytest.approx(prof.stat("dma.engine{}.active_time".format(k)), rel=REL, abs=1e-9), k
        assert sum(e["args"]["bytes"] for e in sl) == prof.stat("dma.engine{}.bytes".format(k)), k
        assert len(sl) == prof.stat("dma.engine{}.packets".format(k)), k
        for a, b in zip(sl, sl[1:]):  # no overlap on one engine: sum == union
            assert to_ps(a["ts"]) + to_ps(a["dur"]) <= to_ps(b["ts"]), (k, a, b)


def test_dma_queue_tracks_carry_every_transfer(flash):
    events, prof = flash
    names = thread_names(events)
    q = [e for e in x_events(events) if re.fullmatch(r"q[A-Za-z]+IO\d+", names[e["tid"]])]
    assert len(q) == prof.stat("dma.transfer_count")
    assert sum(e["args"]["bytes"] for e in q) == prof.stat("dma.transfer_total_bytes")


# --------------------------------------------------------------------------------------------------
# --trace-limit / --trace-window
# --------------------------------------------------------------------------------------------------


def overlaps(e, t0_ps, t1_ps):
    s, d = to_ps(e["ts"]), to_ps(e["dur"])
    if t1_ps is not None and s >= t1_ps:
        return False
    return s + d > t0_ps or s >= t0_ps


def instant(events):
    inst = [e for e in events if e.get("ph") == "i"]
    assert len(inst) == 1, inst
    e = inst[0]
    assert e["s"] == "g" and is_num(e["ts"]) and e["ts"] >= 0 and e["name"]
    return e


@pytest.fixture(scope="module")
def cli_full(tmp_path_factory):
    if NSIM_BIN is None:
        pytest.skip("the nsim CLI is not built")
    path = tmp_path_factory.mktemp("cli") / "full.json"
    r = run_cli("run", FLASH, "--timing-only", "--trace", path)
    assert r.returncode == 0, r.stderr
    return load_events(path)


@needs_cli
def test_cli_trace_limit_keeps_the_100_earliest(tmp_path, cli_full):
    full = x_events(cli_full)
    path = tmp_path / "limited.json"
    r = run_cli("run", FLASH, "--timing-only", "--trace", path, "--trace-limit", 100)
    assert r.returncode == 0, r.stderr
    events = load_events(path)
    lim = x_events(events)
    assert len(lim) == 100
    assert [key(e) for e in lim] == [key(e) for e in full[:100]]
    assert max(to_ps(e["ts"]) for e in lim) <= min(to_ps(e["ts"]) for e in full[100:])
    inst = instant(events)
    assert inst["args"]["slices_written"] == 100
    assert inst["args"]["dropped_by_limit"] == len(full) - 100
    assert inst["args"]["dropped_by_window"] == 0
    assert inst["args"]["max_slices"] == 100
    assert to_ps(inst["ts"]) == to_ps(full[100]["ts"])  # where the missing slices begin
    # The metadata (all tracks) is kept.
    assert thread_names(events) == thread_names(cli_full)


@needs_cli
@pytest.mark.parametrize("window", ["5000:12000", "5000:", ":12000"])  # (the kernel takes 14.7 us)
def test_cli_trace_window_keeps_overlapping_slices(tmp_path, cli_full, window):
    full = x_events(cli_full)
    lo, hi = window.split(":")
    t0 = int(float(lo or 0) * 1e3)
    t1 = int(float(hi) * 1e3) if hi else None
    path = tmp_path / "window.json"
    r = run_cli("run", FLASH, "--timing-only", "--trace", path, "--trace-window", window)
    assert r.returncode == 0, r.stderr
    events = load_events(path)
    got = [key(e) for e in x_events(events)]
    want = [key(e) for e in full if overlaps(e, t0, t1)]
    assert got == want
    assert 0 < len(got) < len(full)
    # Kept whole: some kept slice sticks out of the window on a bounded side.
    if lo:
        assert any(to_ps(e["ts"]) < t0 for e in x_events(events))
    inst = instant(events)
    assert inst["args"]["dropped_by_window"] == len(full) - len(got)
    assert inst["args"]["dropped_by_limit"] == 0
    assert inst["args"]["window_start_ns"] == pytest.approx(float(lo or 0))
    assert inst["args"]["window_end_ns"] == (pytest.approx(float(hi)) if hi else None)


@needs_cli
@pytest.mark.parametrize("args", [
    ["--trace-window", "abc"], ["--trace-window", "5000"], ["--trace-window", ":"], ["--trace-window", "1:2:3"],
    ["--trace-window", "-5:10"], ["--trace-window", "20000:5000"], ["--trace-window", "nan:"],
    ["--trace-window", "inf:"], ["--trace-window", "5000x:"], ["--trace-window"],
    ["--trace-limit", "-1"], ["--trace-limit", "ten"], ["--trace-limit"],
])
def test_cli_bad_trace_options_are_usage_errors(tmp_path, args):
    r = run_cli("run", FLASH, "--timing-only", "--trace", tmp_path / "t.json", *args)
    assert r.returncode == 2, (args, r.stdout, r.stderr)
    assert r.stderr.startswith("NSIM-E414"), (args, r.stderr)


@needs_cli
def test_cli_help_documents_the_options():
    r = run_cli("run", "--help")
    assert r.returncode == 0 and "--trace-limit N" in r.stdout and "--trace-window START_NS:END_NS" in r.stdout


def test_python_limit_and_window_match_the_cli_semantics(tmp_path, flash):
    events, prof = flash
    full = x_events(events)
    p = tmp_path / "lim.json"
    _, prof2 = nsim.simulate_json(FLASH, config="trn2", timing_only=True, trace=p, trace_limit=250)
    assert prof2.total_time_ns == prof.total_time_ns  # filtering changes the trace only
    assert [key(e) for e in x_events(load_events(p))] == [key(e) for e in full[:250]]
    p = tmp_path / "win.json"
    nsim.simulate_json(FLASH, config="trn2", timing_only=True, trace=p, trace_window=(1000.5, None))
    assert [key(e) for e in x_events(load_events(p))] == [key(e) for e in full if overlaps(e, 1000500, None)]
    p = tmp_path / "both.json"
    nsim.simulate_json(FLASH, config="trn2", timing_only=True, trace=p, trace_window=(None, 8000), trace_limit=10)
    ev = load_events(p)
    assert [key(e) for e in x_events(ev)] == [key(e) for e in full if overlaps(e, 0, 8000000)][:10]
    assert instant(ev)["args"]["slices_written"] == 10
    for bad in ((5, 1), (-1, 3), (1, 2, 3), "abc", (float("nan"), None)):
        with pytest.raises(ValueError):
            nsim.simulate_json(FLASH, timing_only=True, trace=tmp_path / "x.json", trace_window=bad)
    with pytest.raises(ValueError):
        nsim.simulate_json(FLASH, timing_only=True, trace=tmp_path / "x.json", trace_limit=-1)


@needs_cli
@pytest.mark.parametrize("name,extra", [("all.pftrace", ["--trace-limit", "0"]), ("lim.pftrace", ["--trace-limit", "300"]),
                                        ("win.pftrace", ["--trace-window", "4000:9000"]), ("all.json", [])])
def test_cli_trace_is_the_same_compressed_beside_the_simulation(tmp_path, name, extra):
    """With two host threads the protobuf trace's chunks are compressed and written on a thread of the writer's own
    while the simulation goes on; with one (NSIM_NUM_THREADS=1) in place: the same file either way."""
    files = []
    for threads in ("1", "2"):
        path = tmp_path / threads / name
        path.parent.mkdir()
        env = dict(os.environ, NSIM_NUM_THREADS=threads)
        r = subprocess.run([NSIM_BIN, "run", FLASH, "--timing-only", "--quiet", "--trace", str(path), *extra],
                           capture_output=True, text=True, timeout=300, env=env)
        assert r.returncode == 0, r.stderr
        files.append(path.read_bytes())
    assert len(files[0]) > 1000
    assert files[0] == files[1]


def test_zero_slices_is_valid_json(tmp_path, flash):
    _, prof = flash
    p = tmp_path / "empty.json"
    nsim.simulate_json(FLASH, config="trn2", timing_only=True, trace=p,
                       trace_window=(prof.total_time_ns + 1000, None))
    events = load_events(p)
    assert x_events(events) == []
    assert thread_names(events)  # the tracks are still declared
    inst = instant(events)
    assert inst["args"]["slices_written"] == 0 and inst["args"]["dropped_by_window"] > 0
