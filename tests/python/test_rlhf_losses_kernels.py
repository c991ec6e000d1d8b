"""Post-training / RLHF losses written like public NKI and Liger-Kernel-style ports
(tests/python/kernels/rlhf_losses_kernels.py, Beta-1 dialect, and rlhf_losses_kernels_new.py, new dialect; both
unmodified, through ``nsim.compat``):

- Liger's fused linear cross-entropy (Beta 1): the logits h W^T per vocabulary chunk on the PE, an online
  log-sum-exp, the target logit by an ``iota`` one-hot, ``ignore_index`` and a z-loss (c lse^2), and the backward in
  the same kernel (softmax - onehot per chunk, recomputed): dh = g W accumulated in PSUM over the vocabulary and
  dW = g^T h accumulated in SBUF over the token tiles (or in HBM by accumulating DMAs, ``dst_rmw_op=np.add``); the
  hidden size in up to four contraction tiles; the [T, V] logits never reach HBM;
- its forward alone (new dialect), fused and the unfused way (the logits stored to an HBM scratch and read back),
  the target logit picked by the ``iota`` one-hot or by ``range_select`` over [target, target + 1) chained across the
  chunks in the VectorE accumulator registers;
- TRL-style preference losses from logits (Beta 1): masked per-sequence log-probabilities of the labels (token ->
  sequence one-hot by ``iota`` and a matmul over the partitions), DPO -log sigmoid(beta ((pc - rc) - (pr - rr))),
  SimPO (length-normalised, margin gamma, no reference) and ORPO (chosen NLL + lambda * -log sigmoid(log odds));
- the GRPO / PPO token-level clipped surrogate with a k3 KL penalty (new dialect, ISA calls): per-token losses, masked
  means per sequence and over the batch (GRPO's mean of sequence means and the token-level DAPO mean), the mean KL;
  and the same written with Beta-1 ``nl`` tile operators (broadcast advantage column, masked ragged tile);
- PPO's generalised advantage estimation (Beta 1): time-reversed loads (a negative arange coefficient) turning the
  backward recursion into one forward ``tensor_tensor_scan``.

Checked against float64 numpy written from the Liger / TRL definitions (fp32 1e-5 relative, bf16 inputs 1e-2),
properties that need no reference (every target ignored gives exactly zero loss and gradients, the z-loss adds
exactly c mean(lse^2), a policy equal to its reference has DPO loss log 2 and zero rewards, on-policy GRPO tokens
lose exactly -A, clipped ratios give (1 +- eps) A), the fused forward agreeing bit for bit with the unfused one and
with the Beta-1 forward-backward, ragged token tiles / vocabulary chunks / sequence tiles / token chunks, no sanitizer
report on any run; structure: the instruction and DMA counts and HBM bytes the tiling implies (the LM head read once,
the logits read once per policy, the fused forward reading T V 4 bytes less and writing T V 4 bytes less than the
unfused one; the HBM-accumulated dW costing NT V D 4 bytes more each way), and three timing stories, each with its
reason: the fused forward is faster than the unfused one, the ``range_select`` pick faster than the ``iota`` one, the
SBUF-resident dW accumulator faster than accumulating DMAs into HBM.

The nsim fixes this family needed: none -- every kernel of the family (both dialects, fp32 and bf16, ragged shapes)
ran, computed and timed as the spec says on the first try; the probes beyond the kernels (1-D HBM index expressions
with masks, ``nl.loop_reduce``, ``nl.matmul(transpose_x=True)``, ScalarE / VectorE accumulator chains with
``reduce_cmd.reduce`` over chunks interleaved with other VectorE work, explicit ``accumulate=`` on ``nc_matmul``, the
new dialect's value ``nl.load`` / ``nl.store`` / ``nl.*`` API with (P, 1) broadcasts, ``load_transpose2d`` /
``dma_transpose`` / ``nc_matmul(is_transpose=True)``, gen4 ``exponential``, ``dma_compute``, Beta-1 result dtypes of
mixed bf16 / fp32 / Python-scalar expressions against spec 3.3, fp32 / bf16 matmul and transpose costs against neuroncore.md
3.1) found nothing wrong either.
"""
import math

import numpy as np
import pytest

from conftest import require_core, run_clean, sample_fixture  # noqa: E402
from conftest import op_counts as _ops  # noqa: E402

_core, ml_dtypes = require_core()
from numeric_helpers import close, close_to_max, f64 as _f64, randn as _randn  # noqa: E402

BF16 = ml_dtypes.bfloat16
PMAX = 128
V_CHUNK = 512

