"""The Python API over the _nsim extension: simulate_json numerics against the numpy references,
timing-only, overrides, error mapping, the ISA table. Skipped when the extension is not built."""
import copy
import json
import os
import sys

import ml_dtypes
import numpy as np
import pytest

from conftest import EXAMPLES_DIR, REPO_ROOT

# Make the package and the build-tree extension importable without PYTHONPATH (make test sets it).
for _p in (os.path.join(REPO_ROOT, "build", "python"), os.path.join(REPO_ROOT, "python")):
    if os.path.isdir(_p) and _p not in sys.path:
        sys.path.insert(0, _p)

nsim = pytest.importorskip("nsim")
if not getattr(nsim, "core_available", False):
    pytest.skip("the _nsim extension is not built (cmake --build build --target _nsim)", allow_module_level=True)

import reference  # noqa: E402  (examples/ is put on sys.path by conftest)

NAME = "softmax_2x128x512"
KERNEL = os.path.join(EXAMPLES_DIR, NAME + ".json")
BF16 = ml_dtypes.bfloat16


def _kernel_dict():
    with open(KERNEL) as f:
        return json.load(f)


def test_softmax_matches_reference_with_bf16_inputs():
    inputs = reference.make_inputs(NAME, seed=3)
    assert inputs["x"].dtype == BF16
    outputs, prof = nsim.simulate_json(KERNEL, inputs=inputs)
    assert set(outputs) == {"y"}
    y = outputs["y"]
    assert y.dtype == np.dtype(BF16) and y.shape == (2, 128, 512)
    expected = reference.reference(NAME, inputs)["y"]
    atol = min(2e-2, 2e-2 * float(np.abs(expected).max()))
    np.testing.assert_allclose(y.astype(np.float32), expected, rtol=2e-2, atol=atol)
    assert prof.total_time_ns > 0
    assert prof.total_time_ns == prof.stat("total_time") == prof.stats["total_time"]["value"]
    assert prof.stat("engine.vector.instruction_count") > 0
    assert prof.lines and {"src", "file", "line", "instructions", "instruction_time_ns"} <= set(prof.lines[0])
    assert prof.lines[0]["file"] == "examples/gen_examples.py" and prof.lines[0]["line"] > 0
    assert "name: trn2" in prof.config_yaml
    assert prof.kernel["name"] == NAME and json.loads(prof.to_json()) == prof.kernel
    assert NAME in repr(prof) and "ns" in repr(prof)


def test_kernel_as_dict_string_and_path_agree():
    inputs = reference.make_inputs(NAME, seed=4)
    text = open(KERNEL).read()
    results = [nsim.simulate_json(k, inputs=inputs) for k in (KERNEL, text, _kernel_dict())]
    for out, prof in results[1:]:
        np.testing.assert_array_equal(out["y"].view(np.uint16), results[0][0]["y"].view(np.uint16))
        assert prof.total_time_ns == results[0][1].total_time_ns


def test_bf16_raw_bits_and_fp32_conversion_agree():
    x = reference.make_inputs(NAME, seed=5)["x"]
    y_bf16, _ = nsim.simulate_json(KERNEL, inputs={"x": x})
    y_f32, _ = nsim.simulate_json(KERNEL, inputs={"x": x.astype(np.float32)})
    y_f64, _ = nsim.simulate_json(KERNEL, inputs={"x": x.astype(np.float64)})
    np.testing.assert_array_equal(y_bf16["y"].view(np.uint16), y_f32["y"].view(np.uint16))
    np.testing.assert_array_equal(y_bf16["y"].view(np.uint16), y_f64["y"].view(np.uint16))


def test_inputs_in_the_tensor_dtype_are_read_in_place_whatever_their_layout():
    # An input already in the tensor's dtype is read straight from the caller's array (no copy of it is
    # kept on the host): a strided view or a Fortran-ordered array gives the same bits as a C-contiguous
    # one, and the caller's array is left as it was.
    x = reference.make_inputs(NAME, seed=8)["x"]
    want, _ = nsim.simulate_json(KERNEL, inputs={"x": x})
    wide = np.zeros((2, 128, 1024), dtype=BF16)
    wide[..., 1::2] = x
    before = wide.copy()
    strided, _ = nsim.simulate_json(KERNEL, inputs={"x": wide[..., 1::2]})
    fortran, _ = nsim.simulate_json(KERNEL, inputs={"x": np.asfortranarray(x)})
    for out in (strided, fortran):
        np.testing.assert_array_equal(out["y"].view(np.uint16), want["y"].view(np.uint16))
    np.testing.assert_array_equal(wide.view(np.uint16), before.view(np.uint16))
    np.testing.assert_array_equal(want["y"].view(np.uint16), nsim.simulate_json(KERNEL, inputs={"x": x})[0]["y"].view(np.uint16))


