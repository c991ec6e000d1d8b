"""An RMSNorm context-encoding kernel written in the style of the aws-neuron/nki-library kernels
(``nkilib/core/rmsnorm``): new NKI dialect, module-level constants, a small ``nl.NKIObject`` dataclass holding
the tiling, helper sub-functions, ``kernel_assert``-style checks, the gamma vector broadcast onto every
partition by a stride-0 HBM access pattern, the sum of squares accumulated across hidden-dim tiles in the
ScalarE accumulator registers (``reduce_cmd``), and the rows sharded over the programs of an LNC=2 launch by
``nl.program_id(0)``.

Written for nsim's tests from memory of that library's idioms; it is not a copy of any nki-library file.
No nsim imports: it runs with ``import nki`` resolved by nsim's compat layer or by the nki-library test
harness (``nki.cpu_simulate(kernel)[lnc](**kwargs)`` with ``nki_cpu_simulator`` aliased to ``nki``).

    out[b, s, :] = hidden[b, s, :] / sqrt(mean(hidden[b, s, :] ** 2) + eps) * gamma

``rmsnorm_quant_cte`` adds the per-row absmax fp8 quantization (``float8_e4m3`` values and a float32 scale per
row) that RMSNorm + quantize kernels feed to an fp8 matmul. ``rmsnorm_tkg`` is the decode form (at most 128
tokens): under LNC=2 it splits the hidden dim between the programs, which exchange their partial sums of
squares with ``nisa.sendrecv``.
"""
from dataclasses import dataclass

import numpy as np

import nki
import nki.isa as nisa
import nki.language as nl

# Hardware constants (as nki-library keeps them at module level).
P_MAX = 128  # partitions per tile
H_TILE_MAX = 512  # hidden-dim elements processed per ScalarE instruction (one PSUM bank / bn_stats_fmax)
FP8_E4M3_MAX = 240.0  # largest float8_e4m3 value the gen2/gen3 kernels quantize to
MIN_ABSMAX = 1e-6  # floor of a row's absmax, so an all-zero row gets a finite scale


def kernel_assert(condition, message):
    """nki-library's kernel_assert: an assert whose message reaches the user."""
    if not condition:
        raise AssertionError("[rmsnorm_cte] " + message)


def div_ceil(n, d):
    return (n + d - 1) // d


def get_program_sharding_info():
    """(grid ndim, number of programs, this program's id); a launch without a grid is one program."""
    grid_ndim = nl.program_ndim()
    n_prgs = nl.num_programs(axes=0) if grid_ndim != 0 else 1
    prg_id = nl.program_id(axis=0) if grid_ndim != 0 else 0
    return grid_ndim, n_prgs, prg_id


@dataclass
class RMSNormCTEConfig(nl.NKIObject):
    """Tiling of one RMSNorm launch: rows = B * S flattened tokens, split evenly over the programs."""
    num_rows: int
    hidden: int
    h_tile: int
    num_h_tiles: int
    rows_per_prg: int
    row_start: int
    row_end: int
    num_row_tiles: int


def build_config(num_rows, hidden, n_prgs, prg_id):
    h_tile = min(hidden, H_TILE_MAX)
    kernel_assert(hidden % h_tile == 0, "hidden={} must be a multiple of {}".format(hidden, h_tile))
    rows_per_prg = div_ceil(num_rows, n_prgs)
    row_start = min(prg_id * rows_per_prg, num_rows)
    row_end = min(row_start + rows_per_prg, num_rows)
    return RMSNormCTEConfig(num_rows=num_rows, hidden=hidden, h_tile=h_tile, num_h_tiles=hidden // h_tile,
                            rows_per_prg=rows_per_prg, row_start=row_start, row_end=row_end,
                            num_row_tiles=div_ceil(row_end - row_start, P_MAX))


