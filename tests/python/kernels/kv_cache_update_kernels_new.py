"""KV-cache update kernels in the new NKI dialect (``import nki``, ISA calls writing ``dst=``), as ports of vLLM's
and NxDI's cache updates to NKI 0.3+ write them, with runtime positions as DMA offsets (spec §3.9):

- ``reshape_and_cache(key, value, key_cache, value_cache, slot_mapping)``: vLLM's paged cache
  ``[num_blocks, block_size, n_kv_heads, d]``; each tile of up to 128 tokens is scattered to its slots by one
  ``nisa.dma_copy`` per cache whose destination is ``cache.ap(pattern, vector_offset=slots, indirect_dim=0)`` on
  the ``[num_slots, n_kv_heads * d]`` view. Padding tokens (slot -1) are out of range and skipped
  (``oob_mode=skip``), as vLLM's CUDA kernel skips them.
- ``decode_cache_update(k, v, k_cache, v_cache, position_ids)``: NxDI's contiguous cache ``[B, n_kv_heads,
  S_max, d]``, the new token ``[B, n_kv_heads, 1, d]`` written at ``position_ids[b]``: per batch one DMA per cache
  covering all kv heads, ``k_cache.ap([[S_max * d, n_kv_heads], [1, d]], offset=b * n_kv_heads * S_max * d,
  scalar_offset=pos[0:1, b:b + 1], indirect_dim=2)`` (the position read from SBUF at run time).
- ``decode_cache_update_reg(...)``: the same with the position in a sequencer register
  (``nisa.register_load`` from HBM, then ``.ap(scalar_offset=reg)``).
- ``prefill_cache_write(k, v, k_cache, v_cache, start_pos)``: a chunk of S tokens ``[B, n_kv_heads, S, d]``
  written at a runtime start: ``k_cache[b, h, nl.ds(start[0:1, b:b + 1], rows), :]`` per 128-token tile, the
  later tiles' starts ``start + s * 128`` computed on the VectorE.

Written for nsim's tests in the style of those kernels; not copies of any file. No nsim imports.
"""
import nki
import nki.isa as nisa
import nki.language as nl

P_MAX = 128


def div_ceil(n, d):
  return (n + d - 1) // d


