"""A gated-MLP context-encoding kernel (SwiGLU: ``down(silu(x @ W_gate) * (x @ W_up))``) written in the style of
the aws-neuron/nki-library kernels (``nkilib/core/mlp``): new NKI dialect, module-level constants, a
``nl.NKIObject`` dataclass with the tiling, helper sub-functions, ``kernel_assert``-style checks, weights
brought into SBUF with one DMA each through an explicit access pattern (``.ap``) that puts the contraction
dim on the partitions, the token tile transposed on the PE (``nisa.nc_transpose``), the gate and up
projections accumulated over hidden-dim tiles in PSUM (``nisa.nc_matmul(dst=psum, stationary=, moving=)``),
SiLU on ScalarE straight out of PSUM, and the down projection accumulated over the intermediate tiles. The
tokens are sharded over the programs of an LNC=2 launch by ``nl.program_id(0)``.

Written for nsim's tests from memory of that library's idioms; it is not a copy of any nki-library file.
No nsim imports.

    out[b, s, :] = (silu(x @ gate_w) * (x @ up_w)) @ down_w,   x = hidden[b, s, :]
"""
from dataclasses import dataclass

import numpy as np

import nki
import nki.isa as nisa
import nki.language as nl

P_MAX = 128  # partitions; also the contraction tile of nc_matmul and the stationary free size
PSUM_FMAX = 512  # fp32 elements of one PSUM bank per partition = the largest moving free size (gen2/gen3)


def kernel_assert(condition, message):
    if not condition:
        raise AssertionError("[mlp_cte] " + message)


def div_ceil(n, d):
    return (n + d - 1) // d


@dataclass
class MLPTileConfig(nl.NKIObject):
    hidden: int
    intermediate: int
    num_h_tiles: int  # contraction tiles of the gate/up projections (H / 128)
    num_i_tiles: int  # contraction tiles of the down projection (I / 128)
    out_chunk: int  # output columns per PSUM bank
    num_out_chunks: int
    num_tokens: int
    tok_start: int
    tok_end: int


def make_tile_config(num_tokens, hidden, intermediate):
    kernel_assert(hidden % P_MAX == 0, "hidden={} must be a multiple of {}".format(hidden, P_MAX))
    kernel_assert(intermediate % P_MAX == 0, "intermediate={} must be a multiple of {}".format(intermediate, P_MAX))
    n_prgs = nl.num_programs(axes=0) if nl.program_ndim() != 0 else 1
    prg_id = nl.program_id(axis=0) if nl.program_ndim() != 0 else 0
    per_prg = div_ceil(num_tokens, n_prgs)
    tok_start = min(num_tokens, prg_id * per_prg)
    out_chunk = min(hidden, PSUM_FMAX)
    kernel_assert(hidden % out_chunk == 0, "hidden={} must be a multiple of {}".format(hidden, out_chunk))
    return MLPTileConfig(hidden=hidden, intermediate=intermediate, num_h_tiles=hidden // P_MAX,
                         num_i_tiles=intermediate // P_MAX, out_chunk=out_chunk,
                         num_out_chunks=hidden // out_chunk, num_tokens=num_tokens, tok_start=tok_start,
                         tok_end=min(num_tokens, tok_start + per_prg))


def load_weight_k_major(w, num_k_tiles, n):
    """w [K, N] in HBM -> SBUF [128, K/128, N] with w_sb[p, k, :] = w[k * 128 + p, :] (one DMA)."""
    w_sb = nl.ndarray((P_MAX, num_k_tiles, n), dtype=w.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=w_sb, src=w.ap(pattern=[[n, P_MAX], [P_MAX * n, num_k_tiles], [1, n]], offset=0))
    return w_sb


def transpose_tokens(x_sb, rows, cfg):
    """x_sb [tokens, H] -> xT [128 (h within tile), H/128, tokens] through PSUM."""
    xT = nl.ndarray((P_MAX, cfg.num_h_tiles, P_MAX), dtype=x_sb.dtype, buffer=nl.sbuf)
    for k in nl.affine_range(cfg.num_h_tiles):
        xT_ps = nl.ndarray((P_MAX, P_MAX), dtype=x_sb.dtype, buffer=nl.psum)
        nisa.nc_transpose(dst=xT_ps[:, :rows], data=x_sb[:rows, nl.ds(k * P_MAX, P_MAX)])
        nisa.tensor_copy(dst=xT[:, k, :rows], src=xT_ps[:, :rows])
    return xT