rl = sample_fixture("rlhf_losses_kernels.py", module_only=True)
rln = sample_fixture("rlhf_losses_kernels_new.py", module_only=True)


def _tiles(n, t):
    return (n + t - 1) // t


def _lse(z):
    m = z.max(-1, keepdims=True)
    return m[..., 0] + np.log(np.exp(z - m).sum(-1))


def _logsig(x):
    return -np.logaddexp(0.0, -x)


def _tol(dtype):
    return 1e-5 if np.dtype(dtype) == np.float32 else 1e-2


# --------------------------------------------------------------------------------------------------
# Fused linear cross-entropy (Beta 1: forward + backward; new dialect: forward, fused and unfused)
# --------------------------------------------------------------------------------------------------

def ref_flce(h, w, tg, ignore_index=-100, c=0.0):
    """Liger's FLCE with lse_square_scale c and reduction='mean' over the counted tokens: (loss, dh, dw, lse,
    per-token loss)."""
    h, w = _f64(h), _f64(w)
    z = h @ w.T
    lse = _lse(z)
    keep = tg != ignore_index
    n = max(int(keep.sum()), 1)
    rows = np.arange(len(tg))
    zt = z[rows, np.where(keep, tg, 0)]
    tok = np.where(keep, lse - zt + c * lse * lse, 0.0)
    p = np.exp(z - lse[:, None]) * (1 + 2 * c * lse)[:, None]
    oh = np.zeros_like(z)
    oh[rows[keep], tg[keep]] = 1.0
    g = (p - oh) * keep[:, None] / n
    return tok.sum() / n, g @ w, g.T @ h, lse, tok


def _flce_inputs(T, D, V, dtype, seed, ignore_every=7):
    rng = np.random.default_rng(seed)
    h = _randn((T, D), dtype, seed, scale=0.5)
    w = _randn((V, D), dtype, seed + 1, scale=0.2)
    tg = rng.integers(0, V, T).astype(np.int32)
    if ignore_every:
        tg[::ignore_every] = -100
    return h, w, tg


@pytest.mark.parametrize("T,D,V,dtype,c", [
    (256, 64, 1000, np.float32, 0.0),      # ragged last vocabulary chunk (488) and 128-row block (104)
    (200, 128, 640, np.float32, 1e-4),     # ragged token tile (72 rows), z-loss
    (130, 96, 777, BF16, 1e-4),            # 2 rows in the last token tile, bf16 matmuls
    (128, 32, 512, BF16, 0.0),
    (200, 320, 700, np.float32, 1e-4),     # hidden size in 3 contraction tiles (128 + 128 + 64)
    (160, 256, 600, BF16, 0.0),
])
def test_flce_fwd_bwd_matches_numpy(rl, T, D, V, dtype, c):
    h, w, tg = _flce_inputs(T, D, V, dtype, seed=T + V)
    loss, dh, dw = run_clean(rl.flce_fwd_bwd, h, w, tg, -100, c)
    want_loss, want_dh, want_dw, _, _ = ref_flce(h, w, tg, -100, c)
    assert loss.shape == (1, 1) and dh.dtype == np.dtype(dtype) and dw.dtype == np.dtype(dtype)
    close(loss[0, 0], want_loss, dtype)
    # dh and dw are sums over the vocabulary / the tokens of terms of both signs
    close_to_max(dh, want_dh, dtype)
    close_to_max(dw, want_dw, dtype)


def test_flce_ignored_tokens_get_zero_gradient(rl):
    """dh rows of ignored tokens are exactly 0 (their g rows are multiplied by keep = 0); every target ignored gives
    loss 0 and all-zero gradients (n clamped to 1, nothing counted)."""
    h, w, tg = _flce_inputs(256, 64, 600, np.float32, seed=3, ignore_every=5)
    _, dh, _ = run_clean(rl.flce_fwd_bwd, h, w, tg, -100, 0.0)
    assert (dh[tg == -100] == 0).all() and (dh[tg != -100] != 0).any(axis=1).all()
    tg[:] = -100
    loss, dh, dw = run_clean(rl.flce_fwd_bwd, h, w, tg, -100, 0.0)
    assert loss[0, 0] == 0 and not dh.any() and not dw.any()


def test_flce_z_loss_adds_c_mean_lse_squared(rl):
    """loss(c) - loss(0) = c mean(lse^2) over the counted tokens; a custom ignore_index (-1) behaves as -100."""
    h, w, tg = _flce_inputs(160, 64, 900, np.float32, seed=9, ignore_every=0)
    tg[::4] = -1
    c = 1e-2
    l0 = run_clean(rl.flce_fwd_bwd, h, w, tg, -1, 0.0)[0][0, 0]
    l1 = run_clean(rl.flce_fwd_bwd, h, w, tg, -1, c)[0][0, 0]
    _, _, _, lse, _ = ref_flce(h, w, tg, -1, 0.0)
    keep = tg != -1
    assert l1 - l0 == pytest.approx(c * (lse[keep] ** 2).mean(), rel=1e-4)
    close(l1, ref_flce(h, w, tg, -1, c)[0])


