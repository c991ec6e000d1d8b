"""The flash attention forward kernel of the public nki-samples repository (``flash_fwd``,
``src/nki_samples/reference/attention.py``), written as the sample writes it: a ``FlashConfig`` dataclass,
trace-mode helpers (``transpose_p_local``, ``dropout_p_local``, ``_flash_attention_core``, ``load_v_tile``),
Python ``if`` on loop-index predicates (which tiles of the causal mask need a matmul, a select or a copy),
those predicates as ``mask=`` arguments, ``nisa.affine_select`` over an ``nl.mgrid`` predicate, online softmax
over a ``sequential_range`` of large K/V tiles and a (batch, head) SPMD grid. No nsim imports; the sample's
2-space indentation kept. ``reference_flash_fwd`` is numpy of the same math (causal or not)."""
from dataclasses import dataclass

import numpy as np

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl
from neuronxcc.nki.language import par_dim

B_P_SIZE = 128
B_F_SIZE = 512


@dataclass(frozen=True)
class FlashConfig:
  """
    Config class for flash attention with default values
  """
  seq_tile_size:int = 2048
  attn_core_tile_size:int = 256
  training:bool = True
  should_transpose_v:bool = False
  lse_dtype: str = ""


@nki.jit(mode='trace')
def transpose_p_local(p_local_transposed, p_local, LARGE_TILE_SZ, B_F_SIZE=512):
  for i in nl.affine_range(LARGE_TILE_SZ // B_F_SIZE):
    # Temporarily disable use_dma_tranpose by default until we stablized it
    if nisa.get_nc_version() == nisa.nc_version.gen3 and False:
      p_local_t_tmp = nl.ndarray((par_dim(B_P_SIZE), B_F_SIZE), buffer=nl.sbuf, dtype=p_local.dtype)
    else:
      p_local_t_tmp = nl.ndarray((par_dim(B_P_SIZE), B_F_SIZE), buffer=nl.psum, dtype=np.float32)

    for j in nl.affine_range(B_F_SIZE // B_P_SIZE):
      j_128_slice = nl.ds(j * B_P_SIZE, B_P_SIZE)
      i_j_128_slice = nl.ds(i * B_F_SIZE + j * B_P_SIZE, B_P_SIZE)

      if nisa.get_nc_version() == nisa.nc_version.gen3 and False:
        p_local_t_tmp[:, j_128_slice] = nisa.dma_transpose(
          p_local[:, i_j_128_slice])
      else:
        p_local_t_tmp[:, j_128_slice] = nisa.nc_transpose(
          p_local[:, i_j_128_slice])

    p_local_transposed[:, nl.ds(i * B_F_SIZE, B_F_SIZE)] = nl.copy(
      p_local_t_tmp, dtype=p_local_transposed.dtype)


@nki.jit(mode='trace')
def dropout_p_local(p_local, dropout_p, dropout_p_tensor, seed_tensor,
                    seed_offset_base, k_r_i, REDUCTION_TILE):
  B_F_SIZE = 512
  for k_d_i in nl.sequential_range(REDUCTION_TILE // B_F_SIZE):
    p_local_f_slice = nl.ds(k_r_i * REDUCTION_TILE + k_d_i * B_F_SIZE, B_F_SIZE)

    offset = k_d_i + seed_offset_base
    offset_seed = nl.add(seed_tensor, offset, dtype=nl.int32)
    nl.random_seed(seed=offset_seed)
    softmax_dropout = nl.dropout(p_local[:, p_local_f_slice],
                                 rate=dropout_p_tensor[:, 0],
                                 dtype=np.float32)
    p_local[:, p_local_f_slice] = nl.multiply(
      softmax_dropout, 1 / (1 - dropout_p))


@nki.jit(mode='trace')
def _flash_attention_core(q_local_tile, k, v,
                          o_buffer, l_buffer, m_buffer,
                          batch_id, head_id, gqa_head_idx, q_tile_idx,
                          local_k_large_tile_idx,
                          kernel_dtype, acc_type,
                          flash_config: FlashConfig,
                          use_causal_mask, initialize,
                          B_P_SIZE=128, B_F_SIZE=512, B_D_SIZE=128,
                          dropout_p=0.0, dropout_p_tensor=None, seed_tensor=None,
                          logit_bias_tile=None
                          ):
  """
  The flash attention core function to calcualte self attention between a tile of q and a block of K and V.
  The q_local_tile has (B_P_SIZE, B_D_SIZE), which is loaded into the SBUF already. The block size of K and V
  is defined in the seq_tile_size of the flash_config. The results are stored in the following three buffers
  o_buffer: (B_P_SIZE, d)
  l_buffer: (B_P_SIZE, 1)
  m_buffer: (B_P_SIZE, 1)
  """
  LARGE_TILE_SZ = flash_config.seq_tile_size
  num_k_tile_per_large_tile = LARGE_TILE_SZ // B_F_SIZE

  qk_res_buf = nl.ndarray((par_dim(B_P_SIZE), LARGE_TILE_SZ), buffer=nl.sbuf, dtype=acc_type)
  max_local = nl.ndarray((par_dim(B_P_SIZE), num_k_tile_per_large_tile), dtype=acc_type)

  for k_i in nl.affine_range(num_k_tile_per_large_tile):
    k_i_b_f_slice = nl.ds(k_i * B_F_SIZE, B_F_SIZE)

    qk_psum = nl.zeros((par_dim(B_P_SIZE), B_F_SIZE),
                        dtype=np.float32, buffer=nl.psum)  # (128, 512)
    if use_causal_mask:
      multiplication_required_selection = q_tile_idx * B_P_SIZE >= local_k_large_tile_idx * LARGE_TILE_SZ + k_i * B_F_SIZE
    else:
      multiplication_required_selection = True

    if multiplication_required_selection:
      qk_psum[:, :] = nl.matmul(q_local_tile, k[:, k_i_b_f_slice], transpose_x=True) # (p(128), 512)

    if use_causal_mask:
      left_diagonal_selection = q_tile_idx * B_P_SIZE >= local_k_large_tile_idx * LARGE_TILE_SZ + (k_i + 1) * B_F_SIZE
      diagonal_and_right_selection = (q_tile_idx * B_P_SIZE < local_k_large_tile_idx * LARGE_TILE_SZ + (k_i + 1) * B_F_SIZE)
      right_diagonal_selection = ((q_tile_idx + 1) * B_P_SIZE <= local_k_large_tile_idx * LARGE_TILE_SZ + k_i * B_F_SIZE)
      diagonal = ((q_tile_idx * B_P_SIZE < local_k_large_tile_idx * LARGE_TILE_SZ + (k_i + 1) * B_F_SIZE) &
                  ((q_tile_idx + 1) * B_P_SIZE > local_k_large_tile_idx * LARGE_TILE_SZ + k_i * B_F_SIZE))
      i_q_p, i_q_f = nl.mgrid[0:B_P_SIZE, 0:B_F_SIZE]
      q_pos = q_tile_idx * B_P_SIZE + i_q_p
      k_pos = local_k_large_tile_idx * LARGE_TILE_SZ + k_i * B_F_SIZE + i_q_f
      pred = q_pos >= k_pos

      qk_select_tmp = nl.ndarray(qk_psum.shape, dtype=qk_psum.dtype, buffer=nl.sbuf)

      if logit_bias_tile is not None:
        if right_diagonal_selection:
          qk_select_tmp[...] = qk_psum

          # For tiles to the right of the diagonal, do affine_select.
          # Magic number -9984.0 to replace -inf similar to what neuronx-cc uses
          qk_res_buf[:, k_i_b_f_slice] = nisa.affine_select(
              pred=pred,
              on_true_tile=qk_select_tmp, on_false_value=-9984.0, dtype=acc_type)

        # For tiles on the diagonal, add logit bias and need to do affine_select.
        intermediate = \
            nl.add(qk_psum, logit_bias_tile[:, k_i_b_f_slice],
                  dtype=acc_type, mask=diagonal)
        qk_res_buf[:, k_i_b_f_slice] = nisa.affine_select(
            pred=pred,
            on_true_tile=intermediate, on_false_value=-9984.0, dtype=acc_type,
            mask=diagonal)

        # For tiles on the left of the diagonal, just add logit bias, no select required.
        qk_res_buf[:, k_i_b_f_slice] = nl.add(qk_psum, logit_bias_tile[:, k_i_b_f_slice],
                                              dtype=acc_type, mask=left_diagonal_selection)
      else:
        # For tiles on and to the right of the diagonal, need to do affine_select.
        # Magic number -9984.0 to replace -inf similar to what neuronx-cc uses
        qk_res_buf[:, k_i_b_f_slice] = nisa.affine_select(
            pred=pred,
            on_true_tile=qk_psum, on_false_value=-9984.0, dtype=acc_type,
            mask=diagonal_and_right_selection)

        # For tiles on the left of the diagonal, direct copy, no select required.
        qk_res_buf[:, k_i_b_f_slice] = \
          nl.copy(qk_psum, dtype=acc_type, mask=left_diagonal_selection)
    else:
      if logit_bias_tile is not None:
        # Simply add logit bias which copies back to sbuf at the same time
        qk_res_buf[:, k_i_b_f_slice] = \
            nl.add(qk_psum, logit_bias_tile[:, k_i_b_f_slice], dtype=acc_type)
      else:
        # Simply send psum result back to sbuf
        qk_res_buf[:, k_i_b_f_slice] = nl.copy(qk_psum, dtype=acc_type)

    # Calculate max of the current tile
    max_local[:, k_i] = nisa.tensor_reduce(
      np.max, qk_res_buf[:, k_i_b_f_slice], axis=(1,), dtype=acc_type,
      negate=False)

  max_ = nisa.tensor_reduce(np.max, max_local[:, :], axis=(1, ),
                            dtype=acc_type, negate=False)

  o_previous_scaled = nl.ndarray((par_dim(B_P_SIZE), B_D_SIZE), dtype=o_buffer.dtype)

  if initialize:
    m_buffer[:, 0] = nl.copy(max_)
    m_current = max_
  else:
    m_previous = nl.copy(m_buffer[:, 0])
    m_buffer[:, 0] = nl.maximum(m_previous, max_) # (128,1)

    m_current = m_buffer[:, 0]
    # Compute scaling factor
    alpha = nisa.activation(np.exp, m_previous, bias=-1*m_current, scale=1.0)
    o_previous_scaled[...] = nl.multiply(o_buffer[:, :], alpha)

  p_local = nl.ndarray((par_dim(B_P_SIZE), LARGE_TILE_SZ), dtype=kernel_dtype)
  REDUCTION_TILE = min(2048, LARGE_TILE_SZ // 2)

  p_partial_sum = nl.ndarray((par_dim(B_P_SIZE), LARGE_TILE_SZ // REDUCTION_TILE), dtype=acc_type)

  for k_r_i in nl.affine_range(LARGE_TILE_SZ // REDUCTION_TILE):
    k_r_i_reduce_slice = nl.ds(k_r_i * REDUCTION_TILE, REDUCTION_TILE)

    # compute exp(qk-max)
    # Compute partial row-tile sum of exp(qk-max))
    # FIXME: Use activation accumulate to accumulate over k_r_i loop?
    p_local[:, k_r_i_reduce_slice] = \
      nisa.activation_reduce(np.exp, qk_res_buf[:, k_r_i_reduce_slice],
                             bias=-1 * m_current, scale=1.0,
                             reduce_op=nl.add, reduce_res=p_partial_sum[:, k_r_i],
                             dtype=kernel_dtype)

    if dropout_p > 0.0:
      seed_offset_base = (batch_id * flash_config.seq_tile_size + gqa_head_idx) * 1024 + q_tile_idx
      dropout_p_local(p_local=p_local, dropout_p=dropout_p,
                      dropout_p_tensor=dropout_p_tensor, seed_tensor=seed_tensor,
                      seed_offset_base=seed_offset_base, k_r_i=k_r_i,
                      REDUCTION_TILE=REDUCTION_TILE)

  ps = nl.sum(p_partial_sum, axis=1, dtype=acc_type)

  p_local_transposed = nl.ndarray((par_dim(B_P_SIZE), LARGE_TILE_SZ), dtype=kernel_dtype)
  transpose_p_local(p_local_transposed=p_local_transposed, p_local=p_local,
                    LARGE_TILE_SZ=LARGE_TILE_SZ)

  pv_psum = nl.zeros((par_dim(B_P_SIZE), B_D_SIZE), dtype=np.float32,
                     buffer=nl.psum, lazy_initialization=True)
  for k_i in nl.affine_range(LARGE_TILE_SZ // B_P_SIZE):
    pv_psum[:, :] += nl.matmul(p_local_transposed[:, nl.ds(k_i * B_P_SIZE, B_P_SIZE)],
                               v[k_i, :, :], transpose_x=True) # (128, 128) (p(Br), d)

  if initialize:
    o_buffer[:, :] = nl.copy(pv_psum[:, :])
    l_buffer[:, 0] = nl.add(nl.log(ps), max_)
  else:
    o_buffer[:, :] = nl.add(o_previous_scaled, pv_psum)

    exp = nisa.activation(nl.exp, m_current, bias=l_buffer[:, 0], scale=-1.0)
    l_buffer[:, 0] = nl.add(m_current, nisa.activation(nl.log, exp, bias=ps))


@nki.jit(mode='trace')
def load_v_tile(v_hbm_tile, cur_v_tile, j, v_i, config):
  LARGE_TILE_SZ = config.seq_tile_size
  B_P_SIZE = 128

  if not config.should_transpose_v:
    cur_v_tile[v_i, :, :] = nl.load(
      v_hbm_tile[nl.ds(j * LARGE_TILE_SZ + B_P_SIZE * v_i, B_P_SIZE), :],
      dtype=cur_v_tile.dtype)
    return

  if nisa.get_nc_version() == nisa.nc_version.gen3:
    cur_v_tile_transposed = nisa.dma_transpose(
      v_hbm_tile[:, nl.ds(j * LARGE_TILE_SZ + B_P_SIZE * v_i, B_P_SIZE)])
    cur_v_tile[v_i, :, :] = nisa.tensor_copy(cur_v_tile_transposed,
                                             dtype=cur_v_tile.dtype)
    return

  cur_v_tile[v_i, :, :] = nl.load_transpose2d(
    v_hbm_tile[:, nl.ds(j * LARGE_TILE_SZ + B_P_SIZE * v_i, B_P_SIZE)],
    dtype=cur_v_tile.dtype)


@nki.jit
def flash_fwd(q, k, v, seed, logit_bias=None,
              softmax_scale=None,
              use_causal_mask=True,
              mixed_precision=True,
              dropout_p=0.0, config=None):
  """
  Flash Attention Forward kernel

  IO tensor layouts:
    - q: shape   (bs, n_heads, d, seq_q)
    - k: shape   (bs, nk_heads, d, seq_k)
    - v: shape   (bs, nv_heads, d, seq_v) if config.should_transpose_v  else (bs, nv_heads, seq_v, d)
    - seed: shape (1,)
    - logit_bias: shape (bs, n_heads, seq_q, seq_k)
    - o: shape (bs, n_heads, seq_q, d)
    - lse: shape (bs, n_heads, nl.tile_size.pmax, seq // nl.tile_size.pmax) if training else None
    - This kernel requires seq_k == seq_v

  IO tensor dtypes:
    - This kernel assumes all IO tensors have the same dtype
    - If mixed_precision is True, then all Tensor Engine operation will be performed in
      bfloat16 and accumulation will be performed in float32. Otherwise the intermediates
      will be in the same type as the inputs.

  Compile-time Constants:
    - softmax_scale: scaling for softmax, is None, default is `1.0/(d**0.5)`
    - mixed_precision: flag to set non-matmul ops in fp32 precision, default is set to `true`, if false, we use same precision as input types
    - causal_mask: flag to set causal masking
    - config: Instance of :class:`nki.kernels.attention.FlashConfig` with Performance config parameters for flash attention with default values
        seq_tile_size: `default=2048`, size of the kv tile size for attention computation reduction
        training: bool to indicate training vs inference `default=True`

  Performance Notes:
    For better performance, the kernel is tiled to be of size `config.seq_tile_size`, and Flash attention math techniques are applied in unit
    of `config.seq_tile_size`. Seqlen that is not divisible by `config.seq_tile_size` is not supported at the moment.

    For large seqlen, `o_buffer` will overflow the statebuf. the kernel is tile `o_buffer` based on the value of `config.attn_core_tile_size`.
    This is a tradeoff between memory usage and performance. The default value of `config.attn_core_tile_size` is 256, which means the `o_buffer`
    will roughly take half of the statebuf. The computes are also tiled accordingly. DMA will be rematerialized
    `seqlen_q // B_P_SIZE // attn_core_tile_size times`.



  GQA support Notes:
    the spmd kernel for launching kernel should be on kv_heads instead of nheads

  Example usage:
    MHA: q: [b, h, d, s], k: [b, h, d, s], v: [b, h, s, d]
      usage: `flash_fwd[b, h](q, k, v, ...)`
    GQA: q: [b, h, d, s], k: [b, kv_h, d, s], v: [b, kv_h, s, d]
      usage: `flash_fwd[b, kv_h](q, k, v, ...)`
  """
  config = config or FlashConfig()
  B_F_SIZE=512
  B_P_SIZE=128
  b, h, d, seqlen_q  = q.shape
  B_D_SIZE = d
  _, k_h, _, seqlen_k = k.shape
  if config.should_transpose_v:
    assert tuple(v.shape) == (b, k_h, d, seqlen_k), f"Expect shape of V to be {(b, k_h, d, seqlen_k)} (batch, heads, d_head, seqlen_k) but got {v.shape}"
    assert tuple(k.shape) == (b, k_h, d, seqlen_k), f"Expect shape of K to be {(b, k_h, d, seqlen_k)} (batch, heads, d_head, seqlen_k) but got {k.shape}"
  else:
    assert tuple(v.shape) == (b, k_h, seqlen_k, d), f"Expect shape of V to be {(b, k_h, seqlen_k, d)} (batch, heads, seqlen_k, d_head) but got {v.shape}"
    assert tuple(k.shape) == (b, k_h, d, seqlen_k), f"Expect shape of K to be {(b, k_h, d, seqlen_k)} (batch, heads, d_head, seqlen_k) but got {k.shape}"
  assert d <= 128, f" we do not support head_dim > 128, got head dim {d}"
  kernel_dtype = nl.bfloat16 if mixed_precision else q.dtype
  acc_type = np.dtype(np.float32) if mixed_precision else kernel_dtype

  o = nl.ndarray((b, h, seqlen_q, d), dtype=q.dtype, buffer=nl.shared_hbm)
  if config.training:
    if config.lse_dtype:
      lse_dtype = getattr(nl, config.lse_dtype)
    else:
      lse_dtype = acc_type
    lse = nl.ndarray((b, h, nl.tile_size.pmax, seqlen_q // nl.tile_size.pmax),
                     dtype=lse_dtype, buffer=nl.shared_hbm)
  else:
    lse = None

  assert nl.program_ndim() == 2,\
    f'Expect spmd grid with 2 dimensions, got {nl.program_ndim()} instead!'
  batch_id = nl.program_id(axis=0)
  head_id = nl.program_id(axis=1)

  softmax_scale = softmax_scale or (1.0 / (d ** 0.5))

  n_tile_q = seqlen_q // B_P_SIZE # since q will be loaded on tensor engine

  LARGE_TILE_SZ = config.seq_tile_size
  attn_core_tile_size = config.attn_core_tile_size

  # FIXME: Add masking for different seqlen values.
  assert config.seq_tile_size >= 512, f" seq tile_size {config.seq_tile_size} cannot be less than 512"
  assert seqlen_k % LARGE_TILE_SZ == 0, f"Need seqlen_k to be divisible by {LARGE_TILE_SZ} but got {seqlen_k}"
  num_large_k_tile = seqlen_k // LARGE_TILE_SZ

  # inference flag, check if lse is none
  inference = not config.training
  if inference:
    assert lse is None, "lse should be none for inference"
    assert seed is None, f"seed should be None for inference, but got {seed}"
    assert dropout_p==0.0, f"dropout should be 0.0 for inference but got {dropout_p}"
  else:
    assert lse is not None, "lse should not be none for training"
  q_h_per_k_h = h // k_h

  if dropout_p > 0.0 and not inference:
    seed_local = nl.load(seed[0])
    # TODO: Remove this once the dropout supports scale prob
    dropout_p_tensor = nl.full((B_P_SIZE, 1), fill_value=dropout_p, dtype=np.float32)
  else:
    dropout_p_tensor = None
    seed_local = None

  if logit_bias is not None:
    b_logit_bias, h_logit_bias, _, _ = logit_bias.shape
    assert b_logit_bias == 1 and h_logit_bias in [1, h], f"Only support broadcasting batch dim for logit_bias, got {logit_bias.shape}"
  else:
    h_logit_bias = None

  for i_q_h in nl.affine_range(q_h_per_k_h):

    # =============== Global Flash Attention accumulators ====================== #
    o_buffer = nl.zeros((n_tile_q, par_dim(B_P_SIZE), d), dtype=acc_type,
                        buffer=nl.sbuf, lazy_initialization=True)
    l_buffer = nl.zeros((par_dim(B_P_SIZE), n_tile_q), dtype=acc_type,
                        buffer=nl.sbuf, lazy_initialization=True)
    m_buffer = nl.zeros((n_tile_q, par_dim(B_P_SIZE), 1), dtype=acc_type,
                        buffer=nl.sbuf, lazy_initialization=True)
    # =============== Global Flash Attention accumulators END ================== #

    j = 0
    cur_k_tile = nl.ndarray((par_dim(B_D_SIZE), LARGE_TILE_SZ), dtype=kernel_dtype)
    cur_v_tile = nl.ndarray((LARGE_TILE_SZ // B_P_SIZE, par_dim(B_P_SIZE), B_D_SIZE), dtype=kernel_dtype)
    load_tile_size = B_P_SIZE
    cur_k_tile[:, nl.ds(0, LARGE_TILE_SZ)] = nl.load(k[batch_id, head_id, :, nl.ds(0, LARGE_TILE_SZ)])
    for v_i in nl.affine_range(LARGE_TILE_SZ // load_tile_size):
      load_v_tile(v_hbm_tile=v[batch_id, head_id], cur_v_tile=cur_v_tile, j=0, v_i=v_i, config=config)

    for i in nl.affine_range(n_tile_q):
      if logit_bias is not None:
        logit_bias_tile = nl.ndarray((par_dim(B_P_SIZE), LARGE_TILE_SZ), buffer=nl.sbuf, dtype=kernel_dtype)
        i_logit_bias_h = 0 if h_logit_bias == 1 else head_id * q_h_per_k_h + i_q_h
        logit_bias_tile[:, :] = nl.load(
          logit_bias[0, i_logit_bias_h, nl.ds(i * B_P_SIZE, B_P_SIZE), nl.ds(j * LARGE_TILE_SZ, LARGE_TILE_SZ)])
      else:
        logit_bias_tile = None

      q_tile = nl.ndarray((B_D_SIZE, B_P_SIZE),dtype=kernel_dtype)
      q_hbm_tile = q[batch_id, head_id * q_h_per_k_h + i_q_h]
      q_sbuf_tile = nl.load(q_hbm_tile[:, nl.ds(i * B_P_SIZE, B_P_SIZE)],
                            dtype=kernel_dtype) # load (d, 128) tile in SBUF
      q_tile[:, :] = q_sbuf_tile * softmax_scale
      _flash_attention_core(q_local_tile=q_tile, k=cur_k_tile, v=cur_v_tile,
                            o_buffer=o_buffer[i], l_buffer=l_buffer[:, i], m_buffer=m_buffer[i],
                            batch_id=batch_id, head_id=head_id,
                            gqa_head_idx=i_q_h, q_tile_idx=i, local_k_large_tile_idx=0,
                            kernel_dtype=kernel_dtype, acc_type=acc_type,
                            flash_config=config, use_causal_mask=use_causal_mask,
                            initialize=True,
                            B_P_SIZE=B_P_SIZE, B_F_SIZE=B_F_SIZE, B_D_SIZE=B_D_SIZE,
                            dropout_p=dropout_p, dropout_p_tensor=dropout_p_tensor,
                            seed_tensor=seed_local, logit_bias_tile=logit_bias_tile)

    for j in nl.sequential_range(1, num_large_k_tile):
      cur_k_tile = nl.ndarray((par_dim(B_D_SIZE), LARGE_TILE_SZ), dtype=kernel_dtype)
      cur_v_tile = nl.ndarray((LARGE_TILE_SZ // B_P_SIZE, par_dim(B_P_SIZE), B_D_SIZE), dtype=kernel_dtype)
      load_tile_size = B_P_SIZE
      cur_k_tile[:, nl.ds(0, LARGE_TILE_SZ)] = nl.load(k[batch_id, head_id, :, nl.ds(j*LARGE_TILE_SZ, LARGE_TILE_SZ)])
      for v_i in nl.affine_range(LARGE_TILE_SZ // load_tile_size):
        load_v_tile(v_hbm_tile=v[batch_id, head_id], cur_v_tile=cur_v_tile, j=j, v_i=v_i, config=config)

      for i in nl.affine_range(n_tile_q):
        if logit_bias is not None:
          logit_bias_tile = nl.ndarray((par_dim(B_P_SIZE), LARGE_TILE_SZ), buffer=nl.sbuf, dtype=kernel_dtype)
          i_logit_bias_h = 0 if h_logit_bias == 1 else head_id * q_h_per_k_h + i_q_h
          logit_bias_tile[:, :] = nl.load(
            logit_bias[0, i_logit_bias_h, nl.ds(i * B_P_SIZE, B_P_SIZE), nl.ds(j * LARGE_TILE_SZ, LARGE_TILE_SZ)])
        else:
          logit_bias_tile = None

        q_tile = nl.ndarray((B_D_SIZE, B_P_SIZE),dtype=kernel_dtype)
        q_hbm_tile = q[batch_id, head_id * q_h_per_k_h + i_q_h]
        q_sbuf_tile = nl.load(q_hbm_tile[:, nl.ds(i * B_P_SIZE, B_P_SIZE)],
                              dtype=kernel_dtype) # load (d, 128) tile in SBUF
        q_tile[:, :] = q_sbuf_tile * softmax_scale
        _flash_attention_core(q_local_tile=q_tile, k=cur_k_tile, v=cur_v_tile,
                              o_buffer=o_buffer[i], l_buffer=l_buffer[:, i], m_buffer=m_buffer[i],
                              batch_id=batch_id, head_id=head_id,
                              gqa_head_idx=i_q_h, q_tile_idx=i, local_k_large_tile_idx=j,
                              kernel_dtype=kernel_dtype, acc_type=acc_type,
                              flash_config=config, use_causal_mask=use_causal_mask,
                              initialize=False,
                              B_P_SIZE=B_P_SIZE, B_F_SIZE=B_F_SIZE, B_D_SIZE=B_D_SIZE,
                              dropout_p=dropout_p, dropout_p_tensor=dropout_p_tensor,
                              seed_tensor=seed_local, logit_bias_tile=logit_bias_tile)

    # -------- write output to buffer on HBM ------------ #
    for i in nl.affine_range(n_tile_q):
      out = nl.ndarray((par_dim(B_P_SIZE), B_D_SIZE), dtype=kernel_dtype)
      out[:, :] = nl.multiply(o_buffer[i, :, :], nl.exp(m_buffer[i, :, :] - l_buffer[:, i]),
                              dtype=kernel_dtype)

      nl.store(o[batch_id, head_id * q_h_per_k_h + i_q_h, nl.ds(i*B_P_SIZE, B_P_SIZE), :], out[:, :])
      if not inference:
        lse_local = nl.zeros((par_dim(B_P_SIZE), 1), dtype=acc_type)
        lse_local[:, 0] = nl.copy(l_buffer[:, i], dtype=acc_type)
        nl.store(lse[batch_id, head_id * q_h_per_k_h + i_q_h, :, i], lse_local[:, 0])

  if config.training:
    return o, lse

  return o


def reference_flash_fwd(q, k, v, use_causal_mask=True, softmax_scale=None, logit_bias=None):
  """numpy: o (b, h, s_q, d) and lse (b, h, 128, s_q // 128) of softmax(q^T k * scale [+ bias], causal) v."""
  q, k, v = (np.asarray(t, np.float32) for t in (q, k, v))
  b, h, d, sq = q.shape
  kh, sk = k.shape[1], k.shape[3]
  scale = softmax_scale or 1.0 / d ** 0.5
  kk = np.repeat(k, h // kh, axis=1)
  vv = np.repeat(v, h // kh, axis=1)
  s = np.einsum("bhdq,bhdk->bhqk", q * scale, kk)
  if logit_bias is not None:
    s = s + np.asarray(logit_bias, np.float32)
  if use_causal_mask:
    s = np.where(np.arange(sq)[:, None] >= np.arange(sk)[None, :], s, -9984.0)
  m = s.max(-1, keepdims=True)
  e = np.exp(s - m)
  l = e.sum(-1, keepdims=True)
  o = (e / l) @ vv
  lse = (m + np.log(l))[..., 0]  # (b, h, s_q)
  return o, lse.reshape(b, h, sq // 128, 128).transpose(0, 1, 3, 2)
