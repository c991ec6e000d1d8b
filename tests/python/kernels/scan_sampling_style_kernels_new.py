"""Two kernels of the scan / sampling family in the new NKI dialect (``import nki``, ISA calls writing ``dst=``), as
they are written in ports of NxDI-style kernels to NKI 0.3+:

- ``cumsum_partition(x)``: prefix sum of x [S, D] along S (the partition axis) as a matmul with an upper-triangular
  ones matrix: ``nisa.iota`` of a stride-0 pattern gives a tile of ones, ``nisa.affine_select`` keeps it where
  ``col - row >= 0``. Tiles of 128 rows (the last one ragged: the matmul contracts only its ``rows`` rows); the
  running column totals of earlier tiles (a matmul with the ones tile broadcasts them to every partition) are
  added to each tile's result.
- ``vocab_parallel_embedding(token_ids, table_shard, vocab_start)``: the embedding lookup of one rank of a
  vocabulary-parallel embedding (NxDI's ``ParallelEmbedding``): token ids [T] int32 in tiles of 128 (ragged last
  tile), shifted by the shard's first id, gather their rows of the shard [V_shard, H] by an indirect DMA
  (``table.ap(pattern, vector_offset=ids, indirect_dim=0)``); ids outside the shard are skipped
  (``oob_mode.skip``) and leave zero rows, so the shards' outputs sum to the full lookup.

Written for nsim's tests in the style of those kernels; not copies of any file. No nsim imports.
"""
import nki
import nki.isa as nisa
import nki.language as nl

P_MAX = 128


def div_ceil(n, d):
  return (n + d - 1) // d


@nki.jit
def cumsum_partition(x):
  S, D = x.shape
  assert D <= 512, "one PSUM bank per tile"
  out = nl.ndarray((S, D), dtype=x.dtype, buffer=nl.shared_hbm)

  # ones[k, m] = 1; triu[k, m] = 1 where m - k >= 0 (in x's dtype: the matmul operands must agree)
  ones = nl.ndarray((P_MAX, P_MAX), dtype=x.dtype, buffer=nl.sbuf)
  nisa.iota(dst=ones, pattern=[[0, P_MAX]], offset=1, channel_multiplier=0)
  triu = nl.ndarray((P_MAX, P_MAX), dtype=x.dtype, buffer=nl.sbuf)
  nisa.affine_select(dst=triu, pattern=[[1, P_MAX]], channel_multiplier=-1, on_true_tile=ones,
                     on_false_value=0.0, cmp_op=nl.greater_equal)

  carry = nl.ndarray((P_MAX, D), dtype=nl.float32, buffer=nl.sbuf)
  nisa.memset(dst=carry, value=0.0)

  for i in nl.sequential_range(div_ceil(S, P_MAX)):
    s0 = i * P_MAX
    rows = min(P_MAX, S - s0)
    x_sb = nl.ndarray((P_MAX, D), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=x_sb[:rows, :], src=x[s0:s0 + rows, :])

    cs_ps = nl.ndarray((P_MAX, D), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=cs_ps[:rows, :], stationary=triu[:rows, :rows], moving=x_sb[:rows, :])
    cs = nl.ndarray((P_MAX, D), dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=cs[:rows, :], data1=cs_ps[:rows, :], data2=carry[:rows, :], op=nl.add)
    nisa.dma_copy(dst=out[s0:s0 + rows, :], src=cs[:rows, :])

    # carry += column totals of this tile, on every partition
    tot_ps = nl.ndarray((P_MAX, D), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=tot_ps, stationary=ones[:rows, :], moving=x_sb[:rows, :])
    nisa.tensor_tensor(dst=carry, data1=carry, data2=tot_ps, op=nl.add)

  return out


@nki.jit
def vocab_parallel_embedding(token_ids, table_shard, vocab_start=0):
  T = token_ids.shape[0]
  V, H = table_shard.shape
  out = nl.ndarray((T, H), dtype=table_shard.dtype, buffer=nl.shared_hbm)
  ids_2d = token_ids.reshape((T, 1))

  for t in nl.affine_range(div_ceil(T, P_MAX)):
    t0 = t * P_MAX
    rows = min(P_MAX, T - t0)

    ids = nl.ndarray((P_MAX, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=ids[:rows, :], src=ids_2d[t0:t0 + rows, :])
    local = nl.ndarray((P_MAX, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=local[:rows, :], data=ids[:rows, :], op0=nl.subtract, operand0=vocab_start)

    # rows of ids outside this shard are skipped and stay zero
    emb = nl.ndarray((P_MAX, H), dtype=table_shard.dtype, buffer=nl.sbuf)
    nisa.memset(dst=emb[:rows, :], value=0.0)
    nisa.dma_copy(dst=emb[:rows, :],
                  src=table_shard.ap(pattern=[[H, rows], [1, H]], vector_offset=local[:rows, :], indirect_dim=0),
                  oob_mode=nisa.oob_mode.skip)
    nisa.dma_copy(dst=out[t0:t0 + rows, :], src=emb[:rows, :])

  return out
