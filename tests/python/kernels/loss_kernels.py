"""Losses over a vocabulary tiled on the free axis, written the way public NKI training kernels are (Beta-1 dialect:
``import neuronxcc.nki as nki``, ``nl.arange`` index grids, ``mask=`` on ragged row and vocabulary tiles, 2-space
indentation as in the NKI samples):

- ``kd_loss_kernel(student, teacher, temperature)``: knowledge-distillation loss, T^2 * KL(softmax(t / T) ||
  softmax(s / T)) per row and its batch mean (``nn.KLDivLoss(reduction="batchmean")`` on log-softmaxes, times T^2,
  as Hinton et al. and the distillation trainers write it). One pass over the vocabulary tiles of a row tile keeps
  four running values per row, all rescaled when a tile raises a maximum (online log-sum-exp):
      m_s, l_s = max and sum of exp(s / T - m_s)        (student)
      m_t, l_t = max and sum of exp(t / T - m_t)        (teacher)
      w        = sum of exp(t / T - m_t) * (t - s)       (rescaled with the teacher's correction)
  and KL = w / (T l_t) - (m_t + log l_t) + (m_s + log l_s) (the teacher's probabilities sum to 1). The exps are
  ScalarE ``activation_reduce`` with scale = 1 / T and bias = -m; per-row losses go to HBM, their sum over the row
  tiles stays per partition in SBUF and is summed over the partitions by one ones-vector matmul at the end.
  Returns (loss fp32 [N], mean fp32 [1, 1]).
- ``kd_loss_resident_kernel``: the same loss with whole rows resident in SBUF, written with ``nl`` operators (the
  two log-softmaxes by ``nl.max`` / ``nl.exp`` / ``nl.sum`` / ``nl.log``, then sum p_t (log p_t - log p_s)), as a
  first port writes it before streaming the vocabulary.
- ``label_smoothed_ce_kernel(logits, targets, smoothing, ignore_index)``: ``F.cross_entropy(logits, targets,
  label_smoothing=eps, ignore_index=-100)`` forward and its gradient w.r.t. the logits (reduction "mean": divided
  by the number of rows whose target is not ignored). Pass 0 counts the valid rows (targets != ignore_index, a ones
  [128, 128] matmul puts the count on every partition: 1 / max(count, 1) scales the gradient). Per row tile, pass 1
  (online log-sum-exp) also gathers the target's logit (``nisa.iota`` column ids == target - tile offset: a target
  of -100 matches no column) and the row's sum of logits for the smoothing term:
      loss_n = lse_n - (1 - eps) x[n, y_n] - (eps / V) sum_v x[n, v]             (0 for an ignored row)
  pass 2: dlogits = (softmax - (1 - eps) onehot - eps / V) * valid_n / count. Returns (loss fp32 [N] (0 on ignored
  rows), mean fp32 [1, 1], dlogits [N, V] in logits.dtype).
- ``label_smoothed_ce_nl_kernel``: the same loss as a first port writes it, whole rows resident and ``nl``
  operators: the one-hot by ``nl.equal`` of an int32 ``nisa.iota`` row with the (P, 1) targets, ignored rows zeroed
  by ``nl.where(valid, g, 0.0)`` with the (P, 1) validity broadcast over the row; reduction "sum".

Written for nsim's tests in the style of public kernels; not copies of any file. No nsim imports.
"""
import numpy as np

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl

PMAX = nl.tile_size.pmax    # 128
V_TILE = 512                # vocabulary columns per tile
NEG_BIG = -3.0e38


def _partition_total(acc):
  """[1, 1] fp32: the sum over the partitions of acc [128, 1] (a ones-vector matmul on the PE)."""
  ones = nl.full((PMAX, 1), 1.0, dtype=nl.float32)
  tot = nisa.nc_matmul(acc, ones)            # acc^T @ ones: [1, 1] in PSUM
  return nl.copy(tot, dtype=nl.float32)


# ------------------------------------------------------------------------------------------------
# Knowledge distillation: T^2 * KL(p_teacher || p_student), online over vocabulary tiles
# ------------------------------------------------------------------------------------------------

