"""``nki.language`` (new dialect): buffers, dtypes, creation functions, op codes, loops, tile_size."""
from __future__ import annotations

import math
import os

import numpy as np

try:
    import ml_dtypes as _mld
except ImportError:  # pragma: no cover
    _mld = None

from .. import _isa as _tab  # the ISA / config tables from _nsim (this module's _isa() is nki.isa)
from .. import tracer as _tr
from ..tracer import DynSlice, NkiTensor, NsimError, make_error, KernelError

# --------------------------------------------------------------------------------------------------
# Buffers (§3.1)
# --------------------------------------------------------------------------------------------------


MemoryRegion = _tr.MemoryRegion  # (defined with the tracer: an HBM tensor's .buffer is one)


sbuf = MemoryRegion("sbuf")
psum = MemoryRegion("psum")
private_hbm = MemoryRegion("private_hbm")
shared_hbm = MemoryRegion("shared_hbm")
hbm = private_hbm
MemoryRegion.sbuf, MemoryRegion.psum, MemoryRegion.private_hbm, MemoryRegion.shared_hbm = (sbuf, psum, private_hbm,
                                                                                           shared_hbm)


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
    raise make_error("UnknownBuffer", "unknown buffer {!r} (use nl.sbuf, nl.psum, nl.hbm, nl.shared_hbm, "
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
# MX x4-packed types (nki-api.md 3.2): distinct single-field structured dtypes over the packed bits; the host
# passes uint32 / uint16 data (``arr.view(nl.float8_e4m3fn_x4)``), they have no cast path.
float8_e5m2_x4 = _tr.mx_x4_dtype("float8_e5m2_x4")
float8_e4m3fn_x4 = _tr.mx_x4_dtype("float8_e4m3fn_x4")
float4_e2m1fn_x4 = _tr.mx_x4_dtype("float4_e2m1fn_x4")


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


def _configured():
    """(config, overrides) in force: the running kernel's, else the ``nsim.options`` defaults."""
    t = _tr.active()
    if t is not None:
        return t.config, t.overrides
    from .._kernel import current_options
    o = current_options()
    return o["config"], o["overrides"]


# NKI's constants that the simulator does not model as parameters: bn_stats' free-size limit, the
# allocation alignment, and the SBUF bytes per partition NKI reserves for the compiler.
_BN_STATS_FMAX = 512
_MIN_ALIGN = 16
_SBUF_RESERVED_BYTES = 16 * 1024


def _tile_sizes(c, reserve_bank=False):
    """nl.tile_size from the configuration's parameters (engines/params.def), FP32 elements where NKI
    counts elements; ``reserve_bank``: NKI_DMA_TRANSPOSE_AS_PE_TRANSPOSE=true (one PSUM bank fewer)."""
    sbuf_fmax_bytes = c["sbuf.bytes_per_partition"] - _SBUF_RESERVED_BYTES
    return {
        "pmax": c["sbuf.partitions"],
        "psum_fmax": c["psum.bank_bytes"] // 4,
        "psum_bank_fmax": c["psum.bank_bytes"] // 4,
        "psum_bank_fmax_bytes": c["psum.bank_bytes"],
        "psum_num_banks": c["psum.banks"] - (1 if reserve_bank else 0),
        "gemm_stationary_fmax": c["tensor.pe_cols"],
        "gemm_moving_fmax": c["tensor.moving_fmax"],
        "bn_stats_fmax": _BN_STATS_FMAX,
        "sbuf_size_bytes": c["sbuf.partitions"] * c["sbuf.bytes_per_partition"],
        "sbuf_fmax_bytes": sbuf_fmax_bytes,
        "total_available_sbuf_size": sbuf_fmax_bytes,
        "sbuf_fmax": sbuf_fmax_bytes // 4,
        "psum_min_align": _MIN_ALIGN,
        "sbuf_min_align": _MIN_ALIGN,
    }


def _current_tile_sizes():
    """_tile_sizes of the configured core (_configured) and NKI_DMA_TRANSPOSE_AS_PE_TRANSPOSE (read at each call).
    While a kernel is traced, kept on its tracer for the config and overrides objects it holds: kernels and nsim's
    own ops read nl.tile_size for every tile and matmul, and working it out each time (the overrides normalised,
    the parameters looked up, the dict built) cost ~2 % of tracing the library's flash attention (docs/performance.md,
    thirty-first session). The dict is shared: read only."""
    reserve = _tr.env_get("NKI_DMA_TRANSPOSE_AS_PE_TRANSPOSE") == "true"
    t = _tr.active()
    if t is not None:
        c = t.__dict__.get("_nl_tile_sizes")
        if c is not None and c[0] == reserve and c[1] is t.config and c[2] is t.overrides:
            return c[3]
        sizes = _tile_sizes(_tab._config_values(str(t.config), tuple(_tab._overrides(t.overrides))), reserve)
        t._nl_tile_sizes = (reserve, t.config, t.overrides, sizes)
        return sizes
    cfg, ovr = _configured()
    return _tile_sizes(_tab._config_values(str(cfg), tuple(_tab._overrides(ovr))), reserve)


class _TileSizeMeta(type):
    def __getattr__(cls, name):
        sizes = _current_tile_sizes()
        if name not in sizes:
            raise AttributeError("nl.tile_size has no attribute {!r}".format(name))
        return sizes[name]

    def __dir__(cls):
        return sorted(_tile_sizes({k: 1 for k in ("sbuf.bytes_per_partition", "sbuf.partitions", "psum.bank_bytes",
                                                    "psum.banks", "tensor.pe_cols", "tensor.moving_fmax")}))


class tile_size(metaclass=_TileSizeMeta):  # noqa: N801 - NKI name
    """``nl.tile_size.pmax`` ...: the limits of the configured core (the running kernel's config, else the
    ``nsim.options`` default), from the parameters of engines/params.def through ``_nsim``."""


# --------------------------------------------------------------------------------------------------
# Op codes (§3.5): names from the simulator's own tables
# --------------------------------------------------------------------------------------------------


ALU_OPS = list(_tab.ALU_OPS)  # isa/alu_ops.def
ACT_FUNCS = list(_tab.ACT_FUNCS)  # isa/act_funcs.def


class OpCode:
    """An op code (``nl.add``, ``nl.exp`` ...): an ALU operator and/or an activation function."""

    __slots__ = ("name", "alu", "act")

    def __init__(self, name, alu=None, act=None):
        self.name, self.alu, self.act = name, alu, act

    def __repr__(self):
        return "nl.{}".format(self.name)

    def __call__(self, *args, **kwargs):
        """The value-returning form (``nl.add(x, y)``, ``nl.exp(x)``, ``nl.sum(x, axis=1)``): emits the
        instruction(s) of §3.6 into a fresh tile and returns it."""
        return _call_opcode(self, args, kwargs)


_OPS = {}
for _n in list(dict.fromkeys(list(ALU_OPS) + list(ACT_FUNCS))):
    _OPS[_n] = OpCode(_n, _n if _n in ALU_OPS else None, _n if _n in ACT_FUNCS else None)
    globals()[_n] = _OPS[_n]
# reduction-function aliases
sum = OpCode("sum", "add")  # noqa: A001
max = OpCode("max", "maximum")  # noqa: A001
min = OpCode("min", "minimum")  # noqa: A001
prod = OpCode("prod", "multiply")
identity = _OPS.get("copy")
# value-only trigonometric functions: ScalarE has no cos/tan table; they lower to a range reduction and sin (§3.6)
for _n in ("cos", "tan"):
    _OPS[_n] = OpCode(_n)
    globals()[_n] = _OPS[_n]

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
        raise make_error("UnknownName", "{}={!r} is not an NKI op code".format(what, op))
    return _OPS[n]


def alu_name(op, what="op"):
    o = opcode(op, what)
    if o.alu is None:
        raise make_error("UnknownName", "{}=nl.{} is not an ALU operator".format(what, o.name))
    return o.alu


def act_name(op, what="op"):
    o = opcode(op, what)
    if o.act is None:
        raise make_error("UnknownName", "{}=nl.{} is not an activation function".format(what, o.name))
    return o.act


# --------------------------------------------------------------------------------------------------
# Creation (§3.4)
# --------------------------------------------------------------------------------------------------


class par_dim(int):  # noqa: N801
    """``nl.par_dim(n)``: accepted in shapes (the new dialect's partition dim is always dim 0)."""


def _shape(shape, what="nl.ndarray"):
    """A tensor shape as a tuple of ints: an int, or a tuple / list / Shape of ints (BadTensorShape otherwise, not
    a Python error from int())."""
    if type(shape) is tuple:  # (the common case, a tuple of Python ints: the shape as it is)
        for s in shape:
            if type(s) is not int:
                break
        else:
            return shape
    if isinstance(shape, (int, np.integer, _tr.Sym)) and not isinstance(shape, (bool, np.bool_)):
        shape = (shape,)
    if isinstance(shape, np.ndarray) and shape.ndim == 1:
        shape = tuple(shape.tolist())
    if not isinstance(shape, (tuple, list)) or not _b.all(  # (a loop index: int() below unrolls its loop)
            isinstance(s, (int, np.integer, _tr.Sym)) and not isinstance(s, (bool, np.bool_)) for s in shape):
        raise make_error("BadTensorShape", "{}: a shape is an int or a tuple of ints, got {!r}".format(what, shape))
    return tuple(int(s) for s in shape)


def ndarray(shape, dtype, buffer=sbuf, name="", address=None, **kwargs):
    tr = _tr.current("nl.ndarray")
    if type(buffer) is str:  # nki-api.md 1.3: deprecated (NKI 0.3 rejects it), accepted with a warning
        _tr.nki_warn("nl.ndarray(buffer={!r}): a buffer named by a string is deprecated (NKI 0.3 and later reject it); "
                     "use nl.sbuf, nl.psum, nl.shared_hbm".format(buffer), stacklevel=3)
    b = _ir_buffer(buffer)
    if b == "hbm":
        return tr.hbm_tensor(name or None, dtype, _shape(shape), private=not (buffer == "shared_hbm"))
    if address is None and callable(getattr(buffer, "layout", None)):  # ncc.sbuf/psum allocators
        shp = _shape(shape)
        tile_bytes = int(np.prod(shp[1:])) * np.dtype(dtype).itemsize
        got = buffer.layout((), tile_bytes, int(tile_size.psum_bank_fmax_bytes))
        return tr.tile(b, dtype, shp, name=name or None, address=got[0] if got else None)
    off = _free_offset(address)
    bank = int(tile_size.psum_bank_fmax_bytes)
    if b == "psum" and off is not None and isinstance(off, int) and off % bank:
        raise make_error("BadPlacement", "nl.ndarray(buffer=nl.psum, address=(_, {})): a PSUM tile starts on a bank "
                         "boundary, a multiple of {} bytes (nki-api.md 3.1)".format(off, bank))
    return tr.tile(b, dtype, _shape(shape), name=name or None, address=off)


def _free_offset(address):
    """The byte offset within each partition of ``address=(partition_offset, free_offset_bytes)`` (or a
    bare offset); None = placed by the compiler model. The partition offset does not change placement
    (tiles are placed across all partitions; docs/timing-model.md)."""
    if address is None:
        return None
    off = address[1] if isinstance(address, (tuple, list)) else address
    if isinstance(address, (tuple, list)) and len(address) != 2:
        raise TypeError("nl.ndarray: address must be (partition_offset, free_offset_bytes), got {!r}".format(address))
    off = int(off)
    if off < 0:
        raise ValueError("nl.ndarray: address offset must be >= 0, got {}".format(off))
    return off


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


def fill_hbm(t, value, api):
    """``nl.zeros / ones / full(..., buffer=nl.shared_hbm)``: an HBM tensor with an initial value. The NKI 2.26
    compiler rejects it (err_hbm_tensor_with_init_value_not_supported), earlier ones accepted it; nsim reports it
    in strict only (nki-api.md 1.6) and warns otherwise. It is filled as a compiler would: an SBUF tile set to the
    value (up to 16 KiB per partition), copied over the tensor by DMA (its elements in row-major order)."""
    _tr.nki_warn("{}: an HBM tensor with an initial value ('{}'): NKI 2.26 compilers reject it "
                 "(err_hbm_tensor_with_init_value_not_supported); nsim fills it by DMA from an SBUF tile".format(
                     api, t.name), stacklevel=4)
    total = int(np.prod(t.shape))
    free = _b.max(1, _b.min(-(-total // 128), 16384 // np.dtype(t.dtype).itemsize))
    rows = _b.min(128, -(-total // free))
    src = ndarray((rows, free), t.dtype, buffer=sbuf, name=(t.name or "hbm") + "_fill")
    _fill(src, value)
    flat = t.reshape((total,)) if len(t.shape) != 1 else t
    from . import isa
    for off in range(0, total, rows * free):
        n = _b.min(rows * free, total - off)
        whole = n // free
        if whole:
            isa.dma_copy(dst=flat[off:off + whole * free], src=src[0:whole, :])
        if n > whole * free:
            isa.dma_copy(dst=flat[off + whole * free:off + n], src=src[0:1, 0:n - whole * free])
    return t


def _fill_new(shape, value, dtype, buffer, name):
    t = ndarray(shape, dtype, buffer=buffer, name=name)
    if t.buffer == "hbm":
        return fill_hbm(t, value, "nl.zeros / ones / full")
    if np.issubdtype(t.dtype, np.integer) or t.dtype == np.bool_:
        value = _tr.int_immediate(value, "fill value")
    _fill(t, value)
    _tr.current("nl.zeros").note_fill(t.name)  # dropped if the tile is next overwritten whole (a dead store)
    return t


def zeros_like(x, dtype=None, buffer=None, name="", **kwargs):
    return zeros(x.shape, dtype or x.dtype, buffer=buffer or sbuf, name=name)


def empty_like(x, dtype=None, buffer=None, name="", **kwargs):
    b = buffer if buffer is not None else (x.buffer if x.buffer != "hbm" else shared_hbm)
    return ndarray(x.shape, dtype or x.dtype, buffer=MemoryRegion(b) if type(b) is str else b, name=name)


def ds(start, size):
    return DynSlice(start, size)


# --------------------------------------------------------------------------------------------------
# Loops (§1.7): unrolled while tracing (sequential semantics), or kept as kernel-IR loops with
# loops="keep" (affine_range / sequential_range; nsim.tracer.Tracer.symbolic_loop)
# --------------------------------------------------------------------------------------------------


def _range(start, stop=None, step=1):
    if stop is None:
        start, stop = 0, start
    return range(int(start), int(stop), int(step))


def affine_range(start, stop=None, step=1):
    return _tr.AffineRange(_tr.check_loop_trips(_range(start, stop, step), "nl.affine_range"))


def sequential_range(start, stop=None, step=1):
    return _tr.SequentialRange(_tr.check_loop_trips(_range(start, stop, step), "nl.sequential_range"))


def static_range(start, stop=None, step=1):
    return _tr.check_loop_trips(_range(start, stop, step), "nl.static_range")


def _static_bound(v, what):
    """An int loop bound, or a VirtualRegister's value (registers are evaluated while tracing)."""
    return _tr.register_value(v, what)


def dynamic_range(start, stop=None, step=1):
    """``nl.dynamic_range``: a runtime loop on the sequencers. nsim runs it from its (int) bounds like
    the static loops; not allowed inside ``no_reorder``."""
    _tr.check_dynamic_loop("nl.dynamic_range")
    if stop is None:
        start, stop = 0, start
    # no reordering across a runtime loop's iterations (its ops in program order: tracer.runtime_loop)
    return _tr.runtime_range(_tr.check_loop_trips(range(_static_bound(start, "nl.dynamic_range"),
                                                        _static_bound(stop, "nl.dynamic_range"),
                                                        _static_bound(step, "nl.dynamic_range")), "nl.dynamic_range"),
                             _tr.register_loads(start, stop, step))


def fori_loop(lower, upper, body_fun, step=1):
    """``nl.fori_loop(lower, upper, body_fun, step=1)``: ``body_fun(i)`` for i in range(lower, upper, step);
    the body must return None. Not allowed inside ``no_reorder``."""
    _tr.check_dynamic_loop("nl.fori_loop")
    for i in _tr.runtime_range(range(_static_bound(lower, "nl.fori_loop"), _static_bound(upper, "nl.fori_loop"),
                                     _static_bound(step, "nl.fori_loop")), _tr.register_loads(lower, upper, step)):
        if body_fun(i) is not None:
            raise make_error("NotSupported", "nl.fori_loop: body_fun must return None")


def while_loop(init, body_fun):
    """``nl.while_loop(init, body_fun)``: ``r = init; while r != 0: r = body_fun(r)`` with a VirtualRegister
    (or int) ``r``, unrolled while tracing from the register's values (at most nsim.tracer.MAX_LOOP_TRIPS
    iterations). Not allowed inside ``no_reorder``. Returns the final register."""
    _tr.check_dynamic_loop("nl.while_loop")
    r = init
    with _tr.runtime_loop() as loop:  # no reordering across its iterations
        for _ in range(_tr.MAX_LOOP_TRIPS + 1):
            loop.wait_for(_tr.register_loads(r))  # the sequencers branch on r: what follows waits for its load
            if _tr.register_value(r, "nl.while_loop") == 0:
                return r
            r = body_fun(r)
    raise make_error("ResourceLimit", "resource limit: nl.while_loop ran more than nsim.tracer.MAX_LOOP_TRIPS = {} "
                     "iterations (the loop is unrolled while tracing); raise it, or NSIM_MAX_LOOP_TRIPS".format(
                         _tr.MAX_LOOP_TRIPS))


# --------------------------------------------------------------------------------------------------
# Program queries (no grid / LNC=1)
# --------------------------------------------------------------------------------------------------


def _lnc():
    tr = _tr.active()
    return getattr(tr, "lnc", (0, 1)) if tr is not None else (0, 1)


def _program_axes(axes, what):
    axs = axes if isinstance(axes, (tuple, list)) else (axes,)
    out = []
    for a in axs:
        a = _tr.int_immediate(a, what)
        if a != 0:
            raise make_error("BadLaunchGrid", "{}: the launch has one program axis (0), not axis {}".format(what, a))
        out.append(a)
    return out


class nc(int):  # noqa: N801
    """``nl.nc(k)``: k physical cores; ``kernel[nl.nc(2)]`` is ``kernel[2]`` (LNC=2, docs/lnc.md)."""

    def __new__(cls, k):
        obj = int.__new__(cls, int(k))
        obj.lnc_cores = int(k)
        return obj


def program_id(axis=0):
    """This program's index on ``axis``: under ``kernel[2]`` (LNC=2) the physical core, 0 or 1; else 0."""
    core, n = _lnc()
    if n > 1:
        _program_axes(axis, "nl.program_id")
    return core


def num_programs(axes=0):
    """The number of programs along ``axes`` (an int or a tuple: their product): 2 under LNC=2, else 1."""
    core, n = _lnc()
    if n > 1:
        return n ** len(_program_axes(axes, "nl.num_programs"))
    return 1


def program_ndim():
    """The number of launch-grid dims: 1 under LNC=2 (an SPMD program of one dim of size 2), else 0."""
    return 1 if _lnc()[1] > 1 else 0


class NKIObject:
    """Base class for kernel config dataclasses (no behaviour)."""


def no_reorder():
    """``with nl.no_reorder():``: the instructions inside keep their program order in the schedule (every
    op of the block carries the block's ``order_group`` in kernel.json); dynamic loops are not allowed
    inside. Functionally a no-op."""
    return _tr.NoReorder()


# --------------------------------------------------------------------------------------------------
# Value-returning functions (§3.6; the new dialect's experimental nl.* value API)
# --------------------------------------------------------------------------------------------------

import builtins as _b  # noqa: E402  (this module shadows sum/max/min/abs/copy with op codes)

# The value-returning forms by ALU class (isa/alu_ops.def): binary ops of every class but "special"; unary
# ALU ops (those that are not also activation functions, which take the activation path); the special ops
# (bypass, average) and prelu (an activation with an alpha parameter) have none.
_BINARY = _tab.alu_of_arity(2) - _tab.alu_of_class("special")
_ALU_UNARY = _tab.alu_of_arity(1) - _tab.alu_of_class("special")
_REDUCE = {"sum": "add", "max": "maximum", "min": "minimum", "prod": "multiply"}
_NO_VALUE = _tab.alu_of_class("special") | {"prelu"}


_OPCODE_KW = {"reduce": frozenset(("x", "axis", "dtype", "keepdims", "name")),
              "other": frozenset(("x", "dtype", "name")), "binary": frozenset(("x", "y", "dtype", "name"))}


def _call_opcode(op, args, kwargs, prefix="nki.language"):
    n = op.name
    if kwargs:
        kind = "reduce" if n in _REDUCE else ("binary" if n in _BINARY else "other")
        for k in kwargs:
            if k not in _OPCODE_KW[kind]:
                raise TypeError("{}.{}() got an unexpected keyword argument {!r}".format(prefix, n, k))
    if n in _REDUCE:
        return _reduce_call(_REDUCE[n], n, *args, **kwargs)
    if n == "copy":
        return copy_(*args, **kwargs)
    if n in _TRIG or n == "sin":
        return _trig_call(n, *args, **kwargs)
    if n in _BINARY:
        return _binary_call(op, *args, **kwargs)
    if n in _NO_VALUE:
        raise make_error("NotSupported", "nl.{} has no value-returning form; pass it as op= to an "
                         "nisa instruction".format(n))
    if op.act is not None:
        return _unary_act(op, *args, **kwargs)
    if n in _ALU_UNARY:
        return _unary_alu(op, *args, **kwargs)
    raise make_error("NotSupported", "value-returning nl.{}(...) is not supported by nsim; pass nl.{} "
                     "as op= to an nisa instruction".format(n, n))


_ISA = []


def _isa():
    """nsim.nki.isa (imported at the first call: it imports this module); kept, as the import statement costs
    a package lookup per call and this runs for most value functions."""
    if not _ISA:
        from . import isa
        _ISA.append(isa)
    return _ISA[0]


def _is_scalar(x):
    return isinstance(x, (bool, int, float, np.bool_, np.integer, np.floating))


def _tensor_arg(x, what, slot="x"):
    if _tr.active() is None:  # (the message built only when needed)
        _tr.current("nl." + what)
    if not isinstance(x, NkiTensor):
        raise make_error("BadOperandKind", "nl.{}: {} must be a tensor, got {!r}".format(what, slot, _tr.shown(x)))
    if x.buffer == "hbm":
        raise make_error("BadBuffer", "nl.{}: {} must be an on-chip tile (SBUF/PSUM), got an HBM "
                         "tensor {!r} (load it first with nl.load or nisa.dma_copy)".format(what, slot, x))
    return x


def _hide(t, dims):
    """A view of the fresh tile ``t`` with the storage dims ``dims`` (size 1) removed from the shape."""
    d = [list(x) for x in t._dims]
    for i in dims:
        d[i][3] = False
    return t._view(d)


def _new_tile(shape, dtype, buffer="sbuf"):
    """A fresh on-chip tile of ``shape``; a 1-D shape (P,) is a (P, 1) tile viewed as (P,)."""
    shape = tuple(int(s) for s in shape)
    tr = _tr.current("nl")
    if len(shape) == 1:
        return _hide(tr.tile(buffer, dtype, shape + (1,)), [1])
    return tr.tile(buffer, dtype, shape)


# --- result dtypes (§3.3) --------------------------------------------------------------------------

_FLOAT_WIDE = {"float32": 4, "tfloat32": 4, "bfloat16": 2, "float16": 2}


def _dt_of(x):
    if isinstance(x, NkiTensor):
        return x.dtype
    if isinstance(x, (np.generic,)):
        return np.dtype(x.dtype)
    if isinstance(x, (bool, np.bool_)):
        return np.dtype(np.uint8)
    if isinstance(x, int):
        return np.dtype(np.int32)
    return np.dtype(np.float32)


def _kind(dt):
    if dt == np.bool_:
        return "b"
    if np.issubdtype(dt, np.integer):
        return "i"
    return "f"


def promote(a, b):
    """Result dtype of a two-input value-returning op (§3.3)."""
    a, b = np.dtype(a), np.dtype(b)
    if a == b:
        return a
    ka, kb = _kind(a), _kind(b)
    if ka == "f" and kb != "f":
        return a
    if kb == "f" and ka != "f":
        return b
    if ka == "f":
        na, nb = a.name, b.name
        if "float32" in (na, nb) or "tfloat32" in (na, nb):
            return np.dtype(np.float32)
        pair = {na, nb}
        if pair == {"float16", "bfloat16"}:
            return np.dtype(np.float32)
        if "bfloat16" in pair:
            return a if na == "bfloat16" else b
        if "float16" in pair:
            return a if na == "float16" else b
        return np.dtype(_mld.bfloat16) if _mld is not None else np.dtype(np.float32)  # two fp8 kinds
    if ka == "b":
        return b
    if kb == "b":
        return a
    if {a.name, b.name} == {"int32", "uint32"}:
        return np.dtype(np.float32)
    r = np.promote_types(a, b)
    return np.dtype(np.float32) if r.itemsize > 4 else r


# --- element-wise ---------------------------------------------------------------------------------


def _free_elems(t):
    return int(math.prod(t.shape[1:])) if t.ndim > 1 else 1  # (math.prod: np.prod costs ~3 us on a tuple)


def _pad_rank(t, nd):
    """``t`` viewed with trailing size-1 dims up to rank ``nd`` (spec §3.10: a (P,) tile is (P, 1))."""
    if t.ndim >= nd:
        return t
    return t.reshape(tuple(t.shape) + (1,) * (nd - t.ndim))


def _bshape(a, b, what):
    """The broadcast shape of two shapes aligned from the partition dim (§3.10)."""
    nd = _b.max(len(a), len(b))
    a = tuple(a) + (1,) * (nd - len(a))
    b = tuple(b) + (1,) * (nd - len(b))
    out = []
    for x, y in zip(a, b):
        if x != y and 1 not in (x, y):
            raise make_error("BadBroadcast", "{}: shapes {} and {} do not broadcast".format(what, a, b))
        out.append(_b.max(x, y))
    return tuple(out)


def partition_broadcast(src, p):
    """A fresh SBUF tile ``(p, F...)`` holding the single partition of the on-chip ``(1, F...)`` tile ``src``
    on every partition: ``ones(1, p).T @ src`` on TensorE into fp32 PSUM (chunks of 512 columns), copied to
    SBUF. The ISA has nothing cheaper from SBUF: an on-chip access cannot have a stride-0 partition dim
    (DMA included) and nc_stream_shuffle moves data only within 32 partitions. (From HBM, nl.load of a
    stride-0 view is one DMA.) Integer tiles go through fp32 (exact up to 2^24)."""
    p = int(p)
    free = tuple(src.shape[1:]) or (1,)
    f = int(np.prod(free, dtype=np.int64))
    isa = _isa()
    mdt = src.dtype if src.dtype.name in ("float32", "float16", "bfloat16") else np.dtype(np.float32)
    try:
        flat = src.reshape((1, f)) if src.ndim != 2 else src
        flat.access()
    except NsimError:
        flat = None
    if flat is None or flat.buffer != "sbuf" or mdt != src.dtype:
        flat = _new_tile((1, f), mdt)
        isa.tensor_copy(dst=flat, src=_pad_rank(src, 2).reshape((1, f)) if src.ndim != 2 else src)
    ones_ = _new_tile((1, p), mdt)
    isa.memset(ones_, 1.0)
    out = _new_tile((p,) + free, src.dtype)
    o2 = out.reshape((p, f)) if len(free) != 1 else out
    for c in range(0, f, 512):
        n = _b.min(512, f - c)
        ps = _new_tile((p, n), np.float32, "psum")
        isa.nc_matmul(dst=ps, stationary=ones_, moving=NkiTensor.__getitem__(flat, (slice(None), slice(c, c + n))),
                      accumulate=False)
        isa.tensor_copy(dst=NkiTensor.__getitem__(o2, (slice(None), slice(c, c + n))), src=ps)
    return out


def broadcast_to(x, shape, dtype=None, name=None, **kwargs):
    """``nl.broadcast_to(x, shape)`` (§3.6, §3.10): free dims of size 1 become stride-0 views; an HBM
    tensor's size-1 first dim too (``nl.load`` of it is a stride-0 partition DMA); the size-1 partition
    dim of an on-chip tile is copied onto every partition (:func:`partition_broadcast`). A lower-rank
    tensor gets trailing size-1 dims."""
    _tr.current("nl.broadcast_to")
    if not isinstance(x, NkiTensor):
        raise make_error("BadOperandKind", "nl.broadcast_to: x must be a tensor, got {!r}".format(_tr.shown(x)))
    shape = tuple(int(s) for s in shape)
    if len(shape) < x.ndim:
        raise make_error("BadBroadcast", "nl.broadcast_to: cannot broadcast {} to the lower-rank "
                         "shape {}".format(tuple(x.shape), shape))
    v = _pad_rank(x, len(shape))
    _bshape(v.shape, shape, "nl.broadcast_to")
    if any(a != b and a != 1 for a, b in zip(v.shape, shape)):
        raise make_error("BadBroadcast", "nl.broadcast_to: cannot broadcast {} to {}".format(
            tuple(x.shape), shape))
    if v.buffer in _tr.ON_CHIP and v.shape[0] == 1 and shape[0] > 1:
        v = partition_broadcast(v, shape[0])
    v = NkiTensor.broadcast_to(v, shape)
    if dtype is not None and np.dtype(dtype) != v.dtype:
        if v.buffer == "hbm":
            raise make_error("BadDtype", "nl.broadcast_to: dtype= on an HBM tensor (load it with "
                             "nl.load(..., dtype=) instead)")
        out = _new_tile(shape, dtype)
        _isa().tensor_copy(dst=out, src=v)
        return out
    return v


def _binary_call(op, x, y, dtype=None, name=None, **kwargs):
    n = op.name
    _tr.current("nl." + n)
    isa = _isa()
    xt, yt = isinstance(x, NkiTensor), isinstance(y, NkiTensor)
    if not xt and not yt:
        raise make_error("BadOperandKind", "nl.{}: at least one operand must be a tile".format(n))
    if xt:
        _tensor_arg(x, n, "x")
    if yt:
        _tensor_arg(y, n, "y")
    out_dt = np.dtype(dtype) if dtype is not None else promote(_dt_of(x), _dt_of(y))
    if not (xt and yt):
        t, s, rev = (x, y, False) if xt else (y, x, True)
        if not _is_scalar(s):
            raise make_error("BadOperandKind", "nl.{}: operands must be tiles or scalars, got {!r}".format(
                n, _tr.shown(s)))
        out = _new_tile(t.shape, out_dt)
        isa.tensor_scalar(dst=out, data=t, op0=op, operand0=s, reverse0=rev)
        return out
    if tuple(x.shape) == tuple(y.shape):
        out = _new_tile(x.shape, out_dt)
        isa.tensor_tensor(dst=out, data1=x, data2=y, op=op)
        return out
    # numpy broadcasting aligned from the partition dim (§3.10)
    shape = _bshape(x.shape, y.shape, "nl." + n)
    oshape = shape
    xv, yv = _pad_rank(x, len(shape)), _pad_rank(y, len(shape))
    if xv.shape[0] == 1 and shape[0] > 1:
        xv = partition_broadcast(xv, shape[0])
    if yv.shape[0] == 1 and shape[0] > 1:
        yv = partition_broadcast(yv, shape[0])
    fx, fy = _free_elems(xv), _free_elems(yv)
    fo = int(np.prod(shape[1:], dtype=np.int64))
    out = _new_tile(oshape, out_dt)
    ov = _pad_rank(out, len(shape)) if len(oshape) < len(shape) else out
    if fy == 1 and fo > 1:  # one element per partition: tensor_scalar with a vector operand
        isa.tensor_scalar(dst=ov, data=NkiTensor.broadcast_to(xv, shape), op0=op, operand0=yv)
    elif fx == 1 and fo > 1:
        isa.tensor_scalar(dst=ov, data=NkiTensor.broadcast_to(yv, shape), op0=op, operand0=xv, reverse0=True)
    else:
        isa.tensor_tensor(dst=ov, data1=NkiTensor.broadcast_to(xv, shape), data2=NkiTensor.broadcast_to(yv, shape), op=op)
    return out


def _unary_act(op, x, dtype=None, name=None, **kwargs):
    _tensor_arg(x, op.name)
    out = _new_tile(x.shape, dtype if dtype is not None else x.dtype)
    _isa().activation(dst=out, op=op, data=x)
    return out


_TRIG = ("cos", "tan")


def _sin_shifted(x, shift, period, dtype):
    """sin(x + shift) into a fresh tile of ``dtype``: the argument range-reduced to [-pi, pi) by one tensor_scalar,
    ``mod(x + shift + pi, period) - pi`` (the ``- pi`` as the activation's bias), then the sin activation."""
    red = _new_tile(x.shape, np.float32)
    _isa().tensor_scalar(dst=red, data=x, op0=_OPS["add"], operand0=float(shift + np.pi), op1=_OPS["mod"],
                         operand1=float(period))
    out = _new_tile(x.shape, dtype)
    _isa().activation(dst=out, op=_OPS["sin"], data=red, bias=-float(np.pi))
    return out


def _trig_call(n, x, dtype=None, name=None, **kwargs):
    """``nl.sin(x)``: a range reduction and the sin activation (2 instructions, spec 3.6: ScalarE's sin is valid on
    [-pi, pi] only, 3.5). ``nl.cos(x)``: sin(x + pi/2) likewise. ``nl.tan(x)``: sin(r) / cos(r) of the argument
    reduced to a period pi (r = mod(x + pi/2, pi) - pi/2; 5 instructions)."""
    _tensor_arg(x, n)
    dt = dtype if dtype is not None else x.dtype
    if n == "sin":
        return _sin_shifted(x, 0.0, 2 * np.pi, dt)
    if n == "cos":
        return _sin_shifted(x, np.pi / 2, 2 * np.pi, dt)
    red = _new_tile(x.shape, np.float32)
    _isa().tensor_scalar(dst=red, data=x, op0=_OPS["add"], operand0=float(np.pi / 2), op1=_OPS["mod"],
                         operand1=float(np.pi))
    s = _sin_shifted(red, -np.pi / 2, 2 * np.pi, np.float32)
    c = _sin_shifted(red, 0.0, 2 * np.pi, np.float32)
    out = _new_tile(x.shape, dt)
    _isa().tensor_tensor(dst=out, data1=s, data2=c, op=_OPS["divide"])
    return out


def _unary_alu(op, x, dtype=None, name=None, **kwargs):
    _tensor_arg(x, op.name)
    out = _new_tile(x.shape, dtype if dtype is not None else x.dtype)
    _isa().tensor_scalar(dst=out, data=x, op0=op, operand0=None)
    return out


def copy_(x, dtype=None, name=None, **kwargs):
    """``nl.copy(x, dtype=None)``: tensor_copy into a fresh SBUF tile (e.g. PSUM eviction)."""
    _tensor_arg(x, "copy")
    out = _new_tile(x.shape, dtype if dtype is not None else x.dtype)
    _isa().tensor_copy(dst=out, src=x)
    return out


# --- reductions -----------------------------------------------------------------------------------


def _axes(x, axis, what):
    nd = x.ndim
    if not isinstance(axis, (int, np.integer, tuple, list)) or isinstance(axis, (bool, np.bool_)) or (
            isinstance(axis, (tuple, list)) and not _b.all(isinstance(a, (int, np.integer)) for a in axis)):
        raise make_error("BadArgument", "nl.{}: axis must be an int or a tuple of ints naming free dims (1..{}) of "
                         "shape {}, got {!r}".format(what, nd - 1, tuple(x.shape), axis))
    axes = [axis] if isinstance(axis, (int, np.integer)) else list(axis)
    axes = sorted(_b.set(int(a) + nd if int(a) < 0 else int(a) for a in axes))
    if not axes or axes[0] < 1 or axes[-1] >= nd:
        raise make_error("BadArgument", "nl.{}: axis {} must name free dims (1..{}) of shape {}".format(
            what, axis, nd - 1, tuple(x.shape)))
    return axes


def _reduce_into(alu, x, axes, dt):
    """Reduce the free ``axes`` of ``x`` (kept as size 1). Trailing axes: one tensor_reduce; other axes of an
    on-chip tile (e.g. ``axis=[2, 4]`` of pooling) are permuted to the end of a view, also one tensor_reduce;
    elsewhere they are folded afterwards with element-wise ops over their slices (n - 1 tensor_tensor per axis)."""
    nd = x.ndim
    trail = []
    for a in reversed(range(1, nd)):
        if a in axes:
            trail.insert(0, a)
        else:
            break
    rest = [a for a in axes if a not in trail]
    isa = _isa()
    if rest and x.buffer in _tr.ON_CHIP:
        # spec §3.6: the reduced axes are permuted to the end (a view) and reduced by one tensor_reduce, whose
        # result holds the kept elements in their order (as the keepdims shape does)
        keep = [a for a in range(nd) if a not in axes]
        r = _new_tile([1 if i in axes else s for i, s in enumerate(x.shape)], dt)
        isa.tensor_reduce(dst=r, op=alu, data=x.permute(keep + list(axes)), axis=list(range(len(keep), nd)))
        return r
    r = x
    if trail:
        kshape = [1 if i in trail else s for i, s in enumerate(x.shape)]
        r = _new_tile(kshape, dt if not rest else np.float32)
        isa.tensor_reduce(dst=r, op=alu, data=x, axis=trail)
    for j, a in enumerate(rest):
        n = int(r.shape[a])
        kshape = [1 if i == a else s for i, s in enumerate(r.shape)]
        last = j == len(rest) - 1
        if n == 1:
            acc = _new_tile(kshape, dt if last else np.float32)
            isa.tensor_copy(dst=acc, src=r)
            r = acc
            continue
        sl = lambda t, k: NkiTensor.__getitem__(t, tuple(slice(k, k + 1) if i == a else slice(None)  # noqa: E731
                                                         for i in range(t.ndim)))
        acc = None
        for k in range(1, n):
            nxt = _new_tile(kshape, dt if (last and k == n - 1) else np.float32)
            isa.tensor_tensor(dst=nxt, data1=sl(r, 0) if acc is None else acc, data2=sl(r, k), op=alu)
            acc = nxt
        r = acc
    return r


def _drop(out, axes):
    """keepdims=False: hide the reduced dims (a (P,) result stays a (P, 1) tile viewed as (P,))."""
    kept = [i for i, d in enumerate(out._dims) if d[3]]
    return _hide(out, [kept[a] for a in axes])


def _reduce_call(alu, what, x, axis, dtype=None, keepdims=False, name=None, **kwargs):
    _tensor_arg(x, what)
    axes = _axes(x, axis, what)
    out = _reduce_into(alu, x, axes, dtype if dtype is not None else x.dtype)
    return out if keepdims else _drop(out, axes)


def mean(x, axis, dtype=None, keepdims=False, name=None, **kwargs):
    """``nl.mean``: tensor_reduce(add) in fp32, then x 1/n (tensor_scalar)."""
    _tensor_arg(x, "mean")
    axes = _axes(x, axis, "mean")
    n = 1
    for a in axes:
        n *= int(x.shape[a])
    s = _reduce_into("add", x, axes, np.float32)
    out = _new_tile(s.shape, dtype if dtype is not None else x.dtype)
    _isa().tensor_scalar(dst=out, data=s, op0="multiply", operand0=float(np.float32(1.0) / np.float32(n)))
    return out if keepdims else _drop(out, axes)


# --- Tensor engine ---------------------------------------------------------------------------------


def _to_sbuf(x):
    return x if x.buffer == "sbuf" else copy_(x)


def transpose(x, dtype=None, name=None, **kwargs):
    """``nl.transpose(x)``: nc_transpose of a 2-D tile (≤128 x 128) into a fresh PSUM tile."""
    _tensor_arg(x, "transpose")
    if x.ndim != 2:
        raise make_error("BadRank", "nl.transpose: a 2-D tile is needed, got shape {}".format(
            tuple(x.shape)))
    _isa().transpose_limit(x.shape[0], x.shape[1], "nl.transpose")
    src = _to_sbuf(x)
    out = _new_tile((x.shape[1], x.shape[0]), x.dtype, "psum")
    _isa().nc_transpose(dst=out, data=src)
    if dtype is not None and np.dtype(dtype) != out.dtype:
        return copy_(out, dtype=dtype)
    return out


def matmul(x, y, transpose_x=False, name=None, **kwargs):
    """``nl.matmul``: nc_matmul into a fresh fp32 PSUM tile. transpose_x=True: x is [K, M] and the result is
    x.T @ y; False: x is [M, K] (an extra nc_transpose is inserted) and the result is x @ y."""
    _tensor_arg(x, "matmul", "x")
    _tensor_arg(y, "matmul", "y")
    # y may have several free dims (a [K, R, W] window of an image tile), as nc_matmul's moving operand
    if x.ndim != 2 or y.ndim < 2:
        raise make_error("BadRank", "nl.matmul: a 2-D x and an at least 2-D y are needed, got {} and {}".format(
            tuple(x.shape), tuple(y.shape)))
    _isa().stationary_limit(x.shape[1] if transpose_x else x.shape[0], "nl.matmul",
                            "x {} (transpose_x={})".format(tuple(x.shape), bool(transpose_x)))
    stat = _to_sbuf(x) if transpose_x else copy_(transpose(x))
    if stat.shape[0] != y.shape[0]:
        raise make_error("ShapeMismatch", "nl.matmul: contraction dims differ: x {} (transpose_x={}) and "
                         "y {}".format(tuple(x.shape), bool(transpose_x), tuple(y.shape)))
    mov = _to_sbuf(y)
    _isa().matmul_dtype_rules(stat, mov, "nl.matmul")  # (named as called; nc_matmul's own check would say nisa)
    out = _new_tile((stat.shape[1],) + tuple(y.shape[1:]), np.float32, "psum")
    _isa().nc_matmul(dst=out, stationary=stat, moving=mov, accumulate=False)
    return out


# --- DMA conveniences (0.3+) -------------------------------------------------------------------------


def load(src, dtype=None, name=None, **kwargs):
    """``nl.load(src)``: DMA an HBM view into a fresh SBUF tile of the same shape (first dim ≤ 128)."""
    _tr.current("nl.load")
    if not isinstance(src, NkiTensor):
        raise make_error("BadOperandKind", "nl.load: src must be a tensor, got {!r}".format(_tr.shown(src)))
    if src.ndim == 0:  # one element (the flash attention sample's nl.load(seed[0])): a [1, 1] tile
        src = src.reshape((1, 1))
    if src.shape[0] > 128:
        raise make_error("TooManyPartitions", "nl.load: the first dim ({}) becomes the partition dim and "
                         "must be <= 128".format(src.shape[0]))
    out = _new_tile(src.shape, dtype if dtype is not None else src.dtype)
    _isa().dma_copy(dst=out, src=src)
    return out


def store(dst, value, name=None, **kwargs):
    """``nl.store(dst, value)``: DMA a tile (PSUM: via an SBUF copy; scalar: a memset tile) into dst."""
    _tr.current("nl.store")
    if not isinstance(dst, NkiTensor):
        raise make_error("BadOperandKind", "nl.store: dst must be a tensor, got {!r}".format(_tr.shown(dst)))
    if dst.ndim == 0:  # one element: as a [1, 1] view (nl.load's counterpart)
        dst = dst.reshape((1, 1))
    isa = _isa()
    if _is_scalar(value):
        if dst.shape[0] > 128:
            raise make_error("TooManyPartitions", "nl.store: scalar store to dst with more than 128 rows")
        t = _new_tile(dst.shape, dst.dtype)
        isa.memset(t, value)
        value = t
    if not isinstance(value, NkiTensor):
        raise make_error("BadOperandKind", "nl.store: value must be a tile or a scalar, got {!r}".format(
            _tr.shown(value)))
    if value.buffer == "psum":
        value = copy_(value)
    if value.size != dst.size and value.ndim == dst.ndim:
        for d in range(1, value.ndim):
            if value.shape[d] == 1 and dst.shape[d] != 1:
                value = value.broadcast(d, dst.shape[d])
    isa.dma_copy(dst=dst, src=value)
    return None


# --- composed value functions (§3.6) ---------------------------------------------------------------


def _rounding(x, kind, dtype):
    """floor / ceil / trunc from the ALU's mod/fmod: floor(x) = x - mod(x, 1), trunc(x) = x - fmod(x, 1),
    ceil(x) = x + mod(-x, 1)."""
    _tensor_arg(x, kind)
    isa = _isa()
    r = _new_tile(x.shape, np.float32)
    if kind == "ceil":
        isa.tensor_scalar(dst=r, data=x, op0="multiply", operand0=-1.0, op1="mod", operand1=1.0)
    else:
        isa.tensor_scalar(dst=r, data=x, op0="mod" if kind == "floor" else "fmod", operand0=1.0)
    out = _new_tile(x.shape, dtype if dtype is not None else x.dtype)
    isa.tensor_tensor(dst=out, data1=x, data2=r, op="add" if kind == "ceil" else "subtract")
    return out


def floor(x, dtype=None, name=None, **kwargs):
    """``nl.floor(x)``: x - mod(x, 1) (two Vector ops)."""
    return _rounding(x, "floor", dtype)


def ceil(x, dtype=None, name=None, **kwargs):
    """``nl.ceil(x)``: x + mod(-x, 1) (two Vector ops)."""
    return _rounding(x, "ceil", dtype)


def trunc(x, dtype=None, name=None, **kwargs):
    """``nl.trunc(x)``: x - fmod(x, 1) (two Vector ops)."""
    return _rounding(x, "trunc", dtype)


def all(x, axis, dtype=None, keepdims=False, name=None, **kwargs):  # noqa: A001 - NKI name
    """``nl.all(x, axis, keepdims=False)``: 1 where every element along ``axis`` is nonzero (logical_and
    reduction); spec §3.6 gives the new dialect's ``all`` keepdims (Beta 1's has none)."""
    _tensor_arg(x, "all")
    axes = _axes(x, axis, "all")
    nz = _new_tile(x.shape, np.float32)
    _isa().tensor_scalar(dst=nz, data=x, op0="not_equal", operand0=0.0)
    out = _reduce_into("logical_and", nz, axes, dtype if dtype is not None else x.dtype)
    return out if keepdims else _drop(out, axes)


def var(x, axis, dtype=None, keepdims=None, name=None, **kwargs):
    """``nl.var(x, axis)``: mean((x - mean(x))^2) over ``axis`` (population variance). Spec §3.6 lists
    ``keepdims`` in the signature but says the result keeps the reduced dims: they are kept unless
    ``keepdims=False`` is passed explicitly (then dropped, as numpy does)."""
    _tensor_arg(x, "var")
    m = mean(x, axis, dtype=np.float32, keepdims=True)
    d = _binary_call(_OPS["subtract"], x, m, dtype=np.float32)
    sq = _new_tile(d.shape, np.float32)
    _isa().tensor_tensor(dst=sq, data1=d, data2=d, op="multiply")
    return mean(sq, axis, dtype=dtype if dtype is not None else x.dtype, keepdims=keepdims is None or bool(keepdims))


def rms_norm(x, w, axis, n, epsilon=1e-06, dtype=None, compute_dtype=None, name=None, **kwargs):
    """``nl.rms_norm``: x / sqrt(sum(x^2, axis) / n + epsilon) * w."""
    _tensor_arg(x, "rms_norm")
    axes = _axes(x, axis, "rms_norm")
    isa = _isa()
    sq = _new_tile(x.shape, np.float32)
    isa.tensor_tensor(dst=sq, data1=x, data2=x, op="multiply")
    ss = _reduce_into("add", sq, axes, np.float32)
    r = _new_tile(ss.shape, np.float32)
    isa.tensor_scalar(dst=r, data=ss, op0="multiply", operand0=1.0 / float(n), op1="add", operand1=float(epsilon))
    rs = _new_tile(ss.shape, np.float32)
    isa.activation(dst=rs, op=_OPS["rsqrt"], data=r)
    y = _binary_call(_OPS["multiply"], x, rs, dtype=np.float32)
    return _binary_call(_OPS["multiply"], y, w, dtype=dtype if dtype is not None else x.dtype)


def where(condition, x, y, dtype=None, name=None, **kwargs):
    """``nl.where(condition, x, y)``: x where condition is nonzero, else y (y or x may be scalars):
    a copy of y, then a predicated copy of x (Vector)."""
    _tensor_arg(condition, "where", "condition")
    isa = _isa()
    shape = tuple(condition.shape)
    for v in (x, y):  # the three broadcast together (numpy.where; a (P, 1) condition selects whole rows)
        if isinstance(v, NkiTensor):
            shape = _bshape(shape, v.shape, "nl.where")
    dt = np.dtype(dtype) if dtype is not None else promote(_dt_of(x), _dt_of(y))
    out = _new_tile(shape, dt)
    if _is_scalar(y):
        isa.memset(out, y)
    else:
        isa.tensor_copy(dst=out, src=broadcast_to(y, shape))
    pred = condition if tuple(condition.shape) == shape else broadcast_to(condition, shape)
    if pred.dtype.name not in ("uint8", "int8", "uint16", "int16", "int32", "uint32", "bool"):
        cond = pred
        pred = _new_tile(shape, np.uint8)
        isa.tensor_scalar(dst=pred, data=cond, op0="not_equal", operand0=0.0)
    src = x if _is_scalar(x) else broadcast_to(x, shape)
    if not _is_scalar(src) and src.dtype != out.dtype:  # a predicated copy moves bits of one dtype (nki-api.md 2.2)
        conv = _new_tile(shape, out.dtype)
        isa.tensor_copy(dst=conv, src=src)
        src = conv
    isa.tensor_copy_predicated(dst=out, src=src, predicate=pred)
    return out


def expand_dims(x, axis, name=None, **kwargs):
    """``nl.expand_dims(x, axis)``: a view with a size-1 dim inserted at ``axis``."""
    return x.expand_dim(axis)


def static_cast(x, dtype):
    """``nl.static_cast(x, dtype)``: a numpy cast (ml_dtypes RNE) of an array, a converting copy of a tile."""
    if isinstance(x, NkiTensor):
        return copy_(x, dtype=dtype)
    return np.asarray(x).astype(dtype)


def softmax(x, axis=-1, dtype=None, name=None, **kwargs):
    """``nl.softmax(x, axis=-1)`` over the last free dim of a 2-D tile."""
    from .beta1 import language as _b1
    return _b1.softmax(x, axis, dtype=dtype)


def load_transpose2d(src, dtype=None, name=None, **kwargs):
    """``nl.load_transpose2d(src)``: DMA transpose HBM [a, b] -> SBUF [b, a]."""
    tr = _tr.current("nl.load_transpose2d")
    if src.ndim != 2:
        raise make_error("BadRank", "nl.load_transpose2d needs a 2-D source")
    out = tr.tile("sbuf", src.dtype, (src.shape[1], src.shape[0]))
    _isa().dma_transpose(dst=out, src=src)
    return out if dtype is None or np.dtype(dtype) == out.dtype else copy_(out, dtype=dtype)


def device_print(print_prefix, tensor, name=None, **kwargs):
    """``nl.device_print(prefix, tensor)``: prints ``prefix`` and the tensor's current values right away
    (eager mode: the instructions traced so far run in the simulator core)."""
    _tr.device_print(print_prefix, tensor)
    return None


# --- constants (§3.4) ------------------------------------------------------------------------------


def shared_constant(constant, dtype=None, name=None, **kwargs):
    """``nl.shared_constant(constant)``: a ``shared_hbm`` tensor holding the numpy array (or ``.npy`` file)
    ``constant`` (an extra input of the simulated kernel)."""
    tr = _tr.current("nl.shared_constant")
    if isinstance(constant, (str, os.PathLike)):
        constant = np.load(constant)
    a = np.asarray(constant)
    if dtype is not None:
        a = a.astype(dtype)
    elif a.dtype == np.float64:
        a = a.astype(np.float32)
    elif a.dtype == np.int64:
        a = a.astype(np.int32)
    elif a.dtype == np.bool_:
        a = a.astype(np.uint8)
    return tr.constant(a, name or "shared_constant")


def shared_identity_matrix(n, dtype=np.uint8, dst=None, name=None, **kwargs):
    """``nl.shared_identity_matrix(n, dtype=uint8, dst=None)`` (new dialect): the n x n identity in SBUF
    (n <= 128), loaded by one DMA from a constant; written into ``dst`` when given."""
    n = int(n)
    c = shared_constant(np.eye(n, dtype=np.float32).astype(dtype), name="identity")
    if n > 128 and dst is None:
        raise make_error("TooManyPartitions", "nl.shared_identity_matrix: n={} does not fit 128 partitions "
                         "(give dst= an HBM tensor)".format(n))
    out = dst if dst is not None else _new_tile((n, n), dtype)
    _isa().dma_copy(dst=out, src=c)
    return out


def dropout(x, rate, dtype=None, **kwargs):
    """``nl.dropout(x, rate)``: a fresh SBUF tile, each element of ``x`` zeroed with probability ``rate``
    (no rescaling; nisa.dropout on VectorE with nsim's seeded PRNG)."""
    _tensor_arg(x, "dropout")
    out = _new_tile(x.shape, dtype if dtype is not None else x.dtype)
    _isa().dropout(dst=out, data=x, prob=rate)
    return out


def rand(shape, dtype, buffer=None, name="", **kwargs):
    """``nl.rand(shape, dtype)``: a fresh tile of uniform values in [0, 1) from VectorE's seeded PRNG
    (``nisa.rng``'s 32 random bits, the top 24 of them scaled by 2**-24; seed with ``nl.random_seed``). A narrower
    float dtype takes only the top bits it holds exactly (bfloat16: 8, scaled by 2**-8), so no value rounds to 1."""
    b = _ir_buffer(buffer) if buffer is not None else "sbuf"
    if b not in ("sbuf", "psum"):
        raise make_error("BadBuffer", "nl.rand: buffer must be sbuf or psum, got {!r}".format(buffer))
    try:  # any float dtype, the ml_dtypes ones (bfloat16, fp8) included
        import ml_dtypes
        nbits = _b.min(24, ml_dtypes.finfo(np.dtype(dtype)).nmant + 1)
    except (ImportError, ValueError, TypeError):
        raise make_error("BadDtype", "nl.rand: dtype must be a float dtype, got {}".format(np.dtype(dtype)))
    isa = _isa()
    bits = _new_tile(shape, np.uint32)
    isa.rng(dst=bits)
    top = _new_tile(shape, np.uint32)
    # as many top bits as the dtype holds exactly (24 for fp32, 8 for bf16): the values k / 2**nbits stay < 1
    isa.tensor_scalar(dst=top, data=bits, op0=_OPS["right_shift"], operand0=32 - nbits)
    out = _new_tile(shape, dtype, buffer=b)
    isa.tensor_scalar(dst=out, data=top, op0=_OPS["multiply"], operand0=2.0 ** -nbits)
    return out


def random_seed(seed, **kwargs):
    """``nl.random_seed(seed)``: seed the PRNG of ``nl.rand`` / ``nl.dropout`` from a ``[1, 1]`` 32-bit
    integer SBUF tensor (an int is put in one first)."""
    if _is_scalar(seed):
        t = _new_tile((1, 1), np.uint32)
        _isa().memset(dst=t, value=_tr.int_immediate(seed, "seed") & 0xFFFFFFFF)
        seed = t
    _tensor_arg(seed, "random_seed", "seed")
    if seed.size != 1 or not np.issubdtype(np.dtype(seed.dtype), np.integer):
        raise make_error("BadDtype", "nl.random_seed: seed must be a [1, 1] 32-bit integer tensor, got {} {}".format(
            tuple(seed.shape), np.dtype(seed.dtype)))
    _isa().set_rng_seed(src_seeds=seed)


def gather_flattened(data, indices, axis=0, dtype=None, **kwargs):
    """``nl.gather_flattened(data, indices)``: per partition ``out[p, ...] = data_flat[p, indices[p, ...]]``
    (GpSimd ``nc_n_gather``); indices uint32/int32; ``out`` has the shape of ``indices``."""
    _tensor_arg(data, "gather_flattened", "data")
    _tensor_arg(indices, "gather_flattened", "indices")
    if int(axis) != 0:
        raise make_error("BadArgument", "nl.gather_flattened: axis must be 0, got {}".format(axis))
    out = _new_tile(indices.shape, data.dtype)
    _isa().nc_n_gather(dst=out, data=data, indices=indices)
    if dtype is not None and np.dtype(dtype) != np.dtype(data.dtype):
        return copy_(out, dtype=dtype)
    return out


def atomic_rmw(dst, value, op, **kwargs):
    """``nl.atomic_rmw(dst, value, op)``: ``dst = op(dst, value)`` on an HBM view, usually one with runtime
    row indices (a scatter-add); ``op`` only ``np.add``; duplicate indices all apply (an accumulating DMA)."""
    if opcode(op, "op").alu != "add":
        raise make_error("BadArgument", "nl.atomic_rmw: op must be np.add (nl.add), got {!r}".format(op))
    if not isinstance(dst, NkiTensor) or dst.buffer != "hbm":
        raise make_error("BadBuffer", "nl.atomic_rmw: dst must be an HBM tensor (view), got {!r}".format(dst))
    _tensor_arg(value, "atomic_rmw")
    if value.buffer == "psum" or value.dtype != dst.dtype:
        value = copy_(value, dtype=dst.dtype)
    _isa().dma_copy(dst=dst, src=value, dst_rmw_op=np.add)


from ._unsupported import install as _install_unsupported  # noqa: E402

_install_unsupported(globals(), "nki.language", {})


# --------------------------------------------------------------------------------------------------
# Keyword checking of the public functions (one place: nsim.nki._api)
# --------------------------------------------------------------------------------------------------

from ._api import publish as _publish  # noqa: E402

_publish(globals(), "nki.language")
