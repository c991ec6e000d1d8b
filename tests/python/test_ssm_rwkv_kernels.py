"""Selective state-space and RWKV recurrences written like public NKI kernels (tests/python/kernels/ssm_rwkv_kernels.py,
Beta-1 dialect, and ssm_rwkv_kernels_new.py, new dialect; both unmodified, through ``nsim.compat``):

- the Mamba-1 selective scan of a prefill (Beta 1), in the NKI Mamba tutorial's progression: the naive recurrence one
  instruction per (state, position), the tutorial's first loop order (state outer, channel tile inner, reloading and
  recomputing delta for every state), and the optimised kernel (channel tile outer, state inner, the sequence split
  into chunks with each state's last column carried into the next chunk's ``tensor_tensor_scan``), with softplus(delta
  + bias), D skip and silu(z) gating; B / C rows broadcast on chip (PE) or by a stride-0 DMA;
- the same scan in the new dialect with all N states of a chunk in one [128, N, chunk] tile (stride-0 views for the
  delta x A outer product, a permuted view to reduce over the states), its batch dealt to the programs of LNC=2;
- one Mamba-1 decode step (both dialects): the 4-tap conv window shifted and the SSM state updated in place in HBM;
- the RWKV-6 WKV recurrence with data-dependent decay, step by step (new dialect) and in the chunked parallel form
  (new dialect and Beta 1: cumulative log decay by ``tensor_tensor_scan``, intra-chunk scores masked strictly causal,
  the u bonus on the diagonal, the state carried across chunks), and RWKV's token-shift channel mix with a squared
  ReLU (both dialects);
- Griffin's RG-LRU (new dialect).

Checked: outputs and the in-place / returned states against float64 numpy (fp32 1e-5 relative to the largest element:
the recurrences' elements are long sums, so their small elements carry the sums' absolute error; bf16 1e-2), no
sanitizer report, the instruction / DMA counts and HBM bytes each tiling implies, and the tutorial's timing story
(per-step loop vs scan, loop order, chunking of L; sequential vs chunked WKV) with the direction argued from the cost
model.

The nsim fixes this family needed (their tests fail without them):
- the naive scan's per-state loop (``nl.affine_range(N)``, kept as a kernel-IR loop by the tracer) simulated 1.6x
  slower than the same kernel unrolled (28,410 against 17,658 ns), because python/nsim/tracer.py ``Tracer.tile``
  keyed its storage pool by the kernel line, so a statement's partition-broadcast copy and its result
  (``tensor_tensor(delta_x, B_i.broadcast_to(...))``) looked like one line's tiles made twice per pass and got one
  buffer each. The key now holds the nsim call path as well: kept and unrolled agree (here, for the Beta-1 selective
  scan and for the NKI tutorial's LayerNorm v1); ``test_kept_state_loop_with_broadcast_statements_times_as_unrolled``.

Numerics needed no fix: every kernel ran correctly, without a sanitizer report, on the first attempt; the probes of
``tensor_tensor_scan`` (reverse0/reverse1 operand order, a (P, 1) or PSUM ``initial``, a PSUM or stride-0 broadcast
``data``) matched numpy as well and are kept below as tests of the semantics the kernels rely on.
"""
import numpy as np
import pytest

from conftest import executed_ops, require_core, sample_fixture, run_clean, op_counts  # noqa: E402

_core, ml_dtypes = require_core()
from numeric_helpers import close, close_to_max, f64, randn  # noqa: E402

BF16 = ml_dtypes.bfloat16

sk = sample_fixture("ssm_rwkv_kernels.py")
skn = sample_fixture("ssm_rwkv_kernels_new.py", module_only=True)


def _sig(a):
    return 1.0 / (1.0 + np.exp(-a))


def _softplus(a):
    return np.log1p(np.exp(a))


def _silu(a):
    return a * _sig(a)


# --------------------------------------------------------------------------------------------------
# Mamba-1 selective scan (prefill)
# --------------------------------------------------------------------------------------------------

