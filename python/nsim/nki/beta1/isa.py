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
from .language import (_check_mask, _is_mask, IndexExpr, BlockTensor, masked_elementwise, mask_box, _restrict,
                       masked_matmul, transpose_mask, _boxed, cast_box,
                       skipped, nothing as _nothing)

# enums and constants of the new dialect (the Tier-2 instructions are wrapped below, spec §2.2 "Beta 1")
from ..isa import (  # noqa: F401
    engine, tensor_engine, vector_engine, scalar_engine, gpsimd_engine, unknown_engine, reduce_cmd, dge_mode,
    oob_mode, matmul_perf_mode, nc_version, dma_engine, get_nc_version, get_nc_sub_version, NkiValidationError,
    FP32_MIN)


def _tile(x, what, arg="operand"):
    if not isinstance(x, (NkiTensor, BlockTensor)):
        # e.g. None from a helper function that forgot to return its tile (was an AttributeError)
        raise make_error("BadOperandKind", "nisa.{}: {} must be a tile, got {!r}".format(what, arg, _tr.shown(x)))
    if isinstance(x, BlockTensor):
        raise make_error("TileInference", "err_failed_to_infer_tile_from_local_tensor: nisa.{} needs a "
                         "tile; index the block dims first".format(what))
    return x


def _new(shape, dtype, buffer="sbuf"):
    return _nnl._new_tile(tuple(shape), dtype, buffer)


def _pe_operand(x):
    """A TensorE operand: a temporary the kernel got back from a TensorE instruction (its result in PSUM, never
    assigned to a tensor of the kernel's own) is moved to SBUF first, as the compiler moves it (TensorE reads
    SBUF only). The nki-samples flash attention backward passes ``nisa.nc_transpose`` results straight to
    ``nisa.nc_matmul``. A PSUM tensor the kernel declared stays an error (docs/timing-model.md)."""
    if getattr(x, "_pe_tmp", False) and x.buffer == "psum":
        return _nnl.copy_(x)
    return x


def _pe_result(out):
    if out is not None:
        out._pe_tmp = True
    return out


def _dt(dtype, default):
    return np.dtype(dtype) if dtype is not None else np.dtype(default)


def _masked(fn, args, mask, what, dtype, dst):
    r = masked_elementwise(fn, args, mask, what, dtype=dtype, out=dst)
    return None if dst is not None else r


def activation(op, data, *, bias=None, scale=1.0, reduce_op=None, reduce_res=None, reduce_cmd=reduce_cmd.idle,
               mask=None, dtype=None, dst=None, **kwargs):
    _tile(data, "activation", "data")
    if _is_mask(mask):
        if reduce_res is not None:  # the masked rows' reductions (reduce_res restricted to them too)
            return _masked(lambda d, b, sc, rr: activation(op, d, bias=b, scale=sc, reduce_op=reduce_op,
                                                          reduce_res=rr, reduce_cmd=reduce_cmd, dtype=dtype),
                           (data, bias, scale, reduce_res), mask, "nisa.activation", dtype, dst)
        return _masked(lambda d, b, sc: activation(op, d, bias=b, scale=sc, dtype=dtype), (data, bias, scale),
                       mask, "nisa.activation", dtype, dst)
    _fp32_scale(scale, "activation")
    out = dst if dst is not None else _new(data.shape, _dt(dtype, data.dtype))
    _n.activation(dst=out, op=op, data=data, bias=bias, scale=scale, reduce_op=reduce_op, reduce_res=reduce_res,
                  reduce_cmd=reduce_cmd)
    return None if dst is not None else out


def _fp32_scale(scale, api):
    """nki-api.md 2.1 activation: the scale is a compile-time float or a (P,1) fp32 vector; the Beta-1 compiler rejects
    another dtype (err_activation_scale_invalid_type). (The new dialect converts it, as tensor_scalar's operand
    vectors: the NKI 0.6 tutorials pass bf16 ones.)"""
    if isinstance(scale, NkiTensor) and np.dtype(scale.dtype) != np.float32:
        raise make_error("BadDtype", "{}: a scale vector must be float32, got {} (err_activation_scale_invalid_type; "
                         "cast it with nl.copy(..., dtype=nl.float32))".format(api, scale.dtype))


def tensor_tensor(data1, data2, op, *, dtype=None, mask=None, engine=engine.unknown, dst=None, **kwargs):
    _tile(data1, "tensor_tensor", "data1")
    _tile(data2, "tensor_tensor", "data2")
    if _is_mask(mask):
        return _masked(lambda a, b: tensor_tensor(a, b, op, dtype=dtype, engine=engine), (data1, data2), mask,
                       "nisa.tensor_tensor", dtype, dst)
    out = dst if dst is not None else _new(data1.shape, _dt(dtype, _nnl.promote(data1.dtype, data2.dtype)))
    _n.tensor_tensor(dst=out, data1=data1, data2=data2, op=op, engine=engine)
    return None if dst is not None else out


def tensor_scalar(data, op0, operand0, reverse0=False, op1=None, operand1=None, reverse1=False, *, dtype=None,
                  mask=None, engine=engine.unknown, dst=None, **kwargs):
    _tile(data, "tensor_scalar", "data")
    if _is_mask(mask):
        return _masked(lambda d, o0, o1: tensor_scalar(d, op0, o0, reverse0, op1, o1, reverse1, dtype=dtype,
                                                       engine=engine),
                       (data, operand0, operand1), mask, "nisa.tensor_scalar", dtype, dst)
    out = dst if dst is not None else _new(data.shape, _dt(dtype, data.dtype))
    _n.tensor_scalar(dst=out, data=data, op0=op0, operand0=operand0, reverse0=reverse0, op1=op1,
                     operand1=operand1, reverse1=reverse1, engine=engine)
    return None if dst is not None else out


