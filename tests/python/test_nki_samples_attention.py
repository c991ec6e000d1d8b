"""The nki-samples flash attention forward kernel (``flash_fwd``, tests/python/kernels/nki_samples_attention.py,
unmodified sample code) run through ``nsim.compat``: its outputs and log-sum-exp against numpy for the
sample's configurations (causal and not, GQA, logit bias, V given transposed on trn1 and trn2, inference,
fp32, bf16 lse), and what its timing must show."""
import os

import numpy as np
import pytest

from conftest import beta1_modules, executed_ops, require_core  # noqa: E402

_core, ml_dtypes = require_core()
from numeric_helpers import close  # noqa: E402

BF16 = ml_dtypes.bfloat16
KDIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels")


@pytest.fixture(scope="module")
def fa():
    """The sample's module, imported with compat installed; sys.modules restored afterwards."""
    with beta1_modules(os.path.join(KDIR, "nki_samples_attention.py")) as (mod,):
        yield mod


def _inputs(b, h, kh, d, s, seed, bias=False):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((b, h, d, s)).astype(np.float32)
    k = rng.standard_normal((b, kh, d, s)).astype(np.float32)
    v = rng.standard_normal((b, kh, s, d)).astype(np.float32)
    lb = rng.standard_normal((1, h, s, s)).astype(np.float32) if bias else None
    return q, k, v, lb


def _run(fa, q, k, v, lb=None, *, causal=True, config="trn2", mixed_precision=True, **cfg):
    b, kh = q.shape[0], k.shape[1]
    flash_config = fa.FlashConfig(**cfg)
    vin = np.ascontiguousarray(v.transpose(0, 1, 3, 2)) if flash_config.should_transpose_v else v
    res = fa.flash_fwd.options(config=config)[b, kh](q, k, vin, None, logit_bias=lb, use_causal_mask=causal,
                                                      mixed_precision=mixed_precision, config=flash_config)
    return res, fa.flash_fwd.last_profile


def _bf16(x):
    return None if x is None else x.astype(BF16).astype(np.float32)


def _check(fa, res, q, k, v, lb, causal, mixed_precision=True, training=True, lse_dtype=np.float32):
    o, lse = res if training else (res, None)
    if mixed_precision:  # the kernel computes on bf16 copies of q, k, v (and of the bias)
        q, k, v, lb = _bf16(q), _bf16(k), _bf16(v), _bf16(lb)
    want_o, want_lse = fa.reference_flash_fwd(q, k, v, causal, logit_bias=lb)
    assert o.shape == want_o.shape
    close(o, want_o, BF16 if mixed_precision else np.float32)
    if training:
        assert lse.shape == want_lse.shape and lse.dtype == lse_dtype
        close(lse, want_lse, BF16 if (mixed_precision or lse_dtype != np.float32) else np.float32)


def test_flash_fwd_causal_gqa_two_large_tiles(fa):
    """The default path: causal, training (o and lse), 2 query heads per KV head, seq 4096 = two 2048-wide K/V
    tiles (the online softmax over ``sequential_range(1, 2)``)."""
    q, k, v, _ = _inputs(1, 2, 1, 128, 4096, 1)
    res, prof = _run(fa, q, k, v)
    _check(fa, res, q, k, v, None, True)
    assert prof.total_time_ns > 0


@pytest.mark.parametrize("case", ["bias_causal_d64", "bias_noncausal", "transpose_v_trn1", "transpose_v_trn2",
                                  "inference", "fp32", "lse_bf16_trn1"])
def test_flash_fwd_configurations(fa, case):
    """The sample's other paths: logit bias (the diagonal / right-of-diagonal selections), V given transposed
    (``nl.load_transpose2d`` of ``v[b, h][:, cols]`` before gen3, ``nisa.dma_transpose`` + ``tensor_copy`` on
    gen3), inference (o only), no mixed precision (fp32 throughout, 512-wide K/V tiles, two batches) and a
    bf16 lse."""
    kw, shape, bias, causal, training, mp = {}, (1, 2, 2, 128, 2048), False, True, True, True
    lse_dtype = np.float32
    if case == "bias_causal_d64":
        shape, bias = (1, 2, 2, 64, 2048), True
    elif case == "bias_noncausal":
        bias, causal = True, False
    elif case == "transpose_v_trn1":
        kw = dict(should_transpose_v=True, config="trn1")
    elif case == "transpose_v_trn2":
        kw = dict(should_transpose_v=True, config="trn2")
    elif case == "inference":
        kw, training = dict(training=False), False
    elif case == "fp32":
        shape, mp, kw = (2, 1, 1, 128, 1024), False, dict(seq_tile_size=512)
    elif case == "lse_bf16_trn1":
        kw, lse_dtype = dict(lse_dtype="bfloat16", config="trn1"), BF16
    q, k, v, lb = _inputs(*shape, seed=2, bias=bias)
    res, _ = _run(fa, q, k, v, lb, causal=causal, mixed_precision=mp, **kw)
    _check(fa, res, q, k, v, lb, causal, mixed_precision=mp, training=training, lse_dtype=lse_dtype)


