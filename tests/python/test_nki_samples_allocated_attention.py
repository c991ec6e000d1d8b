"""The nki-samples manually allocated fused self-attention for small head sizes
(``allocated_fused_self_attn_for_SD_small_head_size``, tests/python/kernels/nki_samples_allocated_attention.py,
sample code as the sample writes it) run through ``nsim.compat``: its output against numpy (one batch per SPMD
program, causal and not, bf16 matmuls with float32 accumulation or float32 throughout, bf16 I/O), its placement
taken as written, and the instruction counts its loops imply."""
import numpy as np
import pytest

from conftest import executed_ops, require_core, sample_fixture  # noqa: E402

_core, ml_dtypes = require_core()
from numeric_helpers import close, rounded  # noqa: E402

BF16 = ml_dtypes.bfloat16


aa = sample_fixture("nki_samples_allocated_attention.py")


def reference(q, k, v, causal, mixed_precision):
    """out[b] = (softmax(0.125 q[b]^T k[b]) v[b])^T (q, k: (bs, d, s); v: (bs, s, d)), float64. Mixed precision
    rounds where the kernel stores bfloat16: Q, K and V as loaded, the exponentials fed to the PE (the row sums
    and the maximum stay float32)."""
    r = (lambda x: rounded(x, BF16)) if mixed_precision else (lambda x: np.asarray(x, np.float64))
    out = []
    for b in range(q.shape[0]):
        s = (r(q[b]) * 0.125).T @ r(k[b])
        if causal:
            s = np.where(np.tril(np.ones(s.shape, bool)), s, -9984.0)
        e = np.exp(s - s.max(axis=1, keepdims=True))
        out.append(((r(e) @ r(v[b])) / e.sum(axis=1, keepdims=True)).T)
    return np.stack(out)


@pytest.mark.parametrize("bs,d_head,seqlen,causal,mixed,io_dtype", [
    (2, 64, 512, False, True, np.float32),    # two programs (batch_id = program_id(0)), 4 x 4 tiles
    (1, 64, 512, True, True, np.float32),     # causal: affine_select on the PSUM scores
    (1, 128, 256, True, False, np.float32),   # float32 throughout, the largest head size
    (1, 32, 384, False, False, np.float32),   # a small head: the d_head-partition tiles
    (2, 64, 256, True, True, BF16),           # bf16 in and out
])
def test_allocated_sd_attention_matches_numpy(aa, capfd, bs, d_head, seqlen, causal, mixed, io_dtype):
    """Every tile sits where the sample's running address ``sca`` (and the per-q-tile ``loop_sca``) puts it;
    the addresses do not overlap, so nsim places nothing elsewhere."""
    mod = aa[0]
    rng = np.random.default_rng(bs * 1000 + d_head + seqlen)
    q, k = (rng.standard_normal((bs, d_head, seqlen)).astype(io_dtype) for _ in range(2))
    v = rng.standard_normal((bs, seqlen, d_head)).astype(io_dtype)
    out = mod.allocated_fused_self_attn_for_SD_small_head_size[bs](q, k, v, use_causal_mask=causal,
                                                                   mixed_precision=mixed)
    assert out.shape == (bs, d_head, seqlen) and out.dtype == np.dtype(io_dtype)
    want = reference(q, k, v, causal, mixed)
    if io_dtype == BF16:
        want = rounded(want, BF16)
    close(np.asarray(out, np.float32), want, BF16 if mixed or io_dtype == BF16 else np.float32)
    assert "placed by address=" not in capfd.readouterr().err


def test_allocated_sd_attention_instruction_counts(aa):
    """Seq 512, two programs. Per program: 4 Q tiles x 4 K tiles; each pair one QK^T matmul (into the two
    rotating PSUM banks of ``qk_psum``) and one AV matmul (accumulated in ``attn_res_psum``): 32 matmuls; per
    Q tile 4 PE transposes of the softmax and 1 of the divisor: 20 transposes; the preloads of V, Q and K (4
    tiles each) and 4 stores: 16 DMAs. Nothing depends on the mask, so causal issues the same."""
    mod = aa[0]
    kern = mod.allocated_fused_self_attn_for_SD_small_head_size
    rng = np.random.default_rng(9)
    q, k = (rng.standard_normal((2, 64, 512)).astype(np.float32) for _ in range(2))
    v = rng.standard_normal((2, 512, 64)).astype(np.float32)
    for causal in (False, True):
        kern[2](q, k, v, use_causal_mask=causal)
        ops = [o["op"] for o in executed_ops(kern.last_json["body"])]
        assert (ops.count("nc_matmul"), ops.count("nc_transpose"), ops.count("dma_copy")) == (2 * 32, 2 * 20, 2 * 16)
        assert ops.count("affine_select") == (2 * 16 if causal else 0)
        assert kern.last_profile.stat("engine.matmul_instruction_count") == 2 * 32


def test_allocated_sd_attention_kept_loop_times_as_unrolled(aa):
    """The sample places its named tiles by hand; the temporaries of its expressions (the PSUM tiles of the PE
    transposes, the scaled Q tiles) are nsim's to place. In the kept q-tile loop those PSUM transposes' tiles took
    the manual ``qk_psum`` banks (their lifetimes in one iteration do not meet), so each q tile's first QK^T matmul
    waited for the previous q tile's last transpose: 52,672.9 ns kept against 32,508.3 ns unrolled (causal, seq
    512, two programs). Automatic tiles now keep clear of manual tiles' bytes while capacity allows, as they do of
    each other's (docs/timing-model.md "Memory allocation"): 37,573.9 ns either way (the unrolled trace's one
    ScalarE copy fewer per q tile is the engine placement's choice)."""
    mod = aa[0]
    rng = np.random.default_rng(9)
    q, k = (rng.standard_normal((2, 64, 512)).astype(np.float32) for _ in range(2))
    v = rng.standard_normal((2, 512, 64)).astype(np.float32)
    t = {}
    for loops in ("keep", "unroll"):
        kern = mod.allocated_fused_self_attn_for_SD_small_head_size.options(loops=loops, timing_only=True)
        _out, prof = kern[2].simulate(q, k, v, use_causal_mask=True)
        t[loops] = prof.total_time_ns
    assert t["keep"] < 1.02 * t["unroll"], t
    assert t["keep"] < 45000, t  # the kept loop's tiles no longer chain the q tiles
