"""Reinterpreting views of another element size (spec §3.9: ``t.view(dtype)`` / ``reinterpret_cast`` scale the last dim
by the ratio of the element sizes, which must be contiguous and divisible; ``.ap(..., dtype=)`` counts offset and
steps in elements of the new dtype), checked bit for bit against numpy's ``a.view(dtype)``, which has the same rule.

In the kernel IR such an access names the tensor with a ``"dtype"`` of another size; kernel.json reads its index
against the tensor's shape with the last dim scaled (docs/kernel-json.md). Both dialects, HBM tensors and on-chip
tiles, reads and writes, loops kept symbolically, ``.ap(dtype=)``, the errors (a last dim whose bytes do not divide,
a strided or misaligned last dim, an index past the scaled shape) and the sanitizer's affine_range check across views
of different element sizes (compared byte by byte).

Fixed on the way: a Beta-1 arange-indexed view of a reinterpreting view (``x.view(nl.int16)[i_p, i_f]``, even of the
same element size) lost its dtype and was read as the tensor's own dtype (wrong numbers, no error)."""
import json
import warnings

import numpy as np
import pytest

from conftest import require_core  # noqa: E402

_core, ml_dtypes = require_core()

from nsim import nki  # noqa: E402
from nsim import tracer  # noqa: E402
import nsim.nki.isa as nisa  # noqa: E402
import nsim.nki.language as nl  # noqa: E402
from nsim.tracer import NsimError  # noqa: E402

BF16 = ml_dtypes.bfloat16


def _bf16(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(BF16)


def _bits_equal(got, want):
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got.view(np.uint8), np.ascontiguousarray(want).view(np.uint8))


def _reports(kernel, *args):
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        kernel.options(check=True).simulate(*args)
    return [x.message.report for x in w if issubclass(x.category, tracer.CheckWarning)]


# --------------------------------------------------------------------------------------------------
# new dialect
# --------------------------------------------------------------------------------------------------


@nki.jit
def _hbm_wider(a):
    # [128, 512] bf16 as float32: [128, 256]
    out = nl.ndarray((128, 256), nl.float32, buffer=nl.shared_hbm)
    t = nl.ndarray((128, 256), nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a.view(nl.float32))
    nisa.dma_copy(dst=out, src=t)
    return out


@nki.jit
def _hbm_narrower_slice(a):
    # the bytes 16 .. 143 of each row of a bf16 tensor, as uint8: a.view(uint8)[:, 16:144] (rows 64 .. 191)
    out = nl.ndarray((128, 128), nl.uint8, buffer=nl.shared_hbm)
    t = nl.ndarray((128, 128), nl.uint8, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a.view(nl.uint8)[64:192, 16:144])
    nisa.dma_copy(dst=out, src=t)
    return out


def test_hbm_views_wider_and_narrower_match_numpy():
    a = _bf16((256, 512))
    _bits_equal(_hbm_wider(a[:128].copy()), a[:128].view(np.float32))
    _bits_equal(_hbm_narrower_slice(a), a.view(np.uint8)[64:192, 16:144])


@nki.jit
def _truncate_to_bf16(x):
    # float32 -> bfloat16 by keeping the high half of each element (little-endian: the odd bf16 of each pair), a
    # bit trick of quantization kernels: a view of the SBUF tile, then a strided copy
    out = nl.ndarray((128, 64), nl.bfloat16, buffer=nl.shared_hbm)
    t = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    hi = nl.ndarray((128, 64), nl.bfloat16, buffer=nl.sbuf)
    nisa.tensor_copy(dst=hi, src=t.view(nl.bfloat16)[:, 1::2])
    nisa.dma_copy(dst=out, src=hi)
    return out


def test_tile_view_strided_copy_truncates_like_numpy():
    x = np.random.default_rng(1).standard_normal((128, 64)).astype(np.float32)
    got = _truncate_to_bf16(x)
    _bits_equal(got, x.view(BF16)[:, 1::2])
    # (truncation, not rounding: differs from astype where the low half is not zero)
    assert not np.array_equal(got.view(np.uint16), x.astype(BF16).view(np.uint16))


@nki.jit
def _write_through_view(x):
    # float32 values written into the bytes of a bf16 output (out viewed as float32), in two column halves
    out = nl.ndarray((128, 512), nl.bfloat16, buffer=nl.shared_hbm)
    ov = out.view(nl.float32)  # [128, 256]
    for h in range(2):
        t = nl.ndarray((128, 128), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x[:, h * 128:(h + 1) * 128])
        nisa.dma_copy(dst=ov[:, h * 128:(h + 1) * 128], src=t)
    return out


