"""Tensor utility ("plumbing") kernels in the new NKI dialect (``import nki``, ISA calls writing ``dst=``), written
the way public NKI 0.3+ model ports write them:

- ``concat_partition(a, b)`` / ``split_partition(x, n0)``: [Na, F] and [Nb, F] (Na + Nb <= 128) stacked on the
  partitions of one SBUF tile (b starts at partition Na, e.g. 40, not a multiple of 32) and stored once; and the
  inverse, one load and two stores of partition ranges.
- ``concat_free_hbm(a, b)``: [N, Fa] and [N, Fb] -> [N, Fa + Fb] by two HBM -> HBM ``dma_copy`` into column windows.
- ``permute_bshd_bhsd_dma(x)``: [B, S, H, D] -> [B, H, S, D] by one HBM -> HBM ``dma_copy`` of the
  ``.permute((0, 2, 1, 3))`` view; ``permute_bshd_bhsd_tiled(x)``: per (b, h) a strided load of x[b, :, h, :]
  (the ``rearrange`` view) into SBUF and a contiguous store; ``copy_contiguous(x)``: the same bytes copied
  straight, the timing reference.
- ``permute_bshd_bhds_pe(x)``: [B, S, H, D] -> [B, H, D, S] (S, D <= 128) by ``nc_transpose`` on the TensorE per
  (b, h) (the partition dim moves from S to D); ``permute_bshd_bhds_ap(x)``: the same by an explicit ``.ap`` DMA
  pattern reading x transposed from HBM.
- ``permute_bshd_bhds_dma(x)`` / ``permute_bshd_bhds_dmat(x)``: the same by one HBM -> HBM DMA of the
  ``.permute((0, 2, 3, 1))`` view (single-element runs) and by ``nisa.dma_transpose`` per (b, h).
- ``one_hot(ids, C)``: ids [N] int32 -> [N, C] fp32 by ``nisa.iota`` of the class ids and an ``equal`` against
  the per-partition id.
- ``embedding_bag(table, ids, weights, seg, n_bags)``: rows of table [V, H] gathered by id
  (``.ap(vector_offset=)``), weighted and summed per bag (``seg[n]`` = bag of item n): a [N, bags] selection
  matrix by iota + ``equal`` x weight, and one ``nc_matmul`` per 128 items accumulated in PSUM.
- ``cummax_free(x, tile_f)``: running max along the free axis with ``tensor_scalar_cumulative`` in column chunks,
  the first chunk ``reset_reduce``, the next ones ``reduce`` (the VectorE register carries the max across).
- ``cumsum_free_cumulative(x, tile_f)``: the same with ``add``. ``chain=False`` resets the register in every chunk
  (a per-chunk scan).
- ``run_starts(ids)``: int32 ids [N, F] (hashed, beyond 2^24) -> int32 [N, F] 1 where ids[:, j] != ids[:, j - 1]
  (and at j = 0): ``tensor_tensor(not_equal)`` of two shifted views of one int32 tile, the first column set by ``memset``.
- ``argsort_rank(x)``: rows [N, n] (n <= 64) sorted ascending with their indices by ranks: rank[i] =
  #{j: x[j] < x[i]} + #{j < i: x[j] == x[i]} from [N, n, n] broadcast compares and a ``tensor_reduce``, then
  ``sorted[k] = sum_i x[i] * (rank[i] == k)`` (one nonzero term: exact).
- ``bitonic_sort32(x)``: rows [N, 32] loaded transposed (``.ap``) and sorted across the partitions by the 15
  compare-exchange steps of a bitonic network (``nc_stream_shuffle`` partners, ``tensor_tensor`` compare, select
  by multiply-add), values and indices.
- ``pad_chw(x, pt, pb, pl, pr)``, ``crop_chw(x, t, l, h, w)``, ``roll_chw(x, sh, sw)``: constant zero padding
  through SBUF (memset + DMA into the interior), a crop HBM -> HBM and a circular shift along H and W by four
  HBM -> HBM DMAs of the wrapped quadrants.

Written for nsim's tests; not copies of any file. No nsim imports.
"""
import nki
import nki.isa as nisa
import nki.language as nl

