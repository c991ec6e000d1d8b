"""Diffusion-transformer (DiT / Flux / SD3) block kernels in the style of the diffusion-model NKI kernels of
aws-neuron/neuronx-distributed-inference (``models/diffusers``), in the Beta-1 dialect those kernels use
(``import neuronxcc.nki as nki``, ``@nki.jit``, 2-space indentation as in the NKI samples):

- ``nki_adaln_modulate_kernel(x, shift, scale, eps)``: adaLN-Zero modulation, LayerNorm without affine
  (``bn_stats`` / ``bn_aggr`` per 512-column chunk) of x [B, T, C], then ``x * (1 + scale[b]) + shift[b]``
  with shift/scale [B, C] loaded once per batch as [1, C] rows and broadcast over the token partitions.
- ``nki_gated_residual_kernel(x, y, gate)``: ``x + gate[b] * y`` (the adaLN-Zero gated residual).
- ``nki_qk_rmsnorm_kernel(q, k, q_weight, k_weight, eps)``: Flux/SD3 QK-norm, RMSNorm over the head dim of
  q/k [B, H, T, d] with a learnable [d] weight per projection (``activation_reduce`` sum of squares,
  ``activation`` rsqrt).
- ``nki_gelu_mlp_kernel(x, w1, b1, w2, b2, fuse_gelu=True)``: ``gelu_tanh(x @ W1 + b1) @ W2 + b2``. Layer 1 is
  computed feature-major (hT = W1^T x^T, features on the PSUM partitions) so that b1 is a per-partition bias
  fused with the tanh-GELU into the PSUM eviction (``nisa.activation(op=nl.gelu_apprx_tanh, bias=b1)``);
  layer 2 has the tokens on the PSUM partitions and adds b2 (a broadcast [1, C] row) on eviction.
  ``fuse_gelu=False`` evicts with the bias add and runs the GELU as a separate pass.
- ``nki_timestep_embedding_kernel(t, w1, b1, w2, b2, max_period)``: the sinusoidal timestep embedding
  ``cat(cos(t * f), sin(t * f))``, ``f_i = exp(-ln(max_period) * i / half)``, computed on chip (frequencies
  from ``nisa.iota`` + ``nisa.activation(exp, scale=...)``, one frequency per partition), followed by
  ``Linear -> SiLU -> Linear``.

Written from memory of those kernels and in their authors' style; not copies. No nsim imports.
"""
import math

import numpy as np

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl

PMAX = 128


# ------------------------------------------------------------------------------------------------
# adaLN-Zero modulation and gated residual
# ------------------------------------------------------------------------------------------------

