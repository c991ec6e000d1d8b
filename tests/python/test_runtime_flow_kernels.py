"""Runtime control flow written like public NKI kernels (tests/python/kernels/runtime_flow_kernels_new.py, new
dialect, unmodified, through ``nsim.compat``): sequencer registers (``nisa.register_alloc / register_load``) read from
HBM or from an on-chip tile, driving ``nl.dynamic_range`` / ``nl.fori_loop`` trip counts, ``nl.while_loop`` exits and
``.ap(scalar_offset=reg)`` addresses:

- a GQA decode step whose number of cache blocks is a runtime value (``dynamic_range`` over a register), and a ragged
  batch of decode sequences over a paged cache (static loop over sequences, ``fori_loop`` over each one's runtime
  block count, page ids read from the block table into a register and used as the page address);
- ``while_loop`` with a data-dependent exit: power iteration stopping when the change of the normalised vector,
  computed on chip, drops below a tolerance (or after max_iter), and speculative decoding's "accept the draft tokens
  until the first mismatch" (may run zero times);
- a row softmax over a runtime number of blocks with a ``no_reorder`` block inside the runtime loop;
- greedy sampling followed by the embedding lookup of the sampled token (the on-chip argmax loaded into a register
  that addresses the table row);
- a block GEMV with a runtime block count next to the same work in an ``affine_range`` with the count known at trace
  time.

Checked: float outputs against float64 numpy (fp32 1e-5, bf16 1e-2 of the output's scale), exact integers (accepted
tokens, iteration counts), no sanitizer report, instruction counts and HBM bytes that follow the *runtime* counts, and
the timing story of compiler.md §1: a runtime loop is not reordered across its iterations, so it is slower than the
software-pipelined ``affine_range`` doing the same work, and its time grows with the runtime count and does not depend
on the static bound (the cache's capacity). Out-of-range runtime values are clear NSIM-E408 errors at the user's line.

The kernels are new-dialect only: the spec's register functions (``register_alloc/load/store/move``) have no Beta-1
form (nki-api.md §2.3), so a Beta-1 ``dynamic_range`` could only take trace-time ints.

The nsim fixes this family needed (their regression tests fail without them):
- a runtime loop (``nl.dynamic_range``, ``nl.fori_loop``, ``nl.while_loop``) was unrolled while tracing into plain
  ops that the scheduler reordered and overlapped across iterations like an ``affine_range``: a dynamic loop timed
  exactly as the software-pipelined static loop (python/nsim/nki/language.py ``dynamic_range`` / ``fori_loop`` /
  ``while_loop`` now run their bodies under python/nsim/tracer.py ``runtime_loop`` / ``runtime_range``, which give the
  loop's ops one ``order_group`` as ``no_reorder`` does; ``test_dynamic_loop_is_slower_than_affine_range``);
- ``nisa.register_load`` of an out-of-range ``.ap(scalar_offset=reg)`` view (a block-table read past the row) read
  the view's static window, i.e. the row's first page id, silently, instead of the E408 the same view gives a DMA
  (python/nsim/tracer.py ``_Eager.values``: a value read of an out-of-range view raises its E408;
  ``test_block_table_read_past_the_row_is_an_error``);
- ``with nl.no_reorder():`` inside a runtime loop's body reset the order group to none on exit, so the rest of the
  runtime loop was reorderable again (python/nsim/tracer.py ``NoReorder.__enter__/__exit__``: a block inside a
  runtime loop joins the loop's group and restores it; ``test_no_reorder_inside_a_runtime_loop_keeps_the_loop_unreordered``)."""
import numpy as np
import pytest

from conftest import executed_ops, op_counts, require_core, run_clean, sample_fixture  # noqa: E402,F401

_core, ml_dtypes = require_core()
from numeric_helpers import close, f64, randn  # noqa: E402

BF16 = ml_dtypes.bfloat16

rf = sample_fixture("runtime_flow_kernels_new.py", module_only=True)


def _time(k):
    return k.last_profile.total_time_ns


