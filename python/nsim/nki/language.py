"""``nki.language`` (new dialect): buffers, dtypes, creation functions, op codes, loops, tile_size."""
from __future__ import annotations

import os
import re

import numpy as np

try:
    import ml_dtypes as _mld
except ImportError:  # pragma: no cover
    _mld = None

from .. import tracer as _tr
from ..tracer import DynSlice, NkiTensor, make_error, KernelError

# --------------------------------------------------------------------------------------------------
# Buffers (§3.1)
# --------------------------------------------------------------------------------------------------


class MemoryRegion(str):
    """A buffer: compares equal to its name ('sbuf', 'psum', 'private_hbm', 'shared_hbm')."""

    @property
    def ir(self):
        return "hbm" if self.endswith("hbm") else str(self)


sbuf = MemoryRegion("sbuf")
psum = MemoryRegion("psum")
private_hbm = MemoryRegion("private_hbm")
shared_hbm = MemoryRegion("shared_hbm")
hbm = private_hbm


def is_sbuf(b):
    return _ir_buffer(b) == "sbuf"


def is_psum(b):
    return _ir_buffer(b) == "psum"


def is_hbm(b):
    return _ir_buffer(b) == "hbm"


def is_on_chip(b):
    return _ir_buffer(b) in ("sbuf", "psum")


def _ir_buffer(b):
    if b is None:
        return "sbuf"
    if isinstance(b, NkiTensor):
        return b.buffer
    s = str(b)
    if s in ("sbuf", "psum"):
        return s
    if s in ("hbm", "private_hbm", "shared_hbm"):
        return "hbm"
    raise make_error(KernelError, "NSIM-E404", "unknown buffer {!r} (use nl.sbuf, nl.psum, nl.hbm, nl.shared_hbm, "
                     "nl.private_hbm)".format(b))


# --------------------------------------------------------------------------------------------------
# Dtypes (§3.2)
# --------------------------------------------------------------------------------------------------

bool_ = np.bool_
int8, int16, int32 = np.int8, np.int16, np.int32
uint8, uint16, uint32 = np.uint8, np.uint16, np.uint32
float16 = np.float16
float32 = np.float32
if _mld is not None:
    bfloat16 = _mld.bfloat16
    float8_e4m3 = _mld.float8_e4m3
    float8_e4m3fn = _mld.float8_e4m3fn
    float8_e5m2 = _mld.float8_e5m2
    float8_e8m0fnu = getattr(_mld, "float8_e8m0fnu", None)
tfloat32 = np.dtype("V4")  # Beta-1 convention; stored as fp32 rounded to 10 mantissa bits by nsim


class _Min:
    def __init__(self, v):
        self.min = v


fp32 = _Min(float(np.float32(-3.4028235e38)))
bfp16 = _Min(float("-inf"))


def finfo(dtype):
    return _mld.finfo(dtype) if _mld is not None else np.finfo(dtype)


# --------------------------------------------------------------------------------------------------
# tile_size (§3.7)
# --------------------------------------------------------------------------------------------------


class tile_size:  # noqa: N801 - NKI name
    pmax = 128
    psum_fmax = 512
    psum_bank_fmax = 512
    psum_bank_fmax_bytes = 2048
    psum_num_banks = 7 if os.environ.get("NKI_DMA_TRANSPOSE_AS_PE_TRANSPOSE") == "true" else 8
    gemm_stationary_fmax = 128
    gemm_moving_fmax = 512
    bn_stats_fmax = 512
    sbuf_size_bytes = 128 * 224 * 1024
    sbuf_fmax_bytes = 224 * 1024 - 16 * 1024
    total_available_sbuf_size = sbuf_fmax_bytes
    sbuf_fmax = sbuf_fmax_bytes // 4
    psum_min_align = 16
    sbuf_min_align = 16


# --------------------------------------------------------------------------------------------------
# Op codes (§3.5): names from the simulator's own tables
# --------------------------------------------------------------------------------------------------


