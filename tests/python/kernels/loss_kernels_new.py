"""Similarity heads and per-element / metric losses in the new NKI dialect (``import nki``, ISA calls writing
``dst=``, ``nl.ndarray(..., buffer=nl.shared_hbm)`` outputs), written the way public NKI 0.3+ kernels are:

- ``clip_contrastive_loss(image_emb, text_emb, logit_scale)``: the CLIP / InfoNCE loss. Both [N, D] embeddings are
  L2-normalised per row (``F.normalize``: x / max(||x||, 1e-12); the sum of squares by ScalarE
  ``activation_reduce``), the image rows also multiplied by scale = min(exp(logit_scale), 100) (logit_scale an fp32
  [1] parameter broadcast onto the partitions by a stride-0 ``.ap`` DMA). The normalised tiles are transposed on
  the PE (``nisa.nc_transpose`` of each [128, 128] block into PSUM, copied into [D-chunk, N] SBUF tiles), and
  logits = scale * I T^T comes out of ``nc_matmul`` one 128-row tile at a time, the D chunks accumulating in one
  [128, N] fp32 PSUM tile (N <= 512: one bank). The loss is symmetric: the cross-entropy of each image over the
  texts (rows of I T^T) and of each text over the images (rows of T I^T, the same matmuls with the operands
  swapped), the target being the diagonal, whose logits scale * <i_n, t_n> come from the normalised rows directly.
  Each row's log-sum-exp is read straight from PSUM (max by ``tensor_reduce``, exp and sum by one ScalarE
  ``activation`` with ``reduce_res``). With ``columns="transpose"`` the text rows are not recomputed: the image
  rows' fp32 logits, kept in SBUF, are transposed back block by block (``nl.transpose`` of each [128, 128] block
  on the PE, as CLIP's ``logits_per_text = logits_per_image.t()``). Returns (loss fp32 [1, 1], logits_per_image
  fp32 [N, N]).
- ``sigmoid_focal_loss(logits, targets, alpha, gamma)``: ``torchvision.ops.sigmoid_focal_loss`` (RetinaNet): p =
  sigmoid(x), ce = softplus(x) - x t (BCE with logits), 1 - p_t = p (1 - 2t) + t, loss = alpha_t (1 - p_t)^gamma ce
  with alpha_t = alpha t + (1 - alpha)(1 - t) (no weighting when alpha < 0); gamma == 2 as a square, else the
  ``power`` ALU op. Rows over the 128 partitions (ragged last tile), classes on the free axis. Returns (loss fp32
  [N, C], mean fp32 [1, 1]).
- ``cosine_embedding_loss(x1, x2, y, margin)``: ``nn.CosineEmbeddingLoss``: cos = <x1, x2> / sqrt((|x1|^2 + 1e-12)
  (|x2|^2 + 1e-12)), loss = 1 - cos where y == 1, max(0, cos - margin) where y == -1. Returns (loss fp32 [N], mean
  fp32 [1, 1]).
- ``triplet_margin_loss(anchor, positive, negative, margin)``: ``nn.TripletMarginLoss(p=2)``: d(a, b) = ||a - b +
  1e-6||_2 (the eps as the bias of the ScalarE square), loss = max(d(a, p) - d(a, n) + margin, 0). Returns (loss fp32
  [N], mean fp32 [1, 1]).
- ``vocab_parallel_cross_entropy(logits, targets)``: cross-entropy with the vocabulary split over the programs, as
  Megatron's vocab-parallel cross-entropy splits it over tensor-parallel ranks; launched ``[2]`` (LNC=2) each core
  takes half of the vocabulary. Pass 1 per row tile: the core's running max / sum of exp over its vocabulary tiles
  and the target's logit where the target falls in its half (``nisa.iota`` column ids == target - offset), kept in
  SBUF and written to a shared HBM scratch [2, N, 3]; ``nisa.core_barrier`` on it; then each core reads the other
  core's partials and combines them: M = max(m0, m1), S = s0 exp(m0 - M) + s1 exp(m1 - M), loss = M + log S -
  (x0 + x1). Core c stores the losses of the row tiles r with r % 2 == c and the gradient softmax - onehot of its
  half of the vocabulary for every row. ``combine="sendrecv"`` exchanges the SBUF partials of all row tiles by one
  ``nisa.sendrecv`` instead (as nki-library's LNC=2 decode RMSNorm exchanges its sums): no HBM scratch. Launched
  without a grid, one program does it all (no exchange). Returns (loss fp32 [N], dlogits [N, V] in logits.dtype).

Written for nsim's tests in the style of public kernels; not copies of any file. No nsim imports.
"""
import nki
import nki.isa as nisa
import nki.language as nl