def _close_scaled(got, want, dtype):
    """max |got - want| within the dtype's tolerance (fp32 1e-5, bf16 1e-2) of max |want| (long sums)."""
    tol = 1e-5 if np.dtype(dtype) == np.float32 else 1e-2
    got = f64(got)
    assert got.shape == want.shape, (got.shape, want.shape)
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err < tol, err


def ref_attention(qT, kT, v):
    """qT [d, G], kT [d, L], v [L, d] -> softmax(q k^T / sqrt(d)) v [G, d] in float64."""
    qT, kT, v = f64(qT), f64(kT), f64(v)
    s = qT.T @ kT / np.sqrt(qT.shape[0])
    p = np.exp(s - s.max(1, keepdims=True))
    return (p / p.sum(1, keepdims=True)) @ v


# --------------------------------------------------------------------------------------------------
# decode attention with a runtime block count; ragged paged batch
# --------------------------------------------------------------------------------------------------

def _decode_inputs(Hkv, d, G, NB, dtype, seed):
    return (randn((Hkv, d, G), dtype, seed), randn((Hkv, NB, d, 128), dtype, seed + 1),
            randn((Hkv, NB, 128, d), dtype, seed + 2))


def _ref_decode(q, kc, vc, n):
    return np.stack([ref_attention(q[h], np.concatenate(list(kc[h, :n]), 1), np.concatenate(list(vc[h, :n]), 0))
                     for h in range(q.shape[0])])


@pytest.mark.parametrize("n,dtype", [(1, BF16), (3, BF16), (6, BF16), (4, np.float32)])
def test_decode_attention_runtime_block_count(rf, n, dtype):
    """Only the first n (a register loaded from HBM) of the 6 cache blocks are read: numerics over those keys, one
    score and one PV matmul plus one transpose per head and block, and exactly those blocks' bytes read from HBM
    (the register load of the count is a sequencer read, not a DMA)."""
    Hkv, d, G, NB = 2, 64, 8, 6
    q, kc, vc = _decode_inputs(Hkv, d, G, NB, dtype, seed=n)
    out = run_clean(rf.decode_attention_dyn, q, kc, vc, np.array([n], np.int32))
    assert out.dtype == np.dtype(dtype)
    _close_scaled(out, _ref_decode(q, kc, vc, n), dtype)
    c = op_counts(rf.decode_attention_dyn)
    assert c["nc_matmul"] == Hkv * 2 * n and c["nc_transpose"] == Hkv * n, c
    assert c["dma_copy"] == Hkv * (1 + 2 * n + 1), c
    isz = np.dtype(dtype).itemsize
    prof = rf.decode_attention_dyn.last_profile
    assert prof.stat("memory.hbm_read_bytes") == q.nbytes + Hkv * n * 2 * 128 * d * isz
    assert prof.stat("memory.hbm_write_bytes") == Hkv * G * d * isz


def _paged_inputs(B, d, G, NP, M, seed):
    rng = np.random.default_rng(seed)
    q = randn((B, d, G), BF16, seed)
    kp = randn((NP, d, 128), BF16, seed + 1)
    vp = randn((NP, 128, d), BF16, seed + 2)
    table = np.stack([rng.permutation(NP)[:M] for _ in range(B)]).astype(np.int32)
    return q, kp, vp, table


def _ref_paged(q, kp, vp, table, lens):
    return np.stack([ref_attention(q[b], np.concatenate([kp[p] for p in table[b, :lens[b]]], 1),
                                   np.concatenate([vp[p] for p in table[b, :lens[b]]], 0))
                     for b in range(q.shape[0])])


