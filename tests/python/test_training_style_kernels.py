"""Training-time kernels written in the style of aws-neuron/neuronx-distributed's NKI kernels and the NKI samples
(tests/python/kernels/training_style_kernels.py, Beta-1 dialect, unmodified, through ``nsim.compat``): RMSNorm
and LayerNorm backward (grad_gamma reduced over the rows by a ones-vector matmul accumulated in PSUM / by
``nl.sum`` of ``nc_transpose``d tiles accumulated in SBUF; mean/var recomputed with ``bn_stats``/``bn_aggr``),
softmax backward (fused and with nl operators), cross-entropy forward+backward over a vocabulary tiled along
the free axis (online max / log-sum-exp, onehot from ``nisa.iota``) and a fused AdamW step updating its
arguments in place. Outputs against float64 numpy written here (fp32 and bf16, ragged last row tiles and
ragged free-dim chunks), and the instruction, DMA and traffic counts their structure implies.

Also the three nsim fixes these kernels needed: a kernel argument written in place (the optimizer's param /
exp_avg / exp_avg_sq) was copied into its output by a simulated HBM-to-HBM DMA before the kernel, which added
that traffic and time to the kernel's and made the analysis report the kernel's own loads of its arguments as
an HBM round trip (now the output starts as a copy made outside the simulation, kernel.json ``"init"``);
the allocator's value-level liveness, which needs a write covering every partition to end a value, so a ragged
last tile's masked tiles (rows 0..43) stayed live across the unrolled iterations and a kernel that fits was
rejected with an SBUF overflow (NSIM-E204); and ``nisa.tensor_scalar(engine=nisa.scalar_engine)``, which ScalarE
runs from gen3 on only, ran on trn1 without a word (now NSIM-E313 at the kernel's line)."""
import json
import re

import numpy as np
import pytest

from conftest import beta1_modules, executed_ops, require_core, sample_fixture  # noqa: E402
from conftest import op_counts as _ops  # noqa: E402

_core, ml_dtypes = require_core()
from numeric_helpers import close, rounded  # noqa: E402
from numeric_helpers import randn as _randn, f64 as _f64  # noqa: E402

BF16 = ml_dtypes.bfloat16

tk = sample_fixture("training_style_kernels.py")


def _name(operand):
    """The tensor an op operand names (a bare name, or a view {"tensor": ..., "index": ...})."""
    return operand if isinstance(operand, str) else operand["tensor"]


# --------------------------------------------------------------------------------------------------
# RMSNorm backward
# --------------------------------------------------------------------------------------------------

def ref_rmsnorm_bwd(x, gamma, dy, eps):
    x, gamma, dy = _f64(x), _f64(gamma), _f64(dy)
    rstd = 1.0 / np.sqrt((x * x).mean(-1, keepdims=True) + eps)
    g = dy * gamma
    grad_x = rstd * g - x * rstd ** 3 * (g * x).mean(-1, keepdims=True)
    return grad_x, (dy * x * rstd).sum(0)


@pytest.mark.parametrize("n,h,dtype", [
    (200, 768, np.float32),   # a ragged row tile of 72 rows, grad_gamma over a full and a half PSUM bank
    (128, 512, BF16),         # one full tile, one bank
    (77, 1024, np.float32),   # one partial tile, two banks
])
def test_rmsnorm_bwd_matches_numpy(tk, n, h, dtype):
    mod = tk[0]
    x = _randn((n, h), dtype, seed=n)
    gamma = (1.0 + _randn((h,), np.float32, seed=h, scale=0.1)).astype(dtype)
    dy = _randn((n, h), dtype, seed=n + 1)
    grad_x, grad_gamma = mod.nki_rmsnorm_bwd_kernel(x, gamma, dy, 1e-6)
    assert grad_x.shape == (n, h) and grad_gamma.shape == (h,) and grad_x.dtype == np.dtype(dtype)
    want_x, want_g = ref_rmsnorm_bwd(x, gamma, dy, 1e-6)
    close(grad_x, want_x, dtype)
    if dtype == BF16:
        close(grad_gamma, want_g, BF16)
    else:  # a sum of n products in fp32: relative to the sum's scale
        np.testing.assert_allclose(grad_gamma, want_g, rtol=1e-5, atol=1e-5 * np.sqrt(n))


