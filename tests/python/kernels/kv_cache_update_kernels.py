"""KV-cache update kernels in the Beta-1 dialect (``neuronxcc.nki``), written the way vLLM's and NxDI's NKI code
writes them: the new tokens' keys / values go into the cache at positions known only at run time (a slot
mapping, position ids, a chunk start), through indirect DMA stores. No nsim imports.

- ``reshape_and_cache(key, value, key_cache, value_cache, slot_mapping)``: vLLM's ``reshape_and_cache`` for the
  paged cache layout ``[num_blocks, block_size, n_kv_heads, d]`` (vLLM's default, NHD): the cache is viewed as
  one row per slot, ``[num_blocks * block_size, n_kv_heads * d]``, and each tile of 128 tokens is scattered to the
  rows ``slot_mapping[t]`` by ``nl.store(cache[slots[i_p, 0], i_f])``. Padding tokens have slot -1. vLLM's CUDA
  kernel skips them (``if (slot_idx < 0) return;``); an NKI store cannot branch on a runtime value and a Beta-1
  indirect store has no skip mode, so the kernel clamps them to slot 0: vLLM v1 reserves block 0 as the "null
  block" (``BlockPool.null_block``), never given to a sequence, so whatever lands there is never read.
- ``reshape_and_cache_hnd(...)``: the same for the layout of vLLM's ``nki_flash_attn.py``,
  ``[num_blocks, n_kv_heads, block_size, d]``: block and offset from the slot by shift / mask (block_size a
  power of 2), one scatter of ``d``-element rows per kv head.
- ``decode_update_and_attend(q, k, v, k_cache, v_cache, position_ids)``: NxDI-style token generation with a
  contiguous per-sequence cache ``[B, n_kv_heads, S_max, d]``: the new token's k / v ``[B, n_kv_heads, 1, d]`` are
  written at ``position_ids[b]`` (one scatter per kv head, the batch on the partitions, row = ``(b * n_kv_heads +
  h) * S_max + pos[b]`` built by ``nisa.iota`` + the loaded positions), then GQA attention of q
  ``[B, n_heads, 1, d]`` over the positions ``<= pos[b]`` of the updated cache (a runtime mask from an ``iota`` of
  the positions compared with ``pos[b]``).
- ``prefill_cache_write(k, v, k_cache, v_cache, start_pos)``: chunked prefill, ``S`` new tokens ``[B, n_kv_heads,
  S, d]`` written at a runtime start ``start_pos[b]``: row indices ``iota + start`` per 128-token tile (ragged
  last tile masked).

Written for nsim's tests in the style of those kernels; not copies of any file.
"""
import numpy as np
from neuronxcc import nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl

B_P_SIZE = 128


def ceil_div(a, b):
  return (a + b - 1) // b


@nki.jit
def reshape_and_cache(key, value, key_cache, value_cache, slot_mapping):
  """
  key, value: [num_tokens, n_kv_heads, d_head]
  key_cache, value_cache: [num_blocks, block_size, n_kv_heads, d_head] (updated in place and returned)
  slot_mapping: [num_tokens] int32, block_id * block_size + offset; -1 for padding tokens
  """
  num_tokens, n_kv_heads, d_head = key.shape
  num_blocks, block_size, _, _ = key_cache.shape
  row = n_kv_heads * d_head

  # one row per slot
  key_cache_2d = key_cache.reshape((num_blocks * block_size, row))
  value_cache_2d = value_cache.reshape((num_blocks * block_size, row))
  key_2d = key.reshape((num_tokens, row))
  value_2d = value.reshape((num_tokens, row))
  slots_2d = slot_mapping.reshape((num_tokens, 1))

  i_p = nl.arange(B_P_SIZE)[:, None]
  i_f = nl.arange(row)[None, :]
  i_0 = nl.arange(1)[None, :]

  for t in nl.affine_range(ceil_div(num_tokens, B_P_SIZE)):
    token_mask = t * B_P_SIZE + i_p < num_tokens
    slots = nl.load(slots_2d[t * B_P_SIZE + i_p, i_0], mask=token_mask)
    # padding tokens (slot -1) write into the null block (block 0), which no sequence reads
    slots = nl.maximum(slots, 0, mask=token_mask)

    k_tile = nl.load(key_2d[t * B_P_SIZE + i_p, i_f], mask=token_mask)
    v_tile = nl.load(value_2d[t * B_P_SIZE + i_p, i_f], mask=token_mask)
    nl.store(key_cache_2d[slots[i_p, 0], i_f], value=k_tile, mask=token_mask)
    nl.store(value_cache_2d[slots[i_p, 0], i_f], value=v_tile, mask=token_mask)

  return key_cache, value_cache


