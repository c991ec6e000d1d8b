"""Training utilities with on-chip randomness and global reductions, written like public NKI kernels
(tests/python/kernels/training_utility_kernels.py, Beta-1 dialect, and training_utility_kernels_new.py, new dialect;
both unmodified, through ``nsim.compat``):

- inverted dropout forward / backward: re-seeded per row tile (``nl.add(seed, t)`` + ``nl.random_seed`` +
  ``nl.dropout``), the backward regenerating the mask from the same seeds; and the ``nl.rand`` style whose uint8
  mask is stored and reused by the backward;
- gradient clipping by global norm over three gradients of different shapes and dtypes (a 1-D one folded onto the
  partitions): per-partition sums of squares (``activation_reduce``), the partition sum by a ones matmul into PSUM
  or by ``tensor_partition_reduce``, sqrt, min(1, max_norm / (norm + eps)), a second pass scaling every tile;
- a LAMB step (new dialect): moments, update direction to an HBM scratch, ||w|| and ||u|| by a ones matmul, the
  trust ratio, a second pass applying it; an Adafactor step (new dialect): row / column means of g^2 (the column
  sums by a ones-vector matmul), v as a K = 1 outer-product matmul, the update clipped by its RMS; dropout with
  ``nisa.dropout`` in the new dialect;
- fused bias + GELU forward (one ScalarE activation with the bias as its (P, 1) operand; tanh approximation and
  exact erf) and backward (``nl.gelu_dx`` / the tanh derivative written out; dbias reduced over the free axis),
  bf16, against the same work as two kernels with the intermediate in HBM.

Checked: the masks' keep fraction (binomial tolerance, per row tile too), forward and backward masks equal, outputs
equal numpy applied with nsim's own mask; norms, clipped gradients, LAMB state and GELU values / gradients against
float64 numpy (fp32 1e-5, bf16 1e-2); no sanitizer report; the HBM traffic each tiling implies (clipping and LAMB
read every gradient byte twice; the rand-mask backward reads the mask, the regenerating one does not), the
instruction counts (one seed per row tile, one partition reduction per clip, the Adafactor matmuls) and that the
fused bias + GELU moves fewer bytes and is faster than the two separate kernels.

The nsim fixes this family needed. The main one (python/nsim/tracer.py ``Tracer.retarget``): ``t[...] =
nl.zeros(..)`` emits a memset of a temporary that is then retargeted to ``t``, but the tracer's pending dead-fill
record stayed keyed by the temporary's name. The temporary's storage is reused by the same line's next iteration, whose own fill then
"overwrote" that name and deleted the earlier memset as a dead store, although it had written ``t``. A
``part[...] = nl.zeros(..)`` before a masked ``activation_reduce(reduce_res=part)`` on a ragged row tile so lost
its zeroing: the unmasked partitions kept an earlier tile's partial sums and the global norm came out wrong
(1000 rows: +2.4 %; sometimes NaN with a sanitizer report, mostly silently). The record now follows the retarget
(kept under ``t`` when the fill covers it whole, else dropped): ``test_zero_fill_before_masked_reduce_is_kept``.

Also fixed (each with its regression test below):
- Beta-1 ``acc += nl.sum(sq, axis=1, keepdims=True, mask=rows)`` on a tile where the mask holds everywhere recursed
  without end (RecursionError) in ``Tensor.__iadd__`` (python/nsim/nki/beta1/language.py): restricting a masked
  value to a box covering all of it returns the value itself, still marked masked;
- Beta-1 ``nisa.dropout(x, prob=p_tile, mask=rows)`` was NSIM-E446 although Beta 1 takes ``mask=`` (spec 2.4):
  it now runs on the mask's rectangle as the other element-wise instructions do (python/nsim/nki/beta1/isa.py);
- ``nl.rand(shape, dtype=nl.bfloat16)`` was NSIM-E302 (np.issubdtype does not count ml_dtypes' bfloat16 as a
  float): any float dtype now, the values k / 2**nbits exact in it (python/nsim/nki/language.py ``rand``).
"""
import math
import warnings

import numpy as np
import pytest

from conftest import beta1_modules, executed_ops, require_core, sample_fixture  # noqa: E402
from conftest import op_counts as _ops  # noqa: E402

_core, ml_dtypes = require_core()
from numeric_helpers import close, f64 as _f64, randn as _randn, rounded  # noqa: E402

