"""Sparse, graph and segment kernels in the new NKI dialect (``import nki``, ISA calls writing ``dst=``), the way
public NKI 0.3+ ports of sparse layers write them:

- ``bsr_matmul(a_blocks, b, blocks, M)``: out [M, N] = A @ B with A block-sparse in BSR form, 128 x 128 blocks:
  ``blocks`` is a host-side Python list of the (block row, block column) of each stored block, ``a_blocks``
  [nnzb, 128, 128] their values (static sparsity: the structure is known when the kernel is traced). Per block row
  only its stored blocks reach the PE: each loaded once and transposed on the PE (``nc_transpose``), then one
  ``nc_matmul`` per stored block and 512-column chunk of B, accumulated in PSUM; a block row with no stored block
  is a memset. Blocks in any order, a block listed twice adds twice.
- ``spmm_ell(col_idx, values, b)``: the padded-CSR / ELL SpMM of the Beta-1 file in this dialect: per row tile
  and stored slot k, the rows of B gathered by ``b.ap(pattern, vector_offset=idx[:, k], indirect_dim=0)`` and
  multiply-added (``scalar_tensor_tensor``, the value column as the (P, 1) scalar).
- ``segment_sum(data, seg, num_segments)``: out[s] = sum of the rows of data [N, D] with sorted segment id s.
  Per 128-row tile the one-hot membership matrix [rows, segments] is built on chip (``nisa.iota`` of the segment
  ids along the free dim, ``tensor_scalar(equal)`` against the row's id) and is the stationary operand of one
  ``nc_matmul`` per segment tile, accumulated over the row tiles in PSUM.
- ``segment_max(data, seg, num_segments, chunk)``: segments on the partitions; per chunk of rows (default: 32 KiB of
  fp32 per partition) the rows and their
  ids broadcast to every partition by stride-0 ``.ap`` DMAs, the membership by an iota (``channel_multiplier=1``)
  compare, non-members replaced by ``nl.fp32.min`` (``tensor_copy_predicated`` over a memset), a ``tensor_reduce``
  max over the rows (a permuted view puts them last), chunks combined by ``tensor_tensor(maximum)``; empty
  segments 0.
- ``embedding_bag_backward(ids, grad_out, num_embeddings, mode)``: the weight gradient of an embedding bag
  (``ids`` [B, L] int32, ``mode`` "sum" or "mean"): grad_table[v] = sum over (b, j) with ids[b, j] == v of
  grad_out[b] (/ L for mean). Per tile of 128 (bag, slot) items: the bag's gradient row repeated for each of its L
  slots by one DMA with a stride-0 dim, the rows of equal ids summed on the PE (the [128, 128] equality matrix of
  the tile's ids, an iota-free compare of the ids against their row broadcast), every id but its first occurrence
  in the tile sent out of range, and one ``nisa.dma_compute`` scatter-add ``grad_table[ids] += rows``
  (``.ap(vector_offset=)``, ``oob_mode=skip``): the indices of each scatter are unique, as the RMW form documents
  them (nki-api.md 2.3); a repeated id in another tile is another scatter, ordered after this one.

Written for nsim's tests; not copies of any file. No nsim imports.
"""
import nki
import nki.isa as nisa
import nki.language as nl

P_MAX = 128
PSUM_FMAX = 512


def div_ceil(n, d):
  return (n + d - 1) // d


# ------------------------------------------------------------------------------------------------
# Block-sparse (BSR) matmul, static sparsity
# ------------------------------------------------------------------------------------------------

