"""nsim.load_kernel: a kernel read once and simulated many times (docs/kernel-json.md, "Loading a kernel
once"). Its results equal simulate_json's and `nsim run`'s; repeated runs are identical; bad input raises
coded errors."""
from __future__ import annotations

import json
import os
import subprocess

import numpy as np
import pytest

import nsim
from nsim import _errors
from nsim import kernels as K

from conftest import NSIM_BIN, REPO_ROOT

EX = os.path.join(REPO_ROOT, "examples")
KERNELS = [os.path.join(EX, "softmax_2x128x512.json"), os.path.join(EX, "swiglu.json"),
           os.path.join(EX, "library", "matmul_blocked.json"), os.path.join(EX, "library", "flash_attention.json")]
CONFIGS = [("trn2", None), ("trn1", None), ("trn2", {"hbm.bw": "181.25GB/s"})]


@pytest.mark.parametrize("path", KERNELS, ids=os.path.basename)
def test_handle_equals_simulate_json_on_every_config(path):
    h = nsim.load_kernel(path)
    assert h.filename == path and h.name
    for config, overrides in CONFIGS:
        _, a = nsim.simulate_json(path, config=config, overrides=overrides, timing_only=True)
        _, b = h.simulate(config=config, overrides=overrides, timing_only=True)
        assert a.stats == b.stats and a.lines == b.lines and a.total_time_ns == b.total_time_ns > 0
        assert b.config == config and b.to_json() == open(path).read()


@pytest.mark.parametrize("path", KERNELS[:2], ids=os.path.basename)
def test_handle_outputs_equal_simulate_json_and_repeat(path):
    h = nsim.load_kernel(path)
    outs = [h.simulate(seed=3) for _ in range(3)]
    ref, prof = nsim.simulate_json(path, seed=3)
    for out, p in outs:
        assert out.keys() == ref.keys() and out
        for name in ref:
            assert out[name].dtype == ref[name].dtype
            np.testing.assert_array_equal(out[name].view(np.uint8), ref[name].view(np.uint8))
        assert p.stats == prof.stats and p.lines == prof.lines


def test_repeated_runs_over_configs_are_identical():
    h = nsim.load_kernel(KERNELS[2])
    first = [h.simulate(config=c, overrides=o, timing_only=True)[1].stats for c, o in CONFIGS]
    again = [h.simulate(config=c, overrides=o, timing_only=True)[1].stats for c, o in reversed(CONFIGS)][::-1]
    assert first == again
    assert first[0] != first[1]  # trn1 is another machine: the handle did not keep a configuration


