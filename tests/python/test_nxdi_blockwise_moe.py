"""NxDI's blockwise MoE matmul for context encoding (tests/python/kernels/nxdi_blockwise_moe.py, Beta-1
dialect, unmodified, through ``nsim.compat``): top-2 routing built here, tokens sorted by expert into blocks of
128 with -1 padding; per block an indirect gather of the hidden rows, gate/up + SiLU * up + down with the
block's expert weights (gathered by computed row ids from ``iota`` or an ``nl.shared_constant`` table, by a
runtime expert index ``gate_up[e_tile[0, 0], ...]``, or split over an SPMD grid) and an ``nl.atomic_rmw``
scatter-add. Outputs against a float64 numpy MoE, the
DMA / matmul counts of the tiling, padding that does not change the output, and no sanitizer report.

Also the nsim fix this family needed: an HBM subscript whose first item is a one-element tile and whose
partition axis comes from another item (``gate_up[e_tile[0, 0], k * 128 + i_p, i_f]``) is a runtime index on
the first dim broadcast over the partitions (numpy semantics, spec §3.8), not a one-partition row gather."""
import collections
import warnings

import numpy as np
import pytest

from conftest import executed_ops, require_core, sample_fixture  # noqa: E402
from conftest import op_counts as _ops  # noqa: E402

_core, ml_dtypes = require_core()
from numeric_helpers import close, f64 as _f64, randn as _randn  # noqa: E402

BF16 = ml_dtypes.bfloat16
B = 128

bw = sample_fixture("nxdi_blockwise_moe.py")


def _problem(T=100, H=256, I=128, E=4, top_k=2, seed=0, dtype=np.float32, multiple=1, extra_pad_blocks=0):
    """(hidden [T + 1, H], affinities [T + 1, E], gate_up [E, H, 2I], down [E, I, H], token_position_to_id,
    block_to_expert): top-k softmax routing, tokens sorted by expert into blocks of B (-1 padding), row T zero."""
    rng = np.random.default_rng(seed)
    hidden = _randn((T, H), dtype, seed=seed)
    logits = rng.standard_normal((T, E))
    top = np.argsort(-logits, 1)[:, :top_k]
    aff = np.zeros((T, E))
    for t in range(T):
        w = np.exp(logits[t, top[t]])
        aff[t, top[t]] = w / w.sum()
    gate_up = _randn((E, H, 2 * I), dtype, seed=seed + 1, scale=1 / np.sqrt(H))
    down = _randn((E, I, H), dtype, seed=seed + 2, scale=1 / np.sqrt(I))
    pos, b2e = [], []
    for e in range(E):
        toks = [t for t in range(T) if e in top[t]]
        for j in range(0, len(toks), B):
            blk = toks[j:j + B]
            pos += blk + [-1] * (B - len(blk))
            b2e.append(e)
    for j in range(extra_pad_blocks):
        pos += [-1] * B
        b2e.append(j % E)
    while len(b2e) % multiple:
        pos += [-1] * B
        b2e.append(0)
    hidden1 = np.concatenate([hidden, np.zeros((1, H), dtype)])
    aff1 = np.concatenate([aff, np.zeros((1, E))]).astype(dtype)
    return hidden1, aff1, gate_up, down, np.array(pos, np.int32), np.array(b2e, np.int32)


def ref_moe(hidden, aff, gate_up, down):
    """float64 dense MoE: sum_e aff[:, e] * (silu(x Wg_e) * (x Wu_e)) Wd_e."""
    h, a, g, d = _f64(hidden), _f64(aff), _f64(gate_up), _f64(down)
    I = d.shape[1]
    out = np.zeros_like(h)
    for e in range(g.shape[0]):
        z = h @ g[e]
        out += a[:, e:e + 1] * ((z[:, :I] / (1 + np.exp(-z[:, :I])) * z[:, I:]) @ d[e])
    return out


def _run(mod, name, args, grid=None):
    k = getattr(mod, name)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the sanitizer (check=True) reports nothing: W501/W504/W506 included
        out = (k[grid] if grid is not None else k)(*args)
    return k, out


@pytest.mark.parametrize("name", ["blockwise_mm", "blockwise_mm_dynamic_expert", "blockwise_mm_const_rows"])
@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_blockwise_mm_matches_numpy(bw, name, dtype):
    mod = bw[0]
    args = _problem(dtype=dtype, seed=3)
    _, out = _run(mod, name, args)
    T = args[0].shape[0] - 1
    assert out.shape == args[0].shape and out.dtype == np.dtype(dtype)
    close(out[:T], ref_moe(*args[:4])[:T], dtype)


@pytest.mark.parametrize("grid", ["2", "nc2"])
def test_blockwise_mm_spmd_matches_numpy(bw, grid):
    mod, _, nl = bw[:3]
    args = _problem(dtype=BF16, seed=5, multiple=2)
    g = 2 if grid == "2" else nl.nc(2)
    _, out = _run(mod, "blockwise_mm_spmd", args, grid=g)
    T = args[0].shape[0] - 1
    close(out[:T], ref_moe(*args[:4])[:T], BF16)
    # the same as one program (the same tiles, the same per-row add order within an expert)
    _, single = _run(mod, "blockwise_mm", args)
    close(out[:T], single[:T], BF16)


