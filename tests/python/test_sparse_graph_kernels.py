"""Sparse, graph and segment kernels written the way public NKI ports of sparse and GNN layers write them
(tests/python/kernels/sparse_graph_kernels.py, Beta 1, and sparse_graph_kernels_new.py, new dialect; both
unmodified, through ``nsim.compat``): SpMM with a padded-CSR / ELL matrix (rows of B gathered by indirect
``nl.load`` and by ``.ap(vector_offset=)``), block-sparse (BSR, 128 x 128 blocks) matmul over a host-side block
list, GraphSAGE mean aggregation with an ``nl.atomic_rmw`` scatter-add, GCN mean aggregation by a one-hot
(sort-then-segment-sum) matmul, segment sum (one-hot matmul) and segment max (masked max) over sorted segment ids,
the embedding-bag backward scatter-add with repeated ids (``nisa.dma_compute``, the ids made unique per scatter on
chip), and top-k block-sparse attention with runtime-selected key blocks.

Indices are int32 from the host with duplicates wherever the math allows them (repeated ELL columns, repeated
edges and hub destinations, repeated BSR blocks, repeated bag ids, a key block selected twice), empty rows /
segments / nodes of degree 0, and 2-4 tiles per dim with ragged last tiles.

Checked: every output against a float64 numpy reference (fp32 1e-5; bf16 1e-2 after the kernel's roundings),
integer results (degrees, counts) exactly, two formulations of the same math against each other (the two dialects'
ELL SpMM bit for bit, the atomic and the one-hot aggregation), no sanitizer report (conftest turns one into an
error), and the structure and timing the sparsity implies: one gather per stored ELL slot, one scatter per edge
tile, one PE matmul per stored block (so time and FLOPs follow the number of stored blocks, not the dense shape),
one scatter per embedding-bag tile writing only the tile's distinct ids, the node-tile edge ranges cutting the
one-hot matmuls, and an out-of-range runtime block index an error at the kernel's line.

The nsim fixes this family needed (the kernels keep the work-arounds first used: an explicit ``broadcast_to`` of the
condition, ``nl.fp32.min`` for -inf, a masked ragged chunk; the tests at the end check the fixed forms):
``nl.where`` with a lower-rank condition was E425 (the result took the condition's shape, not the three operands'
broadcast shape); ``nl.where(c, x, -np.inf)`` was a false NSIM-W503 (the -inf the predicated copy keeps counted as
produced); a predicated copy reading a half-written tile was a false NSIM-W501 even where its predicate selected only
written elements."""
import inspect

import numpy as np
import pytest

from conftest import executed_ops, require_core, sample_fixture  # noqa: E402
from conftest import op_counts as _ops  # noqa: E402

_core, ml_dtypes = require_core()
from nsim import _errors  # noqa: E402
from nsim.tracer import NsimError  # noqa: E402
from numeric_helpers import close, rounded  # noqa: E402
from numeric_helpers import randn as _randn, f64 as _f64  # noqa: E402
from nki_helpers import code_of as _code  # noqa: E402

BF16 = ml_dtypes.bfloat16

sg = sample_fixture("sparse_graph_kernels.py", module_only=True)
sgn = sample_fixture("sparse_graph_kernels_new.py", module_only=True)


def _rng(seed):
    return np.random.default_rng(seed)


def _line(mod, marker):
    """``sparse_graph_kernels*.py:line`` of the first line of ``mod``'s source containing ``marker``."""
    src, _ = inspect.findsource(mod)
    return "{}:{}".format(mod.__file__.rsplit("/", 1)[-1], next(i for i, ln in enumerate(src) if marker in ln) + 1)


# --------------------------------------------------------------------------------------------------
# SpMM, padded CSR / ELL
# --------------------------------------------------------------------------------------------------

def _ell(M, N, K, seed):
    """A sparse [M, N] matrix as ELL (col_idx, values) [M, K]: rows of K stored entries, some with a column
    stored twice (its values add), rows 5..39 short (2 entries, padded with column 0 and value 0), row 7 empty."""
    r = _rng(seed)
    col = r.integers(0, N, (M, K)).astype(np.int32)
    val = r.standard_normal((M, K)).astype(np.float32)
    col[::3, 1] = col[::3, 0]            # a repeated column in every third row
    col[5:40, 2:], val[5:40, 2:] = 0, 0.0
    col[7, :], val[7, :] = 0, 0.0
    return col, val