def tensor_copy(src, *, mask=None, dtype=None, engine=engine.unknown, dst=None, **kwargs):
    _tile(src, "tensor_copy", "src")
    _no_runtime_index(src, dst, "tensor_copy")
    if _is_mask(mask):
        return _masked(lambda x: tensor_copy(x, dtype=dtype, engine=engine), (src,), mask, "nisa.tensor_copy",
                       dtype, dst)
    out = dst if dst is not None else _new(src.shape, _dt(dtype, src.dtype))
    _n.tensor_copy(dst=out, src=src, engine=engine)
    return None if dst is not None else out


def _no_runtime_index(src, dst, what):
    for v, fn in ((src, "tensor_copy_dynamic_src(src)"), (dst, "tensor_copy_dynamic_dst(dst=, src=)")):
        if isinstance(v, NkiTensor) and v.is_indirect():
            raise make_error("DynamicIndex", "err_copy_dynamic_indirect_indices_not_natively_supported: nisa.{} "
                             "cannot address the runtime index of '{}'; use nisa.{}".format(what, v.name, fn))


def _restrict_dynamic(view, box):
    """The part of a (possibly runtime-indexed) view inside ``box``; a runtime index is re-applied to the
    restricted static view (its valid range grows when the mask cuts the view's tail)."""
    if box is None or not view.is_indirect():
        return view if box is None else _restrict(view, box)
    ind = view._ind
    part = NkiTensor.__getitem__(view._static(), tuple(slice(lo, hi) for lo, hi in box))
    return part._dynamic(ind.dim, ind.offsets)


def _dynamic_copy(dst, src, mask, engine, what):
    """One dynamic tensor_copy ``dst = src`` inside the mask's rectangle (over dst's shape, §3.8; the positions
    outside it are not written). Returns the rectangle (None: the whole view, or nothing for an all-false mask)."""
    box = None
    if _is_mask(mask) or mask is False:
        box = mask_box(mask, tuple(dst.shape)) if mask is not False else None
        if box is None:
            return None  # nothing to copy
        if tuple(src.shape) != tuple(dst.shape):
            raise make_error("ShapeMismatch", "nisa.{}: a mask needs src and dst of the same shape, got {} and "
                             "{}".format(what, tuple(src.shape), tuple(dst.shape)))
        dst, src = _restrict_dynamic(dst, box), _restrict_dynamic(src, box)
    _n._tensor_copy(dst, src, engine, dynamic=True, what=what)
    return box


def tensor_copy_dynamic_src(src, *, mask=None, dtype=None, engine=engine.unknown, dst=None, **kwargs):
    """A fresh SBUF tile (``dtype``, default src's) = ``src``, where ``src`` is an on-chip view whose address
    has a runtime offset: ``src_tile[i_p, idx_tile[0, j] + i_f]`` / ``src_tile[i_p, idx_tile[0, j], i_z]`` /
    ``src_tile[:, nl.ds(idx_tile[0, j], n)]`` (one-element SBUF int32/uint32 ``idx_tile`` view; docs/isa.md).
    Vector engine by default (``engine=`` vector, scalar or gpsimd); cost max(600, N) cycles."""
    _tr.current("nisa.tensor_copy_dynamic_src")
    if not isinstance(src, NkiTensor):
        raise make_error("BadOperandKind", "nisa.tensor_copy_dynamic_src: src must be a tile view, got {!r}".format(
            _tr.shown(src)))
    _tile(src, "tensor_copy_dynamic_src", "src")
    if isinstance(dst, NkiTensor) and dst.is_indirect():
        raise make_error("DynamicIndex", "nisa.tensor_copy_dynamic_src: dst has a runtime index (use "
                         "tensor_copy_dynamic_dst)")
    out = dst if dst is not None else _new(src.shape, _dt(dtype, src.dtype))
    box = _dynamic_copy(out, src, mask, engine, "tensor_copy_dynamic_src")
    if dst is not None:
        return None
    if box is not None and isinstance(out, _nl.Tensor):
        out._box = [tuple(b) for b in box]  # `res[...] = f(x, mask=m)` assigns only the written part
    return out


def tensor_copy_dynamic_dst(*, dst, src, mask=None, dtype=None, engine=engine.unknown, **kwargs):
    """``dst = src`` where ``dst`` is an on-chip view whose address has a runtime offset (the forms of
    tensor_copy_dynamic_src, on the destination); returns None. ``dtype``: dst's dtype wins (a warning when
    it differs)."""
    _tr.current("nisa.tensor_copy_dynamic_dst")
    for v, nm in ((dst, "dst"), (src, "src")):
        if not isinstance(v, NkiTensor):
            raise make_error("BadOperandKind", "nisa.tensor_copy_dynamic_dst: {} must be a tile view, got {!r}".format(
                nm, _tr.shown(v)))
    _tile(src, "tensor_copy_dynamic_dst", "src")
    if src.is_indirect():
        raise make_error("DynamicIndex", "nisa.tensor_copy_dynamic_dst: src has a runtime index (use "
                         "tensor_copy_dynamic_src)")
    if dtype is not None and np.dtype(dtype) != np.dtype(dst.dtype):
        import warnings
        warnings.warn("nisa.tensor_copy_dynamic_dst: dtype={} ignored, dst is {}".format(np.dtype(dtype), dst.dtype),
                      stacklevel=3)
    _dynamic_copy(dst, src, mask, engine, "tensor_copy_dynamic_dst")
    return None


