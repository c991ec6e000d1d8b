"""Recommendation-model kernels written like public NKI ports of DLRM, DCN-v2 and feature-hashing pipelines
(tests/python/kernels/recsys_hashing_kernels.py, Beta-1 dialect, and recsys_hashing_kernels_new.py, new dialect; both
unmodified, through ``nsim.compat``):

- ``EmbeddingBag`` forward with ``include_last_offset`` offsets (bags of 0..max_bag items, runtime offsets), per-sample
  weights, sum / mean / max pooling and ``padding_idx``: FBGEMM-TBE style (bags on the partitions, a loop over bag
  slots, two chained indirect gathers: the slot's id, then its row; Beta-1 ``table[idj[i_p, 0], i_d]`` and new
  ``.ap(vector_offset=)``), items-on-partitions with a segment-matrix matmul (Beta 1), and a gather-free one-hot
  matmul for small tables (new dialect);
- feature hashing on chip: murmur3 fmix32 of int32 ids with logical right shifts, xor and wrapping int32 x int32
  multiplies, bucketed by a mask (power-of-two tables) or by the float-free multiply-shift range reduction
  ``((h >> 16) * V) >> 16`` (any V <= 65536; the ISA ALU has no integer modulo), then the row gather (both dialects);
- DLRM's dot interaction (samples on the partitions: one multiply + one reduce per triangle row; and the naive port,
  one PE matmul per sample with the triangle stored row by row), and the bottom / top MLPs as tiled matmuls with the
  bias + ReLU fused into the PSUM eviction, composed into a DLRM forward;
- DCN-v2 cross layers x_{l+1} = x0 * (W x_l + b) + x_l, full rank and low rank U V^T (new dialect).

Checked: float outputs against float64 numpy written here (fp32 1e-5, bf16 1e-2 after the kernels' roundings), the
hash buckets bit-exactly against numpy uint32 arithmetic (ids over the whole int32 range incl. 0, -1, INT_MIN,
INT_MAX, repeated ids), the two dialects' bags bit for bit, no warning or sanitizer report (``run_clean``), ragged last
tiles on every tiled axis (bags, items, ids, batch, features), empty bags and all-padding bags, and the instruction /
DMA counts and HBM bytes the tiling implies; timing: the vectorised interaction beats the per-sample PE port, the
gather-free one-hot bag beats the two-gather TBE loop for a small table, and low-rank cross layers beat full rank.

The nsim fixes this family needed: none (every kernel ran as written; no false sanitizer report and no int32
hazard: int32 x int32 ``tensor_tensor`` multiplies wrap mod 2^32, shifts are logical, ``memset`` / ``nl.full`` of
int32 constants above 2^24 are exact)."""
import numpy as np
import pytest

from conftest import executed_ops, require_core, run_clean, sample_fixture  # noqa: E402
from conftest import op_counts as _ops  # noqa: E402

_core, ml_dtypes = require_core()
from numeric_helpers import close, close_to_max, f64 as _f64, randn as _randn, rounded  # noqa: E402

BF16 = ml_dtypes.bfloat16

rh = sample_fixture("recsys_hashing_kernels.py", module_only=True)
rhn = sample_fixture("recsys_hashing_kernels_new.py", module_only=True)

PAD = 3


# --------------------------------------------------------------------------------------------------
# references
# --------------------------------------------------------------------------------------------------

