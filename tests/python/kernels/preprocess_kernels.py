"""Audio front end and detection post-processing in the Beta-1 dialect (``neuronxcc.nki``), written the way public
NKI kernels write them (arange index expressions with loop indices, value-returning ``nl``/``nisa`` calls, PSUM
accumulation with ``+=``):

- ``log_mel_spectrogram(signal, window, cos_basis, sin_basis, mel_filters, hop, frame_major=False)``: the Whisper
  front end. The (host reflect-padded) 1-D signal is framed by an overlapping strided load: frame f, sample n is
  ``signal[f * hop + n]`` with hop < n_fft, loaded transposed (samples on the partitions, 128 frames on the free
  axis: partition stride 1, free stride hop; with ``frame_major=True`` the frames are loaded as contiguous rows,
  frames on the partitions, ``signal[(f0 + i_p) * hop + n0 + i_f]``, and transposed on TensorE). Hann window
  multiply (a per-partition scalar; the host's window, or with ``window=None`` the periodic Hann made on chip as
  sin^2(pi n / n_fft) from ``nisa.iota``), the real DFT as two matmuls with the cos / sin bases ([n_fft, F] with
  F = n_fft / 2 + 1 bins, contraction over the samples in chunks of 128), power re^2 + im^2 with the bins on the
  partitions, the mel filterbank matmul ([F, n_mels], contraction over the bins), log10(max(mel, 1e-10)); then
  Whisper's per-utterance clamp max(x, max(x) - 8) and (x + 4) / 4. The global max: per-row max of every frame
  tile, a transpose of the [n_mels, 1] row maxima, a free reduce, and a ones matmul to broadcast it back to the
  n_mels partitions. Output [n_mels, n_frames] fp32 (Whisper's layout).
- ``box_iou(boxes)``: pairwise IoU of N boxes (x1, y1, x2, y2) [N, 4], 128 boxes per partition tile against all N
  on the free axis (each coordinate's row broadcast over the partitions from a ``load_transpose2d``), broadcast
  min / max, clamped widths, areas, inter / union. [N, N] fp32.
- ``nms_keep(boxes, scores, iou_threshold, score_threshold)``: greedy NMS over boxes sorted by descending score, the
  way the public Trainium ports do it: the IoU matrix on chip, thresholded into a suppression matrix
  ``sup[i, j] = (iou[i, j] > t) & (j > i)`` staged in HBM, then a sequential loop over the sorted list keeping a
  [1, N] keep mask on one partition: step i loads row i of ``sup`` and does keep *= 1 - keep[i] * sup[i, :].
  The keep mask starts as score > score_threshold. Returns the IoU matrix and the keep mask [1, N] (fp32 0 / 1).
  ``nms_keep_sbuf`` (N <= 128): the suppression matrix stays on chip, flattened onto one partition by one
  SBUF -> SBUF ``nisa.dma_copy`` ([N, N] -> [1, N N]), so step i reads row i as a free-axis slice, no DMA per step.
- ``roi_align(feat, coords, height, width)``: bilinear ROI-align sampling (torchvision's ``aligned`` bilinear
  interpolation) of a channels-last feature map flattened to rows [H * W, C] at host-given fractional sample
  coordinates coords [B, S, 2] (y, x) of B output bins, S sampling points each (sampling_ratio^2). Bins on the
  partitions; per sample point the corner rows y0 * W + x0 etc. and the weights hy hx, hy lx, ly hx, ly lx are
  computed on chip (clamp to the map, ``nl.floor``), the 4 neighbours gathered by indirect loads
  (``feat[idx[i_p, 0], i_c]``), and the weighted sum averaged over the S points. Output [B, C] fp32.
- ``pixel_shuffle_b1(x, r)``: depth-to-space [C r r, H, W] -> [C, H r, W r] by strided DMAs alone, Beta-1 style:
  a 3-D ``nl.mgrid[0:128, 0:W, 0:r]`` (p = row h, x = column w, y = sub-column j) loads, per (channel, row tile,
  sub-row i), the r planes' rows as a [128, W, r] tile ``x[c r r + i r + g.y, h0 + g.p, g.x]`` and stores it as
  output row ``(h0 + g.p) r + i``, columns ``g.x r + g.y`` (contiguous); masked ragged row tile.

Written for nsim's tests in the style of those kernels; not copies of any file. No nsim imports.
"""
import math

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl

PMAX = 128


