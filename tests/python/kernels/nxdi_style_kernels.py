"""Llama decoder-layer kernels in the style of aws-neuron/neuronx-distributed-inference (NxDI, the NKI kernels of
its ``modules/``) and of the NKI Llama workshop/contest repository (aws-neuron/nki-llama), in the Beta-1 dialect
those repositories use (``import neuronxcc.nki as nki``, ``@nki.jit``, 2-space indentation as in the NKI samples
they start from):

- ``nki_rope_kernel(x, cos, sin)``: rotary position embedding (the HF half-split ``rotate_half`` form) of one
  tensor of shape [seq, d] or [batch, heads, seq, d]; seq tiled over the 128 partitions, ragged last tile masked.
- ``nki_apply_rotary_pos_emb(q, k, cos, sin)``: the same for q and k at once (NxDI ``apply_rotary_pos_emb``),
  cos/sin [batch, seq, d] (the position-gathered caches), GQA (fewer k heads), tile operators, fp32 compute.
- ``nki_fused_add_rmsnorm_kernel(hidden, residual, g, eps)``: nki-llama's ``nki_rmsnorm_kernel`` fused with the
  residual add: ``residual_out = hidden + residual`` (stored), ``out = RMSNorm(residual_out) * g``.
- ``nki_fused_add_rmsnorm_isa_kernel(hidden, residual, g, eps)``: the same on [tokens, H] with the ISA calls
  NxDI's kernels use (``nisa.activation_reduce`` sum of squares, ``nisa.activation`` rsqrt with scale and bias,
  ``nisa.tensor_scalar``), the weight loaded as [1, H] and broadcast by a multiply.
- ``nki_swiglu_fully_optimized_(xT, w_gate, w_up, ...)``: nki-llama's ``nki_matmul_fully_optimized_`` (blocked
  128 x 512 tiles, PSUM accumulation over K with ``+=`` into SBUF block results) run for the gate and the up
  projection, fused with ``silu(gate) * up`` when the result blocks are copied out.
- ``nki_gate_up_swiglu_tiled_(xT, w_gate_up)``: ``nki_matmul_tiled_`` with ``nl.matmul(transpose_x=True)`` over
  NxDI's fused gate_up weight [K, 2I], ``nl.silu(gate) * up`` from PSUM.
- ``nki_flash_decode_kernel[grid](q, k_cache, v_cache)``: token-generation attention, one query token per head
  against a KV cache of length S, SPMD over heads (``nl.program_id(0)``), 128-key blocks with online softmax
  (running max and sum), ragged last block masked by ``nisa.affine_select``, GQA.
- ``nki_gqa_token_gen_attention[grid](q, k_cache, v_cache, cache_len)``: the same with one program per kv head,
  the query heads of its group on the partitions (``nl.load_transpose2d``, ``nl.matmul``, ``nl.transpose``),
  over a padded cache of which the first ``cache_len`` positions are valid.

Written from memory of those repositories and in their authors' style; not copies of their files. No nsim
imports.
"""
import math

import numpy as np

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl
from neuronxcc.nki.language import par_dim

PMAX = 128


# ------------------------------------------------------------------------------------------------
# Rotary position embedding
# ------------------------------------------------------------------------------------------------

