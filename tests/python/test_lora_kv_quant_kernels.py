"""Multi-LoRA serving and quantized KV-cache decode kernels written the way the punica / vLLM ports to Trainium
write them, run unchanged (tests/python/kernels/lora_kv_quant_kernels.py, new dialect, and
lora_kv_quant_kernels_beta1.py, Beta 1): punica's BGMV (per-token adapter gathered by ``.ap(vector_offset=)``,
shrink and expand on the VectorE), SGMV for prefill (segments of tokens per adapter, runtime adapter ids, indirect
loads of the adapter's rows, masks for the ragged segment ends), LoRA fused into the base projection's PSUM
accumulation group against the two-kernel pipeline, and GQA decode attention over a float8_e4m3 KV cache with
per-KV-head (new dialect) or per-token (Beta 1) dequantization scales (online softmax over key blocks). Also the
per-token PE form of BGMV (``.ap(scalar_offset=)`` and ``select(0, idx)`` reads of one adapter).

Checked: outputs against float64 numpy (bf16 tolerance 1e-2; the fp8 cache enters the references as its exact
fp8 values times the scale, so bf16 tolerance applies there too, and the quantization error itself is bounded
separately), no sanitizer report, the instruction / DMA counts the tiling implies, the HBM bytes of the gathers
(only the selected adapters' rows), the bytes the fused LoRA saves (exactly the y_base round trip and the second
read of x) and that it is faster than base + LoRA kernels, and that the fp8 cache moves exactly half the KV bytes
of a bf16 one and is faster when the bf16 run is DMA-bound.

nsim fixes these kernels needed (each test named failed before):
- Beta 1: an indirect load whose later index items also vary along the partitions,
  ``lora_a[ids[i_r, 0], i_r, i_h]`` (row ``ids[p]`` of the adapter dim, then sub-row ``p``: numpy semantics), read
  sub-row 0 on every partition: the tracer set the static part's partition step to 0 as ``.ap(vector_offset=)``
  does (python/nsim/nki/beta1/language.py, ``Tensor._indirect_index``; ``test_beta1_indirect_with_partition_*``
  and every SGMV test);
- a transposing ``.ap(pattern, scalar_offset=, indirect_dim=0)`` that splits a dim of the HBM tensor (A^T of one
  adapter, hidden split [KT, 128]) was refused as reaching past the tensor (NSIM-E201) whatever the index: the
  verifier's reach check walked the access's dims with the tensor's shape instead of the access's re-dimensioned
  shape (frontend/verify.cpp, ``Verifier::check_indirect_reach``; ``test_bgmv_pe_*``);
- a view of a runtime select, ``lora_b.select(0, idx_sb).T`` (or a slice / reshape of it), was NSIM-E446 "a view of
  the indirect view cannot be taken": such views now move with the same runtime offset and valid range
  (python/nsim/tracer.py, ``NkiTensor._derive`` with ``keep_ind`` from ``__getitem__``, ``reshape``,
  ``permute``; ``test_runtime_select_sub_views``, ``test_bgmv_pe_*``); ``.ap`` of such a view stays refused.
"""
import numpy as np
import pytest

from conftest import beta1_modules, op_counts, require_core, sample_fixture  # noqa: E402

_core, ml_dtypes = require_core()
from numeric_helpers import close, f64, randn, rounded  # noqa: E402

import nsim  # noqa: E402

BF16 = ml_dtypes.bfloat16
FP8 = ml_dtypes.float8_e4m3

lk = sample_fixture("lora_kv_quant_kernels.py", module_only=True)
lb1 = sample_fixture("lora_kv_quant_kernels_beta1.py", module_only=True)


def _adapters(L, r, H, O, seed):
    """LoRA A [L, r, H] and B [L, O, r] in bf16, scaled so that the delta is of the order of the base output."""
    return randn((L, r, H), BF16, seed, 1.0 / np.sqrt(H)), randn((L, O, r), BF16, seed + 1, 1.0 / np.sqrt(r))


