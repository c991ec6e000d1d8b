"""MX (microscaling) and FP8 GEMM / MLP kernels for Trainium3 in the new NKI dialect (``import nki``, ISA calls
writing ``dst=``), written the way public NKI 0.6 MX / FP8 kernels for trn3 are:

- ``mx_gemm(x, w_q, w_scale)``: out[M, N] (bf16) = x[M, K] (bf16) @ W[K, N] with on-chip MX quantization of the
  activations and pre-quantized MX weights from HBM. Per token tile (<= 128) and 512-value K tile: one 3-D
  ``nisa.dma_transpose`` (src ``x.ap`` [q, m, k]) into the interleaved bf16 tile [kp, M, 4] (slot q of packed
  row k = contraction index kt*512 + q*kp + k), ``nisa.quantize_mx`` to ``float8_e4m3fn_x4`` plus the E8M0 scale
  tile; then per 512-column N tile the ``nc_matmul_mx`` chain over the K tiles (activations stationary, weights
  moving, K-split accumulation in one fp32 PSUM bank), evicted to bf16 and stored. Under LNC = 2
  (``mx_gemm[2]``) the two cores take alternate N tiles. Weights: packed x4 bits
  [K/4, N] (uint32 on the host, ``.view``-ed) and compact scales [K/32, N] (uint8; row = 8-packed-row group),
  each K tile's 16 scale rows DMA-ed into the quadrant layout (group g -> partition (g // 4) * 32 + g % 4).
  Host bits as uint16 select MXFP4 weights (``float4_e2m1fn_x4``, four e2m1 per 2 bytes) against the MXFP8
  activations. ``n_tile`` (up to 4096 with fp32 PSUM, 8192 with ``acc_dtype=bf16`` on trn3) and ``acc_dtype``
  set the moving width of each matmul and the PSUM accumulator type. Scales may come as uint8 bytes or as
  ``float8_e8m0fnu`` (the scale tiles take the host's scale dtype).
- ``mx_mlp(x, wg_q, wg_s, wu_q, wu_s, wd_q, wd_s)``: SwiGLU MLP out = (silu(x Wg) * (x Wu)) Wd in MX fp8, for
  decode (M small) and prefill (M = 512+, token chunks of 512 = one PSUM bank of fp32). Gate / up put the weights
  stationary and the quantized activations moving, so their PSUM results are [I rows, tokens]: intermediate
  neuron on the partitions, which is already the contraction layout the down projection needs. SwiGLU
  (``activation(silu)`` on ScalarE + ``tensor_tensor`` multiply reading the up PSUM) writes I tile it straight
  into slot q = it % 4 of the interleaved bf16 tile of down K tile it // 4, so one ``quantize_mx`` per 512
  intermediate values prepares the down projection (quantized intermediate stationary, Wd moving, output
  [tokens, H] in natural layout). Weights and their scales are loaded once.
- ``bf16_mlp(x, wg, wu, wd)``: the same MLP in bf16 with ``nc_matmul`` (K = 128 per instruction), the baseline
  of the MX timing comparison.
- ``fp8_gemm(x_q, x_scale, w_q, w_scale)``: out = (x_q * x_scale) @ (w_q * w_scale) with float8_e4m3fn
  operands pre-quantized on the host (x transposed, [K, M]; a per-row (token) scale [M, 1] fp32 and a per-tensor
  weight scale, a Python float), ``nc_matmul`` of fp8 on trn3 accumulated over 128-row K tiles, dequantized on
  eviction by one ``tensor_scalar`` (row scale, then the tensor scale). ``double_row=True``: the fp8 perf mode,
  K = 256 per matmul (``[128, 2, M]`` x ``[128, 2, N]``, rows 256 j + 128 r + k).

Written for nsim's tests in the style of those kernels; not copies of any file. No nsim imports.
"""
import nki
import nki.isa as nisa
import nki.language as nl