@nki.jit
def kd_loss_kernel(student, teacher, temperature=2.0):
  """student, teacher: logits [N, V] (fp32 or bf16). Returns (loss fp32 [N], batch mean fp32 [1, 1])."""
  N, V = student.shape
  assert teacher.shape == student.shape
  inv_t = 1.0 / temperature

  loss = nl.ndarray((N,), dtype=nl.float32, buffer=nl.shared_hbm)
  mean_out = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.shared_hbm)
  loss_2d = loss.reshape((N, 1))

  n_v = (V + V_TILE - 1) // V_TILE
  i_p = nl.arange(PMAX)[:, None]
  i_v = nl.arange(V_TILE)[None, :]
  i_0 = nl.arange(1)[None, :]

  acc = nl.zeros((PMAX, 1), dtype=nl.float32)   # sum of this partition's row losses over the row tiles

  for i in nl.sequential_range((N + PMAX - 1) // PMAX):
    row_mask = (i * PMAX + i_p < N)
    m_s = nl.full((PMAX, 1), NEG_BIG, dtype=nl.float32)
    m_t = nl.full((PMAX, 1), NEG_BIG, dtype=nl.float32)
    l_s = nl.zeros((PMAX, 1), dtype=nl.float32)
    l_t = nl.zeros((PMAX, 1), dtype=nl.float32)
    w = nl.zeros((PMAX, 1), dtype=nl.float32)

    for j in nl.sequential_range(n_v):
      mask = row_mask & (j * V_TILE + i_v < V)
      s = nl.load(student[i * PMAX + i_p, j * V_TILE + i_v], mask=mask, dtype=nl.float32)
      t = nl.load(teacher[i * PMAX + i_p, j * V_TILE + i_v], mask=mask, dtype=nl.float32)

      # new maxima of s / T and t / T (T > 0 keeps the order: the raw max scaled)
      cmax_s = nisa.tensor_reduce(np.max, s, axis=(1,), keepdims=True, mask=mask)
      cmax_t = nisa.tensor_reduce(np.max, t, axis=(1,), keepdims=True, mask=mask)
      new_s = nisa.tensor_scalar(cmax_s, op0=nl.multiply, operand0=inv_t, op1=nl.maximum, operand1=m_s,
                                 mask=row_mask)
      new_t = nisa.tensor_scalar(cmax_t, op0=nl.multiply, operand0=inv_t, op1=nl.maximum, operand1=m_t,
                                 mask=row_mask)
      neg_s = nl.negative(new_s, mask=row_mask)
      neg_t = nl.negative(new_t, mask=row_mask)

      # exp(x / T - m) and its row sum on ScalarE
      sum_s = nl.ndarray((PMAX, 1), dtype=nl.float32)
      nisa.activation_reduce(op=nl.exp, data=s, bias=neg_s, scale=inv_t, reduce_op=nl.add, reduce_res=sum_s,
                             mask=mask)
      sum_t = nl.ndarray((PMAX, 1), dtype=nl.float32)
      e_t = nisa.activation_reduce(op=nl.exp, data=t, bias=neg_t, scale=inv_t, reduce_op=nl.add,
                                   reduce_res=sum_t, mask=mask)
      # sum over the tile of exp(t / T - m_t) * (t - s)
      diff = nl.subtract(t, s, mask=mask)
      cw = nl.sum(nl.multiply(e_t, diff, mask=mask), axis=[1], keepdims=True, mask=mask)

      # corrections of the old sums: exp(m_old - m_new)
      a_s = nisa.activation(op=nl.exp, data=m_s, bias=neg_s, mask=row_mask)
      a_t = nisa.activation(op=nl.exp, data=m_t, bias=neg_t, mask=row_mask)
      l_s[i_p, i_0] = nisa.scalar_tensor_tensor(data=l_s, op0=nl.multiply, operand0=a_s, op1=nl.add,
                                                operand1=sum_s, mask=row_mask)
      l_t[i_p, i_0] = nisa.scalar_tensor_tensor(data=l_t, op0=nl.multiply, operand0=a_t, op1=nl.add,
                                                operand1=sum_t, mask=row_mask)
      w[i_p, i_0] = nisa.scalar_tensor_tensor(data=w, op0=nl.multiply, operand0=a_t, op1=nl.add, operand1=cw,
                                              mask=row_mask)
      m_s[i_p, i_0] = nl.copy(new_s, mask=row_mask)
      m_t[i_p, i_0] = nl.copy(new_t, mask=row_mask)

    # KL = w / (T l_t) - (m_t + log l_t) + (m_s + log l_s), times T^2
    lse_s = nl.add(nl.log(l_s, mask=row_mask), m_s, mask=row_mask)
    lse_t = nl.add(nl.log(l_t, mask=row_mask), m_t, mask=row_mask)
    cross = nl.multiply(w, nl.reciprocal(l_t, mask=row_mask), mask=row_mask)
    kl = nisa.scalar_tensor_tensor(data=cross, op0=nl.multiply, operand0=inv_t, op1=nl.subtract, operand1=lse_t,
                                   mask=row_mask)
    kl = nl.add(kl, lse_s, mask=row_mask)
    row_loss = nl.multiply(kl, temperature * temperature, mask=row_mask)
    nl.store(loss_2d[i * PMAX + i_p, i_0], value=row_loss, mask=row_mask)
    acc[i_p, i_0] = nl.add(acc, row_loss, mask=row_mask)

  total = _partition_total(acc)
  nl.store(mean_out, value=nl.multiply(total, 1.0 / N))
  return loss, mean_out


@nki.jit
def kd_loss_resident_kernel(student, teacher, temperature=2.0):
  """The same loss with whole rows resident in SBUF (V up to a few thousand), written with nl operators:
  log-softmax of both by nl.max / nl.exp / nl.sum / nl.log, KL = sum p_t (log p_t - log p_s). Returns (loss fp32 [N],
  batch mean fp32 [1, 1])."""
  N, V = student.shape
  inv_t = 1.0 / temperature
  loss = nl.ndarray((N,), dtype=nl.float32, buffer=nl.shared_hbm)
  mean_out = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.shared_hbm)
  loss_2d = loss.reshape((N, 1))
  i_p = nl.arange(PMAX)[:, None]
  i_f = nl.arange(V)[None, :]
  i_0 = nl.arange(1)[None, :]
  acc = nl.zeros((PMAX, 1), dtype=nl.float32)
  for i in nl.sequential_range((N + PMAX - 1) // PMAX):
    row_mask = (i * PMAX + i_p < N)
    logp = []
    for src in (student, teacher):
      z = nl.multiply(nl.load(src[i * PMAX + i_p, i_f], mask=row_mask), inv_t, mask=row_mask, dtype=nl.float32)
      zmax = nl.max(z, axis=[1], keepdims=True, mask=row_mask)
      zc = nl.subtract(z, zmax, mask=row_mask)
      lsum = nl.log(nl.sum(nl.exp(zc, mask=row_mask), axis=[1], keepdims=True, mask=row_mask), mask=row_mask)
      logp.append(nl.subtract(zc, lsum, mask=row_mask))
    log_ps, log_pt = logp
    p_t = nl.exp(log_pt, mask=row_mask)
    kl = nl.sum(nl.multiply(p_t, nl.subtract(log_pt, log_ps, mask=row_mask), mask=row_mask), axis=[1],
                keepdims=True, mask=row_mask)
    row_loss = nl.multiply(kl, temperature * temperature, mask=row_mask)
    nl.store(loss_2d[i * PMAX + i_p, i_0], value=row_loss, mask=row_mask)
    acc[i_p, i_0] = nl.add(acc, row_loss, mask=row_mask)
  total = _partition_total(acc)
  nl.store(mean_out, value=nl.multiply(total, 1.0 / N))
  return loss, mean_out


# ------------------------------------------------------------------------------------------------
# Label-smoothed cross-entropy with ignore_index, forward + gradient
# ------------------------------------------------------------------------------------------------

@nki.jit
def label_smoothed_ce_kernel(logits, targets, smoothing=0.1, ignore_index=-100):
  """logits [N, V] (fp32 / bf16), targets int32 [N]. Returns (loss fp32 [N], mean fp32 [1, 1], dlogits [N, V])."""
  N, V = logits.shape
  assert targets.shape[0] == N
  assert V < 2 ** 24  # column ids compared in fp32
  eps = float(smoothing)
  n_rt = (N + PMAX - 1) // PMAX
  n_v = (V + V_TILE - 1) // V_TILE

  loss = nl.ndarray((N,), dtype=nl.float32, buffer=nl.shared_hbm)
  mean_out = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.shared_hbm)
  dlogits = nl.ndarray((N, V), dtype=logits.dtype, buffer=nl.shared_hbm)
  loss_2d = loss.reshape((N, 1))
  tgt_2d = targets.reshape((N, 1))

  i_p = nl.arange(PMAX)[:, None]
  i_v = nl.arange(V_TILE)[None, :]
  i_0 = nl.arange(1)[None, :]
  col_ids = nisa.iota(i_p * 0 + i_v, dtype=nl.float32)    # 0 .. V_TILE - 1 on every partition

  # pass 0: how many rows count (target != ignore_index), on every partition
  cnt = nl.zeros((PMAX, 1), dtype=nl.float32)
  for i in nl.sequential_range(n_rt):
    row_mask = (i * PMAX + i_p < N)
    tg = nl.load(tgt_2d[i * PMAX + i_p, i_0], mask=row_mask)
    ok = nl.not_equal(tg, ignore_index, dtype=nl.float32, mask=row_mask)
    cnt[i_p, i_0] = nl.add(cnt, ok, mask=row_mask)
  ones = nl.full((PMAX, PMAX), 1.0, dtype=nl.float32)
  n_valid = nl.copy(nisa.nc_matmul(ones, cnt), dtype=nl.float32)      # [128, 1]: the count everywhere
  inv_n = nl.reciprocal(nl.maximum(n_valid, 1.0))

  acc = nl.zeros((PMAX, 1), dtype=nl.float32)
  for i in nl.sequential_range(n_rt):
    row_mask = (i * PMAX + i_p < N)
    tg = nl.load(tgt_2d[i * PMAX + i_p, i_0], mask=row_mask)
    tg_f = nl.copy(tg, dtype=nl.float32, mask=row_mask)
    valid = nl.not_equal(tg, ignore_index, dtype=nl.float32, mask=row_mask)
    g_scale = nl.multiply(valid, inv_n, mask=row_mask)                  # d(mean) / d(row loss)

    run_max = nl.full((PMAX, 1), NEG_BIG, dtype=nl.float32)
    run_sum = nl.zeros((PMAX, 1), dtype=nl.float32)
    picked = nl.zeros((PMAX, 1), dtype=nl.float32)
    x_sum = nl.zeros((PMAX, 1), dtype=nl.float32)

    # pass 1: online log-sum-exp, the target's logit, the sum of the logits
    for j in nl.sequential_range(n_v):
      mask = row_mask & (j * V_TILE + i_v < V)
      x = nl.load(logits[i * PMAX + i_p, j * V_TILE + i_v], mask=mask, dtype=nl.float32)
      cmax = nisa.tensor_reduce(np.max, x, axis=(1,), keepdims=True, mask=mask)
      new_max = nl.maximum(run_max, cmax, mask=row_mask)
      neg_max = nl.negative(new_max, mask=row_mask)
      csum = nl.ndarray((PMAX, 1), dtype=nl.float32)
      nisa.activation_reduce(op=nl.exp, data=x, bias=neg_max, reduce_op=nl.add, reduce_res=csum, mask=mask)
      alpha = nisa.activation(op=nl.exp, data=run_max, bias=neg_max, mask=row_mask)
      run_sum[i_p, i_0] = nisa.scalar_tensor_tensor(data=run_sum, op0=nl.multiply, operand0=alpha, op1=nl.add,
                                                    operand1=csum, mask=row_mask)
      run_max[i_p, i_0] = nl.copy(new_max, mask=row_mask)

      local = nl.add(tg_f, -1.0 * j * V_TILE, mask=row_mask)
      onehot = nisa.tensor_scalar(col_ids, op0=nl.equal, operand0=local, mask=mask)
      hit = nl.sum(nl.multiply(onehot, x, mask=mask), axis=[1], keepdims=True, mask=mask)
      picked[i_p, i_0] = nl.add(picked, hit, mask=row_mask)
      x_sum[i_p, i_0] = nl.add(x_sum, nisa.tensor_reduce(np.add, x, axis=(1,), keepdims=True, mask=mask),
                               mask=row_mask)

    lse = nl.add(nl.log(run_sum, mask=row_mask), run_max, mask=row_mask)
    # loss = lse - (1 - eps) x_y - (eps / V) sum x, zeroed on ignored rows
    smooth = nisa.scalar_tensor_tensor(data=x_sum, op0=nl.multiply, operand0=-eps / V, op1=nl.add, operand1=lse,
                                       mask=row_mask)
    row_loss = nisa.scalar_tensor_tensor(data=picked, op0=nl.multiply, operand0=-(1.0 - eps), op1=nl.add,
                                         operand1=smooth, mask=row_mask)
    row_loss = nl.multiply(row_loss, valid, mask=row_mask)
    nl.store(loss_2d[i * PMAX + i_p, i_0], value=row_loss, mask=row_mask)
    acc[i_p, i_0] = nl.add(acc, row_loss, mask=row_mask)

    # pass 2: dlogits = (softmax - (1 - eps) onehot - eps / V) * valid / count
    neg_lse = nl.negative(lse, mask=row_mask)
    for j in nl.affine_range(n_v):
      mask = row_mask & (j * V_TILE + i_v < V)
      x = nl.load(logits[i * PMAX + i_p, j * V_TILE + i_v], mask=mask, dtype=nl.float32)
      probs = nisa.activation(op=nl.exp, data=x, bias=neg_lse, mask=mask)
      local = nl.add(tg_f, -1.0 * j * V_TILE, mask=row_mask)
      target_w = nisa.tensor_scalar(col_ids, op0=nl.equal, operand0=local, op1=nl.multiply,
                                    operand1=1.0 - eps, mask=mask)
      g = nisa.scalar_tensor_tensor(data=probs, op0=nl.subtract, operand0=eps / V, op1=nl.subtract,
                                    operand1=target_w, mask=mask)
      g = nisa.tensor_scalar(g, op0=nl.multiply, operand0=g_scale, dtype=logits.dtype, mask=mask)
      nl.store(dlogits[i * PMAX + i_p, j * V_TILE + i_v], value=g, mask=mask)

  total = _partition_total(acc)                   # [1, 1]
  mean = nl.multiply(total, inv_n[0:1, 0:1])
  nl.store(mean_out, value=mean)
  return loss, mean_out, dlogits