def test_rmsnorm_bwd_structure(tk):
    """[200, 768]: 2 row tiles; grad_gamma by 2 x 2 ones-vector matmuls accumulated into one PSUM row (the second
    bank's 256 columns masked), evicted and stored once; rstd from one activation_reduce and one activation per
    tile; every input byte read once."""
    mod = tk[0]
    n, h = 200, 768
    x, dy, gamma = _randn((n, h), np.float32, 1), _randn((n, h), np.float32, 2), _randn((h,), np.float32, 3)
    mod.nki_rmsnorm_bwd_kernel(x, gamma, dy, 1e-6)
    k = mod.nki_rmsnorm_bwd_kernel
    ops = executed_ops(k.last_json["body"])
    red = [o for o in ops if o["op"] == "nc_matmul" and _name(o["dst"]) == "dgamma_psum"]
    assert len(red) == 2 * 2 and all("accumulate" in o.get("flags", []) for o in red)
    assert [o["moving"]["index"][1]["size"] for o in red] == [512, 256] * 2
    assert [o["moving"]["index"][0]["size"] for o in red] == [128] * 4  # zero-filled rows: no partition mask
    c = _ops(k)
    assert c["activation_reduce"] == 2 and c["activation"] == 2 and c["scalar_tensor_tensor"] == 4
    prof = k.last_profile
    assert prof.stat("memory.hbm_read_bytes") == x.nbytes + dy.nbytes + gamma.nbytes
    assert prof.stat("memory.hbm_write_bytes") == x.nbytes + gamma.nbytes


# --------------------------------------------------------------------------------------------------
# LayerNorm backward
# --------------------------------------------------------------------------------------------------

def ref_layernorm_bwd(x, gamma, dy, eps):
    x, gamma, dy = _f64(x), _f64(gamma), _f64(dy)
    mean = x.mean(-1, keepdims=True)
    rstd = 1.0 / np.sqrt(x.var(-1, keepdims=True) + eps)
    xhat = (x - mean) * rstd
    g = dy * gamma
    grad_x = rstd * (g - g.mean(-1, keepdims=True) - xhat * (g * xhat).mean(-1, keepdims=True))
    return grad_x, (dy * xhat).sum(0), dy.sum(0)


@pytest.mark.parametrize("n,h,dtype", [
    (200, 640, np.float32),   # bn_stats over 512 + 128 columns (the second chunk masked), a ragged row tile
    (130, 256, BF16),         # a last tile of 2 rows
    (128, 1152, np.float32),  # three bn_stats chunks
])
def test_layernorm_bwd_matches_numpy(tk, n, h, dtype):
    mod = tk[0]
    x = (_randn((n, h), np.float32, seed=h) * 2 + 0.5).astype(dtype)
    gamma = (1.0 + _randn((h,), np.float32, seed=n, scale=0.2)).astype(dtype)
    dy = _randn((n, h), dtype, seed=n + h)
    grad_x, grad_gamma, grad_beta = mod.nki_layernorm_bwd_kernel(x, gamma, dy, 1e-5)
    want_x, want_g, want_b = ref_layernorm_bwd(x, gamma, dy, 1e-5)
    close(grad_x, want_x, dtype)
    tol = 1e-2 if dtype == BF16 else 1e-5
    np.testing.assert_allclose(_f64(grad_gamma), want_g, rtol=tol, atol=tol * np.sqrt(n))
    np.testing.assert_allclose(_f64(grad_beta), want_b, rtol=tol, atol=tol * np.sqrt(n))
    # grad_x of a LayerNorm is orthogonal to the ones vector and to x_hat: the mean is removed
    assert np.abs(_f64(grad_x).sum(-1)).max() < (1e-3 if dtype == np.float32 else 5e-2) * np.sqrt(h)