@nki.jit
def bsr_matmul(a_blocks, b, blocks, M):
  nnzb, BS, BS2 = a_blocks.shape
  K, N = b.shape
  assert BS == BS2 == P_MAX and M % BS == 0 and K % BS == 0 and len(blocks) == nnzb
  n_br = M // BS
  out = nl.ndarray((M, N), dtype=b.dtype, buffer=nl.shared_hbm)

  for br in range(n_br):
    row_blocks = [(i, bc) for i, (r, bc) in enumerate(blocks) if r == br]
    # A's stored blocks of this block row, transposed once on the PE: [k, m] stationary operands
    a_t = []
    for i, bc in row_blocks:
      a_sb = nl.ndarray((BS, BS), dtype=a_blocks.dtype, buffer=nl.sbuf)
      nisa.dma_copy(dst=a_sb, src=a_blocks[i])
      t_ps = nl.ndarray((BS, BS), dtype=a_blocks.dtype, buffer=nl.psum)
      nisa.nc_transpose(dst=t_ps, data=a_sb)
      t_sb = nl.ndarray((BS, BS), dtype=a_blocks.dtype, buffer=nl.sbuf)
      nisa.tensor_copy(dst=t_sb, src=t_ps)
      a_t.append((t_sb, bc))
    for nc in nl.affine_range(div_ceil(N, PSUM_FMAX)):
      n0 = nc * PSUM_FMAX
      nn = min(PSUM_FMAX, N - n0)
      res = nl.ndarray((BS, PSUM_FMAX), dtype=b.dtype, buffer=nl.sbuf)
      if not a_t:
        nisa.memset(dst=res[:, :nn], value=0.0)
      else:
        acc = nl.ndarray((BS, PSUM_FMAX), dtype=nl.float32, buffer=nl.psum)
        for j, (t_sb, bc) in enumerate(a_t):
          b_sb = nl.ndarray((BS, PSUM_FMAX), dtype=b.dtype, buffer=nl.sbuf)
          nisa.dma_copy(dst=b_sb[:, :nn], src=b[bc * BS:(bc + 1) * BS, n0:n0 + nn])
          nisa.nc_matmul(dst=acc[:, :nn], stationary=t_sb, moving=b_sb[:, :nn], accumulate=(j > 0))
        nisa.tensor_copy(dst=res[:, :nn], src=acc[:, :nn])
      nisa.dma_copy(dst=out[br * BS:(br + 1) * BS, n0:n0 + nn], src=res[:, :nn])
  return out


# ------------------------------------------------------------------------------------------------
# ELL SpMM with vector-offset gathers
# ------------------------------------------------------------------------------------------------

@nki.jit
def spmm_ell(col_idx, values, b):
  M, K = col_idx.shape
  N, D = b.shape
  assert D <= 2048
  out = nl.ndarray((M, D), dtype=b.dtype, buffer=nl.shared_hbm)
  for m in nl.affine_range(div_ceil(M, P_MAX)):
    m0 = m * P_MAX
    rows = min(P_MAX, M - m0)
    idx = nl.ndarray((P_MAX, K), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=idx[:rows, :], src=col_idx[m0:m0 + rows, :])
    val = nl.ndarray((P_MAX, K), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=val[:rows, :], src=values[m0:m0 + rows, :])
    acc = nl.ndarray((P_MAX, D), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=acc[:rows, :], value=0.0)
    for k in nl.sequential_range(K):
      g = nl.ndarray((P_MAX, D), dtype=b.dtype, buffer=nl.sbuf)
      nisa.dma_copy(dst=g[:rows, :], src=b.ap([[D, rows], [1, D]], vector_offset=idx[:rows, k:k + 1], indirect_dim=0))
      nisa.scalar_tensor_tensor(dst=acc[:rows, :], data=g[:rows, :], op0=nl.multiply, operand0=val[:rows, k:k + 1],
                                op1=nl.add, operand1=acc[:rows, :])
    res = nl.ndarray((P_MAX, D), dtype=b.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=res[:rows, :], src=acc[:rows, :])
    nisa.dma_copy(dst=out[m0:m0 + rows, :], src=res[:rows, :])
  return out


# ------------------------------------------------------------------------------------------------
# Segment reductions over sorted segment ids
# ------------------------------------------------------------------------------------------------

@nki.jit
def segment_sum(data, seg, num_segments):
  N, D = data.shape
  S = num_segments
  assert D <= PSUM_FMAX and S <= 8 * P_MAX
  out = nl.ndarray((S, D), dtype=data.dtype, buffer=nl.shared_hbm)
  n_st = div_ceil(S, P_MAX)
  seg_2d = seg.reshape((N, 1))

  # segment ids s0 .. s0 + 127 along the free dim, the same on every partition, one tile per segment tile
  sid = []
  acc = []
  for st in range(n_st):
    t = nl.ndarray((P_MAX, P_MAX), dtype=nl.float32, buffer=nl.sbuf)
    nisa.iota(dst=t, pattern=[[1, P_MAX]], offset=st * P_MAX)
    sid.append(t)
    acc.append(nl.ndarray((P_MAX, D), dtype=nl.float32, buffer=nl.psum))

  for r in nl.sequential_range(div_ceil(N, P_MAX)):
    r0 = r * P_MAX
    rows = min(P_MAX, N - r0)
    it = nl.ndarray((P_MAX, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=it[:rows, :], src=seg_2d[r0:r0 + rows, :])
    fid = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=fid[:rows, :], src=it[:rows, :])
    x = nl.ndarray((P_MAX, D), dtype=data.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=x[:rows, :], src=data[r0:r0 + rows, :])
    for st in range(n_st):
      ns = min(P_MAX, S - st * P_MAX)
      onehot = nl.ndarray((P_MAX, P_MAX), dtype=data.dtype, buffer=nl.sbuf)    # [rows, segments]
      nisa.tensor_scalar(dst=onehot[:rows, :ns], data=sid[st][:rows, :ns], op0=nl.equal, operand0=fid[:rows, :])
      nisa.nc_matmul(dst=acc[st][:ns, :], stationary=onehot[:rows, :ns], moving=x[:rows, :], accumulate=(r > 0))

  for st in range(n_st):
    s0 = st * P_MAX
    ns = min(P_MAX, S - s0)
    res = nl.ndarray((P_MAX, D), dtype=data.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=res[:ns, :], src=acc[st][:ns, :])
    nisa.dma_copy(dst=out[s0:s0 + ns, :], src=res[:ns, :])
  return out