def test_flce_fwd_bwd_structure(rl):
    """T = 256, D = 64, V = 1000: NT = 2 token tiles, NV = 2 vocabulary chunks of 512, NB = 8 head blocks of 128.
    DMAs: NB head-row loads + NT target loads (the count) + per tile h, targets and the dh store (3 NT) + NB dw
    stores + the loss = 8 + 2 + 6 + 8 + 1 = 25. Matmuls: NT count matmuls + per tile 2 NV logits (both passes) and
    2 NB (dh and dw per head block) + the final sum = 2 + 2 (4 + 16) + 1 = 43. PE transposes: NB (the head) + NT (h)
    + NT NB (g per head block) = 26. The head and h are read once, the targets twice; dh, dw and the loss written once
    -- no logits in HBM."""
    T, D, V = 256, 64, 1000
    h, w, tg = _flce_inputs(T, D, V, np.float32, seed=1)
    run_clean(rl.flce_fwd_bwd, h, w, tg)
    NT, NV, NB = _tiles(T, PMAX), _tiles(V, V_CHUNK), _tiles(V, PMAX)
    c = _ops(rl.flce_fwd_bwd)
    assert c["dma_copy"] == NB + NT + 3 * NT + NB + 1 == 25, c
    assert c["nc_matmul"] == NT + NT * (2 * NV + 2 * NB) + 1 == 43, c
    assert c["nc_transpose"] == NB + NT + NT * NB == 26, c
    assert c["iota"] == 1 and c["activation_reduce"] == NT * NV, c
    prof = rl.flce_fwd_bwd.last_profile
    assert prof.stat("memory.hbm_read_bytes") == h.nbytes + w.nbytes + 2 * tg.nbytes
    assert prof.stat("memory.hbm_write_bytes") == h.nbytes + w.nbytes + 4


def test_flce_fwd_bwd_structure_hidden_tiles(rl):
    """D = 320 = 3 contraction tiles (KD): each logits chunk is KD accumulating matmuls in both passes and the head
    and h are transposed per contraction tile. T = 200 (NT = 2, the second tile 72 rows: its loads and the dh store
    masked), V = 700 (NV = 2, NB = 6): matmuls NT + NT (2 NV KD + 2 NB) + 1 = 2 + 2 (12 + 12) + 1 = 51, PE
    transposes NB KD + NT KD + NT NB = 18 + 6 + 12 = 36. HBM bytes are those of the D <= 128 case: h and the head
    read once, the targets twice (the masked rows of the last tile are not read)."""
    T, D, V = 200, 320, 700
    h, w, tg = _flce_inputs(T, D, V, np.float32, seed=2)
    run_clean(rl.flce_fwd_bwd, h, w, tg)
    NT, NV, NB, KD = _tiles(T, PMAX), _tiles(V, V_CHUNK), _tiles(V, PMAX), _tiles(D, PMAX)
    c = _ops(rl.flce_fwd_bwd)
    assert c["nc_matmul"] == NT + NT * (2 * NV * KD + 2 * NB) + 1 == 51, c
    assert c["nc_transpose"] == NB * KD + NT * KD + NT * NB == 36, c
    prof = rl.flce_fwd_bwd.last_profile
    assert prof.stat("memory.hbm_read_bytes") == h.nbytes + w.nbytes + 2 * tg.nbytes
    assert prof.stat("memory.hbm_write_bytes") == h.nbytes + w.nbytes + 4


