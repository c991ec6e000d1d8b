"""Scheduling directives in both NKI dialects (issue 9): nisa ``name=`` -> op ``label``, ``no_reorder``
blocks -> op ``order_group``, ``kernel.with_schedule`` -> kernel-level ``schedule``; kernels using them
still compute the numpy result. (Their effect on timing is tested with the scheduler.)"""
import numpy as np
import pytest

import nsim
from nsim import nki, tracer
import nsim.nki.language as nl
import nsim.nki.isa as nisa
import nsim.nki.beta1 as nki1
import nsim.nki.beta1.language as nl1
import nsim.nki.beta1.isa as nisa1
import nsim.nki.beta1.compiler as ncc1
import nki_cpu_simulator.nki.compiler as ncc  # what `import nki.compiler` resolves to under nsim.compat
from conftest import executed_ops  # noqa: E402


@pytest.fixture
def core():
    from conftest import require_core

    return require_core()


def _ops(kernel_json):
    return executed_ops(kernel_json["body"])


def _x(shape=(128, 64), seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# --------------------------------------------------------------------------------------------------
# new dialect
# --------------------------------------------------------------------------------------------------


@nki.jit
def scale_exp(x):
    """out = exp(2x) + 1 with named instructions and two no_reorder blocks (the first one nested)."""
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x, name="load")
    with nl.no_reorder():
        nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=2.0, name="mul")
        with nl.no_reorder():
            nisa.activation(dst=t, op=nl.exp, data=t, name="exp")
    with ncc.no_reorder():
        nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=1.0)
    nisa.dma_copy(dst=out, src=t, name="store")
    return out


def _scale_exp_ref(x):
    return np.exp(2 * x) + 1


def test_labels_and_order_groups_new_dialect():
    ops = _ops(scale_exp.to_json(_x()))
    assert [o["op"] for o in ops] == ["dma_copy", "tensor_scalar", "activation", "tensor_scalar", "dma_copy"]
    assert [o.get("label") for o in ops] == ["load", "mul", "exp", None, "store"]
    # one id per outermost block, nested blocks share it, ops outside carry none
    assert [o.get("order_group") for o in ops] == [None, 1, 1, 2, None]
    assert "schedule" not in scale_exp.last_json


def test_with_schedule_new_dialect():
    k = scale_exp.with_schedule([("store", "load"), ("exp", ["mul", "load"])])
    assert isinstance(k, nki.Kernel) and callable(k) and hasattr(k, "simulate") and hasattr(k, "options")
    j = k.to_json(_x())
    assert j["schedule"] == [["store", ["load"]], ["exp", ["mul", "load"]]]
    # the original kernel is unchanged; edges accumulate
    assert "schedule" not in scale_exp.to_json(_x())
    k2 = k.with_schedule([("mul", "load")])
    assert k2.to_json(_x())["schedule"][-1] == ["mul", ["load"]]
    assert len(k2.schedule) == 3 and len(k.schedule) == 2


def test_with_schedule_unknown_name():
    k = scale_exp.with_schedule([("store", ["load", "lod"])])
    with pytest.raises(nsim.tracer.KernelError) as ei:
        k.to_json(_x())
    assert ei.value.code == "NSIM-E406" and "'lod'" in str(ei.value)
    with pytest.raises(nsim.tracer.KernelError, match="'nope'"):
        scale_exp.with_schedule([("nope", "load")]).to_json(_x())


def test_check_rejects_what_run_rejects_for_unknown_labels():
    # A kernel.json whose op runs "after" a label no op carries (or whose schedule names none): `nsim check` /
    # check_json rejected it as the run does (found by the C++ fuzz driver: check accepted, run gave E406).
    j = scale_exp.to_json(_x())
    [exp] = [o for o in j["body"] if o.get("label") == "exp"]
    exp["after"] = ["(i)"]
    for bad in (j, dict(scale_exp.to_json(_x()), schedule=[["store", ["lod"]]])):
        with pytest.raises(nsim.NsimError) as ei:
            nsim.check_json(bad)
        assert ei.value.code == "NSIM-E406", ei.value
        with pytest.raises(nsim.NsimError) as er:
            nsim.simulate_json(bad, timing_only=True)
        assert str(er.value) == str(ei.value)


@pytest.mark.parametrize("bad", ["store", [("a",)], [("a", 3)], [(None, "a")], 5])
def test_with_schedule_bad_argument(bad):
    with pytest.raises(TypeError):
        scale_exp.with_schedule(bad)


def test_labels_in_loops_and_positional_name():
    @nki.jit
    def k(x):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        for i in nl.affine_range(2):
            t = nl.ndarray((64, 64), x.dtype, buffer=nl.sbuf)
            nisa.dma_copy(t, x[i * 64:(i + 1) * 64, :], None, nisa.oob_mode.error, nisa.dge_mode.unknown,
                          nisa.engine.unknown, "ld")  # name= as the 7th positional argument
            nisa.dma_copy(dst=out[i * 64:(i + 1) * 64, :], src=t, name="st")
        return out

    j = k.with_schedule([("st", "ld")]).to_json(_x())
    assert [o.get("label") for o in _ops(j)] == ["ld", "st", "ld", "st"]


def test_name_must_be_a_string():
    @nki.jit
    def k(x):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=x, name=3)
        return out

    with pytest.raises(nsim.tracer.KernelError, match="name="):
        k.to_json(_x())


