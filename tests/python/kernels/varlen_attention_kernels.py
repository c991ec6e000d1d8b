"""Packed-sequence (varlen) attention and mask variants in the Beta-1 dialect (``neuronxcc.nki``), written the way
public NKI flash-attention kernels write them (arange/mgrid index expressions, value-returning ``nl``/``nisa``
calls, ``nisa.affine_select`` for the causal diagonal):

- ``packed_doc_flash_fwd(q, k, v, cu_seqlens)``: several documents concatenated into one packed batch
  q, k [d, S] (transposed layout), v [S, d]; document boundaries from a host list ``cu_seqlens`` (compile-time
  constants, as a varlen ``flash_attn`` wrapper passes them). Causal attention inside each document only (a
  block-diagonal causal mask). Key blocks that hold no key of a query block's documents are skipped entirely; on
  the remaining blocks the per-row document start is built on chip (``nisa.iota`` of the row positions compared
  with each boundary inside the query block, weighted by the jump of the start there) and compared with the key
  positions (``nisa.iota`` of the block's columns), the causal half by ``nisa.affine_select`` on the diagonal.
  Online softmax in fp32 over the kept key blocks. The total token count S need not be a multiple of 128: the
  last block's loads go masked into zeroed tiles and its store is masked.
- ``segment_id_flash_b1(q, k, v, segment_ids)``: the same packed batch with runtime [S] int32 segment ids (the
  rows' ids as a [128, 1] column, the keys' ids as a row broadcast to the partitions, ``nl.equal`` +
  ``nl.where``); every key block up to the diagonal computed.
- ``padded_batch_attention(q, k, v, lengths)``: a ragged batch [B, d, S] / [B, S, d] padded to S with a runtime
  [B] int32 length per sequence: bidirectional (encoder) attention in which keys at positions >= length are
  masked (``nl.where`` of an iota compare against the length broadcast to the partitions) and padded query rows
  are written as zeros.

Written for nsim's tests in the style of those kernels; not copies of any file. No nsim imports.
"""
import math

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl

PMAX = 128
NEG = -30000.0


def _doc_of(cu_seqlens, pos):
  """Index of the document holding position ``pos`` (host side)."""
  for n in range(len(cu_seqlens) - 1):
    if cu_seqlens[n] <= pos < cu_seqlens[n + 1]:
      return n
  raise ValueError("position {} outside cu_seqlens".format(pos))