@nki.jit
def segment_max(data, seg, num_segments, chunk=None):
  N, D = data.shape
  S = num_segments
  chunk = min(chunk or max(1, 8192 // D), N)   # 32 KiB of fp32 rows per partition
  out = nl.ndarray((S, D), dtype=data.dtype, buffer=nl.shared_hbm)

  for st in nl.affine_range(div_ceil(S, P_MAX)):
    s0 = st * P_MAX
    ns = min(P_MAX, S - s0)
    sidc = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)      # the segment id of each partition
    nisa.iota(dst=sidc, pattern=[[0, 1]], offset=s0, channel_multiplier=1)
    best = nl.ndarray((P_MAX, D), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=best, value=nl.fp32.min)
    count = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=count, value=0.0)
    for c in nl.sequential_range(div_ceil(N, chunk)):
      n0 = c * chunk
      nc = min(chunk, N - n0)
      # rows n0 .. n0 + nc and their ids on every partition (stride-0 partition step on the HBM side)
      xb = nl.ndarray((P_MAX, chunk, D), dtype=nl.float32, buffer=nl.sbuf)
      nisa.dma_copy(dst=xb[:ns, :nc, :], src=data.ap([[0, ns], [D, nc], [1, D]], offset=n0 * D))
      sb = nl.ndarray((P_MAX, chunk), dtype=nl.int32, buffer=nl.sbuf)
      nisa.dma_copy(dst=sb[:ns, :nc], src=seg.ap([[0, ns], [1, nc]], offset=n0))
      sbf = nl.ndarray((P_MAX, chunk), dtype=nl.float32, buffer=nl.sbuf)
      nisa.tensor_copy(dst=sbf[:ns, :nc], src=sb[:ns, :nc])
      member = nl.ndarray((P_MAX, chunk), dtype=nl.float32, buffer=nl.sbuf)
      nisa.tensor_scalar(dst=member[:ns, :nc], data=sbf[:ns, :nc], op0=nl.equal, operand0=sidc[:ns, :])
      pred = nl.ndarray((P_MAX, chunk), dtype=nl.uint8, buffer=nl.sbuf)
      nisa.tensor_copy(dst=pred[:ns, :nc], src=member[:ns, :nc])
      masked = nl.ndarray((P_MAX, chunk, D), dtype=nl.float32, buffer=nl.sbuf)
      nisa.memset(dst=masked[:ns, :nc, :], value=nl.fp32.min)
      nisa.tensor_copy_predicated(dst=masked[:ns, :nc, :], src=xb[:ns, :nc, :],
                                  predicate=pred[:ns, :nc].expand_dim(2).broadcast(2, D))
      cmax = nl.ndarray((P_MAX, D), dtype=nl.float32, buffer=nl.sbuf)
      nisa.tensor_reduce(dst=cmax[:ns, :], op=nl.maximum, data=masked[:ns, :nc, :].permute((0, 2, 1)), axis=2)
      nisa.tensor_tensor(dst=best[:ns, :], data1=best[:ns, :], data2=cmax[:ns, :], op=nl.maximum)
      cnt = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
      nisa.tensor_reduce(dst=cnt[:ns, :], op=nl.add, data=member[:ns, :nc], axis=1)
      nisa.tensor_tensor(dst=count[:ns, :], data1=count[:ns, :], data2=cnt[:ns, :], op=nl.add)
    # empty segments: 0
    nonempty = nl.ndarray((P_MAX, 1), dtype=nl.uint8, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=nonempty[:ns, :], data=count[:ns, :], op0=nl.greater, operand0=0.0)
    res = nl.ndarray((P_MAX, D), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=res[:ns, :], value=0.0)
    nisa.tensor_copy_predicated(dst=res[:ns, :], src=best[:ns, :], predicate=nonempty[:ns, :].broadcast(1, D))
    res_o = nl.ndarray((P_MAX, D), dtype=data.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=res_o[:ns, :], src=res[:ns, :])
    nisa.dma_copy(dst=out[s0:s0 + ns, :], src=res_o[:ns, :])
  return out