def test_write_through_a_view_of_the_output():
    x = np.random.default_rng(2).standard_normal((128, 256)).astype(np.float32)
    _bits_equal(_write_through_view(x), x.view(BF16))


@nki.jit
def _ap_dtype(a):
    # .ap with a dtype of another size: a bf16 [128, 512] storage read as float32 (256 per row), every other
    # element from element 1 (offset and steps in float32 elements)
    out = nl.ndarray((128, 128), nl.float32, buffer=nl.shared_hbm)
    t = nl.ndarray((128, 128), nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a.ap([[256, 128], [2, 128]], offset=1, dtype=nl.float32))
    nisa.dma_copy(dst=out, src=t)
    return out


def test_ap_with_a_dtype_of_another_size_counts_its_elements():
    a = _bf16((128, 512), seed=3)
    _bits_equal(_ap_dtype(a), a.view(np.float32)[:, 1::2])


@nki.jit
def _loop_view(a):
    # row tiles of a bf16 [512, 256] input read as float32 [512, 128] in an affine_range (kept as a loop)
    out = nl.ndarray((512, 128), nl.float32, buffer=nl.shared_hbm)
    av = a.view(nl.float32)
    for i in nl.affine_range(4):
        t = nl.ndarray((128, 128), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=av[i * 128:(i + 1) * 128, :])
        nisa.dma_copy(dst=out[i * 128:(i + 1) * 128, :], src=t)
    return out


def test_view_in_a_kept_loop():
    a = _bf16((512, 256), seed=4)
    _bits_equal(_loop_view(a), a.view(np.float32))
    k = _loop_view.to_json(a)
    loop = next(s["loop"] for s in k["body"] if "loop" in s)
    src = next(s for s in loop["body"] if s.get("op") == "dma_copy" and s["dst"] == "t")["src"]
    # one symbolic access of the float32 elements (the loop is not unrolled)
    assert src["tensor"] == "a" and src["dtype"] == "float32" and src["index"][0]["start"] == "128*i"


@nki.jit
def _round_trip(a):
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(a.shape, a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a.view(nl.uint8).view(nl.float32).view(nl.bfloat16))
    nisa.dma_copy(dst=out, src=t)
    return out


def test_views_back_to_the_tensors_dtype_are_plain_accesses():
    a = _bf16((128, 64), seed=5)
    _bits_equal(_round_trip(a), a)
    src = [s for s in _round_trip.to_json(a)["body"] if s.get("op") == "dma_copy"][0]["src"]
    assert src == "a"  # no "dtype": the tensor itself


def test_view_shape_dtype_and_errors():
    seen = {}

    @nki.jit
    def shapes(a):
        v = a.view(nl.float32)
        seen["f32"] = (tuple(v.shape), np.dtype(v.dtype))
        seen["u8"] = tuple(a.view(nl.uint8).shape)
        seen["slice"] = tuple(a[:, 2:10].view(nl.float32).shape)
        seen["cast"] = tuple(a.reinterpret_cast(nl.int32).shape)

    shapes(_bf16((128, 64)))
    assert seen == {"f32": ((128, 32), np.dtype(np.float32)), "u8": (128, 128), "slice": (128, 4), "cast": (128, 32)}

    def fails(fn, a, match):
        with pytest.raises(NsimError, match=match):
            nki.jit(fn)(a)

    def odd(a):  # [128, 3] bf16: 6 bytes per row, not a whole number of float32
        a.view(nl.float32)

    def strided(a):  # the last dim must be contiguous
        a[:, ::2].view(nl.float32)

    def misaligned(a):  # starts at byte 2 of a float32
        a[:, 1:9].view(nl.float32)

    def ragged(a):  # 3 bf16 = 6 bytes
        a[:, 0:3].view(nl.float32)

    fails(odd, _bf16((128, 3)), "holds 6 bytes, not a whole number of 4-byte float32")
    fails(strided, _bf16((128, 64)), "must be contiguous")
    fails(misaligned, _bf16((128, 64)), "starts at byte 2")
    fails(ragged, _bf16((128, 64)), "holds 6 bytes, not a whole number of 4-byte float32")