P_MAX = 128
V_TILE = 512
NEG_BIG = -3.0e38


def kernel_assert(condition, message):
  if not condition:
    raise AssertionError("[loss_kernels] " + message)


def partition_sum_to_hbm(acc, out, factor):
  """out [1, 1] = factor * sum over the partitions of acc [P_MAX, 1] fp32 (a ones-vector matmul)."""
  ones = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.memset(dst=ones, value=1.0)
  tot_ps = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.psum)
  nisa.nc_matmul(dst=tot_ps, stationary=acc, moving=ones)
  tot = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_scalar(dst=tot, data=tot_ps, op0=nl.multiply, operand0=factor)
  nisa.dma_copy(dst=out, src=tot)


# --------------------------------------------------------------------------------------------------
# CLIP / InfoNCE
# --------------------------------------------------------------------------------------------------

def row_lse(dst, lg, rows, ncols):
  """dst [rows, 1] = log-sum-exp of each row of lg [rows, ncols] (fp32, SBUF or PSUM)."""
  mx = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_reduce(dst=mx[:rows], op=nl.maximum, data=lg[:rows, :ncols], axis=1)
  neg = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_scalar(dst=neg[:rows], data=mx[:rows], op0=nl.multiply, operand0=-1.0)
  e = nl.ndarray((P_MAX, ncols), dtype=nl.float32, buffer=nl.sbuf)
  se = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.activation(dst=e[:rows], op=nl.exp, data=lg[:rows, :ncols], bias=neg[:rows], reduce_op=nl.add,
                  reduce_res=se[:rows], reduce_cmd=nisa.reduce_cmd.reset_reduce)
  nisa.activation(dst=dst, op=nl.log, data=se[:rows])
  nisa.tensor_tensor(dst=dst, data1=dst, data2=mx[:rows], op=nl.add)


