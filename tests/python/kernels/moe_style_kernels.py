"""Mixture-of-Experts kernels written in the style of aws-neuron/nki-moe: new NKI dialect (``import nki``), a
token-choice router and a token-dispatch expert MLP with its combine.

``router_topk(hidden, w_router, top_k)``: router logits ``hidden @ w_router`` on the PE (token tiles transposed
on the PE, contraction over hidden-dim tiles accumulated in PSUM), a softmax over the experts (row max by
``tensor_reduce`` with ``negate``, ``activation_reduce`` exp with the row sum, ``reciprocal``), the top-8
affinities of each token by ``nisa.max8`` and their expert ids by ``nisa.nc_find_index8``, and the first
``top_k`` renormalised to sum to one (``norm_topk_prob``). Outputs: the affinities [T, E] (fp32), the expert
ids [T, top_k] (uint32, in decreasing affinity) and the routing weights [T, top_k] (fp32).

``moe_expert_mlp(hidden, token_ids, token_weights, gate_w, up_w, down_w)``: for each expert (a
``sequential_range``: experts scatter-add into the same output rows) the tokens routed to it are gathered from
HBM by an indirect DMA (``.ap(vector_offset=ids, indirect_dim=0)``; unused capacity slots hold the index T,
out of range, skipped by ``oob_mode.skip``), transposed on the PE, run through the SwiGLU MLP in the transposed
layout (``gate^T``/``up^T`` [I-tile, C] = ``W[:, I-tile]^T @ x^T``; ``silu(gate^T) * up^T`` is already the
stationary of the down projection), scaled per token by its routing weight and added back into the output rows
of those tokens by an indirect read-modify-write DMA (``nisa.dma_compute`` scatter-add). The host-side
dispatch (token ids and weights per expert, padded to the capacity C) is ``dispatch`` below.

    out[t] = sum over the top_k experts e of t of  w[t, e] * (silu(x_t @ gate_w[e]) * (x_t @ up_w[e])) @ down_w[e]

Written for nsim's tests from memory of that repository's kernels and of the MoE kernels of the Neuron
libraries; not a copy of any nki-moe file. No nsim imports.
"""
import numpy as np

import nki
import nki.isa as nisa
import nki.language as nl

P_MAX = 128
PSUM_FMAX = 512


def div_ceil(n, d):
  return (n + d - 1) // d


def load_k_major(w, num_k_tiles, n):
  """w [K, N] (an HBM view) -> SBUF [128, K/128, N], w_sb[p, k, :] = w[k * 128 + p, :], one DMA."""
  w_sb = nl.ndarray((P_MAX, num_k_tiles, n), dtype=w.dtype, buffer=nl.sbuf)
  nisa.dma_copy(dst=w_sb, src=w.ap(pattern=[[n, P_MAX], [P_MAX * n, num_k_tiles], [1, n]]))
  return w_sb


def transpose_rows(x_sb, rows, num_k_tiles):
  """x_sb [rows, K] (SBUF) -> xT [128, K/128, rows] (SBUF), one PE transpose per 128 columns."""
  xT = nl.ndarray((P_MAX, num_k_tiles, P_MAX), dtype=x_sb.dtype, buffer=nl.sbuf)
  for k in nl.affine_range(num_k_tiles):
    xT_ps = nl.ndarray((P_MAX, P_MAX), dtype=x_sb.dtype, buffer=nl.psum)
    nisa.nc_transpose(dst=xT_ps[:, :rows], data=x_sb[:rows, nl.ds(k * P_MAX, P_MAX)])
    nisa.tensor_copy(dst=xT[:, k, :rows], src=xT_ps[:, :rows])
  return xT


