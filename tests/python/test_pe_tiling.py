"""PE tiling: nc_matmul's tile_position / tile_size (nki-api.md 2.1) in both dialects. Matmuls on disjoint tiles of
the PE array run side by side (neuroncore.md 2.4, 3.1; docs/timing-model.md "PE tiling"); the values are those of
the untiled matmuls; bad tiles are errors with codes, at the kernel's line."""
import ml_dtypes
import numpy as np
import pytest

import nsim
from nsim import nki
import nsim.nki.isa as nisa
import nsim.nki.language as nl

BF16 = ml_dtypes.bfloat16
GROUPS, STEPS = 4, 8  # four K = 32 contractions, each accumulated over STEPS matmuls


def _small_k(tiled, steps=STEPS, resident=False):
    """GROUPS independent K = 32 accumulations of ``steps`` matmuls, written step after step (each step issues one
    matmul of every group). ``resident``: a_t [128, 128] and b [128, 512] loaded once (TensorE-bound), else a_t
    [steps, 128, 128] and b [steps, 128, 512] loaded step by step."""
    @nki.jit
    def small_k(a_t, b):
        # out[g] = sum_s a_t[s, 32g:32g+32].T @ b[s, 32g:32g+32]
        out = nl.ndarray((GROUPS, 128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        accs = []
        for g in nl.static_range(GROUPS):
            accs.append(nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum))
        if resident:
            at = nl.ndarray((128, 128), dtype=a_t.dtype, buffer=nl.sbuf)
            bt = nl.ndarray((128, 512), dtype=b.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=at, src=a_t)
            nisa.dma_copy(dst=bt, src=b)
        for s in nl.affine_range(steps):
            if not resident:
                at = nl.ndarray((128, 128), dtype=a_t.dtype, buffer=nl.sbuf)
                bt = nl.ndarray((128, 512), dtype=b.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=at, src=a_t[s])
                nisa.dma_copy(dst=bt, src=b[s])
            for g in nl.static_range(GROUPS):
                kw = dict(tile_position=(32 * g, 0), tile_size=(32, 128)) if tiled else {}
                nisa.nc_matmul(dst=accs[g], stationary=at[32 * g:32 * (g + 1), :], moving=bt[32 * g:32 * (g + 1), :],
                               **kw)
        for g in nl.static_range(GROUPS):
            o = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_copy(dst=o, src=accs[g])
            nisa.dma_copy(dst=out[g], src=o)
        return out
    return small_k


def _inputs():
    rng = np.random.default_rng(3)
    a = rng.standard_normal((STEPS, 128, 128)).astype(BF16)
    b = rng.standard_normal((STEPS, 128, 512)).astype(BF16)
    af, bf = a.astype(np.float32), b.astype(np.float32)
    ref = np.stack([sum(af[s, 32 * g:32 * g + 32].T @ bf[s, 32 * g:32 * g + 32] for s in range(STEPS))
                    for g in range(GROUPS)])
    return a, b, ref


def _tensor(prof):
    e = prof.stats["engine"]["tensor"]
    return {k: v["value"] for k, v in e.items() if isinstance(v, dict) and "value" in v}


def test_tiles_run_side_by_side_with_the_same_values():
    a, b, ref = _inputs()
    out_t, prof_t = _small_k(True).options(config="trn2").simulate(a, b)
    out_u, prof_u = _small_k(False).options(config="trn2").simulate(a, b)
    np.testing.assert_allclose(out_t, ref, rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(out_t, out_u)  # tiling changes the timing only
    # Same instructions; 32 MMs of N = 512 (512 cycles each): untiled one after the other, tiled four at a time, so the
    # TensorE busy union (the array busy) shrinks by far more than the rest of the kernel can hide.
    tt, tu = _tensor(prof_t), _tensor(prof_u)
    assert tt["instruction_count"] == tu["instruction_count"]
    assert tt["active_time"] < 0.5 * tu["active_time"]
    assert prof_t.total_time_ns < prof_u.total_time_ns


def test_tile_position_moving_with_a_loop_keeps_the_loop():
    @nki.jit
    def per_tile(a_t, b):
        out = nl.ndarray((GROUPS, 128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        at = nl.ndarray((128, 128), dtype=a_t.dtype, buffer=nl.sbuf)
        bt = nl.ndarray((128, 512), dtype=b.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=at, src=a_t[0])
        nisa.dma_copy(dst=bt, src=b[0])
        for g in nl.affine_range(GROUPS):
            ps = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
            nisa.nc_matmul(dst=ps, stationary=at[32 * g:32 * (g + 1), :], moving=bt[32 * g:32 * (g + 1), :],
                           tile_position=(32 * g, 0), tile_size=(32, 128))
            o = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_copy(dst=o, src=ps)
            nisa.dma_copy(dst=out[g], src=o)
        return out

    a, b, _ = _inputs()
    tres = per_tile.trace(a, b)
    loops = [st["loop"] for st in tres.kernel["body"] if "loop" in st]
    assert len(loops) == 1  # kept: the tile's row is an index expression of the loop
    mm = [st for st in loops[0]["body"] if st.get("op") == "nc_matmul"]
    assert mm[0]["iimm"] == ["32*" + loops[0]["var"], 0, 32, 128]
    out = per_tile(a, b)
    af, bf = a.astype(np.float32), b.astype(np.float32)
    np.testing.assert_allclose(out, np.stack([af[0, 32 * g:32 * g + 32].T @ bf[0, 32 * g:32 * g + 32]
                                              for g in range(GROUPS)]), rtol=1e-5, atol=1e-4)


def test_beta1_nc_matmul_takes_the_tile_too():
    import nsim.nki.beta1 as nki1  # what `import neuronxcc.nki` gives under nsim.compat
    nisa1, nl1 = nki1.isa, nki1.language

    @nki1.jit
    def acc(a_t, b):
        out = nl1.ndarray((128, 512), dtype=nl1.float32, buffer=nl1.shared_hbm)
        ps = nl1.zeros((128, 512), nl1.float32, buffer=nl1.psum)
        at = nl1.load(a_t[0, 0:64, :])
        bt = nl1.load(b[0, 0:64, :])
        ps[...] += nisa1.nc_matmul(at, bt, tile_position=(64, 0), tile_size=(64, 128))
        nl1.store(out, value=nl1.copy(ps))
        return out

    a, b, _ = _inputs()
    tres = acc.trace(a, b)
    mm = [st for st in tres.kernel["body"] if st.get("op") == "nc_matmul"]
    assert mm and mm[0]["iimm"] == [64, 0, 64, 128]
    np.testing.assert_allclose(acc(a, b), a[0, :64].astype(np.float32).T @ b[0, :64].astype(np.float32),
                               rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("pos, size, code", [
    ((16, 0), (32, 128), "NSIM-E312"),   # not a multiple of the size
    ((0, 0), (48, 128), "NSIM-E312"),    # not 32 x 2^k
    ((0, 96), (32, 32), "NSIM-E308"),    # M = 128 does not fit 32 columns
])
def test_bad_tiles_are_errors_at_the_matmul_line(pos, size, code):
    @nki.jit
    def bad(a_t, b):
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        at = nl.ndarray((32, 128), dtype=a_t.dtype, buffer=nl.sbuf)
        bt = nl.ndarray((32, 512), dtype=b.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=at, src=a_t[0, 0:32, :])
        nisa.dma_copy(dst=bt, src=b[0, 0:32, :])
        ps = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=ps, stationary=at, moving=bt, tile_position=pos, tile_size=size)  # the line
        o = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=o, src=ps)
        nisa.dma_copy(dst=out, src=o)
        return out

    a, b, _ = _inputs()
    with pytest.raises(nsim.NsimError) as ei:
        bad(a, b)
    assert ei.value.code == code
    assert "# the line" in open(__file__).read().splitlines()[ei.value.line - 1]


def test_tile_position_without_tile_size_is_an_error():
    @nki.jit
    def half(a_t, b):
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        at = nl.ndarray((32, 128), dtype=a_t.dtype, buffer=nl.sbuf)
        bt = nl.ndarray((32, 512), dtype=b.dtype, buffer=nl.sbuf)
        ps = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=ps, stationary=at, moving=bt, tile_position=(0, 0))
        return out

    a, b, _ = _inputs()
    with pytest.raises(nsim.NsimError, match="tile_position and tile_size must both be"):
        half(a, b)


def test_fast_forward_keeps_the_tiles_state():
    """A long loop of tiled matmuls: fast-forward (the digest covers every tile's pipes and weights) skips
    iterations and ends at the full simulation's time, to the picosecond."""
    @nki.jit
    def loop(a_t, b):
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        at = nl.ndarray((128, 128), dtype=a_t.dtype, buffer=nl.sbuf)
        bt = nl.ndarray((128, 512), dtype=b.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=at, src=a_t)
        nisa.dma_copy(dst=bt, src=b)
        for i in nl.sequential_range(4000):
            ps = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
            for g in nl.static_range(GROUPS):
                nisa.nc_matmul(dst=ps, stationary=at[32 * g:32 * g + 32, :], moving=bt[32 * g:32 * g + 32, :],
                               tile_position=(32 * g, 0), tile_size=(32, 128))
            o = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_copy(dst=o, src=ps)
            nisa.dma_copy(dst=out, src=o)
        return out

    a, b = np.zeros((128, 128), BF16), np.zeros((128, 512), BF16)
    _, full = loop.options(timing_only=True, fast_forward=False).simulate(a, b)
    _, ff = loop.options(timing_only=True, fast_forward=True).simulate(a, b)
    assert ff.stats["fast_forward"]["skipped_instructions"]["value"] > 0
    assert ff.total_time_ns == full.total_time_ns


def test_analyzer_suggests_tiles_and_the_fix_saves_at_least_its_estimate():
    """`pe_underfill` names PE tiling for small-K matmuls; a tiled matmul fills its tile (no finding), and tiling
    the kernel saves at least what the finding estimated."""
    a, b, _ = _inputs()
    _, pu = _small_k(False).options(config="trn2").simulate(a, b)
    _, pt = _small_k(True).options(config="trn2").simulate(a, b)
    fu = {f["kind"]: f for f in pu.analyze().data["findings"]}
    ft = {f["kind"]: f for f in pt.analyze().data["findings"]}
    assert "pe_underfill" in fu and "tile_position" in fu["pe_underfill"]["detail"]
    assert "pe_underfill" not in ft
    assert pu.total_time_ns - pt.total_time_ns >= fu["pe_underfill"]["saving_ns"]


def test_analyzer_estimate_where_the_small_k_matmuls_bound_the_kernel():
    """Where TensorE is the bottleneck, each matmul waits for the previous one's issue interval (TensorE's pipe, not
    the matmul's own line, is the critical path): `pe_underfill` counts TensorE's time above the full-array time up
    to the next bound, and tiling the matmuls (issued alternately, as its advice says) saves about that. 128 matmuls
    of K = 32, N = 512: 213.3 ns each untiled, four at a time tiled."""
    a = np.zeros((128, 128), BF16)
    b = np.zeros((128, 512), BF16)
    _, pu = _small_k(False, 32, True).options(config="trn2", timing_only=True).simulate(a, b)
    _, pt = _small_k(True, 32, True).options(config="trn2", timing_only=True).simulate(a, b)
    an = pu.analyze()
    assert an.bottleneck == "tensor", an.text
    top = an.findings[0]
    assert top["kind"] == "pe_underfill" and "alternately" in top["detail"], an.text
    saved = pu.total_time_ns - pt.total_time_ns
    assert saved > 0.5 * pu.total_time_ns
    assert saved / 2 <= top["saving_ns"] <= 2 * saved, (top["saving_ns"], saved)