@nki.jit
def reshape_and_cache_hnd(key, value, key_cache, value_cache, slot_mapping):
  """
  key, value: [num_tokens, n_kv_heads, d_head]
  key_cache, value_cache: [num_blocks, n_kv_heads, block_size, d_head] (updated in place and returned)
  slot_mapping: [num_tokens] int32; -1 for padding tokens
  """
  num_tokens, n_kv_heads, d_head = key.shape
  num_blocks, _, block_size, _ = key_cache.shape
  assert block_size & (block_size - 1) == 0, "block_size must be a power of 2"
  shift = block_size.bit_length() - 1

  # one row per (block, head, offset)
  key_cache_rows = key_cache.reshape((num_blocks * n_kv_heads * block_size, d_head))
  value_cache_rows = value_cache.reshape((num_blocks * n_kv_heads * block_size, d_head))
  key_2d = key.reshape((num_tokens, n_kv_heads * d_head))
  value_2d = value.reshape((num_tokens, n_kv_heads * d_head))
  slots_2d = slot_mapping.reshape((num_tokens, 1))

  i_p = nl.arange(B_P_SIZE)[:, None]
  i_f = nl.arange(n_kv_heads * d_head)[None, :]
  i_d = nl.arange(d_head)[None, :]
  i_0 = nl.arange(1)[None, :]

  for t in nl.affine_range(ceil_div(num_tokens, B_P_SIZE)):
    token_mask = t * B_P_SIZE + i_p < num_tokens
    slots = nl.load(slots_2d[t * B_P_SIZE + i_p, i_0], mask=token_mask)
    slots = nl.maximum(slots, 0, mask=token_mask)  # padding -> the null block
    block_id = nl.right_shift(slots, shift, mask=token_mask)
    block_offset = nl.bitwise_and(slots, block_size - 1, mask=token_mask)
    # row of (block_id, head 0, block_offset)
    row0 = nl.add(nl.multiply(block_id, n_kv_heads * block_size, mask=token_mask), block_offset, mask=token_mask)

    k_tile = nl.load(key_2d[t * B_P_SIZE + i_p, i_f], mask=token_mask)
    v_tile = nl.load(value_2d[t * B_P_SIZE + i_p, i_f], mask=token_mask)
    for h in nl.affine_range(n_kv_heads):
      rows = nl.add(row0, h * block_size, mask=token_mask)
      nl.store(key_cache_rows[rows[i_p, 0], i_d], value=k_tile[i_p, h * d_head + i_d], mask=token_mask)
      nl.store(value_cache_rows[rows[i_p, 0], i_d], value=v_tile[i_p, h * d_head + i_d], mask=token_mask)

  return key_cache, value_cache


