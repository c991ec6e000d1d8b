"""Vision preprocessing layout kernels in the new NKI dialect (``import nki``, ISA calls writing ``dst=``, tensor
views), written the way public NKI 0.3+ kernels are:

- ``pixel_shuffle(x, r)``: depth-to-space, [C r r, H, W] -> [C, H r, W r] with out[c, h r + i, w r + j] =
  x[c r r + i r + j, h, w]. Per channel and tile of 128 rows h: one DMA of the r r planes with h on the partitions
  (an HBM ``permute`` view, [h, i, j, w]), one on-chip ``tensor_copy`` interleaving the columns (source view
  ``permute`` (h, i, w, j)), and one store of r full output rows per partition (contiguous: the output viewed by
  ``rearrange`` as [h, i, w, j]).
- ``pixel_shuffle_dma(x, r)``: the same by DMA alone, one HBM -> HBM copy per channel through ``rearrange`` views
  (element-granular on the output side).
- ``space_to_depth(y, r)``: the inverse, [C, H r, W r] -> [C r r, H, W]: contiguous row loads, the de-interleave
  as a ``tensor_copy`` into a permuted destination view, a store through a permuted HBM view.
- ``rgb_to_yuv(img)``: BT.601 full range (JPEG) colour conversion of an interleaved [H, W, 3] uint8 image, rows on
  the partitions: the channels as stride-3 views of the fp32 copy, each output channel by ``tensor_scalar`` +
  two ``scalar_tensor_tensor`` (multiply-add by the coefficients), then + offset + 0.5, clamp to [0, 255] and the
  conversion to uint8 written straight into the interleaved output tile (round half up: the float -> int
  conversion truncates).
- ``rgb_to_yuv_planar(img, coef, offset)``: the same on a planar [3, H, W] image as a 3x3 matmul (channels on the
  partitions, contraction over 3), 512 pixels per PSUM tile; the offset (+ 0.5) is a per-partition column.

Written for nsim's tests in the style of those kernels; not copies of any file. No nsim imports.
"""
import nki
import nki.isa as nisa
import nki.language as nl

P_MAX = 128
# BT.601 full range: Y, Cb, Cr rows; offsets 0, 128, 128
YUV = ((0.299, 0.587, 0.114), (-0.168736, -0.331264, 0.5), (0.5, -0.418688, -0.081312))
YUV_OFF = (0.0, 128.0, 128.0)


