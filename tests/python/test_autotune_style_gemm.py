"""The blocked GEMM written in the style of awslabs/nki-autotune (tests/python/kernels/autotune_style_gemm.py, Beta-1
dialect, run through ``nsim.compat``) swept over its tuning knobs the way that autotuner sweeps them: outputs
against numpy for every loop order, both lhs layouts, fp32 and bf16 and several block shapes; then the timing
facts an autotuner user relies on, each derived below from the kernel's structure: the matmul count does not
depend on the knobs, the HBM bytes follow the kernel's traffic model, larger blocks move fewer bytes and are not
slower, the ranking of four configurations is stable and explained by bytes / DMA descriptors / buffering, the
``nki.benchmark`` latency is the simulated time, and ``nsim.sweep`` runs the same grid."""
import numpy as np
import pytest

from conftest import executed_ops, require_core, sample_fixture  # noqa: E402

_core, ml_dtypes = require_core()
from numeric_helpers import close, rounded  # noqa: E402

BF16 = ml_dtypes.bfloat16


at = sample_fixture("autotune_style_gemm.py")


def _ints(shape, seed):
    """Small integers as fp32: every product and partial sum below is an exact fp32 integer (< 2^24), so the
    fp32 result is exact whatever the accumulation order."""
    return np.random.default_rng(seed).integers(-4, 5, shape).astype(np.float32)


def _inputs(K, M, N, dtype, transposed_lhs, seed=0):
    if dtype == np.float32:
        a, b = _ints((K, M), seed), _ints((K, N), seed + 1)
    else:
        rng = np.random.default_rng(seed)
        a, b = rng.standard_normal((K, M)).astype(dtype), rng.standard_normal((K, N)).astype(dtype)
    return (a if transposed_lhs else np.ascontiguousarray(a.T)), b


def _want(a, b, transposed_lhs):
    """numpy's product (float64), independent of the kernel's helpers."""
    x = np.asarray(a, np.float64)
    return (x.T if transposed_lhs else x) @ np.asarray(b, np.float64)


CFGS = [dict(TILES_IN_BLOCK_M=1, TILES_IN_BLOCK_N=1, TILES_IN_BLOCK_K=1),
        dict(TILES_IN_BLOCK_M=2, TILES_IN_BLOCK_N=1, TILES_IN_BLOCK_K=2, BUFFER_K=1),
        dict(TILES_IN_BLOCK_M=2, TILES_IN_BLOCK_N=2, TILES_IN_BLOCK_K=4, BUFFER_M=1, BUFFER_N=3)]


@pytest.mark.parametrize("cfg", CFGS)
@pytest.mark.parametrize("loop_order", ["MNK", "NMK", "MKN", "KMN"])
@pytest.mark.parametrize("transposed_lhs", [True, False])
def test_gemm_fp32_exact(at, cfg, loop_order, transposed_lhs):
    """K=512, M=256, N=1024: every loop order and block shape (1 to 4 K blocks, 1 or 2 N blocks), lhs given as
    lhsT [K, M] or as [M, K] (then transposed tile by tile on the PE): exact with integer-valued fp32 inputs."""
    mod = at[0]
    a, b = _inputs(512, 256, 1024, np.float32, transposed_lhs, seed=len(loop_order))
    out = mod.matmul_main(a, b, loop_order=loop_order, transposed_lhs=transposed_lhs, **cfg)
    assert out.shape == (256, 1024) and out.dtype == np.float32
    np.testing.assert_array_equal(out, _want(a, b, transposed_lhs))


@pytest.mark.parametrize("loop_order,transposed_lhs,cfg", [
    ("MNK", True, dict(TILES_IN_BLOCK_M=4, TILES_IN_BLOCK_N=2, TILES_IN_BLOCK_K=4)),
    ("NMK", False, dict(TILES_IN_BLOCK_M=2, TILES_IN_BLOCK_N=1, TILES_IN_BLOCK_K=8)),
    ("MKN", True, dict(TILES_IN_BLOCK_M=8, TILES_IN_BLOCK_N=1, TILES_IN_BLOCK_K=2)),
    ("KMN", False, dict(TILES_IN_BLOCK_M=2, TILES_IN_BLOCK_N=2, TILES_IN_BLOCK_K=2, BUFFER_N=1)),
])
def test_gemm_bf16_matches_numpy(at, loop_order, transposed_lhs, cfg):
    """bf16 in and out, K=1024, M=1024, N=2048, standard normal inputs: the fp32 accumulation (PSUM, then the
    fp32 SBUF result block) rounded once to bf16 at the store."""
    mod = at[0]
    a, b = _inputs(1024, 1024, 2048, BF16, transposed_lhs, seed=3)
    out = mod.matmul_main(a, b, loop_order=loop_order, transposed_lhs=transposed_lhs, **cfg)
    assert out.shape == (1024, 2048) and out.dtype == np.dtype(BF16)
    close(out, rounded(_want(a, b, transposed_lhs), BF16), BF16)


