"""Trainium3 (NeuronCore-v4, gen4) instructions in real kernels (tests/python/kernels/gen4_feature_kernels_new.py,
new dialect, unmodified through ``nsim.compat``), run on the ``trn3`` preset:

- row softmax and the flash-attention inner loop (online softmax over key blocks) with the exp on VectorE
  (``nisa.exponential``: the row max as ``max_value``, the row sum in the VectorE registers; evictions moved to
  ScalarE) against the gen2/3 ScalarE ``activation(exp, bias=-max, reduce_res=)`` versions;
- top-k sampling over a vocabulary: ``nisa.topk`` (16-partition snake, ids mapped back on chip), Gumbel noise from
  ``nisa.rand2`` after ``nisa.set_rng_seed`` (-log(-log(u)) with ``activation(log)`` and ``activate2``), the token
  by ``max8`` / ``nc_find_index8`` / ``nc_n_gather``; against the gen2/3 iterated-``max8`` top-k;
  ``rand_get_state`` / ``rand_set_state`` / ``rng`` on VectorE;
- a bf16 matmul with A transposed on chip on TensorE: gen3 style (512-column moving tiles, fp32 PSUM) against gen4
  style (up to 8192 columns per ``nc_matmul``, bf16 PSUM accumulation, 16-bit evictions);
- a residual add by the DMA (``dma_compute`` into SBUF: v4 read-add-write at full copy rate).

Checked: numerics against float64 numpy (fp32 1e-5, bf16 1e-2; the bf16 PSUM matmul also against a reference that
rounds each K-step to bf16 as v4 PSUM does), top-k values exactly and ids that point at them, the sampled token
against the argmax of val / T + g, PRNG determinism for a fixed seed (and a replay after ``rand_set_state``),
coarse statistics of the uniforms (mean, variance of U(lo, hi)) and of the Gumbel noise (mean = Euler's gamma,
variance = pi^2 / 6), instruction counts and HBM bytes, the timing stories with the direction the cost model
(neuroncore.md 3.1 / 3.2) gives, and NSIM-E313 NotOnGeneration for every gen4-only instruction on trn2.

The nsim fixes this family needed (their regression tests fail without them):
- ``nisa.rand2`` after ``rand_set_state(engine=vector)`` did not replay the numbers of the saved state: rand2 left
  its engine unnamed, so the scheduler's automatic engine placement (it moves float ops between the engines their
  opcode row allows, V|G for rand2) ran it on GpSimd, whose PRNG stream is a different one; the numbers depended
  on scheduling (python/nsim/nki/isa.py ``rand2``: the op names VectorE, its documented engine);
  ``test_rand2_replays_after_rand_set_state_on_vector``.

- VectorE ``exponential`` and ``rand2`` cost N instead of the v4 max(MIN_II, N/4) (new cost classes and
  ``vector.exponential_factor`` / ``vector.rand2_factor``), GpSimd ``topk`` 150 + K instead of 4n + K
  (``gpsimd.topk_factor``), and a bfloat16 PSUM ``nc_matmul`` dst before gen4 was NSIM-E302 BadDtype instead of
  E313 NotOnGeneration (isa/isa.cpp ``verify``): ``test_exponential_and_rand2_cost_a_quarter_of_n``,
  ``test_softmax_vector_exp_story_on_trn3``, ``test_flash_vexp_keeps_vector_time``, ``test_topk_costs_4n_plus_k``,
  ``test_bf16_psum_matmul_on_trn2_is_e313``.

- an accumulating DMA was not slower than a copy on v2/v3 (spec 3.3: dma_compute at 0.5 of copy throughput; now
  ``dma.compute_eff`` / ``dma.compute_eff_sbuf``): ``test_dma_compute_half_rate_before_gen4``;
- v4 TensorE had no background-transpose lane (now ``tensor.background_transpose``):
  ``test_background_transpose_halves_a_transpose_chain_on_trn3``."""
