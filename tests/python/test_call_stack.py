"""Call stacks (issue 14, item 1): an instruction traced in a helper carries the stack kernel -> helper ->
line. kernel.json interns each distinct stack once (top-level "stacks", referenced by loc["stack"]), and
the stack appears in the trace's slice args ("stack"), the instruction table ("src_stack") and the
analysis (each line's "stack"). A line in the kernel function itself has no stack."""
import csv
import json
import os

import numpy as np

from conftest import require_core  # noqa: E402

_core, _ = require_core()

import nsim  # noqa: E402
from nsim import nki  # noqa: E402
import nsim.nki.isa as nisa  # noqa: E402
import nsim.nki.language as nl  # noqa: E402
from nsim.export import write_tables  # noqa: E402

HERE = os.path.basename(__file__)


def _double(dst, src):
    nisa.tensor_scalar(dst=dst, data=src, op0=nl.multiply, operand0=2.0)  # MARK:double


def _row_block(out, x, i):
    t = nl.ndarray((128, 512), x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x[i * 128:(i + 1) * 128, :])  # MARK:load
    y = nl.ndarray((128, 512), x.dtype, buffer=nl.sbuf)
    _double(y, t)  # MARK:call_double
    nisa.dma_copy(dst=out[i * 128:(i + 1) * 128, :], src=y)


@nki.jit
def doubled(x):
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(x.shape[0] // 128):
        _row_block(out, x, i)  # MARK:call_block
    z = nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=z, value=0.0)  # MARK:direct
    return out


def _line(mark):
    src = open(__file__).read().splitlines()
    return next(i + 1 for i, t in enumerate(src) if t.rstrip().endswith("# MARK:" + mark))


def _x():
    return np.random.default_rng(0).standard_normal((512, 512)).astype(np.float32)


BLOCK = "doubled ({}:{})".format(HERE, _line("call_block"))
DOUBLE = BLOCK + " > _row_block ({}:{})".format(HERE, _line("call_double"))


def _ops(body):
    for st in body:
        if "op" in st:
            yield st
        if "loop" in st:
            yield from _ops(st["loop"].get("body", []))


def test_kernel_json_interns_the_stacks():
    k = doubled.to_json(_x())
    assert sorted(k["stacks"]) == sorted([BLOCK, DOUBLE]), k["stacks"]
    by_line = {}
    for op in _ops(k["body"]):
        loc = op["loc"]
        by_line.setdefault(loc["line"], set()).add(k["stacks"][loc["stack"]] if "stack" in loc else "")
    assert by_line[_line("double")] == {DOUBLE}
    assert by_line[_line("load")] == {BLOCK}
    assert by_line[_line("direct")] == {""}  # in the kernel function itself: no stack
    # Compact: 4 row blocks x 4 ops share two table entries; an op holds an index, not the frames.
    assert len(k["stacks"]) == 2
    assert all(isinstance(op["loc"].get("stack", 0), int) for op in _ops(k["body"]))


def test_ops_of_one_line_and_stack_share_one_loc():
    # A kernel with its loops unrolled has a loc per op: the tracer keeps one dict per (line, call stack),
    # ~200 bytes an op less in the traced IR (the public flash attention sample has 342,736 ops at seq 16384).
    k = doubled.options(loops="unroll").to_json(_x())
    locs = {}
    for op in _ops(k["body"]):
        key = (op["loc"]["file"], op["loc"]["line"], op["loc"].get("stack"))
        locs.setdefault(key, set()).add(id(op["loc"]))
    assert len(locs) == 4 and all(len(ids) == 1 for ids in locs.values()), locs
    assert sum(1 for _ in _ops(k["body"])) == 4 * 3 + 1  # 4 unrolled row blocks of 3 ops, then the memset
    # the JSON text is the same as with a dict per op
    assert json.loads(json.dumps(k)) == k


def test_kernel_json_rejects_a_stack_index_out_of_range():
    k = doubled.to_json(_x())
    k["stacks"] = k["stacks"][:1]
    try:
        nsim.simulate_json(k, timing_only=True)
    except nsim.NsimError as e:
        assert "stack" in str(e)
    else:
        raise AssertionError("a loc.stack index beyond the stacks table was accepted")


def test_trace_slices_carry_the_stack(tmp_path):
    path = tmp_path / "t.json"
    doubled.options(timing_only=True, trace=str(path)).simulate(_x())
    events = json.loads(path.read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    seen = {}
    for e in events:
        a = e.get("args") or {}
        if e.get("ph") == "X" and "src" in a and "index" in a:
            seen.setdefault(a["src"].split(" ")[0].rsplit(":", 1)[-1], set()).add(a.get("stack", ""))
    assert seen[str(_line("double"))] == {DOUBLE}
    assert seen[str(_line("direct"))] == {""}


def test_instruction_table_has_the_stack_column(tmp_path):
    write_tables(doubled.to_json(_x()), tmp_path)
    with open(tmp_path / "instructions.csv") as f:
        rows = list(csv.DictReader(f))
    by_line = {}
    for r in rows:
        by_line.setdefault(int(r["src_line"]), set()).add(r["src_stack"])
    assert by_line[_line("double")] == {DOUBLE}
    assert by_line[_line("load")] == {BLOCK}
    assert by_line[_line("direct")] == {""}


def test_analysis_lines_carry_the_stack():
    _, prof = doubled.options(timing_only=True).simulate(_x())
    a = prof.analyze()
    lines = list(a.data["critical_path"]["lines"])
    for f in a.findings:
        lines += f["lines"]
    stacks = {ln["line"]: ln["stack"] for ln in lines}
    assert stacks, a.text
    for line, stack in stacks.items():
        want = {_line("double"): DOUBLE, _line("load"): BLOCK, _line("direct"): ""}.get(line)
        if want is not None:
            assert stack == want, (line, stack)
    assert _line("double") in stacks or _line("load") in stacks, sorted(stacks)
    # The text report shows a helper's line with its callers.
    assert " <- doubled (" in a.text