P = 128           # partitions; packed contraction rows per MX matmul
KB = 4 * P        # contraction values per nc_matmul_mx (128 packed rows x 4)
NB = 512          # moving columns per matmul: one 2 KiB PSUM bank of fp32
MX = nl.float8_e4m3fn_x4
MX4 = nl.float4_e2m1fn_x4


def _load_mx_scales(dst, scale_hbm, kt, kp, c0, nc):
  """DMA the scale rows of K tile kt (kp packed rows: kp / 8 groups) for columns c0:c0+nc into the quadrant
  layout nc_matmul_mx reads: group g of the tile on partition (g // 4) * 32 + g % 4 of ``dst``."""
  groups = kp // 8
  g0 = kt * (P // 8)
  # The rows between the quadrants are never read by nc_matmul_mx; zeroing them (on the otherwise idle GpSimd)
  # keeps nsim's sanitizer from reporting them (a false W501, see test_unused_scale_rows_are_not_read).
  nisa.memset(dst=dst[:, :nc], value=0 if dst.dtype == nl.uint8 else 1.0, engine=nisa.engine.gpsimd)
  for j in nl.static_range((groups + 3) // 4):
    n = min(4, groups - 4 * j)
    nisa.dma_copy(dst=dst[32 * j:32 * j + n, :nc], src=scale_hbm[g0 + 4 * j:g0 + 4 * j + n, c0:c0 + nc])


def _quantize_act(xq, xs, x, m0, ms, kt, K):
  """Quantize x[m0:m0+ms, kt*512 : kt*512+4kp] (bf16) to MX: xq[:kp, :ms] x4 and its scales xs[:kp, :ms]."""
  kp = min(P, (K - kt * KB) // 4)
  xsrc = nl.ndarray((P, xq.shape[1], 4), dtype=x.dtype, buffer=nl.sbuf)
  # one 3-D DMA transpose: src [q, m, k] = x[m0 + m, kt*512 + q*kp + k] -> dst [k, m, q], contiguous per partition
  # (four 2-D transposes into the stride-4 slots would cost one DMA descriptor per 2-byte element)
  src = x.ap([[kp, 4], [K, ms], [1, kp]], offset=m0 * K + kt * KB)
  nisa.dma_transpose(dst=xsrc[:kp, :ms, :], src=src)
  nisa.quantize_mx(dst=xq[:kp, :ms], src=xsrc[:kp, :ms, :], dst_scale=xs[:kp, :ms])
  return kp


@nki.jit
def mx_gemm(x, w_q, w_scale, n_tile=NB, acc_dtype=nl.float32):
  NB = n_tile  # trn3: one matmul may stream up to 4096 (fp32 PSUM) / 8192 (bf16 PSUM) moving columns
  M, K = x.shape
  Kp, N = w_q.shape
  assert Kp * 4 == K, "w_q is [K / 4, N] packed"
  # packed host bits: uint32 = four e4m3fn (MXFP8 weights), uint16 = four e2m1fn (MXFP4 weights)
  w = w_q.view(MX4 if w_q.dtype.itemsize == 2 else MX)
  KT = (K + KB - 1) // KB
  out = nl.ndarray((M, N), dtype=nl.bfloat16, buffer=nl.shared_hbm)
  for mt in nl.affine_range((M + P - 1) // P):
    m0 = mt * P
    ms = min(P, M - m0)
    xq = nl.ndarray((P, KT, P), dtype=MX, buffer=nl.sbuf)
    xs = nl.ndarray((P, KT, P), dtype=w_scale.dtype, buffer=nl.sbuf)  # uint8 or float8_e8m0fnu, as the host's
    kps = []
    for kt in nl.static_range(KT):
      kps.append(_quantize_act(xq[:, kt, :], xs[:, kt, :], x, m0, ms, kt, K))
    # under LNC = 2 (``mx_gemm[2]``) the two cores take alternate N tiles; both quantize the activations
    for nt in nl.affine_range(nl.program_id(0), (N + NB - 1) // NB, nl.num_programs(0)):
      n0 = nt * NB
      ns = min(NB, N - n0)
      acc = nl.ndarray((P, NB), dtype=acc_dtype, buffer=nl.psum)
      for kt in nl.static_range(KT):
        kp = kps[kt]
        wt = nl.ndarray((P, NB), dtype=w.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=wt[:kp, :ns], src=w[kt * P:kt * P + kp, n0:n0 + ns])
        wsc = nl.ndarray((P, NB), dtype=w_scale.dtype, buffer=nl.sbuf)
        _load_mx_scales(wsc, w_scale, kt, kp, n0, ns)
        nisa.nc_matmul_mx(dst=acc[:ms, :ns], stationary=xq[:kp, kt, :ms], moving=wt[:kp, :ns],
                          stationary_scale=xs[:kp, kt, :ms], moving_scale=wsc[:kp, :ns])
      o = nl.ndarray((P, NB), dtype=nl.bfloat16, buffer=nl.sbuf)
      nisa.tensor_copy(dst=o[:ms, :ns], src=acc[:ms, :ns])
      nisa.dma_copy(dst=out[m0:m0 + ms, n0:n0 + ns], src=o[:ms, :ns])
  return out


def _load_mx_weight(w_q, w_s, K, ncols):
  """The whole packed weight [K/4, ncols] as [128, K/512, ncols] x4 plus its scales in the quadrant layout."""
  KT = K // KB
  w = w_q.view(MX)
  wsb = nl.ndarray((P, KT, ncols), dtype=MX, buffer=nl.sbuf)
  wsc = nl.ndarray((P, KT, ncols), dtype=nl.uint8, buffer=nl.sbuf)
  for kt in nl.static_range(KT):
    nisa.dma_copy(dst=wsb[:, kt, :], src=w[kt * P:(kt + 1) * P, :])
    _load_mx_scales(wsc[:, kt, :], w_s, kt, P, 0, ncols)
  return wsb, wsc


@nki.jit
def mx_mlp(x, wg_q, wg_s, wu_q, wu_s, wd_q, wd_s):
  M, H = x.shape
  I = wg_q.shape[1]
  assert H % KB == 0 and I % KB == 0 and wd_q.shape == (I // 4, H)
  HT, IT, DT = H // KB, I // P, I // KB
  MC = min(M, NB)  # tokens per chunk: the moving free size of gate / up
  out = nl.ndarray((M, H), dtype=nl.bfloat16, buffer=nl.shared_hbm)
  wg, wgs = _load_mx_weight(wg_q, wg_s, H, I)
  wu, wus = _load_mx_weight(wu_q, wu_s, H, I)
  wd, wds = _load_mx_weight(wd_q, wd_s, I, H)
  for c in nl.affine_range((M + MC - 1) // MC):
    m0 = c * MC
    mc = min(MC, M - m0)
    xq = nl.ndarray((P, HT, MC), dtype=MX, buffer=nl.sbuf)
    xs = nl.ndarray((P, HT, MC), dtype=nl.uint8, buffer=nl.sbuf)
    for kt in nl.static_range(HT):
      _quantize_act(xq[:, kt, :], xs[:, kt, :], x, m0, mc, kt, H)
    # gate / up: [I tile rows, tokens]; SwiGLU into the interleaved down-projection input
    hsrc = nl.ndarray((P, DT, MC, 4), dtype=nl.bfloat16, buffer=nl.sbuf)
    for it in nl.affine_range(IT):
      g = nl.ndarray((P, MC), dtype=nl.float32, buffer=nl.psum)
      u = nl.ndarray((P, MC), dtype=nl.float32, buffer=nl.psum)
      for kt in nl.static_range(HT):
        nisa.nc_matmul_mx(dst=g[:, :mc], stationary=wg[:, kt, it * P:(it + 1) * P], moving=xq[:, kt, :mc],
                          stationary_scale=wgs[:, kt, it * P:(it + 1) * P], moving_scale=xs[:, kt, :mc])
        nisa.nc_matmul_mx(dst=u[:, :mc], stationary=wu[:, kt, it * P:(it + 1) * P], moving=xq[:, kt, :mc],
                          stationary_scale=wus[:, kt, it * P:(it + 1) * P], moving_scale=xs[:, kt, :mc])
      gs = nl.ndarray((P, MC), dtype=nl.float32, buffer=nl.sbuf)
      nisa.activation(dst=gs[:, :mc], op=nl.silu, data=g[:, :mc])
      nisa.tensor_tensor(dst=hsrc[:, it // 4, :mc, it % 4], data1=gs[:, :mc], data2=u[:, :mc], op=nl.multiply)
    hq = nl.ndarray((P, DT, MC), dtype=MX, buffer=nl.sbuf)
    hs = nl.ndarray((P, DT, MC), dtype=nl.uint8, buffer=nl.sbuf)
    for dt in nl.static_range(DT):
      nisa.quantize_mx(dst=hq[:, dt, :mc], src=hsrc[:, dt, :mc, :], dst_scale=hs[:, dt, :mc])
    # down: quantized intermediate stationary ([I packed, tokens]), Wd moving -> [tokens, H]
    for mt in nl.affine_range((mc + P - 1) // P):
      t0 = mt * P
      ts = min(P, mc - t0)
      for ht in nl.affine_range((H + NB - 1) // NB):
        h0 = ht * NB
        hn = min(NB, H - h0)
        acc = nl.ndarray((P, NB), dtype=nl.float32, buffer=nl.psum)
        for dt in nl.static_range(DT):
          nisa.nc_matmul_mx(dst=acc[:ts, :hn], stationary=hq[:, dt, t0:t0 + ts], moving=wd[:, dt, h0:h0 + hn],
                            stationary_scale=hs[:, dt, t0:t0 + ts], moving_scale=wds[:, dt, h0:h0 + hn])
        o = nl.ndarray((P, NB), dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.tensor_copy(dst=o[:ts, :hn], src=acc[:ts, :hn])
        nisa.dma_copy(dst=out[m0 + t0:m0 + t0 + ts, h0:h0 + hn], src=o[:ts, :hn])
  return out


@nki.jit
def bf16_mlp(x, wg, wu, wd):
  M, H = x.shape
  I = wg.shape[1]
  assert H % P == 0 and I % P == 0 and wd.shape == (I, H)
  HT, IT = H // P, I // P
  MC = min(M, NB)
  out = nl.ndarray((M, H), dtype=nl.bfloat16, buffer=nl.shared_hbm)
  wgs = nl.ndarray((P, HT, I), dtype=nl.bfloat16, buffer=nl.sbuf)
  wus = nl.ndarray((P, HT, I), dtype=nl.bfloat16, buffer=nl.sbuf)
  wds = nl.ndarray((P, IT, H), dtype=nl.bfloat16, buffer=nl.sbuf)
  for kt in nl.static_range(HT):
    nisa.dma_copy(dst=wgs[:, kt, :], src=wg[kt * P:(kt + 1) * P, :])
    nisa.dma_copy(dst=wus[:, kt, :], src=wu[kt * P:(kt + 1) * P, :])
  for kt in nl.static_range(IT):
    nisa.dma_copy(dst=wds[:, kt, :], src=wd[kt * P:(kt + 1) * P, :])
  for c in nl.affine_range((M + MC - 1) // MC):
    m0 = c * MC
    mc = min(MC, M - m0)
    xT = nl.ndarray((P, HT, MC), dtype=nl.bfloat16, buffer=nl.sbuf)
    for kt in nl.static_range(HT):
      nisa.dma_transpose(dst=xT[:, kt, :mc], src=x[m0:m0 + mc, kt * P:(kt + 1) * P])
    h = nl.ndarray((P, IT, MC), dtype=nl.bfloat16, buffer=nl.sbuf)
    for it in nl.affine_range(IT):
      g = nl.ndarray((P, MC), dtype=nl.float32, buffer=nl.psum)
      u = nl.ndarray((P, MC), dtype=nl.float32, buffer=nl.psum)
      for kt in nl.static_range(HT):
        nisa.nc_matmul(dst=g[:, :mc], stationary=wgs[:, kt, it * P:(it + 1) * P], moving=xT[:, kt, :mc])
        nisa.nc_matmul(dst=u[:, :mc], stationary=wus[:, kt, it * P:(it + 1) * P], moving=xT[:, kt, :mc])
      gs = nl.ndarray((P, MC), dtype=nl.float32, buffer=nl.sbuf)
      nisa.activation(dst=gs[:, :mc], op=nl.silu, data=g[:, :mc])
      nisa.tensor_tensor(dst=h[:, it, :mc], data1=gs[:, :mc], data2=u[:, :mc], op=nl.multiply)
    for mt in nl.affine_range((mc + P - 1) // P):
      t0 = mt * P
      ts = min(P, mc - t0)
      for ht in nl.affine_range((H + NB - 1) // NB):
        h0 = ht * NB
        hn = min(NB, H - h0)
        acc = nl.ndarray((P, NB), dtype=nl.float32, buffer=nl.psum)
        for it in nl.static_range(IT):
          nisa.nc_matmul(dst=acc[:ts, :hn], stationary=h[:, it, t0:t0 + ts], moving=wds[:, it, h0:h0 + hn])
        o = nl.ndarray((P, NB), dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.tensor_copy(dst=o[:ts, :hn], src=acc[:ts, :hn])
        nisa.dma_copy(dst=out[m0 + t0:m0 + t0 + ts, h0:h0 + hn], src=o[:ts, :hn])
  return out


@nki.jit
def fp8_gemm(x_q, x_scale, w_q, w_scale, double_row=False):
  K, M = x_q.shape
  N = w_q.shape[1]
  assert K % P == 0 and M <= P and x_scale.shape == (M, 1)
  KT = K // P
  if double_row:  # trn2+/trn3 fp8 perf mode: K = 256 per matmul as [128, 2, M] x [128, 2, N]
    assert KT % 2 == 0
  out = nl.ndarray((M, N), dtype=nl.bfloat16, buffer=nl.shared_hbm)
  xs = nl.ndarray((M, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.dma_copy(dst=xs, src=x_scale)
  xt = nl.ndarray((P, KT, M), dtype=x_q.dtype, buffer=nl.sbuf)
  for kt in nl.static_range(KT):
    nisa.dma_copy(dst=xt[:, kt, :], src=x_q[kt * P:(kt + 1) * P, :])
  for nt in nl.affine_range((N + NB - 1) // NB):
    n0 = nt * NB
    ns = min(NB, N - n0)
    acc = nl.ndarray((M, NB), dtype=nl.float32, buffer=nl.psum)
    if double_row:
      for j in nl.static_range(KT // 2):
        wt2 = nl.ndarray((P, 2, NB), dtype=w_q.dtype, buffer=nl.sbuf)
        # rows 256 j + 128 r + k of w -> [k, r, n]
        nisa.dma_copy(dst=wt2[:, :, :ns], src=w_q.ap([[N, P], [P * N, 2], [1, ns]], offset=2 * j * P * N + n0))
        nisa.nc_matmul(dst=acc[:, :ns], stationary=xt[:, 2 * j:2 * j + 2, :], moving=wt2[:, :, :ns],
                       perf_mode=nisa.matmul_perf_mode.double_row)
    else:
      for kt in nl.static_range(KT):
        wt = nl.ndarray((P, NB), dtype=w_q.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=wt[:, :ns], src=w_q[kt * P:(kt + 1) * P, n0:n0 + ns])
        nisa.nc_matmul(dst=acc[:, :ns], stationary=xt[:, kt, :], moving=wt[:, :ns])
    o = nl.ndarray((M, NB), dtype=nl.bfloat16, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=o[:, :ns], data=acc[:, :ns], op0=nl.multiply, operand0=xs, op1=nl.multiply,
                       operand1=float(w_scale))
    nisa.dma_copy(dst=out[:, n0:n0 + ns], src=o[:, :ns])
  return out
