"""LNC=2 work-splitting patterns written like public trn2 NKI kernels (tests/python/kernels/lnc2_split_kernels_new.py,
new dialect, launched ``kernel[2]`` / ``kernel[nl.nc(2)]``, and lnc2_split_kernels.py, Beta 1, launched
``kernel[nl.nc(2)]``; both unmodified, through ``nsim.compat``). A logical core is two physical cores running the
same kernel, ``nl.program_id(0)`` the core, HBM shared, SBUF/PSUM private:

- split-K GEMM (new dialect): each core accumulates half of K in PSUM, the partials reduce-scattered SBUF to SBUF by
  ``nisa.sendrecv`` or through a shared HBM scratch and ``nisa.core_barrier``; against the one-core launch of the
  same kernel (all of K on one core);
- split-M GEMM (Beta 1): the M tiles dealt to the cores of an ``nl.nc(2)`` grid, no reduction;
- softmax over very long rows (new dialect): each core its half of the columns, the [R, 2] (max, sum exp) stats
  exchanged by ``sendrecv`` and combined as in online softmax;
- ragged row splits: 300 rows, core 0 rows 0..255 and core 1 the 44-row partial tile (Beta-1 RMSNorm with
  ``mask=``; new dialect with ``[:rows]`` slices), the new-dialect one all-gathering its rows in a shared HBM tensor,
  then ``core_barrier`` and each core reading the whole of it back (column sums);
- the race: the same all-gather without the barrier is reported by the sanitizer as NSIM-W506 dma-race (core 1, with
  less work, reads rows core 0 has not stored yet; also for 512 balanced rows, where the unordered accesses do not
  overlap in simulated time); with the barrier nothing is reported.

Also covered: ``core_barrier(engine=)`` on GpSimd (default), Sync, Scalar, Vector (Tensor refused, NSIM-E306), the
stats exchange by the GpSimd DMA (``dma_engine=nisa.dma_engine.gpsimd_dma``), Beta-1 grids of four instances on two
cores (``nl.spmd_dim(nl.nc(2), 2)``, ``nl.nc(2) * 2``), and a ragged split where core 1's share is empty (100 rows).

Checked: outputs against float64 numpy (fp32 1e-5 relative to the largest element for the K sums, bf16 1e-2), the
two-core launches giving the one-core results, no sanitizer report (``check=True``, every warning an error), the
instruction counts the split implies on each core (matmuls, rendezvous, DMAs), HBM bytes (operands read once,
scratch traffic only with the barrier combine), one rendezvous per exchange, and the timing: the compute-bound
split-K GEMM and the split-M GEMM faster on two cores than on one, the ``sendrecv`` combine faster than the HBM
round trip.

nsim needed no fix for this family (everything above ran as written)."""
import collections
import warnings

import numpy as np
import pytest

from conftest import executed_ops, require_core, sample_fixture  # noqa: E402
from conftest import run_clean as _run  # noqa: E402

_core, ml_dtypes = require_core()
from numeric_helpers import close, close_to_max, f64 as _f64, randn as _randn  # noqa: E402

BF16 = ml_dtypes.bfloat16

ls = sample_fixture("lnc2_split_kernels.py")
lsn = sample_fixture("lnc2_split_kernels_new.py", module_only=True)


def _launch(k, grid, nl):
    k = k.options(check=True)
    return {None: k, "1": k[1], "2": k[2], "nc2": k[nl.nc(2)]}[grid]


def _bodies(kernel):
    j = kernel.last_json
    return [p["body"] for p in j["core_programs"]] if "core_programs" in j else [j["body"]]


def _ops(kernel):
    """Instruction counts of the last run summed over the cores."""
    return collections.Counter(o["op"] for b in _bodies(kernel) for o in executed_ops(b))


def _core_ops(kernel):
    """Per core instruction counts of the last run."""
    return [collections.Counter(o["op"] for o in executed_ops(b)) for b in _bodies(kernel)]


# --------------------------------------------------------------------------------------------------
# Split-K GEMM (new dialect)
# --------------------------------------------------------------------------------------------------

def ref_mm(aT, b):
    return _f64(aT).T @ _f64(b)


@pytest.mark.parametrize("grid,combine", [(None, "sendrecv"), ("2", "sendrecv"), ("2", "barrier"),
                                          ("nc2", "sendrecv"), ("nc2", "barrier")])
