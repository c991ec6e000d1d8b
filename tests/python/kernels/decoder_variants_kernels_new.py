"""Decoder-layer variants of recent open LLMs in the new NKI dialect (``import nki``, ISA calls writing ``dst=``),
written the way public NKI 0.3+ kernels (nki-library, NxD-Inference ports) are: ragged tails by ``min()``-clamped
slices, PSUM accumulation by repeated ``nc_matmul`` into one PSUM tile, masks by ``nisa.affine_select``:

- ``sink_attention(q, k, v, sinks, window=0)``: GPT-OSS-style causal attention with a learned per-head sink
  logit: softmax over [scores_i, sink_h] with the sink's column dropped, i.e. the sink only joins the
  denominator. Flash style over key blocks of 128: the sink is the online softmax's initial state (running max
  m = sink_h, running sum l = 1, accumulator 0). ``window=W`` (GPT-OSS's banded layers): query i sees keys
  i - W + 1 .. i; blocks wholly outside the window or above the diagonal are skipped, and only the partial ones
  are masked (``affine_select``: the diagonal block causally, the window's first block at its far edge).
  q, k [H, d, S] (transposed layout), v [H, S, d], sinks [1, H] fp32; any S (the last query / key tiles ragged).
- ``swa_flash_range_select(q, k, v, window=0)``: Mistral-style sliding-window causal attention (flash over key
  blocks of 128, blocks outside the window skipped) with the mask and the block's row max fused in one
  ``nisa.range_select`` per block (per-partition bounds q_pos - W < key <= q_pos from ``nisa.iota``, masked keys
  FP32_MIN). Layouts as sink_attention.
- ``qk_norm_rope(x, w_qkv, q_norm_w, k_norm_w, cos, sin, n_q_heads, n_kv_heads, eps)``: Qwen3 / OLMo-2 style
  attention input: the fused QKV projection x @ w_qkv (x [T, D], D % 128 == 0, w_qkv [D, (Hq + 2 Hkv) d],
  d = 128) accumulated over D / 128 chunks in PSUM (the token tile transposed on the PE), then, fused with the
  PSUM output tile, per-head RMSNorm of q and k (sum of squares on ScalarE straight from PSUM, weights
  q_norm_w / k_norm_w [1, d]) followed by rotate-half RoPE (cos, sin [T, d / 2]). Returns q [T, Hq d],
  k [T, Hkv d], v [T, Hkv d] (x.dtype). Any T (the last token tile ragged).
- ``geglu_mlp(x, w_gate, w_up, w_down)``: Gemma's GeGLU MLP (gelu_tanh(x W_gate) * (x W_up)) W_down. x [T, D]
  (D % 128 == 0, D <= 512), w_gate / w_up [D, I], w_down [I, D], I % 128 == 0. Per token tile (ragged last):
  the gate and up projections feature-major (hT [128 of I, tokens], accumulated over D / 128 in PSUM), the tanh
  GELU on the PSUM eviction, the product with up, and the down projection accumulated over the I / 128 tiles in
  one PSUM tile. ``geglu_mlp_unfused``: the same arithmetic with the activation h = gelu(g) * u written to an
  HBM scratch [I, T] by a first pass and read back by a second (the unfused two-kernel form).
- ``diff_attention(q, k, v, lam, norm_w, lambda_init, eps)``: DIFF Transformer attention:
  (softmax(Q1 K1^T s) - lam softmax(Q2 K2^T s)) V, causal, then the per-head GroupNorm of the reference
  implementation (an RMSNorm over the head's 2 d values, weight norm_w [1, 2 d]) times (1 - lambda_init).
  q, k [H, 2, d, S] (the two halves, transposed layout), v [H, S, 2 d]; S <= 512 (one PSUM bank of scores per
  query tile), any S (ragged last query / key tiles). lam is the per-layer lambda (host scalar).

Written for nsim's tests in the style of those kernels; not copies of any file. No nsim imports.
"""
import nki
import nki.isa as nisa
import nki.language as nl

P_MAX = 128
PSUM_FMAX = 512
NEG = -30000.0


# --------------------------------------------------------------------------------------------------
# GPT-OSS attention with learned sinks
# --------------------------------------------------------------------------------------------------

