"""The projection kernels around attention written in the style of aws-neuron/nki-library (``nkilib/core/qkv``,
``nkilib/core/output_projection``, the RoPE helpers of ``nkilib/core/attention``): new NKI dialect, module-level
constants, ``nl.NKIObject`` dataclasses with the tiling, ``kernel_assert``-style checks, weights brought into SBUF
k-major (contraction dim on the partitions) through explicit HBM access patterns (``.ap``), K accumulated over
H/128 tiles in PSUM (``nisa.nc_matmul(dst=psum, stationary=, moving=)``), LNC=2 sharding by ``nl.program_id(0)``.

* ``qkv_cte``: fused QKV projection for context encoding. Tiles of 128 tokens (of one batch) x 512 output columns
  (one PSUM bank). The hidden tile is transposed on the PE (``nc_transpose``) or by ``nisa.dma_transpose`` straight
  from HBM. Optional fused RMSNorm: the sum of squares of each token by ``activation_reduce``, gamma applied while
  the transposed hidden is evacuated from PSUM (H is on the partitions there, so gamma is a per-partition scale)
  and 1/rms while the projection is evacuated (tokens on the partitions): ``rmsnorm(x) @ W = rstd * ((x * gamma)
  @ W)``. Output [B, S, (Hq + 2 Hkv) d] or split into q [B, Hq, S, d], k and v [B, Hkv, S, d] by strided stores.
  LNC=2 deals the token tiles to the programs or splits the output columns.
* ``qkv_tkg``: the decode form, B * S <= 128 tokens. The tokens are the stationary operand (M = B * S) and the
  weight streams through as the moving operand in 512-column chunks: the kernel is bound by the weight's HBM
  traffic. LNC=2 splits the weight's columns.
* ``rope``: rotary embedding of q or k in the [B, H, S, d] layout, the tokens on the partitions and all heads of a
  tile in one instruction (cos / sin repeated over the heads by a stride-0 ``.ap``); half-split rotation
  (``x[:d/2]``, ``x[d/2:]``) or interleaved pairs (even / odd lanes by stride-2 ``.ap`` views).
* ``output_projection``: attn [B, S, Hq d] @ w_o [Hq d, H], each token tile of the attention output transposed by
  one 3-D ``dma_transpose`` ([rows, K/128, 128] -> [128, K/128, rows]); LNC=2 splits the H output columns.

Written for nsim's tests from memory of that library's idioms; it is not a copy of any nki-library file.
No nsim imports.
"""
from dataclasses import dataclass

import numpy as np

import nki
import nki.isa as nisa
import nki.language as nl

P_MAX = 128  # partitions; the contraction tile of nc_matmul; the token tile; the stationary free size
PSUM_FMAX = 512  # fp32 elements of one PSUM bank per partition: the output column tile (moving free size)
W_BLOCK = 512  # weight columns per DMA of the decode kernel (1 KiB rows in bf16; one PSUM bank)


def kernel_assert(condition, message):
    if not condition:
        raise AssertionError("[projections] " + message)


def div_ceil(n, d):
    return (n + d - 1) // d


def get_program_sharding_info():
    """(number of programs, this program's id); a launch without a grid is one program."""
    if nl.program_ndim() == 0:
        return 1, 0
    return nl.num_programs(axes=0), nl.program_id(axis=0)


@dataclass
class ProjConfig(nl.NKIObject):
    batch: int
    seq: int
    hidden: int
    out_cols: int  # all output columns of the projection
    num_k_tiles: int  # H / 128
    num_s_tiles: int  # token tiles per batch
    col_start: int  # this program's output columns [col_start, col_end)
    col_end: int
    num_col_chunks: int
    item_start: int  # this program's token tiles: range(item_start, B * num_s_tiles, item_step)
    item_step: int


