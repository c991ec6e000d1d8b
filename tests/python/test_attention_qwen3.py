"""Naive vs flash attention at Qwen3-0.6B attention shapes (compiler.md §5, examples/attention/).

* numerics of ``attention_naive`` (scores and probabilities through HBM scratch tensors, key dim tiled by
  512) and ``flash_attention_gqa`` (online softmax over 512-key chunks) against numpy at small shapes:
  grouped-query heads, causal and not, S not a multiple of 512, the naive kernel past its old S <= 512 limit;
* timing only at the Qwen3-0.6B shapes (16 query heads, 8 kv heads, head dim 128, bf16, causal) on trn2:
  flash is faster than naive at every S and the gap grows with S (the AWS case study's ordering).
"""
import numpy as np
import pytest

from conftest import require_core

_core, ml_dtypes = require_core()

from nsim.kernels import attention as A  # noqa: E402

BF16 = np.dtype(ml_dtypes.bfloat16)
KERNELS = {"naive": A.attention_naive, "flash": A.flash_attention_gqa}


def _simulate(kernel, args, config, timing_only=False):
    """(return value, Profile); kernel.options() where the kernel API has it."""
    if hasattr(kernel, "options"):
        return kernel.options(config=config, timing_only=timing_only).simulate(*args)
    return kernel.simulate(*args, config=config, timing_only=timing_only)


def _check(out, ref):
    """bf16 tolerance: |out - ref| <= 1e-2 |ref| + 1e-2 max|ref|."""
    out = np.asarray(out)
    assert out.dtype == BF16 and out.shape == ref.shape
    out = out.astype(np.float32)
    assert np.all(np.isfinite(out))
    np.testing.assert_allclose(out, ref, rtol=1e-2, atol=1e-2 * float(np.max(np.abs(ref))))


@pytest.mark.parametrize("name", sorted(KERNELS))
@pytest.mark.parametrize("hq,hkv,s,causal,config", [
    (4, 2, 256, True, "trn2"),
    (4, 2, 256, True, "trn1"),
    (2, 1, 640, True, "trn2"),     # 512 + 128 keys: a ragged last key chunk
    (4, 2, 512, False, "trn2"),
    (2, 2, 1152, True, "trn2"),    # naive past the old S <= 512 limit, kv heads not shared
])
def test_gqa_numerics(name, hq, hkv, s, causal, config):
    args = A.gqa_attention_inputs(seed=hq * 1000 + s, s=s, hq=hq, hkv=hkv, d=128, causal=causal)
    out, _ = _simulate(KERNELS[name], args, config)
    _check(out, A.flash_attention_gqa_ref(*args))


def test_naive_single_head_long():
    """The 2-D (single-head) form of attention_naive at S = 640 > 512, causal, against numpy."""
    args = A.attention_naive_inputs(seed=21, s=640, d=128, causal=True)
    out, _ = _simulate(A.attention_naive, args, "trn2")
    _check(out, A.attention_naive_ref(*args))


def test_gqa_shares_kv_heads():
    """Query heads 2g and 2g + 1 attend with kv head g: swapping the kv heads swaps the head pairs."""
    q, k, v, causal = A.gqa_attention_inputs(seed=22, s=256, hq=4, hkv=2, d=64, causal=True)
    for kernel in KERNELS.values():
        a, _ = _simulate(kernel, (q, k, v, causal), "trn2")
        b, _ = _simulate(kernel, (q[[2, 3, 0, 1]], k[::-1].copy(), v[::-1].copy(), causal), "trn2")
        np.testing.assert_array_equal(np.asarray(a)[[2, 3, 0, 1]], np.asarray(b))


def test_naive_materialises_scores_in_hbm():
    args = A.gqa_attention_inputs(seed=23, s=1024, hq=2, hkv=1, d=128, causal=True)
    kj = A.attention_naive.to_json(*args)
    internal = {(tuple(t["shape"]), t["dtype"]) for t in kj["tensors"] if t["kind"] == "internal"}
    assert ((2, 1024, 1024), "float32") in internal and ((2, 1024, 1024), "bfloat16") in internal
    # the score pass is tiled by 512 keys: no [128, 1024] PSUM tile
    def allocs(body):
        for st in body:
            if "loop" in st:
                yield from allocs(st["loop"]["body"])
            elif "alloc" in st:
                yield st["alloc"]

    psum = [a["shape"] for a in allocs(kj["body"]) if a["buffer"] == "psum"]
    assert psum and all(int(np.prod(sh[1:])) * 4 <= 2048 for sh in psum), psum
    flash = A.flash_attention_gqa.to_json(*args)
    assert not any(t["kind"] == "internal" for t in flash["tensors"])


def test_flash_faster_than_naive_at_qwen3_shapes():
    """trn2, Qwen3-0.6B shapes, causal: flash faster than naive at S = 512, 2048 and 4096, and the speed-up
    grows with S; naive moves O(S^2) bytes through HBM, flash O(S)."""
    res = {}
    for s in (512, 2048, 4096):
        args = A.gqa_attention_inputs(seed=0, s=s)
        assert args[0].shape == (16, s, 128) and args[1].shape == (8, s, 128) and args[3] is True
        for name, kernel in KERNELS.items():
            _, prof = _simulate(kernel, args, "trn2", timing_only=True)
            hbm = prof.stat("memory.hbm_read_bytes") + prof.stat("memory.hbm_write_bytes")
            res[s, name] = (prof.total_time_ns, hbm)
    summary = "; ".join("S={} {} {:.1f} us".format(s, n, t / 1e3) for (s, n), (t, _) in sorted(res.items()))
    speedup = {}
    for s in (512, 2048, 4096):
        (t_naive, b_naive), (t_flash, b_flash) = res[s, "naive"], res[s, "flash"]
        assert b_naive > 8 * b_flash, summary
        assert t_flash < t_naive, "flash not faster than naive at S={}: {}".format(s, summary)
        speedup[s] = t_naive / t_flash
    assert speedup[512] < speedup[2048] < speedup[4096], "speed-up does not grow with S: {} ({})".format(
        {s: round(v, 2) for s, v in speedup.items()}, summary)


def test_naive_times_the_same_with_the_sanitizer_on():
    """simulate()'s default sanitizer does not change what is simulated: its affine_range check unrolls
    attention_naive's loops to check them write by write, and that trace used to be the one simulated (121.7 us
    without the sanitizer, 114.6 us with it, at this shape); the kernel is now traced again without it
    (tracer._unsanitized)."""
    args = A.gqa_attention_inputs(seed=5, s=1152, hq=2, hkv=2, d=128, causal=True)
    _, checked = _simulate(A.attention_naive, args, "trn2")
    _, plain = _simulate(A.attention_naive, args, "trn2", timing_only=True)
    assert checked.total_time_ns == plain.total_time_ns
