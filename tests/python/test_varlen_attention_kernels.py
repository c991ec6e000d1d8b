"""Packed-sequence (varlen) attention and mask variants written like public NKI kernels
(tests/python/kernels/varlen_attention_kernels.py, Beta-1 dialect, and varlen_attention_kernels_new.py, new
dialect; both unmodified, through ``nsim.compat``):

- document-masked flash attention over a packed batch with static boundaries (Beta 1): a host ``cu_seqlens``
  list; key blocks holding none of a query block's documents skipped; the per-row document start built on chip
  (``iota`` of the rows against each boundary inside the block) compared with the key positions (``iota``), the
  causal half by ``affine_select`` on the diagonal;
  a total token count that is not a multiple of 128 (masked loads into zeroed tiles, masked store);
- the same packed batch with runtime segment ids (new dialect): a [S] int32 tensor, the rows' ids DMA'd as a
  [128, 1] column and the keys' ids as a row broadcast to the partitions (``.ap`` with partition step 0), compared
  by ``tensor_scalar(op0=nl.equal)`` into an additive bias; every key block up to the diagonal computed; and in
  Beta 1 (the rows' ids by an index expression on the 1-D tensor, the keys' row ``.broadcast_to`` the partitions,
  ``nl.equal`` + ``nl.where``);
- prefix-LM attention (new dialect): bidirectional over a prefix of P keys, causal after; the causal
  ``affine_select`` on the column slice past the prefix;
- a padded ragged batch [B, S] with runtime per-sequence lengths (Beta 1): keys past the length masked by
  ``nl.where`` of an iota compare, padded query rows written as zeros.

Checked: outputs against float64 numpy (fp32 1e-5; bf16 inputs with bf16 probabilities 2e-2), the static and the
runtime-mask variants agreeing on the same packed batch, no sanitizer report (every kernel run with warnings as
errors), the matmul / transpose / DMA counts and HBM bytes the block skipping implies, and that for short
documents the block-skipping variant is clearly (< 0.6x) faster in nsim's timing than the runtime-mask variants
(both dialects), while with a single document (nothing to skip) the two take about the same time.

No nsim fix was needed by this family: every kernel ran unmodified on the first try.
"""
import math

import numpy as np
import pytest

from conftest import require_core, sample_fixture  # noqa: E402
from conftest import run_clean as _run  # noqa: E402
from conftest import op_counts as _ops  # noqa: E402

_core, ml_dtypes = require_core()
from numeric_helpers import close, f64 as _f64, randn as _randn  # noqa: E402

BF16 = ml_dtypes.bfloat16

vl = sample_fixture("varlen_attention_kernels.py", module_only=True)
vln = sample_fixture("varlen_attention_kernels_new.py", module_only=True)


def _check(out, want, dtype):
    assert out.dtype == np.dtype(dtype)
    if np.dtype(dtype) == np.float32:
        close(out, want)
    else:  # bf16 inputs and bf16 probabilities into the PV matmul
        np.testing.assert_allclose(_f64(out), want, rtol=2e-2, atol=2e-2)


