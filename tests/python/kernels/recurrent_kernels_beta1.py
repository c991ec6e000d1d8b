"""A GRU layer in the Beta-1 dialect (``import neuronxcc.nki as nki``, ``neuronxcc.nki.language as nl``,
``neuronxcc.nki.isa as nisa``; value-returning calls, ``nl.load`` / ``nl.store``, ``psum += nc_matmul``), as
public speech ports write it.

* ``gru_layer(x, lengths, w_ih, w_hh, b_ih, b_hh, bidirectional=False)``: x [T, B, I] (I <= 128, B <= 512),
  lengths [1, B] fp32 (ragged batch: sequence b has lengths[b] valid steps), w_ih [D, I, 3H], w_hh [D, H, 3H]
  (H <= 128), b_ih / b_hh [D, 3H, 1] (gate order r, z, n as torch), D = 2 with ``bidirectional`` -> out
  [D, T, H, B] (hidden-major, as the kernel keeps h^T). Per step (``nl.sequential_range``): x_t^T by
  ``nl.load_transpose2d``, r and z from one PSUM tile each (W_i^T x^T and W_h^T h^T accumulated with ``+=``),
  n = tanh(W_in x + b_in + r * (W_hn h + b_hn)), h' = (1 - z) n + z h; the ragged mask m = (len > t) keeps h where
  the sequence has ended (h' = h + m (h_new - h)) and zeroes the output there. The reverse direction reads time
  step T - 1 - t (its h stays 0 until a sequence's last valid step, as a packed sequence).

Written for nsim's tests; not a copy of any public file. No nsim imports.
"""
import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl


@nki.jit
def gru_layer(x, lengths, w_ih, w_hh, b_ih, b_hh, bidirectional=False):
  T, B, I = x.shape
  H = w_hh.shape[1]
  D = 2 if bidirectional else 1
  out = nl.ndarray((D, T, H, B), dtype=x.dtype, buffer=nl.shared_hbm)

  # the sequence lengths broadcast to every hidden unit (partition)
  lens = nl.load(lengths).broadcast_to((H, B))

  for d in nl.static_range(D):
    wi = nl.load(w_ih[d])          # [I, 3H]
    wh = nl.load(w_hh[d])          # [H, 3H]
    bi_r = nl.load(b_ih[d, nl.ds(0, H), :])
    bi_z = nl.load(b_ih[d, nl.ds(H, H), :])
    bi_n = nl.load(b_ih[d, nl.ds(2 * H, H), :])
    bh_r = nl.load(b_hh[d, nl.ds(0, H), :])
    bh_z = nl.load(b_hh[d, nl.ds(H, H), :])
    bh_n = nl.load(b_hh[d, nl.ds(2 * H, H), :])
    b_r = nl.add(bi_r, bh_r, dtype=nl.float32)
    b_z = nl.add(bi_z, bh_z, dtype=nl.float32)

    h = nl.zeros((H, B), dtype=nl.float32, buffer=nl.sbuf)
    for t in nl.sequential_range(T):
      ts = T - 1 - t if d == 1 else t
      xT = nl.load_transpose2d(x[ts])            # [I, B]
      hb = nl.copy(h, dtype=x.dtype)             # the matmul operand

      r_ps = nl.zeros((H, B), dtype=nl.float32, buffer=nl.psum)
      r_ps += nisa.nc_matmul(wi[:, nl.ds(0, H)], xT)
      r_ps += nisa.nc_matmul(wh[:, nl.ds(0, H)], hb)
      z_ps = nl.zeros((H, B), dtype=nl.float32, buffer=nl.psum)
      z_ps += nisa.nc_matmul(wi[:, nl.ds(H, H)], xT)
      z_ps += nisa.nc_matmul(wh[:, nl.ds(H, H)], hb)
      gi_n = nisa.nc_matmul(wi[:, nl.ds(2 * H, H)], xT)
      gh_n = nisa.nc_matmul(wh[:, nl.ds(2 * H, H)], hb)

      r = nisa.activation(op=nl.sigmoid, data=r_ps, bias=b_r)
      z = nisa.activation(op=nl.sigmoid, data=z_ps, bias=b_z)
      hn = nisa.activation(op=nl.copy, data=gh_n, bias=bh_n)
      n_pre = nl.add(gi_n, nl.multiply(r, hn))
      n = nisa.activation(op=nl.tanh, data=n_pre, bias=bi_n)
      # h_new = n + z (h - n); ragged: h <- h + m (h_new - h)
      h_new = nl.add(n, nl.multiply(z, nl.subtract(h, n)))
      m = nl.greater(lens, ts, dtype=nl.float32)
      h[...] = nl.add(h, nl.multiply(m, nl.subtract(h_new, h)))
      nl.store(out[d, ts], value=nl.multiply(h, m, dtype=x.dtype))
  return out
