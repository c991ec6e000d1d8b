"""The context-encoding (prefill) flash attention kernel written in aws-neuron/nki-library's style
(tests/python/kernels/nkilib_style_attention_cte.py: new dialect, 128-query x 512-key blocks, online softmax, K by
``dma_transpose``, Q and P transposed on the PE, causal blocks skipped above the diagonal and masked on it by
``affine_select``, a sliding window masked by an ``iota`` mask, GQA, ragged S, LNC=2 over heads or query tiles)
run unchanged: outputs against a float64 numpy attention, and the structure and timing its tiling implies: the
causal kernel runs about half the non-causal matmuls, the sliding-window kernel's matmuls grow with W and only
linearly with S, LNC=2 is faster than one core, and the flash kernel beats the naive attention of the same file
(S x S scores through HBM).

Also the sanitizer's affine_range check (NSIM-W504) on the kernel's key loop written as ``nl.affine_range`` (the
running max / sum / output carried between iterations): the loop is peeled (its mask test differs between
iterations), and the iterations of a peeled loop run with their int index were not checked against each other,
so the mistake ran silently (fixed in ``Tracer._peeled_loop``). And ``nisa.nc_transpose`` into a tile of
another dtype (P^T into an fp32 PSUM tile), which nsim accepted as a cast although dst must have data's dtype
(now BadDtype, E302, at the call's line: ``nki/isa.py`` ``nc_transpose``); and ``last_profile`` of a configured
copy (``kernel.options(...)``) launched as ``copy[lnc]``, which was stale."""
import math
import os
import warnings

import numpy as np
import pytest

from conftest import beta1_modules, require_core, sample_fixture  # noqa: E402

_core, ml_dtypes = require_core()
from numeric_helpers import close, rounded  # noqa: E402

import nsim  # noqa: E402
import nsim.tracer  # noqa: E402

BF16 = ml_dtypes.bfloat16
KFILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels", "nkilib_style_attention_cte.py")

cte = sample_fixture("nkilib_style_attention_cte.py", module_only=True)


def _inputs(B, Hq, Hkv, S, D, seed, dtype=BF16):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal(shape).astype(dtype)
                 for shape in ((B, Hq, S, D), (B, Hkv, S, D), (B, Hkv, S, D)))


def reference(q, k, v, causal=True, scale=None, window=0, prescaled=True):
    """softmax(q k^T * scale + mask) v in float64; query i sees key j when j <= i (causal) and i - j < W (window).
    ``prescaled``: the flash kernel's one rounding that moves the result by more than bf16 noise: q * scale stored
    in bf16 before Q.K^T (the naive kernel scales the fp32 scores instead)."""
    B, Hq, S, D = q.shape
    G = Hq // k.shape[1]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    qs = np.asarray(q, np.float64) * scale
    if prescaled:
        qs = rounded(qs, q.dtype)
    kf = np.repeat(np.asarray(k, np.float64), G, axis=1)
    vf = np.repeat(np.asarray(v, np.float64), G, axis=1)
    s = np.einsum("bhqd,bhkd->bhqk", qs, kf)
    i, j = np.arange(S)[:, None], np.arange(S)[None, :]
    keep = np.ones((S, S), bool)
    if causal:
        keep &= j <= i
    if window:
        keep &= i - j < window
    s = np.where(keep, s, -np.inf)
    e = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("bhqk,bhkd->bhqd", e / e.sum(-1, keepdims=True), vf)


def _run(kernel, args, lnc=1, **kw):
    out = kernel[lnc](*args, **kw)
    return out, kernel.last_profile


def _matmuls(prof):
    return prof.stat("engine.matmul_instruction_count")


def _on(prof, engine, op):
    """Instructions of opcode ``op`` that ran on ``engine`` (profile stats)."""
    try:
        return prof.stat("engine.{}.opcode.{}.count".format(engine, op))
    except KeyError:
        return 0


def _bits(a):
    return np.asarray(a).view(np.uint16)


# --------------------------------------------------------------------------------------------------
# numerics
# --------------------------------------------------------------------------------------------------

