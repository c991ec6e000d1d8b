"""The manually allocated fused self-attention for Stable Diffusion's small head size, of the public nki-samples
repository (``allocated_fused_self_attn_for_SD_small_head_size``, ``src/nki_samples/reference/allocated_attention.py``):
the tutorial's ``fused_self_attn_for_SD_small_head_size`` with every tile placed by hand
(``@nki.compiler.skip_middle_end_transformations``, ``ncc.sbuf.mod_alloc(base_addr=sca, num_free_tiles=...)``
with a running SBUF address ``sca``, ``ncc.psum.mod_alloc(base_bank=..., num_bank_tiles=...)``), one batch per
SPMD program (``nl.program_id(0)``), Q and K in ``(bs, d_head, seq)`` layout and the output transposed
``(bs, d_head, seq)``.

Written from memory of the nki-samples source, in the sample's own style (Beta-1 dialect, 2-space indentation,
``nl.arange`` index tiles); small deviations from the published code (in particular the exact addresses) are
possible. No nsim imports."""
import numpy as np

import neuronxcc.nki as nki
import neuronxcc.nki.compiler as ncc
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl
from neuronxcc.nki.language import par_dim


@nki.compiler.enable_stack_allocator
@nki.compiler.skip_middle_end_transformations
@nki.jit
def allocated_fused_self_attn_for_SD_small_head_size(q_ref, k_ref, v_ref,
                                                     use_causal_mask=False,
                                                     mixed_precision=True):
  """
  Allocated fused self attention kernel for small head size Stable Diffusion workload.

  Computes (softmax(Q.T@K)V).T. The wired layout is chosen to avoid transpose as
  much as possible to simplify the debug. The kernel uses the AV matmul as the
  stationary operand to maximize the utilization of the PE array.

  IO tensor layouts:
   - q_ptr: shape   (bs, d_heads, seq_q)
   - k_ptr: shape   (bs, d_heads, seq_k)
   - v_ptr: shape   (bs, seq_v, n_heads)
   - out_ptr: shape (bs, d_heads, seq_q)
   - We use seq_q and seq_k just for clarity, this kernel requires seq_q == seq_k

  IO tensor dtypes:
   - This kernel assumes all IO tensors have the same dtype
   - If mixed_precision is True, then all Tensor Engine operation will be performed in
     bfloat16 and accumulation will be performed in float32. Otherwise the intermediates
     will be in the same type as the inputs.
  """
  # Use q_ref dtype as the intermediate tensor dtype
  # Assume all IO tensors have the same dtype
  kernel_dtype = np.float32
  pe_in_dt = nl.bfloat16 if mixed_precision else kernel_dtype

  kernel_dtype_itemsize = np.dtype(kernel_dtype).itemsize
  pe_in_dt_itemsize = np.dtype(pe_in_dt).itemsize
  assert q_ref.dtype == k_ref.dtype == v_ref.dtype

  # Shape checking
  bs, d_head, seqlen = q_ref.shape
  assert d_head <= 128, "Cannot use this kernel for d_head > 128"
  assert tuple(q_ref.shape) == (bs, d_head, seqlen), 'Input shape mismatch!'
  assert tuple(k_ref.shape) == (bs, d_head, seqlen), 'Input shape mismatch!'
  assert tuple(v_ref.shape) == (bs, seqlen, d_head), \
    f'Input shape mismatch! Expected: {(bs, seqlen, d_head)} Actual: {tuple(v_ref.shape)}'

  out_ref = nl.ndarray((bs, d_head, seqlen), dtype=q_ref.dtype, buffer=nl.shared_hbm)

  # Softmax scaling factor, multiplied onto Q
  softmax_scale = 0.125

  # Different batch samples/attention heads have independent attention
  batch_id = nl.program_id(axis=0)

  q_seq_n_tiles, q_seq_tile_size = seqlen // 128, 128
  k_seq_n_tiles, k_seq_tile_size = seqlen // 128, 128
  # No tiling on d_head dimension since the number of d_head fits in SB
  d_head_tile_size = d_head
  v_seq_n_tiles, v_seq_tile_size = seqlen // 128, 128

  # The next free byte of every SBUF partition
  sca = 0

  ###################################
  # Step 1. preload tensors
  ###################################
  v_local = nl.ndarray((v_seq_n_tiles, par_dim(v_seq_tile_size), d_head_tile_size), dtype=pe_in_dt,
                       buffer=ncc.sbuf.mod_alloc(base_addr=sca, num_free_tiles=(v_seq_n_tiles, )))
  sca += v_seq_n_tiles * d_head_tile_size * pe_in_dt_itemsize

  for i_v_seq_tile in nl.affine_range(v_seq_n_tiles):
    ip_v = nl.arange(v_seq_tile_size)[:, None]
    if_v = nl.arange(d_head_tile_size)[None, :]
    v_local[i_v_seq_tile, ip_v, if_v] = nl.load(
      v_ref[batch_id, i_v_seq_tile * k_seq_tile_size + ip_v, if_v],
      dtype=pe_in_dt)

  q_local = nl.ndarray((q_seq_n_tiles, par_dim(d_head_tile_size), q_seq_tile_size), dtype=pe_in_dt,
                       buffer=ncc.sbuf.mod_alloc(base_addr=sca, num_free_tiles=(q_seq_n_tiles, )))
  sca += q_seq_n_tiles * q_seq_tile_size * pe_in_dt_itemsize
  ip_q = nl.arange(d_head_tile_size)[:, None]
  if_q = nl.arange(q_seq_tile_size)[None, :]
  for i_q_seq_tile in nl.affine_range(q_seq_n_tiles):
    q_local[i_q_seq_tile, ip_q, if_q] = nl.load(
      q_ref[batch_id, ip_q, i_q_seq_tile * q_seq_tile_size + if_q],
      dtype=pe_in_dt) * softmax_scale

  k_local = nl.ndarray((k_seq_n_tiles, par_dim(d_head_tile_size), k_seq_tile_size), dtype=pe_in_dt,
                       buffer=ncc.sbuf.mod_alloc(base_addr=sca, num_free_tiles=(k_seq_n_tiles, )))
  sca += k_seq_n_tiles * k_seq_tile_size * pe_in_dt_itemsize
  ip_k = nl.arange(d_head_tile_size)[:, None]
  if_k = nl.arange(k_seq_tile_size)[None, :]
  for i_k_seq_tile in nl.affine_range(k_seq_n_tiles):
    k_local[i_k_seq_tile, ip_k, if_k] = nl.load(
      k_ref[batch_id, ip_k, i_k_seq_tile * k_seq_tile_size + if_k],
      dtype=pe_in_dt)

  for i_q_seq_tile in nl.affine_range(q_seq_n_tiles):  # indent = 2
    # A SBUF buffer for an independent softmax tile
    loop_sca = sca
    qk_res_buf = nl.ndarray((par_dim(q_seq_tile_size), seqlen), dtype=kernel_dtype,
                            buffer=ncc.sbuf.mod_alloc(base_addr=loop_sca))
    loop_sca += seqlen * kernel_dtype_itemsize

    neg_max_res = nl.ndarray((par_dim(q_seq_tile_size), k_seq_n_tiles), dtype=kernel_dtype,
                             buffer=ncc.sbuf.mod_alloc(base_addr=loop_sca))
    loop_sca += k_seq_n_tiles * kernel_dtype_itemsize
    ip_max = nl.arange(q_seq_tile_size)[:, None]
    if_max = nl.arange(k_seq_n_tiles)[None, :]

    # PSUM buffers of the QK^T tiles, rotating over two banks
    qk_psum = nl.ndarray((k_seq_n_tiles, par_dim(q_seq_tile_size), k_seq_tile_size),
                         dtype=np.float32, buffer=ncc.psum.mod_alloc(base_bank=0, num_bank_tiles=(2, )))

    # Loop over RHS free of matmul(stationary=tensor, moving=q)
    for i_k_seq_tile in nl.affine_range(k_seq_n_tiles):  # indent = 4

      # Tensor indices for accessing qk result in k_seq_tile_size
      ip_qk = nl.arange(q_seq_tile_size)[:, None]
      if_qk = nl.arange(k_seq_tile_size)[None, :]

      ##############################################################
      # Step 2. matmul(stationary=tensor, moving=q)
      ##############################################################
      qk_psum[i_k_seq_tile, ip_qk, if_qk] = nisa.nc_matmul(moving=k_local[i_k_seq_tile, ip_k, if_k],
                                                           stationary=q_local[i_q_seq_tile, ip_q, if_q])

      ###################################
      # Step 3. Apply optional causal mask
      ###################################
      if use_causal_mask:
        # Magic number -9984.0 to replace -inf similar to what neuronx-cc uses
        qk_res_buf[ip_qk, i_k_seq_tile * k_seq_tile_size + if_qk] = nisa.affine_select(
          pred=(i_q_seq_tile * q_seq_tile_size + ip_qk >= i_k_seq_tile * k_seq_tile_size + if_qk),
          on_true_tile=qk_psum[i_k_seq_tile, ip_qk, if_qk], on_false_value=-9984.0, dtype=kernel_dtype)
      else:
        # Simply send psum result back to sbuf
        qk_res_buf[ip_qk, i_k_seq_tile * k_seq_tile_size + if_qk] = \
          nisa.tensor_copy(qk_psum[i_k_seq_tile, ip_qk, if_qk], dtype=kernel_dtype)

      ###################################
      # Step 4. Softmax
      ###################################
      neg_max_res[ip_max, i_k_seq_tile] = nisa.tensor_reduce(
        np.max, data=qk_res_buf[ip_qk, i_k_seq_tile * k_seq_tile_size + if_qk],
        axis=(1,), dtype=kernel_dtype, negate=True)

    neg_max_res_final = nl.ndarray((par_dim(q_seq_tile_size), 1), dtype=kernel_dtype,
                                   buffer=ncc.sbuf.mod_alloc(base_addr=loop_sca))
    loop_sca += kernel_dtype_itemsize
    neg_max_res_final[...] = nisa.tensor_reduce(
      np.min, data=neg_max_res[ip_max, if_max],
      axis=(1,), dtype=kernel_dtype, negate=False)

    ip_softmax = nl.arange(q_seq_tile_size)[:, None]
    if_softmax = nl.arange(seqlen)[None, :]
    ip_sum_res = nl.arange(q_seq_tile_size)[:, None]
    if_sum_res = nl.arange(d_head_tile_size)[None, :]

    softmax_res = nl.ndarray((par_dim(q_seq_tile_size), seqlen), dtype=pe_in_dt,
                             buffer=ncc.sbuf.mod_alloc(base_addr=loop_sca))
    loop_sca += seqlen * pe_in_dt_itemsize
    sum_divisor = nl.ndarray((par_dim(q_seq_tile_size), d_head_tile_size), dtype=kernel_dtype,
                             buffer=ncc.sbuf.mod_alloc(base_addr=loop_sca))
    loop_sca += d_head_tile_size * kernel_dtype_itemsize

    # Simply use a large tile of seq_len in size since this is a "blocking" instruction
    # Assuming the compiler will merge exp and reduce_add into a single instruction on ACT
    exp_res = nl.ndarray((par_dim(q_seq_tile_size), seqlen), dtype=kernel_dtype,
                         buffer=ncc.sbuf.mod_alloc(base_addr=loop_sca))
    loop_sca += seqlen * kernel_dtype_itemsize
    exp_res[ip_softmax, if_softmax] = nisa.activation(np.exp,
                                                      data=qk_res_buf[ip_softmax, if_softmax],
                                                      bias=neg_max_res_final, scale=1.0)

    sum_res = nl.ndarray((par_dim(q_seq_tile_size), 1), dtype=kernel_dtype,
                         buffer=ncc.sbuf.mod_alloc(base_addr=loop_sca))
    loop_sca += kernel_dtype_itemsize
    sum_res[...] = nisa.tensor_reduce(np.add, data=exp_res, axis=(1,), dtype=kernel_dtype)
    softmax_res[ip_softmax, if_softmax] = nl.copy(exp_res, dtype=pe_in_dt)

    sum_reciprocal_broadcast = (1.0 / sum_res).broadcast_to((q_seq_tile_size, d_head_tile_size))
    sum_divisor[ip_sum_res, if_sum_res] = nl.copy(sum_reciprocal_broadcast, dtype=kernel_dtype)

    # Buffer for transposed softmax results
    trans_softmax_res = nl.ndarray(
      (par_dim(k_seq_tile_size), k_seq_n_tiles, q_seq_tile_size),
      dtype=pe_in_dt, buffer=ncc.sbuf.mod_alloc(base_addr=loop_sca))
    loop_sca += k_seq_n_tiles * q_seq_tile_size * pe_in_dt_itemsize

    # Result psum buffer has the hidden dim as P
    attn_res_psum = nl.zeros((par_dim(d_head_tile_size), q_seq_tile_size),
                             dtype=np.float32, buffer=ncc.psum.mod_alloc(base_bank=2))

    ip_scores_t = nl.arange(k_seq_tile_size)[:, None]
    if_scores_t = nl.arange(q_seq_tile_size)[None, :]
    # Loop over matmul_1 contraction
    for i_k_seq_tile in nl.affine_range(k_seq_n_tiles):
      ###################################
      # Step 5. transpose(softmax_res)
      ###################################
      ip_scores = nl.arange(q_seq_tile_size)[:, None]
      if_scores = nl.arange(k_seq_tile_size)[None, :]

      trans_softmax_res[ip_scores_t, i_k_seq_tile, if_scores_t] = nisa.nc_transpose(
        softmax_res[ip_scores, i_k_seq_tile * k_seq_tile_size + if_scores])

    ip_out = nl.arange(d_head_tile_size)[:, None]
    if_out = nl.arange(q_seq_tile_size)[None, :]
    for i_k_seq_tile in nl.affine_range(k_seq_n_tiles):
      ######################################################################
      # Step 6. matmul_1(stationary=v_local, moving=trans_softmax_res, contract=seqlen_v)
      ######################################################################
      ip_v_t = nl.arange(k_seq_tile_size)[:, None]
      if_v_t = nl.arange(d_head_tile_size)[None, :]
      attn_res_psum[ip_out, if_out] += \
        nisa.nc_matmul(moving=trans_softmax_res[ip_scores_t, i_k_seq_tile, if_scores_t],
                       stationary=v_local[i_k_seq_tile, ip_v_t, if_v_t])

    attn_res_sbuf = nl.ndarray((par_dim(d_head_tile_size), q_seq_tile_size), dtype=kernel_dtype,
                               buffer=ncc.sbuf.mod_alloc(base_addr=loop_sca))
    loop_sca += q_seq_tile_size * kernel_dtype_itemsize
    attn_res_sbuf[...] = nl.copy(attn_res_psum[ip_out, if_out], dtype=kernel_dtype)

    attn_res_div = nl.ndarray((par_dim(d_head_tile_size), q_seq_tile_size), dtype=kernel_dtype,
                              buffer=ncc.sbuf.mod_alloc(base_addr=loop_sca))
    loop_sca += q_seq_tile_size * kernel_dtype_itemsize
    attn_res_div[...] = attn_res_sbuf * nisa.nc_transpose(sum_divisor[ip_sum_res, if_sum_res])

    nl.store(
      out_ref[batch_id, ip_out, i_q_seq_tile * q_seq_tile_size + if_out],
      value=attn_res_div)

  return out_ref