@nki.jit
def label_smoothed_ce_nl_kernel(logits, targets, smoothing=0.1, ignore_index=-100):
  """The same loss as a first port writes it: whole rows resident (V up to a few thousand), ``nl`` operators, the
  one-hot by ``nl.equal`` of an int32 ``nisa.iota`` row against the (P, 1) targets, ignored rows zeroed by
  ``nl.where`` with the (P, 1) validity as the condition. reduction="sum": returns (loss fp32 [N], dlogits [N, V] =
  (softmax - (1 - eps) onehot - eps / V) on the rows that count, 0 on the others)."""
  N, V = logits.shape
  eps = float(smoothing)
  loss = nl.ndarray((N,), dtype=nl.float32, buffer=nl.shared_hbm)
  dlogits = nl.ndarray((N, V), dtype=logits.dtype, buffer=nl.shared_hbm)
  loss_2d = loss.reshape((N, 1))
  tgt_2d = targets.reshape((N, 1))
  i_p = nl.arange(PMAX)[:, None]
  i_f = nl.arange(V)[None, :]
  i_0 = nl.arange(1)[None, :]
  col = nisa.iota(i_p * 0 + i_f, dtype=nl.int32)
  for i in nl.affine_range((N + PMAX - 1) // PMAX):
    rm = (i * PMAX + i_p < N)
    x = nl.load(logits[i * PMAX + i_p, i_f], mask=rm, dtype=nl.float32)
    tg = nl.load(tgt_2d[i * PMAX + i_p, i_0], mask=rm)
    onehot = nl.equal(col, tg, mask=rm, dtype=nl.float32)
    valid = nl.not_equal(tg, ignore_index, mask=rm)
    mx = nl.max(x, axis=[1], keepdims=True, mask=rm)
    se = nl.sum(nl.exp(nl.subtract(x, mx, mask=rm), mask=rm), axis=[1], keepdims=True, mask=rm)
    lse = nl.add(nl.log(se, mask=rm), mx, mask=rm)
    picked = nl.sum(nl.multiply(onehot, x, mask=rm), axis=[1], keepdims=True, mask=rm)
    x_sum = nl.sum(x, axis=[1], keepdims=True, mask=rm)
    row = nl.subtract(lse, nl.multiply(picked, 1.0 - eps, mask=rm), mask=rm)
    row = nl.subtract(row, nl.multiply(x_sum, eps / V, mask=rm), mask=rm)
    nl.store(loss_2d[i * PMAX + i_p, i_0], value=nl.where(valid, row, 0.0, mask=rm), mask=rm)
    probs = nl.exp(nl.subtract(x, lse, mask=rm), mask=rm)
    g = nl.subtract(probs, nl.multiply(onehot, 1.0 - eps, mask=rm), mask=rm)
    g = nl.subtract(g, eps / V, mask=rm)
    nl.store(dlogits[i * PMAX + i_p, i_f], value=nl.where(valid, g, 0.0, mask=rm, dtype=logits.dtype), mask=rm)
  return loss, dlogits