def gate_up_projection(xT, rows, gate_sb, up_sb, cfg):
    """hT [128 (i within tile), I/128, tokens] = silu(gate)^T * up^T, K-accumulated in PSUM."""
    hT = nl.ndarray((P_MAX, cfg.num_i_tiles, P_MAX), dtype=xT.dtype, buffer=nl.sbuf)
    for i in nl.affine_range(cfg.num_i_tiles):
        gate_ps = nl.ndarray((P_MAX, P_MAX), dtype=nl.float32, buffer=nl.psum)
        up_ps = nl.ndarray((P_MAX, P_MAX), dtype=nl.float32, buffer=nl.psum)
        for k in nl.affine_range(cfg.num_h_tiles):
            nisa.nc_matmul(dst=gate_ps[:, :rows], stationary=gate_sb[:, k, nl.ds(i * P_MAX, P_MAX)],
                           moving=xT[:, k, :rows])
            nisa.nc_matmul(dst=up_ps[:, :rows], stationary=up_sb[:, k, nl.ds(i * P_MAX, P_MAX)],
                           moving=xT[:, k, :rows])
        gate_act = nl.ndarray((P_MAX, P_MAX), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=gate_act[:, :rows], op=nl.silu, data=gate_ps[:, :rows])
        nisa.tensor_tensor(dst=hT[:, i, :rows], data1=gate_act[:, :rows], data2=up_ps[:, :rows], op=nl.multiply)
    return hT


def down_projection(hT, rows, down_sb, out_dtype, cfg):
    """y [tokens, H] = h @ down_w, accumulated over the intermediate tiles, one PSUM bank per output chunk."""
    y = nl.ndarray((P_MAX, cfg.hidden), dtype=out_dtype, buffer=nl.sbuf)
    for c in nl.affine_range(cfg.num_out_chunks):
        cols = nl.ds(c * cfg.out_chunk, cfg.out_chunk)
        out_ps = nl.ndarray((P_MAX, cfg.out_chunk), dtype=nl.float32, buffer=nl.psum)
        for i in nl.affine_range(cfg.num_i_tiles):
            nisa.nc_matmul(dst=out_ps[:rows, :], stationary=hT[:, i, :rows], moving=down_sb[:, i, cols])
        nisa.tensor_copy(dst=y[:rows, cols], src=out_ps[:rows, :])
    return y


@nki.jit
def mlp_cte(hidden, gate_w, up_w, down_w):
    """hidden [B, S, H]; gate_w, up_w [H, I]; down_w [I, H]; all one dtype (bf16 or fp32) -> out [B, S, H]."""
    B, S, H = hidden.shape
    kernel_assert(tuple(gate_w.shape) == tuple(up_w.shape) and gate_w.shape[0] == H,
                  "gate_w/up_w must be [H, I], got {} and {}".format(gate_w.shape, up_w.shape))
    I = gate_w.shape[1]
    kernel_assert(tuple(down_w.shape) == (I, H), "down_w must be [{}, {}], got {}".format(I, H, down_w.shape))
    kernel_assert(gate_w.dtype == hidden.dtype and down_w.dtype == hidden.dtype, "one dtype for all operands")
    cfg = make_tile_config(B * S, H, I)

    out = nl.ndarray((B, S, H), dtype=hidden.dtype, buffer=nl.shared_hbm)
    x_2d = hidden.reshape((B * S, H))
    out_2d = out.reshape((B * S, H))

    gate_sb = load_weight_k_major(gate_w, cfg.num_h_tiles, I)
    up_sb = load_weight_k_major(up_w, cfg.num_h_tiles, I)
    down_sb = load_weight_k_major(down_w, cfg.num_i_tiles, H)

    for t in nl.affine_range(div_ceil(cfg.tok_end - cfg.tok_start, P_MAX)):
        t0 = cfg.tok_start + t * P_MAX
        rows = min(P_MAX, cfg.tok_end - t0)
        x_sb = nl.ndarray((P_MAX, H), dtype=hidden.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=x_sb[:rows, :], src=x_2d[t0:t0 + rows, :])
        xT = transpose_tokens(x_sb, rows, cfg)
        hT = gate_up_projection(xT, rows, gate_sb, up_sb, cfg)
        y = down_projection(hT, rows, down_sb, hidden.dtype, cfg)
        nisa.dma_copy(dst=out_2d[t0:t0 + rows, :], src=y[:rows, :])
    return out


def reference(hidden, gate_w, up_w, down_w):
    """numpy in float64 with the kernel's one intermediate rounding (h stored in hidden's dtype)."""
    x = np.asarray(hidden, np.float64)
    g = x @ np.asarray(gate_w, np.float64)
    u = x @ np.asarray(up_w, np.float64)
    h = (g / (1.0 + np.exp(-g)) * u).astype(hidden.dtype).astype(np.float64)
    return (h @ np.asarray(down_w, np.float64)).astype(hidden.dtype)