def _lora_ref(x, A, Bm, idx, scale, round_v=None):
    """scale * (x A_idx^T) B_idx^T per token in float64; idx < 0: no adapter (0). ``round_v``: the dtype the
    kernel stores the shrink result in before the expand."""
    ia = np.clip(idx, 0, None)
    v = np.einsum("th,trh->tr", f64(x), f64(A)[ia])
    if round_v is not None:
        v = rounded(v * scale, round_v) / scale
    return scale * np.einsum("tr,tor->to", v, f64(Bm)[ia]) * (idx >= 0)[:, None]


# --------------------------------------------------------------------------------------------------
# 1. BGMV (decode, new dialect)
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("B,H,O,L,r", [(16, 1024, 1024, 4, 16), (64, 4096, 1024, 8, 8), (4, 1024, 2048, 6, 32)])
def test_bgmv_matches_numpy(lk, B, H, O, L, r):
    """Each token's own adapter (repeats and unused adapters included): the gathered rows feed an fp32 shrink and
    expand; one bf16 rounding of the output."""
    x = randn((B, H), BF16, B + H)
    y_in = randn((B, O), BF16, O)
    A, Bm = _adapters(L, r, H, O, seed=L * r)
    idx = np.random.default_rng(B).integers(0, L, B).astype(np.int32)
    idx[:2] = L - 1  # the last adapter's rows too
    out = lk.bgmv_lora(x, y_in, A, Bm, idx, 0.5)
    assert out.dtype == BF16 and out.shape == (B, O)
    want = f64(y_in) + _lora_ref(x, A, Bm, idx, 0.5)
    close(out, want, BF16)
    # a wrong adapter would be far off: the per-token delta is of the order of y_in
    assert np.abs(_lora_ref(x, A, Bm, (idx + 1) % L, 0.5) - _lora_ref(x, A, Bm, idx, 0.5)).max() > 0.3
    # tiling: idx, x and the two gathers, then per 512 output columns a y_in load and a store; r / 4 shrink steps
    chunks = O // 512
    c = op_counts(lk.bgmv_lora)
    assert c["dma_copy"] == 4 + 2 * chunks
    assert c["tensor_tensor"] == c["tensor_reduce"] == r // 4 + chunks
    assert c["scalar_tensor_tensor"] == chunks and c.get("nc_matmul", 0) == 0
    # the gathers read only the B selected adapter rows (not all L adapters): bytes of x, y_in, idx and B x (A + B)
    prof = lk.bgmv_lora.last_profile
    assert prof.stat("memory.hbm_read_bytes") == 2 * B * (H + O) + 4 * B + 2 * B * (r * H + O * r)
    assert prof.stat("memory.hbm_write_bytes") == 2 * B * O


@pytest.mark.parametrize("B,H,O,L,r", [(8, 1024, 512, 4, 16), (4, 2048, 256, 8, 64)])
def test_bgmv_pe_scalar_offset_matches_numpy(lk, B, H, O, L, r):
    """Regression (nsim fix): the transposing ``.ap(pattern, scalar_offset=, indirect_dim=0)`` reads of A^T (the
    hidden dim split into [KT, 128]) were refused by the verifier as reaching past the tensor (NSIM-E201), whatever
    the index; every token on the last adapter reaches exactly the tensor's last element. v^T is stored in bf16
    (times the scale) before the expand: the reference rounds it there."""
    x = randn((B, H), BF16, B)
    A, Bm = _adapters(L, r, H, O, seed=r + 1)
    idx = np.random.default_rng(H).integers(0, L, B).astype(np.int32)
    idx[0] = L - 1
    for ids in (idx, np.full(B, L - 1, np.int32)):
        out = lk.bgmv_lora_pe(x, A, Bm, ids, 0.5)
        close(out, _lora_ref(x, A, Bm, ids, 0.5, round_v=BF16), BF16)
    KT = H // 128
    c = op_counts(lk.bgmv_lora_pe)
    assert c["nc_matmul"] == B * (KT + 1) and c["dma_copy"] == 1 + 4 * B
    prof = lk.bgmv_lora_pe.last_profile
    assert prof.stat("memory.hbm_read_bytes") == 4 * B + 2 * B * (H + r * H + O * r)