def test_flce_dw_accumulated_in_hbm(rl):
    """dw_in_hbm=True (Liger's grad_weight in HBM): dW zeroed by NB stores, then one accumulating DMA
    (``dst_rmw_op=np.add``) per (token tile, head block) instead of a VectorE add into SBUF. Bit-identical in fp32
    (the same fp32 adds in the same order: 0 + p_0 + p_1 + ...). Each accumulating DMA reads and writes its
    [128, D] fp32 block: NT V D 4 bytes more each way than the SBUF-resident accumulator (which writes dW once),
    NT NB more DMAs and NT NB fewer tensor_tensor adds. T = 512, D = 128, V = 2048 (NT = 4, NB = 16): the 64 HBM
    round trips of 64 KiB sit on the DMA queues behind the PE / VectorE work of each block, which hides them with
    four rotating buffers per tile: both variants take about the same time (109.09 against 109.04 us; with two
    buffers the SBUF variant was faster)."""
    T, D, V = 512, 128, 2048
    h, w, tg = _flce_inputs(T, D, V, np.float32, seed=8)
    a = run_clean(rl.flce_fwd_bwd, h, w, tg)
    pa, ca = rl.flce_fwd_bwd.last_profile, _ops(rl.flce_fwd_bwd)
    b = run_clean(rl.flce_fwd_bwd, h, w, tg, -100, 0.0, True)
    pb, cb = rl.flce_fwd_bwd.last_profile, _ops(rl.flce_fwd_bwd)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    NT, NB = _tiles(T, PMAX), _tiles(V, PMAX)
    assert cb["dma_copy"] == ca["dma_copy"] + NT * NB and ca["tensor_tensor"] - cb["tensor_tensor"] == NT * NB
    for stat in ("memory.hbm_read_bytes", "memory.hbm_write_bytes"):
        assert pb.stat(stat) == pa.stat(stat) + NT * V * D * 4, stat
    assert pa.total_time_ns == pytest.approx(pb.total_time_ns, rel=0.02), (pa.total_time_ns, pb.total_time_ns)


def ref_ce_tokens(h, w, tg, ignore_index=-100, c=0.0):
    _, _, _, lse, tok = ref_flce(h, w, tg, ignore_index, c)
    return tok, lse


@pytest.mark.parametrize("name", ["flce_forward", "linear_ce_naive"])
@pytest.mark.parametrize("T,D,V,dtype,c", [
    (256, 64, 1000, np.float32, 1e-3),
    (200, 128, 640, BF16, 0.0),
    (77, 100, 1300, np.float32, 0.0),      # one ragged token tile, three chunks (the last 276)
])
def test_flce_forward_matches_numpy(rln, name, T, D, V, dtype, c):
    h, w, tg = _flce_inputs(T, D, V, dtype, seed=T)
    loss, lse = run_clean(getattr(rln, name), h, w, tg, -100, c)
    want_tok, want_lse = ref_ce_tokens(h, w, tg, -100, c)
    assert loss.shape == (T,) and lse.shape == (T,) and loss.dtype == np.float32
    assert (loss[tg == -100] == 0).all()
    # the logits are exact sums of bf16 products in fp32 PSUM: fp32 tolerance holds for bf16 inputs too
    close(loss, want_tok)
    close(lse, want_lse)


def test_flce_forward_fused_vs_unfused(rln):
    """The same outputs bit for bit (the same fp32 logits through the same online steps). The unfused kernel writes
    the T x V fp32 logits to HBM and reads them back: exactly T V 4 bytes more each way, and NT NV stores plus NT NV
    loads more (DMAs: fused NB head blocks + 4 per token tile = 8 + 8 = 16; unfused 16 + 2 * 2 * 2 = 24). It is slower:
    the round trip adds 2 MB of HBM traffic and a DMA latency between the matmul and the softmax of every chunk."""
    T, D, V = 256, 64, 1000
    h, w, tg = _flce_inputs(T, D, V, np.float32, seed=5)
    a = run_clean(rln.flce_forward, h, w, tg)
    pa, ca = rln.flce_forward.last_profile, _ops(rln.flce_forward)
    b = run_clean(rln.linear_ce_naive, h, w, tg)
    pb, cb = rln.linear_ce_naive.last_profile, _ops(rln.linear_ce_naive)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    NT, NV, NB = _tiles(T, PMAX), _tiles(V, V_CHUNK), _tiles(V, PMAX)
    assert ca["dma_copy"] == NB + 4 * NT == 16 and cb["dma_copy"] == ca["dma_copy"] + 2 * NT * NV, (ca, cb)
    assert ca["nc_matmul"] == cb["nc_matmul"] == NT * NV and ca["nc_transpose"] == NB + NT, (ca, cb)
    assert pa.stat("memory.hbm_read_bytes") == h.nbytes + w.nbytes + tg.nbytes
    assert pa.stat("memory.hbm_write_bytes") == 2 * T * 4
    assert pb.stat("memory.hbm_read_bytes") == pa.stat("memory.hbm_read_bytes") + T * V * 4
    assert pb.stat("memory.hbm_write_bytes") == pa.stat("memory.hbm_write_bytes") + T * V * 4
    assert pa.total_time_ns < pb.total_time_ns, (pa.total_time_ns, pb.total_time_ns)


