"""The `nsim` command line: exit codes, help, config, inputs/outputs, stats and trace files."""
import json
import re
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from conftest import ADD_ONE, NSIM_BIN

ROOT = Path(__file__).resolve().parents[2]
NSIM = Path(NSIM_BIN)  # $NSIM_BIN or build/nsim (conftest)

pytestmark = pytest.mark.skipif(not NSIM.exists(), reason="{} not built (run `make build`)".format(NSIM))


def nsim(*args, cwd=None):
    return subprocess.run([str(NSIM), *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=120)


@pytest.fixture
def kernel(tmp_path):
    p = tmp_path / "add_one.json"
    p.write_text(json.dumps(ADD_ONE))
    return p


def test_version_and_help():
    r = nsim("--version")
    assert r.returncode == 0 and r.stdout.startswith("nsim ")
    assert nsim("--help").returncode == 0
    for cmd in ("run", "check", "disasm", "config"):
        r = nsim(cmd, "--help")
        assert r.returncode == 0 and "usage: nsim " + cmd in r.stdout
    r = nsim()
    assert r.returncode == 2


def test_usage_errors_exit_2_with_a_code():
    for args in (["frobnicate"], ["run"], ["run", "k.json", "--seed", "x"], ["run", "k.json", "--bogus"]):
        r = nsim(*args)
        assert r.returncode == 2, args
        assert "NSIM-E414" in r.stderr, (args, r.stderr)


def test_config_prints_the_effective_config():
    r = nsim("config", "trn2", "-p", "hbm.bw=725GB/s")
    assert r.returncode == 0
    assert "name: trn2" in r.stdout and "725GB/s" in r.stdout
    assert nsim("config", "inf2").stdout == nsim("config", "trn1").stdout
    r = nsim("config", "trn2", "-p", "tensor.pe_rowz=1")
    assert r.returncode == 2 and "NSIM-E101" in r.stderr
    r = nsim("config", "trn9")
    assert r.returncode == 2 and "NSIM-E104" in r.stderr


def test_missing_and_malformed_kernels(tmp_path):
    r = nsim("run", tmp_path / "missing.json")
    assert r.returncode == 2 and "NSIM-E413" in r.stderr
    bad = tmp_path / "bad.json"
    bad.write_text('{"nsim_kernel": 1, "body": [')
    r = nsim("check", bad)
    assert r.returncode == 2 and "NSIM-E401" in r.stderr


def test_run_with_npz_inputs_matches_numpy(tmp_path, kernel):
    x = np.random.default_rng(1).standard_normal((256, 64)).astype(np.float32)
    np.savez(tmp_path / "in.npz", x=x)
    r = nsim("run", kernel, "--inputs", tmp_path / "in.npz", "--outputs", tmp_path / "out",
             "--stats", tmp_path / "stats.json", "--trace", tmp_path / "trace.json")
    assert r.returncode == 0, r.stderr
    assert "total time" in r.stdout and "bound" in r.stdout
    y = np.load(tmp_path / "out" / "y.npy")
    np.testing.assert_array_equal(y, x + 1)
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert stats["kernel"] == "add_one" and stats["config"] == "trn2"
    assert stats["stats"]["total_time"]["value"] > 0
    srcs = {l["src"]: l["instructions"] for l in stats["lines"]}
    assert srcs == {"add_one.py:3": 2, "add_one.py:4": 2, "add_one.py:5": 2}
    assert "busiest source lines" in r.stdout
    cfg_yaml = (tmp_path / "stats.json.config.yaml").read_text()  # the effective config, every section
    assert cfg_yaml.startswith("analysis:") and "\nclock:\n" in cfg_yaml and "\nhbm:\n" in cfg_yaml
    trace = json.loads((tmp_path / "trace.json").read_text())
    slices = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert slices and all({"ts", "dur", "tid", "name", "args"} <= e.keys() for e in slices)
    assert any(e["args"].get("src", "").startswith("add_one.py:4") for e in slices)


def test_inputs_from_a_directory_and_timing_only(tmp_path, kernel):
    x = np.arange(256 * 64, dtype=np.float32).reshape(256, 64)
    (tmp_path / "in").mkdir()
    np.save(tmp_path / "in" / "x.npy", x)
    r = nsim("run", kernel, "--inputs", tmp_path / "in", "--outputs", tmp_path / "out", "--stats", tmp_path / "a.json")
    assert r.returncode == 0, r.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "out" / "y.npy"), x + 1)
    r = nsim("run", kernel, "--timing-only", "--stats", tmp_path / "b.json")
    assert r.returncode == 0, r.stderr
    a = json.loads((tmp_path / "a.json").read_text())["stats"]["total_time"]["value"]
    b = json.loads((tmp_path / "b.json").read_text())["stats"]["total_time"]["value"]
    assert a == b