@nki.jit
def nki_adaln_modulate_kernel(x_tensor, shift_tensor, scale_tensor, eps=1e-6):
  """
  out[b] = LayerNorm(x[b]) * (1 + scale[b]) + shift[b]  (LayerNorm without elementwise affine)

  x_tensor: [batch, seq_len, hidden]; shift_tensor, scale_tensor: [batch, hidden]
  """
  batch, seq_len, hidden = x_tensor.shape
  assert shift_tensor.shape == [batch, hidden]
  assert scale_tensor.shape == [batch, hidden]
  out_tensor = nl.ndarray(x_tensor.shape, dtype=x_tensor.dtype, buffer=nl.shared_hbm)

  ix = nl.arange(PMAX)[:, None]
  iw = nl.arange(1)[:, None]
  iy = nl.arange(hidden)[None, :]

  BN_FMAX = nl.tile_size.bn_stats_fmax
  n_chunks = math.ceil(hidden / BN_FMAX)

  for b in nl.affine_range(batch):
    # modulation rows of this batch element, reused by every token tile
    shift_row = nl.load(shift_tensor[b + iw, iy], dtype=nl.float32)
    scale_row = nl.load(scale_tensor[b + iw, iy], dtype=nl.float32)
    scale_row = nl.add(scale_row, 1.0)
    shift_bcast = shift_row.broadcast_to((PMAX, hidden))
    scale_bcast = scale_row.broadcast_to((PMAX, hidden))

    for i in nl.affine_range(math.ceil(seq_len / PMAX)):
      x_tile = nl.load(x_tensor[b, i * PMAX + ix, iy], mask=(i * PMAX + ix < seq_len))

      # mean / variance with bn_stats on <= 512-column chunks, aggregated by bn_aggr
      stats = nl.ndarray((PMAX, 6 * n_chunks), dtype=nl.float32, buffer=nl.sbuf)
      for c in nl.affine_range(n_chunks):
        ic = nl.arange(BN_FMAX)[None, :]
        stats[ix, c * 6 + nl.arange(6)[None, :]] = nisa.bn_stats(
            x_tile[ix, c * BN_FMAX + ic],
            mask=(i * PMAX + ix < seq_len) & (c * BN_FMAX + ic < hidden),
            dtype=nl.float32)
      mean_var = nisa.bn_aggr(stats, mask=(i * PMAX + ix < seq_len))
      mean = mean_var[ix, 0]
      var = mean_var[ix, 1]
      rstd = nl.rsqrt(var + eps, mask=(i * PMAX + ix < seq_len))

      # (x - mean) * rstd in one VectorE instruction
      x_norm = nisa.tensor_scalar(data=x_tile, op0=np.subtract, operand0=mean,
                                  op1=np.multiply, operand1=rstd,
                                  mask=(i * PMAX + ix < seq_len), dtype=nl.float32)

      out_tile = nl.multiply(x_norm, scale_bcast, mask=(i * PMAX + ix < seq_len))
      out_tile = nl.add(out_tile, shift_bcast, mask=(i * PMAX + ix < seq_len), dtype=x_tensor.dtype)
      nl.store(out_tensor[b, i * PMAX + ix, iy], value=out_tile, mask=(i * PMAX + ix < seq_len))

  return out_tensor


@nki.jit
def nki_gated_residual_kernel(x_tensor, y_tensor, gate_tensor):
  """
  out[b] = x[b] + gate[b] * y[b]

  x_tensor, y_tensor: [batch, seq_len, hidden]; gate_tensor: [batch, hidden]
  """
  batch, seq_len, hidden = x_tensor.shape
  assert y_tensor.shape == x_tensor.shape
  assert gate_tensor.shape == [batch, hidden]
  out_tensor = nl.ndarray(x_tensor.shape, dtype=x_tensor.dtype, buffer=nl.shared_hbm)

  ix = nl.arange(PMAX)[:, None]
  iw = nl.arange(1)[:, None]
  iy = nl.arange(hidden)[None, :]

  for b in nl.affine_range(batch):
    gate_row = nl.load(gate_tensor[b + iw, iy])
    gate_bcast = gate_row.broadcast_to((PMAX, hidden))

    for i in nl.affine_range(math.ceil(seq_len / PMAX)):
      x_tile = nl.load(x_tensor[b, i * PMAX + ix, iy], mask=(i * PMAX + ix < seq_len))
      y_tile = nl.load(y_tensor[b, i * PMAX + ix, iy], mask=(i * PMAX + ix < seq_len))

      gated = nl.multiply(y_tile, gate_bcast, mask=(i * PMAX + ix < seq_len), dtype=nl.float32)
      out_tile = nl.add(x_tile, gated, mask=(i * PMAX + ix < seq_len), dtype=x_tensor.dtype)
      nl.store(out_tensor[b, i * PMAX + ix, iy], value=out_tile, mask=(i * PMAX + ix < seq_len))

  return out_tensor


# ------------------------------------------------------------------------------------------------
# QK-RMSNorm over the head dim
# ------------------------------------------------------------------------------------------------

