"""Runtime control flow in the new NKI dialect (``import nki``, ISA calls writing ``dst=``), written the way public
decode kernels (vLLM / NxD-Inference token generation with runtime lengths) and nki-library kernels using sequencer
registers and dynamic loops are:

- ``decode_attention_dyn(q, k_cache, v_cache, num_blocks)``: one decode step of GQA attention over a contiguous
  cache [Hkv, NB_max, d, 128] (keys transposed) / [Hkv, NB_max, 128, d]; the number of valid 128-key blocks is the
  int32 ``num_blocks`` [1] read into a register (``nisa.register_load``) and drives ``nl.dynamic_range``; block b
  is addressed with ``.ap(scalar_offset=b, indirect_dim=1)``; flash-style online softmax across blocks.
- ``paged_decode(q, k_pages, v_pages, block_table, context_blocks)``: a ragged batch of decode sequences over a
  paged cache: the sequences are a static loop, each one's block count a runtime value driving ``nl.fori_loop``;
  the body reads the page id from the block table into a register (``register_load`` of a one-element
  ``.ap(scalar_offset=j)`` view) and addresses the page with ``.ap(scalar_offset=page)``.
- ``block_gemv_dyn(x, w, num_blocks)`` / ``block_gemv_static(x, w, nblk)``: out[G, N] = sum over the first
  blocks b of x[b]^T w[b], accumulated in PSUM; the same work with a runtime count (``nl.dynamic_range`` over a
  register) and with a trace-time count (``nl.affine_range``).
- ``block_softmax_dyn(x, num_blocks)``: row softmax of the first ``num_blocks`` [128, F] blocks of x (a runtime count,
  ``nl.dynamic_range``), the max / exp / scale of each block under ``nl.no_reorder()`` inside the runtime loop, the
  store after it.
- ``greedy_next_embedding(logits, table, dependent=True)``: greedy sampling then the next step's embedding lookup:
  the argmax of logits [1, V] on chip (``max8`` + ``nc_find_index8``), loaded into a register and used as the row
  address of the embedding table [V, 128, D] (``.ap(scalar_offset=reg)``); ``dependent=False`` reads row 0 instead
  (the same work without the dependency).
- ``power_iteration(a, v0, tol, max_iter)``: dominant eigenpair of a symmetric matrix; ``nl.while_loop`` whose
  condition register is loaded from an on-chip flag tile (change of the normalised vector above ``tol`` and fewer
  than ``max_iter`` iterations, the iteration count kept in SBUF); returns the vector, the eigenvalue and the
  iteration count.
- ``accept_prefix(draft, target)``: speculative decoding's "accept until the first mismatch": a ``while_loop`` over
  the draft tokens with the position held in an SBUF counter reloaded into a register (no register arithmetic in
  NKI), token reads / writes through ``.ap(scalar_offset=reg)``; out = accepted drafts then the target's token at
  the first mismatch (the bonus token when all match), -1 after; also the accepted count. May run 0 times.

Written for nsim's tests in the style of those kernels; not copies of any file. No nsim imports.
"""
import nki
import nki.isa as nisa
import nki.language as nl

P_MAX = 128
NEG = -3.0e38


def _online_block(s, width, v_sb, m, l, acc, rows, d, scale, vdt):
  """One flash step on scores s[:rows, :width] (PSUM, unscaled) and values v_sb[:width, :d]."""
  bmax = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_reduce(dst=bmax, op=nl.maximum, data=s, axis=1)
  m_new = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_tensor(dst=m_new, data1=m, data2=bmax, op=nl.maximum)
  neg_m = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_scalar(dst=neg_m, data=m_new, op0=nl.multiply, operand0=-scale)
  alpha = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.activation(dst=alpha, op=nl.exp, data=m, bias=neg_m, scale=scale)
  p = nl.ndarray((rows, width), dtype=vdt, buffer=nl.sbuf)
  rsum = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.activation(dst=p, op=nl.exp, data=s, bias=neg_m, scale=scale, reduce_op=nl.add, reduce_res=rsum,
                  reduce_cmd=nisa.reduce_cmd.reset_reduce)
  nisa.scalar_tensor_tensor(dst=l, data=l, op0=nl.multiply, operand0=alpha, op1=nl.add, operand1=rsum)
  nisa.tensor_copy(dst=m, src=m_new)
  pT_ps = nl.ndarray((width, rows), dtype=vdt, buffer=nl.psum)
  nisa.nc_transpose(dst=pT_ps, data=p)
  pT = nl.ndarray((width, rows), dtype=vdt, buffer=nl.sbuf)
  nisa.tensor_copy(dst=pT, src=pT_ps)
  pv = nl.ndarray((rows, d), dtype=nl.float32, buffer=nl.psum)
  nisa.nc_matmul(dst=pv, stationary=pT, moving=v_sb)
  nisa.scalar_tensor_tensor(dst=acc, data=acc, op0=nl.multiply, operand0=alpha, op1=nl.add, operand1=pv)


