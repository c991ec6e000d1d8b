"""DeepSeek-style MLA decode (absorbed form) and speculative-decoding tree attention
(tests/python/kernels/mla_tree_attention_kernels.py; new dialect, LNC=2 by ``nl.program_id(0)``) run unchanged:
outputs against float64 numpy, the matmul/transposes counts their tilings imply, the LNC=2 flash-decoding split
(partial max/sum/out through a shared HBM scratch and ``nisa.core_barrier``), the tree mask applied four ways
(``tensor_copy_predicated``, ``select_reduce``, ``nl.where``, ``affine_select`` for a causal chain), and one timing
fact: MLA decode cannot beat its latent cache's bytes over the HBM bandwidth of nsim's config, and LNC=2 is
faster."""
import collections

import numpy as np
import pytest

from conftest import executed_ops, op_counts, require_core, sample_fixture  # noqa: E402

_core, ml_dtypes = require_core()
from numeric_helpers import close, randn  # noqa: E402
from numeric_helpers import f64 as _f64  # noqa: E402

import nsim.plot  # noqa: E402

BF16 = ml_dtypes.bfloat16
DC, DR = 512, 64
SCALE = 1.0 / np.sqrt(128 + 64)  # DeepSeek: softmax over (nope 128 + rope 64)-dim query/key heads

mt = sample_fixture("mla_tree_attention_kernels.py", module_only=True)


def _ops(kernel):
    """Executed op counts summed over the programs of an LNC=2 run (``op_counts`` for LNC=1)."""
    j = kernel.last_json
    if "core_programs" not in j:
        return op_counts(kernel)
    c = collections.Counter()
    for prog in j["core_programs"]:
        c.update(o["op"] for o in executed_ops(prog["body"]))
    return c


def _mla_inputs(B, H, S, seed=0):
    rng = np.random.default_rng(seed)
    qn = (rng.standard_normal((B, H, DC)) * 0.06).astype(BF16)
    qr = (rng.standard_normal((B, H, DR)) * 0.2).astype(BF16)
    c = rng.standard_normal((B, S, DC)).astype(BF16)
    kr = rng.standard_normal((B, S, DR)).astype(BF16)
    return qn, qr, c, kr


