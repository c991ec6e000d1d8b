"""punica's SGMV (segmented gather matrix-vector) LoRA for prefill in the Beta-1 dialect (``import neuronxcc.nki``),
as a vLLM port to Trainium writes it: the prefill tokens are grouped into segments, one per adapter; the segment
boundaries are compile-time (the kernel is specialised per batch composition, ``seg_starts`` a tuple of S + 1
offsets), the adapter of each segment is a runtime int32 tensor in HBM. Per segment the adapter's A ``[r, H]`` and
B ``[O, r]`` are loaded by indirect DMA (``lora_a[ids[i_p, 0], i_r, i_h]`` with the id broadcast over the
partitions) and transposed on the PE; the segment's tokens go in tiles of 128 with masks for the ragged segment
end (``mask=(t0 + i_p < end)`` on loads, transposes, matmuls and stores).

    y[t] = y_in[t] + scale * (x[t] A_l^T) B_l^T,  l = seg_lora_ids[s] for seg_starts[s] <= t < seg_starts[s + 1]

``fp8_kv_decode_attention_per_token``: GQA decode attention over a float8_e4m3 KV cache with one dequantization
scale per cached token (K cache transposed, ``[B, Hkv, D, S]``; V ``[B, Hkv, S, D]``; scales ``[B, Hkv, S]``), in
the same dialect: the K scales multiply the scores' columns (a ``[1, block]`` row broadcast over the G query rows
by ``nl.multiply``), the V scales the rows of each V tile before P.V (dequantized to bf16); online softmax over key
blocks of 512 with ``nl.max`` / ``nl.exp`` / ``nl.sum`` and the running max, sum and output rescaled per block.

Written for nsim's tests from memory of those projects' idioms; not a copy of any file. No nsim imports.
"""
import math

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl


