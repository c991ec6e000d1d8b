"""NxDI-style blockwise MoE matmul for context encoding (Beta-1 dialect), written the way
neuronx-distributed's blockwise kernels are: tokens sorted by expert into blocks of ``block_size`` rows
(``token_position_to_id`` [N * B] int32, -1 = padding; ``block_to_expert`` [N] int32). Per block: gather the
block's hidden rows by token id (indirect DMA), gate/up projection, SiLU(gate) * up, down projection with
the block's expert weights (selected by a runtime expert id), scale by the routing affinity and scatter-add
into the output rows (``nl.atomic_rmw``).

Convention (NxDI's): ``hidden`` / ``expert_affinities`` carry one extra all-zero row T (so [T + 1, H] and
[T + 1, E]); padding positions (-1) are redirected to that row, whose affinity is 0, and the output has
T + 1 rows too (row T is scratch)."""
import numpy as np

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl


def _zero_output(out, T1, H, pid=0):
  ip = nl.arange(128)[:, None]
  ih = nl.arange(H)[None, :]
  zero = nl.zeros((128, H), dtype=out.dtype)
  for t in nl.affine_range((T1 + 127) // 128):
    nl.store(out[t * 128 + ip, ih], value=zero, mask=(t * 128 + ip < T1) & (pid == 0))


def _block_token_ids(token_position_to_id, b, B, T1):
  """The block's token ids as a [B, 1] int32 tile, padding (-1) redirected to the zero row T1 - 1."""
  ip = nl.arange(B)[:, None]
  ids = nl.load(token_position_to_id[b * B + ip])
  is_pad = nl.less(ids, 0, dtype=nl.int32)
  return nl.add(ids, nl.multiply(is_pad, T1, dtype=nl.int32), dtype=nl.int32)


def _block_affinity(expert_affinities, ids, e_b, B, E):
  """affinity[token, expert] per row: a gather from the flattened [(T + 1) * E, 1] affinities."""
  aff_flat = expert_affinities.reshape(((expert_affinities.shape[0]) * E, 1))
  flat_idx = nl.add(nl.multiply(ids, E, dtype=nl.int32), e_b, dtype=nl.int32)
  i0 = nl.arange(1)[None, :]
  return nl.load(aff_flat[flat_idx, i0], dtype=nl.float32)


def _expert_mlp(x, gu_w, dn_w, B, H, I):
  """x [B, H] (tokens on partitions) -> SiLU(x @ Wg) * (x @ Wu) @ Wd, [B, H] fp32 in SBUF.
  gu_w: [128, H // 128, 2I] (H on partitions), dn_w: [128, I // 128, H]."""
  HT = H // 128
  IT = I // 128
  xT = nl.ndarray((HT, nl.par_dim(128), B), dtype=x.dtype, buffer=nl.sbuf)
  for k in nl.static_range(HT):
    xT[k] = nisa.nc_transpose(x[:, nl.ds(k * 128, 128)])
  gu_ps = nl.zeros((nl.par_dim(B), 2 * I), dtype=nl.float32, buffer=nl.psum)
  for k in nl.static_range(HT):
    gu_ps += nisa.nc_matmul(xT[k], gu_w[:, k, :])
  gate = nl.silu(gu_ps[:, nl.ds(0, I)], dtype=nl.float32)
  act = nl.multiply(gate, gu_ps[:, nl.ds(I, I)], dtype=x.dtype)
  actT = nl.ndarray((IT, nl.par_dim(128), B), dtype=x.dtype, buffer=nl.sbuf)
  for k in nl.static_range(IT):
    actT[k] = nisa.nc_transpose(act[:, nl.ds(k * 128, 128)])
  dn_ps = nl.zeros((nl.par_dim(B), H), dtype=nl.float32, buffer=nl.psum)
  for k in nl.static_range(IT):
    dn_ps += nisa.nc_matmul(actT[k], dn_w[:, k, :])
  return dn_ps


def _load_weights_by_rows(gate_up, down, e_b, H, I, row_table=None):
  """The expert's weights gathered row-wise: gate_up viewed [E * H, 2I], rows e * H + k * 128 + p (p from
  nisa.iota, or from a constant [128, 1] row table in HBM)."""
  E = gate_up.shape[0]
  HT = H // 128
  IT = I // 128
  gu_flat = gate_up.reshape((E * H, 2 * I))
  dn_flat = down.reshape((E * I, H))
  ip = nl.arange(128)[:, None]
  i2i = nl.arange(2 * I)[None, :]
  ih = nl.arange(H)[None, :]
  if row_table is None:
    base = nisa.iota(ip, dtype=nl.int32)
  else:
    base = nl.load(row_table)
  e128 = nl.multiply(e_b[nl.ds(0, 128), :], 1, dtype=nl.int32)
  gu_w = nl.ndarray((nl.par_dim(128), HT, 2 * I), dtype=gate_up.dtype, buffer=nl.sbuf)
  for k in nl.static_range(HT):
    rows = nl.add(nl.multiply(e128, H, dtype=nl.int32), base + k * 128, dtype=nl.int32)
    gu_w[:, k, :] = nl.load(gu_flat[rows, i2i])
  dn_w = nl.ndarray((nl.par_dim(128), IT, H), dtype=down.dtype, buffer=nl.sbuf)
  for k in nl.static_range(IT):
    rows = nl.add(nl.multiply(e128, I, dtype=nl.int32), base + k * 128, dtype=nl.int32)
    dn_w[:, k, :] = nl.load(dn_flat[rows, ih])
  return gu_w, dn_w


def _load_weights_dynamic(gate_up, down, e_tile, H, I):
  """The expert's weights with the expert id (a [1, 1] SBUF tile) as a runtime index on the expert dim."""
  HT = H // 128
  IT = I // 128
  ip = nl.arange(128)[:, None]
  i2i = nl.arange(2 * I)[None, :]
  ih = nl.arange(H)[None, :]
  gu_w = nl.ndarray((nl.par_dim(128), HT, 2 * I), dtype=gate_up.dtype, buffer=nl.sbuf)
  for k in nl.static_range(HT):
    gu_w[:, k, :] = nl.load(gate_up[e_tile[0, 0], k * 128 + ip, i2i])
  dn_w = nl.ndarray((nl.par_dim(128), IT, H), dtype=down.dtype, buffer=nl.sbuf)
  for k in nl.static_range(IT):
    dn_w[:, k, :] = nl.load(down[e_tile[0, 0], k * 128 + ip, ih])
  return gu_w, dn_w


def _one_block(b, out, hidden, expert_affinities, gate_up, down, token_position_to_id, block_to_expert, B,
               dynamic_weights, row_table=None):
  T1, H = hidden.shape
  E, _, I2 = gate_up.shape
  I = I2 // 2
  ip = nl.arange(B)[:, None]
  ih = nl.arange(H)[None, :]
  # the block's expert id, on every partition
  e_tile = nl.load(block_to_expert.reshape((block_to_expert.shape[0], 1))[nl.ds(b, 1), :])
  e_b = e_tile.broadcast_to((max(B, 128), 1))
  ids = _block_token_ids(token_position_to_id, b, B, T1)
  # gather the block's tokens
  x = nl.load(hidden[ids, ih])
  aff = _block_affinity(expert_affinities, ids, e_b[nl.ds(0, B), :], B, E)
  if dynamic_weights:
    gu_w, dn_w = _load_weights_dynamic(gate_up, down, e_tile, H, I)
  else:
    gu_w, dn_w = _load_weights_by_rows(gate_up, down, e_b, H, I, row_table)
  y = _expert_mlp(x, gu_w, dn_w, B, H, I)
  res = nl.multiply(y, aff, dtype=out.dtype)
  # scatter-add into the tokens' output rows (padding rows land in the scratch row T)
  nl.atomic_rmw(out[ids, ih], value=res, op=np.add)


@nki.jit
def blockwise_mm(hidden, expert_affinities, gate_up, down, token_position_to_id, block_to_expert,
                 block_size=128):
  T1, H = hidden.shape
  N = block_to_expert.shape[0]
  out = nl.ndarray((T1, H), dtype=hidden.dtype, buffer=nl.shared_hbm)
  _zero_output(out, T1, H)
  # blocks of one expert share no token, but blocks of different experts do (top-k): sequential
  for b in nl.sequential_range(N):
    _one_block(b, out, hidden, expert_affinities, gate_up, down, token_position_to_id, block_to_expert,
               block_size, False)
  return out


@nki.jit
def blockwise_mm_dynamic_expert(hidden, expert_affinities, gate_up, down, token_position_to_id, block_to_expert,
                                block_size=128):
  T1, H = hidden.shape
  N = block_to_expert.shape[0]
  out = nl.ndarray((T1, H), dtype=hidden.dtype, buffer=nl.shared_hbm)
  _zero_output(out, T1, H)
  for b in nl.sequential_range(N):
    _one_block(b, out, hidden, expert_affinities, gate_up, down, token_position_to_id, block_to_expert,
               block_size, True)
  return out


@nki.jit
def blockwise_mm_const_rows(hidden, expert_affinities, gate_up, down, token_position_to_id, block_to_expert,
                            block_size=128):
  """blockwise_mm with the per-partition row offsets of the weight gathers from an ``nl.shared_constant`` table."""
  T1, H = hidden.shape
  N = block_to_expert.shape[0]
  row_table = nl.shared_constant(np.arange(128, dtype=np.int32).reshape(128, 1), dtype=nl.int32)
  out = nl.ndarray((T1, H), dtype=hidden.dtype, buffer=nl.shared_hbm)
  _zero_output(out, T1, H)
  for b in nl.sequential_range(N):
    _one_block(b, out, hidden, expert_affinities, gate_up, down, token_position_to_id, block_to_expert,
               block_size, False, row_table)
  return out


@nki.jit
def blockwise_mm_spmd(hidden, expert_affinities, gate_up, down, token_position_to_id, block_to_expert,
                      block_size=128):
  """Blocks split across the programs of a 1-D grid (program p takes blocks p, p + n, ...; N a multiple of
  the grid size); program 0 zeroes the shared output first (instances run in grid order)."""
  T1, H = hidden.shape
  N = block_to_expert.shape[0]
  pid = nl.program_id(0)
  n_prog = nl.num_programs(0)
  out = nl.ndarray((T1, H), dtype=hidden.dtype, buffer=nl.shared_hbm)
  _zero_output(out, T1, H, pid)
  for j in nl.sequential_range(N // n_prog):
    _one_block(j * n_prog + pid, out, hidden, expert_affinities, gate_up, down, token_position_to_id,
               block_to_expert, block_size, False)
  return out
