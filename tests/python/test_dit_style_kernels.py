"""Diffusion-transformer (DiT / Flux / SD3) block kernels written in the style of NxDI's diffusion-model NKI kernels
(tests/python/kernels/dit_style_kernels.py, Beta-1 dialect, unmodified, through ``nsim.compat``): adaLN-Zero
modulation (LayerNorm without affine by ``bn_stats``/``bn_aggr``, per-batch scale/shift rows broadcast over the
tokens), the gated residual, QK-RMSNorm over the head dim, a tanh-GELU MLP with the bias and the activation fused
into the PSUM eviction, and the sinusoidal timestep embedding (frequencies by ``iota`` + ``exp`` on chip, then
``nl.cos`` / ``nl.sin``) with its SiLU MLP. Outputs against float64 numpy (bf16 and fp32, ragged last tiles), the
instruction counts their tiling implies, and that fusing the GELU into the eviction saves a VectorE pass per tile
and time.

Also the nsim fix these kernels needed: ``nl.cos`` (and ``nl.tan``), value-returning functions of the spec (§3.6,
"range reduction + activation"), did not exist (AttributeError); they now lower to a range-reducing
``tensor_scalar`` (add, mod) and ScalarE's sin with a bias (tan: sin / cos of the argument reduced mod pi)."""

import math

import numpy as np
import pytest

from conftest import executed_ops, require_core, sample_fixture  # noqa: E402
from conftest import op_counts as _ops  # noqa: E402

_core, ml_dtypes = require_core()
from numeric_helpers import close, rounded  # noqa: E402
from numeric_helpers import randn as _randn, f64 as _f64  # noqa: E402

BF16 = ml_dtypes.bfloat16

dit = sample_fixture("dit_style_kernels.py")


def _engine_busy(prof, engine):
    return prof.stats["engine"][engine]["busy_time"]["value"]


# --------------------------------------------------------------------------------------------------
# adaLN-Zero modulation and gated residual
# --------------------------------------------------------------------------------------------------