@nki.jit
def sgmv_lora_prefill(x, y_in, lora_a, lora_b, seg_lora_ids, seg_starts, scale):
  """x [T, H] bf16, y_in [T, O] bf16, lora_a [L, r, H], lora_b [L, O, r], seg_lora_ids [S] int32,
  seg_starts: S + 1 ints (0 = seg_starts[0] <= ... <= seg_starts[S] = T) -> y [T, O] bf16."""
  T, H = x.shape
  O = y_in.shape[1]
  L, r, _ = lora_a.shape
  n_seg = len(seg_starts) - 1
  TILE = nl.tile_size.pmax  # 128 tokens / hidden rows per tile
  TILE_N = nl.tile_size.gemm_moving_fmax  # 512 output columns per expand matmul
  assert H % TILE == 0 and O % TILE_N == 0, "H must be a multiple of 128, O of 512"
  assert r <= TILE and seg_starts[0] == 0 and seg_starts[-1] == T, "bad rank or segments"
  KT = H // TILE

  out = nl.ndarray((T, O), dtype=y_in.dtype, buffer=nl.shared_hbm)

  i_p = nl.arange(TILE)[:, None]
  i_f = nl.arange(TILE)[None, :]
  i_rp = nl.arange(r)[:, None]
  i_rf = nl.arange(r)[None, :]
  i_hf = nl.arange(H)[None, :]
  i_nf = nl.arange(TILE_N)[None, :]

  ids_2d = seg_lora_ids.reshape((n_seg, 1))
  for s in range(n_seg):
    start, end = seg_starts[s], seg_starts[s + 1]
    if end == start:
      continue
    # the segment's adapter id on every partition
    lid = nl.load(ids_2d[s:s + 1, :])
    ids = lid.broadcast_to((TILE, 1))

    # A_l [r, H] -> A_l^T tiles [128, KT, r]
    a_tile = nl.load(lora_a[ids[i_rp, 0], i_rp, i_hf])
    aT = nl.ndarray((TILE, KT, r), dtype=lora_a.dtype, buffer=nl.sbuf)
    for k in nl.affine_range(KT):
      aT[i_p, k, i_rf] = nisa.nc_transpose(a_tile[i_rp, k * TILE + i_f])

    # B_l [O, r] -> B_l^T [r, O], 128 output rows per load
    bT = nl.ndarray((r, O), dtype=lora_b.dtype, buffer=nl.sbuf)
    for o in nl.affine_range(O // TILE):
      b_tile = nl.load(lora_b[ids[i_p, 0], o * TILE + i_p, i_rf])
      bT[i_rp, o * TILE + i_f] = nisa.nc_transpose(b_tile)

    for tt in nl.affine_range((end - start + TILE - 1) // TILE):
      t0 = start + tt * TILE
      x_tile = nl.load(x[t0 + i_p, i_hf], mask=(t0 + i_p < end))
      xT = nl.ndarray((TILE, KT, TILE), dtype=x.dtype, buffer=nl.sbuf)
      for k in nl.affine_range(KT):
        xT[i_p, k, i_f] = nisa.nc_transpose(x_tile[i_p, k * TILE + i_f], mask=(t0 + i_p < end))

      # shrink: vT [r, tokens] = A_l x^T
      vT_ps = nl.zeros((r, TILE), nl.float32, buffer=nl.psum)
      for k in nl.affine_range(KT):
        vT_ps += nisa.nc_matmul(aT[i_p, k, i_rf], xT[i_p, k, i_f], mask=(t0 + i_f < end))
      vT = nl.copy(vT_ps, dtype=x.dtype, mask=(t0 + i_f < end))

      # expand: y [tokens, O] = y_in + scale * v B_l^T
      for n in nl.affine_range(O // TILE_N):
        y_ps = nisa.nc_matmul(vT[i_rp, i_f], bT[i_rp, n * TILE_N + i_nf], mask=(t0 + i_f < end))
        y_tile = nl.load(y_in[t0 + i_p, n * TILE_N + i_nf], mask=(t0 + i_p < end))
        res = nl.add(y_tile, nl.multiply(y_ps, scale, mask=(t0 + i_p < end)), dtype=y_in.dtype,
                     mask=(t0 + i_p < end))
        nl.store(out[t0 + i_p, n * TILE_N + i_nf], value=res, mask=(t0 + i_p < end))
  return out


@nki.jit
def fp8_kv_decode_attention_per_token(q, k_cache, v_cache, k_scale, v_scale):
  """q [B, Hq, D] bf16; k_cache [B, Hkv, D, S], v_cache [B, Hkv, S, D] float8_e4m3; k_scale, v_scale [B, Hkv, S]
  fp32 (cached value x scale = the real K / V of that token) -> out [B, Hq, D] bf16."""
  B, Hq, D = q.shape
  _, Hkv, _, S = k_cache.shape
  G = Hq // Hkv
  BLK = nl.tile_size.gemm_moving_fmax  # 512 keys per block: one PSUM bank of scores
  TP = nl.tile_size.pmax  # 128 keys per P.V matmul
  assert Hq % Hkv == 0 and D <= TP and S % BLK == 0, "shapes"
  sm_scale = 1.0 / math.sqrt(D)
  out = nl.ndarray((B, Hq, D), dtype=q.dtype, buffer=nl.shared_hbm)

  i_dp = nl.arange(D)[:, None]
  i_df = nl.arange(D)[None, :]
  i_gp = nl.arange(G)[:, None]
  i_gf = nl.arange(G)[None, :]
  i_bf = nl.arange(BLK)[None, :]
  i_tp = nl.arange(TP)[:, None]
  i_tf = nl.arange(TP)[None, :]

  for b in nl.affine_range(B):
    for h in nl.affine_range(Hkv):
      qT = nl.load(q[b, h * G + i_gf, i_dp])  # [D, G]: the group's queries, transposed by the access
      m_run = nl.full((G, 1), -30000.0, dtype=nl.float32)
      l_run = nl.zeros((G, 1), dtype=nl.float32)
      acc = nl.zeros((G, D), dtype=nl.float32)
      for s in nl.sequential_range(S // BLK):
        kT = nl.load(k_cache[b, h, i_dp, s * BLK + i_bf])  # [D, BLK] fp8, fed to the PE as it is
        ks_row = nl.load(k_scale[b, h, s * BLK + i_bf])  # [1, BLK]
        sc_ps = nl.matmul(qT, kT, transpose_x=True)  # [G, BLK] fp32
        sc = nl.multiply(nl.multiply(sc_ps, ks_row), sm_scale)
        m_new = nl.maximum(m_run, nl.max(sc, axis=[1], keepdims=True))
        alpha = nl.exp(m_run - m_new)
        p = nl.exp(sc - m_new)
        l_run[...] = l_run * alpha + nl.sum(p, axis=[1], keepdims=True)
        m_run[...] = m_new
        p_bf = nl.copy(p, dtype=q.dtype)
        pv = nl.zeros((G, D), nl.float32, buffer=nl.psum)
        for t in nl.affine_range(BLK // TP):
          v_tile = nl.load(v_cache[b, h, s * BLK + t * TP + i_tp, i_df])  # [TP, D] fp8
          vs_col = nl.load(v_scale[b, h, s * BLK + t * TP + i_tp])  # [TP, 1]
          v_deq = nl.multiply(v_tile, vs_col, dtype=q.dtype)
          pT = nl.copy(nisa.nc_transpose(p_bf[i_gp, t * TP + i_tf]), dtype=q.dtype)  # [TP, G]
          pv += nisa.nc_matmul(pT, v_deq)
        acc[...] = acc * alpha + pv
      nl.store(out[b, h * G + i_gp, i_df], value=nl.divide(acc, l_run, dtype=q.dtype))
  return out
