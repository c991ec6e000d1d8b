"""Mixed-precision optimizer utilities in the new NKI dialect (``import nki``, ISA calls writing ``dst=``), written
the way public NKI 0.3+ kernels are:

- ``sgd_accum_step(w, mom, grads, lr, momentum, weight_decay, nesterov)``: SGD with momentum (optionally Nesterov)
  and decoupled-free (L2, torch.optim.SGD) weight decay on fp32 master weights [N, F] (row tiles of 128), the
  gradient accumulated in fp32 over M micro-batches of bf16 gradients [M, N, F] (mean of the M), the new master
  weights, the new momentum buffer and a bf16 copy of the weights (round to nearest even by ``tensor_copy``)
  written back (or, with ``stochastic_rounding``, stochastically rounded: ``nisa.rng`` bits >> 16 added to the
  fp32 bit pattern viewed as uint32, shifted right by 16 into the bf16 pattern). g = mean_m(grads[m]) + wd w; v' = mu v + g; step = g + mu v' (Nesterov) or v'; w' = w - lr step.
- ``ema_update(ema, w, decay)``: Polyak averaging ema' = decay ema + (1 - decay) w (one ``tensor_scalar`` and one
  ``scalar_tensor_tensor`` per tile).
- ``clip_by_value(g, clip)``: clamp(g, -clip, clip) by one two-op ``tensor_scalar`` (maximum then minimum).
- ``cast_fp16(x, clamp)``: the overflow-safe fp32 -> fp16 cast of mixed-precision training: values clamped to
  +-65504 (fp16 max) before the ``tensor_copy`` into an fp16 tile; ``clamp=False`` is the unsafe plain cast.

Written for nsim's tests in the style of public kernels; not copies of any file. No nsim imports.
"""
import nki
import nki.isa as nisa
import nki.language as nl

P_MAX = 128
FP16_MAX = 65504.0


def _round_bf16_stochastic(dst, src, F):
  """dst (bf16) = src (fp32) stochastically rounded: 16 random bits added to the fp32 bit pattern, which is then
  truncated to its top 16 bits (the bf16 pattern)."""
  rnd = nl.ndarray((P_MAX, F), dtype=nl.uint32, buffer=nl.sbuf)
  nisa.rng(dst=rnd)
  nisa.tensor_scalar(dst=rnd, data=rnd, op0=nl.right_shift, operand0=16)
  bits = nl.ndarray((P_MAX, F), dtype=nl.uint32, buffer=nl.sbuf)
  nisa.tensor_tensor(dst=bits, data1=src.view(nl.uint32), data2=rnd, op=nl.add)
  nisa.tensor_scalar(dst=bits, data=bits, op0=nl.right_shift, operand0=16)
  nisa.tensor_copy(dst=dst.view(nl.uint16), src=bits)