def _rmsnorm_heads(src, dst, w_tile, eps_tile, head_dim, i_p, i_f):
  batch, n_heads, seq_len, _ = src.shape
  for b in nl.affine_range(batch):
    for h in nl.affine_range(n_heads):
      for i in nl.affine_range(math.ceil(seq_len / PMAX)):
        row_mask = (i * PMAX + i_p < seq_len)
        x_tile = nl.load(src[b, h, i * PMAX + i_p, i_f], mask=row_mask)

        sq_sum = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation_reduce(op=nl.square, data=x_tile, reduce_op=nl.add,
                               reduce_res=sq_sum, mask=row_mask, dtype=nl.float32)
        rstd = nisa.activation(op=nl.rsqrt, data=sq_sum, scale=1.0 / head_dim,
                               bias=eps_tile, mask=row_mask, dtype=nl.float32)

        x_norm = nisa.tensor_scalar(data=x_tile, op0=np.multiply, operand0=rstd,
                                    mask=row_mask, dtype=nl.float32)
        out_tile = nl.multiply(x_norm, w_tile, mask=row_mask, dtype=src.dtype)
        nl.store(dst[b, h, i * PMAX + i_p, i_f], value=out_tile, mask=row_mask)


@nki.jit
def nki_qk_rmsnorm_kernel(q, k, q_weight, k_weight, eps=1e-6):
  """
  q: [batch, n_heads, seq_len, head_dim], k: [batch, n_kv_heads, seq_len, head_dim]
  q_weight, k_weight: [head_dim]
  Returns (q * rsqrt(mean(q**2, -1) + eps) * q_weight, the same for k).
  """
  head_dim = q.shape[3]
  assert k.shape[3] == head_dim and head_dim <= 512
  assert q_weight.shape == [head_dim] and k_weight.shape == [head_dim]

  q_out = nl.ndarray(q.shape, dtype=q.dtype, buffer=nl.shared_hbm)
  k_out = nl.ndarray(k.shape, dtype=k.dtype, buffer=nl.shared_hbm)

  i_p = nl.arange(PMAX)[:, None]
  i_f = nl.arange(head_dim)[None, :]
  i_w = nl.arange(1)[:, None]

  # [1, d] weight rows broadcast over the token partitions
  qw_tile = nl.load(q_weight.reshape((1, head_dim))[i_w, i_f]).broadcast_to((PMAX, head_dim))
  kw_tile = nl.load(k_weight.reshape((1, head_dim))[i_w, i_f]).broadcast_to((PMAX, head_dim))
  eps_tile = nl.full((PMAX, 1), eps, dtype=nl.float32)

  _rmsnorm_heads(q, q_out, qw_tile, eps_tile, head_dim, i_p, i_f)
  _rmsnorm_heads(k, k_out, kw_tile, eps_tile, head_dim, i_p, i_f)
  return q_out, k_out


# ------------------------------------------------------------------------------------------------
# tanh-GELU MLP
# ------------------------------------------------------------------------------------------------