@nki.jit
def nki_rope_kernel(x_tensor, cos_tensor, sin_tensor):
  """
  out = x * cos + rotate_half(x) * sin, with rotate_half(x) = cat(-x2, x1),
  x1 = x[..., :d/2], x2 = x[..., d/2:].

  x_tensor: [seq_len, d_head] or [batch, n_heads, seq_len, d_head]
  cos_tensor, sin_tensor: [seq_len, d_head] (cat(freqs, freqs) as HF builds them)
  """
  out_tensor = nl.ndarray(x_tensor.shape, dtype=x_tensor.dtype,
                          buffer=nl.shared_hbm)

  seq_len, d_head = x_tensor.shape[-2], x_tensor.shape[-1]
  assert d_head % 2 == 0, "head dim must be even"
  assert cos_tensor.shape == [seq_len, d_head]
  assert sin_tensor.shape == [seq_len, d_head]
  half = d_head // 2

  # every (batch, head) is one [seq_len, d_head] matrix
  n_mats = 1
  for s in x_tensor.shape[:-2]:
    n_mats *= s
  x_mats = x_tensor.reshape((n_mats, seq_len, d_head))
  out_mats = out_tensor.reshape((n_mats, seq_len, d_head))

  ix = nl.arange(PMAX)[:, None]
  iy = nl.arange(d_head)[None, :]

  for i in nl.affine_range(math.ceil(seq_len / PMAX)):
    # cos/sin rows of this tile of positions, reused by every head
    cos_tile = nl.load(cos_tensor[i * PMAX + ix, iy], mask=(i * PMAX + ix < seq_len))
    sin_tile = nl.load(sin_tensor[i * PMAX + ix, iy], mask=(i * PMAX + ix < seq_len))

    for m in nl.affine_range(n_mats):
      x_tile = nl.load(x_mats[m, i * PMAX + ix, iy], mask=(i * PMAX + ix < seq_len))
      x1 = x_tile[:, 0:half]
      x2 = x_tile[:, half:d_head]

      out_tile = nl.ndarray((PMAX, d_head), dtype=x_tensor.dtype, buffer=nl.sbuf)
      # first half: x1 * cos - x2 * sin
      out_tile[:, 0:half] = nl.subtract(
          nl.multiply(x1, cos_tile[:, 0:half], mask=(i * PMAX + ix < seq_len)),
          nl.multiply(x2, sin_tile[:, 0:half], mask=(i * PMAX + ix < seq_len)),
          mask=(i * PMAX + ix < seq_len))
      # second half: x2 * cos + x1 * sin
      out_tile[:, half:d_head] = nl.add(
          nl.multiply(x2, cos_tile[:, half:d_head], mask=(i * PMAX + ix < seq_len)),
          nl.multiply(x1, sin_tile[:, half:d_head], mask=(i * PMAX + ix < seq_len)),
          mask=(i * PMAX + ix < seq_len))

      nl.store(out_mats[m, i * PMAX + ix, iy], value=out_tile,
               mask=(i * PMAX + ix < seq_len))

  return out_tensor


def _rotate_tile(src, dst, b, head, s, cos_tile, sin_tile, pos_mask, i_p, i_f, half):
  head_dim = 2 * half
  x_tile = nl.zeros((par_dim(PMAX), head_dim), dtype=nl.float32)
  x_tile[i_p, i_f] = nl.load(src[b, head, s * PMAX + i_p, i_f], mask=pos_mask, dtype=nl.float32)

  # rotate_half(x) = cat(-x2, x1)
  rotated = nl.ndarray((par_dim(PMAX), head_dim), dtype=nl.float32)
  rotated[:, 0:half] = nl.negative(x_tile[:, half:head_dim])
  rotated[:, half:head_dim] = nl.copy(x_tile[:, 0:half])

  x_embed = x_tile * cos_tile + rotated * sin_tile
  nl.store(dst[b, head, s * PMAX + i_p, i_f], value=x_embed, mask=pos_mask)


@nki.jit
def nki_apply_rotary_pos_emb(q, k, cos, sin):
  """
  q: [bsz, n_heads, seq_len, head_dim], k: [bsz, n_kv_heads, seq_len, head_dim]
  cos, sin: [bsz, seq_len, head_dim] (gathered at position_ids)
  Returns (q_embed, k_embed) = (q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin),
  computed in fp32, stored in the input dtype.
  """
  bsz, n_heads, seq_len, head_dim = q.shape
  _, n_kv_heads, _, _ = k.shape
  assert head_dim % 2 == 0 and head_dim <= 512
  assert n_heads % n_kv_heads == 0
  half = head_dim // 2

  q_embed = nl.ndarray(q.shape, dtype=q.dtype, buffer=nl.shared_hbm)
  k_embed = nl.ndarray(k.shape, dtype=k.dtype, buffer=nl.shared_hbm)

  i_p, i_f = nl.mgrid[0:PMAX, 0:head_dim]
  n_tiles = (seq_len + PMAX - 1) // PMAX

  for b in nl.affine_range(bsz):
    for s in nl.affine_range(n_tiles):
      pos_mask = (s * PMAX + i_p < seq_len)
      cos_tile = nl.zeros((par_dim(PMAX), head_dim), dtype=nl.float32)
      sin_tile = nl.zeros((par_dim(PMAX), head_dim), dtype=nl.float32)
      cos_tile[i_p, i_f] = nl.load(cos[b, s * PMAX + i_p, i_f], mask=pos_mask, dtype=nl.float32)
      sin_tile[i_p, i_f] = nl.load(sin[b, s * PMAX + i_p, i_f], mask=pos_mask, dtype=nl.float32)

      for h in nl.affine_range(n_heads):
        _rotate_tile(q, q_embed, b, h, s, cos_tile, sin_tile, pos_mask, i_p, i_f, half)
      for h in nl.affine_range(n_kv_heads):
        _rotate_tile(k, k_embed, b, h, s, cos_tile, sin_tile, pos_mask, i_p, i_f, half)

  return q_embed, k_embed


