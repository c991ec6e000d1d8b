"""``neuronxcc.nki.isa`` (Beta 1): value-returning Tier-1 instructions (spec §2.1 "Beta 1" signatures).

Each function allocates a fresh result tile (SBUF; PSUM for ``nc_matmul`` and a TensorE ``nc_transpose``)
and calls the dst-passing new-dialect instruction of ``nsim.nki.isa``. Fallback (spec §1.1): called with an
explicit ``dst=`` keyword, a function writes into ``dst`` and returns ``None``.
"""
from __future__ import annotations

import numpy as np

from ... import tracer as _tr
from ...tracer import NkiTensor, make_error, KernelError, OperandError
from .. import isa as _n
from .. import language as _nnl
from . import language as _nl
from .language import _check_mask, _is_mask, IndexExpr, BlockTensor, masked_elementwise, mask_box, _restrict

# enums, constants and the (dst-passing) Tier-2 instructions of the new dialect
from ..isa import (  # noqa: F401
    engine, tensor_engine, vector_engine, scalar_engine, gpsimd_engine, unknown_engine, reduce_cmd, dge_mode,
    oob_mode, matmul_perf_mode, nc_version, dma_engine, get_nc_version, get_nc_sub_version, NkiValidationError,
    FP32_MIN, dma_transpose, scalar_tensor_tensor, activation_reduce, affine_select, nc_stream_shuffle,
    tensor_tensor_scan, tensor_scalar_reduce, bn_stats, bn_aggr, tensor_copy_predicated, range_select)


def _tile(x, what):
    if isinstance(x, BlockTensor):
        raise make_error(KernelError, "NSIM-E404", "err_failed_to_infer_tile_from_local_tensor: nisa.{} needs a "
                         "tile; index the block dims first".format(what))
    return x


def _new(shape, dtype, buffer="sbuf"):
    return _nnl._new_tile(tuple(shape), dtype, buffer)


def _dt(dtype, default):
    return np.dtype(dtype) if dtype is not None else np.dtype(default)


def _masked(fn, args, mask, what, dtype, dst):
    r = masked_elementwise(fn, args, mask, what, dtype=dtype, out=dst)
    return None if dst is not None else r


def activation(op, data, *, bias=None, scale=1.0, reduce_op=None, reduce_res=None, reduce_cmd=reduce_cmd.idle,
               mask=None, dtype=None, dst=None, **kwargs):
    _tile(data, "activation")
    if _is_mask(mask):
        if reduce_res is not None:
            raise NotImplementedError("nsim: mask= with reduce_res is not supported yet")
        return _masked(lambda d, b, sc: activation(op, d, bias=b, scale=sc, dtype=dtype), (data, bias, scale),
                       mask, "nisa.activation", dtype, dst)
    out = dst if dst is not None else _new(data.shape, _dt(dtype, data.dtype))
    _n.activation(dst=out, op=op, data=data, bias=bias, scale=scale, reduce_op=reduce_op, reduce_res=reduce_res,
                  reduce_cmd=reduce_cmd)
    return None if dst is not None else out


def tensor_tensor(data1, data2, op, *, dtype=None, mask=None, engine=engine.unknown, dst=None, **kwargs):
    _tile(data1, "tensor_tensor")
    _tile(data2, "tensor_tensor")
    if _is_mask(mask):
        return _masked(lambda a, b: tensor_tensor(a, b, op, dtype=dtype, engine=engine), (data1, data2), mask,
                       "nisa.tensor_tensor", dtype, dst)
    out = dst if dst is not None else _new(data1.shape, _dt(dtype, _nnl.promote(data1.dtype, data2.dtype)))
    _n.tensor_tensor(dst=out, data1=data1, data2=data2, op=op, engine=engine)
    return None if dst is not None else out


def tensor_scalar(data, op0, operand0, reverse0=False, op1=None, operand1=None, reverse1=False, *, dtype=None,
                  mask=None, engine=engine.unknown, dst=None, **kwargs):
    _tile(data, "tensor_scalar")
    if _is_mask(mask):
        return _masked(lambda d, o0, o1: tensor_scalar(d, op0, o0, reverse0, op1, o1, reverse1, dtype=dtype,
                                                       engine=engine),
                       (data, operand0, operand1), mask, "nisa.tensor_scalar", dtype, dst)
    out = dst if dst is not None else _new(data.shape, _dt(dtype, data.dtype))
    _n.tensor_scalar(dst=out, data=data, op0=op0, operand0=operand0, reverse0=reverse0, op1=op1,
                     operand1=operand1, reverse1=reverse1, engine=engine)
    return None if dst is not None else out


def tensor_copy(src, *, mask=None, dtype=None, engine=engine.unknown, dst=None, **kwargs):
    _tile(src, "tensor_copy")
    if _is_mask(mask):
        return _masked(lambda x: tensor_copy(x, dtype=dtype, engine=engine), (src,), mask, "nisa.tensor_copy",
                       dtype, dst)
    out = dst if dst is not None else _new(src.shape, _dt(dtype, src.dtype))
    _n.tensor_copy(dst=out, src=src, engine=engine)
    return None if dst is not None else out


def tensor_reduce(op, data, axis, *, mask=None, dtype=None, negate=False, keepdims=False, dst=None, **kwargs):
    _check_mask(mask, "nisa.tensor_reduce")
    _tile(data, "tensor_reduce")
    if dst is not None:
        _n.tensor_reduce(dst=dst, op=op, data=data, axis=axis, negate=negate, keepdims=keepdims)
        return None
    axes = _nnl._axes(data, axis, "tensor_reduce")
    kshape = [1 if i in axes else s for i, s in enumerate(data.shape)]
    out = _new(kshape, _dt(dtype, data.dtype))
    _n.tensor_reduce(dst=out, op=op, data=data, axis=axes, negate=negate, keepdims=True)
    return out if keepdims else _nnl._drop(out, axes)


