"""Serving-time logit processors in the new NKI dialect (``import nki``, ISA calls writing ``dst=``), written the way
public NKI 0.3+ kernels are:

- ``logit_bias_bad_words(logits, bias_ids, bias_vals, bad_ids)``: requests [B <= 128] on the partitions. The logits
  are copied to the output (one HBM -> HBM DMA), then, per column k of the host's (token, bias) lists, the biased
  logits are gathered from the output viewed as [B * V, 1] at rows b * V + id (``nisa.iota`` with
  ``channel_multiplier=V`` plus the ids; ``.ap(vector_offset=..., indirect_dim=0)``), the bias added on the vector
  engine and scattered back to the same rows; then each column of the bad-words lists scatters a tile of NEG to
  its rows (a repeated bad word just writes NEG twice). The ids of one request's bias list are distinct (as
  vLLM's dict of token -> bias).
- ``logit_bias_rmw(logits, bias_ids, bias_vals)``: the bias alone, one read-modify-write DMA per column
  (``nisa.dma_compute(dst=view, srcs=[view, bias column], reduce_op=nl.add)`` with ``view`` the indirect
  [B, 1] rows of the output): no gather round trip through SBUF.
- ``min_p_filter(logits, min_p, vt)``: keep the tokens with p >= min_p * p_max, i.e. in logit space
  x >= max(x) + log(min_p) (softmax-free). The row is loaded per vocabulary tile of ``vt`` into one SBUF tile; the
  per-tile maxima (``tensor_reduce``) reduce to the row max; log(min_p) by ``activation(op=nl.log)``; per tile
  ``tensor_scalar`` (x >= thr) - 1 (0 kept, -1 dropped), then two ``scalar_tensor_tensor``: x * (m + 1) and
  m * BIG + that: kept logits bit for bit, dropped ones NEG (no overflow for logits already at NEG).
- ``min_p_select(logits, min_p, vt)``: the same filter with the tiles addressed by ``.ap`` access patterns on the
  HBM logits and the SBUF row, the keep predicate a uint8 tile (``tensor_scalar`` with a uint8 dst) and the
  masking one ``nisa.select_reduce`` (on_false = NEG), which also returns the kept maximum per tile.

Written for nsim's tests in the style of those kernels; not copies of any file. No nsim imports.
"""
import nki
import nki.isa as nisa
import nki.language as nl

P_MAX = 128
NEG = -3.0e38
BIG = 3.0e38


@nki.jit
def logit_bias_bad_words(logits, bias_ids, bias_vals, bad_ids):
  B, V = logits.shape
  _, K = bias_ids.shape
  _, W = bad_ids.shape
  assert B <= P_MAX
  out = nl.ndarray((B, V), dtype=logits.dtype, buffer=nl.shared_hbm)
  nisa.dma_copy(dst=out, src=logits)
  flat = out.reshape((B * V, 1))

  # b * V on partition b
  base = nl.ndarray((B, 1), dtype=nl.int32, buffer=nl.sbuf)
  nisa.iota(dst=base, pattern=[[0, 1]], offset=0, channel_multiplier=V)

  ids = nl.ndarray((B, K), dtype=nl.int32, buffer=nl.sbuf)
  nisa.dma_copy(dst=ids, src=bias_ids)
  rows = nl.ndarray((B, K), dtype=nl.int32, buffer=nl.sbuf)
  nisa.tensor_scalar(dst=rows, data=ids, op0=nl.add, operand0=base)
  bias = nl.ndarray((B, K), dtype=nl.float32, buffer=nl.sbuf)
  nisa.dma_copy(dst=bias, src=bias_vals)

  for k in nl.sequential_range(K):
    g = nl.ndarray((B, 1), dtype=logits.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=g, src=flat.ap(pattern=[[1, B], [1, 1]], vector_offset=rows[:, k:k + 1], indirect_dim=0))
    s = nl.ndarray((B, 1), dtype=logits.dtype, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=s, data1=g, data2=bias[:, k:k + 1], op=nl.add)
    nisa.dma_copy(dst=flat.ap(pattern=[[1, B], [1, 1]], vector_offset=rows[:, k:k + 1], indirect_dim=0), src=s)

  bad = nl.ndarray((B, W), dtype=nl.int32, buffer=nl.sbuf)
  nisa.dma_copy(dst=bad, src=bad_ids)
  bad_rows = nl.ndarray((B, W), dtype=nl.int32, buffer=nl.sbuf)
  nisa.tensor_scalar(dst=bad_rows, data=bad, op0=nl.add, operand0=base)
  neg = nl.ndarray((B, 1), dtype=logits.dtype, buffer=nl.sbuf)
  nisa.memset(dst=neg, value=NEG)
  for w in nl.sequential_range(W):
    nisa.dma_copy(dst=flat.ap(pattern=[[1, B], [1, 1]], vector_offset=bad_rows[:, w:w + 1], indirect_dim=0),
                  src=neg)
  return out


