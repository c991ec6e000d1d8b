"""Recommendation-model kernels in the Beta-1 dialect (``neuronxcc.nki``), written the way public NKI ports of DLRM,
DCN and feature-hashing pipelines write them (arange index expressions, value-returning ``nl`` / ``nisa`` calls,
indirect DMA with a tile of row indices as the first index item):

- ``embedding_bag(table, ids, offsets, per_sample_weights, mode, padding_idx, max_bag)``: ``torch.nn.EmbeddingBag``
  forward with ``include_last_offset=True`` offsets. table [V, D], ids [N] int32, offsets [B + 1] int32 (bag b is
  ids[offsets[b]:offsets[b + 1]], any length 0..max_bag), per_sample_weights [N] fp32 or None (sum mode only).
  FBGEMM-TBE style: 128 bags on the partitions, a loop over the bag slots j < max_bag; slot j of bag b is item
  offsets[b] + j (clamped to N - 1, live while < offsets[b + 1]); its id is gathered by an indirect DMA from ids
  viewed [N, 1], then the table row by a second indirect DMA (``table[idj[i_p, 0], i_d]``). ``mode`` "sum" (times
  the weights), "mean" (over the live non-padding items) or "max" (elementwise; 0 for a bag with no item). Items
  whose id is ``padding_idx`` are ignored (not counted by the mean). Output [B, D] in the table's dtype; pooling in
  fp32.
- ``embedding_bag_segment(table, ids, offsets, per_sample_weights, mode, padding_idx)``: sum / mean bags with the
  items on the partitions (tiles of 128, the tail clamped): each item's row gathered once, then pooled by a matmul
  with the [items, B] segment matrix S[n, b] = (offsets[b] <= n < offsets[b + 1]) * weight[n] built on chip
  (``iota`` of n against the offsets broadcast to the partitions), accumulated over the item tiles in PSUM; the
  mean's counts by a second matmul with a ones column. B <= 128, D <= 512.
- ``hashed_embedding(ids, table, mode)``: feature hashing on chip. int32 ids [N] -> murmur3's fmix32
  (``h ^= h >> 16; h *= 0x85ebca6b; h ^= h >> 13; h *= 0xc2b2ae35; h ^= h >> 16``) with logical right shifts,
  bitwise xor and int32 x int32 multiplies (wrapping mod 2^32), then the bucket in [0, V): a power-of-two V by
  ``h & (V - 1)`` ("mask"), any V <= 65536 by the float-free multiply-shift range reduction
  ``((h >> 16) * V) >> 16`` ("fastrange"). Outputs the buckets [N] int32 and the gathered rows [N, D].
- ``dot_interaction(x)``: DLRM's dot feature interaction, 128 samples on the partitions. x [B, F, D] (feature 0 the
  bottom-MLP output, 1..F-1 the embeddings); out [B, D + F (F - 1) / 2] = concat(x[:, 0], Z[b, i, j] for the
  strictly lower triangle in row-major order (i = 1..F-1, j < i)), Z = x x^T per sample: for each i one multiply of
  x[:, :i, :] by the broadcast x[:, i, :] and one reduce over D. fp32 out.
- ``dot_interaction_pe(x)``: the same per sample on the PE (``load_transpose2d`` of x[b], Z = nc_matmul(xT, xT))
  with the triangle stored row by row: the naive port.
- ``mlp2_t(xT, w1, b1, w2, b2, relu_last)``: two linear layers with ReLU, DLRM's bottom / top MLP, in the
  transposed layout (features on the partitions, batch on the free axis, chunks of 512): h = relu(W1^T x + b1)
  kept on chip as 128-row blocks, y = W2^T h + b2 (ReLU if ``relu_last``); biases fused into the PSUM eviction
  (``nisa.activation`` with a per-partition bias). xT [K, B], w1 [K, N1], b1 [N1], w2 [N1, N2], b2 [N2] -> [N2, B].

Written for nsim's tests in the style of those kernels; not copies of any file. No nsim imports.
"""
import math

import numpy as np

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl

PMAX = 128
NEG_BIG = -3.0e38