@nki.jit
def reshape_and_cache(key, value, key_cache, value_cache, slot_mapping):
  T, n_kv_heads, d = key.shape
  num_blocks, block_size, _, _ = key_cache.shape
  num_slots = num_blocks * block_size
  row = n_kv_heads * d

  key_2d = key.reshape((T, row))
  value_2d = value.reshape((T, row))
  key_cache_2d = key_cache.reshape((num_slots, row))
  value_cache_2d = value_cache.reshape((num_slots, row))
  slots_2d = slot_mapping.reshape((T, 1))

  for t in nl.affine_range(div_ceil(T, P_MAX)):
    t0 = t * P_MAX
    rows = min(P_MAX, T - t0)
    slots = nl.ndarray((P_MAX, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=slots[:rows, :], src=slots_2d[t0:t0 + rows, :])

    k_sb = nl.ndarray((P_MAX, row), dtype=key.dtype, buffer=nl.sbuf)
    v_sb = nl.ndarray((P_MAX, row), dtype=value.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=k_sb[:rows, :], src=key_2d[t0:t0 + rows, :])
    nisa.dma_copy(dst=v_sb[:rows, :], src=value_2d[t0:t0 + rows, :])

    # scatter: row p goes to slot slots[p]; padding slots (-1) are skipped
    nisa.dma_copy(dst=key_cache_2d.ap(pattern=[[row, rows], [1, row]], vector_offset=slots[:rows, :],
                                      indirect_dim=0),
                  src=k_sb[:rows, :], oob_mode=nisa.oob_mode.skip)
    nisa.dma_copy(dst=value_cache_2d.ap(pattern=[[row, rows], [1, row]], vector_offset=slots[:rows, :],
                                        indirect_dim=0),
                  src=v_sb[:rows, :], oob_mode=nisa.oob_mode.skip)

  return key_cache, value_cache


@nki.jit
def decode_cache_update(k, v, k_cache, v_cache, position_ids):
  B, n_kv_heads, _, d = k.shape
  max_seq_len = k_cache.shape[2]
  assert n_kv_heads <= P_MAX

  pos = nl.ndarray((1, B), dtype=nl.int32, buffer=nl.sbuf)
  nisa.dma_copy(dst=pos, src=position_ids.reshape((1, B)))

  for b in nl.affine_range(B):
    k_sb = nl.ndarray((n_kv_heads, d), dtype=k.dtype, buffer=nl.sbuf)
    v_sb = nl.ndarray((n_kv_heads, d), dtype=v.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=k_sb, src=k[b, :, 0, :])
    nisa.dma_copy(dst=v_sb, src=v[b, :, 0, :])
    # head h of batch b at row pos[b]: offset (b * n_kv_heads + h) * max_seq_len * d + pos[b] * d
    base = b * n_kv_heads * max_seq_len * d
    nisa.dma_copy(dst=k_cache.ap(pattern=[[max_seq_len * d, n_kv_heads], [1, d]], offset=base,
                                 scalar_offset=pos[0:1, b:b + 1], indirect_dim=2), src=k_sb)
    nisa.dma_copy(dst=v_cache.ap(pattern=[[max_seq_len * d, n_kv_heads], [1, d]], offset=base,
                                 scalar_offset=pos[0:1, b:b + 1], indirect_dim=2), src=v_sb)

  return k_cache, v_cache


@nki.jit
def decode_cache_update_reg(k, v, k_cache, v_cache, position_ids):
  B, n_kv_heads, _, d = k.shape
  max_seq_len = k_cache.shape[2]

  for b in nl.affine_range(B):
    pos = nisa.register_alloc()
    nisa.register_load(pos, position_ids[b:b + 1])
    k_sb = nl.ndarray((n_kv_heads, d), dtype=k.dtype, buffer=nl.sbuf)
    v_sb = nl.ndarray((n_kv_heads, d), dtype=v.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=k_sb, src=k[b, :, 0, :])
    nisa.dma_copy(dst=v_sb, src=v[b, :, 0, :])
    base = b * n_kv_heads * max_seq_len * d
    nisa.dma_copy(dst=k_cache.ap(pattern=[[max_seq_len * d, n_kv_heads], [1, d]], offset=base,
                                 scalar_offset=pos, indirect_dim=2), src=k_sb)
    nisa.dma_copy(dst=v_cache.ap(pattern=[[max_seq_len * d, n_kv_heads], [1, d]], offset=base,
                                 scalar_offset=pos, indirect_dim=2), src=v_sb)

  return k_cache, v_cache


@nki.jit
def prefill_cache_write(k, v, k_cache, v_cache, start_pos):
  B, n_kv_heads, S, d = k.shape

  start = nl.ndarray((1, B), dtype=nl.int32, buffer=nl.sbuf)
  nisa.dma_copy(dst=start, src=start_pos.reshape((1, B)))

  for s in nl.affine_range(div_ceil(S, P_MAX)):
    s0 = s * P_MAX
    rows = min(P_MAX, S - s0)
    # the cache position of this tile's first token, per batch
    tile_start = nl.ndarray((1, B), dtype=nl.int32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=tile_start, data=start, op0=nl.add, operand0=s0)
    for b in nl.affine_range(B):
      for h in nl.affine_range(n_kv_heads):
        k_sb = nl.ndarray((P_MAX, d), dtype=k.dtype, buffer=nl.sbuf)
        v_sb = nl.ndarray((P_MAX, d), dtype=v.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=k_sb[:rows, :], src=k[b, h, s0:s0 + rows, :])
        nisa.dma_copy(dst=v_sb[:rows, :], src=v[b, h, s0:s0 + rows, :])
        nisa.dma_copy(dst=k_cache[b, h, nl.ds(tile_start[0:1, b:b + 1], rows), :], src=k_sb[:rows, :])
        nisa.dma_copy(dst=v_cache[b, h, nl.ds(tile_start[0:1, b:b + 1], rows), :], src=v_sb[:rows, :])

  return k_cache, v_cache