@nki.jit
def router_topk(hidden, w_router, top_k=2):
  T, H = hidden.shape
  H_, E = w_router.shape
  assert H == H_, "hidden {} and router weight {} mismatch".format(hidden.shape, w_router.shape)
  assert H % P_MAX == 0, "H={} must be a multiple of {}".format(H, P_MAX)
  assert 8 <= E <= PSUM_FMAX, "max8 needs at least 8 experts, got {}".format(E)
  assert 1 <= top_k <= 8
  n_h = H // P_MAX

  affinities = nl.ndarray((T, E), dtype=nl.float32, buffer=nl.shared_hbm)
  expert_index = nl.ndarray((T, top_k), dtype=nl.uint32, buffer=nl.shared_hbm)
  expert_weights = nl.ndarray((T, top_k), dtype=nl.float32, buffer=nl.shared_hbm)

  w_sb = load_k_major(w_router, n_h, E)

  for it in nl.affine_range(div_ceil(T, P_MAX)):
    t0 = it * P_MAX
    rows = min(P_MAX, T - t0)
    x = nl.ndarray((P_MAX, H), dtype=hidden.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=x[:rows, :], src=hidden[t0:t0 + rows, :])
    xT = transpose_rows(x, rows, n_h)

    # router logits [tokens, E], accumulated over the hidden tiles
    logits_ps = nl.ndarray((P_MAX, E), dtype=nl.float32, buffer=nl.psum)
    for k in nl.affine_range(n_h):
      nisa.nc_matmul(dst=logits_ps[:rows, :], stationary=xT[:, k, :rows], moving=w_sb[:, k, :])

    # softmax over the experts (free dim)
    neg_max = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=neg_max[:rows], op=nl.maximum, data=logits_ps[:rows, :], axis=1, negate=True)
    exps = nl.ndarray((P_MAX, E), dtype=nl.float32, buffer=nl.sbuf)
    row_sum = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation_reduce(dst=exps[:rows], op=nl.exp, data=logits_ps[:rows, :], reduce_op=nl.add,
                           reduce_res=row_sum[:rows], bias=neg_max[:rows])
    inv_sum = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.reciprocal(dst=inv_sum[:rows], data=row_sum[:rows])
    probs = nl.ndarray((P_MAX, E), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=probs[:rows], data=exps[:rows], op0=nl.multiply, operand0=inv_sum[:rows])
    nisa.dma_copy(dst=affinities[t0:t0 + rows, :], src=probs[:rows, :])

    # top-k: the 8 largest affinities in decreasing order, then where they are
    top8 = nl.ndarray((P_MAX, 8), dtype=nl.float32, buffer=nl.sbuf)
    nisa.max8(dst=top8[:rows], src=probs[:rows])
    idx8 = nl.ndarray((P_MAX, 8), dtype=nl.uint32, buffer=nl.sbuf)
    nisa.nc_find_index8(dst=idx8[:rows], data=probs[:rows], vals=top8[:rows])

    # renormalise the first top_k to sum to one
    top_sum = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=top_sum[:rows], op=nl.add, data=top8[:rows, :top_k], axis=1)
    inv_top = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.reciprocal(dst=inv_top[:rows], data=top_sum[:rows])
    weights = nl.ndarray((P_MAX, top_k), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=weights[:rows], data=top8[:rows, :top_k], op0=nl.multiply, operand0=inv_top[:rows])

    nisa.dma_copy(dst=expert_index[t0:t0 + rows, :], src=idx8[:rows, :top_k])
    nisa.dma_copy(dst=expert_weights[t0:t0 + rows, :], src=weights[:rows, :])

  return affinities, expert_index, expert_weights