def test_bad_inputs_are_user_errors(tmp_path, kernel):
    np.savez(tmp_path / "wrong_shape.npz", x=np.zeros((128, 64), np.float32))
    r = nsim("run", kernel, "--inputs", tmp_path / "wrong_shape.npz")
    assert r.returncode == 2 and "NSIM-E413" in r.stderr and "(256, 64)" in r.stderr
    np.savez_compressed(tmp_path / "compressed.npz", x=np.zeros((256, 64), np.float32))
    r = nsim("run", kernel, "--inputs", tmp_path / "compressed.npz")
    assert r.returncode == 2 and "np.savez" in r.stderr
    np.savez(tmp_path / "extra.npz", x=np.zeros((256, 64), np.float32), z=np.zeros(3))
    r = nsim("run", kernel, "--inputs", tmp_path / "extra.npz")
    assert r.returncode == 2 and "'z'" in r.stderr


def test_check_and_disasm(kernel):
    r = nsim("check", kernel, "--config", "trn1")
    assert r.returncode == 0 and "ok" in r.stdout
    r = nsim("disasm", kernel)
    assert r.returncode == 0
    lines = [l for l in r.stdout.splitlines() if not l.startswith("#")]
    assert len(lines) == 6  # 2 iterations x (load, add, store)
    assert "dma_copy.sync" in lines[0] and "add_one.py:3" in lines[0]
    assert "# tile t" in r.stdout and "bufs 2" in r.stdout
    # The compiled stream: issue order with each instruction's start time, not decreasing per engine.
    starts = [float(re.search(r"@ ([0-9.]+) ns", l).group(1)) for l in lines]
    assert starts[0] == 0.0
    po = nsim("disasm", kernel, "-p", "compiler.schedule=program_order")
    po_lines = [l for l in po.stdout.splitlines() if not l.startswith("#")]
    ops = [l.split()[1].split(".")[0] for l in po_lines]
    assert ops == ["dma_copy", "tensor_scalar", "dma_copy"] * 2  # the kernel's order
    assert sorted(l.split()[1].split(".")[0] for l in lines) == sorted(ops)
    r = nsim("disasm", kernel, "--limit", "2")
    assert len([l for l in r.stdout.splitlines() if not l.startswith("#")]) == 2


def test_instruction_table_csv(tmp_path, kernel):
    r = nsim("run", kernel, "--timing-only", "--instructions", tmp_path / "instrs.csv", "--stats", tmp_path / "s.json")
    assert r.returncode == 0, r.stderr
    rows = (tmp_path / "instrs.csv").read_text().splitlines()
    header = rows[0].split(",")
    assert header[:6] == ["index", "opcode", "engine", "start_ns", "end_ns", "duration_ns"]
    body = [dict(zip(header, line.split(","))) for line in rows[1:]]
    assert len(body) == 6  # 2 iterations x (load, add, store)
    # Rows come in issue order (the compiler model may issue the second load before the first add).
    assert sorted(b["opcode"] for b in body) == ["dma_copy"] * 4 + ["tensor_scalar"] * 2
    assert [int(b["index"]) for b in body] == list(range(6))
    adds = [b for b in body if b["opcode"] == "tensor_scalar"]
    assert all(b["src_file"] == "add_one.py" and b["src_line"] == "4" for b in adds)
    assert body[0]["bytes"] == str(128 * 64 * 4)
    total = json.loads((tmp_path / "s.json").read_text())["stats"]["total_time"]["value"]
    assert max(float(b["end_ns"]) for b in body) == pytest.approx(total, abs=1e-2)


