"""Whisper's front end, its conv stem and CTC greedy decoding in the new NKI dialect (``import nki``, ISA calls
writing ``dst=``, ``.ap(...)`` access patterns), written the way public NKI 0.3+ kernels are:

- ``log_mel(signal, window, cos_basis, sin_basis, mel_filters, hop)``: the Whisper log-mel spectrogram at Whisper's
  own sizes (n_fft = 400, hop = 160, F = 201 bins, 80 mels) and any frame count T = 1 + (L - n_fft) // hop (the
  host reflect-pads the waveform). Per tile of up to 128 frames and chunk of up to 128 samples (400 = 3 x 128 +
  16) the overlapping frames are read by one DMA of the access pattern ``signal.ap([[1, ks], [hop, nfr]],
  offset=t0 hop + k0)`` (samples on the partitions, frames on the free axis, frame stride hop < n_fft), multiplied
  by the Hann window (a per-partition scalar). With ``frame_major=True`` the tile's frames are read as contiguous
  rows by one DMA (``signal.ap([[hop, nfr], [1, n_fft]])``, frames on the partitions) and each sample chunk is
  transposed on TensorE, the window applied on the way out of PSUM. The real DFT is two matmuls per (sample
  chunk, bin chunk) with the host's cos / sin bases [n_fft, F] accumulated in PSUM over the sample chunks
  (201 = 128 + 73 bins); power
  re^2 + im^2 (two squares on ScalarE, an add); the mel filterbank matmul [F, M] accumulated over the two bin
  chunks; log10(max(mel, 1e-10)). Whisper's clamp max(x, max(x) - 8) and (x + 4) / 4 need the global max over
  the whole spectrogram: per-row maxima of each frame tile, a max over the tiles, a TensorE transpose of the
  [M, 1] column to a row, a free-axis max, and a ones-row matmul broadcasting it back to the M partitions.
  Output [M, T] fp32 (Whisper's layout), stored once at the end.
- ``whisper_conv_stem(mel, w1, b1, w2, b2, pos)``: as the Beta-1 kernel of the same name (conv1d k=3 stride 1 +
  GELU, conv1d k=3 stride 2 + GELU, + positions; weights [3, C_in, D], b1 [D, 1], b2 [1, D], output [T2, D]);
  the stride-2 window of conv 2 is the strided slice ``hpad[:, 2 t0 + k : 2 (t0 + r) + k - 1 : 2]`` of the
  zero-padded SBUF tile, the stationary operand of the matmul.
- ``ctc_greedy(logits, blank)``: CTC greedy decoding of logits [T, V] (8 <= V <= 16384), frames on the partitions:
  the per-frame max and argmax by ``nisa.max8`` + ``nisa.nc_find_index8`` (column 0: the first index of the
  max), the log-softmax x - max - log(sum exp(x - max)) (the exp's row sum from the activation's accumulate
  registers), and keep = (id != previous id) & (id != blank). The previous frame's id is the id column shifted
  down one partition by an SBUF -> SBUF ``dma_copy`` (a shifted access across the frame axis), partition 0
  taking the previous tile's last id (carried in a [1, 1] tile, -1 before the first frame); with
  ``shift="shuffle"`` the shift is an ``nc_stream_shuffle`` (mask [255, 0, 1, ..., 30]: partition i of each
  quadrant takes i - 1, partition 0 of the quadrant is left alone) and each quadrant's first partition comes from
  the previous quadrant's last by a one-partition DMA. Outputs log_probs [T, V] fp32, ids [T, 1] uint32, keep
  [T, 1] int32 (0 / 1). Ragged last tile by ``[:rows]`` slices.

- ``conformer_conv_unfold(x, w_pw1, b_pw1, w_dw, bn_scale, bn_shift, w_pw2, b_pw2)``: the Conformer convolution
  module (pointwise + GLU, depthwise K taps, folded BatchNorm + Swish, pointwise), x [T, D], b_pw1 [2D, 1]; the
  depthwise conv vectorised over the taps through an overlapping unfold view of the padded tile times a stride-0
  weight view (``.ap``), reduced over the taps.
- ``wav2vec2_pos_conv(x, weight, bias, groups, pe_tiles=True)``: wav2vec2's grouped positional conv (even kernel,
  padding K / 2, SamePad drops the last frame) + GELU + residual, x [T, D]; each (tap, group) a matmul on the
  group's own PE tile (``tile_position``), issued tap-major.

Written for nsim's tests in the style of those kernels; not copies of any file. No nsim imports.
"""
import math

