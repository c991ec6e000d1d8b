"""Scan, sequence-mixing and sampling kernels in the style of the public NKI repositories that have them (the NKI
docs' scan examples and Mamba tutorial, the Mamba-2 / SSM kernels people port to Trainium, NxDI's on-device
sampling and embedding), in the Beta-1 dialect those repositories use (``import neuronxcc.nki as nki``,
``@nki.jit``, 2-space indentation as in the NKI samples):

- ``cumsum_free_kernel(x, tile_f)``: inclusive prefix sum of every row of x [N, F] along the free axis with
  ``nisa.tensor_tensor_scan`` (``s = 1 * s + x``), the row tiled over the partitions (ragged last tile masked)
  and the free axis chunked by ``tile_f`` columns, each chunk's scan started from the previous chunk's last
  column (``initial=res[:, tile_f - 1]``, as the ``tensor_tensor_scan`` doc example chains two halves).
- ``cumsum_partition_kernel(x)``: prefix sum of x [S, D] along S (the partition axis) as a matmul with an
  upper-triangular ones matrix built by ``nisa.affine_select`` over an ``nl.arange`` predicate; tiles of 128
  rows beyond the first add the running column totals (a matmul with an all-ones matrix broadcasts them to
  every partition).
- ``causal_conv1d_kernel(x, weight, bias, conv_state, tile_l, activation)``: the Mamba-2 short convolution:
  depthwise causal conv1d of x [C, L] with a width-4 filter per channel, ``out[c, t] = bias[c] +
  sum_k w[c, k] * x[c, t - 3 + k]``, optional SiLU; channels on the partitions (ragged last channel tile),
  the sequence in chunks of ``tile_l`` with the last 3 inputs of each chunk carried to the next (the first chunk
  starts from ``conv_state`` [C, 3]); shifted-slice multiply-adds with ``nisa.tensor_scalar`` and
  ``nisa.scalar_tensor_tensor`` and the per-channel weight columns as (P, 1) operands. Returns the output and the
  new conv state (the last 3 inputs).
- ``topk_kernel(logits, k, vocab_tile)``: the k largest logits of every row of [B, V] and their vocabulary ids:
  per vocabulary tile of at most 16384 (max8's limit; ragged last tile filled with fp32 min), ``k <= 8`` by one
  ``nisa.max8`` + ``nisa.nc_find_index8``, ``k = 16 / 32`` by ``k / 8`` rounds of ``max8`` +
  ``nisa.nc_match_replace8`` (its ``dst_idx`` gives the positions); with several vocabulary tiles a second top-k
  over the per-tile candidates, their ids looked up with ``nl.gather_flattened``.
- ``sample_kernel(logits, temperature, top_p, rand, k)``: NxDI-style on-device sampling: top-k as above,
  softmax of the top-k logits divided by the per-row temperature, the cumulative sum of the sorted probabilities
  with ``tensor_tensor_scan``, top-p cutoff (keep a token while the probability mass before it is below
  ``top_p``), then the token whose kept cumulative mass first exceeds ``rand * kept_total``. Returns the token
  ids [B, 1] int32 and the top-k probabilities after the cutoff.
- ``greedy_argmax_kernel(logits, vocab_tile)``: argmax of every row: per vocabulary tile a max, an
  ``nisa.iota`` of the column ids, equality with the max, and a min over the matching ids (the first one); the
  running best carried across vocabulary tiles.
- ``embedding_kernel(token_ids, table, tile_h)``: embedding lookup: token ids [T] int32 in tiles of 128 (ragged
  last tile masked) gather their rows of the table [V, H] with an indirect load
  ``nl.load(table[ids[i_p, 0], i_f])``, by column chunks of ``tile_h`` (ragged last chunk masked).
- ``embedding_backward_kernel(token_ids, grad_out, V, tile_h)``: the embedding's weight gradient, a scatter-add of
  the gradient rows into a zeroed [V, H] table with ``nl.atomic_rmw`` (repeated ids accumulate).
- ``embedding_update_kernel(table, token_ids, new_rows, tile_h)``: rows written into the table at distinct ids by
  an indirect ``nl.store`` (in place), the token tiles an ``affine_range``.

Written for nsim's tests from memory of those repositories' kernels and in their authors' style; not copies
of their files. No nsim imports.
"""
import math

import numpy as np

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl
from neuronxcc.nki.language import par_dim

PMAX = 128
MAX8_FMAX = 16384