# ------------------------------------------------------------------------------------------------
# Embedding bag backward: scatter-add with repeated ids
# ------------------------------------------------------------------------------------------------

@nki.jit
def embedding_bag_backward(ids, grad_out, num_embeddings, mode="sum"):
  B, L = ids.shape
  _, H = grad_out.shape
  V = num_embeddings
  assert P_MAX % L == 0 and H <= PSUM_FMAX and 2 * V < 2 ** 24 and mode in ("sum", "mean")
  n_items = B * L
  grad_table = nl.ndarray((V, H), dtype=nl.float32, buffer=nl.shared_hbm)
  ids_col = ids.reshape((n_items, 1))
  ids_flat = ids.reshape((n_items,))

  zeros = nl.ndarray((P_MAX, H), dtype=nl.float32, buffer=nl.sbuf)
  nisa.memset(dst=zeros, value=0.0)
  for v in nl.affine_range(div_ceil(V, P_MAX)):
    v0 = v * P_MAX
    nisa.dma_copy(dst=grad_table[v0:v0 + min(P_MAX, V - v0), :], src=zeros[:min(P_MAX, V - v0), :])

  for t in nl.affine_range(div_ceil(n_items, P_MAX)):
    n0 = t * P_MAX
    rows = min(P_MAX, n_items - n0)
    b0, nb = n0 // L, rows // L
    # the ids of the tile's items as a column and, on every partition, as a row
    idc = nl.ndarray((P_MAX, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=idc[:rows, :], src=ids_col[n0:n0 + rows, :])
    idr = nl.ndarray((P_MAX, P_MAX), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=idr[:rows, :rows], src=ids_flat.ap([[0, rows], [1, rows]], offset=n0))
    idcf = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=idcf[:rows, :], src=idc[:rows, :])
    idrf = nl.ndarray((P_MAX, P_MAX), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=idrf[:rows, :rows], src=idr[:rows, :rows])
    # same[p, q] = (id[q] == id[p]) (x 1 / L for a mean bag)
    same = nl.ndarray((P_MAX, P_MAX), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=same[:rows, :rows], data=idrf[:rows, :rows], op0=nl.equal, operand0=idcf[:rows, :],
                       op1=nl.multiply, operand1=(1.0 / L if mode == "mean" else 1.0))
    # item n = b * L + j carries grad_out[b]: each bag row repeated L times (a stride-0 dim)
    g = nl.ndarray((P_MAX, H), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=g[:rows, :], src=grad_out.ap([[H, nb], [0, L], [1, H]], offset=b0 * H))
    # the rows of equal ids summed: summed[p] = sum_q same[q, p] g[q]
    summed_ps = nl.ndarray((P_MAX, H), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=summed_ps[:rows, :], stationary=same[:rows, :rows], moving=g[:rows, :])
    summed = nl.ndarray((P_MAX, H), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=summed[:rows, :], src=summed_ps[:rows, :])
    # an id seen at an earlier item of the tile (q < p) is sent out of range: each scatter row is unique
    earlier = nl.ndarray((P_MAX, P_MAX), dtype=nl.float32, buffer=nl.sbuf)
    nisa.affine_select(dst=earlier[:rows, :rows], pattern=[[-1, rows]], channel_multiplier=1,
                       on_true_tile=same[:rows, :rows], on_false_value=0.0, cmp_op=nl.greater)
    dup = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=dup[:rows, :], op=nl.maximum, data=earlier[:rows, :rows], axis=1)
    idxf = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=idxf[:rows, :], data=dup[:rows, :], op0=nl.greater, operand0=0.0,
                       op1=nl.multiply, operand1=float(V))
    nisa.tensor_tensor(dst=idxf[:rows, :], data1=idxf[:rows, :], data2=idcf[:rows, :], op=nl.add)
    idx = nl.ndarray((P_MAX, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=idx[:rows, :], src=idxf[:rows, :])
    rows_v = grad_table.ap([[H, rows], [1, H]], vector_offset=idx[:rows, :], indirect_dim=0)
    nisa.dma_compute(dst=rows_v, srcs=[rows_v, summed[:rows, :]], reduce_op=nl.add, unique_indices=True,
                     oob_mode=nisa.oob_mode.skip)
  return grad_table
