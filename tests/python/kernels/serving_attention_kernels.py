"""Attention variants for LLM serving, written the way public NKI kernels are written (new dialect: ``import nki``,
ISA calls with ``dst=``, outputs in ``nl.shared_hbm``).

- ``sink_window_decode``: StreamingLLM decode attention. One query token per sequence attends to the first
  ``n_sink`` "attention sink" tokens and to the last ``window`` tokens of its KV cache (GQA: the query heads of one
  KV head are processed together, on the PSUM partitions), with an online softmax over key blocks of <= 128 keys.
  Optional Gemma-2 logit soft-cap (``scores = softcap * tanh(scores / softcap)``), so with one KV head it is also
  the multi-query soft-capped flash decode.
- ``sink_window_decode_dynamic``: the same with per-sequence lengths given as an int32 tensor (runtime values, as
  vLLM passes them): the window start max(len - W, n_sink) is computed on chip and the window blocks are read with
  ``.ap(scalar_offset=...)`` DMAs; keys at or past the length are masked with an ``iota`` + runtime-offset bias.
- ``mqa_softcap_flash``: causal multi-query prefill attention with the Gemma-2 logit soft-cap in a flash loop: all
  query heads share one K/V head, so each 512-key chunk of K^T and V is loaded once per query tile and used by every
  head (per-head running max / sum / output kept side by side); chunks above the diagonal are skipped and the
  diagonal chunk masked with ``nisa.affine_select``.

Written for nsim's tests; not a copy of any public file. No nsim imports.
"""
import numpy as np

import nki
import nki.isa as nisa
import nki.language as nl

P_MAX = 128
NEG_INF = -3.0e38


def _spans(seq_len, window, n_sink):
    """(start, size) of the key blocks one decode step reads: the sinks, then the window in blocks of <= 128."""
    spans = [(0, min(n_sink, seq_len))] if n_sink > 0 else []
    w0 = max(n_sink, seq_len - window)
    spans += [(s, min(P_MAX, seq_len - s)) for s in range(w0, seq_len, P_MAX)]
    return spans