@nki.jit
def embedding_bag(table, ids, offsets, per_sample_weights=None, mode="sum", padding_idx=-1, max_bag=8):
  V, D = table.shape
  N = ids.shape[0]
  B = offsets.shape[0] - 1
  assert mode in ("sum", "mean", "max")
  assert per_sample_weights is None or mode == "sum", "per_sample_weights only with mode='sum' (as torch)"
  out = nl.ndarray((B, D), dtype=table.dtype, buffer=nl.shared_hbm)
  ids2 = ids.reshape((N, 1))
  off2 = offsets.reshape((B + 1, 1))

  i_p = nl.arange(PMAX)[:, None]
  i_1 = nl.arange(1)[None, :]
  i_d = nl.arange(D)[None, :]

  for t in nl.affine_range(math.ceil(B / PMAX)):
    valid = t * PMAX + i_p < B
    start = nl.load(off2[t * PMAX + i_p, i_1], mask=valid)
    end = nl.load(off2[t * PMAX + 1 + i_p, i_1], mask=valid)
    if mode == "max":
      acc = nl.full((PMAX, D), NEG_BIG, dtype=nl.float32)
    else:
      acc = nl.zeros((PMAX, D), dtype=nl.float32)
    cnt = nl.zeros((PMAX, 1), dtype=nl.float32)
    for j in nl.sequential_range(max_bag):
      pos = nl.add(start, j, mask=valid)
      live = nl.less(pos, end, dtype=nl.float32, mask=valid)
      pos_c = nl.minimum(pos, N - 1, mask=valid)  # a dead slot still reads a real item
      idj = nl.load(ids2[pos_c[i_p, 0], i_1], mask=valid)
      row = nl.load(table[idj[i_p, 0], i_d], mask=valid)
      keep = nl.multiply(live, nl.not_equal(idj, padding_idx, dtype=nl.float32), mask=valid)
      cnt[...] = nl.add(cnt, keep, mask=valid)
      if mode == "max":
        # dead / padding slots become -3e38: row * keep + (keep - 1) * 3e38
        pen = nl.multiply(nl.subtract(keep, 1.0, mask=valid), -NEG_BIG, mask=valid)
        cand = nisa.tensor_scalar(row, np.multiply, keep, op1=np.add, operand1=pen, dtype=nl.float32, mask=valid)
        acc[...] = nl.maximum(acc, cand, mask=valid)
      else:
        scale = keep
        if per_sample_weights is not None:
          wj = nl.load(per_sample_weights.reshape((N, 1))[pos_c[i_p, 0], i_1], mask=valid)
          scale = nl.multiply(keep, wj, mask=valid)
        acc[...] = nl.add(acc, nl.multiply(row, scale, dtype=nl.float32, mask=valid), mask=valid)
    if mode == "mean":
      res = nl.divide(acc, nl.maximum(cnt, 1.0, mask=valid), mask=valid)
    elif mode == "max":
      res = nl.multiply(acc, nl.greater(cnt, 0.0, dtype=nl.float32, mask=valid), mask=valid)
    else:
      res = acc
    nl.store(out[t * PMAX + i_p, i_d], value=nl.copy(res, dtype=table.dtype, mask=valid), mask=valid)
  return out


@nki.jit
def embedding_bag_segment(table, ids, offsets, per_sample_weights=None, mode="sum", padding_idx=-1):
  V, D = table.shape
  N = ids.shape[0]
  B = offsets.shape[0] - 1
  assert mode in ("sum", "mean") and B <= PMAX and D <= 512
  out = nl.ndarray((B, D), dtype=table.dtype, buffer=nl.shared_hbm)
  ids2 = ids.reshape((N, 1))

  i_p = nl.arange(PMAX)[:, None]
  i_1 = nl.arange(1)[None, :]
  i_d = nl.arange(D)[None, :]
  i_b = nl.arange(B)[None, :]

  # bag starts and ends along the free axis, on every partition
  offs = nl.load(offsets.reshape((1, B + 1)), dtype=nl.float32)
  starts = offs[0:1, 0:B].broadcast_to((PMAX, B))
  ends = offs[0:1, 1:B + 1].broadcast_to((PMAX, B))

  pooled = nl.zeros((B, D), dtype=nl.float32, buffer=nl.psum)
  counts = nl.zeros((B, 1), dtype=nl.float32, buffer=nl.psum)
  ones = nl.ones((PMAX, 1), dtype=table.dtype)
  for t in nl.affine_range(math.ceil(N / PMAX)):
    # item positions of the tile; the tail is clamped to the last item (its segment row is all zero)
    n_f = nisa.iota(t * PMAX + i_p, dtype=nl.float32)
    n_c = nl.minimum(nisa.iota(t * PMAX + i_p, dtype=nl.int32), N - 1)
    idc = nl.load(ids2[n_c[i_p, 0], i_1])
    rows = nl.load(table[idc[i_p, 0], i_d])
    keep = nl.not_equal(idc, padding_idx, dtype=nl.float32)
    seg = nl.multiply(nl.less_equal(starts, n_f, dtype=nl.float32), nl.greater(ends, n_f, dtype=nl.float32))
    seg = nl.multiply(seg, keep)
    if mode == "mean":
      counts += nisa.nc_matmul(nl.copy(seg, dtype=table.dtype), ones)
    if per_sample_weights is not None:
      w = nl.load(per_sample_weights.reshape((N, 1))[n_c[i_p, 0], i_1])
      seg = nl.multiply(seg, w)
    pooled += nisa.nc_matmul(nl.copy(seg, dtype=table.dtype), rows)

  if mode == "mean":
    res = nl.divide(pooled, nl.maximum(counts, 1.0), dtype=table.dtype)
  else:
    res = nl.copy(pooled, dtype=table.dtype)
  nl.store(out, value=res)
  return out


