"""Trainium3 (NeuronCore-v4, gen4) features in real kernels, new NKI dialect (``import nki``, ISA calls writing
``dst=``), written the way nki-library-style kernels targeting trn3 are:

- ``softmax_rows_act(x)``: row softmax of x [R, V] (R a multiple of 128), the gen2/3 way: row max on VectorE
  (``tensor_reduce``), exp with the max subtracted and the row sum accumulated on ScalarE (``activation`` with
  ``bias=-max`` and ``reduce_res``), the normalisation on VectorE (``reciprocal`` + ``tensor_scalar``).
- ``softmax_rows_vexp(x)``: the same softmax with the exp moved to VectorE: ``nisa.exponential`` (gen4) takes the
  row max as ``max_value`` and keeps the running sum in the VectorE registers (``reset_reduce``); the
  normalisation goes to ScalarE (``activation(copy, scale=1/sum)``), so both engines share the work.
- ``flash_fwd_act(q, k, v)`` / ``flash_fwd_vexp(q, k, v)``: the flash-attention inner loop (online softmax over
  key blocks of 512, q scaled by d^-0.5 on load; q, k [d, S], v [S, d], bf16): gen2/3 style with the block exp and
  the rescale factor exp(m_old - m_new) on ScalarE (``activation`` with ``bias=-m_new``), PE transposes of the
  probabilities evicted by VectorE; gen4 style with both exps on VectorE (``nisa.exponential``, the running sum in
  its registers) and the evictions on ScalarE.
- ``topk_gumbel_sample(logits, seeds, k, temperature)``: top-k sampling over a vocabulary, one row per group of
  16 partitions: the row loaded contiguously (partition p of the group holds elements [p V/16, (p+1) V/16)),
  ``nisa.topk`` (the k largest, ascending, and their positions in its 16-partition snake order, mapped back to
  row ids with a bit-and, a shift and a multiply-add), uniform noise from ``nisa.rand2``
  after ``nisa.set_rng_seed``, Gumbel noise -log(-log(u)) (``activation(log)`` then ``activate2`` with a -1
  multiplier), ``z = val / T + g`` and the sampled token id = ids[argmax z] (``max8`` + ``nc_find_index8`` +
  ``nc_n_gather``). Returns the top-k values (bf16, ascending), ids (uint32), the uniform u and Gumbel g
  used, and the token per row.
- ``gumbel_from_uniform(u)``: the Gumbel transform alone, of a host-given uniform tile.
- ``uniform_noise(seeds, lo, hi, n)``: a [128, n] tile of ``rand2`` uniforms after ``set_rng_seed``.
- ``topk_max8(logits, k)``: the gen2/3 top-k of the same rows (k / 8 rounds of ``max8`` + ``nc_find_index8`` +
  ``nc_match_replace8``, one row per partition), values descending.
- ``rng_state_roundtrip(seeds)``: ``rand_get_state`` / ``rand_set_state`` on VectorE around ``rand2`` (the
  restored state replays the same numbers) and ``rng`` raw bits.
- ``matmul_gen3(a, b)`` / ``matmul_gen4(a, b, n_tile)``: C [M, N] = A [M, K] @ B [K, N] in bf16, A transposed on
  chip by TensorE (``nc_transpose``, transpose mode, bf16 PSUM). gen3: 512-column moving tiles accumulated in fp32
  PSUM (one bank each); gen4: ``n_tile`` (up to 8192) columns per ``nc_matmul`` accumulated in bf16 PSUM
  (``nc_matmul`` writing a bfloat16 PSUM tile), evicted with 16-bit copies.
- ``residual_add_dma(x, y, accumulate)``: out = x + y with y added by the DMA into the SBUF copy of x
  (``nisa.dma_compute``; v4: SBUF read-add-write at full copy rate), or y only copied in (the rate baseline).
- ``transpose_chain(x)``: many independent 128 x 128 TensorE transposes (the background-transpose lane case).

Written for nsim's tests in the style of those kernels; not copies of any file. No nsim imports.
"""
import nki
import nki.isa as nisa
import nki.language as nl

