"""Queryable tables (`nsim run --instructions/--dma`, nsim.export.write_tables: CSV and Parquet) and
the `nsim plot` command (python3 -m nsim.plot behind the CLI)."""
import csv
import json
import os
import shutil
import subprocess
import sys
from collections import defaultdict

import pytest

from conftest import EXAMPLES_DIR, NSIM_BIN, REPO_ROOT

SOFTMAX = os.path.join(EXAMPLES_DIR, "softmax_2x128x512.json")
INSTR_COLUMNS = ["index", "opcode", "engine", "start_ns", "end_ns", "duration_ns", "dma_queue", "bytes", "src_file",
                 "src_line", "wait_ns", "waited_for", "ready_ns", "waited_on", "src_stack", "act_table_load_ns"]
DMA_COLUMNS = ["transfer", "engine_idx", "queue", "trigger_engine", "start_ns", "end_ns", "duration_ns", "bytes",
               "descriptors", "throughput_gbps", "src_space", "dst_space", "src_file", "src_line"]
EPS = 1.5e-3  # ns: times are printed with 3 decimals


def _run(*args, **kw):
    return subprocess.run([NSIM_BIN, *map(str, args)], capture_output=True, text=True, timeout=300, **kw)


def _read(path):
    with open(path, newline="") as f:
        r = csv.reader(f)
        header = next(r)
        return header, [dict(zip(header, row)) for row in r]


@pytest.fixture(scope="module")
def cli_tables(tmp_path_factory, request):
    request.getfixturevalue("nsim_bin")  # skip when the CLI is not built
    d = tmp_path_factory.mktemp("tables")
    r = _run("run", SOFTMAX, "--timing-only", "--instructions", d / "instructions.csv", "--dma", d / "dma.csv",
             "--stats", d / "stats.json")
    assert r.returncode == 0, r.stderr
    stats = json.loads((d / "stats.json").read_text())["stats"]
    ih, instrs = _read(d / "instructions.csv")
    dh, dma = _read(d / "dma.csv")
    return {"dir": d, "stats": stats, "instr_header": ih, "instrs": instrs, "dma_header": dh, "dma": dma}


def _stat(stats, dotted):
    node = stats
    for part in dotted.split("."):
        node = node[part]
    return node["value"]


def test_headers(cli_tables):
    assert cli_tables["instr_header"] == INSTR_COLUMNS
    assert cli_tables["dma_header"] == DMA_COLUMNS
    assert len(cli_tables["instrs"]) > 0 and len(cli_tables["dma"]) > 0


def test_dma_bytes_add_up(cli_tables):
    instrs, dma, stats = cli_tables["instrs"], cli_tables["dma"], cli_tables["stats"]
    per_transfer = defaultdict(int)
    per_engine = defaultdict(int)
    packets = defaultdict(int)
    for row in dma:
        assert int(row["bytes"]) > 0
        per_transfer[int(row["transfer"])] += int(row["bytes"])
        per_engine[int(row["engine_idx"])] += int(row["bytes"])
        packets[int(row["engine_idx"])] += 1
    dma_instrs = {int(r["index"]): r for r in instrs if r["opcode"].startswith("dma_")}
    assert set(per_transfer) == set(dma_instrs)
    for idx, row in dma_instrs.items():
        assert per_transfer[idx] == int(row["bytes"]), idx
        assert row["dma_queue"] != ""
    assert sum(per_transfer.values()) == _stat(stats, "dma.transfer_total_bytes")
    assert len(dma_instrs) == _stat(stats, "dma.transfer_count")
    engines = sum(1 for k in stats["dma"] if k.startswith("engine"))
    assert engines == 16  # trn2
    for k in range(engines):
        assert per_engine.get(k, 0) == _stat(stats, "dma.engine{}.bytes".format(k)), k
        assert packets.get(k, 0) == _stat(stats, "dma.engine{}.packets".format(k)), k
    assert sum(int(r["descriptors"]) for r in dma) == _stat(stats, "dma.descriptor_count")