def test_kernel_json_index_past_the_scaled_shape_is_e408():
    k = {"nsim_kernel": 1, "name": "past", "tensors": [
        {"name": "x", "buffer": "hbm", "kind": "input", "dtype": "bfloat16", "shape": [128, 512]},
        {"name": "y", "buffer": "hbm", "kind": "output", "dtype": "float32", "shape": [128, 64]}],
        "body": [{"alloc": {"name": "t", "buffer": "sbuf", "dtype": "float32", "shape": [128, 64]}},
                 {"op": "dma_copy", "dst": "t", "src": {"tensor": "x", "dtype": "float32", "index": [
                     {"start": 0, "size": 128}, {"start": 200, "size": 64}]}},
                 {"op": "dma_copy", "dst": "y", "src": "t"}]}
    import nsim
    with pytest.raises(NsimError, match=r"E408.*\[128, 256\].*within \[0, 256\)"):
        nsim.simulate_json(json.dumps(k))
    k["body"][1]["src"]["index"][1]["start"] = 192  # the last 64 float32 of each row
    x = _bf16((128, 512), seed=6)
    out, _ = nsim.simulate_json(json.dumps(k), inputs={"x": x})
    _bits_equal(out["y"], x.view(np.float32)[:, 192:256])


# --------------------------------------------------------------------------------------------------
# the sanitizer's affine_range check across element sizes
# --------------------------------------------------------------------------------------------------


def _mixed(overlap):
    @nki.jit
    def k(x):
        out = nl.ndarray((128, 512), nl.bfloat16, buffer=nl.shared_hbm)
        for i in nl.affine_range(2):
            t = nl.ndarray((128, 32), nl.float32, buffer=nl.sbuf)
            nisa.dma_copy(dst=t, src=x[:, i * 32:(i + 1) * 32])
            # float32 columns 32i .. 32i + 31 = bf16 columns 64i .. 64i + 63
            nisa.dma_copy(dst=out.view(nl.float32)[:, i * 32:(i + 1) * 32], src=t)
            u = nl.ndarray((128, 64), nl.bfloat16, buffer=nl.sbuf)
            nisa.tensor_copy(dst=u, src=t.view(nl.bfloat16))
            # bf16 columns 64 - 64i .. (the other iteration's float32 columns) or 256 + 64i .. (nobody's)
            c0 = 64 - 64 * i if overlap else 256 + 64 * i
            nisa.dma_copy(dst=out[:, c0:c0 + 64], src=u)
        return out
    return k


def test_affine_write_conflict_through_views_of_different_sizes():
    x = np.random.default_rng(7).standard_normal((128, 64)).astype(np.float32)
    reps = _reports(_mixed(True), x)
    assert [r["check"] for r in reps] == ["affine-write-conflict"] and reps[0]["tensor"] == "out"
    assert _reports(_mixed(False), x) == []


def _blocks_in_two_loops(shift):
    """Block 2 o + i of the one row of `out` ([1, 640] bf16: 128 bytes a block) written in iteration (o, i) of two
    affine loops, through a float32 view (32 columns) and through the bf16 tensor (64 columns): the same bytes, so
    the check compares the two writes by bytes (_bytes_apart). `shift`: the bf16 write goes to the next block,
    which iteration i + 1 writes through the view (a conflict across iterations of i)."""
    @nki.jit
    def k(x):
        out = nl.ndarray((1, 640), nl.bfloat16, buffer=nl.shared_hbm)
        for o in nl.affine_range(2):
            for i in nl.affine_range(2):
                b = o * 2 + i
                t = nl.ndarray((1, 32), nl.float32, buffer=nl.sbuf)
                nisa.dma_copy(dst=t, src=x[:, b * 32:(b + 1) * 32])
                nisa.dma_copy(dst=out.view(nl.float32)[:, b * 32:(b + 1) * 32], src=t)
                u = nl.ndarray((1, 64), nl.bfloat16, buffer=nl.sbuf)
                nisa.tensor_copy(dst=u, src=t.view(nl.bfloat16))
                c0 = (b + shift) * 64
                nisa.dma_copy(dst=out[:, c0:c0 + 64], src=u)
        return out
    return k


def test_the_affine_write_check_across_element_sizes_takes_an_enclosing_loops_index_as_fixed():
    # The byte windows of the two writes in loop i, without the outer index o's term (o does not move while i's
    # loop runs): apart. The window used to span o's whole range, and the check unrolled loop i to check it
    # exactly, so the traced IR (and possibly the simulated time) depended on the sanitizer being on.
    x = np.random.default_rng(11).standard_normal((1, 128)).astype(np.float32)
    k = _blocks_in_two_loops(0)
    checked = k.options(loops="keep", check=True).to_json(x)
    assert checked == k.options(loops="keep", check=False).to_json(x)
    assert _reports(k, x) == []
    reps = _reports(_blocks_in_two_loops(1), x)
    assert reps and all(r["check"] == "affine-write-conflict" and r["tensor"] == "out" for r in reps)