@pytest.mark.skipif(not os.path.isfile(NSIM_BIN), reason="build/nsim not built")
@pytest.mark.parametrize("path", KERNELS[1:3], ids=os.path.basename)
def test_stats_dict_equals_the_cli_stats_json(path, tmp_path):
    # The stats dict is made directly from the registry; `nsim run --stats` writes its JSON text.
    out = tmp_path / "s.json"
    r = subprocess.run([NSIM_BIN, "run", path, "--timing-only", "--quiet", "--config", "trn1", "--stats", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    cli = json.loads(out.read_text())
    _, prof = nsim.load_kernel(path).simulate(config="trn1", timing_only=True)
    assert prof.stats == cli["stats"]
    assert [list(v) for v in prof.stats.values()] == [list(v) for v in cli["stats"].values()]  # member order
    assert json.loads(prof.to_stats_json())["stats"] == cli["stats"]


def test_lnc2_launch_through_the_handle():
    from test_lnc import scale_rows

    a = np.random.default_rng(1).standard_normal((512, 256)).astype(np.float32)
    kj = scale_rows[2].to_json(a)
    h = nsim.load_kernel(kj)
    out, prof = h.simulate(inputs={"a": a})
    name = next(iter(out))
    np.testing.assert_allclose(out[name], 2 * a + 1, rtol=1e-6)
    assert prof.stat("lnc.cores") == 2
    _, again = h.simulate(inputs={"a": a})
    assert again.stats == prof.stats
    assert prof.kernel == kj and json.loads(h.to_json()) == kj  # the dict's text
    with pytest.raises(nsim.KernelError) as e:  # the IR writer writes one core only
        nsim._core._call(h._handle.to_json)
    assert e.value.code == _errors.code("MultiCoreLaunch")


def test_simulate_json_takes_a_handle_and_load_kernel_returns_it():
    h = nsim.load_kernel(KERNELS[0])
    assert nsim.load_kernel(h) is h
    _, a = nsim.simulate_json(h, timing_only=True)
    _, b = h.simulate(timing_only=True)
    assert a.stats == b.stats
    assert "LoadedKernel" in repr(h)


def test_library_kernel_dict_and_text():
    args = K.matmul_inputs(0, 256, 256, 256)
    kj = K.matmul_blocked.to_json(*args)
    from_dict, from_text = nsim.load_kernel(kj), nsim.load_kernel(json.dumps(kj))
    _, a = from_dict.simulate(timing_only=True)
    _, b = from_text.simulate(timing_only=True)
    assert a.stats == b.stats and b.kernel == kj
    # The dict went to C++ without its JSON text (no json.dumps): the same IR as the text gives.
    assert from_dict._text is None
    assert from_dict._handle.to_json() == nsim._core._nsim.Kernel(json.dumps(kj), "k.json").to_json()
    # its text is written when asked for
    assert a.kernel == kj and json.loads(from_dict.to_json()) == kj
    import pickle
    assert pickle.loads(pickle.dumps(a)).kernel == kj


def test_dict_values_json_would_write_differently_take_the_text_path():
    kj = json.loads(open(KERNELS[0]).read())
    # numpy scalars and tuples convert like json.dumps(default=...) does
    kj2 = json.loads(open(KERNELS[0]).read())
    kj2["tensors"][0]["shape"] = tuple(np.int64(d) for d in kj2["tensors"][0]["shape"])
    assert nsim.load_kernel(kj2)._handle.to_json() == nsim.load_kernel(kj)._handle.to_json()
    assert nsim.load_kernel(kj2)._text is None and json.loads(nsim.load_kernel(kj2).to_json()) == kj
    # a float where the schema wants an integer: the same error text-wise and dict-wise
    kj3 = json.loads(open(KERNELS[0]).read())
    kj3["nsim_kernel"] = 1.0
    for k in (kj3, json.dumps(kj3)):
        with pytest.raises(nsim.KernelError) as e:
            nsim.load_kernel(k)
        assert e.value.code == _errors.code("SchemaVersion")
    # NaN (json.dumps writes NaN, which the strict parser refuses) and non-string keys: the text path
    kj4 = json.loads(open(KERNELS[0]).read())
    kj4["name"] = float("nan")
    with pytest.raises(nsim.KernelError) as e:
        nsim.load_kernel(kj4)
    assert e.value.code == _errors.code("JsonSyntax")
    kj5 = json.loads(open(KERNELS[0]).read())
    kj5[1] = "x"
    with pytest.raises(nsim.KernelError):
        nsim.load_kernel(kj5)
    loop = {"nsim_kernel": 1}
    loop["body"] = [loop]  # a cycle: json.dumps refuses it
    with pytest.raises(nsim.KernelError) as e:
        nsim.load_kernel(loop)
    assert e.value.code == _errors.code("WrongType")
    with pytest.raises(nsim.KernelError) as e:
        nsim.load_kernel({"nsim_kernel": 1, "body": [], "name": object()})
    assert e.value.code == _errors.code("WrongType")
    # errors in a dict give the JSON path (no line and column: there is no text)
    with pytest.raises(nsim.KernelError) as e:
        nsim.load_kernel({"nsim_kernel": 1, "tensors": [], "body": [{"op": "no_such_op"}]})
    assert str(e.value).startswith(e.value.code + ": <dict>: body[0]")


def test_dict_body_read_statement_by_statement_as_the_text_is():
    # A kernel dict's body, and each loop's, goes to C++ one statement at a time (the converted values of an unrolled kernel
    # outweigh the kernel; held whole they set the run's peak memory): the same IR as its text, the same
    # errors, at the same JSON paths, whichever statement holds them.
    path = os.path.join(EX, "swiglu.json")  # 12 statements at the top level: 6 allocs, 6 loops
    kj = json.loads(open(path).read())
    assert len(kj["body"]) == 12
    h = nsim.load_kernel(kj)
    assert h._text is None
    assert h._handle.to_json() == nsim._core._nsim.Kernel(json.dumps(kj), "k.json").to_json()
    _, a = h.simulate(timing_only=True)
    _, b = nsim.simulate_json(path, timing_only=True)
    assert a.stats == b.stats
    # a bad op in a later statement: its path, from the dict and from the text
    bad = json.loads(json.dumps(kj))
    bad["body"][9]["loop"]["body"].append({"op": "no_such_op"})
    for k in (bad, json.dumps(bad)):
        with pytest.raises(nsim.KernelError) as e:
            nsim.load_kernel(k)
        assert e.value.code == _errors.code("UnknownOp") and "body[9].loop.body[" in str(e.value)
    # a value json.dumps writes differently in a later statement (NaN): the text path's error, as before
    nan = json.loads(json.dumps(kj))
    nan["body"][8]["loop"]["stop"] = float("nan")
    with pytest.raises(nsim.KernelError) as e:
        nsim.load_kernel(nan)
    assert e.value.code == _errors.code("JsonSyntax")
    # numpy scalars in a statement convert as json.dumps(default=...) does
    npk = json.loads(json.dumps(kj))
    npk["body"][8]["loop"]["stop"] = np.int64(npk["body"][8]["loop"]["stop"])
    assert nsim.load_kernel(npk)._handle.to_json() == h._handle.to_json()
    # loops' bodies too are read statement by statement: an error two loops deep, a NaN there, a loop body that
    # is not a list
    assert "loop" in kj["body"][9]["loop"]["body"][0]
    deep = json.loads(json.dumps(kj))
    deep["body"][9]["loop"]["body"][0]["loop"]["body"].insert(1, {"op": "no_such_op"})
    for k in (deep, json.dumps(deep)):
        with pytest.raises(nsim.KernelError) as e:
            nsim.load_kernel(k)
        assert e.value.code == _errors.code("UnknownOp") and "body[9].loop.body[0].loop.body[1]" in str(e.value)
    deep = json.loads(json.dumps(kj))
    deep["body"][9]["loop"]["body"][0]["loop"]["body"][0]["nan"] = float("nan")
    with pytest.raises(nsim.KernelError) as e:
        nsim.load_kernel(deep)
    assert e.value.code == _errors.code("JsonSyntax")
    for inner in ({"op": "x"}, 3):
        deep = json.loads(json.dumps(kj))
        deep["body"][9]["loop"]["body"][0]["loop"]["body"] = inner
        for k in (deep, json.dumps(deep)):
            with pytest.raises(nsim.KernelError) as e:
                nsim.load_kernel(k)
            assert e.value.code == _errors.code("WrongType") and "body[9].loop.body[0].loop.body" in str(e.value)
    # a body that is not a list: the error of the text
    for body in ({"op": "x"}, "x"):
        for k in ({"nsim_kernel": 1, "tensors": [], "body": body},
                  json.dumps({"nsim_kernel": 1, "tensors": [], "body": body})):
            with pytest.raises(nsim.KernelError) as e:
                nsim.load_kernel(k)
            assert e.value.code == _errors.code("WrongType")


def test_dict_statements_converted_only_when_read():
    # What makes reading statement by statement hold no whole body: a statement (a loop's too) is converted
    # only when the reader comes to it. An error in an earlier statement stops the reading before a later
    # statement is converted (an array's conversion, json.dumps's fallback, is recorded).
    calls = []

    class Recorded(np.ndarray):
        def tolist(self):
            calls.append(1)
            return super().tolist()

    kj = json.loads(open(os.path.join(EX, "swiglu.json")).read())
    assert "loop" in kj["body"][9]
    def later(stmts):  # an alloc whose shape is a recorded array, after the error
        stmts.append({"alloc": {"name": "late", "buffer": "sbuf", "dtype": "float32",
                                "shape": np.array([128, 4]).view(Recorded)}})

    top = json.loads(json.dumps(kj))
    top["body"].insert(2, {"op": "no_such_op"})  # a top-level statement
    later(top["body"])
    inner = json.loads(json.dumps(kj))
    inner["body"][9]["loop"]["body"].insert(0, {"op": "no_such_op"})  # the first statement of a loop's body
    later(inner["body"][9]["loop"]["body"])
    for k, where in ((top, "body[2]"), (inner, "body[9].loop.body[0]")):
        calls.clear()
        with pytest.raises(nsim.KernelError) as e:
            nsim.load_kernel(k)
        assert e.value.code == _errors.code("UnknownOp") and where in str(e.value)
        assert calls == [], where
    # read to the end, the recorded array converts as json.dumps would
    ok = json.loads(json.dumps(kj))
    later(ok["body"][9]["loop"]["body"])
    calls.clear()
    nsim.load_kernel(ok)
    assert calls == [1]


def test_bad_input_gives_coded_errors(tmp_path):
    with pytest.raises(nsim.KernelError) as e:
        nsim.load_kernel('{"nsim_kernel": 1, "body": [')
    assert e.value.code == _errors.code("JsonSyntax")
    with pytest.raises(nsim.KernelError) as e:
        nsim.load_kernel({"nsim_kernel": 1, "tensors": [], "body": [{"op": "no_such_op"}]})
    assert e.value.code.startswith("NSIM-E4")
    with pytest.raises(FileNotFoundError) as e:
        nsim.load_kernel(str(tmp_path / "missing.json"))
    assert e.value.code == _errors.code("BadInput")
    h = nsim.load_kernel(KERNELS[0])
    with pytest.raises(nsim.ConfigError):
        h.simulate(config="no_such_preset", timing_only=True)
    with pytest.raises(nsim.ConfigError):
        h.simulate(overrides={"tensor.pe_rowz": 1}, timing_only=True)
    with pytest.raises(nsim.NsimError) as e:
        h.simulate(inputs={"nope": np.zeros(3)})
    assert e.value.code == _errors.code("BadInput")
    with pytest.raises(nsim.NsimError) as e:
        h.check(config="trn2", overrides=["sbuf.bytes_per_partition=1KiB"])
    assert e.value.code.startswith("NSIM-E")
    with pytest.raises(TypeError):
        h.simulate(seed="x")
    with pytest.raises(TypeError):
        nsim.load_kernel(42)
    # the handle still works after the errors
    _, p = h.simulate(timing_only=True)
    assert p.total_time_ns > 0


def test_sweep_reads_each_kernel_once_in_process(monkeypatch):
    from nsim import _core, sweep

    calls = []
    real = _core.load_kernel

    def counting(k):
        calls.append(1)
        return real(k)

    monkeypatch.setattr(_core, "load_kernel", counting)
    rows = sweep.sweep([KERNELS[0], KERNELS[1]], {"hbm.bw": ["181.25GB/s", "362.5GB/s", "725GB/s"]}, jobs=1)
    assert [r["status"] for r in rows] == ["ok"] * 6
    assert len(calls) == 2 and not sweep._LOADED
    _, p = nsim.simulate_json(KERNELS[1], overrides={"hbm.bw": "362.5GB/s"}, timing_only=True)
    assert rows[4]["total_time"] == p.stat("total_time")


def test_runs_on_two_python_threads_at_once_equal_runs_one_at_a_time():
    # A run releases the GIL, so a program may simulate on several threads at once. What runs share in a process
    # -- the placement search's thread (one search at a time has it: the other times its candidates alone), the
    # matmul product's buffers kept between runs, the pooled memory -- must not change a result: flash attention
    # twice (numerics, each placement search timing two candidates) and a 1024-wide matmul, each on its own thread,
    # four times over, against the same runs one at a time.
    import threading

    cases = [(K.flash_attention, K.flash_attention_inputs(0, s=512)),
             (K.flash_attention, K.flash_attention_inputs(1, s=384)),
             (K.matmul_blocked, K.matmul_inputs(1, 256, 512, 1024))]
    handles = []
    for kern, args in cases:
        tres = kern.options(check=False).trace(*args)
        handles.append((nsim.load_kernel(tres.kernel), {n: np.asarray(a) for n, a in tres.inputs.items()}))

    def run(i):
        h, inputs = handles[i]
        return h.simulate(inputs=inputs)

    alone = [run(i) for i in range(len(handles))]
    got = [[None] * len(handles) for _ in range(4)]
    errors = []

    def worker(rep, i):
        try:
            got[rep][i] = run(i)
        except BaseException as e:  # (reported below: a thread's exception is not the test's)
            errors.append(e)

    for rep in range(4):
        threads = [threading.Thread(target=worker, args=(rep, i)) for i in range(len(handles))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    assert not errors, errors
    for rep in range(4):
        for (ref_out, ref_prof), (out, prof) in zip(alone, got[rep]):
            assert out.keys() == ref_out.keys()
            for name in ref_out:
                np.testing.assert_array_equal(out[name].view(np.uint8), ref_out[name].view(np.uint8))
            assert prof.stats == ref_prof.stats