BF16 = ml_dtypes.bfloat16

tu = sample_fixture("training_utility_kernels.py", module_only=True)
tun = sample_fixture("training_utility_kernels_new.py", module_only=True)


def _run(k, *args):
    """Run kernel ``k`` with every warning (sanitizer reports included) an error."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return k(*args)


def _nonzero(shape, dtype, seed):
    """Standard normal values without exact zeros (a dropped element is then recognisable as 0)."""
    x = _randn(shape, np.float32, seed)
    x[x == 0] = 1.0
    x = x.astype(dtype)
    x[_f64(x) == 0] = 1.0
    return x


def _binomial_ok(kept, n, p, sigmas=5.0):
    """The number of kept elements ``kept`` of ``n`` is within ``sigmas`` binomial standard deviations of n (1 - p)."""
    return abs(kept - n * (1 - p)) <= sigmas * math.sqrt(n * p * (1 - p))


# --------------------------------------------------------------------------------------------------
# Dropout
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape,dtype,p", [
    ((1000, 3000), np.float32, 0.1),   # a ragged last row tile of 104 rows
    ((1024, 4096), BF16, 0.5),
    ((200, 512), np.float32, 0.3),
])
def test_dropout_regenerated_mask(tu, shape, dtype, p):
    """Forward and backward seeded identically drop the same elements; the keep fraction is binomial overall and per
    row tile; y = x * mask / (1 - p) with nsim's mask (read off y); different tiles get different masks."""
    x = _nonzero(shape, dtype, seed=shape[0])
    dy = _nonzero(shape, dtype, seed=shape[1])
    seed = np.array([1234], np.int32)
    y = _run(tu.dropout_fwd_kernel, x, seed, p)
    dx = _run(tu.dropout_bwd_kernel, dy, seed, p)
    assert y.dtype == np.dtype(dtype) and dx.dtype == np.dtype(dtype)
    mask = _f64(y) != 0
    np.testing.assert_array_equal(_f64(dx) != 0, mask)  # the backward regenerated the forward's mask
    n = mask.size
    assert _binomial_ok(mask.sum(), n, p), mask.mean()
    for t in range(0, shape[0], 128):
        tile = mask[t:t + 128]
        assert _binomial_ok(tile.sum(), tile.size, p), (t, tile.mean())
    if shape[0] > 128:  # each tile is seeded with seed + t: no two tiles alike
        n2 = min(128, shape[0] - 128)
        assert (mask[:n2] != mask[128:128 + n2]).mean() > 0.5 * 2 * p * (1 - p)
    scale = np.float32(1 / (1 - p))
    close(y, rounded(_f64(x) * mask * scale, dtype), dtype)
    close(dx, rounded(_f64(dy) * mask * scale, dtype), dtype)
    # the same seed reproduces the mask, another seed gives another one
    np.testing.assert_array_equal(tu.dropout_fwd_kernel(x, seed, p), y)
    other = _f64(tu.dropout_fwd_kernel(x, np.array([1235], np.int32), p)) != 0
    assert (other != mask).mean() > 0.5 * 2 * p * (1 - p)


def test_dropout_regenerated_structure(tu):
    """[1000, 3000]: one ``set_rng_seed`` and one ``dropout`` per row tile (8); x read once, y written once; the
    backward moves the same bytes (no mask in HBM)."""
    x = _nonzero((1000, 3000), np.float32, 1)
    seed = np.array([7], np.int32)
    tu.dropout_fwd_kernel(x, seed, 0.1)
    k = tu.dropout_fwd_kernel
    c = _ops(k)
    assert c["set_rng_seed"] == 8 and c["dropout"] == 8, c
    drops = [o for o in executed_ops(k.last_json["body"]) if o["op"] == "dropout"]
    assert [o["data"]["index"][0]["size"] for o in drops if isinstance(o["data"], dict)] == [104]
    prof = k.last_profile
    assert prof.stat("memory.hbm_read_bytes") == x.nbytes + seed.nbytes
    assert prof.stat("memory.hbm_write_bytes") == x.nbytes