def load_gamma_broadcast(gamma, cfg):
    """gamma [H] in HBM -> [P_MAX, H] fp32 in SBUF, every partition a copy (partition step 0)."""
    gamma_sb = nl.ndarray((P_MAX, cfg.hidden), dtype=gamma.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=gamma_sb, src=gamma.ap(pattern=[[0, P_MAX], [1, cfg.hidden]], offset=0))
    gamma_f32 = nl.ndarray((P_MAX, cfg.hidden), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=gamma_f32, src=gamma_sb)
    return gamma_f32


def compute_rstd(x_sb, rows, cfg, eps_sb):
    """rstd[p] = 1 / sqrt(sum_h x[p, h]^2 / H + eps), the sum accumulated over hidden tiles in the ScalarE
    registers: the first tile resets them, the others reduce into them."""
    sq_junk = nl.ndarray((P_MAX, cfg.h_tile), dtype=nl.float32, buffer=nl.sbuf)
    sum_sq = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    for h in nl.sequential_range(cfg.num_h_tiles):
        nisa.activation(dst=sq_junk[:rows, :], op=nl.square,
                        data=x_sb[:rows, nl.ds(h * cfg.h_tile, cfg.h_tile)],
                        reduce_op=nl.add, reduce_res=sum_sq[:rows, :],
                        reduce_cmd=nisa.reduce_cmd.reset_reduce if h == 0 else nisa.reduce_cmd.reduce)
    rstd = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=rstd[:rows, :], op=nl.rsqrt, data=sum_sq[:rows, :], scale=1.0 / cfg.hidden,
                    bias=eps_sb[:rows, :])
    return rstd


@nki.jit
def rmsnorm_cte(hidden, gamma, eps=1e-6):
    """hidden [B, S, H] (bf16 or fp32), gamma [H] -> out [B, S, H] in hidden's dtype."""
    kernel_assert(len(hidden.shape) == 3, "hidden must be [B, S, H], got {}".format(hidden.shape))
    B, S, H = hidden.shape
    kernel_assert(tuple(gamma.shape) == (H,), "gamma must be [{}], got {}".format(H, gamma.shape))
    _, n_prgs, prg_id = get_program_sharding_info()
    kernel_assert(n_prgs in (1, 2), "rmsnorm_cte supports LNC 1 or 2, got {}".format(n_prgs))
    cfg = build_config(B * S, H, n_prgs, prg_id)

    out = nl.ndarray(hidden.shape, dtype=hidden.dtype, buffer=nl.shared_hbm)
    hidden_2d = hidden.reshape((cfg.num_rows, H))
    out_2d = out.reshape((cfg.num_rows, H))

    gamma_sb = load_gamma_broadcast(gamma, cfg)
    eps_sb = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=eps_sb, value=eps)

    for t in nl.affine_range(cfg.num_row_tiles):
        r0 = cfg.row_start + t * P_MAX
        rows = min(P_MAX, cfg.row_end - r0)
        x_sb = nl.ndarray((P_MAX, H), dtype=hidden.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=x_sb[:rows, :], src=hidden_2d[nl.ds(r0, rows), :], dge_mode=nisa.dge_mode.hwdge)
        rstd = compute_rstd(x_sb, rows, cfg, eps_sb)
        y_sb = nl.ndarray((P_MAX, H), dtype=hidden.dtype, buffer=nl.sbuf)
        for h in nl.affine_range(cfg.num_h_tiles):
            hs = nl.ds(h * cfg.h_tile, cfg.h_tile)
            # y = (x * rstd) * gamma in one VectorE instruction
            nisa.scalar_tensor_tensor(dst=y_sb[:rows, hs], data=x_sb[:rows, hs], op0=nl.multiply, operand0=rstd[:rows, :],
                                      op1=nl.multiply, operand1=gamma_sb[:rows, hs])
        nisa.dma_copy(dst=out_2d[nl.ds(r0, rows), :], src=y_sb[:rows, :])
    return out