# ------------------------------------------------------------------------------------------------
# Cumulative sums
# ------------------------------------------------------------------------------------------------

@nki.jit
def cumsum_free_kernel(x, tile_f=512):
  """out[n, :] = cumsum(x[n, :]) along the free axis; x [N, F]. fp32 running state."""
  N, F = x.shape
  out = nl.ndarray((N, F), dtype=x.dtype, buffer=nl.shared_hbm)

  n_tiles_p = math.ceil(N / PMAX)
  n_tiles_f = math.ceil(F / tile_f)

  i_p = nl.arange(PMAX)[:, None]
  i_f = nl.arange(tile_f)[None, :]

  # data0 of the scan: s_i = 1 * s_{i-1} + x_i
  ones = nl.full((par_dim(PMAX), tile_f), 1.0, dtype=nl.float32)

  for i in nl.affine_range(n_tiles_p):
    # loop iterations along F communicate through this init tensor
    init = nl.zeros((par_dim(PMAX), 1), dtype=nl.float32)

    for j in nl.sequential_range(n_tiles_f):
      mask = (i * PMAX + i_p < N) & (j * tile_f + i_f < F)
      x_tile = nl.load(x[i * PMAX + i_p, j * tile_f + i_f], mask=mask, dtype=nl.float32)

      res = nisa.tensor_tensor_scan(ones, x_tile, initial=init,
                                    op0=np.multiply, op1=np.add, mask=mask)

      nl.store(out[i * PMAX + i_p, j * tile_f + i_f], value=res, mask=mask)

      # prepare the initial value of the next chunk (a ragged last chunk has none)
      init[i_p, 0] = nl.copy(res[i_p, tile_f - 1],
                             mask=(i * PMAX + i_p < N) & (j * tile_f + tile_f - 1 < F))

  return out


@nki.jit
def cumsum_partition_kernel(x):
  """out[s, :] = sum_{r <= s} x[r, :]; x [S, D] with S along the partitions, D <= 512."""
  S, D = x.shape
  assert D <= 512, "one PSUM bank per tile"
  out = nl.ndarray((S, D), dtype=x.dtype, buffer=nl.shared_hbm)

  i_p = nl.arange(PMAX)[:, None]
  i_f = nl.arange(PMAX)[None, :]
  i_d = nl.arange(D)[None, :]

  # triu[k, m] = 1 if k <= m: as the stationary of a matmul, output row m sums input rows 0..m
  ones = nl.ones((par_dim(PMAX), PMAX), dtype=nl.float32)
  triu = nisa.affine_select(pred=(i_f - i_p >= 0), on_true_tile=ones, on_false_value=0.0)

  # running column totals of the previous tiles, the same row on every partition
  carry = nl.zeros((par_dim(PMAX), D), dtype=nl.float32)

  for i in nl.sequential_range(math.ceil(S / PMAX)):
    x_tile = nl.zeros((par_dim(PMAX), D), dtype=nl.float32)
    x_tile[i_p, i_d] = nl.load(x[i * PMAX + i_p, i_d], mask=(i * PMAX + i_p < S), dtype=nl.float32)

    cs_psum = nl.matmul(triu, x_tile, transpose_x=True)
    cs = nl.add(cs_psum, carry)
    nl.store(out[i * PMAX + i_p, i_d], value=cs, mask=(i * PMAX + i_p < S))

    tot_psum = nl.matmul(ones, x_tile, transpose_x=True)
    carry[...] = nl.add(carry, tot_psum)

  return out


# ------------------------------------------------------------------------------------------------
# Mamba-2 causal depthwise conv1d
# ------------------------------------------------------------------------------------------------

D_CONV = 4


