"""The flash attention backward kernel of the public nki-samples repository (``flash_attn_bwd``,
``src/nki_samples/reference/attention.py``), written as the sample writes it: trace-mode helpers
(``load_dy_q``, ``store_dk_dv``, ``load_kv``, ``compute_rowsum``, ``_flash_attn_bwd_core``), tile arrays with
the partition dimension in the middle (``(n, par_dim(128), f)``), ``nl.load_transpose2d``, the causal
predicate of loop indices passed as ``mask=`` to every instruction of a tile, ``nisa.affine_select`` over an
``nl.mgrid`` predicate, ``nisa.scalar_tensor_tensor``, PSUM accumulation across a loop
(``dk_psum[i] += nisa.nc_matmul(...)``), ``nl.loop_reduce`` into an SBUF accumulator, ``nl.random_seed`` /
``nl.dropout`` and a (batch, head) SPMD grid. No nsim imports; the sample's 2-space indentation kept.
``reference_flash_attn_bwd`` is numpy of the same math."""
import numpy as np

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl
from neuronxcc.nki.language import par_dim


def div_ceil(n, d):
  return (n + d - 1) // d


@nki.jit(mode='trace')
def load_dy_q(dy_ref_hbm_tile, q_ref_hbm_tile, dy_local, q_local, d_head_n_tiles, d_head_tile_size, i_q_seq_tile,
              q_seq_tile_size, softmax_scale):
  for i_d_head_tile in nl.affine_range(d_head_n_tiles):
    i_d_head_dslice = nl.ds(i_d_head_tile * d_head_tile_size, d_head_tile_size)
    i_q_seq_dslice = nl.ds(i_q_seq_tile * q_seq_tile_size, q_seq_tile_size)

    dy_local[i_d_head_tile, :, :] = nl.load(
      dy_ref_hbm_tile[i_d_head_dslice, i_q_seq_dslice],
      dtype=dy_local.dtype)

    q_local[i_d_head_tile, :, :] = nl.load(
      q_ref_hbm_tile[i_d_head_dslice, i_q_seq_dslice],
      dtype=q_local.dtype) * softmax_scale


@nki.jit(mode='trace')
def store_dk_dv(out_dk_ref_hbm_tile, out_dv_ref_hbm_tile, local_dk, local_dv,
                d_head_n_tiles, d_head_tile_size, i_k_seq_dslice):
  for i in nl.affine_range(d_head_n_tiles):
    i_d_head_dslice = nl.ds(i * d_head_tile_size, d_head_tile_size)

    nl.store(out_dv_ref_hbm_tile[i_d_head_dslice, i_k_seq_dslice],
             value=local_dv[i, :, :])

    nl.store(out_dk_ref_hbm_tile[i_d_head_dslice, i_k_seq_dslice],
             value=local_dk[i, :, :])


@nki.jit(mode='trace')
def load_kv(k_ref_hbm_tile, v_ref_hbm_tile, k_local, transposed_k_local, v_local,
            d_head_n_tiles, d_head_tile_size, i_k_seq_tile, k_seq_tile_size,
            k_seq_tile_size_backward):
  k_seq_n_tiles_backward = k_seq_tile_size // k_seq_tile_size_backward
  i_k_seq_dslice = nl.ds(i_k_seq_tile * k_seq_tile_size, k_seq_tile_size)
  for i_d_head_tile in nl.affine_range(d_head_n_tiles):
    i_d_head_dslice = nl.ds(i_d_head_tile * d_head_tile_size, d_head_tile_size)
    k_local[i_d_head_tile, :, :] = nl.load(
      k_ref_hbm_tile[i_d_head_dslice, i_k_seq_dslice],
      dtype=k_local.dtype)
    v_local[i_d_head_tile, :, :] = nl.load(
      v_ref_hbm_tile[i_d_head_dslice, i_k_seq_dslice],
      dtype=v_local.dtype)
    ##############################################################
    # Prefetch k transpose for the backward too
    ##############################################################
    for i_k_seq_tile_backward in nl.affine_range(k_seq_n_tiles_backward):
      i_k_seq_dslice_backward = nl.ds(i_k_seq_tile_backward * k_seq_tile_size_backward, k_seq_tile_size_backward)
      transposed_k_local[i_k_seq_tile_backward, i_d_head_tile, :, :] = nisa.nc_transpose(
        k_local[i_d_head_tile, :, i_k_seq_dslice_backward])


