"""Vector search, product-quantisation distances and the SigLIP loss in the new NKI dialect (``import nki``, ISA
calls writing ``dst=``, ``.ap(...)`` access patterns, ``min()``-clamped ragged tiles), written the way public NKI
0.3+ ports of FAISS-style search and big_vision's SigLIP write them:

- ``knn_cosine_topk(queries, database, k, n_tile)``: exact cosine nearest neighbours. queries [Q, D], database
  [N, D] (D <= 128, N >= k). Database rows in chunks of 128 are L2-normalised on chip (``activation_reduce`` of the
  squares, ``tensor_scalar`` max(ss, 1e-24), ``activation`` rsqrt), PE-transposed and kept resident as [D, N];
  queries likewise per tile of up to 128 rows. Per database tile (width w = min(n_tile, N - n0)): scores by one
  matmul into PSUM, copied into an SBUF tile pre-filled with -3e38 (so a narrow last tile still has 8 elements for
  max8), its top k by k / 8 rounds of ``max8`` / ``nc_find_index8`` / ``nc_match_replace8``, the tile ids made
  global (+ n0), and the merge with the running best: the [P, 2k] candidates through the same rounds and
  ``nc_n_gather`` of the candidate ids at the winners' positions. Returns scores [Q, k] fp32, ids [Q, k] uint32.
- ``pq_adc(queries, codebooks, codes, gather)``: FAISS IndexPQ asymmetric distance computation. queries [Q, D]
  (Q <= 128), codebooks [M, 256, dsub] (D = M * dsub, dsub <= 128), codes [N, M] uint8. The lookup table of
  sub-space m, transposed, LUT_m^T[c, q] = ||c||^2 - 2 c.q_m + ||q_m||^2, is built by two accumulating matmuls per
  half of the 256 codes (-2 c.q_m, and ||q_m||^2 on every partition from a ones matmul of the squares) plus
  ||c||^2 per partition. dist[q, n] = sum_m LUT_m[q, codes[n, m]]:
  ``gather="onehot"``: per database tile of up to 512 rows, its codes loaded contiguously onto one partition
  ([1, w * M]), the codes of sub-space m (a stride-M view) broadcast to the 128 partitions by a K = 1 matmul with
  a ones row, compared with the code id of each partition (``iota``) into a one-hot [128 codes, w], and 2M
  matmuls LUT_m,h^T x onehot accumulated in one PSUM tile [Q, w];
  ``gather="dma"``: the LUTs staged in an HBM scratch [M * 256, Q] and, per tile of 128 database rows, M indirect
  DMAs (``.ap(vector_offset=m * 256 + code, indirect_dim=0)``) gathering each row's LUT row, summed on VectorE and
  PE-transposed to [Q, rows]. Returns dist [Q, N] fp32.
- ``siglip_loss(image_emb, text_emb, t_prime, bias)``: the SigLIP sigmoid loss of big_vision,
  -sum_ij log sigmoid(z_ij (t x_i.y_j + b)) / N with t = exp(t_prime), z = 2 I - 1, on L2-normalised
  embeddings [N, D] (N <= 512, any N; D <= 128). Per row tile the logits by one matmul, t and b applied by
  ``activation`` (scale / bias vectors), the labels z from ``affine_select`` (-1 off the diagonal j = r0 + p, +1 on
  it), and -log sigmoid(x) = softplus(-x) summed per row by ``activation_reduce``; the partitions summed by a
  ones matmul. Returns loss [1, 1] fp32.

Written for nsim's tests in the style of those kernels; not copies of any file. No nsim imports.
"""
import nki
import nki.isa as nisa
import nki.language as nl

P_MAX = 128
NEG = -3.0e38
NCODE = 256