def _names_from_def(fname, macro):
    here = os.path.dirname(os.path.abspath(__file__))
    for root in (os.path.join(here, "..", "..", "..", "isa"), os.path.join(here, "..", "isa")):
        p = os.path.join(root, fname)
        if os.path.isfile(p):
            with open(p, encoding="utf-8") as f:
                return re.findall(r'^' + macro + r'\(\s*\w+\s*,\s*"(\w+)"', f.read(), re.M)
    return None


def _table(core_fn, fname, macro, fallback):
    core = _tr._core
    if core is not None and hasattr(core, core_fn):
        try:
            v = [x if isinstance(x, str) else (x.get("name") if isinstance(x, dict) else getattr(x, "name", str(x)))
                 for x in getattr(core, core_fn)()]
            if v:
                return v
        except Exception:  # pragma: no cover
            pass
    return _names_from_def(fname, macro) or list(fallback)


ALU_OPS = _table("alu_ops", "alu_ops.def", "ALU", (
    "bypass add subtract multiply maximum minimum divide power equal not_equal greater greater_equal less "
    "less_equal logical_and logical_or logical_xor logical_not abs_max abs_min mod fmod abs square relu rsqrt "
    "reciprocal negative invert bitwise_and bitwise_or bitwise_xor left_shift right_shift average").split())
ACT_FUNCS = _table("act_funcs", "act_funcs.def", "ACT", (
    "copy square sigmoid relu prelu gelu gelu_dx gelu_apprx_tanh gelu_apprx_sigmoid gelu_apprx_sigmoid_dx silu "
    "silu_dx tanh softplus mish erf erf_dx exp log sin arctan sqrt rsqrt reciprocal sign abs").split())


class OpCode:
    """An op code (``nl.add``, ``nl.exp`` ...): an ALU operator and/or an activation function."""

    __slots__ = ("name", "alu", "act")

    def __init__(self, name, alu=None, act=None):
        self.name, self.alu, self.act = name, alu, act

    def __repr__(self):
        return "nl.{}".format(self.name)

    def __call__(self, *args, **kwargs):
        raise make_error(KernelError, "NSIM-E404", "value-returning nl.{}(...) is not supported yet by nsim's new "
                         "dialect; pass nl.{} as op= to an nisa instruction".format(self.name, self.name))


_OPS = {}
for _n in list(dict.fromkeys(list(ALU_OPS) + list(ACT_FUNCS))):
    _OPS[_n] = OpCode(_n, _n if _n in ALU_OPS else None, _n if _n in ACT_FUNCS else None)
    globals()[_n] = _OPS[_n]
# reduction-function aliases
sum = OpCode("sum", "add")  # noqa: A001
max = OpCode("max", "maximum")  # noqa: A001
min = OpCode("min", "minimum")  # noqa: A001
identity = _OPS.get("copy")

_NP_ALIASES = {
    np.add: "add", np.sum: "add", np.subtract: "subtract", np.multiply: "multiply", np.maximum: "maximum",
    np.max: "maximum", np.amax: "maximum", np.minimum: "minimum", np.min: "minimum", np.amin: "minimum",
    np.divide: "divide", np.true_divide: "divide", np.power: "power", np.equal: "equal",
    np.not_equal: "not_equal", np.greater: "greater", np.greater_equal: "greater_equal", np.less: "less",
    np.less_equal: "less_equal", np.logical_and: "logical_and", np.logical_or: "logical_or",
    np.logical_xor: "logical_xor", np.logical_not: "logical_not", np.bitwise_and: "bitwise_and",
    np.bitwise_or: "bitwise_or", np.bitwise_xor: "bitwise_xor", np.invert: "invert", np.left_shift: "left_shift",
    np.right_shift: "right_shift", np.exp: "exp", np.log: "log", np.tanh: "tanh", np.square: "square",
    np.sqrt: "sqrt", np.reciprocal: "reciprocal", np.sin: "sin", np.arctan: "arctan", np.sign: "sign",
    np.abs: "abs", np.absolute: "abs", np.copy: "copy", np.negative: "negative", np.mod: "mod", np.fmod: "fmod",
}