# (B, Hq, Hkv, S, d), causal
CASES = [((1, 2, 1, 512, 128), True),  # GQA 2:1, one 512-key block per query tile at most
         ((2, 2, 2, 384, 64), False),
         ((1, 4, 2, 200, 64), True),  # ragged: query tiles of 128 + 72, V tail of 72 rows
         ((1, 2, 1, 712, 128), True),  # ragged: the last key block is 200 = 128 + 72 keys
         ((1, 1, 1, 1000, 32), False)]


@pytest.mark.parametrize("dims,causal", CASES)
def test_attention_cte_matches_numpy(cte, dims, causal):
    q, k, v = _inputs(*dims, seed=sum(dims))
    out, _ = _run(cte.attention_cte, (q, k, v), causal=causal)
    assert out.shape == q.shape and out.dtype == BF16
    close(out, reference(q, k, v, causal), BF16)
    if causal:  # the first query sees only the first key: its output is that key's value row
        close(out[:, :, 0], np.repeat(np.asarray(v, np.float32), dims[1] // dims[2], axis=1)[:, :, 0], BF16)


@pytest.mark.parametrize("dims,causal,window", [((1, 2, 1, 712, 64), True, None), ((1, 1, 1, 700, 64), True, 200),
                                                ((1, 2, 2, 300, 128), False, None)])
def test_attention_cte_fp32(cte, dims, causal, window):
    """The kernel takes its tile dtypes from q: in fp32 (fp32 matmuls and PE transposes) it matches numpy to fp32
    tolerance, ragged S and the sliding window included."""
    q, k, v = _inputs(*dims, seed=sum(dims), dtype=np.float32)
    out, _ = _run(cte.attention_cte, (q, k, v), causal=causal, sliding_window=window)
    assert out.dtype == np.float32
    close(out, reference(q, k, v, causal, window=window or 0))


def test_attention_cte_scale_and_mask_matter(cte):
    """An explicit scale is used (not 1/sqrt(d)), and the causal mask is applied on the diagonal blocks: the
    output differs from the unmasked and the default-scale attention by far more than the tolerance."""
    q, k, v = _inputs(1, 1, 1, 256, 64, seed=3)
    out, _ = _run(cte.attention_cte, (q, k, v), causal=True, scale=0.3)
    want = reference(q, k, v, True, scale=0.3)
    close(out, want, BF16)
    for other in (reference(q, k, v, False, scale=0.3), reference(q, k, v, True)):
        assert np.abs(other - want).max() > 0.1


# --------------------------------------------------------------------------------------------------
# causal block skipping
# --------------------------------------------------------------------------------------------------

def _cte_matmuls(S, causal):
    """Matmuls of one query head at S = 128 n: query tile i runs Q.K^T over 512-key blocks and P.V over 128-key
    pieces of its key range, [0, 128 (i + 1)) causal, [0, S) not: causal sum_i (ceil((i + 1) / 4) + i + 1),
    non-causal n (ceil(n / 4) + n). For n = 16: 40 + 136 = 176 against 64 + 256 = 320."""
    n = S // 128
    if causal:
        return sum(-(-(i + 1) // 4) for i in range(n)) + n * (n + 1) // 2
    return n * (-(-n // 4) + n)


def test_causal_runs_half_the_matmuls(cte):
    """S = 2048, two query heads on one KV head: 352 matmuls causal, 640 not (0.55; the PE transposes of Q and P
    are nc_transpose, not counted), and the causal run takes clearly less time."""
    q, k, v = _inputs(1, 2, 1, 2048, 128, seed=5)
    _, pc = _run(cte.attention_cte, (q, k, v), causal=True)
    _, pn = _run(cte.attention_cte, (q, k, v), causal=False)
    assert _matmuls(pc) == 2 * _cte_matmuls(2048, True) == 352
    assert _matmuls(pn) == 2 * _cte_matmuls(2048, False) == 640
    assert pc.total_time_ns < 0.75 * pn.total_time_ns, (pc.total_time_ns, pn.total_time_ns)
    # the causal kernel's masks: one affine_select per query tile (its diagonal block), none without the mask
    assert _on(pc, "gpsimd", "affine_select") == 2 * 16
    assert _on(pn, "gpsimd", "affine_select") == 0


# --------------------------------------------------------------------------------------------------
# sliding window
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("S,W", [(768, 128), (700, 200), (1024, 300), (384, 1000)])
def test_sliding_window_matches_numpy(cte, S, W):
    """Windows of one tile, smaller and larger than a tile (the iota mask's edge crosses 128-key pieces), and
    wider than the sequence (plain causal). The window matters unless W >= S."""
    q, k, v = _inputs(1, 2, 1, S, 64, seed=S + W)
    out, _ = _run(cte.attention_cte, (q, k, v), causal=True, sliding_window=W)
    want = reference(q, k, v, True, window=W)
    close(out, want, BF16)
    causal_only = reference(q, k, v, True)
    if W < S:
        assert np.abs(causal_only - want).max() > 0.1
    else:
        np.testing.assert_allclose(causal_only, want)


def _window_matmuls(S, W):
    """Query tile i sees keys from max(0, 128 i - W + 1), aligned down to 128, to 128 (i + 1): t_i pieces of 128
    keys, ceil(t_i / 4) Q.K^T blocks and t_i P.V matmuls; t_i = 1 + ceil((W - 1) / 128) once 128 i >= W - 1."""
    total = 0
    for i in range(S // 128):
        t = (i + 1) - max(0, 128 * i - W + 1) // 128
        total += -(-t // 4) + t
    return total


def test_sliding_window_matmuls_scale_with_w_not_s(cte):
    """W = 256: from the third query tile on every tile runs 1 Q.K^T block and 3 P.V pieces, so doubling S adds
    4 matmuls per added tile (linear), where causal attention adds a growing number; W = 512 runs 7 per tile.
    The windowed kernel at S = 2048 runs under 40 % of the causal matmuls but takes about 70 % of its time (35.5
    against 50.6 us; 65 % until a write-after-read began to wait for the reader's last read, 2026-12-05): every
    one of its blocks is masked twice (affine_select, then the iota mask's three instructions), which keeps GpSimd
    about as busy as VectorE (GpSimd-bound at W = 256; at W = 512 and S = 2048 VectorE is 7 % busier) where the
    causal kernel is VectorE-bound with GpSimd at about half of it. Its time doubles from S = 1024 to 2048
    where the causal kernel's grows 2.4x or more."""
    counts = {}
    for S, W in ((1024, 256), (2048, 256), (2048, 512)):
        q, k, v = _inputs(1, 1, 1, S, 128, seed=S)
        _, prof = _run(cte.attention_cte, (q, k, v), causal=True, sliding_window=W)
        counts[S, W] = (_matmuls(prof), prof.total_time_ns)
        assert _matmuls(prof) == _window_matmuls(S, W)
        busy = {e: prof.stat("engine.{}.busy_time".format(e)) for e in ("vector", "gpsimd")}
        assert prof.bound in ("gpsimd", "vector") and busy["gpsimd"] > 0.9 * busy["vector"], (S, W, prof.bound, busy)
        if W == 256:
            assert prof.bound == "gpsimd", (S, W, prof.bound)
    assert counts[2048, 256][0] == 2 + 3 + 14 * 4 and counts[1024, 256][0] == 2 + 3 + 6 * 4
    assert counts[2048, 512][0] == 2 + 3 + 4 + 5 + 12 * 7
    causal = {}
    for S in (1024, 2048):
        q, k, v = _inputs(1, 1, 1, S, 128, seed=S)
        _, pc = _run(cte.attention_cte, (q, k, v), causal=True)
        causal[S] = (_matmuls(pc), pc.total_time_ns)
        assert pc.bound == "vector", (S, pc.bound)
        # (the engine placement's split, S = 2048: GpSimd 6,547 against VectorE 12,800 ns busy)
        assert pc.stat("engine.gpsimd.busy_time") < 0.55 * pc.stat("engine.vector.busy_time")
    assert causal[2048][0] == _cte_matmuls(2048, True) and counts[2048, 256][0] < 0.4 * causal[2048][0]
    # time: the window's doubles with S (within 10 %), causal attention's grows faster
    assert counts[2048, 256][1] < 2.2 * counts[1024, 256][1], counts
    assert causal[2048][1] > 2.4 * causal[1024][1], causal
    assert counts[2048, 256][1] < 0.75 * causal[2048][1], (counts, causal)


# --------------------------------------------------------------------------------------------------
# LNC=2
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dims,how,ratio", [((1, 4, 2, 1024, 128), "KV heads", 0.6),
                                            ((1, 2, 1, 1024, 128), "query tiles", 0.8),
                                            ((1, 2, 1, 712, 64), "query tiles", 0.85)])
def test_lnc2_same_bits_and_faster(cte, dims, how, ratio):
    """Two (batch, KV head) items are dealt one per program; one item (B * Hkv odd) is shared by dealing the
    query tiles round-robin (tile t to program t % 2: both programs get near and far tiles of the causal
    triangle). Same bits as one core, the same matmuls in total, and a shorter run."""
    q, k, v = _inputs(*dims, seed=dims[3] + dims[1])
    o1, p1 = _run(cte.attention_cte, (q, k, v), lnc=1)
    o2, p2 = _run(cte.attention_cte, (q, k, v), lnc=2)
    np.testing.assert_array_equal(_bits(o1), _bits(o2))
    close(o2, reference(q, k, v, True), BF16)
    assert _matmuls(p1) == _matmuls(p2)
    assert p2.cores == 2 and len(p2.core_times_ns) == 2
    assert p2.total_time_ns < ratio * p1.total_time_ns, (how, p1.total_time_ns, p2.total_time_ns)


def test_configured_copy_records_its_runs(cte):
    """Comparing LNC 1 and 2 through a configured copy, ``kern = kernel.options(...); kern[lnc](...)``, reads
    ``kern.last_profile``: it is the run just made. (It was the profile the original kernel held when the copy
    was made: ``kern[lnc]`` recorded its runs on itself and the original only; ``_kernel.Kernel._record``.)"""
    q, k, v = _inputs(1, 2, 1, 384, 64, seed=2)
    kern = cte.attention_cte.options(check=False)
    kern[1](q, k, v)
    p1 = kern.last_profile
    kern[2](q, k, v)
    p2 = kern.last_profile
    assert p1 is not None and p1.cores == 1 and p2.cores == 2 and p2 is not p1
    assert p2.total_time_ns < p1.total_time_ns
    assert cte.attention_cte.last_profile is p2  # the original still records every run


# --------------------------------------------------------------------------------------------------
# flash against naive
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("causal", [True, False])
def test_flash_beats_naive(cte, causal):
    """S = 2048, d = 128, one head. The naive kernel computes all 16 x 4 score blocks, writes the 2048 x 2048 fp32
    scores to HBM, reads them back row by row for the softmax, writes the bf16 probabilities and reads them again
    for P.V: about 48 MiB of HBM traffic, so it is DMA-bound. The flash kernel keeps its scores on chip (it only
    reads Q, K, V and writes O, 2 MiB) and is bound by its compute engines; causal, it also skips the blocks above
    the diagonal. Both are correct; flash is over 3x faster causal, over 2x without the mask."""
    q, k, v = _inputs(1, 1, 1, 2048, 128, seed=11)
    of, pf = _run(cte.attention_cte, (q, k, v), causal=causal)
    on, pn = _run(cte.attention_naive, (q, k, v), causal=causal)
    close(of, reference(q, k, v, causal), BF16)
    close(on, reference(q, k, v, causal, prescaled=False), BF16)
    assert pn.bound == "dma" and pf.bound != "dma", (pn.bound, pf.bound)
    assert pf.total_time_ns * (3 if causal else 2) < pn.total_time_ns, (pf.total_time_ns, pn.total_time_ns)
    assert _matmuls(pn) == 16 * (4 + 16)  # every block, masked or not
    assert _matmuls(pf) == _cte_matmuls(2048, causal)


# --------------------------------------------------------------------------------------------------
# the key loop as an affine_range: NSIM-W504
# --------------------------------------------------------------------------------------------------

SEQ_LOOP = "    for j in nl.sequential_range(div_ceil(k_hi - k_lo, K_TILE)):"
PT_PSUM = "        pT_ps = nl.ndarray((V_TILE, K_TILE // V_TILE, Q_TILE), dtype=p_dtype, buffer=nl.psum)"


def _mutated(tmp_path_factory, name, old, new):
    """The kernel file with its line ``old`` replaced by ``new`` (one mistake), imported as the kernel file is:
    yields (module, path, lines)."""
    with open(KFILE) as f:
        src = f.read()
    assert src.count(old) == 1
    path = tmp_path_factory.mktemp("cte") / name
    path.write_text(src.replace(old, new))
    lines = path.read_text().splitlines()
    with beta1_modules(path) as (mod,):
        yield mod, str(path), lines


@pytest.fixture(scope="module")
def affine_k_loop(tmp_path_factory):
    """The kernel file with its key loop made an ``nl.affine_range`` (the running max, sum and output are carried
    from one key block to the next: the compiler's err_unexpected_output_dependencies)."""
    yield from _mutated(tmp_path_factory, "attention_cte_affine_k.py", SEQ_LOOP,
                        SEQ_LOOP.replace("sequential_range", "affine_range"))


@pytest.mark.parametrize("S", [640, 1024, 2048])
def test_affine_key_loop_is_reported(affine_k_loop, S):
    """Causal, the key loop's mask test differs between its iterations, so the tracer peels the loop (first and
    last iteration with their int index, the rest recorded as a loop). With 2 or 3 iterations (S = 640, 1024)
    nothing was recorded, and the int iterations were not checked: no report. Now every S reports the read of
    the running max that the previous iteration wrote, at the line of the read, naming the loop."""
    mod, path, lines = affine_k_loop
    q, k, v = _inputs(1, 1, 1, S, 64, seed=S)
    with pytest.warns(nsim.tracer.CheckWarning) as rec:
        mod.attention_cte(q, k, v, causal=True)
    msgs = [str(w.message) for w in rec if "NSIM-W504" in str(w.message)]
    assert msgs, [str(w.message) for w in rec]
    loop_line = lines.index(SEQ_LOOP.replace("sequential_range", "affine_range")) + 1
    assert "affine_range at attention_cte_affine_k.py:{}".format(loop_line) in msgs[0], msgs[0]
    assert "m_run" in msgs[0] and "[at {}:".format(path) in msgs[0], msgs[0]


def test_sequential_key_loop_is_not_reported(cte):
    """The kernel as written (sequential_range) runs without any sanitizer report (conftest turns one into an
    error) on the shapes that peel the loop."""
    for S in (640, 1024):
        q, k, v = _inputs(1, 1, 1, S, 64, seed=S)
        with warnings.catch_warnings():
            warnings.simplefilter("error", nsim.tracer.CheckWarning)
            cte.attention_cte(q, k, v, causal=True)


# --------------------------------------------------------------------------------------------------
# P transposed into an fp32 PSUM tile: NSIM-E302
# --------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def fp32_transpose(tmp_path_factory):
    """The kernel file with the PSUM tile of P^T made float32 while P is bf16 (as for a matmul result)."""
    yield from _mutated(tmp_path_factory, "attention_cte_fp32_pt.py", PT_PSUM,
                        PT_PSUM.replace("dtype=p_dtype", "dtype=nl.float32"))


def test_transpose_into_another_dtype_is_reported(fp32_transpose):
    """nki-api.md 2.1: nc_transpose's dst has data's dtype (on gen3+ the PE's transpose mode passes the bits
    through). nsim accepted a bf16 -> fp32 transpose silently (and computed it as a cast); now BadDtype (E302) at
    the transpose's line, naming both dtypes. (Beta 1's ``nc_transpose(x, dtype=...)`` still casts.)"""
    mod, path, lines = fp32_transpose
    q, k, v = _inputs(1, 1, 1, 256, 64, seed=1)
    with pytest.raises(nsim.NsimError) as ei:
        mod.attention_cte(q, k, v)
    msg = str(ei.value)
    line = next(i for i, ln in enumerate(lines, 1) if "nisa.nc_transpose(dst=pT_ps" in ln)
    assert "NSIM-E302" in msg and "float32" in msg and "bfloat16" in msg, msg
    assert "[at {}:{}]".format(path, line) in msg, msg