def test_dma_rows_consistent(cli_tables):
    total = _stat(cli_tables["stats"], "total_time")
    instrs = {int(r["index"]): r for r in cli_tables["instrs"]}
    for row in cli_tables["dma"]:
        s, e, d = float(row["start_ns"]), float(row["end_ns"]), float(row["duration_ns"])
        assert -EPS <= s <= e <= total + EPS
        assert d == pytest.approx(e - s, abs=EPS)
        assert float(row["throughput_gbps"]) == pytest.approx(int(row["bytes"]) / d, rel=1e-3)
        assert float(row["throughput_gbps"]) <= 23.0 * 1.001  # dma.engine_bw on trn2: 23 B/ns
        ins = instrs[int(row["transfer"])]
        # a packet moves after the trigger and before the transfer completes
        assert float(ins["start_ns"]) - EPS <= s and e <= float(ins["end_ns"]) + EPS
        assert row["queue"] == ins["dma_queue"] and row["trigger_engine"] == ins["engine"]
        assert row["src_file"] == ins["src_file"] and row["src_line"] == ins["src_line"]
        assert {row["src_space"], row["dst_space"]} <= {"hbm", "sbuf", "psum"}
        assert 0 <= int(row["engine_idx"]) < 16 and int(row["descriptors"]) >= 1
    spaces = {(r["src_space"], r["dst_space"]) for r in cli_tables["dma"]}
    assert ("hbm", "sbuf") in spaces and ("sbuf", "hbm") in spaces  # loads and stores
    # the transfer's last packet ends when the transfer completes
    last = defaultdict(float)
    for row in cli_tables["dma"]:
        last[int(row["transfer"])] = max(last[int(row["transfer"])], float(row["end_ns"]))
    for idx, end in last.items():
        assert end == pytest.approx(float(instrs[idx]["end_ns"]), abs=EPS)


def test_instruction_rows(cli_tables):
    total = _stat(cli_tables["stats"], "total_time")
    rows = cli_tables["instrs"]
    assert [int(r["index"]) for r in rows] == list(range(len(rows)))
    waits = 0
    for r in rows:
        s, e = float(r["start_ns"]), float(r["end_ns"])
        assert -EPS <= s <= e <= total + EPS
        wait = float(r["wait_ns"])
        assert wait >= 0
        assert float(r["ready_ns"]) >= 0
        if r["waited_for"] != "":
            waits += 1
            assert wait > 0 and 0 <= int(r["waited_for"]) < int(r["index"])
            assert r["waited_on"] in ("tensor", "vector", "scalar", "gpsimd", "sync", "dma")
            # the wait ends when the operands are ready: after the producer ended
            assert float(r["ready_ns"]) >= wait - EPS
            assert float(rows[int(r["waited_for"])]["end_ns"]) <= float(r["ready_ns"]) + EPS
        else:
            assert wait == 0 and r["waited_on"] == ""
    assert waits > 0  # softmax waits on its loads
    assert max(float(r["end_ns"]) for r in rows) == pytest.approx(total, abs=1e-2)


def _core():
    nsim = pytest.importorskip("nsim")
    if not getattr(nsim, "core_available", False):
        pytest.skip("nsim core (_nsim extension) not built")
    from nsim import export
    return export


def test_python_write_tables_matches_the_cli(cli_tables, tmp_path):
    export = _core()
    res = export.write_tables(SOFTMAX, tmp_path / "py", config="trn2")
    assert res["instructions"] == str(tmp_path / "py" / "instructions.csv")
    assert res["instruction_rows"] == len(cli_tables["instrs"]) and res["dma_rows"] == len(cli_tables["dma"])
    for name in ("instructions.csv", "dma.csv"):
        assert (tmp_path / "py" / name).read_bytes() == (cli_tables["dir"] / name).read_bytes(), name
    assert list(export.INSTRUCTION_COLUMNS) == INSTR_COLUMNS and list(export.DMA_COLUMNS) == DMA_COLUMNS


def test_python_write_tables_errors(tmp_path):
    export = _core()
    import nsim
    with pytest.raises(ValueError):
        export.write_tables(SOFTMAX, tmp_path, format="xlsx")
    with pytest.raises(nsim.ConfigError):
        export.write_tables(SOFTMAX, tmp_path, config="trn9")
    # an override changes the timing, not the shape of the tables
    res = export.write_tables(SOFTMAX, tmp_path / "slow", overrides={"dma.engine_bw": "10B/ns"})
    _, rows = _read(res["dma"])
    assert res["dma_rows"] == len(rows) > 0
    # loads at the overridden 10 B/ns; stores (SBUF -> HBM) at 10 x dma.store_bw_factor (trn2: 1.16)
    import _nsim
    store = _nsim.config_values("trn2", [])["dma.store_bw_factor"]
    assert max(float(r["throughput_gbps"]) for r in rows) <= 10.0 * max(1.0, store) * 1.001


def test_source_files_with_commas_and_quotes_are_quoted(tmp_path):
    export = _core()
    name = 'my "kernels", v2.py'
    kernel = {
        "nsim_kernel": 1, "name": "copy",
        "tensors": [{"name": "x", "buffer": "hbm", "kind": "input", "dtype": "float32", "shape": [128, 64]},
                    {"name": "y", "buffer": "hbm", "kind": "output", "dtype": "float32", "shape": [128, 64]}],
        "body": [{"alloc": {"name": "t", "buffer": "sbuf", "dtype": "float32", "shape": [128, 64]}},
                 {"op": "dma_copy", "dst": "t", "src": "x", "loc": {"file": name, "line": 7}},
                 {"op": "dma_copy", "dst": "y", "src": "t", "loc": {"file": name, "line": 8}}],
    }
    res = export.write_tables(kernel, tmp_path)
    ih, instrs = _read(res["instructions"])
    dh, dma = _read(res["dma"])
    assert ih == INSTR_COLUMNS and dh == DMA_COLUMNS
    assert [(r["src_file"], r["src_line"]) for r in instrs] == [(name, "7"), (name, "8")]
    assert {r["src_file"] for r in dma} == {name} and len(dma) == 32  # 2 transfers x 16 DMA engines
    assert instrs[1]["waited_for"] == "0" and instrs[1]["waited_on"] == "dma"