@pytest.mark.parametrize("K,M,N,dtype", [
    (1024, 256, 512, BF16),      # 4 contraction tiles per core, one M tile finished by each
    (512, 512, 256, np.float32),  # 2 contraction tiles per core, two M tiles each
])
def test_splitk_matmul_matches_numpy(lsn, grid, combine, K, M, N, dtype):
    aT = _randn((K, M), dtype, seed=K + M)
    b = _randn((K, N), dtype, seed=N)
    k = lsn.splitk_matmul
    out = _run(_launch(k, grid, lsn.nl), aT, b, combine)
    assert out.shape == (M, N) and out.dtype == np.float32
    close_to_max(out, ref_mm(aT, b), np.float32)   # fp32 accumulation of exact products
    two = grid is not None
    c = _ops(k)
    KT, MT = K // 128, M // 128
    assert c["nc_matmul"] == KT * MT, c              # the K tiles split, none repeated
    assert c["sendrecv"] == (2 if two and combine == "sendrecv" else 0), c
    assert c["core_barrier"] == (2 if two and combine == "barrier" else 0), c
    # loads: one per K tile of each operand; stores: one per M tile; the scratch: each core half its M tiles
    # each way
    scratch = 2 * MT if two and combine == "barrier" else 0
    assert c["dma_copy"] == 2 * KT + MT + scratch, c
    if two:
        per_core = _core_ops(k)
        assert len(per_core) == 2 and per_core[0] == per_core[1], per_core
        assert k.last_profile.stat("lnc.rendezvous") == 1


def test_splitk_matmul_two_cores_faster(lsn):
    """A compute-bound size (bf16 [2048 x 512] x [2048 x 512]: the one-core launch is bound by the PE array): both
    two-core launches give the one-core result to fp32 rounding and are faster, ``sendrecv`` faster than the
    HBM scratch round trip; operands read once from HBM in every launch, scratch bytes only with the barrier."""
    K, M, N = 2048, 512, 512
    aT = _randn((K, M), BF16, seed=1)
    b = _randn((K, N), BF16, seed=2)
    k = lsn.splitk_matmul
    o1 = _run(k.options(check=True), aT, b)
    p1 = k.last_profile
    assert p1.bound == "tensor", p1.bound
    o_sr = _run(k.options(check=True)[2], aT, b, "sendrecv")
    p_sr = k.last_profile
    o_b = _run(k.options(check=True)[2], aT, b, "barrier")
    p_b = k.last_profile
    want = ref_mm(aT, b)
    for o in (o1, o_sr, o_b):
        close_to_max(o, want, np.float32)
    np.testing.assert_array_equal(o_sr, o_b)        # the same partials added in the same order
    operands = aT.nbytes + b.nbytes
    half = M * N * 4 // 2
    assert p1.stat("memory.hbm_read_bytes") == operands
    assert p_sr.stat("memory.hbm_read_bytes") == operands
    assert p_b.stat("memory.hbm_read_bytes") == operands + 2 * half
    assert p_sr.stat("memory.hbm_write_bytes") == M * N * 4
    assert p_b.stat("memory.hbm_write_bytes") == M * N * 4 + 2 * half
    t1, t_sr, t_b = p1.total_time_ns, p_sr.total_time_ns, p_b.total_time_ns
    assert t_sr < 0.85 * t1, (t1, t_sr)
    assert t_b < t1, (t1, t_b)
    assert t_sr < t_b, (t_sr, t_b)
    assert p_sr.stat("lnc.imbalance_percent") < 5


@pytest.mark.parametrize("engine", ["default", "sync", "scalar", "vector"])
def test_splitk_barrier_engines(lsn, engine):
    """``core_barrier(..., engine=)`` on each engine it may block (GpSimd by default): the same bits, the barrier
    recorded on that engine on both cores; the tensor engine is refused (NSIM-E306)."""
    K, M, N = 512, 256, 256
    aT = _randn((K, M), np.float32, seed=21)
    b = _randn((K, N), np.float32, seed=22)
    k = lsn.splitk_matmul
    eng = None if engine == "default" else getattr(lsn.nisa.engine, engine)
    out = _run(k.options(check=True)[2], aT, b, "barrier", eng)
    close_to_max(out, ref_mm(aT, b), np.float32)
    barriers = [o for body in _bodies(k) for o in executed_ops(body) if o["op"] == "core_barrier"]
    assert [o["engine"] for o in barriers] == 2 * ["gpsimd" if engine == "default" else engine], barriers
    with pytest.raises(Exception, match="E306"):
        k[2](aT, b, "barrier", lsn.nisa.engine.tensor)