def test_flce_forward_range_select_pick(rln):
    """pick="range_select": the target logit as the max of ``range_select`` over [target, target + 1) with
    range_start = v0, chained across the chunks in the VectorE registers (reset on the first chunk, reduce after).
    Bit-identical outputs (both picks are exact: z times 1 plus zeros, or the max of one value). Per (token tile,
    chunk) one range_select replaces the iota pick's tensor_scalar (target - v0), scalar_tensor_tensor (== times z),
    tensor_reduce and tensor_tensor (running add); per token tile one tensor_scalar (target + 1) is added, and no
    column-id iota is made. Fewer VectorE passes over [128, 512] per chunk: faster."""
    T, D, V = 256, 64, 1000
    h, w, tg = _flce_inputs(T, D, V, np.float32, seed=6)
    a = run_clean(rln.flce_forward, h, w, tg, -100, 1e-3, "iota")
    ca, ta = _ops(rln.flce_forward), rln.flce_forward.last_profile.total_time_ns
    b = run_clean(rln.flce_forward, h, w, tg, -100, 1e-3, "range_select")
    cb, tb = _ops(rln.flce_forward), rln.flce_forward.last_profile.total_time_ns
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    close(b[0], ref_ce_tokens(h, w, tg, -100, 1e-3)[0])
    NT, NV = _tiles(T, PMAX), _tiles(V, V_CHUNK)
    assert cb["range_select"] == NT * NV and cb["iota"] == 0 and ca["iota"] == 1, cb
    assert ca["tensor_scalar"] - cb["tensor_scalar"] == NT * NV - NT, (ca, cb)
    for op in ("scalar_tensor_tensor", "tensor_reduce", "tensor_tensor"):
        assert ca[op] - cb[op] == NT * NV, (op, ca, cb)
    assert tb < ta, (ta, tb)


def test_flce_forward_agrees_with_forward_backward(rl, rln):
    """The new-dialect forward's per-token losses averaged over the counted tokens equal the Beta-1 kernel's loss."""
    h, w, tg = _flce_inputs(300, 64, 700, np.float32, seed=11)
    tok, _ = run_clean(rln.flce_forward, h, w, tg, -100, 1e-4)
    loss = run_clean(rl.flce_fwd_bwd, h, w, tg, -100, 1e-4)[0]
    close(loss[0, 0], _f64(tok).sum() / (tg != -100).sum())


# --------------------------------------------------------------------------------------------------
# Preference losses from logits (Beta 1)
# --------------------------------------------------------------------------------------------------

def ref_seq_logps(logits, labels, mask):
    """Masked sums of log softmax(logits)[label] per sequence, and the counts."""
    z = _f64(logits)
    logp = np.take_along_axis(z, labels[..., None], -1)[..., 0] - _lse(z)
    return (logp * mask).sum(1), mask.sum(1)


def _pref_inputs(S, L, V, dtype, seed):
    rng = np.random.default_rng(seed)
    pol = _randn((S, L, V), dtype, seed)
    ref = _randn((S, L, V), dtype, seed + 1)
    labels = rng.integers(0, V, (S, L)).astype(np.int32)
    mask = np.zeros((S, L), np.float32)
    for s in range(S):  # prompt tokens masked out, responses of different lengths, padding at the end
        mask[s, 3 + s % 5: L - (s * 3) % 7] = 1.0
    return pol, ref, labels, mask


def ref_preference(pol, ref, labels, mask, kind, beta, gamma=0.0, lam=0.1):
    pc_all, n = ref_seq_logps(pol, labels, mask)
    B = len(pc_all) // 2
    if kind == "sigmoid":
        rc_all, _ = ref_seq_logps(ref, labels, mask)
        cr, rr = beta * (pc_all[:B] - rc_all[:B]), beta * (pc_all[B:] - rc_all[B:])
        return -_logsig(cr - rr), cr, rr, pc_all
    a = pc_all / np.maximum(n, 1)
    cr, rr = beta * a[:B], beta * a[B:]
    if kind == "simpo":
        return -_logsig(cr - rr - gamma), cr, rr, pc_all
    log_odds = (a[:B] - a[B:]) - (np.log1p(-np.exp(a[:B])) - np.log1p(-np.exp(a[B:])))
    return -a[:B] - lam * _logsig(log_odds), cr, rr, pc_all