@nki.jit
def pixel_shuffle(x, r):
  CRR, H, W = x.shape
  C = CRR // (r * r)
  out = nl.ndarray((C, H * r, W * r), dtype=x.dtype, buffer=nl.shared_hbm)
  for c in nl.affine_range(C):
    for ht in nl.affine_range((H + P_MAX - 1) // P_MAX):
      h0 = ht * P_MAX
      hs = min(P_MAX, H - h0)
      src = x[c * r * r:(c + 1) * r * r, h0:h0 + hs, :].reshape((r, r, hs, W)).permute((2, 0, 1, 3))
      t_in = nl.ndarray((P_MAX, r, r, W), dtype=x.dtype, buffer=nl.sbuf)   # [h, i, j, w]
      nisa.dma_copy(dst=t_in[:hs], src=src)
      t_out = nl.ndarray((P_MAX, r, W, r), dtype=x.dtype, buffer=nl.sbuf)  # [h, i, w, j]
      nisa.tensor_copy(dst=t_out[:hs], src=t_in[:hs].permute((0, 1, 3, 2)))
      dst = out[c, h0 * r:(h0 + hs) * r, :].rearrange((('h', 'i'), ('w', 'j')), ('h', 'i', 'w', 'j'),
                                                        {'i': r, 'j': r})
      nisa.dma_copy(dst=dst, src=t_out[:hs])
  return out


@nki.jit
def pixel_shuffle_dma(x, r):
  CRR, H, W = x.shape
  C = CRR // (r * r)
  out = nl.ndarray((C, H * r, W * r), dtype=x.dtype, buffer=nl.shared_hbm)
  for c in nl.affine_range(C):
    dst = out[c].rearrange((('h', 'i'), ('w', 'j')), ('i', 'j', 'h', 'w'), {'i': r, 'j': r})
    nisa.dma_copy(dst=dst, src=x[c * r * r:(c + 1) * r * r, :, :].reshape((r, r, H, W)))
  return out


@nki.jit
def space_to_depth(y, r):
  C, HR, WR = y.shape
  H, W = HR // r, WR // r
  out = nl.ndarray((C * r * r, H, W), dtype=y.dtype, buffer=nl.shared_hbm)
  for c in nl.affine_range(C):
    for ht in nl.affine_range((H + P_MAX - 1) // P_MAX):
      h0 = ht * P_MAX
      hs = min(P_MAX, H - h0)
      t_in = nl.ndarray((P_MAX, r, W, r), dtype=y.dtype, buffer=nl.sbuf)   # [h, i, w, j]: r rows per partition
      src = y[c, h0 * r:(h0 + hs) * r, :].rearrange((('h', 'i'), ('w', 'j')), ('h', 'i', 'w', 'j'),
                                                      {'i': r, 'j': r})
      nisa.dma_copy(dst=t_in[:hs], src=src)
      t_out = nl.ndarray((P_MAX, r, r, W), dtype=y.dtype, buffer=nl.sbuf)  # [h, i, j, w]
      nisa.tensor_copy(dst=t_out[:hs].permute((0, 1, 3, 2)), src=t_in[:hs])
      dst = out[c * r * r:(c + 1) * r * r, h0:h0 + hs, :].reshape((r, r, hs, W)).permute((2, 0, 1, 3))
      nisa.dma_copy(dst=dst, src=t_out[:hs])
  return out


@nki.jit
def rgb_to_yuv(img):
  H, W, three = img.shape
  assert three == 3
  out = nl.ndarray((H, W, 3), dtype=nl.uint8, buffer=nl.shared_hbm)
  for ht in nl.affine_range((H + P_MAX - 1) // P_MAX):
    h0 = ht * P_MAX
    hs = min(P_MAX, H - h0)
    px = nl.ndarray((P_MAX, W, 3), dtype=img.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=px[:hs], src=img[h0:h0 + hs, :, :])
    xf = nl.ndarray((P_MAX, W, 3), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=xf[:hs], src=px[:hs])
    res = nl.ndarray((P_MAX, W, 3), dtype=nl.uint8, buffer=nl.sbuf)
    acc = nl.ndarray((P_MAX, W), dtype=nl.float32, buffer=nl.sbuf)
    for ch in nl.static_range(3):
      a, b, c = YUV[ch]
      nisa.tensor_scalar(dst=acc[:hs], data=xf[:hs, :, 0], op0=nl.multiply, operand0=a)
      nisa.scalar_tensor_tensor(dst=acc[:hs], data=xf[:hs, :, 1], op0=nl.multiply, operand0=b, op1=nl.add,
                                operand1=acc[:hs])
      nisa.scalar_tensor_tensor(dst=acc[:hs], data=xf[:hs, :, 2], op0=nl.multiply, operand0=c, op1=nl.add,
                                operand1=acc[:hs])
      # + offset, round half up (the conversion truncates), clamp to [0, 255]
      nisa.tensor_scalar(dst=acc[:hs], data=acc[:hs], op0=nl.add, operand0=YUV_OFF[ch] + 0.5, op1=nl.maximum,
                         operand1=0.0)
      nisa.tensor_scalar(dst=res[:hs, :, ch], data=acc[:hs], op0=nl.minimum, operand0=255.0)
    nisa.dma_copy(dst=out[h0:h0 + hs, :, :], src=res[:hs])
  return out


@nki.jit
def rgb_to_yuv_planar(img, coef, offset):
  """img [3, H, W] uint8 (planar), coef [3, 3] fp32 = the conversion matrix transposed (coef[k, m]: input channel
  k's weight in output channel m), offset [3, 1] fp32 (added before the clamp; include the + 0.5 of rounding)."""
  three, H, W = img.shape
  NPIX = H * W
  FT = 512
  assert three == 3 and NPIX % FT == 0
  out = nl.ndarray((3, H, W), dtype=nl.uint8, buffer=nl.shared_hbm)
  src = img.reshape((3, NPIX))
  dst = out.reshape((3, NPIX))
  c_sb = nl.ndarray((3, 3), dtype=nl.float32, buffer=nl.sbuf)
  nisa.dma_copy(dst=c_sb, src=coef)
  o_sb = nl.ndarray((3, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.dma_copy(dst=o_sb, src=offset)
  for t in nl.affine_range(NPIX // FT):
    px = nl.ndarray((3, FT), dtype=img.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=px, src=src[:, t * FT:(t + 1) * FT])
    xf = nl.ndarray((3, FT), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=xf, src=px)
    ps = nl.ndarray((3, FT), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=ps, stationary=c_sb, moving=xf)
    y = nl.ndarray((3, FT), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=y, data=ps, op0=nl.add, operand0=o_sb, op1=nl.maximum, operand1=0.0)
    res = nl.ndarray((3, FT), dtype=nl.uint8, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=res, data=y, op0=nl.minimum, operand0=255.0)
    nisa.dma_copy(dst=dst[:, t * FT:(t + 1) * FT], src=res)
  return out