def _state(rows, d):
  m = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.memset(dst=m, value=NEG)
  l = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.memset(dst=l, value=0.0)
  acc = nl.ndarray((rows, d), dtype=nl.float32, buffer=nl.sbuf)
  nisa.memset(dst=acc, value=0.0)
  return m, l, acc


def _finish(out_view, l, acc, rows, d, dt):
  inv_l = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.reciprocal(dst=inv_l, data=l)
  o = nl.ndarray((rows, d), dtype=dt, buffer=nl.sbuf)
  nisa.tensor_scalar(dst=o, data=acc, op0=nl.multiply, operand0=inv_l)
  nisa.dma_copy(dst=out_view, src=o)


@nki.jit
def decode_attention_dyn(q, k_cache, v_cache, num_blocks):
  """q [Hkv, d, G] (the G query heads of a KV head, transposed), k_cache [Hkv, NB, d, 128], v_cache
  [Hkv, NB, 128, d], num_blocks [1] int32 (1 <= n <= NB) -> out [Hkv, G, d]."""
  Hkv, d, G = q.shape
  NB = k_cache.shape[1]
  scale = 1.0 / (d ** 0.5)
  out = nl.ndarray((Hkv, G, d), dtype=q.dtype, buffer=nl.shared_hbm)
  nblk = nisa.register_alloc()
  nisa.register_load(nblk, num_blocks)
  for h in nl.affine_range(Hkv):
    qT = nl.ndarray((d, G), dtype=q.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=qT, src=q[h])
    m, l, acc = _state(G, d)
    for b in nl.dynamic_range(nblk):
      kT = nl.ndarray((d, P_MAX), dtype=k_cache.dtype, buffer=nl.sbuf)
      nisa.dma_copy(dst=kT, src=k_cache.ap(pattern=[[P_MAX, d], [1, P_MAX]], offset=h * NB * d * P_MAX,
                                           scalar_offset=b, indirect_dim=1))
      v_sb = nl.ndarray((P_MAX, d), dtype=v_cache.dtype, buffer=nl.sbuf)
      nisa.dma_copy(dst=v_sb, src=v_cache.ap(pattern=[[d, P_MAX], [1, d]], offset=h * NB * P_MAX * d,
                                             scalar_offset=b, indirect_dim=1))
      s_ps = nl.ndarray((G, P_MAX), dtype=nl.float32, buffer=nl.psum)
      nisa.nc_matmul(dst=s_ps, stationary=qT, moving=kT)
      _online_block(s_ps, P_MAX, v_sb, m, l, acc, G, d, scale, v_cache.dtype)
    _finish(out[h], l, acc, G, d, q.dtype)
  return out


