"""``nki.isa`` (new dialect, dst-passing): Tier-1 instructions lowered to kernel.json ops.

Every instruction builds one op statement and hands it to ``nsim.tracer.emit``.
"""
from __future__ import annotations

import enum

import numpy as np

from .. import tracer as _tr
from ..tracer import NkiTensor, make_error, KernelError, OperandError
from . import language as _nl

# --------------------------------------------------------------------------------------------------
# Enums (§2.5)
# --------------------------------------------------------------------------------------------------


class engine(enum.IntEnum):  # noqa: N801
    unknown = 0
    tensor = 1
    scalar = 2
    gpsimd = 3
    dma = 4
    vector = 5
    sync = 6


tensor_engine, vector_engine, scalar_engine, gpsimd_engine, unknown_engine = (
    engine.tensor, engine.vector, engine.scalar, engine.gpsimd, engine.unknown)


class reduce_cmd(enum.IntEnum):  # noqa: N801
    idle = 0
    reset = 1
    reduce = 2
    reset_reduce = 3
    load_reduce = 4


class dge_mode(enum.IntEnum):  # noqa: N801
    unknown = 0
    swdge = 1
    hwdge = 2
    none = 3


class oob_mode(enum.IntEnum):  # noqa: N801
    error = 0
    skip = 1


class matmul_perf_mode(str, enum.Enum):  # noqa: N801
    none = "none"
    double_row = "double_row"


class nc_version(enum.IntEnum):  # noqa: N801
    gen2 = 2
    gen3 = 3
    gen4 = 4


class dma_engine(enum.IntEnum):  # noqa: N801
    dma = 1
    gpsimd_dma = 2


_GEN = {"trn1": nc_version.gen2, "inf2": nc_version.gen2, "gen2": nc_version.gen2, "trn2": nc_version.gen3,
        "gen3": nc_version.gen3, "trn3": nc_version.gen4, "gen4": nc_version.gen4}


def get_nc_version():
    import os
    for var in ("NKI_NC_VERSION", "NEURON_PLATFORM_TARGET_OVERRIDE"):
        v = os.environ.get(var)
        if v and v in _GEN:
            return _GEN[v]
    return nc_version.gen3


def get_nc_sub_version():
    return 0


class NkiValidationError(Exception):
    pass


class NkiInstruction:
    """Handle returned by nisa calls (0.6); scheduling hints are functional no-ops."""

    __slots__ = ("stmt",)

    def __init__(self, stmt):
        self.stmt = stmt

    def depends_on(self, *producers):
        return self


# --------------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------------

_ENGINE_NAMES = {engine.tensor: "tensor", engine.vector: "vector", engine.scalar: "scalar",
                 engine.gpsimd: "gpsimd", engine.sync: "sync"}


def _engine(e, allowed=None, what="instruction"):
    if e is None:
        return None
    if isinstance(e, str):
        name = e
    else:
        try:
            e = engine(int(e))
        except ValueError:
            raise make_error(OperandError, "NSIM-E306", "bad engine {!r}".format(e))
        if e == engine.unknown:
            return None
        name = _ENGINE_NAMES.get(e)
    if name is None or (allowed is not None and name not in allowed):
        raise make_error(OperandError, "NSIM-E306", "engine {} is not allowed for {} (allowed: {})".format(
            getattr(e, "name", e), what, ", ".join(allowed or ())))
    return name


def _t(x, slot, what):
    _tr.current("nisa." + what)  # outside a kernel: a clear error first
    if not isinstance(x, NkiTensor):
        raise make_error(OperandError, "NSIM-E305", "{}: operand '{}' must be a tensor (view), got {!r}".format(
            what, slot, x))
    return x


def _op(name, **fields):
    tr = _tr.current("nisa." + name)
    stmt = {"op": name}
    for k, v in fields.items():
        if v is None:
            continue
        if isinstance(v, NkiTensor):
            v = v.access()
        if k == "flags" and not v:
            continue
        stmt[k] = v
    return NkiInstruction(tr.emit(stmt))


def _is_scalar(x):
    return isinstance(x, (int, float, np.integer, np.floating, bool))


def _imm(vals):
    """imm list up to the last non-default entry."""
    d = [0.0, 0.0, 1.0, 0.0]
    for i, v in vals.items():
        d[i] = float(v)
    return d