@nki.jit
def decode_update_and_attend(q, k, v, k_cache, v_cache, position_ids, softmax_scale=None):
  """
  q: [bsz, n_heads, 1, d]; k, v: [bsz, n_kv_heads, 1, d] (the new token)
  k_cache, v_cache: [bsz, n_kv_heads, max_seq_len, d] (updated in place), max_seq_len a multiple of 128, <= 512
  position_ids: [bsz] int32, the new token's position in each sequence
  returns: attention output [bsz, n_heads, 1, d], and the two caches
  """
  bsz, n_heads, _, d = q.shape
  _, n_kv_heads, max_seq_len, _ = k_cache.shape
  q_per_kv = n_heads // n_kv_heads
  assert bsz <= B_P_SIZE and d <= B_P_SIZE and q_per_kv <= B_P_SIZE
  assert max_seq_len % B_P_SIZE == 0 and max_seq_len <= 512
  if softmax_scale is None:
    softmax_scale = 1.0 / np.sqrt(d)
  n_blk = max_seq_len // B_P_SIZE

  out = nl.ndarray((bsz, n_heads, 1, d), dtype=q.dtype, buffer=nl.shared_hbm)

  # ---- cache update: the batch on the partitions, one scatter per kv head ----
  k_cache_rows = k_cache.reshape((bsz * n_kv_heads * max_seq_len, d))
  v_cache_rows = v_cache.reshape((bsz * n_kv_heads * max_seq_len, d))
  i_b = nl.arange(bsz)[:, None]
  i_d = nl.arange(d)[None, :]
  i_0 = nl.arange(1)[None, :]
  pos = nl.load(position_ids.reshape((bsz, 1))[i_b, i_0])
  for h in nl.affine_range(n_kv_heads):
    row_base = nisa.iota((i_b * n_kv_heads + h) * max_seq_len + i_0, dtype=nl.int32)
    rows = nl.add(row_base, pos)
    k_new = nl.load(k[i_b, h, 0, i_d])
    v_new = nl.load(v[i_b, h, 0, i_d])
    nl.store(k_cache_rows[rows[i_b, 0], i_d], value=k_new)
    nl.store(v_cache_rows[rows[i_b, 0], i_d], value=v_new)

  # ---- attention over positions 0..pos[b] of the updated cache ----
  i_q = nl.arange(q_per_kv)[:, None]
  i_s = nl.arange(max_seq_len)[None, :]
  i_k = nl.arange(B_P_SIZE)[None, :]
  pos_row = nl.load(position_ids.reshape((1, bsz)))
  seq_pos = nisa.iota(i_s + 0 * i_q, dtype=nl.float32)  # [q_per_kv, max_seq_len]: the position of each column
  for b in nl.affine_range(bsz):
    pos_b = nl.copy(pos_row[0, b], dtype=nl.float32).broadcast_to((q_per_kv, 1))
    valid = nl.less_equal(seq_pos, pos_b)
    for h in nl.affine_range(n_kv_heads):
      q_T = nl.load_transpose2d(q[b, nl.ds(h * q_per_kv, q_per_kv), 0, :])  # [d, q_per_kv]
      q_T = nl.multiply(q_T, softmax_scale, dtype=q.dtype)
      scores = nl.ndarray((q_per_kv, max_seq_len), dtype=nl.float32)
      for j in nl.affine_range(n_blk):
        k_T = nl.load_transpose2d(k_cache[b, h, nl.ds(j * B_P_SIZE, B_P_SIZE), :])  # [d, 128]
        scores[i_q, j * B_P_SIZE + i_k] = nl.matmul(q_T, k_T, transpose_x=True)
      scores = nl.where(valid, scores, -9984.0)

      m = nl.max(scores, axis=[1], keepdims=True)
      p = nl.exp(nl.subtract(scores, m))
      l_sum = nl.sum(p, axis=[1], keepdims=True)
      p = p.astype(q.dtype)

      o_psum = nl.zeros((q_per_kv, d), dtype=nl.float32, buffer=nl.psum)
      for j in nl.affine_range(n_blk):
        v_blk = nl.load(v_cache[b, h, nl.ds(j * B_P_SIZE, B_P_SIZE), :])  # [128, d]
        p_T = nl.transpose(p[i_q, j * B_P_SIZE + i_k])
        o_psum += nl.matmul(nl.copy(p_T, dtype=q.dtype), v_blk, transpose_x=True)
      o_tile = nl.divide(o_psum, l_sum, dtype=out.dtype)
      nl.store(out[b, nl.ds(h * q_per_kv, q_per_kv), 0, :], value=o_tile)

  return out, k_cache, v_cache


@nki.jit
def prefill_cache_write(k, v, k_cache, v_cache, start_pos):
  """
  k, v: [bsz, n_kv_heads, seq_len, d] (a chunk of seq_len tokens)
  k_cache, v_cache: [bsz, n_kv_heads, max_seq_len, d] (updated in place and returned)
  start_pos: [bsz] int32, the position of the chunk's first token in each sequence
  """
  bsz, n_kv_heads, seq_len, d = k.shape
  max_seq_len = k_cache.shape[2]
  k_cache_rows = k_cache.reshape((bsz * n_kv_heads * max_seq_len, d))
  v_cache_rows = v_cache.reshape((bsz * n_kv_heads * max_seq_len, d))

  i_p = nl.arange(B_P_SIZE)[:, None]
  i_d = nl.arange(d)[None, :]
  start_row = nl.load(start_pos.reshape((1, bsz)))

  for b in nl.affine_range(bsz):
    start_b = start_row[0:1, b:b + 1].broadcast_to((B_P_SIZE, 1))
    for h in nl.affine_range(n_kv_heads):
      for s in nl.affine_range(ceil_div(seq_len, B_P_SIZE)):
        tok_mask = s * B_P_SIZE + i_p < seq_len
        # cache row of token s * 128 + p: (b * n_kv_heads + h) * max_seq_len + start + s * 128 + p
        rows = nisa.iota((b * n_kv_heads + h) * max_seq_len + s * B_P_SIZE + i_p, dtype=nl.int32)
        rows = nl.add(rows, start_b, mask=tok_mask)
        k_tile = nl.load(k[b, h, s * B_P_SIZE + i_p, i_d], mask=tok_mask)
        v_tile = nl.load(v[b, h, s * B_P_SIZE + i_p, i_d], mask=tok_mask)
        nl.store(k_cache_rows[rows[i_p, 0], i_d], value=k_tile, mask=tok_mask)
        nl.store(v_cache_rows[rows[i_p, 0], i_d], value=v_tile, mask=tok_mask)

  return k_cache, v_cache