def ref_masked(qT, kT, v, allowed):
    """softmax(q k^T / sqrt(d) + mask) v in float64; q, k given transposed [d, S]."""
    d = qT.shape[0]
    s = _f64(qT).T @ _f64(kT) / math.sqrt(d)
    s = np.where(allowed, s, -np.inf)
    s -= s.max(1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(1, keepdims=True)
    return p @ _f64(v)


def _segments(cu, S):
    return (np.searchsorted(cu, np.arange(S), side="right") - 1).astype(np.int32)


def _doc_causal(cu, S):
    seg = _segments(cu, S)
    i = np.arange(S)
    return (seg[:, None] == seg[None, :]) & (i[:, None] >= i[None, :])


def _packed(S, d, dtype, seed):
    return (_randn((d, S), dtype, seed=seed), _randn((d, S), dtype, seed=seed + 1),
            _randn((S, d), dtype, seed=seed + 2))


CU_CASES = [
    (512, 64, np.float32, [0, 50, 100, 230, 256, 300, 420, 512]),   # boundaries inside and on block edges
    (512, 128, BF16, [0, 384, 512]),                                 # a long document spanning 3 blocks
    (256, 64, np.float32, [0, 256]),                                 # one document: plain causal
    (1024, 64, BF16, [0, 1, 129, 200, 640, 641, 1000, 1024]),        # length-1 documents, 8 query blocks
]
RAGGED_CASES = [  # total tokens not a multiple of 128: the last block's loads / store masked
    (450, 64, np.float32, [0, 100, 300, 450]),
    (300, 128, BF16, [0, 7, 129, 299, 300]),
]


@pytest.mark.parametrize("S,d,dtype,cu", CU_CASES + RAGGED_CASES)
def test_packed_doc_flash_matches_numpy(vl, S, d, dtype, cu):
    q, k, v = _packed(S, d, dtype, seed=S + d)
    out = _run(vl.packed_doc_flash_fwd, q, k, v, cu)
    _check(out, ref_masked(q, k, v, _doc_causal(cu, S)), dtype)


@pytest.mark.parametrize("S,d,dtype,cu", CU_CASES)
def test_segment_id_flash_matches_numpy(vl, vln, S, d, dtype, cu):
    q, k, v = _packed(S, d, dtype, seed=S + d)
    want = ref_masked(q, k, v, _doc_causal(cu, S))
    _check(_run(vln.segment_id_flash_fwd, q, k, v, _segments(cu, S)), want, dtype)
    _check(_run(vl.segment_id_flash_b1, q, k, v, _segments(cu, S)), want, dtype)


def test_static_and_runtime_masks_agree(vl, vln):
    """The same packed fp32 batch through both variants: the same attention to fp32 rounding."""
    S, d = 512, 64
    cu = [0, 64, 200, 201, 390, 512]
    q, k, v = _packed(S, d, np.float32, seed=3)
    a = _run(vl.packed_doc_flash_fwd, q, k, v, cu)
    b = _run(vln.segment_id_flash_fwd, q, k, v, _segments(cu, S))
    c = _run(vl.segment_id_flash_b1, q, k, v, _segments(cu, S))
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(a, c)  # the same op sequence in the same dialect, only the mask source differs


def _kept_blocks(cu, S):
    """Key blocks the static variant computes: for each query block, from the block of its first document's
    start up to the diagonal."""
    n = 0
    for qi in range(S // 128):
        start = cu[int(_segments(cu, S)[qi * 128])]
        n += qi + 1 - start // 128
    return n


def test_block_skipping_structure_and_speed(vl, vln):
    """Short documents (64 tokens, 16 of them in S = 1024): the static variant computes only the diagonal key
    block of each query block (one QK and one PV matmul, one P transpose, a k and a v load per block), the
    runtime-mask variant all NT (NT + 1) / 2 blocks below the diagonal (each also loading its [128, 128] int32 id
    row broadcast); the static one reads only the kept blocks' k / v bytes from HBM and is clearly faster."""
    S, d = 1024, 64
    NT = S // 128
    cu = list(range(0, S + 1, 64))
    q, k, v = _packed(S, d, BF16, seed=7)
    seg = _segments(cu, S)
    want = ref_masked(q, k, v, _doc_causal(cu, S))
    _check(_run(vl.packed_doc_flash_fwd, q, k, v, cu), want, BF16)
    kept = _kept_blocks(cu, S)
    assert kept == NT
    c = _ops(vl.packed_doc_flash_fwd)
    assert c["nc_matmul"] == 2 * kept and c["nc_transpose"] == kept, c
    assert c["affine_select"] == NT, c
    assert c["dma_copy"] == NT * 2 + 2 * kept, c  # q load + out store per query block, k + v per kept block
    p_static = vl.packed_doc_flash_fwd.last_profile
    assert p_static.stat("memory.hbm_read_bytes") == S * d * 2 + 2 * kept * 128 * d * 2

    _check(_run(vln.segment_id_flash_fwd, q, k, v, seg), want, BF16)
    blocks = NT * (NT + 1) // 2
    c_rt = _ops(vln.segment_id_flash_fwd)
    assert c_rt["nc_matmul"] == 2 * blocks and c_rt["nc_transpose"] == blocks, c_rt
    assert c_rt["affine_select"] == NT, c_rt
    assert c_rt["dma_copy"] == NT * 3 + 3 * blocks, c_rt  # + the rows' id column / the keys' id row
    p_rt = vln.segment_id_flash_fwd.last_profile
    assert p_rt.stat("memory.hbm_read_bytes") == (S * d * 2 + S * 4 + 2 * blocks * 128 * d * 2
                                                  + blocks * 128 * 128 * 4)
    t_s, t_r = p_static.total_time_ns, p_rt.total_time_ns
    assert t_s < 0.6 * t_r, (t_s, t_r)

    # the same comparison within the Beta-1 dialect (the same flash step, only the mask source differs)
    _check(_run(vl.segment_id_flash_b1, q, k, v, seg), want, BF16)
    # the keys' id row broadcast to the partitions is a matmul with a ones row (spec: nl.broadcast_to P=1 -> n)
    assert _ops(vl.segment_id_flash_b1)["nc_matmul"] == 3 * blocks
    t_b1 = vl.segment_id_flash_b1.last_profile.total_time_ns
    assert t_s < 0.6 * t_b1, (t_s, t_b1)


def test_speedup_comes_from_skipping(vl):
    """With one document over the whole batch the static variant skips nothing and computes what the runtime-mask
    variant computes: their times are close (the short-document speedup is the skipped blocks, not the masks)."""
    S, d = 1024, 64
    q, k, v = _packed(S, d, BF16, seed=8)
    _run(vl.packed_doc_flash_fwd, q, k, v, [0, S])
    _run(vl.segment_id_flash_b1, q, k, v, np.zeros(S, np.int32))
    t_s = vl.packed_doc_flash_fwd.last_profile.total_time_ns
    t_r = vl.segment_id_flash_b1.last_profile.total_time_ns
    assert 0.7 * t_r < t_s <= t_r, (t_s, t_r)


def test_long_documents_skip_less(vl):
    """One document covering the whole batch skips nothing: the static variant computes all NT (NT + 1) / 2
    causal blocks and applies no document mask (no iota compare beyond the per-block row positions)."""
    S, d = 512, 64
    NT = S // 128
    q, k, v = _packed(S, d, np.float32, seed=9)
    _check(_run(vl.packed_doc_flash_fwd, q, k, v, [0, S]), ref_masked(q, k, v, _doc_causal([0, S], S)),
           np.float32)
    c = _ops(vl.packed_doc_flash_fwd)
    assert c["nc_matmul"] == NT * (NT + 1) and c["iota"] == NT, c


@pytest.mark.parametrize("H,d,S,P,dtype", [
    (2, 64, 512, 100, np.float32),    # prefix inside the first block
    (2, 64, 512, 300, np.float32),    # prefix ending inside the third block: blocks above the diagonal kept
    (1, 128, 256, 0, BF16),           # no prefix: plain causal
    (2, 64, 512, 512, BF16),          # all prefix: bidirectional
    (1, 64, 512, 256, BF16),          # prefix on a block edge
])
def test_prefix_lm_matches_numpy(vln, H, d, S, P, dtype):
    q = _randn((H, d, S), dtype, seed=P + 1)
    k = _randn((H, d, S), dtype, seed=P + 2)
    v = _randn((H, S, d), dtype, seed=P + 3)
    out = _run(vln.prefix_lm_flash_fwd, q, k, v, P)
    assert out.dtype == np.dtype(dtype)
    i = np.arange(S)
    allowed = (i[:, None] >= i[None, :]) | (i[None, :] < P)
    for h in range(H):
        _check(out[h], ref_masked(q[h], k[h], v[h], allowed), dtype)


def test_prefix_lm_block_counts(vln):
    """P = 300, NT = 4: query blocks 0, 1 see key blocks 0..2 (the prefix reaches block 2), blocks 2, 3 up to the
    diagonal: 3 + 3 + 3 + 4 = 13 key blocks per head; affine_select only where a block's keys past the prefix
    can lie past the diagonal."""
    H, d, S, P = 2, 64, 512, 300
    q = _randn((H, d, S), np.float32, seed=1)
    k = _randn((H, d, S), np.float32, seed=2)
    v = _randn((H, S, d), np.float32, seed=3)
    _run(vln.prefix_lm_flash_fwd, q, k, v, P)
    c = _ops(vln.prefix_lm_flash_fwd)
    assert c["nc_matmul"] == 2 * 13 * H and c["nc_transpose"] == 13 * H, c
    # (q0, k0) with keys past the prefix that can lie past the diagonal: (0, 256), (128, 256), (256, 256), (384, 384)
    assert c["affine_select"] == 4 * H, c


@pytest.mark.parametrize("B,d,S,lengths,dtype", [
    (3, 64, 512, [512, 300, 129], np.float32),
    (4, 128, 256, [1, 128, 200, 256], BF16),
    (2, 64, 256, [0, 77], np.float32),  # an empty sequence: every key masked, all its rows zero
])
def test_padded_batch_matches_numpy(vl, B, d, S, lengths, dtype):
    q = _randn((B, d, S), dtype, seed=B)
    k = _randn((B, d, S), dtype, seed=B + 1)
    v = _randn((B, S, d), dtype, seed=B + 2)
    lens = np.array(lengths, np.int32)
    out = _run(vl.padded_batch_attention, q, k, v, lens)
    assert out.dtype == np.dtype(dtype)
    for b, L in enumerate(lengths):
        allowed = np.broadcast_to(np.arange(S)[None, :] < max(L, 1), (S, S))
        want = ref_masked(q[b], k[b], v[b], allowed)
        want[L:] = 0.0
        _check(out[b], want, dtype)
        assert not np.any(_f64(out[b, L:])), b  # padded rows exactly zero