def test_run_notes_hbm_bandwidth_capped_by_the_dma_engines(kernel):
    # trn2: 16 DMA engines x 23 B/ns = 368 B/ns; hbm.bw 362.5 B/ns is below it, 725 B/ns above it.
    r = nsim("run", kernel, "--timing-only")
    assert r.returncode == 0 and "note" not in r.stdout
    r = nsim("run", kernel, "--timing-only", "-p", "hbm.bw=725GB/s")
    assert r.returncode == 0
    assert "capped by the DMA engines" in r.stdout and "368.0 B/ns" in r.stdout
    # stores move at 368 x dma.store_bw_factor 1.16 = 426.9 B/ns: between the two, only stores gain
    assert "stores 426.9 B/ns" in r.stdout
    r = nsim("run", kernel, "--timing-only", "-p", "hbm.bw=400GB/s")
    assert r.returncode == 0
    assert "speeds up only stores" in r.stdout and "up to 426.9 B/ns" in r.stdout
    assert "changes nothing" not in r.stdout


def test_long_runs_show_progress_on_stderr_unless_quiet(tmp_path):
    # 7 M timing-only memsets take ~3 s (~2.4 M instructions/s on the 2-core machine): past the 2 s
    # threshold the CLI prints a progress line on stderr; --quiet turns it off; stdout is unchanged.
    k = {"nsim_kernel": 1, "name": "long", "tensors": [], "body": [
        {"alloc": {"name": "t", "buffer": "sbuf", "dtype": "float32", "shape": [128, 4]}},
        {"loop": {"var": "i", "start": 0, "stop": 7000000, "kind": "sequential", "body": [
            {"op": "memset", "engine": "vector", "dst": {"tensor": "t"}, "imm": [1.0]}]}}]}
    path = tmp_path / "long.json"
    path.write_text(json.dumps(k))
    r = nsim("run", path, "--timing-only")
    assert r.returncode == 0, r.stderr
    if "M instructions/s" not in r.stderr:
        pytest.skip("the run finished in under 2 s on this machine: no progress line to check")
    assert re.search(r"nsim: [0-9.]+ M instructions, [0-9.]+ us simulated", r.stderr)
    q = nsim("run", path, "--timing-only", "--quiet")
    assert q.returncode == 0 and q.stderr == "" and q.stdout == r.stdout


def test_a_python_script_is_explained_not_parsed_as_json(tmp_path):
    """`nsim analyze foo.py` says the CLI takes kernel.json and how to run a script, instead of a JSON
    syntax error at 1:1."""
    script = tmp_path / "foo.py"
    script.write_text("import nki\n")
    for cmd in ("run", "analyze", "check", "disasm"):
        r = nsim(cmd, script)
        assert r.returncode == 2 and "NSIM-E414" in r.stderr, (cmd, r.stderr)
        assert "python -m nsim run" in r.stderr and "to_json" in r.stderr and "JSON syntax" not in r.stderr