def _mamba_inputs(Bt, Ch, L, N, dtype, seed):
    rng = np.random.default_rng(seed)
    x = randn((Bt, Ch, L), dtype, seed)
    delta = (rng.standard_normal((Bt, Ch, L)) * 0.5 - 1.0).astype(dtype)
    z = randn((Bt, Ch, L), dtype, seed + 1)
    A = (-np.exp(rng.standard_normal((Ch, N)) * 0.5)).astype(np.float32)   # S4D-real style negative decays
    B = randn((Bt, N, L), dtype, seed + 2)
    C = randn((Bt, N, L), dtype, seed + 3)
    D = randn((Ch, 1), np.float32, seed + 4)
    db = randn((Ch, 1), np.float32, seed + 5, scale=0.1)
    return x, delta, A, B, C, D, z, db


def ref_mamba1(x, delta, A, B, C, D, z, db):
    x, delta, B, C, z = (f64(a) for a in (x, delta, B, C, z))
    A, D, db = f64(A), f64(D), f64(db)
    Bt, Ch, L = x.shape
    d = _softplus(delta + db[None])
    y = np.zeros((Bt, Ch, L))
    for b in range(Bt):
        h = np.zeros((Ch, A.shape[1]))
        for t in range(L):
            h = np.exp(d[b, :, t, None] * A) * h + (d[b, :, t] * x[b, :, t])[:, None] * B[b, :, t][None, :]
            y[b, :, t] = h @ C[b, :, t]
    return (y + D[None] * x) * _silu(z)


@pytest.mark.parametrize("Bt,Ch,L,N,chunk,dtype,bc", [
    (1, 256, 256, 4, 128, np.float32, "sbuf"),     # 2 channel tiles, 2 chunks: the state carried once
    (2, 128, 384, 8, 128, np.float32, "dma"),      # 3 chunks, B / C by stride-0 DMA
    (1, 128, 256, 16, 256, BF16, "sbuf"),          # one chunk, bf16 activations
    (2, 128, 192, 4, 64, BF16, "dma"),
])
def test_mamba1_selective_scan_matches_numpy(sk, Bt, Ch, L, N, chunk, dtype, bc):
    m = sk[0]
    args = _mamba_inputs(Bt, Ch, L, N, dtype, seed=L + N)
    out = run_clean(m.mamba1_selective_scan, *args, chunk, bc)
    assert out.dtype == np.dtype(dtype) and out.shape == (Bt, Ch, L)
    # fp32: the scan runs in fp32 over at most 384 positions of |dA| < 1 (a contraction), so the error stays at a
    # few ulp of the largest y; bf16: the output's rounding
    close_to_max(out, ref_mamba1(*args), dtype)


