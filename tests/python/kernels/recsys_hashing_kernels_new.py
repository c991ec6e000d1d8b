"""Recommendation-model kernels in the new NKI dialect (``import nki``, ISA calls writing ``dst=``, ``.ap(...)``
access patterns), written the way public NKI 0.3+ ports of DLRM / DCN-v2 / feature hashing write them:

- ``embedding_bag_tbe(table, ids, offsets, per_sample_weights, mode, padding_idx, max_bag)``: ``EmbeddingBag``
  forward (``include_last_offset=True`` offsets [B + 1] int32, ids [N] int32, table [V, D], weights [N] or None),
  128 bags on the partitions and a loop over the bag slots j < max_bag: slot j of bag b is item offsets[b] + j
  (clamped to N - 1; live while < offsets[b + 1]); its id and weight are gathered from ids / weights viewed [N, 1]
  and the table row from table, all by ``.ap(pattern, vector_offset=, indirect_dim=0)`` DMAs. Modes sum (times the
  weights), mean (over the live non-padding items), max (0 for a bag with none); ``padding_idx`` ids are ignored.
  fp32 pooling, output [B, D] in the table's dtype.
- ``embedding_bag_onehot(table, ids, offsets, per_sample_weights, mode, padding_idx)``: the same sum / mean bags for
  a small table (V <= 128) with no gather at all: per tile of 128 items the one-hot O[n, v] = (ids[n] == v) * w[n]
  (``iota`` of v compared with the id column, times the weight and non-padding column) and the segment matrix
  S[n, b] = (offsets[b] <= n < offsets[b + 1]) accumulate the bag-by-id weights C^T[v, b] = sum_n O[n, v] S[n, b]
  in PSUM; out = C table by one more matmul (mean: divided by the counts, a matmul of S with the keep column).
  B <= 128, D <= 512.
- ``hashed_embedding(ids, table, mode)``: murmur3 fmix32 of int32 ids on chip (``tensor_scalar`` logical right
  shifts, ``tensor_tensor`` bitwise_xor and int32 x int32 multiplies wrapping mod 2^32, multipliers ``memset`` into
  int32 tiles), bucket ``h & (V - 1)`` ("mask", power-of-two V) or ``((h >> 16) * V) >> 16`` ("fastrange", any
  V <= 65536, float-free), then the row gather by ``vector_offset``. Outputs buckets [N] int32 and rows [N, D].
- ``dcn_cross(x0T, w, b)`` / ``dcn_cross_lowrank(x0T, v, ut, b)``: DCN-v2 cross layers x_{l+1} = x0 * (W_l x_l +
  b_l) + x_l in the transposed layout (features on the partitions, batch B <= 512 on the free axis): x0T [D, B];
  full rank w [L, D, D] (w[l] is [in, out]); low rank W_l = U_l V_l^T with v [L, D, r] and ut [L, r, D] (U_l^T),
  r <= 128: t = V^T x (one PSUM tile) then U t. The bias add and the x0 product fused into the PSUM eviction
  (``scalar_tensor_tensor``), the residual by ``tensor_tensor``; x_l ping-pongs between two SBUF buffers. Output
  x_L^T [D, B].

Written for nsim's tests in the style of those kernels; not copies of any file. No nsim imports.
"""
import nki
import nki.isa as nisa
import nki.language as nl

P_MAX = 128
NEG_BIG = -3.0e38


def div_ceil(n, d):
  return (n + d - 1) // d


def _as_int32(c):
  return c - (1 << 32) if c >= (1 << 31) else c