@pytest.mark.parametrize("lens", [[2, 4, 1], [3, 3, 3, 3], [1]])
def test_paged_decode_ragged_batch(rf, lens):
    """Each sequence's block count is a runtime value and its pages come from the block table through a register:
    the output equals attention over exactly the pages listed, and the matmuls / HBM bytes follow sum(lens); one
    register_load per sequence (its count) and per page (its id), sequencer reads outside the DMA byte counts."""
    B, d, G, NP, M = len(lens), 64, 8, 12, 4
    q, kp, vp, table = _paged_inputs(B, d, G, NP, M, seed=sum(lens) + B)
    lens = np.array(lens, np.int32)
    out = run_clean(rf.paged_decode, q, kp, vp, table, lens)
    _close_scaled(out, _ref_paged(q, kp, vp, table, lens), BF16)
    c = op_counts(rf.paged_decode)
    assert c["nc_matmul"] == 2 * int(lens.sum()), c
    prof = rf.paged_decode.last_profile
    assert prof.stat("memory.hbm_read_bytes") == q.nbytes + int(lens.sum()) * 2 * 128 * d * 2
    assert c["register_load"] == B + int(lens.sum()), c


def test_block_table_read_past_the_row_is_an_error(rf):
    """Regression: a runtime block count beyond the block table's row makes ``register_load`` read
    ``block_table.ap(scalar_offset=j)`` out of range; nsim read the row's first page id silently (and attended over
    it twice). It is NSIM-E408 at the kernel's line, as the same view is for a DMA."""
    q, kp, vp, table = _paged_inputs(2, 64, 8, 6, 2, seed=3)
    with pytest.raises(Exception) as e:
        run_clean(rf.paged_decode, q, kp, vp, table, np.array([1, 3], np.int32))
    msg = str(e.value)
    assert "NSIM-E408" in msg and "block_table" in msg and "value 2 is outside [0, 2)" in msg, msg
    assert "runtime_flow_kernels_new.py" in msg, msg


@pytest.mark.parametrize("what", ["count", "page"])
def test_out_of_range_runtime_value_is_a_clear_error(rf, what):
    """A runtime block count past the cache's capacity, or a page id past the page pool, is NSIM-E408
    err_tensor_access_out_of_bound naming the tensor and the value (oob_mode=error), not a crash or a wrong read."""
    if what == "count":
        q, kc, vc = _decode_inputs(1, 64, 8, 3, BF16, seed=5)
        with pytest.raises(Exception) as e:
            run_clean(rf.decode_attention_dyn, q, kc, vc, np.array([4], np.int32))
        want = ("k_cache", "value 3 is outside [0, 3)")
    else:
        q, kp, vp, table = _paged_inputs(2, 64, 8, 4, 2, seed=6)
        table[1, 1] = 9
        with pytest.raises(Exception) as e:
            run_clean(rf.paged_decode, q, kp, vp, table, np.array([2, 2], np.int32))
        want = ("k_pages", "value 9 is outside [0, 4)")
    msg = str(e.value)
    assert "NSIM-E408" in msg and "err_tensor_access_out_of_bound" in msg, msg
    assert all(w in msg for w in want), msg


# --------------------------------------------------------------------------------------------------
# timing: runtime loops are not reordered across iterations
# --------------------------------------------------------------------------------------------------

def _gemv_inputs(NB, seed):
    return randn((NB, 128, 16), BF16, seed), randn((NB, 128, 256), BF16, seed + 1)


def test_block_gemv_numerics_and_counts(rf):
    x, w = _gemv_inputs(8, seed=11)
    want = np.einsum("bkg,bkn->gn", f64(x[:5]), f64(w[:5]))
    a = run_clean(rf.block_gemv_dyn, x, w, np.array([5], np.int32))
    b = run_clean(rf.block_gemv_static, x, w, 5)
    _close_scaled(a, want, BF16)
    np.testing.assert_array_equal(f64(a), f64(b))
    assert op_counts(rf.block_gemv_dyn)["nc_matmul"] == 5 == op_counts(rf.block_gemv_static)["nc_matmul"]