@nki.jit
def log_mel_spectrogram(signal, window, cos_basis, sin_basis, mel_filters, hop, frame_major=False):
  (L,) = signal.shape
  NFFT, F = cos_basis.shape
  F_, M = mel_filters.shape
  assert F == F_ and NFFT % PMAX == 0 and hop < NFFT and M <= PMAX
  T = 1 + (L - NFFT) // hop
  assert T % PMAX == 0 and T <= 512
  NK = NFFT // PMAX             # sample chunks (contraction of the DFT)
  NF = (F + PMAX - 1) // PMAX   # bin chunks (contraction of the mel matmul)
  NT = T // PMAX                # frame tiles
  out = nl.ndarray((M, T), dtype=nl.float32, buffer=nl.shared_hbm)

  i_p = nl.arange(PMAX)[:, None]
  i_f = nl.arange(PMAX)[None, :]
  i_m = nl.arange(M)[None, :]
  i_mp = nl.arange(M)[:, None]
  i_t = nl.arange(T)[None, :]

  # constants: the window as a column per sample chunk, the DFT bases and the filterbank in chunks of 128 rows
  win = nl.ndarray((NK, nl.par_dim(PMAX), 1), dtype=nl.float32, buffer=nl.sbuf)
  cb = nl.ndarray((NK, nl.par_dim(PMAX), F), dtype=nl.float32, buffer=nl.sbuf)
  sb = nl.ndarray((NK, nl.par_dim(PMAX), F), dtype=nl.float32, buffer=nl.sbuf)
  i_fb = nl.arange(F)[None, :]
  for k in nl.affine_range(NK):
    if window is None:  # periodic Hann made on chip: sin^2(pi n / n_fft), the argument within sin's [0, pi)
      n = nisa.iota(k * PMAX + i_p + 0 * nl.arange(1)[None, :], dtype=nl.float32)
      win[k, i_p, 0] = nl.square(nl.sin(nl.multiply(n, math.pi / NFFT)))
    else:
      win[k, i_p, 0] = nl.load(window[k * PMAX + i_p])
    cb[k, i_p, i_fb] = nl.load(cos_basis[k * PMAX + i_p, i_fb])
    sb[k, i_p, i_fb] = nl.load(sin_basis[k * PMAX + i_p, i_fb])
  fb = nl.ndarray((NF, nl.par_dim(PMAX), M), dtype=nl.float32, buffer=nl.sbuf)
  for c in nl.affine_range(NF):
    fb[c, i_p, i_m] = nl.load(mel_filters[c * PMAX + i_p, i_m], mask=(c * PMAX + i_p < F))

  logmel = nl.ndarray((nl.par_dim(M), T), dtype=nl.float32, buffer=nl.sbuf)
  rowmax = nl.ndarray((nl.par_dim(M), NT), dtype=nl.float32, buffer=nl.sbuf)
  for t in nl.affine_range(NT):
    # frames t*128 .. t*128+127, transposed: framesT[n, f] = signal[(t*128 + f) * hop + n] (overlapping windows)
    xw = nl.ndarray((NK, nl.par_dim(PMAX), PMAX), dtype=nl.float32, buffer=nl.sbuf)
    for k in nl.affine_range(NK):
      if frame_major:  # contiguous frame rows, then a TensorE transpose (the window applied on the way out of PSUM)
        fr = nl.load(signal[(t * PMAX + i_p) * hop + k * PMAX + i_f])
        xw[k, i_p, i_f] = nl.multiply(nisa.nc_transpose(fr), win[k, i_p, 0])
      else:
        fr = nl.load(signal[t * PMAX * hop + k * PMAX + i_p + hop * i_f])
        xw[k, i_p, i_f] = nl.multiply(fr, win[k, i_p, 0])

    mel_ps = nl.zeros((nl.par_dim(M), PMAX), dtype=nl.float32, buffer=nl.psum)
    for c in nl.static_range(NF):
      fs = min(PMAX, F - c * PMAX)  # bins in this chunk (the Nyquist bin alone in the last one)
      re_ps = nl.zeros((nl.par_dim(fs), PMAX), dtype=nl.float32, buffer=nl.psum)
      im_ps = nl.zeros((nl.par_dim(fs), PMAX), dtype=nl.float32, buffer=nl.psum)
      for k in nl.affine_range(NK):
        re_ps += nisa.nc_matmul(cb[k, :, c * PMAX:c * PMAX + fs], xw[k])
        im_ps += nisa.nc_matmul(sb[k, :, c * PMAX:c * PMAX + fs], xw[k])
      # power spectrum re^2 + im^2, the bins of chunk c on the partitions
      pw = nl.add(nl.square(re_ps), nl.square(im_ps))
      mel_ps += nisa.nc_matmul(fb[c, 0:fs, :], pw)

    # log10(max(mel, 1e-10))
    lg = nl.log(nl.maximum(mel_ps, 1e-10))
    logmel[i_mp, t * PMAX + i_f] = nl.multiply(lg, 1.0 / math.log(10.0))
    rowmax[i_mp, t] = nl.max(logmel[i_mp, t * PMAX + i_f], axis=[1], keepdims=True)

  # per-utterance max: rows' max -> transpose -> free max -> broadcast to the M partitions by a ones matmul
  rmax = nl.max(rowmax, axis=[1], keepdims=True)                  # [M, 1]
  rmax_T = nisa.nc_transpose(rmax)                                 # [1, M] (PSUM)
  gmax = nl.max(rmax_T, axis=[1], keepdims=True)                   # [1, 1]
  ones = nl.ones((1, M), dtype=nl.float32)
  gmax_b = nisa.nc_matmul(ones, gmax)                              # [M, 1] (PSUM)
  floor_ = nl.subtract(gmax_b, 8.0)
  clamped = nl.maximum(logmel, floor_)
  res = nl.multiply(nl.add(clamped, 4.0), 0.25)
  nl.store(out[i_mp, i_t], value=res)
  return out