@pytest.mark.parametrize("shape,dtype,p", [((1000, 3000), np.float32, 0.1), ((256, 4096), BF16, 0.25)])
def test_dropout_stored_mask(tu, shape, dtype, p):
    """``nl.rand`` >= p as a uint8 mask stored by the forward and reused by the backward: a 0/1 mask with a binomial
    keep fraction, y = x * mask / (1 - p) and dx = dy * mask / (1 - p) with that mask."""
    x = _nonzero(shape, dtype, seed=3)
    dy = _nonzero(shape, dtype, seed=4)
    y, mask = _run(tu.dropout_mask_fwd_kernel, x, np.array([99], np.int32), p)
    assert mask.dtype == np.uint8 and set(np.unique(mask)) <= {0, 1}
    assert _binomial_ok(int(mask.sum()), mask.size, p), mask.mean()
    np.testing.assert_array_equal(_f64(y) != 0, mask == 1)
    scale = 1 / (1 - p)
    close(y, rounded(_f64(x) * mask * scale, dtype), dtype)
    dx = _run(tu.dropout_mask_bwd_kernel, dy, mask, p)
    close(dx, rounded(_f64(dy) * mask * scale, dtype), dtype)
    # the backward reads the gradient and the 1-byte mask, writes dx
    prof = tu.dropout_mask_bwd_kernel.last_profile
    assert prof.stat("memory.hbm_read_bytes") == dy.nbytes + mask.nbytes
    assert prof.stat("memory.hbm_write_bytes") == dy.nbytes


# --------------------------------------------------------------------------------------------------
# Gradient clipping by global norm
# --------------------------------------------------------------------------------------------------

def _grads(seed=0):
    g0 = _randn((1024, 4096), np.float32, seed, scale=0.01)
    g1 = _randn((1000, 3000), BF16, seed + 1)           # ragged rows and a ragged 952-column chunk
    g2 = _randn((4096,), np.float32, seed + 2, scale=0.5)  # a bias, folded onto [128, 32]
    return g0, g1, g2


def ref_clip(grads, max_norm):
    norms = [np.sqrt((_f64(g) ** 2).sum()) for g in grads]
    total = math.sqrt(sum(n * n for n in norms))
    return norms, total, min(1.0, max_norm / (total + 1e-6))


@pytest.mark.parametrize("name", ["clip_grad_norm_kernel", "clip_grad_norm_pr_kernel"])
@pytest.mark.parametrize("max_norm", [1.0, 1e6])
def test_clip_grad_norm_matches_numpy(tu, name, max_norm):
    grads = _grads()
    out = _run(getattr(tu, name), *grads, max_norm)
    norms, total, s = ref_clip(grads, max_norm)
    np.testing.assert_allclose(out[3][0], norms + [total], rtol=1e-5)
    for g, o in zip(grads, out[:3]):
        assert o.shape == g.shape and o.dtype == g.dtype
        close(o, rounded(_f64(g) * s, g.dtype), g.dtype)
    if max_norm == 1e6:  # no clipping: every gradient comes back unchanged
        for g, o in zip(grads, out[:3]):
            np.testing.assert_array_equal(o, g)


def test_clip_grad_norm_structure(tu):
    """Two passes over every gradient: HBM reads = 2 x their bytes, writes = their bytes + the [1, 4] norms; one
    activation_reduce per tile of pass 1 (8 x 2 + 8 x 2 + 1 = 33), one tensor_scalar per tile of pass 2, and one
    cross-partition reduction (a ones matmul / a tensor_partition_reduce)."""
    grads = _grads(5)
    nbytes = sum(g.nbytes for g in grads)
    for name, red in (("clip_grad_norm_kernel", "nc_matmul"), ("clip_grad_norm_pr_kernel", "tensor_partition_reduce")):
        k = getattr(tu, name)
        k(*grads, 1.0)
        prof = k.last_profile
        assert prof.stat("memory.hbm_read_bytes") == 2 * nbytes
        assert prof.stat("memory.hbm_write_bytes") == nbytes + 16
        c = _ops(k)
        assert c["activation_reduce"] == 33 and c["tensor_scalar"] >= 33 and c[red] == 1, c
        assert c["dma_copy"] == 2 * 33 + 33 + 1


# --------------------------------------------------------------------------------------------------
# The nsim fix: a zero fill retargeted into a tile is not dropped by the next iteration's fill
# --------------------------------------------------------------------------------------------------