@nki.jit
def clip_contrastive_loss(image_emb, text_emb, logit_scale, columns="matmul"):
  """image_emb, text_emb [N, D] (fp32 / bf16; N a multiple of 128 up to 512, D a multiple of 128); logit_scale fp32
  [1] (log of the inverse temperature). columns: "matmul" (the text rows by T I^T) or "transpose" (the image
  rows' logits transposed back block by block). Returns (loss [1, 1], logits_per_image [N, N]) in fp32."""
  N, D = image_emb.shape
  kernel_assert(columns in ("matmul", "transpose"), "columns must be 'matmul' or 'transpose'")
  kernel_assert(tuple(text_emb.shape) == (N, D), "image and text embeddings differ in shape")
  kernel_assert(N % P_MAX == 0 and N <= 512, "N={} must be a multiple of 128 up to 512".format(N))
  kernel_assert(D % P_MAX == 0, "D={} must be a multiple of 128".format(D))
  NT = N // P_MAX
  KT = D // P_MAX
  dt = image_emb.dtype

  loss_out = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.shared_hbm)
  logits_out = nl.ndarray((N, N), dtype=nl.float32, buffer=nl.shared_hbm)

  # scale = min(exp(logit_scale), 100) on every partition
  ls = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.dma_copy(dst=ls, src=logit_scale.ap(pattern=[[0, P_MAX], [1, 1]], offset=0))
  scale = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.activation(dst=scale, op=nl.exp, data=ls)
  nisa.tensor_scalar(dst=scale, data=scale, op0=nl.minimum, operand0=100.0)

  # normalised rows (images times the scale), transposed into [128 of D, N] tiles
  imgT = [nl.ndarray((P_MAX, N), dtype=dt, buffer=nl.sbuf) for _ in range(KT)]
  txtT = [nl.ndarray((P_MAX, N), dtype=dt, buffer=nl.sbuf) for _ in range(KT)]
  diag = nl.ndarray((P_MAX, NT), dtype=nl.float32, buffer=nl.sbuf)   # scale <i_n, t_n>, row tile r in column r
  for r in nl.affine_range(NT):
    normed = []
    for src, dstT, scaled in ((image_emb, imgT, True), (text_emb, txtT, False)):
      x = nl.ndarray((P_MAX, D), dtype=dt, buffer=nl.sbuf)
      nisa.dma_copy(dst=x, src=src[nl.ds(r * P_MAX, P_MAX), :])
      sq = nl.ndarray((P_MAX, D), dtype=nl.float32, buffer=nl.sbuf)
      ss = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
      nisa.activation_reduce(dst=sq, op=nl.square, data=x, reduce_op=nl.add, reduce_res=ss)
      rn = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
      nisa.activation(dst=rn, op=nl.sqrt, data=ss)
      nisa.tensor_scalar(dst=rn, data=rn, op0=nl.maximum, operand0=1e-12)
      nisa.reciprocal(dst=rn, data=rn)
      if scaled:
        nisa.tensor_tensor(dst=rn, data1=rn, data2=scale, op=nl.multiply)
      xn = nl.ndarray((P_MAX, D), dtype=dt, buffer=nl.sbuf)
      nisa.tensor_scalar(dst=xn, data=x, op0=nl.multiply, operand0=rn)
      normed.append(xn)
      for k in nl.affine_range(KT):
        t_ps = nl.ndarray((P_MAX, P_MAX), dtype=dt, buffer=nl.psum)
        nisa.nc_transpose(dst=t_ps, data=xn[:, nl.ds(k * P_MAX, P_MAX)])
        nisa.tensor_copy(dst=dstT[k][:, nl.ds(r * P_MAX, P_MAX)], src=t_ps)
    prod = nl.ndarray((P_MAX, D), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=prod, data1=normed[0], data2=normed[1], op=nl.multiply)
    nisa.tensor_reduce(dst=diag[:, nl.ds(r, 1)], op=nl.add, data=prod, axis=1)

  # per partition: sum over the row tiles of (lse - diagonal logit), both directions
  acc = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.memset(dst=acc, value=0.0)
  lg_rows = [nl.ndarray((P_MAX, N), dtype=nl.float32, buffer=nl.sbuf) for _ in range(NT)]
  for direction in range(2 if columns == "matmul" else 1):
    statT, movT = (imgT, txtT) if direction == 0 else (txtT, imgT)
    for r in nl.sequential_range(NT):
      lg = nl.ndarray((P_MAX, N), dtype=nl.float32, buffer=nl.psum)
      for k in nl.affine_range(KT):
        nisa.nc_matmul(dst=lg, stationary=statT[k][:, nl.ds(r * P_MAX, P_MAX)], moving=movT[k])
      if direction == 0:
        nisa.tensor_copy(dst=lg_rows[r], src=lg)
        nisa.dma_copy(dst=logits_out[nl.ds(r * P_MAX, P_MAX), :], src=lg_rows[r])
      lse = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
      row_lse(lse, lg, P_MAX, N)
      nisa.scalar_tensor_tensor(dst=acc, data=lse, op0=nl.subtract, operand0=diag[:, nl.ds(r, 1)], op1=nl.add,
                                operand1=acc)
  if columns == "transpose":
    # logits_per_text = logits_per_image^T, block by block: nl.transpose of each fp32 [128, 128] block
    for c in nl.sequential_range(NT):
      colT = nl.ndarray((P_MAX, N), dtype=nl.float32, buffer=nl.sbuf)
      for r in nl.affine_range(NT):
        blk = nl.transpose(lg_rows[r][:, nl.ds(c * P_MAX, P_MAX)])
        nisa.tensor_copy(dst=colT[:, nl.ds(r * P_MAX, P_MAX)], src=blk)
      lse = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
      row_lse(lse, colT, P_MAX, N)
      nisa.scalar_tensor_tensor(dst=acc, data=lse, op0=nl.subtract, operand0=diag[:, nl.ds(c, 1)], op1=nl.add,
                                operand1=acc)
  partition_sum_to_hbm(acc, loss_out, 0.5 / N)
  return loss_out, logits_out