@nki.jit
def paged_decode(q, k_pages, v_pages, block_table, context_blocks):
  """q [B, d, G], k_pages [NP, d, 128], v_pages [NP, 128, d], block_table [B, M] int32 (page ids),
  context_blocks [B] int32 (1 <= n_b <= M) -> out [B, G, d]."""
  B, d, G = q.shape
  M = block_table.shape[1]
  scale = 1.0 / (d ** 0.5)
  out = nl.ndarray((B, G, d), dtype=q.dtype, buffer=nl.shared_hbm)
  nblk = nisa.register_alloc()
  page = nisa.register_alloc()
  for b in nl.static_range(B):
    nisa.register_load(nblk, context_blocks[b:b + 1])
    qT = nl.ndarray((d, G), dtype=q.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=qT, src=q[b])
    m, l, acc = _state(G, d)

    def body(j):
      nisa.register_load(page, block_table.ap(pattern=[[M, 1], [1, 1]], offset=b * M, scalar_offset=j,
                                              indirect_dim=1))
      kT = nl.ndarray((d, P_MAX), dtype=k_pages.dtype, buffer=nl.sbuf)
      nisa.dma_copy(dst=kT, src=k_pages.ap(pattern=[[P_MAX, d], [1, P_MAX]], scalar_offset=page, indirect_dim=0))
      v_sb = nl.ndarray((P_MAX, d), dtype=v_pages.dtype, buffer=nl.sbuf)
      nisa.dma_copy(dst=v_sb, src=v_pages.ap(pattern=[[d, P_MAX], [1, d]], scalar_offset=page, indirect_dim=0))
      s_ps = nl.ndarray((G, P_MAX), dtype=nl.float32, buffer=nl.psum)
      nisa.nc_matmul(dst=s_ps, stationary=qT, moving=kT)
      _online_block(s_ps, P_MAX, v_sb, m, l, acc, G, d, scale, v_pages.dtype)

    nl.fori_loop(0, nblk, body)
    _finish(out[b], l, acc, G, d, q.dtype)
  return out


def _gemv_block(x, w, b, acc_ps):
  K, G = x.shape[1], x.shape[2]
  N = w.shape[2]
  xb = nl.ndarray((K, G), dtype=x.dtype, buffer=nl.sbuf)
  nisa.dma_copy(dst=xb, src=x.ap(pattern=[[G, K], [1, G]], scalar_offset=b, indirect_dim=0))
  wb = nl.ndarray((K, N), dtype=w.dtype, buffer=nl.sbuf)
  nisa.dma_copy(dst=wb, src=w.ap(pattern=[[N, K], [1, N]], scalar_offset=b, indirect_dim=0))
  nisa.nc_matmul(dst=acc_ps, stationary=xb, moving=wb, accumulate=True)


def _gemv_out(acc_ps, G, N, dt):
  out = nl.ndarray((G, N), dtype=dt, buffer=nl.shared_hbm)
  o = nl.ndarray((G, N), dtype=dt, buffer=nl.sbuf)
  nisa.tensor_copy(dst=o, src=acc_ps)
  nisa.dma_copy(dst=out, src=o)
  return out


@nki.jit
def block_gemv_dyn(x, w, num_blocks):
  """x [NB, 128, G], w [NB, 128, N], num_blocks [1] int32 -> out [G, N] = sum_{b < n} x[b]^T w[b]."""
  NB, K, G = x.shape
  N = w.shape[2]
  n = nisa.register_alloc()
  nisa.register_load(n, num_blocks)
  acc_ps = nl.ndarray((G, N), dtype=nl.float32, buffer=nl.psum)
  nisa.memset(dst=acc_ps, value=0.0)
  for b in nl.dynamic_range(n):
    _gemv_block(x, w, b, acc_ps)
  return _gemv_out(acc_ps, G, N, x.dtype)


@nki.jit
def block_gemv_static(x, w, nblk):
  """``block_gemv_dyn`` with the block count a trace-time int."""
  NB, K, G = x.shape
  N = w.shape[2]
  acc_ps = nl.ndarray((G, N), dtype=nl.float32, buffer=nl.psum)
  nisa.memset(dst=acc_ps, value=0.0)
  for b in nl.affine_range(nblk):
    _gemv_block(x, w, b, acc_ps)
  return _gemv_out(acc_ps, G, N, x.dtype)