@nki.jit(mode='trace')
def compute_rowsum(dy_o_sum, dy_ref_hbm_tile, o_ref_hbm_tile, d_head_n_tiles, d_head_tile_size, q_seq_n_tiles,
                   q_seq_tile_size):
  mixed_dtype = dy_o_sum.dtype
  for i in nl.affine_range(q_seq_n_tiles):
    dy_o_partial = nl.zeros((par_dim(q_seq_tile_size), d_head_n_tiles), dtype=mixed_dtype)
    for j in nl.affine_range(d_head_n_tiles):
      d_head_dslice = nl.ds(j * d_head_tile_size, d_head_tile_size)
      q_seq_dslice = nl.ds(i * q_seq_tile_size, q_seq_tile_size)

      dy_local = nl.load_transpose2d(dy_ref_hbm_tile[d_head_dslice, q_seq_dslice],
                                     dtype=mixed_dtype)
      o_local = nl.load_transpose2d(o_ref_hbm_tile[d_head_dslice, q_seq_dslice],
                                    dtype=mixed_dtype)

      dy_o = nl.multiply(dy_local, o_local, dtype=mixed_dtype)
      dy_o_partial[:, j] = nisa.tensor_reduce(np.add, data=dy_o, axis=(1,),
                                              dtype=mixed_dtype)

    dy_o_sum[i, :, 0] = nisa.tensor_reduce(np.add, data=dy_o_partial[:, :],
                                           axis=(1,), dtype=mixed_dtype)