# ------------------------------------------------------------------------------------------------
# Fused residual add + RMSNorm
# ------------------------------------------------------------------------------------------------

@nki.jit
def nki_fused_add_rmsnorm_kernel(hidden_tensor, residual_tensor, g_tensor, eps=1e-6):
  # Calculate residual_out = hidden + residual, then
  # out_tensor = residual_out/RMS(residual_out) * g_tensor
  # Where RMS(a) = sqrt((1/N) * sum(a * a)) and N = hidden_tensor.shape[2]
  # Reduction (mean) is performed in the free (2nd) dimension
  out_tensor = nl.ndarray(hidden_tensor.shape, dtype=hidden_tensor.dtype,
                          buffer=nl.shared_hbm)
  residual_out = nl.ndarray(hidden_tensor.shape, dtype=hidden_tensor.dtype,
                            buffer=nl.shared_hbm)

  # Make sure shapes match
  assert hidden_tensor.shape == residual_tensor.shape
  assert hidden_tensor.shape[2] == g_tensor.shape[0]

  # Generate tensor indices to index input tensor
  ix = nl.arange(128)[:, None]
  iw = nl.arange(1)[:, None]
  iy = nl.arange(hidden_tensor.shape[2])[None, :]

  num_rows = hidden_tensor.shape[1]
  hidden_size = hidden_tensor.shape[2]

  # Load RMSNorm weight once, reused by rows/tiles of hidden_tensor
  g_tile = nl.load(g_tensor.reshape((1, g_tensor.shape[0]))[iw, iy])

  # Process 128 rows at a time due to 128-partition tile size limitation
  # Since we're not reducing across the first dimension
  # Tiles can be processed independently
  for b in range(hidden_tensor.shape[0]):
    for i in nl.affine_range(math.ceil(hidden_tensor.shape[1] / 128)):

      # Load input data from external memory to on-chip memory
      h_tile = nl.zeros([128, hidden_size], hidden_tensor.dtype)
      h_tile[...] = nl.load(hidden_tensor[b, i * 128 + ix, iy], mask=(i * 128 + ix < num_rows))
      r_tile = nl.zeros([128, hidden_size], residual_tensor.dtype)
      r_tile[...] = nl.load(residual_tensor[b, i * 128 + ix, iy], mask=(i * 128 + ix < num_rows))

      # Residual add in the activation dtype: the sum is the next layer's residual
      s_tile = nl.add(h_tile, r_tile)
      nl.store(residual_out[b, i * 128 + ix, iy], value=s_tile,
               mask=(i * 128 + ix < num_rows))

      # Compute element-wise square (in fp32)
      in_square = nl.square(s_tile, dtype=nl.float32)

      # Calculate the mean of the squared elements, along last dimension
      mean = nl.mean(in_square, axis=[1])

      # Take square root of mean and then reciprocal with
      # rsqrt API (one ISA instruction)
      rms_reciprocal = nl.rsqrt(mean + eps)

      # Scale the input tensor
      out_tile = nl.multiply(s_tile, rms_reciprocal, dtype=nl.float32)

      # Broadcast weight along first axis to match tensor shape
      g_bcast = g_tile.broadcast_to((128, g_tensor.shape[0]))

      # Multiply with the RMSNorm weight
      out_tile[...] = nl.multiply(out_tile, g_bcast,
                                  mask=(i * 128 + ix < num_rows))

      # store the results back to external memory (out_tensor)
      nl.store(out_tensor[b, i * 128 + ix, iy], value=out_tile,
               mask=(i * 128 + ix < num_rows))

  return out_tensor, residual_out


