"""KV-cache update kernels with runtime positions, written the way vLLM's and NxDI's NKI code writes them
(tests/python/kernels/kv_cache_update_kernels.py, Beta-1 dialect, and kv_cache_update_kernels_new.py, new dialect;
both unmodified, through ``nsim.compat``): vLLM's ``reshape_and_cache`` into a paged cache (NHD and HND layouts,
slot -1 padding), NxDI's decode update at ``position_ids`` followed by attention over the updated cache in the same
kernel, the chunked-prefill write at a runtime start, and their new-dialect forms (``.ap(vector_offset=)`` with
``oob_mode=skip``, ``.ap(scalar_offset=)`` from SBUF and from a register, ``nl.ds`` with a runtime start).

Checked: the caches bit-exact against numpy (and updated in the caller's arrays: in-place argument writes),
every untouched slot unchanged, the DMA counts and the HBM bytes written (the new tokens' rows only, not the
cache), no sanitizer report (W504 / W506 with runtime indices in ``affine_range``), and out-of-range positions:
an error at the kernel's line, or skipped rows where the kernel asks for ``oob_mode=skip``.

Padding slots (-1), Beta 1: vLLM's CUDA kernel skips them; a Beta-1 indirect store cannot skip, so the kernel
clamps them to slot 0 of block 0, the null block vLLM v1 reserves (``BlockPool.null_block``) and never reads. The
new-dialect kernel skips them with ``oob_mode=skip``.

The nsim fixes these kernels needed (each test named below failed before):
- a scatter into the rows of a reshaped 4-D cache (``key_cache.reshape((num_blocks * block_size, H * d))``, then
  ``nl.store(cache_2d[slots[i_p, 0], i_f])``) was NSIM-E407 "operand 'dst' dim 1 of tensor 'key_cache__out'
  broadcasts, but a destination cannot": the verifier allowed the scatter's repeated static row only on dim 0 of
  the access, and the reshape puts it after size-1 dims (frontend/verify.cpp, ``check_access``; tests
  ``test_reshape_and_cache_*``, ``test_decode_*beta1*``, ``test_prefill_*``);
- ``.ap(scalar_offset=register)`` (a register's value is known while tracing: a static access) was not
  bounds-checked along ``indirect_dim``: a position ``== S_max`` silently wrote row 0 of the next head's cache and
  ``-1`` the previous head's last row; it is now err_tensor_access_out_of_bound at the instruction's line
  (``oob_mode=skip``: the transfer is skipped), as for an SBUF scalar offset (python/nsim/tracer.py,
  ``NkiTensor.ap``; python/nsim/nki/isa.py, ``dma_copy``; ``test_register_position_out_of_range_*``)."""
import inspect

import numpy as np
import pytest

from conftest import require_core, sample_fixture  # noqa: E402
from conftest import op_counts as _ops  # noqa: E402

_core, ml_dtypes = require_core()
from numeric_helpers import close  # noqa: E402
from numeric_helpers import randn as _randn, f64 as _f64  # noqa: E402

BF16 = ml_dtypes.bfloat16

kv = sample_fixture("kv_cache_update_kernels.py")
kvn = sample_fixture("kv_cache_update_kernels_new.py", module_only=True)


def _line(path_end, marker, mod):
    """``file:line`` of the first line of ``mod``'s source containing ``marker``."""
    src, _ = inspect.findsource(mod)
    return "{}:{}".format(path_end, next(i for i, ln in enumerate(src) if marker in ln) + 1)


def _slots(T, num_blocks, block_size, seed, pad=(), reserve_null=True):
    """T distinct slots (block 0, the null block, never used when ``reserve_null``), -1 at ``pad``."""
    lo = block_size if reserve_null else 0
    s = np.random.default_rng(seed).permutation(np.arange(lo, num_blocks * block_size))[:T].astype(np.int32)
    s[list(pad)] = -1
    return s


def _ref_paged(cache, new, slots, layout):
    """numpy reshape_and_cache: ``new[t]`` [Hkv, d] into slot ``slots[t]`` (padding slots skipped)."""
    out = cache.copy()
    bs = cache.shape[1] if layout == "nhd" else cache.shape[2]
    for t in np.nonzero(slots >= 0)[0]:
        blk, off = divmod(int(slots[t]), bs)
        if layout == "nhd":
            out[blk, off] = new[t]
        else:
            out[blk, :, off] = new[t]
    return out