def opcode(op, what="op"):
    """Resolve an op-code argument (nl function, numpy ufunc alias, or name) to an OpCode."""
    if isinstance(op, OpCode):
        return op
    try:
        n = _NP_ALIASES.get(op)
    except TypeError:
        n = None
    if n is None and isinstance(op, str) and op in _OPS:  # nsim convenience
        n = op
    if n is None or n not in _OPS:
        raise make_error(KernelError, "NSIM-E406", "{}={!r} is not an NKI op code".format(what, op))
    return _OPS[n]


def alu_name(op, what="op"):
    o = opcode(op, what)
    if o.alu is None:
        raise make_error(KernelError, "NSIM-E406", "{}=nl.{} is not an ALU operator".format(what, o.name))
    return o.alu


def act_name(op, what="op"):
    o = opcode(op, what)
    if o.act is None:
        raise make_error(KernelError, "NSIM-E406", "{}=nl.{} is not an activation function".format(what, o.name))
    return o.act


# --------------------------------------------------------------------------------------------------
# Creation (§3.4)
# --------------------------------------------------------------------------------------------------


class par_dim(int):  # noqa: N801
    """``nl.par_dim(n)``: accepted in shapes (the new dialect's partition dim is always dim 0)."""


def _shape(shape):
    if isinstance(shape, (int, np.integer)):
        shape = (shape,)
    return tuple(int(s) for s in shape)


def ndarray(shape, dtype, buffer=sbuf, name="", address=None, **kwargs):
    tr = _tr.current("nl.ndarray")
    b = _ir_buffer(buffer)
    if b == "hbm":
        return tr.hbm_tensor(name or None, dtype, _shape(shape))
    return tr.tile(b, dtype, _shape(shape), name=name or None)


def _fill(t, value):
    from . import isa
    isa.memset(t, value)
    return t


def zeros(shape, dtype, buffer=sbuf, name="", **kwargs):
    return _fill_new(shape, 0, dtype, buffer, name)


def ones(shape, dtype, buffer=sbuf, name="", **kwargs):
    return _fill_new(shape, 1, dtype, buffer, name)


def full(shape, fill_value, dtype, buffer=sbuf, name="", **kwargs):
    return _fill_new(shape, fill_value, dtype, buffer, name)


def _fill_new(shape, value, dtype, buffer, name):
    t = ndarray(shape, dtype, buffer=buffer, name=name)
    if t.buffer == "hbm":
        raise make_error(KernelError, "NSIM-E404", "HBM tensors with an initial value are not supported (create an "
                         "SBUF tensor and dma_copy it)")
    if np.issubdtype(t.dtype, np.integer) or t.dtype == np.bool_:
        value = int(value)
    return _fill(t, value)


def zeros_like(x, dtype=None, buffer=None, name="", **kwargs):
    return zeros(x.shape, dtype or x.dtype, buffer=buffer or sbuf, name=name)


def empty_like(x, dtype=None, buffer=None, name="", **kwargs):
    b = buffer if buffer is not None else (x.buffer if x.buffer != "hbm" else shared_hbm)
    return ndarray(x.shape, dtype or x.dtype, buffer=b, name=name)


def ds(start, size):
    return DynSlice(start, size)


# --------------------------------------------------------------------------------------------------
# Loops (§1.7): eager unrolling (sequential semantics)
# --------------------------------------------------------------------------------------------------


def _range(start, stop=None, step=1, **kwargs):
    if stop is None:
        start, stop = 0, start
    return range(int(start), int(stop), int(step))


def affine_range(start, stop=None, step=1, **kwargs):
    return _range(start, stop, step)


def sequential_range(start, stop=None, step=1, **kwargs):
    return _range(start, stop, step)


def static_range(start, stop=None, step=1, **kwargs):
    return _range(start, stop, step)


# --------------------------------------------------------------------------------------------------
# Program queries (no grid / LNC=1)
# --------------------------------------------------------------------------------------------------


def program_id(axis=0):
    return 0


def num_programs(axes=0):
    return 1


def program_ndim():
    return 0


class NKIObject:
    """Base class for kernel config dataclasses (no behaviour)."""


class _NoReorder:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def no_reorder():
    return _NoReorder()