def _dense(col, val, N):
    A = np.zeros((col.shape[0], N))
    np.add.at(A, (np.repeat(np.arange(col.shape[0]), col.shape[1]), col.ravel()), _f64(val).ravel())
    return A


SPMM_CASES = [  # M, N, K, D, tile_d, dtype
    (300, 500, 6, 96, 64, np.float32),     # 3 row tiles (ragged), 2 column chunks (ragged)
    (512, 384, 4, 128, 512, BF16),         # 4 full row tiles, B in bf16
    (200, 1000, 8, 200, 128, np.float32),  # 2 row tiles, 2 column chunks
]


@pytest.mark.parametrize("M,N,K,D,tile_d,dtype", SPMM_CASES)
def test_spmm_ell_beta1_matches_dense(sg, M, N, K, D, tile_d, dtype):
    col, val = _ell(M, N, K, 1)
    b = _randn((N, D), dtype, 2)
    got = sg.spmm_ell_kernel(col, val, b, tile_d=tile_d)
    assert got.dtype == np.dtype(dtype)
    close(got, _dense(col, val, N) @ _f64(b), dtype)
    assert not got[7].any()  # the empty row


def test_spmm_ell_structure(sg):
    """Per row tile: the index and value tiles loaded once; per column chunk K gathers of B's rows (one DMA of up
    to 128 rows each), K fused multiply-adds and one store. HBM reads are the index / value bytes plus K rows of
    B per matrix row and column chunk (the ragged tile's masked-out rows are not read)."""
    M, N, K, D, tile_d = 300, 500, 6, 96, 64
    col, val = _ell(M, N, K, 3)
    b = _randn((N, D), np.float32, 4)
    sg.spmm_ell_kernel(col, val, b, tile_d=tile_d)
    n_rt, n_d = 3, 2
    ops = _ops(sg.spmm_ell_kernel)
    assert ops["dma_copy"] == n_rt * (2 + n_d * (K + 1))
    assert ops["scalar_tensor_tensor"] == n_rt * n_d * K
    prof = sg.spmm_ell_kernel.last_profile
    assert prof.stat("memory.hbm_read_bytes") == col.nbytes + val.nbytes + M * K * D * 4
    assert prof.stat("memory.hbm_write_bytes") == M * D * 4


@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_spmm_ell_dialects_agree_bit_for_bit(sg, sgn, dtype):
    """The new-dialect ELL SpMM (``.ap(vector_offset=)`` gathers) does the same fp32 multiply-adds in the same
    order as the Beta-1 one: the same bits."""
    M, N, K, D = 300, 400, 5, 96
    col, val = _ell(M, N, K, 5)
    b = _randn((N, D), dtype, 6)
    new = sgn.spmm_ell(col, val, b)
    np.testing.assert_array_equal(new.view(np.uint8), sg.spmm_ell_kernel(col, val, b).view(np.uint8))
    close(new, _dense(col, val, N) @ _f64(b), dtype)
    ops = _ops(sgn.spmm_ell)
    assert ops["scalar_tensor_tensor"] == 3 * K


# --------------------------------------------------------------------------------------------------
# Block-sparse (BSR) matmul
# --------------------------------------------------------------------------------------------------

def _bsr(blocks, dtype, seed):
    a = _randn((len(blocks), 128, 128), dtype, seed, scale=0.1)
    return a


def _bsr_dense(a, blocks, M, K):
    A = np.zeros((M, K))
    for i, (r, c) in enumerate(blocks):
        A[r * 128:(r + 1) * 128, c * 128:(c + 1) * 128] += _f64(a[i])
    return A


BSR_CASES = [  # M, K, N, blocks, dtype
    # block row 1 empty, blocks out of order, (0, 1) stored twice
    (384, 512, 640, [(2, 3), (0, 1), (0, 3), (2, 0), (2, 2), (0, 1)], np.float32),
    (512, 256, 256, [(0, 0), (1, 1), (2, 0), (3, 1), (3, 0)], BF16),
    (256, 384, 512, [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)], BF16),  # all blocks: dense
]