def test_layernorm_bwd_structure(tk):
    """[200, 640]: per row tile 2 bn_stats (512 + 128 columns), one bn_aggr, and 2 x 5 PE transposes for the
    column sums of dy * x_hat and dy (H = 5 x 128) reduced on VectorE; grad_gamma and grad_beta stored once."""
    mod = tk[0]
    n, h = 200, 640
    x, dy, gamma = _randn((n, h), np.float32, 4), _randn((n, h), np.float32, 5), _randn((h,), np.float32, 6)
    mod.nki_layernorm_bwd_kernel(x, gamma, dy, 1e-5)
    k = mod.nki_layernorm_bwd_kernel
    c = _ops(k)
    assert c["bn_stats"] == 2 * 2 and c["bn_aggr"] == 2 and c["nc_transpose"] == 2 * 2 * 5, c
    ops = executed_ops(k.last_json["body"])
    stats = [o for o in ops if o["op"] == "bn_stats"]
    assert [o["data"]["index"][-1]["size"] for o in stats] == [512, 128] * 2
    stores = [o for o in ops if o["op"] == "dma_copy" and _name(o["dst"]) in ("grad_gamma", "grad_beta")]
    assert len(stores) == 2 * 5
    prof = k.last_profile
    assert prof.stat("memory.hbm_read_bytes") == x.nbytes + dy.nbytes + gamma.nbytes
    assert prof.stat("memory.hbm_write_bytes") == x.nbytes + 2 * gamma.nbytes


# --------------------------------------------------------------------------------------------------
# Softmax backward
# --------------------------------------------------------------------------------------------------

def _softmax(z):
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.mark.parametrize("n,d,dtype", [(200, 1000, np.float32), (300, 512, BF16), (64, 4096, np.float32)])
def test_softmax_bwd_matches_numpy(tk, n, d, dtype):
    mod = tk[0]
    y = _softmax(_randn((n, d), np.float64, seed=d, scale=2.0)).astype(dtype)
    dy = _randn((n, d), dtype, seed=n)
    Y, DY = _f64(y), _f64(dy)
    want = Y * (DY - (DY * Y).sum(-1, keepdims=True))
    for k in (mod.nki_softmax_bwd_kernel, mod.nki_softmax_bwd_naive_kernel):
        got = k(y, dy)
        assert got.dtype == np.dtype(dtype)
        # values of order 1/d: compare relative to the row's scale
        scale = np.abs(want).max()
        np.testing.assert_allclose(_f64(got) / scale, want / scale, rtol=0, atol=1e-2 if dtype == BF16 else 1e-6)


def test_softmax_bwd_structure(tk):
    """[512, 2048], 4 row tiles: per tile the fused kernel issues a multiply, a reduce and one scalar_tensor_tensor
    ((dy - s) * y), the nl-operator one a subtract and a multiply in place of the last; y and dy read once, dx
    written once. (Not asserted: which is faster. The nl one spreads its extra pass over VectorE and GpSimd and
    is as fast here; the fused one wins on the smaller [200, 1000].)"""
    mod = tk[0]
    y = _softmax(_randn((512, 2048), np.float64, seed=7)).astype(np.float32)
    dy = _randn((512, 2048), np.float32, seed=8)
    fused, naive = mod.nki_softmax_bwd_kernel, mod.nki_softmax_bwd_naive_kernel
    np.testing.assert_allclose(fused(y, dy), naive(y, dy), rtol=1e-5, atol=1e-9)
    assert _ops(fused) == {"dma_copy": 3 * 4, "tensor_tensor": 4, "tensor_reduce": 4, "scalar_tensor_tensor": 4}
    assert _ops(naive) == {"dma_copy": 3 * 4, "tensor_tensor": 2 * 4, "tensor_reduce": 4, "tensor_scalar": 4}
    for k in (fused, naive):
        assert k.last_profile.stat("memory.hbm_read_bytes") == y.nbytes + dy.nbytes
        assert k.last_profile.stat("memory.hbm_write_bytes") == y.nbytes
    fused(y[:200, :1000].copy(), dy[:200, :1000].copy())
    naive(y[:200, :1000].copy(), dy[:200, :1000].copy())
    assert fused.last_profile.total_time_ns < naive.last_profile.total_time_ns


# --------------------------------------------------------------------------------------------------
# Cross-entropy forward + backward
# --------------------------------------------------------------------------------------------------

def ref_cross_entropy(logits, labels):
    z = _f64(logits)
    m = z.max(-1, keepdims=True)
    lse = m[:, 0] + np.log(np.exp(z - m).sum(-1))
    loss = lse - z[np.arange(len(labels)), labels]
    grad = np.exp(z - lse[:, None])
    grad[np.arange(len(labels)), labels] -= 1.0
    return loss, grad