def _rcmd(c):
    if c is None:
        return None
    c = reduce_cmd(int(c))
    return None if c == reduce_cmd.idle else c.name


# --------------------------------------------------------------------------------------------------
# Tier 1
# --------------------------------------------------------------------------------------------------


def dma_copy(dst, src, priority=None, oob_mode=oob_mode.error, dge_mode=dge_mode.unknown, engine=engine.unknown,
             name=None, **kwargs):
    _t(dst, "dst", "dma_copy")
    _t(src, "src", "dma_copy")
    if kwargs.get("dst_rmw_op") is not None:
        raise make_error(KernelError, "NSIM-E404", "dma_copy(dst_rmw_op=) is not supported yet")
    if dst.size != src.size:
        raise make_error(OperandError, "NSIM-E304", "dma_copy: dst has {} elements, src has {}".format(
            dst.size, src.size))
    eng = _engine(engine, ("sync", "scalar", "gpsimd"), "dma_copy")
    return _op("dma_copy", engine=eng, dst=dst, src=src)


def tensor_copy(dst, src, engine=engine.unknown, name=None, dtype=None, **kwargs):
    _t(dst, "dst", "tensor_copy")
    _t(src, "src", "tensor_copy")
    return _op("tensor_copy", engine=_engine(engine, ("vector", "scalar", "gpsimd"), "tensor_copy"), dst=dst, src=src)


def tensor_tensor(dst, data1, data2, op, engine=engine.unknown, name=None, **kwargs):
    _t(dst, "dst", "tensor_tensor")
    _t(data1, "data1", "tensor_tensor")
    _t(data2, "data2", "tensor_tensor")
    return _op("tensor_tensor", engine=_engine(engine, ("vector", "gpsimd"), "tensor_tensor"), dst=dst,
               data1=data1, data2=data2, alu0=_nl.alu_name(op))


def memset(dst, value, engine=engine.unknown, name=None, **kwargs):
    _t(dst, "dst", "memset")
    eng = _engine(engine, ("vector", "gpsimd"), "memset")
    if np.issubdtype(dst.dtype, np.integer) or dst.dtype == np.bool_:
        return _op("memset", engine=eng, dst=dst, iimm=[int(value)])
    return _op("memset", engine=eng, dst=dst, imm=[float(value)])


def _operand(x, i, fields, flags, what):
    """A tensor_scalar operand: compile-time scalar -> has_immI + imm[i]; (P,1) vector -> slot operandI."""
    if x is None:
        return
    if _is_scalar(x):
        flags.append("has_imm{}".format(i))
        fields.setdefault("imm", {})[i] = x
    elif isinstance(x, NkiTensor):
        fields["operand{}".format(i)] = x
    else:
        raise make_error(OperandError, "NSIM-E305", "{}: operand{} must be a scalar or a (P, 1) tensor, got "
                         "{!r}".format(what, i, x))


def tensor_scalar(dst, data, op0, operand0, reverse0=False, op1=None, operand1=None, reverse1=False,
                  engine=engine.unknown, name=None, **kwargs):
    _t(dst, "dst", "tensor_scalar")
    _t(data, "data", "tensor_scalar")
    fields, flags = {}, []
    _operand(operand0, 0, fields, flags, "tensor_scalar")
    if (op1 is None) != (operand1 is None) and not (op1 is not None and _nl.opcode(op1).alu in _UNARY):
        raise make_error(OperandError, "NSIM-E305", "tensor_scalar: op1 and operand1 must both be given or both "
                         "be None")
    _operand(operand1, 1, fields, flags, "tensor_scalar")
    if reverse0:
        flags.append("reverse0")
    if reverse1:
        flags.append("reverse1")
    imm = fields.pop("imm", None)
    return _op("tensor_scalar", engine=_engine(engine, ("vector", "scalar", "gpsimd"), "tensor_scalar"), dst=dst,
               data=data, operand0=fields.get("operand0"), operand1=fields.get("operand1"),
               alu0=_nl.alu_name(op0, "op0"), alu1=_nl.alu_name(op1, "op1") if op1 is not None else None,
               flags=flags, imm=_imm(imm) if imm else None)