_FILL = '''
import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl


@nki.jit
def row_sums_sq(a, b):
  """out[:, 0] / out[:, 1]: per-partition sums of squares of a / b over their row tiles (b ragged)."""
  out = nl.ndarray((128, 2), dtype=nl.float32, buffer=nl.shared_hbm)
  acc = nl.zeros((128, 2), dtype=nl.float32)
  i_p = nl.arange(128)[:, None]
  for k, g in enumerate((a, b)):
    R, C = g.shape
    i_f = nl.arange(C)[None, :]
    for r in nl.sequential_range((R + 127) // 128):
      valid = (r * 128 + i_p < R)
      t = nl.load(g[r * 128 + i_p, i_f], mask=valid)
      part = nl.ndarray((128, 1), dtype=nl.float32)
      part[...] = nl.zeros((128, 1), dtype=nl.float32)
      nisa.activation_reduce(op=nl.square, data=t, reduce_op=nl.add, reduce_res=part, mask=valid)
      acc[:, k] = nl.add(acc[:, k], part)
  nl.store(out, value=acc)
  return out


@nki.jit
def rand_tile(seed, n, dtype):
  out = nl.ndarray((128, n), dtype=dtype, buffer=nl.shared_hbm)
  nl.random_seed(seed=nl.load(seed[0]))
  nl.store(out, value=nl.rand((128, n), dtype=dtype))
  return out
'''


@pytest.fixture(scope="module")
def fill(tmp_path_factory):
    path = tmp_path_factory.mktemp("fill") / "zero_fill_kernels.py"
    path.write_text(_FILL)
    with beta1_modules(str(path)) as (mod,):
        yield mod


@pytest.mark.parametrize("rows", [200, 300, 1000])
def test_zero_fill_before_masked_reduce_is_kept(fill, rows):
    """``part[...] = nl.zeros(..)`` then a masked reduction into ``part`` on a ragged tile followed by more tiles: the
    partitions outside the mask stay 0. (nsim dropped that memset when the next tile's ``nl.zeros`` reused the
    temporary's storage, so they held an earlier tile's sums: column 0 came out too large, column 1 right.)"""
    a = _randn((rows, 64), np.float32, 1)
    b = _randn((128, 64), np.float32, 2)
    out = _run(fill.row_sums_sq, a, b)
    want = np.zeros(128)
    rs = (_f64(a) ** 2).sum(1)
    for t in range(0, rows, 128):
        want[:min(128, rows - t)] += rs[t:t + 128]
    np.testing.assert_allclose(out[:, 0], want, rtol=1e-5)
    np.testing.assert_allclose(out[:, 1], (_f64(b) ** 2).sum(1), rtol=1e-5)
    memsets = [o for o in executed_ops(fill.row_sums_sq.last_json["body"])
               if o["op"] == "memset" and (o["dst"] if isinstance(o["dst"], str) else o["dst"]["tensor"]) != "acc"]
    assert len(memsets) >= 1  # the ragged tile's zeroing is there (the whole-tile ones may go: dead stores)


@pytest.mark.parametrize("shape,dtype", [((1000, 3000), np.float32), ((256, 1024), BF16), ((300, 500), np.float32)])
def test_clip_with_nl_operators_masked_accumulate(tu, shape, dtype):
    """``acc += nl.sum(..., mask=rows)`` where the row mask holds everywhere on the full tiles: nsim recursed
    without end (RecursionError) in ``Tensor.__iadd__`` (python/nsim/nki/beta1/language.py), because restricting a
    masked value to a box that is all of it returns the value itself, still marked masked. Now a plain add."""
    g = _randn(shape, dtype, shape[0], scale=0.02)
    out, stats = _run(tu.clip_grad_norm_nl_kernel, g, 1.0)
    _norms, total, s = ref_clip([g], 1.0)
    np.testing.assert_allclose(stats[0], [total, s], rtol=1e-5)
    close(out, rounded(_f64(g) * s, dtype), dtype)