@pytest.mark.parametrize("kind", ["sigmoid", "simpo", "orpo"])
@pytest.mark.parametrize("S,L,V,dtype", [
    (4, 48, 700, np.float32),    # 192 tokens: a ragged second tile of 64, a ragged chunk of 188
    (6, 50, 512, BF16),          # 300 tokens: three tiles, sequences straddling tile borders
])
def test_preference_loss_matches_numpy(rl, kind, S, L, V, dtype):
    pol, ref, labels, mask = _pref_inputs(S, L, V, dtype, seed=S + L)
    beta, gamma, lam = 0.1, 0.5, 0.2
    out = run_clean(rl.preference_loss, pol, labels, mask, ref if kind == "sigmoid" else None, beta, kind, gamma,
                    lam)
    want = ref_preference(pol, ref, labels, mask, kind, beta, gamma, lam)
    B = S // 2
    assert [o.shape for o in out] == [(1, B), (1, B), (1, B), (1, S)]
    # the logps are sums of ~40 log-probabilities of magnitude ~7 (fp32 in the kernel for bf16 logits too)
    for got, exp in zip(out, want):
        np.testing.assert_allclose(_f64(got[0]), exp, rtol=1e-5, atol=1e-5 * np.abs(want[3]).max())


def test_dpo_policy_equal_to_reference(rl):
    """pi = ref: every log ratio is exactly 0 (the same logits through the same instructions), so the rewards are 0
    and each loss is -log sigmoid(0) = log 2."""
    pol, _, labels, mask = _pref_inputs(8, 40, 600, np.float32, seed=2)
    losses, cr, rr, _ = run_clean(rl.preference_loss, pol, labels, mask, pol, 0.1, "sigmoid")
    assert not cr.any() and not rr.any()
    close(losses[0], np.full(4, math.log(2.0)))


def test_dpo_fully_masked_sequence_has_zero_logp(rl):
    """A sequence with no response token sums to exactly 0 (and SimPO divides by max(count, 1))."""
    pol, ref, labels, mask = _pref_inputs(4, 40, 520, np.float32, seed=4)
    mask[1] = 0.0
    out = run_clean(rl.preference_loss, pol, labels, mask, None, 0.1, "simpo", 0.3)
    assert out[3][0, 1] == 0.0 and out[1][0, 1] == 0.0
    want = ref_preference(pol, ref, labels, mask, "simpo", 0.1, 0.3)
    close(out[0][0], want[0])