@nki.jit
def sink_attention(q, k, v, sinks, window=0):
  H, d, S = q.shape
  assert d <= P_MAX and tuple(sinks.shape) == (1, H)
  NT = (S + P_MAX - 1) // P_MAX
  scale = 1.0 / (d ** 0.5)
  out = nl.ndarray((H, S, d), dtype=q.dtype, buffer=nl.shared_hbm)

  # every head's sink logit on every partition (a stride-0 partition broadcast DMA)
  sink_sb = nl.ndarray((P_MAX, H), dtype=nl.float32, buffer=nl.sbuf)
  nisa.dma_copy(dst=sink_sb, src=sinks.ap([[0, P_MAX], [1, H]]))

  for h in nl.affine_range(H):
    for qi in nl.affine_range(NT):
      q0 = qi * P_MAX
      rows = min(P_MAX, S - q0)
      qT = nl.ndarray((d, P_MAX), dtype=q.dtype, buffer=nl.sbuf)
      nisa.dma_copy(dst=qT[:, :rows], src=q[h, :, q0:q0 + rows])
      # the sink as the initial state: m = sink, l = exp(sink - m) = 1, acc = 0
      m = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
      nisa.tensor_copy(dst=m[:rows], src=sink_sb[:rows, h:h + 1])
      l = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
      nisa.memset(dst=l[:rows], value=1.0)
      acc = nl.ndarray((P_MAX, d), dtype=nl.float32, buffer=nl.sbuf)
      nisa.memset(dst=acc[:rows], value=0.0)

      k_first = 0 if window <= 0 else max(0, (q0 - window + 1) // P_MAX)
      for ki in nl.sequential_range(k_first, qi + 1):
        k0 = ki * P_MAX
        kc = min(P_MAX, S - k0)
        kT = nl.ndarray((d, P_MAX), dtype=k.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=kT[:, :kc], src=k[h, :, k0:k0 + kc])
        v_sb = nl.ndarray((P_MAX, d), dtype=v.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=v_sb[:kc], src=v[h, k0:k0 + kc, :])
        s_ps = nl.ndarray((P_MAX, P_MAX), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=s_ps[:rows, :kc], stationary=qT[:, :rows], moving=kT[:, :kc])
        s = nl.ndarray((P_MAX, P_MAX), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=s[:rows, :kc], data=s_ps[:rows, :kc], op0=nl.multiply, operand0=scale)
        if ki == qi:  # diagonal block: keep (q0 + p) - (k0 + j) >= 0
          nisa.affine_select(dst=s[:rows, :kc], pattern=[[-1, kc]], channel_multiplier=1,
                             on_true_tile=s[:rows, :kc], on_false_value=NEG, cmp_op=nl.greater_equal,
                             offset=q0 - k0)
        if window > 0 and k0 < q0 + rows - window:  # the window's far edge crosses this block: keep
          # (k0 + j) - (q0 + p) + W > 0
          nisa.affine_select(dst=s[:rows, :kc], pattern=[[1, kc]], channel_multiplier=-1,
                             on_true_tile=s[:rows, :kc], on_false_value=NEG, cmp_op=nl.greater,
                             offset=k0 - q0 + window)

        bmax = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=bmax[:rows], op=nl.maximum, data=s[:rows, :kc], axis=1)
        m_new = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=m_new[:rows], data1=m[:rows], data2=bmax[:rows], op=nl.maximum)
        neg_m = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=neg_m[:rows], data=m_new[:rows], op0=nl.multiply, operand0=-1.0)
        alpha = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=alpha[:rows], op=nl.exp, data=m[:rows], bias=neg_m[:rows])
        p = nl.ndarray((P_MAX, P_MAX), dtype=v.dtype, buffer=nl.sbuf)
        rsum = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=p[:rows, :kc], op=nl.exp, data=s[:rows, :kc], bias=neg_m[:rows],
                        reduce_op=nl.add, reduce_res=rsum[:rows], reduce_cmd=nisa.reduce_cmd.reset_reduce)
        nisa.scalar_tensor_tensor(dst=l[:rows], data=l[:rows], op0=nl.multiply, operand0=alpha[:rows],
                                  op1=nl.add, operand1=rsum[:rows])
        nisa.tensor_copy(dst=m[:rows], src=m_new[:rows])

        pT_ps = nl.ndarray((P_MAX, P_MAX), dtype=v.dtype, buffer=nl.psum)
        nisa.nc_transpose(dst=pT_ps[:kc, :rows], data=p[:rows, :kc])
        pT = nl.ndarray((P_MAX, P_MAX), dtype=v.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=pT[:kc, :rows], src=pT_ps[:kc, :rows])
        pv_ps = nl.ndarray((P_MAX, d), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=pv_ps[:rows], stationary=pT[:kc, :rows], moving=v_sb[:kc])
        nisa.scalar_tensor_tensor(dst=acc[:rows], data=acc[:rows], op0=nl.multiply, operand0=alpha[:rows],
                                  op1=nl.add, operand1=pv_ps[:rows])

      inv_l = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
      nisa.reciprocal(dst=inv_l[:rows], data=l[:rows])
      o = nl.ndarray((P_MAX, d), dtype=q.dtype, buffer=nl.sbuf)
      nisa.tensor_scalar(dst=o[:rows], data=acc[:rows], op0=nl.multiply, operand0=inv_l[:rows])
      nisa.dma_copy(dst=out[h, q0:q0 + rows, :], src=o[:rows])
  return out