# --------------------------------------------------------------------------------------------------
# Focal loss (binary, per element)
# --------------------------------------------------------------------------------------------------

@nki.jit
def sigmoid_focal_loss(logits, targets, alpha=0.25, gamma=2.0):
  """logits, targets [N, C] (targets 0 / 1 in any float dtype). Returns (loss fp32 [N, C], mean fp32 [1, 1])."""
  N, C = logits.shape
  kernel_assert(tuple(targets.shape) == (N, C), "logits and targets differ in shape")
  loss = nl.ndarray((N, C), dtype=nl.float32, buffer=nl.shared_hbm)
  mean_out = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.shared_hbm)
  acc = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.memset(dst=acc, value=0.0)

  for r in nl.sequential_range((N + P_MAX - 1) // P_MAX):
    r0 = r * P_MAX
    rows = min(P_MAX, N - r0)
    x = nl.ndarray((P_MAX, C), dtype=logits.dtype, buffer=nl.sbuf)
    t = nl.ndarray((P_MAX, C), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=x[:rows], src=logits[r0:r0 + rows, :])
    nisa.dma_copy(dst=t[:rows], src=targets[r0:r0 + rows, :])
    p = nl.ndarray((P_MAX, C), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=p[:rows], op=nl.sigmoid, data=x[:rows])
    # ce = softplus(x) - x t
    ce = nl.ndarray((P_MAX, C), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=ce[:rows], op=nl.softplus, data=x[:rows])
    xt = nl.ndarray((P_MAX, C), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=xt[:rows], data1=x[:rows], data2=t[:rows], op=nl.multiply)
    nisa.tensor_tensor(dst=ce[:rows], data1=ce[:rows], data2=xt[:rows], op=nl.subtract)
    # 1 - p_t = p (1 - 2t) + t
    q = nl.ndarray((P_MAX, C), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=q[:rows], data=t[:rows], op0=nl.multiply, operand0=-2.0, op1=nl.add, operand1=1.0)
    nisa.tensor_tensor(dst=q[:rows], data1=q[:rows], data2=p[:rows], op=nl.multiply)
    nisa.tensor_tensor(dst=q[:rows], data1=q[:rows], data2=t[:rows], op=nl.add)
    mod = nl.ndarray((P_MAX, C), dtype=nl.float32, buffer=nl.sbuf)
    if gamma == 2.0:
      nisa.activation(dst=mod[:rows], op=nl.square, data=q[:rows])
    else:
      nisa.tensor_scalar(dst=mod[:rows], data=q[:rows], op0=nl.power, operand0=float(gamma))
    lt = nl.ndarray((P_MAX, C), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=lt[:rows], data1=ce[:rows], data2=mod[:rows], op=nl.multiply)
    if alpha >= 0:
      # alpha_t = (2 alpha - 1) t + (1 - alpha)
      at = nl.ndarray((P_MAX, C), dtype=nl.float32, buffer=nl.sbuf)
      nisa.tensor_scalar(dst=at[:rows], data=t[:rows], op0=nl.multiply, operand0=2.0 * alpha - 1.0, op1=nl.add,
                         operand1=1.0 - alpha)
      nisa.tensor_tensor(dst=lt[:rows], data1=lt[:rows], data2=at[:rows], op=nl.multiply)
    nisa.dma_copy(dst=loss[r0:r0 + rows, :], src=lt[:rows])
    part = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=part[:rows], op=nl.add, data=lt[:rows], axis=1)
    nisa.tensor_tensor(dst=acc[:rows], data1=acc[:rows], data2=part[:rows], op=nl.add)

  partition_sum_to_hbm(acc, mean_out, 1.0 / (N * C))
  return loss, mean_out


# --------------------------------------------------------------------------------------------------
# Cosine-embedding and triplet-margin losses
# --------------------------------------------------------------------------------------------------

