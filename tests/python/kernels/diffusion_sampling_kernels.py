"""Diffusion sampling kernels in the Beta-1 dialect (``neuronxcc.nki``), written the way public NKI kernels for
Stable-Diffusion-style inference on Trainium write the non-UNet parts of a denoising loop (arange index expressions,
value-returning ``nl``/``nisa`` calls, ``nl.load``/``nl.store``, masks for the ragged last tile):

- ``ddim_cfg_step(sample, eps_uncond, eps_cond, alphas, noise=None, guidance_scale=7.5, eta=0.0,
  clip_sample=False)``: one DDIM step with classifier-free guidance fused in. The latents [B*C, H*W] are viewed
  as rows of ``free`` elements tiled over the 128 partitions (masked last tile). ``alphas`` is a [1, 2] HBM
  tensor (alphas_cumprod[t], alphas_cumprod[t_prev]) from the host schedule, loaded once and broadcast to the
  partitions; the square roots and the DDIM variance are computed on chip. eps = eu + w (ec - eu),
  x0 = (x - sqrt(1 - a_t) eps) / sqrt(a_t) (optionally clipped to [-1, 1]),
  x_prev = sqrt(a_prev) x0 + sqrt(1 - a_prev - sigma^2) eps (+ sigma noise for eta > 0, with
  sigma = eta sqrt((1 - a_prev) / (1 - a_t)) sqrt(1 - a_t / a_prev)). ``eps_cond=None``: ``eps_uncond`` is the
  already guided prediction (no CFG in the step).
- ``cfg_combine(eps_uncond, eps_cond, guidance_scale)``: the guidance combine alone (the unfused pipeline).
- ``euler_cfg_step(sample, eps_uncond, eps_cond, sigmas, noise=None, guidance_scale=7.5)``: Euler (``noise`` None)
  and Euler-ancestral (eta = 1) steps in sigma space as diffusers' EulerDiscrete / EulerAncestralDiscrete write
  them: x0 = x - sigma eps, d = (x - x0) / sigma, x_next = x + d (sigma_down - sigma) + sigma_up noise, with
  sigma_up = min(sigma_next, sqrt(sigma_next^2 (sigma^2 - sigma_next^2) / sigma^2)) and
  sigma_down = sqrt(sigma_next^2 - sigma_up^2) computed on chip from the [1, 2] ``sigmas`` (sigma, sigma_next).
- ``timestep_embedding_mlp(timesteps, w1, b1, w2, b2)``: the sinusoidal timestep embedding (frequencies
  exp(-ln(10000) i / half) from ``nisa.iota`` and the exp activation; [cos, sin] of t * freq through ``nl.cos`` /
  ``nl.sin``, which range-reduce for ScalarE's sin) followed by Linear -> SiLU -> Linear on TensorE: the
  [B, D] embedding transposed per 128-chunk by ``nisa.nc_transpose``, hidden and output computed transposed
  ([H, B], weights as the stationary operand, the bias a per-partition activation bias), transposed back for the
  store.

Written for nsim's tests in the style of those kernels; not copies of any file. No nsim imports.
"""
import math

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl

PMAX = 128


def _cfg(eu, ec, w, mask):
  """uncond + w * (cond - uncond), fp32."""
  diff = nl.subtract(ec, eu, mask=mask)
  return nisa.scalar_tensor_tensor(data=diff, op0=nl.multiply, operand0=float(w), op1=nl.add, operand1=eu,
                                   mask=mask)