@pytest.mark.parametrize("n,v,dtype", [
    (200, 1300, np.float32),  # 3 vocab chunks (512, 512, 276), a ragged row tile
    (64, 300, BF16),          # one partial chunk, one partial row tile
    (130, 2048, np.float32),  # 4 full chunks, a last tile of 2 rows
])
def test_cross_entropy_matches_numpy(tk, n, v, dtype):
    mod = tk[0]
    # large logits: the online max matters (exp without it overflows fp32)
    logits = (_randn((n, v), np.float32, seed=v, scale=4.0) + 100.0).astype(dtype)
    labels = np.random.default_rng(n).integers(0, v, n).astype(np.int32)
    labels[:4] = [0, v - 1, min(511, v - 1), min(512, v - 1)]  # the first / last column, a chunk border
    loss, dlogits = mod.nki_cross_entropy_kernel(logits, labels)
    assert loss.shape == (n,) and loss.dtype == np.float32
    assert dlogits.shape == (n, v) and dlogits.dtype == np.dtype(dtype)
    want_loss, want_grad = ref_cross_entropy(logits, labels)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5, atol=1e-4)
    if dtype == BF16:
        close(dlogits, want_grad, BF16)
    else:
        np.testing.assert_allclose(dlogits, want_grad, rtol=1e-5, atol=1e-6)
    # each row of dlogits sums to 0 and is -1 + p at the label
    np.testing.assert_allclose(_f64(dlogits).sum(-1), 0.0, atol=1e-4 if dtype == np.float32 else 2e-2)
    assert (_f64(dlogits)[np.arange(n), labels] < 0).all()


def test_cross_entropy_structure(tk):
    """[200, 1300]: 2 row tiles x 3 vocab chunks; the logits are read twice (the statistics pass and the
    gradient pass), dlogits written once; one iota for the column ids; one activation_reduce (exp and row sum)
    per chunk in pass 1 and one exp activation per chunk in pass 2; the last chunk's loads move 276 columns."""
    mod = tk[0]
    n, v = 200, 1300
    logits = _randn((n, v), np.float32, seed=9)
    labels = np.random.default_rng(9).integers(0, v, n).astype(np.int32)
    mod.nki_cross_entropy_kernel(logits, labels)
    k = mod.nki_cross_entropy_kernel
    c = _ops(k)
    assert c["iota"] == 1 and c["activation_reduce"] == 2 * 3, c
    ops = executed_ops(k.last_json["body"])
    loads = [o for o in ops if o["op"] == "dma_copy" and _name(o["src"]) == "logits"]
    assert [o["src"]["index"][1]["size"] for o in loads] == [512, 512, 276] * 4
    assert [o["src"]["index"][0]["size"] for o in loads] == [128] * 6 + [72] * 6
    prof = k.last_profile
    assert prof.stat("memory.hbm_read_bytes") == 2 * logits.nbytes + labels.nbytes
    assert prof.stat("memory.hbm_write_bytes") == logits.nbytes + n * 4


# --------------------------------------------------------------------------------------------------
# AdamW
# --------------------------------------------------------------------------------------------------

def ref_adamw(p, g, m, v, lr, beta1, beta2, eps, weight_decay, step):
    p, g, m, v = _f64(p), _f64(g), _f64(m), _f64(v)
    p = p * (1 - lr * weight_decay)
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    denom = np.sqrt(v) / np.sqrt(1 - beta2 ** step) + eps
    return p - lr / (1 - beta1 ** step) * m / denom, m, v


def _adam_state(shape, seed):
    rng = np.random.default_rng(seed)
    p = rng.standard_normal(shape).astype(np.float32)
    g = rng.standard_normal(shape).astype(np.float32)
    m = (rng.standard_normal(shape) * 0.1).astype(np.float32)
    v = (rng.random(shape) * 0.01).astype(np.float32)
    return p, g, m, v


HYPER = dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01)