P_MAX = 128
SNAKE = 16      # nisa.topk's partitions per vector
NEG = -3.0e38


# --------------------------------------------------------------------------------------------------
# softmax: ScalarE exp vs VectorE exponential
# --------------------------------------------------------------------------------------------------

@nki.jit
def softmax_rows_act(x):
  R, V = x.shape
  assert R % P_MAX == 0
  out = nl.ndarray((R, V), dtype=x.dtype, buffer=nl.shared_hbm)
  for r in nl.affine_range(R // P_MAX):
    xt = nl.ndarray((P_MAX, V), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=xt, src=x[r * P_MAX:(r + 1) * P_MAX, :])
    mx = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=mx, op=nl.maximum, data=xt, axis=1)
    neg = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=neg, data=mx, op0=nl.multiply, operand0=-1.0)
    e = nl.ndarray((P_MAX, V), dtype=nl.float32, buffer=nl.sbuf)
    s = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=e, op=nl.exp, data=xt, bias=neg, reduce_op=nl.add, reduce_res=s,
                    reduce_cmd=nisa.reduce_cmd.reset_reduce)
    rs = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.reciprocal(dst=rs, data=s)
    y = nl.ndarray((P_MAX, V), dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=y, data=e, op0=nl.multiply, operand0=rs)
    nisa.dma_copy(dst=out[r * P_MAX:(r + 1) * P_MAX, :], src=y)
  return out


@nki.jit
def softmax_rows_vexp(x):
  R, V = x.shape
  assert R % P_MAX == 0
  out = nl.ndarray((R, V), dtype=x.dtype, buffer=nl.shared_hbm)
  for r in nl.affine_range(R // P_MAX):
    xt = nl.ndarray((P_MAX, V), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=xt, src=x[r * P_MAX:(r + 1) * P_MAX, :])
    mx = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=mx, op=nl.maximum, data=xt, axis=1)
    e = nl.ndarray((P_MAX, V), dtype=nl.float32, buffer=nl.sbuf)
    s = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.exponential(dst=e, src=xt, max_value=mx, reduce_res=s, reduce_cmd=nisa.reduce_cmd.reset_reduce)
    rs = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.reciprocal(dst=rs, data=s)
    y = nl.ndarray((P_MAX, V), dtype=x.dtype, buffer=nl.sbuf)
    nisa.activation(dst=y, op=nl.copy, data=e, scale=rs)
    nisa.dma_copy(dst=out[r * P_MAX:(r + 1) * P_MAX, :], src=y)
  return out