def make_config(B, S, H, I, n_prgs, prg_id, shard, col_align):
    kernel_assert(H % P_MAX == 0, "hidden={} must be a multiple of {}".format(H, P_MAX))
    kernel_assert(shard in ("tokens", "columns"), "shard must be 'tokens' or 'columns', got {!r}".format(shard))
    col_start, col_end, item_start, item_step = 0, I, 0, 1
    if shard == "columns":
        per_prg = I // n_prgs
        kernel_assert(per_prg * n_prgs == I and per_prg % col_align == 0,
                      "{} output columns do not split into {} shards of whole heads".format(I, n_prgs))
        col_start, col_end = prg_id * per_prg, (prg_id + 1) * per_prg
    else:
        item_start, item_step = prg_id, n_prgs
    return ProjConfig(batch=B, seq=S, hidden=H, out_cols=I, num_k_tiles=H // P_MAX, num_s_tiles=div_ceil(S, P_MAX),
                      col_start=col_start, col_end=col_end, num_col_chunks=div_ceil(col_end - col_start, PSUM_FMAX),
                      item_start=item_start, item_step=item_step)


def load_weight_k_major(w, cfg):
    """w[:, col_start:col_end] [H, n] in HBM -> SBUF [128, H/128, n], w_sb[p, k, j] = w[k * 128 + p, col_start + j]."""
    n, I = cfg.col_end - cfg.col_start, w.shape[1]
    w_sb = nl.ndarray((P_MAX, cfg.num_k_tiles, n), dtype=w.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=w_sb, src=w.ap(pattern=[[I, P_MAX], [P_MAX * I, cfg.num_k_tiles], [1, n]], offset=cfg.col_start))
    return w_sb


def load_gamma_per_partition(gamma, cfg):
    """gamma [H] -> fp32 [128, H/128] with g[p, k] = gamma[k * 128 + p] (the layout of the transposed hidden)."""
    g_raw = nl.ndarray((P_MAX, cfg.num_k_tiles), dtype=gamma.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=g_raw, src=gamma.ap(pattern=[[1, P_MAX], [P_MAX, cfg.num_k_tiles]], offset=0))
    g = nl.ndarray((P_MAX, cfg.num_k_tiles), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=g, src=g_raw)
    return g


def rms_rstd(x_sb, rows, H, eps):
    """[128, 1] fp32: 1 / sqrt(mean(x^2) + eps) of each token (row) of x_sb."""
    sq = nl.ndarray((P_MAX, H), dtype=nl.float32, buffer=nl.sbuf)
    ss = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation_reduce(dst=sq[:rows, :], op=nl.square, data=x_sb[:rows, :], reduce_op=nl.add,
                           reduce_res=ss[:rows, :])
    ms = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=ms[:rows, :], data=ss[:rows, :], op0=nl.multiply, operand0=1.0 / H, op1=nl.add,
                       operand1=eps)
    rstd = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=rstd[:rows, :], op=nl.rsqrt, data=ms[:rows, :])
    return rstd


def hidden_transposed_pe(hidden, b, s0, rows, cfg, gamma_sb, eps):
    """(xT [128, H/128, 128] with xT[p, k, t] = x[t, k * 128 + p] (times gamma[k * 128 + p] when fused), rstd or
    None): the token tile loaded token-major and transposed on the PE, 128 hidden columns at a time."""
    x_sb = nl.ndarray((P_MAX, cfg.hidden), dtype=hidden.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=x_sb[:rows, :], src=hidden[b, nl.ds(s0, rows), :])
    rstd = rms_rstd(x_sb, rows, cfg.hidden, eps) if gamma_sb is not None else None
    xT = nl.ndarray((P_MAX, cfg.num_k_tiles, P_MAX), dtype=hidden.dtype, buffer=nl.sbuf)
    for k in nl.affine_range(cfg.num_k_tiles):
        xT_ps = nl.ndarray((P_MAX, P_MAX), dtype=hidden.dtype, buffer=nl.psum)
        nisa.nc_transpose(dst=xT_ps[:, :rows], data=x_sb[:rows, nl.ds(k * P_MAX, P_MAX)])
        if gamma_sb is not None:
            nisa.activation(dst=xT[:, k, :rows], op=nl.copy, data=xT_ps[:, :rows], scale=gamma_sb[:, k:k + 1])
        else:
            nisa.tensor_copy(dst=xT[:, k, :rows], src=xT_ps[:, :rows])
    return xT, rstd