# --------------------------------------------------------------------------------------------------
# Split-M GEMM (Beta 1, nl.nc(2) grid)
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [BF16, np.float32])
def test_split_m_matmul_beta1(ls, dtype):
    m = ls[0]
    K, M, N = 512, 512, 512
    aT = _randn((K, M), dtype, seed=3)
    b = _randn((K, N), dtype, seed=4)
    k = m.split_m_matmul
    o1 = _run(_launch(k, "1", m.nl), aT, b)
    p1 = k.last_profile
    o2 = _run(_launch(k, "nc2", m.nl), aT, b)
    p2 = k.last_profile
    want = ref_mm(aT, b)
    close_to_max(o1, want, np.float32)
    np.testing.assert_array_equal(o2, o1)
    assert p2.stat("lnc.cores") == 2
    # each core: its 2 M tiles x 4 K tiles of matmuls
    per_core = _core_ops(k)
    assert [c["nc_matmul"] for c in per_core] == [8, 8], per_core
    assert p2.total_time_ns < 0.75 * p1.total_time_ns, (p1.total_time_ns, p2.total_time_ns)
    # a grid of 4 instances, two per core (nl.spmd_dim(nl.nc(2), 2) and nl.nc(2) * 2): the same result and the
    # same per-core work
    for grid in (m.nl.spmd_dim(m.nl.nc(2), 2), m.nl.nc(2) * 2):
        o4 = _run(k.options(check=True)[grid], aT, b)
        np.testing.assert_array_equal(o4, o1)
        assert [c["nc_matmul"] for c in _core_ops(k)] == [8, 8]


# --------------------------------------------------------------------------------------------------
# Long-row softmax split over the columns (new dialect)
# --------------------------------------------------------------------------------------------------

