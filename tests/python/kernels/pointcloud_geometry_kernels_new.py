"""Point-cloud sampling, grouping and voxel pooling in the new NKI dialect (``import nki``, ISA calls writing
``dst=``), written the way public NKI 0.3+ kernels are when PointNet++ / 3-D detection ops are ported to Trainium:

- ``farthest_point_sample(xyz, npoint)``: farthest point sampling of xyz [N, 3] fp32 (N = 128 F, F >= 8), the points
  spread over the partitions as [128, F, 3] (point n = p F + f). The first sample is point 0 (PointNet++'s
  convention); each step computes the squared distance of every point to the last sample (``tensor_tensor``
  subtract / multiply against the sample broadcast along the free axis, ``tensor_reduce`` add), the running
  minimum distance, the per-partition argmax (``max8`` + ``nc_find_index8``, made global by an ``iota`` base p F),
  the 128 candidates flattened onto one partition by SBUF -> SBUF ``dma_copy``, their argmax and
  ``nc_n_gather`` of its global index. That index is loaded into a register (``register_load``) and addresses
  the next sample's coordinates in HBM, broadcast to all partitions by one DMA
  (``xyz.ap([[0, 128], [1, 3]], scalar_offset=reg)``). Returns the sample ids [1, npoint] uint32 and their
  coordinates [npoint, 3].
- ``ball_query_group(xyz, new_xyz, features, radius, k)``: PointNet++ ball query + grouping. Squared distances of
  M <= 128 centroids to N <= 512 points by two accumulating TensorE matmuls on the coordinate rows
  (2 c.p and -|p|^2), minus |c|^2 per partition; the first k points within the radius in index order by
  ``max8`` rounds (``nc_match_replace8`` between them) on the score in_radius * (N - j) (``iota``), their ids
  N - score, slots past the last hit padded with the first hit. Each neighbour slot's features [M, C] are gathered
  by one indirect DMA (``features.ap(..., vector_offset=ids[:, j])``). Returns ids [M, k] int32 and the grouped
  features [M, k, C].

Written for nsim's tests in the style of those kernels; not copies of any file. No nsim imports.
"""
import nki
import nki.isa as nisa
import nki.language as nl

P_MAX = 128
BIG = 1.0e10


@nki.jit
def farthest_point_sample(xyz, npoint):
  N, D = xyz.shape
  assert D == 3 and N % P_MAX == 0
  F = N // P_MAX
  assert 8 <= F <= 16384
  idx_out = nl.ndarray((1, npoint), dtype=nl.uint32, buffer=nl.shared_hbm)
  xyz_out = nl.ndarray((npoint, 3), dtype=xyz.dtype, buffer=nl.shared_hbm)

  pts = nl.ndarray((P_MAX, F, 3), dtype=nl.float32, buffer=nl.sbuf)
  nisa.dma_copy(dst=pts, src=xyz.reshape((P_MAX, F, 3)))
  min_d = nl.ndarray((P_MAX, F), dtype=nl.float32, buffer=nl.sbuf)
  nisa.memset(dst=min_d, value=BIG)
  # global index of each partition's first point: p * F
  base = nl.ndarray((P_MAX, 1), dtype=nl.uint32, buffer=nl.sbuf)
  nisa.iota(dst=base, pattern=[[0, 1]], offset=0, channel_multiplier=F)
  ids = nl.ndarray((1, npoint), dtype=nl.uint32, buffer=nl.sbuf)
  nisa.memset(dst=ids[:, 0:1], value=0)

  # the first sample is point 0: its coordinates on every partition, by one DMA addressed by a register
  last = nisa.register_alloc(0)
  c = nl.ndarray((P_MAX, 3), dtype=nl.float32, buffer=nl.sbuf)
  nisa.dma_copy(dst=c, src=xyz.ap(pattern=[[0, P_MAX], [1, 3]], scalar_offset=last, indirect_dim=0))
  nisa.dma_copy(dst=xyz_out[0:1, :], src=c[0:1, :])

  for i in nl.sequential_range(1, npoint):
    diff = nl.ndarray((P_MAX, F, 3), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=diff, data1=pts, data2=c.expand_dim(1).broadcast(1, F), op=nl.subtract)
    nisa.tensor_tensor(dst=diff, data1=diff, data2=diff, op=nl.multiply)
    d = nl.ndarray((P_MAX, F), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=d, op=nl.add, data=diff, axis=2)
    nisa.tensor_tensor(dst=min_d, data1=min_d, data2=d, op=nl.minimum)

    # argmax per partition, then across the partitions
    top = nl.ndarray((P_MAX, 8), dtype=nl.float32, buffer=nl.sbuf)
    nisa.max8(dst=top, src=min_d)
    loc = nl.ndarray((P_MAX, 8), dtype=nl.uint32, buffer=nl.sbuf)
    nisa.nc_find_index8(dst=loc, data=min_d, vals=top)
    gidx = nl.ndarray((P_MAX, 1), dtype=nl.uint32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=gidx, data1=loc[:, 0:1], data2=base, op=nl.add)

    cand_v = nl.ndarray((1, P_MAX), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=cand_v, src=top[:, 0:1])
    cand_i = nl.ndarray((1, P_MAX), dtype=nl.uint32, buffer=nl.sbuf)
    nisa.dma_copy(dst=cand_i, src=gidx)
    best = nl.ndarray((1, 8), dtype=nl.float32, buffer=nl.sbuf)
    nisa.max8(dst=best, src=cand_v)
    pos = nl.ndarray((1, 8), dtype=nl.uint32, buffer=nl.sbuf)
    nisa.nc_find_index8(dst=pos, data=cand_v, vals=best)
    nisa.nc_n_gather(dst=ids[:, i:i + 1], data=cand_i, indices=pos[:, 0:1])

    # the next sample: its id into a register, its coordinates fetched by that register
    nisa.register_load(last, ids[:, i:i + 1])
    c = nl.ndarray((P_MAX, 3), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=c, src=xyz.ap(pattern=[[0, P_MAX], [1, 3]], scalar_offset=last, indirect_dim=0))
    nisa.dma_copy(dst=xyz_out[i:i + 1, :], src=c[0:1, :])

  nisa.dma_copy(dst=idx_out, src=ids)
  return idx_out, xyz_out