import nki
import nki.isa as nisa
import nki.language as nl

P_MAX = 128
F_MAX = 512


@nki.jit
def log_mel(signal, window, cos_basis, sin_basis, mel_filters, hop=160, frame_major=False):
  (L,) = signal.shape
  NFFT, F = cos_basis.shape
  F_, M = mel_filters.shape
  assert F == F_ and hop < NFFT and M <= P_MAX
  T = 1 + (L - NFFT) // hop
  NK = (NFFT + P_MAX - 1) // P_MAX   # sample chunks (contraction of the DFT)
  NF = (F + P_MAX - 1) // P_MAX      # bin chunks (contraction of the mel matmul)
  NT = (T + P_MAX - 1) // P_MAX      # frame tiles
  out = nl.ndarray((M, T), dtype=nl.float32, buffer=nl.shared_hbm)

  # constants: the window as one column per sample chunk, the bases and the filterbank in chunks of 128 rows
  win = nl.ndarray((P_MAX, NK), dtype=nl.float32, buffer=nl.sbuf)
  cb = nl.ndarray((P_MAX, NK, F), dtype=nl.float32, buffer=nl.sbuf)
  sb = nl.ndarray((P_MAX, NK, F), dtype=nl.float32, buffer=nl.sbuf)
  for k in nl.affine_range(NK):
    k0 = k * P_MAX
    ks = min(P_MAX, NFFT - k0)
    nisa.dma_copy(dst=win[:ks, k:k + 1], src=window[k0:k0 + ks])
    nisa.dma_copy(dst=cb[:ks, k, :], src=cos_basis[k0:k0 + ks, :])
    nisa.dma_copy(dst=sb[:ks, k, :], src=sin_basis[k0:k0 + ks, :])
  fb = nl.ndarray((P_MAX, NF, M), dtype=nl.float32, buffer=nl.sbuf)
  for c in nl.affine_range(NF):
    c0 = c * P_MAX
    fs = min(P_MAX, F - c0)
    nisa.dma_copy(dst=fb[:fs, c, :], src=mel_filters[c0:c0 + fs, :])

  logmel = nl.ndarray((M, T), dtype=nl.float32, buffer=nl.sbuf)
  rowmax = nl.ndarray((M, NT), dtype=nl.float32, buffer=nl.sbuf)
  for t in nl.affine_range(NT):
    t0 = t * P_MAX
    nfr = min(P_MAX, T - t0)
    # windowed frames, transposed: xw[n, k, f] = signal[(t0 + f) * hop + k0 + n] * window[k0 + n]
    xw = nl.ndarray((P_MAX, NK, P_MAX), dtype=nl.float32, buffer=nl.sbuf)
    if frame_major:  # the tile's frames as contiguous rows (one DMA), each sample chunk transposed on TensorE
      rows = nl.ndarray((P_MAX, NFFT), dtype=nl.float32, buffer=nl.sbuf)
      nisa.dma_copy(dst=rows[:nfr, :], src=signal.ap([[hop, nfr], [1, NFFT]], offset=t0 * hop))
    for k in nl.affine_range(NK):
      k0 = k * P_MAX
      ks = min(P_MAX, NFFT - k0)
      if frame_major:
        fr_ps = nl.ndarray((P_MAX, P_MAX), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_transpose(dst=fr_ps[:ks, :nfr], data=rows[:nfr, k0:k0 + ks])
        nisa.tensor_scalar(dst=xw[:ks, k, :nfr], data=fr_ps[:ks, :nfr], op0=nl.multiply,
                           operand0=win[:ks, k:k + 1])
      else:
        fr = nl.ndarray((P_MAX, P_MAX), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=fr[:ks, :nfr], src=signal.ap([[1, ks], [hop, nfr]], offset=t0 * hop + k0))
        nisa.tensor_scalar(dst=xw[:ks, k, :nfr], data=fr[:ks, :nfr], op0=nl.multiply,
                           operand0=win[:ks, k:k + 1])

    mel_ps = nl.ndarray((M, P_MAX), dtype=nl.float32, buffer=nl.psum)
    for c in nl.affine_range(NF):
      c0 = c * P_MAX
      fs = min(P_MAX, F - c0)
      re_ps = nl.ndarray((P_MAX, P_MAX), dtype=nl.float32, buffer=nl.psum)
      im_ps = nl.ndarray((P_MAX, P_MAX), dtype=nl.float32, buffer=nl.psum)
      for k in nl.affine_range(NK):
        ks = min(P_MAX, NFFT - k * P_MAX)
        nisa.nc_matmul(dst=re_ps[:fs, :nfr], stationary=cb[:ks, k, c0:c0 + fs], moving=xw[:ks, k, :nfr])
        nisa.nc_matmul(dst=im_ps[:fs, :nfr], stationary=sb[:ks, k, c0:c0 + fs], moving=xw[:ks, k, :nfr])
      # power spectrum, the bins of chunk c on the partitions
      pw = nl.ndarray((P_MAX, P_MAX), dtype=nl.float32, buffer=nl.sbuf)
      im2 = nl.ndarray((P_MAX, P_MAX), dtype=nl.float32, buffer=nl.sbuf)
      nisa.activation(dst=pw[:fs, :nfr], op=nl.square, data=re_ps[:fs, :nfr])
      nisa.activation(dst=im2[:fs, :nfr], op=nl.square, data=im_ps[:fs, :nfr])
      nisa.tensor_tensor(dst=pw[:fs, :nfr], data1=pw[:fs, :nfr], data2=im2[:fs, :nfr], op=nl.add)
      nisa.nc_matmul(dst=mel_ps[:, :nfr], stationary=fb[:fs, c, :], moving=pw[:fs, :nfr])

    # log10(max(mel, 1e-10)) and the tile's row maxima
    mc = nl.ndarray((M, P_MAX), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=mc[:, :nfr], data=mel_ps[:, :nfr], op0=nl.maximum, operand0=1e-10)
    nisa.activation(dst=mc[:, :nfr], op=nl.log, data=mc[:, :nfr])
    nisa.tensor_scalar(dst=logmel[:, t0:t0 + nfr], data=mc[:, :nfr], op0=nl.multiply,
                       operand0=1.0 / math.log(10.0))
    nisa.tensor_reduce(dst=rowmax[:, t:t + 1], op=nl.maximum, data=logmel[:, t0:t0 + nfr], axis=1)

  # the global max: over the tiles, across the partitions (transpose + free max), back to every partition
  colmax = nl.ndarray((M, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_reduce(dst=colmax, op=nl.maximum, data=rowmax, axis=1)
  row_ps = nl.ndarray((1, M), dtype=nl.float32, buffer=nl.psum)
  nisa.nc_transpose(dst=row_ps, data=colmax)
  gmax = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_reduce(dst=gmax, op=nl.maximum, data=row_ps, axis=1)
  ones = nl.ndarray((1, M), dtype=nl.float32, buffer=nl.sbuf)
  nisa.memset(dst=ones, value=1.0)
  gb_ps = nl.ndarray((M, 1), dtype=nl.float32, buffer=nl.psum)
  nisa.nc_matmul(dst=gb_ps, stationary=ones, moving=gmax)
  floor_ = nl.ndarray((M, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_scalar(dst=floor_, data=gb_ps, op0=nl.subtract, operand0=8.0)

  # max(x, gmax - 8), then (x + 4) / 4
  res = nl.ndarray((M, T), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_scalar(dst=res, data=logmel, op0=nl.maximum, operand0=floor_, op1=nl.add, operand1=4.0)
  nisa.tensor_scalar(dst=res, data=res, op0=nl.multiply, operand0=0.25)
  nisa.dma_copy(dst=out, src=res)
  return out


@nki.jit
def whisper_conv_stem(mel, w1, b1, w2, b2, pos):
  C, T = mel.shape
  K3, C_, D = w1.shape
  assert K3 == 3 and C == C_ and C <= P_MAX and D <= P_MAX
  T2 = (T - 1) // 2 + 1
  out = nl.ndarray((T2, D), dtype=mel.dtype, buffer=nl.shared_hbm)

  w1_sb = nl.ndarray((C, 3, D), dtype=w1.dtype, buffer=nl.sbuf)
  w2_sb = nl.ndarray((D, 3, D), dtype=w2.dtype, buffer=nl.sbuf)
  for k in nl.affine_range(3):
    nisa.dma_copy(dst=w1_sb[:, k, :], src=w1[k])
    nisa.dma_copy(dst=w2_sb[:, k, :], src=w2[k])
  bias1 = nl.ndarray((D, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.dma_copy(dst=bias1, src=b1)
  bias2 = nl.ndarray((1, D), dtype=b2.dtype, buffer=nl.sbuf)
  nisa.dma_copy(dst=bias2, src=b2)
  ones = nl.ndarray((1, P_MAX), dtype=b2.dtype, buffer=nl.sbuf)
  nisa.memset(dst=ones, value=1.0)

  xpad = nl.ndarray((C, T + 2), dtype=mel.dtype, buffer=nl.sbuf)
  nisa.memset(dst=xpad[:, 0:1], value=0.0)
  nisa.memset(dst=xpad[:, T + 1:T + 2], value=0.0)
  nisa.dma_copy(dst=xpad[:, 1:T + 1], src=mel)

  hpad = nl.ndarray((D, T + 2), dtype=mel.dtype, buffer=nl.sbuf)
  nisa.memset(dst=hpad[:, 0:1], value=0.0)
  nisa.memset(dst=hpad[:, T + 1:T + 2], value=0.0)
  for c in nl.affine_range((T + F_MAX - 1) // F_MAX):
    c0 = c * F_MAX
    n = min(F_MAX, T - c0)
    h_ps = nl.ndarray((D, F_MAX), dtype=nl.float32, buffer=nl.psum)
    for k in nl.affine_range(3):
      nisa.nc_matmul(dst=h_ps[:, :n], stationary=w1_sb[:, k, :], moving=xpad[:, c0 + k:c0 + k + n])
    nisa.activation(dst=hpad[:, 1 + c0:1 + c0 + n], op=nl.gelu, data=h_ps[:, :n], bias=bias1)

  for t in nl.affine_range((T2 + P_MAX - 1) // P_MAX):
    t0 = t * P_MAX
    r = min(P_MAX, T2 - t0)
    y_ps = nl.ndarray((P_MAX, D), dtype=nl.float32, buffer=nl.psum)
    for k in nl.affine_range(3):
      nisa.nc_matmul(dst=y_ps[:r, :], stationary=hpad[:, 2 * t0 + k:2 * (t0 + r) + k - 1:2], moving=w2_sb[:, k, :])
    nisa.nc_matmul(dst=y_ps[:r, :], stationary=ones[:, :r], moving=bias2)
    y = nl.ndarray((P_MAX, D), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=y[:r, :], op=nl.gelu, data=y_ps[:r, :])
    p = nl.ndarray((P_MAX, D), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=p[:r, :], src=pos[t0:t0 + r, :])
    o = nl.ndarray((P_MAX, D), dtype=mel.dtype, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=o[:r, :], data1=y[:r, :], data2=p[:r, :], op=nl.add)
    nisa.dma_copy(dst=out[t0:t0 + r, :], src=o[:r, :])
  return out


@nki.jit
def ctc_greedy(logits, blank=0, shift="dma"):
  T, V = logits.shape
  assert 8 <= V <= 16384
  log_probs = nl.ndarray((T, V), dtype=nl.float32, buffer=nl.shared_hbm)
  ids = nl.ndarray((T, 1), dtype=nl.uint32, buffer=nl.shared_hbm)
  keep = nl.ndarray((T, 1), dtype=nl.int32, buffer=nl.shared_hbm)

  carry = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.sbuf)  # the id of the frame before the tile
  nisa.memset(dst=carry, value=-1.0)
  for t in nl.sequential_range((T + P_MAX - 1) // P_MAX):
    t0 = t * P_MAX
    rows = min(P_MAX, T - t0)
    x = nl.ndarray((P_MAX, V), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=x[:rows, :], src=logits[t0:t0 + rows, :])

    # max and argmax (the first index holding the max)
    m8 = nl.ndarray((P_MAX, 8), dtype=nl.float32, buffer=nl.sbuf)
    nisa.max8(dst=m8[:rows, :], src=x[:rows, :])
    i8 = nl.ndarray((P_MAX, 8), dtype=nl.uint32, buffer=nl.sbuf)
    nisa.nc_find_index8(dst=i8[:rows, :], data=x[:rows, :], vals=m8[:rows, :])
    nisa.dma_copy(dst=ids[t0:t0 + rows, :], src=i8[:rows, 0:1])

    # log-softmax
    neg_m = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=neg_m[:rows, :], data=m8[:rows, 0:1], op0=nl.multiply, operand0=-1.0)
    e = nl.ndarray((P_MAX, V), dtype=nl.float32, buffer=nl.sbuf)
    ssum = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=e[:rows, :], op=nl.exp, data=x[:rows, :], bias=neg_m[:rows, :], reduce_op=nl.add,
                    reduce_res=ssum[:rows, :], reduce_cmd=nisa.reduce_cmd.reset_reduce)
    lse = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=lse[:rows, :], op=nl.log, data=ssum[:rows, :])
    lp = nl.ndarray((P_MAX, V), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=lp[:rows, :], data=x[:rows, :], op0=nl.add, operand0=neg_m[:rows, :],
                       op1=nl.subtract, operand1=lse[:rows, :])
    nisa.dma_copy(dst=log_probs[t0:t0 + rows, :], src=lp[:rows, :])

    # collapse repeats and drop blanks: the previous frame's id, one partition down
    cur = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=cur[:rows, :], src=i8[:rows, 0:1])
    prev = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=prev[0:1, :], src=carry)
    if shift == "shuffle":  # one partition down within each quadrant, then each quadrant's first partition
      nisa.nc_stream_shuffle(dst=prev[:rows, :], src=cur[:rows, :], shuffle_mask=[255] + list(range(31)))
      for q in nl.static_range(1, (rows + 31) // 32):
        nisa.dma_copy(dst=prev[q * 32:q * 32 + 1, :], src=cur[q * 32 - 1:q * 32, :])
    elif rows > 1:
      nisa.dma_copy(dst=prev[1:rows, :], src=cur[0:rows - 1, :])
    nisa.dma_copy(dst=carry, src=cur[rows - 1:rows, :])
    changed = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=changed[:rows, :], data1=cur[:rows, :], data2=prev[:rows, :], op=nl.not_equal)
    k = nl.ndarray((P_MAX, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.scalar_tensor_tensor(dst=k[:rows, :], data=cur[:rows, :], op0=nl.not_equal, operand0=float(blank),
                              op1=nl.multiply, operand1=changed[:rows, :])
    nisa.dma_copy(dst=keep[t0:t0 + rows, :], src=k[:rows, :])
  return log_probs, ids, keep


@nki.jit
def conformer_conv_unfold(x, w_pw1, b_pw1, w_dw, bn_scale, bn_shift, w_pw2, b_pw2):
  """The Conformer convolution module (as the Beta-1 ``conformer_conv_module``; same arguments, b_pw1 [2D, 1]),
  x [T, D] with T <= 512 frames, D <= 128. x is transposed per 128-frame tile on TensorE. The depthwise conv is
  vectorised over the taps: one ``tensor_tensor`` multiply of the overlapping unfold view
  ``gpad.ap([[T + K - 1, D], [1, T], [1, K]])`` (element (c, t, k) = gpad[c, t + k]) by the weights broadcast
  over time ``wdw.ap([[K, D], [0, T], [1, K]])`` (stride 0), then a ``tensor_reduce`` add over the taps."""
  T, D = x.shape
  _, K = w_dw.shape
  assert D <= P_MAX and T <= F_MAX and K % 2 == 1
  pad = (K - 1) // 2
  W = T + K - 1
  out = nl.ndarray((T, D), dtype=x.dtype, buffer=nl.shared_hbm)

  w1 = nl.ndarray((D, 2 * D), dtype=w_pw1.dtype, buffer=nl.sbuf)
  nisa.dma_copy(dst=w1, src=w_pw1)
  w2 = nl.ndarray((D, D), dtype=w_pw2.dtype, buffer=nl.sbuf)
  nisa.dma_copy(dst=w2, src=w_pw2)
  b_val = nl.ndarray((D, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.dma_copy(dst=b_val, src=b_pw1[0:D, :])
  b_gate = nl.ndarray((D, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.dma_copy(dst=b_gate, src=b_pw1[D:2 * D, :])
  wdw = nl.ndarray((D, K), dtype=nl.float32, buffer=nl.sbuf)
  nisa.dma_copy(dst=wdw, src=w_dw)
  scale = nl.ndarray((D, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.dma_copy(dst=scale, src=bn_scale)
  shift = nl.ndarray((D, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.dma_copy(dst=shift, src=bn_shift)
  bias2 = nl.ndarray((1, D), dtype=b_pw2.dtype, buffer=nl.sbuf)
  nisa.dma_copy(dst=bias2, src=b_pw2)
  ones = nl.ndarray((1, P_MAX), dtype=b_pw2.dtype, buffer=nl.sbuf)
  nisa.memset(dst=ones, value=1.0)

  # x transposed, channels on the partitions
  xT = nl.ndarray((D, T), dtype=x.dtype, buffer=nl.sbuf)
  for t in nl.affine_range((T + P_MAX - 1) // P_MAX):
    t0 = t * P_MAX
    r = min(P_MAX, T - t0)
    xt = nl.ndarray((P_MAX, D), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=xt[:r, :], src=x[t0:t0 + r, :])
    xt_ps = nl.ndarray((D, P_MAX), dtype=x.dtype, buffer=nl.psum)
    nisa.nc_transpose(dst=xt_ps[:, :r], data=xt[:r, :])
    nisa.tensor_copy(dst=xT[:, t0:t0 + r], src=xt_ps[:, :r])

  # pointwise conv 1 + GLU into the zero-padded tile
  gpad = nl.ndarray((D, W), dtype=nl.float32, buffer=nl.sbuf)
  nisa.memset(dst=gpad[:, 0:pad], value=0.0)
  nisa.memset(dst=gpad[:, pad + T:W], value=0.0)
  a_ps = nl.ndarray((D, T), dtype=nl.float32, buffer=nl.psum)
  g_ps = nl.ndarray((D, T), dtype=nl.float32, buffer=nl.psum)
  nisa.nc_matmul(dst=a_ps, stationary=w1[:, 0:D], moving=xT)
  nisa.nc_matmul(dst=g_ps, stationary=w1[:, D:2 * D], moving=xT)
  sig = nl.ndarray((D, T), dtype=nl.float32, buffer=nl.sbuf)
  nisa.activation(dst=sig, op=nl.sigmoid, data=g_ps, bias=b_gate)
  nisa.scalar_tensor_tensor(dst=gpad[:, pad:pad + T], data=a_ps, op0=nl.add, operand0=b_val, op1=nl.multiply,
                            operand1=sig)

  # depthwise conv: unfold x broadcast weights, reduce over the taps
  prod = nl.ndarray((D, T, K), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_tensor(dst=prod, data1=gpad.ap([[W, D], [1, T], [1, K]]), data2=wdw.ap([[K, D], [0, T], [1, K]]),
                     op=nl.multiply)
  acc = nl.ndarray((D, T), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_reduce(dst=acc, op=nl.add, data=prod, axis=2)

  # BatchNorm (folded) + Swish
  s = nl.ndarray((D, T), dtype=x.dtype, buffer=nl.sbuf)
  nisa.activation(dst=s, op=nl.silu, data=acc, bias=shift, scale=scale)

  # pointwise conv 2, frames on the partitions
  for t in nl.affine_range((T + P_MAX - 1) // P_MAX):
    t0 = t * P_MAX
    r = min(P_MAX, T - t0)
    y_ps = nl.ndarray((P_MAX, D), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=y_ps[:r, :], stationary=s[:, t0:t0 + r], moving=w2)
    nisa.nc_matmul(dst=y_ps[:r, :], stationary=ones[:, :r], moving=bias2)
    y = nl.ndarray((P_MAX, D), dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=y[:r, :], src=y_ps[:r, :])
    nisa.dma_copy(dst=out[t0:t0 + r, :], src=y[:r, :])
  return out


@nki.jit
def wav2vec2_pos_conv(x, weight, bias, groups, pe_tiles=True):
  """wav2vec2's convolutional relative position embedding: out = x + GELU(SamePad(conv1d(x))), the conv grouped
  (``groups`` groups of cg = D / groups channels, cg = 32 here), kernel K even, padding K / 2, the last output
  frame dropped (SamePad). x [T, D] (T <= 512, D <= 128), weight [D, K, cg] (row = input channel g cg + j, holding
  W[g cg + o, j, k] for output o of its group; the host folds weight norm), bias [D, 1] fp32. Channels on the
  partitions (x transposed per tile on TensorE into a zero-padded [D, T + K] tile); each (group, tap) is one
  32 x 32 matmul on its own PE tile (``tile_position=(g cg, g cg)``, ``tile_size=(cg, cg)``): stationary rows and
  moving rows are the group's partitions, the result lands on the group's PSUM partitions, accumulated over the
  taps (``pe_tiles=False``: the same matmuls without PE tiling). GELU with the bias, transposed back per tile and
  added to x."""
  T, D = x.shape
  D_, K, cg = weight.shape
  assert D == D_ and D == groups * cg and T <= F_MAX and K % 2 == 0 and cg in (32, 64)
  pad = K // 2
  out = nl.ndarray((T, D), dtype=x.dtype, buffer=nl.shared_hbm)

  w_sb = nl.ndarray((D, K, cg), dtype=weight.dtype, buffer=nl.sbuf)
  nisa.dma_copy(dst=w_sb, src=weight)
  b_sb = nl.ndarray((D, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.dma_copy(dst=b_sb, src=bias)

  xpad = nl.ndarray((D, T + K), dtype=x.dtype, buffer=nl.sbuf)
  nisa.memset(dst=xpad[:, 0:pad], value=0.0)
  nisa.memset(dst=xpad[:, pad + T:T + K], value=0.0)
  x_rows = nl.ndarray((P_MAX, (T + P_MAX - 1) // P_MAX, D), dtype=x.dtype, buffer=nl.sbuf)
  for t in nl.affine_range((T + P_MAX - 1) // P_MAX):
    t0 = t * P_MAX
    r = min(P_MAX, T - t0)
    nisa.dma_copy(dst=x_rows[:r, t, :], src=x[t0:t0 + r, :])
    xt_ps = nl.ndarray((D, P_MAX), dtype=x.dtype, buffer=nl.psum)
    nisa.nc_transpose(dst=xt_ps[:, :r], data=x_rows[:r, t, :])
    nisa.tensor_copy(dst=xpad[:, pad + t0:pad + t0 + r], src=xt_ps[:, :r])

  # grouped conv: out[c, t] = sum_k sum_j W[c, j, k] xpad[g cg + j, t + k], t < T (SamePad drops frame T)
  c_ps = nl.ndarray((D, T), dtype=nl.float32, buffer=nl.psum)
  for k in nl.affine_range(K):
    for g in nl.affine_range(groups):  # consecutive matmuls on different PE tiles
      g0 = g * cg
      if pe_tiles:
        nisa.nc_matmul(dst=c_ps[g0:g0 + cg, :], stationary=w_sb[g0:g0 + cg, k, :],
                       moving=xpad[g0:g0 + cg, k:k + T], tile_position=(g0, g0), tile_size=(cg, cg))
      else:
        nisa.nc_matmul(dst=c_ps[g0:g0 + cg, :], stationary=w_sb[g0:g0 + cg, k, :],
                       moving=xpad[g0:g0 + cg, k:k + T])
  h = nl.ndarray((D, T), dtype=x.dtype, buffer=nl.sbuf)
  nisa.activation(dst=h, op=nl.gelu, data=c_ps, bias=b_sb)

  for t in nl.affine_range((T + P_MAX - 1) // P_MAX):
    t0 = t * P_MAX
    r = min(P_MAX, T - t0)
    hT_ps = nl.ndarray((P_MAX, D), dtype=x.dtype, buffer=nl.psum)
    nisa.nc_transpose(dst=hT_ps[:r, :], data=h[:, t0:t0 + r])
    o = nl.ndarray((P_MAX, D), dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=o[:r, :], data1=hT_ps[:r, :], data2=x_rows[:r, t, :], op=nl.add)
    nisa.dma_copy(dst=out[t0:t0 + r, :], src=o[:r, :])
  return out