@pytest.mark.parametrize("shape,step", [
    ((260, 2100), 1),   # ragged rows and a ragged 52-column chunk (this shape was an SBUF overflow, NSIM-E204)
    ((128, 512), 10),
    ((300, 700), 1000),
])
@pytest.mark.parametrize("name", ["nki_adamw_kernel", "nki_adamw_naive_kernel"])
def test_adamw_matches_torch_semantics(tk, shape, step, name):
    """In place: the caller's param / exp_avg / exp_avg_sq hold the new values, and the kernel returns them."""
    k = getattr(tk[0], name)
    p, g, m, v = _adam_state(shape, seed=shape[0] + step)
    want = ref_adamw(p, g, m, v, step=step, **HYPER)
    g0 = g.copy()
    out = k(p, g, m, v, step=step, **HYPER)
    for got, caller, w in zip(out, (p, m, v), want):
        np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-7)
        np.testing.assert_array_equal(caller, got)
    np.testing.assert_array_equal(g, g0)  # the gradient is read only


def test_adamw_fused_structure_and_traffic(tk):
    """[260, 2100]: 3 x 2 tiles. Per tile 4 loads, 3 stores and 9 compute instructions (5 on ScalarE, 3 fused
    scalar_tensor_tensor on VectorE, one product on GpSimd) against 14 for the nl-operator port. Every byte of
    the four states is read once and three are written once: the in-place arguments cost no extra copy."""
    mod = tk[0]
    shape = (260, 2100)
    fused, naive = mod.nki_adamw_kernel, mod.nki_adamw_naive_kernel
    for k in (fused, naive):
        p, g, m, v = _adam_state(shape, seed=1)
        k(p, g, m, v, step=3, **HYPER)
        prof = k.last_profile
        assert prof.stat("memory.hbm_read_bytes") == 4 * p.nbytes
        assert prof.stat("memory.hbm_write_bytes") == 3 * p.nbytes
        assert _ops(k)["dma_copy"] == 6 * 7
        assert "hbm_roundtrip" not in [f["kind"] for f in prof.analyze().findings]
    c = _ops(fused)
    assert c == {"dma_copy": 42, "activation": 6 * 4, "tensor_scalar": 6, "scalar_tensor_tensor": 6 * 3,
                 "tensor_tensor": 6}, c
    assert sum(n for op, n in _ops(naive).items() if op != "dma_copy") == 6 * 14
    prof = fused.last_profile
    # The 5 pinned to ScalarE per tile run there and the GpSimd product there; the 3 scalar_tensor_tensor without an
    # engine go where they finish first, and so do the transfers' triggers (Sync, or ScalarE's hardware DGE on trn2:
    # the compiler's placement, which the in-place loads' overlap moves).
    n = {e: prof.stat("engine.{}.instruction_count".format(e)) for e in ("scalar", "vector", "gpsimd", "sync")}
    assert n["scalar"] >= 6 * 5 and n["gpsimd"] == 6
    assert sum(n.values()) == 6 * 9 + 42
    assert (n["scalar"] + n["vector"] > 6 * 8) == (prof.stat("dma.hardware_dynamic_active_time") > 0), n


# --------------------------------------------------------------------------------------------------
# The nsim fixes
# --------------------------------------------------------------------------------------------------

_INPLACE = '''
import neuronxcc.nki as nki
import neuronxcc.nki.language as nl


@nki.jit
def add_in_place(x, y):
  i_p = nl.arange(128)[:, None]
  i_f = nl.arange(x.shape[1])[None, :]
  for i in nl.affine_range(x.shape[0] // 128):
    a = nl.load(x[i * 128 + i_p, i_f])
    b = nl.load(y[i * 128 + i_p, i_f])
    nl.store(x[i * 128 + i_p, i_f], value=nl.add(a, b))
  return x


@nki.jit
def add_out_of_place(x, y):
  out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
  i_p = nl.arange(128)[:, None]
  i_f = nl.arange(x.shape[1])[None, :]
  for i in nl.affine_range(x.shape[0] // 128):
    a = nl.load(x[i * 128 + i_p, i_f])
    b = nl.load(y[i * 128 + i_p, i_f])
    nl.store(out[i * 128 + i_p, i_f], value=nl.add(a, b))
  return out
'''


@pytest.fixture(scope="module")
def inplace(tmp_path_factory):
    path = tmp_path_factory.mktemp("inplace") / "inplace_kernels.py"
    path.write_text(_INPLACE)
    with beta1_modules(str(path)) as (mod,):
        yield mod