def test_bgmv_pe_index_out_of_range_is_an_error(lk):
    """An adapter index == L is out of bounds along the adapter dim: an error at the kernel's DMA line, not a read
    of the bytes after the tensor."""
    B, H, O, L, r = 4, 1024, 512, 4, 16
    x = randn((B, H), BF16, 1)
    A, Bm = _adapters(L, r, H, O, seed=2)
    idx = np.array([0, 1, L, 2], np.int32)
    with pytest.raises(nsim.NsimError) as e:
        lk.bgmv_lora_pe(x, A, Bm, idx, 0.5)
    assert "outside [0, {})".format(L) in str(e.value), str(e.value)
    assert e.value.file.endswith("lora_kv_quant_kernels.py") and e.value.line > 0


@pytest.fixture(scope="module")
def newnki():
    with beta1_modules():
        import nki
        import nki.isa as nisa
        import nki.language as nl
        yield nki, nl, nisa


@pytest.mark.parametrize("view", ["T", "rows", "reshape"])
def test_runtime_select_sub_views(newnki, view):
    """Regression (nsim fix): a view of a runtime select ``t.select(0, idx_sb)`` (``.T``, a row slice, a reshape)
    was NSIM-E446 "a view of the indirect view cannot be taken"; it moves with the same runtime offset, so it is
    the same sub-view of the selected row. Index == L is still out of bounds (an error), and an ``.ap`` of it (a
    pattern over the storage that could leave the selected row) is still refused."""
    nki, nl, nisa = newnki
    L, O, r = 5, 256, 4
    shapes = {"T": (r, O), "rows": (64, r), "reshape": (O // 2, 2 * r)}

    @nki.jit
    def pick(b_, which):
        out = nl.ndarray(shapes[view], dtype=b_.dtype, buffer=nl.shared_hbm)
        idx = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=idx, src=which.reshape((1, 1)))
        sel = b_.select(0, idx)
        src = {"T": lambda: sel.T, "rows": lambda: sel[64:128, :], "reshape": lambda: sel.reshape(shapes["reshape"])}
        t = nl.ndarray(shapes[view], dtype=b_.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=src[view]())
        nisa.dma_copy(dst=out, src=t)
        return out

    b = np.arange(L * O * r, dtype=np.float32).reshape(L, O, r)
    for i in (0, 3, L - 1):
        want = {"T": b[i].T, "rows": b[i, 64:128], "reshape": b[i].reshape(shapes["reshape"])}[view]
        np.testing.assert_array_equal(pick(b, np.array([i], np.int32)), want)
    with pytest.raises(nsim.NsimError, match=r"outside \[0, 5\)"):
        pick(b, np.array([L], np.int32))

    @nki.jit
    def ap_of_select(b_, which):
        idx = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=idx, src=which.reshape((1, 1)))
        t = nl.ndarray((r, O), dtype=b_.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=b_.select(0, idx).ap(pattern=[[1, r], [r, O]], offset=0))
        return t

    with pytest.raises(nsim.NsimError, match="indirect"):
        ap_of_select(b, np.array([1], np.int32))


# --------------------------------------------------------------------------------------------------
# 2. SGMV (prefill, Beta 1)
# --------------------------------------------------------------------------------------------------

def _sgmv_ref(x, y_in, A, Bm, lids, starts, scale):
    idx = np.repeat(lids, np.diff(starts))
    return f64(y_in) + _lora_ref(x, A, Bm, idx, scale, round_v=BF16)