@nki.jit
def swa_flash_range_select(q, k, v, window=0):
  """Mistral-style sliding-window causal attention (``window=0``: full causal), flash style over key blocks of
  128, the mask and the block's row max fused in one ``nisa.range_select`` per visited block: key index
  range_start + j kept where q_pos - W < k0 + j <= q_pos (per-partition bounds from ``nisa.iota``), masked keys
  FP32_MIN. Blocks wholly before the window or above the diagonal are skipped. q, k [H, d, S], v [H, S, d], any S."""
  H, d, S = q.shape
  assert d <= P_MAX
  NT = (S + P_MAX - 1) // P_MAX
  scale = 1.0 / (d ** 0.5)
  W = window if window > 0 else S + 1
  out = nl.ndarray((H, S, d), dtype=q.dtype, buffer=nl.shared_hbm)

  for qi in nl.affine_range(NT):
    q0 = qi * P_MAX
    rows = min(P_MAX, S - q0)
    # the query positions q0 + p and the window's lower bound q0 + p - W, one per partition
    hi = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.iota(dst=hi, pattern=[[0, 1]], offset=q0, channel_multiplier=1)
    lo = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=lo, data=hi, op0=nl.add, operand0=float(-W))
    k_first = max(0, (q0 - W + 1) // P_MAX)
    for h in nl.affine_range(H):
      qT = nl.ndarray((d, P_MAX), dtype=q.dtype, buffer=nl.sbuf)
      nisa.dma_copy(dst=qT[:, :rows], src=q[h, :, q0:q0 + rows])
      m = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
      nisa.memset(dst=m[:rows], value=NEG)
      l = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
      nisa.memset(dst=l[:rows], value=0.0)
      acc = nl.ndarray((P_MAX, d), dtype=nl.float32, buffer=nl.sbuf)
      nisa.memset(dst=acc[:rows], value=0.0)
      for ki in nl.sequential_range(k_first, qi + 1):
        k0 = ki * P_MAX
        kc = min(P_MAX, S - k0)
        kT = nl.ndarray((d, P_MAX), dtype=k.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=kT[:, :kc], src=k[h, :, k0:k0 + kc])
        v_sb = nl.ndarray((P_MAX, d), dtype=v.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=v_sb[:kc], src=v[h, k0:k0 + kc, :])
        s_ps = nl.ndarray((P_MAX, P_MAX), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=s_ps[:rows, :kc], stationary=qT[:, :rows], moving=kT[:, :kc])
        s = nl.ndarray((P_MAX, P_MAX), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=s[:rows, :kc], data=s_ps[:rows, :kc], op0=nl.multiply, operand0=scale)
        sm = nl.ndarray((P_MAX, P_MAX), dtype=nl.float32, buffer=nl.sbuf)
        bmax = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.range_select(dst=sm[:rows, :kc], on_true_tile=s[:rows, :kc], comp_op0=nl.greater,
                          comp_op1=nl.less_equal, bound0=lo[:rows], bound1=hi[:rows],
                          reduce_cmd=nisa.reduce_cmd.reset_reduce, reduce_res=bmax[:rows], reduce_op=nl.maximum,
                          range_start=k0, on_false_value=nl.fp32.min)
        m_new = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=m_new[:rows], data1=m[:rows], data2=bmax[:rows], op=nl.maximum)
        neg_m = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=neg_m[:rows], data=m_new[:rows], op0=nl.multiply, operand0=-1.0)
        alpha = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=alpha[:rows], op=nl.exp, data=m[:rows], bias=neg_m[:rows])
        p = nl.ndarray((P_MAX, P_MAX), dtype=v.dtype, buffer=nl.sbuf)
        rsum = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=p[:rows, :kc], op=nl.exp, data=sm[:rows, :kc], bias=neg_m[:rows],
                        reduce_op=nl.add, reduce_res=rsum[:rows], reduce_cmd=nisa.reduce_cmd.reset_reduce)
        nisa.scalar_tensor_tensor(dst=l[:rows], data=l[:rows], op0=nl.multiply, operand0=alpha[:rows],
                                  op1=nl.add, operand1=rsum[:rows])
        nisa.tensor_copy(dst=m[:rows], src=m_new[:rows])
        pT_ps = nl.ndarray((P_MAX, P_MAX), dtype=v.dtype, buffer=nl.psum)
        nisa.nc_transpose(dst=pT_ps[:kc, :rows], data=p[:rows, :kc])
        pT = nl.ndarray((P_MAX, P_MAX), dtype=v.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=pT[:kc, :rows], src=pT_ps[:kc, :rows])
        pv_ps = nl.ndarray((P_MAX, d), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=pv_ps[:rows], stationary=pT[:kc, :rows], moving=v_sb[:kc])
        nisa.scalar_tensor_tensor(dst=acc[:rows], data=acc[:rows], op0=nl.multiply, operand0=alpha[:rows],
                                  op1=nl.add, operand1=pv_ps[:rows])
      inv_l = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
      nisa.reciprocal(dst=inv_l[:rows], data=l[:rows])
      o = nl.ndarray((P_MAX, d), dtype=q.dtype, buffer=nl.sbuf)
      nisa.tensor_scalar(dst=o[:rows], data=acc[:rows], op0=nl.multiply, operand0=inv_l[:rows])
      nisa.dma_copy(dst=out[h, q0:q0 + rows, :], src=o[:rows])
  return out