import numpy as np
import pytest

from conftest import executed_ops, require_core, sample_fixture, run_clean, op_counts  # noqa: E402

_core, ml_dtypes = require_core()
from numeric_helpers import close, close_to_max, f64, randn  # noqa: E402

BF16 = ml_dtypes.bfloat16
TRN3 = "trn3"
VECTOR_GHZ = 1.2   # neuroncore.md 1.1, trn3 clock_ghz.vector (= .gpsimd)

g4 = sample_fixture("gen4_feature_kernels_new.py", module_only=True)


def _k(kernel, config=TRN3):
    return kernel.options(config=config)


def _raises_e313(kernel, *args, what):
    with pytest.raises(_core.NsimError) as e:
        kernel(*args)
    msg = str(e.value)
    assert e.value.code == "NSIM-E313", msg
    assert what in msg and "gen4" in msg and "gen3" in msg, msg
    assert e.value.file.endswith("gen4_feature_kernels_new.py") and e.value.line > 0
    return msg


def _busy(prof, engine):
    return prof.stat("engine.{}.busy_time".format(engine))


# --------------------------------------------------------------------------------------------------
# 1. softmax: VectorE exponential vs ScalarE activation(exp)
# --------------------------------------------------------------------------------------------------

def ref_softmax(x):
    x = f64(x)
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.mark.parametrize("name", ["softmax_rows_act", "softmax_rows_vexp"])
@pytest.mark.parametrize("R,V,dtype", [(256, 1000, np.float32), (128, 4096, BF16)])
def test_softmax_matches_numpy(g4, name, R, V, dtype):
    x = randn((R, V), dtype, seed=R + V, scale=3.0)
    k = _k(getattr(g4, name))
    y = run_clean(k, x)
    close(y, ref_softmax(x), dtype)
    c = op_counts(k)
    tiles = R // 128
    if name.endswith("vexp"):
        assert c["exponential"] == tiles and c["activation"] == tiles  # exp on VectorE, the scaling on ScalarE
    else:
        assert c.get("exponential", 0) == 0 and c["activation"] == tiles and c["tensor_scalar"] == 2 * tiles
    prof = k.last_profile
    assert prof.stat("memory.hbm_read_bytes") == x.nbytes
    assert prof.stat("memory.hbm_write_bytes") == x.nbytes


def test_softmax_vexp_moves_the_exp_off_scalar(g4):
    """The exp and its row sum leave ScalarE: what stays there is one plain activation(copy, scale=1/sum) per tile,
    without the reduction (neuroncore.md 3.2: activation with reduce = max(MIN_II, N) + MIN_II, without = N), so
    ScalarE is busy for less time in the VectorE-exp kernel; both give the same numbers."""
    x = randn((512, 2048), np.float32, seed=3)
    ka, kv = _k(g4.softmax_rows_act), _k(g4.softmax_rows_vexp)
    ya, yv = run_clean(ka, x), run_clean(kv, x)
    close(yv, ya)
    assert _busy(kv.last_profile, "scalar") < _busy(ka.last_profile, "scalar")


def test_softmax_vector_exp_story_on_trn3(g4):
    """Per tile of N = 2048 fp32 columns (neuroncore.md 3.2, trn3, VectorE at 1.2 GHz, MIN_II 64): the VectorE-exp
    kernel's VectorE does the row max (tensor_reduce, fp32: N), the exponential with its running sum (N/4) and the
    reciprocal of the (P, 1) sums (MIN_II): (2048 + 512 + 64) / 1.2 = 2186.7 ns a tile, 4 tiles. ScalarE keeps one
    plain activation(copy, scale=) a tile. The ScalarE kernel's exp with its sum is N + MIN_II on ScalarE and its
    normalising tensor_scalar lands on GpSimd (engine unset: the compiler model's placement): the VectorE-exp kernel
    leaves ScalarE less busy and finishes sooner (18.9 against 19.7 us since a loop tile has four rotating buffers:
    the ScalarE kernel's tiles overlap more; 19.6 against 22.2 us when this was written)."""
    x = randn((512, 2048), np.float32, seed=3)
    ka, kv = _k(g4.softmax_rows_act), _k(g4.softmax_rows_vexp)
    run_clean(ka, x)
    run_clean(kv, x)
    pa, pv = ka.last_profile, kv.last_profile
    assert _busy(pv, "vector") == pytest.approx(4 * (2048 + 2048 / 4 + 64) / VECTOR_GHZ, rel=1e-6)
    assert _busy(pv, "scalar") < _busy(pa, "scalar")
    assert pv.total_time_ns < 0.97 * pa.total_time_ns, (pv.total_time_ns, pa.total_time_ns)