@nki.jit
def cosine_embedding_loss(x1, x2, y, margin=0.0):
  """x1, x2 [N, D]; y fp32 [N] of +1 / -1. Returns (loss fp32 [N], mean fp32 [1, 1])."""
  N, D = x1.shape
  loss = nl.ndarray((N,), dtype=nl.float32, buffer=nl.shared_hbm)
  mean_out = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.shared_hbm)
  acc = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.memset(dst=acc, value=0.0)
  for r in nl.sequential_range((N + P_MAX - 1) // P_MAX):
    r0 = r * P_MAX
    rows = min(P_MAX, N - r0)
    a = nl.ndarray((P_MAX, D), dtype=x1.dtype, buffer=nl.sbuf)
    b = nl.ndarray((P_MAX, D), dtype=x2.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=a[:rows], src=x1[r0:r0 + rows, :])
    nisa.dma_copy(dst=b[:rows], src=x2[r0:r0 + rows, :])
    yt = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=yt[:rows], src=y[r0:r0 + rows].reshape((rows, 1)))

    junk = nl.ndarray((P_MAX, D), dtype=nl.float32, buffer=nl.sbuf)
    st = nl.ndarray((P_MAX, 3), dtype=nl.float32, buffer=nl.sbuf)   # |a|^2, |b|^2, <a, b>
    nisa.activation_reduce(dst=junk[:rows], op=nl.square, data=a[:rows], reduce_op=nl.add,
                           reduce_res=st[:rows, 0:1])
    nisa.activation_reduce(dst=junk[:rows], op=nl.square, data=b[:rows], reduce_op=nl.add,
                           reduce_res=st[:rows, 1:2])
    nisa.tensor_tensor(dst=junk[:rows], data1=a[:rows], data2=b[:rows], op=nl.multiply)
    nisa.tensor_reduce(dst=st[:rows, 2:3], op=nl.add, data=junk[:rows], axis=1)

    # cos = <a, b> / sqrt((|a|^2 + eps)(|b|^2 + eps))
    den = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=den[:rows], data=st[:rows, 0:1], op0=nl.add, operand0=1e-12)
    nisa.scalar_tensor_tensor(dst=den[:rows], data=st[:rows, 1:2], op0=nl.add, operand0=1e-12, op1=nl.multiply,
                              operand1=den[:rows])
    nisa.activation(dst=den[:rows], op=nl.rsqrt, data=den[:rows])
    cos = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=cos[:rows], data1=st[:rows, 2:3], data2=den[:rows], op=nl.multiply)

    # (y == 1) (1 - cos) + (y == -1) max(cos - margin, 0)
    pos = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=pos[:rows], data=cos[:rows], op0=nl.multiply, operand0=-1.0, op1=nl.add, operand1=1.0)
    is_pos = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=is_pos[:rows], data=yt[:rows], op0=nl.equal, operand0=1.0)
    nisa.tensor_tensor(dst=pos[:rows], data1=pos[:rows], data2=is_pos[:rows], op=nl.multiply)
    neg = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=neg[:rows], data=cos[:rows], op0=nl.subtract, operand0=margin, op1=nl.maximum,
                       operand1=0.0)
    is_neg = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=is_neg[:rows], data=yt[:rows], op0=nl.equal, operand0=-1.0)
    lt = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.scalar_tensor_tensor(dst=lt[:rows], data=neg[:rows], op0=nl.multiply, operand0=is_neg[:rows], op1=nl.add,
                              operand1=pos[:rows])
    nisa.dma_copy(dst=loss[r0:r0 + rows].reshape((rows, 1)), src=lt[:rows])
    nisa.tensor_tensor(dst=acc[:rows], data1=acc[:rows], data2=lt[:rows], op=nl.add)

  partition_sum_to_hbm(acc, mean_out, 1.0 / N)
  return loss, mean_out


