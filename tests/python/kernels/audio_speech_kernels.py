"""Speech encoder blocks and CTC decoding in the Beta-1 dialect (``neuronxcc.nki``), written the way public NKI
kernels write them (arange index expressions with loop indices, value-returning ``nl``/``nisa`` calls, PSUM
accumulation with ``+=``, masks for ragged tiles):

- ``whisper_conv_stem(mel, w1, b1, w2, b2, pos)``: Whisper's encoder stem on a log-mel [C, T] (C = n_mels <= 128 on
  the partitions, Whisper's layout): conv1d k=3 pad 1 stride 1 (C -> D) + GELU, conv1d k=3 pad 1 stride 2 (D -> D)
  + GELU, + sinusoidal positions. Weights tap-major [3, C_in, D] (torch's [D, C_in, 3] permuted), b1 [D, 1] fp32,
  b2 [1, D] fp32, pos [>= T2, D] fp32. Conv 1 keeps the channels on the partitions: three matmuls per chunk of 512
  frames, the moving operand the zero-padded input shifted by the tap (``xpad[i_c, c0 + k + i_n]``), GELU with the
  bias as the activation's per-partition bias, written into a zero-padded [D, T + 2] tile. Conv 2 puts the output
  frames on the partitions (the layout the encoder continues in): per tile of 128 output frames the stationary
  operand is the stride-2 window ``hpad[i_d, 2 (t0 + i_r) + k]``, the bias is one more accumulated matmul of a ones
  row with b2, then GELU and the positions. Output [T2, D], T2 = (T - 1) // 2 + 1, in mel's dtype; T ragged.
- ``ctc_greedy_decode(logits, blank)``: CTC greedy decoding of one utterance's logits [T, V] (frames on the
  partitions, 128 per tile, ragged last tile by masks): the CTC log-softmax over the vocabulary (max, exp with the
  max subtracted, sum, log), the per-frame argmax by max + ``nisa.iota`` compare (the first index holding the
  max, as np.argmax), and the collapse / blank flags keep[t] = (id[t] != id[t - 1]) & (id[t] != blank). The
  previous frame's id is a shifted load across the frame axis: each tile's ids are stored to an HBM scratch one
  slot late (slot 0 holds -1) and read back at ``scratch[t0 + i_p]`` (a sequential loop: the previous tile's last
  id is in the scratch). Outputs log_probs [T, V] fp32, ids [T, 1] int32, keep [T, 1] int32 (0 / 1).
- ``ctc_greedy_rows(logits, blank)``: the same decoding with ``nisa.max8`` / ``nisa.nc_find_index8`` for the argmax
  and ``nisa.activation_reduce`` for the exp's row sum; the ids are transposed (TensorE) into one [1, T] row and
  the collapse compares the row with itself shifted by one element. ids and keep as [1, T] int32 rows.
- ``conformer_conv_module(x, w_pw1, b_pw1, w_dw, bn_scale, bn_shift, w_pw2, b_pw2, fused=True)``: the Conformer
  convolution module on x [T, D] (D <= 128): pointwise conv D -> 2D (two matmuls, the value and gate halves, with
  x transposed by ``nl.load_transpose2d``: channels on the partitions), GLU (sigmoid of the gate on ScalarE with
  its bias, value + bias times gate in one ``scalar_tensor_tensor``), depthwise conv1d over time (K taps, same
  padding, from a zero-padded [D, T + K - 1] tile: one multiply-accumulate per tap, the tap's weight a
  per-partition scalar), inference BatchNorm folded to scale / shift (the depthwise bias folded into the shift)
  and Swish as one ``activation(silu, scale=, bias=)``, pointwise conv D -> D with the frames back on the
  partitions (bias by a ones-row matmul). w_pw1 [D, 2D] (in, out), b_pw1 [2D] fp32, w_dw [D, K] fp32,
  bn_scale / bn_shift [D, 1] fp32, w_pw2 [D, D], b_pw2 [1, D] fp32. ``fused=False`` is the naive form: a
  multiply and an add per tap and BatchNorm / Swish as three ops.

Written for nsim's tests in the style of those kernels; not copies of any file. No nsim imports.
"""
import numpy as np

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl

PMAX = 128
FMAX = 512