def _fmix32(h, mul_a, mul_b):
  """murmur3 fmix32 of an int32 tile: logical shifts, xor, wrapping int32 multiplies (tile x tile)."""
  h = nl.bitwise_xor(h, nl.right_shift(h, 16))
  h = nl.multiply(h, mul_a, dtype=nl.int32)
  h = nl.bitwise_xor(h, nl.right_shift(h, 13))
  h = nl.multiply(h, mul_b, dtype=nl.int32)
  h = nl.bitwise_xor(h, nl.right_shift(h, 16))
  return h


def _as_int32(c):
  return c - (1 << 32) if c >= (1 << 31) else c


@nki.jit
def hashed_embedding(ids, table, mode="mask"):
  N = ids.shape[0]
  V, D = table.shape
  assert mode in ("mask", "fastrange")
  if mode == "mask":
    assert V & (V - 1) == 0, "mask bucketing needs a power-of-two table"
  else:
    assert V <= 65536
  buckets = nl.ndarray((N,), dtype=nl.int32, buffer=nl.shared_hbm)
  out = nl.ndarray((N, D), dtype=table.dtype, buffer=nl.shared_hbm)
  ids2 = ids.reshape((N, 1))
  b2 = buckets.reshape((N, 1))

  i_p = nl.arange(PMAX)[:, None]
  i_1 = nl.arange(1)[None, :]
  i_d = nl.arange(D)[None, :]

  # the multipliers as int32 tiles: an int32 x int32 tile product is exact (wraps mod 2^32)
  mul_a = nl.full((PMAX, 1), _as_int32(0x85EBCA6B), dtype=nl.int32)
  mul_b = nl.full((PMAX, 1), _as_int32(0xC2B2AE35), dtype=nl.int32)
  size = nl.full((PMAX, 1), V, dtype=nl.int32)

  for t in nl.affine_range(math.ceil(N / PMAX)):
    valid = t * PMAX + i_p < N
    x = nl.load(ids2[t * PMAX + i_p, i_1], mask=valid)
    h = _fmix32(x, mul_a, mul_b)
    if mode == "mask":
      bucket = nl.bitwise_and(h, V - 1)
    else:
      bucket = nl.right_shift(nl.multiply(nl.right_shift(h, 16), size, dtype=nl.int32), 16)
    nl.store(b2[t * PMAX + i_p, i_1], value=bucket, mask=valid)
    rows = nl.load(table[bucket[i_p, 0], i_d], mask=valid)
    nl.store(out[t * PMAX + i_p, i_d], value=rows, mask=valid)
  return buckets, out