@nki.jit
def box_iou(boxes):
  N, four = boxes.shape
  assert four == 4 and N % PMAX == 0 and N <= 512
  iou = nl.ndarray((N, N), dtype=nl.float32, buffer=nl.shared_hbm)
  _iou_tiles(boxes, iou)
  return iou


def _iou_tiles(boxes, iou):
  """iou[i, j] for i in tiles of 128 on the partitions, all j on the free axis."""
  N = boxes.shape[0]
  i_p = nl.arange(PMAX)[:, None]
  i_c = nl.arange(4)[None, :]
  i_n = nl.arange(N)[None, :]
  bT = nl.load_transpose2d(boxes)  # [4, N]: each coordinate as a row
  x1j = bT[0:1, :].broadcast_to((PMAX, N))
  y1j = bT[1:2, :].broadcast_to((PMAX, N))
  x2j = bT[2:3, :].broadcast_to((PMAX, N))
  y2j = bT[3:4, :].broadcast_to((PMAX, N))
  area_j = nl.multiply(nl.subtract(x2j, x1j), nl.subtract(y2j, y1j))
  for t in nl.affine_range(N // PMAX):
    b = nl.load(boxes[t * PMAX + i_p, i_c])  # [128, 4]: box i's coordinates per partition
    x1i, y1i, x2i, y2i = b[i_p, 0], b[i_p, 1], b[i_p, 2], b[i_p, 3]
    area_i = nl.multiply(nl.subtract(x2i, x1i), nl.subtract(y2i, y1i))
    w = nl.maximum(nl.subtract(nl.minimum(x2j, x2i), nl.maximum(x1j, x1i)), 0.0)
    h = nl.maximum(nl.subtract(nl.minimum(y2j, y2i), nl.maximum(y1j, y1i)), 0.0)
    inter = nl.multiply(w, h)
    union = nl.subtract(nl.add(area_j, area_i), inter)
    nl.store(iou[t * PMAX + i_p, i_n], value=nl.divide(inter, union))


@nki.jit
def nms_keep(boxes, scores, iou_threshold, score_threshold):
  N, _ = boxes.shape
  iou = nl.ndarray((N, N), dtype=nl.float32, buffer=nl.shared_hbm)
  keep_out = nl.ndarray((1, N), dtype=nl.float32, buffer=nl.shared_hbm)
  sup = nl.ndarray((N, N), dtype=nl.float32, buffer=nl.hbm)
  _iou_tiles(boxes, iou)

  i_p = nl.arange(PMAX)[:, None]
  i_n = nl.arange(N)[None, :]
  # suppression candidates: a later (lower-scored) box overlapping more than the threshold
  for t in nl.affine_range(N // PMAX):
    ov = nl.greater(nl.load(iou[t * PMAX + i_p, i_n]), iou_threshold, dtype=nl.float32)
    later = nisa.affine_select(i_n - (t * PMAX + i_p) > 0, ov, 0.0)
    nl.store(sup[t * PMAX + i_p, i_n], value=later)

  i_0 = nl.arange(1)[:, None]
  keep = nl.greater(nl.load(scores.reshape((1, N))), score_threshold, dtype=nl.float32)  # [1, N]
  for i in nl.sequential_range(N):
    row = nl.load(sup[i, i_n])                                  # [1, N]
    # keep *= 1 - keep[i] * row: a kept box i suppresses its overlaps; a suppressed one does nothing
    hit = nl.multiply(row, keep[i_0, i])
    keep[i_0, i_n] = nl.multiply(keep, nl.subtract(1.0, hit))
  nl.store(keep_out, value=keep)
  return iou, keep_out


@nki.jit
def nms_keep_sbuf(boxes, scores, iou_threshold, score_threshold):
  N, _ = boxes.shape
  assert N == PMAX
  iou = nl.ndarray((N, N), dtype=nl.float32, buffer=nl.shared_hbm)
  keep_out = nl.ndarray((1, N), dtype=nl.float32, buffer=nl.shared_hbm)
  _iou_tiles(boxes, iou)
  i_p = nl.arange(N)[:, None]
  i_n = nl.arange(N)[None, :]
  i_0 = nl.arange(1)[:, None]
  ov = nl.greater(nl.load(iou), iou_threshold, dtype=nl.float32)
  sup = nisa.affine_select(i_n - i_p > 0, ov, 0.0)
  flat = nl.ndarray((1, N * N), dtype=nl.float32, buffer=nl.sbuf)
  nisa.dma_copy(dst=flat, src=sup)   # row i of sup -> flat[0, i*N:(i+1)*N]
  keep = nl.greater(nl.load(scores.reshape((1, N))), score_threshold, dtype=nl.float32)
  for i in nl.sequential_range(N):
    hit = nl.multiply(flat[i_0, i * N + i_n], keep[i_0, i])
    keep[i_0, i_n] = nl.multiply(keep, nl.subtract(1.0, hit))
  nl.store(keep_out, value=keep)
  return iou, keep_out


@nki.jit
def roi_align(feat, coords, height, width):
  HW, C = feat.shape
  B, S, two = coords.shape
  assert HW == height * width and two == 2 and B % PMAX == 0
  out = nl.ndarray((B, C), dtype=nl.float32, buffer=nl.shared_hbm)
  i_p = nl.arange(PMAX)[:, None]
  i_c = nl.arange(C)[None, :]
  i_s = nl.arange(S)[None, :]
  for t in nl.affine_range(B // PMAX):
    yx = nl.ndarray((nl.par_dim(PMAX), 2, S), dtype=nl.float32, buffer=nl.sbuf)
    for d in nl.affine_range(2):
      yx[i_p, d, i_s] = nl.load(coords[t * PMAX + i_p, i_s, d])
    # clamp into the map, corners and fractions (torchvision bilinear_interpolate for in-range samples)
    y = nl.minimum(nl.maximum(yx[i_p, 0, i_s], 0.0), float(height - 1))
    x = nl.minimum(nl.maximum(yx[i_p, 1, i_s], 0.0), float(width - 1))
    y0 = nl.floor(y)
    x0 = nl.floor(x)
    y1 = nl.minimum(nl.add(y0, 1.0), float(height - 1))
    x1 = nl.minimum(nl.add(x0, 1.0), float(width - 1))
    ly = nl.subtract(y, y0)
    lx = nl.subtract(x, x0)
    hy = nl.subtract(1.0, ly)
    hx = nl.subtract(1.0, lx)
    r0 = nl.multiply(y0, float(width))
    r1 = nl.multiply(y1, float(width))
    corners = ((r0, x0, hy, hx), (r0, x1, hy, lx), (r1, x0, ly, hx), (r1, x1, ly, lx))
    acc = nl.zeros((nl.par_dim(PMAX), C), dtype=nl.float32, buffer=nl.sbuf)
    for s in nl.static_range(S):
      for (r, c, wy, wx) in corners:
        idx = nl.add(r[i_p, s], c[i_p, s], dtype=nl.int32)   # [128, 1] row of the corner pixel
        w = nl.multiply(wy[i_p, s], wx[i_p, s])              # [128, 1] its weight
        v = nl.load(feat[idx[i_p, 0], i_c])
        acc[...] = nl.add(acc, nl.multiply(v, w))
    nl.store(out[t * PMAX + i_p, i_c], value=nl.multiply(acc, 1.0 / S))
  return out


@nki.jit
def pixel_shuffle_b1(x, r):
  CRR, H, W = x.shape
  C = CRR // (r * r)
  out = nl.ndarray((C, H * r, W * r), dtype=x.dtype, buffer=nl.shared_hbm)
  g = nl.mgrid[0:PMAX, 0:W, 0:r]
  for c in nl.affine_range(C):
    for ht in nl.affine_range((H + PMAX - 1) // PMAX):
      rows = ht * PMAX + g.p
      for i in nl.static_range(r):
        t = nl.load(x[c * r * r + i * r + g.y, rows, g.x], mask=(rows < H))
        nl.store(out[c, rows * r + i, g.x * r + g.y], value=t, mask=(rows < H))
  return out