def test_outputs_are_the_simulators_hbm_handed_over_writable_and_independent_of_later_runs():
    # Outputs are numpy arrays over the run's HBM storage (no copy): each run's are its own, they outlive
    # the simulator, and writing one changes nothing else.
    x = reference.make_inputs(NAME, seed=9)["x"]
    first, _ = nsim.simulate_json(KERNEL, inputs={"x": x})
    y1 = first["y"]
    kept = y1.copy()
    assert y1.flags.writeable and y1.flags.c_contiguous and y1.shape == (2, 128, 512)
    second, _ = nsim.simulate_json(KERNEL, inputs={"x": (x.astype(np.float32) * 2).astype(BF16)})
    np.testing.assert_array_equal(y1.view(np.uint16), kept.view(np.uint16))  # the second run wrote its own
    assert not np.shares_memory(y1, second["y"])
    del first, second
    import gc
    gc.collect()
    y1[0, 0, 0] = 1.0
    assert float(y1[0, 0, 0]) == 1.0 and np.array_equal(y1[1].view(np.uint16), kept[1].view(np.uint16))


_HOST_MEMORY_SCRIPT = """
import resource, sys
import numpy as np, ml_dtypes
sys.path[:0] = sys.argv[1:]
from nsim import kernels as K
a = np.ones((128 * 512, 512), dtype=ml_dtypes.bfloat16)  # 64 MiB each
b = np.ones((128 * 512, 512), dtype=ml_dtypes.bfloat16)
K.tensor_add.options(check=False).simulate(a[:128], b[:128])  # SBUF, PSUM and the pool set up
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
out, _ = K.tensor_add.options(check=False).simulate(a, b)
assert float(np.asarray(out[-1], np.float32).min()) == 2.0
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024)
"""