@nki.jit
def rmsnorm_quant_cte(hidden, gamma, eps=1e-6):
    """RMSNorm then per-row fp8 quantization: hidden [B, S, H], gamma [H] -> (out [B, S, H] float8_e4m3,
    scales [B, S, 1] float32) with out * scales ~= rmsnorm(hidden) * gamma (absmax scaling to FP8_E4M3_MAX)."""
    kernel_assert(len(hidden.shape) == 3, "hidden must be [B, S, H], got {}".format(hidden.shape))
    B, S, H = hidden.shape
    kernel_assert(tuple(gamma.shape) == (H,), "gamma must be [{}], got {}".format(H, gamma.shape))
    _, n_prgs, prg_id = get_program_sharding_info()
    cfg = build_config(B * S, H, n_prgs, prg_id)

    out = nl.ndarray((B, S, H), dtype=nl.float8_e4m3, buffer=nl.shared_hbm)
    scales = nl.ndarray((B, S, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    hidden_2d = hidden.reshape((cfg.num_rows, H))
    out_2d = out.reshape((cfg.num_rows, H))
    scales_2d = scales.reshape((cfg.num_rows, 1))

    gamma_sb = load_gamma_broadcast(gamma, cfg)
    eps_sb = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=eps_sb, value=eps)

    for t in nl.affine_range(cfg.num_row_tiles):
        r0 = cfg.row_start + t * P_MAX
        rows = min(P_MAX, cfg.row_end - r0)
        x_sb = nl.ndarray((P_MAX, H), dtype=hidden.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=x_sb[:rows, :], src=hidden_2d[nl.ds(r0, rows), :])
        rstd = compute_rstd(x_sb, rows, cfg, eps_sb)
        y_sb = nl.ndarray((P_MAX, H), dtype=nl.float32, buffer=nl.sbuf)
        nisa.scalar_tensor_tensor(dst=y_sb[:rows, :], data=x_sb[:rows, :], op0=nl.multiply, operand0=rstd[:rows, :],
                                  op1=nl.multiply, operand1=gamma_sb[:rows, :])
        # absmax of each row on VectorE (|y| and its running max in one instruction)
        abs_junk = nl.ndarray((P_MAX, H), dtype=nl.float32, buffer=nl.sbuf)
        absmax = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar_reduce(dst=abs_junk[:rows, :], data=y_sb[:rows, :], op0=nl.abs, operand0=None,
                                  reduce_op=nl.maximum, reduce_res=absmax[:rows, :])
        # scale = max(absmax, MIN_ABSMAX) / FP8_E4M3_MAX; q = y / scale
        scale = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=scale[:rows, :], data=absmax[:rows, :], op0=nl.maximum, operand0=MIN_ABSMAX,
                           op1=nl.multiply, operand1=1.0 / FP8_E4M3_MAX)
        inv_scale = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.reciprocal(dst=inv_scale[:rows, :], data=scale[:rows, :])
        q_sb = nl.ndarray((P_MAX, H), dtype=nl.float8_e4m3, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=q_sb[:rows, :], data=y_sb[:rows, :], op0=nl.multiply, operand0=inv_scale[:rows, :])
        nisa.dma_copy(dst=out_2d[nl.ds(r0, rows), :], src=q_sb[:rows, :])
        nisa.dma_copy(dst=scales_2d[nl.ds(r0, rows), :], src=scale[:rows, :])
    return out, scales