def test_exponential_and_rand2_cost_a_quarter_of_n(g4):
    """neuroncore.md 3.2 (v4): exponential and rand2 are max(MIN_II, N/4) VectorE cycles (4 elements per lane and
    cycle) at 1.2 GHz (vector.exponential_factor, vector.rand2_factor; before 2026-12-05 both cost N). uniform_noise
    runs one rand2 of N = 2048 (plus a one-element copy of the seed, nothing else on VectorE)."""
    n = 2048
    k = _k(g4.uniform_noise)
    run_clean(k, np.array([[1]], np.uint32), 0.0, 1.0, n)
    want = n / 4 / VECTOR_GHZ
    assert _busy(k.last_profile, "vector") < 1.5 * want + 64 / VECTOR_GHZ, (_busy(k.last_profile, "vector"), want)


def ref_attention(q, k, v):
    d = q.shape[0]
    s = (f64(q) * d ** -0.5).T @ f64(k)
    p = np.exp(s - s.max(1, keepdims=True))
    return (p / p.sum(1, keepdims=True)) @ f64(v)


def _flash_args(d, S, seed):
    return (randn((d, S), BF16, seed=seed), randn((d, S), BF16, seed=seed + 1), randn((S, d), BF16, seed=seed + 2))


@pytest.mark.parametrize("name", ["flash_fwd_act", "flash_fwd_vexp"])
@pytest.mark.parametrize("d,S", [(64, 1024), (128, 512)])
def test_flash_inner_loop_matches_numpy(g4, name, d, S):
    q, k, v = _flash_args(d, S, seed=d + S)
    kern = _k(getattr(g4, name))
    o = run_clean(kern, q, k, v)
    close_to_max(o, ref_attention(q, k, v), BF16)
    c = op_counts(kern)
    blocks = (S // 128) * (S // 512)
    if name.endswith("vexp"):
        assert c["exponential"] == 2 * blocks and c.get("activation", 0) == 0
    else:
        assert c.get("exponential", 0) == 0 and c["activation"] == 2 * blocks
    assert c["nc_transpose"] == 4 * blocks and c["nc_matmul"] == 5 * blocks
    prof = kern.last_profile
    assert prof.stat("memory.hbm_read_bytes") == q.nbytes + k.nbytes + v.nbytes
    assert prof.stat("memory.hbm_write_bytes") == S * d * 2


def test_flash_vexp_frees_scalar(g4):
    """Per key block of 512 (neuroncore.md 3.2): the gen2/3 loop has ScalarE run the block exp with its sum
    (512 + MIN_II) and the rescale exp (MIN_II), VectorE the row max, the bookkeeping and the four [128, 128]
    evictions. The gen4 loop runs both exps on VectorE and gives ScalarE only the four bf16 evictions (2x mode,
    MIN_II each): ScalarE is busy for well under half as long; the outputs agree to bf16 rounding."""
    q, k, v = _flash_args(64, 1024, seed=1)
    ka, kv = _k(g4.flash_fwd_act), _k(g4.flash_fwd_vexp)
    oa, ov = run_clean(ka, q, k, v), run_clean(kv, q, k, v)
    close_to_max(ov, f64(oa), BF16)
    assert _busy(kv.last_profile, "scalar") < 0.5 * _busy(ka.last_profile, "scalar")


def test_flash_vexp_keeps_vector_time(g4):
    """Per block, VectorE gains the block exp (512 / 4 = 128 cycles) and the rescale exp (MIN_II) and loses the
    negation (MIN_II) and the four evictions (4 x MIN_II): the same VectorE time within a few percent (it is
    dominated by the row max over the fp32 PSUM scores), so the gen4 loop frees ScalarE at no VectorE cost."""
    q, k, v = _flash_args(64, 1024, seed=1)
    ka, kv = _k(g4.flash_fwd_act), _k(g4.flash_fwd_vexp)
    run_clean(ka, q, k, v)
    run_clean(kv, q, k, v)
    assert _busy(kv.last_profile, "vector") <= 1.05 * _busy(ka.last_profile, "vector")


# --------------------------------------------------------------------------------------------------
# 2. top-k sampling: nisa.topk + rand2 Gumbel noise vs iterated max8
# --------------------------------------------------------------------------------------------------

def _check_topk(logits, vals, ids, k, ascending):
    """Values: exactly the k largest (bf16, as the tile holds them), in order; ids: distinct and pointing at them."""
    for b in range(logits.shape[0]):
        row = logits[b].astype(np.float32)
        want = np.sort(row)[::-1][:k]
        got = vals[b].astype(np.float32)
        np.testing.assert_array_equal(got, want[::-1] if ascending else want)
        assert len(set(ids[b].tolist())) == k
        np.testing.assert_array_equal(row[ids[b].astype(np.int64)], got)


@pytest.mark.parametrize("B,V,k,T", [(4, 4096, 64, 1.0), (8, 2048, 8, 0.7), (1, 16384, 256, 1.3)])
def test_topk_gumbel_sample(g4, B, V, k, T):
    logits = randn((B, V), BF16, seed=V + k, scale=2.0)
    seeds = np.array([[1234]], np.uint32)
    kern = _k(g4.topk_gumbel_sample)
    vals, ids, u, g, tok = run_clean(kern, logits, seeds, k, T)
    _check_topk(logits, vals, ids, k, ascending=True)
    # the Gumbel transform of the kernel's own uniforms (fp32 logs of u in (0, 1))
    assert u.min() >= 1e-7 and u.max() < 1.0
    # (for u near 1, -log(u) ~ 1 - u loses digits in fp32 whatever the log's accuracy: 1e-4 there)
    np.testing.assert_allclose(g, -np.log(-np.log(f64(u))), rtol=1e-5 if u.max() < 0.999 else 1e-4,
                               atol=1e-5 if u.max() < 0.999 else 1e-4)
    # the token: the id at argmax(val / T + g) (near-ties of z within fp32 rounding may go either way)
    z = f64(vals.astype(np.float32)) / T + f64(g)
    for b in range(B):
        best = np.argmax(z[b])
        if tok[b, 0] != ids[b, best]:
            j = list(ids[b]).index(tok[b, 0])
            assert z[b, best] - z[b, j] < 1e-5, (b, z[b, best], z[b, j])
    c = op_counts(kern)
    assert c["topk"] == 1 and c["rand2"] == 1 and c["activate2"] == 1 and c["max8"] == 1 and c["nc_n_gather"] == 1
    prof = kern.last_profile
    assert prof.stat("memory.hbm_read_bytes") == logits.nbytes + seeds.nbytes
    assert prof.stat("memory.hbm_write_bytes") == B * k * (2 + 4 + 4 + 4) + B * 4


def test_topk_sample_is_deterministic_for_a_fixed_seed(g4):
    logits = randn((4, 2048), BF16, seed=9)
    kern = _k(g4.topk_gumbel_sample)
    a = run_clean(kern, logits, np.array([[77]], np.uint32), 32, 1.0)
    b = run_clean(kern, logits, np.array([[77]], np.uint32), 32, 1.0)
    c = run_clean(kern, logits, np.array([[78]], np.uint32), 32, 1.0)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(a[0], c[0])   # the top-k does not depend on the seed
    assert not np.array_equal(a[2], c[2])       # the noise does
    assert len({tuple(r) for r in a[2]}) == 4   # and differs between rows (partitions)


def test_rand2_uniform_statistics(g4):
    """rand2(min, max) is uniform on [min, max): mean (lo + hi) / 2, variance (hi - lo)^2 / 12 (65536 samples:
    the sample mean's standard error is 0.0045, the variance's ~0.0053 here; tolerances ~5 sigma)."""
    lo, hi = -1.0, 3.0
    u = run_clean(_k(g4.uniform_noise), np.array([[5]], np.uint32), lo, hi, 512)
    assert u.min() >= lo and u.max() < hi
    assert abs(u.mean() - (lo + hi) / 2) < 0.025
    assert abs(u.var() - (hi - lo) ** 2 / 12) < 0.03
    hist = np.histogram(u, bins=8, range=(lo, hi))[0] / u.size  # flat: 1/8 per bin
    assert np.all(np.abs(hist - 1 / 8) < 0.01), hist


def test_gumbel_noise_statistics(g4):
    """-log(-log(u)) of the kernel's uniforms is standard Gumbel: mean = Euler's gamma 0.5772, variance pi^2 / 6
    (16384 samples: standard errors 0.010 and ~0.03)."""
    _, _, u, g, _ = run_clean(_k(g4.topk_gumbel_sample), randn((8, 4096), BF16, seed=2), np.array([[11]], np.uint32),
                              2048, 1.0)
    assert abs(g.mean() - 0.5772157) < 0.05
    assert abs(g.var() - np.pi ** 2 / 6) < 0.15


def test_gumbel_transform_matches_numpy(g4):
    u = np.random.default_rng(4).uniform(1e-6, 0.999, (128, 64)).astype(np.float32)
    close(run_clean(_k(g4.gumbel_from_uniform), u), -np.log(-np.log(f64(u))))


def test_rand2_replays_after_rand_set_state_on_vector(g4):
    """Regression (python/nsim/nki/isa.py rand2): rand2 draws from VectorE's PRNG stream, so the VectorE state
    saved by rand_get_state(engine=vector) and restored by rand_set_state(engine=vector) replays its numbers. Before
    the fix the scheduler placed the engine-less rand2 on GpSimd (another stream): a != b."""
    a, b, bits = run_clean(_k(g4.rng_state_roundtrip), np.array([[5]], np.uint32))
    np.testing.assert_array_equal(a, b)
    assert a.min() >= -2.0 and a.max() < 2.0 and len({tuple(r) for r in a}) == 128
    assert bits.dtype == np.uint32 and len(np.unique(bits)) > 0.99 * bits.size  # 32 random bits each


@pytest.mark.parametrize("B,V,k", [(8, 16384, 64), (4, 4096, 32)])
def test_topk_beats_iterated_max8(g4, B, V, k):
    """The gen2/3 top-k costs k / 8 rounds of max8 (N), nc_find_index8 (N) and nc_match_replace8 (N) on VectorE,
    ~3 k N / 8 cycles (one row per partition, rows in parallel); nisa.topk costs 4 n + K GpSimd cycles for the
    whole vector (neuroncore.md 3.2 table): 4 x 16384 + 64 against 3 x 8 x 16384 here, so the topk kernel's
    busiest compute engine is busy for far less time, and the kernel is faster end to end."""
    logits = randn((B, V), BF16, seed=B * V)
    k1, k2 = _k(g4.topk_gumbel_sample), _k(g4.topk_max8)
    v1, i1, _, _, _ = run_clean(k1, logits, np.array([[3]], np.uint32), k, 1.0)
    v2, i2 = run_clean(k2, logits, k)
    _check_topk(logits, v2, i2, k, ascending=False)
    np.testing.assert_array_equal(v1, v2[:, ::-1])
    c = op_counts(k2)
    assert c["max8"] == k // 8 and c["nc_find_index8"] == k // 8 and c["nc_match_replace8"] == k // 8 - 1
    p1, p2 = k1.last_profile, k2.last_profile
    assert _busy(p2, "vector") >= 3 * k / 8 * V / VECTOR_GHZ * 0.9
    assert max(_busy(p1, "gpsimd"), _busy(p1, "vector")) < 0.5 * _busy(p2, "vector")
    assert p1.total_time_ns < p2.total_time_ns


def test_topk_costs_4n_plus_k(g4):
    V, k = 4096, 64
    kern = _k(g4.topk_gumbel_sample)
    run_clean(kern, randn((1, V), BF16, seed=1), np.array([[3]], np.uint32), k, 1.0)
    assert _busy(kern.last_profile, "gpsimd") >= 0.9 * (4 * V + k) / VECTOR_GHZ


# --------------------------------------------------------------------------------------------------
# 3. matmul: gen4 (N up to 8192, bf16 PSUM) vs gen3 (512 columns, fp32 PSUM)
# --------------------------------------------------------------------------------------------------

def ref_matmul_bf16_psum(a, b):
    """v4 bf16 PSUM accumulation per K tile of 128: the first matmul's fp32 result rounded to bf16, then each
    later one added in fp32 to the widened bf16 value and rounded again (neuroncore.md 2.5)."""
    acc = None
    for k0 in range(0, a.shape[1], 128):
        part = (f64(a[:, k0:k0 + 128]) @ f64(b[k0:k0 + 128])).astype(np.float32)
        acc = part if acc is None else acc.astype(np.float32) + part
        acc = acc.astype(BF16)
    return acc.astype(np.float32)


@pytest.mark.parametrize("M,K,N,n_tile", [(256, 256, 4096, 2048), (128, 384, 8192, 8192), (128, 128, 4096, 4096)])
def test_matmul_gen4_matches_numpy(g4, M, K, N, n_tile):
    a, b = randn((M, K), BF16, seed=M + K), randn((K, N), BF16, seed=N)
    kern = _k(g4.matmul_gen4)
    c = run_clean(kern, a, b, n_tile)
    close_to_max(c, f64(a) @ f64(b), BF16)
    # bit-equal to the per-K-tile bf16 rounding almost everywhere (the PE's fp32 summation order may move a sum
    # across a rounding boundary: at most one bf16 ulp per rounding step)
    emu = ref_matmul_bf16_psum(a, b)
    assert np.mean(c.astype(np.float32) == emu) > 0.99
    np.testing.assert_allclose(c.astype(np.float32), emu, rtol=2.0 ** -6, atol=0.05)
    if K > 128:  # and not what fp32 accumulation rounded once would give
        once = (f64(a) @ f64(b)).astype(np.float32).astype(BF16).astype(np.float32)
        assert np.mean(c.astype(np.float32) == once) < np.mean(c.astype(np.float32) == emu) - 0.05
    mms = [o for o in executed_ops(kern.last_json["body"]) if o["op"] == "nc_matmul"]
    assert len(mms) == (M // 128) * (N // n_tile) * (K // 128)
    assert {o["moving"]["index"][-1]["size"] for o in mms} == {n_tile}  # N = n_tile (up to 8192) per instruction
    assert op_counts(kern)["nc_transpose"] == (M // 128) * (K // 128)
    prof = kern.last_profile
    assert prof.stat("engine.matmul_instruction_count") == len(mms)
    assert prof.stat("memory.hbm_read_bytes") == a.nbytes + b.nbytes
    assert prof.stat("memory.hbm_write_bytes") == M * N * 2


def test_matmul_gen3_matches_numpy(g4):
    a, b = randn((256, 256), BF16, seed=1), randn((256, 1024), BF16, seed=2)
    kern = _k(g4.matmul_gen3)
    c = run_clean(kern, a, b)
    close_to_max(c, f64(a) @ f64(b), BF16)
    assert kern.last_profile.stat("engine.matmul_instruction_count") == 2 * 2 * 2


def test_matmul_gen4_faster_than_gen3_on_trn3(g4):
    """Same TensorE work (neuroncore.md 3.1: ii_mm = max(64, N) per nc_matmul, so 2 x 512-column or 1 x 2048-column
    instructions cost the same N cycles; 4x fewer instructions). The difference is the eviction on VectorE: an fp32
    PSUM tile copies at 1x, a bf16 PSUM tile to bf16 SBUF in the 2x mode (16-bit, one side in PSUM; 3.2). With K =
    256 the gen3 kernel's VectorE (N cycles at 1.2 GHz per 128 rows) is as busy as TensorE (2 N at 2.4 GHz), so
    halving it makes the kernel faster."""
    a, b = randn((1024, 256), BF16, seed=5), randn((256, 4096), BF16, seed=6)
    k3, k4 = _k(g4.matmul_gen3), _k(g4.matmul_gen4)
    c3 = run_clean(k3, a, b)
    c4 = run_clean(k4, a, b, 2048)
    close_to_max(c4, f64(c3), BF16)
    p3, p4 = k3.last_profile, k4.last_profile
    assert p4.stat("engine.matmul_instruction_count") * 4 == p3.stat("engine.matmul_instruction_count")
    assert _busy(p4, "vector") < 0.6 * _busy(p3, "vector")
    assert abs(_busy(p4, "tensor") - _busy(p3, "tensor")) < 0.1 * _busy(p3, "tensor")
    assert p4.total_time_ns < 0.9 * p3.total_time_ns, (p4.total_time_ns, p3.total_time_ns)
    assert p4.stat("memory.hbm_read_bytes") == p3.stat("memory.hbm_read_bytes")


def test_transpose_chain_exact(g4):
    x = randn((128, 128 * 8), BF16, seed=8)
    np.testing.assert_array_equal(run_clean(_k(g4.transpose_chain), x), x.T)


def test_background_transpose_overlaps_a_transpose_chain_on_trn3(g4):
    """neuroncore.md 1.1 / 3.1: v4 TensorE has a second lane usable only by transposes (~2x on long transpose chains;
    tensor.background_transpose, since 2026-12-05). trn3 with the lane against trn3 without it (everything else
    equal). Here each transpose writes one of two rotating PSUM tiles that a VectorE copy empties, so only
    transposes whose tiles are free overlap: TensorE is active 4,374 ns with the lane against 5,124 ns without it
    (0.85x), far from half, and VectorE's copies keep pace (3,040 against 3,722 ns active); the kernel's time, its
    1 MiB load and 32 stores, does not change. TensorE's busy time, the transposes' issue intervals less what the
    power throttle added, is the same either way: 32 x 128 cycles at 2.4 GHz = 1,706.7 ns. (Until 2026-12-05 this
    compared TensorE's busy time on trn3 and trn2, which differed only by the throttle's share: 1,706.7 ns both
    without it.) The Catch2 test "v4 background transpose lane" checks the halving on transposes into their own
    tiles."""
    x = randn((128, 128 * 32), BF16, seed=8)
    t, pe, act = {}, {}, {}
    for lane in (True, False):
        k = g4.transpose_chain.options(config=TRN3, overrides=["tensor.background_transpose={}".format(str(lane).lower())])
        run_clean(k, x)
        t[lane] = k.last_profile.total_time_ns
        pe[lane] = _busy(k.last_profile, "tensor") - k.last_profile.stat("tensor.throttled_time")
        act[lane] = k.last_profile.stat("engine.tensor.active_time")
    assert pe[True] == pytest.approx(32 * 128 / 2.4, rel=1e-3) and pe[False] == pytest.approx(pe[True], rel=1e-3), pe
    assert act[True] < 0.9 * act[False], act
    assert t[True] <= t[False], t


# --------------------------------------------------------------------------------------------------
# 3b. dma_compute: v4 SBUF read-add-write at full copy rate
# --------------------------------------------------------------------------------------------------

def _dma_time(g4, cfg, x, y, accumulate):
    k = _k(g4.residual_add_dma, cfg)
    out = run_clean(k, x, y, accumulate)
    return out, k.last_profile


def test_dma_compute_residual_add_full_rate_on_trn3(g4):
    """neuroncore.md 3.3: v4 adds in SBUF at full copy throughput (B += A, same dtype), so adding y into the SBUF
    copy of x moves as fast as copying y in: the same DMA time, the same HBM bytes."""
    x, y = randn((512, 2048), np.float32, seed=1), randn((512, 2048), np.float32, seed=2)
    out, pa = _dma_time(g4, TRN3, x, y, True)
    close(out, f64(x) + f64(y))
    _, pc = _dma_time(g4, TRN3, x, y, False)
    assert pa.stat("memory.hbm_read_bytes") == pc.stat("memory.hbm_read_bytes") == x.nbytes + y.nbytes
    assert abs(pa.stat("dma.active_time") - pc.stat("dma.active_time")) <= 0.05 * pc.stat("dma.active_time")


def test_dma_compute_half_rate_before_gen4(g4):
    """neuroncore.md 3.3: dma_compute runs at 0.5 of copy throughput on v2/v3 (collective compute engines;
    dma.compute_eff / compute_eff_sbuf = 0.5, 1.0 into SBUF on trn3; before 2026-12-05 an accumulating transfer cost
    a copy everywhere): on trn2 the accumulating kernel's DMA time grows by about half the y transfers' (a third
    or more of the total)."""
    x, y = randn((512, 2048), np.float32, seed=1), randn((512, 2048), np.float32, seed=2)
    out, pa = _dma_time(g4, "trn2", x, y, True)
    close(out, f64(x) + f64(y))
    _, pc = _dma_time(g4, "trn2", x, y, False)
    assert pa.stat("dma.active_time") > 1.2 * pc.stat("dma.active_time")


# --------------------------------------------------------------------------------------------------
# 4. gen4-only instructions on trn2: NSIM-E313 NotOnGeneration
# --------------------------------------------------------------------------------------------------

def test_exponential_on_trn2_is_e313(g4):
    _raises_e313(_k(g4.softmax_rows_vexp, "trn2"), randn((128, 64), np.float32, seed=1), what="exponential")


def test_rand2_on_trn2_is_e313(g4):
    _raises_e313(_k(g4.uniform_noise, "trn2"), np.array([[1]], np.uint32), what="rand2")
    _raises_e313(_k(g4.topk_gumbel_sample, "trn2"), randn((1, 256), BF16, seed=1), np.array([[1]], np.uint32), 8,
                 1.0, what="rand2")


def test_activate2_on_trn2_is_e313(g4):
    u = np.full((128, 8), 0.5, np.float32)
    _raises_e313(_k(g4.gumbel_from_uniform, "trn2"), u, what="activate2")


def test_matmul_wide_moving_on_trn2_is_a_limit_error(g4):
    """N > 512 on gen2/3 is the per-generation moving-free-size limit (nki-api.md 2.0 table): E308 naming 512."""
    a, b = randn((128, 128), BF16, seed=1), randn((128, 1024), BF16, seed=2)
    with pytest.raises(_core.NsimError) as e:
        _k(g4.matmul_gen4, "trn2")(a, b, 1024)
    assert "512" in str(e.value) or "float32" in str(e.value), str(e.value)


def test_bf16_psum_matmul_on_trn2_is_e313(g4):
    a, b = randn((128, 128), BF16, seed=1), randn((128, 512), BF16, seed=2)
    _raises_e313(_k(g4.matmul_gen4, "trn2"), a, b, 512, what="nc_matmul")