@pytest.mark.parametrize("shape,p", [((1000, 3000), 0.3), ((200, 64), 0.5)])
def test_isa_dropout_under_mask(tu, shape, p):
    """Beta-1 ``nisa.dropout(x, prob=p_tile, mask=rows)`` (spec 2.4: Beta 1 takes ``mask=``) was NSIM-E446 "mask=
    is not supported yet here"; now it runs on the mask's rectangle like the other element-wise instructions:
    kept elements unchanged (no rescaling), a binomial keep fraction, and the rows of the ragged tile dropped as
    often as the others."""
    x = _nonzero(shape, np.float32, 8)
    y = _run(tu.dropout_isa_kernel, x, np.array([17], np.int32), p)
    keep = y != 0
    np.testing.assert_array_equal(y[keep], x[keep])
    assert _binomial_ok(keep.sum(), keep.size, p), keep.mean()
    last = keep[(shape[0] - 1) // 128 * 128:]
    assert _binomial_ok(last.sum(), last.size, p), last.mean()


@pytest.mark.parametrize("dtype,nbits", [(BF16, 8), (np.float16, 11), (np.float32, 24)])
def test_rand_in_narrow_float_dtypes(fill, dtype, nbits):
    """``nl.rand(shape, dtype=nl.bfloat16)`` was NSIM-E302 "dtype must be a float dtype" (numpy does not count
    ml_dtypes' bfloat16 as np.floating; python/nsim/nki/language.py ``rand``). Now any float dtype: uniform values
    k / 2**nbits with nbits the bits the dtype holds exactly (bf16: 8), so none rounds up to 1.0; fp32 unchanged."""
    u = _f64(_run(fill.rand_tile, np.array([5], np.int32), 2048, dtype))
    assert u.min() >= 0.0 and u.max() < 1.0
    k = u * 2 ** nbits
    np.testing.assert_array_equal(k, np.round(k))
    assert abs(u.mean() - 0.5) < 5 * math.sqrt(1 / 12 / u.size)
    if nbits == 8:
        assert len(np.unique(k)) == 256  # every level is drawn


# --------------------------------------------------------------------------------------------------
# LAMB (new dialect)
# --------------------------------------------------------------------------------------------------

LAMB = dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-6, weight_decay=0.01)


def ref_lamb(w, g, m, v, lr, beta1, beta2, eps, weight_decay, step):
    w, g, m, v = _f64(w), _f64(g), _f64(m), _f64(v)
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    u = (m / (1 - beta1 ** step)) / (np.sqrt(v / (1 - beta2 ** step)) + eps) + weight_decay * w
    wn, un = np.linalg.norm(w), np.linalg.norm(u)
    trust = wn / un if wn > 0 and un > 0 else 1.0
    return w - lr * trust * u, m, v, np.array([wn, un, trust])


def _lamb_state(shape, seed, zero_w=False):
    rng = np.random.default_rng(seed)
    w = np.zeros(shape, np.float32) if zero_w else rng.standard_normal(shape).astype(np.float32)
    g = rng.standard_normal(shape).astype(np.float32)
    m = (rng.standard_normal(shape) * 0.1).astype(np.float32)
    v = (rng.random(shape) * 0.01).astype(np.float32)
    return w, g, m, v


@pytest.mark.parametrize("shape,step,zero_w", [
    ((1024, 4096), 3, False),
    ((1000, 3000), 1, False),    # ragged rows and columns
    ((300, 700), 100, False),
    ((256, 512), 2, True),       # w = 0: trust ratio 1
])
def test_lamb_matches_numpy(tun, shape, step, zero_w):
    state = _lamb_state(shape, seed=shape[0] + step, zero_w=zero_w)
    out = _run(tun.lamb_step, *state, LAMB["lr"], LAMB["beta1"], LAMB["beta2"], LAMB["eps"],
               LAMB["weight_decay"], step)
    want = ref_lamb(*state, step=step, **LAMB)
    np.testing.assert_allclose(out[3][0], want[3], rtol=1e-5)
    if zero_w:
        assert out[3][0, 2] == 1.0
    for got, w in zip(out[:3], want[:3]):
        np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-7)


def test_lamb_traffic_and_structure(tun):
    """[1000, 3000]: pass 1 reads w, g, m, v and writes m', v', u; pass 2 reads w, u and writes w': HBM reads 6 x,
    writes 4 x the tensor's bytes (+ the 12-byte stats); one ones matmul for both norms; 2 activation_reduce per
    tile (8 x 2 tiles)."""
    state = _lamb_state((1000, 3000), seed=9)
    tun.lamb_step(*state, LAMB["lr"], LAMB["beta1"], LAMB["beta2"], LAMB["eps"], LAMB["weight_decay"], 5)
    k = tun.lamb_step
    prof = k.last_profile
    nb = state[0].nbytes
    assert prof.stat("memory.hbm_read_bytes") == 6 * nb
    assert prof.stat("memory.hbm_write_bytes") == 4 * nb + 12
    c = _ops(k)
    assert c["nc_matmul"] == 1 and c["activation_reduce"] == 2 * 16, c