def test_preference_loss_structure(rl):
    """S = 4, L = 48, V = 700: N = 192 tokens in NT = 2 tiles, NV = 2 chunks. Per logits tensor: labels, mask and NV
    logits chunk loads per tile (NT (2 + NV) = 8 DMAs), two matmuls per tile (sums and counts into [1, S] PSUM), one
    column-id iota plus one token -> sequence iota per tile. DPO runs it for the policy and the reference: 16 loads,
    8 matmuls, 6 iotas, plus 4 stores. Each logit is read once; SimPO reads no reference at all."""
    S, L, V = 4, 48, 700
    pol, ref, labels, mask = _pref_inputs(S, L, V, np.float32, seed=7)
    N = S * L
    NT, NV = _tiles(N, PMAX), _tiles(V, V_CHUNK)
    run_clean(rl.preference_loss, pol, labels, mask, ref, 0.1, "sigmoid")
    c = _ops(rl.preference_loss)
    assert c["dma_copy"] == 2 * NT * (2 + NV) + 4 == 20, c
    assert c["nc_matmul"] == 2 * 2 * NT and c["iota"] == 2 * (1 + NT), c
    prof = rl.preference_loss.last_profile
    assert prof.stat("memory.hbm_read_bytes") == 2 * (pol.nbytes + labels.nbytes + mask.nbytes)
    assert prof.stat("memory.hbm_write_bytes") == 4 * (3 * (S // 2) + S)
    run_clean(rl.preference_loss, pol, labels, mask, None, 0.1, "simpo")
    c = _ops(rl.preference_loss)
    assert c["nc_matmul"] == 2 * NT and c["dma_copy"] == NT * (2 + NV) + 4, c
    assert rl.preference_loss.last_profile.stat("memory.hbm_read_bytes") == pol.nbytes + labels.nbytes + mask.nbytes


# --------------------------------------------------------------------------------------------------
# GRPO / PPO clipped surrogate with a k3 KL penalty (new dialect)
# --------------------------------------------------------------------------------------------------

def ref_grpo(lp, old, ref, adv, mask, eps_low, eps_high, beta):
    lp, old, ref, m = _f64(lp), _f64(old), _f64(ref), _f64(mask)
    r = np.exp(lp - old)
    surr = np.minimum(r * adv, np.clip(r, 1 - eps_low, 1 + eps_high) * adv)
    x = ref - lp
    kl = np.exp(x) - x - 1
    tok = beta * kl - surr
    seq = (tok * m).sum(1) / np.maximum(m.sum(1), 1)
    cnt = max(m.sum(), 1)
    return tok, seq, np.array([seq.mean(), (tok * m).sum() / cnt, (kl * m).sum() / cnt])


def _grpo_inputs(B, L, dtype, seed):
    rng = np.random.default_rng(seed)
    lp = (-rng.random((B, L)) * 3).astype(dtype)
    old = (_f64(lp) + rng.standard_normal((B, L)) * 0.3).astype(dtype)
    ref = (_f64(lp) + rng.standard_normal((B, L)) * 0.2).astype(dtype)
    adv = rng.standard_normal((B, 1)).astype(np.float32)
    mask = (rng.random((B, L)) < 0.8).astype(dtype)
    mask[0] = 0  # a sequence without a completion token
    return lp, old, ref, adv, mask


@pytest.mark.parametrize("B,L,dtype", [
    (8, 300, np.float32),
    (130, 2100, BF16),      # two sequence tiles (128 + 2), two token chunks (2048 + 52)
    (128, 4096, np.float32),
    (3, 17, BF16),
])
def test_grpo_loss_matches_numpy(rln, B, L, dtype):
    args = _grpo_inputs(B, L, dtype, seed=B + L)
    eps_low, eps_high, beta = 0.2, 0.28, 0.04  # DAPO's asymmetric clip
    pt, seq, tot = run_clean(rln.grpo_loss, *args, eps_low, eps_high, beta)
    want_pt, want_seq, want_tot = ref_grpo(*args, eps_low, eps_high, beta)
    assert pt.shape == (B, L) and seq.shape == (B, 1) and tot.shape == (1, 3)
    # inputs are rounded to the dtype before the reference: the kernel computes in fp32 on those values
    close_to_max(pt, want_pt, np.float32)
    np.testing.assert_allclose(seq[:, 0], want_seq, rtol=1e-5, atol=1e-6)
    assert seq[0, 0] == 0.0
    np.testing.assert_allclose(tot[0], want_tot, rtol=1e-5, atol=1e-6)


def test_grpo_on_policy_tokens_lose_minus_advantage(rln):
    """logp = old_logp = ref_logp: ratio exactly 1 (exp(0)), the KL exactly 0, so every token loses exactly -A and
    the token-level loss is -(sum_b A_b n_b) / sum_b n_b."""
    B, L = 16, 257
    lp, _, _, adv, mask = _grpo_inputs(B, L, np.float32, seed=3)
    pt, seq, tot = run_clean(rln.grpo_loss, lp, lp, lp, adv, mask)
    np.testing.assert_array_equal(pt, np.broadcast_to(-adv, (B, L)))
    assert tot[0, 2] == 0.0
    n = mask.sum(1)
    close(tot[0, 1], -(adv[:, 0] * n).sum() / n.sum())


def test_grpo_clipping(rln):
    """ratio = e^1 > 1 + eps with A > 0 is clipped to (1 + eps_high) A; with A < 0 the unclipped ratio A (the
    smaller) is kept; ratio = e^-1 < 1 - eps with A < 0 is clipped to (1 - eps_low) A. beta = 0 drops the KL."""
    B, L = 4, 64
    lp = np.zeros((B, L), np.float32)
    old = np.array([[-1.0], [-1.0], [1.0], [1.0]], np.float32) * np.ones((1, L), np.float32)
    adv = np.array([[2.0], [-2.0], [-2.0], [2.0]], np.float32)
    mask = np.ones((B, L), np.float32)
    pt, _, _ = run_clean(rln.grpo_loss, lp, old, lp, adv, mask, 0.2, 0.3, 0.0)
    e = np.float32(math.e)
    want = np.array([-(1.3 * 2.0), 2.0 * e, -(0.8 * -2.0), -(2.0 / e)])
    close(pt[:, 0], want)
    assert (pt == pt[:, :1]).all()


def test_grpo_structure(rln):
    """B = 130 (NBT = 2 sequence tiles), L = 2100 (NLC = 2 chunks): per (tile, chunk) four loads and the per-token
    store, per tile the advantages and the per-sequence store, and the totals: 2 * 2 * 5 + 2 * 2 + 1 = 25 DMAs; one
    ones-vector matmul per sequence tile; two exps (ratio, KL) and one count activation per (tile, chunk). Every input
    byte is read once; the per-token losses (fp32), the sequence losses and three totals are written once."""
    B, L = 130, 2100
    args = _grpo_inputs(B, L, BF16, seed=1)
    run_clean(rln.grpo_loss, *args)
    NBT, NLC = _tiles(B, PMAX), _tiles(L, 2048)
    c = _ops(rln.grpo_loss)
    assert c["dma_copy"] == NBT * NLC * 5 + NBT * 2 + 1 == 25, c
    assert c["nc_matmul"] == NBT and c["activation"] == 3 * NBT * NLC, c
    prof = rln.grpo_loss.last_profile
    assert prof.stat("memory.hbm_read_bytes") == 4 * B * L * 2 + B * 4
    assert prof.stat("memory.hbm_write_bytes") == B * L * 4 + B * 4 + 3 * 4


@pytest.mark.parametrize("B,L,dtype", [(130, 300, np.float32), (64, 1000, BF16), (5, 33, np.float32)])
def test_grpo_nl_operators_matches_isa_kernel(rl, rln, B, L, dtype):
    """The Beta-1 ``nl``-operator GRPO (symmetric clip) against numpy and the new-dialect ISA kernel: the same
    per-token losses and sequence means; its loss is the ISA kernel's first total."""
    args = _grpo_inputs(B, L, dtype, seed=L)
    eps, beta = 0.2, 0.04
    pt, seq, loss = run_clean(rl.grpo_loss_nl, *args, eps, beta)
    want_pt, want_seq, want_tot = ref_grpo(*args, eps, eps, beta)
    close_to_max(pt, want_pt, np.float32)
    np.testing.assert_allclose(seq[:, 0], want_seq, rtol=1e-5, atol=1e-6)
    close(loss[0, 0], want_tot[0])
    pt2, seq2, tot2 = run_clean(rln.grpo_loss, *args, eps, eps, beta)
    close_to_max(pt, _f64(pt2), np.float32)
    close(seq, seq2)
    close(loss[0, 0], tot2[0, 0])
    # one ones matmul per sequence tile; four [rows, L] loads, the advantages, the per-token and sequence stores per
    # tile, and the loss
    NBT = _tiles(B, PMAX)
    c = _ops(rl.grpo_loss_nl)
    assert c["nc_matmul"] == NBT and c["dma_copy"] == NBT * 7 + 1, c



# --------------------------------------------------------------------------------------------------
# PPO generalised advantage estimation (Beta 1)
# --------------------------------------------------------------------------------------------------

def ref_gae(r, v, gamma, lam):
    r, v = _f64(r), _f64(v)
    B, L = r.shape
    adv = np.zeros((B, L))
    last = np.zeros(B)
    for t in reversed(range(L)):
        v_next = v[:, t + 1] if t + 1 < L else 0.0
        last = r[:, t] + gamma * v_next - v[:, t] + gamma * lam * last
        adv[:, t] = last
    return adv, adv + v


@pytest.mark.parametrize("B,L,dtype", [(130, 200, np.float32), (64, 96, BF16), (3, 1, np.float32)])
def test_ppo_gae_matches_numpy(rl, B, L, dtype):
    r = _randn((B, L), dtype, seed=L)
    v = _randn((B, L), dtype, seed=L + 1)
    adv, ret = run_clean(rl.ppo_gae, r, v, 0.99, 0.95)
    want_adv, want_ret = ref_gae(r, v, 0.99, 0.95)
    # inputs rounded to the dtype before the reference; a fp32 recursion of up to L terms
    close_to_max(adv, want_adv, np.float32)
    close_to_max(ret, want_ret, np.float32)


def test_ppo_gae_structure_and_reversed_dma_cost(rl):
    """Per sequence tile: three time-reversed loads, two reversed stores and one scan. Reversed columns are not
    contiguous: every element is its own 4-byte DMA buffer, and each costs the descriptor minimum (neuroncore.md 3.3:
    t_e = sum over an engine's buffers of max(bytes / bw, dma.desc_min_ns); < 256 B per partition is "severely
    overhead-bound"), so the kernel is DMA-bound: the DMA engines' busy time is most of the total, far above the HBM
    time its 4 B L (4 + 2) bytes per sequence would need at full bandwidth."""
    B, L = 128, 200
    r = _randn((B, L), np.float32, seed=1)
    v = _randn((B, L), np.float32, seed=2)
    run_clean(rl.ppo_gae, r, v)
    c = _ops(rl.ppo_gae)
    assert c["dma_copy"] == 5 and c["tensor_tensor_scan"] == 1, c
    prof = rl.ppo_gae.last_profile
    # values read twice (the shifted copy misses its first column: L - 1 columns)
    assert prof.stat("memory.hbm_read_bytes") == r.nbytes + v.nbytes + B * (L - 1) * 4
    assert prof.stat("memory.hbm_write_bytes") == 2 * B * L * 4
    dma, hbm, total = prof.stat("bound.dma.time"), prof.stat("bound.hbm.time"), prof.total_time_ns
    assert dma > 0.8 * total and dma > 20 * hbm, (dma, hbm, total)