@nki.jit
def nki_gelu_mlp_kernel(x, w1, b1, w2, b2, fuse_gelu=True):
  """
  out = gelu_tanh(x @ w1 + b1) @ w2 + b2

  x: [n_tokens, hidden], hidden a multiple of 128; n_tokens a multiple of 128, and of 512 above 512
  w1: [hidden, ffn], ffn a multiple of 128; b1: [ffn]
  w2: [ffn, hidden_out], hidden_out <= 512; b2: [hidden_out]
  """
  n_tokens, hidden = x.shape
  _, ffn = w1.shape
  _, hidden_out = w2.shape
  assert w2.shape[0] == ffn and b1.shape == [ffn] and b2.shape == [hidden_out]
  assert hidden % PMAX == 0 and ffn % PMAX == 0
  assert hidden_out <= nl.tile_size.gemm_moving_fmax

  # layer 1 streams up to 512 tokens per matmul (the moving free size), layer 2 takes them 128 at a time
  TOK_TILE = min(n_tokens, nl.tile_size.gemm_moving_fmax)
  assert n_tokens % TOK_TILE == 0 and TOK_TILE % PMAX == 0
  K1 = hidden // PMAX
  F_TILES = ffn // PMAX
  N_TILES = n_tokens // TOK_TILE
  SUB = TOK_TILE // PMAX

  out = nl.ndarray((n_tokens, hidden_out), dtype=x.dtype, buffer=nl.shared_hbm)

  # weights stay resident in SBUF, contraction dim on the partitions
  w1_sb = nl.ndarray((K1, nl.par_dim(PMAX), ffn), dtype=w1.dtype, buffer=nl.sbuf)
  for k in nl.affine_range(K1):
    w1_sb[k, :, :] = nl.load(w1[k * PMAX:(k + 1) * PMAX, :])
  w2_sb = nl.ndarray((F_TILES, nl.par_dim(PMAX), hidden_out), dtype=w2.dtype, buffer=nl.sbuf)
  for f in nl.affine_range(F_TILES):
    w2_sb[f, :, :] = nl.load(w2[f * PMAX:(f + 1) * PMAX, :])

  # b1 as one column per ffn tile (features on partitions), b2 as a [1, hidden_out] row
  b1_sb = nl.ndarray((F_TILES, nl.par_dim(PMAX), 1), dtype=nl.float32, buffer=nl.sbuf)
  b1_cols = b1.reshape((F_TILES, PMAX, 1))
  for f in nl.affine_range(F_TILES):
    b1_sb[f, :, :] = nl.load(b1_cols[f], dtype=nl.float32)
  b2_row = nl.load(b2.reshape((1, hidden_out)), dtype=nl.float32)
  b2_bcast = b2_row.broadcast_to((PMAX, hidden_out))

  for n in nl.affine_range(N_TILES):
    # x^T of this token block: [hidden (K), tokens]
    xT = nl.ndarray((K1, nl.par_dim(PMAX), TOK_TILE), dtype=x.dtype, buffer=nl.sbuf)
    for k in nl.affine_range(K1):
      xT[k, :, :] = nl.load_transpose2d(x[n * TOK_TILE:(n + 1) * TOK_TILE, k * PMAX:(k + 1) * PMAX])

    # layer 1, feature-major: hT[f] = w1[:, f]^T @ x^T, then gelu(hT + b1) on eviction
    hT = nl.ndarray((F_TILES, nl.par_dim(PMAX), TOK_TILE), dtype=x.dtype, buffer=nl.sbuf)
    for f in nl.affine_range(F_TILES):
      h_psum = nl.zeros((PMAX, TOK_TILE), dtype=nl.float32, buffer=nl.psum)
      for k in nl.affine_range(K1):
        h_psum += nisa.nc_matmul(w1_sb[k, :, f * PMAX:(f + 1) * PMAX], xT[k, :, :])
      if fuse_gelu:
        hT[f, :, :] = nisa.activation(op=nl.gelu_apprx_tanh, data=h_psum, bias=b1_sb[f, :, :],
                                      dtype=x.dtype)
      else:
        h_biased = nisa.tensor_scalar(data=h_psum, op0=np.add, operand0=b1_sb[f, :, :],
                                      dtype=nl.float32)
        hT[f, :, :] = nl.gelu_apprx_tanh(h_biased, dtype=x.dtype)

    # layer 2, token-major: out = h @ w2 (128 tokens on the PSUM partitions), + b2 on eviction
    for s in nl.affine_range(SUB):
      o_psum = nl.zeros((PMAX, hidden_out), dtype=nl.float32, buffer=nl.psum)
      for f in nl.affine_range(F_TILES):
        o_psum += nisa.nc_matmul(hT[f, :, s * PMAX:(s + 1) * PMAX], w2_sb[f, :, :])
      o_tile = nl.add(o_psum, b2_bcast, dtype=x.dtype)
      nl.store(out[n * TOK_TILE + s * PMAX:n * TOK_TILE + (s + 1) * PMAX, :], value=o_tile)

  return out


# ------------------------------------------------------------------------------------------------
# Timestep embedding
# ------------------------------------------------------------------------------------------------