@pytest.mark.parametrize("M,K,N,blocks,dtype", BSR_CASES)
def test_bsr_matmul_matches_dense(sgn, M, K, N, blocks, dtype):
    a = _bsr(blocks, dtype, 7)
    b = _randn((K, N), dtype, 8)
    got = sgn.bsr_matmul(a, b, blocks, M)
    assert got.dtype == np.dtype(dtype)
    want = _bsr_dense(a, blocks, M, K) @ _f64(b)
    close(got, want, dtype)
    stored_rows = {r for r, _ in blocks}
    for br in range(M // 128):
        if br not in stored_rows:
            assert not got[br * 128:(br + 1) * 128].any()  # an empty block row: exact zeros


def test_bsr_matmul_pe_work_follows_stored_blocks(sgn):
    """Only the stored blocks reach the PE: one transpose per stored block and one matmul per stored block and
    512-column chunk of B; the model FLOPs are 2 x 128 x 128 x N per stored block; B's block rows are read once
    per stored block and chunk. Both the PE work and B's bytes follow the stored blocks, so a quarter of the blocks
    takes well under half the time of all of them (about 0.31x on trn2: the fixed cost of loading, transposing and
    storing stays)."""
    M, K, N = 512, 512, 1024
    dense = [(r, c) for r in range(4) for c in range(4)]
    sparse = [(0, 0), (1, 2), (2, 1), (3, 3)]
    times = {}
    for name, blocks in (("dense", dense), ("sparse", sparse)):
        a = _bsr(blocks, BF16, 9)
        b = _randn((K, N), BF16, 10)
        close(sgn.bsr_matmul(a, b, blocks, M), _bsr_dense(a, blocks, M, K) @ _f64(b), BF16)
        ops = _ops(sgn.bsr_matmul)
        prof = sgn.bsr_matmul.last_profile
        assert ops["nc_transpose"] == len(blocks)
        assert ops["nc_matmul"] == len(blocks) * 2
        assert prof.stat("engine.matmul_instruction_count") == len(blocks) * 2
        assert prof.stat("flops.model") == 2 * 128 * 128 * N * len(blocks)
        assert prof.stat("memory.hbm_read_bytes") == a.nbytes + len(blocks) * 128 * N * 2
        times[name] = prof.total_time_ns
    assert times["sparse"] < 0.5 * times["dense"], times


# --------------------------------------------------------------------------------------------------
# GNN message passing
# --------------------------------------------------------------------------------------------------

def _graph(N, E, seed, sort=False):
    """An edge list with repeated edges, a hub destination (node 3, a tenth of the edges) and nodes 250.. with no
    in-edge; sorted by destination when ``sort``."""
    r = _rng(seed)
    src = r.integers(0, N, E).astype(np.int32)
    dst = r.integers(0, min(N, 250), E).astype(np.int32)
    dst[::10] = 3
    src[1::7], dst[1::7] = src[0::7][:len(src[1::7])], dst[0::7][:len(dst[1::7])]  # repeated edges
    if sort:
        o = np.argsort(dst, kind="stable")
        src, dst = src[o], dst[o]
    return src, dst


def _mean_agg(x, src, dst, N):
    s = np.zeros((N, x.shape[1]))
    np.add.at(s, dst, _f64(x)[src])
    deg = np.bincount(dst, minlength=N).astype(np.float64)
    return s / np.maximum(deg, 1)[:, None], deg


SAGE_CASES = [  # N, F, Fo, E, dtype
    (300, 160, 64, 1000, np.float32),   # 3 node tiles (ragged), F in two chunks of the PE, 8 edge tiles (ragged)
    (384, 128, 96, 512, BF16),          # 3 full node tiles, 4 full edge tiles
]


@pytest.mark.parametrize("N,F,Fo,E,dtype", SAGE_CASES)
def test_sage_mean_matches_numpy(sg, N, F, Fo, E, dtype):
    x = _randn((N, F), dtype, 11)
    ws = _randn((F, Fo), dtype, 12, scale=0.1)
    wn = _randn((F, Fo), dtype, 13, scale=0.1)
    src, dst = _graph(N, E, 14)
    out, h = sg.sage_mean_kernel(x, src, dst, ws, wn)
    mean, deg = _mean_agg(x, src, dst, N)
    close(h, mean)                    # fp32 sums of the (exact) source rows
    assert not h[250:].any()          # no in-edge: 0
    assert out.dtype == np.dtype(dtype)
    close(out, _f64(x) @ _f64(ws) + rounded(h, np.float32) @ _f64(wn), dtype)


def test_sage_mean_structure_and_edge_order(sg):
    """One gather and one scatter-add (an accumulating DMA) per edge tile; per node tile 2 x 2 PE transposes and
    matmuls (x and the mean, F = 160 in two chunks). The scatter-add applies every duplicate destination, so the
    edge order does not matter beyond fp32 rounding."""
    N, F, Fo, E = 300, 160, 64, 1000
    x = _randn((N, F), np.float32, 15)
    ws, wn = _randn((F, Fo), np.float32, 16, 0.1), _randn((F, Fo), np.float32, 17, 0.1)
    src, dst = _graph(N, E, 18)
    out, h = sg.sage_mean_kernel(x, src, dst, ws, wn)
    body = sg.sage_mean_kernel.last_json["body"]
    dmas = [o for o in executed_ops(body) if o["op"] == "dma_copy"]
    n_et, n_nt = 8, 3
    assert sum("accumulate" in o.get("flags", []) for o in dmas) == n_et
    assert sum("offsets" in o for o in dmas) == 2 * n_et  # gathers and scatters
    ops = _ops(sg.sage_mean_kernel)
    assert ops["nc_matmul"] == n_nt * 2 * 2 and ops["nc_transpose"] == n_nt * 2 * 2
    perm = _rng(19).permutation(E)
    out2, h2 = sg.sage_mean_kernel(x, src[perm], dst[perm], ws, wn)
    close(h2, h)
    close(out2, out)


def test_gcn_onehot_matches_atomic_and_numpy(sg):
    """The sort-then-segment-sum aggregation (one-hot [edges, nodes] x gathered rows on the PE) gives the mean of
    the atomic scatter-add kernel; the degree (the ones column's sum) is exact; with the node tiles' edge-tile
    ranges from the host only the edge tiles that reach a node tile are multiplied: fewer matmuls and less time,
    the same result."""
    N, F, Fo, E = 300, 96, 64, 700
    x = _randn((N, F), np.float32, 20)
    w = _randn((F, Fo), np.float32, 21, 0.1)
    src, dst = _graph(N, E, 22, sort=True)
    mean, deg = _mean_agg(x, src, dst, N)
    n_et, n_nt = 6, 3
    ranges = [(int(np.searchsorted(dst, nt * 128)) // 128, -(-int(np.searchsorted(dst, nt * 128 + 128)) // 128))
              for nt in range(n_nt)]
    res = {}
    for name, tr in (("all", None), ("ranges", ranges)):
        out, dg = sg.gcn_onehot_kernel(x, src, dst, w, tr)
        np.testing.assert_array_equal(dg[:, 0], deg)
        close(out, mean @ _f64(w))
        ops = _ops(sg.gcn_onehot_kernel)
        n_mm = n_nt * n_et if tr is None else sum(b - a for a, b in ranges)
        assert ops["nc_matmul"] == n_mm + n_nt   # + the linear layer (F <= 128: one chunk)
        res[name] = (out, sg.gcn_onehot_kernel.last_profile.total_time_ns)
    assert sum(b - a for a, b in ranges) < n_nt * n_et
    np.testing.assert_array_equal(res["all"][0], res["ranges"][0])   # the skipped tiles added exact zeros
    assert res["ranges"][1] < res["all"][1], res
    _, h = sg.sage_mean_kernel(x, src, dst, w, w)
    close(h, mean)


# --------------------------------------------------------------------------------------------------
# Segment reductions
# --------------------------------------------------------------------------------------------------

def _segments(N, S, seed):
    """Sorted segment ids in [0, S) with empty segments (none in [40, 60), none past S - 10) and one long segment
    (ids 100 repeated 150 times: it spans row tiles)."""
    r = _rng(seed)
    ids = r.integers(0, S - 10, N)
    ids[(ids >= 40) & (ids < 60)] = 39
    ids[:150] = 100
    return np.sort(ids).astype(np.int32)


def _seg_max_ref(data, seg, S):
    out = np.zeros((S, data.shape[1]), np.float64)
    for s in np.unique(seg):
        out[s] = _f64(data[seg == s]).max(0)
    return out


SEG_CASES = [  # N, D, S, dtype
    (500, 64, 300, np.float32),   # 4 row tiles (ragged), 3 segment tiles (ragged)
    (300, 128, 200, BF16),
    (300, 48, 150, np.float32),   # segment max: chunks of 170 rows, the last one ragged (130)
]


@pytest.mark.parametrize("N,D,S,dtype", SEG_CASES)
def test_segment_sum_matches_numpy(sgn, N, D, S, dtype):
    data = _randn((N, D), dtype, 23)
    seg = _segments(N, S, 24)
    got = sgn.segment_sum(data, seg, S)
    want = np.zeros((S, D))
    np.add.at(want, seg, _f64(data))
    close(got, want, dtype)
    empty = np.setdiff1d(np.arange(S), seg)
    assert len(empty) > 20 and not got[empty].any()
    n_rt, n_st = -(-N // 128), -(-S // 128)
    assert _ops(sgn.segment_sum)["nc_matmul"] == n_rt * n_st


@pytest.mark.parametrize("N,D,S,dtype", SEG_CASES)
def test_segment_max_both_dialects(sg, sgn, N, D, S, dtype):
    """Masked max per segment: exact (a max rounds nothing); data shifted negative so an empty segment's 0 and a
    segment's negative max are told apart; the two dialects agree bit for bit."""
    data = (_randn((N, D), np.float32, 25) - 8.0).astype(dtype)
    seg = _segments(N, S, 26)
    want = _seg_max_ref(data, seg, S).astype(dtype)
    new = sgn.segment_max(data, seg, S)
    b1 = sg.segment_max_kernel(data, seg, S)
    np.testing.assert_array_equal(new, want)
    np.testing.assert_array_equal(b1.view(np.uint8), new.view(np.uint8))
    assert (want[np.unique(seg)] < 0).all()


def test_segment_max_chunk_size_does_not_matter(sg, sgn):
    N, D, S = 300, 32, 150
    data = _randn((N, D), np.float32, 27)
    seg = _segments(N, S, 28)
    want = _seg_max_ref(data, seg, S).astype(np.float32)
    for chunk in (64, 100):
        np.testing.assert_array_equal(sgn.segment_max(data, seg, S, chunk=chunk), want)
        np.testing.assert_array_equal(sg.segment_max_kernel(data, seg, S, chunk=chunk), want)


# --------------------------------------------------------------------------------------------------
# Embedding-bag backward
# --------------------------------------------------------------------------------------------------

def _bag_grad_ref(ids, g, V, mode):
    B, L = ids.shape
    want = np.zeros((V, g.shape[1]))
    w = 1.0 / L if mode == "mean" else 1.0
    np.add.at(want, ids.ravel(), np.repeat(_f64(g), L, axis=0) * w)
    return want


BAG_CASES = [  # B, L, H, V, mode
    (80, 4, 64, 50, "sum"),     # 320 items: tiles of 128, 128, 64; 50 ids: every id repeated in every tile
    (80, 4, 64, 50, "mean"),
    (96, 8, 256, 1000, "sum"),  # 768 items: 6 tiles, few repeats
    (64, 2, 32, 3, "mean"),     # 3 ids only
]


@pytest.mark.parametrize("B,L,H,V,mode", BAG_CASES)
def test_embedding_bag_backward_matches_numpy(sgn, B, L, H, V, mode):
    r = _rng(29)
    ids = r.integers(0, V, (B, L)).astype(np.int32)
    g = _randn((B, H), np.float32, 30)
    got = sgn.embedding_bag_backward(ids, g, V, mode)
    close(got, _bag_grad_ref(ids, g, V, mode))
    unseen = np.setdiff1d(np.arange(V), ids)
    assert not got[unseen].any()


def test_embedding_bag_backward_one_scatter_of_distinct_rows_per_tile(sgn):
    """One ``dma_compute`` scatter-add per tile of 128 items; the repeats of an id in a tile were summed on the PE
    and sent out of range, so the scatter moves the tile's distinct ids (the sums above would be 2x-30x too large
    otherwise: every id repeats in every tile). HBM writes: the zeroed table plus the scatter rows (nsim's cost
    model charges a skipped row's bytes too, test_kv_cache_update_kernels, so between the distinct rows and all)."""
    B, L, H, V = 80, 4, 64, 50
    ids = _rng(31).integers(0, V, (B, L)).astype(np.int32)
    g = _randn((B, H), np.float32, 32)
    sgn.embedding_bag_backward(ids, g, V, "sum")
    flat = ids.ravel()
    distinct = sum(len(np.unique(flat[t:t + 128])) for t in range(0, flat.size, 128))
    assert distinct < flat.size // 2
    dmas = [o for o in executed_ops(sgn.embedding_bag_backward.last_json["body"]) if o["op"] == "dma_copy"]
    assert sum("accumulate" in o.get("flags", []) for o in dmas) == 3
    prof = sgn.embedding_bag_backward.last_profile
    assert (V + distinct) * H * 4 <= prof.stat("memory.hbm_write_bytes") <= (V + flat.size) * H * 4
    close(sgn.embedding_bag_backward(ids, g, V, "sum"), _bag_grad_ref(ids, g, V, "sum"))


def test_embedding_bag_backward_all_ids_equal(sgn):
    ids = np.full((64, 4), 7, np.int32)
    g = _randn((64, 32), np.float32, 33)
    got = sgn.embedding_bag_backward(ids, g, 10, "mean")
    close(got[7], _f64(g).sum(0))
    assert not np.delete(got, 7, axis=0).any()


# --------------------------------------------------------------------------------------------------
# Top-k block-sparse attention
# --------------------------------------------------------------------------------------------------

def _block_attn_ref(q, k, v, block_idx):
    Sq, d = q.shape
    out = np.zeros((Sq, d))
    for qb, sel in enumerate(block_idx):
        rows = np.concatenate([np.arange(b * 128, (b + 1) * 128) for b in sel])
        s = _f64(q[qb * 128:(qb + 1) * 128]) @ _f64(k[rows]).T / np.sqrt(d)
        p = np.exp(s - s.max(1, keepdims=True))
        out[qb * 128:(qb + 1) * 128] = (p / p.sum(1, keepdims=True)) @ _f64(v[rows])
    return out


ATTN_CASES = [  # Sq, Sk, d, block_idx, dtype
    (256, 512, 64, [[3, 0, 3], [1, 2, 0]], np.float32),   # block 3 selected twice by query block 0
    (384, 384, 128, [[2, 0], [0, 1], [2, 2]], BF16),
    (512, 512, 32, [[0], [3], [1], [3]], np.float32),      # one block each: plain attention over it
]


@pytest.mark.parametrize("Sq,Sk,d,block_idx,dtype", ATTN_CASES)
def test_block_topk_attention_matches_numpy(sg, Sq, Sk, d, block_idx, dtype):
    q, k, v = (_randn((S, d), dtype, 34 + i) for i, S in enumerate((Sq, Sk, Sk)))
    bi = np.array(block_idx, np.int32)
    got = sg.block_topk_attention_kernel(q, k, v, bi)
    assert got.dtype == np.dtype(dtype)
    close(got, _block_attn_ref(q, k, v, bi), dtype)
    n_qb, n_sel = bi.shape
    ops = _ops(sg.block_topk_attention_kernel)
    assert ops["nc_matmul"] == 2 * n_qb * n_sel and ops["nc_transpose"] == 2 * n_qb * n_sel
    body = sg.block_topk_attention_kernel.last_json["body"]
    assert sum("offsets" in o for o in executed_ops(body) if o["op"] == "dma_copy") == 2 * n_qb * n_sel


def test_block_topk_attention_runtime_selection(sg):
    """The selection is data: one trace serves any block ids (the same kernel.json), and a block id past the keys
    is an error at the gather's line."""
    Sq, Sk, d = 256, 512, 64
    q, k, v = (_randn((S, d), np.float32, 40 + i) for i, S in enumerate((Sq, Sk, Sk)))
    a = np.array([[0, 1], [2, 3]], np.int32)
    b = np.array([[3, 3], [0, 2]], np.int32)
    ja = sg.block_topk_attention_kernel.to_json(q, k, v, a)
    jb = sg.block_topk_attention_kernel.to_json(q, k, v, b)
    assert ja["body"] == jb["body"]
    close(sg.block_topk_attention_kernel(q, k, v, b), _block_attn_ref(q, k, v, b))
    with pytest.raises(NsimError) as e:
        sg.block_topk_attention_kernel(q, k, v, np.array([[0, 4], [1, 2]], np.int32))
    assert _code(e.value) == _errors.code("IndexOutOfBounds")
    assert _line(sg, "kb = nl.load(k[rid[i_p, j], i_d]") in str(e.value)


# ---- the nsim fixes this family needed (the kernels above write the work-arounds it first used) ----------------

def _reports_of(kernel, *args):
    import warnings
    from nsim import tracer
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        out = kernel(*args)
    return out, [str(x.message) for x in w if issubclass(x.category, tracer.CheckWarning)]


def test_where_broadcasts_condition_x_and_y_together():
    """``nl.where(c[P, 1], x[P, F], y)`` and ``where(member[P, n], xb[P, n, D], v)``: the result has the shape of the
    three broadcast together (numpy.where, spec 3.10); was E425 'cannot broadcast (128, 64) to (128, 1)' (the result
    took the condition's shape; python/nsim/nki/language.py where(), both dialects)."""
    from nsim import nki
    import nsim.nki.language as nl

    @nki.jit
    def rows(c, x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.where(nl.load(c), nl.load(x), -5.0))
        return out

    @nki.jit
    def members(m, x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.where(nl.load(m), nl.load(x), 0.0))
        return out

    c = (np.arange(128) % 3 == 0).astype(np.float32)[:, None]
    x = _randn((128, 64), np.float32, 50)
    np.testing.assert_array_equal(rows(c, x), np.where(c != 0, x, np.float32(-5.0)))
    m = (_rng(51).random((128, 4, 1)) > 0.5).astype(np.float32)
    x3 = _randn((128, 4, 16), np.float32, 52)
    np.testing.assert_array_equal(members(m, x3), np.where(m != 0, x3, np.float32(0.0)))


def test_where_with_minus_inf_and_a_predicated_copy_of_a_ragged_tile_report_nothing():
    """Two false sanitizer reports of masked maxima (the segment max's idioms):
    - ``nl.where(c, x, -np.inf)`` was NSIM-W503 nan-produced: the predicated copy keeps the -inf its memset wrote,
      which the check took for an infinity it produced (engines/check/checker.cpp: a predicated copy's destination
      is one of its inputs, as an accumulation's);
    - a predicated copy whose predicate selects only the written rows of a half-written tile was NSIM-W501 (the
      never-written rows it does not select tainted the output; now only the selected src elements are read)."""
    from nsim import nki
    import nsim.nki.isa as nisa
    import nsim.nki.language as nl

    @nki.jit
    def minus_inf(c, x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.where(nl.load(c), nl.load(x), -np.inf))
        return out

    @nki.jit
    def written_rows(x):  # x [100, 64]: rows 100..127 of t are never written, and never selected
        out = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t[:100, :], src=x)
        p = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
        nisa.iota(dst=p, pattern=[[0, 64]], offset=0, channel_multiplier=1)  # p[q, f] = q
        pred = nl.ndarray((128, 64), dtype=nl.uint8, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=pred, data=p, op0=nl.less, operand0=100.0)
        o = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=o, value=0.0)
        nisa.tensor_copy_predicated(dst=o, src=t, predicate=pred)
        nisa.dma_copy(dst=out, src=o)
        return out

    c = (_rng(53).standard_normal((128, 64)) > 0).astype(np.float32)
    x = _randn((128, 64), np.float32, 54)
    out, reps = _reports_of(minus_inf, c, x)
    np.testing.assert_array_equal(out, np.where(c != 0, x, np.float32(-np.inf)))
    assert reps == []
    x100 = _randn((100, 64), np.float32, 55)
    out, reps = _reports_of(written_rows, x100)
    np.testing.assert_array_equal(out[:100], x100)
    assert not out[100:].any() and reps == []

    @nki.jit
    def all_rows(x):  # the same copy selecting every row: the never-written rows are read (W501)
        out = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t[:100, :], src=x)
        pred = nl.ndarray((128, 64), dtype=nl.uint8, buffer=nl.sbuf)
        nisa.memset(dst=pred, value=1)
        o = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=o, value=0.0)
        nisa.tensor_copy_predicated(dst=o, src=t, predicate=pred)
        nisa.dma_copy(dst=out, src=o)
        return out

    _out, reps = _reports_of(all_rows, x100)
    assert any("NSIM-W501" in r for r in reps)