def ref_softmax(x):
    x = _f64(x)
    e = np.exp(x - x.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


@pytest.mark.parametrize("grid", [None, "2", "nc2"])
@pytest.mark.parametrize("R,L,dtype", [
    (128, 4096, np.float32),   # 4 tiles of 512 columns per core
    (100, 2048, BF16),         # partial partitions, 2 tiles per core
])
def test_split_row_softmax_matches_numpy(lsn, grid, R, L, dtype):
    x = _randn((R, L), dtype, seed=R + L, scale=4.0)
    # the row maximum in core 1's half for some rows, in core 0's for others
    xf = x.astype(np.float32)
    xf[:R // 2, L - 3] = 20.0
    xf[R // 2:, 5] = 20.0
    x = xf.astype(dtype)
    k = lsn.split_row_softmax
    out = _run(_launch(k, grid, lsn.nl), x)
    assert out.shape == (R, L) and out.dtype == np.dtype(dtype)
    close_to_max(out, ref_softmax(x), dtype)
    np.testing.assert_allclose(_f64(out).sum(1), 1.0, rtol=1e-4 if dtype == np.float32 else 2e-2)
    c = _ops(k)
    NT = L // 512
    assert c["sendrecv"] == (2 if grid else 0), c
    assert c["dma_copy"] == 2 * NT, c     # each column tile loaded once and stored once, over both cores
    assert c["activation"] == NT + (4 if grid else 0), c


def test_split_row_softmax_two_cores(lsn):
    """[128, 8192] fp32: the two-core launch is faster than one core and agrees with it to fp32 rounding."""
    x = _randn((128, 8192), np.float32, seed=9, scale=3.0)
    k = lsn.split_row_softmax
    o1 = _run(k.options(check=True), x)
    p1 = k.last_profile
    o2 = _run(k.options(check=True)[2], x)
    p2 = k.last_profile
    close_to_max(o2, _f64(o1), np.float32)
    assert p2.stat("lnc.rendezvous") == 1
    assert p2.total_time_ns < 0.75 * p1.total_time_ns, (p1.total_time_ns, p2.total_time_ns)
    # the 8-byte stats by the GpSimd DMA instead: the same bits, the exchange triggered from GpSimd
    o3 = _run(k.options(check=True)[2], x, True)
    np.testing.assert_array_equal(o3, o2)
    sr = [o for body in _bodies(k) for o in executed_ops(body) if o["op"] == "sendrecv"]
    assert [o["engine"] for o in sr] == ["gpsimd", "gpsimd"], sr


# --------------------------------------------------------------------------------------------------
# Ragged row splits, all-gather through shared HBM, and the race without the barrier
# --------------------------------------------------------------------------------------------------

def ref_rms(a, g=None, eps=0.0):
    a = _f64(a)
    r = a / np.sqrt((a * a).mean(1, keepdims=True) + eps)
    return r if g is None else r * _f64(g)


@pytest.mark.parametrize("grid", ["1", "nc2"])
@pytest.mark.parametrize("N,D,dtype", [(300, 256, np.float32), (300, 512, BF16), (130, 128, np.float32),
                                       (100, 128, np.float32)])
def test_ragged_rmsnorm_beta1(ls, grid, N, D, dtype):
    """Beta 1, masks: 300 rows = core 0 two full tiles, core 1 the 44-row tile; 130 rows = core 1 only 2 rows;
    100 rows = one partial tile, all on core 0 (core 1 runs the kernel with an empty share)."""
    m = ls[0]
    a = _randn((N, D), dtype, seed=N + D)
    g = np.random.default_rng(D).random((1, D)).astype(dtype)
    k = m.ragged_rmsnorm
    out = _run(_launch(k, grid, m.nl), a, g)
    assert out.shape == (N, D) and out.dtype == np.dtype(dtype)
    close(out, ref_rms(a, g), dtype)
    NT = (N + 127) // 128
    per_core = _core_ops(k)
    loads = [c["dma_copy"] for c in per_core]
    if grid == "nc2":
        t0 = (NT + 1) // 2
        assert loads == [1 + 2 * t0, 1 + 2 * (NT - t0)], loads   # the weight, then a load + a store per tile
    else:
        assert loads == [1 + 2 * NT], loads


@pytest.mark.parametrize("grid", ["2", "nc2"])
@pytest.mark.parametrize("N,D,dtype", [(300, 256, np.float32), (300, 128, BF16), (512, 256, np.float32),
                                       (100, 128, np.float32)])   # core 1 writes none of y, reads all of it
def test_ragged_allgather_matches_numpy(lsn, grid, N, D, dtype):
    x = _randn((N, D), dtype, seed=N * D)
    k = lsn.ragged_rows_allgather
    y, colsum = _run(_launch(k, grid, lsn.nl), x)
    want = ref_rms(x, eps=1e-6)
    close(y, want, dtype)
    assert colsum.shape == (2, D)
    # each core's column sums of the whole gathered y (as stored, in its dtype)
    cs = _f64(y).sum(0)
    for p in range(2):
        close_to_max(colsum[p], cs, np.float32)
    NT = (N + 127) // 128
    t0 = (NT + 1) // 2
    per_core = _core_ops(k)
    # own tiles: a load and a store each; after the barrier every tile loaded; one column-sum store
    assert [c["dma_copy"] for c in per_core] == [2 * t0 + NT + 1, 2 * (NT - t0) + NT + 1], per_core
    assert [c["core_barrier"] for c in per_core] == [1, 1]
    assert [c["nc_matmul"] for c in per_core] == [NT, NT]
    assert k.last_profile.stat("lnc.rendezvous") == 1


def test_allgather_without_barrier_is_a_dma_race(lsn):
    """The all-gather with the barrier removed: core 1 (one 44-row tile to write) reads core 0's rows of y before
    core 0 stores them. The sanitizer reports NSIM-W506 dma-race on y naming both cores; with the barrier there is
    no report."""
    N, D = 300, 256
    x = _randn((N, D), np.float32, seed=11)
    k = lsn.ragged_rows_allgather
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _y, _cs = k.options(check=True)[2](x, False)
    reps = k.last_profile.check_reports
    assert reps, "no sanitizer report for the missing barrier"
    assert {r["check"] for r in reps} == {"dma-race"}, reps
    assert all(r["code"] == "NSIM-W506" and r["tensor"] == "y" for r in reps), reps
    assert any("core 0" in r["op"] or "core 0" in r["detail"] for r in reps)
    assert any("core 1" in r["op"] or "core 1" in r["detail"] for r in reps)
    assert len(caught) == len(reps)
    # with the barrier: no report, and both cores see every row
    y, cs = _run(k.options(check=True)[2], x, True)
    assert k.last_profile.check_reports == []
    close(y, ref_rms(x, eps=1e-6), np.float32)
    close_to_max(cs[1], _f64(y).sum(0), np.float32)


def test_allgather_race_reported_without_time_overlap(lsn):
    """512 rows (two tiles per core, balanced): core 1's read of core 0's rows and core 0's store of them do not
    overlap in simulated time, but nothing orders them: still NSIM-W506 (the rule is about ordering, not about
    the schedule nsim happened to produce)."""
    x = _randn((512, 256), np.float32, seed=12)
    k = lsn.ragged_rows_allgather
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        k.options(check=True)[2](x, False)
    reps = k.last_profile.check_reports
    assert reps and all(r["code"] == "NSIM-W506" and r["tensor"] == "y" for r in reps), reps
    _run(k.options(check=True)[2], x, True)
    assert k.last_profile.check_reports == []