@nki.jit
def sink_window_decode(q, k_cache, v_cache, seq_len, window, n_sink=4, softcap=None, softmax_scale=None):
    """q [B, Hq, D] (the new token of each sequence); k_cache, v_cache [B, Hkv, S_max, D]; ``seq_len`` tokens of
    each cache are valid (the kernel is compiled per length bucket, as serving stacks do). Returns [B, Hq, D]."""
    B, Hq, D = q.shape
    _, Hkv, S_max, _ = k_cache.shape
    assert Hq % Hkv == 0 and D <= P_MAX and seq_len <= S_max
    G = Hq // Hkv
    scale = softmax_scale if softmax_scale is not None else 1.0 / float(np.sqrt(D))
    out = nl.ndarray((B, Hq, D), dtype=q.dtype, buffer=nl.shared_hbm)
    spans = _spans(seq_len, window, n_sink)

    for b in nl.affine_range(B):
        for h in nl.affine_range(Hkv):
            # the G query heads of this KV head, scaled and transposed: the stationary [D, G] of q.K^T
            q_sb = nl.ndarray((G, D), dtype=q.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=q_sb, src=q[b, nl.ds(h * G, G), :])
            q_scaled = nl.ndarray((G, D), dtype=q.dtype, buffer=nl.sbuf)
            nisa.activation(dst=q_scaled, op=nl.copy, data=q_sb, scale=scale)
            qT_ps = nl.ndarray((D, G), dtype=q.dtype, buffer=nl.psum)
            nisa.nc_transpose(dst=qT_ps, data=q_scaled)
            qT = nl.ndarray((D, G), dtype=q.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=qT, src=qT_ps)

            m_run = nl.ndarray((G, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.memset(dst=m_run, value=NEG_INF)
            l_run = nl.ndarray((G, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.memset(dst=l_run, value=0.0)
            acc = nl.ndarray((G, D), dtype=nl.float32, buffer=nl.sbuf)
            nisa.memset(dst=acc, value=0.0)

            for s0, n in spans:
                k_sb = nl.ndarray((n, D), dtype=k_cache.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=k_sb, src=k_cache[b, h, nl.ds(s0, n), :])
                v_sb = nl.ndarray((n, D), dtype=v_cache.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=v_sb, src=v_cache[b, h, nl.ds(s0, n), :])
                kT_ps = nl.ndarray((D, n), dtype=k_cache.dtype, buffer=nl.psum)
                nisa.nc_transpose(dst=kT_ps, data=k_sb)
                kT = nl.ndarray((D, n), dtype=k_cache.dtype, buffer=nl.sbuf)
                nisa.tensor_copy(dst=kT, src=kT_ps)

                s_ps = nl.ndarray((G, n), dtype=nl.float32, buffer=nl.psum)
                nisa.nc_matmul(dst=s_ps, stationary=qT, moving=kT)
                s_sb = nl.ndarray((G, n), dtype=nl.float32, buffer=nl.sbuf)
                if softcap is not None:
                    # Gemma-2: cap * tanh(s / cap)
                    nisa.activation(dst=s_sb, op=nl.tanh, data=s_ps, scale=1.0 / softcap)
                    nisa.tensor_scalar(dst=s_sb, data=s_sb, op0=nl.multiply, operand0=float(softcap))
                else:
                    nisa.tensor_copy(dst=s_sb, src=s_ps)

                m_blk = nl.ndarray((G, 1), dtype=nl.float32, buffer=nl.sbuf)
                nisa.tensor_reduce(dst=m_blk, op=nl.maximum, data=s_sb, axis=1)
                m_new = nl.ndarray((G, 1), dtype=nl.float32, buffer=nl.sbuf)
                nisa.tensor_tensor(dst=m_new, data1=m_run, data2=m_blk, op=nl.maximum)
                neg_m = nl.ndarray((G, 1), dtype=nl.float32, buffer=nl.sbuf)
                nisa.tensor_scalar(dst=neg_m, data=m_new, op0=nl.multiply, operand0=-1.0)

                p = nl.ndarray((G, n), dtype=v_cache.dtype, buffer=nl.sbuf)
                l_blk = nl.ndarray((G, 1), dtype=nl.float32, buffer=nl.sbuf)
                nisa.activation(dst=p, op=nl.exp, data=s_sb, bias=neg_m, reduce_op=nl.add, reduce_res=l_blk,
                                reduce_cmd=nisa.reduce_cmd.reset_reduce)
                # alpha = exp(m_old - m_new) rescales what was accumulated so far
                alpha = nl.ndarray((G, 1), dtype=nl.float32, buffer=nl.sbuf)
                nisa.activation(dst=alpha, op=nl.exp, data=m_run, bias=neg_m)
                nisa.scalar_tensor_tensor(dst=l_run, data=l_run, op0=nl.multiply, operand0=alpha, op1=nl.add,
                                          operand1=l_blk)

                pT_ps = nl.ndarray((n, G), dtype=p.dtype, buffer=nl.psum)
                nisa.nc_transpose(dst=pT_ps, data=p)
                pT = nl.ndarray((n, G), dtype=p.dtype, buffer=nl.sbuf)
                nisa.tensor_copy(dst=pT, src=pT_ps)
                pv_ps = nl.ndarray((G, D), dtype=nl.float32, buffer=nl.psum)
                nisa.nc_matmul(dst=pv_ps, stationary=pT, moving=v_sb)
                nisa.scalar_tensor_tensor(dst=acc, data=acc, op0=nl.multiply, operand0=alpha, op1=nl.add,
                                          operand1=pv_ps)
                nisa.tensor_copy(dst=m_run, src=m_new)

            inv_l = nl.ndarray((G, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.reciprocal(dst=inv_l, data=l_run)
            o_sb = nl.ndarray((G, D), dtype=out.dtype, buffer=nl.sbuf)
            nisa.tensor_scalar(dst=o_sb, data=acc, op0=nl.multiply, operand0=inv_l)
            nisa.dma_copy(dst=out[b, nl.ds(h * G, G), :], src=o_sb)
    return out


@nki.jit
def sink_window_decode_dynamic(q, k_cache, v_cache, seq_lens, window, n_sink=4, softmax_scale=None):
    """q [B, Hq, D]; k_cache, v_cache [B, Hkv, S_max, D] with S_max >= n_sink + window; seq_lens [B] int32
    (runtime, 1 <= seq_lens[b] <= S_max). Keys attended: [0, min(n_sink, len)) and [max(len - W, n_sink), len)."""
    B, Hq, D = q.shape
    _, Hkv, S_max, _ = k_cache.shape
    assert S_max >= n_sink + window and n_sink > 0
    G = Hq // Hkv
    scale = softmax_scale if softmax_scale is not None else 1.0 / float(np.sqrt(D))
    out = nl.ndarray((B, Hq, D), dtype=q.dtype, buffer=nl.shared_hbm)
    n_win = (window + P_MAX - 1) // P_MAX

    for b in nl.affine_range(B):
        # the length twice: on one partition (int32, for the DMA offsets) and on the G query partitions (fp32)
        len_i = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=len_i, src=seq_lens.ap(pattern=[[1, 1], [1, 1]], offset=b))
        len_g = nl.ndarray((G, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=len_g, src=seq_lens.ap(pattern=[[0, G], [1, 1]], offset=b))
        # window start = max(len - W, n_sink) (int32, exact) and its distance to the length (fp32, <= 0)
        start = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=start, data=len_i, op0=nl.add, operand0=-window, op1=nl.maximum, operand1=n_sink)
        start_minus_len = nl.ndarray((G, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=start_minus_len, data=len_g, op0=nl.add, operand0=-window, op1=nl.maximum,
                           operand1=float(n_sink))
        nisa.tensor_tensor(dst=start_minus_len, data1=start_minus_len, data2=len_g, op=nl.subtract)
        neg_len = nl.ndarray((G, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=neg_len, data=len_g, op0=nl.multiply, operand0=-1.0)

        for h in nl.affine_range(Hkv):
            q_sb = nl.ndarray((G, D), dtype=q.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=q_sb, src=q[b, nl.ds(h * G, G), :])
            q_scaled = nl.ndarray((G, D), dtype=q.dtype, buffer=nl.sbuf)
            nisa.activation(dst=q_scaled, op=nl.copy, data=q_sb, scale=scale)
            qT_ps = nl.ndarray((D, G), dtype=q.dtype, buffer=nl.psum)
            nisa.nc_transpose(dst=qT_ps, data=q_scaled)
            qT = nl.ndarray((D, G), dtype=q.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=qT, src=qT_ps)

            m_run = nl.ndarray((G, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.memset(dst=m_run, value=NEG_INF)
            l_run = nl.ndarray((G, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.memset(dst=l_run, value=0.0)
            acc = nl.ndarray((G, D), dtype=nl.float32, buffer=nl.sbuf)
            nisa.memset(dst=acc, value=0.0)

            for j in range(n_win + 1):
                n = n_sink if j == 0 else min(P_MAX, window - (j - 1) * P_MAX)
                k_sb = nl.ndarray((n, D), dtype=k_cache.dtype, buffer=nl.sbuf)
                v_sb = nl.ndarray((n, D), dtype=v_cache.dtype, buffer=nl.sbuf)
                base = (b * Hkv + h) * S_max * D
                if j == 0:
                    nisa.dma_copy(dst=k_sb, src=k_cache[b, h, nl.ds(0, n), :])
                    nisa.dma_copy(dst=v_sb, src=v_cache[b, h, nl.ds(0, n), :])
                    first_minus_len = neg_len  # position of column 0 minus the length
                else:
                    row = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
                    nisa.tensor_scalar(dst=row, data=start, op0=nl.add, operand0=(j - 1) * P_MAX)
                    nisa.dma_copy(dst=k_sb, src=k_cache.ap(pattern=[[D, n], [1, D]], offset=base, scalar_offset=row,
                                                           indirect_dim=2))
                    nisa.dma_copy(dst=v_sb, src=v_cache.ap(pattern=[[D, n], [1, D]], offset=base, scalar_offset=row,
                                                           indirect_dim=2))
                    first_minus_len = start_minus_len
                kT_ps = nl.ndarray((D, n), dtype=k_cache.dtype, buffer=nl.psum)
                nisa.nc_transpose(dst=kT_ps, data=k_sb)
                kT = nl.ndarray((D, n), dtype=k_cache.dtype, buffer=nl.sbuf)
                nisa.tensor_copy(dst=kT, src=kT_ps)
                s_ps = nl.ndarray((G, n), dtype=nl.float32, buffer=nl.psum)
                nisa.nc_matmul(dst=s_ps, stationary=qT, moving=kT)

                # mask bias: -30000 where (position - length) >= 0
                pos = nl.ndarray((G, n), dtype=nl.float32, buffer=nl.sbuf)
                nisa.iota(dst=pos, pattern=[[1, n]], offset=0 if j == 0 else (j - 1) * P_MAX, channel_multiplier=0)
                bias = nl.ndarray((G, n), dtype=nl.float32, buffer=nl.sbuf)
                nisa.tensor_scalar(dst=bias, data=pos, op0=nl.add, operand0=first_minus_len, op1=nl.greater_equal,
                                   operand1=0.0)
                s_sb = nl.ndarray((G, n), dtype=nl.float32, buffer=nl.sbuf)
                nisa.scalar_tensor_tensor(dst=s_sb, data=bias, op0=nl.multiply, operand0=-30000.0, op1=nl.add,
                                          operand1=s_ps)

                m_blk = nl.ndarray((G, 1), dtype=nl.float32, buffer=nl.sbuf)
                nisa.tensor_reduce(dst=m_blk, op=nl.maximum, data=s_sb, axis=1)
                m_new = nl.ndarray((G, 1), dtype=nl.float32, buffer=nl.sbuf)
                nisa.tensor_tensor(dst=m_new, data1=m_run, data2=m_blk, op=nl.maximum)
                neg_m = nl.ndarray((G, 1), dtype=nl.float32, buffer=nl.sbuf)
                nisa.tensor_scalar(dst=neg_m, data=m_new, op0=nl.multiply, operand0=-1.0)
                p = nl.ndarray((G, n), dtype=v_cache.dtype, buffer=nl.sbuf)
                l_blk = nl.ndarray((G, 1), dtype=nl.float32, buffer=nl.sbuf)
                nisa.activation(dst=p, op=nl.exp, data=s_sb, bias=neg_m, reduce_op=nl.add, reduce_res=l_blk,
                                reduce_cmd=nisa.reduce_cmd.reset_reduce)
                alpha = nl.ndarray((G, 1), dtype=nl.float32, buffer=nl.sbuf)
                nisa.activation(dst=alpha, op=nl.exp, data=m_run, bias=neg_m)
                nisa.scalar_tensor_tensor(dst=l_run, data=l_run, op0=nl.multiply, operand0=alpha, op1=nl.add,
                                          operand1=l_blk)
                pT_ps = nl.ndarray((n, G), dtype=p.dtype, buffer=nl.psum)
                nisa.nc_transpose(dst=pT_ps, data=p)
                pT = nl.ndarray((n, G), dtype=p.dtype, buffer=nl.sbuf)
                nisa.tensor_copy(dst=pT, src=pT_ps)
                pv_ps = nl.ndarray((G, D), dtype=nl.float32, buffer=nl.psum)
                nisa.nc_matmul(dst=pv_ps, stationary=pT, moving=v_sb)
                nisa.scalar_tensor_tensor(dst=acc, data=acc, op0=nl.multiply, operand0=alpha, op1=nl.add,
                                          operand1=pv_ps)
                nisa.tensor_copy(dst=m_run, src=m_new)

            inv_l = nl.ndarray((G, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.reciprocal(dst=inv_l, data=l_run)
            o_sb = nl.ndarray((G, D), dtype=out.dtype, buffer=nl.sbuf)
            nisa.tensor_scalar(dst=o_sb, data=acc, op0=nl.multiply, operand0=inv_l)
            nisa.dma_copy(dst=out[b, nl.ds(h * G, G), :], src=o_sb)
    return out


KV_CHUNK = 512


@nki.jit
def mqa_softcap_flash(q, k, v, softcap=50.0, softmax_scale=None):
    """q [Hq, S, D], k, v [S, D] (one KV head), causal. Returns [Hq, S, D]."""
    Hq, S, D = q.shape
    assert S % P_MAX == 0 and D <= P_MAX
    scale = softmax_scale if softmax_scale is not None else 1.0 / float(np.sqrt(D))
    out = nl.ndarray((Hq, S, D), dtype=q.dtype, buffer=nl.shared_hbm)
    for qt in nl.affine_range(S // P_MAX):
        q0 = qt * P_MAX
        # q^T of every head for this tile [D, Hq, 128], scaled
        qT = nl.ndarray((D, Hq, P_MAX), dtype=q.dtype, buffer=nl.sbuf)
        for h in nl.affine_range(Hq):
            q_sb = nl.ndarray((P_MAX, D), dtype=q.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=q_sb, src=q[h, nl.ds(q0, P_MAX), :])
            nisa.activation(dst=q_sb, op=nl.copy, data=q_sb, scale=scale)
            t_ps = nl.ndarray((D, P_MAX), dtype=q.dtype, buffer=nl.psum)
            nisa.nc_transpose(dst=t_ps, data=q_sb)
            nisa.tensor_copy(dst=qT[:, h, :], src=t_ps)
        m_run = nl.ndarray((P_MAX, Hq), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=m_run, value=NEG_INF)
        l_run = nl.ndarray((P_MAX, Hq), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=l_run, value=0.0)
        acc = nl.ndarray((P_MAX, Hq, D), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=acc, value=0.0)

        last = q0 + P_MAX  # keys [0, last) are visible to this tile
        for kc in range((last + KV_CHUNK - 1) // KV_CHUNK):
            k0 = kc * KV_CHUNK
            nk = min(KV_CHUNK, last - k0)
            n_sub = nk // P_MAX
            kT = nl.ndarray((D, nk), dtype=k.dtype, buffer=nl.sbuf)
            v_sb = nl.ndarray((P_MAX, n_sub, D), dtype=v.dtype, buffer=nl.sbuf)
            for st in nl.affine_range(n_sub):
                k_sb = nl.ndarray((P_MAX, D), dtype=k.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=k_sb, src=k[nl.ds(k0 + st * P_MAX, P_MAX), :])
                t_ps = nl.ndarray((D, P_MAX), dtype=k.dtype, buffer=nl.psum)
                nisa.nc_transpose(dst=t_ps, data=k_sb)
                nisa.tensor_copy(dst=kT[:, nl.ds(st * P_MAX, P_MAX)], src=t_ps)
                nisa.dma_copy(dst=v_sb[:, st, :], src=v[nl.ds(k0 + st * P_MAX, P_MAX), :])
            for h in nl.affine_range(Hq):
                s_ps = nl.ndarray((P_MAX, nk), dtype=nl.float32, buffer=nl.psum)
                nisa.nc_matmul(dst=s_ps, stationary=qT[:, h, :], moving=kT)
                s_sb = nl.ndarray((P_MAX, nk), dtype=nl.float32, buffer=nl.sbuf)
                nisa.activation(dst=s_sb, op=nl.tanh, data=s_ps, scale=1.0 / softcap)
                nisa.tensor_scalar(dst=s_sb, data=s_sb, op0=nl.multiply, operand0=float(softcap))
                if k0 + nk > q0:  # the chunk crosses the diagonal: keep key <= query
                    nisa.affine_select(dst=s_sb, pattern=[[-1, nk]], channel_multiplier=1, on_true_tile=s_sb,
                                       on_false_value=NEG_INF, cmp_op=nl.greater_equal, offset=q0 - k0)
                m_new = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
                nisa.tensor_reduce(dst=m_new, op=nl.maximum, data=s_sb, axis=1)
                nisa.tensor_tensor(dst=m_new, data1=m_new, data2=m_run[:, h:h + 1], op=nl.maximum)
                neg_m = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
                nisa.tensor_scalar(dst=neg_m, data=m_new, op0=nl.multiply, operand0=-1.0)
                p = nl.ndarray((P_MAX, nk), dtype=v.dtype, buffer=nl.sbuf)
                l_blk = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
                nisa.activation(dst=p, op=nl.exp, data=s_sb, bias=neg_m, reduce_op=nl.add, reduce_res=l_blk,
                                reduce_cmd=nisa.reduce_cmd.reset_reduce)
                alpha = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
                nisa.activation(dst=alpha, op=nl.exp, data=m_run[:, h:h + 1], bias=neg_m)
                nisa.scalar_tensor_tensor(dst=l_run[:, h:h + 1], data=l_run[:, h:h + 1], op0=nl.multiply,
                                          operand0=alpha, op1=nl.add, operand1=l_blk)
                pv_ps = nl.ndarray((P_MAX, D), dtype=nl.float32, buffer=nl.psum)
                for st in nl.affine_range(n_sub):
                    pT_ps = nl.ndarray((P_MAX, P_MAX), dtype=p.dtype, buffer=nl.psum)
                    nisa.nc_transpose(dst=pT_ps, data=p[:, nl.ds(st * P_MAX, P_MAX)])
                    pT = nl.ndarray((P_MAX, P_MAX), dtype=p.dtype, buffer=nl.sbuf)
                    nisa.tensor_copy(dst=pT, src=pT_ps)
                    nisa.nc_matmul(dst=pv_ps, stationary=pT, moving=v_sb[:, st, :])
                nisa.scalar_tensor_tensor(dst=acc[:, h, :], data=acc[:, h, :], op0=nl.multiply, operand0=alpha,
                                          op1=nl.add, operand1=pv_ps)
                nisa.tensor_copy(dst=m_run[:, h:h + 1], src=m_new)

        for h in nl.affine_range(Hq):
            inv_l = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.reciprocal(dst=inv_l, data=l_run[:, h:h + 1])
            o_sb = nl.ndarray((P_MAX, D), dtype=out.dtype, buffer=nl.sbuf)
            nisa.tensor_scalar(dst=o_sb, data=acc[:, h, :], op0=nl.multiply, operand0=inv_l)
            nisa.dma_copy(dst=out[h, nl.ds(q0, P_MAX), :], src=o_sb)
    return out


def mqa_softcap_reference(q, k, v, softcap=50.0, softmax_scale=None):
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    Hq, S, D = q.shape
    scale = softmax_scale if softmax_scale is not None else 1.0 / np.sqrt(D)
    s = np.einsum("hqd,kd->hqk", q, k) * scale
    if softcap is not None:
        s = softcap * np.tanh(s / softcap)
    s = np.where(np.tril(np.ones((S, S), bool))[None], s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("hqk,kd->hqd", p, v) / p.sum(-1, keepdims=True)


def sink_window_reference_lens(q, k_cache, v_cache, seq_lens, window, n_sink=4, softmax_scale=None):
    """float64 numpy of ``sink_window_decode_dynamic``: per sequence its own length."""
    return np.concatenate([sink_window_reference(q[b:b + 1], k_cache[b:b + 1], v_cache[b:b + 1], int(n), window,
                                                 n_sink, None, softmax_scale) for b, n in enumerate(seq_lens)])


def sink_window_reference(q, k_cache, v_cache, seq_len, window, n_sink=4, softcap=None, softmax_scale=None):
    """float64 numpy: softmax over the sink and window keys (the same positions as the kernel's spans)."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k_cache, v_cache))
    B, Hq, D = q.shape
    Hkv = k.shape[1]
    G = Hq // Hkv
    scale = softmax_scale if softmax_scale is not None else 1.0 / np.sqrt(D)
    pos = sorted(set(range(min(n_sink, seq_len))) | set(range(max(0, seq_len - window), seq_len)))
    out = np.zeros((B, Hq, D))
    for b in range(B):
        for hq in range(Hq):
            kk, vv = k[b, hq // G, pos], v[b, hq // G, pos]
            s = kk @ q[b, hq] * scale
            if softcap is not None:
                s = softcap * np.tanh(s / softcap)
            p = np.exp(s - s.max())
            out[b, hq] = p @ vv / p.sum()
    return out