@nki.jit
def nki_fused_add_rmsnorm_isa_kernel(hidden, residual, weight, eps=1e-6):
  """
  hidden, residual: [n_tokens, hidden_size]; weight: [hidden_size]
  Returns (out, residual_out): residual_out = hidden + residual,
  out = residual_out * rsqrt(mean(residual_out ** 2) + eps) * weight.
  """
  n_tokens, hidden_size = hidden.shape
  assert residual.shape == hidden.shape
  assert weight.shape[0] == hidden_size

  out = nl.ndarray((n_tokens, hidden_size), dtype=hidden.dtype, buffer=nl.shared_hbm)
  residual_out = nl.ndarray((n_tokens, hidden_size), dtype=hidden.dtype, buffer=nl.shared_hbm)

  i_p = nl.arange(PMAX)[:, None]
  i_f = nl.arange(hidden_size)[None, :]
  i_w = nl.arange(1)[:, None]

  # [1, H] weight row, broadcast over the partitions by the multiply below
  w_tile = nl.load(weight.reshape((1, hidden_size))[i_w, i_f])
  eps_tile = nl.full((PMAX, 1), eps, dtype=nl.float32)

  for t in nl.affine_range((n_tokens + PMAX - 1) // PMAX):
    row_mask = (t * PMAX + i_p < n_tokens)
    h_tile = nl.load(hidden[t * PMAX + i_p, i_f], mask=row_mask)
    r_tile = nl.load(residual[t * PMAX + i_p, i_f], mask=row_mask)

    x_tile = nl.add(h_tile, r_tile, mask=row_mask)
    nl.store(residual_out[t * PMAX + i_p, i_f], value=x_tile, mask=row_mask)

    # sum of squares on ScalarE, accumulated in fp32
    sq_sum = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation_reduce(op=nl.square, data=x_tile, reduce_op=nl.add,
                           reduce_res=sq_sum, mask=row_mask, dtype=nl.float32)
    # rstd = 1 / sqrt(sum / H + eps)
    rstd = nisa.activation(op=nl.rsqrt, data=sq_sum, scale=1.0 / hidden_size,
                           bias=eps_tile, mask=row_mask, dtype=nl.float32)

    x_norm = nisa.tensor_scalar(data=x_tile, op0=np.multiply, operand0=rstd,
                                mask=row_mask, dtype=nl.float32)
    out_tile = nl.multiply(x_norm, w_tile, mask=row_mask, dtype=hidden.dtype)
    nl.store(out[t * PMAX + i_p, i_f], value=out_tile, mask=row_mask)

  return out, residual_out


# ------------------------------------------------------------------------------------------------
# SwiGLU gate/up projection
# ------------------------------------------------------------------------------------------------

@nki.jit
def nki_swiglu_fully_optimized_(
    lhsT,
    w_gate,
    w_up,
    # Meta-parameters
    TILES_IN_BLOCK_M=2,
    TILES_IN_BLOCK_N=2,
    TILES_IN_BLOCK_K=2,
):
  """nki_matmul_fully_optimized_ for gate = x @ w_gate and up = x @ w_up, fused with silu(gate) * up.

  Args:
      lhsT: an input tensor of shape [K,M], where both K and M are multiples for
        128.  It is the left-hand-side argument of the matrix multiplication,
        delivered transposed for optimal performance.
      w_gate, w_up: input tensors of shape [K,N],  where K is a multiple of 128, and
        N is a multiple of 512.
  Returns:
      result: the resulting output tensor of shape [M,N]
  """

  K, M = lhsT.shape
  K_, N = w_gate.shape
  assert K == K_, "lhsT and rhs must have the same contraction dimension"
  assert w_up.shape == w_gate.shape

  TILE_M = nl.tile_size.gemm_stationary_fmax  # 128
  TILE_K = nl.tile_size.pmax  # 128
  TILE_N = nl.tile_size.gemm_moving_fmax  # 512

  BLOCK_M = TILE_M * TILES_IN_BLOCK_M
  BLOCK_N = TILE_N * TILES_IN_BLOCK_N
  BLOCK_K = TILE_K * TILES_IN_BLOCK_K

  # the size has to be multiple of block size
  assert M % BLOCK_M == 0
  assert N % BLOCK_N == 0
  assert K % BLOCK_K == 0

  NUM_BLOCK_M = M // BLOCK_M
  NUM_BLOCK_N = N // BLOCK_N
  NUM_BLOCK_K = K // BLOCK_K

  result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)

  # Blocking N dimension (the RHS free dimension)
  for n in nl.affine_range(NUM_BLOCK_N):
    gate_tiles = nl.zeros((NUM_BLOCK_M, TILES_IN_BLOCK_M, TILES_IN_BLOCK_N,
                           nl.par_dim(TILE_M), TILE_N),
                          dtype=nl.float32,
                          buffer=nl.sbuf)
    up_tiles = nl.zeros((NUM_BLOCK_M, TILES_IN_BLOCK_M, TILES_IN_BLOCK_N,
                         nl.par_dim(TILE_M), TILE_N),
                        dtype=nl.float32,
                        buffer=nl.sbuf)

    # Blocking K dimension (the contraction dimension)
    # Use `sequential_range` because we do not want the compiler to change this loop by,
    # for example, vectorizing it
    for k in nl.sequential_range(NUM_BLOCK_K):
      # Loading tiles from rhs
      # setting the load tile to `TILE_K x BLOCK_SIZE_N` to optimize DMA performance
      i_rhs = nl.mgrid[0:TILE_K, 0:BLOCK_N]
      gate_w_tiles = nl.ndarray((TILES_IN_BLOCK_K, nl.par_dim(TILE_K), BLOCK_N),
                                dtype=w_gate.dtype,
                                buffer=nl.sbuf)
      up_w_tiles = nl.ndarray((TILES_IN_BLOCK_K, nl.par_dim(TILE_K), BLOCK_N),
                              dtype=w_up.dtype,
                              buffer=nl.sbuf)

      for bk_r in nl.affine_range(TILES_IN_BLOCK_K):
        gate_w_tiles[bk_r, i_rhs.p, i_rhs.x] = nl.load(
            w_gate[(TILES_IN_BLOCK_K * k + bk_r) * TILE_K + i_rhs.p,
                   BLOCK_N * n + i_rhs.x])
        up_w_tiles[bk_r, i_rhs.p, i_rhs.x] = nl.load(
            w_up[(TILES_IN_BLOCK_K * k + bk_r) * TILE_K + i_rhs.p,
                 BLOCK_N * n + i_rhs.x])

      # Blocking M dimension (the LHS free dimension)
      for m in nl.affine_range(NUM_BLOCK_M):
        # Loading tiles from lhsT
        i_lhsT = nl.mgrid[0:TILE_K, 0:BLOCK_M]
        lhsT_tiles = nl.ndarray((TILES_IN_BLOCK_K, nl.par_dim(TILE_K), BLOCK_M),
                                dtype=lhsT.dtype,
                                buffer=nl.sbuf)
        for bk_l in nl.affine_range(TILES_IN_BLOCK_K):
          lhsT_tiles[bk_l, i_lhsT.p, i_lhsT.x] = nl.load(
              lhsT[(TILES_IN_BLOCK_K * k + bk_l) * TILE_K + i_lhsT.p,
                   BLOCK_M * m + i_lhsT.x])

        # Do matmul with all tiles in the blocks
        i_lhsT_mm = nl.mgrid[0:TILE_K, 0:TILE_M]
        i_rhs_mm = nl.mgrid[0:TILE_K, 0:TILE_N]
        i_res_mm = nl.mgrid[0:TILE_M, 0:TILE_N]
        for bn in nl.affine_range(TILES_IN_BLOCK_N):
          for bm in nl.affine_range(TILES_IN_BLOCK_M):
            gate_psum = nl.zeros((TILE_M, TILE_N), dtype=nl.float32, buffer=nl.psum)
            up_psum = nl.zeros((TILE_M, TILE_N), dtype=nl.float32, buffer=nl.psum)

            for bk in nl.affine_range(TILES_IN_BLOCK_K):
              gate_psum[...] += nisa.nc_matmul(
                  lhsT_tiles[bk, i_lhsT_mm.p, bm * TILE_M + i_lhsT_mm.x],
                  gate_w_tiles[bk, i_rhs_mm.p, bn * TILE_N + i_rhs_mm.x])
              up_psum[...] += nisa.nc_matmul(
                  lhsT_tiles[bk, i_lhsT_mm.p, bm * TILE_M + i_lhsT_mm.x],
                  up_w_tiles[bk, i_rhs_mm.p, bn * TILE_N + i_rhs_mm.x])

            # Accumulate on corresponding SBUF tile
            gate_tiles[m, bm, bn, i_res_mm.p,
                       i_res_mm.x] += gate_psum[i_res_mm.p, i_res_mm.x]
            up_tiles[m, bm, bn, i_res_mm.p,
                     i_res_mm.x] += up_psum[i_res_mm.p, i_res_mm.x]

    # silu(gate) * up, then copy the result from SBUF to HBM
    for m in nl.affine_range(NUM_BLOCK_M):
      for bm in nl.affine_range(TILES_IN_BLOCK_M):
        i_res = nl.mgrid[0:TILE_K, 0:TILE_N]
        i_res_packed = nl.mgrid[0:TILE_K, 0:BLOCK_N]
        result_packed = nl.ndarray((TILE_K, BLOCK_N),
                                   dtype=result.dtype,
                                   buffer=nl.sbuf)

        # coalesce result tiles for better DMA performance
        for bn in nl.affine_range(TILES_IN_BLOCK_N):
          gate_act = nl.silu(gate_tiles[m, bm, bn, i_res.p, i_res.x])
          result_packed[i_res.p,
                        bn * TILE_N + i_res.x] = nl.multiply(
                            gate_act, up_tiles[m, bm, bn, i_res.p, i_res.x],
                            dtype=result.dtype)
        nl.store(result[(TILES_IN_BLOCK_M * m + bm) * TILE_K + i_res_packed.p,
                        BLOCK_N * n + i_res_packed.x],
                 value=result_packed[i_res_packed.p, i_res_packed.x])

  return result


