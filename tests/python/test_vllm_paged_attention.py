"""vLLM's NKI flash paged attention (``flash_paged_attention``, tests/python/kernels/vllm_flash_paged_attention.py,
written as the public source writes it) run through ``nsim.compat``: its output (and debug tensors: row max,
log-sum-exp, active-part scores) against numpy written here for continuous batching (several sequences, each
with a paged context and new tokens: prefix mask + block-diagonal causal mask), GQA and MHA, block sizes 2 to
128, block tables that are a random permutation of the cache with padding blocks, fp32 and bf16, gen2 (PE
transposes) and gen3 (DMA transposes); its block-table transform for the vectorized (indirect) KV load; and
what its timing must show (one gather per K / V large tile, HBM bytes and transposes as the kernel issues them).
Also the nsim fixes the kernel needed, each with a focused test."""
import numpy as np
import pytest

from conftest import executed_ops, require_core, sample_fixture  # noqa: E402

_core, ml_dtypes = require_core()
from numeric_helpers import close  # noqa: E402

BF16 = ml_dtypes.bfloat16
B_P = 128

pa = sample_fixture("vllm_flash_paged_attention.py")


# --------------------------------------------------------------------------------------------------
# inputs and numpy references
# --------------------------------------------------------------------------------------------------


def paged_inputs(h, kh, d, bs, seqs, blocks_per_tile, num_blocks, dtype=np.float32, seed=0):
    """Continuous batching: ``seqs`` = [(context_len, query_len), ...]. Each sequence's context sits in cache
    blocks drawn from a random permutation of blocks 1.. (block 0 is the padding target), listed in the block
    table one sequence after the other; the table is padded with block 0 to a whole number of large tiles
    (``blocks_per_tile`` blocks each). Returns q, k, v (the new tokens, kernel layouts), the two caches, the
    block table, the mask in natural token order (context columns = table position * bs + offset, then the new
    tokens) and LARGE_TILE_SZ."""
    rng = np.random.default_rng(seed)
    sq = sum(n for _, n in seqs)
    q = rng.standard_normal((1, h, d, sq)).astype(dtype)
    k = rng.standard_normal((1, kh, d, sq)).astype(dtype)
    v = rng.standard_normal((1, kh, sq, d)).astype(dtype)
    kc = rng.standard_normal((num_blocks, kh, bs, d)).astype(dtype)
    vc = rng.standard_normal((num_blocks, kh, bs, d)).astype(dtype)
    free = [int(b) for b in rng.permutation(np.arange(1, num_blocks))]
    table, cols = [], []
    for ctx, _ in seqs:
        cols.append([len(table) * bs + t for t in range(ctx)])
        table += [free.pop() for _ in range(-(-ctx // bs))]
    table += [0] * ((-len(table)) % blocks_per_tile)
    ctx_len = len(table) * bs
    mask = np.zeros((sq, ctx_len + sq), np.int32)
    q0 = 0
    for (_, n), c in zip(seqs, cols):
        for i in range(n):
            mask[q0 + i, c] = 1
            mask[q0 + i, ctx_len + q0:ctx_len + q0 + i + 1] = 1  # causal within the sequence
        q0 += n
    return q, k, v, kc, vc, np.array(table, np.int32), mask, blocks_per_tile * bs


def reorder_context_mask(mask, large_tile, bs):
    """vLLM's host-side ``reorder_context_mask`` in numpy: the vectorized KV load puts the tokens of a large
    tile in (128 blocks, tiled_block_size) order and the kernel consumes them column by column, so the context
    part of the mask is transposed to match within each group of 128 tiled blocks."""
    sq, total = mask.shape
    ctx = total - sq
    n_tiled = max(B_P, large_tile // bs)
    tbs = large_tile // n_tiled
    if tbs == 1:
        return mask
    cm = mask[:, :ctx].reshape(sq, ctx // large_tile, n_tiled // B_P, B_P, tbs).transpose(0, 1, 2, 4, 3)
    return np.ascontiguousarray(np.concatenate([cm.reshape(sq, ctx), mask[:, ctx:]], axis=1))


def reference(q, k, v, kc, vc, table, mask, scale):
    """Float64 attention of each query head over its KV head's (GQA: head // (h // kh)) paged context (the
    table's blocks, in order) and the new tokens, under ``mask`` (natural order). Returns o (1, h, sq, d), and
    the row max and log-sum-exp of the visible scaled scores (1, h, sq) and the scores themselves."""
    h, d, sq = q.shape[1:]
    kh = k.shape[1]
    o, m, lse, s_all = np.zeros((1, h, sq, d)), np.zeros((1, h, sq)), np.zeros((1, h, sq)), []
    for hq in range(h):
        g = hq // (h // kh)
        keys = np.concatenate([kc[table, g].reshape(-1, d), k[0, g].T]).astype(np.float64)
        vals = np.concatenate([vc[table, g].reshape(-1, d), v[0, g]]).astype(np.float64)
        s = q[0, hq].T.astype(np.float64) @ keys.T * scale
        s_all.append(s)
        s = np.where(mask != 0, s, -np.inf)
        m[0, hq] = s.max(1)
        p = np.exp(s - m[0, hq][:, None])
        lse[0, hq] = m[0, hq] + np.log(p.sum(1))
        o[0, hq] = p @ vals / p.sum(1, keepdims=True)
    return o, m, lse, s_all


def _bf16(x):
    return x.astype(BF16).astype(np.float32)


def run(mod, inputs, config="trn2", mixed_precision=True, mask_dtype=np.int32, **kw):
    q, k, v, kc, vc, table, mask, lt = inputs
    kmask = reorder_context_mask(mask, lt, kc.shape[2]).astype(mask_dtype)
    kern = mod.flash_paged_attention.options(config=config)
    res = kern[1, kc.shape[1]](q, k, v, kc, vc, table, kmask, mixed_precision=mixed_precision, LARGE_TILE_SZ=lt,
                               **kw)
    return res, mod.flash_paged_attention


def check(res, inputs, mixed_precision):
    q, k, v, kc, vc, table, mask, _ = inputs
    o = res[0] if isinstance(res, tuple) else res
    assert o.shape == (1, q.shape[1], q.shape[3], q.shape[2]) and o.dtype == q.dtype
    if mixed_precision:  # the kernel computes on bf16 copies of q (scaled), k and v
        q, k, v, kc, vc = (_bf16(x) for x in (q, k, v, kc, vc))
    want = reference(q, k, v, kc, vc, table, mask, 1.0 / np.sqrt(q.shape[2]))[0]
    close(o, want, BF16 if (mixed_precision or q.dtype == BF16) else np.float32)


# --------------------------------------------------------------------------------------------------
# outputs against numpy
# --------------------------------------------------------------------------------------------------

CASES = {
    # fp32 throughout (mixed_precision=False), GQA 2 query heads per KV head, block 32 (16 blocks per 512-token
    # large tile: tiling factor 8, tiled block 4), two sequences, one padding block, gen3 (DMA transposes)
    "fp32_gqa_bs32_trn2": dict(pad=1, h=2, kh=1, d=64, bs=32, seqs=[(300, 60), (150, 68)], bpt=16, nb=40,
                               dtype=np.float32, mp=False, config="trn2"),
    # bf16 in and out, two KV heads (the head-id fused into the block ids) with 2 query heads each
    "bf16_2kv_gqa_bs32_trn2": dict(pad=1, h=4, kh=2, d=64, bs=32, seqs=[(300, 60), (150, 68)], bpt=16, nb=40,
                                   dtype=BF16, mp=True, config="trn2"),
    # MHA on gen2 (PE transposes through PSUM), block 128, two large tiles (online softmax over the
    # sequential_range; the second sequence's rows see nothing of the first tile), two query tiles
    "bf16_mha_bs128_two_tiles_trn1": dict(pad=0, h=2, kh=2, d=32, bs=128, seqs=[(700, 128), (200, 128)], bpt=4, nb=12,
                                          dtype=BF16, mp=True, config="trn1"),
    # block 2: 256 blocks per large tile, two gathers of 128 blocks per K / V tile, no tiling; gen4
    "fp32_mp_bs2_two_loads_trn3": dict(pad=6, h=2, kh=1, d=64, bs=2, seqs=[(500, 128)], bpt=256, nb=300,
                                       dtype=np.float32, mp=True, config="trn3"),
    # a cache of 8 blocks: the flattened cache has 64 rows, fewer than the 128 partitions a gather fills; 9 of
    # the 16 table entries are padding
    "fp32_small_cache_bs32_trn2": dict(pad=9, h=2, kh=1, d=32, bs=32, seqs=[(100, 64), (90, 64)], bpt=16, nb=8,
                                       dtype=np.float32, mp=False, config="trn2"),
    # block 4, 128 blocks per tile (tiling factor 1), fp32
    "fp32_bs4_trn2": dict(pad=5, h=1, kh=1, d=64, bs=4, seqs=[(470, 100), (20, 28)], bpt=128, nb=200,
                          dtype=np.float32, mp=False, config="trn2"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_flash_paged_attention_matches_numpy(pa, case):
    c = CASES[case]
    mod = pa[0]
    inputs = paged_inputs(c["h"], c["kh"], c["d"], c["bs"], c["seqs"], c["bpt"], c["nb"], c["dtype"],
                          seed=len(case))
    table = inputs[5]
    assert np.any(np.diff(table[table > 0]) != 1), "the block table should not be a run of consecutive blocks"
    assert np.count_nonzero(table == 0) == c["pad"]  # padding blocks (block 0: no sequence's)
    res, _ = run(mod, inputs, c["config"], c["mp"])
    check(res, inputs, c["mp"])


def test_long_query_skips_tiles_above_the_diagonal(pa):
    """seq_q 1024 (8 query tiles, B_F_SIZE 512, REDUCTION_TILE 512): in the active part the query tile i computes
    the 512-key chunk c only when ``i * 128 >= c * 512`` (the others are set to -9984 without a matmul): 8 + 4 QK
    matmuls there, one per large tile and query tile in the prefix. d = 128, block 64, bf16."""
    mod = pa[0]
    inputs = paged_inputs(1, 1, 128, 64, [(600, 1000), (300, 24)], 8, 40, BF16, seed=3)
    res, kern = run(mod, inputs)
    check(res, inputs, True)
    lines = open(mod.__file__).read().splitlines()
    qk_line = [i for i, t in enumerate(lines, 1) if "qk_psum[:, :] = nl.matmul(" in t][0]
    qk = [o for o in executed_ops(kern.last_json["body"]) if o["op"] == "nc_matmul" and o["loc"]["line"] == qk_line]
    n_large = len(inputs[5]) * 64 // 512
    assert len(qk) == n_large * 8 + 12


def test_bool_and_uint8_masks_keyword_call(pa):
    """vLLM calls the kernel with keyword arguments and an explicit softmax_scale; nl.where takes any nonzero
    mask value as true (bool and uint8 masks give the int32 mask's result)."""
    mod = pa[0]
    inputs = paged_inputs(2, 1, 64, 32, [(200, 100), (90, 28)], 16, 30, np.float32, seed=9)
    q, k, v, kc, vc, table, mask, lt = inputs
    outs = []
    for mdt in (np.int32, np.bool_, np.uint8):
        kmask = reorder_context_mask(mask, lt, 32).astype(mdt)
        outs.append(mod.flash_paged_attention[1, 1](
            query=q, key=k, value=v, key_cache=kc, value_cache=vc, block_tables=table, mask=kmask,
            softmax_scale=0.125, mixed_precision=False, LARGE_TILE_SZ=lt))
    check(outs[0], inputs, False)
    np.testing.assert_array_equal(outs[1], outs[0])
    np.testing.assert_array_equal(outs[2], outs[0])


def test_debug_tensors(pa):
    """``return_debug_tensors=True``: o, the row max m and log-sum-exp l of the visible scaled scores (the online
    softmax's statistics), and the active part's scaled scores of the first query tile (-9984 where masked)."""
    mod = pa[0]
    inputs = paged_inputs(2, 1, 64, 32, [(300, 60), (150, 68)], 16, 40, np.float32, seed=4)
    (o, m, lse, qk), _ = run(mod, inputs, mixed_precision=False, return_debug_tensors=True)
    q, k, v, kc, vc, table, mask, _ = inputs
    want_o, want_m, want_lse, scores = reference(q, k, v, kc, vc, table, mask, 1 / 8)
    close(o, want_o)
    close(m, want_m)
    close(lse, want_lse)
    ctx = len(table) * 32
    for hq in range(2):
        want = np.where(mask[:, ctx:] != 0, scores[hq][:, ctx:], -9984.0)
        close(qk[0, hq], want)


# --------------------------------------------------------------------------------------------------
# the block-table transform of the vectorized KV load
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("num_tiles,bpt,kh,head", [
    (3, 16, 1, 0),      # tiling factor 8: each block id becomes 8 rows of the flattened cache
    (130, 16, 3, 2),    # 130 large tiles: two partitions of block tables (a masked load of the second)
    (2, 256, 2, 1),     # 256 blocks per tile: factor 1, two loads of 128 blocks
])
def test_block_table_transform(pa, num_tiles, bpt, kh, head):
    """``load_block_tables`` then ``transform_block_tables_for_indirect_load`` (head_id through nisa.iota and a
    PE transpose, the tiling offsets through an iota broadcast over partitions): entry ``[load, p, tile]`` is the
    row of the flattened cache ``(num_blocks * kh * factor, tiled_block_size * d)`` that partition p reads for
    that tile: ``(table[tile, j] * kh + head) * factor + f`` with ``j * factor + f = load * 128 + p`` (tiles past
    the table, up to a multiple of 128, read block 0)."""
    mod, nki, nl, _ = pa
    factor = max(1, B_P // bpt)
    num_loads = -(-bpt // B_P)

    @nki.jit
    def transform(block_tables, num_tiles, bpt, kh, head, factor):
        bt = mod.load_block_tables(block_tables_hbm=block_tables, num_tiles=num_tiles, num_blocks_per_tile=bpt)
        t = mod.transform_block_tables_for_indirect_load(bt, block_size_tiling_factor=factor, num_head=kh,
                                                         head_id=head)
        n_loads, _, width = t.shape
        out = nl.ndarray((n_loads, B_P, width), dtype=nl.int32, buffer=nl.shared_hbm)
        for i in nl.affine_range(n_loads):
            nl.store(out[i], t[i])
        return out

    table = np.random.default_rng(num_tiles).integers(0, 50, num_tiles * bpt).astype(np.int32)
    got = transform(table, num_tiles, bpt, kh, head, factor)
    padded = np.zeros((-(-num_tiles // B_P) * B_P, bpt), np.int64)
    padded[:num_tiles] = table.reshape(num_tiles, bpt)
    rows = ((padded * kh + head)[:, :, None] * factor + np.arange(factor)).reshape(len(padded), bpt * factor)
    want = rows.reshape(len(padded), num_loads, B_P).transpose(1, 2, 0)
    np.testing.assert_array_equal(got, want)


# --------------------------------------------------------------------------------------------------
# timing sanity
# --------------------------------------------------------------------------------------------------


def _hbm_read_bytes(h, kh, d, sq, n_blocks, n_large, lt, tbs, num_loads, isz):
    """The HBM bytes the kernel's loads read (per KV head, times kh): the block table (int32), per large tile one
    K and one V gather of 128 rows of tiled_block_size * d, per large tile and query tile the int32 mask tile and
    the query tile of each query head; then the new tokens' K and V, their mask tiles and the query tiles again."""
    n_q = sq // B_P
    per_head = (n_blocks * 4 + 2 * n_large * num_loads * B_P * tbs * d * isz
                + n_large * n_q * (B_P * lt * 4 + (h // kh) * d * B_P * isz)
                + 2 * sq * d * isz + n_q * (B_P * sq * 4 + (h // kh) * d * B_P * isz))
    return kh * per_head


def test_gathers_and_hbm_traffic_scale_with_the_blocks(pa):
    """Twice the context (2 large tiles instead of 1): one indirect K and one V load (a gather of 128 partitions
    of tiled_block_size x d elements, indices bounded by the flattened cache's rows) per large tile and KV head;
    the HBM bytes read are exactly what the loads move; the kernel takes longer."""
    mod = pa[0]
    h, kh, d, bs, bpt = 2, 2, 64, 32, 16
    runs = []
    for ctx in (400, 900):
        inputs = paged_inputs(h, kh, d, bs, [(ctx, 128)], bpt, 40, np.float32, seed=ctx)
        res, kern = run(mod, inputs, mixed_precision=False)
        check(res, inputs, False)
        n_blocks = len(inputs[5])
        n_large = n_blocks // bpt
        gathers = [o for o in executed_ops(kern.last_json["body"]) if o["op"] == "dma_copy" and "offsets" in o]
        assert len(gathers) == 2 * n_large * kh
        assert all(g["iimm"] == [40 * kh * 8, 4 * d] for g in gathers)  # factor 8, tiled block 4
        prof = kern.last_profile
        assert prof.stat("memory.hbm_read_bytes") == _hbm_read_bytes(h, kh, d, 128, n_blocks, n_large, 512, 4, 1, 4)
        runs.append((n_large, prof.total_time_ns))
    assert [n for n, _ in runs] == [1, 2]
    assert runs[1][1] > runs[0][1] * 1.2, runs


def test_transposes_and_matmuls_per_generation(pa):
    """The probabilities are transposed in 128 x 128 pieces, LARGE_TILE_SZ / 128 per core call: by DMA on gen3
    (``nisa.dma_transpose``, written straight into the SBUF tile: no copy), on TensorE through PSUM before
    (``nisa.nc_transpose``, the PSUM tile then copied once per 512 columns). The K tiles are PE-transposed
    (tiled_block_size per large tile) on both; matmuls: per query head 1 + 4 (QK, PV) for the 512-token large tile
    and 1 + 1 for the 128 new tokens. Same output on both."""
    mod = pa[0]
    inputs = paged_inputs(2, 1, 64, 32, [(300, 60), (150, 68)], 16, 40, np.float32, seed=7)
    lines = open(mod.__file__).read().splitlines()

    def line_of(text):
        return [i for i, t in enumerate(lines, 1) if text in t][0]

    outs = {}
    for config in ("trn1", "trn2"):
        res, kern = run(mod, inputs, config, mixed_precision=False)
        check(res, inputs, False)
        outs[config] = res
        ops = executed_ops(kern.last_json["body"])

        def at(op, text):
            return [o for o in ops if o["op"] == op and o["loc"]["line"] == line_of(text)]

        p_t = "p_local_t_tmp[:, j_128_slice] = nisa."
        assert len(at("nc_matmul", "qk_psum[:, :] = nl.matmul(")) == 2 * 2
        assert len(at("nc_matmul", "pv_psum[:, :] += nl.matmul(")) == 2 * (4 + 1)
        assert len(at("nc_transpose", "] = nl.transpose(loaded[:, nl.ds(tb_i")) == 4
        if config == "trn2":
            assert len(at("dma_transpose", "nisa.dma_transpose(")) == 2 * 5
            assert at("tensor_copy", p_t) == [] and at("nc_transpose", p_t) == []
        else:
            assert len(at("nc_transpose", "nisa.nc_transpose(")) == 2 * 5
            assert [o for o in ops if o["op"] == "dma_transpose"] == []
        assert len(at("tensor_copy", "p_local_transposed[:, nl.ds(i * B_F_SIZE")) == 2 * 2
    np.testing.assert_allclose(outs["trn1"], outs["trn2"], rtol=1e-6, atol=1e-6)


# --------------------------------------------------------------------------------------------------
# nsim fixes the kernel needed
# --------------------------------------------------------------------------------------------------


def test_indirect_load_selects_rows_of_a_reshaped_or_indexed_hbm_tensor(b1):
    """Beta-1 ``t[idx_tile[i_p, 0], i_f]`` selects rows of ``t`` as indexed: of a whole-tensor reshape (vLLM's KV
    cache flattened to ``(blocks * heads * factor, tiled_block * d)``) and of an integer-indexed view
    (``x[1][idx, i_f]``), not of the storage's first dim (before: the cache's block stride and the index bound
    ``num_blocks``, NSIM-E408 on a valid row)."""
    nki, nl, _ = b1

    @nki.jit
    def gather(cache, x, idx):
        rows = cache.shape[0] * cache.shape[1] * 2
        flat = cache.reshape((rows, cache.shape[2] // 2 * cache.shape[3]))
        it = nl.load(idx)
        i_p = nl.arange(128)[:, None]
        i_f = nl.arange(flat.shape[1])[None, :]
        a = nl.load(flat[it[i_p, 0], i_f])
        i_g = nl.arange(x.shape[2])[None, :]
        b = nl.load(x[1][it[i_p, 0], i_g])
        out_a = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        out_b = nl.ndarray(b.shape, dtype=b.dtype, buffer=nl.shared_hbm)
        nl.store(out_a, a)
        nl.store(out_b, b)
        return out_a, out_b

    rng = np.random.default_rng(0)
    cache = rng.standard_normal((10, 3, 8, 16)).astype(np.float32)
    x = rng.standard_normal((2, 60, 24)).astype(np.float32)
    idx = rng.integers(0, 60, (128, 1)).astype(np.int32)
    a, b = gather(cache, x, idx)
    np.testing.assert_array_equal(a, cache.reshape(60, 64)[idx[:, 0]])
    np.testing.assert_array_equal(b, x[1][idx[:, 0]])
    gathers = [o for o in gather.last_json["body"] if o.get("op") == "dma_copy" and "offsets" in o]
    assert [g["iimm"] for g in gathers] == [[60, 64], [60, 24]]


def test_value_assigned_into_a_view_is_written_directly(b1):
    """``t[idx] = <fresh value>`` lets the value's instruction(s) write ``t[idx]`` (no copy through a temporary)
    also for: a DMA transpose (same dtype), a reduction's (P,) result into a column, and ``nl.where`` (its fill of
    y, then its predicated copy of x). A where that reads the view it is assigned to keeps its temporary."""
    nki, nl, nisa = b1

    @nki.jit
    def k(a, c):
        out = nl.ndarray((128, 512), dtype=np.float32, buffer=nl.shared_hbm)
        x = nl.load(a)
        cond = nl.load(c)
        t = nl.ndarray((nl.par_dim(128), 512), dtype=np.float32)
        for j in nl.affine_range(2):
            t[:, nl.ds(j * 128, 128)] = nisa.dma_transpose(x[:, nl.ds(j * 128, 128)])
        for j in nl.affine_range(2):
            t[:, nl.ds(256 + j * 128, 128)] = nl.where(cond[:, nl.ds(j * 128, 128)], x[:, nl.ds(j * 128, 128)],
                                                       -5.0, dtype=np.float32)
        m = nl.ndarray((nl.par_dim(128), 2), dtype=np.float32)
        for j in nl.affine_range(2):
            m[:, j] = nisa.tensor_reduce(np.max, t[:, nl.ds(j * 256, 256)], axis=(1,), dtype=np.float32)
        t[:, 0:2] = nl.where(cond[:, 0:2], t[:, 0:2], m)  # reads t after its fill: computed, then copied into t
        nl.store(out, t)
        return out

    rng = np.random.default_rng(2)
    a = rng.standard_normal((128, 256)).astype(np.float32)
    c = rng.integers(0, 2, (128, 256)).astype(np.int32)
    got = k(a, c)
    want = np.concatenate([a[:, :128].T, a[:, 128:].T, np.where(c != 0, a, -5.0)], axis=1)
    mx = want.reshape(128, 2, 256).max(-1)
    want[:, :2] = np.where(c[:, :2] != 0, want[:, :2], mx)
    np.testing.assert_array_equal(got, want)
    ops = executed_ops(k.last_json["body"])
    names = [o["op"] for o in ops]
    assert names.count("dma_transpose") == 2 and names.count("tensor_reduce") == 2
    assert all(isinstance(o["dst"], dict) and o["dst"]["tensor"] == "t"
               for o in ops if o["op"] in ("dma_transpose", "memset"))
    assert all(o["dst"]["tensor"] == "m" for o in ops if o["op"] == "tensor_reduce")
    preds = [o for o in ops if o["op"] == "tensor_copy_predicated"]
    assert [isinstance(o["dst"], dict) and o["dst"].get("tensor") == "t" for o in preds] == [True, True, False]
    assert names.count("tensor_copy") == 2  # the last where: its fill (a copy of m), then its result into t


def test_tiles_of_a_continuation_line_are_named_after_the_statement(b1):
    """A call on a continuation line of a multi-line statement (vLLM's ``offset = nisa.iota(...,\\n
    dtype=nl.int32).broadcast_to(shape)``: Python reports the line of ``.broadcast_to``) names its tiles after the
    statement's variable, not after the ``dtype=`` keyword that begins that line."""
    nki, nl, nisa = b1

    @nki.jit
    def k(a):
        out = nl.ndarray((128, 4, 8), dtype=nl.int32, buffer=nl.shared_hbm)
        offset = nisa.iota(nl.arange(8)[None, None, :],
                           dtype=nl.int32).broadcast_to((128, 4, 8))
        nl.store(out, offset)
        return out

    got = k(np.zeros(1, np.float32))
    np.testing.assert_array_equal(got, np.broadcast_to(np.arange(8), (128, 4, 8)))
    names = [s["alloc"]["name"] for s in k.last_json["body"] if "alloc" in s]
    assert names and all(n.startswith("offset") for n in names if n != "out"), names
