"""Attention variants for LLM serving in the Beta-1 dialect (``import neuronxcc.nki as nki``), written the way the
public Beta-1 kernels (vLLM's NKI attention, nki-samples) are written: value-returning ``nl``/``nisa`` calls,
``nl.arange`` index expressions, ``psum[...] += nl.matmul(...)``.

- ``paged_decode_attention``: vLLM v1-style batched paged decode. B sequences, one query token each; per-sequence
  context lengths ``seq_lens`` [B] and block tables ``block_tables`` [B, max_blocks] (int32, runtime values). The
  kernel is compiled for a length bucket ``max_context_len``: it reads only the first
  ceil(max_context_len / block_size) entries of each table row and gathers those cache blocks with indirect DMA
  (block ids on the partitions, ``cache[idx[i_p, 0], i_f]``), chunk by chunk (online softmax). Positions at or past
  a sequence's own length are masked with a bias built from ``nisa.iota`` compared against the length loaded into
  a tile (``nisa.tensor_scalar`` with a runtime (P, 1) operand).
- ``cross_attention``: encoder-decoder cross-attention: decoder queries [B, H, Sq, D] against encoder keys/values
  [B, H, Sk, D] (Sk != Sq), non-causal, with the encoder padding mask [B, Sk] (1 = token, 0 = padding) turned into
  an additive bias broadcast over the query partitions; flash loop over 512-key chunks.

Written for nsim's tests; not a copy of any public file. No nsim imports.
"""
import math

import numpy as np

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl

B_P_SIZE = 128
B_F_SIZE = 512
NEG_BIAS = -30000.0