def _flash(q, k, v, vexp):
  """Flash attention forward, non-causal, one head: q, k [d, S] (transposed layout), v [S, d]; key blocks of 512."""
  d, S = q.shape
  KB = 512
  assert d <= P_MAX and S % KB == 0
  out = nl.ndarray((S, d), dtype=q.dtype, buffer=nl.shared_hbm)
  k_sb = nl.ndarray((d, S), dtype=nl.bfloat16, buffer=nl.sbuf)
  nisa.dma_copy(dst=k_sb, src=k)
  v_sb = nl.ndarray((P_MAX, S // P_MAX, d), dtype=nl.bfloat16, buffer=nl.sbuf)
  for j in nl.affine_range(S // P_MAX):
    nisa.dma_copy(dst=v_sb[:, j, :], src=v[j * P_MAX:(j + 1) * P_MAX, :])
  for qi in nl.affine_range(S // P_MAX):
    q_raw = nl.ndarray((d, P_MAX), dtype=nl.bfloat16, buffer=nl.sbuf)
    nisa.dma_copy(dst=q_raw, src=q[:, qi * P_MAX:(qi + 1) * P_MAX])
    q_sb = nl.ndarray((d, P_MAX), dtype=nl.bfloat16, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=q_sb, data=q_raw, op0=nl.multiply, operand0=float(d) ** -0.5)
    m_run = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=m_run, value=NEG)
    l_run = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=l_run, value=0.0)
    acc = nl.ndarray((P_MAX, d), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=acc, value=0.0)
    for kb in nl.sequential_range(S // KB):
      s_ps = nl.ndarray((P_MAX, KB), dtype=nl.float32, buffer=nl.psum)
      nisa.nc_matmul(dst=s_ps, stationary=q_sb, moving=k_sb[:, kb * KB:(kb + 1) * KB])
      m_blk = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
      nisa.tensor_reduce(dst=m_blk, op=nl.maximum, data=s_ps, axis=1)
      m_new = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
      nisa.tensor_tensor(dst=m_new, data1=m_run, data2=m_blk, op=nl.maximum)
      p = nl.ndarray((P_MAX, KB), dtype=nl.bfloat16, buffer=nl.sbuf)
      l_blk = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
      alpha = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
      if vexp:  # gen4: the exps on VectorE, ScalarE left for the evictions
        nisa.exponential(dst=p, src=s_ps, max_value=m_new, reduce_res=l_blk, reduce_cmd=nisa.reduce_cmd.reset_reduce)
        nisa.exponential(dst=alpha, src=m_run, max_value=m_new)
      else:
        neg = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=neg, data=m_new, op0=nl.multiply, operand0=-1.0)
        nisa.activation(dst=p, op=nl.exp, data=s_ps, bias=neg, reduce_op=nl.add, reduce_res=l_blk,
                        reduce_cmd=nisa.reduce_cmd.reset_reduce)
        nisa.activation(dst=alpha, op=nl.exp, data=m_run, bias=neg)
      nisa.scalar_tensor_tensor(dst=l_run, data=l_run, op0=nl.multiply, operand0=alpha, op1=nl.add, operand1=l_blk)
      nisa.tensor_copy(dst=m_run, src=m_new)
      pT = nl.ndarray((P_MAX, KB // P_MAX, P_MAX), dtype=nl.bfloat16, buffer=nl.sbuf)
      for j in nl.affine_range(KB // P_MAX):
        tp = nl.ndarray((P_MAX, P_MAX), dtype=nl.bfloat16, buffer=nl.psum)
        nisa.nc_transpose(dst=tp, data=p[:, j * P_MAX:(j + 1) * P_MAX], engine=nisa.engine.tensor)
        nisa.tensor_copy(dst=pT[:, j, :], src=tp, engine=nisa.engine.scalar if vexp else nisa.engine.vector)
      o_ps = nl.ndarray((P_MAX, d), dtype=nl.float32, buffer=nl.psum)
      for j in nl.affine_range(KB // P_MAX):
        nisa.nc_matmul(dst=o_ps, stationary=pT[:, j, :], moving=v_sb[:, kb * (KB // P_MAX) + j, :])
      nisa.scalar_tensor_tensor(dst=acc, data=acc, op0=nl.multiply, operand0=alpha, op1=nl.add, operand1=o_ps)
    rl = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.reciprocal(dst=rl, data=l_run)
    o_sb = nl.ndarray((P_MAX, d), dtype=q.dtype, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=o_sb, data=acc, op0=nl.multiply, operand0=rl)
    nisa.dma_copy(dst=out[qi * P_MAX:(qi + 1) * P_MAX, :], src=o_sb)
  return out


@nki.jit
def flash_fwd_act(q, k, v):
  return _flash(q, k, v, vexp=False)


@nki.jit
def flash_fwd_vexp(q, k, v):
  return _flash(q, k, v, vexp=True)


# --------------------------------------------------------------------------------------------------
# top-k sampling
# --------------------------------------------------------------------------------------------------

def _gumbel(u, P, F):
  """g = -log(-log(u)) for u [P, F] fp32 in SBUF: ScalarE log, then activate2 (gen4) log(-1 * v), negated."""
  lu = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
  nisa.activation(dst=lu, op=nl.log, data=u)
  llu = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
  nisa.activate2(dst=llu, op=nl.log, data=lu, imm0=-1.0, imm1=None, op0=nl.multiply, op1=None)
  g = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_scalar(dst=g, data=llu, op0=nl.multiply, operand0=-1.0)
  return g


@nki.jit
def gumbel_from_uniform(u):
  P, F = u.shape
  out = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.shared_hbm)
  ut = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
  nisa.dma_copy(dst=ut, src=u)
  nisa.dma_copy(dst=out, src=_gumbel(ut, P, F))
  return out


@nki.jit
def topk_gumbel_sample(logits, seeds, k=64, temperature=1.0):
  B, V = logits.shape
  assert V % SNAKE == 0 and 8 <= k <= V and SNAKE * B <= P_MAX
  C = V // SNAKE
  P = SNAKE * B
  values = nl.ndarray((B, k), dtype=nl.bfloat16, buffer=nl.shared_hbm)
  ids = nl.ndarray((B, k), dtype=nl.uint32, buffer=nl.shared_hbm)
  u_out = nl.ndarray((B, k), dtype=nl.float32, buffer=nl.shared_hbm)
  g_out = nl.ndarray((B, k), dtype=nl.float32, buffer=nl.shared_hbm)
  token = nl.ndarray((B, 1), dtype=nl.uint32, buffer=nl.shared_hbm)

  # each row on its group of 16 partitions, loaded contiguously (partition p holds elements [p C, (p + 1) C)):
  # topk reads the group as a snake (its element e at partition e % 16, column e // 16), a permutation of the
  # row that leaves the top values alone; the ids are mapped back below. (A DMA straight into the snake
  # order would move 2-byte elements one descriptor each.)
  x = nl.ndarray((P, C), dtype=nl.bfloat16, buffer=nl.sbuf)
  nisa.dma_copy(dst=x, src=logits.reshape((P, C)))

  tv = nl.ndarray((P, k), dtype=nl.bfloat16, buffer=nl.sbuf)
  te = nl.ndarray((P, k), dtype=nl.uint32, buffer=nl.sbuf)
  nisa.memset(dst=tv, value=0.0)  # topk writes partition 16 b only; keep the rest defined for the row ops below
  nisa.memset(dst=te, value=0)
  nisa.topk(tv, te, x, V)
  # snake element e is row element (e % 16) C + e // 16 (exact in the fp32 path: V < 2^24)
  lo = nl.ndarray((P, k), dtype=nl.uint32, buffer=nl.sbuf)
  nisa.tensor_scalar(dst=lo, data=te, op0=nl.bitwise_and, operand0=SNAKE - 1)
  hi = nl.ndarray((P, k), dtype=nl.uint32, buffer=nl.sbuf)
  nisa.tensor_scalar(dst=hi, data=te, op0=nl.right_shift, operand0=4)
  ti = nl.ndarray((P, k), dtype=nl.uint32, buffer=nl.sbuf)
  nisa.scalar_tensor_tensor(dst=ti, data=lo, op0=nl.multiply, operand0=float(C), op1=nl.add, operand1=hi)

  # Gumbel noise for every candidate: g = -log(-log(u)), u uniform in (0, 1)
  sd = nl.ndarray((1, 1), dtype=nl.uint32, buffer=nl.sbuf)
  nisa.dma_copy(dst=sd, src=seeds)
  nisa.set_rng_seed(sd)
  u = nl.ndarray((P, k), dtype=nl.float32, buffer=nl.sbuf)
  nisa.rand2(dst=u, min=1.0e-7, max=1.0)
  g = _gumbel(u, P, k)

  # z = val / T + g; the token is the id at argmax z
  z = nl.ndarray((P, k), dtype=nl.float32, buffer=nl.sbuf)
  nisa.scalar_tensor_tensor(dst=z, data=tv, op0=nl.multiply, operand0=1.0 / temperature, op1=nl.add, operand1=g)
  zmax = nl.ndarray((P, 8), dtype=nl.float32, buffer=nl.sbuf)
  nisa.max8(dst=zmax, src=z)
  pos = nl.ndarray((P, 8), dtype=nl.uint32, buffer=nl.sbuf)
  nisa.nc_find_index8(dst=pos, data=z, vals=zmax)
  tok = nl.ndarray((P, 8), dtype=nl.uint32, buffer=nl.sbuf)
  nisa.nc_n_gather(dst=tok, data=ti, indices=pos)

  for b in nl.affine_range(B):
    p0 = b * SNAKE
    nisa.dma_copy(dst=values[b:b + 1, :], src=tv[p0:p0 + 1, :])
    nisa.dma_copy(dst=ids[b:b + 1, :], src=ti[p0:p0 + 1, :])
    nisa.dma_copy(dst=u_out[b:b + 1, :], src=u[p0:p0 + 1, :])
    nisa.dma_copy(dst=g_out[b:b + 1, :], src=g[p0:p0 + 1, :])
    nisa.dma_copy(dst=token[b:b + 1, :], src=tok[p0:p0 + 1, 0:1])
  return values, ids, u_out, g_out, token


@nki.jit
def topk_max8(logits, k=64):
  B, V = logits.shape
  assert k % 8 == 0 and 8 <= V <= 16384 and B <= P_MAX
  values = nl.ndarray((B, k), dtype=nl.bfloat16, buffer=nl.shared_hbm)
  ids = nl.ndarray((B, k), dtype=nl.uint32, buffer=nl.shared_hbm)
  x = nl.ndarray((B, V), dtype=nl.bfloat16, buffer=nl.sbuf)
  nisa.dma_copy(dst=x, src=logits)
  tv = nl.ndarray((B, k), dtype=nl.bfloat16, buffer=nl.sbuf)
  ti = nl.ndarray((B, k), dtype=nl.uint32, buffer=nl.sbuf)
  for r in nl.static_range(k // 8):
    nisa.max8(dst=tv[:, r * 8:(r + 1) * 8], src=x)
    nisa.nc_find_index8(dst=ti[:, r * 8:(r + 1) * 8], data=x, vals=tv[:, r * 8:(r + 1) * 8])
    if r + 1 < k // 8:
      nisa.nc_match_replace8(dst=x, data=x, vals=tv[:, r * 8:(r + 1) * 8], imm=NEG)
  nisa.dma_copy(dst=values, src=tv)
  nisa.dma_copy(dst=ids, src=ti)
  return values, ids


@nki.jit
def uniform_noise(seeds, lo=0.0, hi=1.0, n=512):
  u = nl.ndarray((P_MAX, n), dtype=nl.float32, buffer=nl.shared_hbm)
  sd = nl.ndarray((1, 1), dtype=nl.uint32, buffer=nl.sbuf)
  nisa.dma_copy(dst=sd, src=seeds)
  nisa.set_rng_seed(sd)
  t = nl.ndarray((P_MAX, n), dtype=nl.float32, buffer=nl.sbuf)
  nisa.rand2(dst=t, min=lo, max=hi)
  nisa.dma_copy(dst=u, src=t)
  return u


@nki.jit
def rng_state_roundtrip(seeds):
  n = 256
  a_out = nl.ndarray((P_MAX, n), dtype=nl.float32, buffer=nl.shared_hbm)
  b_out = nl.ndarray((P_MAX, n), dtype=nl.float32, buffer=nl.shared_hbm)
  bits_out = nl.ndarray((P_MAX, n), dtype=nl.uint32, buffer=nl.shared_hbm)
  sd = nl.ndarray((1, 1), dtype=nl.uint32, buffer=nl.sbuf)
  nisa.dma_copy(dst=sd, src=seeds)
  nisa.set_rng_seed(sd)
  st = nl.ndarray((P_MAX, 24), dtype=nl.uint32, buffer=nl.sbuf)
  nisa.rand_get_state(dst=st, engine=nisa.engine.vector)
  a = nl.ndarray((P_MAX, n), dtype=nl.float32, buffer=nl.sbuf)
  nisa.rand2(dst=a, min=-2.0, max=2.0)
  nisa.rand_set_state(src_seeds=st, engine=nisa.engine.vector)
  b = nl.ndarray((P_MAX, n), dtype=nl.float32, buffer=nl.sbuf)
  nisa.rand2(dst=b, min=-2.0, max=2.0)
  bits = nl.ndarray((P_MAX, n), dtype=nl.uint32, buffer=nl.sbuf)
  nisa.rng(dst=bits, engine=nisa.engine.vector)
  nisa.dma_copy(dst=a_out, src=a)
  nisa.dma_copy(dst=b_out, src=b)
  nisa.dma_copy(dst=bits_out, src=bits)
  return a_out, b_out, bits_out


# --------------------------------------------------------------------------------------------------
# matmul: gen3 (512-column fp32 PSUM tiles) vs gen4 (up to 8192 columns in bf16 PSUM)
# --------------------------------------------------------------------------------------------------

def _load_a_transposed(a, m0, K):
  """A[m0:m0+128, :K] (bf16) as aT [128 (k), K/128, 128 (m)] in SBUF, each 128 x 128 block transposed on TensorE."""
  KT = K // P_MAX
  a_sb = nl.ndarray((P_MAX, K), dtype=nl.bfloat16, buffer=nl.sbuf)
  nisa.dma_copy(dst=a_sb, src=a[m0:m0 + P_MAX, :])
  aT = nl.ndarray((P_MAX, KT, P_MAX), dtype=nl.bfloat16, buffer=nl.sbuf)
  for kt in nl.affine_range(KT):
    tp = nl.ndarray((P_MAX, P_MAX), dtype=nl.bfloat16, buffer=nl.psum)
    nisa.nc_transpose(dst=tp, data=a_sb[:, kt * P_MAX:(kt + 1) * P_MAX], engine=nisa.engine.tensor)
    nisa.tensor_copy(dst=aT[:, kt, :], src=tp)
  return aT


@nki.jit
def matmul_gen3(a, b):
  M, K = a.shape
  K2, N = b.shape
  assert K == K2 and M % P_MAX == 0 and K % P_MAX == 0 and N % 512 == 0
  KT = K // P_MAX
  c = nl.ndarray((M, N), dtype=nl.bfloat16, buffer=nl.shared_hbm)
  b_sb = nl.ndarray((P_MAX, KT, N), dtype=nl.bfloat16, buffer=nl.sbuf)
  for kt in nl.affine_range(KT):
    nisa.dma_copy(dst=b_sb[:, kt, :], src=b[kt * P_MAX:(kt + 1) * P_MAX, :])
  for m in nl.affine_range(M // P_MAX):
    aT = _load_a_transposed(a, m * P_MAX, K)
    c_sb = nl.ndarray((P_MAX, N), dtype=nl.bfloat16, buffer=nl.sbuf)
    for n in nl.affine_range(N // 512):
      ps = nl.ndarray((P_MAX, 512), dtype=nl.float32, buffer=nl.psum)
      for kt in nl.affine_range(KT):
        nisa.nc_matmul(dst=ps, stationary=aT[:, kt, :], moving=b_sb[:, kt, n * 512:(n + 1) * 512])
      nisa.tensor_copy(dst=c_sb[:, n * 512:(n + 1) * 512], src=ps)
    nisa.dma_copy(dst=c[m * P_MAX:(m + 1) * P_MAX, :], src=c_sb)
  return c


@nki.jit
def matmul_gen4(a, b, n_tile=4096):
  M, K = a.shape
  K2, N = b.shape
  assert K == K2 and M % P_MAX == 0 and K % P_MAX == 0 and N % n_tile == 0 and n_tile <= 8192
  KT = K // P_MAX
  c = nl.ndarray((M, N), dtype=nl.bfloat16, buffer=nl.shared_hbm)
  b_sb = nl.ndarray((P_MAX, KT, N), dtype=nl.bfloat16, buffer=nl.sbuf)
  for kt in nl.affine_range(KT):
    nisa.dma_copy(dst=b_sb[:, kt, :], src=b[kt * P_MAX:(kt + 1) * P_MAX, :])
  for m in nl.affine_range(M // P_MAX):
    aT = _load_a_transposed(a, m * P_MAX, K)
    c_sb = nl.ndarray((P_MAX, N), dtype=nl.bfloat16, buffer=nl.sbuf)
    for n in nl.affine_range(N // n_tile):
      ps = nl.ndarray((P_MAX, n_tile), dtype=nl.bfloat16, buffer=nl.psum)
      for kt in nl.affine_range(KT):
        nisa.nc_matmul(dst=ps, stationary=aT[:, kt, :], moving=b_sb[:, kt, n * n_tile:(n + 1) * n_tile])
      nisa.tensor_copy(dst=c_sb[:, n * n_tile:(n + 1) * n_tile], src=ps)
    nisa.dma_copy(dst=c[m * P_MAX:(m + 1) * P_MAX, :], src=c_sb)
  return c


@nki.jit
def transpose_chain(x):
  R, F = x.shape
  assert R == P_MAX and F % P_MAX == 0
  T = F // P_MAX
  out = nl.ndarray((F, P_MAX), dtype=x.dtype, buffer=nl.shared_hbm)
  xs = nl.ndarray((P_MAX, F), dtype=x.dtype, buffer=nl.sbuf)
  nisa.dma_copy(dst=xs, src=x)
  ys = nl.ndarray((P_MAX, T, P_MAX), dtype=x.dtype, buffer=nl.sbuf)
  for t in nl.affine_range(T):
    tp = nl.ndarray((P_MAX, P_MAX), dtype=x.dtype, buffer=nl.psum)
    nisa.nc_transpose(dst=tp, data=xs[:, t * P_MAX:(t + 1) * P_MAX], engine=nisa.engine.tensor)
    nisa.tensor_copy(dst=ys[:, t, :], src=tp)
  for t in nl.affine_range(T):
    nisa.dma_copy(dst=out[t * P_MAX:(t + 1) * P_MAX, :], src=ys[:, t, :])
  return out


@nki.jit
def residual_add_dma(x, y, accumulate=True):
  """out = x + y for x, y [128 t, F] (fp32): x staged in SBUF, y added on the way in by the DMA
  (``dma_compute``, SBUF read-add-write on v4) or, with ``accumulate=False``, only copied in (the same bytes: the
  baseline of the DMA's rate)."""
  R, F = x.shape
  assert R % P_MAX == 0
  out = nl.ndarray((R, F), dtype=x.dtype, buffer=nl.shared_hbm)
  for r in nl.affine_range(R // P_MAX):
    xs = nl.ndarray((P_MAX, F), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=xs, src=x[r * P_MAX:(r + 1) * P_MAX, :])
    if accumulate:
      nisa.dma_compute(dst=xs, srcs=[xs, y[r * P_MAX:(r + 1) * P_MAX, :]], reduce_op=nl.add)
    else:
      ys = nl.ndarray((P_MAX, F), dtype=x.dtype, buffer=nl.sbuf)
      nisa.dma_copy(dst=ys, src=y[r * P_MAX:(r + 1) * P_MAX, :])
    nisa.dma_copy(dst=out[r * P_MAX:(r + 1) * P_MAX, :], src=xs)
  return out
