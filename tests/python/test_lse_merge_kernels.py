"""Partial-softmax merges and split-KV attention written like public NKI kernels (vLLM / NxD-Inference
flash-decoding and context-parallel ports, ring-attention ports, nki-library attention): tests/python/kernels/
lse_merge_kernels.py (Beta-1 dialect) and lse_merge_kernels_new.py (new dialect), both unmodified through
``nsim.compat``:

- flash-decoding with split KV: one query token per sequence, GQA heads on the partitions, each split's
  (o_partial, lse_partial) written to HBM by one kernel (new dialect) and merged by a second (Beta 1,
  o = sum_p exp(lse_p - lse_max) o_p / sum_p exp(lse_p - lse_max)); and as one LNC=2 kernel (each core half the
  splits, combined through an HBM scratch + ``nisa.core_barrier`` or by ``nisa.sendrecv``);
- the ring-attention step merge of a query block's running statistics with each arriving KV chunk, causal and
  not, returning out and lse: running (acc, m, l) form (Beta 1) and ring-flash-attn's sigmoid / logsigmoid
  (out, lse) form (new dialect);
- log-softmax and logsumexp over a large vocabulary in vocab tiles: one-pass running max / rescaled running sum
  (``activation`` with ``bias=-max`` and ``reduce_res=``) and the two-pass version (max pass, then the sum
  accumulated across tiles in ScalarE's registers), logp written in bf16 (new dialect), and the one-pass version
  with masks on ragged row and vocabulary tiles and a 1-D lse output (Beta 1);
- the forward of a training flash attention that stores the per-row lse (fp32) for the backward.

Checked: every output (o and lse alike) against float64 numpy (fp32 ~1e-5, bf16 ~1e-2), no sanitizer report
(``run_clean``), the instruction / DMA counts and HBM bytes the tiling implies (skipped causal chunks read nothing),
and two timing stories from the cost model: split-KV on two cores beats one core over the whole cache, and the
one-pass vocabulary statistics beat the two-pass ones (one HBM read of the logits fewer).

The nsim fixes this family needed (their regression tests fail without them):
- a masked Beta-1 ``nl.store`` into a 1-D HBM tensor through a partition index expression,
  ``nl.store(lse[r0 + i_p], value=row_lse, mask=(r0 + i_p < N))`` with i_p = ``nl.arange(128)[:, None]`` (the
  per-row logsumexp of a ragged last row tile, as cross-entropy kernels store it), was NSIM-E304 "dst has 72
  elements, src has 128": the mask was applied to the 1-D view (72 rows) but not to the [128, 1] value, although
  ``nl.load`` of the same subscript cuts both (python/nsim/nki/beta1/language.py ``store``: the mask box is taken
  over the subscript's index space, (128, 1), and cuts the value as well);
  ``test_masked_store_of_row_lse_into_1d_hbm`` and ``test_vocab_log_softmax[*-beta1]``.
"""
import collections
import math

import numpy as np
import pytest

from conftest import executed_ops, require_core, sample_fixture, run_clean, op_counts  # noqa: E402

_core, ml_dtypes = require_core()
from numeric_helpers import close, f64, randn  # noqa: E402

BF16 = ml_dtypes.bfloat16


def _close(got, want, tol):
    """|got - want| <= tol (1 + |want|) elementwise (fp32 outputs tol ~1e-5, bf16 ~1e-2)."""
    np.testing.assert_allclose(f64(got), f64(want), rtol=tol, atol=tol)
    return True

lm = sample_fixture("lse_merge_kernels.py")
lmn = sample_fixture("lse_merge_kernels_new.py", module_only=True)


def _core_ops(kernel):
    """Per core instruction counts of the last (LNC=2) run."""
    j = kernel.last_json
    bodies = [p["body"] for p in j["core_programs"]] if "core_programs" in j else [j["body"]]
    return [collections.Counter(o["op"] for o in executed_ops(b)) for b in bodies]


# --------------------------------------------------------------------------------------------------
# float64 references
# --------------------------------------------------------------------------------------------------

def _attn_ref(q, k, v, mask=None):
    """q [M, d], k [N, d], v [N, d] (float64): softmax(q k^T / sqrt(d)) v and the row lse."""
    s = q @ k.T / math.sqrt(q.shape[1])
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    mx = s.max(1, keepdims=True)
    e = np.exp(s - mx)
    return e @ v / e.sum(1, keepdims=True), (mx + np.log(e.sum(1, keepdims=True)))[:, 0]