@nki.jit
def rmsnorm_tkg(hidden, gamma, eps=1e-6):
    """Token-generation RMSNorm: hidden [B, S, H] with B * S <= 128 tokens on the partitions. Under LNC=2 the
    hidden dim is split between the two programs; each computes the sum of squares of its half and the two
    exchange them with ``nisa.sendrecv`` before normalising their own columns."""
    B, S, H = hidden.shape
    T = B * S
    kernel_assert(T <= P_MAX, "rmsnorm_tkg takes at most {} tokens, got {}".format(P_MAX, T))
    kernel_assert(tuple(gamma.shape) == (H,), "gamma must be [{}], got {}".format(H, gamma.shape))
    _, n_prgs, prg_id = get_program_sharding_info()
    kernel_assert(H % (n_prgs * H_TILE_MAX) == 0 or H // n_prgs <= H_TILE_MAX,
                  "H={} does not split into {} shards of whole tiles".format(H, n_prgs))
    H_shard = H // n_prgs
    h0 = prg_id * H_shard
    cfg = RMSNormCTEConfig(num_rows=T, hidden=H_shard, h_tile=min(H_shard, H_TILE_MAX),
                           num_h_tiles=div_ceil(H_shard, H_TILE_MAX), rows_per_prg=T, row_start=0, row_end=T,
                           num_row_tiles=1)

    out = nl.ndarray((B, S, H), dtype=hidden.dtype, buffer=nl.shared_hbm)
    x_sb = nl.ndarray((T, H_shard), dtype=hidden.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=x_sb, src=hidden.reshape((T, H))[:, nl.ds(h0, H_shard)])
    gamma_sb = nl.ndarray((T, H_shard), dtype=gamma.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=gamma_sb, src=gamma.ap(pattern=[[0, T], [1, H_shard]], offset=h0))

    sq_junk = nl.ndarray((T, cfg.h_tile), dtype=nl.float32, buffer=nl.sbuf)
    sum_sq = nl.ndarray((T, 1), dtype=nl.float32, buffer=nl.sbuf)
    for h in nl.sequential_range(cfg.num_h_tiles):
        nisa.activation(dst=sq_junk, op=nl.square, data=x_sb[:, nl.ds(h * cfg.h_tile, cfg.h_tile)],
                        reduce_op=nl.add, reduce_res=sum_sq,
                        reduce_cmd=nisa.reduce_cmd.reset_reduce if h == 0 else nisa.reduce_cmd.reduce)
    if n_prgs > 1:
        peer = 1 - prg_id
        peer_sum = nl.ndarray((T, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.sendrecv(src=sum_sq, dst=peer_sum, send_to_rank=peer, recv_from_rank=peer, pipe_id=0)
        nisa.tensor_tensor(dst=sum_sq, data1=sum_sq, data2=peer_sum, op=nl.add)
    rstd = nl.ndarray((T, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=rstd, op=nl.rsqrt, data=sum_sq, scale=1.0 / H, bias=eps)
    y_sb = nl.ndarray((T, H_shard), dtype=hidden.dtype, buffer=nl.sbuf)
    nisa.scalar_tensor_tensor(dst=y_sb, data=x_sb, op0=nl.multiply, operand0=rstd, op1=nl.multiply,
                              operand1=gamma_sb)
    nisa.dma_copy(dst=out.reshape((T, H))[:, nl.ds(h0, H_shard)], src=y_sb)
    return out


def reference(hidden, gamma, eps=1e-6):
    """numpy RMSNorm in float64, rounded to hidden's dtype."""
    h = np.asarray(hidden, np.float64)
    rstd = 1.0 / np.sqrt((h * h).mean(axis=-1, keepdims=True) + eps)
    return (h * rstd * np.asarray(gamma, np.float64)).astype(hidden.dtype)


def reference_quant(hidden, gamma, eps=1e-6):
    """(q as float8_e4m3, scales [B, S, 1] float32) of numpy's RMSNorm, the scale computed in float32."""
    y = reference(hidden.astype(np.float32), gamma.astype(np.float32), eps).astype(np.float32)
    scale = np.maximum(np.abs(y).max(axis=-1, keepdims=True), np.float32(MIN_ABSMAX)) * np.float32(1.0 / FP8_E4M3_MAX)
    q = (y.astype(np.float64) / scale).astype(nl.float8_e4m3)
    return q, scale.astype(np.float32)