@nki.jit
def causal_conv1d_kernel(x, weight, bias, conv_state, tile_l=512, activation=True):
  """x [C, L]; weight [C, 4]; bias [C, 1]; conv_state [C, 3] (the 3 inputs before x[:, 0]).
  Returns out [C, L] (x.dtype) and the new conv_state [C, 3] = x[:, L-3:L]."""
  C, L = x.shape
  assert weight.shape == [C, D_CONV]
  assert L >= D_CONV - 1
  K1 = D_CONV - 1

  out = nl.ndarray((C, L), dtype=x.dtype, buffer=nl.shared_hbm)
  new_state = nl.ndarray((C, K1), dtype=x.dtype, buffer=nl.shared_hbm)

  i_p = nl.arange(PMAX)[:, None]
  i_k = nl.arange(D_CONV)[None, :]
  i_s = nl.arange(K1)[None, :]
  i_l = nl.arange(tile_l)[None, :]

  for c in nl.affine_range(math.ceil(C / PMAX)):
    c_mask = (c * PMAX + i_p < C)
    # zero-filled: the channels past C of a ragged tile compute zeros (their stores are masked off)
    w = nl.zeros((par_dim(PMAX), D_CONV), dtype=nl.float32)
    w[i_p, i_k] = nl.load(weight[c * PMAX + i_p, i_k], mask=c_mask, dtype=nl.float32)
    b = nl.zeros((par_dim(PMAX), 1), dtype=nl.float32)
    b[i_p, 0] = nl.load(bias[c * PMAX + i_p, 0], mask=c_mask, dtype=nl.float32)

    # xpad[:, 0:3] = the 3 inputs before this chunk, xpad[:, 3:3 + tile_l] = the chunk
    xpad = nl.zeros((par_dim(PMAX), K1 + tile_l), dtype=nl.float32)
    xpad[i_p, i_s] = nl.load(conv_state[c * PMAX + i_p, i_s], mask=c_mask, dtype=nl.float32)

    for j in nl.sequential_range(math.ceil(L / tile_l)):
      mask = c_mask & (j * tile_l + i_l < L)
      xpad[i_p, K1 + i_l] = nl.load(x[c * PMAX + i_p, j * tile_l + i_l], mask=mask, dtype=nl.float32)

      # acc = x[t - 3] * w0 + bias
      acc = nisa.tensor_scalar(data=xpad[:, 0:tile_l], op0=np.multiply, operand0=w[:, 0:1],
                               op1=np.add, operand1=b)
      # acc = x[t - 3 + k] * wk + acc
      for k in nl.static_range(1, D_CONV):
        acc = nisa.scalar_tensor_tensor(data=xpad[:, k:k + tile_l], op0=np.multiply, operand0=w[:, k:k + 1],
                                        op1=np.add, operand1=acc)

      if activation:
        y = nisa.activation(op=nl.silu, data=acc, dtype=x.dtype)
      else:
        y = nisa.tensor_copy(acc, dtype=x.dtype)
      nl.store(out[c * PMAX + i_p, j * tile_l + i_l], value=y, mask=mask)

      # carry the last 3 inputs of this chunk (only a full chunk has a successor)
      xpad[:, 0:K1] = nl.copy(xpad[:, tile_l:tile_l + K1])

    # the new conv state: the last 3 inputs of the sequence
    st = nl.load(x[c * PMAX + i_p, L - K1 + i_s], mask=c_mask)
    nl.store(new_state[c * PMAX + i_p, i_s], value=st, mask=c_mask)

  return out, new_state


# ------------------------------------------------------------------------------------------------
# Top-k, sampling, argmax
# ------------------------------------------------------------------------------------------------

