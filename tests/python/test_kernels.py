"""nsim.kernels: every library kernel vs its numpy reference on trn1, trn2 and trn3."""
import numpy as np
import pytest

from conftest import executed_ops, require_core  # noqa: E402

_core, ml_dtypes = require_core()

from nsim import kernels as K  # noqa: E402

BF16 = np.dtype(ml_dtypes.bfloat16)
CONFIGS = ["trn1", "trn2", "trn3"]


def _run(kernel, args, config):
    out, prof = kernel.options(config=config).simulate(*args)
    assert prof.total_time_ns > 0
    return out


def _check(out, ref, in_dtype):
    """bf16: |out - ref| <= 2e-2 * max(|ref|, max|ref| ... ) elementwise with an atol relative to max|ref|;
    fp32: 1e-5."""
    out = np.asarray(out).astype(np.float32)
    ref = np.asarray(ref, dtype=np.float32)
    assert out.shape == ref.shape
    assert np.all(np.isfinite(out))
    tol = 2e-2 if np.dtype(in_dtype) == BF16 else 1e-5
    scale = float(np.max(np.abs(ref))) or 1.0
    np.testing.assert_allclose(out, ref, rtol=tol, atol=tol * scale)


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("name", sorted(K.KERNELS))
def test_kernel_vs_reference(name, config):
    kernel, ref, make_inputs = K.KERNELS[name]
    args = make_inputs(1)
    out = _run(kernel, args, config)
    assert out.dtype == args[0].dtype or name.startswith("matmul")
    _check(out, ref(*args), args[0].dtype)


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("shape", [(2, 128, 512), (4, 256, 1024), (1, 1, 64), (2, 300, 768)])
def test_softmax_shapes(shape, config):
    args = K.softmax_inputs(seed=2, shape=shape, scale=0.25)
    out = _run(K.softmax, args, config)
    assert out.dtype == BF16 and out.shape == shape
    ref = K.softmax_ref(*args)
    np.testing.assert_allclose(out.astype(np.float32), ref, rtol=2e-2, atol=1e-4)
    np.testing.assert_allclose(out.astype(np.float32).sum(-1), 1.0, atol=2e-2)


def test_softmax_negative_scale():
    args = K.softmax_inputs(seed=3, shape=(1, 130, 64), scale=-0.5)
    _check(_run(K.softmax, args, "trn2"), K.softmax_ref(*args), BF16)


@pytest.mark.parametrize("config", CONFIGS)
def test_tensor_add_fp32_exact(config):
    a, b = K.tensor_add_inputs(seed=4, shape=(384, 200))
    np.testing.assert_array_equal(_run(K.tensor_add, (a, b), config), a + b)


def test_tensor_add_bf16():
    a, b = K.tensor_add_inputs(seed=5, shape=(128, 96), dtype=BF16)
    out = _run(K.tensor_add, (a, b), "trn2")
    assert out.dtype == BF16
    np.testing.assert_array_equal(out, (a.astype(np.float32) + b.astype(np.float32)).astype(BF16))


@pytest.mark.parametrize("config", CONFIGS)
def test_norms_fp32(config):
    args = K.rmsnorm_inputs(seed=6, n=200, d=640, dtype=np.float32)  # D > 512: two broadcast chunks
    _check(_run(K.rmsnorm, args, config), K.rmsnorm_ref(*args), np.float32)
    args = K.layernorm_inputs(seed=7, n=130, d=1100, dtype=np.float32)  # 3 bn_stats chunks, ragged
    np.testing.assert_allclose(_run(K.layernorm, args, config), K.layernorm_ref(*args), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("config", CONFIGS)
def test_matmul_fp32_and_ragged_n(config):
    rng = np.random.default_rng(8)
    a = rng.standard_normal((128, 256)).astype(np.float32)
    b = rng.standard_normal((256, 200)).astype(np.float32)
    ref = a @ b
    for k in (K.matmul_naive, K.matmul_blocked):
        out = _run(k, (a, b), config)
        np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4 * np.max(np.abs(ref)))


def test_matmul_blocked_is_faster_and_loads_less():
    args = K.matmul_inputs(seed=9)
    _, p_naive = K.matmul_naive.options(config="trn2").simulate(*args)
    _, p_blocked = K.matmul_blocked.options(config="trn2").simulate(*args)
    assert p_blocked.total_time_ns < p_naive.total_time_ns

    def n_dma(kernel):
        return sum(1 for s in executed_ops(kernel.to_json(*args)["body"]) if s.get("op") == "dma_copy")
    assert n_dma(K.matmul_blocked) < n_dma(K.matmul_naive)


@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_transpose_exact(dtype):
    (x,) = K.transpose_inputs(seed=10, shape=(128, 256), dtype=dtype)
    for config in CONFIGS:
        out = _run(K.transpose, (x,), config)
        np.testing.assert_array_equal(out, x.T)