def test_a_run_holds_its_inputs_and_outputs_once():
    # Two 64 MiB inputs and a 64 MiB output: the run's HBM holds the three (192 MiB), the inputs are read
    # from the caller's arrays and the output array is that HBM storage. Copies of them (as before:
    # each input converted into a vector, the output copied out of HBM) would add another 192 MiB.
    import subprocess

    paths = [os.path.join(REPO_ROOT, "build", "python"), os.path.join(REPO_ROOT, "python")]
    r = subprocess.run([sys.executable, "-c", _HOST_MEMORY_SCRIPT] + paths, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    grew = int(r.stdout.split()[-1])
    assert grew < 240 << 20, "peak RSS grew by {} MiB".format(grew >> 20)  # either copy alone: >= 256 MiB


def test_random_inputs_are_seeded():
    a, _ = nsim.simulate_json(KERNEL, seed=7)
    b, _ = nsim.simulate_json(KERNEL, seed=7)
    c, _ = nsim.simulate_json(KERNEL, seed=8)
    np.testing.assert_array_equal(a["y"].view(np.uint16), b["y"].view(np.uint16))
    assert not np.array_equal(a["y"].view(np.uint16), c["y"].view(np.uint16))


def test_timing_only_gives_the_same_time():
    inputs = reference.make_inputs(NAME, seed=3)
    _, full = nsim.simulate_json(KERNEL, inputs=inputs)
    out, timing = nsim.simulate_json(KERNEL, inputs=inputs, timing_only=True)
    assert out == {}
    assert timing.total_time_ns == full.total_time_ns


def test_overrides_as_dict_or_list_change_timing():
    _, base = nsim.simulate_json(KERNEL, timing_only=True)
    _, slow = nsim.simulate_json(KERNEL, timing_only=True, overrides={"clock.vector": "0.48GHz"})
    _, slow2 = nsim.simulate_json(KERNEL, timing_only=True, overrides=["clock.vector=0.48GHz"])
    assert slow.total_time_ns > base.total_time_ns
    assert slow2.total_time_ns == slow.total_time_ns
    assert "0.48GHz" in slow.config_yaml
    assert "725GB/s" in nsim.effective_config("trn2", {"hbm.bw": "725GB/s"})


def test_trace_file(tmp_path):
    trace = tmp_path / "trace.json"
    nsim.simulate_json(KERNEL, timing_only=True, trace=trace)
    assert trace.exists() and trace.stat().st_size > 0


def test_config_errors():
    with pytest.raises(nsim.ConfigError) as ei:
        nsim.simulate_json(KERNEL, overrides={"tensor.pe_rowz": 1})
    assert ei.value.code == "NSIM-E101" and isinstance(ei.value, nsim.NsimError)
    assert "pe_rowz" in ei.value.message
    with pytest.raises(nsim.ConfigError) as ei:
        nsim.effective_config("trn9")
    assert ei.value.code == "NSIM-E104"
    assert ei.value.__suppress_context__  # raised `from None`


def test_kernel_errors():
    with pytest.raises(nsim.KernelError) as ei:
        nsim.simulate_json('{"nsim_kernel": 1, "body": [')
    assert ei.value.code == "NSIM-E401"
    # an index range leaving its tensor: the i-loop runs twice over 128 rows of a 128-row tensor
    k = _kernel_dict()
    k["body"][0]["loop"]["body"][0]["loop"]["stop"] = 2
    with pytest.raises(nsim.KernelError) as ei:
        nsim.check_json(k)
    e = ei.value
    assert e.code == "NSIM-E408"
    assert e.file == "examples/gen_examples.py" and e.line > 0 and e.function == "softmax"
    assert "NSIM-E408" in str(e)


def test_input_errors():
    with pytest.raises(nsim.KernelError) as ei:
        nsim.simulate_json(KERNEL, inputs={"x": np.zeros((2, 3), np.float32)})
    assert ei.value.code == "NSIM-E413"
    with pytest.raises(nsim.KernelError) as ei:
        nsim.simulate_json(KERNEL, inputs={"nope": np.zeros((2, 3), np.float32)})
    assert ei.value.code == "NSIM-E413"


def test_error_class_mapping():
    assert nsim.error_class("NSIM-E105") is nsim.ConfigError
    assert nsim.error_class("NSIM-E204") is nsim.AccessError
    assert nsim.error_class("NSIM-E302") is nsim.OperandError
    assert nsim.error_class("NSIM-E414") is nsim.KernelError
    assert nsim.error_class("NSIM-E901") is nsim.InternalError
    assert nsim.error_class("NSIM-E446") is nsim.NotSupportedError and nsim.NotSupportedError.__mro__[1] is nsim.KernelError


def test_op_table_lists_every_opcode_with_slots():
    table = nsim.op_table()
    names = [op["name"] for op in table]
    assert len(names) == len(set(names))
    with open(os.path.join(REPO_ROOT, "isa", "opcodes.def")) as f:
        defs = [line for line in f if line.startswith("OP(")]
    assert len(table) == len(defs)
    for line in defs:
        assert line.split(",")[1].strip().strip('"') in names
    for op in table:
        assert op["engines"] and op["default_engine"] in op["engines"]
        assert op["slots"], op["name"]
        for s in op["slots"]:
            assert {"name", "buffers", "dtypes", "required", "written", "vector"} <= set(s)
            assert set(s["buffers"]) <= {"hbm", "sbuf", "psum"}
    dma = table[names.index("dma_copy")]
    assert dma["slots"][0]["name"] == "dst" and dma["slots"][0]["written"]
    assert "add" in nsim.alu_ops() and "exp" in nsim.act_funcs()
    assert {"float32", "bfloat16", "float8_e4m3fn", "bool"} <= set(nsim.dtypes())
    assert nsim.version() == nsim.__version__


def test_disasm():
    lines = nsim.disasm_json(KERNEL, limit=3)
    assert len(lines) == 3 and lines[0].startswith("dma_copy") and "gen_examples.py:207" in lines[0]
    assert len(nsim.disasm_json(KERNEL)) == 14


def test_profile_config_yaml_is_the_runs_config_and_survives_pickling():
    # Profile.config_yaml is written from the run's configuration when first read (not at the end of every
    # run); a pickled Profile carries the text itself, with the run's overrides in it.
    import pickle
    _, prof = nsim.simulate_json(KERNEL, timing_only=True, overrides={"clock.vector": "0.48GHz"})
    back = pickle.loads(pickle.dumps(prof))
    assert "0.48GHz" in back.config_yaml and back.config_yaml == prof.config_yaml
    assert back.total_time_ns == prof.total_time_ns
    assert nsim.effective_config("trn2", {"clock.vector": "0.48GHz"}) == prof.config_yaml


def test_outputs_come_straight_from_hbm_with_the_sentinel_where_never_written():
    # The core hands outputs over straight from HBM (one copy into the new array); an output tensor no
    # instruction wrote at run time (its only write sits in a loop of zero trips) reads back as the
    # sentinel it was filled with (NaN for floats), in its own shape and dtype.
    k = {"nsim_kernel": 1, "name": "half", "tensors": [
        {"name": "x", "buffer": "hbm", "kind": "input", "dtype": "float32", "shape": [128, 8]},
        {"name": "y", "buffer": "hbm", "kind": "output", "dtype": "float32", "shape": [128, 8]},
        {"name": "z", "buffer": "hbm", "kind": "output", "dtype": "bfloat16", "shape": [4, 8]}],
        "body": [{"op": "dma_copy", "dst": "y", "src": "x"},
                 {"loop": {"var": "i", "start": 0, "stop": 0, "step": 1, "kind": "sequential", "body": [
                     {"op": "dma_copy", "dst": "z", "src": {"tensor": "x", "index": [{"start": 0, "size": 4},
                                                                                     {"start": 0, "size": 8}]}}]}}]}
    x = np.arange(128 * 8, dtype=np.float32).reshape(128, 8)
    outputs, _ = nsim.simulate_json(k, inputs={"x": x})
    np.testing.assert_array_equal(outputs["y"], x)
    assert outputs["z"].shape == (4, 8) and outputs["z"].dtype == ml_dtypes.bfloat16
    assert np.isnan(np.asarray(outputs["z"], dtype=np.float32)).all()
    assert not np.shares_memory(outputs["y"], x)