def mla_matmuls(B, S):
    """Per (sequence, 512-key block): 4 latent K-tiles (512 / 128) + 1 rope matmul into the scores' PSUM tile, and
    4 P.c_kv matmuls (512 keys / 128) into the output's; the key blocks are split over the programs, so the total
    does not depend on LNC."""
    return B * (S // 512) * (DC // 128 + 1 + 512 // 128)


def mla_transposes(B, S):
    """Per block: c_kv^T is 4 key tiles x 4 latent K-tiles of 128 x 128 PE transposes, k_rope^T 4, P^T 4."""
    return B * (S // 512) * (4 * 4 + 4 + 4)


@pytest.mark.parametrize("B,H,S,lnc", [(1, 16, 1024, 1), (2, 128, 512, 1), (2, 32, 2048, 2), (1, 128, 1024, 2)])
def test_mla_decode_matches_numpy(mt, B, H, S, lnc):
    qn, qr, c, kr = _mla_inputs(B, H, S, seed=H + S)
    out = mt.mla_decode[lnc](qn, qr, c, kr, SCALE)
    assert out.shape == (B, H, DC) and out.dtype == BF16
    close(out, mt.mla_reference(qn, qr, c, kr, SCALE), BF16)
    ops = _ops(mt.mla_decode)
    assert ops["nc_matmul"] == mla_matmuls(B, S)
    assert ops["nc_transpose"] == mla_transposes(B, S)
    assert ops["core_barrier"] == (2 if lnc == 2 else 0)  # one per program


def test_mla_decode_online_softmax_needs_the_rescale(mt):
    """Scores whose max moves between blocks (a spike in the second block): the first block's partial sums must
    be rescaled by exp(m_old - m_new); a kernel that skipped it would be off by far more than bf16."""
    qn, qr, c, kr = _mla_inputs(1, 16, 1024, seed=3)
    c[0, 700] = (np.asarray(qn[0, 0], np.float32) * 40).astype(BF16)
    out = mt.mla_decode(qn, qr, c, kr, SCALE)
    ref = mt.mla_reference(qn, qr, c, kr, SCALE)
    close(out, ref, BF16)
    out2 = mt.mla_decode[2](qn, qr, c, kr, SCALE)  # the spike is only in program 1's half
    close(out2, ref, BF16)


def test_mla_decode_is_hbm_bound_and_lnc2_faster(mt):
    """An 8192-key cache (8 MiB latent + 1 MiB rope, bf16), 64 heads: each byte of the cache is read once (plus the
    queries; under LNC=2 each program also reads both programs' partials for its half of the heads: 2 x 2 x 32 x
    (512 + 2) fp32), the time cannot beat the cache's bytes over nsim's HBM bandwidth (``nsim.plot.memory_roof``),
    and two cores, each streaming half of the key blocks, finish in well under the single-core time."""
    B, H, S = 1, 64, 8192
    qn, qr, c, kr = _mla_inputs(B, H, S, seed=5)
    cache = c.nbytes + kr.nbytes
    o1 = mt.mla_decode[1](qn, qr, c, kr, SCALE)
    p1 = mt.mla_decode.last_profile
    roof_ns = cache / nsim.plot.memory_roof(p1.config, p1.overrides) * 1e9
    assert p1.stat("memory.hbm_read_bytes") == cache + qn.nbytes + qr.nbytes
    assert p1.total_time_ns >= roof_ns, (p1.total_time_ns, roof_ns)
    o2 = mt.mla_decode[2](qn, qr, c, kr, SCALE)
    p2 = mt.mla_decode.last_profile
    assert p2.stat("memory.hbm_read_bytes") == cache + 2 * (qn.nbytes + qr.nbytes) + 2 * 2 * (H // 2) * (DC + 2) * 4
    assert max(p2.core_times_ns) >= roof_ns / 2
    assert p2.total_time_ns < 0.75 * p1.total_time_ns, (p1.total_time_ns, p2.total_time_ns)
    close(o2, _f64(o1), BF16)


# --------------------------------------------------------------------------------------------------
# tree attention
# --------------------------------------------------------------------------------------------------

def _tree_mask(T, seed, dtype=np.uint8):
    """A random draft tree (node i's parent < i): i may attend to itself and its ancestors."""
    rng = np.random.default_rng(seed)
    parent = [-1] + [int(rng.integers(0, i)) for i in range(1, T)]
    m = np.zeros((T, T), dtype)
    for i in range(T):
        j = i
        while j >= 0:
            m[i, j] = 1
            j = parent[j]
    return m


def _tree_inputs(Hq, Hkv, T, S, D, dtype, seed=0):
    return (randn((Hq, T, D), dtype, seed), randn((Hkv, S, D), dtype, seed + 1), randn((Hkv, S, D), dtype, seed + 2),
            randn((Hkv, T, D), dtype, seed + 3), randn((Hkv, T, D), dtype, seed + 4))


def tree_matmuls(Hq, S):
    """Per query head: S / 512 score chunks (one PSUM bank each) + 1 draft-vs-draft tile, S / 128 P.V tiles + 1."""
    return Hq * (max(S // 512, 1) + 1 + S // 128 + 1)


@pytest.mark.parametrize("mode", ["predicated", "select_reduce", "where"])
@pytest.mark.parametrize("Hq,Hkv,T,S,D,dtype,mdt,lnc", [
    (4, 2, 8, 256, 64, BF16, np.uint8, 1),
    (8, 2, 128, 512, 128, BF16, np.uint8, 2),
    (2, 1, 37, 1024, 64, np.float32, np.int32, 1),
])
def test_tree_attention_matches_numpy(mt, mode, Hq, Hkv, T, S, D, dtype, mdt, lnc):
    q, kc, vc, kn, vn = _tree_inputs(Hq, Hkv, T, S, D, dtype, seed=T + S)
    mask = _tree_mask(T, seed=T, dtype=mdt)
    out = mt.tree_attention[lnc](q, kc, vc, kn, vn, mask, mask_mode=mode)
    assert out.shape == (Hq, T, D) and out.dtype == dtype
    ref = mt.tree_reference(q, kc, vc, kn, vn, mask)
    close(out, ref, dtype)
    # the mask matters: attending to every draft would give a different answer
    assert not np.allclose(_f64(out), mt.tree_reference(q, kc, vc, kn, vn, np.ones_like(mask)), atol=1e-2)
    assert _ops(mt.tree_attention)["nc_matmul"] == tree_matmuls(Hq, S)


def test_tree_attention_causal_chain_with_affine_select(mt):
    """A chain of drafts (each the child of the previous) is the causal mask: ``affine_select`` on the iota
    p - j >= 0 gives the tree mask's answer without reading it."""
    Hq, Hkv, T, S, D = 4, 1, 16, 512, 64
    q, kc, vc, kn, vn = _tree_inputs(Hq, Hkv, T, S, D, BF16, seed=9)
    chain = np.tril(np.ones((T, T), np.uint8))
    out = mt.tree_attention(q, kc, vc, kn, vn, chain, mask_mode="causal")
    close(out, mt.tree_reference(q, kc, vc, kn, vn, chain), BF16)
    assert _ops(mt.tree_attention)["affine_select"] == Hq
    pred = mt.tree_attention(q, kc, vc, kn, vn, chain, mask_mode="predicated")
    close(pred, _f64(out), BF16)