def test_kept_loop_two_writes_that_meet_across_iterations_are_reported():
    # Each write moves apart from itself; iteration 1's second write is iteration 0's first (columns 0 .. 63).
    # Before, the kept loop was never unrolled for this and nothing was reported.
    def kern(second):
        @nki.jit
        def k(x):
            out = nl.ndarray((128, 512), nl.float32, buffer=nl.shared_hbm)
            for i in nl.affine_range(2):
                t = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
                nisa.dma_copy(dst=t, src=x[:, i * 64:(i + 1) * 64])
                nisa.dma_copy(dst=out[:, i * 64:(i + 1) * 64], src=t)
                c0 = second(i)
                nisa.dma_copy(dst=out[:, c0:c0 + 64], src=t)
            return out
        return k

    x = np.random.default_rng(10).standard_normal((128, 128)).astype(np.float32)
    reps = _reports(kern(lambda i: 64 - 64 * i), x)
    assert [r["check"] for r in reps] == ["affine-write-conflict"] and "iteration 1" in reps[0]["detail"]
    # disjoint over the whole loop, and a window moving by its step: kept loops, nothing reported
    for second in (lambda i: 256 + 64 * i, lambda i: 128 + 64 * i):
        k = kern(second)
        assert _reports(k, x) == []
        assert any("loop" in s for s in k.options(check=True).to_json(x)["body"])

    @nki.jit
    def rows(x):  # out[i, 0:64] and out[i, 64:128]: one window moving by one row
        out = nl.ndarray((4, 128), nl.float32, buffer=nl.shared_hbm)
        for i in nl.affine_range(4):
            t = nl.ndarray((1, 64), nl.float32, buffer=nl.sbuf)
            nisa.dma_copy(dst=t, src=x[i:i + 1, :])
            nisa.dma_copy(dst=out[i:i + 1, 0:64], src=t)
            nisa.dma_copy(dst=out[i:i + 1, 64:128], src=t)
        return out

    y = np.random.default_rng(11).standard_normal((4, 64)).astype(np.float32)
    assert _reports(rows, y) == []
    assert any("loop" in s for s in rows.options(check=True).to_json(y)["body"])


# --------------------------------------------------------------------------------------------------
# Beta 1
# --------------------------------------------------------------------------------------------------


def test_beta1_arange_views_keep_their_dtype(b1):
    bnki, bnl, _ = b1

    @bnki.jit
    def same_size(a):  # bf16 bits as int16 (the same size), then an integer op on them
        out = bnl.ndarray((128, 64), dtype=bnl.int16, buffer=bnl.shared_hbm)
        i_p, i_f = bnl.mgrid[0:128, 0:64]
        t = bnl.load(a.view(bnl.int16)[i_p, i_f])
        bnl.store(out[i_p, i_f], value=bnl.bitwise_and(t, 0x7FFF, dtype=bnl.int16))
        return out

    @bnki.jit
    def other_size(a):  # bytes 16 .. 79 of each row
        out = bnl.ndarray((128, 64), dtype=bnl.uint8, buffer=bnl.shared_hbm)
        i_p, i_f = bnl.mgrid[0:128, 0:64]
        t = bnl.load(a.view(bnl.uint8)[i_p, i_f + 16])
        bnl.store(out[i_p, i_f], value=t)
        return out

    @bnki.jit
    def loop(a):  # row tiles of a bf16 [256, 128] input as float32 [256, 64], kept as a loop
        out = bnl.ndarray((256, 64), dtype=bnl.float32, buffer=bnl.shared_hbm)
        for i in bnl.affine_range(2):
            t = bnl.load(a.view(bnl.float32)[i * 128:(i + 1) * 128, :])
            bnl.store(out[i * 128:(i + 1) * 128, :], value=t)
        return out

    a = _bf16((128, 64), seed=8)
    _bits_equal(same_size(a), a.view(np.int16) & np.int16(0x7FFF))
    _bits_equal(other_size(a), a.view(np.uint8)[:, 16:80])
    b = _bf16((256, 128), seed=9)
    _bits_equal(loop(b), b.view(np.float32))