def test_dynamic_loop_is_slower_than_affine_range(rf):
    """Regression (the runtime-loop fix): the same 6 blocks of loads + matmul. With the count known at trace time
    (``affine_range``) the scheduler software-pipelines the iterations (block b + 1's loads run under block b's
    matmul, the loads of one block in parallel); a ``dynamic_range`` over a register is a loop on the sequencers that
    is not reordered across iterations (compiler.md §1), so each block waits for the previous one: longer. Before the
    fix both took exactly the same time."""
    x, w = _gemv_inputs(8, seed=12)
    run_clean(rf.block_gemv_static, x, w, 6)
    t_static = _time(rf.block_gemv_static)
    run_clean(rf.block_gemv_dyn, x, w, np.array([6], np.int32))
    t_dyn = _time(rf.block_gemv_dyn)
    assert t_dyn > 1.1 * t_static, (t_dyn, t_static)


def test_runtime_loop_time_follows_the_runtime_count_not_the_bound(rf):
    """The simulated time depends on the register's value: it grows with the runtime block count (each extra block
    adds about the same time: no pipelining across the runtime iterations), and a cache with twice the capacity
    (the static bound) but the same count takes exactly the same time."""
    times = {}
    for NB in (6, 12):
        q, kc, vc = _decode_inputs(2, 64, 8, NB, BF16, seed=20)
        for n in (2, 4, 6):
            run_clean(rf.decode_attention_dyn, q, kc, vc, np.array([n], np.int32))
            times[NB, n] = _time(rf.decode_attention_dyn)
    assert times[6, 2] < times[6, 4] < times[6, 6], times
    for n in (2, 4, 6):
        assert times[6, n] == times[12, n], times
    step1, step2 = times[6, 4] - times[6, 2], times[6, 6] - times[6, 4]
    assert abs(step1 - step2) < 0.1 * step1, times


def test_fori_loop_and_while_loop_are_runtime_loops_too(rf):
    """``fori_loop`` (paged decode) and ``while_loop`` (power iteration at a fixed iteration count) get the same
    treatment: time grows with the runtime trip count."""
    q, kp, vp, table = _paged_inputs(1, 64, 8, 8, 4, seed=30)
    t = []
    for n in (1, 2, 4):
        run_clean(rf.paged_decode, q, kp, vp, table, np.array([n], np.int32))
        t.append(_time(rf.paged_decode))
    assert t[0] < t[1] < t[2], t
    a, v0 = _spd(32, seed=31)
    t = []
    for it in (2, 4, 8):
        run_clean(rf.power_iteration, a, v0, 0.0, it)
        t.append(_time(rf.power_iteration))
    assert t[0] < t[1] < t[2], t


def test_no_reorder_inside_a_runtime_loop_keeps_the_loop_unreordered(rf):
    """Regression: a ``no_reorder`` block inside a ``dynamic_range`` body (allowed: only dynamic loops inside
    no_reorder are not) ended, on exit, the runtime loop's program order too: the ops after the block and every
    later iteration went back to the reorderable stream. Every op of the runtime loop (the block's included) now
    carries the loop's one order group; the numerics are softmax over the first n blocks, the rest zero."""
    x = randn((4, 128, 64), np.float32, seed=40)
    out = run_clean(rf.block_softmax_dyn, x, np.array([3], np.int32))
    e = np.exp(f64(x[:3]) - f64(x[:3]).max(-1, keepdims=True))
    close(out[:3], e / e.sum(-1, keepdims=True))
    np.testing.assert_array_equal(out[3], 0.0)
    ops = executed_ops(rf.block_softmax_dyn.last_json["body"])
    # the zero fill (memset + 4 stores), the count's register_load, then 3 x (load, 4 ops, store)
    pre, loop = ops[:6], ops[6:]
    assert [o["op"] for o in pre] == ["memset"] + ["dma_copy"] * 4 + ["register_load"] and len(loop) == 3 * 6
    assert all("order_group" not in o for o in pre)
    # the sequencers branch on the loaded count: every op of the loop waits for its register_load
    assert all(o.get("after") == [pre[-1]["label"]] for o in loop), [o.get("after") for o in loop]
    groups = {o.get("order_group") for o in loop}
    assert len(groups) == 1 and None not in groups, [(o["op"], o.get("order_group")) for o in loop]