def nc_matmul(stationary, moving, *, is_stationary_onezero=False, is_moving_onezero=False, is_transpose=False,
              tile_position=(), tile_size=(), mask=None, dst=None, **kwargs):
    """A fresh fp32 PSUM tile ``[M, N] = stationary.T @ moving``; ``psum[...] += nisa.nc_matmul(...)``
    accumulates into ``psum[...]`` instead."""
    _check_mask(mask, "nisa.nc_matmul")
    _tile(stationary, "nc_matmul")
    _tile(moving, "nc_matmul")
    perf = kwargs.get("perf_mode")
    perf = _n.matmul_perf_mode.double_row if perf and "double_row" in str(perf) else _n.matmul_perf_mode.none
    if dst is not None:
        _n.nc_matmul(dst=dst, stationary=stationary, moving=moving, is_stationary_onezero=is_stationary_onezero,
                     is_moving_onezero=is_moving_onezero, is_transpose=is_transpose,
                     accumulate=kwargs.get("accumulate"), perf_mode=perf)
        return None
    m = stationary.shape[-1] if stationary.ndim == 2 else stationary.size // stationary.shape[0]
    n = moving.shape[-1] if moving.ndim == 2 else moving.size // moving.shape[0]
    odt = stationary.dtype if is_transpose else np.float32
    out = _new((m, n), odt, "psum")
    ins = _n.nc_matmul(dst=out, stationary=stationary, moving=moving, is_stationary_onezero=is_stationary_onezero,
                       is_moving_onezero=is_moving_onezero, is_transpose=is_transpose, accumulate=False,
                       perf_mode=perf)
    out._mm = ins.stmt
    return out


def nc_transpose(data, *, mask=None, dtype=None, engine=engine.unknown, dst=None, **kwargs):
    _check_mask(mask, "nisa.nc_transpose")
    _tile(data, "nc_transpose")
    p = data.shape[0]
    f = data.size // p
    if dst is not None:
        _n.nc_transpose(dst=dst, data=data, engine=engine)
        return None
    eng = _n._engine(engine, ("tensor", "vector"), "nc_transpose")
    if eng is None:
        eng = "vector" if p <= 32 and f <= 32 else "tensor"
    out = _new((f, p), data.dtype, "psum" if eng == "tensor" else "sbuf")
    _n.nc_transpose(dst=out, data=data, engine=eng)
    if dtype is not None and np.dtype(dtype) != out.dtype:
        return _nnl.copy_(out, dtype=dtype)
    return out


def memset(shape, value, dtype, *, mask=None, engine=engine.unknown, dst=None, **kwargs):
    _check_mask(mask, "nisa.memset")
    if dst is not None:
        _n.memset(dst=dst, value=value, engine=engine)
        return None
    shape = tuple(int(s) for s in shape)  # par_dim ignored: first dim = partitions
    out = _new(shape, dtype)
    v = int(value) if (np.issubdtype(out.dtype, np.integer) or out.dtype == np.bool_) else value
    _n.memset(dst=out, value=v, engine=engine)
    return out


def reciprocal(data, *, mask=None, dtype=None, dst=None, **kwargs):
    _tile(data, "reciprocal")
    if _is_mask(mask):
        return _masked(lambda x: reciprocal(x, dtype=dtype), (data,), mask, "nisa.reciprocal", dtype, dst)
    out = dst if dst is not None else _new(data.shape, _dt(dtype, data.dtype))
    _n.reciprocal(dst=out, data=data)
    return None if dst is not None else out


def iota(expr, dtype, *, mask=None, dst=None, **kwargs):
    """``nisa.iota(expr, dtype)``: a tile holding the values of the affine index expression ``expr``
    (e.g. ``nl.arange(128)[:, None] * 4 + nl.arange(64)[None, :]``)."""
    _check_mask(mask, "nisa.iota")
    e = IndexExpr._lift(expr)
    if e is None:
        raise make_error(OperandError, "NSIM-E305", "nisa.iota: expr must be an nl.arange / nl.mgrid expression "
                         "or an int, got {!r}".format(expr))
    if e.ndim == 1:
        e = e._pad(2) if e.shape[0] == 1 else IndexExpr(e.offset, {0: e.coefs.get(0, 0)}, (e.shape[0], 1))
    if e.ndim < 2:
        e = e._pad(2)
    shape = e.shape
    pattern = [[e.coefs.get(a, 0), shape[a]] for a in range(1, e.ndim)]
    out = dst if dst is not None else _new(shape, dtype)
    _n.iota(dst=out, pattern=pattern, offset=e.offset, channel_multiplier=e.coefs.get(0, 0))
    return None if dst is not None else out


def dma_copy(*, dst, src, mask=None, dst_rmw_op=None, oob_mode=oob_mode.error, dge_mode=dge_mode.unknown,
             **kwargs):
    """Beta-1 ``dma_copy`` is keyword-only and writes ``dst``."""
    if dst_rmw_op is not None:
        raise NotImplementedError("nsim: dma_copy(dst_rmw_op=) is not supported yet")
    if _is_mask(mask):
        box = mask_box(mask, dst.shape)
        if box is None:
            return None
        if tuple(src.shape) != tuple(dst.shape):
            raise NotImplementedError("nsim: masked dma_copy needs src and dst of the same shape")
        dst, src = _restrict(dst, box), _restrict(src, box)
    _n.dma_copy(dst=_tile(dst, "dma_copy"), src=_tile(src, "dma_copy"), oob_mode=oob_mode, dge_mode=dge_mode,
                engine=kwargs.get("engine", engine.unknown))
    return None