# --------------------------------------------------------------------------------------------------
# Adafactor (new dialect)
# --------------------------------------------------------------------------------------------------

def ref_adafactor(w, g, r, c, lr=1e-2, beta2=0.999, eps1=1e-30, clip_threshold=1.0):
    w, g, r, c = _f64(w), _f64(g), _f64(r), _f64(c)
    g2 = g * g + eps1
    r = beta2 * r + (1 - beta2) * g2.mean(1)
    c = beta2 * c + (1 - beta2) * g2.mean(0)
    u = g / np.sqrt(np.outer(r, c) / r.mean())
    rms = np.sqrt((u * u).mean())
    return w - lr * u / max(1.0, rms / clip_threshold), r, c, rms


def _adafactor_state(shape, seed, gscale=1.0):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(shape).astype(np.float32)
    g = (rng.standard_normal(shape) * gscale).astype(np.float32)
    r = (rng.random(shape[0]) * 0.5 + 0.5).astype(np.float32)
    c = (rng.random(shape[1]) * 0.5 + 0.5).astype(np.float32)
    return w, g, r, c


@pytest.mark.parametrize("shape,gscale", [((1024, 4096), 1.0), ((1000, 3000), 1.0), ((300, 700), 1e-3)])
def test_adafactor_matches_numpy(tun, shape, gscale):
    """Factored second moment (row / column means of g^2), the outer-product v, update clipping by RMS; with tiny
    gradients and old state the RMS is < 1 and the update is not clipped."""
    state = _adafactor_state(shape, seed=shape[1], gscale=gscale)
    w, r, c, rms = _run(tun.adafactor_step, *state)
    want = ref_adafactor(*state)
    assert r.shape == (shape[0],) and c.shape == (shape[1],)
    np.testing.assert_allclose(rms[0, 0], want[3], rtol=1e-5)
    assert (want[3] > 1.0) == (gscale == 1.0)
    for got, ref in zip((w, r, c), want[:3]):
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-7 * np.abs(ref).max())


def test_adafactor_traffic_and_structure(tun):
    """[1000, 3000]: g read twice (the statistics pass and the update pass), w and the u scratch once; u, w', r', c'
    and the RMS written. Per row tile (8) one column-sum matmul and one outer-product matmul per 512 columns (6),
    one r' transpose; two ones matmuls over the partitions (mean(r'), sum(u^2))."""
    state = _adafactor_state((1000, 3000), seed=4)
    tun.adafactor_step(*state)
    k = tun.adafactor_step
    nb = state[0].nbytes
    prof = k.last_profile
    assert prof.stat("memory.hbm_read_bytes") == 4 * nb + state[2].nbytes + state[3].nbytes
    assert prof.stat("memory.hbm_write_bytes") == 2 * nb + state[2].nbytes + state[3].nbytes + 4
    c = _ops(k)
    assert c["nc_matmul"] == 2 * 8 * 6 + 2 and c["nc_transpose"] == 8, c


# --------------------------------------------------------------------------------------------------
# Dropout in the new dialect (nisa.dropout)
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape,dtype,p", [((1000, 3000), np.float32, 0.2), ((256, 2048), BF16, 0.1)])
def test_new_dialect_dropout_regenerated_mask(tu, tun, shape, dtype, p):
    """``nisa.dropout`` seeded per row tile: the backward regenerates the forward's mask, the keep fraction is
    binomial, and the same seeds give the same mask as the Beta-1 ``nl.dropout`` kernel (the same instruction
    stream: set_rng_seed then dropout on VectorE)."""
    x = _nonzero(shape, dtype, 6)
    dy = _nonzero(shape, dtype, 7)
    seed = np.array([21], np.int32)
    y = _run(tun.dropout_fwd, x, seed, p)
    dx = _run(tun.dropout_bwd, dy, seed, p)
    mask = _f64(y) != 0
    np.testing.assert_array_equal(_f64(dx) != 0, mask)
    assert _binomial_ok(mask.sum(), mask.size, p), mask.mean()
    close(y, rounded(_f64(x) * mask * np.float32(1 / (1 - p)), dtype), dtype)
    np.testing.assert_array_equal(_f64(tu.dropout_fwd_kernel(x, seed, p)) != 0, mask)


# --------------------------------------------------------------------------------------------------
# Fused bias + GELU
# --------------------------------------------------------------------------------------------------

_K, _C = math.sqrt(2 / math.pi), 0.044715
_erf = np.vectorize(math.erf, otypes=[np.float64])