@pytest.mark.parametrize("Bt,Ch,L,N,chunk,dtype", [
    (1, 256, 256, 4, 128, np.float32),
    (2, 128, 192, 16, 64, np.float32),
    (2, 128, 256, 8, 256, BF16),
])
def test_mamba1_selective_scan_new_dialect_matches_numpy(skn, Bt, Ch, L, N, chunk, dtype):
    args = _mamba_inputs(Bt, Ch, L, N, dtype, seed=L * N)
    out = run_clean(skn.mamba1_selective_scan, *args, chunk)
    assert out.dtype == np.dtype(dtype)
    close_to_max(out, ref_mamba1(*args), dtype)
    ops = op_counts(skn.mamba1_selective_scan)
    steps = Bt * (Ch // 128) * (L // chunk)
    assert ops["tensor_tensor_scan"] == steps * N
    assert ops["activation"] == steps * 3          # softplus, one exp for all states, silu
    assert ops["tensor_reduce"] == steps


def test_mamba1_selective_scan_lnc2(skn):
    """Batch 4 dealt to the two programs of an LNC=2 launch: the same output. Each core does half the batches, so its
    VectorE busy time (the bound) halves; the first loads and the last store of each core (pipeline fill and drain)
    do not shrink, and the shared HBM carries the same bytes (~45% of one core's time, ~37% of the LNC=2 time), so
    the time drops to roughly 0.6x, clearly under 0.7x."""
    args = _mamba_inputs(4, 128, 256, 8, np.float32, seed=9)
    k = skn.mamba1_selective_scan
    one = run_clean(k, *args, 128)
    t1 = k.last_profile.total_time_ns
    two = run_clean(k[2], *args, 128)
    t2 = k.last_profile.total_time_ns
    np.testing.assert_array_equal(one, two)
    assert t2 < 0.7 * t1, (t1, t2)


@pytest.mark.parametrize("name", ["mamba1_scan_state_outer", "mamba1_scan_stepwise"])
def test_mamba1_tutorial_steps_match_numpy(sk, name):
    m = sk[0]
    args = _mamba_inputs(1, 256, 96, 4, np.float32, seed=7)
    out = run_clean(getattr(m, name), *args)
    close_to_max(out, ref_mamba1(*args), np.float32)


def _hbm_read(k):
    return k.last_profile.stat("memory.hbm_read_bytes")


def test_mamba1_selective_scan_structure(sk):
    """Bt = 2, Ch = 256 (2 channel tiles), L = 256 in 2 chunks of 128, N = 4. Per (batch, channel tile, chunk) one
    softplus, one silu and N exps (ScalarE), N scans; loads of A / D / bias once per (batch, channel tile), of delta /
    x / z and the N B and C rows per chunk, one store per chunk. Every input element crosses HBM once except the B / C
    rows (once per channel tile) and the per-channel parameters (once per batch); the stride-0 DMA broadcast reads
    each B / C row once per destination partition (128x)."""
    m = sk[0]
    Bt, Ch, L, N, chunk = 2, 256, 256, 4, 128
    NC, NL = Ch // 128, L // chunk
    args = _mamba_inputs(Bt, Ch, L, N, np.float32, seed=3)
    k = m.mamba1_selective_scan
    run_clean(k, *args, chunk, "sbuf")
    ops = op_counts(k)
    steps = Bt * NC * NL
    assert ops["tensor_tensor_scan"] == steps * N
    assert ops["activation"] == steps * (N + 2)
    assert ops["dma_copy"] == Bt * NC * 3 + steps * (3 + 2 * N + 1)
    # the PE partition broadcast of each B / C row: a one-row matmul (load-stationary + multiply-moving) each
    assert ops["nc_matmul"] == steps * 2 * N
    per_ctile = 128 * (N + 2) * 4
    want = 3 * Bt * Ch * L * 4 + Bt * NC * per_ctile + Bt * NC * 2 * N * L * 4
    assert _hbm_read(k) == want
    assert k.last_profile.stat("memory.hbm_write_bytes") == Bt * Ch * L * 4

    run_clean(k, *args, chunk, "dma")
    ops = op_counts(k)
    assert ops["nc_matmul"] == 0
    assert _hbm_read(k) == 3 * Bt * Ch * L * 4 + Bt * NC * per_ctile + Bt * NC * 2 * N * L * 4 * 128

    # the tutorial's first loop order reloads delta and x for every state
    ko = m.mamba1_scan_state_outer
    run_clean(ko, *args)
    ops = op_counts(ko)
    assert ops["activation"] == Bt * N * NC * 2 + Bt * NC      # softplus + exp per (state, tile); silu per tile
    assert _hbm_read(ko) == (Bt * N * NC * (2 * 128 * L + 2 * 128) * 4 + Bt * N * 2 * L * 4
                             + Bt * NC * (2 * 128 * L + 128) * 4)


def test_kept_state_loop_with_broadcast_statements_times_as_unrolled(sk):
    """The naive scan's state loop (``affine_range`` over n, kept as a kernel-IR loop by the tracer) holds statements
    that make two SBUF tiles of one shape on one line: the partition broadcast of B's row (``B_i.broadcast_to``) and
    the product ``tensor_tensor(delta_x, B_bc)``. When the tracer's pool of storages was keyed by the kernel line
    alone, the two counted as one allocation site made twice per pass (as an unrolled inner loop's tiles would be)
    and got one buffer each: state n + 1's product waited for state n's whole per-position chain to finish reading
    the product's storage (a WAR): kept 28,410 ns against unrolled 17,658 ns (N = 2, L = 64). Kept and unrolled
    traces are meant to time the same (docs/kernel-json.md "Loops from the Python tracer")."""
    m = sk[0]
    args = _mamba_inputs(1, 128, 64, 2, np.float32, seed=1)
    t, ops, outs = {}, {}, {}
    for mode in ("keep", "unroll"):
        k = m.mamba1_scan_stepwise.options(loops=mode)
        outs[mode] = run_clean(k, *args)
        t[mode] = k.last_profile.total_time_ns
        ops[mode] = [o["op"] for o in executed_ops(k.last_json["body"])]
        if mode == "keep":
            loops = [s["loop"] for s in k.last_json["body"] if "loop" in s]
            assert loops and loops[0]["var"] == "n", "the state loop is kept"
    np.testing.assert_array_equal(outs["keep"], outs["unroll"])
    assert ops["keep"] == ops["unroll"]
    assert t["keep"] == pytest.approx(t["unroll"], rel=1e-9), t


def _timing(kernel, *args):
    _, prof = kernel.options(timing_only=True).simulate(*args)
    return prof.total_time_ns


def test_mamba1_timing_story(sk):
    """The tutorial's progression, timed (trn2):
    1. per-step loop vs tensor_tensor_scan (Ch = 128, L = 256, N = 4): the naive loop issues one dependent
       scalar_tensor_tensor per (state, position), each starting after its predecessor's end: MIN_II (64 cycles)
       plus VectorE's fixed latency (100 cycles), ~170 ns per position. The 4 states' chains are independent and
       interleave on VectorE (the next independent instruction issues one II later), which hides at most
       164 / 64 ~ 2.6x of it: >= 4 * 255 * 170 / 2.6 ns ~ 67 us. The scan streams a whole row at 2 cycles per
       element (max(MIN_II, 2N)), ~0.5 us per state, and the kernel around it is ~10 us: at least 5x faster.
    2. loop order (Ch = 256, L = 2048, N = 16): state outer reloads delta and x and recomputes softplus and delta * x
       for every state (N x the HBM traffic, one more ScalarE and VectorE pass over L per state): channel tile outer /
       state inner with 512-column chunks is faster.
    3. chunking L (Ch = 128, L = 8192, N = 8): the whole sequence as one chunk needs ~9 fp32 [128, 8192] tiles
       (32 KiB per partition each) live at once: more than SBUF's 224 KiB per partition (trn2), NSIM-E204. Chunks of
       4096 fit only with a single buffer per tile, so the next state's ScalarE exp and PE broadcasts wait for this
       state's VectorE work to release its tiles; 512-column chunks leave room for rotating buffers and the engines
       overlap (same element count, well under 0.6x the time). Chunks of 128 are slow again: 4x the instructions of
       512, each a [128, 128] op whose busy time (2 * 128 cycles on VectorE, max(64, 128) on the PE plus its ~350-cycle
       latency for a broadcast) is comparable with the fixed per-instruction latency it pays (310.7 against 414.0 us
       with four rotating buffers per tile, which overlap more of those latencies than two did)."""
    m, nki = sk[0], sk[1]
    x, delta, A, B, C, D, z, db = _mamba_inputs(1, 128, 256, 4, np.float32, seed=1)
    # timed as the tutorial times it: nki.benchmark's latency percentiles (microseconds, from nsim's timing model)
    lat = {}
    for name, extra in (("mamba1_scan_stepwise", ()), ("mamba1_selective_scan", (256, "sbuf"))):
        bench = nki.benchmark(warmup=2, iters=10)(getattr(m, name))
        bench(x, delta, A, B, C, D, z, db, *extra)
        lat[name] = bench.benchmark_result.nc_latency.get_latency_percentile(50)
    t_step, t_scan = lat["mamba1_scan_stepwise"], lat["mamba1_selective_scan"]
    assert t_step > 5 * t_scan, (t_step, t_scan)

    args = _mamba_inputs(1, 256, 2048, 16, np.float32, seed=2)
    t_outer = _timing(m.mamba1_scan_state_outer, *args)
    t_inner = _timing(m.mamba1_selective_scan, *args, 512, "sbuf")
    assert t_inner < 0.95 * t_outer, (t_inner, t_outer)

    args = _mamba_inputs(1, 128, 8192, 8, np.float32, seed=3)
    with pytest.raises(Exception, match="NSIM-E204"):
        _timing(m.mamba1_selective_scan, *args, 8192, "sbuf")
    t_big, t_512, t_128 = (_timing(m.mamba1_selective_scan, *args, c, "sbuf") for c in (4096, 512, 128))
    assert t_512 < 0.6 * t_big and t_512 < 0.8 * t_128, (t_big, t_512, t_128)


# --------------------------------------------------------------------------------------------------
# Mamba-1 decode step
# --------------------------------------------------------------------------------------------------

def _decode_inputs(Bt, Ch, N, dtype, seed):
    f = lambda *s, k=0, sc=1.0: randn(s, np.float32, seed + k, scale=sc)  # noqa: E731
    x, z, dt = (f(Bt, Ch, k=i).astype(dtype) for i in range(3))
    B, C = f(Bt, N, k=3).astype(dtype), f(Bt, N, k=4).astype(dtype)
    A = -np.exp(f(Ch, N, k=5, sc=0.5))
    D, dtb, cb = f(Ch, 1, k=6), f(Ch, 1, k=7, sc=0.1), f(Ch, 1, k=8)
    cw = f(Ch, 4, k=9)
    conv_state = f(Bt, Ch, 4, k=10).astype(dtype)
    ssm_state = f(Bt, Ch, N, k=11)
    return x, z, dt, B, C, A, D, dtb, cw, cb, conv_state, ssm_state


def ref_decode(x, z, dt, B, C, A, D, dtb, cw, cb, conv_state, ssm_state):
    x, z, dt, B, C, cs0, h0 = (f64(a) for a in (x, z, dt, B, C, conv_state, ssm_state))
    cs = np.concatenate([cs0[:, :, 1:], x[:, :, None]], -1)
    xc = _silu((cs * f64(cw)).sum(-1) + f64(cb)[:, 0])
    d = _softplus(dt + f64(dtb)[:, 0])
    h = np.exp(d[:, :, None] * f64(A)) * h0 + (d * xc)[:, :, None] * B[:, None, :]
    y = ((h * C[:, None, :]).sum(-1) + f64(D)[:, 0] * xc) * _silu(z)
    return y, cs, h


@pytest.mark.parametrize("dialect", ["new", "beta1"])
@pytest.mark.parametrize("Bt,Ch,N,dtype", [(2, 256, 16, np.float32), (3, 128, 8, BF16)])
def test_mamba1_decode_step_updates_state_in_place(sk, skn, dialect, Bt, Ch, N, dtype):
    m = skn if dialect == "new" else sk[0]
    args = _decode_inputs(Bt, Ch, N, dtype, seed=Ch + N)
    conv_state, ssm_state = args[-2], args[-1]
    want_y, want_cs, want_h = ref_decode(*(a.copy() for a in args))
    y = run_clean(m.mamba1_decode_step, *args)
    assert y.dtype == np.dtype(dtype)
    close_to_max(y, want_y, dtype)
    # the conv window moves values: bit exact (the fp32 tile holds bf16 values exactly)
    np.testing.assert_array_equal(f64(conv_state), want_cs)
    close_to_max(ssm_state, want_h, np.float32)


@pytest.mark.parametrize("dialect", ["new", "beta1"])
def test_mamba1_decode_step_structure(sk, skn, dialect):
    """Per channel tile 5 parameter loads; per (token, channel tile) loads of x / z / dt / the conv window / the SSM
    state and the two broadcast rows, stores of the window, the state and y: 10 DMAs. The B / C rows arrive by
    stride-0 DMAs reading each row once per partition; everything else crosses HBM once."""
    Bt, Ch, N = 2, 256, 16
    args = _decode_inputs(Bt, Ch, N, np.float32, seed=0)
    k = (skn if dialect == "new" else sk[0]).mamba1_decode_step
    run_clean(k, *args)
    ops = op_counts(k)
    NC = Ch // 128
    assert ops["dma_copy"] == NC * 5 + Bt * NC * 10
    assert ops["activation"] == Bt * NC * 4           # silu(conv), softplus(dt), exp(dt A), silu(z)
    assert ops["nc_matmul"] == 0
    params = Ch * (N + 3 + 4) * 4
    per_tok = 128 * (3 + 4 + N) * 4 + 2 * 128 * N * 4
    assert _hbm_read(k) == params + Bt * NC * per_tok
    assert k.last_profile.stat("memory.hbm_write_bytes") == Bt * Ch * (1 + 4 + N) * 4


# --------------------------------------------------------------------------------------------------
# RWKV-6 WKV
# --------------------------------------------------------------------------------------------------

def _wkv_inputs(H, T, d, seed):
    rng = np.random.default_rng(seed)
    r, k, v = (randn((H, T, d), np.float32, seed + i, scale=0.5) for i in range(3))
    # RWKV-6 decay w = exp(-exp(w_raw)): mostly 0.7 .. 0.95
    w = np.exp(-np.exp(rng.standard_normal((H, T, d)) * 0.5 - 1.5)).astype(np.float32)
    u = randn((H, d), np.float32, seed + 4, scale=0.5)
    s0 = randn((H, d, d), np.float32, seed + 5, scale=0.1)
    return r, k, v, w, u, s0


def ref_wkv6(r, k, v, w, u, s0):
    r, k, v, w, u = (f64(a) for a in (r, k, v, w, u))
    H, T, d = r.shape
    S = f64(s0).copy()
    o = np.zeros((H, T, d))
    for h in range(H):
        for t in range(T):
            kv = np.outer(k[h, t], v[h, t])
            o[h, t] = r[h, t] @ (S[h] + u[h][:, None] * kv)
            S[h] = w[h, t][:, None] * S[h] + kv
    return o, S


@pytest.mark.parametrize("H,T,d,chunk", [(2, 64, 64, 32), (1, 200, 64, 40), (2, 128, 128, 64)])
@pytest.mark.parametrize("form", ["sequential", "chunked_new", "chunked_beta1"])
def test_rwkv6_wkv_matches_numpy(sk, skn, form, H, T, d, chunk):
    args = _wkv_inputs(H, T, d, seed=T + d)
    if form == "sequential":
        o, s = run_clean(skn.rwkv6_wkv_sequential, *args)
    elif form == "chunked_new":
        o, s = run_clean(skn.rwkv6_wkv_chunked, *args, chunk)
    else:
        if chunk > 32 and T % chunk:
            pytest.skip("shape covered by the new dialect")
        o, s = run_clean(sk[0].rwkv6_wkv_chunked, *args, chunk)
    want_o, want_s = ref_wkv6(*args)
    # fp32; the chunked form multiplies exp(c_{t-1}) (< 1) by exp(-c_s) (up to e^~20 over a 64-token chunk): each
    # factor carries ~1 ulp, their product is the decay between s and t to ~2 ulp, so 1e-5 of the largest output holds
    close_to_max(o, want_o, np.float32)
    close_to_max(s, want_s, np.float32)


def test_rwkv6_wkv_structure_and_timing(skn):
    """H = 2, T = 128, d = 64. Sequential: per token 3 matmuls (k^T v, r S, (r u) kv) and 2 PSUM copies plus the
    state update; the chunked form (chunk 32): per chunk 4 matmuls, 5 PE transposes, one scan. Same HBM traffic
    (every input read once). Timing: the sequential form's T dependent steps each wait for the previous state
    update (a matmul, a PSUM copy, another matmul, the VectorE update: ~0.5 us per token), the chunked form does 4
    times fewer, larger steps whose matmuls and VectorE work per chunk cost about one token step each: >= 3x faster."""
    H, T, d, L = 2, 128, 64, 32
    args = _wkv_inputs(H, T, d, seed=11)
    ks, kc = skn.rwkv6_wkv_sequential, skn.rwkv6_wkv_chunked
    run_clean(ks, *args)
    ops = op_counts(ks)
    assert ops["nc_matmul"] == H * T * 3
    assert ops["scalar_tensor_tensor"] == H * T
    assert ops["nc_transpose"] == H * 2                       # r^T and w^T, one 128-token block each
    read_s = _hbm_read(ks)
    t_seq = ks.last_profile.total_time_ns
    run_clean(kc, *args, L)
    ops = op_counts(kc)
    n = H * T // L
    assert ops["nc_matmul"] == n * 4
    assert ops["nc_transpose"] == n * 4
    assert ops["tensor_tensor_scan"] == n
    assert ops["affine_select"] == 1
    want = (4 * H * T * d + H * d + H * d * d) * 4
    assert read_s == want
    # the chunked form reads u once per head broadcast to the chunk's partitions (stride-0: L rows)
    assert _hbm_read(kc) == want - H * d * 4 + H * L * d * 4
    t_chunk = kc.last_profile.total_time_ns
    assert 3 * t_chunk < t_seq, (t_chunk, t_seq)


# --------------------------------------------------------------------------------------------------
# RWKV channel mix (token shift + squared ReLU), both dialects
# --------------------------------------------------------------------------------------------------

def _cmix_inputs(T, D, F, dtype, seed):
    rng = np.random.default_rng(seed)
    x = randn((T, D), dtype, seed)
    st = randn((1, D), dtype, seed + 1)
    mk = rng.random((D, 1)).astype(np.float32)
    mr = rng.random((D, 1)).astype(np.float32)
    wk = randn((D, F), dtype, seed + 2, scale=D ** -0.5)
    wv = randn((F, D), dtype, seed + 3, scale=F ** -0.5)
    wr = randn((D, D), dtype, seed + 4, scale=D ** -0.5)
    return x, st, mk, mr, wk, wv, wr


def ref_cmix(x, st, mk, mr, wk, wv, wr, dtype):
    X = f64(x)
    P = np.concatenate([f64(st), X[:-1]])
    xk = X + (P - X) * f64(mk)[:, 0]
    xr = X + (P - X) * f64(mr)[:, 0]
    if dtype != np.float32:      # the kernels round the mixed inputs (matmul operands) to the model dtype
        xk, xr = f64(xk.astype(dtype)), f64(xr.astype(dtype))
    kk = np.maximum(xk @ f64(wk), 0) ** 2
    if dtype != np.float32:
        kk = f64(kk.astype(dtype))
    return _sig(xr @ f64(wr)) * (kk @ f64(wv))


@pytest.mark.parametrize("dialect", ["beta1", "new"])
@pytest.mark.parametrize("T,F,dtype", [(256, 512, np.float32), (384, 256, BF16)])
def test_rwkv_channel_mix_matches_numpy(sk, skn, dialect, T, F, dtype):
    m = sk[0] if dialect == "beta1" else skn
    D = 128
    args = _cmix_inputs(T, D, F, dtype, seed=T + F)
    out, new_state = run_clean(m.rwkv_channel_mix, *args)
    assert out.dtype == np.dtype(dtype)
    close_to_max(out, ref_cmix(*args, dtype), dtype)
    np.testing.assert_array_equal(new_state.view(np.uint8), args[0][-1:].view(np.uint8))


def test_rwkv_channel_mix_structure(sk, skn):
    """T = 256 (2 token tiles), F = 512 (4 blocks): per tile F/128 key matmuls, F/128 value matmuls accumulating into
    one PSUM tile and one receptance matmul; x is read twice (the tile and its one-token-shifted copy) apart from the
    first tile's shifted rows, which come from the 127 first rows plus the carried state."""
    T, D, F = 256, 128, 512
    args = _cmix_inputs(T, D, F, np.float32, seed=5)
    nt, nf = T // 128, F // 128
    weights = (D * F * 2 + D * D + 2 * D) * 4
    for m in (sk[0], skn):
        k = m.rwkv_channel_mix
        run_clean(k, *args)
        ops = op_counts(k)
        mm = [o for o in executed_ops(k.last_json["body"]) if o["op"] == "nc_matmul"]
        assert len(mm) == nt * (2 * nf + 1), ops
        # x: every tile once, its shifted copy (127 rows + the state row for the first tile), the last row again
        assert _hbm_read(k) == weights + (2 * T * D + 1 * D) * 4, m.__name__


# --------------------------------------------------------------------------------------------------
# Griffin RG-LRU
# --------------------------------------------------------------------------------------------------

def test_griffin_rglru_matches_numpy(skn):
    Ch, L, c = 256, 256, 8.0
    x, ga, gx = (randn((Ch, L), np.float32, s) for s in range(3))
    lam = randn((Ch, 1), np.float32, 3) + 2.0
    h0 = randn((Ch, 1), np.float32, 4)
    h, h_last = run_clean(skn.griffin_rglru, x, ga, gx, lam, h0, c)
    a = _sig(f64(lam)) ** (c * _sig(f64(ga)))
    b = np.sqrt(1 - a * a) * _sig(f64(gx)) * f64(x)
    want = np.zeros((Ch, L))
    hp = f64(h0)[:, 0]
    for t in range(L):
        hp = a[:, t] * hp + b[:, t]
        want[:, t] = hp
    close_to_max(h, want, np.float32)
    close(h_last[:, 0], want[:, -1])
    ops = op_counts(skn.griffin_rglru)
    assert ops["tensor_tensor_scan"] == Ch // 128


# --------------------------------------------------------------------------------------------------
# tensor_tensor_scan semantics the kernels rely on (spec 2.1), new dialect
# --------------------------------------------------------------------------------------------------

def _ref_scan(a, b, f0, f1, init):
    s = np.broadcast_to(f64(init), (a.shape[0],)).copy()
    out = np.zeros(a.shape)
    for t in range(a.shape[1]):
        s = f1(f0(f64(a[:, t]), s), f64(b[:, t]))
        out[:, t] = s
    return out


@pytest.mark.parametrize("case", ["plain", "reverse0", "reverse1", "psum_data1", "bcast_data0", "tile_init",
                                  "psum_init"])
def test_tensor_tensor_scan_operand_forms(skn, case):
    nki, nl, nisa = skn.nki, skn.nl, skn.nisa
    op0, op1 = nl.multiply, nl.add
    f0, f1 = np.multiply, np.add
    if case == "reverse0":
        op0, f0 = nl.subtract, (lambda d, s: s - d)
    if case == "reverse1":
        op1, f1 = nl.subtract, (lambda t, d: d - t)

    @nki.jit
    def scan(a, b):
        P, F = a.shape
        o = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.shared_hbm)
        x = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=x, src=a)
        y = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=y, src=b)
        d0, d1, init = x, y, 0.0
        if case == "psum_data1":
            d1 = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.psum)
            nisa.tensor_copy(dst=d1, src=y)
        if case == "bcast_data0":
            d0 = x[:, 0:1].broadcast(1, F)
        if case in ("tile_init", "psum_init"):
            i0 = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_copy(dst=i0, src=y[:, 0:1])
            init = i0
            if case == "psum_init":
                init = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.psum)
                nisa.tensor_copy(dst=init, src=i0)
        s = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor_scan(dst=s, data0=d0, data1=d1, initial=init, op0=op0, op1=op1,
                                reverse0=(case == "reverse0"), reverse1=(case == "reverse1"))
        nisa.dma_copy(dst=o, src=s)
        return o

    rng = np.random.default_rng(0)
    a = (rng.random((128, 96)) * 0.5 + 0.5).astype(np.float32)
    b = rng.standard_normal((128, 96)).astype(np.float32)
    got = run_clean(scan, a, b)
    aa = np.repeat(a[:, :1], 96, 1) if case == "bcast_data0" else a
    init = b[:, 0] if case in ("tile_init", "psum_init") else 0.0
    close_to_max(got, _ref_scan(aa, b, f0, f1, init), np.float32)


def test_mamba1_short_sbuf_kept_loop_times_as_unrolled(sk):
    """Ch = 128, L = 8192, N = 8 in 4096-column chunks (the timing story's `t_big`): the kept loops' fp32 [128, 4096]
    tiles fill SBUF, so the allocator's fallback leaves most of them one buffer, and which keep a second decides
    what overlaps. The fallback (largest tiles at the peak first, ties in tensor order) chose badly: 693,545.1 ns
    kept against 489,211.4 ns unrolled; the placement search (compiler.placement_search) times a second buffer for
    each one-buffer SBUF loop tile in turn: 531,584.9 ns."""
    m = sk[0]
    args = _mamba_inputs(1, 128, 8192, 8, np.float32, seed=3)
    t = {}
    for loops, ov in (("keep", None), ("unroll", None), ("keep_off", {"compiler.placement_search": 0})):
        kern = m.mamba1_selective_scan.options(timing_only=True, loops="unroll" if loops == "unroll" else "keep",
                                               **({"overrides": ov} if ov else {}))
        t[loops] = kern.simulate(*args, 4096, "sbuf")[1].total_time_ns
    assert t["keep"] < 1.15 * t["unroll"], t
    assert t["keep_off"] > 1.25 * t["keep"], t