@nki.jit
def packed_doc_flash_fwd(q, k, v, cu_seqlens):
  d, S = q.shape
  assert d <= PMAX
  assert cu_seqlens[0] == 0 and cu_seqlens[-1] == S
  NT = (S + PMAX - 1) // PMAX  # the total token count need not be a multiple of 128: masked last block
  scale = 1.0 / math.sqrt(d)
  out = nl.ndarray((S, d), dtype=q.dtype, buffer=nl.shared_hbm)

  i_p = nl.arange(PMAX)[:, None]
  i_f = nl.arange(PMAX)[None, :]
  i_dp = nl.arange(d)[:, None]
  i_d = nl.arange(d)[None, :]

  for qi in nl.affine_range(NT):
    q0 = qi * PMAX
    q_end = min(q0 + PMAX, S)
    # the documents of this query block: host-side, from the boundaries
    first_start = cu_seqlens[_doc_of(cu_seqlens, q0)]
    last_start = cu_seqlens[_doc_of(cu_seqlens, q_end - 1)]
    inner = [b for b in cu_seqlens if q0 < b < q_end]

    # per-row document start: first_start + sum over inner boundaries b of (row >= b) * (b - previous start)
    rows = nisa.iota(q0 + i_p, dtype=nl.float32)
    seg_start = nl.full((PMAX, 1), float(first_start), dtype=nl.float32)
    prev = first_start
    for b in inner:
      step = nl.greater_equal(rows, float(b), dtype=nl.float32)
      seg_start[...] = nl.add(seg_start, nl.multiply(step, float(b - prev)))
      prev = b

    # rows past the end of the batch: zero queries (their outputs are not stored)
    qT = nl.zeros((d, PMAX), dtype=q.dtype)
    qT[i_dp, i_f] = nl.load(q[i_dp, q0 + i_f], mask=(q0 + i_f < S))
    m = nl.full((PMAX, 1), NEG, dtype=nl.float32)
    l = nl.zeros((PMAX, 1), dtype=nl.float32)
    acc = nl.zeros((PMAX, d), dtype=nl.float32)
    # key blocks from the one holding the first document's start up to the diagonal; the rest hold no key
    # of these rows' documents
    for ki in nl.sequential_range(first_start // PMAX, qi + 1):
      k0 = ki * PMAX
      # keys past the end: zero k and v (the causal mask hides them from every stored row)
      kT = nl.zeros((d, PMAX), dtype=k.dtype)
      kT[i_dp, i_f] = nl.load(k[i_dp, k0 + i_f], mask=(k0 + i_f < S))
      v_t = nl.zeros((PMAX, d), dtype=v.dtype)
      v_t[i_p, i_d] = nl.load(v[k0 + i_p, i_d], mask=(k0 + i_p < S))
      s_ps = nisa.nc_matmul(qT, kT)
      s = nl.multiply(s_ps, scale, dtype=nl.float32)
      if ki == qi:  # diagonal block: keys j <= i
        s = nisa.affine_select(q0 + i_p - (k0 + i_f) >= 0, s, NEG)
      if last_start > k0:  # some row's document starts inside or after this key block
        cols = nisa.iota(k0 + i_f + 0 * i_p, dtype=nl.float32)
        same_doc = nl.greater_equal(cols, seg_start, dtype=nl.float32)
        s = nl.where(same_doc, s, NEG)
      mx = nl.maximum(m, nl.max(s, axis=[1], keepdims=True))
      alpha = nl.exp(nl.subtract(m, mx))
      p = nl.exp(nl.subtract(s, mx))
      l[...] = nl.add(nl.multiply(l, alpha), nl.sum(p, axis=[1], keepdims=True))
      pT = nisa.nc_transpose(nl.copy(p, dtype=v.dtype))
      pv = nisa.nc_matmul(nl.copy(pT, dtype=v.dtype), v_t)
      acc[...] = nl.add(nl.multiply(acc, alpha), pv)
      m[...] = mx
    nl.store(out[q0 + i_p, i_d], value=nl.divide(acc, l), mask=(q0 + i_p < S))
  return out


@nki.jit
def padded_batch_attention(q, k, v, lengths):
  B, d, S = q.shape
  assert S % PMAX == 0 and d <= PMAX
  NT = S // PMAX
  scale = 1.0 / math.sqrt(d)
  out = nl.ndarray((B, S, d), dtype=q.dtype, buffer=nl.shared_hbm)

  i_p = nl.arange(PMAX)[:, None]
  i_f = nl.arange(PMAX)[None, :]
  i_s = nl.arange(S)[None, :]
  i_dp = nl.arange(d)[:, None]
  i_d = nl.arange(d)[None, :]

  lens = nl.load(lengths.reshape((1, B)), dtype=nl.float32)
  keys = nisa.iota(i_s + 0 * i_p, dtype=nl.float32)
  for b in nl.affine_range(B):
    len_b = lens[0:1, b:b + 1].broadcast_to((PMAX, 1))
    key_ok = nl.less(keys, len_b, dtype=nl.float32)
    kT = nl.load(k[b, i_dp, i_s])
    for qi in nl.affine_range(NT):
      qT = nl.load(q[b, i_dp, qi * PMAX + i_f])
      s_ps = nisa.nc_matmul(qT, kT)
      s = nl.where(key_ok, nl.multiply(s_ps, scale, dtype=nl.float32), NEG)
      mx = nl.max(s, axis=[1], keepdims=True)
      p = nl.exp(nl.subtract(s, mx))
      ssum = nl.sum(p, axis=[1], keepdims=True)
      p_lo = nl.copy(p, dtype=v.dtype)
      o_ps = nl.zeros((PMAX, d), dtype=nl.float32, buffer=nl.psum)
      for j in nl.affine_range(NT):
        v_j = nl.load(v[b, j * PMAX + i_p, i_d])
        pT = nisa.nc_transpose(p_lo[i_p, j * PMAX + i_f])
        o_ps += nisa.nc_matmul(nl.copy(pT, dtype=v.dtype), v_j)
      # padded query rows (position >= length) are zeros
      row_ok = nl.less(nisa.iota(qi * PMAX + i_p, dtype=nl.float32), len_b, dtype=nl.float32)
      o = nl.multiply(nl.divide(o_ps, ssum), row_ok, dtype=q.dtype)
      nl.store(out[b, qi * PMAX + i_p, i_d], value=o)
  return out


@nki.jit
def segment_id_flash_b1(q, k, v, segment_ids):
  """The packed batch of ``packed_doc_flash_fwd`` with runtime segment ids [S] int32 (Beta 1): the rows' ids loaded
  as a [128, 1] column by an index expression on the 1-D tensor, the keys' ids loaded once as a [1, S] row and
  broadcast to the partitions per key block (``.broadcast_to``); ``nl.equal`` of the two (a column against a
  tile) and ``nl.where`` mask the scores; causal by ``affine_select`` on the diagonal. Every key block up to the
  diagonal is computed."""
  d, S = q.shape
  assert S % PMAX == 0 and d <= PMAX
  NT = S // PMAX
  scale = 1.0 / math.sqrt(d)
  out = nl.ndarray((S, d), dtype=q.dtype, buffer=nl.shared_hbm)

  i_p = nl.arange(PMAX)[:, None]
  i_f = nl.arange(PMAX)[None, :]
  i_dp = nl.arange(d)[:, None]
  i_d = nl.arange(d)[None, :]

  ids_row = nl.load(segment_ids.reshape((1, S)), dtype=nl.float32)
  for qi in nl.affine_range(NT):
    q0 = qi * PMAX
    q_ids = nl.load(segment_ids[q0 + i_p], dtype=nl.float32)
    qT = nl.load(q[i_dp, q0 + i_f])
    m = nl.full((PMAX, 1), NEG, dtype=nl.float32)
    l = nl.zeros((PMAX, 1), dtype=nl.float32)
    acc = nl.zeros((PMAX, d), dtype=nl.float32)
    for ki in nl.sequential_range(qi + 1):
      k0 = ki * PMAX
      kT = nl.load(k[i_dp, k0 + i_f])
      v_t = nl.load(v[k0 + i_p, i_d])
      s = nl.multiply(nisa.nc_matmul(qT, kT), scale, dtype=nl.float32)
      k_ids = ids_row[0:1, k0:k0 + PMAX].broadcast_to((PMAX, PMAX))
      s = nl.where(nl.equal(k_ids, q_ids), s, NEG)
      if ki == qi:
        s = nisa.affine_select(q0 + i_p - (k0 + i_f) >= 0, s, NEG)
      mx = nl.maximum(m, nl.max(s, axis=[1], keepdims=True))
      alpha = nl.exp(nl.subtract(m, mx))
      p = nl.exp(nl.subtract(s, mx))
      l[...] = nl.add(nl.multiply(l, alpha), nl.sum(p, axis=[1], keepdims=True))
      pT = nisa.nc_transpose(nl.copy(p, dtype=v.dtype))
      pv = nisa.nc_matmul(nl.copy(pT, dtype=v.dtype), v_t)
      acc[...] = nl.add(nl.multiply(acc, alpha), pv)
      m[...] = mx
    nl.store(out[q0 + i_p, i_d], value=nl.divide(acc, l))
  return out