@nki.jit
def triplet_margin_loss(anchor, positive, negative, margin=1.0):
  """anchor, positive, negative [N, D]. Returns (loss fp32 [N], mean fp32 [1, 1])."""
  N, D = anchor.shape
  loss = nl.ndarray((N,), dtype=nl.float32, buffer=nl.shared_hbm)
  mean_out = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.shared_hbm)
  acc = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.memset(dst=acc, value=0.0)
  for r in nl.sequential_range((N + P_MAX - 1) // P_MAX):
    r0 = r * P_MAX
    rows = min(P_MAX, N - r0)
    a = nl.ndarray((P_MAX, D), dtype=anchor.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=a[:rows], src=anchor[r0:r0 + rows, :])
    d = nl.ndarray((P_MAX, 2), dtype=nl.float32, buffer=nl.sbuf)     # d(a, p), d(a, n)
    for k, other in enumerate((positive, negative)):
      o = nl.ndarray((P_MAX, D), dtype=other.dtype, buffer=nl.sbuf)
      nisa.dma_copy(dst=o[:rows], src=other[r0:r0 + rows, :])
      diff = nl.ndarray((P_MAX, D), dtype=nl.float32, buffer=nl.sbuf)
      nisa.tensor_tensor(dst=diff[:rows], data1=a[:rows], data2=o[:rows], op=nl.subtract)
      sq = nl.ndarray((P_MAX, D), dtype=nl.float32, buffer=nl.sbuf)
      # ||a - o + eps||^2: the eps as the square's bias
      nisa.activation_reduce(dst=sq[:rows], op=nl.square, data=diff[:rows], bias=1e-6, reduce_op=nl.add,
                             reduce_res=d[:rows, k:k + 1])
    nisa.activation(dst=d[:rows], op=nl.sqrt, data=d[:rows])
    lt = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=lt[:rows], data1=d[:rows, 0:1], data2=d[:rows, 1:2], op=nl.subtract)
    nisa.tensor_scalar(dst=lt[:rows], data=lt[:rows], op0=nl.add, operand0=margin, op1=nl.maximum, operand1=0.0)
    nisa.dma_copy(dst=loss[r0:r0 + rows].reshape((rows, 1)), src=lt[:rows])
    nisa.tensor_tensor(dst=acc[:rows], data1=acc[:rows], data2=lt[:rows], op=nl.add)

  partition_sum_to_hbm(acc, mean_out, 1.0 / N)
  return loss, mean_out


# --------------------------------------------------------------------------------------------------
# Vocabulary-parallel cross-entropy (LNC=2)
# --------------------------------------------------------------------------------------------------