def test_gemm_rejects_shapes_not_multiple_of_block(at):
    """The compatibility check of the library: M=256 is not a multiple of BLOCK_M = 4 x 128."""
    mod = at[0]
    a, b = _inputs(256, 256, 512, np.float32, True)
    with pytest.raises(AssertionError, match="BLOCK_M"):
        mod.matmul_main(a, b, TILES_IN_BLOCK_M=4, TILES_IN_BLOCK_N=1, TILES_IN_BLOCK_K=1)


@pytest.mark.parametrize("shape", [(512, 256, 1024), (1024, 512, 2048)])
@pytest.mark.parametrize("cfg", CFGS + [dict(TILES_IN_BLOCK_M=2, TILES_IN_BLOCK_N=2, TILES_IN_BLOCK_K=4,
                                             loop_order="KMN")])
def test_matmul_count_independent_of_knobs(at, shape, cfg):
    """Every (M tile, N tile) pair of the result gets one PSUM accumulation group of K/128 nc_matmuls, whatever
    the blocking, the buffering or the loop order: (M/128) (N/512) (K/128) matmuls ([128, 128] stationary,
    [128, 512] moving), each a LoadStationary + MultiplyMoving pair on the PE. The PSUM groups are added into the
    SBUF result once per K block: (K / BLOCK_K) (M/128) (N/512) tensor_tensor adds from PSUM."""
    mod = at[0]
    K, M, N = shape
    a, b = _inputs(K, M, N, BF16, True)
    mod.matmul_main(a, b, **cfg)
    prof = mod.matmul_main.last_profile
    n_mm = (M // 128) * (N // 512) * (K // 128)
    assert prof.stat("engine.matmul_instruction_count") == n_mm
    assert prof.stat("engine.tensor.instruction_count") == 2 * n_mm
    ops = executed_ops(mod.matmul_main.last_json["body"])
    assert sum(o["op"] == "nc_matmul" for o in ops) == n_mm
    block_k = 128 * cfg["TILES_IN_BLOCK_K"]
    adds = [o for o in ops if o["op"] == "tensor_tensor"]
    assert len(adds) == (K // block_k) * (M // 128) * (N // 512)


def _run(mod, a, b, cfg):
    mod.matmul_main(a, b, **cfg)
    return mod.matmul_main.last_profile


@pytest.mark.parametrize("loop_order", ["MNK", "NMK", "MKN", "KMN"])
def test_hbm_bytes_follow_traffic_model(at, loop_order):
    """Each lhs block is loaded once per N block when K is the innermost loop (MNK, NMK), once when the lhs block
    is hoisted above the N loop (MKN, KMN); each rhs block once per M block; the kernel reads nothing else
    (``hbm_read_bytes`` of the kernel module). Doubling every block dimension halves both terms."""
    mod = at[0]
    K, M, N = 1024, 1024, 2048
    a, b = _inputs(K, M, N, BF16, True)
    small = dict(TILES_IN_BLOCK_M=2, TILES_IN_BLOCK_N=1, TILES_IN_BLOCK_K=2, loop_order=loop_order)
    big = dict(TILES_IN_BLOCK_M=4, TILES_IN_BLOCK_N=2, TILES_IN_BLOCK_K=4, loop_order=loop_order)
    got = {}
    for name, cfg in (("small", small), ("big", big)):
        prof = _run(mod, a, b, cfg)
        want = mod.hbm_read_bytes(a.shape, b.shape, 2, **cfg)
        assert prof.stat("memory.hbm_read_bytes") == want, (name, cfg)
        assert prof.stat("memory.hbm_write_bytes") == M * N * 2
        got[name] = want
    lhs_per_n = loop_order in ("MNK", "NMK")
    # small: NUM_BLOCK_M = 4, NUM_BLOCK_N = 4; big: 2 and 2
    assert got["small"] == 2 * ((4 if lhs_per_n else 1) * M * K + 4 * K * N)
    assert got["big"] == 2 * ((2 if lhs_per_n else 1) * M * K + 2 * K * N)


def test_larger_blocks_move_fewer_bytes_and_are_not_slower(at):
    """MNK, K=1024, M=1024, N=2048 bf16. Going from 2x1x2 to 4x2x4 to 8x4x8 tiles per block halves the
    HBM traffic each time (lhs bytes x NUM_BLOCK_N + rhs bytes x NUM_BLOCK_M, both halve), the loads get
    longer rows (BLOCK_M, BLOCK_N elements per partition), and the fp32 PSUM-to-SBUF adds halve (one per K
    block); the matmuls stay the same. So 4x2x4 (8 blocks: 2 M x 2 N x 2 K) is faster than 2x1x2. 8x4x8 is one
    block covering the whole problem: it loads all of lhs and rhs before its first matmul and has no next block
    to overlap its loads with, so it is slower than 4x2x4 although it moves half the bytes (102,504.5 / 65,654.0
    / 75,152.8 ns; the kept loops' PSUM zero fills, folded since 2026-12-06 as in the unrolled trace, had made
    it 140,042.1 / 83,576.8 / 77,123.6 ns and hidden that)."""
    mod = at[0]
    a, b = _inputs(1024, 1024, 2048, BF16, True)
    cfgs = [dict(TILES_IN_BLOCK_M=2 * s, TILES_IN_BLOCK_N=s, TILES_IN_BLOCK_K=2 * s) for s in (1, 2, 4)]
    profs = [_run(mod, a, b, c) for c in cfgs]
    rd = [p.stat("memory.hbm_read_bytes") for p in profs]
    t = [p.total_time_ns for p in profs]
    assert rd[0] > rd[1] > rd[2] and rd[1] == rd[0] // 2 and rd[2] == rd[1] // 2, rd
    assert t[0] > t[1] and t[2] > t[1], t


def test_time_ranking_is_stable_and_explained(at):
    """Four configurations an autotuner would try on K=1024, M=1024, N=2048 (bf16, MNK):
        A 1x1x1 tiles per block    — 40 MiB read, [128, 128] / [128, 512] loads: the most DMA descriptors;
        B 2x1x2                    — 24 MiB;
        C 4x2x4 with BUFFER_K = 1  — 12 MiB, but the one lhs/rhs slot makes each K block's loads wait for the
                                     previous block's matmuls (write-after-read on the slot): no overlap of
                                     DMA and PE;
        D 4x2x4 with BUFFER_K = 2  — the same instructions and bytes as C, loads of block k+1 overlap block k.
    Expected: D fastest and A slowest, each by more than 10% over the others; B and C within 10% of each other
    (C moves half of B's bytes but without overlapping them with the PE: 101,939.9 against 100,691.7 ns, and
    49,169.2 against 49,987.6 ns at the second shape; C had looked 14-17 % faster while the kept K loops kept
    their PSUM zero fills, folded since 2026-12-06 as in the unrolled trace). C and D differ only in the slot
    index: same bytes, same instruction counts. This must hold for a second problem shape (K=2048, M=512,
    N=1024: four K blocks, slots rotate) and not depend on the input values (a timing model of the instruction
    stream)."""
    mod = at[0]
    cfgs = {"A": dict(TILES_IN_BLOCK_M=1, TILES_IN_BLOCK_N=1, TILES_IN_BLOCK_K=1),
            "B": dict(TILES_IN_BLOCK_M=2, TILES_IN_BLOCK_N=1, TILES_IN_BLOCK_K=2),
            "C": dict(TILES_IN_BLOCK_M=4, TILES_IN_BLOCK_N=2, TILES_IN_BLOCK_K=4, BUFFER_K=1),
            "D": dict(TILES_IN_BLOCK_M=4, TILES_IN_BLOCK_N=2, TILES_IN_BLOCK_K=4, BUFFER_K=2)}
    for shape, seed in (((1024, 1024, 2048), 0), ((2048, 512, 1024), 1)):
        a, b = _inputs(*shape, BF16, True, seed=seed)
        profs = {k: _run(mod, a, b, c) for k, c in cfgs.items()}
        t = {k: p.total_time_ns for k, p in profs.items()}
        assert min(t["B"], t["C"]) > 1.1 * t["D"] and t["A"] > 1.1 * max(t["B"], t["C"]), (shape, t)
        assert max(t["B"], t["C"]) < 1.1 * min(t["B"], t["C"]), (shape, t)
        rd = {k: p.stat("memory.hbm_read_bytes") for k, p in profs.items()}
        desc = {k: p.stat("dma.descriptor_count") for k, p in profs.items()}
        assert rd["A"] > rd["B"] > rd["C"] == rd["D"], rd
        assert desc["A"] > desc["B"] > desc["C"] == desc["D"], desc
        for eng in ("tensor", "vector", "scalar", "gpsimd"):
            s = "engine.{}.instruction_count".format(eng)
            assert profs["C"].stat(s) == profs["D"].stat(s), eng
        # other input values, same instruction stream: the same time
        a2, b2 = _inputs(*shape, BF16, True, seed=seed + 10)
        assert _run(mod, a2, b2, cfgs["B"]).total_time_ns == t["B"]


def test_autotuner_benchmark_and_baremetal(at):
    """What the autotuner does per configuration: ``nki.benchmark(warmup=, iters=, save_neff_name=,
    save_trace_name=)(kernel)``, call it with the inputs and the knobs as keyword arguments, read the p99 latency
    (µs) of ``benchmark_result.nc_latency``; then check the best configuration's output with ``nki.baremetal``.
    The latency is the simulated time (all percentiles equal: one deterministic run), so the configuration
    picked is the fastest of the sweep (4x2x4, see the ranking test), and baremetal gives the same bits."""
    mod, nki = at[0], at[1]
    from neuronxcc.nki import baremetal, benchmark
    a, b = _inputs(1024, 1024, 2048, BF16, False, seed=5)
    space = [dict(TILES_IN_BLOCK_M=1, TILES_IN_BLOCK_N=1, TILES_IN_BLOCK_K=1, loop_order="MNK"),
             dict(TILES_IN_BLOCK_M=2, TILES_IN_BLOCK_N=1, TILES_IN_BLOCK_K=2, loop_order="NMK"),
             dict(TILES_IN_BLOCK_M=4, TILES_IN_BLOCK_N=2, TILES_IN_BLOCK_K=4, loop_order="MNK")]
    latencies, outs = [], []
    for cfg in space:
        bench = benchmark(warmup=2, iters=10, save_neff_name="file.neff", save_trace_name="profile.ntff")(
            mod.matmul_main)
        outs.append(bench(a, b, transposed_lhs=False, **cfg))
        res = bench.benchmark_result.nc_latency
        p50, p99 = res.get_latency_percentile(50), res.get_latency_percentile(99)
        assert p50 == p99 == pytest.approx(bench.last_profile.total_time_ns / 1000.0)
        latencies.append(p99)
    best = int(np.argmin(latencies))
    assert best == 2, latencies
    want = rounded(_want(a, b, False), BF16)
    bm = baremetal(mod.matmul_main, artifacts_dir=None, additional_compile_opt="")
    out = bm(a, b, transposed_lhs=False, **space[best])
    close(out, want, BF16)
    np.testing.assert_array_equal(np.asarray(out, np.float32), np.asarray(outs[best], np.float32))
    close(outs[0], want, BF16)  # the other configurations group the fp32 sums differently: close, not equal


def test_sweep_runs_the_configurations(at):
    """``nsim.sweep`` over TILES_IN_BLOCK_K x loop_order (kernel.json of each point from ``Kernel.to_json``),
    timing-only, one row per point in grid order: every row ok, its ``memory.hbm_read_bytes`` the traffic model
    and its ``total_time`` the time of the same configuration run directly; within a loop order a deeper K
    block is not slower (fewer PSUM evictions and longer loads, the same bytes) beyond the list scheduler's 2 %:
    MNK 21,971 / 16,713 / 16,978 ns, KMN 23,438 / 14,926 / 14,058 ns at K blocks of 1, 2, 4 tiles (the unrolled
    trace's times but MNK's first, 22,586 unrolled; until 2026-12-06 the kept K loops kept their PSUM zero fills:
    MNK 21,971 / 22,056 / 18,951, KMN 23,438 / 22,243 / 16,036; MNK's first 23,779 ns until 2026-12-05, when an
    eviction began to free its PSUM tile at its last read, not its end)."""
    from nsim.sweep import sweep
    mod = at[0]
    a, b = _inputs(512, 512, 1024, BF16, True)
    base = dict(TILES_IN_BLOCK_M=2, TILES_IN_BLOCK_N=1)

    def make(TILES_IN_BLOCK_K, loop_order):
        return mod.matmul_main.to_json(a, b, TILES_IN_BLOCK_K=TILES_IN_BLOCK_K, loop_order=loop_order, **base)

    grid = {"TILES_IN_BLOCK_K": [1, 2, 4], "loop_order": ["MNK", "KMN"]}
    rows = sweep(make, grid, jobs=1)
    assert [(r["TILES_IN_BLOCK_K"], r["loop_order"]) for r in rows] == [
        (k, o) for k in grid["TILES_IN_BLOCK_K"] for o in grid["loop_order"]]
    for r in rows:
        assert r["status"] == "ok", r
        cfg = dict(base, TILES_IN_BLOCK_K=r["TILES_IN_BLOCK_K"], loop_order=r["loop_order"])
        assert r["memory.hbm_read_bytes"] == mod.hbm_read_bytes(a.shape, b.shape, 2, **cfg)
        assert r["total_time"] == pytest.approx(_run(mod, a, b, cfg).total_time_ns, rel=1e-9)
    for order in grid["loop_order"]:
        times = [r["total_time"] for r in rows if r["loop_order"] == order]
        assert 1.02 * times[0] >= times[1] and 1.02 * times[1] >= times[2] and times[2] < times[0], (order, times)