@nki.jit
def dot_interaction(x):
  B, F, D = x.shape
  NP = F * (F - 1) // 2
  out = nl.ndarray((B, D + NP), dtype=nl.float32, buffer=nl.shared_hbm)
  i_p = nl.arange(PMAX)[:, None, None]
  i_f = nl.arange(F)[None, :, None]
  i_d = nl.arange(D)[None, None, :]
  i_po = nl.arange(PMAX)[:, None]
  i_o = nl.arange(D + NP)[None, :]
  for t in nl.affine_range(math.ceil(B / PMAX)):
    xt = nl.load(x[t * PMAX + i_p, i_f, i_d], mask=(t * PMAX + i_p < B), dtype=nl.float32)
    res = nl.ndarray((PMAX, D + NP), dtype=nl.float32)
    res[:, 0:D] = nl.copy(xt[:, 0, :], mask=(t * PMAX + i_po < B))
    for i in nl.static_range(1, F):
      o = D + i * (i - 1) // 2
      prod = nl.multiply(xt[:, 0:i, :], xt[:, i:i + 1, :], mask=(t * PMAX + i_p < B))
      res[:, o:o + i] = nl.sum(prod, axis=[2], mask=(t * PMAX + i_p < B))
    nl.store(out[t * PMAX + i_po, i_o], value=res, mask=(t * PMAX + i_po < B))
  return out


@nki.jit
def dot_interaction_pe(x):
  B, F, D = x.shape
  NP = F * (F - 1) // 2
  assert D <= PMAX and F <= PMAX
  out = nl.ndarray((B, D + NP), dtype=nl.float32, buffer=nl.shared_hbm)
  for b in nl.affine_range(B):
    xT = nl.load_transpose2d(x[b])
    z = nl.copy(nisa.nc_matmul(xT, xT), dtype=nl.float32)
    nl.store(out[b:b + 1, 0:D], value=nl.load(x[b, 0:1, :], dtype=nl.float32))
    for i in nl.static_range(1, F):
      o = D + i * (i - 1) // 2
      nl.store(out[b:b + 1, o:o + i], value=z[i:i + 1, 0:i])
  return out


@nki.jit
def mlp2_t(xT, w1, b1, w2, b2, relu_last=True):
  K, B = xT.shape
  _, N1 = w1.shape
  _, N2 = w2.shape
  BC = 512
  out = nl.ndarray((N2, B), dtype=xT.dtype, buffer=nl.shared_hbm)
  b1c = b1.reshape((N1, 1))
  b2c = b2.reshape((N2, 1))
  KT, N1T, N2T = math.ceil(K / PMAX), math.ceil(N1 / PMAX), math.ceil(N2 / PMAX)

  for c in nl.static_range(math.ceil(B / BC)):
    c0 = c * BC
    bc = min(BC, B - c0)
    xs = nl.ndarray((KT, nl.par_dim(PMAX), BC), dtype=xT.dtype)
    for k in nl.static_range(KT):
      kk = min(PMAX, K - k * PMAX)
      xs[k, 0:kk, 0:bc] = nl.load(xT[k * PMAX:k * PMAX + kk, c0:c0 + bc])
    h = nl.ndarray((N1T, nl.par_dim(PMAX), BC), dtype=xT.dtype)
    for n in nl.static_range(N1T):
      nn = min(PMAX, N1 - n * PMAX)
      ps = nl.zeros((PMAX, BC), dtype=nl.float32, buffer=nl.psum)
      for k in nl.static_range(KT):
        kk = min(PMAX, K - k * PMAX)
        w = nl.load(w1[k * PMAX:k * PMAX + kk, n * PMAX:n * PMAX + nn])
        ps[0:nn, 0:bc] += nisa.nc_matmul(w, xs[k, 0:kk, 0:bc])
      bias = nl.load(b1c[n * PMAX:n * PMAX + nn, :], dtype=nl.float32)
      h[n, 0:nn, 0:bc] = nisa.activation(op=nl.relu, data=ps[0:nn, 0:bc], bias=bias, dtype=xT.dtype)
    for m in nl.static_range(N2T):
      mm = min(PMAX, N2 - m * PMAX)
      ps2 = nl.zeros((PMAX, BC), dtype=nl.float32, buffer=nl.psum)
      for n in nl.static_range(N1T):
        nn = min(PMAX, N1 - n * PMAX)
        w = nl.load(w2[n * PMAX:n * PMAX + nn, m * PMAX:m * PMAX + mm])
        ps2[0:mm, 0:bc] += nisa.nc_matmul(w, h[n, 0:nn, 0:bc])
      bias = nl.load(b2c[m * PMAX:m * PMAX + mm, :], dtype=nl.float32)
      y = nisa.activation(op=(nl.relu if relu_last else nl.copy), data=ps2[0:mm, 0:bc], bias=bias,
                          dtype=xT.dtype)
      nl.store(out[m * PMAX:m * PMAX + mm, c0:c0 + bc], value=y)
  return out
