"""Serving-time logit processors in the Beta-1 dialect (``neuronxcc.nki``): the repetition / presence / frequency
penalties as vLLM applies them, with the per-request token-count histogram built on chip, written the way public
NKI kernels write them (arange/mgrid index expressions, value-returning ``nl``/``nisa`` calls, indirect DMA with a
tile of row indices as the first index item):

- ``penalties_onehot(logits, token_ids, rep, pres, freq, vt)``: requests [B <= 128] on the partitions, the
  vocabulary tiled by ``vt`` on the free axis. Per vocabulary tile, the counts of the tile's tokens among the T
  generated ids of each request are a sum of one-hots (``nisa.iota`` of the tile's token ids compared with each
  id column, ``nl.equal`` + ``nl.add``); duplicates count once per occurrence. Then, as vLLM's
  ``apply_penalties``: seen = counts > 0; logits of seen tokens divided by the repetition penalty when positive,
  multiplied when not; minus freq * counts and pres * seen. rep / pres / freq are [B, 1] fp32 per request.
- ``penalties_scatter(...)``: the same with the histogram built in HBM: a zeroed fp32 scratch [B, V], viewed as
  [B * V, 1], and one ``nl.atomic_rmw(..., op=np.add)`` of ones per id column at rows b * V + id (a row index
  tile from ``nisa.iota`` of ``i_p * V`` plus the ids); repeated ids accumulate. The adjustment then loads the
  counts per vocabulary tile. T accumulating DMAs instead of T vector compares per vocabulary tile.
- ``typical_p_filter(logits, typical_p, iters, vt)``: locally typical sampling (HF ``TypicalLogitsWarper``) without
  a sort. With m the row max, s = sum exp(x - m) and the entropy H = log s - sum exp(x - m) (x - m) / s, a token's
  score |-log p - H| is |x - c| with c = m + log s - H. Keeping the tokens of smallest score until their mass reaches
  typical_p is keeping score <= tau for the smallest tau whose kept mass is >= typical_p: found by ``iters`` rounds
  of bisection over tau per request (mass of score <= mid by a compare, multiply and sum per vocabulary tile, the
  bracket updated arithmetically), starting from [0, max score]; scores are capped at 256 (p is 0 in fp32 well
  before), so logits already masked to NEG by an earlier processor neither widen the bracket nor get kept.
  Dropped logits become NEG.

Written for nsim's tests in the style of those kernels; not copies of any file. No nsim imports.
"""
import numpy as np

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl


def _adjust(x, cnt, rp_m1, rp_diff, pres, freq):
  """vLLM penalties on one [B, vt] tile: x * (1 + seen * (pos ? 1/r - 1 : r - 1)) - freq * cnt - pres * seen."""
  seen = nl.greater(cnt, 0.0, dtype=nl.float32)
  pos = nl.greater(x, 0.0, dtype=nl.float32)
  # (1/r - 1) for positive logits, (r - 1) otherwise
  d = nl.add(nl.multiply(pos, rp_diff), rp_m1)
  factor = nl.add(nl.multiply(seen, d), 1.0)
  y = nl.multiply(x, factor)
  y = nl.subtract(y, nl.multiply(cnt, freq))
  y = nl.subtract(y, nl.multiply(seen, pres))
  return y


def _penalty_params(rep, pres, freq, B):
  i_p = nl.arange(B)[:, None]
  i_o = nl.arange(1)[None, :]
  r = nl.load(rep[i_p, i_o])
  inv_r = nisa.reciprocal(r)
  rp_m1 = nl.subtract(r, 1.0)
  rp_diff = nl.subtract(inv_r, r)  # (1/r - 1) - (r - 1)
  return rp_m1, rp_diff, nl.load(pres[i_p, i_o]), nl.load(freq[i_p, i_o])


