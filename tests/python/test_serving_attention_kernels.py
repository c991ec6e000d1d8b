"""Attention variants for LLM serving, written the way public NKI kernels are written and run through nsim
unchanged: StreamingLLM sliding-window decode with attention sinks and the Gemma-2 logit soft-cap, for a compiled
length bucket and for runtime lengths (window rows read by ``scalar_offset`` DMAs) (new dialect,
tests/python/kernels/serving_attention_kernels.py), vLLM v1-style batched paged decode with runtime sequence
lengths and block tables, blocks gathered by indirect DMA and the tail masked with an ``iota`` vs runtime-length
bias, and encoder-decoder cross-attention with an encoder padding mask (Beta 1,
tests/python/kernels/serving_attention_kernels_beta1.py).

Also a causal multi-query prefill with the soft-cap in a flash loop (new dialect; every head reuses each K/V chunk).

Checked: outputs against float64 numpy (bf16 tolerance) for GQA / MQA / MHA shapes, head dims 64 and 128, block
sizes 16-128, KV lengths 512-4096; that the masks and the soft-cap really act (perturbing what must be ignored does
not change the output, and removing the cap does); and timing/structure facts implied by the tilings: sliding-window
decode reads exactly the sink + window keys and its time does not depend on the context length beyond the window
(but grows with the window), never beating the KV bytes over nsim's HBM bandwidth; paged decode gathers exactly the
blocks of the length bucket (one indirect DMA per chunk, K and V, per sequence and KV head) whatever the block
table's width; cross-attention issues the matmuls its (query tile, key chunk) tiling implies.

No nsim fix was needed by these kernels: every construct they use (runtime (P, 1) operands of ``tensor_scalar``,
Beta-1 indirect gathers of (block id * Hkv + head) rows, ``.ap(scalar_offset=)`` window reads at an on-chip
computed row, a stride-0 partition-broadcast DMA of the length, ``nisa.iota`` over a 3-D ``mgrid``, a (1, F) bias
broadcast over the partitions by ``nl.add``, ``nl.load_transpose2d`` of 512-row chunks) ran and matched numpy."""
import numpy as np
import pytest

from conftest import executed_ops, op_counts, require_core, sample_fixture  # noqa: E402

_core, ml_dtypes = require_core()
from numeric_helpers import close, f64, randn  # noqa: E402

import nsim.plot  # noqa: E402

BF16 = ml_dtypes.bfloat16

sw = sample_fixture("serving_attention_kernels.py", module_only=True)
b1k = sample_fixture("serving_attention_kernels_beta1.py", module_only=True)


def _roof_ns(nbytes, profile):
    """The time ``nbytes`` of HBM traffic take at the HBM bandwidth of the profile's configuration."""
    return nbytes / nsim.plot.memory_roof(profile.config, profile.overrides) * 1e9


# --------------------------------------------------------------------------------------------------
# sliding-window decode with attention sinks (new dialect)
# --------------------------------------------------------------------------------------------------

def _sw_inputs(B, Hq, Hkv, D, S, seed=0, qscale=1.0):
    return (randn((B, Hq, D), BF16, seed, qscale), randn((B, Hkv, S, D), BF16, seed + 1),
            randn((B, Hkv, S, D), BF16, seed + 2))


@pytest.mark.parametrize("B,Hq,Hkv,D,S,L,W,sinks,cap", [
    (4, 32, 8, 128, 4096, 3001, 1024, 4, None),   # GQA 4, window not 128-aligned (last block 57 keys)
    (8, 16, 1, 64, 2048, 2000, 256, 4, 30.0),     # MQA with the Gemma-2 soft-cap
    (2, 8, 2, 128, 1024, 300, 512, 4, None),      # window + sinks cover the whole context: plain attention
    (4, 16, 4, 64, 512, 512, 200, 0, None),       # no sinks: a pure sliding window
])
def test_sink_window_decode_matches_numpy(sw, B, Hq, Hkv, D, S, L, W, sinks, cap):
    q, k, v = _sw_inputs(B, Hq, Hkv, D, S, seed=L)
    out = sw.sink_window_decode(q, k, v, L, W, sinks, cap)
    assert out.shape == (B, Hq, D) and out.dtype == BF16
    close(out, sw.sink_window_reference(q, k, v, L, W, sinks, cap), BF16)