# --------------------------------------------------------------------------------------------------
# vLLM reshape_and_cache (paged cache, slot mapping)
# --------------------------------------------------------------------------------------------------

PAGED_CASES = [  # T, n_kv_heads, d, num_blocks, block_size, dtype, padding tokens
    (300, 2, 64, 40, 16, np.float32, (5, 77, 299)),   # 128 + 128 + 44 tokens, three padding tokens
    (128, 8, 128, 20, 32, BF16, ()),                  # one full tile, rows of 8 x 128
    (37, 1, 64, 8, 8, BF16, (0, 36)),                 # one ragged tile, MQA
]


@pytest.mark.parametrize("T,H,d,nb,bs,dtype,pad", PAGED_CASES)
@pytest.mark.parametrize("layout", ["nhd", "hnd"])
def test_reshape_and_cache_beta1_matches_numpy(kv, layout, T, H, d, nb, bs, dtype, pad):
    """Both cache layouts: every real token's k / v bit-exact in its slot, in place (the caller's arrays and the
    returned ones); the other slots unchanged except slot 0 of the null block, where padding tokens land."""
    m, *_ = kv
    kern = m.reshape_and_cache if layout == "nhd" else m.reshape_and_cache_hnd
    shape = (nb, bs, H, d) if layout == "nhd" else (nb, H, bs, d)
    key, val = _randn((T, H, d), dtype, seed=T), _randn((T, H, d), dtype, seed=T + 1)
    kc, vc = _randn(shape, dtype, seed=2), _randn(shape, dtype, seed=3)
    slots = _slots(T, nb, bs, seed=T + H, pad=pad)
    want_k, want_v = _ref_paged(kc, key, slots, layout), _ref_paged(vc, val, slots, layout)
    ko, vo = kern(key, val, kc, vc, slots)
    assert ko.dtype == np.dtype(dtype) and ko.shape == shape
    null = (0, 0) if layout == "nhd" else (0, slice(None), 0)
    for got, caller, want, new in ((ko, kc, want_k, key), (vo, vc, want_v, val)):
        if pad:  # the null slot holds one of the padding tokens' rows
            assert any(np.array_equal(got[null], new[t]) for t in pad)
        got, caller = got.copy(), caller.copy()
        got[null] = want[null]
        caller[null] = want[null]
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(caller, want)  # written in place
    assert not kern.last_profile.check_reports
    n_t = -(-T // 128)
    ops = _ops(kern)
    # per token tile: the slots, k and v loaded; one scatter per cache (per head and cache, HND)
    assert ops["dma_copy"] == n_t * (3 + (2 if layout == "nhd" else 2 * H)), ops
    # the writes are the new tokens' rows (padding ones included: they go to the null block), not the cache
    assert kern.last_profile.stat("memory.hbm_write_bytes") == 2 * key.nbytes


@pytest.mark.parametrize("T,H,d,nb,bs,dtype,pad", PAGED_CASES[:2])
def test_reshape_and_cache_new_dialect_skips_padding(kvn, T, H, d, nb, bs, dtype, pad):
    """``.ap(vector_offset=slots)`` scatters with ``oob_mode=skip``: padding tokens (-1) are skipped, so every
    slot but the new tokens' (block 0 included: slots anywhere here) keeps its value."""
    key, val = _randn((T, H, d), dtype, seed=T), _randn((T, H, d), dtype, seed=T + 1)
    kc, vc = _randn((nb, bs, H, d), dtype, seed=2), _randn((nb, bs, H, d), dtype, seed=3)
    slots = _slots(T, nb, bs, seed=T + H, pad=pad, reserve_null=False)
    want_k, want_v = _ref_paged(kc, key, slots, "nhd"), _ref_paged(vc, val, slots, "nhd")
    ko, vo = kvn.reshape_and_cache(key, val, kc, vc, slots)
    np.testing.assert_array_equal(ko, want_k)
    np.testing.assert_array_equal(vo, want_v)
    np.testing.assert_array_equal(kc, want_k)
    prof = kvn.reshape_and_cache.last_profile
    assert not prof.check_reports
    assert _ops(kvn.reshape_and_cache)["dma_copy"] == -(-T // 128) * 5
    # the real tokens' rows are written (nsim's cost model also counts a skipped row's bytes)
    n_real = int((slots >= 0).sum())
    assert 2 * n_real * H * d * np.dtype(dtype).itemsize <= prof.stat("memory.hbm_write_bytes") <= 2 * key.nbytes


def test_reshape_and_cache_slot_out_of_range(kv, kvn):
    """A slot past the cache's last one: in Beta 1 (no skip mode) NSIM-E408 err at the store's line naming the
    index; the new-dialect kernel's ``oob_mode=skip`` skips that token like a padding one."""
    m, *_ = kv
    T, H, d, nb, bs = 20, 2, 64, 4, 16
    key = _randn((T, H, d), np.float32, seed=0)
    slots = np.arange(T, dtype=np.int32) + bs
    slots[7] = nb * bs  # one past the end
    with pytest.raises(_core.NsimError) as ei:
        m.reshape_and_cache(key, key, np.zeros((nb, bs, H, d), np.float32), np.zeros((nb, bs, H, d), np.float32),
                            slots)
    msg = str(ei.value)
    assert "NSIM-E408" in msg and "index 64 of row 7" in msg and "[0, 64)" in msg, msg
    assert any(_line("kv_cache_update_kernels.py", "nl.store({}_cache_2d[".format(c), m) in msg
               for c in ("key", "value")), msg
    kc = _randn((nb, bs, H, d), np.float32, seed=1)
    want = _ref_paged(kc, key, np.where(slots < nb * bs, slots, -1), "nhd")
    ko, _ = kvn.reshape_and_cache(key, key, kc, kc.copy(), slots)
    np.testing.assert_array_equal(ko, want)


# --------------------------------------------------------------------------------------------------
# NxDI decode: update at position_ids, then attention over the updated cache
# --------------------------------------------------------------------------------------------------

def _ref_decode_cache(cache, new, pos):
    out = cache.copy()
    for b, p in enumerate(pos):
        out[b, :, p] = new[b, :, 0]
    return out


def _ref_attention(q, kc, vc, pos, scale):
    """float64: head h of batch b attends to positions 0..pos[b] of its kv head's (updated) cache."""
    B, H, _, d = q.shape
    r = H // kc.shape[1]
    out = np.zeros((B, H, 1, d))
    for b in range(B):
        for h in range(H):
            K, V = _f64(kc[b, h // r, :pos[b] + 1]), _f64(vc[b, h // r, :pos[b] + 1])
            s = K @ _f64(q[b, h, 0]) * scale
            p = np.exp(s - s.max())
            out[b, h, 0] = p @ V / p.sum()
    return out


DECODE_CASES = [  # B, n_heads, n_kv_heads, d, S_max, positions, dtype
    (3, 8, 2, 64, 256, (5, 255, 130), np.float32),  # GQA 4:1; a position at the cache's end
    (2, 4, 4, 128, 512, (0, 300), np.float32),      # MHA; the first position (one key)
    (4, 16, 2, 64, 128, (127, 64, 1, 90), BF16),    # GQA 8:1, bf16
]


@pytest.mark.parametrize("B,H,Hkv,d,S,pos,dtype", DECODE_CASES)
def test_decode_update_and_attend_beta1(kv, B, H, Hkv, d, S, pos, dtype):
    """The new token's k / v land at ``position_ids[b]`` (bit-exact; the rest of each cache unchanged, in place)
    and the attention in the same kernel reads the updated cache: it matches numpy over positions <= pos[b] of
    the updated cache (the token at pos[b] is the new one; a stale read would differ)."""
    m, *_ = kv
    q = _randn((B, H, 1, d), dtype, seed=B)
    k, v = _randn((B, Hkv, 1, d), dtype, seed=B + 1), _randn((B, Hkv, 1, d), dtype, seed=B + 2)
    kc, vc = _randn((B, Hkv, S, d), dtype, seed=3), _randn((B, Hkv, S, d), dtype, seed=4)
    pos = np.array(pos, np.int32)
    want_k, want_v = _ref_decode_cache(kc, k, pos), _ref_decode_cache(vc, v, pos)
    out, ko, vo = m.decode_update_and_attend(q, k, v, kc, vc, pos)
    np.testing.assert_array_equal(ko, want_k)
    np.testing.assert_array_equal(vo, want_v)
    np.testing.assert_array_equal(kc, want_k)
    assert out.shape == (B, H, 1, d) and out.dtype == np.dtype(dtype)
    want = _ref_attention(q, want_k, want_v, pos, 1.0 / np.sqrt(d))
    if dtype == np.float32:
        close(out, want)
    else:  # bf16 q / probabilities / output
        np.testing.assert_allclose(_f64(out), want, atol=3e-2, rtol=3e-2)
    stale = _ref_attention(q, kc * 0 + _randn(kc.shape, dtype, seed=3), vc * 0 + _randn(vc.shape, dtype, seed=4),
                           pos, 1.0 / np.sqrt(d))
    assert np.abs(stale - want).max() > 1e-2  # the check above can tell a stale cache
    prof = m.decode_update_and_attend.last_profile
    assert not prof.check_reports
    # writes: the output and one row per (batch, kv head) per cache
    assert prof.stat("memory.hbm_write_bytes") == out.nbytes + k.nbytes + v.nbytes
    ops = _ops(m.decode_update_and_attend)
    n_blk = S // 128
    # positions (twice), per kv head k / v loads and scatters; per (b, kv head) n_blk V blocks and the output;
    # q and the n_blk K blocks by load_transpose2d (a DMA transpose on gen3)
    assert ops["dma_copy"] == 2 + 4 * Hkv + B * Hkv * (n_blk + 1), ops
    assert ops["dma_transpose"] == B * Hkv * (1 + n_blk), ops


@pytest.mark.parametrize("form", ["sbuf", "register"])
def test_decode_update_new_dialect(kvn, form):
    """``.ap(scalar_offset=)`` at ``indirect_dim=2`` (the position dim) from an SBUF position or a register: one
    DMA per batch and cache covers all kv heads; only the new rows are written."""
    B, Hkv, d, S = 3, 4, 64, 256
    kern = kvn.decode_cache_update if form == "sbuf" else kvn.decode_cache_update_reg
    k, v = _randn((B, Hkv, 1, d), BF16, seed=1), _randn((B, Hkv, 1, d), BF16, seed=2)
    kc, vc = _randn((B, Hkv, S, d), BF16, seed=3), _randn((B, Hkv, S, d), BF16, seed=4)
    pos = np.array([5, 255, 0], np.int32)
    want_k, want_v = _ref_decode_cache(kc, k, pos), _ref_decode_cache(vc, v, pos)
    ko, vo = kern(k, v, kc, vc, pos)
    np.testing.assert_array_equal(ko, want_k)
    np.testing.assert_array_equal(vo, want_v)
    prof = kern.last_profile
    assert not prof.check_reports
    assert prof.stat("memory.hbm_write_bytes") == k.nbytes + v.nbytes
    assert _ops(kern)["dma_copy"] == 4 * B + (1 if form == "sbuf" else 0)


@pytest.mark.parametrize("bad", [256, -1])
@pytest.mark.parametrize("form", ["sbuf", "register"])
def test_register_position_out_of_range_is_an_error_at_the_users_line(kvn, form, bad):
    """A position outside [0, S_max) along ``indirect_dim``: err_tensor_access_out_of_bound (NSIM-E408) at the
    DMA's line, for the SBUF offset (run time) and for the register (known while tracing). Before the fix the
    register form wrote row 0 of the next head's cache (``bad = S_max``) or the previous head's last row (-1)."""
    B, Hkv, d, S = 2, 2, 64, 256
    kern = kvn.decode_cache_update if form == "sbuf" else kvn.decode_cache_update_reg
    k = _randn((B, Hkv, 1, d), np.float32, seed=1)
    kc = np.zeros((B, Hkv, S, d), np.float32)
    with pytest.raises(_core.NsimError) as ei:
        kern(k, k, kc, kc.copy(), np.array([3, bad] if bad < 0 else [bad, 3], np.int32))
    msg = str(ei.value)
    assert "NSIM-E408" in msg and str(bad) in msg and "[0, 256)" in msg, msg
    assert "kv_cache_update_kernels_new.py:" in msg, msg


def test_register_position_out_of_range_with_oob_skip_skips_the_transfer():
    """With ``oob_mode=skip`` a register offset outside its dim moves nothing (the other batch is written)."""
    from nsim import nki
    import nsim.nki.isa as nisa
    import nsim.nki.language as nl

    @nki.jit
    def upd(k, k_cache, position_ids):
        B, H, _, d = k.shape
        S = k_cache.shape[2]
        for b in nl.affine_range(B):
            pos = nisa.register_alloc()
            nisa.register_load(pos, position_ids[b:b + 1])
            t = nl.ndarray((H, d), dtype=k.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=t, src=k[b, :, 0, :])
            nisa.dma_copy(dst=k_cache.ap(pattern=[[S * d, H], [1, d]], offset=b * H * S * d, scalar_offset=pos,
                                         indirect_dim=2), src=t, oob_mode=nisa.oob_mode.skip)
        return k_cache

    k = _randn((2, 2, 1, 32), np.float32, seed=0)
    kc = _randn((2, 2, 16, 32), np.float32, seed=1)
    for pos in ([3, 16], [-1, 15]):
        pos = np.array(pos, np.int32)
        want = kc.copy()
        for b in range(2):
            if 0 <= pos[b] < 16:
                want[b, :, pos[b]] = k[b, :, 0]
        np.testing.assert_array_equal(upd(k, kc.copy(), pos), want)
        assert _ops(upd)["dma_copy"] == 3


def test_decode_position_out_of_range_beta1_names_the_store(kv):
    """Beta 1 flattens the cache to rows: an out-of-range position of the last (batch, head) is past the last row,
    NSIM-E408 at the scatter's line (in the middle of the cache it is another head's row, as on hardware)."""
    m, *_ = kv
    B, H, Hkv, d, S = 2, 4, 2, 64, 128
    q = _randn((B, H, 1, d), np.float32, seed=0)
    k = _randn((B, Hkv, 1, d), np.float32, seed=1)
    z = np.zeros((B, Hkv, S, d), np.float32)
    with pytest.raises(_core.NsimError) as ei:
        m.decode_update_and_attend(q, k, k, z, z.copy(), np.array([3, S], np.int32))
    msg = str(ei.value)
    assert "NSIM-E408" in msg and "index {} of row 1".format(B * Hkv * S) in msg, msg
    # (the k and v scatters are independent DMAs: either may run first)
    assert any(_line("kv_cache_update_kernels.py", "nl.store({}_cache_rows[rows[i_b, 0]".format(c), m) in msg
               for c in "kv"), msg


# --------------------------------------------------------------------------------------------------
# Chunked prefill: S tokens at a runtime start
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("B,Hkv,Sn,d,S,start,dtype", [
    (2, 2, 200, 64, 512, (0, 312), np.float32),   # 128 + 72 tokens; the second chunk ends at the cache's end
    (1, 4, 128, 128, 256, (77,), BF16),           # one full tile at an odd start
    (3, 1, 5, 64, 128, (0, 60, 123), BF16),       # a few tokens
])
def test_prefill_cache_write_matches_numpy(kv, kvn, B, Hkv, Sn, d, S, start, dtype):
    """Both dialects (Beta 1: row indices ``iota + start`` per tile; new: ``nl.ds(start_tile, rows)``): the chunk
    lands at ``start[b]``, bit-exact, the rest unchanged; the writes are the chunk's bytes."""
    m, *_ = kv
    kn, vn = _randn((B, Hkv, Sn, d), dtype, seed=Sn), _randn((B, Hkv, Sn, d), dtype, seed=Sn + 1)
    start = np.array(start, np.int32)
    n_tiles = -(-Sn // 128)
    for kern, dmas in ((m.prefill_cache_write, 1 + 4 * B * Hkv * n_tiles),
                       (kvn.prefill_cache_write, 1 + 4 * B * Hkv * n_tiles)):
        kc, vc = _randn((B, Hkv, S, d), dtype, seed=5), _randn((B, Hkv, S, d), dtype, seed=6)
        want_k, want_v = kc.copy(), vc.copy()
        for b in range(B):
            want_k[b, :, start[b]:start[b] + Sn] = kn[b]
            want_v[b, :, start[b]:start[b] + Sn] = vn[b]
        ko, vo = kern(kn, vn, kc, vc, start)
        np.testing.assert_array_equal(ko, want_k)
        np.testing.assert_array_equal(vo, want_v)
        np.testing.assert_array_equal(vc, want_v)
        prof = kern.last_profile
        assert not prof.check_reports
        assert prof.stat("memory.hbm_write_bytes") == kn.nbytes + vn.nbytes
        assert _ops(kern)["dma_copy"] == dmas, _ops(kern)


def test_prefill_chunk_past_the_cache_end_is_an_error(kv, kvn):
    """A chunk that would run past S_max: NSIM-E408 at the scatter (Beta 1: its last row past the flattened
    cache; new dialect: the runtime ``nl.ds`` start leaves no room for the rows)."""
    m, *_ = kv
    B, Hkv, Sn, d, S = 2, 2, 50, 64, 128
    kn = _randn((B, Hkv, Sn, d), np.float32, seed=0)
    z = np.zeros((B, Hkv, S, d), np.float32)
    for kern, path, marker, mod in ((m.prefill_cache_write, "kv_cache_update_kernels.py",
                                     "nl.store(k_cache_rows[rows[i_p, 0]", m),
                                    (kvn.prefill_cache_write, "kv_cache_update_kernels_new.py",
                                     "nisa.dma_copy(dst=k_cache[b, h, nl.ds(", kvn)):
        with pytest.raises(_core.NsimError) as ei:
            kern(kn, kn, z, z.copy(), np.array([3, 100], np.int32))
        msg = str(ei.value)
        assert "NSIM-E408" in msg, msg
        assert any(_line(path, marker.replace("k_cache", c + "_cache"), mod) in msg for c in "kv"), msg


# --------------------------------------------------------------------------------------------------
# kernel.json: the scatter's repeated row after size-1 dims (the verifier fix), and only there
# --------------------------------------------------------------------------------------------------

def test_kernel_json_scatter_row_dim_after_size_one_dims(kvn):
    """The new-dialect kernel's scatter into the [slots, H * d] reshape of a 4-D cache is, in kernel.json, a dst
    ``[0, {"broadcast": T}, H, d]``: it verifies and runs from the JSON alone; a broadcast after a dim of more than
    one element (not a row dim) is still NSIM-E407 "broadcasts, but a destination cannot"."""
    from nsim import _errors, simulate_json

    T, H, d, nb, bs = 20, 2, 8, 4, 16
    key = _randn((T, H, d), np.float32, seed=0)
    kc = _randn((nb, bs, H, d), np.float32, seed=1)
    slots = np.random.default_rng(2).permutation(nb * bs)[:T].astype(np.int32)
    args = (key, key, kc, kc, slots)
    k = kvn.reshape_and_cache.to_json(*args)
    scatter = [s for s in k["body"] if "offsets" in s and s["dst"]["tensor"] == "key_cache__out"]
    assert len(scatter) == 1 and scatter[0]["dst"]["index"][0] == 0, scatter
    assert scatter[0]["dst"]["index"][1] == {"start": 0, "broadcast": T}, scatter
    inputs = {"key": key, "value": key, "key_cache": kc, "value_cache": kc, "slot_mapping": slots}
    outs, _ = simulate_json(k, inputs=inputs)
    np.testing.assert_array_equal(outs["key_cache__out"], _ref_paged(kc, key, slots, "nhd"))
    scatter[0]["dst"]["index"][1:3] = [{"start": 0, "size": 2}, {"start": 0, "broadcast": T}]
    scatter[0]["dst"]["index"][3] = {"start": 0, "size": d}
    scatter[0]["src"] = {"tensor": scatter[0]["src"]["tensor"], "index": [{"start": 0, "size": T},
                                                                          {"start": 0, "size": 2 * d}]}
    with pytest.raises(_core.NsimError) as ei:
        simulate_json(k, inputs=inputs)
    msg = str(ei.value)
    assert msg.startswith(_errors.code("BadIndex")) and "dim 2" in msg and "destination cannot" in msg, msg