@nki.jit
def sgd_accum_step(w, mom, grads, lr=0.01, momentum=0.9, weight_decay=1e-4, nesterov=True,
                   stochastic_rounding=False):
  N, F = w.shape
  M = grads.shape[0]
  assert N % P_MAX == 0 and grads.shape[1:] == (N, F)
  w_out = nl.ndarray((N, F), dtype=w.dtype, buffer=nl.shared_hbm)
  mom_out = nl.ndarray((N, F), dtype=mom.dtype, buffer=nl.shared_hbm)
  w_bf16 = nl.ndarray((N, F), dtype=nl.bfloat16, buffer=nl.shared_hbm)

  for t in nl.affine_range(N // P_MAX):
    r0 = t * P_MAX
    wt = nl.ndarray((P_MAX, F), dtype=nl.float32, buffer=nl.sbuf)
    vt = nl.ndarray((P_MAX, F), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=wt, src=w[r0:r0 + P_MAX, :])
    nisa.dma_copy(dst=vt, src=mom[r0:r0 + P_MAX, :])

    # gradient accumulation over the micro-batches, in fp32
    acc = nl.ndarray((P_MAX, F), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=acc, value=0.0)
    for m in nl.sequential_range(M):
      gt = nl.ndarray((P_MAX, F), dtype=grads.dtype, buffer=nl.sbuf)
      nisa.dma_copy(dst=gt, src=grads[m, r0:r0 + P_MAX, :])
      nisa.tensor_tensor(dst=acc, data1=acc, data2=gt, op=nl.add)

    # g = acc / M + wd * w
    g = nl.ndarray((P_MAX, F), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=g, data=wt, op0=nl.multiply, operand0=weight_decay)
    nisa.scalar_tensor_tensor(dst=g, data=acc, op0=nl.multiply, operand0=1.0 / M, op1=nl.add, operand1=g)
    # v' = mu v + g
    nisa.scalar_tensor_tensor(dst=vt, data=vt, op0=nl.multiply, operand0=momentum, op1=nl.add, operand1=g)
    step = vt
    if nesterov:
      step = nl.ndarray((P_MAX, F), dtype=nl.float32, buffer=nl.sbuf)
      nisa.scalar_tensor_tensor(dst=step, data=vt, op0=nl.multiply, operand0=momentum, op1=nl.add, operand1=g)
    # w' = w - lr * step = (step * -lr) + w
    nisa.scalar_tensor_tensor(dst=wt, data=step, op0=nl.multiply, operand0=-lr, op1=nl.add, operand1=wt)
    wb = nl.ndarray((P_MAX, F), dtype=nl.bfloat16, buffer=nl.sbuf)
    if stochastic_rounding:
      _round_bf16_stochastic(wb, wt, F)
    else:
      nisa.tensor_copy(dst=wb, src=wt)

    nisa.dma_copy(dst=w_out[r0:r0 + P_MAX, :], src=wt)
    nisa.dma_copy(dst=mom_out[r0:r0 + P_MAX, :], src=vt)
    nisa.dma_copy(dst=w_bf16[r0:r0 + P_MAX, :], src=wb)
  return w_out, mom_out, w_bf16


@nki.jit
def ema_update(ema, w, decay=0.999):
  N, F = ema.shape
  assert N % P_MAX == 0
  out = nl.ndarray((N, F), dtype=ema.dtype, buffer=nl.shared_hbm)
  for t in nl.affine_range(N // P_MAX):
    r0 = t * P_MAX
    et = nl.ndarray((P_MAX, F), dtype=nl.float32, buffer=nl.sbuf)
    wt = nl.ndarray((P_MAX, F), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=et, src=ema[r0:r0 + P_MAX, :])
    nisa.dma_copy(dst=wt, src=w[r0:r0 + P_MAX, :])
    nisa.tensor_scalar(dst=wt, data=wt, op0=nl.multiply, operand0=1.0 - decay)
    nisa.scalar_tensor_tensor(dst=et, data=et, op0=nl.multiply, operand0=decay, op1=nl.add, operand1=wt)
    nisa.dma_copy(dst=out[r0:r0 + P_MAX, :], src=et)
  return out


@nki.jit
def clip_by_value(g, clip=1.0):
  N, F = g.shape
  assert N % P_MAX == 0
  out = nl.ndarray((N, F), dtype=g.dtype, buffer=nl.shared_hbm)
  for t in nl.affine_range(N // P_MAX):
    r0 = t * P_MAX
    gt = nl.ndarray((P_MAX, F), dtype=g.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=gt, src=g[r0:r0 + P_MAX, :])
    nisa.tensor_scalar(dst=gt, data=gt, op0=nl.maximum, operand0=-clip, op1=nl.minimum, operand1=clip)
    nisa.dma_copy(dst=out[r0:r0 + P_MAX, :], src=gt)
  return out


@nki.jit
def cast_fp16(x, clamp=True):
  N, F = x.shape
  assert N % P_MAX == 0
  out = nl.ndarray((N, F), dtype=nl.float16, buffer=nl.shared_hbm)
  for t in nl.affine_range(N // P_MAX):
    r0 = t * P_MAX
    xt = nl.ndarray((P_MAX, F), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=xt, src=x[r0:r0 + P_MAX, :])
    if clamp:
      nisa.tensor_scalar(dst=xt, data=xt, op0=nl.maximum, operand0=-FP16_MAX, op1=nl.minimum, operand1=FP16_MAX)
    ht = nl.ndarray((P_MAX, F), dtype=nl.float16, buffer=nl.sbuf)
    nisa.tensor_copy(dst=ht, src=xt)
    nisa.dma_copy(dst=out[r0:r0 + P_MAX, :], src=ht)
  return out