@nki.jit
def block_softmax_dyn(x, num_blocks):
  """x [NB, 128, F] -> out [NB, 128, F]: blocks b < num_blocks[0] get softmax over each row; the others 0."""
  NB, P, F = x.shape
  out = nl.ndarray((NB, P, F), dtype=x.dtype, buffer=nl.shared_hbm)
  zero = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.sbuf)
  nisa.memset(dst=zero, value=0.0)
  for b in nl.affine_range(NB):
    nisa.dma_copy(dst=out[b], src=zero)
  n = nisa.register_alloc()
  nisa.register_load(n, num_blocks)
  for b in nl.dynamic_range(n):
    xb = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=xb, src=x.ap(pattern=[[F, P], [1, F]], scalar_offset=b, indirect_dim=0))
    e = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
    ssum = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    with nl.no_reorder():
      mx = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
      nisa.tensor_reduce(dst=mx, op=nl.maximum, data=xb, axis=1, negate=True)
      nisa.activation(dst=e, op=nl.exp, data=xb, bias=mx, reduce_op=nl.add, reduce_res=ssum,
                      reduce_cmd=nisa.reduce_cmd.reset_reduce)
    rs = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.reciprocal(dst=rs, data=ssum)
    o = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=o, data=e, op0=nl.multiply, operand0=rs)
    nisa.dma_copy(dst=out.ap(pattern=[[F, P], [1, F]], scalar_offset=b, indirect_dim=0), src=o)
  return out


@nki.jit
def greedy_next_embedding(logits, table, dependent=True):
  """logits [1, V] fp32 (V <= 16384), table [V, 128, D] -> (token [1, 1] uint32, embedding [128, D])."""
  V = logits.shape[1]
  _, P, D = table.shape
  lg = nl.ndarray((1, V), dtype=nl.float32, buffer=nl.sbuf)
  nisa.dma_copy(dst=lg, src=logits)
  top = nl.ndarray((1, 8), dtype=nl.float32, buffer=nl.sbuf)
  nisa.max8(dst=top, src=lg)
  idx = nl.ndarray((1, 8), dtype=nl.uint32, buffer=nl.sbuf)
  nisa.nc_find_index8(dst=idx, data=lg, vals=top)
  tok = nisa.register_alloc(0)
  if dependent:
    nisa.register_load(tok, idx[0:1, 0:1])
  emb = nl.ndarray((P, D), dtype=table.dtype, buffer=nl.sbuf)
  nisa.dma_copy(dst=emb, src=table.ap(pattern=[[D, P], [1, D]], scalar_offset=tok, indirect_dim=0))
  token = nl.ndarray((1, 1), dtype=nl.uint32, buffer=nl.shared_hbm)
  nisa.dma_copy(dst=token, src=idx[0:1, 0:1])
  out = nl.ndarray((P, D), dtype=table.dtype, buffer=nl.shared_hbm)
  nisa.dma_copy(dst=out, src=emb)
  return token, out