@nki.jit
def whisper_conv_stem(mel, w1, b1, w2, b2, pos):
  C, T = mel.shape
  K3, C_, D = w1.shape
  assert K3 == 3 and C == C_ and C <= PMAX and D <= PMAX
  T2 = (T - 1) // 2 + 1
  out = nl.ndarray((T2, D), dtype=mel.dtype, buffer=nl.shared_hbm)

  i_c = nl.arange(C)[:, None]
  i_dp = nl.arange(D)[:, None]
  i_d = nl.arange(D)[None, :]
  i_t = nl.arange(T)[None, :]

  w1_sb = nl.ndarray((3, nl.par_dim(C), D), dtype=w1.dtype, buffer=nl.sbuf)
  w2_sb = nl.ndarray((3, nl.par_dim(D), D), dtype=w2.dtype, buffer=nl.sbuf)
  for k in nl.affine_range(3):
    w1_sb[k, i_c, i_d] = nl.load(w1[k, i_c, i_d])
    w2_sb[k, i_dp, i_d] = nl.load(w2[k, i_dp, i_d])
  bias1 = nl.load(b1)
  bias2 = nl.load(b2)
  ones = nl.ones((1, PMAX), dtype=b2.dtype)

  # zero-padded input: xpad[:, 1 + t] = mel[:, t]
  xpad = nl.zeros((nl.par_dim(C), T + 2), dtype=mel.dtype)
  xpad[i_c, 1 + i_t] = nl.load(mel)

  # conv 1 (stride 1) + GELU, channels on the partitions, into a zero-padded tile for conv 2
  hpad = nl.zeros((nl.par_dim(D), T + 2), dtype=mel.dtype)
  for c in nl.static_range((T + FMAX - 1) // FMAX):
    n = min(FMAX, T - c * FMAX)
    i_n = nl.arange(n)[None, :]
    h_ps = nl.zeros((nl.par_dim(D), n), dtype=nl.float32, buffer=nl.psum)
    for k in nl.static_range(3):
      h_ps += nisa.nc_matmul(w1_sb[k], xpad[i_c, c * FMAX + k + i_n])
    hpad[i_dp, 1 + c * FMAX + i_n] = nisa.activation(op=nl.gelu, data=h_ps, bias=bias1)

  # conv 2 (stride 2) + GELU + positions, output frames on the partitions
  for t in nl.static_range((T2 + PMAX - 1) // PMAX):
    r = min(PMAX, T2 - t * PMAX)
    i_r = nl.arange(r)[None, :]
    i_rp = nl.arange(r)[:, None]
    y_ps = nl.zeros((nl.par_dim(r), D), dtype=nl.float32, buffer=nl.psum)
    for k in nl.static_range(3):
      y_ps += nisa.nc_matmul(hpad[i_dp, 2 * (t * PMAX + i_r) + k], w2_sb[k])
    y_ps += nisa.nc_matmul(ones[0:1, 0:r], bias2)
    y = nl.gelu(y_ps, dtype=nl.float32)
    p = nl.load(pos[t * PMAX + i_rp, i_d])
    nl.store(out[t * PMAX + i_rp, i_d], value=nl.add(y, p, dtype=mel.dtype))
  return out


@nki.jit
def ctc_greedy_decode(logits, blank=0):
  T, V = logits.shape
  NT = (T + PMAX - 1) // PMAX
  log_probs = nl.ndarray((T, V), dtype=nl.float32, buffer=nl.shared_hbm)
  ids = nl.ndarray((T, 1), dtype=nl.int32, buffer=nl.shared_hbm)
  keep = nl.ndarray((T, 1), dtype=nl.int32, buffer=nl.shared_hbm)
  # ids one slot late: scratch[0] = -1 (no frame before the first), scratch[1 + t] = ids[t]
  scratch = nl.ndarray((T + 1, 1), dtype=nl.int32, buffer=nl.hbm)

  i_p = nl.arange(PMAX)[:, None]
  i_v = nl.arange(V)[None, :]
  i_0 = nl.arange(1)[None, :]

  vocab = nisa.iota(i_v + 0 * i_p, dtype=nl.float32)  # 0 .. V-1 on every partition
  nl.store(scratch[0:1, 0:1], value=nl.full((1, 1), -1, dtype=nl.int32))

  for t in nl.sequential_range(NT):
    valid = t * PMAX + i_p < T
    x = nl.load(logits[t * PMAX + i_p, i_v], dtype=nl.float32, mask=valid)
    mx = nl.max(x, axis=[1], keepdims=True, mask=valid)

    # log-softmax: x - (max + log(sum(exp(x - max))))
    e = nl.exp(nl.subtract(x, mx, mask=valid), mask=valid)
    se = nl.sum(e, axis=[1], keepdims=True, mask=valid)
    lse = nl.add(nl.log(se, mask=valid), mx, mask=valid)
    nl.store(log_probs[t * PMAX + i_p, i_v], value=nl.subtract(x, lse, mask=valid), mask=valid)

    # argmax: the smallest vocabulary index holding the max
    cand = nl.where(nl.equal(x, mx, mask=valid), vocab, float(V), mask=valid)
    am = nl.min(cand, axis=[1], keepdims=True, mask=valid)
    am_i = nl.copy(am, dtype=nl.int32, mask=valid)
    nl.store(ids[t * PMAX + i_p, i_0], value=am_i, mask=valid)
    nl.store(scratch[1 + t * PMAX + i_p, i_0], value=am_i, mask=valid)

    # the previous frame's id: the same scratch one slot earlier
    prev = nl.load(scratch[t * PMAX + i_p, i_0], dtype=nl.float32, mask=valid)
    changed = nl.not_equal(am, prev, dtype=nl.float32, mask=valid)
    not_blank = nl.not_equal(am, float(blank), dtype=nl.float32, mask=valid)
    k = nl.multiply(changed, not_blank, dtype=nl.int32, mask=valid)
    nl.store(keep[t * PMAX + i_p, i_0], value=k, mask=valid)
  return log_probs, ids, keep


@nki.jit
def conformer_conv_module(x, w_pw1, b_pw1, w_dw, bn_scale, bn_shift, w_pw2, b_pw2, fused=True):
  T, D = x.shape
  D_, D2 = w_pw1.shape
  _, K = w_dw.shape
  assert D == D_ and D2 == 2 * D and D <= PMAX and K % 2 == 1
  pad = (K - 1) // 2
  out = nl.ndarray((T, D), dtype=x.dtype, buffer=nl.shared_hbm)

  i_dp = nl.arange(D)[:, None]
  i_d = nl.arange(D)[None, :]
  i_t = nl.arange(T)[None, :]

  w1 = nl.load(w_pw1)
  w2 = nl.load(w_pw2)
  b_val = nl.load(b_pw1[i_dp])
  b_gate = nl.load(b_pw1[D + i_dp])
  wdw = nl.load(w_dw)
  scale = nl.load(bn_scale)
  shift = nl.load(bn_shift)
  bias2 = nl.load(b_pw2)
  ones = nl.ones((1, PMAX), dtype=b_pw2.dtype)

  # channels on the partitions
  xT = nl.load_transpose2d(x)

  # pointwise conv 1 + GLU, into a zero-padded tile for the depthwise conv
  gpad = nl.zeros((nl.par_dim(D), T + K - 1), dtype=nl.float32)
  for c in nl.static_range((T + FMAX - 1) // FMAX):
    n = min(FMAX, T - c * FMAX)
    i_n = nl.arange(n)[None, :]
    a_ps = nl.zeros((nl.par_dim(D), n), dtype=nl.float32, buffer=nl.psum)
    g_ps = nl.zeros((nl.par_dim(D), n), dtype=nl.float32, buffer=nl.psum)
    a_ps += nisa.nc_matmul(w1[i_dp, i_d], xT[i_dp, c * FMAX + i_n])
    g_ps += nisa.nc_matmul(w1[i_dp, D + i_d], xT[i_dp, c * FMAX + i_n])
    sig = nisa.activation(op=nl.sigmoid, data=g_ps, bias=b_gate)
    gpad[i_dp, pad + c * FMAX + i_n] = nisa.scalar_tensor_tensor(data=a_ps, op0=np.add, operand0=b_val,
                                                                 op1=np.multiply, operand1=sig)

  # depthwise conv over time, same padding
  acc = nl.zeros((nl.par_dim(D), T), dtype=nl.float32)
  for k in nl.static_range(K):
    if fused:
      acc[...] = nisa.scalar_tensor_tensor(data=gpad[i_dp, k + i_t], op0=np.multiply, operand0=wdw[i_dp, k],
                                           op1=np.add, operand1=acc)
    else:
      acc[...] = nl.add(acc, nl.multiply(gpad[i_dp, k + i_t], wdw[i_dp, k]))

  # BatchNorm (folded) + Swish
  if fused:
    s = nisa.activation(op=nl.silu, data=acc, bias=shift, scale=scale, dtype=x.dtype)
  else:
    bn = nl.add(nl.multiply(acc, scale), shift)
    s = nl.multiply(bn, nl.sigmoid(bn), dtype=x.dtype)

  # pointwise conv 2, frames back on the partitions
  for t in nl.static_range((T + PMAX - 1) // PMAX):
    r = min(PMAX, T - t * PMAX)
    i_r = nl.arange(r)[None, :]
    i_rp = nl.arange(r)[:, None]
    y_ps = nl.zeros((nl.par_dim(r), D), dtype=nl.float32, buffer=nl.psum)
    y_ps += nisa.nc_matmul(s[i_dp, t * PMAX + i_r], w2)
    y_ps += nisa.nc_matmul(ones[0:1, 0:r], bias2)
    nl.store(out[t * PMAX + i_rp, i_d], value=nl.copy(y_ps, dtype=x.dtype))
  return out


@nki.jit
def ctc_greedy_rows(logits, blank=0):
  """``ctc_greedy_decode`` with the ISA top-8 instructions and the frame axis along the free dimension for the
  collapse: per tile ``nisa.max8`` / ``nisa.nc_find_index8`` give the max and the first index holding it,
  ``nisa.activation_reduce`` the exp's row sum; the ids column is transposed (TensorE) into one [1, T] row and
  the previous frame is the same row one element to the left, ``row[0:1, 0:T - 1]`` against ``row[0:1, 1:T]``.
  Outputs log_probs [T, V] fp32 and ids, keep as [1, T] int32 rows."""
  T, V = logits.shape
  assert 8 <= V <= 16384
  NT = (T + PMAX - 1) // PMAX
  log_probs = nl.ndarray((T, V), dtype=nl.float32, buffer=nl.shared_hbm)
  ids = nl.ndarray((1, T), dtype=nl.int32, buffer=nl.shared_hbm)
  keep = nl.ndarray((1, T), dtype=nl.int32, buffer=nl.shared_hbm)

  i_v = nl.arange(V)[None, :]

  # the ids of every frame along the free axis of one partition, after a -1 for "no frame before the first"
  row = nl.full((1, T + 1), -1.0, dtype=nl.float32)
  for t in nl.static_range(NT):
    r = min(PMAX, T - t * PMAX)  # frames in this tile
    i_r = nl.arange(r)[:, None]
    x = nl.load(logits[t * PMAX + i_r, i_v], dtype=nl.float32)
    m8 = nisa.max8(src=x)
    i8 = nisa.nc_find_index8(data=x, vals=m8)
    neg_m = nl.multiply(m8[i_r, 0], -1.0)
    ssum = nl.ndarray((r, 1), dtype=nl.float32)
    e = nisa.activation_reduce(op=nl.exp, data=x, reduce_op=np.add, reduce_res=ssum, bias=neg_m)
    lse = nl.subtract(nl.log(ssum), neg_m)
    nl.store(log_probs[t * PMAX + i_r, i_v], value=nl.subtract(x, lse))
    am = nl.copy(i8[i_r, 0], dtype=nl.float32)
    row[0:1, 1 + t * PMAX:1 + t * PMAX + r] = nisa.nc_transpose(am)
  cur = row[0:1, 1:T + 1]
  changed = nl.not_equal(cur, row[0:1, 0:T], dtype=nl.float32)
  k = nl.multiply(changed, nl.not_equal(cur, float(blank), dtype=nl.float32), dtype=nl.int32)
  nl.store(ids, value=nl.copy(cur, dtype=nl.int32))
  nl.store(keep, value=k)
  return log_probs, ids, keep