def hidden_transposed_dma(hidden, b, s0, rows, cfg):
    """xT as above, each 128-column block of the token tile transposed by the DMA on its way from HBM."""
    xT = nl.ndarray((P_MAX, cfg.num_k_tiles, P_MAX), dtype=hidden.dtype, buffer=nl.sbuf)
    for k in nl.affine_range(cfg.num_k_tiles):
        nisa.dma_transpose(dst=xT[:, k, :rows], src=hidden[b, nl.ds(s0, rows), nl.ds(k * P_MAX, P_MAX)])
    return xT


def tokens_transposed_dma(x, b, s0, rows, cfg):
    """xT as above in one 3-D dma_transpose of the whole token tile: [rows, K/128, 128] -> [128, K/128, rows]."""
    xT = nl.ndarray((P_MAX, cfg.num_k_tiles, P_MAX), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_transpose(dst=xT[:, :, :rows], src=x[b, nl.ds(s0, rows), :].reshape((rows, cfg.num_k_tiles, P_MAX)),
                       axes=(2, 1, 0))
    return xT


def store_split_heads(o_sb, rows, b, s0, c0, cw, outs, d_head, seq):
    """Columns [c0, c0 + cw) of the fused projection (in o_sb[:rows, :cw]) into the [B, heads, S, d] tensors: one
    strided store per output tensor the chunk touches. ``outs``: (tensor, first fused column, number of heads)."""
    for t, base, nh in outs:
        lo, hi = max(c0, base), min(c0 + cw, base + nh * d_head)
        if lo < hi:
            h_first, n_heads = (lo - base) // d_head, (hi - lo) // d_head
            dst = t.ap(pattern=[[d_head, rows], [seq * d_head, n_heads], [1, d_head]],
                       offset=((b * nh + h_first) * seq + s0) * d_head)
            nisa.dma_copy(dst=dst, src=o_sb[:rows, nl.ds(lo - c0, hi - lo)])


@nki.jit
def qkv_cte(hidden, w_qkv, gamma=None, eps=1e-6, n_q_heads=None, n_kv_heads=None, d_head=None,
            output_layout="BSD", transpose_on="pe", shard="tokens"):
    """hidden [B, S, H], w_qkv [H, (Hq + 2 Hkv) d] (one dtype), gamma [H] or None (no norm) ->
    out [B, S, (Hq + 2 Hkv) d] (``output_layout="BSD"``) or (q [B, Hq, S, d], k [B, Hkv, S, d], v [B, Hkv, S, d])
    (``"NBSd"``). ``transpose_on``: "pe" or "dma" (no fused norm). ``shard`` (LNC=2): "tokens" or "columns"."""
    kernel_assert(len(hidden.shape) == 3, "hidden must be [B, S, H], got {}".format(hidden.shape))
    B, S, H = hidden.shape
    kernel_assert(w_qkv.shape[0] == H, "w_qkv must be [{}, I], got {}".format(H, w_qkv.shape))
    kernel_assert(w_qkv.dtype == hidden.dtype, "hidden and w_qkv must share a dtype")
    I = w_qkv.shape[1]
    kernel_assert(output_layout in ("BSD", "NBSd"), "output_layout must be BSD or NBSd")
    kernel_assert(transpose_on in ("pe", "dma"), "transpose_on must be 'pe' or 'dma'")
    kernel_assert(gamma is None or transpose_on == "pe", "the fused RMSNorm needs the PE transpose")
    col_align = 1
    if output_layout == "NBSd" or shard == "columns":
        kernel_assert(d_head is not None and n_q_heads is not None and n_kv_heads is not None,
                      "n_q_heads, n_kv_heads and d_head are needed")
        kernel_assert(I == (n_q_heads + 2 * n_kv_heads) * d_head and PSUM_FMAX % d_head == 0,
                      "I={} is not (Hq + 2 Hkv) * d".format(I))
        col_align = d_head
    n_prgs, prg_id = get_program_sharding_info()
    cfg = make_config(B, S, H, I, n_prgs, prg_id, shard, col_align)

    if output_layout == "BSD":
        out = nl.ndarray((B, S, I), dtype=hidden.dtype, buffer=nl.shared_hbm)
    else:
        q = nl.ndarray((B, n_q_heads, S, d_head), dtype=hidden.dtype, buffer=nl.shared_hbm)
        k = nl.ndarray((B, n_kv_heads, S, d_head), dtype=hidden.dtype, buffer=nl.shared_hbm)
        v = nl.ndarray((B, n_kv_heads, S, d_head), dtype=hidden.dtype, buffer=nl.shared_hbm)
        outs = ((q, 0, n_q_heads), (k, n_q_heads * d_head, n_kv_heads), (v, (n_q_heads + n_kv_heads) * d_head,
                                                                           n_kv_heads))

    w_sb = load_weight_k_major(w_qkv, cfg)
    gamma_sb = load_gamma_per_partition(gamma, cfg) if gamma is not None else None

    for item in nl.affine_range(cfg.item_start, B * cfg.num_s_tiles, cfg.item_step):
        b, st = item // cfg.num_s_tiles, item % cfg.num_s_tiles
        s0 = st * P_MAX
        rows = min(P_MAX, S - s0)
        if transpose_on == "pe":
            xT, rstd = hidden_transposed_pe(hidden, b, s0, rows, cfg, gamma_sb, eps)
        else:
            xT, rstd = hidden_transposed_dma(hidden, b, s0, rows, cfg), None
        for c in nl.affine_range(cfg.num_col_chunks):
            c0 = cfg.col_start + c * PSUM_FMAX
            cw = min(PSUM_FMAX, cfg.col_end - c0)
            ps = nl.ndarray((P_MAX, PSUM_FMAX), dtype=nl.float32, buffer=nl.psum)
            for kt in nl.affine_range(cfg.num_k_tiles):
                nisa.nc_matmul(dst=ps[:rows, :cw], stationary=xT[:, kt, :rows],
                               moving=w_sb[:, kt, nl.ds(c * PSUM_FMAX, cw)])
            o_sb = nl.ndarray((P_MAX, PSUM_FMAX), dtype=hidden.dtype, buffer=nl.sbuf)
            if rstd is not None:
                nisa.activation(dst=o_sb[:rows, :cw], op=nl.copy, data=ps[:rows, :cw], scale=rstd[:rows, :])
            else:
                nisa.tensor_copy(dst=o_sb[:rows, :cw], src=ps[:rows, :cw])
            if output_layout == "BSD":
                nisa.dma_copy(dst=out[b, nl.ds(s0, rows), nl.ds(c0, cw)], src=o_sb[:rows, :cw])
            else:
                store_split_heads(o_sb, rows, b, s0, c0, cw, outs, d_head, S)
    if output_layout == "BSD":
        return out
    return q, k, v


@nki.jit
def qkv_tkg(hidden, w_qkv):
    """Decode QKV projection: hidden [B, S, H] with B * S <= 128, w_qkv [H, I] -> out [B, S, I]. The tokens
    (transposed, H on the partitions) are the stationary operand; the weight streams through as the moving operand,
    one [H, W_BLOCK] block per DMA, into PSUM-bank-sized chunks of 512 columns (one per block at W_BLOCK = 512: a
    new block's DMA overlaps the previous block's matmuls). LNC=2: each program streams half the columns."""
    B, S, H = hidden.shape
    T = B * S
    I = w_qkv.shape[1]
    kernel_assert(T <= P_MAX, "qkv_tkg takes at most {} tokens, got {}".format(P_MAX, T))
    kernel_assert(H % P_MAX == 0 and w_qkv.shape[0] == H, "w_qkv must be [H, I] with H a multiple of 128")
    n_prgs, prg_id = get_program_sharding_info()
    per_prg = div_ceil(I, n_prgs)
    c_start, c_end = min(I, prg_id * per_prg), min(I, (prg_id + 1) * per_prg)
    KT = H // P_MAX

    out = nl.ndarray((B, S, I), dtype=hidden.dtype, buffer=nl.shared_hbm)
    out_2d = out.reshape((T, I))
    # xT[p, k, t] = x[t, k * 128 + p]: the tokens loaded token-major (contiguous rows) and transposed on the PE
    x_sb = nl.ndarray((T, H), dtype=hidden.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=x_sb, src=hidden.reshape((T, H)))
    xT = nl.ndarray((P_MAX, KT, T), dtype=hidden.dtype, buffer=nl.sbuf)
    for k in nl.affine_range(KT):
        xT_ps = nl.ndarray((P_MAX, T), dtype=hidden.dtype, buffer=nl.psum)
        nisa.nc_transpose(dst=xT_ps, data=x_sb[:, nl.ds(k * P_MAX, P_MAX)])
        nisa.tensor_copy(dst=xT[:, k, :], src=xT_ps)
    for blk in nl.affine_range(div_ceil(c_end - c_start, W_BLOCK)):
        b0 = c_start + blk * W_BLOCK
        bw = min(W_BLOCK, c_end - b0)
        w_sb = nl.ndarray((P_MAX, KT, W_BLOCK), dtype=w_qkv.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=w_sb[:, :, :bw], src=w_qkv.ap(pattern=[[I, P_MAX], [P_MAX * I, KT], [1, bw]], offset=b0))
        o_sb = nl.ndarray((T, W_BLOCK), dtype=hidden.dtype, buffer=nl.sbuf)
        for c in nl.affine_range(div_ceil(bw, PSUM_FMAX)):
            cw = min(PSUM_FMAX, bw - c * PSUM_FMAX)
            cols = nl.ds(c * PSUM_FMAX, cw)
            ps = nl.ndarray((T, PSUM_FMAX), dtype=nl.float32, buffer=nl.psum)
            for k in nl.affine_range(KT):
                nisa.nc_matmul(dst=ps[:, :cw], stationary=xT[:, k, :], moving=w_sb[:, k, cols])
            nisa.tensor_copy(dst=o_sb[:, cols], src=ps[:, :cw])
        nisa.dma_copy(dst=out_2d[:, nl.ds(b0, bw)], src=o_sb[:, :bw])
    return out


@nki.jit
def rope(x, cos, sin, interleaved=False):
    """Rotary embedding: x [B, H, S, d] (q or k), cos, sin [S, d/2] -> [B, H, S, d] in x's dtype.
    Half-split: (x1, x2) = (x[..., :d/2], x[..., d/2:]); interleaved: (x[..., 0::2], x[..., 1::2]);
    out1 = x1 cos - x2 sin, out2 = x2 cos + x1 sin, written back where x1 and x2 came from.
    LNC=2 deals the (batch, 128-token tile) items round-robin."""
    B, NH, S, d = x.shape
    half = d // 2
    kernel_assert(d % 2 == 0 and tuple(cos.shape) == (S, half) and tuple(sin.shape) == (S, half),
                  "cos/sin must be [{}, {}], got {} {}".format(S, half, cos.shape, sin.shape))
    n_prgs, prg_id = get_program_sharding_info()
    n_st = div_ceil(S, P_MAX)
    out = nl.ndarray((B, NH, S, d), dtype=x.dtype, buffer=nl.shared_hbm)

    for item in nl.affine_range(prg_id, B * n_st, n_prgs):
        b, st = item // n_st, item % n_st
        s0 = st * P_MAX
        rows = min(P_MAX, S - s0)
        # x_sb[t, h, :] = x[b, h, s0 + t, :]: all heads of the token tile in one DMA
        hbm_tile = [[d, rows], [S * d, NH], [1, d]]
        hbm_off = (b * NH * S + s0) * d
        x_sb = nl.ndarray((P_MAX, NH, d), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=x_sb[:rows, :, :], src=x.ap(pattern=hbm_tile, offset=hbm_off))
        cos_sb = nl.ndarray((P_MAX, half), dtype=cos.dtype, buffer=nl.sbuf)
        sin_sb = nl.ndarray((P_MAX, half), dtype=sin.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=cos_sb[:rows, :], src=cos[nl.ds(s0, rows), :])
        nisa.dma_copy(dst=sin_sb[:rows, :], src=sin[nl.ds(s0, rows), :])
        # [rows, NH, half] views repeating cos / sin over the heads (step 0)
        cos_b = cos_sb.ap(pattern=[[half, rows], [0, NH], [1, half]], offset=0)
        sin_b = sin_sb.ap(pattern=[[half, rows], [0, NH], [1, half]], offset=0)
        o_sb = nl.ndarray((P_MAX, NH, d), dtype=x.dtype, buffer=nl.sbuf)
        if interleaved:
            x1 = x_sb.ap(pattern=[[NH * d, rows], [d, NH], [2, half]], offset=0)
            x2 = x_sb.ap(pattern=[[NH * d, rows], [d, NH], [2, half]], offset=1)
            o1 = o_sb.ap(pattern=[[NH * d, rows], [d, NH], [2, half]], offset=0)
            o2 = o_sb.ap(pattern=[[NH * d, rows], [d, NH], [2, half]], offset=1)
        else:
            x1, x2 = x_sb[:rows, :, 0:half], x_sb[:rows, :, half:d]
            o1, o2 = o_sb[:rows, :, 0:half], o_sb[:rows, :, half:d]
        ta = nl.ndarray((P_MAX, NH, half), dtype=nl.float32, buffer=nl.sbuf)
        tb = nl.ndarray((P_MAX, NH, half), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=ta[:rows], data1=x1, data2=cos_b, op=nl.multiply)
        nisa.tensor_tensor(dst=tb[:rows], data1=x2, data2=sin_b, op=nl.multiply)
        nisa.tensor_tensor(dst=o1, data1=ta[:rows], data2=tb[:rows], op=nl.subtract)
        nisa.tensor_tensor(dst=ta[:rows], data1=x2, data2=cos_b, op=nl.multiply)
        nisa.tensor_tensor(dst=tb[:rows], data1=x1, data2=sin_b, op=nl.multiply)
        nisa.tensor_tensor(dst=o2, data1=ta[:rows], data2=tb[:rows], op=nl.add)
        nisa.dma_copy(dst=out.ap(pattern=hbm_tile, offset=hbm_off), src=o_sb[:rows, :, :])
    return out


@nki.jit
def output_projection(attn, w_o):
    """attn [B, S, K] (K = Hq * d), w_o [K, H] -> out [B, S, H]. Token tiles of 128 transposed by one DMA each
    (K on the partitions), 512-column PSUM chunks, K accumulated over K/128 tiles. LNC=2: each program computes
    half of the H output columns (and loads only that half of w_o)."""
    B, S, K = attn.shape
    kernel_assert(K % P_MAX == 0 and w_o.shape[0] == K, "w_o must be [{}, H], got {}".format(K, w_o.shape))
    H = w_o.shape[1]
    n_prgs, prg_id = get_program_sharding_info()
    cfg = make_config(B, S, K, H, n_prgs, prg_id, "columns", 1)
    out = nl.ndarray((B, S, H), dtype=attn.dtype, buffer=nl.shared_hbm)
    w_sb = load_weight_k_major(w_o, cfg)
    for b in nl.affine_range(B):
        for st in nl.affine_range(cfg.num_s_tiles):
            s0 = st * P_MAX
            rows = min(P_MAX, S - s0)
            aT = tokens_transposed_dma(attn, b, s0, rows, cfg)
            for c in nl.affine_range(cfg.num_col_chunks):
                c0 = cfg.col_start + c * PSUM_FMAX
                cw = min(PSUM_FMAX, cfg.col_end - c0)
                ps = nl.ndarray((P_MAX, PSUM_FMAX), dtype=nl.float32, buffer=nl.psum)
                for kt in nl.affine_range(cfg.num_k_tiles):
                    nisa.nc_matmul(dst=ps[:rows, :cw], stationary=aT[:, kt, :rows],
                                   moving=w_sb[:, kt, nl.ds(c * PSUM_FMAX, cw)])
                o_sb = nl.ndarray((P_MAX, PSUM_FMAX), dtype=attn.dtype, buffer=nl.sbuf)
                nisa.tensor_copy(dst=o_sb[:rows, :cw], src=ps[:rows, :cw])
                nisa.dma_copy(dst=out[b, nl.ds(s0, rows), nl.ds(c0, cw)], src=o_sb[:rows, :cw])
    return out