@nki.jit
def paged_decode_attention(query, key_cache, value_cache, block_tables, seq_lens, max_context_len,
                           softmax_scale=None):
    """query [B, Hq, D]; key_cache, value_cache [num_blocks, Hkv, block_size, D]; block_tables [B, max_blocks]
    int32; seq_lens [B] int32 (1 <= seq_lens[b] <= max_context_len). Returns [B, Hq, D]."""
    B, Hq, D = query.shape
    num_blocks, Hkv, block_size, _ = key_cache.shape
    max_blocks = block_tables.shape[1]
    G = Hq // Hkv
    n_needed = (max_context_len + block_size - 1) // block_size
    assert n_needed <= max_blocks
    blocks_per_chunk = min(B_F_SIZE // block_size, n_needed, B_P_SIZE)
    n_chunks = (n_needed + blocks_per_chunk - 1) // blocks_per_chunk
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(D)

    out = nl.ndarray((B, Hq, D), dtype=query.dtype, buffer=nl.shared_hbm)
    # one row per (block, kv head): the row a gather fetches for block id * Hkv + head
    k_rows = key_cache.reshape((num_blocks * Hkv, block_size * D))
    v_rows = value_cache.reshape((num_blocks * Hkv, block_size * D))

    seq_lens_2d = seq_lens.reshape((B, 1))

    i_g = nl.arange(G)[:, None]
    i_d = nl.arange(D)[None, :]
    i_row = nl.arange(block_size * D)[None, :]

    for b in nl.affine_range(B):
        # the sequence's length (a runtime value) in a [1, 1] tile, as fp32 for the compare
        seq_len = nl.load(seq_lens_2d[b:b + 1, :], dtype=nl.float32)

        for h in nl.affine_range(Hkv):
            q_tile = nl.load(query[b, h * G + i_g, i_d])
            q_scaled = nl.multiply(q_tile, softmax_scale, dtype=query.dtype)
            qT = nl.copy(nl.transpose(q_scaled), dtype=query.dtype)  # [D, G]

            m_run = nl.full((G, 1), -3.0e38, dtype=nl.float32)
            l_run = nl.zeros((G, 1), dtype=nl.float32)
            acc = nl.zeros((G, D), dtype=nl.float32)

            for c in nl.sequential_range(n_chunks):
                nb = min(blocks_per_chunk, n_needed - c * blocks_per_chunk)
                n_tok = nb * block_size
                i_b = nl.arange(nb)[:, None]
                # block ids of this chunk, one per partition, turned into rows of the (block, head) view
                bt = nl.load(block_tables[b, c * blocks_per_chunk + i_b])
                rows = nl.add(nl.multiply(bt, Hkv, dtype=nl.int32), h, dtype=nl.int32)
                k_blk = nl.load(k_rows[rows[i_b, 0], i_row])  # [nb, block_size * D]
                v_blk = nl.load(v_rows[rows[i_b, 0], i_row])

                # K^T with the tokens in (token-in-block, block) order: column j * nb + i is token i * bs + j
                kT = nl.ndarray((D, n_tok), dtype=key_cache.dtype, buffer=nl.sbuf)
                for j in nl.affine_range(block_size):
                    kT[:, nl.ds(j * nb, nb)] = nl.transpose(k_blk[:, nl.ds(j * D, D)])
                scores = nl.matmul(qT, kT, transpose_x=True)  # [G, n_tok] fp32 PSUM

                # positions of the columns, and the mask bias of those at or past the sequence's length (one
                # row, broadcast over the G query partitions by the add)
                i_0, i_j, i_k = nl.mgrid[0:1, 0:block_size, 0:nb]
                pos = nisa.iota(i_0 + (c * blocks_per_chunk + i_k) * block_size + i_j, dtype=nl.float32)
                bias = nisa.tensor_scalar(pos, np.greater_equal, seq_len, op1=np.multiply, operand1=NEG_BIAS)
                s = nl.add(scores, bias.reshape((1, n_tok)))

                m_new = nl.maximum(m_run, nl.max(s, axis=1, keepdims=True))
                p = nl.exp(nl.subtract(s, m_new), dtype=value_cache.dtype)
                alpha = nl.exp(nl.subtract(m_run, m_new))
                l_run[...] = nl.add(nl.multiply(l_run, alpha), nl.sum(p, axis=1, keepdims=True, dtype=nl.float32))

                pv = nl.zeros((G, D), dtype=nl.float32, buffer=nl.psum)
                for j in nl.affine_range(block_size):
                    pT = nl.copy(nl.transpose(p[:, nl.ds(j * nb, nb)]), dtype=value_cache.dtype)  # [nb, G]
                    pv += nl.matmul(pT, v_blk[:, nl.ds(j * D, D)], transpose_x=True)
                acc[...] = nl.add(nl.multiply(acc, alpha), pv)
                m_run[...] = m_new

            o = nl.multiply(acc, nl.reciprocal(l_run), dtype=query.dtype)
            nl.store(out[b, h * G + i_g, i_d], value=o)
    return out


def paged_decode_reference(query, key_cache, value_cache, block_tables, seq_lens, softmax_scale=None):
    """float64: each sequence attends to its first seq_lens[b] cached tokens, read through its block table."""
    q, kc, vc = (np.asarray(x, np.float64) for x in (query, key_cache, value_cache))
    B, Hq, D = q.shape
    num_blocks, Hkv, bs, _ = kc.shape
    G = Hq // Hkv
    scale = softmax_scale if softmax_scale is not None else 1.0 / np.sqrt(D)
    out = np.zeros((B, Hq, D))
    for b in range(B):
        n = int(np.asarray(seq_lens).reshape(-1)[b])
        blocks = block_tables[b, :(n + bs - 1) // bs]
        for hq in range(Hq):
            k = kc[blocks, hq // G].reshape(-1, D)[:n]
            v = vc[blocks, hq // G].reshape(-1, D)[:n]
            s = k @ q[b, hq] * scale
            p = np.exp(s - s.max())
            out[b, hq] = p @ v / p.sum()
    return out


@nki.jit
def cross_attention(q, k, v, encoder_mask, softmax_scale=None):
    """q [B, H, Sq, D] (decoder), k, v [B, H, Sk, D] (encoder), encoder_mask [B, Sk] (1 = token, 0 = padding;
    every sequence has at least one token). Non-causal. Returns [B, H, Sq, D]."""
    B, H, Sq, D = q.shape
    Sk = k.shape[2]
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(D)
    out = nl.ndarray((B, H, Sq, D), dtype=q.dtype, buffer=nl.shared_hbm)
    n_q_tiles = (Sq + B_P_SIZE - 1) // B_P_SIZE
    n_k_chunks = (Sk + B_F_SIZE - 1) // B_F_SIZE

    for b in nl.affine_range(B):
        for h in nl.affine_range(H):
            for qt in range(n_q_tiles):
                nq = min(B_P_SIZE, Sq - qt * B_P_SIZE)
                q_tile = nl.load(q[b, h, nl.ds(qt * B_P_SIZE, nq), :])
                qT = nl.copy(nl.transpose(nl.multiply(q_tile, scale, dtype=q.dtype)), dtype=q.dtype)  # [D, nq]

                m_run = nl.full((nq, 1), -3.0e38, dtype=nl.float32)
                l_run = nl.zeros((nq, 1), dtype=nl.float32)
                acc = nl.zeros((nq, D), dtype=nl.float32)
                for kc in range(n_k_chunks):
                    k0 = kc * B_F_SIZE
                    nk = min(B_F_SIZE, Sk - k0)
                    kT = nl.load_transpose2d(k[b, h, nl.ds(k0, nk), :])  # [D, nk]
                    scores = nl.matmul(qT, kT, transpose_x=True)  # [nq, nk]
                    # the padding mask of this chunk: one row, broadcast over the query partitions
                    keep = nl.load(encoder_mask[b:b + 1, nl.ds(k0, nk)], dtype=nl.float32)
                    bias = nisa.tensor_scalar(keep, np.subtract, 1.0, op1=np.multiply, operand1=-NEG_BIAS,
                                              dtype=nl.float32)
                    s = nl.add(scores, bias.broadcast_to((nq, nk)))

                    m_new = nl.maximum(m_run, nl.max(s, axis=1, keepdims=True))
                    p = nl.exp(nl.subtract(s, m_new), dtype=v.dtype)
                    alpha = nl.exp(nl.subtract(m_run, m_new))
                    l_run[...] = l_run * alpha + nl.sum(p, axis=1, keepdims=True, dtype=nl.float32)
                    pv = nl.zeros((nq, D), dtype=nl.float32, buffer=nl.psum)
                    for st in range((nk + B_P_SIZE - 1) // B_P_SIZE):
                        ns = min(B_P_SIZE, nk - st * B_P_SIZE)
                        v_tile = nl.load(v[b, h, nl.ds(k0 + st * B_P_SIZE, ns), :])
                        pT = nl.copy(nl.transpose(p[:, nl.ds(st * B_P_SIZE, ns)]), dtype=v.dtype)
                        pv += nl.matmul(pT, v_tile, transpose_x=True)
                    acc[...] = acc * alpha + pv
                    m_run[...] = m_new
                o = nl.divide(acc, l_run, dtype=q.dtype)
                nl.store(out[b, h, nl.ds(qt * B_P_SIZE, nq), :], value=o)
    return out


def cross_attention_reference(q, k, v, encoder_mask, softmax_scale=None):
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    D = q.shape[-1]
    scale = softmax_scale if softmax_scale is not None else 1.0 / np.sqrt(D)
    s = np.einsum("bhqd,bhkd->bhqk", q, k) * scale
    s = np.where(np.asarray(encoder_mask)[:, None, None, :] != 0, s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("bhqk,bhkd->bhqd", p, v) / p.sum(-1, keepdims=True)