def _rounds(vals, rows, n, k, out_v, out_i):
  """k / 8 rounds on vals[:rows, :n] (destroyed): out_v[:rows, :k] the k largest, descending; out_i their
  positions (uint32)."""
  for r in nl.static_range(k // 8):
    nisa.max8(dst=out_v[:rows, r * 8:(r + 1) * 8], src=vals[:rows, :n])
    nisa.nc_find_index8(dst=out_i[:rows, r * 8:(r + 1) * 8], data=vals[:rows, :n],
                        vals=out_v[:rows, r * 8:(r + 1) * 8])
    if r + 1 < k // 8:
      nisa.nc_match_replace8(dst=vals[:rows, :n], data=vals[:rows, :n], vals=out_v[:rows, r * 8:(r + 1) * 8],
                             imm=NEG)


def _normalise_T(src, r0, rows, D, dstT, c0):
  """rows [r0, r0 + rows) of src [*, D], L2-normalised, transposed into dstT[:D, c0:c0 + rows]."""
  x = nl.ndarray((P_MAX, D), dtype=src.dtype, buffer=nl.sbuf)
  nisa.dma_copy(dst=x[:rows, :], src=src[r0:r0 + rows, :])
  sq = nl.ndarray((P_MAX, D), dtype=nl.float32, buffer=nl.sbuf)
  ss = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.activation_reduce(dst=sq[:rows, :], op=nl.square, data=x[:rows, :], reduce_op=nl.add,
                         reduce_res=ss[:rows, :])
  nisa.tensor_scalar(dst=ss[:rows, :], data=ss[:rows, :], op0=nl.maximum, operand0=1e-24)
  rn = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.activation(dst=rn[:rows, :], op=nl.rsqrt, data=ss[:rows, :])
  xn = nl.ndarray((P_MAX, D), dtype=src.dtype, buffer=nl.sbuf)
  nisa.tensor_scalar(dst=xn[:rows, :], data=x[:rows, :], op0=nl.multiply, operand0=rn[:rows, :])
  t_ps = nl.ndarray((D, P_MAX), dtype=src.dtype, buffer=nl.psum)
  nisa.nc_transpose(dst=t_ps[:, :rows], data=xn[:rows, :])
  nisa.tensor_copy(dst=dstT[:, c0:c0 + rows], src=t_ps[:, :rows])


@nki.jit
def knn_cosine_topk(queries, database, k=8, n_tile=512):
  Q, D = queries.shape
  N, D_ = database.shape
  assert D == D_ and D <= P_MAX and k % 8 == 0 and k <= n_tile <= 512 and N >= k
  dt = queries.dtype
  NT = (N + n_tile - 1) // n_tile

  scores = nl.ndarray((Q, k), dtype=nl.float32, buffer=nl.shared_hbm)
  ids = nl.ndarray((Q, k), dtype=nl.uint32, buffer=nl.shared_hbm)

  dbT = nl.ndarray((D, N), dtype=dt, buffer=nl.sbuf)
  for c in nl.affine_range((N + P_MAX - 1) // P_MAX):
    c0 = c * P_MAX
    _normalise_T(database, c0, min(P_MAX, N - c0), D, dbT, c0)

  for qt in nl.affine_range((Q + P_MAX - 1) // P_MAX):
    q0 = qt * P_MAX
    rows = min(P_MAX, Q - q0)
    qT = nl.ndarray((D, P_MAX), dtype=dt, buffer=nl.sbuf)
    _normalise_T(queries, q0, rows, D, qT, 0)

    best_v = nl.ndarray((P_MAX, k), dtype=nl.float32, buffer=nl.sbuf)
    best_i = nl.ndarray((P_MAX, k), dtype=nl.uint32, buffer=nl.sbuf)
    nisa.memset(dst=best_v, value=NEG)
    nisa.memset(dst=best_i, value=0)
    for t in nl.sequential_range(NT):
      n0 = t * n_tile
      w = min(n_tile, N - n0)
      wk = max(w, k)
      sc_ps = nl.ndarray((P_MAX, n_tile), dtype=nl.float32, buffer=nl.psum)
      nisa.nc_matmul(dst=sc_ps[:rows, :w], stationary=qT[:, :rows], moving=dbT[:, n0:n0 + w])
      sc = nl.ndarray((P_MAX, n_tile), dtype=nl.float32, buffer=nl.sbuf)
      if wk > w:
        nisa.memset(dst=sc[:rows, :wk], value=NEG)
      nisa.tensor_copy(dst=sc[:rows, :w], src=sc_ps[:rows, :w])

      cv = nl.ndarray((P_MAX, 2 * k), dtype=nl.float32, buffer=nl.sbuf)
      ci = nl.ndarray((P_MAX, 2 * k), dtype=nl.uint32, buffer=nl.sbuf)
      ti = nl.ndarray((P_MAX, k), dtype=nl.uint32, buffer=nl.sbuf)
      _rounds(sc, rows, wk, k, cv[:, k:2 * k], ti)
      nisa.tensor_scalar(dst=ci[:rows, k:2 * k], data=ti[:rows, :], op0=nl.add, operand0=n0)
      nisa.tensor_copy(dst=cv[:rows, 0:k], src=best_v[:rows, :])
      nisa.tensor_copy(dst=ci[:rows, 0:k], src=best_i[:rows, :])
      pos = nl.ndarray((P_MAX, k), dtype=nl.uint32, buffer=nl.sbuf)
      _rounds(cv, rows, 2 * k, k, best_v, pos)
      nisa.nc_n_gather(dst=best_i[:rows, :], data=ci[:rows, :], indices=pos[:rows, :])

    nisa.dma_copy(dst=scores[q0:q0 + rows, :], src=best_v[:rows, :])
    nisa.dma_copy(dst=ids[q0:q0 + rows, :], src=best_i[:rows, :])
  return scores, ids


def _pq_luts(queries, codebooks):
  """LUT_m^T for every sub-space m and half h of the codes: a list luts[m][h] of [128 codes, Q] fp32 SBUF tiles."""
  Q, D = queries.shape
  M, NC, dsub = codebooks.shape
  dt = queries.dtype
  q = nl.ndarray((P_MAX, D), dtype=dt, buffer=nl.sbuf)
  nisa.dma_copy(dst=q[:Q, :], src=queries)
  ones = nl.ndarray((dsub, P_MAX), dtype=nl.float32, buffer=nl.sbuf)
  nisa.memset(dst=ones, value=1.0)
  luts = []
  for m in nl.static_range(M):
    # q_m^T [dsub, Q]: -2 q_m and its squares
    qT_ps = nl.ndarray((dsub, P_MAX), dtype=dt, buffer=nl.psum)
    nisa.nc_transpose(dst=qT_ps[:, :Q], data=q[:Q, m * dsub:(m + 1) * dsub])
    qm2 = nl.ndarray((dsub, P_MAX), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=qm2[:, :Q], data=qT_ps[:, :Q], op0=nl.multiply, operand0=-2.0)
    qsq = nl.ndarray((dsub, P_MAX), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=qsq[:, :Q], op=nl.square, data=qT_ps[:, :Q])
    halves = []
    for h in nl.static_range(NC // P_MAX):
      cb = nl.ndarray((P_MAX, dsub), dtype=nl.float32, buffer=nl.sbuf)
      nisa.dma_copy(dst=cb, src=codebooks[m, h * P_MAX:(h + 1) * P_MAX, :])
      csq = nl.ndarray((P_MAX, dsub), dtype=nl.float32, buffer=nl.sbuf)
      cn = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
      nisa.activation_reduce(dst=csq, op=nl.square, data=cb, reduce_op=nl.add, reduce_res=cn)
      cT_ps = nl.ndarray((dsub, P_MAX), dtype=nl.float32, buffer=nl.psum)
      nisa.nc_transpose(dst=cT_ps, data=cb)
      cT = nl.ndarray((dsub, P_MAX), dtype=nl.float32, buffer=nl.sbuf)
      nisa.tensor_copy(dst=cT, src=cT_ps)
      lut_ps = nl.ndarray((P_MAX, P_MAX), dtype=nl.float32, buffer=nl.psum)
      nisa.nc_matmul(dst=lut_ps[:, :Q], stationary=cT, moving=qm2[:, :Q])                 # -2 c.q_m
      nisa.nc_matmul(dst=lut_ps[:, :Q], stationary=ones, moving=qsq[:, :Q], accumulate=True)  # + ||q_m||^2
      lut = nl.ndarray((P_MAX, P_MAX), dtype=nl.float32, buffer=nl.sbuf)
      nisa.tensor_scalar(dst=lut[:, :Q], data=lut_ps[:, :Q], op0=nl.add, operand0=cn)        # + ||c||^2
      halves.append(lut)
    luts.append(halves)
  return luts


@nki.jit
def pq_adc(queries, codebooks, codes, gather="onehot"):
  Q, D = queries.shape
  M, NC, dsub = codebooks.shape
  N, M_ = codes.shape
  assert gather in ("onehot", "dma")
  assert M == M_ and NC == NCODE and D == M * dsub and dsub <= P_MAX and Q <= P_MAX
  dist = nl.ndarray((Q, N), dtype=nl.float32, buffer=nl.shared_hbm)
  luts = _pq_luts(queries, codebooks)
  H = NC // P_MAX

  if gather == "onehot":
    W = 512
    cid = []   # the code id of each partition, per half
    for h in nl.static_range(H):
      c = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
      nisa.iota(dst=c, pattern=[[0, 1]], offset=h * P_MAX, channel_multiplier=1)
      cid.append(c)
    ones_row = nl.ndarray((1, P_MAX), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=ones_row, value=1.0)
    for t in nl.affine_range((N + W - 1) // W):
      n0 = t * W
      w = min(W, N - n0)
      # the tile's codes, contiguous on one partition, as fp32
      cb = nl.ndarray((1, W * M), dtype=codes.dtype, buffer=nl.sbuf)
      nisa.dma_copy(dst=cb[:, :w * M], src=codes[n0:n0 + w, :].reshape((1, w * M)))
      cf = nl.ndarray((1, W * M), dtype=nl.float32, buffer=nl.sbuf)
      nisa.tensor_copy(dst=cf[:, :w * M], src=cb[:, :w * M])
      acc = nl.ndarray((P_MAX, W), dtype=nl.float32, buffer=nl.psum)
      for m in nl.static_range(M):
        # codes[n0:n0 + w, m] on every partition: a K = 1 matmul with a ones row
        bc = nl.ndarray((P_MAX, W), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=bc[:, :w], stationary=ones_row, moving=cf[:, m:w * M:M])
        for h in nl.static_range(H):
          oh = nl.ndarray((P_MAX, W), dtype=nl.float32, buffer=nl.sbuf)
          nisa.tensor_scalar(dst=oh[:, :w], data=bc[:, :w], op0=nl.equal, operand0=cid[h])
          nisa.nc_matmul(dst=acc[:Q, :w], stationary=luts[m][h][:, :Q], moving=oh[:, :w],
                         accumulate=(m > 0 or h > 0))
      res = nl.ndarray((P_MAX, W), dtype=nl.float32, buffer=nl.sbuf)
      nisa.tensor_copy(dst=res[:Q, :w], src=acc[:Q, :w])
      nisa.dma_copy(dst=dist[:, n0:n0 + w], src=res[:Q, :w])
  else:
    # the LUTs in HBM, row m * 256 + c = LUT_m[:, c]
    lut_hbm = nl.ndarray((M * NC, Q), dtype=nl.float32, buffer=nl.private_hbm)
    for m in nl.static_range(M):
      for h in nl.static_range(H):
        r0 = m * NC + h * P_MAX
        nisa.dma_copy(dst=lut_hbm[r0:r0 + P_MAX, :], src=luts[m][h][:, :Q])
    base = nl.ndarray((P_MAX, M), dtype=nl.int32, buffer=nl.sbuf)
    nisa.iota(dst=base, pattern=[[NC, M]], offset=0, channel_multiplier=0)   # m * 256
    for t in nl.affine_range((N + P_MAX - 1) // P_MAX):
      n0 = t * P_MAX
      rows = min(P_MAX, N - n0)
      cd = nl.ndarray((P_MAX, M), dtype=codes.dtype, buffer=nl.sbuf)
      nisa.dma_copy(dst=cd[:rows, :], src=codes[n0:n0 + rows, :])
      ci = nl.ndarray((P_MAX, M), dtype=nl.int32, buffer=nl.sbuf)
      nisa.tensor_copy(dst=ci[:rows, :], src=cd[:rows, :])
      nisa.tensor_tensor(dst=ci[:rows, :], data1=ci[:rows, :], data2=base[:rows, :], op=nl.add)
      acc = nl.ndarray((P_MAX, Q), dtype=nl.float32, buffer=nl.sbuf)
      for m in nl.static_range(M):
        g = nl.ndarray((P_MAX, Q), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=g[:rows, :], src=lut_hbm.ap(pattern=[[Q, rows], [1, Q]], offset=0,
                                                      vector_offset=ci[:rows, m:m + 1], indirect_dim=0))
        if m == 0:
          nisa.tensor_copy(dst=acc[:rows, :], src=g[:rows, :])
        else:
          nisa.tensor_tensor(dst=acc[:rows, :], data1=acc[:rows, :], data2=g[:rows, :], op=nl.add)
      accT_ps = nl.ndarray((P_MAX, P_MAX), dtype=nl.float32, buffer=nl.psum)
      nisa.nc_transpose(dst=accT_ps[:Q, :rows], data=acc[:rows, :])
      accT = nl.ndarray((P_MAX, P_MAX), dtype=nl.float32, buffer=nl.sbuf)
      nisa.tensor_copy(dst=accT[:Q, :rows], src=accT_ps[:Q, :rows])
      nisa.dma_copy(dst=dist[:, n0:n0 + rows], src=accT[:Q, :rows])
  return dist


@nki.jit
def siglip_loss(image_emb, text_emb, t_prime, bias):
  N, D = image_emb.shape
  assert tuple(text_emb.shape) == (N, D) and D <= P_MAX and N <= 512
  dt = image_emb.dtype
  loss = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.shared_hbm)

  # t = exp(t_prime) and b on every partition
  t = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.dma_copy(dst=t, src=t_prime.ap(pattern=[[0, P_MAX], [1, 1]], offset=0))
  nisa.activation(dst=t, op=nl.exp, data=t)
  b = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.dma_copy(dst=b, src=bias.ap(pattern=[[0, P_MAX], [1, 1]], offset=0))

  imgT = nl.ndarray((D, N), dtype=dt, buffer=nl.sbuf)
  txtT = nl.ndarray((D, N), dtype=dt, buffer=nl.sbuf)
  NT = (N + P_MAX - 1) // P_MAX
  for r in nl.affine_range(NT):
    r0 = r * P_MAX
    rows = min(P_MAX, N - r0)
    _normalise_T(image_emb, r0, rows, D, imgT, r0)
    _normalise_T(text_emb, r0, rows, D, txtT, r0)

  minus1 = nl.ndarray((P_MAX, N), dtype=nl.float32, buffer=nl.sbuf)
  nisa.memset(dst=minus1, value=-1.0)
  acc = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.memset(dst=acc, value=0.0)
  for r in nl.sequential_range(NT):
    r0 = r * P_MAX
    rows = min(P_MAX, N - r0)
    s_ps = nl.ndarray((P_MAX, N), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=s_ps[:rows, :], stationary=imgT[:, r0:r0 + rows], moving=txtT)
    lg = nl.ndarray((P_MAX, N), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=lg[:rows, :], op=nl.copy, data=s_ps[:rows, :], scale=t[:rows, :], bias=b[:rows, :])
    # labels: -1 where j != r0 + p, +1 on the diagonal
    z = nl.ndarray((P_MAX, N), dtype=nl.float32, buffer=nl.sbuf)
    nisa.affine_select(dst=z[:rows, :], pattern=[[1, N]], channel_multiplier=-1, on_true_tile=minus1[:rows, :],
                       on_false_value=1.0, cmp_op=nl.not_equal, offset=-r0)
    x = nl.ndarray((P_MAX, N), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=x[:rows, :], data1=lg[:rows, :], data2=z[:rows, :], op=nl.multiply)
    # -log sigmoid(x) = softplus(-x), summed along the row
    sp = nl.ndarray((P_MAX, N), dtype=nl.float32, buffer=nl.sbuf)
    rs = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation_reduce(dst=sp[:rows, :], op=nl.softplus, data=x[:rows, :], reduce_op=nl.add,
                           reduce_res=rs[:rows, :], scale=-1.0)
    nisa.tensor_tensor(dst=acc[:rows, :], data1=acc[:rows, :], data2=rs[:rows, :], op=nl.add)

  ones = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.memset(dst=ones, value=1.0)
  tot_ps = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.psum)
  nisa.nc_matmul(dst=tot_ps, stationary=acc, moving=ones)
  tot = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_scalar(dst=tot, data=tot_ps, op0=nl.multiply, operand0=1.0 / N)
  nisa.dma_copy(dst=loss, src=tot)
  return loss
