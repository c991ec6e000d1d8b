"""Progress of long runs (issue 12 item 6): the CLI's stderr line and simulate_json's ``progress=``.

The simulator checks the clock every 65,536 instructions and reports once a run took 2 s, then about
once a second; NSIM_PROGRESS_INTERVAL=<seconds> replaces both (0: at every check), so that these
tests see progress on kernels that finish in well under a second.
"""
import json
import os
import re
import subprocess

import numpy as np
import pytest

import nsim
from conftest import NSIM_BIN

N_MEMSETS = 200_000  # three clock checks (every 65,536 instructions)


def long_kernel(n=N_MEMSETS):
    return {"nsim_kernel": 1, "name": "long", "tensors": [], "body": [
        {"alloc": {"name": "t", "buffer": "sbuf", "dtype": "float32", "shape": [128, 4]}},
        {"loop": {"var": "i", "start": 0, "stop": n, "kind": "sequential", "body": [
            {"op": "memset", "engine": "vector", "dst": {"tensor": "t"}, "imm": [1.0]}]}}]}


@pytest.mark.skipif(not os.path.exists(NSIM_BIN), reason="build/nsim not built")
def test_cli_progress_line_format_and_quiet(tmp_path):
    path = tmp_path / "long.json"
    path.write_text(json.dumps(long_kernel()))
    env = {**os.environ, "NSIM_PROGRESS_INTERVAL": "0"}
    # Every instruction simulated (--no-fast-forward; fast-forward would skip most of the loop).
    r = subprocess.run([NSIM_BIN, "run", str(path), "--timing-only", "--no-fast-forward"], capture_output=True,
                       text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = [x for x in r.stderr.splitlines() if x.strip()]  # "\r"-separated (text mode reads it as a newline)
    # One line per check: 65,536, 131,072 and 196,608 instructions lowered.
    counts = [float(m.group(1)) for m in (re.match(r"nsim: ([0-9.]+) M instructions, ([0-9.]+) us simulated, "
                                                   r"([0-9.]+) M instructions/s\s*$", x) for x in lines) if m]
    assert len(counts) == len(lines) == 3, r.stderr
    assert counts == sorted(counts) and counts[0] == pytest.approx(0.07, abs=0.01)
    assert r.stderr.endswith("\n")
    q = subprocess.run([NSIM_BIN, "run", str(path), "--timing-only", "--no-fast-forward", "--quiet"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert q.returncode == 0 and q.stderr == "" and q.stdout == r.stdout
    # Without the variable a sub-second run shows nothing.
    plain = {k: v for k, v in os.environ.items() if k != "NSIM_PROGRESS_INTERVAL"}
    s = subprocess.run([NSIM_BIN, "run", str(path), "--timing-only"], capture_output=True, text=True, env=plain,
                       timeout=120)
    assert s.returncode == 0 and "M instructions" not in s.stderr


@pytest.mark.skipif(not os.path.exists(NSIM_BIN), reason="build/nsim not built")
def test_cli_progress_of_a_run_fast_forward_cannot_shorten(tmp_path):
    # 60 x 60 x 56 memsets: as long a run, but no loop of 64 iterations for fast-forward to follow: every
    # instruction is simulated and reported, and the summary says nothing of fast-forward (not asked for).
    ms = {"op": "memset", "engine": "vector", "dst": {"tensor": "t"}, "imm": [1.0]}
    body = [ms]
    for var, n in (("c", 56), ("b", 60), ("a", 60)):
        body = [{"loop": {"var": var, "start": 0, "stop": n, "kind": "sequential", "body": body}}]
    path = tmp_path / "nested.json"
    path.write_text(json.dumps({"nsim_kernel": 1, "name": "nested", "tensors": [], "body": [
        {"alloc": {"name": "t", "buffer": "sbuf", "dtype": "float32", "shape": [128, 4]}}] + body}))
    env = {**os.environ, "NSIM_PROGRESS_INTERVAL": "0"}
    r = subprocess.run([NSIM_BIN, "run", str(path), "--timing-only"], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 0 and "M instructions" in r.stderr and "hint" not in r.stderr, r.stderr
    counts = [float(m.group(1)) for m in (re.match(r"nsim: ([0-9.]+) M instructions", x)
                                          for x in r.stderr.splitlines()) if m]
    assert len(counts) == 3 and "fast-forward" not in r.stdout, (r.stderr, r.stdout)


def test_simulate_json_progress_callback_counts_increase(monkeypatch):
    monkeypatch.setenv("NSIM_PROGRESS_INTERVAL", "0")
    calls = []
    _, prof = nsim.simulate_json(long_kernel(), timing_only=True, fast_forward=False,
                                 progress=lambda n, ns: calls.append((n, ns)))
    counts = [n for n, _ in calls]
    times = [ns for _, ns in calls]
    assert counts == [65536, 131072, 196608, N_MEMSETS]  # each check, then the whole run
    assert times == sorted(times) and times[-1] == pytest.approx(prof.total_time_ns)


def test_progress_goes_on_across_iterations_fast_forward_skips(monkeypatch):
    # A skip jumps the instruction count past the checks at multiples of 65,536: the first check after it reports
    # the count reached (before, every check of a skipped span was lost and a run skipping most of its loop
    # reported nothing at all).
    monkeypatch.setenv("NSIM_PROGRESS_INTERVAL", "0")
    calls = []
    _, prof = nsim.simulate_json(long_kernel(), timing_only=True, fast_forward=True,
                                 progress=lambda n, ns: calls.append((n, ns)))
    skipped = prof.stat("fast_forward.skipped_instructions")
    assert skipped > 65536  # the checks at 65,536 and 131,072 fall in the skipped span
    counts = [n for n, _ in calls]
    assert len(counts) >= 2 and counts[-1] == N_MEMSETS, counts
    assert counts == sorted(set(counts)) and counts[0] > 65536, counts
    assert [ns for _, ns in calls] == sorted(ns for _, ns in calls)


@pytest.mark.skipif(not os.path.exists(NSIM_BIN), reason="build/nsim not built")
def test_cli_progress_with_fast_forward(tmp_path):
    path = tmp_path / "long.json"
    path.write_text(json.dumps(long_kernel()))
    env = {**os.environ, "NSIM_PROGRESS_INTERVAL": "0"}
    r = subprocess.run([NSIM_BIN, "run", str(path), "--timing-only", "--fast-forward"], capture_output=True,
                       text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "counted as repeats" in r.stdout
    counts = [float(m.group(1)) for m in (re.match(r"nsim: ([0-9.]+) M instructions", x)
                                          for x in r.stderr.splitlines()) if m]
    assert counts and counts == sorted(counts) and counts[-1] >= 0.13, r.stderr


def test_simulate_json_progress_is_silent_for_short_runs():
    calls = []
    nsim.simulate_json(long_kernel(1000), timing_only=True, progress=lambda n, ns: calls.append(n))
    assert calls == []


def test_simulate_json_progress_true_and_bad_values(monkeypatch, capsys):
    monkeypatch.setenv("NSIM_PROGRESS_INTERVAL", "0")
    nsim.simulate_json(long_kernel(), timing_only=True, progress=True)
    err = capsys.readouterr().err
    try:
        import tqdm  # noqa: F401  (a bar instead of the line)
    except ImportError:
        assert re.search(r"nsim: 0\.20 M instructions, [0-9.]+ us simulated", err) and err.endswith("\n")
    else:
        assert "instr" in err
    with pytest.raises(TypeError, match="progress must be"):
        nsim.simulate_json(long_kernel(10), timing_only=True, progress="yes")
    # An exception raised by the callback stops the run and reaches the caller unchanged.
    def boom(n, ns):
        raise KeyError("stop here")
    with pytest.raises(KeyError, match="stop here"):
        nsim.simulate_json(long_kernel(), timing_only=True, progress=boom)


def test_kernel_progress_covers_a_long_trace(monkeypatch, capsys):
    """``progress=True`` on a Python kernel also shows the tracing of a long kernel (the public flash attention
    sample at seq 16384 traces for about a minute before anything is simulated): ``nsim: tracing NAME: N
    statements, T s`` every 4,096 statements traced once due, ended by a newline; nothing without it."""
    monkeypatch.setenv("NSIM_PROGRESS_INTERVAL", "0")
    from nsim import nki
    import nsim.nki.language as nl

    @nki.jit
    def chain(x):
        out = nl.ndarray((128, 4), nl.float32, buffer=nl.shared_hbm)
        t = nl.load(x)
        for _ in range(4200):  # a Python loop: every step traced (its tiles reuse two storages)
            t = nl.add(t, 1.0)
        nl.store(out, t)
        return out

    x = np.zeros((128, 4), np.float32)
    chain.options(timing_only=True, progress=True)(x)
    err = capsys.readouterr().err
    lines = [s for s in err.replace("\r", "\n").splitlines() if s.strip()]
    assert [s for s in lines if s.startswith("nsim: tracing")] == \
        [s for s in lines if re.match(r"nsim: tracing chain: 4,096 statements, [0-9.]+ s\s*$", s)] != []
    assert err.endswith("\n")
    chain.options(timing_only=True)(x)
    assert "tracing" not in capsys.readouterr().err