@nki.jit
def embedding_bag_tbe(table, ids, offsets, per_sample_weights=None, mode="sum", padding_idx=-1, max_bag=8):
  V, D = table.shape
  N = ids.shape[0]
  B = offsets.shape[0] - 1
  assert mode in ("sum", "mean", "max")
  assert per_sample_weights is None or mode == "sum"
  out = nl.ndarray((B, D), dtype=table.dtype, buffer=nl.shared_hbm)
  ids2 = ids.reshape((N, 1))
  off2 = offsets.reshape((B + 1, 1))

  for t in nl.affine_range(div_ceil(B, P_MAX)):
    b0 = t * P_MAX
    nb = min(P_MAX, B - b0)
    start = nl.ndarray((P_MAX, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=start[:nb, :], src=off2[b0:b0 + nb, :])
    end = nl.ndarray((P_MAX, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=end[:nb, :], src=off2[b0 + 1:b0 + 1 + nb, :])
    acc = nl.ndarray((P_MAX, D), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=acc[:nb, :], value=(NEG_BIG if mode == "max" else 0.0))
    cnt = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=cnt[:nb, :], value=0.0)

    for j in nl.sequential_range(max_bag):
      pos = nl.ndarray((P_MAX, 1), dtype=nl.int32, buffer=nl.sbuf)
      nisa.tensor_scalar(dst=pos[:nb, :], data=start[:nb, :], op0=nl.add, operand0=j, op1=nl.minimum,
                         operand1=N - 1)
      live = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
      nisa.tensor_scalar(dst=live[:nb, :], data=start[:nb, :], op0=nl.add, operand0=j)
      nisa.tensor_tensor(dst=live[:nb, :], data1=live[:nb, :], data2=end[:nb, :], op=nl.less)
      idj = nl.ndarray((P_MAX, 1), dtype=nl.int32, buffer=nl.sbuf)
      nisa.dma_copy(dst=idj[:nb, :], src=ids2.ap([[1, nb], [1, 1]], vector_offset=pos[:nb, :], indirect_dim=0))
      row = nl.ndarray((P_MAX, D), dtype=table.dtype, buffer=nl.sbuf)
      nisa.dma_copy(dst=row[:nb, :], src=table.ap([[D, nb], [1, D]], vector_offset=idj[:nb, :], indirect_dim=0))
      keep = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
      nisa.tensor_scalar(dst=keep[:nb, :], data=idj[:nb, :], op0=nl.not_equal, operand0=padding_idx)
      nisa.tensor_tensor(dst=keep[:nb, :], data1=keep[:nb, :], data2=live[:nb, :], op=nl.multiply)
      nisa.tensor_tensor(dst=cnt[:nb, :], data1=cnt[:nb, :], data2=keep[:nb, :], op=nl.add)
      if mode == "max":
        pen = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=pen[:nb, :], data=keep[:nb, :], op0=nl.subtract, operand0=1.0, op1=nl.multiply,
                           operand1=-NEG_BIG)
        cand = nl.ndarray((P_MAX, D), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=cand[:nb, :], data=row[:nb, :], op0=nl.multiply, operand0=keep[:nb, :],
                           op1=nl.add, operand1=pen[:nb, :])
        nisa.tensor_tensor(dst=acc[:nb, :], data1=acc[:nb, :], data2=cand[:nb, :], op=nl.maximum)
      else:
        if per_sample_weights is not None:
          wj = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
          nisa.dma_copy(dst=wj[:nb, :], src=per_sample_weights.reshape((N, 1)).ap(
              [[1, nb], [1, 1]], vector_offset=pos[:nb, :], indirect_dim=0))
          nisa.tensor_tensor(dst=keep[:nb, :], data1=keep[:nb, :], data2=wj[:nb, :], op=nl.multiply)
        # acc += row * keep
        nisa.scalar_tensor_tensor(dst=acc[:nb, :], data=row[:nb, :], op0=nl.multiply, operand0=keep[:nb, :],
                                  op1=nl.add, operand1=acc[:nb, :])

    res = nl.ndarray((P_MAX, D), dtype=table.dtype, buffer=nl.sbuf)
    if mode == "mean":
      nisa.tensor_scalar(dst=cnt[:nb, :], data=cnt[:nb, :], op0=nl.maximum, operand0=1.0)
      nisa.tensor_scalar(dst=res[:nb, :], data=acc[:nb, :], op0=nl.divide, operand0=cnt[:nb, :])
    elif mode == "max":
      nisa.tensor_scalar(dst=cnt[:nb, :], data=cnt[:nb, :], op0=nl.greater, operand0=0.0)
      nisa.tensor_scalar(dst=res[:nb, :], data=acc[:nb, :], op0=nl.multiply, operand0=cnt[:nb, :])
    else:
      nisa.tensor_copy(dst=res[:nb, :], src=acc[:nb, :])
    nisa.dma_copy(dst=out[b0:b0 + nb, :], src=res[:nb, :])
  return out