@nki.jit
def logit_bias_rmw(logits, bias_ids, bias_vals):
  B, V = logits.shape
  _, K = bias_ids.shape
  assert B <= P_MAX
  out = nl.ndarray((B, V), dtype=logits.dtype, buffer=nl.shared_hbm)
  nisa.dma_copy(dst=out, src=logits)
  flat = out.reshape((B * V, 1))
  base = nl.ndarray((B, 1), dtype=nl.int32, buffer=nl.sbuf)
  nisa.iota(dst=base, pattern=[[0, 1]], offset=0, channel_multiplier=V)
  ids = nl.ndarray((B, K), dtype=nl.int32, buffer=nl.sbuf)
  nisa.dma_copy(dst=ids, src=bias_ids)
  rows = nl.ndarray((B, K), dtype=nl.int32, buffer=nl.sbuf)
  nisa.tensor_scalar(dst=rows, data=ids, op0=nl.add, operand0=base)
  bias = nl.ndarray((B, K), dtype=nl.float32, buffer=nl.sbuf)
  nisa.dma_copy(dst=bias, src=bias_vals)
  for k in nl.sequential_range(K):
    view = flat.ap(pattern=[[1, B], [1, 1]], vector_offset=rows[:, k:k + 1], indirect_dim=0)
    nisa.dma_compute(dst=view, srcs=[view, bias[:, k:k + 1]], reduce_op=nl.add)
  return out


@nki.jit
def min_p_filter(logits, min_p, vt=2048):
  B, V = logits.shape
  assert B <= P_MAX and V % vt == 0
  NC = V // vt
  out = nl.ndarray((B, V), dtype=logits.dtype, buffer=nl.shared_hbm)

  x = nl.ndarray((B, V), dtype=nl.float32, buffer=nl.sbuf)
  tmax = nl.ndarray((B, NC), dtype=nl.float32, buffer=nl.sbuf)
  for c in nl.affine_range(NC):
    nisa.dma_copy(dst=x[:, c * vt:(c + 1) * vt], src=logits[:, c * vt:(c + 1) * vt])
    nisa.tensor_reduce(dst=tmax[:, c:c + 1], op=nl.maximum, data=x[:, c * vt:(c + 1) * vt], axis=1,
                       keepdims=True)
  mx = nl.ndarray((B, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_reduce(dst=mx, op=nl.maximum, data=tmax, axis=1, keepdims=True)

  mp = nl.ndarray((B, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.dma_copy(dst=mp, src=min_p)
  log_mp = nl.ndarray((B, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.activation(dst=log_mp, op=nl.log, data=mp)
  thr = nl.ndarray((B, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_tensor(dst=thr, data1=mx, data2=log_mp, op=nl.add)

  for c in nl.affine_range(NC):
    # keep - 1: 0 kept, -1 dropped
    keep = nl.ndarray((B, vt), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=keep, data=x[:, c * vt:(c + 1) * vt], op0=nl.greater_equal, operand0=thr,
                       op1=nl.subtract, operand1=1.0)
    # x * keep (0 where dropped), then + (keep - 1) * BIG: never adds BIG to an already very negative logit
    xk = nl.ndarray((B, vt), dtype=nl.float32, buffer=nl.sbuf)
    nisa.scalar_tensor_tensor(dst=xk, data=keep, op0=nl.add, operand0=1.0, op1=nl.multiply,
                              operand1=x[:, c * vt:(c + 1) * vt])
    nisa.scalar_tensor_tensor(dst=xk, data=keep, op0=nl.multiply, operand0=BIG, op1=nl.add, operand1=xk)
    nisa.dma_copy(dst=out[:, c * vt:(c + 1) * vt], src=xk)  # cast to the logits' dtype on the way out
  return out


@nki.jit
def min_p_select(logits, min_p, vt=2048):
  B, V = logits.shape
  assert B <= P_MAX and V % vt == 0
  NC = V // vt
  out = nl.ndarray((B, V), dtype=logits.dtype, buffer=nl.shared_hbm)

  x = nl.ndarray((B, V), dtype=nl.float32, buffer=nl.sbuf)
  tmax = nl.ndarray((B, NC), dtype=nl.float32, buffer=nl.sbuf)
  for c in nl.affine_range(NC):
    nisa.dma_copy(dst=x.ap(pattern=[[V, B], [1, vt]], offset=c * vt),
                  src=logits.ap(pattern=[[V, B], [1, vt]], offset=c * vt))
    nisa.tensor_reduce(dst=tmax[:, c:c + 1], op=nl.maximum, data=x.ap(pattern=[[V, B], [1, vt]], offset=c * vt),
                       axis=1)
  mx = nl.ndarray((B, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_reduce(dst=mx, op=nl.maximum, data=tmax, axis=1)
  mp = nl.ndarray((B, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.dma_copy(dst=mp, src=min_p)
  thr = nl.ndarray((B, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.activation(dst=thr, op=nl.log, data=mp)
  nisa.tensor_tensor(dst=thr, data1=thr, data2=mx, op=nl.add)

  kept_max = nl.ndarray((B, NC), dtype=nl.float32, buffer=nl.sbuf)
  for c in nl.affine_range(NC):
    pred = nl.ndarray((B, vt), dtype=nl.uint8, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=pred, data=x.ap(pattern=[[V, B], [1, vt]], offset=c * vt), op0=nl.greater_equal,
                       operand0=thr)
    y = nl.ndarray((B, vt), dtype=logits.dtype, buffer=nl.sbuf)
    nisa.select_reduce(dst=y, predicate=pred, on_true=x.ap(pattern=[[V, B], [1, vt]], offset=c * vt),
                       on_false=NEG, reduce_res=kept_max[:, c:c + 1], reduce_cmd=nisa.reduce_cmd.reset_reduce,
                       reduce_op=nl.maximum)
    nisa.dma_copy(dst=out.ap(pattern=[[V, B], [1, vt]], offset=c * vt), src=y)
  return out