def ref_adaln(x, shift, scale, eps):
    x = _f64(x)
    mean = x.mean(-1, keepdims=True)
    var = x.var(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * (1.0 + _f64(scale)[:, None]) + _f64(shift)[:, None]


@pytest.mark.parametrize("shape,dtype", [
    ((2, 200, 640), BF16),         # a full and a 72-row token tile; bn_stats on 512 + 128 columns
    ((1, 128, 256), np.float32),   # one tile, one chunk
    ((3, 77, 1152), BF16),         # DiT-XL hidden: 3 chunks (the last of 128), one partial tile per batch
])
def test_adaln_modulate_matches_numpy(dit, shape, dtype):
    mod = dit[0]
    b, _, c = shape
    x = _randn(shape, dtype, seed=shape[1], scale=2.0) + np.asarray(0.5, dtype)
    shift = _randn((b, c), dtype, seed=1, scale=0.3)
    scale = _randn((b, c), dtype, seed=2, scale=0.3)
    out = mod.nki_adaln_modulate_kernel(x, shift, scale, 1e-6)
    assert out.shape == shape and out.dtype == np.dtype(dtype)
    close(out, ref_adaln(x, shift, scale, 1e-6), dtype)


def test_adaln_zero_init_and_batches_not_mixed(dit):
    """adaLN-Zero starts with scale = shift = 0: plain LayerNorm (mean 0, variance 1 per token). Batch 1 with
    scale = -1 and shift = s gives exactly s on every token: each batch uses its own rows."""
    mod = dit[0]
    x = _randn((2, 150, 384), np.float32, seed=3, scale=3.0) + 1.0
    shift = np.zeros((2, 384), np.float32)
    scale = np.zeros((2, 384), np.float32)
    shift[1] = _randn((384,), np.float32, seed=4)
    scale[1] = -1.0
    out = mod.nki_adaln_modulate_kernel(x, shift, scale, 1e-6)
    np.testing.assert_allclose(out[0].mean(-1), 0.0, atol=1e-5)
    np.testing.assert_allclose(out[0].var(-1), 1.0, rtol=1e-4)
    np.testing.assert_array_equal(out[1], np.broadcast_to(shift[1], (150, 384)))


def test_adaln_instruction_counts(dit):
    """[2, 200, 640]: 2 batches x 2 token tiles, 2 bn_stats chunks per tile. Per batch 2 row loads and one
    ``1 + scale``; per tile a load, 2 bn_stats, a bn_aggr, the ``var + eps`` and its rsqrt, one fused
    (x - mean) * rstd tensor_scalar, a multiply and an add, a store. shift/scale are read once per batch."""
    mod = dit[0]
    x = _randn((2, 200, 640), BF16, seed=5)
    shift, scale = _randn((2, 640), BF16, seed=6), _randn((2, 640), BF16, seed=7)
    k = mod.nki_adaln_modulate_kernel
    k(x, shift, scale, 1e-6)
    ops = _ops(k)
    assert ops["bn_stats"] == 2 * 2 * 2 and ops["bn_aggr"] == 2 * 2, ops
    assert ops["tensor_scalar"] == 2 + 2 * 2 * 2, ops          # 1 + scale; var + eps and the fused normalise
    assert ops["activation"] == 2 * 2, ops                     # rsqrt
    assert ops["tensor_tensor"] == 2 * 2 * 2, ops              # * (1 + scale), + shift
    prof = k.last_profile
    assert prof.stat("memory.hbm_read_bytes") == x.nbytes + shift.nbytes + scale.nbytes
    assert prof.stat("memory.hbm_write_bytes") == x.nbytes
    dmas = [o for o in executed_ops(k.last_json["body"]) if o["op"] == "dma_copy"
            and isinstance(o["src"], dict) and o["src"]["tensor"] in ("shift_tensor", "scale_tensor")]
    assert len(dmas) == 4 and all(o["src"]["index"][0]["size"] == 1 for o in dmas), dmas  # [1, C] rows


@pytest.mark.parametrize("shape,dtype", [((2, 200, 256), BF16), ((1, 64, 1152), np.float32)])
def test_gated_residual_matches_numpy(dit, shape, dtype):
    mod = dit[0]
    b, _, c = shape
    x = _randn(shape, dtype, seed=8)
    y = _randn(shape, dtype, seed=9)
    gate = _randn((b, c), dtype, seed=10)
    out = mod.nki_gated_residual_kernel(x, y, gate)
    assert out.shape == shape and out.dtype == np.dtype(dtype)
    close(out, _f64(x) + _f64(gate)[:, None] * _f64(y), dtype)
    # adaLN-Zero: a zero gate leaves the residual stream unchanged, bit for bit
    np.testing.assert_array_equal(mod.nki_gated_residual_kernel(x, y, np.zeros_like(gate)), x)
    k = mod.nki_gated_residual_kernel
    tiles = math.ceil(shape[1] / 128)
    assert _ops(k)["dma_copy"] == b * (1 + 3 * tiles)
    assert k.last_profile.stat("memory.hbm_read_bytes") == 2 * x.nbytes + gate.nbytes


# --------------------------------------------------------------------------------------------------
# QK-RMSNorm
# --------------------------------------------------------------------------------------------------

def ref_rmsnorm(x, w, eps):
    x = _f64(x)
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * _f64(w)


@pytest.mark.parametrize("q_shape,n_kv,dtype", [
    ((1, 4, 150, 64), 4, BF16),        # d = 64, a ragged second token tile
    ((2, 2, 128, 128), 1, np.float32),  # SD3 d = 128, fewer k heads
    ((1, 3, 300, 128), 3, BF16),        # three tiles, the last of 44 rows
])
def test_qk_rmsnorm_matches_numpy(dit, q_shape, n_kv, dtype):
    mod = dit[0]
    b, _, t, d = q_shape
    q = _randn(q_shape, dtype, seed=t, scale=3.0)
    k = _randn((b, n_kv, t, d), dtype, seed=t + 1, scale=0.2)
    qw = _randn((d,), dtype, seed=11)
    kw = _randn((d,), dtype, seed=12)
    q_out, k_out = mod.nki_qk_rmsnorm_kernel(q, k, qw, kw, 1e-6)
    assert q_out.shape == q.shape and k_out.shape == k.shape and q_out.dtype == np.dtype(dtype)
    close(q_out, ref_rmsnorm(q, qw, 1e-6), dtype)
    close(k_out, ref_rmsnorm(k, kw, 1e-6), dtype)


def test_qk_rmsnorm_weights_not_swapped_and_counts(dit):
    """q and k get their own weights (q_weight = 2, k_weight = 3 on unit-rms rows), and the sum of squares is one
    ScalarE activation_reduce per (batch, head, token tile) of q and of k."""
    mod = dit[0]
    q = np.ones((1, 2, 130, 64), np.float32)
    k = -np.ones((1, 1, 130, 64), np.float32)
    kern = mod.nki_qk_rmsnorm_kernel
    q_out, k_out = kern(q, k, np.full(64, 2.0, np.float32), np.full(64, 3.0, np.float32), 1e-6)
    close(q_out, np.full(q.shape, 2.0), np.float32)
    close(k_out, np.full(k.shape, -3.0), np.float32)
    ops = _ops(kern)
    assert ops["activation_reduce"] == (2 + 1) * 2 and ops["activation"] == (2 + 1) * 2, ops


# --------------------------------------------------------------------------------------------------
# tanh-GELU MLP
# --------------------------------------------------------------------------------------------------

def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def ref_gelu_mlp(x, w1, b1, w2, b2, dtype):
    """float64, with the hidden activations rounded to the kernel's dtype (hT is stored in x.dtype)."""
    h = rounded(gelu_tanh(_f64(x) @ _f64(w1) + _f64(b1)), dtype)
    return h @ _f64(w2) + _f64(b2)


def _mlp_args(n, c, f, c_out, dtype, seed):
    return (_randn((n, c), dtype, seed=seed),
            _randn((c, f), dtype, seed=seed + 1, scale=1.0 / math.sqrt(c)),
            _randn((f,), dtype, seed=seed + 2, scale=0.5),
            _randn((f, c_out), dtype, seed=seed + 3, scale=1.0 / math.sqrt(f)),
            _randn((c_out,), dtype, seed=seed + 4, scale=0.5))


@pytest.mark.parametrize("n,c,f,c_out,dtype,fuse", [
    (256, 256, 512, 256, BF16, True),
    (256, 256, 512, 256, BF16, False),
    (1024, 128, 384, 512, BF16, True),     # two 512-token blocks of 4 sub-tiles
    (128, 384, 256, 128, np.float32, True),
    (128, 384, 256, 128, np.float32, False),
])
def test_gelu_mlp_matches_numpy(dit, n, c, f, c_out, dtype, fuse):
    mod = dit[0]
    args = _mlp_args(n, c, f, c_out, dtype, seed=n + f)
    out = mod.nki_gelu_mlp_kernel(*args, fuse_gelu=fuse)
    assert out.shape == (n, c_out) and out.dtype == np.dtype(dtype)
    close(out, ref_gelu_mlp(*args, dtype), dtype)


def test_gelu_mlp_is_the_tanh_approximation_with_bias_inside(dit):
    """x = 0 and W2 = I: out = gelu_tanh(b1) + b2, so the bias goes inside the activation and the activation is the
    tanh form (erf GELU differs by ~1e-3 at |b1| ~ 2, far above fp32 tolerance)."""
    mod = dit[0]
    x = np.zeros((128, 128), np.float32)
    w1 = _randn((128, 128), np.float32, seed=20)
    b1 = np.linspace(-4, 4, 128).astype(np.float32)
    b2 = np.full(128, 0.25, np.float32)
    out = mod.nki_gelu_mlp_kernel(x, w1, b1, np.eye(128, dtype=np.float32), b2)
    close(out, np.broadcast_to(gelu_tanh(_f64(b1)) + 0.25, (128, 128)))


def test_gelu_mlp_instruction_counts(dit):
    """[1024, 256] x [256, 512] x [512, 256]: 2 token blocks of 512; per block 2 x^T DMA transposes, 4 x 2 layer-1
    matmuls (moving 512 tokens), 4 fused GELU evictions (reading PSUM, bias b1, writing hT directly), 4 x 4
    layer-2 matmuls (128 tokens on the PSUM partitions), 4 b2 adds and stores; the b2 row is broadcast once."""
    mod = dit[0]
    args = _mlp_args(1024, 256, 512, 256, BF16, seed=3)
    k = mod.nki_gelu_mlp_kernel
    k(*args)
    ops = _ops(k)
    assert ops["dma_transpose"] == 2 * 2, ops
    assert ops["nc_matmul"] == 2 * (4 * 2 + 4 * 4) + 1, ops    # + the b2 partition broadcast
    assert ops["activation"] == 2 * 4 and "tensor_scalar" not in ops, ops
    acts = [o for o in executed_ops(k.last_json["body"]) if o["op"] == "activation"]
    assert {(o["act"], o["data"], o["bias"]["tensor"], o["dst"]["tensor"]) for o in acts} == {
        ("gelu_apprx_tanh", "h_psum", "b1_sb", "hT")}
    mms = [o for o in executed_ops(k.last_json["body"]) if o["op"] == "nc_matmul" and o["dst"] == "h_psum"]
    assert len(mms) == 16
    prof = k.last_profile
    x, w1, b1, w2, b2 = args
    assert prof.stat("memory.hbm_read_bytes") == x.nbytes + w1.nbytes + b1.nbytes + w2.nbytes + b2.nbytes
    assert prof.stat("memory.hbm_write_bytes") == 1024 * 256 * 2


def test_fusing_gelu_into_eviction_saves_a_pass_and_time(dit):
    """The same MLP with the bias add evicting PSUM (a tensor_scalar, placed on VectorE or ScalarE, whichever
    finishes first) and the GELU as a separate ScalarE pass: one more instruction per (token block, ffn tile), the
    two engines busy longer by at least those 8 passes over 512 elements per partition (>= 128 cycles each even
    at VectorE's 4x rate, >= 106 ns at <= 1.2 GHz), the same 8 ScalarE activations. The kernel is latency-bound
    (about 2x its largest resource bound, `nsim analyze`), so its total follows the list schedule more than the
    work: fused and split within 5 % of each other (trn2: 19,683 against 19,114 ns since DMAs into other partitions
    or bytes of one tile stopped waiting for each other; 20,974 against 21,124 ns before)."""
    mod = dit[0]
    args = _mlp_args(1024, 256, 512, 256, BF16, seed=4)
    k = mod.nki_gelu_mlp_kernel
    fused = k(*args, fuse_gelu=True)
    p_fused, n_fused = k.last_profile, sum(_ops(k).values())
    split = k(*args, fuse_gelu=False)
    p_split, ops_split = k.last_profile, _ops(k)
    close(fused, split, BF16)
    assert sum(ops_split.values()) == n_fused + 2 * 4 and ops_split["tensor_scalar"] == 2 * 4
    busy = lambda p: _engine_busy(p, "vector") + _engine_busy(p, "scalar")  # noqa: E731
    assert busy(p_split) - busy(p_fused) >= 8 * 128 / 1.2, (busy(p_split), busy(p_fused))
    assert p_fused.stat("engine.scalar.activate_instruction_count") == \
        p_split.stat("engine.scalar.activate_instruction_count") == 8
    assert p_fused.total_time_ns < 1.05 * p_split.total_time_ns, (p_fused.total_time_ns, p_split.total_time_ns)


# --------------------------------------------------------------------------------------------------
# Timestep embedding
# --------------------------------------------------------------------------------------------------

def ref_timestep_features(t, half=128, max_period=10000.0):
    """cat(cos(t f), sin(t f)), f_i = exp(-ln(max_period) i / half), as diffusers' get_timestep_embedding with
    flip_sin_to_cos=True (Flux / SD3; DiT's order)."""
    freqs = np.exp(-math.log(max_period) * np.arange(half) / half)
    args = _f64(t)[:, None] * freqs[None]
    return np.concatenate([np.cos(args), np.sin(args)], -1)


def ref_timestep_embedding(t, w1, b1, w2, b2, dtype):
    emb = rounded(ref_timestep_features(t), dtype)
    h = _f64(emb) @ _f64(w1) + _f64(b1)
    h = rounded(h / (1.0 + np.exp(-h)), dtype)
    return h @ _f64(w2) + _f64(b2)


@pytest.mark.parametrize("batch,hidden,dtype", [(4, 256, BF16), (16, 384, BF16), (3, 128, np.float32)])
def test_timestep_embedding_matches_numpy(dit, batch, hidden, dtype):
    mod = dit[0]
    rng = np.random.default_rng(batch)
    t = np.concatenate([[0.0, 999.0], rng.uniform(0, 1000, batch - 2)]).astype(np.float32)
    w1 = _randn((256, hidden), dtype, seed=1, scale=1.0 / 16)
    b1 = _randn((hidden,), dtype, seed=2, scale=0.1)
    w2 = _randn((hidden, hidden), dtype, seed=3, scale=1.0 / math.sqrt(hidden))
    b2 = _randn((hidden,), dtype, seed=4, scale=0.1)
    out = mod.nki_timestep_embedding_kernel(t, w1, b1, w2, b2)
    assert out.shape == (batch, hidden) and out.dtype == np.dtype(dtype)
    want = ref_timestep_embedding(t, w1, b1, w2, b2, dtype)
    if dtype == np.float32:
        # t * f in fp32 carries ~ulp(1000) = 6e-5 of phase; cos adds its fp32 range reduction
        np.testing.assert_allclose(out, want, rtol=0, atol=2e-4)
    else:
        close(out, want, dtype)


def test_timestep_embedding_features_and_counts(dit):
    """W1 = [I; 0] (the cos half), W2 = I, zero biases: out = silu(cos(t f)); with W1 = [0; I], silu(sin(t f)).
    The features take one iota, one exp activation, the cos (a range-reducing tensor_scalar and a sin
    activation) and the sin: no HBM table of frequencies. hidden 128: 2 + 1 layer matmuls, and 2 partition
    broadcasts on TensorE (the t row over the frequency partitions, the b2 row over the batch)."""
    mod = dit[0]
    t = np.array([0.0, 1.0, 10.5, 250.0, 999.0], np.float32)
    eye, zero = np.eye(128, dtype=np.float32), np.zeros((128, 128), np.float32)
    zb = np.zeros(128, np.float32)
    silu = lambda v: v / (1.0 + np.exp(-v))  # noqa: E731
    feats = ref_timestep_features(t)
    k = mod.nki_timestep_embedding_kernel
    for w1, want in ((np.concatenate([eye, zero]), feats[:, :128]), (np.concatenate([zero, eye]), feats[:, 128:])):
        out = k(t, w1, zb, eye, zb)
        np.testing.assert_allclose(out, silu(want), rtol=0, atol=1e-4)
    ops = _ops(k)
    assert ops["iota"] == 1 and ops["nc_matmul"] == 2 + 1 + 2, ops
    acts = [o["act"] for o in executed_ops(k.last_json["body"]) if o["op"] == "activation"]
    assert sorted(acts) == ["exp", "silu", "sin", "sin"], acts
    assert k.last_profile.stat("memory.hbm_read_bytes") == t.nbytes + 2 * eye.nbytes + eye.nbytes + 2 * zb.nbytes


# --------------------------------------------------------------------------------------------------
# nl.cos / nl.tan (the nsim fix)
# --------------------------------------------------------------------------------------------------

def test_nl_cos_and_tan_value_functions(dit):
    """``nl.cos`` and ``nl.tan`` (§3.6: range reduction + activation) exist and are right over many periods and
    under a Beta-1 mask; before the fix ``nl.cos`` was an AttributeError. cos = 2 instructions (tensor_scalar
    add/mod, sin with bias -pi), tan = 5 (reduce mod pi, sin, cos, divide)."""
    _, nki, nl, _ = dit

    @nki.jit
    def trig_kernel(x):
        out = nl.ndarray((2, 128, 64), dtype=x.dtype, buffer=nl.shared_hbm)
        ix = nl.arange(128)[:, None]
        iy = nl.arange(64)[None, :]
        t = nl.load(x[ix, iy])
        c = nl.zeros((128, 64), dtype=nl.float32)
        c[...] = nl.cos(t, mask=(ix < 100))
        nl.store(out[0, ix, iy], value=c)
        nl.store(out[1, ix, iy], value=nl.tan(t))
        return out

    x = np.linspace(-60.0, 60.0, 128 * 64).astype(np.float32).reshape(128, 64)
    out = trig_kernel(x)
    want_cos = np.cos(_f64(x))
    want_cos[100:] = 0.0
    np.testing.assert_allclose(out[0], want_cos, rtol=0, atol=1e-5)
    tan = np.tan(_f64(x))
    far = np.abs(np.cos(_f64(x))) > 0.05  # away from the poles, where tan is ill-conditioned
    np.testing.assert_allclose(out[1][far], tan[far], rtol=1e-4, atol=1e-4)
    ops = _ops(trig_kernel)
    assert ops["activation"] == 1 + 2 and ops["tensor_scalar"] == 1 + 3 and ops["tensor_tensor"] == 1, ops
    with pytest.raises(Exception, match="activation"):  # no cos table on ScalarE: not an op= code

        @nki.jit
        def bad(x):
            import neuronxcc.nki.isa as nisa
            out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
            nl.store(out, value=nisa.activation(op=nl.cos, data=nl.load(x)))
            return out

        bad(x)


def test_nl_cos_new_dialect():
    from nsim import nki
    import nsim.nki.language as nl
    import nsim.nki.isa as nisa

    @nki.jit
    def k(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        nisa.dma_copy(dst=out, src=nl.cos(t))
        return out

    x = np.linspace(-7.0, 7.0, 128 * 32).astype(np.float32).reshape(128, 32)
    np.testing.assert_allclose(k(x), np.cos(_f64(x)), rtol=0, atol=1e-6)