def ref_gelu(z, approximate):
    if approximate:
        return 0.5 * z * (1 + np.tanh(_K * (z + _C * z ** 3)))
    return 0.5 * z * (1 + _erf(z / math.sqrt(2)))


def ref_gelu_dx(z, approximate):
    if approximate:
        th = np.tanh(_K * (z + _C * z ** 3))
        return 0.5 * (1 + th) + 0.5 * z * (1 - th * th) * _K * (1 + 3 * _C * z * z)
    return 0.5 * (1 + _erf(z / math.sqrt(2))) + z * np.exp(-z * z / 2) / math.sqrt(2 * math.pi)


def _gelu_inputs(shape, seed):
    x = _randn(shape, BF16, seed, scale=1.5)
    bias = _randn((shape[0],), BF16, seed + 1, scale=0.5)
    dy = _randn(shape, BF16, seed + 2)
    return x, bias, dy


@pytest.mark.parametrize("shape,approximate", [
    ((1024, 4096), True),
    ((1000, 3000), True),    # ragged features (partitions) and a ragged 952-column chunk
    ((1000, 3000), False),
])
def test_bias_gelu_fwd_bwd_matches_numpy(tu, shape, approximate):
    x, bias, dy = _gelu_inputs(shape, seed=shape[1])
    z = _f64(x) + _f64(bias)[:, None]
    y = _run(tu.bias_gelu_fwd_kernel, x, bias, approximate)
    assert y.dtype == BF16
    close(y, ref_gelu(z, approximate), BF16)
    dx, dbias = _run(tu.bias_gelu_bwd_kernel, x, bias, dy, approximate)
    assert dx.dtype == BF16 and dbias.dtype == np.float32 and dbias.shape == (shape[0],)
    d = _f64(dy) * ref_gelu_dx(z, approximate)
    close(dx, d, BF16)
    # dbias sums N fp32 terms: relative to the sum of their magnitudes
    np.testing.assert_allclose(dbias, d.sum(1), rtol=0, atol=1e-5 * np.abs(d).sum(1).max())


def test_bias_gelu_tanh_and_erf_differ(tu):
    """The approximation is honoured: the tanh kernel matches the tanh formula better than the erf one where they
    differ most (|z| ~ 2)."""
    x = np.tile(np.linspace(-3, 3, 512, dtype=np.float32), (128, 1))
    bias = np.zeros(128, np.float32)
    ya = tu.bias_gelu_fwd_kernel(x, bias, True)
    ye = tu.bias_gelu_fwd_kernel(x, bias, False)
    np.testing.assert_allclose(ya, ref_gelu(_f64(x), True), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ye, ref_gelu(_f64(x), False), rtol=1e-5, atol=1e-6)
    assert np.abs(_f64(ya) - _f64(ye)).max() > 1e-4


def test_fused_bias_gelu_moves_fewer_bytes_and_is_faster(tu):
    """[1024, 4096] bf16: the fused kernel reads x and the bias and writes y; bias_add then gelu also write and
    re-read the intermediate z: 2 x x.nbytes more traffic, and the fused kernel takes less time than the two."""
    x, bias, _dy = _gelu_inputs((1024, 4096), seed=11)
    y = tu.bias_gelu_fwd_kernel(x, bias, True)
    fused = tu.bias_gelu_fwd_kernel.last_profile
    z = tu.bias_add_kernel(x, bias)
    p1 = tu.bias_add_kernel.last_profile
    y2 = tu.gelu_kernel(z, True)
    p2 = tu.gelu_kernel.last_profile
    close(y2, _f64(y), BF16)
    assert fused.stat("memory.hbm_read_bytes") == x.nbytes + bias.nbytes
    assert fused.stat("memory.hbm_write_bytes") == x.nbytes
    unf_r = p1.stat("memory.hbm_read_bytes") + p2.stat("memory.hbm_read_bytes")
    unf_w = p1.stat("memory.hbm_write_bytes") + p2.stat("memory.hbm_write_bytes")
    assert unf_r == 2 * x.nbytes + bias.nbytes and unf_w == 2 * x.nbytes
    assert fused.total_time_ns < p1.total_time_ns + p2.total_time_ns
    # one ScalarE activation per tile does bias and GELU: 8 feature tiles x 2 column chunks
    assert _ops(tu.bias_gelu_fwd_kernel)["activation"] == 16