def _decode_ref(q, k_cache, v_cache, splits=1):
    """Per split: o [B, Hq, P, d], lse [B, Hq, P]; k_cache in the transposed layout [B, Hkv, d, S]."""
    q, k, v = f64(q), f64(k_cache), f64(v_cache)
    B, Hq, d = q.shape
    Hkv, S = k.shape[1], k.shape[3]
    G, L = Hq // Hkv, S // splits
    o = np.zeros((B, Hq, splits, d))
    lse = np.zeros((B, Hq, splits))
    for b in range(B):
        for h in range(Hq):
            for p in range(splits):
                sl = slice(p * L, (p + 1) * L)
                oo, ll = _attn_ref(q[b, h][None], k[b, h // G][:, sl].T, v[b, h // G][sl])
                o[b, h, p], lse[b, h, p] = oo[0], ll[0]
    return o, lse


def _decode_inputs(B, Hkv, G, d, S, dtype, seed):
    return (randn((B, Hkv * G, d), dtype, seed), randn((B, Hkv, d, S), dtype, seed + 1),
            randn((B, Hkv, S, d), dtype, seed + 2))


# --------------------------------------------------------------------------------------------------
# Flash-decoding with split KV: two kernels
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype,tol", [(np.float32, 2e-5), (BF16, 2e-2)])
def test_flash_decode_splits_then_combine(lm, lmn, dtype, tol):
    mod = lm[0]
    B, Hkv, G, d, S, P = 3, 2, 8, 64, 2048, 4     # R = B * Hq = 48 rows: one ragged row tile in the combine
    q, k, v = _decode_inputs(B, Hkv, G, d, S, dtype, 10)
    o_part, lse_part = run_clean(lmn.flash_decode_splits, q, k, v, P)
    ro, rl = _decode_ref(q, k, v, P)
    # every split's partial, its lse included
    assert _close(o_part, ro, tol) and _close(lse_part, rl, tol)
    # k and v read once, q once per kv head group: 512-key blocks, scores matmul + 4 PV matmuls per block
    L = S // P
    nblk = B * Hkv * P * (L // 512)
    ops = op_counts(lmn.flash_decode_splits)
    assert ops["nc_matmul"] == nblk * 5
    assert ops["nc_transpose"] == B * Hkv + nblk * 4
    isz = np.dtype(dtype).itemsize
    assert lmn.flash_decode_splits.last_profile.stat("memory.hbm_read_bytes") == (q.size + k.size + v.size) * isz

    o, lse = run_clean(mod.lse_combine, o_part, lse_part)
    ro1, rl1 = _decode_ref(q, k, v, 1)
    assert _close(o, ro1[:, :, 0], tol) and _close(lse, rl1[:, :, 0], tol)
    # the combine against numpy applied to the kernel's own partials: fp32-exact
    w = np.exp(f64(lse_part) - f64(lse_part).max(-1, keepdims=True))
    assert _close(o, (w[..., None] * f64(o_part)).sum(2) / w.sum(-1)[..., None], 1e-5)
    assert _close(lse, f64(lse_part).max(-1) + np.log(w.sum(-1)), 1e-5)
    # one row tile: one load of the lse rows and one per split of o
    assert op_counts(mod.lse_combine)["dma_copy"] == 1 + P + 2


def test_combine_many_row_tiles_and_extreme_lse(lm):
    """Rows over three partition tiles (the last ragged) and lse values far apart (a split with lse -80 below the
    max contributes nothing; one at +60 dominates): no overflow, exact max subtraction."""
    mod = lm[0]
    B, H, P, d = 5, 60, 6, 32
    rng = np.random.default_rng(3)
    o_part = rng.standard_normal((B, H, P, d)).astype(np.float32)
    lse_part = (rng.standard_normal((B, H, P)) * 3).astype(np.float32)
    lse_part[:, :, 0] -= 80.0
    lse_part[0, :, 1] += 60.0
    o, lse = run_clean(mod.lse_combine, o_part, lse_part)
    l64 = f64(lse_part)
    w = np.exp(l64 - l64.max(-1, keepdims=True))
    assert _close(o, (w[..., None] * f64(o_part)).sum(2) / w.sum(-1)[..., None], 1e-5)
    assert _close(lse, l64.max(-1) + np.log(w.sum(-1)), 1e-6)
    assert op_counts(mod.lse_combine)["dma_copy"] == 3 * (1 + P + 2)


# --------------------------------------------------------------------------------------------------
# Flash-decoding with split KV on LNC=2
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("combine", ["barrier", "sendrecv"])
def test_flash_decode_lnc2(lmn, combine):
    B, Hkv, G, d, S, P = 2, 2, 4, 64, 2048, 4
    q, k, v = _decode_inputs(B, Hkv, G, d, S, np.float32, 20)
    kern = lmn.flash_decode_lnc2
    o, lse = run_clean(kern[2], q, k, v, P, combine)
    ro, rl = _decode_ref(q, k, v, 1)
    assert _close(o, ro[:, :, 0], 2e-5) and _close(lse, rl[:, :, 0], 2e-5)
    t2 = kern.last_profile.total_time_ns
    per_core = _core_ops(kern)
    assert len(per_core) == 2
    nblk = B * Hkv * (P // 2) * (S // P // 512)       # 512-key blocks of each core
    for ops in per_core:
        assert ops["nc_matmul"] == nblk * 5
        # one rendezvous per core; the (b, kv head) groups finished half by each core
        assert (ops["core_barrier"], ops["sendrecv"]) == ((1, 0) if combine == "barrier" else (0, 1))
        assert ops["reciprocal"] == nblk // (S // P // 512) + B * Hkv // 2
    # each core reads its half of the KV cache (+ q, + the scratch read back with the barrier)
    kv = (k.nbytes + v.nbytes) // 2
    extra = B * Hkv * G * P * (d + 1) * 4 // 2 if combine == "barrier" else 0
    for c in (0, 1):
        assert kern.last_profile.stat("core{}.memory.hbm_read_bytes".format(c)) == kv + q.nbytes + extra

    assert kern.last_profile.stat("lnc.imbalance_percent") < 5      # the same work on both cores

    o1, lse1 = run_clean(kern, q, k, v, P, combine)       # one core: every split, combined locally
    assert _close(o1, ro[:, :, 0], 2e-5) and _close(lse1, rl[:, :, 0], 2e-5)
    t1 = kern.last_profile.total_time_ns
    o0, lse0 = run_clean(kern, q, k, v, 1, combine)       # one core, one split: plain flash decode over the cache
    assert _close(o0, ro[:, :, 0], 2e-5) and _close(lse0, rl[:, :, 0], 2e-5)
    t0 = kern.last_profile.total_time_ns
    # Cost model: each core streams half of the KV cache (its own DMA engines; the stack bandwidth is 2x one
    # core's) and runs half of the score / PV matmuls, transposes and exp activations (at G = 4 rows these are
    # fixed-cost instructions: ScalarE / TensorE issue overheads, the bound here). The split costs a per-split
    # finalisation (reciprocal, log) and the exchange of G x (d + 1) floats per split and group plus one
    # rendezvous, small next to the half of the blocks saved. So two cores beat one core over the whole cache,
    # with or without the splits. (barrier: 44.5 / 45.0 / 51.0 us for t2 / t0 / t1, the same as without the
    # sanitizer. Until 2026-12-06 the sanitizer's own trace was simulated, its affine_range check having unrolled
    # loops to check them: 43.9 / 45.0 / 63.6 us; until 2026-12-05, when a write-after-read began to wait for the
    # reader's last read, 36.9 / 52.0 / 65.0 us.)
    assert t2 < t0 < t1, (t2, t0, t1)


# --------------------------------------------------------------------------------------------------
# Ring attention: merge of arriving KV chunks
# --------------------------------------------------------------------------------------------------

def _ring_ref(qT, kT_chunks, v_chunks, q_block, causal):
    H, d, Sq = qT.shape
    C, _, _, Sk = kT_chunks.shape
    K = np.concatenate(list(f64(kT_chunks)), axis=-1)      # [H, d, C Sk]
    V = np.concatenate(list(f64(v_chunks)), axis=1)        # [H, C Sk, d]
    o = np.zeros((H, Sq, d))
    lse = np.zeros((H, Sq))
    mask = None
    if causal:
        mask = np.arange(C * Sk)[None, :] <= q_block * Sq + np.arange(Sq)[:, None]
    for h in range(H):
        o[h], lse[h] = _attn_ref(f64(qT[h]).T, K[h].T, V[h], mask)
    return o, lse


@pytest.mark.parametrize("q_block,causal", [(0, False), (3, False), (0, True), (3, True), (5, True)])
def test_ring_attention_merge_both_dialects(lm, lmn, q_block, causal):
    H, d, Sk, C = 2, 64, 256, 4
    qT = randn((H, d, 128), np.float32, 30)
    kT = randn((C, H, d, Sk), np.float32, 31)
    v = randn((C, H, Sk, d), np.float32, 32)
    ro, rl = _ring_ref(qT, kT, v, q_block, causal)
    used = C if not causal else min(C, (q_block * 128 + 127) // Sk + 1)   # chunks not entirely in the future
    for kern in (lm[0].ring_attention_merge_b1, lmn.ring_attention_merge):
        o, lse = run_clean(kern, qT, kT, v, q_block, causal)
        assert _close(o, ro, 2e-5) and _close(lse, rl, 2e-5)
        ops = op_counts(kern)
        # per head and used chunk: one score matmul and Sk / 128 PV matmuls
        assert ops["nc_matmul"] == H * used * (1 + Sk // 128)
        # a masked diagonal chunk only where the chunk reaches past the block's first row
        diag = int(causal and (used - 1) * Sk + Sk - 1 > q_block * 128)
        assert ops["affine_select"] == H * diag
        # skipped chunks read nothing: q, and k and v of the used chunks
        assert kern.last_profile.stat("memory.hbm_read_bytes") == 4 * (qT.size + H * used * 2 * Sk * d)


# --------------------------------------------------------------------------------------------------
# Log-softmax over a large vocabulary
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("variant", ["new-one_pass", "new-two_pass", "beta1"])
@pytest.mark.parametrize("dtype,N", [(np.float32, 160), (BF16, 64)])
def test_vocab_log_softmax(lm, lmn, variant, dtype, N):
    V = 32000                                  # 15 tiles of 2048 and a ragged one of 1280
    x = randn((N, V), dtype, 40, scale=4.0)
    two_pass = variant == "new-two_pass"
    if variant == "beta1":
        kern = lm[0].vocab_log_softmax_b1
        logp, lse = run_clean(kern, x)
    else:
        kern = lmn.vocab_log_softmax
        logp, lse = run_clean(kern, x, two_pass)
    x64 = f64(x)
    mx = x64.max(1, keepdims=True)
    rl = mx[:, 0] + np.log(np.exp(x64 - mx).sum(1))
    assert logp.dtype == BF16 and lse.dtype == np.float32
    assert _close(lse, rl, 1e-5)
    assert _close(logp, x64 - rl[:, None], 1e-2)
    NV = (V + 2047) // 2048
    NR = (N + 127) // 128
    ops = op_counts(kern)
    # logits read twice (stats, then the write pass) or three times (max, sum, write)
    reads = 3 if two_pass else 2
    assert kern.last_profile.stat("memory.hbm_read_bytes") == reads * x.nbytes
    assert ops["dma_copy"] == NR * ((reads + 1) * NV + 1)
    if variant != "beta1":
        # exp per tile (+ the rescale factor per tile in one pass), log and the write-pass copy
        assert ops["activation"] == NR * (NV * (1 if two_pass else 2) + 1 + NV)


def test_masked_store_of_row_lse_into_1d_hbm(lm):
    """Regression: ``nl.store(lse[r0 + i_p], value=[128, 1] tile, mask=r0 + i_p < N)`` on a 1-D HBM tensor
    (ragged last row tile) was NSIM-E304: the mask cut the 1-D view but not the value."""
    _, nki, nl, nisa = lm

    @nki.jit
    def row_lse(x):
        N, V = x.shape
        lse = nl.ndarray((N,), dtype=nl.float32, buffer=nl.shared_hbm)
        i_p = nl.arange(128)[:, None]
        i_v = nl.arange(V)[None, :]
        for t in nl.affine_range((N + 127) // 128):
            msk = t * 128 + i_p < N
            xt = nl.load(x[t * 128 + i_p, i_v], mask=msk)
            m = nl.max(xt, axis=1, keepdims=True, mask=msk)
            s = nl.sum(nl.exp(xt - m, mask=msk), axis=1, keepdims=True, mask=msk)
            nl.store(lse[t * 128 + i_p], value=nl.log(s, mask=msk) + m, mask=msk)
        return lse

    x = randn((200, 300), np.float32, 7)
    lse = run_clean(row_lse, x)
    x64 = f64(x)
    mx = x64.max(1)
    _close(lse, mx + np.log(np.exp(x64 - mx[:, None]).sum(1)), 1e-5)
    # the ragged tile stores its 72 rows only
    stores = [o for o in executed_ops(row_lse.last_json["body"]) if o["op"] == "dma_copy"]
    assert len(stores) == 4


def test_vocab_log_softmax_timing_128k(lmn):
    """V = 128256 (Llama 3), N = 128, timing only. Cost model: the kernel is DMA-bound (per 2048-wide tile the
    DMA of 128 x 8 KiB at the core's ~365 GB/s DMA ceiling outweighs the ScalarE / VectorE passes over it). Both
    versions write logp once (2 B per element, bf16) and read the fp32 logits once for it; the one-pass
    statistics read them once more, the two-pass ones twice (a max pass and a sum pass): 10 versus 14 bytes moved
    per element, so the one-pass kernel takes about 10 / 14 = 0.71 of the two-pass time; a little more because its
    stats pass has the heavier per-tile compute (exp, rescale) to overlap with the DMA."""
    x = randn((128, 128256), np.float32, 50)
    kern = lmn.vocab_log_softmax.options(timing_only=True)
    kern(x, False)
    t1 = kern.last_profile.total_time_ns
    assert kern.last_profile.bound == "dma"
    kern(x, True)
    t2 = kern.last_profile.total_time_ns
    assert kern.last_profile.bound == "dma"
    assert 0.65 * t2 < t1 < 0.9 * t2, (t1, t2)
    # the DMA rate both reach is near the one-core ceiling: bytes moved / time
    for t, per_elem in ((t1, 10), (t2, 14)):
        assert 250 < x.size * per_elem / t < 400, x.size * per_elem / t


# --------------------------------------------------------------------------------------------------
# Training flash attention forward returning lse
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("dtype,tol", [(np.float32, 2e-5), (BF16, 2e-2)])
def test_flash_fwd_lse(lm, causal, dtype, tol):
    mod = lm[0]
    H, d, S = 2, 64, 384
    q, k, v = randn((H, d, S), dtype, 60), randn((H, d, S), dtype, 61), randn((H, S, d), dtype, 62)
    o, lse = run_clean(mod.flash_fwd_lse, q, k, v, causal)
    assert o.dtype == np.dtype(dtype) and lse.dtype == np.float32 and lse.shape == (H, S)
    mask = np.tril(np.ones((S, S), bool)) if causal else None
    for h in range(H):
        ro, rl = _attn_ref(f64(q[h]).T, f64(k[h]).T, f64(v[h]), mask)
        assert _close(o[h], ro, tol)
        assert _close(lse[h], rl, tol)
    NT = S // 128
    blocks = H * (NT * (NT + 1) // 2 if causal else NT * NT)
    ops = op_counts(mod.flash_fwd_lse)
    assert ops["nc_matmul"] == 2 * blocks
    assert ops["affine_select"] == (H * NT if causal else 0)


def test_flash_decode_one_split_kept_loops_time_as_unrolled(lmn):
    """One core, one split (plain flash decode over a 2048-key cache, B = 2, 2 KV heads of 4 query heads): the
    (batch, KV head) loop is written out by Python, the 512-key block loop inside each group kept. Each group's PSUM
    tiles were placed where their bytes were used longest ago by statement positions, and a one-buffer tile of the
    previous group's block loop looked older than it is (its positions lie mid-body; it is used until the loop's last
    iteration): the next group's score tiles took its banks and waited for that loop's end, 45,028.0 ns kept against
    38,909.9 ns unrolled. Reuse distances now count a loop's tiles as used until the loop ends (docs/timing-model.md
    "Memory allocation"): 38,288.3 ns kept."""
    q, k, v = _decode_inputs(2, 2, 4, 64, 2048, np.float32, 20)
    t = {}
    for loops in ("keep", "unroll"):
        kern = lmn.flash_decode_lnc2.options(loops=loops, timing_only=True)
        t[loops] = kern.simulate(q, k, v, 1, "barrier")[1].total_time_ns
    assert t["keep"] < 1.05 * t["unroll"], t