def test_in_place_argument_costs_what_an_output_costs(inplace):
    """Writing an argument in place is the same kernel as writing a new output: same time, same HBM traffic, no
    HBM round trip reported. (nsim copied the argument into its output with a simulated DMA before the kernel:
    2 x the argument's bytes more traffic, the time of the copy, and the kernel's loads of the argument reported
    as reading back what the kernel wrote.) The copy is now the output's initial contents (kernel.json "init")."""
    x, y = _randn((256, 1024), np.float32, 1), _randn((256, 1024), np.float32, 2)
    want = x + y
    out = inplace.add_out_of_place(x, y)
    np.testing.assert_array_equal(out, want)
    got = inplace.add_in_place(x, y)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(x, want)  # the caller's array updated
    a, b = inplace.add_in_place.last_profile, inplace.add_out_of_place.last_profile
    assert a.total_time_ns == b.total_time_ns
    for s in ("memory.hbm_read_bytes", "memory.hbm_write_bytes"):
        assert a.stat(s) == b.stat(s)
    assert "hbm_roundtrip" not in [f["kind"] for f in a.analyze().findings]
    kj = inplace.add_in_place.last_json
    assert [o["op"] for o in executed_ops(kj["body"])].count("dma_copy") == 2 * 3
    out_t = [t for t in kj["tensors"] if t["kind"] == "output"]
    assert [(t["name"], t.get("init")) for t in out_t] == [("x__out", "x")]


def test_kernel_json_init_must_name_an_earlier_input():
    """kernel.json "init": an input tensor declared before, of the same dtype and shape; else a clear error."""
    from nsim import _core as core
    base = {"nsim_kernel": 1, "name": "k", "tensors": [
        {"name": "x", "buffer": "hbm", "kind": "input", "dtype": "float32", "shape": [128, 4]},
        {"name": "y", "buffer": "hbm", "kind": "output", "dtype": "float32", "shape": [128, 4], "init": "x"}],
        "body": [{"alloc": {"name": "t", "buffer": "sbuf", "dtype": "float32", "shape": [128, 4]}},
                 {"op": "dma_copy", "dst": "t", "src": "y"},
                 {"op": "tensor_scalar", "dst": "t", "data": "t", "alu0": "add", "imm": [1.0],
                  "flags": ["has_imm0"]},
                 {"op": "dma_copy", "dst": "y", "src": "t"}]}
    x = np.arange(512, dtype=np.float32).reshape(128, 4)
    outputs, _profile = core.simulate_json(json.dumps(base), inputs={"x": x})
    np.testing.assert_array_equal(outputs["y"], x + 1)  # y started as x
    for init, shape, msg in (("nope", [128, 4], "must name an input tensor"),
                             ("x", [128, 8], "tensors[1] \"y\".init: init 'x' is float32 [128, 4], this tensor float32 [128, 8]")):
        bad = json.loads(json.dumps(base))
        bad["tensors"][1]["init"], bad["tensors"][1]["shape"] = init, shape
        with pytest.raises(core.NsimError, match=re.escape(msg)):
            core.simulate_json(json.dumps(bad), inputs={"x": x})


def test_scalar_engine_tensor_scalar_needs_gen3(tk):
    """The AdamW kernel adds eps with ``nisa.tensor_scalar(..., engine=nisa.scalar_engine)``: ScalarE runs
    tensor_scalar from gen3 (trn2) on (nki-api.md 2.1). On trn1 nsim ran it there silently; now a clear error at
    the kernel's line. (The same kernel runs on trn2 and trn3.)"""
    mod = tk[0]
    p, g, m, v = _adam_state((128, 256), seed=3)
    want = ref_adamw(p, g, m, v, step=1, **HYPER)
    with pytest.raises(_core.NsimError, match=r"tensor_scalar: engine=scalar needs gen3 or later") as ei:
        mod.nki_adamw_kernel.options(config="trn1").simulate(p.copy(), g, m.copy(), v.copy(), step=1, **HYPER)
    assert "training_style_kernels.py:" in str(ei.value) + "".join(str(a) for a in ei.value.args)
    for cfg in ("trn2", "trn3"):
        out, _prof = mod.nki_adamw_kernel.options(config=cfg).simulate(p.copy(), g, m.copy(), v.copy(), step=1,
                                                                       **HYPER)
        np.testing.assert_allclose(out[0], want[0], rtol=1e-5, atol=1e-7)