@nki.jit
def penalties_onehot(logits, token_ids, rep, pres, freq, vt=2048):
  B, V = logits.shape
  _, T = token_ids.shape
  assert B <= nl.tile_size.pmax and V % vt == 0
  out = nl.ndarray((B, V), dtype=logits.dtype, buffer=nl.shared_hbm)

  i_p = nl.arange(B)[:, None]
  i_t = nl.arange(T)[None, :]
  i_v = nl.arange(vt)[None, :]
  ids = nl.load(token_ids[i_p, i_t], dtype=nl.float32)
  rp_m1, rp_diff, pr, fr = _penalty_params(rep, pres, freq, B)

  for c in nl.affine_range(V // vt):
    # token ids of this vocabulary tile, on every partition
    vid = nisa.iota(c * vt + i_v + 0 * i_p, dtype=nl.float32)
    cnt = nl.zeros((B, vt), dtype=nl.float32)
    for t in nl.static_range(T):
      cnt[...] = nl.add(cnt, nl.equal(vid, ids[i_p, t], dtype=nl.float32))
    x = nl.load(logits[i_p, c * vt + i_v], dtype=nl.float32)
    y = _adjust(x, cnt, rp_m1, rp_diff, pr, fr)
    nl.store(out[i_p, c * vt + i_v], value=nl.copy(y, dtype=logits.dtype))
  return out


@nki.jit
def penalties_scatter(logits, token_ids, rep, pres, freq, vt=2048):
  B, V = logits.shape
  _, T = token_ids.shape
  assert B <= nl.tile_size.pmax and V % vt == 0
  out = nl.ndarray((B, V), dtype=logits.dtype, buffer=nl.shared_hbm)
  counts = nl.ndarray((B, V), dtype=nl.float32, buffer=nl.hbm)
  counts_flat = counts.reshape((B * V, 1))

  i_p = nl.arange(B)[:, None]
  i_t = nl.arange(T)[None, :]
  i_v = nl.arange(vt)[None, :]
  i_o = nl.arange(1)[None, :]

  for c in nl.affine_range(V // vt):
    nl.store(counts[i_p, c * vt + i_v], value=nl.zeros((B, vt), dtype=nl.float32))

  # row of (request b, token id) in the flat histogram: b * V + id
  ids = nl.load(token_ids[i_p, i_t])
  base = nisa.iota(i_p * V + 0 * i_t, dtype=nl.int32)
  rows = nl.add(ids, base, dtype=nl.int32)
  ones = nl.ones((B, 1), dtype=nl.float32)
  for t in nl.static_range(T):
    nl.atomic_rmw(counts_flat[rows[i_p, t], i_o], value=ones, op=np.add)

  rp_m1, rp_diff, pr, fr = _penalty_params(rep, pres, freq, B)
  for c in nl.affine_range(V // vt):
    cnt = nl.load(counts[i_p, c * vt + i_v])
    x = nl.load(logits[i_p, c * vt + i_v], dtype=nl.float32)
    y = _adjust(x, cnt, rp_m1, rp_diff, pr, fr)
    nl.store(out[i_p, c * vt + i_v], value=nl.copy(y, dtype=logits.dtype))
  return out


@nki.jit
def token_histogram_flat(token_ids, vocab_size):
  """The histogram alone, [B, V] fp32, with the B * T ids flattened onto the partitions (tiles of 128 ids, so one
  accumulating DMA carries many repeats of the same row): row of id n = (n // T) * V + id, the request index from
  ``nisa.iota`` of the flat position (+ 0.5) times 1/T floored. ``nisa.dma_copy(..., dst_rmw_op=np.add)`` scatter-adds the
  ones."""
  B, T = token_ids.shape
  V = vocab_size
  N = B * T
  counts = nl.ndarray((B, V), dtype=nl.float32, buffer=nl.shared_hbm)
  counts_flat = counts.reshape((B * V, 1))
  ids_flat = token_ids.reshape((N, 1))
  i_p = nl.arange(nl.tile_size.pmax)[:, None]
  i_o = nl.arange(1)[None, :]
  i_b = nl.arange(B)[:, None]
  i_v = nl.arange(V)[None, :]
  nl.store(counts[i_b, i_v], value=nl.zeros((B, V), dtype=nl.float32))
  ones = nl.ones((nl.tile_size.pmax, 1), dtype=nl.float32)
  for n in nl.sequential_range((N + 127) // 128):
    valid = n * 128 + i_p < N
    ids = nl.load(ids_flat[n * 128 + i_p, i_o], mask=valid)
    pos = nisa.iota(n * 128 + i_p + 0 * i_o, dtype=nl.float32)
    req = nl.floor(nl.multiply(nl.add(pos, 0.5), 1.0 / T))  # (n + 0.5) / T: safe from 1/T's rounding
    rows = nl.add(nl.multiply(req, float(V)), ids, dtype=nl.int32)
    nisa.dma_copy(dst=counts_flat[rows[i_p, 0], i_o], src=ones, dst_rmw_op=np.add, mask=valid)
  return counts


NEG = -3.0e38
SCORE_CAP = 256.0


@nki.jit
def typical_p_filter(logits, typical_p, iters=24, vt=2048):
  B, V = logits.shape
  assert B <= nl.tile_size.pmax and V % vt == 0
  NC = V // vt
  out = nl.ndarray((B, V), dtype=logits.dtype, buffer=nl.shared_hbm)
  i_p = nl.arange(B)[:, None]
  i_v = nl.arange(vt)[None, :]
  i_o = nl.arange(1)[None, :]

  x = nl.ndarray((NC, nl.par_dim(B), vt), dtype=nl.float32, buffer=nl.sbuf)
  tmax = nl.ndarray((B, NC), dtype=nl.float32, buffer=nl.sbuf)
  for c in nl.affine_range(NC):
    x[c, i_p, i_v] = nl.load(logits[i_p, c * vt + i_v], dtype=nl.float32)
    tmax[i_p, c] = nl.max(x[c, i_p, i_v], axis=[1], keepdims=True)
  m = nl.max(tmax, axis=[1], keepdims=True)
  neg_m = nl.multiply(m, -1.0)

  # e = exp(x - m) with its sum and the sum of e * (x - m) per tile
  e = nl.ndarray((NC, nl.par_dim(B), vt), dtype=nl.float32, buffer=nl.sbuf)
  esum = nl.ndarray((B, NC), dtype=nl.float32, buffer=nl.sbuf)
  wsum = nl.ndarray((B, NC), dtype=nl.float32, buffer=nl.sbuf)
  for c in nl.affine_range(NC):
    e[c, i_p, i_v] = nisa.activation(op=nl.exp, data=x[c, i_p, i_v], bias=neg_m)
    esum[i_p, c] = nl.sum(e[c, i_p, i_v], axis=[1], keepdims=True)
    wsum[i_p, c] = nl.sum(nl.multiply(e[c, i_p, i_v], nl.add(x[c, i_p, i_v], neg_m)), axis=[1], keepdims=True)
  s = nl.sum(esum, axis=[1], keepdims=True)
  log_s = nl.log(s)
  inv_s = nl.reciprocal(s)
  ent = nl.subtract(log_s, nl.multiply(nl.sum(wsum, axis=[1], keepdims=True), inv_s))
  cen = nl.subtract(nl.add(m, log_s), ent)

  # scores |x - c| and probabilities, per tile; the bracket [lo, hi] of tau starts at [0, max score]
  score = nl.ndarray((NC, nl.par_dim(B), vt), dtype=nl.float32, buffer=nl.sbuf)
  smax = nl.ndarray((B, NC), dtype=nl.float32, buffer=nl.sbuf)
  for c in nl.affine_range(NC):
    # capped: a token with |x - c| > SCORE_CAP has p = 0 in fp32 (and masked logits would blow up the bracket)
    score[c, i_p, i_v] = nl.minimum(nl.abs(nl.subtract(x[c, i_p, i_v], cen)), SCORE_CAP)
    e[c, i_p, i_v] = nl.multiply(e[c, i_p, i_v], inv_s)
    smax[i_p, c] = nl.max(score[c, i_p, i_v], axis=[1], keepdims=True)
  hi = nl.max(smax, axis=[1], keepdims=True)
  lo = nl.zeros((B, 1), dtype=nl.float32)
  tp = nl.load(typical_p[i_p, i_o])

  for it in nl.sequential_range(iters):
    mid = nl.multiply(nl.add(lo, hi), 0.5)
    mass_t = nl.ndarray((B, NC), dtype=nl.float32, buffer=nl.sbuf)
    for c in nl.affine_range(NC):
      sel = nl.less_equal(score[c, i_p, i_v], mid, dtype=nl.float32)
      mass_t[i_p, c] = nl.sum(nl.multiply(sel, e[c, i_p, i_v]), axis=[1], keepdims=True)
    ok = nl.greater_equal(nl.sum(mass_t, axis=[1], keepdims=True), tp, dtype=nl.float32)
    # ok: hi = mid, else lo = mid
    hi[...] = nl.add(hi, nl.multiply(ok, nl.subtract(mid, hi)))
    lo[...] = nl.add(lo, nl.multiply(nl.subtract(1.0, ok), nl.subtract(mid, lo)))

  for c in nl.affine_range(NC):
    # kept: x * 1 + 0, dropped: x * 0 + NEG (no overflow for logits already at NEG)
    keep = nl.less_equal(score[c, i_p, i_v], hi, dtype=nl.float32)
    y = nl.add(nl.multiply(x[c, i_p, i_v], keep), nl.multiply(nl.subtract(keep, 1.0), -NEG))
    nl.store(out[i_p, c * vt + i_v], value=nl.copy(y, dtype=logits.dtype))
  return out