@nki.jit
def nki_timestep_embedding_kernel(timesteps, w1, b1, w2, b2, max_period=10000.0):
  """
  emb = cat(cos(t * freqs), sin(t * freqs)), freqs[i] = exp(-ln(max_period) * i / half), i < half
  out = silu(emb @ w1 + b1) @ w2 + b2

  timesteps: [batch] (float32), batch <= 128
  w1: [2 * half, hidden] with half = 128 (the 256 frequency channels of DiT/Flux); b1: [hidden]
  w2: [hidden, hidden], hidden a multiple of 128 and <= 512; b2: [hidden]
  """
  batch = timesteps.shape[0]
  freq_dim, hidden = w1.shape
  half = freq_dim // 2
  assert half == PMAX and batch <= PMAX
  assert w2.shape == [hidden, hidden] and hidden % PMAX == 0
  assert hidden <= nl.tile_size.gemm_moving_fmax
  H_TILES = hidden // PMAX

  out = nl.ndarray((batch, hidden), dtype=w1.dtype, buffer=nl.shared_hbm)

  # frequencies, one per partition: exp(-ln(max_period) / half * i)
  i_freq = nisa.iota(nl.arange(half)[:, None], dtype=nl.float32)
  freqs = nisa.activation(op=nl.exp, data=i_freq, scale=-math.log(max_period) / half)

  # timesteps as a [1, batch] row broadcast over the frequency partitions
  t_row = nl.load(timesteps.reshape((1, batch)), dtype=nl.float32)
  t_bcast = t_row.broadcast_to((half, batch))

  # args^T [half, batch] = freqs[i] * t[b]; the embedding is kept transposed (channels on partitions)
  argsT = nisa.tensor_scalar(data=t_bcast, op0=np.multiply, operand0=freqs, dtype=nl.float32)
  embT = nl.ndarray((2, nl.par_dim(half), batch), dtype=w1.dtype, buffer=nl.sbuf)
  embT[0, :, :] = nl.cos(argsT, dtype=w1.dtype)
  embT[1, :, :] = nl.sin(argsT, dtype=w1.dtype)

  w1_sb = nl.ndarray((2, nl.par_dim(half), hidden), dtype=w1.dtype, buffer=nl.sbuf)
  for k in nl.affine_range(2):
    w1_sb[k, :, :] = nl.load(w1[k * half:(k + 1) * half, :])
  w2_sb = nl.ndarray((H_TILES, nl.par_dim(PMAX), hidden), dtype=w2.dtype, buffer=nl.sbuf)
  for k in nl.affine_range(H_TILES):
    w2_sb[k, :, :] = nl.load(w2[k * PMAX:(k + 1) * PMAX, :])
  b1_cols = b1.reshape((H_TILES, PMAX, 1))
  b2_row = nl.load(b2.reshape((1, hidden)), dtype=nl.float32)

  # layer 1 feature-major (hidden on partitions), silu(h + b1) fused into the eviction
  hT = nl.ndarray((H_TILES, nl.par_dim(PMAX), batch), dtype=w1.dtype, buffer=nl.sbuf)
  for j in nl.affine_range(H_TILES):
    b1_col = nl.load(b1_cols[j], dtype=nl.float32)
    h_psum = nl.zeros((PMAX, batch), dtype=nl.float32, buffer=nl.psum)
    for k in nl.affine_range(2):
      h_psum += nisa.nc_matmul(w1_sb[k, :, j * PMAX:(j + 1) * PMAX], embT[k, :, :])
    hT[j, :, :] = nisa.activation(op=nl.silu, data=h_psum, bias=b1_col, dtype=w1.dtype)

  # layer 2 batch-major, + b2 on eviction
  o_psum = nl.zeros((batch, hidden), dtype=nl.float32, buffer=nl.psum)
  for j in nl.affine_range(H_TILES):
    o_psum += nisa.nc_matmul(hT[j, :, :], w2_sb[j, :, :])
  o_tile = nl.add(o_psum, b2_row.broadcast_to((batch, hidden)), dtype=w1.dtype)
  nl.store(out, value=o_tile)

  return out
