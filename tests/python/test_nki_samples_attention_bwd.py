"""The nki-samples flash attention backward kernel (``flash_attn_bwd``,
tests/python/kernels/nki_samples_attention_bwd.py, sample code as the sample writes it) run through
``nsim.compat``: dq, dk and dv against numpy (causal and not, logit bias, head size 64, 128-wide K tiles,
float32), its dropout path, and what its timing must show."""
import numpy as np
import pytest

from conftest import executed_ops, require_core, sample_fixture  # noqa: E402

_core, ml_dtypes = require_core()
from numeric_helpers import close, rounded  # noqa: E402

BF16 = ml_dtypes.bfloat16


fb = sample_fixture("nki_samples_attention_bwd.py")


def _bf(x):
    return rounded(x, BF16)


def reference_bf16(q, k, v, o, dy, lse_tiles, causal, logit_bias=None):
    """The sample's math with its bfloat16 intermediates rounded where the kernel stores them (kernel_dtype
    bfloat16, mixed_dtype float32): Q scaled, the scores (and with the bias), the probabilities, dP, dS, each
    K tile's share of dQ (summed in float32 by ``nl.loop_reduce``), and the outputs."""
    b, h, d, sq = q.shape
    sk = k.shape[3]
    scale = 1.0 / float(d ** 0.5)
    q, k, v, o, dy = (x.astype(np.float64) for x in (q, k, v, o, dy))
    lse = lse_tiles.astype(np.float64).transpose(0, 1, 3, 2).reshape(b, h, sq)
    qs = _bf(q * scale)
    s = _bf(np.einsum("bhdq,bhdk->bhqk", qs, k))
    if causal:
        s = np.where(np.tril(np.ones((sq, sk), dtype=bool)), s, -9984.0)
    if logit_bias is not None:
        s = _bf(s + logit_bias)
    y = _bf(np.exp(s - lse[..., None]))
    dv = np.einsum("bhqk,bhdq->bhdk", y, dy)
    dp = _bf(np.einsum("bhdq,bhdk->bhqk", dy, v))
    rowsum = (_bf(dy) * _bf(o)).sum(axis=2)
    ds = _bf((dp - rowsum[..., None]) * y)
    dk = np.einsum("bhqk,bhdq->bhdk", ds, qs)
    kt = 512 if sk >= 512 else 128
    dq = sum(_bf(scale * np.einsum("bhqk,bhdk->bhdq", ds[..., j * kt:(j + 1) * kt], k[..., j * kt:(j + 1) * kt]))
             for j in range(sk // kt))
    return _bf(dq), _bf(dk), _bf(dv)


def _inputs(fb, b, h, d, s, causal, seed, dtype=BF16, bias=False):
    """q, k, v, dy (rounded to the kernel's dtype) and the forward pass's o and lse (numpy, float64)."""
    mod = fb[0]
    rng = np.random.default_rng(seed)
    q, k, v, dy = (rng.standard_normal((b, h, d, s)).astype(dtype).astype(np.float32) for _ in range(4))
    lb = rng.standard_normal((b, h, s, s)).astype(dtype).astype(np.float32) if bias else None
    o, lse, dq, dk, dv = mod.reference_flash_attn_bwd(q, k, v, dy, causal, logit_bias=lb)
    return q, k, v, dy, lb, o.astype(dtype).astype(np.float32), lse.astype(np.float32), (dq, dk, dv)


def _run(fb, q, k, v, o, dy, lse, lb=None, *, causal, dtype=BF16, mixed_precision=True, dropout_p=0.0, seed=None):
    mod = fb[0]
    b, h = q.shape[:2]
    res = mod.flash_attn_bwd[b, h](q.astype(dtype), k.astype(dtype), v.astype(dtype), o.astype(dtype),
                                   dy.astype(dtype), lse, seed,
                                   logit_bias_ref=None if lb is None else lb.astype(dtype),
                                   use_causal_mask=causal, mixed_precision=mixed_precision, dropout_p=dropout_p)
    return [np.asarray(x, np.float64) for x in res], mod.flash_attn_bwd.last_profile


@pytest.mark.parametrize("case", ["noncausal", "causal", "bias_causal_d64", "bias_noncausal_d64",
                                  "causal_seq256_two_batches"])
def test_flash_attn_bwd_gradients_bf16(fb, case):
    """bf16 inputs, float32 mixed precision: two heads over two 512-wide K tiles and eight 128-row Q tiles
    (the causal mask drops the pairs above the diagonal and selects on the diagonal), a logit bias with head
    size 64 (the ``affine_select`` + ``tensor_tensor`` path and the plain add), and seq 256 (128-wide K tiles,
    a (2, 1) grid). Within bf16 tolerance of the same math rounded where the kernel stores bf16."""
    shape, causal, bias = {"noncausal": ((1, 2, 128, 1024), False, False),
                           "causal": ((1, 2, 128, 1024), True, False),
                           "bias_causal_d64": ((1, 1, 64, 512), True, True),
                           "bias_noncausal_d64": ((1, 1, 64, 512), False, True),
                           "causal_seq256_two_batches": ((2, 1, 128, 256), True, False)}[case]
    q, k, v, dy, lb, o, lse, _ = _inputs(fb, *shape, causal, seed=11)
    got, prof = _run(fb, q, k, v, o, dy, lse, lb, causal=causal)
    want = reference_bf16(q, k, v, o, dy, lse, causal, lb)
    for g, w in zip(got, want):
        assert g.shape == w.shape == shape
        close(g, w, BF16)
    assert prof.total_time_ns > 0


def test_flash_attn_bwd_gradients_fp32(fb):
    """float32 throughout (kernel dtype and mixed dtype), causal: the gradients of the plain numpy math within
    float32 tolerance."""
    q, k, v, dy, _, _, lse, want = _inputs(fb, 1, 1, 128, 1024, True, seed=12, dtype=np.float32)
    o = fb[0].reference_flash_attn_bwd(q, k, v, dy, True)[0].astype(np.float32)
    got, _ = _run(fb, q, k, v, o, dy, lse, causal=True, dtype=np.float32)
    for g, w in zip(got, want):
        close(g, w, np.float32)


def test_flash_attn_bwd_dropout(fb):
    """``dropout_p > 0``: the loops become ``sequential_range`` and each tile pair seeds the generator
    (``nl.random_seed(seed=seed + offset, mask=...)``) before ``nl.dropout``: the same seed gives the same
    gradients, another seed others, and they differ from the gradients without dropout."""
    q, k, v, dy, _, o, lse, _ = _inputs(fb, 1, 1, 128, 512, True, seed=13)
    runs = [_run(fb, q, k, v, o, dy, lse, causal=True, dropout_p=0.25, seed=np.array([s], np.int32))[0]
            for s in (7, 7, 8)]
    plain, _ = _run(fb, q, k, v, o, dy, lse, causal=True)
    for g in runs[0]:
        assert np.isfinite(g).all()
    for a, b in zip(runs[0], runs[1]):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(runs[0][2], runs[2][2])
    assert not np.array_equal(runs[0][2], plain[2])


def test_flash_attn_bwd_causal_skips_masked_tiles(fb):
    """Causal: the mask of a (Q tile, K tile) pair wholly above the diagonal is False, so none of its
    instructions runs. Seq 1024: 8 Q tiles of 128 x 2 K tiles of 512 = 16 pairs; the second K tile is needed
    by Q tiles 4-7 only: 12 pairs. Each pair has 8 matmuls (QK^T, dV, dP, dK and 4 for dQ, one per 128-row
    part of the K tile) and 6 PE transposes (dy, q and 4 of dS), and load_kv transposes K: 2 x 4 more."""
    q, k, v, dy, _, o, lse, _ = _inputs(fb, 1, 1, 128, 1024, True, seed=14)
    counts, active = {}, {}
    for causal in (False, True):
        _, prof = _run(fb, q, k, v, o, dy, lse, causal=causal)
        ops = executed_ops(fb[0].flash_attn_bwd.last_json["body"])
        counts[causal] = (sum(s["op"] == "nc_matmul" for s in ops), sum(s["op"] == "nc_transpose" for s in ops))
        active[causal] = prof.stat("engine.tensor.active_time")
        assert prof.stat("engine.matmul_instruction_count") == counts[causal][0]
    assert counts[False] == (16 * 8, 16 * 6 + 8)
    assert counts[True] == (12 * 8, 12 * 6 + 8)
    assert active[True] < active[False]


def test_flash_attn_bwd_transposes_feed_matmuls_through_sbuf(fb):
    """``trans_dy = nisa.nc_transpose(dy_local[i])`` then ``nisa.nc_matmul(trans_dy, ...)``: a TensorE
    transpose writes PSUM and TensorE reads SBUF only, so each transposed tile is copied to SBUF once before
    its matmul (as the compiler must), and the copy is attributed to the matmul's line."""
    q, k, v, dy, _, o, lse, _ = _inputs(fb, 1, 1, 128, 512, False, seed=15)
    _run(fb, q, k, v, o, dy, lse, causal=False)
    lines = open(fb[0].__file__).read().splitlines()
    ops = executed_ops(fb[0].flash_attn_bwd.last_json["body"])

    def at(pattern, nth=0):
        return [i for i, text in enumerate(lines, 1) if pattern in text][nth]

    for mm_line in (at("dv_psum[i_d_head_tile, :, :] += nisa.nc_matmul(trans_dy"),
                    at("dk_psum[i_d_head_tile, :, :] += nisa.nc_matmul(trans_q_local"),
                    at("dq_psum[:, :] += nisa.nc_matmul(transposed_k_local")):
        here = [s["op"] for s in ops if s.get("loc", {}).get("line") == mm_line]
        # seq 512: one K tile x 4 Q tiles; dV and dK one matmul per pair, dQ four (one per 128 rows of K)
        n = 4 * (4 if "dq_psum" in lines[mm_line - 1] else 1)
        assert here.count("nc_matmul") == n and here.count("tensor_copy") == n, (mm_line, here)


def test_declared_psum_tensor_as_matmul_operand_is_an_error(fb):
    """Only a temporary gets the copy: a PSUM tensor the kernel declared itself, passed to ``nisa.nc_matmul``,
    is an operand in the wrong memory (NSIM-E301), as before."""
    _, nki, nl, nisa = fb

    @nki.jit
    def bad(a):
        out = nl.ndarray((128, 128), dtype=np.float32, buffer=nl.shared_hbm)
        t = nl.load(a)
        p = nl.ndarray((128, 128), dtype=nl.bfloat16, buffer=nl.psum)
        p[...] = nisa.nc_transpose(t)
        r = nisa.nc_matmul(p, t)
        nl.store(out, value=nl.copy(r))
        return out

    import nsim
    with pytest.raises(nsim.OperandError, match="NSIM-E301.*must be in sbuf"):
        bad(np.ones((128, 128), dtype=BF16))


def test_flash_attn_bwd_lnc2_launch(fb):
    """``flash_attn_bwd[1, nl.nc(2)]`` on trn2: the two heads on the two physical cores give the gradients of the
    one-core ``[1, 2]`` launch, in less time (each core runs one head; they share HBM), but not half of it: on one
    core the launch grid's kept loop overlaps its two heads (a head alone leaves engines idle): 58.1 us for both
    heads on one core, 43.5 us on two. (Until the lowering chose which PSUM tiles of the kept loop share a bank by
    timing, compiler.placement_search, the one-core loop's shared banks ran the heads one after the other: 81.6 us,
    and this test asserted a little over half; the unrolled one-core trace still shares them so: 92.1 us.)"""
    _, _, nl, _ = fb
    q, k, v, dy, _, o, lse, _ = _inputs(fb, 1, 2, 128, 1024, True, seed=16)
    one, p_one = _run(fb, q, k, v, o, dy, lse, causal=True)
    mod = fb[0]
    two = mod.flash_attn_bwd[1, nl.nc(2)](*(x.astype(BF16) for x in (q, k, v, o, dy)), lse, None,
                                          use_causal_mask=True, mixed_precision=True)
    p_two = mod.flash_attn_bwd.last_profile
    for a, b in zip(one, two):
        np.testing.assert_array_equal(a, np.asarray(b, np.float64))
    assert 0.5 * p_one.total_time_ns < p_two.total_time_ns < 0.8 * p_one.total_time_ns


def test_values_assigned_into_tiles_are_written_there(fb):
    """``softmax_dx_local[:, :] = nisa.scalar_tensor_tensor(...)`` and ``qk_res_buf[:, :] = nisa.affine_select(...)``:
    the instruction writes the kernel's tile directly, as ``t[...] = nisa.activation(...)`` does; no copy of a
    temporary follows it (the affine_select's one copy is of its PSUM input: GpSimd cannot read PSUM)."""
    q, k, v, dy, _, o, lse, _ = _inputs(fb, 1, 1, 128, 512, True, seed=17)
    _run(fb, q, k, v, o, dy, lse, causal=True)
    lines = open(fb[0].__file__).read().splitlines()
    ops = executed_ops(fb[0].flash_attn_bwd.last_json["body"])
    for pattern, op, copies in (("softmax_dx_local[:, :] = nisa.scalar_tensor_tensor(", "scalar_tensor_tensor", 0),
                                ("qk_res_buf[:, :] = nisa.affine_select(", "affine_select", 1)):
        at = {i for i, text in enumerate(lines, 1) if pattern in text}  # (the bias and no-bias branches)
        here = [s["op"] for s in ops if s.get("loc", {}).get("line") in at]
        # seq 512: one K tile of 512 x 4 Q tiles, all on or left of the diagonal
        assert here.count(op) == 4 and here.count("tensor_copy") == 4 * copies, (pattern, here)