_UNARY = ("abs", "square", "relu", "rsqrt", "reciprocal", "negative", "invert", "logical_not")


def nc_matmul(dst, stationary, moving, is_stationary_onezero=False, is_moving_onezero=False, is_transpose=False,
              accumulate=None, tile_position=(), tile_size=(), perf_mode=matmul_perf_mode.none, name=None,
              **kwargs):
    _t(dst, "dst", "nc_matmul")
    _t(stationary, "stationary", "nc_matmul")
    _t(moving, "moving", "nc_matmul")
    tr = _tr.current("nisa.nc_matmul")
    flags = []
    if tr.matmul_accumulates(dst, accumulate):
        flags.append("accumulate")
    if is_transpose:
        flags.append("is_transpose")
    if is_stationary_onezero or is_moving_onezero:
        flags.append("onezero")
    if perf_mode not in (None, matmul_perf_mode.none, "none"):
        flags.append("double_row")
    return _op("nc_matmul", dst=dst, stationary=stationary, moving=moving, flags=flags)


def activation(dst, op, data, bias=None, scale=1.0, reduce_op=None, reduce_res=None, reduce_cmd=reduce_cmd.idle,
               name=None, **kwargs):
    _t(dst, "dst", "activation")
    _t(data, "data", "activation")
    imm = {}
    fields = {}
    if bias is None:
        pass
    elif _is_scalar(bias):
        imm[3] = bias
    else:
        fields["bias"] = _t(bias, "bias", "activation")
    if _is_scalar(scale):
        if float(scale) != 1.0:
            imm[2] = scale
    else:
        fields["scale"] = _t(scale, "scale", "activation")
    alu1 = None
    if reduce_op is not None:
        alu1 = _nl.alu_name(reduce_op, "reduce_op")
        if alu1 != "add":
            raise make_error(OperandError, "NSIM-E307", "activation: reduce_op must be nl.add")
    elif reduce_res is not None or _rcmd(reduce_cmd) is not None:
        alu1 = "add"
    if reduce_res is not None:
        fields["reduce_res"] = _t(reduce_res, "reduce_res", "activation")
    return _op("activation", dst=dst, data=data, act=_nl.act_name(op), alu1=alu1, reduce_cmd=_rcmd(reduce_cmd),
               imm=_imm(imm) if imm else None, **fields)


def nc_transpose(dst, data, engine=engine.unknown, name=None, **kwargs):
    _t(dst, "dst", "nc_transpose")
    _t(data, "data", "nc_transpose")
    eng = _engine(engine, ("tensor", "vector"), "nc_transpose")
    if eng is None:
        p = data.shape[0]
        f = data.size // p if p else 0
        eng = "vector" if p <= 32 and f <= 32 else "tensor"
    return _op("nc_transpose", engine=eng, dst=dst, data=data)


def tensor_reduce(dst, op, data, axis, negate=False, keepdims=False, name=None, **kwargs):
    _t(dst, "dst", "tensor_reduce")
    _t(data, "data", "tensor_reduce")
    nd = data.ndim
    axes = [axis] if isinstance(axis, (int, np.integer)) else list(axis)
    axes = sorted(int(a) + nd if int(a) < 0 else int(a) for a in axes)
    if not axes or axes[0] < 1 or axes != list(range(axes[0], nd)):
        raise make_error(OperandError, "NSIM-E307", "tensor_reduce: axis {} must be the last free dims of the "
                         "data view of shape {} (ending at dim {}; dim 0 cannot be reduced)".format(
                             axis, tuple(data.shape), nd - 1))
    if axes[0] == 1:
        axis_count = 0  # all free dims
    else:
        # count in storage dims of the access: from the storage dim of view dim axes[0] to the end
        kept = [i for i, d in enumerate(data._dims) if d[3]]
        axis_count = len(data._dims) - kept[axes[0]]
    return _op("tensor_reduce", dst=dst, data=data, alu0=_nl.alu_name(op), axis_count=axis_count or None,
               flags=["negate"] if negate else None)


# Beta-1 / Tier-2 names used by Tier-1 kernels
def reciprocal(dst, data, name=None, **kwargs):
    _t(dst, "dst", "reciprocal")
    _t(data, "data", "reciprocal")
    return _op("reciprocal", dst=dst, data=data)