@nki.jit
def power_iteration(a, v0, tol=1e-4, max_iter=50):
  """a [n, n] fp32 symmetric (n <= 128), v0 [n, 1] -> (v [n, 1], lam [1, 1], iterations [1, 1] int32).
  Each step: w = a v, lam = |w|, v' = w / lam; stop when |v' - v|^2 <= tol^2 or after max_iter steps."""
  n = a.shape[0]
  a_sb = nl.ndarray((n, n), dtype=nl.float32, buffer=nl.sbuf)
  nisa.dma_copy(dst=a_sb, src=a)
  v = nl.ndarray((n, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.dma_copy(dst=v, src=v0)
  ones = nl.ndarray((n, n), dtype=nl.float32, buffer=nl.sbuf)
  nisa.memset(dst=ones, value=1.0)
  lam = nl.ndarray((n, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.memset(dst=lam, value=0.0)
  it = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.memset(dst=it, value=0.0)
  go = nisa.register_alloc(1 if max_iter > 0 else 0)

  def step(cond):
    w_ps = nl.ndarray((n, 1), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=w_ps, stationary=a_sb, moving=v)
    w = nl.ndarray((n, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=w, src=w_ps)
    w2 = nl.ndarray((n, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=w2, data1=w, data2=w, op=nl.multiply)
    s_ps = nl.ndarray((n, 1), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=s_ps, stationary=ones, moving=w2)  # |w|^2 on every partition
    nisa.activation(dst=lam, op=nl.sqrt, data=s_ps)
    rinv = nl.ndarray((n, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.reciprocal(dst=rinv, data=lam)
    vn = nl.ndarray((n, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=vn, data=w, op0=nl.multiply, operand0=rinv)
    dv = nl.ndarray((n, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=dv, data1=vn, data2=v, op=nl.subtract)
    dv2 = nl.ndarray((n, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=dv2, data1=dv, data2=dv, op=nl.multiply)
    r_ps = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=r_ps, stationary=ones[:, 0:1], moving=dv2)  # |v' - v|^2
    nisa.tensor_copy(dst=v, src=vn)
    nisa.tensor_scalar(dst=it, data=it, op0=nl.add, operand0=1.0)
    more = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=more, data=r_ps, op0=nl.greater, operand0=tol * tol)
    room = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=room, data=it, op0=nl.less, operand0=float(max_iter))
    flag = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=flag, data1=more, data2=room, op=nl.multiply)
    nisa.register_load(cond, flag)
    return cond

  nl.while_loop(go, step)

  v_out = nl.ndarray((n, 1), dtype=nl.float32, buffer=nl.shared_hbm)
  nisa.dma_copy(dst=v_out, src=v)
  lam_out = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.shared_hbm)
  nisa.dma_copy(dst=lam_out, src=lam[0:1, :])
  it_i = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
  nisa.tensor_copy(dst=it_i, src=it)
  it_out = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.shared_hbm)
  nisa.dma_copy(dst=it_out, src=it_i)
  return v_out, lam_out, it_out


@nki.jit
def accept_prefix(draft, target):
  """draft [1, K] int32 (the draft model's tokens), target [1, K + 1] int32 (the target model's greedy token at
  each position) -> (tokens [1, K + 1] int32, accepted [1, 1] int32)."""
  K = draft.shape[1]
  tokens = nl.ndarray((1, K + 1), dtype=nl.int32, buffer=nl.shared_hbm)
  fill = nl.ndarray((1, K + 1), dtype=nl.int32, buffer=nl.sbuf)
  nisa.memset(dst=fill, value=-1)
  nisa.dma_copy(dst=tokens, src=fill)

  pos = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)  # the loop position (registers have no arithmetic)
  nisa.memset(dst=pos, value=0)
  idx = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
  i = nisa.register_alloc(0)
  go = nisa.register_alloc(0)
  d_sb = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
  t_sb = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)

  def check():
    # i = min(pos, K - 1) (the read stays in range once every draft token is accepted)
    nisa.tensor_scalar(dst=idx, data=pos, op0=nl.minimum, operand0=K - 1)
    nisa.register_load(i, idx)
    nisa.dma_copy(dst=d_sb, src=draft.ap(pattern=[[K, 1], [1, 1]], scalar_offset=i, indirect_dim=1))
    nisa.dma_copy(dst=t_sb, src=target.ap(pattern=[[K + 1, 1], [1, 1]], scalar_offset=i, indirect_dim=1))
    eq = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=eq, data1=d_sb, data2=t_sb, op=nl.equal)
    room = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=room, data=pos, op0=nl.less, operand0=K)
    flag = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=flag, data1=eq, data2=room, op=nl.multiply)
    nisa.register_load(go, flag)

  def accept(cond):
    nisa.dma_copy(dst=tokens.ap(pattern=[[K + 1, 1], [1, 1]], scalar_offset=i, indirect_dim=1), src=d_sb)
    nisa.tensor_scalar(dst=pos, data=pos, op0=nl.add, operand0=1)
    check()
    return cond

  check()
  nl.while_loop(go, accept)

  # the target's own token at the first mismatch (position pos <= K)
  nisa.register_load(i, pos)
  nisa.dma_copy(dst=t_sb, src=target.ap(pattern=[[K + 1, 1], [1, 1]], scalar_offset=i, indirect_dim=1))
  nisa.dma_copy(dst=tokens.ap(pattern=[[K + 1, 1], [1, 1]], scalar_offset=i, indirect_dim=1), src=t_sb)
  accepted = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.shared_hbm)
  nisa.dma_copy(dst=accepted, src=pos)
  return tokens, accepted