@nki.jit
def ball_query_group(xyz, new_xyz, features, radius, k):
  N, _ = xyz.shape
  M, _ = new_xyz.shape
  _, C = features.shape
  assert M <= P_MAX and 8 <= N <= 512 and k % 8 == 0 and k <= N
  ids_out = nl.ndarray((M, k), dtype=nl.int32, buffer=nl.shared_hbm)
  grouped = nl.ndarray((M, k, C), dtype=features.dtype, buffer=nl.shared_hbm)

  # coordinates on the partitions (the contraction dim of the distance matmuls)
  xyz_t = nl.ndarray((3, N), dtype=nl.float32, buffer=nl.sbuf)
  nisa.dma_copy(dst=xyz_t, src=xyz.T)
  cen_t = nl.ndarray((3, M), dtype=nl.float32, buffer=nl.sbuf)
  nisa.dma_copy(dst=cen_t, src=new_xyz.T)
  cen = nl.ndarray((M, 3), dtype=nl.float32, buffer=nl.sbuf)
  nisa.dma_copy(dst=cen, src=new_xyz)

  cen2_t = nl.ndarray((3, M), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_scalar(dst=cen2_t, data=cen_t, op0=nl.multiply, operand0=2.0)
  xyz_sq = nl.ndarray((3, N), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_tensor(dst=xyz_sq, data1=xyz_t, data2=xyz_t, op=nl.multiply)
  neg_ones = nl.ndarray((3, M), dtype=nl.float32, buffer=nl.sbuf)
  nisa.memset(dst=neg_ones, value=-1.0)

  # -d = 2 c.p - |p|^2 - |c|^2
  nd_ps = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.psum)
  nisa.nc_matmul(dst=nd_ps, stationary=cen2_t, moving=xyz_t)
  nisa.nc_matmul(dst=nd_ps, stationary=neg_ones, moving=xyz_sq, accumulate=True)
  cen_sq = nl.ndarray((M, 3), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_tensor(dst=cen_sq, data1=cen, data2=cen, op=nl.multiply)
  c2 = nl.ndarray((M, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_reduce(dst=c2, op=nl.add, data=cen_sq, axis=1)

  # in radius (d < r^2): score N - j, else 0
  hit = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_scalar(dst=hit, data=nd_ps, op0=nl.subtract, operand0=c2, op1=nl.greater,
                     operand1=-radius * radius)
  rev = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.sbuf)
  nisa.iota(dst=rev, pattern=[[-1, N]], offset=N, channel_multiplier=0)
  score = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_tensor(dst=score, data1=hit, data2=rev, op=nl.multiply)

  # the k largest scores = the first k hits in index order
  top = nl.ndarray((M, k), dtype=nl.float32, buffer=nl.sbuf)
  for r in nl.static_range(k // 8):
    nisa.max8(dst=top[:, r * 8:(r + 1) * 8], src=score)
    if r + 1 < k // 8:
      nisa.nc_match_replace8(dst=score, data=score, vals=top[:, r * 8:(r + 1) * 8], imm=-1.0)

  # id = N - score; a slot without a hit (score 0) takes the first hit: id += miss * (first - N)
  miss = nl.ndarray((M, k), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_scalar(dst=miss, data=top, op0=nl.equal, operand0=0.0)
  idf = nl.ndarray((M, k), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_scalar(dst=idf, data=top, op0=nl.subtract, operand0=float(N), reverse0=True)
  neg_first = nl.ndarray((M, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_scalar(dst=neg_first, data=top[:, 0:1], op0=nl.multiply, operand0=-1.0)
  nisa.scalar_tensor_tensor(dst=idf, data=miss, op0=nl.multiply, operand0=neg_first, op1=nl.add, operand1=idf)
  ids = nl.ndarray((M, k), dtype=nl.int32, buffer=nl.sbuf)
  nisa.tensor_copy(dst=ids, src=idf)
  nisa.dma_copy(dst=ids_out, src=ids)

  # group: one indirect DMA per neighbour slot gathers that slot's rows of all centroids
  g = nl.ndarray((M, k, C), dtype=features.dtype, buffer=nl.sbuf)
  for j in nl.static_range(k):
    nisa.dma_copy(dst=g[:, j, :], src=features.ap(pattern=[[C, M], [1, C]], vector_offset=ids[:, j:j + 1],
                                                    indirect_dim=0))
  nisa.dma_copy(dst=grouped, src=g)
  return ids_out, grouped