@nki.jit
def embedding_bag_onehot(table, ids, offsets, per_sample_weights=None, mode="sum", padding_idx=-1):
  V, D = table.shape
  N = ids.shape[0]
  B = offsets.shape[0] - 1
  assert V <= P_MAX and B <= P_MAX and D <= 512 and mode in ("sum", "mean")
  out = nl.ndarray((B, D), dtype=table.dtype, buffer=nl.shared_hbm)
  ids2 = ids.reshape((N, 1))

  tab = nl.ndarray((V, D), dtype=table.dtype, buffer=nl.sbuf)
  nisa.dma_copy(dst=tab, src=table)
  # bag starts / ends along the free axis on every partition (stride-0 partition reads), as fp32
  offs_i = nl.ndarray((P_MAX, B + 1), dtype=nl.int32, buffer=nl.sbuf)
  nisa.dma_copy(dst=offs_i, src=offsets.ap([[0, P_MAX], [1, B + 1]]))
  offs = nl.ndarray((P_MAX, B + 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_copy(dst=offs, src=offs_i)
  v_iota = nl.ndarray((P_MAX, V), dtype=nl.float32, buffer=nl.sbuf)
  nisa.iota(dst=v_iota, pattern=[[1, V]], offset=0, channel_multiplier=0)
  ones = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.memset(dst=ones, value=1.0)

  ct_ps = nl.ndarray((V, B), dtype=nl.float32, buffer=nl.psum)
  cnt_ps = nl.ndarray((B, 1), dtype=nl.float32, buffer=nl.psum)
  NT = div_ceil(N, P_MAX)
  for t in nl.sequential_range(NT):
    n0 = t * P_MAX
    rows = min(P_MAX, N - n0)
    idc = nl.ndarray((P_MAX, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=idc[:rows, :], src=ids2[n0:n0 + rows, :])
    keep = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=keep[:rows, :], data=idc[:rows, :], op0=nl.not_equal, operand0=padding_idx)
    w = keep
    if per_sample_weights is not None:
      w = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
      nisa.dma_copy(dst=w[:rows, :], src=per_sample_weights.reshape((N, 1))[n0:n0 + rows, :])
      nisa.tensor_tensor(dst=w[:rows, :], data1=w[:rows, :], data2=keep[:rows, :], op=nl.multiply)
    # one-hot of the ids, weighted
    oh = nl.ndarray((P_MAX, V), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=oh[:rows, :], data=v_iota[:rows, :], op0=nl.equal, operand0=idc[:rows, :],
                       op1=nl.multiply, operand1=w[:rows, :])
    # segment matrix: start[b] <= n < end[b]
    n_col = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.iota(dst=n_col[:rows, :], pattern=[[0, 1]], offset=n0, channel_multiplier=1)
    seg = nl.ndarray((P_MAX, B), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=seg[:rows, :], data=offs[:rows, 0:B], op0=nl.less_equal, operand0=n_col[:rows, :])
    lt = nl.ndarray((P_MAX, B), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=lt[:rows, :], data=offs[:rows, 1:B + 1], op0=nl.greater, operand0=n_col[:rows, :])
    nisa.tensor_tensor(dst=seg[:rows, :], data1=seg[:rows, :], data2=lt[:rows, :], op=nl.multiply)
    nisa.nc_matmul(dst=ct_ps, stationary=oh[:rows, :], moving=seg[:rows, :], accumulate=(t > 0))
    if mode == "mean":
      segk = nl.ndarray((P_MAX, B), dtype=nl.float32, buffer=nl.sbuf)
      nisa.tensor_scalar(dst=segk[:rows, :], data=seg[:rows, :], op0=nl.multiply, operand0=keep[:rows, :])
      nisa.nc_matmul(dst=cnt_ps, stationary=segk[:rows, :], moving=ones[:rows, :], accumulate=(t > 0))

  ct = nl.ndarray((V, B), dtype=table.dtype, buffer=nl.sbuf)
  nisa.tensor_copy(dst=ct, src=ct_ps)
  o_ps = nl.ndarray((B, D), dtype=nl.float32, buffer=nl.psum)
  nisa.nc_matmul(dst=o_ps, stationary=ct, moving=tab)
  res = nl.ndarray((B, D), dtype=table.dtype, buffer=nl.sbuf)
  if mode == "mean":
    cnt = nl.ndarray((B, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=cnt, data=cnt_ps, op0=nl.maximum, operand0=1.0)
    nisa.tensor_scalar(dst=res, data=o_ps, op0=nl.divide, operand0=cnt)
  else:
    nisa.tensor_copy(dst=res, src=o_ps)
  nisa.dma_copy(dst=out, src=res)
  return out


@nki.jit
def hashed_embedding(ids, table, mode="mask"):
  N = ids.shape[0]
  V, D = table.shape
  assert mode in ("mask", "fastrange")
  assert (V & (V - 1) == 0) if mode == "mask" else V <= 65536
  buckets = nl.ndarray((N,), dtype=nl.int32, buffer=nl.shared_hbm)
  out = nl.ndarray((N, D), dtype=table.dtype, buffer=nl.shared_hbm)
  ids2 = ids.reshape((N, 1))
  b2 = buckets.reshape((N, 1))

  mul_a = nl.ndarray((P_MAX, 1), dtype=nl.int32, buffer=nl.sbuf)
  nisa.memset(dst=mul_a, value=_as_int32(0x85EBCA6B))
  mul_b = nl.ndarray((P_MAX, 1), dtype=nl.int32, buffer=nl.sbuf)
  nisa.memset(dst=mul_b, value=_as_int32(0xC2B2AE35))
  size = nl.ndarray((P_MAX, 1), dtype=nl.int32, buffer=nl.sbuf)
  nisa.memset(dst=size, value=V)

  for t in nl.affine_range(div_ceil(N, P_MAX)):
    n0 = t * P_MAX
    rows = min(P_MAX, N - n0)
    h = nl.ndarray((P_MAX, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=h[:rows, :], src=ids2[n0:n0 + rows, :])
    s = nl.ndarray((P_MAX, 1), dtype=nl.int32, buffer=nl.sbuf)
    for shift, mul in ((16, mul_a), (13, mul_b), (16, None)):
      nisa.tensor_scalar(dst=s[:rows, :], data=h[:rows, :], op0=nl.right_shift, operand0=shift)
      nisa.tensor_tensor(dst=h[:rows, :], data1=h[:rows, :], data2=s[:rows, :], op=nl.bitwise_xor)
      if mul is not None:
        nisa.tensor_tensor(dst=h[:rows, :], data1=h[:rows, :], data2=mul[:rows, :], op=nl.multiply)
    bucket = nl.ndarray((P_MAX, 1), dtype=nl.int32, buffer=nl.sbuf)
    if mode == "mask":
      nisa.tensor_scalar(dst=bucket[:rows, :], data=h[:rows, :], op0=nl.bitwise_and, operand0=V - 1)
    else:
      nisa.tensor_scalar(dst=s[:rows, :], data=h[:rows, :], op0=nl.right_shift, operand0=16)
      nisa.tensor_tensor(dst=s[:rows, :], data1=s[:rows, :], data2=size[:rows, :], op=nl.multiply)
      nisa.tensor_scalar(dst=bucket[:rows, :], data=s[:rows, :], op0=nl.right_shift, operand0=16)
    nisa.dma_copy(dst=b2[n0:n0 + rows, :], src=bucket[:rows, :])
    emb = nl.ndarray((P_MAX, D), dtype=table.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=emb[:rows, :], src=table.ap([[D, rows], [1, D]], vector_offset=bucket[:rows, :],
                                                    indirect_dim=0))
    nisa.dma_copy(dst=out[n0:n0 + rows, :], src=emb[:rows, :])
  return buckets, out


def _cross_update(x0_sb, x_cur, x_nxt, ps, b_sb, l, n, nn, B):
  """x_nxt[n] = x0[n] * (ps + b[l, n]) + x_cur[n] for one 128-feature tile n."""
  tmp = nl.ndarray((P_MAX, B), dtype=nl.float32, buffer=nl.sbuf)
  nisa.scalar_tensor_tensor(dst=tmp[:nn, :], data=ps[:nn, :], op0=nl.add, operand0=b_sb[:nn, l, n:n + 1],
                            op1=nl.multiply, operand1=x0_sb[:nn, n, :])
  nisa.tensor_tensor(dst=x_nxt[:nn, n, :], data1=tmp[:nn, :], data2=x_cur[:nn, n, :], op=nl.add)


def _load_cross_inputs(x0T, b, DT, D, B, L):
  x0_sb = nl.ndarray((P_MAX, DT, B), dtype=nl.float32, buffer=nl.sbuf)
  b_sb = nl.ndarray((P_MAX, L, DT), dtype=nl.float32, buffer=nl.sbuf)
  for k in nl.static_range(DT):
    kk = min(P_MAX, D - k * P_MAX)
    nisa.dma_copy(dst=x0_sb[:kk, k, :], src=x0T[k * P_MAX:k * P_MAX + kk, :])
    # b[l, k*128 + p] onto partition p, one column per layer
    nisa.dma_copy(dst=b_sb[:kk, :, k], src=b.ap([[1, kk], [D, L]], offset=k * P_MAX))
  return x0_sb, b_sb


@nki.jit
def dcn_cross(x0T, w, b):
  D, B = x0T.shape
  L = w.shape[0]
  assert B <= 512 and w.shape == (L, D, D)
  DT = div_ceil(D, P_MAX)
  out = nl.ndarray((D, B), dtype=x0T.dtype, buffer=nl.shared_hbm)
  x0_sb, b_sb = _load_cross_inputs(x0T, b, DT, D, B, L)
  xa = nl.ndarray((P_MAX, DT, B), dtype=nl.float32, buffer=nl.sbuf)
  xb = nl.ndarray((P_MAX, DT, B), dtype=nl.float32, buffer=nl.sbuf)
  bufs = (xa, xb)
  x_cur = x0_sb
  for l in nl.static_range(L):
    x_nxt = bufs[l % 2]
    for n in nl.static_range(DT):
      nn = min(P_MAX, D - n * P_MAX)
      ps = nl.ndarray((P_MAX, B), dtype=nl.float32, buffer=nl.psum)
      for k in nl.static_range(DT):
        kk = min(P_MAX, D - k * P_MAX)
        w_sb = nl.ndarray((P_MAX, P_MAX), dtype=w.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=w_sb[:kk, :nn], src=w[l, k * P_MAX:k * P_MAX + kk, n * P_MAX:n * P_MAX + nn])
        nisa.nc_matmul(dst=ps[:nn, :], stationary=w_sb[:kk, :nn], moving=x_cur[:kk, k, :], accumulate=(k > 0))
      _cross_update(x0_sb, x_cur, x_nxt, ps, b_sb, l, n, nn, B)
    x_cur = x_nxt
  for n in nl.static_range(DT):
    nn = min(P_MAX, D - n * P_MAX)
    o = nl.ndarray((P_MAX, B), dtype=x0T.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=o[:nn, :], src=x_cur[:nn, n, :])
    nisa.dma_copy(dst=out[n * P_MAX:n * P_MAX + nn, :], src=o[:nn, :])
  return out


@nki.jit
def dcn_cross_lowrank(x0T, v, ut, b):
  D, B = x0T.shape
  L, _, R = v.shape
  assert B <= 512 and R <= P_MAX and ut.shape == (L, R, D)
  DT = div_ceil(D, P_MAX)
  out = nl.ndarray((D, B), dtype=x0T.dtype, buffer=nl.shared_hbm)
  x0_sb, b_sb = _load_cross_inputs(x0T, b, DT, D, B, L)
  xa = nl.ndarray((P_MAX, DT, B), dtype=nl.float32, buffer=nl.sbuf)
  xb = nl.ndarray((P_MAX, DT, B), dtype=nl.float32, buffer=nl.sbuf)
  bufs = (xa, xb)
  x_cur = x0_sb
  for l in nl.static_range(L):
    x_nxt = bufs[l % 2]
    # t = V^T x  [R, B]
    t_ps = nl.ndarray((R, B), dtype=nl.float32, buffer=nl.psum)
    for k in nl.static_range(DT):
      kk = min(P_MAX, D - k * P_MAX)
      v_sb = nl.ndarray((P_MAX, R), dtype=v.dtype, buffer=nl.sbuf)
      nisa.dma_copy(dst=v_sb[:kk, :], src=v[l, k * P_MAX:k * P_MAX + kk, :])
      nisa.nc_matmul(dst=t_ps, stationary=v_sb[:kk, :], moving=x_cur[:kk, k, :], accumulate=(k > 0))
    t_sb = nl.ndarray((R, B), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=t_sb, src=t_ps)
    ut_sb = nl.ndarray((R, D), dtype=ut.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=ut_sb, src=ut[l])
    for n in nl.static_range(DT):
      nn = min(P_MAX, D - n * P_MAX)
      ps = nl.ndarray((P_MAX, B), dtype=nl.float32, buffer=nl.psum)
      nisa.nc_matmul(dst=ps[:nn, :], stationary=ut_sb[:, n * P_MAX:n * P_MAX + nn], moving=t_sb)
      _cross_update(x0_sb, x_cur, x_nxt, ps, b_sb, l, n, nn, B)
    x_cur = x_nxt
  for n in nl.static_range(DT):
    nn = min(P_MAX, D - n * P_MAX)
    o = nl.ndarray((P_MAX, B), dtype=x0T.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=o[:nn, :], src=x_cur[:nn, n, :])
    nisa.dma_copy(dst=out[n * P_MAX:n * P_MAX + nn, :], src=o[:nn, :])
  return out