def tensor_reduce(op, data, axis, *, mask=None, dtype=None, negate=False, keepdims=False, dst=None, **kwargs):
    _tile(data, "tensor_reduce", "data")
    if _is_mask(mask):
        from .language import masked_reduce
        r = masked_reduce(lambda t: tensor_reduce(op, t, axis, dtype=dtype, negate=negate, keepdims=True), data,
                          axis, keepdims if dst is None else True, mask, "nisa.tensor_reduce")
        if dst is None:
            return r
        _n.tensor_copy(dst=dst, src=r)
        return None
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
    accumulates into ``psum[...]`` instead. ``mask=False`` (the flash attention samples' causal
    ``forward_mask`` above the diagonal) issues nothing."""
    _tile(stationary, "nc_matmul", "stationary")
    _tile(moving, "nc_matmul", "moving")
    stationary, moving, mask = _nl.operand_masks(stationary, moving, mask)
    perf = kwargs.get("perf_mode")
    perf = _n.matmul_perf_mode.double_row if perf and "double_row" in str(perf) else _n.matmul_perf_mode.none

    def free(x):  # M of stationary / N of moving: all free elements; double row: [K, 2, M] and [K, 2, N]
        if x.ndim == 2 or (perf == _n.matmul_perf_mode.double_row and x.ndim == 3):
            return x.shape[-1]
        return x.size // x.shape[0]
    if skipped(mask):
        return None if dst is not None else _nothing(
            (free(stationary), free(moving)), stationary.dtype if is_transpose else np.float32, "psum")
    stationary, moving = _pe_operand(stationary), _pe_operand(moving)
    if _is_mask(mask):
        if dst is not None or is_transpose:
            raise make_error("NotSupported", "nisa.nc_matmul under mask= with dst= or is_transpose=True")

        def issue(out, s, mv):
            return _n.nc_matmul(dst=out, stationary=s, moving=mv, is_stationary_onezero=is_stationary_onezero,
                                is_moving_onezero=is_moving_onezero, accumulate=False, tile_position=tile_position,
                                tile_size=tile_size, perf_mode=perf).stmt
        return _pe_result(masked_matmul(stationary, moving, mask, "nisa.nc_matmul", issue))
    if dst is not None:
        _n.nc_matmul(dst=dst, stationary=stationary, moving=moving, is_stationary_onezero=is_stationary_onezero,
                     is_moving_onezero=is_moving_onezero, is_transpose=is_transpose,
                     accumulate=kwargs.get("accumulate"), tile_position=tile_position, tile_size=tile_size,
                     perf_mode=perf)
        return None
    m, n = free(stationary), free(moving)
    odt = stationary.dtype if is_transpose else np.float32
    out = _new((m, n), odt, "psum")
    ins = _n.nc_matmul(dst=out, stationary=stationary, moving=moving, is_stationary_onezero=is_stationary_onezero,
                       is_moving_onezero=is_moving_onezero, is_transpose=is_transpose, accumulate=False,
                       tile_position=tile_position, tile_size=tile_size, perf_mode=perf)
    out._mm = ins.stmt
    return _pe_result(out)


def nc_transpose(data, *, mask=None, dtype=None, engine=engine.unknown, dst=None, **kwargs):
    _tile(data, "nc_transpose", "data")
    p = data.shape[0]
    f = data.size // p
    if skipped(mask):
        return None if dst is not None else _nothing((f, p), _dt(dtype, data.dtype), "sbuf")
    boxes = None
    if _is_mask(mask):
        boxes = transpose_mask(mask, data, "nisa.nc_transpose")
        if boxes is None:
            return None if dst is not None else _nothing((f, p), _dt(dtype, data.dtype), "sbuf")
        data = _restrict(data, boxes[0])
    if dst is not None:
        _n.transpose_into(dst if boxes is None else _restrict(dst, boxes[1]), data, engine)
        return None
    eng = _n._engine(engine, "nc_transpose")
    if eng is None:
        eng = "vector" if p <= 32 and f <= 32 else "tensor"
    if eng == "tensor":
        _n.transpose_limit(p, f, "nisa.nc_transpose")
    out = _new((f, p), data.dtype, "psum" if eng == "tensor" else "sbuf")
    _n.nc_transpose(dst=out if boxes is None else _boxed(out, boxes[1]), data=data, engine=eng)
    if boxes is not None and out._box is not None:
        return _pe_result(cast_box(out, dtype, boxes[1]))
    if dtype is not None and np.dtype(dtype) != out.dtype:
        return _nnl.copy_(out, dtype=dtype)
    return _pe_result(out)


def memset(shape, value, dtype, *, mask=None, engine=engine.unknown, dst=None, **kwargs):
    if _is_mask(mask):
        shp = tuple(dst.shape) if dst is not None else tuple(int(s) for s in shape)
        out = dst if dst is not None else _new(shp, dtype)
        box = mask_box(mask, shp)
        if box is not None:
            part = _restrict(out, box) if dst is not None else _boxed(out, box)
            memset(shp, value, out.dtype, engine=engine, dst=part)
        elif dst is None:
            out._box = ()  # masked off everywhere: nothing written
        return None if dst is not None else out
    if dst is not None:
        _n.memset(dst=dst, value=value, engine=engine)
        return None
    shape = tuple(int(s) for s in shape)  # par_dim ignored: first dim = partitions
    out = _new(shape, dtype)
    v = (_tr.int_immediate(value, "memset: value") if (np.issubdtype(out.dtype, np.integer) or out.dtype == np.bool_)
         else value)
    _n.memset(dst=out, value=v, engine=engine)
    return out


def reciprocal(data, *, mask=None, dtype=None, dst=None, **kwargs):
    _tile(data, "reciprocal", "data")
    if _is_mask(mask):
        return _masked(lambda x: reciprocal(x, dtype=dtype), (data,), mask, "nisa.reciprocal", dtype, dst)
    out = dst if dst is not None else _new(data.shape, _dt(dtype, data.dtype))
    _n.reciprocal(dst=out, data=data)
    return None if dst is not None else out


def iota(expr, dtype, *, mask=None, dst=None, **kwargs):
    """``nisa.iota(expr, dtype)``: a tile holding the values of the affine index expression ``expr``
    (e.g. ``nl.arange(128)[:, None] * 4 + nl.arange(64)[None, :]``)."""
    e = IndexExpr._lift(expr)
    if e is None:
        raise make_error("BadOperandKind", "nisa.iota: expr must be an nl.arange / nl.mgrid expression "
                         "or an int, got {!r}".format(expr))
    if e.ndim == 1:
        e = e._pad(2) if e.shape[0] == 1 else IndexExpr(e.offset, {0: e.coefs.get(0, 0)}, (e.shape[0], 1))
    if e.ndim < 2:
        e = e._pad(2)
    shape = e.shape
    if skipped(mask):
        return None if dst is not None else _nothing(shape, dtype, "sbuf")
    out = dst if dst is not None else _new(shape, dtype)
    target = out
    if _is_mask(mask):  # the expression's values on the mask's rectangle, written there
        box = mask_box(mask, shape)
        if box is None:
            return None if dst is not None else _nothing(shape, dtype, "sbuf")
        e = IndexExpr(e.offset + sum(c * box[a][0] for a, c in e.coefs.items()), e.coefs,
                      [hi - lo for lo, hi in box])
        target = _restrict(out, box) if dst is not None else _boxed(out, box)
    pattern = [[e.coefs.get(a, 0), e.shape[a]] for a in range(1, e.ndim)]
    _n.iota(dst=target, pattern=pattern, offset=e.offset, channel_multiplier=e.coefs.get(0, 0))
    return None if dst is not None else out


def dma_copy(*, dst, src, mask=None, dst_rmw_op=None, oob_mode=oob_mode.error, dge_mode=dge_mode.unknown,
             **kwargs):
    """Beta-1 ``dma_copy`` is keyword-only and writes ``dst``."""
    if any(isinstance(v, _nl.Tensor) and v._t2d for v in (src, dst)) and dst_rmw_op is None:
        # a transposed arange window on one side (``x[n0 + i_f, i_dp]``, spec §3.8): a DMA transpose, as
        # nl.load / nl.store move it; under a mask only the rectangle where the mask holds (a ragged tile)
        box = None
        if _is_mask(mask):
            box = mask_box(mask, dst.shape)
            if box is None:
                return None
        if tuple(src.shape) != tuple(dst.shape):
            raise make_error("ShapeMismatch", "dma_copy: a transposed window needs src and dst of the same shape, "
                             "got {} and {}".format(tuple(src.shape), tuple(dst.shape)))
        if isinstance(src, _nl.Tensor) and src._t2d:
            s, d = src._storage_order(box), (dst if box is None else _restrict(dst, box))
        else:
            s, d = (src if box is None else _restrict(src, box)), dst._storage_order(box)
        if s.dtype != d.dtype:
            raise make_error("NotSupported", "dma_copy of a transposed window needs src and dst of one dtype "
                             "(got {} and {})".format(s.dtype, d.dtype))
        _n.dma_transpose(dst=d, src=s)
        return None
    if _is_mask(mask):
        box = mask_box(mask, dst.shape)
        if box is None:
            return None
        if tuple(src.shape) != tuple(dst.shape):
            raise make_error("NotSupported", "masked dma_copy needs src and dst of the same shape")
        dst, src = _restrict(dst, box), _restrict(src, box)
    _n.dma_copy(dst=_tile(dst, "dma_copy", "dst"), src=_tile(src, "dma_copy", "src"), oob_mode=oob_mode, dge_mode=dge_mode,
                engine=kwargs.get("engine", engine.unknown), dst_rmw_op=dst_rmw_op)
    return None



# --------------------------------------------------------------------------------------------------
# Tier 2 (spec §2.2 "Beta 1" signatures): value-returning wrappers of the dst-passing new-dialect
# instructions. As for Tier 1, an explicit ``dst=`` keyword writes into ``dst`` and returns ``None``.
# --------------------------------------------------------------------------------------------------


def _dtype_of(x):
    return x.dtype if isinstance(x, NkiTensor) else None


def _promote(*xs):
    dts = [d for d in (_dtype_of(x) for x in xs) if d is not None]
    r = dts[0]
    for d in dts[1:]:
        r = _nnl.promote(r, d)
    return r


def _cast(out, dtype):
    if dtype is None or np.dtype(dtype) == out.dtype:
        return out
    return _nnl.copy_(out, dtype=dtype)


def dma_transpose(src, *, axes=None, mask=None, dtype=None, dst=None, **kwargs):
    """A fresh SBUF tile ``src.transpose(axes)`` (2-D, or 3-D / 4-D with axes (2, 1, 0) / (3, 1, 2, 0), the default of
    each rank); ``dtype`` != src adds a cast."""
    _tile(src, "dma_transpose", "src")
    extra = {k: kwargs[k] for k in ("dge_mode", "oob_mode") if k in kwargs}
    form = _n.DMA_TRANSPOSE_AXES.get(src.ndim, tuple(range(src.ndim))[::-1]) if axes is None else axes
    shape = tuple(src.shape[int(a)] for a in form)
    if skipped(mask):
        return None if dst is not None else _nothing(shape, _dt(dtype, src.dtype), "sbuf")
    boxes = None
    if _is_mask(mask):
        if axes is not None and tuple(int(a) for a in axes) != (1, 0):
            raise make_error("NotSupported", "nisa.dma_transpose under mask= transposes 2-D tiles only")
        boxes = transpose_mask(mask, src, "nisa.dma_transpose")
        if boxes is None:
            return None if dst is not None else _nothing(shape, _dt(dtype, src.dtype), "sbuf")
        src = _restrict(src, boxes[0])
    if dst is not None:
        _n.dma_transpose(dst=dst if boxes is None else _restrict(dst, boxes[1]), src=src, axes=axes, **extra)
        return None
    out = _new(shape, src.dtype)
    _n.dma_transpose(dst=out if boxes is None else _boxed(out, boxes[1]), src=src, axes=axes, **extra)
    if boxes is not None and out._box is not None:
        return cast_box(out, dtype, boxes[1])
    return _cast(out, dtype)


def scalar_tensor_tensor(*, data, op0, operand0, op1, operand1, reverse0=False, reverse1=False, dtype=None,
                         mask=None, dst=None, **kwargs):
    """``op1(op0(data, operand0), operand1)``; default dtype: data and operand1 promoted (§3.3)."""
    _tile(data, "scalar_tensor_tensor", "data")
    _tile(operand1, "scalar_tensor_tensor", "operand1")
    if _is_mask(mask):
        return _masked(lambda d, o0, o1: scalar_tensor_tensor(data=d, op0=op0, operand0=o0, op1=op1, operand1=o1,
                                                              reverse0=reverse0, reverse1=reverse1, dtype=dtype),
                       (data, operand0, operand1), mask, "nisa.scalar_tensor_tensor", dtype, dst)
    out = dst if dst is not None else _new(data.shape, _dt(dtype, _promote(data, operand1)))
    _n.scalar_tensor_tensor(dst=out, data=data, op0=op0, operand0=operand0, op1=op1, operand1=operand1,
                            reverse0=reverse0, reverse1=reverse1)
    return None if dst is not None else out


def activation_reduce(op, data, *, reduce_op, reduce_res, bias=None, scale=1.0, mask=None, dtype=None, dst=None,
                      **kwargs):
    """``f(data*scale + bias)`` as a fresh tile; ``reduce_res[:, 0]`` = its reduction over the free dims."""
    _tile(data, "activation_reduce", "data")
    if _is_mask(mask):
        return _masked(lambda d, b, sc, rr: activation_reduce(op, d, reduce_op=reduce_op, reduce_res=rr, bias=b,
                                                              scale=sc, dtype=dtype),
                       (data, bias, scale, reduce_res), mask, "nisa.activation_reduce", dtype, dst)
    out = dst if dst is not None else _new(data.shape, _dt(dtype, data.dtype))
    _n.activation_reduce(dst=out, op=op, data=data, reduce_op=reduce_op, reduce_res=reduce_res, bias=bias,
                         scale=scale)
    return None if dst is not None else out


_PRED_CMP = {"<": "less", "<=": "less_equal", ">": "greater", ">=": "greater_equal", "==": "equal",
             "!=": "not_equal"}


def _pred_expr(pred, shape):
    """``pred`` = ``a <cmp> b`` of affine index expressions -> (cmp, d = a - b as an IndexExpr aligned with
    ``shape``: axis a of d is axis a of the tile, as for masks)."""
    if not isinstance(pred, _nl._Mask):
        raise make_error("BadMask", "nisa.affine_select: pred must be a comparison of nl.arange / "
                         "nl.mgrid expressions (e.g. i_p >= i_f), got {!r}".format(pred))
    if pred.op not in _PRED_CMP or isinstance(pred.a, _nl._Mask) or isinstance(pred.b, _nl._Mask):
        raise make_error("BadMask", "nisa.affine_select: pred must be a single comparison (no & / "
                         "|); combine conditions with nl.where")
    a, b = IndexExpr._lift(pred.a), IndexExpr._lift(pred.b)
    if a is None or b is None:
        raise make_error("BadMask", "nisa.affine_select: pred compares {!r} and {!r}; both sides "
                         "must be affine index expressions or ints".format(pred.a, pred.b))
    # left-aligned like _eval_expr: pad each side on the right to the tile rank
    nd = len(shape)
    sides = []
    for e in (a, b):
        if e.ndim > nd:
            raise make_error("BadMask", "nisa.affine_select: pred has more dims ({}) than the tile "
                             "({})".format(e.ndim, nd))
        sides.append(IndexExpr(e.offset, e.coefs, tuple(e.shape) + (1,) * (nd - e.ndim)))
    d = sides[0] - sides[1]
    for ax, c in d.coefs.items():
        if d.shape[ax] != shape[ax]:
            raise make_error("BadMask", "nisa.affine_select: pred axis {} has size {} but the tile "
                             "has {}".format(ax, d.shape[ax], shape[ax]))
    return _PRED_CMP[pred.op], d


def affine_select(pred, on_true_tile, on_false_value, *, mask=None, dtype=None, dst=None, **kwargs):
    """``out = on_true_tile where pred else on_false_value``; ``pred`` (one comparison of affine index
    expressions) is lowered to the new-dialect pattern ``cmp(offset + p*cm + sum step*i, 0)``."""
    _tile(on_true_tile, "affine_select", "on_true_tile")
    if on_true_tile.buffer == "psum" and not skipped(mask):
        # GpSimd has no PSUM port: the (masked part of the) tile is copied to SBUF first, the copy the compiler
        # makes for the attention samples' `affine_select(on_true_tile=qk_psum[...])` (docs/timing-model.md)
        box = mask_box(mask, tuple(on_true_tile.shape)) if _is_mask(mask) else [(0, n) for n in on_true_tile.shape]
        if box is not None:
            sb = _new(on_true_tile.shape, on_true_tile.dtype)
            _n.tensor_copy(dst=_restrict(sb, box), src=_restrict(on_true_tile, box))
            on_true_tile = sb
    shape = tuple(on_true_tile.shape)
    if len(shape) > 5:
        raise make_error("BadMask", "nisa.affine_select: at most 4 free dims")
    cmp, d = _pred_expr(pred, shape)
    out = dst if dst is not None else _new(shape, _dt(dtype, on_true_tile.dtype))
    src, res = on_true_tile, out
    lo, sizes = [0] * len(shape), list(shape)
    if _is_mask(mask):
        box = mask_box(mask, shape)
        if box is None:
            if dst is None:
                out._box = ()  # masked off everywhere: nothing written
            return None if dst is not None else out
        lo, sizes = [l for l, _ in box], [h - l for l, h in box]
        src, res = _restrict(on_true_tile, box), _restrict(out, box) if dst is not None else _boxed(out, box)
    offset = d.offset + sum(c * lo[ax] for ax, c in d.coefs.items())
    pattern = [[d.coefs.get(ax, 0), sizes[ax]] for ax in range(1, len(shape))] or [[0, 1]]
    _n.affine_select(dst=res, pattern=pattern, channel_multiplier=d.coefs.get(0, 0), on_true_tile=src,
                     on_false_value=on_false_value, cmp_op=cmp, offset=offset)
    return None if dst is not None else out


def nc_stream_shuffle(src, dst, shuffle_mask, *, dtype=None, mask=None, **kwargs):
    """Writes ``dst`` (partition shuffle within each 32-partition quadrant); returns ``None``."""
    _check_mask(mask, "nisa.nc_stream_shuffle")
    _tile(src, "nc_stream_shuffle", "src")
    _tile(dst, "nc_stream_shuffle", "dst")
    sm = []
    for m in shuffle_mask:
        e = IndexExpr._lift(m)
        if e is not None and e.coefs:
            raise make_error("BadOperandKind", "nisa.nc_stream_shuffle: shuffle_mask entries must be "
                             "compile-time ints, got {!r}".format(m))
        sm.append(e.offset if e is not None else m)
    _n.nc_stream_shuffle(dst=dst, src=src, shuffle_mask=sm)
    return None


def tensor_tensor_scan(data0, data1, initial, op0, op1, reverse0=False, reverse1=False, *, dtype=None, mask=None,
                       dst=None, **kwargs):
    """Per-partition scan ``s = op1(op0(data0[i], s), data1[i])`` from ``initial``; default dtype: data0 and
    data1 promoted."""
    _tile(data0, "tensor_tensor_scan", "data0")
    _tile(data1, "tensor_tensor_scan", "data1")
    if _is_mask(mask):
        return _masked(lambda a, b, i: tensor_tensor_scan(a, b, i, op0, op1, reverse0, reverse1, dtype=dtype),
                       (data0, data1, initial), mask, "nisa.tensor_tensor_scan", dtype, dst)
    out = dst if dst is not None else _new(data0.shape, _dt(dtype, _promote(data0, data1)))
    _n.tensor_tensor_scan(dst=out, data0=data0, data1=data1, initial=initial, op0=op0, op1=op1, reverse0=reverse0,
                          reverse1=reverse1)
    return None if dst is not None else out


def tensor_scalar_reduce(*, data, op0, operand0, reduce_op, reduce_res, reverse0=False, dtype=None, mask=None,
                         dst=None, **kwargs):
    """``op0(data, operand0)`` as a fresh tile; ``reduce_res[:, 0]`` = its ``reduce_op`` reduction."""
    _tile(data, "tensor_scalar_reduce", "data")
    if _is_mask(mask):
        return _masked(lambda d, o0, rr: tensor_scalar_reduce(data=d, op0=op0, operand0=o0, reduce_op=reduce_op,
                                                              reduce_res=rr, reverse0=reverse0, dtype=dtype),
                       (data, operand0, reduce_res), mask, "nisa.tensor_scalar_reduce", dtype, dst)
    out = dst if dst is not None else _new(data.shape, _dt(dtype, data.dtype))
    extra = {k: kwargs[k] for k in ("reduce_cmd", "reduce_init", "reduce_res_negate") if k in kwargs}
    _n._tensor_scalar_reduce(dst=out, data=data, op0=op0, operand0=operand0, reduce_op=reduce_op,
                             reduce_res=reduce_res, reverse0=reverse0, beta1=True, **extra)
    return None if dst is not None else out


def _masked_stats(fn, data, width, mask, dtype, dst):
    """bn_stats / bn_aggr under ``mask=`` (evaluated over the input space, §3.8): ``fn`` reads the part of
    ``data`` inside the mask's rectangle and writes the ``width`` outputs of its partitions; the result's
    other partitions stay unwritten (a fresh result records the written part, as masked_reduce does)."""
    out = dst if dst is not None else _new((data.shape[0], width), _dt(dtype, data.dtype))
    box = mask_box(mask, tuple(data.shape))
    if box is not None:
        obox = [tuple(box[0]), (0, width)]
        fn(dst=_restrict(out, obox), data=_restrict(data, box))
        if dst is None:
            out._box = obox
    elif dst is None:
        out._box = ()  # masked off everywhere: nothing written
    return None if dst is not None else out


def bn_stats(data, *, mask=None, dtype=None, dst=None, **kwargs):
    """A fresh ``(P, 6)`` tile of (count, mean, M2) for the even and the odd free positions; under ``mask=``
    (the NKI layernorm tutorial's ``j * bn_stats_fmax + i_f < hidden``) of the elements inside the mask."""
    _tile(data, "bn_stats", "data")
    if _is_mask(mask):
        return _masked_stats(_n.bn_stats, data, 6, mask, dtype, dst)
    out = dst if dst is not None else _new((data.shape[0], 6), _dt(dtype, data.dtype))
    _n.bn_stats(dst=out, data=data)
    return None if dst is not None else out


def bn_aggr(data, *, mask=None, dtype=None, dst=None, **kwargs):
    """A fresh ``(P, 2)`` tile ``[mean, var]`` aggregated from bn_stats (count, mean, M2) triples."""
    _tile(data, "bn_aggr", "data")
    if _is_mask(mask):
        return _masked_stats(_n.bn_aggr, data, 2, mask, dtype, dst)
    out = dst if dst is not None else _new((data.shape[0], 2), _dt(dtype, data.dtype))
    _n.bn_aggr(dst=out, data=data)
    return None if dst is not None else out


def tensor_copy_predicated(*, src, dst, predicate, reverse_pred=False, mask=None, dtype=None, **kwargs):
    """``dst = src`` where ``(predicate != 0) != reverse_pred`` (src: a tile or a scalar); returns ``None``."""
    _tile(dst, "tensor_copy_predicated", "dst")
    _tile(predicate, "tensor_copy_predicated", "predicate")
    if _is_mask(mask):
        box = mask_box(mask, dst.shape)
        if box is None:
            return None
        full = tuple(dst.shape)
        dst = _restrict(dst, box)
        predicate = _restrict(predicate, box) if tuple(predicate.shape) == full else predicate
        if isinstance(src, NkiTensor) and tuple(src.shape) == full:
            src = _restrict(src, box)
    _n.tensor_copy_predicated(dst=dst, src=src, predicate=predicate, reverse_pred=reverse_pred)
    return None


def range_select(*, on_true_tile, comp_op0, comp_op1, bound0, bound1, reduce_cmd=reduce_cmd.idle, reduce_res=None,
                 reduce_op=np.amax, range_start=0, on_false_value=FP32_MIN, mask=None, dtype=None, dst=None,
                 **kwargs):
    """``out[p, j] = on_true_tile[p, j] if comp_op0(range_start + j, bound0[p]) and comp_op1(.., bound1[p])
    else on_false_value``; optional max-reduction into ``reduce_res``."""
    _tile(on_true_tile, "range_select", "on_true_tile")
    if _is_mask(mask):
        shape = tuple(on_true_tile.shape)
        box = mask_box(mask, shape)
        start = range_start
        if box is not None:
            if len(shape) != 2 and any(b != (0, n) for b, n in zip(box[1:], shape[1:])):
                raise make_error("NotSupported", "range_select with a free-dim mask needs a 2-D tile")
            start = range_start + (box[1][0] if len(shape) == 2 else 0)
        return _masked(lambda t, b0, b1, rr: range_select(on_true_tile=t, comp_op0=comp_op0, comp_op1=comp_op1,
                                                          bound0=b0, bound1=b1, reduce_cmd=reduce_cmd,
                                                          reduce_res=rr, reduce_op=reduce_op, range_start=start,
                                                          on_false_value=on_false_value, dtype=dtype),
                       (on_true_tile, bound0, bound1, reduce_res), mask, "nisa.range_select", dtype, dst)
    out = dst if dst is not None else _new(on_true_tile.shape, _dt(dtype, on_true_tile.dtype))
    _n.range_select(dst=out, on_true_tile=on_true_tile, comp_op0=comp_op0, comp_op1=comp_op1, bound0=bound0,
                    bound1=bound1, reduce_cmd=reduce_cmd, reduce_res=reduce_res, reduce_op=reduce_op,
                    range_start=range_start, on_false_value=on_false_value)
    return None if dst is not None else out



# --------------------------------------------------------------------------------------------------
# Tier 3 (§2.3) and §2.4, Beta-1 forms: keyword-only, returning a fresh tile (or writing dst=)
# --------------------------------------------------------------------------------------------------


def _top8_mask(mask, data, what, index_out):
    """The box of ``data`` (the input space, spec 3.8) where a max8 / nc_find_index8 / nc_match_replace8 ``mask=``
    holds, None where it holds nowhere. The usual mask is a ragged row count (``t * 128 + i_p < B``): only those
    partitions are read and written. Where an index is output, a cut of the free dims is accepted only as a
    prefix of a 2-D tile's columns (``i_v < n``: the indices then count from the tile's column 0 as they must)."""
    box = mask_box(mask, tuple(data.shape))
    if (box is not None and index_out and any(tuple(b) != (0, int(n)) for b, n in zip(box[1:], data.shape[1:])) and
            not (len(data.shape) == 2 and box[1][0] == 0)):
        raise make_error("NotSupported", "{}: a mask= restricting the free dims is not supported yet (only the "
                         "partitions); restrict the index ranges instead".format(what))
    return box


def _top8_masked(out, dst, box, obox, issue):
    if box is not None:
        issue(obox)
    if dst is None and isinstance(out, _nl.Tensor):
        out._box = () if box is None else [tuple(b) for b in obox]
    return None if dst is not None else out


def max8(*, src, mask=None, dtype=None, dst=None, **kwargs):
    """A fresh ``(P, 8)`` tile: the 8 largest values of each partition of ``src``, descending."""
    _tile(src, "max8", "src")
    out = dst if dst is not None else _new((src.shape[0], 8), _dt(dtype, src.dtype))
    if _is_mask(mask):
        box = _top8_mask(mask, src, "nisa.max8", False)
        obox = None if box is None else [tuple(box[0]), (0, 8)]
        return _top8_masked(out, dst, box, obox,
                            lambda ob: _n.max8(dst=_restrict(out, ob), src=_restrict(src, box)))
    _n.max8(dst=out, src=src)
    return None if dst is not None else out


def nc_find_index8(*, data, vals, mask=None, dtype=None, dst=None, **kwargs):
    """A fresh ``(P, 8)`` uint32 tile: the index in ``data[p]`` of each ``vals[p, i]`` (all ones if absent)."""
    _tile(data, "nc_find_index8", "data")
    _tile(vals, "nc_find_index8", "vals")
    out = dst if dst is not None else _new((data.shape[0], 8), _dt(dtype, np.uint32))
    if _is_mask(mask):
        box = _top8_mask(mask, data, "nisa.nc_find_index8", True)
        obox = None if box is None else [tuple(box[0]), (0, 8)]
        return _top8_masked(out, dst, box, obox,
                            lambda ob: _n.nc_find_index8(dst=_restrict(out, ob), data=_restrict(data, box),
                                                         vals=_restrict(vals, ob)))
    _n.nc_find_index8(dst=out, data=data, vals=vals)
    return None if dst is not None else out


def nc_match_replace8(*, data, vals, imm, dst_idx=None, mask=None, dtype=None, dst=None, **kwargs):
    """A fresh tile like ``data`` with the first match of each ``vals[p, i]`` replaced by ``imm``."""
    _tile(data, "nc_match_replace8", "data")
    _tile(vals, "nc_match_replace8", "vals")
    out = dst if dst is not None else _new(data.shape, _dt(dtype, data.dtype))
    if _is_mask(mask):
        box = _top8_mask(mask, data, "nisa.nc_match_replace8", dst_idx is not None)
        rows = None if box is None else [tuple(box[0]), (0, 8)]
        return _top8_masked(out, dst, box, box, lambda ob: _n.nc_match_replace8(
            dst=_restrict(out, ob), data=_restrict(data, box), vals=_restrict(vals, rows), imm=imm,
            dst_idx=None if dst_idx is None else _restrict(dst_idx, rows)))
    _n.nc_match_replace8(dst=out, data=data, vals=vals, imm=imm, dst_idx=dst_idx)
    return None if dst is not None else out


def local_gather(src_buffer, index, num_elem_per_idx=1, num_valid_indices=None, *, mask=None, dst=None,
                 **kwargs):
    """A fresh ``(P, V * num_elem_per_idx)`` tile of ``src_buffer``'s dtype (see ``nki.isa.local_gather``)."""
    _check_mask(mask, "nisa.local_gather")
    _tile(src_buffer, "local_gather", "src_buffer")
    _tile(index, "local_gather", "index")
    nv = 16 * int(index.size // index.shape[0]) if num_valid_indices is None else int(num_valid_indices)
    out = dst if dst is not None else _new((src_buffer.shape[0], nv * int(num_elem_per_idx)), src_buffer.dtype)
    _n.local_gather(dst=out, src_buffer=src_buffer, index=index, num_elem_per_idx=num_elem_per_idx,
                    num_valid_indices=num_valid_indices)
    return None if dst is not None else out


def tensor_partition_reduce(op, data, *, mask=None, dtype=None, dst=None, **kwargs):
    """A fresh ``(1, F...)`` tile: ``op`` over the partitions of ``data``; under ``mask=`` (over data's index
    space, spec 2.3) over the masked partitions, into the masked columns only (the rest stays unwritten)."""
    _tile(data, "tensor_partition_reduce", "data")
    out = dst if dst is not None else _new((1,) + tuple(data.shape[1:]), _dt(dtype, data.dtype))
    if _is_mask(mask):
        box = mask_box(mask, tuple(data.shape))
        if box is not None:
            obox = [(0, 1)] + [tuple(b) for b in box[1:]]
            _n.tensor_partition_reduce(dst=_restrict(out, obox), op=op, data=_restrict(data, box))
        if dst is None and isinstance(out, _nl.Tensor):
            out._box = () if box is None else obox
        return None if dst is not None else out
    _check_mask(mask, "nisa.tensor_partition_reduce")
    _n.tensor_partition_reduce(dst=out, op=op, data=data)
    return None if dst is not None else out


def select_reduce(*, dst, predicate, on_true, on_false, reduce_res=None, reduce_cmd=reduce_cmd.idle,
                  reduce_op=np.amax, reverse_pred=False, mask=None, dtype=None, **kwargs):
    """Writes ``dst = where((predicate != 0) != reverse_pred, on_true, on_false)``; returns ``None``."""
    _check_mask(mask, "nisa.select_reduce")
    _tile(dst, "select_reduce", "dst")
    _tile(predicate, "select_reduce", "predicate")
    _tile(on_true, "select_reduce", "on_true")
    _n.select_reduce(dst=dst, predicate=predicate, on_true=on_true, on_false=on_false, reduce_res=reduce_res,
                     reduce_cmd=reduce_cmd, reduce_op=reduce_op, reverse_pred=reverse_pred)
    return None


def sequence_bounds(*, segment_ids, dtype=None, dst=None, **kwargs):
    """A fresh ``(1, 2, n)`` tile of run starts / ends of ``segment_ids (1, n)``."""
    _tile(segment_ids, "sequence_bounds", "segment_ids")
    n = int(segment_ids.size // segment_ids.shape[0])
    out = dst if dst is not None else _new((1, 2, n), _dt(dtype, segment_ids.dtype))
    _n.sequence_bounds(dst=out, segment_ids=segment_ids)
    return None if dst is not None else out



def dropout(data, prob, *, mask=None, dtype=None, dst=None, **kwargs):
    """A fresh tile: ``data`` with each element zeroed with probability ``prob`` (no rescaling)."""
    _tile(data, "dropout", "data")
    if skipped(mask):
        return None if dst is not None else _nothing(data.shape, _dt(dtype, data.dtype), "sbuf")
    if _is_mask(mask):  # the mask's rectangle only (a (P, 1) prob restricted to its partitions)
        return _masked(lambda d, pr: dropout(d, pr, dtype=dtype), (data, prob), mask, "nisa.dropout", dtype, dst)
    _check_mask(mask, "nisa.dropout")
    out = dst if dst is not None else _new(data.shape, _dt(dtype, data.dtype))
    _n.dropout(dst=out, data=data, prob=prob)
    return None if dst is not None else out

# --------------------------------------------------------------------------------------------------
# Keyword checking and name= labels (one place: nsim.nki._api). Keywords these functions read from
# **kwargs (spec §2.1/§2.2 Beta-1 signatures and the new-dialect names they forward) are listed here.
# --------------------------------------------------------------------------------------------------

from .._unsupported import install as _install_unsupported  # noqa: E402

_install_unsupported(globals(), 'neuronxcc.nki.isa', {
    'builtin_custom_op': '*args',
})

from .._api import publish as _publish  # noqa: E402

_publish(globals(), "neuronxcc.nki.isa", isa=True, extra={
    "nc_matmul": ("perf_mode", "accumulate"),
    "dma_copy": ("engine",),
    "dma_transpose": ("dge_mode", "oob_mode"),
    "tensor_scalar_reduce": ("reduce_cmd", "reduce_init", "reduce_res_negate"),
})