def _greedy_inputs(V, seed):
    return randn((1, V), np.float32, seed), randn((V, 128, 16), BF16, seed + 1)


def test_greedy_next_embedding_uses_the_on_chip_argmax(rf):
    """The register loaded from the on-chip argmax addresses the embedding row: the token is numpy's argmax and the
    embedding that row, bit for bit; only that row of the table is read."""
    logits, table = _greedy_inputs(2048, seed=50)
    token, emb = run_clean(rf.greedy_next_embedding, logits, table)
    k = int(np.argmax(logits))
    assert token.dtype == np.uint32 and int(token[0, 0]) == k
    np.testing.assert_array_equal(emb.view(np.uint16), table[k].view(np.uint16))
    prof = rf.greedy_next_embedding.last_profile
    assert prof.stat("memory.hbm_read_bytes") == logits.nbytes + table[k].nbytes


def test_register_address_waits_for_the_tile_it_was_loaded_from(rf):
    """The embedding DMA addressed by the argmax register cannot start before ``nc_find_index8`` has written the
    index and ``register_load`` has read it (neuroncore.md 2.1: register_load is a sequencer instruction reading
    SBUF), so it cannot overlap the argmax as the same DMA at a fixed row (``dependent=False``) may: longer, by at
    least the register_load's own time on its sequencer (trn2: sync.trigger_instr 80 ns + sync.register_load_sbuf
    100 ns; the rest is the argmax the DMA no longer overlaps). Regression: register_load emitted no instruction
    and both took the same time. The instruction is labelled, and the DMA names it in its "after"."""
    logits, table = _greedy_inputs(2048, seed=51)
    run_clean(rf.greedy_next_embedding, logits, table, True)
    t_dep = _time(rf.greedy_next_embedding)
    ops = executed_ops(rf.greedy_next_embedding.last_json["body"])
    (rl,) = [o for o in ops if o["op"] == "register_load"]
    assert rl["src"]["tensor"] and rl["label"].startswith("register_load#")
    waiting = [o for o in ops if "after" in o]
    assert [o["op"] for o in waiting] == ["dma_copy"] and waiting[0]["after"] == [rl["label"]]
    run_clean(rf.greedy_next_embedding, logits, table, False)
    t_free = _time(rf.greedy_next_embedding)
    assert t_dep >= t_free + 180.0, (t_dep, t_free)


# --------------------------------------------------------------------------------------------------
# while_loop with a data-dependent exit
# --------------------------------------------------------------------------------------------------

def _spd(n, seed, gap=0.6):
    rng = np.random.default_rng(seed)
    Q, _ = np.linalg.qr(rng.standard_normal((n, n)))
    ev = np.concatenate([[10.0, 10.0 * gap], rng.uniform(0.0, 10.0 * gap * 0.8, n - 2)])
    a = ((Q * ev) @ Q.T).astype(np.float32)
    v0 = (np.abs(rng.standard_normal((n, 1))) + 0.1).astype(np.float32)
    return a, v0


def ref_power(a, v0, tol, max_iter):
    a, v = f64(a), f64(v0)
    lam, it, more = 0.0, 0, max_iter > 0
    while more:
        w = a @ v
        lam = np.sqrt((w * w).sum())
        vn = w / lam
        r = ((vn - v) ** 2).sum()
        v, it = vn, it + 1
        more = r > tol * tol and it < max_iter
    return v, lam, it