def test_python_m_nsim_help_and_finding_the_cli_outside_a_venv(tmp_path, monkeypatch):
    """`python -m nsim --help` describes the Beta-1 dialect as it is (no stale "not implemented"), and
    `python -m nsim cli` finds the binary in the interpreter's scripts directory even when PATH does not
    name it (an installed wheel used without activating its venv)."""
    import sys
    import sysconfig
    import nsim.__main__ as m

    r = subprocess.run([sys.executable, "-m", "nsim", "--help"], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert r.returncode == 0 and "neuronxcc.nki" in r.stdout and "NOT implemented" not in r.stdout
    scripts = tmp_path / "venv" / "bin"
    scripts.mkdir(parents=True)
    exe = scripts / "nsim"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    monkeypatch.setattr(m, "__file__", str(tmp_path / "site" / "nsim" / "__main__.py"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", "")
    real = sysconfig.get_path
    monkeypatch.setattr(sysconfig, "get_path", lambda name, *a, **k: str(scripts) if name == "scripts" else real(name, *a, **k))
    assert m._find_cli() == str(exe)


# ---- the CLI11 declarations: one per command, its options and its help (issue 15)

COMMAND_OPTIONS = {
    "run": ["-c,--config NAME|FILE", "-p,--param KEY=VALUE", "--inputs DIR|FILE", "--seed N", "--outputs DIR",
            "--raw-outputs", "--trace FILE", "--trace-limit N", "--trace-window START_NS:END_NS", "--stats FILE",
            "--stats-table", "--timing-only", "--check", "--max-instructions N", "--max-sim-time T", "--lnc N", "-q,--quiet",
            "--instructions FILE", "--dma FILE"],
    "check": ["-c,--config NAME|FILE", "-p,--param KEY=VALUE"],
    "disasm": ["-c,--config NAME|FILE", "-p,--param KEY=VALUE", "--limit N"],
    "analyze": ["-c,--config NAME|FILE", "-p,--param KEY=VALUE", "--json FILE", "--lines N"],
    "diff": ["-c,--config NAME|FILE", "-p,--param KEY=VALUE", "--config-b NAME|FILE", "-P,--param-b KEY=VALUE",
             "--lines N", "--json FILE"],
    "config": ["-c,--config NAME|FILE", "-p,--param KEY=VALUE"],
}


@pytest.mark.parametrize("cmd", sorted(COMMAND_OPTIONS))
def test_each_command_help_lists_its_own_options(cmd):
    r = nsim(cmd, "--help")
    assert r.returncode == 0 and r.stdout.startswith("usage: nsim " + cmd), r.stdout
    for opt in COMMAND_OPTIONS[cmd]:
        assert "  " + opt in r.stdout, (cmd, opt)
    # and only its own: an option of another command is not listed
    others = {o.split()[0] for c, opts in COMMAND_OPTIONS.items() if c != cmd for o in opts}
    for opt in others - {o.split()[0] for o in COMMAND_OPTIONS[cmd]}:
        assert "  " + opt + " " not in r.stdout and "  " + opt + "\n" not in r.stdout, (cmd, opt)


def test_main_help_lists_every_command():
    r = nsim("--help")
    assert r.returncode == 0 and r.stdout.startswith("usage: nsim")
    for cmd in list(COMMAND_OPTIONS) + ["plot", "sweep"]:
        assert re.search(r"^  {}\s+\S".format(cmd), r.stdout, re.M), cmd


@pytest.mark.parametrize("args, says", [
    (["check", "K", "--trace", "t.json"], "nsim check --help"),       # an option of `run` only
    (["disasm", "K", "--json", "-"], "nsim disasm --help"),           # of analyze and diff only
    (["run", "K", "--limit", "3"], "nsim run --help"),                # of disasm only
    (["run", "K", "--bogus"], "--bogus"),
    (["run", "K", "K"], "not expected"),
    (["run", "K", "-p"], "--param"),
    (["run", "K", "--seed", "-1"], "--seed expects a non-negative integer"),
    (["run", "K", "--seed", "0x10"], "--seed expects a non-negative integer"),
    (["diff", "K"], "B is required"),
    (["--bogus"], "unknown option '--bogus'"),
    (["rn", "K"], "did you mean 'run'"),
])
def test_bad_usage_is_e414_exit_2_naming_the_command(kernel, args, says):
    r = nsim(*[kernel if a == "K" else a for a in args])
    assert r.returncode == 2, (args, r.stdout, r.stderr)
    assert r.stderr.startswith("NSIM-E414: ") and says in r.stderr, (args, r.stderr)


def test_repeated_options_accumulate_and_values_may_follow_the_positionals(kernel):
    r = nsim("config", "-p", "hbm.bw=725GB/s", "trn1", "-p", "dma.engine_bw=10GB/s")
    assert r.returncode == 0, r.stderr
    assert "name: trn1" in r.stdout and "725GB/s" in r.stdout and "10GB/s" in r.stdout
    r = nsim("run", "-p", "hbm.bw=725GB/s", kernel, "--timing-only", "--seed", "1", "--seed", "2")  # last wins
    assert r.returncode == 0, r.stderr


def _keys(d):
    return list(d.keys())


def test_json_outputs_keep_their_keys(tmp_path, kernel):
    """The JSON files the CLI writes (now through nlohmann/json) parse with Python's json and keep the
    keys, in the order, that nsim.Profile, nsim.analysis, nsim.plot and nsim diff read."""
    stats, trace = tmp_path / "s.json", tmp_path / "t.json"
    r = nsim("run", kernel, "--stats", stats, "--trace", trace, "--timing-only")
    assert r.returncode == 0, r.stderr
    s = json.loads(stats.read_text())
    assert _keys(s) == ["kernel", "config", "timing_only", "instructions", "lines", "stats"]
    assert s["timing_only"] is True and isinstance(s["instructions"], int)
    assert all(_keys(l) == ["src", "instructions", "instruction_time_ns"] for l in s["lines"]) and s["lines"]
    leaf = s["stats"]["engine"]["vector"]["active_time"]
    assert _keys(leaf) == ["value", "unit", "description"] and leaf["unit"] == "ns"
    assert isinstance(s["stats"]["engine"]["vector"]["instruction_count"]["value"], int)

    t = json.loads(trace.read_text())
    assert _keys(t) == ["displayTimeUnit", "traceEvents"] and t["displayTimeUnit"] == "ns"
    ev = t["traceEvents"]
    assert ev[0] == {"ph": "M", "pid": 1, "tid": 0, "name": "process_name", "args": {"name": "NeuronCore (trn2)"}}
    assert {"ph": "M", "pid": 1, "tid": 1, "name": "thread_name", "args": {"name": "vector"}} in ev
    x = [e for e in ev if e["ph"] == "X"]
    assert x and all(_keys(e) == ["ph", "pid", "tid", "ts", "dur", "name", "args"] for e in x)
    instr = [e for e in x if "opcode" in e["args"]]
    assert instr and all(_keys(e["args"])[:5] == ["opcode", "instr", "src", "index", "ready_ns"] for e in instr)
    assert all(_keys(e["args"])[-1] == "bytes" or _keys(e["args"])[-2:] == ["bytes", "flops"] for e in instr)
    pieces = [e for e in x if "descriptors" in e["args"]]
    assert pieces and all(_keys(e["args"]) == ["bytes", "descriptors", "queue", "src"] for e in pieces)
    queues = [e for e in x if "setup_start_ns" in e["args"]]
    assert queues and all(_keys(e["args"]) == ["bytes", "setup_start_ns", "data_start_ns", "src"] for e in queues)

    r = nsim("analyze", kernel, "--json", "-")
    assert r.returncode == 0, r.stderr
    a = json.loads(r.stdout)
    assert _keys(a) == ["kernel", "config", "total_time_ns", "instructions", "bottleneck", "top_share_percent",
                        "tensor_useful_ns", "bounds", "idle", "critical_path", "findings"]
    assert all(_keys(b) == ["name", "ns", "what"] for b in a["bounds"])
    assert all(_keys(i) == ["engine", "busy_ns", "wait_ns", "other_wait_ns", "tail_ns", "waited_on"] for i in a["idle"])
    assert _keys(a["critical_path"]) == ["available", "by_track", "lines"]

    r = nsim("diff", stats, kernel, "--json", "-")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert _keys(d) == ["a", "b", "total_time_ns", "engines", "stats", "lines"]
    assert _keys(d["a"]) == ["label", "kernel", "config", "instructions"]
    assert _keys(d["total_time_ns"]) == ["a", "b", "delta", "ratio", "percent"]
    assert d["total_time_ns"]["delta"] == 0 and d["total_time_ns"]["ratio"] == 1
    assert all(_keys(l) == ["src", "status", "instruction_time_ns", "instructions"] for l in d["lines"])


def test_cli_error_prints_the_fix(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"nsim_kernel": 1, "name": "k", "tensors": [], "body": [{"op": "no_such_op"}]}')
    r = nsim("run", bad)
    assert r.returncode == 2
    first, fix = r.stderr.splitlines()[:2]
    code = first.split(":", 1)[0]
    from nsim import _errors
    assert fix == "  fix: " + _errors.BY_CODE[code]["hint"]


def _double_row_matmul(dtype):
    """A hand-written kernel.json: one nc_matmul in perf_mode double_row ([128, 2, 128] stationary, [128, 2, 512]
    moving, both of `dtype`) at mm.py:7."""
    def tile(name, buffer, dt, shape):
        return {"alloc": {"name": name, "buffer": buffer, "dtype": dt, "shape": shape}}
    return {"nsim_kernel": 1, "name": "double_row", "tensors": [], "body": [
        tile("st", "sbuf", dtype, [128, 256]), tile("mv", "sbuf", dtype, [128, 1024]),
        tile("ps", "psum", "float32", [128, 512]),
        {"op": "memset", "engine": "vector", "dst": "st", "imm": [1.0]},
        {"op": "memset", "engine": "vector", "dst": "mv", "imm": [1.0]},
        {"op": "nc_matmul", "dst": "ps", "stationary": "st", "moving": "mv", "flags": ["double_row"],
         "loc": {"file": "mm.py", "line": 7}}]}


def test_kernel_json_matmul_dtype_rules(tmp_path):
    """nc_matmul's dtype rules (nki-api.md 2.1, isa::matmul_dtype_rule) hold for kernel.json as for Python: a bf16
    double_row matmul, which the cost model would time at twice the hardware's rate, exits 2 with E302 at its line;
    fp8 runs on trn2; on trn1 (no double-row mode, tensor.fp8_double_row false) it is E313, unless a what-if
    config turns the mode on."""
    bad, good = tmp_path / "bf16.json", tmp_path / "fp8.json"
    bad.write_text(json.dumps(_double_row_matmul("bfloat16")))
    good.write_text(json.dumps(_double_row_matmul("float8_e4m3")))
    r = nsim("run", bad, "--timing-only")
    assert r.returncode == 2 and "NSIM-E302" in r.stderr and "mm.py:7" in r.stderr, r.stderr
    assert "double_row takes fp8" in r.stderr and "bfloat16" in r.stderr
    assert nsim("run", good, "--timing-only").returncode == 0
    r = nsim("run", good, "--timing-only", "--config", "trn1")
    assert r.returncode == 2 and "NSIM-E313" in r.stderr and "mm.py:7" in r.stderr, r.stderr
    r = nsim("run", good, "--timing-only", "--config", "trn1", "-p", "tensor.fp8_double_row=true")
    assert r.returncode == 0, r.stderr


def test_summary_names_the_config_file_and_the_overrides(tmp_path):
    """The summary's first line names the config as the run used it: a custom YAML file by its stem (a file
    inheriting trn2 without a `name:` was shown as trn2), and the -p overrides (shown as the bare preset before)."""
    cfg = tmp_path / "fast_hbm.yaml"
    cfg.write_text("preset: trn2\nhbm:\n  bw: 725GB/s\n")
    r = nsim("run", "examples/softmax_2x128x512.json", "--timing-only", "--config", cfg)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == "kernel softmax_2x128x512 on fast_hbm: 14 instructions"
    r = nsim("run", "examples/softmax_2x128x512.json", "--timing-only", "-p", "hbm.bw=725GB/s", "-p", "dma.engine_bw=30B/ns")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == ("kernel softmax_2x128x512 on trn2 with 2 overrides (hbm.bw=725GB/s, "
                                        "dma.engine_bw=30B/ns): 14 instructions")


def _copy_kernel(dtype, cols):
    """y = x + 1 (floats) or y = x (integers) over [256, cols], as ADD_ONE."""
    k = json.loads(json.dumps(ADD_ONE))
    k["name"] = "copy_" + dtype
    for t in k["tensors"]:
        t["dtype"], t["shape"] = dtype, [256, cols]
    k["body"][0]["loop"]["body"][0]["alloc"].update(dtype=dtype, shape=[128, cols])
    if dtype != "float32":
        del k["body"][0]["loop"]["body"][2]  # (no add: the values pass through)
    return k


def test_seeded_inputs_are_bell_shaped_deterministic_and_fast_to_make(tmp_path):
    # Inputs not given are generated from --seed: each element a function of the seed, the tensor and its index
    # (frontend/inputs.cpp), made on every host thread with the same values. Before, one std::mt19937_64 drew
    # std::normal_distribution values one after the other: a 2 GiB input took ~25 s (a fuzz "hang").
    k = tmp_path / "k.json"
    k.write_text(json.dumps(_copy_kernel("float32", 8192)))  # 2 M elements: several blocks, shared out
    outs = []
    for env, seed in (({}, 7), ({"NSIM_NUM_THREADS": "1"}, 7), ({}, 8)):
        out = tmp_path / "o{}".format(len(outs))
        r = subprocess.run([str(NSIM), "run", str(k), "--seed", str(seed), "--outputs", str(out)], capture_output=True,
                           text=True, timeout=120, env=dict(os.environ, **env))
        assert r.returncode == 0, r.stderr
        outs.append(np.load(out / "y.npy") - 1)
    x = outs[0]
    np.testing.assert_array_equal(x, outs[1])  # the same values on one thread
    assert not np.array_equal(x, outs[2])      # another seed, other values
    # Mean 0, variance 1, bell-shaped (the Irwin-Hall sum of four uniforms, scaled): within +-2 sqrt(3), and about
    # 68 % within one standard deviation (67.1 % for this sum, 68.3 % for a normal).
    n = x.size
    assert abs(x.mean()) < 5 / np.sqrt(n) and abs(x.var() - 1) < 0.01
    assert np.abs(x).max() <= 2 * np.sqrt(3) and np.abs(x).max() > 3.0
    assert 0.66 < np.mean(np.abs(x) < 1) < 0.68
    # Neighbouring elements, blocks (4096 elements each) and rows are independent: no shift repeats values.
    f = x.ravel()
    for shift in (1, 4096, 8192):
        assert np.mean(f[:-shift] == f[shift:]) < 1e-3
        assert abs(np.corrcoef(f[:-shift], f[shift:])[0, 1]) < 0.01
    # Integers: uniform in [-8, 8] (int32), [0, 8] (uint8).
    for dtype, lo in (("int32", -8), ("uint8", 0)):
        k.write_text(json.dumps(_copy_kernel(dtype, 512)))
        r = nsim("run", k, "--outputs", tmp_path / dtype)
        assert r.returncode == 0, r.stderr
        v = np.load(tmp_path / dtype / "y.npy")
        counts = np.bincount(v.ravel().astype(np.int64) - lo)
        assert len(counts) == 9 - lo and counts.min() > 0.9 * v.size / len(counts)