@nki.jit
def cfg_combine(eps_uncond, eps_cond, guidance_scale=7.5, free=256):
  R, HW = eps_uncond.shape
  rows = R * HW // free
  assert rows * free == R * HW
  out = nl.ndarray((R, HW), dtype=eps_uncond.dtype, buffer=nl.shared_hbm)
  eu_v = eps_uncond.reshape((rows, free))
  ec_v = eps_cond.reshape((rows, free))
  out_v = out.reshape((rows, free))
  i_p = nl.arange(PMAX)[:, None]
  i_f = nl.arange(free)[None, :]
  for t in nl.affine_range((rows + PMAX - 1) // PMAX):
    valid = t * PMAX + i_p < rows
    eu = nl.load(eu_v[t * PMAX + i_p, i_f], dtype=nl.float32, mask=valid)
    ec = nl.load(ec_v[t * PMAX + i_p, i_f], dtype=nl.float32, mask=valid)
    eps = _cfg(eu, ec, guidance_scale, valid)
    nl.store(out_v[t * PMAX + i_p, i_f], value=eps, mask=valid)
  return out


@nki.jit
def ddim_cfg_step(sample, eps_uncond, eps_cond, alphas, noise=None, guidance_scale=7.5, eta=0.0,
                  clip_sample=False, free=256):
  R, HW = sample.shape
  rows = R * HW // free
  assert rows * free == R * HW
  out = nl.ndarray((R, HW), dtype=sample.dtype, buffer=nl.shared_hbm)

  x_v = sample.reshape((rows, free))
  eu_v = eps_uncond.reshape((rows, free))
  ec_v = eps_cond.reshape((rows, free)) if eps_cond is not None else None
  n_v = noise.reshape((rows, free)) if noise is not None else None
  out_v = out.reshape((rows, free))

  i_p = nl.arange(PMAX)[:, None]
  i_f = nl.arange(free)[None, :]

  # per-step scalars of the host schedule, on every partition: a[:, 0] = alphas_cumprod[t], a[:, 1] = [t_prev]
  a_row = nl.load(alphas)
  a = a_row.broadcast_to((PMAX, 2))
  a_t = a[:, 0:1]
  a_prev = a[:, 1:2]
  beta_t = nl.subtract(1.0, a_t)
  beta_prev = nl.subtract(1.0, a_prev)
  sqrt_beta_t = nl.sqrt(beta_t)
  inv_sqrt_a_t = nl.rsqrt(a_t)
  sqrt_a_prev = nl.sqrt(a_prev)
  if eta > 0.0:
    # variance = (beta_prev / beta_t) * (1 - a_t / a_prev); std = eta * sqrt(variance)
    variance = nl.multiply(nl.divide(beta_prev, beta_t), nl.subtract(1.0, nl.divide(a_t, a_prev)))
    std = nl.multiply(nl.sqrt(variance), float(eta))
    dir_coef = nl.sqrt(nl.subtract(beta_prev, nl.multiply(std, std)))
  else:
    dir_coef = nl.sqrt(beta_prev)
  neg_sqrt_beta_t = nl.multiply(sqrt_beta_t, -1.0)

  for t in nl.affine_range((rows + PMAX - 1) // PMAX):
    valid = t * PMAX + i_p < rows
    x = nl.load(x_v[t * PMAX + i_p, i_f], dtype=nl.float32, mask=valid)
    eu = nl.load(eu_v[t * PMAX + i_p, i_f], dtype=nl.float32, mask=valid)
    if ec_v is not None:
      ec = nl.load(ec_v[t * PMAX + i_p, i_f], dtype=nl.float32, mask=valid)
      eps = _cfg(eu, ec, guidance_scale, valid)
    else:
      eps = eu

    # x0 = (x - sqrt(1 - a_t) * eps) / sqrt(a_t)
    x0 = nisa.scalar_tensor_tensor(data=eps, op0=nl.multiply, operand0=neg_sqrt_beta_t, op1=nl.add, operand1=x,
                                   mask=valid)
    x0 = nl.multiply(x0, inv_sqrt_a_t, mask=valid)
    if clip_sample:
      x0 = nl.minimum(nl.maximum(x0, -1.0, mask=valid), 1.0, mask=valid)

    direction = nl.multiply(eps, dir_coef, mask=valid)
    prev = nisa.scalar_tensor_tensor(data=x0, op0=nl.multiply, operand0=sqrt_a_prev, op1=nl.add,
                                     operand1=direction, mask=valid)
    if eta > 0.0:
      z = nl.load(n_v[t * PMAX + i_p, i_f], dtype=nl.float32, mask=valid)
      prev = nisa.scalar_tensor_tensor(data=z, op0=nl.multiply, operand0=std, op1=nl.add, operand1=prev,
                                       mask=valid)
    nl.store(out_v[t * PMAX + i_p, i_f], value=prev, mask=valid)
  return out


@nki.jit
def euler_cfg_step(sample, eps_uncond, eps_cond, sigmas, noise=None, guidance_scale=7.5, free=256):
  R, HW = sample.shape
  rows = R * HW // free
  assert rows * free == R * HW
  out = nl.ndarray((R, HW), dtype=sample.dtype, buffer=nl.shared_hbm)
  x_v = sample.reshape((rows, free))
  eu_v = eps_uncond.reshape((rows, free))
  ec_v = eps_cond.reshape((rows, free))
  out_v = out.reshape((rows, free))
  i_p = nl.arange(PMAX)[:, None]
  i_f = nl.arange(free)[None, :]

  s = nl.load(sigmas).broadcast_to((PMAX, 2))
  sigma = s[:, 0:1]
  sigma_next = s[:, 1:2]
  inv_sigma = nl.reciprocal(sigma)
  neg_sigma = nl.multiply(sigma, -1.0)
  if noise is not None:
    n_v = noise.reshape((rows, free))
    # ancestral split of the step (eta = 1)
    s2 = nl.multiply(sigma, sigma)
    sn2 = nl.multiply(sigma_next, sigma_next)
    up2 = nl.divide(nl.multiply(sn2, nl.subtract(s2, sn2)), s2)
    sigma_up = nl.minimum(sigma_next, nl.sqrt(up2))
    down2 = nl.maximum(nl.subtract(sn2, nl.multiply(sigma_up, sigma_up)), 0.0)
    sigma_down = nl.sqrt(down2)
    dt = nl.subtract(sigma_down, sigma)
  else:
    dt = nl.subtract(sigma_next, sigma)

  for t in nl.affine_range((rows + PMAX - 1) // PMAX):
    valid = t * PMAX + i_p < rows
    x = nl.load(x_v[t * PMAX + i_p, i_f], dtype=nl.float32, mask=valid)
    eu = nl.load(eu_v[t * PMAX + i_p, i_f], dtype=nl.float32, mask=valid)
    ec = nl.load(ec_v[t * PMAX + i_p, i_f], dtype=nl.float32, mask=valid)
    eps = _cfg(eu, ec, guidance_scale, valid)
    # denoised x0 = x - sigma * eps; derivative d = (x - x0) / sigma
    x0 = nisa.scalar_tensor_tensor(data=eps, op0=nl.multiply, operand0=neg_sigma, op1=nl.add, operand1=x,
                                   mask=valid)
    d = nl.multiply(nl.subtract(x, x0, mask=valid), inv_sigma, mask=valid)
    nxt = nisa.scalar_tensor_tensor(data=d, op0=nl.multiply, operand0=dt, op1=nl.add, operand1=x, mask=valid)
    if noise is not None:
      z = nl.load(n_v[t * PMAX + i_p, i_f], dtype=nl.float32, mask=valid)
      nxt = nisa.scalar_tensor_tensor(data=z, op0=nl.multiply, operand0=sigma_up, op1=nl.add, operand1=nxt,
                                      mask=valid)
    nl.store(out_v[t * PMAX + i_p, i_f], value=nxt, mask=valid)
  return out


@nki.jit
def timestep_embedding_mlp(timesteps, w1, b1, w2, b2, max_period=10000.0):
  B = timesteps.shape[0]
  D, Hd = w1.shape
  assert B <= PMAX and D % 2 == 0 and Hd % PMAX == 0 and w2.shape == (Hd, Hd)
  half = D // 2
  KT = (D + PMAX - 1) // PMAX
  NM = Hd // PMAX
  out = nl.ndarray((B, Hd), dtype=w1.dtype, buffer=nl.shared_hbm)

  i_b = nl.arange(B)[:, None]
  i_bf = nl.arange(B)[None, :]
  i_one = nl.arange(1)[None, :]
  i_p = nl.arange(PMAX)[:, None]
  i_q = nl.arange(PMAX)[None, :]
  i_hd = nl.arange(Hd)[None, :]

  # sinusoidal embedding [B, D] = [cos(t f), sin(t f)], f_i = exp(-ln(max_period) i / half)
  t = nl.load(timesteps.reshape((B, 1))[i_b, i_one], dtype=nl.float32)
  grid = nl.mgrid[0:B, 0:half]
  idx = nisa.iota(grid.x + 0 * grid.p, dtype=nl.float32)
  freqs = nisa.activation(op=nl.exp, data=idx, scale=-math.log(max_period) / half)
  args = nl.multiply(freqs, t)
  emb = nl.ndarray((B, D), dtype=w1.dtype)
  emb[grid.p, grid.x] = nl.cos(args)
  emb[grid.p, half + grid.x] = nl.sin(args)

  # emb^T in chunks of 128 rows of D (the contraction dim on the partitions)
  embT = nl.ndarray((KT, nl.par_dim(PMAX), B), dtype=w1.dtype)
  w1_sb = nl.ndarray((KT, nl.par_dim(PMAX), Hd), dtype=w1.dtype)
  for k in nl.affine_range(KT):
    kd = min(PMAX, D - k * PMAX)
    i_k = nl.arange(kd)[None, :]
    i_kp = nl.arange(kd)[:, None]
    embT[k, i_kp, i_bf] = nisa.nc_transpose(emb[i_b, k * PMAX + i_k])
    w1_sb[k, i_kp, i_hd] = nl.load(w1[k * PMAX + i_kp, i_hd])

  # layer 1: h^T [Hd, B] = silu(w1^T emb^T + b1)
  hT = nl.ndarray((NM, nl.par_dim(PMAX), B), dtype=w1.dtype)
  for m in nl.affine_range(NM):
    h_ps = nl.zeros((PMAX, B), dtype=nl.float32, buffer=nl.psum)
    for k in nl.affine_range(KT):
      kd = min(PMAX, D - k * PMAX)
      i_kp = nl.arange(kd)[:, None]
      h_ps += nisa.nc_matmul(w1_sb[k, i_kp, m * PMAX + i_q], embT[k, i_kp, i_bf])
    b1_col = nl.load(b1.reshape((Hd, 1))[m * PMAX + i_p, i_one], dtype=nl.float32)
    hT[m, i_p, i_bf] = nisa.activation(op=nl.silu, data=h_ps, bias=b1_col, dtype=w1.dtype)

  # layer 2: out^T [Hd, B] = w2^T h^T + b2, transposed back to [B, Hd]
  res = nl.ndarray((B, Hd), dtype=w1.dtype)
  for m in nl.affine_range(NM):
    o_ps = nl.zeros((PMAX, B), dtype=nl.float32, buffer=nl.psum)
    for k in nl.affine_range(NM):
      w2_t = nl.load(w2[k * PMAX + i_p, m * PMAX + i_q])
      o_ps += nisa.nc_matmul(w2_t, hT[k, i_p, i_bf])
    b2_col = nl.load(b2.reshape((Hd, 1))[m * PMAX + i_p, i_one], dtype=nl.float32)
    oT = nisa.activation(op=nl.copy, data=o_ps, bias=b2_col, dtype=w1.dtype)
    res[i_b, m * PMAX + i_q] = nisa.nc_transpose(oT)
  nl.store(out[i_b, i_hd], value=res)
  return out