@pytest.mark.parametrize("n,tol", [(64, 1e-3), (128, 1e-4), (32, 3e-4)])
def test_power_iteration_stops_on_the_residual(rf, n, tol):
    """The loop exits when the on-chip residual drops below tol: the iteration count matches the float64 loop's
    (within one: the residual's last bits near tol), well below max_iter; the vector is the dominant eigenvector and
    the eigenvalue within the accuracy the stopping rule gives; three matmuls per executed iteration."""
    a, v0 = _spd(n, seed=n)
    v, lam, it = run_clean(rf.power_iteration, a, v0, tol, 200)
    v_ref, lam_ref, it_ref = ref_power(a, v0, tol, 200)
    assert it.dtype == np.int32 and abs(int(it[0, 0]) - it_ref) <= 1 and it_ref < 100, (it, it_ref)
    assert op_counts(rf.power_iteration)["nc_matmul"] == 3 * int(it[0, 0])
    w, vec = np.linalg.eigh(f64(a))
    top = vec[:, -1] * np.sign(vec[:, -1] @ f64(v)[:, 0])  # (an eigenvector's sign is arbitrary)
    assert np.abs(f64(v)[:, 0] - top).max() < 20 * tol
    assert abs(float(lam[0, 0]) - w[-1]) < 1e-2 * w[-1]
    if int(it[0, 0]) == it_ref:  # same trip count: the same arithmetic as the float64 loop
        close(v, v_ref)


def test_power_iteration_max_iter_and_zero_trips(rf):
    """tol = 0 never converges in fp32 arithmetic: the max_iter bound ends the loop after exactly max_iter trips;
    max_iter = 0 makes the while_loop's initial register 0: the body never runs (v is v0, lam 0, no matmul)."""
    a, v0 = _spd(48, seed=7)
    v, lam, it = run_clean(rf.power_iteration, a, v0, 0.0, 9)
    assert int(it[0, 0]) == 9 and op_counts(rf.power_iteration)["nc_matmul"] == 27
    v_ref, lam_ref, _ = ref_power(a, v0, 0.0, 9)
    close(v, v_ref)
    close(lam[0, 0], lam_ref)
    v, lam, it = run_clean(rf.power_iteration, a, v0, 1e-3, 0)
    assert int(it[0, 0]) == 0 and float(lam[0, 0]) == 0.0 and op_counts(rf.power_iteration)["nc_matmul"] == 0
    np.testing.assert_array_equal(v, v0)


def test_power_iteration_loop_cap_is_a_clear_error(rf, monkeypatch):
    """A while_loop that runs past nsim's unrolling cap is a ResourceLimit error naming the cap, not a hang."""
    import nsim.tracer as tr
    monkeypatch.setattr(tr, "MAX_LOOP_TRIPS", 12)
    a, v0 = _spd(16, seed=8)
    with pytest.raises(Exception) as e:
        run_clean(rf.power_iteration, a, v0, 0.0, 100)
    assert "nl.while_loop" in str(e.value) and "MAX_LOOP_TRIPS" in str(e.value), str(e.value)


def ref_accept(draft, target):
    K = draft.shape[1]
    n = 0
    while n < K and draft[0, n] == target[0, n]:
        n += 1
    out = np.full((1, K + 1), -1, np.int32)
    out[0, :n] = draft[0, :n]
    out[0, n] = target[0, n]
    return out, n


@pytest.mark.parametrize("case", ["mismatch_mid", "all_accepted", "first_rejected", "long"])
def test_accept_until_first_mismatch(rf, case):
    """Accepted drafts then the target's token at the first mismatch (the bonus token when all K match), -1 after;
    the loop runs once per accepted token (also zero times): two token reads per check plus one write per accepted
    token, then the final read and write and the count."""
    rng = np.random.default_rng(len(case))
    K = 16 if case == "long" else 5
    target = rng.integers(0, 32000, (1, K + 1)).astype(np.int32)
    draft = target[:, :K].copy()
    cut = {"mismatch_mid": 2, "all_accepted": None, "first_rejected": 0, "long": 11}[case]
    if cut is not None:
        draft[0, cut] += 1
    tokens, accepted = run_clean(rf.accept_prefix, draft, target)
    want, n = ref_accept(draft, target)
    np.testing.assert_array_equal(tokens, want)
    assert int(accepted[0, 0]) == n
    c = op_counts(rf.accept_prefix)
    assert c["dma_copy"] == 1 + 2 * (n + 1) + n + 2 + 1, c