@nki.jit
def moe_expert_mlp(hidden, token_ids, token_weights, gate_w, up_w, down_w):
  """hidden [T, H]; token_ids [E, C] int32 (T = unused slot); token_weights [E, C] fp32;
  gate_w, up_w [E, H, I]; down_w [E, I, H]. Returns out [T, H] in hidden.dtype."""
  T, H = hidden.shape
  E, C = token_ids.shape
  E_, H_, I = gate_w.shape
  assert E == E_ and H == H_ and down_w.shape == (E, I, H) and up_w.shape == gate_w.shape
  assert C <= P_MAX, "capacity {} must fit the partitions".format(C)
  assert H % P_MAX == 0 and I % P_MAX == 0
  n_h, n_i = H // P_MAX, I // P_MAX
  h_chunk = min(H, PSUM_FMAX)
  assert H % h_chunk == 0

  out = nl.ndarray((T, H), dtype=hidden.dtype, buffer=nl.shared_hbm)

  # the combine accumulates into out: start from zeros
  zeros = nl.ndarray((P_MAX, H), dtype=hidden.dtype, buffer=nl.sbuf)
  nisa.memset(dst=zeros, value=0.0)
  for it in nl.affine_range(div_ceil(T, P_MAX)):
    t0 = it * P_MAX
    rows = min(P_MAX, T - t0)
    nisa.dma_copy(dst=out[t0:t0 + rows, :], src=zeros[:rows, :])

  for e in nl.sequential_range(E):
    # dispatch metadata of expert e: one token id and one weight per partition
    ids = nl.ndarray((C, 1), dtype=token_ids.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=ids, src=token_ids[e])
    w_tok = nl.ndarray((C, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=w_tok, src=token_weights[e])

    # gather the expert's tokens (unused slots stay zero)
    x = nl.ndarray((C, H), dtype=hidden.dtype, buffer=nl.sbuf)
    nisa.memset(dst=x, value=0.0)
    nisa.dma_copy(dst=x, src=hidden.ap(pattern=[[H, C], [1, H]], vector_offset=ids, indirect_dim=0),
                  oob_mode=nisa.oob_mode.skip)
    xT = transpose_rows(x, C, n_h)

    gate_sb = load_k_major(gate_w[e], n_h, I)
    up_sb = load_k_major(up_w[e], n_h, I)
    down_sb = load_k_major(down_w[e], n_i, H)

    # SwiGLU in the transposed layout: actT [I-tile, C] is the stationary of the down projection
    actT = nl.ndarray((P_MAX, n_i, C), dtype=hidden.dtype, buffer=nl.sbuf)
    for i in nl.affine_range(n_i):
      gate_ps = nl.ndarray((P_MAX, C), dtype=nl.float32, buffer=nl.psum)
      up_ps = nl.ndarray((P_MAX, C), dtype=nl.float32, buffer=nl.psum)
      for k in nl.affine_range(n_h):
        nisa.nc_matmul(dst=gate_ps, stationary=gate_sb[:, k, nl.ds(i * P_MAX, P_MAX)], moving=xT[:, k, :C])
        nisa.nc_matmul(dst=up_ps, stationary=up_sb[:, k, nl.ds(i * P_MAX, P_MAX)], moving=xT[:, k, :C])
      gate_act = nl.ndarray((P_MAX, C), dtype=nl.float32, buffer=nl.sbuf)
      nisa.activation(dst=gate_act, op=nl.silu, data=gate_ps)
      nisa.tensor_tensor(dst=actT[:, i, :], data1=gate_act, data2=up_ps, op=nl.multiply)

    # down projection [C, H] by PSUM-bank chunks, scaled by the routing weight of each token
    y = nl.ndarray((C, H), dtype=nl.float32, buffer=nl.sbuf)
    for j in nl.affine_range(H // h_chunk):
      down_ps = nl.ndarray((C, h_chunk), dtype=nl.float32, buffer=nl.psum)
      for i in nl.affine_range(n_i):
        nisa.nc_matmul(dst=down_ps, stationary=actT[:, i, :], moving=down_sb[:, i, nl.ds(j * h_chunk, h_chunk)])
      nisa.tensor_scalar(dst=y[:, nl.ds(j * h_chunk, h_chunk)], data=down_ps, op0=nl.multiply, operand0=w_tok)

    # combine: out[ids[c]] += y[c] (unused slots skipped)
    out_rows = out.ap(pattern=[[H, C], [1, H]], vector_offset=ids, indirect_dim=0)
    nisa.dma_compute(dst=out_rows, srcs=[out_rows, y], reduce_op=nl.add, oob_mode=nisa.oob_mode.skip)

  return out


def dispatch(expert_index, expert_weights, num_experts, capacity=None):
  """Host side: (token_ids [E, C] int32, token_weights [E, C] fp32) from the router's top-k, tokens in
  ascending order per expert; unused slots get token id T (out of range) and weight 0."""
  T, k = expert_index.shape
  counts = np.bincount(np.asarray(expert_index).reshape(-1).astype(np.int64), minlength=num_experts)
  C = int(capacity or max(1, counts.max()))
  assert counts.max() <= C
  ids = np.full((num_experts, C), T, np.int32)
  wts = np.zeros((num_experts, C), np.float32)
  fill = np.zeros(num_experts, np.int64)
  for t in range(T):
    for j in range(k):
      e = int(expert_index[t, j])
      ids[e, fill[e]] = t
      wts[e, fill[e]] = expert_weights[t, j]
      fill[e] += 1
  return ids, wts