@nki.jit
def vocab_parallel_cross_entropy(logits, targets, combine="barrier"):
  """logits [N, V] (fp32 / bf16), targets int32 [N] in [0, V). combine (two programs): "barrier" (partials through a
  shared HBM scratch and nisa.core_barrier) or "sendrecv" (the SBUF partials exchanged by one nisa.sendrecv).
  Returns (loss fp32 [N], dlogits [N, V])."""
  N, V = logits.shape
  n_prgs = nl.num_programs(axes=0) if nl.program_ndim() != 0 else 1
  prg = nl.program_id(axis=0) if nl.program_ndim() != 0 else 0
  kernel_assert(n_prgs in (1, 2), "one or two programs (LNC=2)")
  kernel_assert(V % n_prgs == 0, "V={} must split over {} programs".format(V, n_prgs))
  kernel_assert(V < 2 ** 24, "column ids compared in fp32")
  kernel_assert(combine in ("barrier", "sendrecv"), "combine must be 'barrier' or 'sendrecv'")
  use_scratch = n_prgs > 1 and combine == "barrier"
  Vh = V // n_prgs
  v0 = prg * Vh
  NT = (N + P_MAX - 1) // P_MAX
  NV = (Vh + V_TILE - 1) // V_TILE
  dt = logits.dtype

  loss = nl.ndarray((N,), dtype=nl.float32, buffer=nl.shared_hbm)
  dlogits = nl.ndarray((N, V), dtype=dt, buffer=nl.shared_hbm)
  if use_scratch:
    scratch = nl.ndarray((n_prgs, N, 3), dtype=nl.float32, buffer=nl.shared_hbm)

  cols = nl.ndarray((P_MAX, V_TILE), dtype=nl.float32, buffer=nl.sbuf)
  nisa.iota(dst=cols, pattern=[[1, V_TILE]], offset=0)
  stats = nl.ndarray((P_MAX, 3 * NT), dtype=nl.float32, buffer=nl.sbuf)   # per row tile: max, sum exp, x[target]
  tloc = nl.ndarray((P_MAX, NT), dtype=nl.float32, buffer=nl.sbuf)        # target - v0
  if n_prgs > 1 and not use_scratch:
    nisa.memset(dst=stats, value=0.0)   # sent whole: the rows a ragged last tile leaves too

  # ---- pass 1: this program's partial max / sum of exp / target logit
  for r in nl.affine_range(NT):
    r0 = r * P_MAX
    rows = min(P_MAX, N - r0)
    tg = nl.ndarray((P_MAX, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=tg[:rows], src=targets[r0:r0 + rows].reshape((rows, 1)))
    nisa.tensor_scalar(dst=tloc[:rows, nl.ds(r, 1)], data=tg[:rows], op0=nl.subtract, operand0=float(v0))
    m = stats[:rows, nl.ds(3 * r, 1)]
    s = stats[:rows, nl.ds(3 * r + 1, 1)]
    pk = stats[:rows, nl.ds(3 * r + 2, 1)]
    nisa.memset(dst=m, value=NEG_BIG)
    nisa.memset(dst=stats[:rows, nl.ds(3 * r + 1, 2)], value=0.0)
    for j in nl.sequential_range(NV):
      c0 = j * V_TILE
      nc = min(V_TILE, Vh - c0)
      x = nl.ndarray((P_MAX, V_TILE), dtype=nl.float32, buffer=nl.sbuf)
      nisa.dma_copy(dst=x[:rows, :nc], src=logits[r0:r0 + rows, v0 + c0:v0 + c0 + nc])
      cm = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
      nisa.tensor_reduce(dst=cm[:rows], op=nl.maximum, data=x[:rows, :nc], axis=1)
      nisa.tensor_tensor(dst=cm[:rows], data1=cm[:rows], data2=m, op=nl.maximum)
      neg = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
      nisa.tensor_scalar(dst=neg[:rows], data=cm[:rows], op0=nl.multiply, operand0=-1.0)
      corr = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
      nisa.activation(dst=corr[:rows], op=nl.exp, data=m, bias=neg[:rows])
      e = nl.ndarray((P_MAX, V_TILE), dtype=nl.float32, buffer=nl.sbuf)
      cs = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
      nisa.activation(dst=e[:rows, :nc], op=nl.exp, data=x[:rows, :nc], bias=neg[:rows], reduce_op=nl.add,
                      reduce_res=cs[:rows], reduce_cmd=nisa.reduce_cmd.reset_reduce)
      nisa.scalar_tensor_tensor(dst=s, data=s, op0=nl.multiply, operand0=corr[:rows], op1=nl.add,
                                operand1=cs[:rows])
      nisa.tensor_copy(dst=m, src=cm[:rows])
      # the target's logit, if it falls in this tile
      lj = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
      nisa.tensor_scalar(dst=lj[:rows], data=tloc[:rows, nl.ds(r, 1)], op0=nl.subtract, operand0=float(c0))
      oh = nl.ndarray((P_MAX, V_TILE), dtype=nl.float32, buffer=nl.sbuf)
      nisa.tensor_scalar(dst=oh[:rows, :nc], data=cols[:rows, :nc], op0=nl.equal, operand0=lj[:rows])
      nisa.tensor_tensor(dst=oh[:rows, :nc], data1=oh[:rows, :nc], data2=x[:rows, :nc], op=nl.multiply)
      hit = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
      nisa.tensor_reduce(dst=hit[:rows], op=nl.add, data=oh[:rows, :nc], axis=1)
      nisa.tensor_tensor(dst=pk, data1=pk, data2=hit[:rows], op=nl.add)
    if use_scratch:
      nisa.dma_copy(dst=scratch[prg, r0:r0 + rows, :], src=stats[:rows, nl.ds(3 * r, 3)])

  if use_scratch:
    nisa.core_barrier(data=scratch, cores=(0, 1))
  elif n_prgs > 1:
    # the other core's partials of every row tile, SBUF to SBUF
    peer_stats = nl.ndarray((P_MAX, 3 * NT), dtype=nl.float32, buffer=nl.sbuf)
    nisa.sendrecv(src=stats, dst=peer_stats, send_to_rank=1 - prg, recv_from_rank=1 - prg, pipe_id=0)

  # ---- pass 2: combine, loss rows, gradient of this program's vocabulary columns
  for r in nl.affine_range(NT):
    r0 = r * P_MAX
    rows = min(P_MAX, N - r0)
    m = stats[:rows, nl.ds(3 * r, 1)]
    s = stats[:rows, nl.ds(3 * r + 1, 1)]
    pk = stats[:rows, nl.ds(3 * r + 2, 1)]
    lse = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    tot_pk = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    if n_prgs > 1:
      if use_scratch:
        peer = nl.ndarray((P_MAX, 3), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=peer[:rows], src=scratch[1 - prg, r0:r0 + rows, :])
      else:
        peer = peer_stats[:, nl.ds(3 * r, 3)]
      mx = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
      nisa.tensor_tensor(dst=mx[:rows], data1=m, data2=peer[:rows, 0:1], op=nl.maximum)
      neg = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
      nisa.tensor_scalar(dst=neg[:rows], data=mx[:rows], op0=nl.multiply, operand0=-1.0)
      c_own = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
      c_peer = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
      nisa.activation(dst=c_own[:rows], op=nl.exp, data=m, bias=neg[:rows])
      nisa.activation(dst=c_peer[:rows], op=nl.exp, data=peer[:rows, 0:1], bias=neg[:rows])
      tot = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
      nisa.tensor_tensor(dst=tot[:rows], data1=s, data2=c_own[:rows], op=nl.multiply)
      nisa.scalar_tensor_tensor(dst=tot[:rows], data=peer[:rows, 1:2], op0=nl.multiply, operand0=c_peer[:rows],
                                op1=nl.add, operand1=tot[:rows])
      nisa.activation(dst=lse[:rows], op=nl.log, data=tot[:rows])
      nisa.tensor_tensor(dst=lse[:rows], data1=lse[:rows], data2=mx[:rows], op=nl.add)
      nisa.tensor_tensor(dst=tot_pk[:rows], data1=pk, data2=peer[:rows, 2:3], op=nl.add)
    else:
      nisa.activation(dst=lse[:rows], op=nl.log, data=s)
      nisa.tensor_tensor(dst=lse[:rows], data1=lse[:rows], data2=m, op=nl.add)
      nisa.tensor_copy(dst=tot_pk[:rows], src=pk)
    if r % n_prgs == prg:
      lt = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
      nisa.tensor_tensor(dst=lt[:rows], data1=lse[:rows], data2=tot_pk[:rows], op=nl.subtract)
      nisa.dma_copy(dst=loss[r0:r0 + rows].reshape((rows, 1)), src=lt[:rows])

    neg_lse = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=neg_lse[:rows], data=lse[:rows], op0=nl.multiply, operand0=-1.0)
    for j in nl.affine_range(NV):
      c0 = j * V_TILE
      nc = min(V_TILE, Vh - c0)
      x = nl.ndarray((P_MAX, V_TILE), dtype=nl.float32, buffer=nl.sbuf)
      nisa.dma_copy(dst=x[:rows, :nc], src=logits[r0:r0 + rows, v0 + c0:v0 + c0 + nc])
      pr = nl.ndarray((P_MAX, V_TILE), dtype=nl.float32, buffer=nl.sbuf)
      nisa.activation(dst=pr[:rows, :nc], op=nl.exp, data=x[:rows, :nc], bias=neg_lse[:rows])
      lj = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
      nisa.tensor_scalar(dst=lj[:rows], data=tloc[:rows, nl.ds(r, 1)], op0=nl.subtract, operand0=float(c0))
      g = nl.ndarray((P_MAX, V_TILE), dtype=dt, buffer=nl.sbuf)
      # probs - (col == target)
      nisa.scalar_tensor_tensor(dst=g[:rows, :nc], data=cols[:rows, :nc], op0=nl.equal, operand0=lj[:rows],
                                op1=nl.subtract, operand1=pr[:rows, :nc], reverse1=True)
      nisa.dma_copy(dst=dlogits[r0:r0 + rows, v0 + c0:v0 + c0 + nc], src=g[:rows, :nc])
  return loss, dlogits