def test_value_api_keeps_outer_label():
    """An nl value call or a wrapper that emits several ops: every op of the named call gets the name."""
    @nki.jit
    def k(x):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        b = nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=b, value=2.0)
        nisa.range_select(dst=t, on_true_tile=t, comp_op0=nl.greater_equal, comp_op1=nl.less, bound0=0.0,
                          bound1=b, reduce_cmd=nisa.reduce_cmd.idle, name="rs")
        nisa.dma_copy(dst=out, src=t)
        return out

    ops = _ops(k.to_json(_x()))
    rs = [o for o in ops if o.get("label") == "rs"]
    assert rs[-1]["op"] == "range_select" and len(rs) == 2  # the memset of the scalar bound too


def test_dynamic_loops_not_allowed_in_no_reorder():
    @nki.jit
    def k(x, which):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        with nl.no_reorder():
            for _ in nl.static_range(2):  # static loops are fine
                nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=1.0)
            if which == "dynamic_range":
                for _ in nl.dynamic_range(2):
                    pass
            elif which == "fori_loop":
                nl.fori_loop(0, 2, lambda i: None)
            elif which == "while_loop":
                nl.while_loop(0, lambda r: r)
        nisa.dma_copy(dst=out, src=t)
        return out

    k.to_json(_x(), None)
    for which in ("dynamic_range", "fori_loop", "while_loop"):
        with pytest.raises(nsim.tracer.KernelError, match="no_reorder") as ei:
            k.to_json(_x(), which)
        assert ei.value.code == "NSIM-E432"


def test_dynamic_loops_outside_no_reorder():
    @nki.jit
    def k(x):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        for _ in nl.dynamic_range(1, 3):
            nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=1.0)
        nl.fori_loop(0, 3, lambda i: nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=1.0) and None)
        nisa.dma_copy(dst=out, src=t)
        return out

    assert sum(o["op"] == "tensor_scalar" for o in _ops(k.to_json(_x()))) == 5


def test_no_reorder_outside_a_kernel_is_a_no_op():
    with nl.no_reorder():
        pass
    assert tracer.active() is None


def test_new_dialect_computes_and_core_accepts(core):
    x = _x()
    k = scale_exp.with_schedule([("store", "load"), ("exp", ["mul", "load"])])
    y, prof = k.simulate(x)
    np.testing.assert_allclose(y, _scale_exp_ref(x), rtol=1e-3, atol=1e-3)
    assert prof.kernel["schedule"] == [["store", ["load"]], ["exp", ["mul", "load"]]]
    labels = [o.get("label") for o in prof.kernel["body"] if "op" in o]
    assert "exp" in labels and "mul" in labels
    nsim.check_json(k.to_json(x))
    np.testing.assert_allclose(scale_exp(x), _scale_exp_ref(x), rtol=1e-3, atol=1e-3)


# --------------------------------------------------------------------------------------------------
# Beta 1
# --------------------------------------------------------------------------------------------------


@nki1.jit
def b1_kernel(a, c):
    x = nl1.load(a)
    with ncc1.no_reorder():
        y = nisa1.activation(op=nl1.exp, data=x, name="e")
        z = nl1.multiply(y, 2.0)
    with nl1.no_reorder():
        z = nisa1.tensor_scalar(z, nl1.add, 1.0, name="p1")
    for i in nl1.sequential_range(2, directives=ncc1.no_reorder()):
        z = nisa1.tensor_scalar(z, nl1.multiply, 0.5, name="h{}".format(i))
    nisa1.dma_copy(dst=c, src=z, name="st")


def _b1_ref(a):
    return (np.exp(a) * 2 + 1) * 0.25


def test_labels_and_order_groups_beta1():
    a = _x()
    ops = _ops(b1_kernel.to_json(a, np.zeros_like(a)))
    by_label = {o["label"]: o for o in ops if "label" in o}
    assert set(by_label) == {"e", "p1", "h0", "h1", "st"}
    assert by_label["e"]["op"] == "activation" and by_label["st"]["op"] == "dma_copy"
    assert by_label["e"]["order_group"] == 1 and by_label["p1"]["order_group"] == 2
    assert by_label["h0"]["order_group"] == by_label["h1"]["order_group"] == 3
    assert "order_group" not in by_label["st"]
    mul = [o for o in ops if o["op"] == "tensor_scalar" and "label" not in o]
    assert [o.get("order_group") for o in mul] == [1]


def test_with_schedule_beta1():
    a = _x()
    k = b1_kernel.with_schedule([("h1", ["e", "h0"]), ("st", "p1")])
    assert isinstance(k, nki1.Kernel) and hasattr(k, "simulate") and hasattr(k, "with_schedule")
    j = k.to_json(a, np.zeros_like(a))
    assert j["schedule"] == [["h1", ["e", "h0"]], ["st", ["p1"]]]
    with pytest.raises(nsim.tracer.KernelError, match="'h2'"):
        b1_kernel.with_schedule([("h2", "e")]).to_json(a, np.zeros_like(a))
    # a launch grid keeps the schedule
    assert k[1].to_json(a, np.zeros_like(a))["schedule"] == j["schedule"]


def test_beta1_computes(core):
    a = _x(seed=3)
    c = np.zeros_like(a)
    k = b1_kernel.with_schedule([("h1", ["e", "h0"]), ("st", "p1")])
    nki1.simulate_kernel(k, a, c)
    np.testing.assert_allclose(c, _b1_ref(a), rtol=1e-3, atol=1e-3)
    nsim.check_json(k.last_json)
    c2 = np.zeros_like(a)
    _, prof = b1_kernel.simulate(a, c2)
    np.testing.assert_allclose(c2, _b1_ref(a), rtol=1e-3, atol=1e-3)
    assert any(o.get("order_group") == 3 for o in prof.kernel["body"] if "op" in o)