def test_flash_fwd_transposes_write_psum_directly(fa):
    """``p_local_t_tmp[:, j] = nisa.nc_transpose(p_local[:, j])`` transposes bf16 probabilities into a float32
    PSUM tile: one TensorE transpose each, written there directly (a matmul with an identity writes float32
    PSUM), not a bf16 result copied into it. Before, every transpose had a PSUM-to-PSUM copy on VectorE or
    ScalarE: 2048 copies for two heads at seq 4096 on trn2, 1,078.2 us against 892.6 us without them."""
    q, k, v, _ = _inputs(1, 1, 1, 128, 2048, 3)
    _run(fa, q, k, v)
    line = next(i for i, text in enumerate(open(fa.__file__).read().splitlines(), 1)
                if "= nisa.nc_transpose(" in text)
    ops = [s for s in executed_ops(fa.flash_fwd.last_json["body"]) if s.get("loc", {}).get("line") == line]
    # 16 query tiles x 2048 / 128 transposes each
    assert [s["op"] for s in ops] == ["nc_transpose"] * (16 * 2048 // 128)


def test_flash_fwd_causal_skips_masked_matmuls(fa):
    """Causal: the Python ``if`` on the loop-index predicate skips the QK^T matmuls of the K tiles wholly right
    of the diagonal, so TensorE does less work than without the mask (the same kernel, same sizes)."""
    q, k, v, _ = _inputs(1, 1, 1, 128, 2048, 4)
    _, causal = _run(fa, q, k, v, causal=True)
    _, full = _run(fa, q, k, v, causal=False)
    # QK^T: 16 query tiles x 4 K tiles of 512 without the mask; with it, query tile i needs the K tiles
    # starting at or before 128 i: sum over i of (128 i // 512 + 1) = 4 x (1 + 2 + 3 + 4) = 40 of 64.
    assert full.stat("engine.matmul_instruction_count") - causal.stat("engine.matmul_instruction_count") == 64 - 40
    assert causal.stat("engine.tensor.active_time") < full.stat("engine.tensor.active_time")


def test_flash_fwd_lnc2_launch(fa):
    """``flash_fwd[1, nl.nc(2)]`` (trn2's two physical cores, one head each) gives the outputs of
    ``flash_fwd[1, 2]`` on one core in a little over half its time: each core runs one of two equal programs;
    they share HBM and its DMA bandwidth (measured 141.6 us against 242.8 us at seq 2048)."""
    import neuronxcc.nki.language as nl
    q, k, v, _ = _inputs(1, 2, 2, 128, 2048, 5)
    one = fa.flash_fwd[1, 2](q, k, v, None)
    t_one = fa.flash_fwd.last_profile.total_time_ns
    two = fa.flash_fwd[1, nl.nc(2)](q, k, v, None)
    t_two = fa.flash_fwd.last_profile.total_time_ns
    for a, b in zip(one, two):
        np.testing.assert_array_equal(a, b)
    _check(fa, two, q, k, v, None, True)
    assert 0.5 * t_one < t_two < 0.65 * t_one


def test_flash_fwd_dropout(fa):
    """Training with dropout (``dropout_p=0.1``): the sample loads its seed with ``nl.load(seed[0])`` (one
    element of a 1-D HBM tensor: a [1, 1] tile; an IndexError before), seeds ``nl.random_seed`` per 512
    columns and drops probabilities after their row sums, so lse is the one without dropout; o is
    deterministic for a seed, differs for another, and stays close to o without dropout (kept values
    are scaled by 1 / (1 - p))."""
    q, k, v, _ = _inputs(1, 1, 1, 128, 2048, 6)

    def run(seed):
        return fa.flash_fwd[1, 1](q, k, v, np.array([seed], np.int32), dropout_p=0.1)

    (o1, l1), (o1b, _), (o2, _) = run(7), run(7), run(8)
    o0, l0 = fa.flash_fwd[1, 1](q, k, v, None)
    np.testing.assert_array_equal(l1, l0)
    np.testing.assert_array_equal(o1, o1b)
    assert not np.array_equal(o1, o2) and not np.array_equal(o1, o0)
    assert np.corrcoef(o1.ravel(), o0.ravel())[0, 1] > 0.8


def test_flash_fwd_zeroed_scores_overwritten_are_dropped(fa):
    """``qk_psum = nl.zeros(...)`` then ``qk_psum[:, :] = nl.matmul(...)`` under the causal mask's ``if``: where the
    matmul runs, it overwrites the whole tile before anything reads it, so the compiler drops the zeroing; the
    K tiles wholly right of the diagonal keep it (their zeros go into the ``affine_select``). Seq 2048: 16 query
    tiles x 4 K tiles of 512, of which 40 need the matmul (test_flash_fwd_causal_skips_masked_matmuls): 24
    zeroings of [128, 512] fp32 PSUM on VectorE remain of 64, and the outputs are unchanged."""
    q, k, v, _ = _inputs(1, 1, 1, 128, 2048, 6)
    res, _ = _run(fa, q, k, v)
    _check(fa, res, q, k, v, None, True)
    line = next(i for i, text in enumerate(open(fa.__file__).read().splitlines(), 1)
                if "qk_psum = nl.zeros(" in text)
    ops = executed_ops(fa.flash_fwd.last_json["body"])
    assert sum(s["op"] == "memset" and s.get("loc", {}).get("line") == line for s in ops) == 64 - 40


def test_flash_fwd_traces_and_times_the_same_with_the_sanitizer_on(fa):
    """simulate()'s default sanitizer (check=True) must not change what is simulated. Its affine_range check could
    not show that the GQA loop's writes `o[batch, head_id * q_h_per_k_h + i_q_h, ...]` move apart (it took the launch
    grid's `head_id` as varying) and unrolled that loop to check it exactly: at seq 2048, grid [1, 8], the IR had
    1,114 ops instead of 467 and the simulated time was 1,497,056.7 against 1,477,444.7 ns without the sanitizer."""
    q, k, v, _ = _inputs(1, 4, 2, 128, 2048, 3)
    checked, plain = fa.flash_fwd.options(config="trn2"), fa.flash_fwd.options(config="trn2", timing_only=True)
    checked[1, 2](q, k, v, None)
    plain[1, 2](q, k, v, None)
    assert checked.last_profile.total_time_ns == plain.last_profile.total_time_ns
    assert checked.last_json == plain.last_json