# --------------------------------------------------------------------------------------------------
# Qwen3 / OLMo-2 QK-norm fused with the QKV projection, then RoPE
# --------------------------------------------------------------------------------------------------

def _load_x_transposed(x, t0, rows, KD):
  """The token tile x[t0:t0 + rows, :] transposed into SBUF [128, KD, 128] (contraction chunks on the
  partitions) through the PE."""
  x_sb = nl.ndarray((P_MAX, KD * P_MAX), dtype=x.dtype, buffer=nl.sbuf)
  nisa.dma_copy(dst=x_sb[:rows], src=x[t0:t0 + rows, :])
  xT = nl.ndarray((P_MAX, KD, P_MAX), dtype=x.dtype, buffer=nl.sbuf)
  for kd in nl.affine_range(KD):
    xT_ps = nl.ndarray((P_MAX, P_MAX), dtype=x.dtype, buffer=nl.psum)
    nisa.nc_transpose(dst=xT_ps[:, :rows], data=x_sb[:rows, kd * P_MAX:(kd + 1) * P_MAX])
    nisa.tensor_copy(dst=xT[:, kd, :rows], src=xT_ps[:, :rows])
  return xT


@nki.jit
def qk_norm_rope(x, w_qkv, q_norm_w, k_norm_w, cos, sin, n_q_heads, n_kv_heads, eps=1e-6):
  T, D = x.shape
  D_, N = w_qkv.shape
  Hq, Hkv = n_q_heads, n_kv_heads
  d = N // (Hq + 2 * Hkv)
  half = d // 2
  assert D == D_ and D % P_MAX == 0 and d == P_MAX and N == (Hq + 2 * Hkv) * d
  KD = D // P_MAX
  HPC = PSUM_FMAX // d  # heads per PSUM tile (one bank of fp32)
  q_out = nl.ndarray((T, Hq * d), dtype=x.dtype, buffer=nl.shared_hbm)
  k_out = nl.ndarray((T, Hkv * d), dtype=x.dtype, buffer=nl.shared_hbm)
  v_out = nl.ndarray((T, Hkv * d), dtype=x.dtype, buffer=nl.shared_hbm)

  # weights resident in SBUF, contraction chunk kd on the partitions
  w_sb = nl.ndarray((P_MAX, KD, N), dtype=w_qkv.dtype, buffer=nl.sbuf)
  for kd in nl.affine_range(KD):
    nisa.dma_copy(dst=w_sb[:, kd, :], src=w_qkv[kd * P_MAX:(kd + 1) * P_MAX, :])
  # the norm weights on every partition (stride-0 broadcast DMAs)
  qn_w = nl.ndarray((P_MAX, d), dtype=nl.float32, buffer=nl.sbuf)
  nisa.dma_copy(dst=qn_w, src=q_norm_w.ap([[0, P_MAX], [1, d]]))
  kn_w = nl.ndarray((P_MAX, d), dtype=nl.float32, buffer=nl.sbuf)
  nisa.dma_copy(dst=kn_w, src=k_norm_w.ap([[0, P_MAX], [1, d]]))

  # (first head, number of heads, output tensor, its first head, norm weight or None) per region
  regions = [(0, Hq, q_out, qn_w), (Hq, Hkv, k_out, kn_w), (Hq + Hkv, Hkv, v_out, None)]

  for t in nl.affine_range((T + P_MAX - 1) // P_MAX):
    t0 = t * P_MAX
    rows = min(P_MAX, T - t0)
    xT = _load_x_transposed(x, t0, rows, KD)
    cos_sb = nl.ndarray((P_MAX, half), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=cos_sb[:rows], src=cos[t0:t0 + rows, :])
    sin_sb = nl.ndarray((P_MAX, half), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=sin_sb[:rows], src=sin[t0:t0 + rows, :])

    for h_first, n_heads, dst_hbm, norm_w in regions:
      for c0 in nl.static_range(0, n_heads, HPC):
        nh = min(HPC, n_heads - c0)
        n0 = (h_first + c0) * d
        ps = nl.ndarray((P_MAX, PSUM_FMAX), dtype=nl.float32, buffer=nl.psum)
        for kd in nl.affine_range(KD):
          nisa.nc_matmul(dst=ps[:rows, :nh * d], stationary=xT[:, kd, :rows], moving=w_sb[:, kd, n0:n0 + nh * d])
        o = nl.ndarray((P_MAX, PSUM_FMAX), dtype=x.dtype, buffer=nl.sbuf)
        if norm_w is None:  # v: plain eviction
          nisa.tensor_copy(dst=o[:rows, :nh * d], src=ps[:rows, :nh * d])
        else:
          for j in nl.static_range(nh):
            hs = ps[:rows, j * d:(j + 1) * d]
            # RMSNorm of the head, read from PSUM: rstd = (sum(x^2) / d + eps)^-1/2
            sq = nl.ndarray((P_MAX, d), dtype=nl.float32, buffer=nl.sbuf)
            ss = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.activation(dst=sq[:rows], op=nl.square, data=hs, reduce_op=nl.add, reduce_res=ss[:rows],
                            reduce_cmd=nisa.reduce_cmd.reset_reduce)
            rstd = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_scalar(dst=rstd[:rows], data=ss[:rows], op0=nl.multiply, operand0=1.0 / d, op1=nl.add,
                               operand1=eps)
            nisa.activation(dst=rstd[:rows], op=nl.rsqrt, data=rstd[:rows])
            xn = nl.ndarray((P_MAX, d), dtype=nl.float32, buffer=nl.sbuf)
            nisa.scalar_tensor_tensor(dst=xn[:rows], data=hs, op0=nl.multiply, operand0=rstd[:rows],
                                      op1=nl.multiply, operand1=norm_w[:rows])
            # rotate-half RoPE: [x1 cos - x2 sin, x2 cos + x1 sin]
            x1 = xn[:rows, 0:half]
            x2 = xn[:rows, half:d]
            a = nl.ndarray((P_MAX, half), dtype=nl.float32, buffer=nl.sbuf)
            b = nl.ndarray((P_MAX, half), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_tensor(dst=a[:rows], data1=x1, data2=cos_sb[:rows], op=nl.multiply)
            nisa.tensor_tensor(dst=b[:rows], data1=x2, data2=sin_sb[:rows], op=nl.multiply)
            nisa.tensor_tensor(dst=o[:rows, j * d:j * d + half], data1=a[:rows], data2=b[:rows], op=nl.subtract)
            nisa.tensor_tensor(dst=a[:rows], data1=x2, data2=cos_sb[:rows], op=nl.multiply)
            nisa.tensor_tensor(dst=b[:rows], data1=x1, data2=sin_sb[:rows], op=nl.multiply)
            nisa.tensor_tensor(dst=o[:rows, j * d + half:(j + 1) * d], data1=a[:rows], data2=b[:rows], op=nl.add)
        nisa.dma_copy(dst=dst_hbm[t0:t0 + rows, c0 * d:(c0 + nh) * d], src=o[:rows, :nh * d])
  return q_out, k_out, v_out


# --------------------------------------------------------------------------------------------------
# GeGLU MLP
# --------------------------------------------------------------------------------------------------

def _load_weights(w_gate, w_up, w_down, KD, KI, D, I):
  wg = nl.ndarray((P_MAX, KD, I), dtype=w_gate.dtype, buffer=nl.sbuf)
  wu = nl.ndarray((P_MAX, KD, I), dtype=w_up.dtype, buffer=nl.sbuf)
  for kd in nl.affine_range(KD):
    nisa.dma_copy(dst=wg[:, kd, :], src=w_gate[kd * P_MAX:(kd + 1) * P_MAX, :])
    nisa.dma_copy(dst=wu[:, kd, :], src=w_up[kd * P_MAX:(kd + 1) * P_MAX, :])
  wd = nl.ndarray((P_MAX, KI, D), dtype=w_down.dtype, buffer=nl.sbuf)
  for ki in nl.affine_range(KI):
    nisa.dma_copy(dst=wd[:, ki, :], src=w_down[ki * P_MAX:(ki + 1) * P_MAX, :])
  return wg, wu, wd


def _geglu_tile(xT, wg, wu, i, KD, rows, dtype):
  """hT [128 of I, rows] = gelu_tanh(W_gate[:, i]^T x^T) * (W_up[:, i]^T x^T) for intermediate tile i."""
  g_ps = nl.ndarray((P_MAX, P_MAX), dtype=nl.float32, buffer=nl.psum)
  u_ps = nl.ndarray((P_MAX, P_MAX), dtype=nl.float32, buffer=nl.psum)
  for kd in nl.affine_range(KD):
    nisa.nc_matmul(dst=g_ps[:, :rows], stationary=wg[:, kd, i * P_MAX:(i + 1) * P_MAX], moving=xT[:, kd, :rows])
    nisa.nc_matmul(dst=u_ps[:, :rows], stationary=wu[:, kd, i * P_MAX:(i + 1) * P_MAX], moving=xT[:, kd, :rows])
  g = nl.ndarray((P_MAX, P_MAX), dtype=nl.float32, buffer=nl.sbuf)
  nisa.activation(dst=g[:, :rows], op=nl.gelu_apprx_tanh, data=g_ps[:, :rows])
  hT = nl.ndarray((P_MAX, P_MAX), dtype=dtype, buffer=nl.sbuf)
  nisa.tensor_tensor(dst=hT[:, :rows], data1=g[:, :rows], data2=u_ps[:, :rows], op=nl.multiply)
  return hT


@nki.jit
def geglu_mlp(x, w_gate, w_up, w_down):
  T, D = x.shape
  I = w_gate.shape[1]
  assert D % P_MAX == 0 and D <= PSUM_FMAX and I % P_MAX == 0
  KD, KI = D // P_MAX, I // P_MAX
  out = nl.ndarray((T, D), dtype=x.dtype, buffer=nl.shared_hbm)
  wg, wu, wd = _load_weights(w_gate, w_up, w_down, KD, KI, D, I)
  for t in nl.affine_range((T + P_MAX - 1) // P_MAX):
    t0 = t * P_MAX
    rows = min(P_MAX, T - t0)
    xT = _load_x_transposed(x, t0, rows, KD)
    o_ps = nl.ndarray((P_MAX, D), dtype=nl.float32, buffer=nl.psum)
    for i in nl.affine_range(KI):
      hT = _geglu_tile(xT, wg, wu, i, KD, rows, x.dtype)
      nisa.nc_matmul(dst=o_ps[:rows], stationary=hT[:, :rows], moving=wd[:, i, :])
    o = nl.ndarray((P_MAX, D), dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=o[:rows], src=o_ps[:rows])
    nisa.dma_copy(dst=out[t0:t0 + rows, :], src=o[:rows])
  return out


@nki.jit
def geglu_mlp_unfused(x, w_gate, w_up, w_down):
  T, D = x.shape
  I = w_gate.shape[1]
  assert D % P_MAX == 0 and D <= PSUM_FMAX and I % P_MAX == 0
  KD, KI = D // P_MAX, I // P_MAX
  NT = (T + P_MAX - 1) // P_MAX
  out = nl.ndarray((T, D), dtype=x.dtype, buffer=nl.shared_hbm)
  h_hbm = nl.ndarray((I, T), dtype=x.dtype, buffer=nl.hbm)  # the activation, feature-major
  wg, wu, wd = _load_weights(w_gate, w_up, w_down, KD, KI, D, I)
  for t in nl.affine_range(NT):  # pass 1: h = gelu(x W_gate) * (x W_up) to HBM
    t0 = t * P_MAX
    rows = min(P_MAX, T - t0)
    xT = _load_x_transposed(x, t0, rows, KD)
    for i in nl.affine_range(KI):
      hT = _geglu_tile(xT, wg, wu, i, KD, rows, x.dtype)
      nisa.dma_copy(dst=h_hbm[i * P_MAX:(i + 1) * P_MAX, t0:t0 + rows], src=hT[:, :rows])
  for t in nl.affine_range(NT):  # pass 2: out = h W_down
    t0 = t * P_MAX
    rows = min(P_MAX, T - t0)
    o_ps = nl.ndarray((P_MAX, D), dtype=nl.float32, buffer=nl.psum)
    for i in nl.affine_range(KI):
      hT = nl.ndarray((P_MAX, P_MAX), dtype=x.dtype, buffer=nl.sbuf)
      nisa.dma_copy(dst=hT[:, :rows], src=h_hbm[i * P_MAX:(i + 1) * P_MAX, t0:t0 + rows])
      nisa.nc_matmul(dst=o_ps[:rows], stationary=hT[:, :rows], moving=wd[:, i, :])
    o = nl.ndarray((P_MAX, D), dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=o[:rows], src=o_ps[:rows])
    nisa.dma_copy(dst=out[t0:t0 + rows, :], src=o[:rows])
  return out


# --------------------------------------------------------------------------------------------------
# Differential attention
# --------------------------------------------------------------------------------------------------

def _softmax_rows(s_ps, rows, S, q0, scale):
  """Causal softmax of the score rows s_ps[:rows, :S] (PSUM) of queries q0 .. q0 + rows: SBUF fp32 [128, S]."""
  s = nl.ndarray((P_MAX, PSUM_FMAX), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_copy(dst=s[:rows, :S], src=s_ps[:rows, :S])
  nisa.affine_select(dst=s[:rows, :S], pattern=[[-1, S]], channel_multiplier=1, on_true_tile=s[:rows, :S],
                     on_false_value=NEG, cmp_op=nl.greater_equal, offset=q0)
  mx = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_reduce(dst=mx[:rows], op=nl.maximum, data=s[:rows, :S], axis=1, negate=True)
  neg_m = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.tensor_scalar(dst=neg_m[:rows], data=mx[:rows], op0=nl.multiply, operand0=scale)
  e = nl.ndarray((P_MAX, PSUM_FMAX), dtype=nl.float32, buffer=nl.sbuf)
  ssum = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.activation(dst=e[:rows, :S], op=nl.exp, data=s[:rows, :S], bias=neg_m[:rows], scale=scale,
                  reduce_op=nl.add, reduce_res=ssum[:rows], reduce_cmd=nisa.reduce_cmd.reset_reduce)
  inv = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
  nisa.reciprocal(dst=inv[:rows], data=ssum[:rows])
  nisa.tensor_scalar(dst=e[:rows, :S], data=e[:rows, :S], op0=nl.multiply, operand0=inv[:rows])
  return e


@nki.jit
def diff_attention(q, k, v, lam, norm_w, lambda_init=0.8, eps=1e-5):
  H, two, d, S = q.shape
  d2 = v.shape[2]
  assert two == 2 and d <= P_MAX and d2 == 2 * d and S <= PSUM_FMAX
  scale = 1.0 / (d ** 0.5)
  NT = (S + P_MAX - 1) // P_MAX
  out = nl.ndarray((H, S, d2), dtype=q.dtype, buffer=nl.shared_hbm)
  w_sb = nl.ndarray((P_MAX, d2), dtype=nl.float32, buffer=nl.sbuf)
  nisa.dma_copy(dst=w_sb, src=norm_w.ap([[0, P_MAX], [1, d2]]))

  for h in nl.affine_range(H):
    kT = nl.ndarray((d, 2, PSUM_FMAX), dtype=k.dtype, buffer=nl.sbuf)
    for c in nl.affine_range(2):
      nisa.dma_copy(dst=kT[:, c, :S], src=k[h, c, :, :])
    v_sb = nl.ndarray((P_MAX, NT, d2), dtype=v.dtype, buffer=nl.sbuf)
    for j in nl.affine_range(NT):
      kc = min(P_MAX, S - j * P_MAX)
      nisa.dma_copy(dst=v_sb[:kc, j, :], src=v[h, j * P_MAX:j * P_MAX + kc, :])

    for qi in nl.affine_range(NT):
      q0 = qi * P_MAX
      rows = min(P_MAX, S - q0)
      probs = []
      for c in nl.static_range(2):
        qT = nl.ndarray((d, P_MAX), dtype=q.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=qT[:, :rows], src=q[h, c, :, q0:q0 + rows])
        s_ps = nl.ndarray((P_MAX, PSUM_FMAX), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=s_ps[:rows, :S], stationary=qT[:, :rows], moving=kT[:, c, :S])
        probs.append(_softmax_rows(s_ps, rows, S, q0, scale))
      # the differential map p1 - lam p2, in v's dtype for the PV matmul
      p = nl.ndarray((P_MAX, PSUM_FMAX), dtype=v.dtype, buffer=nl.sbuf)
      nisa.scalar_tensor_tensor(dst=p[:rows, :S], data=probs[1][:rows, :S], op0=nl.multiply, operand0=-lam,
                                op1=nl.add, operand1=probs[0][:rows, :S])
      o_ps = nl.ndarray((P_MAX, d2), dtype=nl.float32, buffer=nl.psum)
      for j in nl.affine_range((min(S, q0 + rows) + P_MAX - 1) // P_MAX):  # causal: keys below q0 + rows
        kc = min(P_MAX, S - j * P_MAX)
        pT_ps = nl.ndarray((P_MAX, P_MAX), dtype=v.dtype, buffer=nl.psum)
        nisa.nc_transpose(dst=pT_ps[:kc, :rows], data=p[:rows, j * P_MAX:j * P_MAX + kc])
        pT = nl.ndarray((P_MAX, P_MAX), dtype=v.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=pT[:kc, :rows], src=pT_ps[:kc, :rows])
        nisa.nc_matmul(dst=o_ps[:rows], stationary=pT[:kc, :rows], moving=v_sb[:kc, j, :])

      # per-head norm: RMSNorm over the head's 2 d values, weight, times (1 - lambda_init)
      sq = nl.ndarray((P_MAX, d2), dtype=nl.float32, buffer=nl.sbuf)
      ss = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
      nisa.activation(dst=sq[:rows], op=nl.square, data=o_ps[:rows], reduce_op=nl.add, reduce_res=ss[:rows],
                      reduce_cmd=nisa.reduce_cmd.reset_reduce)
      rstd = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
      nisa.tensor_scalar(dst=rstd[:rows], data=ss[:rows], op0=nl.multiply, operand0=1.0 / d2, op1=nl.add,
                         operand1=eps)
      nisa.activation(dst=rstd[:rows], op=nl.rsqrt, data=rstd[:rows])
      nisa.tensor_scalar(dst=rstd[:rows], data=rstd[:rows], op0=nl.multiply, operand0=1.0 - lambda_init)
      o = nl.ndarray((P_MAX, d2), dtype=q.dtype, buffer=nl.sbuf)
      nisa.scalar_tensor_tensor(dst=o[:rows], data=o_ps[:rows], op0=nl.multiply, operand0=rstd[:rows],
                                op1=nl.multiply, operand1=w_sb[:rows])
      nisa.dma_copy(dst=out[h, q0:q0 + rows, :], src=o[:rows])
  return out