P_MAX = 128


@nki.jit
def concat_partition(a, b):
  Na, F = a.shape
  Nb, Fb = b.shape
  assert F == Fb and Na + Nb <= P_MAX
  out = nl.ndarray((Na + Nb, F), dtype=a.dtype, buffer=nl.shared_hbm)
  t = nl.ndarray((Na + Nb, F), dtype=a.dtype, buffer=nl.sbuf)
  nisa.dma_copy(dst=t[0:Na, :], src=a)
  nisa.dma_copy(dst=t[Na:Na + Nb, :], src=b)
  nisa.dma_copy(dst=out, src=t)
  return out


@nki.jit
def split_partition(x, n0):
  N, F = x.shape
  assert 0 < n0 < N <= P_MAX
  top = nl.ndarray((n0, F), dtype=x.dtype, buffer=nl.shared_hbm)
  bot = nl.ndarray((N - n0, F), dtype=x.dtype, buffer=nl.shared_hbm)
  t = nl.ndarray((N, F), dtype=x.dtype, buffer=nl.sbuf)
  nisa.dma_copy(dst=t, src=x)
  nisa.dma_copy(dst=top, src=t[0:n0, :])
  nisa.dma_copy(dst=bot, src=t[n0:N, :])
  return top, bot


@nki.jit
def concat_free_hbm(a, b):
  N, Fa = a.shape
  _, Fb = b.shape
  out = nl.ndarray((N, Fa + Fb), dtype=a.dtype, buffer=nl.shared_hbm)
  nisa.dma_copy(dst=out[:, 0:Fa], src=a)
  nisa.dma_copy(dst=out[:, Fa:Fa + Fb], src=b)
  return out


@nki.jit
def permute_bshd_bhsd_dma(x):
  B, S, H, D = x.shape
  out = nl.ndarray((B, H, S, D), dtype=x.dtype, buffer=nl.shared_hbm)
  nisa.dma_copy(dst=out, src=x.permute((0, 2, 1, 3)))
  return out


@nki.jit
def permute_bshd_bhsd_tiled(x):
  B, S, H, D = x.shape
  assert S <= P_MAX
  out = nl.ndarray((B, H, S, D), dtype=x.dtype, buffer=nl.shared_hbm)
  xv = x.rearrange(('b', 's', 'h', 'd'), ('b', 'h', 's', 'd'))
  for b in nl.affine_range(B):
    for h in nl.affine_range(H):
      t = nl.ndarray((S, D), dtype=x.dtype, buffer=nl.sbuf)
      nisa.dma_copy(dst=t, src=xv[b, h])
      nisa.dma_copy(dst=out[b, h], src=t)
  return out


@nki.jit
def copy_contiguous(x):
  B, S, H, D = x.shape
  assert S <= P_MAX
  out = nl.ndarray((B, H, S, D), dtype=x.dtype, buffer=nl.shared_hbm)
  xf = x.reshape((B, H, S, D))
  for b in nl.affine_range(B):
    for h in nl.affine_range(H):
      t = nl.ndarray((S, D), dtype=x.dtype, buffer=nl.sbuf)
      nisa.dma_copy(dst=t, src=xf[b, h])
      nisa.dma_copy(dst=out[b, h], src=t)
  return out


@nki.jit
def permute_bshd_bhds_pe(x):
  B, S, H, D = x.shape
  assert S <= P_MAX and D <= P_MAX
  out = nl.ndarray((B, H, D, S), dtype=x.dtype, buffer=nl.shared_hbm)
  for b in nl.affine_range(B):
    for h in nl.affine_range(H):
      t = nl.ndarray((S, D), dtype=x.dtype, buffer=nl.sbuf)
      nisa.dma_copy(dst=t, src=x[b, :, h, :])
      tp = nl.ndarray((D, S), dtype=x.dtype, buffer=nl.psum)
      nisa.nc_transpose(dst=tp, data=t)
      ts = nl.ndarray((D, S), dtype=x.dtype, buffer=nl.sbuf)
      nisa.tensor_copy(dst=ts, src=tp)
      nisa.dma_copy(dst=out[b, h], src=ts)
  return out