def _bags(B, V, max_bag, seed, pad_every=7):
    """offsets [B + 1] (bags of 0..max_bag items, some empty), ids with repeats and every pad_every-th id = PAD, and
    one bag made only of padding."""
    rng = np.random.default_rng(seed)
    lens = rng.integers(0, max_bag + 1, B)
    lens[1] = 0
    lens[2] = 2
    offs = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    N = int(offs[-1])
    ids = rng.integers(0, V, N).astype(np.int32)
    ids[rng.integers(0, N, N // 4)] = 7  # a hot id repeated across bags
    ids[::pad_every] = PAD
    ids[offs[2]:offs[3]] = PAD  # bag 2: only padding
    w = rng.random(N).astype(np.float32)
    return offs, ids, w


def ref_bag(table, ids, offs, w, mode, pad=PAD):
    """torch.nn.EmbeddingBag(mode, padding_idx=pad, include_last_offset=True) in float64."""
    t = _f64(table)
    out = np.zeros((len(offs) - 1, table.shape[1]))
    for b in range(len(offs) - 1):
        it = [n for n in range(offs[b], offs[b + 1]) if ids[n] != pad]
        if not it:
            continue
        rows = t[ids[it]]
        if mode == "sum":
            out[b] = (rows * (_f64(w[it])[:, None] if w is not None else 1.0)).sum(0)
        elif mode == "mean":
            out[b] = rows.mean(0)
        else:
            out[b] = rows.max(0)
    return out


def ref_fmix32(ids):
    h = np.asarray(ids).astype(np.int64).astype(np.uint32)  # the int32 bit pattern
    h ^= h >> np.uint32(16)
    h = h * np.uint32(0x85EBCA6B)
    h ^= h >> np.uint32(13)
    h = h * np.uint32(0xC2B2AE35)
    h ^= h >> np.uint32(16)
    return h


def ref_bucket(ids, V, mode):
    h = ref_fmix32(ids)
    if mode == "mask":
        return (h & np.uint32(V - 1)).astype(np.int32)
    return (((h >> np.uint32(16)) * np.uint32(V)) >> np.uint32(16)).astype(np.int32)


def _hash_ids(N, seed):
    ids = np.random.default_rng(seed).integers(-2 ** 31, 2 ** 31, N, dtype=np.int64).astype(np.int32)
    ids[:6] = [0, -1, -2 ** 31, 2 ** 31 - 1, 1, 12345]
    ids[6:12] = ids[0:6]  # repeated ids hash to the same bucket
    return ids


def ref_interaction(x):
    x = _f64(x)
    F = x.shape[1]
    z = np.einsum("bid,bjd->bij", x, x)
    li, lj = np.tril_indices(F, -1)  # row-major strictly lower triangle, as DLRM's interact_features
    return np.concatenate([x[:, 0], z[:, li, lj]], 1)


def ref_mlp2_t(xT, w1, b1, w2, b2, relu_last, dtype):
    h = np.maximum(_f64(w1).T @ _f64(xT) + _f64(b1)[:, None], 0)
    if dtype != np.float32:
        h = rounded(h, dtype)  # h is kept on chip in the input dtype
    y = _f64(w2).T @ h + _f64(b2)[:, None]
    return np.maximum(y, 0) if relu_last else y


def ref_cross(x0T, ws, b):
    x0 = _f64(x0T)
    x = x0
    for l in range(len(ws)):
        x = x0 * (_f64(ws[l]).T @ x + _f64(b[l])[:, None]) + x
    return x


def _gathers(kernel):
    """The executed DMAs that read HBM rows at runtime offsets (an indirect source)."""
    return [o for o in executed_ops(kernel.last_json["body"]) if o["op"] == "dma_copy" and "offsets" in o
            and "indirect_dst" not in o.get("flags", ())]


# --------------------------------------------------------------------------------------------------
# EmbeddingBag
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("B,D,mode,dtype,weighted", [
    (150, 64, "sum", np.float32, True),     # 2 bag tiles, ragged 22
    (150, 64, "mean", np.float32, False),
    (150, 64, "max", np.float32, False),
    (300, 96, "sum", BF16, False),          # 3 bag tiles, ragged 44
    (100, 32, "mean", BF16, False),         # a single ragged tile
    (128, 48, "max", BF16, False),
])
def test_embedding_bag_tbe_both_dialects(rh, rhn, B, D, mode, dtype, weighted):
    V, max_bag = 500, 8
    offs, ids, w = _bags(B, V, max_bag, seed=B + D)
    table = _randn((V, D), dtype, seed=D)
    w = w if weighted else None
    want = ref_bag(table, ids, offs, w, mode)
    got_b1 = run_clean(rh.embedding_bag, table, ids, offs, w, mode, PAD, max_bag)
    got_new = run_clean(rhn.embedding_bag_tbe, table, ids, offs, w, mode, PAD, max_bag)
    assert got_b1.dtype == np.dtype(dtype) and got_b1.shape == (B, D)
    close(got_b1, want, dtype)
    # the same fp32 accumulation order in both dialects: bit for bit
    np.testing.assert_array_equal(got_new.view(np.uint8), got_b1.view(np.uint8))
    assert not got_b1[1].any() and not got_b1[2].any()  # the empty bag and the all-padding bag are zero
    if mode == "max":
        np.testing.assert_array_equal(_f64(got_b1), ref_bag(table, ids, offs, None, "max"))  # max moves values


def test_embedding_bag_tbe_structure(rh, rhn):
    """B = 256 (2 bag tiles), max_bag = 4, weighted sum: per bag tile two offset loads, then per slot the id gather,
    the weight gather and the row gather (indirect), and one store. Every slot reads its 128 ids, weights and rows
    (dead slots read a clamped real item), so the HBM reads are 2 offset columns + max_bag x (ids + weights + rows)."""
    B, V, D, max_bag = 256, 300, 64, 4
    offs, ids, w = _bags(B, V, max_bag, seed=1)
    table = _randn((V, D), np.float32, seed=2)
    NT = B // 128
    run_clean(rh.embedding_bag, table, ids, offs, w, "sum", PAD, max_bag)
    c = _ops(rh.embedding_bag)
    assert c["dma_copy"] == NT * (2 + 3 * max_bag + 1), c
    assert len(_gathers(rh.embedding_bag)) == NT * 3 * max_bag
    want_read = 2 * B * 4 + max_bag * B * (4 + 4 + D * 4)
    assert rh.embedding_bag.last_profile.stat("memory.hbm_read_bytes") == want_read
    assert rh.embedding_bag.last_profile.stat("memory.hbm_write_bytes") == B * D * 4
    run_clean(rhn.embedding_bag_tbe, table, ids, offs, w, "sum", PAD, max_bag)
    cn = _ops(rhn.embedding_bag_tbe)
    assert cn["dma_copy"] == c["dma_copy"], cn
    assert rhn.embedding_bag_tbe.last_profile.stat("memory.hbm_read_bytes") == want_read


@pytest.mark.parametrize("N_bags,mode,dtype,weighted", [
    (100, "sum", np.float32, True),   # ~400 items: 4 item tiles, ragged tail clamped
    (100, "mean", np.float32, False),
    (128, "sum", BF16, False),
    (77, "mean", BF16, False),
])
def test_embedding_bag_segment_matmul(rh, N_bags, mode, dtype, weighted):
    """Items on the partitions, pooled by a matmul with the on-chip segment matrix; the tail of the last item tile is
    clamped to the last item and its segment rows are zero."""
    V, D = 400, 128
    offs, ids, w = _bags(N_bags, V, 8, seed=N_bags)
    table = _randn((V, D), dtype, seed=5)
    w = w if weighted else None
    got = run_clean(rh.embedding_bag_segment, table, ids, offs, w, mode, PAD)
    # the weighted segment matrix is rounded to the table dtype before its matmul
    want = ref_bag(table, ids, offs, None if w is None else (w if dtype == np.float32 else rounded(w, dtype)), mode)
    close(got, want, dtype)
    N = len(ids)
    NT = -(-N // 128)
    c = _ops(rh.embedding_bag_segment)
    # one matmul per item tile (two for the mean: the counts), each item's row gathered once; plus the two partition
    # broadcasts of the [1, B] start / end rows to 128 partitions (``broadcast_to``: a ones-row matmul each)
    assert c["nc_matmul"] == NT * (2 if mode == "mean" else 1) + 2, c
    assert len(_gathers(rh.embedding_bag_segment)) == NT * (3 if weighted else 2)


def test_segment_bags_gather_fewer_bytes_and_are_faster(rh):
    """With bags of up to 16 items averaging ~8, the TBE loop reads max_bag = 16 rows per bag (dead slots included)
    while the segment matmul reads each item's row once: fewer HBM bytes and less time (two dependent gathers per slot
    against one gather per 128 items)."""
    B, V, D, max_bag = 128, 1000, 256, 16
    offs, ids, _ = _bags(B, V, max_bag, seed=9)
    table = _randn((V, D), np.float32, seed=10)
    a = run_clean(rh.embedding_bag, table, ids, offs, None, "sum", PAD, max_bag)
    b = run_clean(rh.embedding_bag_segment, table, ids, offs, None, "sum", PAD)
    close(b, a)
    p_tbe, p_seg = rh.embedding_bag.last_profile, rh.embedding_bag_segment.last_profile
    N = len(ids)
    NT = -(-N // 128)
    assert p_seg.stat("memory.hbm_read_bytes") == (B + 1) * 4 + NT * 128 * (4 + D * 4)
    assert p_seg.stat("memory.hbm_read_bytes") < p_tbe.stat("memory.hbm_read_bytes")
    assert p_seg.total_time_ns < p_tbe.total_time_ns, (p_seg.total_time_ns, p_tbe.total_time_ns)


@pytest.mark.parametrize("B,V,D,mode,dtype,weighted", [
    (120, 100, 64, "sum", np.float32, True),
    (128, 128, 256, "mean", np.float32, False),
    (50, 64, 512, "sum", BF16, False),
    (90, 32, 128, "mean", BF16, False),
])
def test_embedding_bag_onehot_small_table(rhn, B, V, D, mode, dtype, weighted):
    offs, ids, w = _bags(B, V, 8, seed=V + B)
    table = _randn((V, D), dtype, seed=V)
    w = w if weighted else None
    got = run_clean(rhn.embedding_bag_onehot, table, ids, offs, w, mode, PAD)
    want = ref_bag(table, ids, offs, w, mode)
    if dtype == np.float32:
        close(got, want)
    else:  # the bag-by-id weights C are rounded to bf16 before the table matmul
        close_to_max(got, want, dtype)
    N = len(ids)
    NT = -(-N // 128)
    c = _ops(rhn.embedding_bag_onehot)
    # per item tile one accumulating matmul (+ one for the counts), then out = C table
    assert c["nc_matmul"] == NT * (2 if mode == "mean" else 1) + 1, c
    assert not _gathers(rhn.embedding_bag_onehot)  # no gather at all
    assert rhn.embedding_bag_onehot.last_profile.stat("memory.hbm_read_bytes") == (
        V * D * np.dtype(dtype).itemsize + 128 * (B + 1) * 4 + N * 4 + (N * 4 if weighted else 0))


def test_onehot_bag_faster_than_tbe_for_small_table(rhn):
    """A 64-row table: the one-hot matmuls (one per 128 items, no gathers) beat the 2 x max_bag dependent indirect
    gathers of the TBE loop per bag tile."""
    B, V, D = 128, 64, 128
    offs, ids, w = _bags(B, V, 8, seed=3)
    table = _randn((V, D), np.float32, seed=4)
    a = run_clean(rhn.embedding_bag_tbe, table, ids, offs, w, "sum", PAD, 8)
    b = run_clean(rhn.embedding_bag_onehot, table, ids, offs, w, "sum", PAD)
    close(b, a)
    t_tbe = rhn.embedding_bag_tbe.last_profile.total_time_ns
    t_oh = rhn.embedding_bag_onehot.last_profile.total_time_ns
    assert t_oh < t_tbe, (t_oh, t_tbe)


# --------------------------------------------------------------------------------------------------
# Feature hashing
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("N,V,mode,dtype", [
    (300, 256, "mask", np.float32),       # 3 id tiles, ragged 44
    (128, 4096, "mask", BF16),
    (1000, 1000, "fastrange", np.float32),
    (77, 65536, "fastrange", BF16),       # the largest fastrange table
    (257, 3, "fastrange", np.float32),
])
def test_hashed_embedding_bit_exact_both_dialects(rh, rhn, N, V, mode, dtype):
    ids = _hash_ids(N, seed=N + V)
    D = 32 if V > 10000 else 64
    table = _randn((V, D), dtype, seed=V % 1000)
    want_b = ref_bucket(ids, V, mode)
    assert want_b.min() >= 0 and want_b.max() < V
    for k in (rh.hashed_embedding, rhn.hashed_embedding):
        buckets, rows = run_clean(k, ids, table, mode)
        assert buckets.dtype == np.int32
        np.testing.assert_array_equal(buckets, want_b)
        np.testing.assert_array_equal(rows.view(np.uint8), table[want_b].view(np.uint8))
    assert buckets[6:12].tolist() == buckets[0:6].tolist()


def test_hash_uses_full_32_bit_products(rhn):
    """The multiplies must wrap mod 2^32 exactly: through an fp32 path (24-bit mantissa) nearly every bucket of a
    4096-table would differ. Checks the buckets of many consecutive ids (mask mode) and that they spread: each of the
    16 high-order buckets groups gets ids."""
    ids = np.arange(-2048, 2048, dtype=np.int32)
    table = _randn((4096, 8), np.float32, seed=1)
    buckets, _ = run_clean(rhn.hashed_embedding, ids, table, "mask")
    np.testing.assert_array_equal(buckets, ref_bucket(ids, 4096, "mask"))
    assert len(np.unique(buckets // 256)) == 16


def test_hashed_embedding_structure(rh, rhn):
    """Per 128-id tile: 3 shifts + 3 xors + 2 multiplies (fmix32) + the bucket op(s); 4 DMAs (ids in, buckets out,
    row gather, rows out). Reads: the ids and one row per id; writes: buckets and rows."""
    N, V, D = 384, 1024, 64
    ids = _hash_ids(N, seed=7)
    table = _randn((V, D), np.float32, seed=8)
    NT = N // 128
    run_clean(rhn.hashed_embedding, ids, table, "mask")
    c = _ops(rhn.hashed_embedding)
    assert c["tensor_scalar"] == NT * (3 + 1) and c["tensor_tensor"] == NT * (3 + 2), c
    assert c["dma_copy"] == NT * 4 and c["memset"] == 3, c
    p = rhn.hashed_embedding.last_profile
    assert p.stat("memory.hbm_read_bytes") == N * 4 + N * D * 4
    assert p.stat("memory.hbm_write_bytes") == N * 4 + N * D * 4
    run_clean(rhn.hashed_embedding, ids, table, "fastrange")
    cf = _ops(rhn.hashed_embedding)
    assert cf["tensor_scalar"] == NT * (3 + 2) and cf["tensor_tensor"] == NT * (3 + 3), cf
    run_clean(rh.hashed_embedding, ids, table, "mask")
    assert _ops(rh.hashed_embedding)["dma_copy"] == NT * 4
    assert rh.hashed_embedding.last_profile.stat("memory.hbm_read_bytes") == N * 4 + N * D * 4


# --------------------------------------------------------------------------------------------------
# DLRM interaction and MLPs
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("B,F,D,dtype", [
    (200, 8, 32, np.float32),    # ragged second sample tile (72)
    (128, 27, 16, np.float32),   # Criteo: 13 dense -> 1 feature + 26 tables
    (300, 5, 64, BF16),
])
def test_dot_interaction_matches_numpy(rh, B, F, D, dtype):
    x = _randn((B, F, D), dtype, seed=B + F)
    got = run_clean(rh.dot_interaction, x)
    assert got.shape == (B, D + F * (F - 1) // 2)
    close(got, ref_interaction(x))
    c = _ops(rh.dot_interaction)
    NT = -(-B // 128)
    assert c["tensor_reduce"] == NT * (F - 1), c
    assert c["dma_copy"] == 2 * NT, c


def test_dot_interaction_vectorised_beats_per_sample_pe(rh):
    """The naive port: per sample a transposed load, one PE matmul and F - 1 one-row stores of the triangle (plus the
    dense part): B (F + 2) DMAs of a few bytes each; the vectorised kernel moves the batch in 2 DMAs per 128 samples
    and is far faster. Both agree to fp32 rounding."""
    B, F, D = 64, 8, 32
    x = _randn((B, F, D), np.float32, seed=5)
    a = run_clean(rh.dot_interaction, x)
    b = run_clean(rh.dot_interaction_pe, x)
    close(b, a)
    close(b, ref_interaction(x))
    c = _ops(rh.dot_interaction_pe)
    # per sample: the transposed load (a DMA transpose), the dense part in and out, F - 1 triangle rows out
    assert c["nc_matmul"] == B and c["dma_transpose"] == B and c["dma_copy"] == B * (2 + (F - 1)), c
    t_vec = rh.dot_interaction.last_profile.total_time_ns
    t_pe = rh.dot_interaction_pe.last_profile.total_time_ns
    assert t_vec * 10 < t_pe, (t_vec, t_pe)


@pytest.mark.parametrize("K,B,N1,N2,dtype,relu_last", [
    (13, 600, 200, 64, np.float32, True),    # DLRM bottom MLP shape, ragged K / N1 / batch chunk
    (256, 512, 256, 1, np.float32, False),   # top MLP's last layers to one logit
    (100, 300, 130, 130, BF16, True),
])
def test_mlp2_t_matches_numpy(rh, K, B, N1, N2, dtype, relu_last):
    xT = _randn((K, B), dtype, seed=K)
    w1 = _randn((K, N1), dtype, seed=1, scale=1 / np.sqrt(K))
    b1 = _randn((N1,), dtype, seed=2, scale=0.1)
    w2 = _randn((N1, N2), dtype, seed=3, scale=1 / np.sqrt(N1))
    b2 = _randn((N2,), dtype, seed=4, scale=0.1)
    got = run_clean(rh.mlp2_t, xT, w1, b1, w2, b2, relu_last)
    close_to_max(got, ref_mlp2_t(xT, w1, b1, w2, b2, relu_last, dtype), dtype)
    # matmuls: per batch chunk, ceil(K/128) x ceil(N1/128) + ceil(N1/128) x ceil(N2/128)
    cdiv = lambda a, b: -(-a // b)  # noqa: E731
    chunks, KT, N1T, N2T = cdiv(B, 512), cdiv(K, 128), cdiv(N1, 128), cdiv(N2, 128)
    assert _ops(rh.mlp2_t)["nc_matmul"] == chunks * (KT * N1T + N1T * N2T)
    # the hidden layer never leaves the chip: x once, weights and biases once per batch chunk
    it = np.dtype(dtype).itemsize
    assert rh.mlp2_t.last_profile.stat("memory.hbm_read_bytes") == (
        K * B * it + chunks * ((K * N1 + N1 + N1 * N2 + N2) * it))
    assert rh.mlp2_t.last_profile.stat("memory.hbm_write_bytes") == N2 * B * it


def test_dlrm_forward_composed(rh):
    """A small DLRM: bottom MLP (13 -> 64 -> 16) on the dense features, 4 embedding bags (sum, 16-wide), the dot
    interaction of the 5 features and the top MLP (16 + 10 -> 64 -> 1) to a logit, each stage one kernel."""
    B, Dn, D, T, V = 200, 13, 16, 4, 300
    rng = np.random.default_rng(0)
    dense = rng.standard_normal((B, Dn)).astype(np.float32)
    bw1, bb1 = _randn((Dn, 64), np.float32, 1, 0.3), _randn((64,), np.float32, 2, 0.1)
    bw2, bb2 = _randn((64, D), np.float32, 3, 0.15), _randn((D,), np.float32, 4, 0.1)
    tw1, tb1 = _randn((D + 10, 64), np.float32, 5, 0.2), _randn((64,), np.float32, 6, 0.1)
    tw2, tb2 = _randn((64, 1), np.float32, 7, 0.15), _randn((1,), np.float32, 8, 0.1)
    tables = [_randn((V, D), np.float32, 10 + i, 0.5) for i in range(T)]
    bags = [_bags(B, V, 4, seed=20 + i) for i in range(T)]

    bot = run_clean(rh.mlp2_t, np.ascontiguousarray(dense.T), bw1, bb1, bw2, bb2, True)  # [D, B]
    embs = [run_clean(rh.embedding_bag, tables[i], bags[i][1], bags[i][0], None, "sum", PAD, 4) for i in range(T)]
    feats = np.stack([bot.T] + embs, 1)  # [B, 5, D]
    inter = run_clean(rh.dot_interaction, np.ascontiguousarray(feats))
    logit = run_clean(rh.mlp2_t, np.ascontiguousarray(inter.T), tw1, tb1, tw2, tb2, False)

    r_bot = ref_mlp2_t(dense.T, bw1, bb1, bw2, bb2, True, np.float32)
    r_embs = [ref_bag(tables[i], bags[i][1], bags[i][0], None, "sum") for i in range(T)]
    r_inter = ref_interaction(np.stack([r_bot.T] + r_embs, 1))
    r_logit = ref_mlp2_t(r_inter.T, tw1, tb1, tw2, tb2, False, np.float32)
    close_to_max(logit, r_logit, np.float32)


# --------------------------------------------------------------------------------------------------
# DCN-v2 cross layers
# --------------------------------------------------------------------------------------------------

def _cross_inputs(D, B, L, R, seed):
    x0 = _randn((D, B), np.float32, seed)
    w = _randn((L, D, D), np.float32, seed + 1, 1 / np.sqrt(D))
    b = _randn((L, D), np.float32, seed + 2, 0.1)
    v = _randn((L, D, R), np.float32, seed + 3, 1 / np.sqrt(D))
    ut = _randn((L, R, D), np.float32, seed + 4, 1 / np.sqrt(R))
    return x0, w, b, v, ut


@pytest.mark.parametrize("D,B,L,R", [(200, 300, 3, 32), (128, 512, 2, 16), (384, 64, 1, 128)])
def test_dcn_cross_full_and_low_rank(rhn, D, B, L, R):
    x0, w, b, v, ut = _cross_inputs(D, B, L, R, seed=D)
    got = run_clean(rhn.dcn_cross, x0, w, b)
    close_to_max(got, ref_cross(x0, w, b), np.float32)
    w_lr = np.einsum("ldr,lre->lde", _f64(v), _f64(ut))  # W_l = V_l U_l^T in the [in, out] layout
    got_lr = run_clean(rhn.dcn_cross_lowrank, x0, v, ut, b)
    close_to_max(got_lr, ref_cross(x0, w_lr, b), np.float32)
    DT = -(-D // 128)
    assert _ops(rhn.dcn_cross)["nc_matmul"] == L * DT * DT
    assert _ops(rhn.dcn_cross_lowrank)["nc_matmul"] == L * 2 * DT


def test_dcn_low_rank_reads_fewer_bytes_and_is_faster(rhn):
    """D = 512, r = 64, two layers: full rank reads 2 x 512^2 fp32 weights (16 matmuls per layer), low rank
    2 x 2 x 512 x 64 (8 matmuls per layer, each of a quarter of the rows); the weight DMAs dominate, so it is faster.
    Both read x0 and the biases once."""
    D, B, L, R = 512, 512, 2, 64
    x0, w, b, v, ut = _cross_inputs(D, B, L, R, seed=1)
    run_clean(rhn.dcn_cross, x0, w, b)
    run_clean(rhn.dcn_cross_lowrank, x0, v, ut, b)
    p_f, p_l = rhn.dcn_cross.last_profile, rhn.dcn_cross_lowrank.last_profile
    common = D * B * 4 + L * D * 4
    assert p_f.stat("memory.hbm_read_bytes") == common + L * D * D * 4
    assert p_l.stat("memory.hbm_read_bytes") == common + L * 2 * D * R * 4
    assert p_l.total_time_ns < p_f.total_time_ns, (p_l.total_time_ns, p_f.total_time_ns)