def test_sink_window_ignores_the_evicted_middle_and_keeps_the_sinks(sw):
    """Keys between the sinks and the window (and past seq_len) may hold anything: overwriting them with values that
    would dominate the softmax leaves the output bit-identical; a spike in a sink key does change it (the sinks
    are attended), and so does a spike in the window."""
    B, Hq, Hkv, D, S, L, W = 2, 8, 2, 128, 2048, 1500, 256
    q, k, v = _sw_inputs(B, Hq, Hkv, D, S, seed=7)
    base = sw.sink_window_decode(q, k, v, L, W)
    k2, v2 = k.copy(), v.copy()
    for buf in (k2, v2):
        buf[:, :, 4:L - W] = 50.0
        buf[:, :, L:] = 50.0
    np.testing.assert_array_equal(sw.sink_window_decode(q, k2, v2, L, W), base)
    for pos in (2, L - 10):
        k3 = k.copy()
        k3[:, :, pos] = (f64(q[:, ::Hq // Hkv]) * 4).astype(BF16)
        changed = sw.sink_window_decode(q, k3, v, L, W)
        close(changed, sw.sink_window_reference(q, k3, v, L, W), BF16)
        assert np.abs(f64(changed) - f64(base)).max() > 0.1, pos


def test_soft_cap_is_applied(sw):
    """Large logits (q scaled by 8): the capped output (cap 5) matches the capped reference and differs clearly
    from the uncapped one."""
    B, Hq, Hkv, D, S, L, W = 2, 8, 1, 64, 1024, 1024, 384
    q, k, v = _sw_inputs(B, Hq, Hkv, D, S, seed=11, qscale=8.0)
    capped = sw.sink_window_decode(q, k, v, L, W, 4, 5.0)
    close(capped, sw.sink_window_reference(q, k, v, L, W, 4, 5.0), BF16)
    plain = sw.sink_window_reference(q, k, v, L, W, 4, None)
    assert np.abs(f64(capped) - plain).max() > 0.2


def test_sink_window_time_is_independent_of_the_context_beyond_the_window(sw):
    """The kernel reads only the 4 sinks and the last W keys: for W = 512 the HBM traffic is exactly those keys'
    K and V plus the queries, and the time is the same for a 1000- and a 4000-token context. Doubling the window
    doubles the traffic and makes it slower (but less than 2.5x). No run beats its KV bytes over nsim's HBM
    bandwidth, and the decode (VectorE-bound: ~20 small instructions per 128-key block on G = 4 rows) stays within
    12x of that bound."""
    B, Hq, Hkv, D = 4, 32, 8, 128
    times = {}
    for S, L, W in [(1024, 1000, 512), (4096, 4000, 512), (4096, 4000, 1024)]:
        q, k, v = _sw_inputs(B, Hq, Hkv, D, S, seed=1)
        out = sw.sink_window_decode(q, k, v, L, W)
        prof = sw.sink_window_decode.last_profile
        kv_bytes = 2 * B * Hkv * (4 + W) * D * 2
        assert prof.stat("memory.hbm_read_bytes") == kv_bytes + q.nbytes
        assert prof.stat("memory.hbm_write_bytes") == out.nbytes
        roof = _roof_ns(kv_bytes, prof)
        assert roof <= prof.total_time_ns <= 12 * roof, (prof.total_time_ns, roof)
        times[(L, W)] = prof.total_time_ns
    assert times[(4000, 512)] == pytest.approx(times[(1000, 512)], rel=0.02), times
    assert 1.2 * times[(4000, 512)] < times[(4000, 1024)] < 2.5 * times[(4000, 512)], times


@pytest.mark.parametrize("Hq,Hkv,D,S,W,lens", [
    (8, 2, 128, 1024, 256, [1024, 1000, 300, 3, 517, 260]),   # a length below the sinks, one at the window edge
    (16, 1, 64, 4096, 1024, [4096, 1029, 2000, 1]),            # MQA, an 8-block window
])
def test_sink_window_with_runtime_lengths_matches_numpy(sw, Hq, Hkv, D, S, W, lens):
    """Lengths as an int32 tensor: the window start is computed on chip and the window read by ``scalar_offset``
    DMAs; the output is each sequence's own sink + window attention, and the HBM traffic is the same sinks +
    window rows for every length (plus the queries and the lengths, read twice: int32 on one partition and
    broadcast to the G query partitions)."""
    B = len(lens)
    q, k, v = _sw_inputs(B, Hq, Hkv, D, S, seed=S + W)
    lens = np.array(lens, np.int32)
    kern = sw.sink_window_decode_dynamic
    out = kern(q, k, v, lens, W)
    close(out, sw.sink_window_reference_lens(q, k, v, lens, W), BF16)
    prof = kern.last_profile
    kv_bytes = 2 * B * Hkv * (4 + W) * D * 2
    assert prof.stat("memory.hbm_read_bytes") == kv_bytes + q.nbytes + B * (1 + Hq // Hkv) * 4
    dyn = [o for o in executed_ops(kern.last_json["body"]) if "indirect_scalar" in o.get("flags", ())]
    assert len(dyn) == 2 * B * Hkv * -(-W // 128)  # K and V of each window block, at a runtime row


def test_sink_window_instruction_counts(sw):
    """Per (sequence, KV head) one block for the sinks and ceil(W / 128) window blocks; per block two loads, one
    QK^T and one PV matmul, and K and P transposed on the PE (plus the one query transpose)."""
    B, Hq, Hkv, D, S, L, W = 2, 16, 4, 64, 2048, 2000, 300
    q, k, v = _sw_inputs(B, Hq, Hkv, D, S, seed=3)
    sw.sink_window_decode(q, k, v, L, W)
    ops = op_counts(sw.sink_window_decode)
    blocks = B * Hkv * (1 + -(-W // 128))
    assert ops["nc_matmul"] == 2 * blocks
    assert ops["nc_transpose"] == 2 * blocks + B * Hkv
    assert ops["dma_copy"] == 2 * blocks + 2 * B * Hkv  # + the query load and output store per (b, kv head)


def test_sink_window_kept_loop_times_as_unrolled(sw):
    """The (sequence, KV head) loops kept: their body holds the sink block's and the window blocks' PSUM tiles,
    written out by Python (15 one-bank tiles). The allocator alone gave the last block's two tiles (shapes of their
    own) two rotating buffers across the whole body, and the 13 others shared the 4 banks left: 39,002.8 ns against
    27,308.2 ns unrolled. The placement search (compiler.placement_search) also times one buffer per PSUM loop tile:
    26,910.2 ns, as unrolled; with the search off the kept loops are as slow as before."""
    B, Hq, Hkv, D, S, L, W = 2, 16, 4, 64, 2048, 2000, 300
    q, k, v = _sw_inputs(B, Hq, Hkv, D, S, seed=3)
    t = {}
    for loops in ("keep", "unroll"):
        _out, prof = sw.sink_window_decode.options(loops=loops, check=False, timing_only=True).simulate(q, k, v, L, W)
        t[loops] = prof.total_time_ns
    assert abs(t["keep"] / t["unroll"] - 1) < 0.03, t
    _out, prof = sw.sink_window_decode.options(loops="keep", check=False, timing_only=True,
                                               overrides=["compiler.placement_search=0"]).simulate(q, k, v, L, W)
    assert prof.total_time_ns > 1.3 * t["unroll"], (prof.total_time_ns, t)


# --------------------------------------------------------------------------------------------------
# multi-query causal prefill with the logit soft-cap (new dialect)
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("Hq,S,D,cap,qscale", [
    (8, 640, 128, 50.0, 1.0),   # Gemma-2's cap 50; a query tile whose keys span two chunks (512 + 128)
    (16, 1024, 64, 5.0, 6.0),   # large logits and a small cap: the cap changes the result a lot
])
def test_mqa_softcap_flash_matches_numpy(sw, Hq, S, D, cap, qscale):
    q = randn((Hq, S, D), BF16, S, qscale)
    k, v = randn((S, D), BF16, S + 1), randn((S, D), BF16, S + 2)
    out = sw.mqa_softcap_flash(q, k, v, cap)
    assert out.shape == (Hq, S, D) and out.dtype == BF16
    want = sw.mqa_softcap_reference(q, k, v, cap)
    close(out, want, BF16)
    if cap < 10:
        assert np.abs(sw.mqa_softcap_reference(q, k, v, None) - want).max() > 1.0


def test_mqa_softcap_shares_kv_loads_across_heads(sw):
    """All heads share the KV head: query tile t loads keys [0, 128 (t + 1)) of K and V once, whatever the number
    of heads, so the HBM traffic is the queries plus sum_t 128 (t + 1) rows of K and V; per (tile, chunk, head)
    one QK^T matmul and one PV matmul per 128 keys (chunks above the diagonal are skipped)."""
    S, D = 640, 128
    k, v = randn((S, D), BF16, 1), randn((S, D), BF16, 2)
    n_t = S // 128
    kv_rows = sum(128 * (t + 1) for t in range(n_t))
    subs = sum(-(-128 * (t + 1) // 128) for t in range(n_t))  # 128-key sub-tiles per tile, all chunks
    chunks = sum(-(-128 * (t + 1) // 512) for t in range(n_t))
    for Hq in (4, 8):
        q = randn((Hq, S, D), BF16, Hq)
        out = sw.mqa_softcap_flash(q, k, v, 50.0)
        close(out, sw.mqa_softcap_reference(q, k, v, 50.0), BF16)
        kern = sw.mqa_softcap_flash
        assert kern.last_profile.stat("memory.hbm_read_bytes") == q.nbytes + 2 * kv_rows * D * 2
        assert op_counts(kern)["nc_matmul"] == Hq * (chunks + subs)


# --------------------------------------------------------------------------------------------------
# batched paged decode (Beta 1)
# --------------------------------------------------------------------------------------------------

def _paged_inputs(B, Hq, Hkv, D, bs, max_len, lens, table_pad=3, seed=0):
    """A cache big enough for every sequence's blocks drawn from a random permutation (block 0 = padding, as vLLM
    pads its tables); block tables [B, ceil(max_len / bs) + table_pad]."""
    rng = np.random.default_rng(seed)
    need = [-(-int(n) // bs) for n in lens]
    n_blocks = sum(need) + 4
    q = randn((B, Hq, D), BF16, seed)
    kc = randn((n_blocks, Hkv, bs, D), BF16, seed + 1)
    vc = randn((n_blocks, Hkv, bs, D), BF16, seed + 2)
    free = list(rng.permutation(np.arange(1, n_blocks)))
    table = np.zeros((B, -(-max_len // bs) + table_pad), np.int32)
    for b, n in enumerate(need):
        table[b, :n] = [free.pop() for _ in range(n)]
    return q, kc, vc, table, np.asarray(lens, np.int32)


@pytest.mark.parametrize("B,Hq,Hkv,D,bs,max_len,lens", [
    (4, 8, 2, 128, 32, 1000, [1000, 37, 513, 700]),                           # GQA 4, two 512-token chunks
    (8, 32, 8, 64, 16, 512, [512, 1, 16, 17, 255, 300, 480, 511]),            # block 16, lengths at block edges
    (16, 16, 1, 128, 128, 2048, list(range(128, 2049, 128))),                 # MQA, block 128
    (4, 8, 2, 64, 64, 4096, [4096, 4000, 2049, 65]),                          # 8 chunks of 512 tokens
])
def test_paged_decode_matches_numpy(b1k, B, Hq, Hkv, D, bs, max_len, lens):
    q, kc, vc, table, lens = _paged_inputs(B, Hq, Hkv, D, bs, max_len, lens, seed=B + bs)
    out = b1k.paged_decode_attention(q, kc, vc, table, lens, max_len)
    assert out.shape == (B, Hq, D) and out.dtype == BF16
    close(out, b1k.paged_decode_reference(q, kc, vc, table, lens), BF16)


def test_paged_decode_masks_by_the_runtime_length(b1k):
    """The tail of each sequence's last block and the padding block 0 hold values that would dominate the softmax;
    the kernel masks them by the lengths it loads at run time: the same compiled shapes with other lengths give
    the other lengths' attention."""
    B, Hq, Hkv, D, bs, max_len = 4, 8, 2, 64, 32, 1024
    q, kc, vc, table, lens = _paged_inputs(B, Hq, Hkv, D, bs, max_len, [1000, 37, 513, 700], seed=5)
    for b, n in enumerate(lens):
        last = table[b, (n - 1) // bs]
        kc[last, :, n % bs or bs:] = 40.0
        vc[last, :, n % bs or bs:] = 40.0
    kc[0], vc[0] = 40.0, 40.0
    out = b1k.paged_decode_attention(q, kc, vc, table, lens, max_len)
    close(out, b1k.paged_decode_reference(q, kc, vc, table, lens), BF16)
    assert np.abs(f64(out)).max() < 10
    shorter = np.array([999, 33, 480, 699], np.int32)
    out2 = b1k.paged_decode_attention(q, kc, vc, table, shorter, max_len)
    close(out2, b1k.paged_decode_reference(q, kc, vc, table, shorter), BF16)


def test_paged_decode_gathers_only_the_needed_blocks(b1k):
    """Block 32, length bucket 1000 -> 32 blocks per sequence, in two chunks of 16 blocks (512 tokens): per
    (sequence, KV head, chunk) one indirect K gather and one V gather of 16 rows of bs * D. The HBM traffic is
    those blocks plus the queries, the table entries and the lengths; the table's width (padding columns) changes
    neither the traffic nor the time."""
    B, Hq, Hkv, D, bs, max_len = 4, 8, 2, 128, 32, 1000
    res = {}
    for pad in (3, 40):
        q, kc, vc, table, lens = _paged_inputs(B, Hq, Hkv, D, bs, max_len, [1000, 37, 513, 700], table_pad=pad,
                                               seed=2)
        out = b1k.paged_decode_attention(q, kc, vc, table, lens, max_len)
        close(out, b1k.paged_decode_reference(q, kc, vc, table, lens), BF16)
        k = b1k.paged_decode_attention
        gathers = [o for o in executed_ops(k.last_json["body"]) if o["op"] == "dma_copy"
                   and isinstance(o["src"], dict) and o["src"].get("tensor") in ("key_cache", "value_cache")]
        assert len(gathers) == B * Hkv * 2 * 2
        assert all("offsets" in o for o in gathers)  # row ids read at run time from an SBUF tile
        assert all(o["src"]["index"][1] == {"start": 0, "broadcast": 16} for o in gathers)  # 16 blocks each
        prof = k.last_profile
        needed = 32
        kv_bytes = 2 * B * Hkv * needed * bs * D * 2
        table_bytes = B * Hkv * needed * 4  # each (sequence, KV head) loads its chunk of table entries
        assert prof.stat("memory.hbm_read_bytes") == kv_bytes + q.nbytes + table_bytes + lens.nbytes
        assert prof.total_time_ns >= _roof_ns(kv_bytes, prof)
        res[pad] = prof.total_time_ns
    assert res[3] == res[40]


# --------------------------------------------------------------------------------------------------
# encoder-decoder cross-attention (Beta 1)
# --------------------------------------------------------------------------------------------------

def _cross_inputs(B, H, Sq, Sk, D, enc_lens, seed=0, mask_dtype=np.int32):
    q = randn((B, H, Sq, D), BF16, seed)
    k = randn((B, H, Sk, D), BF16, seed + 1)
    v = randn((B, H, Sk, D), BF16, seed + 2)
    mask = (np.arange(Sk)[None, :] < np.asarray(enc_lens)[:, None]).astype(mask_dtype)
    return q, k, v, mask


@pytest.mark.parametrize("B,H,Sq,Sk,D,enc_lens,mdt", [
    (2, 4, 200, 700, 128, [500, 650], np.int32),        # a ragged query tile (72 rows), a 188-key last chunk
    (4, 8, 64, 1500, 64, [1500, 400, 1024, 77], np.int32),  # whole 512-key chunks of padding for some sequences
    (2, 16, 128, 512, 64, [512, 300], np.uint8),          # one chunk, uint8 mask
])
def test_cross_attention_matches_numpy(b1k, B, H, Sq, Sk, D, enc_lens, mdt):
    q, k, v, mask = _cross_inputs(B, H, Sq, Sk, D, enc_lens, seed=Sq + Sk, mask_dtype=mdt)
    out = b1k.cross_attention(q, k, v, mask)
    assert out.shape == (B, H, Sq, D) and out.dtype == BF16
    close(out, b1k.cross_attention_reference(q, k, v, mask), BF16)


def test_cross_attention_ignores_padding_and_counts_matmuls(b1k):
    """Padded encoder positions hold large values: the output does not change. Per (batch, head, query tile, key
    chunk) one QK^T matmul and one PV matmul per 128 keys; per 128 keys one P transpose and one per query tile
    for q^T."""
    B, H, Sq, Sk, D = 2, 4, 200, 700, 128
    q, k, v, mask = _cross_inputs(B, H, Sq, Sk, D, [500, 650], seed=9)
    out = b1k.cross_attention(q, k, v, mask)
    k2, v2 = k.copy(), v.copy()
    k2[0, :, 500:], v2[0, :, 500:], k2[1, :, 650:], v2[1, :, 650:] = 30.0, 30.0, 30.0, 30.0
    np.testing.assert_array_equal(b1k.cross_attention(q, k2, v2, mask), out)
    lines = open(b1k.__file__).read().splitlines()
    mm_lines = {i for i, t in enumerate(lines, 1) if "nl.matmul(" in t}
    ops = executed_ops(b1k.cross_attention.last_json["body"])
    q_tiles, key_subtiles = 2, -(-512 // 128) + -(-188 // 128)
    assert sum(o["op"] == "nc_matmul" and o["loc"]["line"] in mm_lines for o in ops) == \
        B * H * q_tiles * (2 + key_subtiles)
    assert sum(o["op"] == "nc_transpose" for o in ops) == B * H * q_tiles * (1 + key_subtiles)
    assert sum(o["op"] == "dma_transpose" for o in ops) == B * H * q_tiles * 2  # K^T per 512-key chunk


def test_mqa_softcap_kept_loops_time_as_unrolled(sw):
    """S = 640, 4 query heads on one KV head: the query-tile loop is written out by Python (each tile sees its own
    number of key chunks), the loops inside it kept. The allocator gave each tile's rotating q-transpose PSUM tile
    two banks, and a later tile's P V accumulator took one of them: it waited for that tile's last transpose copy,
    76,000.2 ns kept against 62,181.6 ns unrolled. A rotating PSUM tile sharing its banks with another tile now
    makes the placement with one buffer per PSUM loop tile a candidate of the placement search
    (compiler.placement_search): 61,715.0 ns kept."""
    S, D = 640, 128
    k, v = randn((S, D), BF16, 1), randn((S, D), BF16, 2)
    q = randn((4, S, D), BF16, 4)
    t = {}
    for loops in ("keep", "unroll"):
        kern = sw.mqa_softcap_flash.options(loops=loops, timing_only=True)
        t[loops] = kern.simulate(q, k, v, 50.0)[1].total_time_ns
    assert t["keep"] < 1.05 * t["unroll"], t
