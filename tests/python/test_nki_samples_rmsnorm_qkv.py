"""The nki-samples fused RMSNorm + QKV projection (``allocated_fused_rms_norm_qkv``,
tests/python/kernels/nki_samples_rmsnorm_qkv.py, sample code as the sample writes it), a manually allocated
kernel, run through ``nsim.compat``: its output against numpy on trn1 and trn2 (including a sequence that is not a
multiple of 128 and a head dim below 512, both masked), its placement taken as written, and the Beta-1
semantics it relies on: ``+=`` of matmuls into a PSUM tile nothing wrote since its allocation."""
import warnings

import numpy as np
import pytest

from conftest import require_core, sample_fixture  # noqa: E402

_core, ml_dtypes = require_core()
from numeric_helpers import close, rounded  # noqa: E402

BF16 = ml_dtypes.bfloat16


rq = sample_fixture("nki_samples_rmsnorm_qkv.py")


def _bf(x):
    return rounded(x, BF16)


def reference_bf16(hidden, weights, eps=1e-6):
    """The sample's math with its roundings: the sum of squares and rsqrt in float32, the normalised rows stored
    as bfloat16 (the transposes copy them exactly), the projection accumulated in float32 and stored as
    bfloat16."""
    h = hidden.astype(np.float64)
    rms = 1.0 / np.sqrt((h * h).sum(axis=-1, keepdims=True) * (1.0 / h.shape[-1]) + eps)
    return _bf(_bf(h * rms) @ weights.astype(np.float64))


@pytest.mark.parametrize("batch,seq,dim,head_dim,config", [
    (1, 256, 1024, 384, "trn2"),
    (2, 200, 512, 512, "trn1"),
    (1, 384, 2048, 512, "trn2")])
def test_rms_norm_qkv_matches_numpy(rq, capfd, batch, seq, dim, head_dim, config):
    """Two sequence tiles per pass (double-buffered input), the weights preloaded per batch; seq 200 and 384
    leave the second tile of the last pass partly or wholly past the end (masked loads and stores); head_dim 384
    masks the weight columns. The manual addresses do not overlap (a 4-byte tile at 256, the next at 260), so
    nsim places nothing elsewhere. The sample computes on whole tiles of which its masked loads wrote a part, and
    the garbage never leaves the chip: no NSIM-W501. Since element-granular taint (2026-12-05) the sanitizer
    follows it element by element: seq 200's unwritten token rows 72..127 go through the element-wise ops, the
    PE transpose (nc_matmul is_transpose=True: token rows become columns 72..127) and the projection (stationary
    columns 72..127: output rows 72..127), which the masked store drops; head_dim 384's unwritten weight columns
    384..511 (the projection's moving) become output columns 384..511, also dropped. (Before, the report was at
    the matmul that read them: a false positive.) seq 384 reads only the previous pass's rows there."""
    mod = rq[0]
    rng = np.random.default_rng(dim + seq)
    x = rng.standard_normal((batch, seq, dim)).astype(BF16)
    w = (rng.standard_normal((dim, head_dim)) / np.sqrt(dim)).astype(BF16)
    import nsim.tracer
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = mod.allocated_fused_rms_norm_qkv.options(config=config)(x, w)
    assert [str(m.message) for m in caught if issubclass(m.category, nsim.tracer.CheckWarning)] == []
    assert out.shape == (batch, seq, head_dim) and out.dtype == BF16
    close(np.asarray(out, np.float32), reference_bf16(x, w), BF16)
    close(np.asarray(out, np.float32), mod.reference_rms_norm_qkv(x, w), BF16)
    assert "placed by address=" not in capfd.readouterr().err


def test_manual_tiles_in_a_loop_keep_their_address(rq, capfd):
    """The sample allocates its per-pass tiles (``act``, ``out_tile``, ``res_tile`` ...) inside the loops at fixed
    addresses: each pass reuses those bytes, so consecutive passes wait for each other instead of overlapping in
    rotating buffers. Two batches (a kept outer loop) take longer than one by about one batch's time, and
    nothing is moved (the same bytes in every iteration are no clash)."""
    mod = rq[0]
    rng = np.random.default_rng(3)
    w = (rng.standard_normal((512, 512)) / np.sqrt(512)).astype(BF16)
    t = []
    for batch in (1, 2):
        x = rng.standard_normal((batch, 256, 512)).astype(BF16)
        out = mod.allocated_fused_rms_norm_qkv(x, w)
        close(np.asarray(out, np.float32), reference_bf16(x, w), BF16)
        t.append(mod.allocated_fused_rms_norm_qkv.last_profile.total_time_ns)
    assert "placed by address=" not in capfd.readouterr().err
    # the second batch runs after the first, in the same bytes (13.8 and 27.2 us when written)
    assert 1.6 * t[0] < t[1] < 2.1 * t[0], t


def test_psum_plus_equal_starts_on_an_unwritten_tile(rq):
    """Beta 1 ``psum[...] += nisa.nc_matmul(...)``: onto a PSUM tile nothing wrote since its allocation
    (``nl.ndarray(buffer=nl.psum)``, the sample's ``res_tile``) the first matmul starts the accumulation; onto one
    the kernel wrote (``nl.zeros``, or a value), each matmul adds to what it holds. In a loop kept as a loop and
    in one allocated in a loop body."""
    _, nki, nl, nisa = rq

    @nki.jit
    def k(a, b):
        out = nl.ndarray((3, 128, 256), dtype=np.float32, buffer=nl.shared_hbm)
        fresh = nl.ndarray((128, 256), dtype=np.float32, buffer=nl.psum)
        zeroed = nl.zeros((128, 256), dtype=np.float32, buffer=nl.psum)
        ones = nl.ndarray((128, 256), dtype=np.float32, buffer=nl.psum)
        ones[...] = 1.0
        for i in nl.affine_range(4):
            at = nl.load(a[i])
            bt = nl.load(b[i])
            fresh[...] += nisa.nc_matmul(at, bt)
            zeroed[...] += nisa.nc_matmul(at, bt)
            ones[...] += nisa.nc_matmul(at, bt)
        for j, p in enumerate((fresh, zeroed, ones)):
            nl.store(out[j], value=nl.copy(p))
        return out

    @nki.jit
    def per_row(a, b):
        out = nl.ndarray((2, 128, 256), dtype=np.float32, buffer=nl.shared_hbm)
        for r in nl.affine_range(2):
            acc = nl.ndarray((128, 256), dtype=np.float32, buffer=nl.psum)
            for i in nl.affine_range(4):
                acc[...] += nisa.nc_matmul(nl.load(a[i]), nl.load(b[i]))
            nl.store(out[r], value=nl.copy(acc))
        return out

    rng = np.random.default_rng(4)
    a = (rng.standard_normal((4, 128, 128)) / np.sqrt(512)).astype(np.float32)
    b = rng.standard_normal((4, 128, 256)).astype(np.float32)
    want = np.einsum("ikm,ikn->mn", a.astype(np.float64), b.astype(np.float64))
    got = np.asarray(k(a, b))
    close(got[0], want)
    close(got[1], want)
    close(got[2], want + 1.0)
    got = np.asarray(per_row(a, b))
    close(got[0], want)
    close(got[1], want)