@pytest.mark.parametrize("config", CONFIGS)
def test_attention_variants(config):
    # non-causal flash attention, d = 64
    args = K.flash_attention_inputs(seed=11, s=256, d=64, causal=False)
    _check(_run(K.flash_attention, args, config), K.attention_ref(*args), BF16)
    # causal naive attention (mask with a row offset per block)
    args = K.attention_naive_inputs(seed=12, s=256, d=128, causal=True)
    _check(_run(K.attention_naive, args, config), K.attention_ref(*args), BF16)


def test_attention_naive_materialises_scores_in_hbm():
    args = K.attention_naive_inputs(seed=13, s=256, d=64)
    kj = K.attention_naive.to_json(*args)
    internal = [t for t in kj["tensors"] if t["kind"] == "internal"]
    assert any(t["shape"] == [256, 256] and t["dtype"] == "float32" for t in internal)


def test_layernorm_tier1_fallback(monkeypatch):
    """Without bn_stats / bn_aggr the kernel uses sum and sum of squares."""
    import nsim.nki.isa as nisa
    monkeypatch.delattr(nisa, "bn_stats", raising=False)
    args = K.layernorm_inputs(seed=14, n=130, d=256)
    out = _run(K.layernorm, args, "trn1")
    assert not any(s.get("op") == "bn_stats" for s in K.layernorm.to_json()["body"])
    _check(out, K.layernorm_ref(*args), BF16)


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("causal", [True, False])
def test_flash_attention_gqa(config, causal):
    args = K.flash_attention_gqa_inputs(seed=15, hq=4, hkv=2, s=256, d=64, causal=causal)
    out = _run(K.flash_attention_gqa, args, config)
    assert out.dtype == BF16 and out.shape == (4, 256, 64)
    _check(out, K.flash_attention_gqa_ref(*args), BF16)


def test_flash_attention_gqa_matches_single_head_and_mqa():
    """Each query head equals single-head flash_attention with its kv head; Hkv = 1 (MQA) works too."""
    q, k, v, _ = K.flash_attention_gqa_inputs(seed=16, hq=3, hkv=1, s=128, d=32, causal=True)
    out = _run(K.flash_attention_gqa, (q, k, v, True), "trn2")
    _check(out, K.flash_attention_gqa_ref(q, k, v, True), BF16)
    for h in range(3):
        single = _run(K.flash_attention, (q[h], k[0], v[0], True), "trn2")
        np.testing.assert_array_equal(out[h], single)


def test_flash_attention_gqa_loads_kv_once_per_kv_head():
    hq, hkv, s, d = 4, 2, 256, 64
    args = K.flash_attention_gqa_inputs(seed=17, hq=hq, hkv=hkv, s=s, d=d)
    body = K.flash_attention_gqa.to_json(*args)["body"]

    def src_of(st):
        src = st.get("src")
        return src.get("tensor") if isinstance(src, dict) else src
    loads = [src_of(st) for st in executed_ops(body) if st.get("op") == "dma_copy"]
    nb = s // 128
    assert loads.count("k") == hkv * nb and loads.count("v") == hkv * nb
    assert loads.count("q") == hq * nb


def test_flash_attention_gqa_rejects_bad_grouping():
    q, k, v, _ = K.flash_attention_gqa_inputs(seed=18, hq=3, hkv=2, s=128, d=32)
    with pytest.raises(AssertionError):
        K.flash_attention_gqa.to_json(q, k, v, True)


def test_profile_lines_are_grouped_by_source_line():
    """Two ops written on one line are one entry of Profile.lines, with both instructions."""
    from nsim import nki
    import nsim.nki.language as nl
    import nsim.nki.isa as nisa

    @nki.jit
    def add(a, b):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        ta = nl.ndarray((128, 64), a.dtype, buffer=nl.sbuf)
        tb = nl.ndarray((128, 64), a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=ta, src=a); nisa.dma_copy(dst=tb, src=b)  # noqa: E702  TWO-LOADS
        nisa.tensor_tensor(dst=ta, data1=ta, data2=tb, op=nl.add)
        nisa.dma_copy(dst=out, src=ta)
        return out

    a = np.ones((128, 64), np.float32)
    out, prof = add.simulate(a, a)
    np.testing.assert_allclose(out, 2 * a)
    srcs = [(l["file"], l["line"]) for l in prof.lines]
    assert len(srcs) == len(set(srcs)) == 3
    import inspect
    src_lines, first = inspect.getsourcelines(add.fn if hasattr(add, "fn") else add)
    two = first + next(i for i, l in enumerate(src_lines) if "TWO-LOADS" in l)
    entry = [l for l in prof.lines if l["line"] == two]
    assert len(entry) == 1 and entry[0]["instructions"] == 2