@pytest.mark.parametrize("starts,lids,H,O,L,r", [
    ((0, 130, 130, 200, 400), (2, 0, 3, 1), 1024, 1024, 4, 16),  # ragged ends, an empty segment
    ((0, 256, 300), (5, 5), 2048, 512, 8, 64),  # two segments of one adapter, rank 64
    ((0, 37), (1,), 1024, 1536, 2, 8),  # one short segment
])
def test_sgmv_prefill_matches_numpy(lb1, starts, lids, H, O, L, r):
    """The shrink result is stored in bf16 (the kernel's ``nl.copy(vT_ps, dtype=x.dtype)``) before the expand: the
    reference rounds it there too. Tokens past a segment's end in its last tile are masked out everywhere."""
    T = starts[-1]
    x = randn((T, H), BF16, T)
    y_in = randn((T, O), BF16, T + 1)
    A, Bm = _adapters(L, r, H, O, seed=r)
    lids = np.asarray(lids, np.int32)
    out = lb1.sgmv_lora_prefill(x, y_in, A, Bm, lids, starts, 0.5)
    assert out.dtype == BF16 and out.shape == (T, O)
    close(out, _sgmv_ref(x, y_in, A, Bm, lids, starts, 0.5), BF16)
    # tiling: per non-empty segment the id broadcast to the partitions (a ones matmul), the A transposes (H / 128) and B transposes (O / 128); per 128-token tile the x
    # transposes, H / 128 shrink matmuls and O / 512 expand matmuls
    KT, n_seg = H // 128, len(lids)
    tiles = [-(-(starts[s + 1] - starts[s]) // 128) for s in range(n_seg)]
    full = [s for s in range(n_seg) if tiles[s]]
    c = op_counts(lb1.sgmv_lora_prefill)
    assert c["nc_matmul"] == sum(tiles) * (KT + O // 512) + len(full)  # + the id's partition broadcast
    assert c["nc_transpose"] == len(full) * (KT + O // 128) + sum(tiles) * KT
    assert c["dma_copy"] == len(full) * (2 + O // 128) + sum(tiles) * (1 + 2 * (O // 512))
    # every token row written once: bytes of the output exactly
    assert lb1.sgmv_lora_prefill.last_profile.stat("memory.hbm_write_bytes") == 2 * T * O


def test_sgmv_prefill_kept_loop_times_as_unrolled(lb1):
    """Two segments (256 and 44 tokens), H = 2048, O = 512, rank 64: the segments' loops are written out by Python,
    their 128-token tile loops kept. The placement that puts each PSUM tile where its bytes were used longest ago
    fragmented the 8 banks (no two free in a row for one transpose tile), so the packed placement was kept, and in
    it the second segment's x transposes took the first segment's shrink accumulator's banks: they waited for its
    last read, 28,789.8 ns kept against 20,198.6 ns unrolled. The packed placement is now improved tile by tile
    (docs/timing-model.md "Memory allocation"): 21,871.1 ns kept."""
    starts, lids, H, O, L, r = (0, 256, 300), np.asarray((5, 5), np.int32), 2048, 512, 8, 64
    T = starts[-1]
    x, y_in = randn((T, H), BF16, T), randn((T, O), BF16, T + 1)
    A, Bm = _adapters(L, r, H, O, seed=r)
    t = {}
    for loops in ("keep", "unroll"):
        kern = lb1.sgmv_lora_prefill.options(loops=loops, timing_only=True)
        t[loops] = kern.simulate(x, y_in, A, Bm, lids, starts, 0.5)[1].total_time_ns
    assert t["keep"] < 1.12 * t["unroll"], t


def test_sgmv_adapter_ids_are_runtime(lb1):
    """The same compiled segments with other adapter ids in HBM give the other adapters' result (the ids are
    data, not trace-time constants)."""
    starts, H, O, L, r = (0, 100, 228), 1024, 512, 4, 16
    x, y_in = randn((228, H), BF16, 1), randn((228, O), BF16, 2)
    A, Bm = _adapters(L, r, H, O, seed=3)
    for lids in ((0, 3), (3, 1)):
        lids = np.asarray(lids, np.int32)
        close(lb1.sgmv_lora_prefill(x, y_in, A, Bm, lids, starts, 1.0), _sgmv_ref(x, y_in, A, Bm, lids, starts, 1.0),
              BF16)


@pytest.fixture(scope="module")
def b1nki():
    with beta1_modules():
        import neuronxcc.nki as nki
        import neuronxcc.nki.language as nl
        yield nki, nl


def test_beta1_indirect_with_partition_varying_items(b1nki):
    """Regression (nsim fix): ``t[ids[i_r, 0], i_r, i_f]`` gathers row ``ids[p]`` of dim 0 and sub-row ``p`` of
    dim 1 per partition (numpy advanced indexing); before, every partition read sub-row 0."""
    nki, nl = b1nki

    @nki.jit
    def gather_adapter(a, lid):
        L, r, H = a.shape
        out = nl.ndarray((r, H), dtype=a.dtype, buffer=nl.shared_hbm)
        i_r, i_f = nl.arange(r)[:, None], nl.arange(H)[None, :]
        ids = nl.load(lid.reshape((1, 1))).broadcast_to((r, 1))
        nl.store(out[i_r, i_f], value=nl.load(a[ids[i_r, 0], i_r, i_f]))
        return out

    a = np.arange(5 * 6 * 8, dtype=np.float32).reshape(5, 6, 8)
    for lid in (0, 3, 4):
        np.testing.assert_array_equal(gather_adapter(a, np.array([lid], np.int32)), a[lid])


def test_beta1_indirect_with_partition_varying_items_store(b1nki):
    """The same subscript as a scatter destination: ``out[ids[i_r, 0], i_r, i_f] = tile`` writes the rows of
    adapter ``ids[p]`` and nothing else."""
    nki, nl = b1nki

    @nki.jit
    def scatter_adapter(out, t, lid):
        L, r, H = out.shape
        i_r, i_f = nl.arange(r)[:, None], nl.arange(H)[None, :]
        ids = nl.load(lid.reshape((1, 1))).broadcast_to((r, 1))
        nl.store(out[ids[i_r, 0], i_r, i_f], value=nl.load(t[i_r, i_f]))
        return out

    t = np.arange(6 * 8, dtype=np.float32).reshape(6, 8) + 1
    out = np.zeros((5, 6, 8), np.float32)
    got = scatter_adapter(out, t, np.array([2], np.int32))
    want = np.zeros_like(out)
    want[2] = t
    np.testing.assert_array_equal(got, want)


# --------------------------------------------------------------------------------------------------
# 3. LoRA fused into the base projection vs base + separate LoRA kernel
# --------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def projection_runs(lk):
    """The fused kernel and the two-kernel pipeline on T=64 decode tokens, H=2048, O=2048, 4 adapters of rank 16
    (-1 = no adapter for some tokens): (inputs, fused out, pipeline out, {name: (time ns, read, written)})."""
    T, H, O, L, r = 64, 2048, 2048, 4, 16
    x = randn((T, H), BF16, 7)
    w = randn((H, O), BF16, 8, 1.0 / np.sqrt(H))
    A, Bm = _adapters(L, r, H, O, seed=9)
    idx = np.random.default_rng(10).integers(-1, L, T).astype(np.int32)
    fused = lk.fused_lora_projection(x, w, A, Bm, idx, 0.5)
    stats = {}

    def record(k, name):
        p = k.last_profile
        stats[name] = (p.total_time_ns, p.stat("memory.hbm_read_bytes"), p.stat("memory.hbm_write_bytes"))

    record(lk.fused_lora_projection, "fused")
    counts = op_counts(lk.fused_lora_projection)
    y_base = lk.base_projection(x, w)
    record(lk.base_projection, "base")
    piped = lk.multi_lora_delta(x, y_base, A, Bm, idx, 0.5)
    record(lk.multi_lora_delta, "lora")
    return (x, w, A, Bm, idx, y_base), fused, piped, stats, counts


def test_fused_lora_projection_matches_numpy(projection_runs):
    """The LoRA delta (v rounded to bf16 once, as the kernel stores it for the expand matmul) in the base's fp32
    PSUM group; tokens with index -1 get the base projection alone."""
    (x, w, A, Bm, idx, y_base), fused, piped, _, _ = projection_runs
    assert (idx < 0).any() and (idx >= 0).any()
    base = f64(x) @ f64(w)
    want = base + _lora_ref(x, A, Bm, idx, 0.5, round_v=BF16)
    close(fused, want, BF16)
    close(y_base, base, BF16)
    close(piped, rounded(base, BF16) + _lora_ref(x, A, Bm, idx, 0.5, round_v=BF16), BF16)
    none = idx < 0
    close(fused[none], base[none], BF16)
    assert np.abs(f64(fused)[~none] - base[~none]).max() > 0.1  # the adapters did contribute


def test_fused_lora_structure_and_savings(projection_runs):
    """Tiling of the fused kernel: H/128 x transposes, H/128 A transposes, O/128 B transposes and one v
    transpose; H/128 shrink matmuls; per 512 output columns H/128 base matmuls plus ONE LoRA matmul into the same
    PSUM tile and one eviction. The pipeline moves exactly the extra bytes of y_base (written by the base kernel,
    read back by the LoRA kernel) and of the second read of x; the fused kernel is faster than the two together."""
    (x, w, A, Bm, idx, _), _, _, stats, c = projection_runs
    T, H = x.shape
    O = w.shape[1]
    KT, NC = H // 128, O // 512
    assert c["nc_transpose"] == 2 * KT + O // 128 + 1
    assert c["nc_matmul"] == KT + NC * (KT + 1)
    assert c["tensor_copy"] == 1 + 2 * KT + O // 128 + 1 + NC  # idx to fp32, transposes' and output evictions
    f_t, f_rd, f_wr = stats["fused"]
    b_t, b_rd, b_wr = stats["base"]
    l_t, l_rd, l_wr = stats["lora"]
    assert f_wr == b_wr == l_wr == 2 * T * O
    assert (b_rd + l_rd) - f_rd == 2 * T * H + 2 * T * O  # x again + y_base
    assert (b_rd + b_wr + l_rd + l_wr) - (f_rd + f_wr) == 2 * T * H + 4 * T * O
    assert f_t < b_t + l_t
    assert f_t < 0.9 * (b_t + l_t), (f_t, b_t, l_t)


# --------------------------------------------------------------------------------------------------
# 4. decode attention over an fp8 KV cache
# --------------------------------------------------------------------------------------------------

def _kv_case(B, Hq, Hkv, S, D, seed):
    """bf16 q; K, V with per-KV-head magnitudes (so the per-head scales differ) and a few large scores in late
    key blocks (so the running max changes between blocks); quantized per head to e4m3 (|value| <= 240)."""
    rng = np.random.default_rng(seed)
    q = randn((B, Hq, D), BF16, seed)
    mag = np.exp2(rng.uniform(-2, 2, Hkv))[None, :, None, None]
    k = rng.standard_normal((B, Hkv, S, D)) * mag
    v = rng.standard_normal((B, Hkv, S, D)) * mag[:, ::-1]
    k[:, :, S - 7] *= 6.0  # a spike in the last block
    k_scale = (np.abs(k).max(axis=(0, 2, 3)) / 240.0).astype(np.float32)
    v_scale = (np.abs(v).max(axis=(0, 2, 3)) / 240.0).astype(np.float32)
    kq = (k / k_scale[None, :, None, None]).astype(FP8)
    vq = (v / v_scale[None, :, None, None]).astype(FP8)
    return q, k, v, kq, vq, k_scale, v_scale


def _attn_ref(q, k, v, p_dtype=None):
    """Decode GQA attention in float64; ``p_dtype``: the kernel stores exp(s - m_block) in q's dtype before P.V
    while the row sums use the unrounded values."""
    B, Hq, D = q.shape
    Hkv = k.shape[1]
    G = Hq // Hkv
    s = np.einsum("bhgd,bhsd->bhgs", f64(q).reshape(B, Hkv, G, D), f64(k)) / np.sqrt(D)
    e = np.exp(s - s.max(-1, keepdims=True))
    return (np.einsum("bhgs,bhsd->bhgd", e, f64(v)) / e.sum(-1, keepdims=True)).reshape(B, Hq, D)


@pytest.mark.parametrize("B,Hq,Hkv,S", [(2, 8, 2, 1024), (1, 32, 8, 2048), (4, 16, 4, 512)])
def test_fp8_kv_decode_attention_matches_numpy(lk, B, Hq, Hkv, S):
    """Against the dequantized cache (fp8 value x per-head scale, exact in float64): bf16 tolerance (the
    probabilities are rounded to bf16 for P.V, the output once). Against the unquantized K / V: e4m3 keeps 3
    mantissa bits (relative error <= 1/16 per element), which averaged over a softmax of many keys stays well
    under 0.1 of the output's range."""
    D = 128
    q, k, v, kq, vq, ks, vs = _kv_case(B, Hq, Hkv, S, D, seed=S + Hq)
    kc = np.ascontiguousarray(kq.transpose(0, 1, 3, 2))
    out = lk.fp8_kv_decode_attention(q, kc, vq, ks, vs)
    assert out.dtype == BF16 and out.shape == (B, Hq, D)
    kd, vd = f64(kq) * ks[None, :, None, None], f64(vq) * vs[None, :, None, None]
    want = _attn_ref(q, kd, vd)
    np.testing.assert_allclose(f64(out), want, rtol=1e-2, atol=1e-2 * np.abs(want).max())
    true = _attn_ref(q, k, v)
    assert np.abs(f64(out) - true).max() < 0.1 * np.abs(true).max()
    # ignoring the per-head K scale (one scale for all heads) changes the result: the scales are per head
    assert np.abs(_attn_ref(q, f64(kq) * ks.mean(), vd) - want).max() > 10 * 1e-2 * np.abs(want).max()
    # tiling: per (sequence, key block of 512): Hkv score matmuls into one PSUM tile, 4 p transposes and
    # 4 x Hkv P.V matmuls; DMAs: 2 per head for the scales, per sequence Hkv q loads, 2 per block and the store
    nb, ns = S // 512, 4
    c = op_counts(lk.fp8_kv_decode_attention)
    assert c["nc_matmul"] == B * nb * (Hkv + ns * Hkv)
    assert c["nc_transpose"] == B * nb * ns
    assert c["dma_copy"] == 2 * Hkv + B * (Hkv + 2 * nb + 1)
    assert c["activation"] == 3 * B * nb


def test_fp8_kv_cache_moves_half_the_bytes(lk):
    """The same kernel on a bf16 cache holding the dequantized values (scales 1): the fp8 run reads exactly the
    cache's fp8 bytes less (half the bf16 KV bytes), and, the bf16 run being DMA-bound (its DMA time exceeds
    every compute engine's busy time), finishes sooner."""
    B, Hq, Hkv, S, D = 2, 32, 8, 2048, 128
    q, _, _, kq, vq, ks, vs = _kv_case(B, Hq, Hkv, S, D, seed=5)
    kc = np.ascontiguousarray(kq.transpose(0, 1, 3, 2))
    out8 = lk.fp8_kv_decode_attention(q, kc, vq, ks, vs)
    p8 = lk.fp8_kv_decode_attention.last_profile
    kb = (f64(kc) * ks[None, :, None, None]).astype(BF16)
    vb = (f64(vq) * vs[None, :, None, None]).astype(BF16)
    ones = np.ones(Hkv, np.float32)
    out16 = lk.fp8_kv_decode_attention(q, kb, vb, ones, ones)
    p16 = lk.fp8_kv_decode_attention.last_profile
    close(out8, f64(out16), BF16)  # the same attention, up to the bf16 rounding of the dequantized cache
    kv_fp8_bytes = 2 * B * Hkv * S * D
    assert p16.stat("memory.hbm_read_bytes") - p8.stat("memory.hbm_read_bytes") == kv_fp8_bytes
    assert p16.stat("memory.hbm_read_bytes") > 2 * kv_fp8_bytes  # q and scales on top of the bf16 cache
    compute = max(p16.stat("engine.{}.busy_time".format(e)) for e in ("tensor", "vector", "scalar", "gpsimd"))
    assert p16.stat("dma.active_time") > compute  # the bf16 run is DMA-bound
    assert p8.stat("dma.active_time") < p16.stat("dma.active_time")
    assert p8.total_time_ns < 0.95 * p16.total_time_ns, (p8.total_time_ns, p16.total_time_ns)


@pytest.mark.parametrize("B,Hq,Hkv,S", [(2, 8, 2, 1024), (1, 16, 2, 2048)])
def test_fp8_kv_decode_attention_per_token_beta1(lb1, B, Hq, Hkv, S):
    """Per-token scales (token magnitudes spread over 2^-3 .. 2^3, each token quantized to use the e4m3 range): the
    reference uses the exact fp8 values times their token's scale, with V dequantized to bf16 as the kernel does
    (``nl.multiply(v_tile, vs_col, dtype=bf16)``) and the probabilities rounded to bf16 for P.V. Per (sequence,
    KV head, block of 512 keys): one score matmul, the scale row's partition broadcast, 4 transposes and 4 P.V
    matmuls; DMAs: q and the output per
    (sequence, head), the K block and its scale row, and per 128 keys a V tile and its scale column."""
    D = 128
    rng = np.random.default_rng(S + Hq)
    q = randn((B, Hq, D), BF16, S)
    mag = np.exp2(rng.uniform(-3, 3, (B, Hkv, S, 1)))
    k = rng.standard_normal((B, Hkv, S, D)) * mag
    v = rng.standard_normal((B, Hkv, S, D)) * mag[:, :, ::-1]
    ks = (np.abs(k).max(-1) / 240).astype(np.float32)
    vs = (np.abs(v).max(-1) / 240).astype(np.float32)
    kq, vq = (k / ks[..., None]).astype(FP8), (v / vs[..., None]).astype(FP8)
    out = lb1.fp8_kv_decode_attention_per_token(q, np.ascontiguousarray(kq.transpose(0, 1, 3, 2)), vq, ks, vs)
    assert out.dtype == BF16 and out.shape == (B, Hq, D)
    kd, vd = f64(kq) * ks[..., None], rounded(f64(vq) * vs[..., None], BF16)
    want = _attn_ref(q, kd, vd)
    np.testing.assert_allclose(f64(out), want, rtol=1e-2, atol=1e-2 * np.abs(want).max())
    true = _attn_ref(q, k, v)
    assert np.abs(f64(out) - true).max() < 0.1 * np.abs(true).max()
    # one scale per head instead of per token would be far off (the token magnitudes differ by up to 2^6)
    kh = f64(kq) * ks.mean(-1, keepdims=True)[..., None]
    assert np.abs(_attn_ref(q, kh, vd) - want).max() > 0.1 * np.abs(want).max()
    nb = S // 512
    c = op_counts(lb1.fp8_kv_decode_attention_per_token)
    # (+1 matmul per block: the [1, 512] K-scale row broadcast over the G partitions, a ones matmul)
    assert c["nc_matmul"] == B * Hkv * nb * (1 + 1 + 4) and c["nc_transpose"] == B * Hkv * nb * 4
    assert c["dma_transpose"] == B * Hkv  # q[b, h * G + i_gf, i_dp]: the transposed access is a DMA transpose
    assert c["dma_copy"] == B * Hkv * (1 + nb * (2 + 2 * 4))
    # the cache read once, in fp8: 1 byte per K / V element, 4 per scale
    prof = lb1.fp8_kv_decode_attention_per_token.last_profile
    assert prof.stat("memory.hbm_read_bytes") == 2 * B * Hq * D + 2 * B * Hkv * S * D + 2 * 4 * B * Hkv * S