@nki.jit
def nki_gate_up_swiglu_tiled_(lhsT, w_gate_up):
  """silu(x @ w_gate) * (x @ w_up) with NxDI's fused gate_up weight.

  Args:
      lhsT: [K, M] (x transposed), K a multiple of 128, M a multiple of 128
      w_gate_up: [K, 2 * I], gate columns first, I a multiple of 512
  Returns:
      result: [M, I]
  """
  K, M = lhsT.shape
  K_, I2 = w_gate_up.shape
  assert K == K_, "lhsT and w_gate_up must have the same contraction dimension"
  I = I2 // 2

  TILE_M = nl.tile_size.gemm_stationary_fmax  # 128
  TILE_K = nl.tile_size.pmax  # 128
  TILE_N = nl.tile_size.gemm_moving_fmax  # 512
  assert M % TILE_M == 0 and K % TILE_K == 0 and I % TILE_N == 0

  result = nl.ndarray((M, I), dtype=lhsT.dtype, buffer=nl.shared_hbm)

  # Use affine_range to loop over tiles
  for m in nl.affine_range(M // TILE_M):
    for n in nl.affine_range(I // TILE_N):
      # Allocate tensors in PSUM
      gate_psum = nl.zeros((TILE_M, TILE_N), nl.float32, buffer=nl.psum)
      up_psum = nl.zeros((TILE_M, TILE_N), nl.float32, buffer=nl.psum)

      for k in nl.affine_range(K // TILE_K):
        # Declare the tiles on SBUF
        lhsT_tile = nl.ndarray((TILE_K, TILE_M), dtype=lhsT.dtype, buffer=nl.sbuf)
        gate_tile = nl.ndarray((TILE_K, TILE_N), dtype=w_gate_up.dtype, buffer=nl.sbuf)
        up_tile = nl.ndarray((TILE_K, TILE_N), dtype=w_gate_up.dtype, buffer=nl.sbuf)

        # Load tiles from lhsT and the gate/up halves of w_gate_up
        lhsT_tile[...] = nl.load(lhsT[k * TILE_K:(k + 1) * TILE_K,
                                      m * TILE_M:(m + 1) * TILE_M])
        gate_tile[...] = nl.load(w_gate_up[k * TILE_K:(k + 1) * TILE_K,
                                           n * TILE_N:(n + 1) * TILE_N])
        up_tile[...] = nl.load(w_gate_up[k * TILE_K:(k + 1) * TILE_K,
                                         I + n * TILE_N:I + (n + 1) * TILE_N])

        # Accumulate partial-sums into PSUM
        gate_psum += nl.matmul(lhsT_tile, gate_tile, transpose_x=True)
        up_psum += nl.matmul(lhsT_tile, up_tile, transpose_x=True)

      # silu(gate) * up, evicted from PSUM to SBUF in the output dtype
      act = nl.silu(gate_psum)
      res_sb = nl.multiply(act, up_psum, dtype=result.dtype)
      nl.store(result[m * TILE_M:(m + 1) * TILE_M, n * TILE_N:(n + 1) * TILE_N],
               value=res_sb)

  return result


# ------------------------------------------------------------------------------------------------
# Token-generation (flash decoding) attention
# ------------------------------------------------------------------------------------------------

@nki.jit
def nki_flash_decode_kernel(q, k_cache, v_cache, softmax_scale=None):
  """
  One decode step: every head attends with its single query token to the whole KV cache.

  q: [bsz, n_heads, head_dim]
  k_cache, v_cache: [bsz, n_kv_heads, seq_len, head_dim]
  returns: [bsz, n_heads, head_dim]

  Launched as nki_flash_decode_kernel[grid](...): the heads are split evenly over
  nl.program_id(0); n_heads // n_kv_heads query heads share one kv head (GQA).
  """
  bsz, n_heads, head_dim = q.shape
  _, n_kv_heads, seq_len, _ = k_cache.shape
  assert head_dim <= PMAX
  assert n_heads % n_kv_heads == 0
  q_per_kv = n_heads // n_kv_heads

  if softmax_scale is None:
    softmax_scale = 1.0 / math.sqrt(head_dim)

  n_prgs = nl.num_programs(0)
  pid = nl.program_id(0)
  assert n_heads % n_prgs == 0
  heads_per_prg = n_heads // n_prgs

  out = nl.ndarray((bsz, n_heads, head_dim), dtype=q.dtype, buffer=nl.shared_hbm)

  B_KV = 128  # keys per block
  n_blocks = (seq_len + B_KV - 1) // B_KV
  kernel_dtype = q.dtype

  i_d_p = nl.arange(head_dim)[:, None]
  i_1_p = nl.arange(1)[:, None]
  i_k_p = nl.arange(B_KV)[:, None]
  i_k_f = nl.arange(B_KV)[None, :]
  i_d_f = nl.arange(head_dim)[None, :]

  for b in nl.affine_range(bsz):
    for hh in nl.static_range(heads_per_prg):
      head = pid * heads_per_prg + hh
      kv_head = head // q_per_kv

      # q^T [head_dim, 1]: head_dim on the partitions, pre-scaled
      q_T = nl.load(q[b, head, i_d_p])
      q_T = nl.multiply(q_T, softmax_scale, dtype=kernel_dtype)

      # running max, running sum and the unnormalised output
      m_prev = nl.full((1, 1), -3.0e38, dtype=nl.float32)
      l_prev = nl.zeros((1, 1), dtype=nl.float32)
      acc = nl.zeros((1, head_dim), dtype=nl.float32)

      for j in nl.sequential_range(n_blocks):
        kv_mask = (j * B_KV + i_k_f < seq_len)

        # K block transposed [head_dim, B_KV]
        k_T = nl.zeros((par_dim(head_dim), B_KV), dtype=k_cache.dtype)
        k_T[i_d_p, i_k_f] = nl.load(k_cache[b, kv_head, j * B_KV + i_k_f, i_d_p], mask=kv_mask)

        qk_psum = nisa.nc_matmul(q_T, k_T)  # [1, B_KV] in PSUM
        # keys past the end of the cache get a large negative score
        scores = nisa.affine_select(pred=(j * B_KV + i_k_f < seq_len),
                                    on_true_tile=qk_psum[i_1_p, i_k_f],
                                    on_false_value=-9984.0, dtype=nl.float32)

        m_cur = nisa.tensor_reduce(np.max, data=scores, axis=(1,), keepdims=True,
                                   dtype=nl.float32)
        m_new = nl.maximum(m_prev, m_cur)
        neg_m = nl.multiply(m_new, -1.0)
        p = nisa.activation(op=nl.exp, data=scores, bias=neg_m, scale=1.0,
                            dtype=kernel_dtype)
        l_cur = nl.sum(p, axis=[1], keepdims=True, dtype=nl.float32)
        alpha = nl.exp(nl.subtract(m_prev, m_new))

        # p^T [B_KV, 1] for the PV matmul
        p_T = nl.copy(nisa.nc_transpose(p), dtype=kernel_dtype)

        v_tile = nl.zeros((par_dim(B_KV), head_dim), dtype=v_cache.dtype)
        v_tile[i_k_p, i_d_f] = nl.load(v_cache[b, kv_head, j * B_KV + i_k_p, i_d_f],
                                       mask=(j * B_KV + i_k_p < seq_len))
        pv_psum = nisa.nc_matmul(p_T, v_tile)  # [1, head_dim]

        acc[...] = nl.add(nl.multiply(acc, alpha), pv_psum)
        l_prev[...] = nl.add(nl.multiply(l_prev, alpha), l_cur)
        m_prev[...] = m_new

      o_tile = nl.divide(acc, l_prev, dtype=out.dtype)
      nl.store(out[b, head + i_1_p, i_d_f], value=o_tile)

  return out


@nki.jit
def nki_gqa_token_gen_attention(q, k_cache, v_cache, cache_len):
  """
  GQA decode attention, one program per kv head: the q_per_kv query heads that share a kv head are on the
  partitions and go through the KV cache together.

  q: [bsz, n_heads, head_dim]
  k_cache, v_cache: [bsz, n_kv_heads, max_seq_len, head_dim] (max_seq_len a multiple of 128)
  cache_len: the number of valid positions (the rest of the cache is padding)
  returns: [bsz, n_heads, head_dim]

  Launched as nki_gqa_token_gen_attention[grid](...), grid = n_kv_heads, nl.nc(2), or any divisor of
  n_kv_heads: program nl.program_id(0) takes n_kv_heads // grid kv heads.
  """
  bsz, n_heads, head_dim = q.shape
  _, n_kv_heads, max_seq_len, _ = k_cache.shape
  q_per_kv = n_heads // n_kv_heads
  assert n_heads == q_per_kv * n_kv_heads
  assert head_dim <= 128 and q_per_kv <= 128
  B_KV = 128
  assert max_seq_len % B_KV == 0 and 0 < cache_len <= max_seq_len

  kv_per_prg = n_kv_heads // nl.num_programs(0)
  assert kv_per_prg * nl.num_programs(0) == n_kv_heads
  softmax_scale = 1.0 / math.sqrt(head_dim)
  kernel_dtype = q.dtype

  out = nl.ndarray((bsz, n_heads, head_dim), dtype=q.dtype, buffer=nl.shared_hbm)

  n_blocks = (cache_len + B_KV - 1) // B_KV
  i_q, i_k = nl.mgrid[0:q_per_kv, 0:B_KV]

  for kv_i in nl.static_range(kv_per_prg):
    kv_head = nl.program_id(0) * kv_per_prg + kv_i
    q_heads = nl.ds(kv_head * q_per_kv, q_per_kv)

    for b in nl.affine_range(bsz):
      # [head_dim, q_per_kv], scaled by 1/sqrt(head_dim)
      q_T = nl.load_transpose2d(q[b, q_heads, :])
      q_T = nl.multiply(q_T, softmax_scale, dtype=kernel_dtype)

      m_i = nl.full((q_per_kv, 1), -3.0e38, dtype=nl.float32)
      l_i = nl.zeros((q_per_kv, 1), dtype=nl.float32)
      o_i = nl.zeros((q_per_kv, head_dim), dtype=nl.float32)

      for j in nl.sequential_range(n_blocks):
        k_T = nl.load_transpose2d(k_cache[b, kv_head, nl.ds(j * B_KV, B_KV), :])
        v_blk = nl.load(v_cache[b, kv_head, nl.ds(j * B_KV, B_KV), :])

        qk = nl.matmul(q_T, k_T, transpose_x=True)  # [q_per_kv, B_KV]
        # positions past cache_len do not take part
        s_ij = nisa.affine_select(pred=(j * B_KV + i_k < cache_len),
                                  on_true_tile=qk[i_q, i_k], on_false_value=-9984.0,
                                  dtype=nl.float32)

        m_ij = nl.max(s_ij, axis=[1], keepdims=True)
        m_new = nl.maximum(m_i, m_ij)
        p_ij = nl.exp(nl.subtract(s_ij, m_new))
        l_ij = nl.sum(p_ij, axis=[1], keepdims=True)
        alpha = nl.exp(nl.subtract(m_i, m_new))

        p_T = nl.copy(nl.transpose(p_ij.astype(kernel_dtype)), dtype=kernel_dtype)  # [B_KV, q_per_kv]
        pv = nl.matmul(p_T, v_blk, transpose_x=True)  # [q_per_kv, head_dim]

        o_i[...] = nl.add(nl.multiply(o_i, alpha), pv)
        l_i[...] = nl.add(nl.multiply(l_i, alpha), l_ij)
        m_i[...] = m_new

      o_tile = nl.divide(o_i, l_i, dtype=out.dtype)
      nl.store(out[b, q_heads, :], value=o_tile)

  return out