def test_blockwise_mm_structure(bw):
    """H = 256, I = 128: per block one gather of hidden rows, one scatter-add, one affinity gather, the
    token ids and the expert id, 2 + 1 weight tile loads; 2 gate/up + 1 down matmuls (+ 1 for the partition
    broadcast of the expert id) and 2 + 1 PE transposes."""
    mod = bw[0]
    args = _problem(seed=1)
    k, _ = _run(mod, "blockwise_mm", args)
    n = len(args[5])
    ops = executed_ops(k.last_json["body"])
    dmas = [o for o in ops if o["op"] == "dma_copy"]
    hbm = lambda o, side: o[side]["tensor"] if isinstance(o.get(side), dict) else None  # noqa: E731
    src = collections.Counter(hbm(o, "src") for o in dmas)
    assert src["hidden"] == n and src["expert_affinities"] == n, src
    assert src["token_position_to_id"] == n and src["block_to_expert"] == n, src
    assert src["gate_up"] == 2 * n and src["down"] == n, src
    scatters = [o for o in dmas if hbm(o, "dst") == "out" and "accumulate" in o.get("flags", ())]
    assert len(scatters) == n and all("indirect_dst" in o["flags"] for o in scatters)
    gathers = [o for o in dmas if hbm(o, "src") == "hidden"]
    assert all("offsets" in o for o in gathers)
    c = _ops(k)
    assert c["nc_matmul"] == 4 * n and c["nc_transpose"] == 3 * n, c


def test_padding_does_not_change_output(bw):
    """Extra all-padding blocks (-1 ids, any expert) leave the real rows unchanged bit for bit: padding reads
    the zero row T, whose affinity is 0, and adds only into row T (which stays 0)."""
    mod = bw[0]
    args = _problem(seed=7)
    padded = _problem(seed=7, extra_pad_blocks=3)
    T = args[0].shape[0] - 1
    _, a = _run(mod, "blockwise_mm", args)
    _, b = _run(mod, "blockwise_mm", padded)
    np.testing.assert_array_equal(a[:T], b[:T])
    np.testing.assert_array_equal(b[T], 0)
    # an expert's rows matter: moving every block to expert 0 changes the result
    moved = args[:5] + (np.zeros_like(args[5]),)
    _, c = _run(mod, "blockwise_mm", moved)
    assert not np.allclose(a[:T], c[:T])


def test_runtime_expert_index_on_hbm_first_dim(bw):
    """The fix: ``w[e_tile[0, 0], i_p, i_f]`` with a (1, 1) SBUF expert id selects w[e] (P rows), not one row
    gathered for a single partition (which raised 'dst has 12 elements, src has 3' or read the wrong rows)."""
    _, nki, nl, _ = bw

    @nki.jit
    def pick(w, e):
      E, P, F = w.shape
      o = nl.ndarray((P, F), dtype=w.dtype, buffer=nl.shared_hbm)
      et = nl.load(e.reshape((1, 1))[nl.ds(0, 1), :])
      ip = nl.arange(P)[:, None]
      i_f = nl.arange(F)[None, :]
      nl.store(o[ip, i_f], nl.load(w[et[0, 0], ip, i_f]))
      return o

    w = np.arange(4 * 4 * 3, dtype=np.float32).reshape(4, 4, 3)
    for e in (0, 2, 3):
        np.testing.assert_array_equal(pick(w, np.array([e], np.int32)), w[e])


def test_expert_id_of_a_1d_id_load(bw):
    """``e_tile = nl.load(block_to_expert[b + nl.arange(1)[:, None]])`` of a 1-D tensor is a (1,) tile in nsim
    (the (P, 1) tile of NKI, docs/debugging.md): ``e_tile[0, 0]`` addresses its element (was E424)."""
    _, nki, nl, _ = bw

    @nki.jit
    def pick(w, block_to_expert, b):
      E, P, F = w.shape
      o = nl.ndarray((P, F), dtype=w.dtype, buffer=nl.shared_hbm)
      e_tile = nl.load(block_to_expert[b + nl.arange(1)[:, None]])
      ip = nl.arange(P)[:, None]
      i_f = nl.arange(F)[None, :]
      nl.store(o[ip, i_f], nl.load(w[e_tile[0, 0], ip, i_f]))
      return o

    w = np.arange(4 * 4 * 3, dtype=np.float32).reshape(4, 4, 3)
    ids = np.array([3, 0, 2], np.int32)
    for b in range(3):
        np.testing.assert_array_equal(pick(w, ids, b), w[ids[b]])


def test_shared_constant_row_table_replaces_iota(bw):
    """The row offsets from the ``nl.shared_constant`` table: no iota, one table load per block, and the same
    output bit for bit as the iota form."""
    mod = bw[0]
    args = _problem(seed=9, dtype=BF16)
    k0, a = _run(mod, "blockwise_mm", args)
    n0 = _ops(k0)
    k1, b = _run(mod, "blockwise_mm_const_rows", args)
    n1 = _ops(k1)
    np.testing.assert_array_equal(_f64(a), _f64(b))
    assert n0["iota"] == len(args[5]) and n1["iota"] == 0, (n0, n1)
    assert n1["dma_copy"] == n0["dma_copy"] + len(args[5]), (n0, n1)