@nki.jit
def flash_attn_bwd(
  q_ref, k_ref, v_ref, o_ref,
  dy_ref,
  lse_ref,
  seed_ref,
  logit_bias_ref=None,
  use_causal_mask=False,
  mixed_precision=False,
  dropout_p=0.0,
  softmax_scale=None,
):
  """
  Flash attention backward kernel. Compute the backward gradients.

  IO tensor layouts:
   - q_ref: shape (bs, nheads, head_size, seq)
   - k_ref: shape (bs, nheads, head_size, seq)
   - v_ref: shape (bs, nheads, head_size, seq)
   - o_ref: shape (bs, nheads, head_size, seq)
   - dy_ref: shape (bs, nheads, head_size, seq)
   - lse_ref: shape (bs, nheads, nl.tile_size.pmax, seq // nl.tile_size.pmax)
   - seed_ref: shape (1,)
   - logit_bias_ref: shape (bs, n_heads, seq_q, seq_k)
   - out_dq_ref: shape (bs, nheads, head_size, seq)
   - out_dk_ref: shape (bs, nheads, head_size, seq)
   - out_dv_ref: shape (bs, nheads, head_size, seq)

  Detailed steps:
    1. D = rowsum(dO ◦ O) (pointwise multiply)

    2. Recompute (softmax(Q^T@K + logic_bias))

      2.1 Q^T@K
      2.2 Scale the QK score
      2.3 Apply causal mask and add logit_bias
      2.4 softmax

    3. Compute the gradients of y = score @ V with respect to the loss

    4. Compute the gradients of y = softmax(x)

    5. Compute the gradients of Q^T@K

      4.1 Compute dQ
      4.2 Compute dK
  """

  # Get the program ID
  batch_id = nl.program_id(axis=0)
  head_id = nl.program_id(axis=1)

  assert q_ref.dtype == k_ref.dtype == v_ref.dtype == o_ref.dtype == dy_ref.dtype, \
    "Input tensor dtypes must match"

  kernel_dtype = q_ref.dtype
  mixed_dtype = np.dtype(np.float32) if mixed_precision else kernel_dtype

  bs, nheads, d_head, seqlen_q = q_ref.shape
  _, _, _, seqlen_k = k_ref.shape

  assert tuple(k_ref.shape) == (bs, nheads, d_head, seqlen_k), \
    f"Input K shape mismatch, got {k_ref.shape}"
  assert tuple(v_ref.shape) == (bs, nheads, d_head, seqlen_k), \
    f"Input V shape mismatch, got {v_ref.shape}"
  assert tuple(o_ref.shape) == (bs, nheads, d_head, seqlen_q), \
    f"Input o shape mismatch, got {o_ref.shape}"
  assert tuple(dy_ref.shape) == (bs, nheads, d_head, seqlen_q), \
    f"Input dy shape mismatch, got {dy_ref.shape}"
  assert tuple(lse_ref.shape) == (bs, nheads, nl.tile_size.pmax, seqlen_q // nl.tile_size.pmax), \
    f"Input lse shape mismatch, got {lse_ref.shape}"
  if seed_ref is not None:
    assert tuple(seed_ref.shape) == (1,), \
      f"Input seed shape mismatch, got {seed_ref.shape}"

  out_dq_ref = nl.ndarray((bs, nheads, d_head, seqlen_q), dtype=q_ref.dtype,
                          buffer=nl.shared_hbm)
  out_dk_ref = nl.ndarray((bs, nheads, d_head, seqlen_k), dtype=q_ref.dtype,
                          buffer=nl.shared_hbm)
  out_dv_ref = nl.ndarray((bs, nheads, d_head, seqlen_k), dtype=q_ref.dtype,
                          buffer=nl.shared_hbm)

  # FIXME: Add masking for different seqlen values.
  assert seqlen_q % 128 == 0 and seqlen_k % 128 == 0, \
    f"Input sequence length must be divisible by 128, got seqlen_q == {seqlen_q} and seqlen_k == {seqlen_k}"

  # Softmax scaling factor, multiplied onto Q
  softmax_scale = softmax_scale or 1.0 / float(d_head ** 0.5)

  assert nl.tile_size.pmax == 128 and nl.tile_size.gemm_stationary_fmax == 128, \
    "Unsupported hardware"

  # Different batch samples/attention heads have independent attention
  batch_id = nl.program_id(axis=0)
  head_id = nl.program_id(axis=1)

  q_seq_n_tiles, q_seq_tile_size = div_ceil(seqlen_q, 128), 128
  d_head_n_tiles, d_head_tile_size = div_ceil(d_head, 128), min(d_head, 128)

  if seqlen_k >= 512:
    k_seq_n_tiles, k_seq_tile_size = seqlen_k // 512, 512
  else:
    k_seq_n_tiles, k_seq_tile_size = seqlen_k // 128, 128

  k_seq_n_tiles_backward, k_seq_tile_size_backward = seqlen_k // 128, 128
  k_seq_fwd_bwd_tile_multipler = k_seq_tile_size // k_seq_tile_size_backward

  ##############################################################
  # Step 2.4 Prefetch exp bias for softmax
  ##############################################################
  softmax_exp_bias = nl.zeros((par_dim(q_seq_tile_size), q_seq_n_tiles), dtype=mixed_dtype)
  lse_local = nl.zeros((par_dim(q_seq_tile_size), q_seq_n_tiles), dtype=mixed_dtype)
  lse_local[:, nl.ds(0, q_seq_n_tiles)] = nl.load(lse_ref[batch_id, head_id, :, :])
  softmax_exp_bias[:, nl.ds(0, q_seq_n_tiles)] = lse_local * -1.0

  ##############################################################
  # Step 1 Compute rowsum(dO ◦ O)
  ##############################################################
  dy_o_sum = nl.ndarray((q_seq_n_tiles, par_dim(q_seq_tile_size), 1), dtype=mixed_dtype)
  compute_rowsum(dy_o_sum=dy_o_sum,
                 dy_ref_hbm_tile=dy_ref[batch_id, head_id],
                 o_ref_hbm_tile=o_ref[batch_id, head_id],
                 d_head_n_tiles=d_head_n_tiles,
                 d_head_tile_size=d_head_tile_size,
                 q_seq_n_tiles=q_seq_n_tiles,
                 q_seq_tile_size=q_seq_tile_size)

  if dropout_p > 0.0:
    seed_local = nl.load(seed_ref[0])
    # TODO: Remove this once the dropout supports scale prob
    dropout_p_local = nl.full((q_seq_tile_size, 1), fill_value=dropout_p, dtype=np.float32)
  else:
    seed_local = None
    dropout_p_local = None

  dq_local_reduced = nl.zeros((q_seq_n_tiles, d_head_n_tiles, par_dim(d_head_tile_size), q_seq_tile_size),
                              dtype=mixed_dtype)

  # affine_range give the compiler permission to vectorize instructions
  # inside the loop which improves the performance. However, when using the
  # the dropout we should use sequential_range to avoid setting
  # seed vectorization. TODO: the compiler should avoid vectorizing seed setting
  _range = nl.sequential_range if dropout_p > 0.0 else nl.affine_range

  for i_k_seq_tile in _range(k_seq_n_tiles):
    i_k_seq_dslice = nl.ds(i_k_seq_tile * k_seq_tile_size, k_seq_tile_size)

    # Prefetch V, K
    v_local = nl.ndarray((d_head_n_tiles, par_dim(d_head_tile_size), k_seq_tile_size), dtype=kernel_dtype)
    k_local = nl.ndarray((d_head_n_tiles, par_dim(d_head_tile_size), k_seq_tile_size), dtype=kernel_dtype)
    transposed_k_local = nl.ndarray((k_seq_fwd_bwd_tile_multipler, d_head_n_tiles,
                                   par_dim(k_seq_tile_size_backward), d_head_tile_size), dtype=kernel_dtype)

    load_kv(k_ref_hbm_tile=k_ref[batch_id, head_id],
            v_ref_hbm_tile=v_ref[batch_id, head_id],
            k_local=k_local,
            transposed_k_local=transposed_k_local,
            v_local=v_local,
            d_head_n_tiles=d_head_n_tiles,
            d_head_tile_size=d_head_tile_size,
            i_k_seq_tile=i_k_seq_tile,
            k_seq_tile_size=k_seq_tile_size,
            k_seq_tile_size_backward=k_seq_tile_size_backward)

    # FIXME: Pass sbuf instead, we will have psum spilling in the current implementation
    dv_psum = nl.zeros((d_head_n_tiles, par_dim(d_head_tile_size), k_seq_tile_size),
                       dtype=np.float32, buffer=nl.psum)
    dk_psum = nl.zeros((d_head_n_tiles, par_dim(d_head_tile_size), k_seq_tile_size),
                       dtype=np.float32, buffer=nl.psum)
    for i_q_seq_tile in _range(q_seq_n_tiles):
      # Prefetch dy, Q
      dy_local = nl.ndarray((d_head_n_tiles, par_dim(d_head_tile_size), q_seq_tile_size), dtype=kernel_dtype)
      q_local = nl.ndarray((d_head_n_tiles, par_dim(d_head_tile_size), q_seq_tile_size), dtype=kernel_dtype)

      load_dy_q(dy_ref_hbm_tile = dy_ref[batch_id, head_id],
                q_ref_hbm_tile = q_ref[batch_id, head_id],
                dy_local=dy_local,
                q_local=q_local,
                d_head_n_tiles=d_head_n_tiles,
                d_head_tile_size=d_head_tile_size,
                i_q_seq_tile=i_q_seq_tile,
                q_seq_tile_size=q_seq_tile_size,
                softmax_scale=softmax_scale)

      logit_bias_tile = None
      if logit_bias_ref is not None:
        i_q_seq_dslice = nl.ds(i_q_seq_tile * q_seq_tile_size, q_seq_tile_size)
        logit_bias_tile = nl.ndarray((par_dim(q_seq_tile_size), k_seq_tile_size),
                                     buffer=nl.sbuf, dtype=kernel_dtype)
        logit_bias_tile[:, :] = nl.load(
          logit_bias_ref[batch_id, head_id, i_q_seq_dslice, i_k_seq_dslice])

      _flash_attn_bwd_core(
        q_local=q_local, k_local=k_local, transposed_k_local=transposed_k_local,
        v_local=v_local, dy_local=dy_local,
        dk_psum=dk_psum, dv_psum=dv_psum, dq_local_reduced=dq_local_reduced,
        softmax_exp_bias=softmax_exp_bias, dy_o_sum=dy_o_sum,
        local_i_q_seq_tile=i_q_seq_tile, local_i_k_seq_tile=i_k_seq_tile,
        seqlen_q=seqlen_q, seqlen_k=seqlen_k, d_head=d_head, nheads=nheads,
        use_causal_mask=use_causal_mask,
        kernel_dtype=kernel_dtype, mixed_dtype=mixed_dtype,
        softmax_scale=softmax_scale,
        seed_local=seed_local, dropout_p=dropout_p, dropout_p_local=dropout_p_local,
        logit_bias_tile=logit_bias_tile
      )

    # Write dK, dV
    store_dk_dv(out_dk_ref_hbm_tile=out_dk_ref[batch_id, head_id],
                out_dv_ref_hbm_tile=out_dv_ref[batch_id, head_id],
                local_dk=dk_psum,
                local_dv=dv_psum,
                i_k_seq_dslice=i_k_seq_dslice,
                d_head_n_tiles=d_head_n_tiles,
                d_head_tile_size=d_head_tile_size)

  # Write dQ
  for i_q_seq_tile in nl.affine_range(q_seq_n_tiles):
    for i_d_head_tile in nl.affine_range(d_head_n_tiles):
      i_q_seq_dslice = nl.ds(i_q_seq_tile * q_seq_tile_size, q_seq_tile_size)
      i_d_head_dslice = nl.ds(i_d_head_tile * d_head_tile_size, d_head_tile_size)
      nl.store(
        out_dq_ref[batch_id, head_id, i_d_head_dslice, i_q_seq_dslice],
        value=dq_local_reduced[i_q_seq_tile, i_d_head_tile, :, :],
      )

  return out_dq_ref, out_dk_ref, out_dv_ref


@nki.jit(mode='trace')
def _flash_attn_bwd_core(
  q_local, k_local, transposed_k_local, v_local, dy_local,
  dk_psum, dv_psum, dq_local_reduced,
  softmax_exp_bias, dy_o_sum,
  local_i_q_seq_tile, local_i_k_seq_tile,
  seqlen_q, seqlen_k, d_head, nheads,
  use_causal_mask,
  kernel_dtype, mixed_dtype,
  softmax_scale,
  seed_local, dropout_p, dropout_p_local,
  global_i_q_seq_tile = None,
  global_i_k_seq_tile = None,
  logit_bias_tile = None,
):
  """
  The flash backward core funciton to calculate the gradients of Q, K and V
  of the given tiles. The result will be accumulated into the dk, dv, dq psum
  """
  q_seq_n_tiles, q_seq_tile_size = div_ceil(seqlen_q, 128), 128
  d_head_n_tiles, d_head_tile_size = div_ceil(d_head, 128), min(d_head, 128)
  if seqlen_k >= 512:
    k_seq_n_tiles, k_seq_tile_size = seqlen_k // 512, 512
  else:
    k_seq_n_tiles, k_seq_tile_size = seqlen_k // 128, 128
  k_seq_n_tiles_backward, k_seq_tile_size_backward = seqlen_k // 128, 128
  k_seq_fwd_bwd_tile_multipler = k_seq_tile_size // k_seq_tile_size_backward

  if global_i_q_seq_tile is None:
    global_i_q_seq_tile = local_i_q_seq_tile
    global_i_k_seq_tile = local_i_k_seq_tile

  batch_id = nl.program_id(axis=0)
  head_id = nl.program_id(axis=1)

  mask = global_i_q_seq_tile * q_seq_tile_size >= global_i_k_seq_tile * k_seq_tile_size if use_causal_mask else None
  # PSUM buffer shape: [q_seq_tile_size free, k_seq_tile_size]
  qk_psum = nl.zeros((par_dim(q_seq_tile_size), k_seq_tile_size),
                      dtype=np.float32, buffer=nl.psum)
  qk_res_buf = nl.ndarray((par_dim(q_seq_tile_size), k_seq_tile_size), buffer=nl.sbuf, dtype=kernel_dtype)

  # Loop over contraction dim of QK matmul
  for i_d_head_tile in nl.affine_range(d_head_n_tiles):
    ##############################################################
    # Step 2.1 Compute Q^T@K, with matmul(stationary=tensor_q, moving=tensor_k, contract=d_head)
    ##############################################################
    qk_psum[:, :] += nisa.nc_matmul(q_local[i_d_head_tile, :, :],
                                    k_local[i_d_head_tile, :, :],
                                    mask=mask)

  ######################################
  # Step 2.2. Apply optional causal mask
  ######################################
  if use_causal_mask:
    iq, ik = nl.mgrid[0:q_seq_tile_size, 0:k_seq_tile_size]
    causal_pred = (global_i_q_seq_tile * q_seq_tile_size + iq >= global_i_k_seq_tile * k_seq_tile_size + ik)
    if logit_bias_tile is not None:
      # Magic number -9984.0 to replace -inf similar to what neuronx-cc uses
      qk_res_buf[:, :] = nisa.affine_select(
        pred=causal_pred,
        on_true_tile=qk_psum[:, :], on_false_value=-9984.0, dtype=mixed_dtype,
        mask=mask
      )
      qk_res_buf[:, :] = nisa.tensor_tensor(qk_res_buf[:, :], logit_bias_tile[:, :],
                                            op=np.add, dtype=kernel_dtype, mask=mask)
    else:
      # Magic number -9984.0 to replace -inf similar to what neuronx-cc uses
      qk_res_buf[:, :] = nisa.affine_select(
        pred=causal_pred,
        on_true_tile=qk_psum[:, :], on_false_value=-9984.0, dtype=kernel_dtype,
        mask=mask)
  else:
    if logit_bias_tile is not None:
      # Simply add logit bias which copies back to sbuf at the same time
      qk_res_buf[:, :] = nisa.tensor_tensor(qk_psum[:, :], logit_bias_tile[:, :],
                                            op=np.add, dtype=kernel_dtype)
    else:
      # Simply send psum result back to sbuf
      qk_res_buf[:, :] = nl.copy(qk_psum[:, :], dtype=kernel_dtype)

  softmax_y = nl.ndarray((par_dim(q_seq_tile_size), k_seq_tile_size), dtype=kernel_dtype, buffer=nl.sbuf)
  softmax_y[:, :] = nisa.activation(np.exp,
                                    data=qk_res_buf[:, :],
                                    bias=softmax_exp_bias[:, local_i_q_seq_tile],
                                    scale=1.0,
                                    mask=mask)
  #####################################################################
  # Dropout
  #####################################################################
  if dropout_p > 0.0:
    offset = global_i_k_seq_tile + global_i_q_seq_tile * k_seq_n_tiles \
              + head_id * k_seq_n_tiles * q_seq_n_tiles \
              + batch_id * nheads * k_seq_n_tiles * q_seq_n_tiles
    offset_seed = nl.add(seed_local, offset, mask=mask)
    nl.random_seed(seed=offset_seed, mask=mask)
    softmax_y[:, :] = nl.dropout(softmax_y[:, :], rate=dropout_p_local[:, 0], mask=mask)
    softmax_y[:, :] = nl.multiply(softmax_y[:, :], 1 / (1 - dropout_p), mask=mask)

  #####################################################################
  # Step 3.1 Calculate the backward gradients dL/dV, where y=softmax@V
  # in value projection with matmul(stationary=dy, moving=softmax)
  #####################################################################
  for i_d_head_tile in nl.affine_range(d_head_n_tiles):
    trans_dy = nisa.nc_transpose(dy_local[i_d_head_tile, :, :],
                                 mask=mask)
    dv_psum[i_d_head_tile, :, :] += nisa.nc_matmul(trans_dy,
                                                   softmax_y[:, :],
                                                   mask=mask)

  #####################################################################
  # Step 3.2 Calculate the backward gradients dL/dsoftmax, where y=softmax@V
  # in value projection with matmul(stationary=dy, moving=v)
  #####################################################################
  softmax_dy_psum = nl.zeros((par_dim(q_seq_tile_size), k_seq_tile_size),
                             dtype=np.float32, buffer=nl.psum)
  for i_d_head_tile in nl.affine_range(d_head_n_tiles):
    softmax_dy_psum[:, :] += nisa.nc_matmul(dy_local[i_d_head_tile, :, :],
                                            v_local[i_d_head_tile, :, :],
                                            mask=mask)

  softmax_dy = nl.ndarray((par_dim(q_seq_tile_size), k_seq_tile_size), dtype=kernel_dtype, buffer=nl.sbuf)
  softmax_dy[:, :] = nl.copy(softmax_dy_psum[:, :], dtype=kernel_dtype,
                             mask=mask)

  #####################################################################
  # Step 4 Calculate the softmax backward gradients dL/dx, where y=softmax(x)
  # dL/dx = y * (dL/dy - rowsum(dO_O)), where y = softmax(x)
  #####################################################################
  softmax_dx_local = nl.ndarray((par_dim(q_seq_tile_size), k_seq_tile_size), dtype=kernel_dtype, buffer=nl.sbuf)
  softmax_dx_local[:, :] = nisa.scalar_tensor_tensor(data=softmax_dy[:, :],
                                                     op0=np.subtract,
                                                     operand0=dy_o_sum[local_i_q_seq_tile, :, 0],
                                                     op1=np.multiply,
                                                     operand1=softmax_y[:, :],
                                                     mask=mask)

  #####################################################################
  # Step 5.1 Calculate dK, with matmul(stationary=Q, moving=softmax_dx)
  #####################################################################
  for i_d_head_tile in nl.affine_range(d_head_n_tiles):
    trans_q_local = nisa.nc_transpose(q_local[i_d_head_tile, :, :],
                                      mask=mask)
    dk_psum[i_d_head_tile, :, :] += nisa.nc_matmul(trans_q_local,
                                                   softmax_dx_local[:, :],
                                                   mask=mask)

  #####################################################################
  # Step 5.2 Calculate dQ
  #####################################################################
  for i_d_head_tile in nl.affine_range(d_head_n_tiles):
    dq_psum = nl.zeros((par_dim(d_head_tile_size), q_seq_tile_size),
                       dtype=np.float32, buffer=nl.psum)
    for i_k_seq_tile_backward in nl.affine_range(k_seq_fwd_bwd_tile_multipler):
      i_k_seq_dslice = nl.ds(i_k_seq_tile_backward * k_seq_tile_size_backward,
                             k_seq_tile_size_backward)
      transposed_softmax_dx_local = nisa.nc_transpose(softmax_dx_local[:, i_k_seq_dslice],
                                                      mask=mask)
      dq_psum[:, :] += nisa.nc_matmul(transposed_k_local[i_k_seq_tile_backward, i_d_head_tile, :, :],
                                      transposed_softmax_dx_local,
                                      mask=mask)
    dq_local = nl.multiply(dq_psum[:, :], softmax_scale, dtype=kernel_dtype, mask=mask)
    dq_local_reduced[local_i_q_seq_tile, i_d_head_tile, :, :] = nl.loop_reduce(
      dq_local, op=np.add, loop_indices=(global_i_k_seq_tile,),
      dtype=mixed_dtype, mask=mask)


def reference_flash_attn_bwd(q, k, v, dy, causal, softmax_scale=None, logit_bias=None):
  """numpy, float64: the forward pass (o and the log-sum-exp in the kernel's lse layout) and the gradients
  dq, dk, dv of sum(o * dy), all in the kernel's (b, h, d, s) layout."""
  q, k, v, dy = (x.astype(np.float64) for x in (q, k, v, dy))
  d, sq = q.shape[2], q.shape[3]
  sk = k.shape[3]
  scale = softmax_scale or 1.0 / float(d ** 0.5)
  s = np.einsum("bhdq,bhdk->bhqk", q, k) * scale
  if logit_bias is not None:
    s = s + logit_bias.astype(np.float64)
  if causal:
    s = np.where(np.tril(np.ones((sq, sk), dtype=bool)), s, -np.inf)
  m = s.max(axis=-1, keepdims=True)
  lse = m + np.log(np.exp(s - m).sum(axis=-1, keepdims=True))
  p = np.exp(s - lse)
  o = np.einsum("bhqk,bhdk->bhdq", p, v)
  dp = np.einsum("bhdq,bhdk->bhqk", dy, v)
  ds = p * (dp - (dy * o).sum(axis=2)[..., None])
  dq = np.einsum("bhqk,bhdk->bhdq", ds, k) * scale
  dk = np.einsum("bhqk,bhdq->bhdk", ds, q) * scale
  dv = np.einsum("bhqk,bhdq->bhdk", p, dy)
  b, h = q.shape[:2]
  lse_tiles = lse[..., 0].reshape(b, h, sq // 128, 128).transpose(0, 1, 3, 2)
  return o, lse_tiles, dq, dk, dv