def _topk_tile(vals, k):
  """The k largest of every row of the SBUF fp32 tile vals [128, n] (descending) and their positions (uint32).
  Clobbers vals when k > 8."""
  topv = nl.ndarray((par_dim(PMAX), k), dtype=nl.float32)
  topi = nl.ndarray((par_dim(PMAX), k), dtype=nl.uint32)
  if k <= 8:
    max_vals = nisa.max8(src=vals)
    topv[:, 0:k] = nl.copy(max_vals[:, 0:k])
    idx = nisa.nc_find_index8(data=vals, vals=max_vals)
    topi[:, 0:k] = nl.copy(idx[:, 0:k])
  else:
    assert k % 8 == 0, "k > 8 must be a multiple of 8"
    for r in nl.static_range(k // 8):
      topv[:, r * 8:(r + 1) * 8] = nisa.max8(src=vals)
      # knock the 8 found values out of vals; their positions go to topi
      vals[...] = nisa.nc_match_replace8(data=vals, vals=topv[:, r * 8:(r + 1) * 8], imm=nl.fp32.min,
                                         dst_idx=topi[:, r * 8:(r + 1) * 8])
  return topv, topi


def _topk_rows(logits, b0, k, vocab_tile):
  """Top-k values (fp32) and vocabulary ids (uint32) of logits rows b0 .. b0 + 127 (rows past the end are
  garbage and must be masked by the caller)."""
  B, V = logits.shape
  i_p = nl.arange(PMAX)[:, None]
  i_v = nl.arange(vocab_tile)[None, :]
  n_vt = math.ceil(V / vocab_tile)
  row_mask = (b0 + i_p < B)

  if n_vt == 1:
    vals = nl.full((par_dim(PMAX), vocab_tile), nl.fp32.min, dtype=nl.float32)
    vals[i_p, i_v] = nl.load(logits[b0 + i_p, i_v], mask=row_mask & (i_v < V), dtype=nl.float32)
    return _topk_tile(vals, k)

  # per vocabulary tile: kc candidates (at least the 8 of one max8) and their global ids
  kc = max(k, 8)
  cand_v = nl.ndarray((par_dim(PMAX), n_vt * kc), dtype=nl.float32)
  cand_i = nl.ndarray((par_dim(PMAX), n_vt * kc), dtype=nl.uint32)
  for v in nl.affine_range(n_vt):
    vals = nl.full((par_dim(PMAX), vocab_tile), nl.fp32.min, dtype=nl.float32)
    vmask = row_mask & (v * vocab_tile + i_v < V)
    vals[i_p, i_v] = nl.load(logits[b0 + i_p, v * vocab_tile + i_v], mask=vmask, dtype=nl.float32)
    tv, ti = _topk_tile(vals, kc)
    cand_v[:, v * kc:(v + 1) * kc] = nl.copy(tv)
    cand_i[:, v * kc:(v + 1) * kc] = nl.add(ti, v * vocab_tile, dtype=nl.uint32)

  # top-k of the candidates, then their ids
  topv, pos = _topk_tile(cand_v, k)
  topi = nl.gather_flattened(data=cand_i, indices=pos)
  return topv, topi


@nki.jit
def topk_kernel(logits, k=8, vocab_tile=MAX8_FMAX):
  """logits [B, V] -> (values [B, k] fp32 descending, ids [B, k] uint32)."""
  B, V = logits.shape
  assert k <= 8 or k % 8 == 0
  assert vocab_tile <= MAX8_FMAX
  vocab_tile = min(vocab_tile, V)
  out_v = nl.ndarray((B, k), dtype=nl.float32, buffer=nl.shared_hbm)
  out_i = nl.ndarray((B, k), dtype=nl.uint32, buffer=nl.shared_hbm)
  i_p = nl.arange(PMAX)[:, None]
  i_k = nl.arange(k)[None, :]
  for b in nl.affine_range(math.ceil(B / PMAX)):
    topv, topi = _topk_rows(logits, b * PMAX, k, vocab_tile)
    nl.store(out_v[b * PMAX + i_p, i_k], value=topv, mask=(b * PMAX + i_p < B))
    nl.store(out_i[b * PMAX + i_p, i_k], value=topi, mask=(b * PMAX + i_p < B))
  return out_v, out_i


@nki.jit
def sample_kernel(logits, temperature, top_p, rand, k=8, vocab_tile=MAX8_FMAX):
  """logits [B, V]; temperature, top_p, rand [B, 1] fp32 (rand uniform in [0, 1)).
  Returns (tokens [B, 1] int32, probs [B, k] fp32: the top-k probabilities after the top-p cutoff,
  renormalised)."""
  B, V = logits.shape
  vocab_tile = min(vocab_tile, V)
  tokens = nl.ndarray((B, 1), dtype=nl.int32, buffer=nl.shared_hbm)
  probs_out = nl.ndarray((B, k), dtype=nl.float32, buffer=nl.shared_hbm)

  i_p = nl.arange(PMAX)[:, None]
  i_k = nl.arange(k)[None, :]
  i_0 = nl.arange(1)[None, :]

  ones = nl.full((par_dim(PMAX), k), 1.0, dtype=nl.float32)
  pos = nisa.iota(i_k + 0 * i_p, dtype=nl.float32)  # 0 .. k-1 on every partition

  for b in nl.affine_range(math.ceil(B / PMAX)):
    b0 = b * PMAX
    row_mask = (b0 + i_p < B)
    topv, topi = _topk_rows(logits, b0, k, vocab_tile)

    # rows past B of a ragged tile: temperature 1, top_p 1, rand 0 (their results are not stored)
    temp = nl.full((par_dim(PMAX), 1), 1.0, dtype=nl.float32)
    temp[i_p, i_0] = nl.load(temperature[b0 + i_p, i_0], mask=row_mask)
    p_thr = nl.full((par_dim(PMAX), 1), 1.0, dtype=nl.float32)
    p_thr[i_p, i_0] = nl.load(top_p[b0 + i_p, i_0], mask=row_mask)
    u = nl.zeros((par_dim(PMAX), 1), dtype=nl.float32)
    u[i_p, i_0] = nl.load(rand[b0 + i_p, i_0], mask=row_mask)

    # softmax of topv / temperature; topv[:, 0] is the row max
    inv_t = nisa.reciprocal(temp)
    neg_max = nisa.tensor_scalar(data=topv[:, 0:1], op0=np.multiply, operand0=inv_t, op1=np.multiply,
                                 operand1=-1.0)
    exp_sum = nl.ndarray((par_dim(PMAX), 1), dtype=nl.float32)
    e = nisa.activation_reduce(op=nl.exp, data=topv, reduce_op=np.add, reduce_res=exp_sum, bias=neg_max,
                               scale=inv_t)
    inv_sum = nisa.reciprocal(exp_sum)
    probs = nisa.tensor_scalar(data=e, op0=np.multiply, operand0=inv_sum)

    # top-p: keep token i while the mass before it (cumsum - p) is below top_p (the first is always kept)
    cum = nisa.tensor_tensor_scan(ones, probs, initial=0.0, op0=np.multiply, op1=np.add)
    before = nl.subtract(cum, probs)
    keep = nisa.tensor_scalar(data=before, op0=np.less, operand0=p_thr)
    kept = nl.multiply(probs, keep)

    kept_sum = nisa.tensor_reduce(np.add, kept, axis=[1], keepdims=True)
    inv_kept = nisa.reciprocal(kept_sum)
    kept = nisa.tensor_scalar(data=kept, op0=np.multiply, operand0=inv_kept)
    nl.store(probs_out[b0 + i_p, i_k], value=kept, mask=row_mask)

    # sample: the first position whose kept cumulative mass exceeds u
    kcum = nisa.tensor_tensor_scan(ones, kept, initial=0.0, op0=np.multiply, op1=np.add)
    below = nisa.tensor_scalar(data=kcum, op0=np.less_equal, operand0=u)
    n_below = nisa.tensor_reduce(np.add, below, axis=[1], keepdims=True)
    n_keep = nisa.tensor_reduce(np.add, keep, axis=[1], keepdims=True)
    # u * total may round above the last cumsum: clamp to the last kept position
    choice = nl.minimum(n_below, nl.subtract(n_keep, 1.0))

    onehot = nisa.tensor_scalar(data=pos, op0=np.equal, operand0=choice)
    ids_f = nl.copy(topi, dtype=nl.float32)
    tok = nisa.tensor_tensor(onehot, ids_f, op=np.multiply)
    tok_f = nisa.tensor_reduce(np.add, tok, axis=[1], keepdims=True)
    nl.store(tokens[b0 + i_p, i_0], value=nl.copy(tok_f, dtype=nl.int32), mask=row_mask)

  return tokens, probs_out


@nki.jit
def greedy_argmax_kernel(logits, vocab_tile=4096):
  """logits [B, V] -> ids [B, 1] int32 of the first maximum of every row."""
  B, V = logits.shape
  vocab_tile = min(vocab_tile, V)
  ids = nl.ndarray((B, 1), dtype=nl.int32, buffer=nl.shared_hbm)
  i_p = nl.arange(PMAX)[:, None]
  i_v = nl.arange(vocab_tile)[None, :]
  i_0 = nl.arange(1)[None, :]
  BIG = 3.0e38

  for b in nl.affine_range(math.ceil(B / PMAX)):
    row_mask = (b * PMAX + i_p < B)
    best_v = nl.full((par_dim(PMAX), 1), nl.fp32.min, dtype=nl.float32)
    best_i = nl.zeros((par_dim(PMAX), 1), dtype=nl.float32)
    for v in nl.sequential_range(math.ceil(V / vocab_tile)):
      vals = nl.full((par_dim(PMAX), vocab_tile), nl.fp32.min, dtype=nl.float32)
      vals[i_p, i_v] = nl.load(logits[b * PMAX + i_p, v * vocab_tile + i_v],
                               mask=row_mask & (v * vocab_tile + i_v < V), dtype=nl.float32)
      m = nisa.tensor_reduce(np.max, vals, axis=[1], keepdims=True)

      # the first column holding the max: min over (is_max ? col : BIG)
      col = nisa.iota(v * vocab_tile + i_v + 0 * i_p, dtype=nl.float32)
      is_max = nisa.tensor_scalar(data=vals, op0=np.equal, operand0=m)
      cand = nl.where(is_max, col, BIG)
      first = nisa.tensor_reduce(np.min, cand, axis=[1], keepdims=True)

      # strictly greater: ties keep the earlier tile
      better = nl.greater(m, best_v)
      best_i[...] = nl.where(better, first, best_i)
      best_v[...] = nl.maximum(best_v, m)

    nl.store(ids[b * PMAX + i_p, i_0], value=nl.copy(best_i, dtype=nl.int32), mask=row_mask)
  return ids


# ------------------------------------------------------------------------------------------------
# Embedding lookup
# ------------------------------------------------------------------------------------------------

@nki.jit
def embedding_kernel(token_ids, table, tile_h=2048):
  """token_ids [T] int32; table [V, H]. out[t, :] = table[token_ids[t], :]."""
  T = token_ids.shape[0]
  V, H = table.shape
  tile_h = min(tile_h, H)
  out = nl.ndarray((T, H), dtype=table.dtype, buffer=nl.shared_hbm)

  i_p = nl.arange(PMAX)[:, None]
  i_f = nl.arange(tile_h)[None, :]

  for t in nl.affine_range(math.ceil(T / PMAX)):
    t_mask = (t * PMAX + i_p < T)
    # one token id per partition
    ids = nl.load(token_ids[t * PMAX + i_p], mask=t_mask)
    for h in nl.affine_range(math.ceil(H / tile_h)):
      mask = t_mask & (h * tile_h + i_f < H)
      rows = nl.load(table[ids[i_p, 0], h * tile_h + i_f], mask=mask)
      nl.store(out[t * PMAX + i_p, h * tile_h + i_f], value=rows, mask=mask)

  return out


@nki.jit
def embedding_backward_kernel(token_ids, grad_out, num_embeddings, tile_h=512):
  """token_ids [T] int32; grad_out [T, H]. grad_table [V, H] fp32 with grad_table[v] = sum of grad_out[t] over
  the t with token_ids[t] == v (an indirect scatter-add; repeated ids all add)."""
  T, H = grad_out.shape
  V = num_embeddings
  tile_h = min(tile_h, H)
  grad_table = nl.ndarray((V, H), dtype=nl.float32, buffer=nl.shared_hbm)

  i_p = nl.arange(PMAX)[:, None]
  i_h = nl.arange(H)[None, :]
  i_f = nl.arange(tile_h)[None, :]

  zeros = nl.zeros((par_dim(PMAX), H), dtype=nl.float32)
  for v in nl.affine_range(math.ceil(V / PMAX)):
    nl.store(grad_table[v * PMAX + i_p, i_h], value=zeros, mask=(v * PMAX + i_p < V))

  for t in nl.affine_range(math.ceil(T / PMAX)):
    t_mask = (t * PMAX + i_p < T)
    ids = nl.load(token_ids[t * PMAX + i_p], mask=t_mask)
    for h in nl.affine_range(math.ceil(H / tile_h)):
      mask = t_mask & (h * tile_h + i_f < H)
      g = nl.load(grad_out[t * PMAX + i_p, h * tile_h + i_f], mask=mask, dtype=nl.float32)
      nl.atomic_rmw(grad_table[ids[i_p, 0], h * tile_h + i_f], value=g, op=np.add, mask=mask)

  return grad_table


@nki.jit
def embedding_update_kernel(table, token_ids, new_rows, tile_h=512):
  """Writes new_rows [T, H] into the rows token_ids [T] (distinct) of table [V, H], in place (an indirect
  scatter, as a cache update writes its slots); returns the table."""
  T, H = new_rows.shape
  tile_h = min(tile_h, H)
  i_p = nl.arange(PMAX)[:, None]
  i_f = nl.arange(tile_h)[None, :]

  for t in nl.affine_range(math.ceil(T / PMAX)):
    t_mask = (t * PMAX + i_p < T)
    ids = nl.load(token_ids[t * PMAX + i_p], mask=t_mask)
    for h in nl.affine_range(math.ceil(H / tile_h)):
      mask = t_mask & (h * tile_h + i_f < H)
      rows = nl.load(new_rows[t * PMAX + i_p, h * tile_h + i_f], mask=mask)
      nl.store(table[ids[i_p, 0], h * tile_h + i_f], value=rows, mask=mask)

  return table