@nki.jit
def permute_bshd_bhds_ap(x):
  B, S, H, D = x.shape
  assert D <= P_MAX
  out = nl.ndarray((B, H, D, S), dtype=x.dtype, buffer=nl.shared_hbm)
  for b in nl.affine_range(B):
    for h in nl.affine_range(H):
      t = nl.ndarray((D, S), dtype=x.dtype, buffer=nl.sbuf)
      # element (d, s) of x[b, :, h, :] sits at b*S*H*D + s*H*D + h*D + d
      nisa.dma_copy(dst=t, src=x.ap([[1, D], [H * D, S]], offset=b * S * H * D + h * D))
      nisa.dma_copy(dst=out[b, h], src=t)
  return out


@nki.jit
def one_hot(ids, C):
  N, = ids.shape
  out = nl.ndarray((N, C), dtype=nl.float32, buffer=nl.shared_hbm)
  cls = nl.ndarray((P_MAX, C), dtype=nl.int32, buffer=nl.sbuf)
  nisa.iota(dst=cls, pattern=[[1, C]], offset=0)
  for t in nl.affine_range((N + P_MAX - 1) // P_MAX):
    n0 = t * P_MAX
    rows = min(P_MAX, N - n0)
    idt = nl.ndarray((P_MAX, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=idt[:rows, :], src=ids[n0:n0 + rows].reshape((rows, 1)))
    idf = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=idf[:rows, :], src=idt[:rows, :])
    oh = nl.ndarray((P_MAX, C), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=oh[:rows, :], data=cls[:rows, :], op0=nl.equal, operand0=idf[:rows, :])
    nisa.dma_copy(dst=out[n0:n0 + rows, :], src=oh[:rows, :])
  return out


@nki.jit
def embedding_bag(table, ids, weights, seg, n_bags):
  V, H = table.shape
  N, = ids.shape
  assert n_bags <= P_MAX and H <= 512
  out = nl.ndarray((n_bags, H), dtype=nl.float32, buffer=nl.shared_hbm)
  bag = nl.ndarray((P_MAX, n_bags), dtype=nl.float32, buffer=nl.sbuf)
  nisa.iota(dst=bag, pattern=[[1, n_bags]], offset=0)
  acc = nl.ndarray((n_bags, H), dtype=nl.float32, buffer=nl.psum)
  NT = (N + P_MAX - 1) // P_MAX
  for t in nl.sequential_range(NT):
    n0 = t * P_MAX
    rows = min(P_MAX, N - n0)
    idt = nl.ndarray((P_MAX, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=idt[:rows, :], src=ids[n0:n0 + rows].reshape((rows, 1)))
    wt = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=wt[:rows, :], src=weights[n0:n0 + rows].reshape((rows, 1)))
    st = nl.ndarray((P_MAX, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=st[:rows, :], src=seg[n0:n0 + rows].reshape((rows, 1)))
    sf = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=sf[:rows, :], src=st[:rows, :])
    rows_t = nl.ndarray((P_MAX, H), dtype=table.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=rows_t[:rows, :], src=table.ap([[H, rows], [1, H]], vector_offset=idt[:rows, :], indirect_dim=0))
    sel = nl.ndarray((P_MAX, n_bags), dtype=table.dtype, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=sel[:rows, :], data=bag[:rows, :], op0=nl.equal, operand0=sf[:rows, :],
                       op1=nl.multiply, operand1=wt[:rows, :])
    nisa.nc_matmul(dst=acc, stationary=sel[:rows, :], moving=rows_t[:rows, :], accumulate=(t > 0))
  res = nl.ndarray((n_bags, H), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_copy(dst=res, src=acc)
  nisa.dma_copy(dst=out, src=res)
  return out


def _cumulative(x, tile_f, op, chain):
  N, F = x.shape
  out = nl.ndarray((N, F), dtype=x.dtype, buffer=nl.shared_hbm)
  for p in nl.affine_range((N + P_MAX - 1) // P_MAX):
    r0 = p * P_MAX
    rows = min(P_MAX, N - r0)
    for c in nl.sequential_range((F + tile_f - 1) // tile_f):
      c0 = c * tile_f
      cols = min(tile_f, F - c0)
      t = nl.ndarray((P_MAX, tile_f), dtype=x.dtype, buffer=nl.sbuf)
      nisa.dma_copy(dst=t[:rows, :cols], src=x[r0:r0 + rows, c0:c0 + cols])
      r = nl.ndarray((P_MAX, tile_f), dtype=x.dtype, buffer=nl.sbuf)
      nisa.tensor_scalar_cumulative(dst=r[:rows, :cols], src=t[:rows, :cols], op0=nl.add, op1=op, imm0=0.0,
                                    reduce_cmd=nisa.reduce_cmd.reduce if (chain and c > 0) else nisa.reduce_cmd.reset_reduce)
      nisa.dma_copy(dst=out[r0:r0 + rows, c0:c0 + cols], src=r[:rows, :cols])
  return out


@nki.jit
def cummax_free(x, tile_f=512, chain=True):
  return _cumulative(x, tile_f, nl.maximum, chain)


@nki.jit
def cumsum_free_cumulative(x, tile_f=512, chain=True):
  return _cumulative(x, tile_f, nl.add, chain)


@nki.jit
def argsort_rank(x):
  N, n = x.shape
  assert N <= P_MAX and n <= 64
  vals = nl.ndarray((N, n), dtype=x.dtype, buffer=nl.shared_hbm)
  idxs = nl.ndarray((N, n), dtype=nl.int32, buffer=nl.shared_hbm)
  xt = nl.ndarray((N, n), dtype=nl.float32, buffer=nl.sbuf)
  nisa.dma_copy(dst=xt, src=x)
  xi = xt.expand_dim(2).broadcast(2, n)      # [N, i, j] -> x[i]
  xj = xt.expand_dim(1).broadcast(1, n)      # [N, i, j] -> x[j]
  lt = nl.ndarray((N, n, n), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_tensor(dst=lt, data1=xj, data2=xi, op=nl.less)
  eq = nl.ndarray((N, n, n), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_tensor(dst=eq, data1=xj, data2=xi, op=nl.equal)
  # keep ties only for j < i, i.e. i - j - 1 >= 0
  eqb = nl.ndarray((N, n, n), dtype=nl.float32, buffer=nl.sbuf)
  nisa.affine_select(dst=eqb, pattern=[[1, n], [-1, n]], channel_multiplier=0, on_true_tile=eq,
                     on_false_value=0.0, cmp_op=nl.greater_equal, offset=-1)
  nisa.tensor_tensor(dst=lt, data1=lt, data2=eqb, op=nl.add)
  rank = nl.ndarray((N, n), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_reduce(dst=rank, op=nl.add, data=lt, axis=2)
  # sel[N, k, i] = (rank[i] == k)
  kk = nl.ndarray((N, n, n), dtype=nl.float32, buffer=nl.sbuf)
  nisa.iota(dst=kk, pattern=[[1, n], [0, n]], offset=0)
  sel = nl.ndarray((N, n, n), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_tensor(dst=sel, data1=rank.expand_dim(1).broadcast(1, n), data2=kk, op=nl.equal)
  prod = nl.ndarray((N, n, n), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_tensor(dst=prod, data1=sel, data2=xt.expand_dim(1).broadcast(1, n), op=nl.multiply)
  sv = nl.ndarray((N, n), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_reduce(dst=sv, op=nl.add, data=prod, axis=2)
  ii = nl.ndarray((N, n, n), dtype=nl.float32, buffer=nl.sbuf)
  nisa.iota(dst=ii, pattern=[[0, n], [1, n]], offset=0)
  nisa.tensor_tensor(dst=prod, data1=sel, data2=ii, op=nl.multiply)
  si = nl.ndarray((N, n), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_reduce(dst=si, op=nl.add, data=prod, axis=2)
  sv_o = nl.ndarray((N, n), dtype=x.dtype, buffer=nl.sbuf)
  nisa.tensor_copy(dst=sv_o, src=sv)
  si_o = nl.ndarray((N, n), dtype=nl.int32, buffer=nl.sbuf)
  nisa.tensor_copy(dst=si_o, src=si)
  nisa.dma_copy(dst=vals, src=sv_o)
  nisa.dma_copy(dst=idxs, src=si_o)
  return vals, idxs


@nki.jit
def pad_chw(x, pt, pb, pl, pr):
  C, H, W = x.shape
  assert C <= P_MAX
  Ho, Wo = H + pt + pb, W + pl + pr
  out = nl.ndarray((C, Ho, Wo), dtype=x.dtype, buffer=nl.shared_hbm)
  t = nl.ndarray((C, Ho, Wo), dtype=x.dtype, buffer=nl.sbuf)
  nisa.memset(dst=t, value=0.0)
  nisa.dma_copy(dst=t[:, pt:pt + H, pl:pl + W], src=x)
  nisa.dma_copy(dst=out, src=t)
  return out


@nki.jit
def crop_chw(x, top, left, h, w):
  C, H, W = x.shape
  out = nl.ndarray((C, h, w), dtype=x.dtype, buffer=nl.shared_hbm)
  nisa.dma_copy(dst=out, src=x[:, top:top + h, left:left + w])
  return out


@nki.jit
def roll_chw(x, sh, sw):
  C, H, W = x.shape
  sh, sw = sh % H, sw % W
  assert 0 < sh < H and 0 < sw < W
  out = nl.ndarray((C, H, W), dtype=x.dtype, buffer=nl.shared_hbm)
  # out[:, (i + sh) % H, (j + sw) % W] = x[:, i, j]
  nisa.dma_copy(dst=out[:, sh:H, sw:W], src=x[:, 0:H - sh, 0:W - sw])
  nisa.dma_copy(dst=out[:, sh:H, 0:sw], src=x[:, 0:H - sh, W - sw:W])
  nisa.dma_copy(dst=out[:, 0:sh, sw:W], src=x[:, H - sh:H, 0:W - sw])
  nisa.dma_copy(dst=out[:, 0:sh, 0:sw], src=x[:, H - sh:H, W - sw:W])
  return out


@nki.jit
def permute_bshd_bhds_dma(x):
  """[B, S, H, D] -> [B, H, D, S] by one HBM -> HBM DMA of the permuted view (element-granular descriptors)."""
  B, S, H, D = x.shape
  out = nl.ndarray((B, H, D, S), dtype=x.dtype, buffer=nl.shared_hbm)
  nisa.dma_copy(dst=out, src=x.permute((0, 2, 3, 1)))
  return out


@nki.jit
def permute_bshd_bhds_dmat(x):
  """[B, S, H, D] -> [B, H, D, S] by ``dma_transpose`` of each x[b, :, h, :] [S, D] into SBUF [D, S]."""
  B, S, H, D = x.shape
  assert S <= P_MAX and D <= P_MAX
  out = nl.ndarray((B, H, D, S), dtype=x.dtype, buffer=nl.shared_hbm)
  for b in nl.affine_range(B):
    for h in nl.affine_range(H):
      t = nl.ndarray((D, S), dtype=x.dtype, buffer=nl.sbuf)
      nisa.dma_transpose(dst=t, src=x[b, :, h, :])
      nisa.dma_copy(dst=out[b, h], src=t)
  return out


def _keep_min_col(pi, k, j):
  """(P, 1) fp32: 1 where partition p keeps the min of its pair in bitonic stage (k, j) (ascending overall)."""
  P = pi.shape[0]
  a = nl.ndarray((P, 1), dtype=nl.int32, buffer=nl.sbuf)
  nisa.tensor_scalar(dst=a, data=pi, op0=nl.bitwise_and, operand0=k)
  az = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_scalar(dst=az, data=a, op0=nl.equal, operand0=0)
  b = nl.ndarray((P, 1), dtype=nl.int32, buffer=nl.sbuf)
  nisa.tensor_scalar(dst=b, data=pi, op0=nl.bitwise_and, operand0=j)
  bz = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_scalar(dst=bz, data=b, op0=nl.equal, operand0=0)
  keep = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_tensor(dst=keep, data1=az, data2=bz, op=nl.equal)
  return keep


@nki.jit
def bitonic_sort32(x):
  """Rows x [N, 32] (N <= 512, distinct values) sorted ascending with their indices: the rows are loaded
  transposed ([32, N], one element of every row per partition), sorted along the partitions by the 15
  compare-exchange steps of a bitonic network (``nc_stream_shuffle`` brings each partner, ``tensor_tensor``
  compares, multiply-add selects), and stored back transposed."""
  N, n = x.shape
  assert n == 32 and N <= 512
  vals = nl.ndarray((N, n), dtype=x.dtype, buffer=nl.shared_hbm)
  idxs = nl.ndarray((N, n), dtype=nl.int32, buffer=nl.shared_hbm)
  v = nl.ndarray((n, N), dtype=nl.float32, buffer=nl.sbuf)
  vin = nl.ndarray((n, N), dtype=x.dtype, buffer=nl.sbuf)
  nisa.dma_copy(dst=vin, src=x.ap([[1, n], [n, N]]))
  nisa.tensor_copy(dst=v, src=vin)
  ix = nl.ndarray((n, N), dtype=nl.float32, buffer=nl.sbuf)
  nisa.iota(dst=ix, pattern=[[0, N]], offset=0, channel_multiplier=1)
  pi = nl.ndarray((n, 1), dtype=nl.int32, buffer=nl.sbuf)
  nisa.iota(dst=pi, pattern=[[0, 1]], offset=0, channel_multiplier=1)
  k = 2
  while k <= n:
    j = k // 2
    while j >= 1:
      keep = _keep_min_col(pi, k, j)
      mask = [i ^ j for i in range(32)]
      pv = nl.ndarray((n, N), dtype=nl.float32, buffer=nl.sbuf)
      nisa.nc_stream_shuffle(dst=pv, src=v, shuffle_mask=mask)
      pix = nl.ndarray((n, N), dtype=nl.float32, buffer=nl.sbuf)
      nisa.nc_stream_shuffle(dst=pix, src=ix, shuffle_mask=mask)
      self_min = nl.ndarray((n, N), dtype=nl.float32, buffer=nl.sbuf)
      nisa.tensor_tensor(dst=self_min, data1=v, data2=pv, op=nl.less)
      take = nl.ndarray((n, N), dtype=nl.float32, buffer=nl.sbuf)   # 1: keep own element
      nisa.tensor_scalar(dst=take, data=self_min, op0=nl.equal, operand0=keep)
      other = nl.ndarray((n, N), dtype=nl.float32, buffer=nl.sbuf)  # 1 - take
      nisa.tensor_scalar(dst=other, data=take, op0=nl.multiply, operand0=-1.0, op1=nl.add, operand1=1.0)
      for cur, par in ((v, pv), (ix, pix)):
        t0 = nl.ndarray((n, N), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=t0, data1=cur, data2=take, op=nl.multiply)
        t1 = nl.ndarray((n, N), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=t1, data1=par, data2=other, op=nl.multiply)
        nisa.tensor_tensor(dst=cur, data1=t0, data2=t1, op=nl.add)
      j //= 2
    k *= 2
  vo = nl.ndarray((n, N), dtype=x.dtype, buffer=nl.sbuf)
  nisa.tensor_copy(dst=vo, src=v)
  io = nl.ndarray((n, N), dtype=nl.int32, buffer=nl.sbuf)
  nisa.tensor_copy(dst=io, src=ix)
  nisa.dma_copy(dst=vals.ap([[1, n], [n, N]]), src=vo)
  nisa.dma_copy(dst=idxs.ap([[1, n], [n, N]]), src=io)
  return vals, idxs


@nki.jit
def run_starts(ids):
  N, F = ids.shape
  assert N <= P_MAX
  out = nl.ndarray((N, F), dtype=nl.int32, buffer=nl.shared_hbm)
  t = nl.ndarray((N, F), dtype=nl.int32, buffer=nl.sbuf)
  nisa.dma_copy(dst=t, src=ids)
  r = nl.ndarray((N, F), dtype=nl.int32, buffer=nl.sbuf)
  nisa.memset(dst=r[:, 0:1], value=1)
  nisa.tensor_tensor(dst=r[:, 1:F], data1=t[:, 1:F], data2=t[:, 0:F - 1], op=nl.not_equal)
  nisa.dma_copy(dst=out, src=r)
  return out