def test_parquet_without_pyarrow_is_a_clear_error(tmp_path, monkeypatch):
    export = _core()
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow -> ImportError
    with pytest.raises(ImportError, match="pip install pyarrow"):
        export.write_tables(SOFTMAX, tmp_path, format="parquet")


def test_parquet_round_trip(cli_tables, tmp_path):
    export = _core()
    pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq
    res = export.write_tables(SOFTMAX, tmp_path, format="parquet")
    assert res["instructions"].endswith("instructions.parquet") and res["dma"].endswith("dma.parquet")
    it = pq.read_table(res["instructions"]).to_pylist()
    dt = pq.read_table(res["dma"])
    assert dt.column_names == DMA_COLUMNS
    assert [str(t) for t in dt.schema.types] == [
        {"string": "string", "int64": "int64", "float64": "double"}[v] for v in export.DMA_COLUMNS.values()]
    dt = dt.to_pylist()
    assert len(it) == len(cli_tables["instrs"]) and len(dt) == len(cli_tables["dma"])
    for a, b in zip(dt, cli_tables["dma"]):
        assert a["transfer"] == int(b["transfer"]) and a["bytes"] == int(b["bytes"])
        assert a["start_ns"] == pytest.approx(float(b["start_ns"])) and a["src_space"] == b["src_space"]
    for a, b in zip(it, cli_tables["instrs"]):
        assert a["index"] == int(b["index"]) and a["opcode"] == b["opcode"]
        assert a["waited_for"] == (int(b["waited_for"]) if b["waited_for"] else None)
        assert a["dma_queue"] == (int(b["dma_queue"]) if b["dma_queue"] else None)
    assert sum(r["bytes"] for r in dt) == _stat(cli_tables["stats"], "dma.transfer_total_bytes")


def test_cli_dma_option(nsim_bin, tmp_path):
    r = _run("run", "--help")
    assert "--dma FILE" in r.stdout and "--instructions FILE" in r.stdout
    r = _run("run", SOFTMAX, "--timing-only", "--dma", tmp_path / "no" / "such" / "dir" / "dma.csv")
    assert r.returncode == 2 and "NSIM-E441" in r.stderr
    r = _run("run", SOFTMAX, "--timing-only", "--dma")
    assert r.returncode == 2 and "NSIM-E414" in r.stderr
    r = _run("check", SOFTMAX, "--dma", tmp_path / "x.csv")  # a run option only
    assert r.returncode == 2 and "NSIM-E414" in r.stderr


# ---- nsim plot


def test_plot_help(nsim_bin):
    r = _run("plot", "--help")
    assert r.returncode == 0 and r.stdout.startswith("usage: nsim plot")
    r = _run("--help")
    assert "plot" in r.stdout


def test_plot_without_python_is_a_usage_error(nsim_bin, tmp_path):
    env = dict(os.environ, NSIM_PYTHON=str(tmp_path / "no-such-python"))
    r = _run("plot", SOFTMAX, "--out", tmp_path, env=env)
    assert r.returncode == 2 and "NSIM-E414" in r.stderr and "no-such-python" in r.stderr
    env = {k: v for k, v in os.environ.items() if k != "NSIM_PYTHON"}
    env["PATH"] = str(tmp_path)  # no python3 on PATH
    r = _run("plot", SOFTMAX, "--out", tmp_path, env=env)
    assert r.returncode == 2 and "NSIM-E414" in r.stderr and "python3" in r.stderr


def test_plot_without_the_package_is_a_usage_error(nsim_bin, tmp_path):
    # A copy of the binary outside any build tree, and no PYTHONPATH: nsim cannot be imported
    # (unless it is installed, then there is nothing to test).
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "NSIM_PYTHON")}
    env["NSIM_PYTHON"] = sys.executable
    probe = subprocess.run([sys.executable, "-c", "import nsim.plot"], cwd=str(tmp_path), env=env, capture_output=True)
    if probe.returncode == 0:
        pytest.skip("nsim is installed in this interpreter")
    (tmp_path / "bin").mkdir()
    exe = shutil.copy(nsim_bin, tmp_path / "bin" / "nsim")
    r = subprocess.run([str(exe), "plot", SOFTMAX, "--out", str(tmp_path)], capture_output=True, text=True,
                       cwd=str(tmp_path), env=env, timeout=300)
    assert r.returncode == 2 and "NSIM-E414" in r.stderr and "nsim Python package" in r.stderr, r.stderr


def _plot_env(clear_pythonpath):
    env = dict(os.environ, NSIM_PYTHON=sys.executable, MPLBACKEND="Agg")
    if clear_pythonpath:
        env.pop("PYTHONPATH", None)
    return env


def _png_ok(path):
    assert os.path.isfile(path), path
    assert os.path.getsize(path) > 1000, path
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_plot_writes_the_pngs(nsim_bin, tmp_path):
    _core()
    pytest.importorskip("matplotlib")
    out = tmp_path / "plots"
    r = _run("plot", SOFTMAX, "--out", out, "--bins", 50, env=_plot_env(False))
    assert r.returncode == 0, r.stderr
    assert "softmax_2x128x512:" in r.stdout and "utilisation:" in r.stdout
    _png_ok(out / "softmax_2x128x512_roofline.png")
    _png_ok(out / "softmax_2x128x512_utilisation.png")
    # arguments are nsim.plot's: a bad one is its usage error (argparse: status 2)
    r = _run("plot", SOFTMAX, "--bogus", env=_plot_env(False))
    assert r.returncode == 2 and "--bogus" in r.stderr
    # a kernel that does not exist: nsim.plot reports it and exits 1
    r = _run("plot", tmp_path / "missing.json", "--out", out, env=_plot_env(False))
    assert r.returncode == 1 and "missing.json" in r.stderr


def test_plot_finds_the_package_next_to_the_binary(nsim_bin, tmp_path):
    """In a build tree (<build>/nsim with <build>/python/_nsim*.so), no PYTHONPATH is needed."""
    _core()
    pytest.importorskip("matplotlib")
    build = os.path.dirname(os.path.abspath(nsim_bin))
    pydir = os.path.join(build, "python")
    if not (os.path.isdir(pydir) and any(f.startswith("_nsim") for f in os.listdir(pydir))):
        pytest.skip("the CLI is not in a build tree with the _nsim module")
    r = _run("plot", SOFTMAX, "--out", tmp_path, "--bins", 20, env=_plot_env(True), cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    _png_ok(tmp_path / "softmax_2x128x512_roofline.png")
    _png_ok(tmp_path / "softmax_2x128x512_utilisation.png")


def test_activation_table_loads(tmp_path):
    """Each activation whose function table set differs from the one ScalarE holds begins with a table load
    (scalar.act_table_load = 1330 ns on trn2, neuroncore.md C11): the instruction table's act_table_load_ns, the stats
    engine.scalar.act_table_load_count / _time and an ACT_TABLE_LOAD slice before the activation's in the trace, as
    the profiler shows it. exp, log, exp on one tile (each needs the last one's result: no reordering) switch sets
    three times."""
    export = _core()
    import numpy as np
    from nsim import nki
    import nsim.nki.language as nl
    import nsim.nki.isa as nisa

    @nki.jit
    def k(x):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        for op in (nl.exp, nl.log, nl.exp):
            nisa.activation(dst=t, op=op, data=t)
        nisa.dma_copy(dst=out, src=t)
        return out

    x = np.full((128, 512), 0.5, np.float32)
    trace = tmp_path / "t.json"
    y, prof = k.options(trace=str(trace)).simulate(x)
    np.testing.assert_allclose(y, np.exp(np.log(np.exp(x))), rtol=1e-5)
    assert prof.stat("engine.scalar.act_table_load_count") == 3
    assert prof.stat("engine.scalar.act_table_load_time") == pytest.approx(3 * 1330.0)
    r = export.write_tables(prof.kernel, str(tmp_path), config="trn2")
    _h, rows = _read(r["instructions"])
    acts = [row for row in rows if row["opcode"] == "activation"]
    assert [float(a["act_table_load_ns"]) for a in acts] == [1330.0] * 3
    assert all(float(row["act_table_load_ns"]) == 0 for row in rows if row["opcode"] != "activation")
    ev = json.loads(trace.read_text())
    ev = ev["traceEvents"] if isinstance(ev, dict) else ev
    slices = sorted((e for e in ev if e.get("ph") == "X" and e.get("name") in ("ACT_TABLE_LOAD", "activation")),
                    key=lambda e: e["ts"])
    assert [e["name"] for e in slices] == ["ACT_TABLE_LOAD", "activation"] * 3
    for load, act in zip(slices[::2], slices[1::2]):
        assert load["dur"] == pytest.approx(1.33, abs=1e-3)  # us
        assert act["ts"] == pytest.approx(load["ts"] + load["dur"], abs=1e-3)
        assert load["args"]["table_load_of"] == act["args"]["index"]
